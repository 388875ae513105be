/*
 * tensor.c — host tensors.
 *
 *   tensor  (moonkaas.tensor) a dense row-major host array of any dtype of the
 *           core's table, rank 1 to 4, that owns its bytes (just after its
 *           header), or a read-only window into a file's bytes (file.c: a
 *           mapping, user value 1 of each such tensor)
 *
 * Any dtype can be made (mk.zeros, mk.from_bytes, mk.from_file: sizes from
 * mk_dtype_size) and handed to models. Elements are read and written as Lua
 * numbers (mk.tensor, t:get, t:set, t:totable, t:argmax, tostring) through the
 * `elements` table below: every dtype of the table has a row (float16 and
 * bfloat16 through mk_convert, int8 as integers in [-128, 127]).
 *
 * Conversions (the core's rules, on the host): t:to(dtype) (mk_convert),
 * mk.quantize(t, group) (llama2.c's int8 groups, mk_quantize_q8),
 * q:dequantize(scale) (the DequantizeNode's blocks), t:reshape(shape).
 */
#include "lmk.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ==== elements as Lua numbers ================================================ */

/* How one dtype's elements become Lua numbers and back; data is the tensor's.
 * store gets the number both ways (iv for integer dtypes, checked by
 * check_element first; nv for float dtypes). */
typedef struct {
    void (*push)(lua_State *L, const void *data, int64_t i);
    void (*store)(void *data, int64_t i, lua_Integer iv, lua_Number nv);
    bool (*greater)(const void *data, int64_t i, int64_t j); /* argmax: x[i] beats x[j] */
    int (*format)(char *buf, size_t size, const void *data, int64_t i);
} element_ops;

static void push_f32(lua_State *L, const void *data, int64_t i) {
    lua_pushnumber(L, ((const float *)data)[i]);
}
static void store_f32(void *data, int64_t i, lua_Integer iv, lua_Number nv) {
    (void)iv;
    ((float *)data)[i] = (float)nv;
}
static bool greater_float(float a, float b) { /* a NaN wins, as the first one */
    return a > b || (isnan(a) && !isnan(b));
}
static bool greater_f32(const void *data, int64_t i, int64_t j) {
    const float *x = (const float *)data;
    return greater_float(x[i], x[j]);
}
static int format_float(char *buf, size_t size, float v) {
    return snprintf(buf, size, "%.6g", (double)v);
}
static int format_f32(char *buf, size_t size, const void *data, int64_t i) {
    return format_float(buf, size, ((const float *)data)[i]);
}

static void push_i64(lua_State *L, const void *data, int64_t i) {
    lua_pushinteger(L, ((const int64_t *)data)[i]);
}
static void store_i64(void *data, int64_t i, lua_Integer iv, lua_Number nv) {
    (void)nv;
    ((int64_t *)data)[i] = (int64_t)iv;
}
static bool greater_i64(const void *data, int64_t i, int64_t j) {
    return ((const int64_t *)data)[i] > ((const int64_t *)data)[j];
}
static int format_i64(char *buf, size_t size, const void *data, int64_t i) {
    return snprintf(buf, size, "%lld", (long long)((const int64_t *)data)[i]);
}

/*
 * float16 and bfloat16 (2 bytes each) go through mk_convert, the CastNode's
 * rule: read exactly as float32; a Lua number is a float32 first (as for a
 * float32 tensor), then rounds to nearest even, float16 overflowing to ±inf,
 * so mk.tensor(xs, "bfloat16") holds what mk.tensor(xs):to("bfloat16") does.
 */
static float half_get(mk_dtype d, const void *data, int64_t i) {
    float f;
    mk_convert(&f, MK_DTYPE_FLOAT32, (const uint16_t *)data + i, d, 1);
    return f;
}
static void half_set(mk_dtype d, void *data, int64_t i, lua_Number nv) {
    float f = (float)nv;
    mk_convert((uint16_t *)data + i, d, &f, MK_DTYPE_FLOAT32, 1);
}

#define HALF_ELEMENTS(name, DTYPE)                                                          \
    static void push_##name(lua_State *L, const void *data, int64_t i) {                    \
        lua_pushnumber(L, half_get(DTYPE, data, i));                                         \
    }                                                                                        \
    static void store_##name(void *data, int64_t i, lua_Integer iv, lua_Number nv) {        \
        (void)iv;                                                                            \
        half_set(DTYPE, data, i, nv);                                                        \
    }                                                                                        \
    static bool greater_##name(const void *data, int64_t i, int64_t j) {                    \
        return greater_float(half_get(DTYPE, data, i), half_get(DTYPE, data, j));            \
    }                                                                                        \
    static int format_##name(char *buf, size_t size, const void *data, int64_t i) {         \
        return format_float(buf, size, half_get(DTYPE, data, i));                            \
    }
