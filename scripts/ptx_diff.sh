#!/bin/sh
# scripts/ptx_diff.sh BEFORE AFTER — whether a change to a generator or a
# skeleton (kernels/skeletons/) changed any kernel: compiles each BEFORE/NAME.cu
# and AFTER/NAME.cu (generated sources, as spec/c/product_test.c's
# MK_PRODUCT_SOURCES or scripts/kernels.lua -o write them) to PTX with nvcc,
# plain and with MK_TIMELINE (the stamped build), for ARCH (default sm_90),
# and names every pair whose PTX differs, saying where only the virtual
# registers' numbers do (the same instructions in the same order: ptxas may
# still schedule them apart), else how many lines of the masked PTX differ
# (a moved load is 2). Identical PTX means the change needs no GPU run.
#
# BEFORE and AFTER may instead be two built source trees (each with
# scripts/kernels.lua and its build folder, MK_BUILD, default build: the tree
# before the change unpacked and built apart, `git archive main | tar -x -C
# /tmp/main && make -C /tmp/main CUDA=0`): each then writes the sources of
# the llama2 shapes in SHAPES (NAME:dim,hidden,layers,heads,kv_heads,vocab,
# seq_len; default stories15M, stories110M and Llama-2-7B) in the precisions
# of PRECISIONS (default fp32 bf16 q8 q8a8) for ARCH, and those are compared.
#
# A pair whose sources are alike but for their comment lines (the header,
# which names node ids) counts as identical without compiling, and a pair
# met before is compiled once. Exits 1 where any differs or fails, else 0.
set -eu
[ $# -eq 2 ] || { echo "usage: sh scripts/ptx_diff.sh BEFORE AFTER" >&2; exit 2; }
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCH=${ARCH:-sm_90}
SHAPES=${SHAPES:-"stories15M:288,768,6,6,6,32000,256 stories110M:768,2048,12,12,12,32000,1024 llama2-7B:4096,11008,32,32,32,-32000,2048"}
PRECISIONS=${PRECISIONS:-"fp32 bf16 q8 q8a8"}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ptx-diff.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

# sources TREE OUT: TREE's kernels of every shape and precision, as OUT/SHAPE-Q-launchNNN.cu
sources() {
    mkdir -p "$2"
    for s in $SHAPES; do
        for q in $PRECISIONS; do
            d="$2/${s%%:*}-$q"
            if ! (cd "$1" && MK_BUILD=${MK_BUILD:-build} ${LUA:-lua5.4} scripts/kernels.lua "${s#*:}" -q "$q" \
                      --arch "${ARCH#sm_}" --no-ptxas -o "$d") > "$tmp/log" 2>&1; then
                echo "$1: scripts/kernels.lua ${s#*:} -q $q failed:"; sed 5q "$tmp/log"; exit 1
            fi
            for f in "$d"/*.cu; do mv "$f" "$d-$(basename "$f")"; done
            rmdir "$d"
        done
    done
}
before=$1 after=$2
if [ -f "$1/scripts/kernels.lua" ] && [ -f "$2/scripts/kernels.lua" ]; then
    sources "$(cd "$1" && pwd)" "$tmp/before"
    sources "$(cd "$2" && pwd)" "$tmp/after"
    before=$tmp/before after=$tmp/after
fi

same=0 bad=0 alike=0 seen=" "
for a in "$before"/*.cu; do
    [ -f "$a" ] || continue
    name=$(basename "$a")
    b="$after/$name"
    if [ ! -f "$b" ]; then echo "$name: not in $2"; bad=$((bad + 1)); continue; fi
    grep -v '^//' "$a" > "$tmp/a.code" || true
    grep -v '^//' "$b" > "$tmp/b.code" || true
    key=$(cat "$tmp/a.code" "$tmp/b.code" | cksum | tr ' ' _)
    if cmp -s "$tmp/a.code" "$tmp/b.code" || case "$seen" in *" $key "*) true ;; *) false ;; esac; then
        same=$((same + 2)) alike=$((alike + 1)); continue
    fi
    seen="$seen$key "
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
echo "ptx_diff ($ARCH): $same identical, $bad differ or fail ($alike sources alike or met before, not compiled)"
[ "$bad" -eq 0 ]
