-- Exported networks against ONNX Runtime (moonkaas issue 65, item 5): given a
-- folder from scripts/export_nets.py (MK_ONNX_NETS=dir; made on a machine
-- with PyTorch and onnxruntime), each NAME.onnx is loaded with mk.load_onnx
-- on the CPU and on CUDA (where usable), run on NAME.inputs.safetensors, and
-- its outputs checked against ONNX Runtime's CPU provider's
-- (NAME.ort_cpu.safetensors): max |moonkaas - ORT| / max |ORT| <= 1e-4 per
-- output. Pending without the folder. A network with an op the importer does
-- not map is pending with the importer's error (naming node, op and opset).
local H = require "spec.helpers"
local mk = H.mk()

local dir = os.getenv("MK_ONNX_NETS")
local NETS = { "cnn", "resnet18", "gpt2", "mlp", "lstm" }
local TOL = 1e-4

local function exists(path)
    local f = io.open(path, "rb")
    if f then f:close() end
    return f ~= nil
end

-- max |got - want| / max |want| over the output
local function rel_error(got, want)
    assert.are.same(want.shape, got.shape)
    local diff, scale = 0, 0
    for i = 1, want.numel do
        local w, g = want:get(i), got:get(i)
        if g ~= g then return math.huge end
        diff = math.max(diff, math.abs(g - w))
        scale = math.max(scale, math.abs(w))
    end
    return diff / math.max(scale, 1e-30)
end

local function check(name, device)
    local path = dir .. "/" .. name .. ".onnx"
    if not exists(path) then return pending(path .. " is not there (export_nets.py --only)") end
    local ok, m = pcall(mk.load_onnx, path, { device = device })
    if not ok then
        if tostring(m):match("^argument error: ONNX node") then
            return pending(name .. ": " .. tostring(m))
        end
        error(m, 0)
    end
    local feeds = mk.load_safetensors(dir .. "/" .. name .. ".inputs.safetensors")
    local want = mk.load_safetensors(dir .. "/" .. name .. ".ort_cpu.safetensors")
    local got = m:run(feeds)
    local n = 0
    for out, w in pairs(want) do
        assert(got[out], name .. ": no output " .. out)
        local e = rel_error(got[out], w)
        print(string.format("# %s %s %s: max relative error %.3g", name, device, out, e))
        assert(e <= TOL, string.format("%s on %s, output %s: max relative error %.3g > %g",
                                       name, device, out, e, TOL))
        n = n + 1
    end
    assert(n > 0, name .. ": ORT wrote no outputs")
    m:close()
end

describe("exported networks agree with ONNX Runtime", function()
    local gpu_it = H.gpu(it, function(why) pending(why) end)
    for _, name in ipairs(NETS) do
        it(name .. " on the CPU", function()
            if not dir then return pending("MK_ONNX_NETS names no folder (scripts/export_nets.py)") end
            if not mk.onnx_ops()[1] then return pending("moonkaas was built without protobuf-c") end
            check(name, "cpu")
        end)
        gpu_it(name .. " on CUDA", function()
            if not dir then return pending("MK_ONNX_NETS names no folder (scripts/export_nets.py)") end
            if not mk.onnx_ops()[1] then return pending("moonkaas was built without protobuf-c") end
            check(name, "cuda")
        end)
    end
end)
