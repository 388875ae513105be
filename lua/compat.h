/*
 * compat.h — the Lua 5.4 C API the binding uses, on Lua 5.1 and LuaJIT 2.1.
 *
 * The binding is written against Lua 5.4. Built against a 5.1 header
 * (LUA_VERSION_NUM 501: Lua 5.1 and LuaJIT), this header maps each 5.4 call
 * the binding makes onto the 5.1 API; against 5.3 or 5.4 it adds nothing.
 * Included by lmk.h right after lua.h and lauxlib.h, so every file of the
 * binding sees the same API whichever Lua it is built for.
 *
 * What differs, and how it is bridged:
 *   - user values: a 5.1 userdata has one environment table, not n user
 *     values. lua_newuserdatauv(L, size, n) with n > 0 gives the userdata a
 *     fresh table, and user value i is that table's slot i.
 *   - integers: 5.1 has one number type, a double. An integer is a number with
 *     an integral value in int64_t's range (lua_tointegerx, lua_isinteger,
 *     luaL_checkinteger refuse a fraction); pushing an int64_t beyond 2^53,
 *     which no double holds exactly, is a dtype error rather than a rounded
 *     value.
 *   - the get functions return the type they pushed (lua_getfield, ...).
 *   - io.open's handle: a FILE* behind the userdata's first field in both
 *     5.1 and LuaJIT (5.4: luaL_Stream), NULL once closed.
 * Each replacement is a static function named lmk_compat_*, and the 5.4 name
 * a macro for it, so no name clashes with what LuaJIT's own headers declare.
 */
#ifndef LMK_COMPAT_H
#define LMK_COMPAT_H

#include <lauxlib.h>
#include <lua.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#if LUA_VERSION_NUM < 502

#define LMK_LUA51 1

#ifndef LUA_OK
#define LUA_OK 0
#endif

/* LuaJIT refuses a userdata over this many bytes with a run-time error
 * ("userdata length overflow"): for a tensor, memory that cannot be had. */
#define LMK_MAX_USERDATA ((size_t)0x7fffff00)

#ifndef LUA_FILEHANDLE /* lualib.h's in 5.1 */
#define LUA_FILEHANDLE "FILE*"
#endif

/* A file handle of the io library: FILE * first, NULL once closed. */
#define LMK_FILE_OF(p) (*(FILE **)(p))

static inline int lmk_compat_absindex(lua_State *L, int idx) {
    return idx > 0 || idx <= LUA_REGISTRYINDEX ? idx : lua_gettop(L) + idx + 1;
}
#define lua_absindex lmk_compat_absindex

/* ---- the get functions return the type of what they pushed ---------------- */

static inline int lmk_compat_getfield(lua_State *L, int idx, const char *k) {
    lua_getfield(L, idx, k);
    return lua_type(L, -1);
}
static inline int lmk_compat_gettable(lua_State *L, int idx) {
    lua_gettable(L, idx);
    return lua_type(L, -1);
}
static inline int lmk_compat_rawget(lua_State *L, int idx) {
    lua_rawget(L, idx);
    return lua_type(L, -1);
}
static inline int lmk_compat_rawgeti(lua_State *L, int idx, lua_Integer n) {
    lua_rawgeti(L, idx, (int)n);
    return lua_type(L, -1);
}
#define lua_getfield lmk_compat_getfield
#define lua_gettable lmk_compat_gettable
#define lua_rawget lmk_compat_rawget
#define lua_rawgeti lmk_compat_rawgeti

#define lua_rawlen(L, i) lua_objlen((L), (i))

/* ---- integers --------------------------------------------------------------- */

/* The number at idx (or a string that converts) as an int64_t, when it has an
 * integral value in int64_t's range; otherwise *ok = 0 and 0. */
static inline lua_Integer lmk_compat_tointegerx(lua_State *L, int idx, int *ok) {
    int dummy;
    if (!ok) ok = &dummy;
    *ok = 0;
    if (!lua_isnumber(L, idx)) return 0;
    lua_Number n = lua_tonumber(L, idx);
    /* -2^63 is exact as a double; 2^63 is the first value past the range */
    if (!(n >= -9223372036854775808.0 && n < 9223372036854775808.0) || n != floor(n)) return 0;
    *ok = 1;
    return (lua_Integer)n;
}
#define lua_tointegerx lmk_compat_tointegerx
#define lua_tointeger(L, i) lmk_compat_tointegerx((L), (i), NULL)

/* 5.1 has no integer subtype: a number with an integral value is one. */
static inline int lmk_compat_isinteger(lua_State *L, int idx) {
    int ok;
    if (lua_type(L, idx) != LUA_TNUMBER) return 0;
    lmk_compat_tointegerx(L, idx, &ok);
    return ok;
}
#define lua_isinteger lmk_compat_isinteger

static inline lua_Integer lmk_compat_checkinteger(lua_State *L, int arg) {
    int ok;
    lua_Integer v = lmk_compat_tointegerx(L, arg, &ok);
    if (!ok) {
        if (lua_isnumber(L, arg)) luaL_argerror(L, arg, "number has no integer representation");
        else luaL_typerror(L, arg, "number");
    }
    return v;
}
#define luaL_checkinteger lmk_compat_checkinteger

