/*
 * node.c — graph nodes (moonkaas.node) and their builders, made from the
 * core's op table.
 *
 * A node is one statement of a script-to-be: the row of its op in the core's
 * table (mk_op_info), its dtype and shape, its integer arguments, and as user
 * values its name, its tensor (a constant) and its operands. Lowering a DAG of
 * nodes to script text lives in lua/moonkaas/init.lua, which reads nodes
 * through core.node_info.
 *
 * Nothing here names an op. At luaopen every row of the table that is neither
 * internal nor a leaf and has a front-end name (`method`) becomes a node
 * method, or with MK_OP_FUNCTION a module function (mk.embedding), and its
 * `infix` operator a metamethod (__add, __sub, ...). Each is a closure over
 * the row's index around one builder, build_op, that reads the Lua arguments
 * as the row's signature says and checks the result through mk_op_infer, so
 * shape and dtype errors are the core's and are raised when a node is built.
 * The three leaves keep their own Lua forms (mk.input, mk.constant,
 * mk.buffer) and are found by their `leaf` kind.
 *
 * A node keeps the Lua line that built it ("policy.lua:12", the innermost
 * frame outside the module's own files), which lowering passes on so that
 * compile and run errors name it; every builder runs inside with_where, so
 * its own errors start with that line too.
 */
#include "lmk.h"

#include <stdio.h>
#include <string.h>

/* User values of a node: its name, its tensor (a constant), then its operands. */
enum { UV_NAME = 1, UV_TENSOR = 2, UV_OPERANDS = 3 };

/* Bounds of one call: operands ('n', 'r') and integer arguments ('i', 'l'). */
#define MAX_OPERANDS 8
#define MAX_ATTRS 16

typedef struct {
    size_t op; /* the row in mk_op_info */
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    int n_in;
    int n_attr;
    char where[LUA_IDSIZE + 24]; /* "file.lua:12": the Lua line that built it, or "" */
    int64_t attr[]; /* the 'i' and 'l' arguments in signature order; a leaf: its shape */
} lmk_node;

static lmk_node *to_node(lua_State *L, int idx) {
    return (lmk_node *)luaL_testudata(L, idx, LMK_NODE_MT);
}

static lmk_node *check_node(lua_State *L, int idx, const char *fn) {
    lmk_node *n = to_node(L, idx);
    if (!n)
        LMK_ARG_ERROR(L, fn, "argument #%d must be a node, got %s", idx, luaL_typename(L, idx));
    return n;
}

static const mk_op_desc *op_of(const lmk_node *n) { return mk_op_info(n->op); }

/* ==== where a node was built ================================================= */

/* Registry key of the source prefix of the moonkaas module's own Lua files
 * ("@/.../moonkaas/"): their frames are skipped, so a node made inside
 * mk.llama2 names the user's line that asked for it. */
static const char *const MODULE_SOURCE = "moonkaas.module_source";

/* "file.lua:12" of the innermost Lua frame outside the module, or "". */
static void caller_where(lua_State *L, char *buf, size_t size) {
    buf[0] = '\0';
    lua_getfield(L, LUA_REGISTRYINDEX, MODULE_SOURCE);
    size_t skip_len = 0;
    const char *skip = lua_tolstring(L, -1, &skip_len);
    lua_Debug ar;
    for (int level = 1; lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue; /* C, or no line info */
        if (skip && skip_len && !strncmp(ar.source, skip, skip_len)) continue;
        snprintf(buf, size, "%s:%d", ar.short_src, ar.currentline);
        break;
    }
    lua_pop(L, 1);
}

/* core.set_module_source(prefix): the module's own files (init.lua, once). */
static int l_set_module_source(lua_State *L) {
    luaL_checkstring(L, 1);
    lua_settop(L, 1);
    lua_setfield(L, LUA_REGISTRYINDEX, MODULE_SOURCE);
    return 0;
}

/*
 * Every node builder is reached through this (upvalue 1: the builder), so
 * each of its errors (arguments, shapes, dtypes) starts with the user's line:
 * "policy.lua:12: shape error: ...". The builder runs protected; after an
 * error the stack is back at this frame, whose caller is the node's line.
 */
