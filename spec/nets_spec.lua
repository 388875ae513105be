-- Reference networks built with moonkaas.nn (scripts/nets.lua) on the CPU,
-- each against spec/nets_ref.lua's double-precision loops on the same
-- float32 weights (random, from the printed seed). The error reported is
-- max |y - ref| / max |ref| over the output; each must be <= 1e-4.
local H = require "spec.helpers"
local mk = H.mk()
local nn = require "moonkaas.nn"
local R = require "spec.nets_ref"
local nets = dofile("scripts/nets.lua")
H.seed("nets_spec")

local function f32(v) return (string.unpack("f", string.pack("f", v))) end

-- random weights: P for the builders, and the same values as ref tensors
local function weights()
    local ref = {}
    local nodes = {}
    local function P(name, shape, kind)
        if nodes[name] then return nodes[name] end -- one weight, several graphs
        local d = {}
        for i = 1, R.numel(shape) do d[i] = f32(nets.value(kind, shape, 2 * math.random() - 1)) end
        ref[name] = { shape = shape, data = d }
        nodes[name] = mk.constant(mk.tensor(d, "float32", shape), (name:gsub("%.", "_")))
        return nodes[name]
    end
    return P, ref
end

local function random_input(shape, scale)
    local d = {}
    for i = 1, R.numel(shape) do d[i] = f32((2 * math.random() - 1) * (scale or 1)) end
    return mk.tensor(d, "float32", shape), { shape = shape, data = d }
end

