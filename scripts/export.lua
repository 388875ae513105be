-- export.lua — converts a llama2.c checkpoint between its formats, as
-- llama2.c's export.py writes them: legacy (version 0, what run.c reads),
-- version 1 (float32 with a 256-byte header) and version 2 (int8 in groups,
-- what runq.c reads). Any direction:
--
--   lua scripts/export.lua IN OUT --version 0|1|2 [--group-size N]
--
-- Version 2 quantizes every matrix (token embedding and an unshared
-- classifier included) over its flat elements in groups of N (default 64,
-- halved until it divides dim: export.py's backoff), the norms stay float32.
-- From version 2 to 0 or 1 the matrices are dequantized (q × scale, float32).
-- A legacy output's freq_cis block (which run.c skips) is copied from a
-- legacy input, else computed as llama2.c's model.py does (see
-- moonkaas.llama2.checkpoint's freq_cis_bytes). The weights are read mapped
-- (mk.from_file) and written in pieces; OUT appears whole or not at all.
--
-- Prints one line (what was written) on stdout; an error goes to stderr
-- with exit code 1. The checkout's lua/ and build/ come first on the module
-- paths, so it runs from a fresh build (MK_BUILD=dir picks another build).

local here = (arg and arg[0] or ""):match("^(.*)[/\\]") or "."
local root = here .. "/.."
local build = os.getenv("MK_BUILD") or (root .. "/build")
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/?.so;" .. package.cpath

local USAGE = "usage: lua scripts/export.lua IN OUT --version 0|1|2 [--group-size N]\n"

local function fail(msg)
    io.stderr:write("export: " .. msg .. "\n")
    os.exit(1)
end

local function parse(argv)
    local o, files = {}, {}
    local i = 1
    while i <= #argv do
        local a = argv[i]
        if a == "-h" or a == "--help" then
            io.stdout:write(USAGE)
            os.exit(0)
        elseif a == "--version" or a == "--group-size" then
            local v = argv[i + 1]
            if not v then fail(a .. " needs a value\n" .. USAGE) end
            local n = require("moonkaas.compat").tointeger(tonumber(v)) -- Lua 5.1 too
            if a == "--version" then
                if n ~= 0 and n ~= 1 and n ~= 2 then fail("--version takes 0, 1 or 2, got " .. v) end
                o.version = n
            else
                if not n or n <= 0 then fail("--group-size takes a positive integer, got " .. v) end
                o.group_size = n
            end
            i = i + 2
        elseif a:sub(1, 1) == "-" and a ~= "-" then
            fail("unknown option " .. a .. "\n" .. USAGE)
        else
            files[#files + 1] = a
            i = i + 1
        end
    end
    if #files ~= 2 then fail("needs an input and an output file\n" .. USAGE) end
    if not o.version then fail("needs --version 0|1|2\n" .. USAGE) end
    if o.group_size and o.version ~= 2 then fail("--group-size is for --version 2 only") end
    o.input, o.output = files[1], files[2]
    return o
end

local o = parse({ ... })
local checkpoint = require("moonkaas.llama2.checkpoint")
local ok, mk = pcall(require, "moonkaas")
if not ok then fail("cannot load the moonkaas module: " .. tostring(mk)) end

local c, err = checkpoint.read_config(o.input)
if not c then fail(err) end
local t0 = mk.clock()
local call_ok, oc, werr = pcall(checkpoint.export, mk, c, o.output, o.version, { group_size = o.group_size })
if not call_ok then fail(tostring(oc)) end
if not oc then fail(werr) end
local NAMES = { [0] = "legacy", "version 1", "version 2" }
io.stdout:write(string.format("%s (%s, %d bytes) -> %s (%s%s, %d bytes) in %.0f ms\n", o.input, NAMES[c.version],
    c.file_bytes, o.output, NAMES[oc.version],
    oc.version == 2 and string.format(", int8 in groups of %d", oc.group_size) or "",
    oc.file_bytes, (mk.clock() - t0) * 1000))
