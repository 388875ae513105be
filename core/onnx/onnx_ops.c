/*
 * onnx_ops.c — the ONNX importer's mapping table: one row per ONNX op, with
 * the opsets it covers, the attributes it reads (any other is an error), the
 * moonkaas op or small subgraph it becomes, and its rules. doc/onnx.md's
 * table is generated from these rows (scripts/onnx_ops.lua).
 *
 * A row's function reads the node's inputs (ox_value: known at load, or a
 * script node) and sets its outputs. Where every input is known, the
 * shape-computing ops (Shape, Gather, Concat, Slice, Squeeze, Unsqueeze,
 * Reshape, Cast, and integer Add/Sub/Mul/Div) compute their result at load:
 * PyTorch's Shape → Gather → Concat → Reshape chains become one constant
 * shape. Anything a row cannot do exactly is an error naming the node.
 */
#include "onnx.h"
#include "onnx.pb-c.h"

#include <stdio.h>
#include <string.h>

#define ATTR_FLOAT 1
#define ATTR_INT 2
#define ATTR_TENSOR 4
#define ATTR_FLOATS 6
#define ATTR_INTS 7

static int64_t numel(const ox_value *v) {
    int64_t k = 1;
    for (int i = 0; i < v->rank; i++) k *= v->shape[i];
    return k;
}

static bool known(const ox_value *v) { return v && v->data; }

/* An input that must be there. */
static ox_value *need(ox_node *n, int k, mk_error **err) {
    if (k < n->n_in && n->in[k]) return n->in[k];
    ox_fail(n, err, MK_ERR_ARGUMENT, "input %d is missing", k + 1);
    return NULL;
}

/* The output value: the same node or data as v (Identity, a reshape of a known tensor). */
static void alias(ox_value *out, const ox_value *v) {
    char *name = out->name;
    *out = *v;
    out->name = name;
}

/* An axis in [-rank, rank) as a count from 0. */
static int axis_of(ox_node *n, int64_t axis, int rank, const char *what, int *out,
                   mk_error **err) {
    if (axis < -rank || axis >= rank)
        return ox_fail(n, err, MK_ERR_SHAPE, "%s %lld is outside [%d, %d)", what,
                       (long long)axis, -rank, rank);
    *out = (int)(axis < 0 ? axis + rank : axis);
    return 0;
}

/* A reshape: data known, the same data with a new shape; else a ReshapeNode. */
static int reshape_to(ox_node *n, ox_value *out, ox_value *x, int rank, const int64_t *shape,
                      mk_error **err) {
    if (rank > MK_MAX_RANK)
        return ox_fail(n, err, MK_ERR_SHAPE, "the result has rank %d (moonkaas: at most %d)",
                       rank, MK_MAX_RANK);
    if (known(x)) {
        alias(out, x);
        out->node = 0;
        out->rank = rank;
        memcpy(out->shape, shape, sizeof(int64_t) * (size_t)rank);
        return 0;
    }
    int64_t one = 1;
    return ox_emit(n, out, "ReshapeNode", &x, 1, rank ? shape : &one, rank ? rank : 1, 0, rank,
                   err);
}

/* ---- pointwise ---------------------------------------------------------------- */

/* NumPy's broadcast of a and b's shapes into out; -1 where they do not. */
static int broadcast_shape(const ox_value *a, const ox_value *b, int64_t *out) {
    int rank = a->rank > b->rank ? a->rank : b->rank;
    for (int i = 0; i < rank; i++) {
        int ia = i - (rank - a->rank), ib = i - (rank - b->rank);
        int64_t da = ia < 0 ? 1 : a->shape[ia], db = ib < 0 ? 1 : b->shape[ib];
        if (da != db && da != 1 && db != 1) return -1;
        out[i] = da == 1 ? db : da;
    }
    return rank;
}

/* The flat index into v of the result's element at idx (v broadcast to rank). */
static int64_t broadcast_at(const ox_value *v, int rank, const int64_t *idx) {
    int64_t at = 0;
    for (int i = 0; i < v->rank; i++) {
        int64_t d = v->shape[i], j = idx[i + rank - v->rank];
        at = at * d + (d == 1 ? 0 : j);
    }
    return at;
}

static int fold_binary(ox_node *n, char op, ox_value *a, ox_value *b, mk_error **err) {
    int64_t shape[MK_MAX_RANK];
    int rank = broadcast_shape(a, b, shape);
    if (rank < 0) return ox_fail(n, err, MK_ERR_SHAPE, "the operands do not broadcast");
    void *data = ox_set_known(n, n->out[0], a->onnx_type, rank, shape, err);
    if (!data) return -1;
    int64_t total = numel(n->out[0]), idx[MK_MAX_RANK] = {0};
    for (int64_t e = 0; e < total; e++) {
        int64_t ia = broadcast_at(a, rank, idx), ib = broadcast_at(b, rank, idx);
        if (a->dtype == MK_DTYPE_INT64) {
            int64_t x = ((const int64_t *)a->data)[ia], y = ((const int64_t *)b->data)[ib], r;
            if (op == '/' && y == 0) return ox_fail(n, err, MK_ERR_EVAL, "integer division by 0");
            r = op == '+' ? x + y : op == '-' ? x - y : op == '*' ? x * y : x / y;
            ((int64_t *)data)[e] = r;
        } else {
            float x = ((const float *)a->data)[ia], y = ((const float *)b->data)[ib];
            ((float *)data)[e] = op == '+' ? x + y : op == '-' ? x - y : op == '*' ? x * y : x / y;
        }
        for (int d = rank - 1; d >= 0 && ++idx[d] == shape[d]; d--) idx[d] = 0;
    }
    return 0;
}

