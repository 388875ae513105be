/*
 * onnx_nn.c — the mapping table's rows for the ops networks are made of:
 * pointwise math and comparisons, reductions, softmax on any axis, the
 * norms, convolution and pooling, and run-time data movement (Concat, Split,
 * Slice, Expand, Tile, Pad, Resize). The rows themselves are in onnx_ops.c's
 * table; each function here reads its node's attributes and emits moonkaas
 * ops with ox_emit. What a row cannot do exactly is an error naming the node.
 */
#include "onnx.h"
#include "onnx.pb-c.h"

#include <math.h>
#include <string.h>

#define ATTR_FLOAT 1
#define ATTR_INT 2
#define ATTR_STRING 3
#define ATTR_INTS 7

static bool known(const ox_value *v) { return v && v->data; }
static ox_value *opt(ox_node *n, int k) { return k < n->n_in ? n->in[k] : NULL; }
static bool is(ox_node *n, const char *t) { return !strcmp(n->proto->op_type, t); }

static int emit1(ox_node *n, ox_value *out, const char *op, ox_value *x, mk_error **err) {
    return ox_emit(n, out, op, &x, 1, NULL, 0, 0, x->rank, err);
}

static int emit2(ox_node *n, ox_value *out, const char *op, ox_value *a, ox_value *b,
                 mk_error **err) {
    int rank = a->rank > b->rank ? a->rank : b->rank;
    return ox_emit(n, out, op, (ox_value *[]){a, b}, 2, NULL, 0, 0, rank, err);
}

static ox_value *f32(ox_node *n, double v, mk_error **err) {
    return ox_known_scalar(n, OX_FLOAT, v, err);
}

/* An ints attribute into out (at most max): its count, def_count where absent, -1 on error. */
static int attr_ints(ox_node *n, const char *name, int64_t *out, int max, mk_error **err) {
    const Onnx__AttributeProto *a = ox_attr(n, name, ATTR_INTS, err);
    if (err && *err) return -1;
    if (!a) return 0;
    if (a->n_ints > (size_t)max)
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute '%s' has %zu values (at most %d)",
                       name, a->n_ints, max);
    memcpy(out, a->ints, sizeof(int64_t) * a->n_ints);
    return (int)a->n_ints;
}

/* A string attribute, def where absent; NULL on error. */
static const char *attr_str(ox_node *n, const char *name, const char *def, char *buf,
                            size_t size, mk_error **err) {
    const Onnx__AttributeProto *a = ox_attr(n, name, ATTR_STRING, err);
    if (err && *err) return NULL;
    if (!a) return def;
    size_t len = a->s.len < size - 1 ? a->s.len : size - 1;
    memcpy(buf, a->s.data, len);
    buf[len] = 0;
    return buf;
}

/* ---- pointwise --------------------------------------------------------------- */

static const struct { const char *onnx, *mk; int arity; } pointwise[] = {
    {"Sqrt", "SqrtNode", 1},     {"Neg", "NegNode", 1},         {"Abs", "AbsNode", 1},
    {"Erf", "ErfNode", 1},       {"Not", "LogicalNotNode", 1},  {"Log", "LogNode", 1},
    {"Reciprocal", "ReciprocalNode", 1}, {"Floor", "FloorNode", 1}, {"Ceil", "CeilNode", 1},
    {"Pow", "PowNode", 2},       {"Equal", "EqualNode", 2},     {"Less", "LessNode", 2},
    {"Greater", "GreaterNode", 2}, {"LessOrEqual", "LessEqualNode", 2},
    {"GreaterOrEqual", "GreaterEqualNode", 2}, {"And", "LogicalAndNode", 2},
    {"Or", "LogicalOrNode", 2},
};

int ox_lower_pointwise(ox_node *n, mk_error **err) {
    for (size_t i = 0; i < sizeof pointwise / sizeof pointwise[0]; i++) {
        if (!is(n, pointwise[i].onnx)) continue;
        ox_value *a = ox_need(n, 0, err), *b = NULL;
        if (!a) return -1;
        if (pointwise[i].arity == 1) return emit1(n, n->out[0], pointwise[i].mk, a, err);
        if (!(b = ox_need(n, 1, err))) return -1;
        return emit2(n, n->out[0], pointwise[i].mk, a, b, err);
    }
    return MK_INTERNAL(err, "a pointwise row the list lacks");
}

int ox_lower_where(ox_node *n, mk_error **err) {
    ox_value *c = ox_need(n, 0, err), *a = c ? ox_need(n, 1, err) : NULL,
             *b = a ? ox_need(n, 2, err) : NULL;
    if (!b) return -1;
    int rank = c->rank > a->rank ? c->rank : a->rank;
    rank = rank > b->rank ? rank : b->rank;
    return ox_emit(n, n->out[0], "WhereNode", (ox_value *[]){c, a, b}, 3, NULL, 0, 0, rank, err);
}

