/*
 * moonkaas_core.c — the Lua 5.4 binding `moonkaas.core`: host tensors, graph
 * nodes and compiled models as userdata, on top of core/moonkaas.h only.
 *
 *   tensor  a dense row-major host array (float32 or int64, rank 1 to 4) that
 *           owns its bytes, or a read-only window into a file mapping
 *   mapping one mmap of a file, shared by every tensor made from that file and
 *           kept alive by them (user value 1 of each tensor)
 *   node    one statement of a script-to-be: op, dtype, shape, integer
 *           attributes, operands (user values 1..4), a name (user value 5) and,
 *           for ConstantTensor, the tensor (user value 6). Shapes and dtypes are
 *           checked when a node is built, by the core's op table (mk_op_infer)
 *   model   a compiled mk_model; on the CPU its constants are borrowed in
 *           place, so the model keeps their tensors alive (user value 1)
 *
 * Lowering a node DAG to script text lives in lua/moonkaas/init.lua; it reads
 * nodes through core.node_info and compiles through core.compile_script.
 *
 * Error discipline (STYLE.md): every argument is checked before anything is
 * acquired; userdata are created "closed" before the C resource they hold; a
 * core error is copied to the C stack and freed before lua_error, so nothing
 * C-owned is live at a longjmp. Messages start with a stable kind prefix
 * ("shape error: ", "argument error: ", ...), the same ones the core uses.
 */
#include "moonkaas.h"

#include <lauxlib.h>
#include <lua.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LMK_EXPORT __attribute__((visibility("default")))

#define TENSOR_MT "moonkaas.tensor"
#define MAPPING_MT "moonkaas.mapping"
#define NODE_MT "moonkaas.node"
#define MODEL_MT "moonkaas.model"
#define CONTEXT_MT "moonkaas.context"
#define CONTEXT_KEY "moonkaas.context.instance"
#define MAPPINGS_KEY "moonkaas.mappings" /* weak table: file identity -> mapping */

/* ==== errors ================================================================ */

/* Raises "<kind>: <fn>: <message>"; the kind is one of the core's prefixes. */
static int raise(lua_State *L, const char *kind, const char *fn, const char *fmt, ...) {
    char body[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    /* lua_error, not luaL_error: the message starts with the kind, no position. */
    lua_pushfstring(L, "%s: %s: %s", kind, fn, body);
    return lua_error(L);
}
#define ARG_ERROR(L, fn, ...) raise((L), "argument error", (fn), __VA_ARGS__)

/* Copies a core error to the C stack, frees it, then raises it: the error must
 * not be live at the longjmp. */
static int raise_core(lua_State *L, mk_error *err) {
    char msg[1400];
    snprintf(msg, sizeof msg, "%s", err ? mk_error_message(err) : "internal error: no message");
    mk_error_free(err);
    lua_pushstring(L, msg);
    return lua_error(L);
}

/* ==== small helpers ========================================================= */

static const char *shape_str(int rank, const int64_t *shape, char *buf, size_t size) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (int i = 0; i < rank && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}
#define SHAPE_STR(rank, shape) shape_str((rank), (shape), (char[96]){0}, 96)

static bool same_shape(int ra, const int64_t *a, int rb, const int64_t *b) {
    if (ra != rb) return false;
    for (int i = 0; i < ra; i++)
        if (a[i] != b[i]) return false;
    return true;
}

/* Reads a dtype name at idx (absent: float32 when allow_default). */
static mk_dtype check_dtype(lua_State *L, int idx, const char *fn, bool allow_default) {
    if (allow_default && lua_isnoneornil(L, idx)) return MK_DTYPE_FLOAT32;
    if (lua_type(L, idx) != LUA_TSTRING)
        ARG_ERROR(L, fn, "dtype must be a string (\"float32\" or \"int64\"), got %s",
                  luaL_typename(L, idx));
    const char *s = lua_tostring(L, idx);
    if (!strcmp(s, "float32")) return MK_DTYPE_FLOAT32;
    if (!strcmp(s, "int64")) return MK_DTYPE_INT64;
    raise(L, "dtype error", fn, "unknown dtype '%s' (float32 or int64)", s);
    return MK_DTYPE_FLOAT32;
}

/* Reads an integer argument; floats with an integral value are accepted. */
static int64_t check_int(lua_State *L, int idx, const char *fn, const char *what) {
    int ok = 0;
    lua_Integer v = lua_tointegerx(L, idx, &ok);
    if (!ok) {
        if (lua_type(L, idx) == LUA_TNUMBER)
            ARG_ERROR(L, fn, "%s must be an integer, got %s", what, lua_tostring(L, idx));
        ARG_ERROR(L, fn, "%s must be an integer, got %s", what, luaL_typename(L, idx));
    }
    return (int64_t)v;
}

/*
 * Reads a list of up to `max` integers from the table at idx into out; returns
 * the count. Lists longer than max are an error naming `what`.
 */
static int check_int_list(lua_State *L, int idx, const char *fn, const char *what,
                          int64_t *out, int max) {
    if (lua_type(L, idx) != LUA_TTABLE)
        ARG_ERROR(L, fn, "%s must be a table of integers, got %s", what, luaL_typename(L, idx));
    lua_Integer n = luaL_len(L, idx);
    if (n > max)
        raise(L, "shape error", fn, "%s has %lld entries (at most %d)", what, (long long)n, max);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_geti(L, idx, i);
        int ok = 0;
        lua_Integer v = lua_tointegerx(L, -1, &ok);
        if (!ok)
            ARG_ERROR(L, fn, "%s[%lld] must be an integer, got %s", what, (long long)i,
                      lua_type(L, -1) == LUA_TNUMBER ? lua_tostring(L, -1)
                                                     : luaL_typename(L, -1));
        out[i - 1] = (int64_t)v;
        lua_pop(L, 1);
    }
    return (int)n;
}

/* A tensor shape: rank 1 to 4, every dimension positive (no 0-d, no empty). */
static int check_shape(lua_State *L, int idx, const char *fn, int64_t *shape) {
    int rank = check_int_list(L, idx, fn, "shape", shape, MK_MAX_RANK);
    if (rank < 1)
        raise(L, "shape error", fn, "shape {} is 0-d (ranks 1 to %d)", MK_MAX_RANK);
    for (int i = 0; i < rank; i++)
        if (shape[i] <= 0)
            raise(L, "shape error", fn, "dimension %d of %s is %lld (no empty tensors)", i,
                  SHAPE_STR(rank, shape), (long long)shape[i]);
    return rank;
}

/* Element count and bytes of a shape, refusing sizes that overflow. */
static size_t shape_bytes(lua_State *L, const char *fn, mk_dtype dtype, int rank,
                          const int64_t *shape, int64_t *numel_out) {
    uint64_t numel = 1;
    for (int i = 0; i < rank; i++)
        if (__builtin_mul_overflow(numel, (uint64_t)shape[i], &numel) || numel > (1ull << 48))
            raise(L, "shape error", fn, "%s has too many elements", SHAPE_STR(rank, shape));
    if (numel_out) *numel_out = (int64_t)numel;
    return (size_t)numel * mk_dtype_size(dtype);
}

static bool is_identifier(const char *s) {
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
    for (s++; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '_'))
            return false;
    return true;
}

/* ==== tensors =============================================================== */

typedef struct {
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    int64_t numel;
    size_t bytes;
    void *data;    /* just after this header, or inside a mapping (user value 1) */
    bool readonly; /* a window into a file mapping */
} lmk_tensor;

/* The header rounded up so inline data keep the allocator's 16-byte alignment. */
#define TENSOR_HEADER ((sizeof(lmk_tensor) + 15) & ~(size_t)15)

static lmk_tensor *to_tensor(lua_State *L, int idx) {
    return (lmk_tensor *)luaL_testudata(L, idx, TENSOR_MT);
}

static lmk_tensor *check_tensor(lua_State *L, int idx, const char *fn) {
    lmk_tensor *t = to_tensor(L, idx);
    if (!t) ARG_ERROR(L, fn, "argument #%d must be a tensor, got %s", idx, luaL_typename(L, idx));
    return t;
}

/* Pushes a new zero-filled tensor that owns its bytes. */
static lmk_tensor *push_tensor(lua_State *L, const char *fn, mk_dtype dtype, int rank,
                               const int64_t *shape) {
    int64_t numel;
    size_t bytes = shape_bytes(L, fn, dtype, rank, shape, &numel);
    lmk_tensor *t = (lmk_tensor *)lua_newuserdatauv(L, TENSOR_HEADER + bytes, 1);
    *t = (lmk_tensor){.dtype = dtype, .rank = rank, .numel = numel, .bytes = bytes};
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    t->data = (char *)t + TENSOR_HEADER;
    memset(t->data, 0, bytes);
    luaL_setmetatable(L, TENSOR_MT);
    return t;
}

