/*
 * lua_host_test.c — moonkaas embedded in a C host the way a game or an app
 * would: its own lua_State, the binding linked in statically and registered
 * with luaL_requiref (no search for a shared module: package.cpath is emptied),
 * the pure-Lua layer found through package.path, and a Lua script
 * (spec/host_script.lua) that builds, compiles and runs networks and checks
 * them against plain-Lua references.
 *
 * Run from the repository root (MK_ROOT=dir to run elsewhere):
 *     make build/tests/lua_host_test && build/tests/lua_host_test
 */
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "lmk.h"
#include "test.h"

int luaopen_moonkaas_core(lua_State *L);

static const char *root(void) {
    const char *r = getenv("MK_ROOT");
    return r && *r ? r : ".";
}

/* A fresh host state with moonkaas registered; package.path finds lua/moonkaas. */
static lua_State *host_new(void) {
    lua_State *L = luaL_newstate();
    if (!L) return NULL;
    luaL_openlibs(L);
    luaL_requiref(L, "moonkaas.core", luaopen_moonkaas_core, 0);
    lua_pop(L, 1);
    lua_getglobal(L, "package");
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua", root(), root());
    lua_setfield(L, -2, "path");
    lua_pushstring(L, ""); /* the binding must come from this executable */
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);
    return L;
}

/* Runs a chunk; returns its status, leaving the message (or first result) on top. */
static int run_chunk(lua_State *L, const char *code, int nresults) {
    int status = luaL_loadstring(L, code);
    if (status == LUA_OK) status = lua_pcall(L, 0, nresults, 0);
    return status;
}

static uint64_t seed;

/* A tensor's data start a cache line (a CPU model reads a constant's rows in
 * place, with whole-line vector loads), whatever the shape and dtype. */
static void test_tensor_data_aligned(void) {
    lua_State *L = host_new();
    CHECK(L != NULL, "luaL_newstate failed");
    if (!L) return;
    const char *dtypes[] = {"float32", "int8", "int64", "bfloat16"};
    for (int i = 0; i < 40 && !test_cur_failed; i++) {
        char code[160];
        snprintf(code, sizeof code, "return require('moonkaas').zeros('%s', {%d, %d})", dtypes[i % 4],
                 1 + i % 7, 1 + (i * 5) % 13);
        int status = run_chunk(L, code, 1);
        CHECK(status == LUA_OK, "%s", lua_tostring(L, -1));
        if (status != LUA_OK) break;
        const lmk_tensor *t = lmk_to_tensor(L, -1);
        CHECK(t && (uintptr_t)t->data % 64 == 0, "%s: data at %p", code, t ? t->data : NULL);
        lua_pop(L, 1);
    }
    lua_close(L);
}

static void test_registered_statically(void) {
    lua_State *L = host_new();
    CHECK(L != NULL, "luaL_newstate failed");
    if (!L) return;
    int status = run_chunk(L, "local mk = require 'moonkaas'\n"
                              "assert(package.loaded['moonkaas.core'], 'core not preloaded')\n"
                              "return mk.version", 1);
    CHECK(status == LUA_OK, "%s", lua_tostring(L, -1));
    if (status == LUA_OK) CHECK(lua_isstring(L, -1), "no version");
    lua_pop(L, 1);
    /* luaopen again (a reloaded module): metatables are reused, old values keep working */
    status = run_chunk(L, "local mk = require 'moonkaas'\n"
                          "local t = mk.tensor({1, 2})\n"
                          "package.loaded['moonkaas'] = nil\n"
                          "package.loaded['moonkaas.core'] = nil\n", 0);
    CHECK(status == LUA_OK, "%s", status == LUA_OK ? "" : lua_tostring(L, -1));
    luaL_requiref(L, "moonkaas.core", luaopen_moonkaas_core, 0);
    lua_pop(L, 1);
    status = run_chunk(L, "local mk = require 'moonkaas'\n"
                          "local x = mk.input('x', 'float32', {2})\n"
                          "local m <close> = mk.compile(x * 3)\n"
                          "local y = m:run({x = mk.tensor({1, -2})})\n"
                          "assert(y:get(1) == 3 and y:get(2) == -6, tostring(y))\n", 0);
    CHECK(status == LUA_OK, "%s", status == LUA_OK ? "" : lua_tostring(L, -1));
    lua_close(L);
}

static void test_script_compiles_and_runs(void) {
    lua_State *L = host_new();
    if (!L) return;
    lua_pushinteger(L, (lua_Integer)(seed % 2147483647));
    lua_setglobal(L, "HOST_SEED");
    char path[4096];
    snprintf(path, sizeof path, "%s/spec/host_script.lua", root());
    int status = luaL_loadfile(L, path);
    if (status == LUA_OK) status = lua_pcall(L, 0, 1, 0);
    CHECK(status == LUA_OK, "%s", lua_tostring(L, -1));
    if (status == LUA_OK) {
        /* the script returns how many checks it made */
        CHECK(lua_tointeger(L, -1) > 0, "the script made no checks");
        printf("# host script: %lld checks\n", (long long)lua_tointeger(L, -1));
    }
    lua_close(L);
}

static void test_errors_leave_the_host_usable(void) {
    lua_State *L = host_new();
    if (!L) return;
    int status = run_chunk(L, "local mk = require 'moonkaas'\n"
                              "return mk.zeros('float32', {2, 0})", 1);
    CHECK(status == LUA_ERRRUN, "no error for an empty tensor");
    const char *msg = lua_tostring(L, -1);
    CHECK(msg && !strncmp(msg, "shape error: ", 13), "message '%s'", msg ? msg : "(null)");
    lua_pop(L, 1);
    status = run_chunk(L, "local mk = require 'moonkaas'\n"
                          "return mk.compile_script('$1 = ReLUNode(;')", 1);
    msg = lua_tostring(L, -1);
    CHECK(status == LUA_ERRRUN && msg && !strncmp(msg, "script:1:", 9), "message '%s'",
          msg ? msg : "(null)");
    lua_pop(L, 1);
    status = run_chunk(L, "local mk = require 'moonkaas'\n"
                          "local x = mk.input('x', 'float32', {3})\n"
                          "local m = mk.compile(x:relu())\n"
                          "return m:run({x = mk.tensor({-1, 0, 5})}):get(3)", 1);
    CHECK(status == LUA_OK && lua_tonumber(L, -1) == 5, "%s",
          status == LUA_OK ? "wrong value" : lua_tostring(L, -1));
    lua_close(L); /* the unclosed model goes with the state */
}

int main(void) {
    seed = test_seed();
    RUN(test_tensor_data_aligned);
    RUN(test_registered_statically);
    RUN(test_script_compiles_and_runs);
    RUN(test_errors_leave_the_host_usable);
    return test_summary("lua_host");
}