int ox_lower_leaky_relu(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err), *al;
    float alpha;
    if (!x || ox_attr_float(n, "alpha", 0.01f, &alpha, err) || !(al = f32(n, alpha, err)))
        return -1;
    return ox_emit(n, n->out[0], "LeakyReLUNode", (ox_value *[]){x, al}, 2, NULL, 0, 0, x->rank,
                   err);
}

int ox_lower_gelu(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err);
    char buf[16];
    const char *ap = x ? attr_str(n, "approximate", "none", buf, sizeof buf, err) : NULL;
    if (!ap) return -1;
    if (strcmp(ap, "none") && strcmp(ap, "tanh"))
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'approximate' = '%s' (none or tanh)",
                       ap);
    return emit1(n, n->out[0], strcmp(ap, "tanh") ? "GELUErfNode" : "GELUNode", x, err);
}

int ox_lower_clip(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err), *lo = opt(n, 1), *hi = opt(n, 2);
    if (!x) return -1;
    if (lo && hi)
        return ox_emit(n, n->out[0], "ClampNode", (ox_value *[]){x, lo, hi}, 3, NULL, 0, 0,
                       x->rank, err);
    if (lo) return emit2(n, n->out[0], "MaximumNode", x, lo, err);
    if (hi) return emit2(n, n->out[0], "MinimumNode", x, hi, err);
    ox_alias(n->out[0], x);
    return 0;
}

/* Min and Max of any count of inputs: a chain of MinimumNode or MaximumNode. */
int ox_lower_minmax(ox_node *n, mk_error **err) {
    ox_value *acc = ox_need(n, 0, err);
    if (!acc) return -1;
    const char *op = is(n, "Min") ? "MinimumNode" : "MaximumNode";
    if (n->n_in == 1) {
        ox_alias(n->out[0], acc);
        return 0;
    }
    for (int k = 1; k < n->n_in; k++) {
        ox_value *b = ox_need(n, k, err), *y = k == n->n_in - 1 ? n->out[0] : ox_temp(n, err);
        if (!b || !y || emit2(n, y, op, acc, b, err)) return -1;
        acc = y;
    }
    return 0;
}

/* ---- reductions and norms ---------------------------------------------------- */

int ox_lower_softmax(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err);
    int64_t axis;
    int ax = 0;
    if (!x || ox_attr_int(n, "axis", -1, &axis, err)) return -1;
    if (x->rank < 1) return ox_fail(n, err, MK_ERR_SHAPE, "%s of a scalar", n->proto->op_type);
    if (ox_axis(n, axis, x->rank, "axis", &ax, err)) return -1;
    return ox_emit(n, n->out[0], is(n, "Softmax") ? "SoftmaxNode" : "LogSoftmaxNode", &x, 1,
                   (int64_t[]){ax}, 1, 0, x->rank, err);
}

/* ReduceSum/Mean/Max: axes as the attribute (ReduceMean and ReduceMax to
 * opset 17) or the second input (ReduceSum from 13, the others from 18). */
int ox_lower_reduce(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err);
    int64_t keep, noop, axes[MK_MAX_RANK];
    if (!x || ox_attr_int(n, "keepdims", 1, &keep, err) ||
        ox_attr_int(n, "noop_with_empty_axes", 0, &noop, err))
        return -1;
    bool by_input = is(n, "ReduceSum") || n->opset >= 18;
    int na = 0;
    if (by_input) {
        const Onnx__AttributeProto *a = ox_attr(n, "axes", ATTR_INTS, err);
        if (err && *err) return -1;
        if (a)
            return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'axes': from this opset the "
                           "axes are the second input");
        if (opt(n, 1) && (na = ox_known_ints(n, n->in[1], "axes", axes, MK_MAX_RANK, err)) < 0)
            return -1;
    } else if ((na = attr_ints(n, "axes", axes, MK_MAX_RANK, err)) < 0) {
        return -1;
    }
    if (na == 0 && noop) {
        ox_alias(n->out[0], x);
        return 0;
    }
    int64_t list[MK_MAX_RANK], shape[MK_MAX_RANK];
    bool drop[MK_MAX_RANK] = {false};
    if (na == 0)
        for (int d = 0; d < x->rank; d++) axes[na++] = d;
    for (int i = 0; i < na; i++) {
        int ax = 0;
        if (ox_axis(n, axes[i], x->rank, "axis", &ax, err)) return -1;
        if (drop[ax]) return ox_fail(n, err, MK_ERR_SHAPE, "axis %d is listed twice", ax);
        drop[ax] = true;
        list[i] = ax;
    }
    const char *op = is(n, "ReduceSum") ? "ReduceSumNode" : is(n, "ReduceMean")
                   ? "ReduceMeanNode" : "ReduceMaxNode";
    ox_value *y = keep ? n->out[0] : ox_temp(n, err);
    if (!y || ox_emit(n, y, op, &x, 1, list, na, 0, x->rank, err)) return -1;
    if (keep) return 0;
    int r = 0;
    for (int d = 0; d < x->rank; d++)
        if (!drop[d]) shape[r++] = x->shape[d];
    return ox_reshape(n, n->out[0], y, r, shape, err);
}

