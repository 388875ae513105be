-- Why CUDA is not there is one of distinct reasons, each its own words:
-- no NVIDIA driver at all (libcuda.so.1 cannot be opened; the CUDA runtime
-- calls that "driver version is insufficient", which sent users to update a
-- driver they do not have), a driver older than the build's runtime, no
-- device, no code for the device, and no plugin (core/plugin.c). The probe is
-- kernels/cuda_device.cu's. Each case runs in a child lua5.4 (the reason is
-- found once per process) with this spec's module paths.
local H = require "spec.helpers"
local mk = H.mk()

local LUA = os.getenv("LUA") or "lua5.4"
local with_plugin = mk.build_info:find("cuda plugin", 1, true) ~= nil

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Runs `code` in a child with `env` ("NAME=value ..."); returns its output.
local function child(env, code)
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write(string.format("package.path = %q\npackage.cpath = %q\n", package.path, package.cpath), code)
    f:close()
    local p = assert(io.popen(string.format("env -u MK_CUDA_PLUGIN %s %s %s 2>&1", env, LUA, q(path))))
    local out = p:read("a")
    p:close()
    os.remove(path)
    return out
end

local REASON = [[
local mk = require "moonkaas"
local ok, why = mk.cuda_available()
print("available=" .. tostring(ok))
print("reason=" .. tostring(why))
local x = mk.input("x", "float32", { 2 })
local compiled, err = pcall(mk.compile, x * 2, { device = "cuda" })
print("compile=" .. tostring(compiled) .. " " .. tostring(err))
local m <close> = mk.compile(x * 2)
print("cpu=" .. m:run({ x = mk.tensor({ 1.5, -2 }) }):get(2))
]]

local function fields(out)
    local r = {}
    for k, v in out:gmatch("([%w_]+)=([^\n]*)") do r[k] = v end
    return r
end

local NO_DRIVER = "no NVIDIA driver found (libcuda.so.1 not loadable)"

describe("CUDA's reasons", function()
    it("without an NVIDIA driver: no driver found, not a driver too old", function()
        if not with_plugin then pending("no CUDA plugin in this build") return end
        -- package.loadlib(path, "*") only opens the library: whether the driver is here
        local here = child("", 'print(package.loadlib("libcuda.so.1", "*") and "driver" or "none")')
        if here:find("driver", 1, true) then pending("libcuda.so.1 opens here: there is a driver") return end
        local r = fields(child("", REASON))
        assert.are.equal("false", r.available, r.reason)
        assert.are.equal(NO_DRIVER, r.reason)
        assert.truthy(r.compile:find("^false no CUDA device: " .. NO_DRIVER:gsub("%p", "%%%0")), r.compile)
        assert.are.equal("-4.0", r.cpu)
    end)

    it("with a libcuda.so.1 that is no driver (the toolkit's stub) is another reason", function()
        if not with_plugin then pending("no CUDA plugin in this build") return end
        local stub
        for _, s in ipairs({ "/usr/local/cuda/lib64/stubs/libcuda.so", "/usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so" }) do
            if io.open(s) then stub = s break end
        end
        if not stub then pending("no stub libcuda.so in the toolkit") return end
        local dir = assert(io.popen("mktemp -d /tmp/mk-driver.XXXXXX")):read("l")
        os.execute("ln -s " .. q(stub) .. " " .. q(dir .. "/libcuda.so.1"))
        local r = fields(child("LD_LIBRARY_PATH=" .. q(dir), REASON))
        os.execute("rm -rf " .. q(dir))
        print("# with the stub: " .. tostring(r.reason))
        assert.are.equal("false", r.available, r.reason)
        assert.is_nil(r.reason:find(NO_DRIVER, 1, true), r.reason)
        assert.truthy(r.compile:find("^false no CUDA device: "), r.compile)
        assert.are.equal("-4.0", r.cpu)
    end)

    it("without the plugin: the plugin's reason, naming neither driver nor device", function()
        local missing = "/nonexistent/libmoonkaas_cuda.so"
        local r = fields(child("MK_CUDA_PLUGIN=" .. missing, REASON))
        assert.are.equal("false", r.available, r.reason)
        if with_plugin then
            assert.truthy(r.reason:find("CUDA plugin (libmoonkaas_cuda.so) was not found", 1, true), r.reason)
        else
            assert.truthy(r.reason:find("built without CUDA", 1, true), r.reason)
        end
        assert.is_nil(r.reason:find("driver", 1, true), r.reason)
        assert.are.equal("-4.0", r.cpu)
    end)
end)
