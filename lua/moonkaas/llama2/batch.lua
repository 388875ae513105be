-- moonkaas.llama2.batch — B sequences decoded in one evaluation a step
-- (continuous batching): net:batch{slots = B}.
--
-- The graph (M.graph) takes one token for each of B slots and gives each
-- slot's next one:
--
--   inputs   token, pos, pos1 (= pos + 1), rng: int64 [B]; temperature,
--            topp: float32 [B] (slot j's are element j)
--   blocks   the slots in blocks of `rows` rows (opts.rows: ROWS[device] by
--            default, or B, one block): per block and layer the products are
--            [rows, D] @ W. Up to ROWS rows they are matrix–vector groups,
--            which read each weight once for the block's rows and sum every
--            row as a one-row product does (the CPU's groups are
--            order-stable), so a slot's values are those of the
--            one-sequence model, bit for bit; a block of more rows is one
--            matrix product (BLAS, cuBLAS), which reads the weights once for
--            all of them and sums in its own order
--   caches   per layer, K and V each a [B, kv_heads, S, head_size]
--            BufferTensor (batch_l<i>_k_cache, batch_l<i>_v_cache): the step's k and v
--            rows of every slot go in at the slot's own pos by one
--            ReplaceAtNode each
--   attention per layer, one group over the batch: the queries [B kv_heads,
--            group, head_size] against the caches' rows, sliced_softmax and
--            matmul_prefix bounded by pos1 [B] (one prefix a slot's heads),
--            each slot reading only its own rows
--   output   "sample": the logits [B, V] through one SampleNode, row j with
--            slot j's rng, temperature and topp (temperature 0 is the
--            argmax): the drawn token and next state as row j of [B, 2];
--            "logits": the logits [B, V] (Lua 5.1, whose numbers cannot carry
--            the 64-bit state: the Lua sampler draws)
--
-- A block's rows join the batch's (the q, k and v of every block before
-- attention) by row writes into a [B, ..] buffer at constant bounds.
-- Rows past a slot's pos never count (as in the one-sequence model), so a
-- freed slot is reused without clearing its caches: the next sequence
-- writes row 0 before it reads it. An idle slot runs token 0 at position 0
-- (writing only its own caches' first row), greedy, and its result is dropped.
--
-- A prompt is fed one token a step (the slot's outputs are dropped until its
-- last prompt token, and its sampler is not drawn: run.c's generate), so a
-- sequence joins or leaves between any two steps without recompiling.

local C = require("moonkaas.compat")
local idiv = C.idiv
local model = require("moonkaas.llama2.model")

local M = {}

-- Slots per block by device: the most rows of A its matrix–vector groups
-- take (mk_target.matvec_rows: MK_MATVEC_ROWS on the CPU, MK_MATVEC_ROWS_MAX
-- on CUDA); more would go to BLAS or cuBLAS, whose sums run in another order
-- than a one-row product's.
M.ROWS = { cpu = 4, cuda = 16 }

-- The batch's graph for opts.slots slots (see the header): its output node.
-- opts: slots, positions (the caches' rows), rows (slots a block), output
-- ("sample" | "logits"), int8_inputs (as model.graph).
function M.graph(mk, c, w, opts)
    local D, hs, V = c.dim, c.head_size, c.vocab_size
    local heads, kv_heads, kv_dim, group = c.n_heads, c.n_kv_heads, c.kv_dim, c.kv_mul
    local B, S, ROWS = opts.slots, opts.positions, opts.rows
    local token = mk.input("token", "int64", { B })
    local pos = mk.input("pos", "int64", { B })
    local pos1 = mk.input("pos1", "int64", { B })
    local rng, temperature, topp
    if opts.output == "sample" then
        rng = mk.input("rng", "int64", { B })
        temperature, topp = mk.input("temperature", "float32", { B }), mk.input("topp", "float32", { B })
    end
    local k_table, q_table = model.rope_tables(c, S)
    local rope_k = mk.constant(mk.tensor(k_table), "rope_k")     -- [S, hs]
    local rope_q = mk.constant(mk.tensor(q_table), "rope_q")     -- [S, hs], scaled
    local parts = model.parts(mk, c, w, opts)
    local linear, vec = parts.linear, parts.vec

    local bounds = {} -- constant int64 [1] tensors: row r of a buffer is [r, r + 1)
    local function at(r)
        bounds[r] = bounds[r] or mk.constant(mk.tensor({ r }, "int64"))
        return bounds[r]
    end
    -- The blocks' rows (a list of [n, ...] nodes, in order) as one [B, ...]
    -- node: each block written into a buffer of that shape, named `name`.
    local blocks = {}
    for first = 0, B - 1, ROWS do blocks[#blocks + 1] = { first = first, n = math.min(ROWS, B - first) } end
    local function join(parts_, dtype, shape, name)
        if #parts_ == 1 then return parts_[1] end
        local buf = mk.buffer(dtype, shape, name)
        for i, part in ipairs(parts_) do
            local b = blocks[i]
            buf = buf:replace(part, at(b.first), at(b.first + b.n))
        end
        return buf
    end
    -- The batch's attention at layer prefix p: q [B, D], k and v [B, kv_dim]
    -- -> [B, D]; the rows go into the caches at pos, each slot's heads attend
    -- over its first pos1 rows.
    local function attention(q, k, v, p)
        local kc = mk.buffer("float32", { B, kv_heads, S, hs }, "batch_" .. p .. "k_cache")
            :replace_at(k:reshape({ B, kv_heads, hs }), pos, 2)
        local vc = mk.buffer("float32", { B, kv_heads, S, hs }, "batch_" .. p .. "v_cache")
            :replace_at(v:reshape({ B, kv_heads, hs }), pos, 2)
        local kt = kc:reshape({ B * kv_heads, S, hs }):permute({ 0, 2, 1 })          -- [B kvh, hs, S]
        local att = q:reshape({ B * kv_heads, group, hs }):matmul(kt):sliced_softmax(pos1) -- [B kvh, g, S]
        return att:matmul_prefix(vc:reshape({ B * kv_heads, S, hs }), pos1):reshape({ B, D })
    end

    local function pairs_of(n, h) return { n, h, idiv(hs, 2), 2 } end
    local xs, fk, fq = {}, {}, {} -- per block: its rows of the residual, its rotations
    for i, b in ipairs(blocks) do
        local positions = pos:slice(b.first, b.first + b.n)
        fk[i] = mk.embedding(rope_k, positions):reshape(pairs_of(b.n, 1))   -- [n, 1, hs/2, 2]
        fq[i] = mk.embedding(rope_q, positions):reshape(pairs_of(b.n, 1))
        xs[i] = parts.embed(token:slice(b.first, b.first + b.n))            -- [n, D]
    end
    for l, lw in ipairs(w.layers) do
        local p = "l" .. (l - 1) .. "_"
        local qs, ks, vs = {}, {}, {}
        for i, b in ipairs(blocks) do
            local xb = xs[i]:rms_norm(vec(lw.rms_att, p .. "rms_att"))
            local q = linear(xb, lw.wq, p .. "wq")                            -- [n, D]
            local k = linear(xb, lw.wk, p .. "wk")                            -- [n, kv_dim]
            vs[i] = linear(xb, lw.wv, p .. "wv")
            qs[i] = q:reshape(pairs_of(b.n, heads)):complex_mul(fq[i]):reshape({ b.n, D })
            ks[i] = k:reshape(pairs_of(b.n, kv_heads)):complex_mul(fk[i]):reshape({ b.n, kv_dim })
        end
        local o = attention(join(qs, "float32", { B, D }, "batch_" .. p .. "q"),
                            join(ks, "float32", { B, kv_dim }, "batch_" .. p .. "k"),
                            join(vs, "float32", { B, kv_dim }, "batch_" .. p .. "v"), p)
        for i, b in ipairs(blocks) do
            local x = xs[i]
            x = x + linear(#blocks == 1 and o or o:slice(b.first, b.first + b.n), lw.wo, p .. "wo") -- [n, D]
            local xb = x:rms_norm(vec(lw.rms_ffn, p .. "rms_ffn"))
            local h1 = linear(xb, lw.w1, p .. "w1"):silu()
            local h3 = linear(xb, lw.w3, p .. "w3")
            xs[i] = x + linear(h1 * h3, lw.w2, p .. "w2")
        end
    end
    local logits = {} -- per block: [n, V]
    for i in ipairs(blocks) do logits[i] = parts.classifier(xs[i]:rms_norm(vec(w.rms_final, "rms_final"))) end
    if opts.output == "logits" then return join(logits, "float32", { B, V }, "batch_logits") end
    -- every slot's row through its own sampler state, temperature and top-p:
    -- (token, state) as row j of [B, 2]
    return join(logits, "float32", { B, V }, "batch_logits"):sample(rng:reshape({ B, 1 }), temperature, topp)
end

local Batch = {}
Batch.__index = Batch
M.Batch = Batch

-- net:batch(opts): see doc/llama2.md. opts: slots (B >= 1), rows (slots a
-- block of products, see the header), tokenizer (for text prompts), output ("sample", or "logits" where the Lua sampler draws;
-- Lua 5.1 has only "logits").
function M.new(net, opts)
    opts = opts or {}
    local slots = opts.slots
    if not C.isinteger(slots) or slots < 1 then
        error(string.format("batch: slots must be an integer >= 1 (got %s)", tostring(slots)), 3)
    end
    local output = opts.output or (C.lua51 and "logits" or "sample")
    if output ~= "sample" and output ~= "logits" then
        error(string.format("batch: output must be sample or logits (got %s)", tostring(output)), 3)
    end
    if output == "sample" and C.lua51 then
        error("batch: output sample needs 64-bit integers (Lua 5.3+); use logits", 3)
    end
    local rows = opts.rows or M.ROWS[net.device] or M.ROWS.cpu
    if not C.isinteger(rows) or rows < 1 then
        error(string.format("batch: rows must be an integer >= 1 (got %s)", tostring(rows)), 3)
    end
    local mk, t0 = net.mk, model.clock()
    local out = M.graph(mk, net.config, net.weights, { slots = slots, positions = net.positions, rows = rows,
        output = output, int8_inputs = net.int8_inputs })
    local ok, m = pcall(mk.compile, out, { device = net.device, cudnn = net.cudnn, share = net.model })
    if not ok then error(string.format("compiling the llama2 batch of %d slots failed: %s", slots, m), 0) end
    net.log(string.format("compiled the batch of %d slots in %.0f ms", slots, (model.clock() - t0) * 1000))
    local self = setmetatable({
        net = net, mk = mk, model = m, slots = slots, output_kind = output, tokenizer = opts.tokenizer,
        seqs = {},        -- by slot (1-based): the sequence there, or nil
        by_id = {}, next_id = 1,
        inputs = {
            token = mk.zeros("int64", { slots }), pos = mk.zeros("int64", { slots }),
            pos1 = mk.zeros("int64", { slots }),
        },
    }, Batch)
    if output == "sample" then
        self.inputs.rng = mk.zeros("int64", { slots })
        self.inputs.temperature = mk.zeros("float32", { slots })
        self.inputs.topp = mk.zeros("float32", { slots })
        self.out = mk.zeros("int64", { slots, 2 })
    else
        self.out = mk.zeros("float32", { slots, net.config.vocab_size })
    end
    return self
end

-- Starts a sequence: prompt (token ids, a 1-based list, or text where the
-- batch has a tokenizer: encoded with BOS as generate does) and smp (its
-- llama2.sampler, whose state the batch advances). Returns its id. The
-- first free slot takes it.
function Batch:add(prompt, smp)
    local ids = prompt
    if type(prompt) == "string" then
        if not self.tokenizer then error("batch:add: a text prompt needs the batch's tokenizer (opts.tokenizer)", 2) end
        ids = self.tokenizer:encode(prompt, true, false)
    end
    if type(ids) ~= "table" or #ids == 0 then error("batch:add: the prompt has no tokens", 2) end
    local V, P = self.net.config.vocab_size, self.net.positions
    if #ids > P then
        error(string.format("batch:add: the prompt has %d tokens, more than the %d positions", #ids, P), 2)
    end
    for i, t in ipairs(ids) do
        if not C.isinteger(t) or t < 0 or t >= V then
            error(string.format("batch:add: prompt token %d (%s) out of range [0, %d)", i, tostring(t), V), 2)
        end
    end
    if type(smp) ~= "table" or not smp.temperature or smp.state == nil then
        error("batch:add: the sequence needs its sampler (llama2.sampler)", 2)
    end
    local slot
    for j = 1, self.slots do
        if not self.seqs[j] then slot = j break end
    end
    if not slot then error(string.format("batch:add: all %d slots are taken", self.slots), 2) end
    local id = self.next_id
    self.next_id = id + 1
    local seq = { id = id, slot = slot, prompt = { C.unpack(ids) }, pos = 0, token = ids[1], smp = smp }
    self.seqs[slot], self.by_id[id] = seq, seq
    return id
end

-- Ends sequence id; its slot takes the next add.
function Batch:remove(id)
    local seq = self.by_id[id]
    if not seq then error(string.format("batch:remove: no sequence %s", tostring(id)), 2) end
    self.seqs[seq.slot], self.by_id[id] = nil, nil
end

-- The sequences running: a count.
function Batch:count()
    local n = 0
    for _ in pairs(self.by_id) do n = n + 1 end
    return n
end

-- One token for every sequence, in one evaluation: a list, in slot order, of
-- {id =, token =, pos =} (pos the token's position), with prompt = true
-- while the token is the prompt's own, and done = true when the sequence
-- has filled the positions (it is removed then).
function Batch:step()
    local n = self:count()
    if n == 0 then error("batch:step: no sequences (add one first)", 2) end
    local inp, sample = self.inputs, self.output_kind == "sample"
    for j = 1, self.slots do
        local seq = self.seqs[j]
        inp.token:set(j, seq and seq.token or 0)
        inp.pos:set(j, seq and seq.pos or 0)
        inp.pos1:set(j, seq and seq.pos + 1 or 1)
        if sample then
            local smp = seq and seq.smp
            inp.rng:set(j, smp and smp.state or 0)
            inp.temperature:set(j, smp and smp.temperature or 0)
            inp.topp:set(j, smp and smp.topp or 0)
        end
    end
    local out = self.model:run(inp, self.out)
    local made, P = {}, self.net.positions
    for j = 1, self.slots do
        local seq = self.seqs[j]
        if seq then
            local r = { id = seq.id, pos = seq.pos + 1 }
            if seq.pos + 2 <= #seq.prompt then -- still inside the prompt: its next token
                r.token, r.prompt = seq.prompt[seq.pos + 2], true
            elseif sample then
                r.token = C.tointeger(out:get(j, 1))
                seq.smp.state = C.tointeger(out:get(j, 2))
            else
                local row = {}
                for t = 1, self.net.config.vocab_size do row[t] = out:get(j, t) end
                r.token = seq.smp:sample(row)
            end
            seq.pos, seq.token = seq.pos + 1, r.token
            if seq.pos >= P then
                r.done = true
                self:remove(seq.id)
            end
            made[#made + 1] = r
        end
    end
    return made
end

return M
