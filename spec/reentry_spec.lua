-- Host functions that re-enter the library, and a binding that keeps what it
-- uses alive (moonkaas.h, "hosts"; doc/guide.md, "Threads and callbacks"). Each case
-- once crashed the process or gave wrong values; spec/c/reentry_test.c has the
-- C side.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("reentry_spec")

-- y = relu(y * w), n times, one launch each (fuse off): a run reports 2n launches
local function chain(n, name)
    local x = mk.input(name or "x", "float32", { 16 })
    local w = mk.input("w", "float32", { 16 })
    local y = x
    for _ = 1, n do y = (y * w):relu() end
    return y, x, w
end

-- xt, wt: tensors or their references
local function want(xt, wt, n)
    local function ref(t) return type(t) == "table" and t or H.ref(t) end
    local x, w, out = ref(xt), ref(wt), { shape = { 16 }, data = {} }
    for i = 1, 16 do
        local v = x.data[i]
        for _ = 1, n do v = math.max(v * w.data[i], 0) end
        out.data[i] = v
    end
    return out
end

-- Allocates tensors of `shape` filled with large values, so memory freed too
-- early is reused and a run that still reads it gives wrong numbers.
local function churn(shape)
    collectgarbage()
    collectgarbage()
    local junk = {}
    for i = 1, 300 do junk[i] = H.rand(shape, 1e6, 2e6) end
    return junk
end