static int with_where(lua_State *L) {
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    if (lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0) == LUA_OK) return lua_gettop(L);
    char where[LUA_IDSIZE + 24];
    caller_where(L, where, sizeof where);
    if (where[0] && lua_type(L, -1) == LUA_TSTRING)
        lua_pushfstring(L, "%s: %s", where, lua_tostring(L, -1));
    return lua_error(L);
}

/* Replaces the function on top by with_where around it. */
static void wrap_where(lua_State *L) { lua_pushcclosure(L, with_where, 1); }

/* The row of a leaf kind; raises when the core's table has none. */
static size_t leaf_row(lua_State *L, mk_leaf_kind kind, const char *fn) {
    for (size_t i = 0, count = mk_op_count(); i < count; i++)
        if (mk_op_info(i)->leaf == kind) return i;
    lmk_raise(L, "internal error", fn, "the core's op table has no leaf of kind %d", (int)kind);
    return 0;
}

/* Pushes a node of row `op` with n_in operand slots; attrs are copied. */
static lmk_node *push_node(lua_State *L, size_t op, mk_dtype dtype, int rank,
                           const int64_t *shape, int n_in, const int64_t *attr, int n_attr) {
    size_t size = sizeof(lmk_node) + sizeof(int64_t) * (size_t)n_attr;
    lmk_node *n = (lmk_node *)lua_newuserdatauv(L, size, UV_OPERANDS - 1 + n_in);
    *n = (lmk_node){.op = op, .dtype = dtype, .rank = rank, .n_in = n_in, .n_attr = n_attr};
    caller_where(L, n->where, sizeof n->where);
    memcpy(n->shape, shape, sizeof(int64_t) * (size_t)rank);
    if (n_attr) memcpy(n->attr, attr, sizeof(int64_t) * (size_t)n_attr);
    luaL_setmetatable(L, LMK_NODE_MT);
    return n;
}

/* A constant leaf over the tensor at idx; `name` may be NULL (named when lowered). */
static void push_constant_node(lua_State *L, int tensor_idx, const char *name, const char *fn) {
    tensor_idx = lua_absindex(L, tensor_idx);
    lmk_tensor *t = lmk_to_tensor(L, tensor_idx);
    size_t row = leaf_row(L, MK_LEAF_CONSTANT, fn);
    push_node(L, row, t->dtype, t->rank, t->shape, 0, t->shape, t->rank);
    lua_pushvalue(L, tensor_idx);
    lua_setiuservalue(L, -2, UV_TENSOR);
    if (name) {
        lua_pushstring(L, name);
        lua_setiuservalue(L, -2, UV_NAME);
    }
}

/* Replaces the value at idx by a constant node over a new `dtype` tensor of
 * `shape` filled with the number at idx. */
static void number_to_constant(lua_State *L, int idx, mk_dtype dtype, int rank,
                               const int64_t *shape, const char *fn) {
    lmk_tensor *t = lmk_push_tensor(L, fn, dtype, rank, shape);
    lmk_fill_tensor(L, t, idx, fn);
    push_constant_node(L, -1, NULL, fn);
    lua_remove(L, -2);
    lua_replace(L, idx);
}

static mk_tensor_info info_of(const lmk_node *n) {
    mk_tensor_info info = {.name = NULL, .dtype = n->dtype, .rank = n->rank, .value = NULL};
    memcpy(info.shape, n->shape, sizeof info.shape);
    return info;
}

/* ==== the generic builder ==================================================== */

/* How a row's closure is reached (its upvalue 2). */
enum { CALL_METHOD, CALL_FUNCTION, CALL_INFIX };

/* One call being read: operands by stack index, integer arguments in order. */
typedef struct {
    const char *fn; /* names the call in errors */
    int n_in;
    int arg[MAX_OPERANDS];      /* stack index; a node once converted */
    bool bound[MAX_OPERANDS];   /* signature letter r: an int64 [1] read at run time */
    bool known[MAX_OPERANDS];   /* a bound given as a Lua integer: its value is checked */
    int64_t value[MAX_OPERANDS];
    int n_attr;
    int64_t attr[MAX_ATTRS];
    int name; /* stack index of an 's' argument, 0 without */
    mk_dtype dtype; /* a 'd' argument (mk_op_infer takes it in out->dtype) */
} op_call;

