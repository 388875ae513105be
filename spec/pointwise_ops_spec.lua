-- Issue 64's pointwise rows beyond their values (spec/cases/pointwise.lua has
-- those): dtype and broadcast errors at the user's Lua line, the bool dtype
-- from and to Lua and safetensors, Lua's operators (// where the host has
-- it), and how mixed bool programs group. Lua 5.1 and LuaJIT run it too.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("pointwise_ops_spec")

-- f's error, which must start with the line f is written on (one line, and
-- no tail call in it, or the line is gone) and then `prefix`, and hold each
-- of ...
local function E(prefix, f, ...)
    local i = debug.getinfo(f, "S")
    local at = i.short_src .. ":" .. i.linedefined .. ": "
    local ok, err = pcall(f)
    assert.is_false(ok, "expected an error: " .. prefix)
    err = tostring(err)
    assert.are.equal(at .. prefix, err:sub(1, #at + #prefix), err)
    for _, s in ipairs({ ... }) do assert.truthy(err:find(s, 1, true), err) end
    return err
end

describe("pointwise rows: bad input", function()
    local x = mk.input("x", "float32", { 4, 3 })
    local i = mk.input("i", "int64", { 4, 3 })
    local c = mk.input("c", "bool", { 4, 3 })

    it("dtype errors name the op, the dtype and the operand, at the user's line", function()
        E("dtype error: LogNode does not take int64 ('i')",
            function() local r = i:log(); return r end)
        E("dtype error: LogicalAndNode does not take float32 ('x')",
            function() local r = x:logical_and(c); return r end)
        E("dtype error: LogicalAndNode: operands differ in dtype (bool and float32)",
            function() local r = c:logical_and(x); return r end)
        E("dtype error: WhereNode: the condition ('x') must be bool, not float32",
            function() local r = mk.where(x, x, x); return r end)
        E("dtype error: WhereNode: operands differ in dtype (float32 and int64)",
            function() local r = mk.where(c, x, i); return r end)
        E("dtype error: LessNode: operands differ in dtype (float32 and int64)",
            function() local r = x:lt(i); return r end)
        -- floats only: the activations, whatever their expression; arithmetic refuses bool
        E("dtype error: leaky_relu: 0.01 is not an integer",
            function() local r = i:leaky_relu(); return r end)
        E("dtype error: LeakyReLUNode does not take int64",
            function() local r = i:leaky_relu(1); return r end)
        E("dtype error: PowNode does not take int64",
            function() local r = i:pow(i); return r end)
        E("dtype error: SumNode does not take bool",
            function() local r = c + c; return r end)
        E("dtype error: NegNode does not take bool",
            function() local r = -c; return r end)
        E("dtype error: ModNode: operands differ",
            function() local r = x % i; return r end)
    end)

    it("broadcast errors name the shapes, two operands or three", function()
        local y = mk.input("y", "float32", { 2, 3 })
        E("shape error: MinimumNode: [4, 3] does not broadcast with [2, 3]",
            function() local r = x:minimum(y); return r end, "axis 0 of the result: 4 and 2")
        local lo = mk.input("lo", "float32", { 4, 1 })
        local hi = mk.input("hi", "float32", { 2, 1 })
        E("shape error: ClampNode: [4, 3] does not broadcast with [2, 1]",
            function() local r = x:clamp(lo, hi); return r end, "axis 0 of the result: 4 and 2")
        local c2 = mk.input("c2", "bool", { 2 })
        E("shape error: WhereNode: [2] does not broadcast with [4, 3]",
            function() local r = mk.where(c2, x, x); return r end, "axis 1 of the result: 2 and 3")
        E("shape error: GreaterNode: [4, 3] does not broadcast with [2, 3]",
            function() local r = x:gt(y); return r end)
    end)

    it("arguments: scalars as numbers, gelu's forms, clamp's bounds, comparisons as methods", function()
        E("argument error: gelu: opts must be",
            function() local r = x:gelu { approximate = "exact" }; return r end)
        E("argument error: clamp: needs lo, hi or both",
            function() local r = x:clamp(); return r end)
        E("argument error: leaky_relu: argument #2 must be a node, tensor or number",
            function() local r = x:leaky_relu("a"); return r end)
        E("argument error: < (__lt):",
            function() return x < x end, "x:lt(y)")
        E("dtype error: ",
            function() local r = c:logical_and(1); return r end, "bool")
        -- the context stays usable after every error
        local m = mk.compile(x:clamp(-1, 1))
        local t = mk.tensor({ { -2, 0.5, 2 }, { 1, 1, 1 }, { 0, 0, 0 }, { 3, -3, 0.25 } })
        assert.are.same({ { -1, 0.5, 1 }, { 1, 1, 1 }, { 0, 0, 0 }, { 1, -1, 0.25 } }, m:run({ x = t }):totable())
    end)
end)

describe("the bool dtype", function()
    it("Lua tensors from and to booleans; script name bool", function()
        local t = mk.tensor({ { true, false }, { false, true } })
        assert.are.equal("bool", t.dtype)
        assert.are.equal(true, t:get(1, 1))
        assert.are.equal(false, t:get(1, 2))
        assert.are.same({ { true, false }, { false, true } }, t:totable())
        t:set(1, 2, true)
        assert.are.equal(true, t:get(1, 2))
        assert.are.equal(1, t:bytes():byte(2))
        local f = mk.tensor({ true, false, true }, "bool", { 3 })
        assert.are.same({ true, false, true }, f:totable())
        H.assert_error(function() local r = mk.tensor({ 1, 0 }, "bool", { 2 }); return r end,
            "argument error: tensor: element [1] is number, expected a boolean")
        local m = mk.compile_script("$1 = InputTensor(c, bool, [3]);\n$2 = LogicalNotNode($1);\nresult = $2;\n")
        assert.are.same({ false, true, false }, m:run({ c = f }):totable())
    end)

    it("safetensors BOOL round trip", function()
        local path = os.tmpname()
        local t = mk.tensor({ true, false, false, true, true }, "bool", { 5 })
        mk.save_safetensors(path, { mask = t })
        local back = mk.load_safetensors(path)
        os.remove(path)
        assert.are.equal("bool", back.mask.dtype)
        assert.are.same(t:totable(), back.mask:totable())
    end)

    it("a comparison, logic and where fuse into one program with float32 work", function()
        local n = math.random(3, 40)
        local x = mk.input("x", "float32", { n })
        local y = mk.input("y", "float32", { n })
        -- (the group grows one member at a time, each fitting MK_X_IN operands:
        -- where(cond, x * y, y - x) stops short of one group, as any such tree)
        local out = mk.where(x:gt(y):logical_or(y:lt(x * x)), x, y)
        local m = mk.compile(out)
        assert.are.equal(1, m:stats().launches)
        local xt, xr = H.rand({ n })
        local yt, yr = H.rand({ n })
        local want = { shape = { n }, data = {} }
        for k = 1, n do
            local a, b = xr.data[k], yr.data[k]
            want.data[k] = (a > b or b < H.f32(a * a)) and a or b
        end
        H.assert_close(m:run({ x = xt, y = yt }), want, 0, 0)
        -- int64 and float32 comparisons stay in programs of their own dtype
        local i = mk.input("i", "int64", { n })
        local both = x:gt(y):logical_and(i:gt(0))
        local m2 = mk.compile(both)
        assert.is_true(m2:stats().launches >= 2)
    end)
end)

describe("Lua operators of issue 64", function()
    it("// is floor_div where the host has it (Lua 5.3 and later)", function()
        if not _VERSION:find("5%.[34]") or jit then return end -- 5.1, LuaJIT: the method only
        local chunk = assert(load("local x, y = ...; return x // y, x // 2, 7 // x"))
        local x = mk.input("x", "float32", { 3 })
        local a, b, c = chunk(x, mk.input("y", "float32", { 3 }))
        assert.are.equal("FloorDivNode", a.op)
        assert.are.equal("FloorDivNode", b.op)
        assert.are.equal("FloorDivNode", c.op)
        local m = mk.compile({ a, b, c })
        local r1, r2, r3 = m:run({ x = mk.tensor({ 7, -7, 5.5 }), y = mk.tensor({ 2, 2, -2 }) })
        assert.are.same({ 3, -4, -3 }, r1:totable())
        assert.are.same({ 3, -4, 2 }, r2:totable())
        assert.are.same({ 1, -1, 1 }, r3:totable())
    end)

    it("% is Python's for int64 too, numbers on either side", function()
        local i = mk.input("i", "int64", { 4 })
        local m = mk.compile({ i % 3, 7 % i, i:floor_div(-2) })
        local a, b, c = m:run({ i = mk.tensor({ -7, -1, 5, 3 }, "int64", { 4 }) })
        assert.are.same({ 2, 2, 2, 0 }, a:totable())
        assert.are.same({ 0, 0, 2, 1 }, b:totable())
        assert.are.same({ 3, 0, -3, -2 }, c:totable())
    end)
end)
