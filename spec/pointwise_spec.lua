-- The ops the Lua side gets from the core's op table alone: SubNode (x - y,
-- x:sub(y)), DivNode (x / y, x:div(y)), ExpNode, TanhNode, SigmoidNode and
-- GELUNode: their values run with every other op in ops_spec.lua
-- (spec/cases/pointwise.lua); here their operands, errors, the table as mk.ops()
-- shows it, and their scripts.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("pointwise_spec")
local R = H.ref_ops
local E = H.assert_error

local function f32(name, shape) return mk.input(name, "float32", shape) end
local function i64(name, shape) return mk.input(name, "int64", shape) end

describe("numbers as operands", function()
    local function operand(node, k) return mk.node_info(mk.node_info(node).inputs[k]) end

    it("on the right: a [1, ..., 1] constant of the other's dtype that broadcasts", function()
        local x = f32("x", H.rand_shape(3, 2, 5))
        for _, y in ipairs({ x - 1, x / 2, x:sub(1), x:div(2) }) do
            local c = operand(y, 2)
            assert.are.equal("constant", c.leaf)
            assert.are.same({ 1, 1, 1 }, c.shape)
            assert.are.equal("float32", c.dtype)
            assert.are.same(x.shape, y.shape)
        end
    end)

    it("on the left: a [1, ..., 1] constant that broadcasts", function()
        -- either operand broadcasts, so a number needs no more than one element
        local shape = H.rand_shape(2, 2, 5)
        local x, n = f32("x", shape), i64("n", shape)
        for _, y in ipairs({ 1 - x, 2 / x, 3 - n }) do
            local c = operand(y, 1)
            assert.are.equal("constant", c.leaf)
            assert.are.same({ 1, 1 }, c.shape)
            assert.are.equal(y.dtype, c.dtype)
            assert.are.same(shape, y.shape)
        end
        -- + and * commute: built as x op k, the number second
        for _, y in ipairs({ 2 + x, 4 * n }) do
            assert.are.same({ 1, 1 }, operand(y, 2).shape)
            assert.are_not.equal("constant", operand(y, 1).leaf)
        end
    end)

    it("takes int64 integers and refuses fractions for int64", function()
        local n = i64("n", { 4 })
        assert.are.equal("int64", (n - 1).dtype)
        assert.are.equal("int64", (1 - n).dtype)
        E(function() return n - 1.5 end, "dtype error:", "1.5", "int64")
        E(function() return 0.5 - n end, "dtype error:", "0.5", "int64")
    end)
end)

describe("errors of the new ops", function()
    it("refuse int64 where the expression needs floats", function()
        local n, m = i64("n", { 2, 3 }), i64("m", { 2, 3 })
        E(function() return n / m end, "dtype error: DivNode", "int64")
        E(function() return n:div(m) end, "dtype error: DivNode", "int64")
        E(function() return n / 2 end, "dtype error: DivNode", "int64")
        E(function() return n:exp() end, "dtype error: ExpNode", "int64")
        E(function() return n:tanh() end, "dtype error: TanhNode", "int64")
        E(function() return n:sigmoid() end, "dtype error: SigmoidNode", "int64")
        E(function() return n:gelu() end, "dtype error: GELUNode", "int64")
        -- int64 subtraction is exact
        assert.are.equal("SubNode", (n - m).op)
    end)

    it("refuse shapes that do not broadcast, either side broadcasting", function()
        local a = f32("a", { 2, 3 })
        E(function() return a - f32("b", { 2 }) end, "shape error: SubNode:", "[2]", "[2, 3]")
        E(function() return a / f32("b", { 2, 2 }) end, "shape error: DivNode:", "[2, 2]", "[2, 3]")
        -- - and / broadcast their first operand too: [1, 3] - [2, 3] is [2, 3]
        assert.are.same({ 2, 3 }, (f32("r", { 1, 3 }) - a).shape)
        assert.are.same({ 2, 3 }, (f32("r", { 2, 1 }) / a).shape)
        E(function() return f32("r", { 3, 1 }) / a end, "shape error: DivNode:")
        E(function() return a - i64("n", { 2, 3 }) end, "dtype error: SubNode:", "float32", "int64")
    end)

    it("refuse operands that are neither nodes, tensors nor numbers", function()
        local a = f32("a", { 2, 3 })
        E(function() return a - "x" end, "argument error:", "string")
        E(function() return a / {} end, "argument error:", "table")
        E(function() return true - a end, "argument error:")
        E(function() return a:sub(nil) end, "argument error: sub:")
        E(function() return a:div(false) end, "argument error: div:", "boolean")
        E(function() mk.node_methods.exp(3) end, "argument error: exp:", "node")
        E(function() mk.node_methods.gelu(mk.zeros("float32", { 2 })) end, "argument error: gelu:")
        E(function() return a:exp(2) end, "argument error: exp:", "takes 1 argument")
        E(function() return a:sub(a, a) end, "argument error: sub:", "takes 2 arguments")
    end)

    it("take a host tensor as an operand (an unnamed constant)", function()
        local t, tr = H.rand({ 2, 3 })
        local a = f32("a", { 2, 3 })
        local at, ar = H.rand({ 2, 3 })
        local y = a - t
        assert.are.equal("constant", mk.node_info(mk.node_info(y).inputs[2]).leaf)
        local model <close> = mk.compile(y)
        H.assert_close(model:run({ a = at }), R.sub(ar, tr), 1e-6, 1e-6)
    end)
end)

