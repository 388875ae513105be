--[[
bench_cudnn.lua — what the cuDNN fuser buys: compile time of N-layer MLPs
(N = 1 and 32: identical layers compile one plan, the rest are cache hits) and
evaluation time with and without cuDNN for an MLP and the llama2-7B
feed-forward block (x [T, 4096], hidden 11008, T = 1 and 64).

    lua5.4 scripts/bench_cudnn.lua            (from the repository root, after make)

Prints one line per model: compile ms and µs per evaluation, plain CUDA
kernels + cuBLAS vs cuDNN groups, with the groups fused. The Lua module keeps
one context, so its plan cache lives across these compiles: every model below
has a shape of its own so that each measures a cold cache for its first layer.
Weights are a random 4096-float block repeated (values do not change timing).
]]
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
package.cpath = (os.getenv("MK_BUILD") or "build") .. "/?.so;" .. package.cpath
local mk = require "moonkaas"

local ok, why = mk.cuda_available()
if not ok then
    print("bench_cudnn: no CUDA device: " .. tostring(why))
    return
end

-- Wall-clock seconds (date through a pipe: only called around loops).
local function clock()
    local p = assert(io.popen("date +%s.%N"))
    local s = p:read("l")
    p:close()
    return tonumber(s)
end

math.randomseed(os.time())
local block = {}
for i = 1, 4096 do block[i] = string.pack("<f", (math.random() * 2 - 1) * 0.02) end
block = table.concat(block)

local function weights(shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    local reps = n // 4096
    local bytes = block:rep(reps) .. block:sub(1, 4 * (n - reps * 4096))
    return mk.from_bytes(bytes, "float32", shape)
end

-- Microseconds per evaluation over at least half a second.
local function per_eval_us(model, feeds)
    model:run(feeds)
    local runs, t0 = 0, clock()
    local t
    repeat
        for _ = 1, 20 do model:run(feeds) end
        runs = runs + 20
        t = clock()
    until t - t0 >= 0.5
    return (t - t0) / runs * 1e6
end

local function bench(name, y, feeds)
    local plain <close> = mk.compile(y, { device = "cuda" })
    local fused <close> = mk.compile(y, { device = "cuda", cudnn = true })
    local ps, fs = plain:stats(), fused:stats()
    print(string.format("%-36s compile %8.1f ms plain %8.1f ms cudnn (%d fused%s) | evaluate %8.1f us plain %8.1f us cudnn",
        name, ps.compile_ms, fs.compile_ms, fs.fused,
        fs.cudnn_cache_hits and string.format(", %d cache hits", fs.cudnn_cache_hits) or "",
        per_eval_us(plain, feeds), per_eval_us(fused, feeds)))
end

local function mlp(layers, m, d)
    local x = mk.input("x", "float32", { m, d })
    local y = x
    for l = 1, layers do
        y = (y:matmul(mk.constant(weights({ d, d }), "w" .. l)) + mk.constant(weights({ 1, d }), "b" .. l)):relu()
    end
    return y, { x = weights({ m, d }) }
end

local function ffn(tokens, dim, hidden)
    local x = mk.input("x", "float32", { tokens, dim })
    local w1 = mk.constant(weights({ dim, hidden }), "w1")
    local w3 = mk.constant(weights({ dim, hidden }), "w3")
    local w2 = mk.constant(weights({ hidden, dim }), "w2")
    local y = (x:matmul(w1):silu() * x:matmul(w3)):matmul(w2) + x
    return y, { x = weights({ tokens, dim }) }
end

print(type(mk.build_info) == "string" and mk.build_info or "moonkaas")
bench("MLP 1 x [64, 1024]", mlp(1, 64, 1024))
bench("MLP 32 x [48, 1024]", mlp(32, 48, 1024))
bench("llama2-7B FFN, 1 token", ffn(1, 4096, 11008))
bench("llama2-7B FFN, 64 tokens", ffn(64, 4096, 11008))
