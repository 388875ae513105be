/*
 * lmk.h — what the files of the Lua binding `moonkaas.core` share.
 *
 * The binding is split by the userdata each part serves, as Lua's own
 * liolib.c and LPeg are:
 *
 *   lmk.c     argument checks, error raising, shapes, metatable set-up
 *   tensor.c  host tensors (moonkaas.tensor) and the file mappings behind
 *             mk.from_file (moonkaas.mapping)
 *   node.c    graph nodes (moonkaas.node): the three leaves, and every other op
 *             built from the core's op table (mk_op_info) by one generic builder
 *   model.c   compiling (core.compile_script) and models (moonkaas.model)
 *   onnx.c    ONNX imports (moonkaas.onnx): the script and constants an ONNX
 *             file becomes, for lua/moonkaas/onnx.lua's mk.load_onnx
 *   module.c  the context of a lua_State (moonkaas.context), the module
 *             functions and luaopen_moonkaas_core
 *
 * Each file owns its metatable and its checks; this header holds the few
 * functions and types that cross files. Nothing here is exported from the
 * shared object (the build uses -fvisibility=hidden; only
 * luaopen_moonkaas_core carries LMK_EXPORT), and nothing here includes core
 * internals: the binding is a client of core/moonkaas.h only.
 *
 * Error discipline (STYLE.md): every argument is checked before anything is
 * acquired; userdata are created "closed" before the C resource they hold; a
 * core error is copied to the C stack and freed before lua_error, so nothing
 * C-owned is live at a longjmp. Messages start with a stable kind prefix
 * ("shape error: ", "argument error: ", ...), the same ones the core uses.
 */
#ifndef LMK_H
#define LMK_H

#include "moonkaas.h"

#include <lauxlib.h>
#include <lua.h>

#include "compat.h" /* the 5.4 API on Lua 5.1 and LuaJIT */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LMK_EXPORT __attribute__((visibility("default")))

#define LMK_TENSOR_MT "moonkaas.tensor"
#define LMK_MAPPING_MT "moonkaas.mapping"
#define LMK_NODE_MT "moonkaas.node"
#define LMK_MODEL_MT "moonkaas.model"
#define LMK_CONTEXT_MT "moonkaas.context"

/* ---- errors (lmk.c) ---------------------------------------------------------- */

