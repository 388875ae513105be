#!/bin/sh
# Installs what moonkaas needs on Debian 12 (run as root) and makes `lua` mean Lua 5.4:
# Debian's lua-busted pulls in Lua 5.1 and points `lua` at it.
set -eu
export DEBIAN_FRONTEND=noninteractive
need=""
# clang and its runtimes (libclang-rt-dev: libFuzzer, ASan, UBSan) build `make fuzz`
# graphviz draws scripts/graph.lua's pictures
# pkg-config finds the headers (make) and checks the installed moonkaas.pc (install_spec);
# lua5.1 and luajit: the binding's other hosts (make test-lua51, test-luajit)
for p in build-essential pkg-config lua5.4 liblua5.4-dev lua-busted luarocks libopenblas-dev \
         valgrind clang libclang-rt-dev graphviz lua5.1 liblua5.1-0-dev luajit libluajit-5.1-dev; do
    dpkg -s "$p" > /dev/null 2>&1 || need="$need $p"
done
if [ -n "$need" ]; then
    apt-get update -qq
    apt-get install -y -qq $need > /dev/null
fi
update-alternatives --set lua-interpreter /usr/bin/lua5.4 > /dev/null
update-alternatives --set lua-compiler /usr/bin/luac5.4 > /dev/null 2>&1 || true
echo "setup: $(lua -v), $(gcc --version | head -n 1)"
