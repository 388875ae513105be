-- moonkaas.llama2.model — the Llama-2 transformer as one moonkaas graph per step
-- (and one per prompt length: M.graph's opts.tokens, Transformer:prompt).
--
-- One evaluation = one token at one position, exactly run.c's forward():
--
--   inputs   token, pos, pos1 (= pos + 1): int64 [1]
--   x        = embedding(token)                                   [1, D]
--   per layer:
--     xb     = rms_norm(x, rms_att)                               [1, D]
--     q      = xb @ wq^T  → [heads, hs/2, 2], rotated (RoPE)      [heads, hs/2, 2]
--     k, v   = xb @ wk^T, xb @ wv^T; k rotated                    [1, kv_dim]
--     K, V   = caches [seq, kv_dim] (BufferTensors), row pos := k, v
--     att    = q [kv_heads, group, hs] @ K viewed [kv_heads, hs, seq]
--              → [kv_heads, group, seq], softmax over the first pos1 columns
--     o      = att @ V viewed [kv_heads, seq, hs] over the first pos1 rows → [1, D]
--     x      = x + o @ wo^T
--     x      = x + (silu(xb2 @ w1^T) * (xb2 @ w3^T)) @ w2^T,  xb2 = rms_norm(x, rms_ffn)
--   logits   = rms_norm(x, rms_final) @ wcls^T                    [1, V]
--   output   one of (opts.output):
--            "argmax"  argmax(logits), int64 [1] (greedy)
--            "sample"  run.c's sampler as a node: inputs rng (int64 [1], the
--                      xorshift state), temperature and topp (float32 [1]);
--                      outputs the token and the next state (int64 [1] each)
--            "logits"  the logits [V]
--
-- Weights stay in llama2.c's [out, in] layout and enter matmuls permuted:
-- the compiler takes a permuted operand as a strided view (no copy).
--
-- The attention reads the caches' first pos1 rows: the softmax leaves the
-- later columns out and the product with V stops at pos1 (matmul_prefix), so
-- rows past pos never count, whatever they hold. The scores are computed over
-- the whole cache where each node runs alone (fuse = false); the attention
-- group (on either device) computes only the first pos1.
--
-- RoPE: the table [seq_len, head_size] holds (cos, sin) pairs computed as
-- run.c does in float32: freq = 1 / 10000^(i / head_size) for even i,
-- val = pos * freq. Row pos is picked with an EmbeddingNode. The query's
-- table is pre-scaled by 1/sqrt(head_size), which folds run.c's division of
-- the scores into the rotation (one node less per layer).

local C = require("moonkaas.compat")
local idiv = C.idiv
local F = require("moonkaas.llama2.float32")
local f32 = F.f32

local M = {}

