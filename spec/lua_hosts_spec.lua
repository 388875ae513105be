-- What the binding does differently, or must do the same, on Lua 5.1 and
-- LuaJIT (lua/compat.h): int64 elements as doubles, integer arguments, user
-- values, io handles. Runs on every host: make test, test-lua51, test-luajit.

local H = require("spec.helpers")
local mk = H.mk()
local lua51 = require("moonkaas.compat").lua51

local function E(fn, ...)
    local ok, err = pcall(fn)
    assert.is_false(ok, "no error")
    err = tostring(err)
    for _, part in ipairs({ ... }) do
        assert.truthy(err:find(part, 1, true), string.format("%q not in %q", part, err))
    end
    return err
end

local function int64_bytes(hi, lo) -- two's complement, little-endian, from 32-bit halves
    local s = {}
    for _, w in ipairs({ lo, hi }) do
        for _ = 1, 4 do
            s[#s + 1] = string.char(w % 256)
            w = math.floor(w / 256)
        end
    end
    return table.concat(s)
end

describe("Lua hosts", function()
    it("read int64 elements exactly up to 2^53, and past it only where Lua has integers", function()
        H.seed("hosts int64")
        local vals = { 2 ^ 53, -2 ^ 53, 0 }
        for i = 4, 40 do
            vals[i] = math.floor((math.random() * 2 - 1) * 2 ^ math.random(1, 53))
        end
        local t = mk.tensor(vals, "int64", { #vals })
        for i, v in ipairs(vals) do assert.are.equal(v, t:get(i)) end
        assert.are.same(vals, t:totable())
        -- 2^60 + 1 (hi word 2^28), random low bits past 2^53: no double holds them
        local lo = math.random(1, 2 ^ 31 - 1) * 2 + 1
        local big = mk.from_bytes(int64_bytes(2 ^ 28, lo), "int64", { 1 })
        if lua51 then
            E(function() return big:get(1) end, "dtype error", "beyond 2^53")
            E(function() return big:totable() end, "dtype error", "beyond 2^53")
            -- 2^60 = 1152921504 * 10^9 + 606846976: the exact decimal, in doubles
            local low = 606846976 + lo
            local exact = string.format("%d%09d", 1152921504 + math.floor(low / 1e9), low % 1e9)
            assert.truthy(tostring(big):find(exact, 1, true), tostring(big) .. " " .. exact)
        else
            assert.are.equal(2 ^ 60 + lo, big:get(1) + 0.0) -- the integer, compared as a double
            assert.truthy(tostring(big):find(tostring(big:get(1)), 1, true))
        end
        assert.are.equal(5, t:get(1) - 2 ^ 53 + 5) -- the context and the tensor stay usable
    end)

    it("take integral numbers as integers and refuse fractions", function()
        local t = mk.zeros("int64", { 2.0, 3 })
        assert.are.same({ 2, 3 }, t.shape)
        t:set(2, 7.0)
        assert.are.equal(7, t:get(2))
        E(function() t:set(1, 2.5) end, "argument error: set:", "2.5 is not an integer")
        E(function() mk.zeros("float32", { 2.5 }) end, "argument error", "must be an integer")
        E(function() t:get(1.5) end, "argument error")
        local x = mk.input("x", "float32", { 2 })
        E(function() mk.compile(x:relu(), { max_bytes = -1 }) end, "max_bytes", "-1")
        E(function() mk.compile(x:relu(), { max_bytes = 0.5 }) end, "max_bytes", "0.5")
        E(function() mk.compile(x:relu(), { max_bytes = {} }) end, "max_bytes", "table: ")
        assert.are.same({ 2, 0 }, mk.compile(x:relu(), { max_bytes = 1048576 }):run({ x = mk.tensor({ 2, -1 }) }):totable())
    end)

    it("keep a mapped file alive through a view's user value", function()
        H.seed("hosts mapping")
        local vals = {}
        for i = 1, 12 do vals[i] = H.f32(math.random() * 10 - 5) end
        local path = os.tmpname()
        local f = assert(io.open(path, "wb"))
        f:write(mk.tensor(vals):bytes())
        f:close()
        local view
        do
            local mapped = mk.from_file(path, { dtype = "float32", shape = { 12 } })
            view = mapped:reshape({ 3, 4 })
        end
        for _ = 1, 3 do collectgarbage() end
        os.remove(path)
        local got = {}
        for r, row in ipairs(view:totable()) do
            for c, v in ipairs(row) do got[(r - 1) * 4 + c] = v end
        end
        assert.are.same(vals, got)
    end)

    it("tell a terminal from a file, a closed file and a non-file", function()
        local path = os.tmpname()
        local f = assert(io.open(path, "w"))
        assert.is_false(mk.is_terminal(f))
        f:close()
        assert.is_false(mk.is_terminal(f))
        os.remove(path)
        E(function() mk.is_terminal({}) end, "argument error: is_terminal:", "expects a Lua file")
    end)
end)
