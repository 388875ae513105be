/*
 * ops_shape.c — the shape rules and view layouts of the shape and
 * data-movement rows of the op table (ops.c, "shape and data movement"):
 * slices on any axis with a step, squeeze, unsqueeze, flatten, expand, flip,
 * concat, pad, tile, repeat_interleave, gather, index_select, cumsum.
 *
 * Axes count from 0, and from the end where negative (Python's -1 is the
 * last). Slice bounds follow Python's: negative from the end, then clamped
 * to the axis; the result must not be empty (tensors here have no zero dims).
 */
#include "graph.h"

#include <stdio.h>
#include <string.h>

#define SHAPE(n) mk_shape_str((n)->rank, (n)->shape, (char[96]){0}, 96)
#define FAIL(err, n, code, ...) mk_fail((err), (code), (n)->line, (n)->column, __VA_ARGS__)

static void set_shape(mk_node *n, mk_dtype dtype, int rank, const int64_t *shape) {
    n->dtype = dtype;
    n->rank = rank;
    memmove(n->shape, shape, sizeof(int64_t) * (size_t)rank);
}

/* Axis a of a tensor of rank r (r + 1 where one may be inserted), negative from the end. */
static int axis_of(mk_node *n, int64_t a, int r, const mk_node *x, int *axis, mk_error **err) {
    if (a < -r || a >= r)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: axis %lld is out of range for %s (%d to %d)",
                    n->op->name, (long long)a, SHAPE(x), -r, r - 1);
    *axis = (int)(a < 0 ? a + r : a);
    return 0;
}

static int check_rank(mk_node *n, int rank, mk_error **err) {
    if (rank < 1 || rank > MK_MAX_RANK)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: the result would have rank %d (1 to %d)",
                    n->op->name, rank, MK_MAX_RANK);
    return 0;
}

/* ---- slices and views --------------------------------------------------------- */

/* Python's slice [begin:end:step] of a dim of n, step > 0: the first index and the count. */
static void slice_bounds(int64_t dim, int64_t b, int64_t e, int64_t step, int64_t *first,
                         int64_t *count) {
    if (b < 0) b += dim;
    if (e < 0) e += dim;
    b = b < 0 ? 0 : b > dim ? dim : b;
    e = e < 0 ? 0 : e > dim ? dim : e;
    *first = b;
    *count = e > b ? (e - b + step - 1) / step : 0;
}

/* SliceAxisNode(x, axis, begin, end, step) */
int mk_infer_slice_axis(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int axis;
    if (axis_of(n, n->attr[0], x->rank, x, &axis, err)) return -1;
    int64_t step = n->attr[3], first, count;
    if (step < 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: step %lld must be positive (flip reverses an axis)",
                    n->op->name, (long long)step);
    slice_bounds(x->shape[axis], n->attr[1], n->attr[2], step, &first, &count);
    if (count == 0)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: [%lld:%lld:%lld] of axis %d of %s is empty (no zero-size tensors)",
                    n->op->name, (long long)n->attr[1], (long long)n->attr[2], (long long)step,
                    axis, SHAPE(x));
    set_shape(n, x->dtype, x->rank, x->shape);
    n->shape[axis] = count;
    return 0;
}

int64_t mk_layout_slice_axis(const mk_node *n, int64_t *stride) {
    const mk_node *x = n->in[0];
    int axis = (int)(n->attr[0] < 0 ? n->attr[0] + x->rank : n->attr[0]);
    int64_t first, count;
    slice_bounds(x->shape[axis], n->attr[1], n->attr[2], n->attr[3], &first, &count);
    memcpy(stride, x->stride, sizeof x->stride);
    stride[axis] *= n->attr[3];
    return first * x->stride[axis] * (int64_t)mk_dtype_size(x->dtype);
}

/* SqueezeNode(x, axis): drops an axis of size 1 */
int mk_infer_squeeze(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int axis;
    if (axis_of(n, n->attr[0], x->rank, x, &axis, err)) return -1;
    if (x->shape[axis] != 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: axis %d of %s is %lld, not 1", n->op->name, axis,
                    SHAPE(x), (long long)x->shape[axis]);
    if (check_rank(n, x->rank - 1, err)) return -1;
    set_shape(n, x->dtype, x->rank, x->shape);
    memmove(n->shape + axis, n->shape + axis + 1, sizeof(int64_t) * (size_t)(x->rank - 1 - axis));
    n->rank--;
    return 0;
}

/* UnsqueezeNode(x, axis): a new axis of size 1 at axis of the result */
int mk_infer_unsqueeze(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int axis;
    if (check_rank(n, x->rank + 1, err) || axis_of(n, n->attr[0], x->rank + 1, x, &axis, err))
        return -1;
    n->dtype = x->dtype;
    n->rank = x->rank + 1;
    for (int d = 0, k = 0; d < n->rank; d++) n->shape[d] = d == axis ? 1 : x->shape[k++];
    return 0;
}

