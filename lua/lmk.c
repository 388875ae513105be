/*
 * lmk.c — the helpers every file of the binding uses (declared in lmk.h):
 * raising errors with a kind prefix, checking arguments, printing shapes,
 * setting up metatables.
 */
#include "lmk.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ==== errors ================================================================ */

int lmk_raise(lua_State *L, const char *kind, const char *fn, const char *fmt, ...) {
    char body[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    /* lua_error, not luaL_error: the message starts with the kind, no position. */
    lua_pushfstring(L, "%s: %s: %s", kind, fn, body);
    return lua_error(L);
}

int lmk_raise_core(lua_State *L, mk_error *err) {
    char msg[1400];
    snprintf(msg, sizeof msg, "%s", err ? mk_error_message(err) : "internal error: no message");
    mk_error_free(err);
    lua_pushstring(L, msg);
    return lua_error(L);
}

/* ==== argument checks ======================================================= */

/* "float32, int64, ..." from the core's dtype table. */
static const char *dtype_names(char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    for (int d = 0; d < MK_DTYPE_COUNT && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s", d ? ", " : "", mk_dtype_name((mk_dtype)d));
    return buf;
}

mk_dtype lmk_check_dtype(lua_State *L, int idx, const char *fn, bool allow_default) {
    char names[128];
    if (allow_default && lua_isnoneornil(L, idx)) return MK_DTYPE_FLOAT32;
    if (lua_type(L, idx) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "dtype must be a string (%s), got %s",
                      dtype_names(names, sizeof names), luaL_typename(L, idx));
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    mk_dtype dtype;
    if (mk_dtype_parse(s, len, &dtype) != 0)
        lmk_raise(L, "dtype error", fn, "unknown dtype '%s' (%s)", s,
                  dtype_names(names, sizeof names));
    return dtype;
}

int64_t lmk_check_int(lua_State *L, int idx, const char *fn, const char *what) {
    int ok = 0;
    lua_Integer v = lua_tointegerx(L, idx, &ok);
    if (!ok) {
        if (lua_type(L, idx) == LUA_TNUMBER)
            LMK_ARG_ERROR(L, fn, "%s must be an integer, got %s", what, lua_tostring(L, idx));
        LMK_ARG_ERROR(L, fn, "%s must be an integer, got %s", what, luaL_typename(L, idx));
    }
    return (int64_t)v;
}

int lmk_check_int_list(lua_State *L, int idx, const char *fn, const char *what, int64_t *out,
                       int max) {
    if (lua_type(L, idx) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "%s must be a table of integers, got %s", what,
                      luaL_typename(L, idx));
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx); /* raw: no __len or __index runs here */
    if (n > max)
        lmk_raise(L, "shape error", fn, "%s has %lld entries (at most %d)", what, (long long)n,
                  max);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, i);
        int ok = 0;
        lua_Integer v = lua_tointegerx(L, -1, &ok);
        if (!ok)
            LMK_ARG_ERROR(L, fn, "%s[%lld] must be an integer, got %s", what, (long long)i,
                          lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1)
                                                         : luaL_typename(L, -1));
        out[i - 1] = (int64_t)v;
        lua_pop(L, 1);
    }
    return (int)n;
}

int lmk_check_shape(lua_State *L, int idx, const char *fn, int64_t *shape) {
    int rank = lmk_check_int_list(L, idx, fn, "shape", shape, MK_MAX_RANK);
    if (rank < 1)
        lmk_raise(L, "shape error", fn, "shape {} is 0-d (ranks 1 to %d)", MK_MAX_RANK);
    for (int i = 0; i < rank; i++)
        if (shape[i] <= 0)
            lmk_raise(L, "shape error", fn, "dimension %d of %s is %lld (no empty tensors)", i,
                      LMK_SHAPE_STR(rank, shape), (long long)shape[i]);
    int64_t numel = 1;
    for (int i = 0; i < rank; i++)
        if (__builtin_mul_overflow(numel, shape[i], &numel) || numel > MK_MAX_NUMEL)
            lmk_raise(L, "shape error", fn, "%s has more than 2^48 elements",
                      LMK_SHAPE_STR(rank, shape));
    return rank;
}

bool lmk_is_identifier(const char *s, size_t len) {
    if (strlen(s) != len) return false; /* an embedded NUL: C would see a shorter name */
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
    for (s++; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return false;
    return true;
}

/* ==== shapes ================================================================ */

const char *lmk_shape_str(int rank, const int64_t *shape, char *buf, size_t size) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (int i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

bool lmk_same_shape(int ra, const int64_t *a, int rb, const int64_t *b) {
    if (ra != rb) return false;
    for (int i = 0; i < ra; i++)
        if (a[i] != b[i]) return false;
    return true;
}

void lmk_push_shape(lua_State *L, int rank, const int64_t *shape) {
    lua_createtable(L, rank, 0);
    for (int i = 0; i < rank; i++) {
        lua_pushinteger(L, shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

/* ==== metatables and strings ================================================ */

void lmk_define_type(lua_State *L, const char *name, const luaL_Reg *meta,
                     const luaL_Reg *methods, lua_CFunction index) {
    luaL_newmetatable(L, name);
    luaL_setfuncs(L, meta, 0);
    if (methods) {
        if (lua_getfield(L, -1, "methods") != LUA_TTABLE) {
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushvalue(L, -1);
            lua_setfield(L, -3, "methods");
        }
        luaL_setfuncs(L, methods, 0);
        if (index) lua_pushcclosure(L, index, 1); /* fields first, then the methods */
        lua_setfield(L, -2, "__index");
    }
}

/* lua_pcall'd: pushes the C string (a memory error must not leak it). */
static int push_cstring(lua_State *L) {
    lua_pushstring(L, (const char *)lua_touserdata(L, 1));
    return 1;
}

void lmk_push_core_string(lua_State *L, char *s) {
    lua_pushcfunction(L, push_cstring);
    lua_pushlightuserdata(L, s);
    int status = lua_pcall(L, 1, 1, 0);
    mk_string_free(s);
    if (status != LUA_OK) lua_error(L);
}
