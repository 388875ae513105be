-- Bad inputs of the shape and data-movement ops (issue 64): each is refused
-- when the node is built, with a kind prefix, both shapes where two disagree,
-- and the user's Lua line first. Values are checked by spec/cases/shape.lua.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("shape_spec")

-- f() must raise "<this file>:<line>: <prefix>..." mentioning each string:
-- the line is the one that built the node (the caller's, not the module's;
-- f builds it in a statement, not a tail call, which would leave no frame).
local function E(line, f, prefix, ...)
    local err = H.assert_error(f, prefix, ...)
    local ok, e = pcall(f)
    assert(not ok)
    local where = tostring(e):match("^(.-%.lua:%d+): ")
    assert.is_truthy(where, "no Lua line in " .. tostring(e))
    assert.are.equal("shape_spec.lua:" .. line, where:match("[^/]*$"))
    return err
end
local function here() return debug.getinfo(2, "l").currentline end

describe("matmul", function()
    it("names both shapes when the inner dims differ", function()
        local a, b = mk.input("a", { 2, 3, 4 }), mk.input("b", { 5, 6 })
        local line = here(); E(line, function() local _ = a:matmul(b) end, "shape error: MatMulNode:",
            "[2, 3, 4]", "[5, 6]", "inner dims differ (4 and 5")
        local v = mk.input("v", { 3 })
        line = here(); E(line, function() local _ = a:matmul(v) end, "shape error:", "[2, 3, 4]", "[3]")
    end)

    it("refuses batch dims that do not broadcast", function()
        local a, b = mk.input("a", { 2, 3, 4 }), mk.input("b", { 3, 4, 5 })
        local line = here(); E(line, function() local _ = a:matmul(b) end, "shape error: MatMulNode:",
            "batch dims", "[2, 3, 4]", "[3, 4, 5]")
    end)

    it("takes float32 activations only", function()
        local a, b = mk.input("a", "int64", { 2, 3 }), mk.input("b", { 3, 2 })
        local line = here(); E(line, function() local _ = a:matmul(b) end, "dtype error:", "int64")
    end)

    it("keeps PrefixMatMul to HamKaas's forms", function()
        local a, b = mk.input("a", { 2, 3, 4 }), mk.input("b", { 4, 5 })
        local line = here(); E(line, function() local _ = a:matmul_prefix(b, 2) end,
            "shape error: PrefixMatMulNode:", "[2, 3, 4]", "[4, 5]")
    end)
end)

describe("axes", function()
    local x = mk.input("x", { 2, 3, 4 })
    local ids = mk.input("ids", "int64", { 2, 3, 4 })
    for _, c in ipairs({
        { "slice_axis", function() return x:slice_axis(3, 0, 1) end },
        { "slice_axis", function() return x:slice_axis(-4, 0, 1) end },
        { "squeeze", function() return x:squeeze(5) end },
        { "unsqueeze", function() return x:unsqueeze(4) end },
        { "flatten", function() return x:flatten(0, 3) end },
        { "flip", function() return x:flip(-4) end },
        { "concat", function() return x:concat(x, 3) end },
        { "pad", function() return x:pad(3, 1, 1) end },
        { "repeat_interleave", function() return x:repeat_interleave(2, 7) end },
        { "gather", function() return x:gather(ids, 3) end },
        { "index_select", function() return x:index_select(mk.input("i", "int64", { 2 }), -5) end },
        { "cumsum", function() return x:cumsum(3) end },
    }) do
        it(c[1] .. " refuses an axis out of range", function()
            H.assert_error(c[2], "shape error:", "out of range for [2, 3, 4]")
        end)
    end
end)