/* FlattenNode(x, start, end): axes start to end (both included) as one */
int mk_infer_flatten(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int s, e;
    if (axis_of(n, n->attr[0], x->rank, x, &s, err) || axis_of(n, n->attr[1], x->rank, x, &e, err))
        return -1;
    if (s > e)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: start axis %d comes after end axis %d of %s",
                    n->op->name, s, e, SHAPE(x));
    int64_t shape[MK_MAX_RANK];
    int r = 0;
    for (int d = 0; d < x->rank; d++) {
        if (d <= s || d > e) shape[r++] = x->shape[d];
        else shape[r - 1] *= x->shape[d];
    }
    set_shape(n, x->dtype, r, shape);
    return 0;
}

/* Views whose input is dense (as a reshape's): their own shape, contiguous. */
int64_t mk_layout_dense(const mk_node *n, int64_t *stride) {
    mk_contiguous_strides(n->rank, n->shape, stride);
    return 0;
}

/* ExpandNode(x, shape): x broadcast to shape as NumPy's (dims aligned from the
 * last, x's equal or 1; -1 keeps x's) */
int mk_infer_expand(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int r = n->n_attr;
    int64_t shape[MK_MAX_RANK];
    bool ok = r >= x->rank;
    for (int d = 0; ok && d < r; d++) {
        int k = d - (r - x->rank);
        int64_t want = n->attr[d], have = k < 0 ? 1 : x->shape[k];
        if (want == -1 && k >= 0) want = have;
        shape[d] = want;
        ok = want >= 1 && (want == have || have == 1);
    }
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: %s does not broadcast to %s (dims aligned from the last must be equal, "
                    "or 1 in x; -1 keeps x's)",
                    n->op->name, SHAPE(x), mk_shape_str(r, n->attr, (char[96]){0}, 96));
    set_shape(n, x->dtype, r, shape);
    return 0;
}

int64_t mk_layout_expand(const mk_node *n, int64_t *stride) {
    const mk_node *x = n->in[0];
    for (int d = 0; d < n->rank; d++) {
        int k = d - (n->rank - x->rank);
        stride[d] = k < 0 || (x->shape[k] == 1 && n->shape[d] != 1) ? 0 : x->stride[k];
    }
    return 0;
}

/* ---- copies ------------------------------------------------------------------- */

/* FlipNode(x, axis) */
int mk_infer_flip(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int axis;
    if (axis_of(n, n->attr[0], x->rank, x, &axis, err)) return -1;
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

/* ConcatNode(a, b, axis): same dtype and rank, equal dims but on the axis */
int mk_infer_concat(mk_node *n, mk_error **err) {
    const mk_node *a = n->in[0], *b = n->in[1];
    int axis;
    if (axis_of(n, n->attr[0], a->rank, a, &axis, err)) return -1;
    if (a->dtype != b->dtype)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: operands differ in dtype (%s and %s)", n->op->name,
                    mk_dtype_name(a->dtype), mk_dtype_name(b->dtype));
    bool ok = a->rank == b->rank;
    for (int d = 0; ok && d < a->rank; d++) ok = d == axis || a->shape[d] == b->shape[d];
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: cannot join %s and %s on axis %d (same rank, equal dims but that axis)",
                    n->op->name, SHAPE(a), SHAPE(b), axis);
    set_shape(n, a->dtype, a->rank, a->shape);
    n->shape[axis] += b->shape[axis];
    return 0;
}

/* PadNode(x, value, axis, before, after, mode): mode 0 the value (float32 [1],
 * converted to x's dtype), 1 reflect (before and after below the axis), 2 edge */
int mk_infer_pad(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0], *v = n->in[1];
    int axis;
    if (axis_of(n, n->attr[0], x->rank, x, &axis, err)) return -1;
    if (v->dtype != MK_DTYPE_FLOAT32 || v->rank != 1 || v->shape[0] != 1)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: the value (%s) must be float32 [1], not %s %s",
                    n->op->name, MK_OPERAND(n, 1), mk_dtype_name(v->dtype), SHAPE(v));
    int64_t before = n->attr[1], after = n->attr[2], mode = n->attr[3], dim = x->shape[axis];
    if (mode < MK_PAD_CONSTANT || mode > MK_PAD_EDGE)
        return FAIL(err, n, MK_ERR_ARGUMENT, "%s: mode %lld is not 0 (constant), 1 (reflect) or "
                    "2 (edge)", n->op->name, (long long)mode);
    if (before < 0 || after < 0)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: pads %lld and %lld must not be negative",
                    n->op->name, (long long)before, (long long)after);
    if (mode == MK_PAD_REFLECT && (before >= dim || after >= dim))
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: reflect pads %lld and %lld must be below axis %d's %lld of %s",
                    n->op->name, (long long)before, (long long)after, axis, (long long)dim,
                    SHAPE(x));
    set_shape(n, x->dtype, x->rank, x->shape);
    n->shape[axis] += before + after;
    return 0;
}

/* TileNode(x, reps): numpy.tile (reps shorter than x's rank count from its
 * last axes; longer ones add leading axes) */