static int unused_outputs(ox_node *n, mk_error **err) {
    for (int k = 1; k < n->n_out; k++)
        if (n->out[k])
            return ox_fail(n, err, MK_ERR_ARGUMENT, "output %d ('%s') is not supported "
                           "(inference: the first output only)", k + 1, n->out[k]->name);
    return 0;
}

int ox_lower_layer_norm(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err), *w = x ? ox_need(n, 1, err) : NULL, *b = opt(n, 2), *e;
    int64_t axis, stash;
    float eps;
    int ax = 0;
    if (!w || ox_attr_int(n, "axis", -1, &axis, err) ||
        ox_attr_int(n, "stash_type", 1, &stash, err) ||
        ox_attr_float(n, "epsilon", 1e-5f, &eps, err) || unused_outputs(n, err))
        return -1;
    if (ox_axis(n, axis, x->rank, "axis", &ax, err) || !(e = f32(n, eps, err))) return -1;
    if (!b && !(b = f32(n, 0, err))) return -1;
    return ox_emit(n, n->out[0], "LayerNormNode", (ox_value *[]){x, w, b, e}, 4,
                   (int64_t[]){x->rank - ax}, 1, 0, x->rank, err);
}

int ox_lower_batch_norm(ox_node *n, mk_error **err) {
    ox_value *in[5];
    int64_t training;
    float eps, momentum;
    for (int k = 0; k < 5; k++)
        if (!(in[k] = ox_need(n, k, err))) return -1;
    if (ox_attr_int(n, "training_mode", 0, &training, err) ||
        ox_attr_float(n, "epsilon", 1e-5f, &eps, err) ||
        ox_attr_float(n, "momentum", 0.9f, &momentum, err) || unused_outputs(n, err))
        return -1;
    if (training)
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'training_mode' = 1 (inference only)");
    ox_value *e = f32(n, eps, err);
    if (!e) return -1;
    /* ONNX: X, scale, B, mean, var; BatchNormNode: x, mean, var, weight, bias, eps */
    return ox_emit(n, n->out[0], "BatchNormNode", (ox_value *[]){in[0], in[3], in[4], in[1],
                   in[2], e}, 6, NULL, 0, 0, in[0]->rank, err);
}

/* ---- convolution and pooling -------------------------------------------------- */

/* The window attributes of a 2-D Conv, ConvTranspose or pool (1-D: H of 1). */
typedef struct {
    int64_t k[2], s[2], d[2], p[4]; /* p: h begin, w begin, h end, w end */
} window;

static int read_window(ox_node *n, ox_value *x, const int64_t *kernel, window *w,
                       bool transpose, mk_error **err) {
    int sp = x->rank - 2;
    if (sp != 1 && sp != 2)
        return ox_fail(n, err, MK_ERR_SHAPE, "input of rank %d: 1-D and 2-D windows only "
                       "([N, C, L] or [N, C, H, W])", x->rank);
    int64_t v[4];
    int c;
    for (int i = 0; i < 2; i++) w->k[i] = 1, w->s[i] = 1, w->d[i] = 1;
    memset(w->p, 0, sizeof w->p);
    int off = 2 - sp; /* 1-D: the values go to w's second place */
    for (int i = 0; i < sp; i++) w->k[off + i] = kernel[i];
    if ((c = attr_ints(n, "strides", v, 2, err)) < 0) return -1;
    for (int i = 0; i < c; i++) w->s[off + i] = v[i];
    if ((c = attr_ints(n, "dilations", v, 2, err)) < 0) return -1;
    for (int i = 0; i < c; i++) w->d[off + i] = v[i];
    if ((c = attr_ints(n, "pads", v, 4, err)) < 0) return -1;
    if (c && c != 2 * sp)
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'pads' has %d values, not %d", c,
                       2 * sp);
    for (int i = 0; i < sp && c; i++) w->p[off + i] = v[i], w->p[2 + off + i] = v[sp + i];
    char buf[16];
    const char *ap = attr_str(n, "auto_pad", "NOTSET", buf, sizeof buf, err);
    if (!ap) return -1;
    if (!strcmp(ap, "NOTSET")) return 0;
    if (c) return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'pads' with auto_pad '%s'", ap);
    if (!strcmp(ap, "VALID")) return 0;
    if (transpose || (strcmp(ap, "SAME_UPPER") && strcmp(ap, "SAME_LOWER")))
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'auto_pad' = '%s' is not supported "
                       "(NOTSET, VALID, SAME_UPPER, SAME_LOWER%s)", ap,
                       transpose ? "; ConvTranspose: NOTSET and VALID" : "");
    for (int i = 0; i < 2; i++) {
        int64_t in = i < off ? 1 : x->shape[2 + i - off];
        int64_t out = (in + w->s[i] - 1) / w->s[i];
        int64_t total = (out - 1) * w->s[i] + w->d[i] * (w->k[i] - 1) + 1 - in;
        if (total < 0) total = 0;
        int64_t small = total / 2, big = total - small;
        bool upper = !strcmp(ap, "SAME_UPPER");
        w->p[i] = upper ? small : big, w->p[2 + i] = upper ? big : small;
    }
    return 0;
}

