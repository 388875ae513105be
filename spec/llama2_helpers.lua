-- Helpers for the llama2 specs: a seeded RNG, a llama2.c checkpoint and
-- tokenizer writer, and an independent double-precision forward pass (the
-- reference the compiled model is checked against). Written from run.c's
-- description, sharing no code with lua/moonkaas/llama2/.

local H = {}
local C = require("moonkaas.compat") -- Lua 5.1 and LuaJIT run these specs too

if os.getenv("MK_BUILD") then
    package.cpath = os.getenv("MK_BUILD") .. "/?.so;" .. package.cpath
end

H.models = "../shared/models"

-- The prompt of the golden texts after a prompt (spec/fixtures/stories260K_prompt_*).
H.PROMPT = "Once upon a time there was a little girl named Lily. She liked to play in the park " ..
           "with her friends and her dog"

function H.models_present()
    local f = io.open(H.models .. "/stories260K.bin", "rb")
    if f then f:close() return true end
    return false
end

function H.read_file(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
end

function H.write_file(path, bytes)
    local f = assert(io.open(path, "wb"))
    f:write(bytes)
    f:close()
end

-- Seeds math.random from the clock and prints the seed, so a failure can be
-- replayed with LLAMA2_SPEC_SEED=<seed>.
function H.seed(what)
    local seed = tonumber(os.getenv("LLAMA2_SPEC_SEED") or "") or ((os.time() * 7919 + math.floor(os.clock() * 1e6)) % 2147483647)
    math.randomseed(seed)
    print(string.format("%s: seed %d (LLAMA2_SPEC_SEED=%d replays it)", what, seed, seed))
    return seed
end

-- The moonkaas module, or nil and why (the core may not be built).
function H.mk()
    local ok, mk = pcall(require, "moonkaas")
    if ok then return mk end
    return nil, tostring(mk)
end

-- Guards at the start of a test: true when it can run, else the test is
-- marked pending with the reason. `pending` is the spec's (busted binds it in
-- the spec's environment while a test runs); mk and why are H.mk()'s results.
function H.need_core(pending, mk, why)
    if not mk then
        pending("the moonkaas core module is not built: " .. tostring(why))
        return false
    end
    return true
end

function H.need_models(pending)
    if not H.models_present() then
        pending("../shared/models is absent: no stories260K.bin")
        return false
    end
    return true
end

function H.need_gpu(pending, mk, why)
    if not H.need_core(pending, mk, why) then return false end
    local ok, reason = mk.cuda_available()
    if not ok then
        pending("no CUDA device: " .. tostring(reason))
        return false
    end
    return true
end

function H.f32(x)
    return C.f32(x)
end

function H.tmpname()
    local p = os.tmpname()
    return p
end

-- ---------------------------------------------------------------------------
-- checkpoint writer

-- run.c's xorshift generator (random_u32, random_f32) from `seed`: a
-- function returning floats in [0, 1), the same on every machine and Lua.
-- Written with 5.3's integer operators (a string: Lua 5.1 cannot parse them);
-- on 5.1 hosts the module's own generator stands in.
if math.type then
    H.xorshift = load([[
        local state = ...
        return function()
            state = state ~ (state >> 12)
            state = state ~ (state << 25)
            state = state ~ (state >> 27)
            local u32 = ((state * 0x2545F4914F6CDD1D) >> 32) & 0xffffffff
            return (u32 >> 8) / 16777216.0
        end]])
else
    function H.xorshift(seed)
        local random_f32, state = require("moonkaas.llama2.sampler").random_f32, seed
        return function()
            local u
            state, u = random_f32(state)
            return u
        end
    end
end

-- cfg: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len,
-- shared (bool), random (optional: a function giving floats in [0, 1),
-- default math.random). Writes random float32 weights in run.c's order and
-- returns them as tables: W.emb[v][d], W.layers[l].{rms_att[d], wq[o][i],
-- ...}, W.rms_final[d], W.wcls[v][d]. Values are float32, so the reference
-- reads exactly what the model reads.
function H.write_checkpoint(path, cfg)
    local random = cfg.random or math.random
    local D, Hd, L = cfg.dim, cfg.hidden_dim, cfg.n_layers
    local hs = C.idiv(D, cfg.n_heads)
    local kv = hs * cfg.n_kv_heads
    local V, S = cfg.vocab_size, cfg.seq_len
    local parts = {}
    local function emit(values)
        local n = #values
        local i = 1
        while i <= n do
            local j = math.min(n, i + 999)
            parts[#parts + 1] = C.pack_array("f", values, i, j)
            i = j + 1
        end
    end
    local function matrix(rows, cols, scale, offset)
        local m, flat = {}, {}
        for r = 1, rows do
            local row = {}
            for c = 1, cols do
                local v = H.f32((offset or 0) + (2 * random() - 1) * scale)
                row[c] = v
                flat[#flat + 1] = v
            end
            m[r] = row
        end
        return m, flat
    end
    parts[1] = C.pack_array("i4", { D, Hd, L, cfg.n_heads, cfg.n_kv_heads, cfg.shared and V or -V, S },
                            1, 7)
    local W = { layers = {} }
    for l = 1, L do W.layers[l] = {} end
    local flat
    W.emb, flat = matrix(V, D, 1.0); emit(flat)
    -- The per-layer blocks are stored layer after layer within each kind.
    local kinds = {
        { "rms_att", 1, D, 0.3, 1.0 },
        { "wq", D, D, 1.2 / math.sqrt(D) },
        { "wk", kv, D, 1.2 / math.sqrt(D) },
        { "wv", kv, D, 1 / math.sqrt(D) },
        { "wo", D, D, 1 / math.sqrt(D) },
        { "rms_ffn", 1, D, 0.3, 1.0 },
        { "w1", Hd, D, 1 / math.sqrt(D) },
        { "w2", D, Hd, 1 / math.sqrt(Hd) },
        { "w3", Hd, D, 1 / math.sqrt(D) },
    }
    for _, k in ipairs(kinds) do
        for l = 1, L do
            local m
            m, flat = matrix(k[2], k[3], k[4], k[5])
            W.layers[l][k[1]] = k[2] == 1 and m[1] or m
            emit(flat)
        end
    end
    local m
    m, flat = matrix(1, D, 0.3, 1.0)
    W.rms_final = m[1]
    emit(flat)
    -- The legacy freq_cis block (skipped by readers): filled with noise, so a
    -- reader that used it would fail.
    local _, noise = matrix(S, hs, 5.0)
    emit(noise)
    if cfg.shared then
        W.wcls = W.emb
    else
        W.wcls, flat = matrix(V, D, 1 / math.sqrt(D))
        emit(flat)
    end
    H.write_file(path, table.concat(parts))
    return W
end

-- The W8A8 fixture's model (spec/fixtures/w8a8_*): a legacy float32 file of
-- random weights from a fixed seed, whose dimensions the group size 64
-- divides (as runq.c needs): dim 64, hidden 192, 2 layers, 4 heads over 2
-- KV heads, tok512's 512 tokens, 256 positions, its own classifier.
H.W8A8_CFG = { dim = 64, hidden_dim = 192, n_layers = 2, n_heads = 4, n_kv_heads = 2,
               vocab_size = 512, seq_len = 256, shared = false }

function H.write_w8a8_model(path)
    local cfg = {}
    for k, v in pairs(H.W8A8_CFG) do cfg[k] = v end
    cfg.random = H.xorshift(20261123)
    return H.write_checkpoint(path, cfg)
end

-- ---------------------------------------------------------------------------
-- reference forward pass, double precision

local function matvec(w, x)      -- w [out][in] @ x [in] -> [out]
    local out = {}
    for o = 1, #w do
        local row, s = w[o], 0.0
        for i = 1, #x do s = s + row[i] * x[i] end
        out[o] = s
    end
    return out
end

local function rmsnorm(x, w)
    local ss = 0.0
    for i = 1, #x do ss = ss + x[i] * x[i] end
    local scale = 1.0 / math.sqrt(ss / #x + 1e-5)
    local out = {}
    for i = 1, #x do out[i] = w[i] * (x[i] * scale) end
    return out
end

-- A stateful reference: ref:step(token, pos) returns the logits [V] (1-based)
-- for that position; positions must come in order 0, 1, 2, ...
function H.reference(cfg, W)
    local D, L = cfg.dim, cfg.n_layers
    local heads, kvh = cfg.n_heads, cfg.n_kv_heads
    local hs = C.idiv(D, heads)
    local kv_mul = C.idiv(heads, kvh)
    local K, Vc = {}, {}
    for l = 1, L do K[l], Vc[l] = {}, {} end
    local ref = {}
    function ref.step(_, token, pos)
        local x = {}
        for i = 1, D do x[i] = W.emb[token + 1][i] end
        for l = 1, L do
            local lw = W.layers[l]
            local xb = rmsnorm(x, lw.rms_att)
            local q, k, v = matvec(lw.wq, xb), matvec(lw.wk, xb), matvec(lw.wv, xb)
            -- RoPE on each (even, odd) pair of every head.
            for h = 0, heads - 1 do
                for j = 0, hs - 1, 2 do
                    local theta = pos / 10000 ^ (j / hs)
                    local c, s = math.cos(theta), math.sin(theta)
                    local a = h * hs + j + 1
                    q[a], q[a + 1] = q[a] * c - q[a + 1] * s, q[a] * s + q[a + 1] * c
                    if h < kvh then
                        k[a], k[a + 1] = k[a] * c - k[a + 1] * s, k[a] * s + k[a + 1] * c
                    end
                end
            end
            K[l][pos], Vc[l][pos] = k, v
            local att_out = {}
            for h = 0, heads - 1 do
                local g = C.idiv(h, kv_mul)
                local scores, max = {}, -math.huge
                for t = 0, pos do
                    local s = 0.0
                    for i = 1, hs do s = s + q[h * hs + i] * K[l][t][g * hs + i] end
                    s = s / math.sqrt(hs)
                    scores[t] = s
                    if s > max then max = s end
                end
                local sum = 0.0
                for t = 0, pos do scores[t] = math.exp(scores[t] - max); sum = sum + scores[t] end
                for i = 1, hs do
                    local acc = 0.0
                    for t = 0, pos do acc = acc + scores[t] / sum * Vc[l][t][g * hs + i] end
                    att_out[h * hs + i] = acc
                end
            end
            local o = matvec(lw.wo, att_out)
            for i = 1, D do x[i] = x[i] + o[i] end
            xb = rmsnorm(x, lw.rms_ffn)
            local h1, h3 = matvec(lw.w1, xb), matvec(lw.w3, xb)
            for i = 1, #h1 do h1[i] = h1[i] / (1 + math.exp(-h1[i])) * h3[i] end
            local f = matvec(lw.w2, h1)
            for i = 1, D do x[i] = x[i] + f[i] end
        end
        x = rmsnorm(x, W.rms_final)
        return matvec(W.wcls, x)
    end
    return ref
end

-- The largest |got - want| / (atol + rtol |want|) over two arrays; <= 1 passes.
function H.worst(got, want, atol, rtol)
    local worst, at = 0.0, nil
    for i = 1, #want do
        local e = math.abs(got[i] - want[i]) / (atol + rtol * math.abs(want[i]))
        if not (e <= worst) then worst, at = e, i end
    end
    return worst, at
end

-- Prompts on a random checkpoint (cfg, written at path with weights W, see
-- write_checkpoint) against the reference: a prompt of
-- n1 tokens at position 0 in one evaluation (net:prompt, logits of the last),
-- a step, a second prompt after it, then steps to the end, each step's logits
-- compared; the caches the prompts wrote count in every later step. With
-- pieces = k, prompts go in pieces of at most k tokens (model.PROMPT_TOKENS).
function H.check_prompts(mk, llama2, cfg, path, W, device, pieces)
    local c = assert(llama2.read_config(path))
    local net = llama2.build(mk, c, { device = device, output = "logits" })
    local model = llama2.model
    local saved = model.PROMPT_TOKENS
    model.PROMPT_TOKENS = pieces or saved
    local ok, err = pcall(function()
        local ref = H.reference(cfg, W)
        local S = cfg.seq_len
        local n1 = math.random(2, S - 4)
        local n2 = math.random(2, S - n1 - 2)
        local pos, want = 0, nil
        local function check(got, what)
            local worst, at = H.worst(got, want, 2e-4, 2e-4)
            assert(worst <= 1, string.format("%s (%s, pieces %s): logit %s is %.7g, the reference %.7g",
                what, device, tostring(pieces), tostring(at), at and got[at] or 0, at and want[at] or 0))
        end
        local function prompt(n)
            local tokens = {}
            for i = 1, n do
                tokens[i] = math.random(0, cfg.vocab_size - 1)
                want = ref:step(tokens[i], pos + i - 1)
            end
            check(net:prompt(tokens, pos), string.format("prompt of %d at %d", n, pos))
            pos = pos + n
        end
        local function step()
            local token = math.random(0, cfg.vocab_size - 1)
            want = ref:step(token, pos)
            check(net:forward(token, pos), "step at " .. pos)
            pos = pos + 1
        end
        prompt(n1)
        step()
        prompt(n2)
        while pos < S do step() end
        -- on the CPU each layer's attention in a prompt's model is one causal
        -- group (where kv heads serve several query heads too)
        if device == "cpu" then
            for T, pm in pairs(net.prompt_models) do
                local report = pm.model:fusion_report()
                local _, groups = report:gsub("attention group %$%d+ %(line %d+%): one launch, causal", "")
                assert(groups == cfg.n_layers, string.format("prompt model %d: %d causal attention groups, "
                    .. "not %d:\n%s", T, groups, cfg.n_layers, report))
            end
        end
    end)
    model.PROMPT_TOKENS = saved
    if not ok then error(err, 0) end
end

-- ---------------------------------------------------------------------------
-- tokenizer writer: entries = {{piece, score}, ...} in id order

function H.tokenizer_bytes(entries, max_len)
    local parts = { C.pack_i32(max_len or 16) }
    for _, e in ipairs(entries) do
        parts[#parts + 1] = C.pack_f32(e[2]) .. C.pack_i32(#e[1]) .. e[1]
    end
    return table.concat(parts)
end

-- A small valid vocabulary of `n` >= 259 entries: <unk>, <s>, </s>, the 256
-- byte tokens, then " ", letters and a few merges.
function H.small_vocab(extra)
    local e = { { "<unk>", 0 }, { "\n<s>\n", 0 }, { "\n</s>\n", 0 } }
    for b = 0, 255 do e[#e + 1] = { string.format("<0x%02X>", b), 0 } end
    for _, x in ipairs(extra or { { " ", -1 }, { "a", -2 }, { "b", -3 }, { "ab", -1.5 }, { " a", -0.5 } }) do
        e[#e + 1] = x
    end
    return e
end

-- Runs `lua5.4 script args...` from the repository root (script: a path
-- there); returns exit code, stdout, stderr.
function H.run_script(script, args)
    local out, err = os.tmpname(), os.tmpname()
    local quoted = {}
    for i, a in ipairs(args) do quoted[i] = "'" .. a:gsub("'", "'\\''") .. "'" end
    local cmd = string.format("%s %s %s >%s 2>%s </dev/null", os.getenv("LUA") or "lua5.4", script,
                              table.concat(quoted, " "), out, err)
    local status, _, code = os.execute(cmd)
    if code == nil then code = math.floor(status / 256) end -- 5.1: the wait status
    local o, e = H.read_file(out), H.read_file(err)
    os.remove(out); os.remove(err)
    return code, o, e
end

-- H.run_script for scripts/llama2.lua.
function H.run_cli(args) return H.run_script("scripts/llama2.lua", args) end

-- llama2.main(argv) as a chat: read_line answers with lines in turn (then
-- nil, as at the end of stdin), each guide it is given is printed as the
-- default would print it. Returns the exit code, stdout, stderr.
function H.chat(mk, llama2, argv, lines)
    local out, err = {}, {}
    lines = { C.unpack(lines) }
    local code = llama2.main(argv, {
        mk = mk, stdout = function(s) out[#out + 1] = s end, stderr = function(s) err[#err + 1] = s end,
        read_line = function(guide)
            out[#out + 1] = guide
            return table.remove(lines, 1)
        end })
    return code, table.concat(out), table.concat(err)
end

-- run.c's sampled chat on stories260K (fixture from printf 'Tell me\nMore
-- please\n' | run -m chat -n 200 -t 1 -p 0.9 -s 42: the system prompt, then
-- the user's), each turn's prompt in one evaluation and a token at a time.
function H.check_chat(mk, llama2, device)
    local want = H.read_file("spec/fixtures/stories260K_chat_t1_p0.9_s42_n200.expected.txt")
    for _, per_token in ipairs({ false, true }) do
        local argv = { H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin", "-m", "chat",
                       "-n", "200", "-t", "1", "-p", "0.9", "-s", "42", "-d", device }
        if per_token then argv[#argv + 1] = "--per-token" end
        local code, text, err = H.chat(mk, llama2, argv, { "Tell me", "More please" })
        assert(code == 0, err)
        if text ~= want then
            error(string.format("%s:\nwant %q\ngot  %q", table.concat(argv, " "), want, text), 0)
        end
    end
end

return H
