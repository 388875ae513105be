-- Files moonkaas reads and writes (doc/guide.md, "Files"): writes go whole or not at
-- all, never through a link planted beside the target; safetensors ranges must
-- tile the data; a file truncated after it was loaded does not end the host.
-- What could crash runs in a child process, so a crash fails one test.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("files_spec")

local function tmpdir()
    local p = os.tmpname()
    os.remove(p)
    assert(os.execute("mkdir -m 700 " .. p))
    return p
end

local function spit(path, s)
    local f = assert(io.open(path, "wb"))
    f:write(s)
    f:close()
end

local function is_link(path)
    return os.execute("test -L '" .. path .. "'") == true
end

local function listing(dir)
    local names = {}
    for name in io.popen("ls -A '" .. dir .. "'"):lines() do names[#names + 1] = name end
    table.sort(names)
    return names
end

-- this process's id (the old writers' temporary names held it)
local function pid()
    return tonumber(H.read_file("/proc/self/stat"):match("^(%d+)"))
end

-- Runs Lua code in a child lua5.4 with this build's module (env: a prefix such
-- as "MK_KERNEL_CACHE=/x "): its exit status and output.
local function child(code, env)
    local script = os.tmpname()
    spit(script, "package.cpath = " .. string.format("%q", package.cpath) .. "\n" ..
                 "package.path = " .. string.format("%q", package.path) .. "\n" .. code)
    local p = io.popen((env or "") .. "lua5.4 " .. script .. " 2>&1; echo \"exit=$?\"")
    local out = p:read("a")
    p:close()
    os.remove(script)
    return tonumber(out:match("exit=(%d+)%s*$")), out
end

-- random float32 tensor bytes of n elements
local function random_tensor(n)
    local t = {}
    for i = 1, n do t[i] = math.random() * 200 - 100 end
    return mk.tensor(t)
end

