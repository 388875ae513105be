-- The CUDA plugin carries machine code for every GPU generation in CUDA_ARCH
-- (default sm_80 sm_86 sm_89 sm_90: A100 to H100) and PTX of the newest
-- (CUDA_PTX, default compute_90), which the driver compiles for later GPUs;
-- `make CUDA_ARCH=sm_90` builds one. The built plugin is checked with
-- cuobjdump (or, where the toolkit has none, by reading its fat binaries)
-- against the variables its build recorded (BUILD/.config), so a
-- build with CUDA_ARCH=sm_90 (CI's) passes as well as the default one;
-- skipped where the build made no plugin.
local BUILD = os.getenv("MK_BUILD")
if BUILD == nil or BUILD == "" then BUILD = "build" end
local PLUGIN = BUILD .. "/libmoonkaas_cuda.so"

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local function sh(cmd)
    local p = assert(io.popen("(" .. cmd .. ") 2>&1"))
    local out = p:read("a")
    return p:close() == true, out
end

local function cuobjdump()
    for _, c in ipairs({ "/usr/local/cuda/bin/cuobjdump", "cuobjdump" }) do
        if sh("command -v " .. c) then return c end
    end
end

-- The set of architecture numbers ("80", "90a") named by `pattern` in `text`.
local function arches(text, pattern)
    local set, list = {}, {}
    for a in text:gmatch(pattern) do
        if not set[a] then set[a] = true list[#list + 1] = a end
    end
    table.sort(list)
    return table.concat(list, " ")
end

-- The device code in a plugin, read from its .nv_fatbin section without CUDA's
-- tools (where cuobjdump is missing, as on a toolkit without it): the section
-- holds one fat binary per .cu file (magic 0xBA55ED50, then its header and
-- payload sizes), each a list of entries whose header gives the kind (1 PTX,
-- 2 machine code) and the architecture (at byte 28). Returns the ELF and the
-- PTX architectures as sorted lists "80 90", and each list's entries per fat
-- binary (every file is built for every architecture: one each).
local function fatbin_arches(path)
    local section = os.tmpname()
    local ok, out = sh("objcopy -O binary --only-section=.nv_fatbin " .. q(path) .. " " .. q(section))
    assert.is_true(ok, out)
    local f = assert(io.open(section, "rb"))
    local s = f:read("a")
    f:close()
    os.remove(section)
    local count, found = 0, { [1] = {}, [2] = {} }
    local pos = 1
    while pos + 16 <= #s do
        local magic, _, hs, fs = string.unpack("<I4I2I2I8", s, pos)
        if magic ~= 0xBA55ED50 then
            pos = pos + 8 -- fat binaries start 8-byte aligned
        else
            count = count + 1
            local e, stop = pos + hs, pos + hs + fs
            while e < stop do
                local kind, _, ehs, ps = string.unpack("<I2I2I4I8", s, e)
                local arch = string.unpack("<I4", s, e + 28)
                assert.truthy(found[kind], "entry of kind " .. kind)
                found[kind][arch] = (found[kind][arch] or 0) + 1
                e = e + ehs + ps
            end
            pos = stop
        end
    end
    local function list(set)
        local l = {}
        for arch, n in pairs(set) do
            assert.are.equal(count, n, "sm_" .. arch .. " in " .. n .. " of " .. count .. " files")
            l[#l + 1] = tostring(arch)
        end
        table.sort(l)
        return table.concat(l, " ")
    end
    return list(found[2]), list(found[1]), count
end

-- The Makefile's CUDA_ARCHS and CUDA_PTX for these variables (in a scratch build
-- directory: the real one's recorded configuration stays as it is).
local function make_arch(vars)
    local dir = assert(io.popen("mktemp -d /tmp/mk-arch.XXXXXX")):read("l")
    local ok, out = sh("env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u CUDA_ARCH -u CUDA_PTX make -s "
        .. "--no-print-directory BUILD=" .. q(dir) .. " CUDA=1 " .. vars
        .. " --eval='mk-print-arch: ; @echo \"$(CUDA_ARCHS) / $(CUDA_PTX)\"' mk-print-arch")
    os.execute("rm -rf " .. q(dir))
    assert.is_true(ok, out)
    return out:match("[^\n]*")
end

describe("the CUDA plugin's GPU generations", function()
    it("default to sm_80, sm_86, sm_89, sm_90 and PTX of compute_90; CUDA_ARCH= builds one", function()
        assert.are.equal("sm_80 sm_86 sm_89 sm_90 / compute_90", make_arch(""))
        assert.are.equal("sm_90 / compute_90", make_arch("CUDA_ARCH=sm_90"))
        assert.are.equal("sm_86 sm_80 / compute_86", make_arch("'CUDA_ARCH=sm_86;sm_80'"))
        assert.are.equal("sm_89 / ", make_arch("CUDA_ARCH=sm_89 CUDA_PTX="))
    end)

    it("are in the built plugin: machine code for each of CUDA_ARCH, PTX of CUDA_PTX only", function()
        if not io.open(PLUGIN) then pending("no CUDA plugin in " .. BUILD) return end
        local config = assert(io.open(BUILD .. "/.config")):read("l")
        local arch, ptx = config:match(" CUDA_ARCH=(.-) CUDA_PTX=(.*)$")
        assert.truthy(arch, "no CUDA_ARCH in " .. BUILD .. "/.config: " .. config)
        local want_elf, want_ptx = arches(arch, "sm_(%d+)"), arches(ptx, "compute_(%d+)")
        print("# " .. BUILD .. ": CUDA_ARCH=" .. arch .. " CUDA_PTX=" .. ptx)
        local elf, ptxs, files = fatbin_arches(PLUGIN)
        print("# .nv_fatbin: " .. files .. " files, machine code for " .. elf .. ", PTX for " .. ptxs)
        assert.are.equal(want_elf, elf)
        assert.are.equal(want_ptx, ptxs)
        local tool = cuobjdump()
        if not tool then
            print("# no cuobjdump here: the fat binaries were read directly")
            return
        end
        local ok, listed = sh(tool .. " --list-elf " .. q(PLUGIN))
        assert.is_true(ok, listed)
        assert.are.equal(want_elf, arches(listed, "%.sm_(%d+)%.cubin"), listed)
        ok, listed = sh(tool .. " --list-ptx " .. q(PLUGIN))
        assert.is_true(ok, listed)
        assert.are.equal(want_ptx, arches(listed, "%.sm_(%d+)%.ptx"), listed)
    end)
end)
