#!/bin/sh
# dev/gpu/tokens.sh: on the GPU machine, tok/s of stories15M/110M in several
# precisions, a base tree (.gpu/base.tar: a `git archive --prefix=base/` of the
# revision to compare with) and this one alternating, then this tree under
# MK_CUDA_ARCH=80. Set up as dev/gpu/suite.sh says.
set -u
cd "$(dirname "$0")/../.."
. dev/gpu/env.sh
make -j16 > $OUT/build.log 2>&1 || { echo BUILD FAILED; tail $OUT/build.log; exit 1; }
if [ ! -d /tmp/b/base/build ]; then mkdir -p /tmp/b && tar xf .gpu/base.tar -C /tmp/b && (cd /tmp/b/base && make -j16 CUDA_ARCH=sm_90 > $OUT/base_build.log 2>&1); fi
wait
echo "== tok/s, base = 20798b9, main = this tree, alternating"
for cfg in "--only 15M" "--only 110M" "--only 15M --precision bf16" "--only 110M --precision bf16" "--only 110M --precision q8" "--only 15M --precision q8a8" "--only 15M --temperature 1 --topp 0.9"; do
  for r in 1 2; do tok /tmp/b/base base $cfg; tok $R main $cfg; done
done
echo "== forced sm_80 tok/s (main)"
export MK_CUDA_ARCH=80
for cfg in "--only 15M" "--only 110M" "--only 110M --precision bf16"; do
  tok $R main-sm80 $cfg
done
