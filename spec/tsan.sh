#!/bin/sh
# Runs the C tests of a ThreadSanitizer build that start threads of their own
# (pthread_create in their source: make tsan builds only those, in build-tsan/,
# and calls this); a race report, a failed check or a crash fails. The other
# tests run one thread in this tree (no OpenMP, OpenBLAS on the calling thread,
# no CUDA plugin): TSan could report nothing there, and ASan and valgrind run them.
#
#   sh spec/tsan.sh [BUILD_DIR]
#
# OpenBLAS runs on the calling thread (OPENBLAS_NUM_THREADS=1; the tree is
# built without OpenMP): OpenBLAS and libgomp are not built with TSan, so their
# worker threads' hand-offs are invisible to it and would be reported as races
# that are not. Nothing is suppressed: any report is about moonkaas. The first
# report ends the test with exit code 66 (halt_on_error).
BUILD=${1:-build-tsan}
cd "$(dirname "$0")/.." || exit 2
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# generated kernels compiled here are cached in a throwaway directory
export MK_KERNEL_CACHE="${MK_KERNEL_CACHE:-$(mktemp -d)}"
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
out=$(mktemp)
status=0 n=0
for t in "$BUILD"/tests/*; do
    [ -x "$t" ] || continue
    # a race needs two threads: only the tests that start threads of their own
    # (this tree has no OpenMP, OpenBLAS runs on the calling thread, no plugin)
    grep -q pthread_create "spec/c/$(basename "$t").c" 2> /dev/null || continue
    n=$((n + 1))
    "$t" > "$out" 2>&1
    rc=$?
    line=$(grep '^# c-test' "$out" | tail -n 1)
    if [ "$rc" -eq 0 ] && [ -n "$line" ] && ! grep -q -e 'WARNING: ThreadSanitizer' -e 'ERROR: ThreadSanitizer' "$out"; then
        echo "tsan clean: ${line#\# c-test }"
    else
        cat "$out"
        echo "tsan FAILED: $(basename "$t") (exit $rc)"
        status=1
    fi
done
rm -f "$out"
[ "$n" -gt 0 ] || { echo "tsan: no tests in $BUILD/tests"; status=1; }
[ "$status" -eq 0 ] && echo "tsan: $n C tests, no reports"
exit $status
