#!/usr/bin/env python3
"""nets_onnx.py: ResNet-18, the DQN policy or the policy MLP of scripts/nets.lua as an ONNX
file, on the weights of a safetensors file (scripts/bench_nets.lua --save),
for ONNX Runtime as a peer (scripts/ort_bench.js). Debian's python3-onnx and
numpy only.

    /usr/bin/python3 scripts/nets_onnx.py --net resnet18|dqn|mlp --weights W.safetensors --out net.onnx
"""
import argparse
import json
import struct

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.float32).reshape(info["shape"])
    return out


class Graph:
    def __init__(self, w):
        self.w, self.nodes, self.inits, self.n = w, [], {}, 0

    def init(self, name):
        if name not in self.inits:
            self.inits[name] = numpy_helper.from_array(self.w[name], name)
        return name

    def op(self, kind, inputs, **attrs):
        self.n += 1
        out = "t%d" % self.n
        self.nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def conv(self, x, name, stride, pad, bias=False):
        k = self.w[name + ".weight"].shape[2]
        ins = [x, self.init(name + ".weight")] + ([self.init(name + ".bias")] if bias else [])
        return self.op("Conv", ins, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)

    def bn(self, x, name):
        return self.op("BatchNormalization", [x] + [self.init(name + s) for s in
                       (".weight", ".bias", ".running_mean", ".running_var")], epsilon=1e-5)

    def linear(self, x, name):
        return self.op("Gemm", [x, self.init(name + ".weight"), self.init(name + ".bias")], transB=1)


def resnet18(g):
    h = g.op("Relu", [g.bn(g.conv("x", "conv1", 2, 3), "bn1")])
    h = g.op("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for stage in range(1, 5):
        for blk in range(2):
            name = "layer%d.%d" % (stage, blk)
            s = 2 if stage > 1 and blk == 0 else 1
            y = g.op("Relu", [g.bn(g.conv(h, name + ".conv1", s, 1), name + ".bn1")])
            y = g.bn(g.conv(y, name + ".conv2", 1, 1), name + ".bn2")
            skip = h
            if name + ".downsample.0.weight" in g.w:
                skip = g.bn(g.conv(h, name + ".downsample.0", s, 0), name + ".downsample.1")
            h = g.op("Relu", [g.op("Add", [y, skip])])
    return g.linear(g.op("Flatten", [g.op("GlobalAveragePool", [h])], axis=1), "fc")


def dqn(g):
    h = g.op("Relu", [g.conv("x", "conv1", 4, 0, True)])
    h = g.op("Relu", [g.conv(h, "conv2", 2, 0, True)])
    h = g.op("Relu", [g.conv(h, "conv3", 1, 0, True)])
    h = g.op("Relu", [g.linear(g.op("Flatten", [h], axis=1), "fc1")])
    return g.linear(h, "fc2")


def mlp(g):
    h = g.op("Relu", [g.linear("x", "fc1")])
    h = g.op("Relu", [g.linear(h, "fc2")])
    return g.linear(h, "fc3")


NETS = {"resnet18": (resnet18, "fc.weight"), "dqn": (dqn, "fc2.weight"), "mlp": (mlp, "fc3.weight")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", required=True, choices=sorted(NETS))
    ap.add_argument("--weights", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    w = load(a.weights)
    g = Graph(w)
    build, last = NETS[a.net]
    y = build(g)
    x = w["input.x"]
    classes = w[last].shape[0]
    graph = helper.make_graph(
        g.nodes, a.net, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info(y, TensorProto.FLOAT, [x.shape[0], classes])], list(g.inits.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    onnx.save(model, a.out)


if __name__ == "__main__":
    main()