describe("bad inputs", function()
    local x = mk.input("x", { 2, 3, 4 })

    it("concat of mismatched shapes names both", function()
        local y = mk.input("y", { 2, 5, 4 })
        local line = here(); E(line, function() local _ = x:concat(y, 0) end, "shape error: ConcatNode:",
            "[2, 3, 4]", "[2, 5, 4]", "axis 0")
        assert.are.same({ 2, 8, 4 }, x:concat(y, 1).shape)
        local z = mk.input("z", { 2, 3 })
        H.assert_error(function() return mk.concat({ x, z }, 0) end, "shape error:", "[2, 3]")
        H.assert_error(function() return x:concat(mk.input("i", "int64", { 2, 3, 4 }), 0) end,
            "dtype error:", "float32 and int64")
    end)

    it("gather and index_select take int64 indices only", function()
        local f = mk.input("f", { 2, 3, 4 })
        local line = here(); E(line, function() local _ = x:gather(f, 1) end, "dtype error: GatherElementsNode:",
            "int64", "float32")
        line = here(); E(line, function() local _ = x:index_select(mk.input("i", "float32", { 2 }), 1) end,
            "dtype error: IndexSelectNode:", "must be int64")
        H.assert_error(function() return x:gather(mk.input("g", "int64", { 2, 4, 4 }), 2) end,
            "shape error:", "[2, 4, 4]", "no larger dim")
        H.assert_error(function() return x:gather(mk.input("g", "int64", { 2, 3 }), 1) end,
            "shape error:", "rank")
        H.assert_error(function()
            return mk.input("y", { 2, 2, 2, 2, 2, 2 }):index_select(mk.input("g", "int64", { 2, 2 }), 1)
        end, "shape error:", "rank 7")
    end)

    it("refuses empty slices and steps that are not positive", function()
        H.assert_error(function() return x:slice_axis(1, 2, 2) end, "shape error:", "empty")
        H.assert_error(function() return x:slice_axis(1, 5, 9) end, "shape error:", "empty")
        H.assert_error(function() return x:slice_axis(1, 0, 3, 0) end, "shape error:", "positive")
        H.assert_error(function() return x:slice_axis(1, 3, 0, -1) end, "shape error:", "positive")
    end)

    it("squeeze, flatten, expand, tile and repeats check their shapes", function()
        H.assert_error(function() return x:squeeze(1) end, "shape error:", "axis 1 of [2, 3, 4] is 3")
        H.assert_error(function() return mk.input("v", { 1 }):squeeze(0) end, "shape error:", "rank 0")
        H.assert_error(function() return mk.input("w", { 1, 1, 1, 1, 1, 1 }):unsqueeze(0) end,
            "shape error:", "rank 7")
        assert.are.same({ 1, 2, 3, 4, 1 }, x:unsqueeze(0):unsqueeze(-1).shape)
        H.assert_error(function() return x:flatten(2, 1) end, "shape error:", "comes after")
        H.assert_error(function() return x:expand({ 2, 6, 4 }) end, "shape error:",
            "[2, 3, 4] does not broadcast to [2, 6, 4]")
        H.assert_error(function() return x:expand({ 3, 4 }) end, "shape error:", "[3, 4]")
        H.assert_error(function() return x:tile({ 1, 0 }) end, "shape error:", "positive")
        H.assert_error(function() return x:tile({ 1, 1, 1, 1, 1, 1, 2 }) end, "shape error:")
        H.assert_error(function() return x:repeat_interleave(0, 1) end, "shape error:", "positive")
    end)

    it("pad checks its mode, pads and value", function()
        H.assert_error(function() return x:pad(2, 4, 0, "reflect") end, "shape error:",
            "reflect pads 4 and 0 must be below axis 2's 4")
        H.assert_error(function() return x:pad(2, -1, 0) end, "shape error:", "negative")
        H.assert_error(function() return x:pad(2, 1, 1, "wrap") end, "argument error: pad:", "wrap")
        H.assert_error(function() return x:pad_axis(mk.input("v", "int64", { 1 }), 0, 1, 1, 0) end,
            "dtype error:", "float32 [1]")
        H.assert_error(function() return x:pad_axis(mk.tensor({ 0 }, "float32", { 1 }), 0, 1, 1, 3) end,
            "argument error:", "mode 3")
    end)

    it("cumsum takes float32 and int64", function()
        H.assert_error(function() return mk.input("h", "float16", { 4 }):cumsum(0) end,
            "dtype error: CumsumNode", "float16")
    end)

    it("split checks its sizes", function()
        H.assert_error(function() return x:split(2, 1) end, "shape error: split:", "2 parts")
        H.assert_error(function() return x:split({ 1, 1 }, 1) end, "shape error: split:", "add up to 2")
    end)
end)

