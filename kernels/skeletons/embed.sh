#!/bin/sh
# Writes, on stdout, the C header that holds each skeleton given (a real CUDA
# file, kernels/skeletons/NAME.cuh) as the string mk_skeleton_NAME, which the
# generators (codegen.cu, codegen_matvec.cu) paste into a kernel's source.
set -eu
echo "/* Written by kernels/skeletons/embed.sh from the skeletons (kernels/skeletons): do not edit. */"
for f in "$@"; do
    echo "static const char mk_skeleton_$(basename "$f" .cuh)[] ="
    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$/\\n"/' "$f"
    echo "    ;"
done
