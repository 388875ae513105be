/*
 * model.c — compiling scripts and running models.
 *
 *   model (moonkaas.model) a compiled mk_model; on the CPU its constants are
 *         borrowed in place, so the model keeps their tensors alive (user
 *         value 1). Born closed; __gc, __close and model:close() are one
 *         idempotent release.
 *
 * core.compile_script(text, constants, opts) checks the constants against the
 * script's constant declarations (mk_script_constants) before the core
 * reads their bytes, and model:run checks inputs against mk_model_input_info.
 */
#include "lmk.h"

#include <limits.h>

#include <stdio.h>
#include <string.h>

typedef struct {
    mk_model *model; /* NULL while closed */
    mk_device device;
    int calls;       /* runs of this model in the core: its host functions may not close it */
    const void *not_constant[MK_MAX_OUTPUTS]; /* output o's tensor last found not to be a
                                                 borrowed constant (those are anchored by
                                                 the model: no other tensor takes their
                                                 place), so a host's reused tensor is
                                                 looked for once */
} lmk_model;

static lmk_model *check_model(lua_State *L, int idx, const char *fn, bool open) {
    lmk_model *m = (lmk_model *)luaL_testudata(L, idx, LMK_MODEL_MT);
    if (!m)
        LMK_ARG_ERROR(L, fn, "argument #%d must be a model, got %s", idx, luaL_typename(L, idx));
    if (open && !m->model) LMK_ARG_ERROR(L, fn, "the model is closed");
    return m;
}

/* __gc and __close: one idempotent release. (A run holds its model on the stack:
 * __gc never comes during one.) */
static int model_release(lua_State *L) {
    lmk_model *m = check_model(L, 1, "close", false);
    if (m->calls)
        return lmk_raise(L, "busy", "close", "the model is running: a host function of its "
                         "own run may not close it (close it after the run returns)");
    if (m->model) mk_model_free(m->model);
    m->model = NULL;
    lua_pushnil(L);
    lua_setiuservalue(L, 1, 1); /* the borrowed constants may go */
    return 0;
}

static const char *device_name(mk_device d) { return d == MK_DEVICE_CUDA ? "cuda" : "cpu"; }

/* t[k] without metamethods, pushed: what the binding hands the core must be
 * held by the table itself, never made up by an __index function. */
int lmk_raw_field(lua_State *L, int t, const char *k) {
    t = lua_absindex(L, t);
    lua_pushstring(L, k);
    return lua_rawget(L, t);
}

/*
 * The model, open still. Read again after anything that may allocate: a
 * collection step there may run a finalizer that closes the model, so no
 * pointer into it (a name, the model itself) is kept across an allocation.
 */
static mk_model *open_model(lua_State *L, lmk_model *m, const char *fn) {
    if (!m->model) LMK_ARG_ERROR(L, fn, "the model is closed");
    return m->model;
}

/* ==== compiling =============================================================== */

/*
 * Raises err, a core error about the model whose sources table ({[line] =
 * "file.lua:12"}, or nil) is at idx. A message about a script line that a
 * Lua line built names that line first: "file.lua:12: shape error: ...
 * (script:7:1)"; any other is raised as it is.
 */
int lmk_raise_at_source(lua_State *L, int sources, mk_error *err) {
    int line = mk_error_line(err);
    if (line <= 0 || lua_type(L, sources) != LUA_TTABLE ||
        lua_rawgeti(L, sources, line) != LUA_TSTRING)
        return lmk_raise_core(L, err);
    char msg[1400], at[48];
    snprintf(at, sizeof at, "script:%d:%d: ", line, mk_error_column(err));
    const char *text = mk_error_message(err);
    size_t skip = strncmp(text, at, strlen(at)) ? 0 : strlen(at);
    at[strlen(at) - 2] = '\0'; /* "script:L:C" */
    snprintf(msg, sizeof msg, "%s: %s (%s)", lua_tostring(L, -1), text + skip, at);
    mk_error_free(err);
    lua_pushstring(L, msg);
    return lua_error(L);
}

