/*
 * onnx.c — ONNX files for the Lua module (lua/moonkaas/onnx.lua builds
 * mk.load_onnx on these):
 *
 *   core.onnx_open(path[, shapes]) -> import: a moonkaas.onnx handle (the
 *       parsed file, its constants' memory and mapped external data), born
 *       closed, released by __gc only (its constants' tensors may outlive any
 *       other reference to it);
 *   import:script() import:opset() import:constants() -> {name = tensor}
 *       (read-only tensors over the import's memory, which they keep alive)
 *   import:inputs() -> {{name =, script =, dtype =, shape =}, ...}
 *   import:outputs() -> {name, ...}
 *   core.onnx_ops() -> the importer's mapping table, a row per ONNX op.
 */
#include "lmk.h"

#include <string.h>

#define LMK_ONNX_MT "moonkaas.onnx"

static mk_onnx **check_import(lua_State *L, const char *fn) {
    mk_onnx **h = (mk_onnx **)luaL_testudata(L, 1, LMK_ONNX_MT);
    if (!h) LMK_ARG_ERROR(L, fn, "argument #1 must be an ONNX import, got %s", luaL_typename(L, 1));
    if (!*h) LMK_ARG_ERROR(L, fn, "the ONNX import is closed");
    return h;
}

static int onnx_gc(lua_State *L) {
    mk_onnx **h = (mk_onnx **)luaL_checkudata(L, 1, LMK_ONNX_MT);
    mk_onnx_close(*h);
    *h = NULL;
    return 0;
}

/* shapes = {name = {d1, d2, ...}}: read into a userdata array (freed by the collector) */
static mk_onnx_options check_shapes(lua_State *L, int idx, const char *fn) {
    mk_onnx_options o = {0};
    if (lua_isnoneornil(L, idx)) return o;
    if (lua_type(L, idx) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "shapes must be a table {input = {dims}}, got %s",
                      luaL_typename(L, idx));
    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) n++, lua_pop(L, 1);
    mk_onnx_shape *s = (mk_onnx_shape *)lua_newuserdatauv(L, (n ? n : 1) * sizeof *s, 0);
    size_t i = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -2) != LUA_TSTRING)
            LMK_ARG_ERROR(L, fn, "shapes: keys must be input names, got %s",
                          luaL_typename(L, -2));
        if (lua_type(L, -1) != LUA_TTABLE)
            LMK_ARG_ERROR(L, fn, "shapes.%s must be a list of dims, got %s",
                          lua_tostring(L, -2), luaL_typename(L, -1));
        s[i] = (mk_onnx_shape){.input = lua_tostring(L, -2)}; /* anchored by the table */
        s[i].rank = lmk_check_int_list(L, lua_gettop(L), fn, "shape", s[i].shape, MK_MAX_RANK);
        for (int k = 0; k < s[i].rank; k++)
            if (s[i].shape[k] < 1)
                LMK_ARG_ERROR(L, fn, "shapes.%s: dim %d is %lld (must be positive)",
                              s[i].input, k + 1, (long long)s[i].shape[k]);
        i++;
        lua_pop(L, 1);
    }
    o.shapes = s, o.n_shapes = n;
    return o;
}

static int l_onnx_open(lua_State *L) {
    const char *fn = "load_onnx";
    if (lua_type(L, 1) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "argument #1 must be a path, got %s", luaL_typename(L, 1));
    lua_settop(L, 2);
    mk_onnx_options opts = check_shapes(L, 2, fn);
    mk_onnx **h = (mk_onnx **)lua_newuserdatauv(L, sizeof *h, 0);
    *h = NULL;
    luaL_setmetatable(L, LMK_ONNX_MT);
    mk_error *err = NULL;
    if (!(*h = mk_onnx_open(lua_tostring(L, 1), &opts, &err))) return lmk_raise_core(L, err);
    return 1;
}