static int lower_binary(ox_node *n, mk_error **err) {
    ox_value *a = need(n, 0, err), *b = a ? need(n, 1, err) : NULL;
    if (!b) return -1;
    const char *t = n->proto->op_type;
    char op = !strcmp(t, "Add") ? '+' : !strcmp(t, "Sub") ? '-' : !strcmp(t, "Mul") ? '*' : '/';
    if (a->onnx_type != b->onnx_type)
        return ox_fail(n, err, MK_ERR_DTYPE, "the operands differ in type (%s and %s)",
                       ox_type_name(a->onnx_type), ox_type_name(b->onnx_type));
    if (known(a) && known(b) && (a->dtype == MK_DTYPE_INT64 || a->onnx_type == OX_FLOAT))
        return fold_binary(n, op, a, b, err);
    const char *mk = op == '+' ? "SumNode" : op == '-' ? "SubNode" : op == '*'
                                 ? "HadamardProductNode" : "DivNode";
    ox_value *in[2] = {a, b};
    int rank = a->rank > b->rank ? a->rank : b->rank;
    return ox_emit(n, n->out[0], mk, in, 2, NULL, 0, 0, rank, err);
}

static int lower_unary(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    if (!x) return -1;
    const char *t = n->proto->op_type;
    const char *mk = !strcmp(t, "Relu") ? "ReLUNode" : !strcmp(t, "Sigmoid") ? "SigmoidNode"
                   : !strcmp(t, "Tanh") ? "TanhNode" : "ExpNode";
    return ox_emit(n, n->out[0], mk, &x, 1, NULL, 0, 0, x->rank, err);
}

/* ---- products ------------------------------------------------------------------ */

/* a @ b for a [..., m, k] or [k], b [k, n] or [B, k, n] of a's batch: moonkaas
 * multiplies [k]@[k,n], [m,k]@[k,n] and [B,m,k]@[B,k,n]; the rest are reshapes
 * around one of those. */
static int matmul(ox_node *n, ox_value *out, ox_value *a, ox_value *b, mk_error **err) {
    ox_import *im = n->im;
    (void)im;
    if (a->rank < 1 || b->rank < 1)
        return ox_fail(n, err, MK_ERR_SHAPE, "MatMul of a scalar");
    int64_t k = a->shape[a->rank - 1];
    if (b->rank == 1) { /* [..., k] @ [k] = [...]: b as [k, 1] */
        ox_value *b2 = ox_temp(n, err), *y = b2;
        if (!b2 || reshape_to(n, b2, b, 2, (int64_t[]){b->shape[0], 1}, err)) return -1;
        if (!(y = ox_temp(n, err)) || matmul(n, y, a, b2, err)) return -1;
        return reshape_to(n, out, y, a->rank - 1, a->shape, err);
    }
    if (a->rank == 1 || (a->rank == 2 && b->rank == 2))
        return ox_emit(n, out, "MatMulNode", (ox_value *[]){a, b}, 2, NULL, 0, 0, -1, err);
    if (b->rank == 2) { /* [..., m, k] @ [k, n]: the batch folded into the rows */
        int64_t rows = 1;
        for (int i = 0; i < a->rank - 1; i++) rows *= a->shape[i];
        ox_value *a2 = ox_temp(n, err), *y;
        if (!a2 || reshape_to(n, a2, a, 2, (int64_t[]){rows, k}, err)) return -1;
        if (!(y = ox_temp(n, err)) || matmul(n, y, a2, b, err)) return -1;
        int64_t shape[MK_MAX_RANK];
        memcpy(shape, a->shape, sizeof shape);
        shape[a->rank - 1] = b->shape[1];
        return reshape_to(n, out, y, a->rank, shape, err);
    }
    /* batch dims broadcast: MatMulNode computes numpy.matmul */
    int rank = a->rank > b->rank ? a->rank : b->rank;
    return ox_emit(n, out, "MatMulNode", (ox_value *[]){a, b}, 2, NULL, 0, 0, rank, err);
}

static int lower_matmul(ox_node *n, mk_error **err) {
    ox_value *a = need(n, 0, err), *b = a ? need(n, 1, err) : NULL;
    return b ? matmul(n, n->out[0], a, b, err) : -1;
}


static ox_value *scratch(ox_node *n, mk_error **err) { return ox_temp(n, err); }

static int scale(ox_node *n, ox_value *out, ox_value *x, float factor, mk_error **err) {
    ox_value *f = ox_known_scalar(n, x->onnx_type, factor, err);
    if (!f) return -1;
    return ox_emit(n, out, "HadamardProductNode", (ox_value *[]){x, f}, 2, NULL, 0, 0, x->rank,
                   err);
}