HALF_ELEMENTS(f16, MK_DTYPE_FLOAT16)
HALF_ELEMENTS(bf16, MK_DTYPE_BFLOAT16)
#undef HALF_ELEMENTS

/* int8: integers in [-128, 127] only (check_element refuses the rest). */
static void push_i8(lua_State *L, const void *data, int64_t i) {
    lua_pushinteger(L, ((const int8_t *)data)[i]);
}
static void store_i8(void *data, int64_t i, lua_Integer iv, lua_Number nv) {
    (void)nv;
    ((int8_t *)data)[i] = (int8_t)iv;
}
static bool greater_i8(const void *data, int64_t i, int64_t j) {
    return ((const int8_t *)data)[i] > ((const int8_t *)data)[j];
}
static int format_i8(char *buf, size_t size, const void *data, int64_t i) {
    return snprintf(buf, size, "%d", (int)((const int8_t *)data)[i]);
}

/* bool: Lua's booleans (check_element stores them as 1 or 0 in iv). */
static void push_bool(lua_State *L, const void *data, int64_t i) {
    lua_pushboolean(L, ((const uint8_t *)data)[i] != 0);
}
static void store_bool(void *data, int64_t i, lua_Integer iv, lua_Number nv) {
    (void)nv;
    ((uint8_t *)data)[i] = iv != 0;
}
static bool greater_bool(const void *data, int64_t i, int64_t j) {
    return (((const uint8_t *)data)[i] != 0) > (((const uint8_t *)data)[j] != 0);
}
static int format_bool(char *buf, size_t size, const void *data, int64_t i) {
    return snprintf(buf, size, "%s", ((const uint8_t *)data)[i] ? "true" : "false");
}

/* Indexed by mk_dtype; a dtype without a row has no Lua element view. */
static const element_ops elements[MK_DTYPE_COUNT] = {
    [MK_DTYPE_FLOAT32] = {push_f32, store_f32, greater_f32, format_f32},
    [MK_DTYPE_INT64] = {push_i64, store_i64, greater_i64, format_i64},
    [MK_DTYPE_FLOAT16] = {push_f16, store_f16, greater_f16, format_f16},
    [MK_DTYPE_BFLOAT16] = {push_bf16, store_bf16, greater_bf16, format_bf16},
    [MK_DTYPE_INT8] = {push_i8, store_i8, greater_i8, format_i8},
    [MK_DTYPE_BOOL] = {push_bool, store_bool, greater_bool, format_bool},
};

static const element_ops *element_ops_of(mk_dtype d) {
    return (unsigned)d < MK_DTYPE_COUNT && elements[d].push ? &elements[d] : NULL;
}

/* The element view of t's dtype, or a dtype error naming fn. */
static const element_ops *need_elements(lua_State *L, mk_dtype dtype, const char *fn) {
    const element_ops *e = element_ops_of(dtype);
    if (!e)
        lmk_raise(L, "dtype error", fn,
                  "%s elements cannot be read or written from Lua (mk.zeros, mk.from_bytes "
                  "and mk.from_file make such tensors)",
                  mk_dtype_name(dtype));
    return e;
}

/* The range of an integer dtype narrower than a Lua integer (int8), or false. */
static bool narrow_range(mk_dtype dtype, lua_Integer *lo, lua_Integer *hi) {
    if (dtype != MK_DTYPE_INT8) return false;
    *lo = INT8_MIN;
    *hi = INT8_MAX;
    return true;
}

/* Reads the Lua number at idx as an element of `dtype` (an integer dtype takes
 * integral values only, int8 those in [-128, 127]); `where` names the element
 * in errors. */
