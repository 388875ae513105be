-- Bad input to the batch's ops (issue 68): replace_at, and the prefix of
-- sliced_softmax and matmul_prefix as one value a run of the first axis (their
-- values are spec/cases/batch.lua's, on the CPU in ops_spec and CUDA in
-- gpu_spec); and sample with a temperature and top-p a row, against a
-- SampleNode a row on the same device.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("batch_ops_spec")
local gpu_it = H.gpu(it, function(why) pending(why) end)

local function i64(list) return mk.tensor(list, "int64") end

describe("replace_at", function()
    local x = function() return mk.buffer("float32", { 3, 2, 5, 4 }) end
    local r = mk.input("r", "float32", { 3, 2, 4 })
    local idx = mk.input("idx", "int64", { 3 })

    it("refuses shapes, dtypes and axes that do not fit, naming the line", function()
        H.assert_error(function() x():replace_at(r, idx, 0) end,
            "shape error: ReplaceAtNode: axis 0 of [3, 2, 5, 4] is the one the index runs along")
        H.assert_error(function() x():replace_at(r, idx, 4) end, "shape error: ReplaceAtNode: axis 4 is out of range")
        H.assert_error(function() x():replace_at(r, idx, 1) end,
            "shape error: ReplaceAtNode: r [3, 2, 4] is not x [3, 2, 5, 4] without axis 1")
        H.assert_error(function() x():replace_at(r, mk.input("i", "int64", { 4 }), 2) end,
            "shape error: ReplaceAtNode: the index ('i') must be int64 [3], not int64 [4]")
        H.assert_error(function() x():replace_at(r, mk.input("i", "float32", { 3 }), 2) end,
            "shape error: ReplaceAtNode: the index ('i') must be int64 [3], not float32 [3]")
        H.assert_error(function() x():replace_at(mk.input("r", "int64", { 3, 2, 4 }), idx, 2) end,
            "dtype error: ReplaceAtNode: cannot write int64 into float32")
        H.assert_error(function() mk.compile(mk.constant(mk.zeros("float32", { 3, 2, 5, 4 }), "c"):replace_at(r, idx, 2)) end,
            "argument error: ReplaceAtNode cannot write into the constant 'c'")
    end)

    it("an index outside the axis is an evaluation error that writes nothing; the model goes on", function()
        local model = mk.compile(x():replace_at(r, idx, 2))
        local rt = H.rand({ 3, 2, 4 })
        for _, bad in ipairs({ { 0, 5, 1 }, { -1, 0, 0 } }) do
            H.assert_error(function() model:run({ r = rt, idx = i64(bad) }) end,
                string.format("evaluation error: ReplaceAtNode: index %d at position %d of 'idx' is outside [0, 5)",
                    bad[2] == 5 and 5 or -1, bad[2] == 5 and 1 or 0), "(script:")
        end
        local out = model:run({ r = rt, idx = i64({ 4, 0, 2 }) })
        local nonzero = 0
        for i = 1, 3 do for h = 1, 2 do for s = 1, 5 do for e = 1, 4 do
            if out:get(i, h, s, e) ~= 0 then nonzero = nonzero + 1 end
        end end end end
        assert.are.equal(3 * 2 * 4, nonzero) -- the failed runs wrote nothing
        assert.are.equal(rt:get(2, 1, 3), out:get(2, 1, 1, 3))
        assert.are.equal(rt:get(1, 2, 4), out:get(1, 2, 5, 4))
    end)
end)