/* Raises "<kind>: <fn>: <message>"; the kind is one of the core's prefixes. */
int lmk_raise(lua_State *L, const char *kind, const char *fn, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define LMK_ARG_ERROR(L, fn, ...) lmk_raise((L), "argument error", (fn), __VA_ARGS__)

/* Copies a core error to the C stack, frees it, then raises its message. */
int lmk_raise_core(lua_State *L, mk_error *err);

/* ---- argument checks (lmk.c) ----------------------------------------------- */

/* A dtype name at idx, any row of the core's dtype table; absent: float32 when
 * allow_default. An unknown name is a dtype error listing the known ones. */
mk_dtype lmk_check_dtype(lua_State *L, int idx, const char *fn, bool allow_default);

/* An integer argument; floats with an integral value are accepted. */
int64_t lmk_check_int(lua_State *L, int idx, const char *fn, const char *what);

/* A table of at most `max` integers at idx into out; returns the count. */
int lmk_check_int_list(lua_State *L, int idx, const char *fn, const char *what, int64_t *out,
                       int max);

/* A tensor shape: rank 1 to MK_MAX_RANK, every dimension positive. */
int lmk_check_shape(lua_State *L, int idx, const char *fn, int64_t *shape);

/* A name usable in the script: [A-Za-z_][A-Za-z0-9_]*. */
/* [A-Za-z_][A-Za-z0-9_]*, len bytes with no NUL among them. */
bool lmk_is_identifier(const char *s, size_t len);

/* ---- shapes (lmk.c) -------------------------------------------------------- */

const char *lmk_shape_str(int rank, const int64_t *shape, char *buf, size_t size);
#define LMK_SHAPE_STR(rank, shape) lmk_shape_str((rank), (shape), (char[96]){0}, 96)
bool lmk_same_shape(int ra, const int64_t *a, int rb, const int64_t *b);
void lmk_push_shape(lua_State *L, int rank, const int64_t *shape);

/* ---- metatables and strings (lmk.c) ---------------------------------------- */

/*
 * Sets up the metatable `name` (created once, refilled on every luaopen). With
 * `methods`, a methods table kept in the metatable (field "methods", so
 * init.lua may add to it) becomes __index, behind `index` when given (fields
 * first, the methods table as its upvalue 1). Leaves the metatable on the stack.
 */
void lmk_define_type(lua_State *L, const char *name, const luaL_Reg *meta,
                     const luaL_Reg *methods, lua_CFunction index);

/* Pushes a copy of a C string the core allocated, then frees it with
 * mk_string_free, also when the copy fails (no leak at the longjmp). */
void lmk_push_core_string(lua_State *L, char *s);

/* ---- host tensors (tensor.c) ------------------------------------------------ */

typedef struct {
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    int64_t numel;
    size_t bytes;
    void *data;    /* just after this header, or inside a mapping (user value 1) */
    bool readonly; /* a window into a file mapping */
} lmk_tensor;

lmk_tensor *lmk_to_tensor(lua_State *L, int idx);
lmk_tensor *lmk_check_tensor(lua_State *L, int idx, const char *fn);
/* mk.tensor(nested_table[, dtype]) or mk.tensor(flat_table, dtype, shape) */
int lmk_tensor_new(lua_State *L);
/* Pushes a new zero-filled tensor that owns its bytes. */
lmk_tensor *lmk_push_tensor(lua_State *L, const char *fn, mk_dtype dtype, int rank,
                            const int64_t *shape);
/* Stores the Lua number at idx into every element of t: float32 and int64 (for
 * another dtype, or a fraction into an integer dtype, a dtype error). */
void lmk_fill_tensor(lua_State *L, lmk_tensor *t, int idx, const char *fn);
/* Element count (in *numel_out, may be NULL) and bytes of a shape; a shape
 * error for sizes that overflow. */
size_t lmk_shape_bytes(lua_State *L, const char *fn, mk_dtype dtype, int rank,
                       const int64_t *shape, int64_t *numel_out);

/* ---- context (module.c) ----------------------------------------------------- */

/* The one context of this lua_State, created on first use (never at luaopen). */
mk_context *lmk_context(lua_State *L);
/* Around every call into the core that may call the host functions: begin
 * marks L as the state to call them on and returns what it replaces (a call
 * made from a host function nests in the one that called it); end puts that
 * back and (before raising the core's error) raises the error of a host
 * function that failed, freeing err. */
typedef struct {
    lua_State *outer; /* the state of the call this one nests in, or NULL */
    bool outer_failed;
} lmk_host_scope;
lmk_host_scope lmk_host_begin(lua_State *L);
void lmk_host_end(lua_State *L, lmk_host_scope scope, mk_error *err);

/* ---- the parts of the module: each fills the module table on top ------------ */

void lmk_open_tensor(lua_State *L);
void lmk_open_file(lua_State *L); /* file.c; called by lmk_open_tensor */
void lmk_open_node(lua_State *L);
void lmk_open_model(lua_State *L);
/* model.c: t[k] without metamethods, pushed (its type returned); err raised
 * at the Lua line that made its script line (the sources table at index
 * sources), else as it is. */
int lmk_raw_field(lua_State *L, int t, const char *k);
int lmk_raise_at_source(lua_State *L, int sources, mk_error *err);
/* constants.c: the constants table against the script's declarations. */
void lmk_check_constants(lua_State *L, int script_idx, int consts_idx, int sources_idx);
void lmk_open_onnx(lua_State *L);

#endif
