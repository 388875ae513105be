-- Double-precision reference forward passes for spec/nets_spec.lua, written
-- from PyTorch's layer definitions (not from the core): plain Lua loops over
-- flat 1-based arrays in row-major order. A tensor here is {shape = {...},
-- data = {...}}.

local R = {}

local function numel(shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    return n
end
R.numel = numel

function R.new(shape, fill)
    local d = {}
    for i = 1, numel(shape) do d[i] = fill or 0 end
    return { shape = shape, data = d }
end

-- erf to double precision: Taylor series near 0, continued fraction of erfc
-- beyond (A&S 7.1.5 and 7.1.14)
function R.erf(x)
    local ax = math.abs(x)
    if ax < 2.5 then
        local term, sum, k = ax, ax, 0
        repeat
            k = k + 1
            term = -term * ax * ax / k
            local add = term / (2 * k + 1)
            sum = sum + add
        until math.abs(add) < 1e-17 * math.abs(sum)
        local r = 2 / math.sqrt(math.pi) * sum
        return x < 0 and -r or r
    end
    -- erfc(ax) = exp(-ax^2)/sqrt(pi) * 1/(ax + 1/2/(ax + 1/(ax + 3/2/(ax + ...))))
    local f = ax
    for k = 60, 1, -1 do f = ax + (k / 2) / f end
    local r = 1 - math.exp(-ax * ax) / math.sqrt(math.pi) / f
    return x < 0 and -r or r
end

function R.gelu(t)
    local o = R.new(t.shape)
    for i, v in ipairs(t.data) do o.data[i] = 0.5 * v * (1 + R.erf(v / math.sqrt(2))) end
    return o
end

function R.map(t, f)
    local o = R.new(t.shape)
    for i, v in ipairs(t.data) do o.data[i] = f(v) end
    return o
end

function R.relu(t) return R.map(t, function(v) return v > 0 and v or 0 end) end

function R.add(a, b)
    local o = R.new(a.shape)
    for i = 1, #a.data do o.data[i] = a.data[i] + b.data[i] end
    return o
end

-- x [N, C, H, W], w [O, C/g, kh, kw], b [O] or nil
function R.conv2d(x, w, b, s, p, d, g)
    s, p, d, g = s or 1, p or 0, d or 1, g or 1
    local N, C, H, W = table.unpack(x.shape)
    local O, Cg, KH, KW = table.unpack(w.shape)
    local OH = (H + 2 * p - d * (KH - 1) - 1) // s + 1
    local OW = (W + 2 * p - d * (KW - 1) - 1) // s + 1
    local o = R.new({ N, O, OH, OW })
    local xd, wd, od = x.data, w.data, o.data
    local Og = O // g
    for n = 0, N - 1 do
        for oc = 0, O - 1 do
            local grp = oc // Og
            for oy = 0, OH - 1 do
                for ox = 0, OW - 1 do
                    local acc = b and b.data[oc + 1] or 0
                    for ic = 0, Cg - 1 do
                        local c = grp * Cg + ic
                        for ky = 0, KH - 1 do
                            local iy = oy * s - p + ky * d
                            if iy >= 0 and iy < H then
                                for kx = 0, KW - 1 do
                                    local ix = ox * s - p + kx * d
                                    if ix >= 0 and ix < W then
                                        acc = acc + xd[((n * C + c) * H + iy) * W + ix + 1] *
                                            wd[((oc * Cg + ic) * KH + ky) * KW + kx + 1]
                                    end
                                end
                            end
                        end
                    end
                    od[((n * O + oc) * OH + oy) * OW + ox + 1] = acc
                end
            end
        end
    end
    return o
end

-- transposed convolution, groups 1: x [N, C, H, W], w [C, O, kh, kw]; each
-- input pixel scatters its weighted kernel into the output
function R.conv_transpose2d(x, w, b, s, p)
    local N, C, H, W = table.unpack(x.shape)
    local _, O, KH, KW = table.unpack(w.shape)
    local OH, OW = (H - 1) * s - 2 * p + KH, (W - 1) * s - 2 * p + KW
    local o = R.new({ N, O, OH, OW })
    for n = 0, N - 1 do
        for oc = 0, O - 1 do
            for i = 0, OH * OW - 1 do o.data[(n * O + oc) * OH * OW + i + 1] = b and b.data[oc + 1] or 0 end
        end
        for c = 0, C - 1 do
            for iy = 0, H - 1 do
                for ix = 0, W - 1 do
                    local v = x.data[((n * C + c) * H + iy) * W + ix + 1]
                    for oc = 0, O - 1 do
                        for ky = 0, KH - 1 do
                            local oy = iy * s - p + ky
                            if oy >= 0 and oy < OH then
                                for kx = 0, KW - 1 do
                                    local ox = ix * s - p + kx
                                    if ox >= 0 and ox < OW then
                                        local k = ((n * O + oc) * OH + oy) * OW + ox + 1
                                        o.data[k] = o.data[k] + v * w.data[((c * O + oc) * KH + ky) * KW + kx + 1]
                                    end
                                end
                            end
                        end
                    end
                end
            end
        end
    end
    return o
end

-- inference batch norm over axis 1
function R.batch_norm(x, mean, var, w, b, eps)
    local N, C = x.shape[1], x.shape[2]
    local inner = numel(x.shape) // (N * C)
    local o = R.new(x.shape)
    for n = 0, N - 1 do
        for c = 0, C - 1 do
            local scale = w.data[c + 1] / math.sqrt(var.data[c + 1] + eps)
            for i = 1, inner do
                local k = (n * C + c) * inner + i
                o.data[k] = (x.data[k] - mean.data[c + 1]) * scale + b.data[c + 1]
            end
        end
    end
    return o
end

-- max pooling with -inf padding
function R.max_pool2d(x, k, s, p)
    local N, C, H, W = table.unpack(x.shape)
    local OH, OW = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    local o = R.new({ N, C, OH, OW })
    for nc = 0, N * C - 1 do
        for oy = 0, OH - 1 do
            for ox = 0, OW - 1 do
                local m = -math.huge
                for ky = 0, k - 1 do
                    for kx = 0, k - 1 do
                        local iy, ix = oy * s - p + ky, ox * s - p + kx
                        if iy >= 0 and iy < H and ix >= 0 and ix < W then
                            m = math.max(m, x.data[(nc * H + iy) * W + ix + 1])
                        end
                    end
                end
                o.data[(nc * OH + oy) * OW + ox + 1] = m
            end
        end
    end
    return o
end

-- mean over H and W: [N, C, H, W] -> [N, C]
function R.global_avg_pool(x)
    local N, C, H, W = table.unpack(x.shape)
    local o = R.new({ N, C })
    for nc = 0, N * C - 1 do
        local acc = 0
        for i = 1, H * W do acc = acc + x.data[nc * H * W + i] end
        o.data[nc + 1] = acc / (H * W)
    end
    return o
end

-- nearest upsampling by an integer factor
function R.upsample2(x, f)
    local N, C, H, W = table.unpack(x.shape)
    local o = R.new({ N, C, H * f, W * f })
    for nc = 0, N * C - 1 do
        for y = 0, H * f - 1 do
            for xx = 0, W * f - 1 do
                o.data[(nc * H * f + y) * W * f + xx + 1] = x.data[(nc * H + y // f) * W + xx // f + 1]
            end
        end
    end
    return o
end

-- channel concat of [N, Ca, H, W] and [N, Cb, H, W]
function R.concat1(a, b)
    local N, Ca, H, W = table.unpack(a.shape)
    local Cb = b.shape[2]
    local o = R.new({ N, Ca + Cb, H, W })
    local hw, k = H * W, 0
    for n = 0, N - 1 do
        for i = 1, Ca * hw do k = k + 1; o.data[k] = a.data[n * Ca * hw + i] end
        for i = 1, Cb * hw do k = k + 1; o.data[k] = b.data[n * Cb * hw + i] end
    end
    return o
end

-- x [..., in] @ w^T + b, w [out, in]
function R.linear(x, w, b)
    local out, inn = w.shape[1], w.shape[2]
    local rows = numel(x.shape) // inn
    local shape = {}
    for i = 1, #x.shape - 1 do shape[i] = x.shape[i] end
    shape[#shape + 1] = out
    local o = R.new(shape)
    for r = 0, rows - 1 do
        for j = 0, out - 1 do
            local acc = b and b.data[j + 1] or 0
            for i = 1, inn do acc = acc + x.data[r * inn + i] * w.data[j * inn + i] end
            o.data[r * out + j + 1] = acc
        end
    end
    return o
end

-- layer norm over the last axis
function R.layer_norm(x, w, b, eps)
    local D = x.shape[#x.shape]
    local o = R.new(x.shape)
    for r = 0, numel(x.shape) // D - 1 do
        local mean, var = 0, 0
        for i = 1, D do mean = mean + x.data[r * D + i] end
        mean = mean / D
        for i = 1, D do var = var + (x.data[r * D + i] - mean) ^ 2 end
        var = var / D
        local inv = 1 / math.sqrt(var + eps)
        for i = 1, D do
            o.data[r * D + i] = (x.data[r * D + i] - mean) * inv * w.data[i] + b.data[i]
        end
    end
    return o
end

-- causal multi-head self-attention of x [T, D]
function R.causal_attention(x, p, heads)
    local T, D = x.shape[1], x.shape[2]
    local hd = D // heads
    local q, k, v = R.linear(x, p.wq, p.bq), R.linear(x, p.wk, p.bk), R.linear(x, p.wv, p.bv)
    local att = R.new({ T, D })
    for h = 0, heads - 1 do
        for t = 0, T - 1 do
            local sc, m = {}, -math.huge
            for s = 0, t do
                local dot = 0
                for j = 1, hd do dot = dot + q.data[t * D + h * hd + j] * k.data[s * D + h * hd + j] end
                sc[s] = dot / math.sqrt(hd)
                m = math.max(m, sc[s])
            end
            local total = 0
            for s = 0, t do sc[s] = math.exp(sc[s] - m); total = total + sc[s] end
            for j = 1, hd do
                local acc = 0
                for s = 0, t do acc = acc + sc[s] / total * v.data[s * D + h * hd + j] end
                att.data[t * D + h * hd + j] = acc
            end
        end
    end
    return R.linear(att, p.wo, p.bo)
end

local function sig(v) return 1 / (1 + math.exp(-v)) end

-- one GRU step (PyTorch's r, z, n order) of x [B, I], h [B, H]
function R.gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
    local gi, gh = R.linear(x, w_ih, b_ih), R.linear(h, w_hh, b_hh)
    local B, H = h.shape[1], h.shape[2]
    local o = R.new({ B, H })
    for bb = 0, B - 1 do
        for j = 1, H do
            local base = bb * 3 * H
            local r = sig(gi.data[base + j] + gh.data[base + j])
            local z = sig(gi.data[base + H + j] + gh.data[base + H + j])
            local n = math.tanh(gi.data[base + 2 * H + j] + r * gh.data[base + 2 * H + j])
            o.data[bb * H + j] = (1 - z) * n + z * h.data[bb * H + j]
        end
    end
    return o
end

-- one LSTM step (PyTorch's i, f, g, o order): returns h', c'
function R.lstm_cell(x, h, c, w_ih, w_hh, b_ih, b_hh)
    local g = R.add(R.linear(x, w_ih, b_ih), R.linear(h, w_hh, b_hh))
    local B, H = h.shape[1], h.shape[2]
    local h2, c2 = R.new({ B, H }), R.new({ B, H })
    for bb = 0, B - 1 do
        for j = 1, H do
            local base = bb * 4 * H
            local i, f = sig(g.data[base + j]), sig(g.data[base + H + j])
            local gg, o = math.tanh(g.data[base + 2 * H + j]), sig(g.data[base + 3 * H + j])
            local cv = f * c.data[bb * H + j] + i * gg
            c2.data[bb * H + j] = cv
            h2.data[bb * H + j] = o * math.tanh(cv)
        end
    end
    return h2, c2
end

return R