local function rel_error(t, ref)
    local flat = t:reshape({ R.numel(t.shape) })
    local worst, big = 0, 0
    for i, r in ipairs(ref.data) do
        worst = math.max(worst, math.abs(flat:get(i) - r))
        big = math.max(big, math.abs(r))
    end
    assert(#ref.data == R.numel(t.shape), "element counts differ")
    return worst / big
end

local function report(name, err)
    print(string.format("# nets_spec: %s max relative error %.3g", name, err))
    assert.is_true(err <= 1e-4, name .. ": error " .. err)
end

local function bn(x, W, name)
    return R.batch_norm(x, W[name .. ".running_mean"], W[name .. ".running_var"], W[name .. ".weight"],
        W[name .. ".bias"], 1e-5)
end

describe("reference networks (CPU, float32 against double loops)", function()
    it("a small CNN: conv, batch norm, relu, max pool, linear", function()
        local P, W = weights()
        local x, y = nets.cnn(mk, P, { batch = 2, res = 12, classes = 10 })
        local xt, xr = random_input(x.shape)
        local m = mk.compile(y)
        local out = m:run { x = xt }
        local h = R.conv2d(xr, W["conv1.weight"], W["conv1.bias"], 1, 1)
        h = R.max_pool2d(R.relu(bn(h, W, "bn1")), 2, 2, 0)
        h = R.conv2d(h, W["conv2.weight"], W["conv2.bias"], 1, 1)
        h = R.max_pool2d(R.relu(bn(h, W, "bn2")), 2, 2, 0)
        h.shape = { 2, 16 * 9 }
        report("cnn", rel_error(out, R.linear(h, W["fc.weight"], W["fc.bias"])))
        m:close()
    end)

    local function ref_resnet(xr, W, width)
        local h = R.relu(bn(R.conv2d(xr, W["conv1.weight"], nil, 2, 3), W, "bn1"))
        h = R.max_pool2d(h, 3, 2, 1)
        local cin = width
        for stage = 1, 4 do
            local cout = width * 2 ^ (stage - 1) // 1
            for blk = 0, 1 do
                local name = string.format("layer%d.%d", stage, blk)
                local s = (stage > 1 and blk == 0) and 2 or 1
                local y = R.relu(bn(R.conv2d(h, W[name .. ".conv1.weight"], nil, s, 1), W, name .. ".bn1"))
                y = bn(R.conv2d(y, W[name .. ".conv2.weight"], nil, 1, 1), W, name .. ".bn2")
                local skip = h
                if s ~= 1 or cin ~= cout then
                    skip = bn(R.conv2d(h, W[name .. ".downsample.0.weight"], nil, s, 0), W, name .. ".downsample.1")
                end
                h = R.relu(R.add(y, skip))
                cin = cout
            end
        end
        return R.linear(R.global_avg_pool(h), W["fc.weight"], W["fc.bias"])
    end

    local tiny_stats
    it("a ResNet-18-style network at width 4, 32x32", function()
        local P, W = weights()
        local x, y = nets.resnet18(mk, P, { batch = 1, res = 32, width = 4, classes = 10 })
        local xt, xr = random_input(x.shape)
        local m = mk.compile(y)
        local out = m:run { x = xt }
        tiny_stats = m:stats()
        report("resnet18 tiny", rel_error(out, ref_resnet(xr, W, 4)))
        m:close()
    end)

    it("ResNet-18's real shape (1x3x224x224 -> 1000) compiles and runs once #slow", function()
        local P = nets.fast_weights(mk)
        local x, y = nets.resnet18(mk, P, { batch = 1, res = 224, width = 64, classes = 1000 })
        local m = mk.compile(y)
        local st = m:stats()
        -- the same graph as the tiny network's, only wider and larger
        assert.are.equal(tiny_stats.nodes, st.nodes)
        assert.are.equal(tiny_stats.launches, st.launches)
        local out = m:run { x = random_input(x.shape) }
        assert.are.same({ 1, 1000 }, out.shape)
        for i = 1, 1000 do
            local v = out:get(1, i)
            assert.is_true(v == v and math.abs(v) < 1e30, "logit " .. i .. " is " .. v)
        end
        m:close()
    end)

    local function ref_gpt2(ids, W, o)
        local D, T = o.d, #ids
        local x = R.new({ T, D })
        for t = 1, T do
            for j = 1, D do
                x.data[(t - 1) * D + j] = W["wte.weight"].data[ids[t] * D + j] + W["wpe.weight"].data[(t - 1) * D + j]
            end
        end
        for l = 0, o.layers - 1 do
            local pre = "h." .. l .. "."
            local function ln(name, v) return R.layer_norm(v, W[pre .. name .. ".weight"], W[pre .. name .. ".bias"], 1e-5) end
            local p = {}
            for _, k in ipairs { "q", "k", "v", "o" } do
                p["w" .. k], p["b" .. k] = W[pre .. "attn.w" .. k], W[pre .. "attn.b" .. k]
            end
            x = R.add(x, R.causal_attention(ln("ln_1", x), p, o.heads))
            local m = R.gelu(R.linear(ln("ln_2", x), W[pre .. "mlp.fc.weight"], W[pre .. "mlp.fc.bias"]))
            x = R.add(x, R.linear(m, W[pre .. "mlp.proj.weight"], W[pre .. "mlp.proj.bias"]))
        end
        x = R.layer_norm(x, W["ln_f.weight"], W["ln_f.bias"], 1e-5)
        return R.linear(x, W["wte.weight"])
    end

    it("a GPT-2-style block stack (2 layers, width 32, 4 heads, vocab 64, 8 tokens)", function()
        local o = { layers = 2, d = 32, heads = 4, vocab = 64, ctx = 16, T = 8 }
        local P, W = weights()
        local _, y = nets.gpt2(mk, P, o)
        local ids = {}
        for t = 1, o.T do ids[t] = math.random(0, o.vocab - 1) end
        local m = mk.compile(y)
        local out = m:run { ids = mk.tensor(ids, "int64", { o.T }) }
        report("gpt2 tiny", rel_error(out, ref_gpt2(ids, W, o)))
        m:close()
    end)

    it("the GPT-2 stack decoding with KV caches, token by token, equals the whole-sequence stack", function()
        local o = { layers = 2, d = 32, heads = 4, vocab = 64, ctx = 16, T = 8 }
        local P, W = weights()
        local _, y = nets.gpt2(mk, P, o)
        local _, logits, nxt = nets.gpt2_decode(mk, P, o)
        local ids = {}
        for t = 1, o.T do ids[t] = math.random(0, o.vocab - 1) end
        local whole = mk.compile(y)
        local all = whole:run { ids = mk.tensor(ids, "int64", { o.T }) }
        local want = ref_gpt2(ids, W, o)
        local dec = mk.compile({ logits, nxt })
        local worst, big = 0, 0
        for t = 1, o.T do
            local l, a = dec:run { token = mk.tensor({ ids[t] }, "int64"), pos = mk.tensor({ t - 1 }, "int64"),
                pos1 = mk.tensor({ t }, "int64") }
            local best = 1
            for j = 1, o.vocab do
                local r = want.data[(t - 1) * o.vocab + j]
                worst = math.max(worst, math.abs(l:get(1, j) - r))
                big = math.max(big, math.abs(r))
                assert.is_true(math.abs(l:get(1, j) - all:get(t, j)) <= 1e-5 * (1 + math.abs(r)))
                if l:get(1, j) > l:get(1, best) then best = j end
            end
            assert.are.equal(best - 1, a:get(1))
        end
        report("gpt2 decode (8 steps)", worst / big)
        whole:close()
        dec:close()
    end)

    it("fast_weights gives a name asked for again the same weight (GPT-2's prompt and step graphs)", function()
        local P, tensors = nets.fast_weights(mk)
        local a = P("h.0.attn.wq", { 8, 8 }, "w")
        local first = tensors["h.0.attn.wq"]:get(1, 1)
        assert.are.equal(a, P("h.0.attn.wq", { 8, 8 }, "w"))
        assert.are.equal(first, tensors["h.0.attn.wq"]:get(1, 1))
        assert.has_error(function() P("h.0.attn.wq", { 8, 4 }, "w") end)
    end)

    it("a GPT-2 decoding step is 5 launches a layer: each LayerNorm folded into the products after it", function()
        local function launches(layers)
            local o = { layers = layers, d = 32, heads = 4, vocab = 64, ctx = 16, T = 8 }
            local _, _, nxt = nets.gpt2_decode(mk, weights(), o)
            local m <close> = mk.compile(nxt, { next = { token = nxt, pos = 1, pos1 = 1 } })
            -- a group's comment names its members: "one launch for LayerNormNode $11, ..."
            return m:stats().launches, select(2, m:script():gsub("LayerNormNode %$%d+", ""))
        end
        local one, folded1 = launches(1)
        local three, folded3 = launches(3)
        -- two layers more: 10 launches and 4 LayerNorms more, each a member of a group
        assert.are.equal(10, three - one)
        assert.are.equal(4, folded3 - folded1)
    end)

    it("GPT-2 small's real shape (12 x 768, 12 heads, vocab 50257, ctx 1024) runs 4 tokens #slow", function()
        local o = {}
        for k, v in pairs(nets.GPT2_SMALL) do o[k] = v end
        o.T = 4
        local P = nets.fast_weights(mk)
        local _, y = nets.gpt2(mk, P, o)
        local m = mk.compile(y)
        local out = m:run { ids = mk.tensor({ 50256, 464, 3290, 1110 }, "int64", { 4 }) }
        assert.are.same({ 4, 50257 }, out.shape)
        local flat = out:reshape({ 4 * 50257 })
        for i = 1, 4 * 50257, 997 do
            local v = flat:get(i)
            assert.is_true(v == v and math.abs(v) < 1e30, "logit " .. i .. " is " .. v)
        end
        m:close()
    end)

    -- the recurrence as next rules: h (and c) take the step's result, t counts
    -- the steps and picks x_t out of the whole sequence, a constant
    local function run_cell(kind)
        local S, B, I, Hd = 6, 2, 5, 7
        local gates = kind == "lstm" and 4 or 3
        local P, W = weights()
        local seq_t, seq_r = random_input({ S, B, I })
        local t = mk.input("t", "int64", { 1 })
        local h = mk.input("h", "float32", { B, Hd })
        local x = mk.constant(seq_t):index_select(t, 0):reshape { B, I }
        local wih, whh = P("w_ih", { gates * Hd, I }, "w"), P("w_hh", { gates * Hd, Hd }, "w")
        local bih, bhh = P("b_ih", { gates * Hd }, "b"), P("b_hh", { gates * Hd }, "b")
        local h0t, h0r = random_input({ B, Hd })
        local m, outs, steps
        if kind == "lstm" then
            local c = mk.input("c", "float32", { B, Hd })
            local h2, c2 = nn.lstm_cell(x, h, c, wih, whh, bih, bhh)
            m = mk.compile({ h2, c2 }, { next = { h = h2, c = c2, t = 1 } })
            local c0t, c0r = random_input({ B, Hd })
            outs, steps = m:run_steps(S, { t = mk.tensor({ 0 }, "int64"), h = h0t, c = c0t })
            h0r.c = c0r
        else
            local h2 = nn.gru_cell(x, h, wih, whh, bih, bhh)
            m = mk.compile({ h2 }, { next = { h = h2, t = 1 } })
            outs, steps = m:run_steps(S, { t = mk.tensor({ 0 }, "int64"), h = h0t })
        end
        assert.are.equal(S, steps)
        local hr, cr, worst = h0r, h0r.c, 0
        for s = 1, S do
            local xs = { shape = { B, I }, data = {} }
            for i = 1, B * I do xs.data[i] = seq_r.data[(s - 1) * B * I + i] end
            if kind == "lstm" then
                hr, cr = R.lstm_cell(xs, hr, cr, W.w_ih, W.w_hh, W.b_ih, W.b_hh)
            else
                hr = R.gru_cell(xs, hr, W.w_ih, W.w_hh, W.b_ih, W.b_hh)
            end
            local got = outs[1]:reshape({ S * B * Hd })
            local e, big = 0, 0
            for i = 1, B * Hd do
                e = math.max(e, math.abs(got:get((s - 1) * B * Hd + i) - hr.data[i]))
                big = math.max(big, math.abs(hr.data[i]))
            end
            worst = math.max(worst, e / big)
        end
        m:close()
        return worst
    end

    it("an LSTM cell over 6 steps of run_steps, step by step", function()
        report("lstm (6 steps)", run_cell("lstm"))
    end)

    it("a GRU cell over 6 steps of run_steps, step by step", function()
        report("gru (6 steps)", run_cell("gru"))
    end)

    it("a U-Net-style encoder-decoder: conv, pool, conv_transpose, upsample, concat skips", function()
        local P, W = weights()
        local x = mk.input("x", "float32", { 1, 3, 16, 16 })
        local function c(v, name, cin, cout, k)
            return nn.conv2d(v, P(name .. ".weight", { cout, cin, k, k }, "w"), P(name .. ".bias", { cout }, "b"),
                { padding = k // 2 })
        end
        local e1 = c(x, "enc1", 3, 8, 3):relu()                                   -- [8, 16, 16]
        local e2 = c(nn.max_pool2d(e1, 2), "enc2", 8, 16, 3):relu()              -- [16, 8, 8]
        local mid = c(nn.max_pool2d(e2, 2), "mid", 16, 16, 3):relu()             -- [16, 4, 4]
        local up = nn.conv_transpose2d(mid, P("up.weight", { 16, 16, 2, 2 }, "w"), P("up.bias", { 16 }, "b"),
            { stride = 2 })                                                       -- [16, 8, 8]
        local d2 = c(up:concat(e2, 1), "dec2", 32, 8, 3):relu()                  -- [8, 8, 8]
        local d1 = c(d2:upsample_nearest2d { scale_factor = 2 }:concat(e1, 1), "dec1", 16, 8, 3):relu()
        local y = c(d1, "head", 8, 2, 1)                                          -- [2, 16, 16]
        local xt, xr = random_input(x.shape)
        local m = mk.compile(y)
        local out = m:run { x = xt }
        local function rc(v, name, k) return R.conv2d(v, W[name .. ".weight"], W[name .. ".bias"], 1, k // 2) end
        local r1 = R.relu(rc(xr, "enc1", 3))
        local r2 = R.relu(rc(R.max_pool2d(r1, 2, 2, 0), "enc2", 3))
        local rm = R.relu(rc(R.max_pool2d(r2, 2, 2, 0), "mid", 3))
        local ru = R.conv_transpose2d(rm, W["up.weight"], W["up.bias"], 2, 0)
        local rd2 = R.relu(rc(R.concat1(ru, r2), "dec2", 3))
        local rd1 = R.relu(rc(R.concat1(R.upsample2(rd2, 2), r1), "dec1", 3))
        report("unet", rel_error(out, rc(rd1, "head", 1)))
        m:close()
    end)
end)

-- The same builders on CUDA against the CPU (the op table checks each node;
-- these check the nodes as whole networks compose and group them, at the
-- shapes the GPT-2 benchmark uses too: a width of 768 and 12 heads)
describe("reference networks on CUDA against the CPU", function()
    local gpu_it = H.gpu(it, function(why) pending(why) end)
    local function same(name, y, feeds)
        local cpu <close> = mk.compile(y)
        local gpu <close> = mk.compile(y, { device = "cuda" })
        local want, got = cpu:run(feeds), gpu:run(feeds)
        local flat, worst, big = want:reshape({ R.numel(want.shape) }), 0, 0
        local gflat = got:reshape({ R.numel(got.shape) })
        assert.are.same(want.shape, got.shape)
        for i = 1, R.numel(want.shape) do
            worst = math.max(worst, math.abs(gflat:get(i) - flat:get(i)))
            big = math.max(big, math.abs(flat:get(i)))
        end
        report(name .. " cuda against cpu", worst / big)
    end
    local function ids(n, vocab)
        local t = {}
        for i = 1, n do t[i] = math.random(0, vocab - 1) end
        return mk.tensor(t, "int64", { n })
    end

    gpu_it("a GPT-2-style block stack (2 layers, width 32, 4 heads, 8 tokens)", function()
        local o = { layers = 2, d = 32, heads = 4, vocab = 64, ctx = 16, T = 8 }
        local P = weights()
        local _, y = nets.gpt2(mk, P, o)
        same("gpt2 tiny", y, { ids = ids(o.T, o.vocab) })
    end)

    gpu_it("one GPT-2 small layer (width 768, 12 heads, vocab 50257, 8 tokens)", function()
        local o = { layers = 1, d = 768, heads = 12, vocab = 50257, ctx = 1024, T = 8 }
        local _, y = nets.gpt2(mk, nets.fast_weights(mk), o)
        same("gpt2 768", y, { ids = ids(o.T, o.vocab) })
    end)

    gpu_it("a GPT-2 decoding step at width 768, its LayerNorms in the products' groups", function()
        local o = { layers = 2, d = 768, heads = 12, vocab = 50257, ctx = 1024, positions = 16 }
        local _, logits = nets.gpt2_decode(mk, nets.fast_weights(mk), o)
        same("gpt2 768 step", logits, { token = mk.tensor({ 464 }, "int64"), pos = mk.tensor({ 0 }, "int64"),
            pos1 = mk.tensor({ 1 }, "int64") })
    end)

    gpu_it("a ResNet-18-style network at width 4, 32x32, and the small CNN", function()
        local x, y = nets.resnet18(mk, weights(), { batch = 1, res = 32, width = 4, classes = 10 })
        same("resnet18 tiny", y, { x = random_input(x.shape) })
        x, y = nets.cnn(mk, weights(), { batch = 2, res = 12, classes = 10 })
        same("cnn", y, { x = random_input(x.shape) })
    end)
end)

describe("moonkaas.nn argument errors", function()
    -- "spec/nets_spec.lua:12: ": the caller's line, as Lua names it
    local function here()
        local i = debug.getinfo(2, "Sl")
        return i.short_src .. ":" .. (i.currentline + 1) .. ": "
    end
    local function err(f)
        local ok, e = pcall(f)
        assert.is_false(ok)
        return tostring(e)
    end
    local x = mk.input("x", "float32", { 2, 8 })

    it("names the layer and the user's line", function()
        local at = here()
        local e = err(function() local _ = nn.linear(x, mk.input("w", "float32", { 2, 8, 1 })) end)
        assert.are.equal(at .. "argument error: nn.linear: w must be [out, in], got rank 3", e)
        at = here()
        e = err(function() local _ = nn.linear(x, "w") end)
        assert.are.equal(at .. "argument error: nn.linear: w must be a node or tensor, got string", e)
        at = here()
        e = err(function() local _ = nn.conv2d(mk.input("i", "float32", { 1, 1, 4, 4 }), mk.zeros("float32", { 1, 1, 3, 3 }), nil, { strides = 2 }) end)
        assert.are.equal(at .. "argument error: nn.conv2d: unknown option strides", e)
    end)

    it("checks attention's heads and options", function()
        local p = { wq = mk.zeros("float32", { 8, 8 }), wk = mk.zeros("float32", { 8, 8 }),
            wv = mk.zeros("float32", { 8, 8 }), wo = mk.zeros("float32", { 8, 8 }) }
        assert.truthy(err(function() return nn.multi_head_attention(x, p, 3) end):find(
            "argument error: nn.multi_head_attention: heads (3) must divide the width 8", 1, true))
        assert.truthy(err(function() return nn.multi_head_attention(x, p, 2, { casual = true }) end):find(
            "unknown option casual", 1, true))
        assert.truthy(err(function() return nn.multi_head_attention(mk.input("v", "float32", { 8 }), p, 2) end):find(
            "x must be [T, D] or [B, T, D], got rank 1", 1, true))
        -- the module still builds and runs after them
        local m = mk.compile(nn.multi_head_attention(x, p, 2))
        assert.are.same({ 2, 8 }, m:run({ x = mk.zeros("float32", { 2, 8 }) }).shape)
        m:close()
    end)
end)
