--[[
gpt2_block.lua — a GPT-2-style stack of transformer blocks with moonkaas.nn:
token and position embeddings, per block

    x = x + attn(layer_norm_1(x))            causal, H heads, biases
    x = x + proj(gelu(fc(layer_norm_2(x))))  GELU's erf form, 4D wide

then a final layer norm and logits through the token embedding (tied), for
T tokens at once. Random weights from a printed seed, named as GPT-2's
state_dict (h.0.ln_1.weight, ...). It checks causality: changing the last
token leaves the logits of the earlier positions bit for bit the same.
spec/nets_spec.lua checks the same stack against double-precision loops.

    lua5.4 examples/gpt2_block.lua [seed]    (from the repository root, after `make`)
]]

do
    local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
    local build = os.getenv("MK_BUILD")
    if not build or build == "" then build = root .. "/build" end
    package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
    package.cpath = build .. "/?.so;" .. package.cpath
end
local mk = require "moonkaas"
local nn = require "moonkaas.nn"

local seed = tonumber(arg[1]) or os.time()
math.randomseed(seed)
print("gpt2_block.lua: seed " .. seed)

local L, D, H, V, CTX, T = 2, 64, 4, 256, 32, 12 -- layers, width, heads, vocab, context, tokens

local function weight(name, shape, scale)
    local n, v = 1, {}
    for _, d in ipairs(shape) do n = n * d end
    for i = 1, n do v[i] = (2 * math.random() - 1) * scale end
    return mk.constant(mk.tensor(v, "float32", shape), (name:gsub("%.", "_")))
end
local function ones_ish(name) return weight(name, { D }, 0.2) + 1 end

local ids = mk.input("ids", "int64", { T })
local wte = weight("wte.weight", { V, D }, 0.5)
local x = nn.embedding(ids, wte) + weight("wpe.weight", { CTX, D }, 0.5):slice(0, T)
local s = math.sqrt(3 / D)
for l = 0, L - 1 do
    local pre = "h." .. l .. "."
    local attn = {}
    for _, k in ipairs { "q", "k", "v", "o" } do
        attn["w" .. k] = weight(pre .. "attn.w" .. k, { D, D }, s)
        attn["b" .. k] = weight(pre .. "attn.b" .. k, { D }, 0.1)
    end
    local n1 = nn.layer_norm(x, ones_ish(pre .. "ln_1.weight"), weight(pre .. "ln_1.bias", { D }, 0.1))
    x = x + nn.multi_head_attention(n1, attn, H, { causal = true })
    local n2 = nn.layer_norm(x, ones_ish(pre .. "ln_2.weight"), weight(pre .. "ln_2.bias", { D }, 0.1))
    local m = nn.gelu(nn.linear(n2, weight(pre .. "mlp.fc.weight", { 4 * D, D }, s), weight(pre .. "mlp.fc.bias", { 4 * D }, 0.1)))
    x = x + nn.linear(m, weight(pre .. "mlp.proj.weight", { D, 4 * D }, s / 2), weight(pre .. "mlp.proj.bias", { D }, 0.1))
end
x = nn.layer_norm(x, ones_ish("ln_f.weight"), weight("ln_f.bias", { D }, 0.1))
local logits = nn.linear(x, wte) -- [T, V], tied to the token embedding

local model = mk.compile(logits)
local st = model:stats()
print(string.format("%d layers of width %d: %d nodes in %d launches", L, D, st.nodes, st.launches))

local prompt = {}
for t = 1, T do prompt[t] = math.random(0, V - 1) end
local a = model:run { ids = mk.tensor(prompt, "int64", { T }) }
local greedy = {}
for t = 1, T do
    local best = 1
    for j = 2, V do if a:get(t, j) > a:get(t, best) then best = j end end
    greedy[t] = best - 1
end
print("prompt:      " .. table.concat(prompt, " "))
print("next (argmax): " .. table.concat(greedy, " "))

prompt[T] = (prompt[T] + 1) % V
local b = model:run { ids = mk.tensor(prompt, "int64", { T }) }
model:close()
for t = 1, T - 1 do
    for j = 1, V do
        if a:get(t, j) ~= b:get(t, j) then
            print(string.format("gpt2_block.lua: FAILED, position %d saw the last token (seed %d)", t, seed))
            os.exit(1)
        end
    end
end
print("gpt2_block.lua: positions 1.." .. (T - 1) .. " unchanged by the last token (causal)")
