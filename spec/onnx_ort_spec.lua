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
end)
