-- llama2.c's checkpoint formats: legacy (v0), version 1 (float32) and
-- version 2 (int8 groups): read_config, map() and scripts/export.lua (its
-- engine is checkpoint.export), against files written here from the
-- formats' definitions (llama2.c's export.py), never by the code under test.
--
-- Fixtures (spec/fixtures/, stdout of llama2.c's run.c without the final
-- newline it prints, as ../shared/models/stories260K_t0_n200.expected.txt):
--
--   gcc -O3 -o /tmp/run .gpu/l2c/run.c -lm      # run.c of karpathy/llama2.c 350e04f
--   M=../shared/models
--   lua5.4 scripts/export.lua $M/stories260K.bin /tmp/q8.bin --version 2
--   lua5.4 scripts/export.lua /tmp/q8.bin /tmp/q8_legacy.bin --version 0
--       (q8.bin: int8 in groups of 64, 278,608 bytes, sha256 4767083d...;
--        q8_legacy.bin: run.c reads legacy files only, sha256 9dfaa4c6...)
--   /tmp/run /tmp/q8_legacy.bin -z $M/tok512.bin -t 0 -n 200 2>/dev/null | head -c -1 \
--       > spec/fixtures/stories260K_q8_t0_n200.expected.txt
--   /tmp/run /tmp/q8_legacy.bin -z $M/tok512.bin -t 1 -p 0.9 -s 42 -n 200 2>/dev/null | head -c -1 \
--       > spec/fixtures/stories260K_q8_t1_p0.9_s42_n200.expected.txt
--   /tmp/run $M/stories260K.bin -z $M/tok512.bin -t 1 -p 0.9 -s 42 -n 200 2>/dev/null | head -c -1 \
--       > spec/fixtures/stories260K_t1_p0.9_s42_n200.expected.txt
--
-- (No -i: run.c's default empty prompt, as the legacy golden.) The q8
-- fixtures check the export's quantization and dequantization end to end:
-- moonkaas runs the same legacy file run.c ran.
--
-- The W8A8 fixtures are runq.c's text (same commit) for a model it is valid
-- for (spec/llama2_helpers.lua's write_w8a8_model: random weights from a
-- fixed seed, dims multiples of 64), built as ISO C, so nothing contracts
-- runq.c's val += ival * ws * xs into a fused multiply-add (its -Ofast build
-- told the same text, also with a prompt):
--
--   gcc -std=c11 -D_GNU_SOURCE -O2 -o /tmp/runq .gpu/l2c/runq.c -lm
--   lua5.4 -e 'package.path = "./?.lua;lua/?.lua;lua/?/init.lua;" .. package.path
--              require("spec.llama2_helpers").write_w8a8_model("/tmp/w8a8.bin")'
--   lua5.4 scripts/export.lua /tmp/w8a8.bin /tmp/w8a8_v2.bin --version 2
--       (w8a8.bin: 673,052 bytes, sha256 fdbcb3ca...; w8a8_v2.bin: int8 in groups of 64,
--        175,616 bytes, sha256 adaadb9e...)
--   /tmp/runq /tmp/w8a8_v2.bin -z $M/tok512.bin -t 0 -n 200 2>/dev/null | head -c -1 \
--       > spec/fixtures/w8a8_t0_n200.expected.txt
--   /tmp/runq /tmp/w8a8_v2.bin -z $M/tok512.bin -t 1 -p 0.9 -s 42 -n 200 2>/dev/null | head -c -1 \
--       > spec/fixtures/w8a8_t1_p0.9_s42_n200.expected.txt

local H = require("spec.llama2_helpers")
local llama2 = require("moonkaas.llama2")
local C = llama2.checkpoint

local mk, why = H.mk()
local MAGIC = 0x616b3432

local function need_core() return H.need_core(pending, mk, why) end
local function need_models() return H.need_models(pending) end
local f32, round_even = H.f32, require("spec.helpers").round_even
local P = require("moonkaas.compat") -- Lua 5.1 and LuaJIT run this spec too