/* User values of a model: the constants it borrows, the sources of its lines. */
enum { UV_CONSTANTS = 1, UV_SOURCES = 2 };

/* Reads compile options from the table at idx; a `share` model goes to stack
 * slot share_slot (its pointer is read just before the compile: see there). */
static mk_compile_options check_options(lua_State *L, int idx, int share_slot) {
    const char *fn = "compile";
    mk_compile_options o = {.device = MK_DEVICE_CPU};
    if (lua_isnoneornil(L, idx)) return o;
    if (lua_type(L, idx) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "options must be a table, got %s", luaL_typename(L, idx));
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
        if (k && !strcmp(k, "device")) {
            const char *d = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : NULL;
            if (d && !strcmp(d, "cpu")) o.device = MK_DEVICE_CPU;
            else if (d && !strcmp(d, "cuda")) o.device = MK_DEVICE_CUDA;
            else LMK_ARG_ERROR(L, fn, "device must be \"cpu\" or \"cuda\", got %s",
                               d ? d : luaL_typename(L, -1));
        } else if (k && (!strcmp(k, "cudnn") || !strcmp(k, "passes") || !strcmp(k, "fuse") ||
                         !strcmp(k, "kernel_cache"))) {
            if (!lua_isboolean(L, -1))
                LMK_ARG_ERROR(L, fn, "option %s must be a boolean, got %s", k,
                              luaL_typename(L, -1));
            bool on = lua_toboolean(L, -1);
            if (k[0] == 'c') o.use_cudnn = on;
            else if (k[0] == 'p') o.no_passes = !on;
            else if (k[0] == 'k') o.no_kernel_cache = !on;
            else o.no_fusion = !on;
        } else if (k && !strcmp(k, "tf32")) {
            if (!lua_isboolean(L, -1))
                LMK_ARG_ERROR(L, fn, "option tf32 must be a boolean, got %s", luaL_typename(L, -1));
            o.allow_tf32 = lua_toboolean(L, -1);
        } else if (k && !strcmp(k, "max_bytes")) {
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0)
                LMK_ARG_ERROR(L, fn, "max_bytes must be a non-negative integer, got %s",
                              luaL_tolstring(L, -1, NULL));
            o.max_bytes = (size_t)lua_tointeger(L, -1);
        } else if (k && !strcmp(k, "threads")) {
            if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 0 ||
                lua_tointeger(L, -1) > INT_MAX)
                LMK_ARG_ERROR(L, fn, "threads must be 0 (the default) or a positive integer, "
                              "got %s", luaL_tolstring(L, -1, NULL));
            o.threads = (int)lua_tointeger(L, -1);
        } else if (k && !strcmp(k, "share")) {
            lmk_model *other = (lmk_model *)luaL_testudata(L, -1, LMK_MODEL_MT);
            if (!other)
                LMK_ARG_ERROR(L, fn, "share must be a model, got %s", luaL_typename(L, -1));
            if (!other->model) LMK_ARG_ERROR(L, fn, "share: the model is closed");
            lua_pushvalue(L, -1);
            lua_replace(L, share_slot);
        } else {
            LMK_ARG_ERROR(L, fn, "unknown option %s (device, cudnn, fuse, passes, kernel_cache, "
                              "max_bytes, share, threads, tf32)",
                          k ? k : luaL_typename(L, -2));
        }
        lua_pop(L, 1);
    }
    return o;
}

/*
 * core.compile_script(text, constants, opts[, sources]) -> model. constants
 * maps the name of each constant the script declares to a tensor (its data is
 * handed over, not copied in Lua). sources ({[line] = "file.lua:12"}, from
 * mk.lower) names the Lua line that built each line of the script, for the
 * model's errors.
 */
