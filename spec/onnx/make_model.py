"""make_model.py — writes an ONNX file from a JSON description, with onnx.helper.

    python3 spec/onnx/make_model.py description.json out.onnx

The specs (spec/onnx_spec.lua) draw every shape, attribute and value in Lua
from a printed seed and describe the graph as JSON; this script only turns
that description into a ModelProto, so the file is written by ONNX's own
library, not by moonkaas. The description:

    {"opset": 17, "ir_version": 8 (optional),
     "inputs":  [{"name": "x", "type": "FLOAT", "shape": [2, "batch"]}],
     "outputs": [{"name": "y", "type": "FLOAT", "shape": null}],
     "initializers": [{"name": "w", "type": "FLOAT", "shape": [3, 4],
                       "values": [...], "raw": true (optional), "unchecked": true
                       (optional: the values' count not checked against the shape),
                       "external": {"location": "w.bin", "write": true} (optional)}],
     "nodes": [{"op": "Gemm", "inputs": ["x", "w"], "outputs": ["y"], "name": "g",
                "attrs": {"alpha": {"f": 0.5}, "transB": {"i": 1},
                          "perm": {"ints": [1, 0]}, "value": {"t": <initializer>}}}],
     "check": true (optional: onnx.checker on the result)}
"""
import json
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NP = {"FLOAT": np.float32, "INT64": np.int64, "INT32": np.int32, "FLOAT16": np.float16,
      "INT8": np.int8, "DOUBLE": np.float64, "BOOL": np.bool_, "UINT8": np.uint8}


def tensor(d, folder):
    t = getattr(TensorProto, d["type"])
    shape = d["shape"]
    if d.get("external"):
        ext = d["external"]
        p = TensorProto()
        p.name = d["name"]
        p.data_type = t
        p.dims.extend(shape)
        p.data_location = TensorProto.EXTERNAL
        for k in ("location", "offset", "length"):
            if k in ext:
                e = p.external_data.add()
                e.key, e.value = k, str(ext[k])
        if ext.get("write"):
            arr = np.array(d["values"], dtype=NP[d["type"]]).reshape(shape)
            with open(os.path.join(folder, ext["location"]), "wb") as f:
                f.write(b"\0" * int(ext.get("offset", 0)))
                f.write(arr.tobytes())
        return p
    if d.get("raw"):
        arr = np.array(d["values"], dtype=NP[d["type"]]).reshape(shape)
        p = numpy_helper.from_array(arr, d["name"])
        return p
    if d.get("unchecked"):  # the values in their typed field, however many the shape needs
        p = TensorProto()
        p.name, p.data_type = d["name"], t
        p.dims.extend(shape)
        {"FLOAT": p.float_data, "INT64": p.int64_data}.get(d["type"], p.int32_data).extend(d["values"])
        return p
    return helper.make_tensor(d["name"], t, shape, d["values"])


def attr(v, folder):
    (k, x), = v.items()
    if k == "t":
        return tensor(x, folder)
    if k == "f":
        return float(x)
    if k == "floats":
        return [float(e) for e in x]
    return x


def main():
    desc = json.load(open(sys.argv[1]))
    out = sys.argv[2]
    folder = os.path.dirname(os.path.abspath(out))
    nodes = []
    for n in desc["nodes"]:
        attrs = {k: attr(v, folder) for k, v in n.get("attrs", {}).items()}
        nodes.append(helper.make_node(n["op"], n["inputs"], n["outputs"], name=n.get("name"),
                                      **attrs))
    def info(v):
        return helper.make_tensor_value_info(v["name"], getattr(TensorProto, v["type"]),
                                             v.get("shape"))
    graph = helper.make_graph(nodes, "spec", [info(v) for v in desc["inputs"]],
                              [info(v) for v in desc["outputs"]],
                              [tensor(t, folder) for t in desc.get("initializers", [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", desc["opset"])])
    model.ir_version = desc.get("ir_version", 8)
    if desc.get("check"):
        onnx.checker.check_model(model)
    with open(out, "wb") as f:
        f.write(model.SerializeToString())


if __name__ == "__main__":
    main()