describe("host functions re-entering the library", function()
    after_each(function()
        mk.on_log(nil)
        mk.on_progress(nil)
    end)

    it("closing the running model from its progress function: busy, the run is right", function()
        local y = chain(3)
        local m = mk.compile(y, { fuse = false })
        local xt, wt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local err
        mk.on_progress(function(phase, done)
            if phase == "run" and done == 1 then _, err = pcall(m.close, m) end
        end)
        H.assert_close(m:run({ x = xt, w = wt }), want(xt, wt, 3), 1e-6, 1e-5)
        assert.truthy(err and err:find("^busy: close: the model is running"), err)
        mk.on_progress(nil)
        H.assert_close(m:run({ x = xt, w = wt }), want(xt, wt, 3), 1e-6, 1e-5) -- still open
        m:close()
    end)

    it("running or resetting the running model from its progress function: busy", function()
        local y = chain(3)
        local m <close> = mk.compile(y, { fuse = false })
        local xt, wt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local x2, w2 = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local errs = {}
        mk.on_progress(function(phase, done)
            if phase == "run" and done == 2 then
                errs[#errs + 1] = select(2, pcall(m.run, m, { x = x2, w = w2 }))
                errs[#errs + 1] = select(2, pcall(m.reset, m))
                errs[#errs + 1] = select(2, pcall(m.run_steps, m, 2, { x = x2, w = w2 }))
            end
        end)
        H.assert_close(m:run({ x = xt, w = wt }), want(xt, wt, 3), 1e-6, 1e-5)
        assert.are.equal(3, #errs)
        for _, e in ipairs(errs) do
            assert.truthy(tostring(e):find("^busy: mk_[a-z_]+: the model is running"), e)
        end
        mk.on_progress(nil)
        H.assert_close(m:run({ x = x2, w = w2 }), want(x2, w2, 3), 1e-6, 1e-5)
    end)

    it("running another model from a progress function loses nothing", function()
        local outer <close> = mk.compile(chain(3), { fuse = false })
        local inner <close> = mk.compile(chain(2, "z"), { fuse = false })
        local xt, wt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local zt, vt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local events, inner_out, depth = {}, nil, 0
        mk.on_progress(function(phase, done, total)
            events[#events + 1] = { depth, done, total }
            if depth == 0 and phase == "run" and done == 2 then
                depth = 1
                inner_out = inner:run({ z = zt, w = vt })
                depth = 0
            end
        end)
        H.assert_close(outer:run({ x = xt, w = wt }), want(xt, wt, 3), 1e-6, 1e-5)
        H.assert_close(inner_out, want(zt, vt, 2), 1e-6, 1e-5)
        local seen = { [0] = {}, [1] = {} }
        for _, e in ipairs(events) do seen[e[1]][#seen[e[1]] + 1] = e[2] .. "/" .. e[3] end
        assert.are.same({ "1/6", "2/6", "3/6", "4/6", "5/6", "6/6" }, seen[0])
        assert.are.same({ "1/4", "2/4", "3/4", "4/4" }, seen[1])
    end)

    it("a nested run's error, caught in the progress function, leaves the outer run going", function()
        local outer <close> = mk.compile(chain(3), { fuse = false })
        local inner <close> = mk.compile(chain(2, "z"), { fuse = false })
        local xt, wt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local zt, vt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local depth, caught, after = 0, nil, 0
        mk.on_progress(function(phase, done)
            if depth == 1 then error("inner host function failed") end
            if phase == "run" and done == 1 then
                depth = 1
                caught = select(2, pcall(inner.run, inner, { z = zt, w = vt }))
                depth = 0
            elseif phase == "run" then
                after = after + 1
            end
        end)
        H.assert_close(outer:run({ x = xt, w = wt }), want(xt, wt, 3), 1e-6, 1e-5)
        assert.truthy(tostring(caught):find("inner host function failed", 1, true), caught)
        assert.are.equal(5, after)
        mk.on_progress(nil)
        H.assert_close(inner:run({ z = zt, w = vt }), want(zt, vt, 2), 1e-6, 1e-5)
    end)

    it("mk.cancel from a nested run's progress function stops both runs", function()
        local outer <close> = mk.compile(chain(3), { fuse = false })
        local inner <close> = mk.compile(chain(2, "z"), { fuse = false })
        local xt, wt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local zt, vt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local depth, caught = 0, nil
        mk.on_progress(function(phase, done)
            if depth == 1 then mk.cancel() return end
            if phase == "run" and done == 1 then
                depth = 1
                caught = select(2, pcall(inner.run, inner, { z = zt, w = vt }))
                depth = 0
            end
        end)
        assert.has_error(function() outer:run({ x = xt, w = wt }) end,
            "cancelled: the evaluation was cancelled (mk_context_cancel)")
        assert.are.equal("cancelled: the evaluation was cancelled (mk_context_cancel)", caught)
    end)

    it("compiling from a progress function of a run, and closing the share model mid-compile", function()
        local x = mk.input("x", "float32", { 16 })
        local first = mk.compile(mk.buffer("float32", { 16 }, "h"):replace(x, 0, 16) * 1)
        local xt, xr = H.rand({ 16 })
        first:run({ x = xt })
        mk.on_progress(function(phase, done)
            if phase == "compile" and done == 2 and first then
                first:close()
                first = nil
                churn({ 16 })
            end
        end)
        local m2 <close> = mk.compile(mk.buffer("float32", { 16 }, "h") * 2, { share = first })
        mk.on_progress(nil)
        assert.is_nil(first)
        local twice = H.ref(m2:run({}))
        for i, v in ipairs(xr.data) do assert.are.equal(H.f32(2 * v), twice.data[i]) end
        -- and a compile from a run's progress function
        local runner <close> = mk.compile(chain(2), { fuse = false })
        local made
        mk.on_progress(function(phase, done)
            if phase == "run" and done == 1 and not made then made = mk.compile(x * 3) end
        end)
        local wt = H.rand({ 16 }, 0.5, 1.5)
        H.assert_close(runner:run({ x = xt, w = wt }), want(xt, wt, 2), 1e-6, 1e-5)
        mk.on_progress(nil)
        local three = H.ref(made:run({ x = xt }))
        for i, v in ipairs(xr.data) do assert.are.equal(H.f32(v * 3), three.data[i]) end
        made:close()
    end)

    it("a model that shares memory with the running one is busy too", function()
        local x = mk.input("x", "float32", { 16 })
        local kv = mk.buffer("float32", { 16 }, "h")
        local writer <close> = mk.compile({ kv:replace(x, 0, 16) * 1, (x * 2):relu() }, { fuse = false })
        local reader <close> = mk.compile(mk.buffer("float32", { 16 }, "h") + 1, { share = writer })
        local xt = H.rand({ 16 })
        local errs = {}
        mk.on_progress(function(phase, done)
            if phase == "run" and done == 1 then
                errs[#errs + 1] = select(2, pcall(reader.run, reader, {}))
            end
        end)
        writer:run({ x = xt })
        mk.on_progress(nil)
        assert.are.equal(1, #errs)
        assert.truthy(tostring(errs[1]):find("^busy: mk_evaluate: a model whose memory it shares"),
            errs[1])
    end)
end)

describe("the binding keeps what a call uses alive", function()
    after_each(function() mk.on_progress(nil) end)

    it("run_steps: an input dropped from the table and collected mid-call", function()
        local h = mk.input("h", "float32", { 16 })
        local w = mk.input("w", "float32", { 16 })
        local h1 = ((h * w):relu() * w):relu()
        local m <close> = mk.compile(h1, { next = { h = h1 }, fuse = false })
        local ht, wt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local inputs = { h = ht, w = wt }
        local junk
        mk.on_progress(function(phase, done)
            if phase == "run" and inputs.w then
                inputs.w, inputs.h = nil, nil
                ht, wt = H.ref(ht), H.ref(wt) -- the reference keeps the values, not the tensors
                junk = churn({ 16 })
            end
        end)
        local outs, ran = m:run_steps(3, inputs)
        assert.are.equal(3, ran)
        local got = H.ref(outs[1])
        for i = 1, 16 do
            local v = ht.data[i]
            for s = 1, 3 do
                v = math.max(math.max(v * wt.data[i], 0) * wt.data[i], 0)
                local g = got.data[(s - 1) * 16 + i]
                assert.truthy(math.abs(g - v) <= 1e-5 + 1e-5 * math.abs(v),
                    string.format("step %d element %d: %g, want %g", s, i, g, v))
            end
        end
        assert.truthy(junk)
    end)

    it("run: the outputs given, dropped by the caller mid-call, are what it returns", function()
        local m <close> = mk.compile(chain(2), { fuse = false })
        local xt, wt = H.rand({ 16 }), H.rand({ 16 }, 0.5, 1.5)
        local holder = { out = H.rand({ 16 }) }
        local xr, wr = H.ref(xt), H.ref(wt)
        local inputs = { x = xt, w = wt }
        xt, wt = nil, nil
        mk.on_progress(function(phase)
            if phase == "run" and inputs.x then
                inputs.x, inputs.w, holder.out = nil, nil, nil
                churn({ 16 })
            end
        end)
        local got = m:run(inputs, holder.out)
        H.assert_close(got, want(xr, wr, 2), 1e-6, 1e-5)
    end)

    it("argument tables are read raw: __index and __len do not supply tensors", function()
        local m <close> = mk.compile(chain(1), { fuse = false })
        local xt, wt = H.rand({ 16 }), H.rand({ 16 })
        local proxy = setmetatable({ w = wt }, { __index = function(_, k)
            if k == "x" then return H.rand({ 16 }) end
        end })
        assert.has_error(function() m:run(proxy) end,
            "input error: run: missing input 'x' (float32 [16])")
        local opts = setmetatable({}, { __index = function() error("opts read through __index") end })
        local outs = m:run_steps(1, { x = xt, w = wt }, nil, opts)
        H.assert_close(outs[1], (function()
            local r = want(xt, wt, 1)
            r.shape = { 1, 16 }
            return r
        end)(), 1e-6, 1e-5)
        local endless = setmetatable({}, { __len = function() return 1 << 40 end,
            __index = function() return mk.input("x", "float32", { 16 }) end })
        assert.has_error(function() mk.compile(endless) end,
            "argument error: script: the output must be a node or a list of nodes, got table")
        local consts = setmetatable({}, { __index = function() return H.rand({ 4 }) end })
        assert.has_error(function()
            mk.compile_script("$1 = ConstantTensor(c, float32, [4]);\nresult = $1;\n", consts)
        end, "input error: compile: missing constant 'c' (float32 [4])")
    end)
end)
