-- Reductions, softmaxes and norms over any axes: bad inputs (each error names
-- the Lua line that built the node), the script forms, NaN rules, and the
-- llama2 forms that must not change (x:argmax(), x:rms_norm(w)). Their values
-- are spec/cases/reduce.lua's, on every device.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("reduce_spec")

-- The line of this file that calls f (f raises from there).
local function line_of(f)
    return debug.getinfo(f, "S").linedefined
end

-- f() raises an error that starts with this file's line where f is defined
-- (f makes the node there, not as a tail call), then `prefix`, and mentions
-- the rest.
local here = debug.getinfo(1, "S").short_src
local function assert_raises_here(f, prefix, ...)
    return H.assert_error(f, here .. ":" .. line_of(f) .. ": " .. prefix, ...)
end

describe("reductions: bad inputs", function()
    local x = mk.input("x", "float32", { 2, 3, 4 })

    it("an axis out of range", function()
        assert_raises_here(function() local _ = x:sum({ 0, 3 }) end,
            "shape error: ReduceSumNode: axis 3 is out of range for [2, 3, 4] (-3 to 2)")
        assert_raises_here(function() local _ = x:mean(-4) end, "shape error: ReduceMeanNode: axis -4")
        assert_raises_here(function() local _ = x:argmax(3) end, "shape error: ArgMaxAxisNode: axis 3")
        assert_raises_here(function() local _ = x:argmin(-4) end, "shape error: ArgMinAxisNode: axis -4")
        assert_raises_here(function() local _ = x:softmax(5) end, "shape error: SoftmaxNode: axis 5")
        assert_raises_here(function() local _ = x:log_softmax(-9) end, "shape error: LogSoftmaxNode: axis -9")
    end)

    it("a repeated axis, also as a negative one", function()
        assert_raises_here(function() local _ = x:max({ 1, 1 }) end,
            "shape error: ReduceMaxNode: axis 1 is repeated in [1, 1]")
        assert_raises_here(function() local _ = x:var({ 2, -1 }) end,
            "shape error: ReduceVarNode: axis -1 is repeated in [2, -1]")
    end)

    it("arguments of the wrong kind", function()
        assert_raises_here(function() local _ = x:sum("a") end,
            "argument error: sum: axes must be an integer or a list of integers, got string")
        assert_raises_here(function() local _ = x:prod({ 0, 1.5 }) end,
            "argument error: prod: axis 2 must be an integer")
        assert_raises_here(function() local _ = x:min(0, { keepdim = true }) end,
            "argument error: min: unknown option 'keepdim'")
        assert_raises_here(function() local _ = x:sum(0, { keepdims = 1 }) end,
            "argument error: sum: keepdims must be a boolean, got number")
        assert_raises_here(function() local _ = x:var(0, { correction = "one" }) end,
            "argument error: var: correction must be a number")
        assert_raises_here(function() local _ = x:softmax(0.5) end,
            "argument error: softmax: the axis must be an integer")
        assert_raises_here(function() local _ = x:layer_norm(1, { eps = {} }) end,
            "argument error: layer_norm: eps must be a number")
        assert_raises_here(function() local _ = x:layer_norm(1.5) end,
            "argument error: layer_norm: k (the normalized axes) must be an integer, got 1.5")
        assert_raises_here(function() local _ = x:group_norm() end,
            "argument error: group_norm: groups must be an integer, got nil")
    end)

    it("dtypes: float32 only, results float32 or int64", function()
        local i = mk.input("i", "int64", { 2, 3 })
        local h = mk.input("h", "float16", { 2, 3 })
        assert_raises_here(function() local _ = i:sum() end,
            "dtype error: ReduceSumNode: x ('i') must be float32, not int64")
        assert_raises_here(function() local _ = h:softmax() end,
            "dtype error: SoftmaxNode: x ('h') must be float32, not float16")
        assert_raises_here(function() local _ = i:argmax(0) end, "dtype error: ArgMaxAxisNode")
        local w16 = mk.input("w16", "float16", { 4 })
        assert_raises_here(function() local _ = x:layer_norm(1, { weight = w16 }) end,
            "dtype error: LayerNormNode: the weight ('w16') must be float32, not float16")
        local e64 = mk.input("e64", "int64", { 1 })
        assert_raises_here(function() local _ = x:rms_norm(mk.input("w", { 4 }), e64) end,
            "dtype error: RmsNormEpsNode: eps ('e64') must be float32, not int64")
        assert.are.equal("int64", x:argmin(1).dtype)
    end)

    it("a weight or bias of the wrong shape", function()
        local w = mk.input("w", { 3 })
        assert_raises_here(function() local _ = x:layer_norm(1, { weight = w }) end,
            "shape error: LayerNormNode: the weight ('w') is [3]; it must be [4] or [1] for x [2, 3, 4]")
        assert_raises_here(function() local _ = x:layer_norm(2, { bias = mk.input("b", { 4, 3 }) }) end,
            "shape error: LayerNormNode: the bias ('b') is [4, 3]; it must be [3, 4] or [1]")
        assert_raises_here(function() local _ = x:layer_norm(4) end,
            "shape error: LayerNormNode: 4 normalized axes for x [2, 3, 4] (1 to 3)")
        assert_raises_here(function() local _ = x:group_norm(3, { weight = mk.input("g", { 4 }) }) end,
            "shape error: GroupNormNode: the weight ('g') is [4]; it must be [3] or [1]")
        assert_raises_here(function() local _ = x:batch_norm(mk.input("m", { 3 }), mk.input("v", { 2 })) end,
            "shape error: BatchNormNode: the running var ('v') is [2]; it must be [3] or [1]")
        assert_raises_here(function() local _ = x:rms_norm(mk.input("r", { 3 }), 1e-6) end,
            "shape error: RmsNormEpsNode: the weight ('r') is [3]; it must be [4] or [1]")
        assert_raises_here(function() local _ = x:var(0, { correction = mk.input("c", { 2 }) }) end,
            "shape error: ReduceVarNode: the correction ('c') must have shape [1], not [2]")
    end)

    it("a group count that does not divide C, and x without channels", function()
        assert_raises_here(function() local _ = x:group_norm(2) end,
            "shape error: GroupNormNode: 2 groups do not divide the 3 channels of [2, 3, 4]")
        assert_raises_here(function() local _ = x:group_norm(0) end,
            "shape error: GroupNormNode: 0 groups do not divide")
        local v = mk.input("v", { 6 })
        assert_raises_here(function() local _ = v:group_norm(1) end,
            "shape error: GroupNormNode: x [6] must be [N, C, ...]")
        assert_raises_here(function() local _ = v:batch_norm(v, v) end,
            "shape error: BatchNormNode: x [6] must be [N, C, ...]")
    end)

    it("the script forms: the same checks with the script's line, and an empty axis list", function()
        local ok, err = pcall(mk.compile_script,
            "$1 = InputTensor(x, float32, [2, 3]);\n$2 = ReduceSumNode($1, [0, 2]);\nresult = $2;\n")
        assert.is_false(ok)
        assert.truthy(tostring(err):find("script:2:1: shape error: ReduceSumNode: axis 2 is out of range", 1, true), err)
        ok, err = pcall(mk.compile_script,
            "$1 = InputTensor(x, float32, [2, 3]);\n$2 = ReduceProdNode($1, []);\nresult = $2;\n")
        assert.is_false(ok)
        assert.truthy(tostring(err):find("ReduceProdNode: no axis to reduce", 1, true), err)
    end)

    it("leaves the context usable: a good node after a bad one", function()
        pcall(function() return x:sum({ 9 }) end)
        local m = mk.compile(x:sum({ 0, 2 }))
        local out = m:run({ x = mk.tensor((function()
            local d = {}
            for i = 1, 24 do d[i] = 1 end
            return d
        end)(), "float32", { 2, 3, 4 }) })
        assert.are.same({ 8, 8, 8 }, out:totable())
    end)
end)