/* x padded with zeros (or value) where the window's pads are uneven; *sym the even part. */
static int pad_uneven(ox_node *n, ox_value **x, window *w, double value, int64_t sym[2],
                      mk_error **err) {
    int sp = (*x)->rank - 2, off = 2 - sp;
    for (int i = off; i < 2; i++) {
        int64_t b = w->p[i], e = w->p[2 + i], s = b < e ? b : e;
        sym[i] = s;
        if (b == e) continue;
        ox_value *v = f32(n, value, err), *y = ox_temp(n, err), *in = *x;
        if (!v || !y ||
            ox_emit(n, y, "PadNode", (ox_value *[]){in, v}, 2,
                    (int64_t[]){2 + i - off, b - s, e - s, 0}, 4, 0, in->rank, err))
            return -1;
        *x = y;
    }
    if (off) sym[0] = 0;
    return 0;
}

static int add_bias(ox_node *n, ox_value *y, ox_value *bias, mk_error **err) {
    int64_t shape[MK_MAX_RANK] = {bias->shape[0], 1, 1};
    ox_value *b2 = ox_temp(n, err);
    if (!b2 || ox_reshape(n, b2, bias, y->rank - 1, shape, err)) return -1;
    return emit2(n, n->out[0], "SumNode", y, b2, err);
}

int ox_lower_conv(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err), *wt = x ? ox_need(n, 1, err) : NULL, *bias = opt(n, 2);
    int64_t group, ks[2];
    window w;
    if (!wt || ox_attr_int(n, "group", 1, &group, err)) return -1;
    int nk = attr_ints(n, "kernel_shape", ks, 2, err);
    if (nk < 0) return -1;
    if (wt->rank != x->rank)
        return ox_fail(n, err, MK_ERR_SHAPE, "W has rank %d, X %d", wt->rank, x->rank);
    if (read_window(n, x, wt->shape + 2, &w, false, err)) return -1;
    for (int i = 0; i < nk; i++)
        if (ks[i] != wt->shape[2 + i])
            return ox_fail(n, err, MK_ERR_SHAPE, "kernel_shape differs from W's dims");
    int64_t sym[2];
    if (pad_uneven(n, &x, &w, 0, sym, err)) return -1;
    ox_value *y = bias ? ox_temp(n, err) : n->out[0];
    if (!y) return -1;
    if (x->rank == 3) {
        if (ox_emit(n, y, "Conv1dNode", (ox_value *[]){x, wt}, 2,
                    (int64_t[]){w.s[1], sym[1], w.d[1], group}, 4, 0, 3, err))
            return -1;
    } else if (ox_emit(n, y, "Conv2dNode", (ox_value *[]){x, wt}, 2,
                       (int64_t[]){w.s[0], w.s[1], sym[0], sym[1], w.d[0], w.d[1], group}, 7,
                       0, 4, err)) {
        return -1;
    }
    return bias ? add_bias(n, y, bias, err) : 0;
}