static void push_element(lua_State *L, const lmk_tensor *t, int64_t i) {
    if (t->dtype == MK_DTYPE_INT64) lua_pushinteger(L, ((const int64_t *)t->data)[i]);
    else lua_pushnumber(L, ((const float *)t->data)[i]);
}

/* Stores the Lua value at idx into element i; `where` names it in errors. */
static void store_element(lua_State *L, lmk_tensor *t, int64_t i, int idx, const char *fn,
                          const char *where) {
    if (lua_type(L, idx) != LUA_TNUMBER)
        ARG_ERROR(L, fn, "element %s is %s, expected a number", where, luaL_typename(L, idx));
    if (t->dtype == MK_DTYPE_INT64) {
        int ok = 0;
        lua_Integer v = lua_tointegerx(L, idx, &ok);
        if (!ok)
            ARG_ERROR(L, fn, "element %s = %s is not an integer (int64 tensor)", where,
                      lua_tostring(L, idx));
        ((int64_t *)t->data)[i] = (int64_t)v;
    } else {
        ((float *)t->data)[i] = (float)lua_tonumber(L, idx);
    }
}

static const char *index_str(int depth, const int64_t *index, char *buf, size_t size) {
    return shape_str(depth, index, buf, size);
}

/* Fills t from the nested table at idx (depth 0 = the outermost axis). */
static void fill_nested(lua_State *L, int idx, lmk_tensor *t, int depth, int64_t *index,
                        int64_t *next, const char *fn) {
    char where[96];
    lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    if (n != t->shape[depth])
        raise(L, "shape error", fn, "ragged table: %s %s has %lld entries, expected %lld",
              depth ? "row" : "table", depth ? index_str(depth, index, where, sizeof where) : "",
              (long long)n, (long long)t->shape[depth]);
    luaL_checkstack(L, 2, "tensor nesting");
    for (lua_Integer i = 1; i <= n; i++) {
        index[depth] = i;
        lua_rawgeti(L, idx, i);
        if (depth + 1 < t->rank) {
            if (lua_type(L, -1) != LUA_TTABLE)
                raise(L, "shape error", fn, "ragged table: entry %s is %s, expected a table",
                      index_str(depth + 1, index, where, sizeof where), luaL_typename(L, -1));
            fill_nested(L, lua_gettop(L), t, depth + 1, index, next, fn);
        } else {
            store_element(L, t, *next, -1, fn, index_str(depth + 1, index, where, sizeof where));
            (*next)++;
        }
        lua_pop(L, 1);
    }
}

/* mk.tensor(nested_table[, dtype]) or mk.tensor(flat_table, dtype, shape) */
static int l_tensor(lua_State *L) {
    const char *fn = "tensor";
    int64_t shape[MK_MAX_RANK];
    int rank = 0;
    if (lua_type(L, 1) == LUA_TNUMBER)
        raise(L, "shape error", fn, "a number is a 0-d tensor (ranks 1 to %d): wrap it, {%s}",
              MK_MAX_RANK, lua_tostring(L, 1));
    if (lua_type(L, 1) != LUA_TTABLE)
        ARG_ERROR(L, fn, "argument #1 must be a (nested) table of numbers, got %s",
                  luaL_typename(L, 1));
    mk_dtype dtype = check_dtype(L, 2, fn, true);
    if (!lua_isnoneornil(L, 3)) {
        /* A flat table and an explicit shape. */
        rank = check_shape(L, 3, fn, shape);
        lmk_tensor *t = push_tensor(L, fn, dtype, rank, shape);
        lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
        if (n != t->numel)
            raise(L, "shape error", fn, "%lld values for shape %s (%lld elements)",
                  (long long)n, SHAPE_STR(rank, shape), (long long)t->numel);
        char where[32];
        for (lua_Integer i = 1; i <= n; i++) {
            lua_rawgeti(L, 1, i);
            snprintf(where, sizeof where, "[%lld]", (long long)i);
            store_element(L, t, i - 1, -1, fn, where);
            lua_pop(L, 1);
        }
        return 1;
    }
    /* The shape is read down the first entries: {{1, 2, 3}, {4, 5, 6}} is [2, 3]. */
    lua_pushvalue(L, 1);
    while (lua_type(L, -1) == LUA_TTABLE) {
        lua_Integer n = (lua_Integer)lua_rawlen(L, -1);
        if (n == 0) raise(L, "shape error", fn, "empty table (no empty tensors)");
        if (rank == MK_MAX_RANK)
            raise(L, "shape error", fn, "nesting deeper than %d (ranks 1 to %d)", MK_MAX_RANK,
                  MK_MAX_RANK);
        shape[rank++] = n;
        lua_rawgeti(L, -1, 1);
        lua_remove(L, -2);
    }
    lua_pop(L, 1);
    lmk_tensor *t = push_tensor(L, fn, dtype, rank, shape);
    int64_t index[MK_MAX_RANK] = {0}, next = 0;
    fill_nested(L, 1, t, 0, index, &next, fn);
    return 1;
}

/* mk.zeros(dtype, shape) */
static int l_zeros(lua_State *L) {
    int64_t shape[MK_MAX_RANK];
    mk_dtype dtype = check_dtype(L, 1, "zeros", false);
    int rank = check_shape(L, 2, "zeros", shape);
    push_tensor(L, "zeros", dtype, rank, shape);
    return 1;
}

/* mk.from_bytes(string, dtype, shape): a copy of the bytes. */
static int l_from_bytes(lua_State *L) {
    const char *fn = "from_bytes";
    int64_t shape[MK_MAX_RANK];
    if (lua_type(L, 1) != LUA_TSTRING)
        ARG_ERROR(L, fn, "argument #1 must be a string, got %s", luaL_typename(L, 1));
    size_t len;
    const char *s = lua_tolstring(L, 1, &len);
    mk_dtype dtype = check_dtype(L, 2, fn, false);
    int rank = check_shape(L, 3, fn, shape);
    size_t bytes = shape_bytes(L, fn, dtype, rank, shape, NULL);
    if (len != bytes)
        ARG_ERROR(L, fn, "%zu bytes for %s %s (%zu expected)", len, mk_dtype_name(dtype),
                  SHAPE_STR(rank, shape), bytes);
    lmk_tensor *t = push_tensor(L, fn, dtype, rank, shape);
    memcpy(t->data, s, bytes);
    return 1;
}

/* ---- file mappings ---------------------------------------------------------- */

typedef struct {
    void *addr; /* NULL while closed */
    size_t size;
} lmk_mapping;

static int mapping_gc(lua_State *L) {
    lmk_mapping *m = (lmk_mapping *)luaL_checkudata(L, 1, MAPPING_MT);
    if (m->addr) munmap(m->addr, m->size);
    m->addr = NULL;
    return 0;
}

/*
 * Pushes the mapping of the whole file `path` (size from st), sharing one per
 * file identity through a weak table so that every tensor of a checkpoint holds
 * the same mapping. Errors name the file.
 */