/* 'l': a table of integers at a, or the integers from a to last. */
static int read_list(lua_State *L, int a, int last, op_call *c) {
    char what[32];
    snprintf(what, sizeof what, "argument #%d", a);
    int room = MAX_ATTRS - c->n_attr < MK_MAX_RANK ? MAX_ATTRS - c->n_attr : MK_MAX_RANK;
    int n;
    if (lua_type(L, a) == LUA_TTABLE) {
        n = lmk_check_int_list(L, a, c->fn, what, c->attr + c->n_attr, room);
        last = a;
    } else {
        n = last - a + 1;
        if (n < 0) n = 0;
        if (n > room)
            lmk_raise(L, "shape error", c->fn, "%d integers (at most %d)", n, room);
        for (int i = 0; i < n; i++) {
            snprintf(what, sizeof what, "argument #%d", a + i);
            c->attr[c->n_attr + i] = lmk_check_int(L, a + i, c->fn, what);
        }
    }
    if (n < 1)
        lmk_raise(L, "shape error", c->fn, "argument #%d is an empty list (1 to %d integers)", a,
                  MK_MAX_RANK);
    c->n_attr += n;
    return last + 1;
}

/*
 * Reads the arguments as `sig` says into c. Nodes stay; tensors become unnamed
 * constants; Lua integers for 'r' become int64 [1] constants whose value is
 * kept for mk_op_infer. Numbers for 'n' are left for convert_numbers.
 */
static void read_arguments(lua_State *L, const mk_op_desc *d, int mode, op_call *c) {
    int top = lua_gettop(L), a = 1;
    const char *sig = d->signature;
    for (const char *s = sig; *s; s++) {
        char what[32];
        snprintf(what, sizeof what, "argument #%d", a);
        switch (*s) {
        case 'n':
        case 'r': {
            if (c->n_in == MAX_OPERANDS)
                lmk_raise(L, "internal error", c->fn, "%s has more than %d operands", d->name,
                          MAX_OPERANDS);
            int k = c->n_in++;
            c->arg[k] = a;
            c->bound[k] = *s == 'r';
            if (to_node(L, a)) {
                /* a node as it is */
            } else if (k == 0 && mode == CALL_METHOD) {
                check_node(L, a, c->fn); /* self */
            } else if (lmk_to_tensor(L, a)) {
                push_constant_node(L, a, NULL, c->fn);
                lua_replace(L, a);
            } else if (*s == 'r' && lua_type(L, a) == LUA_TNUMBER) {
                c->value[k] = lmk_check_int(L, a, c->fn, what);
                c->known[k] = true;
                number_to_constant(L, a, MK_DTYPE_INT64, 1, (int64_t[]){1}, c->fn);
            } else if (*s == 'r') {
                LMK_ARG_ERROR(L, c->fn, "%s must be an int64 [1] node or an integer, got %s",
                              what, luaL_typename(L, a));
            } else if (lua_type(L, a) != LUA_TNUMBER || !(d->flags & MK_OP_BROADCAST)) {
                LMK_ARG_ERROR(L, c->fn, "%s must be a node%s, got %s", what,
                              d->flags & MK_OP_BROADCAST ? ", tensor or number" : " or tensor",
                              luaL_typename(L, a));
            }
            a++;
            break;
        }
        case 'i':
            if (c->n_attr == MAX_ATTRS)
                lmk_raise(L, "internal error", c->fn, "%s has more than %d integer arguments",
                          d->name, MAX_ATTRS);
            c->attr[c->n_attr++] = lmk_check_int(L, a++, c->fn, what);
            break;
        case 'l':
            a = read_list(L, a, top - (int)strlen(s + 1), c);
            break;
        case 's':
            if (lua_type(L, a) != LUA_TSTRING ||
                !lmk_is_identifier(lua_tostring(L, a), lua_rawlen(L, a)))
                LMK_ARG_ERROR(L, c->fn, "%s must be a name ([A-Za-z_][A-Za-z0-9_]*), got %s",
                              what, lua_type(L, a) == LUA_TSTRING ? lua_tostring(L, a)
                                                                  : luaL_typename(L, a));
            c->name = a++;
            break;
        case 'd':
            c->dtype = lmk_check_dtype(L, a++, c->fn, false);
            break;
        default:
            lmk_raise(L, "internal error", c->fn, "%s: unknown signature letter '%c'", d->name,
                      *s);
        }
    }
    if (top >= a)
        LMK_ARG_ERROR(L, c->fn, "takes %d argument%s, got %d", a - 1, a == 2 ? "" : "s", top);
}

