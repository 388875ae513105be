-- Bad inputs to llama2: truncated and corrupt checkpoints and tokenizers give
-- one-line errors naming the file and the problem; the command line refuses
-- bad flags like run.c (usage, non-zero exit) and prints -h with exit 0.

local H = require("spec.llama2_helpers")
local llama2 = require("moonkaas.llama2")
local C = llama2.checkpoint
local T = llama2.tokenizer

local GOOD = { dim = 16, hidden_dim = 24, n_layers = 2, n_heads = 4, n_kv_heads = 2,
               vocab_size = 300, seq_len = 8, shared = true }

local P = require("moonkaas.compat") -- Lua 5.1 and LuaJIT run this spec too

local function header(d, h, l, nh, kv, v, s)
    return P.pack_array("i4", { d, h, l, nh, kv, v, s }, 1, 7)
end
-- a tokenizer record: score (float32), length (int32)
local function record(score, len) return P.pack_f32(score) .. P.pack_i32(len) end

-- A checkpoint file of the right size for its header (zeros after it).
local function sized(path, d, h, l, nh, kv, v, s, delta)
    local hdr = {}
    for k, name in ipairs(C.FIELDS) do hdr[name] = ({ d, h, l, nh, kv, v, s })[k] end
    local c = assert(C.config_from_header(hdr))
    H.write_file(path, header(d, h, l, nh, kv, v, s) .. string.rep("\0", c.expected_bytes - 28 + (delta or 0)))
    return c
end

local function one_line(msg)
    assert.is_string(msg)
    assert.is_nil(msg:find("\n"), "the message is one line: " .. msg)
end

