-- moonkaas.llama2.checkpoint — llama2.c's checkpoint formats: legacy (v0),
-- version 1 (float32) and version 2 (int8 groups), as llama2.c's export.py
-- writes them and run.c (legacy) and runq.c (v2) read them.
--
-- Little endian throughout. head_size = dim / n_heads,
-- kv_dim = head_size * n_kv_heads; every matrix is [out, in].
--
-- Legacy (version 0), run.c's memory_map_weights:
--   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
--     (28 bytes; vocab_size < 0: the classifier is stored separately, "unshared")
--   float32 token_embedding_table  [vocab, dim]
--           rms_att_weight         [layers, dim]
--           wq                     [layers, dim, dim]
--           wk                     [layers, kv_dim, dim]
--           wv                     [layers, kv_dim, dim]
--           wo                     [layers, dim, dim]
--           rms_ffn_weight         [layers, dim]
--           w1                     [layers, hidden, dim]
--           w2                     [layers, dim, hidden]
--           w3                     [layers, hidden, dim]
--           rms_final_weight       [dim]
--           freq_cis_real, _imag   [seq_len, head_size / 2] each (skipped)
--           wcls                   [vocab, dim]              (unshared only)
--
-- Version 1 (export.py's version1_export; float32, 256-byte header):
--   uint32 magic 0x616b3432 ("ak42"), int32 version = 1,
--   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size (> 0), seq_len,
--   uint8 shared_classifier (0 or 1), zeros up to byte 256
--   float32 rms_att [layers, dim], rms_ffn [layers, dim], rms_final [dim],
--           token_embedding [vocab, dim], wq, wk, wv, wo, w1, w2, w3 (each
--           [layers, out, in] as above), wcls [vocab, dim] (unshared only)
--   No freq_cis.
--
-- Version 2 (version2_export; runq.c): the header of version 1 with
--   int32 group_size (GS) right after the flag byte (offset 37, unaligned),
--   zeros up to byte 256; then
--   float32 rms_att [layers, dim], rms_ffn [layers, dim], rms_final [dim]
--   then each of token_embedding, wq ×layers, wk ×layers, wv ×layers,
--   wo ×layers, w1 ×layers, w2 ×layers, w3 ×layers, wcls (unshared only) as
--     int8    q      [numel]        the values, in [-127, 127]
--     float32 scale  [numel / GS]   one per GS consecutive values (flat
--                                   order: a group may straddle rows)
--   so W[i] = q[i] * scale[i // GS] over W's flat elements. export.py halves
--   GS from 64 until it divides dim, so it divides every matrix's numel.
--
-- read_config needs only the header (plain Lua): the first 4 bytes equal to
-- the magic mean version 1 or 2, anything else is a legacy file. map() gives
-- each weight as an mmap-backed tensor through mk.from_file, so the weights
-- are never read into Lua strings (the one exception: see map()).

local C = require("moonkaas.compat")
local idiv = C.idiv

local M = {}

M.HEADER_BYTES = 28        -- legacy header
M.MAGIC = 0x616b3432       -- "ak42" as a little-endian uint32
M.VERSION_HEADER_BYTES = 256
local FLOAT = 4

local FIELDS = { "dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len" }
M.FIELDS = FIELDS

M.LAYER_WEIGHTS = { "rms_att", "wq", "wk", "wv", "wo", "rms_ffn", "w1", "w2", "w3" }
M.MATRICES = { "wq", "wk", "wv", "wo", "w1", "w2", "w3" }

-- Element offsets (in floats, after the 28-byte header) and shapes of every
-- weight block of a legacy file, in file order. Returns the list (also keyed
-- by name) and the total float count.
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

-- The shape of one weight (per layer for the layer weights) of config c.
function M.shape_of(c, name)
    local D, H, V, kv = c.dim, c.hidden_dim, c.vocab_size, c.kv_dim
    local shapes = {
        token_embedding = { V, D }, wcls = { V, D }, rms_final = { D }, rms_att = { D }, rms_ffn = { D },
        wq = { D, D }, wk = { kv, D }, wv = { kv, D }, wo = { D, D },
        w1 = { H, D }, w2 = { D, H }, w3 = { H, D },
        freq_cis = { c.seq_len, c.head_size },  -- legacy: [S, hs/2] real, then [S, hs/2] imaginary
    }
    return shapes[name]
end

-- The order of the weights in a file of each version; a trailing * marks
-- the ones stored layer after layer.
local ORDER = {
    [0] = { "token_embedding", "rms_att*", "wq*", "wk*", "wv*", "wo*", "rms_ffn*", "w1*", "w2*", "w3*",
            "rms_final", "freq_cis", "wcls" },
    [1] = { "rms_att*", "rms_ffn*", "rms_final", "token_embedding", "wq*", "wk*", "wv*", "wo*", "w1*",
            "w2*", "w3*", "wcls" },
}
ORDER[2] = ORDER[1]

local function numel(shape)
    local n = 1
    for _, d in ipairs(shape) do n = n * d end
    return n
end

-- Every weight of config c (its version, shared_classifier, group_size) in
-- file order, per layer for the layer weights. Each entry:
--   name, layer (1-based; nil for the others), shape (of one layer's weight),
--   count (its elements), offset (bytes from the start of the file), and
--   quantized = true for version 2's matrices, whose int8 values take count
--   bytes at offset and whose float32 scales (count / group_size of them)
--   follow at scale_offset.
-- Returns the list and the file size it implies.
function M.blocks(c)
    local version = c.version or 0
    local offset = version == 0 and M.HEADER_BYTES or M.VERSION_HEADER_BYTES
    local out = {}
    for _, spec in ipairs(ORDER[version]) do
        local name = spec:gsub("%*$", "")
        if name ~= "wcls" or not c.shared_classifier then
            local shape = M.shape_of(c, name)
            local count = numel(shape)
            for l = 1, spec:sub(-1) == "*" and c.n_layers or 1 do
                local b = { name = name, layer = spec:sub(-1) == "*" and l or nil, shape = shape,
                            count = count, offset = offset }
                if version == 2 and shape[2] then -- a matrix
                    b.quantized = true
                    b.scale_offset = offset + count
                    offset = b.scale_offset + FLOAT * idiv(count, c.group_size)
                else
                    offset = offset + FLOAT * count
                end
                out[#out + 1] = b
            end
        end
    end
    return out, offset
end

-- The bytes of a file of config c: what blocks() adds up, without listing
-- every layer's weights (a header may claim millions of layers).
function M.file_size(c)
    local version = c.version or 0
    local bytes = version == 0 and M.HEADER_BYTES or M.VERSION_HEADER_BYTES
    for _, spec in ipairs(ORDER[version]) do
        local name = spec:gsub("%*$", "")
        if name ~= "wcls" or not c.shared_classifier then
            local shape = M.shape_of(c, name)
            local count = numel(shape)
            local each = (version == 2 and shape[2]) and count + FLOAT * idiv(count, c.group_size) or FLOAT * count
            bytes = bytes + each * (spec:sub(-1) == "*" and c.n_layers or 1)
        end
    end
    return bytes
end

-- Checks a header table {dim=, ..., vocab_size= (signed)} and derives the
-- rest. A legacy header by default; h.version (1 or 2) with
-- h.shared_classifier (the flag byte) and, for 2, h.group_size describe the
-- newer ones. Returns the config, or nil and the problem (without the file
-- name).
function M.config_from_header(h)
    local version = h.version or 0
    for _, k in ipairs(FIELDS) do
        local v = h[k]
        if not C.isinteger(v) then return nil, k .. " is missing" end
        if k == "vocab_size" then
            if v == 0 then return nil, "vocab_size is 0" end
            if v < 0 and version > 0 then
                return nil, string.format("vocab_size must be positive in a version %d checkpoint (got %d)",
                                          version, v)
            end
        elseif v <= 0 then
            return nil, string.format("%s must be positive (got %d)", k, v)
        end
    end
    local c = { version = version }
    for _, k in ipairs(FIELDS) do c[k] = h[k] end
    c.vocab_size = math.abs(h.vocab_size)
    if version == 0 then
        c.shared_classifier = h.vocab_size > 0
    else
        if h.shared_classifier ~= 0 and h.shared_classifier ~= 1 then
            return nil, string.format("the shared_classifier flag is %s (0 or 1)", tostring(h.shared_classifier))
        end
        c.shared_classifier = h.shared_classifier == 1
    end
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
    c.head_size = idiv(c.dim, c.n_heads)
    if c.head_size % 2 ~= 0 then
        return nil, string.format("head size %d (dim / n_heads) is odd; RoPE rotates pairs", c.head_size)
    end
    c.kv_dim = c.head_size * c.n_kv_heads
    c.kv_mul = idiv(c.n_heads, c.n_kv_heads)
    if version == 2 then
        local gs = h.group_size
        if not C.isinteger(gs) then return nil, "group_size is missing" end
        if gs <= 0 then return nil, string.format("group size %d must be positive", gs) end
        -- export.py's guarantee (it halves 64 until it divides dim): every
        -- matrix, having dim as one side, then splits into whole groups
        if c.dim % gs ~= 0 then
            return nil, string.format("group size %d does not divide dim %d", gs, c.dim)
        end
        c.group_size = gs
    end
    c.header_bytes = version == 0 and M.HEADER_BYTES or M.VERSION_HEADER_BYTES
    c.expected_bytes = M.file_size(c)
    return c
end

local function describe(c)
    local version = ""
    if (c.version or 0) == 1 then version = ", version 1 (float32)"
    elseif c.version == 2 then version = string.format(", version 2 (int8 in groups of %d)", c.group_size) end
    return string.format("dim %d, hidden %d, layers %d, heads %d, kv_heads %d, vocab %d%s, seq_len %d%s",
        c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
        c.shared_classifier and "" or " (unshared)", c.seq_len, version)
end
M.describe = describe

-- The header fields of a file's first bytes `head` (up to 256; `size` the
-- whole file's, for the message): a legacy header, or the magic and a
-- version 1 or 2 header. Returns config_from_header's argument, or nil and
-- the problem (without the file name).
function M.parse_header(head, size)
    local h = {}
    if #head >= 4 and C.u32(head, 1) == M.MAGIC then
        if #head < 8 then
            return nil, string.format("truncated checkpoint: %d bytes, shorter than the %d-byte header " ..
                                      "(magic 'ak42', no version)", size, M.VERSION_HEADER_BYTES)
        end
        h.version = C.i32(head, 5)
        if h.version ~= 1 and h.version ~= 2 then
            return nil, string.format("unknown checkpoint version %d (magic 'ak42'; versions 1 and 2 " ..
                                      "are known)", h.version)
        end
        if #head < M.VERSION_HEADER_BYTES then
            return nil, string.format("truncated checkpoint: %d bytes, shorter than the %d-byte header " ..
                                      "of version %d", size, M.VERSION_HEADER_BYTES, h.version)
        end
        local pos = 9
        for _, k in ipairs(FIELDS) do h[k], pos = C.i32(head, pos), pos + 4 end
        h.shared_classifier, pos = head:byte(pos), pos + 1
        if h.version == 2 then h.group_size = C.i32(head, pos) end
    else
        if #head < M.HEADER_BYTES then
            return nil, string.format("truncated checkpoint: %d bytes, shorter than the %d-byte header",
                                      size, M.HEADER_BYTES)
        end
        local pos = 1
        for _, k in ipairs(FIELDS) do h[k], pos = C.i32(head, pos), pos + 4 end
    end
    return h
end

-- Reads and checks a checkpoint's header and size. Returns the config (with
-- path, file_bytes, version 0/1/2, header_bytes, expected_bytes,
-- shared_classifier and, for version 2, group_size), or nil and a one-line
-- message "<path>: <problem>".
function M.read_config(path)
    local f, err = io.open(path, "rb")
    if not f then
        local msg = err or "cannot open"
        if msg:sub(1, #path + 2) == path .. ": " then msg = msg:sub(#path + 3) end
        return nil, string.format("%s: cannot open checkpoint: %s", path, msg)
    end
    local head, rerr = f:read(M.VERSION_HEADER_BYTES)
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
    local h, problem = M.parse_header(head, size)
    if not h then return nil, string.format("%s: %s", path, problem) end
    local c
    c, problem = M.config_from_header(h)
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

-- Maps every weight of a checked config as mk.from_file tensors. The result
-- has the same shape for every version:
--   w.token_embedding [V, D], w.rms_final [D], w.wcls [V, D],
--   w.layers[l] = {rms_att [D], wq [D, D], wk [kv, D], wv [kv, D],
--   wo [D, D], rms_ffn [D], w1 [H, D], w2 [D, H], w3 [H, D]}
-- Versions 0 and 1: every weight a float32 tensor, w.wcls the embedding
-- itself when shared. Each layer's matrix is its own 2-D map of the file.
-- Version 2: the norms are float32; each matrix W [out, in] is a table
--   {q = int8 tensor, scale = float32 tensor, shape = {out, in}, group = GS}
-- with, where GS divides in, q [out, in] and scale [out, in / GS] (groups
-- along rows: q:dequantize(scale) is W), else q [out * in / GS, GS] and
-- scale [out * in / GS, 1] (flat groups straddling rows: dequantize, then
-- reshape to {out, in}). w.token_embedding is float32 [V, D], dequantized
-- here as runq.c does (the lookup table); w.wcls is the quantized classifier,
-- the embedding's own q and scale when shared.
-- The one copy: a scale block that does not start on a 4-byte boundary (a
-- model whose matrices' element counts are not multiples of 4, possible only
-- where dim is not) cannot be a float32 window; its bytes are read and copied.
-- A checkpoint up to 64 MiB is read into memory, a larger one mapped (a mapped
-- file truncated by another process ends the host at the next read of a lost
-- page); with opts.copy any checkpoint is read (mk.from_file's copy).
-- opts.quantize = GS (-q q8 at load): every matrix comes as the table above,
-- a float32 file's read straight into int8 groups of GS (mk.quantize_file:
-- its float32 values are never all in memory), and the token table stays
-- quantized; the norms are read alone.
function M.map(mk, c, opts)
    local path, copy = c.path, opts and opts.copy or nil
    local group = opts and opts.quantize or nil
    local function tensor(offset, dtype, shape)
        local ok, t = pcall(mk.from_file, path, { offset = offset, dtype = dtype, shape = shape, copy = copy })
        if not ok then error(string.format("%s: cannot map weights: %s", path, tostring(t)), 0) end
        return t
    end
    local function unaligned_floats(offset, shape)
        local f = assert(io.open(path, "rb"))
        f:seek("set", offset)
        local bytes = f:read(FLOAT * numel(shape))
        f:close()
        return mk.from_bytes(bytes, "float32", shape)
    end
    local function quantized(b)
        local out, inn, g = b.shape[1], b.shape[2], c.group_size
        local qshape, sshape = { out, inn }, { out, idiv(inn, g) }
        if inn % g ~= 0 then qshape, sshape = { idiv(b.count, g), g }, { idiv(b.count, g), 1 } end
        local scale = b.scale_offset % FLOAT == 0 and tensor(b.scale_offset, "float32", sshape)
                      or unaligned_floats(b.scale_offset, sshape)
        return { q = tensor(b.offset, "int8", qshape), scale = scale, shape = { out, inn }, group = g }
    end
    -- A float32 matrix read straight into int8 groups of `group` (along its
    -- rows where the group divides them, else over the flat values, as
    -- export.py writes version 2), the float32 values never all in memory.
    local function quantized_floats(b)
        local out, inn = b.shape[1], b.shape[2]
        local shape = inn % group == 0 and { out, inn } or { idiv(b.count, group), group }
        local q, scale = mk.quantize_file(path, { offset = b.offset, shape = shape, group = group })
        return { q = q, scale = scale, shape = { out, inn }, group = group }
    end
    local function block(b)
        if b.quantized then return quantized(b) end
        if group and b.shape[2] then return quantized_floats(b) end
        -- with quantize: norms read alone, so nothing holds the whole file
        if group then return unaligned_floats(b.offset, b.shape) end
        return tensor(b.offset, "float32", b.shape)
    end
    local w = { layers = {} }
    for l = 1, c.n_layers do w.layers[l] = {} end
    for _, b in ipairs(M.blocks(c)) do
        if b.name ~= "freq_cis" then
            local t = block(b)
            if b.layer then w.layers[b.layer][b.name] = t else w[b.name] = t end
        end
    end
    if c.version == 2 and not group then
        local q = w.token_embedding
        w.token_embedding = q.q:dequantize(q.scale)
        if c.shared_classifier then w.wcls = q end
    elseif c.shared_classifier then
        w.wcls = w.token_embedding
    end
    return w
end

-- ---------------------------------------------------------------------------
-- writing: any version to any (scripts/export.lua is the command line)

-- export.py's group size for version 2: `start` (default 64) halved until it
-- divides dim. nil and the problem for a start that is not a positive integer.
function M.backoff_group_size(dim, start)
    local g = start or 64
    if not C.isinteger(g) or g <= 0 then
        return nil, string.format("the group size must be a positive integer, got %s", tostring(start))
    end
    while dim % g ~= 0 do g = idiv(g, 2) end
    return g
end

-- The header of config c in its version: 28 bytes, or 256 with the magic.
function M.header(c)
    local v = c.vocab_size
    if c.version == 0 then
        return C.pack_array("i4", { c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                                    c.shared_classifier and v or -v, c.seq_len }, 1, 7)
    end
    local h = C.pack_array("i4", { M.MAGIC, c.version, c.dim, c.hidden_dim, c.n_layers,
                                   c.n_heads, c.n_kv_heads, v, c.seq_len }, 1, 9)
        .. string.char(c.shared_classifier and 1 or 0)
    if c.version == 2 then h = h .. C.pack_i32(c.group_size) end
    return h .. string.rep("\0", M.VERSION_HEADER_BYTES - #h)
end

-- The legacy freq_cis block of c, as llama2.c's model.py computes it
-- (precompute_freqs_cis, float32 throughout): freq_i = 1 / 10000^(2i / hs),
-- cos then sin of pos * freq_i for pos in [0, seq_len), i in [0, hs / 2).
-- Each operation is rounded to float32 from its exact (double) value; the
-- cos and sin are the correctly rounded ones, where PyTorch's vectorised
-- float32 cos/sin are within an ulp of them (stories260K's own block differs
-- from this in 199 of its 4,096 values, by one ulp: run.c never reads it).
function M.freq_cis_bytes(c)
    local f32 = C.f32
    local hs, S = c.head_size, c.seq_len
    local freqs = {}
    for i = 0, idiv(hs, 2) - 1 do
        freqs[i + 1] = f32(1.0 / f32(10000.0 ^ f32(f32(2 * i) / hs)))
    end
    local parts = {}
    for _, fn in ipairs({ math.cos, math.sin }) do
        local row = {}
        for pos = 0, S - 1 do
            for i, freq in ipairs(freqs) do row[i] = fn(f32(pos * freq)) end
            parts[#parts + 1] = C.pack_array("f", row, 1, #row)
        end
    end
    return table.concat(parts)
end

local CHUNK = 1048576 -- elements per write

local function write_tensor(put, t)
    for i = 1, t.numel, CHUNK do
        put(t:bytes(i, math.min(t.numel, i + CHUNK - 1)))
    end
end

-- Converts the checked checkpoint `c` (read_config's) into a file of
-- `version` (0, 1 or 2) at out_path, as llama2.c's export.py would have
-- written it from the same weights: the classifier shared or not as in c;
-- version 2 quantizes every matrix (the token embedding and classifier too)
-- over its flat elements in groups of opts.group_size (default 64, halved
-- until it divides dim, export.py's backoff) with mk.quantize's rule, the
-- norms float32; a version 2 input's matrices are dequantized (q × scale in
-- float32) for versions 0 and 1, and copied as they are for version 2 with
-- the same group size; a legacy output's freq_cis block is copied from a
-- legacy input, else computed (M.freq_cis_bytes). Reads through mk.from_file,
-- writes through mk.file_writer (the file whole or not at all, never through
-- a planted link). Returns the output config (with file_bytes), or nil and a
-- message.
function M.export(mk, c, out_path, version, opts)
    opts = opts or {}
    if version ~= 0 and version ~= 1 and version ~= 2 then
        return nil, string.format("unknown version %s (0 legacy, 1 float32, 2 int8)", tostring(version))
    end
    local oc = {}
    for k, v in pairs(c) do oc[k] = v end
    oc.version, oc.group_size, oc.path, oc.file_bytes = version, nil, out_path, nil
    if version == 2 then
        local g, problem = M.backoff_group_size(c.dim, opts.group_size)
        if not g then return nil, problem end
        oc.group_size = g
    end
    local blocks, bytes = M.blocks(oc)
    oc.expected_bytes, oc.header_bytes = bytes, version == 0 and M.HEADER_BYTES or M.VERSION_HEADER_BYTES

    -- the input's weights, flat: {t = float32 [n]} or {q = int8 [n], scale = float32 [n / g], group = g}
    local path = c.path
    local function map(offset, dtype, n)
        local ok, t = pcall(mk.from_file, path, { offset = offset, dtype = dtype, shape = { n } })
        if ok then return t end
        if dtype == "float32" and offset % FLOAT ~= 0 then -- an unaligned scale block (see map())
            local f = assert(io.open(path, "rb"))
            f:seek("set", offset)
            local s = f:read(FLOAT * n)
            f:close()
            return mk.from_bytes(s, "float32", { n })
        end
        error(string.format("%s: cannot map weights: %s", path, tostring(t)), 0)
    end
    local src = {}
    for _, b in ipairs(M.blocks(c)) do
        local key = b.name .. (b.layer or "")
        if b.quantized then
            src[key] = { q = map(b.offset, "int8", b.count), group = c.group_size,
                         scale = map(b.scale_offset, "float32", idiv(b.count, c.group_size)) }
        else
            src[key] = { t = map(b.offset, "float32", b.count) }
        end
    end
    src.wcls = src.wcls or src.token_embedding
    local function float_of(s) return s.t or s.q:dequantize(s.scale) end

    -- mk.file_writer: a temporary file of an unpredictable name beside out_path
    -- (never through a link planted there), fsync'd and renamed over it
    local okw, f = pcall(mk.file_writer, out_path)
    if not okw then return nil, string.format("cannot write %s: %s", out_path, tostring(f)) end
    local size = 0
    local function put(s)
        f:write(s)
        size = size + #s
    end
    local ok, werr = pcall(function()
        put(M.header(oc))
        for _, b in ipairs(blocks) do
            local s = src[b.name .. (b.layer or "")]
            if b.name == "freq_cis" then
                if s then write_tensor(put, s.t) else put(M.freq_cis_bytes(oc)) end
            elseif b.quantized and s.q and s.group == oc.group_size then
                write_tensor(put, s.q)
                write_tensor(put, s.scale)
            elseif b.quantized then
                local q, scale = mk.quantize(float_of(s), oc.group_size)
                write_tensor(put, q)
                write_tensor(put, scale)
            else
                write_tensor(put, float_of(s))
            end
        end
        if size ~= bytes then
            error(string.format("internal error: wrote %d bytes to %s, the layout needs %d", size,
                                out_path, bytes), 0)
        end
        f:commit()
    end)
    if not ok then
        f:abort()
        if tostring(werr):find("^internal error") then return nil, werr end
        return nil, string.format("cannot write %s: %s", out_path, tostring(werr))
    end
    oc.file_bytes = size
    return oc
end

return M
