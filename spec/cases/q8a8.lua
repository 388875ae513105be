-- W8A8 products: x:fake_quantize(g) @ int8 weights in groups of g along
-- their input (q:dequantize(scale), the llama2 -q q8a8 pattern), which a
-- matrix–vector group runs as integer dot products per group (the CPU's
-- core/cpu/q8.c, CUDA's DP4As). Random shapes (a few rows, 1 to 5 groups of
-- 32 or 64, any number of columns: quads short of columns, a group of
-- zeros), two products sharing the grid and meeting in one result, a
-- residual add after; against double loops from the
-- definitions: per group of x, s = max |x| / 127 and each value x / s
-- (float32) rounded half away from zero, clamped to +-127; then
-- y = sum over groups of (sum q_x q_w) * w_scale * s.
local random = math.random

local f32 = require("moonkaas.compat").f32

local function grid(xr, m, k, g) -- x's values on the grid: q [m * k], s [m * k / g]
    local q, s = {}, {}
    for t = 0, m * k / g - 1 do
        local mx = 0.0
        for e = t * g + 1, (t + 1) * g do
            if math.abs(xr.data[e]) > mx then mx = math.abs(xr.data[e]) end
        end
        s[t + 1] = f32(mx / 127)
        for e = t * g + 1, (t + 1) * g do
            local v = s[t + 1] ~= 0 and f32(xr.data[e] / s[t + 1]) or 0
            local r = v >= 0 and math.floor(v + 0.5) or -math.floor(-v + 0.5)
            q[e] = math.max(-127, math.min(127, r))
        end
    end
    return q, s
end

-- y [m, n] = the W8A8 product of x's grid (q, s) with weights wq [n, k], scales ws [n, k / g]
local function w8a8_ref(q, s, wq, ws, m, k, n, g)
    local out = { shape = { m, n }, data = {} }
    for i = 0, m - 1 do
        for j = 0, n - 1 do
            local acc = 0.0
            for gi = 0, k / g - 1 do
                local dot = 0
                for e = gi * g, (gi + 1) * g - 1 do dot = dot + q[i * k + e + 1] * wq:get(j * k + e + 1) end
                acc = acc + dot * ws:get(j * (k / g) + gi + 1) * s[i * (k / g) + gi + 1]
            end
            out.data[#out.data + 1] = acc
        end
    end
    return out
end

return function(c)
    local mk, add = c.mk, c.add
    for case = 1, c.quick and 3 or 8 do
        local g = random(0, 1) == 0 and 32 or 64
        local m, k, n = random(1, 3), g * random(1, 5), random(1, 40)
        local data = {}
        for e = 1, m * k do data[e] = case == 1 and e <= g and 0.0 or 4 * random() - 2 end
        local xt = mk.tensor(data, "float32", { m, k }) -- case 1: a group of zeros (scale 0)
        local x, xr = mk.input("x", "float32", { m, k }), c.H.ref(xt)
        local function weights(name)
            local wq, ws = mk.quantize(c.H.rand({ n, k }, -0.1, 0.1), g)
            local scale = mk.constant(ws, name .. "_scale"):permute({ 1, 0 })
            return mk.constant(wq, name):permute({ 1, 0 }):dequantize(scale), wq, ws
        end
        local w1, q1, s1 = weights("w1")
        local w3, q3, s3 = weights("w3")
        local r, rt, rr = c.input("r", { m, n })
        local xq = x:fake_quantize(g)
        local qx, sx = grid(xr, m, k, g)
        local y1, y3 = w8a8_ref(qx, sx, q1, s1, m, k, n, g), w8a8_ref(qx, sx, q3, s3, m, k, n, g)
        local want = { shape = { m, n }, data = {} } -- siblings meeting in one result, then a residual
        for i = 1, m * n do want.data[i] = y1.data[i] * y3.data[i] + rr.data[i] end
        add(string.format("W8A8 x [%d, %d] on the grid of %d: (x @ w1) * (x @ w3) + r, int8 [%d, %d]",
                m, k, g, k, n),
            xq:matmul(w1) * xq:matmul(w3) + r, { x = xt, r = rt }, want, 1e-5, 1e-4)
    end
end
