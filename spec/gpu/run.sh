#!/bin/sh
# spec/gpu/run.sh — the CUDA device's checks on the GPU machine, in one call:
#
#   0. build/tests/plugin_test        the CUDA plugin (build/libmoonkaas_cuda.so) loads
#                                     and its probe finds the device
#   1. build/tests/cuda_test          what only C sees on CUDA (no device, out of memory,
#                                     interleaved models)
#   2. busted spec/gpu_spec.lua       every op of the one op-case table (spec/cases/, with
#                                     the CUDA kernels' shapes), CUDA against the CPU and
#                                     double references; the Lua front end on CUDA (#gpu)
#   3. compute-sanitizer memcheck     cuda_test and gpu_spec again (MK_GPU_CASES=small: the
#                                     table without its large shapes; the deliberate 1 TiB
#                                     allocation skipped: it is an API error)
#   4. scripts/bench_ops.lua          op throughput against the measured copy bandwidth
#
# Logs go to $OUT (one file per step, at most 8 files); a short summary is
# printed last. From the repository root, after the build:
#
#   sh .gpu/device/setup-lua.sh /opt/lua >/dev/null && . /opt/lua/env.sh \
#       && make CUDA=1 -j16 && sh spec/gpu/run.sh
#
# Options: --no-memcheck, --no-bench, --no-busted, --racecheck (also run
# compute-sanitizer's shared-memory race checker over the small gpu_spec).
# Exit status: non-zero when a test step failed (the benchmark never fails the run).
set -u
cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/mk-gpu-out}
BUILD=${BUILD:-build}
BUSTED=${BUSTED:-/opt/lua/usr/bin/busted}
mkdir -p "$OUT"
memcheck=1 bench=1 busted=1 racecheck=0
for a in "$@"; do
    case $a in
    --no-memcheck) memcheck=0 ;;
    --no-bench) bench=0 ;;
    --no-busted) busted=0 ;;
    --racecheck) racecheck=1 ;;
    *) echo "usage: sh spec/gpu/run.sh [--no-memcheck] [--no-bench] [--no-busted] [--racecheck]"; exit 2 ;;
    esac
done

summary=$OUT/summary.txt
: > "$summary"
failed=0
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv > "$OUT/nvidia-smi.txt" 2>&1
note "# device: $(tail -n 1 "$OUT/nvidia-smi.txt")"

# ---- 0. the plugin ------------------------------------------------------------------
# The core opens $BUILD/libmoonkaas_cuda.so (or the copy beside the Lua module) when
# CUDA is first asked for; without it every CUDA case below would only be skipped.
if [ -f "$BUILD/libmoonkaas_cuda.so" ] && [ -f "$BUILD/moonkaas/libmoonkaas_cuda.so" ]; then
    plugin_out=$(timeout 120 "$BUILD/tests/plugin_test" 2>&1)
    rc=$?
    note "plugin_test: rc $rc, $(echo "$plugin_out" | grep -a '^# c-test' | tail -n 1)"
    echo "$plugin_out" | grep -a '^#   \(plugin\|probe\|no plugin\)\|^not ok\|check failed' | tee -a "$summary"
    echo "$plugin_out" | grep -aq '^#   probe: 1 ' || { note "plugin_test: the probe finds no device"; rc=1; }
    [ "$rc" -eq 0 ] || failed=1
else
    note "plugin: $BUILD/libmoonkaas_cuda.so or its copy in $BUILD/moonkaas/ is missing (make CUDA=1)"
    failed=1
fi

# ---- 1. the C test ---------------------------------------------------------------
t0=$(date +%s)
timeout 420 "$BUILD/tests/cuda_test" > "$OUT/cuda_test.log" 2>&1
rc=$?
line=$(grep -a '^# c-test' "$OUT/cuda_test.log" | tail -n 1)
note "cuda_test: rc $rc, ${line:-no summary} ($(( $(date +%s) - t0 )) s)"
grep -a '^not ok\|check failed' "$OUT/cuda_test.log" | head -n 20 | tee -a "$summary"
[ "$rc" -eq 0 ] || failed=1

