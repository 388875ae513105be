-- ONNX import of the ops networks are made of (core/onnx/onnx_nn.c's rows):
-- random shapes and attributes from a printed seed, files written by ONNX's
-- own Python library (spec/onnx/make_model.py). Each case is checked against
-- the same graph built in Lua (whose ops spec/cases checks against double
-- loops) where one is given, and against ONNX Runtime's CPU provider where
-- node and onnxruntime-node are installed (spec/onnx/helpers.lua: O.ort).
local H = require "spec.helpers"
local O = require "spec.onnx.helpers"
local mk = H.mk()
H.seed("onnx_nn_spec")

local function r(lo, hi) return math.random(lo, hi) end
local function pick(t) return t[r(1, #t)] end

local function skip_reason()
    if not mk.onnx_ops()[1] then return "moonkaas was built without protobuf-c" end
    return O.python()
end

local ort_why = O.ort_missing()

-- c = {nodes, inputs = {{name, shape[, type]}}, outputs = {names}, inits, opset, feeds,
--      lua = function() return node or {nodes in outputs' order} end, atol}
local function check_some(c, names)
    local inputs, outputs = {}, {}
    for i, v in ipairs(c.inputs) do inputs[i] = O.vi(v[1], v[2], v[3]) end
    for i, name in ipairs(names) do outputs[i] = O.vi(name, nil) end
    local desc = { opset = c.opset or 17, nodes = c.nodes, inputs = inputs, outputs = outputs,
                   initializers = c.inits or {} }
    local path = O.write(desc)
    local m <close> = mk.load_onnx(path)
    local got = m:run(c.feeds)
    local checked = 0
    if c.want then
        for i, name in ipairs(names) do
            local tol = c.lua and 1e-6 or (c.atol or 1e-5) -- the Lua graph: the same ops
            H.assert_close(got[name], c.want[i], tol, c.lua and 1e-6 or 1e-4)
        end
        checked = checked + 1
    end
    if not ort_why then
        local want = O.ort(path, c.feeds)
        for _, name in ipairs(names) do
            assert(want[name], "ONNX Runtime gave no " .. name)
            if #want[name].shape == 0 then want[name].shape = { 1 } end -- moonkaas' scalars are [1]
            H.assert_close(got[name], want[name], c.atol or 1e-5, 1e-4)
        end
        checked = checked + 1
    end
    return checked
end

-- c = {nodes, inputs = {{name, shape[, type]}}, outputs = {names}, inits, opset, feeds,
--      lua = function() return {nodes in outputs' order} end, atol}: the number of
-- references it was checked against (moonkaas models have at most 8 outputs: in groups)
local function check(c)
    if c.lua then -- else c.want: references, in outputs' order
        local nodes = c.lua()
        c.want = {}
        for first = 1, #nodes, 8 do
            local last = math.min(first + 7, #nodes)
            local lm <close> = mk.compile({ table.unpack(nodes, first, last) })
            local want = table.pack(lm:run(c.feeds))
            for i = first, last do c.want[i] = H.ref(want[i - first + 1]) end
        end
    end
    local checked = 0
    for first = 1, #c.outputs, 8 do
        local names = { table.unpack(c.outputs, first, math.min(first + 7, #c.outputs)) }
        local saved = c.want
        if saved then c.want = { table.unpack(saved, first, math.min(first + 7, #c.outputs)) } end
        checked = check_some(c, names)
        c.want = saved
    end
    return checked
end

local function node(op, inputs, outputs, attrs)
    return { op = op, inputs = inputs, outputs = type(outputs) == "table" and outputs or { outputs },
             attrs = attrs, name = type(outputs) == "table" and outputs[1] or outputs }
end

local function ints(name, values) return { name = name, type = "INT64", shape = { #values }, values = values } end

-- a float tensor of small integers (ties for the comparisons), and its values
local function small_ints(shape, lo, hi)
    local ref = H.randint(shape, lo, hi)
    local data = {}
    for i = 1, ref.numel do data[i] = ref:get(i) end
    return mk.tensor(data, "float32", shape), data
end

-- ONNX's LSTM in double precision, from its definition: gates i, o, f, c;
-- x [seq, batch, in], w [dirs, 4H, in], r [dirs, 4H, H], b [dirs, 8H] or nil,
-- h0 and c0 [dirs, batch, H] or nil; returns Y [seq, dirs, batch, H], Y_h, Y_c
local function lstm_ref(x, w, r, b, h0, c0, dirs, reverse)
    local S, B, I = x.shape[1], x.shape[2], x.shape[3]
    local Hd = r.shape[3]
    local function sig(v) return 1 / (1 + math.exp(-v)) end
    local Y = { shape = { S, dirs, B, Hd }, data = {} }
    local Yh = { shape = { dirs, B, Hd }, data = {} }
    local Yc = { shape = { dirs, B, Hd }, data = {} }
    for d = 0, dirs - 1 do
        local h, c = {}, {}
        for n = 0, B - 1 do
            for j = 0, Hd - 1 do
                local at = (d * B + n) * Hd + j + 1
                h[n * Hd + j] = h0 and h0.data[at] or 0
                c[n * Hd + j] = c0 and c0.data[at] or 0
            end
        end
        for k = 0, S - 1 do
            local t = (reverse or d == 1) and S - 1 - k or k
            local nh, nc = {}, {}
            for n = 0, B - 1 do
                local g = {}
                for row = 0, 4 * Hd - 1 do
                    local v = b and (b.data[d * 8 * Hd + row + 1] + b.data[d * 8 * Hd + 4 * Hd + row + 1]) or 0
                    for q = 0, I - 1 do
                        v = v + x.data[(t * B + n) * I + q + 1] * w.data[(d * 4 * Hd + row) * I + q + 1]
                    end
                    for q = 0, Hd - 1 do
                        v = v + h[n * Hd + q] * r.data[(d * 4 * Hd + row) * Hd + q + 1]
                    end
                    g[row] = v
                end
                for j = 0, Hd - 1 do
                    local i_, o_, f_ = sig(g[j]), sig(g[Hd + j]), sig(g[2 * Hd + j])
                    local cc = math.tanh(g[3 * Hd + j])
                    nc[n * Hd + j] = f_ * c[n * Hd + j] + i_ * cc
                    nh[n * Hd + j] = o_ * math.tanh(nc[n * Hd + j])
                end
            end
            h, c = nh, nc
            for n = 0, B - 1 do
                for j = 0, Hd - 1 do Y.data[((t * dirs + d) * B + n) * Hd + j + 1] = h[n * Hd + j] end
            end
        end
        for n = 0, B - 1 do
            for j = 0, Hd - 1 do
                Yh.data[(d * B + n) * Hd + j + 1] = h[n * Hd + j]
                Yc.data[(d * B + n) * Hd + j + 1] = c[n * Hd + j]
            end
        end
    end
    return Y, Yh, Yc
end

describe("ONNX import of networks' ops", function()
    local function guarded(name, body)
        it(name, function()
            local why = skip_reason()
            if why then return pending(why) end
            local n = body()
            if n == 0 then pending(ort_why) end
        end)
    end

    guarded("Sqrt, Neg, Abs, Erf, Log, Reciprocal, Floor, Ceil, LeakyRelu, Gelu", function()
        local shape = { r(1, 3), r(1, 6) }
        local x = H.rand(shape, 0.25, 3)
        local alpha = r(1, 50) / 100
        local names = { "Sqrt", "Neg", "Abs", "Erf", "Log", "Reciprocal", "Floor", "Ceil" }
        local nodes, outs = {}, {}
        for i, op in ipairs(names) do
            nodes[i] = node(op, { "x" }, "y" .. i)
            outs[i] = "y" .. i
        end
        nodes[#nodes + 1] = node("Neg", { "x" }, "nx")
        nodes[#nodes + 1] = node("LeakyRelu", { "nx" }, "lr", { alpha = { f = alpha } })
        nodes[#nodes + 1] = node("Gelu", { "nx" }, "ge")
        nodes[#nodes + 1] = node("Gelu", { "x" }, "gt", { approximate = { s = "tanh" } })
        for _, o in ipairs({ "lr", "ge", "gt" }) do outs[#outs + 1] = o end
        return check({
            nodes = nodes, inputs = { { "x", shape } }, outputs = outs, feeds = { x = x },
            opset = 20,
            lua = function()
                local xi = mk.input("x", "float32", shape)
                local nx = -xi
                return { xi:sqrt(), -xi, xi:abs(), xi:erf(), xi:log(), xi:reciprocal(),
                         xi:floor(), xi:ceil(), nx:leaky_relu(alpha), nx:gelu_erf(), xi:gelu() }
            end,
        })
    end)

    guarded("Equal, Less, Greater, Not, And, Or as BOOL into Where; Pow, Min, Max, Clip", function()
        local s = { r(1, 3), r(1, 5) }
        local sb = pick({ { s[2] }, { 1, s[2] }, s })
        local a, ad = small_ints(s, -2, 2)
        local b = small_ints(sb, -2, 2)
        local c = H.rand(s, -2, 2)
        local lo, hi = -r(1, 10) / 10, r(1, 10) / 10
        local loref, hiref = { shape = {}, data = { lo } }, { shape = {}, data = { hi } }
        local nodes = {
            node("Equal", { "a", "b" }, "e"), node("Less", { "a", "b" }, "l"),
            node("Greater", { "a", "b" }, "g"), node("Not", { "e" }, "ne"),
            node("And", { "l", "ne" }, "an"), node("Or", { "g", "e" }, "o"),
            node("Where", { "e", "a", "c" }, "w1"), node("Where", { "an", "c", "b" }, "w2"),
            node("Where", { "o", "a", "b" }, "w3"),
            node("Abs", { "c" }, "ac"), node("Pow", { "ac", "b" }, "pw"),
            node("Min", { "a", "b", "c" }, "mn"), node("Max", { "a", "c" }, "mx"),
            node("Clip", { "c", "lo", "hi" }, "cl"), node("Clip", { "c", "lo" }, "cl1"),
            node("Clip", { "cl1", "", "hi" }, "cl2"),
        }
        local outs = { "w1", "w2", "w3", "pw", "mn", "mx", "cl", "cl2" }
        local _ = ad
        return check({
            nodes = nodes, inputs = { { "a", s }, { "b", sb }, { "c", s } }, outputs = outs,
            feeds = { a = a, b = b, c = c },
            inits = { { name = "lo", type = "FLOAT", shape = {}, values = loref.data },
                      { name = "hi", type = "FLOAT", shape = {}, values = hiref.data } },
            lua = function()
                local ai, bi = mk.input("a", "float32", s), mk.input("b", "float32", sb)
                local ci = mk.input("c", "float32", s)
                local e, l, g = ai:eq(bi), ai:lt(bi), ai:gt(bi)
                local an, o = l:logical_and(e:logical_not()), g:logical_or(e)
                local lc, hc = mk.constant(mk.tensor({ lo }, "float32", { 1 })),
                    mk.constant(mk.tensor({ hi }, "float32", { 1 }))
                return { mk.where(e, ai, ci), mk.where(an, ci, bi), mk.where(o, ai, bi),
                         ci:abs():pow(bi), ai:minimum(bi):minimum(ci), ai:maximum(ci),
                         ci:clamp(lc, hc), ci:maximum(lc):minimum(hc) }
            end,
        })
    end)

    guarded("LSTM unrolled: forward, reverse, bidirectional; bias, initial states", function()
        local n = 0
        for _, dir in ipairs({ "forward", "reverse", "bidirectional" }) do
            local dirs = dir == "bidirectional" and 2 or 1
            local S, B, I, Hd = r(1, 5), r(1, 3), r(1, 4), r(1, 4)
            local x, xr = H.rand({ S, B, I })
            local _, wr = H.rand({ dirs, 4 * Hd, I })
            local _, rr = H.rand({ dirs, 4 * Hd, Hd })
            local _, br = H.rand({ dirs, 8 * Hd })
            local h0, h0r = H.rand({ dirs, B, Hd })
            local c0, c0r = H.rand({ dirs, B, Hd })
            local full = r(0, 1) == 1
            local ins = full and { "x", "w", "r", "b", "", "h0", "c0" } or { "x", "w", "r" }
            local inputs = { { "x", { S, B, I } } }
            local feeds = { x = x }
            if full then
                inputs[2], inputs[3] = { "h0", { dirs, B, Hd } }, { "c0", { dirs, B, Hd } }
                feeds.h0, feeds.c0 = h0, c0
            end
            local Y, Yh, Yc = lstm_ref(xr, wr, rr, full and br or nil, full and h0r or nil,
                                       full and c0r or nil, dirs, dir == "reverse")
            n = n + check({
                nodes = { node("LSTM", ins, { "y", "yh", "yc" },
                               { direction = { s = dir }, hidden_size = { i = Hd } }) },
                inputs = inputs, outputs = { "y", "yh", "yc" }, feeds = feeds,
                inits = { O.init("w", wr), O.init("r", rr), full and O.init("b", br) or nil },
                want = { Y, Yh, Yc }, atol = 1e-5,
            })
        end
        return n
    end)

    guarded("Softmax and LogSoftmax on any axis", function()
        local shape = { r(1, 3), r(1, 4), r(2, 5), r(1, 3) }
        local rank = r(2, 4)
        for i = #shape, rank + 1, -1 do shape[i] = nil end
        local x = H.rand(shape, -4, 4)
        local ax = r(-rank, rank - 1)
        local axis = ax < 0 and ax + rank or ax
        return check({
            nodes = { node("Softmax", { "x" }, "s", { axis = { i = ax } }),
                      node("LogSoftmax", { "x" }, "l", { axis = { i = ax } }) },
            inputs = { { "x", shape } }, outputs = { "s", "l" }, feeds = { x = x },
            lua = function()
                local xi = mk.input("x", "float32", shape)
                return { xi:softmax(axis), xi:log_softmax(axis) }
            end,
        })
    end)

    guarded("ReduceSum, ReduceMean, ReduceMax: axes as attribute (17) and input (18), keepdims", function()
        local n = 0
        for _, opset in ipairs({ 17, 18 }) do
            local shape = { r(1, 3), r(1, 4), r(1, 5) }
            local x = H.rand(shape, -3, 3)
            local axes, lua_axes = {}, {}
            for d = 0, 2 do
                if r(0, 1) == 1 then
                    axes[#axes + 1] = d - (r(0, 1) == 1 and 3 or 0)
                    lua_axes[#lua_axes + 1] = d
                end
            end
            if #axes == 0 then axes, lua_axes = { 1 }, { 1 } end
            local keep = r(0, 1)
            local nodes, inits = {}, {}
            for i, op in ipairs({ "ReduceMean", "ReduceMax", "ReduceSum" }) do
                local attrs = { keepdims = { i = keep } }
                local ins = { "x" }
                if op == "ReduceSum" or opset >= 18 then
                    ins[2] = "axes"
                else
                    attrs.axes = { ints = axes }
                end
                nodes[i] = node(op, ins, "y" .. i, attrs)
            end
            inits[1] = ints("axes", axes)
            n = n + check({
                nodes = nodes, inputs = { { "x", shape } }, outputs = { "y1", "y2", "y3" },
                feeds = { x = x }, inits = inits, opset = opset,
                lua = function()
                    local xi = mk.input("x", "float32", shape)
                    local o = { keepdims = keep == 1 }
                    return { xi:mean(lua_axes, o), xi:max(lua_axes, o), xi:sum(lua_axes, o) }
                end,
            })
        end
        return n
    end)

    guarded("LayerNormalization (any axis, bias optional) and BatchNormalization", function()
        local shape = { r(1, 3), r(1, 4), r(2, 5) }
        local axis = r(-3, 2)
        local k = 3 - (axis < 0 and axis + 3 or axis)
        local ws = {}
        for i = 4 - k, 3 do ws[#ws + 1] = shape[i] end
        local x = H.rand(shape, -3, 3)
        local w, wr = H.rand(ws, 0.5, 1.5)
        local b, br = H.rand(ws)
        local eps = pick({ 1e-5, 1e-3, 0.1 })
        local C = shape[2]
        local m, mr = H.rand({ C })
        local v, vr = H.rand({ C }, 0.5, 2)
        local bw, bwr = H.rand({ C })
        local bb, bbr = H.rand({ C })
        local _ = { w, b, m, v, bw, bb }
        return check({
            nodes = { node("LayerNormalization", { "x", "w", "b" }, "y",
                           { axis = { i = axis }, epsilon = { f = eps } }),
                      node("LayerNormalization", { "x", "w" }, "y2", { axis = { i = axis } }),
                      node("BatchNormalization", { "x", "bw", "bb", "m", "v" }, "z",
                           { epsilon = { f = eps } }) },
            inputs = { { "x", shape } }, outputs = { "y", "y2", "z" }, feeds = { x = x },
            inits = { O.init("w", wr), O.init("b", br), O.init("m", mr), O.init("v", vr),
                      O.init("bw", bwr), O.init("bb", bbr) },
            atol = 1e-4,
            lua = function()
                local xi = mk.input("x", "float32", shape)
                return { xi:layer_norm(k, { weight = mk.constant(w), bias = mk.constant(b),
                                            eps = eps }),
                         xi:layer_norm(k, { weight = mk.constant(w) }),
                         xi:batch_norm(mk.constant(m), mk.constant(v),
                                       { weight = mk.constant(bw), bias = mk.constant(bb),
                                         eps = eps }) }
            end,
        })
    end)

    guarded("Conv: pads, auto_pad, strides, dilations, group, bias; 1-D", function()
        local n = 0
        for _ = 1, 3 do
            local g = r(1, 2)
            local C, O_ = g * r(1, 2), g * r(1, 2)
            local kh, kw = r(1, 3), r(1, 3)
            local H_, W = r(kh + 2, 7), r(kw + 2, 7)
            local x = H.rand({ 1 + r(0, 1), C, H_, W })
            local w, wr = H.rand({ O_, C // g, kh, kw })
            local bias, brr = H.rand({ O_ })
            local _ = { w, bias }
            local attrs = { group = { i = g }, strides = { ints = { r(1, 2), r(1, 2) } } }
            local how = r(1, 4)
            if how == 1 then
                attrs.pads = { ints = { r(0, kh - 1), r(0, kw - 1), r(0, kh - 1), r(0, kw - 1) } }
                attrs.dilations = { ints = { r(1, 2), r(1, 2) } }
            elseif how == 2 then
                attrs.auto_pad = { s = "SAME_UPPER" }
            elseif how == 3 then
                attrs.auto_pad = { s = "VALID" }
            else
                attrs.auto_pad = { s = "SAME_LOWER" }
            end
            if how > 1 and attrs.strides.ints[1] > 1 then attrs.dilations = nil end
            n = n + check({
                nodes = { node("Conv", { "x", "w", "b" }, "y", attrs),
                          node("Conv", { "x", "w" }, "y2", attrs) },
                inputs = { { "x", x.shape } }, outputs = { "y", "y2" }, feeds = { x = x },
                inits = { O.init("w", wr), O.init("b", brr) }, atol = 1e-4,
            })
        end
        local x = H.rand({ 2, 3, r(4, 9) })
        local _, wr = H.rand({ 4, 3, 3 })
        n = n + check({
            nodes = { node("Conv", { "x", "w" }, "y", { pads = { ints = { 1, 2 } },
                                                       strides = { ints = { 2 } } }) },
            inputs = { { "x", x.shape } }, outputs = { "y" }, feeds = { x = x },
            inits = { O.init("w", wr) }, atol = 1e-4,
        })
        return n
    end)

    guarded("ConvTranspose, MaxPool, AveragePool (count_include_pad), GlobalAveragePool", function()
        local C, O_ = r(1, 3), r(1, 3)
        local x = H.rand({ r(1, 2), C, r(3, 7), r(3, 7) })
        local _, wr = H.rand({ C, O_, 3, 3 })
        local _, br = H.rand({ O_ })
        local s, p = r(1, 2), r(0, 1)
        local k = r(2, 3)
        local pp = r(0, 1)
        return check({
            nodes = {
                node("ConvTranspose", { "x", "w", "b" }, "t",
                     { strides = { ints = { s, s } }, pads = { ints = { p, p, p, p } },
                       output_padding = { ints = { s - 1, 0 } } }),
                node("MaxPool", { "x" }, "mp", { kernel_shape = { ints = { k, k } },
                     strides = { ints = { r(1, 2), r(1, 2) } }, pads = { ints = { pp, 0, pp, 1 } } }),
                node("AveragePool", { "x" }, "ap", { kernel_shape = { ints = { k, 2 } },
                     pads = { ints = { 1, 1, 1, 1 } }, count_include_pad = { i = 0 } }),
                node("AveragePool", { "x" }, "ap1", { kernel_shape = { ints = { k, 2 } },
                     pads = { ints = { 1, 1, 1, 1 } }, count_include_pad = { i = 1 } }),
                node("AveragePool", { "x" }, "ap2", { kernel_shape = { ints = { 2, 2 } },
                     auto_pad = { s = "SAME_UPPER" }, strides = { ints = { 2, 2 } } }),
                node("GlobalAveragePool", { "x" }, "gp"),
            },
            inputs = { { "x", x.shape } }, outputs = { "t", "mp", "ap", "ap1", "ap2", "gp" },
            feeds = { x = x }, inits = { O.init("w", wr), O.init("b", br) }, atol = 1e-4,
        })
    end)

    guarded("Concat of run-time tensors, Split, Slice with steps, Gather, Expand, Tile, Pad", function()
        local a, b, c = r(2, 4), r(2, 5), r(2, 6)
        local x = H.rand({ a, b, c })
        local y = H.rand({ a, r(1, 3), c })
        local ids = H.randint({ r(1, 3) }, -c, c - 1)
        local s1 = r(1, b - 1)
        local mode = pick({ "constant", "reflect", "edge" })
        local pads = { 0, r(0, 1), r(0, 1), r(0, 1), 0, r(0, 1) }
        return check({
            nodes = {
                node("Concat", { "x", "y", "x" }, "cat", { axis = { i = 1 } }),
                node("Split", { "x", "sizes" }, { "sp1", "sp2" }, { axis = { i = 1 } }),
                node("Slice", { "x", "st", "en", "ax", "steps" }, "sl"),
                node("Gather", { "x", "ids" }, "ga", { axis = { i = 2 } }),
                node("Gather", { "x", "ids1" }, "ga1", { axis = { i = -2 } }),
                node("Expand", { "y", "eshape" }, "ex"),
                node("Tile", { "x", "reps" }, "ti"),
                node("Pad", { "x", "pads", "pv" }, "pd", { mode = { s = mode } }),
            },
            inputs = { { "x", x.shape }, { "y", y.shape }, { "ids", ids.shape, "INT64" } },
            outputs = { "cat", "sp1", "sp2", "sl", "ga", "ga1", "ex", "ti", "pd" },
            feeds = { x = x, y = y, ids = ids },
            inits = { ints("sizes", { s1, b - s1 }), ints("st", { 0, 1, 1 }),
                      ints("en", { -1, 1000, 1000 }), ints("ax", { 0, 1, 2 }),
                      ints("steps", { 1, 1, 2 }),
                      ints("ids1", { 0, b - 1, -1 }),
                      ints("eshape", { 2, 1, 1, 1 }), ints("reps", { 1, r(1, 2), r(1, 3) }),
                      ints("pads", pads),
                      { name = "pv", type = "FLOAT", shape = {}, values = { r(-5, 5) / 4 } } },
        })
    end)

    guarded("Resize (nearest), Range and ConstantOfShape folded, MatMul with broadcast batches", function()
        local x = H.rand({ r(1, 2), r(1, 3), r(1, 4), r(1, 4) })
        local sh, sw = r(1, 3), r(1, 3)
        local m, k, n = r(1, 4), r(1, 5), r(1, 4)
        local a = H.rand({ r(1, 3), 1, m, k })
        local bm = H.rand({ r(1, 2), k, n })
        local len = r(1, 6)
        return check({
            opset = 18,
            nodes = {
                node("Resize", { "x", "", "scales" }, "rs", { mode = { s = "nearest" } }),
                node("Range", { "r0", "r1", "r2" }, "rg"),
                node("Cast", { "rg" }, "rgf", { to = { i = 1 } }),
                node("ConstantOfShape", { "cs" }, "c1",
                     { value = { t = { name = "v", type = "FLOAT", shape = { 1 }, values = { 0.5 } } } }),
                node("Add", { "rgf", "c1" }, "rc"),
                node("MatMul", { "a", "bm" }, "mm"),
            },
            inputs = { { "x", x.shape }, { "a", a.shape }, { "bm", bm.shape } },
            outputs = { "rs", "rc", "mm" }, feeds = { x = x, a = a, bm = bm },
            inits = { { name = "scales", type = "FLOAT", shape = { 4 }, values = { 1, 1, sh, sw } },
                      { name = "r0", type = "INT64", shape = {}, values = { 2 } },
                      { name = "r1", type = "INT64", shape = {}, values = { 2 + 3 * len } },
                      { name = "r2", type = "INT64", shape = {}, values = { 3 } },
                      ints("cs", { len }) },
            atol = 1e-5,
        })
    end)
end)

describe("ONNX import of networks' ops refuses", function()
    local function refuses(nodes, inputs, pattern, inits, opset)
        local vis = {}
        for i, v in ipairs(inputs) do vis[i] = O.vi(v[1], v[2], v[3]) end
        local path = O.write({ opset = opset or 17, nodes = nodes, inputs = vis,
                               outputs = { O.vi(nodes[#nodes].outputs[1], nil) },
                               initializers = inits or {} })
        local ok, err = pcall(mk.load_onnx, path)
        assert.is_false(ok)
        assert.matches(pattern, tostring(err))
        assert.equal(1, mk.compile({ mk.input("q", "float32", { 1 }):relu() }) and 1)
    end

    it("unsupported attributes and modes, naming node, op, opset and attribute", function()
        local why = skip_reason()
        if why then return pending(why) end
        local x4 = { { "x", { 1, 2, 5, 5 } } }
        refuses({ node("MaxPool", { "x" }, "mp", { kernel_shape = { ints = { 2, 2 } },
                                                   ceil_mode = { i = 1 } }) }, x4,
            "ONNX node 'mp' %(MaxPool, opset 17%): attribute 'ceil_mode' = 1 is not supported")
        refuses({ node("Pad", { "x", "p" }, "pd", { mode = { s = "wrap" } }) }, x4,
            "ONNX node 'pd' %(Pad, opset 17%): attribute 'mode' = 'wrap'",
            { ints("p", { 0, 0, 1, 1, 0, 0, 1, 1 }) })
        refuses({ node("Resize", { "x", "", "s" }, "rz", { mode = { s = "linear" } }) }, x4,
            "ONNX node 'rz' %(Resize, opset 17%): attribute 'mode' = 'linear'",
            { { name = "s", type = "FLOAT", shape = { 4 }, values = { 1, 1, 2, 2 } } })
        refuses({ node("Resize", { "x", "", "s" }, "rz") }, x4,
            "ONNX node 'rz' %(Resize, opset 17%): only integer scales",
            { { name = "s", type = "FLOAT", shape = { 4 }, values = { 1, 1, 1.5, 2 } } })
        refuses({ node("BatchNormalization", { "x", "c", "c", "c", "c" }, "bn",
                       { training_mode = { i = 1 } }) }, x4,
            "ONNX node 'bn' %(BatchNormalization, opset 17%): attribute 'training_mode' = 1",
            { { name = "c", type = "FLOAT", shape = { 2 }, values = { 1, 1 } } })
        refuses({ node("Conv", { "x", "w" }, "cv", { auto_pad = { s = "SAME_MIDDLE" } }) }, x4,
            "ONNX node 'cv' %(Conv, opset 17%): attribute 'auto_pad' = 'SAME_MIDDLE'",
            { { name = "w", type = "FLOAT", shape = { 1, 2, 1, 1 }, values = { 1, 1 } } })
        refuses({ node("ReduceMean", { "x" }, "rm", { axes = { ints = { 1 } } }) }, x4,
            "ONNX node 'rm' %(ReduceMean, opset 18%): attribute 'axes': from this opset", nil, 18)
        refuses({ node("Gelu", { "x" }, "ge") }, x4,
            "ONNX node 'ge' %(Gelu, opset 17%): the importer maps Gelu at other opsets only")
        refuses({ node("Slice", { "x", "s", "e", "a", "st" }, "sl") }, x4,
            "ONNX node 'sl' %(Slice, opset 17%): a negative step",
            { ints("s", { 3 }), ints("e", { 0 }), ints("a", { 3 }), ints("st", { -1 }) })
    end)
end)
