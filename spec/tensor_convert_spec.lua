-- Host tensors' element conversions: float16, bfloat16 and int8 elements,
-- t:to(dtype), mk.quantize and q:dequantize, against references written
-- here. The rest of host tensors: tensor_spec.lua.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("tensor_convert_spec")
local tmpfile = H.tmpfile

describe("conversions on the host (t:to, mk.quantize, q:dequantize)", function()
    -- float32 of x, exactly (string.pack rounds to nearest)
    local f32 = H.f32

    it("to: bfloat16 keeps the top half of float32, rounding to nearest even", function()
        local xs = { 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, -2.5, 1e-3 }
        for _ = 1, 50 do xs[#xs + 1] = f32((math.random() - 0.5) * 10) end
        local t = mk.tensor(xs)
        local b = t:to("bfloat16"):to("float32")
        for i, x in ipairs(xs) do
            -- reference: the two bfloat16 neighbours of x, by clearing/adding the low 16 bits
            local bits = string.unpack("<I4", string.pack("<f", x))
            local lo = bits & 0xffff0000
            local hi = lo + 0x10000
            local vlo = string.unpack("<f", string.pack("<I4", lo))
            local vhi = string.unpack("<f", string.pack("<I4", hi))
            local d0, d1 = math.abs(x - vlo), math.abs(vhi - x)
            local want = (d1 < d0 or (d1 == d0 and (lo >> 16) & 1 == 1)) and vhi or vlo
            assert.are.equal(want, b:get(i), "element " .. i .. " = " .. x)
        end
        assert.are.equal("int64", t:to("int64").dtype)
        assert.are.same({ 1, 2, -2, 0 }, mk.tensor({ 1.9, 2.5, -2.7, 0.4 }):to("int64"):totable())
    end)

    it("quantize and dequantize: llama2.c's int8 groups along the last axis", function()
        local rows, n, g = 3, 64, 32
        local data = {}
        for r = 1, rows do
            data[r] = {}
            for c = 1, n do data[r][c] = f32((math.random() - 0.5) * 4) end
        end
        local q, s = mk.quantize(mk.tensor(data), g)
        assert.are.same({ rows, n }, q.shape)
        assert.are.same({ rows, n // g }, s.shape)
        local back = q:dequantize(s)
        for r = 1, rows do
            for k = 0, n // g - 1 do
                local wmax = 0
                for c = 1, g do wmax = math.max(wmax, math.abs(data[r][k * g + c])) end
                local scale = f32(wmax / 127)
                assert.are.equal(scale, s:get(r, k + 1))
                for c = 1, g do
                    local x = data[r][k * g + c]
                    local v = f32(x / scale)
                    local fl = math.floor(v)
                    local want = v - fl > 0.5 and fl + 1 or v - fl < 0.5 and fl or (fl % 2 == 0 and fl or fl + 1)
                    assert.are.equal(f32(want * scale), back:get(r, k * g + c))
                end
            end
        end
        H.assert_error(function() mk.quantize(mk.tensor(data), 48) end, "argument error: quantize:",
            "does not divide the last dim 64")
        H.assert_error(function() mk.quantize(mk.tensor({ 1, 2 }, "int64"), 2) end, "dtype error: quantize:")
        H.assert_error(function() q:dequantize(mk.tensor({ 1.0, 2.0 })) end, "shape error: dequantize:")
        H.assert_error(function() s:dequantize(s) end, "dtype error: dequantize:")
    end)
end)

-- ---------------------------------------------------------------------------
-- float16, bfloat16 and int8 elements and the host conversions, against
-- references written here from the formats' definitions (IEEE binary16,
-- bfloat16 = the top half of binary32, llama2.c's quantize_q80), in double
-- precision with string.pack("<f") for float32 rounding.

local f32 = H.f32
local function f32_bits(x) return (string.unpack("<I4", string.pack("<f", x))) end
local function from_bits(u) return (string.unpack("<f", string.pack("<I4", u))) end
local function is_nan(x) return x ~= x end

local round_even = H.round_even

-- bfloat16 of the float32 value x: round the low 16 bits away, ties to even
-- on bit 16 (integer arithmetic on the bits; NaN stays NaN; past the largest
-- finite it carries into the exponent and becomes inf, as IEEE rounding does)
local function ref_bf16(x)
    if is_nan(x) then return 0 / 0 end
    local u = f32_bits(x)
    local hi, lo = u >> 16, u & 0xffff
    if lo > 0x8000 or (lo == 0x8000 and hi & 1 == 1) then hi = hi + 1 end
    return from_bits(hi << 16)
end

-- float16 of the float32 value x: the spacing of binary16 around |x| is
-- 2^(e - 10) for 2^e <= |x| (e >= -14, the subnormals sharing 2^-24); |x|
-- divided by it is exact in double, rounded to even, scaled back. From 65520
-- (halfway from 65504 to 2^16, which ties to the even 2^16) it is inf.
local function ref_f16(x)
    if is_nan(x) then return 0 / 0 end
    local sign = (x < 0 or 1 / x < 0) and -1.0 or 1.0 -- floats: the sign of a zero counts
    local a = math.abs(x)
    if a >= 65520 then return sign * math.huge end
    local e = ((f32_bits(a) >> 23) & 0xff) - 127
    local ulp = 2.0 ^ (math.max(e, -14) - 10)
    return (round_even(a / ulp) * ulp) * sign
end

-- float to integer: toward zero, saturated, NaN as 0
local function ref_int(x, lo, hi)
    if is_nan(x) then return 0 end
    if x >= hi then return hi end
    if x <= lo then return lo end
    local t = x < 0 and -math.floor(-x) or math.floor(x)
    return math.tointeger(t)
end

-- Element of any dtype from a value (a float32 value, or an integer); the
-- rule of mk_convert (integers go to floats through float32)
local function ref_convert(v, dtype)
    if dtype == "float32" then return f32(v) end
    if dtype == "bfloat16" then return ref_bf16(f32(v)) end
    if dtype == "float16" then return ref_f16(f32(v)) end
    if math.type(v) == "integer" then
        if dtype == "int8" then return math.max(-128, math.min(127, v)) end
        return v
    end
    if dtype == "int8" then return ref_int(v, -128, 127) end
    return ref_int(v, math.mininteger, math.maxinteger)
end

local function same_value(got, want)
    if is_nan(want) then return is_nan(got) end
    if want == 0 and got == 0 then return (1 / want > 0) == (1 / got > 0) end -- the sign of zero
    return got == want and math.type(got) == (math.type(want) == "integer" and "integer" or math.type(got))
end

local function assert_values(got, want, what)
    assert.are.equal(#want, #got, what)
    for i = 1, #want do
        if not same_value(got[i], want[i]) then
            error(string.format("%s: element %d is %s, expected %s", what, i, tostring(got[i]),
                                tostring(want[i])), 2)
        end
    end
end

-- n random float32 values over many binades (1e-9 to 1e6, either sign)
local function random_floats(n)
    local xs = {}
    for i = 1, n do
        local mag = 2.0 ^ math.random(-30, 20) * (1 + math.random())
        xs[i] = f32(math.random(0, 1) == 0 and mag or -mag)
    end
    return xs
end

-- Cases every float conversion must get right: ties to even in both formats,
-- float16 overflow and its last finite values, subnormals of both, signed
-- zero, infinities and NaN.
local SPECIAL = {
    1 + 2 ^ -8, 1 + 3 * 2 ^ -8, -(1 + 2 ^ -8), 1 + 2 ^ -8 + 2 ^ -20,  -- bfloat16 ties (and just past one)
    1 + 2 ^ -11, 1 + 3 * 2 ^ -11, 2049, 2051, -2051,                   -- float16 ties
    65504, 65519, 65519.99, 65520, -65520, 1e6, 3.4e38, -3.4e38,      -- float16 overflow, float32's largest
    2 ^ -24, 2 ^ -25, 3 * 2 ^ -26, 2 ^ -14 - 2 ^ -25, 2 ^ -14, 5e-8,   -- float16 subnormals
    1e-40, -1e-40, 2 ^ -149, 1.5e-39,                                  -- float32 subnormals (bfloat16 keeps them)
    0.0, -0.0, math.huge, -math.huge, 0 / 0,
}

describe("float16, bfloat16 and int8 elements", function()
    H.seed("tensor_convert_spec halves")

    for _, case in ipairs({ { "bfloat16", ref_bf16 }, { "float16", ref_f16 } }) do
        local dtype, ref = case[1], case[2]
        it(dtype .. ": stored from Lua numbers rounding to nearest even, read back exactly", function()
            local xs = random_floats(300)
            for _, s in ipairs(SPECIAL) do xs[#xs + 1] = f32(s) end
            local want = {}
            for i, x in ipairs(xs) do want[i] = ref(x) end
            local t = mk.tensor(xs, dtype, { #xs })
            assert.are.equal(dtype, t.dtype)
            assert.are.equal(2 * #xs, #t:bytes())
            assert_values(t:totable(), want, "mk.tensor")
            -- the same through t:to from float32 (mk_convert) and t:set one by one
            assert_values(mk.tensor(xs, "float32", { #xs }):to(dtype):totable(), want, "to")
            local u = mk.zeros(dtype, { #xs })
            for i, x in ipairs(xs) do u:set(i, x) end
            assert.are.equal(t:bytes(), u:bytes())
            for _ = 1, 20 do
                local i = math.random(1, #xs)
                assert.is_true(same_value(t:get(i), want[i]), dtype .. " get " .. i)
            end
            -- back to float32: exact (the values are float32 values)
            assert_values(t:to("float32"):totable(), want, "to float32")
        end)

        it(dtype .. ": a Lua number is a float32 first (as in a float32 tensor)", function()
            -- a double just past a tie of the target rounds onto the tie in float32
            local x = dtype == "bfloat16" and 1 + 2 ^ -8 + 2 ^ -30 or 1 + 2 ^ -11 + 2 ^ -30
            assert.are.equal(1, mk.tensor({ x }, dtype):get(1))
            assert.are.equal(ref(f32(x)), mk.tensor({ x }, dtype):get(1))
        end)

        it(dtype .. ": argmax takes the first largest (a NaN first), tostring shows values", function()
            local xs = random_floats(40)
            local t = mk.tensor(xs, dtype)
            local best, vals = 1, t:totable()
            for i = 2, #vals do if vals[i] > vals[best] then best = i end end
            assert.are.equal(best, t:argmax())
            assert.are.equal(2, mk.tensor({ 1, 3, 3.0001, -1 }, dtype):argmax()) -- 3 and 3.0001 tie in both
            assert.are.equal(3, mk.tensor({ 1, 2, 0 / 0, 5 }, dtype):argmax())
            assert.are.equal("tensor " .. dtype .. " [2, 2] {{1.5, -0.25}, {inf, nan}}",
                (tostring(mk.tensor({ { 1.5, -0.25 }, { math.huge, 0 / 0 } }, dtype)):gsub("-nan", "nan")))
        end)
    end

    it("bfloat16 and float16 bytes are the formats' bit patterns", function()
        assert.are.equal(string.pack("<I2I2I2I2", 0x3f80, 0xc000, 0x7f80, 0x0000),
            mk.tensor({ 1, -2, math.huge, 0 }, "bfloat16"):bytes())
        assert.are.equal(string.pack("<I2I2I2I2I2", 0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00),
            mk.tensor({ 1, -2, 65504, 2 ^ -24, 65520 }, "float16"):bytes())
        -- and read from bytes: every float16 pattern against the format's definition
        local parts = {}
        for u = 0, 0xffff do parts[#parts + 1] = string.pack("<I2", u) end
        local all = mk.from_bytes(table.concat(parts), "float16", { 0x10000 }):totable()
        for u = 0, 0xffff do
            local s, e, m = u >> 15, (u >> 10) & 0x1f, u & 0x3ff
            local want
            if e == 0x1f then want = m == 0 and math.huge or 0 / 0
            elseif e == 0 then want = m * 2.0 ^ -24
            else want = (1 + m / 1024) * 2.0 ^ (e - 15) end
            if s == 1 then want = -want end
            if not same_value(all[u + 1], want) then
                error(string.format("float16 0x%04x reads %s, expected %s", u, all[u + 1], want))
            end
        end
    end)

    it("int8: integers in [-128, 127]", function()
        local vals = {}
        for i = 1, 100 do vals[i] = math.random(-128, 127) end
        vals[#vals + 1], vals[#vals + 2] = -128, 127
        local t = mk.tensor(vals, "int8")
        assert.are.equal("int8", t.dtype)
        assert.are.equal(string.pack("<" .. string.rep("i1", #vals), table.unpack(vals)), t:bytes())
        assert.are.same(vals, t:totable())
        assert.are.equal("integer", math.type(t:get(1)))
        local best = 1
        for i = 2, #vals do if vals[i] > vals[best] then best = i end end
        assert.are.equal(best, t:argmax())
        t:set(1, -7.0)
        assert.are.equal(-7, t:get(1))
        assert.are.equal("tensor int8 [2, 2] {{-128, 0}, {127, 3}}", tostring(mk.tensor({ { -128, 0 }, { 127, 3 } }, "int8")))
        local m = mk.from_bytes(string.pack("<i1i1i1", -5, 100, -100), "int8", { 3 })
        assert.are.same({ -5, 100, -100 }, m:totable())
    end)

    it("int8: refuses fractions, numbers out of range and non-numbers, naming the value", function()
        H.assert_error(function() mk.tensor({ 1, 128 }, "int8") end, "argument error: tensor:",
            "element [2] = 128 is out of range for int8 (-128 to 127)")
        H.assert_error(function() mk.tensor({ { -129 } }, "int8") end, "argument error: tensor:",
            "-129 is out of range for int8")
        H.assert_error(function() mk.tensor({ 1e10 }, "int8") end, "argument error: tensor:",
            "out of range for int8")
        H.assert_error(function() mk.tensor({ 2.5 }, "int8") end, "argument error: tensor:",
            "2.5 is not an integer (int8 tensor)")
        H.assert_error(function() mk.tensor({ 0 / 0 }, "int8") end, "argument error: tensor:",
            "is not an integer (int8 tensor)")
        H.assert_error(function() mk.tensor({ "1" }, "int8") end, "argument error: tensor:", "string")
        local t = mk.zeros("int8", { 3 })
        H.assert_error(function() t:set(2, 200) end, "argument error: set:", "element 2 = 200",
            "out of range for int8")
        H.assert_error(function() t:set(2, 0.5) end, "argument error: set:", "0.5 is not an integer")
        assert.are.same({ 0, 0, 0 }, t:totable())
    end)
end)

describe("t:to(dtype)", function()
    H.seed("tensor_convert_spec to")
    local DTYPES = { "float32", "int64", "float16", "bfloat16", "int8" }

    -- random values that a tensor of `dtype` holds exactly
    local function values_of(dtype, n)
        local xs = {}
        if dtype == "int64" then
            for i = 1, n do xs[i] = math.random(-(1 << 40), 1 << 40) // (1 << math.random(0, 40)) end
            xs[#xs + 1], xs[#xs + 2] = math.maxinteger, math.mininteger
        elseif dtype == "int8" then
            for i = 1, n do xs[i] = math.random(-128, 127) end
        else
            xs = random_floats(n)
            for i = 1, n // 4 do xs[i] = f32((math.random() - 0.5) * 600) end -- int8's range and past it
            for _, s in ipairs(SPECIAL) do xs[#xs + 1] = f32(s) end
            for i, x in ipairs(xs) do xs[i] = ref_convert(x, dtype) end
        end
        return xs
    end

    it("converts any dtype to any by the CastNode's rule", function()
        for _, from in ipairs(DTYPES) do
            local xs = values_of(from, 200)
            local t = mk.tensor(xs, from, { #xs })
            for _, to in ipairs(DTYPES) do
                local want = {}
                for i, x in ipairs(xs) do
                    -- int64 to a float: the nearest float32 (exact in double below 2^53,
                    -- then rounded once); past 2^53 skip the check of the float result
                    want[i] = ref_convert(x, to)
                end
                local c = t:to(to)
                assert.are.equal(to, c.dtype)
                assert.are.same(t.shape, c.shape)
                local got = c:totable()
                if from == "int64" and (to ~= "int64" and to ~= "int8") then
                    got[#got], got[#got - 1], want[#want], want[#want - 1] = 0, 0, 0, 0
                end
                assert_values(got, want, from .. " to " .. to)
            end
        end
        -- a few by hand: toward zero, saturated, NaN as 0
        assert.are.same({ 127, -128, 0, -1, 1 },
            mk.tensor({ 1e30, -math.huge, 0 / 0, -1.9, 1.9 }):to("int8"):totable())
        assert.are.same({ math.maxinteger, math.mininteger, 0 },
            mk.tensor({ math.huge, -1e30, 0 / 0 }):to("int64"):totable())
    end)

    it("keeps the shape, leaves the source alone and works on read-only (mapped) tensors", function()
        local xs = random_floats(24)
        local bytes = {}
        for i, x in ipairs(xs) do bytes[i] = string.pack("<f", x) end
        local path = tmpfile("head" .. table.concat(bytes))
        local m = mk.from_file(path, { offset = 4, shape = { 2, 3, 4 } })
        local b = m:to("bfloat16")
        assert.are.same({ 2, 3, 4 }, b.shape)
        assert.is_false(b.readonly)
        local want = {}
        for i, x in ipairs(xs) do want[i] = ref_bf16(x) end
        assert_values(b:reshape({ 24 }):totable(), want, "mapped to bfloat16")
        b:set(1, 0)
        assert.are.equal(xs[1], m:get(1))
        H.assert_error(function() m:to("float64") end, "dtype error: to:", "float64")
        H.assert_error(function() m:to() end, "argument error: to:")
        m, b = nil, nil
        collectgarbage()
        os.remove(path)
    end)
end)

describe("mk.quantize and q:dequantize", function()
    H.seed("tensor_convert_spec quantize")

    -- llama2.c's quantize_q80 on a flat array, in double with float32 steps:
    -- scale = f32(max|x| / 127), q = round_even(f32(x / scale)), zeros -> 0
    local function ref_quantize(xs, group)
        local q, s = {}, {}
        for g = 0, #xs // group - 1 do
            local wmax = 0.0
            for i = 1, group do wmax = math.max(wmax, math.abs(xs[g * group + i])) end
            local scale = f32(wmax / 127)
            s[g + 1] = scale
            for i = 1, group do
                local k = g * group + i
                q[k] = scale > 0 and math.tointeger(round_even(f32(xs[k] / scale))) or 0
            end
        end
        return q, s
    end

    local function divisors(n)
        local d = {}
        for k = 1, n do if n % k == 0 then d[#d + 1] = k end end
        return d
    end

    it("groups the last axis as llama2.c's exporter does (random ranks and groups)", function()
        for _ = 1, 12 do
            local rank = math.random(1, 4)
            local shape = H.rand_shape(rank, 1, 4)
            local group = math.random(1, 24)
            shape[rank] = group * math.random(1, 4)
            local n = H.numel(shape)
            local xs = {}
            for i = 1, n do
                -- each group its own magnitude, so scales differ widely
                local mag = 2.0 ^ (((i - 1) // group) % 9 - 4)
                xs[i] = f32((math.random() - 0.5) * mag)
            end
            local q, s = mk.quantize(mk.tensor(xs, "float32", shape), group)
            assert.are.equal("int8", q.dtype)
            assert.are.equal("float32", s.dtype)
            assert.are.same(shape, q.shape)
            local sshape = H.copy(shape)
            sshape[rank] = shape[rank] // group
            assert.are.same(sshape, s.shape)
            local wq, ws = ref_quantize(xs, group)
            assert_values(q:reshape({ n }):totable(), wq, "q")
            assert_values(s:reshape({ #ws }):totable(), ws, "scale")
            -- dequantized: q * scale in float32
            local back = q:dequantize(s):reshape({ n }):totable()
            local want = {}
            for i = 1, n do want[i] = f32(wq[i] * ws[(i - 1) // group + 1]) end
            assert_values(back, want, "dequantized")
        end
    end)

    it("rounds ties to even, gives a group of zeros scale 0, and keeps the largest at ±127", function()
        local xs = { 127, 0.5, 1.5, 2.5, -0.5, -3.5, -127, 64,   -- scale 1: ties
                     0, 0, 0, 0, 0, 0, 0, 0,                     -- all zeros
                     0, 0, 1e-30, 0, 0, 0, 0, 0 }                -- one tiny value
        local q, s = mk.quantize(mk.tensor(xs), 8)
        assert.are.same({ 1, 0, 0 }, { s:get(1), s:get(2), s:get(3) > 0 and 0 or 1 })
        assert.are.same({ 127, 0, 2, 2, 0, -4, -127, 64 }, { table.unpack(q:totable(), 1, 8) })
        assert.are.same({ 0, 0, 0, 0, 0, 0, 0, 0 }, { table.unpack(q:totable(), 9, 16) })
        assert.are.equal(127, q:get(19))
        assert.are.equal(f32(1e-30 / 127), s:get(3))
    end)

    it("dequantizes in blocks along every axis, as the DequantizeNode", function()
        for _ = 1, 12 do
            local rank = math.random(1, 4)
            local qshape, sshape = {}, {}
            for d = 1, rank do
                sshape[d] = math.random(1, 3)
                qshape[d] = sshape[d] * math.random(1, 3)
            end
            local n = H.numel(qshape)
            local qv, sv = {}, {}
            for i = 1, n do qv[i] = math.random(-127, 127) end
            for i = 1, H.numel(sshape) do sv[i] = f32((math.random() - 0.5) * 2.0 ^ math.random(-10, 10)) end
            local out = mk.tensor(qv, "int8", qshape):dequantize(mk.tensor(sv, "float32", sshape))
            assert.are.equal("float32", out.dtype)
            assert.are.same(qshape, out.shape)
            -- reference: the multi-index of each element, divided by the block sizes
            local want = {}
            for i = 0, n - 1 do
                local rest, at, stride = i, 0, 1
                for d = rank, 1, -1 do
                    local id = rest % qshape[d]
                    rest = rest // qshape[d]
                    at = at + id // (qshape[d] // sshape[d]) * stride
                    stride = stride * sshape[d]
                end
                want[i + 1] = f32(qv[i + 1] * sv[at + 1])
            end
            assert_values(out:reshape({ n }):totable(), want, "dequantize " .. table.concat(qshape, "x") ..
                " by " .. table.concat(sshape, "x"))
        end
    end)

    it("refuses wrong dtypes, group sizes and shapes", function()
        local x = mk.tensor({ { 1, 2, 3, 4, 5, 6 } })
        H.assert_error(function() mk.quantize(x, 4) end, "argument error: quantize:",
            "the group size 4 does not divide the last dim 6 of [1, 6]")
        H.assert_error(function() mk.quantize(x, 0) end, "argument error: quantize:",
            "the group size must be positive, got 0")
        H.assert_error(function() mk.quantize(x, -3) end, "argument error: quantize:", "positive, got -3")
        H.assert_error(function() mk.quantize(x, 1.5) end, "argument error: quantize:",
            "the group size must be an integer, got 1.5")
        H.assert_error(function() mk.quantize(x) end, "argument error: quantize:", "group size")
        H.assert_error(function() mk.quantize({ 1, 2 }, 2) end, "argument error: quantize:", "tensor")
        for _, dtype in ipairs({ "int64", "bfloat16", "float16", "int8" }) do
            H.assert_error(function() mk.quantize(x:to(dtype), 2) end, "dtype error: quantize:",
                "takes a float32 tensor, not " .. dtype)
        end
        local q, s = mk.quantize(x, 3)
        H.assert_error(function() q:dequantize(s:to("float16")) end, "dtype error: dequantize:",
            "int8 values and float32 scales, not int8 and float16")
        H.assert_error(function() x:dequantize(s) end, "dtype error: dequantize:", "not float32 and float32")
        H.assert_error(function() q:dequantize(mk.tensor({ 1, 2 })) end, "shape error: dequantize:",
            "differ in rank")
        H.assert_error(function() q:dequantize(mk.tensor({ { 1, 2, 3, 4 } })) end, "shape error: dequantize:",
            "scales [1, 4] do not divide [1, 6] into blocks (axis 1)")
        H.assert_error(function() q:dequantize(mk.tensor({ { 1 }, { 2 } })) end, "shape error: dequantize:",
            "(axis 0)")
        H.assert_error(function() q:dequantize("x") end, "argument error: dequantize:", "tensor")
    end)
end)