static void check_element(lua_State *L, mk_dtype dtype, int idx, const char *fn,
                          const char *where, lua_Integer *iv, lua_Number *nv) {
    if (dtype == MK_DTYPE_BOOL) {
        if (lua_type(L, idx) != LUA_TBOOLEAN)
            LMK_ARG_ERROR(L, fn, "element %s is %s, expected a boolean (bool tensor)", where,
                          luaL_typename(L, idx));
        *iv = lua_toboolean(L, idx), *nv = 0;
        return;
    }
    if (lua_type(L, idx) != LUA_TNUMBER)
        LMK_ARG_ERROR(L, fn, "element %s is %s, expected a number", where,
                      luaL_typename(L, idx));
    *nv = lua_tonumber(L, idx);
    *iv = 0;
    if (!mk_dtype_is_float(dtype)) {
        int ok = 0;
        lua_Integer lo, hi;
        *iv = lua_tointegerx(L, idx, &ok);
        if (!ok)
            LMK_ARG_ERROR(L, fn, "element %s = %s is not an integer (%s tensor)", where,
                          lua_tostring(L, idx), mk_dtype_name(dtype));
        if (narrow_range(dtype, &lo, &hi) && (*iv < lo || *iv > hi))
            LMK_ARG_ERROR(L, fn, "element %s = %s is out of range for %s (%lld to %lld)", where,
                          lua_tostring(L, idx), mk_dtype_name(dtype), (long long)lo,
                          (long long)hi);
    }
}

static void store_element(lua_State *L, lmk_tensor *t, const element_ops *e, int64_t i, int idx,
                          const char *fn, const char *where) {
    lua_Integer iv;
    lua_Number nv;
    check_element(L, t->dtype, idx, fn, where, &iv, &nv);
    e->store(t->data, i, iv, nv);
}

void lmk_fill_tensor(lua_State *L, lmk_tensor *t, int idx, const char *fn) {
    const element_ops *e = need_elements(L, t->dtype, fn);
    int ok = 1;
    lua_Integer iv = mk_dtype_is_float(t->dtype) ? 0 : lua_tointegerx(L, idx, &ok), lo, hi;
    if (t->dtype == MK_DTYPE_BOOL && lua_type(L, idx) == LUA_TNUMBER)
        lmk_raise(L, "dtype error", fn, "%s is a number, and the other operand is bool",
                  lua_tostring(L, idx));
    if (!ok)
        lmk_raise(L, "dtype error", fn, "%s is not an integer, and the other operand is %s",
                  lua_tostring(L, idx), mk_dtype_name(t->dtype));
    if (narrow_range(t->dtype, &lo, &hi) && (iv < lo || iv > hi))
        lmk_raise(L, "dtype error", fn, "%s is out of range for %s (%lld to %lld), the other "
                  "operand's dtype", lua_tostring(L, idx), mk_dtype_name(t->dtype),
                  (long long)lo, (long long)hi);
    lua_Number nv = lua_tonumber(L, idx);
    for (int64_t i = 0; i < t->numel; i++) e->store(t->data, i, iv, nv);
}

/* ==== making tensors ========================================================= */

size_t lmk_shape_bytes(lua_State *L, const char *fn, mk_dtype dtype, int rank,
                       const int64_t *shape, int64_t *numel_out) {
    uint64_t numel = 1;
    for (int i = 0; i < rank; i++)
        if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel) || numel > (uint64_t)MK_MAX_NUMEL)
            lmk_raise(L, "shape error", fn, "%s has too many elements",
                      LMK_SHAPE_STR(rank, shape));
    if (numel_out) *numel_out = (int64_t)numel;
    return (size_t)numel * mk_dtype_size(dtype);
}

/* The header rounded up to 16 bytes, then up to TENSOR_ALIGN bytes more (Lua
 * aligns a userdata's block to 8), so that the data start a cache line: a CPU
 * model borrows a constant's data in place, and its vector loads of whole
 * rows split across two lines otherwise (on a Xeon that doubled a small
 * MLP's time). */
#define TENSOR_HEADER ((sizeof(lmk_tensor) + 15) & ~(size_t)15)
#define TENSOR_ALIGN 64

lmk_tensor *lmk_to_tensor(lua_State *L, int idx) {
    return (lmk_tensor *)luaL_testudata(L, idx, LMK_TENSOR_MT);
}

lmk_tensor *lmk_check_tensor(lua_State *L, int idx, const char *fn) {
    lmk_tensor *t = lmk_to_tensor(L, idx);
    if (!t)
        LMK_ARG_ERROR(L, fn, "argument #%d must be a tensor, got %s", idx, luaL_typename(L, idx));
    return t;
}

/* lua_pcall'd: the userdata of argument 1's size (a memory error is caught). */
static int new_tensor_userdata(lua_State *L) {
    lua_newuserdatauv(L, *(const size_t *)lua_touserdata(L, 1), 1);
    return 1;
}

