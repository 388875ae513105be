/*
 * values.c — what the importer's files share about values (onnx.h): ONNX
 * types and how moonkaas holds them, the maps of names, known values and
 * initializers (in the parsed file, or external data mapped from the
 * model's folder), script names, the rows' errors and attributes, and the
 * script lines a value or a node becomes (ox_ref, ox_emit).
 */
#include "onnx.h"
#include "onnx.pb-c.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------------ */

static uint64_t hash(const char *s) {
    uint64_t h = 1469598103934665603u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

static void **map_slot(ox_map *m, const char *key, bool *found) {
    size_t i = (size_t)hash(key) & (m->cap - 1);
    while (m->keys[i] && strcmp(m->keys[i], key)) i = (i + 1) & (m->cap - 1);
    *found = m->keys[i] != NULL;
    return &m->vals[i];
}

void *ox_map_get(const ox_map *m, const char *key) {
    if (!m->cap) return NULL;
    bool found;
    void **v = map_slot((ox_map *)m, key, &found);
    return found ? *v : NULL;
}

int ox_map_put(ox_map *m, const char *key, void *val) {
    if (2 * (m->n + 1) > m->cap) {
        ox_map bigger = {.cap = m->cap ? 2 * m->cap : 64};
        bigger.keys = calloc(bigger.cap, sizeof *bigger.keys);
        bigger.vals = calloc(bigger.cap, sizeof *bigger.vals);
        if (!bigger.keys || !bigger.vals) {
            free(bigger.keys), free(bigger.vals);
            return -1;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->keys[i]) ox_map_put(&bigger, m->keys[i], m->vals[i]);
        free(m->keys), free(m->vals);
        *m = bigger;
    }
    bool found;
    void **v = map_slot(m, key, &found);
    if (!found) {
        m->keys[v - m->vals] = key;
        m->n++;
    }
    *v = val;
    return 0;
}

void ox_map_free(ox_map *m) {
    free(m->keys);
    free(m->vals);
}

static size_t onnx_type_size(int t) {
    switch (t) {
    case OX_FLOAT: case OX_INT32: case OX_UINT32: return 4;
    case OX_INT64: case OX_DOUBLE: case OX_UINT64: return 8;
    case OX_FLOAT16: case OX_BFLOAT16: case OX_INT16: case OX_UINT16: return 2;
    case OX_INT8: case OX_UINT8: case OX_BOOL: return 1;
    default: return 0;
    }
}

const char *ox_type_name(int t) {
    static const char *const names[] = {
        "UNDEFINED", "FLOAT", "UINT8", "INT8", "UINT16", "INT16", "INT32", "INT64", "STRING",
        "BOOL", "FLOAT16", "DOUBLE", "UINT32", "UINT64", "COMPLEX64", "COMPLEX128", "BFLOAT16"};
    return t >= 0 && t < (int)(sizeof names / sizeof names[0]) ? names[t] : "an unknown type";
}

int ox_runtime_dtype(int t, mk_dtype *out) {
    switch (t) {
    case OX_FLOAT: *out = MK_DTYPE_FLOAT32; return 0;
    case OX_INT64: *out = MK_DTYPE_INT64; return 0;
    case OX_FLOAT16: *out = MK_DTYPE_FLOAT16; return 0;
    case OX_BFLOAT16: *out = MK_DTYPE_BFLOAT16; return 0;
    case OX_INT8: *out = MK_DTYPE_INT8; return 0;
    case OX_BOOL: *out = MK_DTYPE_BOOL; return 0;
    default: return -1;
    }
}

/* How a known tensor of ONNX type t is held: its own dtype, or int64 for the
 * other integer types (and bool); -1 for what the importer does not read. */
static int held_dtype(int t, mk_dtype *out) {
    if (t != OX_BOOL && !ox_runtime_dtype(t, out)) return 0;
    switch (t) {
    case OX_UINT8: case OX_INT16: case OX_UINT16: case OX_INT32: case OX_UINT32: case OX_BOOL:
        *out = MK_DTYPE_INT64;
        return 0;
    default: return -1;
    }
}

void *ox_alloc(ox_import *im, size_t bytes, mk_error **err) {
    mk_onnx *o = im->o;
    if (o->n_owned == o->cap_owned) {
        size_t cap = o->cap_owned ? 2 * o->cap_owned : 16;
        void **p = realloc(o->owned, cap * sizeof *p);
        if (!p) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import"), NULL;
        o->owned = p, o->cap_owned = cap;
    }
    void *m = calloc(1, bytes ? bytes : 1);
    if (!m) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import: %zu bytes", bytes), NULL;
    o->owned[o->n_owned++] = m;
    return m;
}

char *ox_strdup(ox_import *im, const char *s, mk_error **err) {
    char *c = ox_alloc(im, strlen(s) + 1, err);
    if (c) strcpy(c, s);
    return c;
}

int ox_numel(int rank, const int64_t *shape, int64_t *out) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0 || (shape[i] && n > MK_MAX_NUMEL / shape[i])) return -1;
        n *= shape[i];
    }
    *out = n;
    return 0;
}

