/*
 * module.c — the module `moonkaas.core`: luaopen_moonkaas_core, the context of
 * a lua_State (moonkaas.context) and the functions that belong to no userdata.
 *
 *   context one mk_context per lua_State, in the registry, made the first time
 *           a model is compiled (never at luaopen, so loading the module never
 *           initialises CUDA); models keep the core's context alive themselves
 *
 * luaopen is idempotent (busted reloads modules per spec file): metatables are
 * made once and refilled, so values made before a reload keep working.
 */
#include "lmk.h"

#include <dlfcn.h>
#include <time.h>

#define CONTEXT_KEY "moonkaas.context.instance"

/* ==== context =============================================================== */

typedef struct {
    mk_context *ctx; /* NULL while closed */
} lmk_context_ud;

static int context_gc(lua_State *L) {
    lmk_context_ud *c = (lmk_context_ud *)luaL_checkudata(L, 1, LMK_CONTEXT_MT);
    if (c->ctx) mk_context_free(c->ctx);
    c->ctx = NULL;
    return 0;
}

mk_context *lmk_context(lua_State *L) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, CONTEXT_KEY) == LUA_TUSERDATA) {
        lmk_context_ud *c = (lmk_context_ud *)lua_touserdata(L, -1);
        lua_pop(L, 1);
        if (c->ctx) return c->ctx;
    } else {
        lua_pop(L, 1);
    }
    lmk_context_ud *c = (lmk_context_ud *)lua_newuserdatauv(L, sizeof *c, 0);
    c->ctx = NULL;
    luaL_setmetatable(L, LMK_CONTEXT_MT);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, CONTEXT_KEY);
    lua_pop(L, 1);
    mk_error *err = NULL;
    c->ctx = mk_context_new(&err);
    if (!c->ctx) lmk_raise_core(L, err);
    return c->ctx;
}

/* ==== module functions ======================================================= */

/* mk.cuda_available() -> true | false, reason */
static int l_cuda_available(lua_State *L) {
    char reason[256] = "";
    if (mk_cuda_available(reason, sizeof reason)) {
        lua_pushboolean(L, 1);
        return 1;
    }
    lua_pushboolean(L, 0);
    lua_pushstring(L, reason[0] ? reason : "CUDA is not available");
    return 2;
}

/* core.format_script(text) -> the script as the core prints it after parsing. */
static int l_format_script(lua_State *L) {
    if (lua_type(L, 1) != LUA_TSTRING)
        LMK_ARG_ERROR(L, "format_script", "the script must be a string, got %s",
                      luaL_typename(L, 1));
    mk_error *err = NULL;
    char *s = mk_script_format(lua_tostring(L, 1), &err);
    if (!s) lmk_raise_core(L, err);
    lmk_push_core_string(L, s);
    return 1;
}

/* mk.clock() -> seconds of a monotonic wall clock, for timing */
static int l_clock(lua_State *L) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
    return 1;
}

/* ==== luaopen ================================================================= */

/*
 * Keeps this module (and with it libgomp and the CUDA runtime) loaded until the
 * process ends. lua_close dlcloses C modules, but OpenMP's parked worker
 * threads and CUDA's driver threads outlive any lua_State; unloading their
 * code under them is unsafe (and loses libgomp's start-up allocations).
 */
static void pin_module(void) {
    Dl_info info;
    if (dladdr((void *)pin_module, &info) && info.dli_fname)
        (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

LMK_EXPORT int luaopen_moonkaas_core(lua_State *L) {
    luaL_checkversion(L);
    pin_module();

    static const luaL_Reg context_meta[] = {{"__gc", context_gc}, {NULL, NULL}};
    lmk_define_type(L, LMK_CONTEXT_MT, context_meta, NULL, NULL);
    lua_pop(L, 1);

    static const luaL_Reg functions[] = {
        {"cuda_available", l_cuda_available}, {"format_script", l_format_script},
        {"clock", l_clock}, {NULL, NULL}};
    luaL_newlib(L, functions);
    lmk_open_tensor(L);
    lmk_open_node(L);
    lmk_open_model(L);
    lua_pushstring(L, mk_version());
    lua_setfield(L, -2, "version");
    lua_pushstring(L, mk_build_info());
    lua_setfield(L, -2, "build_info");
    return 1;
}