lmk_tensor *lmk_push_tensor(lua_State *L, const char *fn, mk_dtype dtype, int rank,
                            const int64_t *shape) {
    int64_t numel;
    size_t bytes = lmk_shape_bytes(L, fn, dtype, rank, shape, &numel),
           size = TENSOR_HEADER + TENSOR_ALIGN + bytes;
    lua_pushcfunction(L, new_tensor_userdata);
    lua_pushlightuserdata(L, &size);
    int status = lua_pcall(L, 1, 1, 0);
    if (status == LUA_ERRRUN && size > LMK_MAX_USERDATA) status = LUA_ERRMEM;
    if (status != LUA_OK) {
        if (status != LUA_ERRMEM) lua_error(L);
        lua_pop(L, 1);
        lmk_raise(L, "out of memory", fn, "a %s %s tensor needs %zu bytes", mk_dtype_name(dtype),
                  LMK_SHAPE_STR(rank, shape), bytes);
    }
    lmk_tensor *t = (lmk_tensor *)lua_touserdata(L, -1);
    *t = (lmk_tensor){.dtype = dtype, .rank = rank, .numel = numel, .bytes = bytes};
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    uintptr_t at = (uintptr_t)t + TENSOR_HEADER;
    t->data = (void *)((at + TENSOR_ALIGN - 1) & ~(uintptr_t)(TENSOR_ALIGN - 1));
    memset(t->data, 0, bytes);
    luaL_setmetatable(L, LMK_TENSOR_MT);
    return t;
}

/* Fills t from the nested table at idx (depth 0 = the outermost axis). */
static void fill_nested(lua_State *L, int idx, lmk_tensor *t, const element_ops *e, int depth,
                        int64_t *index, int64_t *next, const char *fn) {
    char where[96];
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    if (n != t->shape[depth])
        lmk_raise(L, "shape error", fn, "ragged table: %s %s has %lld entries, expected %lld",
                  depth ? "row" : "table",
                  depth ? lmk_shape_str(depth, index, where, sizeof where) : "", (long long)n,
                  (long long)t->shape[depth]);
    luaL_checkstack(L, 2, "tensor nesting");
    for (lua_Integer i = 1; i <= n; i++) {
        index[depth] = i;
        lua_rawgeti(L, idx, i);
        if (depth + 1 < t->rank) {
            if (lua_type(L, -1) != LUA_TTABLE)
                lmk_raise(L, "shape error", fn, "ragged table: entry %s is %s, expected a table",
                          lmk_shape_str(depth + 1, index, where, sizeof where),
                          luaL_typename(L, -1));
            fill_nested(L, lua_gettop(L), t, e, depth + 1, index, next, fn);
        } else {
            store_element(L, t, e, *next, -1, fn,
                          lmk_shape_str(depth + 1, index, where, sizeof where));
            (*next)++;
        }
        lua_pop(L, 1);
    }
}

/* mk.tensor(nested_table[, dtype]) or mk.tensor(flat_table, dtype, shape) */
int lmk_tensor_new(lua_State *L) {
    const char *fn = "tensor";
    int64_t shape[MK_MAX_RANK];
    int rank = 0;
    if (lua_type(L, 1) == LUA_TNUMBER)
        lmk_raise(L, "shape error", fn,
                  "a number is a 0-d tensor (ranks 1 to %d): wrap it, {%s}", MK_MAX_RANK,
                  lua_tostring(L, 1));
    if (lua_type(L, 1) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "argument #1 must be a (nested) table of numbers, got %s",
                      luaL_typename(L, 1));
    mk_dtype dtype = lmk_check_dtype(L, 2, fn, true);
    bool dtype_given = !lua_isnoneornil(L, 2);
    const element_ops *e = need_elements(L, dtype, fn);
    if (!lua_isnoneornil(L, 3)) {
        /* A flat table and an explicit shape. */
        rank = lmk_check_shape(L, 3, fn, shape);
        lmk_tensor *t = lmk_push_tensor(L, fn, dtype, rank, shape);
        lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
        if (n != t->numel)
            lmk_raise(L, "shape error", fn, "%lld values for shape %s (%lld elements)",
                      (long long)n, LMK_SHAPE_STR(rank, shape), (long long)t->numel);
        char where[32];
        for (lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, 1, i);
            snprintf(where, sizeof where, "[%lld]", (long long)i);
            store_element(L, t, e, i - 1, -1, fn, where);
            lua_pop(L, 1);
        }
        return 1;
    }
    /* The shape is read down the first entries: {{1, 2, 3}, {4, 5, 6}} is [2, 3]. */
    lua_pushvalue(L, 1);
    while (lua_type(L, -1) == LUA_TTABLE) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        if (n == 0) lmk_raise(L, "shape error", fn, "empty table (no empty tensors)");
        if (rank == MK_MAX_RANK)
            lmk_raise(L, "shape error", fn, "nesting deeper than %d (ranks 1 to %d)",
                      MK_MAX_RANK, MK_MAX_RANK);
        shape[rank++] = n;
        lua_rawgeti(L, -1, 1);
        lua_remove(L, -2);
    }
    if (!dtype_given && lua_type(L, -1) == LUA_TBOOLEAN) { /* {true, false}: bool */
        dtype = MK_DTYPE_BOOL;
        e = need_elements(L, dtype, fn);
    }
    lua_pop(L, 1);
    lmk_tensor *t = lmk_push_tensor(L, fn, dtype, rank, shape);
    int64_t index[MK_MAX_RANK] = {0}, next = 0;
    fill_nested(L, 1, t, e, 0, index, &next, fn);
    return 1;
}