static int lower_gemm(ox_node *n, mk_error **err) {
    ox_value *a = need(n, 0, err), *b = a ? need(n, 1, err) : NULL;
    ox_value *c = n->n_in > 2 ? n->in[2] : NULL;
    int64_t ta, tb;
    float alpha, beta;
    if (!b || ox_attr_int(n, "transA", 0, &ta, err) || ox_attr_int(n, "transB", 0, &tb, err) ||
        ox_attr_float(n, "alpha", 1.0f, &alpha, err) || ox_attr_float(n, "beta", 1.0f, &beta, err))
        return -1;
    if (a->rank != 2 || b->rank != 2)
        return ox_fail(n, err, MK_ERR_SHAPE, "Gemm takes two matrices, got ranks %d and %d",
                       a->rank, b->rank);
    ox_value *at = a, *bt = b;
    if (ta && (!(at = scratch(n, err)) ||
               ox_emit(n, at, "PermuteNode", &a, 1, (int64_t[]){1, 0}, 2, 0, -1, err)))
        return -1;
    if (tb && (!(bt = scratch(n, err)) ||
               ox_emit(n, bt, "PermuteNode", &b, 1, (int64_t[]){1, 0}, 2, 0, -1, err)))
        return -1;
    ox_value *y = c || alpha != 1.0f ? scratch(n, err) : n->out[0];
    if (!y || matmul(n, y, at, bt, err)) return -1;
    if (alpha != 1.0f) {
        ox_value *s = c ? scratch(n, err) : n->out[0];
        if (!s || scale(n, s, y, alpha, err)) return -1;
        y = s;
    }
    if (!c) return 0;
    int64_t shape[MK_MAX_RANK];
    if (broadcast_shape(y, c, shape) != 2 || shape[0] != y->shape[0] || shape[1] != y->shape[1])
        return ox_fail(n, err, MK_ERR_SHAPE, "C does not broadcast to A·B's [%lld, %lld]",
                       (long long)y->shape[0], (long long)y->shape[1]);
    ox_value *cs = c;
    if (beta != 1.0f && (!(cs = scratch(n, err)) || scale(n, cs, c, beta, err))) return -1;
    return ox_emit(n, n->out[0], "SumNode", (ox_value *[]){y, cs}, 2, NULL, 0, 0, 2, err);
}

/* ---- shapes and movement ------------------------------------------------------- */

static int lower_reshape(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    int64_t shape[MK_MAX_RANK + 1], allowzero;
    int r;
    if (!x || ox_attr_int(n, "allowzero", 0, &allowzero, err) ||
        (r = ox_known_ints(n, n->n_in > 1 ? n->in[1] : NULL, "the shape", shape, MK_MAX_RANK + 1,
                           err)) < 0)
        return -1;
    int64_t total = numel(x), k = 1;
    int free_dim = -1;
    for (int i = 0; i < r; i++) {
        if (shape[i] == 0 && !allowzero) {
            if (i >= x->rank)
                return ox_fail(n, err, MK_ERR_SHAPE, "shape dim %d is 0 (copy), but the input "
                               "has rank %d", i, x->rank);
            shape[i] = x->shape[i];
        }
        if (shape[i] == -1) {
            if (free_dim >= 0) return ox_fail(n, err, MK_ERR_SHAPE, "the shape has two -1");
            free_dim = i;
            continue;
        }
        if (shape[i] < 1)
            return ox_fail(n, err, MK_ERR_SHAPE, "shape dim %d is %lld", i, (long long)shape[i]);
        if (__builtin_mul_overflow(k, shape[i], &k))
            return ox_fail(n, err, MK_ERR_SHAPE, "the shape's element count overflows at dim %d",
                           i);
    }
    if (free_dim >= 0) {
        if (total % k) return ox_fail(n, err, MK_ERR_SHAPE, "%lld elements do not fill the shape",
                                      (long long)total);
        shape[free_dim] = total / k;
        k = total;
    }
    if (k != total)
        return ox_fail(n, err, MK_ERR_SHAPE, "the input's %lld elements do not make the shape's "
                       "%lld", (long long)total, (long long)k);
    return reshape_to(n, n->out[0], x, r, shape, err);
}

static int lower_flatten(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    int64_t axis;
    int ax = 0;
    if (!x || ox_attr_int(n, "axis", 1, &axis, err)) return -1;
    if (axis_of(n, axis, x->rank + 1, "axis", &ax, err)) return -1;
    if (axis < 0 && axis + x->rank < 0)
        return ox_fail(n, err, MK_ERR_SHAPE, "axis %lld is outside [%d, %d]", (long long)axis,
                       -x->rank, x->rank);
    if (axis < 0) ax = (int)(axis + x->rank);
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < x->rank; i++) *(i < ax ? &outer : &inner) *= x->shape[i];
    return reshape_to(n, n->out[0], x, 2, (int64_t[]){outer, inner}, err);
}

static int lower_squeeze(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    int64_t axes[MK_MAX_RANK], shape[MK_MAX_RANK];
    bool drop[MK_MAX_RANK] = {false};
    if (!x) return -1;
    int na = n->n_in > 1 && n->in[1] ? ox_known_ints(n, n->in[1], "axes", axes, MK_MAX_RANK, err)
                                     : 0;
    if (na < 0) return -1;
    for (int i = 0; i < na; i++) {
        int ax = 0;
        if (axis_of(n, axes[i], x->rank, "axis", &ax, err)) return -1;
        if (x->shape[ax] != 1)
            return ox_fail(n, err, MK_ERR_SHAPE, "axis %d has size %lld, not 1", ax,
                           (long long)x->shape[ax]);
        drop[ax] = true;
    }
    int r = 0;
    for (int i = 0; i < x->rank; i++)
        if (!(na ? drop[i] : x->shape[i] == 1)) shape[r++] = x->shape[i];
    return reshape_to(n, n->out[0], x, r, shape, err);
}

static int lower_unsqueeze(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    int64_t axes[MK_MAX_RANK + 1], shape[MK_MAX_RANK];
    int na;
    if (!x || (na = ox_known_ints(n, n->n_in > 1 ? n->in[1] : NULL, "axes", axes,
                                  MK_MAX_RANK + 1, err)) < 0)
        return -1;
    int r = x->rank + na;
    if (r > MK_MAX_RANK)
        return ox_fail(n, err, MK_ERR_SHAPE, "the result has rank %d (at most %d)", r,
                       MK_MAX_RANK);
    bool add[MK_MAX_RANK] = {false};
    for (int i = 0; i < na; i++) {
        int ax = 0;
        if (axis_of(n, axes[i], r, "axis", &ax, err)) return -1;
        if (add[ax]) return ox_fail(n, err, MK_ERR_SHAPE, "axis %d is given twice", ax);
        add[ax] = true;
    }
    for (int i = 0, j = 0; i < r; i++) shape[i] = add[i] ? 1 : x->shape[j++];
    return reshape_to(n, n->out[0], x, r, shape, err);
}

