/*
 * tokenizer_fuzz.c — the llama2.c tokenizer loader (moonkaas.llama2.tokenizer)
 * on arbitrary bytes, in an embedded Lua state.
 *
 * The input is the tokenizer.bin contents. The vocabulary size is not in the
 * file (it comes from the checkpoint), so the harness counts the whole
 * records the bytes hold (n) and parses with n, n + 1 and n - 1 tokens, and
 * the bytes cut after the n-th record with n; every tokenizer that parses
 * then encodes a few texts (ASCII, UTF-8, the input's own bytes) and decodes
 * every id. A refusal must be a message naming the file ("fuzz: ..."); encode
 * and decode may raise only their own "tokenizer: ..." errors. Anything else
 * ("attempt to ...", "bad argument ...") is a finding.
 *
 *     build-fuzz/fuzz/tokenizer_fuzz -max_total_time=60 build-fuzz/corpus/tokenizer_fuzz
 * Seeds: build-fuzz/seeds/tokenizer_fuzz/ (spec/fuzz/seeds.lua writes them).
 */
#include "fuzz.h"

static const char *const harness =
    "local T = require 'moonkaas.llama2.tokenizer'\n"
    "local function own(e)\n"
    "    if type(e) ~= 'string' or e:sub(1, 11) ~= 'tokenizer: ' then\n"
    "        error('fuzz finding: ' .. tostring(e), 0)\n"
    "    end\n"
    "end\n"
    "local function exercise(tok, bytes)\n"
    "    assert(tok.vocab_size >= 1 and tok:piece(tok.vocab_size - 1), 'fuzz finding: vocabulary')\n"
    "    for _, text in ipairs({'', 'a', ' ab', 'Once upon a time', 'h\\xC3\\xA9llo \\xE2\\x9C\\x93 \\xFF\\x80',\n"
    "                           bytes:sub(1, 48), bytes:sub(-24)}) do\n"
    "        local ok, ids = pcall(tok.encode, tok, text, #text % 2 == 0, #text % 3 == 0)\n"
    "        if ok then\n"
    "            for _, id in ipairs(ids) do\n"
    "                assert(math.type(id) == 'integer' and id >= 0 and id < tok.vocab_size, 'fuzz finding: id')\n"
    "            end\n"
    "            local ok2, e = pcall(tok.decode_all, tok, ids)\n"
    "            if not ok2 then own(e) end\n"
    "        else\n"
    "            own(ids)\n"
    "        end\n"
    "    end\n"
    "    for id = 0, math.min(tok.vocab_size, 300) - 1 do\n"
    "        T.printable(tok:decode(T.BOS, id))\n"
    "        T.printable(tok:decode(id, id))\n"
    "    end\n"
    "    local ok, e = pcall(tok.decode, tok, 0, tok.vocab_size)\n"
    "    if ok then error('fuzz finding: decoded an id past the vocabulary', 0) end\n"
    "    own(e)\n"
    "end\n"
    "local function parse(bytes, n)\n"
    "    local tok, err = T.parse(bytes, n, 'fuzz')\n"
    "    if tok then\n"
    "        assert(tok.vocab_size == n, 'fuzz finding: vocab_size')\n"
    "        exercise(tok, bytes)\n"
    "    elseif type(err) ~= 'string' or err:sub(1, 6) ~= 'fuzz: ' then\n"
    "        error('fuzz finding: parse failed without a message naming the file: ' .. tostring(err), 0)\n"
    "    end\n"
    "    return tok\n"
    "end\n"
    "return function(bytes)\n"
    "    -- whole records: int32 header, then {float32 score, int32 len, len bytes}\n"
    "    local n, pos = 0, 5\n"
    "    while pos + 7 <= #bytes do\n"
    "        local len = string.unpack('<i4', bytes, pos + 4)\n"
    "        if len < 0 or pos + 8 + len - 1 > #bytes then break end\n"
    "        pos, n = pos + 8 + len, n + 1\n"
    "    end\n"
    "    parse(bytes, math.max(n, 1))\n"
    "    parse(bytes, n + 1)\n"
    "    if n > 1 then parse(bytes, n - 1) end\n"
    "    if n >= 1 and pos <= #bytes then parse(bytes:sub(1, pos - 1), n) end\n"
    "end\n";

static lua_State *L;
static int fn_ref;
static unsigned runs;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!L) {
        L = fuzz_lua_new();
        fn_ref = fuzz_lua_function(L, harness, "=tokenizer_harness");
    }
    fuzz_lua_prev = 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
    lua_pushlstring(L, (const char *)data, size);
    fuzz_lua_check(L, lua_pcall(L, 1, 0, 0), "tokenizer");
    if (++runs % 256 == 0) lua_gc(L, LUA_GCCOLLECT);
    return 0;
}
