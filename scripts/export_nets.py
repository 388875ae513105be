"""export_nets.py — small reference networks exported to ONNX, with ONNX
Runtime's outputs, for spec/onnx_nets_spec.lua (moonkaas issue 65, item 5).

    python3 scripts/export_nets.py DIR [--seed S] [--only name,name]

Needs PyTorch and onnxruntime (onnxruntime-gpu for the CUDA provider): run it
on the GPU machine, then

    MK_ONNX_NETS=DIR MK_BUILD=build lua5.4 /usr/bin/busted spec/onnx_nets_spec.lua

For each network NAME it writes into DIR:

    NAME.onnx                   torch.onnx.export, opset 17, eval mode
    NAME.inputs.safetensors     the random inputs (float32; int64 token ids)
    NAME.ort_cpu.safetensors    ONNX Runtime's outputs, CPUExecutionProvider
    NAME.ort_cuda.safetensors   the same with CUDAExecutionProvider (where it loads)

and prints each provider's max relative difference from the other. The
networks, all in torch.nn without torchvision, at tiny sizes:

    cnn       Conv-BatchNorm-ReLU-MaxPool twice, global average pool, Linear
    resnet18  ResNet-18 (BasicBlock, [2, 2, 2, 2]) at width 16, on 1x3x64x64
    gpt2      a GPT-2 block stack (2 layers, d 64, 4 heads, vocab 97, T 12),
              causal mask, tanh GELU, tied head
    mlp       an MLP policy: a softmax over actions and a value
    lstm      a 1-layer LSTM over 7 steps and a Linear (ONNX's LSTM op)
"""
import argparse
import json
import math
import os
import struct
import sys


def save_safetensors(path, tensors):
    """A safetensors file of {name: numpy array}, written with numpy alone."""
    import numpy as np
    DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64",
              np.dtype(np.float16): "F16", np.dtype(np.int8): "I8", np.dtype(np.bool_): "BOOL"}
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        if a.dtype not in DTYPES:
            a = a.astype(np.float32)
        b = a.tobytes()
        header[name] = {"dtype": DTYPES[a.dtype], "shape": list(a.shape),
                        "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def build(torch):
    nn = torch.nn
    F = nn.functional

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
            self.c2, self.b2 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
            self.fc = nn.Linear(16, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
            x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2, padding=1)
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self, width=16, classes=10):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False),
                                      nn.BatchNorm2d(width), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            layers, cin = [], width
            for i, n in enumerate([2, 2, 2, 2]):
                cout = width * 2 ** i
                for j in range(n):
                    layers.append(Block(cin, cout, 2 if j == 0 and i > 0 else 1))
                    cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class Attention(nn.Module):
        def __init__(self, d, heads, t):
            super().__init__()
            self.h = heads
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.register_buffer("mask", torch.tril(torch.ones(t, t, dtype=torch.bool)))

        def forward(self, x):
            B, T, D = x.shape
            q, k, v = self.qkv(x).split(D, dim=2)
            q, k, v = (z.view(B, T, self.h, D // self.h).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(D // self.h)
            att = att.masked_fill(~self.mask[:T, :T], float("-inf")).softmax(-1)
            return self.proj((att @ v).transpose(1, 2).reshape(B, T, D))

    class GPTBlock(nn.Module):
        def __init__(self, d, heads, t):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.att = Attention(d, heads, t)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            x = x + self.att(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        def __init__(self, vocab=97, d=64, heads=4, layers=2, t=12):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(t, d)
            self.blocks = nn.Sequential(*[GPTBlock(d, heads, t) for _ in range(layers)])
            self.ln = nn.LayerNorm(d)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.blocks(self.wte(ids) + self.wpe(pos))
            return self.ln(x) @ self.wte.weight.t()

    class MLPPolicy(nn.Module):
        def __init__(self, obs=24, hidden=64, actions=6):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(obs, hidden), nn.Tanh(),
                                      nn.Linear(hidden, hidden), nn.Tanh())
            self.pi, self.v = nn.Linear(hidden, actions), nn.Linear(hidden, 1)

        def forward(self, obs):
            h = self.body(obs)
            return self.pi(h).softmax(-1), self.v(h)

    class LSTMNet(nn.Module):
        def __init__(self, inp=10, hidden=16, out=4):
            super().__init__()
            self.lstm, self.fc = nn.LSTM(inp, hidden, batch_first=True), nn.Linear(hidden, out)

        def forward(self, x):
            y, _ = self.lstm(x)
            return self.fc(y)

    g = torch.Generator().manual_seed(0)
    return {
        "cnn": (CNN(), {"x": torch.randn(2, 3, 16, 16, generator=g)}, ["logits"]),
        "resnet18": (ResNet18(), {"x": torch.randn(1, 3, 64, 64, generator=g)}, ["logits"]),
        "gpt2": (GPT2(), {"ids": torch.randint(0, 97, (2, 12), generator=g)}, ["logits"]),
        "mlp": (MLPPolicy(), {"obs": torch.randn(5, 24, generator=g)}, ["pi", "value"]),
        "lstm": (LSTMNet(), {"x": torch.randn(3, 7, 10, generator=g)}, ["y"]),
    }


def randomize(torch, model):
    """BatchNorm's running statistics away from 0 and 1, so that they matter."""
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)


def rel(a, b):
    import numpy as np
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    import torch
    import onnxruntime as ort
    torch.manual_seed(args.seed)
    os.makedirs(args.dir, exist_ok=True)
    nets = build(torch)
    only = [s for s in args.only.split(",") if s]
    providers = ort.get_available_providers()
    for name, (model, inputs, outputs) in nets.items():
        if only and name not in only:
            continue
        model.eval()
        randomize(torch, model)
        path = os.path.join(args.dir, name + ".onnx")
        kw = dict(opset_version=17, input_names=list(inputs), output_names=outputs,
                  do_constant_folding=True)
        with torch.no_grad():
            try:  # the TorchScript exporter (newer PyTorch defaults to dynamo)
                torch.onnx.export(model, tuple(inputs.values()), path, dynamo=False, **kw)
            except TypeError:
                torch.onnx.export(model, tuple(inputs.values()), path, **kw)
        feeds = {k: v.numpy() for k, v in inputs.items()}
        save_safetensors(os.path.join(args.dir, name + ".inputs.safetensors"), feeds)
        results = {}
        for prov, tag in (("CPUExecutionProvider", "cpu"), ("CUDAExecutionProvider", "cuda")):
            if prov not in providers:
                print(f"{name}: {prov} is not available", file=sys.stderr)
                continue
            sess = ort.InferenceSession(path, providers=[prov])
            outs = sess.run(outputs, feeds)
            results[tag] = dict(zip(outputs, outs))
            save_safetensors(os.path.join(args.dir, f"{name}.ort_{tag}.safetensors"),
                             results[tag])
        line = f"{name}: {os.path.getsize(path)} bytes"
        if len(results) == 2:
            d = max(rel(results["cuda"][o], results["cpu"][o]) for o in outputs)
            line += f", ORT CUDA vs CPU max relative difference {d:.3g}"
        print(line)


if __name__ == "__main__":
    main()
