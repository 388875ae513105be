-- Reductions, softmaxes and norms over any axes (core/ops_reduce.c's rows):
-- random shapes of rank 1 to 4, random axis sets (some negative), keepdims
-- both ways, strided operands (a permuted or sliced x), against double loops
-- written from each op's definition (NumPy's and torch's).
return function(c)
    local mk, H, R = c.mk, c.H, c.R
    local floor, exp, log, sqrt = math.floor, math.exp, math.log, math.sqrt

    -- the 0-based multi-index of flat 0-based position p
    local function unflatten(p, shape)
        local idx = {}
        for i = #shape, 1, -1 do
            idx[i] = p % shape[i]
            p = floor(p / shape[i])
        end
        return idx
    end

    local function flatten(idx, shape)
        local p = 0
        for i = 1, #shape do p = p * shape[i] + idx[i] end
        return p
    end

    -- x's elements grouped by the reduction they fall in (the reduced axes,
    -- gone[d] for 0-based d, set to 0), each group in row-major order of
    -- x: {values, positions along `axis`}; and the kept-dims shape.
    local function groups(x, gone, axis)
        local kept = {}
        for d = 1, #x.shape do kept[d] = gone[d - 1] and 1 or x.shape[d] end
        local g = {}
        for p = 0, #x.data - 1 do
            local idx = unflatten(p, x.shape)
            local at = axis and idx[axis + 1]
            for d = 1, #idx do if gone[d - 1] then idx[d] = 0 end end
            local o = flatten(idx, kept) + 1
            g[o] = g[o] or { v = {}, at = {} }
            table.insert(g[o].v, x.data[p + 1])
            table.insert(g[o].at, at)
        end
        return g, kept
    end

    local function sum(v)
        local s = 0
        for _, e in ipairs(v) do s = s + e end
        return s
    end

    local reducers = {
        sum = sum,
        mean = function(v) return sum(v) / #v end,
        max = function(v) local m = v[1]; for _, e in ipairs(v) do if e > m then m = e end end; return m end,
        min = function(v) local m = v[1]; for _, e in ipairs(v) do if e < m then m = e end end; return m end,
        prod = function(v) local s = 1; for _, e in ipairs(v) do s = s * e end; return s end,
    }
    local function var(v, correction)
        local m, ss = sum(v) / #v, 0
        for _, e in ipairs(v) do ss = ss + (e - m) ^ 2 end
        return ss / (#v - correction)
    end

    -- the result's shape: kept dims, or without the reduced ones ([1] if none is left)
    local function out_shape(kept, gone, keepdims)
        if keepdims then return kept end
        local s = {}
        for d = 1, #kept do if not gone[d - 1] then s[#s + 1] = kept[d] end end
        if #s == 0 then s[1] = 1 end
        return s
    end

    local function reduce_ref(x, gone, keepdims, f)
        local g, kept = groups(x, gone)
        local want = { shape = out_shape(kept, gone, keepdims), data = {} }
        for o = 1, #g do want.data[o] = f(g[o].v) end
        return want
    end

    -- a random non-empty axis list of a rank, some axes negative; the set it names
    local function rand_axes(rank)
        local list, gone = {}, {}
        for d = 0, rank - 1 do
            if math.random() < 0.5 then
                list[#list + 1] = math.random() < 0.5 and d - rank or d
                gone[d] = true
            end
        end
        if #list == 0 then
            local d = math.random(0, rank - 1)
            list[1], gone[d] = d, true
        end
        -- in a random order
        for i = #list, 2, -1 do
            local j = math.random(1, i)
            list[i], list[j] = list[j], list[i]
        end
        return list, gone
    end

    -- x of a random shape, often read through a view: a permutation or a slice
    -- of a larger input (strided for the kernels); its node, feed and reference
    local function operand(name, rank, lo, hi, max_dim)
        local shape = H.rand_shape(rank, 1, max_dim or 5)
        local form = math.random(1, 3)
        if form == 2 and rank >= 2 then
            local perm = H.rand_perm(rank)
            local inner = {}
            for d = 1, rank do inner[perm[d] + 1] = shape[d] end
            local x, t, r = c.input(name, inner, lo, hi)
            return x:permute(perm), { [name] = t }, R.permute(r, perm), "permuted "
        elseif form == 3 then
            local big = H.copy(shape)
            big[1] = big[1] + 2
            local x, t, r = c.input(name, big, lo, hi)
            return x:slice(1, 1 + shape[1]), { [name] = t }, R.slice(r, 1, 1 + shape[1]), "sliced "
        end
        local x, t, r = c.input(name, shape, lo, hi)
        return x, { [name] = t }, r, ""
    end

    local function label(op, how, x, list, keepdims)
        return string.format("%s %s%s over [%s]%s", op, how, H.shape_str(x.shape),
            table.concat(list, ", "), keepdims and " keepdims" or "")
    end

    for _, op in ipairs({ "sum", "mean", "max", "min", "prod", "var" }) do
        for rank = 1, 4 do
            local lo, hi = -1, 1
            if op == "prod" then lo, hi = 0.5, 1.5 end
            local x, feeds, xr, how = operand("x", rank, lo, hi, op == "prod" and 4 or 5)
            local list, gone = rand_axes(rank)
            local keepdims = math.random() < 0.5
            local correction = math.random(0, 1)
            local y, f
            if op == "var" then
                y = x:var(list, { keepdims = keepdims, correction = correction })
                f = function(v) return var(v, correction) end
                -- N - correction of 0: inf or NaN, no value to compare
                local n = 1
                for d = 0, rank - 1 do if gone[d] then n = n * xr.shape[d + 1] end end
                if n - correction <= 0 then
                    correction = 0
                    y = x:var(list, { keepdims = keepdims })
                end
            else
                y = x[op](x, list, { keepdims = keepdims })
                f = reducers[op]
            end
            c.add(label(op, how, xr, list, keepdims) .. (op == "var" and " correction " .. correction or ""),
                y, feeds, reduce_ref(xr, gone, keepdims, f), 1e-5, 1e-4)
        end
    end

    -- over all axes, the default
    do
        local x, feeds, xr, how = operand("x", math.random(1, 4))
        local all = {}
        for d = 0, #xr.shape - 1 do all[d] = true end
        c.add("sum " .. how .. "over all axes", x:sum(), feeds, reduce_ref(xr, all, false, reducers.sum),
            1e-5, 1e-4)
        c.add("mean " .. how .. "over all axes keepdims", x:mean(nil, { keepdims = true }), feeds,
            reduce_ref(xr, all, true, reducers.mean), 1e-5, 1e-4)
    end

    -- argmax, argmin along one axis: the first of equal values (values drawn
    -- from a few integers, so ties are common)
    for _, op in ipairs({ "argmax", "argmin" }) do
        for rank = 1, 4 do
            local shape = H.rand_shape(rank, 1, 5)
            local data = {}
            for i = 1, H.numel(shape) do data[i] = math.random(-3, 3) end
            local t = mk.tensor(data, "float32", shape)
            local xr = H.ref(t)
            local x = mk.input("x", "float32", shape)
            local axis = math.random(0, rank - 1)
            if math.random() < 0.5 then axis = axis - rank end
            local keepdims = math.random() < 0.5
            local gone = { [axis % rank] = true }
            local g, kept = groups(xr, gone, axis % rank)
            local want = { shape = out_shape(kept, gone, keepdims), data = {}, dtype = "int64" }
            for o = 1, #g do
                local best = 1
                for i, v in ipairs(g[o].v) do
                    if (op == "argmax" and v > g[o].v[best]) or (op == "argmin" and v < g[o].v[best]) then
                        best = i
                    end
                end
                want.data[o] = g[o].at[best]
            end
            c.add(string.format("%s %s along %d%s", op, H.shape_str(shape), axis, keepdims and " keepdims" or ""),
                x[op](x, axis, { keepdims = keepdims }), { x = t }, want, 0, 0)
        end
    end

    -- softmax, log_softmax along one axis
    for _, op in ipairs({ "softmax", "log_softmax" }) do
        for rank = 1, 4 do
            local x, feeds, xr, how = operand("x", rank, -4, 4)
            local axis = math.random(0, rank - 1)
            if math.random() < 0.5 then axis = axis - rank end
            local a = axis % rank
            local g = groups(xr, { [a] = true }, a)
            local want = { shape = H.copy(xr.shape), data = {} }
            for p = 0, #xr.data - 1 do
                local idx = unflatten(p, xr.shape)
                idx[a + 1] = 0
                local kept = H.copy(xr.shape)
                kept[a + 1] = 1
                local v = g[flatten(idx, kept) + 1].v
                local m, s = v[1], 0
                for _, e in ipairs(v) do if e > m then m = e end end
                for _, e in ipairs(v) do s = s + exp(e - m) end
                local e = xr.data[p + 1]
                want.data[p + 1] = op == "softmax" and exp(e - m) / s or e - m - log(s)
            end
            c.add(string.format("%s %s%s along %d", op, how, H.shape_str(xr.shape), axis), x[op](x, axis), feeds,
                want, 1e-5, 1e-4)
        end
    end

    -- the norms: rows of len elements, parameter c(p) of flat element p
    local function norm_ref(xr, len, center, eps, w, b, channel)
        local want = { shape = H.copy(xr.shape), data = {} }
        for r = 0, #xr.data / len - 1 do
            local m, ss = 0, 0
            if center then
                for j = 1, len do m = m + xr.data[r * len + j] end
                m = m / len
            end
            for j = 1, len do ss = ss + (xr.data[r * len + j] - m) ^ 2 end
            local inv = 1 / sqrt(ss / len + eps)
            for j = 1, len do
                local p = r * len + j - 1
                local ch = channel(p) + 1
                local y = (xr.data[p + 1] - m) * inv * (w and w.data[#w.data == 1 and 1 or ch] or 1)
                want.data[p + 1] = y + (b and b.data[#b.data == 1 and 1 or ch] or 0)
            end
        end
        return want
    end

    local function eps_value() return H.f32(10 ^ -math.random(3, 6)) end

    for rank = 1, 4 do
        local shape = H.rand_shape(rank, 1, 5)
        local x, xt, xr = c.input("x", shape, -2, 2)
        local k = math.random(1, rank)
        local len, last = 1, {}
        for d = rank - k + 1, rank do
            len = len * shape[d]
            last[#last + 1] = shape[d]
        end
        local eps = eps_value()
        local w, wt, wr = c.input("w", math.random() < 0.2 and { 1 } or last)
        local b, bt, br = c.input("b", math.random() < 0.2 and { 1 } or last)
        c.add(string.format("layer_norm %s last %d, eps %g", H.shape_str(shape), k, eps),
            x:layer_norm(k, { weight = w, bias = b, eps = eps }), { x = xt, w = wt, b = bt },
            norm_ref(xr, len, true, eps, wr, br, function(p) return p % len end), 1e-4, 1e-4)
        c.add(string.format("layer_norm %s last %d, no weight or bias", H.shape_str(shape), k),
            x:layer_norm(k), { x = xt }, norm_ref(xr, len, true, 1e-5, nil, nil, function(p) return p % len end),
            1e-4, 1e-4)
        local n = shape[rank]
        local rw, rwt, rwr = c.input("w", { n })
        c.add(string.format("rms_norm %s, eps %g", H.shape_str(shape), eps), x:rms_norm(rw, eps),
            { x = xt, w = rwt }, norm_ref(xr, n, false, eps, rwr, nil, function(p) return p % n end), 1e-4, 1e-4)
    end

    for rank = 2, 4 do
        local shape = H.rand_shape(rank, 1, 4)
        local groups_n = math.random(1, 3)
        shape[2] = groups_n * math.random(1, 3)
        local C, S = shape[2], 1
        for d = 3, rank do S = S * shape[d] end
        local x, xt, xr = c.input("x", shape, -2, 2)
        local w, wt, wr = c.input("w", { C })
        local b, bt, br = c.input("b", { C })
        local eps = eps_value()
        c.add(string.format("group_norm %s in %d groups, eps %g", H.shape_str(shape), groups_n, eps),
            x:group_norm(groups_n, { weight = w, bias = b, eps = eps }), { x = xt, w = wt, b = bt },
            norm_ref(xr, C / groups_n * S, true, eps, wr, br, function(p) return floor(p / S) % C end),
            1e-4, 1e-4)

        local m, mt, mr = c.input("m", { C })
        local v, vt, vr = c.input("v", { C }, 0.1, 2)
        local want = { shape = H.copy(shape), data = {} }
        for p = 0, #xr.data - 1 do
            local ch = floor(p / S) % C + 1
            want.data[p + 1] = (xr.data[p + 1] - mr.data[ch]) / sqrt(vr.data[ch] + eps) * wr.data[ch] + br.data[ch]
        end
        c.add(string.format("batch_norm %s, eps %g", H.shape_str(shape), eps),
            x:batch_norm(m, v, { weight = w, bias = b, eps = eps }),
            { x = xt, m = mt, v = vt, w = wt, b = bt }, want, 1e-4, 1e-4)
    end

    -- softmax then a pointwise op, and a norm then one: what a fused row
    -- reduction (a prologue and an epilogue) must keep
    do
        local x, xt, xr = c.input("x", { math.random(1, 4), math.random(2, 9) })
        local y = (x * 2):softmax() + 1
        local want = { shape = H.copy(xr.shape), data = {} }
        local n = xr.shape[2]
        for r = 0, xr.shape[1] - 1 do
            local m, s = -math.huge, 0
            for j = 1, n do m = math.max(m, 2 * xr.data[r * n + j]) end
            for j = 1, n do s = s + exp(2 * xr.data[r * n + j] - m) end
            for j = 1, n do want.data[r * n + j] = exp(2 * xr.data[r * n + j] - m) / s + 1 end
        end
        c.add("softmax of 2x, plus 1", y, { x = xt }, want, 1e-5, 1e-4)
        local z = x:layer_norm():relu()
        local zr = norm_ref(xr, n, true, 1e-5, nil, nil, function(p) return p % n end)
        for i, v in ipairs(zr.data) do zr.data[i] = v > 0 and v or 0 end
        c.add("layer_norm then relu", z, { x = xt }, zr, 1e-4, 1e-4)
    end
    -- row groups as CUDA generates them (core/codegen/rows.c): a prologue of a
    -- scale and a mask before softmax, a shift before log_softmax, gelu after
    -- layer_norm, a product after rms_norm, at rows a warp takes (1 to 33), a
    -- block takes (1024) and past a thread's 8 elements a block (5000)
    for _, n in ipairs({ 1, 31, 32, 33, 1024, 5000 }) do
        local rows = n > 1000 and 3 or 5
        local x, xt, xr = c.input("x", { rows, n }, -3, 3)
        local s, st, sr = c.input("s", { 1 }, 0.1, 1)
        local mask, maskt, maskr = c.input("mask", { 1, n }, -4, 0)
        local want = { shape = { rows, n }, data = {} }
        for r = 0, rows - 1 do
            local v, m, sum = {}, -math.huge, 0
            for j = 1, n do
                v[j] = xr.data[r * n + j] * sr.data[1] + maskr.data[j]
                m = math.max(m, v[j])
            end
            for j = 1, n do sum = sum + exp(v[j] - m) end
            for j = 1, n do want.data[r * n + j] = exp(v[j] - m) / sum end
        end
        c.add(string.format("row group: softmax(x * s + mask) [%d, %d]", rows, n), (x * s + mask):softmax(),
            { x = xt, s = st, mask = maskt }, want, 1e-6, 1e-4)

        local b, bt, br = c.input("b", { n })
        want = { shape = { rows, n }, data = {} }
        for r = 0, rows - 1 do
            local m, sum = -math.huge, 0
            for j = 1, n do m = math.max(m, xr.data[r * n + j] - br.data[j]) end
            for j = 1, n do sum = sum + exp(xr.data[r * n + j] - br.data[j] - m) end
            for j = 1, n do want.data[r * n + j] = 3 * (xr.data[r * n + j] - br.data[j] - m - log(sum)) end
        end
        c.add(string.format("row group: log_softmax(x - b) * 3 [%d, %d]", rows, n), (x - b):log_softmax(-1) * 3,
            { x = xt, b = bt }, want, 1e-4, 1e-4)

        local w, wt, wr = c.input("w", { n })
        local eps = eps_value()
        want = R.gelu(norm_ref(xr, n, true, eps, wr, br, function(p) return p % n end))
        c.add(string.format("row group: gelu(layer_norm(x)) [%d, %d], eps %g", rows, n, eps),
            x:layer_norm(1, { weight = w, bias = b, eps = eps }):gelu(), { x = xt, w = wt, b = bt }, want,
            1e-4, 1e-4)
        want = R.mul(norm_ref(xr, n, false, eps, wr, nil, function(p) return p % n end), br)
        c.add(string.format("row group: rms_norm(x) * b [%d, %d], eps %g", rows, n, eps), x:rms_norm(w, eps) * b,
            { x = xt, w = wt, b = bt }, want, 1e-4, 1e-4)
    end
    -- a LayerNorm folded into the matrix-vector group of the products that
    -- read it (core/product.c): rows 1 to 4, k with and without float4 steps,
    -- up to MK_LAYER_NORM_FLOATS values; one product with a bias and a
    -- residual, or two siblings (GPT-2's fc, or q and k); past the limit, and
    -- where the norm is read by another node too, it stays a node
    for _, sh in ipairs({ { 1, 7 }, { 1, 768 }, { 2, 64 }, { 3, 1000 }, { 4, 2048 }, { 2, 5000 } }) do
        local m, k = sh[1], sh[2]
        local n = ({ 6, 32, 10 })[math.random(1, 3)]
        local x, xt, xr = c.input("x", { m, k }, -3, 3)
        local g, gt, gr = c.input("g", { k }, 0.5, 1.5)
        local b, bt, br = c.input("b", { k })
        local w1, w1t, w1r = c.input("w1", { n, k }, -0.2, 0.2)
        local w2, w2t, w2r = c.input("w2", { n, k }, -0.2, 0.2)
        local c1, c1t, c1r = c.input("c1", { n })
        local res, rest, resr = c.input("res", { m, n })
        local eps = eps_value()
        local ln = x:layer_norm(1, { weight = g, bias = b, eps = eps })
        local lnr = norm_ref(xr, k, true, eps, gr, br, function(p) return p % k end)
        -- a [m, k] @ wr^T (+ bias, + add), and the largest of its outputs' error
        -- under TF32 (cuDNN's matmul, gpu_spec's cudnn = true): each term's
        -- inputs rounded to 10 bits, 2^-11 relative at most each, the terms'
        -- errors independent: 6 sigmas of their sum (sqrt of the squares); and
        -- in float32: k additions, each off by 2^-24 of a partial sum (about
        -- sqrt of the squares again), independent: 6 sigmas
        local function product(a, wr, bias, add)
            local want, tf32, f32 = { shape = { m, n }, data = {} }, 0, 0
            for r = 0, m - 1 do
                for j = 0, n - 1 do
                    local sum, sq = bias and bias.data[j + 1] or 0, 0
                    for t = 1, k do
                        local term = a.data[r * k + t] * wr.data[j * k + t]
                        sum, sq = sum + term, sq + term * term
                    end
                    want.data[r * n + j + 1] = sum + (add and add.data[r * n + j + 1] or 0)
                    tf32 = math.max(tf32, 6 * 2 ^ -11 * math.sqrt(2 * sq))
                    f32 = math.max(f32, 6 * 2 ^ -24 * math.sqrt(k * sq))
                end
            end
            return want, tf32, f32
        end
        local function largest(x)
            local big = 0
            for _, v in ipairs(x.data) do big = math.max(big, math.abs(v)) end
            return big
        end
        local feeds = { x = xt, g = gt, b = bt, w1 = w1t, w2 = w2t }
        local at = string.format("[%d, %d] -> %d, eps %g", m, k, n, eps)
        -- (tolerances: each product's float32 and TF32 bounds, grown by the
        -- other's size where two products multiply)
        local p1, tf_p1, fp_p1 = product(lnr, w1r, c1r, resr)
        c.add("layer_norm into a product, bias and residual " .. at,
            ln:matmul(w1:T()) + c1 + res, { x = xt, g = gt, b = bt, w1 = w1t, c1 = c1t, res = rest },
            p1, math.max(1e-4, fp_p1), 1e-4, tf_p1)
        local q1, tf_q1, fp_q1 = product(lnr, w1r)
        local q2, tf_q2, fp_q2 = product(lnr, w2r)
        c.add("layer_norm into two products " .. at, ln:matmul(w1:T()) * ln:matmul(w2:T()), feeds,
            R.mul(q1, q2), math.max(1e-4, largest(q1) * fp_q2 + largest(q2) * fp_q1), 1e-4,
            largest(q1) * tf_q2 + largest(q2) * tf_q1 + tf_q1 * tf_q2)
        local lne = { shape = { m, k }, data = {} }
        for i, v in ipairs(lnr.data) do lne.data[i] = exp(v) end
        local r1, tf_r1, fp_r1 = product(lne, w1r)
        c.add("layer_norm read by a product and exp " .. at, ln:exp():matmul(w1:T()) + ln:matmul(w2:T()), feeds,
            R.add(r1, q2), math.max(1e-4, fp_r1 + fp_q2), 1e-4, tf_r1 + tf_q2)
    end
end
