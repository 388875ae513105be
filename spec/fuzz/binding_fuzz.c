/*
 * binding_fuzz.c — the Lua binding's argument handling, driven by sequences of
 * calls: each byte picks a call (run, run_steps, reset, close, compile,
 * compile_script, the host functions, introspection, node and tensor
 * builders, a field or metatable of an argument table, a collection, garbage
 * with a finalizer) and the
 * following bytes its arguments from pools of models (one with a recurrence,
 * two sharing a buffer), tensors, nodes, tables, host functions and odd values
 * (NaN, huge numbers, NUL in names, the wrong types). Host functions and
 * metamethods (__index, __len, __pairs, __newindex) run further calls, three
 * deep: a model re-run, reset or closed from its own progress function, a
 * nested run (also from a coroutine: another lua_State), a cancel, an error
 * (a string or a table), a yield across the core, a table emptied and
 * collected under a call. A top-level call may itself run in a coroutine.
 * Garbage with a finalizer that closes a model or runs an op lands in some
 * later collection step (generational mode: each young collection calls the
 * finalizers due), inside the binding's own allocations as often as not.
 *
 * A finding is a crash or sanitizer report, an error that is not a string (or
 * the table a host function raised), an "internal error", or a module that no
 * longer computes relu(x * w) right after the sequence.
 *
 * Cheap per input (issue 66: compiles, LeakSanitizer's scans, libFuzzer's
 * work per feature and ever longer inputs were nearly all of an execution's
 * cost): one Lua state and the pools' models are made once per process;
 * between inputs each model is reset (its buffers and recurrence zero; one
 * whose reset fails, closed by the last input, is compiled again), the
 * tables and hooks are made afresh and the tensors copied from pristine
 * ones. Compiling from the sequence (compile, compile_script), closing a
 * pool's live model and the fresh model of the final check happen only in
 * one input of 16 (a "full" one, chosen by the input's hash, so that a replay
 * behaves the same); the others check relu(x * w) on a model compiled once,
 * their compile calls return at once and their closes close the pool's
 * closed model (always there: calls on a closed model need no close first).
 * An input ends by dropping its pools and collecting until it has freed as
 * much as it allocated (finalized userdata are freed by the collection after
 * the one that finalizes them), so that libFuzzer's leak check (a second run,
 * then LeakSanitizer over the whole heap, after an input with more mallocs
 * than frees) runs where memory was kept. Coverage counts the C edges and
 * moonkaas's own Lua lines, not the harness's (binding_hook); inputs are at
 * most BINDING_MAX_LEN bytes unless -max_len says otherwise.
 *
 *     build-fuzz/fuzz/binding_fuzz -max_total_time=60 build-fuzz/corpus/binding_fuzz
 *     build-fuzz/fuzz/binding_fuzz crash-<sha1>      replay one input
 * Seeds: build-fuzz/seeds/binding_fuzz/ (spec/fuzz/seeds.lua; any bytes are calls).
 */
#include "fuzz.h"

#include <sanitizer/allocator_interface.h>