static int l_compile_script(lua_State *L) {
    const char *fn = "compile";
    lua_settop(L, 4);
    if (!lua_isnil(L, 4) && lua_type(L, 4) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "sources must be a table {[line] = \"file:line\"}, got %s",
                      luaL_typename(L, 4));
    lua_pushnil(L); /* 5: the share model, held for the call */
    if (lua_type(L, 1) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "the script must be a string, got %s", luaL_typename(L, 1));
    if (!lua_isnil(L, 2) && lua_type(L, 2) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "constants must be a table {name = tensor}, got %s",
                      luaL_typename(L, 2));
    mk_compile_options opts = check_options(L, 3, 5);
    size_t len;
    const char *text = lua_tolstring(L, 1, &len);
    mk_error *nul = NULL;
    if (mk_script_check_bytes(text, len, &nul)) lmk_raise_at_source(L, 4, nul);

    /* A private copy of the constants, checked: the CPU model borrows their
     * memory, and the caller's table may change under the checks' allocations
     * (a finalizer) or the compile's host functions. */
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
    lmk_check_constants(L, 1, keep, 4);
    /* The name/data array lives in a userdata, so an error cannot leak it. */
    mk_named_tensor *named =
        (mk_named_tensor *)lua_newuserdatauv(L, (n ? n : 1) * sizeof *named, 0);
    size_t i = 0;
    lua_pushnil(L);
    while (lua_next(L, keep)) {
        named[i].name = lua_tostring(L, -2); /* anchored by `keep`; checked a string */
        named[i].data = lmk_to_tensor(L, -1)->data; /* checked a tensor */
        i++;
        lua_pop(L, 1);
    }
    opts.borrow_constants = opts.device == MK_DEVICE_CPU;

    mk_context *ctx = lmk_context(L);
    lmk_model *m = (lmk_model *)lua_newuserdatauv(L, sizeof *m, 2);
    *m = (lmk_model){.model = NULL, .device = opts.device};
    luaL_setmetatable(L, LMK_MODEL_MT);
    if (!lua_isnil(L, 5)) { /* the core takes a reference: held until the compile returns */
        lmk_model *other = (lmk_model *)lua_touserdata(L, 5);
        if (!other->model) LMK_ARG_ERROR(L, fn, "share: the model is closed");
        opts.share = other->model;
    }
    mk_error *err = NULL;
    lmk_host_scope scope = lmk_host_begin(L);
    m->model = mk_compile(ctx, lua_tostring(L, 1), named, n, &opts, &err);
    lmk_host_end(L, scope, err);
    if (!m->model) lmk_raise_at_source(L, 4, err);
    if (opts.borrow_constants) {
        lua_pushvalue(L, keep);
        lua_setiuservalue(L, -2, UV_CONSTANTS);
    }
    lua_pushvalue(L, 4);
    lua_setiuservalue(L, -2, UV_SOURCES);
    return 1;
}

/* ==== running ================================================================== */

static void push_info(lua_State *L, const mk_tensor_info *info) {
    /* the name first: it lives in the model, which a finalizer may close in a
     * collection step of what follows (see open_model) */
    if (info->name) lua_pushstring(L, info->name);
    else lua_pushnil(L);
    lua_createtable(L, 0, 3);
    lua_insert(L, -2);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, mk_dtype_name(info->dtype));
    lua_setfield(L, -2, "dtype");
    lmk_push_shape(L, info->rank, info->shape);
    lua_setfield(L, -2, "shape");
}

/* Raises "input error: fn: unknown input 'k' (the model takes a, b)", the list
 * written in C first (the names live in the model). */
static int raise_unknown_input(lua_State *L, const char *fn, const char *k,
                               const mk_named_tensor *named, size_t count) {
    char names[1024] = "";
    size_t at = 0;
    for (size_t i = 0; i < count && at < sizeof names; i++)
        at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", i ? ", " : "",
                               named[i].name);
    return lmk_raise(L, "input error", fn, "unknown input '%s' (the model takes %s)", k,
                     count ? names : "no inputs");
}