-- float32 values as bytes, in pieces (string.pack takes a bounded number of arguments)
local function pack_floats(values)
    local parts = {}
    for i = 1, #values, 1000 do
        local j = math.min(#values, i + 999)
        parts[#parts + 1] = P.pack_array("f", values, i, j)
    end
    return table.concat(parts)
end

local function flat(m) -- a matrix {{...}, ...} or a vector as one array
    if type(m[1]) ~= "table" then return m end
    local out = {}
    for _, row in ipairs(m) do
        for _, v in ipairs(row) do out[#out + 1] = v end
    end
    return out
end

-- The legacy freq_cis block of export.py's model.py in float32 steps:
-- cos then sin of pos * 1 / 10000^(2i / head_size), each step rounded.
local function ref_freq_cis(hs, S)
    local cosv, sinv = {}, {}
    for pos = 0, S - 1 do
        for i = 0, P.idiv(hs, 2) - 1 do
            local freq = f32(1.0 / f32(10000.0 ^ f32(f32(2 * i) / hs)))
            local val = f32(pos * freq)
            cosv[#cosv + 1] = f32(math.cos(val))
            sinv[#sinv + 1] = f32(math.sin(val))
        end
    end
    return pack_floats(cosv) .. pack_floats(sinv)
end

-- The names of the weights in each version's order (export.py), per layer where starred.
local V1_ORDER = { "rms_att*", "rms_ffn*", "rms_final", "emb", "wq*", "wk*", "wv*", "wo*", "w1*", "w2*", "w3*", "wcls" }

local function weights_in_order(cfg, W)
    local out = {}
    for _, spec in ipairs(V1_ORDER) do
        local name = spec:gsub("%*$", "")
        if spec:sub(-1) == "*" then
            for l = 1, cfg.n_layers do out[#out + 1] = { name = name, values = flat(W.layers[l][name]) } end
        elseif name ~= "wcls" or not cfg.shared then
            out[#out + 1] = { name = name, values = flat(W[name]) }
        end
    end
    return out
end

local function header_v(cfg, version, group)
    local h = P.pack_array("i4", { MAGIC, version, cfg.dim, cfg.hidden_dim, cfg.n_layers,
                                   cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.seq_len }, 1, 9)
        .. string.char(cfg.shared and 1 or 0)
    if version == 2 then h = h .. P.pack_i32(group) end
    return h .. string.rep("\0", 256 - #h)
end

-- export.py's version1_export of the weights W (H.write_checkpoint's tables)
local function ref_v1(cfg, W)
    local parts = { header_v(cfg, 1) }
    for _, w in ipairs(weights_in_order(cfg, W)) do parts[#parts + 1] = pack_floats(w.values) end
    return table.concat(parts)
end

-- export.py's quantize_q80 over a flat array: bytes of q and of the scales,
-- and the dequantized values (q * scale in float32)
local function ref_q80(values, group)
    local q, s, deq = {}, {}, {}
    for g = 0, P.idiv(#values, group) - 1 do
        local wmax = 0.0
        for i = 1, group do wmax = math.max(wmax, math.abs(values[g * group + i])) end
        local scale = f32(wmax / 127)
        s[#s + 1] = scale
        for i = 1, group do
            local k = g * group + i
            q[k] = scale > 0 and P.tointeger(round_even(f32(values[k] / scale))) or 0
            deq[k] = f32(q[k] * scale)
        end
    end
    local qb = {}
    for i = 1, #q, 1000 do
        local j = math.min(#q, i + 999)
        local bytes = {}
        for k = i, j do bytes[#bytes + 1] = string.char(q[k] % 256) end -- int8, two's complement
        qb[#qb + 1] = table.concat(bytes)
    end
    return table.concat(qb), pack_floats(s), deq
end

-- export.py's version2_export: norms float32, every matrix quantized.
-- Also returns the dequantized weights (the tables of W, in new tables).
local function ref_v2(cfg, W, group)
    local norms, mats = {}, {}
    local D = { layers = {} }
    for l = 1, cfg.n_layers do D.layers[l] = {} end
    for _, spec in ipairs(V1_ORDER) do
        local name = spec:gsub("%*$", "")
        local layers = spec:sub(-1) == "*" and cfg.n_layers or 1
        for l = 1, layers do
            local w = spec:sub(-1) == "*" and W.layers[l][name] or W[name]
            if not (name == "wcls" and cfg.shared) then
                local values = flat(w)
                if name:match("^rms") then
                    norms[#norms + 1] = pack_floats(values)
                else
                    local qb, sb, deq = ref_q80(values, group)
                    mats[#mats + 1] = qb .. sb
                    if spec:sub(-1) == "*" then D.layers[l][name] = deq else D[name] = deq end
                end
            end
        end
    end
    return header_v(cfg, 2, group) .. table.concat(norms) .. table.concat(mats), D
end

-- H.write_checkpoint, with the noise of its freq_cis block replaced by
-- model.py's values (what llama2.c's legacy_export writes). Returns W and
-- the file's bytes.
local function write_legacy(path, cfg)
    local W = H.write_checkpoint(path, cfg)
    local bytes = H.read_file(path)
    local hs = P.idiv(cfg.dim, cfg.n_heads)
    local tail = cfg.shared and 0 or 4 * cfg.vocab_size * cfg.dim
    local at = #bytes - tail - 4 * cfg.seq_len * hs
    bytes = bytes:sub(1, at) .. ref_freq_cis(hs, cfg.seq_len) .. bytes:sub(#bytes - tail + 1)
    H.write_file(path, bytes)
    return W, bytes
end

-- Inside a describe: a function giving fresh temporary paths, removed (with
-- any export's ".partial") after each test.
local function temp_paths()
    local paths
    before_each(function() paths = {} end)
    after_each(function()
        for _, p in ipairs(paths) do os.remove(p); os.remove(p .. ".partial") end
        collectgarbage()
    end)
    return function()
        paths[#paths + 1] = os.tmpname()
        return paths[#paths]
    end
end

local function export(input, output, version, group)
    local c = assert(C.read_config(input))
    return assert(C.export(mk, c, output, version, { group_size = group }))
end

-- Small shapes; the third has w2's rows (36) not a multiple of its group (8).
local CONFIGS = {
    { name = "shared, MHA", dim = 16, hidden_dim = 40, n_layers = 2, n_heads = 4, n_kv_heads = 4,
      vocab_size = 37, seq_len = 12, shared = true },
    { name = "unshared, GQA", dim = 16, hidden_dim = 48, n_layers = 3, n_heads = 4, n_kv_heads = 2,
      vocab_size = 45, seq_len = 7, shared = false },
    { name = "unshared, odd shape", dim = 24, hidden_dim = 36, n_layers = 2, n_heads = 6, n_kv_heads = 2,
      vocab_size = 29, seq_len = 10, shared = false },
    -- groups of 2, int8 blocks of odd sizes: scale blocks off the 4-byte boundary (map copies them)
    { name = "dim 6, unaligned scales", dim = 6, hidden_dim = 10, n_layers = 2, n_heads = 3, n_kv_heads = 3,
      vocab_size = 7, seq_len = 5, shared = false },
}

describe("llama2.c checkpoint versions 1 and 2", function()
    local tmp = temp_paths()

    for _, cfg in ipairs(CONFIGS) do
        it("legacy → version 1 → legacy is byte-identical, version 1 as export.py writes it: " .. cfg.name, function()
            if not need_core() then return end
            H.seed("formats v1 " .. cfg.name)
            local legacy, v1, back = tmp(), tmp(), tmp()
            local W, bytes = write_legacy(legacy, cfg)
            local oc = export(legacy, v1, 1)
            assert.are.equal(1, oc.version)
            assert.is_true(H.read_file(v1) == ref_v1(cfg, W), "the version 1 file differs from export.py's")
            local c = assert(C.read_config(v1))
            assert.are.same({ 1, 256, cfg.shared, #ref_v1(cfg, W) },
                { c.version, c.header_bytes, c.shared_classifier, c.file_bytes })
            export(v1, back, 0)
            assert.is_true(H.read_file(back) == bytes, "legacy → v1 → legacy changed the file")
            -- and legacy → legacy copies
            export(legacy, back, 0)
            assert.is_true(H.read_file(back) == bytes)
        end)

        it("version 2 quantizes as export.py's quantize_q80, groups of 64 halved to fit dim: " .. cfg.name, function()
            if not need_core() then return end
            H.seed("formats v2 " .. cfg.name)
            local legacy, v2, v2b, back = tmp(), tmp(), tmp(), tmp()
            local W = write_legacy(legacy, cfg)
            local group = 64
            while cfg.dim % group ~= 0 do group = P.idiv(group, 2) end
            local oc = export(legacy, v2, 2)
            assert.are.equal(group, oc.group_size)
            local want, deq = ref_v2(cfg, W, group)
            assert.is_true(H.read_file(v2) == want, "the version 2 file differs from export.py's")
            local c = assert(C.read_config(v2))
            assert.are.same({ 2, group, 256, cfg.shared, #want },
                { c.version, c.group_size, c.header_bytes, c.shared_classifier, c.file_bytes })
            -- the same from version 1, and version 2 to itself copies
            local v1 = tmp()
            export(legacy, v1, 1)
            export(v1, v2b, 2)
            assert.is_true(H.read_file(v2b) == want)
            export(v2, v2b, 2)
            assert.is_true(H.read_file(v2b) == want)
            -- back to legacy: the dequantized values, freq_cis computed
            export(v2, back, 0)
            local c0 = assert(C.read_config(back))
            local w0 = C.map(mk, c0)
            local function same(t, values, what)
                assert.is_true(t:bytes() == pack_floats(values), what .. " is not q * scale")
            end
            same(w0.token_embedding, deq.emb, "token_embedding")
            if not cfg.shared then same(w0.wcls, deq.wcls, "wcls") end
            for l = 1, cfg.n_layers do
                for _, name in ipairs(C.MATRICES) do same(w0.layers[l][name], deq.layers[l][name], name) end
                same(w0.layers[l].rms_att, W.layers[l].rms_att, "rms_att")
            end
            local bytes = H.read_file(back)
            local tail = cfg.shared and 0 or 4 * cfg.vocab_size * cfg.dim
            local hs = P.idiv(cfg.dim, cfg.n_heads)
            assert.is_true(bytes:sub(#bytes - tail - 4 * cfg.seq_len * hs + 1, #bytes - tail)
                           == ref_freq_cis(hs, cfg.seq_len))
        end)
    end

    it("takes --group-size and backs off as export.py does (halving until it divides dim)", function()
        if not need_core() then return end
        H.seed("formats group sizes")
        local cfg = CONFIGS[3] -- dim 24
        local legacy = tmp()
        local W = write_legacy(legacy, cfg)
        for start, group in pairs({ [12] = 12, [48] = 24, [5] = 2, [7] = 3, [1] = 1, [100] = 12 }) do
            local v2 = tmp()
            assert.are.equal(group, export(legacy, v2, 2, start).group_size)
            assert.is_true(H.read_file(v2) == ref_v2(cfg, W, group), "group " .. group)
            assert.are.equal(group, assert(C.read_config(v2)).group_size)
        end
        local c = assert(C.read_config(legacy))
        for _, bad in ipairs({ 0, -8, 2.5 }) do
            local oc, err = C.export(mk, c, tmp(), 2, { group_size = bad })
            assert.is_nil(oc)
            assert.truthy(err:find("the group size must be a positive integer", 1, true), err)
        end
        local oc, err = C.export(mk, c, tmp(), 3)
        assert.is_nil(oc)
        assert.truthy(err:find("unknown version 3", 1, true), err)
    end)

    -- export wrote out_path .. ".partial" with io.open "wb" (a predictable name
    -- that follows links) and renamed it: a link planted there received the file
    it("export never writes through a link at the old .partial name or at the path", function()
        if not need_core() then return end
        H.seed("formats export links")
        local function sh(cmd) local r = os.execute(cmd) return r == true or r == 0 end
        local cfg = CONFIGS[math.random(1, #CONFIGS)]
        local legacy, out, victim = tmp(), tmp(), tmp()
        local W = write_legacy(legacy, cfg)
        local secret = "the victim's own bytes " .. math.random(1, 1e9)
        H.write_file(victim, secret)
        os.remove(out)
        assert.is_true(sh(("ln -s '%s' '%s.partial'"):format(victim, out)))
        export(legacy, out, 1)
        assert.are.equal(secret, H.read_file(victim))
        assert.is_false(sh(("test -L '%s'"):format(out)), "the output is a link")
        assert.is_true(H.read_file(out) == ref_v1(cfg, W), "the output differs from export.py's")
        -- a link at the path itself is replaced by the file, its target untouched
        os.remove(out)
        assert.is_true(sh(("ln -s '%s' '%s'"):format(victim, out)))
        export(legacy, out, 1)
        assert.are.equal(secret, H.read_file(victim))
        assert.is_false(sh(("test -L '%s'"):format(out)), "the output is a link")
        assert.is_true(H.read_file(out) == ref_v1(cfg, W), "the output differs from export.py's")
    end)

    it("map(): version 1 gives the legacy tensors, version 2 q and scale that dequantize to them", function()
        if not need_core() then return end
        H.seed("formats map")
        for _, cfg in ipairs(CONFIGS) do
            local legacy, v1, v2, deq = tmp(), tmp(), tmp(), tmp()
            write_legacy(legacy, cfg)
            export(legacy, v1, 1)
            export(legacy, v2, 2)
            export(v2, deq, 0)
            local w0 = C.map(mk, assert(C.read_config(legacy)))
            local w1 = C.map(mk, assert(C.read_config(v1)))
            local c2 = assert(C.read_config(v2))
            local w2 = C.map(mk, c2)
            local wd = C.map(mk, assert(C.read_config(deq)))
            local function eq(a, b, what)
                assert.are.equal("float32", a.dtype, what)
                assert.are.same(b.shape, a.shape, what)
                assert.is_true(a:bytes() == b:bytes(), what)
            end
            local G = c2.group_size
            -- a quantized matrix: rows where G divides in, flat groups otherwise
            local function quantized(t, want, what)
                assert.are.same(want.shape, t.shape, what)
                assert.are.equal(G, t.group, what)
                assert.are.equal("int8", t.q.dtype)
                assert.are.equal("float32", t.scale.dtype)
                local out, inn = want.shape[1], want.shape[2]
                if inn % G == 0 then
                    assert.are.same({ out, inn }, t.q.shape, what)
                    assert.are.same({ out, P.idiv(inn, G) }, t.scale.shape, what)
                    eq(t.q:dequantize(t.scale), want, what)
                else
                    assert.are.same({ P.idiv(out * inn, G), G }, t.q.shape, what)
                    assert.are.same({ P.idiv(out * inn, G), 1 }, t.scale.shape, what)
                    eq(t.q:dequantize(t.scale):reshape({ out, inn }), want, what)
                end
                assert.is_true(t.q.readonly, what .. " is mapped")
                if cfg.dim % 4 == 0 then assert.is_true(t.scale.readonly, what .. "'s scales are mapped") end
            end
            eq(w1.token_embedding, w0.token_embedding, "v1 token_embedding")
            eq(w1.rms_final, w0.rms_final, "v1 rms_final")
            eq(w1.wcls, w0.wcls, "v1 wcls")
            assert.are.equal(cfg.shared, rawequal(w1.wcls, w1.token_embedding))
            eq(w2.token_embedding, wd.token_embedding, "v2 token_embedding (dequantized at load)")
            assert.is_false(w2.token_embedding.readonly)
            eq(w2.rms_final, w0.rms_final, "v2 rms_final")
            quantized(w2.wcls, wd.wcls, "v2 wcls")
            for l = 1, cfg.n_layers do
                for _, name in ipairs(C.LAYER_WEIGHTS) do
                    eq(w1.layers[l][name], w0.layers[l][name], "v1 " .. name)
                    if name:match("^rms") then
                        eq(w2.layers[l][name], w0.layers[l][name], "v2 " .. name)
                    else
                        quantized(w2.layers[l][name], wd.layers[l][name], "v2 " .. name .. " layer " .. l)
                    end
                end
            end
        end
    end)
end)

describe("llama2.c checkpoint versions on stories260K", function()
    local tmp = temp_paths()

    it("legacy → version 1 → legacy is byte-identical but for freq_cis (PyTorch's cos/sin, within an ulp)", function()
        if not need_core() or not need_models() then return end
        local src = H.models .. "/stories260K.bin"
        local v1, back = tmp(), tmp()
        export(src, v1, 1)
        assert.are.equal(1040384, assert(C.read_config(v1)).file_bytes)
        export(v1, back, 0)
        local a, b = H.read_file(src), H.read_file(back)
        assert.are.equal(#a, #b)
        -- freq_cis: seq_len 512 × head_size 8 floats after every other weight (shared classifier)
        local at = #a - 4 * 512 * 8
        assert.is_true(a:sub(1, at) == b:sub(1, at), "a weight changed")
        assert.is_true(b:sub(at + 1) == ref_freq_cis(8, 512))
        local differ = 0
        for i = at + 1, #a, 4 do
            local x, y = P.f32_at(a, i), P.f32_at(b, i)
            if x ~= y then
                differ = differ + 1
                local ulp = 2.0 ^ (math.floor(math.log(math.abs(x)) / math.log(2)) - 23)
                assert.is_true(math.abs(x - y) <= ulp * 1.0001, string.format("%.9g vs %.9g", x, y))
            end
        end
        assert.is_true(differ < 300, differ .. " values of freq_cis differ") -- measured: 199
        -- legacy → legacy copies the file's own block
        export(src, back, 0)
        assert.is_true(H.read_file(back) == a)
    end)

    local function story(path, args)
        local argv = { path, "-z", H.models .. "/tok512.bin", "-d", "cpu" }
        for _, a in ipairs(args) do argv[#argv + 1] = a end
        local out, err = {}, {}
        local code = llama2.main(argv, { mk = mk, stdout = function(s) out[#out + 1] = s end,
                                         stderr = function(s) err[#err + 1] = s end })
        assert.are.equal(0, code, table.concat(err))
        return table.concat(out), table.concat(err)
    end

    it("runs a version 1 export: run.c's golden text (-t 0 -n 200) and a sampled fixture", function()
        if not need_core() or not need_models() then return end
        local v1 = tmp()
        export(H.models .. "/stories260K.bin", v1, 1)
        local text, err = story(v1, { "-t", "0", "-n", "200" })
        assert.are.equal(H.read_file(H.models .. "/stories260K_t0_n200.expected.txt") .. "\n", text)
        assert.truthy(err:find("version 1 (float32)", 1, true), err)
        local sampled = H.read_file("spec/fixtures/stories260K_t1_p0.9_s42_n200.expected.txt") .. "\n"
        assert.are.equal(sampled, story(v1, { "-t", "1", "-p", "0.9", "-s", "42", "-n", "200" }))
        assert.are.equal(sampled, story(H.models .. "/stories260K.bin", { "-t", "1", "-p", "0.9", "-s", "42", "-n", "200" }))
    end)

    it("a version 2 export dequantized to legacy tells run.c's text for that file", function()
        if not need_core() or not need_models() then return end
        local v2, deq = tmp(), tmp()
        assert.are.equal(64, export(H.models .. "/stories260K.bin", v2, 2).group_size)
        assert.are.equal(278608, assert(C.read_config(v2)).file_bytes)
        export(v2, deq, 0)
        assert.are.equal(H.read_file("spec/fixtures/stories260K_q8_t0_n200.expected.txt") .. "\n",
            story(deq, { "-t", "0", "-n", "200" }))
        assert.are.equal(H.read_file("spec/fixtures/stories260K_q8_t1_p0.9_s42_n200.expected.txt") .. "\n",
            story(deq, { "-t", "1", "-p", "0.9", "-s", "42", "-n", "200" }))
    end)

    it("runs a version 2 file as it is (int8 folded into the products): the text of its dequantized weights", function()
        if not need_core() or not need_models() then return end
        local v2 = tmp()
        export(H.models .. "/stories260K.bin", v2, 2)
        local text, err = story(v2, { "-t", "0", "-n", "200" })
        assert.are.equal(H.read_file("spec/fixtures/stories260K_q8_t0_n200.expected.txt") .. "\n", text)
        assert.truthy(err:find("version 2 (int8 in groups of 64)", 1, true), err)
        assert.are.equal(H.read_file("spec/fixtures/stories260K_q8_t1_p0.9_s42_n200.expected.txt") .. "\n",
            story(v2, { "-t", "1", "-p", "0.9", "-s", "42", "-n", "200" }))
        -- -q converts a version 2 file too: fp32 is the dequantized weights in float32
        assert.are.equal(text, story(v2, { "-t", "0", "-n", "200", "-q", "fp32" }))
    end)

    it("-q q8a8 (int8 activations, W8A8) tells runq.c's text on a model whose dims the group divides", function()
        if not need_core() or not need_models() then return end
        local legacy, v2 = tmp(), tmp()
        H.write_w8a8_model(legacy)
        assert.are.equal(64, export(legacy, v2, 2).group_size)
        local greedy = H.read_file("spec/fixtures/w8a8_t0_n200.expected.txt") .. "\n"
        local sampled = H.read_file("spec/fixtures/w8a8_t1_p0.9_s42_n200.expected.txt") .. "\n"
        local text, err = story(v2, { "-t", "0", "-n", "200", "-q", "q8a8" })
        assert.are.equal(greedy, text)
        assert.truthy(err:find("weights in q8a8", 1, true), err)
        assert.are.equal(sampled, story(v2, { "-t", "1", "-p", "0.9", "-s", "42", "-n", "200", "-q", "q8a8" }))
        -- converted at load from the float32 file: the same weights as the export's
        assert.are.equal(greedy, story(legacy, { "-t", "0", "-n", "200", "-q", "q8a8" }))
        -- the fixture tells W8A8 apart: weight-only int8 parts from it
        assert.are_not.equal(greedy, story(v2, { "-t", "0", "-n", "200" }))
        -- every product (7 per layer and the classifier) takes A on the int8 grid
        local c = assert(C.read_config(v2))
        local net = llama2.build(mk, c, { device = "cpu", greedy = true, steps = 8, precision = "q8a8" })
        local report = net.model:fusion_report()
        local _, grids = report:gsub("A on the int8 grid in groups of 64", "")
        assert.are.equal(1 + 4 * c.n_layers, grids, report) -- qkv, wo, w1 w3, w2 per layer; wcls
    end)

    it("refuses -q q8a8 where the group does not divide a product's input (stories260K: 64 and hidden 172)", function()
        if not need_core() or not need_models() then return end
        local code, out, err = H.run_cli({ H.models .. "/stories260K.bin", "-z", H.models .. "/tok512.bin",
                                           "-q", "q8a8", "-d", "cpu", "-n", "8" })
        assert.are_not.equal(0, code)
        assert.are.equal("", out)
        assert.truthy(err:find("q8a8 needs the group size (64) to divide every product's input length; " ..
                               "layer 0's w2's is 172", 1, true), err)
        local v2 = tmp()
        export(H.models .. "/stories260K.bin", v2, 2)
        code, _, err = H.run_cli({ v2, "-z", H.models .. "/tok512.bin", "-q", "q8a8", "-d", "cpu", "-n", "8" })
        assert.are_not.equal(0, code)
        assert.truthy(err:find("layer 0's w2's is 172", 1, true), err)
    end)
end)

describe("bad version 1 and 2 files", function()
    local path
    before_each(function() path = os.tmpname() end)
    after_each(function() os.remove(path) end)

    local GOOD = { dim = 16, hidden_dim = 24, n_layers = 2, n_heads = 4, n_kv_heads = 2, vocab_size = 30,
                   seq_len = 8, shared = true }

    -- the size a header implies: norms, then matrices (v1 float32; v2 int8 + scales)
    local function body_bytes(cfg, version, group)
        local D, Hd, L, V = cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.vocab_size
        local kv = P.idiv(D, cfg.n_heads) * cfg.n_kv_heads
        local norms = (2 * L + 1) * D
        local mats = V * D + L * (2 * D * D + 2 * kv * D + 3 * Hd * D) + (cfg.shared and 0 or V * D)
        if version == 1 then return 4 * (norms + mats) end
        return 4 * norms + mats + 4 * (P.idiv(mats, group))
    end

    local function header(cfg, version, group, flag)
        local h = P.pack_array("i4", { MAGIC, version, cfg.dim, cfg.hidden_dim, cfg.n_layers,
                                       cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.seq_len }, 1, 9)
            .. string.char(flag or (cfg.shared and 1 or 0))
        if version == 2 then h = h .. P.pack_i32(group) end
        return h .. string.rep("\0", 256 - #h)
    end

    local function fails(bytes, ...)
        H.write_file(path, bytes)
        local c, err = C.read_config(path)
        assert.is_nil(c)
        assert.is_string(err)
        assert.is_nil(err:find("\n"), "one line: " .. err)
        assert.are.equal(path .. ": ", err:sub(1, #path + 2))
        for _, s in ipairs({ ... }) do assert.truthy(err:find(s, 1, true), err) end
        return err
    end

    it("accepts well-formed headers and sizes them as export.py writes", function()
        for _, shared in ipairs({ true, false }) do
            local cfg = {}
            for k, v in pairs(GOOD) do cfg[k] = v end
            cfg.shared = shared
            H.write_file(path, header(cfg, 1) .. string.rep("\0", body_bytes(cfg, 1)))
            local c = assert(C.read_config(path))
            assert.are.same({ 1, shared, 256 + body_bytes(cfg, 1) }, { c.version, c.shared_classifier, c.expected_bytes })
            assert.is_nil(c.group_size)
            H.write_file(path, header(cfg, 2, 8) .. string.rep("\0", body_bytes(cfg, 2, 8)))
            c = assert(C.read_config(path))
            assert.are.same({ 2, 8, shared, 256 + body_bytes(cfg, 2, 8) },
                { c.version, c.group_size, c.shared_classifier, c.expected_bytes })
            assert.truthy(C.describe(c):find("version 2 (int8 in groups of 8)", 1, true))
        end
    end)

    it("reads a wrong magic as a legacy header, which then fails", function()
        local bytes = header(GOOD, 1) .. string.rep("\0", body_bytes(GOOD, 1))
        fails(P.pack_u32(MAGIC + 1) .. bytes:sub(5), "bad checkpoint header")
        fails(P.pack_u32(0x616b3431) .. bytes:sub(5), "bad checkpoint header")
    end)

    it("refuses unknown versions", function()
        for _, v in ipairs({ 0, 3, -1, 0x10001 }) do
            fails(header(GOOD, v) .. string.rep("\0", 4096), "unknown checkpoint version " .. v,
                "versions 1 and 2 are known")
        end
    end)

    it("refuses truncated headers", function()
        local h1, h2 = header(GOOD, 1), header(GOOD, 2, 8)
        for _, n in ipairs({ 4, 7 }) do
            fails(h1:sub(1, n), "truncated checkpoint: " .. n .. " bytes", "256-byte header")
        end
        for _, n in ipairs({ 8, 40, 255 }) do
            fails(h1:sub(1, n), "truncated checkpoint: " .. n .. " bytes", "256-byte header of version 1")
            fails(h2:sub(1, n), "truncated checkpoint: " .. n .. " bytes", "256-byte header of version 2")
        end
    end)

    it("refuses a body shorter or longer than the header says", function()
        for _, v in ipairs({ 1, 2 }) do
            local need = 256 + body_bytes(GOOD, v, 8)
            for _, delta in ipairs({ -need + 256, -1, 1, 4096 }) do
                fails(header(GOOD, v, 8) .. string.rep("\0", need - 256 + delta),
                    string.format("checkpoint is %d bytes but its header", need + delta),
                    "version " .. v, "needs " .. need .. " bytes")
            end
        end
    end)

    it("refuses group sizes that are not positive or do not divide dim", function()
        local function with_group(g)
            return header(GOOD, 2, g) .. string.rep("\0", body_bytes(GOOD, 2, 8))
        end
        fails(with_group(0), "bad checkpoint header", "group size 0 must be positive")
        fails(with_group(-8), "group size -8 must be positive")
        fails(with_group(3), "group size 3 does not divide dim 16")
        fails(with_group(32), "group size 32 does not divide dim 16")
    end)

    it("refuses a negative vocab_size, a flag other than 0 or 1, and the legacy header checks", function()
        local cfg = {}
        for k, v in pairs(GOOD) do cfg[k] = v end
        cfg.vocab_size = -30
        fails(header(cfg, 1) .. string.rep("\0", 4096), "vocab_size must be positive in a version 1 checkpoint (got -30)")
        fails(header(GOOD, 1, nil, 2) .. string.rep("\0", body_bytes(GOOD, 1)), "shared_classifier flag is 2 (0 or 1)")
        cfg.vocab_size, cfg.n_kv_heads = 30, 3
        fails(header(cfg, 2, 8) .. string.rep("\0", 4096), "n_kv_heads 3 does not divide n_heads 4")
    end)
end)

describe("scripts/export.lua", function()
    local function run(args)
        local out, err = os.tmpname(), os.tmpname()
        local quoted = {}
        for i, a in ipairs(args) do quoted[i] = "'" .. a:gsub("'", "'\\''") .. "'" end
        local status, _, code = os.execute(string.format("%s scripts/export.lua %s >%s 2>%s </dev/null",
            os.getenv("LUA") or "lua5.4", table.concat(quoted, " "), out, err))
        if code == nil then code = math.floor(status / 256) end -- 5.1: the wait status
        local o, e = H.read_file(out), H.read_file(err)
        os.remove(out); os.remove(err)
        return code, o, e
    end

    it("converts and prints one line", function()
        if not need_core() then return end
        H.seed("formats cli")
        local legacy, v2, back = os.tmpname(), os.tmpname(), os.tmpname()
        local cfg = CONFIGS[3]
        local W = write_legacy(legacy, cfg)
        local code, out, err = run({ legacy, v2, "--version", "2", "--group-size", "48" })
        assert.are.equal(0, code, err)
        assert.are.equal("", err)
        assert.truthy(out:match("^[^\n]+ %(legacy, %d+ bytes%) %-> [^\n]+ %(version 2, int8 in groups of 24, %d+ bytes%) in %d+ ms\n$"), out)
        assert.is_true(H.read_file(v2) == ref_v2(cfg, W, 24))
        code, out, err = run({ v2, back, "--version", "1" })
        assert.are.equal(0, code, err)
        assert.truthy(out:find("(version 2, ", 1, true) and out:find("(version 1, ", 1, true), out)
        os.remove(legacy); os.remove(v2); os.remove(back)
    end)

    it("fails with exit code 1 and a message on stderr", function()
        if not need_core() then return end
        local missing = os.tmpname()
        os.remove(missing)
        local cases = {
            { { missing, "/tmp/x.bin", "--version", "1" }, missing .. ": cannot open checkpoint" },
            { { "a.bin", "--version", "1" }, "needs an input and an output file" },
            { { "a.bin", "b.bin" }, "needs --version 0|1|2" },
            { { "a.bin", "b.bin", "--version", "3" }, "--version takes 0, 1 or 2, got 3" },
            { { "a.bin", "b.bin", "--version", "2", "--group-size", "0" }, "--group-size takes a positive integer, got 0" },
            { { "a.bin", "b.bin", "--version", "1", "--group-size", "8" }, "--group-size is for --version 2 only" },
            { { "a.bin", "b.bin", "--version" }, "--version needs a value" },
            { { "a.bin", "b.bin", "-q" }, "unknown option -q" },
        }
        for _, case in ipairs(cases) do
            local code, out, err = run(case[1])
            assert.are.equal(1, code, err)
            assert.are.equal("", out)
            assert.truthy(err:find("^export: "), err)
            assert.truthy(err:find(case[2], 1, true), err)
        end
        local code, out = run({ "-h" })
        assert.are.equal(0, code)
        assert.truthy(out:find("^usage: lua scripts/export.lua IN OUT"))
    end)
end)
