-- Lowering a node DAG to the script IR, and compiling scripts from anywhere.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("script_spec")

local E = H.assert_error

describe("mk.script", function()
    it("prints $1..$N in topological order and result = $N", function()
        local x = mk.input("x", "float32", { 128, 28, 28 })
        local w1 = mk.constant(mk.zeros("float32", { 784, 1000 }), "w1")
        local y = x:reshape({ 128, 784 }):matmul(w1):relu()
        assert.are.equal(table.concat({
            "$1 = InputTensor(x, float32, [128, 28, 28]);",
            "$2 = ReshapeNode($1, [128, 784]);",
            "$3 = ConstantTensor(w1, float32, [784, 1000]);",
            "$4 = MatMulNode($2, $3);",
            "$5 = ReLUNode($4);",
            "result = $5;",
        }, "\n") .. "\n", mk.script(y))
    end)

    it("prints every node kind with its arguments", function()
        local x = mk.input("x", "float32", { 4, 2 })
        local kv = mk.buffer("float32", { 8, 2 })
        local pos = mk.input("pos", "int64", { 1 })
        local ids = mk.input("ids", "int64", { 3 })
        local y = kv:replace(x:slice(1, 2):silu(), 3, 4)
        local z = mk.embedding(y, ids):sliced_softmax(pos):permute({ 1, 0 }):argmax()
        local s = mk.script(z)
        for _, want in ipairs({
            "= BufferTensor(float32, [8, 2]);",
            "= SliceNode($", ", 1, 2);",
            "= SiLUNode($",
            "= ConstantTensor(constant_1, int64, [1]);",
            "= ConstantTensor(constant_2, int64, [1]);",
            "= ReplaceSliceNode($",
            "= InputTensor(ids, int64, [3]);",
            "= EmbeddingNode($",
            "= InputTensor(pos, int64, [1]);",
            "= SlicedSoftmaxNode($",
            "= PermuteNode($", ", [1, 0]);",
            "= ArgMaxNode($",
        }) do
            assert.is_truthy(s:find(want, 1, true), want .. " in\n" .. s)
        end
        -- the core parses what the lowering prints, unchanged
        assert.are.equal(s, mk.format_script(s))
    end)

    it("prints a buffer's name where it has one", function()
        local s = mk.script(mk.buffer("float32", { 8, 2 }, "cache") + mk.buffer("float32", { 8, 2 }))
        assert.is_truthy(s:find("= BufferTensor(float32, [8, 2], cache);", 1, true), s)
        assert.is_truthy(s:find("= BufferTensor(float32, [8, 2]);", 1, true), s)
        assert.are.equal(s, mk.format_script(s))
        assert.are.equal("cache", mk.buffer("int64", { 1 }, "cache").name)
    end)

    it("prints a node shared by several users once", function()
        local x = mk.input("x", "float32", { 3 })
        local r = x:relu()
        local y = (r + r) * r
        local s = mk.script(y)
        local _, relus = s:gsub("ReLUNode", "")
        local _, inputs = s:gsub("InputTensor", "")
        assert.are.equal(1, relus)
        assert.are.equal(1, inputs)
        assert.is_truthy(s:find("result = $4;", 1, true))
    end)

    it("handles deep chains without recursion limits", function()
        local x = mk.input("x", "float32", { 2 })
        local y = x
        for _ = 1, 3000 do y = y:relu() end
        local s = mk.script(y)
        assert.is_truthy(s:find("result = $3001;", 1, true))
    end)

    it("names constants, avoiding names already taken", function()
        local x = mk.input("constant_1", "float32", { 2 })
        local y = (x + mk.constant(mk.tensor({ 1, 2 }))) * mk.constant(mk.tensor({ 3, 4 }), "constant_3")
        local text, constants = mk.lower(y * 2)
        assert.is_truthy(text:find("ConstantTensor(constant_2, float32, [2])", 1, true))
        assert.is_truthy(text:find("ConstantTensor(constant_3, float32, [2])", 1, true))
        assert.is_truthy(text:find("ConstantTensor(constant_4, float32, [1])", 1, true))
        assert.are.same({ 1, 2 }, constants.constant_2:totable())
        assert.are.same({ 3, 4 }, constants.constant_3:totable())
        assert.are.same({ 2 }, constants.constant_4:totable())
        assert.is_nil(constants.constant_1)
    end)

    it("refuses two different nodes with one name", function()
        local a, b = mk.input("x", "float32", { 2 }), mk.input("x", "float32", { 2 })
        E(function() mk.script(a + b) end, "name error: script:", "'x'")
        local c = mk.constant(mk.tensor({ 1, 2 }), "x")
        E(function() mk.script(a + c) end, "name error: script:", "'x'")
        local w1, w2 = mk.constant(mk.tensor({ 1, 2 }), "w"), mk.constant(mk.tensor({ 1, 2 }), "w")
        E(function() mk.compile(a * w1 + w2) end, "name error: script:", "'w'")
        -- the same node twice is one statement, not a clash
        assert.is_truthy(mk.script(a + a))
    end)

    it("refuses a non-node", function()
        E(function() mk.script(mk.tensor({ 1 })) end, "argument error: script:")
        E(function() mk.compile(nil) end, "argument error: script:")
    end)
end)

