-- Shape and data-movement ops (issue 64): numpy.matmul at every rank, slices on
-- any axis with a step, squeeze, unsqueeze, flatten, expand, flip, concat,
-- stack, split, pad, tile, repeat_interleave, gather, index_select, cumsum.
-- References are double-precision loops written from NumPy's (and torch's,
-- ONNX's) definitions over flat row-major data, on random shapes and axes.
return function(c)
    local mk, add, input, H = c.mk, c.add, c.input, c.H
    local idiv = require("moonkaas.compat").idiv

    local function numel(shape)
        local n = 1
        for _, d in ipairs(shape) do n = n * d end
        return n
    end
    -- 0-based coordinates of flat 0-based position p, and back
    local function coords(p, shape)
        local c = {}
        for i = #shape, 1, -1 do
            c[i] = p % shape[i]
            p = idiv(p, shape[i])
        end
        return c
    end
    local function flat(c, shape)
        local p = 0
        for i = 1, #shape do p = p * shape[i] + c[i] end
        return p
    end
    -- out[shape] with out[c] = f(c) (c 0-based coordinates)
    local function build(shape, dtype, f)
        local r = { shape = shape, data = {}, dtype = dtype or "float32" }
        for p = 0, numel(shape) - 1 do r.data[p + 1] = f(coords(p, shape)) end
        return r
    end
    local function at(x, c) return x.data[flat(c, x.shape) + 1] end
    local function rshape(rank, lo, hi) return H.rand_shape(rank, lo or 1, hi or 5) end
    local function copy(t) local u = {} for i, v in ipairs(t) do u[i] = v end return u end
    local function int_input(name, shape, lo, hi)
        local t, r = H.randint(shape, lo or -50, hi or 50)
        return mk.input(name, "int64", shape), t, r
    end
    local function shape_str(s) return "[" .. table.concat(s, ",") .. "]" end

    -- ---- matmul as numpy.matmul --------------------------------------------------

    -- numpy.matmul: a [k] a row, b [k] a column (each dropped), batch dims broadcast
    local function ref_matmul(a, b)
        local as, bs = copy(a.shape), copy(b.shape)
        local a1, b1 = #as == 1, #bs == 1
        if a1 then table.insert(as, 1, 1) end
        if b1 then bs[2] = 1 end
        local m, k, n = as[#as - 1], as[#as], bs[#bs]
        local na, nb = #as - 2, #bs - 2
        local nd = math.max(na, nb)
        local batch = {}
        for d = 1, nd do
            local da = as[d - (nd - na)] or 1
            local db = bs[d - (nd - nb)] or 1
            if d - (nd - na) < 1 then da = 1 end
            if d - (nd - nb) < 1 then db = 1 end
            batch[d] = math.max(da, db)
        end
        local full = copy(batch)
        full[#full + 1], full[#full + 2] = m, n
        local out = build(full, "float32", function(cc)
            local i, j = cc[nd + 1], cc[nd + 2]
            local ca, cb = {}, {}
            for d = 1, na do
                local dd = d + (nd - na)
                ca[d] = as[d] == 1 and 0 or cc[dd]
            end
            for d = 1, nb do
                local dd = d + (nd - nb)
                cb[d] = bs[d] == 1 and 0 or cc[dd]
            end
            local s = 0
            for q = 0, k - 1 do
                ca[na + 1], ca[na + 2] = i, q
                cb[nb + 1], cb[nb + 2] = q, j
                s = s + a.data[flat(ca, as) + 1] * b.data[flat(cb, bs) + 1]
            end
            return s
        end)
        -- the promoted dims leave the result; [k] @ [k] is [1] here
        local shape = copy(batch)
        if not a1 then shape[#shape + 1] = m end
        if not b1 then shape[#shape + 1] = n end
        if #shape == 0 then shape = { 1 } end
        out.shape = shape
        return out
    end

    -- wrap(a, b) builds the product from the inputs, rwrap(ar, br) the references it multiplies
    local function mm_case(label, ashape, bshape, wrap, rwrap)
        local a, at_, ar = input("a", ashape)
        local b, bt, br = input("b", bshape)
        local y = wrap and wrap(a, b) or a:matmul(b)
        if rwrap then ar, br = rwrap(ar, br) end
        add(string.format("matmul %s %s @ %s", label, shape_str(ashape), shape_str(bshape)), y,
            { a = at_, b = bt }, ref_matmul(ar, br), 1e-5, 1e-5)
    end
    local k, m, n = math.random(1, 9), math.random(1, 6), math.random(1, 7)
    local B, T = math.random(2, 4), math.random(2, 5)
    mm_case("vector @ matrix", { k }, { k, n })
    mm_case("vector @ vector", { k }, { k })
    mm_case("matrix @ vector", { m, k }, { k })
    mm_case("batch @ vector", { B, m, k }, { k })
    mm_case("vector @ batch", { k }, { B, k, n })
    mm_case("[B,T,D] @ [D,O]", { B, T, k }, { k, n })
    mm_case("[D] broadcast over 4-D", { 2, B, m, k }, { k, n })
    mm_case("4-D batches broadcast", { 2, 1, m, k }, { B, k, n })
    mm_case("4-D @ 4-D", { 2, B, m, k }, { 2, B, k, n })
    mm_case("4-D, b broadcast on the first", { 3, 2, m, k }, { 1, 2, k, n })
    mm_case("6-D batches broadcast", { 2, 1, 2, 1, m, k }, { 3, 1, 2, k, n })
    mm_case("matrix @ batch", { m, k }, { B, k, n })
    -- a large one goes through BLAS on the CPU, through one folded product
    mm_case("[B,T,D] @ [D,O] folded, BLAS-sized", { 3, 40, 33 }, { 33, 70 })
    mm_case("batches through BLAS", { 2, 3, 70, 40 }, { 3, 40, 50 })
    -- operands as strided views: a transposed weight, a batch broadcast by expand
    mm_case("@ a transposed weight", { B, T, k }, { n, k }, function(a, b) return a:matmul(b:T()) end,
        function(ar, br) return ar, c.R.permute(br, { 1, 0 }) end)
    mm_case("expanded batch (stride 0)", { 1, m, k }, { B, k, n },
        function(a, b) return a:expand({ B, m, k }):matmul(b) end)

    -- ---- slices and views ----------------------------------------------------------

    for rank = 1, 6 do
        local shape = rshape(rank, 2, rank > 4 and 3 or 6)
        local x, xt, xr = input("x", shape)
        local axis = math.random(0, rank - 1)
        local dim = shape[axis + 1]
        local step = math.random(1, 3)
        local b = math.random(-dim, dim - 1)
        local first = b < 0 and b + dim or b
        local e = math.random(first + 1, dim + 2) -- past the end: clamped
        if math.random() < 0.3 then e = e - dim - 2 end -- negative: from the end
        local ee = e < 0 and e + dim or math.min(e, dim)
        if ee <= first then e, ee = dim, dim end
        local count = idiv(ee - first + step - 1, step)
        local oshape = copy(shape)
        oshape[axis + 1] = count
        local want = build(oshape, "float32", function(cc)
            local q = copy(cc)
            q[axis + 1] = first + cc[axis + 1] * step
            return at(xr, q)
        end)
        local name = string.format("slice_axis %s axis %d [%d:%d:%d]", shape_str(shape), axis, b, e, step)
        add(name, x:slice_axis(axis, b, e, step), { x = xt }, want, 0, 0)
        -- read by a pointwise op (a copy) and sliced twice (a view of a view)
        add(name .. " then relu", x:slice_axis(axis, b, e, step):relu(), { x = xt },
            c.R.relu(want), 0, 0)
        local y = x:slice_axis(axis, b, e, step):slice_axis(axis, -1)
        local last = copy(oshape)
        last[axis + 1] = 1
        add(name .. " then its last", y, { x = xt }, build(last, "float32", function(cc)
            local q = copy(cc)
            q[axis + 1] = count - 1
            return at(want, q)
        end), 0, 0)
    end

    -- squeeze, unsqueeze, flatten: the same elements in a new shape
    do
        local shape = rshape(3, 1, 4)
        local axis = math.random(0, 2)
        shape[axis + 1] = 1
        local x, xt, xr = input("x", shape)
        local sq = copy(shape)
        table.remove(sq, axis + 1)
        add("squeeze " .. shape_str(shape) .. " axis " .. axis, x:squeeze(axis - 3 * math.random(0, 1)),
            { x = xt }, { shape = sq, data = xr.data }, 0, 0)
        local u = math.random(0, 3)
        local us = copy(shape)
        table.insert(us, u + 1, 1)
        add("unsqueeze " .. shape_str(shape) .. " axis " .. u, x:unsqueeze(u):relu(), { x = xt },
            c.R.relu({ shape = us, data = xr.data }), 0, 0)
        local s4 = rshape(4, 1, 4)
        local x4, x4t, x4r = input("x", s4)
        local st = math.random(0, 3)
        local en = math.random(st, 3)
        local fs, acc = {}, 1
        for d = 0, 3 do
            if d < st or d > en then fs[#fs + 1] = s4[d + 1]
            else acc = acc * s4[d + 1]; if d == en then fs[#fs + 1] = acc end end
        end
        add(string.format("flatten %s (%d, %d)", shape_str(s4), st, en), x4:flatten(st, en - 4),
            { x = x4t }, { shape = fs, data = x4r.data }, 0, 0)
    end

    -- expand: NumPy's broadcast to a shape (as a view read by matmul above; here copied)
    do
        local shape = rshape(3, 1, 4)
        for d = 1, 3 do if math.random() < 0.5 then shape[d] = 1 end end
        local x, xt, xr = input("x", shape)
        local to = { math.random(1, 3) }
        for d = 1, 3 do to[d + 1] = shape[d] == 1 and math.random(1, 4) or shape[d] end
        local want = build(to, "float32", function(cc)
            local q = {}
            for d = 1, 3 do q[d] = shape[d] == 1 and 0 or cc[d + 1] end
            return at(xr, q)
        end)
        local ask = copy(to)
        if shape[3] ~= 1 then ask[4] = -1 end
        add("expand " .. shape_str(shape) .. " to " .. shape_str(to), x:expand(ask), { x = xt }, want, 0, 0)
        add("expand then add", x:expand(to) + 1, { x = xt }, c.R.add(want, { shape = { 1 }, data = { 1 } }))
    end

    -- ---- copies ----------------------------------------------------------------------

    for rank = 1, 6 do
        local shape = rshape(rank, 1, rank > 4 and 3 or 5)
        local axis = math.random(0, rank - 1)
        local x, xt, xr = input("x", shape)
        add("flip " .. shape_str(shape) .. " axis " .. axis, x:flip(axis), { x = xt },
            build(shape, "float32", function(cc)
                local q = copy(cc)
                q[axis + 1] = shape[axis + 1] - 1 - cc[axis + 1]
                return at(xr, q)
            end), 0, 0)

        -- concat of three (a chain), the second a transposed view where rank >= 2
        local sizes = { math.random(1, 3), math.random(1, 3), math.random(1, 3) }
        local nodes, feeds, refs = {}, {}, {}
        for i = 1, 3 do
            local s = copy(shape)
            s[axis + 1] = sizes[i]
            local nm = "c" .. i
            nodes[i], feeds[nm], refs[i] = input(nm, s)
        end
        local oshape = copy(shape)
        oshape[axis + 1] = sizes[1] + sizes[2] + sizes[3]
        local want = build(oshape, "float32", function(cc)
            local q, j = copy(cc), cc[axis + 1]
            for i = 1, 3 do
                if j < sizes[i] then q[axis + 1] = j; return at(refs[i], q) end
                j = j - sizes[i]
            end
        end)
        add("concat of 3 " .. shape_str(oshape) .. " axis " .. axis, mk.concat(nodes, axis - rank),
            feeds, want, 0, 0)

        -- pad: constant, reflect, edge
        local dim = shape[axis + 1]
        for _, mode in ipairs({ "constant", "reflect", "edge" }) do
            local lim = mode == "reflect" and dim - 1 or 3
            local before, after = math.random(0, lim), math.random(0, lim)
            local value = math.random(-9, 9) + 0.5
            local ps = copy(shape)
            ps[axis + 1] = dim + before + after
            local want_p = build(ps, "float32", function(cc)
                local q, j = copy(cc), cc[axis + 1] - before
                if j < 0 or j >= dim then
                    if mode == "constant" then return value end
                    if mode == "edge" then j = j < 0 and 0 or dim - 1
                    else j = j < 0 and -j or 2 * (dim - 1) - j end
                end
                q[axis + 1] = j
                return at(xr, q)
            end)
            local node = x:pad(axis, before, after, mode == "constant" and value or mode)
            add(string.format("pad %s %s axis %d (%d, %d)", mode, shape_str(shape), axis, before, after),
                node, { x = xt }, want_p, 0, 0)
        end

        -- tile (reps longer than x's rank add leading dims)
        local nreps = math.random(1, 5)
        local reps = {}
        for i = 1, nreps do reps[i] = math.random(1, rank > 3 and 2 or 3) end
        local r = math.max(rank, nreps)
        local ts = {}
        for d = 1, r do
            local xd = d - (r - rank) >= 1 and shape[d - (r - rank)] or 1
            local rp = d - (r - nreps) >= 1 and reps[d - (r - nreps)] or 1
            ts[d] = xd * rp
        end
        add("tile " .. shape_str(shape) .. " by " .. shape_str(reps), x:tile(reps), { x = xt },
            build(ts, "float32", function(cc)
                local q = {}
                for d = 1, rank do q[d] = cc[d + (r - rank)] % shape[d] end
                return at(xr, q)
            end), 0, 0)

        -- repeat_interleave
        local rep = math.random(1, 3)
        local rs = copy(shape)
        rs[axis + 1] = dim * rep
        add("repeat_interleave " .. shape_str(shape) .. " x" .. rep .. " axis " .. axis,
            x:repeat_interleave(rep, axis), { x = xt }, build(rs, "float32", function(cc)
                local q = copy(cc)
                q[axis + 1] = idiv(cc[axis + 1], rep)
                return at(xr, q)
            end), 0, 0)

        -- cumsum, float32 (summed in order in float32 by both devices) and int64
        local want_c = build(shape, "float32", function(cc)
            local q, s = copy(cc), 0
            for j = 0, cc[axis + 1] do q[axis + 1] = j; s = s + at(xr, q) end
            return s
        end)
        add("cumsum float32 " .. shape_str(shape) .. " axis " .. axis, x:cumsum(axis), { x = xt },
            want_c, 1e-5, 1e-5)
        local xi, xit, xir = int_input("x", shape, -1000, 1000)
        add("cumsum int64 " .. shape_str(shape) .. " axis " .. axis, xi:cumsum(axis), { x = xit },
            build(shape, "int64", function(cc)
                local q, s = copy(cc), 0
                for j = 0, cc[axis + 1] do q[axis + 1] = j; s = s + at(xir, q) end
                return s
            end), 0, 0)
        -- int64 moves as bytes too
        add("flip int64 " .. shape_str(shape), xi:flip(axis):concat(xi, axis), { x = xit },
            build((function() local s = copy(shape); s[axis + 1] = 2 * dim; return s end)(), "int64",
                function(cc)
                    local q = copy(cc)
                    if cc[axis + 1] < dim then q[axis + 1] = dim - 1 - cc[axis + 1]
                    else q[axis + 1] = cc[axis + 1] - dim end
                    return at(xir, q)
                end), 0, 0)

        -- gather (GatherElements): index of x's rank, dims no larger but on the axis
        local gs = {}
        for d = 1, rank do gs[d] = d == axis + 1 and math.random(1, 5) or math.random(1, shape[d]) end
        local ids, idt, idr = int_input("ids", gs, -dim, dim - 1)
        add("gather " .. shape_str(shape) .. " by " .. shape_str(gs) .. " axis " .. axis,
            x:gather(ids, axis), { x = xt, ids = idt }, build(gs, "float32", function(cc)
                local q, id = copy(cc), at(idr, cc)
                q[axis + 1] = id < 0 and id + dim or id
                return at(xr, q)
            end), 0, 0)

        -- index_select (ONNX Gather): an index of rank 1, or 2 where the result fits
        local ir = rank < 6 and math.random(1, 2) or 1
        local is = {}
        for d = 1, ir do is[d] = math.random(1, 4) end
        local sel, selt, selr = int_input("sel", is, -dim, dim - 1)
        local os = {}
        for d = 1, rank do
            if d == axis + 1 then for j = 1, ir do os[#os + 1] = is[j] end
            else os[#os + 1] = shape[d] end
        end
        add("index_select " .. shape_str(shape) .. " by " .. shape_str(is) .. " axis " .. axis,
            x:index_select(sel, axis), { x = xt, sel = selt }, build(os, "float32", function(cc)
                local ic = {}
                for j = 1, ir do ic[j] = cc[axis + j] end
                local id = at(selr, ic)
                local q = {}
                for d = 1, rank do
                    if d <= axis then q[d] = cc[d]
                    elseif d == axis + 1 then q[d] = id < 0 and id + dim or id
                    else q[d] = cc[d - 1 + ir] end
                end
                return at(xr, q)
            end), 0, 0)
    end

    -- stack and split (Lua compositions of unsqueeze/concat and slices)
    do
        local shape = rshape(2, 1, 4)
        local a, at_, ar = input("a", shape)
        local b, bt, br = input("b", shape)
        local axis = math.random(0, 2)
        local ss = copy(shape)
        table.insert(ss, axis + 1, 2)
        add("stack " .. shape_str(shape) .. " axis " .. axis, mk.stack({ a, b }, axis),
            { a = at_, b = bt }, build(ss, "float32", function(cc)
                local q = copy(cc)
                local which = table.remove(q, axis + 1)
                return at(which == 0 and ar or br, q)
            end), 0, 0)
        local s = { math.random(1, 3), 6, math.random(1, 3) }
        local x, xt, xr = input("x", s)
        local parts = x:split({ 1, 3, 2 }, 1)
        add("split [1, 3, 2] of " .. shape_str(s) .. ", the middle part", parts[2] * 2, { x = xt },
            build({ s[1], 3, s[3] }, "float32", function(cc)
                return 2 * at(xr, { cc[1], cc[2] + 1, cc[3] })
            end), 0, 0)
    end
end
