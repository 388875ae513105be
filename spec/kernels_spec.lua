-- scripts/kernels.lua: a llama2 shape's generated CUDA C, written without a
-- GPU from a zero-weight version 1 file (16-byte aligned, as on the device),
-- and ptxas's registers, spills and shared memory where nvcc is found.
local H = require("spec.llama2_helpers")

-- the script's stdout and stderr together, and its exit code
local function run(...)
    local code, out, err = H.run_script("scripts/kernels.lua", { ... })
    return out .. err, code
end

-- stories260K's header (dim 64, hidden 172, 8 heads over 4 kv heads); the
-- script takes -l's layers (default 1), not the header's 5
local SHAPE = "64,172,5,8,4,512,64"

describe("scripts/kernels.lua", function()
    it("writes every generated launch's CUDA C and ptxas's verdict on it", function()
        local dir = os.tmpname()
        os.remove(dir)
        -- two layers, sources only (ptxas takes a second a launch, and the
        -- second layer's kernels are the first's)
        local out, rc = run(SHAPE, "-l", "2", "-o", dir, "--no-ptxas")
        if rc ~= 0 and out:find("no CUDA device", 1, true) then
            pending(out) -- no plugin to write CUDA C with
            return
        end
        assert.are.equal(0, rc, out)
        assert.truthy(out:find("dim 64, hidden 172, layers 2, heads 8, kv_heads 4", 1, true), out)
        assert.truthy(out:find("; sources only", 1, true), out)
        -- per layer: q/k/v (the RmsNorm folded in), attention, wo, w1/w3, w2; then the classifier
        local groups = {}
        for launch, what in out:gmatch("\n| +(%d+) | ([%w-]+ group)") do groups[#groups + 1] = what end
        assert.are.equal(11, #groups, out)
        assert.are.equal("attention group", groups[2])
        for launch = 1, 11 do assert.truthy(H.read_file(string.format("%s/launch%03d.cu", dir, launch)), launch) end
        os.execute("rm -rf '" .. dir .. "'")
        -- one layer with ptxas's verdict, where nvcc is found
        out, rc = run(SHAPE, "-o", dir)
        assert.are.equal(0, rc, out)
        local nvcc = out:find("ptxas for sm_90", 1, true)
        local rows = 0
        for launch, regs, smem, blocks in out:gmatch("\n| +(%d+) | [^|]+ | +([%d-]+) | +[%d-]+ | +([%d-]+) | +([%d-]+) |") do
            rows = rows + 1
            local src = assert(H.read_file(string.format("%s/launch%03d.cu", dir, tonumber(launch))))
            assert.truthy(src:find('extern "C" __global__', 1, true), src)
            if nvcc then
                regs, smem, blocks = tonumber(regs), tonumber(smem), tonumber(blocks)
                assert.truthy(regs and regs > 0, out)
                -- what sm_90 holds: the blocks' warps, registers (256 a warp at a time) and shared memory fit
                local warps = tonumber(src:match("__launch_bounds__%((%d+)")) // 32
                local per_warp = (regs * 32 + 255) // 256 * 256
                assert.truthy(blocks and blocks >= 1 and blocks <= 32, out)
                assert.truthy(blocks * warps <= 64 and blocks * warps * per_warp <= 65536, out)
                assert.truthy(blocks * (smem + 1024) <= 228 * 1024, out)
                -- and one more block would not: one of the limits binds
                local more = blocks + 1
                assert.truthy(more > 32 or more * warps > 64 or more * warps * per_warp > 65536
                              or more * (smem + 1024) > 228 * 1024, out)
            else
                assert.are.equal("-", blocks, out)
            end
        end
        assert.are.equal(6, rows, out)
        -- the file is aligned as device memory is: the q/k/v launch loads float4s of weights
        assert.truthy(assert(H.read_file(dir .. "/launch001.cu")):find("mk_w4_f32(B0", 1, true))
        os.execute("rm -rf '" .. dir .. "'")
    end)

    it("writes a sampling model's kernels with --sample: its classifier keeps the logits", function()
        local function classifier(...)
            local dir = os.tmpname()
            os.remove(dir)
            local out, rc = run(SHAPE, "-o", dir, "--no-ptxas", ...)
            if rc ~= 0 and out:find("no CUDA device", 1, true) then return nil, out end
            assert.are.equal(0, rc, out)
            local last = 0
            for launch in out:gmatch("\n| +(%d+) | ") do last = math.max(last, tonumber(launch)) end
            local src = assert(H.read_file(string.format("%s/launch%03d.cu", dir, last)))
            os.execute("rm -rf '" .. dir .. "'")
            return src, out
        end
        local greedy, why = classifier()
        if not greedy then
            pending(why)
            return
        end
        local sampled = classifier("--sample")
        assert.truthy(greedy:find("atomicMax(&sbest", 1, true), greedy) -- the argmax of the logits
        assert.falsy(sampled:find("sbest", 1, true), sampled)
        assert.truthy(sampled:find("dst[e0] = v[0]", 1, true), sampled) -- the logits themselves
    end)

    -- The comments of C source s, in order (string and character literals
    -- skipped), and s without them, each line's trailing blanks dropped and a
    -- line left blank by a comment dropped whole (what embed.sh says it does).
    local function comments(s)
        local found, code, i, n = {}, {}, 1, #s
        while i <= n do
            local c, two = s:sub(i, i), s:sub(i, i + 1)
            if c == '"' or c == "'" then
                local j = i + 1
                while j <= n and s:sub(j, j) ~= c do j = j + (s:sub(j, j) == "\\" and 2 or 1) end
                code[#code + 1] = s:sub(i, j)
                i = j + 1
            elseif two == "//" or two == "/*" then
                local e = two == "//" and (s:find("\n", i, true) or n + 1) - 1 or (s:find("*/", i + 2, true) or n) + 1
                found[#found + 1] = s:sub(i, e)
                code[#code + 1] = "\1" -- marks the line as one that held a comment
                i = e + 1
            else
                code[#code + 1] = c
                i = i + 1
            end
        end
        local lines = {}
        for line in (table.concat(code) .. "\n"):gmatch("([^\n]*)\n") do
            if line:find("\1", 1, true) then
                line = line:gsub("\1", ""):gsub("%s+$", "")
                if line:find("%S") then lines[#lines + 1] = line end
            else
                lines[#lines + 1] = line
            end
        end
        return found, lines
    end

    it("pastes the skeletons without their comments: a kernel's only comments are its header", function()
        local dir = os.tmpname()
        os.remove(dir)
        local out, rc = run(SHAPE, "-o", dir, "--no-ptxas")
        if rc ~= 0 and out:find("no CUDA device", 1, true) then
            pending(out)
            return
        end
        assert.are.equal(0, rc, out)
        local bodies = {}
        for launch in out:gmatch("\n| +(%d+) | ") do
            local src = assert(H.read_file(string.format("%s/launch%03d.cu", dir, tonumber(launch))))
            -- the header: the first line, the defines, then the lines naming the
            -- nodes and operands, ending with the last operand's
            local at = assert(src:find("\n// Operands:\n", 1, true), src) + #"\n// Operands:\n"
            while src:find("^//   i%d+: ", at) do at = src:find("\n", at, true) + 1 end
            local body = src:sub(at)
            local found = comments(body)
            assert.are.equal(0, #found, string.format("launch %s keeps %s", launch, found[1]))
            bodies[#bodies + 1] = body
        end
        os.execute("rm -rf '" .. dir .. "'")
        assert.truthy(#bodies >= 5, out)
        local all = table.concat(bodies, "\n")
        -- what the llama2 shape's kernels paste: each skeleton has comments
        -- (so this checks something), and each of its code lines is in a kernel
        for _, name in ipairs({ "pdl", "fault", "timeline", "cluster", "arrive", "attention", "weights", "staging", "argmax" }) do
            local path = "kernels/skeletons/" .. name .. ".cuh"
            local found, lines = comments(assert(H.read_file(path), path))
            assert.truthy(#found > 0, path .. " has no comment")
            for _, line in ipairs(lines) do
                if line:find("%S") then assert.truthy(all:find(line .. "\n", 1, true), path .. ": " .. line) end
            end
        end
    end)

    it("reads only a checkpoint's header", function()
        if not H.models_present() then
            pending("../shared/models is absent: no stories260K.bin")
            return
        end
        local out, rc = run(H.models .. "/stories260K.bin", "-q", "bf16") -- ptxas on bf16 kernels too
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
            { { "1,2" }, "a shape is 7 integers" },
            { { "/nonexistent/model.bin" }, "/nonexistent/model.bin: No such file or directory" },
            { { SHAPE, "-q", "int4" }, "-q takes fp32, bf16, fp16, q8 or q8a8, got int4" },
            { { SHAPE, "-l", "0" }, "-l needs a positive integer, got 0" },
            { { SHAPE, "--bogus" }, "unknown option --bogus" },
            { {}, "no shape" },
            { { "64,172,5,7,4,512,64" }, "dim 64 is not a multiple of n_heads 7" },
            { { SHAPE, "-q", "q8a8" }, "q8a8 needs the group size" },
        }
        for _, c in ipairs(cases) do
            local out, rc = run(table.unpack(c[1]))
            local what = table.concat(c[1], " ") .. ": " .. out
            assert.are.equal(1, rc, what)
            assert.truthy(out:find("kernels.lua: ", 1, true) and out:find(c[2], 1, true), what)
        end
    end)
end)