/*
 * The inputs table at idx, checked against the model (names, dtypes, shapes),
 * as an array of mk_named_tensor: `few` (the caller's, LMK_FEW_INPUTS long)
 * where it fits, else a userdata pushed on the stack (a host running a small
 * model every frame makes no garbage). Each tensor is read raw from the table
 * and left on the stack: the call holds it, whatever a host function does to
 * the table meanwhile. Returns the array; *count: its length.
 */
#define LMK_FEW_INPUTS 8
static mk_named_tensor *check_inputs(lua_State *L, lmk_model *m, int idx, const char *fn,
                                     mk_named_tensor *few, size_t *count_out) {
    if (lua_isnil(L, idx)) { /* a model without inputs may be run as model:run() */
        lua_newtable(L);
        lua_replace(L, idx);
    }
    if (lua_type(L, idx) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "inputs must be a table {name = tensor}, got %s",
                      luaL_typename(L, idx));
    size_t count = mk_model_input_count(m->model);
    if (!lua_checkstack(L, (int)count + LUA_MINSTACK))
        lmk_raise(L, "out of memory", fn, "no stack room for %zu inputs", count);
    mk_named_tensor *named = count <= LMK_FEW_INPUTS ? few
        : (mk_named_tensor *)lua_newuserdatauv(L, count * sizeof *named, 0);
    for (size_t i = 0; i < count; i++) {
        mk_tensor_info info;
        if (mk_model_input_info(open_model(L, m, fn), i, &info) != 0)
            lmk_raise(L, "internal error", fn, "no information on input %zu", i + 1);
        lua_pushstring(L, info.name); /* may collect */
        mk_model_input_info(open_model(L, m, fn), i, &info);
        lua_rawget(L, idx);
        lmk_tensor *t = lmk_to_tensor(L, -1);
        if (lua_isnil(L, -1))
            lmk_raise(L, "input error", fn, "missing input '%s' (%s %s)", info.name,
                      mk_dtype_name(info.dtype), LMK_SHAPE_STR(info.rank, info.shape));
        if (!t)
            lmk_raise(L, "input error", fn, "input '%s' must be a tensor, got %s", info.name,
                      luaL_typename(L, -1));
        if (t->dtype != info.dtype)
            lmk_raise(L, "input error", fn, "input '%s' is %s, the model takes %s %s", info.name,
                      mk_dtype_name(t->dtype), mk_dtype_name(info.dtype),
                      LMK_SHAPE_STR(info.rank, info.shape));
        if (!lmk_same_shape(t->rank, t->shape, info.rank, info.shape))
            lmk_raise(L, "input error", fn, "input '%s' has shape %s, the model takes %s",
                      info.name, LMK_SHAPE_STR(t->rank, t->shape),
                      LMK_SHAPE_STR(info.rank, info.shape));
        named[i] = (mk_named_tensor){info.name, t->data}; /* t stays on the stack */
    }
    /* Every input was found by name above: the table holds no other key exactly
     * when it has `count` of them (linear; the search for the odd one is the
     * error path only). */
    size_t keys = 0;
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        lua_pop(L, 1);
        keys++;
    }
    lua_pushnil(L);
    while (keys != count && lua_next(L, idx)) {
        lua_pop(L, 1);
        if (lua_type(L, -1) != LUA_TSTRING)
            lmk_raise(L, "input error", fn, "input names must be strings, got %s",
                      luaL_typename(L, -1));
        const char *k = lua_tostring(L, -1);
        bool whole = strlen(k) == lua_rawlen(L, -1); /* a NUL inside names no input */
        bool found = false;
        for (size_t i = 0; i < count && whole && !found; i++) found = !strcmp(named[i].name, k);
        if (!found) raise_unknown_input(L, fn, k, named, count);
    }
    *count_out = count;
    return named;
}

/*
 * Output o as a tensor: the one at idx (0: none; checked: writable, not a
 * borrowed constant, of the output's shape, or with `steps` ahead of it where
 * steps > 0: run_steps), or a new one; pushed.
 */