int mk_infer_tile(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int r = n->n_attr > x->rank ? n->n_attr : x->rank;
    if (check_rank(n, r, err)) return -1;
    int64_t shape[MK_MAX_RANK];
    for (int d = 0; d < r; d++) {
        int k = d - (r - x->rank), j = d - (r - n->n_attr);
        int64_t rep = j < 0 ? 1 : n->attr[j];
        if (rep < 1)
            return FAIL(err, n, MK_ERR_SHAPE, "%s: repeat %lld must be positive", n->op->name,
                        (long long)rep);
        shape[d] = (k < 0 ? 1 : x->shape[k]) * rep;
    }
    set_shape(n, x->dtype, r, shape);
    return 0;
}

/* RepeatInterleaveNode(x, repeats, axis): each index of the axis repeats times */
int mk_infer_repeat_interleave(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int axis;
    if (axis_of(n, n->attr[1], x->rank, x, &axis, err)) return -1;
    if (n->attr[0] < 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: repeats %lld must be positive", n->op->name,
                    (long long)n->attr[0]);
    set_shape(n, x->dtype, x->rank, x->shape);
    n->shape[axis] *= n->attr[0];
    return 0;
}

static int need_ids(mk_node *n, mk_error **err) {
    const mk_node *ids = n->in[1];
    if (ids->dtype != MK_DTYPE_INT64)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: the indices (%s) must be int64, not %s",
                    n->op->name, MK_OPERAND(n, 1), mk_dtype_name(ids->dtype));
    return 0;
}

/* GatherElementsNode(x, index, axis): torch.gather / ONNX GatherElements: out
 * has index's shape, out[i] = x[i with axis' index replaced by index[i]];
 * index has x's rank and no larger dim but on the axis */
int mk_infer_gather_elements(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0], *ids = n->in[1];
    int axis;
    if (need_ids(n, err) || axis_of(n, n->attr[0], x->rank, x, &axis, err)) return -1;
    bool ok = ids->rank == x->rank;
    for (int d = 0; ok && d < x->rank; d++) ok = d == axis || ids->shape[d] <= x->shape[d];
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: index %s must have the rank of %s and no larger dim but on axis %d",
                    n->op->name, SHAPE(ids), SHAPE(x), axis);
    set_shape(n, x->dtype, ids->rank, ids->shape);
    return 0;
}

/* IndexSelectNode(x, index, axis): ONNX Gather: x's axis replaced by index's dims */
int mk_infer_index_select(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0], *ids = n->in[1];
    int axis;
    if (need_ids(n, err) || axis_of(n, n->attr[0], x->rank, x, &axis, err) ||
        check_rank(n, x->rank - 1 + ids->rank, err))
        return -1;
    int64_t shape[MK_MAX_RANK];
    int r = 0;
    for (int d = 0; d < x->rank; d++) {
        if (d != axis) {
            shape[r++] = x->shape[d];
            continue;
        }
        for (int k = 0; k < ids->rank; k++) shape[r++] = ids->shape[k];
    }
    set_shape(n, x->dtype, r, shape);
    return 0;
}

/* CumsumNode(x, axis): running sums along the axis, float32 or int64 */
int mk_infer_cumsum(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int axis;
    if (x->dtype != MK_DTYPE_FLOAT32 && x->dtype != MK_DTYPE_INT64)
        return FAIL(err, n, MK_ERR_DTYPE, "%s does not take %s (%s): float32 or int64",
                    n->op->name, mk_dtype_name(x->dtype), MK_OPERAND(n, 0));
    if (axis_of(n, n->attr[0], x->rank, x, &axis, err)) return -1;
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

/* ReplaceAtNode(x, r, index, axis): x [N, .., S, ..] with S at axis >= 1, r
 * x's shape without that axis, index int64 [N]; in place, the layout x's.
 * The index values are read by the kernels (each within [0, S)). */
int mk_infer_replace_at(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0], *r = n->in[1], *ix = n->in[2];
    int axis;
    if (axis_of(n, n->attr[0], x->rank, x, &axis, err)) return -1;
    if (axis == 0)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: axis 0 of %s is the one the index runs along; write along a later axis",
                    n->op->name, SHAPE(x));
    if (x->dtype != r->dtype)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: cannot write %s into %s", n->op->name,
                    mk_dtype_name(r->dtype), mk_dtype_name(x->dtype));
    bool ok = r->rank == x->rank - 1;
    for (int d = 0; ok && d < r->rank; d++) ok = r->shape[d] == x->shape[d < axis ? d : d + 1];
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: r %s is not x %s without axis %d", n->op->name,
                    SHAPE(r), SHAPE(x), axis);
    if (ix->dtype != MK_DTYPE_INT64 || ix->rank != 1 || ix->shape[0] != x->shape[0])
        return FAIL(err, n, MK_ERR_SHAPE, "%s: the index (%s) must be int64 [%lld], not %s %s",
                    n->op->name, MK_OPERAND(n, 2), (long long)x->shape[0],
                    mk_dtype_name(ix->dtype), SHAPE(ix));
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}
