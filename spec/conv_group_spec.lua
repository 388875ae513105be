-- Convolution groups (core/group_conv.c, core/cpu/conv_group.c): which chains
-- group, what the fusion report and the printed graph say, and the CPU's
-- oneDNN primitives made at the launch's thread count. Their values against
-- double-precision loops are spec/cases/conv.lua's "Conv2dNode group" cases
-- (ops_spec; conv_spec runs them on im2col and oneDNN).
local H = require "spec.helpers"
local mk = H.mk()
H.seed("conv_group_spec")

local function has(s, part) assert.is_truthy(s:find(part, 1, true), s) end
local function lacks(s, part) assert.is_falsy(s:find(part, 1, true), s) end

-- x [1, 4, 7, 7] -> conv 3x3 (bias) -> bn -> relu -> conv 3x3 -> bn -> + x -> relu,
-- the batch norms' running means given by `mean` (a tensor or a node)
local function block(x, mean2)
    local function bn(h, mean)
        return h:batch_norm(mean, H.rand({ 4 }, 0.5, 2), { weight = H.rand({ 4 }), bias = H.rand({ 4 }) })
    end
    local h = x:conv2d(H.rand({ 4, 4, 3, 3 }), { padding = 1, bias = H.rand({ 4 }) })
    h = bn(h, H.rand({ 4 })):relu()
    h = bn(h:conv2d(H.rand({ 4, 4, 3, 3 }), { padding = 1 }), mean2)
    return (h + x):relu()
end

describe("convolution groups", function()
    it("fold a batch norm of constants and take bias, residual and relu", function()
        local x = mk.input("x", "float32", { 1, 4, 7, 7 })
        local m = mk.compile(block(x, H.rand({ 4 })))
        local report, script = m:fusion_report(), m:script()
        has(report, "conv group")
        has(report, "Conv2dNode with an epilogue of bias, batch norm folded, relu for")
        has(report, "Conv2dNode with an epilogue of batch norm folded, residual add, relu for")
        lacks(script, "BatchNormNode(")
        assert.are.equal(2, m:stats().launches, script)
    end)

    it("leave a batch norm read at run time as its own node", function()
        local x = mk.input("x", "float32", { 1, 4, 7, 7 })
        local mean = mk.input("mean", "float32", { 4 })
        local m = mk.compile(block(x, mean))
        local report, script = m:fusion_report(), m:script()
        has(report, "Conv2dNode with an epilogue of bias, batch norm folded, relu for")
        has(script, "BatchNormNode(")
        -- the second convolution stays alone; the add and relu after the
        -- batch norm are a pointwise group
        has(script, "Conv2dNode(")
        has(report, "pointwise group")
    end)

    it("compute what the nodes alone compute (fuse = false)", function()
        local x = mk.input("x", "float32", { 2, 4, 7, 7 })
        local y = block(x, H.rand({ 4 }))
        local xt = H.rand({ 2, 4, 7, 7 })
        local grouped = mk.compile(y):run { x = xt }
        local alone = mk.compile(y, { fuse = false }):run { x = xt }
        assert.are.same({ 2, 4, 7, 7 }, grouped.shape)
        H.assert_close(grouped, H.ref(alone), 1e-5, 1e-5)
    end)

    -- a group's result that is an output and read by a convolution stays
    -- NCHW (core/cpu/conv_group.c hands on in oneDNN's blocked layout only
    -- results that no output reads): both outputs equal each compiled alone
    it("give an output read by a convolution as NCHW", function()
        local x = mk.input("x", "float32", { 1, 8, 9, 7 })
        local a = x:conv2d(H.rand({ 16, 8, 3, 3 }), { padding = 1, bias = H.rand({ 16 }) }):relu()
        local e = a:conv2d(H.rand({ 16, 16, 3, 3 }), { padding = 1, bias = H.rand({ 16 }) }):relu()
        local xt = H.rand({ 1, 8, 9, 7 })
        local ga, ge = mk.compile({ a, e }):run { x = xt }
        H.assert_close(ga, H.ref(mk.compile(a):run { x = xt }), 0, 0)
        H.assert_close(ge, H.ref(mk.compile(e):run { x = xt }), 0, 0)
    end)

    it("are not made where fusion is off", function()
        local x = mk.input("x", "float32", { 1, 4, 7, 7 })
        local m = mk.compile(block(x, H.rand({ 4 })), { fuse = false })
        lacks(m:fusion_report(), "conv group")
        has(m:script(), "BatchNormNode(")
    end)

    -- oneDNN fixes a primitive's threads when it is made: a model of
    -- threads = 1 must not fork (OpenBLAS kept to one thread, so every other
    -- thread of the process would be OpenMP's)
    it("run on the calling thread alone with threads = 1", function()
        local r = H.run_lua("env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=2 lua5.4", "", [==[
local mk = require "moonkaas"
local x = mk.input("x", "float32", { 1, 8, 32, 32 })
local v = {}
for i = 1, 8 * 8 * 9 do v[i] = (i % 7) / 7 - 0.5 end
local w = mk.tensor(v, "float32", { 8, 8, 3, 3 })
local m = mk.compile(x:conv2d(w, { padding = 1 }):relu(), { threads = 1 })
local xv = {}
for i = 1, 8 * 32 * 32 do xv[i] = (i % 13) / 13 end
m:run { x = mk.tensor(xv, "float32", { 1, 8, 32, 32 }) }
local tasks = 0
for _ in io.popen("ls /proc/" .. io.open("/proc/self/stat"):read("n") .. "/task"):lines() do
    tasks = tasks + 1
end
local maps = io.open("/proc/self/maps"):read("a")
print("dnnl_mapped=" .. tostring(maps:find("libdnnl", 1, true) ~= nil))
print("tasks=" .. tasks)
print("done=true")
]==])
        assert.are.equal("true", r.done, r.output)
        if r.dnnl_mapped == "true" then assert.are.equal("1", r.tasks, r.output) end
    end)
end)