static lmk_tensor *push_output(lua_State *L, lmk_model *m, size_t o, int idx, int64_t steps,
                               const char *fn) {
    mk_tensor_info info;
    if (mk_model_output_info_at(open_model(L, m, fn), o, &info) != 0)
        lmk_raise(L, "internal error", fn, "no information on output %zu", o + 1);
    int rank = info.rank;
    int64_t shape[MK_MAX_RANK];
    if (steps > 0) {
        if (rank == MK_MAX_RANK)
            LMK_ARG_ERROR(L, fn, "output %zu has rank %d: its steps would need rank %d",
                          o + 1, rank, rank + 1);
        shape[0] = steps;
        memcpy(shape + 1, info.shape, (size_t)rank * sizeof *shape);
        rank++;
    } else {
        memcpy(shape, info.shape, (size_t)rank * sizeof *shape);
    }
    if (idx == 0 || lua_isnoneornil(L, idx))
        return lmk_push_tensor(L, fn, info.dtype, rank, shape);
    lmk_tensor *out = lmk_check_tensor(L, idx, fn);
    if (out->readonly) LMK_ARG_ERROR(L, fn, "output tensor %zu is read-only", o + 1);
    if (m->not_constant[o] != out) {
        if (lua_getiuservalue(L, 1, 1) == LUA_TTABLE) { /* the constants a CPU model borrows */
            lua_pushnil(L);
            while (lua_next(L, -2)) {
                if (lua_rawequal(L, -1, idx))
                    LMK_ARG_ERROR(L, fn, "output tensor %zu is the model's constant '%s' (its "
                                  "weights would be overwritten)", o + 1, lua_tostring(L, -2));
                lua_pop(L, 1);
            }
        }
        lua_pop(L, 1);
        m->not_constant[o] = out;
    }
    if (out->dtype != info.dtype || !lmk_same_shape(out->rank, out->shape, rank, shape))
        LMK_ARG_ERROR(L, fn, "output tensor %zu is %s %s, the model gives %s %s", o + 1,
                      mk_dtype_name(out->dtype), LMK_SHAPE_STR(out->rank, out->shape),
                      mk_dtype_name(info.dtype), LMK_SHAPE_STR(rank, shape));
    lua_pushvalue(L, idx);
    return out;
}

/*
 * model:run({name = tensor, ...}[, out1, out2, ...]) -> the outputs, new
 * tensors or the ones given (filled). Names, dtypes and shapes are checked
 * against the model first.
 */
static int model_run(lua_State *L) {
    const char *fn = "run";
    lmk_model *m = check_model(L, 1, fn, true);
    int n_out = (int)mk_model_output_count(m->model);
    if (lua_gettop(L) > 2 + n_out)
        LMK_ARG_ERROR(L, fn, "the model has %d output%s, %d output tensors were given", n_out,
                      n_out == 1 ? "" : "s", lua_gettop(L) - 2);
    lua_settop(L, 2 + n_out);
    size_t count;
    mk_named_tensor few[LMK_FEW_INPUTS];
    mk_named_tensor *named = check_inputs(L, m, 2, fn, few, &count);
    mk_buffer outs[MK_MAX_OUTPUTS];
    for (int o = 0; o < n_out; o++) {
        lmk_tensor *t = push_output(L, m, (size_t)o, 3 + o, 0, fn);
        outs[o] = (mk_buffer){t->data, t->bytes};
    }
    mk_model *model = open_model(L, m, fn);
    mk_error *err = NULL;
    lmk_host_scope scope = lmk_host_begin(L);
    m->calls++;
    int rc = mk_evaluate_outputs(model, named, count, outs, (size_t)n_out, &err);
    m->calls--;
    lmk_host_end(L, scope, rc ? err : NULL);
    if (rc != 0) {
        lua_getiuservalue(L, 1, UV_SOURCES);
        lmk_raise_at_source(L, lua_gettop(L), err);
    }
    return n_out;
}

/*
 * model:run_steps(n, {name = tensor, ...}[, outs][, opts]) -> outs, steps.
 * Runs up to n steps of the model's recurrence (its script's next lines) in
 * one call: outs is a list of tensors, output o's steps stacked ahead of its
 * shape ([n, ...]; given, or new), steps the number run (fewer than n where
 * opts.stop = {output = o, value = v} ended them: the first step whose int64
 * output o equals v is the last).
 */
