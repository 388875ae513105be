-- Host tensors: construction, fields, element access, conversions, errors.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("tensor_spec")

local function tmpfile(bytes)
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
    return path
end

describe("mk.tensor", function()
    it("reads nested tables as float32 by default", function()
        local rows, cols = math.random(2, 5), math.random(2, 5)
        local want = {}
        for i = 1, rows do
            want[i] = {}
            for j = 1, cols do want[i][j] = math.random(-1000, 1000) / 8 end -- exact in float32
        end
        local t = mk.tensor(want)
        assert.are.equal("float32", t.dtype)
        assert.are.same({ rows, cols }, t.shape)
        assert.are.same(want, t:totable())
        assert.are.equal(rows, #t)
        assert.are.equal(rows * cols, t.numel)
        assert.are.equal(2, t.rank)
    end)

    it("rounds to float32", function()
        local t = mk.tensor({ 0.1 })
        assert.are_not.equal(0.1, t:get(1))
        assert.is_true(math.abs(t:get(1) - 0.1) < 1e-8)
    end)

    it("makes int64 tensors on request, keeping 64-bit integers exact", function()
        local big = math.maxinteger - math.random(0, 1000)
        local t = mk.tensor({ { big, -big }, { 7, math.mininteger } }, "int64")
        assert.are.equal("int64", t.dtype)
        assert.are.same({ { big, -big }, { 7, math.mininteger } }, t:totable())
        assert.is_true(math.type(t:get(1)) == "integer")
    end)

    it("accepts integral floats for int64 and refuses fractions", function()
        assert.are.same({ 3 }, mk.tensor({ 3.0 }, "int64"):totable())
        H.assert_error(function() mk.tensor({ 1, 2.5 }, "int64") end, "argument error: tensor:",
            "2.5", "int64")
    end)

    it("builds ranks 1 to 4 and refuses 0-d and 5-d", function()
        for rank = 1, 4 do
            local shape = {}
            for i = 1, rank do shape[i] = math.random(1, 3) end
            local t, ref = H.rand(shape)
            assert.are.same(shape, t.shape)
            local again = mk.tensor(H.nested(ref))
            H.assert_equal_ref(again, ref)
        end
        H.assert_error(function() mk.tensor(3) end, "shape error: tensor:", "0-d")
        H.assert_error(function() mk.tensor({ { { { { 1 } } } } }) end, "shape error: tensor:",
            "deeper than 4")
    end)

    it("refuses empty and ragged tables and non-numbers", function()
        H.assert_error(function() mk.tensor({}) end, "shape error: tensor:", "empty")
        H.assert_error(function() mk.tensor({ {} }) end, "shape error: tensor:", "empty")
        H.assert_error(function() mk.tensor({ { 1, 2 }, { 3 } }) end, "shape error: tensor:",
            "ragged", "[2]")
        H.assert_error(function() mk.tensor({ { 1, 2 }, 3 }) end, "shape error: tensor:", "ragged")
        H.assert_error(function() mk.tensor({ 1, "x" }) end, "argument error: tensor:", "string")
        H.assert_error(function() mk.tensor("x") end, "argument error: tensor:")
    end)

    it("refuses unknown dtypes such as int32, naming the known ones", function()
        local err = H.assert_error(function() mk.tensor({ 1 }, "int32") end, "dtype error: tensor:", "int32")
        for _, name in ipairs({ "float32", "int64", "float16", "bfloat16", "int8" }) do
            assert.is_truthy(err:find(name, 1, true), name .. " in " .. err)
        end
        H.assert_error(function() mk.zeros("float64", { 2 }) end, "dtype error: zeros:", "float64")
        H.assert_error(function() mk.zeros(32, { 2 }) end, "argument error: zeros:", "bfloat16")
    end)

    it("takes a flat table and a shape", function()
        local t = mk.tensor({ 1, 2, 3, 4, 5, 6 }, "float32", { 2, 3 })
        assert.are.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:totable())
        H.assert_error(function() mk.tensor({ 1, 2, 3 }, "float32", { 2, 2 }) end,
            "shape error: tensor:", "3 values")
    end)
end)

