-- Every node on the CPU device against plain-Lua double-precision references,
-- on random shapes and values (spec/cases/, helpers.all_cases), plus run-time range errors.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("ops_spec")
local R = H.ref_ops

-- the one cross-device table: every op's cases, the random pointwise trees
-- and each family's file in spec/cases/
local cases = H.all_cases()

describe("CPU values", function()
    for _, case in ipairs(cases) do
        it(case.name, function()
            local model = mk.compile(case.output)
            H.check_case(model, case)
            model:close()
            -- optional passes off (every permute a copy, no views): the same values
            local plain = mk.compile(case.output, { passes = false })
            H.check_case(plain, case)
            plain:close()
        end)
    end

    it("views as the output: slice, reshape, permute", function()
        local x, xr = H.rand({ 5, 4 })
        local xi = mk.input("x", "float32", { 5, 4 })
        local b = math.random(0, 3)
        for _, c in ipairs({
            { xi:slice(b, 5), R.slice(xr, b, 5) },
            { xi:reshape({ 2, 10 }), R.reshape(xr, { 2, 10 }) },
            { xi:permute({ 1, 0 }), R.permute(xr, { 1, 0 }) },
            { xi:slice(b, b + 1):reshape({ 4 }), R.reshape(R.slice(xr, b, b + 1), { 4 }) },
        }) do
            local model = mk.compile(c[1])
            H.assert_close(model:run({ x = x }), c[2], 0, 0)
        end
    end)

    it("a constant alone is a network", function()
        local t, ref = H.rand({ 3, 2 })
        local model = mk.compile(mk.constant(t):relu())
        H.assert_close(model:run({}), R.relu(ref), 0, 0)
        H.assert_close(model:run(), R.relu(ref), 0, 0)
    end)

    it("argmax picks the first of equal maxima", function()
        local x = mk.input("x", "float32", { 2, 5 })
        local model = mk.compile(x:argmax())
        local out = model:run({ x = mk.tensor({ { 1, 7, 3, 7, 7 }, { -2, -2, -5, -3, -2 } }) })
        assert.are.same({ { 1 }, { 0 } }, out:totable())
    end)
end)