/* Doubles hold every integer up to 2^53 exactly; past it, a rounded value
 * would pass for the true one, so it is an error instead. */
static inline void lmk_compat_pushinteger(lua_State *L, lua_Integer v) {
    if (v > ((lua_Integer)1 << 53) || v < -((lua_Integer)1 << 53)) {
        char num[24];
        snprintf(num, sizeof num, "%lld", (long long)v);
        luaL_error(L, "dtype error: the integer %s is beyond 2^53, which a Lua 5.1 number "
                      "does not hold exactly (Lua 5.3 and later read it)", num);
    }
    lua_pushnumber(L, (lua_Number)v);
}
#define lua_pushinteger lmk_compat_pushinteger

/* ---- metatables, registration, userdata --------------------------------------- */

static inline void lmk_compat_setfuncs(lua_State *L, const luaL_Reg *l, int nup) {
    luaL_checkstack(L, nup, "too many upvalues");
    for (; l->name; l++) {
        for (int i = 0; i < nup; i++) lua_pushvalue(L, -nup);
        lua_pushcclosure(L, l->func, nup);
        lua_setfield(L, -(nup + 2), l->name);
    }
    lua_pop(L, nup);
}
#define luaL_setfuncs lmk_compat_setfuncs

#undef luaL_newlib
#define luaL_newlib(L, l) (lua_newtable(L), lmk_compat_setfuncs((L), (l), 0))
#define luaL_checkversion(L) ((void)(L))

static inline void lmk_compat_setmetatable(lua_State *L, const char *tname) {
    luaL_getmetatable(L, tname);
    lua_setmetatable(L, -2);
}
#define luaL_setmetatable lmk_compat_setmetatable

static inline void *lmk_compat_testudata(lua_State *L, int idx, const char *tname) {
    void *p = lua_touserdata(L, idx);
    if (!p || !lua_getmetatable(L, idx)) return NULL;
    luaL_getmetatable(L, tname);
    int same = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return same ? p : NULL;
}
#define luaL_testudata lmk_compat_testudata

/* n user values: slots 1..n of the userdata's environment table. Without
 * them the userdata keeps 5.1's default environment, which it never reads. */
static inline void *lmk_compat_newuserdatauv(lua_State *L, size_t size, int n) {
    void *p = lua_newuserdata(L, size);
    if (n > 0) {
        lua_createtable(L, n, 0);
        lua_setfenv(L, -2);
    }
    return p;
}
#define lua_newuserdatauv lmk_compat_newuserdatauv

static inline int lmk_compat_getiuservalue(lua_State *L, int idx, int n) {
    lua_getfenv(L, idx);
    if (lua_type(L, -1) != LUA_TTABLE) {
        lua_pop(L, 1);
        lua_pushnil(L);
        return LUA_TNONE;
    }
    lua_rawgeti(L, -1, n);
    lua_remove(L, -2);
    return lua_type(L, -1);
}
#define lua_getiuservalue lmk_compat_getiuservalue

/* Pops the value into user value n of the userdata at idx. */
static inline int lmk_compat_setiuservalue(lua_State *L, int idx, int n) {
    idx = lmk_compat_absindex(L, idx);
    lua_getfenv(L, idx);
    if (lua_type(L, -1) != LUA_TTABLE) {
        lua_pop(L, 2);
        return 0;
    }
    lua_pushvalue(L, -2);
    lua_rawseti(L, -2, n);
    lua_pop(L, 2);
    return 1;
}
#define lua_setiuservalue lmk_compat_setiuservalue

/* ---- strings ------------------------------------------------------------------ */

/* Any value as a string, its __tostring first, as print shows it. */
static inline const char *lmk_compat_tolstring(lua_State *L, int idx, size_t *len) {
    idx = lmk_compat_absindex(L, idx);
    if (luaL_callmeta(L, idx, "__tostring")) {
        if (!lua_isstring(L, -1)) luaL_error(L, "'__tostring' must return a string");
    } else {
        switch (lua_type(L, idx)) {
        case LUA_TNUMBER:
        case LUA_TSTRING: lua_pushvalue(L, idx); break;
        case LUA_TBOOLEAN: lua_pushstring(L, lua_toboolean(L, idx) ? "true" : "false"); break;
        case LUA_TNIL: lua_pushliteral(L, "nil"); break;
        default:
            lua_pushfstring(L, "%s: %p", luaL_typename(L, idx), lua_topointer(L, idx));
            break;
        }
    }
    return lua_tolstring(L, -1, len);
}
#define luaL_tolstring lmk_compat_tolstring

#else /* 5.3, 5.4 */

#define LMK_MAX_USERDATA SIZE_MAX

#define LMK_FILE_OF(p) (((luaL_Stream *)(p))->closef ? ((luaL_Stream *)(p))->f : NULL)

#endif
#endif
