--[[
scripts/nets.lua: the reference networks as moonkaas.nn graphs, shared by
spec/nets_spec.lua, scripts/bench_nets.lua and scripts/torch_nets.py's
comparison. Weights are named as PyTorch's state_dict names them (conv1.weight,
layer1.0.bn1.running_mean, h.0.attn.wq, ...), so one safetensors file feeds
both sides.

Each builder takes P(name, shape, kind) -> node, called once per weight, kind
one of "w" (a product's weight, fan-in its shape[2..]), "b" (a bias), "bn_w",
"bn_b", "mean", "var", "ln_w", "ln_b", "emb"; and returns the input node(s)
and the output.

    local nets = dofile("scripts/nets.lua")
    local x, y = nets.resnet18(mk, P, {width = 64, res = 224, classes = 1000})
]]

local N = {}

local function bn(nn, P, x, name, c)
    return nn.batch_norm(x, P(name .. ".running_mean", { c }, "mean"), P(name .. ".running_var", { c }, "var"),
        P(name .. ".weight", { c }, "bn_w"), P(name .. ".bias", { c }, "bn_b"), 1e-5)
end

local function conv(nn, P, x, name, cin, cout, k, opts, bias)
    return nn.conv2d(x, P(name .. ".weight", { cout, cin, k, k }, "w"),
        bias and P(name .. ".bias", { cout }, "b") or nil, opts)
end

