-- A batch of sequences, each at its own position (issue 68): replace_at (a
-- row of each sequence's cache written at its own index), sliced_softmax and
-- matmul_prefix with one prefix a run of the first axis, and decode attention
-- over a batch's caches as one group. References are double-precision loops
-- written from each op's definition over flat row-major data.
return function(c)
    local mk, add, input, steps, H = c.mk, c.add, c.input, c.steps, c.H
    local exp, idiv = math.exp, require("moonkaas.compat").idiv

    local function numel(shape)
        local n = 1
        for _, d in ipairs(shape) do n = n * d end
        return n
    end
    local function i64(list) return mk.tensor(list, "int64") end
    local function randoms(n, lo, hi)
        local t = {}
        for i = 1, n do t[i] = math.random(lo, hi) end
        return t
    end

    -- softmax of the first p of row[off + 1 .. off + n], the rest as they are
    local function softmax_prefix(src, dst, off, n, p)
        local m = -math.huge
        for j = 1, p do m = math.max(m, src[off + j]) end
        local sum = 0.0
        for j = 1, p do sum = sum + exp(src[off + j] - m) end
        for j = 1, n do dst[off + j] = j <= p and exp(src[off + j] - m) / sum or src[off + j] end
    end

    -- ---- sliced_softmax and matmul_prefix, a prefix a run ---------------------------

    for _, large in ipairs(c.sizes) do
        local runs = math.random(2, large and 8 or 4)
        local L = runs * math.random(1, 3)
        local m, n = math.random(1, 4), large and math.random(100, 300) or math.random(2, 12)
        local x, xt, xr = input("x", { L, m, n }, -4, 4)
        local ps = randoms(runs, 0, n)
        ps[math.random(runs)] = n
        local want = { shape = { L, m, n }, data = {} }
        for t = 0, L - 1 do
            local p = ps[idiv(t, idiv(L, runs)) + 1]
            for i = 0, m - 1 do softmax_prefix(xr.data, want.data, (t * m + i) * n, n, p) end
        end
        add(string.format("SlicedSoftmaxNode, a prefix each of %d runs of [%d, %d, %d]", runs, L, m, n),
            x:sliced_softmax(mk.input("p", "int64", { runs })), { x = xt, p = i64(ps) }, want, 1e-6, 1e-4)

        local d = large and math.random(32, 96) or math.random(2, 9)
        if large then m = math.random(32, 36) end -- many rows: CUDA's tiles
        local a, at, ar = input("a", { L, m, n }, -1, 1)
        local b, bt, br = input("b", { L, d, n }, -1, 1) -- read as [L, n, d]: a strided operand
        local pw = { shape = { L, m, d }, data = {} }
        for t = 0, L - 1 do
            local p = ps[idiv(t, idiv(L, runs)) + 1]
            for i = 0, m - 1 do
                for j = 0, d - 1 do
                    local s = 0.0
                    for q = 0, p - 1 do s = s + ar.data[(t * m + i) * n + q + 1] * br.data[(t * d + j) * n + q + 1] end
                    pw.data[(t * m + i) * d + j + 1] = s
                end
            end
        end
        add(string.format("PrefixMatMulNode, a prefix each of %d runs of [%d, %d, %d] @ [%d, %d, %d]^T",
            runs, L, m, n, L, d, n), a:matmul_prefix(b:permute({ 0, 2, 1 }), mk.input("p", "int64", { runs })),
            { a = at, b = bt, p = i64(ps) }, pw, 1e-5, 1e-4)
    end

    -- ---- replace_at ------------------------------------------------------------------

    for _, dtype in ipairs({ "float32", "int64" }) do
        local rank = math.random(2, 4)
        local shape = H.rand_shape(rank, 1, 5)
        shape[1] = math.random(2, 5)
        local axis = math.random(1, rank - 1)
        local rshape = {}
        for d = 1, rank do if d ~= axis + 1 then rshape[#rshape + 1] = shape[d] end end
        local rt, rr
        if dtype == "float32" then rt, rr = H.rand(rshape, -3, 3) else rt, rr = H.randint(rshape, -99, 99) end
        local idx = randoms(shape[1], 0, shape[axis + 1] - 1)
        -- the buffer starts at zero; each step writes r at the step's indices
        local want = { shape = shape, data = {}, dtype = dtype }
        for i = 1, numel(shape) do want.data[i] = 0 end
        local before, after = 1, 1 -- dims between the first axis and axis, and past axis
        for d = 2, axis do before = before * shape[d] end
        for d = axis + 2, rank do after = after * shape[d] end
        local S = shape[axis + 1]
        for i = 0, shape[1] - 1 do
            for j = 0, before - 1 do
                for e = 0, after - 1 do
                    want.data[((i * before + j) * S + idx[i + 1]) * after + e + 1] = rr.data[(i * before + j) * after + e + 1]
                end
            end
        end
        local axis_arg = math.random(2) == 1 and axis or axis - rank -- negative from the end too
        local out = mk.buffer(dtype, shape):replace_at(mk.input("r", dtype, rshape), mk.input("idx", "int64", { shape[1] }), axis_arg)
        local bad = {}
        for i, v in ipairs(idx) do bad[i] = v end
        bad[math.random(#bad)] = S -- one past: the step fails and writes nothing
        steps(string.format("ReplaceAtNode %s into [%s] along axis %d", dtype, table.concat(shape, ","), axis_arg), out, {
            { feeds = { r = rt, idx = i64(bad) }, error = "evaluation error: ReplaceAtNode" },
            { feeds = { r = rt, idx = i64(idx) }, want = want },
        }, 0, 0)
    end

    -- ---- a batch's rows through products (matrix-vector groups up to the device's rows) ----

    -- rms_norm(x, g) @ W1^T, silu, times rms_norm(x, g) @ W2^T, plus r: the norm
    -- folded in, two sibling products, an epilogue; weights [n, k] (read by
    -- columns), float32 or bfloat16 (the reference reads them rounded)
    for _, m in ipairs({ 5, 8, 16 }) do
        for _, dtype in ipairs({ "float32", "bfloat16" }) do
            local large = c.large and m == 16
            local k, n = large and 768 or 4 * math.random(2, 24), large and 2 * math.random(100, 400) or 2 * math.random(1, 20)
            local x, xt, xr = input("x", { m, k }, -2, 2)
            local r, rt, rr = input("r", { m, n })
            local gt = H.rand({ k }, 0.5, 1.5)
            local w1t = mk.tensor(H.ref(H.rand({ n, k }, -0.3, 0.3)).data, dtype):reshape({ n, k })
            local w2t = mk.tensor(H.ref(H.rand({ n, k }, -0.3, 0.3)).data, dtype):reshape({ n, k })
            local h = x:rms_norm(mk.constant(gt, "g"))
            local out = (h:matmul(mk.constant(w1t, "w1"):permute({ 1, 0 })):silu()
                * h:matmul(mk.constant(w2t, "w2"):permute({ 1, 0 }))) + r
            -- and the largest error under TF32 (gpu_spec's cudnn = true: products of
            -- more rows than a group takes go to cuDNN): each product's terms off by
            -- 2^-11 at most, independent, 6 sigmas (as reduce.lua's), through silu(a1) * a2
            local want, tf32 = { shape = { m, n }, data = {} }, 0
            for i = 0, m - 1 do
                local ss = 0.0
                for t = 1, k do ss = ss + xr.data[i * k + t] ^ 2 end
                local inv = 1 / math.sqrt(ss / k + 1e-5)
                for j = 0, n - 1 do
                    local a1, a2, q1, q2 = 0.0, 0.0, 0.0, 0.0
                    for t = 1, k do
                        local hv = xr.data[i * k + t] * inv * gt:get(t)
                        local t1, t2 = hv * w1t:get(j + 1, t), hv * w2t:get(j + 1, t)
                        a1, a2, q1, q2 = a1 + t1, a2 + t2, q1 + t1 * t1, q2 + t2 * t2
                    end
                    local s1 = a1 / (1 + exp(-a1))
                    want.data[i * n + j + 1] = s1 * a2 + rr.data[i * n + j + 1]
                    local e1, e2 = 6 * 2 ^ -11 * math.sqrt(2 * q1), 6 * 2 ^ -11 * math.sqrt(2 * q2)
                    tf32 = math.max(tf32, 1.1 * e1 * (math.abs(a2) + e2) + math.abs(s1) * e2)
                end
            end
            add(string.format("rows of a batch: rms_norm, two %s products, silu, residual [%d, %d] -> %d", dtype, m, k, n),
                out, { x = xt, r = rt }, want, 1e-4, 1e-4, tf32)
        end
    end

    -- ---- a product's rows written at each row's own index (folded into its group) ------

    -- (x @ W^T) rotated as RoPE, reshaped [m, A, E], into a buffer [m, A, S, E] at
    -- idx[i] of axis 2, step after step; a bad index fails the step, writes
    -- nothing, and the next step goes on
    for _, m in ipairs({ 1, 3, 16 }) do
        local A, S, E, k = math.random(1, 3), math.random(2, 6), 2 * math.random(1, 4), math.random(4, 40)
        local n = A * E
        local x = mk.input("x", "float32", { m, k })
        local idx = mk.input("idx", "int64", { m })
        local rot = mk.input("rot", "float32", { m, n })
        local wt = H.rand({ n, k }, -0.5, 0.5)
        local y = x:matmul(mk.constant(wt, "w"):permute({ 1, 0 }))
        y = y:reshape({ m, idiv(n, 2), 2 }):complex_mul(rot:reshape({ m, idiv(n, 2), 2 })):reshape({ m, A, E })
        local out = mk.buffer("float32", { m, A, S, E }):replace_at(y, idx, 2)
        local buf = {}
        for i = 1, m * A * S * E do buf[i] = 0 end
        local list = {}
        for step = 1, 4 do
            local xt, xr = H.rand({ m, k }, -1, 1)
            local rt, rr = H.rand({ m, n }, -1, 1)
            local at = randoms(m, 0, S - 1)
            if step == 2 then -- one index past the end: an error, nothing written
                local bad = {}
                for i, v in ipairs(at) do bad[i] = v end
                bad[m] = S
                list[#list + 1] = { feeds = { x = xt, idx = i64(bad), rot = rt }, error = "evaluation error: ReplaceAtNode" }
            end
            for i = 0, m - 1 do
                local row = {}
                for j = 0, n - 1 do
                    local sum = 0.0
                    for t = 1, k do sum = sum + xr.data[i * k + t] * wt:get(j + 1, t) end
                    row[j] = sum
                end
                for h = 0, idiv(n, 2) - 1 do
                    local re, im = row[2 * h], row[2 * h + 1]
                    local cr, ci = rr.data[i * n + 2 * h + 1], rr.data[i * n + 2 * h + 2]
                    row[2 * h], row[2 * h + 1] = re * cr - im * ci, re * ci + im * cr
                end
                for j = 0, n - 1 do
                    buf[((i * A + idiv(j, E)) * S + at[i + 1]) * E + j % E + 1] = row[j]
                end
            end
            local want = { shape = { m, A, S, E }, data = {} }
            for i, v in ipairs(buf) do want.data[i] = v end
            list[#list + 1] = { feeds = { x = xt, idx = i64(at), rot = rt }, want = want }
        end
        steps(string.format("a product's %d rows rotated, each at its own index of [%d, %d, %d, %d] (ReplaceAtNode)",
            m, m, A, S, E), out, list, 1e-5, 1e-4)
    end

    -- ---- decode attention over a batch: one group --------------------------------------

    do -- B sequences, H heads of hs, caches [B, H, S, hs]: each step writes each sequence's
        -- k and v row at its own position, then its queries attend over its own rows
        local B, Hh, S, hs = math.random(2, 4), math.random(1, 3), math.random(4, 9), 4 * math.random(1, 4)
        local pos, pos1 = mk.input("pos", "int64", { B }), mk.input("pos1", "int64", { B })
        local q, k, v = mk.input("q", "float32", { B, Hh, hs }), mk.input("k", "float32", { B, Hh, hs }),
            mk.input("v", "float32", { B, Hh, hs })
        local kc = mk.buffer("float32", { B, Hh, S, hs }, "k_cache"):replace_at(k, pos, 2)
        local vc = mk.buffer("float32", { B, Hh, S, hs }, "v_cache"):replace_at(v, pos, 2)
        local kt = kc:reshape({ B * Hh, S, hs }):permute({ 0, 2, 1 })
        local att = q:reshape({ B * Hh, 1, hs }):matmul(kt):sliced_softmax(pos1)
        local out = att:matmul_prefix(vc:reshape({ B * Hh, S, hs }), pos1):reshape({ B, Hh, hs })
        local K, V = {}, {} -- [b][h][s] = row; zero until written, as the buffers
        for b = 1, B do
            K[b], V[b] = {}, {}
            for h = 1, Hh do
                K[b][h], V[b][h] = {}, {}
                for s = 0, S - 1 do
                    K[b][h][s], V[b][h][s] = {}, {}
                    for e = 1, hs do K[b][h][s][e], V[b][h][s][e] = 0, 0 end
                end
            end
        end
        local at = randoms(B, 0, S - 2) -- each sequence's position
        local list = {}
        for _ = 1, S do
            local qt, qr = H.rand({ B, Hh, hs }, -1, 1)
            local ktt, kr = H.rand({ B, Hh, hs }, -1, 1)
            local vt, vr = H.rand({ B, Hh, hs }, -1, 1)
            local want = { shape = { B, Hh, hs }, data = {} }
            for b = 1, B do
                local p = at[b]
                for h = 1, Hh do
                    local o = ((b - 1) * Hh + (h - 1)) * hs
                    K[b][h][p], V[b][h][p] = {}, {}
                    for e = 1, hs do K[b][h][p][e], V[b][h][p][e] = kr.data[o + e], vr.data[o + e] end
                    local sc, m = {}, -math.huge
                    for s = 0, p do
                        local d = 0.0
                        for e = 1, hs do d = d + qr.data[o + e] * K[b][h][s][e] end
                        sc[s], m = d, math.max(m, d)
                    end
                    local sum = 0.0
                    for s = 0, p do sum = sum + exp(sc[s] - m) end
                    for e = 1, hs do
                        local y = 0.0
                        for s = 0, p do y = y + exp(sc[s] - m) / sum * V[b][h][s][e] end
                        want.data[o + e] = y
                    end
                end
            end
            local p0, p1 = {}, {}
            for b = 1, B do p0[b], p1[b] = at[b], at[b] + 1 end
            list[#list + 1] = { feeds = { pos = i64(p0), pos1 = i64(p1), q = qt, k = ktt, v = vt }, want = want }
            for b = 1, B do at[b] = (at[b] + 1) % S end -- past the end: a new sequence at 0
        end
        steps(string.format("attention over a batch of %d, caches [%d, %d, %d, %d] by ReplaceAtNode", B, B, Hh, S, hs),
            out, list, 1e-5, 1e-4)
    end
end
