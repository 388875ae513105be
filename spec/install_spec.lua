-- `make install PREFIX=<a temporary directory>` from the build the specs run
-- (build/, made with the same variables: nothing is rebuilt), then, from
-- another directory, as users of the installed copy:
--   * a C host (spec/fixtures/installed_host.c) built with
--     `pkg-config --cflags --libs moonkaas`, run against lib/libmoonkaas.so,
--     and the same host linked with lib/libmoonkaas.a: each runs a small
--     network against a double-precision reference and, where the build made
--     the CUDA plugin, maps the one in PREFIX/lib/moonkaas/ (never the build
--     tree's);
--   * the Lua module and a script, with LUA_PATH/LUA_CPATH on the prefix;
-- then `make uninstall` leaves no file behind. Also: the Lua module (what a
-- rock installs) has no build path baked into its plugin search, where the
-- library has the build tree's.
local H = require "spec.helpers"
local mk = H.mk()
local seed = H.seed("install_spec")

local BUILD = os.getenv("MK_BUILD")
if BUILD == nil or BUILD == "" then BUILD = "build" end
local with_plugin = mk.build_info:find("cuda plugin", 1, true) ~= nil

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Runs a shell command; returns whether it exited 0, and its stdout and stderr together.
local function sh(cmd)
    local p = assert(io.popen("(" .. cmd .. ") 2>&1"))
    local out = p:read("a")
    local ok = p:close()
    return ok == true, out
end

-- The variables build/ was made with (its .config), so that `make install` finds
-- every object up to date; a make that sees other ones would rebuild the tree.
local function build_vars()
    local line = assert(H.read_file(BUILD .. "/.config"), "no " .. BUILD .. "/.config"):match("[^\n]*")
    local cuda, cudnn = line:match("^CUDA=(%d) CUDNN=(%d)")
    local vars = { "BUILD=" .. q(BUILD), "CUDA=" .. cuda, "CUDNN=" .. cudnn }
    local arch, ptx = line:match(" CUDA_ARCH=(.-) CUDA_PTX=(.*)$")
    if arch then
        vars[#vars + 1] = "CUDA_ARCH=" .. q(arch)
        vars[#vars + 1] = "CUDA_PTX=" .. q(ptx)
    end
    return table.concat(vars, " ")
end

-- make without the caller's jobserver (make test runs busted)
local MAKE = "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory"

-- "key value" lines into a table
local function fields(out)
    local r = {}
    for k, v in out:gmatch("([%w_]+) ([^\n]*)") do r[k] = v end
    return r
end

describe("make install", function()
    local prefix, elsewhere, pc_env

    setup(function()
        if BUILD ~= "build" then return end
        prefix = assert(io.popen("mktemp -d /tmp/mk-install.XXXXXX")):read("l")
        prefix = assert(io.popen("realpath " .. q(prefix))):read("l")
        elsewhere = prefix .. "/elsewhere"
        os.execute("mkdir -p " .. q(elsewhere))
        pc_env = "PKG_CONFIG_PATH=" .. q(prefix .. "/lib/pkgconfig")
    end)
    teardown(function()
        if prefix then os.execute("rm -rf " .. q(prefix)) end
    end)

    local function need_build(pending)
        if BUILD ~= "build" then
            pending("runs on the plain build (MK_BUILD=" .. BUILD .. ")")
            return false
        end
        if not sh("command -v pkg-config && command -v cc") then
            pending("no pkg-config or cc")
            return false
        end
        return true
    end

    it("installs the library, header, pkg-config file, plugin, module and scripts; uninstall removes them", function()
        if not need_build(pending) then return end
        local ok, out = sh(MAKE .. " " .. build_vars() .. " PREFIX=" .. q(prefix) .. " install")
        assert.is_true(ok, out)
        local files = {
            "include/moonkaas.h", "lib/libmoonkaas.a", "lib/libmoonkaas.so",
            "lib/libmoonkaas.so." .. mk.version, "lib/pkgconfig/moonkaas.pc",
            "lib/lua/5.4/moonkaas/core.so", "share/lua/5.4/moonkaas/init.lua",
            "share/lua/5.4/moonkaas/llama2/model.lua", "share/moonkaas/scripts/llama2.lua",
        }
        if with_plugin then
            files[#files + 1] = "lib/moonkaas/libmoonkaas_cuda.so"
            files[#files + 1] = "lib/lua/5.4/moonkaas/libmoonkaas_cuda.so"
        end
        for _, f in ipairs(files) do
            assert.truthy(H.read_file(prefix .. "/" .. f), "not installed: " .. f .. "\n" .. out)
        end
        ok, out = sh(pc_env .. " pkg-config --modversion moonkaas")
        assert.is_true(ok, out)
        assert.are.equal(mk.version, out:match("[^\n]*"))

        -- the C host against the shared library, from another directory
        local host, cflags = elsewhere .. "/host", nil
        ok, cflags = sh(pc_env .. " pkg-config --cflags --libs moonkaas")
        assert.is_true(ok, cflags)
        ok, out = sh("cc -std=c11 -Wall -o " .. q(host) .. " spec/fixtures/installed_host.c "
            .. cflags:gsub("\n", ""))
        assert.is_true(ok, out)
        ok, out = sh("cd " .. q(elsewhere) .. " && env -u MK_CUDA_PLUGIN LD_LIBRARY_PATH="
            .. q(prefix .. "/lib") .. " ./host " .. seed)
        assert.is_true(ok, out)
        local r = fields(out)
        assert.are.equal(mk.version, r.version, out)
        assert.is_true(tonumber(r.max_error) <= 1, out)
        local function check_plugin(r, out)
            if with_plugin then
                assert.are.equal(prefix .. "/lib/moonkaas/libmoonkaas_cuda.so", r.plugin, out)
                assert.is_nil(r.cuda:find("not found", 1, true), out)
                assert.is_nil(r.cuda:find("is broken", 1, true), out)
            else
                assert.are.equal("none", r.plugin, out)
            end
        end
        check_plugin(r, out)

        -- the same host linked with libmoonkaas.a (no LD_LIBRARY_PATH): the installed
        -- library's baked plugin directory
        local ok_s, static = sh(pc_env .. " pkg-config --static --libs moonkaas")
        assert.is_true(ok_s, static)
        static = static:gsub("\n", ""):gsub("%-lmoonkaas", prefix .. "/lib/libmoonkaas.a")
        ok, out = sh("cc -std=c11 -Wall -o " .. q(host .. "_static") .. " -I" .. q(prefix .. "/include")
            .. " spec/fixtures/installed_host.c " .. static)
        assert.is_true(ok, out)
        ok, out = sh("cd " .. q(elsewhere) .. " && env -u MK_CUDA_PLUGIN -u LD_LIBRARY_PATH ./host_static "
            .. seed)
        assert.is_true(ok, out)
        r = fields(out)
        assert.is_true(tonumber(r.max_error) <= 1, out)
        check_plugin(r, out)

        -- the Lua module and a script, from the prefix only
        local lua_env = "env -u MK_BUILD -u MK_CUDA_PLUGIN LUA_PATH=" ..
            q(prefix .. "/share/lua/5.4/?.lua;" .. prefix .. "/share/lua/5.4/?/init.lua") ..
            " LUA_CPATH=" .. q(prefix .. "/lib/lua/5.4/?.so")
        ok, out = sh("cd " .. q(elsewhere) .. " && " .. lua_env .. [[ lua5.4 -e '
            local mk = require "moonkaas"
            print("version " .. mk.version)
            print("core " .. package.searchpath("moonkaas.core", package.cpath))
            local x = mk.input("x", "float32", {2})
            local m <close> = mk.compile((x * 2):relu())
            local y = m:run({x = mk.tensor({1.5, -1})})
            print("result " .. y:get(1) .. " " .. y:get(2))
            local ok, why = mk.cuda_available()
            print("cuda " .. (ok and "1" or why))
            local maps = io.open("/proc/self/maps"):read("a")
            print("plugin " .. (maps:match("(/%S*libmoonkaas_cuda%.so)") or "none"))']])
        assert.is_true(ok, out)
        r = fields(out)
        assert.are.equal(mk.version, r.version, out)
        assert.are.equal(prefix .. "/lib/lua/5.4/moonkaas/core.so", r.core, out)
        assert.are.equal("3.0 0.0", r.result, out)
        check_plugin(r, out)
        ok, out = sh("cd " .. q(elsewhere) .. " && " .. lua_env .. " lua5.4 " ..
            q(prefix .. "/share/moonkaas/scripts/llama2.lua") .. " -h")
        assert.is_true(ok, out)
        assert.truthy(out:find("Usage:", 1, true), out)

        ok, out = sh(MAKE .. " " .. build_vars() .. " PREFIX=" .. q(prefix) .. " uninstall")
        assert.is_true(ok, out)
        ok, out = sh("find " .. q(prefix) .. " ! -path " .. q(elsewhere .. "*") .. " '(' -type f -o -type l ')'")
        assert.is_true(ok, out)
        assert.are.equal("", out, "left behind by make uninstall")
    end)
end)

describe("the plugin search", function()
    it("bakes no build path into the Lua module (a rock's), where the library has the build tree's", function()
        if not with_plugin then pending("no CUDA plugin: nothing is baked in") return end
        local dir = assert(io.popen("cd " .. q(BUILD) .. " && pwd -P")):read("l")
        local module = assert(H.read_file(BUILD .. "/moonkaas/core.so"))
        assert.is_nil(module:find(dir, 1, true), "core.so names " .. dir)
        local lib = assert(H.read_file(BUILD .. "/libmoonkaas.a"))
        assert.truthy(lib:find(dir, 1, true), "libmoonkaas.a does not name " .. dir)
    end)
end)
