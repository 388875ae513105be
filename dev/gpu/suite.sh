#!/bin/sh
# dev/gpu/suite.sh: on the GPU machine, build this tree for the card, then run
# every C test and the specs that use the GPU (TAP), each capped; logs in $OUT.
#   run(command="sh dev/gpu/suite.sh 2>&1 | tail -150", carry=[".gpu"])
# .gpu/ (ignored) must hold device/ and models/ from ../shared and, in debs2/,
# the Debian packages the GPU machine lacks, fetched here with
#   (mkdir -p .gpu/debs2 && cd .gpu/debs2 && apt-get download libprotobuf-c1 \
#    libprotobuf-c-dev protobuf-c-compiler libprotoc32 libprotobuf32 libdnnl2 \
#    libdnnl-dev ocl-icd-libopencl1)
# SPECS and SPEC_S (seconds a spec) choose the specs.
set -u
cd "$(dirname "$0")/../.."
. dev/gpu/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
t=$(date +%s); make -j16 > $OUT/build.log 2>&1 || { echo "BUILD FAILED"; grep -E "error" $OUT/build.log | head; tail -5 $OUT/build.log; exit 1; }
echo "built in $(( $(date +%s) - t )) s"
for t in build/tests/*; do timeout 120 $t > $OUT/$(basename $t).log 2>&1; echo "$(grep '# c-test' $OUT/$(basename $t).log | tail -1) rc=$?"; grep "^not ok" $OUT/$(basename $t).log | head -5; done
for s in ${SPECS:-gpu_spec onnx_spec conv_spec reduce_spec shape_spec pointwise_ops_spec llama2_gpu_spec llama2_batch_spec cudnn_spec group_spec files_spec sample_spec steps_spec views_spec model_spec}; do
  [ -f spec/$s.lua ] || continue
  timeout ${SPEC_S:-150} lua5.4 /opt/lua/usr/bin/busted -o TAP spec/$s.lua > $OUT/$s.tap 2>&1
  echo "$s rc=$?: $(grep -c '^ok' $OUT/$s.tap) ok, $(grep -c '^not ok' $OUT/$s.tap) not ok, $(grep -c '# SKIP\|# skip' $OUT/$s.tap) skip"
  grep -A3 '^not ok' $OUT/$s.tap | head -24
done
