#!/usr/bin/env python3
"""torch_nets.py: the networks of scripts/nets.lua in PyTorch, on the same
safetensors weights (scripts/bench_nets.lua --save), for a peer's latency and
a check of moonkaas's outputs (bench_nets.lua --out).

    python3 scripts/torch_nets.py --net resnet18|dqn|gpt2 --weights W.safetensors
        [--compare MK.safetensors] [--devices cpu,cuda] [--runs N] [--tokens N]
        [--out TORCH.safetensors] [--no-compile]

ResNet-18 is built from torch.nn (no torchvision), named as torchvision's
state_dict; the DQN policy and the GPT-2 stack (GELU's erf form, causal
attention, tied embedding) likewise as nets.lua names them. Per device it
runs eager and torch.compile (mode "reduce-overhead": CUDA graphs on CUDA)
and prints p50 / p99 latency (ms) or, for gpt2, greedy decode tok/s with a
static KV cache. TF32 is off, so float32 is float32. --compare prints
max |mk - torch| / max |torch| for every "<device>.y" of the moonkaas file
(<= 1e-4 expected; exit 1 otherwise) and how many greedy tokens agree.
The safetensors files are read and written here with json and torch only.
"""
import argparse
import json
import math
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

DTYPES = {"F32": torch.float32, "I64": torch.int64, "F16": torch.float16}
CODES = {torch.float32: "F32", torch.int64: "I64"}


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        out[name] = torch.frombuffer(bytearray(data[a:b]), dtype=dtype).reshape(info["shape"]) \
            if b > a else torch.empty(info["shape"], dtype=dtype)
    return out


