-- spec/host_script.lua — run by spec/c/lua_host_test.c inside its own
-- lua_State, where moonkaas.core is linked in and registered with
-- luaL_requiref. Builds a small network, compiles and runs it, checks the
-- values against plain Lua; raises on the first failure, returns the number
-- of checks made.
local mk = require "moonkaas"
local seed = HOST_SEED or os.time()
math.randomseed(seed)

local checks = 0
local function check(cond, ...)
    checks = checks + 1
    if not cond then error(string.format(...), 2) end
end

local function rand_matrix(rows, cols)
    local m = {}
    for i = 1, rows do
        m[i] = {}
        for j = 1, cols do m[i][j] = math.random() * 2 - 1 end
    end
    return mk.tensor(m)
end

-- y = relu(x @ w + b) @ v: a two-layer perceptron on a batch
local batch, n_in, hidden, n_out = 3, 5, 8, 2
local x = mk.input("x", "float32", { batch, n_in })
local w, b, v = rand_matrix(n_in, hidden), rand_matrix(1, hidden), rand_matrix(hidden, n_out)
local y = (x:matmul(mk.constant(w, "w")) + mk.constant(b, "b")):relu():matmul(mk.constant(v, "v"))
local script = mk.script(y)
check(script:find("MatMulNode", 1, true), "no MatMulNode in\n%s", script)

local model <close> = mk.compile(y)
for _ = 1, 3 do
    local xt = rand_matrix(batch, n_in)
    local out = model:run({ x = xt })
    check(out.dtype == "float32" and out.shape[1] == batch and out.shape[2] == n_out,
        "output %s", tostring(out))
    for i = 1, batch do
        local h = {}
        for j = 1, hidden do
            local s = b:get(1, j)
            for k = 1, n_in do s = s + xt:get(i, k) * w:get(k, j) end
            h[j] = math.max(s, 0)
        end
        for j = 1, n_out do
            local s = 0.0
            for k = 1, hidden do s = s + h[k] * v:get(k, j) end
            local got = out:get(i, j)
            check(math.abs(got - s) <= 1e-5 + 1e-5 * math.abs(s),
                "seed %d: out[%d][%d] = %.9g, expected %.9g", seed, i, j, got, s)
        end
    end
end

-- state kept by the model between runs: a counter in a buffer
local acc = mk.buffer("int64", { 1 })
local one = mk.input("one", "int64", { 1 })
local counter <close> = mk.compile(acc:replace(acc + one, 0, 1))
local inc = mk.tensor({ 1 }, "int64")
for n = 1, 5 do
    check(counter:run({ one = inc }):get(1) == n, "counter run %d", n)
end

local stats = model:stats()
check(stats.device == "cpu" and stats.arena_bytes >= stats.lower_bound_bytes, "stats")
return checks
