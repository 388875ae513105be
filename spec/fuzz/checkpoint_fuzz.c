/*
 * checkpoint_fuzz.c — the llama2.c checkpoint loader (moonkaas.llama2.checkpoint)
 * on arbitrary files, in an embedded Lua state with the binding linked in.
 *
 * The input is the file, written to a temporary file; or, when its last byte
 * is odd and its header (legacy, version 1 or 2) one that read_config accepts,
 * the file of exactly that header's size with the input's bytes repeated as
 * weights (valid checkpoints
 * of any shape, not only the seeds'). Then read_config (the header checked
 * against the file size) and, when it accepts the file, map (every weight as
 * an mk.from_file tensor); a model of up to 4 MB is also built on the CPU for
 * two steps (its KV caches hold 2 positions) and run for them. A refused file
 * must come back as nil and a message naming it; a file read_config accepts
 * must map, build and run; any raised error ("attempt to ...", "bad argument
 * ...") is a finding.
 *
 *     build-fuzz/fuzz/checkpoint_fuzz -max_total_time=60 build-fuzz/corpus/checkpoint_fuzz
 * Seeds: build-fuzz/seeds/checkpoint_fuzz/ (spec/fuzz/seeds.lua writes them).
 */
#include <unistd.h>

#include "fuzz.h"

static const char *const harness =
    "local checkpoint = require 'moonkaas.llama2.checkpoint'\n"
    "local llama2 = require 'moonkaas.llama2'\n"
    "local mk = require 'moonkaas'\n"
    "return function(path, bytes)\n"
    /* fit mode (last byte odd): a header read_config would accept gets a file of
     * exactly its size, the input repeated as weights, so odd shapes get built */
    "    local h = #bytes > 0 and bytes:byte(-1) & 1 == 1 and checkpoint.parse_header(bytes:sub(1, 256), #bytes)\n"
    "    local c = h and checkpoint.config_from_header(h)\n"
    "    if c and #bytes > c.header_bytes and c.expected_bytes <= (64 << 10) then\n"
    "        local body = bytes:sub(c.header_bytes + 1)\n"
    "        local need = c.expected_bytes - c.header_bytes\n"
    "        bytes = bytes:sub(1, c.header_bytes) .. body:rep(need // #body + 1):sub(1, need)\n"
    "    end\n"
    "    local f = assert(io.open(path, 'wb'))\n"
    "    assert(f:write(bytes))\n"
    "    f:close()\n"
    "    local size, greedy = #bytes, #bytes % 2 == 0\n"
    "    local c, err = checkpoint.read_config(path)\n"
    "    if not c then\n"
    "        if type(err) ~= 'string' or err:sub(1, #path + 2) ~= path .. ': ' then\n"
    "            error('fuzz finding: read_config failed without a message naming the file: '\n"
    "                  .. tostring(err), 0)\n"
    "        end\n"
    "        return false\n"
    "    end\n"
    "    if c.file_bytes ~= size or c.expected_bytes ~= size then\n"
    "        error(string.format('fuzz finding: accepted %d bytes as a %d-byte checkpoint',\n"
    "                            size, c.expected_bytes), 0)\n"
    "    end\n"
    /* an accepted header is a checkpoint: everything after this is a finding if it fails */
    "    local ok, e = pcall(function()\n"
    "        local w = checkpoint.map(mk, c)\n"
    "        assert(#w.layers == c.n_layers, 'layers')\n"
    "        if c.file_bytes > (4 << 20) then return end\n"
    "        local net = llama2.build(mk, c, {device = 'cpu', greedy = greedy, steps = 2})\n"
    "        for pos = 0, math.min(1, c.seq_len - 1) do\n"
    "            local out = net:forward(pos % c.vocab_size, pos)\n"
    "            if greedy then\n"
    "                assert(math.type(out) == 'integer' and out >= 0 and out < c.vocab_size,\n"
    "                       'argmax ' .. tostring(out))\n"
    "            else\n"
    "                assert(#out == c.vocab_size, 'logits')\n"
    "            end\n"
    "        end\n"
    "        net.model:close()\n"
    "    end)\n"
    "    if not ok then\n"
    "        error('fuzz finding: ' .. checkpoint.describe(c) .. ': ' .. tostring(e), 0)\n"
    "    end\n"
    "    return true\n"
    "end\n";

static lua_State *L;
static int fn_ref;
static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!L) {
        L = fuzz_lua_new();
        fn_ref = fuzz_lua_function(L, harness, "=checkpoint_harness");
        snprintf(path, sizeof path, "/tmp/mk_checkpoint_fuzz_%d.bin", (int)getpid());
    }
    fuzz_lua_prev = 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
    lua_pushstring(L, path);
    lua_pushlstring(L, (const char *)data, size);
    fuzz_lua_check(L, lua_pcall(L, 2, 0, 0), "checkpoint");
    /* mappings and models go now: the next input rewrites the file */
    lua_gc(L, LUA_GCCOLLECT);
    unlink(path);
    return 0;
}
