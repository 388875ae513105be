-- NumPy's broadcasting in the IR (scripts written by hand), reshape's -1, and
-- HamKaas's scripts keeping their meaning. Values of every case against
-- double-precision loops are in ops_spec (spec/cases/), CUDA in gpu_spec.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("broadcast_spec")
local R = H.ref_ops
local E = H.assert_error

local function script(lines) return table.concat(lines, "\n") .. "\n" end

describe("broadcasting in the IR", function()
    it("[m, 1] + [1, n] and [n] - [m, n] in a script", function()
        local m, n = math.random(2, 6), math.random(2, 6)
        local model <close> = mk.compile_script(script({
            "$1 = InputTensor(col, float32, [" .. m .. ", 1]);",
            "$2 = InputTensor(row, float32, [1, " .. n .. "]);",
            "$3 = InputTensor(v, float32, [" .. n .. "]);",
            "$4 = SumNode($1, $2);",
            "$5 = SubNode($3, $4);",
            "result = $5;",
        }))
        local colt, colr = H.rand({ m, 1 })
        local rowt, rowr = H.rand({ 1, n })
        local vt, vr = H.rand({ n })
        H.assert_close(model:run({ col = colt, row = rowt, v = vt }),
            R.sub(vr, R.add(colr, rowr)), 1e-6, 1e-6)
        assert.are.same({ { name = nil, dtype = "float32", shape = { m, n } } },
            { model:output() })
    end)

    it("refuses shapes that do not broadcast, at the statement", function()
        E(function()
            mk.compile_script(script({
                "$1 = InputTensor(a, float32, [2, 3]);", "$2 = InputTensor(b, float32, [2]);",
                "$3 = HadamardProductNode($1, $2);", "result = $3;" }))
        end, "script:3:1: shape error: HadamardProductNode: [2, 3] does not broadcast with [2]")
    end)

    it("keeps HamKaas's scripts: b of a's rank onto a", function()
        local shape = H.rand_shape(3, 2, 4)
        local bshape = { shape[1], 1, shape[3] }
        local model <close> = mk.compile_script(script({
            "$1 = InputTensor(a, float32, " .. H.shape_str(shape) .. ");",
            "$2 = InputTensor(b, float32, " .. H.shape_str(bshape) .. ");",
            "$3 = HadamardProductNode($1, $2);", "$4 = SumNode($3, $1);", "result = $4;" }))
        local at, ar = H.rand(shape)
        local bt, br = H.rand(bshape)
        H.assert_close(model:run({ a = at, b = bt }), R.add(R.mul(ar, br), ar), 1e-6, 1e-6)
    end)
end)

describe("reshape with -1", function()
    it("takes one -1 in a script and from Lua", function()
        local model <close> = mk.compile_script(script({
            "$1 = InputTensor(x, float32, [2, 3, 4]);", "$2 = ReshapeNode($1, [-1, 4]);",
            "$3 = ReLUNode($2);", "result = $3;" }))
        local xt, xr = H.rand({ 2, 3, 4 })
        H.assert_close(model:run({ x = xt }), R.relu(R.reshape(xr, { 6, 4 })), 0, 0)
        local x = mk.input("x", "float32", { 2, 3, 4 })
        assert.are.same({ 3, 8 }, x:reshape(3, -1).shape)
        assert.are.same({ 24 }, x:reshape({ -1 }).shape)
        assert.are.same({ 2, 1, 12 }, x:reshape(2, 1, -1).shape)
    end)

    it("refuses two -1, a count that does not divide, other negatives", function()
        local x = mk.input("x", "float32", { 2, 3, 4 })
        E(function() return x:reshape(-1, -1) end, "shape error: ReshapeNode:",
            "[-1, -1] has more than one -1")
        E(function() return x:reshape(-1, 5) end, "shape error: ReshapeNode:",
            "[2, 3, 4]'s 24 elements do not fill [-1, 5]")
        E(function() return x:reshape(-2, 12) end, "shape error: ReshapeNode:", "dimension 0 is -2")
        E(function() return x:reshape(5, 5) end, "shape error: ReshapeNode:", "would need 25")
    end)
end)
