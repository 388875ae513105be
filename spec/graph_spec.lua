-- scripts/graph.lua: the compiled llama2 plan as a picture (DOT, or SVG/PNG
-- through Graphviz where it is installed) and the arena picture.
local H = require("spec.llama2_helpers")

local build = os.getenv("MK_BUILD") or "build"
local models = H.models

local function run(args)
    local p = io.popen(string.format("MK_BUILD=%s %s scripts/graph.lua %s 2>&1; echo \"rc=$?\"",
                                     build, os.getenv("LUA") or "lua5.4", args))
    local out = p:read("*a")
    p:close()
    return out, tonumber(out:match("rc=(%d+)%s*$"))
end

-- a fresh path with the extension (os.tmpname makes the base file: removed)
local function tmp(ext)
    local base = os.tmpname()
    os.remove(base)
    return base .. ext
end

local function read(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local s = f:read("*a")
    f:close()
    return s
end

describe("scripts/graph.lua", function()
    it("writes the plan as DOT and the arena as SVG for stories260K", function()
        if not H.models_present() then
            pending("../shared/models is absent: no stories260K.bin")
            return
        end
        local dot, mem = tmp(".dot"), tmp(".svg")
        local out, rc = run(string.format("%s/stories260K.bin -o %s -m %s -n 32", models, dot, mem))
        assert.are.equal(0, rc, out)
        -- 5 a layer and the classifier: the embeddings are read by the groups (gather.c)
        assert.truthy(out:find("26 launches per token", 1, true), out)
        local text = assert(read(dot))
        assert.truthy(text:find("^digraph moonkaas {"))
        assert.truthy(text:find("ProductGroupNode $8: one kernel, matrix-vector products", 1, true))
        assert.truthy(text:find("decode attention over the first p rows", 1, true))
        assert.truthy(assert(read(mem)):find("^<svg "))
        os.remove(dot)
        os.remove(mem)
    end)

    it("draws SVG with Graphviz where it is installed, else leaves the DOT", function()
        if not H.models_present() then
            pending("../shared/models is absent: no stories260K.bin")
            return
        end
        local svg = tmp(".svg")
        local out, rc = run(string.format("%s/stories260K.bin -o %s -n 16", models, svg))
        assert.are.equal(0, rc, out)
        local found = os.execute("command -v dot > /dev/null 2>&1")
        local has_dot = found == true or found == 0 -- 5.4: true; 5.1: the status
        if has_dot then
            assert.truthy(assert(read(svg)):find("<svg", 1, true))
            assert.is_nil(read(svg:gsub("%.svg$", ".dot")), "the .dot is removed")
        else
            assert.truthy(out:find("Graphviz's dot is not installed", 1, true), out)
            assert.truthy(read(svg:gsub("%.svg$", ".dot")))
        end
        os.remove(svg)
        os.remove((svg:gsub("%.svg$", ".dot")))
    end)

    it("refuses bad arguments with a message", function()
        local out, rc = run("")
        assert.are.equal(1, rc)
        assert.truthy(out:find("graph.lua: no checkpoint given", 1, true), out)
        out, rc = run("x.bin -o picture.jpg")
        assert.are.equal(1, rc)
        assert.truthy(out:find("-o must end in .svg, .png or .dot", 1, true), out)
        out, rc = run("/nonexistent/model.bin -o g.dot")
        assert.are.equal(1, rc)
        assert.truthy(out:find("graph.lua: ", 1, true), out)
    end)
end)
