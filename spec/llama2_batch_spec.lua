-- llama2 batched decoding (net:batch) on stories260K, CPU: every sequence of a
-- batch tells, token for token, what it tells alone (llama2.generate, one
-- evaluation a token, with the same seed) and run.c's golden texts, whatever
-- its neighbours, its slot, and the sequences added or removed around it.

local H = require("spec.llama2_helpers")
local llama2 = require("moonkaas.llama2")
local C = require("moonkaas.compat")

local mk, why = H.mk()

local function need() return H.need_core(pending, mk, why) and H.need_models(pending) end

local STEPS = 200
local c, tok, net -- built once
local function setup()
    if net then return end
    c = assert(llama2.read_config(H.models .. "/stories260K.bin"))
    tok = assert(llama2.load_tokenizer(H.models .. "/tok512.bin", c.vocab_size))
    net = llama2.build(mk, c, { device = "cpu", output = C.lua51 and "logits" or "sample", steps = STEPS })
end

-- A sequence's settings: the sampler's (temperature 0: greedy) and its prompt.
local function smp_of(s) return llama2.sampler(c.vocab_size, s.temperature, 0.9, s.seed) end

-- The ids the sequence tells alone (prompt's first included, up to BOS or the
-- positions), as llama2.generate gives them, a token an evaluation. Told once
-- per settings: the B = 1, 3 and 8 batches share their first sequences.
local told_alone = {}
local function alone(s)
    local key = string.format("%s %s %s", s.seed, s.temperature, s.prompt or "")
    if not told_alone[key] then
        net:reset()
        told_alone[key] = (llama2.generate(net, tok, smp_of(s), s.prompt or "", STEPS,
            { per_token = true, write = function() end, report = function() end }))
    end
    return told_alone[key]
end

-- The text of ids as generate writes it.
local function text_of(ids)
    local out = {}
    for i = 2, #ids do out[#out + 1] = llama2.tokenizer.printable(tok:decode(ids[i - 1], ids[i])) end
    return table.concat(out) .. "\n"
end