int ox_lower_conv_transpose(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err), *wt = x ? ox_need(n, 1, err) : NULL, *bias = opt(n, 2);
    int64_t group, op[2] = {0, 0}, v[2];
    window w;
    if (!wt || ox_attr_int(n, "group", 1, &group, err)) return -1;
    if (x->rank != 4)
        return ox_fail(n, err, MK_ERR_SHAPE, "input of rank %d: 2-D only ([N, C, H, W])",
                       x->rank);
    if (read_window(n, x, wt->shape + 2, &w, true, err)) return -1;
    int c = attr_ints(n, "output_padding", v, 2, err);
    if (c < 0 || attr_ints(n, "kernel_shape", (int64_t[2]){0}, 2, err) < 0) return -1;
    for (int i = 0; i < c; i++) op[i] = v[i];
    const Onnx__AttributeProto *os = ox_attr(n, "output_shape", ATTR_INTS, err);
    if (err && *err) return -1;
    if (os) return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'output_shape' is not supported "
                           "(give pads)");
    if (w.p[0] != w.p[2] || w.p[1] != w.p[3])
        return ox_fail(n, err, MK_ERR_ARGUMENT, "uneven pads are not supported");
    ox_value *y = bias ? ox_temp(n, err) : n->out[0];
    if (!y ||
        ox_emit(n, y, "ConvTranspose2dNode", (ox_value *[]){x, wt}, 2,
                (int64_t[]){w.s[0], w.s[1], w.p[0], w.p[1], op[0], op[1], w.d[0], w.d[1], group},
                9, 0, 4, err))
        return -1;
    return bias ? add_bias(n, y, bias, err) : 0;
}

int ox_lower_pool(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err);
    int64_t ks[2], ceil_mode, include = 0, order = 0;
    window w;
    bool max = is(n, "MaxPool");
    if (!x || ox_attr_int(n, "ceil_mode", 0, &ceil_mode, err) ||
        (!max && ox_attr_int(n, "count_include_pad", 0, &include, err)) ||
        (max && ox_attr_int(n, "storage_order", 0, &order, err)) || unused_outputs(n, err))
        return -1;
    int nk = attr_ints(n, "kernel_shape", ks, 2, err);
    if (nk < 0) return -1;
    if (nk != x->rank - 2)
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'kernel_shape' has %d values for "
                       "input rank %d", nk, x->rank);
    if (ceil_mode)
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'ceil_mode' = 1 is not supported");
    if (read_window(n, x, ks, &w, false, err)) return -1;
    if (!max && (w.d[0] != 1 || w.d[1] != 1))
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'dilations' of AveragePool");
    ox_value *x4 = x;
    int64_t sym[2];
    bool one_d = x->rank == 3;
    if (one_d && (!(x4 = ox_temp(n, err)) ||
                  ox_reshape(n, x4, x, 4, (int64_t[]){x->shape[0], x->shape[1], 1, x->shape[2]},
                             err)))
        return -1;
    if (one_d) w.p[0] = w.p[2] = 0;
    window w0 = w; /* the pads before pad_uneven evens them */
    ox_value *padded = x4;
    if (pad_uneven(n, &padded, &w, max ? -INFINITY : 0, sym, err)) return -1;
    bool divide = !max && !include && (w0.p[0] || w0.p[1] || w0.p[2] || w0.p[3]);
    ox_value *y = one_d || divide ? ox_temp(n, err) : n->out[0];
    if (!y) return -1;
    int64_t a[8] = {w.k[0], w.k[1], w.s[0], w.s[1], sym[0], sym[1], w.d[0], w.d[1]};
    if (ox_emit(n, y, max ? "MaxPool2dNode" : "AvgPool2dNode", &padded, 1, a, max ? 8 : 6, 0, 4,
                err))
        return -1;
    if (divide) {
        /* the padding left out of the count: divided by the same pool of ones padded
         * alike (each window's share inside x) */
        int64_t hw[4] = {1, 1, x4->shape[2], x4->shape[3]};
        ox_value *ones = ox_temp(n, err), *cnt = ones ? ox_temp(n, err) : NULL,
                 *q = one_d ? ox_temp(n, err) : n->out[0];
        float *p = cnt && q ? ox_set_known(n, ones, OX_FLOAT, 4, hw, err) : NULL;
        if (!p) return -1;
        for (int64_t i = 0; i < hw[2] * hw[3]; i++) p[i] = 1;
        window w1 = w0;
        int64_t sym1[2];
        if (pad_uneven(n, &ones, &w1, 0, sym1, err) ||
            ox_emit(n, cnt, "AvgPool2dNode", &ones, 1, a, 6, 0, 4, err) ||
            emit2(n, q, "DivNode", y, cnt, err))
            return -1;
        y = q;
    }
    if (!one_d) return 0;
    return ox_reshape(n, n->out[0], y, 3, (int64_t[]){y->shape[0], y->shape[1], y->shape[3]},
                      err);
}

int ox_lower_global_pool(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err);
    if (!x) return -1;
    if (x->rank < 3)
        return ox_fail(n, err, MK_ERR_SHAPE, "input of rank %d (at least [N, C, L])", x->rank);
    int64_t axes[MK_MAX_RANK];
    for (int d = 2; d < x->rank; d++) axes[d - 2] = d;
    const char *op = is(n, "GlobalAveragePool") ? "ReduceMeanNode" : "ReduceMaxNode";
    return ox_emit(n, n->out[0], op, &x, 1, axes, x->rank - 2, 0, x->rank, err);
}

