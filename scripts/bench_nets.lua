--[[
bench_nets.lua — latency of the reference networks of scripts/nets.lua:

    resnet18   ResNet-18, batch 1, 3x224x224 -> 1000: p50 / p99 of m:run
    dqn        the Atari DQN policy, batch 1, 4x84x84 -> conv 32/64/64 -> 512 -> 18
    mlp        the policy MLP of scripts/bench_mlp.lua, batch 1, 64 -> 256 -> 256 -> 8
    gpt2       GPT-2 small (12 x 768, 12 heads, vocab 50257): greedy decode with
               KV caches through m:run_steps (tokens/s, launches per layer),
               and the 8-token prompt's logits through the whole stack

    lua5.4 scripts/bench_nets.lua --net resnet18|gpt2|dqn|mlp [--devices cpu,cuda]
        [--threads N] [--runs N] [--tokens N] [--save FILE] [--out FILE]
        [--peer on|off|only] [--peer-dir DIR] [--import]

Weights are random (scripts/nets.lua's fast_weights, seed 1), named as
PyTorch's state_dict names them. --save FILE writes them and the input
("input.x", or "input.ids") as safetensors for scripts/torch_nets.py;
--out FILE writes moonkaas's outputs ("<device>.y", "<device>.tokens") for
its comparison (--compare). --threads caps the CPU's threads per launch
(compile's `threads`; 0, the default, lets the cost rule choose) and ONNX
Runtime's intra-op threads. For resnet18, dqn and mlp, ONNX Runtime's CPU
provider runs the same weights in the same run where it is installed
(npm's onnxruntime-node, as spec/onnx_ort_spec.lua finds it, else the
onnxruntime of MK_PYTHON, default /usr/bin/python3, through ort_bench.py; the
graph written by scripts/nets_onnx.py with that python's onnx), and its output
is compared with moonkaas's. --peer off skips it, --peer only runs it
alone (to alternate it with moonkaas runs of other builds, MK_BUILD); with
--peer-dir DIR the ONNX graph, input and output stay in DIR, and a graph
already there is reused (the weights are the same: seed 1). --import also
loads that same ONNX file with mk.load_onnx on each device and times its
m:run({x = input}) (a new output table and tensor each call, as a host of
the ONNX API calls it), with its output against the built graph's. ONNX
Runtime's figures are from node (ort_bench.js: one awaited session.run a
call), whose call costs a few microseconds more than C's: for the MLP's
microseconds that is part of the peer's figure. The command
printed at the end runs PyTorch on the same weights (scripts/torch_nets.py,
a GPU machine).

Alternating rounds, before / after / ONNX Runtime, as doc/performance.md's
ResNet-18 table was taken:

    for r in 1 2 3; do for t in 1 2; do
      MK_BUILD=/tmp/mk_before/build lua5.4 scripts/bench_nets.lua --net resnet18 --threads $t --peer off
      lua5.4 scripts/bench_nets.lua --net resnet18 --threads $t --peer off
      lua5.4 scripts/bench_nets.lua --net resnet18 --threads $t --peer only --peer-dir /tmp/rn18
    done; done
]]

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath
local mk = require "moonkaas"
local nets = dofile(root .. "/scripts/nets.lua")

local opts = { net = nil, devices = "cpu", threads = 0, runs = 20, tokens = 32, peer = "on" }
do
    local i = 1
    while arg[i] do
        local a, v = arg[i], arg[i + 1]
        if a == "--net" then opts.net = v
        elseif a == "--devices" then opts.devices = v
        elseif a == "--threads" then opts.threads = tonumber(v)
        elseif a == "--runs" then opts.runs = tonumber(v)
        elseif a == "--tokens" then opts.tokens = tonumber(v)
        elseif a == "--save" then opts.save = v
        elseif a == "--out" then opts.out = v
        elseif a == "--peer" and (v == "on" or v == "off" or v == "only") then opts.peer = v
        elseif a == "--peer-dir" then opts.peer_dir = v
        elseif a == "--import" then opts.import, v = true, nil
        else
            io.stderr:write("bench_nets: unknown option " .. a .. "\n")
            os.exit(2)
        end
        i = i + (v and 2 or 1)
    end
    local nets_ok = { resnet18 = true, gpt2 = true, dqn = true, mlp = true }
    if not nets_ok[opts.net] or (opts.import and opts.net == "gpt2") then
        io.stderr:write("usage: lua5.4 scripts/bench_nets.lua --net resnet18|gpt2|dqn|mlp [--devices cpu,cuda] " ..
            "[--threads N] [--runs N] [--tokens N] [--save FILE] [--out FILE] [--peer on|off|only] " ..
            "[--peer-dir DIR] [--import]   (--import: not gpt2)\n")
        os.exit(2)
    end
end

math.randomseed(1)
local P, weights = nets.fast_weights(mk)
local outputs = {}

local function percentile(sorted, p)
    return sorted[math.max(1, math.min(#sorted, math.ceil(p * #sorted)))]
end

local function random_tensor(shape)
    local n, v = 1, {}
    for _, d in ipairs(shape) do n = n * d end
    for i = 1, n do v[i] = 2 * math.random() - 1 end
    return mk.tensor(v, "float32", shape)
end

local function compile(out, device, extra)
    local o = { device = device, threads = device == "cpu" and opts.threads or nil }
    for k, v in pairs(extra or {}) do o[k] = v end
    return mk.compile(out, o)
end

local function devices()
    local list = {}
    for d in opts.devices:gmatch("[^,]+") do
        if d == "cuda" and not mk.cuda_available() then
            print("cuda: skipped (no CUDA device here)")
        else
            list[#list + 1] = d
        end
    end
    return list
end

-- ---- the ONNX file of the net, for ONNX Runtime and --import ---------------
-- (scripts/nets_onnx.py writes the graph with Debian's python3-onnx; the
-- directory is --peer-dir, else a scratch one removed at the end)
local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local PY = os.getenv("MK_PYTHON") or "/usr/bin/python3"
local scratch

-- The directory holding net.onnx and x.bin (written once), or nil and why not.
local function onnx_dir()
    if not os.execute(PY .. " -c 'import onnx, numpy' > /dev/null 2>&1") then
        return nil, PY .. " cannot import onnx and numpy"
    end
    local dir = opts.peer_dir
    if not dir then
        if not scratch then
            scratch = os.tmpname()
            os.remove(scratch)
        end
        dir = scratch
    end
    assert(os.execute("mkdir -p " .. sh_quote(dir)))
    local made = io.open(dir .. "/net.onnx")
    if made then
        made:close()
    else
        mk.save_safetensors(dir .. "/w.safetensors", weights)
        local f = assert(io.open(dir .. "/x.bin", "wb"))
        f:write(weights["input.x"]:bytes())
        f:close()
        assert(os.execute(string.format("%s %s/scripts/nets_onnx.py --net %s --weights %s/w.safetensors --out %s/net.onnx",
            PY, sh_quote(root), opts.net, sh_quote(dir), sh_quote(dir))), "nets_onnx.py failed")
    end
    return dir
end

-- max |a - b| / max |b| over two tensors of one shape
local function rel_diff(a, b)
    local n = 1
    for _, d in ipairs(b.shape) do n = n * d end
    local x, y, worst, big = a:reshape { n }, b:reshape { n }, 0, 0
    for i = 1, n do
        worst = math.max(worst, math.abs(x:get(i) - y:get(i)))
        big = math.max(big, math.abs(y:get(i)))
    end
    return worst / big
end

-- ---- the image networks and the MLP: p50 / p99 of m:run ---------------------
-- times opts.runs calls of run() after one, each alone, in ms
local function time_runs(run)
    local times = {}
    for i = 1, opts.runs do
        local t0 = mk.clock()
        run()
        times[i] = (mk.clock() - t0) * 1e3
    end
    table.sort(times)
    return percentile(times, 0.5), percentile(times, 0.99)
end

local function bench_image(build_net, shape, name)
    local x, y = build_net(mk, P, { batch = 1 })
    local input = random_tensor(shape)
    weights["input.x"] = input
    for _, dev in ipairs(opts.peer == "only" and {} or devices()) do
        local m = compile(y, dev)
        local out = m:run { x = input } -- warm-up (and the output compared)
        outputs[dev .. ".y"] = out
        local p50, p99 = time_runs(function() m:run({ x = input }, out) end)
        local st = m:stats()
        print(string.format("%s %s: p50 %.3f ms, p99 %.3f ms over %d runs (threads %s; %d launches, compile %.0f ms)",
            name, dev, p50, p99, opts.runs, dev == "cpu" and tostring(opts.threads) or "-", st.launches,
            st.compile_ms or 0))
        m:close()
    end
    if not opts.import or opts.peer == "only" then return end
    -- the same network from the ONNX file ONNX Runtime runs, through the importer
    local dir, why = onnx_dir()
    if not dir then
        print(name .. " --import: skipped (" .. why .. ")")
        return
    end
    for _, dev in ipairs(devices()) do
        local m = mk.load_onnx(dir .. "/net.onnx", { device = dev, threads = dev == "cpu" and opts.threads or nil })
        local out_name = m:outputs()[1].name
        local got = m:run({ x = input })[out_name]
        local p50, p99 = time_runs(function() m:run({ x = input }) end)
        local st = m:stats()
        print(string.format("%s %s from net.onnx (mk.load_onnx, m:run): p50 %.3f ms, p99 %.3f ms over %d runs " ..
            "(threads %s; %d launches); max |onnx - built| / max |built| %.3g", name, dev, p50, p99, opts.runs,
            dev == "cpu" and tostring(opts.threads) or "-", st.launches, rel_diff(got, outputs[dev .. ".y"])))
        m:close()
    end
    _ = x
end

-- ---- GPT-2 small: greedy decode tok/s with KV caches -----------------------
local function bench_gpt2()
    local o = {}
    for k, v in pairs(nets.GPT2_SMALL) do o[k] = v end
    o.T = 8
    local prompt = { 50256, 464, 3290, 1110, 318, 257, 1332, 13 }
    weights["input.ids"] = mk.tensor(prompt, "int64", { o.T })
    o.positions = math.min(o.ctx, opts.tokens + 1)
    local _, whole = nets.gpt2(mk, P, o)
    local ins, _, nxt = nets.gpt2_decode(mk, P, o)
    _ = ins
    for _, dev in ipairs(devices()) do
        local m = compile(whole, dev)
        outputs[dev .. ".y"] = m:run { ids = weights["input.ids"] }
        m:close()
        if dev ~= "cpu" and outputs["cpu.y"] then
            print(string.format("gpt2 small %s: the prompt's logits, max |%s - cpu| / max |cpu| %.3g", dev, dev,
                rel_diff(outputs[dev .. ".y"], outputs["cpu.y"])))
        end
        local d = compile(nxt, dev, { next = { token = nxt, pos = 1, pos1 = 1 } })
        local start = { token = mk.tensor({ prompt[o.T] }, "int64"), pos = mk.tensor({ 0 }, "int64"),
            pos1 = mk.tensor({ 1 }, "int64") }
        d:run_steps(2, start) -- warm-up
        d:reset()
        local best, tokens = math.huge, nil
        for _ = 1, math.max(1, opts.runs // 10) do
            d:reset()
            local t0 = mk.clock()
            local outs = d:run_steps(opts.tokens, start)
            best = math.min(best, mk.clock() - t0)
            tokens = outs[1]
        end
        outputs[dev .. ".tokens"] = tokens
        local st = d:stats()
        print(string.format("gpt2 small %s: decode %.1f tok/s (%d tokens from position 0, best of %d; threads %s), " ..
            "%d launches per token, %.1f per layer", dev, opts.tokens / best, opts.tokens,
            math.max(1, opts.runs // 10), dev == "cpu" and tostring(opts.threads) or "-", st.launches,
            st.launches / o.layers))
        d:close()
    end
end

-- ---- the peer: ONNX Runtime's CPU provider on the same file ----------------
-- (scripts/ort_bench.js runs net.onnx under node with npm's onnxruntime-node,
-- found as spec/onnx_ort_spec.lua finds it; else scripts/ort_bench.py with
-- MK_PYTHON's onnxruntime)
local function ort_path()
    for _, p in ipairs { os.getenv("MK_ORTNODE") or "", "/opt/ortnode/node_modules", "/work/ortnode/node_modules" } do
        local f = p ~= "" and io.open(p .. "/onnxruntime-node/package.json")
        if f then
            f:close()
            return p
        end
    end
end

local function ort_peer(shape)
    local node_ok = os.execute("node --version > /dev/null 2>&1")
    local path = ort_path()
    -- node's onnxruntime-node, else Python's onnxruntime (the GPU machine's)
    local runner = node_ok and path and string.format("NODE_PATH=%s node %s/scripts/ort_bench.js", sh_quote(path),
        sh_quote(root))
    if not runner and os.execute(PY .. " -c 'import onnxruntime' > /dev/null 2>&1") then
        runner = string.format("%s %s/scripts/ort_bench.py", PY, sh_quote(root))
    end
    local dir, why = nil, not runner and "neither node's onnxruntime-node (scripts/setup.sh, or MK_ORTNODE) " ..
        "nor " .. PY .. "'s onnxruntime is installed" or nil
    if not why then dir, why = onnx_dir() end
    if not dir then
        print("onnxruntime cpu: skipped (" .. why .. ")")
        return
    end
    local cmd = string.format("%s %s/net.onnx %s/x.bin %s %d %d %s/out.bin", runner, sh_quote(dir), sh_quote(dir),
        table.concat(shape, ","), opts.runs, opts.threads, sh_quote(dir))
    local p = assert(io.popen(cmd))
    local line = p:read("a")
    p:close()
    local p50, p99 = line:match("p50 ([%d.]+) p99 ([%d.]+)")
    if not p50 then
        print("onnxruntime cpu: failed: " .. line)
        return
    end
    local rf = assert(io.open(dir .. "/out.bin", "rb"))
    local bytes = rf:read("a")
    rf:close()
    local want, msg = outputs["cpu.y"], ""
    if want then
        msg = string.format("; max |moonkaas - ort| / max |ort| %.3g",
            rel_diff(want, mk.from_bytes(bytes, "float32", want.shape)))
    end
    print(string.format("%s onnxruntime cpu: p50 %.3f ms, p99 %.3f ms over %d runs (threads %s)%s", opts.net,
        tonumber(p50), tonumber(p99), opts.runs, opts.threads > 0 and tostring(opts.threads) or "ORT's default", msg))
    print("  peer command: " .. cmd:gsub(sh_quote(dir), "DIR"))
end

if opts.net == "resnet18" then
    bench_image(function(m, p, o)
        o.res, o.width, o.classes = 224, 64, 1000
        return nets.resnet18(m, p, o)
    end, { 1, 3, 224, 224 }, "resnet18")
    if opts.peer ~= "off" then ort_peer({ 1, 3, 224, 224 }) end
elseif opts.net == "dqn" then
    bench_image(nets.dqn, { 1, 4, 84, 84 }, "dqn")
    if opts.peer ~= "off" then ort_peer({ 1, 4, 84, 84 }) end
elseif opts.net == "mlp" then
    bench_image(nets.mlp, { 1, 64 }, "mlp")
    if opts.peer ~= "off" then ort_peer({ 1, 64 }) end
else
    bench_gpt2()
end

if scratch then os.execute("rm -rf " .. sh_quote(scratch)) end
if opts.save then
    mk.save_safetensors(opts.save, weights)
    print("weights and input written to " .. opts.save)
end
if opts.out then
    mk.save_safetensors(opts.out, outputs)
    print("moonkaas's outputs written to " .. opts.out)
end
print(string.format("peer (PyTorch on the same weights; CPU here, CUDA eager and torch.compile on a GPU):\n" ..
    "  lua5.4 scripts/bench_nets.lua --net %s --save /tmp/%s_w.safetensors --out /tmp/%s_mk.safetensors\n" ..
    "  python3 scripts/torch_nets.py --net %s --weights /tmp/%s_w.safetensors --compare /tmp/%s_mk.safetensors " ..
    "--devices cpu,cuda --runs %d",
    opts.net, opts.net, opts.net, opts.net, opts.net, opts.net, opts.runs))