static const char *const harness =
    "local mk = require 'moonkaas'\n"
    "local BOOM = setmetatable({}, { __tostring = function() return 'fuzz: a table raised' end })\n"
    "local function own(e)\n"
    "    if e == BOOM then return end\n"
    "    if type(e) ~= 'string' then error('fuzz finding: a ' .. type(e) .. ' raised', 0) end\n"
    "    if e:find('internal error', 1, true) then error('fuzz finding: ' .. e, 0) end\n"
    "end\n"
    "local function try(f, ...)\n"
    "    local ok, e = pcall(f, ...)\n"
    "    if not ok then own(e) end\n"
    "    return ok and e or nil\n"
    "end\n"
    "local good = '$1 = InputTensor(x, float32, [4]);\\n$2 = ConstantTensor(c, float32, [4]);\\n' ..\n"
    "    '$3 = HadamardProductNode($1, $2);\\n$4 = ReLUNode($3);\\nresult = $4;\\n'\n"
    "local scripts = { good, good:gsub('%[4%]', '[2, 2]', 1), '$1 = InputTensor(x, float32, [4]);\\nresult = $1;\\n',\n"
    "    '$1 = Bogus(', '', good .. 'next x = $4;\\n' }\n"
    "collectgarbage('generational') -- a young collection calls the finalizers due\n"
    "-- made once per process: the nodes and the models of the pools\n"
    "local x = mk.input('x', 'float32', { 4 })\n"
    "local w = mk.input('w', 'float32', { 4 })\n"
    "local h = mk.input('h', 'float32', { 4 })\n"
    "local pos_in = mk.input('pos', 'int64', { 1 })\n"
    "local h1 = (h * w):relu()\n"
    "local kv = mk.buffer('float32', { 4 }, 'kv')\n"
    "local base_nodes = { x, w, h, pos_in, h1, kv }\n"
    "local function compile_base(i, others)\n"
    "    if i == 1 then return mk.compile((x * w):relu(), { fuse = false }) end\n"
    "    if i == 2 then return mk.compile({ h1, pos_in + 1 }, { next = { h = h1, pos = 1 } }) end\n"
    "    if i == 3 then return mk.compile({ kv:replace(x, 0, 4) * 1, x + 1 }) end\n"
    "    return mk.compile(mk.buffer('float32', { 4 }, 'kv') * 2, { share = others[3] })\n"
    "end\n"
    "local base = {}\n"
    "for i = 1, 4 do base[i] = compile_base(i, base) end\n"
    "base[5] = mk.compile(x + 1) -- always closed\n"
    "base[5]:close()\n"
    "local check = mk.compile((x * w):relu()) -- the final check's, out of the pools\n"
    "local check_feeds = { x = mk.tensor({ 1, -2, 3, -4 }), w = mk.tensor({ 0.5, 1, 1.5, 2 }) }\n"
    "-- the tensors of the pools as each input starts: copied (an input may write them)\n"
    "local pristine = { mk.tensor({ 1, -2, 3, -4 }), mk.tensor({ 0.5, 1, 1.5, 2 }), mk.tensor({ { 1, 2 }, { 3, 4 } }),\n"
    "    mk.tensor({ 3 }, 'int64'), mk.tensor({ 1, 2, 3, 4 }, 'int64'), mk.tensor({ 7 }) }\n"
    "-- the pools, made afresh (or reset) for each input\n"
    "local bytes, pos, full, compiles, depth\n"
    "local models, tensors, nodes, tables, callbacks, metas, ops\n"
    "local misc = { true, 0, -1, 1, 2, 3, 5, 0.5, 1e300, math.huge, 0 / 0, math.mininteger,\n"
    "    math.maxinteger, 'x', 'w', 'h', 'pos', 'kv', '', 'x\\0y', 'float32', 'int64', 'cuda', 'cpu',\n"
    "    'stop', 'output', 'value', 'share', 'device', 'fuse', 'next', BOOM }\n"
    "local function b(n)\n"
    "    pos = pos + 1\n"
    "    local v = bytes:byte(pos) or 0\n"
    "    return n and v % n or v\n"
    "end\n"
    "-- any value: a model, tensor, node, table, callback, one of misc or nil\n"
    "local function pick()\n"
    "    local k = b(7)\n"
    "    if k == 6 then return nil end\n"
    "    if k == 0 then return models[b(#models) + 1] end\n"
    "    if k == 1 then return tensors[b(#tensors) + 1] end\n"
    "    if k == 2 then return nodes[b(#nodes) + 1] end\n"
    "    if k == 3 then return tables[b(#tables) + 1] end\n"
    "    if k == 4 then return callbacks[b(#callbacks) + 1] end\n"
    "    return misc[b(#misc) + 1]\n"
    "end\n"
    "local function model() return models[b(#models) + 1] end\n"
    "local function tbl() return tables[b(#tables) + 1] end\n"
    "-- what a callback or metamethod does: one op, at most three deep\n"
    "local function nested()\n"
    "    if depth >= 3 then return end\n"
    "    depth = depth + 1\n"
    "    local op = ops[b(#ops) + 1]\n"
    "    local ok, e = pcall(op)\n"
    "    depth = depth - 1\n"
    "    if not ok then own(e) end\n"
    "end\n"
    "-- a close: of a base model only in a full input (the next input compiles it\n"
    "-- again); elsewhere of the closed one (a close of a closed model)\n"
    "local function close(m)\n"
    "    if not full then for i = 1, 4 do if m == base[i] then m = base[5] end end end\n"
    "    return m.close(m)\n"
    "end\n"
    "-- a compile from the sequence: only in a full input, at most four\n"
    "local function may_compile()\n"
    "    if not full or compiles >= 4 then return false end\n"
    "    compiles = compiles + 1\n"
    "    return true\n"
    "end\n"
    "callbacks = {\n"
    "    function() nested() end,\n"
    "    function() error('fuzz: a host function raised', 0) end,\n"
    "    function() error(BOOM) end,\n"
    "    function() mk.cancel() end,\n"
    "    function() collectgarbage() end,\n"
    "    function() local t = tbl(); for k in pairs(t) do t[k] = nil end; collectgarbage() end,\n"
    "    function() return pick() end,\n"
    "    function() coroutine.wrap(nested)() end, -- a call from another lua_State\n"
    "    function() coroutine.yield() end,         -- across the core: an error\n"
    "}\n"
    "metas = {\n"
    "    { __index = function(_, k) return tensors[1] end },\n"
    "    { __index = function() error('fuzz: __index raised', 0) end },\n"
    "    { __index = function() nested(); return pick() end },\n"
    "    { __len = function() return 1 << 40 end },\n"
    "    { __len = function() return -3 end },\n"
    "    { __len = function() return 'x' end },\n"
    "    { __newindex = function() error('fuzz: __newindex raised', 0) end },\n"
    "    { __pairs = function() error('fuzz: __pairs raised', 0) end },\n"
    "    {},\n"
    "}\n"
    "ops = {\n"
    "    function() -- run, with 0 to 2 output tensors\n"
    "        local m = model()\n"
    "        local inputs, outs = pick(), {}\n"
    "        for i = 1, b(3) do outs[i] = pick() end\n"
    "        try(m.run, m, inputs, table.unpack(outs, 1, #outs))\n"
    "    end,\n"
    "    function() -- run_steps\n"
    "        local m = model()\n"
    "        local outs\n"
    "        if b(2) == 0 then outs = pick() else outs = { pick(), pick() } end\n"
    "        try(m.run_steps, m, pick(), pick(), outs, pick())\n"
    "    end,\n"
    "    function() local m = model(); try(m.reset, m) end,\n"
    "    function() try(close, model()) end,\n"
    "    function() -- a field of a table\n"
    "        local t = tbl()\n"
    "        local k = pick()\n"
    "        if k ~= nil and k == k then rawset(t, k, pick()) end\n"
    "    end,\n"
    "    function() setmetatable(tbl(), metas[b(#metas) + 1]) end,\n"
    "    function() -- host functions\n"
    "        local f = b(2) == 0 and mk.on_progress or mk.on_log\n"
    "        try(f, pick())\n"
    "    end,\n"
    "    function() -- a collection: whole, or a young one (finalizers due)\n"
    "        if b(4) == 0 then collectgarbage() else collectgarbage('step') end\n"
    "    end,\n"
    "    function() -- compile a script\n"
    "        local script, constants\n"
    "        if b(2) == 0 then script = scripts[b(#scripts) + 1] else script = pick() end\n"
    "        if b(2) == 0 then constants = { c = tensors[b(#tensors) + 1] } else constants = pick() end\n"
    "        local opts = pick()\n"
    "        if not may_compile() then return end\n"
    "        local m = try(mk.compile_script, script, constants, opts)\n"
    "        if m and #models < 12 then models[#models + 1] = m elseif m then m:close() end\n"
    "    end,\n"
    "    function() -- compile nodes\n"
    "        local opts, output\n"
    "        if b(2) == 0 then opts = { share = model(), fuse = b(2) == 0 } else opts = pick() end\n"
    "        if b(2) == 0 then output = nodes[b(#nodes) + 1] else output = pick() end\n"
    "        if not may_compile() then return end\n"
    "        local m = try(mk.compile, output, opts)\n"
    "        if m and #models < 12 then models[#models + 1] = m elseif m then m:close() end\n"
    "    end,\n"
    "    function() -- introspection\n"
    "        local m = model()\n"
    "        local which = ({ 'stats', 'script', 'inputs', 'outputs', 'output', 'recurrence',\n"
    "            'fusion_report', 'dot', 'memory_svg', 'kernel_source' })[b(10) + 1]\n"
    "        try(function() return m[which](m, pick()) end)\n"
    "        try(tostring, m)\n"
    "    end,\n"
    "    function() -- build a node\n"
    "        local ok, n = pcall(function()\n"
    "            local k = b(5)\n"
    "            if k == 0 then return mk.input(pick(), pick(), pick()) end\n"
    "            if k == 1 then return mk.buffer(pick(), pick(), pick()) end\n"
    "            if k == 2 then return pick() + pick() end\n"
    "            if k == 3 then return mk.constant(pick(), pick()) end\n"
    "            local a = nodes[b(#nodes) + 1]\n"
    "            return a:reshape(pick())\n"
    "        end)\n"
    "        if ok and #nodes < 16 and type(n) == 'userdata' then nodes[#nodes + 1] = n\n"
    "        elseif not ok then own(n) end\n"
    "    end,\n"
    "    function() -- a new input table from the pools\n"
    "        if #tables < 12 then\n"
    "            tables[#tables + 1] = { x = pick(), w = pick(), h = pick(), pos = pick(), [pick() or 1] = pick() }\n"
    "        end\n"
    "    end,\n"
    "    function() -- a tensor from odd arguments\n"
    "        local t = try(mk.tensor, pick(), pick(), pick())\n"
    "        if t and #tensors < 12 then tensors[#tensors + 1] = t end\n"
    "    end,\n"
    "    function() -- garbage whose finalizer closes a model or runs an op, in a later\n"
    "        -- collection step: inside some binding call's allocations, maybe (or in\n"
    "        -- a later input's: the model is closed there; the op reads that input)\n"
    "        local m, op = model(), b(2)\n"
    "        setmetatable({}, { __gc = function()\n"
    "            if op == 0 then pcall(close, m) elseif bytes then nested() end\n"
    "        end })\n"
    "        collectgarbage('step', b(8))\n"
    "    end,\n"
    "}\n"
    "return function(input, is_full)\n"
    "    bytes, pos, full, compiles, depth = input, 0, is_full, 0, 0\n"
    "    mk.on_progress(nil)\n"
    "    mk.on_log(nil)\n"
    "    -- the base models: reset, or compiled again where the last input closed one\n"
    "    -- (a reset fails; the fourth shares the third's buffer: both again if either is)\n"
    "    for i = 1, 3, 2 do\n"
    "        local one, two = pcall(base[i].reset, base[i]), pcall(base[i + 1].reset, base[i + 1])\n"
    "        if i == 3 and not (one and two) then base[3]:close(); base[4]:close(); one, two = false, false end\n"
    "        if not one then base[i] = compile_base(i, base) end\n"
    "        if not two then base[i + 1] = compile_base(i + 1, base) end\n"
    "    end\n"
    "    models = { base[1], base[2], base[3], base[4], base[5] }\n"
    "    tensors = { pristine[1]:copy(), pristine[2]:copy(), pristine[3]:copy(), pristine[4]:copy(),\n"
    "        pristine[5]:copy(), pristine[6]:copy() }\n"
    "    nodes = { base_nodes[1], base_nodes[2], base_nodes[3], base_nodes[4], base_nodes[5], base_nodes[6] }\n"
    "    tables = { { x = tensors[1], w = tensors[2] }, { h = tensors[1], w = tensors[2], pos = tensors[4] },\n"
    "        { x = tensors[2] }, {}, { tensors[1], tensors[2] }, { stop = { output = 2, value = 5 } } }\n"
    "    while pos < #bytes do\n"
    "        local op = ops[b(#ops) + 1]\n"
    "        local ok, e\n"
    "        if b(4) == 0 then -- in a coroutine, which a host function may try to yield\n"
    "            local co = coroutine.create(op)\n"
    "            ok, e = coroutine.resume(co)\n"
    "            while ok and coroutine.status(co) == 'suspended' do ok, e = coroutine.resume(co) end\n"
    "        else\n"
    "            ok, e = pcall(op)\n"
    "        end\n"
    "        if not ok then own(e) end\n"
    "    end\n"
    "    -- the module still works: relu(x * w) exactly, from a model compiled\n"
    "    -- once, and in a full input from a fresh one\n"
    "    mk.on_progress(nil)\n"
    "    mk.on_log(nil)\n"
    "    local m = full and mk.compile((x * w):relu()) or check\n"
    "    local got = m:run(check_feeds):totable()\n"
    "    local want = { 0.5, 0, 4.5, 0 }\n"
    "    for i = 1, 4 do\n"
    "        if got[i] ~= want[i] then error('fuzz finding: the module is broken: ' .. tostring(got[i]), 0) end\n"
    "    end\n"
    "    if full then m:close() end\n"
    "    for i = 6, #models do pcall(models[i].close, models[i]) end\n"
    "    -- what the input made is garbage now (its finalizers due later run no op)\n"
    "    bytes, models, tensors, nodes, tables = nil, nil, nil, nil, nil\n"
    "end\n";

