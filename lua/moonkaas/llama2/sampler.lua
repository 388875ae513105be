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
    local i = F.first_sum_above(probs, n, coin)
    return i and i - 1 or n - 1
end

-- Top-p: candidates with prob >= (1 - topp) / (n - 1), sorted by descending
-- probability (ties by index: glibc's qsort is a merge sort here, stable),
-- cut where the cumulative probability first exceeds topp, then one draw.
-- Returns a 0-based index.
--
-- The sort runs on integer keys with Lua's built-in comparison (no Lua call
-- per compare): for non-negative float32 values the bit pattern orders like
-- the value, so key = (0x7FFFFFFF - bits) << 32 | index sorts ascending into
-- descending probability, then ascending index. Only the candidates whose
-- binary exponent reaches a bound E are sorted, E chosen so their exact sum
-- passes topp with room to spare: they are a prefix of the full order, so
-- the cut found in them is run.c's; if float32 rounding keeps their running
-- sum under topp after all, every candidate is sorted.
local CHUNK = 4096
local function float_bits(vals, n)
    local bits, k = {}, 1
    while k <= n do
        local m = math.min(CHUNK, n - k + 1)
        table.move({ string.unpack("<" .. string.rep("I4", m),
                                   string.pack("<" .. string.rep("f", m), table.unpack(vals, k, k + m - 1))) },
                   1, m, k, bits)
        k = k + m
    end
    return bits
end

local function sorted_prefix(idx, bits, n0, min_exponent)
    local keys, m = {}, 0
    for j = 1, n0 do
        local b = bits[j]
        if (b >> 23) >= min_exponent then
            m = m + 1
            keys[m] = ((0x7FFFFFFF - b) << 32) | idx[j]
        end
    end
    table.sort(keys)
    local order = {}
    for j = 1, m do order[j] = keys[j] & 0xFFFFFFFF end
    return order, m
end

function M.sample_topp(probs, n, topp, coin)
    local cutoff = f32(f32(1.0 - topp) / (n - 1))
    local idx, vals, n0 = {}, {}, 0
    for i = 1, n do
        local p = probs[i]
        if p >= cutoff then n0 = n0 + 1; idx[n0] = i; vals[n0] = p end
    end
    if n0 == 0 then
        -- Only where n is tiny and topp < 1/2 can every probability fall under the
        -- cutoff (run.c then reads before its candidate array): take them all.
        for i = 1, n do idx[i] = i; vals[i] = probs[i] end
        n0 = n
    end
    local bits = float_bits(vals, n0)
    -- exact sums per binary exponent, then the highest exponent bound whose
    -- candidates pass topp by a margin
    local by_exponent = {}
    for j = 1, n0 do
        local e = bits[j] >> 23
        by_exponent[e] = (by_exponent[e] or 0.0) + vals[j]
    end
    local bound, total = 0, 0.0
    for e = 255, 0, -1 do
        local s = by_exponent[e]
        if s then
            total = total + s
            if total > topp + 1e-3 then bound = e; break end
        end
    end
    local order, m = sorted_prefix(idx, bits, n0, bound)
    local cumulative, last = 0.0, nil
    for j = 1, m do
        cumulative = f32(cumulative + probs[order[j]])
        if cumulative > topp then last = j; break end
    end
    if not last and m < n0 then
        order, m = sorted_prefix(idx, bits, n0, 0)
        cumulative = 0.0
        for j = 1, m do
            cumulative = f32(cumulative + probs[order[j]])
            if cumulative > topp then last = j; break end
        end
    end
    last = last or m
    local r = f32(coin * cumulative)
    local cdf = 0.0
    for j = 1, last do
        cdf = f32(cdf + probs[order[j]])
        if r < cdf then return order[j] - 1 end
    end
    return order[last] - 1
end

local Sampler = {}
Sampler.__index = Sampler
M.Sampler = Sampler

-- seed: a 64-bit integer (run.c's unsigned long long; negative Lua integers
-- stand for the same bits). temperature and topp are rounded to float32 as
-- run.c stores them.
function M.new(vocab_size, temperature, topp, seed)
    if math.type(vocab_size) ~= "integer" or vocab_size < 1 then
        error("sampler: vocab_size must be a positive integer, got " .. tostring(vocab_size), 2)
    end
    if math.type(seed) ~= "integer" then
        error("sampler: seed must be an integer, got " .. tostring(seed), 2)
    end
    if type(temperature) ~= "number" or type(topp) ~= "number" then
        error("sampler: temperature and topp must be numbers", 2)
    end
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