/*
 * Numbers given for 'n' operands (rows with MK_OP_BROADCAST only) become
 * constants of the other operand's dtype: [1, ..., 1] of its rank, so they
 * broadcast on either side (1 - x, 2 / x). Where the op commutes the number
 * goes second (2 + x is built as x + 2): the form cuDNN's fusion takes.
 */
static void convert_numbers(lua_State *L, const mk_op_desc *d, op_call *c) {
    const lmk_node *other = NULL; /* the first node operand, one not bool where there is one
                                     (where(c, 1, x): 1 is x's dtype, not c's) */
    for (int k = 0; k < c->n_in; k++) {
        const lmk_node *x = c->bound[k] ? NULL : to_node(L, c->arg[k]);
        if (x && (!other || (other->dtype == MK_DTYPE_BOOL && x->dtype != MK_DTYPE_BOOL)))
            other = x;
    }
    for (int k = 0; k < c->n_in; k++) {
        int a = c->arg[k];
        if (c->bound[k] || to_node(L, a)) continue;
        if (!other)
            LMK_ARG_ERROR(L, c->fn, "needs a node operand, got %s and %s",
                          luaL_typename(L, c->arg[0]),
                          luaL_typename(L, c->arg[c->n_in > 1 ? 1 : 0]));
        int64_t ones[MK_MAX_RANK];
        for (int i = 0; i < MK_MAX_RANK; i++) ones[i] = 1;
        number_to_constant(L, a, other->dtype, other->rank, ones, c->fn);
        if (k == 0 && c->n_in == 2 && (d->flags & MK_OP_COMMUTES))
            c->arg[0] = c->arg[1], c->arg[1] = a;
    }
}

/* The operands' types for mk_op_infer, in order; a known bound with its value;
 * a named leaf's name, for messages (the node's user value keeps it alive). */
static void operand_infos(lua_State *L, const op_call *c, mk_tensor_info *in) {
    for (int k = 0; k < c->n_in; k++) {
        in[k] = info_of(to_node(L, c->arg[k]));
        if (c->known[k]) in[k].value = &c->value[k];
        if (lua_getiuservalue(L, c->arg[k], UV_NAME) == LUA_TSTRING) in[k].name = lua_tostring(L, -1);
        lua_pop(L, 1);
    }
}

/* A closure per row: upvalue 1 the row, upvalue 2 how it is called. */
static int build_op(lua_State *L) {
    size_t row = (size_t)lua_tointeger(L, lua_upvalueindex(1));
    int mode = (int)lua_tointeger(L, lua_upvalueindex(2));
    const mk_op_desc *d = mk_op_info(row);
    char fn[96];
    if (mode == CALL_INFIX) snprintf(fn, sizeof fn, "%s (%s)", d->name, d->infix);
    else snprintf(fn, sizeof fn, "%s", d->method);
    op_call c = {.fn = fn};
    read_arguments(L, d, mode, &c);
    convert_numbers(L, d, &c);

    /* Between a failed call and its raise nothing touches the Lua API, so
     * the error cannot leak. */
    mk_tensor_info in[MAX_OPERANDS], out = {.dtype = c.dtype};
    operand_infos(L, &c, in);
    mk_error *err = NULL;
    if (mk_op_infer(d->name, in, (size_t)c.n_in, c.attr, (size_t)c.n_attr, &out, &err) != 0)
        return lmk_raise_core(L, err);
    push_node(L, row, out.dtype, out.rank, out.shape, c.n_in, c.attr, c.n_attr);
    for (int k = 0; k < c.n_in; k++) {
        lua_pushvalue(L, c.arg[k]);
        lua_setiuservalue(L, -2, UV_OPERANDS + k);
    }
    if (c.name) {
        lua_pushvalue(L, c.name);
        lua_setiuservalue(L, -2, UV_NAME);
    }
    return 1;
}