static int model_run_steps(lua_State *L) {
    const char *fn = "run_steps";
    lmk_model *m = check_model(L, 1, fn, true);
    lua_settop(L, 5);
    lua_Integer n = lmk_check_int(L, 2, fn, "n");
    if (n < 1) LMK_ARG_ERROR(L, fn, "n must be at least 1, got %lld", (long long)n);
    int n_out = (int)mk_model_output_count(m->model);
    size_t count;
    mk_named_tensor few[LMK_FEW_INPUTS];
    mk_named_tensor *named = check_inputs(L, m, 3, fn, few, &count);
    if (!lua_isnil(L, 4) && lua_type(L, 4) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "outs must be a list of tensors, got %s", luaL_typename(L, 4));
    if (!lua_isnil(L, 4) && lua_rawlen(L, 4) > (size_t)n_out)
        LMK_ARG_ERROR(L, fn, "the model has %d output%s, outs lists %zu tensors", n_out,
                      n_out == 1 ? "" : "s", (size_t)lua_rawlen(L, 4));
    mk_stop stop = {0};
    if (!lua_isnil(L, 5)) {
        if (!lua_istable(L, 5))
            LMK_ARG_ERROR(L, fn, "opts must be a table, got %s", luaL_typename(L, 5));
        if (lmk_raw_field(L, 5, "stop") != LUA_TNIL) {
            if (!lua_istable(L, -1))
                LMK_ARG_ERROR(L, fn, "opts.stop must be {output = i, value = v}, got %s",
                              luaL_typename(L, -1));
            lmk_raw_field(L, -1, "output");
            lmk_raw_field(L, -2, "value");
            if (!lua_isinteger(L, -2) || !lua_isinteger(L, -1))
                LMK_ARG_ERROR(L, fn, "opts.stop needs integers output and value");
            lua_Integer o = lua_tointeger(L, -2);
            if (o < 1 || o > n_out)
                LMK_ARG_ERROR(L, fn, "opts.stop.output is %lld; the model has %d output%s",
                              (long long)o, n_out, n_out == 1 ? "" : "s");
            mk_tensor_info info;
            if (mk_model_output_info_at(open_model(L, m, fn), (size_t)(o - 1), &info) != 0)
                lmk_raise(L, "internal error", fn, "no information on output %lld", (long long)o);
            int64_t numel = 1;
            for (int k = 0; k < info.rank; k++) numel *= info.shape[k];
            if (info.dtype != MK_DTYPE_INT64 || numel != 1) /* counted from 1 here, as in Lua */
                lmk_raise(L, "dtype error", fn, "a stop value needs an int64 output of one "
                          "element; output %lld is %s %s", (long long)o,
                          mk_dtype_name(info.dtype), LMK_SHAPE_STR(info.rank, info.shape));
            stop = (mk_stop){true, (size_t)(o - 1), lua_tointeger(L, -1)};
            lua_pop(L, 2);
        }
        lua_pop(L, 1);
    }
    lua_createtable(L, n_out, 0);
    int list = lua_gettop(L);
    mk_buffer outs[MK_MAX_OUTPUTS];
    for (int o = 0; o < n_out; o++) {
        int given = 0;
        if (!lua_isnil(L, 4)) {
            lua_rawgeti(L, 4, o + 1);
            given = lua_gettop(L);
        }
        lmk_tensor *t = push_output(L, m, (size_t)o, given, (int64_t)n, fn);
        outs[o] = (mk_buffer){t->data, t->bytes};
        lua_rawseti(L, list, o + 1);
        if (given) lua_pop(L, 1);
    }
    mk_model *model = open_model(L, m, fn);
    mk_error *err = NULL;
    lmk_host_scope scope = lmk_host_begin(L);
    m->calls++;
    int64_t steps = mk_model_run_steps(model, (int64_t)n, named, count, outs, (size_t)n_out,
                                       &stop, &err);
    m->calls--;
    lmk_host_end(L, scope, steps < 0 ? err : NULL);
    if (steps < 0) {
        lua_getiuservalue(L, 1, UV_SOURCES);
        lmk_raise_at_source(L, lua_gettop(L), err);
    }
    lua_settop(L, list);
    lua_pushinteger(L, (lua_Integer)steps);
    return 2;
}

