-- moonkaas.llama2.sampler — run.c's sampler, in float32.
--
--   xorshift64* generator: state ^= state >> 12; ^= << 25; ^= >> 27;
--                          u32 = (state * 0x2545F4914F6CDD1D) >> 32
--   coin:                  (u32 >> 8) / 2^24, a float32 in [0, 1)
--   temperature 0:         argmax (the first index of the maximum)
--   otherwise:             logits / temperature, softmax, one coin, then
--                          top-p when 0 < topp < 1, else multinomial.
--
-- Lua integers are 64-bit two's complement with logical >>, so the generator
-- is exact. Every float operation is rounded to float32 (see float32.lua), so
-- the same seed and the same logits pick the same token as run.c.
--
-- Pure Lua; no moonkaas core needed.

local F = require("moonkaas.llama2.float32")
local f32, round_array = F.f32, F.round_array
local exp = math.exp

local M = {}

-- One xorshift64* step: returns the new state and the 32-bit output.
function M.random_u32(state)
    state = state ~ (state >> 12)
    state = state ~ (state << 25)
    state = state ~ (state >> 27)
    return state, (state * 0x2545F4914F6CDD1D) >> 32
end

-- One step of the generator: returns the new state and a float32 in [0, 1).
function M.random_f32(state)
    local u
    state, u = M.random_u32(state)
    return state, (u >> 8) / 16777216.0
end

-- The first index of the largest value in p[first..last].
function M.argmax(p, first, last)
    local best_i, best = first, p[first]
    for i = first + 1, last do
        local v = p[i]
        if v > best then best_i, best = i, v end
    end
    return best_i
end

-- run.c's softmax in place over x[1..n] (float32 values): max, expf(x - max),
-- a sequential float32 sum, then x / sum.
function M.softmax(x, n)
    local max_val = x[1]
    for i = 2, n do
        if x[i] > max_val then max_val = x[i] end
    end
    for i = 1, n do x[i] = x[i] - max_val end
    round_array(x, n)
    for i = 1, n do x[i] = exp(x[i]) end
    round_array(x, n)
    local sum = F.sum_nonneg(x, n)
    for i = 1, n do x[i] = x[i] / sum end
    round_array(x, n)
    return x
end

-- Multinomial: the first i whose running float32 cdf exceeds coin (0-based
-- index returned), n - 1 on rounding shortfall.
function M.sample_mult(probs, n, coin)
    local acc = F.accumulator()
    for i = 1, n do
        if coin < acc:add(probs[i]) then return i - 1 end
    end
    return n - 1
end

-- Top-p: candidates with prob >= (1 - topp) / (n - 1), sorted by descending
-- probability (ties by index: glibc's qsort is a merge sort here, stable),
-- cut where the cumulative probability first exceeds topp, then one draw.
-- Returns a 0-based index.
function M.sample_topp(probs, n, topp, coin)
    local cutoff = f32(f32(1.0 - topp) / (n - 1))
    local idx, n0 = {}, 0
    for i = 1, n do
        if probs[i] >= cutoff then n0 = n0 + 1; idx[n0] = i end
    end
    table.sort(idx, function(a, b)
        local pa, pb = probs[a], probs[b]
        if pa ~= pb then return pa > pb end
        return a < b
    end)
    local cumulative, last = 0.0, n0
    for k = 1, n0 do
        cumulative = f32(cumulative + probs[idx[k]])
        if cumulative > topp then last = k; break end
    end
    local r = f32(coin * cumulative)
    local cdf = 0.0
    for k = 1, last do
        cdf = f32(cdf + probs[idx[k]])
        if r < cdf then return idx[k] - 1 end
    end
    return idx[last] - 1
end

local Sampler = {}
Sampler.__index = Sampler
M.Sampler = Sampler

-- seed: a 64-bit integer (run.c's unsigned long long; negative Lua integers
-- stand for the same bits). temperature and topp are rounded to float32 as
-- run.c stores them.
function M.new(vocab_size, temperature, topp, seed)
    assert(math.type(vocab_size) == "integer" and vocab_size > 0, "sampler: vocab_size must be a positive integer")
    assert(math.type(seed) == "integer", "sampler: seed must be an integer")
    return setmetatable({
        vocab_size = vocab_size,
        temperature = f32(temperature),
        topp = f32(topp),
        state = seed,
    }, Sampler)
end

function Sampler:greedy()
    return self.temperature == 0.0
end

function Sampler:coin()
    local c
    self.state, c = M.random_f32(self.state)
    return c
end

-- Picks the next token (0-based id) from float32 logits[1..vocab_size]; the
-- table is overwritten with probabilities, as run.c overwrites its buffer.
function Sampler:sample(logits)
    local n = self.vocab_size
    if self.temperature == 0.0 then
        return M.argmax(logits, 1, n) - 1
    end
    local t = self.temperature
    if t ~= 1.0 then
        for i = 1, n do logits[i] = logits[i] / t end
        round_array(logits, n)
    end
    M.softmax(logits, n)
    local coin = self:coin()
    if self.topp <= 0 or self.topp >= 1 then
        return M.sample_mult(logits, n, coin)
    end
    return M.sample_topp(logits, n, self.topp, coin)
end

return M
