-- moonkaas.llama2.sampler — run.c's sampler, in float32.
--
--   xorshift64* generator: state ^= state >> 12; ^= << 25; ^= >> 27;
--                          u32 = (state * 0x2545F4914F6CDD1D) >> 32
--   coin:                  (u32 >> 8) / 2^24, a float32 in [0, 1)
--   temperature 0:         argmax (the first index of the maximum)
--   otherwise:             logits / temperature, softmax, one coin, then
--                          top-p when 0 < topp < 1, else multinomial.
--
-- The generator works on the state's two 32-bit halves with arithmetic that
-- is exact in doubles (xor from moonkaas.compat), so it is run.c's on every
-- host: on Lua 5.3+ the state is one 64-bit integer (negative integers stand
-- for the same bits); on 5.1 and LuaJIT, where a number cannot hold 64 bits,
-- it is the pair {hi, lo} after the first step. Every float operation is rounded to float32 (see float32.lua), so
-- the same seed and the same logits pick the same token as run.c.
--
-- Pure Lua; no moonkaas core needed.

local C = require("moonkaas.compat")
local F = require("moonkaas.llama2.float32")
local f32, round_array = F.f32, F.round_array
local exp = math.exp

local M = {}

local floor, bxor, toint = math.floor, C.bxor, C.tointeger
local TWO32 = 0x100000000

-- The state's halves (hi, lo), each in [0, 2^32), and back.
local function split(state)
    if type(state) == "table" then return state[1], state[2] end
    local lo = state % TWO32
    return ((state - lo) / TWO32) % TWO32, lo
end
local function join(hi, lo)
    if C.lua51 then return { hi, lo } end
    return toint(hi) * TWO32 + toint(lo) -- wraps to the signed 64-bit value
end

-- bits 32..63 of (hi, lo) * 0x2545F4914F6CDD1D: by 16-bit limbs, each
-- partial sum below 2^35
local K0, K1, K2, K3 = 0xDD1D, 0x4F6C, 0xF491, 0x2545
local function mul_high(hi, lo)
    local s0, s1 = lo % 65536, floor(lo / 65536)
    local s2, s3 = hi % 65536, floor(hi / 65536)
    local r = s0 * K0
    r = floor(r / 65536) + s0 * K1 + s1 * K0
    r = floor(r / 65536) + s0 * K2 + s1 * K1 + s2 * K0
    local d2 = r % 65536
    r = floor(r / 65536) + s0 * K3 + s1 * K2 + s2 * K1 + s3 * K0
    return (r % 65536) * 65536 + d2
end

-- One xorshift64* step: returns the new state and the 32-bit output.
function M.random_u32(state)
    local hi, lo = split(state)
    -- state ^= state >> 12
    lo = bxor(lo, floor(lo / 4096) + (hi % 4096) * 1048576)
    hi = bxor(hi, floor(hi / 4096))
    -- state ^= state << 25
    hi = bxor(hi, (hi % 128) * 33554432 + floor(lo / 128))
    lo = bxor(lo, (lo % 128) * 33554432)
    -- state ^= state >> 27
    lo = bxor(lo, floor(lo / 134217728) + (hi % 134217728) * 32)
    hi = bxor(hi, floor(hi / 134217728))
    return join(hi, lo), toint(mul_high(hi, lo))
end

-- One step of the generator: returns the new state and a float32 in [0, 1).
function M.random_f32(state)
    local u
    state, u = M.random_u32(state)
    return state, floor(u / 256) / 16777216.0
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
    if not string.pack then
        for j = 1, n do bits[j] = C.f32_bits(vals[j]) end
        return bits
    end
    while k <= n do
        local m = math.min(CHUNK, n - k + 1)
        C.move({ string.unpack("<" .. string.rep("I4", m),
                                   string.pack("<" .. string.rep("f", m), C.unpack(vals, k, k + m - 1))) },
                   1, m, k, bits)
        k = k + m
    end
    return bits
end

-- key = (0x7FFFFFFF - bits) * 2^22 + index: below 2^53, exact in a double,
-- for indices below 2^22; a larger vocabulary sorts with a comparison function.
local INDEX_RANGE = 4194304
local function sorted_prefix(idx, bits, n0, min_exponent)
    local keys, m = {}, 0
    local large = n0 > 0 and idx[n0] >= INDEX_RANGE -- idx ascends
    for j = 1, n0 do
        local b = bits[j]
        if floor(b / 8388608) >= min_exponent then
            m = m + 1
            keys[m] = large and j or (0x7FFFFFFF - b) * INDEX_RANGE + idx[j]
        end
    end
    local order = {}
    if large then
        table.sort(keys, function(a, b)
            if bits[a] ~= bits[b] then return bits[a] > bits[b] end
            return idx[a] < idx[b]
        end)
        for j = 1, m do order[j] = idx[keys[j]] end
    else
        table.sort(keys)
        for j = 1, m do order[j] = keys[j] % INDEX_RANGE end
    end
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
        local e = floor(bits[j] / 8388608)
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
    if not C.isinteger(vocab_size) or vocab_size < 1 then
        error("sampler: vocab_size must be a positive integer, got " .. tostring(vocab_size), 2)
    end
    if not C.isinteger(seed) then
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
