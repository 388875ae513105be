-- moonkaas.compat, the Lua 5.3 library functions the module needs, on every
-- host: its arithmetic fallbacks (what Lua 5.1 and LuaJIT run) are loaded
-- here on any Lua with string.pack and math.type hidden, and checked against
-- the core's float32 conversion (a C cast) and plain bit loops. Runs on Lua
-- 5.4 (make test) and on 5.1 and LuaJIT (make test-lua51 test-luajit).

local helpers = require("spec.helpers")
local mk = helpers.mk()
local C = require("moonkaas.compat")

-- compat.lua loaded as Lua 5.1 sees the library, whatever runs this.
local function load_fallback()
    local saved = { string.pack, string.unpack, math.type, math.tointeger, rawget(_G, "jit"),
                    rawget(_G, "bit32") }
    string.pack, string.unpack, math.type, math.tointeger, jit, bit32 = nil, nil, nil, nil, nil, nil
    local ok, m = pcall(dofile, "lua/moonkaas/compat.lua")
    string.pack, string.unpack, math.type, math.tointeger, jit, bit32 = saved[1], saved[2], saved[3],
        saved[4], saved[5], saved[6]
    assert(ok, m)
    return m
end

local function core_f32(x) return mk.tensor({ x }):get(1) end
local function same(a, b) return a == b or (a ~= a and b ~= b) end

-- a random double over float32's whole range: normal, subnormal, overflowing,
-- halfway between two float32 values, or a small integer
local function random_double()
    local r = math.random()
    local sign = math.random() < 0.5 and -1 or 1
    if r < 0.3 then return sign * math.random() * 2 ^ math.random(-149, 129) end
    if r < 0.5 then return sign * math.random() * 2 ^ math.random(-160, -120) end
    if r < 0.8 then -- a tie: a float32 plus half its ulp
        local f = core_f32(math.random() * 2 ^ math.random(-30, 30))
        local _, e = math.frexp(f)
        return sign * (f + 2 ^ (e - 25))
    end
    return sign * math.random(0, 2 ^ 30)
end

local function xor_ref(a, b)
    local r, p = 0, 1
    for _ = 1, 32 do
        if a % 2 ~= b % 2 then r = r + p end
        a, b, p = math.floor(a / 2), math.floor(b / 2), p * 2
    end
    return r
end

describe("moonkaas.compat", function()
    if not math.frexp then
        it("needs math.frexp for its fallbacks", function() pending("this Lua has no math.frexp") end)
        return
    end
    local F = load_fallback()

    it("rounds doubles to float32 as the core's C cast does", function()
        helpers.seed("compat f32")
        for _, f in ipairs({ F, C }) do
            for _ = 1, 3000 do
                local x = random_double()
                local want = core_f32(x)
                assert(same(f.f32(x), want), string.format("f32(%.17g) = %.17g, want %.17g", x, f.f32(x), want))
            end
            for _, x in ipairs({ 0.0, -0.0, 1 / 0, -1 / 0, 0 / 0, 2 ^ 128, 3.4028235677973366e38,
                                 3.4028235e38 * 1.0000001, 2 ^ -150, 2 ^ -149, 1.5 * 2 ^ -149, 2 ^ -126 }) do
                assert(same(f.f32(x), core_f32(x)), string.format("f32(%.17g)", x))
            end
        end
        assert.are.equal(math.huge, 1 / F.f32(0.0))
        local negative_zero = -(1 / math.huge) -- not -0.0: Lua 5.1 folds that constant to 0
        assert.are.equal(-math.huge, 1 / F.f32(negative_zero))
    end)

    it("codes float32 and 32-bit integers as the core reads bytes", function()
        helpers.seed("compat bytes")
        for _, f in ipairs({ F, C }) do
            for _ = 1, 2000 do
                local x = random_double()
                local s = f.pack_f32(x)
                assert.are.equal(mk.tensor({ x }):bytes(), s)
                assert(same(core_f32(x), f.f32_at(s, 1)))
                local b = {}
                for i = 1, 4 do b[i] = math.random(0, 255) end
                local raw = string.char(b[1], b[2], b[3], b[4])
                assert(same(mk.from_bytes(raw, "float32", { 1 }):get(1), f.f32_at("xy" .. raw, 3)))
                local u = b[1] + 256 * b[2] + 65536 * b[3] + 16777216 * b[4]
                assert.are.equal(u, f.u32(raw, 1))
                assert.are.equal(u >= 2 ^ 31 and u - 2 ^ 32 or u, f.i32(raw, 1))
                assert.are.equal(raw, f.pack_u32(u))
                assert.are.equal(raw, f.pack_i32(f.i32(raw, 1)))
                assert.are.equal(mk.from_bytes(raw, "float32", { 1 }):bytes(), raw)
            end
            assert.are.equal(f.pack_u32(1) .. f.pack_u32(2) .. f.pack_u32(3), f.pack_array("I4", { 9, 1, 2, 3 }, 2, 4))
        end
    end)

    it("xors 32-bit values, and runs run.c's generator exactly", function()
        helpers.seed("compat xor")
        for _, f in ipairs({ F, C }) do
            for _ = 1, 2000 do
                local a, b = math.floor(math.random() * 2 ^ 32), math.floor(math.random() * 2 ^ 32)
                assert.are.equal(xor_ref(a, b), f.bxor(a, b))
            end
        end
        -- xorshift64* outputs from seeds 42 and -7, computed with 5.4's 64-bit operators
        local S = require("moonkaas.llama2.sampler")
        for seed, want in pairs({ [42] = { 1456360119, 3359763283, 3393612768, 4054632243, 3283045847 },
                                  [-7] = { 777871233, 3583622156, 3093992388 } }) do
            local state = seed
            for i = 1, #want do
                local u
                state, u = S.random_u32(state)
                assert.are.equal(want[i], u)
            end
        end
    end)

    it("tells integers and divides them", function()
        for _, f in ipairs({ F, C }) do
            assert.is_true(f.isinteger(3))
            assert.is_false(f.isinteger(3.5))
            assert.is_false(f.isinteger("3"))
            assert.is_false(f.isinteger(1 / 0))
            assert.are.equal(nil, f.tointeger(2.5))
            assert.are.equal(nil, f.tointeger("2"))
            assert.are.equal(7, f.tointeger(7))
        end
        helpers.seed("compat idiv")
        for _ = 1, 1000 do
            local a, b = math.floor(math.random() * 2 ^ 40), math.random(1, 2 ^ 20)
            local q = C.idiv(a, b)
            assert.is_true(q * b <= a and a < (q + 1) * b)
        end
        assert.are.equal(3, C.rawlen(setmetatable({ 1, 2, 3 }, { __len = function() return 9 end })))
    end)
end)