static lmk_mapping *push_mapping(lua_State *L, const char *path, const struct stat *st) {
    char key[128];
    snprintf(key, sizeof key, "%llu:%llu:%lld:%lld.%09ld", (unsigned long long)st->st_dev,
             (unsigned long long)st->st_ino, (long long)st->st_size,
             (long long)st->st_mtim.tv_sec, (long)st->st_mtim.tv_nsec);
    lua_getfield(L, LUA_REGISTRYINDEX, MAPPINGS_KEY);
    int cache = lua_gettop(L);
    if (lua_getfield(L, cache, key) == LUA_TUSERDATA) {
        lua_remove(L, cache);
        return (lmk_mapping *)lua_touserdata(L, -1);
    }
    lua_pop(L, 1);
    /* Closed first: if anything below fails, nothing is left to release. */
    lmk_mapping *m = (lmk_mapping *)lua_newuserdatauv(L, sizeof *m, 0);
    m->addr = NULL;
    m->size = 0;
    luaL_setmetatable(L, MAPPING_MT);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return (void)raise(L, "file error", path, "%s", strerror(errno)), NULL;
    void *addr = mmap(NULL, (size_t)st->st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (addr == MAP_FAILED)
        return (void)raise(L, "file error", path, "mmap: %s", strerror(map_errno)), NULL;
    m->addr = addr;
    m->size = (size_t)st->st_size;
    lua_pushvalue(L, -1);
    lua_setfield(L, cache, key);
    lua_remove(L, cache);
    return m;
}

/* mk.from_file(path, {offset =, dtype =, shape =}): a read-only window, no copy. */
static int l_from_file(lua_State *L) {
    const char *fn = "from_file";
    int64_t shape[MK_MAX_RANK];
    if (lua_type(L, 1) != LUA_TSTRING)
        ARG_ERROR(L, fn, "argument #1 must be a path, got %s", luaL_typename(L, 1));
    const char *path = lua_tostring(L, 1);
    if (lua_type(L, 2) != LUA_TTABLE)
        ARG_ERROR(L, fn, "argument #2 must be a table {offset =, dtype =, shape =}, got %s",
                  luaL_typename(L, 2));
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        if (strcmp(k, "offset") && strcmp(k, "dtype") && strcmp(k, "shape"))
            ARG_ERROR(L, fn, "unknown option %s (offset, dtype, shape)", k);
        lua_pop(L, 1);
    }
    lua_getfield(L, 2, "offset");
    int64_t offset = lua_isnil(L, -1) ? 0 : check_int(L, -1, fn, "offset");
    lua_getfield(L, 2, "dtype");
    mk_dtype dtype = check_dtype(L, -1, fn, true);
    lua_getfield(L, 2, "shape");
    if (lua_isnil(L, -1)) ARG_ERROR(L, fn, "the options need a shape");
    int rank = check_shape(L, lua_gettop(L), fn, shape);
    lua_pop(L, 3);
    size_t bytes = shape_bytes(L, fn, dtype, rank, shape, NULL);
    if (offset < 0) raise(L, "file error", path, "offset %lld is negative", (long long)offset);
    /* Elements are read in place (and borrowed by CPU models): keep them aligned. */
    if (offset % (int64_t)mk_dtype_size(dtype))
        raise(L, "file error", path, "offset %lld is not a multiple of %zu (%s)",
              (long long)offset, mk_dtype_size(dtype), mk_dtype_name(dtype));
    struct stat st;
    if (stat(path, &st) != 0) raise(L, "file error", path, "%s", strerror(errno));
    if (!S_ISREG(st.st_mode)) raise(L, "file error", path, "not a regular file");
    if ((uint64_t)offset > (uint64_t)st.st_size ||
        bytes > (uint64_t)st.st_size - (uint64_t)offset)
        raise(L, "file error", path,
              "offset %lld + %zu bytes (%s %s) runs past the end of the file (%lld bytes)",
              (long long)offset, bytes, mk_dtype_name(dtype), SHAPE_STR(rank, shape),
              (long long)st.st_size);
    lmk_mapping *m = push_mapping(L, path, &st);
    int64_t numel;
    shape_bytes(L, fn, dtype, rank, shape, &numel);
    lmk_tensor *t = (lmk_tensor *)lua_newuserdatauv(L, sizeof *t, 1);
    *t = (lmk_tensor){.dtype = dtype, .rank = rank, .numel = numel, .bytes = bytes,
                      .data = (char *)m->addr + offset, .readonly = true};
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    luaL_setmetatable(L, TENSOR_MT);
    lua_pushvalue(L, -2);
    lua_setiuservalue(L, -2, 1); /* the tensor keeps its mapping alive */
    return 1;
}

/* ---- tensor methods ---------------------------------------------------------- */

static void push_shape(lua_State *L, int rank, const int64_t *shape) {
    lua_createtable(L, rank, 0);
    for (int i = 0; i < rank; i++) {
        lua_pushinteger(L, shape[i]);
        lua_rawseti(L, -2, i + 1);
    }
}

static void push_totable(lua_State *L, const lmk_tensor *t, int depth, int64_t *next) {
    luaL_checkstack(L, 3, "totable");
    lua_createtable(L, (int)t->shape[depth], 0);
    for (int64_t i = 0; i < t->shape[depth]; i++) {
        if (depth + 1 < t->rank) push_totable(L, t, depth + 1, next);
        else push_element(L, t, (*next)++);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
}

static int tensor_totable(lua_State *L) {
    lmk_tensor *t = check_tensor(L, 1, "totable");
    int64_t next = 0;
    push_totable(L, t, 0, &next);
    return 1;
}

static int tensor_bytes(lua_State *L) {
    lmk_tensor *t = check_tensor(L, 1, "bytes");
    lua_pushlstring(L, (const char *)t->data, t->bytes);
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
        int64_t i = check_int(L, first, fn, "index");
        if (i < 1 || i > t->numel)
            ARG_ERROR(L, fn, "index %lld is out of range (1 to %lld)", (long long)i,
                      (long long)t->numel);
        return i - 1;
    }
    if (n != t->rank)
        ARG_ERROR(L, fn, "%d indices for a rank-%d tensor (give 1 flat index or %d)", n, t->rank,
                  t->rank);
    int64_t flat = 0;
    for (int d = 0; d < t->rank; d++) {
        int64_t i = check_int(L, first + d, fn, "index");
        if (i < 1 || i > t->shape[d])
            ARG_ERROR(L, fn, "index %lld of axis %d is out of range (1 to %lld)", (long long)i, d,
                      (long long)t->shape[d]);
        flat = flat * t->shape[d] + (i - 1);
    }
    return flat;
}

/* t:get(i) (flat, 1-based) or t:get(i, j, ...) (one 1-based index per axis) */
static int tensor_get(lua_State *L) {
    lmk_tensor *t = check_tensor(L, 1, "get");
    int top = lua_gettop(L);
    if (top < 2) ARG_ERROR(L, "get", "needs an index");
    push_element(L, t, element_index(L, t, 2, top, "get"));
    return 1;
}

/* t:set(i, v) or t:set(i, j, ..., v) */
static int tensor_set(lua_State *L) {
    lmk_tensor *t = check_tensor(L, 1, "set");
    int top = lua_gettop(L);
    if (top < 3) ARG_ERROR(L, "set", "needs an index and a value");
    if (t->readonly)
        ARG_ERROR(L, "set", "the tensor is a read-only view of a file mapping");
    int64_t i = element_index(L, t, 2, top - 1, "set");
    char where[32];
    snprintf(where, sizeof where, "%lld", (long long)i + 1);
    store_element(L, t, i, top, "set", where);
    return 0;
}

/* t:argmax(): the 1-based flat index of the largest element, the first on ties. */
static int tensor_argmax(lua_State *L) {
    lmk_tensor *t = check_tensor(L, 1, "argmax");
    int64_t best = 0;
    if (t->dtype == MK_DTYPE_INT64) {
        const int64_t *x = (const int64_t *)t->data;
        for (int64_t i = 1; i < t->numel; i++)
            if (x[i] > x[best]) best = i;
    } else {
        const float *x = (const float *)t->data;
        for (int64_t i = 1; i < t->numel; i++)
            if (x[i] > x[best] || (isnan(x[i]) && !isnan(x[best]))) best = i;
    }
    lua_pushinteger(L, best + 1);
    return 1;
}

/* t:copy(): a new tensor owning a copy of the elements (writable). */
static int tensor_copy(lua_State *L) {
    lmk_tensor *t = check_tensor(L, 1, "copy");
    lmk_tensor *c = push_tensor(L, "copy", t->dtype, t->rank, t->shape);
    memcpy(c->data, t->data, t->bytes);
    return 1;
}

/* Appends nested contents to buf, at most `limit` entries per axis. */
static void format_nested(char *buf, size_t size, size_t *n, const lmk_tensor *t, int depth,
                          int64_t offset, int64_t stride) {
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
        if (depth + 1 < t->rank) {
            format_nested(buf, size, n, t, depth + 1, offset + i * inner, inner);
        } else if (t->dtype == MK_DTYPE_INT64) {
            PUT("%lld", (long long)((const int64_t *)t->data)[offset + i]);
        } else {
            PUT("%.6g", (double)((const float *)t->data)[offset + i]);
        }
    }
    PUT("}");
#undef PUT
}

static int tensor_tostring(lua_State *L) {
    lmk_tensor *t = check_tensor(L, 1, "tostring");
    char buf[400];
    size_t n = (size_t)snprintf(buf, sizeof buf, "tensor %s %s ", mk_dtype_name(t->dtype),
                                SHAPE_STR(t->rank, t->shape));
    format_nested(buf, sizeof buf, &n, t, 0, 0, t->numel);
    if (n >= sizeof buf) memcpy(buf + sizeof buf - 5, "...}", 5);
    lua_pushstring(L, buf);
    return 1;
}

static int tensor_len(lua_State *L) {
    lua_pushinteger(L, check_tensor(L, 1, "len")->shape[0]);
    return 1;
}

