--[[
spec/cases/nodes.lua — one or more random cases per node kind of the first op
set (sums and products with broadcasts, matmul and its prefix and batched
forms, permute, slice, reshape, replace, rms_norm, complex_mul, the softmaxes,
embedding, argmax), each against helpers.ref_ops' double-precision loops.
Once helpers.op_cases; ops_spec runs them on the CPU, gpu_spec on CUDA.
]]
return function(c)
    local mk, add, input, R, H = c.mk, c.add, c.input, c.R, c.H
    local helpers = H
    local rand_shape, rand_perm, copy, numel = H.rand_shape, H.rand_perm, H.copy, H.numel
    local idiv = require("moonkaas.compat").idiv

    for rank = 1, 4 do
        local shape = rand_shape(rank, 1, 6)
        local a, at, ar = input("a", shape)
        local b, bt, br = input("b", shape)
        add("SumNode rank " .. rank, a + b, { a = at, b = bt }, R.add(ar, br))
        add("HadamardProductNode rank " .. rank, a * b, { a = at, b = bt }, R.mul(ar, br))
        -- b broadcasts where its dim is 1
        local bshape = copy(shape)
        for i = 1, rank do if math.random() < 0.5 then bshape[i] = 1 end end
        local c, ct, cr = input("c", bshape)
        add("SumNode broadcast " .. helpers.shape_str(bshape) .. " onto " .. helpers.shape_str(shape),
            a + c, { a = at, c = ct }, R.add(ar, cr))
        add("HadamardProductNode broadcast " .. helpers.shape_str(bshape), c * a, { a = at, c = ct },
            R.mul(ar, cr))
        add("ReLUNode rank " .. rank, a:relu(), { a = at }, R.relu(ar))
        add("SiLUNode rank " .. rank, a:silu(), { a = at }, R.silu(ar))
    end

    for _, op in ipairs({ "add", "sub", "mul", "div" }) do -- NumPy's broadcasting, both sides
        local rank = math.random(1, 4)
        local shape = rand_shape(rank, 2, 5)
        -- each operand: the last few of shape's dims, some of them 1
        local function part()
            local r, s = math.random(1, rank), {}
            for i = 1, r do
                s[i] = math.random() < 0.4 and 1 or shape[rank - r + i]
            end
            return s
        end
        local sa, sb = part(), part()
        local a, at, ar = input("a", sa)
        local b, bt, br = input("b", sb)
        if op == "div" then bt, br = helpers.rand_away(sb, 0.5, 2) end -- no zeros to divide by
        local out = ({ add = a + b, sub = a - b, mul = a * b, div = a / b })[op]
        add(string.format("%s broadcast %s with %s", op, helpers.shape_str(sa), helpers.shape_str(sb)),
            out, { a = at, b = bt }, R[op](ar, br))
        -- a chain whose operands broadcast differently (one pointwise group)
        local c, ct, cr = input("c", part())
        add(string.format("(a - c) * b + a with a %s, b %s, c %s", helpers.shape_str(sa),
                helpers.shape_str(sb), helpers.shape_str(c.shape)),
            (a - c) * b + a, { a = at, b = bt, c = ct }, R.add(R.mul(R.sub(ar, cr), br), ar))
    end

    do -- [2, 1] + [1, 3], and a bias [n] on either side of a matrix-vector product
        local m, n, k = math.random(2, 6), math.random(2, 6), math.random(2, 30)
        local col, colt, colr = input("col", { m, 1 })
        local row, rowt, rowr = input("row", { 1, n })
        add("[m, 1] + [1, n]", col + row, { col = colt, row = rowt }, R.add(colr, rowr))
        add("[1, n] - [m, 1]", row - col, { col = colt, row = rowt }, R.sub(rowr, colr))
        local x, xt, xr = input("x", { 1, k })
        local w, wt, wr = input("w", { k, n })
        local bias, biast, biasr = input("bias", { n })
        local xw = R.matmul(xr, wr)
        add("x @ w + bias [n]", x:matmul(w) + bias, { x = xt, w = wt, bias = biast },
            R.add(xw, biasr), 1e-5 * k, 1e-4)
        add("bias [n] - x @ w, then * bias", (bias - x:matmul(w)) * bias,
            { x = xt, w = wt, bias = biast }, R.mul(R.sub(biasr, xw), biasr), 1e-5 * k, 1e-4)
        -- constant weights: matrix-vector groups, reading the biases broadcast
        local wct, wcr = helpers.rand({ k, n })
        add("bias [n] - x @ constant, then * bias (a matrix-vector group)",
            (bias - x:matmul(mk.constant(wct, "wc"))) * bias, { x = xt, bias = biast },
            R.mul(R.sub(biasr, R.matmul(xr, wcr)), biasr), 1e-5 * k, 1e-4)
        add("x @ constant + bias [1, n] + bias [n] (a matrix-vector group)",
            (x:matmul(mk.constant(wct, "wc")) + row) + bias, { x = xt, row = rowt, bias = biast },
            R.add(R.add(R.matmul(xr, wcr), rowr), biasr), 1e-5 * k, 1e-4)
    end

    for rank = 1, 4 do -- reshape with one -1
        local shape = rand_shape(rank, 1, 5)
        local x, xt, xr = input("x", shape)
        local n = numel(shape)
        local d = ({ 1, 2, 3, 4, 6 })[math.random(1, 5)]
        while n % d ~= 0 do d = d - 1 end
        local to = math.random() < 0.5 and { -1, d } or { d, -1 }
        local want = to[1] == -1 and { idiv(n, d), d } or { d, idiv(n, d) }
        add(string.format("ReshapeNode %s to %s", helpers.shape_str(shape), helpers.shape_str(to)),
            x:reshape(to) * 2, { x = xt }, R.mul(R.reshape(xr, want), { shape = { 1 }, data = { 2 } }))
    end

    do -- numbers become constants
        local shape = rand_shape(2, 2, 5)
        local x, xt, xr = input("x", shape)
        local k = math.random() + 0.5
        local ones = {}
        for i = 1, 2 do ones[i] = 1 end
        add("numbers as constants", (x * k + 2) * x, { x = xt },
            R.mul(R.add(R.mul(xr, { shape = ones, data = { k } }), { shape = ones, data = { 2 } }), xr),
            1e-5, 1e-5)
    end

    do -- int64 elementwise
        local shape = rand_shape(2, 2, 5)
        local it, ir = helpers.randint(shape, -1000, 1000)
        local jt, jr = helpers.randint({ shape[1], 1 }, -1000, 1000)
        local i, j = mk.input("i", "int64", shape), mk.input("j", "int64", { shape[1], 1 })
        add("int64 sum, product and relu", ((i + j) * i):relu() + 3, { i = it, j = jt },
            R.add(R.relu(R.mul(R.add(ir, jr), ir)), { shape = { 1, 1 }, data = { 3 } }), 0, 0)
    end

    do -- matmul in its three forms, and with permuted (transposed) operands
        local m, k, n, B = math.random(1, 9), math.random(1, 40), math.random(1, 9), math.random(2, 4)
        local tol = 1e-5 * k
        local v, vt, vr = input("v", { k })
        local a, at, ar = input("a", { m, k })
        local b, bt, br = input("b", { k, n })
        add("MatMulNode [k]@[k,n]", v:matmul(b), { v = vt, b = bt }, R.matmul(vr, br), tol, 1e-4)
        add("MatMulNode [m,k]@[k,n]", a:matmul(b), { a = at, b = bt }, R.matmul(ar, br), tol, 1e-4)
        local x, xt, xr = input("x", { B, m, k })
        local y, yt, yr = input("y", { B, k, n })
        add("MatMulNode [B,m,k]@[B,k,n]", x:matmul(y), { x = xt, y = yt }, R.matmul(xr, yr), tol, 1e-4)
        -- W [n, k] used as W^T: a view where the device takes a transpose flag
        local w, wt, wr = input("w", { n, k })
        add("MatMulNode with a permuted weight", a:matmul(w:permute({ 1, 0 })), { a = at, w = wt },
            R.matmul(ar, R.permute(wr, { 1, 0 })), tol, 1e-4)
        add("MatMulNode [k]@[n,k]^T", v:matmul(w:permute({ 1, 0 })), { v = vt, w = wt },
            R.matmul(vr, R.permute(wr, { 1, 0 })), tol, 1e-4)
        -- a batch of transposed matrices, as attention over a KV cache
        local kv, kvt, kvr = input("kv", { n, B, k }) -- [seq, heads, head] viewed as [heads, head, seq]
        local q, qt, qr = input("q", { B, m, k })
        add("MatMulNode batched with a permuted operand", q:matmul(kv:permute({ 1, 2, 0 })),
            { q = qt, kv = kvt }, R.matmul(qr, R.permute(kvr, { 1, 2, 0 })), tol, 1e-4)
        local c, ct, cr = input("c", { k, n })
        add("MatMulNode of a constant", a:matmul(mk.constant(ct)), { a = at },
            R.matmul(ar, cr), tol, 1e-4)
        -- over a prefix read at run time: all of it, part, none; V as a permuted cache
        local pn = mk.input("p", "int64", { 1 })
        for _, p in ipairs({ k, math.random(1, k), 0 }) do
            local feeds = { x = xt, y = yt, p = mk.tensor({ p }, "int64") }
            add(string.format("PrefixMatMulNode [B,m,k]@[B,k,n] over %d of %d", p, k),
                x:matmul_prefix(y, pn), feeds, R.matmul_prefix(xr, yr, p), tol, 1e-4)
        end
        local vc, vct, vcr = input("vc", { k, B, n }) -- [seq, heads, head] viewed as [heads, seq, head]
        local p = math.random(0, k)
        add(string.format("PrefixMatMulNode with a permuted cache over %d of %d", p, k),
            x:matmul_prefix(vc:permute({ 1, 0, 2 }), pn),
            { x = xt, vc = vct, p = mk.tensor({ p }, "int64") },
            R.matmul_prefix(xr, R.permute(vcr, { 1, 0, 2 }), p), tol, 1e-4)
        add("PrefixMatMulNode [m,k]@[k,n]", a:matmul_prefix(b, pn),
            { a = at, b = bt, p = mk.tensor({ p }, "int64") }, R.matmul_prefix(ar, br, p), tol, 1e-4)
        -- a prompt's attention: many rows (CUDA's tiles), V as a permuted cache
        local tm, tk, tn = math.random(32, 70), math.random(33, 90), math.random(20, 70)
        local tx, txt, txr = input("tx", { B, tm, tk })
        local tv, tvt, tvr = input("tv", { tk, B, tn })
        for _, tp in ipairs({ tk, math.random(1, tk - 1) }) do
            add(string.format("PrefixMatMulNode [%d,%d,%d]@cache over %d of %d", B, tm, tk, tp, tk),
                tx:matmul_prefix(tv:permute({ 1, 0, 2 }), pn),
                { tx = txt, tv = tvt, p = mk.tensor({ tp }, "int64") },
                R.matmul_prefix(txr, R.permute(tvr, { 1, 0, 2 }), tp), 1e-5 * tk, 1e-4)
        end
    end

    -- a prompt's causal attention over caches [S, B, d] and [S, B, n]: T queries after e - T
    -- cached keys (the CPU's causal attention group: blocks of 16 rows, one part-block;
    -- the second shape large enough that the nodes alone take BLAS)
    for _, sz in ipairs({ { math.random(2, 3), math.random(17, 40), math.random(3, 9), math.random(2, 7) },
                          { 2, 70, 64, 48 } }) do
        local B, T, d, n = sz[1], sz[2], sz[3], sz[4]
        local S = T + math.random(0, 30)
        local q, qt, qr = input("q", { B, T, d })
        local kc, kct, kcr = input("kc", { S, B, d })
        local vc, vct, vcr = input("vc", { S, B, n })
        local en = mk.input("e", "int64", { 1 })
        for _, e in ipairs({ T, math.random(T, S) }) do
            local att = q:matmul(kc:permute({ 1, 2, 0 })):causal_softmax(en)
            local want = R.matmul_prefix(R.causal_softmax(R.matmul(qr, R.permute(kcr, { 1, 2, 0 })), e),
                R.permute(vcr, { 1, 0, 2 }), e)
            add(string.format("causal attention [%d,%d,%d] over caches of %d, end %d", B, T, d, S, e),
                att:matmul_prefix(vc:permute({ 1, 0, 2 }), en),
                { q = qt, kc = kct, vc = vct, e = mk.tensor({ e }, "int64") }, want, 1e-5 * S, 1e-4)
        end
    end
    do -- g query heads a kv head: the scores [B, g T, S] read as [B, g, T, S] and back
        local B, g, T, d, n = math.random(1, 3), math.random(2, 3), math.random(10, 24), math.random(3, 9), 4
        local S = T + math.random(0, 20)
        local q, qt, qr = input("q", { B, g * T, d })
        local kc, kct, kcr = input("kc", { S, B, d })
        local vc, vct, vcr = input("vc", { S, B, n })
        local en = mk.input("e", "int64", { 1 })
        local e = math.random(T, S)
        local sc = q:matmul(kc:permute({ 1, 2, 0 })):reshape({ B, g, T, S }):causal_softmax(en)
        local scr = R.causal_softmax(R.reshape(R.matmul(qr, R.permute(kcr, { 1, 2, 0 })), { B, g, T, S }), e)
        add(string.format("causal attention of %d query heads a kv head, [%d,%d,%d] over %d, end %d", g, B,
                g * T, d, S, e),
            sc:reshape({ B, g * T, S }):matmul_prefix(vc:permute({ 1, 0, 2 }), en),
            { q = qt, kc = kct, vc = vct, e = mk.tensor({ e }, "int64") },
            R.matmul_prefix(R.reshape(scr, { B, g * T, S }), R.permute(vcr, { 1, 0, 2 }), e), 1e-5 * S, 1e-4)
    end

    for rank = 1, 4 do -- slice, reshape, permute
        local shape = rand_shape(rank, 2, 5)
        shape[1] = math.random(2, 8)
        local x, xt, xr = input("x", shape)
        local b = math.random(0, shape[1] - 1)
        local e = math.random(b + 1, shape[1])
        add(string.format("SliceNode [%d, %d) of %s", b, e, helpers.shape_str(shape)),
            x:slice(b, e) * 1, { x = xt }, R.slice(xr, b, e))
        local n = numel(shape)
        local flat = { n }
        add("ReshapeNode " .. helpers.shape_str(shape) .. " to [n]", x:reshape(flat):relu(), { x = xt },
            R.relu(R.reshape(xr, flat)))
        local perm = rand_perm(rank)
        add("PermuteNode " .. helpers.shape_str(perm) .. " of " .. helpers.shape_str(shape),
            x:permute(perm), { x = xt }, R.permute(xr, perm))
        add("PermuteNode then SumNode", x:permute(perm) + x:permute(perm), { x = xt },
            R.add(R.permute(xr, perm), R.permute(xr, perm)))
        add("SliceNode then PermuteNode", x:slice(b, e):permute(perm), { x = xt },
            R.permute(R.slice(xr, b, e), perm))
    end

    for rank = 1, 3 do -- replace with integer and node bounds
        local shape = rand_shape(rank, 2, 5)
        shape[1] = math.random(3, 9)
        local x, xt, xr = input("x", shape)
        local b = math.random(0, shape[1] - 1)
        local e = math.random(b + 1, shape[1])
        local rshape = copy(shape)
        rshape[1] = e - b
        local r, rt, rr = input("r", rshape)
        add(string.format("ReplaceSliceNode rows [%d, %d) of %s", b, e, helpers.shape_str(shape)),
            (x * 1):replace(r, b, e), { x = xt, r = rt }, R.replace(xr, rr, b, e))
        local bn, en = mk.input("b", "int64", { 1 }), mk.input("e", "int64", { 1 })
        add("ReplaceSliceNode with run-time bounds", (x + 0):replace(r, bn, en) * 2,
            { x = xt, r = rt, b = mk.tensor({ b }, "int64"), e = mk.tensor({ e }, "int64") },
            R.mul(R.replace(xr, rr, b, e), { shape = helpers.rand_shape(rank, 1, 1), data = { 2 } }))
    end

    for rank = 1, 3 do -- rms_norm, sliced_softmax, argmax
        local shape = rand_shape(rank, 2, 7)
        local n = shape[rank]
        local x, xt, xr = input("x", shape, -3, 3)
        local w, wt, wr = input("w", { n })
        add("RmsNormNode rank " .. rank, x:rms_norm(w), { x = xt, w = wt }, R.rms_norm(xr, wr), 1e-5, 1e-4)
        local p = math.random(1, n)
        add(string.format("SlicedSoftmaxNode prefix %d of %d", p, n), x:sliced_softmax(p), { x = xt },
            R.sliced_softmax(xr, p), 1e-6, 1e-4)
        local pn = mk.input("p", "int64", { 1 })
        add("SlicedSoftmaxNode run-time prefix", (x * 1):sliced_softmax(pn),
            { x = xt, p = mk.tensor({ p }, "int64") }, R.sliced_softmax(xr, p), 1e-6, 1e-4)
        add("SlicedSoftmaxNode prefix 0", x:sliced_softmax(0), { x = xt }, R.sliced_softmax(xr, 0))
        add("ArgMaxNode rank " .. rank, x:argmax(), { x = xt }, R.argmax(xr), 0, 0)
    end

    for rank = 2, 4 do -- causal_softmax: T query rows after e - T cached keys
        local shape = rand_shape(rank, 2, 6)
        shape[rank] = math.random(shape[rank - 1], 9) -- S >= T
        local x, xt, xr = input("x", shape, -3, 3)
        local e = math.random(shape[rank - 1], shape[rank])
        add(string.format("CausalSoftmaxNode end %d of %s", e, helpers.shape_str(shape)),
            x:causal_softmax(mk.input("e", "int64", { 1 })), { x = xt, e = mk.tensor({ e }, "int64") },
            R.causal_softmax(xr, e), 1e-6, 1e-4)
    end
    do -- one row, no cache: a plain softmax; as many rows as columns: the lower triangle
        local x, xt, xr = input("x", { 3, 3 }, -3, 3)
        add("CausalSoftmaxNode T = S", x:causal_softmax(3), { x = xt }, R.causal_softmax(xr, 3), 1e-6, 1e-4)
        local y, yt, yr = input("y", { 1, 7 }, -3, 3)
        add("CausalSoftmaxNode T = 1", (y * 1):causal_softmax(5), { y = yt }, R.causal_softmax(yr, 5), 1e-6, 1e-4)
        local z, zt, zr = input("z", { 2, 9000 }, -3, 3) -- past the kernels that hold a row in registers
        add("CausalSoftmaxNode long rows", z:causal_softmax(8500), { z = zt }, R.causal_softmax(zr, 8500), 1e-7, 1e-4)
    end

    do -- complex_mul with broadcasting, as rotary embeddings
        local heads, pairs_ = math.random(1, 4), math.random(1, 6)
        local q, qt, qr = input("q", { heads, pairs_, 2 })
        local f, ft, fr = input("f", { 1, pairs_, 2 })
        add("ComplexHadamardProductNode broadcast", q:complex_mul(f), { q = qt, f = ft },
            R.complex_mul(qr, fr))
        local g, gt, gr = input("g", { heads, pairs_, 2 })
        add("ComplexHadamardProductNode same shape", q:complex_mul(g), { q = qt, g = gt },
            R.complex_mul(qr, gr))
    end

    do -- embedding of float and int64 tables
        local V, D, n = math.random(2, 20), math.random(1, 8), math.random(1, 6)
        local tbl, tt, tr = input("t", { V, D })
        local it, ir = helpers.randint({ n }, 0, V - 1)
        local ids = mk.input("ids", "int64", { n })
        add("EmbeddingNode float32", mk.embedding(tbl, ids), { t = tt, ids = it }, R.embedding(tr, ir))
        local ct, cr = helpers.randint({ V, D }, -50, 50)
        add("EmbeddingNode of an int64 constant", mk.embedding(mk.constant(ct), ids), { ids = it },
            R.embedding(cr, ir), 0, 0)
    end
end
