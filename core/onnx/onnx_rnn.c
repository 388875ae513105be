/*
 * onnx_rnn.c — ONNX's LSTM as a subgraph unrolled over the sequence (its
 * length is fixed at load, as every shape is): the input's product with W
 * for every step at once, then per step one product with R, the four gates
 * (ONNX's order i, o, f, c) sliced from it, and the cell and hidden updates.
 * Forward, reverse and bidirectional; the default activations only.
 */
#include "onnx.h"
#include "onnx.pb-c.h"

#include <string.h>

#define ATTR_FLOAT 1
#define ATTR_STRING 3
#define ATTR_FLOATS 6
#define ATTR_STRINGS 8

typedef struct {
    ox_node *n;
    int64_t seq, batch, hidden;
    mk_error **err;
} lstm;

static ox_value *emit(lstm *L, const char *op, ox_value *const *in, int n_in, const int64_t *ints,
                      int n_ints, int rank) {
    ox_value *y = ox_temp(L->n, L->err);
    if (!y || ox_emit(L->n, y, op, in, n_in, ints, n_ints, 0, rank, L->err)) return NULL;
    return y;
}

static ox_value *slice(lstm *L, ox_value *x, int axis, int64_t b, int64_t e) {
    if (!x) return NULL;
    if (b == 0 && e == x->shape[axis]) return x;
    return emit(L, "SliceAxisNode", &x, 1, (int64_t[]){axis, b, e, 1}, 4, x->rank);
}

static ox_value *reshape(lstm *L, ox_value *x, int rank, const int64_t *shape) {
    ox_value *y = x ? ox_temp(L->n, L->err) : NULL;
    if (!y || ox_reshape(L->n, y, x, rank, shape, L->err)) return NULL;
    return y;
}

static ox_value *binary(lstm *L, const char *op, ox_value *a, ox_value *b) {
    if (!a || !b) return NULL;
    int rank = a->rank > b->rank ? a->rank : b->rank;
    return emit(L, op, (ox_value *[]){a, b}, 2, NULL, 0, rank);
}

static ox_value *unary(lstm *L, const char *op, ox_value *x) {
    return x ? emit(L, op, &x, 1, NULL, 0, x->rank) : NULL;
}

/* Direction d's [rows, cols] matrix of a [dirs, rows, cols] tensor, transposed. */
static ox_value *weight_t(lstm *L, ox_value *w, int d) {
    ox_value *m = reshape(L, slice(L, w, 0, d, d + 1), 2, w->shape + 1);
    return m ? emit(L, "PermuteNode", &m, 1, (int64_t[]){1, 0}, 2, 2) : NULL;
}

/* Direction d's [batch, hidden] initial state, or zeros. */
static ox_value *initial(lstm *L, ox_value *v, int d) {
    int64_t shape[2] = {L->batch, L->hidden};
    if (v) return reshape(L, slice(L, v, 0, d, d + 1), 2, shape);
    ox_value *z = ox_temp(L->n, L->err);
    if (!z || !ox_set_known(L->n, z, OX_FLOAT, 2, shape, L->err)) return NULL;
    return z;
}

