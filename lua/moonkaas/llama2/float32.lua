-- moonkaas.llama2.float32 — IEEE float32 arithmetic emulated on Lua's doubles.
--
-- run.c computes its sampler, its RoPE table and its tokenizer scores in
-- float32. To pick the same tokens for the same seed, the Lua side does each
-- float32 operation as one double operation followed by a rounding to float32:
-- for + - * / that double rounding is innocuous (53 >= 2 * 24 + 2 bits), so the
-- result is the float32 result bit for bit. Transcendentals (exp, cos, sin,
-- pow) are rounded correctly here, where glibc's float versions may be off by
-- one unit in the last place on rare arguments.
--
-- Pure Lua (moonkaas.compat for 5.1 hosts); no moonkaas core needed.

local C = require("moonkaas.compat")
local pack, unpack = string.pack, string.unpack
local rep = string.rep
local table_unpack, move = C.unpack, C.move

local M = {}

-- Rounds a double to the nearest float32 (ties to even; overflow to ±inf).
local f32 = C.f32
M.f32 = f32

-- Vectors are rounded through string.pack in chunks: one C call per chunk is
-- four times faster than one per element. Without string.pack (Lua 5.1,
-- LuaJIT), element by element.
local CHUNK = 4096
local chunk_fmt = "<" .. rep("f", CHUNK)

-- Rounds t[1..n] to float32 in place; returns t.
function M.round_array(t, n)
    n = n or #t
    if not pack then
        for i = 1, n do t[i] = f32(t[i]) end
        return t
    end
    local i = 1
    while i <= n do
        local m = n - i + 1
        if m >= CHUNK then
            local s = pack(chunk_fmt, table_unpack(t, i, i + CHUNK - 1))
            move({ unpack(chunk_fmt, s) }, 1, CHUNK, i, t)
            i = i + CHUNK
        else
            local fmt = "<" .. rep("f", m)
            local s = pack(fmt, table_unpack(t, i, n))
            move({ unpack(fmt, s) }, 1, m, i, t)
            i = n + 1
        end
    end
    return t
end

-- Running float32 sums of non-negative float32 terms (probabilities), as
-- run.c's `sum += x[i]` loops compute them, without a string.pack per term:
-- a double in [p, 2p) is rounded to 24 significant bits by adding and
-- subtracting 1.5 * p * 2^29, whose last mantissa bit has weight ulp(p) in
-- float32; the double addition itself rounds to nearest, ties to even.
local TWO_M126 = 2.0 ^ -126       -- smallest normal float32: below it the ulp is fixed
local MAGIC = 1.5 * 2.0 ^ 29
local TWO_128 = 2.0 ^ 128          -- a float32 sum rounding to this is +inf

-- Sequential float32 sum of the non-negative float32 values t[1..n], one
-- rounding per term as above (this runs over the whole vocabulary).
function M.sum_nonneg(t, n)
    local s, p, magic = 0.0, TWO_M126, TWO_M126 * MAGIC
    for i = 1, n or #t do
        local d = s + t[i]
        if d >= TWO_128 then return math.huge end
        if d >= 2 * p then
            repeat p = p * 2 until d < 2 * p
            magic = p * MAGIC
        end
        s = (d + magic) - magic
    end
    if s >= TWO_128 then return math.huge end
    return s
end

-- The first 1-based i at which the running float32 sum of t[1..n] (non-
-- negative float32 values) exceeds x; nil when it never does.
function M.first_sum_above(t, n, x)
    local s, p, magic = 0.0, TWO_M126, TWO_M126 * MAGIC
    for i = 1, n do
        local d = s + t[i]
        if d >= TWO_128 then
            s = math.huge
        else
            if d >= 2 * p then
                repeat p = p * 2 until d < 2 * p
                magic = p * MAGIC
            end
            s = (d + magic) - magic
            if s >= TWO_128 then s = math.huge end
        end
        if x < s then return i end
    end
    return nil
end

return M
