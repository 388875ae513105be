-- moonkaas.compat — what the Lua module needs from Lua 5.3+, on every host.
--
-- The module runs on Lua 5.4, 5.1 and LuaJIT 2.1. Its files use only syntax
-- all three parse (no //, no bitwise operators, no goto, no <close>) and take
-- from here the few library functions 5.1 lacks: integer tests, float32
-- rounding and byte encodings (string.pack on 5.3+, arithmetic on doubles
-- elsewhere), 32-bit xor, table.move and table.unpack.
--
-- On 5.1 and LuaJIT a number is a double: an "integer" is a number with an
-- integral value, exact up to 2^53.

local floor, huge = math.floor, math.huge

local M = {}

M.lua51 = math.type == nil -- 5.1 and LuaJIT: no integer subtype

M.unpack = table.unpack or unpack

-- 5.1 has no __len for tables, so # is already raw there.
M.rawlen = rawlen or function(t) return #t end

-- table.move(a1, f, e, t[, a2]) for the forward copies the module makes.
M.move = table.move or function(a1, f, e, t, a2)
    a2 = a2 or a1
    for i = 0, e - f do a2[t + i] = a1[f + i] end
    return a2
end

-- floor(a / b) of integers a, b (b > 0), exact below 2^53 on every host
-- (5.4: an integer, as a // b gives).
function M.idiv(a, b)
    return floor(a / b)
end

-- Whether v is an integer: 5.3+'s integer subtype; 5.1, an integral finite number.
if math.type then
    local mtype = math.type
    function M.isinteger(v) return mtype(v) == "integer" end
    local tointeger = math.tointeger
    function M.tointeger(v) return mtype(v) and tointeger(v) or nil end
else
    function M.isinteger(v)
        return type(v) == "number" and v == floor(v) and v > -huge and v < huge
    end
    function M.tointeger(v)
        if M.isinteger(v) then return v end
        return nil
    end
end

-- ---- float32 and little-endian integers ------------------------------------------

local pack, unpack = string.pack, string.unpack

if pack then
    function M.f32(x) return (unpack("<f", pack("<f", x))) end
    function M.f32_bits(x) return (unpack("<I4", pack("<f", x))) end
    function M.i32(s, pos) return (unpack("<i4", s, pos)) end
    function M.u32(s, pos) return (unpack("<I4", s, pos)) end
    function M.pack_i32(v) return pack("<i4", v) end
    function M.pack_u32(v) return pack("<I4", v) end
    function M.pack_f32(x) return pack("<f", x) end
    function M.f32_at(s, pos) return (unpack("<f", s, pos)) end
    -- t[first..last] as little-endian uint32 (fmt "I4") or float32 ("f"),
    -- packed 2,048 at a time
    function M.pack_array(fmt, t, first, last)
        local parts, table_unpack = {}, table.unpack
        for i = first, last, 2048 do
            local j = math.min(i + 2047, last)
            parts[#parts + 1] = pack("<" .. string.rep(fmt, j - i + 1), table_unpack(t, i, j))
        end
        return table.concat(parts)
    end
else
    local frexp, char, byte = math.frexp, string.char, string.byte

    -- y rounded to an integer, ties to even (0 <= y < 2^53).
    local function round_even(y)
        local f = floor(y)
        local d = y - f
        if d > 0.5 or (d == 0.5 and f % 2 == 1) then return f + 1 end
        return f
    end

    -- The float32 nearest x: its sign, biased exponent (0: subnormal or zero)
    -- and 23-bit fraction; exponent 255 for ±inf and NaN.
    local function f32_parts(x)
        local sign = (x < 0 or 1 / x < 0) and 1 or 0
        local a = math.abs(x)
        if a ~= a then return 0, 255, 0x400000 end
        if a == huge then return sign, 255, 0 end
        if a == 0 then return sign, 0, 0 end
        local _, e = frexp(a) -- a = m * 2^e, 0.5 <= m < 1
        if e <= -126 then -- below 2^-126: a multiple of 2^-149
            local q = round_even(a * 2 ^ 149)
            if q >= 0x800000 then return sign, 1, q - 0x800000 end
            return sign, 0, q
        end
        local q = round_even(a * 2 ^ (24 - e)) -- 24 significant bits
        if q == 0x1000000 then q, e = 0x800000, e + 1 end
        local biased = e + 126
        if biased >= 255 then return sign, 255, 0 end
        return sign, biased, q - 0x800000
    end

    function M.f32(x)
        local sign, e, f = f32_parts(x)
        if e == 255 then return f ~= 0 and x or (sign == 1 and -huge or huge) end
        local v = e == 0 and f * 2 ^ -149 or (0x800000 + f) * 2 ^ (e - 150)
        return sign == 1 and -v or v
    end

    function M.f32_bits(x)
        local sign, e, f = f32_parts(x)
        return sign * 0x80000000 + e * 0x800000 + f
    end

    function M.u32(s, pos)
        local a, b, c, d = byte(s, pos or 1, (pos or 1) + 3)
        return a + b * 0x100 + c * 0x10000 + d * 0x1000000
    end

    function M.i32(s, pos)
        local u = M.u32(s, pos)
        return u >= 0x80000000 and u - 0x100000000 or u
    end

    function M.pack_u32(v)
        v = v % 0x100000000
        return char(v % 256, floor(v / 0x100) % 256, floor(v / 0x10000) % 256, floor(v / 0x1000000))
    end
    M.pack_i32 = M.pack_u32

    function M.pack_f32(x)
        return M.pack_u32(M.f32_bits(x))
    end

    -- the float32 at s[pos..pos+3]
    function M.f32_at(s, pos)
        local u = M.u32(s, pos)
        local sign = u >= 0x80000000 and -1 or 1
        local e = floor(u / 0x800000) % 256
        local f = u % 0x800000
        if e == 255 then return f ~= 0 and 0 / 0 or sign * huge end
        if e == 0 then return sign * f * 2 ^ -149 end
        return sign * (0x800000 + f) * 2 ^ (e - 150)
    end

    function M.pack_array(fmt, t, first, last)
        local put = fmt == "f" and M.pack_f32 or M.pack_u32
        local parts = {}
        for i = first, last do parts[#parts + 1] = put(t[i]) end
        return table.concat(parts)
    end
end

-- ---- 32-bit xor ------------------------------------------------------------------

if bit32 then
    M.bxor = bit32.bxor
elseif jit and pcall(require, "bit") then
    local bxor = require("bit").bxor
    function M.bxor(a, b) return bxor(a, b) % 0x100000000 end
elseif math.type then
    M.bxor = load("return function(a, b) return a ~ b end")()
else
    -- by bytes through a 256 x 256 table made on first use
    local xor8
    function M.bxor(a, b)
        if not xor8 then
            xor8 = {}
            for x = 0, 255 do
                for y = 0, 255 do
                    local r, p, u, v = 0, 1, x, y
                    while u > 0 or v > 0 do
                        if u % 2 ~= v % 2 then r = r + p end
                        u, v, p = floor(u / 2), floor(v / 2), p * 2
                    end
                    xor8[x * 256 + y + 1] = r
                end
            end
        end
        local r, p = 0, 1
        for _ = 1, 4 do
            local x, y = a % 256, b % 256
            r = r + xor8[x * 256 + y + 1] * p
            a, b, p = floor(a / 256), floor(b / 256), p * 256
        end
        return r
    end
end

return M
