--[[
transformer_block.lua — one pre-norm transformer block over a sequence, built
from the op table's nodes and checked against plain Lua.

    h = x + Wo(attention(rms_norm(x)))        causal, H heads
    y = h + W2(silu(W1 n) * W3 n), n = rms_norm(h)

x is [T, D]; the heads are a reshape and a permute ([T, D] -> [H, T, hd]),
the scores a batched product [H, T, hd] @ [H, hd, T], the mask
x:causal_softmax(T) (row t sees keys 0..t). Random weights from a printed seed.

    lua5.4 examples/transformer_block.lua [seed]    (from the repository root, after `make`)
]]

do
    local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
    local build = os.getenv("MK_BUILD")
    if not build or build == "" then build = root .. "/build" end
    package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
    package.cpath = build .. "/?.so;" .. package.cpath
end
local mk = require "moonkaas"

local seed = tonumber(arg[1]) or os.time()
math.randomseed(seed)
print("transformer_block.lua: seed " .. seed)

local T, D, H, F = 6, 16, 4, 32 -- positions, model width, heads, MLP width
local hd = D // H

local function random_matrix(rows, cols, scale)
    local m = {}
    for i = 1, rows do
        m[i] = {}
        for j = 1, cols do m[i][j] = (2 * math.random() - 1) * scale end
    end
    return m
end
local wq, wk, wv, wo = random_matrix(D, D, 0.3), random_matrix(D, D, 0.3), random_matrix(D, D, 0.3),
    random_matrix(D, D, 0.3)
local w1, w3, w2 = random_matrix(D, F, 0.3), random_matrix(D, F, 0.3), random_matrix(F, D, 0.2)
local g1, g2 = random_matrix(1, D, 1)[1], random_matrix(1, D, 1)[1]
local xs = random_matrix(T, D, 1)

-- ---- the block as nodes --------------------------------------------------
local function const(m) return mk.constant(mk.tensor(m)) end
local x = mk.input("x", "float32", { T, D })

local function heads(t) -- [T, D] -> [H, T, hd]
    return t:reshape { T, H, hd }:permute { 1, 0, 2 }
end
local n1 = x:rms_norm(const(g1))
local q, k, v = heads(n1:matmul(const(wq))), heads(n1:matmul(const(wk))), heads(n1:matmul(const(wv)))
local scores = q:matmul(k:transpose(1, 2)) * (1 / math.sqrt(hd)) -- [H, T, T]
local att = scores:causal_softmax(T):matmul(v)                    -- [H, T, hd]
local h = x + att:permute { 1, 0, 2 }:reshape { T, D }:matmul(const(wo))
local n2 = h:rms_norm(const(g2))
local y = h + (n2:matmul(const(w1)):silu() * n2:matmul(const(w3))):matmul(const(w2))

local model = mk.compile(y)
local out = model:run({ x = mk.tensor(xs) })
print(string.format("%d nodes in %d launches", model:stats().nodes, model:stats().launches))

-- ---- the same block in plain Lua (double precision) ----------------------
local function matmul(a, b)
    local r = {}
    for i = 1, #a do
        r[i] = {}
        for j = 1, #b[1] do
            local s = 0
            for kk = 1, #b do s = s + a[i][kk] * b[kk][j] end
            r[i][j] = s
        end
    end
    return r
end
local function rms_norm(a, g)
    local r = {}
    for i = 1, #a do
        local ss = 0
        for j = 1, #a[i] do ss = ss + a[i][j] ^ 2 end
        local inv = 1 / math.sqrt(ss / #a[i] + 1e-5)
        r[i] = {}
        for j = 1, #a[i] do r[i][j] = g[j] * a[i][j] * inv end
    end
    return r
end
local function add(a, b)
    local r = {}
    for i = 1, #a do
        r[i] = {}
        for j = 1, #a[i] do r[i][j] = a[i][j] + b[i][j] end
    end
    return r
end
local rn1 = rms_norm(xs, g1)
local rq, rk, rv = matmul(rn1, wq), matmul(rn1, wk), matmul(rn1, wv)
local ratt = {}
for t = 1, T do ratt[t] = {} end
for hh = 0, H - 1 do
    for t = 1, T do
        local p, total = {}, 0
        for s = 1, t do -- causal: keys 1..t
            local dot = 0
            for j = 1, hd do dot = dot + rq[t][hh * hd + j] * rk[s][hh * hd + j] end
            p[s] = math.exp(dot / math.sqrt(hd))
            total = total + p[s]
        end
        for j = 1, hd do
            local acc = 0
            for s = 1, t do acc = acc + p[s] / total * rv[s][hh * hd + j] end
            ratt[t][hh * hd + j] = acc
        end
    end
end
local rh = add(xs, matmul(ratt, wo))
local rn2 = rms_norm(rh, g2)
local a, b = matmul(rn2, w1), matmul(rn2, w3)
for i = 1, T do
    for j = 1, F do a[i][j] = a[i][j] / (1 + math.exp(-a[i][j])) * b[i][j] end
end
local want = add(rh, matmul(a, w2))

local worst = 0
for i = 1, T do
    for j = 1, D do
        local err = math.abs(out:get(i, j) - want[i][j]) / (1e-4 + 1e-4 * math.abs(want[i][j]))
        worst = math.max(worst, err)
    end
end
model:close()
if worst > 1 then
    print(string.format("transformer_block.lua: FAILED, error %.3g times the tolerance (seed %d)", worst, seed))
    os.exit(1)
end
print("transformer_block.lua: y [" .. T .. ", " .. D .. "] within 1e-4 + 1e-4 |ref| of plain Lua")