static int lower_transpose(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    if (!x) return -1;
    int64_t perm[MK_MAX_RANK];
    const Onnx__AttributeProto *a = ox_attr(n, "perm", ATTR_INTS, err);
    if (err && *err) return -1;
    if (a && a->n_ints != (size_t)x->rank)
        return ox_fail(n, err, MK_ERR_SHAPE, "perm has %zu axes, the input %d", a->n_ints,
                       x->rank);
    for (int i = 0; i < x->rank; i++) perm[i] = a ? a->ints[i] : x->rank - 1 - i;
    if (x->rank <= 1) {
        alias(n->out[0], x);
        return 0;
    }
    return ox_emit(n, n->out[0], "PermuteNode", &x, 1, perm, x->rank, 0, -1, err);
}

static int lower_identity(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    if (!x) return -1;
    alias(n->out[0], x);
    return 0;
}

static int lower_dropout(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    if (!x) return -1;
    if (n->n_in > 2 && n->in[2]) {
        int64_t mode;
        if (ox_known_ints(n, n->in[2], "training_mode", &mode, 1, err) < 0) return -1;
        if (mode)
            return ox_fail(n, err, MK_ERR_ARGUMENT, "training_mode is true (only inference "
                           "is supported)");
    }
    if (n->n_out > 1 && n->out[1])
        return ox_fail(n, err, MK_ERR_ARGUMENT, "the mask output '%s' is not supported",
                       n->out[1]->name);
    alias(n->out[0], x);
    return 0;
}

static int lower_constant(ox_node *n, mk_error **err) {
    const Onnx__NodeProto *p = n->proto;
    if (p->n_attribute != 1)
        return ox_fail(n, err, MK_ERR_ARGUMENT, "a Constant takes exactly one value attribute, "
                       "got %zu", p->n_attribute);
    const Onnx__AttributeProto *a = p->attribute[0];
    ox_value *out = n->out[0];
    if (!strcmp(a->name, "value")) {
        if (!(a = ox_attr(n, "value", ATTR_TENSOR, err))) return -1;
        if (!a->t) return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'value' holds no tensor");
        return ox_tensor_value(n, a->t, out, err);
    }
    bool list = !strcmp(a->name, "value_floats") || !strcmp(a->name, "value_ints");
    bool f = !strcmp(a->name, "value_float") || !strcmp(a->name, "value_floats");
    if (!ox_attr(n, a->name, f ? (list ? ATTR_FLOATS : ATTR_FLOAT) : (list ? ATTR_INTS : ATTR_INT),
                 err))
        return -1;
    int64_t count = list ? (int64_t)(f ? a->n_floats : a->n_ints) : 1;
    void *data = ox_set_known(n, out, f ? OX_FLOAT : OX_INT64, list ? 1 : 0, &count, err);
    if (!data) return -1;
    for (int64_t i = 0; i < count; i++) {
        if (f) ((float *)data)[i] = list ? a->floats[i] : a->f;
        else ((int64_t *)data)[i] = list ? a->ints[i] : a->i;
    }
    return 0;
}

static int lower_cast(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    int64_t to, sat;
    if (!x || ox_attr_int(n, "to", 0, &to, err) || ox_attr_int(n, "saturate", 1, &sat, err))
        return -1;
    mk_dtype d;
    if (known(x) && (x->dtype == MK_DTYPE_INT64 || x->onnx_type == OX_FLOAT) &&
        (to == OX_INT64 || to == OX_INT32 || to == OX_FLOAT)) {
        void *data = ox_set_known(n, n->out[0], (int)to, x->rank, x->shape, err);
        if (!data) return -1;
        mk_dtype held = n->out[0]->dtype;
        if (mk_convert(data, held, x->data, x->dtype, numel(x)))
            return ox_fail(n, err, MK_ERR_INTERNAL, "conversion");
        return 0;
    }
    if (ox_runtime_dtype((int)to, &d))
        return ox_fail(n, err, MK_ERR_DTYPE, "attribute 'to' = %s: moonkaas holds no such tensor "
                       "at run time", ox_type_name((int)to));
    if (x->onnx_type == (int)to) {
        alias(n->out[0], x);
        return 0;
    }
    return ox_emit(n, n->out[0], "CastNode", &x, 1, NULL, 0, d, x->rank, err);
}

/* Gather of known data and indices, any axis. */
static int fold_gather(ox_node *n, ox_value *x, ox_value *idx, int ax, mk_error **err) {
    int64_t shape[MK_MAX_RANK * 2];
    int r = 0;
    for (int i = 0; i < ax; i++) shape[r++] = x->shape[i];
    for (int i = 0; i < idx->rank; i++) shape[r++] = idx->shape[i];
    for (int i = ax + 1; i < x->rank; i++) shape[r++] = x->shape[i];
    char *data = ox_set_known(n, n->out[0], x->onnx_type, r, shape, err);
    if (!data) return -1;
    int64_t outer = 1, inner = 1, dim = x->shape[ax], count = numel(idx);
    for (int i = 0; i < ax; i++) outer *= x->shape[i];
    for (int i = ax + 1; i < x->rank; i++) inner *= x->shape[i];
    size_t es = mk_dtype_size(x->dtype);
    const int64_t *ids = idx->data;
    for (int64_t j = 0; j < count; j++)
        if (ids[j] < -dim || ids[j] >= dim)
            return ox_fail(n, err, MK_ERR_EVAL, "index %lld is outside [%lld, %lld)",
                           (long long)ids[j], (long long)-dim, (long long)dim);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < count; j++) {
            int64_t at = ids[j] < 0 ? ids[j] + dim : ids[j];
            memcpy(data + ((size_t)(o * count + j) * (size_t)inner) * es,
                   (const char *)x->data + ((size_t)(o * dim + at) * (size_t)inner) * es,
                   (size_t)inner * es);
        }
    return 0;
}

