--[[
bench_ops.lua — throughput of single ops on each device: matrix products
(TFLOP/s), matrix-vector products, pointwise sums, sliced softmax and
rms-norm (GB/s), against the device's copy bandwidth measured in the same run.

    lua5.4 scripts/bench_ops.lua [--devices cpu,cuda] [--quick] [--min-time S]

How each row is measured: one model per (op, size) whose graph chains the op
R times on device-resident constants (x1 = op(x0), x2 = op(x1), ...), so no
input is copied per evaluation; the output is a one-row SliceNode view, so
the copy back is a few bytes. The time of one evaluation divided by R is the
time of one op (launch gaps and the evaluation's own overhead are included,
spread over R). Each model runs a few warm-up evaluations, then as many as fit
in --min-time seconds (at least 5); the median is reported.

  copy      identity PermuteNode chain: the CUDA device runs it as
            cudaMemcpyAsync device→device (the CPU as memcpy); bytes read +
            written = the device's copy bandwidth, the roofline for the rest
  sum       x + b, same shape: 3 × 4 bytes per element
  softmax   SlicedSoftmaxNode over whole rows: 2 × 4 bytes per element (read, write)
  rms_norm  RmsNormNode: 2 × 4 bytes per element
  matvec    v [k] @ W [n, k]ᵀ (llama2's layout, a transposed view): 4·n·k bytes
  matmul    [n, n] @ [n, n]: 2·n³ FLOP

Values are random (never zeros: see ../shared/device's METHOD notes), scaled
so chains neither overflow nor vanish.
]]

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local mk = require("moonkaas")

-- A wall clock: lua-system (busted's own dependency) where present.
local now, clock_name
do
    local ok, system = pcall(require, "system")
    if ok and system.monotime then
        now, clock_name = system.monotime, "system.monotime"
    else
        now, clock_name = os.clock, "os.clock (CPU time: multi-threaded CPU rows read high)"
    end
end

-- ---- options -----------------------------------------------------------------

local opts = { devices = nil, quick = false, min_time = 0.5 }
do
    local i = 1
    while arg and i <= #arg do
        local a = arg[i]
        if a == "--devices" then
            opts.devices = {}
            for d in arg[i + 1]:gmatch("[^,]+") do opts.devices[#opts.devices + 1] = d end
            i = i + 1
        elseif a == "--quick" then
            opts.quick = true
        elseif a == "--min-time" then
            opts.min_time = tonumber(arg[i + 1])
            i = i + 1
        else
            io.stderr:write("usage: lua5.4 scripts/bench_ops.lua [--devices cpu,cuda] [--quick] "
                .. "[--min-time S]\n")
            os.exit(2)
        end
        i = i + 1
    end
end

local cuda_ok, cuda_why = mk.cuda_available()
if not opts.devices then
    opts.devices = { "cpu" }
    if cuda_ok then opts.devices[2] = "cuda" end
end

-- ---- random constants --------------------------------------------------------

-- float32 data of n elements, uniform in ±[0.5, 1)·scale: 4096 random values
-- repeated (string.rep), so 256 MiB of it costs no Lua table.
local function random_bytes(n, scale)
    local block = {}
    local k = math.min(n, 4096)
    for i = 1, k do
        local v = (0.5 + 0.5 * math.random()) * scale
        if math.random() < 0.5 then v = -v end
        block[i] = string.pack("<f", v)
    end
    local one = table.concat(block)
    local reps = n // k
    return one:rep(reps) .. one:sub(1, 4 * (n - reps * k))
end

local function const(name, shape, scale)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    return mk.from_bytes(random_bytes(n, scale), "float32", shape)
end

local function shape_str(s)
    return "[" .. table.concat(s, ", ") .. "]"
end

-- ---- one measurement ---------------------------------------------------------

-- Median seconds per evaluation of `model`.
local function time_model(model)
    for _ = 1, 3 do model:run() end
    local times = {}
    local start = now()
    repeat
        local t0 = now()
        model:run()
        times[#times + 1] = now() - t0
    until (#times >= 5 and now() - start >= opts.min_time) or #times >= 2000
    table.sort(times)
    return times[(#times + 1) // 2], #times
end

--[[
A chain of R ops: step(prev_id, next_id) returns the statement computing
$next from $prev. The header declares $1 (x0, the first op's operand) up to
$last (other operands). The output is a one-row slice of the last op.
]]
local function chain_script(header, last, R, step, out_rows)
    local lines = { header }
    local prev = 1
    local id = last
    for _ = 1, R do
        id = id + 1
        lines[#lines + 1] = step(prev, id)
        prev = id
    end
    lines[#lines + 1] = string.format("$%d = SliceNode($%d, 0, 1);", id + 1, prev)
    lines[#lines + 1] = string.format("result = $%d;", id + 1)
    return table.concat(lines, "\n") .. "\n", out_rows
end

local results = {}

local function run_case(device, c)
    local ok, model = pcall(mk.compile_script, c.script, c.constants, { device = device })
    if not ok then
        print(string.format("%-5s %-9s %-22s compile failed: %s", device, c.op, c.size, model))
        return
    end
    local t, runs = time_model(model)
    local stats = model:stats()
    model:close()
    local per_op = t / c.R
    local row = { device = device, op = c.op, size = c.size, us = per_op * 1e6, runs = runs,
        launches = stats.launches }
    if c.flops then row.tflops = c.flops / per_op / 1e12 end
    if c.bytes then row.gbs = c.bytes / per_op / 1e9 end
    results[#results + 1] = row
    return row
end

-- ---- the cases ---------------------------------------------------------------

local function cases_for(device)
    local gpu = device == "cuda"
    local q = opts.quick
    local list = {}
    local function add(c) list[#list + 1] = c end

    -- copy: identity permute of [rows, 1024] floats
    local copy_sizes = gpu and (q and { 16 } or { 16, 64, 256 }) or (q and { 4 } or { 4, 32 })
    for _, mib in ipairs(copy_sizes) do
        local rows = mib * 1024 * 1024 // 4 // 1024
        local R = 8
        local script = chain_script(
            string.format("$1 = ConstantTensor(x, float32, [%d, 1024]);", rows), 1, R,
            function(p, n) return string.format("$%d = PermuteNode($%d, [0, 1]);", n, p) end)
        add({ op = "copy", size = mib .. " MiB", R = R, script = script,
            constants = { x = const("x", { rows, 1024 }, 1) }, bytes = 2 * mib * 1024 * 1024,
            is_copy = true })
    end

    -- sum: x + b over n elements as [n / 1024, 1024]
    local sum_sizes = gpu and (q and { 1 } or { 1, 16, 64 }) or (q and { 1 } or { 1, 8 })
    for _, m in ipairs(sum_sizes) do
        local rows = m * 1024
        local R = 8
        local script = chain_script(string.format(
            "$1 = ConstantTensor(x, float32, [%d, 1024]);\n$2 = ConstantTensor(b, float32, [%d, 1024]);",
            rows, rows), 2, R,
            function(p, n) return string.format("$%d = SumNode($%d, $2);", n, p) end)
        add({ op = "sum", size = m .. "M elem", R = R, script = script,
            constants = { x = const("x", { rows, 1024 }, 1), b = const("b", { rows, 1024 }, 1e-3) },
            bytes = 3 * 4 * rows * 1024 })
    end

    -- softmax and rms_norm over [rows, n]
    local row_sizes = gpu and (q and { { 32, 1024 } } or { { 32, 1024 }, { 4096, 4096 }, { 16384, 4096 } })
        or (q and { { 32, 1024 } } or { { 32, 1024 }, { 1024, 4096 } })
    for _, s in ipairs(row_sizes) do
        local rows, n = s[1], s[2]
        local R = 8
        local script = chain_script(string.format(
            "$1 = ConstantTensor(x, float32, [%d, %d]);\n$2 = ConstantTensor(p, int64, [1]);", rows, n),
            2, R, function(p, id) return string.format("$%d = SlicedSoftmaxNode($%d, $2);", id, p) end)
        add({ op = "softmax", size = shape_str(s), R = R, script = script,
            constants = { x = const("x", s, 4), p = mk.tensor({ n }, "int64") },
            bytes = 2 * 4 * rows * n })
        script = chain_script(string.format(
            "$1 = ConstantTensor(x, float32, [%d, %d]);\n$2 = ConstantTensor(w, float32, [%d]);",
            rows, n, n), 2, R,
            function(p, id) return string.format("$%d = RmsNormNode($%d, $2);", id, p) end)
        add({ op = "rms_norm", size = shape_str(s), R = R, script = script,
            constants = { x = const("x", s, 1), w = const("w", { n }, 1) },
            bytes = 2 * 4 * rows * n })
    end

    -- matvec: v [k] @ W1 [n, k]ᵀ → [n] @ W2 [k, n]ᵀ → [k] ..., weights as llama2 stores them
    local mv_sizes = gpu and (q and { { 4096, 4096 } } or { { 768, 288 }, { 4096, 4096 }, { 11008, 4096 }, { 32000, 4096 } })
        or (q and { { 768, 288 } } or { { 768, 288 }, { 2048, 768 }, { 4096, 4096 } })
    for _, s in ipairs(mv_sizes) do
        local n, k = s[1], s[2]
        local R = 8
        local header = string.format(table.concat({
            "$1 = ConstantTensor(v, float32, [%d]);",
            "$2 = ConstantTensor(w1, float32, [%d, %d]);",
            "$3 = ConstantTensor(w2, float32, [%d, %d]);",
            "$4 = PermuteNode($2, [1, 0]);",
            "$5 = PermuteNode($3, [1, 0]);" }, "\n"), k, n, k, k, n)
        local i = 0
        local script = chain_script(header, 5, R, function(p, id)
            i = i + 1
            return string.format("$%d = MatMulNode($%d, $%d);", id, p, i % 2 == 1 and 4 or 5)
        end)
        add({ op = "matvec", size = string.format("[%d]@[%d,%d]T", k, n, k), R = R, script = script,
            constants = { v = const("v", { k }, 1), w1 = const("w1", { n, k }, 1 / math.sqrt(k)),
                w2 = const("w2", { k, n }, 1 / math.sqrt(n)) },
            bytes = 4 * n * k })
    end

    -- matmul: [n, n] @ [n, n]
    local mm_sizes = gpu and (q and { 1024 } or { 1024, 2048, 4096, 8192 }) or (q and { 256 } or { 256, 1024 })
    for _, n in ipairs(mm_sizes) do
        local R = gpu and 4 or 2
        local script = chain_script(string.format(
            "$1 = ConstantTensor(x, float32, [%d, %d]);\n$2 = ConstantTensor(w, float32, [%d, %d]);",
            n, n, n, n), 2, R,
            function(p, id) return string.format("$%d = MatMulNode($%d, $2);", id, p) end)
        add({ op = "matmul", size = string.format("%d^3", n), R = R, script = script,
            constants = { x = const("x", { n, n }, 1), w = const("w", { n, n }, 1 / math.sqrt(n)) },
            flops = 2 * n * n * n })
    end
    return list
end

-- ---- main --------------------------------------------------------------------

math.randomseed(tonumber(os.getenv("MK_SEED")) or 20261122)
print(string.format("# bench_ops: moonkaas %s (%s); clock %s", mk.version, mk.build_info, clock_name))
if not cuda_ok then print("# CUDA: not available (" .. tostring(cuda_why) .. ")") end
print(string.format("%-5s %-9s %-22s %10s %10s %9s %7s", "dev", "op", "size", "us/op", "GB/s",
    "TFLOP/s", "of copy"))

for _, device in ipairs(opts.devices) do
    if device == "cuda" and not cuda_ok then
        print("cuda  skipped: " .. tostring(cuda_why))
    else
        local copy_gbs = 0
        for _, c in ipairs(cases_for(device)) do
            local row = run_case(device, c)
            if row then
                if c.is_copy and row.gbs > copy_gbs then copy_gbs = row.gbs end
                row.frac = (row.gbs and copy_gbs > 0) and row.gbs / copy_gbs or nil
                print(string.format("%-5s %-9s %-22s %10.1f %10s %9s %7s", device, c.op, c.size,
                    row.us, row.gbs and string.format("%.1f", row.gbs) or "",
                    row.tflops and string.format("%.2f", row.tflops) or "",
                    row.frac and string.format("%.0f%%", 100 * row.frac) or ""))
                io.stdout:flush()
            end
        end
        print(string.format("# %s copy bandwidth (best copy row, read + write): %.0f GB/s", device,
            copy_gbs))
    end
end
