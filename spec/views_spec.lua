-- Views and in-place writes keep the graph's order: a PermuteNode is its input's
-- values at its place; the passes make it a view only where that changes
-- nothing, so passes on and passes off give the same values.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("views_spec")
local R = H.ref_ops
local gpu_it = H.gpu(it, function(why) pending(why) end)

local N = 6 -- every tensor here is [N, N]

local function run_twice(model, feeds_list)
    local outs = {}
    for i, feeds in ipairs(feeds_list) do outs[i] = H.ref(model:run(feeds)) end
    return outs
end

describe("a permuted buffer read after an in-place write into it", function()
    it("holds the buffer's values at the permute's place", function()
        local B = mk.buffer("float32", { N, N })
        local r = mk.input("r", "float32", { 2, N })
        local p = B:permute({ 1, 0 })      -- placed first: B as it was
        local w = B:replace(r, 1, 3)       -- then rows 1 and 2 are written
        local out = p:matmul(w)            -- reads p after the write
        local r1, r1ref = H.rand({ 2, N })
        local r2, r2ref = H.rand({ 2, N })
        -- reference: B starts at zero; each run writes r into rows [1, 3)
        local b0 = R.replace({ shape = { N, N }, data = {} }, r1ref, 1, 3)
        for i = 1, N * N do b0.data[i] = 0 end
        local b1 = R.replace(b0, r1ref, 1, 3)
        local b2 = R.replace(b1, r2ref, 1, 3)
        local want = {
            R.matmul(R.permute(b0, { 1, 0 }), b1), -- run 1: p is all zeros
            R.matmul(R.permute(b1, { 1, 0 }), b2), -- run 2: p has run 1's rows
        }
        for _, passes in ipairs({ true, false }) do
            local model <close> = mk.compile(out, { passes = passes })
            local got = run_twice(model, { { r = r1 }, { r = r2 } })
            H.assert_close(got[1], want[1], 1e-6, 1e-5)
            H.assert_close(got[2], want[2], 1e-6, 1e-5)
        end
    end)
end)

-- Random graphs over one buffer: reads of it (plain, permuted, sliced,
-- reshaped), in-place writes into it and into earlier writes' results, and
-- ops that take a permuted operand as a view (MatMulNode) or not.
local function random_graph()
    local B = mk.buffer("float32", { N, N })
    local x = mk.input("x", "float32", { N, N })
    local writes, permutes = 0, 0
    local memory, value
    function memory(d) -- a node naming the buffer's memory
        if d <= 0 or math.random() < 0.3 then return B end
        local b = math.random(0, N - 1)
        local e = math.random(b + 1, N)
        writes = writes + 1
        return memory(d - 1):replace(value(d - 1):slice(b, e), b, e)
    end
    function value(d) -- an [N, N] value
        local k = d <= 0 and math.random(1, 2) or math.random(1, 9)
        if k == 1 then return x end
        if k == 2 then return memory(d - 1) end
        if k == 3 then return value(d - 1):relu() end
        if k == 4 then return value(d - 1) + value(d - 1) end
        if k == 5 then -- a permute a matrix product may read as a view
            permutes = permutes + 1
            return memory(d - 1):permute({ 1, 0 }):matmul(value(d - 1)) * 0.25
        end
        if k == 6 then
            permutes = permutes + 1
            return value(d - 1):matmul(memory(d - 1):permute({ 1, 0 })) * 0.25
        end
        if k == 7 then -- a permute that must be a copy (a pointwise reader)
            permutes = permutes + 1
            return memory(d - 1):permute({ 1, 0 }) * 0.5
        end
        if k == 8 then return memory(d - 1):reshape({ N * N }):reshape({ N, N }) + x end
        local b = math.random(0, N - 2)
        return memory(d - 1):slice(b, b + 2):reshape({ 2 * N }):reshape({ 2, N })
            :permute({ 1, 0 }):matmul(value(d - 1):slice(0, 2)) * 0.25
    end
    local out
    repeat
        writes, permutes = 0, 0
        out = value(4) + memory(3) + x
    until writes > 0 and permutes > 0
    return out, x
end

-- Compiles each random graph with passes off on the CPU (the reference) and
-- with each of `variants`; every run's values must agree.
local function compare(graphs, variants)
    for g = 1, graphs do
        local out = random_graph()
        local feeds = {}
        for i = 1, 3 do feeds[i] = { x = H.rand({ N, N }) } end
        local ref <close> = mk.compile(out, { passes = false })
        local want = run_twice(ref, feeds)
        for _, opts in ipairs(variants) do
            local model <close> = mk.compile(out, opts)
            local got = run_twice(model, feeds)
            for i = 1, #feeds do
                local ok, err = pcall(H.assert_close, got[i], want[i], 1e-5, 1e-4)
                if not ok then
                    error(string.format("graph %d, run %d, %s passes %s: %s\n%s", g, i,
                        opts.device or "cpu", tostring(opts.passes), err, model:script()), 0)
                end
            end
        end
    end
end

describe("random graphs of views and in-place writes", function()
    it("give the same values with passes on and off, run after run", function()
        compare(60, { { passes = true } })
    end)

    gpu_it("give the CPU's values on CUDA, passes on and off", function()
        compare(30, { { device = "cuda", passes = true }, { device = "cuda", passes = false } })
    end)
end)
