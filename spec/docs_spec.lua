-- The docs stay true: (1) doc/ops.md is what scripts/gen_ops_doc.lua prints from
-- the op table now; (2) every public function and method of the Lua module has
-- an entry in doc/lua-api.md (enumerated at run time: the module table, the
-- node, tensor, model and file-writer metatables and their methods, and the
-- moonkaas.llama2 module), every op-made one a row in doc/ops.md; (3) every
-- MK_API function of core/moonkaas.h is named in doc/c-api.md; (4) every
-- ```lua, ```sh and ```c block of README.md and doc/*.md runs:
--
--   lua  a fresh lua5.4 (LUA_PATH/LUA_CPATH: this checkout's lua/ and the
--        build's module), in a scratch folder
--   sh   sh -e in a scratch folder holding links to this checkout's top-level
--        entries (scripts/, build/, examples/, ...) and to the models in
--        ../shared/models (stories260K.bin, tok512.bin; a block that names
--        stories260K is pending where they are absent), MK_BUILD set
--   c    compiled with cc against core/moonkaas.h and the build's
--        libmoonkaas.a, then run
--
-- each must exit 0. An unmarked sh block that names make, setup.sh, apt,
-- sudo, luarocks, .ci/run, busted or rm -r fails without running. A block that is not meant to run (a fragment, a command that
-- installs packages, needs a GPU or takes minutes) is marked by the line
--
--   <!-- norun: why -->
--
-- just before its fence (blank lines may come between), or fenced as ```text.