# ---- 2. busted, #gpu ---------------------------------------------------------------
if [ "$busted" = 1 ]; then
    if [ -f "$BUSTED" ]; then
        t0=$(date +%s)
        MK_BUILD="$BUILD" timeout 600 lua5.4 "$BUSTED" -o TAP spec/gpu_spec.lua \
            > "$OUT/gpu_spec.log" 2>&1
        rc=$?
        ok=$(grep -ac '^ok ' "$OUT/gpu_spec.log")
        skip=$(grep -ac '^ok .*# SKIP' "$OUT/gpu_spec.log")
        bad=$(grep -ac '^not ok ' "$OUT/gpu_spec.log")
        note "gpu_spec: rc $rc, $((ok - skip)) passed, $bad failed, $skip skipped ($(( $(date +%s) - t0 )) s)"
        grep -a -A3 '^not ok ' "$OUT/gpu_spec.log" | head -n 30 | tee -a "$summary"
        [ "$rc" -eq 0 ] || failed=1
    else
        note "gpu_spec: busted not found at $BUSTED (set BUSTED=...)"
        failed=1
    fi
fi

# ---- 3. compute-sanitizer ------------------------------------------------------------
if [ "$memcheck" = 1 ]; then
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    t0=$(date +%s)
    MK_CUDA_TEST_NO_OOM=1 timeout 120 "$CS" --tool memcheck --leak-check full --error-exitcode 99 \
        "$BUILD/tests/cuda_test" > "$OUT/memcheck.log" 2>&1
    rc=$?
    # the op table's kernels: no leak check (lua5.4 and busted keep what they keep)
    MK_GPU_CASES=small MK_BUILD="$BUILD" timeout 480 "$CS" --tool memcheck --error-exitcode 99 \
        lua5.4 "$BUSTED" -o TAP spec/gpu_spec.lua >> "$OUT/memcheck.log" 2>&1 || rc=$?
    line=$(grep -a '^# c-test' "$OUT/memcheck.log" | tail -n 1)
    errs=$(grep -a 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)
    note "memcheck: rc $rc, ${errs:-no ERROR SUMMARY line}; ${line:-no test summary} ($(( $(date +%s) - t0 )) s)"
    grep -a -m 10 -B1 -A6 'Invalid\|Leaked\|Error' "$OUT/memcheck.log" | head -n 40 | tee -a "$summary"
    [ "$rc" -eq 0 ] || failed=1
fi

if [ "$racecheck" = 1 ]; then
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    t0=$(date +%s)
    MK_GPU_CASES=small MK_BUILD="$BUILD" timeout 480 "$CS" --tool racecheck \
        --error-exitcode 99 lua5.4 "$BUSTED" -o TAP spec/gpu_spec.lua > "$OUT/racecheck.log" 2>&1
    rc=$?
    line=$(grep -a '^# c-test' "$OUT/racecheck.log" | tail -n 1)
    errs=$(grep -a 'RACECHECK SUMMARY\|ERROR SUMMARY' "$OUT/racecheck.log" | tail -n 1)
    note "racecheck: rc $rc, ${errs:-no summary line}; ${line:-no test summary} ($(( $(date +%s) - t0 )) s)"
    [ "$rc" -eq 0 ] || failed=1
fi

# ---- 4. benchmark ------------------------------------------------------------------------
if [ "$bench" = 1 ]; then
    t0=$(date +%s)
    MK_BUILD="$BUILD" timeout 300 lua5.4 scripts/bench_ops.lua > "$OUT/bench_ops.txt" 2>&1
    rc=$?
    cat "$OUT/bench_ops.txt"
    note "bench_ops: rc $rc ($(( $(date +%s) - t0 )) s)"
fi

echo "==== summary"
cat "$summary"
[ "$failed" -eq 0 ] && echo "GPU RUN: PASS" || echo "GPU RUN: FAIL"
exit "$failed"
