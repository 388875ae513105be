#!/bin/sh
# dev/gpu/suite.sh: the project's checks on the GPU machine in one call
#   run(command="sh dev/gpu/suite.sh 2>&1 | tail -120", carry=[".gpu"])
#   1. build this tree for the card;
#   2. cuda_memory_test alone (it reads the device's free memory);
#   3. the whole suite, spec/run_tests.sh: every C test and spec, the CUDA
#      cases on the device, as many jobs at a time as there are cores
#      (MK_GPU_CASES=small: gpu_spec's large shapes are step 5's);
#   4. the sampler's lone-block path and llama2 under MK_CUDA_ARCH=80;
#   5. gpu_spec with its large shapes, capped at LARGE_S seconds (default 150);
#   6. scripts/export_nets.py (PyTorch networks through torch.onnx, with ONNX
#      Runtime's outputs) and spec/onnx_nets_spec.lua over them.
# Logs in $OUT; failing cases and a summary are printed last.
# .gpu/ (ignored) must hold device/ and models/ from ../shared and, in debs2/,
# the Debian packages the GPU machine lacks, fetched here with
#   (mkdir -p .gpu/debs2 && cd .gpu/debs2 && apt-get download libprotobuf-c1 \
#    libprotobuf-c-dev protobuf-c-compiler libprotoc32 libprotobuf32 libdnnl2 \
#    libdnnl-dev ocl-icd-libopencl1)
set -u
cd "$(dirname "$0")/../.."
. dev/gpu/env.sh
B=/opt/lua/usr/bin/busted
nvidia-smi --query-gpu=name --format=csv,noheader
t=$(date +%s); make -j16 all examples-build > $OUT/build.log 2>&1 || { echo "BUILD FAILED"; grep -E "error" $OUT/build.log | head; tail -5 $OUT/build.log; exit 1; }
echo "built in $(( $(date +%s) - t )) s"
spec() { # log-name seconds spec-file [env...]: one spec, TAP, its counts
  local name=$1 s=$2 file=$3; shift 3
  env "$@" timeout $s lua5.4 $B -o TAP $file > $OUT/$name.tap 2>&1
  echo "$name rc=$?: $(grep -c '^ok' $OUT/$name.tap) ok, $(grep -c '^not ok' $OUT/$name.tap) not ok"
  grep -A4 '^not ok' $OUT/$name.tap | head -30
}
timeout 120 build/tests/cuda_memory_test > $OUT/cuda_memory_test.log 2>&1
echo "cuda_memory_test rc=$?: $(grep '# c-test' $OUT/cuda_memory_test.log | tail -1)"
grep "^not ok" $OUT/cuda_memory_test.log | head
t=$(date +%s)
MK_GPU_CASES=small BUSTED=$B timeout ${SUITE_S:-300} sh spec/run_tests.sh build > $OUT/suite.log 2>&1
echo "suite rc=$? in $(( $(date +%s) - t )) s: $(tail -1 $OUT/suite.log)"
grep -a -B2 -A6 '^not ok' $OUT/suite.log | head -60
spec sm80_sample 90 spec/sample_spec.lua MK_CUDA_ARCH=80 &
spec sm80_llama2 150 spec/llama2_gpu_spec.lua MK_CUDA_ARCH=80 &
spec gpu_large ${LARGE_S:-150} spec/gpu_spec.lua &
(mkdir -p /tmp/nets && timeout 150 python3 scripts/export_nets.py /tmp/nets > $OUT/export_nets.log 2>&1
 echo "export_nets rc=$?"; tail -8 $OUT/export_nets.log
 spec onnx_nets 90 spec/onnx_nets_spec.lua MK_ONNX_NETS=/tmp/nets
 grep -a -i 'pending\|# skip' $OUT/onnx_nets.tap | head) &
wait