/* One direction: its hidden states per step [seq] (in time order), the last h and c. */
static int direction(lstm *L, ox_value *xs, ox_value *w, ox_value *r, ox_value *b,
                     ox_value *h0, ox_value *c0, int d, bool reverse, ox_value **hs,
                     ox_value **h_last, ox_value **c_last) {
    int64_t H = L->hidden;
    ox_value *wt = weight_t(L, w, d), *rt = weight_t(L, r, d);
    if (!wt || !rt) return -1;
    ox_value *xw = ox_temp(L->n, L->err); /* [seq, batch, 4H] */
    if (!xw || ox_matmul(L->n, xw, xs, wt, L->err)) return -1;
    if (b) {
        ox_value *bd = reshape(L, slice(L, b, 0, d, d + 1), 1, (int64_t[]){8 * H});
        ox_value *bias = binary(L, "SumNode", slice(L, bd, 0, 0, 4 * H),
                                slice(L, bd, 0, 4 * H, 8 * H));
        if (!(xw = binary(L, "SumNode", xw, bias))) return -1;
    }
    ox_value *h = initial(L, h0, d), *c = initial(L, c0, d);
    if (!h || !c) return -1;
    for (int64_t k = 0; k < L->seq; k++) {
        int64_t t = reverse ? L->seq - 1 - k : k;
        ox_value *xt = reshape(L, slice(L, xw, 0, t, t + 1), 2, (int64_t[]){L->batch, 4 * H});
        ox_value *hr = ox_temp(L->n, L->err);
        if (!xt || !hr || ox_matmul(L->n, hr, h, rt, L->err)) return -1;
        ox_value *g = binary(L, "SumNode", xt, hr);
        ox_value *i = unary(L, "SigmoidNode", slice(L, g, 1, 0, H));
        ox_value *o = unary(L, "SigmoidNode", slice(L, g, 1, H, 2 * H));
        ox_value *f = unary(L, "SigmoidNode", slice(L, g, 1, 2 * H, 3 * H));
        ox_value *cc = unary(L, "TanhNode", slice(L, g, 1, 3 * H, 4 * H));
        c = binary(L, "SumNode", binary(L, "HadamardProductNode", f, c),
                   binary(L, "HadamardProductNode", i, cc));
        h = binary(L, "HadamardProductNode", o, unary(L, "TanhNode", c));
        if (!h) return -1;
        hs[t] = h;
    }
    *h_last = h, *c_last = c;
    return 0;
}

static ox_value *concat(lstm *L, ox_value **parts, int count, int axis) {
    ox_value *acc = parts[0];
    for (int k = 1; k < count && acc; k++)
        acc = emit(L, "ConcatNode", (ox_value *[]){acc, parts[k]}, 2, (int64_t[]){axis}, 1,
                   acc->rank);
    return acc;
}

/* An output: v as the output value (a reshape or permute into place). */
static int put(lstm *L, ox_value *out, ox_value *v, int rank, const int64_t *shape,
               const int64_t *perm) {
    if (!out) return 0;
    if (!v) return -1;
    if (perm) return ox_emit(L->n, out, "PermuteNode", &v, 1, perm, rank, 0, rank, L->err);
    return ox_reshape(L->n, out, v, rank, shape, L->err);
}

