-- Every program in scripts/ runs: each with --help or a tiny input (the
-- stories260K checkpoint from ../shared/models where it needs one: pending
-- where that is absent), from the repository root as the README shows,
-- exiting as it should with what it should print. A new script without a
-- case here fails the first test.
local H = require "spec.llama2_helpers"
local mk = H.mk()
local seed = H.seed("scripts_spec")

local M = H.models

local tmp = assert(io.popen("mktemp -d /tmp/mk-scripts.XXXXXX")):read("l")

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- A weights file as scripts/bench_mlp.lua writes it for mlp_peer.py: 3 -> 2, random.
local function mlp_weights()
    local path = tmp .. "/weights.txt"
    local lines = { "3 2" }
    local w, b = {}, {}
    for i = 1, 6 do w[i] = string.format("%.6f", math.random() * 2 - 1) end
    for i = 1, 2 do b[i] = string.format("%.6f", math.random() * 2 - 1) end
    lines[2], lines[3] = table.concat(w, " "), table.concat(b, " ")
    H.write_file(path, table.concat(lines, "\n") .. "\n")
    return path
end

-- A 4 -> 3 Gemm and Relu as an ONNX file, random weights.
local O = require "spec.onnx.helpers"
local function tiny_onnx()
    local _, w = require("spec.helpers").rand({ 3, 4 })
    return O.write({ opset = 17,
        nodes = { { op = "Gemm", inputs = { "x", "w" }, outputs = { "h" }, attrs = { transB = { i = 1 } } },
                  { op = "Relu", inputs = { "h" }, outputs = { "y" } } },
        inputs = { O.vi("x", { "batch", 4 }) }, outputs = { O.vi("y", nil) },
        initializers = { O.init("w", w) } })
end

-- {program, args, exit code, text expected in stdout + stderr, models = needs a checkpoint,
--  run = the interpreter (lua5.4 unless given), env = "NAME=value" for the child}
local CASES = {
    { "bench_compile.lua", { "--help" }, 0, "usage:" },
    -- the llama-shaped graph crashed (model.lua:131, no classifier weight)
    { "bench_compile.lua", { "50" }, 0, "chain of 50 nodes" },
    { "bench_compile.lua", { "many" }, 1, "usage:" },
    -- without a CUDA device it says so and stops: MK_CUDA_PLUGIN makes sure of that here
    { "bench_conv.lua", { "--help" }, 0, "usage:" },
    { "bench_conv.lua", { "--speed" }, 1, "usage:" },
    { "bench_cudnn.lua", {}, 0, "bench_cudnn: no CUDA device:",
      env = "MK_CUDA_PLUGIN=/nonexistent/libmoonkaas_cuda.so" },
    { "bench_llama2.lua", { "--help" }, 0, "usage:" },
    { "bench_llama2.lua", { "--model", M .. "/stories260K.bin", "--tokenizer", M .. "/tok512.bin", "--devices",
      "cpu", "--steps", "4", "--runs", "1", "--prompt-tokens", "16", "--prompt-at", "8" }, 0,
      "first token after a prompt of 16 at 8: cold", models = true },
    { "bench_llama2.lua", { "--prompt-tokens", "16", "--prompt-at", "x" }, 1,
      "--prompt-at needs a position, not x" },
    { "bench_batch.lua", { "--help" }, 0, "usage:" },
    { "bench_batch.lua", { "--batches", "1,2", "--steps", "4", "--runs", "1", "--devices", "cpu" }, 0,
      "cpu         2", models = true },
    { "bench_mlp.lua", { "--help" }, 0, "usage:" },
    -- it has no --help: an unknown flag prints the usage and exits 2
    { "bench_ops.lua", { "--help" }, 2, "usage:" },
    { "demo.lua", { "cpu" }, 0, "result = " },
    { "export.lua", { "--help" }, 0, "usage:" },
    { "export.lua", { M .. "/stories260K.bin", tmp .. "/v1.bin", "--version", "1" }, 0,
      "(version 1, ", models = true },
    { "graph.lua", { "--help" }, 0, "usage:" },
    { "graph.lua", { M .. "/stories260K.bin", "-o", tmp .. "/graph.dot" }, 0, "wrote " .. tmp .. "/graph.dot",
      models = true },
    { "kernels.lua", { "--help" }, 0, "usage:" },
    -- the core writes the generated kernels with no plugin and no GPU (nvcc tabulates them where found)
    { "kernels.lua", { "16,48,1,2,2,32,8", "-o", tmp .. "/kernels" }, 0, "" },
    { "onnx_ops.lua", { "--help" }, 0, "usage:" },
    { "onnx_ops.lua", {}, 0, "| Gemm | 13–21 |", onnx = true },
    { "onnx_run.lua", { "--help" }, 0, "usage:" },
    -- a tiny MLP written with onnx.helper (pending without python3-onnx)
    { "onnx_run.lua", { "ONNX", "--shape", "x=2,4", "--bench", "5" }, 0, "bench 5 runs: p50 ", onnx = true },
    { "onnx_run.lua", { "ONNX", "--shape", "x=2,4", "--load-times" }, 0,
      "load_onnx (import + compile): cold ", onnx = true },
    { "onnx_run.lua", { "ONNX", "--shape", "x=2,4", "--input", "x=" .. tmp .. "/none.safetensors" }, 1,
      "onnx_run: file error: ", onnx = true },
    { "llama2.lua", { "-h" }, 0, "Usage:" },
    -- a flag it does not know is unknown, not "needs a value"
    { "llama2.lua", { "m.bin", "-x" }, 1, "unknown option: -x" },
    { "llama2.lua", { M .. "/stories260K.bin", "-z", M .. "/tok512.bin", "-t", "0", "-n", "12", "-d", "cpu" },
      0, "", models = true },
    { "precision_report.lua", { M .. "/stories260K.bin", "--steps", "2", "--device", "cpu" }, 0,
      "fp16 max |logit", models = true },
    -- the ONNX Runtime peer: runs, or says what it cannot import
    { "mlp_peer.py", { "WEIGHTS", "3" }, nil, nil, run = "python3" },
    -- needs PyTorch and onnxruntime to export (the GPU machine): its usage only here
    { "export_nets.py", { "--help" }, 0, "usage: export_nets.py", run = "python3" },
    { "ptx_diff.sh", {}, 2, "usage:", run = "sh" },
    { "ptx_diff.sh", { tmp, tmp }, 0, "0 identical, 0 differ or fail", run = "sh" },
    -- doc/ops.md's generator (spec/docs_spec.lua compares its text with the file)
    { "gen_ops_doc.lua", {}, 0, "# Op reference" },
    { "gen_ops_doc.lua", { "--check" }, 0, "" },
    { "gen_ops_doc.lua", { "--bogus" }, 2, "usage: lua5.4 scripts/gen_ops_doc.lua" },
    -- the reference networks (spec/nets_spec.lua runs them) and their benchmark:
    -- the DQN policy, with ONNX Runtime's figures where it is installed
    { "nets.lua", {}, 0, "" },
    { "bench_nets.lua", {}, 2, "usage: lua5.4 scripts/bench_nets.lua" },
    { "bench_nets.lua", { "--net", "dqn", "--runs", "2", "--threads", "1" }, 0, "dqn cpu: p50 " },
    -- the policy MLP also from the ONNX file ONNX Runtime runs (python3-onnx writes it)
    { "bench_nets.lua", { "--net", "mlp", "--runs", "5", "--threads", "1", "--import", "--peer", "off" }, 0,
      "max |onnx - built| / max |built| 0\n", onnx = true },
    { "bench_nets.lua", { "--net", "gpt2", "--import" }, 2, "(--import: not gpt2)" },
    -- the peers' programs: PyTorch (a GPU machine), the ONNX graph and ONNX Runtime;
    -- their syntax only here, bench_nets.lua runs the last two
    { "torch_nets.py", {}, 0, "", run = "python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())'" },
    { "nets_onnx.py", {}, 0, "", run = "python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())'" },
    { "ort_bench.js", {}, 0, "", run = "node --check", needs = "node" },
    { "ort_bench.py", {}, 0, "", run = "python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())'" },
    -- installs Debian packages: only its syntax is checked here
    { "setup.sh", {}, 0, "", run = "sh -n" },
    -- the int8 decoding benchmarks: llama.cpp's build and the checkpoints they time
    -- are not here, so their syntax only (doc/performance.md: "CPU: int8 products")
    { "bench_cpu_q8.sh", {}, 0, "", run = "bash -n" },
    { "bench_q8_products.c", {}, 0, "", run = "cc -fsyntax-only -fopenmp -Icore" },
}

