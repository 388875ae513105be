-- scripts/demo.lua runs as a user would run it, in a separate interpreter.
local H = require "spec.helpers"

describe("scripts/demo.lua", function()
    it("prints the script, the result and the statistics on the CPU", function()
        local lua = os.getenv("LUA") or "lua5.4"
        local p = assert(io.popen(lua .. " scripts/demo.lua cpu 2>&1"))
        local out = p:read("a")
        local ok, how, code = p:close()
        assert.is_true(ok, string.format("demo exited (%s %s):\n%s", tostring(how), tostring(code), out))
        for _, want in ipairs({
            "$1 = InputTensor(x, float32, [4, 16]);",
            "MatMulNode",
            "-- device: cpu",
            "row 4: {",
            "arena_bytes",
            "lower_bound_bytes",
            "-- compiled script (after passes):",
        }) do
            assert.is_truthy(out:find(want, 1, true), want .. " missing from:\n" .. out)
        end
        -- each row of the result is a probability distribution
        for row in out:gmatch("row %d+: {([^}]*)}") do
            local sum = 0
            for v in row:gmatch("[%d.]+") do sum = sum + tonumber(v) end
            assert.is_true(math.abs(sum - 1) < 0.01, "row sums to " .. sum)
        end
        H.mk() -- the module loads in this process too
    end)
end)
