#!/bin/sh
# Runs every C test (build/tests/*), the examples (examples/run.sh) and every
# busted spec, then prints the one line CI reads: "N passed, N failed, N
# skipped". Exits non-zero on any failure.
#
#   sh spec/run_tests.sh [BUILD_DIR]     (make test calls this)
# With ASAN=1 the specs run with the sanitizer runtime preloaded into lua5.4, and
# allocations too large to have return NULL (the specs test that failure).
#
# Each C test, the examples and each spec file is one job; spec/jobs.sh runs
# them as many at a time as the machine has cores (JOBS=1: one after the
# other), the longest first. Their outputs are printed in a fixed order once
# all have ended: C tests, examples, specs.
BUILD=${1:-build}
LUA=${LUA:-lua5.4}
BUSTED=${BUSTED:-$(command -v busted || echo /usr/bin/busted)}
cd "$(dirname "$0")/.." || exit 2
log=$(mktemp -d)
passed=0 failed=0 skipped=0
# generated kernels compiled here are cached in build/kernel-cache, not in the
# user's cache; every tree of the checkout shares it (a cubin depends only on its
# source, the architecture and NVRTC; its writes are atomic, so jobs side by side
# share it too), so a second run, or the ASan run before `make test` in CI,
# reads the tests' fixed corpora of kernels from it
export MK_KERNEL_CACHE="${MK_KERNEL_CACHE:-$(pwd)/build/kernel-cache}"

# intercept_tls_get_addr=0: GCC 12's runtime takes a dynamic TLS block that
# malloc happens to place 16 bytes past a page boundary for a glibc 2.19 header
# and reads a range from before it, so LeakSanitizer's tracer dies at exit
# (signal 11, "DTLS ... at 0x12363") whenever the plugin's libraries land so
# (kernel_cache_test did, with one more .cu file in the plugin): fixed in the
# sanitizers of GCC 14 and LLVM 17
[ -n "$ASAN" ] && export ASAN_OPTIONS=protect_shadow_gap=0:allocator_may_return_null=1:intercept_tls_get_addr=0:${ASAN_OPTIONS:-}
spec_env="MK_BUILD=$BUILD"
if [ -n "$ASAN" ]; then
    # lua5.4 itself is not instrumented: the runtime is preloaded, its leaks are
    # not ours; CUDA needs the shadow gap
    spec_env="$spec_env LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
    spec_env="$spec_env ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:allocator_may_return_null=1:${ASAN_OPTIONS:-}"
fi

# the longest first (CPU seconds of a run alone, doc/testing.md), then the rest
FIRST="spec/llama2_batch spec/docs spec/onnx spec/onnx_nn tests/lowp_products_test spec/llama2
spec/kernels examples spec/scripts spec/llama2_formats tests/codegen_test spec/ops"
jobs=$log/jobs
: > "$jobs"
add() { grep -q "^$1 " "$jobs" || echo "$*" >> "$jobs"; }
job() { # job tests/NAME | examples | spec/NAME: its line
    case $1 in
        tests/*) [ -x "$BUILD/$1" ] && add "test_${1#tests/}" "$BUILD/$1" ;;
        examples) add examples sh examples/run.sh "$BUILD" ;;
        # the op-case table with every CPU launch forking (MK_CPU_FORK=always, read
        # once per process): its small cases take the kernels' threaded paths too
        spec/ops) add spec_ops env MK_CPU_FORK=always $spec_env $LUA "$BUSTED" -o TAP spec/ops_spec.lua ;;
        # the longest spec, in two jobs: its golden-text case, and the rest
        spec/llama2_batch)
            add spec_llama2_batch_golden env $spec_env $LUA "$BUSTED" -o TAP --filter=golden \
                spec/llama2_batch_spec.lua
            add spec_llama2_batch env $spec_env $LUA "$BUSTED" -o TAP --filter-out=golden \
                spec/llama2_batch_spec.lua ;;
        spec/*) [ -f "${1}_spec.lua" ] && add "spec_${1#spec/}" env $spec_env $LUA "$BUSTED" -o TAP "${1}_spec.lua" ;;
    esac
    return 0
}
for j in $FIRST; do job "$j"; done
for t in "$BUILD"/tests/*; do job "tests/${t##*/}"; done
job examples
for f in spec/*_spec.lua; do job "${f%_spec.lua}"; done
sh spec/jobs.sh "$log" < "$jobs"

# the C tests: each one's "# c-test" line counts
for t in "$BUILD"/tests/*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "== $name ($(cat "$log/test_$name.cpu") s CPU)"
    cat "$log/test_$name.out"
    rc=$(cat "$log/test_$name.rc")
    line=$(grep '^# c-test' "$log/test_$name.out" | tail -n 1)
    if [ -z "$line" ]; then
        echo "not ok - $name exited with $rc before its summary"
        failed=$((failed + 1))
        continue
    fi
    set -- $(echo "$line" | sed 's/.*: \([0-9]*\) passed, \([0-9]*\) failed, \([0-9]*\) skipped.*/\1 \2 \3/')
    passed=$((passed + $1)) failed=$((failed + $2)) skipped=$((skipped + $3))
    if [ "$rc" -ne 0 ] && [ "$2" -eq 0 ]; then
        echo "not ok - $name exited with $rc"
        failed=$((failed + 1))
    fi
done

# the examples and the specs: each "ok", "not ok" or "ok ... # SKIP" line counts
# count NAME LABEL: one TAP job's lines
count() {
    echo "== $2 ($(cat "$log/$1.cpu") s CPU)"
    cat "$log/$1.out"
    rc=$(cat "$log/$1.rc")
    s=$(grep -c '^ok .*# SKIP' "$log/$1.out")
    p=$(( $(grep -c '^ok ' "$log/$1.out") - s ))
    f=$(grep -c '^not ok ' "$log/$1.out")
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "not ok - $2 exited with $rc"
        failed=$((failed + 1))
    fi
}
count examples examples
count spec_llama2_batch_golden "busted spec/llama2_batch_spec.lua --filter=golden"
for f in spec/*_spec.lua; do
    name=$(basename "$f" _spec.lua)
    count "spec_$name" "busted $f"
done
rm -rf "$log"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
