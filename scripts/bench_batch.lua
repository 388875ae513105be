-- bench_batch.lua — aggregate tokens per second of batched decoding (net:batch).
--
--   lua scripts/bench_batch.lua [--model PATH] [--batches 1,2,4,8,16,32]
--       [--devices cpu,cuda] [--steps N] [--runs N] [--temperature T]
--       [--rows 4,all] [--precision fp32|bf16|fp16|q8|q8a8] [--bandwidth GB/s]
--
-- For each device and batch size B: a batch of B slots (compiled before the
-- timing), B sequences from BOS with seeds 42, 43, ..., stepped together
-- for --steps steps (default 128; none is removed at BOS, so every step
-- runs B tokens); tokens / seconds over all of them, the median of --runs
-- runs (default 3), and the speedup over the first B (1 by default). Greedy unless --temperature
-- T > 0 (top-p 0.9). The step's host work (setting the inputs, reading the
-- tokens) is counted: it is part of serving B sequences. --rows: the batch's
-- block sizes to measure (net:batch's rows; "all" is one block of B rows;
-- default: the device's), a line each, with the launches of a step.
-- --precision: the weights' (net's precision, as scripts/llama2.lua -q).
--
-- On CUDA the last column is the roofline fraction: a step's least bytes
-- (every weight once, in the precision read, as scripts/bench_llama2.lua
-- counts them, plus the cache rows each slot's attention reads, (steps + 1)
-- / 2 on average) x steps a second / --bandwidth (GB/s, default 4300: the
-- H200's measured copy bandwidth; an H100's is about 3350).
--
-- --model: a llama2.c checkpoint (default ../shared/models/stories260K.bin);
-- a larger shape comes from scripts/bench_llama2.lua --only 15M --dir DIR
-- --keep (DIR/llama2_15M_random.bin).

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local USAGE = [[
usage: lua scripts/bench_batch.lua [--model PATH] [--batches 1,2,4,8,16,32]
       [--devices cpu,cuda] [--steps N] [--runs N] [--temperature T]
       [--rows 4,all] [--precision fp32|bf16|fp16|q8|q8a8] [--bandwidth GB/s]
]]

local function list(s, f)
    local t = {}
    for x in s:gmatch("[^,]+") do t[#t + 1] = f and f(x) or x end
    return t
end

local function parse(argv)
    local o = { model = root .. "/../shared/models/stories260K.bin", batches = { 1, 2, 4, 8, 16, 32 },
                devices = nil, steps = 128, runs = 3, temperature = 0, rows = { "device" }, bandwidth = 4300 }
    local i = 1
    while i <= #argv do
        local a, v = argv[i], argv[i + 1]
        if a == "--help" or a == "-h" then return nil end
        if v == nil then return nil end
        if a == "--model" then o.model = v
        elseif a == "--batches" then o.batches = list(v, math.tointeger)
        elseif a == "--devices" then o.devices = list(v)
        elseif a == "--steps" then o.steps = math.tointeger(tonumber(v))
        elseif a == "--runs" then o.runs = math.tointeger(tonumber(v))
        elseif a == "--temperature" then o.temperature = tonumber(v)
        elseif a == "--precision" then o.precision = v
        elseif a == "--bandwidth" then o.bandwidth = tonumber(v)
        elseif a == "--rows" then
            o.rows = list(v, function(x) return x == "all" and "all" or math.tointeger(tonumber(x)) end)
        else return nil end
        i = i + 2
    end
    for _, b in ipairs(o.batches) do if not b or b < 1 then return nil end end
    for _, r in ipairs(o.rows) do if not r or (type(r) == "number" and r < 1) then return nil end end
    if not o.steps or o.steps < 1 or not o.runs or o.runs < 1 or not o.temperature then return nil end
    if not o.bandwidth or o.bandwidth <= 0 then return nil end
    return o
end

local o = parse({ ... })
if not o then
    io.stdout:write(USAGE)
    os.exit(#{ ... } > 0 and ({ ... })[1] ~= "--help" and ({ ... })[1] ~= "-h" and 2 or 0)
end

local mk = require("moonkaas")
local llama2 = require("moonkaas.llama2")

local function median(t)
    table.sort(t)
    local n = #t
    return n % 2 == 1 and t[(n + 1) // 2] or (t[n // 2] + t[n // 2 + 1]) / 2
end

local c = assert(llama2.read_config(o.model))
if not o.devices then
    o.devices = { "cpu" }
    if mk.cuda_available() then o.devices[2] = "cuda" end
end
local steps = math.min(o.steps, c.seq_len)
print(string.format("%s: %s; %s weights; %d steps from BOS, %s, median of %d runs", o.model,
    llama2.checkpoint.describe(c), o.precision or "fp32", steps,
    o.temperature > 0 and string.format("-t %g -p 0.9", o.temperature) or "greedy", o.runs))
-- a step's least bytes but the cache rows: every weight once (not the token
-- table, one row of it read, nor the legacy RoPE block) in its precision
local q8 = 1 + 4 / llama2.model.group_size(c)
local per = ({ bf16 = 2, fp16 = 2, q8 = q8, q8a8 = q8 })[o.precision or ""] or 4
local weight_bytes = (c.file_bytes - 28 - 4 * c.seq_len * c.head_size
    - (c.shared_classifier and 0 or 4 * c.vocab_size * c.dim)) * per / 4
local kv_slot = 2 * 4 * c.n_layers * c.kv_dim * (steps + 1) / 2 -- a slot's cache rows a step
for _, device in ipairs(o.devices) do
    local net = llama2.build(mk, c, { device = device, steps = steps, precision = o.precision })
    local base
    print(string.format("%-6s %6s %6s %12s %10s %12s %9s%s", "device", "B", "rows", "tok/s", "speedup", "ms/step",
        "launches", device == "cuda" and "  roofline" or ""))
    for _, B in ipairs(o.batches) do
        for _, rows in ipairs(o.rows) do
            local b = net:batch({ slots = B, rows = rows == "all" and B or rows ~= "device" and rows or nil })
            local rates = {}
            for _ = 1, o.runs do
                for s = 1, B do b:add({ 1 }, llama2.sampler(c.vocab_size, o.temperature, 0.9, 41 + s)) end
                b:step() -- warm-up
                local t0, made = mk.clock(), 0
                for _ = 2, steps do made = made + #b:step() end
                rates[#rates + 1] = made / (mk.clock() - t0)
                for id in pairs(b.by_id) do b:remove(id) end
            end
            local rate = median(rates)
            base = base or rate
            local roof = (weight_bytes + B * kv_slot) * (rate / B) / (o.bandwidth * 1e9)
            print(string.format("%-6s %6d %6s %12.1f %9.2fx %12.3f %9d%s", device, B, tostring(rows), rate, rate / base,
                1000 * B / rate, b.model:stats().launches, device == "cuda" and string.format("  %7.1f%%", 100 * roof) or ""))
            b.model:close()
        end
    end
end
