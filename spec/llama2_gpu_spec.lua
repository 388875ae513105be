-- llama2 on CUDA #gpu: run.c's golden text for stories260K, the logits of
-- random checkpoints against the double-precision reference, and (with
-- cuDNN fusion, where TF32 may flip near-ties) how many of the 200 greedy
-- tokens agree with the golden run. Skipped without a GPU.

local H = require("spec.llama2_helpers")
local llama2 = require("moonkaas.llama2")

local mk, why = H.mk()

local function need_gpu() return H.need_gpu(pending, mk, why) end
local function need_models() return H.need_models(pending) end

local function greedy_ids(device, cudnn)
    local c = assert(llama2.read_config(H.models .. "/stories260K.bin"))
    local tok = assert(llama2.load_tokenizer(H.models .. "/tok512.bin", c.vocab_size))
    local net = llama2.build(mk, c, { device = device, cudnn = cudnn, greedy = true })
    local out = {}
    local ids = llama2.generate(net, tok, llama2.sampler(c.vocab_size, 0.0, 0.9, 1), nil, 200,
        { write = function(s) out[#out + 1] = s end, report = function() end })
    return ids, table.concat(out)
end

describe("llama2 on CUDA #gpu", function()
    it("prints run.c's golden text for stories260K, greedy and sampled, with and without a prompt, by chunks and per token", function()
        if not need_gpu() or not need_models() then return end
        for _, case in ipairs({
            { "-t", "0", "-n", "200", file = H.models .. "/stories260K_t0_n200.expected.txt" },
            { "-t", "1", "-p", "0.9", "-s", "42", "-n", "200",
              file = "spec/fixtures/stories260K_t1_p0.9_s42_n200.expected.txt" },
            { "-t", "0", "-n", "120", "-i", H.PROMPT, file = "spec/fixtures/stories260K_prompt_t0_n120.expected.txt" },
            { "-t", "1", "-p", "0.9", "-s", "42", "-n", "120", "-i", H.PROMPT,
              file = "spec/fixtures/stories260K_prompt_t1_p0.9_s42_n120.expected.txt" } }) do
            for _, per_token in ipairs({ false, true }) do
                local out, err = {}, {}
                local argv = { H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin", "-d", "cuda",
                               table.unpack(case) }
                if per_token then argv[#argv + 1] = "--per-token" end
                local code = llama2.main(argv, { mk = mk, stdout = function(s) out[#out + 1] = s end,
                                                 stderr = function(s) err[#err + 1] = s end })
                assert.are.equal(0, code, table.concat(err))
                assert.are.equal(H.read_file(case.file) .. "\n", table.concat(out), table.concat(argv, " "))
            end
        end
    end)

    it("tells each story of a batch (--batch 5) as CUDA tells it alone, greedy and sampled", function()
        if not need_gpu() or not need_models() then return end
        local function main(argv)
            local out, err = {}, {}
            local code = llama2.main(argv, { mk = mk, stdout = function(s) out[#out + 1] = s end,
                                             stderr = function(s) err[#err + 1] = s end })
            assert.are.equal(0, code, table.concat(err))
            return table.concat(out)
        end
        local function argv(...) -- the common flags, then these
            local a = { H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin", "-d", "cuda", "-n", "200" }
            for _, x in ipairs({ ... }) do a[#a + 1] = x end
            return a
        end
        for _, t in ipairs({ "0", "1" }) do
            local alone = {}
            for s = 42, 46 do
                alone[#alone + 1] = main(argv("-t", t, "-p", "0.9", "-s", tostring(s), "--per-token"))
            end
            local batched = main(argv("-t", t, "-p", "0.9", "-s", "42", "--batch", "5"))
            assert.are.equal(table.concat(alone), batched, "-t " .. t)
            local golden = t == "0" and H.models .. "/stories260K_t0_n200.expected.txt"
                or "spec/fixtures/stories260K_t1_p0.9_s42_n200.expected.txt"
            assert.are.equal(H.read_file(golden) .. "\n", alone[1])
        end
    end)

    it("chats as run.c does when sampling, each turn's prompt in one evaluation or a token at a time", function()
        if not need_gpu() or not need_models() then return end
        H.check_chat(mk, llama2, "cuda")
    end)

    it("runs a version 2 (int8) export: the text run.c tells for its dequantized weights", function()
        if not need_gpu() or not need_models() then return end
        local v2 = os.tmpname()
        local c = assert(llama2.checkpoint.read_config(H.models .. "/stories260K.bin"))
        assert(llama2.checkpoint.export(mk, c, v2, 2))
        for _, case in ipairs({ { "-t", "0", "-n", "200", file = "stories260K_q8_t0_n200" },
                                { "-t", "1", "-p", "0.9", "-s", "42", "-n", "200", file = "stories260K_q8_t1_p0.9_s42_n200" } }) do
            local out, err = {}, {}
            local argv = { v2, "-z", H.models .. "/tok512.bin", "-d", "cuda", table.unpack(case) }
            local code = llama2.main(argv, { mk = mk, stdout = function(s) out[#out + 1] = s end,
                                             stderr = function(s) err[#err + 1] = s end })
            assert.are.equal(0, code, table.concat(err))
            assert.are.equal(H.read_file("spec/fixtures/" .. case.file .. ".expected.txt") .. "\n", table.concat(out))
        end
        os.remove(v2)
    end)

    it("runs -q q8a8 (int8 activations) and tells runq.c's text for the W8A8 fixture's model", function()
        if not need_gpu() or not need_models() then return end
        local legacy, v2 = os.tmpname(), os.tmpname()
        H.write_w8a8_model(legacy)
        assert(llama2.checkpoint.export(mk, assert(llama2.checkpoint.read_config(legacy)), v2, 2))
        for _, case in ipairs({ { "-t", "0", "-n", "200", file = "w8a8_t0_n200" },
                                { "-t", "1", "-p", "0.9", "-s", "42", "-n", "200", file = "w8a8_t1_p0.9_s42_n200" } }) do
            local out, err = {}, {}
            local argv = { v2, "-z", H.models .. "/tok512.bin", "-d", "cuda", "-q", "q8a8", table.unpack(case) }
            local code = llama2.main(argv, { mk = mk, stdout = function(s) out[#out + 1] = s end,
                                             stderr = function(s) err[#err + 1] = s end })
            assert.are.equal(0, code, table.concat(err))
            assert.are.equal(H.read_file("spec/fixtures/" .. case.file .. ".expected.txt") .. "\n", table.concat(out))
        end
        os.remove(legacy)
        os.remove(v2)
    end)

    it("gives the reference's logits on random checkpoints (GQA, unshared)", function()
        if not need_gpu() then return end
        H.seed("llama2 cuda reference")
        local cfg = { dim = 24, hidden_dim = 36, n_layers = 3, n_heads = 6, n_kv_heads = 2,
                      vocab_size = 29, seq_len = 10, shared = false }
        local path = os.tmpname()
        local W = H.write_checkpoint(path, cfg)
        local c = assert(llama2.read_config(path))
        local net = llama2.build(mk, c, { device = "cuda", greedy = false })
        for round = 1, 2 do
            local ref = H.reference(cfg, W)
            for pos = 0, cfg.seq_len - 1 do
                local token = math.random(0, cfg.vocab_size - 1)
                local worst, at = H.worst(net:forward(token, pos), ref:step(token, pos), 2e-4, 2e-4)
                assert(worst <= 1, string.format("round %d pos %d: logit %s off by %.3g tolerances",
                                                 round, pos, tostring(at), worst))
            end
            net:reset()
        end
        for _, pieces in ipairs({ false, 2 }) do -- prompts in one evaluation (prefill)
            H.check_prompts(mk, llama2, cfg, path, W, "cuda", pieces or nil)
        end
        os.remove(path)
    end)

    it("reports how many greedy tokens agree with cuDNN fusion (TF32)", function()
        if not need_gpu() or not need_models() then return end
        local golden = greedy_ids("cpu", false)
        local ok, ids = pcall(greedy_ids, "cuda", true)
        if not ok then
            pending("cuDNN fusion unavailable: " .. tostring(ids))
            return
        end
        local same, first = 0, nil
        for i = 1, math.max(#golden, #ids) do
            if golden[i] == ids[i] then same = same + 1 elseif not first then first = i - 1 end
        end
        print(string.format("llama2 --cudnn: %d of %d greedy tokens agree with the golden run%s",
            same - 1, #golden - 1, first and (", the first difference at position " .. first) or ""))
        assert.is_true(#ids > 1)
    end)
end)
