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
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define CONTEXT_KEY "moonkaas.context.instance"

/* ==== context =============================================================== */

/*
 * The host functions (mk.on_log, mk.on_progress) are Lua functions in the
 * registry, called by trampolines while a compile or run is in the core:
 * `current` is the state making the innermost such call (lmk_host_begin ..
 * lmk_host_end; a host function's own runs nest, and restore it after).
 * A function that raises cancels the call, and lmk_host_end raises its error
 * once the core has returned (never a longjmp through the core's frames).
 */
#define CALLBACK_ERROR_KEY "moonkaas.context.callback_error"

typedef struct {
    mk_context *ctx;     /* NULL while closed */
    lua_State *current;  /* the state whose call is in the core, else NULL */
    int log_ref, progress_ref; /* registry references, or LUA_NOREF */
    bool failed;         /* a host function raised during the call */
} lmk_context_ud;

static int context_gc(lua_State *L) {
    lmk_context_ud *c = (lmk_context_ud *)luaL_checkudata(L, 1, LMK_CONTEXT_MT);
    if (c->ctx) mk_context_free(c->ctx);
    c->ctx = NULL;
    luaL_unref(L, LUA_REGISTRYINDEX, c->log_ref);
    luaL_unref(L, LUA_REGISTRYINDEX, c->progress_ref);
    c->log_ref = c->progress_ref = LUA_NOREF;
    return 0;
}

static lmk_context_ud *context_ud(lua_State *L) {
    lmk_context_ud *c = NULL;
    if (lua_getfield(L, LUA_REGISTRYINDEX, CONTEXT_KEY) == LUA_TUSERDATA)
        c = (lmk_context_ud *)lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (c && c->ctx) return c;
    c = (lmk_context_ud *)lua_newuserdatauv(L, sizeof *c, 0);
    *c = (lmk_context_ud){.log_ref = LUA_NOREF, .progress_ref = LUA_NOREF};
    luaL_setmetatable(L, LMK_CONTEXT_MT);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, CONTEXT_KEY);
    lua_pop(L, 1);
    mk_error *err = NULL;
    c->ctx = mk_context_new(&err);
    if (!c->ctx) lmk_raise_core(L, err);
    return c;
}

mk_context *lmk_context(lua_State *L) { return context_ud(L)->ctx; }

lmk_host_scope lmk_host_begin(lua_State *L) {
    lmk_context_ud *c = context_ud(L);
    lmk_host_scope scope = {c->current, c->failed};
    c->current = L;
    c->failed = false;
    return scope;
}

void lmk_host_end(lua_State *L, lmk_host_scope scope, mk_error *err) {
    lmk_context_ud *c = context_ud(L);
    bool failed = c->failed;
    c->current = scope.outer;
    c->failed = scope.outer_failed;
    if (!failed) return;
    mk_error_free(err);
    lua_getfield(L, LUA_REGISTRYINDEX, CALLBACK_ERROR_KEY);
    lua_pushnil(L);
    lua_setfield(L, LUA_REGISTRYINDEX, CALLBACK_ERROR_KEY);
    lua_error(L);
}

/* Calls the function at registry `ref` with the n arguments on the stack of the
 * current state; an error cancels the call it reports on (only that one: a
 * run from a host function that fails, caught there, leaves the run around it
 * going) and is kept for lmk_host_end. */
static void call_host(lmk_context_ud *c, int ref, int n) {
    lua_State *L = c->current;
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    lua_insert(L, -n - 1);
    if (lua_pcall(L, n, 0, 0) == LUA_OK) return;
    if (!c->failed) {
        c->failed = true;
        lua_setfield(L, LUA_REGISTRYINDEX, CALLBACK_ERROR_KEY);
        mk_context_cancel_call(c->ctx);
    } else {
        lua_pop(L, 1);
    }
}

