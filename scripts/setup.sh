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
# protobuf-c-compiler and libprotobuf-c-dev: the ONNX importer (core/onnx/); python3-onnx
# writes the specs' ONNX files; libdnnl-dev: oneDNN's CPU convolutions (core/cpu/conv_dnnl.c);
# nodejs and npm run ONNX Runtime (below) for onnx_ort_spec, Debian's unless a node with
# its npm (nodesource's) is there already; libopenblas0-openmp: OpenBLAS on OpenMP's threads,
# which the CPU device opens before the pthreads build (core/cpu/matmul.c)
for p in build-essential pkg-config lua5.4 liblua5.4-dev lua-busted luarocks libopenblas-dev \
         libopenblas0-openmp valgrind clang libclang-rt-dev graphviz lua5.1 liblua5.1-0-dev luajit libluajit-5.1-dev \
         protobuf-c-compiler libprotobuf-c-dev python3-onnx libdnnl-dev; do
    dpkg -s "$p" > /dev/null 2>&1 || need="$need $p"
done
command -v npm > /dev/null 2>&1 || need="$need nodejs npm"
if [ -n "$need" ]; then
    apt-get update -qq
    apt-get install -y -qq $need > /dev/null
fi
# ONNX Runtime for spec/onnx_ort_spec.lua: npm's onnxruntime-node (its CPU provider ships
# in the package), outside any checkout, never vendored; MK_ORTNODE=<dir>/node_modules
# points the spec elsewhere
ORTNODE_DIR=${MK_ORTNODE_DIR:-/opt/ortnode}
if [ ! -f "$ORTNODE_DIR/node_modules/onnxruntime-node/package.json" ]; then
    mkdir -p "$ORTNODE_DIR"
    (cd "$ORTNODE_DIR" && npm install --silent --no-audit --no-fund onnxruntime-node --ignore-scripts) ||
        echo "setup: onnxruntime-node did not install: onnx_ort_spec will be pending" >&2
fi
update-alternatives --set lua-interpreter /usr/bin/lua5.4 > /dev/null
update-alternatives --set lua-compiler /usr/bin/luac5.4 > /dev/null 2>&1 || true
echo "setup: $(lua -v), $(gcc --version | head -n 1)"
