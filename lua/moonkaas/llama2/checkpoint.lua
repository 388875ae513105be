-- moonkaas.llama2.checkpoint — llama2.c's legacy checkpoint format.
--
-- Layout (little endian), as run.c's memory_map_weights reads it:
--   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
--     (vocab_size < 0: the classifier is stored separately, "unshared")
--   float32 token_embedding_table  [vocab, dim]
--           rms_att_weight         [layers, dim]
--           wq                     [layers, dim, dim]        (each [out, in])
--           wk                     [layers, kv_dim, dim]
--           wv                     [layers, kv_dim, dim]
--           wo                     [layers, dim, dim]
--           rms_ffn_weight         [layers, dim]
--           w1                     [layers, hidden, dim]
--           w2                     [layers, dim, hidden]
--           w3                     [layers, hidden, dim]
--           rms_final_weight       [dim]
--           freq_cis_real, _imag   [seq_len, head_size / 2] each (legacy, skipped)
--           wcls                   [vocab, dim]              (unshared only)
-- head_size = dim / n_heads, kv_dim = head_size * n_kv_heads.
--
-- read_config needs only the 28-byte header (plain Lua); map() gives each
-- weight as an mmap-backed tensor through mk.from_file, so the weights are
-- never read into Lua strings.

local M = {}

M.HEADER_BYTES = 28
local FLOAT = 4

local FIELDS = { "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len" }
M.FIELDS = FIELDS

