-- precision_report.lua — how far the logits of low-precision weights are
-- from float32's on a llama2.c checkpoint:
--
--   lua scripts/precision_report.lua MODEL.bin [--steps N] [--device cpu|cuda]
--
-- Builds the model four times (scripts/llama2.lua's -q fp32, bf16, fp16, q8),
-- feeds every one float32's greedy tokens from BOS, and prints per precision
-- the largest |logit - float32's logit| over the steps and the first step
-- whose argmax differs from float32's (none if it never does).

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local mk = require "moonkaas"
local llama2 = require "moonkaas.llama2"

local path, steps, device = nil, 200, "cpu"
local argv = { ... }
local i = 1
while i <= #argv do
    if argv[i] == "--steps" then steps = math.tointeger(tonumber(argv[i + 1])); i = i + 1
    elseif argv[i] == "--device" then device = argv[i + 1]; i = i + 1
    elseif not path then path = argv[i]
    else steps = nil end
    i = i + 1
end
if not path or not steps or steps < 1 then
    io.stderr:write("usage: lua scripts/precision_report.lua MODEL.bin [--steps N] [--device cpu|cuda]\n")
    os.exit(1)
end
local c, err = llama2.read_config(path)
if not c then io.stderr:write(err .. "\n"); os.exit(1) end
steps = math.min(steps, c.seq_len)

local LOW = { "bf16", "fp16", "q8" }
local nets = {}
for _, p in ipairs({ "fp32", table.unpack(LOW) }) do
    nets[p] = llama2.build(mk, c, { device = device, greedy = false, precision = p, steps = steps })
end
local function argmax(t)
    local best, at = -math.huge, 0
    for k, v in ipairs(t) do if v > best then best, at = v, k end end
    return at - 1
end
local worst, first, range = {}, {}, 0
local token = 1 -- BOS
for pos = 0, steps - 1 do
    local ref = nets.fp32:forward(token, pos)
    for _, v in ipairs(ref) do range = math.max(range, math.abs(v)) end
    for _, p in ipairs(LOW) do
        local got = nets[p]:forward(token, pos)
        local d = 0
        for k = 1, #ref do d = math.max(d, math.abs(got[k] - ref[k])) end
        worst[p] = math.max(worst[p] or 0, d)
        if not first[p] and argmax(got) ~= argmax(ref) then first[p] = pos end
    end
    token = argmax(ref)
end
print(string.format("%s on %s, %d steps of float32's greedy tokens; float32 logits within ±%.3g",
                    path, device, steps, range))
for _, p in ipairs(LOW) do
    print(string.format("  %-4s max |logit - float32's| %.4g; argmax first differs at step %s", p, worst[p],
                        first[p] and tostring(first[p]) or "never"))
end
