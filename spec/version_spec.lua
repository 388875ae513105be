-- The version has one source, MK_VERSION_* in core/moonkaas.h; mk.version
-- (mk_version()), the rockspec's name, version and tag, the newest release in
-- CHANGELOG.md and moonkaas.pc.in follow it. The rockspec's source is a git
-- URL with that tag (not a local path), and the license it names is LICENSE's.
local H = require "spec.helpers"
local mk = H.mk()

local function read(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end

local header = read("core/moonkaas.h")
local function part(name)
    return assert(header:match("#define MK_VERSION_" .. name .. " +(%d+)"), "no MK_VERSION_" .. name)
end
local VERSION = part("MAJOR") .. "." .. part("MINOR") .. "." .. part("PATCH")

-- The rockspec in the checkout's root: exactly one, moonkaas-<version>-<revision>.rockspec.
local function rockspec()
    local p = assert(io.popen("ls moonkaas-*.rockspec 2>/dev/null"))
    local names = {}
    for name in p:lines() do names[#names + 1] = name end
    p:close()
    assert.are.equal(1, #names, "rockspecs: " .. table.concat(names, ", "))
    local env = {}
    local chunk
    if setfenv then -- Lua 5.1, LuaJIT
        chunk = assert(loadstring(read(names[1]), "=" .. names[1]))
        setfenv(chunk, env)
    else
        chunk = assert(load(read(names[1]), "=" .. names[1], "t", env))
    end
    chunk()
    return names[1], env
end

describe("the version", function()
    it("is MK_VERSION_* in core/moonkaas.h, and mk.version says it", function()
        assert.are.equal(VERSION, mk.version)
    end)

    it("names the rockspec, its version and its git tag", function()
        local name, spec = rockspec()
        assert.are.equal("moonkaas", spec.package)
        local v, rev = spec.version:match("^(.-)%-(%d+)$")
        assert.are.equal(VERSION, v, "rockspec version " .. spec.version)
        assert.are.equal(string.format("moonkaas-%s-%s.rockspec", v, rev), name)
        assert.are.equal("v" .. VERSION, spec.source.tag)
        -- a repository anyone can clone, not a path on the machine that wrote it
        assert.truthy(spec.source.url:match("^git%+https://[%w%.%-]+/.+%.git$"), spec.source.url)
    end)

    it("is the newest release in CHANGELOG.md", function()
        local newest
        for line in read("CHANGELOG.md"):gmatch("[^\n]+") do
            local v = line:match("^## (%d+%.%d+%.%d+)")
            if v then newest = v break end
        end
        assert.are.equal(VERSION, newest)
    end)

    it("goes into moonkaas.pc, whose fields make install fills", function()
        local pc = read("moonkaas.pc.in")
        assert.truthy(pc:find("\nVersion: @VERSION@\n", 1, true), pc)
        assert.truthy(pc:find("\nLibs: -L${libdir} -lmoonkaas\n", 1, true), pc)
        assert.truthy(pc:find("\nCflags: -I${includedir}\n", 1, true), pc)
    end)
end)

describe("the license", function()
    it("is MIT, in LICENSE as the rockspec says", function()
        local _, spec = rockspec()
        assert.are.equal("MIT", spec.description.license)
        local text = read("LICENSE")
        assert.truthy(text:find("^MIT License\n"), text:sub(1, 80))
        assert.truthy(text:find("Permission is hereby granted, free of charge", 1, true))
    end)
end)
