-- ONNX Runtime as the reference: small networks written with onnx.helper,
-- run by moonkaas and by ONNX Runtime's CPU provider (npm's onnxruntime-node
-- under node, installed outside the checkout: MK_ORTNODE names its
-- node_modules, else /opt/ortnode/node_modules; scripts/setup.sh installs it
-- there). Pending, with the reason, where node, onnxruntime-node or
-- python3-onnx is missing.
local H = require "spec.helpers"
local O = require "spec.onnx.helpers"
local mk = H.mk()
H.seed("onnx_ort_spec")

local function skip_reason()
    if not mk.onnx_ops()[1] then return "moonkaas was built without protobuf-c" end
    return O.python() or O.ort_missing()
end

local ort = O.ort

local function r(lo, hi) return math.random(lo, hi) end

local function compare(desc, feeds, opts, atol)
    local path = O.write(desc)
    local m = mk.load_onnx(path, opts)
    local got = m:run(feeds)
    local want = ort(path, feeds)
    local n = 0
    for name, w in pairs(want) do
        H.assert_close(got[name], w, atol or 1e-5, 1e-4)
        n = n + 1
    end
    assert.are.equal(#desc.outputs, n)
    m:close()
end

describe("ONNX Runtime agrees with moonkaas", function()
    local function guarded(name, body)
        it(name, function()
            local why = skip_reason()
            if why then return pending(why) end
            body()
        end)
    end

    guarded("on an MLP: Gemm, Relu, Gemm, Softmax", function()
        local B, I, Hd, C = r(1, 4), r(2, 9), r(2, 17), r(2, 6)
        local _, w1 = H.rand({ Hd, I })
        local _, b1 = H.rand({ Hd })
        local _, w2 = H.rand({ C, Hd })
        local _, b2 = H.rand({ C })
        local x = H.rand({ B, I })
        compare({ opset = 17,
                  nodes = { { op = "Gemm", inputs = { "x", "w1", "b1" }, outputs = { "h" },
                              attrs = { transB = { i = 1 } } },
                            { op = "Relu", inputs = { "h" }, outputs = { "hr" } },
                            { op = "Gemm", inputs = { "hr", "w2", "b2" }, outputs = { "z" },
                              attrs = { transB = { i = 1 }, alpha = { f = 0.75 } } },
                            { op = "Softmax", inputs = { "z" }, outputs = { "p" } } },
                  inputs = { O.vi("x", { "batch", I }) }, outputs = { O.vi("p", nil) },
                  initializers = { O.init("w1", w1), O.init("b1", b1), O.init("w2", w2),
                                   O.init("b2", b2) } },
            { x = x }, { shapes = { x = { B, I } } })
    end)

    guarded("on attention-shaped MatMuls, Transpose, Reshape, Div, Exp, Tanh, Sigmoid", function()
        local B, T, D = r(1, 2), r(1, 5), r(1, 6)
        local q_, k_ = H.rand({ B, T, D }), H.rand({ B, T, D })
        local _, scale = H.rand({ 1 }, 1, 3)
        compare({ opset = 17,
                  nodes = { { op = "Transpose", inputs = { "k" }, outputs = { "kt" },
                              attrs = { perm = { ints = { 0, 2, 1 } } } },
                            { op = "MatMul", inputs = { "q", "kt" }, outputs = { "s" } },
                            { op = "Div", inputs = { "s", "scale" }, outputs = { "sd" } },
                            { op = "Tanh", inputs = { "sd" }, outputs = { "t" } },
                            { op = "Exp", inputs = { "t" }, outputs = { "e" } },
                            { op = "Sigmoid", inputs = { "e" }, outputs = { "g" } },
                            { op = "Reshape", inputs = { "g", "shape" }, outputs = { "y" } } },
                  inputs = { O.vi("q", { B, T, D }), O.vi("k", { B, T, D }) },
                  outputs = { O.vi("y", nil) },
                  initializers = { O.init("scale", scale),
                                   { name = "shape", type = "INT64", shape = { 2 },
                                     values = { B, -1 } } } },
            { q = q_, k = k_ })
    end)

    guarded("on an embedding, Gather of run-time ids, Flatten, Unsqueeze, Squeeze, Cast", function()
        local V, D, n = r(2, 9), r(1, 5), r(1, 4)
        local _, tbl = H.rand({ V, D })
        local ids = H.randint({ n }, 0, V - 1)
        compare({ opset = 17,
                  nodes = { { op = "Gather", inputs = { "table", "ids" }, outputs = { "e" } },
                            { op = "Unsqueeze", inputs = { "e", "ax" }, outputs = { "u" } },
                            { op = "Squeeze", inputs = { "u", "ax" }, outputs = { "q" } },
                            { op = "Flatten", inputs = { "q" }, outputs = { "s" },
                              attrs = { axis = { i = 0 } } },
                            { op = "Cast", inputs = { "ids" }, outputs = { "idf" },
                              attrs = { to = { i = 1 } } } },
                  inputs = { O.vi("ids", { n }, "INT64") },
                  outputs = { O.vi("s", nil), O.vi("idf", nil) },
                  initializers = { O.init("table", tbl),
                                   { name = "ax", type = "INT64", shape = { 1 }, values = { 1 } } } },
            { ids = ids })
    end)
    guarded("on a small CNN: Conv, BatchNormalization, MaxPool, grouped Conv, GlobalAveragePool", function()
        local B, C, Hh, W = r(1, 2), r(1, 3), r(6, 12), r(6, 12)
        local F1, F2 = 2 * r(1, 3), 2 * r(1, 3)
        local _, w1 = H.rand({ F1, C, 3, 3 })
        local _, b1 = H.rand({ F1 })
        local _, mean = H.rand({ F1 })
        local _, var = H.rand({ F1 }, 0.5, 2)
        local _, gam = H.rand({ F1 }, 0.5, 1.5)
        local _, bet = H.rand({ F1 })
        local _, w2 = H.rand({ F2, F1 // 2, 3, 3 })
        local _, fc = H.rand({ 5, F2 })
        local _, fb = H.rand({ 5 })
        local x = H.rand({ B, C, Hh, W })
        compare({ opset = 17,
                  nodes = { { op = "Conv", inputs = { "x", "w1", "b1" }, outputs = { "c1" },
                              attrs = { pads = { ints = { 1, 1, 1, 1 } } } },
                            { op = "BatchNormalization", inputs = { "c1", "gam", "bet", "mean", "var" },
                              outputs = { "n1" } },
                            { op = "Relu", inputs = { "n1" }, outputs = { "r1" } },
                            { op = "MaxPool", inputs = { "r1" }, outputs = { "p1" },
                              attrs = { kernel_shape = { ints = { 2, 2 } }, strides = { ints = { 2, 2 } } } },
                            { op = "Conv", inputs = { "p1", "w2" }, outputs = { "c2" },
                              attrs = { group = { i = 2 }, auto_pad = { s = "SAME_UPPER" },
                                        strides = { ints = { 2, 2 } } } },
                            { op = "Relu", inputs = { "c2" }, outputs = { "r2" } },
                            { op = "GlobalAveragePool", inputs = { "r2" }, outputs = { "g" } },
                            { op = "Flatten", inputs = { "g" }, outputs = { "f" } },
                            { op = "Gemm", inputs = { "f", "fc", "fb" }, outputs = { "y" },
                              attrs = { transB = { i = 1 } } } },
                  inputs = { O.vi("x", { B, C, Hh, W }) }, outputs = { O.vi("y", nil) },
                  initializers = { O.init("w1", w1), O.init("b1", b1), O.init("mean", mean),
                                   O.init("var", var), O.init("gam", gam), O.init("bet", bet),
                                   O.init("w2", w2), O.init("fc", fc), O.init("fb", fb) } },
            { x = x }, nil, 1e-4)
    end)

    guarded("on a GPT-2 block: LayerNormalization, Split, 4-D MatMuls, a BOOL causal mask, Erf GELU", function()
        local B, T, Hn, dh = r(1, 2), r(2, 6), r(1, 3), r(2, 4)
        local D = Hn * dh
        local inits = {}
        local function w(name, shape, lo, hi)
            local _, ref = H.rand(shape, lo, hi)
            inits[#inits + 1] = O.init(name, ref)
        end
        w("g1", { D }, 0.5, 1.5); w("b1", { D }); w("g2", { D }, 0.5, 1.5); w("b2", { D })
        w("wqkv", { D, 3 * D }); w("bqkv", { 3 * D }); w("wo", { D, D }); w("bo", { D })
        w("w1", { D, 4 * D }); w("w2", { 4 * D, D })
        local mask = {}
        for i = 0, T - 1 do for j = 0, T - 1 do mask[#mask + 1] = j <= i and 1 or 0 end end
        local function c(name, values, type_, shape)
            inits[#inits + 1] = { name = name, type = type_ or "INT64", shape = shape or { #values },
                                  values = values }
        end
        c("mask", mask, "BOOL", { T, T })
        c("sizes", { D, D, D }); c("heads", { B, T, Hn, dh }); c("flat", { B, T, D })
        c("scale", { math.sqrt(dh) }, "FLOAT", {}); c("neg", { -1e9 }, "FLOAT", {})
        c("half", { 0.5 }, "FLOAT", {}); c("one", { 1 }, "FLOAT", {})
        c("rs2", { 1 / math.sqrt(2) }, "FLOAT", {})
        local function n(op, ins, out, attrs)
            return { op = op, inputs = ins, outputs = type(out) == "table" and out or { out },
                     attrs = attrs }
        end
        local x = H.rand({ B, T, D })
        compare({ opset = 17,
                  nodes = {
                      n("LayerNormalization", { "x", "g1", "b1" }, "h"),
                      n("MatMul", { "h", "wqkv" }, "qkv0"), n("Add", { "qkv0", "bqkv" }, "qkv"),
                      n("Split", { "qkv", "sizes" }, { "q0", "k0", "v0" }, { axis = { i = 2 } }),
                      n("Reshape", { "q0", "heads" }, "q1"), n("Reshape", { "k0", "heads" }, "k1"),
                      n("Reshape", { "v0", "heads" }, "v1"),
                      n("Transpose", { "q1" }, "q", { perm = { ints = { 0, 2, 1, 3 } } }),
                      n("Transpose", { "k1" }, "kt", { perm = { ints = { 0, 2, 3, 1 } } }),
                      n("Transpose", { "v1" }, "v", { perm = { ints = { 0, 2, 1, 3 } } }),
                      n("MatMul", { "q", "kt" }, "s0"), n("Div", { "s0", "scale" }, "s1"),
                      n("Where", { "mask", "s1", "neg" }, "s2"),
                      n("Softmax", { "s2" }, "p", { axis = { i = -1 } }),
                      n("MatMul", { "p", "v" }, "o0"),
                      n("Transpose", { "o0" }, "o1", { perm = { ints = { 0, 2, 1, 3 } } }),
                      n("Reshape", { "o1", "flat" }, "o2"), n("MatMul", { "o2", "wo" }, "o3"),
                      n("Add", { "o3", "bo" }, "o4"), n("Add", { "x", "o4" }, "x1"),
                      n("LayerNormalization", { "x1", "g2", "b2" }, "h2"),
                      n("MatMul", { "h2", "w1" }, "f0"), n("Mul", { "f0", "rs2" }, "f1"),
                      n("Erf", { "f1" }, "f2"), n("Add", { "f2", "one" }, "f3"),
                      n("Mul", { "f0", "f3" }, "f4"), n("Mul", { "f4", "half" }, "f5"),
                      n("MatMul", { "f5", "w2" }, "f6"), n("Add", { "x1", "f6" }, "y"),
                  },
                  inputs = { O.vi("x", { B, T, D }) }, outputs = { O.vi("y", nil) },
                  initializers = inits },
            { x = x }, nil, 1e-4)
    end)
end)
