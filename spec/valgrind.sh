#!/bin/sh
# Runs every C test, the examples and the CPU busted specs (less those named in
# SKIP below) under valgrind; any error or definite leak fails.
# Usage: sh spec/valgrind.sh [BUILD_DIR]
BUILD=${1:-build}
cd "$(dirname "$0")/.." || exit 2
VG="valgrind -q --keep-debuginfo=yes --suppressions=spec/valgrind.supp --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite"
status=0
# generated kernels compiled here are cached in a throwaway directory
export MK_KERNEL_CACHE="${MK_KERNEL_CACHE:-$(mktemp -d)}"
for t in "$BUILD"/tests/*; do
    [ -x "$t" ] || continue
    if MK_VALGRIND=1 $VG "$t" > /tmp/mk-vg.out 2>&1; then
        echo "valgrind clean: $(basename "$t")"
    else
        cat /tmp/mk-vg.out
        echo "valgrind FAILED: $(basename "$t")"
        status=1
    fi
done
for e in "$BUILD"/examples/*; do
    [ -x "$e" ] || continue
    args=
    [ "$(basename "$e")" = game_loop ] && args="--frames 200"
    if $VG "$e" $args > /tmp/mk-vg.out 2>&1; then
        echo "valgrind clean: $(basename "$e")"
    else
        cat /tmp/mk-vg.out
        echo "valgrind FAILED: $(basename "$e")"
        status=1
    fi
done
# The CPU specs, less what valgrind would only repeat (doc/testing.md): the op
# table is sampled (MK_CASES=quick: every kernel, a fifth of the exhaustive
# loops' cases, no large ones), and these files are left to ASan: the ones that
# only drive child processes (valgrind follows no child) and the llama2
# end-to-end runs, whose kernels are the op table's and lowp_test's and whose
# loaders llama2_errors_spec reaches.
SKIP="kernels scripts install demo driver cuda_arch lua_hosts llama2 llama2_formats llama2_sampler
llama2_tokenizer"
excludes=
for s in $SKIP; do excludes="$excludes --exclude-pattern=^${s}_spec"; done
if ls spec/*_spec.lua > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    if MK_CASES=quick MK_VALGRIND=1 MK_BUILD="$BUILD" $VG lua5.4 /usr/bin/busted --exclude-tags=gpu,slow \
        $excludes > /tmp/mk-vg.out 2>&1; then
        tail -n 3 /tmp/mk-vg.out
        echo "valgrind clean: busted specs"
    else
        cat /tmp/mk-vg.out
        echo "valgrind FAILED: busted specs"
        status=1
    fi
fi
exit $status