static lua_State *L;
static int fn_ref;
static const char *harness_source; /* the harness chunk's source string: its functions' id */

/* fuzz_lua_hook less the harness's own lines: which of its ops an input ran,
 * and how often, is the input's choice, not coverage of the binding (the C
 * edges and moonkaas's Lua lines are); counted, every count of every line
 * pair was a feature, which kept inputs for nothing new and cost libFuzzer
 * work on every input. */
static void binding_hook(lua_State *L, lua_Debug *ar) {
    if (!lua_getinfo(L, "S", ar) || ar->source == harness_source) return;
    uintptr_t loc = ((uintptr_t)ar->source * 0x9E3779B1u) ^ ((uintptr_t)ar->currentline * 0x85EBCA6Bu);
    fuzz_lua_counters[(loc ^ (fuzz_lua_prev >> 1)) % FUZZ_LUA_COUNTERS]++;
    fuzz_lua_prev = loc;
}

/* Inputs of at most BINDING_MAX_LEN bytes unless -max_len is given: about 60
 * calls, past the pools' limits (12 models, 16 nodes, 12 tables), where
 * libFuzzer's default (4096) made an input cost ever more calls, not reach
 * other code. */
#define BINDING_MAX_LEN "256"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    for (int i = 1; i < *argc; i++)
        if (!strncmp((*argv)[i], "-max_len=", 9)) return 0;
    static char *args[256];
    static char max_len[] = "-max_len=" BINDING_MAX_LEN;
    if (*argc + 2 > (int)(sizeof args / sizeof *args)) return 0;
    args[0] = (*argv)[0];
    args[1] = max_len;
    for (int i = 1; i < *argc; i++) args[i + 1] = (*argv)[i];
    args[*argc + 1] = NULL;
    *argc += 1;
    *argv = args;
    return 0;
}

