-- The include graph of core/ (doc/ARCHITECTURE.md, "Files and headers"):
-- passes never include a device header. Each file's #include "..." lines are
-- followed through core/ (transitively); a file that is not one of the
-- devices, the code generators or the model stage that binds launches to them
-- must reach neither core/device.h nor anything under kernels/. So a pass
-- decides from the target (mk_target) and never calls a device.
-- Files that may reach device.h: it, the stage that binds launches and calls
-- the device (model.h, model.c, run.c, context.c, plugin.c), the CPU device
-- (cpu/, sample.c, and tensor.c's strided walk and fault messages), move.h
-- (the data-movement index maps both devices' kernels read from a launch) and
-- the generators (codegen/), which write a launch's kernel.
local allowed = {
    ["core/device.h"] = true, ["core/model.h"] = true, ["core/model.c"] = true,
    ["core/run.c"] = true, ["core/context.c"] = true, ["core/plugin.c"] = true,
    ["core/sample.c"] = true, ["core/tensor.c"] = true, ["core/move.h"] = true,
}
local function may_reach_device(path)
    return allowed[path] or path:match("^core/cpu/") or path:match("^core/codegen/")
end

local function lines_of(cmd)
    local out = {}
    for l in io.popen(cmd):lines() do out[#out + 1] = l end
    return out
end

local function exists(p)
    local f = io.open(p)
    if f then f:close() end
    return f ~= nil
end

local function dirname(p) return p:match("^(.*)/[^/]*$") or "." end

-- a/b/../c -> a/c
local function normalize(p)
    local parts = {}
    for part in p:gmatch("[^/]+") do
        if part == ".." and #parts > 0 and parts[#parts] ~= ".." then table.remove(parts)
        elseif part ~= "." then parts[#parts + 1] = part end
    end
    return table.concat(parts, "/")
end

-- The local includes of a file, as repository paths (those that exist: core/
-- is on the include path, and a file's own folder).
local function includes(path)
    local found = {}
    local f = assert(io.open(path))
    for line in f:lines() do
        local name = line:match('^%s*#%s*include%s+"([^"]+)"')
        if name then
            local here = normalize(dirname(path) .. "/" .. name)
            local there = normalize("core/" .. name)
            if exists(here) then found[#found + 1] = here
            elseif exists(there) then found[#found + 1] = there
            else found[#found + 1] = normalize(name) end
        end
    end
    f:close()
    return found
end

-- The chain from path to a device header, or nil.
local function device_chain(path, seen)
    seen = seen or {}
    if seen[path] then return nil end
    seen[path] = true
    if path == "core/device.h" or path:match("^kernels/") then return { path } end
    if not exists(path) then return nil end
    for _, inc in ipairs(includes(path)) do
        local chain = device_chain(inc, seen)
        if chain then
            table.insert(chain, 1, path)
            return chain
        end
    end
    return nil
end

describe("the include graph", function()
    local files = lines_of("find core -name '*.c' -o -name '*.h' | sort")

    it("finds the core's files", function()
        assert.is_true(#files > 20, "found " .. #files .. " files under core/")
    end)

    it("keeps device headers out of the passes", function()
        local bad = {}
        for _, f in ipairs(files) do
            if not may_reach_device(f) then
                local chain = device_chain(f)
                if chain then bad[#bad + 1] = table.concat(chain, " -> ") end
            end
        end
        assert.are.same({}, bad)
    end)

    it("catches a pass that includes one", function()
        -- the rule itself: a pass file with device.h in it would be named
        local tmp = os.tmpname()
        local f = assert(io.open(tmp, "w"))
        f:write('#include "passes.h"\n#include "../core/device.h"\n')
        f:close()
        local chain = device_chain("core/fusion.c") -- the real file: none
        assert.is_nil(chain)
        local got = {}
        for _, inc in ipairs(includes(tmp)) do got[#got + 1] = inc end
        os.remove(tmp)
        local reaches = false
        for _, inc in ipairs(got) do reaches = reaches or device_chain(inc) ~= nil end
        assert.is_true(reaches, "device.h not followed: " .. table.concat(got, ", "))
    end)
end)
