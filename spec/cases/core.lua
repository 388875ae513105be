--[[
spec/cases/core.lua — the core ops' systematic cases, once spec/c/ops_test.c
and spec/c/cuda_test.c with references of their own (doc/testing.md maps
each of their cases to these):

  every binary op (+, *, -, /; int64 where taken) over every pattern of
  broadcast dims at ranks 1 to 4, the second operand a constant or an input;
  large operands (the kernels' threaded and vector paths: a full operand, a
  row, a column, a scalar); every unary op at ranks 1 to 4 and large; special
  values (overflow, underflow, NaN, infinities, division by zero); int64
  wrap-around; binary and unary ops of permuted and sliced (offset) views;
  a broadcasting chain of every pointwise op; complex_mul over every
  broadcast pattern; matmul over every transposition and every stored layout
  of batched operands, attention's views of a KV cache, x @ W^T; permute over
  every permutation of ranks 2 to 4; slices and reshapes of slices as matmul
  operands; rms_norm; sliced_softmax's exponential over [-100, 0]; argmax with
  ties. Their stateful cases (c.steps) are in spec/cases/steps.lua.

The references are double-precision loops written from the ops' definitions
(helpers.ref_ops and the few here), never from the core. Lua 5.1 and LuaJIT
load this file too (make test-lua51): their numbers are doubles, so the
int64 wrap-around cases are 5.4's only.
]]
return function(c)
    local mk, add, steps, input, R, H = c.mk, c.add, c.steps, c.input, c.R, c.H
    local S, rand_shape, numel, copy = H.shape_str, H.rand_shape, H.numel, H.copy
    local lua54 = math.type ~= nil
    local FLT_MAX = 3.4028234663852886e38

    local function new(shape, dtype) return { shape = copy(shape), data = {}, dtype = dtype } end
    local function map(x, f)
        local out = new(x.shape, x.dtype)
        for i, v in ipairs(x.data) do out.data[i] = f(v) end
        return out
    end
    local function unravel(p, shape)
        local idx = {}
        for i = #shape, 1, -1 do
            idx[i] = p % shape[i]
            p = (p - idx[i]) / shape[i]
        end
        return idx
    end
    local function ravel(idx, shape)
        local p = 0
        for i = 1, #shape do p = p * shape[i] + idx[i] end
        return p
    end
    local function bit(mask, d) return math.floor(mask / 2 ^ d) % 2 == 1 end
    local keep, sizes = c.keep, c.sizes
    local function coin() return math.random() < 0.5 end

    local away, leaf = H.away, H.leaf

    -- The logical tensor `ref` as a view: stored permuted by perm (0-based;
    -- PermuteNode(stored, perm) is ref) inside `pad` more rows before and
    -- `pad_hi` (default pad) after on its first stored axis (a SliceNode: an
    -- offset view). Returns the node.
    local function view(name, ref, perm, pad, constant, feeds, pad_hi)
        pad_hi = pad_hi or pad
        local rank = #ref.shape
        local ss = {}
        for d = 1, rank do ss[perm[d] + 1] = ref.shape[d] end
        local big = copy(ss)
        big[1] = big[1] + pad + pad_hi
        local data = H.ref((away(big, ref.dtype, 1, 9))).data -- the padding rows' filler
        local row = numel(ss) / ss[1]
        for q = 0, numel(ref.shape) - 1 do
            local idx, sidx = unravel(q, ref.shape), {}
            for d = 1, rank do sidx[perm[d] + 1] = idx[d] end
            data[pad * row + ravel(sidx, ss) + 1] = ref.data[q + 1]
        end
        local t = mk.tensor(data, ref.dtype, big)
        local node = leaf(name, t, constant, feeds)
        if pad > 0 then node = node:slice(pad, pad + ss[1]) end
        local identity = true
        for d = 1, rank do identity = identity and perm[d] == d - 1 end
        if not identity then node = node:permute(perm) end
        return node
    end

    -- the float32 value of a double result: beyond float32's range, the infinity
    local function f32_range(v)
        if v > FLT_MAX then return math.huge end
        if v < -FLT_MAX then return -math.huge end
        return v
    end

    -- tanh from its definition, with its series where 1 - e^-2|v| cancels
    local function tanh(v)
        if v ~= v then return v end
        if math.abs(v) < 1e-4 then return v - v ^ 3 / 3 end
        local t = math.exp(-2 * math.abs(v))
        local r = (1 - t) / (1 + t)
        return v < 0 and -r or r
    end
    local SQ2PI = math.sqrt(2 / math.pi)
    local UN = {
        { name = "ReLUNode", f = function(x) return x:relu() end, i64 = true, atol = 0, rtol = 0, hi = 6, wide = 1e6,
          ref = function(v) return v > 0 and v or (v ~= v and v or 0) end },
        { name = "SiLUNode", f = function(x) return x:silu() end, atol = 1e-30, rtol = 2e-6, hi = 6, wide = 80,
          ref = function(v) return v / (1 + math.exp(-v)) end },
        { name = "ExpNode", f = function(x) return x:exp() end, atol = 1e-30, rtol = 2e-6, hi = 6, wide = 85,
          ref = math.exp },
        { name = "TanhNode", f = function(x) return x:tanh() end, atol = 1e-30, rtol = 2e-6, hi = 4, wide = 20,
          ref = tanh },
        { name = "SigmoidNode", f = function(x) return x:sigmoid() end, atol = 1e-30, rtol = 2e-6, hi = 8, wide = 80,
          ref = function(v) return 1 / (1 + math.exp(-v)) end },
        -- GELU's 1 + tanh cancels for x < 0: its error there is absolute
        { name = "GELUNode", f = function(x) return x:gelu() end, atol = 2e-6, rtol = 2e-6, hi = 6, wide = 20,
          ref = function(v) return 0.5 * v * (1 + tanh(SQ2PI * (v + 0.044715 * v ^ 3))) end },
    }
    local BIN = {
        { name = "SumNode", f = function(a, b) return a + b end, ref = function(x, y) return x + y end, i64 = 2 ^ 40 },
        { name = "HadamardProductNode", f = function(a, b) return a * b end,
          ref = function(x, y) return x * y end, i64 = 2 ^ 25 }, -- products exact in a double
        { name = "SubNode", f = function(a, b) return a - b end, ref = function(x, y) return x - y end, i64 = 2 ^ 40 },
        { name = "DivNode", f = function(a, b) return a / b end, ref = function(x, y) return x / y end },
    }
    -- exact float32 operands, one rounding: within 2^-24 of the double result
    local BIN_ATOL, BIN_RTOL = 1e-30, 1e-6

    -- a [sa] op b [sb], b's dims 1 or a's (same rank)
    local function ref_binary(op, a, b)
        local out = new(a.shape, a.dtype)
        local rank = #a.shape
        for p = 0, numel(a.shape) - 1 do
            local idx = unravel(p, a.shape)
            for d = 1, rank do if b.shape[d] == 1 then idx[d] = 0 end end
            out.data[p + 1] = op.ref(a.data[p + 1], b.data[ravel(idx, b.shape) + 1])
        end
        return out
    end
    local function operands(op, dtype, sa, sb)
        local hi = dtype == "int64" and op.i64 or 1
        local lo = dtype == "int64" and 1 or 0.1
        local at, ar = away(sa, dtype, lo, hi)
        local bt, br = away(sb, dtype, lo, hi)
        return at, ar, bt, br
    end

    -- ---- binary ops: every broadcast pattern of b at ranks 1 to 4 ---------------
    for rank = 1, 4 do
        for mask = 0, 2 ^ rank - 1 do
            for _, op in ipairs(BIN) do
                for _, dtype in ipairs(op.i64 and { "float32", "int64" } or { "float32" }) do
                    if keep() then
                        local sa = rand_shape(rank, 1, rank <= 2 and 9 or 5)
                        local sb = copy(sa)
                        for d = 1, rank do if bit(mask, d - 1) then sb[d] = 1 end end
                        local at, ar, bt, br = operands(op, dtype, sa, sb)
                        local feeds, const = {}, coin()
                        local a = leaf("a", at, false, feeds)
                        local b = leaf("b", bt, const, feeds)
                        local tol = dtype == "int64" and 0 or BIN_ATOL
                        add(string.format("%s %s %s %s (b %s)", op.name, dtype, S(sa), S(sb),
                                const and "constant" or "input"),
                            op.f(a, b), feeds, ref_binary(op, ar, br), tol, dtype == "int64" and 0 or BIN_RTOL)
                    end
                end
            end
        end
    end

    -- ---- binary ops on large operands: b full, a row, a column, a scalar --------
    if not quick then
        local sa = { math.random(64, 100), math.random(250, 300) }
        for _, dtype in ipairs({ "float32", "int64" }) do
            -- one a per dtype: int64 values small enough for exact products
            local at, ar = away(sa, dtype, dtype == "int64" and 1 or 0.1, dtype == "int64" and 2 ^ 25 or 1)
            for _, sb in ipairs({ sa, { 1, sa[2] }, { sa[1], 1 }, { 1, 1 } }) do
                local bt, br = away(sb, dtype, dtype == "int64" and 1 or 0.1, dtype == "int64" and 2 ^ 25 or 1)
                for _, op in ipairs(BIN) do
                    if dtype == "float32" or op.i64 then
                        local want = new(sa, dtype)
                        local ad, bd, wd = ar.data, br.data, want.data
                        for i = 0, sa[1] - 1 do
                            for j = 0, sa[2] - 1 do
                                local q = (sb[1] == 1 and 0 or i) * sb[2] + (sb[2] == 1 and 0 or j)
                                wd[i * sa[2] + j + 1] = op.ref(ad[i * sa[2] + j + 1], bd[q + 1])
                            end
                        end
                        local a, b = mk.input("a", dtype, sa), mk.input("b", dtype, sb)
                        local exact = dtype == "int64"
                        add(string.format("%s %s large %s %s", op.name, dtype, S(sa), S(sb)), op.f(a, b),
                            { a = at, b = bt }, want, exact and 0 or BIN_ATOL, exact and 0 or BIN_RTOL)
                    end
                end
            end
        end
    end

    -- ---- unary ops at ranks 1 to 4, small and large ------------------------------
    for _, u in ipairs(UN) do
        for _, dtype in ipairs(u.i64 and { "float32", "int64" } or { "float32" }) do
            local big_rank = math.random(1, 4) -- large (the threaded paths) at one rank
            for rank = 1, 4 do
                for _, big in ipairs(rank == big_rank and sizes or { false }) do
                    local sh = rand_shape(rank, 1, 6)
                    if big then sh[1] = math.floor(40000 / (numel(sh) / sh[1])) + 1 end
                    local xt, xr
                    if dtype == "int64" then xt, xr = away(sh, dtype, 1, 2 ^ 40)
                    else xt, xr = away(sh, dtype, 0.05, big and u.wide or u.hi) end
                    local x = mk.input("x", dtype, sh)
                    add(string.format("%s %s %s", u.name, dtype, S(sh)), u.f(x), { x = xt },
                        map(xr, function(v) return f32_range(u.ref(v)) end), u.atol, u.rtol)
                end
            end
        end
    end

    -- ---- special values: overflow, underflow, saturation, NaN, infinities ---------
    do
        local inf, nan = math.huge, 0 / 0
        -- results below float32's normal range pass through this atol (a
        -- denormal and a flushed zero are both right)
        local tiny = 1e-37
        local specials = {
            ExpNode = { tiny, { 100, -100, 89, 88.5, -87, -103, 1e-20, -1e-20, 20, -20, nan, inf, -inf } },
            TanhNode = { tiny, { 20, -20, 100, -100, 9.5, -9.5, 1e-20, -1e-20, 1e-4, nan, inf, -inf } },
            SigmoidNode = { tiny, { 100, -100, 80, -80, 20, -20, 1e-20, -1e-20, nan, inf, -inf } },
            GELUNode = { 2e-6, { 100, -100, 10, -10, 1e13, -1e13, 1e-20, -1e-20, nan, inf } },
            SiLUNode = { tiny, { 100, -100, -80, 20, 1e-20, -1e-20, nan, inf } },
            ReLUNode = { 0, { 1e30, -1e30, 1e-30, -1e-30, inf, -inf, 3.5, -2.25 } },
        }
        for _, u in ipairs(UN) do
            local atol, values = specials[u.name][1], specials[u.name][2]
            local xt = mk.tensor(values, "float32")
            local xr = H.ref(xt)
            local want = map(xr, function(v)
                if v == inf or v == -inf then -- the limits, not inf - inf's NaN of the formulas
                    if u.name == "ExpNode" then return v > 0 and inf or 0 end
                    if u.name == "TanhNode" then return v > 0 and 1 or -1 end
                    if u.name == "SigmoidNode" then return v > 0 and 1 or 0 end
                    if u.name ~= "ReLUNode" then return v > 0 and inf or 0 end
                end
                return f32_range(u.ref(v))
            end)
            add(u.name .. " of special values", u.f(mk.input("x", "float32", xr.shape)), { x = xt }, want,
                atol, u.name == "ReLUNode" and 0 or 2e-6)
        end
        local function binary(name, f, ref, a, b)
            local at, bt = mk.tensor(a, "float32"), mk.tensor(b, "float32")
            local ar, br = H.ref(at), H.ref(bt)
            local want = new(ar.shape, "float32")
            for i = 1, #a do want.data[i] = f32_range(ref(ar.data[i], br.data[i])) end
            add(name, f(mk.input("a", "float32", ar.shape), mk.input("b", "float32", br.shape)),
                { a = at, b = bt }, want, tiny, BIN_RTOL)
        end
        local div, sub = BIN[4], BIN[3]
        -- division by values near zero (finite, overflowing, underflowing), by zero and infinity
        binary("DivNode of special values", div.f, div.ref, { 1, -0.5, 0.75, 1e30, -1e30, 1e-30, 3, inf, 1, nan, 1, -1 },
            { 1e-30, 1e-37, -3e-38, 1e-30, 1e-30, 1e30, 7, 2, inf, 1, 0, 0 })
        local ra, rb = {}, {} -- near-zero divisors at random: large finite quotients
        for i = 1, 16 do
            ra[i] = 0.1 + 0.9 * math.random()
            rb[i] = (1 + 9 * math.random()) * 10 ^ -math.random(20, 37)
        end
        binary("DivNode by random near-zero divisors", div.f, div.ref, ra, rb)
        -- subtraction overflowing to ±inf, exact cancellation, inf - inf
        binary("SubNode of special values", sub.f, sub.ref, { 3e38, -3e38, 1.00000012, 1e-30, inf, inf, 2.5 },
            { -3e38, 3e38, 1, 1.00000012e-30, 1, inf, nan })
    end

    -- ---- int64 wrap-around (exact; 5.4's integers wrap as int64 does) --------------
    if lua54 then
        local n = 64
        local mn, mx = math.mininteger, math.maxinteger
        local a = { mn, mx, mn, mx, mn + 5, -3, 7, mx - 1 }
        local b = { 1, -1, mx, mn, 10, mx, mn, -2 }
        for i = 9, n do -- anywhere in the range, never zero
            repeat a[i] = math.random(0) until a[i] ~= 0
            repeat b[i] = math.random(0) until b[i] ~= 0
        end
        local at, bt = mk.tensor(a, "int64"), mk.tensor(b, "int64")
        local ai, bi = mk.input("a", "int64", { n }), mk.input("b", "int64", { n })
        local ar, br = H.ref(at), H.ref(bt)
        add("int64 SubNode wraps around at both ends", ai - bi, { a = at, b = bt }, R.sub(ar, br), 0, 0)
        add("int64 SumNode wraps around at both ends", ai + bi, { a = at, b = bt }, R.add(ar, br), 0, 0)
        for _, k in ipairs({ { "-", mn }, { "-", mx }, { "+", mx } }) do
            local kt = mk.tensor({ k[2] }, "int64")
            local ki = mk.input("k", "int64", { 1 })
            local kr = H.ref(kt)
            add(string.format("int64 a %s %d for every a", k[1], k[2]), k[1] == "-" and ai - ki or ai + ki,
                { a = at, k = kt }, k[1] == "-" and R.sub(ar, kr) or R.add(ar, kr), 0, 0)
        end
    end

    -- ---- binary and unary ops of views: permuted, offset (sliced), broadcast -------
    local function perm_of(rank) return H.rand_perm(rank) end
    for rank = 1, 4 do
        for _, op in ipairs(BIN) do
            for rep = 1, 3 do
                local dtype = op.i64 and rep == 3 and "int64" or "float32"
                if keep() then
                local sa = rand_shape(rank, 1, rank <= 2 and 9 or 5)
                local sb = copy(sa)
                for d = 1, rank do if math.random(0, 2) == 0 then sb[d] = 1 end end
                local _, ar, _, br = operands(op, dtype, sa, sb)
                local feeds = {}
                local a = view("a", ar, perm_of(rank), math.random(0, 2), coin(), feeds)
                local b = view("b", br, perm_of(rank), math.random(0, 2), coin(), feeds)
                add(string.format("%s %s of views %s %s", op.name, dtype, S(sa), S(sb)), op.f(a, b), feeds,
                    ref_binary(op, ar, br), dtype == "int64" and 0 or BIN_ATOL, dtype == "int64" and 0 or BIN_RTOL)
                end
            end
        end
        for _, u in ipairs(UN) do
            for _, dtype in ipairs(u.i64 and { "float32", "int64" } or { "float32" }) do
                local sh = rand_shape(rank, 1, rank <= 2 and 12 or 5)
                local xr
                if dtype == "int64" then _, xr = away(sh, dtype, 1, 2 ^ 40)
                else _, xr = away(sh, dtype, 0.05, u.hi) end
                local feeds = {}
                local x = view("x", xr, perm_of(rank), math.random(0, 2), false, feeds)
                if keep() then add(string.format("%s %s of a view %s", u.name, dtype, S(sh)), u.f(x), feeds,
                    map(xr, u.ref), u.atol, u.rtol) end
            end
        end
    end

    -- ---- every pointwise op in one graph, broadcasting between them ----------------
    -- y = relu(silu(gelu(a / b - exp(c)) * sigmoid(tanh(a)))) + exp(c),
    -- a [m, n], b [1, n] (a constant), c [m, 1]; int64: relu((a - b) - c) + c
    for _, big in ipairs(sizes) do
        local m = big and math.random(200, 300) or math.random(1, 9)
        local n = big and math.random(200, 300) or math.random(1, 9)
        local at, ar = away({ m, n }, "float32", 0.1, 1)
        local bt, br = away({ 1, n }, "float32", 0.1, 1)
        local ct, cr = away({ m, 1 }, "float32", 0.1, 1)
        local a, b_, cc = mk.input("a", "float32", { m, n }), mk.constant(bt, "b"), mk.input("c", "float32", { m, 1 })
        local want = new({ m, n }, "float32")
        local relu, silu, gelu, sigmoid = UN[1].ref, UN[2].ref, UN[6].ref, UN[5].ref
        for i = 0, m - 1 do
            for j = 0, n - 1 do
                local av, ec = ar.data[i * n + j + 1], math.exp(cr.data[i + 1])
                local g = gelu(av / br.data[j + 1] - ec) * sigmoid(tanh(av))
                want.data[i * n + j + 1] = relu(silu(g)) + ec
            end
        end
        add(string.format("a chain of every pointwise op %s", S({ m, n })),
            (((a / b_ - cc:exp()):gelu() * a:tanh():sigmoid()):silu():relu()) + cc:exp(),
            { a = at, c = ct }, want, 1e-5, 1e-5)
        local it, ir = away({ m, n }, "int64", 1, 2 ^ 40)
        local jt, jr = away({ 1, n }, "int64", 1, 2 ^ 40)
        local kt, kr = away({ m, 1 }, "int64", 1, 2 ^ 40)
        local i, j, k = mk.input("i", "int64", { m, n }), mk.input("j", "int64", { 1, n }), mk.input("k", "int64", { m, 1 })
        add(string.format("an int64 chain relu((a - b) - c) + c %s", S({ m, n })), ((i - j) - k):relu() + k,
            { i = it, j = jt, k = kt }, R.add(R.relu(R.sub(R.sub(ir, jr), kr)), kr), 0, 0)
    end

    -- ---- complex_mul: b broadcast over every pattern of 1-dims ------------------------
    for rank = 1, 4 do
        for mask = 0, 2 ^ (rank - 1) - 1 do
            local sa = rand_shape(rank, 1, rank <= 2 and 40 or 6)
            sa[rank] = 2
            local sb = copy(sa)
            for d = 1, rank do if bit(mask, d - 1) then sb[d] = 1 end end
            local at, ar = away(sa, "float32", 0.1, 1)
            local bt, br = away(sb, "float32", 0.1, 1)
            add(string.format("ComplexHadamardProductNode %s by constant %s", S(sa), S(sb)),
                mk.input("a", "float32", sa):complex_mul(mk.constant(bt, "f")), { a = at },
                R.complex_mul(ar, br), 1e-5, 1e-4)
        end
    end

    -- ---- matmul: every transposition, every stored layout of batched operands ---------
    local function matmul_case(what, sa, pa, sb, pb)
        if not keep() then return end
        local ar, br = select(2, away(sa, "float32", 0.1, 1)), select(2, away(sb, "float32", 0.1, 1))
        local feeds = {}
        local a = view("a", ar, pa, 0, coin(), feeds)
        local b = view("b", br, pb, 0, coin(), feeds)
        local k = sa[#sa]
        add(string.format("MatMulNode %s %s perm %s @ %s perm %s", what, S(sa), S(pa), S(sb), S(pb)),
            a:matmul(b), feeds, R.matmul(ar, br), 2e-5 * math.sqrt(k), 1e-4)
    end
    local id2, tr, id3 = { 0, 1 }, { 1, 0 }, { 0, 1, 2 }
    local PERM3 = { { 0, 1, 2 }, { 0, 2, 1 }, { 1, 0, 2 }, { 1, 2, 0 }, { 2, 0, 1 }, { 2, 1, 0 } }
    for _, big in ipairs(sizes) do
        -- big: past the kernels' blocks of 64
        local lo, hi = big and 65 or 1, big and 80 or 12
        local k, n, m = math.random(lo, hi), math.random(lo, hi), math.random(lo, hi)
        local batches = math.random(1, big and 2 or 6)
        for _, t in ipairs({ id2, tr }) do matmul_case("[k]@[k,n]", { k }, { 0 }, { k, n }, t) end
        for _, ta in ipairs({ id2, tr }) do
            for _, tb in ipairs({ id2, tr }) do
                matmul_case("[m,k]@[k,n]", { m, k }, ta, { k, n }, tb)
                matmul_case("[1,k]@[k,n]", { 1, k }, ta, { k, n }, tb)
                matmul_case("[m,k]@[k,1]", { m, k }, ta, { k, 1 }, tb)
            end
        end
        for pa = 1, 6 do
            for pb = 1, 6 do
                if not big or (pa + pb) % 5 == 0 then
                    matmul_case("[B,m,k]@[B,k,n]", { batches, m, k }, PERM3[pa], { batches, k, n }, PERM3[pb])
                end
            end
        end
    end
    -- matrix-vector shapes with n past the CPU's register blocks of columns:
    -- blocks, single vectors and a masked tail each take part
    for _ = 1, 3 do
        local m, k, n = math.random(1, 4), math.random(1, 300), math.random(250, 600)
        for _, tb in ipairs({ id2, tr }) do matmul_case("[m<=4,k]@[k,n>=250]", { m, k }, id2, { k, n }, tb) end
    end
    do -- single-token attention over a KV cache [seq, heads, hd], and x @ W^T
        local seq, h, hd = math.random(5, 40), math.random(2, 8), math.random(4, 24)
        local kt, kr = away({ seq, h, hd }, "float32", 0.1, 1)
        local vt, vr = away({ seq, h, hd }, "float32", 0.1, 1)
        local qt, qr = away({ h, 1, hd }, "float32", 0.1, 1)
        local att, attr = away({ h, 1, seq }, "float32", 0.1, 1)
        local K = mk.input("k", "float32", { seq, h, hd })
        add("q @ K^T over a KV cache viewed [h, hd, seq]", mk.input("q", "float32", { h, 1, hd }):matmul(K:permute({ 1, 2, 0 })),
            { q = qt, k = kt }, R.matmul(qr, R.permute(kr, { 1, 2, 0 })), 2e-5 * math.sqrt(hd), 1e-4)
        add("att @ V over a constant cache viewed [h, seq, hd]",
            mk.input("att", "float32", { h, 1, seq }):matmul(mk.constant(vt, "v"):permute({ 1, 0, 2 })),
            { att = att }, R.matmul(attr, R.permute(vr, { 1, 0, 2 })), 2e-5 * math.sqrt(seq), 1e-4)
        local n_in, n_out = math.random(30, 300), math.random(30, 300)
        local wt, wr = away({ n_out, n_in }, "float32", 0.1, 1)
        local xt, xr = away({ n_in }, "float32", 0.1, 1)
        add("x [n_in] @ W^T, W [n_out, n_in] a constant", mk.input("x", "float32", { n_in }):matmul(mk.constant(wt, "w"):permute(tr)),
            { x = xt }, R.matmul(xr, R.permute(wr, tr)), 2e-5 * math.sqrt(n_in), 1e-4)
    end

    -- ---- permute: every permutation of ranks 2 to 4, as the output or through a consumer --
    local function permute_case(dtype, sh, perm)
        if not keep() then return end
        local xt, xr
        if dtype == "int64" then xt, xr = away(sh, dtype, 1, 2 ^ 40) else xt, xr = away(sh, dtype, 0.1, 1) end
        local x = mk.input("x", dtype, sh):permute(perm)
        local consumer = coin()
        -- times one: a consumer that takes no strides
        add(string.format("PermuteNode %s %s of %s%s", dtype, S(perm), S(sh), consumer and " times one" or ""),
            consumer and x * 1 or x, { x = xt }, R.permute(xr, perm), 0, 0)
    end
    for _, dtype in ipairs({ "float32", "int64" }) do
        local sh = rand_shape(2, 2, 9)
        permute_case(dtype, sh, tr)
        permute_case(dtype, sh, id2)
        -- big enough for the blocked, threaded transpose
        permute_case(dtype, { math.random(150, 260), math.random(150, 260) }, tr)
        for p = 1, 6 do permute_case(dtype, rand_shape(3, 1, 7), PERM3[p]) end
        permute_case(dtype, { math.random(3, 6), math.random(40, 70), math.random(40, 70) }, PERM3[6])
        for a = 0, 3 do
            for b = 0, 3 do
                for cc = 0, 3 do
                    local d = 6 - a - b - cc
                    if a ~= b and a ~= cc and b ~= cc and d >= 0 and d <= 3 and d ~= a and d ~= b and d ~= cc then
                        permute_case(dtype, rand_shape(4, 1, 5), { a, b, cc, d })
                    end
                end
            end
        end
    end

    -- ---- slices: as the output, of a slice, under a reshape as a matmul operand -------
    do
        local sh = { math.random(4, 10), math.random(2, 6), math.random(2, 6) }
        local b = math.random(0, sh[1] - 2)
        local e = math.random(b + 1, sh[1])
        local xt, xr = away(sh, "float32", 0.1, 1)
        local x = mk.input("x", "float32", sh)
        add("relu of a slice", x:slice(b, e):relu(), { x = xt }, R.relu(R.slice(xr, b, e)), 0, 0)
        add("a slice of a slice", x:slice(b, e):slice(0, e - b), { x = xt }, R.slice(xr, b, e), 0, 0)
        local n, rows = math.random(2, 9), (e - b) * sh[2]
        local wt, wr = away({ sh[3], n }, "float32", 0.1, 1)
        add("matmul of a reshaped slice", x:slice(b, e):reshape({ rows, sh[3] }):matmul(mk.constant(wt, "w")),
            { x = xt }, R.matmul(R.reshape(R.slice(xr, b, e), { rows, sh[3] }), wr), 2e-5 * math.sqrt(sh[3]), 1e-4)
        local d = math.random(6, 12)
        local b2 = math.random(0, 2)
        local kk = math.random(2, d - b2)
        local w2t, w2r = away({ d * n }, "float32", 0.1, 1)
        local xat, xar = away({ 3, kk }, "float32", 0.1, 1)
        add("x @ a slice of a reshaped constant",
            mk.input("xa", "float32", { 3, kk }):matmul(mk.constant(w2t, "w2"):reshape({ d, n }):slice(b2, b2 + kk)),
            { xa = xat }, R.matmul(xar, R.slice(R.reshape(w2r, { d, n }), b2, b2 + kk)), 2e-5 * math.sqrt(kk), 1e-4)
    end

    -- argmax of the last axis; with ties, the largest value at two or three
    -- places of each row: the first wins
    local function argmax_case(sh, ties)
        if not keep() then return end
        local n = sh[#sh]
        local _, xr = away(sh, "float32", 0.1, 3)
        if ties and n > 1 then
            for row = 0, numel(sh) / n - 1 do
                for _ = 1, 3 do xr.data[row * n + math.random(1, n)] = 5 end
            end
        end
        add(string.format("ArgMaxNode %s%s", S(sh), ties and " with ties" or ""), mk.input("x", "float32", sh):argmax(),
            { x = mk.tensor(xr.data, "float32", sh) }, R.argmax(xr), 0, 0)
    end

    -- ---- rows: rms_norm (small and large), argmax with ties ------------------------------
    for rank = 1, 4 do
        for _, big in ipairs(sizes) do
            local sh = rand_shape(rank, 1, 6)
            sh[rank] = math.random(1, 300)
            if big and rank > 1 then sh[1] = math.floor(40000 / (numel(sh) / sh[1])) + 1 end
            local n = sh[rank]
            local xt, xr = away(sh, "float32", 0.1, 4)
            local wt, wr = away({ n }, "float32", 0.1, 1)
            add(string.format("RmsNormNode %s", S(sh)), mk.input("x", "float32", sh):rms_norm(mk.constant(wt, "w")),
                { x = xt }, R.rms_norm(xr, wr), 1e-5, 1e-4)
        end
        for _, ties in ipairs({ false, true }) do
            local sh = rand_shape(rank, 1, 6)
            sh[rank] = math.random(1, 300)
            argmax_case(sh, ties)
        end
    end

    -- The softmax's exponential to within a few float32 ulp over its whole
    -- range: rows whose max is 0 and whose other values sweep [-100, 0] (past
    -- -87.3, where e^x leaves the normal floats) with a -inf among them.
    do
        local rows, n = math.random(2, 5), math.random(300, 700)
        local data = {}
        for i = 1, rows * n do data[i] = -100 * math.random() end
        for r = 0, rows - 1 do
            local zero = math.random(1, n)
            local ninf = math.random(1, n - 1)
            if ninf >= zero then ninf = ninf + 1 end
            data[r * n + zero], data[r * n + ninf] = 0, -math.huge
        end
        local xt = mk.tensor(data, "float32", { rows, n })
        add("SlicedSoftmaxNode over [-100, 0] with a -inf", mk.input("x", "float32", { rows, n }):sliced_softmax(n),
            { x = xt }, R.sliced_softmax(H.ref(xt), n), 1e-37, 16 * 2 ^ -24)
    end

    -- ---- the CUDA kernels' paths (gpu_spec asks for these: c.large) -----------------
    -- Shapes for the GPU's vector (float4) and scalar paths, its tiles and
    -- alignments, once spec/c/cuda_test.c's catalogs; too large for the CPU
    -- spec to spend its time on.
    if c.large then
        local big = 1048576
        for _, sh in ipairs({ { { big }, { big } }, { { 1000, 1049 }, { 1000, 1049 } }, { { 37, 45 }, { 37, 45 } },
                              { { 1 }, { 1 } }, { { 4, 37, 33 }, { 1, 37, 1 } }, { { 4, 37, 33 }, { 4, 1, 33 } },
                              { { 3, 1, 33 }, { 1, 1, 33 } }, { { 1000, 1024 }, { 1, 1024 } }, { { 513, 7 }, { 513, 1 } },
                              { { 2, 3, 5, 7 }, { 2, 1, 5, 1 } }, { { 2, 3, 5, 7 }, { 1, 1, 1, 1 } } }) do
            for _, op in ipairs(BIN) do
                local at, ar, bt, br = operands(op, "float32", sh[1], sh[2])
                add(string.format("%s float32 %s %s (GPU paths)", op.name, S(sh[1]), S(sh[2])),
                    op.f(mk.input("a", "float32", sh[1]), mk.constant(bt, "b")), { a = at },
                    ref_binary(op, ar, br), BIN_ATOL, BIN_RTOL)
            end
        end
        for _, k in ipairs({ { 1, { 37, 45 }, { 37, 45 } }, { 2, { 4, 37, 33 }, { 1, 37, 1 } }, { 1, { big }, { 1 } },
                             { 3, { 37, 45 }, { 37, 45 } }, { 3, { 4, 37, 33 }, { 4, 1, 33 } }, { 3, { big }, { 1 } } }) do
            local op = BIN[k[1]]
            local at, ar, bt, br = operands(op, "int64", k[2], k[3])
            add(string.format("%s int64 %s %s (GPU paths)", op.name, S(k[2]), S(k[3])),
                op.f(mk.input("a", "int64", k[2]), mk.constant(bt, "b")), { a = at }, ref_binary(op, ar, br), 0, 0)
        end
        for _, sh in ipairs({ { 1, big }, { 1000, 1049 }, { 37, 45 }, { 1, 1 }, { 3, 1 }, { 3, 1, 37, 5 } }) do
            for _, u in ipairs(UN) do
                local xt, xr = away(sh, "float32", 0.05, u.hi)
                add(string.format("%s float32 %s (GPU paths)", u.name, S(sh)), u.f(mk.input("x", "float32", sh)),
                    { x = xt }, map(xr, u.ref), u.atol, u.rtol)
            end
        end
        for _, sh in ipairs({ { 37, 45 }, { big } }) do
            local xt, xr = away(sh, "int64", 1, 2 ^ 40)
            add("ReLUNode int64 " .. S(sh) .. " (GPU paths)", mk.input("x", "int64", sh):relu(), { x = xt }, map(xr, UN[1].ref), 0, 0)
        end
        -- views: {logical shape, perm, pad before, pad after, constant}
        local function vcase(op, dtype, va, vb)
            local feeds = {}
            local hi = dtype == "int64" and (op.i64 or 2 ^ 40) or 1
            local lo = dtype == "int64" and 1 or 0.1
            local _, ar = away(va[1], dtype, lo, vb and hi or op.hi or 4)
            local a = view("a", ar, va[2], va[3], false, feeds, va[4])
            if not vb then
                add(string.format("%s %s of a view %s perm %s (GPU paths)", op.name, dtype, S(va[1]), S(va[2])), op.f(a), feeds,
                    map(ar, op.ref), op.atol, op.rtol)
                return
            end
            local _, br = away(vb[1], dtype, lo, hi)
            local b = view("b", br, vb[2], vb[3], vb[5], feeds, vb[4])
            add(string.format("%s %s of views %s perm %s, %s perm %s (GPU paths)", op.name, dtype, S(va[1]), S(va[2]),
                S(vb[1]), S(vb[2])), op.f(a, b), feeds, ref_binary(op, ar, br),
                dtype == "int64" and 0 or BIN_ATOL, dtype == "int64" and 0 or BIN_RTOL)
        end
        local Sum, Mul, Sub, Div = BIN[1], BIN[2], BIN[3], BIN[4]
        vcase(Sub, "float32", { { 17, 64, 33 }, { 2, 0, 1 }, 0, 0 }, { { 17, 1, 33 }, { 2, 1, 0 }, 0, 0, true })
        vcase(Div, "float32", { { 49, 300 }, { 0, 1 }, 1, 0 }, { { 1, 300 }, { 1, 0 }, 0, 0 })
        vcase(Sum, "float32", { { 8, 6, 5, 7 }, { 3, 1, 0, 2 }, 0, 0 }, { { 8, 1, 5, 1 }, { 0, 1, 2, 3 }, 0, 0, true })
        vcase(Mul, "float32", { { 1000, 1049 }, { 0, 1 }, 0, 0 }, { { 1000, 1049 }, { 1, 0 }, 0, 0 })
        vcase(Sub, "float32", { { 1000, 1049 }, { 1, 0 }, 0, 0 }, { { 1000, 1049 }, { 0, 1 }, 0, 0, true })
        vcase(Div, "float32", { { 997 }, { 0 }, 3, 0 }, { { 1 }, { 0 }, 0, 0, true })
        vcase(Div, "float32", { { 3, 40, 60 }, { 1, 2, 0 }, 2, 8 }, { { 3, 1, 60 }, { 0, 2, 1 }, 0, 0 })
        vcase(Sub, "int64", { { 3, 70, 40 }, { 1, 2, 0 }, 0, 0 }, { { 3, 1, 40 }, { 0, 1, 2 }, 0, 0 })
        vcase(Sub, "int64", { { 7, 511 }, { 1, 0 }, 1, 1 }, { { 1, 511 }, { 1, 0 }, 0, 0, true })
        vcase(UN[3], "float32", { { 65, 33 }, { 1, 0 }, 0, 0 })
        vcase(UN[6], "float32", { { 96, 37 }, { 0, 1 }, 3, 1 })
        vcase(UN[4], "float32", { { 7, 5, 3, 2 }, { 3, 2, 1, 0 }, 0, 0 })
        vcase(UN[5], "float32", { { 30, 7, 40 }, { 2, 0, 1 }, 1, 1 })
        vcase(UN[2], "float32", { { 1000, 1024 }, { 1, 0 }, 0, 0 })
        vcase({ name = "ReLUNode", f = UN[1].f, ref = UN[1].ref, hi = 2 ^ 40, atol = 0, rtol = 0 }, "int64",
            { { 70, 30, 3 }, { 2, 0, 1 }, 5, 5 })
        -- matmul tiles: {what, a shape, a perm, b shape, b perm} (logical shapes)
        for _, m in ipairs({
            { "plain", { 37, 45 }, id2, { 45, 29 }, id2 }, { "size-1 k", { 33, 1 }, id2, { 1, 65 }, id2 },
            { "size-1 all", { 1, 1 }, id2, { 1, 1 }, id2 }, { "m=1 (gemv)", { 1, 300 }, id2, { 300, 257 }, id2 },
            { "n=1", { 129, 300 }, id2, { 300, 1 }, id2 }, { "a transposed", { 37, 45 }, tr, { 45, 29 }, id2 },
            { "b transposed", { 37, 45 }, id2, { 45, 29 }, tr }, { "both transposed", { 37, 45 }, tr, { 45, 29 }, tr },
            { "m=1, b transposed", { 1, 288 }, id2, { 288, 768 }, tr }, { "256-multiples", { 256, 512 }, id2, { 512, 256 }, id2 },
            { "[k]@[k,n]", { 1000 }, { 0 }, { 1000, 333 }, id2 }, { "[k]@[n,k]^T", { 288 }, { 0 }, { 288, 768 }, tr },
            { "[1]@[1,n]", { 1 }, { 0 }, { 1, 77 }, id2 }, { "[k]@[k,1]", { 513 }, { 0 }, { 513, 1 }, id2 },
            { "[301]@[77,301]^T (k % 4 != 0)", { 301 }, { 0 }, { 301, 77 }, tr },
            { "[4]@[1,4]^T", { 4 }, { 0 }, { 4, 1 }, tr }, { "[128]@[3,128]^T", { 128 }, { 0 }, { 128, 3 }, tr },
            { "batched", { 3, 17, 33 }, id3, { 3, 33, 9 }, id3 }, { "batched, size-1 m", { 6, 1, 48 }, id3, { 6, 48, 37 }, id3 },
            { "batched, b transposed", { 4, 31, 20 }, id3, { 4, 20, 45 }, { 0, 2, 1 } },
            { "batched, a batch-strided", { 4, 31, 20 }, { 1, 0, 2 }, { 4, 20, 45 }, id3 },
            { "attention scores", { 6, 1, 48 }, id3, { 6, 48, 256 }, { 1, 2, 0 } },
            { "attention values", { 6, 1, 256 }, id3, { 6, 256, 48 }, { 1, 0, 2 } },
            { "batch 1", { 1, 40, 30 }, id3, { 1, 30, 20 }, id3 },
        }) do
            matmul_case(m[1] .. " (GPU tiles)", m[2], m[3], m[4], m[5])
        end
        do -- a vector 4 bytes off 16-byte alignment (a slice) against a transposed weight
            local vt, vr = away({ 300 }, "float32", 0.1, 1)
            local wt, wr = away({ 768, 288 }, "float32", 0.1, 1)
            add("an unaligned [288] slice @ [768, 288]^T (GPU tiles)",
                mk.input("v", "float32", { 300 }):slice(1, 289):matmul(mk.constant(wt, "W"):permute(tr)), { v = vt },
                R.matmul(R.slice(vr, 1, 289), R.permute(wr, tr)), 2e-5 * math.sqrt(288), 1e-4)
            local At, Ar = away({ 10, 45 }, "float32", 0.1, 1)
            local Wt, Wr = away({ 29, 45 }, "float32", 0.1, 1)
            add("rows [3, 8) of A @ W^T (GPU tiles)",
                mk.input("A", "float32", { 10, 45 }):slice(3, 8):matmul(mk.constant(Wt, "W"):permute(tr)), { A = At },
                R.matmul(R.slice(Ar, 3, 8), R.permute(Wr, tr)), 2e-5 * math.sqrt(45), 1e-4)
        end
        for _, sh in ipairs({ { 1, 4096 }, { 37, 45 }, { 5, 1 }, { 1000, 33 }, { 3, 2, 2000 }, { 8192 }, { 64, 1024 },
                              { 3, 1025 }, { 7, 300 }, { 5, 200 }, { 2, 9000 }, { 256, 4096 } }) do
            local xt, xr = away(sh, "float32", 0.1, 2)
            local wt, wr = away({ sh[#sh] }, "float32", 0.1, 1)
            add("RmsNormNode " .. S(sh) .. " (GPU paths)", mk.input("x", "float32", sh):rms_norm(mk.constant(wt, "w")),
                { x = xt }, R.rms_norm(xr, wr), 1e-5, 1e-4)
        end
        for _, k in ipairs({ { { 6, 100 }, { 0, 1, 37, 100 } }, { { 3, 4, 1500 }, { 1, 1000, 1025, 1500 } },
                             { { 1, 1 }, { 1, 0 } }, { { 32, 256 }, { 256, 200, 5, 129 } }, { { 4, 700 }, { 700, 699, 31, 33 } },
                             { { 3, 5000 }, { 5000, 4097, 512, 1 } }, { { 2, 9000 }, { 9000, 8193, 4000, 2 } } }) do
            local list = {}
            for _, p in ipairs(k[2]) do
                local xt, xr = away(k[1], "float32", 0.1, 4)
                list[#list + 1] = { feeds = { x = xt, p = mk.tensor({ p }, "int64") }, want = R.sliced_softmax(xr, p) }
            end
            steps("SlicedSoftmaxNode " .. S(k[1]) .. " prefixes " .. S(k[2]) .. " (GPU paths)",
                mk.input("x", "float32", k[1]):sliced_softmax(mk.input("p", "int64", { 1 })), list, 1e-6, 1e-4)
        end
        for _, k in ipairs({ { { 4, 16, 2 }, { 1, 16, 2 } }, { { 7, 5, 3, 2 }, { 7, 1, 3, 2 } }, { { 1000, 64, 2 }, { 1000, 64, 2 } },
                             { { 2 }, { 2 } }, { { 6, 24, 2 }, { 1, 1, 2 } } }) do
            local at, ar = away(k[1], "float32", 0.1, 1)
            local bt, br = away(k[2], "float32", 0.1, 1)
            add("ComplexHadamardProductNode " .. S(k[1]) .. " " .. S(k[2]) .. " (GPU paths)",
                mk.input("a", "float32", k[1]):complex_mul(mk.constant(bt, "f")), { a = at }, R.complex_mul(ar, br), 1e-5, 1e-4)
        end
        for _, k in ipairs({ { "float32", { 2, 3, 4, 5 }, { 3, 1, 0, 2 } }, { "float32", { 2, 3, 4, 5 }, { 0, 1, 3, 2 } },
                             { "float32", { 2, 3, 4, 5 }, { 1, 0, 2, 3 } }, { "float32", { 1024, 1000 }, tr },
                             { "float32", { 2, 33, 65 }, { 0, 2, 1 } }, { "float32", { 33, 2, 65 }, { 2, 1, 0 } },
                             { "float32", { 7, 9 }, id2 }, { "float32", { 1, 5, 1 }, { 2, 0, 1 } },
                             { "int64", { 7, 9 }, tr }, { "int64", { 40, 3, 70 }, { 1, 2, 0 } } }) do
            permute_case(k[1], k[2], k[3])
        end
        for _, k in ipairs({ { { 3, 1000 }, true }, { { 3, 1000 }, false }, { { 1, 32000 }, false }, { { 2, 32000 }, true },
                             { { 5, 7, 1 }, false }, { { 33 }, true }, { { 300, 45 }, true } }) do
            argmax_case(k[1], k[2])
        end
    end
end