/* Fields first (dtype, shape, rank, numel, readonly), then methods (upvalue 1). */
static int tensor_index(lua_State *L) {
    lmk_tensor *t = check_tensor(L, 1, "index");
    const char *k = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
    if (k) {
        if (!strcmp(k, "dtype")) return lua_pushstring(L, mk_dtype_name(t->dtype)), 1;
        if (!strcmp(k, "shape")) return push_shape(L, t->rank, t->shape), 1;
        if (!strcmp(k, "rank")) return lua_pushinteger(L, t->rank), 1;
        if (!strcmp(k, "numel")) return lua_pushinteger(L, t->numel), 1;
        if (!strcmp(k, "readonly")) return lua_pushboolean(L, t->readonly), 1;
    }
    lua_pushvalue(L, 2);
    lua_gettable(L, lua_upvalueindex(1));
    return 1;
}

/* ==== nodes ================================================================= */

typedef enum {
    OP_INPUT, OP_CONSTANT, OP_BUFFER, OP_SUM, OP_HADAMARD, OP_RELU, OP_SILU, OP_MATMUL,
    OP_SLICE, OP_RESHAPE, OP_PERMUTE, OP_REPLACE, OP_RMS_NORM, OP_COMPLEX_MUL,
    OP_SLICED_SOFTMAX, OP_EMBEDDING, OP_ARGMAX, OP_COUNT
} lmk_op;

/* Script names, as the op table spells them. */
static const char *const op_names[OP_COUNT] = {
    "InputTensor", "ConstantTensor", "BufferTensor", "SumNode", "HadamardProductNode",
    "ReLUNode", "SiLUNode", "MatMulNode", "SliceNode", "ReshapeNode", "PermuteNode",
    "ReplaceSliceNode", "RmsNormNode", "ComplexHadamardProductNode", "SlicedSoftmaxNode",
    "EmbeddingNode", "ArgMaxNode",
};

enum { UV_NAME = 5, UV_TENSOR = 6, NODE_UVS = 6 }; /* user values 1..4: operands */

typedef struct {
    lmk_op op;
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    int n_in;
    int n_attr;
    int64_t attr[MK_MAX_RANK]; /* Slice: begin, end; Reshape: shape; Permute: perm */
} lmk_node;

static lmk_node *to_node(lua_State *L, int idx) {
    return (lmk_node *)luaL_testudata(L, idx, NODE_MT);
}

static lmk_node *check_node(lua_State *L, int idx, const char *fn) {
    lmk_node *n = to_node(L, idx);
    if (!n) ARG_ERROR(L, fn, "argument #%d must be a node, got %s", idx, luaL_typename(L, idx));
    return n;
}

static lmk_node *push_node(lua_State *L, lmk_op op, mk_dtype dtype, int rank,
                           const int64_t *shape) {
    lmk_node *n = (lmk_node *)lua_newuserdatauv(L, sizeof *n, NODE_UVS);
    *n = (lmk_node){.op = op, .dtype = dtype, .rank = rank};
    memcpy(n->shape, shape, sizeof(int64_t) * (size_t)rank);
    luaL_setmetatable(L, NODE_MT);
    return n;
}

/* A ConstantTensor node over the tensor at idx; `name` may be NULL (named when lowered). */
static void push_constant_node(lua_State *L, int tensor_idx, const char *name) {
    tensor_idx = lua_absindex(L, tensor_idx);
    lmk_tensor *t = to_tensor(L, tensor_idx);
    push_node(L, OP_CONSTANT, t->dtype, t->rank, t->shape);
    lua_pushvalue(L, tensor_idx);
    lua_setiuservalue(L, -2, UV_TENSOR);
    if (name) {
        lua_pushstring(L, name);
        lua_setiuservalue(L, -2, UV_NAME);
    }
}

/* A tensor of shape [1, ..., 1] (rank `rank`) holding the number at idx. */
static void push_scalar_tensor(lua_State *L, int idx, mk_dtype dtype, int rank, const char *fn) {
    idx = lua_absindex(L, idx);
    int64_t ones[MK_MAX_RANK] = {1, 1, 1, 1};
    if (dtype == MK_DTYPE_INT64 && !lua_isinteger(L, idx)) {
        int ok = 0;
        lua_tointegerx(L, idx, &ok);
        if (!ok)
            raise(L, "dtype error", fn, "%s is not an integer, and the other operand is int64",
                  lua_tostring(L, idx));
    }
    lmk_tensor *t = push_tensor(L, fn, dtype, rank, ones);
    store_element(L, t, 0, idx, fn, "[1]");
}

/*
 * Replaces the operand at idx by a node: a node stays; a tensor becomes an
 * unnamed constant; a number becomes a constant [1, ..., 1] of `like`'s dtype and
 * rank (so it broadcasts). Anything else is an argument error naming `what`.
 */
static lmk_node *coerce_operand(lua_State *L, int idx, const lmk_node *like, const char *fn,
                                const char *what) {
    idx = lua_absindex(L, idx);
    lmk_node *n = to_node(L, idx);
    if (n) return n;
    if (to_tensor(L, idx)) {
        push_constant_node(L, idx, NULL);
    } else if (lua_type(L, idx) == LUA_TNUMBER && like) {
        push_scalar_tensor(L, idx, like->dtype, like->rank, fn);
        push_constant_node(L, -1, NULL);
        lua_remove(L, -2);
    } else {
        ARG_ERROR(L, fn, "%s must be a node%s, got %s", what, like ? ", tensor or number" :
                  " or tensor", luaL_typename(L, idx));
    }
    lua_replace(L, idx);
    return to_node(L, idx);
}

/*
 * Checks op on the operands at stack indices in[] through the core's op table
 * and pushes the new node; a rejected combination raises the core's message
 * ("shape error: MatMulNode: cannot multiply [2, 3] by [4, 5] ...").
 */
static lmk_node *build_op(lua_State *L, lmk_op op, const int *in, int n_in, const int64_t *attr,
                          int n_attr) {
    mk_tensor_info info[4], out;
    for (int i = 0; i < n_in; i++) {
        const lmk_node *x = to_node(L, in[i]);
        info[i] = (mk_tensor_info){.name = NULL, .dtype = x->dtype, .rank = x->rank};
        memcpy(info[i].shape, x->shape, sizeof info[i].shape);
    }
    mk_error *err = NULL;
    if (mk_op_infer(op_names[op], info, (size_t)n_in, attr, (size_t)n_attr, &out, &err) != 0)
        raise_core(L, err);
    int abs_in[4];
    for (int i = 0; i < n_in; i++) abs_in[i] = lua_absindex(L, in[i]);
    lmk_node *n = push_node(L, op, out.dtype, out.rank, out.shape);
    n->n_in = n_in;
    n->n_attr = n_attr;
    if (n_attr) memcpy(n->attr, attr, sizeof(int64_t) * (size_t)n_attr);
    for (int i = 0; i < n_in; i++) {
        lua_pushvalue(L, abs_in[i]);
        lua_setiuservalue(L, -2, i + 1);
    }
    return n;
}

/* For commutative ops: a op b as written, else b op a when only that broadcasts. */
static int build_commutative(lua_State *L, lmk_op op, const char *fn) {
    lmk_node *a = to_node(L, 1), *b = to_node(L, 2);
    if (!a && !b) ARG_ERROR(L, fn, "needs a node operand, got %s and %s", luaL_typename(L, 1),
                            luaL_typename(L, 2));
    if (!a) a = coerce_operand(L, 1, b, fn, "the left operand");
    if (!b) b = coerce_operand(L, 2, a, fn, "the right operand");
    mk_tensor_info ia = {NULL, a->dtype, a->rank, {0}}, ib = {NULL, b->dtype, b->rank, {0}}, out;
    memcpy(ia.shape, a->shape, sizeof ia.shape);
    memcpy(ib.shape, b->shape, sizeof ib.shape);
    mk_error *err = NULL;
    mk_tensor_info ab[2] = {ia, ib}, ba[2] = {ib, ia};
    bool forward = mk_op_infer(op_names[op], ab, 2, NULL, 0, &out, &err) == 0;
    mk_error_free(err);
    err = NULL;
    if (!forward && mk_op_infer(op_names[op], ba, 2, NULL, 0, &out, &err) == 0) {
        build_op(L, op, (int[]){2, 1}, 2, NULL, 0);
        return 1;
    }
    mk_error_free(err);
    build_op(L, op, (int[]){1, 2}, 2, NULL, 0); /* raises the forward error when it fails */
    return 1;
}

static int node_add(lua_State *L) { return build_commutative(L, OP_SUM, "SumNode (+)"); }
static int node_mul(lua_State *L) {
    return build_commutative(L, OP_HADAMARD, "HadamardProductNode (*)");
}

static int node_complex_mul(lua_State *L) {
    check_node(L, 1, "complex_mul");
    return build_commutative(L, OP_COMPLEX_MUL, "complex_mul");
}