/* ==== the leaves ============================================================== */

static void check_name(lua_State *L, int idx, const char *fn) {
    if (lua_type(L, idx) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "the name must be a string, got %s", luaL_typename(L, idx));
    const char *name = lua_tostring(L, idx);
    if (!lmk_is_identifier(name, lua_rawlen(L, idx)))
        LMK_ARG_ERROR(L, fn, "name '%s%s' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", name,
                      strlen(name) != lua_rawlen(L, idx) ? "\\0..." : "");
}

/* mk.input(name, dtype, shape) or mk.input(name, shape) (float32) */
static int l_input(lua_State *L) {
    const char *fn = "input";
    int64_t shape[MK_MAX_RANK];
    check_name(L, 1, fn);
    if (lua_type(L, 2) == LUA_TTABLE) { /* mk.input(name, shape): float32 */
        lua_settop(L, 2);
        lua_pushnil(L);
        lua_insert(L, 2);
    }
    mk_dtype dtype = lmk_check_dtype(L, 2, fn, true);
    int rank = lmk_check_shape(L, 3, fn, shape);
    push_node(L, leaf_row(L, MK_LEAF_INPUT, fn), dtype, rank, shape, 0, shape, rank);
    lua_pushvalue(L, 1);
    lua_setiuservalue(L, -2, UV_NAME);
    return 1;
}

/* mk.constant(tensor[, name]); a nested table of numbers is made a tensor first */
static int l_constant(lua_State *L) {
    const char *fn = "constant";
    lua_settop(L, 2);
    if (lua_type(L, 1) == LUA_TTABLE) {
        lua_pushcfunction(L, lmk_tensor_new);
        lua_pushvalue(L, 1);
        lua_call(L, 1, 1);
        lua_replace(L, 1);
    }
    lmk_check_tensor(L, 1, fn);
    if (!lua_isnil(L, 2)) check_name(L, 2, fn);
    push_constant_node(L, 1, lua_tostring(L, 2), fn);
    return 1;
}

/* mk.buffer(dtype, shape[, name]): persistent state, zero after compile; a
 * named one may be shared with another model (compile's `share`). */
static int l_buffer(lua_State *L) {
    const char *fn = "buffer";
    int64_t shape[MK_MAX_RANK];
    lua_settop(L, 3);
    mk_dtype dtype = lmk_check_dtype(L, 1, fn, false);
    int rank = lmk_check_shape(L, 2, fn, shape);
    if (!lua_isnil(L, 3)) check_name(L, 3, fn);
    push_node(L, leaf_row(L, MK_LEAF_BUFFER, fn), dtype, rank, shape, 0, shape, rank);
    lua_pushvalue(L, 3);
    lua_setiuservalue(L, -2, UV_NAME);
    return 1;
}

/* Indexed by mk_leaf_kind. */
static const lua_CFunction leaf_builders[] = {
    [MK_LEAF_INPUT] = l_input, [MK_LEAF_CONSTANT] = l_constant, [MK_LEAF_BUFFER] = l_buffer};

/* ==== fields and introspection =============================================== */

static int node_tostring(lua_State *L) {
    lmk_node *n = check_node(L, 1, "tostring");
    lua_getiuservalue(L, 1, UV_NAME);
    const char *name = lua_tostring(L, -1);
    lua_pushfstring(L, "node %s%s%s %s %s", op_of(n)->name, name ? " " : "", name ? name : "",
                    mk_dtype_name(n->dtype), LMK_SHAPE_STR(n->rank, n->shape));
    return 1;
}