static int lower_gather(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err), *idx = x ? need(n, 1, err) : NULL;
    int64_t axis;
    int ax = 0;
    if (!idx || ox_attr_int(n, "axis", 0, &axis, err)) return -1;
    if (x->rank < 1) return ox_fail(n, err, MK_ERR_SHAPE, "Gather from a scalar");
    if (axis_of(n, axis, x->rank, "axis", &ax, err)) return -1;
    if (idx->dtype != MK_DTYPE_INT64 || !(idx->onnx_type == OX_INT64 || idx->onnx_type == OX_INT32))
        return ox_fail(n, err, MK_ERR_DTYPE, "indices must be INT64 or INT32, not %s",
                       ox_type_name(idx->onnx_type));
    int r = x->rank + idx->rank - 1;
    if (r > MK_MAX_RANK)
        return ox_fail(n, err, MK_ERR_SHAPE, "the result has rank %d (at most %d)", r,
                       MK_MAX_RANK);
    if (known(x) && known(idx)) return fold_gather(n, x, idx, ax, err);
    if (ax != 0 || !known(idx)) /* IndexSelectNode reads negative indices itself */
        return ox_emit(n, n->out[0], "IndexSelectNode", (ox_value *[]){x, idx}, 2,
                       (int64_t[]){ax}, 1, 0, r, err);
    /* rows of x as a table [V, D] picked by ids [count] (EmbeddingNode), then reshaped */
    int64_t count = numel(idx), inner = 1, shape[MK_MAX_RANK];
    for (int i = 1; i < x->rank; i++) inner *= x->shape[i];
    if (known(idx)) {
        const int64_t *ids = idx->data;
        int64_t *fixed = NULL;
        for (int64_t j = 0; j < count; j++) {
            if (ids[j] < -x->shape[0] || ids[j] >= x->shape[0])
                return ox_fail(n, err, MK_ERR_EVAL, "index %lld is outside [%lld, %lld)",
                               (long long)ids[j], (long long)-x->shape[0],
                               (long long)x->shape[0]);
            if (ids[j] < 0 && !fixed) {
                ox_value *c = scratch(n, err);
                if (!c || !(fixed = ox_set_known(n, c, OX_INT64, idx->rank, idx->shape, err)))
                    return -1;
                memcpy(fixed, ids, (size_t)count * sizeof *fixed);
                idx = c;
            }
            if (fixed && fixed[j] < 0) fixed[j] += x->shape[0];
        }
    }
    ox_value *table = x, *ids = idx, *rows;
    if (x->rank != 2 && (!(table = scratch(n, err)) ||
                         reshape_to(n, table, x, 2, (int64_t[]){x->shape[0], inner}, err)))
        return -1;
    if (idx->rank != 1 && (!(ids = scratch(n, err)) ||
                           reshape_to(n, ids, idx, 1, (int64_t[]){count}, err)))
        return -1;
    int k = 0;
    for (int i = 0; i < idx->rank; i++) shape[k++] = idx->shape[i];
    for (int i = 1; i < x->rank; i++) shape[k++] = x->shape[i];
    bool direct = x->rank == 2 && idx->rank == 1;
    if (!(rows = direct ? n->out[0] : scratch(n, err)) ||
        ox_emit(n, rows, "EmbeddingNode", (ox_value *[]){table, ids}, 2, NULL, 0, 0, -1, err))
        return -1;
    return direct ? 0 : reshape_to(n, n->out[0], rows, r, shape, err);
}

/* ONNX's rule for a slice's start and end on a dim: negative from the end,
 * then clamped to [0, dim] going forward, to [0, dim - 1] and [-1, dim - 1] back. */
static void slice_range(int64_t dim, int64_t *b, int64_t *e, int64_t step) {
    if (*b < 0) *b += dim;
    if (*e < 0) *e += dim;
    int64_t blo = 0, bhi = step > 0 ? dim : dim - 1, elo = step > 0 ? 0 : -1,
            ehi = step > 0 ? dim : dim - 1;
    *b = *b < blo ? blo : *b > bhi ? bhi : *b;
    *e = *e < elo ? elo : *e > ehi ? ehi : *e;
}