describe("mk.compile_script", function()
    local script = [[
# a HamKaas-style script, written by hand
$1 = InputTensor(input, float32, [2, 3]);
$2 = ConstantTensor(w, float32, [3, 4]);
$3 = MulNode($1, $2);   # the HamKaas alias of MatMulNode
$4 = ReLUNode($3);
result = $4;
]]

    it("compiles a script with its constants and runs it", function()
        local x, xr = H.rand({ 2, 3 })
        local w, wr = H.rand({ 3, 4 })
        local model = mk.compile_script(script, { w = w })
        local out = model:run({ input = x })
        H.assert_close(out, H.ref_ops.relu(H.ref_ops.matmul(xr, wr)))
        assert.is_truthy(model:script():find("MatMulNode", 1, true))
        model:close()
    end)

    it("reports syntax errors with line and column", function()
        E(function() mk.compile_script("$1 = InputTensor(x, float32, [2]);\n$2 = ReLUNode($1;\nresult = $2;") end,
            "script:2:")
        local err = E(function() mk.compile_script("$1 = InputTensor(x, float32, [2])\nresult = $1;") end,
            "script:")
        assert.is_truthy(err:find("^script:%d+:%d+: syntax error: "), err)
        E(function() mk.compile_script("$1 = FooNode(x);\nresult = $1;") end, "script:1:", "FooNode")
        E(function() mk.compile_script("$1 = ReLUNode($7);\nresult = $1;") end, "script:1:", "$7")
        E(function() mk.compile_script(42) end, "argument error: compile:")
    end)

    it("reports shape errors of the script with line and column", function()
        E(function()
            mk.compile_script("$1 = InputTensor(x, float32, [2, 3]);\n$2 = MatMulNode($1, $1);\nresult = $2;")
        end, "script:2:", "shape error: MatMulNode:", "[2, 3]")
    end)

    it("checks constants: missing, extra, misshaped, mistyped", function()
        local w = mk.zeros("float32", { 3, 4 })
        E(function() mk.compile_script(script, {}) end, "input error: compile:", "missing constant 'w'")
        E(function() mk.compile_script(script) end, "input error: compile:", "missing constant 'w'")
        E(function() mk.compile_script(script, { w = w, v = w }) end, "input error: compile:",
            "unknown constant 'v'")
        E(function() mk.compile_script(script, { w = mk.zeros("float32", { 4, 3 }) }) end,
            "input error: compile:", "'w'", "[4, 3]", "[3, 4]")
        E(function() mk.compile_script(script, { w = mk.zeros("int64", { 3, 4 }) }) end,
            "input error: compile:", "int64")
        E(function() mk.compile_script(script, { w = { 1, 2 } }) end, "argument error: compile:", "'w'")
        E(function() mk.compile_script(script, { [1] = w, w = w }) end, "argument error: compile:")
    end)

    it("checks options", function()
        local w = mk.zeros("float32", { 3, 4 })
        E(function() mk.compile_script(script, { w = w }, { device = "tpu" }) end,
            "argument error: compile:", "tpu")
        E(function() mk.compile_script(script, { w = w }, { devcie = "cpu" }) end,
            "argument error: compile:", "devcie")
        E(function() mk.compile_script(script, { w = w }, { cudnn = "yes" }) end,
            "argument error: compile:", "cudnn")
        E(function() mk.compile_script(script, { w = w }, "cpu") end, "argument error: compile:")
        local m = mk.compile_script(script, { w = w }, { device = "cpu", passes = false })
        assert.are.equal("cpu", m:stats().device)
    end)

    it("fails cleanly on CUDA where there is no device", function()
        if mk.cuda_available() then
            pending("a CUDA device is present")
            return
        end
        local w = mk.zeros("float32", { 3, 4 })
        local ok, err = pcall(mk.compile_script, script, { w = w }, { device = "cuda" })
        assert.is_false(ok)
        assert.is_truthy(tostring(err):find("^no CUDA device: "), err)
        -- the module stays usable
        assert.is_truthy(mk.compile_script(script, { w = w }))
    end)
end)

describe("mk.cuda_available", function()
    it("answers true, or false and a reason", function()
        local ok, why = mk.cuda_available()
        assert.is_boolean(ok)
        if not ok then assert.is_string(why) assert.is_true(#why > 0) end
    end)

    it("has a version", function()
        assert.is_truthy(mk.version:find("^%d+%.%d+%.%d+"))
    end)
end)
