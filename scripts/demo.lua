--[[
demo.lua — a small network defined in Lua, lowered to the script IR, compiled
on the best device there is (CUDA when usable, else the CPU), run, and
measured.

    lua scripts/demo.lua            (from the repository root, after `make`)
    lua5.4 scripts/demo.lua cpu     (force a device: cpu | cuda)

A two-layer perceptron on a batch of 4 vectors of 16, then a softmax over the
10 outputs of each row and the index of the largest: the shape of the HamKaas
MNIST example, with random weights.
]]

-- Run from a checkout: use this tree's lua/ and build/ (found from this file's
-- own path; MK_BUILD=dir names another build) ahead of any installed copy.
do
    local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
    local root = here .. "/.."
    local build = os.getenv("MK_BUILD")
    if not build or build == "" then build = root .. "/build" end
    local f = io.open(build .. "/moonkaas/core.so", "rb")
    if f then
        f:close()
        package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
        package.cpath = build .. "/?.so;" .. package.cpath
    end
end

local mk = require "moonkaas"

local batch, n_in, hidden, n_out = 4, 16, 32, 10
math.randomseed(42)

local function random_tensor(shape, scale)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    local data = {}
    for i = 1, n do data[i] = (math.random() * 2 - 1) * scale end
    return mk.tensor(data, "float32", shape)
end

-- the network: x [4, 16] -> relu(x @ w1 + b1) [4, 32] -> @ w2 + b2 [4, 10]
local x = mk.input("x", "float32", { batch, n_in })
local w1 = mk.constant(random_tensor({ n_in, hidden }, 1 / math.sqrt(n_in)), "w1")
local b1 = mk.constant(random_tensor({ 1, hidden }, 0.1), "b1")
local w2 = mk.constant(random_tensor({ hidden, n_out }, 1 / math.sqrt(hidden)), "w2")
local b2 = mk.constant(random_tensor({ 1, n_out }, 0.1), "b2")
local logits = (x:matmul(w1) + b1):relu():matmul(w2) + b2
local probs = logits:sliced_softmax(n_out)

print("-- script (lowered from Lua):")
io.write(mk.script(probs))

local device, why = arg and arg[1], nil
if not device then device, why = mk.best_device() end
print(string.format("-- device: %s%s", device, why and (" (" .. why .. ")") or ""))

local model <close> = mk.compile(probs, { device = device })
local input = random_tensor({ batch, n_in }, 1)
local out = model:run({ x = input })

print("-- result: softmax of the logits, per row, and the most likely class")
for i = 1, batch do
    local row, best = {}, 1
    for j = 1, n_out do
        row[j] = string.format("%.3f", out:get(i, j))
        if out:get(i, j) > out:get(i, best) then best = j end
    end
    print(string.format("row %d: {%s}  class %d", i, table.concat(row, ", "), best - 1))
end

print("-- stats:")
local stats = model:stats()
local keys = {}
for k in pairs(stats) do keys[#keys + 1] = k end
table.sort(keys)
for _, k in ipairs(keys) do
    local v = stats[k]
    if math.type(v) == "float" then v = string.format("%.3f", v) end
    print(string.format("  %-18s %s", k, tostring(v)))
end
print("-- compiled script (after passes):")
io.write(model:script())
