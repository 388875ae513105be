-- Recurrences: models with several outputs (`result = $a, $b;`) and next lines
-- (`next h = $a;`, `next pos = pos + 1;`), run step by step with m:run_steps,
-- on the CPU against plain-Lua references in double precision, and on CUDA
-- (#gpu, skipped with the reason where there is no device) against the CPU too.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("steps_spec")
local R = H.ref_ops
local E = H.assert_error

local gpu_it = H.gpu(it, function(why) pending(why) end)

-- it(name) on the CPU and gpu_it(name) on CUDA: body(device).
local function on_devices(name, body)
    it(name, function() body("cpu") end)
    gpu_it(name .. " (CUDA)", function() body("cuda") end)
end

-- float32 after several steps: a few roundings a step, reduced by tanh
local ATOL, RTOL = 1e-5, 1e-4

-- ---- the models ------------------------------------------------------------------

--[[
An RNN cell of width n: h' = tanh(h @ W + b), token = argmax(h') + pos; next
h = h', pos = pos + 1. W's entries are drawn within 1/sqrt(n) so that h @ W
stays in tanh's unsaturated range and the reference trajectory does not
diverge. Returns the graph's pieces, fresh inputs and their references.
]]
local function rnn(n)
    local s = 1 / math.sqrt(n)
    local wt, wr = H.rand({ n, n }, -s, s)
    local bt, br = H.rand({ n }, -0.5, 0.5)
    local h = mk.input("h", "float32", { n })
    local pos = mk.input("pos", "int64", { 1 })
    local pre = h:matmul(mk.constant(wt, "W")) + mk.constant(bt, "b")
    local h1 = pre:tanh()
    local token = h1:argmax() + pos
    local ht, hr = H.rand({ n })
    local p0 = math.random(1, 1000)
    return {
        n = n, pre = pre, h1 = h1, token = token,
        outputs = { h1, token }, next = { h = h1, pos = 1 },
        feeds = { h = ht, pos = mk.tensor({ p0 }, "int64") },
        h0 = hr, p0 = p0, W = wr, b = br,
    }
end

local function compile_rnn(c, device)
    return mk.compile(c.outputs, { next = c.next, device = device })
end

-- One reference step from h: h' and argmax(h') (0-based).
local function rnn_step(c, hr)
    local h1 = R.tanh(R.add(R.matmul(hr, c.W), c.b))
    return h1, R.argmax(h1).data[1]
end

-- Step s (1-based) of a stacked output [steps, ...], as a reference.
local function step_of(t, s)
    local shape = { (table.unpack or unpack)(t.shape, 2) }
    local size, data = H.numel(shape), {}
    for i = 1, size do data[i] = t:get((s - 1) * size + i) end
    return { shape = shape, data = data }
end

-- The argmax `got` (0-based) of values h is `want`, or another index whose value
-- ties with want's (float32 may pick either of two near-equal entries).
local function assert_argmax(got, want, h, what)
    if got == want then return end
    local gv, wv = h.data[got + 1], h.data[want + 1]
    assert(gv and math.abs(gv - wv) <= 1e-4,
        string.format("%s: argmax %s, expected %d (%.9g)", what, tostring(got), want, wv))
end

-- run_steps' outputs of the RNN against the reference trajectory from c's inputs.
local function check_rnn(c, outs, steps)
    assert.are.same({ steps, c.n }, outs[1].shape)
    assert.are.same({ steps, 1 }, outs[2].shape)
    local hr, best = c.h0, nil
    for s = 1, steps do
        hr, best = rnn_step(c, hr)
        H.assert_close(step_of(outs[1], s), hr, ATOL, RTOL)
        assert_argmax(outs[2]:get(s, 1) - (c.p0 + s - 1), best, hr, "step " .. s)
    end
end

-- A tensor of `shape` holding v everywhere (output tensors whose old contents show).
local function filled(dtype, shape, v)
    local data = {}
    for i = 1, H.numel(shape) do data[i] = v end
    return mk.tensor(data, dtype, shape)
