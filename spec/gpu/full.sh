#!/bin/sh
# spec/gpu/full.sh — the whole project on the GPU machine in one call:
#   1. the whole suite (spec/run_tests.sh: every C test and busted spec, the
#      #gpu ones now running on the device);
#   2. llama2's golden text on CUDA, plain and with --cudnn;
#   3. the llama2 benchmark (stories15M and stories110M shapes, cuda and cpu).
# Logs go to $OUT; a short summary is printed last. From the repository root:
#
#   sh .gpu/device/setup-lua.sh /opt/lua >/dev/null && . /opt/lua/env.sh \
#       && make CUDA=1 -j16 && sh spec/gpu/full.sh
#
# The models come from ../shared/models, or from .gpu/models (the run tool
# carries that ignored folder; it is copied beside the checkout).
set -u
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/mk-gpu-out}
BUILD=${BUILD:-build}
mkdir -p "$OUT"
[ -d ../shared/models ] || { mkdir -p ../shared && cp -r .gpu/models ../shared/; }
M=../shared/models
failed=0
summary=$OUT/summary.txt
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }

# the CUDA plugin must be there, or every CUDA case would only be skipped
if [ ! -f "$BUILD/libmoonkaas_cuda.so" ] || [ ! -f "$BUILD/moonkaas/libmoonkaas_cuda.so" ]; then
    note "plugin: $BUILD/libmoonkaas_cuda.so or its copy in $BUILD/moonkaas/ is missing (make CUDA=1)"
    failed=1
fi

t0=$(date +%s)
# the op table's large CUDA shapes are run.sh's (MK_GPU_CASES=small here: the suite's time)
MK_GPU_CASES=small BUSTED=${BUSTED:-/opt/lua/usr/bin/busted} timeout 420 sh spec/run_tests.sh "$BUILD" > "$OUT/tests.log" 2>&1 || failed=1
note "suite: $(tail -n 1 "$OUT/tests.log") ($(( $(date +%s) - t0 )) s)"
grep -a -A3 '^not ok' "$OUT/tests.log" | head -n 40 | tee -a "$summary"

golden=$(mktemp)
{ cat "$M/stories260K_t0_n200.expected.txt"; echo; } > "$golden"
for flags in "" "--cudnn"; do
    name=golden_cuda${flags:+_cudnn}
    MK_BUILD="$BUILD" timeout 120 lua5.4 scripts/llama2.lua "$M/stories260K.bin" -z "$M/tok512.bin" \
        -t 0 -n 200 -d cuda $flags > "$OUT/$name.txt" 2> "$OUT/$name.err"
    if cmp -s "$OUT/$name.txt" "$golden"; then
        note "$name: equal to llama2.c's golden text ($(grep -a 'tok/s' "$OUT/$name.err"))"
    else
        note "$name: DIFFERS from the golden text (first difference: $(cmp "$OUT/$name.txt" "$golden" 2>&1))"
        [ -z "$flags" ] && failed=1
    fi
done

t0=$(date +%s)
MK_BUILD="$BUILD" timeout 400 lua5.4 scripts/bench_llama2.lua --devices cuda,cpu --runs 3 \
    --dir /tmp/mk-bench > "$OUT/bench_llama2.txt" 2>&1
note "bench_llama2: rc $? ($(( $(date +%s) - t0 )) s)"
grep -a '^|' "$OUT/bench_llama2.txt" | tee -a "$summary"

echo "==== summary"
cat "$summary"
[ "$failed" -eq 0 ] && echo "GPU FULL: PASS" || echo "GPU FULL: FAIL"
exit "$failed"
