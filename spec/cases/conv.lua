-- Convolution and pooling cases (Conv1d/Conv2d/ConvTranspose2d, MaxPool2d,
-- AvgPool2d, AdaptiveAvgPool2d, UpsampleNearest2d) on random small shapes,
-- strides, paddings, dilations and groups, against double-precision loops
-- written from PyTorch's definitions (NCHW; a 1-D convolution is H = 1).
local floor, ceil, random = math.floor, math.ceil, math.random
local idiv = require("moonkaas.compat").idiv

-- element (b, c, y, x) of a reference [N, C, H, W] (0-based indices)
local function at(r, b, c, y, x)
    local s = r.shape
    return r.data[((b * s[2] + c) * s[3] + y) * s[4] + x + 1]
end

local function as4(r) -- a [N, C, L] reference as [N, C, 1, L]
    if #r.shape == 4 then return r end
    return { shape = { r.shape[1], r.shape[2], 1, r.shape[3] }, data = r.data }
end

-- out [N, O, OH, OW] (o, oy, ox) = bias[o] + sum over c of its group, ki, kj of
-- x [c, oy sh - ph + ki dh, ox sw - pw + kj dw] w [o, c - group start, ki, kj]
local function conv_ref(x, w, bias, s, p, d, g)
    local N, C, H, W = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    local O, cg, KH, KW = w.shape[1], w.shape[2], w.shape[3], w.shape[4]
    local og = idiv(O, g)
    local OH = floor((H + 2 * p[1] - d[1] * (KH - 1) - 1) / s[1]) + 1
    local OW = floor((W + 2 * p[2] - d[2] * (KW - 1) - 1) / s[2]) + 1
    local out = { shape = { N, O, OH, OW }, data = {} }
    for b = 0, N - 1 do
        for o = 0, O - 1 do
            local c0 = (idiv(o, og)) * cg
            for oy = 0, OH - 1 do
                for ox = 0, OW - 1 do
                    local acc = bias and bias.data[o + 1] or 0
                    for c = 0, cg - 1 do
                        for ki = 0, KH - 1 do
                            local iy = oy * s[1] - p[1] + ki * d[1]
                            for kj = 0, KW - 1 do
                                local ix = ox * s[2] - p[2] + kj * d[2]
                                if iy >= 0 and iy < H and ix >= 0 and ix < W then
                                    acc = acc + at(x, b, c0 + c, iy, ix) * at(w, o, c, ki, kj)
                                end
                            end
                        end
                    end
                    out.data[#out.data + 1] = acc
                end
            end
        end
    end
    return out
end

-- the transposed convolution by its definition: each x [b, c, iy, ix] scatters
-- x * w [c, o - group start, ki, kj] to out [b, o, iy sh - ph + ki dh, ix sw - pw + kj dw]
local function conv_transpose_ref(x, w, s, p, op, d, g)
    local N, C, H, W = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    local og, KH, KW = w.shape[2], w.shape[3], w.shape[4]
    local cg, O = idiv(C, g), w.shape[2] * g
    local OH = (H - 1) * s[1] - 2 * p[1] + d[1] * (KH - 1) + op[1] + 1
    local OW = (W - 1) * s[2] - 2 * p[2] + d[2] * (KW - 1) + op[2] + 1
    local out = { shape = { N, O, OH, OW }, data = {} }
    for i = 1, N * O * OH * OW do out.data[i] = 0 end
    for b = 0, N - 1 do
        for c = 0, C - 1 do
            local o0 = (idiv(c, cg)) * og
            for iy = 0, H - 1 do
                for ix = 0, W - 1 do
                    local v = at(x, b, c, iy, ix)
                    for o = 0, og - 1 do
                        for ki = 0, KH - 1 do
                            for kj = 0, KW - 1 do
                                local oy = iy * s[1] - p[1] + ki * d[1]
                                local ox = ix * s[2] - p[2] + kj * d[2]
                                if oy >= 0 and oy < OH and ox >= 0 and ox < OW then
                                    local k = ((b * O + o0 + o) * OH + oy) * OW + ox + 1
                                    out.data[k] = out.data[k] + v * at(w, c, o, ki, kj)
                                end
                            end
                        end
                    end
                end
            end
        end
    end
    return out
end

-- pooling over [N, C, H, W] windows: fn(values, count with padding) per cell
local function pool_ref(x, k, s, p, d, fn)
    local N, C, H, W = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    local OH = floor((H + 2 * p[1] - d[1] * (k[1] - 1) - 1) / s[1]) + 1
    local OW = floor((W + 2 * p[2] - d[2] * (k[2] - 1) - 1) / s[2]) + 1
    local out = { shape = { N, C, OH, OW }, data = {} }
    for b = 0, N - 1 do
        for c = 0, C - 1 do
            for oy = 0, OH - 1 do
                for ox = 0, OW - 1 do
                    local vals = {}
                    for ki = 0, k[1] - 1 do
                        for kj = 0, k[2] - 1 do
                            local iy, ix = oy * s[1] - p[1] + ki * d[1], ox * s[2] - p[2] + kj * d[2]
                            if iy >= 0 and iy < H and ix >= 0 and ix < W then
                                vals[#vals + 1] = at(x, b, c, iy, ix)
                            end
                        end
                    end
                    -- PyTorch's divisor with padding counted: the window clipped to
                    -- the padded input
                    local y0, x0 = oy * s[1] - p[1], ox * s[2] - p[2]
                    local y1 = math.min(y0 + k[1], H + p[1])
                    local x1 = math.min(x0 + k[2], W + p[2])
                    out.data[#out.data + 1] = fn(vals, (y1 - y0) * (x1 - x0))
                end
            end
        end
    end
    return out
end

local function max_of(vals) -- a NaN in the window wins (PyTorch's max)
    local m = -math.huge
    for _, v in ipairs(vals) do
        if v ~= v then return v end
        if v > m then m = v end
    end
    return m
end

local function mean_of(vals, count)
    local t = 0
    for _, v in ipairs(vals) do t = t + v end
    return t / count
end

local function adaptive_ref(x, oh, ow)
    local N, C, H, W = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    local out = { shape = { N, C, oh, ow }, data = {} }
    for b = 0, N - 1 do
        for c = 0, C - 1 do
            for i = 0, oh - 1 do
                for j = 0, ow - 1 do
                    local y0, y1 = floor(i * H / oh), ceil((i + 1) * H / oh)
                    local x0, x1 = floor(j * W / ow), ceil((j + 1) * W / ow)
                    local t = 0
                    for y = y0, y1 - 1 do
                        for xx = x0, x1 - 1 do t = t + at(x, b, c, y, xx) end
                    end
                    out.data[#out.data + 1] = t / ((y1 - y0) * (x1 - x0))
                end
            end
        end
    end
    return out
end

local function nearest_ref(x, oh, ow)
    local N, C, H, W = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    local out = { shape = { N, C, oh, ow }, data = {} }
    for b = 0, N - 1 do
        for c = 0, C - 1 do
            for i = 0, oh - 1 do
                for j = 0, ow - 1 do
                    out.data[#out.data + 1] = at(x, b, c, idiv(i * H, oh), idiv(j * W, ow))
                end
            end
        end
    end
    return out
end

local function relu_ref(r)
    local out = { shape = r.shape, data = {} }
    for i, v in ipairs(r.data) do out.data[i] = v > 0 and v or 0 end
    return out
end

-- inference batch norm over axis 1 of a reference: (v - mean) / sqrt(var + eps) * w + b
local function bn_ref(r, mean, var, w, b, eps)
    local out = { shape = r.shape, data = {} }
    local C, inner = r.shape[2], 1
    for i = 3, #r.shape do inner = inner * r.shape[i] end
    for i, v in ipairs(r.data) do
        local ch = idiv(i - 1, inner) % C + 1
        out.data[i] = (v - mean.data[ch]) / math.sqrt(var.data[ch] + eps) * w.data[ch] + b.data[ch]
    end
    return out
end

local function sum_ref(a, b)
    local out = { shape = a.shape, data = {} }
    for i, v in ipairs(a.data) do out.data[i] = v + b.data[i] end
    return out
end

-- an extent for which a window k (dilation d, stride s, padding p) fits
local function extent(k, s, p, d)
    return math.max(1, d * (k - 1) + 1 - 2 * p + random(0, 2 * s + 3))
end

local function str(t) return "{" .. table.concat(t, ", ") .. "}" end

return function(c)
    local mk, add, input = c.mk, c.add, c.input

    -- conv2d: random groups, windows, strides, paddings, dilations; a bias and a
    -- relu on some; one 1x1 of stride 1 (the product reads x as it is)
    for case = 1, 8 do
        local g = random(1, 3)
        local C, O = g * random(1, 3), g * random(1, 3)
        local k = case == 1 and { 1, 1 } or { random(1, 3), random(1, 3) }
        local s = case == 1 and { 1, 1 } or { random(1, 3), random(1, 2) }
        local p = case == 1 and { 0, 0 } or { random(0, 2), random(0, 1) }
        local d = case == 1 and { 1, 1 } or { random(1, 2), random(1, 2) }
        local shape = { random(1, 2), C, extent(k[1], s[1], p[1], d[1]),
            extent(k[2], s[2], p[2], d[2]) }
        local x, xt, xr = input("x", shape)
        local wt, wr = c.H.rand({ O, idiv(C, g), k[1], k[2] })
        local bt, br
        if case % 2 == 0 then bt, br = c.H.rand({ O }) end
        local y = x:conv2d(wt, { stride = s, padding = p, dilation = d, groups = g, bias = bt })
        local want = conv_ref(xr, wr, br, s, p, d, g)
        if case % 3 == 0 then
            y, want = y:relu(), relu_ref(want)
        end
        add(string.format("Conv2dNode x %s k %s stride %s pad %s dil %s groups %d%s",
                c.H.shape_str(shape), str(k), str(s), str(p), str(d), g, bt and " bias" or ""),
            y, { x = xt }, want, 1e-4, 1e-4)
    end

    -- conv2d with the epilogue a convolution group takes (group_conv.c): a bias,
    -- a batch norm of constants (folded into the weights), a residual, a relu;
    -- groups and dilations on some. The last case's batch norm reads its mean
    -- at run time: it stays its own node, the rest still groups.
    for case = 1, 6 do
        local g = case % 2 == 0 and 2 or 1
        local C, O = g * random(1, 3), g * random(1, 3)
        local k = { random(1, 3), random(1, 3) }
        local s, p = { random(1, 2), random(1, 2) }, { random(0, 1), random(0, 1) }
        local d = case % 3 == 0 and { 2, random(1, 2) } or { 1, 1 }
        local shape = { random(1, 2), C, extent(k[1], s[1], p[1], d[1]),
            extent(k[2], s[2], p[2], d[2]) }
        local x, xt, xr = input("x", shape)
        local wt, wr = c.H.rand({ O, idiv(C, g), k[1], k[2] })
        local bt, br
        if case ~= 2 then bt, br = c.H.rand({ O }) end
        local y = x:conv2d(wt, { stride = s, padding = p, dilation = d, groups = g, bias = bt })
        local want = conv_ref(xr, wr, br, s, p, d, g)
        local mt, mr = c.H.rand({ O })
        local vt, vr = c.H.rand({ O }, 0.5, 2)
        local gt, gr = c.H.rand({ O })
        local btt, btr = c.H.rand({ O })
        local eps = 1e-3
        local feeds = { x = xt }
        local mean = mt
        if case == 6 then
            local mn
            mn, mt, mr = input("mean", { O })
            mean, feeds.mean = mn, mt
        end
        y = y:batch_norm(mean, vt, { weight = gt, bias = btt, eps = eps })
        want = bn_ref(want, mr, vr, gr, btr, eps)
        local res = case >= 3 and case ~= 4
        if res then
            local r, rt, rr = input("r", want.shape)
            y, want, feeds.r = y + r, sum_ref(want, rr), rt
        end
        y, want = y:relu(), relu_ref(want)
        add(string.format("Conv2dNode group x %s k %s stride %s pad %s dil %s groups %d%s, "
                .. "batch norm%s%s, relu", c.H.shape_str(shape), str(k), str(s), str(p), str(d),
                g, bt and ", bias" or "", case == 6 and " (mean an input)" or "",
                res and ", residual" or ""),
            y, feeds, want, 1e-4, 1e-4)
    end

    -- 3x3 windows of stride 1 (the CPU's Winograd path where it is chosen:
    -- spec/conv_spec.lua forces it): odd extents wider than two vectors of
    -- eight tiles, channels not multiples of 8, batch 2, paddings 0 to 2;
    -- a bias, a batch norm, a residual and a relu on some; case 5's weights
    -- an input (transformed at each run); case 6 one vector of tiles (a
    -- result of 1-2 rows, at most 16 columns)
    for case = 1, 6 do
        local C, O = random(5, 13), random(5, 11)
        local p = { random(0, 2), random(0, 2) }
        local shape = { 2, C, 2 * random(2, 6) + 1, 2 * random(17, 22) + 1 }
        if case == 6 then shape, p = { 1, C, random(1, 2), random(3, 16) }, { 1, 1 } end
        local x, xt, xr = input("x", shape)
        local feeds = { x = xt }
        local w, wr = c.H.rand({ O, C, 3, 3 })
        if case == 5 then
            w, feeds.w, wr = input("w", { O, C, 3, 3 })
        end
        local bt, br
        if case >= 2 then bt, br = c.H.rand({ O }) end
        local y = x:conv2d(w, { padding = p, bias = bt })
        local want = conv_ref(xr, wr, br, { 1, 1 }, p, { 1, 1 }, 1)
        if case == 3 then
            local mt, mr = c.H.rand({ O })
            local vt, vr = c.H.rand({ O }, 0.5, 2)
            local gt, gr = c.H.rand({ O })
            local btt, btr = c.H.rand({ O })
            y = y:batch_norm(mt, vt, { weight = gt, bias = btt, eps = 1e-3 })
            want = bn_ref(want, mr, vr, gr, btr, 1e-3)
        end
        if case == 3 or case == 4 then
            local r, rt, rr = input("r", want.shape)
            y, want, feeds.r = y + r, sum_ref(want, rr), rt
        end
        if case >= 2 then y, want = y:relu(), relu_ref(want) end
        add(string.format("Conv2dNode 3x3 stride 1 x %s -> %d pad %s%s%s%s%s",
                c.H.shape_str(shape), O, str(p), bt and " bias" or "",
                case == 3 and ", batch norm" or "", (case == 3 or case == 4) and ", residual" or "",
                case >= 2 and ", relu" or ""),
            y, feeds, want, 1e-4, 1e-4)
    end

    -- consecutive convolutions (core/cpu/conv_group.c hands a result on in
    -- oneDNN's blocked layout where every reader is a convolution laid out
    -- alike, or a max pool whose readers are, and the channels fill its
    -- blocks): a stem conv -> bn -> relu, a 3x3 max pool on all but case 3
    -- (read as the next convs' x, and on case 2 as a residual), a 1x1 conv's
    -- result as the next group's residual, a group read as a convolution's
    -- x and its residual at once, then a max pool (a reader that needs NCHW)
    -- or that last group as the output. Channels a multiple of 8 but on case 4.
    for case = 1, 4 do
        local M = case == 4 and random(3, 13) or 8 * random(1, 3)
        local st = case == 2 and 1 or random(1, 2)
        local shape = { random(1, 2), random(2, 9), random(6, 12), random(6, 12) }
        local x, xt, xr = input("x", shape)
        local function conv(h, hr, k, s, bias)
            local wt, wr = c.H.rand({ M, hr.shape[2], k, k })
            local bt, br
            if bias then bt, br = c.H.rand({ M }) end
            local p = { idiv(k - 1, 2), idiv(k - 1, 2) }
            return h:conv2d(wt, { stride = { s, s }, padding = p, bias = bt }),
                conv_ref(hr, wr, br, { s, s }, p, { 1, 1 }, 1)
        end
        local function bn(h, hr)
            local mt, mr = c.H.rand({ M })
            local vt, vr = c.H.rand({ M }, 0.5, 2)
            local gt, gr = c.H.rand({ M })
            local bt, br = c.H.rand({ M })
            return h:batch_norm(mt, vt, { weight = gt, bias = bt, eps = 1e-3 }),
                bn_ref(hr, mr, vr, gr, br, 1e-3)
        end
        local h, hr = bn(conv(x, xr, 3, 1, true))
        h, hr = h:relu(), relu_ref(hr)
        if case ~= 3 then
            h, hr = h:max_pool2d({ 3, 3 }, { stride = { 2, 2 }, padding = { 1, 1 } }),
                pool_ref(hr, { 3, 3 }, { 2, 2 }, { 1, 1 }, { 1, 1 }, max_of)
        end
        local a, ar = bn(conv(h, hr, 3, st, true))
        a, ar = a:relu(), relu_ref(ar)
        local d, dr = h, hr
        if case ~= 2 then d, dr = conv(h, hr, 1, st, false) end
        local b, br = bn(conv(a, ar, 3, 1, false))
        b, br = (b + d):relu(), relu_ref(sum_ref(br, dr))
        local e, er = conv(b, br, 3, 1, true)
        local y, want = (e + b):relu(), relu_ref(sum_ref(er, br))
        if case % 2 == 1 then
            y, want = y:max_pool2d({ 2, 2 }, { stride = { 2, 2 } }),
                pool_ref(want, { 2, 2 }, { 2, 2 }, { 0, 0 }, { 1, 1 }, max_of)
        end
        -- float32's rounding at each layer is carried through the next ones and
        -- the residual sums, where large values may cancel: the absolute bound
        -- scales with the largest value in the chain
        local big = 1
        for _, t in ipairs({ hr, ar, dr, br, er }) do
            for _, v in ipairs(t.data) do big = math.max(big, math.abs(v)) end
        end
        add(string.format("Conv2dNode chain x %s, %d channels, stride %d%s%s%s",
                c.H.shape_str(shape), M, st, case ~= 3 and ", max pool after the stem" or "",
                case == 2 and " read as a residual" or "", case % 2 == 1 and ", max pool" or ""),
            y, { x = xt }, want, 1e-4 * big, 1e-4)
    end

    for _ = 1, 4 do
        local g = random(1, 2)
        local C, O = g * random(1, 3), g * random(1, 3)
        local k, s, p, d = random(1, 4), random(1, 3), random(0, 2), random(1, 2)
        local shape = { random(1, 2), C, extent(k, s, p, d) }
        local x, xt, xr = input("x", shape)
        local wt, wr = c.H.rand({ O, idiv(C, g), k })
        local bt, br = c.H.rand({ O })
        local y = x:conv1d(wt, { stride = s, padding = p, dilation = d, groups = g, bias = bt })
        local want = conv_ref(as4(xr), as4(wr), br, { 1, s }, { 0, p }, { 1, d }, g)
        want.shape = { want.shape[1], want.shape[2], want.shape[4] }
        if g == 2 then y, want = y:relu(), relu_ref(want) end
        add(string.format("Conv1dNode x %s k %d stride %d pad %d dil %d groups %d",
            c.H.shape_str(shape), k, s, p, d, g), y, { x = xt }, want, 1e-4, 1e-4)
    end

    for _ = 1, 5 do
        local g = random(1, 2)
        local C, O = g * random(1, 3), g * random(1, 3)
        local k = { random(1, 3), random(1, 3) }
        local s, d = { random(1, 3), random(1, 2) }, { random(1, 2), random(1, 2) }
        local p = { random(0, 1), random(0, 1) }
        local op = { random(0, math.max(s[1], d[1]) - 1), random(0, math.max(s[2], d[2]) - 1) }
        local shape = { random(1, 2), C, random(2, 4), random(2, 4) }
        for i = 1, 2 do -- a padding that leaves an output
            if (shape[i + 2] - 1) * s[i] - 2 * p[i] + d[i] * (k[i] - 1) + op[i] < 0 then p[i] = 0 end
        end
        local x, xt, xr = input("x", shape)
        local wt, wr = c.H.rand({ C, idiv(O, g), k[1], k[2] })
        local bt, br = c.H.rand({ O })
        local y = x:conv_transpose2d(wt, { stride = s, padding = p, output_padding = op,
            dilation = d, groups = g, bias = bt })
        local want = conv_transpose_ref(xr, wr, s, p, op, d, g)
        for i = 1, #want.data do
            local o = idiv(i - 1, want.shape[3] * want.shape[4]) % want.shape[2]
            want.data[i] = want.data[i] + br.data[o + 1]
        end
        add(string.format("ConvTranspose2dNode x %s k %s stride %s pad %s out pad %s dil %s "
                .. "groups %d", c.H.shape_str(shape), str(k), str(s), str(p), str(op), str(d), g),
            y, { x = xt }, want, 1e-4, 1e-4)
    end

    for _ = 1, 4 do
        local k = { random(1, 3), random(1, 3) }
        local s, d = { random(1, 3), random(1, 2) }, { random(1, 2), random(1, 2) }
        -- a padding only without dilation: then every window holds an element of x
        local p = { d[1] == 1 and random(0, idiv(k[1], 2)) or 0,
            d[2] == 1 and random(0, idiv(k[2], 2)) or 0 }
        local shape = { random(1, 2), random(1, 3), extent(k[1], s[1], p[1], d[1]),
            extent(k[2], s[2], p[2], d[2]) }
        local x, xt, xr = input("x", shape)
        add(string.format("MaxPool2dNode x %s k %s stride %s pad %s dil %s",
                c.H.shape_str(shape), str(k), str(s), str(p), str(d)),
            x:max_pool2d(k, { stride = s, padding = p, dilation = d }), { x = xt },
            pool_ref(xr, k, s, p, d, max_of), 0, 0)
        local pa = { random(0, idiv(k[1], 2)), random(0, idiv(k[2], 2)) }
        local shape2 = { random(1, 2), random(1, 3), extent(k[1], s[1], pa[1], 1),
            extent(k[2], s[2], pa[2], 1) }
        local x2, xt2, xr2 = input("x", shape2)
        add(string.format("AvgPool2dNode x %s k %s stride %s pad %s", c.H.shape_str(shape2),
                str(k), str(s), str(pa)),
            x2:avg_pool2d(k, { stride = s, padding = pa }), { x = xt2 },
            pool_ref(xr2, k, s, pa, { 1, 1 }, mean_of), 1e-6, 1e-5)
    end

    -- max pooling of rows wide enough for the CPU's eight outputs at a time
    -- (strides 1 and 2; -inf margins for the padding), and a tail; two NaNs
    for _ = 1, 3 do
        local k = { random(1, 3), random(1, 4) }
        local s, d = { random(1, 2), random(1, 2) }, { 1, random(1, 2) }
        local p = { random(0, idiv(k[1], 2)), d[2] == 1 and random(0, idiv(k[2], 2)) or 0 }
        local shape = { 1, random(1, 3), random(3, 7), random(17, 45) }
        local x, xt, xr = input("x", shape)
        for _ = 1, 2 do xr.data[random(1, #xr.data)] = 0 / 0 end
        xt = c.H.tensor(xr)
        add(string.format("MaxPool2dNode wide x %s k %s stride %s pad %s dil %s",
                c.H.shape_str(shape), str(k), str(s), str(p), str(d)),
            x:max_pool2d(k, { stride = s, padding = p, dilation = d }), { x = xt },
            pool_ref(xr, k, s, p, d, max_of))
    end

    -- max pooling with NaNs in x: each window holding one gives NaN; rows
    -- wider than eight (the vector lanes of the CPU's column pass) and not a
    -- multiple of them
    do
        local k, s, p = { 3, 3 }, { 2, 2 }, { 1, 1 }
        local shape = { 1, 2, random(5, 9), random(9, 21) }
        local x, xt, xr = input("x", shape)
        for _ = 1, 3 do xr.data[random(1, #xr.data)] = 0 / 0 end
        xt = c.H.tensor(xr)
        add(string.format("MaxPool2dNode x %s k {3, 3} stride {2, 2} pad {1, 1} with NaNs",
                c.H.shape_str(shape)),
            x:max_pool2d(k, { stride = s, padding = p }), { x = xt },
            pool_ref(xr, k, s, p, { 1, 1 }, max_of), 0, 0)
    end

    for case = 1, 4 do
        local shape = { random(1, 2), random(1, 3), random(1, 7), random(1, 7) }
        local size = case == 1 and { 1, 1 } or { random(1, 8), random(1, 8) }
        local x, xt, xr = input("x", shape)
        add(string.format("AdaptiveAvgPool2dNode x %s to %s", c.H.shape_str(shape), str(size)),
            x:adaptive_avg_pool2d(size), { x = xt }, adaptive_ref(xr, size[1], size[2]), 1e-6,
            1e-5)
    end

    for case = 1, 3 do
        local shape = { random(1, 2), random(1, 3), random(1, 5), random(1, 5) }
        local x, xt, xr = input("x", shape)
        local y, oh, ow
        if case == 1 then
            local f = { random(1, 3), random(1, 3) }
            y, oh, ow = x:upsample_nearest2d({ scale_factor = f }), shape[3] * f[1], shape[4] * f[2]
        else
            oh, ow = random(1, 9), random(1, 9)
            y = x:upsample_nearest2d({ size = { oh, ow } })
        end
        add(string.format("UpsampleNearest2dNode x %s to {%d, %d}", c.H.shape_str(shape), oh, ow),
            y, { x = xt }, nearest_ref(xr, oh, ow), 0, 0)
    end
end
