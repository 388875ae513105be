/*
 * llama2_server.c — a host serving N concurrent story requests with one
 * batched llama2 model (moonkaas.llama2's net:batch): continuous batching.
 *
 * What it does:
 *   - its own lua_State with moonkaas's binding registered (luaL_requiref)
 *     and the Lua layer found through package.path, as game_loop.c;
 *   - a Lua chunk (SERVER below) maps stories260K, compiles a batch of
 *     SLOTS slots and returns three functions to the host: add(prompt, seed,
 *     temperature) -> id, step() -> {id, piece, ended}..., and alone(prompt,
 *     seed, temperature) -> text (the story told by itself, for the check);
 *   - the host keeps a queue of requests that arrive over time (more than
 *     the slots: a request waits for a free slot), steps the batch while any
 *     request is running, appends each step's piece of text to its request
 *     and frees the slot when a story ends (BOS or the positions);
 *   - every story must equal the one its seed tells alone: the host prints
 *     each one's start and exits non-zero on a difference or an error.
 *
 *     make examples && build/examples/llama2_server
 * Run from the repository root (MK_ROOT=dir to run elsewhere; MK_MODELS=dir
 * for the models, default ../shared/models).
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int luaopen_moonkaas_core(lua_State *L);

enum { SLOTS = 3, STEPS = 160, REQUESTS = 5, TEXT_MAX = 4096 };

/* The server: (models dir, slots, steps) -> add, step, alone; or nil and why. */
static const char *SERVER =
    "local mk = require 'moonkaas'\n"
    "local llama2 = require 'moonkaas.llama2'\n"
    "local models, slots, steps = ...\n"
    "local c, err = llama2.read_config(models .. '/stories260K.bin')\n"
    "if not c then return nil, err end\n"
    "local tok, terr = llama2.load_tokenizer(models .. '/tok512.bin', c.vocab_size)\n"
    "if not tok then return nil, terr end\n"
    "local net = llama2.build(mk, c, {device = 'cpu', output = 'sample', steps = steps})\n"
    "local b = net:batch{slots = slots, tokenizer = tok}\n"
    "local last = {}\n"
    "local function smp(seed, t) return llama2.sampler(c.vocab_size, t, 0.9, seed) end\n"
    "local function add(prompt, seed, t)\n"
    "    local ids = tok:encode(prompt, true, false)\n"
    "    local id = b:add(ids, smp(seed, t))\n"
    "    last[id] = ids[1]\n"
    "    return id\n"
    "end\n"
    "local function step()\n"
    "    local made = {}\n"
    "    for _, r in ipairs(b:step()) do\n"
    "        local ended = r.done or r.token == 1\n"
    "        local piece = ''\n"
    "        if r.token ~= 1 then piece = llama2.tokenizer.printable(tok:decode(last[r.id], r.token)) end\n"
    "        last[r.id] = r.token\n"
    "        if r.token == 1 and not r.done then b:remove(r.id) end\n"
    "        made[#made + 1] = {r.id, piece, ended}\n"
    "    end\n"
    "    return made\n"
    "end\n"
    "local function alone(prompt, seed, t)\n"
    "    net:reset()\n"
    "    local out = {}\n"
    "    llama2.generate(net, tok, smp(seed, t), prompt, steps, {per_token = true,\n"
    "        write = function(s) out[#out + 1] = s end, report = function() end})\n"
    "    return table.concat(out)\n"
    "end\n"
    "return add, step, alone\n";

typedef struct {
    const char *prompt;
    int seed;
    double temperature;
    int arrives; /* the step after which it is asked for */
    int id;      /* the batch's id while it runs, 0 before, -1 once told */
    size_t len;
    char text[TEXT_MAX];
} request;

static const char *root(void) {
    const char *r = getenv("MK_ROOT");
    return r && *r ? r : ".";
}

static const char *models(void) {
    const char *m = getenv("MK_MODELS");
    return m && *m ? m : "../shared/models";
}

/* Calls the function at stack index fn with the request's arguments. */
static void push_request(lua_State *L, const request *r) {
    lua_pushstring(L, r->prompt);
    lua_pushinteger(L, r->seed);
    lua_pushnumber(L, r->temperature);
}

