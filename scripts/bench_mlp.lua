-- bench_mlp.lua — latency of one small-network evaluation, as a game host
-- calls it every frame.
--
--   lua scripts/bench_mlp.lua [--devices cpu,cuda] [--runs N] [--load] [--onnx]
--
-- The policy MLP 64 -> 256 -> 256 -> 8 (weights [in, out], biases, ReLUs),
-- batch 1, float32. Per device, two models of it: the default (threads = 0,
-- the cost rule) and, on the CPU, threads = 1. The first compile in the
-- process is timed (it used to measure the fork cost) and printed. Then N
-- evaluations of each (default 20,000, after 1,000 to warm up) of
-- model:run(inputs, out) with the same input and output tensors, each timed
-- alone with mk.clock(), the two models alternating in blocks of 500; prints
-- p50, p99, p99.9 and max in microseconds. OMP_NUM_THREADS and
-- OMP_WAIT_POLICY are printed as the process saw them.
--
-- --load starts one busy process (a shell loop on one core) for the
-- duration of the timing, as a game host's other work would, and ends it
-- afterwards; the load average (/proc/loadavg) is printed before the runs.
--
-- --onnx also times the same network (same weights) in ONNX Runtime from
-- Python 3 (scripts/mlp_peer.py; needs numpy, onnx and onnxruntime; the CPU
-- provider, one intra-op thread, the same input and output arrays), or says
-- why it cannot.

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local mk = require("moonkaas")

local USAGE = "usage: lua scripts/bench_mlp.lua [--devices cpu,cuda] [--runs N] [--load] [--onnx]\n"
local SIZES = { 64, 256, 256, 8 }

local function parse(argv)
    local o = { runs = 20000 }
    local i = 1
    while i <= #argv do
        local a, v = argv[i], argv[i + 1]
        if a == "--devices" and v then o.devices = v; i = i + 1
        elseif a == "--runs" and v then o.runs = math.tointeger(tonumber(v)); i = i + 1
        elseif a == "--onnx" then o.onnx = true
        elseif a == "--load" then o.load = true
        elseif a == "-h" or a == "--help" then io.write(USAGE); os.exit(0)
        else error("unknown or incomplete option " .. a, 0) end
        i = i + 1
    end
    if not o.runs or o.runs < 100 then error("--runs: at least 100", 0) end
    return o
end

-- Weights uniform in ±1/sqrt(fan_in) and biases in ±0.1 from a fixed seed,
-- as flat row-major lists (also written for the peer).
local function network()
    math.randomseed(7)
    local layers = {}
    for l = 1, #SIZES - 1 do
        local fan_in, fan_out = SIZES[l], SIZES[l + 1]
        local w, b = {}, {}
        for i = 1, fan_in * fan_out do w[i] = (2 * math.random() - 1) / math.sqrt(fan_in) end
        for i = 1, fan_out do b[i] = 0.2 * math.random() - 0.1 end
        layers[l] = { w = w, b = b, fan_in = fan_in, fan_out = fan_out }
    end
    return layers
end

local function rows(flat, r, c)
    local t = {}
    for i = 1, r do
        local row = {}
        for j = 1, c do row[j] = flat[(i - 1) * c + j] end
        t[i] = row
    end
    return t
end

