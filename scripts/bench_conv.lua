--[[
bench_conv.lua — the CPU's two convolution paths on ResNet-18's layer shapes
(batch 1, 224 x 224 input): im2col + OpenBLAS sgemm (core/cpu/conv.c) and
oneDNN (core/cpu/conv_dnnl.c, in its preferred blocked layout with x and the
result reordered around it at every run, the constant weights once at
compile, and in plain NCHW), on 1 and 2 threads. Prints the time per layer
for each path (milliseconds, the best of the runs: on a shared machine the
least disturbed one) and the whole set.

    lua5.4 scripts/bench_conv.lua [--runs N] [--rounds R] [--threads 1,2] [--paths im2col,dnnl,dnnl_plain,winograd]

(winograd: core/cpu/winograd.c on every 3x3 window of stride 1, oneDNN on
the rest.) Each (path, threads) pair runs in a child process, R rounds of them in
turn (the best over the rounds is printed, so that one busy moment of a
shared machine does not decide a cell) (the path is chosen by
$MK_CPU_CONV and $MK_DNNL_LAYOUT at compile; the threads by $OMP_NUM_THREADS
and $OPENBLAS_NUM_THREADS, which the libraries read when they start). One
model per layer: x [1, C, H, W] (an input, fed each run) conv2d with a
constant weight [O, C, k, k]; a warm-up run, then N timed runs.
FLOP per layer: 2 O C k² OH OW.
]]

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

-- name, C, O, k, stride, padding, H (= W) of the input
local layers = {
    { "stem 7x7/2 3->64", 3, 64, 7, 2, 3, 224 },
    { "layer1 3x3 64", 64, 64, 3, 1, 1, 56 },
    { "layer2 3x3/2 64->128", 64, 128, 3, 2, 1, 56 },
    { "layer2 3x3 128", 128, 128, 3, 1, 1, 28 },
    { "layer2 down 1x1/2", 64, 128, 1, 2, 0, 56 },
    { "layer3 3x3/2 128->256", 128, 256, 3, 2, 1, 28 },
    { "layer3 3x3 256", 256, 256, 3, 1, 1, 14 },
    { "layer3 down 1x1/2", 128, 256, 1, 2, 0, 28 },
    { "layer4 3x3/2 256->512", 256, 512, 3, 2, 1, 14 },
    { "layer4 3x3 512", 512, 512, 3, 1, 1, 7 },
    { "layer4 down 1x1/2", 256, 512, 1, 2, 0, 14 },
}

local usage = "usage: lua5.4 scripts/bench_conv.lua [--runs N] [--rounds R] [--threads 1,2] "
    .. "[--paths im2col,dnnl,dnnl_plain,winograd]"
local opts = { runs = 7, rounds = 1, threads = "1,2", paths = "im2col,dnnl,dnnl_plain", child = nil }
do
    local i = 1
    while arg and arg[i] do
        local a = arg[i]
        if a == "--runs" then opts.runs = tonumber(arg[i + 1]); i = i + 1
        elseif a == "--rounds" then opts.rounds = tonumber(arg[i + 1]); i = i + 1
        elseif a == "--threads" then opts.threads = arg[i + 1]; i = i + 1
        elseif a == "--paths" then opts.paths = arg[i + 1]; i = i + 1
        elseif a == "--child" then opts.child = true
        elseif a == "--help" then print(usage); os.exit(0)
        else io.stderr:write("unknown option " .. a .. "\n" .. usage .. "\n"); os.exit(1) end
        i = i + 1
    end
end

local function split(s)
    local t = {}
    for v in s:gmatch("[^,]+") do t[#t + 1] = v end
    return t
end

-- ---- child: time every layer on the path the environment chose -----------

if opts.child then
    local mk = require("moonkaas")
    math.randomseed(1)
    local function rand(n)
        local t = {}
        for i = 1, n do t[i] = math.random() - 0.5 end
        return t
    end
    for _, L in ipairs(layers) do
        local _, C, O, k, s, p, H = table.unpack(L)
        local x = mk.input("x", "float32", { 1, C, H, H })
        local w = mk.tensor(rand(O * C * k * k), "float32", { O, C, k, k })
        local model = mk.compile(x:conv2d(w, { stride = s, padding = p }))
        local feed = { x = mk.tensor(rand(C * H * H), "float32", { 1, C, H, H }) }
        model:run(feed)
        local times = {}
        for r = 1, opts.runs do
            local t0 = mk.clock()
            model:run(feed)
            times[r] = (mk.clock() - t0) * 1e3
        end
        table.sort(times)
        print(string.format("%s\t%.3f", L[1], times[1]))
    end
    os.exit(0)
end

-- ---- parent: one child per (path, threads) ----------------------------------

local env = {
    im2col = "MK_CPU_CONV=im2col",
    dnnl = "MK_CPU_CONV=dnnl",
    dnnl_plain = "MK_CPU_CONV=dnnl MK_DNNL_LAYOUT=plain",
    winograd = "MK_CPU_CONV=winograd",
}
local columns, results = {}, {}
for _, t in ipairs(split(opts.threads)) do
    for _, path in ipairs(split(opts.paths)) do
        columns[#columns + 1] = { name = path .. " x" .. t, path = path, threads = t }
        results[path .. " x" .. t] = {}
    end
end
for _ = 1, opts.rounds do
    for _, c in ipairs(columns) do
        local cmd = string.format("env %s OMP_NUM_THREADS=%s OPENBLAS_NUM_THREADS=%s %s %s "
            .. "--child --runs %d", env[c.path], c.threads, c.threads, arg[-1] or "lua5.4",
            arg[0], opts.runs)
        local pipe = io.popen(cmd)
        local r = results[c.name]
        for line in pipe:lines() do
            local layer, ms = line:match("^(.-)\t(.*)$")
            if layer then r[layer] = math.min(r[layer] or math.huge, tonumber(ms)) end
        end
        pipe:close()
    end
end
for k, c in ipairs(columns) do columns[k] = c.name end

io.write(string.format("%-24s", "layer (ms, best)"))
for _, c in ipairs(columns) do io.write(string.format("%14s", c)) end
io.write("\n")
local total = {}
for _, L in ipairs(layers) do
    io.write(string.format("%-24s", L[1]))
    for _, c in ipairs(columns) do
        local v = results[c][L[1]]
        total[c] = (total[c] or 0) + (v or 0)
        io.write(string.format("%14s", v and string.format("%.2f", v) or "-"))
    end
    io.write("\n")
end
io.write(string.format("%-24s", "all layers"))
for _, c in ipairs(columns) do io.write(string.format("%14.2f", total[c])) end
io.write("\n")
