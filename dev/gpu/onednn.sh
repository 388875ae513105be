#!/bin/sh
# dev/gpu/onednn.sh: oneDNN's convolutions on the GPU machine's CPU (a Xeon
# with AVX-512 and AMX, where oneDNN 2.6.3's AVX-512 kernels crashed on small
# cases of the op table; core/cpu/conv_dnnl.c caps it at AVX2), set up as
# dev/gpu/suite.sh says:
#   1. every conv and pool case of 32 seeds, a process a seed, under the cap;
#   2. seeds 1 and 10 a process a case at AVX512_CORE_AMX and at AVX512_CORE:
#      the cases that crash there;
#   3. ResNet-18 on that CPU at 1 and 16 threads against Python's onnxruntime.
#   run(command="sh dev/gpu/onednn.sh 2>&1 | tail -50", carry=[".gpu"])
set -u
cd "$(dirname "$0")/../.."
. dev/gpu/env.sh
make -j16 all > $OUT/build.log 2>&1 || { echo BUILD FAILED; tail $OUT/build.log; exit 1; }
C=dev/gpu/conv_cases.lua
echo "== under the cap: 32 seeds"
seq 1 32 | xargs -P 16 -I{} sh -c "MK_CPU_CONV=dnnl timeout 60 lua5.4 -e 'SEED={}' $C > /dev/null 2>&1; echo \"\$? {}\"" > $OUT/stress.txt
echo "ok: $(grep -c '^0 ' $OUT/stress.txt) of 32; failed seeds: $(grep -v '^0 ' $OUT/stress.txt | cut -d' ' -f2 | tr '\n' ' ')"
for isa in AVX512_CORE_AMX AVX512_CORE; do
  echo "== ONEDNN_MAX_CPU_ISA=$isa: cases that fail"
  for s in 1 10; do
    seq 1 45 | xargs -P 16 -I{} sh -c "ONEDNN_MAX_CPU_ISA=$isa MK_CPU_CONV=dnnl timeout 60 lua5.4 -e 'SEED=$s CASE={}' $C > $OUT/c_${isa}_${s}_{}.log 2>&1; echo \"\$? {}\"" |
      grep -v '^0 ' | while read rc i; do echo "seed $s case $i rc $rc: $(head -1 $OUT/c_${isa}_${s}_$i.log)"; done
  done
done
echo "== ResNet-18 on the CPU against onnxruntime (Python)"
for t in 1 16; do
  MK_PYTHON=python3 timeout 100 lua5.4 scripts/bench_nets.lua --net resnet18 --threads $t --runs 30 --peer-dir /tmp/rn > $OUT/rn_$t.log 2>&1
  grep "resnet18 cpu\|onnxruntime" $OUT/rn_$t.log | head -2
done