static int node_unary(lua_State *L, lmk_op op, const char *fn) {
    check_node(L, 1, fn);
    build_op(L, op, (int[]){1}, 1, NULL, 0);
    return 1;
}
static int node_relu(lua_State *L) { return node_unary(L, OP_RELU, "relu"); }
static int node_silu(lua_State *L) { return node_unary(L, OP_SILU, "silu"); }
static int node_argmax(lua_State *L) { return node_unary(L, OP_ARGMAX, "argmax"); }

static int node_matmul(lua_State *L) {
    lmk_node *a = check_node(L, 1, "matmul");
    coerce_operand(L, 2, NULL, "matmul", "the right operand");
    (void)a;
    build_op(L, OP_MATMUL, (int[]){1, 2}, 2, NULL, 0);
    return 1;
}

static int node_rms_norm(lua_State *L) {
    check_node(L, 1, "rms_norm");
    coerce_operand(L, 2, NULL, "rms_norm", "the weights");
    build_op(L, OP_RMS_NORM, (int[]){1, 2}, 2, NULL, 0);
    return 1;
}

/* x:slice(begin, end): rows [begin, end) of the first axis, 0-based. */
static int node_slice(lua_State *L) {
    check_node(L, 1, "slice");
    int64_t attr[2] = {check_int(L, 2, "slice", "begin"), check_int(L, 3, "slice", "end")};
    build_op(L, OP_SLICE, (int[]){1}, 1, attr, 2);
    return 1;
}

/* x:reshape{...} / x:permute{...}, or the integers as arguments. */
static int node_list_op(lua_State *L, lmk_op op, const char *fn, const char *what) {
    check_node(L, 1, fn);
    int64_t attr[MK_MAX_RANK];
    int n;
    if (lua_type(L, 2) == LUA_TTABLE) {
        n = check_int_list(L, 2, fn, what, attr, MK_MAX_RANK);
    } else {
        n = lua_gettop(L) - 1;
        if (n > MK_MAX_RANK)
            raise(L, "shape error", fn, "%s has %d entries (at most %d)", what, n, MK_MAX_RANK);
        for (int i = 0; i < n; i++) attr[i] = check_int(L, 2 + i, fn, what);
    }
    if (n < 1) raise(L, "shape error", fn, "%s is empty (ranks 1 to %d)", what, MK_MAX_RANK);
    build_op(L, op, (int[]){1}, 1, attr, n);
    return 1;
}
static int node_reshape(lua_State *L) { return node_list_op(L, OP_RESHAPE, "reshape", "shape"); }
static int node_permute(lua_State *L) {
    return node_list_op(L, OP_PERMUTE, "permute", "permutation");
}

/*
 * The int64 [1] operand at idx: a node stays (the core checks its type); a Lua
 * integer becomes a constant after the range check lo <= v <= hi.
 */
static void coerce_bound(lua_State *L, int idx, const char *fn, const char *what, int64_t lo,
                         int64_t hi, int64_t *value) {
    if (to_node(L, idx)) return;
    if (lua_type(L, idx) != LUA_TNUMBER)
        ARG_ERROR(L, fn, "%s must be an int64 [1] node or an integer, got %s", what,
                  luaL_typename(L, idx));
    int64_t v = check_int(L, idx, fn, what);
    if (v < lo || v > hi)
        raise(L, "shape error", fn, "%s %lld is out of range (%lld to %lld)", what, (long long)v,
              (long long)lo, (long long)hi);
    *value = v;
    push_scalar_tensor(L, idx, MK_DTYPE_INT64, 1, fn);
    push_constant_node(L, -1, NULL);
    lua_remove(L, -2);
    lua_replace(L, idx);
}

/* x:replace(r, begin, end): r written into rows [begin, end) of x, in place. */
static int node_replace(lua_State *L) {
    const char *fn = "replace";
    lmk_node *x = check_node(L, 1, fn);
    lua_settop(L, 4);
    lmk_node *r = coerce_operand(L, 2, NULL, fn, "the replacement");
    int64_t b = -1, e = -1;
    coerce_bound(L, 3, fn, "begin", 0, x->shape[0] - 1, &b);
    coerce_bound(L, 4, fn, "end", 1, x->shape[0], &e);
    if (b >= 0 && e >= 0 && e - b != r->shape[0])
        raise(L, "shape error", fn, "rows [%lld, %lld) of %s are %lld, the replacement %s has %lld",
              (long long)b, (long long)e, SHAPE_STR(x->rank, x->shape), (long long)(e - b),
              SHAPE_STR(r->rank, r->shape), (long long)r->shape[0]);
    build_op(L, OP_REPLACE, (int[]){1, 2, 3, 4}, 4, NULL, 0);
    return 1;
}

/* x:sliced_softmax(prefix): softmax of the first `prefix` entries of each row. */
static int node_sliced_softmax(lua_State *L) {
    const char *fn = "sliced_softmax";
    lmk_node *x = check_node(L, 1, fn);
    lua_settop(L, 2);
    int64_t p = 0;
    coerce_bound(L, 2, fn, "prefix", 0, x->shape[x->rank - 1], &p);
    build_op(L, OP_SLICED_SOFTMAX, (int[]){1, 2}, 2, NULL, 0);
    return 1;
}

/* mk.embedding(table, ids): rows of table [V, D] picked by int64 ids [n]. */
static int l_embedding(lua_State *L) {
    lua_settop(L, 2);
    coerce_operand(L, 1, NULL, "embedding", "the table");
    coerce_operand(L, 2, NULL, "embedding", "the ids");
    build_op(L, OP_EMBEDDING, (int[]){1, 2}, 2, NULL, 0);
    return 1;
}

/* mk.input(name, dtype, shape) or mk.input(name, shape) (float32) */
static int l_input(lua_State *L) {
    const char *fn = "input";
    int64_t shape[MK_MAX_RANK];
    if (lua_type(L, 1) != LUA_TSTRING)
        ARG_ERROR(L, fn, "the name must be a string, got %s", luaL_typename(L, 1));
    const char *name = lua_tostring(L, 1);
    if (!is_identifier(name))
        ARG_ERROR(L, fn, "name '%s' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", name);
    if (lua_type(L, 2) == LUA_TTABLE) { /* mk.input(name, shape): float32 */
        lua_settop(L, 2);
        lua_pushnil(L);
        lua_insert(L, 2);
    }
    mk_dtype dtype = check_dtype(L, 2, fn, true);
    int rank = check_shape(L, 3, fn, shape);
    push_node(L, OP_INPUT, dtype, rank, shape);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, UV_NAME);
    return 1;
}

/* mk.constant(tensor[, name]) */
static int l_constant(lua_State *L) {
    const char *fn = "constant";
    if (lua_type(L, 1) == LUA_TTABLE) {
        /* A nested table of numbers: float32 by default, as mk.tensor. */
        lua_pushcfunction(L, l_tensor);
        lua_pushvalue(L, 1);
        lua_call(L, 1, 1);
        lua_replace(L, 1);
    }
    check_tensor(L, 1, fn);
    const char *name = NULL;
    if (!lua_isnoneornil(L, 2)) {
        if (lua_type(L, 2) != LUA_TSTRING)
            ARG_ERROR(L, fn, "the name must be a string, got %s", luaL_typename(L, 2));
        name = lua_tostring(L, 2);
        if (!is_identifier(name))
            ARG_ERROR(L, fn, "name '%s' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", name);
    }
    push_constant_node(L, 1, name);
    return 1;
}

/* mk.buffer(dtype, shape): persistent state, zero after compile. */
static int l_buffer(lua_State *L) {
    int64_t shape[MK_MAX_RANK];
    mk_dtype dtype = check_dtype(L, 1, "buffer", false);
    int rank = check_shape(L, 2, "buffer", shape);
    push_node(L, OP_BUFFER, dtype, rank, shape);
    return 1;
}

static int node_tostring(lua_State *L) {
    lmk_node *n = check_node(L, 1, "tostring");
    lua_getiuservalue(L, 1, UV_NAME);
    const char *name = lua_tostring(L, -1);
    lua_pushfstring(L, "node %s%s%s %s %s", op_names[n->op], name ? " " : "", name ? name : "",
                    mk_dtype_name(n->dtype), SHAPE_STR(n->rank, n->shape));
    return 1;
}

/* Fields (shape, dtype, op, name, rank), then methods (upvalue 1). */
static int node_index(lua_State *L) {
    lmk_node *n = check_node(L, 1, "index");
    const char *k = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
    if (k) {
        if (!strcmp(k, "shape")) return push_shape(L, n->rank, n->shape), 1;
        if (!strcmp(k, "dtype")) return lua_pushstring(L, mk_dtype_name(n->dtype)), 1;
        if (!strcmp(k, "op")) return lua_pushstring(L, op_names[n->op]), 1;
        if (!strcmp(k, "rank")) return lua_pushinteger(L, n->rank), 1;
        if (!strcmp(k, "name")) return lua_getiuservalue(L, 1, UV_NAME), 1;
    }
    lua_pushvalue(L, 2);
    lua_gettable(L, lua_upvalueindex(1));
    return 1;
}