describe("llama2 checkpoint errors", function()
    local path
    before_each(function() path = os.tmpname() end)
    after_each(function() os.remove(path) end)

    it("accepts a well-formed header and derives the sizes", function()
        H.seed("checkpoint sizes")
        H.write_checkpoint(path, GOOD)
        local c = assert(C.read_config(path))
        assert.are.equal(4, c.head_size)
        assert.are.equal(8, c.kv_dim)
        assert.are.equal(2, c.kv_mul)
        assert.is_true(c.shared_classifier)
        -- 28 + 4 (V D + L D + L D D + 2 L kv D + L D D + L D + 3 L H D + D + S hs)
        local D, Hd, L, V, S, kv, hs = 16, 24, 2, 300, 8, 8, 4
        assert.are.equal(28 + 4 * (V * D + L * D + L * D * D + 2 * L * kv * D + L * D * D + L * D
                                   + 3 * L * Hd * D + D + S * hs), c.file_bytes)
    end)

    it("names a missing file", function()
        local c, err = C.read_config("/nonexistent/model.bin")
        assert.is_nil(c)
        one_line(err)
        assert.truthy(err:find("/nonexistent/model.bin: cannot open checkpoint", 1, true))
    end)

    it("names a directory", function()
        local c, err = C.read_config("/tmp")
        assert.is_nil(c)
        assert.truthy(err:find("^/tmp: "))
    end)

    it("reports files shorter than the header", function()
        for _, n in ipairs({ 0, 1, 27 }) do
            H.write_file(path, string.rep("\1", n))
            local c, err = C.read_config(path)
            assert.is_nil(c)
            one_line(err)
            assert.truthy(err:find(path .. ": truncated checkpoint: " .. n .. " bytes", 1, true), err)
        end
    end)

    it("reports a size that disagrees with the header, both ways", function()
        for _, delta in ipairs({ -4, -1, 1, 4, 4096 }) do
            local c0 = sized(path, 16, 24, 2, 4, 2, 300, 8, delta)
            local c, err = C.read_config(path)
            assert.is_nil(c)
            one_line(err)
            assert.truthy(err:find(string.format("%s: checkpoint is %d bytes but its header", path,
                                                 c0.expected_bytes + delta), 1, true), err)
            assert.truthy(err:find("needs " .. c0.expected_bytes .. " bytes", 1, true), err)
        end
    end)

    it("reports a truncated stories260K", function()
        if not H.models_present() then pending("../shared/models is absent") return end
        local bytes = H.read_file(H.models .. "/stories260K.bin")
        H.write_file(path, bytes:sub(1, 500000))
        local c, err = C.read_config(path)
        assert.is_nil(c)
        assert.truthy(err:find("checkpoint is 500000 bytes but its header (dim 64, hidden 172, layers 5, " ..
                               "heads 8, kv_heads 4, vocab 512, seq_len 512) needs 1056540 bytes (truncated?)",
                               1, true), err)
    end)

    local BAD = {
        { { 0, 24, 2, 4, 2, 300, 8 }, "dim must be positive (got 0)" },
        { { 16, -24, 2, 4, 2, 300, 8 }, "hidden_dim must be positive (got -24)" },
        { { 16, 24, 0, 4, 2, 300, 8 }, "n_layers must be positive (got 0)" },
        { { 16, 24, 2, 0, 2, 300, 8 }, "n_heads must be positive (got 0)" },
        { { 16, 24, 2, 4, -2, 300, 8 }, "n_kv_heads must be positive (got -2)" },
        { { 16, 24, 2, 4, 2, 0, 8 }, "vocab_size is 0" },
        { { 16, 24, 2, 4, 2, 300, 0 }, "seq_len must be positive (got 0)" },
        { { 18, 24, 2, 4, 2, 300, 8 }, "dim 18 is not a multiple of n_heads 4" },
        { { 16, 24, 2, 4, 3, 300, 8 }, "n_kv_heads 3 does not divide n_heads 4" },
        { { 16, 24, 2, 4, 8, 300, 8 }, "n_kv_heads 8 does not divide n_heads 4" },
        { { 12, 24, 2, 4, 2, 300, 8 }, "head size 3 (dim / n_heads) is odd" },
        { { 0x7fffffff, 0x7fffffff, 0x7fffffff, 1, 1, 300, 8 }, "not a checkpoint" },
    }
    for _, case in ipairs(BAD) do
        it("rejects a bad header: " .. case[2], function()
            H.write_file(path, header((table.unpack or unpack)(case[1])) .. string.rep("\0", 4096))
            local c, err = C.read_config(path)
            assert.is_nil(c)
            one_line(err)
            assert.truthy(err:find(path .. ": bad checkpoint header: ", 1, true), err)
            assert.truthy(err:find(case[2], 1, true), err)
        end)
    end

    it("reads a negative vocab_size as an unshared classifier", function()
        H.seed("unshared checkpoint")
        local cfg = {}
        for k, v in pairs(GOOD) do cfg[k] = v end
        cfg.shared = false
        H.write_checkpoint(path, cfg)
        local c = assert(C.read_config(path))
        assert.is_false(c.shared_classifier)
        assert.are.equal(300, c.vocab_size)
    end)
end)

