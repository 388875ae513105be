-- The llama2 tokenizer against run.c: encodings of tokenizer.bin and
-- tok512.bin (expected ids produced by run.c's own encode()), decode round
-- trips, and what safe_printf prints. Plain Lua: no moonkaas core needed.

local H = require("spec.llama2_helpers")
local T = require("moonkaas.llama2.tokenizer")

-- run.c's encode(text, bos=1, eos=0) and safe_printf(decode()) output,
-- recorded from llama2.c's run.c compiled with -DTESTING.
local RUNC = {
    ["tokenizer.bin"] = {
        vocab = 32000,
        cases = {
            { "Once upon a time", "1 9038 2501 263 931", "Once upon a time" },
            { "I believe the meaning of life is", "1 306 4658 278 6593 310 2834 338" },
            { "Dobrý den, 你好 😀", "1 21451 29878 30052 972 29892 29871 30919 31076 29871 243 162 155 131",
              "Dobrý den, 你好 " },
            { "", "1", "" },
            { "a", "1 263", "a" },
            { "  two  spaces", "1 259 1023 29871 8162", "  two  spaces" },
            { "tab\there\nnewline", "1 4434 12 4150 13 1482 1220", "tab\there\nnewline" },
            { "Ünïcödé ñ € ¥ 日本語 🎉🦙",
              "1 7189 29876 30085 29883 9289 29948 29871 30046 25540 29871 30563 29871 30325 30346 30968 " ..
              "29871 243 162 145 140 243 162 169 156", "Ünïcödé ñ € ¥ 日本語 " },
        },
    },
    ["tok512.bin"] = {
        vocab = 512,
        cases = {
            { "Once upon a time", "1 403 407 261 378", "Once upon a time" },
            { "Dobrý den, 你好 😀",
              "1 410 455 414 430 420 198 192 279 302 432 410 231 192 163 232 168 192 410 243 162 155 131",
              "Dobr den,  " },
            { "", "1", "" },
            { "a", "1 261", "a" },
            { "  two  spaces", "1 410 410 259 424 414 410 262 427 412 331 419", "  two  spaces" },
            { "tab\there\nnewline", "1 259 412 430 12 260 276 13 416 411 424 421 271 411", "tab\there\nnewline" },
            { "Ünïcödé ñ € ¥ 日本語 🎉🦙",
              "1 410 198 159 416 198 178 429 198 185 418 485 410 493 410 503 410 197 168 410 233 154 168 233 " ..
              "159 175 235 173 161 410 243 162 145 140 243 162 169 156", "ncdé ñ €   " },
        },
    },
}

local function ids(s)
    local t = {}
    for n in s:gmatch("%d+") do t[#t + 1] = tonumber(n) end
    return t
end

for file, spec in pairs(RUNC) do
    describe("tokenizer " .. file, function()
        local tok
        before_each(function()
            if not H.models_present() then return end
            tok = tok or assert(T.load(H.models .. "/" .. file, spec.vocab))
        end)

        for _, case in ipairs(spec.cases) do
            it(string.format("encodes %q as run.c does", case[1]), function()
                if not tok then pending("../shared/models is absent") return end
                assert.are.same(ids(case[2]), tok:encode(case[1], true, false))
            end)
            it(string.format("decodes %q back (raw bytes), and prints what run.c prints", case[1]), function()
                if not tok then pending("../shared/models is absent") return end
                local tokens = tok:encode(case[1], true, false)
                -- The raw pieces concatenate to the text (the dummy-prefix
                -- space dropped after BOS).
                local raw = {}
                for k = 2, #tokens do raw[#raw + 1] = tok:decode(tokens[k - 1], tokens[k]) end
                assert.are.equal(case[1], table.concat(raw))
                if case[3] then assert.are.equal(case[3], tok:decode_all(tokens)) end
            end)
        end

        it("adds EOS when asked and leaves BOS out when asked", function()
            if not tok then pending("../shared/models is absent") return end
            local with = tok:encode("Once upon a time", true, true)
            local without = tok:encode("Once upon a time", false, false)
            assert.are.equal(T.EOS, with[#with])
            assert.are.equal(#with - 2, #without)
            assert.are.same({ (table.unpack or unpack)(with, 2, #with - 1) }, without)
        end)

        it("round-trips random printable ASCII and random UTF-8 text", function()
            if not tok then pending("../shared/models is absent") return end
            H.seed("tokenizer round trip " .. file)
            local alphabet = { "a", "e", "t", " ", "Th", "ing", ".", ",", "\n", "é", "ß", "ж", "中", "ü", "😀", "?" }
            for _ = 1, 30 do
                local parts = {}
                for k = 1, math.random(1, 25) do parts[k] = alphabet[math.random(#alphabet)] end
                local text = table.concat(parts)
                local tokens = tok:encode(text, true, false)
                local raw = {}
                for k = 2, #tokens do raw[#raw + 1] = tok:decode(tokens[k - 1], tokens[k]) end
                assert.are.equal(text, table.concat(raw))
                for _, id in ipairs(tokens) do assert.is_true(id >= 0 and id < spec.vocab) end
            end
        end)
    end)
end

describe("tokenizer on a hand-made vocabulary", function()
    local tok
    before_each(function()
        tok = assert(T.parse(H.tokenizer_bytes(H.small_vocab(), 4), 264, "small"))
    end)

    it("merges the highest-scoring pair first", function()
        -- ids: " " 259, "a" 260, "b" 261, "ab" 262 (-1.5), " a" 263 (-0.5):
        -- " ab" starts as " ", "a", "b"; " a" (-0.5) beats "ab" (-1.5).
        assert.are.same({ 1, 263, 261 }, tok:encode("ab", true, false))
        -- "aab": " ", "a", "a", "b" → " a", "a", "b" → " a", "ab".
        assert.are.same({ 263, 262 }, tok:encode("aab", false, false))
    end)

    it("falls back to byte tokens for code points not in the vocabulary", function()
        -- "é" is C3 A9: bytes + 3.
        assert.are.same({ 259, 0xC3 + 3, 0xA9 + 3 }, tok:encode("é", false, false))
        assert.are.equal("\195", tok:decode(259, 0xC3 + 3))
        assert.are.equal("\169", tok:decode(0xC3 + 3, 0xA9 + 3))
    end)

    it("turns <0xNN> pieces into raw bytes and prints only safe single bytes", function()
        assert.are.equal("\n", tok:decode(260, 0x0A + 3))
        assert.are.equal("\007", tok:decode(260, 0x07 + 3))
        assert.are.equal("", T.printable(tok:decode(260, 0x07 + 3)))
        assert.are.equal("\t", T.printable(tok:decode(260, 0x09 + 3)))
        assert.are.equal("", T.printable(tok:decode(260, 0xE4 + 3)))
        assert.are.equal("A", T.printable(tok:decode(260, 0x41 + 3)))
        assert.are.equal("", T.printable(""))
    end)

    it("drops the leading space of a piece only after BOS", function()
        assert.are.equal("a", tok:decode(1, 263))
        assert.are.equal(" a", tok:decode(260, 263))
    end)

    it("stops a text at its first NUL byte, as a C string", function()
        assert.are.same(tok:encode("ab", true, false), tok:encode("ab\0junk", true, false))
    end)

    it("raises on token ids outside the vocabulary", function()
        assert.has_error(function() tok:decode(1, 264) end)
        assert.has_error(function() tok:decode(1, -1) end)
    end)
end)
