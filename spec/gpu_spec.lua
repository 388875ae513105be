-- The CUDA device against the CPU and the references: every node, with and
-- without cuDNN fusion, buffers, run-time range errors. Tagged #gpu; where no
-- CUDA device is usable every spec here is reported as skipped with the reason.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("gpu_spec")
local R = H.ref_ops


local gpu_it = H.gpu(it, function(why) pending(why) end)

-- the one cross-device table: every op's cases, the random pointwise trees
-- and each family's file in spec/cases/, with the shapes of the CUDA kernels'
-- paths (large = true; MK_GPU_CASES=small leaves them out, as under
-- compute-sanitizer); made only where a device runs them (the large ones
-- cost half a minute of Lua)
local cases = H.requires_cuda() and {} or H.all_cases({ large = os.getenv("MK_GPU_CASES") ~= "small" })

describe("CUDA #gpu", function()
    if #cases == 0 then gpu_it("every case of the op table", function() end) end
    for _, case in ipairs(cases) do
        gpu_it(case.name, function()
            local cpu <close> = mk.compile(case.output)
            local want = H.check_case(cpu, case)
            for _, cudnn in ipairs({ false, true }) do
                local gpu <close> = mk.compile(case.output, { device = "cuda", cudnn = cudnn })
                assert.are.equal("cuda", gpu:stats().device)
                -- cuDNN groups may multiply in TF32 (a 10-bit mantissa); exact cases stay exact
                local atol, rtol = case.atol * 4, case.rtol * 4
                if cudnn and case.atol > 0 then
                    atol, rtol = math.max(atol, 2e-3, case.tf32 or 0), math.max(rtol, 1e-2)
                end
                local got = H.check_case(gpu, case, atol, rtol)
                for i, g in pairs(got) do H.assert_close(g, want[i], atol, rtol) end
                if not case.steps then
                    -- a second evaluation (the replayed graph) gives the same
                    H.assert_close(gpu:run(case.feeds), got[1], 0, 0)
                end
            end
        end)
    end

    gpu_it("buffers persist across runs", function()
        local rows, dim = math.random(3, 8), math.random(1, 5)
        local kv = mk.buffer("float32", { rows, dim })
        local row = mk.input("row", "float32", { 1, dim })
        local pos = mk.input("pos", "int64", { 1 })
        local model <close> = mk.compile(kv:replace(row, pos, pos + 1), { device = "cuda" })
        local want = { shape = { rows, dim }, data = {} }
        for i = 1, rows * dim do want.data[i] = 0 end
        for p = 0, rows - 1 do
            local rt, rr = H.rand({ 1, dim })
            local out = model:run({ row = rt, pos = mk.tensor({ p }, "int64") })
            for j = 1, dim do want.data[p * dim + j] = rr.data[j] end
            H.assert_close(out, want, 0, 0)
        end
    end)

    gpu_it("a Fibonacci-style recurrence", function()
        local s = mk.buffer("float32", { 2 })
        local kick = mk.input("kick", "float32", { 2 })
        local step = mk.constant(mk.tensor({ { 0, 1 }, { 1, 1 } }), "step")
        local model <close> = mk.compile(s:replace(s:matmul(step) + kick, 0, 2), { device = "cuda" })
        local a, b = math.random(0, 9), math.random(1, 9)
        assert.are.same({ a, b }, model:run({ kick = mk.tensor({ a, b }) }):totable())
        local zero = mk.tensor({ 0, 0 })
        for _ = 1, 25 do
            a, b = b, a + b
            assert.are.same({ a, b }, model:run({ kick = zero }):totable())
        end
    end)

    gpu_it("more memory than the GPU has is an error naming what needed it", function()
        local huge = { 1 << 22, 1 << 22 } -- 2^46 bytes: more than any GPU has
        local r = mk.input("r", "float32", { 1, huge[2] })
        local p = mk.input("p", "int64", { 1 })
        local err = H.assert_error(function()
            mk.compile(mk.buffer("float32", huge):replace(r, p, p + 1), { device = "cuda" })
        end, "out of memory: BufferTensor float32 [4194304, 4194304]: cannot allocate " ..
            "70368744177664 bytes of CUDA device memory (", " free)")
        print("# " .. err)
        local x = mk.input("x", "float32", huge)
        H.assert_error(function() mk.compile(x:relu(), { device = "cuda" }) end,
            "out of memory: the model's arena of intermediate values: cannot allocate")
        -- the device goes on: a model compiles and runs
        local y = mk.input("y", "float32", { 3 })
        local m <close> = mk.compile(y:relu(), { device = "cuda" })
        assert.are.same({ 1, 0, 2 }, m:run({ y = mk.tensor { 1, -1, 2 } }):totable())
    end)

    gpu_it("run-time bounds out of range are evaluation errors", function()
        local x = mk.input("x", "float32", { 4, 2 })
        local r = mk.input("r", "float32", { 2, 2 })
        local b, e = mk.input("b", "int64", { 1 }), mk.input("e", "int64", { 1 })
        local model <close> = mk.compile((x * 1):replace(r, b, e), { device = "cuda" })
        local xt, rt = H.rand({ 4, 2 }), H.rand({ 2, 2 })
        local function run(bv, ev)
            return model:run({ x = xt, r = rt, b = mk.tensor({ bv }, "int64"), e = mk.tensor({ ev }, "int64") })
        end
        H.assert_error(function() run(3, 5) end, "evaluation error:", "(script:")
        H.assert_close(run(1, 3), R.replace(H.ref(xt), H.ref(rt), 1, 3), 0, 0)

        local t = mk.input("t", "float32", { 3, 2 })
        local ids = mk.input("ids", "int64", { 2 })
        local emb <close> = mk.compile(mk.embedding(t, ids), { device = "cuda" })
        H.assert_error(function() emb:run({ t = H.rand({ 3, 2 }), ids = mk.tensor({ 0, 3 }, "int64") }) end,
            "evaluation error:", "(script:")
    end)

    gpu_it("[in, out] weights are held by columns: an MLP is three matrix-vector groups", function()
        local sizes = { 64, math.random(100, 300) * 2, math.random(20, 60) * 2, 8 }
        local x = mk.input("x", "float32", { 1, sizes[1] })
        local xt, xr = H.rand({ 1, sizes[1] })
        local h, ref = x, xr
        for l = 1, 3 do
            local s = 1 / math.sqrt(sizes[l])
            local w, wr = H.rand({ sizes[l], sizes[l + 1] }, -s, s)
            local b, br = H.rand({ 1, sizes[l + 1] }, -0.1, 0.1)
            h = h:matmul(mk.constant(w, "w" .. l)) + mk.constant(b, "b" .. l)
            ref = R.add(R.matmul(ref, wr), br)
            if l < 3 then h, ref = h:relu(), R.relu(ref) end
        end
        local model <close> = mk.compile(h, { device = "cuda" })
        local report = model:fusion_report()
        assert.are.equal(3, model:stats().launches, report)
        assert.are.equal(3, select(2, report:gsub("matrix%-vector group", "")), report)
        H.assert_close(model:run({ x = xt }), ref, 1e-5, 1e-4)
        H.assert_close(model:run({ x = xt }), ref, 1e-5, 1e-4)
    end)

    gpu_it("a constant read as weights and otherwise keeps its rows; sharing minds the layout", function()
        local k, n = math.random(3, 40), math.random(2, 30) * 2
        local x = mk.input("x", "float32", { 1, k })
        local xt, xr = H.rand({ 1, k })
        local w, wr = H.rand({ k, n })
        local wc = mk.constant(w, "w")
        -- w as weights only (held by columns), and as weights and a pointwise operand (by rows)
        local only <close> = mk.compile(x:matmul(wc), { device = "cuda" })
        H.assert_close(only:run({ x = xt }), R.matmul(xr, wr), 1e-5, 1e-4)
        local both <close> = mk.compile({ x:matmul(wc), wc * 2 }, { device = "cuda", share = only })
        local y, w2 = both:run({ x = xt })
        H.assert_close(y, R.matmul(xr, wr), 1e-5, 1e-4)
        H.assert_close(w2, R.mul(wr, { shape = { 1 }, data = { 2 } }), 0, 0)
        assert.are.equal(0, both:stats().shared_bytes) -- another layout: its own copy
        local again <close> = mk.compile(x:matmul(wc) * 2, { device = "cuda", share = only })
        assert.are.equal(4 * k * n, again:stats().shared_bytes)
        H.assert_close(again:run({ x = xt }), R.mul(R.matmul(xr, wr), { shape = { 1 }, data = { 2 } }),
                       1e-5, 1e-4)
    end)

    gpu_it("an MLP with cuDNN fusion reports its groups", function()
        local x = mk.input("x", "float32", { 8, 32 })
        local xt, xr = H.rand({ 8, 32 })
        local w, wr = H.rand({ 32, 16 }, -0.3, 0.3)
        local b, br = H.rand({ 1, 16 })
        local y = (x:matmul(mk.constant(w, "w")) + mk.constant(b, "b")):relu()
        local model <close> = mk.compile(y, { device = "cuda", cudnn = true })
        -- TF32 products: about 5e-4 relative per term, 32 terms
        H.assert_close(model:run({ x = xt }), R.relu(R.add(R.matmul(xr, wr), br)), 3e-3, 1e-2)
        local plain <close> = mk.compile(y, { device = "cuda" })
        H.assert_close(plain:run({ x = xt }), R.relu(R.add(R.matmul(xr, wr), br)), 1e-4, 1e-4)
        assert.is_number(model:stats().fused)
    end)
end)