/* ---- data movement ------------------------------------------------------------ */

int ox_lower_concat_run(ox_node *n, mk_error **err) {
    int64_t axis;
    ox_value *acc = ox_need(n, 0, err);
    int ax = 0;
    if (!acc || ox_attr_int(n, "axis", 0, &axis, err)) return -1;
    if (ox_axis(n, axis, acc->rank, "axis", &ax, err)) return -1;
    if (n->n_in == 1) {
        ox_alias(n->out[0], acc);
        return 0;
    }
    for (int k = 1; k < n->n_in; k++) {
        ox_value *b = ox_need(n, k, err), *y = k == n->n_in - 1 ? n->out[0] : ox_temp(n, err);
        if (!b || !y ||
            ox_emit(n, y, "ConcatNode", (ox_value *[]){acc, b}, 2, (int64_t[]){ax}, 1, 0,
                    acc->rank, err))
            return -1;
        acc = y;
    }
    return 0;
}

int ox_lower_split(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err);
    int64_t axis, num = 0, sizes[4];
    int ax = 0, count = n->n_out;
    if (!x || ox_attr_int(n, "axis", 0, &axis, err)) return -1;
    if (n->opset >= 18 && ox_attr_int(n, "num_outputs", 0, &num, err)) return -1;
    if (ox_axis(n, axis, x->rank, "axis", &ax, err)) return -1;
    int64_t dim = x->shape[ax];
    if (opt(n, 1)) {
        int ns = ox_known_ints(n, n->in[1], "split", sizes, 4, err);
        if (ns < 0) return -1;
        if (ns != count)
            return ox_fail(n, err, MK_ERR_SHAPE, "split has %d sizes for %d outputs", ns, count);
    } else {
        if (num && num != count)
            return ox_fail(n, err, MK_ERR_SHAPE, "num_outputs %lld, but %d outputs",
                           (long long)num, count);
        int64_t each = (dim + count - 1) / count;
        for (int k = 0; k < count; k++)
            sizes[k] = each * (k + 1) <= dim ? each : dim - each * k > 0 ? dim - each * k : 0;
    }
    int64_t at = 0;
    for (int k = 0; k < count; k++) at += sizes[k];
    if (at != dim)
        return ox_fail(n, err, MK_ERR_SHAPE, "the sizes add to %lld, axis %d has %lld",
                       (long long)at, ax, (long long)dim);
    at = 0;
    for (int k = 0; k < count; k++) {
        if (sizes[k] < 1)
            return ox_fail(n, err, MK_ERR_SHAPE, "output %d would be empty", k + 1);
        if (n->out[k] &&
            ox_emit(n, n->out[k], "SliceAxisNode", &x, 1,
                    (int64_t[]){ax, at, at + sizes[k], 1}, 4, 0, x->rank, err))
            return -1;
        at += sizes[k];
    }
    return 0;
}

/* Slice of run-time data: a SliceAxisNode per axis sliced (begins and ends
 * already clamped by ONNX's rule), positive steps. */
int ox_lower_slice_run(ox_node *n, const int64_t *b, const int64_t *e, const int64_t *st,
                       mk_error **err) {
    ox_value *x = n->in[0], *acc = x;
    int last = -1;
    for (int d = 0; d < x->rank; d++)
        if (b[d] != 0 || e[d] != x->shape[d] || st[d] != 1) last = d;
    if (last < 0) {
        ox_alias(n->out[0], x);
        return 0;
    }
    for (int d = 0; d <= last; d++) {
        if (b[d] == 0 && e[d] == x->shape[d] && st[d] == 1) continue;
        if (st[d] < 0)
            return ox_fail(n, err, MK_ERR_ARGUMENT, "a negative step (%lld) on run-time data is "
                           "not supported", (long long)st[d]);
        if (e[d] <= b[d])
            return ox_fail(n, err, MK_ERR_SHAPE, "the slice of axis %d is empty", d);
        ox_value *y = d == last ? n->out[0] : ox_temp(n, err);
        if (!y || ox_emit(n, y, "SliceAxisNode", &acc, 1, (int64_t[]){d, b[d], e[d], st[d]}, 4,
                          0, x->rank, err))
            return -1;
        acc = y;
    }
    return 0;
}