describe("scripts/", function()
    teardown(function() os.execute("rm -rf " .. q(tmp)) end)

    it("has a case here for every program", function()
        local p = assert(io.popen("ls scripts"))
        local covered = {}
        for _, c in ipairs(CASES) do covered[c[1]] = true end
        for name in p:lines() do
            assert.is_true(covered[name] ~= nil, "scripts/" .. name .. " has no case in spec/scripts_spec.lua")
        end
        p:close()
    end)

    for i, c in ipairs(CASES) do
        local name, args, code, expect = c[1], c[2], c[3], c[4]
        local shown = table.concat(args, " ")
        local at = shown:find(tmp, 1, true)
        while at do
            shown = shown:sub(1, at - 1) .. "$TMP" .. shown:sub(at + #tmp)
            at = shown:find(tmp, 1, true)
        end
        it(name .. " " .. shown, function()
            if c.models and not H.models_present() then pending(M .. " is absent") return end
            if c.needs and not os.execute("command -v " .. c.needs .. " > /dev/null 2>&1") then
                pending(c.needs .. " is not installed") return
            end
            if c.onnx and (O.python() or not mk.onnx_ops()[1]) then
                pending(O.python() or "built without protobuf-c") return
            end
            local argv = {}
            for j, a in ipairs(args) do
                argv[j] = q(a == "WEIGHTS" and mlp_weights() or a == "ONNX" and tiny_onnx() or a)
            end
            local cmd = (c.run or "lua5.4") .. " scripts/" .. name
            local out = tmp .. "/out." .. i
            local full = string.format("cd . && env %s %s %s > %s 2>&1 < /dev/null", c.env or "", cmd,
                table.concat(argv, " "), q(out))
            local _, _, got = os.execute(full)
            local text = H.read_file(out) or ""
            if name == "mlp_peer.py" then
                -- where numpy, onnx and onnxruntime are installed it times the peer
                if text:find("^cannot run: ") then
                    assert.are.equal(1, got, text)
                else
                    assert.are.equal(0, got, text)
                    assert.truthy(text:find("^p50 [%d.]+ p99 [%d.]+ max [%d.]+ first "), text)
                end
                return
            end
            assert.are.equal(code, got, full .. "\n" .. text)
            assert.truthy(text:find(expect, 1, true), "no '" .. expect .. "' in:\n" .. text)
            assert.is_nil(text:find("stack traceback", 1, true), text)
        end)
    end
end)