static int lower_slice(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    int64_t starts[MK_MAX_RANK], ends[MK_MAX_RANK], axes[MK_MAX_RANK], steps[MK_MAX_RANK];
    if (!x) return -1;
    if (x->rank < 1) return ox_fail(n, err, MK_ERR_SHAPE, "Slice of a scalar");
    int ns = ox_known_ints(n, n->n_in > 1 ? n->in[1] : NULL, "starts", starts, MK_MAX_RANK, err);
    int ne = ns < 0 ? -1 : ox_known_ints(n, n->n_in > 2 ? n->in[2] : NULL, "ends", ends,
                                         MK_MAX_RANK, err);
    if (ne < 0) return -1;
    if (ns != ne) return ox_fail(n, err, MK_ERR_SHAPE, "starts and ends differ in length");
    for (int i = 0; i < ns; i++) axes[i] = i, steps[i] = 1;
    if (n->n_in > 3 && n->in[3] &&
        ox_known_ints(n, n->in[3], "axes", axes, MK_MAX_RANK, err) != ns)
        return err && *err ? -1 : ox_fail(n, err, MK_ERR_SHAPE, "axes differ in length");
    if (n->n_in > 4 && n->in[4] &&
        ox_known_ints(n, n->in[4], "steps", steps, MK_MAX_RANK, err) != ns)
        return err && *err ? -1 : ox_fail(n, err, MK_ERR_SHAPE, "steps differ in length");
    int64_t b[MK_MAX_RANK], e[MK_MAX_RANK], st[MK_MAX_RANK], shape[MK_MAX_RANK];
    bool seen[MK_MAX_RANK] = {false};
    for (int d = 0; d < x->rank; d++) b[d] = 0, e[d] = x->shape[d], st[d] = 1;
    for (int i = 0; i < ns; i++) {
        int ax = 0;
        if (axis_of(n, axes[i], x->rank, "axis", &ax, err)) return -1;
        if (seen[ax]) return ox_fail(n, err, MK_ERR_SHAPE, "axis %d is sliced twice", ax);
        if (steps[i] == 0) return ox_fail(n, err, MK_ERR_SHAPE, "a step of 0");
        seen[ax] = true;
        b[ax] = starts[i], e[ax] = ends[i], st[ax] = steps[i];
        slice_range(x->shape[ax], &b[ax], &e[ax], st[ax]);
    }
    for (int d = 0; d < x->rank; d++) {
        int64_t len = st[d] > 0 ? (e[d] - b[d] + st[d] - 1) / st[d]
                                : (b[d] - e[d] - st[d] - 1) / -st[d];
        shape[d] = len > 0 ? len : 0;
    }
    if (known(x)) {
        char *data = ox_set_known(n, n->out[0], x->onnx_type, x->rank, shape, err);
        if (!data) return -1;
        int64_t total = numel(n->out[0]), idx[MK_MAX_RANK] = {0};
        size_t es = mk_dtype_size(x->dtype);
        for (int64_t k = 0; k < total; k++) {
            int64_t at = 0;
            for (int d = 0; d < x->rank; d++) at = at * x->shape[d] + b[d] + idx[d] * st[d];
            memcpy(data + (size_t)k * es, (const char *)x->data + (size_t)at * es, es);
            for (int d = x->rank - 1; d >= 0 && ++idx[d] == shape[d]; d--) idx[d] = 0;
        }
        return 0;
    }
    return ox_lower_slice_run(n, b, e, st, err);
}

static int lower_concat(ox_node *n, mk_error **err) {
    int64_t axis;
    int ax = 0;
    ox_value *first = need(n, 0, err);
    if (!first || ox_attr_int(n, "axis", 0, &axis, err)) return -1;
    for (int k = 0; k < n->n_in; k++)
        if (!known(n->in[k])) return ox_lower_concat_run(n, err);
    if (first->rank < 1) return ox_fail(n, err, MK_ERR_SHAPE, "Concat of scalars");
    if (axis_of(n, axis, first->rank, "axis", &ax, err)) return -1;
    int64_t shape[MK_MAX_RANK];
    memcpy(shape, first->shape, sizeof shape);
    shape[ax] = 0;
    for (int k = 0; k < n->n_in; k++) {
        const ox_value *v = n->in[k];
        bool ok = v->rank == first->rank && v->onnx_type == first->onnx_type;
        for (int d = 0; ok && d < v->rank; d++) ok = d == ax || v->shape[d] == first->shape[d];
        if (!ok)
            return ox_fail(n, err, MK_ERR_SHAPE, "input %d ('%s') differs in type, rank or a dim "
                           "other than the axis", k + 1, v->name);
        shape[ax] += v->shape[ax];
    }
    char *data = ox_set_known(n, n->out[0], first->onnx_type, first->rank, shape, err);
    if (!data) return -1;
    int64_t outer = 1;
    for (int d = 0; d < ax; d++) outer *= shape[d];
    size_t es = mk_dtype_size(first->dtype);
    for (int64_t o = 0; o < outer; o++)
        for (int k = 0; k < n->n_in; k++) {
            const ox_value *v = n->in[k];
            size_t chunk = (size_t)(numel(v) / outer) * es;
            memcpy(data, (const char *)v->data + (size_t)o * chunk, chunk);
            data += chunk;
        }
    return 0;
}

static int lower_shape(ox_node *n, mk_error **err) {
    ox_value *x = need(n, 0, err);
    int64_t start, end;
    if (!x || ox_attr_int(n, "start", 0, &start, err) ||
        ox_attr_int(n, "end", x->rank, &end, err))
        return -1;
    if (start < 0) start += x->rank;
    if (end < 0) end += x->rank;
    start = start < 0 ? 0 : start > x->rank ? x->rank : start;
    end = end < start ? start : end > x->rank ? x->rank : end;
    int64_t count = end - start;
    int64_t *data = ox_set_known(n, n->out[0], OX_INT64, 1, &count, err);
    if (!data) return -1;
    for (int64_t i = 0; i < count; i++) data[i] = x->shape[start + i];
    return 0;
}

/* ---- for onnx_nn.c's rows ---- */

ox_value *ox_need(ox_node *n, int k, mk_error **err) { return need(n, k, err); }
void ox_alias(ox_value *out, const ox_value *v) { alias(out, v); }
int ox_axis(ox_node *n, int64_t axis, int rank, const char *what, int *out, mk_error **err) {
    return axis_of(n, axis, rank, what, out, err);
}
int ox_reshape(ox_node *n, ox_value *out, ox_value *x, int rank, const int64_t *shape,
               mk_error **err) {
    return reshape_to(n, out, x, rank, shape, err);
}
int ox_matmul(ox_node *n, ox_value *out, ox_value *a, ox_value *b, mk_error **err) {
    return matmul(n, out, a, b, err);
}

