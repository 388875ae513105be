#!/bin/sh
# Runs every C test (build/tests/*), the examples (examples/run.sh) and every
# busted spec, then prints the one line CI reads: "N passed, N failed, N
# skipped". Exits non-zero on any failure.
#
#   sh spec/run_tests.sh [BUILD_DIR]     (make test calls this)
# With ASAN=1 the specs run with the sanitizer runtime preloaded into lua5.4, and
# allocations too large to have return NULL (the specs test that failure).
BUILD=${1:-build}
LUA=${LUA:-lua5.4}
BUSTED=${BUSTED:-$(command -v busted || echo /usr/bin/busted)}
cd "$(dirname "$0")/.." || exit 2
log=$(mktemp -d)
passed=0 failed=0 skipped=0
# generated kernels compiled here are cached in build/kernel-cache, not in the
# user's cache; every tree of the checkout shares it (a cubin depends only on its
# source, the architecture and NVRTC), so a second run, or the ASan run before
# `make test` in CI, reads the tests' fixed corpora of kernels from it
export MK_KERNEL_CACHE="${MK_KERNEL_CACHE:-$(pwd)/build/kernel-cache}"

[ -n "$ASAN" ] && export ASAN_OPTIONS=protect_shadow_gap=0:allocator_may_return_null=1:${ASAN_OPTIONS:-}
for t in "$BUILD"/tests/*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "== $name"
    "$t" > "$log/$name.out" 2>&1
    rc=$?
    cat "$log/$name.out"
    line=$(grep '^# c-test' "$log/$name.out" | tail -n 1)
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

# the examples (examples/run.sh: the C ones of make examples-build, the Lua ones):
# each "ok", "not ok" or "ok ... # SKIP" line counts
echo "== examples"
sh examples/run.sh "$BUILD" > "$log/examples.out" 2>&1
rc=$?
cat "$log/examples.out"
s=$(grep -c '^ok .*# SKIP' "$log/examples.out")
p=$(( $(grep -c '^ok ' "$log/examples.out") - s ))
f=$(grep -c '^not ok ' "$log/examples.out")
passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "not ok - examples/run.sh exited with $rc"
    failed=$((failed + 1))
fi

if ls spec/*_spec.lua > /dev/null 2>&1; then
    echo "== busted"
    if [ -n "$ASAN" ]; then
        export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
        # lua5.4 itself is not instrumented: its leaks are not ours; CUDA needs the shadow gap
        export ASAN_OPTIONS=detect_leaks=0:protect_shadow_gap=0:allocator_may_return_null=1:${ASAN_OPTIONS:-}
    fi
    # the op-case table with every CPU launch forking (MK_CPU_FORK=always, read
    # once per process): its small cases take the kernels' threaded paths too
    MK_CPU_FORK=always MK_BUILD="$BUILD" $LUA "$BUSTED" -o TAP spec/ops_spec.lua > "$log/busted.out" 2>&1
    rc=$?
    MK_BUILD="$BUILD" $LUA "$BUSTED" -o TAP --exclude-pattern=ops_spec >> "$log/busted.out" 2>&1
    rc2=$?
    [ "$rc" -eq 0 ] && rc=$rc2
    unset LD_PRELOAD
    cat "$log/busted.out"
    p=$(grep -c '^ok .*# SKIP' "$log/busted.out")
    s=$p
    p=$(( $(grep -c '^ok ' "$log/busted.out") - s ))
    f=$(grep -c '^not ok ' "$log/busted.out")
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "not ok - busted exited with $rc"
        failed=$((failed + 1))
    fi
fi
rm -rf "$log"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