ox_value *ox_new_value(ox_import *im, const char *name, mk_error **err) {
    if (im->n_all == im->cap_all) {
        size_t cap = im->cap_all ? 2 * im->cap_all : 64;
        ox_value **p = realloc(im->all, cap * sizeof *p);
        if (!p) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import"), NULL;
        im->all = p, im->cap_all = cap;
    }
    ox_value *v = calloc(1, sizeof *v);
    if (!v || !(v->name = strdup(name))) {
        free(v);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import"), NULL;
    }
    im->all[im->n_all++] = v;
    return v;
}

/* Registers v under its ONNX name: a second value of one name is an error. */
int ox_define(ox_import *im, ox_value *v, const char *what, mk_error **err) {
    if (ox_map_get(&im->values, v->name))
        return mk_fail(err, MK_ERR_NAME, 0, 0, "%s: %s '%s': the name is defined twice",
                       im->path, what, v->name);
    if (ox_map_put(&im->values, v->name, v))
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import");
    return 0;
}

/* A script name for an ONNX name: its characters where the script takes them,
 * '_' for the others, unique among the script's names. */
char *ox_script_name(ox_import *im, const char *onnx, mk_error **err) {
    size_t len = strlen(onnx);
    char *base = malloc(len + 3);
    if (!base) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import"), NULL;
    size_t k = 0;
    if (!(onnx[0] == '_' || (onnx[0] >= 'a' && onnx[0] <= 'z') || (onnx[0] >= 'A' && onnx[0] <= 'Z')))
        base[k++] = 'v', base[k++] = '_';
    for (const char *c = onnx; *c; c++) {
        bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '_' || *c == '.';
        base[k++] = ok ? *c : '_';
    }
    base[k] = 0;
    char *name = NULL;
    for (int n = 1; !name; n++) {
        char buf[32] = "";
        if (n > 1) snprintf(buf, sizeof buf, "_%d", n);
        size_t size = strlen(base) + strlen(buf) + 1;
        char *cand = ox_alloc(im, size, err);
        if (!cand) break;
        snprintf(cand, size, "%s%s", base, buf);
        if (!ox_map_get(&im->names, cand)) name = cand;
    }
    free(base);
    if (name && ox_map_put(&im->names, name, name)) {
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import");
        return NULL;
    }
    return name;
}

/* ---- errors and attributes, for the rows ------------------------------------- */

const char *ox_op_name(const Onnx__NodeProto *p) { return p->op_type ? p->op_type : "?"; }

const char *ox_node_name(const Onnx__NodeProto *p) {
    return p->name && *p->name ? p->name : p->n_output && *p->output[0] ? p->output[0] : "?";
}

#define NODE_FMT "ONNX node '%s' (%s, opset %d)"
#define NODE_ARGS(n) ox_node_name((n)->proto), ox_op_name((n)->proto), (n)->opset

int ox_fail(ox_node *n, mk_error **err, mk_error_code code, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return mk_fail(err, code, 0, 0, NODE_FMT ": %s", NODE_ARGS(n), what);
}

int ox_within(ox_node *n, mk_error **err) {
    return mk_fail_within(err, 0, 0, NODE_FMT, NODE_ARGS(n));
}

static const char *attr_type_name(int t) {
    static const char *const names[] = {"UNDEFINED", "FLOAT", "INT", "STRING", "TENSOR",
                                        "GRAPH", "FLOATS", "INTS", "STRINGS", "TENSORS",
                                        "GRAPHS", "SPARSE_TENSOR", "SPARSE_TENSORS",
                                        "TYPE_PROTO", "TYPE_PROTOS"};
    return t >= 0 && t < (int)(sizeof names / sizeof names[0]) ? names[t] : "unknown";
}

