-- graph.lua — pictures of a compiled llama2 model: the plan as Graphviz
-- (model:dot()) and the arena over the evaluation order (model:memory_svg()).
--
--   lua scripts/graph.lua model.bin [-o graph.svg] [-m memory.svg] [-d cpu|cuda] [-n steps]
--
-- -o takes .svg, .png or .dot: .svg and .png are drawn by Graphviz's `dot`
-- where it is installed (scripts/setup.sh installs it), else the .dot is
-- written beside them and the script says how to draw it. -m writes the
-- memory picture (moonkaas draws it itself: no dependency). -n sizes the KV
-- caches (default 256 positions); -d picks the device the plan is made for
-- (default cpu: both devices group the same nodes).
package.path = "lua/?.lua;lua/?/init.lua;" .. package.path
local build = os.getenv("MK_BUILD") or "build"
package.cpath = build .. "/?.so;" .. package.cpath

local USAGE = "usage: lua scripts/graph.lua model.bin [-o graph.svg|.png|.dot] [-m memory.svg] "
    .. "[-d cpu|cuda] [-n steps]\n"

local function fail(msg)
    io.stderr:write("graph.lua: " .. msg .. "\n")
    os.exit(1)
end

local function parse(argv)
    local o = { out = "graph.svg", device = "cpu", steps = 256 }
    local i = 1
    while i <= #argv do
        local a = argv[i]
        if a == "-h" or a == "--help" then
            io.stdout:write(USAGE)
            os.exit(0)
        elseif a == "-o" or a == "-m" or a == "-d" or a == "-n" then
            local v = argv[i + 1]
            if not v then fail(a .. " needs a value\n" .. USAGE) end
            if a == "-o" then o.out = v
            elseif a == "-m" then o.memory = v
            elseif a == "-d" then o.device = v
            else
                o.steps = require("moonkaas.compat").tointeger(tonumber(v)) -- Lua 5.1 too
                if not o.steps or o.steps < 1 then fail("-n needs a positive integer, got " .. v) end
            end
            i = i + 2
        elseif a:sub(1, 1) == "-" then
            fail("unknown option " .. a .. "\n" .. USAGE)
        elseif o.checkpoint then
            fail("one checkpoint only\n" .. USAGE)
        else
            o.checkpoint = a
            i = i + 1
        end
    end
    if not o.checkpoint then fail("no checkpoint given\n" .. USAGE) end
    if o.device ~= "cpu" and o.device ~= "cuda" then fail("-d takes cpu or cuda, got " .. o.device) end
    local ext = o.out:match("%.(%w+)$")
    if ext ~= "svg" and ext ~= "png" and ext ~= "dot" then
        fail("-o must end in .svg, .png or .dot, got " .. o.out)
    end
    o.format = ext
    return o
end

-- through mk.file_writer: whole or not at all, never through a planted link
local function write(path, text)
    local ok, err = pcall(function()
        local f = require("moonkaas").file_writer(path)
        f:write(text)
        f:commit()
    end)
    if not ok then fail("cannot write " .. path .. ": " .. tostring(err)) end
end

local function has_dot()
    local ok = os.execute("command -v dot > /dev/null 2>&1")
    return ok == true or ok == 0
end

local o = parse(arg)
local mk = require("moonkaas")
local checkpoint = require("moonkaas.llama2.checkpoint")
local model = require("moonkaas.llama2.model")
local c, err = checkpoint.read_config(o.checkpoint)
if not c then fail(err) end
local w = checkpoint.map(mk, c)
local ok, net = pcall(model.build, mk, c, w, { device = o.device, greedy = true,
                                                  steps = math.min(o.steps, c.seq_len) })
if not ok then fail(tostring(net)) end
local st = net.model:stats()
io.stdout:write(string.format("%s: %d nodes, %d launches per token, %d matrix-vector and %d "
    .. "pointwise groups, arena %d bytes\n", o.checkpoint, st.nodes, st.launches,
    st.product_groups, st.pointwise_groups, st.arena_bytes))

local dot = net.model:dot()
if o.format == "dot" then
    write(o.out, dot)
    io.stdout:write("wrote " .. o.out .. "\n")
else
    local dot_path = o.out:gsub("%.%w+$", ".dot")
    write(dot_path, dot)
    if has_dot() then
        local cmd = string.format("dot -T%s -o '%s' '%s'", o.format, o.out, dot_path)
        local done = os.execute(cmd)
        if not (done == true or done == 0) then fail("Graphviz failed: " .. cmd) end
        os.remove(dot_path)
        io.stdout:write("wrote " .. o.out .. " (Graphviz)\n")
    else
        io.stdout:write(string.format("Graphviz's dot is not installed: wrote %s; draw it with "
            .. "`dot -T%s -o %s %s` (scripts/setup.sh installs graphviz)\n", dot_path, o.format,
            o.out, dot_path))
    end
end
if o.memory then
    write(o.memory, net.model:memory_svg())
    io.stdout:write("wrote " .. o.memory .. "\n")
end
net.model:close()