static int onnx_script(lua_State *L) {
    lua_pushstring(L, mk_onnx_script(*check_import(L, "script")));
    return 1;
}

static int onnx_opset(lua_State *L) {
    lua_pushinteger(L, mk_onnx_opset(*check_import(L, "opset")));
    return 1;
}

static int onnx_constants(lua_State *L) {
    mk_onnx *o = *check_import(L, "constants");
    size_t n = mk_onnx_constant_count(o);
    lua_createtable(L, 0, n > 1000000 ? 0 : (int)n);
    for (size_t i = 0; i < n; i++) {
        mk_tensor_info info;
        const void *data;
        mk_onnx_constant(o, i, &info, &data);
        int64_t numel = 1;
        for (int k = 0; k < info.rank; k++) numel *= info.shape[k];
        lmk_tensor *t = (lmk_tensor *)lua_newuserdatauv(L, sizeof *t, 1);
        *t = (lmk_tensor){.dtype = info.dtype, .rank = info.rank, .numel = numel,
                          .bytes = (size_t)numel * mk_dtype_size(info.dtype), .data = (void *)data,
                          .readonly = true};
        memcpy(t->shape, info.shape, sizeof(int64_t) * (size_t)info.rank);
        luaL_setmetatable(L, LMK_TENSOR_MT);
        lua_pushvalue(L, 1);
        lua_setiuservalue(L, -2, 1); /* the tensor keeps the import */
        lua_setfield(L, -2, info.name);
    }
    return 1;
}

static int onnx_inputs(lua_State *L) {
    mk_onnx *o = *check_import(L, "inputs");
    size_t n = mk_onnx_input_count(o);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        const char *name;
        mk_tensor_info info;
        mk_onnx_input(o, i, &name, &info);
        lua_createtable(L, 0, 4);
        lua_pushstring(L, name);
        lua_setfield(L, -2, "name");
        lua_pushstring(L, info.name);
        lua_setfield(L, -2, "script");
        lua_pushstring(L, mk_dtype_name(info.dtype));
        lua_setfield(L, -2, "dtype");
        lmk_push_shape(L, info.rank, info.shape);
        lua_setfield(L, -2, "shape");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

static int onnx_outputs(lua_State *L) {
    mk_onnx *o = *check_import(L, "outputs");
    size_t n = mk_onnx_output_count(o);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        lua_pushstring(L, mk_onnx_output_name(o, i));
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

static void set_string(lua_State *L, const char *k, const char *v) {
    lua_pushstring(L, v ? v : "");
    lua_setfield(L, -2, k);
}

static int l_onnx_ops(lua_State *L) {
    size_t n = mk_onnx_op_count();
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        const mk_onnx_op_desc *d = mk_onnx_op_info(i);
        lua_createtable(L, 0, 6);
        set_string(L, "op_type", d->op_type);
        lua_pushinteger(L, d->since);
        lua_setfield(L, -2, "since");
        lua_pushinteger(L, d->until);
        lua_setfield(L, -2, "last"); /* "until" is a Lua keyword */
        set_string(L, "attributes", d->attributes);
        set_string(L, "becomes", d->becomes);
        set_string(L, "rules", d->rules);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

void lmk_open_onnx(lua_State *L) {
    static const luaL_Reg meta[] = {{"__gc", onnx_gc}, {NULL, NULL}};
    static const luaL_Reg methods[] = {
        {"script", onnx_script}, {"opset", onnx_opset}, {"constants", onnx_constants},
        {"inputs", onnx_inputs}, {"outputs", onnx_outputs}, {NULL, NULL}};
    lmk_define_type(L, LMK_ONNX_MT, meta, methods, NULL);
    lua_pop(L, 1);
    static const luaL_Reg functions[] = {
        {"onnx_open", l_onnx_open}, {"onnx_ops", l_onnx_ops}, {NULL, NULL}};
    luaL_setfuncs(L, functions, 0);
}
