# dev/gpu/env.sh: sourced by dev/gpu/suite.sh and dev/gpu/tokens.sh on the GPU
# machine, from the tree's root: unpacks the Debian packages of .gpu/debs2,
# links ../shared/models to .gpu/models, sets up Lua and busted (R: the tree)
# and the build's environment.
R=$(pwd)
for f in .gpu/debs2/*.deb; do dpkg -x "$f" / ; done; ldconfig
mkdir -p ../shared 2>/dev/null; [ -e ../shared/models ] || ln -s "$R/.gpu/models" ../shared/models
sh .gpu/device/setup-lua.sh /opt/lua >/dev/null && . /opt/lua/env.sh
export CUDA_ARCH=sm_90 MK_KERNEL_CACHE=/tmp/kc MK_BUILD=build