const Onnx__AttributeProto *ox_attr(ox_node *n, const char *name, int type, mk_error **err) {
    const Onnx__NodeProto *p = n->proto;
    for (size_t i = 0; i < p->n_attribute; i++) {
        const Onnx__AttributeProto *a = p->attribute[i];
        if (!a->name || strcmp(a->name, name)) continue;
        if (a->has_type && (int)a->type != type) {
            ox_fail(n, err, MK_ERR_ARGUMENT, "attribute '%s' is %s, %s takes %s", name,
                    attr_type_name((int)a->type), p->op_type, attr_type_name(type));
            return NULL;
        }
        return a;
    }
    return NULL;
}

int ox_attr_int(ox_node *n, const char *name, int64_t def, int64_t *out, mk_error **err) {
    mk_error *e = NULL;
    const Onnx__AttributeProto *a = ox_attr(n, name, 2 /* INT */, &e);
    if (e) {
        if (err && !*err) *err = e;
        else mk_error_free(e);
        return -1;
    }
    *out = a ? a->i : def;
    return 0;
}

int ox_attr_float(ox_node *n, const char *name, float def, float *out, mk_error **err) {
    mk_error *e = NULL;
    const Onnx__AttributeProto *a = ox_attr(n, name, 1 /* FLOAT */, &e);
    if (e) {
        if (err && !*err) *err = e;
        else mk_error_free(e);
        return -1;
    }
    *out = a ? a->f : def;
    return 0;
}

/* ---- known values ------------------------------------------------------------ */

void *ox_set_known(ox_node *n, ox_value *out, int onnx_type, int rank, const int64_t *shape,
                   mk_error **err) {
    mk_dtype d;
    int64_t numel = 0;
    if (held_dtype(onnx_type, &d))
        return ox_fail(n, err, MK_ERR_DTYPE, "%s tensors are not supported",
                       ox_type_name(onnx_type)), NULL;
    if (rank > MK_MAX_RANK || ox_numel(rank, shape, &numel))
        return ox_fail(n, err, MK_ERR_SHAPE, "the result has rank %d or more than 2^48 elements",
                       rank), NULL;
    if ((size_t)numel * mk_dtype_size(d) > OX_FOLD_BYTES)
        return ox_fail(n, err, MK_ERR_SHAPE, "the result computed at load would take %lld "
                       "bytes (at most %zu: folding is for shape computations)",
                       (long long)((size_t)numel * mk_dtype_size(d)), OX_FOLD_BYTES), NULL;
    void *data = ox_alloc(n->im, (size_t)numel * mk_dtype_size(d), err);
    if (!data) return NULL;
    out->onnx_type = onnx_type, out->dtype = d, out->rank = rank, out->data = data;
    if (rank) memcpy(out->shape, shape, sizeof(int64_t) * (size_t)rank);
    return data;
}

int ox_known_ints(ox_node *n, const ox_value *v, const char *what, int64_t *out, int max,
                  mk_error **err) {
    if (!v) return ox_fail(n, err, MK_ERR_ARGUMENT, "%s is missing", what);
    if (!v->data)
        return ox_fail(n, err, MK_ERR_ARGUMENT,
                       "%s ('%s') must be known at load (an initializer, a Constant or a "
                       "folded shape computation), not computed at run time", what, v->name);
    if (v->dtype != MK_DTYPE_INT64)
        return ox_fail(n, err, MK_ERR_DTYPE, "%s ('%s') must be integers, not %s", what,
                       v->name, ox_type_name(v->onnx_type));
    int64_t numel = 0;
    ox_numel(v->rank, v->shape, &numel);
    if (numel > max)
        return ox_fail(n, err, MK_ERR_SHAPE, "%s ('%s') has %lld values (at most %d)", what,
                       v->name, (long long)numel, max);
    memcpy(out, v->data, (size_t)numel * sizeof *out);
    return (int)numel;
}

ox_value *ox_known_scalar(ox_node *n, int onnx_type, double x, mk_error **err) {
    char name[256];
    snprintf(name, sizeof name, "%.200s.k%zu", ox_node_name(n->proto), n->im->n_all);
    ox_value *v = ox_new_value(n->im, name, err);
    if (!v) return NULL;
    void *data = ox_set_known(n, v, onnx_type, 1, (int64_t[]){1}, err);
    if (!data) return NULL;
    if (v->dtype == MK_DTYPE_INT64) *(int64_t *)data = (int64_t)x;
    else if (v->dtype == MK_DTYPE_FLOAT32) *(float *)data = (float)x;
    else mk_convert(data, v->dtype, &(float){(float)x}, MK_DTYPE_FLOAT32, 1);
    return v;
}