/* ---- the table ------------------------------------------------------------------- */

#define ROW(op, since, until, attrs, becomes, rules, fn) \
    {{op, since, until, attrs, becomes, rules}, fn}

static const ox_row rows[] = {
    ROW("Add", 13, 21, "", "SumNode", "NumPy broadcasting; integers known at load are folded",
        lower_binary),
    ROW("Sub", 13, 21, "", "SubNode", "as Add", lower_binary),
    ROW("Mul", 13, 21, "", "HadamardProductNode", "as Add", lower_binary),
    ROW("Div", 13, 21, "", "DivNode", "as Add; floats only at run time", lower_binary),
    ROW("MatMul", 13, 21, "", "MatMulNode (ReshapeNode around it)",
        "numpy.matmul: batch dims broadcast, [k] vectors; a [..., m, k] by b [k, n] folds the "
        "batch into rows", lower_matmul),
    ROW("Gemm", 13, 21, "alpha beta transA transB",
        "MatMulNode, PermuteNode (transA/transB), HadamardProductNode (alpha, beta), SumNode (C)",
        "A and B matrices; C broadcasts to [M, N]", lower_gemm),
    ROW("Relu", 13, 21, "", "ReLUNode", "", lower_unary),
    ROW("Sigmoid", 13, 21, "", "SigmoidNode", "", lower_unary),
    ROW("Tanh", 13, 21, "", "TanhNode", "", lower_unary),
    ROW("Exp", 13, 21, "", "ExpNode", "", lower_unary),
    ROW("Softmax", 13, 21, "axis", "SoftmaxNode", "any axis", ox_lower_softmax),
    ROW("LogSoftmax", 13, 21, "axis", "LogSoftmaxNode", "any axis", ox_lower_softmax),
    ROW("Reshape", 13, 21, "allowzero", "ReshapeNode (a known tensor: folded)",
        "the shape known at load; 0 copies the input's dim, one -1 takes the rest",
        lower_reshape),
    ROW("Flatten", 13, 21, "axis", "ReshapeNode", "to [prod(dims before axis), prod(rest)]",
        lower_flatten),
    ROW("Squeeze", 13, 21, "", "ReshapeNode", "axes known at load (none: every dim of 1)",
        lower_squeeze),
    ROW("Unsqueeze", 13, 21, "", "ReshapeNode", "axes known at load; rank at most 4",
        lower_unsqueeze),
    ROW("Transpose", 13, 21, "perm", "PermuteNode", "perm defaults to the axes reversed",
        lower_transpose),
    ROW("Identity", 13, 21, "", "(the input itself)", "", lower_identity),
    ROW("Dropout", 13, 21, "seed", "(the input itself)",
        "inference: training_mode must be absent or false, the mask output unused",
        lower_dropout),
    ROW("Constant", 13, 21, "value value_float value_floats value_int value_ints",
        "ConstantTensor where a run-time node reads it", "strings and sparse values are errors",
        lower_constant),
    ROW("Cast", 13, 21, "to saturate", "CastNode (known integers and floats: folded)",
        "to FLOAT, INT64, FLOAT16, BFLOAT16, INT8 at run time", lower_cast),
    ROW("Gather", 13, 21, "axis",
        "EmbeddingNode (axis 0, known indices), IndexSelectNode (else); known: folded",
        "any axis; indices INT64 or INT32, negative from the end", lower_gather),
    ROW("Slice", 13, 21, "", "SliceAxisNode per axis sliced (known: folded)",
        "starts, ends, axes, steps known at load; run-time data: any axes, positive steps; "
        "known data: any steps, folded", lower_slice),
    ROW("Concat", 13, 21, "axis", "ConcatNode chain (all known: folded)",
        "any count of inputs", lower_concat),
    ROW("Shape", 13, 21, "start end", "(folded: shapes are fixed at load)", "", lower_shape),
    /* ---- networks' ops (onnx_nn.c) ---- */
    ROW("Sqrt", 13, 21, "", "SqrtNode", "", ox_lower_pointwise),
    ROW("Neg", 13, 21, "", "NegNode", "", ox_lower_pointwise),
    ROW("Abs", 13, 21, "", "AbsNode", "", ox_lower_pointwise),
    ROW("Erf", 13, 21, "", "ErfNode", "", ox_lower_pointwise),
    ROW("Log", 13, 21, "", "LogNode", "", ox_lower_pointwise),
    ROW("Reciprocal", 13, 21, "", "ReciprocalNode", "", ox_lower_pointwise),
    ROW("Floor", 13, 21, "", "FloorNode", "", ox_lower_pointwise),
    ROW("Ceil", 13, 21, "", "CeilNode", "", ox_lower_pointwise),
    ROW("Not", 13, 21, "", "LogicalNotNode", "BOOL", ox_lower_pointwise),
    ROW("Pow", 13, 21, "", "PowNode", "NumPy broadcasting; same types", ox_lower_pointwise),
    ROW("Equal", 13, 21, "", "EqualNode", "BOOL result, NumPy broadcasting",
        ox_lower_pointwise),
    ROW("Less", 13, 21, "", "LessNode", "as Equal", ox_lower_pointwise),
    ROW("Greater", 13, 21, "", "GreaterNode", "as Equal", ox_lower_pointwise),
    ROW("LessOrEqual", 13, 21, "", "LessEqualNode", "as Equal", ox_lower_pointwise),
    ROW("GreaterOrEqual", 13, 21, "", "GreaterEqualNode", "as Equal", ox_lower_pointwise),
    ROW("And", 13, 21, "", "LogicalAndNode", "BOOL", ox_lower_pointwise),
    ROW("Or", 13, 21, "", "LogicalOrNode", "BOOL", ox_lower_pointwise),
    ROW("Where", 13, 21, "", "WhereNode", "BOOL condition; NumPy broadcasting", ox_lower_where),
    ROW("LeakyRelu", 13, 21, "alpha", "LeakyReLUNode", "", ox_lower_leaky_relu),
    ROW("Gelu", 20, 21, "approximate", "GELUErfNode (none), GELUNode (tanh)", "",
        ox_lower_gelu),
    ROW("Clip", 13, 21, "", "ClampNode (MaximumNode, MinimumNode with one bound)",
        "min and max inputs optional", ox_lower_clip),
    ROW("Min", 13, 21, "", "MinimumNode chain", "any count of inputs", ox_lower_minmax),
    ROW("Max", 13, 21, "", "MaximumNode chain", "any count of inputs", ox_lower_minmax),
    ROW("ReduceSum", 13, 21, "keepdims noop_with_empty_axes", "ReduceSumNode (ReshapeNode)",
        "axes as the second input, known at load; none: all (or the input itself with "
        "noop_with_empty_axes)", ox_lower_reduce),
    ROW("ReduceMean", 13, 21, "axes keepdims noop_with_empty_axes",
        "ReduceMeanNode (ReshapeNode)", "axes the attribute to opset 17, the second input "
        "from 18", ox_lower_reduce),
    ROW("ReduceMax", 13, 21, "axes keepdims noop_with_empty_axes",
        "ReduceMaxNode (ReshapeNode)", "as ReduceMean", ox_lower_reduce),
    ROW("LayerNormalization", 17, 21, "axis epsilon stash_type", "LayerNormNode",
        "the first output only (Mean, InvStdDev: errors)", ox_lower_layer_norm),
    ROW("BatchNormalization", 13, 21, "epsilon momentum training_mode", "BatchNormNode",
        "inference: training_mode 0, the first output only", ox_lower_batch_norm),
    ROW("Conv", 13, 21, "auto_pad dilations group kernel_shape pads strides",
        "Conv1dNode, Conv2dNode (PadNode for uneven pads, SumNode for the bias)",
        "1-D and 2-D; auto_pad NOTSET, VALID, SAME_UPPER, SAME_LOWER", ox_lower_conv),
    ROW("ConvTranspose", 13, 21, "auto_pad dilations group kernel_shape output_padding pads "
        "strides", "ConvTranspose2dNode (SumNode for the bias)",
        "2-D; even pads; auto_pad NOTSET or VALID; output_shape is an error",
        ox_lower_conv_transpose),
    ROW("MaxPool", 13, 21, "auto_pad ceil_mode dilations kernel_shape pads storage_order "
        "strides", "MaxPool2dNode (PadNode of -inf for uneven pads)",
        "1-D and 2-D; ceil_mode 0; the Indices output is an error", ox_lower_pool),
    ROW("AveragePool", 13, 21, "auto_pad ceil_mode count_include_pad kernel_shape pads "
        "strides", "AvgPool2dNode (count_include_pad 0: divided by the pool of ones)",
        "1-D and 2-D; ceil_mode 0", ox_lower_pool),
    ROW("GlobalAveragePool", 13, 21, "", "ReduceMeanNode", "over every axis after N, C",
        ox_lower_global_pool),
    ROW("GlobalMaxPool", 13, 21, "", "ReduceMaxNode", "as GlobalAveragePool",
        ox_lower_global_pool),
    ROW("Split", 13, 21, "axis num_outputs", "SliceAxisNode per output",
        "split sizes as the second input (known), else even parts (num_outputs from 18)",
        ox_lower_split),
    ROW("Expand", 13, 21, "", "ExpandNode", "the shape known at load", ox_lower_expand),
    ROW("Tile", 13, 21, "", "TileNode", "repeats known at load", ox_lower_tile),
    ROW("Pad", 13, 21, "mode", "PadNode per axis padded",
        "mode constant, reflect, edge; pads (and axes, from 18) known, not negative; "
        "constant_value a known FLOAT", ox_lower_pad),
    ROW("Resize", 13, 21, "coordinate_transformation_mode mode nearest_mode",
        "UpsampleNearest2dNode", "nearest, [N, C, H, W], integer scales of H and W (scales or "
        "sizes known)", ox_lower_resize),
    ROW("Range", 13, 21, "", "(folded)", "start, limit, delta known at load",
        ox_lower_range),
    ROW("ConstantOfShape", 13, 21, "value", "(folded)", "the shape known at load",
        ox_lower_constant_of_shape),
    ROW("LSTM", 13, 21, "activation_alpha activation_beta activations clip direction hidden_size "
        "input_forget layout", "MatMulNode, SigmoidNode, TanhNode... unrolled per step",
        "forward, reverse, bidirectional; the default activations, no clip or peepholes; "
        "sequence_lens absent or the whole length; at most 512 steps", ox_lower_lstm),
};
#define N_ROWS (sizeof rows / sizeof rows[0])

const ox_row *ox_find_row(const char *op_type, int opset, bool *other_opset) {
    *other_opset = false;
    for (size_t i = 0; i < N_ROWS; i++) {
        if (strcmp(rows[i].desc.op_type, op_type)) continue;
        if (opset >= rows[i].desc.since && opset <= rows[i].desc.until) return &rows[i];
        *other_opset = true;
    }
    return NULL;
}

MK_API size_t mk_onnx_op_count(void) { return N_ROWS; }
MK_API const mk_onnx_op_desc *mk_onnx_op_info(size_t i) {
    return i < N_ROWS ? &rows[i].desc : NULL;
}
