#!/bin/sh
# scripts/ptx_diff.sh BEFORE AFTER — whether a change to a generator changed any
# kernel: compiles each BEFORE/NAME.cu and AFTER/NAME.cu (generated sources, as
# spec/c/product_test.c's MK_PRODUCT_SOURCES or scripts/kernels.lua -o write
# them) to PTX with nvcc, plain and with MK_TIMELINE (the stamped build), for
# ARCH (default sm_90), and names every pair whose PTX differs, saying where
# only the virtual registers' numbers do (the same instructions in the same
# order: ptxas may still schedule them apart), else how many lines of the
# masked PTX differ (a moved load is 2). Identical PTX means the change
# needs no GPU run. Exits 1 where any differs or fails to compile, 0 otherwise.
set -eu
[ $# -eq 2 ] || { echo "usage: sh scripts/ptx_diff.sh BEFORE AFTER" >&2; exit 2; }
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${ARCH:-sm_90}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ptx-diff.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
same=0 bad=0
for a in "$1"/*.cu; do
    [ -f "$a" ] || continue
    name=$(basename "$a")
    b="$2/$name"
    if [ ! -f "$b" ]; then echo "$name: not in $2"; bad=$((bad + 1)); continue; fi
    for defs in "" "-DMK_TIMELINE -DMK_TIMELINE_OCCUPANCY=2"; do
        if ! "$NVCC" -ptx -arch="$ARCH" $defs "$a" -o "$tmp/a.ptx" 2> "$tmp/err" ||
           ! "$NVCC" -ptx -arch="$ARCH" $defs "$b" -o "$tmp/b.ptx" 2> "$tmp/err"; then
            echo "$name ${defs:-plain}: does not compile"; sed 5q "$tmp/err"; bad=$((bad + 1)); continue
        fi
        if cmp -s "$tmp/a.ptx" "$tmp/b.ptx"; then same=$((same + 1)); continue; fi
        bad=$((bad + 1))
        for f in a b; do sed -E 's/%[a-z]+[0-9]+/%R/g' "$tmp/$f.ptx" > "$tmp/$f.masked"; done
        if cmp -s "$tmp/a.masked" "$tmp/b.masked"; then
            echo "$name ${defs:-plain}: PTX differs in register numbers only"
        else # how much: lines only in one masked PTX or the other (a moved load is 2)
            echo "$name ${defs:-plain}: PTX differs ($(diff "$tmp/a.masked" "$tmp/b.masked" | grep -c '^[<>]') lines)"
        fi
    done
done
echo "ptx_diff ($ARCH): $same identical, $bad differ or fail"
[ "$bad" -eq 0 ]