ox_value *ox_temp(ox_node *n, mk_error **err) {
    char name[256];
    snprintf(name, sizeof name, "%.200s.t%zu", ox_node_name(n->proto), n->im->n_all);
    return ox_new_value(n->im, name, err);
}

/* ---- the script ------------------------------------------------------------- */

int ox_node_rank(const ox_value *v) { return v->rank ? v->rank : 1; }
const int64_t *ox_node_shape(const ox_value *v) {
    static const int64_t one[MK_MAX_RANK] = {1, 1, 1, 1};
    return v->rank ? v->shape : one;
}

void ox_put_shape(mk_strbuf *b, int rank, const int64_t *shape) {
    mk_strbuf_put(b, "[");
    for (int i = 0; i < rank; i++) mk_strbuf_put(b, "%s%lld", i ? ", " : "", (long long)shape[i]);
    mk_strbuf_put(b, "]");
}

int ox_ref(ox_node *n, ox_value *v, mk_error **err) {
    if (v->node) return v->node;
    ox_import *im = n->im;
    if (!v->data) return MK_INTERNAL(err, "a value with neither node nor data");
    mk_dtype d;
    if (ox_runtime_dtype(v->onnx_type, &d) && v->dtype != MK_DTYPE_INT64)
        return ox_fail(n, err, MK_ERR_DTYPE, "'%s' is %s, which moonkaas holds no tensor of",
                       v->name, ox_type_name(v->onnx_type));
    int64_t numel = 0;
    ox_numel(v->rank, v->shape, &numel);
    if (numel == 0)
        return ox_fail(n, err, MK_ERR_SHAPE, "'%s' has no elements (moonkaas tensors have some)",
                       v->name);
    if (v->onnx_type == OX_BOOL && v->dtype == MK_DTYPE_INT64) { /* held as int64 to fold */
        unsigned char *bytes = ox_alloc(im, (size_t)numel, err);
        if (!bytes) return -1;
        for (int64_t i = 0; i < numel; i++) bytes[i] = ((const int64_t *)v->data)[i] != 0;
        v->data = bytes, v->dtype = MK_DTYPE_BOOL;
    }
    mk_onnx *o = im->o;
    if (o->n_constants == im->cap_constants) {
        size_t cap = im->cap_constants ? 2 * im->cap_constants : 16;
        ox_constant *p = realloc(o->constants, cap * sizeof *p);
        if (!p) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import");
        o->constants = p, im->cap_constants = cap;
    }
    char *name = ox_script_name(im, v->name, err);
    if (!name) return -1;
    ox_constant *c = &o->constants[o->n_constants++];
    *c = (ox_constant){.name = name, .dtype = v->dtype, .rank = ox_node_rank(v), .data = v->data};
    memcpy(c->shape, ox_node_shape(v), sizeof(int64_t) * (size_t)c->rank);
    v->node = ++im->next_id;
    mk_strbuf_put(&im->script, "$%d = ConstantTensor(%s, %s, ", v->node, name,
                  mk_dtype_name(v->dtype));
    ox_put_shape(&im->script, c->rank, c->shape);
    mk_strbuf_put(&im->script, ");\n");
    return v->node;
}