describe("run-time ranges", function()
    it("replace with node bounds out of range is an evaluation error", function()
        local x = mk.input("x", "float32", { 4, 2 })
        local r = mk.input("r", "float32", { 2, 2 })
        local b, e = mk.input("b", "int64", { 1 }), mk.input("e", "int64", { 1 })
        local model = mk.compile((x * 1):replace(r, b, e))
        local xt, rt = H.rand({ 4, 2 }), H.rand({ 2, 2 })
        local function run(bv, ev)
            return model:run({ x = xt, r = rt, b = mk.tensor({ bv }, "int64"), e = mk.tensor({ ev }, "int64") })
        end
        H.assert_error(function() run(3, 5) end, "evaluation error: ReplaceSliceNode: rows [3, 5) (begin 'b', end 'e') are out of range",
            "(script:")
        H.assert_error(function() run(-1, 1) end, "evaluation error:", "(script:")
        H.assert_error(function() run(0, 1) end, "evaluation error:", "(script:",
            "are 1 rows but the replacement 'r' has 2")
        -- the model stays usable
        H.assert_close(run(2, 4), R.replace(H.ref(xt), H.ref(rt), 2, 4), 0, 0)
    end)

    it("embedding ids out of range are an evaluation error", function()
        local t = mk.input("t", "float32", { 3, 2 })
        local ids = mk.input("ids", "int64", { 2 })
        local model = mk.compile(mk.embedding(t, ids))
        local tt = H.rand({ 3, 2 })
        H.assert_error(function() model:run({ t = tt, ids = mk.tensor({ 0, 3 }, "int64") }) end,
            "evaluation error: EmbeddingNode: id 3 at position 1 of 'ids'", "(script:")
        H.assert_error(function() model:run({ t = tt, ids = mk.tensor({ -1, 0 }, "int64") }) end,
            "evaluation error:", "(script:")
        H.assert_close(model:run({ t = tt, ids = mk.tensor({ 2, 1 }, "int64") }), R.embedding(H.ref(tt), { data = { 2, 1 } }), 0, 0)
    end)

    it("a matmul_prefix prefix out of range is an evaluation error, and a known one a compile error", function()
        local a = mk.input("a", "float32", { 2, 3 })
        local b = mk.input("b", "float32", { 3, 4 })
        local p = mk.input("p", "int64", { 1 })
        local model = mk.compile(a:matmul_prefix(b, p))
        local at, bt = H.rand({ 2, 3 }), H.rand({ 3, 4 })
        H.assert_error(function() model:run({ a = at, b = bt, p = mk.tensor({ 4 }, "int64") }) end,
            "evaluation error: PrefixMatMulNode: prefix 4 ('p') is outside [0, 3]", "(script:")
        H.assert_error(function() model:run({ a = at, b = bt, p = mk.tensor({ -1 }, "int64") }) end,
            "evaluation error:", "(script:")
        H.assert_close(model:run({ a = at, b = bt, p = mk.tensor({ 2 }, "int64") }),
            R.matmul_prefix(H.ref(at), H.ref(bt), 2), 1e-6, 1e-5)
        H.assert_error(function() a:matmul_prefix(b, 5) end, "shape error: PrefixMatMulNode: prefix 5 is outside [0, 3]")
        H.assert_error(function() a:matmul_prefix(b, mk.input("q", "float32", { 1 })) end,
            "dtype error: PrefixMatMulNode: the prefix ('q') must be int64, not float32")
    end)

    it("a sliced_softmax prefix out of range is an evaluation error", function()
        local x = mk.input("x", "float32", { 2, 3 })
        local p = mk.input("p", "int64", { 1 })
        local model = mk.compile(x:sliced_softmax(p))
        local xt = H.rand({ 2, 3 })
        H.assert_error(function() model:run({ x = xt, p = mk.tensor({ 4 }, "int64") }) end,
            "evaluation error: SlicedSoftmaxNode: prefix 4 ('p')", "(script:")
        H.assert_error(function() model:run({ x = xt, p = mk.tensor({ -1 }, "int64") }) end,
            "evaluation error:", "(script:")
    end)

    it("a causal_softmax end outside [T, S] is an evaluation error, a known one a compile error", function()
        local x = mk.input("x", "float32", { 2, 3, 5 })
        local e = mk.input("e", "int64", { 1 })
        local model = mk.compile(x:causal_softmax(e))
        local xt = H.rand({ 2, 3, 5 })
        H.assert_error(function() model:run({ x = xt, e = mk.tensor({ 2 }, "int64") }) end,
            "evaluation error: CausalSoftmaxNode: end 2 ('e') is outside [3, 5]", "(script:")
        H.assert_error(function() model:run({ x = xt, e = mk.tensor({ 6 }, "int64") }) end,
            "evaluation error: CausalSoftmaxNode: end 6 ('e') is outside [3, 5]", "(script:")
        H.assert_close(model:run({ x = xt, e = mk.tensor({ 4 }, "int64") }), R.causal_softmax(H.ref(xt), 4),
            1e-6, 1e-5)
        H.assert_error(function() x:causal_softmax(6) end, "shape error: CausalSoftmaxNode: end 6 is outside [3, 5]")
        H.assert_error(function() mk.input("v", "float32", { 5 }):causal_softmax(1) end,
            "shape error: CausalSoftmaxNode:", "two axes or more")
        H.assert_error(function() mk.input("w", "float32", { 4, 3 }):causal_softmax(3) end,
            "shape error: CausalSoftmaxNode:", "more rows (4) than columns")
        H.assert_error(function() x:causal_softmax(mk.input("f", "float32", { 1 })) end,
            "dtype error: CausalSoftmaxNode: end ('f') must be int64")
    end)
end)