local function percentiles(t)
    table.sort(t)
    local n = #t
    return t[(n + 1) // 2], t[math.ceil(0.99 * n)], t[math.ceil(0.999 * n)], t[n]
end

local function build(layers)
    local x = mk.input("obs", "float32", { 1, SIZES[1] })
    local h = x
    for l, L in ipairs(layers) do
        local w = mk.constant(mk.tensor(rows(L.w, L.fan_in, L.fan_out)))
        local b = mk.constant(mk.tensor({ L.b }))
        h = h:matmul(w) + b
        if l < #layers then h = h:relu() end
    end
    return h
end

-- The first compile of the process (ms), then per variant (the default, and
-- threads = 1 on the CPU) its rows, timed in alternating blocks.
local function bench_device(layers, device, runs)
    local h = build(layers)
    local variants = { { who = "moonkaas " .. device .. " default", opts = { device = device } } }
    if device == "cpu" then
        variants[2] = { who = "moonkaas cpu threads=1", opts = { device = device, threads = 1 } }
    end
    local clock = mk.clock
    local first
    for _, v in ipairs(variants) do
        mk.on_log(function(_, message) if message:find("^cpu: ") then v.log = message end end)
        local t0 = clock()
        local ok, model = pcall(mk.compile, h, v.opts)
        v.compile_ms = (clock() - t0) * 1e3
        mk.on_log(nil)
        first = first or v.compile_ms
        if ok then v.model = model else v.why = tostring(model) end
    end
    local obs = mk.zeros("float32", { 1, SIZES[1] })
    for j = 1, SIZES[1] do obs:set(1, j, math.sin(j)) end
    local out = mk.zeros("float32", { 1, SIZES[#SIZES] })
    local inputs = { obs = obs }
    local rows_out = {}
    for _, v in ipairs(variants) do
        if v.model then
            for _ = 1, 1000 do v.model:run(inputs, out) end
            v.t = {}
        else
            print(v.who .. ": " .. v.why)
        end
    end
    local BLOCK = 500
    for start = 1, runs, BLOCK do
        for _, v in ipairs(variants) do
            if v.model then
                local model, t = v.model, v.t
                for i = start, math.min(start + BLOCK - 1, runs) do
                    local t0 = clock()
                    model:run(inputs, out)
                    t[i] = (clock() - t0) * 1e6
                end
            end
        end
    end
    for _, v in ipairs(variants) do
        if v.model then
            v.model:run(inputs, out)
            local p50, p99, p999, max = percentiles(v.t)
            if v.log then print(v.who .. ": " .. v.log) end
            rows_out[#rows_out + 1] = { who = v.who, p50 = p50, p99 = p99, p999 = p999, max = max,
                launches = v.model:stats().launches, first = out:get(1, 1),
                compile = v.compile_ms }
        end
    end
    return rows_out, first
end

-- One busy process (a shell loop), or nil and why; returns its pid.
local function start_load()
    local p = io.popen("sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo $!")
    local pid = p and tonumber(p:read("l"))
    if p then p:close() end
    return pid
end

local function loadavg()
    local f = io.open("/proc/loadavg")
    if not f then return "?" end
    local s = f:read("l")
    f:close()
    return s:match("^(%S+ %S+ %S+)")
end

local function bench_onnx(layers, runs)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    for _, L in ipairs(layers) do
        f:write(L.fan_in, " ", L.fan_out, "\n", table.concat(L.w, " "), "\n", table.concat(L.b, " "), "\n")
    end
    f:close()
    local p = io.popen(string.format("python3 '%s/mlp_peer.py' '%s' %d 2>&1", here, path, runs))
    local text = p:read("a")
    p:close()
    os.remove(path)
    local p50, p99, max = text:match("p50 ([%d%.]+) p99 ([%d%.]+) max ([%d%.]+)")
    if not p50 then return nil, text:gsub("%s+$", "") end
    return { who = "onnxruntime cpu (python)", p50 = tonumber(p50), p99 = tonumber(p99),
             max = tonumber(max), first = tonumber(text:match("first ([%-%d%.e]+)")) }
end

local load_pid

local function main(argv)
    local o = parse(argv)
    local devices = {}
    for d in (o.devices or "cpu"):gmatch("[^,]+") do devices[#devices + 1] = d end
    local layers = network()
    if o.load then
        load_pid = start_load()
        if not load_pid then error("--load: cannot start the busy process", 0) end
    end
    local before = loadavg()
    local rows_out, firsts = {}, {}
    for _, d in ipairs(devices) do
        if d == "cuda" and not mk.cuda_available() then
            io.stderr:write("cuda: " .. select(2, mk.cuda_available()) .. "\n")
        else
            local r, first = bench_device(layers, d, o.runs)
            for _, row in ipairs(r) do rows_out[#rows_out + 1] = row end
            firsts[#firsts + 1] = string.format("%s %.1f ms", d, first)
        end
    end
    if o.onnx then
        local r, why = bench_onnx(layers, o.runs)
        if r then rows_out[#rows_out + 1] = r else io.stderr:write("onnx peer: " .. why .. "\n") end
    end
    print(string.format("MLP %s, batch 1, %d evaluations each, OMP_NUM_THREADS=%s, "
        .. "OMP_WAIT_POLICY=%s, load %s, loadavg %s", table.concat(SIZES, "-"), o.runs,
        os.getenv("OMP_NUM_THREADS") or "(all)", os.getenv("OMP_WAIT_POLICY") or "(unset)",
        o.load and "one busy process" or "none added", before))
    print("first compile in the process: " .. table.concat(firsts, ", "))
    print("| runner                   |  p50 us |  p99 us | p99.9 us |  max us | compile ms | launches | out[1] |")
    print("|--------------------------|---------|---------|----------|---------|------------|----------|--------|")
    for _, r in ipairs(rows_out) do
        print(string.format("| %-24s | %7.2f | %7.2f | %8.1f | %7.1f | %10s | %8s | %6.3f |", r.who,
            r.p50, r.p99, r.p999 or 0 / 0, r.max,
            r.compile and string.format("%.2f", r.compile) or "-",
            r.launches and tostring(r.launches) or "-", r.first or 0 / 0))
    end
end

local ok, err = pcall(main, { ... })
if load_pid then os.execute("kill " .. load_pid .. " 2>/dev/null") end
if not ok then
    io.stderr:write("bench_mlp: " .. tostring(err) .. "\n" .. USAGE)
    os.exit(1)
end
