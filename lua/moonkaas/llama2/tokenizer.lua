-- moonkaas.llama2.tokenizer — llama2.c's byte-pair tokenizer (tokenizer.bin format).
--
-- File layout (little endian):
--   int32 max_token_length
--   vocab_size records of { float32 score, int32 len, len bytes }
-- The vocabulary size is not in the file: it comes from the checkpoint, and
-- extra records after it are ignored, as run.c does.
--
-- encode and decode follow run.c exactly:
--   encode: BOS (1) if asked, a dummy-prefix " " token unless the text is
--           empty, one token per UTF-8 code point found in the vocabulary
--           (otherwise one `<0xNN>` token per byte, id = byte + 3), then
--           greedy merges of the adjacent pair whose concatenation is the
--           vocabulary entry with the highest score (the leftmost on ties),
--           EOS (2) if asked.
--   decode: the piece of a token, its leading space dropped after BOS, and a
--           `<0xNN>` piece turned into that raw byte.
-- Strings are C strings in run.c: a vocabulary entry or a text stops at its
-- first NUL byte here too.
--
-- Pure Lua; no moonkaas core needed.

local f32 = require("moonkaas.llama2.float32").f32

local C = require("moonkaas.compat")
local u32, i32, f32_at = C.u32, C.i32, C.f32_at
local find, sub, byte, rep = string.find, string.sub, string.byte, string.rep

local M = {}

-- t[first..last] (integers in [0, 2^32)) as one string of little-endian
-- uint32, packed 2,048 at a time.
local function pack_ints(t, first, last)
    return C.pack_array("I4", t, first, last)
end

local Tokenizer = {}
Tokenizer.__index = Tokenizer
M.Tokenizer = Tokenizer

local BOS, EOS = 1, 2
M.BOS, M.EOS = BOS, EOS

local function cstring(s)
    local nul = s:find("\0", 1, true)
    return nul and s:sub(1, nul - 1) or s
end

