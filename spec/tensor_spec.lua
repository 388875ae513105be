-- Host tensors: construction, fields, element access, bytes, files, reshape,
-- errors. Element conversions (float16, bfloat16, int8, t:to, mk.quantize):
-- tensor_convert_spec.lua.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("tensor_spec")
local tmpfile = H.tmpfile

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

    it("builds ranks 1 to 6 and refuses 0-d and 7-d", function()
        for rank = 1, 6 do
            local shape = {}
            for i = 1, rank do shape[i] = math.random(1, 3) end
            local t, ref = H.rand(shape)
            assert.are.same(shape, t.shape)
            local again = mk.tensor(H.nested(ref))
            H.assert_equal_ref(again, ref)
        end
        H.assert_error(function() mk.tensor(3) end, "shape error: tensor:", "0-d")
        H.assert_error(function() mk.tensor({ { { { { { { 1 } } } } } } }) end, "shape error: tensor:",
            "deeper than 6")
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

    it("refuses empty, 0-d and 7-d shapes", function()
        H.assert_error(function() mk.zeros("float32", { 2, 0 }) end, "shape error: zeros:",
            "no empty tensors")
        H.assert_error(function() mk.zeros("float32", {}) end, "shape error: zeros:", "0-d")
        H.assert_error(function() mk.zeros("float32", { 1, 1, 1, 1, 1, 1, 1 }) end, "shape error: zeros:",
            "at most 6")
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

    it("gives the bytes of a range of elements, for writing in pieces", function()
        local vals = {}
        for i = 1, 20 do vals[i] = math.random(-128, 127) end
        local t = mk.tensor(vals, "int8", { 4, 5 })
        local f = mk.tensor(vals):to("bfloat16")
        for _ = 1, 10 do
            local i = math.random(1, 20)
            local j = math.random(i, 20)
            assert.are.equal(string.pack("<" .. string.rep("i1", j - i + 1), table.unpack(vals, i, j)), t:bytes(i, j))
            assert.are.equal(f:bytes():sub(2 * i - 1, 2 * j), f:bytes(i, j))
            assert.are.equal(t:bytes():sub(i), t:bytes(i))
        end
        H.assert_error(function() t:bytes(0, 3) end, "argument error: bytes:", "elements 0 to 3 are not a range of 1 to 20")
        H.assert_error(function() t:bytes(3, 21) end, "argument error: bytes:", "3 to 21")
        H.assert_error(function() t:bytes(5, 4) end, "argument error: bytes:", "5 to 4")
        H.assert_error(function() t:bytes(1.5) end, "argument error: bytes:", "integer")
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

    it("read and write their elements from Lua; as nodes they take the core's rules", function()
        for dtype in pairs(sizes) do
            local t = mk.zeros(dtype, { 2, 3 })
            t:set(2, 3, 5)
            assert.are.equal(5, t:get(2, 3))
            assert.are.same({ { 0, 0, 0 }, { 0, 0, 5 } }, t:totable())
            assert.are.equal(6, t:argmax())
            assert.are.equal("tensor " .. dtype .. " [2, 3] {{0, 0, 0}, {0, 0, 5}}", tostring(t))
            -- a number becomes a constant of the node's dtype; the CPU has no SumNode for it
            local x = mk.input("x", dtype, { 2, 3 })
            assert.are.equal(dtype, x.dtype)
            local y = x + 1
            assert.are.equal(dtype, y.dtype)
            H.assert_error(function() mk.compile(y) end, "dtype error: " .. dtype ..
                " is not supported by SumNode on cpu", "(script:")
        end
        H.assert_error(function() return mk.input("x", "int8", { 2 }) + 300 end, "dtype error:",
            "300 is out of range for int8 (-128 to 127)")
        H.assert_error(function() return mk.input("x", "int8", { 2 }) + 0.5 end, "dtype error:",
            "0.5 is not an integer")
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

-- float32 of x, exactly (string.pack rounds to nearest)
local f32 = H.f32

describe("t:reshape(shape)", function()
    H.seed("tensor_spec reshape")

    it("copies an owned tensor's elements into another shape", function()
        local t, ref = H.rand({ 3, 4 })
        local r = t:reshape({ 2, 2, 3 })
        assert.are.same({ 2, 2, 3 }, r.shape)
        H.assert_equal_ref(r, { shape = { 2, 2, 3 }, data = ref.data })
        r:set(1, 99)
        H.assert_equal_ref(t, ref) -- a copy
        local i8 = mk.tensor({ 1, -2, 3, -4 }, "int8"):reshape({ 2, 2 })
        assert.are.same({ { 1, -2 }, { 3, -4 } }, i8:totable())
    end)

    it("views a read-only (mapped) tensor without a copy, keeping the mapping alive", function()
        local vals, bytes = {}, {}
        for i = 1, 12 do
            vals[i] = f32(math.random() - 0.5)
            bytes[i] = string.pack("<f", vals[i])
        end
        local path = tmpfile(table.concat(bytes))
        local m = mk.from_file(path, { shape = { 12 } })
        local v = m:reshape({ 4, 3 })
        assert.is_true(v.readonly)
        m = nil
        collectgarbage()
        collectgarbage()
        os.remove(path)
        H.assert_equal_ref(v, { shape = { 4, 3 }, data = vals })
        H.assert_error(function() v:set(1, 0) end, "argument error: set:", "read-only")
        local again = v:reshape({ 2, 6 })
        collectgarbage()
        H.assert_equal_ref(again, { shape = { 2, 6 }, data = vals })
    end)

    it("refuses another element count and bad shapes", function()
        local t = mk.zeros("bfloat16", { 2, 3 })
        H.assert_error(function() t:reshape({ 4 }) end, "shape error: reshape:", "[4] has 4 elements, [2, 3] has 6")
        H.assert_error(function() t:reshape({ 6, 0 }) end, "shape error: reshape:")
        H.assert_error(function() t:reshape(6) end, "argument error: reshape:")
        H.assert_error(function() t:reshape({ 1, 1, 1, 1, 1, 2, 3 }) end, "shape error: reshape:")
    end)
end)
