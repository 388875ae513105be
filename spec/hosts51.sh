#!/bin/sh
# The CPU busted specs on a Lua 5.1 host (lua5.1 or luajit) against the module
# built for it (make LUA=lua5.1 -> build-lua51/, make LUA=luajit -> build-luajit/),
# then the line CI reads: "N passed, N failed, N skipped".
#
#   sh spec/hosts51.sh lua5.1 build-lua51      (make test-lua51)
#   sh spec/hosts51.sh luajit build-luajit     (make test-luajit)
#
# The rule for which specs run: the files in SPECS below. They are written in
# the Lua all three hosts parse; every other spec uses 5.4-only syntax
# (<close>, integer operators, string.pack; driver_spec in the code its child
# runs) or needs a GPU, and is skipped
# here, counted and named in the summary. A spec in the list that fails to
# load is a failure, not a skip.
LUA=${1:?usage: hosts51.sh LUA BUILD}
BUILD=${2:?usage: hosts51.sh LUA BUILD}
BUSTED=${BUSTED:-$(command -v busted || echo /usr/bin/busted)}
cd "$(dirname "$0")/.." || exit 2

SPECS="ops node model steps script graph version llama2 llama2_tokenizer llama2_errors llama2_sampler
llama2_formats compat51
lua_hosts shape pointwise_ops"

log=$(mktemp -d)
export LUA # specs that start a Lua process (scripts, the command line) start this one
export MK_KERNEL_CACHE="${MK_KERNEL_CACHE:-$log/kernels}"
files= ran=0
for s in $SPECS; do files="$files spec/${s}_spec.lua"; ran=$((ran + 1)); done
skipped_files=
for f in spec/*_spec.lua; do
    case " $files " in *" $f "*) ;; *) skipped_files="$skipped_files $(basename "$f" _spec.lua)" ;; esac
done
echo "== busted on $($LUA -v 2>&1 | head -n 1): $ran spec files"
MK_BUILD="$BUILD" $LUA "$BUSTED" -o TAP $files > "$log/busted.out" 2>&1
rc=$?
cat "$log/busted.out"
s=$(grep -c '^ok .*# SKIP' "$log/busted.out")
p=$(( $(grep -c '^ok ' "$log/busted.out") - s ))
f=$(grep -c '^not ok ' "$log/busted.out")
if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "not ok - busted exited with $rc"
    f=$((f + 1))
fi
echo "# spec files not run on $LUA (5.4-only syntax or a GPU):$skipped_files"
rm -rf "$log"
echo "$p passed, $f failed, $s skipped"
[ "$f" -eq 0 ]