int ox_lower_expand(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err);
    int64_t shape[MK_MAX_RANK], out[MK_MAX_RANK];
    if (!x) return -1;
    int r = ox_known_ints(n, opt(n, 1), "the shape", shape, MK_MAX_RANK, err);
    if (r < 0) return -1;
    int rank = r > x->rank ? r : x->rank;
    for (int i = 0; i < rank; i++) {
        int ix = i - (rank - x->rank), is_ = i - (rank - r);
        int64_t dx = ix < 0 ? 1 : x->shape[ix], ds = is_ < 0 ? 1 : shape[is_];
        if (dx != ds && dx != 1 && ds != 1)
            return ox_fail(n, err, MK_ERR_SHAPE, "dim %d: %lld does not broadcast to %lld", i,
                           (long long)dx, (long long)ds);
        out[i] = dx == 1 ? ds : dx;
    }
    bool same = rank == x->rank;
    for (int i = 0; same && i < rank; i++) same = out[i] == x->shape[i];
    if (same) {
        ox_alias(n->out[0], x);
        return 0;
    }
    return ox_emit(n, n->out[0], "ExpandNode", &x, 1, out, rank, 0, rank, err);
}

int ox_lower_tile(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err);
    int64_t reps[MK_MAX_RANK];
    if (!x) return -1;
    int r = ox_known_ints(n, opt(n, 1), "repeats", reps, MK_MAX_RANK, err);
    if (r < 0) return -1;
    if (r != x->rank)
        return ox_fail(n, err, MK_ERR_SHAPE, "repeats has %d values, the input rank %d", r,
                       x->rank);
    return ox_emit(n, n->out[0], "TileNode", &x, 1, reps, r, 0, x->rank, err);
}

int ox_lower_pad(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err), *value = opt(n, 2);
    int64_t pads[2 * MK_MAX_RANK], axes[MK_MAX_RANK];
    char buf[16];
    if (!x) return -1;
    const char *mode = attr_str(n, "mode", "constant", buf, sizeof buf, err);
    if (!mode) return -1;
    int m = !strcmp(mode, "constant") ? 0 : !strcmp(mode, "reflect") ? 1 : !strcmp(mode, "edge")
          ? 2 : -1;
    if (m < 0)
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'mode' = '%s' (constant, reflect, "
                       "edge)", mode);
    int np = ox_known_ints(n, opt(n, 1), "pads", pads, 2 * MK_MAX_RANK, err);
    if (np < 0) return -1;
    int na = x->rank;
    for (int i = 0; i < na; i++) axes[i] = i;
    if (opt(n, 3) && (na = ox_known_ints(n, n->in[3], "axes", axes, MK_MAX_RANK, err)) < 0)
        return -1;
    if (np != 2 * na)
        return ox_fail(n, err, MK_ERR_SHAPE, "pads has %d values for %d axes", np, na);
    ox_value *v = value ? value : f32(n, 0, err), *acc = x;
    if (!v) return -1;
    if (value && !(known(value) && value->onnx_type == OX_FLOAT))
        return ox_fail(n, err, MK_ERR_ARGUMENT, "constant_value must be a FLOAT known at load");
    int last = -1;
    for (int i = 0; i < na; i++) {
        if (pads[i] < 0 || pads[na + i] < 0)
            return ox_fail(n, err, MK_ERR_ARGUMENT, "negative pads (cropping) are not supported");
        if (pads[i] || pads[na + i]) last = i;
    }
    if (last < 0) {
        ox_alias(n->out[0], x);
        return 0;
    }
    for (int i = 0; i <= last; i++) {
        int ax = 0;
        if (ox_axis(n, axes[i], x->rank, "axis", &ax, err)) return -1;
        if (!pads[i] && !pads[na + i]) continue;
        ox_value *y = i == last ? n->out[0] : ox_temp(n, err);
        if (!y || ox_emit(n, y, "PadNode", (ox_value *[]){acc, v}, 2,
                          (int64_t[]){ax, pads[i], pads[na + i], m}, 4, 0, x->rank, err))
            return -1;
        acc = y;
    }
    return 0;
}

/* Resize: nearest neighbour, integer scales of H and W only (what
 * nn.Upsample(scale_factor=k) exports). */