/* Allocations and frees since the process began (ASan's hooks: all threads),
 * counted as libFuzzer counts them around an input. */
static size_t n_mallocs, n_frees;
static void count_malloc(const volatile void *p, size_t size) { n_mallocs++; }
static void count_free(const volatile void *p) { n_frees++; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t mallocs = n_mallocs, frees = n_frees;
    if (!L) {
        __sanitizer_install_malloc_and_free_hooks(count_malloc, count_free);
        L = fuzz_lua_new();
        lua_sethook(L, binding_hook, LUA_MASKLINE, 0);
        fn_ref = fuzz_lua_function(L, harness, "=binding_harness");
        lua_Debug ar;
        lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
        if (!lua_getinfo(L, ">S", &ar)) abort();
        harness_source = ar.source;
    }
    fuzz_lua_prev = 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
    lua_pushlstring(L, (const char *)data, size);
    /* one input in 16 compiles: by its hash, so that a replay does the same */
    lua_pushboolean(L, fuzz_hash(data, size) % 16 == 0);
    fuzz_lua_check(L, lua_pcall(L, 2, 0, 0), "binding");
    /* What this input made and dropped is freed now. libFuzzer runs the input
     * again, then LeakSanitizer over the whole heap, after an input whose
     * mallocs outnumber its frees: a collection runs the finalizers of the
     * userdata it finds dropped, and only the next frees them, so collect
     * again while this input has freed less than it allocated (and the
     * collection frees something). Memory an input keeps still shows. */
    for (int i = 0; i < 4; i++) {
        size_t before = n_frees;
        lua_gc(L, LUA_GCCOLLECT);
        if (n_mallocs - mallocs <= n_frees - frees || n_frees == before) break;
    }
    return 0;
}