int ox_emit(ox_node *n, ox_value *out, const char *op, ox_value *const *operands, int n_operands,
            const int64_t *ints, int n_ints, mk_dtype dtype, int onnx_rank, mk_error **err) {
    ox_import *im = n->im;
    const mk_op *row = mk_op_find(op, strlen(op));
    if (!row) return MK_INTERNAL(err, "a row names an op the table lacks");
    mk_tensor_info infos[MK_MAX_INPUTS];
    int refs[MK_MAX_INPUTS];
    for (int k = 0; k < n_operands; k++) {
        ox_value *v = operands[k];
        if ((refs[k] = ox_ref(n, v, err)) < 0) return -1;
        infos[k] = (mk_tensor_info){.name = v->name, .dtype = v->dtype, .rank = ox_node_rank(v),
                                    .value = v->data};
        memcpy(infos[k].shape, ox_node_shape(v), sizeof(int64_t) * (size_t)infos[k].rank);
    }
    mk_tensor_info res = {.dtype = dtype};
    if (mk_op_infer(op, infos, (size_t)n_operands, ints, (size_t)n_ints, &res, err))
        return ox_within(n, err);
    out->node = ++im->next_id;
    out->data = NULL;
    out->dtype = res.dtype;
    out->onnx_type = res.dtype == MK_DTYPE_FLOAT32 ? OX_FLOAT
                   : res.dtype == MK_DTYPE_INT64   ? OX_INT64
                   : res.dtype == MK_DTYPE_FLOAT16 ? OX_FLOAT16
                   : res.dtype == MK_DTYPE_BFLOAT16 ? OX_BFLOAT16
                   : res.dtype == MK_DTYPE_BOOL     ? OX_BOOL : OX_INT8;
    out->rank = onnx_rank >= 0 ? onnx_rank : res.rank;
    memcpy(out->shape, res.shape, sizeof out->shape);
    mk_strbuf *b = &im->script;
    mk_strbuf_put(b, "$%d = %s(", out->node, op);
    int k = 0, i = 0;
    bool first = true;
    for (const char *c = row->signature; *c; c++) {
        if (!first) mk_strbuf_put(b, ", ");
        first = false;
        switch (*c) {
        case 'n': case 'r': mk_strbuf_put(b, "$%d", refs[k++]); break;
        case 'i': mk_strbuf_put(b, "%lld", (long long)ints[i++]); break;
        case 'l': ox_put_shape(b, n_ints - i, ints + i), i = n_ints; break;
        case 'd': mk_strbuf_put(b, "%s", mk_dtype_name(dtype)); break;
        default: return MK_INTERNAL(err, "a signature letter the importer does not write");
        }
    }
    mk_strbuf_put(b, ");\n");
    return 0;
}

/* ---- initializers ------------------------------------------------------------- */

static const char *entry(const Onnx__TensorProto *t, const char *key) {
    for (size_t i = 0; i < t->n_external_data; i++)
        if (t->external_data[i]->key && !strcmp(t->external_data[i]->key, key))
            return t->external_data[i]->value ? t->external_data[i]->value : "";
    return NULL;
}

static int parse_size(const char *s, size_t *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno || s[0] == '-') return -1;
    *out = (size_t)v;
    return 0;
}

/* The bytes of an external tensor: a file in the model's folder, mapped. */
static const void *external_bytes(ox_import *im, const Onnx__TensorProto *t, size_t want,
                                  mk_error **err) {
    const char *loc = entry(t, "location"), *name = t->name ? t->name : "?";
    size_t offset = 0, length = want;
    if (!loc || !*loc)
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: initializer '%s': external data without "
                       "a location", im->path, name), NULL;
    if ((entry(t, "offset") && parse_size(entry(t, "offset"), &offset)) ||
        (entry(t, "length") && parse_size(entry(t, "length"), &length)))
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: initializer '%s': external data's offset "
                       "or length is not a number", im->path, name), NULL;
    size_t size = strlen(im->dir) + strlen(loc) + 2;
    char *joined = malloc(size), *real = NULL;
    if (!joined) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import"), NULL;
    snprintf(joined, size, "%s/%s", im->dir, loc);
    /* absolute, or a ".." part: outside whether it exists or not */
    bool up = loc[0] == '/';
    for (const char *p = loc; !up && (p = strstr(p, "..")); p += 2)
        up = (p == loc || p[-1] == '/') && (p[2] == 0 || p[2] == '/');
    real = up ? NULL : realpath(joined, NULL);
    if (!real && !up && errno == ENOENT) {
        free(joined);
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: initializer '%s': external data '%s': no "
                       "such file in the model's folder %s", im->path, name, loc, im->dir), NULL;
    }
    size_t dl = strlen(im->dir);
    bool inside = real && !strncmp(real, im->dir, dl) && real[dl] == '/';
    free(joined);
    if (!inside) {
        free(real);
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: initializer '%s': external data '%s' is not "
                       "a file inside the model's folder %s", im->path, name, loc, im->dir), NULL;
    }
    mk_onnx *o = im->o;
    mk_mapped *maps = realloc(o->maps, (o->n_maps + 1) * sizeof *maps);
    if (!maps) {
        free(real);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import"), NULL;
    }
    o->maps = maps;
    int rc = mk_file_map(real, 0, &maps[o->n_maps], err);
    free(real);
    if (rc) return NULL;
    mk_mapped *m = &maps[o->n_maps++];
    if (length != want || offset > m->size || m->size - offset < length)
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: initializer '%s': external data '%s' holds "
                       "%zu bytes at %zu (the file has %zu), the tensor needs %zu", im->path,
                       name, loc, length, offset, m->size, want), NULL;
    return (const char *)m->data + offset;
}