/* mk.zeros(dtype, shape) */
static int l_zeros(lua_State *L) {
    int64_t shape[MK_MAX_RANK];
    mk_dtype dtype = lmk_check_dtype(L, 1, "zeros", false);
    int rank = lmk_check_shape(L, 2, "zeros", shape);
    lmk_push_tensor(L, "zeros", dtype, rank, shape);
    return 1;
}

/* mk.from_bytes(string, dtype, shape): a copy of the bytes. */
static int l_from_bytes(lua_State *L) {
    const char *fn = "from_bytes";
    int64_t shape[MK_MAX_RANK];
    if (lua_type(L, 1) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "argument #1 must be a string, got %s", luaL_typename(L, 1));
    size_t len;
    const char *s = lua_tolstring(L, 1, &len);
    mk_dtype dtype = lmk_check_dtype(L, 2, fn, false);
    int rank = lmk_check_shape(L, 3, fn, shape);
    size_t bytes = lmk_shape_bytes(L, fn, dtype, rank, shape, NULL);
    if (len != bytes)
        LMK_ARG_ERROR(L, fn, "%zu bytes for %s %s (%zu expected)", len, mk_dtype_name(dtype),
                      LMK_SHAPE_STR(rank, shape), bytes);
    lmk_tensor *t = lmk_push_tensor(L, fn, dtype, rank, shape);
    memcpy(t->data, s, bytes);
    return 1;
}

/* ==== tensor methods ========================================================= */