describe("run-time indices", function()
    it("an index out of range is an evaluation error naming the node, on every call", function()
        local x = mk.input("x", { 3, 4 })
        local ids = mk.input("ids", "int64", { 2 })
        local m = mk.compile({ x:index_select(ids, 0) })
        local xt = H.rand({ 3, 4 })
        H.assert_error(function() return m:run({ x = xt, ids = mk.tensor({ 0, 3 }, "int64", { 2 })}) end,
            "evaluation error:", "IndexSelectNode")
        H.assert_error(function() return m:run({ x = xt, ids = mk.tensor({ -4, 0 }, "int64", { 2 })}) end,
            "evaluation error:", "IndexSelectNode")
        -- the model stays usable
        local out = m:run({ x = xt, ids = mk.tensor({ -1, 0 }, "int64", { 2 }) })
        assert.are.equal(xt:get(9), out:get(1))

        local g = mk.compile(x:gather(mk.input("g", "int64", { 3, 1 }), 1))
        H.assert_error(function() return g:run({ x = xt, g = mk.tensor({ 0, 4, 1 }, "int64", { 3, 1 }) }) end,
            "evaluation error:", "GatherElementsNode")
    end)
end)

describe("views", function()
    -- one launch: the product reads the slice, expand or squeeze in place
    local function launches(y) return mk.compile(y):stats().launches end

    it("a strided slice, an expand and a squeeze read by matmul stay views", function()
        local a, b = mk.input("a", { 8, 4 }), mk.input("b", { 4, 3 })
        local v = mk.input("v", { 1, 5, 4 })
        assert.are.equal(1, launches(a:slice_axis(0, 1, 8, 2):matmul(b)))
        assert.are.equal(1, launches(v:expand({ 3, 5, 4 }):matmul(b)))
        assert.are.equal(1, launches(v:squeeze(0):unsqueeze(0):flatten(0, 1):matmul(b)))
        -- a relu reads dense memory only: the slice is copied first
        assert.are.equal(2, launches(a:slice_axis(0, 1, 8, 2):relu()))
        -- and the values are the same either way
        local at, bt = H.rand({ 8, 4 }), H.rand({ 4, 3 })
        local view = mk.compile(a:slice_axis(0, 1, 8, 2):matmul(b)):run({ a = at, b = bt })
        local copy = mk.compile(a:slice_axis(0, 1, 8, 2):relu():matmul(b)):run({ a = at, b = bt })
        local plain = mk.compile((a:slice_axis(0, 1, 8, 2) * 1):matmul(b)):run({ a = at, b = bt })
        H.assert_close(view, H.ref(plain), 0, 0)
        assert.are.same({ 4, 3 }, copy.shape)
    end)
end)

describe("scripts", function()
    it("writes and reads the new rows by name", function()
        local x = mk.input("x", { 2, 3, 4 })
        local y = x:slice_axis(2, 1, 4, 2):flip(0):unsqueeze(0):squeeze(0):flatten(1, 2)
        local text = mk.script(y)
        assert.truthy(text:find("SliceAxisNode(", 1, true))
        assert.truthy(text:find("FlattenNode(", 1, true))
        local m = mk.compile_script(text)
        local xt = H.rand({ 2, 3, 4 })
        local out = m:run({ x = xt })
        assert.are.same({ 2, 6 }, out.shape)
        -- out[0, 0] = x[1, 0, 1]
        assert.are.equal(xt:get(2, 1, 2), out:get(1, 1))
    end)

    it("keeps HamKaas's SliceNode on the first axis", function()
        local m = mk.compile_script([[
$1 = InputTensor(x, float32, [4, 2]);
$2 = SliceNode($1, 1, 3);
result = $2;
]])
        local xt = H.rand({ 4, 2 })
        local out = m:run({ x = xt })
        assert.are.same({ 2, 2 }, out.shape)
        assert.are.equal(xt:get(2, 1), out:get(1, 1))
    end)
end)
