-- Lua operators and methods made of rows the core has: -x, x ^ 2 (and 1, -1),
-- numbers on either side, x:T(), x:transpose(a, b); x ^ y, x % y and x // y as
-- the op set's rows; < and <= as clear errors (comparisons are methods).
local H = require "spec.helpers"
local mk = H.mk()
H.seed("operators_spec")
local R = H.ref_ops
local f32 = H.f32

local function map(x, f)
    local out = { shape = x.shape, data = {}, dtype = x.dtype }
    for i, v in ipairs(x.data) do out.data[i] = f(v) end
    return out
end

local function run(out, feeds)
    local m <close> = mk.compile(out)
    return m:run(feeds)
end

-- "spec/operators_spec.lua:12: ": the caller's line, as Lua names it.
local function here()
    local i = debug.getinfo(2, "Sl")
    return i.short_src .. ":" .. i.currentline .. ": "
end

describe("Lua operators", function()
    it("-x, x ^ 2, x ^ 1 and x ^ -1 give the float32 result rounded once", function()
        local shape = H.rand_shape(math.random(1, 4), 1, 5)
        local xt, xr = H.rand_away(shape, 0.1, 4)
        local x = mk.input("x", "float32", shape)
        H.assert_equal_ref(run(-x, { x = xt }), map(xr, function(v) return -v end))
        H.assert_equal_ref(run(x ^ 2, { x = xt }), map(xr, function(v) return f32(v * v) end))
        H.assert_equal_ref(run(x ^ 2.0, { x = xt }), map(xr, function(v) return f32(v * v) end))
        assert.are.equal(x, x ^ 1)
        H.assert_close(run(x ^ -1, { x = xt }), map(xr, function(v) return 1 / v end), 0, 1e-7)
        -- int64: negation exact, and a square
        local it, ir = H.randint(shape, -3000, 3000)
        local i = mk.input("i", "int64", shape)
        H.assert_equal_ref(run(-i, { i = it }), map(ir, function(v) return -v end))
        H.assert_equal_ref(run(i ^ 2, { i = it }), map(ir, function(v) return v * v end))
    end)

    it("takes a number on either side of + - * /", function()
        local shape = H.rand_shape(math.random(1, 4), 1, 5)
        local xt, xr = H.rand_away(shape, 0.5, 3)
        local x = mk.input("x", "float32", shape)
        local k = f32(math.random() * 4 - 2)
        local cases = {
            { k + x, function(v) return k + v end }, { x + k, function(v) return v + k end },
            { k - x, function(v) return k - v end }, { x - k, function(v) return v - k end },
            { k * x, function(v) return k * v end }, { x * k, function(v) return v * k end },
            { k / x, function(v) return k / v end }, { x / k, function(v) return v / k end },
        }
        for n, c in ipairs(cases) do
            local ok, err = pcall(H.assert_close, run(c[1], { x = xt }), map(xr, c[2]), 1e-6, 1e-6)
            assert(ok, "case " .. n .. " (k = " .. k .. "): " .. tostring(err))
        end
    end)

    it("x:T() reverses the axes, x:transpose(a, b) swaps two", function()
        for rank = 1, 4 do
            local shape = H.rand_shape(rank, 1, 5)
            local xt, xr = H.rand(shape)
            local x = mk.input("x", "float32", shape)
            local rev = {}
            for i = 1, rank do rev[i] = rank - i end
            if rank == 1 then assert.are.equal(x, x:T()) end
            H.assert_equal_ref(run(x:T() * 1, { x = xt }), R.permute(xr, rev))
            local a, b = math.random(-rank, rank - 1), math.random(-rank, rank - 1)
            local perm = {}
            for i = 1, rank do perm[i] = i - 1 end
            perm[a % rank + 1], perm[b % rank + 1] = b % rank, a % rank
            local name = string.format("transpose(%d, %d) of %s", a, b, H.shape_str(shape))
            local ok, err = pcall(H.assert_equal_ref, run(x:transpose(a, b) * 1, { x = xt }),
                R.permute(xr, perm))
            assert(ok, name .. ": " .. tostring(err))
        end
        local x = mk.input("x", "float32", { 2, 3 })
        H.assert_error(function() return x:transpose(0, 2) end, "shape error: transpose:",
            "axis 2 is outside [-2, 2)")
        H.assert_error(function() return x:transpose(0, 0.5) end,
            "argument error: transpose: argument #3 must be an integer")
        H.assert_error(function() return mk.node_methods.T(3) end, "argument error: T:")
    end)

    it("x ^ y, x % y and x // y are the op set's rows; < and <= stay errors", function()
        local x = mk.input("x", "float32", { 2, 3 })
        local y = mk.input("y", "float32", { 2, 3 })
        local function E(f, at, prefix, ...)
            local err = H.assert_error(f, at .. prefix, ...)
            return err
        end
        assert.are.equal("PowNode", (x ^ 3).op)
        assert.are.equal("PowNode", (2 ^ x).op)
        assert.are.equal("PowNode", (x ^ y).op)
        assert.are.equal("PowNode", (x ^ 0.5).op)
        assert.are.equal("ModNode", (x % 2).op)
        assert.are.equal("ModNode", (2 % x).op)
        assert.are.equal("FloorDivNode", x:floor_div(y).op)
        assert.are.equal("NegNode", (-x).op)
        local at = here(); local err = select(2, pcall(function() return x < y end))
        assert.are.equal(at, err:sub(1, #at))
        for _, f in ipairs({ function() return (x < y) end, function() return (x > 1) end }) do
            E(f, "", "argument error: < (__lt):", "x:lt(y)", "bool")
        end
        for _, f in ipairs({ function() return (x <= y) end, function() return (2 >= x) end }) do
            E(f, "", "argument error: <= (__le):", "x:le(y)")
        end
        -- == stays identity
        assert.is_false(x == y)
        assert.is_true(x == x)
    end)

    it("a node made by an operator or method names the user's line", function()
        local x = mk.input("x", "float32", { 2, 3 })
        local at = here(); local n, t = -x, x:transpose(0, 1)
        assert.are.equal(at:sub(1, -3), n.where)
        assert.are.equal(at:sub(1, -3), t.where)
    end)
end)