static void push_totable(lua_State *L, const lmk_tensor *t, const element_ops *e, int depth,
                         int64_t *next) {
    luaL_checkstack(L, 3, "totable");
    lua_createtable(L, (int)t->shape[depth], 0);
    for (int64_t i = 0; i < t->shape[depth]; i++) {
        if (depth + 1 < t->rank) push_totable(L, t, e, depth + 1, next);
        else e->push(L, t->data, (*next)++);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

static int tensor_totable(lua_State *L) {
    lmk_tensor *t = lmk_check_tensor(L, 1, "totable");
    const element_ops *e = need_elements(L, t->dtype, "totable");
    int64_t next = 0;
    push_totable(L, t, e, 0, &next);
    return 1;
}

/* t:bytes([i [, j]]): the bytes of the flat elements i to j (1-based,
 * inclusive; default all), so a large tensor can be written in pieces. */
static int tensor_bytes(lua_State *L) {
    const char *fn = "bytes";
    lmk_tensor *t = lmk_check_tensor(L, 1, fn);
    int64_t i = lua_isnoneornil(L, 2) ? 1 : lmk_check_int(L, 2, fn, "the first element");
    int64_t j = lua_isnoneornil(L, 3) ? t->numel : lmk_check_int(L, 3, fn, "the last element");
    if (i < 1 || j > t->numel || i > j)
        LMK_ARG_ERROR(L, fn, "elements %lld to %lld are not a range of 1 to %lld", (long long)i,
                      (long long)j, (long long)t->numel);
    size_t es = mk_dtype_size(t->dtype);
    lua_pushlstring(L, (const char *)t->data + (size_t)(i - 1) * es, (size_t)(j - i + 1) * es);
    return 1;
}

/*
 * The flat 0-based element of the 1-based index arguments from `first` to
 * `last`: one index counts row-major through the whole tensor, `rank` indices
 * address one element.
 */
static int64_t element_index(lua_State *L, const lmk_tensor *t, int first, int last,
                             const char *fn) {
    int n = last - first + 1;
    if (n == 1) {
        int64_t i = lmk_check_int(L, first, fn, "index");
        if (i < 1 || i > t->numel)
            LMK_ARG_ERROR(L, fn, "index %lld is out of range (1 to %lld)", (long long)i,
                          (long long)t->numel);
        return i - 1;
    }
    if (n != t->rank)
        LMK_ARG_ERROR(L, fn, "%d indices for a rank-%d tensor (give 1 flat index or %d)", n,
                      t->rank, t->rank);
    int64_t flat = 0;
    for (int d = 0; d < t->rank; d++) {
        int64_t i = lmk_check_int(L, first + d, fn, "index");
        if (i < 1 || i > t->shape[d])
            LMK_ARG_ERROR(L, fn, "index %lld of axis %d is out of range (1 to %lld)",
                          (long long)i, d, (long long)t->shape[d]);
        flat = flat * t->shape[d] + (i - 1);
    }
    return flat;
}

/* t:get(i) (flat, 1-based) or t:get(i, j, ...) (one 1-based index per axis) */
static int tensor_get(lua_State *L) {
    lmk_tensor *t = lmk_check_tensor(L, 1, "get");
    int top = lua_gettop(L);
    if (top < 2) LMK_ARG_ERROR(L, "get", "needs an index");
    int64_t i = element_index(L, t, 2, top, "get");
    need_elements(L, t->dtype, "get")->push(L, t->data, i);
    return 1;
}

/* t:set(i, v) or t:set(i, j, ..., v) */
static int tensor_set(lua_State *L) {
    lmk_tensor *t = lmk_check_tensor(L, 1, "set");
    int top = lua_gettop(L);
    if (top < 3) LMK_ARG_ERROR(L, "set", "needs an index and a value");
    if (t->readonly)
        LMK_ARG_ERROR(L, "set", "the tensor is a read-only view of a file mapping");
    const element_ops *e = need_elements(L, t->dtype, "set");
    int64_t i = element_index(L, t, 2, top - 1, "set");
    char where[32];
    snprintf(where, sizeof where, "%lld", (long long)i + 1);
    store_element(L, t, e, i, top, "set", where);
    return 0;
}

/* t:argmax(): the 1-based flat index of the largest element, the first on ties. */
static int tensor_argmax(lua_State *L) {
    lmk_tensor *t = lmk_check_tensor(L, 1, "argmax");
    const element_ops *e = need_elements(L, t->dtype, "argmax");
    int64_t best = 0;
    for (int64_t i = 1; i < t->numel; i++)
        if (e->greater(t->data, i, best)) best = i;
    lua_pushinteger(L, best + 1);
    return 1;
}

/* t:copy(): a new tensor owning a copy of the elements (writable). */
static int tensor_copy(lua_State *L) {
    lmk_tensor *t = lmk_check_tensor(L, 1, "copy");
    lmk_tensor *c = lmk_push_tensor(L, "copy", t->dtype, t->rank, t->shape);
    memcpy(c->data, t->data, t->bytes);
    return 1;
}

/* Appends nested contents to buf, at most `limit` entries per axis. */
static void format_nested(char *buf, size_t size, size_t *n, const lmk_tensor *t,
                          const element_ops *e, int depth, int64_t offset, int64_t stride) {
    const int limit = 6;
#define PUT(...) (*n < size ? (*n += (size_t)snprintf(buf + *n, size - *n, __VA_ARGS__)) : 0)
    PUT("{");
    int64_t dim = t->shape[depth], inner = stride / dim;
    for (int64_t i = 0; i < dim; i++) {
        if (i == limit - 1 && dim > limit) {
            PUT(", ...");
            break;
        }
        if (i) PUT(", ");
        if (depth + 1 < t->rank)
            format_nested(buf, size, n, t, e, depth + 1, offset + i * inner, inner);
        else if (*n < size) *n += (size_t)e->format(buf + *n, size - *n, t->data, offset + i);
    }
    PUT("}");
#undef PUT
}

/* "tensor float32 [2, 3] {{...}, ...}"; a dtype without a Lua element view
 * shows no elements (tostring never raises: print and error messages use it). */
static int tensor_tostring(lua_State *L) {
    lmk_tensor *t = lmk_check_tensor(L, 1, "tostring");
    const element_ops *e = element_ops_of(t->dtype);
    char buf[400];
    size_t n = (size_t)snprintf(buf, sizeof buf, "tensor %s %s ", mk_dtype_name(t->dtype),
                                LMK_SHAPE_STR(t->rank, t->shape));
    if (e) format_nested(buf, sizeof buf, &n, t, e, 0, 0, t->numel);
    else n += (size_t)snprintf(buf + n, sizeof buf - n, "(%zu bytes, no element view in Lua)",
                               t->bytes);
    if (n >= sizeof buf) memcpy(buf + sizeof buf - 5, "...}", 5);
    lua_pushstring(L, buf);
    return 1;
}

static int tensor_len(lua_State *L) {
    lua_pushinteger(L, lmk_check_tensor(L, 1, "len")->shape[0]);
    return 1;
}

/* Fields first (dtype, shape, rank, numel, readonly), then methods (upvalue 1). */
static int tensor_index(lua_State *L) {
    lmk_tensor *t = lmk_check_tensor(L, 1, "index");
    const char *k = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
    if (k) {
        if (!strcmp(k, "dtype")) return lua_pushstring(L, mk_dtype_name(t->dtype)), 1;
        if (!strcmp(k, "shape")) return lmk_push_shape(L, t->rank, t->shape), 1;
        if (!strcmp(k, "rank")) return lua_pushinteger(L, t->rank), 1;
        if (!strcmp(k, "numel")) return lua_pushinteger(L, t->numel), 1;
        if (!strcmp(k, "readonly")) return lua_pushboolean(L, t->readonly), 1;
    }
    lua_pushvalue(L, 2);
    lua_gettable(L, lua_upvalueindex(1));
    return 1;
}

static int l_is_tensor(lua_State *L) {
    lua_pushboolean(L, lmk_to_tensor(L, 1) != NULL);
    return 1;
}

/* ==== conversions ============================================================ */

/* t:to(dtype): a new tensor of t's shape, converted by the CastNode's rule. */
static int tensor_to(lua_State *L) {
    lmk_tensor *t = lmk_check_tensor(L, 1, "to");
    mk_dtype d = lmk_check_dtype(L, 2, "to", false);
    lmk_tensor *c = lmk_push_tensor(L, "to", d, t->rank, t->shape);
    mk_convert(c->data, d, t->data, t->dtype, t->numel);
    return 1;
}

/* mk.quantize(t, group) -> q, scale: float32 t [.., n] in int8 groups of `group`
 * along its last axis (llama2.c's rule, mk_quantize_q8): q has t's shape,
 * scale t's with the last dim n / group. */
static int l_quantize(lua_State *L) {
    const char *fn = "quantize";
    lmk_tensor *t = lmk_check_tensor(L, 1, fn);
    int64_t group = lmk_check_int(L, 2, fn, "the group size");
    if (t->dtype != MK_DTYPE_FLOAT32)
        lmk_raise(L, "dtype error", fn, "takes a float32 tensor, not %s", mk_dtype_name(t->dtype));
    int64_t n = t->shape[t->rank - 1];
    if (group < 1)
        LMK_ARG_ERROR(L, fn, "the group size must be positive, got %lld", (long long)group);
    if (n % group)
        LMK_ARG_ERROR(L, fn, "the group size %lld does not divide the last dim %lld of %s",
                      (long long)group, (long long)n, LMK_SHAPE_STR(t->rank, t->shape));
    int64_t sshape[MK_MAX_RANK];
    memcpy(sshape, t->shape, sizeof(int64_t) * (size_t)t->rank);
    sshape[t->rank - 1] = n / group;
    lmk_tensor *q = lmk_push_tensor(L, fn, MK_DTYPE_INT8, t->rank, t->shape);
    lmk_tensor *sc = lmk_push_tensor(L, fn, MK_DTYPE_FLOAT32, t->rank, sshape);
    mk_quantize_q8(t->data, t->numel, group, q->data, sc->data);
    return 2;
}

/* q:dequantize(scale): float32 q * scale in blocks, as the DequantizeNode:
 * q int8 [.., n], scale float32 of q's rank, each dim dividing q's; element i
 * takes scale[i_d / (q_d / scale_d)] on every axis d. */
static int tensor_dequantize(lua_State *L) {
    const char *fn = "dequantize";
    lmk_tensor *q = lmk_check_tensor(L, 1, fn);
    lmk_tensor *sc = lmk_check_tensor(L, 2, fn);
    if (q->dtype != MK_DTYPE_INT8 || sc->dtype != MK_DTYPE_FLOAT32)
        lmk_raise(L, "dtype error", fn, "takes int8 values and float32 scales, not %s and %s",
                  mk_dtype_name(q->dtype), mk_dtype_name(sc->dtype));
    if (q->rank != sc->rank)
        lmk_raise(L, "shape error", fn, "scales %s and values %s differ in rank",
                  LMK_SHAPE_STR(sc->rank, sc->shape), LMK_SHAPE_STR(q->rank, q->shape));
    for (int d = 0; d < q->rank; d++)
        if (q->shape[d] % sc->shape[d])
            lmk_raise(L, "shape error", fn, "scales %s do not divide %s into blocks (axis %d)",
                      LMK_SHAPE_STR(sc->rank, sc->shape), LMK_SHAPE_STR(q->rank, q->shape), d);
    lmk_tensor *o = lmk_push_tensor(L, fn, MK_DTYPE_FLOAT32, q->rank, q->shape);
    int last = q->rank - 1;
    int64_t n = q->shape[last], g = n / sc->shape[last], rows = q->numel / n;
    const int8_t *qv = q->data;
    const float *sv = sc->data;
    float *ov = o->data;
    for (int64_t row = 0; row < rows; row++) {
        /* the scale row of this row: each leading index divided by its block size */
        int64_t rest = row, srow = 0, stride = 1;
        for (int d = last - 1; d >= 0; d--) {
            srow += rest % q->shape[d] / (q->shape[d] / sc->shape[d]) * stride;
            rest /= q->shape[d];
            stride *= sc->shape[d];
        }
        const int8_t *qr = qv + row * n;
        const float *sr = sv + srow * sc->shape[last];
        float *orow = ov + row * n;
        for (int64_t j = 0; j < n; j++) orow[j] = (float)qr[j] * sr[j / g];
    }
    return 1;
}

/*
 * t:reshape(shape): t's elements (row-major) in another shape of as many. A
 * copy (writable) of a tensor that owns its bytes; a read-only tensor (a
 * window into a file) gives another read-only window onto the same bytes,
 * which keeps the file mapped: no copy of a mapped weight, and since neither
 * can be written, it reads as a copy too.
 */
static int tensor_reshape(lua_State *L) {
    const char *fn = "reshape";
    int64_t shape[MK_MAX_RANK], numel;
    lmk_tensor *t = lmk_check_tensor(L, 1, fn);
    int rank = lmk_check_shape(L, 2, fn, shape);
    lmk_shape_bytes(L, fn, t->dtype, rank, shape, &numel);
    if (numel != t->numel)
        lmk_raise(L, "shape error", fn, "%s has %lld elements, %s has %lld",
                  LMK_SHAPE_STR(rank, shape), (long long)numel, LMK_SHAPE_STR(t->rank, t->shape),
                  (long long)t->numel);
    if (!t->readonly) {
        lmk_tensor *c = lmk_push_tensor(L, fn, t->dtype, rank, shape);
        memcpy(c->data, t->data, t->bytes);
        return 1;
    }
    lmk_tensor *v = (lmk_tensor *)lua_newuserdatauv(L, sizeof *v, 1);
    *v = *t;
    v->rank = rank;
    memcpy(v->shape, shape, sizeof(int64_t) * (size_t)rank);
    luaL_setmetatable(L, LMK_TENSOR_MT);
    lua_getiuservalue(L, 1, 1); /* t's mapping (or safetensors file) */
    lua_setiuservalue(L, -2, 1);
    return 1;
}

/* ==== registration =========================================================== */

void lmk_open_tensor(lua_State *L) {
    static const luaL_Reg tensor_meta[] = {
        {"__tostring", tensor_tostring}, {"__len", tensor_len}, {NULL, NULL}};
    static const luaL_Reg tensor_methods[] = {
        {"totable", tensor_totable}, {"bytes", tensor_bytes}, {"get", tensor_get},
        {"set", tensor_set}, {"argmax", tensor_argmax}, {"copy", tensor_copy},
        {"to", tensor_to}, {"dequantize", tensor_dequantize}, {"reshape", tensor_reshape},
        {NULL, NULL}};
    lmk_define_type(L, LMK_TENSOR_MT, tensor_meta, tensor_methods, tensor_index);
    lua_getfield(L, -1, "methods");
    lua_setfield(L, -3, "tensor_methods");
    lua_pop(L, 1);

    static const luaL_Reg functions[] = {
        {"tensor", lmk_tensor_new}, {"zeros", l_zeros}, {"from_bytes", l_from_bytes},
        {"is_tensor", l_is_tensor}, {"quantize", l_quantize}, {NULL, NULL}};
    luaL_setfuncs(L, functions, 0);
    lmk_open_file(L); /* tensors from files (file.c) */
}
