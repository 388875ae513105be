--[[
cnn.lua — a small CNN with moonkaas.nn, its weights read from a safetensors
file that the example writes first (as a PyTorch state_dict would be saved),
checked against plain Lua.

    x [2, 3, 12, 12] -> conv 3x3 8, batch norm, relu, max pool 2
                     -> conv 3x3 16, batch norm, relu, max pool 2
                     -> flatten [2, 144] -> linear 10

    lua5.4 examples/cnn.lua [seed]    (from the repository root, after `make`)
]]

do
    local root = ((arg and arg[0] or ""):match("^(.*)/[^/]*$") or ".") .. "/.."
    local build = os.getenv("MK_BUILD")
    if not build or build == "" then build = root .. "/build" end
    package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
    package.cpath = build .. "/?.so;" .. package.cpath
end
local mk = require "moonkaas"
local nn = require "moonkaas.nn"

local seed = tonumber(arg[1]) or os.time()
math.randomseed(seed)
print("cnn.lua: seed " .. seed)

-- ---- the weights, written as safetensors under state_dict names -----------
local shapes = {
    ["conv1.weight"] = { 8, 3, 3, 3 }, ["conv1.bias"] = { 8 },
    ["bn1.weight"] = { 8 }, ["bn1.bias"] = { 8 }, ["bn1.running_mean"] = { 8 }, ["bn1.running_var"] = { 8 },
    ["conv2.weight"] = { 16, 8, 3, 3 }, ["conv2.bias"] = { 16 },
    ["bn2.weight"] = { 16 }, ["bn2.bias"] = { 16 }, ["bn2.running_mean"] = { 16 }, ["bn2.running_var"] = { 16 },
    ["fc.weight"] = { 10, 144 }, ["fc.bias"] = { 10 },
}
local names = {}
for name in pairs(shapes) do names[#names + 1] = name end
table.sort(names) -- the same draws for a seed
local state = {}
for _, name in ipairs(names) do
    local n = 1
    for _, d in ipairs(shapes[name]) do n = n * d end
    local v = {}
    for i = 1, n do
        local u = 2 * math.random() - 1
        v[i] = name:find("var$") and 0.5 + 0.5 * (u + 1) or name:find("^bn.weight") and 1 + 0.25 * u or 0.3 * u
    end
    state[name] = mk.tensor(v, "float32", shapes[name])
end
local path = os.tmpname()
mk.save_safetensors(path, state)

-- ---- the network from the file ---------------------------------------------
local W = mk.load_safetensors(path)
local function P(name) return mk.constant(W[name], (name:gsub("%.", "_"))) end
local function block(v, i)
    local c = "conv" .. i
    local b = "bn" .. i
    v = nn.conv2d(v, P(c .. ".weight"), P(c .. ".bias"), { padding = 1 })
    v = nn.batch_norm(v, P(b .. ".running_mean"), P(b .. ".running_var"), P(b .. ".weight"), P(b .. ".bias"))
    return nn.max_pool2d(v:relu(), 2)
end
local x = mk.input("x", "float32", { 2, 3, 12, 12 })
local y = nn.linear(block(block(x, 1), 2):reshape { 2, 144 }, P("fc.weight"), P("fc.bias"))
local model = mk.compile(y)
local xs = {}
for i = 1, 2 * 3 * 12 * 12 do xs[i] = 2 * math.random() - 1 end
local xt = mk.tensor(xs, "float32", { 2, 3, 12, 12 })
local out = model:run { x = xt }
print(string.format("%d nodes in %d launches; logits of image 1: %s", model:stats().nodes,
    model:stats().launches, out:reshape { 20 }:totable()[1]))
os.remove(path)

-- ---- the same network in plain Lua (double precision) ----------------------
local function w(name, ...) return W[name]:get(...) end
local function ref_block(v, C, H, i) -- v[n][c][y][x], C in-channels, H size
    local O = shapes["conv" .. i .. ".weight"][1]
    local r = {}
    for n = 1, 2 do
        r[n] = {}
        for o = 1, O do
            local scale = w("bn" .. i .. ".weight", o) / math.sqrt(w("bn" .. i .. ".running_var", o) + 1e-5)
            local conv = {}
            for yy = 1, H do
                conv[yy] = {}
                for xx = 1, H do
                    local acc = w("conv" .. i .. ".bias", o)
                    for c = 1, C do
                        for ky = 1, 3 do
                            for kx = 1, 3 do
                                local iy, ix = yy + ky - 2, xx + kx - 2
                                if iy >= 1 and iy <= H and ix >= 1 and ix <= H then
                                    acc = acc + v[n][c][iy][ix] * w("conv" .. i .. ".weight", o, c, ky, kx)
                                end
                            end
                        end
                    end
                    local bnv = (acc - w("bn" .. i .. ".running_mean", o)) * scale + w("bn" .. i .. ".bias", o)
                    conv[yy][xx] = math.max(bnv, 0)
                end
            end
            r[n][o] = {}
            for yy = 1, H // 2 do
                r[n][o][yy] = {}
                for xx = 1, H // 2 do
                    r[n][o][yy][xx] = math.max(conv[2 * yy - 1][2 * xx - 1], conv[2 * yy - 1][2 * xx],
                        conv[2 * yy][2 * xx - 1], conv[2 * yy][2 * xx])
                end
            end
        end
    end
    return r
end
local img = {}
for n = 1, 2 do
    img[n] = {}
    for c = 1, 3 do
        img[n][c] = {}
        for yy = 1, 12 do
            img[n][c][yy] = {}
            for xx = 1, 12 do img[n][c][yy][xx] = xt:get(n, c, yy, xx) end
        end
    end
end
local h = ref_block(ref_block(img, 3, 12, 1), 8, 6, 2)
local worst, big = 0, 0
for n = 1, 2 do
    for j = 1, 10 do
        local acc, k = w("fc.bias", j), 0
        for c = 1, 16 do
            for yy = 1, 3 do
                for xx = 1, 3 do
                    k = k + 1
                    acc = acc + h[n][c][yy][xx] * w("fc.weight", j, k)
                end
            end
        end
        worst, big = math.max(worst, math.abs(out:get(n, j) - acc)), math.max(big, math.abs(acc))
    end
end
model:close()
print(string.format("cnn.lua: max |y - ref| / max |ref| = %.3g", worst / big))
if worst / big > 1e-4 then
    print("cnn.lua: FAILED (seed " .. seed .. ")")
    os.exit(1)
end
