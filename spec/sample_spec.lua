-- SampleNode: run.c's sampler as an op. On the CPU the tokens and states
-- equal a reference written here from run.c's definition (plain loops, every
-- step rounded to float32, a full sort with a comparator), on random logits
-- drawn with a printed seed: peaked and flat rows, ties, every path (argmax,
-- multinomial, top-p). On CUDA (#gpu) the states equal the CPU's; a token may
-- differ from the CPU's only where the draw falls within float32's summation
-- error of its running sums in the CPU's order (CUDA sums in fixed point,
-- run.c in float32 in order, so a cut or a draw that close may go the other
-- way), and rarely.
local H = require "spec.helpers"
local mk = H.mk()
H.seed("sample_spec")
local E = H.assert_error
local f32 = H.f32

local gpu_it = H.gpu(it, function(why) pending(why) end)

-- ---- the reference ---------------------------------------------------------------

local function xorshift(s)
    s = s ~ (s >> 12)
    s = s ~ (s << 25)
    s = s ~ (s >> 27)
    return s, ((s * 0x2545F4914F6CDD1D) >> 32) >> 8
end

--[[
run.c's sample() over logits x[1..n] (float32 values) with state s: returns
the 0-based token, the next state, and for a draw the candidates in the
order it walked them with the running sums there (rank -> {index, cdf}), the
draw, and the rank where top-p cut (0 without a cut), so that a caller can
tell how far the draw fell from each boundary.
]]
local function reference(x, s, t, topp)
    local n = #x
    if not (t > 0) then
        local best = 1
        for i = 2, n do if x[i] > x[best] then best = i end end
        return best - 1, s
    end
    local p, max = {}, nil
    for i = 1, n do
        p[i] = f32(x[i] / t)
        if i == 1 or p[i] > max then max = p[i] end
    end
    local sum = 0.0
    for i = 1, n do
        p[i] = f32(math.exp(f32(p[i] - max)))
        sum = f32(sum + p[i])
    end
    for i = 1, n do p[i] = f32(p[i] / sum) end
    local u
    s, u = xorshift(s)
    local coin = f32(u / 16777216.0)
    local order, cut = {}, 0
    if topp <= 0 or topp >= 1 then
        for i = 1, n do order[i] = i end
    else
        local cutoff = f32(f32(1.0 - topp) / (n - 1))
        for i = 1, n do if p[i] >= cutoff then order[#order + 1] = i end end
        if #order == 0 then for i = 1, n do order[i] = i end end
        table.sort(order, function(a, b) return p[a] > p[b] or (p[a] == p[b] and a < b) end)
        local cum, last = 0.0, #order
        for k, i in ipairs(order) do
            cum = f32(cum + p[i])
            if cum > topp then last = k; break end
        end
        cut = last
        for k = #order, last + 1, -1 do order[k] = nil end
        coin = f32(coin * cum)
    end
    local walk, cdf, token = {}, 0.0, nil
    for k, i in ipairs(order) do
        cdf = f32(cdf + p[i])
        walk[k] = { index = i - 1, cdf = cdf }
        if not token and coin < cdf then token = i - 1 end
    end
    return token or order[#order] - 1, s, walk, coin, cut
end

-- ---- the op ------------------------------------------------------------------------

local function sampler(shape, device)
    local rows_shape = { table.unpack(shape) }
    rows_shape[#rows_shape] = 1
    local x = mk.input("x", "float32", shape)
    local s = mk.input("s", "int64", rows_shape)
    local t = mk.input("t", "float32", { 1 })
    local p = mk.input("p", "float32", { 1 })
    return mk.compile(x:sample(s, t, p), { device = device })
end

-- Logits [rows][n]: uniform in ±spread (spread 0.5: nearly flat; 12: peaked),
-- or drawn from `levels` values only (ties).
local function logits(rows, n, spread, levels)
    local out = {}
    for r = 1, rows do
        local row = {}
        for i = 1, n do
            if levels then
                row[i] = f32(math.random(0, levels - 1) * spread / levels)
            else
                row[i] = f32((math.random() * 2 - 1) * spread)
            end
        end
        out[r] = row
    end
    return out
end

local function random_state()
    return math.random(math.mininteger, math.maxinteger)
end

-- One evaluation: x [rows][n], states [rows]; returns the result's rows {token, state}.
local function run(m, x, states, t, topp)
    local st = {}
    for r, v in ipairs(states) do st[r] = { v } end
    local out = m:run({ x = mk.tensor(x, "float32"), s = mk.tensor(st, "int64"),
                        t = mk.tensor({ t }, "float32"), p = mk.tensor({ topp }, "float32") })
    return out:totable()
end

-- The settings every path goes through: argmax, multinomial, top-p.
local SETTINGS = {
    { 0.0, 0.9 }, { -1.0, 0.5 }, { 1.0, 0.0 }, { 0.7, 1.0 }, { 1.0, 0.9 }, { 1.6, 0.3 },
    { 0.9, 0.97 }, { 1.0, 0.05 },
}
local SHAPES = { { 1, 1 }, { 1, 2 }, { 3, 7 }, { 2, 513 }, { 1, 2000 } }
local SPREADS = { { 0.5 }, { 12 }, { 2, 3 } }

-- The cases: every setting, shape and spread, with fresh states.
local function cases()
    local list = {}
    for _, shape in ipairs(SHAPES) do
        for _, spread in ipairs(SPREADS) do
            for _, setting in ipairs(SETTINGS) do
                local rows, n = shape[1], shape[2]
                local states = {}
                for r = 1, rows do states[r] = random_state() end
                list[#list + 1] = { rows = rows, n = n, x = logits(rows, n, spread[1], spread[2]),
                                    states = states, t = f32(setting[1]), topp = f32(setting[2]) }
            end
        end
    end
    return list
end

local function describe_case(c, r)
    return string.format("rows %d, n %d, t %g, topp %g, row %d, state %d", c.rows, c.n, c.t,
                         c.topp, r, c.states[r])
end

describe("SampleNode", function()
    it("picks run.c's tokens and states on the CPU", function()
        local models = {}
        for _, c in ipairs(cases()) do
            local key = c.rows .. "x" .. c.n
            models[key] = models[key] or sampler({ c.rows, c.n }, "cpu")
            local got = run(models[key], c.x, c.states, c.t, c.topp)
            for r = 1, c.rows do
                local token, state = reference(c.x[r], c.states[r], c.t, c.topp)
                assert.are.same({ token, state }, got[r], describe_case(c, r))
            end
        end
    end)

    it("takes a vector of logits and a [1] state, and leaves the state on argmax", function()
        local n = 300
        local x = mk.input("x", "float32", { n })
        local s = mk.input("s", "int64", { 1 })
        local t = mk.input("t", "float32", { 1 })
        local m = mk.compile(x:sample(s, t, mk.constant(mk.tensor({ 0.8 }, "float32"))))
        local xs = logits(1, n, 4)[1]
        local seed = random_state()
        for _, temp in ipairs({ 0.0, 1.0, 0.25 }) do
            local out = m:run({ x = mk.tensor(xs, "float32"), s = mk.tensor({ seed }, "int64"),
                                t = mk.tensor({ temp }, "float32") }):totable()
            local token, state = reference(xs, seed, f32(temp), f32(0.8))
            assert.are.same({ token, state }, out)
            if temp == 0 then assert.are.equal(seed, out[2]) else assert.are_not.equal(seed, out[2]) end
        end
    end)

    it("always picks an index in range, NaN and infinite logits included", function()
        local m = sampler({ 1, 64 }, "cpu")
        for _, bad in ipairs({ 0 / 0, math.huge, -math.huge }) do
            for _, setting in ipairs(SETTINGS) do
                for _, at in ipairs({ 1, 17 }) do
                    local x = logits(1, 64, 3)
                    x[1][at] = bad
                    local got = run(m, x, { random_state() }, f32(setting[1]), f32(setting[2]))
                    assert.is_true(got[1][1] >= 0 and got[1][1] < 64)
                end
            end
        end
        local got = run(m, logits(1, 64, 3), { 5 }, 1.0, 0 / 0) -- NaN top-p: run.c's top-p path
        assert.is_true(got[1][1] >= 0 and got[1][1] < 64)
    end)

    it("runs as a recurrence: token and state fed to the next step", function()
        -- logits = table[token]: a Markov chain whose draws feed the next step
        local V, steps = 40, 25
        local tbl = logits(V, V, 6)
        local token = mk.input("token", "int64", { 1 })
        local rng = mk.input("rng", "int64", { 1 })
        local t = mk.input("t", "float32", { 1 })
        local p = mk.input("p", "float32", { 1 })
        local drawn = mk.embedding(mk.constant(mk.tensor(tbl, "float32")), token)
            :reshape({ V }):sample(rng, t, p)
        local outs = { drawn:slice(0, 1), drawn:slice(1, 2) }
        local m = mk.compile(outs, { next = { token = outs[1], rng = outs[2] } })
        for _, setting in ipairs({ { 1.0, 0.9 }, { 0.8, 0.0 }, { 0.0, 0.5 } }) do
            local tok0, seed = math.random(0, V - 1), random_state()
            local got, k = m:run_steps(steps, { token = mk.tensor({ tok0 }, "int64"),
                rng = mk.tensor({ seed }, "int64"), t = mk.tensor({ setting[1] }, "float32"),
                p = mk.tensor({ setting[2] }, "float32") })
            assert.are.equal(steps, k)
            local tk, st = tok0, seed
            for i = 1, steps do
                tk, st = reference(tbl[tk + 1], st, f32(setting[1]), f32(setting[2]))
                assert.are.same({ tk, st }, { got[1]:get(i, 1), got[2]:get(i, 1) }, "step " .. i)
            end
        end
    end)

    it("refuses bad operands with the node's position", function()
        local function script(x, s, t, p)
            return table.concat({
                "$1 = InputTensor(x, " .. x .. ");", "$2 = InputTensor(s, " .. s .. ");",
                "$3 = InputTensor(t, " .. t .. ");", "$4 = InputTensor(p, " .. p .. ");",
                "$5 = SampleNode($1, $2, $3, $4);", "result = $5;" }, "\n")
        end
        local ok = script("float32, [4, 10]", "int64, [4, 1]", "float32, [1]", "float32, [1]")
        assert.is_truthy(mk.compile_script(ok))
        E(function() mk.compile_script(script("int64, [10]", "int64, [1]", "float32, [1]", "float32, [1]")) end,
          "script:5:1:", "SampleNode does not take int64")
        E(function() mk.compile_script(script("float32, [10]", "float32, [1]", "float32, [1]", "float32, [1]")) end,
          "script:5:1:", "generator state", "must be int64")
        E(function() mk.compile_script(script("float32, [4, 10]", "int64, [4, 2]", "float32, [1]", "float32, [1]")) end,
          "script:5:1:", "generator state [4, 2] must be the logits' [4, 10] with a last axis of 1")
        E(function() mk.compile_script(script("float32, [4, 10]", "int64, [1]", "float32, [1]", "float32, [1]")) end,
          "script:5:1:", "generator state")
        E(function() mk.compile_script(script("float32, [10]", "int64, [1]", "int64, [1]", "float32, [1]")) end,
          "script:5:1:", "the temperature", "must be float32, not int64")
        E(function() mk.compile_script(script("float32, [10]", "int64, [1]", "float32, [1]", "float32, [2]")) end,
          "script:5:1:", "top-p", "must have shape [1], not [2]")
        local x = mk.input("x", "float32", { 5 })
        E(function() x:sample(mk.input("s", "int64", { 1 }), 0.5, 0.9) end, "argument error")
    end)

    gpu_it("draws as the CPU does on CUDA", function()
        local models, shown, ambiguous, draws = {}, 0, 0, 0
        local list = cases()
        -- and rows as long as a vocabulary: flat, peaked, ties (of 3 values;
        -- of 80: about 400 equal candidates to a bin, lists that select_ranked
        -- leaves to select_sorted; of 32: about 1,000, lists longer than a
        -- block's threads); 70,000 is more than a cluster holds in registers
        -- (16 blocks of 4,096), so that its phases read the logits again
        for _, shape in ipairs({ { 2, 32000 }, { 1, 70000 } }) do
            for _, spread in ipairs({ SPREADS[1], SPREADS[2], SPREADS[3], { 4, 80 }, { 4, 32 } }) do
                for _, setting in ipairs({ { 1.0, 0.9 }, { 1.0, 0.0 }, { 0.0, 0.9 } }) do
                    local rows, n = shape[1], shape[2]
                    local states = {}
                    for r = 1, rows do states[r] = random_state() end
                    list[#list + 1] = { rows = rows, n = n, x = logits(rows, n, spread[1], spread[2]),
                                        states = states, t = setting[1], topp = f32(setting[2]) }
                end
            end
        end
        for _, c in ipairs(list) do
            local key = c.rows .. "x" .. c.n
            models[key] = models[key] or { sampler({ c.rows, c.n }, "cpu"), sampler({ c.rows, c.n }, "cuda") }
            local cpu = run(models[key][1], c.x, c.states, c.t, c.topp)
            local gpu = run(models[key][2], c.x, c.states, c.t, c.topp)
            for r = 1, c.rows do
                assert.are.equal(cpu[r][2], gpu[r][2], describe_case(c, r))
                draws = draws + 1
                if cpu[r][1] ~= gpu[r][1] then
                    -- Allowed only where CUDA's token spans, in the CPU's order, running
                    -- sums within float32's error of the draw: a running sum of k terms
                    -- is off by at most k rounding errors of 2^-24 (more than a term
                    -- where many are equal), and the draw by the cut's
                    local _, _, walk, coin, cut = reference(c.x[r], c.states[r], c.t, c.topp)
                    local near, rank = false, nil
                    for k, w in ipairs(walk) do
                        local from = k > 1 and walk[k - 1].cdf or 0.0
                        local tol = (k + cut) * 2 ^ -24 + 1e-6
                        if w.index == gpu[r][1] then
                            rank = k
                            near = from - tol <= coin and coin < w.cdf + tol
                        end
                    end
                    assert.is_true(near, string.format("CUDA drew %d (rank %s), the CPU %d, away from "
                        .. "its boundaries: %s, draw %.9g", gpu[r][1], tostring(rank), cpu[r][1],
                        describe_case(c, r), coin))
                    ambiguous = ambiguous + 1
                    if shown < 3 then
                        print(string.format("# CUDA and CPU differ at a boundary: %s", describe_case(c, r)))
                        shown = shown + 1
                    end
                end
            end
        end
        -- A bound on how many (each was checked above to lie at a boundary):
        -- measured on the H100, 5 to 13 of 228 in seven runs; draws // 20 (11)
        -- failed one of them.
        print(string.format("# %d of %d draws differ from the CPU's, each at a boundary", ambiguous, draws))
        assert.is_true(ambiguous <= math.max(4, draws // 10),
                       string.format("%d of %d draws differ", ambiguous, draws))
    end)
end)