static void log_trampoline(void *user, mk_log_level level, const char *message) {
    lmk_context_ud *c = (lmk_context_ud *)user;
    if (!c->current || c->log_ref == LUA_NOREF || c->failed) return;
    lua_pushstring(c->current, level == MK_LOG_WARNING ? "warning" : "info");
    lua_pushstring(c->current, message);
    call_host(c, c->log_ref, 2);
}

static void progress_trampoline(void *user, mk_phase phase, int64_t done, int64_t total) {
    lmk_context_ud *c = (lmk_context_ud *)user;
    if (!c->current || c->progress_ref == LUA_NOREF || c->failed) return;
    lua_pushstring(c->current, mk_phase_name(phase));
    lua_pushinteger(c->current, (lua_Integer)done);
    lua_pushinteger(c->current, (lua_Integer)total);
    call_host(c, c->progress_ref, 3);
}

/* Sets (function) or clears (nil) the host function at *ref. */
static void set_host_function(lua_State *L, const char *fn, int *ref) {
    if (!lua_isnoneornil(L, 1) && !lua_isfunction(L, 1))
        LMK_ARG_ERROR(L, fn, "expects a function or nil, got %s", luaL_typename(L, 1));
    luaL_unref(L, LUA_REGISTRYINDEX, *ref);
    *ref = LUA_NOREF;
    if (lua_isfunction(L, 1)) {
        lua_pushvalue(L, 1);
        *ref = luaL_ref(L, LUA_REGISTRYINDEX);
    }
}

/* mk.on_log(fn | nil): fn(level, message) gets what the core reports ("info" or
 * "warning"); nil: nothing (the core never prints). */
static int l_on_log(lua_State *L) {
    lmk_context_ud *c = context_ud(L);
    set_host_function(L, "on_log", &c->log_ref);
    mk_context_set_log(c->ctx, c->log_ref == LUA_NOREF ? NULL : log_trampoline, c);
    return 0;
}

/* mk.on_progress(fn | nil): fn(phase, done, total) during compiles ("compile",
 * "upload", "kernels") and CPU runs ("run": launches). */
static int l_on_progress(lua_State *L) {
    lmk_context_ud *c = context_ud(L);
    set_host_function(L, "on_progress", &c->progress_ref);
    mk_context_set_progress(c->ctx, c->progress_ref == LUA_NOREF ? NULL : progress_trampoline, c);
    return 0;
}

/* mk.cancel(): the compile or run in progress (from a host function) stops with
 * "cancelled: ..."; later ones run. */
static int l_cancel(lua_State *L) {
    mk_context_cancel(lmk_context(L));
    return 0;
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
    size_t len;
    const char *text = lua_tolstring(L, 1, &len);
    if (mk_script_check_bytes(text, len, &err)) lmk_raise_core(L, err);
    char *s = mk_script_format(text, &err);
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

/* mk.is_terminal(file) -> whether the Lua file (io.stderr, ...) is a terminal */
static int l_is_terminal(lua_State *L) {
    void *ud = luaL_testudata(L, 1, LUA_FILEHANDLE);
    if (!ud) LMK_ARG_ERROR(L, "is_terminal", "expects a Lua file, got %s", luaL_typename(L, 1));
    FILE *f = LMK_FILE_OF(ud); /* NULL once closed */
    lua_pushboolean(L, f && isatty(fileno(f)));
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
        {"clock", l_clock}, {"on_log", l_on_log}, {"on_progress", l_on_progress},
        {"cancel", l_cancel}, {"is_terminal", l_is_terminal}, {NULL, NULL}};
    luaL_newlib(L, functions);
    lmk_open_tensor(L);
    lmk_open_node(L);
    lmk_open_model(L);
    lmk_open_onnx(L);
    lua_pushstring(L, mk_version());
    lua_setfield(L, -2, "version");
    lua_pushstring(L, mk_build_info());
    lua_setfield(L, -2, "build_info");
    return 1;
}