/*
 * core.node_info(node) -> {op =, dtype =, shape =, inputs = {...}, attrs = {...},
 * name =, tensor =}: what the lowering in init.lua prints.
 */
static int l_node_info(lua_State *L) {
    lmk_node *n = check_node(L, 1, "node_info");
    lua_createtable(L, 0, 7);
    lua_pushstring(L, op_names[n->op]);
    lua_setfield(L, -2, "op");
    lua_pushstring(L, mk_dtype_name(n->dtype));
    lua_setfield(L, -2, "dtype");
    push_shape(L, n->rank, n->shape);
    lua_setfield(L, -2, "shape");
    lua_createtable(L, n->n_in, 0);
    for (int i = 0; i < n->n_in; i++) {
        lua_getiuservalue(L, 1, i + 1);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "inputs");
    push_shape(L, n->n_attr, n->attr);
    lua_setfield(L, -2, "attrs");
    lua_getiuservalue(L, 1, UV_NAME);
    lua_setfield(L, -2, "name");
    lua_getiuservalue(L, 1, UV_TENSOR);
    lua_setfield(L, -2, "tensor");
    return 1;
}

static int l_is_node(lua_State *L) {
    lua_pushboolean(L, to_node(L, 1) != NULL);
    return 1;
}

static int l_is_tensor(lua_State *L) {
    lua_pushboolean(L, to_tensor(L, 1) != NULL);
    return 1;
}

/* ==== context =============================================================== */

typedef struct {
    mk_context *ctx; /* NULL while closed */
} lmk_context;

static int context_gc(lua_State *L) {
    lmk_context *c = (lmk_context *)luaL_checkudata(L, 1, CONTEXT_MT);
    if (c->ctx) mk_context_free(c->ctx);
    c->ctx = NULL;
    return 0;
}

/* The one context of this lua_State, created on first use (never at luaopen). */
static mk_context *get_context(lua_State *L) {
    if (lua_getfield(L, LUA_REGISTRYINDEX, CONTEXT_KEY) == LUA_TUSERDATA) {
        lmk_context *c = (lmk_context *)lua_touserdata(L, -1);
        lua_pop(L, 1);
        if (c->ctx) return c->ctx;
    } else {
        lua_pop(L, 1);
    }
    lmk_context *c = (lmk_context *)lua_newuserdatauv(L, sizeof *c, 0);
    c->ctx = NULL;
    luaL_setmetatable(L, CONTEXT_MT);
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, CONTEXT_KEY);
    lua_pop(L, 1);
    mk_error *err = NULL;
    c->ctx = mk_context_new(&err);
    if (!c->ctx) raise_core(L, err);
    return c->ctx;
}

/* ==== models ================================================================ */

typedef struct {
    mk_model *model; /* NULL while closed */
    mk_device device;
} lmk_model;

static lmk_model *check_model(lua_State *L, int idx, const char *fn, bool open) {
    lmk_model *m = (lmk_model *)luaL_testudata(L, idx, MODEL_MT);
    if (!m) ARG_ERROR(L, fn, "argument #%d must be a model, got %s", idx, luaL_typename(L, idx));
    if (open && !m->model) ARG_ERROR(L, fn, "the model is closed");
    return m;
}

/* __gc and __close: one idempotent release. */
static int model_release(lua_State *L) {
    lmk_model *m = check_model(L, 1, "close", false);
    if (m->model) mk_model_free(m->model);
    m->model = NULL;
    lua_pushnil(L);
    lua_setiuservalue(L, 1, 1); /* the borrowed constants may go */
    return 0;
}

static const char *device_name(mk_device d) { return d == MK_DEVICE_CUDA ? "cuda" : "cpu"; }

typedef struct {
    const char *name;
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
} declared_constant;

/* Skips blanks in the core's printed script. */
static const char *skip_ws(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    return s;
}

/*
 * Reads the next "ConstantTensor(name, dtype, [d, ...])" of the core's
 * canonical script text (mk_script_format: comments gone, one statement per
 * line). Returns the position after it, or NULL when there is none. The name
 * is not NUL-terminated: name_len gives its length.
 */
static const char *next_constant(const char *s, const char **name, size_t *name_len,
                                 mk_dtype *dtype, int *rank, int64_t *shape) {
    static const char key[] = "ConstantTensor";
    for (const char *p = strstr(s, key); p; p = strstr(p + 1, key)) {
        const char *q = skip_ws(p + sizeof key - 1);
        if (*q != '(') continue;
        q = skip_ws(q + 1);
        *name = q;
        while (*q && *q != ',' && *q != ' ') q++;
        *name_len = (size_t)(q - *name);
        q = skip_ws(q);
        if (*q != ',') continue;
        q = skip_ws(q + 1);
        if (!strncmp(q, "float32", 7)) *dtype = MK_DTYPE_FLOAT32, q += 7;
        else if (!strncmp(q, "int64", 5)) *dtype = MK_DTYPE_INT64, q += 5;
        else continue;
        q = skip_ws(q);
        if (*q != ',') continue;
        q = skip_ws(q + 1);
        if (*q != '[') continue;
        q++;
        *rank = 0;
        while (*rank < MK_MAX_RANK) {
            char *end;
            long long v = strtoll(q, &end, 10);
            if (end == q) break;
            shape[(*rank)++] = v;
            q = skip_ws(end);
            if (*q == ',') q = skip_ws(q + 1);
        }
        return q;
    }
    return NULL;
}

/* lua_pcall'd: pushes the C string (a memory error must not leak it). */
static int push_cstring(lua_State *L) {
    lua_pushstring(L, (const char *)lua_touserdata(L, 1));
    return 1;
}

/*
 * Checks the constants table (name -> tensor) against the ConstantTensor
 * statements of the script: each declared once, with the script's dtype and
 * shape (the core reads exactly that many bytes), and no extra names. Leaves
 * the script's canonical text on the stack.
 */
static void check_constants(lua_State *L, int script_idx, int consts_idx) {
    const char *fn = "compile";
    mk_error *err = NULL;
    char *canon = mk_script_format(lua_tostring(L, script_idx), &err);
    if (!canon) raise_core(L, err);
    lua_pushcfunction(L, push_cstring);
    lua_pushlightuserdata(L, canon);
    int status = lua_pcall(L, 1, 1, 0);
    mk_string_free(canon);
    if (status != LUA_OK) lua_error(L);
    int canon_idx = lua_gettop(L);
    lua_newtable(L); /* names seen */
    int seen = lua_gettop(L);
    const char *p = lua_tostring(L, canon_idx), *name;
    size_t name_len;
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    while ((p = next_constant(p, &name, &name_len, &dtype, &rank, shape))) {
        lua_pushlstring(L, name, name_len);
        const char *nm = lua_tostring(L, -1);
        lua_pushboolean(L, 1);
        lua_setfield(L, seen, nm);
        if (lua_isnil(L, consts_idx)) lua_pushnil(L);
        else lua_getfield(L, consts_idx, nm);
        lmk_tensor *t = to_tensor(L, -1);
        if (lua_isnil(L, -1))
            raise(L, "input error", fn, "missing constant '%s' (%s %s)", nm,
                  mk_dtype_name(dtype), SHAPE_STR(rank, shape));
        if (!t)
            ARG_ERROR(L, fn, "constant '%s' must be a tensor, got %s", nm, luaL_typename(L, -1));
        if (t->dtype != dtype || !same_shape(t->rank, t->shape, rank, shape))
            raise(L, "input error", fn, "constant '%s' is %s %s, the script declares %s %s", nm,
                  mk_dtype_name(t->dtype), SHAPE_STR(t->rank, t->shape), mk_dtype_name(dtype),
                  SHAPE_STR(rank, shape));
        lua_pop(L, 2);
    }
    if (!lua_isnil(L, consts_idx)) {
        lua_pushnil(L);
        while (lua_next(L, consts_idx)) {
            lua_pop(L, 1);
            if (lua_type(L, -1) != LUA_TSTRING)
                ARG_ERROR(L, fn, "constant names must be strings, got %s", luaL_typename(L, -1));
            lua_pushvalue(L, -1);
            if (lua_gettable(L, seen) == LUA_TNIL)
                raise(L, "input error", fn, "unknown constant '%s' (the script declares no such "
                      "ConstantTensor)", lua_tostring(L, -2));
            lua_pop(L, 1);
        }
    }
    lua_settop(L, canon_idx);
}

