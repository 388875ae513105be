# dev/gpu/env.sh: sourced by dev/gpu/suite.sh and dev/gpu/tokens.sh on the GPU
# machine, from the tree's root: unpacks the Debian packages of .gpu/debs2,
# links ../shared/models to .gpu/models, sets up Lua and busted (R: the tree)
# and the build's environment.
R=$(pwd)
for f in .gpu/debs2/*.deb; do dpkg -x "$f" / ; done; ldconfig
mkdir -p ../shared 2>/dev/null; [ -e ../shared/models ] || ln -s "$R/.gpu/models" ../shared/models
sh .gpu/device/setup-lua.sh /opt/lua >/dev/null && . /opt/lua/env.sh
export CUDA_ARCH=sm_90 MK_KERNEL_CACHE=/tmp/kc MK_BUILD=build
# tok TREE LABEL ARGS...: the CUDA line of scripts/bench_llama2.lua ARGS in TREE
tok() {
  local tree=$1 lab=$2; shift 2
  (cd $tree && timeout 90 lua5.4 scripts/bench_llama2.lua --devices cuda --tokenizer $R/.gpu/models/tokenizer.bin \
    --dir /tmp/ck --keep --runs 3 "$@" > $OUT/x.log 2>&1)
  echo "$lab $*: $(grep -E 'moonkaas cuda' $OUT/x.log | tail -1 | cut -c1-100)"
}
