/*
 * ops_reduce.c — the shape and dtype rules of the reductions, softmaxes and
 * norms over any axes (ops.c's "reductions and norms" block; reductions.h).
 *
 * Every one takes float32 x and gives float32 (argmax and argmin: int64).
 * Axes are 0-based, negative ones from the end as Python's; a reduction keeps
 * each reduced axis as 1 (the Lua methods drop them unless keepdims). A norm's
 * weight and bias have x's dtype and either the normalized shape or [1] (one
 * value for all); eps and var's correction are float32 [1] operands, read on
 * the device at run time.
 */
#include "reductions.h"

#include <stdio.h>

#define SHAPE(x) mk_shape_str((x)->rank, (x)->shape, (char[96]){0}, 96)
#define FAIL(err, n, code, ...) mk_fail((err), (code), (n)->line, (n)->column, __VA_ARGS__)

static int need_f32(mk_node *n, int k, const char *what, mk_error **err) {
    const mk_node *x = n->in[k];
    if (x->dtype == MK_DTYPE_FLOAT32) return 0;
    return FAIL(err, n, MK_ERR_DTYPE, "%s: %s (%s) must be float32, not %s", n->op->name, what,
                MK_OPERAND(n, k), mk_dtype_name(x->dtype));
}

/* A float32 [1] operand: eps, a correction. */
static int need_scalar(mk_node *n, int k, const char *what, mk_error **err) {
    const mk_node *x = n->in[k];
    if (need_f32(n, k, what, err)) return -1;
    if (x->rank != 1 || x->shape[0] != 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s (%s) must have shape [1], not %s", n->op->name,
                    what, MK_OPERAND(n, k), SHAPE(x));
    return 0;
}

/* Axis a of x, Python's way: in [-rank, rank). */
static int check_axis(mk_node *n, int64_t a, mk_error **err) {
    int rank = n->in[0]->rank;
    if (a < -rank || a >= rank)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: axis %lld is out of range for %s (-%d to %d)",
                    n->op->name, (long long)a, SHAPE(n->in[0]), rank, rank - 1);
    return 0;
}

/* x's shape with the axes in mask set to 1. */
static void keep_dims(mk_node *n, mk_dtype dtype, unsigned mask) {
    const mk_node *x = n->in[0];
    n->dtype = dtype;
    n->rank = x->rank;
    for (int d = 0; d < x->rank; d++) n->shape[d] = mask & (1u << d) ? 1 : x->shape[d];
}

/* The axis list of n (its 'l' integers, after `first` others), each in
 * range and none twice. */
static int check_axes(mk_node *n, int first, mk_error **err) {
    int rank = n->in[0]->rank;
    unsigned mask = 0;
    if (n->n_attr - first < 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: no axis to reduce", n->op->name);
    for (int k = first; k < n->n_attr; k++) {
        int64_t a = n->attr[k];
        if (check_axis(n, a, err)) return -1;
        unsigned bit = 1u << (unsigned)(a < 0 ? a + rank : a);
        if (mask & bit)
            return FAIL(err, n, MK_ERR_SHAPE, "%s: axis %lld is repeated in %s (axes of %s)",
                        n->op->name, (long long)a,
                        mk_shape_str(n->n_attr - first, n->attr + first, (char[96]){0}, 96),
                        SHAPE(n->in[0]));
        mask |= bit;
    }
    return 0;
}

int mk_infer_reduce(mk_node *n, mk_error **err) {
    if (need_f32(n, 0, "x", err) || check_axes(n, 0, err)) return -1;
    keep_dims(n, MK_DTYPE_FLOAT32, mk_reduce_mask(n));
    return 0;
}

int mk_infer_var(mk_node *n, mk_error **err) {
    if (need_f32(n, 0, "x", err) || need_scalar(n, 1, "the correction", err) ||
        check_axes(n, 0, err))
        return -1;
    keep_dims(n, MK_DTYPE_FLOAT32, mk_reduce_mask(n));
    return 0;
}

int mk_infer_arg_reduce(mk_node *n, mk_error **err) {
    if (need_f32(n, 0, "x", err) || check_axis(n, n->attr[0], err)) return -1;
    keep_dims(n, MK_DTYPE_INT64, mk_reduce_mask(n));
    return 0;
}

int mk_infer_softmax(mk_node *n, mk_error **err) {
    if (need_f32(n, 0, "x", err) || check_axis(n, n->attr[0], err)) return -1;
    keep_dims(n, MK_DTYPE_FLOAT32, 0);
    return 0;
}

/* Operand k (a weight, a bias, a statistic): float32, [1] or `shape`. */
static int need_param(mk_node *n, int k, const char *what, int rank, const int64_t *shape,
                      mk_error **err) {
    const mk_node *p = n->in[k];
    if (need_f32(n, k, what, err)) return -1;
    if (p->rank == 1 && p->shape[0] == 1) return 0;
    bool ok = p->rank == rank;
    for (int d = 0; ok && d < rank; d++) ok = p->shape[d] == shape[d];
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s (%s) is %s; it must be %s or [1] for x %s",
                    n->op->name, what, MK_OPERAND(n, k), SHAPE(p),
                    mk_shape_str(rank, shape, (char[96]){0}, 96), SHAPE(n->in[0]));
    return 0;
}