-- The RoPE tables as nested Lua tables [S][head_size] for positions [0, S)
-- (default seq_len): the plain rotation for keys and the one scaled by
-- 1/sqrt(head_size) for queries.
function M.rope_tables(c, S)
    local hs = c.head_size
    local inv_sqrt = 1.0 / f32(math.sqrt(hs))
    local freqs = {}
    for i = 0, hs - 2, 2 do
        local exponent = f32(i / hs)
        freqs[#freqs + 1] = f32(1.0 / f32(10000.0 ^ exponent))
    end
    local k_table, q_table = {}, {}
    for pos = 0, (S or c.seq_len) - 1 do
        local krow, qrow = {}, {}
        for j, freq in ipairs(freqs) do
            local val = f32(pos * freq)
            local fcr, fci = f32(math.cos(val)), f32(math.sin(val))
            krow[2 * j - 1], krow[2 * j] = fcr, fci
            qrow[2 * j - 1], qrow[2 * j] = fcr * inv_sqrt, fci * inv_sqrt
        end
        k_table[pos + 1], q_table[pos + 1] = krow, qrow
    end
    return k_table, q_table
end

-- A weight in int8 groups {q =, scale =, shape =, group =}, not a tensor.
local function is_quantized(t) return type(t) == "table" and t.q ~= nil end

-- The pieces of the graph over weights w, shared by M.graph and the batch's
-- graph (llama2/batch.lua), each weight's constant made once:
--   linear(x, weight, name)  x @ W^T for W [out, in] (int8 groups dequantized
--                            as read; opts.int8_inputs: x on their grid first)
--   vec(tensor, name)        a norm weight [D]
--   embed(token)             the rows of token ids [n] as float32 [n, D]
--   classifier(x)            the logits x @ wcls^T [n, V]
function M.parts(mk, c, w, opts)
    local made = {}
    local function constant(t, name)
        made[name] = made[name] or mk.constant(t, name)
        return made[name]
    end
    local function transposed(weight, name)   -- a weight [out, in] as a [in, out] view
        if mk.is_tensor(weight) then return constant(weight, name):permute({ 1, 0 }) end
        -- int8 in groups: q [out, in] with scale [out, in / group] dequantizes as it is
        -- read (the matrix-vector group folds it in); groups that straddle rows
        -- (q [out * in / group, group]) dequantize first, then take W's shape
        local q, sc = constant(weight.q, name .. "_q"), constant(weight.scale, name .. "_scale")
        if weight.q.shape[2] == weight.shape[2] then
            return q:permute({ 1, 0 }):dequantize(sc:permute({ 1, 0 }))
        end
        return q:dequantize(sc):reshape(weight.shape):permute({ 1, 0 })
    end
    local function vec(tensor, name)  -- a norm weight [D]
        return constant(tensor, name)
    end
    local on_grid = {}  -- x's FakeQuantize: one per input, read by its sibling products
    local function linear(x, weight, name)  -- x @ W^T, W [out, in]
        if opts.int8_inputs and not mk.is_tensor(weight) then
            on_grid[x] = on_grid[x] or x:fake_quantize(weight.group)
            x = on_grid[x]
        end
        return x:matmul(transposed(weight, name))
    end

    local emb -- the table [V, D] where it is float
    local function embed(token)
        if is_quantized(w.token_embedding) then -- int8 rows, dequantized by their scales' rows
            local t = w.token_embedding
            return mk.embedding(constant(t.q, "token_embedding_q"), token)
                :dequantize(mk.embedding(constant(t.scale, "token_embedding_scale"), token))
        end
        emb = constant(w.token_embedding, "token_embedding")
        local x = mk.embedding(emb, token)
        if w.token_embedding.dtype ~= "float32" then x = x:cast("float32") end
        return x
    end
    local function classifier(x)
        if emb and rawequal(w.wcls, w.token_embedding) then return x:matmul(emb:permute({ 1, 0 })) end
        return linear(x, w.wcls, "wcls")
    end
    return { linear = linear, vec = vec, embed = embed, classifier = classifier }
end

-- Builds the graph's output node (a list of two for "sample"). `w` is
-- checkpoint.map's table, `c` the config; opts.output the output (above,
-- default "logits"); opts.positions (default
-- seq_len) the positions the KV caches and RoPE tables hold; opts.int8_inputs
-- puts each int8 product's input on the int8 grid of its weights' groups
-- first (runq.c's W8A8: M.check_int8_inputs says where that is valid).
--
-- opts.tokens = T > 1 makes the prompt's graph (prefill): T tokens at
-- positions pos .. pos + T - 1 in one evaluation, their products real GEMMs
-- ([T, in] @ [in, out]) and the attention causal:
--   inputs    token int64 [T], pos [1], pos1 (= pos + T) [1], positions
--             (pos .. pos + T - 1) int64 [T], last (the row whose token is
--             the prompt's last, < T where the prompt is padded) int64 [1]
--   K, V      rows [pos, pos + T) written, all at once
--   att       q as [kv_heads, group * T, hs] @ K^T → [kv_heads, group, T, S],
--             causal_softmax(pos1): query t sees positions up to pos + t
--   o         att @ V over the first pos1 rows → [T, D]
--   output    the last row's, as a step's
-- opts.at_start: the prompt starts at position 0 (fed pos 0, pos1 T), so its
-- queries see the caches' first T rows only, the ones it writes: the scores
-- are [.., T, T] over those rows, not [.., T, S] over the whole caches (S / T
-- times less to score and softmax).
-- The caches are BufferTensors named l<i>_k_cache and l<i>_v_cache, so a
-- prompt model compiled with share = the step model writes the step model's.
function M.graph(mk, c, w, opts)
    local D, hs = c.dim, c.head_size
    local heads, kv_heads, kv_dim = c.n_heads, c.n_kv_heads, c.kv_dim
    local group, S, V = c.kv_mul, opts.positions or c.seq_len, c.vocab_size
    local T = opts.tokens or 1
    local cols = T > 1 and opts.at_start and T or S -- the cache rows a prompt's scores cover

    local token = mk.input("token", "int64", { T })
    local pos = mk.input("pos", "int64", { 1 })
    local pos1 = mk.input("pos1", "int64", { 1 })

    local k_table, q_table = M.rope_tables(c, S)
    local rope_k = mk.constant(mk.tensor(k_table), "rope_k")     -- [seq, hs]
    local rope_q = mk.constant(mk.tensor(q_table), "rope_q")     -- [seq, hs], scaled
    -- n heads' (cos, sin) pairs: [n, hs/2, 2] for a step, [T, n, hs/2, 2] for T tokens
    local function pairs_of(n) return T == 1 and { n, idiv(hs, 2), 2 } or { T, n, idiv(hs, 2), 2 } end
    local at = T == 1 and pos or mk.input("positions", "int64", { T })
    local fk = mk.embedding(rope_k, at):reshape(pairs_of(1))
    local fq = mk.embedding(rope_q, at):reshape(pairs_of(1))

    -- Attention of q [T, D] over the caches kc, vc [S, kv_dim] (their first
    -- cols rows) → [T, D].
    local function attention(q, kc, vc)
        if cols < S then kc, vc = kc:slice(0, cols), vc:slice(0, cols) end
        local kt = kc:reshape({ cols, kv_heads, hs }):permute({ 1, 2, 0 })      -- [kvh, hs, cols]
        local vt = vc:reshape({ cols, kv_heads, hs }):permute({ 1, 0, 2 })      -- [kvh, cols, hs]
        if T == 1 then
            local qg = q:reshape({ kv_heads, group, hs })                        -- [kvh, g, hs]
            local att = qg:matmul(kt):sliced_softmax(pos1)                      -- [kvh, g, S]
            return att:matmul_prefix(vt, pos1):reshape({ 1, D })                 -- [1, D]
        end
        local qg = q:reshape({ T, kv_heads, group, hs }):permute({ 1, 2, 0, 3 })
            :reshape({ kv_heads, group * T, hs })                                -- [kvh, g·T, hs]
        local att = qg:matmul(kt):reshape({ kv_heads, group, T, cols }):causal_softmax(pos1)
        local o = att:reshape({ kv_heads, group * T, cols }):matmul_prefix(vt, pos1) -- [kvh, g·T, hs]
        return o:reshape({ kv_heads, group, T, hs }):permute({ 2, 0, 1, 3 }):reshape({ T, D })
    end

    local parts = M.parts(mk, c, w, opts)
    local linear, vec = parts.linear, parts.vec
    local x = parts.embed(token)                                      -- [T, D]

    for l, lw in ipairs(w.layers) do
        local p = "l" .. (l - 1) .. "_"
        local xb = x:rms_norm(vec(lw.rms_att, p .. "rms_att"))        -- [T, D]
        local q = linear(xb, lw.wq, p .. "wq")                      -- [T, D]
        local k = linear(xb, lw.wk, p .. "wk")                      -- [T, kv_dim]
        local v = linear(xb, lw.wv, p .. "wv")                      -- [T, kv_dim]
        q = q:reshape(pairs_of(heads)):complex_mul(fq)               -- [(T,) heads, hs/2, 2]
        k = k:reshape(pairs_of(kv_heads)):complex_mul(fk):reshape({ T, kv_dim })

        local kc = mk.buffer("float32", { S, kv_dim }, p .. "k_cache"):replace(k, pos, pos1)  -- [S, kv_dim]
        local vc = mk.buffer("float32", { S, kv_dim }, p .. "v_cache"):replace(v, pos, pos1)  -- [S, kv_dim]
        x = x + linear(attention(q, kc, vc), lw.wo, p .. "wo")       -- [T, D]

        xb = x:rms_norm(vec(lw.rms_ffn, p .. "rms_ffn"))                       -- [T, D]
        local h1 = linear(xb, lw.w1, p .. "w1"):silu()                       -- [T, H]
        local h3 = linear(xb, lw.w3, p .. "w3")                              -- [T, H]
        x = x + linear(h1 * h3, lw.w2, p .. "w2")                          -- [T, D]
    end

    if T > 1 then x = mk.embedding(x, mk.input("last", "int64", { 1 })) end   -- [1, D]
    x = x:rms_norm(vec(w.rms_final, "rms_final"))                             -- [1, D]
    local logits = parts.classifier(x)                                        -- [1, V]
    if opts.output == "argmax" then
        return logits:argmax():reshape({ 1 })                                -- int64 [1]
    elseif opts.output == "sample" then
        local drawn = logits:reshape({ V }):sample(mk.input("rng", "int64", { 1 }),
            mk.input("temperature", "float32", { 1 }), mk.input("topp", "float32", { 1 }))
        return { drawn:slice(0, 1), drawn:slice(1, 2) }                      -- token, rng
    end
    return logits:reshape({ V })                                              -- [V]
end

-- ---------------------------------------------------------------------------
-- precision: the weights converted at load (scripts/llama2.lua -q)

-- q8a8: q8's weights, and each product's input quantized per group before
-- integer dot products (runq.c's W8A8).
M.PRECISIONS = { fp32 = "float32", bf16 = "bfloat16", fp16 = "float16", q8 = "q8", q8a8 = "q8" }


-- A weight [out, in] as float32: itself, or its int8 groups dequantized.
local function as_float32(mk, t)
    if not is_quantized(t) then return t.dtype == "float32" and t or t:to("float32") end
    local f = t.q:dequantize(t.scale)
    if f.shape[2] == t.shape[2] then return f end
    return mk.from_bytes(f:bytes(), "float32", t.shape)
end

-- llama2.c's group size: 64, halved until it divides dim (export.py's backoff).
function M.group_size(c)
    local g = 64
    while c.dim % g ~= 0 do g = idiv(g, 2) end
    return g
end

-- A float32 weight [out, in] in int8 groups of g consecutive values, as
-- checkpoint.map gives a v2 file's: along rows where g divides in, else flat.
local function quantized(mk, t, g)
    local out, inn = t.shape[1], t.shape[2]
    if inn % g == 0 then
        local q, sc = mk.quantize(t, g)
        return { q = q, scale = sc, shape = { out, inn }, group = g }
    end
    local flat = mk.from_bytes(t:bytes(), "float32", { idiv(out * inn, g), g })
    local q, sc = mk.quantize(flat, g)
    return { q = q, scale = sc, shape = { out, inn }, group = g }
end

-- checkpoint.map's weights in `precision` (a key of M.PRECISIONS; nil keeps
-- the file's): matrices converted, norms float32. For q8 the weights are
-- those of the file export --version 2 writes, read as a version 2 file is:
-- the token table's lookup reads its int8 groups dequantized (float32, as
-- runq.c), a shared classifier the groups themselves. Otherwise the token
-- table takes the low-precision float dtype.
-- opts.int8_table: a token table in int8 groups stays so, and the lookup
-- dequantizes the rows it reads (M.graph): the CPU's memory, where a float32
-- table would be the largest thing resident.
function M.convert_weights(mk, c, w, precision, opts)
    if precision == nil then return w end
    local int8_table = opts and opts.int8_table
    local want = M.PRECISIONS[precision]
    if not want then error("llama2: unknown precision " .. tostring(precision) .. " (fp32|bf16|fp16|q8|q8a8)", 2) end
    local g = M.group_size(c)
    local function convert(t)
        if want == "q8" then return is_quantized(t) and t or quantized(mk, t, g) end
        local f = as_float32(mk, t)
        return want == "float32" and f or f:to(want)
    end
    local shared = rawequal(w.wcls, w.token_embedding) or c.shared_classifier
    local out = { layers = {}, rms_final = w.rms_final }
    if want ~= "q8" then
        out.token_embedding = convert(as_float32(mk, w.token_embedding))
        out.wcls = shared and out.token_embedding or convert(w.wcls)
    elseif is_quantized(w.token_embedding) then -- checkpoint.map's quantize
        local q = w.token_embedding
        out.token_embedding = int8_table and q or as_float32(mk, q)
        out.wcls = shared and q or convert(w.wcls)
    elseif c.version == 2 then -- map() dequantized the table already
        out.token_embedding, out.wcls = w.token_embedding, w.wcls
    else
        local q = quantized(mk, as_float32(mk, w.token_embedding), g)
        out.token_embedding = as_float32(mk, q)
        out.wcls = shared and q or convert(w.wcls)
    end
    for l, lw in ipairs(w.layers) do
        local nl = { rms_att = lw.rms_att, rms_ffn = lw.rms_ffn }
        for _, name in ipairs({ "wq", "wk", "wv", "wo", "w1", "w2", "w3" }) do nl[name] = convert(lw[name]) end
        out.layers[l] = nl
    end
    return out
end

-- Where int8 inputs (W8A8) are valid for weights w: every product's weights
-- in int8 groups along its input, as runq.c reads them. llama2.c's exporter
-- only makes the group divide dim; where it does not divide hidden_dim
-- (stories260K: 64 and 172) runq.c reads past its groups, so that is refused.
function M.check_int8_inputs(c, w)
    local function check(t, what)
        if type(t) ~= "table" or t.q == nil then
            error(string.format("llama2: q8a8: %s is not int8 (use -q q8a8 or a version 2 file)", what), 0)
        end
        if t.shape[2] % t.group ~= 0 then
            error(string.format("llama2: q8a8 needs the group size (%d) to divide every product's input " ..
                                "length; %s's is %d (runq.c would read past its groups)", t.group, what,
                                t.shape[2]), 0)
        end
    end
    for l, lw in ipairs(w.layers) do
        for _, name in ipairs({ "wq", "wk", "wv", "wo", "w1", "w2", "w3" }) do
            check(lw[name], string.format("layer %d's %s", l - 1, name))
        end
    end
    if not rawequal(w.wcls, w.token_embedding) then check(w.wcls, "the classifier") end
end

local Transformer = {}
Transformer.__index = Transformer
M.Transformer = Transformer

-- Builds and compiles the model.
--   mk       the moonkaas module
--   c, w     checkpoint config and mapped weights
--   opts     device ("cpu" | "cuda"), cudnn (bool), output ("argmax" |
--            "sample" | "logits", see M.graph; greedy = true stands for
--            "argmax", the default is "logits"),
--            precision (fp32 | bf16 | fp16 | q8: the matrices converted at load;
--            q8a8: as q8, and the products' inputs on the int8 grid (W8A8);
--            default the file's own),
--            steps (the positions it will run, default and at most seq_len:
--            the KV caches hold that many, not the header's seq_len blindly),
--            log (function(msg) for progress, optional)
function M.build(mk, c, w, opts)
    opts = opts or {}
    local steps = opts.steps or c.seq_len
    if not C.isinteger(steps) or steps < 1 then
        error(string.format("llama2: steps must be a positive integer (got %s)", tostring(steps)), 2)
    end
    local output = opts.output or (opts.greedy and "argmax" or "logits")
    if output ~= "argmax" and output ~= "sample" and output ~= "logits" then
        error(string.format("llama2: output must be argmax, sample or logits (got %s)", tostring(output)), 2)
    end
    local self = setmetatable({
        positions = math.min(steps, c.seq_len),
        mk = mk, config = c, weights = w,
        output_kind = output, greedy = output == "argmax",
        device = opts.device or "cpu", cudnn = opts.cudnn and true or false,
        log = opts.log or function() end,
    }, Transformer)
    local t0 = M.clock()
    if opts.precision then
        w = M.convert_weights(mk, c, w, opts.precision, { int8_table = self.device == "cpu" })
        self.weights = w
        self.log(string.format("weights in %s (%.0f ms)", opts.precision, (M.clock() - t0) * 1000))
    end
    self.int8_inputs = opts.precision == "q8a8"
    if self.int8_inputs then M.check_int8_inputs(c, w) end
    self.output = M.graph(mk, c, w, { output = output, positions = self.positions,
                                      int8_inputs = self.int8_inputs })
    self.log(string.format("built the graph in %.0f ms", (M.clock() - t0) * 1000))
    self:compile()
    -- Per-step inputs, reused: a few bytes in per token.
    self.token_t = mk.tensor({ 0 }, "int64")
    self.pos_t = mk.tensor({ 0 }, "int64")
    self.pos1_t = mk.tensor({ 1 }, "int64")
    self.inputs = { token = self.token_t, pos = self.pos_t, pos1 = self.pos1_t }
    if output == "sample" then
        self.rng_t = mk.tensor({ 0 }, "int64")
        self.temperature_t = mk.tensor({ 1 }, "float32")
        self.topp_t = mk.tensor({ 1 }, "float32")
        self.inputs.rng, self.inputs.temperature, self.inputs.topp = self.rng_t, self.temperature_t, self.topp_t
    end
    self.out = nil      -- the output tensors, filled in place by every run
    return self
end

function Transformer:compile()
    local t0 = M.clock()
    -- A greedy or sampling model is a recurrence: its token is the next step's
    -- token (and the sampler's state the next state), the positions count up,
    -- so run_steps generates without leaving the model.
    local next
    if self.output_kind == "argmax" then
        next = { token = self.output, pos = 1, pos1 = 1 }
    elseif self.output_kind == "sample" then
        next = { token = self.output[1], rng = self.output[2], pos = 1, pos1 = 1 }
    end
    local ok, model = pcall(self.mk.compile, self.output,
                            { device = self.device, cudnn = self.cudnn, next = next })
    if not ok then error("compiling the llama2 graph failed: " .. tostring(model), 0) end
    self.model = model
    self.out = nil
    self.prompt_models = {} -- by length (negative: not at position 0): compiled again on first use
    local ok_stats, st = pcall(model.stats, model)
    if ok_stats and type(st) == "table" then
        self.log(string.format("%d nodes, %d launches per token, arena %.2f MB, buffers %.2f MB",
            st.nodes or 0, st.launches or 0, (st.arena_bytes or 0) / 1e6, (st.buffer_bytes or 0) / 1e6))
    end
    self.log(string.format("compiled for %s%s in %.0f ms", self.device, self.cudnn and " (cudnn)" or "",
                           (M.clock() - t0) * 1000))
end

-- Starts a new generation: the KV caches' buffers are zeroed (rows past pos
-- never count, see the header; a fresh start keeps every generation alike).
function Transformer:reset()
    self.model:reset()
end

-- Checks a step's token and position (for the caller of `fn`) and puts them
-- in the per-step input tensors.
function Transformer:set_inputs(fn, token, pos)
    local c = self.config
    if not C.isinteger(token) or token < 0 or token >= c.vocab_size then
        error(string.format("%s: token %s out of range [0, %d)", fn, tostring(token), c.vocab_size), 3)
    end
    if not C.isinteger(pos) or pos < 0 or pos >= self.positions then
        error(string.format("%s: position %s out of range [0, %d)", fn, tostring(pos), self.positions), 3)
    end
    self.token_t:set(1, token)
    self.pos_t:set(1, pos)
    self.pos1_t:set(1, pos + 1)
end

-- A sampling model reads the sampler's settings and state (smp: see
-- moonkaas.llama2.sampler) as inputs.
function Transformer:set_sampler(fn, smp)
    if self.output_kind ~= "sample" then return end
    if type(smp) ~= "table" or not C.isinteger(smp.state) then
        error(fn .. ": a sampling model needs the sampler (llama2.sampler)", 3)
    end
    self.rng_t:set(1, smp.state)
    self.temperature_t:set(1, smp.temperature)
    self.topp_t:set(1, smp.topp)
end

-- Runs `model` once on `inputs`, its outputs into `outs` (made on the first
-- run): the argmax id ("argmax"), the drawn id and the sampler's next state
-- ("sample"), or the logits as a 1-based Lua array of float32 values ("logits").
function Transformer:evaluate(model, inputs, outs)
    if not outs[1] then
        for i, info in ipairs(model:outputs()) do outs[i] = self.mk.zeros(info.dtype, info.shape) end
    end
    local out, state = model:run(inputs, C.unpack(outs))
    if self.output_kind == "logits" then return out:totable() end
    return C.tointeger(out:get(1)), state and C.tointeger(state:get(1))
end

-- Evaluates one step (see evaluate for what it returns; smp is left as it was).
function Transformer:forward(token, pos, smp)
    self:set_inputs("forward", token, pos)
    self:set_sampler("forward", smp)
    self.out = self.out or {}
    return self:evaluate(self.model, self.inputs, self.out)
end

-- The prompt's model for T tokens (M.graph's opts.tokens; at_start: for a
-- prompt at position 0), compiled on first use with share = the step model,
-- so it writes the step model's KV caches and uses its weights in place.
function Transformer:prompt_model(T, at_start)
    local key = at_start and T or -T
    local pm = self.prompt_models[key]
    if pm then return pm end
    local mk, t0 = self.mk, M.clock()
    local output = M.graph(mk, self.config, self.weights, { output = self.output_kind, tokens = T,
        positions = self.positions, int8_inputs = self.int8_inputs, at_start = at_start })
    local ok, model = pcall(mk.compile, output, { device = self.device, cudnn = self.cudnn, share = self.model })
    if not ok then error(string.format("compiling the llama2 prompt graph of %d tokens failed: %s", T, model), 0) end
    pm = { model = model, outs = {}, token = mk.zeros("int64", { T }), positions = mk.zeros("int64", { T }),
           pos = mk.zeros("int64", { 1 }), pos1 = mk.zeros("int64", { 1 }), last = mk.zeros("int64", { 1 }) }
    pm.inputs = { token = pm.token, positions = pm.positions, pos = pm.pos, pos1 = pm.pos1, last = pm.last,
                  rng = self.rng_t, temperature = self.temperature_t, topp = self.topp_t }
    self.prompt_models[key] = pm
    self.log(string.format("compiled the prompt graph of %d tokens%s in %.0f ms", T,
        at_start and " at position 0" or "", (M.clock() - t0) * 1000))
    return pm
end

-- The longest prompt one evaluation takes; longer ones go in pieces.
M.PROMPT_TOKENS = 512

-- Feeds tokens (a 1-based Lua array of ids) at positions pos, pos + 1, ... in
-- as few evaluations as it can (prefill) and returns what forward returns for
-- the last one. A prompt of n tokens runs in a model for the next power of
-- two (padded with token 0, whose rows a later step overwrites), at most
-- M.PROMPT_TOKENS a piece, or for exactly n where padding would pass the
-- caches' end; a last piece of one token is a step.
function Transformer:prompt(tokens, pos, smp)
    local n = #tokens
    if n == 0 then error("prompt: no tokens", 2) end
    for i = 1, n do self:set_inputs("prompt", tokens[i], pos + i - 1) end -- checks each
    self:set_sampler("prompt", smp)
    local at = 1
    while n - at + 1 > 1 do
        local left, p = n - at + 1, pos + at - 1
        local T = 2
        while T < left and T < M.PROMPT_TOKENS do T = T * 2 end
        local count = math.min(left, T)
        if p + T > self.positions then T = count end
        local pm = self:prompt_model(T, p == 0)
        for i = 1, T do
            pm.token:set(i, i <= count and tokens[at + i - 1] or 0)
            pm.positions:set(i, p + i - 1)
        end
        pm.pos:set(1, p)
        pm.pos1:set(1, p + T)
        pm.last:set(1, count - 1)
        at = at + count
        local id, state = self:evaluate(pm.model, pm.inputs, pm.outs) -- before the last: the caches
        if at > n then return id, state end
    end
    return self:forward(tokens[n], pos + n - 1, smp)
end

-- The token after a prompt (its tokens at pos, pos + 1, ...), as run.c's
-- sample() picks it after the last; the sampler's state advances once, as
-- run.c's does.
function Transformer:prefill(tokens, pos, smp)
    if self.output_kind == "logits" then return smp:sample(self:prompt(tokens, pos)) end
    local id, state = self:prompt(tokens, pos, smp)
    if state then smp.state = state end
    return id
end

-- The token after `token` at `pos` (a prompt of one: one step).
function Transformer:next_token(token, pos, smp)
    return self:prefill({ token }, pos, smp)
end

-- Runs up to n steps from (token, pos) in one call (run_steps): each step's
-- token (the argmax, or the sampler's draw) is the next step's, inside the
-- model. Returns the ids generated (a 1-based Lua array of 0-based token
-- ids), ending with `stop` (an id, optional) where the model gave it; never
-- past the positions it holds. A sampling model starts from smp's state and
-- leaves smp at the state after the last step.
function Transformer:steps(token, pos, n, stop, smp)
    if self.output_kind == "logits" then
        error("steps: the model's output is the logits (build it with output = argmax or sample)", 2)
    end
    self:set_inputs("steps", token, pos)
    self:set_sampler("steps", smp)
    n = math.min(n, self.positions - pos)
    self.step_outs = self.step_outs or {}
    local outs = self.step_outs[n] -- reused: the usual chunk allocates once
    local opts = stop and { stop = { output = 1, value = stop } } or nil
    local got, k = self.model:run_steps(n, self.inputs, outs, opts)
    self.step_outs[n] = got
    local ids = {}
    for i = 1, k do ids[i] = C.tointeger(got[1]:get(i, 1)) end
    if got[2] and k > 0 then smp.state = C.tointeger(got[2]:get(k, 1)) end
    return ids
end

-- A batch of opts.slots sequences decoded together on this model's weights
-- (moonkaas.llama2.batch): b:add, b:step, b:remove.
function Transformer:batch(opts)
    return require("moonkaas.llama2.batch").new(self, opts)
end

-- Wall-clock seconds (monotonic).
function M.clock()
    return require("moonkaas").clock()
end

return M