-- ---- large and odd shapes --------------------------------------------------------

--[[
Big random tensors without a Lua table per element: a block of P float32
values (P prime, so the pattern never lines up with a dimension) repeated.
Returns the tensor and value(i) for the flat 0-based index i.
]]
local function big_rand(shape, scale)
    local P = 4099
    local vals, parts = {}, {}
    for i = 1, P do
        local v = (0.1 + 0.9 * math.random()) * (math.random() < 0.5 and -scale or scale)
        parts[i] = string.pack("<f", v)
        vals[i] = string.unpack("<f", parts[i])
    end
    local n = H.numel(shape)
    local block = table.concat(parts)
    local bytes = block:rep(n // P) .. block:sub(1, 4 * (n % P))
    return mk.from_bytes(bytes, "float32", shape), function(i) return vals[i % P + 1] end
end

-- |got - want| over max|want| at `count` random flat indices of the two tensors.
local function sampled_rel(got, want, count)
    local worst, scale = 0, 0
    for _ = 1, count do
        local i = math.random(1, want.numel)
        worst = math.max(worst, math.abs(got:get(i) - want:get(i)))
        scale = math.max(scale, math.abs(want:get(i)))
    end
    return worst / (scale > 0 and scale or 1)
end

-- y on the CPU and on CUDA for a = at: agree overall, and 2000 sampled
-- elements of the CUDA result against ref(i), a double-precision reference.
local function check_big_chain(y, at, ref)
    local cpu <close> = mk.compile(y)
    local gpu <close> = mk.compile(y, { device = "cuda" })
    local want, got = cpu:run({ a = at }), gpu:run({ a = at })
    assert.is_true(sampled_rel(got, want, 20000) < 1e-5)
    for _ = 1, 2000 do
        local i = math.random(0, #got - 1)
        local r, g = ref(i), got:get(i + 1)
        assert(math.abs(g - r) <= 1e-5 + 1e-5 * math.abs(r),
            string.format("element %d: %.9g vs %.9g", i, g, r))
    end
end

describe("CUDA large and odd shapes #gpu", function()
    gpu_it("1M-element pointwise chain agrees with the CPU and the reference", function()
        local n = 1 << 20
        local at, av = big_rand({ n }, 2)
        local bt, bv = big_rand({ n }, 1)
        local a, b = mk.input("a", "float32", { n }), mk.constant(bt, "b")
        check_big_chain(((a + b) * b):relu() + (a * b):silu(), at, function(i)
            local x, w = av(i), bv(i)
            return math.max((x + w) * w, 0) + (x * w) / (1 + math.exp(-(x * w)))
        end)
    end)

    gpu_it("4096x4096 matmul (plain, a transposed weight, odd sizes) agrees with the CPU", function()
        local s = 4096
        -- {m, k, n}: square, and the odd [4093, 4101] @ [4101, 4067]
        for _, v in ipairs({ { s, s, s, false }, { s, s, s, true }, { s - 3, s + 5, s - 29, false } }) do
            local m, k, n, transposed = v[1], v[2], v[3], v[4]
            local xt, xv = big_rand({ m, k }, 1)
            local wt, wv = big_rand(transposed and { n, k } or { k, n }, 1 / 64)
            local x, w = mk.input("x", "float32", { m, k }), mk.constant(wt, "w")
            local y = transposed and x:matmul(w:permute({ 1, 0 })) or x:matmul(w)
            local cpu <close> = mk.compile(y)
            local gpu <close> = mk.compile(y, { device = "cuda" })
            local want, got = cpu:run({ x = xt }), gpu:run({ x = xt })
            local rel = sampled_rel(got, want, 20000)
            assert(rel < 1e-4, "cuda vs cpu: " .. rel)
            for _ = 1, 64 do -- double-precision dot products at random entries
                local i, j = math.random(0, m - 1), math.random(0, n - 1)
                local acc = 0.0
                for p = 0, k - 1 do
                    local wij = transposed and wv(j * k + p) or wv(p * n + j)
                    acc = acc + xv(i * k + p) * wij
                end
                local g = got:get(i * n + j + 1)
                assert(math.abs(g - acc) <= 1e-4 + 1e-4 * math.abs(acc),
                    string.format("[%d, %d]: %.9g vs %.9g", i, j, g, acc))
            end
        end
    end)

    -- weights of 8 MB and more: the block holds the normalised x in shared
    -- memory (core/codegen/matvec.c, put_staging); float32, int8 in groups
    -- and bfloat16, their first steps loaded before the wait (raw where narrower)
    gpu_it("large matrix-vector groups with the RmsNorm folded in agree with the CPU and the reference", function()
        local k, n, G = 2048, 4096, 64
        local xt, xv = big_rand({ 1, k }, 1)
        local nt, nv = big_rand({ k }, 1)
        local wt, wv = big_rand({ n, k }, 1 / 45)  -- [out, in], as llama2's files
        local q, sc = mk.quantize(wt, G)
        local x = mk.input("x", "float32", { 1, k })
        local h = x:rms_norm(mk.constant(nt, "norm"))
        local wd = mk.constant(wt, "w"):permute({ 1, 0 })
        local wq = mk.constant(q, "q"):permute({ 1, 0 }):dequantize(mk.constant(sc, "scale"):permute({ 1, 0 }))
        local wb16 = wt:to("bfloat16")
        local wb = mk.constant(wb16, "wb"):permute({ 1, 0 })
        local ss = 0.0
        for p = 0, k - 1 do ss = ss + xv(p) * xv(p) end
        local inv = 1 / math.sqrt(ss / k + 1e-5)
        for _, case in ipairs({ { "float32", wd, function(j, p) return wv(j * k + p) end },
                                { "int8", wq, function(j, p) return q:get(j * k + p + 1) * sc:get((j * k + p) // G + 1) end },
                                { "bfloat16", wb, function(j, p) return wb16:get(j * k + p + 1) end } }) do
            local y = h:matmul(case[2])
            local cpu <close> = mk.compile(y)
            local gpu <close> = mk.compile(y, { device = "cuda" })
            assert.truthy(gpu:kernel_source(1):find("float sA[2048]", 1, true), "A held in shared memory")
            local want, got = cpu:run({ x = xt }), gpu:run({ x = xt })
            local rel = sampled_rel(got, want, 4096)
            assert(rel < 1e-5, case[1] .. " cuda vs cpu: " .. rel)
            for _ = 1, 32 do
                local j = math.random(0, n - 1)
                local acc = 0.0
                for p = 0, k - 1 do acc = acc + xv(p) * inv * nv(p) * case[3](j, p) end
                local g = got:get(j + 1)
                assert(math.abs(g - acc) <= 1e-5 + 1e-4 * math.abs(acc),
                    string.format("%s column %d: %.9g vs %.9g", case[1], j, g, acc))
            end
        end
    end)

    gpu_it("1M-element chain of the new pointwise ops agrees with the CPU and the reference", function()
        local n = 1 << 20
        local at, av = big_rand({ n }, 2)
        local dt, dv = big_rand({ n }, 1) -- magnitudes in [0.1, 1]: never zero
        local a, d = mk.input("a", "float32", { n }), mk.constant(dt, "d")
        check_big_chain(((a - d) / d):tanh():gelu() + (1 - a):sigmoid() * (a / 4):exp(), at,
            function(i)
                local x, w = av(i), dv(i)
                local t = R.tanh({ shape = { 1 }, data = { (x - w) / w } })
                return R.gelu(t).data[1] + 1 / (1 + math.exp(-(1 - x))) * math.exp(x / 4)
            end)
    end)

    gpu_it("odd shapes: non-multiples of 32 and size-1 dims", function()
        for _, c in ipairs({ { 37, 45, 29 }, { 1, 33, 65 }, { 33, 1, 65 }, { 65, 33, 1 }, { 1, 1, 1 } }) do
            local m, k, n = c[1], c[2], c[3]
            local at, ar = H.rand({ m, k })
            local bt, br = H.rand({ n, k })
            local a, b = mk.input("a", "float32", { m, k }), mk.input("b", "float32", { n, k })
            local y = a:matmul(b:permute({ 1, 0 }))
            local gpu <close> = mk.compile(y, { device = "cuda" })
            H.assert_close(gpu:run({ a = at, b = bt }), R.matmul(ar, R.permute(br, { 1, 0 })), 1e-5 * k, 1e-4)
            local v = mk.input("v", "float32", { m, 1, k })
            local vt, vr = H.rand({ m, 1, k })
            local nrm = mk.input("w", "float32", { k })
            local wt, wr = H.rand({ k })
            local z <close> = mk.compile((v:rms_norm(nrm) + v):relu(), { device = "cuda" })
            H.assert_close(z:run({ v = vt, w = wt }), R.relu(R.add(R.rms_norm(vr, wr), vr)), 1e-5, 1e-5)
        end
    end)

    gpu_it("run-time errors name the node, and the next run works", function()
        local cache = mk.buffer("float32", { 4, 3 })
        local row = mk.input("row", "float32", { 1, 3 })
        local pos = mk.input("pos", "int64", { 1 })
        local model <close> = mk.compile(cache:replace(row, pos, pos + 1), { device = "cuda" })
        local rt = H.rand({ 1, 3 })
        H.assert_error(function() model:run({ row = rt, pos = mk.tensor({ 4 }, "int64") }) end,
            "evaluation error: ReplaceSliceNode:", "(script:", "(begin 'pos', end $")
        model:run({ row = rt, pos = mk.tensor({ 3 }, "int64") })

        local x = mk.input("x", "float32", { 2, 5 })
        local p = mk.input("p", "int64", { 1 })
        local sm <close> = mk.compile(x:sliced_softmax(p), { device = "cuda" })
        local xt, xr = H.rand({ 2, 5 })
        H.assert_error(function() sm:run({ x = xt, p = mk.tensor({ 6 }, "int64") }) end,
            "evaluation error: SlicedSoftmaxNode: prefix 6 ('p')", "(script:")
        H.assert_close(sm:run({ x = xt, p = mk.tensor({ 3 }, "int64") }), R.sliced_softmax(xr, 3), 1e-6, 1e-5)
        local cs <close> = mk.compile(x:causal_softmax(p), { device = "cuda" })
        H.assert_error(function() cs:run({ x = xt, p = mk.tensor({ 1 }, "int64") }) end,
            "evaluation error: CausalSoftmaxNode: end 1 ('p') is outside [2, 5]", "(script:")
        H.assert_close(cs:run({ x = xt, p = mk.tensor({ 4 }, "int64") }), R.causal_softmax(xr, 4), 1e-6, 1e-5)

        local tbl = mk.input("t", "float32", { 3, 2 })
        local ids = mk.input("ids", "int64", { 2 })
        local emb <close> = mk.compile(mk.embedding(tbl, ids), { device = "cuda" })
        local tt, tr = H.rand({ 3, 2 })
        H.assert_error(function() emb:run({ t = tt, ids = mk.tensor({ 0, -1 }, "int64") }) end,
            "evaluation error: EmbeddingNode: id -1 at position 1 of 'ids'", "(script:")
        local it, ir = mk.tensor({ 2, 0 }, "int64"), { data = { 2, 0 } }
        H.assert_close(emb:run({ t = tt, ids = it }), R.embedding(tr, ir), 0, 0)
    end)
end)
