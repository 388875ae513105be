--[[
spec/cases/steps.lua — the core ops' stateful cases (c.steps: one model run
step after step), once the end of spec/cases/core.lua: sliced_softmax's
run-time prefixes, 0 and the whole length among them, those out of range
failing with the model still usable; embedding's ids out of range; buffers
written at run-time rows (replace_slice, alone and through
a consumer), whose bad bounds write nothing; a Fibonacci-like recurrence
through embedding; a llama-like chain over a KV cache. References are
double-precision loops (helpers.ref_ops and those below). Lua 5.1 and
LuaJIT load this file too.
]]
return function(c)
    local mk, steps, R, H = c.mk, c.steps, c.R, c.H
    local S, rand_shape, numel, copy = H.shape_str, H.rand_shape, H.numel, H.copy
    local away, leaf, keep, sizes = H.away, H.leaf, c.keep, c.sizes
    local lua54 = math.type ~= nil
    local tr = { 1, 0 } -- a matrix's transpose

    if not steps then return end
    local function i64(v) return mk.tensor({ v }, "int64") end

    -- sliced_softmax with a run-time prefix: 0, 1, n, random; n + 1 and -1 fail; still usable
    for rank = 1, 4 do
        for _, big in ipairs(sizes) do
            local sh = rand_shape(rank, 1, 5)
            sh[rank] = math.random(2, big and 600 or 40)
            if big and rank > 1 then sh[1] = math.floor(20000 / (numel(sh) / sh[1])) + 1 end
            local n = sh[rank]
            local list = {}
            for _, p in ipairs({ 0, 1, n, math.random(1, n), n + 1, -1, math.random(0, n) }) do
                local xt, xr = away(sh, "float32", 0.1, 8)
                if p < 0 or p > n then
                    list[#list + 1] = { feeds = { p = i64(p), x = xt }, error = "evaluation error: SlicedSoftmaxNode:" }
                else
                    list[#list + 1] = { feeds = { p = i64(p), x = xt }, want = R.sliced_softmax(xr, p) }
                end
            end
            steps(string.format("SlicedSoftmaxNode run-time prefixes of %s, out of range ones fail", S(sh)),
                mk.input("x", "float32", sh):sliced_softmax(mk.input("p", "int64", { 1 })), list, 1e-5, 1e-4)
        end
    end

    -- embedding from float32 and int64 tables (input or constant); ids repeat;
    -- ids V, -1 (and 2^63 - 1) fail and the next run works
    for _, dtype in ipairs({ "float32", "int64" }) do
        for _, const in ipairs({ false, true }) do
            local V, D, n = math.random(1, 40), math.random(1, 70), math.random(1, 12)
            local tt, tr_
            if dtype == "int64" then tt, tr_ = away({ V, D }, dtype, 1, 2 ^ 40) else tt, tr_ = away({ V, D }, dtype, 0.1, 1) end
            local feeds0 = {}
            local tbl = leaf("table", tt, const, feeds0)
            local list = {}
            local function ids_feeds(ids)
                local f = { ids = mk.tensor(ids, "int64") }
                for k, v in pairs(feeds0) do f[k] = v end
                return f
            end
            for round = 1, 5 do
                if round == 3 or round == 4 then
                    for _, bad in ipairs({ V, -1, lua54 and math.maxinteger or nil }) do
                        local ids = {}
                        for i = 1, n do ids[i] = math.random(0, V - 1) end
                        ids[math.random(1, n)] = bad
                        list[#list + 1] = { feeds = ids_feeds(ids), error = "evaluation error: EmbeddingNode:" }
                    end
                end
                local ids = {}
                for i = 1, n do ids[i] = math.random(0, V - 1) end
                list[#list + 1] = { feeds = ids_feeds(ids), want = R.embedding(tr_, { data = ids }) }
            end
            steps(string.format("EmbeddingNode of a %s %s [%d, %d], bad ids fail", dtype, const and "constant" or "input",
                V, D), mk.embedding(tbl, mk.input("ids", "int64", { n })), list, 0, 0)
        end
    end

    -- A buffer [R, ...] written at run-time rows [begin, end) over several runs;
    -- the output (the buffer, or it times a constant) shows its state, which
    -- persists. Bounds out of range in every way fail and write nothing.
    local function replace_case(dtype, rank, through)
        if not keep() then return end
        local sh = rand_shape(rank, 2, 5)
        sh[1] = math.random(6, 12)
        local rs = copy(sh)
        rs[1] = math.random(1, 3)
        local Rn, k = sh[1], rs[1]
        local row = numel(sh) / Rn
        local st, sr = away(sh, dtype, dtype == "int64" and 1 or 0.1, dtype == "int64" and 9 or 1)
        local bn, en, r = mk.input("begin", "int64", { 1 }), mk.input("end", "int64", { 1 }), mk.input("r", dtype, rs)
        local out = mk.buffer(dtype, sh):replace(r, bn, en)
        if through then out = out * mk.constant(st, "scale") end
        local state = R.fill(sh, 0, dtype)
        local list = {}
        for step = 1, 8 do
            local rt, rr
            if dtype == "int64" then rt, rr = away(rs, dtype, 1, 2 ^ 40) else rt, rr = away(rs, dtype, 0.1, 1) end
            local begin = math.random(0, Rn - k)
            if step == 4 or step == 7 then
                local bt = away(rs, dtype, 1, 9)
                for _, bad in ipairs({ { -1, k - 1 }, { Rn - k + 1, Rn + 1 }, { begin, begin + k + 1 },
                                       { begin + k, begin }, { Rn + 5, Rn + 5 + k } }) do
                    list[#list + 1] = { feeds = { begin = i64(bad[1]), ["end"] = i64(bad[2]), r = bt },
                        error = "evaluation error: ReplaceSliceNode:" }
                end
            end
            for i = 1, k * row do state.data[begin * row + i] = rr.data[i] end
            local now = { shape = copy(sh), data = copy(state.data), dtype = dtype }
            list[#list + 1] = { feeds = { begin = i64(begin), ["end"] = i64(begin + k), r = rt },
                want = through and R.mul(now, sr) or now }
        end
        steps(string.format("ReplaceSliceNode into a %s buffer %s at run-time rows%s, bad bounds write nothing",
            dtype, S(sh), through and ", times a constant" or ""), out, list,
            dtype == "int64" and 0 or 1e-5, dtype == "int64" and 0 or 1e-4)
    end
    for rank = 1, 4 do
        replace_case("float32", rank, false)
        replace_case("int64", rank, rank % 2 == 0)
        replace_case("float32", rank, true)
    end

    do -- a Fibonacci-like recurrence in a buffer F [N, 1] (int64, exact): step t
        -- reads F[t-2] and F[t-1] by embedding (run-time ids), adds them and a
        -- random x_t and writes F[t]; steps 0 and 1 read rows not yet written (zero)
        local N = math.random(12, 30)
        local ids, at, nx = mk.input("ids", "int64", { 2 }), mk.input("at", "int64", { 1 }), mk.input("next", "int64", { 1 })
        local x = mk.input("x", "int64", { 1, 1 })
        local buf = mk.buffer("int64", { N, 1 })
        local e = mk.embedding(buf, ids)
        local out = buf:replace(e:slice(0, 1) + e:slice(1, 2) + x, at, nx)
        local F, list = {}, {}
        for t = 1, N do F[t] = 0 end
        for t = 0, N - 1 do
            local i1, i2 = t >= 2 and t - 2 or N - 1, t >= 1 and t - 1 or N - 1
            local xv = math.random(1, 3)
            F[t + 1] = F[i1 + 1] + F[i2 + 1] + xv
            list[#list + 1] = { feeds = { ids = mk.tensor({ i1, i2 }, "int64"), at = i64(t), ["next"] = i64(t + 1),
                x = mk.tensor({ { xv } }, "int64") }, want = { shape = { N, 1 }, data = copy(F) } }
        end
        steps("a Fibonacci recurrence in an int64 buffer through EmbeddingNode", out, list, 0, 0)
    end

    do -- a llama-like chain over a KV cache: h = rms_norm(x, g); k = h @ Wk^T;
        -- cache[pos] = k; the softmax of h @ cache^T over the first pos + 1 rows
        local D, Sq = math.random(8, 40), math.random(4, 10)
        local wkt, wkr = away({ D, D }, "float32", 0.1, 1)
        local gt, gr = away({ D }, "float32", 0.1, 1)
        local pos, pos1 = mk.input("pos", "int64", { 1 }), mk.input("pos1", "int64", { 1 })
        local x = mk.input("x", "float32", { 1, D })
        local h = x:rms_norm(mk.constant(gt, "g"))
        local cache = mk.buffer("float32", { Sq, D }):replace(h:matmul(mk.constant(wkt, "wk"):permute(tr)), pos, pos1)
        local out = h:matmul(cache:permute(tr)):sliced_softmax(pos1)
        local cr = R.fill({ Sq, D }, 0)
        local list = {}
        for p = 0, Sq - 1 do
            local xt, xr = away({ 1, D }, "float32", 0.1, 1)
            local hr = R.rms_norm(xr, gr)
            local kr = R.matmul(hr, R.permute(wkr, tr))
            for j = 1, D do cr.data[p * D + j] = kr.data[j] end
            list[#list + 1] = { feeds = { pos = i64(p), pos1 = i64(p + 1), x = xt },
                want = R.sliced_softmax(R.matmul(hr, R.permute(cr, tr)), p + 1) }
        end
        steps("a KV-cache chain: rms_norm, x @ W^T into a buffer, scores over it, sliced softmax", out, list, 1e-4, 1e-3)
    end
end
