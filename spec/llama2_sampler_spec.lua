-- run.c's sampler in Lua: the xorshift64* generator, argmax, softmax,
-- multinomial and top-p, in float32. Expected values are worked out by hand
-- from run.c's algorithm or recorded from run.c's own sample() (compiled from
-- llama2.c with -DTESTING). Plain Lua: no moonkaas core needed.

local H = require("spec.llama2_helpers")
local S = require("moonkaas.llama2.sampler")
local F = require("moonkaas.llama2.float32")

describe("xorshift64* generator", function()
    it("gives run.c's random_u32 sequences", function()
        local cases = {
            [42] = { 1456360119, 3359763283, 3393612768, 4054632243, 3283045847 },
            [7] = { 3522932607, 3986975863, 383753578, 462256277, 1608619149 },
            [1234] = { 3159758022, 1306163061, 1764681998, 1393191135, 4206814034 },
            [-1] = { 4180462053, 2415166680, 879531507, 3310800028, 1814914367 }, -- 2^64 - 1
        }
        for seed, want in pairs(cases) do
            local state, got = seed, {}
            for k = 1, #want do state, got[k] = S.random_u32(state) end
            assert.are.same(want, got, "seed " .. seed)
        end
    end)

    it("does the first step of seed 1 by hand", function()
        -- state 1: ^= >>12 → 1; ^= <<25 → 0x2000001; ^= >>27 → 0x2000001.
        -- 0x2000001 * 0x2545F4914F6CDD1D mod 2^64, then >> 32.
        -- 64-bit integer arithmetic (a string: Lua 5.1 parses no >> or &)
        if not math.type then return pending("Lua 5.1 hosts: no 64-bit integers to check by hand") end
        local state, u = S.random_u32(1)
        assert.are.equal(0x2000001, state)
        -- the product wraps like unsigned long long
        assert.are.equal(load("return (0x2000001 * 0x2545F4914F6CDD1D >> 32) & 0xFFFFFFFF")(), u)
        assert.is_true(u >= 0 and u < 2 ^ 32)
    end)

    it("makes float coins (u32 >> 8) / 2^24 in [0, 1)", function()
        local state = 42
        for _, u in ipairs({ 1456360119, 3359763283, 3393612768 }) do
            local coin
            state, coin = S.random_f32(state)
            assert.are.equal(math.floor(u / 256) / 16777216, coin)
            assert.is_true(coin >= 0 and coin < 1)
        end
    end)
end)