int ox_lower_resize(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err), *scales = opt(n, 2), *sizes = opt(n, 3);
    char b1[32], b2[32], b3[32];
    if (!x) return -1;
    const char *mode = attr_str(n, "mode", "nearest", b1, sizeof b1, err);
    const char *ct = mode ? attr_str(n, "coordinate_transformation_mode", "half_pixel", b2,
                                     sizeof b2, err) : NULL;
    const char *nm = ct ? attr_str(n, "nearest_mode", "round_prefer_floor", b3, sizeof b3, err)
                        : NULL;
    if (!nm) return -1;
    if (strcmp(mode, "nearest"))
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'mode' = '%s' (nearest only)", mode);
    if (x->rank != 4)
        return ox_fail(n, err, MK_ERR_SHAPE, "input of rank %d ([N, C, H, W] only)", x->rank);
    int64_t out[4];
    if (sizes) {
        if (ox_known_ints(n, sizes, "sizes", out, 4, err) != 4)
            return err && *err ? -1 : ox_fail(n, err, MK_ERR_SHAPE, "sizes must have 4 values");
    } else {
        if (!known(scales) || scales->onnx_type != OX_FLOAT || scales->rank != 1 ||
            scales->shape[0] != 4)
            return ox_fail(n, err, MK_ERR_ARGUMENT, "scales must be 4 FLOATs known at load");
        const float *s = scales->data;
        for (int i = 0; i < 4; i++) out[i] = (int64_t)floorf((float)x->shape[i] * s[i]);
    }
    for (int i = 0; i < 4; i++)
        if (i < 2 ? out[i] != x->shape[i] : out[i] % x->shape[i] != 0)
            return ox_fail(n, err, MK_ERR_ARGUMENT, "only integer scales of H and W are "
                           "supported (output %lld from %lld on axis %d)", (long long)out[i],
                           (long long)x->shape[i], i);
    /* with integer scales every coordinate mode but align_corners and tf_crop_and_resize
     * picks floor(i / scale), which UpsampleNearest2dNode computes */
    if (!strcmp(ct, "align_corners") || !strcmp(ct, "tf_crop_and_resize"))
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'coordinate_transformation_mode' = "
                       "'%s' is not supported", ct);
    bool half = !strcmp(ct, "half_pixel") || !strcmp(ct, "pytorch_half_pixel");
    if (half && strcmp(nm, "floor") && (out[2] / x->shape[2] > 2 || out[3] / x->shape[3] > 2) &&
        strcmp(nm, "round_prefer_floor"))
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'nearest_mode' = '%s' with scales "
                       "above 2", nm);
    return ox_emit(n, n->out[0], "UpsampleNearest2dNode", &x, 1, (int64_t[]){out[2], out[3]},
                   2, 0, 4, err);
}

/* ---- values computed at load -------------------------------------------------- */

int ox_lower_range(ox_node *n, mk_error **err) {
    ox_value *v[3];
    for (int k = 0; k < 3; k++)
        if (!(v[k] = ox_need(n, k, err))) return -1;
    for (int k = 0; k < 3; k++)
        if (!known(v[k]))
            return ox_fail(n, err, MK_ERR_ARGUMENT, "Range of run-time values is not supported "
                           "(start, limit and delta must be known at load)");
    int t = v[0]->onnx_type;
    double a[3];
    for (int k = 0; k < 3; k++)
        a[k] = v[k]->dtype == MK_DTYPE_INT64 ? (double)((const int64_t *)v[k]->data)[0]
             : v[k]->dtype == MK_DTYPE_FLOAT32 ? (double)((const float *)v[k]->data)[0] : NAN;
    if (isnan(a[0] + a[1] + a[2]) || a[2] == 0)
        return ox_fail(n, err, MK_ERR_ARGUMENT, "start, limit and delta must be numbers, delta "
                       "not 0");
    double cnt = ceil((a[1] - a[0]) / a[2]);
    int64_t count = cnt > 0 ? (int64_t)cnt : 0;
    void *data = ox_set_known(n, n->out[0], t, 1, &count, err);
    if (!data) return -1;
    for (int64_t i = 0; i < count; i++) {
        if (v[0]->dtype == MK_DTYPE_INT64)
            ((int64_t *)data)[i] = (int64_t)a[0] + i * (int64_t)a[2];
        else
            ((float *)data)[i] = (float)a[0] + (float)i * (float)a[2];
    }
    return 0;
}

int ox_lower_constant_of_shape(ox_node *n, mk_error **err) {
    int64_t shape[MK_MAX_RANK];
    int r = ox_known_ints(n, ox_need(n, 0, err), "the shape", shape, MK_MAX_RANK, err);
    if (r < 0) return -1;
    const Onnx__AttributeProto *a = ox_attr(n, "value", 4, err);
    if (err && *err) return -1;
    ox_value fill = {0};
    if (a && ox_tensor_value(n, a->t, &fill, err)) return -1;
    int t = a ? fill.onnx_type : OX_FLOAT;
    char *data = ox_set_known(n, n->out[0], t, r, shape, err);
    if (!data) return -1;
    size_t es = mk_dtype_size(n->out[0]->dtype);
    int64_t total = 1;
    for (int i = 0; i < r; i++) total *= shape[i];
    for (int64_t i = 0; i < total && a; i++) memcpy(data + (size_t)i * es, fill.data, es);
    return 0;
}
