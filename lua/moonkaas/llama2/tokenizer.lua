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

local M = {}

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
    if math.type(vocab_size) ~= "integer" or vocab_size < 1 then
        return nil, string.format("%s: vocabulary size must be a positive integer (got %s)",
                                  name, tostring(vocab_size))
    end
    if #bytes < 4 then
        return nil, string.format("%s: truncated: %d bytes, no room for the 4-byte header", name, #bytes)
    end
    local max_token_length, pos = string.unpack("<i4", bytes)
    if max_token_length < 1 then
        return nil, string.format("%s: corrupt header: max_token_length %d is not positive",
                                  name, max_token_length)
    end
    local vocab, scores = {}, {}   -- 0-based ids: vocab[id] string, scores[id] float32
    local size = #bytes
    for id = 0, vocab_size - 1 do
        if pos + 7 > size then
            return nil, string.format("%s: truncated in token %d of %d (the model's vocabulary)",
                                      name, id, vocab_size)
        end
        local score, len
        score, len, pos = string.unpack("<fi4", bytes, pos)
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
        vocab[id] = cstring(bytes:sub(pos, pos + len - 1))
        scores[id] = score
        pos = pos + len
    end
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
        vocab = vocab,              -- [0, vocab_size) → piece
        scores = scores,            -- [0, vocab_size) → float32 merge score
        vocab_size = vocab_size,
        max_token_length = max_token_length,
        lookup = nil,               -- piece → id, built on first encode
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
    local bytes = f:read("a")
    f:close()
    if not bytes then
        return nil, string.format("%s: cannot read tokenizer", path)
    end
    return M.parse(bytes, vocab_size, path)
end

-- run.c finds pieces by binary search over the strcmp-sorted vocabulary; with
-- no duplicate pieces (true of tok512.bin and tokenizer.bin) a hash lookup
-- answers the same. With duplicates this one keeps the lowest id.
function Tokenizer:index()
    if not self.lookup then
        local lookup = {}
        for id = self.vocab_size - 1, 0, -1 do lookup[self.vocab[id]] = id end
        self.lookup = lookup
    end
    return self.lookup
end

-- Encodes `text` (bytes, UTF-8 expected) into a 1-based array of token ids.
-- Raises an error only where run.c would read out of bounds (a vocabulary
-- without " " or too small for byte fallback).
function Tokenizer:encode(text, bos, eos)
    if type(text) ~= "string" then
        error("tokenizer: encode needs a string, got " .. type(text), 2)
    end
    text = cstring(text)
    local lookup = self:index()
    local vocab, scores = self.vocab, self.scores
    local tokens, n = {}, 0
    if bos then n = n + 1; tokens[n] = BOS end
    if #text > 0 then
        local space = lookup[" "]
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
        while j < len and j - i + 1 < 4 and (text:byte(j + 1) & 0xC0) == 0x80 do j = j + 1 end
        local piece = text:sub(i, j)
        local id = lookup[piece]
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
            local id = lookup[vocab[tokens[k]] .. vocab[tokens[k + 1]]]
            if id and scores[id] > best_score then
                best_score, best_id, best_idx = scores[id], id, k
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
    local piece = self.vocab[token]
    if not piece then
        error(string.format("tokenizer: token id %s out of range [0, %d)", tostring(token), self.vocab_size), 0)
    end
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