-- Element offsets (in floats, after the header) and shapes of every weight
-- block, in file order. Returns the list and the total float count.
function M.layout(c)
    local D, H, L, V = c.dim, c.hidden_dim, c.n_layers, c.vocab_size
    local kv, hs, S = c.kv_dim, c.head_size, c.seq_len
    local blocks = {
        { "token_embedding", { V, D } },
        { "rms_att", { L, D } },
        { "wq", { L, D, D } },
        { "wk", { L, kv, D } },
        { "wv", { L, kv, D } },
        { "wo", { L, D, D } },
        { "rms_ffn", { L, D } },
        { "w1", { L, H, D } },
        { "w2", { L, D, H } },
        { "w3", { L, H, D } },
        { "rms_final", { D } },
        { "freq_cis", { S, hs } },        -- legacy: real half then imaginary half
    }
    if not c.shared_classifier then blocks[#blocks + 1] = { "wcls", { V, D } } end
    local offset, out = 0, {}
    for _, b in ipairs(blocks) do
        local n = 1
        for _, d in ipairs(b[2]) do n = n * d end
        out[#out + 1] = { name = b[1], shape = b[2], offset = offset, count = n }
        out[b[1]] = out[#out]
        offset = offset + n
    end
    return out, offset
end

-- Checks a header table {dim=, ..., vocab_size= (signed)} and derives the
-- rest. Returns the config, or nil and the problem (without the file name).
function M.config_from_header(h)
    for _, k in ipairs(FIELDS) do
        local v = h[k]
        if math.type(v) ~= "integer" then return nil, k .. " is missing" end
        if k == "vocab_size" then
            if v == 0 then return nil, "vocab_size is 0" end
        elseif v <= 0 then
            return nil, string.format("%s must be positive (got %d)", k, v)
        end
    end
    local c = {}
    for _, k in ipairs(FIELDS) do c[k] = h[k] end
    c.shared_classifier = h.vocab_size > 0
    c.vocab_size = math.abs(h.vocab_size)
    if c.dim % c.n_heads ~= 0 then
        return nil, string.format("dim %d is not a multiple of n_heads %d", c.dim, c.n_heads)
    end
    if c.n_kv_heads > c.n_heads or c.n_heads % c.n_kv_heads ~= 0 then
        return nil, string.format("n_kv_heads %d does not divide n_heads %d", c.n_kv_heads, c.n_heads)
    end
    -- Each dimension fits in int32, but products can overflow: bound the size
    -- in floating point first (2^50 bytes is far beyond any real checkpoint).
    local approx = 1.0 * c.vocab_size * c.dim * 2 + 1.0 * c.n_layers * c.dim * (4.0 * c.dim + 3.0 * c.hidden_dim + 2)
                   + 1.0 * c.seq_len * c.dim
    if approx > 2.0 ^ 48 then
        return nil, string.format("the header implies about %.3g floats of weights; not a checkpoint", approx)
    end
    c.head_size = c.dim // c.n_heads
    if c.head_size % 2 ~= 0 then
        return nil, string.format("head size %d (dim / n_heads) is odd; RoPE rotates pairs", c.head_size)
    end
    c.kv_dim = c.head_size * c.n_kv_heads
    c.kv_mul = c.n_heads // c.n_kv_heads
    local _, floats = M.layout(c)
    c.expected_bytes = M.HEADER_BYTES + FLOAT * floats
    return c
end

local function describe(c)
    return string.format("dim %d, hidden %d, layers %d, heads %d, kv_heads %d, vocab %d%s, seq_len %d",
        c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
        c.shared_classifier and "" or " (unshared)", c.seq_len)
end
M.describe = describe

-- Reads and checks a checkpoint's header and size. Returns the config (with
-- path, file_bytes), or nil and a one-line message "<path>: <problem>".
function M.read_config(path)
    local f, err = io.open(path, "rb")
    if not f then
        local msg = err or "cannot open"
        if msg:sub(1, #path + 2) == path .. ": " then msg = msg:sub(#path + 3) end
        return nil, string.format("%s: cannot open checkpoint: %s", path, msg)
    end
    local head, rerr = f:read(M.HEADER_BYTES)
    if head == nil and rerr then
        f:close()
        return nil, string.format("%s: cannot read checkpoint: %s", path, rerr)
    end
    head = head or ""
    local size = f:seek("end")
    f:close()
    if not size then
        return nil, string.format("%s: cannot read checkpoint (not a regular file?)", path)
    end
    if #head < M.HEADER_BYTES then
        return nil, string.format("%s: truncated checkpoint: %d bytes, shorter than the %d-byte header",
                                  path, size, M.HEADER_BYTES)
    end
    local h, pos = {}, 1
    for _, k in ipairs(FIELDS) do h[k], pos = string.unpack("<i4", head, pos) end
    local c, problem = M.config_from_header(h)
    if not c then
        return nil, string.format("%s: bad checkpoint header: %s", path, problem)
    end
    if size ~= c.expected_bytes then
        return nil, string.format("%s: checkpoint is %d bytes but its header (%s) needs %d bytes%s",
            path, size, describe(c), c.expected_bytes,
            size < c.expected_bytes and " (truncated?)" or "")
    end
    c.path, c.file_bytes = path, size
    return c
end

-- Maps every weight of a checked config as mk.from_file tensors (float32).
-- Per-layer tensors are separate maps of the same file, so each layer's
-- matrix is a plain 2-D tensor:
--   w.token_embedding [V, D], w.rms_final [D], w.wcls [V, D] (the embedding
--   when shared), w.layers[l] = {rms_att [D], wq [D, D], wk [kv, D],
--   wv [kv, D], wo [D, D], rms_ffn [D], w1 [H, D], w2 [D, H], w3 [H, D]}.
function M.map(mk, c)
    local blocks = M.layout(c)
    local path = c.path
    local function tensor(offset_floats, shape)
        local ok, t = pcall(mk.from_file, path, {
            offset = M.HEADER_BYTES + FLOAT * offset_floats, dtype = "float32", shape = shape })
        if not ok then error(string.format("%s: cannot map weights: %s", path, tostring(t)), 0) end
        return t
    end
    local function whole(name)
        local b = blocks[name]
        return tensor(b.offset, b.shape)
    end
    local function per_layer(name, l)
        local b = blocks[name]
        local per = b.count // c.n_layers
        local shape = { table.unpack(b.shape, 2) }
        return tensor(b.offset + per * (l - 1), shape)
    end
    local w = { token_embedding = whole("token_embedding"), rms_final = whole("rms_final"), layers = {} }
    w.wcls = c.shared_classifier and w.token_embedding or whole("wcls")
    for l = 1, c.n_layers do
        local layer = {}
        for _, name in ipairs({ "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3" }) do
            layer[name] = per_layer(name, l)
        end
        w.layers[l] = layer
    end
    return w
end

return M