local BUILD = os.getenv("MK_BUILD")
if BUILD == nil or BUILD == "" then BUILD = "build" end
local LUA = os.getenv("LUA") or "lua5.4"
local mk = require("moonkaas")

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function read(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local s = f:read("*a")
    f:close()
    return s
end

local function shell(cmd)
    local p = assert(io.popen(cmd))
    local s = p:read("*a")
    p:close()
    return s
end

local ROOT = shell("pwd"):gsub("\n$", "")
local ABS_BUILD = BUILD:sub(1, 1) == "/" and BUILD or ROOT .. "/" .. BUILD
local MODELS = ROOT .. "/../shared/models"

local REGENERATE = "lua5.4 scripts/gen_ops_doc.lua > doc/ops.md"

describe("doc/ops.md", function()
    it("is what scripts/gen_ops_doc.lua prints from the op table", function()
        local text = dofile("scripts/gen_ops_doc.lua") -- a chunk of the spec: returns the text
        local doc = read("doc/ops.md")
        if doc ~= text then
            -- the first line that differs, to see what changed
            local a, b, n = (doc or "") .. "\n", text .. "\n", 0
            local la, lb = a:gmatch("([^\n]*)\n"), b:gmatch("([^\n]*)\n")
            local x, y
            repeat
                n = n + 1
                x, y = la(), lb()
            until x ~= y
            error(string.format("doc/ops.md is out of date with the op table (line %d: %q, the table gives %q):\n" ..
                "regenerate it with `%s` (after make) and commit it", n, tostring(x), tostring(y), REGENERATE), 0)
        end
    end)
end)

-- ---- the Lua API -----------------------------------------------------------

-- The names doc/lua-api.md gives an entry: each heading's `mk.f`, `t:f`, `n:f`,
-- `m:f`, `w:f`, `llama2.f`, `net:f`, `tok:f` (with or without backquotes).
local function api_entries()
    local doc = assert(read("doc/lua-api.md"), "doc/lua-api.md is missing")
    local entries, text = {}, doc
    for line in doc:gmatch("[^\n]+") do
        if line:match("^#+%s") then
            for recv, sep, name in line:gmatch("(%a[%w_]*)([.:])([%a_][%w_]*)") do
                entries[recv .. sep .. name] = true
            end
        end
    end
    return entries, text
end

-- What the op table makes: module functions, node methods, metamethods (the
-- events lua/node.c gives an infix operator of one or two operands).
local function op_made()
    local functions, methods, events = {}, {}, {}
    local binary = { ["+"] = "__add", ["-"] = "__sub", ["*"] = "__mul", ["/"] = "__div",
                     ["%"] = "__mod", ["^"] = "__pow", ["//"] = "__idiv", ["&"] = "__band",
                     ["|"] = "__bor", ["~"] = "__bxor", ["<<"] = "__shl", [">>"] = "__shr" }
    local unary = { ["-"] = "__unm", ["~"] = "__bnot" }
    for _, row in ipairs(mk.ops()) do
        if row.method then
            if row.as_function then functions[row.method] = true else methods[row.method] = true end
        end
        if row.infix then
            local operands = select(2, row.signature:gsub("[nr]", ""))
            local event = (operands == 1 and unary or binary)[row.infix]
            if event then events[event] = true end
        end
    end
    return functions, methods, events
end

local HOW = "add an entry (a heading naming it) to doc/lua-api.md"

describe("doc/lua-api.md", function()
    local entries, text = api_entries()
    local op_functions, op_methods, op_events = op_made()

    local function need(name, why)
        assert.is_true(entries[name] == true, name .. " has no entry in doc/lua-api.md" ..
            (why and " (" .. why .. ")" or "") .. ": " .. HOW)
    end

    -- every key of a metatable (metamethods) and of its methods table
    local function check_type(obj, recv, op_ok)
        local mt = getmetatable(obj)
        for k, v in pairs(mt) do
            if type(k) == "string" and k:match("^__") and type(v) == "function"
                and k ~= "__index" and k ~= "__gc" and not (op_ok and op_events[k]) then
                assert.truthy(text:find("`" .. k .. "`", 1, true),
                    recv .. "'s metamethod " .. k .. " is not named (`" .. k .. "`) in doc/lua-api.md")
            end
        end
        for k in pairs(mt.methods or {}) do
            if not (op_ok and op_methods[k]) then need(recv .. ":" .. k) end
        end
    end

    it("has an entry for every function of the module (or doc/ops.md, for an op's)", function()
        for k in pairs(mk) do
            if not op_functions[k] then need("mk." .. k) end
        end
    end)

    it("has an entry for every method and metamethod of nodes (or doc/ops.md, for an op's)", function()
        check_type(mk.input("x", { 2 }), "n", true)
    end)

    it("has an entry for every method and metamethod of tensors, models and file writers", function()
        check_type(mk.tensor({ 1, 2 }), "t")
        local model = mk.compile(mk.input("x", { 2 }):relu())
        check_type(model, "m")
        model:close()
        local path = os.tmpname()
        local w = mk.file_writer(path)
        check_type(w, "w")
        w:abort()
        os.remove(path)
    end)

    it("has an entry for every function of moonkaas.nn", function()
        for k, v in pairs(require("moonkaas.nn")) do
            if type(v) == "function" then need("nn." .. k) end
        end
    end)

    it("has an entry for every function of moonkaas.llama2", function()
        local llama2 = require("moonkaas.llama2")
        for k, v in pairs(llama2) do
            if type(v) == "function" then need("llama2." .. k) end
        end
    end)
end)

describe("doc/c-api.md", function()
    it("names every MK_API function of core/moonkaas.h", function()
        local header = assert(read("core/moonkaas.h"))
        local doc = assert(read("doc/c-api.md"), "doc/c-api.md is missing")
        local n = 0
        for decl in header:gmatch("MK_API[^;]-%(") do
            local name = decl:match("(mk_[%w_]+)%s*%($")
            if name then
                n = n + 1
                assert.truthy(doc:find("`" .. name .. "[`(]"),
                    name .. " (core/moonkaas.h) is not named in doc/c-api.md: add it, as `" .. name .. "`, to its section")
            end
        end
        assert.is_true(n > 40, "found only " .. n .. " MK_API functions")
    end)
end)

-- ---- the code blocks -------------------------------------------------------

local function doc_files()
    local files = { "README.md" }
    for name in shell("ls doc/*.md 2>/dev/null"):gmatch("[^\n]+") do files[#files + 1] = name end
    return files
end

-- The blocks of one file: {lang, code, line, norun}.
local function blocks(path)
    local list, lines = {}, {}
    for line in (read(path) .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
    local i, last = 1, nil -- last: the previous non-blank line outside a block
    while i <= #lines do
        local indent, lang = lines[i]:match("^(%s*)```(%S*)%s*$")
        if lang then
            local code, start = {}, i
            i = i + 1
            while i <= #lines and not lines[i]:match("^%s*```%s*$") do
                code[#code + 1] = lines[i]:sub(#indent + 1)
                i = i + 1
            end
            list[#list + 1] = { lang = lang, code = table.concat(code, "\n") .. "\n", line = start,
                                norun = last ~= nil and last:match("^%s*<!%-%- norun") ~= nil }
            last = nil
        elseif lines[i]:match("%S") then
            last = lines[i]
        end
        i = i + 1
    end
    return list
end

local scratch_root = os.tmpname()
os.remove(scratch_root)
os.execute("mkdir -p " .. q(scratch_root))

-- A fresh folder with links to the checkout's entries and to the models.
local count = 0
local function scratch()
    count = count + 1
    local dir = scratch_root .. "/" .. count
    local cmd = { "mkdir -p " .. q(dir) }
    for name in shell("ls -A " .. q(ROOT)):gmatch("[^\n]+") do
        if name ~= ".git" and name ~= "build" then
            cmd[#cmd + 1] = "ln -s " .. q(ROOT .. "/" .. name) .. " " .. q(dir .. "/" .. name)
        end
    end
    -- build/ is the build under test (MK_BUILD: build-asan, build-valgrind, ...)
    cmd[#cmd + 1] = "ln -s " .. q(ABS_BUILD) .. " " .. q(dir .. "/build")
    for name in shell("ls " .. q(MODELS) .. " 2>/dev/null"):gmatch("[^\n]+") do
        cmd[#cmd + 1] = "ln -s " .. q(MODELS .. "/" .. name) .. " " .. q(dir .. "/" .. name)
    end
    assert(os.execute(table.concat(cmd, " && ")))
    return dir
end

local function write(path, s)
    local f = assert(io.open(path, "wb"))
    f:write(s)
    f:close()
end

local ENV = string.format("LUA_PATH_5_4=%s LUA_CPATH_5_4=%s MK_BUILD=%s",
    q(ROOT .. "/lua/?.lua;" .. ROOT .. "/lua/?/init.lua;;"), q(ABS_BUILD .. "/?.so;;"), q(ABS_BUILD))

-- Under ASan (make asan: ASAN=1, the build's library instrumented) a block's
-- `cc` links the sanitizer's runtime too, and runs without the preload that
-- the specs' lua5.4 needs.
local SAN = os.getenv("ASAN") and "-fsanitize=address,undefined" or ""
if SAN ~= "" then
    local bin = scratch_root .. "/bin"
    os.execute("mkdir -p " .. q(bin))
    local f = assert(io.open(bin .. "/cc", "w"))
    f:write("#!/bin/sh\nunset LD_PRELOAD\nexec /usr/bin/cc " .. SAN .. " \"$@\"\n")
    f:close()
    os.execute("chmod +x " .. q(bin .. "/cc"))
    ENV = ENV .. " PATH=" .. q(bin .. ":" .. (os.getenv("PATH") or "/usr/bin:/bin"))
end

local function run_block(b)
    local dir = scratch()
    local out = dir .. "/.out"
    local cmd
    if b.lang == "lua" then
        write(dir .. "/.block.lua", b.code)
        cmd = string.format("cd %s && env %s %s .block.lua", q(dir), ENV, LUA)
    elseif b.lang == "sh" then
        write(dir .. "/.block.sh", b.code)
        cmd = string.format("cd %s && env %s sh -e .block.sh < /dev/null", q(dir), ENV)
    else
        write(dir .. "/.block.c", b.code)
        cmd = string.format("cd %s && env -u LD_PRELOAD cc -std=c11 -D_GNU_SOURCE %s -I%s -o .block .block.c %s " ..
            "-lm -fopenmp -ldl -pthread && ./.block", q(dir), SAN, q(ROOT .. "/core"),
            q(ABS_BUILD .. "/libmoonkaas.a"))
    end
    local ok = os.execute(cmd .. " > " .. q(out) .. " 2>&1")
    return ok == true or ok == 0, read(out) or ""
end

local RUNS = { lua = true, sh = true, c = true }

-- Commands a test must never start (the build itself, package managers, CI):
-- an unmarked sh block naming one fails without running.
local UNSAFE = { "%f[%w]make%f[%W]", "setup%.sh", "apt%-get", "%f[%w]apt%f[%W]", "%f[%w]sudo%f[%W]",
                 "luarocks", "%.ci/run", "rm %-r", "%f[%w]busted%f[%W]" }
local MARK = "mark a block that is not meant to run with a line `<!-- norun: why -->` just before its fence"

describe("code blocks in README.md and doc/*.md", function()
    teardown(function() os.execute("rm -rf " .. q(scratch_root)) end)

    for _, path in ipairs(doc_files()) do
        for _, b in ipairs(blocks(path)) do
            if RUNS[b.lang] and not b.norun then
                it(string.format("%s:%d (%s) runs", path, b.line, b.lang), function()
                    if b.code:find("stories260K", 1, true) and not read(MODELS .. "/stories260K.bin") then
                        pending(MODELS .. " is absent: no stories260K.bin")
                        return
                    end
                    if b.lang == "sh" then
                        for _, pattern in ipairs(UNSAFE) do
                            assert.is_nil(b.code:find(pattern), string.format(
                                "the sh block at %s:%d runs something a test must not (%s):\n%s\n%s",
                                path, b.line, pattern, b.code, MARK))
                        end
                    end
                    local ok, output = run_block(b)
                    assert.is_true(ok, string.format("the %s block at %s:%d failed (%s):\n%s\n-- its output:\n%s",
                        b.lang, path, b.line, MARK, b.code, output))
                end)
            end
        end
    end

    it("are marked norun only before a block", function()
        for _, path in ipairs(doc_files()) do
            local lines, n = {}, 0
            for line in (read(path) .. "\n"):gmatch("([^\n]*)\n") do lines[#lines + 1] = line end
            for i, line in ipairs(lines) do
                if line:match("^%s*<!%-%- norun") then
                    local j = i + 1
                    while lines[j] and not lines[j]:match("%S") do j = j + 1 end
                    assert.truthy(lines[j] and lines[j]:match("^%s*```"),
                        string.format("%s:%d: a norun mark with no code block after it", path, i))
                    n = n + 1
                end
            end
        end
    end)
end)