/* x's last k axes normalized; weight and bias of those axes' shape (or [1]). */
int mk_infer_layer_norm(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int64_t k = n->attr[0];
    if (need_f32(n, 0, "x", err)) return -1;
    if (k < 1 || k > x->rank)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %lld normalized axes for x %s (1 to %d)",
                    n->op->name, (long long)k, SHAPE(x), x->rank);
    const int64_t *last = x->shape + x->rank - k;
    if (need_param(n, 1, "the weight", (int)k, last, err) ||
        need_param(n, 2, "the bias", (int)k, last, err) || need_scalar(n, 3, "eps", err))
        return -1;
    keep_dims(n, MK_DTYPE_FLOAT32, 0);
    return 0;
}

/* x [N, C, ...]; C in `groups` groups; weight and bias [C] (or [1]). */
int mk_infer_group_norm(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int64_t g = n->attr[0];
    if (need_f32(n, 0, "x", err)) return -1;
    if (x->rank < 2)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: x %s must be [N, C, ...]", n->op->name, SHAPE(x));
    if (g < 1 || x->shape[1] % g)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %lld groups do not divide the %lld channels of %s",
                    n->op->name, (long long)g, (long long)x->shape[1], SHAPE(x));
    if (need_param(n, 1, "the weight", 1, x->shape + 1, err) ||
        need_param(n, 2, "the bias", 1, x->shape + 1, err) || need_scalar(n, 3, "eps", err))
        return -1;
    keep_dims(n, MK_DTYPE_FLOAT32, 0);
    return 0;
}

/* x [N, C, ...]; running mean, var, weight and bias [C] (or [1]). */
int mk_infer_batch_norm(mk_node *n, mk_error **err) {
    static const char *const what[] = {"the running mean", "the running var", "the weight",
                                       "the bias"};
    const mk_node *x = n->in[0];
    if (need_f32(n, 0, "x", err)) return -1;
    if (x->rank < 2)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: x %s must be [N, C, ...]", n->op->name, SHAPE(x));
    for (int k = 1; k <= 4; k++)
        if (need_param(n, k, what[k - 1], 1, x->shape + 1, err)) return -1;
    if (need_scalar(n, 5, "eps", err)) return -1;
    keep_dims(n, MK_DTYPE_FLOAT32, 0);
    return 0;
}

/* RmsNormNode's rule with eps an operand: weight [n] (or [1]) for x's last axis n. */
int mk_infer_rms_norm_eps(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    if (need_f32(n, 0, "x", err) ||
        need_param(n, 1, "the weight", 1, x->shape + x->rank - 1, err) ||
        need_scalar(n, 2, "eps", err))
        return -1;
    keep_dims(n, MK_DTYPE_FLOAT32, 0);
    return 0;
}
