#!/bin/sh
# dev/gpu/perf.sh: the GPU machine's figures in one call, after
# dev/gpu/suite.sh (same setup; reuses its build when the machine is warm):
#   1. tok/s of stories15M/110M shapes, a base tree (.gpu/base.tar: a
#      `git archive --prefix=base/` of the revision to compare with) and this
#      one alternating (dev/gpu/tokens.sh's configurations, one round);
#   2. ResNet-18, the DQN policy and GPT-2 small on CUDA against PyTorch
#      eager and torch.compile on the same weights (scripts/bench_nets.lua,
#      scripts/torch_nets.py, which also checks the outputs agree);
#   3. batched decoding of the stories15M shape (scripts/bench_batch.lua).
# Logs in $OUT.   run(command="sh dev/gpu/perf.sh 2>&1 | tail -120", carry=[".gpu"])
set -u
cd "$(dirname "$0")/../.."
. dev/gpu/env.sh
make -j16 > $OUT/build.log 2>&1 || { echo BUILD FAILED; tail $OUT/build.log; exit 1; }
(mkdir -p /tmp/b && tar xf .gpu/base.tar -C /tmp/b && cd /tmp/b/base && make -j16 > $OUT/base_build.log 2>&1) &
for n in resnet18 dqn gpt2; do
  timeout 120 lua5.4 scripts/bench_nets.lua --net $n --devices cuda --peer off --runs 100 \
    --save /tmp/${n}_w.safetensors --out /tmp/${n}_mk.safetensors > $OUT/nets_$n.log 2>&1
  echo "== $n (rc $?)"; grep -v '^ *lua5.4\|^ *python3\|^peer\|written to' $OUT/nets_$n.log | tail -8
  timeout 150 python3 scripts/torch_nets.py --net $n --weights /tmp/${n}_w.safetensors \
    --compare /tmp/${n}_mk.safetensors --devices cuda --runs 100 > $OUT/torch_$n.log 2>&1
  echo "-- torch (rc $?)"; tail -8 $OUT/torch_$n.log
done
wait
echo "== tok/s, base and this tree alternating"
for cfg in "--only 15M" "--only 110M" "--only 110M --precision bf16" "--only 110M --precision q8" "--only 15M --precision q8a8" "--only 15M --temperature 1 --topp 0.9"; do
  tok /tmp/b/base base $cfg; tok $R main $cfg
done
echo "== forced sm_80 tok/s (this tree)"
(export MK_CUDA_ARCH=80; tok $R main-sm80 --only 110M --precision bf16)
echo "== batched decoding, stories15M shape"
timeout 120 lua5.4 scripts/bench_batch.lua --model /tmp/ck/llama2_15M_random.bin --devices cuda --batches 1,4,16,64 > $OUT/batch.log 2>&1
echo "rc $?"; tail -12 $OUT/batch.log