/* A TensorProto as a known value (what it holds, checked against its shape). */
int ox_tensor_proto(ox_import *im, const Onnx__TensorProto *t, ox_value *v, const char *what,
                        mk_error **err) {
    const char *name = t->name ? t->name : "?";
    int ot = t->has_data_type ? t->data_type : 0;
    mk_dtype d;
    if (held_dtype(ot, &d))
        return mk_fail(err, MK_ERR_DTYPE, 0, 0, "%s: %s '%s' is %s, which the importer does not "
                       "read", im->path, what, name, ox_type_name(ot));
    if (t->n_dims > MK_MAX_RANK)
        return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: %s '%s' has rank %zu (at most %d)", im->path,
                       what, name, t->n_dims, MK_MAX_RANK);
    int64_t numel = 0;
    if (ox_numel((int)t->n_dims, t->dims, &numel))
        return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: %s '%s' has a negative dim or more than "
                       "2^48 elements", im->path, what, name);
    v->onnx_type = ot, v->dtype = d, v->rank = (int)t->n_dims;
    if (t->n_dims) memcpy(v->shape, t->dims, sizeof(int64_t) * t->n_dims);
    size_t es = onnx_type_size(ot), bytes = (size_t)numel * es;
    const unsigned char *raw = NULL;
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL) {
        if (!(raw = external_bytes(im, t, bytes, err))) return -1;
    } else if (t->has_raw_data) {
        if (t->raw_data.len != bytes)
            return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: %s '%s' has %zu bytes of raw data, its "
                           "shape needs %zu", im->path, what, name, t->raw_data.len, bytes);
        raw = t->raw_data.data;
    }
    bool same = mk_dtype_size(d) == es;
    if (raw && same && (uintptr_t)raw % es == 0) {
        v->data = raw; /* in place: in the parsed model, or in the mapped file */
        return 0;
    }
    /* the typed fields (where there is no raw data): as many values as the
     * shape needs, checked before the memory is asked for */
    size_t have;
    switch (ot) {
    case OX_FLOAT: have = t->n_float_data; break;
    case OX_INT64: have = t->n_int64_data; break;
    case OX_UINT32: have = t->n_uint64_data; break;
    default: have = t->n_int32_data; break;
    }
    if (!raw && have != (size_t)numel)
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: %s '%s' has %zu values, its shape %s needs "
                       "%lld", im->path, what, name, have,
                       mk_shape_str(v->rank ? v->rank : 1, v->rank ? v->shape : (int64_t[]){1},
                                    (char[96]){0}, 96), (long long)numel);
    void *out = ox_alloc(im, (size_t)numel * mk_dtype_size(d), err);
    if (!out) return -1;
    v->data = out;
    if (raw) {
        if (same) {
            memcpy(out, raw, bytes);
            return 0;
        }
        int64_t *o64 = out;
        for (int64_t i = 0; i < numel; i++) {
            const unsigned char *p = raw + (size_t)i * es;
            switch (ot) {
            case OX_UINT8: case OX_BOOL: o64[i] = p[0]; break;
            case OX_INT16: o64[i] = (int16_t)(p[0] | p[1] << 8); break;
            case OX_UINT16: o64[i] = (uint16_t)(p[0] | p[1] << 8); break;
            case OX_INT32: o64[i] = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                                              (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24); break;
            default: o64[i] = (int64_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                                        (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24); break;
            }
        }
        return 0;
    }
    for (int64_t i = 0; i < numel; i++) {
        switch (ot) {
        case OX_FLOAT: ((float *)out)[i] = t->float_data[i]; break;
        case OX_INT64: ((int64_t *)out)[i] = t->int64_data[i]; break;
        case OX_UINT32: ((int64_t *)out)[i] = (int64_t)(uint32_t)t->uint64_data[i]; break;
        case OX_FLOAT16: case OX_BFLOAT16: ((uint16_t *)out)[i] = (uint16_t)t->int32_data[i]; break;
        case OX_INT8: ((int8_t *)out)[i] = (int8_t)t->int32_data[i]; break;
        default: ((int64_t *)out)[i] = t->int32_data[i]; break;
        }
    }
    return 0;
}

/* A Constant node's tensor attribute, for the rows. */
int ox_tensor_value(ox_node *n, const void *tensor, ox_value *out, mk_error **err) {
    if (ox_tensor_proto(n->im, tensor, out, "the value of", err)) return ox_within(n, err);
    return 0;
}