/* Fields (shape, dtype, op, name, rank, where), then methods (upvalue 1). */
static int node_index(lua_State *L) {
    lmk_node *n = check_node(L, 1, "index");
    const char *k = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : NULL;
    if (k) {
        if (!strcmp(k, "shape")) return lmk_push_shape(L, n->rank, n->shape), 1;
        if (!strcmp(k, "dtype")) return lua_pushstring(L, mk_dtype_name(n->dtype)), 1;
        if (!strcmp(k, "op")) return lua_pushstring(L, op_of(n)->name), 1;
        if (!strcmp(k, "rank")) return lua_pushinteger(L, n->rank), 1;
        if (!strcmp(k, "name")) return lua_getiuservalue(L, 1, UV_NAME), 1;
        if (!strcmp(k, "where")) {
            if (n->where[0]) lua_pushstring(L, n->where);
            else lua_pushnil(L);
            return 1;
        }
    }
    lua_pushvalue(L, 2);
    lua_gettable(L, lua_upvalueindex(1));
    return 1;
}

static void set_string(lua_State *L, const char *key, const char *value) {
    if (!value) return;
    lua_pushstring(L, value);
    lua_setfield(L, -2, key);
}

/*
 * core.node_info(node) -> {op =, signature =, leaf =, dtype =, shape =,
 * inputs = {...}, attrs = {...}, name =, tensor =, where =}: what the
 * lowering in init.lua prints, one argument per signature letter; `where`
 * ("file.lua:12", nil when unknown) is the Lua line that built the node. `leaf` is "input",
 * "constant", "buffer" or nil; a leaf's attrs are its shape.
 */
static int l_node_info(lua_State *L) {
    lmk_node *n = check_node(L, 1, "node_info");
    const mk_op_desc *d = op_of(n);
    lua_createtable(L, 0, 9);
    set_string(L, "op", d->name);
    set_string(L, "signature", d->signature);
    set_string(L, "leaf", mk_leaf_kind_name(d->leaf));
    set_string(L, "dtype", mk_dtype_name(n->dtype));
    lmk_push_shape(L, n->rank, n->shape);
    lua_setfield(L, -2, "shape");
    lua_createtable(L, n->n_in, 0);
    for (int i = 0; i < n->n_in; i++) {
        lua_getiuservalue(L, 1, UV_OPERANDS + i);
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "inputs");
    lmk_push_shape(L, n->n_attr, n->attr);
    lua_setfield(L, -2, "attrs");
    lua_getiuservalue(L, 1, UV_NAME);
    lua_setfield(L, -2, "name");
    lua_getiuservalue(L, 1, UV_TENSOR);
    lua_setfield(L, -2, "tensor");
    set_string(L, "where", n->where[0] ? n->where : NULL);
    return 1;
}

static int l_is_node(lua_State *L) {
    lua_pushboolean(L, to_node(L, 1) != NULL);
    return 1;
}


/*
 * mk.ops() -> {{name =, alias =, signature =, role =, leaf =, method =,
 * infix =, expr =, summary =, broadcast =, commutes =, internal =,
 * as_function =}, ...}: the core's op table, one entry per row.
 */
