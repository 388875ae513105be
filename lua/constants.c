/*
 * constants.c — compile_script's check of its constants table against the
 * script's constant declarations (mk_script_constants), before the core reads
 * their bytes.
 */
#include "lmk.h"

#include <string.h>

/*
 * lua_pcall'd with the mk_script_constants array and its count: pushes
 * {{name =, dtype = mk_dtype, shape =}, ...}. A memory error here must not
 * leak the array, so the caller frees it after the pcall either way.
 */
static int push_declared(lua_State *L) {
    const mk_tensor_info *infos = (const mk_tensor_info *)lua_touserdata(L, 1);
    size_t count = (size_t)lua_tointeger(L, 2);
    lua_createtable(L, (int)count, 0);
    for (size_t i = 0; i < count; i++) {
        lua_createtable(L, 0, 3);
        lua_pushstring(L, infos[i].name);
        lua_setfield(L, -2, "name");
        lua_pushinteger(L, infos[i].dtype);
        lua_setfield(L, -2, "dtype");
        lmk_push_shape(L, infos[i].rank, infos[i].shape);
        lua_setfield(L, -2, "shape");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* Reads {dtype =, shape =} of a push_declared entry on top. */
static void read_declared(lua_State *L, mk_dtype *dtype, int *rank, int64_t *shape) {
    lua_getfield(L, -1, "dtype");
    *dtype = (mk_dtype)lua_tointeger(L, -1);
    lua_getfield(L, -2, "shape");
    *rank = (int)lua_rawlen(L, -1);
    for (int i = 0; i < *rank && i < MK_MAX_RANK; i++) {
        lua_rawgeti(L, -1, i + 1);
        shape[i] = (int64_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
    }
    lua_pop(L, 2);
}

/*
 * Checks the constants table (name -> tensor) against the constant
 * declarations of the script: each given, with the script's dtype and shape
 * (the core reads exactly that many bytes), and no extra names. A script that
 * does not parse raises here, at the Lua line of sources_idx's table.
 */
void lmk_check_constants(lua_State *L, int script_idx, int consts_idx, int sources_idx) {
    const char *fn = "compile";
    mk_error *err = NULL;
    size_t count = 0;
    mk_tensor_info *infos = mk_script_constants(lua_tostring(L, script_idx), &count, &err);
    if (!infos) lmk_raise_at_source(L, sources_idx, err);
    lua_pushcfunction(L, push_declared);
    lua_pushlightuserdata(L, infos);
    lua_pushinteger(L, (lua_Integer)count);
    int status = lua_pcall(L, 2, 1, 0);
    mk_tensor_infos_free(infos);
    if (status != LUA_OK) lua_error(L);
    int declared = lua_gettop(L);
    lua_newtable(L); /* names seen */
    int seen = lua_gettop(L);
    for (size_t i = 1; i <= count; i++) {
        mk_dtype dtype;
        int rank;
        int64_t shape[MK_MAX_RANK];
        lua_rawgeti(L, declared, (lua_Integer)i);
        read_declared(L, &dtype, &rank, shape);
        lua_getfield(L, -1, "name");
        const char *nm = lua_tostring(L, -1); /* anchored by `declared` */
        lua_pop(L, 2);
        lua_pushboolean(L, 1);
        lua_setfield(L, seen, nm);
        if (lua_isnil(L, consts_idx)) lua_pushnil(L);
        else lmk_raw_field(L, consts_idx, nm);
        lmk_tensor *t = lmk_to_tensor(L, -1);
        if (lua_isnil(L, -1))
            lmk_raise(L, "input error", fn, "missing constant '%s' (%s %s)", nm,
                      mk_dtype_name(dtype), LMK_SHAPE_STR(rank, shape));
        if (!t)
            LMK_ARG_ERROR(L, fn, "constant '%s' must be a tensor, got %s", nm,
                          luaL_typename(L, -1));
        if (t->dtype != dtype || !lmk_same_shape(t->rank, t->shape, rank, shape))
            lmk_raise(L, "input error", fn, "constant '%s' is %s %s, the script declares %s %s",
                      nm, mk_dtype_name(t->dtype), LMK_SHAPE_STR(t->rank, t->shape),
                      mk_dtype_name(dtype), LMK_SHAPE_STR(rank, shape));
        lua_pop(L, 1);
    }
    if (!lua_isnil(L, consts_idx)) {
        lua_pushnil(L);
        while (lua_next(L, consts_idx)) {
            lua_pop(L, 1);
            if (lua_type(L, -1) != LUA_TSTRING)
                LMK_ARG_ERROR(L, fn, "constant names must be strings, got %s",
                              luaL_typename(L, -1));
            if (strlen(lua_tostring(L, -1)) != lua_rawlen(L, -1))
                LMK_ARG_ERROR(L, fn, "constant name '%s\\0...' holds a NUL byte",
                              lua_tostring(L, -1));
            lua_pushvalue(L, -1);
            if (lua_gettable(L, seen) == LUA_TNIL)
                lmk_raise(L, "input error", fn,
                          "unknown constant '%s' (the script declares no such constant)",
                          lua_tostring(L, -2));
            lua_pop(L, 1);
        }
    }
    lua_settop(L, declared - 1);
}