describe("reductions: forms and rules", function()
    it("x:argmax() and x:rms_norm(w) stay ArgMaxNode and RmsNormNode (llama2's scripts)", function()
        local x = mk.input("x", { 2, 4 })
        local w = mk.input("w", { 4 })
        assert.are.equal("ArgMaxNode", x:argmax().op)
        assert.are.equal("RmsNormNode", x:rms_norm(w).op)
        assert.are.equal("ArgMaxAxisNode", x:argmax(1, { keepdims = true }).op)
        assert.are.equal("RmsNormEpsNode", x:rms_norm(w, 1e-5).op)
        assert.are.same({ 2, 1 }, x:argmin().shape) -- the last axis, kept
        assert.are.same({ 2 }, x:argmin(-1).shape)
        assert.are.same({ 1 }, x:sum().shape)
        assert.are.same({ 1, 1 }, x:sum(nil, { keepdims = true }).shape)
    end)

    it("the script names and argument forms round-trip", function()
        local x = mk.input("x", { 2, 3, 4 })
        local text = mk.script({ x:sum({ -1, 0 }, { keepdims = true }), x:var(1), x:softmax(0),
            x:group_norm(3), x:argmin(2, { keepdims = true }) })
        assert.truthy(text:find("ReduceSumNode($1, [-1, 0])", 1, true), text)
        assert.truthy(text:find("SoftmaxNode($1, 0)", 1, true), text)
        assert.truthy(text:find("ArgMinAxisNode($1, 2)", 1, true), text)
        assert.truthy(text:find("GroupNormNode($1, $", 1, true), text)
        local again, constants = mk.lower({ x:sum({ -1, 0 }, { keepdims = true }), x:var(1),
            x:softmax(0), x:group_norm(3), x:argmin(2, { keepdims = true }) })
        local m = mk.compile_script(again, constants)
        assert.truthy(m:script():find("ReduceVarNode", 1, true))
    end)

    it("max, min and argmax, argmin: a NaN wins (NumPy's), the first of them", function()
        local x = mk.input("x", { 2, 4 })
        local m = mk.compile({ x:max(1), x:min(1), x:argmax(1), x:argmin(1) })
        local nan = 0 / 0
        local t = mk.tensor({ { 1, nan, 5, nan }, { 3, -2, 7, -2 } })
        local mx, mn, amx, amn = m:run({ x = t })
        assert.is_true(mx:get(1) ~= mx:get(1))
        assert.is_true(mn:get(1) ~= mn:get(1))
        assert.are.equal(7, mx:get(2))
        assert.are.equal(-2, mn:get(2))
        assert.are.same({ 1, 2 }, amx:totable())
        assert.are.same({ 1, 1 }, amn:totable())
    end)

    it("var with correction N: inf or NaN, as NumPy divides", function()
        local x = mk.input("x", { 3 })
        local m = mk.compile(x:var(0, { correction = 3 }))
        local v = m:run({ x = mk.tensor({ 1, 2, 4 }) }):get(1)
        assert.are.equal(math.huge, v)
    end)

    it("softmax is stable for large values: the max is subtracted", function()
        local x = mk.input("x", { 3 })
        local m = mk.compile({ x:softmax(), x:log_softmax() })
        local s, ls = m:run({ x = mk.tensor({ 1000, 1000, 999 }) })
        local e = math.exp(-1)
        H.assert_close(s, { shape = { 3 }, data = { 1 / (2 + e), 1 / (2 + e), e / (2 + e) } })
        H.assert_close(ls, { shape = { 3 }, data = { -math.log(2 + e), -math.log(2 + e), -1 - math.log(2 + e) } })
    end)
end)