-- the small CNN: x [B, 3, S, S] -> conv 3x3 8, bn, relu, maxpool 2 -> conv 3x3
-- 16, bn, relu, maxpool 2 -> flatten -> linear classes
function N.cnn(mk, P, o)
    local nn = require "moonkaas.nn"
    local B, S, classes = o.batch or 2, o.res or 12, o.classes or 10
    local x = mk.input("x", "float32", { B, 3, S, S })
    local h = conv(nn, P, x, "conv1", 3, 8, 3, { padding = 1 }, true)
    h = nn.max_pool2d(bn(nn, P, h, "bn1", 8):relu(), 2)
    h = conv(nn, P, h, "conv2", 8, 16, 3, { padding = 1 }, true)
    h = nn.max_pool2d(bn(nn, P, h, "bn2", 16):relu(), 2)
    local f = 16 * (S // 4) * (S // 4)
    h = h:reshape { B, f }
    return x, nn.linear(h, P("fc.weight", { classes, f }, "w"), P("fc.bias", { classes }, "b"))
end

-- ResNet-18 (torchvision's layout and names): 7x7/2 stem, 3x3/2 max pool, four
-- stages of two basic blocks (widths w, 2w, 4w, 8w; stages 2-4 start with
-- stride 2 and a 1x1 downsample), global average pool, fc
function N.resnet18(mk, P, o)
    local nn = require "moonkaas.nn"
    local B, S, w, classes = o.batch or 1, o.res or 224, o.width or 64, o.classes or 1000
    local x = mk.input("x", "float32", { B, 3, S, S })
    local h = conv(nn, P, x, "conv1", 3, w, 7, { stride = 2, padding = 3 })
    h = bn(nn, P, h, "bn1", w):relu()
    h = nn.max_pool2d(h, 3, { stride = 2, padding = 1 })
    local cin = w
    for stage = 1, 4 do
        local cout = w * 2 ^ (stage - 1) // 1
        for blk = 0, 1 do
            local name = string.format("layer%d.%d", stage, blk)
            local stride = (stage > 1 and blk == 0) and 2 or 1
            local y = conv(nn, P, h, name .. ".conv1", cin, cout, 3, { stride = stride, padding = 1 })
            y = bn(nn, P, y, name .. ".bn1", cout):relu()
            y = conv(nn, P, y, name .. ".conv2", cout, cout, 3, { padding = 1 })
            y = bn(nn, P, y, name .. ".bn2", cout)
            local skip = h
            if stride ~= 1 or cin ~= cout then
                skip = conv(nn, P, h, name .. ".downsample.0", cin, cout, 1, { stride = stride })
                skip = bn(nn, P, skip, name .. ".downsample.1", cout)
            end
            h = (y + skip):relu()
            cin = cout
        end
    end
    h = nn.adaptive_avg_pool2d(h, 1):reshape { B, cin }
    return x, nn.linear(h, P("fc.weight", { classes, cin }, "w"), P("fc.bias", { classes }, "b"))
end

-- the Atari DQN policy (Mnih et al. 2015): x [B, 4, 84, 84] -> conv 8x8/4 32,
-- relu -> conv 4x4/2 64, relu -> conv 3x3/1 64, relu -> 512, relu -> actions
function N.dqn(mk, P, o)
    local nn = require "moonkaas.nn"
    local B, actions = o.batch or 1, o.actions or 18
    local x = mk.input("x", "float32", { B, 4, 84, 84 })
    local h = conv(nn, P, x, "conv1", 4, 32, 8, { stride = 4 }, true):relu()
    h = conv(nn, P, h, "conv2", 32, 64, 4, { stride = 2 }, true):relu()
    h = conv(nn, P, h, "conv3", 64, 64, 3, { stride = 1 }, true):relu()
    h = h:reshape { B, 64 * 7 * 7 }
    h = nn.linear(h, P("fc1.weight", { 512, 3136 }, "w"), P("fc1.bias", { 512 }, "b")):relu()
    return x, nn.linear(h, P("fc2.weight", { actions, 512 }, "w"), P("fc2.bias", { actions }, "b"))
end

-- the policy MLP of scripts/bench_mlp.lua: x [B, 64] -> 256, relu -> 256,
-- relu -> 8 (PyTorch's nn.Linear weights [out, in])
function N.mlp(mk, P, o)
    local nn = require "moonkaas.nn"
    local B = o.batch or 1
    local x = mk.input("x", "float32", { B, 64 })
    local h = nn.linear(x, P("fc1.weight", { 256, 64 }, "w"), P("fc1.bias", { 256 }, "b")):relu()
    h = nn.linear(h, P("fc2.weight", { 256, 256 }, "w"), P("fc2.bias", { 256 }, "b")):relu()
    return x, nn.linear(h, P("fc3.weight", { 8, 256 }, "w"), P("fc3.bias", { 8 }, "b"))
end

-- a GPT-2 block stack over ids [T] (positions 0..T-1, no cache): token and
-- position embeddings, per layer x += attn(ln_1 x) (causal), x += proj(gelu
-- (fc(ln_2 x))) with GELU's erf form, then ln_f and logits through the token
-- embedding (tied): [T, vocab]. o {layers, d, heads, vocab, ctx, T}
function N.gpt2(mk, P, o)
    local nn = require "moonkaas.nn"
    local L, D, H, V, C, T = o.layers, o.d, o.heads, o.vocab, o.ctx, o.T
    local ids = mk.input("ids", "int64", { T })
    local wte = P("wte.weight", { V, D }, "emb")
    local x = nn.embedding(ids, wte) + P("wpe.weight", { C, D }, "emb"):slice(0, T)
    for l = 0, L - 1 do
        local pre = "h." .. l .. "."
        local function ln(name, v)
            return nn.layer_norm(v, P(pre .. name .. ".weight", { D }, "ln_w"), P(pre .. name .. ".bias", { D }, "ln_b"),
                1e-5)
        end
        local p = {}
        for _, k in ipairs { "q", "k", "v", "o" } do
            p["w" .. k] = P(pre .. "attn.w" .. k, { D, D }, "w")
            p["b" .. k] = P(pre .. "attn.b" .. k, { D }, "b")
        end
        x = x + nn.multi_head_attention(ln("ln_1", x), p, H, { causal = true })
        local m = nn.linear(ln("ln_2", x), P(pre .. "mlp.fc.weight", { 4 * D, D }, "w"),
            P(pre .. "mlp.fc.bias", { 4 * D }, "b"))
        x = x + nn.linear(nn.gelu(m), P(pre .. "mlp.proj.weight", { D, 4 * D }, "w"),
            P(pre .. "mlp.proj.bias", { D }, "b"))
    end
    x = nn.layer_norm(x, P("ln_f.weight", { D }, "ln_w"), P("ln_f.bias", { D }, "ln_b"), 1e-5)
    return ids, nn.linear(x, wte)
end

-- the same stack decoding one token per evaluation with key/value caches
-- (BufferTensors [S, D] per layer, row pos written, the attention over the
-- first pos1 = pos + 1 rows): inputs token, pos, pos1 int64 [1]; outputs the
-- logits [1, vocab] and their argmax int64 [1]. o as gpt2's, S = o.positions
-- or o.ctx. Compiled with next = {token = argmax, pos = 1, pos1 = 1},
-- m:run_steps(n) decodes n tokens greedily.
function N.gpt2_decode(mk, P, o)
    local nn = require "moonkaas.nn"
    local L, D, H, V, C = o.layers, o.d, o.heads, o.vocab, o.ctx
    local S, hd = o.positions or C, D // H
    local token = mk.input("token", "int64", { 1 })
    local pos = mk.input("pos", "int64", { 1 })
    local pos1 = mk.input("pos1", "int64", { 1 })
    local wte = P("wte.weight", { V, D }, "emb")
    local x = nn.embedding(token, wte) + nn.embedding(pos, P("wpe.weight", { C, D }, "emb")) -- [1, D]
    for l = 0, L - 1 do
        local pre = "h." .. l .. "."
        local function ln(name, v)
            return nn.layer_norm(v, P(pre .. name .. ".weight", { D }, "ln_w"), P(pre .. name .. ".bias", { D }, "ln_b"),
                1e-5)
        end
        local function lin(v, k)
            return nn.linear(v, P(pre .. "attn.w" .. k, { D, D }, "w"), P(pre .. "attn.b" .. k, { D }, "b"))
        end
        local n1 = ln("ln_1", x)
        local q = lin(n1, "q") * (1 / math.sqrt(hd))
        local kc = mk.buffer("float32", { S, D }, "l" .. l .. "_k_cache"):replace(lin(n1, "k"), pos, pos1)
        local vc = mk.buffer("float32", { S, D }, "l" .. l .. "_v_cache"):replace(lin(n1, "v"), pos, pos1)
        local kt = kc:reshape({ S, H, hd }):permute({ 1, 2, 0 })   -- [H, hd, S]
        local vt = vc:reshape({ S, H, hd }):permute({ 1, 0, 2 })   -- [H, S, hd]
        local att = q:reshape({ H, 1, hd }):matmul(kt):sliced_softmax(pos1) -- [H, 1, S]
        x = x + lin(att:matmul_prefix(vt, pos1):reshape({ 1, D }), "o")
        local m = nn.linear(ln("ln_2", x), P(pre .. "mlp.fc.weight", { 4 * D, D }, "w"),
            P(pre .. "mlp.fc.bias", { 4 * D }, "b"))
        x = x + nn.linear(nn.gelu(m), P(pre .. "mlp.proj.weight", { D, 4 * D }, "w"),
            P(pre .. "mlp.proj.bias", { D }, "b"))
    end
    x = nn.layer_norm(x, P("ln_f.weight", { D }, "ln_w"), P("ln_f.bias", { D }, "ln_b"), 1e-5)
    local logits = nn.linear(x, wte)
    return { token = token, pos = pos, pos1 = pos1 }, logits, logits:argmax():reshape({ 1 })
end

N.GPT2_SMALL = { layers = 12, d = 768, heads = 12, vocab = 50257, ctx = 1024 }

-- a value of kind for a weight of shape: uniform, scaled so activations stay O(1)
function N.value(kind, shape, u) -- u uniform in [-1, 1)
    if kind == "w" then
        local fan = 1
        for i = 2, #shape do fan = fan * shape[i] end
        return u * math.sqrt(3 / fan)
    elseif kind == "var" then
        return 0.5 + 0.5 * (u + 1)
    elseif kind == "bn_w" or kind == "ln_w" then
        return 1 + 0.25 * u
    elseif kind == "emb" then
        return 0.5 * u
    end
    return 0.1 * u -- b, bn_b, ln_b, mean
end

-- P for big networks: each weight a random block of 4096 float32 values
-- repeated to its size (string.rep), seeded by math.random; fast enough for
-- GPT-2 small's 124M values. A name asked for again (a second graph of the
-- same network: GPT-2's prompt and decode step) is the same weight. Returns
-- P and the tensors by name.
function N.fast_weights(mk)
    local tensors, nodes = {}, {}
    local function P(name, shape, kind)
        if nodes[name] then
            assert(table.concat(tensors[name].shape, ",") == table.concat(shape, ","),
                name .. " asked for with another shape")
            return nodes[name]
        end
        local n = 1
        for _, d in ipairs(shape) do n = n * d end
        local m = math.min(n, 4096)
        local vals = {}
        for i = 1, m do vals[i] = N.value(kind, shape, 2 * math.random() - 1) end
        local block = string.pack(string.rep("f", m), table.unpack(vals))
        local bytes = string.rep(block, (n + m - 1) // m):sub(1, 4 * n)
        local t = mk.from_bytes(bytes, "float32", shape)
        tensors[name] = t
        nodes[name] = mk.constant(t, (name:gsub("%.", "_")))
        return nodes[name]
    end
    return P, tensors
end

return N