end

-- x' = x / 2 fed back (exact in float32), and the counter as an output.
local function halving(device, add)
    local x = mk.input("x", "float32", { 3 })
    local pos = mk.input("pos", "int64", { 1 })
    local x1 = x * 0.5
    return mk.compile({ x1, pos + 0 }, { next = { x = x1, pos = add or 1 }, device = device })
end

-- The line of `text` that starts with `prefix` (1-based), for script error positions.
local function line_of(text, prefix)
    local l = 0
    for line in text:gmatch("([^\n]*)\n") do
        l = l + 1
        if line:sub(1, #prefix) == prefix then return l end
    end
    error("no line starts with " .. prefix)
end

-- ---- run_steps against the reference ------------------------------------------------

describe("model:run_steps", function()
    for _, n in ipairs({ 5, 33, 64 }) do
        for _, steps in ipairs({ 1, 7 }) do
            on_devices(string.format("runs %d step(s) of an RNN of width %d as the reference does",
                steps, n), function(device)
                local c = rnn(n)
                local m = compile_rnn(c, device)
                local outs, ran = m:run_steps(steps, c.feeds)
                assert.are.equal(steps, ran)
                check_rnn(c, outs, steps)
                if device ~= "cpu" then
                    local cpu = compile_rnn(c, "cpu")
                    local want = cpu:run_steps(steps, c.feeds)
                    H.assert_close(outs[1], H.ref(want[1]), ATOL, RTOL)
                end
            end)
        end
    end

    on_devices("gives what m:run gives when its outputs are fed back by hand", function(device)
        local c = rnn(math.random(2, 48))
        local m = compile_rnn(c, device)
        local steps = math.random(2, 9)
        local outs = m:run_steps(steps, c.feeds)
        local h = c.feeds.h
        for s = 1, steps do
            local h1, token = m:run({ h = h, pos = mk.tensor({ c.p0 + s - 1 }, "int64") })
            H.assert_close(step_of(outs[1], s), H.ref(h1), 0, 0)
            assert.are.equal(token:get(1), outs[2]:get(s, 1))
            h = h1
        end
    end)

    on_devices("fills the output tensors given, and makes those not given", function(device)
        local c = rnn(math.random(2, 20))
        local m = compile_rnn(c, device)
        local steps = math.random(2, 6)
        local oh = filled("float32", { steps, c.n }, 7)
        local outs, ran = m:run_steps(steps, c.feeds, { oh })
        assert.are.equal(oh, outs[1])
        check_rnn(c, outs, ran)
        local ot = filled("int64", { steps, 1 }, -7)
        local again = m:run_steps(steps, c.feeds, { filled("float32", { steps, c.n }, 7), ot })
        assert.are.equal(ot, again[2])
        assert.are.same(outs[2]:totable(), ot:totable())
    end)

    on_devices("feeds an int64 token through an embedding (a greedy decoder)", function(device)
        local V, D = math.random(3, 30), math.random(2, 16)
        local et, er = H.rand({ V, D })
        local wt, wr = H.rand({ D, V })
        local tok = mk.input("tok", "int64", { 1 })
        local logits = mk.embedding(mk.constant(et, "E"), tok):matmul(mk.constant(wt, "W"))
        local next_tok = logits:argmax():reshape({ 1 })
        local m = mk.compile({ next_tok, logits }, { next = { tok = next_tok }, device = device })
        local t0, steps = math.random(0, V - 1), math.random(3, 12)
        local outs, ran = m:run_steps(steps, { tok = mk.tensor({ t0 }, "int64") })
        assert.are.equal(steps, ran)
        local prev = t0
        for s = 1, steps do -- each step from the token the model fed itself
            local want = R.matmul(R.embedding(er, { data = { prev } }), wr)
            H.assert_close(step_of(outs[2], s), want, ATOL, RTOL)
            local got = outs[1]:get(s, 1)
            assert_argmax(got, R.argmax(want).data[1], want, "step " .. s)
            prev = got
        end
    end)

    on_devices("counts int64 counters of several elements by any increment", function(device)
        local ids = mk.input("ids", "int64", { 3 })
        local x = mk.input("x", "float32", { 2 })
        local add = math.random(-5, 5)
        if add == 0 then add = 3 end
        local m = mk.compile({ ids + 0, x * 1 }, { next = { ids = add }, device = device })
        local it_, ir = H.randint({ 3 }, -1000, 1000)
        local xt, xr = H.rand({ 2 })
        local steps = math.random(2, 8)
        local outs = m:run_steps(steps, { ids = it_, x = xt })
        for s = 1, steps do
            for i = 1, 3 do assert.are.equal(ir.data[i] + (s - 1) * add, outs[1]:get(s, i)) end
            H.assert_close(step_of(outs[2], s), xr, 0, 0) -- an input without a next line stays
        end
    end)

    on_devices("feeds each input the outputs of the step before, also where an output is an input", function(device)
        -- a' = 2 b, b' = a: output 2 is input a itself, so a's new value must not reach b
        local n = math.random(1, 8)
        local a, b = mk.input("a", "float32", { n }), mk.input("b", "float32", { n })
        local twice_b = b * 2
        local m = mk.compile({ twice_b, a }, { next = { a = twice_b, b = a }, device = device })
        local at, ar = H.rand({ n })
        local bt, br = H.rand({ n })
        local steps = math.random(3, 8)
        local outs = m:run_steps(steps, { a = at, b = bt })
        for s = 1, steps do
            H.assert_close(step_of(outs[1], s), R.mul(br, R.fill({ 1 }, 2)), 0, 0)
            H.assert_close(step_of(outs[2], s), ar, 0, 0)
            ar, br = R.mul(br, R.fill({ 1 }, 2)), ar
        end
    end)

    on_devices("runs a recurrence of many inputs (more than a device loop stages at once)", function(device)
        -- acc' = acc + x1 + ... + x9
        local n = math.random(1, 6)
        local feeds, total_r = {}, nil
        feeds.acc, total_r = H.rand({ n })
        local total, sum_r = mk.input("acc", "float32", { n }), R.fill({ n }, 0.0)
        for i = 1, 9 do
            local t, r = H.rand({ n })
            feeds["x" .. i] = t
            total, sum_r = total + mk.input("x" .. i, "float32", { n }), R.add(sum_r, r)
        end
        local m = mk.compile({ total }, { next = { acc = total }, device = device })
        local steps = math.random(2, 6)
        local outs = m:run_steps(steps, feeds)
        for s = 1, steps do
            total_r = R.add(total_r, sum_r)
            H.assert_close(step_of(outs[1], s), total_r, ATOL, RTOL)
        end
    end)

    on_devices("runs thousands of steps a call, each from the one before", function(device)
        -- more steps than one launch of a device loop holds, and a stop past the first
        local c = rnn(8)
        local m = compile_rnn(c, device)
        local n = 2500
        local outs, ran = m:run_steps(n, c.feeds)
        assert.are.equal(n, ran)
        local prev = c.h0
        for s = 1, n do
            local h = step_of(outs[1], s)
            local want, best = rnn_step(c, prev)
            H.assert_close(h, want, ATOL, RTOL)
            assert_argmax(outs[2]:get(s, 1) - (c.p0 + s - 1), best, want, "step " .. s)
            prev = h
        end
        -- a stop at the token of a step past the first thousand: the first step that gives it
        local value = outs[2]:get(math.random(1100, 2400), 1)
        local first = 1
        while outs[2]:get(first, 1) ~= value do first = first + 1 end
        local _, stopped = m:run_steps(n, c.feeds, nil, { stop = { output = 2, value = value } })
        assert.are.equal(first, stopped)
    end)

    on_devices("runs many steps of large outputs", function(device)
        -- 64 KiB a step: fewer steps fit one launch of a device loop
        local width, n = 16384, math.random(520, 700)
        local x = mk.input("x", "float32", { width })
        local pos = mk.input("pos", "int64", { 1 })
        local flip = x * -1
        local m = mk.compile({ flip, pos + 0 }, { next = { x = flip, pos = 1 }, device = device })
        local xt, xr = H.rand({ width })
        local p0 = math.random(1, 1000)
        local outs, ran = m:run_steps(n, { x = xt, pos = mk.tensor({ p0 }, "int64") })
        assert.are.equal(n, ran)
        for s = 1, n do
            assert.are.equal(p0 + s - 1, outs[2]:get(s, 1))
            for _, j in ipairs({ 1, math.random(2, width - 1), width }) do
                assert.are.equal(xr.data[j] * (-1) ^ s, outs[1]:get(s, j), "step " .. s)
            end
        end
    end)

    on_devices("keeps buffers from one step to the next", function(device)
        local acc = mk.buffer("int64", { 3 })
        local x = mk.input("x", "int64", { 3 })
        local m = mk.compile(acc:replace(acc + x, 0, 3), { device = device })
        assert.are.same({}, m:recurrence())
        local xt, xr = H.randint({ 3 }, 1, 1000)
        local steps = math.random(2, 9)
        local outs, ran = m:run_steps(steps, { x = xt })
        assert.are.equal(steps, ran)
        for s = 1, steps do
            for i = 1, 3 do assert.are.equal(s * xr.data[i], outs[1]:get(s, i)) end
        end
    end)
end)

-- ---- stop -----------------------------------------------------------------------------

describe("run_steps' stop", function()
    on_devices("ends after the first step whose int64 output equals the value", function(device)
        local m = halving(device)
        local n = 9
        local xt, xr = H.rand({ 3 })
        local p0 = math.random(-100, 100)
        for _, k in ipairs({ 1, math.random(2, n - 1), n }) do
            local outs, ran = m:run_steps(n, { x = xt, pos = mk.tensor({ p0 }, "int64") }, nil,
                { stop = { output = 2, value = p0 + k - 1 } })
            assert.are.equal(k, ran)
            assert.are.same({ n, 3 }, outs[1].shape) -- the tensors have room for n steps
            for s = 1, k do
                assert.are.equal(p0 + s - 1, outs[2]:get(s, 1))
                H.assert_close(step_of(outs[1], s), R.mul(xr, R.fill({ 1 }, 0.5 ^ s)), 0, 0)
            end
        end
    end)

    on_devices("counting from 0, a stop at 3 ends after step 4", function(device)
        local m = halving(device)
        local outs, ran = m:run_steps(10, { x = H.rand({ 3 }), pos = mk.tensor({ 0 }, "int64") }, nil,
            { stop = { output = 2, value = 3 } })
        assert.are.equal(4, ran)
        for s = 1, 4 do assert.are.equal(s - 1, outs[2]:get(s, 1)) end
    end)

    on_devices("never reached, runs all n steps", function(device)
        local m = halving(device, -1)
        local n, p0 = math.random(1, 8), math.random(1, 100)
        local outs, ran = m:run_steps(n, { x = H.rand({ 3 }), pos = mk.tensor({ p0 }, "int64") }, nil,
            { stop = { output = 2, value = p0 + 1 } }) -- counting down: passed at once
        assert.are.equal(n, ran)
        assert.are.equal(p0 - (n - 1), outs[2]:get(n, 1))
    end)
end)

-- ---- several outputs with m:run ------------------------------------------------------

describe("a model of several outputs", function()
    on_devices("m:run returns every output, in order, into the tensors given", function(device)
        local c = rnn(math.random(2, 40))
        local m = compile_rnn(c, device)
        local want, best = rnn_step(c, c.h0)
        local h1, token = m:run(c.feeds)
        H.assert_close(h1, want, ATOL, RTOL)
        assert_argmax(token:get(1) - c.p0, best, want, "token")
        local oh, ot = filled("float32", { c.n }, 7), filled("int64", { 1 }, -7)
        local a, b = m:run(c.feeds, oh, ot)
        assert.are.equal(oh, a)
        assert.are.equal(ot, b)
        H.assert_close(oh, H.ref(h1), 0, 0)
        assert.are.equal(token:get(1), ot:get(1))
        local _, b2 = m:run(c.feeds, oh) -- only the first given: the second is new
        assert.are_not.equal(ot, b2)
        assert.are.equal(token:get(1), b2:get(1))
    end)

    on_devices("gives nodes inside a fused chain as outputs too", function(device)
        -- a product, its bias, tanh and a pointwise tail: groups must not swallow an output
        local rows, n, k = math.random(1, 4), math.random(2, 40), math.random(2, 40)
        local xt, xr = H.rand({ rows, n })
        local wt, wr = H.rand({ n, k }, -0.3, 0.3)
        local bt, br = H.rand({ 1, k })
        local x = mk.input("x", "float32", { rows, n })
        local pre = x:matmul(mk.constant(wt, "W")) + mk.constant(bt, "b")
        local a = pre:tanh()
        local m = mk.compile({ (a * a):relu(), pre, a }, { device = device })
        local pre_r = R.add(R.matmul(xr, wr), br)
        local a_r = R.tanh(pre_r)
        local got = { m:run({ x = xt }) }
        for i, want in ipairs({ R.relu(R.mul(a_r, a_r)), pre_r, a_r }) do
            H.assert_close(got[i], want, ATOL, RTOL)
        end
    end)

    it("m:run refuses output tensors of the wrong shape or dtype, and stays usable", function()
        local c = rnn(math.random(2, 20))
        local m = compile_rnn(c, "cpu")
        local oh, ot = mk.zeros("float32", { c.n }), mk.zeros("int64", { 1 })
        local S = H.shape_str
        E(function() m:run(c.feeds, mk.zeros("float32", { c.n + 1 }), ot) end, "argument error: run:",
            "output tensor 1", S({ c.n + 1 }), S({ c.n }))
        E(function() m:run(c.feeds, oh, mk.zeros("float32", { 1 })) end, "argument error: run:",
            "output tensor 2", "float32", "int64")
        E(function() m:run(c.feeds, ot, oh) end, "argument error: run:", "output tensor 1")
        E(function() m:run(c.feeds, oh, "x") end, "argument error: run:")
        local h1 = m:run(c.feeds, oh, ot)
        H.assert_close(h1, (rnn_step(c, c.h0)), ATOL, RTOL)
    end)

    it("m:run and run_steps refuse more output tensors than the model has outputs", function()
        local c = rnn(3)
        local m = compile_rnn(c, "cpu")
        local extra = mk.zeros("int64", { 1 })
        E(function() m:run(c.feeds, mk.zeros("float32", { 3 }), mk.zeros("int64", { 1 }), extra) end,
            "argument error: run:")
        E(function()
            m:run_steps(2, c.feeds, { mk.zeros("float32", { 2, 3 }), mk.zeros("int64", { 2, 1 }), extra })
        end, "argument error: run_steps:")
    end)

    it("describes its outputs and recurrence", function()
        local c = rnn(math.random(2, 20))
        local m = compile_rnn(c, "cpu")
        assert.are.same({ { dtype = "float32", shape = { c.n } }, { dtype = "int64", shape = { 1 } } },
            m:outputs())
        assert.are.same({ h = { output = 1 }, pos = { add = 1 } }, m:recurrence())
        assert.truthy(tostring(m):find(string.format("-> float32 [%d], int64 [1]", c.n), 1, true),
            tostring(m))
        local single = mk.compile(c.h1)
        assert.are.same({ { dtype = "float32", shape = { c.n } } }, single:outputs())
        assert.are.same({}, single:recurrence())
    end)
end)

-- ---- the caller's inputs ---------------------------------------------------------------

describe("run_steps and the caller's inputs", function()
    on_devices("leaves them as they were: counters and feeds live in the model", function(device)
        local c = rnn(math.random(2, 30))
        local m = compile_rnn(c, device)
        local steps = math.random(2, 8)
        local first = m:run_steps(steps, c.feeds)
        H.assert_close(c.feeds.h, c.h0, 0, 0)
        assert.are.equal(c.p0, c.feeds.pos:get(1))
        -- so a second call starts again from them, and m:run takes them as given
        local again = m:run_steps(steps, c.feeds)
        H.assert_close(again[1], H.ref(first[1]), 0, 0)
        assert.are.same(first[2]:totable(), again[2]:totable())
        local h1, token = m:run(c.feeds)
        H.assert_close(h1, step_of(first[1], 1), 0, 0)
        assert.are.equal(first[2]:get(1, 1), token:get(1))
    end)
end)

-- ---- bad input ---------------------------------------------------------------------------

describe("run_steps with bad arguments", function()
    on_devices("refuses each with a clear error, and the model runs after each", function(device)
        local c = rnn(math.random(2, 20))
        local m = compile_rnn(c, device)
        local n = c.n
        local S = H.shape_str
        local cases = {
            { function() m:run_steps(0, c.feeds) end, "argument error: run_steps:", "n must be at least 1, got 0" },
            { function() m:run_steps(-2, c.feeds) end, "argument error: run_steps:", "n must be at least 1, got -2" },
            { function() m:run_steps(2, { h = c.feeds.h }) end, "input error: run_steps:", "missing input 'pos'" },
            { function() m:run_steps(2, { h = c.feeds.h, pos = c.feeds.pos, y = c.feeds.h }) end,
                "input error: run_steps:", "unknown input 'y'" },
            { function() m:run_steps(2, { h = c.feeds.h, pos = mk.tensor({ 1 }) }) end,
                "input error: run_steps:", "'pos'", "float32", "int64" },
            { function() m:run_steps(2, c.feeds, nil, { stop = { output = 1, value = 3 } }) end,
                "dtype error: run_steps:", "a stop value needs an int64 output of one element" },
            { function() m:run_steps(2, c.feeds, nil, { stop = { output = 3, value = 3 } }) end,
                "argument error: run_steps:", "opts.stop.output is 3; the model has 2 outputs" },
            { function() m:run_steps(2, c.feeds, nil, { stop = { output = 0, value = 3 } }) end,
                "argument error: run_steps:", "opts.stop.output is 0" },
            { function() m:run_steps(2, c.feeds, nil, { stop = 3 }) end, "argument error: run_steps:",
                "opts.stop must be" },
            { function() m:run_steps(2, c.feeds, { mk.zeros("float32", { n }) }) end,
                "argument error: run_steps:", "output tensor 1", S({ 2, n }) },
            { function() m:run_steps(2, c.feeds, { nil, mk.zeros("float32", { 2, 1 }) }) end,
                "argument error: run_steps:", "output tensor 2", "int64" },
            { function() m:run_steps(2, c.feeds, 5) end, "argument error: run_steps:",
                "outs must be a list of tensors" },
        }
        for i, case in ipairs(cases) do
            E(case[1], (table.unpack or unpack)(case, 2))
            local outs, ran = m:run_steps(2, c.feeds)
            assert.are.equal(2, ran, "after case " .. i)
            check_rnn(c, outs, 2)
        end
    end)

    on_devices("a failed step leaves the steps before it written, and the model usable", function(device)
        -- a row written at the counter: out of range once the counter passes the last row
        local rows, d = math.random(2, 5), math.random(1, 4)
        local row = mk.input("row", "float32", { 1, d })
        local pos = mk.input("pos", "int64", { 1 })
        local kv = mk.buffer("float32", { rows, d })
        local m = mk.compile({ kv:replace(row, pos, pos + 1) }, { next = { pos = 1 }, device = device })
        local rt, rr = H.rand({ 1, d })
        local outs = { mk.zeros("float32", { rows + 2, rows, d }) }
        local feeds = { row = rt, pos = mk.tensor({ 0 }, "int64") }
        E(function() m:run_steps(rows + 2, feeds, outs) end, "evaluation error: ReplaceSliceNode", "(script:",
            string.format("rows [%d, %d)", rows, rows + 1), "out of range")
        for s = 1, rows do -- step s has rows 1 .. s written
            local want = R.fill({ rows, d }, 0.0)
            for r = 1, s do
                for j = 1, d do want.data[(r - 1) * d + j] = rr.data[j] end
            end
            H.assert_close(step_of(outs[1], s), want, 0, 0)
        end
        m:reset()
        local again, ran = m:run_steps(rows, feeds)
        assert.are.equal(rows, ran)
        H.assert_close(step_of(again[1], rows), step_of(outs[1], rows), 0, 0)
    end)

    it("names run_steps and counts outputs from 1 in its messages", function()
        local c = rnn(3)
        local m = compile_rnn(c, "cpu")
        E(function() m:run_steps(2, { h = c.feeds.h, pos = c.feeds.pos, y = c.feeds.h }) end,
            "input error: run_steps: unknown input 'y'")
        E(function() m:run_steps(2, c.feeds, nil, { stop = { output = 1, value = 3 } }) end,
            "dtype error: run_steps:", "output 1 is float32 [3]")
    end)

    it("refuses an output whose steps would need rank 7", function()
        local x = mk.input("x", "float32", { 1, 2, 1, 2, 1, 2 })
        local m = mk.compile(x * 2)
        E(function() m:run_steps(2, { x = H.rand({ 1, 2, 1, 2, 1, 2 }) }) end,
            "argument error: run_steps:", "rank 7")
        assert.are.same({ 1, 2, 1, 2, 1, 2 }, m:run({ x = H.rand({ 1, 2, 1, 2, 1, 2 }) }).shape)
    end)
end)

-- ---- next lines that do not fit -------------------------------------------------------

describe("mk.compile's next", function()
    it("is checked against the script, with the line and column", function()
        local c = rnn(math.random(2, 20))
        local g = mk.input("g", "float32", { c.n + 1 })
        local with_g = { c.h1, c.token, g:relu() }
        -- each: outputs, next, the next line's start (for its line), column, the rest of the message
        local cases = {
            { c.outputs, { y = c.h1 }, "next y", 6, "name error: next: 'y' is not an input" },
            { c.outputs, { h = c.token }, "next h", 10, "dtype error: next: $", "is int64, input 'h' is float32" },
            { c.outputs, { pos = c.h1 }, "next pos", 12, "dtype error: next: $", "is float32, input 'pos' is int64" },
            { with_g, { g = c.h1 }, "next g", 10, "shape error: next: $",
                string.format("has shape [%d], input 'g' has [%d]", c.n, c.n + 1) },
            { c.outputs, { h = 1 }, "next h", 6, "dtype error: next: the counter 'h' is float32; a counter is int64" },
            { c.outputs, { h = c.pre }, "next h", 10, "name error: next: $", "is not an output" },
        }
        for _, case in ipairs(cases) do
            local outputs, next, start, column = (table.unpack or unpack)(case, 1, 4)
            local where = string.format("script:%d:%d: ", line_of(mk.script(outputs, next), start), column)
            E(function() mk.compile(outputs, { next = next }) end, where .. case[5], (table.unpack or unpack)(case, 6))
            local m = compile_rnn(c, "cpu") -- the module goes on
            check_rnn(c, m:run_steps(3, c.feeds), 3)
        end
    end)

    it("takes only output nodes and integers, by input name", function()
        local c = rnn(math.random(2, 20))
        local other = mk.input("q", "float32", { c.n })
        E(function() mk.compile(c.outputs, { next = { h = other } }) end, "argument error: script:",
            "next.h must be an output node or an integer", "a node that is not an output")
        E(function() mk.compile(c.outputs, { next = { h = "h1" } }) end, "argument error: script:",
            "next.h must be an output node or an integer, got string")
        E(function() mk.compile(c.outputs, { next = { c.h1 } }) end, "argument error: script:",
            "next's keys are input names")
        E(function() mk.compile(c.outputs, { next = 5 }) end, "argument error: script:",
            "next must be a table")
        E(function() mk.compile({ c.h1, "x" }) end, "argument error: script:", "output 2 must be a node")
        local m = compile_rnn(c, "cpu")
        check_rnn(c, m:run_steps(2, c.feeds), 2)
    end)
end)

-- ---- scripts ------------------------------------------------------------------------------

describe("scripts of recurrences", function()
    -- the ids on the result line and each next line of `text`
    local function tail_of(text)
        local a, b = text:match("\nresult = %$(%d+), %$(%d+);\n")
        return a, b, text:match("\nnext h = %$(%d+);\n"), text:match("\nnext pos = pos %+ (%-?%d+);\n$")
    end

    it("mk.script prints the result tuple and the next lines, in name order", function()
        local c = rnn(4)
        local text = mk.script(c.outputs, c.next)
        local a, b, fed, add = tail_of(text)
        assert.truthy(a, text)
        assert.truthy(text:find("\n$" .. a .. " = TanhNode%(") , text)
        assert.truthy(text:find("\n$" .. b .. " = SumNode%(") , text)
        assert.are.equal(a, fed)
        assert.are.equal("1", add)
        assert.truthy(text:find("next h = [^\n]*\nnext pos = "), text)
        -- one node: one id on the result line, no next line
        local single = mk.script(c.h1)
        assert.truthy(single:find("\nresult = %$%d+;\n$"), single)
        assert.falsy(single:find("next", 1, true))
    end)

    it("m:script() keeps them after compiling", function()
        local c = rnn(6)
        local m = compile_rnn(c, "cpu")
        local a, b, fed, add = tail_of(m:script())
        assert.truthy(a and b, m:script())
        assert.are.equal(a, fed)
        assert.are.equal("1", add)
        -- mk.script's text prints back as it is
        local text = mk.script(c.outputs, c.next)
        assert.are.equal(text, mk.format_script(text))
    end)

    it("mk.compile_script runs a hand-written recurrence", function()
        local n, add = math.random(2, 12), math.random(2, 5)
        local c = rnn(n)
        local text = string.format([[
# an RNN cell, written by hand
$1 = InputTensor(h, float32, [%d]);
$2 = ConstantTensor(W, float32, [%d, %d]);
$3 = ConstantTensor(b, float32, [%d]);
$4 = InputTensor(pos, int64, [1]);
$5 = MatMulNode($1, $2);
$6 = SumNode($5, $3);
$7 = TanhNode($6);
$8 = ArgMaxNode($7);
$9 = SumNode($8, $4);
result = $7, $9;
next pos = pos + %d;   # a counter
next h = $7;
]], n, n, n, n, add)
        local m = mk.compile_script(text, { W = H.tensor(c.W), b = H.tensor(c.b) })
        assert.are.same({ h = { output = 1 }, pos = { add = add } }, m:recurrence())
        local steps = math.random(2, 7)
        local outs, ran = m:run_steps(steps, c.feeds)
        assert.are.equal(steps, ran)
        local hr, best = c.h0, nil
        for s = 1, steps do
            hr, best = rnn_step(c, hr)
            H.assert_close(step_of(outs[1], s), hr, ATOL, RTOL)
            assert_argmax(outs[2]:get(s, 1) - (c.p0 + (s - 1) * add), best, hr, "step " .. s)
        end
        E(function() mk.compile_script(text .. "next h = $7;\n", { W = H.tensor(c.W), b = H.tensor(c.b) }) end,
            "script:14:6: name error: next: input 'h' already has a next line (line 13)")
    end)
end)
