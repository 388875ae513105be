"""mlp_peer.py — the peer of scripts/bench_mlp.lua: the same MLP in ONNX Runtime.

    python3 scripts/mlp_peer.py WEIGHTS RUNS

WEIGHTS is the file bench_mlp.lua writes: per layer a line "fan_in fan_out",
a line of the weights [fan_in, fan_out] row-major, a line of the biases. The
network (MatMul, Add, Relu between layers) is built with onnx.helper and run
on the CPU provider with one intra-op thread, the same input and output arrays
every time (io_binding), each run timed alone. Prints
"p50 X p99 Y max Z first F" (microseconds; F is output element 0, to compare
with moonkaas's), or why it cannot run.
"""
import sys
import time


def main():
    try:
        import numpy as np
        import onnx
        from onnx import TensorProto, helper
        import onnxruntime as ort
    except ImportError as e:
        print("cannot run: %s" % e)
        return 1
    path, runs = sys.argv[1], int(sys.argv[2])
    lines = open(path).read().split("\n")
    layers = []
    for i in range(0, len(lines) - 2, 3):
        if not lines[i].strip():
            break
        fan_in, fan_out = map(int, lines[i].split())
        w = np.array(lines[i + 1].split(), dtype=np.float32).reshape(fan_in, fan_out)
        b = np.array(lines[i + 2].split(), dtype=np.float32).reshape(1, fan_out)
        layers.append((w, b))
    nodes, inits, x = [], [], "obs"
    for l, (w, b) in enumerate(layers):
        inits += [helper.make_tensor("w%d" % l, TensorProto.FLOAT, w.shape, w.flatten()),
                  helper.make_tensor("b%d" % l, TensorProto.FLOAT, b.shape, b.flatten())]
        nodes += [helper.make_node("MatMul", [x, "w%d" % l], ["m%d" % l]),
                  helper.make_node("Add", ["m%d" % l, "b%d" % l], ["a%d" % l])]
        x = "a%d" % l
        if l < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [x], ["r%d" % l]))
            x = "r%d" % l
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, [1, layers[0][0].shape[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, layers[-1][0].shape[1]])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # what onnxruntime releases read: onnx may write a newer one
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    obs = np.array([[np.sin(j) for j in range(1, layers[0][0].shape[0] + 1)]], dtype=np.float32)
    out = np.zeros((1, layers[-1][0].shape[1]), dtype=np.float32)
    binding = sess.io_binding()
    binding.bind_cpu_input("obs", obs)
    binding.bind_output(x, "cpu", 0, np.float32, out.shape, out.ctypes.data)
    for _ in range(1000):
        sess.run_with_iobinding(binding)
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run_with_iobinding(binding)
        t.append((time.perf_counter() - t0) * 1e6)
    t.sort()
    n = len(t)
    print("p50 %.3f p99 %.3f max %.1f first %.6f" % (t[(n - 1) // 2], t[min(n - 1, int(0.99 * n + 0.999) - 1)],
                                                     t[-1], float(out[0, 0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