int ox_lower_lstm(ox_node *n, mk_error **err) {
    ox_value *x = ox_need(n, 0, err), *w = x ? ox_need(n, 1, err) : NULL,
             *r = w ? ox_need(n, 2, err) : NULL;
    if (!r) return -1;
    ox_value *b = n->n_in > 3 ? n->in[3] : NULL, *lens = n->n_in > 4 ? n->in[4] : NULL,
             *h0 = n->n_in > 5 ? n->in[5] : NULL, *c0 = n->n_in > 6 ? n->in[6] : NULL,
             *p = n->n_in > 7 ? n->in[7] : NULL;
    int64_t hidden, layout, input_forget;
    if (ox_attr_int(n, "hidden_size", 0, &hidden, err) || ox_attr_int(n, "layout", 0, &layout, err) ||
        ox_attr_int(n, "input_forget", 0, &input_forget, err))
        return -1;
    static const char *const unsupported[] = {"activations", "activation_alpha",
                                              "activation_beta", "clip"};
    static const int types[] = {ATTR_STRINGS, ATTR_FLOATS, ATTR_FLOATS, ATTR_FLOAT};
    for (int k = 0; k < 4; k++) {
        if (ox_attr(n, unsupported[k], types[k], err))
            return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute '%s' is not supported (the "
                           "default sigmoid, tanh, tanh without clipping only)", unsupported[k]);
        if (err && *err) return -1;
    }
    const Onnx__AttributeProto *dir = ox_attr(n, "direction", ATTR_STRING, err);
    if (err && *err) return -1;
    char dname[16] = "forward";
    if (dir) {
        size_t len = dir->s.len < sizeof dname - 1 ? dir->s.len : sizeof dname - 1;
        memcpy(dname, dir->s.data, len);
        dname[len] = 0;
    }
    bool bidi = !strcmp(dname, "bidirectional"), rev = !strcmp(dname, "reverse");
    if (!bidi && !rev && strcmp(dname, "forward"))
        return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'direction' = '%s'", dname);
    if (input_forget) return ox_fail(n, err, MK_ERR_ARGUMENT, "attribute 'input_forget' = 1");
    if (p) return ox_fail(n, err, MK_ERR_ARGUMENT, "peephole weights (input P) are not supported");
    if (x->rank != 3 || w->rank != 3 || r->rank != 3)
        return ox_fail(n, err, MK_ERR_SHAPE, "X, W and R must have rank 3");
    int dirs = bidi ? 2 : 1;
    lstm L = {n, layout ? x->shape[1] : x->shape[0], layout ? x->shape[0] : x->shape[1],
              w->shape[1] / 4, err};
    if (hidden && hidden != L.hidden)
        return ox_fail(n, err, MK_ERR_SHAPE, "hidden_size %lld, but W has %lld rows",
                       (long long)hidden, (long long)w->shape[1]);
    if (w->shape[0] != dirs || r->shape[0] != dirs || r->shape[1] != 4 * L.hidden ||
        r->shape[2] != L.hidden || w->shape[1] != 4 * L.hidden)
        return ox_fail(n, err, MK_ERR_SHAPE, "W or R does not fit %d direction(s) of hidden "
                       "size %lld", dirs, (long long)L.hidden);
    if (L.seq > 512)
        return ox_fail(n, err, MK_ERR_SHAPE, "a sequence of %lld steps (unrolled: at most 512)",
                       (long long)L.seq);
    if (lens) {
        bool all = lens->data && lens->dtype == MK_DTYPE_INT64 && lens->rank == 1 &&
                   lens->shape[0] == L.batch;
        for (int64_t i = 0; all && i < L.batch; i++)
            all = ((const int64_t *)lens->data)[i] == L.seq;
        if (!all)
            return ox_fail(n, err, MK_ERR_ARGUMENT, "sequence_lens must be known at load and "
                           "equal the sequence length (%lld)", (long long)L.seq);
    }
    for (int k = 0; k < 2; k++) {
        ox_value *v = k ? c0 : h0;
        if (v && (v->rank != 3 || v->shape[0] != dirs || v->shape[1] != L.batch ||
                  v->shape[2] != L.hidden))
            return ox_fail(n, err, MK_ERR_SHAPE, "initial_%c must be [%d, %lld, %lld]",
                           k ? 'c' : 'h', dirs, (long long)L.batch, (long long)L.hidden);
    }
    ox_value *xs = x; /* [seq, batch, input] */
    if (layout && !(xs = emit(&L, "PermuteNode", &x, 1, (int64_t[]){1, 0, 2}, 3, 3))) return -1;
    ox_value **hs = ox_alloc(n->im, sizeof *hs * (size_t)(L.seq * dirs), err);
    ox_value *hl[2], *cl[2];
    if (!hs) return -1;
    for (int d = 0; d < dirs; d++)
        if (direction(&L, xs, w, r, b, h0, c0, d, rev || d == 1, hs + d * L.seq, &hl[d], &cl[d]))
            return -1;
    int64_t B = L.batch, H = L.hidden;
    /* Y: [seq, dirs, batch, H] (layout 1: [batch, seq, dirs, H]) */
    if (n->out[0]) {
        ox_value **steps = ox_alloc(n->im, sizeof *steps * (size_t)L.seq, err);
        if (!steps) return -1;
        for (int64_t t = 0; t < L.seq; t++) {
            ox_value *parts[2];
            for (int d = 0; d < dirs; d++)
                parts[d] = reshape(&L, hs[d * L.seq + t], 4, (int64_t[]){1, 1, B, H});
            if (!(steps[t] = dirs == 2 && parts[0] ? concat(&L, parts, 2, 1) : parts[0]))
                return -1;
        }
        ox_value *y = concat(&L, steps, (int)L.seq, 0);
        if (put(&L, n->out[0], y, 4, (int64_t[]){L.seq, dirs, B, H},
                layout ? (int64_t[]){2, 0, 1, 3} : NULL))
            return -1;
    }
    for (int k = 1; k < 3 && k < n->n_out; k++) {
        if (!n->out[k]) continue;
        ox_value **last = k == 1 ? hl : cl, *parts[2];
        for (int d = 0; d < dirs; d++) parts[d] = reshape(&L, last[d], 3, (int64_t[]){1, B, H});
        ox_value *v = dirs == 2 && parts[0] ? concat(&L, parts, 2, 0) : parts[0];
        if (put(&L, n->out[k], v, 3, (int64_t[]){dirs, B, H},
                layout ? (int64_t[]){1, 0, 2} : NULL))
            return -1;
    }
    return 0;
}
