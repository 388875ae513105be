-- kernels.lua — the CUDA C that moonkaas generates for a llama2 shape, written
-- without a GPU, and what ptxas makes of it: for reading the kernels, and for
-- seeing a generator change's registers, spills and shared memory before
-- spending GPU time on it.
--
--   lua scripts/kernels.lua SHAPE [-q fp32|bf16|fp16|q8|q8a8] [-l layers] [-o DIR] [--arch N]
--                          [--sample] [--no-ptxas]
--
-- SHAPE is a checkpoint (only its header is read) or its seven header fields,
-- "dim,hidden,layers,heads,kv_heads,vocab,seq_len" (stories110M:
-- 768,2048,12,12,12,32000,1024; Llama-2-7B: 4096,11008,32,32,32,-32000,2048).
-- The weights are zeros in a version 1 file (its 256-byte header keeps every
-- tensor 16-byte aligned, as device memory is; a legacy file's 28 bytes
-- would not, and the generator would then pick narrower loads than the GPU
-- gets). The graph is compiled for the CPU: the grouping passes are the same
-- for both devices, and model:kernel_source(i) writes each launch's CUDA C
-- as the GPU would compile it. -l sets the layers (default 1: every layer's
-- kernels are the same), -o the folder for the sources (default a temporary
-- one, removed after), --arch the GPU (default 90, sm_90), --sample a model
-- that samples its token (default: the argmax), --no-ptxas the sources only
-- (no nvcc: its ptxas takes about a second a launch). Where nvcc is found
-- (PATH, or $CUDA_HOME/bin, or /usr/local/cuda/bin), each source is compiled
-- with `nvcc -cubin -Xptxas -v` (NVRTC's compiler and ptxas, as at model
-- compile), and the table has its registers, spills and static shared memory,
-- and for sm_90 the blocks an SM holds at once (what the launch's registers,
-- shared memory and threads allow; a launch of more blocks than the SMs
-- hold runs in waves, MK_CUDA_TIMELINE's column). It is what the occupancy
-- API says; the driver's split of L1 and shared memory may hold fewer of a
-- launch with much shared memory (core/codegen/matvec.c's MK_STAGE_BYTES: w2's
-- 44 KB blocks were seen 3 an SM, not 4).
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local build = os.getenv("MK_BUILD") or "build"
package.cpath = build .. "/?.so;" .. package.cpath

local USAGE = "usage: lua scripts/kernels.lua checkpoint|dim,hidden,layers,heads,kv_heads,vocab,seq_len "
    .. "[-q fp32|bf16|fp16|q8|q8a8] [-l layers] [-o DIR] [--arch N] [--sample] [--no-ptxas]\n"

local PRECISIONS = { fp32 = true, bf16 = true, fp16 = true, q8 = true, q8a8 = true }

local function fail(msg)
    io.stderr:write("kernels.lua: " .. msg .. "\n")
    os.exit(1)
end

local function parse(argv)
    local o = { layers = 1, arch = 90 }
    local i = 1
    while i <= #argv do
        local a = argv[i]
        if a == "-h" or a == "--help" then
            io.stdout:write(USAGE)
            os.exit(0)
        elseif a == "--sample" then
            o.sample = true
            i = i + 1
        elseif a == "--no-ptxas" then
            o.no_ptxas = true
            i = i + 1
        elseif a == "-q" or a == "-l" or a == "-o" or a == "--arch" then
            local v = argv[i + 1]
            if not v then fail(a .. " needs a value\n" .. USAGE) end
            if a == "-q" then
                if not PRECISIONS[v] then fail("-q takes fp32, bf16, fp16, q8 or q8a8, got " .. v) end
                o.precision = v
            elseif a == "-o" then o.out = v
            else
                local n = math.tointeger(tonumber(v))
                if not n or n < 1 then fail(a .. " needs a positive integer, got " .. v) end
                if a == "-l" then o.layers = n else o.arch = n end
            end
            i = i + 2
        elseif a:sub(1, 1) == "-" and not a:match("^%-%d") then
            fail("unknown option " .. a .. "\n" .. USAGE)
        elseif o.shape then
            fail("one shape, got " .. o.shape .. " and " .. a .. "\n" .. USAGE)
        else
            o.shape = a
            i = i + 1
        end
    end
    if not o.shape then fail("no shape\n" .. USAGE) end
    return o
end

-- The header fields of SHAPE: seven integers, or a checkpoint's header; as
-- in a legacy header, a negative vocab_size means an unshared classifier.
local function header_of(llama2, shape)
    local h = {}
    local fields = llama2.checkpoint.FIELDS
    if shape:match("^[-%d,]+$") then
        local k = 0
        for v in shape:gmatch("[^,]+") do
            k = k + 1
            h[fields[k] or "extra"] = math.tointeger(tonumber(v))
        end
        if k ~= #fields then
            fail(string.format("a shape is %d integers (%s), got %d", #fields, table.concat(fields, ","), k))
        end
        return h
    end
    local f, err = io.open(shape, "rb")
    if not f then fail(tostring(err)) end
    local head = f:read(llama2.checkpoint.VERSION_HEADER_BYTES) or ""
    local size = f:seek("end")
    f:close()
    local parsed, why = llama2.checkpoint.parse_header(head, size)
    if not parsed then fail(shape .. ": " .. why) end
    for _, k in ipairs(fields) do h[k] = parsed[k] end
    if parsed.version and parsed.shared_classifier == 0 then h.vocab_size = -h.vocab_size end
    return h
end

-- A version 1 checkpoint of zeros with c's dimensions at path (sparse where
-- the file system allows).
local function write_zeros(llama2, c, path)
    local f = io.open(path, "wb")
    if not f then fail("cannot write " .. path) end
    f:write(llama2.checkpoint.header(c))
    f:seek("set", c.expected_bytes - 1)
    f:write("\0")
    f:close()
end

-- nvcc runs without LD_PRELOAD: a sanitizer's runtime preloaded for this
-- process (as `make asan` runs the specs) crashes nvcc's own tools.
local function find_nvcc()
    local candidates = { "nvcc" }
    if os.getenv("CUDA_HOME") then candidates[#candidates + 1] = os.getenv("CUDA_HOME") .. "/bin/nvcc" end
    candidates[#candidates + 1] = "/usr/local/cuda/bin/nvcc"
    for _, c in ipairs(candidates) do
        local p = io.popen("env -u LD_PRELOAD " .. c .. " --version 2>/dev/null")
        local out = p and p:read("a") or ""
        if p then p:close() end
        if out:find("Cuda compiler", 1, true) then return c end
    end
end

-- ptxas's verdict on one source: registers, spill bytes (stores + loads) and
-- static shared memory, or nil and the compiler's message.
local function ptxas(nvcc, file, arch)
    local p = io.popen(string.format("env -u LD_PRELOAD %s -cubin -arch=sm_%d -std=c++17 -Xptxas -v "
                                     .. "-o /dev/null '%s' 2>&1", nvcc, arch, file))
    local out = p:read("a")
    local ok = p:close()
    local regs = out:match("Used (%d+) registers")
    if not ok or not regs then return nil, (out:match("[^\n]*error[^\n]*") or out):sub(1, 200) end
    local st, ld = out:match("(%d+) bytes spill stores, (%d+) bytes spill loads")
    return { registers = tonumber(regs), spills = tonumber(st or 0) + tonumber(ld or 0),
             smem = tonumber(out:match("(%d+) bytes smem") or 0) }
end

-- The blocks of `threads` an SM of sm_90 holds with r's registers and static
-- shared memory: 65,536 registers an SM, given to a warp 256 at a time; 64
-- warps and 32 blocks an SM; 228 KiB of shared memory an SM, 1 KiB of it
-- kept a block. nil for other architectures.
local SM90 = { registers = 65536, granule = 256, warps = 64, blocks = 32, smem = 228 * 1024, reserved = 1024 }
local function blocks_per_sm(r, threads, arch)
    if arch ~= 90 or not r or not threads then return nil end
    local L = SM90
    local warps = (threads + 31) // 32
    local per_warp = (r.registers * 32 + L.granule - 1) // L.granule * L.granule
    return math.min(L.warps // warps, L.blocks, L.registers // (warps * per_warp),
                    L.smem // (r.smem + L.reserved))
end

local function main(argv)
    local o = parse(argv)
    local mk = require("moonkaas")
    local llama2 = require("moonkaas.llama2")
    local h = header_of(llama2, o.shape)
    h.n_layers = o.layers
    h.version, h.shared_classifier = 1, h.vocab_size > 0 and 1 or 0
    h.vocab_size = math.abs(h.vocab_size)
    local c, why = llama2.checkpoint.config_from_header(h)
    if not c then fail(why) end
    local dir = o.out or os.tmpname()
    if not o.out then os.remove(dir) end
    if not os.execute("mkdir -p '" .. dir .. "'") then fail("cannot make the folder " .. dir) end
    local path = dir .. "/zeros.bin"
    write_zeros(llama2, c, path)
    local ok, net = pcall(llama2.build, mk, assert(llama2.read_config(path)),
                          { device = "cpu", output = o.sample and "sample" or "argmax",
                            precision = o.precision })
    os.remove(path)
    if not ok then fail(tostring(net)) end
    local nvcc = not o.no_ptxas and find_nvcc()
    print(string.format("%s%s; sources in %s%s", llama2.checkpoint.describe(c),
        o.precision and (", " .. o.precision) or "", dir,
        nvcc and string.format("; ptxas for sm_%d", o.arch)
            or (o.no_ptxas and "; sources only" or "; no nvcc: sources only")))
    print(string.format("| %-6s | %-78s | %9s | %6s | %6s | %9s |", "launch", "group", "registers", "spills",
                        "smem", "blocks/SM"))
    print("|--------|--------------------------------------------------------------------------------|" ..
          "-----------|--------|--------|-----------|")
    local i, written = 1, 0
    while true do
        local got, src = pcall(net.model.kernel_source, net.model, i)
        if not got and tostring(src):find("out of range", 1, true) then break end
        if not got and not tostring(src):find("library kernel", 1, true) then fail(tostring(src)) end
        if got then
            local file = string.format("%s/launch%03d.cu", dir, i)
            local f = mk.file_writer(file) -- never through a planted link
            f:write(src)
            f:commit()
            written = written + 1
            local what = (src:match("^// moonkaas ([^\n]*)") or "?"):sub(1, 78)
            local r, err = nil, nil
            if nvcc then r, err = ptxas(nvcc, file, o.arch) end
            if nvcc and not r then fail(file .. ": " .. tostring(err)) end
            local threads = tonumber(src:match("__launch_bounds__%((%d+)"))
            print(string.format("| %6d | %-78s | %9s | %6s | %6s | %9s |", i, what, r and r.registers or "-",
                r and r.spills or "-", r and r.smem or "-", blocks_per_sm(r, threads, o.arch) or "-"))
        end
        i = i + 1
    end
    if not o.out then os.execute("rm -rf '" .. dir .. "'") end
    if written == 0 then fail("no launch has generated CUDA C") end
end

local ok, err = pcall(main, arg)
if not ok then fail(tostring(err)) end