static int l_ops(lua_State *L) {
    size_t count = mk_op_count();
    lua_createtable(L, (int)count, 0);
    for (size_t i = 0; i < count; i++) {
        const mk_op_desc *d = mk_op_info(i);
        lua_createtable(L, 0, 13);
        set_string(L, "name", d->name);
        set_string(L, "alias", d->alias);
        set_string(L, "signature", d->signature);
        set_string(L, "role", mk_op_role_name(d->role));
        set_string(L, "leaf", mk_leaf_kind_name(d->leaf));
        set_string(L, "method", d->method);
        set_string(L, "infix", d->infix);
        set_string(L, "expr", d->expr);
        set_string(L, "summary", d->summary);
        lua_pushboolean(L, (d->flags & MK_OP_BROADCAST) != 0);
        lua_setfield(L, -2, "broadcast");
        lua_pushboolean(L, (d->flags & MK_OP_COMMUTES) != 0);
        lua_setfield(L, -2, "commutes");
        lua_pushboolean(L, (d->flags & MK_OP_INTERNAL) != 0);
        lua_setfield(L, -2, "internal");
        lua_pushboolean(L, (d->flags & MK_OP_FUNCTION) != 0);
        lua_setfield(L, -2, "as_function");
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* ==== registration ============================================================ */

/* Lua's metamethod for an operator spelled `infix` on an op of n_in operands. */
static const char *infix_event(const char *infix, int n_in) {
    static const struct {
        const char *op;
        int n_in;
        const char *event;
    } events[] = {
        {"+", 2, "__add"},   {"-", 2, "__sub"},   {"*", 2, "__mul"},  {"/", 2, "__div"},
        {"%", 2, "__mod"},   {"^", 2, "__pow"},   {"//", 2, "__idiv"}, {"&", 2, "__band"},
        {"|", 2, "__bor"},   {"~", 2, "__bxor"},  {"<<", 2, "__shl"}, {">>", 2, "__shr"},
        {"-", 1, "__unm"},   {"~", 1, "__bnot"},
    };
    for (size_t i = 0; i < sizeof events / sizeof events[0]; i++)
        if (events[i].n_in == n_in && !strcmp(events[i].op, infix)) return events[i].event;
    return NULL;
}

static int count_operands(const char *sig) {
    int k = 0;
    for (; *sig; sig++) k += *sig == 'n' || *sig == 'r';
    return k;
}

/* A closure of build_op over row i, called as `mode`. */
static void push_builder(lua_State *L, size_t i, int mode) {
    lua_pushinteger(L, (lua_Integer)i);
    lua_pushinteger(L, mode);
    lua_pushcclosure(L, build_op, 2);
}

/* Unary infix metamethods get their operand twice from Lua: keep the first. */
static int build_unary_infix(lua_State *L) {
    lua_settop(L, 1);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, 1, 1);
    return 1;
}

/* The node metatable and methods, and the module's node functions (the module
 * table on top). */
void lmk_open_node(lua_State *L) {
    int module = lua_gettop(L);
    static const luaL_Reg meta[] = {{"__tostring", node_tostring}, {NULL, NULL}};
    static const luaL_Reg no_methods[] = {{NULL, NULL}};
    lmk_define_type(L, LMK_NODE_MT, meta, no_methods, node_index);
    int mt = lua_gettop(L);
    lua_getfield(L, mt, "methods");
    int methods = lua_gettop(L);

    for (size_t i = 0, count = mk_op_count(); i < count; i++) {
        const mk_op_desc *d = mk_op_info(i);
        if (d->flags & MK_OP_INTERNAL) continue;
        if (d->leaf != MK_LEAF_NONE) {
            if (d->method && mk_leaf_kind_name(d->leaf)) {
                lua_pushcfunction(L, leaf_builders[d->leaf]);
                wrap_where(L);
                lua_setfield(L, module, d->method);
            }
            continue;
        }
        if (d->method) {
            /* a method's receiver is its first operand */
            bool function = (d->flags & MK_OP_FUNCTION) || d->signature[0] != 'n';
            push_builder(L, i, function ? CALL_FUNCTION : CALL_METHOD);
            wrap_where(L);
            lua_setfield(L, function ? module : methods, d->method);
        }
        const char *event = d->infix ? infix_event(d->infix, count_operands(d->signature)) : NULL;
        if (event) {
            push_builder(L, i, CALL_INFIX);
            if (count_operands(d->signature) == 1) lua_pushcclosure(L, build_unary_infix, 1);
            wrap_where(L);
            lua_setfield(L, mt, event);
        }
    }
    lua_setfield(L, module, "node_methods");
    lua_pop(L, 1);

    static const luaL_Reg functions[] = {
        {"node_info", l_node_info},
        {"is_node", l_is_node},
        {"ops", l_ops},
        {"set_module_source", l_set_module_source},
        {NULL, NULL}};
    luaL_setfuncs(L, functions, 0);
}