describe("row groups: a row op with its pointwise prologue and epilogue", function()
    -- out of `build` (a function of the inputs), fused and not: the same bits
    local function same_bits(build, shapes)
        local ins, feeds = {}, {}
        for name, shape in pairs(shapes) do
            ins[name] = mk.input(name, shape)
            feeds[name] = H.rand(shape, -3, 3)
        end
        local y = build(ins)
        local fused = mk.compile(y)
        local plain = mk.compile(y, { fuse = false })
        local a, b = fused:run(feeds), plain:run(feeds)
        H.assert_close(a, H.ref(b), 0, 0) -- names the first element that differs
        assert.is_true(a:bytes() == b:bytes(), "the fused bits differ from the nodes'")
        return fused
    end

    it("fuses softmax, log_softmax, layer_norm and rms_norm with eps, equal bit for bit", function()
        local rows, n = math.random(1, 9), math.random(2, 700) -- past one epilogue chunk
        local xb, xw, xbw = { x = { rows, n }, b = { n } }, { x = { rows, n }, w = { n } },
            { x = { rows, n }, b = { n }, w = { n } }
        local forms = {
            { function(i) return (i.x * 2):softmax() + i.b end, xb },
            { function(i) return (i.x - i.b):log_softmax(-1) * 3 end, xb },
            { function(i) return i.x:softmax():relu() end, { x = { rows, n } } },
            { function(i) return (i.x + 1):layer_norm(1, { weight = i.w, bias = i.b, eps = 1e-3 }) end, xbw },
            { function(i) return i.x:layer_norm():silu() * i.w end, xw },
            { function(i) return (i.x * i.x):rms_norm(i.w, 1e-6) - 1 end, xw },
            { function(i) return i.x:T():T():softmax(1) / 2 end, { x = { rows, n } } },
        }
        for k, form in ipairs(forms) do
            local m = same_bits(form[1], form[2])
            local report = m:fusion_report()
            assert.truthy(report:find("rows group", 1, true), k .. ": " .. report)
        end
    end)

    it("reads a strided x as it is (no prologue), and rank 1", function()
        local m = same_bits(function(i) return i.x:permute({ 1, 0 }):softmax() + 1 end,
            { x = { 7, 3 } })
        assert.truthy(m:fusion_report():find("rows group", 1, true))
        same_bits(function(i) return i.x:softmax() * i.x end, { x = { 6 } })
    end)

    it("leaves alone what another node reads, the outputs, and other axes", function()
        local x = mk.input("x", { 3, 4 })
        local p = x * 2
        local s = p:softmax()
        -- p is an output too: the softmax still takes its epilogue
        local m = mk.compile({ s + 1, p })
        local report = m:fusion_report()
        assert.truthy(report:find("rows group", 1, true), report)
        assert.falsy(report:find("HadamardProductNode", 1, true), report)
        -- the softmax's value is an output: only its prologue joins it
        m = mk.compile({ s + 1, s })
        report = m:fusion_report()
        assert.truthy(report:find("for HadamardProductNode %$%d+, SoftmaxNode %$%d+\n"), report)
        -- not the last axis
        m = mk.compile((x * 2):softmax(0) + 1)
        assert.falsy(m:fusion_report():find("rows group", 1, true))
        -- layer_norm over two axes
        m = mk.compile((mk.input("y", { 2, 3, 4 }) * 2):layer_norm(2))
        assert.falsy(m:fusion_report():find("rows group", 1, true))
    end)
end)

