-- Steady frame times on the CPU: the compile option `threads`, and a small
-- model that never starts an OpenMP worker. A worker that exists spins after
-- each parallel region and takes a core from the host's frame; libgomp starts
-- its workers at the first region that asks for more than one thread, so a
-- process whose thread count stays 1 (/proc/self/status) opened none. Those
-- cases run a child lua5.4 process, so that no other spec's threads count.
local H = require "spec.helpers"
local mk = require "moonkaas"
local seed = H.seed("cpu_frames_spec")

local LUA = os.getenv("LUA") or "lua5.4"

-- values uniform in ±[0.1, 1)
local function rand(rows, cols, scale)
    local t = {}
    for i = 1, rows do
        t[i] = {}
        for j = 1, cols do
            local v = (0.1 + 0.9 * math.random()) * (scale or 1)
            t[i][j] = math.random(2) == 1 and v or -v
        end
    end
    return t
end

-- relu(x @ w + b), x [1, K], w [K, N]: one matrix–vector group whose work is
-- enough for threads where its launch may fork
local K, N = 512, 512
local X, W, B = mk.tensor(rand(1, K)):totable(), mk.tensor(rand(K, N, 1 / 16)):totable(),
    mk.tensor(rand(1, N)):totable()
local function layer()
    local x = mk.input("x", "float32", { 1, K })
    return (x:matmul(mk.constant(mk.tensor(W), "w")) + mk.constant(mk.tensor(B), "b")):relu()
end

-- compiles with opts, runs X; returns the output's values and the CPU's log line
local function run(opts)
    local line
    mk.on_log(function(_, message) if message:find("^cpu: ") then line = message end end)
    local ok, model = pcall(mk.compile, layer(), opts)
    mk.on_log(nil)
    assert(ok, model)
    local y = model:run({ x = mk.tensor(X) }):totable()[1]
    model:close()
    return y, line
end

local function online_cpus()
    local p = assert(io.popen("getconf _NPROCESSORS_ONLN"))
    local n = tonumber(p:read("a"))
    p:close()
    return n or 1
end

-- A child that builds a model, runs it 200 times and prints its thread count.
local CHILD = [==[
local mk = require "moonkaas"
local function threads()
    local f = io.open("/proc/self/status")
    if not f then return "unknown" end
    local n = f:read("a"):match("\nThreads:%s*(%d+)")
    f:close()
    return n or "unknown"
end
local log = ""
mk.on_log(function(_, message) log = log .. message .. " | " end)
local function layer(x, fan_in, fan_out, relu)
    local w, b = {}, {}
    for i = 1, fan_in do
        w[i] = {}
        for j = 1, fan_out do w[i][j] = ((i * 7 + j * 3) % 11 - 5) / (8 * fan_in) end
    end
    for j = 1, fan_out do b[j] = (j % 5 - 2) / 10 end
    local y = x:matmul(mk.constant(mk.tensor(w))) + mk.constant(mk.tensor({ b }))
    return relu and y:relu() or y
end
local obs = mk.input("obs", "float32", { 1, SIZES[1] })
local h = obs
for l = 1, #SIZES - 1 do h = layer(h, SIZES[l], SIZES[l + 1], l < #SIZES - 1) end
local t0 = mk.clock()
local model = mk.compile(h, OPTS)
print(string.format("compile_ms=%.3f", (mk.clock() - t0) * 1e3))
local x = mk.zeros("float32", { 1, SIZES[1] })
for j = 1, SIZES[1] do x:set(1, j, math.sin(j)) end
local out = mk.zeros("float32", { 1, SIZES[#SIZES] })
for _ = 1, 200 do model:run({ obs = x }, out) end
print("threads=" .. threads())
print("log=" .. log)
print("done=true")
]==]

local function run_child(env, sizes, opts)
    return H.run_lua(string.format("env -u OMP_NUM_THREADS %s %s", env, LUA),
                     string.format("SIZES = %s\nOPTS = %s\n", sizes, opts), CHILD)
end

local function has_proc()
    local f = io.open("/proc/self/status")
    if f then f:close() end
    return f ~= nil
end

describe("CPU threads option", function()
    it("threads = 1, 2, 7 give the default's results bit for bit, and the right values", function()
        local want = {}
        for j = 1, N do
            local s = B[1][j]
            for k = 1, K do s = s + X[1][k] * W[k][j] end
            want[j] = s > 0 and s or 0
        end
        local default = run({})
        for j = 1, N do
            assert.is_true(math.abs(default[j] - want[j]) <= 1e-5 + 1e-5 * math.abs(want[j]),
                string.format("out[%d] = %.9g, want %.9g", j, default[j], want[j]))
        end
        for _, n in ipairs({ 1, 2, 7 }) do
            local got = run({ threads = n })
            for j = 1, N do
                assert.are.equal(default[j], got[j], string.format("threads = %d, out[%d]", n, j))
            end
        end
    end)

    it("threads = 1: the compile's log says no launch opens a parallel region", function()
        local _, line = run({ threads = 1 })
        assert.truthy(line and line:find("^cpu: 0 of %d+ launches may use threads %(the model's threads = 1"),
            tostring(line))
    end)

    it("threads = n caps the launches' threads at n", function()
        local omp = tonumber(os.getenv("OMP_NUM_THREADS") or "")
        if online_cpus() < 2 or (omp and omp < 2) then return end
        local _, line = run({ threads = 2 })
        assert.truthy(line and line:find("may use 2 threads"), tostring(line))
    end)

    it("bad values are argument errors", function()
        for _, bad in ipairs({ -1, 1.5, "2", true, 2 ^ 40 }) do
            local ok, err = pcall(mk.compile, layer(), { threads = bad })
            assert.is_false(ok)
            assert.truthy(tostring(err):find("argument error: compile: threads must be 0 %(the default%) or a positive integer, got "),
                tostring(err))
        end
        -- the context is usable afterwards
        assert.are.equal(N, #run({ threads = 1 }))
    end)
end)

describe("CPU frames", function()
    it("a policy MLP 64-256-256-8 by default: one thread, no OpenMP worker ever started", function()
        if not has_proc() then return end
        local r = run_child("", "{ 64, 256, 256, 8 }", "{}")
        assert.are.equal(0, r.status, r.output)
        assert.are.equal("true", r.done, r.output)
        assert.are.equal("1", r.threads, r.output)
        print("# policy MLP, first compile in a process: " .. r.compile_ms .. " ms")
    end)

    it("threads = 1 starts no worker even where every launch may fork (MK_CPU_FORK=always)", function()
        if not has_proc() then return end
        local r = run_child("MK_CPU_FORK=always", "{ 512, 512, 512 }", "{ threads = 1 }")
        assert.are.equal(0, r.status, r.output)
        assert.are.equal("true", r.done, r.output)
        assert.are.equal("1", r.threads, r.output)
        if online_cpus() > 1 then -- the same model with the default does start them
            local d = run_child("MK_CPU_FORK=always", "{ 512, 512, 512 }", "{}")
            assert.are.equal("true", d.done, d.output)
            assert.is_true(tonumber(d.threads) > 1, d.output)
        end
    end)
end)