describe("llama2 sampling model errors", function()
    it("refuses an unknown output and a sampling step without its sampler; stays usable", function()
        -- the sampler node's state is a 64-bit integer, beyond a Lua 5.1 number
        if P.lua51 then return pending("Lua 5.1 hosts sample in Lua, not with the sampler node") end
        local mk = H.mk()
        local path = os.tmpname()
        H.write_checkpoint(path, GOOD)
        local c = assert(llama2.read_config(path))
        local ok, err = pcall(llama2.build, mk, c, { output = "beam" })
        assert.is_false(ok)
        assert.truthy(tostring(err):find("output must be argmax, sample or logits (got beam)", 1, true), err)
        local net = llama2.build(mk, c, { output = "sample", steps = 4 })
        ok, err = pcall(net.forward, net, 1, 0)
        assert.is_false(ok)
        assert.truthy(tostring(err):find("forward: a sampling model needs the sampler", 1, true), err)
        ok, err = pcall(net.steps, net, 1, 0, 2, nil, {})
        assert.is_false(ok)
        assert.truthy(tostring(err):find("steps: a sampling model needs the sampler", 1, true), err)
        local smp = llama2.sampler(c.vocab_size, 1.0, 0.9, 7)
        local ids = net:steps(1, 0, 3, nil, smp)
        assert.are.equal(3, #ids)
        assert.are_not.equal(7, smp.state)
        os.remove(path)
    end)
end)

describe("llama2 tokenizer errors", function()
    local path
    before_each(function() path = os.tmpname() end)
    after_each(function() os.remove(path) end)

    local function expect(bytes, vocab, pattern)
        H.write_file(path, bytes)
        local t, err = T.load(path, vocab)
        assert.is_nil(t)
        one_line(err)
        assert.truthy(err:find(path .. ": ", 1, true), err)
        assert.truthy(err:find(pattern, 1, true), err)
    end

    it("names a missing file", function()
        local t, err = T.load("/nonexistent/tok.bin", 10)
        assert.is_nil(t)
        assert.truthy(err:find("/nonexistent/tok.bin: cannot open tokenizer", 1, true), err)
    end)

    it("reports truncation: header, record header, piece bytes, too few tokens", function()
        local good = H.tokenizer_bytes(H.small_vocab(), 4)
        expect("", 264, "truncated: 0 bytes")
        expect("\4\0", 264, "truncated: 2 bytes")
        expect(good:sub(1, 4 + 5), 264, "truncated in token 0 of 264")
        expect(good:sub(1, 4 + 8 + 2), 264, "truncated in token 0 of 264")
        expect(good, 300, "truncated in token 264 of 300")
    end)

    it("reports corrupt records", function()
        expect(P.pack_i32(0), 1, "max_token_length 0 is not positive")
        expect(P.pack_i32(4) .. record(0, -3), 1, "corrupt token 0: negative length -3")
        expect(P.pack_i32(4) .. record(0 / 0, 1) .. "a", 1, "corrupt token 0: score is NaN")
    end)

    it("refuses a vocabulary too small for BOS and EOS (found by tokenizer_fuzz)", function()
        -- encode emitted EOS (2) for a 2-token vocabulary, an id decode refused
        local two = P.pack_i32(1) .. record(0, 1) .. "a" .. record(0, 1) .. "b"
        expect(two, 2, "a vocabulary of 2 tokens has no BOS (1) and EOS (2) tokens")
        expect(P.pack_i32(1) .. record(0, 1) .. "a", 1, "a vocabulary of 1 token has no BOS")
        assert.truthy(T.parse(two .. record(0, 1) .. "c", 3, "three"))
    end)

    it("refuses a tokenizer with more tokens than the model (another model's)", function()
        local good = H.tokenizer_bytes(H.small_vocab(), 4)
        expect(good, 263, "holds more than the model's 263 tokens")
        assert.truthy(T.load(path, 264))
    end)

    it("refuses tokenizer.bin (32,000 tokens) for stories260K (512) through the command line", function()
        if not H.models_present() then pending("../shared/models is absent") return end
        local code, out, err = H.run_cli({ H.models .. "/stories260K.bin", "-z", H.models .. "/tokenizer.bin",
                                           "-d", "cpu", "-n", "4" })
        assert.are.equal(1, code)
        assert.are.equal("", out)
        assert.truthy(err:find("holds more than the model's 512 tokens", 1, true), err)
    end)

    it("reports a truncated tokenizer.bin through the command line", function()
        if not H.models_present() then pending("../shared/models is absent") return end
        H.write_file(path, H.read_file(H.models .. "/tok512.bin"):sub(1, 3000))
        local code, out, err = H.run_cli({ H.models .. "/stories260K.bin", "-z", path, "-d", "cpu" })
        assert.are.equal(1, code)
        assert.are.equal("", out)
        assert.truthy(err:match("^" .. path:gsub("%p", "%%%0") .. ": truncated in token %d+ of 512[^\n]*\n$"), err)
    end)
end)

describe("llama2 command line", function()
    local P = llama2.parse_args

    it("has run.c's defaults", function()
        local o = assert(P({ "m.bin" }))
        assert.are.equal("m.bin", o.checkpoint)
        assert.are.equal(1.0, o.temperature)
        assert.are.equal(0.9, o.topp)
        assert.are.equal(256, o.steps)
        assert.are.equal("tokenizer.bin", o.tokenizer)
        assert.are.equal("generate", o.mode)
        assert.is_nil(o.prompt)
        assert.is_nil(o.device)
        assert.is_false(o.cudnn)
        assert.is_true(o.seed > 0)      -- default: the time
    end)

    it("reads every flag", function()
        local o = assert(P({ "m.bin", "-t", "0.5", "-p", "0.8", "-s", "42", "-n", "12", "-i", "Hi there",
                             "-z", "t.bin", "-m", "chat", "-y", "Be nice", "-d", "cpu", "--cudnn" }))
        assert.are.same({ 0.5, 0.8, 42, 12, "Hi there", "t.bin", "chat", "Be nice", "cpu", true },
            { o.temperature, o.topp, o.seed, o.steps, o.prompt, o.tokenizer, o.mode, o.system_prompt,
              o.device, o.cudnn })
    end)

    it("applies run.c's overrides", function()
        local o = assert(P({ "m.bin", "-t", "-1", "-p", "1.5", "-n", "-5", "-s", "-7" }))
        assert.are.equal(0.0, o.temperature)
        assert.are.equal(0.9, o.topp)
        assert.are.equal(0, o.steps)
        assert.are.equal(-7, o.seed)                         -- the bits of 2^64 - 7, as run.c
        assert.are.equal(1, assert(P({ "m.bin", "-s", "4294967297" })).seed)   -- atoi wraps to int32
    end)

    it("refuses bad flags and values with a message and exit code 1", function()
        for _, argv in ipairs({
            {}, { "-t", "1" }, { "m.bin", "-t" }, { "m.bin", "-x", "1" }, { "m.bin", "-tt", "1" },
            { "m.bin", "t", "1" }, { "m.bin", "-t", "hot" }, { "m.bin", "-n", "1.5" },
            { "m.bin", "-m", "poem" }, { "m.bin", "-d", "tpu" }, { "m.bin", "-s", "x" },
        }) do
            local o, msg, code = P(argv)
            assert.is_nil(o, table.concat(argv, " "))
            assert.are.equal(1, code)
            assert.is_true(#msg > 0)
        end
        local o, msg, code = P({ "m.bin", "-h" })
        assert.is_nil(o)
        assert.are.equal("", msg)
        assert.are.equal(0, code)
    end)

    it("prints usage: -h on stdout with exit 0, bad flags on stderr with exit 1", function()
        local code, out, err = H.run_cli({ "-h" })
        assert.are.equal(0, code)
        assert.truthy(out:find("Usage:", 1, true))
        assert.are.equal("", err)
        code, out, err = H.run_cli({ "model.bin", "-x", "1" })
        assert.are.equal(1, code)
        assert.are.equal("", out)
        assert.truthy(err:find("unknown option: -x", 1, true))
        assert.truthy(err:find("Usage:", 1, true))
        code, out, err = H.run_cli({ "model.bin", "-q", "int4" })
        assert.are.equal(1, code)
        assert.truthy(err:find("unknown precision: int4 (fp32|bf16|fp16|q8|q8a8)", 1, true), err)
        code, out, err = H.run_cli({})
        assert.are.equal(1, code)
        assert.truthy(err:find("Usage:", 1, true))
    end)

    it("fails with one line for -d cuda where there is no GPU", function()
        if not H.models_present() then pending("../shared/models is absent") return end
        local mk = H.mk()
        if not mk then pending("the moonkaas core module is not built") return end
        if mk.cuda_available() then pending("a CUDA device is present") return end
        local code, out, err = H.run_cli({ H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin",
                                           "-d", "cuda" })
        assert.are.equal(1, code)
        assert.are.equal("", out)
        assert.truthy(err:match("^%-d cuda: no CUDA device: [^\n]*\n$"), err)
    end)

    it("fails with one line for a missing or corrupt checkpoint", function()
        local code, out, err = H.run_cli({ "/nonexistent/model.bin" })
        assert.are.equal(1, code)
        assert.are.equal("", out)
        assert.are.equal("/nonexistent/model.bin: cannot open checkpoint: No such file or directory\n", err)
        local path = os.tmpname()
        H.write_file(path, header(16, 24, 2, 4, 3, 300, 8))
        code, out, err = H.run_cli({ path })
        os.remove(path)
        assert.are.equal(1, code)
        assert.are.equal(path .. ": bad checkpoint header: n_kv_heads 3 does not divide n_heads 4\n", err)
    end)
end)
