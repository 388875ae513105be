-- Errors about a node built in Lua name the Lua line that built it first, then
-- the line of the lowered script: "where_spec.lua:12: shape error: ... (script:5:1)".
local H = require "spec.helpers"
local mk = H.mk()
H.seed("where_spec")

-- The message of f()'s error; fails when f does not raise.
local function error_of(f)
    local ok, err = pcall(f)
    assert.is_false(ok, "expected an error")
    return tostring(err)
end

-- "spec/where_spec.lua:12: ": the caller's line, as Lua names it.
local function here()
    local i = debug.getinfo(2, "Sl")
    return i.short_src .. ":" .. i.currentline .. ": "
end

local function starts(prefix, s)
    assert.are.equal(prefix, s:sub(1, #prefix), s)
end

describe("errors at the user's line", function()
    it("a shape error while building names the line of the call", function()
        local x = mk.input("x", "float32", { 4, 3 })
        local w = mk.input("w", "float32", { 4, 5 })
        local at = here(); local err = error_of(function() return x:matmul(w) end)
        starts(at .. "shape error: MatMulNode: cannot multiply [4, 3] by [4, 5]", err)
        -- an operator: the metamethod's caller, not the C builder
        at = here(); err = error_of(function() return x + mk.input("b", "float32", { 2, 3 }) end)
        starts(at .. "shape error: SumNode:", err)
        at = here(); err = error_of(function() return x:reshape(5, 2) end)
        starts(at .. "shape error: ReshapeNode:", err)
    end)

    it("so does every other error of a builder: arguments, leaves, unary operators", function()
        local x = mk.input("x", "float32", { 4, 3 })
        local at = here(); local err = error_of(function() local y = x + "s"; return y end)
        starts(at .. "argument error: SumNode (+):", err)
        at = here(); err = error_of(function() local y = mk.input("y", "float32", {}); return y end)
        starts(at .. "shape error: input:", err)
        at = here(); err = error_of(function() local y = x:reshape(1, 2, 3, 4, 5, 6, 7); return y end)
        starts(at .. "shape error: reshape:", err)
        at = here(); err = error_of(function() local y = -mk.input("i", "int64", { 2 }) * x; return y end)
        starts(at .. "dtype error: HadamardProductNode:", err)
        -- one position, not one per builder on the way
        assert.is_nil(err:find(".lua:%d+: .*%.lua:%d+: "), err)
    end)

    it("a node remembers its line: mk.node_info and mk.lower's sources", function()
        local at = here(); local x = mk.input("x", "float32", { 3 })
        local y = x:relu()
        local y_at = at:gsub("%d+: $", "") .. (debug.getinfo(1, "l").currentline - 1)
        assert.are.equal(at:sub(1, -3), mk.node_info(x).where)
        assert.are.equal(y_at, y.where)
        assert.are.equal(y_at, mk.node_info(y).where)
        local text, _, sources = mk.lower(y)
        assert.are.equal("$2 = ReLUNode($1);", text:match("[^\n]*\n([^\n]*)"))
        assert.are.same({ at:sub(1, -3), y_at }, sources)
    end)

    it("a compile error names the line that built the node, then the script's line", function()
        local x = mk.input("x", "float16", { 2, 3 })
        local at = here(); local y = x + 1
        local err = error_of(function() mk.compile(y) end)
        starts(at .. "dtype error: float16 is not supported by SumNode on cpu", err)
        assert.truthy(err:find("(script:3:1)", 1, true), err)
        -- a script the user lowered and edited: its sources still name the lines
        local text, constants, sources = mk.lower(x:relu())
        text = text:gsub("ReLUNode%(%$1%)", "ReLUNode($3)")
        err = error_of(function() mk.compile_script(text, constants, nil, sources) end)
        starts(sources[2] .. ": name error: $3", err)
        assert.truthy(err:find("(script:2:", 1, true), err)
        -- without sources, the script's position as before
        starts("script:2:", error_of(function() mk.compile_script(text, constants) end))
        H.assert_error(function() mk.compile_script(text, constants, nil, 5) end,
            "argument error: compile: sources must be a table")
    end)

    it("a run-time fault names the line that built the faulting node", function()
        local rows, d = math.random(2, 6), math.random(1, 4)
        local x = mk.input("x", "float32", { rows, d })
        local r = mk.input("r", "float32", { 1, d })
        local p = mk.input("p", "int64", { 1 })
        local at = here(); local y = (x * 1):replace(r, p, p + 1)
        local m <close> = mk.compile(y)
        local feeds = { x = H.rand({ rows, d }), r = H.rand({ 1, d }), p = mk.tensor({ rows }, "int64") }
        local err = error_of(function() m:run(feeds) end)
        starts(at .. "evaluation error: ReplaceSliceNode: rows [" .. rows .. ", " .. rows + 1 .. ")", err)
        assert.truthy(err:find("%(script:%d+:1%)$"), err)
        -- run_steps, and the model still runs
        err = error_of(function() m:run_steps(1, feeds, { mk.zeros("float32", { 1, rows, d }) }) end)
        starts(at .. "evaluation error: ReplaceSliceNode:", err)
        feeds.p = mk.tensor({ 0 }, "int64")
        assert.are.same({ rows, d }, m:run(feeds).shape)
    end)

    it("a network built by the module's own Lua files names the user's line", function()
        -- mk.compile lowers in init.lua; the faulting node's line is still ours
        local e = mk.input("e", "int64", { 1 })
        local x = mk.input("x", "float32", { 2, 3, 5 })
        local at = here(); local y = x:causal_softmax(e)
        local m <close> = mk.compile(y)
        local err = error_of(function() m:run({ x = H.rand({ 2, 3, 5 }), e = mk.tensor({ 2 }, "int64") }) end)
        starts(at .. "evaluation error: CausalSoftmaxNode: end 2", err)
    end)
end)