static int serve(lua_State *L, request *req, int n) {
    /* stack: add (1), step (2), alone (3) */
    int running = 0, told = 0, step = 0, tokens = 0;
    while (told < n) {
        for (int i = 0; i < n && running < SLOTS; i++) { /* admit what has arrived, oldest first */
            if (req[i].id != 0 || req[i].arrives > step) continue;
            lua_pushvalue(L, 1);
            push_request(L, &req[i]);
            if (lua_pcall(L, 3, 1, 0) != LUA_OK) {
                printf("add failed: %s\n", lua_tostring(L, -1));
                return 1;
            }
            req[i].id = (int)lua_tointeger(L, -1);
            lua_pop(L, 1);
            running++;
        }
        step++;
        if (running == 0) continue; /* nothing yet: the next arrival comes later */
        lua_pushvalue(L, 2);
        if (lua_pcall(L, 0, 1, 0) != LUA_OK) {
            printf("step failed: %s\n", lua_tostring(L, -1));
            return 1;
        }
        int made = (int)luaL_len(L, -1);
        for (int k = 1; k <= made; k++) {
            lua_rawgeti(L, -1, k);
            lua_rawgeti(L, -1, 1);
            lua_rawgeti(L, -2, 2);
            lua_rawgeti(L, -3, 3);
            int id = (int)lua_tointeger(L, -3);
            size_t len;
            const char *piece = lua_tolstring(L, -2, &len);
            int ended = lua_toboolean(L, -1);
            lua_pop(L, 4);
            for (int i = 0; i < n; i++) {
                if (req[i].id != id) continue;
                if (req[i].len + len < TEXT_MAX) {
                    memcpy(req[i].text + req[i].len, piece, len);
                    req[i].len += len;
                }
                if (ended) req[i].id = -1, running--, told++;
                tokens++;
            }
        }
        lua_pop(L, 1);
    }
    printf("%d requests told in %d steps of at most %d sequences (%d tokens)\n", n, step, SLOTS, tokens);
    return 0;
}

int main(void) {
    request req[REQUESTS] = {
        {.prompt = "", .seed = 42, .temperature = 1.0, .arrives = 0},
        {.prompt = "Once upon a time", .seed = 7, .temperature = 0.8, .arrives = 0},
        {.prompt = "", .seed = 1, .temperature = 0.0, .arrives = 5},
        {.prompt = "The cat", .seed = 99, .temperature = 1.0, .arrives = 20}, /* waits for a slot */
        {.prompt = "", .seed = 43, .temperature = 1.0, .arrives = 30},
    };
    lua_State *L = luaL_newstate();
    if (!L) {
        printf("cannot create a Lua state\n");
        return 1;
    }
    luaL_openlibs(L);
    luaL_requiref(L, "moonkaas.core", luaopen_moonkaas_core, 0);
    lua_pop(L, 1);
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua", root(), root());
    lua_setfield(L, -2, "path");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);

    int rc = 0;
    if (luaL_loadstring(L, SERVER) != LUA_OK) {
        printf("the server chunk does not load: %s\n", lua_tostring(L, -1));
        lua_close(L);
        return 1;
    }
    lua_pushstring(L, models());
    lua_pushinteger(L, SLOTS);
    lua_pushinteger(L, STEPS);
    if (lua_pcall(L, 3, 3, 0) != LUA_OK || lua_isnil(L, 1)) {
        printf("no server: %s\n", lua_tostring(L, lua_isnil(L, 1) ? 2 : -1));
        lua_close(L);
        return 1;
    }
    rc = serve(L, req, REQUESTS);
    for (int i = 0; i < REQUESTS && rc == 0; i++) {
        lua_pushvalue(L, 3);
        push_request(L, &req[i]);
        if (lua_pcall(L, 3, 1, 0) != LUA_OK) {
            printf("alone failed: %s\n", lua_tostring(L, -1));
            rc = 1;
            break;
        }
        size_t len;
        const char *alone = lua_tolstring(L, -1, &len);
        /* generate ends its text with a newline; the served text has none */
        int same = len == req[i].len + 1 && memcmp(alone, req[i].text, req[i].len) == 0;
        printf("%s seed %-3d t %.1f %-18s \"%.50s...\"\n", same ? "same as alone" : "DIFFERS from alone",
               req[i].seed, req[i].temperature, req[i].prompt[0] ? req[i].prompt : "(no prompt)", req[i].text);
        if (!same) rc = 1;
        lua_pop(L, 1);
    }
    lua_close(L);
    return rc;
}