/* ==== introspection ============================================================ */

static int model_stats(lua_State *L) {
    lmk_model *m = check_model(L, 1, "stats", true);
    mk_stats s;
    memset(&s, 0, sizeof s);
    if (mk_model_stats(m->model, &s) != 0)
        return lmk_raise(L, "internal error", "stats", "the model gave no statistics");
    lua_createtable(L, 0, 15);
#define FIELD_INT(k, v) (lua_pushinteger(L, (lua_Integer)(v)), lua_setfield(L, -2, k))
    FIELD_INT("arena_bytes", s.arena_bytes);
    FIELD_INT("lower_bound_bytes", s.lower_bound_bytes);
    FIELD_INT("constant_bytes", s.constant_bytes);
    FIELD_INT("buffer_bytes", s.buffer_bytes);
    FIELD_INT("shared_bytes", s.shared_bytes);
    FIELD_INT("device_bytes", s.device_bytes);
    FIELD_INT("nodes", s.nodes);
    FIELD_INT("launches", s.launches);
    FIELD_INT("fused", s.fused_groups);
    FIELD_INT("pointwise_groups", s.pointwise_groups);
    FIELD_INT("product_groups", s.product_groups);
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

/* model:reset(): every buffer back to zero, as after compile */
static int model_reset(lua_State *L) {
    lmk_model *m = check_model(L, 1, "reset", true);
    mk_error *err = NULL;
    if (mk_model_reset(m->model, &err) != 0) lmk_raise_core(L, err);
    return 0;
}

static int model_script(lua_State *L) {
    lmk_model *m = check_model(L, 1, "script", true);
    const char *s = mk_model_script(m->model);
    lua_pushstring(L, s ? s : "");
    return 1;
}

/* model:fusion_report() -> one line per pointwise group, then per group the cuDNN
 * pass tried ("" without groups) */
static int model_fusion_report(lua_State *L) {
    lmk_model *m = check_model(L, 1, "fusion_report", true);
    const char *s = mk_model_fusion_report(m->model);
    lua_pushstring(L, s ? s : "");
    return 1;
}

/* model:dot() -> the compiled plan as Graphviz DOT; model:memory_svg() -> the arena as SVG */
static int model_picture(lua_State *L, const char *fn, char *(*draw)(const mk_model *)) {
    lmk_model *m = check_model(L, 1, fn, true);
    char *s = draw(m->model);
    if (!s) return luaL_error(L, "out of memory: %s: the picture of the model", fn);
    lmk_push_core_string(L, s);
    return 1;
}
static int model_dot(lua_State *L) { return model_picture(L, "dot", mk_model_dot); }

/* model:kernel_source(i) -> the CUDA C of launch i (1-based) where a group runs it */
static int model_kernel_source(lua_State *L) {
    lmk_model *m = check_model(L, 1, "kernel_source", true);
    lua_Integer i = luaL_checkinteger(L, 2);
    if (i < 1 || i > INT_MAX) LMK_ARG_ERROR(L, "kernel_source", "launch %lld is out of range",
                                            (long long)i);
    mk_error *err = NULL;
    char *s = mk_model_kernel_source(m->model, (int)(i - 1), &err);
    if (!s) lmk_raise_core(L, err);
    lmk_push_core_string(L, s);
    return 1;
}
static int model_memory_svg(lua_State *L) {
    return model_picture(L, "memory_svg", mk_model_memory_svg);
}

/* A list of the infos info_at gives for 0 .. count - 1. */
static int push_infos(lua_State *L, lmk_model *m, const char *fn, size_t count,
                      int (*info_at)(const mk_model *, size_t, mk_tensor_info *)) {
    lua_createtable(L, (int)count, 0);
    for (size_t i = 0; i < count; i++) {
        mk_tensor_info info;
        if (info_at(open_model(L, m, fn), i, &info) != 0) continue;
        push_info(L, &info);
        lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    return 1;
}

/* model:inputs() -> {{name =, dtype =, shape =}, ...}; model:output() -> {dtype =, shape =} */
static int model_inputs(lua_State *L) {
    lmk_model *m = check_model(L, 1, "inputs", true);
    return push_infos(L, m, "inputs", mk_model_input_count(m->model), mk_model_input_info);
}

/* model:outputs() -> {{dtype =, shape =}, ...}, one per output */
static int model_outputs(lua_State *L) {
    lmk_model *m = check_model(L, 1, "outputs", true);
    return push_infos(L, m, "outputs", mk_model_output_count(m->model), mk_model_output_info_at);
}

/* model:recurrence() -> {name = {output = o} | {add = k}, ...}: the script's next lines */
static int model_recurrence(lua_State *L) {
    lmk_model *m = check_model(L, 1, "recurrence", true);
    size_t count = mk_model_next_count(m->model);
    lua_createtable(L, 0, (int)count);
    for (size_t i = 0; i < count; i++) {
        size_t input;
        int output;
        int64_t add;
        mk_tensor_info info;
        lua_createtable(L, 0, 1); /* before the info: its name lives in the model */
        if (mk_model_next_info(m->model, i, &input, &output, &add) != 0 ||
            mk_model_input_info(m->model, input, &info) != 0) {
            lua_pop(L, 1);
            continue;
        }
        lua_pushinteger(L, output >= 0 ? (lua_Integer)output + 1 : (lua_Integer)add);
        lua_setfield(L, -2, output >= 0 ? "output" : "add");
        lua_setfield(L, -2, info.name);
    }
    return 1;
}

static int model_output(lua_State *L) {
    lmk_model *m = check_model(L, 1, "output", true);
    mk_tensor_info info;
    if (mk_model_output_info(m->model, &info) != 0)
        return lmk_raise(L, "internal error", "output", "no information on the output");
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
                 mk_dtype_name(info.dtype), LMK_SHAPE_STR(info.rank, info.shape));
        luaL_addstring(&b, line);
    }
    luaL_addstring(&b, ") ->");
    for (size_t o = 0; o < mk_model_output_count(m->model); o++) {
        mk_tensor_info out;
        if (mk_model_output_info_at(m->model, o, &out) != 0) continue;
        char line[160];
        snprintf(line, sizeof line, "%s %s %s", o ? "," : "", mk_dtype_name(out.dtype),
                 LMK_SHAPE_STR(out.rank, out.shape));
        luaL_addstring(&b, line);
    }
    luaL_pushresult(&b);
    return 1;
}

/* ==== registration ============================================================== */

void lmk_open_model(lua_State *L) {
    static const luaL_Reg meta[] = {
        {"__gc", model_release}, {"__close", model_release}, {"__tostring", model_tostring},
        {NULL, NULL}};
    static const luaL_Reg methods[] = {
        {"run", model_run}, {"stats", model_stats}, {"script", model_script},
        {"fusion_report", model_fusion_report}, {"dot", model_dot},
        {"kernel_source", model_kernel_source},
        {"memory_svg", model_memory_svg}, {"reset", model_reset},
        {"inputs", model_inputs}, {"output", model_output}, {"outputs", model_outputs},
        {"recurrence", model_recurrence}, {"run_steps", model_run_steps},
        {"close", model_release},
        {NULL, NULL}};
    lmk_define_type(L, LMK_MODEL_MT, meta, methods, NULL); /* __index = methods */
    lua_pop(L, 1);

    static const luaL_Reg functions[] = {{"compile_script", l_compile_script}, {NULL, NULL}};
    luaL_setfuncs(L, functions, 0);
}