local function st_file(header, data)
    return string.pack("<I8", #header) .. header .. data
end

describe("safetensors byte ranges", function()
    local dir = tmpdir()
    local function refused(header, data, pattern)
        local path = dir .. "/bad.safetensors"
        spit(path, st_file(header, data))
        local ok, e = pcall(mk.load_safetensors, path)
        assert.is_false(ok)
        assert.matches("^file error: ", tostring(e))
        assert.matches(pattern, tostring(e))
    end
    local a8 = '"a":{"dtype":"F32","shape":[2],"data_offsets":[%d,%d]}'
    local b8 = '"b":{"dtype":"F32","shape":[2],"data_offsets":[%d,%d]}'
    local function two(a0, b0) return "{" .. a8:format(a0, a0 + 8) .. "," .. b8:format(b0, b0 + 8) .. "}" end

    it("refuses overlapping ranges, naming both tensors", function()
        refused(two(0, 4), string.rep("x", 12), "tensors 'a' %[0, 8%) and 'b' %[4, 12%) overlap")
    end)
    it("refuses a range repeated", function()
        refused(two(0, 0), string.rep("x", 8), "tensors 'a' %[0, 8%) and 'b' %[0, 8%) share the same bytes")
    end)
    it("refuses a gap between tensors and before the first", function()
        refused(two(0, 12), string.rep("x", 20), "bytes %[8, 12%) between tensor 'a' and tensor 'b' belong to no tensor")
        refused(two(4, 12), string.rep("x", 20), "bytes %[0, 4%) before the first tensor 'a' belong to no tensor")
    end)
    it("refuses bytes after the last tensor, and data without tensors", function()
        refused(two(0, 8), string.rep("x", 19), "3 bytes after the last tensor 'b' belong to no tensor")
        refused("{}", "abcd", "4 bytes after the header belong to no tensor")
    end)
    it("reads a header of 200,000 tensors in time linear in their count", function()
        -- names were compared pairwise: 2e10 comparisons here, minutes
        -- under valgrind (MK_VALGRIND) fewer: the same code, the bound still far below n^2
        local n, parts, data = os.getenv("MK_VALGRIND") and 20000 or 200000, {}, {}
        local order = {}
        for i = 1, n do order[i] = i end
        for i = n, 2, -1 do -- a drawn header order
            local j = math.random(1, i)
            order[i], order[j] = order[j], order[i]
        end
        for k, i in ipairs(order) do
            parts[k] = string.format('"t%d":{"dtype":"I8","shape":[1],"data_offsets":[%d,%d]}', i, i - 1, i)
        end
        for i = 1, n do data[i] = string.char((i * 7) % 256) end
        local path = dir .. "/many.safetensors"
        spit(path, st_file("{" .. table.concat(parts, ",") .. "}", table.concat(data)))
        local t0 = mk.clock()
        local t = mk.load_safetensors(path)
        local seconds = mk.clock() - t0
        print(string.format("# %d tensors read in %.2f s", n, seconds))
        assert.is_true(seconds < 30, string.format("%.1f s", seconds))
        local i = math.random(1, n)
        assert.are.equal((i * 7) % 256 - ((i * 7) % 256 > 127 and 256 or 0), t["t" .. i]:get(1))
    end)

    it("takes tensors that tile the data, in any header order", function()
        local path = dir .. "/good.safetensors"
        local x, y = math.random(), math.random()
        spit(path, st_file(two(8, 0), string.pack("<ffff", x, x, y, y)))
        local t = mk.load_safetensors(path)
        assert.are.equal(H.f32(y), t.a:get(1))
        assert.are.equal(H.f32(x), t.b:get(2))
    end)
end)

describe("writing files", function()
    it("save_safetensors sorts in C: a replaced table.sort is never called", function()
        local dir = tmpdir()
        local rc, out = child(([[
            local mk = require "moonkaas"
            local sort = table.sort
            table.sort = function(t) t[1] = {} end -- a table where a name was
            mk.save_safetensors(%q, { b = mk.tensor({ 1, 2 }), a = mk.tensor({ 3 }) })
            table.sort = sort
            local t = mk.load_safetensors(%q)
            assert(t.a:get(1) == 3 and t.b:get(2) == 2)
            print("saved")
        ]]):format(dir .. "/s.safetensors", dir .. "/s.safetensors"))
        assert.are.equal(0, rc, out)
        assert.matches("saved", out)
        local raw = H.read_file(dir .. "/s.safetensors")
        assert.truthy(raw:find('"a".*"b"'), "names in sorted order")
    end)

    it("refuses a tensor name holding a NUL byte", function()
        local dir = tmpdir()
        local ok, e = pcall(mk.save_safetensors, dir .. "/n.safetensors", { ["a\0b"] = mk.tensor({ 1 }) })
        assert.is_false(ok)
        assert.matches("argument error: save_safetensors: a tensor's name holds a NUL byte", tostring(e))
    end)

    it("save_safetensors never writes through a link at the old temporary name or at the path", function()
        local dir = tmpdir()
        local victim = dir .. "/victim"
        local secret = "victim's own bytes " .. math.random(1, 1e9)
        spit(victim, secret)
        local path = dir .. "/w.safetensors"
        -- the name the old writer used, and a few pids either side
        for d = -2, 2 do
            assert(os.execute(("ln -s %s %s.%d.tmp"):format(victim, path, pid() + d)))
        end
        local t = random_tensor(math.random(3, 40))
        mk.save_safetensors(path, { w = t })
        assert.are.equal(secret, H.read_file(victim))
        assert.are.equal(t:bytes(), mk.load_safetensors(path).w:bytes())
        -- a link at the path itself is replaced by the file, its target untouched
        os.remove(path)
        assert(os.execute(("ln -s %s %s"):format(victim, path)))
        mk.save_safetensors(path, { w = t })
        assert.are.equal(secret, H.read_file(victim))
        assert.is_false(is_link(path))
        -- nothing left beside it but the file, the links planted and the victim
        assert.are.equal(7, #listing(dir), table.concat(listing(dir), " "))
    end)

    it("a file_writer is the old file or the new one; abort and failure leave nothing", function()
        local dir = tmpdir()
        local path = dir .. "/f.bin"
        spit(path, "old")
        local w = mk.file_writer(path)
        local chunk = string.rep(string.char(math.random(0, 255)), math.random(1, 5000))
        w:write(chunk, "tail")
        assert.are.equal("old", H.read_file(path))
        assert.are.equal(2, #listing(dir))
        w:commit()
        assert.are.equal(chunk .. "tail", H.read_file(path))
        assert.are.same({ "f.bin" }, listing(dir))
        local ok, e = pcall(w.write, w, "x")
        assert.is_false(ok)
        assert.matches("already committed or aborted", tostring(e))
        w = mk.file_writer(path)
        w:write("never")
        w:abort()
        assert.are.equal(chunk .. "tail", H.read_file(path))
        assert.are.same({ "f.bin" }, listing(dir))
        do
            local closing <close> = mk.file_writer(path)
            closing:write("dropped")
        end
        assert.are.same({ "f.bin" }, listing(dir))
        ok, e = pcall(mk.file_writer, dir .. "/no/such/dir/f")
        assert.is_false(ok)
        assert.matches("^file error: ", tostring(e))
    end)

    it("a file_writer's file gets its mode less the umask", function()
        local dir = tmpdir()
        local w = mk.file_writer(dir .. "/private", 384) -- 0600
        w:write("x")
        w:commit()
        local mode = io.popen("stat -c %a " .. dir .. "/private"):read("l")
        assert.are.equal("600", mode)
    end)
end)

describe("mk.quantize_file", function()
    it("gives mk.quantize of the file's float32 values, read in pieces", function()
        local dir = tmpdir()
        -- 3 MiB of values: several pieces, the last one short
        local rows, cols, group = 3 * 1024 + 5, 256, 64
        local t = random_tensor(rows * cols)
        local path = dir .. "/w.bin"
        spit(path, "head" .. t:bytes())
        local q, sc = mk.quantize_file(path, { offset = 4, shape = { rows, cols }, group = group })
        local wq, wsc = mk.quantize(t:reshape({ rows, cols }), group)
        assert.are.same(wq.shape, q.shape)
        assert.are.same({ rows, cols / group }, sc.shape)
        assert.are.equal("int8", q.dtype)
        assert.is_true(wq:bytes() == q:bytes(), "int8 values differ")
        assert.is_true(wsc:bytes() == sc:bytes(), "scales differ")
    end)

    it("names the problem: past the end, a group that does not divide, a missing file", function()
        local dir = tmpdir()
        local path = dir .. "/w.bin"
        spit(path, random_tensor(64):bytes())
        local ok, err = pcall(mk.quantize_file, path, { offset = 4, shape = { 64 }, group = 8 })
        assert.is_false(ok)
        assert.truthy(tostring(err):find("past the end of the file", 1, true), err)
        ok, err = pcall(mk.quantize_file, path, { shape = { 2, 30 }, group = 8 })
        assert.is_false(ok)
        assert.truthy(tostring(err):find("does not divide the last dim 30", 1, true), err)
        ok, err = pcall(mk.quantize_file, dir .. "/none.bin", { shape = { 8 }, group = 8 })
        assert.is_false(ok)
        assert.truthy(tostring(err):find("none.bin", 1, true), err)
        ok, err = pcall(mk.quantize_file, path, { shape = { 8 }, group = 8, copy = true })
        assert.is_false(ok)
        assert.truthy(tostring(err):find("unknown option copy", 1, true), err)
    end)
end)

describe("a file truncated after loading", function()
    -- a file saved, loaded, truncated to 0 bytes, then read
    local function truncated(load)
        local dir = tmpdir()
        local path = dir .. "/t.safetensors"
        local n = math.random(1000, 5000)
        return child(([[
            local mk = require "moonkaas"
            local t = {}
            for i = 1, %d do t[i] = i * 0.5 end
            mk.save_safetensors(%q, { w = mk.tensor(t) })
            local loaded = %s
            io.open(%q, "wb"):close()
            local x = loaded:get(%d)
            assert(x == %d * 0.5, x)
            print("read", x)
        ]]):format(n, path, load:format(path, path), path, n, n))
    end

    it("does not end the host: a small safetensors file is read into memory", function()
        local rc, out = truncated("mk.load_safetensors(%q).w")
        assert.are.equal(0, rc, out)
        assert.matches("read", out)
    end)
    it("does not end the host with {copy = true}", function()
        local rc, out = truncated("mk.load_safetensors(%q, { copy = true }).w")
        assert.are.equal(0, rc, out)
    end)
    it("does not end the host through mk.from_file (llama2.c checkpoints), with or without copy", function()
        local rc, out = truncated("mk.from_file(%q, { offset = 0, dtype = 'int8', shape = { 8 } }) and " ..
                                  "mk.load_safetensors(%q).w")
        assert.are.equal(0, rc, out)
        local dir = tmpdir()
        local path = dir .. "/ck.bin"
        local vals = {}
        for i = 1, 64 do vals[i] = math.random() end
        for _, copy in ipairs({ "false", "true" }) do
            spit(path, string.pack("<" .. string.rep("f", 64), table.unpack(vals)))
            rc, out = child(([[
                local mk = require "moonkaas"
                local t = mk.from_file(%q, { offset = 0, dtype = "float32", shape = { 64 }, copy = %s })
                io.open(%q, "wb"):close()
                print("got=" .. string.format("%%.17g", t:get(64)))
            ]]):format(path, copy, path))
            assert.are.equal(0, rc, out)
            assert.are.equal(H.f32(vals[64]), tonumber(out:match("got=(%S+)")))
        end
    end)
    it("load_safetensors checks its options", function()
        local ok, e = pcall(mk.load_safetensors, "x", { cpy = true })
        assert.is_false(ok)
        assert.matches("unknown option cpy", tostring(e))
    end)
end)

-- The kernel cache's loading path (the compile-only path is
-- spec/c/kernel_cache_test.c): a corrupt entry is a log line and a compile,
-- the kernel then computing what the CPU does; a good entry is loaded; a
-- directory others can write is refused with a log line.
local gpu_it = H.gpu(it, function(why) pending(why) end)
describe("the kernel cache", function()
    -- in a child with the cache in dir: compiles a fresh group on CUDA, checks
    -- it against the CPU, prints every log line
    local function run(dir, rows)
        return child(([[
            local mk = require "moonkaas"
            mk.on_log(function(level, message) print("log: " .. level .. ": " .. message) end)
            local x = mk.input("x", "float32", { %d, 3 })
            local y = (x:tanh() + x) * x
            local feed = {}
            for i = 1, %d * 3 do feed[i] = math.sin(i * 0.37) end
            local xs = mk.tensor(feed, "float32", { %d, 3 })
            local want = mk.compile(y):run({ x = xs })
            local got = mk.compile(y, { device = "cuda" }):run({ x = xs })
            for i = 1, %d do for j = 1, 3 do
                assert(math.abs(got:get(i, j) - want:get(i, j)) <= 1e-5 + 1e-5 * math.abs(want:get(i, j)))
            end end
            print("same as the CPU")
        ]]):format(rows, rows, rows, rows), "MK_KERNEL_CACHE=" .. dir .. " ")
    end

    gpu_it("replaces a corrupt entry and loads a good one", function()
        local dir = tmpdir()
        local rows = math.random(1000, 100000)
        local rc, out = run(dir, rows)
        assert.are.equal(0, rc, out)
        assert.matches("1 compiled with NVRTC, 0 from the disk cache", out)
        local entries = listing(dir)
        assert.are.equal(1, #entries, table.concat(entries, " "))
        local path = dir .. "/" .. entries[1]
        local bytes = H.read_file(path)
        local at = math.random(100, #bytes)
        spit(path, bytes:sub(1, at - 1) .. string.char((bytes:byte(at) + 1) % 256) .. bytes:sub(at + 1))
        rc, out = run(dir, rows)
        assert.are.equal(0, rc, out)
        assert.matches("kernel cache: [^\n]*its cubin does not match its digest; compiled again", out)
        assert.matches("same as the CPU", out)
        rc, out = run(dir, rows)
        assert.are.equal(0, rc, out)
        assert.matches("0 compiled with NVRTC, 1 from the disk cache", out)
        assert.matches("same as the CPU", out)
    end)

    gpu_it("refuses a directory others can write, with a log line", function()
        local dir = tmpdir()
        assert(os.execute("chmod 777 " .. dir))
        local rc, out = run(dir, math.random(1000, 100000))
        assert.are.equal(0, rc, out)
        assert.matches("kernel cache: [^\n]*writable by others %(mode 777%): no disk cache", out)
        assert.are.same({}, listing(dir))
    end)
end)