/* Reads compile options from the table at idx. */
static mk_compile_options check_options(lua_State *L, int idx) {
    const char *fn = "compile";
    mk_compile_options o = {.device = MK_DEVICE_CPU};
    if (lua_isnoneornil(L, idx)) return o;
    if (lua_type(L, idx) != LUA_TTABLE)
        ARG_ERROR(L, fn, "options must be a table, got %s", luaL_typename(L, idx));
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        if (k && !strcmp(k, "device")) {
            const char *d = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            if (d && !strcmp(d, "cpu")) o.device = MK_DEVICE_CPU;
            else if (d && !strcmp(d, "cuda")) o.device = MK_DEVICE_CUDA;
            else ARG_ERROR(L, fn, "device must be \"cpu\" or \"cuda\", got %s",
                           d ? d : luaL_typename(L, -1));
        } else if (k && (!strcmp(k, "cudnn") || !strcmp(k, "passes"))) {
            if (!lua_isboolean(L, -1))
                ARG_ERROR(L, fn, "option %s must be a boolean, got %s", k, luaL_typename(L, -1));
            if (k[0] == 'c') o.use_cudnn = lua_toboolean(L, -1);
            else o.no_passes = !lua_toboolean(L, -1);
        } else {
            ARG_ERROR(L, fn, "unknown option %s (device, cudnn, passes)",
                      k ? k : luaL_typename(L, -2));
        }
        lua_pop(L, 1);
    }
    return o;
}

/*
 * core.compile_script(text, constants, opts) -> model. constants maps each
 * ConstantTensor name to a tensor (its data is handed over, not copied in Lua).
 */
static int l_compile_script(lua_State *L) {
    const char *fn = "compile";
    lua_settop(L, 3);
    if (lua_type(L, 1) != LUA_TSTRING)
        ARG_ERROR(L, fn, "the script must be a string, got %s", luaL_typename(L, 1));
    if (!lua_isnil(L, 2) && lua_type(L, 2) != LUA_TTABLE)
        ARG_ERROR(L, fn, "constants must be a table {name = tensor}, got %s", luaL_typename(L, 2));
    mk_compile_options opts = check_options(L, 3);
    check_constants(L, 1, 2);

    /* A private copy of the constants: the CPU model borrows their memory. */
    lua_newtable(L);
    int keep = lua_gettop(L);
    size_t n = 0;
    if (!lua_isnil(L, 2)) {
        lua_pushnil(L);
        while (lua_next(L, 2)) {
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, keep);
            n++;
        }
    }
    /* The name/data array lives in a userdata, so an error cannot leak it. */
    mk_named_tensor *named =
        (mk_named_tensor *)lua_newuserdatauv(L, (n ? n : 1) * sizeof *named, 0);
    size_t i = 0;
    lua_pushnil(L);
    while (lua_next(L, keep)) {
        named[i].name = lua_tostring(L, -2); /* anchored by `keep` */
        named[i].data = to_tensor(L, -1)->data;
        i++;
        lua_pop(L, 1);
    }
    opts.borrow_constants = opts.device == MK_DEVICE_CPU;

    mk_context *ctx = get_context(L);
    lmk_model *m = (lmk_model *)lua_newuserdatauv(L, sizeof *m, 1);
    m->model = NULL;
    m->device = opts.device;
    luaL_setmetatable(L, MODEL_MT);
    mk_error *err = NULL;
    m->model = mk_compile(ctx, lua_tostring(L, 1), named, n, &opts, &err);
    if (!m->model) raise_core(L, err);
    if (opts.borrow_constants) {
        lua_pushvalue(L, keep);
        lua_setiuservalue(L, -2, 1);
    }
    return 1;
}

static void push_info(lua_State *L, const mk_tensor_info *info) {
    lua_createtable(L, 0, 3);
    if (info->name) {
        lua_pushstring(L, info->name);
        lua_setfield(L, -2, "name");
    }
    lua_pushstring(L, mk_dtype_name(info->dtype));
    lua_setfield(L, -2, "dtype");
    push_shape(L, info->rank, info->shape);
    lua_setfield(L, -2, "shape");
}

/*
 * model:run({name = tensor, ...}[, out]) -> a new output tensor (or `out`,
 * filled). Names, dtypes and shapes are checked against the model first.
 */
static int model_run(lua_State *L) {
    const char *fn = "run";
    lmk_model *m = check_model(L, 1, fn, true);
    lua_settop(L, 3);
    if (lua_isnil(L, 2)) { /* a model without inputs may be run as model:run() */
        lua_newtable(L);
        lua_replace(L, 2);
    }
    if (lua_type(L, 2) != LUA_TTABLE)
        ARG_ERROR(L, fn, "inputs must be a table {name = tensor}, got %s", luaL_typename(L, 2));
    size_t count = mk_model_input_count(m->model);
    mk_named_tensor *named =
        (mk_named_tensor *)lua_newuserdatauv(L, (count ? count : 1) * sizeof *named, 0);
    for (size_t i = 0; i < count; i++) {
        mk_tensor_info info;
        mk_error *err = NULL;
        if (mk_model_input_info(m->model, i, &info) != 0)
            return raise(L, "internal error", fn, "no information on input %zu", i + 1);
        (void)err;
        lua_getfield(L, 2, info.name);
        lmk_tensor *t = to_tensor(L, -1);
        if (lua_isnil(L, -1))
            raise(L, "input error", fn, "missing input '%s' (%s %s)", info.name,
                  mk_dtype_name(info.dtype), SHAPE_STR(info.rank, info.shape));
        if (!t)
            raise(L, "input error", fn, "input '%s' must be a tensor, got %s", info.name,
                  luaL_typename(L, -1));
        if (t->dtype != info.dtype)
            raise(L, "input error", fn, "input '%s' is %s, the model takes %s %s", info.name,
                  mk_dtype_name(t->dtype), mk_dtype_name(info.dtype),
                  SHAPE_STR(info.rank, info.shape));
        if (!same_shape(t->rank, t->shape, info.rank, info.shape))
            raise(L, "input error", fn, "input '%s' has shape %s, the model takes %s",
                  info.name, SHAPE_STR(t->rank, t->shape), SHAPE_STR(info.rank, info.shape));
        named[i] = (mk_named_tensor){info.name, t->data}; /* anchored by the inputs table */
        lua_pop(L, 1);
    }
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING)
            raise(L, "input error", fn, "input names must be strings, got %s",
                  luaL_typename(L, -1));
        const char *k = lua_tostring(L, -1);
        bool known = false;
        for (size_t i = 0; i < count && !known; i++) known = !strcmp(named[i].name, k);
        if (!known) {
            luaL_Buffer b;
            char line[160];
            snprintf(line, sizeof line, "input error: run: unknown input '%s' (the model takes ",
                     k);
            luaL_buffinit(L, &b);
            luaL_addstring(&b, line);
            for (size_t i = 0; i < count; i++) {
                if (i) luaL_addstring(&b, ", ");
                luaL_addstring(&b, named[i].name);
            }
            luaL_addstring(&b, count ? ")" : "no inputs)");
            luaL_pushresult(&b);
            return lua_error(L);
        }
    }
    mk_tensor_info out_info;
    if (mk_model_output_info(m->model, &out_info) != 0)
        return raise(L, "internal error", fn, "no information on the output");
    lmk_tensor *out;
    if (!lua_isnil(L, 3)) {
        out = check_tensor(L, 3, fn);
        if (out->readonly) ARG_ERROR(L, fn, "the output tensor is read-only");
        if (out->dtype != out_info.dtype ||
            !same_shape(out->rank, out->shape, out_info.rank, out_info.shape))
            ARG_ERROR(L, fn, "the output tensor is %s %s, the model gives %s %s",
                      mk_dtype_name(out->dtype), SHAPE_STR(out->rank, out->shape),
                      mk_dtype_name(out_info.dtype), SHAPE_STR(out_info.rank, out_info.shape));
        lua_pushvalue(L, 3);
    } else {
        out = push_tensor(L, fn, out_info.dtype, out_info.rank, out_info.shape);
    }
    mk_error *err = NULL;
    if (mk_evaluate(m->model, named, count, out->data, out->bytes, &err) != 0) raise_core(L, err);
    return 1;
}