describe("sampling rules", function()
    local f = F.f32

    it("takes the first index of the maximum at temperature 0", function()
        local smp = S.new(5, 0.0, 0.9, 1)
        assert.are.equal(2, smp:sample({ 0.1, 0.5, 0.7, 0.7, -1 }))
        assert.are.equal(0, smp:sample({ 3, 3, 3, 3, 3 }))
    end)

    it("multinomial: the first running cdf above the coin", function()
        local p = { f(0.1), f(0.2), f(0.7) }
        assert.are.equal(0, S.sample_mult(p, 3, 0.05))
        assert.are.equal(1, S.sample_mult(p, 3, 0.25))   -- cdf 0.1, 0.3
        assert.are.equal(2, S.sample_mult(p, 3, 0.31))
        assert.are.equal(2, S.sample_mult(p, 3, 0.9999))
        -- rounding shortfall: n - 1
        assert.are.equal(2, S.sample_mult({ 0.1, 0.1, 0.1 }, 3, 0.9))
    end)

    it("top-p: cutoff, descending order, truncation past topp, scaled coin", function()
        -- probs 0.05 0.3 0.15 0.5, topp 0.7: cutoff (1 - 0.7) / 3 = 0.1 drops
        -- 0.05; sorted 0.5 (id 3), 0.3 (id 1), 0.15 (id 2); cumulative 0.5,
        -- 0.8 > 0.7 stops at id 1; r = coin * 0.8.
        local p = { f(0.05), f(0.3), f(0.15), f(0.5) }
        assert.are.equal(3, S.sample_topp(p, 4, f(0.7), f(0.5)))    -- r 0.4 < 0.5
        assert.are.equal(1, S.sample_topp(p, 4, f(0.7), f(0.7)))    -- r 0.56 in [0.5, 0.8)
        assert.are.equal(1, S.sample_topp(p, 4, f(0.7), f(0.99)))   -- never id 2 or 0
        -- equal probabilities keep index order (glibc's qsort is stable here):
        -- cumulative 0.25, 0.5, 0.75 > 0.6 stops at the third; r = 0.9 * 0.75.
        local q = { 0.25, 0.25, 0.25, 0.25 }
        assert.are.equal(2, S.sample_topp(q, 4, f(0.6), f(0.9)))
        assert.are.equal(0, S.sample_topp(q, 4, f(0.6), f(0.1)))
        -- every probability under run.c's cutoff (1 - topp) / (n - 1): all are candidates
        assert.are.equal(0, S.sample_topp({ f(0.5), f(0.5) }, 2, f(0.3), f(0.9)))
        assert.are.equal(1, S.sample_topp({ f(0.4), f(0.6) }, 2, f(0.2), f(0.5)))
        -- nothing passes topp: every candidate is kept
        assert.are.equal(3, S.sample_topp({ 0.2, 0.2, 0.2, 0.2 }, 4, f(0.95), f(0.999)))
    end)

    it("top-p agrees with a plain sort of run.c's algorithm on random distributions", function()
        H.seed("top-p against a plain sort")
        -- run.c's sample_topp written plainly: comparator sort, stable by index.
        local function plain(probs, n, topp, coin)
            local cutoff = f(f(1 - topp) / (n - 1))
            local c = {}
            for i = 1, n do if probs[i] >= cutoff then c[#c + 1] = i end end
            if #c == 0 then for i = 1, n do c[i] = i end end -- nothing passes the cutoff
            table.sort(c, function(a, b)
                if probs[a] ~= probs[b] then return probs[a] > probs[b] end
                return a < b
            end)
            local cum, last = 0.0, #c
            for j = 1, #c do
                cum = f(cum + probs[c[j]])
                if cum > topp then last = j; break end
            end
            local r, cdf = f(coin * cum), 0.0
            for j = 1, last do
                cdf = f(cdf + probs[c[j]])
                if r < cdf then return c[j] - 1 end
            end
            return c[last] - 1
        end
        for trial = 1, 60 do
            local n = math.random(2, 3000)
            local scale = ({ 0.5, 2, 6, 15 })[trial % 4 + 1]
            local x = {}
            for i = 1, n do
                x[i] = f((math.random() * 2 - 1) * scale)
                if trial % 5 == 0 and i > 1 and math.random() < 0.3 then x[i] = x[i - 1] end   -- ties
            end
            S.softmax(x, n)
            for _ = 1, 5 do
                local topp, coin = f(math.random() * 0.98 + 0.01), f(math.random())
                assert.are.equal(plain(x, n, topp, coin), S.sample_topp(x, n, topp, coin))
            end
        end
    end)

    it("softmax in float32 matches a double softmax to float precision", function()
        H.seed("sampler softmax")
        local n = 1000
        local x, ref, max = {}, {}, -math.huge
        for i = 1, n do
            x[i] = f((math.random() * 2 - 1) * 8)
            if x[i] > max then max = x[i] end
        end
        local sum = 0
        for i = 1, n do ref[i] = math.exp(x[i] - max); sum = sum + ref[i] end
        S.softmax(x, n)
        local total = 0
        for i = 1, n do
            assert.is_true(math.abs(x[i] - ref[i] / sum) <= 1e-9 + 1e-5 * ref[i] / sum)
            assert.are.equal(f(x[i]), x[i])
            total = total + x[i]
        end
        assert.is_true(math.abs(total - 1) < 1e-4)
    end)

    it("float32 running sums equal string.pack-rounded sums", function()
        H.seed("float32 accumulator")
        for _ = 1, 200 do
            local n, t = math.random(1, 200), {}
            for i = 1, n do t[i] = f(math.random() * 2 ^ math.random(-140, 4)) end
            local s = 0.0
            for i = 1, n do s = f(s + t[i]) end
            assert.are.equal(s, F.sum_nonneg(t, n))
        end
    end)
end)

describe("sampler against run.c's sample()", function()
    -- logits[i] = float32(5 sin(0.37 i) + 0.001 i), i = 0..999; twenty draws
    -- each from a fresh copy, recorded from run.c.
    local RUNC = {
        { 42, 1.0, 0.9, "988 872 328 987 838 665 803 412 633 699 564 988 56 751 853 106 582 616 176 582" },
        { 7, 0.7, 0.5, "615 446 938 921 888 871 514 870 905 565 650 649 683 480 904 785 412 598 820 649" },
        { 1234, 1.5, 1.0, "787 378 495 396 987 226 548 42 430 532 412 719 328 868 683 938 956 905 447 330" },
        { 99, 0.9, 0, "428 989 956 906 564 820 175 870 821 209 209 802 6 600 888 667 701 276 631 817" },
        { 3, 2.0, 0.99, "992 955 430 323 753 907 361 581 193 174 665 908 937 190 785 173 549 241 599 956" },
    }
    for _, case in ipairs(RUNC) do
        it(string.format("seed %d, temperature %g, top-p %g", case[1], case[2], case[3]), function()
            local logits = {}
            for i = 0, 999 do logits[i + 1] = F.f32(5 * math.sin(i * 0.37) + 0.001 * i) end
            local smp = S.new(1000, case[2], case[3], case[1])
            local got = {}
            for k = 1, 20 do got[k] = smp:sample({ (table.unpack or unpack)(logits, 1, 1000) }) end
            assert.are.equal(case[4], table.concat(got, " "))
        end)
    end
end)
