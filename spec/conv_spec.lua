-- Bad inputs of the convolution and pooling ops: each a clear error naming the
-- user's Lua line, and nothing lost (the module builds and runs after it).
-- Their values are checked in spec/cases/conv.lua (ops_spec, gpu_spec).
local H = require "spec.helpers"
local mk = H.mk()
H.seed("conv_spec")

local function error_of(f)
    local ok, err = pcall(f)
    assert.is_false(ok, "expected an error")
    return tostring(err)
end

-- "spec/conv_spec.lua:12: ": the caller's line, as Lua names it.
local function here()
    local i = debug.getinfo(2, "Sl")
    return i.short_src .. ":" .. i.currentline .. ": "
end

local function starts(prefix, s)
    assert.are.equal(prefix, s:sub(1, #prefix), s)
end

local function mentions(s, ...)
    for _, part in ipairs({ ... }) do assert.is_truthy(s:find(part, 1, true), s) end
end

describe("convolution and pooling errors", function()
    local x = mk.input("x", "float32", { 1, 4, 6, 6 })

    it("a channel mismatch between x and the weights", function()
        local w = mk.input("w", "float32", { 8, 3, 3, 3 })
        local at = here(); local err = error_of(function() local y = x:conv2d(w); return y end)
        starts(at .. "shape error: Conv2dNode: the weights [8, 3, 3, 3] take 3 input channels", err)
        mentions(err, "x [1, 4, 6, 6] has 4")
        local wt = mk.input("wt", "float32", { 3, 2, 3, 3 })
        at = here(); err = error_of(function() local y = x:conv_transpose2d(wt); return y end)
        starts(at .. "shape error: ConvTranspose2dNode: the weights [3, 2, 3, 3] are for 3 input "
            .. "channels", err)
        local x1 = mk.input("x1", "float32", { 2, 5, 9 })
        at = here(); err = error_of(function() local y = x1:conv1d(mk.input("w1", "float32", { 4, 4, 3 })); return y end)
        starts(at .. "shape error: Conv1dNode: the weights [4, 4, 3] take 4 input channels", err)
    end)

    it("groups that do not divide the channels", function()
        local w = mk.input("w", "float32", { 6, 2, 3, 3 })
        local at = here(); local err = error_of(function() local y = x:conv2d(w, { groups = 3 }); return y end)
        starts(at .. "shape error: Conv2dNode: groups (3) must divide both the input channels (4", err)
        -- the output channels too: 6 weights rows in 4 groups
        at = here(); err = error_of(function() local y = x:conv2d(mk.input("w2", "float32", { 6, 1, 3, 3 }), { groups = 4 }); return y end)
        starts(at .. "shape error: Conv2dNode: groups (4) must divide", err)
        mentions(err, "output channels (6")
        at = here(); err = error_of(function() local y = x:conv2d(w, { groups = 0 }); return y end)
        starts(at .. "shape error: Conv2dNode: groups (0)", err)
        at = here(); err = error_of(function() local y = x:conv_transpose2d(mk.input("wt", "float32", { 4, 2, 3, 3 }), { groups = 3 }); return y end)
        starts(at .. "shape error: ConvTranspose2dNode: groups (3) must divide the input channels", err)
    end)

    it("a window larger than its padded input", function()
        local w = mk.input("w", "float32", { 2, 4, 7, 3 })
        local at = here(); local err = error_of(function() local y = x:conv2d(w); return y end)
        starts(at .. "shape error: Conv2dNode: the height window (7 with dilation 1: 7) is larger "
            .. "than the padded input (6 + 2 * 0 = 6)", err)
        -- padding makes it fit; dilation makes it too large again
        assert.are.same({ 1, 2, 2, 6 }, x:conv2d(w, { padding = 1 }).shape)
        at = here(); err = error_of(function() local y = x:conv2d(w, { padding = 1, dilation = { 1, 4 } }); return y end)
        starts(at .. "shape error: Conv2dNode: the width window (3 with dilation 4: 9)", err)
        at = here(); err = error_of(function() local y = x:max_pool2d(7); return y end)
        starts(at .. "shape error: MaxPool2dNode: the height window (7", err)
        at = here(); err = error_of(function() local y = x:avg_pool2d(3, { padding = 2 }); return y end)
        starts(at .. "shape error: AvgPool2dNode: the padding (2, 2) must be at most half the "
            .. "window (3, 3)", err)
    end)

    it("the wrong rank", function()
        local w = mk.input("w", "float32", { 2, 4, 3, 3 })
        local x3 = mk.input("x3", "float32", { 4, 6, 6 })
        local at = here(); local err = error_of(function() local y = x3:conv2d(w); return y end)
        starts(at .. "shape error: Conv2dNode: x ('x3') must be [N, C, H, W] (rank 4), not [4, 6, 6]", err)
        at = here(); err = error_of(function() local y = x:conv1d(mk.input("w1", "float32", { 2, 4, 3 })); return y end)
        starts(at .. "shape error: Conv1dNode: x ('x') must be [N, C, L] (rank 3)", err)
        at = here(); err = error_of(function() local y = x:conv2d(mk.input("w3", "float32", { 2, 4, 3 })); return y end)
        starts(at .. "shape error: Conv2dNode: the weights ('w3') must be [O, C/groups, kH, kW]", err)
        for _, f in ipairs({
            function() local y = x3:max_pool2d(2); return y end, function() local y = x3:avg_pool2d(2); return y end,
            function() local y = x3:adaptive_avg_pool2d(1); return y end,
            function() local y = x3:upsample_nearest2d({ scale_factor = 2 }); return y end,
        }) do
            mentions(error_of(f), "shape error:", "must be [N, C, H, W] (rank 4), not [4, 6, 6]")
        end
    end)

    it("dtypes, strides, output padding and options", function()
        local xi = mk.input("xi", "int64", { 1, 4, 6, 6 })
        local w = mk.input("w", "float32", { 2, 4, 3, 3 })
        local at = here(); local err = error_of(function() local y = xi:conv2d(w); return y end)
        starts(at .. "dtype error: Conv2dNode: x ('xi') must be float32, not int64", err)
        at = here(); err = error_of(function() local y = x:conv2d(w, { stride = 0 }); return y end)
        starts(at .. "shape error: Conv2dNode: the stride is 0 (must be 1 or more)", err)
        at = here(); err = error_of(function() local y = x:conv2d(w, { padding = { 1, -1 } }); return y end)
        starts(at .. "shape error: Conv2dNode: the padding is -1 (must be 0 or more)", err)
        at = here(); err = error_of(function() local y = x:conv_transpose2d(mk.input("wt", "float32", { 4, 2, 3, 3 }), { stride = 2, output_padding = 2 }); return y end)
        starts(at .. "shape error: ConvTranspose2dNode: the output padding (2, 2) must be", err)
        at = here(); err = error_of(function() local y = x:conv2d(w, { stride = "2" }); return y end)
        starts(at .. "argument error: conv2d: stride must be an integer or a list of 2 integers", err)
        at = here(); err = error_of(function() local y = x:conv2d(w, { strides = 2 }); return y end)
        starts(at .. "argument error: conv2d: unknown option 'strides'", err)
        at = here(); err = error_of(function() local y = x:max_pool2d(2, { ceil_mode = true }); return y end)
        starts(at .. "argument error: max_pool2d: unknown option 'ceil_mode'", err)
        at = here(); err = error_of(function() local y = x:upsample_nearest2d({ scale_factor = 1.5 }); return y end)
        starts(at .. "argument error: upsample_nearest2d: scale_factor must be an integer", err)
        at = here(); err = error_of(function() local y = x:upsample_nearest2d({}); return y end)
        starts(at .. "argument error: upsample_nearest2d: give one of size and scale_factor", err)
        at = here(); err = error_of(function() local y = x:adaptive_avg_pool2d({ 0, 2 }); return y end)
        starts(at .. "shape error: AdaptiveAvgPool2dNode: the output size (0, 2) must be positive", err)
    end)

    it("a script's error names its line; the module stays usable", function()
        local text = "$1 = InputTensor(x, float32, [1, 3, 4, 4]);\n"
            .. "$2 = InputTensor(w, float32, [2, 3, 5, 5]);\n"
            .. "$3 = Conv2dNode($1, $2, 1, 1, 0, 0, 1, 1, 1);\nresult = $3;\n"
        local err = error_of(function() local y = mk.compile_script(text); return y end)
        mentions(err, "script:3:", "shape error: Conv2dNode: the height window (5")
        -- the same script with a padding compiles and runs
        local ok = text:gsub("1, 1, 0, 0, 1, 1, 1", "1, 1, 1, 1, 1, 1, 1")
        local m = mk.compile_script(ok)
        assert.is_truthy(m)
        local xt = H.rand({ 1, 3, 4, 4 })
        local wt = H.rand({ 2, 3, 5, 5 })
        assert.are.same({ 1, 2, 2, 2 }, m:run({ x = xt, w = wt }).shape)
    end)

    -- oneDNN is chosen in the environment when a model compiles, so each path
    -- runs in a child process; im2col's result is the reference
    local CHILD = [==[
local mk = require "moonkaas"
local logged = ""
mk.on_log(function(level, message) logged = logged .. message .. "\n" end)
math.randomseed(SEED)
local function rand(shape)
    local n, t = 1, {}
    for _, d in ipairs(shape) do n = n * d end
    for i = 1, n do t[i] = math.random() * 2 - 1 end
    return mk.tensor(t, "float32", shape)
end
local x = mk.input("x", "float32", { 2, 6, 9, 7 })
local w, b = rand({ 4, 3, 3, 2 }), rand({ 4 })
local y = x:conv2d(w, { stride = { 2, 1 }, padding = 1, dilation = { 1, 2 }, groups = 2, bias = b })
local out = mk.compile(y):run({ x = rand({ 2, 6, 9, 7 }) })
local f = io.open(PATH, "w")
local n = 1
for _, d in ipairs(out.shape) do n = n * d end
for _, v in ipairs(out:reshape({ n }):totable()) do f:write(string.format("%.9g\n", v)) end
f:close()
local maps = io.open("/proc/self/maps"):read("a")
print("dnnl_mapped=" .. tostring(maps:find("libdnnl", 1, true) ~= nil))
print("log=" .. (logged:match("[^\n]*im2col[^\n]*") or ""))
print("done=true")
]==]

    local function run_path(env)
        local path = os.tmpname()
        local seed = math.random(1, 1000000)
        local r = H.run_lua("env " .. env .. " lua5.4",
            string.format("SEED = %d\nPATH = %q\n", seed, path), CHILD)
        local values = {}
        for line in io.lines(path) do values[#values + 1] = tonumber(line) end
        os.remove(path)
        return r, values
    end

    it("oneDNN's convolution where asked, im2col where oneDNN cannot be opened", function()
        local seed = math.random(1, 1000000)
        math.randomseed(seed) -- the same inputs in each child: SEED below
        local r0, ref = run_path("MK_CPU_CONV=im2col")
        assert.are.equal("true", r0.done, r0.output)
        assert.are.equal("false", r0.dnnl_mapped, "im2col must not map oneDNN")
        math.randomseed(seed)
        local r1, got = run_path("MK_CPU_CONV=dnnl")
        assert.are.equal("true", r1.done, r1.output)
        if r1.dnnl_mapped == "true" then
            assert.are.equal("", r1.log, "oneDNN refused the convolution")
            assert.are.equal(#ref, #got)
            for i = 1, #ref do
                assert.is_true(math.abs(got[i] - ref[i]) <= 1e-5 + 1e-5 * math.abs(ref[i]),
                    string.format("element %d: oneDNN %.9g, im2col %.9g", i, got[i], ref[i]))
            end
        else -- no libdnnl on this machine: the fallback, with its reason
            assert.is_truthy(r1.log:find("runs on im2col", 1, true), r1.output)
        end
        math.randomseed(seed)
        local r2, fallback = run_path("MK_CPU_CONV=dnnl MK_DNNL=/nonexistent/libdnnl.so.2")
        assert.are.equal("true", r2.done, r2.output)
        assert.are.equal("false", r2.dnnl_mapped)
        assert.is_truthy(r2.log:find("runs on im2col and sgemm: oneDNN cannot be opened", 1, true),
            r2.output)
        assert.are.same(ref, fallback)
    end)

    -- every convolution case of spec/cases/conv.lua on each CPU path, forced
    local CASES = [==[
local H = require "spec.helpers"
math.randomseed(SEED)
local n, fallbacks, chained, winograd = 0, 0, 0, 0
H.mk().on_log(function(level, message)
    if message:find("runs on im2col", 1, true) then fallbacks = fallbacks + 1 end
    if message:find("stay in oneDNN's layout", 1, true) then chained = chained + 1 end
    if message:find("runs on Winograd", 1, true) then winograd = winograd + 1 end
end)
for _, case in ipairs(H.family_cases()) do
    if case.name:find("^Conv") then
        local out = H.mk().compile(case.output):run(case.feeds)
        local ok, err = pcall(H.assert_close, out, case.want, case.atol, case.rtol)
        if not ok then error(case.name .. ": " .. tostring(err), 0) end
        n = n + 1
    end
end
local maps = io.open("/proc/self/maps"):read("a")
print("dnnl_mapped=" .. tostring(maps:find("libdnnl", 1, true) ~= nil))
print("checked=" .. n)
print("fallbacks=" .. fallbacks)
print("chained=" .. chained)
print("winograd=" .. winograd)
print("done=true")
]==]

    -- oneDNN 2.6.3's AVX-512 kernels crashed on small cases on a Xeon with
    -- AMX: it runs at most AVX2 unless the environment names its instruction set
    it("oneDNN runs at most AVX2, or what ONEDNN_MAX_CPU_ISA names", function()
        local CHILD = [==[
local mk = require "moonkaas"
local x = mk.input("x", "float32", { 1, 3, 8, 8 })
local w, xs = {}, {}
for i = 1, 108 do w[i] = i / 100 end
for i = 1, 192 do xs[i] = i / 100 end
local m = mk.compile(x:conv2d(mk.tensor(w, "float32", { 4, 3, 3, 3 })))
m:run({ x = mk.tensor(xs, "float32", { 1, 3, 8, 8 }) })
local maps = io.open("/proc/self/maps"):read("a")
print("dnnl_mapped=" .. tostring(maps:find("libdnnl", 1, true) ~= nil))
]==]
        for _, env in ipairs({ "", "ONEDNN_MAX_CPU_ISA=SSE41" }) do
            local r = H.run_lua("env ONEDNN_VERBOSE=1 MK_CPU_CONV=dnnl " .. env .. " lua5.4", "", CHILD)
            if r.dnnl_mapped ~= "true" then return pending("oneDNN is not installed here") end
            local isa = r.output:match("onednn_verbose,info,cpu,isa:([^\n]*)")
            assert.is_truthy(isa, r.output)
            if env == "" then
                assert.is_nil(isa:find("AVX-512", 1, true), isa)
            else
                assert.is_truthy(isa:find("SSE4.1", 1, true), isa)
            end
        end
    end)

    -- by default (no $MK_CPU_CONV) the rule of core/cpu/winograd.c chooses:
    -- Winograd for 64 channels 3 x 14, oneDNN (or im2col) for a 7x7 result
    -- and for 512 output channels
    local RULE = [==[
local H = require "spec.helpers"
local mk = H.mk()
math.randomseed(SEED)
local logged = ""
mk.on_log(function(level, message) logged = logged .. message .. "\n" end)
local x = mk.input("x", "float32", { 1, 64, 3, 14 })
local w, wr = H.rand({ 64, 64, 3, 3 })
local xt, xr = H.rand({ 1, 64, 3, 14 })
local out = mk.compile(x:conv2d(w, { padding = 1 })):run({ x = xt })
print("small=" .. select(2, logged:gsub("runs on Winograd", "")))
-- the product by its definition, in double precision
local worst = 0
local o_data = out:reshape({ 64 * 3 * 14 }):totable()
for o = 0, 63 do
    for oy = 0, 2 do
        for ox = 0, 13 do
            local acc = 0
            for c = 0, 63 do
                for ki = 0, 2 do
                    for kj = 0, 2 do
                        local iy, ix = oy - 1 + ki, ox - 1 + kj
                        if iy >= 0 and iy < 3 and ix >= 0 and ix < 14 then
                            acc = acc + xr.data[(c * 3 + iy) * 14 + ix + 1]
                                * wr.data[((o * 64 + c) * 3 + ki) * 3 + kj + 1]
                        end
                    end
                end
            end
            local got = o_data[(o * 3 + oy) * 14 + ox + 1]
            worst = math.max(worst, math.abs(got - acc) / (1e-4 + 1e-4 * math.abs(acc)))
        end
    end
end
print("worst=" .. worst)
-- a 7x7 result (half of each tile vector's lanes past the row), and 512
-- output channels (too few tiles per block for U's stream)
logged = ""
mk.compile(mk.input("x", "float32", { 1, 64, 7, 7 }):conv2d(H.rand({ 64, 64, 3, 3 }),
    { padding = 1 }))
mk.compile(x:conv2d(H.rand({ 512, 64, 3, 3 }), { padding = 1 }))
print("large=" .. select(2, logged:gsub("runs on Winograd", "")))
print("done=true")
]==]

    it("Winograd by default where its rule measured it faster", function()
        local r = H.run_lua("env -u MK_CPU_CONV lua5.4",
            string.format("SEED = %d\n", math.random(1, 1000000)), RULE)
        assert.are.equal("true", r.done, r.output)
        assert.are.equal("1", r.small, r.output)
        assert.are.equal("0", r.large, r.output)
        assert.is_true(tonumber(r.worst) <= 1, r.output)
    end)

    it("each CPU path computes every convolution case", function()
        -- winograd twice: as the thread rule says, and split over two
        -- threads at every launch (its blocks of tiles, one buffer a thread)
        local runs = { "im2col", "dnnl", "winograd",
            "winograd MK_CPU_FORK=always OMP_NUM_THREADS=2" }
        for _, run in ipairs(runs) do
            local path = run:match("^%S+")
            local r = H.run_lua("env MK_CPU_CONV=" .. run .. " lua5.4",
                string.format("SEED = %d\n", math.random(1, 1000000)), CASES)
            assert.are.equal("true", r.done, path .. ":\n" .. r.output)
            assert.is_true(tonumber(r.checked) >= 10, r.output)
            if path == "im2col" then assert.are.equal("false", r.dnnl_mapped) end
            -- Winograd takes every 3x3 window of stride 1 where forced (the
            -- six 3x3 cases, three or more of each chain case), none else
            if path == "winograd" then
                assert.is_true(tonumber(r.winograd) >= 18, r.output)
            else
                assert.are.equal("0", r.winograd, r.output)
            end
            -- with oneDNN on this machine, it takes every other case (no
            -- fallback to im2col), and the chain cases hand results on in
            -- its layout (past Winograd's launches, which read and write NCHW)
            if r.dnnl_mapped == "true" then
                assert.are.equal("0", r.fallbacks, r.output)
                if path == "dnnl" then assert.is_true(tonumber(r.chained) >= 1, r.output) end
            else
                assert.are.equal("0", r.chained, r.output)
            end
        end
    end)
end)