describe("the op table from Lua", function()
    local events = { ["+"] = "__add", ["-"] = "__sub", ["*"] = "__mul", ["/"] = "__div",
        ["%"] = "__mod", ["^"] = "__pow", ["//"] = "__idiv" }
    local roles = { leaf = true, pointwise = true, reduction = true, matmul = true, view = true,
        inplace = true, move = true, group = true }

    it("mk.ops() lists every row with its fields", function()
        local ops, names = mk.ops(), {}
        assert.is_true(#ops > 0)
        for _, op in ipairs(ops) do
            assert.is_string(op.name)
            assert.is_nil(names[op.name], "two rows named " .. op.name)
            names[op.name] = op
            assert.is_string(op.signature)
            assert.is_truthy(op.signature:find("^[nrsdli]*o?$"), op.signature)
            assert.is_true(roles[op.role] ~= nil, tostring(op.role))
            assert.is_string(op.summary)
            assert.is_boolean(op.broadcast)
            assert.is_boolean(op.commutes)
        end
        local infixes = { SubNode = "-", DivNode = "/", SumNode = "+", HadamardProductNode = "*" }
        for name, infix in pairs(infixes) do
            assert.are.equal(infix, names[name].infix)
            assert.are.equal("pointwise", names[name].role)
            assert.is_true(names[name].broadcast)
            assert.is_string(names[name].expr)
        end
        assert.is_false(names.SubNode.commutes)
        assert.is_false(names.DivNode.commutes)
        assert.is_true(names.SumNode.commutes)
        local methods = { ExpNode = "exp", TanhNode = "tanh", SigmoidNode = "sigmoid", GELUNode = "gelu" }
        for name, method in pairs(methods) do
            assert.are.equal(method, names[name].method)
            assert.are.equal("n", names[name].signature)
        end
        assert.are.equal("MulNode", names.MatMulNode.alias)
        assert.are.equal("input", names.InputTensor.leaf)
        assert.are.equal("leaf", names.InputTensor.role)
    end)

    it("every row with a front-end name is callable, methods, functions and operators", function()
        local x = f32("x", { 3, 2 })
        local mt = getmetatable(x)
        local built = 0
        for _, op in ipairs(mk.ops()) do
            if op.method and not op.internal then
                local f = (op.as_function or op.leaf) and mk[op.method] or mk.node_methods[op.method]
                assert.is_function(f, op.name .. " as " .. op.method)
                if not op.leaf then
                    -- wired to the row: called with nothing, the error names the method
                    E(function() f() end, "argument error: " .. op.method .. ":")
                end
                if op.role == "pointwise" and (op.signature == "n" or op.signature == "nn") then
                    -- a [3, 2] operand fits every pointwise row, complex ones too;
                    -- float32 ones, or bool ones for the rows of bool (logical ops)
                    local function build(dtype)
                        local a, b = mk.input("x", dtype, { 3, 2 }), mk.input("y", dtype, { 3, 2 })
                        return op.signature == "n" and f(a) or f(a, b)
                    end
                    local ok, y = pcall(build, "float32")
                    if not ok then y = build("bool") end
                    assert.are.equal(op.name, y.op)
                    assert.are.same({ 3, 2 }, y.shape)
                    built = built + 1
                end
            end
            local unary = op.signature == "n"
            local event = unary and op.infix == "-" and "__unm" or events[op.infix or ""]
            if event and (unary or op.signature == "nn") then
                assert.is_function(mt[event], op.name .. " as " .. op.infix)
                local y = mt[event](x, unary and x or f32("y", { 3, 2 }))
                assert.are.equal(op.name, y.op)
            end
        end
        assert.is_true(built >= 10, "pointwise rows built: " .. built)
    end)

    it("node_info describes a node generically", function()
        local x = f32("x", { 2, 3 })
        local i = mk.node_info(x)
        assert.are.equal("InputTensor", i.op)
        assert.are.equal("input", i.leaf)
        assert.are.equal("x", i.name)
        assert.are.same({ 2, 3 }, i.attrs) -- a leaf's list is its shape
        local y = mk.node_info(x:sub(x):reshape(3, 2))
        assert.are.equal("ReshapeNode", y.op)
        assert.are.equal("nl", y.signature)
        assert.is_nil(y.leaf)
        assert.are.same({ 3, 2 }, y.attrs)
        assert.are.equal("SubNode", mk.node_info(y.inputs[1]).op)
        assert.are.equal("nr", mk.node_info(x:sliced_softmax(2)).signature)
    end)
end)

describe("scripts of the new ops", function()
    it("round-trip through mk.format_script", function()
        local x = f32("x", { 2, 3 })
        local c = mk.constant(H.rand_away({ 1, 3 }, 0.5, 2), "c")
        for _, y in ipairs({ x - c, x / c, 1 - x, 2 / x, x:exp(), x:tanh(), x:sigmoid(), x:gelu(),
            ((x - c) / c):exp():tanh():sigmoid():gelu() }) do
            local s = mk.script(y)
            assert.is_truthy(s:find(y.op .. "($", 1, true), s)
            assert.are.equal(s, mk.format_script(s))
        end
    end)

    it("a script written by hand compiles and runs", function()
        local script = [[
$1 = InputTensor(x, float32, [2, 3]);
$2 = ConstantTensor(b, float32, [2, 1]);
$3 = SubNode($1, $2);
$4 = DivNode($3, $2);
$5 = GELUNode($4);
result = $5;
]]
        local xt, xr = H.rand({ 2, 3 })
        local bt, br = H.rand_away({ 2, 1 }, 0.5, 2)
        local model <close> = mk.compile_script(script, { b = bt })
        H.assert_close(model:run({ x = xt }), R.gelu(R.div(R.sub(xr, br), br)), 1e-6, 1e-5)
    end)
end)
