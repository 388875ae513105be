-- ONNX import (mk.load_onnx): every mapped op on random shapes and
-- attributes, from files written by ONNX's own Python library
-- (spec/onnx/make_model.py), against double-precision loops written here
-- from the ONNX operator definitions, and against the same graph built in
-- Lua; and bad files, each a clear error. Pending where python3-onnx is absent.
local H = require "spec.helpers"
local O = require "spec.onnx.helpers"
local mk = H.mk()
local R = H.ref_ops
H.seed("onnx_spec")

local function imported() return mk.onnx_ops()[1] ~= nil end

local function r(lo, hi) return math.random(lo, hi) end

local function numel(shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    return n
end

local function ref_of(shape, data, dtype) return { shape = shape, data = data, dtype = dtype or "float32" } end

-- ---- references from the ONNX definitions -------------------------------------

-- MatMul as numpy.matmul: [..., m, k] @ [..., k, n] with equal batch dims, [k] and [k] vectors
local function matmul(a, b)
    local as, bs = H.copy(a.shape), H.copy(b.shape)
    local va, vb = #as == 1, #bs == 1
    if va then table.insert(as, 1, 1) end
    if vb then bs[2] = 1 end
    local m, k, n = as[#as - 1], as[#as], bs[#bs]
    local batch_shape = {}
    for i = 1, #as - 2 do batch_shape[i] = as[i] end
    local batch = numel(batch_shape)
    local b_batched = #bs > 2
    local out = {}
    for z = 0, batch - 1 do
        for i = 0, m - 1 do
            for j = 0, n - 1 do
                local s = 0.0
                for l = 0, k - 1 do
                    local bz = b_batched and z * k * n or 0
                    s = s + a.data[z * m * k + i * k + l + 1] * b.data[bz + l * n + j + 1]
                end
                out[#out + 1] = s
            end
        end
    end
    local shape = H.copy(batch_shape)
    if not va then shape[#shape + 1] = m end
    if not vb then shape[#shape + 1] = n end
    return ref_of(shape, out)
end

local function transpose2(x) return R.permute(x, { 1, 0 }) end

local function scaled(x, f)
    local out = ref_of(x.shape, {})
    for i, v in ipairs(x.data) do out.data[i] = v * f end
    return out
end

-- softmax along the last axis, in double precision
local function softmax_last(x)
    local n = x.shape[#x.shape]
    local out = ref_of(x.shape, {})
    for row = 0, numel(x.shape) // n - 1 do
        local m = -math.huge
        for j = 1, n do m = math.max(m, x.data[row * n + j]) end
        local s = 0
        for j = 1, n do s = s + math.exp(x.data[row * n + j] - m) end
        for j = 1, n do out.data[row * n + j] = math.exp(x.data[row * n + j] - m) / s end
    end
    return out
end

-- Gather along axis 0 (indices may be negative: from the end)
local function gather0(x, idx)
    local inner = numel(x.shape) // x.shape[1]
    local shape = H.copy(idx.shape)
    for i = 2, #x.shape do shape[#shape + 1] = x.shape[i] end
    local out = ref_of(shape, {}, x.dtype)
    for j, id in ipairs(idx.data) do
        if id < 0 then id = id + x.shape[1] end
        for c = 1, inner do out.data[(j - 1) * inner + c] = x.data[id * inner + c] end
    end
    return out
end

-- ---- running a case ----------------------------------------------------------

local function run_case(c)
    local path = O.write(c.desc)
    local m = mk.load_onnx(path, c.opts) -- closed by the collector: callers read it
    local outs = m:run(c.feeds)
    for name, want in pairs(c.want) do
        assert(outs[name], "no output " .. name)
        H.assert_close(outs[name], want, c.atol or 1e-5, c.rtol or 1e-5)
    end
    if c.lua then -- the same graph built in Lua gives the same values
        local nodes, feeds = c.lua()
        local lm <close> = mk.compile(nodes)
        local got = table.pack(lm:run(feeds))
        for i, name in ipairs(c.order) do
            H.assert_close(got[i], H.ref(outs[name]), 1e-6, 1e-6)
        end
    end
    return m, outs
end

local function expect_error(desc, pattern, opts)
    local path = O.write(desc)
    local ok, err = pcall(mk.load_onnx, path, opts)
    assert.is_false(ok)
    assert.matches(pattern, tostring(err))
    return err
end

local function skip_reason()
    if not imported() then return "moonkaas was built without protobuf-c" end
    return O.python()
end

local function graph(nodes, inputs, outputs, inits, opset)
    return { opset = opset or 17, nodes = nodes, inputs = inputs, outputs = outputs,
             initializers = inits or {} }
end

-- ---- the cases ------------------------------------------------------------------

describe("ONNX import", function()
    local function guarded(name, body)
        it(name, function()
            local why = skip_reason()
            if why then return pending(why) end
            body()
        end)
    end

    guarded("Add, Sub, Mul, Div broadcast as NumPy's, against loops and Lua", function()
        for _, op in ipairs({ "Add", "Sub", "Mul", "Div" }) do
            local a, b, c = r(1, 4), r(1, 5), r(1, 6)
            local xs = { a, b, c }
            local ys = ({ { b, c }, { 1, c }, { c }, { a, 1, c } })[r(1, 4)]
            local x, xr = H.rand(xs)
            local y, yr = H.rand(ys, 0.5, 2)
            local f = ({ Add = R.add, Sub = R.sub, Mul = R.mul, Div = R.div })[op]
            local method = ({ Add = "add", Sub = "sub", Mul = "mul", Div = "div" })[op]
            run_case({
                desc = graph({ { op = op, inputs = { "x", "y" }, outputs = { "z" }, name = "n1" } },
                    { O.vi("x", xs) }, { O.vi("z", nil) }, { O.init("y", yr) }),
                feeds = { x = x }, want = { z = f(xr, yr) }, order = { "z" },
                lua = function()
                    local xi = mk.input("x", "float32", xs)
                    return xi[method](xi, mk.constant(y)), { x = x }
                end,
            })
        end
    end)

    guarded("Relu, Sigmoid, Tanh, Exp", function()
        for _, op in ipairs({ "Relu", "Sigmoid", "Tanh", "Exp" }) do
            local shape = { r(1, 3), r(1, 7) }
            local x, xr = H.rand(shape, -3, 3)
            local f = ({ Relu = R.relu, Sigmoid = R.sigmoid, Tanh = R.tanh, Exp = R.exp })[op]
            local method = ({ Relu = "relu", Sigmoid = "sigmoid", Tanh = "tanh", Exp = "exp" })[op]
            run_case({
                desc = graph({ { op = op, inputs = { "x" }, outputs = { "y" } } },
                    { O.vi("x", shape) }, { O.vi("y", nil) }),
                feeds = { x = x }, want = { y = f(xr) }, order = { "y" }, atol = 1e-5, rtol = 1e-5,
                lua = function()
                    local xi = mk.input("x", "float32", shape)
                    return xi[method](xi), { x = x }
                end,
            })
        end
    end)

    guarded("MatMul: matrices, batches folded into rows, equal batches, vectors", function()
        local m, k, n, B, A = r(1, 5), r(1, 6), r(1, 5), r(1, 3), r(1, 2)
        local shapes = {
            { { m, k }, { k, n }, true }, { { B, m, k }, { k, n }, true },
            { { B, m, k }, { B, k, n }, false }, { { A, B, m, k }, { A, B, k, n }, false },
            { { k }, { k, n }, true }, { { m, k }, { k }, true }, { { A, B, m, k }, { k, n }, true },
        }
        for _, s in ipairs(shapes) do
            local x, xr = H.rand(s[1])
            local w, wr = H.rand(s[2])
            local inits, inputs, feeds = {}, { O.vi("x", s[1]) }, { x = x }
            if s[3] then inits = { O.init("w", wr) }
            else inputs[2] = O.vi("w", s[2]); feeds.w = w end
            run_case({
                desc = graph({ { op = "MatMul", inputs = { "x", "w" }, outputs = { "y" } } },
                    inputs, { O.vi("y", nil) }, inits),
                feeds = feeds, want = { y = matmul(xr, wr) }, atol = 1e-5, rtol = 1e-5,
            })
        end
    end)

    guarded("Gemm with transA, transB, alpha, beta and C of [n], [m, n] or none", function()
        for _ = 1, 6 do
            local m, k, n = r(1, 5), r(1, 6), r(1, 5)
            local ta, tb = r(0, 1), r(0, 1)
            local alpha, beta = H.f32(math.random() * 2 - 1), H.f32(math.random() * 2 - 1)
            local as = ta == 1 and { k, m } or { m, k }
            local bs = tb == 1 and { n, k } or { k, n }
            local x, xr = H.rand(as)
            local _, wr = H.rand(bs)
            local cshape = ({ { n }, { m, n }, false })[r(1, 3)]
            local inits, ins = { O.init("w", wr) }, { "x", "w" }
            local want = scaled(matmul(ta == 1 and transpose2(xr) or xr, tb == 1 and transpose2(wr) or wr), alpha)
            if cshape then
                local _, cr = H.rand(cshape)
                inits[2] = O.init("c", cr)
                ins[3] = "c"
                want = R.add(want, scaled(cr, beta))
            end
            run_case({
                desc = graph({ { op = "Gemm", inputs = ins, outputs = { "y" },
                                 attrs = { transA = { i = ta }, transB = { i = tb },
                                           alpha = { f = alpha }, beta = { f = beta } } } },
                    { O.vi("x", as) }, { O.vi("y", nil) }, inits),
                feeds = { x = x }, want = { y = want }, atol = 1e-5, rtol = 1e-4,
            })
        end
    end)

    guarded("Softmax over the last axis; an axis out of range is an error naming it", function()
        local shape = { r(1, 3), r(1, 4), r(2, 9) }
        local x, xr = H.rand(shape, -4, 4)
        local axis = ({ -1, 2 })[r(1, 2)]
        run_case({
            desc = graph({ { op = "Softmax", inputs = { "x" }, outputs = { "y" },
                             attrs = { axis = { i = axis } } } },
                { O.vi("x", shape) }, { O.vi("y", nil) }),
            feeds = { x = x }, want = { y = softmax_last(xr) }, atol = 1e-6, rtol = 1e-5,
        })
        expect_error(graph({ { op = "Softmax", inputs = { "x" }, outputs = { "y" }, name = "sm",
                               attrs = { axis = { i = 3 } } } },
            { O.vi("x", shape) }, { O.vi("y", nil) }),
            "ONNX node 'sm' %(Softmax, opset 17%): axis 3 is outside %[%-3, 3%)")
    end)

    guarded("Reshape (0 and -1), Flatten, Squeeze, Unsqueeze, Transpose, Identity, Dropout", function()
        local a, b, c = r(1, 3), r(1, 4), r(1, 5)
        local x, xr = H.rand({ a, b, c })
        local perm = ({ { 2, 0, 1 }, { 1, 0, 2 }, { 0, 2, 1 }, { 2, 1, 0 } })[r(1, 4)]
        local fa = r(0, 3)
        local fouter = 1
        for i = 1, fa do fouter = fouter * ({ a, b, c })[i] end
        local nodes = {
            { op = "Reshape", inputs = { "x", "shape" }, outputs = { "r" } },
            { op = "Unsqueeze", inputs = { "r", "ax1" }, outputs = { "u" } },
            { op = "Squeeze", inputs = { "u", "ax1" }, outputs = { "s" } },
            { op = "Transpose", inputs = { "x" }, outputs = { "t" }, attrs = { perm = { ints = perm } } },
            { op = "Flatten", inputs = { "x" }, outputs = { "f" }, attrs = { axis = { i = fa } } },
            { op = "Identity", inputs = { "t" }, outputs = { "i" } },
            { op = "Dropout", inputs = { "i" }, outputs = { "d" }, attrs = { seed = { i = 3 } } },
        }
        local inits = {
            { name = "shape", type = "INT64", shape = { 3 }, values = { 0, -1, 1 } },
            { name = "ax1", type = "INT64", shape = { 1 }, values = { 1 } },
        }
        local _, outs = run_case({
            desc = graph(nodes, { O.vi("x", { a, b, c }) },
                { O.vi("s", nil), O.vi("d", nil), O.vi("f", nil) }, inits),
            feeds = { x = x },
            want = { s = R.reshape(xr, { a, b * c, 1 }), d = R.permute(xr, perm),
                     f = R.reshape(xr, { fouter, a * b * c // fouter }) },
        })
        assert.are.same({ a, b * c, 1 }, outs.s.shape)
    end)

    guarded("Constant and Cast (float32 to float16 and int64, known integers folded)", function()
        local shape = { r(1, 3), r(1, 5) }
        local x, xr = H.rand(shape, -50, 50)
        local _, kr = H.rand({ shape[2] })
        local nodes = {
            { op = "Constant", inputs = {}, outputs = { "k" },
              attrs = { value = { t = O.init("kv", kr) } } },
            { op = "Constant", inputs = {}, outputs = { "h" }, attrs = { value_float = { f = 0.5 } } },
            { op = "Add", inputs = { "x", "k" }, outputs = { "xk" } },
            { op = "Mul", inputs = { "xk", "h" }, outputs = { "y" } },
            { op = "Cast", inputs = { "y" }, outputs = { "y16" }, attrs = { to = { i = 10 } } },
            { op = "Cast", inputs = { "y" }, outputs = { "yi" }, attrs = { to = { i = 7 } } },
        }
        local m, outs = run_case({
            desc = graph(nodes, { O.vi("x", shape) },
                { O.vi("y", nil), O.vi("y16", nil, "FLOAT16"), O.vi("yi", nil, "INT64") }),
            feeds = { x = x }, want = { y = scaled(R.add(xr, kr), 0.5) },
        })
        assert.are.equal("float16", outs.y16.dtype)
        H.assert_close(outs.y16:to("float32"), H.ref(outs.y:to("float16"):to("float32")), 0, 0)
        local yr = H.ref(outs.y)
        for i, v in ipairs(yr.data) do
            local want = v < 0 and math.ceil(v) or math.floor(v)
            assert.are.equal(want, outs.yi:get(i))
        end
        m:close()
    end)

    guarded("Gather: known and run-time indices, negative ones, ids of rank 2", function()
        local V, D = r(2, 6), r(1, 5)
        local tbl, tr = H.rand({ V, D })
        local n = r(1, 4)
        local ids, idr = H.randint({ n, 2 }, 0, V - 1)
        local kid = {}
        for i = 1, 3 do kid[i] = math.random(-V, V - 1) end
        local x, xr = H.rand({ V, D })
        local nodes = {
            { op = "Gather", inputs = { "table", "ids" }, outputs = { "e" }, attrs = { axis = { i = 0 } } },
            { op = "Gather", inputs = { "x", "k" }, outputs = { "g" } },
        }
        run_case({
            desc = graph(nodes, { O.vi("ids", { n, 2 }, "INT64"), O.vi("x", { V, D }) },
                { O.vi("e", nil), O.vi("g", nil) },
                { O.init("table", tr), { name = "k", type = "INT64", shape = { 3 }, values = kid } }),
            feeds = { ids = ids, x = x },
            want = { e = gather0(tr, idr), g = gather0(xr, ref_of({ 3 }, kid, "int64")) },
        })
    end)

    guarded("Slice of axis 0, step 1, negative bounds; known data sliced with steps", function()
        local rows, cols = r(3, 8), r(1, 4)
        local x, xr = H.rand({ rows, cols })
        local b, e = r(0, rows - 2), r(1, rows)
        if e <= b then e = b + 1 end
        local nodes = {
            { op = "Slice", inputs = { "x", "st", "en" }, outputs = { "y" } },
            { op = "Slice", inputs = { "k", "kst", "ken", "kax", "kstep" }, outputs = { "ks" } },
            { op = "Cast", inputs = { "ks" }, outputs = { "kf" }, attrs = { to = { i = 1 } } },
        }
        local inits = {
            { name = "st", type = "INT64", shape = { 1 }, values = { b - rows } },
            { name = "en", type = "INT64", shape = { 1 }, values = { e == rows and 1000 or e } },
            { name = "k", type = "INT64", shape = { 7 }, values = { 10, 11, 12, 13, 14, 15, 16 } },
            { name = "kst", type = "INT64", shape = { 1 }, values = { -1 } },
            { name = "ken", type = "INT64", shape = { 1 }, values = { 0 } },
            { name = "kax", type = "INT64", shape = { 1 }, values = { 0 } },
            { name = "kstep", type = "INT64", shape = { 1 }, values = { -2 } },
        }
        run_case({
            desc = graph(nodes, { O.vi("x", { rows, cols }) }, { O.vi("y", nil), O.vi("kf", nil) }, inits),
            feeds = { x = x },
            want = { y = R.slice(xr, b, e), kf = ref_of({ 3 }, { 16, 14, 12 }) },
        })
    end)

    guarded("PyTorch's Shape, Gather, Unsqueeze, Concat, Reshape folds to one reshape", function()
        local B, T, C = r(1, 3), r(1, 4), r(2, 6)
        local x, xr = H.rand({ B, T, C })
        local nodes = {
            { op = "Shape", inputs = { "x" }, outputs = { "s" } },
            { op = "Gather", inputs = { "s", "zero" }, outputs = { "b" }, attrs = { axis = { i = 0 } } },
            { op = "Unsqueeze", inputs = { "b", "ax0" }, outputs = { "b1" } },
            { op = "Concat", inputs = { "b1", "minus1" }, outputs = { "shape" }, attrs = { axis = { i = 0 } } },
            { op = "Reshape", inputs = { "x", "shape" }, outputs = { "y" } },
        }
        local inits = {
            { name = "zero", type = "INT64", shape = {}, values = { 0 } },
            { name = "ax0", type = "INT64", shape = { 1 }, values = { 0 } },
            { name = "minus1", type = "INT64", shape = { 1 }, values = { -1 } },
        }
        local m = run_case({
            desc = graph(nodes, { O.vi("x", { "batch", T, C }) }, { O.vi("y", nil) }, inits),
            opts = { shapes = { x = { B, T, C } } },
            feeds = { x = x }, want = { y = R.reshape(xr, { B, T * C }) },
        })
        assert.matches("ReshapeNode%(%$1, %[" .. B .. ", " .. T * C .. "%]%)", m.source)
        assert.is_nil(m.source:find("ConstantTensor"))
        -- the symbolic dim left unfixed is an error naming it
        expect_error(graph(nodes, { O.vi("x", { "batch", T, C }) }, { O.vi("y", nil) }, inits),
            "input 'x' dim 0 is symbolic %('batch'%)")
    end)

    guarded("inputs and outputs keep their ONNX names; odd ones get script names", function()
        local x, xr = H.rand({ 2, 3 })
        local m = run_case({
            desc = graph({ { op = "Relu", inputs = { "input.1" }, outputs = { "/out:0" } } },
                { O.vi("input.1", { 2, 3 }) }, { O.vi("/out:0", nil) }),
            feeds = { ["input.1"] = x }, want = { ["/out:0"] = R.relu(xr) },
        })
        assert.are.equal("input.1", m:inputs()[1].name)
        assert.are.equal("/out:0", m:outputs()[1].name)
        local ok, err = pcall(m.run, m, { nope = x })
        assert.is_false(ok)
        assert.matches("unknown input 'nope' %(the model takes input.1%)", err)
    end)

    guarded("outputs that are an input, a folded shape, one value twice", function()
        local shape = { r(1, 4), r(1, 5) }
        local x, xr = H.rand(shape)
        local _, outs = run_case({
            desc = graph({ { op = "Identity", inputs = { "x" }, outputs = { "y" } },
                           { op = "Shape", inputs = { "x" }, outputs = { "k" } },
                           { op = "Identity", inputs = { "y" }, outputs = { "y2" } } },
                { O.vi("x", shape) },
                { O.vi("x", nil), O.vi("y", nil), O.vi("k", nil, "INT64"), O.vi("y2", nil) }),
            feeds = { x = x }, want = { x = xr, y = xr, y2 = xr },
        })
        assert.are.same(shape, H.ref(outs.k).data)
    end)

    guarded("external data in the model's folder is mapped; outside it is an error", function()
        local _, wr = H.rand({ 3, 2 })
        local x, xr = H.rand({ 2, 3 })
        local w = O.init("w", wr)
        w.external = { location = "w.bin", write = true, offset = 16 }
        run_case({
            desc = graph({ { op = "MatMul", inputs = { "x", "w" }, outputs = { "y" } } },
                { O.vi("x", { 2, 3 }) }, { O.vi("y", nil) }, { w }),
            feeds = { x = x }, want = { y = matmul(xr, wr) },
        })
        local out = O.init("w", wr)
        out.external = { location = "../outside.bin" }
        expect_error(graph({ { op = "MatMul", inputs = { "x", "w" }, outputs = { "y" } } },
            { O.vi("x", { 2, 3 }) }, { O.vi("y", nil) }, { out }),
            "file error: .*initializer 'w': external data '%.%./outside.bin' is not a file inside")
    end)
end)

describe("ONNX import on CUDA", function()
    local gpu_it = H.gpu(it, function(why) pending(why) end)
    gpu_it("gives the CPU's results for an MLP, a batched MatMul and a Gather", function()
        local why = skip_reason()
        if why then return pending(why) end
        local B, I, Hd, V = r(1, 8), r(2, 64), r(2, 128), r(2, 50)
        local _, w1 = H.rand({ Hd, I })
        local _, b1 = H.rand({ Hd })
        local _, tbl = H.rand({ V, I })
        local path = O.write(graph({
            { op = "Gather", inputs = { "table", "ids" }, outputs = { "e" } },
            { op = "Add", inputs = { "x", "e" }, outputs = { "xe" } },
            { op = "Gemm", inputs = { "xe", "w1", "b1" }, outputs = { "h" }, attrs = { transB = { i = 1 } } },
            { op = "Tanh", inputs = { "h" }, outputs = { "t" } },
            { op = "Softmax", inputs = { "t" }, outputs = { "p" } },
            { op = "Transpose", inputs = { "h" }, outputs = { "ht" } },
            { op = "MatMul", inputs = { "h", "ht" }, outputs = { "g" } } },
            { O.vi("x", { B, I }), O.vi("ids", { B }, "INT64") }, { O.vi("p", nil), O.vi("g", nil) },
            { O.init("w1", w1), O.init("b1", b1), O.init("table", tbl) }))
        local feeds = { x = H.rand({ B, I }), ids = H.randint({ B }, 0, V - 1) }
        local cpu = mk.load_onnx(path):run(feeds)
        local gpu = mk.load_onnx(path, { device = "cuda" }):run(feeds)
        H.assert_close(gpu.p, H.ref(cpu.p), 1e-5, 1e-4)
        H.assert_close(gpu.g, H.ref(cpu.g), 1e-4, 1e-4)
    end)
end)

describe("ONNX import refuses", function()
    local function guarded(name, body)
        it(name, function()
            local why = skip_reason()
            if why then return pending(why) end
            body()
        end)
    end
    local relu = graph({ { op = "Relu", inputs = { "x" }, outputs = { "y" } } },
        { O.vi("x", { 2, 3 }) }, { O.vi("y", nil) })

    guarded("truncated files and fields of the wrong type", function()
        local path = O.write(relu, "whole")
        local bytes = H.read_file(path)
        for _, cut in ipairs({ #bytes - 3, #bytes // 2, 5 }) do
            local p = O.dir .. "/cut.onnx"
            local f = assert(io.open(p, "wb"))
            f:write(bytes:sub(1, cut))
            f:close()
            local ok, err = pcall(mk.load_onnx, p)
            assert.is_false(ok)
            assert.matches("file error: .*cut.onnx: ", err)
        end
        -- ModelProto.graph (7) as a varint, not a message
        local p = O.dir .. "/wire.onnx"
        local f = assert(io.open(p, "wb"))
        f:write("\x08\x08\x38\x05")
        f:close()
        local ok, err = pcall(mk.load_onnx, p)
        assert.is_false(ok)
        assert.matches("file error: .*wire.onnx: not an ONNX model", err)
        -- an attribute of the wrong type
        expect_error(graph({ { op = "Softmax", inputs = { "x" }, outputs = { "y" }, name = "s",
                               attrs = { axis = { f = 1.5 } } } },
            { O.vi("x", { 2, 3 }) }, { O.vi("y", nil) }),
            "ONNX node 's' %(Softmax, opset 17%): attribute 'axis' is FLOAT, Softmax takes INT")
    end)

    guarded("a missing initializer, a cycle, duplicate names, huge dims", function()
        expect_error(graph({ { op = "Add", inputs = { "x", "w" }, outputs = { "y" }, name = "a" } },
            { O.vi("x", { 2 }) }, { O.vi("y", nil) }),
            "name error: .*ONNX node 'a' %(Add%): input 'w' is not defined")
        expect_error(graph({ { op = "Add", inputs = { "x", "q" }, outputs = { "p" }, name = "a" },
                             { op = "Relu", inputs = { "p" }, outputs = { "q" }, name = "b" } },
            { O.vi("x", { 2 }) }, { O.vi("p", nil) }), "is on a cycle")
        local _, wr = H.rand({ 2 })
        expect_error(graph({ { op = "Add", inputs = { "x", "w" }, outputs = { "y" } } },
            { O.vi("x", { 2 }) }, { O.vi("y", nil) }, { O.init("w", wr), O.init("w", wr) }),
            "initializer 'w': the name is defined twice")
        expect_error(graph({ { op = "Relu", inputs = { "x" }, outputs = { "y" } },
                             { op = "Relu", inputs = { "x" }, outputs = { "y" } } },
            { O.vi("x", { 2 }) }, { O.vi("y", nil) }), "output 'y' is defined twice")
        expect_error(graph({ { op = "Relu", inputs = { "x" }, outputs = { "y" } } },
            { O.vi("x", { 1 << 30, 1 << 30 }) }, { O.vi("y", nil) }), "shape error: .*2%^48")
        -- a Reshape whose shape's element count overflows int64 (onnx_fuzz found
        -- it as undefined behaviour in the count): a shape error
        expect_error(graph({ { op = "Reshape", inputs = { "x", "s" }, outputs = { "y" }, name = "r" } },
            { O.vi("x", { 2 }) }, { O.vi("y", nil) },
            { { name = "s", type = "INT64", shape = { 2 }, values = { 1 << 62, 4 } } }),
            "shape error: .*'r' %(Reshape.*overflows at dim 1")
        local huge = { name = "w", type = "FLOAT", shape = { 1 << 40, 1 << 20 }, values = {}, raw = true }
        huge.values = nil
        huge.raw = nil
        huge.external = { location = "none.bin" }
        expect_error(graph({ { op = "Add", inputs = { "x", "w" }, outputs = { "y" } } },
            { O.vi("x", { 2 }) }, { O.vi("y", nil) }, { huge }), "shape error: .*2%^48 elements")
        -- a shape of 2^36 elements and no values at all: refused before its
        -- 256 GiB are asked for (onnx_fuzz found the allocation)
        local empty = { name = "w", type = "FLOAT", shape = { 1 << 30, 64 }, values = {}, unchecked = true }
        expect_error(graph({ { op = "Add", inputs = { "x", "w" }, outputs = { "y" } } },
            { O.vi("x", { 2 }) }, { O.vi("y", nil) }, { empty }),
            "file error: .*initializer 'w' has 0 values, its shape %[1073741824, 64%] needs 68719476736")
    end)

    guarded("unsupported ops, attributes, opsets and domains, naming the node", function()
        expect_error(graph({ { op = "GRU", inputs = { "x", "x" }, outputs = { "y" }, name = "c1" } },
            { O.vi("x", { 2, 3 }) }, { O.vi("y", nil) }),
            "ONNX node 'c1' %(GRU, opset 17%): GRU is not supported")
        expect_error(graph({ { op = "Flatten", inputs = { "x" }, outputs = { "y" }, name = "f",
                               attrs = { axes = { i = 1 } } } },
            { O.vi("x", { 2, 3 }) }, { O.vi("y", nil) }),
            "ONNX node 'f' %(Flatten, opset 17%): attribute 'axes' is not supported %(Flatten takes axis%)")
        local old = graph(relu.nodes, relu.inputs, relu.outputs, {}, 12)
        expect_error(old, "ONNX opset 12 is not supported %(13 to 21%)")
        expect_error(graph(relu.nodes, relu.inputs, relu.outputs, {}, 22),
            "ONNX opset 22 is not supported %(13 to 21%)")
        for _, opset in ipairs({ 13, 21 }) do
            local m = mk.load_onnx(O.write(graph(relu.nodes, relu.inputs, relu.outputs, {}, opset)))
            assert.are.equal(opset, m.opset)
        end
        expect_error(graph({ { op = "Gather", inputs = { "x", "i" }, outputs = { "y" }, name = "g",
                               attrs = { axis = { i = 1 } } } },
            { O.vi("x", { 2, 3 }), O.vi("i", { 2 }, "FLOAT") }, { O.vi("y", nil) }),
            "ONNX node 'g' %(Gather, opset 17%): indices must be INT64 or INT32, not FLOAT")
        expect_error(graph({ { op = "Concat", inputs = { "x", "z" }, outputs = { "y" }, name = "cc",
                               attrs = { axis = { i = 0 } } } },
            { O.vi("x", { 2, 3 }), O.vi("z", { 2, 4 }) }, { O.vi("y", nil) }),
            "shape error: .*ONNX node 'cc' %(Concat, opset 17%)")
        -- found by onnx_fuzz: an output the op does not give was an internal error
        expect_error(graph({ { op = "Relu", inputs = { "x" }, outputs = { "y", "z" }, name = "r2" } },
            { O.vi("x", { 2, 3 }) }, { O.vi("y", nil) }),
            "argument error: .*ONNX node 'r2' %(Relu, opset 17%): output 2 %('z'%) is not one Relu gives")
        expect_error(graph(relu.nodes, { O.vi("x", { 2, 3 }, "DOUBLE") }, relu.outputs),
            "dtype error: .*input 'x' is DOUBLE")
    end)
end)

describe("doc/onnx.md", function()
    it("holds the table scripts/onnx_ops.lua makes from the mapping table", function()
        if not imported() then return pending("moonkaas was built without protobuf-c") end
        local p = assert(io.popen("lua5.4 scripts/onnx_ops.lua 2>&1"))
        local want = p:read("a")
        p:close()
        local doc = H.read_file("doc/onnx.md")
        local b = doc:find("<!-- ops table: generated by scripts/onnx_ops.lua from core/onnx/onnx_ops.c -->\n", 1, true)
        local e = doc:find("<!-- end of the ops table -->", 1, true)
        assert.truthy(b and e, "doc/onnx.md has lost its markers")
        local got = doc:sub(doc:find("\n", b, true) + 1, e - 1)
        assert.are.equal(want, got, "doc/onnx.md is stale: lua scripts/onnx_ops.lua --write doc/onnx.md")
        for _, row in ipairs(mk.onnx_ops()) do assert.truthy(got:find("| " .. row.op_type .. " |", 1, true)) end
    end)
end)
