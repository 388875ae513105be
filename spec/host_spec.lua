-- What a Lua host gets: mk.on_log, mk.on_progress and mk.cancel (the C API's
-- log, progress and cancel; spec/c/host_test.c covers the C side and threads).
local H = require "spec.helpers"
local mk = H.mk()
H.seed("host_spec")

-- x * w, relu, repeated: launch after launch on the CPU (fuse off)
local function chain(n)
    local x = mk.input("x", "float32", { 16 })
    local w, wt = mk.input("w", "float32", { 16 }), H.rand({ 16 })
    local y = x
    for _ = 1, n do y = (y * w):relu() end
    return y, wt
end

local function want(xt, wt, n)
    local x, w, out = H.ref(xt), H.ref(wt), { shape = { 16 }, data = {} }
    for i = 1, 16 do
        local v = x.data[i]
        for _ = 1, n do v = math.max(v * w.data[i], 0) end
        out.data[i] = v
    end
    return out
end

describe("host functions", function()
    after_each(function()
        mk.on_log(nil)
        mk.on_progress(nil)
    end)

    it("log: one line per compile, nothing unless asked", function()
        local lines = {}
        mk.on_log(function(level, message) lines[#lines + 1] = { level, message } end)
        local y = chain(3)
        local model <close> = mk.compile(y, { fuse = false })
        -- with several threads, the CPU's line on which launches may fork comes first
        local n = #lines
        assert.truthy(n == 1 or (n == 2 and lines[1][2]:find("^cpu: %d+ of %d+ launches may use")),
                      lines[1][2])
        for _, l in ipairs(lines) do assert.are.equal("info", l[1]) end
        assert.truthy(lines[n][2]:find("^compiled for cpu in "), lines[n][2])
        mk.on_log(nil)
        local again <close> = mk.compile(y, { fuse = false })
        assert.are.equal(n, #lines)
    end)

    it("progress: the compile's stages in order, then each launch of a run", function()
        local events = {}
        mk.on_progress(function(phase, done, total) events[#events + 1] = { phase, done, total } end)
        local y, wt = chain(4)
        local model <close> = mk.compile(y, { fuse = false })
        local stages = {}
        for _, e in ipairs(events) do
            if e[1] == "compile" then
                assert.are.equal(6, e[3])
                stages[#stages + 1] = e[2]
            end
        end
        assert.are.same({ 0, 1, 2, 3, 4, 5, 6 }, stages)
        events = {}
        local xt = H.rand({ 16 })
        H.assert_close(model:run({ x = xt, w = wt }), want(xt, wt, 4), 1e-6, 1e-5)
        assert.are.equal(8, #events)
        for i, e in ipairs(events) do assert.are.same({ "run", i, 8 }, e) end
    end)

    it("cancel from progress: the run stops with 'cancelled', the next one runs", function()
        local y, wt = chain(10)
        local model <close> = mk.compile(y, { fuse = false })
        local xt = H.rand({ 16 })
        local seen = 0
        mk.on_progress(function(phase, done)
            seen = done
            if phase == "run" and done == 5 then mk.cancel() end
        end)
        H.assert_error(function() model:run({ x = xt, w = wt }) end,
            "cancelled: the evaluation was cancelled")
        assert.are.equal(5, seen)
        mk.on_progress(function(_, done) seen = done end) -- no cancel this time
        H.assert_close(model:run({ x = xt, w = wt }), want(xt, wt, 10), 1e-6, 1e-5)
        assert.are.equal(20, seen)
    end)

    it("cancel during a compile: no model, then a compile succeeds", function()
        local y = chain(2)
        mk.on_progress(function(phase, done) if phase == "compile" and done == 2 then mk.cancel() end end)
        H.assert_error(function() mk.compile(y, { fuse = false }) end,
            "cancelled: the compile was cancelled")
        mk.on_progress(nil)
        local model <close> = mk.compile(y, { fuse = false })
        assert.is_truthy(model)
    end)

    it("a host function that raises stops the call and its error comes out", function()
        local y, wt = chain(3)
        local model <close> = mk.compile(y, { fuse = false })
        local xt = H.rand({ 16 })
        mk.on_progress(function(_, done) if done == 2 then error("host says stop", 0) end end)
        H.assert_error(function() model:run({ x = xt, w = wt }) end, "host says stop")
        mk.on_progress(nil)
        H.assert_close(model:run({ x = xt, w = wt }), want(xt, wt, 3), 1e-6, 1e-5)
        mk.on_log(function() error({ code = 7 }) end) -- any value, as error() raised it
        local ok, e = pcall(mk.compile, y, { fuse = false })
        assert.is_false(ok)
        assert.are.same({ code = 7 }, e)
    end)

    it("cancel while nothing runs stops nothing; bad arguments are argument errors", function()
        mk.cancel()
        local y, wt = chain(2)
        local model <close> = mk.compile(y, { fuse = false })
        mk.cancel()
        local xt = H.rand({ 16 })
        H.assert_close(model:run({ x = xt, w = wt }), want(xt, wt, 2), 1e-6, 1e-5)
        H.assert_error(function() mk.on_log(3) end, "argument error: on_log: expects a function or nil")
        H.assert_error(function() mk.on_progress("x") end,
            "argument error: on_progress: expects a function or nil")
    end)
end)
