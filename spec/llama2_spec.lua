-- llama2 through moonkaas on the CPU: run.c's golden text on stories260K, and
-- small random checkpoints against a double-precision reference forward pass.
-- Tokenizer, sampler and error specs: spec/llama2_*_spec.lua.

local H = require("spec.llama2_helpers")
local llama2 = require("moonkaas.llama2")

local mk, why = H.mk()

local function need_core() return H.need_core(pending, mk, why) end
local function need_models() return H.need_models(pending) end

describe("llama2 on stories260K (CPU)", function()
    it("prints run.c's golden text for -t 0 -n 200", function()
        if not need_core() or not need_models() then return end
        local expected = H.read_file(H.models .. "/stories260K_t0_n200.expected.txt")
        local out, err = {}, {}
        local code = llama2.main({ H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin",
                                   "-t", "0", "-n", "200", "-d", "cpu" },
            { mk = mk, stdout = function(s) out[#out + 1] = s end, stderr = function(s) err[#err + 1] = s end })
        assert.are.equal(0, code, table.concat(err))
        assert.are.equal(expected .. "\n", table.concat(out))
        assert.truthy(table.concat(err):match("achieved tok/s: [%d%.]+\n"))
    end)

    it("converts the weights at load with -q: fp32 and fp16 tell the golden text, q8 its version 2 export's, bf16 runs", function()
        if not need_core() or not need_models() then return end
        local expected = H.read_file(H.models .. "/stories260K_t0_n200.expected.txt")
        for _, q in ipairs({ "fp32", "fp16", "bf16", "q8" }) do
            local out, err = {}, {}
            local code = llama2.main({ H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin",
                                       "-t", "0", "-n", "200", "-d", "cpu", "-q", q },
                { mk = mk, stdout = function(s) out[#out + 1] = s end, stderr = function(s) err[#err + 1] = s end })
            assert.are.equal(0, code, table.concat(err))
            assert.truthy(table.concat(err):match("weights in " .. q), table.concat(err))
            local text = table.concat(out)
            if q == "fp32" or q == "fp16" then
                assert.are.equal(expected .. "\n", text)
            elseif q == "q8" then -- the weights of export --version 2, as run.c tells them dequantized
                assert.are.equal(H.read_file("spec/fixtures/stories260K_q8_t0_n200.expected.txt") .. "\n", text)
            else -- rounded weights: the same story start, then it may part (measured: char 429)
                assert.are.equal(expected:sub(1, 100), text:sub(1, 100))
            end
        end
        -- int8 groups of 64 are read as they are by the products (w2's straddle rows: dequantized alone)
        local c = assert(llama2.read_config(H.models .. "/stories260K.bin"))
        local net = llama2.build(mk, c, { device = "cpu", greedy = true, steps = 8, precision = "q8" })
        local report = net.model:fusion_report()
        assert.truthy(report:find("int8 in blocks of 64, dequantized as read", 1, true), report)
        -- read from the float32 file straight into int8 groups; on the CPU the
        -- token table stays int8 (its rows dequantized as looked up)
        assert.are.equal("int8", net.weights.token_embedding.q.dtype)
        assert.are.equal("int8", net.weights.layers[1].w2.q.dtype)
    end)

    it("gives the same text from the command line, with progress on stderr", function()
        if not need_core() or not need_models() then return end
        local expected = H.read_file(H.models .. "/stories260K_t0_n200.expected.txt")
        local code, out, err = H.run_cli({ H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin",
                                           "-t", "0", "-n", "200", "-d", "cpu" })
        assert.are.equal(0, code, err)
        assert.are.equal(expected .. "\n", out)
        assert.truthy(err:match("mapped .- in %d+ ms"), err)
        assert.truthy(err:match("compiled for cpu in %d+ ms"), err)
        assert.truthy(err:match("achieved tok/s: "), err)
    end)

    it("shows the compile's progress: a bar on a terminal, a line per finished phase elsewhere", function()
        local events = { { "compile", 0, 6 }, { "upload", 5e5, 1e6 }, { "upload", 1e6, 1e6 },
            { "kernels", 1, 2 }, { "kernels", 2, 2 }, { "compile", 6, 6 }, { "run", 1, 9 } }
        local lines = {}
        local plain = llama2.progress_display(function(s) lines[#lines + 1] = s end, false)
        for _, e in ipairs(events) do plain((table.unpack or unpack)(e)) end
        assert.are.same({ "uploading weights 1.0 / 1.0 MB\n", "generating kernels 2 / 2\n" }, lines)
        local drawn = {}
        local bar = llama2.progress_display(function(s) drawn[#drawn + 1] = s end, true)
        for _, e in ipairs(events) do bar((table.unpack or unpack)(e)) end
        local text = table.concat(drawn)
        assert.truthy(text:find("\r[############............] uploading weights 0.5 / 1.0 MB", 1, true), text)
        assert.truthy(text:find("generating kernels 2 / 2", 1, true))
        assert.truthy(drawn[#drawn]:find("^\r +\r$"), "the bar is cleared at the end")
        assert.is_nil(text:find("\n"), "no new lines on a terminal")
    end)

    it("chats like run.c: system and user prompts from the command line", function()
        if not need_core() or not need_models() then return end
        -- run.c -m chat -n 120 -y "You are kind" -i "Hello" -t 0, stdin empty.
        local want = "Assistant: . As she was about a small bird, she saw a big, scary bird. She was so " ..
                     "excited to see what was in the sky.\nSuddenly, she saw a big bird. It was a big\n"
        local out = {}
        local code = llama2.main({ H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin", "-m", "chat",
                                   "-n", "120", "-y", "You are kind", "-i", "Hello", "-t", "0", "-d", "cpu" },
            { mk = mk, stdout = function(s) out[#out + 1] = s end, stderr = function() end,
              read_line = function() return nil end })
        assert.are.equal(0, code)
        assert.are.equal(want, table.concat(out))
    end)

    it("chats like run.c when sampling, each turn's prompt in one evaluation or a token at a time", function()
        if not need_core() or not need_models() then return end
        H.check_chat(mk, llama2, "cpu")
    end)

    it("chats like run.c: prompts read from the user", function()
        if not need_core() or not need_models() then return end
        -- printf 'Tell me\n' | run.c -m chat -n 150 -t 0
        local want = "Enter system prompt (optional): User: Assistant: . As she was about a small bird, she " ..
                     "saw a big bird. \n\"Hello,\" said Annaby.\n\"Hello,\" said Annabyy.\n\"Hello,\" said " ..
                     "Annabyed in the bird. \"It's a small bird!\" \n\"What's your bir\n"
        local code, text, err = H.chat(mk, llama2, { H.models .. "/stories260K.bin", "-z",
            H.models .. "/tok512.bin", "-m", "chat", "-n", "150", "-t", "0", "-d", "cpu" }, { "Tell me" })
        assert.are.equal(0, code, err)
        assert.are.equal(want, text)
    end)

    it("samples run.c's text for a fixed seed (top-p and plain multinomial)", function()
        if not need_core() or not need_models() then return end
        -- run.c stories260K.bin -z tok512.bin with these flags, stdout.
        local cases = {
            { { "-t", "0.8", "-p", "0.9", "-s", "5", "-n", "80", "-i", "Lily had a" },
              "Lily had a big cat named Max. Max was a brave brother who liked to play with him. One day, " ..
              "Lily's mom asked him to help pick flowers. Lily didn't want to leave it away and she had to\n" },
            { { "-t", "1.0", "-p", "1.0", "-s", "1234", "-n", "60" },
              "Once upon a time, there was a little girl named Lily. She loved to go now a place of cats in a " ..
              "big pot. One day, she found a sign in her cozy sea. The w\n" },
        }
        for _, case in ipairs(cases) do
            local argv = { H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin", "-d", "cpu" }
            for _, a in ipairs(case[1]) do argv[#argv + 1] = a end
            local out = {}
            local code = llama2.main(argv, { mk = mk, stdout = function(s) out[#out + 1] = s end,
                                             stderr = function() end })
            assert.are.equal(0, code)
            assert.are.equal(case[2], table.concat(out))
        end
    end)

    it("tells run.c's text after a prompt, fed in one evaluation or a token at a time", function()
        if not need_core() or not need_models() then return end
        for _, case in ipairs({
            { "-t", "0", "-n", "120", file = "stories260K_prompt_t0_n120" },
            { "-t", "1", "-p", "0.9", "-s", "42", "-n", "120", file = "stories260K_prompt_t1_p0.9_s42_n120" } }) do
            for _, per_token in ipairs({ false, true }) do
                local argv = { H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin", "-d", "cpu",
                               "-i", H.PROMPT, (table.unpack or unpack)(case) }
                if per_token then argv[#argv + 1] = "--per-token" end
                local out, err = {}, {}
                local code = llama2.main(argv, { mk = mk, stdout = function(s) out[#out + 1] = s end,
                                                 stderr = function(s) err[#err + 1] = s end })
                assert.are.equal(0, code, table.concat(err))
                assert.are.equal(H.read_file("spec/fixtures/" .. case.file .. ".expected.txt") .. "\n",
                                 table.concat(out), table.concat(argv, " "))
                assert.are.equal(not per_token, table.concat(err):find("prompt graph of 64 tokens", 1, true) ~= nil)
            end
        end
    end)

    it("reproduces sampled runs with a fixed seed, and a reset starts afresh", function()
        if not need_core() or not need_models() then return end
        local c = assert(llama2.read_config(H.models .. "/stories260K.bin"))
        local tok = assert(llama2.load_tokenizer(H.models .. "/tok512.bin", c.vocab_size))
        local net = llama2.build(mk, c, { device = "cpu", greedy = false })
        local function story(seed)
            local out = {}
            local smp = llama2.sampler(c.vocab_size, 0.8, 0.9, seed)
            llama2.generate(net, tok, smp, "Lily had a", 80,
                { write = function(s) out[#out + 1] = s end, report = function() end })
            net:reset()
            return table.concat(out)
        end
        local a, b, a2 = story(7), story(8), story(7)
        assert.are.equal(a, a2)
        assert.are_not.equal(a, b)
        assert.truthy(a:match("^Lily had a"))
    end)
end)

-- Small random checkpoints: shared and unshared classifier, n_kv_heads equal
-- to and below n_heads (multi-query as the extreme).
local CONFIGS = {
    { name = "MHA, shared classifier", dim = 16, hidden_dim = 40, n_layers = 2, n_heads = 4, n_kv_heads = 4,
      vocab_size = 37, seq_len = 12, shared = true },
    { name = "GQA (group 3), unshared classifier", dim = 24, hidden_dim = 36, n_layers = 3, n_heads = 6,
      n_kv_heads = 2, vocab_size = 29, seq_len = 10, shared = false },
    { name = "MQA, shared classifier, head size 8", dim = 32, hidden_dim = 20, n_layers = 1, n_heads = 4,
      n_kv_heads = 1, vocab_size = 50, seq_len = 9, shared = true },
    { name = "GQA (group 2), unshared, 3 layers", dim = 16, hidden_dim = 48, n_layers = 3, n_heads = 4,
      n_kv_heads = 2, vocab_size = 300, seq_len = 16, shared = false },
}

describe("llama2 model against a double-precision reference", function()
    local ATOL, RTOL = 2e-4, 2e-4

    for _, cfg in ipairs(CONFIGS) do
        it("agrees on the logits at every position: " .. cfg.name, function()
            if not need_core() then return end
            H.seed("llama2 reference " .. cfg.name)
            local path = H.tmpname()
            local W = H.write_checkpoint(path, cfg)
            local c = assert(llama2.read_config(path))
            assert.are.equal(cfg.shared, c.shared_classifier)
            local net = llama2.build(mk, c, { device = "cpu", greedy = false })
            local greedy = llama2.build(mk, c, { device = "cpu", greedy = true })
            for round = 1, 2 do
                local ref = H.reference(cfg, W)
                for pos = 0, cfg.seq_len - 1 do
                    local token = math.random(0, cfg.vocab_size - 1)
                    local want = ref:step(token, pos)
                    local got = net:forward(token, pos)
                    assert.are.equal(cfg.vocab_size, #got)
                    local worst, at = H.worst(got, want, ATOL, RTOL)
                    assert(worst <= 1, string.format("round %d pos %d: logit %d is %.7g, the reference %.7g",
                                                     round, pos, at or -1, at and got[at] or 0, at and want[at] or 0))
                    -- The greedy model's argmax is the reference's, unless two
                    -- logits are too close to tell apart in float32.
                    local id = greedy:forward(token, pos)
                    local best, second = -math.huge, -math.huge
                    local best_i
                    for i, v in ipairs(want) do
                        if v > best then best, second, best_i = v, best, i elseif v > second then second = v end
                    end
                    if best - second > 1e-3 then
                        assert.are.equal(best_i - 1, id)
                    end
                end
                -- A new generation: the caches must start from zero again.
                net:reset()
                greedy:reset()
            end
            os.remove(path)
        end)
    end

    for _, cfg in ipairs(CONFIGS) do
        it("feeds prompts in one evaluation (prefill), whole and in pieces: " .. cfg.name, function()
            if not need_core() then return end
            H.seed("llama2 prompts " .. cfg.name)
            local path = H.tmpname()
            local W = H.write_checkpoint(path, cfg)
            for _, pieces in ipairs({ false, 2, 4 }) do
                H.check_prompts(mk, llama2, cfg, path, W, "cpu", pieces or nil)
            end
            os.remove(path)
        end)
    end

    it("generates run.c's token sequence: the reference's argmax fed back", function()
        if not need_core() then return end
        H.seed("llama2 greedy loop")
        local cfg = CONFIGS[2]
        local path = H.tmpname()
        local W = H.write_checkpoint(path, cfg)
        local c = assert(llama2.read_config(path))
        local net = llama2.build(mk, c, { device = "cpu", greedy = true })
        -- A tokenizer whose pieces are the token ids, so the text shows the ids.
        local entries = {}
        for i = 0, cfg.vocab_size - 1 do entries[i + 1] = { "<" .. i .. ">", 0 } end
        entries[2] = { "\n<s>\n", 0 }
        entries[4] = { " ", 0 }    -- id 3: the dummy prefix
        local tpath = H.tmpname()
        H.write_file(tpath, H.tokenizer_bytes(entries, 8))
        local tok = assert(llama2.load_tokenizer(tpath, cfg.vocab_size))
        local smp = llama2.sampler(cfg.vocab_size, 0.0, 0.9, 1)
        local ids = llama2.generate(net, tok, smp, "", cfg.seq_len,
            { write = function() end, report = function() end, stop_on_bos = false })
        -- The reference loop: BOS first, then each argmax fed back; compared
        -- up to the first step whose top two logits are too close to call.
        local ref = H.reference(cfg, W)
        local token = 1
        assert.are.equal(cfg.seq_len + 1, #ids)
        assert.are.equal(1, ids[1])
        for pos = 0, cfg.seq_len - 1 do
            local logits = ref:step(token, pos)
            local best_i, best, second = 1, logits[1], -math.huge
            for i = 2, #logits do
                if logits[i] > best then best_i, best, second = i, logits[i], best
                elseif logits[i] > second then second = logits[i] end
            end
            if best - second < 1e-3 then break end
            token = best_i - 1
            assert.are.equal(token, ids[pos + 2], "token at position " .. (pos + 1))
        end
        os.remove(path)
        os.remove(tpath)
    end)

    it("rejects tokens and positions outside the model", function()
        if not need_core() then return end
        H.seed("llama2 bounds")
        local cfg = CONFIGS[1]
        local path = H.tmpname()
        H.write_checkpoint(path, cfg)
        local c = assert(llama2.read_config(path))
        local net = llama2.build(mk, c, { device = "cpu", greedy = true })
        assert.has_error(function() net:forward(cfg.vocab_size, 0) end)
        assert.has_error(function() net:forward(-1, 0) end)
        assert.has_error(function() net:forward(0, cfg.seq_len) end)
        assert.has_error(function() net:forward(0, -1) end)
        local function fails(fn, want)
            local ok, err = pcall(fn)
            assert.is_false(ok)
            assert.truthy(tostring(err):find(want, 1, true), tostring(err))
        end
        fails(function() net:prompt({}, 0) end, "prompt: no tokens")
        fails(function() net:prompt({ 0, cfg.vocab_size }, 0) end,
            "prompt: token " .. cfg.vocab_size .. " out of range [0, " .. cfg.vocab_size .. ")")
        fails(function() net:prompt({ 0, 1, 2 }, cfg.seq_len - 2) end,
            "prompt: position " .. cfg.seq_len .. " out of range [0, " .. cfg.seq_len .. ")")
        assert.is_true(require("moonkaas.compat").isinteger(net:forward(0, 0))) -- still usable
        os.remove(path)
    end)

    it("sizes the KV caches by the steps asked for, not by the header's seq_len", function()
        if not need_core() then return end
        H.seed("llama2 steps")
        local cfg = CONFIGS[4]
        local path = H.tmpname()
        H.write_checkpoint(path, cfg)
        local c = assert(llama2.read_config(path))
        local full = llama2.build(mk, c, { device = "cpu", greedy = false })
        local steps = 5
        local short = llama2.build(mk, c, { device = "cpu", greedy = false, steps = steps })
        local kv_bytes = function(s) return 2 * c.n_layers * s * c.kv_dim * 4 end
        assert.are.equal(kv_bytes(cfg.seq_len), full.model:stats().buffer_bytes)
        assert.are.equal(kv_bytes(steps), short.model:stats().buffer_bytes)
        -- the same logits at every position it holds; none past them
        local token = 1
        for pos = 0, steps - 1 do
            local a, b = full:forward(token, pos), short:forward(token, pos)
            local worst = H.worst(b, a, 1e-6, 1e-5)
            assert.is_true(worst <= 1, string.format("position %d: %.3g of the tolerance", pos, worst))
            token = (token * 7 + pos) % cfg.vocab_size
        end
        assert.has_error(function() short:forward(0, steps) end, "forward: position 5 out of range [0, 5)")
        -- more steps than the header's context hold only seq_len positions
        local long = llama2.build(mk, c, { device = "cpu", steps = cfg.seq_len * 100 })
        assert.are.equal(kv_bytes(cfg.seq_len), long.model:stats().buffer_bytes)
        assert.has_error(function() llama2.build(mk, c, { steps = 0 }) end,
            "llama2: steps must be a positive integer (got 0)")
        os.remove(path)
    end)
end)
