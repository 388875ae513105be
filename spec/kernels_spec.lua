-- scripts/kernels.lua: a llama2 shape's generated CUDA C, written without a
-- GPU from a zero-weight version 1 file (16-byte aligned, as on the device),
-- and ptxas's registers, spills and shared memory where nvcc is found.
local H = require("spec.llama2_helpers")

local build = os.getenv("MK_BUILD") or "build"

local function run(args)
    local p = io.popen(string.format("MK_BUILD=%s lua5.4 scripts/kernels.lua %s 2>&1; echo \"rc=$?\"",
                                     build, args))
    local out = p:read("a")
    p:close()
    return out, tonumber(out:match("rc=(%d+)%s*$"))
end

local function read(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local s = f:read("a")
    f:close()
    return s
end

-- stories260K's header (dim 64, hidden 172, 8 heads over 4 kv heads), 2 layers
local SHAPE = "64,172,5,8,4,512,64"

describe("scripts/kernels.lua", function()
    it("writes every generated launch's CUDA C and ptxas's verdict on it", function()
        local dir = os.tmpname()
        os.remove(dir)
        local out, rc = run(SHAPE .. " -l 2 -o " .. dir)
        if rc ~= 0 and out:find("no CUDA device", 1, true) then
            pending(out) -- no plugin to write CUDA C with
            return
        end
        assert.are.equal(0, rc, out)
        assert.truthy(out:find("dim 64, hidden 172, layers 2, heads 8, kv_heads 4", 1, true), out)
        -- per layer: q/k/v (the RmsNorm folded in), attention, wo, w1/w3, w2; then the classifier
        local groups = {}
        for launch, what in out:gmatch("\n| +(%d+) | ([%w-]+ group)") do groups[#groups + 1] = what end
        assert.are.equal(11, #groups, out)
        assert.are.equal("attention group", groups[2])
        local nvcc = out:find("ptxas for sm_90", 1, true)
        for launch, regs in out:gmatch("\n| +(%d+) | [^|]+ | +([%d-]+) |") do
            local src = assert(read(string.format("%s/launch%03d.cu", dir, tonumber(launch))))
            assert.truthy(src:find('extern "C" __global__', 1, true), src)
            if nvcc then assert.truthy(tonumber(regs) and tonumber(regs) > 0, out) end
        end
        -- the file is aligned as device memory is: the q/k/v launch loads float4s of weights
        assert.truthy(assert(read(dir .. "/launch001.cu")):find("mk_w4_f32(B0", 1, true))
        os.execute("rm -rf '" .. dir .. "'")
    end)

    it("reads only a checkpoint's header", function()
        if not H.models_present() then
            pending("../shared/models is absent: no stories260K.bin")
            return
        end
        local out, rc = run(H.models .. "/stories260K.bin -q bf16")
        if rc ~= 0 and out:find("no CUDA device", 1, true) then
            pending(out)
            return
        end
        assert.are.equal(0, rc, out)
        assert.truthy(out:find("dim 64, hidden 172, layers 1, heads 8, kv_heads 4, vocab 512", 1, true), out)
        assert.truthy(out:find("bf16", 1, true), out)
    end)

    it("refuses bad arguments with the reason", function()
        local cases = {
            { "1,2", "a shape is 7 integers" },
            { "/nonexistent/model.bin", "/nonexistent/model.bin: No such file or directory" },
            { SHAPE .. " -q int4", "-q takes fp32, bf16, fp16, q8 or q8a8, got int4" },
            { SHAPE .. " -l 0", "-l needs a positive integer, got 0" },
            { SHAPE .. " --bogus", "unknown option --bogus" },
            { "", "no shape" },
            { "64,172,5,7,4,512,64", "dim 64 is not a multiple of n_heads 7" },
            { SHAPE .. " -q q8a8", "q8a8 needs the group size" },
        }
        for _, c in ipairs(cases) do
            local out, rc = run(c[1])
            assert.are.equal(1, rc, c[1] .. ": " .. out)
            assert.truthy(out:find("kernels.lua: " .. c[2], 1, true) or out:find(c[2], 1, true),
                          c[1] .. ": " .. out)
        end
    end)
end)
