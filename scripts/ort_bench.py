"""ort_bench.py — ONNX Runtime's CPU provider from Python (the GPU machine's
onnxruntime) as scripts/bench_nets.lua's peer where node's onnxruntime-node
is not installed; the same arguments and output as scripts/ort_bench.js:
runs model.onnx on one float32 input read raw from x.bin, prints
"p50 MS p99 MS" over RUNS runs after 3 warm-ups (each run timed alone), and
writes the output's float32 values raw to out.bin. THREADS 0: ONNX Runtime's
default.

    python3 scripts/ort_bench.py model.onnx x.bin 1,3,224,224 RUNS THREADS out.bin
"""
import math
import sys
import time


def main():
    import numpy as np
    import onnxruntime as ort
    model, xbin, dims, runs, threads, outbin = sys.argv[1:7]
    opts = ort.SessionOptions()
    if int(threads) > 0:
        opts.intra_op_num_threads = int(threads)
        opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    x = np.fromfile(xbin, dtype=np.float32).reshape([int(d) for d in dims.split(",")])
    feeds = {sess.get_inputs()[0].name: x}
    for _ in range(3):
        out = sess.run(None, feeds)
    times = []
    for _ in range(int(runs)):
        t0 = time.perf_counter()
        out = sess.run(None, feeds)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()

    def pick(p):
        return times[max(0, min(len(times) - 1, math.ceil(p * len(times)) - 1))]

    np.asarray(out[0], dtype=np.float32).tofile(outbin)
    print("p50 %.3f p99 %.3f" % (pick(0.5), pick(0.99)))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # as ort_bench.js: a line on stderr, status 1
        sys.stderr.write("ort_bench: %s\n" % e)
        sys.exit(1)