def save_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        raw = bytes(t.reshape(-1).view(torch.uint8).tolist())  # outputs only: small
        header[name] = {"dtype": CODES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---- the networks ---------------------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    def __init__(self, width=64, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        cin = width
        for stage in range(1, 5):
            cout = width * 2 ** (stage - 1)
            stride = 1 if stage == 1 else 2
            setattr(self, "layer%d" % stage, nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        for stage in range(1, 5):
            x = getattr(self, "layer%d" % stage)(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class DQN(nn.Module):
    def __init__(self, actions=18):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 32, 8, 4)
        self.conv2 = nn.Conv2d(32, 64, 4, 2)
        self.conv3 = nn.Conv2d(64, 64, 3, 1)
        self.fc1 = nn.Linear(3136, 512)
        self.fc2 = nn.Linear(512, actions)

    def forward(self, x):
        x = F.relu(self.conv3(F.relu(self.conv2(F.relu(self.conv1(x))))))
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


class Attn(nn.Module):
    def __init__(self, d):
        super().__init__()
        for k in "qkvo":
            setattr(self, "w" + k, nn.Parameter(torch.empty(d, d)))
            setattr(self, "b" + k, nn.Parameter(torch.empty(d)))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attn(d)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Module()
        self.mlp.fc = nn.Linear(d, 4 * d)
        self.mlp.proj = nn.Linear(4 * d, d)

    def mlp_forward(self, x):
        return self.mlp.proj(F.gelu(self.mlp.fc(self.ln_2(x))))


class GPT2(nn.Module):
    def __init__(self, layers=12, d=768, heads=12, vocab=50257, ctx=1024):
        super().__init__()
        self.heads, self.d = heads, d
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.h = nn.ModuleList(Block(d) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, ids):  # ids [T] -> logits [T, vocab]
        T, H, d = ids.shape[0], self.heads, self.d
        x = self.wte(ids) + self.wpe.weight[:T]
        for b in self.h:
            a, n = b.attn, b.ln_1(x)
            q, k, v = (F.linear(n, getattr(a, "w" + c), getattr(a, "b" + c)).view(T, H, d // H).transpose(0, 1)
                       for c in "qkv")
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, d)
            x = x + F.linear(o, a.wo, a.bo)
            x = x + b.mlp_forward(x)
        return F.linear(self.ln_f(x), self.wte.weight)

    def step(self, token, pos, kc, vc):  # one token [1], pos [1] int64; caches [L, S, d] written in place
        H, d, S = self.heads, self.d, kc.shape[1]
        x = self.wte(token) + self.wpe(pos)
        mask = torch.arange(S, device=x.device) <= pos  # [S]
        for l, b in enumerate(self.h):
            a, n = b.attn, b.ln_1(x)
            q, k, v = (F.linear(n, getattr(a, "w" + c), getattr(a, "b" + c)) for c in "qkv")
            kc[l].index_copy_(0, pos, k)
            vc[l].index_copy_(0, pos, v)
            qh = q.view(H, 1, d // H)
            kh, vh = kc[l].view(S, H, d // H).transpose(0, 1), vc[l].view(S, H, d // H).transpose(0, 1)
            s = (qh @ kh.transpose(1, 2)) / math.sqrt(d // H)
            s = s.masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + F.linear((s @ vh).transpose(0, 1).reshape(1, d), a.wo, a.bo)
            x = x + b.mlp_forward(x)
        return F.linear(self.ln_f(x), self.wte.weight).argmax(-1)


def build(net, w):
    if net == "resnet18":
        m = ResNet18(w["conv1.weight"].shape[0], w["fc.weight"].shape[0])
    elif net == "dqn":
        m = DQN(w["fc2.weight"].shape[0])
    else:
        layers = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("h."))
        V, d = w["wte.weight"].shape
        m = GPT2(layers, d, 12 if d == 768 else max(1, d // 8), V, w["wpe.weight"].shape[0])
    state = {k: v for k, v in w.items() if not k.startswith("input.")}
    missing, unexpected = m.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("num_batches_tracked")]
    if missing or unexpected:
        sys.exit("torch_nets: weights do not match the network: missing %s, unexpected %s" % (missing, unexpected))
    return m.eval()


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def latency(fn, dev, runs):
    for _ in range(3):
        fn()
    sync(dev)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", required=True, choices=["resnet18", "dqn", "gpt2"])
    ap.add_argument("--weights", required=True)
    ap.add_argument("--compare")
    ap.add_argument("--out")
    ap.add_argument("--devices", default="cpu,cuda")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    w = load_safetensors(a.weights)
    results, failed = {}, False
    for dev in a.devices.split(","):
        if dev == "cuda" and not torch.cuda.is_available():
            print("cuda: skipped (no CUDA device)")
            continue
        m = build(a.net, w).to(dev)
        with torch.no_grad():
            if a.net == "gpt2":
                ids = w["input.ids"].to(dev)
                results[dev + ".y"] = m(ids).cpu()
                S = min(m.wpe.weight.shape[0], a.tokens + 1)
                L, d = len(m.h), m.d
                kc = torch.zeros(L, S, d, device=dev)
                vc = torch.zeros(L, S, d, device=dev)
                for mode in ["eager"] + ([] if a.no_compile else ["compile"]):
                    step = m.step if mode == "eager" else torch.compile(m.step, mode="reduce-overhead")
                    first = ids[-1:].clone()

                    def decode():
                        tok, toks = first, []
                        for p in range(a.tokens):
                            tok = step(tok, torch.tensor([p], device=dev), kc, vc).clone()
                            toks.append(tok)
                        return torch.cat(toks)

                    toks = decode()
                    sync(dev)
                    t0 = time.perf_counter()
                    toks = decode()
                    sync(dev)
                    dt = time.perf_counter() - t0
                    results[dev + ".tokens"] = toks.cpu()
                    print("gpt2 torch %s %s: decode %.1f tok/s (%d tokens)" % (dev, mode, a.tokens / dt, a.tokens))
            else:
                x = w["input.x"].to(dev)
                results[dev + ".y"] = m(x).cpu()
                for mode in ["eager"] + ([] if a.no_compile else ["compile"]):
                    f = m if mode == "eager" else torch.compile(m, mode="reduce-overhead")
                    p50, p99 = latency(lambda: f(x), dev, a.runs)
                    print("%s torch %s %s: p50 %.2f ms, p99 %.2f ms over %d runs" % (a.net, dev, mode, p50, p99, a.runs))
    if a.out:
        save_safetensors(a.out, results)
    if a.compare:
        mk = load_safetensors(a.compare)
        ref = results.get("cpu.y", results.get("cuda.y"))
        for name, t in sorted(mk.items()):
            if name.endswith(".y"):
                want = results.get(name, ref)
                err = (t - want).abs().max().item() / want.abs().max().item()
                ok = err <= 1e-4
                failed = failed or not ok
                print("compare %s: max |mk - torch| / max |torch| = %.3g %s" % (name, err, "ok" if ok else "FAILED"))
            elif name.endswith(".tokens"):
                want = results.get(name, results.get("cpu.tokens", results.get("cuda.tokens")))
                if want is not None:
                    n = len(want)
                    same = 0
                    while same < n and int(t[same]) == int(want[same]):
                        same += 1
                    print("compare %s: the first %d of %d greedy tokens agree" % (name, same, n))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