-- Runs a batch: seqs (a list of settings, each added at step s.at, default
-- 0, and removed after its s.stop-th step where given), until every sequence ends
-- (BOS, its positions, or its stop). Returns the ids each told (by index)
-- and the batch.
local function run(slots, seqs, b)
    b = b or net:batch({ slots = slots, tokenizer = tok })
    if type(b) == "number" then b = net:batch({ slots = slots, tokenizer = tok, rows = b }) end
    local told, of, step = {}, {}, 0
    local function add_due()
        for i, s in ipairs(seqs) do
            if (s.at or 0) == step and not told[i] then
                local ids = s.prompt and tok:encode(s.prompt, true, false) or { 1 }
                of[b:add(s.prompt or ids, smp_of(s))] = i
                told[i], s.from = { ids[1] }, step
            end
        end
    end
    local function pending()
        for i in ipairs(seqs) do if not told[i] then return true end end
        return false
    end
    add_due()
    while b:count() > 0 or pending() do
        step = step + 1
        for _, r in ipairs(b:count() > 0 and b:step() or {}) do
            local i = of[r.id]
            if r.token == 1 then
                if not r.done then b:remove(r.id) end
                of[r.id] = nil
            else
                told[i][#told[i] + 1] = r.token
                if seqs[i].stop and step - seqs[i].from == seqs[i].stop and not r.done then b:remove(r.id) of[r.id] = nil end
            end
        end
        add_due()
    end
    return told, b
end

local function check_alone(seqs, told)
    for i, s in ipairs(seqs) do
        local want = alone(s)
        if s.stop then -- cut short: the first tokens of its story
            want = { C.unpack(want, 1, math.min(#want, s.stop + 1)) }
        end
        assert.are.same(want, told[i], string.format("sequence %d (seed %d, temperature %s): %d ids, alone %d",
                                                      i, s.seed, tostring(s.temperature), #told[i], #want))
    end
end

describe("llama2 batch (CPU, stories260K)", function()
    it("tells run.c's golden texts with B = 1, 3 and 8, greedy and sampled", function()
        if not need() then return end
        setup()
        local greedy = H.read_file(H.models .. "/stories260K_t0_n200.expected.txt") .. "\n"
        local sampled = H.read_file("spec/fixtures/stories260K_t1_p0.9_s42_n200.expected.txt") .. "\n"
        for _, B in ipairs({ 1, 3, 8 }) do
            for _, temperature in ipairs({ 0, 1 }) do
                local seqs = {}
                for i = 1, B do seqs[i] = { seed = 42 + i - 1, temperature = temperature } end
                local told = run(B, seqs)
                assert.are.equal(temperature == 0 and greedy or sampled, text_of(told[1]), "B = " .. B)
                check_alone(seqs, told)
            end
        end
    end)

    it("gives each sequence its own text whatever its neighbours and slot, prompts included", function()
        if not need() then return end
        setup()
        local seed = H.seed("llama2 batch neighbours")
        local seqs = {}
        for i = 1, 6 do -- greedy and sampled side by side, random seeds, some with the golden prompt
            seqs[i] = { seed = math.random(1, 2 ^ 30), temperature = i % 3 == 0 and 0 or 1,
                        prompt = i % 2 == 0 and H.PROMPT or nil }
        end
        seqs[1] = { seed = 42, temperature = 1, prompt = H.PROMPT }
        local told = run(6, seqs)
        assert.are.equal(H.read_file("spec/fixtures/stories260K_prompt_t1_p0.9_s42_n120.expected.txt"),
                         text_of(told[1]):sub(1, #H.read_file(
                             "spec/fixtures/stories260K_prompt_t1_p0.9_s42_n120.expected.txt")), "seed " .. seed)
        check_alone(seqs, told)
        -- the same sequences in the reverse order: other slots, other neighbours
        local reversed = {}
        for i = 1, 6 do reversed[i] = seqs[7 - i] end
        local told2 = run(6, reversed)
        for i = 1, 6 do assert.are.same(told[7 - i], told2[i]) end
    end)

    it("takes the products in blocks of any rows up to 4 (the last one shorter), each row as alone", function()
        if not need() then return end
        setup()
        local seqs = {}
        for i = 1, 7 do seqs[i] = { seed = 100 + i, temperature = i % 2 } end
        for _, rows in ipairs({ 2, 3 }) do check_alone(seqs, run(7, seqs, rows)) end
    end)

    it("adds and removes sequences mid-run, reusing freed slots without recompiling", function()
        if not need() then return end
        setup()
        local seqs = {
            { seed = 7, temperature = 1 },
            { seed = 8, temperature = 1, stop = 10 },             -- leaves early: its slot frees
            { seed = 9, temperature = 0, at = 3 },
            { seed = 10, temperature = 1, at = 12 },              -- takes the freed slot
            { seed = 11, temperature = 1, at = 40, prompt = H.PROMPT },
            { seed = 12, temperature = 1, at = 5, stop = 30 },
        }
        local b = net:batch({ slots = 4, tokenizer = tok })
        local compiled = b.model
        local told = run(4, seqs, b)
        assert.are.equal(compiled, b.model)
        assert.are.equal(0, b:count())
        check_alone(seqs, told)
        -- the batch goes on: a second round in the same slots
        local again = run(4, { { seed = 42, temperature = 1 }, { seed = 7, temperature = 1, at = 2 } }, b)
        assert.are.same(told[1], again[2])
        assert.are.equal(H.read_file("spec/fixtures/stories260K_t1_p0.9_s42_n200.expected.txt") .. "\n",
                         text_of(again[1]))
    end)

    it("draws with the Lua sampler from the logits (output = logits, as on Lua 5.1): the same texts", function()
        if not need() then return end
        setup()
        local seqs = { { seed = 42, temperature = 1 }, { seed = 5, temperature = 0 },
                       { seed = 6, temperature = 0.7, prompt = H.PROMPT } }
        local b = net:batch({ slots = 3, tokenizer = tok, output = "logits" })
        check_alone(seqs, (run(3, seqs, b)))
        assert.has_error(function() net:batch({ slots = 1, output = "argmax" }) end,
                         "batch: output must be sample or logits (got argmax)")
    end)

    it("ends a sequence at the positions it holds (done) and frees its slot", function()
        if not need() then return end
        setup()
        local short = llama2.build(mk, c, { device = "cpu", steps = 5 })
        local b = short:batch({ slots = 2 })
        local id = b:add({ 1 }, llama2.sampler(c.vocab_size, 0, 0.9, 1))
        local last
        for pos = 1, 5 do
            local r = b:step()
            assert.are.equal(1, #r)
            assert.are.equal(id, r[1].id)
            assert.are.equal(pos, r[1].pos)
            last = r[1]
        end
        assert.is_true(last.done)
        assert.are.equal(0, b:count())
        assert.has_error(function() b:remove(id) end, "batch:remove: no sequence " .. id)
    end)

    it("refuses bad arguments with clear errors, and stays usable", function()
        if not need() then return end
        setup()
        for _, slots in ipairs({ 0, -1, 1.5, "2" }) do
            local ok, err = pcall(net.batch, net, { slots = slots })
            assert.is_false(ok)
            assert.truthy(tostring(err):find("batch: slots must be an integer >= 1", 1, true), tostring(err))
        end
        for _, rows in ipairs({ 0, 2.5, "4" }) do
            local ok, err = pcall(net.batch, net, { slots = 2, rows = rows })
            assert.is_false(ok)
            assert.truthy(tostring(err):find("batch: rows must be an integer >= 1", 1, true), tostring(err))
        end
        assert.has_error(function() net:batch() end)
        local b = net:batch({ slots = 2 })
        local smp = llama2.sampler(c.vocab_size, 1, 0.9, 3)
        assert.has_error(function() b:step() end, "batch:step: no sequences (add one first)")
        assert.has_error(function() b:remove(99) end, "batch:remove: no sequence 99")
        local long = {}
        for i = 1, STEPS + 1 do long[i] = 1 end
        assert.has_error(function() b:add(long, smp) end,
            string.format("batch:add: the prompt has %d tokens, more than the %d positions", STEPS + 1, STEPS))
        assert.has_error(function() b:add({}, smp) end, "batch:add: the prompt has no tokens")
        assert.has_error(function() b:add({ 1, c.vocab_size }, smp) end,
            string.format("batch:add: prompt token 2 (%d) out of range [0, %d)", c.vocab_size, c.vocab_size))
        assert.has_error(function() b:add("Once", smp) end,
            "batch:add: a text prompt needs the batch's tokenizer (opts.tokenizer)")
        assert.has_error(function() b:add({ 1 }) end, "batch:add: the sequence needs its sampler (llama2.sampler)")
        b:add({ 1 }, smp)
        b:add({ 1 }, llama2.sampler(c.vocab_size, 0, 0.9, 4))
        assert.has_error(function() b:add({ 1 }, smp) end, "batch:add: all 2 slots are taken")
        assert.are.equal(2, #b:step()) -- still usable
    end)

    it("tells N stories from the command line with --batch N, each as run.c alone", function()
        if not need() then return end
        setup()
        local out, err = {}, {}
        local code = llama2.main({ H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin", "-d", "cpu",
                                   "-t", "1", "-p", "0.9", "-s", "42", "-n", "200", "--batch", "3" },
            { mk = mk, stdout = function(s) out[#out + 1] = s end, stderr = function(s) err[#err + 1] = s end })
        assert.are.equal(0, code, table.concat(err))
        local want = {}
        for i = 1, 3 do want[i] = text_of(alone({ seed = 41 + i, temperature = 1 })) end
        assert.are.equal(H.read_file("spec/fixtures/stories260K_t1_p0.9_s42_n200.expected.txt") .. "\n", want[1])
        assert.are.equal(table.concat(want), table.concat(out))
        assert.truthy(table.concat(err):find("3 stories, achieved tok/s: [%d%.]+"), table.concat(err))
        for _, bad in ipairs({ { "--batch", "0" }, { "--batch" }, { "--batch", "x" }, { "--batch", "2", "-m", "chat" } }) do
            local argv = { H.models .. "/stories260K.bin", C.unpack(bad) }
            local o, msg, exit = llama2.parse_args(argv)
            assert.is_nil(o)
            assert.are.equal(1, exit)
            assert.truthy(msg:find("batch", 1, true), msg)
        end
    end)
end)

-- On CUDA: the batch's sequences against what each tells alone on the CPU.
-- In blocks of up to 16 rows (the device's groups) each row's sums are a
-- matrix-vector group's; as one product over a batch of more (rows = B, 18)
-- they are cuBLAS's, in another order, so a token may differ from the CPU's
-- only where two logits lie within that rounding: the count of such
-- sequences is printed, and the first tokens must agree.
describe("llama2 batch (CUDA, stories260K) #gpu", function()
    it("tells each sequence's CPU text in blocks of 4 and 16 rows and as one product, greedy and sampled", function()
        if not (H.need_gpu(pending, mk, why) and need()) then return end
        setup()
        local cpu_net = net
        local seqs = {}
        for i = 1, 18 do seqs[i] = { seed = 200 + i, temperature = i % 2, prompt = i == 3 and H.PROMPT or nil } end
        for i in ipairs(seqs) do alone(seqs[i]) end -- told on the CPU
        net = llama2.build(mk, c, { device = "cuda", output = C.lua51 and "logits" or "sample", steps = STEPS })
        local ok, err = pcall(function()
            check_alone(seqs, run(18, seqs, 4))
            check_alone(seqs, run(18, seqs)) -- the device's 16, then 2
            local told, differ = run(18, seqs, 18), 0
            for i, s in ipairs(seqs) do
                local want = alone(s)
                local same = 0
                while same < #want and want[same + 1] == told[i][same + 1] do same = same + 1 end
                if same < #want or #told[i] ~= #want then differ = differ + 1 end
                assert.is_true(same >= math.min(#want, 20), string.format("sequence %d: %d of %d ids agree", i, same, #want))
            end
            print(string.format("# rows = B on CUDA: %d of %d sequences differ from the CPU's after 20 ids", differ, #seqs))
        end)
        net.model:close()
        net = cpu_net
        assert(ok, err)
    end)
end)