-- Parses tokenizer.bin bytes. `name` labels errors (the path). Returns a
-- Tokenizer, or nil and a one-line message naming the file and the problem.
function M.parse(bytes, vocab_size, name)
    name = name or "tokenizer"
    if not C.isinteger(vocab_size) or vocab_size < 1 then
        return nil, string.format("%s: vocabulary size must be a positive integer (got %s)",
                                  name, tostring(vocab_size))
    end
    if #bytes < 4 then
        return nil, string.format("%s: truncated: %d bytes, no room for the 4-byte header", name, #bytes)
    end
    local max_token_length, pos = i32(bytes, 1), 5
    if max_token_length < 1 then
        return nil, string.format("%s: corrupt header: max_token_length %d is not positive",
                                  name, max_token_length)
    end
    -- Each piece stays in `bytes` where the file has it; `index` packs its
    -- offset and length (up to its first NUL) per id, 1,024 ids at a time.
    -- No string per piece: for tokenizer.bin's 32,000 that is 0.9 MB, where a
    -- table of pieces, one of scores and a map from piece to id took 3 MB.
    local parts, buf, nbuf = {}, {}, 0
    local size = #bytes
    for id = 0, vocab_size - 1 do
        if pos + 7 > size then
            return nil, string.format("%s: truncated in token %d of %d (the model's vocabulary)",
                                      name, id, vocab_size)
        end
        local score, len
        score, len, pos = f32_at(bytes, pos), i32(bytes, pos + 4), pos + 8
        if len < 0 then
            return nil, string.format("%s: corrupt token %d: negative length %d", name, id, len)
        end
        if score ~= score then
            return nil, string.format("%s: corrupt token %d: score is NaN", name, id)
        end
        if pos + len - 1 > size then
            return nil, string.format("%s: truncated in token %d of %d (the model's vocabulary)",
                                      name, id, vocab_size)
        end
        -- the next record's length field holds a zero byte: this find stops soon
        local nul = find(bytes, "\0", pos, true)
        buf[nbuf + 1], buf[nbuf + 2] = pos, (nul and nul < pos + len) and nul - pos or len
        nbuf = nbuf + 2
        if nbuf == CHUNK then
            parts[#parts + 1] = pack_ints(buf, 1, nbuf)
            nbuf = 0
        end
        pos = pos + len
    end
    if nbuf > 0 then parts[#parts + 1] = pack_ints(buf, 1, nbuf) end
    if pos <= size then
        -- run.c would read the first vocab_size pieces and ignore the rest: the
        -- text would be another model's pieces for these ids
        return nil, string.format("%s: holds more than the model's %d tokens (%d bytes follow "
            .. "token %d): a tokenizer for another model?", name, vocab_size, size - pos + 1,
            vocab_size - 1)
    end
    if vocab_size <= EOS then
        -- encode emits BOS (1) and EOS (2): ids such a vocabulary cannot decode
        return nil, string.format("%s: a vocabulary of %d token%s has no BOS (1) and EOS (2) tokens",
                                  name, vocab_size, vocab_size == 1 and "" or "s")
    end
    local t = setmetatable({
        bytes = bytes,              -- the file, which holds the pieces and their scores
        index = table.concat(parts), -- per id from 0: I4 offset into bytes, I4 length
        vocab_size = vocab_size,
        max_token_length = max_token_length,
        buckets = nil,              -- the lookup, built on first encode (Tokenizer:find)
        bucket_ids = nil,
        n_buckets = nil,
    }, Tokenizer)
    return t
end

-- io.open's message starts with the path; the callers' messages already do.
function M.strip_path(msg, path)
    if msg:sub(1, #path + 2) == path .. ": " then return msg:sub(#path + 3) end
    return msg
end

-- Reads and parses a tokenizer file; errors as in M.parse.
function M.load(path, vocab_size)
    local f, err = io.open(path, "rb")
    if not f then
        return nil, string.format("%s: cannot open tokenizer: %s", path, M.strip_path(err, path))
    end
    local bytes = f:read("*a")
    f:close()
    if not bytes then
        return nil, string.format("%s: cannot read tokenizer", path)
    end
    return M.parse(bytes, vocab_size, path)
end

-- The piece of token id (0-based, in range), and its float32 merge score.
function Tokenizer:piece(id)
    local at, len = u32(self.index, 8 * id + 1), u32(self.index, 8 * id + 5)
    return sub(self.bytes, at, at + len - 1)
end

function Tokenizer:score(id)
    return f32_at(self.bytes, u32(self.index, 8 * id + 1) - 8)
end

-- The bucket (0-based) among n, n a power of two, of the piece s[i..j]: a
-- hash of its bytes.
local function bucket_of(s, i, j, n)
    local h = j - i + 1
    for k = i, j do h = (h * 31 + byte(s, k)) % 0x1000000 end
    return h % n
end

-- The id of `piece`, or nil. run.c finds pieces by binary search over the
-- strcmp-sorted vocabulary; with no duplicate pieces (true of tok512.bin and
-- tokenizer.bin) a hash lookup answers the same. With duplicates this one
-- keeps the lowest id. The lookup packs the ids by bucket, in id order (a
-- counting sort), with each bucket's first position: no string per piece.
function Tokenizer:find(piece)
    if not self.buckets then
        local n = 1
        while n * 2 <= self.vocab_size do n = n * 2 end
        local bytes, index = self.bytes, self.index
        local function bucket(id)
            local at, len = u32(index, 8 * id + 1), u32(index, 8 * id + 5)
            return bucket_of(bytes, at, at + len - 1, n)
        end
        local first, fill, order = {}, {}, {}
        for b = 0, n do first[b], fill[b] = 0, 0 end
        for id = 0, self.vocab_size - 1 do
            local b = bucket(id) + 1
            first[b] = first[b] + 1
        end
        for b = 1, n do first[b] = first[b] + first[b - 1] end
        for id = 0, self.vocab_size - 1 do
            local b = bucket(id)
            order[first[b] + fill[b] + 1] = id
            fill[b] = fill[b] + 1
        end
        self.bucket_ids = pack_ints(order, 1, #order)
        self.buckets = pack_ints(first, 0, n)
        self.n_buckets = n
    end
    local b = bucket_of(piece, 1, #piece, self.n_buckets)
    local lo, hi = u32(self.buckets, 4 * b + 1), u32(self.buckets, 4 * b + 5)
    for k = lo, hi - 1 do
        local id = u32(self.bucket_ids, 4 * k + 1)
        if self:piece(id) == piece then return id end
    end
    return nil
end

-- Encodes `text` (bytes, UTF-8 expected) into a 1-based array of token ids.
-- Raises an error only where run.c would read out of bounds (a vocabulary
-- without " " or too small for byte fallback).
function Tokenizer:encode(text, bos, eos)
    if type(text) ~= "string" then
        error("tokenizer: encode needs a string, got " .. type(text), 2)
    end
    text = cstring(text)
    local tokens, n = {}, 0
    if bos then n = n + 1; tokens[n] = BOS end
    if #text > 0 then
        local space = self:find(" ")
        if not space then
            error("tokenizer: the vocabulary has no \" \" piece for the dummy prefix", 0)
        end
        n = n + 1; tokens[n] = space
    end

    -- One code point at a time: a leading byte and at most 3 continuation
    -- bytes (a longer run of continuation bytes starts a new buffer).
    local i, len = 1, #text
    while i <= len do
        local j = i
        while j < len and j - i + 1 < 4 and text:byte(j + 1) >= 0x80 and text:byte(j + 1) < 0xC0 do j = j + 1 end
        local piece = text:sub(i, j)
        local id = self:find(piece)
        if id then
            n = n + 1; tokens[n] = id
        else
            for k = i, j do
                local byte_id = text:byte(k) + 3
                if byte_id >= self.vocab_size then
                    error(string.format("tokenizer: byte 0x%02X has no <0x..> token in a vocabulary of %d",
                                        byte_id - 3, self.vocab_size), 0)
                end
                n = n + 1; tokens[n] = byte_id
            end
        end
        i = j + 1
    end

    -- Greedy merges: the best-scoring pair first, the leftmost on equal scores.
    while true do
        local best_score, best_id, best_idx = f32(-1e10), -1, -1
        for k = 1, n - 1 do
            local id = self:find(self:piece(tokens[k]) .. self:piece(tokens[k + 1]))
            if id and self:score(id) > best_score then
                best_score, best_id, best_idx = self:score(id), id, k
            end
        end
        if best_idx == -1 then break end
        tokens[best_idx] = best_id
        table.remove(tokens, best_idx + 1)
        n = n - 1
    end

    if eos then n = n + 1; tokens[n] = EOS end
    return tokens
end

-- The bytes run.c's decode returns for `token` following `prev`.
function Tokenizer:decode(prev, token)
    local id = C.tointeger(token)
    if not id or id < 0 or id >= self.vocab_size then
        error(string.format("tokenizer: token id %s out of range [0, %d)", tostring(token), self.vocab_size), 0)
    end
    local piece = self:piece(id)
    -- After BOS, sentencepiece drops the leading space of the first piece.
    if prev == BOS and piece:byte(1) == 32 then piece = piece:sub(2) end
    -- A `<0xNN>` piece is a raw byte (run.c: sscanf "<0x%02hhX>"; only the
    -- prefix and up to two hex digits need to match).
    local hex = piece:match("^<0x(%x%x?)")
    if hex then piece = string.char(tonumber(hex, 16)) end
    return piece
end

-- What run.c's safe_printf prints for a piece: nothing for an empty piece or
-- a single byte that is neither printable nor whitespace in the C locale.
function M.printable(piece)
    local n = #piece
    if n == 0 then return "" end
    piece = cstring(piece)
    if #piece == 0 then return "" end
    if #piece == 1 then
        local b = piece:byte(1)
        if not ((b >= 0x20 and b <= 0x7E) or (b >= 0x09 and b <= 0x0D)) then return "" end
    end
    return piece
end

-- Decodes a whole token sequence as generate() prints it (tokens[1] is the
-- first input token; each later one is printed after its predecessor).
function Tokenizer:decode_all(tokens)
    local out = {}
    for k = 2, #tokens do
        out[#out + 1] = M.printable(self:decode(tokens[k - 1], tokens[k]))
    end
    return table.concat(out)
end

return M