describe("mk.zeros", function()
    it("makes zero tensors of a shape", function()
        local z = mk.zeros("int64", { 2, 3, 1 })
        assert.are.same({ { { 0 }, { 0 }, { 0 } }, { { 0 }, { 0 }, { 0 } } }, z:totable())
        assert.are.equal("int64", z.dtype)
    end)

    it("refuses empty, 0-d and 5-d shapes", function()
        H.assert_error(function() mk.zeros("float32", { 2, 0 }) end, "shape error: zeros:",
            "no empty tensors")
        H.assert_error(function() mk.zeros("float32", {}) end, "shape error: zeros:", "0-d")
        H.assert_error(function() mk.zeros("float32", { 1, 1, 1, 1, 1 }) end, "shape error: zeros:",
            "at most 4")
        H.assert_error(function() mk.zeros("float32", { 2, -3 }) end, "shape error: zeros:")
        H.assert_error(function() mk.zeros("float32", { 2.5 }) end, "argument error: zeros:")
        H.assert_error(function() mk.zeros("float32", 3) end, "argument error: zeros:")
    end)
end)

describe("tensor access", function()
    it("gets and sets elements by flat or per-axis 1-based indices", function()
        local t, ref = H.rand({ 3, 4 })
        for _ = 1, 10 do
            local i, j = math.random(1, 3), math.random(1, 4)
            assert.are.equal(ref.data[(i - 1) * 4 + j], t:get(i, j))
            assert.are.equal(ref.data[(i - 1) * 4 + j], t:get((i - 1) * 4 + j))
        end
        t:set(2, 3, 0.5)
        assert.are.equal(0.5, t:get(2, 3))
        t:set(1, -2.25)
        assert.are.equal(-2.25, t:totable()[1][1])
    end)

    it("refuses indices out of range and wrong index counts", function()
        local t = mk.zeros("float32", { 2, 3 })
        H.assert_error(function() t:get(7) end, "argument error: get:", "out of range")
        H.assert_error(function() t:get(0) end, "argument error: get:", "out of range")
        H.assert_error(function() t:get(1, 4) end, "argument error: get:", "axis 1")
        H.assert_error(function() t:get(1, 1, 1) end, "argument error: get:", "3 indices")
        H.assert_error(function() t:set(1, "x") end, "argument error: set:")
        local i = mk.zeros("int64", { 2 })
        H.assert_error(function() i:set(1, 0.5) end, "argument error: set:", "not an integer")
    end)

    it("finds the first largest element with argmax", function()
        local t, ref = H.rand({ 50 })
        local best = 1
        for i = 2, 50 do if ref.data[i] > ref.data[best] then best = i end end
        assert.are.equal(best, t:argmax())
        local tie = mk.tensor({ 1, 5, 5, 2 })
        assert.are.equal(2, tie:argmax())
    end)

    it("copies", function()
        local t, ref = H.rand({ 2, 2 })
        local c = t:copy()
        c:set(1, 42)
        H.assert_equal_ref(t, ref)
        assert.are.equal(42, c:get(1))
    end)
end)

