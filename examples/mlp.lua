--[[
mlp.lua — a two-layer perceptron whose weights come from a safetensors file.

It writes the file first (random weights from a printed seed, as a training
program would save them), loads it with mk.load_safetensors, builds
relu(x @ W1 + b1) @ W2 + b2 in Lua, compiles it for the CPU, runs a batch and
checks every output against the same network computed in plain Lua.

    lua5.4 examples/mlp.lua [seed]       (from the repository root, after `make`)
]]

-- Run from a checkout: this tree's lua/ and build/ (MK_BUILD=dir for another build).
do
    local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
    local build = os.getenv("MK_BUILD")
    if not build or build == "" then build = root .. "/build" end
    package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
    package.cpath = build .. "/?.so;" .. package.cpath
end
local mk = require "moonkaas"

local seed = tonumber(arg[1]) or os.time()
math.randomseed(seed)
print("mlp.lua: seed " .. seed)

local IN, HIDDEN, OUT, BATCH = 16, 32, 4, 8

-- A [rows, cols] table of uniform values in [-scale, scale].
local function random_matrix(rows, cols, scale)
    local m = {}
    for i = 1, rows do
        m[i] = {}
        for j = 1, cols do m[i][j] = (2 * math.random() - 1) * scale end
    end
    return m
end

-- 1. Save the weights (float32), as a trainer would.
local path = os.tmpname()
mk.save_safetensors(path, {
    W1 = mk.tensor(random_matrix(IN, HIDDEN, 1 / math.sqrt(IN))),
    b1 = mk.tensor(random_matrix(1, HIDDEN, 0.1)),
    W2 = mk.tensor(random_matrix(HIDDEN, OUT, 1 / math.sqrt(HIDDEN))),
    b2 = mk.tensor(random_matrix(1, OUT, 0.1)),
})

-- 2. Load them: read-only tensors named as in the file.
local w = mk.load_safetensors(path)
os.remove(path) -- the tensors hold the bytes they need
print(string.format("loaded W1 [%s], W2 [%s]", table.concat(w.W1.shape, ", "), table.concat(w.W2.shape, ", ")))

-- 3. The network; constants keep their file's names in the script.
local x = mk.input("x", "float32", { BATCH, IN })
local h = (x:matmul(mk.constant(w.W1, "W1")) + mk.constant(w.b1, "b1")):relu()
local y = h:matmul(mk.constant(w.W2, "W2")) + mk.constant(w.b2, "b2")
local model = mk.compile(y, { device = "cpu" })

-- 4. Run a batch.
local xs = random_matrix(BATCH, IN, 1)
local out = model:run({ x = mk.tensor(xs) })

-- 5. The same network in plain Lua (double precision), from the loaded tensors.
local function dense(a, W, b, relu)
    local r = {}
    for i = 1, #a do
        r[i] = {}
        for j = 1, W.shape[2] do
            local s = b:get(1, j)
            for k = 1, #a[i] do s = s + a[i][k] * W:get(k, j) end
            r[i][j] = relu and math.max(s, 0) or s
        end
    end
    return r
end
local want = dense(dense(xs, w.W1, w.b1, true), w.W2, w.b2, false)

local worst = 0
for i = 1, BATCH do
    for j = 1, OUT do
        local got, ref = out:get(i, j), want[i][j]
        local err = math.abs(got - ref) / (1e-5 + 1e-4 * math.abs(ref))
        worst = math.max(worst, err)
    end
end
print(string.format("output [%s]; row 1: %s", table.concat(out.shape, ", "),
    table.concat(out:totable()[1], " ")))
model:close()
if worst > 1 then
    print(string.format("mlp.lua: FAILED, error %.3g times the tolerance (seed %d)", worst, seed))
    os.exit(1)
end
print("mlp.lua: every output within 1e-5 + 1e-4 |ref| of plain Lua")
