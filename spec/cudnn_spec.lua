-- The cuDNN fuser through the Lua API: fused groups (matmul + bias + ReLU,
-- SiLU gate, pointwise chains, a 30-node chain, repeated layers) against the
-- double-precision references of spec/helpers.lua and against the CPU device.
-- Tagged #gpu; without a usable CUDA device they are pending with the reason,
-- and only the clean "no CUDA device" error is checked.
--
-- Fused matmuls may run in TF32 on tensor cores, so fused results are compared
-- with a tolerance relative to the output's RMS (1e-2 of it), not per element.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("cudnn_spec")
local R = H.ref_ops

local no_cuda = H.requires_cuda()

local gpu_it = H.gpu(it, function(why) pending(why) end)

-- max |got - want| <= tol * rms(want)
local function assert_rms_close(got, want, tol)
    got = H.ref(got)
    assert.are.same(want.shape, got.shape)
    local ss, worst = 0, 0
    for i, w in ipairs(want.data) do
        ss = ss + w * w
        worst = math.max(worst, math.abs(got.data[i] - w))
    end
    local rms = math.sqrt(ss / #want.data)
    if rms == 0 then rms = 1 end
    assert(worst <= tol * rms, string.format("max error %.3g is %.3g of the output's rms (tolerance %g)",
        worst, worst / rms, tol))
end

-- Compiles y with cuDNN and without (CPU), runs both on the feeds and checks
-- both against the reference; returns the fused model's stats.
local function check(y, feeds, want, min_fused)
    local cpu <close> = mk.compile(y)
    assert_rms_close(cpu:run(feeds), want, 1e-5)
    local gpu <close> = mk.compile(y, { device = "cuda", cudnn = true })
    local stats = gpu:stats()
    local got = gpu:run(feeds)
    assert_rms_close(got, want, 1e-2)
    assert_rms_close(got, H.ref(cpu:run(feeds)), 1e-2)
    -- the replayed graph gives the same again
    H.assert_close(gpu:run(feeds), H.ref(got), 0, 0)
    assert(stats.fused >= (min_fused or 1),
        string.format("%d groups fused, expected at least %d", stats.fused, min_fused or 1))
    return stats
end

describe("cuDNN fusion", function()
    it("says clearly when there is no CUDA device", function()
        if not no_cuda then return end
        local x = mk.input("x", "float32", { 2, 3 })
        H.assert_error(function() mk.compile(x:relu():silu(), { device = "cuda", cudnn = true }) end,
            "no CUDA device:")
    end)

    gpu_it("fuses matmul + bias + ReLU", function()
        local m, k, n = math.random(4, 64), 4 * math.random(4, 32), 4 * math.random(4, 32)
        local xt, xr = H.rand({ m, k })
        local w, wr = H.rand({ k, n }, -0.3, 0.3)
        local b, br = H.rand({ 1, n })
        local x = mk.input("x", "float32", { m, k })
        local y = (x:matmul(mk.constant(w, "w")) + mk.constant(b, "b")):relu()
        local stats = check(y, { x = xt }, R.relu(R.add(R.matmul(xr, wr), br)), 1)
        assert.are.equal(1, stats.launches)
    end)

    gpu_it("fuses the SiLU gate silu(x W1) * (x W3)", function()
        local m, d, h = math.random(1, 16), 8 * math.random(2, 16), 8 * math.random(2, 24)
        local xt, xr = H.rand({ m, d })
        local w1, w1r = H.rand({ d, h }, -0.3, 0.3)
        local w3, w3r = H.rand({ d, h }, -0.3, 0.3)
        local x = mk.input("x", "float32", { m, d })
        local y = x:matmul(mk.constant(w1, "w1")):silu() * x:matmul(mk.constant(w3, "w3"))
        check(y, { x = xt }, R.mul(R.silu(R.matmul(xr, w1r)), R.matmul(xr, w3r)), 1)
    end)

    gpu_it("runs pointwise chains (fused, or rejected with a reason and still right)", function()
        local shape = { math.random(1, 3), math.random(2, 16), 4 * math.random(1, 16) }
        local at, ar = H.rand(shape)
        local bt, br = H.rand(shape)
        local ct, cr = H.rand(shape)
        local a, b, c = mk.input("a", "float32", shape), mk.input("b", "float32", shape),
            mk.input("c", "float32", shape)
        local y = ((a + b) * c):relu():silu()
        check(y, { a = at, b = bt, c = ct }, R.silu(R.relu(R.mul(R.add(ar, br), cr))), 0)
    end)

    gpu_it("runs a 30-node chain in bounded groups", function()
        local shape = { math.random(2, 16), 4 * math.random(2, 16) }
        local xt, xr = H.rand(shape)
        local b, br = H.rand(shape, -0.5, 0.5)
        local c, cr = H.rand(shape, 0.5, 1)
        local x = mk.input("x", "float32", shape)
        local bn, cn = mk.constant(b, "b"), mk.constant(c, "c")
        local y, want = x, xr
        for i = 0, 29 do
            local k = i % 4
            if k == 0 then y, want = y + bn, R.add(want, br)
            elseif k == 1 then y, want = y * cn, R.mul(want, cr)
            elseif k == 2 then y, want = y:silu(), R.silu(want)
            else y, want = y:relu(), R.relu(want) end
        end
        check(y, { x = xt }, want, 0)
    end)

    gpu_it("compiles repeated layers once (cache hits)", function()
        local layers, m, d = math.random(3, 6), math.random(2, 16), 8 * math.random(2, 8)
        local xt, xr = H.rand({ m, d })
        local x = mk.input("x", "float32", { m, d })
        local y, want = x, xr
        for l = 1, layers do
            local s = 1.5 / math.sqrt(d)
            local w, wr = H.rand({ d, d }, -s, s)
            local b, br = H.rand({ 1, d }, -0.1, 0.1)
            y = (y:matmul(mk.constant(w, "w" .. l)) + mk.constant(b, "b" .. l)):relu()
            want = R.relu(R.add(R.matmul(want, wr), br))
        end
        local stats = check(y, { x = xt }, want, layers)
        assert.are.equal(layers, stats.fused)
        if stats.cudnn_cache_hits then -- when the binding reports it
            assert.are.equal(layers - 1, stats.cudnn_cache_hits)
        end
    end)
end)
