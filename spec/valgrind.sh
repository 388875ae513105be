#!/bin/sh
# Runs every C test, the examples and the CPU busted specs under valgrind; any error or
# definite leak fails. Usage: sh spec/valgrind.sh [BUILD_DIR]
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
if ls spec/*_spec.lua > /dev/null 2>&1; then
    if MK_VALGRIND=1 MK_BUILD="$BUILD" $VG lua5.4 /usr/bin/busted --exclude-tags=gpu,slow \
        > /tmp/mk-vg.out 2>&1; then
        tail -n 3 /tmp/mk-vg.out
        echo "valgrind clean: busted specs"
    else
        cat /tmp/mk-vg.out
        echo "valgrind FAILED: busted specs"
        status=1
    fi
fi
exit $status