describe("bytes", function()
    it("round-trips through from_bytes as a copy", function()
        local t, ref = H.rand({ 3, 5 })
        local s = t:bytes()
        assert.are.equal(60, #s)
        local u = mk.from_bytes(s, "float32", { 5, 3 })
        assert.are.same({ 5, 3 }, u.shape)
        H.assert_equal_ref(u, { shape = { 5, 3 }, data = ref.data })
        u:set(1, 9)
        H.assert_equal_ref(t, ref)
        local p = string.pack("<i8<i8", -5, 1 << 40)
        assert.are.same({ -5, 1 << 40 }, mk.from_bytes(p, "int64", { 2 }):totable())
    end)

    it("refuses a byte count that does not match", function()
        H.assert_error(function() mk.from_bytes("abc", "float32", { 1 }) end,
            "argument error: from_bytes:", "3 bytes", "4 expected")
        H.assert_error(function() mk.from_bytes(12, "float32", { 1 }) end, "argument error: from_bytes:")
    end)
end)

describe("storage dtypes (float16, bfloat16, int8)", function()
    local sizes = { float16 = 2, bfloat16 = 2, int8 = 1 }

    local function random_bytes(n)
        local b = {}
        for i = 1, n do b[i] = string.char(math.random(0, 255)) end
        return table.concat(b)
    end

    it("are made by zeros, from_bytes and from_file, sized by the dtype table", function()
        for dtype, size in pairs(sizes) do
            local shape = H.rand_shape(math.random(1, 4), 1, 4)
            local n = H.numel(shape)
            local z = mk.zeros(dtype, shape)
            assert.are.equal(dtype, z.dtype)
            assert.are.same(shape, z.shape)
            assert.are.equal(string.rep("\0", n * size), z:bytes())
            local bytes = random_bytes(n * size)
            local t = mk.from_bytes(bytes, dtype, shape)
            assert.are.equal(bytes, t:bytes())
            assert.are.equal(bytes, t:copy():bytes())
            H.assert_error(function() mk.from_bytes(bytes .. "x", dtype, shape) end,
                "argument error: from_bytes:", (n * size + 1) .. " bytes", (n * size) .. " expected")
            local path = os.tmpname()
            local f = assert(io.open(path, "wb"))
            f:write(string.rep("p", 2 * size) .. bytes)
            f:close()
            local m = mk.from_file(path, { offset = 2 * size, dtype = dtype, shape = shape })
            assert.are.equal(bytes, m:bytes())
            assert.is_true(m.readonly)
            if size > 1 then
                H.assert_error(function() mk.from_file(path, { offset = 1, dtype = dtype, shape = { 1 } }) end,
                    "file error: " .. path .. ":", "multiple of " .. size, dtype)
            end
            m = nil
            collectgarbage()
            os.remove(path)
        end
    end)

    it("say clearly that their elements are not readable from Lua yet", function()
        for dtype in pairs(sizes) do
            local t = mk.zeros(dtype, { 2, 3 })
            local why = dtype .. " elements cannot be read or written from Lua yet"
            H.assert_error(function() t:get(1) end, "dtype error: get:", why, "mk.from_bytes")
            H.assert_error(function() t:set(1, 1) end, "dtype error: set:", why)
            H.assert_error(function() t:totable() end, "dtype error: totable:", why)
            H.assert_error(function() t:argmax() end, "dtype error: argmax:", why)
            H.assert_error(function() mk.tensor({ 1, 2 }, dtype) end, "dtype error: tensor:", why)
            -- tostring never raises (print and error messages use it)
            local s = tostring(t)
            assert.is_truthy(s:find("tensor " .. dtype .. " [2, 3]", 1, true), s)
            -- as nodes they take the core's rules: numbers cannot become constants of them
            local x = mk.input("x", dtype, { 2, 3 })
            assert.are.equal(dtype, x.dtype)
            H.assert_error(function() return x + 1 end, "dtype error:", why)
        end
    end)
end)

describe("mk.from_file", function()
    it("maps a file without copying: offset, dtype and shape", function()
        local head = string.pack("<i4<i4<i4", 7, 8, 9)
        local floats, vals = {}, {}
        for i = 1, 12 do
            vals[i] = math.random(-4000, 4000) / 16
            floats[i] = string.pack("<f", vals[i])
        end
        local ints = string.pack("<i8<i8", 123456789012, -3)
        local path = tmpfile(head .. table.concat(floats) .. "pad." .. ints)
        local t = mk.from_file(path, { offset = 12, dtype = "float32", shape = { 3, 4 } })
        assert.are.same({ 3, 4 }, t.shape)
        assert.is_true(t.readonly)
        H.assert_equal_ref(t, { shape = { 3, 4 }, data = vals })
        local i = mk.from_file(path, { offset = 64, dtype = "int64", shape = { 2 } })
        assert.are.same({ 123456789012, -3 }, i:totable())
        local h = mk.from_file(path, { shape = { 3 } }) -- offset 0, float32
        assert.are.equal(3, #h)
        H.assert_error(function() t:set(1, 0) end, "argument error: set:", "read-only")
        -- the mapping outlives the Lua references to the path; tensors keep it alive
        t, i, h = nil, nil, nil
        collectgarbage()
        os.remove(path)
    end)

    it("keeps the mapping alive while a tensor lives", function()
        local vals = {}
        for k = 1, 8 do vals[k] = string.pack("<f", k) end
        local path = tmpfile(table.concat(vals))
        local t = mk.from_file(path, { shape = { 8 } })
        local u = mk.from_file(path, { offset = 16, shape = { 4 } })
        t = nil
        collectgarbage()
        collectgarbage()
        assert.are.same({ 5, 6, 7, 8 }, u:totable())
        os.remove(path)
        assert.are.same({ 5, 6, 7, 8 }, u:totable())
    end)

    it("can serve as a constant of a compiled model", function()
        local w = {}
        for k = 1, 6 do w[k] = math.random(-100, 100) / 4 end
        local bytes = {}
        for k = 1, 6 do bytes[k] = string.pack("<f", w[k]) end
        local path = tmpfile("pad!" .. table.concat(bytes))
        local W = mk.from_file(path, { offset = 4, shape = { 2, 3 } })
        local x = mk.input("x", "float32", { 2 })
        local model = mk.compile(x:matmul(mk.constant(W, "w")))
        W = nil
        collectgarbage()
        local out = model:run({ x = mk.tensor({ 1, -2 }) })
        H.assert_close(out, { shape = { 3 }, data = { w[1] - 2 * w[4], w[2] - 2 * w[5], w[3] - 2 * w[6] } })
        model:close()
        os.remove(path)
    end)

    it("gives one-line errors naming the file", function()
        local path = tmpfile(string.rep("\0", 40))
        H.assert_error(function() mk.from_file(path, { offset = 8, shape = { 9 } }) end,
            "file error: " .. path .. ":", "past the end", "40 bytes")
        H.assert_error(function() mk.from_file(path, { offset = 44, shape = { 1 } }) end,
            "file error: " .. path .. ":", "past the end")
        H.assert_error(function() mk.from_file(path, { offset = -4, shape = { 1 } }) end,
            "file error: " .. path .. ":", "negative")
        H.assert_error(function() mk.from_file(path, { offset = 2, shape = { 1 } }) end,
            "file error: " .. path .. ":", "multiple of 4")
        H.assert_error(function() mk.from_file(path .. ".missing", { shape = { 1 } }) end,
            "file error: " .. path .. ".missing:", "No such file")
        H.assert_error(function() mk.from_file("/tmp", { shape = { 1 } }) end,
            "file error: /tmp:", "not a regular file")
        H.assert_error(function() mk.from_file(path, { offset = 0 }) end, "argument error: from_file:",
            "shape")
        H.assert_error(function() mk.from_file(path, { shape = { 1 }, ofset = 4 }) end,
            "argument error: from_file:", "ofset")
        H.assert_error(function() mk.from_file(path, { shape = { 0 } }) end, "shape error: from_file:")
        os.remove(path)
    end)
end)

describe("tostring", function()
    it("shows dtype, shape and the first elements", function()
        assert.are.equal("tensor float32 [2, 3] {{1, 2, 3}, {4, 5, 6}}",
            tostring(mk.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })))
        assert.are.equal("tensor int64 [2] {-7, 9007199254740993}",
            tostring(mk.tensor({ -7, 9007199254740993 }, "int64")))
    end)

    it("truncates large tensors", function()
        local s = tostring(mk.zeros("float32", { 1000, 1000 }))
        assert.is_true(#s < 420)
        assert.is_truthy(s:find("^tensor float32 %[1000, 1000%] {{0, 0, 0, 0, 0, %.%.%.}"))
    end)
end)

describe("conversions on the host (t:to, mk.quantize, q:dequantize)", function()
    -- float32 of x, exactly (string.pack rounds to nearest)
    local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

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