describe("reductions on CUDA against the CPU", function()
    local gpu_it = H.gpu(it, function(why) pending(why) end)

    -- every output of `build` on CUDA, against the CPU's within rounding
    local function check(build, shapes)
        local ins, feeds = {}, {}
        for name, shape in pairs(shapes) do
            ins[name] = mk.input(name, shape)
            feeds[name] = H.rand(shape, name == "v" and 0.1 or -2, 2) -- a variance: positive
        end
        local ys = build(ins)
        local cpu <close> = mk.compile(ys)
        local gpu <close> = mk.compile(ys, { device = "cuda" })
        local want, got = { cpu:run(feeds) }, { gpu:run(feeds) }
        for k = 1, #want do H.assert_close(got[k], H.ref(want[k]), 1e-4, 1e-4) end
    end

    gpu_it("long rows (a block per reduction) and strided x", function()
        local n = math.random(1025, 5000)
        check(function(i)
            local x = i.x
            return { x:sum(1), x:mean(1), x:max(1), x:min(-1), x:var(1, { correction = 1 }) }
        end, { x = { 3, n } })
        check(function(i) -- a script has at most 8 outputs
            local x = i.x
            return { x:argmax(1), x:argmin(1), x:softmax(), x:log_softmax(1) }
        end, { x = { 3, n } })
        check(function(i)
            local xt = i.x:permute({ 1, 0 })
            return { xt:sum(0), xt:softmax(0), xt:argmax(0), i.x:layer_norm(), i.x:rms_norm(i.w, 1e-4) }
        end, { x = { 2, n }, w = { n } })
        check(function(i) return { (i.x + 0.5):prod(1) } end, { x = { 4, 1100 } })
    end)

    gpu_it("row groups: one generated kernel each, as the CPU's within rounding", function()
        for _, n in ipairs({ 1, 31, 32, 33, 1024, 5000, 20000 }) do
            local shapes = { x = { 3, n }, mask = { 1, n }, w = { n }, b = { n } }
            local function build(i)
                return { (i.x * 0.125 + i.mask):softmax(), (i.x - i.b):log_softmax() * 3,
                    i.x:layer_norm(1, { weight = i.w, bias = i.b, eps = 1e-5 }):gelu(),
                    i.x:rms_norm(i.w, 1e-6) * i.b }
            end
            check(build, shapes)
            local ins = {}
            for name, shape in pairs(shapes) do ins[name] = mk.input(name, shape) end
            local gpu <close> = mk.compile(build(ins), { device = "cuda" })
            local _, count = gpu:fusion_report():gsub("rows group", "")
            assert.are.equal(4, count, gpu:fusion_report())
            local kernels = 0
            for i = 1, gpu:stats().launches do
                local ok, src = pcall(gpu.kernel_source, gpu, i)
                if ok and src:find("// moonkaas row group", 1, true) then kernels = kernels + 1 end
            end
            assert.are.equal(4, kernels)
        end
    end)

    gpu_it("more reductions than the grid holds at once", function()
        check(function(i) return { i.x:sum(1), i.x:argmax(1), i.x:softmax(1) } end,
            { x = { 600000, 2 } })
        check(function(i) return { i.x:group_norm(4), i.x:batch_norm(i.m, i.v) } end,
            { x = { 3, 8, 700 }, m = { 8 }, v = { 8 } })
    end)
end)
