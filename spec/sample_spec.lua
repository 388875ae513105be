-- SampleNode: run.c's sampler as an op. On the CPU the tokens and states
-- equal a reference written here from run.c's definition (plain loops, every
-- step rounded to float32, a full sort with a comparator), on random logits
-- drawn with a printed seed: peaked and flat rows, ties, every path (argmax,
-- multinomial, top-p). On CUDA (#gpu) the states equal the CPU's, and a token
-- differs from the CPU's only rarely, and then it must be the token of exact
-- sums (in double) within CUDA's rounding: CUDA sums in fixed point, run.c in
-- float32 in order, whose error moves top-p's cut and the draw on long rows
-- (as_exact says how far).
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
the 0-based token, the next state, and for a draw every candidate in run.c's
order (rank -> {index, cdf, exact}: past the cut too) with its running sum
there in float32 as run.c sums (cdf) and in exact arithmetic (exact: double
sums of double probabilities, from the same float32 x / t), the coin (before
top-p scales it), and the rank where top-p cut (#walk without a cut).
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
    local order = {}
    if topp <= 0 or topp >= 1 then
        for i = 1, n do order[i] = i end
    else
        local cutoff = f32(f32(1.0 - topp) / (n - 1))
        for i = 1, n do if p[i] >= cutoff then order[#order + 1] = i end end
        if #order == 0 then for i = 1, n do order[i] = i end end
        table.sort(order, function(a, b) return p[a] > p[b] or (p[a] == p[b] and a < b) end)
    end
    local scaled, whole = {}, 0.0 -- exp(x / t - max) and their sum, in double
    for i = 1, n do
        scaled[i] = math.exp(f32(x[i] / t) - max)
        whole = whole + scaled[i]
    end
    local walk, cdf, exact = {}, 0.0, 0.0
    for k, i in ipairs(order) do
        cdf, exact = f32(cdf + p[i]), exact + scaled[i] / whole
        walk[k] = { index = i - 1, cdf = cdf, exact = exact }
    end
    local cut, draw = #walk, coin
    if topp > 0 and topp < 1 then -- the first running sum past topp, else all; the draw scaled
        for k, w in ipairs(walk) do
            if w.cdf > topp then cut = k; break end
        end
        draw = f32(coin * walk[cut].cdf)
    end
    for k = 1, cut do
        if draw < walk[k].cdf then return walk[k].index, s, walk, coin, cut end
    end
    return walk[cut].index, s, walk, coin, cut
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

-- Whether CUDA's token may differ from the CPU's. run.c sums in float32, in
-- order, and on long rows strays far from exact sums: on a row of 70,000
-- logits of three values its softmax's sum was off by 3.2e-4 of itself,
-- which moved top-p's cut by 151 candidates. CUDA's fixed-point sums of its
-- float32 p stay close to exact ones: a running sum of k terms within tol
-- (each term's rounding to 2^-31, and a relative 4e-6 for its p's float32
-- steps, the exponential's argument and the row's sum among them). So CUDA's
-- token must be the exact sampler's, within tol: for a cut where the exact
-- running sums may cross topp (or all, without top-p's cut), the coin scaled
-- by the sum there falls within tol of the token's exact span. Returns
-- whether it does, its rank in run.c's order, and run.c's draw.
local function as_exact(token, x, state, t, topp)
    local _, _, walk, coin, cut = reference(x, state, t, topp)
    local topped = topp > 0 and topp < 1
    local cpu_draw = topped and f32(coin * walk[cut].cdf) or coin
    local function tol(k, sum) return k * 2 ^ -32 + sum * 4e-6 + 2 ^ -30 end
    local rank
    for k, w in ipairs(walk) do if w.index == token then rank = k; break end end
    if not rank then return false, nil, cpu_draw end
    local from, to = rank > 1 and walk[rank - 1].exact or 0.0, walk[rank].exact
    local function spans(draw, e) return from - e <= draw and draw < to + e end
    if not topped then return spans(coin, tol(rank, to)), rank, cpu_draw end
    for c = rank, #walk do -- the cuts at or past the token's rank that may be top-p's
        local before = c > 1 and walk[c - 1].exact or 0.0
        if before > topp + tol(c - 1, before) then break end
        local through = walk[c].exact
        if (through > topp - tol(c, through) or c == #walk)
            and spans(coin * through, coin * tol(c, through) + tol(rank, to)) then
            return true, rank, cpu_draw
        end
    end
    return false, rank, cpu_draw
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
                    local near, rank, draw = as_exact(gpu[r][1], c.x[r], c.states[r], c.t, c.topp)
                    assert.is_true(near, string.format("CUDA drew %d (rank %s), the CPU %d, not the "
                        .. "exact sums' token within their rounding: %s, run.c's draw %.9g", gpu[r][1],
                        tostring(rank), cpu[r][1], describe_case(c, r), draw))
                    ambiguous = ambiguous + 1
                    if shown < 3 then
                        print(string.format("# CUDA and CPU differ, CUDA as the exact sums: %s",
                                            describe_case(c, r)))
                        shown = shown + 1
                    end
                end
            end
        end
        -- A bound on how many (each was checked above against the exact sums):
        -- measured on the H100, 5 to 13 of 228 in seven runs; on the H200, 5 to
        -- 16 of 237 in 90; draws // 20 (11) failed one of them.
        print(string.format("# %d of %d draws differ from the CPU's, each as the exact sums", ambiguous, draws))
        assert.is_true(ambiguous <= math.max(4, draws // 10),
                       string.format("%d of %d draws differ", ambiguous, draws))
    end)
end)
