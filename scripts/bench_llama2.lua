-- bench_llama2.lua — tokens per second of llama2 shapes through moonkaas.
--
--   lua scripts/bench_llama2.lua [--7b] [--only 15M|110M|7B] [--runs N] [--steps N]
--       [--devices cpu,cuda] [--dir DIR] [--keep] [--tokenizer PATH]
--       [--bandwidth GB/s] [--runomp PATH] [--threads N] [--cudnn]
--       [--model PATH] [--precision fp32|bf16|fp16|q8|q8a8] [--runq PATH]
--       [--per-token] [--temperature T] [--topp P] [--prompt-tokens N] [--prompt-at P]
--       [--chunk N]
--
-- Protocol (../shared/BENCHMARKS.md): random-weight checkpoints in llama2.c's
-- legacy layout with the real shapes (stories15M, stories110M; Llama-2-7B
-- with --7b, for the GPU machine), weights uniform in ±1/sqrt(fan_in), norms
-- 1, the legacy freq_cis block filled with the true cos/sin table. Greedy,
-- 256 steps, prompt "Once upon a time", tokenizer.bin; tok/s as run.c counts
-- it (the timer starts after the first step), the median of --runs runs.
-- Random weights may pick BOS, which would end a run.c generation early; the
-- benchmark runs all the steps regardless.
--
-- On CUDA it also prints the roofline fraction: (weight bytes + KV-cache bytes
-- read per token) x tok/s / bandwidth (--bandwidth, default 4300 GB/s, the
-- H200's measured copy bandwidth). Attention reads the caches' first pos + 1
-- rows (the attention group, see lua/moonkaas/llama2/model.lua), so a run of
-- N steps reads (N + 1) / 2 rows of each cache per token on average.
--
-- --model PATH measures that checkpoint instead of the random shapes (e.g.
-- stories260K.bin with --tokenizer tok512.bin).
--
-- --runomp PATH compares the CPU with llama2.c's runomp (built outside the
-- checkout) on the same files, same OMP_NUM_THREADS (--threads, default: all
-- cores): --runs pairs (at least 5) of one moonkaas process
-- (scripts/llama2.lua -d cpu) then one runomp process, alternating, so that a
-- slow spell of the machine hits both; each pair's tok/s ratio, the medians,
-- and each process's peak RSS (through /usr/bin/time where it is installed).
--
-- Generation runs 16 greedy steps a call inside the model (run_steps, as
-- scripts/llama2.lua does; --chunk N steps instead); --per-token runs one
-- evaluation a token instead.
-- --temperature T (> 0) samples as run.c does (-t T -p P, seed 42), the
-- sampler inside the model (model.lua's "sample" output).
--
-- On CUDA (without --per-token) it also prints the host's time per token:
-- generation's wall time per token less the GPU's, measured as the same
-- steps in one run_steps call (an upper bound: see host_time).
--
-- --prompt-tokens N also times a prompt of N random token ids at position 0:
-- in one evaluation (prefill, net:prompt: one model for N tokens, its
-- products GEMMs, compiled before the timing) and a token per evaluation
-- (net:forward N times), N / seconds each, the median of --runs; and the
-- first token's latency (the prompt's evaluation and the token after it),
-- cold (the first call, which compiles the prompt's model: the CUDA kernel
-- cache as MK_KERNEL_CACHE has it) and warm (the median evaluation).
-- --prompt-at P puts the prompt at position P instead (after P cache rows,
-- as the reset left them: a chat's later turn), where its attention covers
-- all the cache's rows up to its own.
--
-- --precision converts the weights at load (scripts/llama2.lua -q); the
-- roofline then counts the bytes of that precision.
--
-- --runq PATH compares the CPU's int8 with llama2.c's runq the same way: the
-- checkpoint is exported to version 2 first (scripts/export.lua's engine,
-- export.py's group size: 64 halved until it divides dim), and both read that
-- file, moonkaas in its own precision (int8 weights, float32 activations)
-- or --precision's (q8a8: runq.c's int8 activations too).

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local mk = require("moonkaas")
local llama2 = require("moonkaas.llama2")

local PROMPT = "Once upon a time" -- run.c's default, as the protocol above says

local SHAPES = {
    { name = "15M", header = { 288, 768, 6, 6, 6, 32000, 256 } },
    { name = "110M", header = { 768, 2048, 12, 12, 12, 32000, 1024 } },
    { name = "7B", header = { 4096, 11008, 32, 32, 32, -32000, 2048 }, big = true },
}

local USAGE = [[
usage: lua scripts/bench_llama2.lua [--7b] [--only 15M|110M|7B] [--runs N] [--steps N]
       [--devices cpu,cuda] [--dir DIR] [--keep] [--tokenizer PATH]
       [--bandwidth GB/s] [--runomp PATH] [--threads N] [--cudnn]
       [--model PATH] [--precision fp32|bf16|fp16|q8|q8a8] [--runq PATH]
       [--per-token] [--temperature T] [--topp P] [--prompt-tokens N] [--prompt-at P]
       [--chunk N]
]]

local function parse(argv)
    local o = { runs = 3, steps = 256, bandwidth = 4300, keep = false, big = false, cudnn = false,
                temperature = 0.0, topp = 0.9 }
    local i = 1
    while i <= #argv do
        local a, v = argv[i], argv[i + 1]
        local function need() if v == nil then error("option " .. a .. " needs a value", 0) end return v end
        if a == "--7b" then o.big = true
        elseif a == "--keep" then o.keep = true
        elseif a == "--cudnn" then o.cudnn = true
        elseif a == "--per-token" then o.per_token = true
        elseif a == "-h" or a == "--help" then io.write(USAGE); os.exit(0)
        else
            if a == "--only" then o.only = need()
            elseif a == "--runs" then o.runs = math.tointeger(tonumber(need()))
            elseif a == "--steps" then o.steps = math.tointeger(tonumber(need()))
            elseif a == "--devices" then o.devices = need()
            elseif a == "--dir" then o.dir = need()
            elseif a == "--tokenizer" then o.tokenizer = need()
            elseif a == "--bandwidth" then o.bandwidth = tonumber(need())
            elseif a == "--runomp" then o.runomp = need()
            elseif a == "--runq" then o.runq = need()
            elseif a == "--precision" then
                o.precision = need()
                if not llama2.model.PRECISIONS[o.precision] then error("unknown precision " .. o.precision, 0) end
            elseif a == "--model" then o.model = need()
            elseif a == "--threads" then o.threads = math.tointeger(tonumber(need()))
            elseif a == "--temperature" then o.temperature = tonumber(need())
            elseif a == "--topp" then o.topp = tonumber(need())
            elseif a == "--prompt-tokens" then o.prompt_tokens = math.tointeger(tonumber(need()))
            elseif a == "--prompt-at" then
                o.prompt_at = math.tointeger(tonumber(need()))
                if not o.prompt_at then error("--prompt-at needs a position, not " .. v, 0) end
            elseif a == "--chunk" then o.chunk = math.tointeger(tonumber(need()))
            else error("unknown option " .. a, 0) end
            i = i + 1
        end
        i = i + 1
    end
    if not o.runs or o.runs < 1 or not o.steps or o.steps < 2 or not o.bandwidth
        or not o.temperature or not o.topp or (o.chunk and o.chunk < 1) then
        error("bad numeric option", 0)
    end
    return o
end

-- ---------------------------------------------------------------------------
-- fast random checkpoint writer

local BLOCK = 1 << 18      -- floats per random block (1 MiB)

local blocks = {}
-- A 1 MiB string of float32 uniform in ±scale, one per distinct scale.
local function random_block(scale)
    local b = blocks[scale]
    if b then return b end
    local parts, chunk = {}, 1024
    local fmt = "<" .. string.rep("f", chunk)
    local vals = {}
    for _ = 1, BLOCK // chunk do
        for k = 1, chunk do vals[k] = (2 * math.random() - 1) * scale end
        parts[#parts + 1] = string.pack(fmt, table.unpack(vals, 1, chunk))
    end
    b = table.concat(parts)
    blocks[scale] = b
    return b
end

-- Writes n floats uniform in ±scale: the block repeated from a random start.
local function write_random(f, n, scale)
    local b = random_block(scale)
    local bytes = 4 * n
    local start = 4 * math.random(0, BLOCK - 1)
    local piece = b:sub(start + 1) .. b:sub(1, start)
    while bytes >= #piece do
        f:write(piece)
        bytes = bytes - #piece
    end
    if bytes > 0 then f:write(piece:sub(1, bytes)) end
end

local function write_const(f, n, value)
    local one = string.pack("<f", value)
    local chunk = one:rep(math.min(n, BLOCK))
    while n >= BLOCK do f:write(chunk); n = n - BLOCK end
    if n > 0 then f:write(one:rep(n)) end
end

local function write_checkpoint(path, h)
    local D, H, L, heads, kvh, V, S = table.unpack(h)
    local shared = V > 0
    V = math.abs(V)
    local hs = D // heads
    local kv = hs * kvh
    local f = assert(io.open(path, "wb"))
    f:setvbuf("full", 1 << 22)
    f:write(string.pack("<i4i4i4i4i4i4i4", table.unpack(h)))
    local sD, sH = 1 / math.sqrt(D), 1 / math.sqrt(H)
    write_random(f, V * D, sD)            -- token embedding [V, D]
    write_const(f, L * D, 1.0)            -- rms_att [L, D]
    write_random(f, L * D * D, sD)        -- wq [L, D, D]
    write_random(f, L * kv * D, sD)       -- wk [L, kv, D]
    write_random(f, L * kv * D, sD)       -- wv [L, kv, D]
    write_random(f, L * D * D, sD)        -- wo [L, D, D]
    write_const(f, L * D, 1.0)            -- rms_ffn [L, D]
    write_random(f, L * H * D, sD)        -- w1 [L, H, D]
    write_random(f, L * D * H, sH)        -- w2 [L, D, H]
    write_random(f, L * H * D, sD)        -- w3 [L, H, D]
    write_const(f, D, 1.0)                -- rms_final [D]
    -- legacy freq_cis: real [S, hs/2] then imaginary [S, hs/2]
    for part = 1, 2 do
        local fn = part == 1 and math.cos or math.sin
        for pos = 0, S - 1 do
            local row = {}
            for i = 0, hs // 2 - 1 do
                row[#row + 1] = fn(pos / 10000 ^ (2 * i / hs))
            end
            f:write(string.pack("<" .. string.rep("f", #row), table.unpack(row)))
        end
    end
    if not shared then write_random(f, V * D, sD) end   -- wcls [V, D]
    f:close()
end

-- ---------------------------------------------------------------------------

local function median(t)
    table.sort(t)
    local n = #t
    if n % 2 == 1 then return t[(n + 1) // 2] end
    return (t[n // 2] + t[n // 2 + 1]) / 2
end

local function file_size(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local n = f:seek("end")
    f:close()
    return n
end

-- One process: its "achieved tok/s" and peak RSS in KiB (nil without /usr/bin/time).
local HAS_TIME = io.open("/usr/bin/time", "rb") ~= nil
local function measure(env, cmd)
    local full = env .. (HAS_TIME and ("/usr/bin/time -f 'peak-rss-kib %M' " .. cmd) or cmd)
    local p = io.popen(full .. " 2>&1 >/dev/null")
    local out = p:read("a")
    p:close()
    return tonumber(out:match("achieved tok/s: ([%d%.]+)")), tonumber(out:match("peak%-rss%-kib (%d+)")), out
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- The CPU against llama2.c's `peer` (runomp) in alternating pairs of
-- processes on the same file (see the top).
local function paired(o, name, path, tok_path, peer, peer_name, precision)
    local env = o.threads and ("OMP_NUM_THREADS=" .. o.threads .. " ") or ""
    local lua = arg[-1] or "lua"
    env = env .. "MK_BUILD=" .. quote(build) .. " "
    local ours = string.format("%s %s %s -z %s -t 0 -n %d -i '%s' -d cpu%s", quote(lua),
        quote(here .. "/llama2.lua"), quote(path), quote(tok_path), o.steps, PROMPT,
        precision and (" -q " .. precision) or "")
    local theirs = string.format("%s %s -z %s -t 0 -n %d -i '%s'", quote(peer),
        quote(path), quote(tok_path), o.steps, PROMPT)
    local r = { shape = name, paired = true, threads = o.threads or "all", peer = peer_name }
    local rates, peer, ratios, rss, peer_rss = {}, {}, {}, {}, {}
    for i = 1, math.max(o.runs, 5) do
        local a, ra, out = measure(env, ours)
        if not a then error("moonkaas (" .. ours .. ") printed no tok/s:\n" .. out, 0) end
        local b, rb, out2 = measure(env, theirs)
        if not b then error(peer_name .. " (" .. theirs .. ") printed no tok/s:\n" .. out2, 0) end
        rates[#rates + 1], peer[#peer + 1], ratios[#ratios + 1] = a, b, a / b
        rss[#rss + 1], peer_rss[#peer_rss + 1] = ra, rb
        io.stderr:write(string.format("  %s pair %d: moonkaas %.1f tok/s, %s %.1f tok/s (%.2fx)\n",
            name, i, a, peer_name, b, a / b))
    end
    r.rate, r.peer_rate, r.ratio = median(rates), median(peer), median(ratios)
    if #rss > 0 then r.rss = median(rss) end
    if #peer_rss > 0 then r.peer_rss = median(peer_rss) end
    return r
end

-- The host's time per generated token: generate's wall time per token (rate)
-- less the same tokens' time in one run_steps call, which returns to the host
-- once (the GPU's time per token, and one launch spread over them all). An
-- upper bound: each chunk's own launch latency and staging kernels count as
-- host time here. Microseconds.
local function host_time(net, tok, smp, steps, rate)
    local prompt = tok:encode(PROMPT, true, false)
    local function one_call()
        net:reset()
        smp.state = 42
        local token = net:prefill(prompt, 0, smp)
        local pos = #prompt
        local t0 = llama2.clock()
        local made = net:steps(token, pos, steps - pos, nil, smp)
        return (llama2.clock() - t0) / #made
    end
    one_call() -- allocates the outputs for that many steps
    local per = {}
    for r = 1, 3 do per[r] = one_call() end
    return 1e6 * (1 / rate - median(per))
end

-- The prompt's tok/s, in one evaluation and a token at a time (--prompt-tokens).
local function prompt_rows(o, net, smp, shape, who)
    local n, at = o.prompt_tokens, o.prompt_at or 0
    if n < 2 or at < 0 or at + n > net.positions then
        error(string.format("--prompt-tokens N and --prompt-at P need 2 <= N, 0 <= P, P + N <= %d for %s",
            net.positions, shape), 0)
    end
    local ids = {}
    for i = 1, n do ids[i] = math.random(3, net.config.vocab_size - 1) end
    local function rate(feed)
        net:reset()
        smp.state = 42
        local t0 = llama2.clock()
        feed()
        return n / (llama2.clock() - t0)
    end
    local function whole() net:prompt(ids, at, smp) end
    local function per_token() for i = 1, n do net:forward(ids[i], at + i - 1, smp) end end
    local where = at > 0 and " at " .. at or ""
    local cold = n / rate(whole) -- compiles the prompt's model (the kernel cache as it is)
    local a, b = {}, {}
    for r = 1, o.runs do
        a[r], b[r] = rate(whole), rate(per_token)
        io.stderr:write(string.format("  %s prompt of %d%s, run %d: %.1f tok/s in one evaluation, %.1f a "
                                      .. "token at a time\n", shape, n, where, r, a[r], b[r]))
    end
    io.stderr:write(string.format("  %s first token after a prompt of %d%s: cold %.1f ms (the prompt's "
                                  .. "model compiled), warm %.1f ms\n", shape, n, where, 1e3 * cold,
                                  1e3 * n / median(a)))
    return { { shape = shape, who = who .. " prefill " .. n .. where, rate = median(a) },
             { shape = shape, who = who .. " prompt per-token", rate = median(b) } }
end

local function main(argv)
    local o = parse(argv)
    math.randomseed(os.time())
    local dir = o.dir
    if not dir then
        dir = os.tmpname()
        os.remove(dir)
    end
    if not os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'") then
        error("cannot create the folder " .. dir, 0)
    end
    local tok_path = o.tokenizer
    if not tok_path then
        tok_path = root .. "/../shared/models/tokenizer.bin"
        if not io.open(tok_path, "rb") then tok_path = "tokenizer.bin" end
    end
    local devices = {}
    if o.devices then
        for d in o.devices:gmatch("[^,]+") do devices[#devices + 1] = d end
    else
        devices = { "cpu" }
        if mk.cuda_available() then devices[#devices + 1] = "cuda" end
    end

    local rows = {}
    local shapes = o.model and { { name = o.model:match("([^/]*)%.bin$") or o.model, path = o.model } }
                   or SHAPES
    for _, shape in ipairs(shapes) do
        local wanted = o.model or (o.only and o.only == shape.name) or (not o.only and (not shape.big or o.big))
        if wanted then
            local path = shape.path or string.format("%s/llama2_%s_random.bin", dir, shape.name)
            local h = shape.header
            local hdr = {}
            for k, name in ipairs(llama2.checkpoint.FIELDS) do hdr[name] = h and h[k] end
            local c0 = h and assert(llama2.checkpoint.config_from_header(hdr))
            if h and file_size(path) ~= c0.expected_bytes then
                local t0 = llama2.clock()
                io.stderr:write(string.format("writing %s (%.1f MB) ...\n", path, c0.expected_bytes / 1e6))
                write_checkpoint(path, h)
                io.stderr:write(string.format("  written in %.1f s\n", llama2.clock() - t0))
            end
            local c = assert(llama2.read_config(path))
            local tok = assert(llama2.load_tokenizer(tok_path, c.vocab_size))
            local smp = llama2.sampler(c.vocab_size, o.temperature, o.topp, 42)
            local sampled = not smp:greedy()
            -- bytes read per token: every weight except the embedding table
            -- (one row) and the legacy RoPE block, plus the rows of both KV
            -- caches that attention reads, on average over the run
            local weights = c.file_bytes - 28 - 4 * c.seq_len * c.head_size
                            - (c.shared_classifier and 0 or 4 * c.vocab_size * c.dim)
            local kv_bytes = 2 * 4 * c.n_layers * c.kv_dim * (o.steps + 1) / 2
            for _, device in ipairs(devices) do
              if device == "cpu" and o.runomp then
                rows[#rows + 1] = paired(o, shape.name, path, tok_path, o.runomp, "runomp", o.precision)
              end
              if device == "cpu" and o.runq then
                local v2 = path:gsub("%.bin$", "") .. "_v2.bin"
                local qc = llama2.read_config(v2)
                if not qc or qc.version ~= 2 then
                    local t0 = llama2.clock()
                    assert(llama2.checkpoint.export(mk, c, v2, 2))
                    io.stderr:write(string.format("  exported %s in %.1f s\n", v2, llama2.clock() - t0))
                end
                rows[#rows + 1] = paired(o, shape.name, v2, tok_path, o.runq, "runq", o.precision)
                if not o.keep and not o.dir then os.remove(v2) end
              end
              if device ~= "cpu" or not (o.runomp or o.runq) then
                local net = llama2.build(mk, c, {
                    device = device, cudnn = o.cudnn and device == "cuda",
                    output = sampled and "sample" or "argmax",
                    precision = o.precision,
                    log = function(m) io.stderr:write("  " .. m .. "\n") end })
                local rates = {}
                for r = 1, o.runs do
                    if r > 1 then net:reset() end
                    smp.state = 42
                    local _, rate = llama2.generate(net, tok, smp, PROMPT, o.steps,
                        { write = function() end, report = function() end, stop_on_bos = false,
                          per_token = o.per_token, chunk = o.chunk })
                    rates[#rates + 1] = rate
                    io.stderr:write(string.format("  %s %s run %d: %.1f tok/s\n", shape.name, device, r, rate))
                end
                local rate = median(rates)
                local row = { shape = shape.name, who = "moonkaas " .. device .. (net.cudnn and "+cudnn" or "")
                              .. (o.precision and (" " .. o.precision) or "")
                              .. (o.per_token and " per-token" or "")
                              .. (o.chunk and not o.per_token and (" chunk " .. o.chunk) or "")
                              .. (sampled and string.format(" t=%g p=%g", o.temperature, o.topp) or ""),
                              rate = rate }
                if device == "cuda" then
                    -- the weights' bytes in the precision they are read in
                    local q8 = 1 + 4 / llama2.model.group_size(c)
                    local per = ({ bf16 = 2, fp16 = 2, q8 = q8, q8a8 = q8 })[o.precision or ""] or 4
                    local wb = weights * per / 4
                    row.roofline = (wb + kv_bytes) * rate / (o.bandwidth * 1e9)
                    row.weights_only = wb * rate / (o.bandwidth * 1e9)
                    if not o.per_token then row.host_us = host_time(net, tok, smp, o.steps, rate) end
                end
                rows[#rows + 1] = row
                if o.prompt_tokens then
                    for _, r in ipairs(prompt_rows(o, net, smp, shape.name, row.who)) do rows[#rows + 1] = r end
                end
                net = nil
                collectgarbage()
              end
            end
            if not o.keep and not o.dir and not shape.path then os.remove(path) end
        end
    end
    if not o.keep and not o.dir then os.remove(dir) end

    -- roofline: weights + the KV rows attention reads (pos + 1 a step);
    -- weights: the weights alone.
    print(string.format("| %-6s | %-44s | %12s | %8s | %8s | %11s |", "shape", "runner", "tok/s", "roofline",
        "weights", "host us/tok"))
    print("|--------|----------------------------------------------|--------------|----------|----------|-------------|")
    local pairs_rows = {}
    for _, r in ipairs(rows) do
        if r.paired then
            pairs_rows[#pairs_rows + 1] = r
        else
            print(string.format("| %-6s | %-44s | %12.1f | %8s | %8s | %11s |", r.shape, r.who, r.rate,
                r.roofline and string.format("%.1f%%", 100 * r.roofline) or "-",
                r.weights_only and string.format("%.1f%%", 100 * r.weights_only) or "-",
                r.host_us and string.format("%.2f", r.host_us) or "-"))
        end
    end
    if #pairs_rows == 0 then return end
    -- the CPU against runomp: medians over the pairs; ratio: the median of
    -- each pair's moonkaas / runomp
    local function mib(x) return x and string.format("%.0f", x / 1024) or "-" end
    print()
    print(string.format("| %-6s | %-6s | %7s | %14s | %10s | %6s | %12s | %8s | %9s |", "shape", "peer",
        "threads", "moonkaas tok/s", "peer tok/s", "ratio", "moonkaas MiB", "peer MiB", "RSS ratio"))
    print("|--------|--------|---------|----------------|------------|--------|--------------|----------|-----------|")
    for _, r in ipairs(pairs_rows) do
        print(string.format("| %-6s | %-6s | %7s | %14.1f | %10.1f | %5.2fx | %12s | %8s | %9s |", r.shape,
            r.peer, r.threads, r.rate, r.peer_rate, r.ratio, mib(r.rss), mib(r.peer_rss),
            (r.rss and r.peer_rss) and string.format("%.2fx", r.rss / r.peer_rss) or "-"))
    end
end

local ok, err = pcall(main, { ... })
if not ok then
    io.stderr:write("bench_llama2: " .. tostring(err) .. "\n" .. USAGE)
    os.exit(1)
end