describe("a prefix a run", function()
    it("must be int64 [1], or [N] with N dividing the first axis", function()
        local x = mk.input("x", "float32", { 6, 3, 5 })
        H.assert_error(function() x:sliced_softmax(mk.input("p", "int64", { 4 })) end,
            "shape error: SlicedSoftmaxNode: prefix ('p') must have shape [1], or [N] with N dividing 6")
        H.assert_error(function() mk.input("v", "float32", { 5 }):sliced_softmax(mk.input("p", "int64", { 2 })) end,
            "shape error: SlicedSoftmaxNode: prefix ('p') must have shape [1], not [2]")
        H.assert_error(function() x:sliced_softmax(mk.input("p", "float32", { 3 })) end,
            "dtype error: SlicedSoftmaxNode: prefix ('p') must be int64, not float32")
        local a, b = mk.input("a", "float32", { 3, 5 }), mk.input("b", "float32", { 5, 2 })
        H.assert_error(function() a:matmul_prefix(b, mk.input("p", "int64", { 3 })) end,
            "shape error: PrefixMatMulNode: the prefix ('p') must have shape [1], not [3]")
        H.assert_error(function() x:matmul_prefix(mk.input("y", "float32", { 6, 5, 2 }), mk.input("p", "int64", { 4 })) end,
            "shape error: PrefixMatMulNode: the prefix ('p') must have shape [1], or [N] with N dividing 6")
    end)

    it("a value out of range is an evaluation error naming it; the model goes on", function()
        local x, y = mk.input("x", "float32", { 4, 2, 5 }), mk.input("y", "float32", { 4, 5, 3 })
        local p = mk.input("p", "int64", { 2 })
        local soft = mk.compile(x:sliced_softmax(p))
        local prod = mk.compile(x:matmul_prefix(y, p))
        local xt, yt = H.rand({ 4, 2, 5 }), H.rand({ 4, 5, 3 })
        H.assert_error(function() soft:run({ x = xt, p = i64({ 2, 6 }) }) end,
            "evaluation error: SlicedSoftmaxNode: prefix 6 ('p') is outside [0, 5]", "(script:")
        H.assert_error(function() prod:run({ x = xt, y = yt, p = i64({ -1, 5 }) }) end,
            "evaluation error: PrefixMatMulNode: prefix -1 ('p') is outside [0, 5]", "(script:")
        -- runs of two batches: the first at 0 (zeros), the second over all 5
        local out = prod:run({ x = xt, y = yt, p = i64({ 0, 5 }) })
        assert.are.equal(0, out:get(2, 2, 3))
        local want = 0.0
        for q = 1, 5 do want = want + xt:get(3, 1, q) * yt:get(3, q, 2) end
        assert.is_true(math.abs(out:get(3, 1, 2) - want) <= 1e-5 * (1 + math.abs(want)))
        local s = soft:run({ x = xt, p = i64({ 5, 1 }) })
        assert.are.equal(1, s:get(4, 2, 1)) -- a prefix of 1: e^0 / e^0
        assert.are.equal(xt:get(4, 2, 2), s:get(4, 2, 2)) -- past the prefix: unchanged
    end)
end)

describe("sample with a temperature and top-p a row", function()
    local rows, n = 5, 300
    local temps = { 0, 1, 0.7, 1.3, 1 }
    local topps = { 0.9, 0.9, 0.5, 0, 0.95 }
    -- each row drawn by a SampleNode of its own, its temperature and top-p [1]
    local function one_by_one(device, xt, states)
        local x = mk.input("x", "float32", { 1, n })
        local st, t, p = mk.input("s", "int64", { 1, 1 }), mk.input("t", "float32", { 1 }), mk.input("p", "float32", { 1 })
        local m <close> = mk.compile(x:sample(st, t, p), { device = device })
        local want = {}
        for r = 1, rows do
            local row = mk.zeros("float32", { 1, n })
            for j = 1, n do row:set(1, j, xt:get(r, j)) end
            local out = m:run({ x = row, s = mk.tensor({ { states[r] } }, "int64"), t = mk.tensor({ temps[r] }),
                                p = mk.tensor({ topps[r] }) })
            want[r] = { out:get(1, 1), out:get(1, 2) }
        end
        return want
    end
    local function check(device)
        local xt = H.rand({ rows, n }, -4, 4)
        local states = {}
        for r = 1, rows do states[r] = math.random(1, 2 ^ 40) end
        local x = mk.input("x", "float32", { rows, n })
        local st = mk.input("s", "int64", { rows, 1 })
        local t, p = mk.input("t", "float32", { rows }), mk.input("p", "float32", { rows })
        local m <close> = mk.compile(x:sample(st, t, p), { device = device })
        local sv = {}
        for r = 1, rows do sv[r] = { states[r] } end
        local out = m:run({ x = xt, s = mk.tensor(sv, "int64"), t = mk.tensor(temps), p = mk.tensor(topps) })
        local want = one_by_one(device, xt, states)
        for r = 1, rows do
            assert.are.same(want[r], { out:get(r, 1), out:get(r, 2) }, "row " .. r)
        end
    end

    it("draws each row as a SampleNode of that row alone does (CPU)", function() check("cpu") end)

    it("refuses a temperature or top-p neither [1] nor a row each", function()
        local x, st = mk.input("x", "float32", { 3, 8 }), mk.input("s", "int64", { 3, 1 })
        H.assert_error(function() x:sample(st, mk.input("t", "float32", { 2 }), mk.input("p", "float32", { 1 })) end,
            "shape error: SampleNode: the temperature ('t') must have shape [1], not [2]")
        H.assert_error(function() x:sample(st, mk.input("t", "float32", { 3 }), mk.input("p", "int64", { 3 })) end,
            "dtype error: SampleNode: top-p ('p') must be float32, not int64")
    end)

    gpu_it("draws each row as a SampleNode of that row alone does (CUDA)", function() check("cuda") end)
end)
