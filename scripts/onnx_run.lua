-- onnx_run.lua — runs an ONNX file once (or --bench N times) and prints its
-- outputs' shapes and first values.
--
--   lua scripts/onnx_run.lua model.onnx [--input name=file.safetensors]...
--       [--shape name=1,3,224,224]... [-d cpu|cuda] [--bench N] [--seed S]
--
-- An input without --input gets uniform values in [-1, 1) (int64: integers in
-- [0, 10)) from the seed (default 1). --input takes the tensor of that name in
-- the file, or its only tensor. --shape fixes an input's symbolic dims. With
-- --bench N it runs N more times after one to warm up, each timed alone, and
-- prints p50 and p99 latency in milliseconds. --load-times also times
-- mk.load_onnx (import and compile) cold, with the kernel cache off
-- (kernel_cache = false: CUDA compiles every generated kernel with NVRTC), and
-- warm, after a load that filled the cache.

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local mk = require("moonkaas")

local USAGE = "usage: lua scripts/onnx_run.lua model.onnx [--input name=file.safetensors]... "
    .. "[--shape name=d1,d2,...]... [-d cpu|cuda] [--bench N] [--seed S] [--load-times]\n"

local function fail(msg)
    io.stderr:write("onnx_run: ", msg, "\n", USAGE)
    os.exit(1)
end

local function parse(argv)
    local o = { inputs = {}, shapes = {}, device = "cpu", seed = 1 }
    local i = 1
    while i <= #argv do
        local a, v = argv[i], argv[i + 1]
        if a == "-h" or a == "--help" then io.write(USAGE); os.exit(0)
        elseif a == "--input" and v then
            local name, file = v:match("^([^=]+)=(.+)$")
            if not name then fail("--input takes name=file.safetensors") end
            o.inputs[name] = file
            i = i + 1
        elseif a == "--shape" and v then
            local name, dims = v:match("^([^=]+)=([%d,]+)$")
            if not name then fail("--shape takes name=d1,d2,...") end
            local shape = {}
            for d in dims:gmatch("%d+") do shape[#shape + 1] = math.tointeger(tonumber(d)) end
            o.shapes[name] = shape
            i = i + 1
        elseif a == "-d" and (v == "cpu" or v == "cuda") then o.device = v; i = i + 1
        elseif a == "--bench" and v and tonumber(v) then
            o.bench = math.tointeger(tonumber(v))
            if not o.bench or o.bench < 1 then fail("--bench takes a positive count") end
            i = i + 1
        elseif a == "--load-times" then o.load_times = true
        elseif a == "--seed" and v and tonumber(v) then o.seed = math.tointeger(tonumber(v)); i = i + 1
        elseif a:sub(1, 1) == "-" then fail("unknown or incomplete option " .. a)
        elseif not o.model then o.model = a
        else fail("one model only") end
        i = i + 1
    end
    if not o.model then fail("no model given") end
    return o
end

local function read_input(name, path, info)
    local tensors = mk.load_safetensors(path)
    local t = tensors[name]
    if not t then
        local only, count = nil, 0
        for _, v in pairs(tensors) do only, count = v, count + 1 end
        if count ~= 1 then fail(path .. " has no tensor '" .. name .. "' (and not one only)") end
        t = only
    end
    return t:copy():reshape(info.shape)
end

local function random_input(info)
    local n = 1
    for _, d in ipairs(info.shape) do n = n * d end
    local data = {}
    for i = 1, n do
        data[i] = info.dtype == "int64" and math.random(0, 9) or math.random() * 2 - 1
    end
    return mk.tensor(data, info.dtype == "int64" and "int64" or "float32", info.shape):to(info.dtype)
end

local function first_values(t, k)
    local out = {}
    for i = 1, math.min(k, t.numel) do out[i] = string.format("%.6g", t:get(i)) end
    return table.concat(out, " ") .. (t.numel > k and " ..." or "")
end

local function main(argv)
    local o = parse(argv)
    math.randomseed(o.seed)
    if o.load_times then
        -- cold: no cache read or written; then one load to fill the cache; then warm
        local function timed(cache)
            local t0 = mk.clock()
            local lm = mk.load_onnx(o.model, { shapes = o.shapes, device = o.device,
                                               kernel_cache = cache })
            local ms = (mk.clock() - t0) * 1e3
            lm:close()
            return ms
        end
        local cold = timed(false)
        timed(true)
        print(string.format("load_onnx (import + compile): cold %.1f ms, kernel cache warm %.1f ms",
                            cold, timed(true)))
    end
    local m = mk.load_onnx(o.model, { shapes = o.shapes, device = o.device })
    local feeds = {}
    for _, info in ipairs(m:inputs()) do
        feeds[info.name] = o.inputs[info.name] and read_input(info.name, o.inputs[info.name], info)
            or random_input(info)
        o.inputs[info.name] = nil
    end
    for name in pairs(o.inputs) do fail("the model has no input '" .. name .. "'") end
    print(string.format("%s: opset %d on %s", o.model, m.opset, o.device))
    local outs = m:run(feeds)
    for _, info in ipairs(m:outputs()) do
        local t = outs[info.name]
        print(string.format("%s %s [%s]: %s", info.name, t.dtype, table.concat(t.shape, ", "),
                            first_values(t, 8)))
    end
    if o.bench then
        local times = {}
        for i = 1, o.bench do
            local t0 = mk.clock()
            m:run(feeds)
            times[i] = (mk.clock() - t0) * 1e3
        end
        table.sort(times)
        local function pct(p) return times[math.max(1, math.ceil(p * #times))] end
        print(string.format("bench %d runs: p50 %.4f ms p99 %.4f ms", o.bench, pct(0.5), pct(0.99)))
    end
    m:close()
end

local ok, err = pcall(main, arg)
if not ok then
    io.stderr:write("onnx_run: ", tostring(err), "\n")
    os.exit(1)
end
