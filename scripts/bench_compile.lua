--[[
bench_compile.lua — what the compiler itself costs and how well it plans:
arena size against the live-bytes lower bound for an MLP and a 6-layer
llama-shaped graph (stories15M's shapes), and parse + plan time for a chain of
100,000 nodes. CPU only; nothing is evaluated.

    lua scripts/bench_compile.lua [chain_nodes]
]]
do
    local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
    local build = os.getenv("MK_BUILD")
    if not build or build == "" then build = here .. "/../build" end
    package.path = here .. "/../lua/?.lua;" .. here .. "/../lua/?/init.lua;" .. package.path
    package.cpath = build .. "/?.so;" .. package.cpath
end

local USAGE = "usage: lua scripts/bench_compile.lua [chain_nodes]   (default 100000)"
if arg[1] == "-h" or arg[1] == "--help" then
    print(USAGE)
    os.exit(0)
end
local chain = 100000
if arg[1] then
    chain = math.tointeger(tonumber(arg[1]))
    if not chain or chain < 2 or arg[2] then
        io.stderr:write(USAGE, "\n")
        os.exit(1)
    end
end

local mk = require "moonkaas"
local llama2 = require "moonkaas.llama2"

local function report(name, model)
    local s = model:stats()
    print(string.format("%-28s %6d nodes %5d launches  arena %10d B  lower bound %10d B  ratio %.3f" ..
        "  compile %8.2f ms  plan %7.3f ms", name, s.nodes, s.launches, s.arena_bytes,
        s.lower_bound_bytes, s.arena_bytes / math.max(1, s.lower_bound_bytes), s.compile_ms, s.plan_ms))
end

-- MLP: 784 → 1000 → 1000 → 10 on a batch of 128.
do
    local x = mk.input("x", "float32", { 128, 784 })
    local h = x
    for i, d in ipairs({ { 784, 1000 }, { 1000, 1000 }, { 1000, 10 } }) do
        h = h:matmul(mk.constant(mk.zeros("float32", d), "w" .. i)) +
            mk.constant(mk.zeros("float32", { 1, d[2] }), "b" .. i)
        if i < 3 then h = h:relu() end
    end
    report("MLP 784-1000-1000-10 x128", mk.compile(h))
end

-- llama-shaped: stories15M's dims, 6 layers, one token per evaluation.
do
    local c = assert(llama2.checkpoint.config_from_header({ dim = 288, hidden_dim = 768, n_layers = 6,
        n_heads = 6, n_kv_heads = 6, vocab_size = 32000, seq_len = 256 }))
    local z = function(shape) return mk.zeros("float32", shape) end
    local D, H, kv = c.dim, c.hidden_dim, c.kv_dim
    local w = { token_embedding = z({ c.vocab_size, D }), rms_final = z({ D }), layers = {} }
    w.wcls = w.token_embedding -- the classifier shares the embedding, as in stories15M
    for l = 1, c.n_layers do
        w.layers[l] = { rms_att = z({ D }), wq = z({ D, D }), wk = z({ kv, D }), wv = z({ kv, D }),
            wo = z({ D, D }), rms_ffn = z({ D }), w1 = z({ H, D }), w2 = z({ D, H }), w3 = z({ H, D }) }
    end
    report("llama2 stories15M shape, 6L", mk.compile(llama2.model.graph(mk, c, w, { output = "argmax" })))
end

-- A chain of n pointwise nodes, as a script.
do
    local n = chain
    local lines = { "$1 = InputTensor(x, float32, [64, 64]);" }
    for i = 2, n do
        lines[i] = string.format("$%d = %s($%d);", i, i % 2 == 0 and "ReLUNode" or "SiLUNode", i - 1)
    end
    lines[n + 1] = string.format("result = $%d;", n)
    report(string.format("chain of %d nodes", n), mk.compile_script(table.concat(lines, "\n"), {}))
end