static int model_stats(lua_State *L) {
    lmk_model *m = check_model(L, 1, "stats", true);
    mk_stats s;
    memset(&s, 0, sizeof s);
    if (mk_model_stats(m->model, &s) != 0)
        return raise(L, "internal error", "stats", "the model gave no statistics");
    lua_createtable(L, 0, 12);
#define FIELD_INT(k, v) (lua_pushinteger(L, (lua_Integer)(v)), lua_setfield(L, -2, k))
    FIELD_INT("arena_bytes", s.arena_bytes);
    FIELD_INT("lower_bound_bytes", s.lower_bound_bytes);
    FIELD_INT("constant_bytes", s.constant_bytes);
    FIELD_INT("buffer_bytes", s.buffer_bytes);
    FIELD_INT("nodes", s.nodes);
    FIELD_INT("launches", s.launches);
    FIELD_INT("fused", s.fused_groups);
    FIELD_INT("cudnn_cache_hits", s.cudnn_cache_hits);
    FIELD_INT("cudnn_rejected", s.cudnn_rejected);
    FIELD_INT("cudnn_tf32_groups", s.cudnn_tf32_groups);
#undef FIELD_INT
    lua_pushnumber(L, s.compile_ms);
    lua_setfield(L, -2, "compile_ms");
    lua_pushnumber(L, s.plan_ms);
    lua_setfield(L, -2, "plan_ms");
    lua_pushstring(L, device_name((mk_device)s.device));
    lua_setfield(L, -2, "device");
    return 1;
}

/* model:reset(): every BufferTensor back to zero, as after compile */
static int model_reset(lua_State *L) {
    lmk_model *m = check_model(L, 1, "reset", true);
    mk_error *err = NULL;
    if (mk_model_reset(m->model, &err) != 0) raise_core(L, err);
    return 0;
}

/* mk.clock() -> seconds of a monotonic wall clock, for timing */
static int l_clock(lua_State *L) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
    return 1;
}

static int model_script(lua_State *L) {
    lmk_model *m = check_model(L, 1, "script", true);
    const char *s = mk_model_script(m->model);
    lua_pushstring(L, s ? s : "");
    return 1;
}

/* model:fusion_report() -> one line per group the cuDNN pass tried ("" without cuDNN) */
static int model_fusion_report(lua_State *L) {
    lmk_model *m = check_model(L, 1, "fusion_report", true);
    const char *s = mk_model_fusion_report(m->model);
    lua_pushstring(L, s ? s : "");
    return 1;
}

/* model:inputs() -> {{name =, dtype =, shape =}, ...}; model:output() -> {dtype =, shape =} */
static int model_inputs(lua_State *L) {
    lmk_model *m = check_model(L, 1, "inputs", true);
    size_t count = mk_model_input_count(m->model);
    lua_createtable(L, (int)count, 0);
    for (size_t i = 0; i < count; i++) {
        mk_tensor_info info;
        if (mk_model_input_info(m->model, i, &info) != 0) continue;
        push_info(L, &info);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

static int model_output(lua_State *L) {
    lmk_model *m = check_model(L, 1, "output", true);
    mk_tensor_info info;
    if (mk_model_output_info(m->model, &info) != 0)
        return raise(L, "internal error", "output", "no information on the output");
    info.name = NULL;
    push_info(L, &info);
    return 1;
}

static int model_tostring(lua_State *L) {
    lmk_model *m = check_model(L, 1, "tostring", false);
    if (!m->model) {
        lua_pushstring(L, "model (closed)");
        return 1;
    }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "model ");
    luaL_addstring(&b, device_name(m->device));
    luaL_addstring(&b, " (");
    size_t count = mk_model_input_count(m->model);
    for (size_t i = 0; i < count; i++) {
        mk_tensor_info info;
        if (mk_model_input_info(m->model, i, &info) != 0) continue;
        char line[160];
        snprintf(line, sizeof line, "%s%s %s %s", i ? ", " : "", info.name,
                 mk_dtype_name(info.dtype), SHAPE_STR(info.rank, info.shape));
        luaL_addstring(&b, line);
    }
    mk_tensor_info out;
    if (mk_model_output_info(m->model, &out) == 0) {
        char line[160];
        snprintf(line, sizeof line, ") -> %s %s", mk_dtype_name(out.dtype),
                 SHAPE_STR(out.rank, out.shape));
        luaL_addstring(&b, line);
    }
    luaL_pushresult(&b);
    return 1;
}

/* ==== module ================================================================ */

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
        ARG_ERROR(L, "format_script", "the script must be a string, got %s", luaL_typename(L, 1));
    mk_error *err = NULL;
    char *s = mk_script_format(lua_tostring(L, 1), &err);
    if (!s) raise_core(L, err);
    lua_pushcfunction(L, push_cstring);
    lua_pushlightuserdata(L, s);
    int status = lua_pcall(L, 1, 1, 0);
    mk_string_free(s);
    if (status != LUA_OK) lua_error(L);
    return 1;
}

/* Sets the metatable `name` (created once, refilled on every luaopen). */
static void define_type(lua_State *L, const char *name, const luaL_Reg *meta,
                        const luaL_Reg *methods, lua_CFunction index) {
    luaL_newmetatable(L, name);
    luaL_setfuncs(L, meta, 0);
    if (methods) {
        /* A methods table kept in the metatable, so init.lua may add to it. */
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
    lua_pop(L, 1);
}

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

    static const luaL_Reg tensor_meta[] = {
        {"__tostring", tensor_tostring}, {"__len", tensor_len}, {NULL, NULL}};
    static const luaL_Reg tensor_methods[] = {
        {"totable", tensor_totable}, {"bytes", tensor_bytes}, {"get", tensor_get},
        {"set", tensor_set}, {"argmax", tensor_argmax}, {"copy", tensor_copy}, {NULL, NULL}};
    define_type(L, TENSOR_MT, tensor_meta, tensor_methods, tensor_index);

    static const luaL_Reg mapping_meta[] = {{"__gc", mapping_gc}, {NULL, NULL}};
    define_type(L, MAPPING_MT, mapping_meta, NULL, NULL);

    static const luaL_Reg node_meta[] = {
        {"__tostring", node_tostring}, {"__add", node_add}, {"__mul", node_mul}, {NULL, NULL}};
    static const luaL_Reg node_methods[] = {
        {"matmul", node_matmul}, {"relu", node_relu}, {"silu", node_silu},
        {"slice", node_slice}, {"reshape", node_reshape}, {"permute", node_permute},
        {"replace", node_replace}, {"rms_norm", node_rms_norm},
        {"complex_mul", node_complex_mul}, {"sliced_softmax", node_sliced_softmax},
        {"argmax", node_argmax}, {NULL, NULL}};
    define_type(L, NODE_MT, node_meta, node_methods, node_index);

    static const luaL_Reg model_meta[] = {
        {"__gc", model_release}, {"__close", model_release}, {"__tostring", model_tostring},
        {NULL, NULL}};
    static const luaL_Reg model_methods[] = {
        {"run", model_run}, {"stats", model_stats}, {"script", model_script},
        {"fusion_report", model_fusion_report}, {"reset", model_reset},
        {"inputs", model_inputs}, {"output", model_output}, {"close", model_release},
        {NULL, NULL}};
    define_type(L, MODEL_MT, model_meta, model_methods, NULL); /* __index = methods */

    static const luaL_Reg context_meta[] = {{"__gc", context_gc}, {NULL, NULL}};
    define_type(L, CONTEXT_MT, context_meta, NULL, NULL);

    if (lua_getfield(L, LUA_REGISTRYINDEX, MAPPINGS_KEY) != LUA_TTABLE) {
        lua_newtable(L);
        lua_newtable(L);
        lua_pushstring(L, "v");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
        lua_setfield(L, LUA_REGISTRYINDEX, MAPPINGS_KEY);
    }
    lua_pop(L, 1);

    static const luaL_Reg functions[] = {
        {"tensor", l_tensor}, {"zeros", l_zeros}, {"from_bytes", l_from_bytes},
        {"from_file", l_from_file}, {"input", l_input}, {"constant", l_constant},
        {"buffer", l_buffer}, {"embedding", l_embedding}, {"node_info", l_node_info},
        {"compile_script", l_compile_script}, {"cuda_available", l_cuda_available},
        {"format_script", l_format_script}, {"is_node", l_is_node},
        {"is_tensor", l_is_tensor}, {"clock", l_clock}, {NULL, NULL}};
    luaL_newlib(L, functions);
    lua_pushstring(L, mk_version());
    lua_setfield(L, -2, "version");
    lua_pushstring(L, mk_build_info());
    lua_setfield(L, -2, "build_info");
    luaL_getmetatable(L, NODE_MT);
    lua_getfield(L, -1, "methods");
    lua_setfield(L, -3, "node_methods");
    lua_pop(L, 1);
    luaL_getmetatable(L, TENSOR_MT);
    lua_getfield(L, -1, "methods");
    lua_setfield(L, -3, "tensor_methods");
    lua_pop(L, 1);
    return 1;
}
