-- safetensors files: round trips of every dtype the format names here, the
-- mapping's lifetime, and malformed files (each a clear "file error" naming
-- the file and the tensor, never a crash).
local H = require "spec.helpers"
local mk = H.mk()
H.seed("safetensors_spec")

local function tmpname()
    local p = os.tmpname()
    os.remove(p)
    return p .. ".safetensors"
end

local function write(path, bytes)
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
end

-- a file from a header string and the data bytes
local function file(header, data)
    return string.pack("<I8", #header) .. header .. (data or "")
end

describe("safetensors", function()
    it("round-trips float32, int64 and the storage dtypes, values and shapes", function()
        local path = tmpname()
        local f, fr = H.rand({ 3, 4, 5 })
        local i = mk.tensor({ { 1, -2, 3 }, { 1 << 40, 0, -(1 << 50) } }, "int64")
        local bytes = {}
        for k = 1, 12 do bytes[k] = string.char(math.random(0, 255)) end
        local half = mk.from_bytes(table.concat(bytes), "float16", { 2, 3 })
        local bf = mk.from_bytes(table.concat(bytes), "bfloat16", { 6 })
        local i8 = mk.from_bytes(table.concat(bytes), "int8", { 12 })
        mk.save_safetensors(path, { weight = f, ids = i, half = half, bf = bf, ["ünï \"q\""] = i8 })
        local t = mk.load_safetensors(path)
        local names = {}
        for name in pairs(t) do names[#names + 1] = name end
        table.sort(names)
        assert.are.same({ "bf", "half", "ids", "weight", "ünï \"q\"" }, names)
        H.assert_close(t.weight, fr, 0, 0)
        assert.are.same({ 3, 4, 5 }, t.weight.shape)
        assert.are.same(i:totable(), t.ids:totable())
        assert.are.equal("float16", t.half.dtype)
        assert.are.equal(half:bytes(), t.half:bytes())
        assert.are.equal(bf:bytes(), t.bf:bytes())
        assert.are.equal(i8:bytes(), t["ünï \"q\""]:bytes())
        assert.is_true(t.weight.readonly)
        -- the data start 8-byte aligned (the header is padded)
        local raw = assert(io.open(path, "rb")):read("a")
        assert.are.equal(0, string.unpack("<I8", raw) % 8)
        -- a loaded tensor feeds a model, after the table itself is gone
        local w = t.weight
        t = nil
        collectgarbage()
        collectgarbage()
        local x = mk.input("x", "float32", { 3, 4, 5 })
        local m <close> = mk.compile(x + mk.constant(w, "w"))
        H.assert_close(m:run({ x = mk.zeros("float32", { 3, 4, 5 }) }), fr, 0, 0)
        os.remove(path)
    end)

    it("reads files written elsewhere: metadata, a scalar, escapes", function()
        local path = tmpname()
        local header = '{"__metadata__":{"format":"pt","n":"2"},' ..
            '"a\\u00e9\\ud83d\\ude00":{"dtype":"F32","shape":[],"data_offsets":[0,4]},' ..
            '"b" : { "shape" : [ 2 ] , "dtype" : "I64", "data_offsets" : [4, 20] } }'
        write(path, file(header, string.pack("<f", 1.5) .. string.pack("<i8<i8", 7, -9)))
        local t = mk.load_safetensors(path)
        assert.are.same({ 1 }, t["aé😀"].shape)
        assert.are.equal(1.5, t["aé😀"]:get(1))
        assert.are.same({ 7, -9 }, t.b:totable())
        os.remove(path)
    end)

    it("reads and writes a file without tensors (found by spec/fuzz/safetensors_fuzz.c)", function()
        local path = tmpname()
        write(path, file("{}"))
        assert.are.same({}, mk.load_safetensors(path))
        write(path, file('{"__metadata__":{"k":"v"}}  '))
        assert.are.same({}, mk.load_safetensors(path))
        mk.save_safetensors(path, {})
        assert.are.same({}, mk.load_safetensors(path))
        -- an empty name is a name (found by the fuzzer too)
        mk.save_safetensors(path, { [""] = mk.tensor({ 1, 2 }) })
        assert.are.same({ 1, 2 }, mk.load_safetensors(path)[""]:totable())
        os.remove(path)
    end)

    it("refuses malformed files with a message naming the problem", function()
        local path = tmpname()
        local ok_entry = '"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
        local cases = {
            { "", "shorter than the 8-byte header length" },
            { string.pack("<I8", 1000) .. "{}", "does not fit a file" },
            { file("[1, 2]"), "not a JSON object" },
            { file("{" .. ok_entry, ("\0"):rep(8)), "expected ',' or '}'" },
            { file('{"w":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}}', ("\0"):rep(16)),
              "dtype F64 is not one moonkaas has" },
            { file("{" .. ok_entry .. "}", ("\0"):rep(4)), "outside the 4 bytes of data" },
            { file('{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', ("\0"):rep(8)),
              "hold 8 bytes, the shape needs 12" },
            { file('{"w":{"dtype":"F32","shape":[2,0],"data_offsets":[0,0]}}'), "a dimension is 0" },
            { file('{"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1],"data_offsets":[0,4]}}', "\0\0\0\0"),
              "shape must be a list of at most 6" },
            { file('{"w":{"dtype":"F32","shape":[2]}}'), "needs dtype, shape and data_offsets" },
            { file('{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', ("\0"):rep(8)),
              "data_offsets [8, 0]" },
            { file("{" .. ok_entry .. "," .. ok_entry .. "}", ("\0"):rep(8)), "used twice" },
            { file('{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}'), "whole number" },
            { file('{"w\\u0000":{}}'), "a NUL character" },
            { file('{"w\\ud800":{}}'), "lone surrogate" },
            { file('{"__metadata__":' .. ("["):rep(40) .. ("]"):rep(40) .. "}"), "nested too deeply" },
            { file('{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x', ("\0"):rep(8)),
              "text after the JSON object" },
        }
        for _, c in ipairs(cases) do
            write(path, c[1])
            H.assert_error(function() mk.load_safetensors(path) end, "file error: " .. path, c[2])
        end
        H.assert_error(function() mk.load_safetensors(path .. ".missing") end, "file error:",
            "No such file")
        H.assert_error(function() mk.save_safetensors(path, { w = 3 }) end, "argument error:")
        os.remove(path)
    end)
end)
