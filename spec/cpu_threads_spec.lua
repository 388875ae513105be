-- The CPU device asks OpenMP for at most as many threads as the machine has
-- CPUs online, whatever OMP_NUM_THREADS says: libgomp ends the whole process
-- ("Thread creation failed") when it cannot create a team's threads, which
-- moonkaas.h promises never happens. Each case runs a child lua5.4 process
-- with OMP_NUM_THREADS=60000 (and MK_CPU_FORK=always, so that every launch
-- that may fork does): it compiles and runs a model whose launches open
-- parallel regions (a pointwise launch of 40,960 elements, a matrix-vector
-- group whose per-thread table is sized by the thread count, a product of 80
-- rows through OpenBLAS), checks the values against plain-Lua loops in double
-- precision, and reads the thread count the compile logs.
local H = require "spec.helpers"
local seed = H.seed("cpu_threads_spec")

local LUA = os.getenv("LUA") or "lua5.4"

local CHILD = [==[
local mk = require "moonkaas"
math.randomseed(SEED)
local logged = ""
mk.on_log(function(level, message) logged = logged .. message .. " | " end)

-- values uniform in ±[0.1, 1)
local function rand(rows, cols)
    local t = {}
    for i = 1, rows do
        t[i] = {}
        for j = 1, cols do
            local v = 0.1 + 0.9 * math.random()
            t[i][j] = math.random(2) == 1 and v or -v
        end
    end
    return t
end
local function f32(t) return mk.tensor(t):totable() end
local worst = 0
local function check(got, want)
    local e = math.abs(got - want) / (1e-5 + 1e-5 * math.abs(want))
    if e > worst then worst = e end
end

-- pointwise: relu(x * s + b), x [256, 160]
local X, S, B = f32(rand(256, 160)), f32(rand(1, 160)), f32(rand(1, 160))
local x = mk.input("x", "float32", { 256, 160 })
local pw <close> = mk.compile((x * mk.constant(mk.tensor(S), "s") + mk.constant(mk.tensor(B), "b")):relu())
local got = pw:run({ x = mk.tensor(X) }):totable()
for i = 1, 256 do
    for j = 1, 160 do
        local v = X[i][j] * S[1][j] + B[1][j]
        check(got[i][j], v > 0 and v or 0)
    end
end

-- a product of `rows` rows: a [rows, 160] @ w [160, 300] + c (one row: a
-- matrix-vector group; 80 rows: OpenBLAS)
local function product(rows)
    local A, W, C = f32(rand(rows, 160)), f32(rand(160, 300)), f32(rand(1, 300))
    local a = mk.input("a", "float32", { rows, 160 })
    local model <close> = mk.compile(a:matmul(mk.constant(mk.tensor(W), "w")) + mk.constant(mk.tensor(C), "c"))
    local y = model:run({ a = mk.tensor(A) }):totable()
    for i = 1, rows do
        for j = 1, 300 do
            local s = C[1][j]
            for k = 1, 160 do s = s + A[i][k] * W[k][j] end
            check(y[i][j], s)
        end
    end
end
product(1)
product(80)
print("worst=" .. worst)
print("threads=" .. (logged:match("may use (%d+) threads") or "none"))
print("log=" .. logged)
print("done=true")
]==]

-- Runs CHILD in a fresh interpreter with `env` ("NAME=value ...") and returns
-- its "key=value" lines as a table, its output and its exit status.
local function run_child(env)
    return H.run_lua(string.format("env %s %s", env, LUA), string.format("SEED = %d\n", seed), CHILD)
end

local function online_cpus()
    local p = assert(io.popen("getconf _NPROCESSORS_ONLN"))
    local n = tonumber(p:read("a"))
    p:close()
    return n
end

-- A model compiled with threads = 1 whose product of 80 rows runs through
-- OpenBLAS: the process's thread count (/proc/self/task) before the compile
-- and after the run, and the values against plain-Lua loops.
local ONE = [==[
local mk = require "moonkaas"
math.randomseed(SEED)
local function tasks()
    local p = assert(io.popen("ls /proc/" .. assert(io.open("/proc/self/stat")):read("n") .. "/task | wc -l"))
    local n = p:read("n")
    p:close()
    return n
end
local A, W = {}, {}
for i = 1, 80 do A[i] = {} for k = 1, 160 do A[i][k] = math.random() - 0.5 end end
for k = 1, 160 do W[k] = {} for j = 1, 300 do W[k][j] = math.random() - 0.5 end end
A, W = mk.tensor(A):totable(), mk.tensor(W):totable()
local before = tasks()
local a = mk.input("a", "float32", { 80, 160 })
local model <close> = mk.compile(a:matmul(mk.constant(mk.tensor(W), "w")), { threads = 1 })
local y = model:run({ a = mk.tensor(A) }):totable()
print("tasks_before=" .. before)
print("tasks_after=" .. tasks())
local worst = 0
for i = 1, 80 do
    for j = 1, 300 do
        local s = 0
        for k = 1, 160 do s = s + A[i][k] * W[k][j] end
        worst = math.max(worst, math.abs(y[i][j] - s) / (1e-5 + 1e-5 * math.abs(s)))
    end
end
local maps = assert(io.open("/proc/self/maps")):read("a")
print("blas=" .. (maps:find("openblas-openmp/", 1, true) and "openmp" or "other"))
print("worst=" .. worst)
print("done=true")
]==]

describe("CPU threads", function()
    it("threads = 1 starts no thread, OpenBLAS's products included (its OpenMP build)", function()
        local r = H.run_lua(string.format("env MK_CPU_FORK=always %s", LUA), string.format("SEED = %d\n", seed), ONE)
        assert.are.equal("true", r.done, r.output)
        if r.blas ~= "openmp" then return pending("OpenBLAS's OpenMP build is not installed here") end
        assert.is_true(tonumber(r.worst) <= 1, r.output)
        assert.are.equal(r.tasks_before, r.tasks_after, r.output)
    end)

    it("with OMP_NUM_THREADS=60000, at most one per online CPU: the process lives, the values are right", function()
        local r = run_child("OMP_NUM_THREADS=60000 MK_CPU_FORK=always")
        assert.are.equal(0, r.status, "the child died:\n" .. r.output)
        assert.are.equal("true", r.done, "the child did not finish:\n" .. r.output)
        assert.is_true(tonumber(r.worst) <= 1, r.output)
        local cpus = online_cpus()
        if cpus and cpus > 1 then
            -- one CPU: nothing forks and the compile logs no thread count
            local threads = tonumber(r.threads)
            assert.is_truthy(threads, r.output)
            assert.is_true(threads >= 2 and threads <= cpus,
                string.format("%s threads for %d CPUs:\n%s", r.threads, cpus, r.output))
        end
    end)

    it("with OMP_NUM_THREADS=1, one: nothing forks", function()
        local r = run_child("OMP_NUM_THREADS=1")
        assert.are.equal(0, r.status, "the child died:\n" .. r.output)
        assert.are.equal("true", r.done, r.output)
        assert.is_true(tonumber(r.worst) <= 1, r.output)
        assert.are.equal("none", r.threads, r.output)
    end)
end)
