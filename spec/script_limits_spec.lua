-- Scripts at their edges: a NUL byte anywhere is a syntax error at its line
-- and column (never the text before it compiled alone); names are limited by
-- memory alone, the same in every position; a long chain of views compiles in
-- time linear in its length.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("script_limits_spec")

describe("a NUL byte in a script", function()
    local script = table.concat({
        "$1 = InputTensor(pos, int64, [1]);",
        "$2 = SumNode($1, $1);",
        "result = $2;",
        "next pos = pos + 1;",
    }, "\n")

    it("is a syntax error at its line and column, wherever it is", function()
        for _, at in ipairs({ 1, math.random(2, #script - 1), #script, #script + 1 }) do
            local text = script:sub(1, at - 1) .. "\0" .. script:sub(at)
            local before = script:sub(1, at - 1)
            local line = select(2, before:gsub("\n", "")) + 1
            local column = #before - (before:match(".*()\n") or 0) + 1
            for _, f in ipairs({ mk.compile_script, mk.format_script }) do
                local ok, e = pcall(f, text)
                assert.is_false(ok)
                assert.are.equal(string.format("script:%d:%d: syntax error: a NUL byte in the script",
                                               line, column), tostring(e))
            end
        end
    end)

    it("leaves the script without one as it was: the next line kept", function()
        local m = mk.compile_script(script)
        local outs = m:run_steps(3, { pos = mk.tensor({ 5 }, "int64") })
        assert.are.same({ { 10 }, { 12 }, { 14 } }, outs[1]:totable())
    end)
end)

describe("names", function()
    local function random_name(n)
        local chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789"
        local t = { "n" }
        for i = 2, n do
            local k = math.random(1, #chars)
            t[i] = chars:sub(k, k)
        end
        return table.concat(t)
    end

    for _, len in ipairs({ 127, 128, 200, 5000, 100000 }) do
        it("of " .. len .. " characters work in inputs, constants and next lines", function()
            local counter, const = random_name(len), random_name(len)
            local script = table.concat({
                "$1 = InputTensor(" .. counter .. ", int64, [1]);",
                "$2 = ConstantTensor(" .. const .. ", int64, [1]);",
                "$3 = SumNode($1, $2);",
                "result = $3;",
                "next " .. counter .. " = " .. counter .. " + 2;",
            }, "\n")
            assert.are.equal(script .. "\n", mk.format_script(script))
            local c = math.random(-50, 50)
            local m = mk.compile_script(script, { [const] = mk.tensor({ c }, "int64") })
            local x0 = math.random(-1000, 1000)
            local outs = m:run_steps(3, { [counter] = mk.tensor({ x0 }, "int64") })
            assert.are.same({ { x0 + c }, { x0 + 2 + c }, { x0 + 4 + c } }, outs[1]:totable())
            local wrong = script:gsub("next " .. counter, "next " .. counter .. "x", 1)
            local ok, e = pcall(mk.compile_script, wrong, { [const] = mk.tensor({ c }, "int64") })
            assert.is_false(ok)
            -- (a message holds at most 1,024 bytes: a long name is cut there)
            local want = #counter < 900 and "next: '" .. counter .. "x' is not an input of the script"
                         or "name error: next: '" .. counter:sub(1, 900)
            assert.is_true(tostring(e):find(want, 1, true) ~= nil, tostring(e):sub(1, 300))
        end)
    end
end)

describe("a chain of views", function()
    -- 100,000 nodes cycling reshape [4, 6] -> [6, 4], permute -> [4, 6], slice
    -- rows 0..4; the old walk from each node to its memory's root was quadratic
    -- (10,000 views 1.5 s, 40,000 9 s, 100,000 over 300 s); the bound below is
    -- no benchmark (scripts/ has those), only far below quadratic.
    it("of 100,000 reshapes, permutes and slices compiles in linear time, and computes", function()
        local N = 100000
        local lines = { "$1 = InputTensor(x, float32, [4, 6]);" }
        for id = 1, N - 1 do
            local k = id % 3
            if k == 1 then lines[#lines + 1] = string.format("$%d = ReshapeNode($%d, [6, 4]);", id + 1, id)
            elseif k == 2 then lines[#lines + 1] = string.format("$%d = PermuteNode($%d, [1, 0]);", id + 1, id)
            else lines[#lines + 1] = string.format("$%d = SliceNode($%d, 0, 4);", id + 1, id) end
        end
        local last = N
        if (N - 1) % 3 ~= 0 then error("the chain must end on [4, 6]") end
        lines[#lines + 1] = string.format("result = $%d;", last)
        local t0 = mk.clock()
        local m = mk.compile_script(table.concat(lines, "\n"))
        local seconds = mk.clock() - t0
        print(string.format("# %d views compiled in %.2f s", N, seconds))
        assert.is_true(seconds < 30, string.format("%.1f s", seconds))
        -- the reference: (N - 1) / 3 rounds of y = reshape(x, [6, 4])^T
        local x, xr = H.rand({ 4, 6 })
        local v = xr.data
        for _ = 1, (N - 1) // 3 do
            local y = {}
            for i = 0, 3 do -- y[i][j] = r[j][i], r = v as [6, 4]
                for j = 0, 5 do y[i * 6 + j + 1] = v[j * 4 + i + 1] end
            end
            v = y
        end
        H.assert_close(m:run({ x = x }), { shape = { 4, 6 }, data = v }, 0, 0)
    end)
end)
