/*
 * ops.c — the op table: one row per node kind, and the only file that knows
 * an op. A row gives the script name and argument signature, the role the
 * passes read, the front ends' method and operator, the scalar expression of a
 * pointwise op, the shape/dtype rule, the view layout, which operands may be
 * strided, scratch, and the kernel family each device looks up.
 *
 * Adding a pointwise op is adding a row with its expression: every device runs
 * expressions (core/cpu/ops.c over tiles, kernels/pointwise.cu per element) and the Lua
 * binding makes its method from the row. Other ops add a kernel family
 * (MK_KERNELS in graph.h) and a kernel per device.
 */
#include "group.h"
#include "reductions.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* ---- shape/dtype rules ---------------------------------------------------- */

#define SHAPE(n) mk_shape_str((n)->rank, (n)->shape, (char[96]){0}, 96)

/* Errors name the op, and the script position comes from the node. */
#define FAIL(err, n, code, ...) \
    mk_fail((err), (code), (n)->line, (n)->column, __VA_ARGS__)

static int check_dims(mk_node *n, int rank, const int64_t *dims, mk_error **err) {
    if (rank < 1 || rank > MK_MAX_RANK)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: rank %d is not supported (1 to %d)", n->op->name,
                    rank, MK_MAX_RANK);
    for (int i = 0; i < rank; i++)
        if (dims[i] <= 0)
            return FAIL(err, n, MK_ERR_SHAPE, "%s: dimension %d is %lld (must be positive)",
                        n->op->name, i, (long long)dims[i]);
    if (!mk_shape_numel(rank, dims))
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s has more than 2^48 elements", n->op->name,
                    mk_shape_str(rank, dims, (char[96]){0}, 96));
    return 0;
}

static void set_shape(mk_node *n, mk_dtype dtype, int rank, const int64_t *shape) {
    n->dtype = dtype;
    n->rank = rank;
    memmove(n->shape, shape, sizeof(int64_t) * (size_t)rank);
}

static int need_dtype(mk_node *n, int k, unsigned allowed, mk_error **err) {
    const mk_node *x = n->in[k];
    if (allowed & MK_DTYPE_BIT(x->dtype)) return 0;
    return FAIL(err, n, MK_ERR_DTYPE, "%s does not take %s (%s)", n->op->name,
                mk_dtype_name(x->dtype), MK_OPERAND(n, k));
}

/* An int64 [1] operand (signature letter r): a bound read on the device at run time. */
static int need_bound(mk_node *n, int k, const char *what, mk_error **err) {
    const mk_node *x = n->in[k];
    if (x->dtype != MK_DTYPE_INT64)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: %s (%s) must be int64, not %s", n->op->name, what,
                    MK_OPERAND(n, k), mk_dtype_name(x->dtype));
    if (x->rank != 1 || x->shape[0] != 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s (%s) must have shape [1], not %s",
                    n->op->name, what, MK_OPERAND(n, k), SHAPE(x));
    return 0;
}

/* A bound's value where the caller knows it (mk_op_infer from a front end). */
static bool known(const mk_node *x, int64_t *v) {
    if (!x->value) return false;
    *v = *(const int64_t *)x->value;
    return true;
}

static int infer_leaf(mk_node *n, mk_error **err) {
    if (check_dims(n, n->n_attr, n->attr, err)) return -1;
    set_shape(n, n->dtype, n->n_attr, n->attr);
    return 0;
}

/* NumPy's rule over operands [first, last): dims aligned from the last, each
 * pair equal or one of them 1 (a missing leading dim counts as 1); the result
 * takes the larger of each. HamKaas's rule (same rank, b's dims equal to a's
 * or 1) is the case where the result is a's shape. Sets n's shape. */
static int broadcast(mk_node *n, int first, int last, mk_error **err) {
    int rank = 0;
    for (int k = first; k < last; k++)
        if (n->in[k]->rank > rank) rank = n->in[k]->rank;
    int64_t shape[MK_MAX_RANK];
    int had = 0; /* the rank of the operands before k, broadcast: shape's last `had` dims */
    for (int k = first; k < last; k++) {
        const mk_node *b = n->in[k];
        for (int i = 0; i < rank; i++) {
            int ia = i - (rank - had), ib = i - (rank - b->rank);
            int64_t da = ia < 0 ? 1 : shape[i], db = ib < 0 ? 1 : b->shape[ib];
            if (da != db && da != 1 && db != 1)
                return FAIL(err, n, MK_ERR_SHAPE,
                            "%s: %s does not broadcast with %s (dims aligned from the last must "
                            "be equal or 1; axis %d of the result: %lld and %lld)",
                            n->op->name, mk_shape_str(had, shape + rank - had, (char[96]){0}, 96),
                            SHAPE(b), i, (long long)da, (long long)db);
            shape[i] = da == 1 ? db : da;
        }
        if (b->rank > had) had = b->rank;
    }
    n->rank = rank;
    memcpy(n->shape, shape, sizeof(int64_t) * (size_t)rank);
    return 0;
}

/* Operands [first, last) of one dtype, in `dtypes`; that dtype. */
static int same_dtype(mk_node *n, int first, int last, unsigned dtypes, mk_error **err) {
    if (need_dtype(n, first, dtypes, err)) return -1;
    for (int k = first + 1; k < last; k++)
        if (n->in[k]->dtype != n->in[first]->dtype)
            return FAIL(err, n, MK_ERR_DTYPE, "%s: operands differ in dtype (%s and %s)",
                        n->op->name, mk_dtype_name(n->in[first]->dtype),
                        mk_dtype_name(n->in[k]->dtype));
    return 0;
}

static int infer_broadcast(mk_node *n, unsigned dtypes, mk_error **err) {
    if (same_dtype(n, 0, n->n_in, dtypes, err) || broadcast(n, 0, n->n_in, err)) return -1;
    n->dtype = n->in[0]->dtype;
    return 0;
}

/* Ops with an expression: any dtype its program can be evaluated in (integers
 * only without / and functions; bool only in the rows below that say so); one
 * operand, or several of one dtype broadcast together. */
static int infer_pointwise(mk_node *n, mk_error **err) {
    const mk_expr *e = mk_op_program(n->op);
    if (!e) return MK_INTERNAL(err, "a pointwise row's expression does not compile");
    unsigned dtypes = e->has_float_only ? MK_DTYPES_FLOAT
                                        : MK_DTYPES_ALL & ~MK_DTYPE_BIT(MK_DTYPE_BOOL);
    return infer_broadcast(n, dtypes, err);
}

/* Activations: floats only, whatever their expression. */
static int infer_float_pointwise(mk_node *n, mk_error **err) {
    return infer_broadcast(n, MK_DTYPES_FLOAT, err);
}

/* Comparisons: two operands of one dtype (bool too), broadcast; a bool result. */
static int infer_compare(mk_node *n, mk_error **err) {
    if (infer_broadcast(n, MK_DTYPES_ALL, err)) return -1;
    n->dtype = MK_DTYPE_BOOL;
    return 0;
}

/* logical_and, _or, _not: bool operands, broadcast; a bool result. */
static int infer_logical(mk_node *n, mk_error **err) {
    return infer_broadcast(n, MK_DTYPE_BIT(MK_DTYPE_BOOL), err);
}

/* where(c, a, b): c bool, a and b of one dtype, the three broadcast together. */
static int infer_where(mk_node *n, mk_error **err) {
    if (n->in[0]->dtype != MK_DTYPE_BOOL)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: the condition (%s) must be bool, not %s",
                    n->op->name, MK_OPERAND(n, 0), mk_dtype_name(n->in[0]->dtype));
    if (same_dtype(n, 1, 3, MK_DTYPES_ALL, err) || broadcast(n, 0, 3, err)) return -1;
    n->dtype = n->in[1]->dtype;
    return 0;
}

static int infer_complex_mul(mk_node *n, mk_error **err) {
    const mk_node *a = n->in[0], *b = n->in[1];
    if (infer_broadcast(n, MK_DTYPES_FLOAT, err)) return -1;
    if (a->shape[a->rank - 1] != 2 || b->shape[b->rank - 1] != 2)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: the last axis holds (re, im) and must be 2 in both, got %s and %s",
                    n->op->name, SHAPE(n->in[0]), SHAPE(n->in[1]));
    return 0;
}

/* Activations in float32; weights (b) in float32 or a low-precision float,
 * read widened: the product is float32 either way. */
static int matmul_dtypes(mk_node *n, mk_error **err) {
    return need_dtype(n, 0, MK_DTYPE_BIT(MK_DTYPE_FLOAT32), err) ||
                   need_dtype(n, 1, MK_DTYPES_FLOAT, err)
               ? -1
               : 0;
}

/* HamKaas's forms, which PrefixMatMul keeps: [k]@[k,n], [m,k]@[k,n], [B,m,k]@[B,k,n]. */
static bool plain_matmul_shape(const mk_node *a, const mk_node *b, int64_t *out, int *rank) {
    *rank = -1;
    if (a->rank == 1 && b->rank == 2 && a->shape[0] == b->shape[0]) {
        out[0] = b->shape[1];
        *rank = 1;
    } else if (a->rank == 2 && b->rank == 2 && a->shape[1] == b->shape[0]) {
        out[0] = a->shape[0], out[1] = b->shape[1];
        *rank = 2;
    } else if (a->rank == 3 && b->rank == 3 && a->shape[0] == b->shape[0] &&
               a->shape[2] == b->shape[1]) {
        out[0] = a->shape[0], out[1] = a->shape[1], out[2] = b->shape[2];
        *rank = 3;
    }
    return *rank > 0;
}

bool mk_matmul_is_plain(const mk_node *n) {
    int64_t out[MK_MAX_RANK];
    int rank;
    return n->op->kernel == MK_KERNEL_MATMUL && plain_matmul_shape(n->in[0], n->in[1], out, &rank);
}

/*
 * numpy.matmul: a [k] is a row and b [k] a column (each dropped from the
 * result); the last two dims multiply ([.., m, k] @ [.., k, n]); the dims
 * before them broadcast as NumPy's. [k] @ [k] is [1] (no 0-d tensors here).
 */
static int infer_matmul(mk_node *n, mk_error **err) {
    const mk_node *a = n->in[0], *b = n->in[1];
    if (matmul_dtypes(n, err)) return -1;
    int64_t ka = a->shape[a->rank - 1], kb = b->shape[b->rank == 1 ? 0 : b->rank - 2];
    if (ka != kb)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: cannot multiply %s by %s: the inner dims differ (%lld and %lld; "
                    "[.., m, k] @ [.., k, n] as numpy.matmul)",
                    n->op->name, SHAPE(a), SHAPE(b), (long long)ka, (long long)kb);
    int na = a->rank > 2 ? a->rank - 2 : 0, nb = b->rank > 2 ? b->rank - 2 : 0;
    int nd = na > nb ? na : nb, rank = 0;
    int64_t out[MK_MAX_RANK + 2];
    for (int d = 0; d < nd; d++) {
        int ia = d - (nd - na), ib = d - (nd - nb);
        int64_t da = ia < 0 ? 1 : a->shape[ia], db = ib < 0 ? 1 : b->shape[ib];
        if (da != db && da != 1 && db != 1)
            return FAIL(err, n, MK_ERR_SHAPE,
                        "%s: the batch dims of %s and %s do not broadcast (batch axis %d: %lld "
                        "and %lld)",
                        n->op->name, SHAPE(a), SHAPE(b), d, (long long)da, (long long)db);
        out[rank++] = da > db ? da : db;
    }
    if (a->rank > 1) out[rank++] = a->shape[a->rank - 2];
    if (b->rank > 1) out[rank++] = b->shape[b->rank - 1];
    if (rank == 0) out[rank++] = 1;
    if (rank > MK_MAX_RANK) /* unreachable: a result has no more dims than its larger operand */
        return MK_INTERNAL(err, "a matmul result above MK_MAX_RANK");
    set_shape(n, MK_DTYPE_FLOAT32, rank, out);
    return 0;
}

/* a @ b over the first p elements of the shared axis (p: a bound, 0 <= p <= that axis). */
static int infer_prefix_matmul(mk_node *n, mk_error **err) {
    const mk_node *a = n->in[0], *b = n->in[1];
    if (matmul_dtypes(n, err)) return -1;
    int64_t out[MK_MAX_RANK];
    int rank;
    if (!plain_matmul_shape(a, b, out, &rank))
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: cannot multiply %s by %s (takes [k]@[k,n], [m,k]@[k,n], [B,m,k]@[B,k,n])",
                    n->op->name, SHAPE(a), SHAPE(b));
    set_shape(n, MK_DTYPE_FLOAT32, rank, out);
    if (need_bound(n, 2, "the prefix", err)) return -1;
    int64_t p, s = n->in[0]->shape[n->in[0]->rank - 1];
    if (known(n->in[2], &p) && (p < 0 || p > s))
        return FAIL(err, n, MK_ERR_SHAPE, "%s: prefix %lld is outside [0, %lld]", n->op->name,
                    (long long)p, (long long)s);
    return 0;
}

static int infer_slice(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int64_t b = n->attr[0], e = n->attr[1];
    if (b < 0 || e > x->shape[0] || b >= e)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: rows [%lld, %lld) are not a non-empty range of %s's first axis (0 to %lld)",
                    n->op->name, (long long)b, (long long)e, SHAPE(x), (long long)x->shape[0]);
    set_shape(n, x->dtype, x->rank, x->shape);
    n->shape[0] = e - b;
    return 0;
}

/* The new shape may hold one -1: the dim that keeps the count (NumPy's). */
static int infer_reshape(mk_node *n, mk_error **err) {
    int64_t shape[MK_MAX_RANK], total = mk_node_numel(n->in[0]);
    int free_dim = -1;
    const char *asked = mk_shape_str(n->n_attr, n->attr, (char[96]){0}, 96);
    for (int i = 0; i < n->n_attr; i++) {
        shape[i] = n->attr[i];
        if (n->attr[i] != -1) continue;
        if (free_dim >= 0)
            return FAIL(err, n, MK_ERR_SHAPE, "%s: %s has more than one -1", n->op->name, asked);
        free_dim = i;
        shape[i] = 1;
    }
    if (check_dims(n, n->n_attr, shape, err)) return -1; /* so the count cannot overflow */
    int64_t k = mk_shape_numel(n->n_attr, shape);
    if (free_dim >= 0) {
        if (total % k)
            return FAIL(err, n, MK_ERR_SHAPE, "%s: %s's %lld elements do not fill %s",
                        n->op->name, SHAPE(n->in[0]), (long long)total, asked);
        shape[free_dim] = total / k;
        k = total;
    }
    if (k != total)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s has %lld elements, %s would need %lld",
                    n->op->name, SHAPE(n->in[0]), (long long)total, asked, (long long)k);
    set_shape(n, n->in[0]->dtype, n->n_attr, shape);
    return 0;
}

static int infer_permute(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    bool seen[MK_MAX_RANK] = {false};
    bool ok = n->n_attr == x->rank;
    for (int i = 0; ok && i < n->n_attr; i++) {
        ok = n->attr[i] >= 0 && n->attr[i] < x->rank && !seen[n->attr[i]];
        if (ok) seen[n->attr[i]] = true;
    }
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s is not a permutation of the %d axes of %s",
                    n->op->name, mk_shape_str(n->n_attr, n->attr, (char[96]){0}, 96), x->rank,
                    SHAPE(x));
    n->dtype = x->dtype;
    n->rank = x->rank;
    for (int i = 0; i < x->rank; i++) n->shape[i] = x->shape[n->attr[i]];
    return 0;
}

static int infer_replace_slice(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0], *r = n->in[1];
    if (x->dtype != r->dtype)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: cannot write %s into %s", n->op->name,
                    mk_dtype_name(r->dtype), mk_dtype_name(x->dtype));
    bool ok = x->rank == r->rank && r->shape[0] <= x->shape[0];
    for (int i = 1; ok && i < x->rank; i++) ok = r->shape[i] == x->shape[i];
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: %s does not fit rows of %s (same rank and trailing dims, no more rows)",
                    n->op->name, SHAPE(r), SHAPE(x));
    if (need_bound(n, 2, "begin", err) || need_bound(n, 3, "end", err)) return -1;
    /* Known bounds are checked now, as the kernels would at run time. */
    int64_t rows = x->shape[0], k = r->shape[0], b, e;
    bool kb = known(n->in[2], &b), ke = known(n->in[3], &e);
    if (!kb) b = ke ? e - k : 0;
    if (!ke) e = b + k;
    if ((kb || ke) && (b < 0 || e > rows || e - b != k))
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: rows [%lld, %lld) of %s are not %lld rows within [0, %lld] for the "
                    "replacement %s",
                    n->op->name, (long long)b, (long long)e, SHAPE(x), (long long)k,
                    (long long)rows, SHAPE(r));
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

static int infer_rms_norm(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0], *w = n->in[1];
    if (need_dtype(n, 0, MK_DTYPES_FLOAT, err) || need_dtype(n, 1, MK_DTYPES_FLOAT, err))
        return -1;
    if (w->rank != 1 || w->shape[0] != x->shape[x->rank - 1])
        return FAIL(err, n, MK_ERR_SHAPE, "%s: weights %s must be [%lld], the last axis of %s",
                    n->op->name, SHAPE(w), (long long)x->shape[x->rank - 1], SHAPE(x));
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

static int infer_sliced_softmax(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    if (need_dtype(n, 0, MK_DTYPES_FLOAT, err) || need_bound(n, 1, "prefix", err))
        return -1;
    int64_t p, cols = x->shape[x->rank - 1];
    if (known(n->in[1], &p) && (p < 0 || p > cols))
        return FAIL(err, n, MK_ERR_SHAPE, "%s: prefix %lld is outside [0, %lld] for %s",
                    n->op->name, (long long)p, (long long)cols, SHAPE(x));
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

/* x [..., T, S]: row t of the T keeps end - T + 1 + t columns, so end lies in [T, S]. */
static int infer_causal_softmax(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    if (need_dtype(n, 0, MK_DTYPES_FLOAT, err) || need_bound(n, 1, "end", err)) return -1;
    if (x->rank < 2)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: x %s needs two axes or more (rows, columns)",
                    n->op->name, SHAPE(x));
    int64_t e, t = x->shape[x->rank - 2], cols = x->shape[x->rank - 1];
    if (t > cols)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: x %s has more rows (%lld) than columns", n->op->name,
                    SHAPE(x), (long long)t);
    if (known(n->in[1], &e) && (e < t || e > cols))
        return FAIL(err, n, MK_ERR_SHAPE, "%s: end %lld is outside [%lld, %lld] for %s",
                    n->op->name, (long long)e, (long long)t, (long long)cols, SHAPE(x));
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

static int infer_embedding(mk_node *n, mk_error **err) {
    const mk_node *t = n->in[0], *ids = n->in[1];
    if (t->rank != 2)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: the table must be [V, D], not %s", n->op->name,
                    SHAPE(t));
    if (ids->dtype != MK_DTYPE_INT64)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: ids (%s) must be int64, not %s", n->op->name,
                    MK_OPERAND(n, 1), mk_dtype_name(ids->dtype));
    if (ids->rank != 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: ids must be [n], not %s", n->op->name, SHAPE(ids));
    set_shape(n, t->dtype, 2, (int64_t[]){ids->shape[0], t->shape[1]});
    return 0;
}

/* Any dtype to any (the rule: mk_convert); the target is the node's dtype
 * argument, already in n->dtype. */
static int infer_cast(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    if (!mk_dtype_row_of(n->dtype))
        return FAIL(err, n, MK_ERR_DTYPE, "%s: no target dtype", n->op->name);
    set_shape(n, n->dtype, x->rank, x->shape);
    return 0;
}

/* q int8 times scale float32 in blocks: scale has q's rank, each of its dims
 * dividing q's; element i of q takes scale[i_d / (q_d / scale_d) ...]. */
static int infer_dequantize(mk_node *n, mk_error **err) {
    const mk_node *q = n->in[0], *s = n->in[1];
    if (need_dtype(n, 0, MK_DTYPE_BIT(MK_DTYPE_INT8), err) ||
        need_dtype(n, 1, MK_DTYPE_BIT(MK_DTYPE_FLOAT32), err))
        return -1;
    bool ok = q->rank == s->rank;
    for (int d = 0; ok && d < q->rank; d++) ok = q->shape[d] % s->shape[d] == 0;
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: scales %s do not divide %s into blocks (same rank, each dim a divisor)",
                    n->op->name, SHAPE(s), SHAPE(q));
    set_shape(n, MK_DTYPE_FLOAT32, q->rank, q->shape);
    return 0;
}

/* float32 x in groups of `group` along its last axis, which the group divides. */
static int infer_fake_quantize(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int64_t g = n->attr[0], last = x->shape[x->rank - 1];
    if (need_dtype(n, 0, MK_DTYPE_BIT(MK_DTYPE_FLOAT32), err)) return -1;
    if (g < 1 || last % g)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: groups of %lld do not divide the last axis of %s",
                    n->op->name, (long long)g, SHAPE(x));
    set_shape(n, MK_DTYPE_FLOAT32, x->rank, x->shape);
    return 0;
}

static int infer_argmax(mk_node *n, mk_error **err) {
    if (need_dtype(n, 0, MK_DTYPES_FLOAT, err)) return -1;
    set_shape(n, MK_DTYPE_INT64, n->in[0]->rank, n->in[0]->shape);
    n->shape[n->rank - 1] = 1;
    return 0;
}

/* A float32 [1] operand read on the device at run time (temperature, top-p). */
static int need_scalar(mk_node *n, int k, const char *what, mk_error **err) {
    const mk_node *x = n->in[k];
    if (x->dtype != MK_DTYPE_FLOAT32)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: %s (%s) must be float32, not %s", n->op->name,
                    what, MK_OPERAND(n, k), mk_dtype_name(x->dtype));
    if (x->rank != 1 || x->shape[0] != 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s (%s) must have shape [1], not %s",
                    n->op->name, what, MK_OPERAND(n, k), SHAPE(x));
    return 0;
}

/* logits float32 [..., n]; state int64 [..., 1] (a generator per row);
 * temperature and top-p float32 [1]; result int64 [..., 2]: (token, state). */
static int infer_sample(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0], *s = n->in[1];
    if (need_dtype(n, 0, MK_DTYPE_BIT(MK_DTYPE_FLOAT32), err)) return -1;
    if (s->dtype != MK_DTYPE_INT64)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: the generator state (%s) must be int64, not %s",
                    n->op->name, MK_OPERAND(n, 1), mk_dtype_name(s->dtype));
    bool ok = s->rank == x->rank && s->shape[s->rank - 1] == 1;
    for (int d = 0; ok && d < x->rank - 1; d++) ok = s->shape[d] == x->shape[d];
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: the generator state %s must be the logits' %s with a last axis of 1",
                    n->op->name, SHAPE(s), SHAPE(x));
    if (x->shape[x->rank - 1] > INT32_MAX)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s has more than 2^31 - 1 classes", n->op->name,
                    SHAPE(x));
    if (need_scalar(n, 2, "the temperature", err) || need_scalar(n, 3, "top-p", err)) return -1;
    set_shape(n, MK_DTYPE_INT64, x->rank, x->shape);
    n->shape[n->rank - 1] = 2;
    return 0;
}

/* The rows' probabilities after a head (mk_sample_head). */
static size_t sample_scratch(const mk_node *n) {
    const mk_node *x = n->in[0];
    int64_t cols = x->shape[x->rank - 1], rows = mk_node_numel(x) / cols;
    return mk_sample_head(rows, cols) + (size_t)mk_node_numel(x) * sizeof(float);
}

/* Rows only passes make: a script naming one is refused before this runs. */
static int infer_internal(mk_node *n, mk_error **err) {
    return FAIL(err, n, MK_ERR_NAME, "%s is made by the compiler's passes; scripts cannot use it",
                n->op->name);
}

/* ---- view layouts: strides and byte offset into the input's memory ---------- */

static int64_t layout_slice(const mk_node *n, int64_t *stride) {
    const mk_node *x = n->in[0]; /* rows [begin, end) of x: an offset, same strides */
    memcpy(stride, x->stride, sizeof x->stride);
    return n->attr[0] * x->stride[0] * (int64_t)mk_dtype_size(x->dtype);
}

static int64_t layout_reshape(const mk_node *n, int64_t *stride) {
    mk_contiguous_strides(n->rank, n->shape, stride); /* x is dense (the verifier checks) */
    return 0;
}

static int64_t layout_permute(const mk_node *n, int64_t *stride) {
    for (int k = 0; k < n->rank; k++) stride[k] = n->in[0]->stride[n->attr[k]];
    return 0;
}

static int64_t layout_same(const mk_node *n, int64_t *stride) {
    memcpy(stride, n->in[0]->stride, sizeof n->in[0]->stride); /* in place: x itself */
    return 0;
}

/* ---- strided operands --------------------------------------------------------- */

/* A matrix product reads each matrix with a unit stride along one of its two
 * axes (normal or transposed for BLAS) and any batch stride; a vector must be
 * dense. */
static bool matmul_takes(int k, int rank, const int64_t *shape, const int64_t *stride) {
    (void)k;
    if (rank == 1) return shape[0] == 1 || stride[0] == 1;
    int r = rank - 2, c = rank - 1;
    for (int d = 0; d < r; d++) /* batch strides as cuBLAS takes them: never negative */
        if (stride[d] < 0) return false;
    return stride[c] == 1 || stride[r] == 1 || shape[r] == 1 || shape[c] == 1;
}

/* A product alone with low-precision weights widens them into scratch first
 * (a matrix–vector group reads them as they are). */
static size_t matmul_scratch(const mk_node *n) {
    const mk_node *b = n->in[1];
    return b->dtype == MK_DTYPE_FLOAT32 ? 0 : (size_t)mk_node_numel(b) * sizeof(float);
}

/* Kernels that walk any strides (a fused group's operands keep theirs). */
static bool any_strides(int k, int rank, const int64_t *shape, const int64_t *stride) {
    (void)k, (void)rank, (void)shape, (void)stride;
    return true;
}

/* ---- the table ------------------------------------------------------------ */

#define ROW(name_, sig, role_, flags_, method_, infix_, expr_, summary_)                         \
    .name = name_, .signature = sig, .role = role_, .flags = flags_, .method = method_,          \
    .infix = infix_, .expr = expr_, .summary = summary_
#define POINTWISE(name_, sig, flags_, method_, infix_, expr_, summary_)                          \
    {ROW(name_, sig, MK_ROLE_POINTWISE, flags_, method_, infix_, expr_, summary_),               \
     .infer = infer_pointwise, .kernel = MK_KERNEL_POINTWISE}
/* A pointwise row with its own dtype rule (activations: floats; comparisons:
 * bool results; logical ops: bool operands). */
#define POINTWISE_RULE(name_, sig, flags_, method_, infix_, expr_, infer_, summary_)             \
    {ROW(name_, sig, MK_ROLE_POINTWISE, flags_, method_, infix_, expr_, summary_),               \
     .infer = infer_, .kernel = MK_KERNEL_POINTWISE}
#define BINARY (MK_OP_BROADCAST)
#define COMMUTING (MK_OP_BROADCAST | MK_OP_COMMUTES)

static const mk_op ops[] = {
    {ROW("InputTensor", "sdl", MK_ROLE_LEAF, MK_OP_FUNCTION, "input", NULL, NULL,
         "a tensor fed at every evaluation"),
     .leaf = MK_LEAF_INPUT, .infer = infer_leaf},
    {ROW("ConstantTensor", "sdl", MK_ROLE_LEAF, MK_OP_FUNCTION, "constant", NULL, NULL,
         "weights, given at compile time"),
     .leaf = MK_LEAF_CONSTANT, .infer = infer_leaf},
    {ROW("BufferTensor", "dlo", MK_ROLE_LEAF, MK_OP_FUNCTION, "buffer", NULL, NULL,
         "persistent state, zero after compile, kept across evaluations; a name lets another "
         "model share it"),
     .leaf = MK_LEAF_BUFFER, .infer = infer_leaf},

    POINTWISE("SumNode", "nn", COMMUTING, "add", "+", "a + b", "a + b, broadcast as NumPy's"),
    POINTWISE("SubNode", "nn", BINARY, "sub", "-", "a - b", "a - b, broadcast as NumPy's"),
    POINTWISE("HadamardProductNode", "nn", COMMUTING, "mul", "*", "a * b",
              "a * b elementwise, broadcast as NumPy's"),
    POINTWISE("DivNode", "nn", BINARY, "div", "/", "a / b", "a / b, broadcast as NumPy's"),
    POINTWISE("ReLUNode", "n", 0, "relu", NULL, "a > 0 ? a : 0", "max(x, 0)"),
    /* as run.c's SwiGLU writes it, so llama2 outputs match run.c bit for bit */
    POINTWISE("SiLUNode", "n", 0, "silu", NULL, "a * (1.0f / (1.0f + expf(-a)))",
              "x * sigmoid(x)"),
    POINTWISE("ExpNode", "n", 0, "exp", NULL, "expf(a)", "e^x"),
    POINTWISE("TanhNode", "n", 0, "tanh", NULL, "tanhf(a)", "tanh(x)"),
    POINTWISE("SigmoidNode", "n", 0, "sigmoid", NULL, "1.0f / (1.0f + expf(-a))",
              "1 / (1 + e^-x)"),
    POINTWISE("GELUNode", "n", 0, "gelu", NULL,
              "0.5f * a * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a)))",
              "GELU, tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"),

    /* ---- pointwise: math, activations, comparisons, logic (issue 64) ---- */
    POINTWISE("NegNode", "n", 0, "neg", "-", "-a", "-x"),
    POINTWISE("AbsNode", "n", 0, "abs", NULL, "fabsf(a)", "|x| (int64: wraps at its minimum)"),
    POINTWISE("SqrtNode", "n", 0, "sqrt", NULL, "sqrtf(a)", "square root"),
    POINTWISE("RsqrtNode", "n", 0, "rsqrt", NULL, "1.0f / sqrtf(a)", "1 / sqrt(x)"),
    POINTWISE("LogNode", "n", 0, "log", NULL, "logf(a)", "natural logarithm"),
    POINTWISE("Exp2Node", "n", 0, "exp2", NULL, "exp2f(a)", "2^x"),
    POINTWISE("SinNode", "n", 0, "sin", NULL, "sinf(a)", "sine"),
    POINTWISE("CosNode", "n", 0, "cos", NULL, "cosf(a)", "cosine"),
    POINTWISE("ErfNode", "n", 0, "erf", NULL, "erff(a)", "the error function"),
    POINTWISE("FloorNode", "n", 0, "floor", NULL, "floorf(a)", "largest integer <= x"),
    POINTWISE("CeilNode", "n", 0, "ceil", NULL, "ceilf(a)", "smallest integer >= x"),
    POINTWISE("RoundNode", "n", 0, "round", NULL, "rintf(a)",
              "nearest integer, ties to even (torch.round, ONNX Round)"),
    POINTWISE("SignNode", "n", 0, "sign", NULL, "(a > 0) - (a < 0)", "1, 0 or -1"),
    POINTWISE("ReciprocalNode", "n", 0, "reciprocal", NULL, "1.0f / a", "1 / x"),
    POINTWISE_RULE("LeakyReLUNode", "nn", BINARY, "leaky_relu", NULL, "a > 0 ? a : b * a",
                   infer_float_pointwise,
                   "x where x > 0, else alpha x (alpha: float32 [1] or broadcast; Lua's default "
                   "0.01)"),
    POINTWISE_RULE("ELUNode", "nn", BINARY, "elu", NULL, "a > 0 ? a : b * expm1f(a)",
                   infer_float_pointwise,
                   "x where x > 0, else alpha (e^x - 1) (Lua's default alpha 1)"),
    POINTWISE_RULE("SoftplusNode", "n", 0, "softplus", NULL, "a > 20.0f ? a : log1pf(expf(a))",
                   infer_float_pointwise, "log(1 + e^x); x itself past 20 (torch's threshold)"),
    POINTWISE_RULE("GELUErfNode", "n", 0, "gelu_erf", NULL,
                   "a * 0.5f * (1.0f + erff(a * 0.70710678118654752f))", infer_float_pointwise,
                   "GELU, erf form: x/2 (1 + erf(x / sqrt(2))) (GELUNode is the tanh form)"),
    POINTWISE_RULE("HardSwishNode", "n", 0, "hardswish", NULL,
                   "a * min(max(a + 3.0f, 0.0f), 6.0f) / 6.0f", infer_float_pointwise,
                   "x min(max(x + 3, 0), 6) / 6"),
    POINTWISE_RULE("MishNode", "n", 0, "mish", NULL,
                   "a * tanhf(a > 20.0f ? a : log1pf(expf(a)))", infer_float_pointwise,
                   "x tanh(softplus(x))"),
    POINTWISE("PowNode", "nn", BINARY, "pow", "^", "powf(a, b)",
              "a^b (C's powf), broadcast as NumPy's"),
    POINTWISE("MinimumNode", "nn", COMMUTING, "minimum", NULL, "min(a, b)",
              "a < b ? a : b, broadcast as NumPy's (b where either is NaN)"),
    POINTWISE("MaximumNode", "nn", COMMUTING, "maximum", NULL, "max(a, b)",
              "a > b ? a : b, broadcast as NumPy's (b where either is NaN)"),
    POINTWISE("ModNode", "nn", BINARY, "mod", "%", "floormod(a, b)",
              "a - b floor(a / b): the divisor's sign, as Python's % and torch.remainder "
              "(int64 by 0: 0)"),
    POINTWISE("FloorDivNode", "nn", BINARY, "floor_div", "//", "floordiv(a, b)",
              "floor(a / b) as Python's // (int64 by 0: 0)"),
    POINTWISE("ClampNode", "nnn", BINARY, "clamp", NULL, "min(max(a, b), c)",
              "min(max(x, lo), hi), the three broadcast as NumPy's"),
    POINTWISE_RULE("EqualNode", "nn", COMMUTING, "eq", NULL, "a == b", infer_compare,
                   "a == b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("NotEqualNode", "nn", COMMUTING, "ne", NULL, "a != b", infer_compare,
                   "a != b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("LessNode", "nn", BINARY, "lt", NULL, "a < b", infer_compare,
                   "a < b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("LessEqualNode", "nn", BINARY, "le", NULL, "a <= b", infer_compare,
                   "a <= b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("GreaterNode", "nn", BINARY, "gt", NULL, "a > b", infer_compare,
                   "a > b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("GreaterEqualNode", "nn", BINARY, "ge", NULL, "a >= b", infer_compare,
                   "a >= b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("WhereNode", "nnn", BINARY | MK_OP_FUNCTION, "where", NULL, "a ? b : c",
                   infer_where, "where(c, a, b): a where the bool c holds, else b; the three broadcast "
                   "as NumPy's"),
    POINTWISE_RULE("LogicalAndNode", "nn", COMMUTING, "logical_and", NULL, "min(a, b)",
                   infer_logical, "a and b, bool"),
    POINTWISE_RULE("LogicalOrNode", "nn", COMMUTING, "logical_or", NULL, "max(a, b)",
                   infer_logical, "a or b, bool"),
    POINTWISE_RULE("LogicalNotNode", "n", 0, "logical_not", NULL, "a == 0", infer_logical,
                   "not a, bool"),
    {ROW("ComplexHadamardProductNode", "nn", MK_ROLE_POINTWISE, COMMUTING, "complex_mul", NULL,
         NULL, "a * b as complex numbers (re, im) along a last axis of 2, broadcast as NumPy's"),
     .infer = infer_complex_mul, .kernel = MK_KERNEL_COMPLEX_MUL},

    {ROW("MatMulNode", "nn", MK_ROLE_MATMUL, 0, "matmul", NULL, NULL,
         "a @ b as numpy.matmul: [.., m, k] @ [.., k, n] with batch dims broadcast; a [k] "
         "is a row and b [k] a column, dropped from the result"),
     .alias = "MulNode", .infer = infer_matmul, .takes_strided = matmul_takes,
     .scratch = matmul_scratch, .kernel = MK_KERNEL_MATMUL},
    {ROW("PrefixMatMulNode", "nnr", MK_ROLE_MATMUL, 0, "matmul_prefix", NULL, NULL,
         "a @ b over the first p elements of the shared axis (attention over a cache's first "
         "p rows)"),
     .infer = infer_prefix_matmul, .takes_strided = matmul_takes,
     .kernel = MK_KERNEL_PREFIX_MATMUL},
    {ROW("RmsNormNode", "nn", MK_ROLE_REDUCTION, 0, "rms_norm", NULL, NULL,
         "w * x / sqrt(mean(x^2) + 1e-5) over the last axis"),
     .infer = infer_rms_norm, .kernel = MK_KERNEL_RMS_NORM},
    {ROW("SlicedSoftmaxNode", "nr", MK_ROLE_REDUCTION, 0, "sliced_softmax", NULL, NULL,
         "softmax of the first prefix elements of each row, the rest unchanged"),
     .infer = infer_sliced_softmax, .kernel = MK_KERNEL_SLICED_SOFTMAX},
    {ROW("CausalSoftmaxNode", "nr", MK_ROLE_REDUCTION, 0, "causal_softmax", NULL, NULL,
         "causal attention's softmax over the last axis of x [..., T, S]: row t of the T over "
         "its first end - T + 1 + t elements, the rest zero (T queries after end - T cached "
         "keys)"),
     .infer = infer_causal_softmax, .kernel = MK_KERNEL_CAUSAL_SOFTMAX},
    {ROW("ArgMaxNode", "n", MK_ROLE_REDUCTION, 0, "argmax", NULL, NULL,
         "int64 index of the largest element of the last axis (the first on ties)"),
     .infer = infer_argmax, .kernel = MK_KERNEL_ARGMAX},
    {ROW("SampleNode", "nnnn", MK_ROLE_REDUCTION, 0, "sample", NULL, NULL,
         "run.c's sampler per row of logits: int64 (token, next generator state) from the "
         "state, a temperature and a top-p (float32 [1]); temperature > 0 draws from the "
         "softmax of logits / temperature (top-p when 0 < p < 1), otherwise the argmax and the "
         "state unchanged"),
     .infer = infer_sample, .scratch = sample_scratch, .kernel = MK_KERNEL_SAMPLE},
    /* ---- reductions and norms ---- */
    /* rules in ops_reduce.c; kernels in core/cpu/reduce.c and kernels/reduce.cu. Axes are
     * 0-based, negative ones from the end; a reduced axis stays as 1 in the script (the Lua
     * methods drop it unless keepdims = true). Lua: x:sum([axes][, {keepdims = bool}]),
     * axes an integer or a list, all axes when left out; the same for mean, max, min, prod */
/* a reduction over an axis list, and one along a single axis: operands of any strides */
#define REDUCTION(name_, method_, summary_, infer_, kernel_)                                     \
    {ROW(name_, "nl", MK_ROLE_REDUCTION, 0, method_, NULL, NULL, summary_), .infer = infer_,      \
     .takes_strided = any_strides, .kernel = MK_KERNEL_##kernel_}
#define REDUCTION_AT(name_, method_, summary_, infer_, kernel_)                                  \
    {ROW(name_, "ni", MK_ROLE_REDUCTION, 0, method_, NULL, NULL, summary_), .infer = infer_,      \
     .takes_strided = any_strides, .kernel = MK_KERNEL_##kernel_}
    REDUCTION("ReduceSumNode", "sum", "sum over the listed axes, each kept as 1 (Lua: "
              "x:sum([axes][, {keepdims = false}]), all axes when left out)",
              mk_infer_reduce, REDUCE_SUM),
    REDUCTION("ReduceMeanNode", "mean", "mean over the listed axes, each kept as 1 (Lua: "
              "x:mean([axes][, {keepdims = false}]))", mk_infer_reduce, REDUCE_MEAN),
    REDUCTION("ReduceMaxNode", "max", "largest element over the listed axes, each kept as 1; "
              "NaN if any is (Lua: x:max([axes][, {keepdims = false}]))",
              mk_infer_reduce, REDUCE_MAX),
    REDUCTION("ReduceMinNode", "min", "smallest element over the listed axes, each kept as 1; "
              "NaN if any is (Lua: x:min([axes][, {keepdims = false}]))",
              mk_infer_reduce, REDUCE_MIN),
    REDUCTION("ReduceProdNode", "prod", "product over the listed axes, each kept as 1 (Lua: "
              "x:prod([axes][, {keepdims = false}]))", mk_infer_reduce, REDUCE_PROD),
    {ROW("ReduceVarNode", "nnl", MK_ROLE_REDUCTION, 0, "var", NULL, NULL,
         "variance over the listed axes, sum((x - mean)^2) / (N - correction), correction a "
         "float32 [1] (0: NumPy's default, 1: torch's); each axis kept as 1 (Lua: "
         "x:var([axes][, {correction = 0, keepdims = false}]))"),
     .infer = mk_infer_var, .takes_strided = any_strides, .kernel = MK_KERNEL_REDUCE_VAR},
    REDUCTION_AT("ArgMaxAxisNode", "argmax_axis", "int64 index of the largest element along "
                 "one axis, the first on ties (a NaN wins), the axis kept as 1 (Lua: "
                 "x:argmax(axis[, {keepdims = false}]); x:argmax() is ArgMaxNode)",
                 mk_infer_arg_reduce, ARGMAX_AXIS),
    REDUCTION_AT("ArgMinAxisNode", "argmin", "int64 index of the smallest element along one "
                 "axis, the first on ties (a NaN wins), the axis kept as 1 (Lua: "
                 "x:argmin([axis][, {keepdims = false}]); without an axis the last, kept)",
                 mk_infer_arg_reduce, ARGMIN_AXIS),
    REDUCTION_AT("SoftmaxNode", "softmax", "e^(x - max) / sum(e^(x - max)) along one axis "
                 "(Lua: x:softmax([axis]), the last when left out)", mk_infer_softmax, SOFTMAX),
    REDUCTION_AT("LogSoftmaxNode", "log_softmax", "x - max - log(sum(e^(x - max))) along one "
                 "axis (Lua: x:log_softmax([axis]), the last when left out)", mk_infer_softmax,
                 LOG_SOFTMAX),
    {ROW("LayerNormNode", "nnnni", MK_ROLE_REDUCTION, 0, "layer_norm", NULL, NULL,
         "(x - mean) / sqrt(var + eps) * weight + bias over x's last k axes (var: the mean "
         "square deviation); weight and bias of those axes' shape or [1], eps float32 [1] "
         "(Lua: x:layer_norm([k][, {weight =, bias =, eps = 1e-5}]), k 1 when left out)"),
     .infer = mk_infer_layer_norm, .kernel = MK_KERNEL_LAYER_NORM},
    {ROW("GroupNormNode", "nnnni", MK_ROLE_REDUCTION, 0, "group_norm", NULL, NULL,
         "x [N, C, ...] normalized per sample over each of `groups` groups of C / groups "
         "channels, as layer_norm, then weight [C] * . + bias [C] (or [1]) (Lua: "
         "x:group_norm(groups[, {weight =, bias =, eps = 1e-5}]))"),
     .infer = mk_infer_group_norm, .kernel = MK_KERNEL_GROUP_NORM},
    {ROW("BatchNormNode", "nnnnnn", MK_ROLE_REDUCTION, 0, "batch_norm", NULL, NULL,
         "inference batch norm of x [N, C, ...] over channel axis 1: (x - mean) / sqrt(var + "
         "eps) * weight + bias, each [C] (or [1]) (Lua: x:batch_norm(mean, var[, {weight =, "
         "bias =, eps = 1e-5}]))"),
     .infer = mk_infer_batch_norm, .kernel = MK_KERNEL_BATCH_NORM},
    {ROW("RmsNormEpsNode", "nnn", MK_ROLE_REDUCTION, 0, "rms_norm_eps", NULL, NULL,
         "w * x / sqrt(mean(x^2) + eps) over the last axis, eps float32 [1] (Lua: "
         "x:rms_norm(w, eps); x:rms_norm(w) is RmsNormNode, eps 1e-5)"),
     .infer = mk_infer_rms_norm_eps, .kernel = MK_KERNEL_RMS_NORM_EPS},
    /* made by the row-group pass (group_rows.c) */
    {ROW("RowsGroupNode", "s", MK_ROLE_GROUP, MK_OP_INTERNAL, NULL, NULL, NULL,
         "a row reduction with the pointwise nodes before and after it, as one loop"),
     .infer = infer_internal, .takes_strided = any_strides, .kernel = MK_KERNEL_ROWS_GROUP},

    {ROW("SliceNode", "nii", MK_ROLE_VIEW, 0, "slice", NULL, NULL,
         "rows [begin, end) of the first axis"),
     .infer = infer_slice, .layout = layout_slice},
    {ROW("ReshapeNode", "nl", MK_ROLE_VIEW, 0, "reshape", NULL, NULL,
         "the same elements in a new shape"),
     .infer = infer_reshape, .layout = layout_reshape},
    {ROW("PermuteNode", "nl", MK_ROLE_MOVE, 0, "permute", NULL, NULL, "axes reordered"),
     .infer = infer_permute, .layout = layout_permute, .kernel = MK_KERNEL_PERMUTE},
    {ROW("ReplaceSliceNode", "nnrr", MK_ROLE_INPLACE, 0, "replace", NULL, NULL,
         "writes r into rows [begin, end) of x in place and returns x"),
     .infer = infer_replace_slice, .layout = layout_same, .kernel = MK_KERNEL_REPLACE_SLICE},
    {ROW("CastNode", "nd", MK_ROLE_MOVE, 0, "cast", NULL, NULL,
         "x converted to dtype (floats round to nearest even; to integers toward zero, "
         "saturated)"),
     .infer = infer_cast, .takes_strided = any_strides, .kernel = MK_KERNEL_CAST},
    {ROW("DequantizeNode", "nn", MK_ROLE_MOVE, 0, "dequantize", NULL, NULL,
         "float32 q * scale: int8 q, float32 scale with one value per block of q (each of its "
         "dims divides q's)"),
     .infer = infer_dequantize, .takes_strided = any_strides, .kernel = MK_KERNEL_DEQUANTIZE},
    {ROW("FakeQuantizeNode", "ni", MK_ROLE_REDUCTION, 0, "fake_quantize", NULL, NULL,
         "x on the int8 grid of its groups of g along the last axis: s = max|x| / 127 per "
         "group, s * round(x / s), halves away from zero (runq.c's activations; 0 where s is 0)"),
     .infer = infer_fake_quantize, .kernel = MK_KERNEL_FAKE_QUANTIZE},
    {ROW("EmbeddingNode", "nn", MK_ROLE_MOVE, MK_OP_FUNCTION, "embedding", NULL, NULL,
         "rows of table [V, D] picked by int64 ids [n]"),
     .infer = infer_embedding, .kernel = MK_KERNEL_EMBEDDING},

    /* ---- shape and data movement ---- */
    /* rules and layouts in ops_shape.c; axes negative from the end; the rows
     * with a layout and the PERMUTE kernel are views where their readers take
     * the strides, else strided copies */
    {ROW("SliceAxisNode", "niiii", MK_ROLE_MOVE, 0, "slice_axis", NULL, NULL,
         "x[begin:end:step] along axis, as Python slices (bounds negative from the end, "
         "clamped; step positive): a strided view where its readers take one"),
     .infer = mk_infer_slice_axis, .layout = mk_layout_slice_axis, .takes_strided = any_strides,
     .kernel = MK_KERNEL_PERMUTE},
    {ROW("SqueezeNode", "ni", MK_ROLE_VIEW, 0, "squeeze", NULL, NULL,
         "x without axis, which must be 1 (a view)"),
     .infer = mk_infer_squeeze, .layout = mk_layout_dense},
    {ROW("UnsqueezeNode", "ni", MK_ROLE_VIEW, 0, "unsqueeze", NULL, NULL,
         "x with a new axis of 1 at axis of the result (a view)"),
     .infer = mk_infer_unsqueeze, .layout = mk_layout_dense},
    {ROW("FlattenNode", "nii", MK_ROLE_VIEW, 0, "flatten", NULL, NULL,
         "axes start to end of x (both included) as one (a view)"),
     .infer = mk_infer_flatten, .layout = mk_layout_dense},
    {ROW("ExpandNode", "nl", MK_ROLE_MOVE, 0, "expand", NULL, NULL,
         "x broadcast to shape as NumPy's (-1 keeps x's dim): a view with stride 0 where its "
         "readers take one"),
     .infer = mk_infer_expand, .layout = mk_layout_expand, .takes_strided = any_strides,
     .kernel = MK_KERNEL_PERMUTE},
    {ROW("FlipNode", "ni", MK_ROLE_MOVE, 0, "flip", NULL, NULL, "x reversed along axis"),
     .infer = mk_infer_flip, .takes_strided = any_strides, .kernel = MK_KERNEL_FLIP},
    {ROW("ConcatNode", "nni", MK_ROLE_MOVE, 0, "concat", NULL, NULL,
         "a then b along axis (same dtype, equal dims but that axis)"),
     .infer = mk_infer_concat, .takes_strided = any_strides, .kernel = MK_KERNEL_CONCAT},
    {ROW("PadNode", "nniiii", MK_ROLE_MOVE, 0, "pad_axis", NULL, NULL,
         "x with before and after elements added along axis: mode 0 the value (float32 [1], "
         "converted to x's dtype), 1 reflect (numpy's), 2 edge"),
     .infer = mk_infer_pad, .takes_strided = any_strides, .kernel = MK_KERNEL_PAD},
    {ROW("TileNode", "nl", MK_ROLE_MOVE, 0, "tile", NULL, NULL,
         "numpy.tile: x repeated reps times along each axis"),
     .infer = mk_infer_tile, .takes_strided = any_strides, .kernel = MK_KERNEL_TILE},
    {ROW("RepeatInterleaveNode", "nii", MK_ROLE_MOVE, 0, "repeat_interleave", NULL, NULL,
         "each index of axis repeated `repeats` times in place (torch.repeat_interleave)"),
     .infer = mk_infer_repeat_interleave, .takes_strided = any_strides,
     .kernel = MK_KERNEL_REPEAT_INTERLEAVE},
    {ROW("GatherElementsNode", "nni", MK_ROLE_MOVE, 0, "gather", NULL, NULL,
         "torch.gather / ONNX GatherElements: out[i] = x[i with axis' index = index[i]], "
         "int64 index (negative from the end) of x's rank"),
     .infer = mk_infer_gather_elements, .takes_strided = any_strides,
     .kernel = MK_KERNEL_GATHER_ELEMENTS},
    {ROW("IndexSelectNode", "nni", MK_ROLE_MOVE, 0, "index_select", NULL, NULL,
         "ONNX Gather: x's axis replaced by int64 index's dims (negative from the end)"),
     .infer = mk_infer_index_select, .takes_strided = any_strides,
     .kernel = MK_KERNEL_INDEX_SELECT},
    {ROW("CumsumNode", "ni", MK_ROLE_REDUCTION, 0, "cumsum", NULL, NULL,
         "running sums along axis, in order (float32, int64)"),
     .infer = mk_infer_cumsum, .takes_strided = any_strides, .kernel = MK_KERNEL_CUMSUM},
    /* ---- convolution and pooling ---- */
    /* PyTorch's definitions for NCL / NCHW float32 tensors; the shape rules are
     * in ops_conv.c, the attribute order in conv.h. A bias is a SumNode of a
     * [O, 1(, 1)] view after the product (the Lua methods' `bias` option). */
    {ROW("Conv1dNode", "nniiii", MK_ROLE_MATMUL, 0, "conv1d", NULL, NULL,
         "1-D cross-correlation of x [N, C, L] with w [O, C/groups, K]: stride, padding, "
         "dilation, groups"),
     .infer = mk_infer_conv, .scratch = mk_conv_scratch, .kernel = MK_KERNEL_CONV},
    {ROW("Conv2dNode", "nniiiiiii", MK_ROLE_MATMUL, 0, "conv2d", NULL, NULL,
         "2-D cross-correlation of x [N, C, H, W] with w [O, C/groups, kH, kW]: stride (h, w), "
         "padding (h, w), dilation (h, w), groups"),
     .infer = mk_infer_conv, .scratch = mk_conv_scratch, .kernel = MK_KERNEL_CONV},
    {ROW("ConvTranspose2dNode", "nniiiiiiiii", MK_ROLE_MATMUL, 0, "conv_transpose2d", NULL,
         NULL,
         "transposed 2-D convolution of x [N, C, H, W] with w [C, O/groups, kH, kW]: stride "
         "(h, w), padding (h, w), output padding (h, w), dilation (h, w), groups"),
     .infer = mk_infer_conv_transpose, .scratch = mk_conv_transpose_scratch,
     .kernel = MK_KERNEL_CONV_TRANSPOSE},
    {ROW("MaxPool2dNode", "niiiiiiii", MK_ROLE_REDUCTION, 0, "max_pool2d", NULL, NULL,
         "the largest element of each window of x [N, C, H, W]: kernel (h, w), stride (h, w), "
         "padding (h, w; at most half the kernel), dilation (h, w); floor rule"),
     .infer = mk_infer_pool, .kernel = MK_KERNEL_MAX_POOL},
    {ROW("AvgPool2dNode", "niiiiii", MK_ROLE_REDUCTION, 0, "avg_pool2d", NULL, NULL,
         "the mean of each window of x [N, C, H, W], padding counted (kernel (h, w), stride "
         "(h, w), padding (h, w; at most half the kernel)); floor rule"),
     .infer = mk_infer_pool, .kernel = MK_KERNEL_AVG_POOL},
    {ROW("AdaptiveAvgPool2dNode", "nii", MK_ROLE_REDUCTION, 0, "adaptive_avg_pool2d", NULL,
         NULL,
         "x [N, C, H, W] averaged into [N, C, oh, ow]: cell (i, j) over rows "
         "[floor(i H / oh), ceil((i + 1) H / oh)) and the columns alike; (1, 1) is global "
         "pooling"),
     .infer = mk_infer_resize, .kernel = MK_KERNEL_ADAPTIVE_AVG_POOL},
    {ROW("UpsampleNearest2dNode", "nii", MK_ROLE_MOVE, 0, "upsample_nearest2d", NULL, NULL,
         "x [N, C, H, W] resized to [N, C, oh, ow] by nearest neighbour: element (i, j) is x's "
         "(floor(i H / oh), floor(j W / ow))"),
     .infer = mk_infer_resize, .kernel = MK_KERNEL_UPSAMPLE_NEAREST},

    /* made by the cuDNN fusion pass (fusion.c), never parsed: its name field
     * describes the group */
    /* made by the grouping pass (group.c): a pointwise tree as one program */
    {ROW("PointwiseGroupNode", "s", MK_ROLE_GROUP, MK_OP_INTERNAL, NULL, NULL, NULL,
         "several pointwise nodes run as one program"),
     .infer = infer_internal, .takes_strided = any_strides, .kernel = MK_KERNEL_POINTWISE},
    /* made by the matrix–vector pass (product.c): products with their prologue
     * and epilogues as one node, and a view standing for each of its results */
    {ROW("ProductGroupNode", "s", MK_ROLE_GROUP, MK_OP_INTERNAL, NULL, NULL, NULL,
         "matrix-vector products with the nodes before and after them, as one"),
     .infer = infer_internal, .takes_strided = any_strides, .scratch = mk_group_scratch,
     .kernel = MK_KERNEL_PRODUCT},
    {ROW("GroupOutputNode", "s", MK_ROLE_VIEW, MK_OP_INTERNAL, NULL, NULL, NULL,
         "a result of a group: a view of the memory the group wrote"),
     .infer = infer_internal, .takes_strided = any_strides},
    {ROW("CudnnGroupNode", "s", MK_ROLE_GROUP, MK_OP_INTERNAL, NULL, NULL, NULL,
         "a cuDNN graph of several nodes"),
     .infer = infer_internal, .takes_strided = any_strides, .scratch = mk_group_scratch,
     .kernel = MK_KERNEL_CUDNN_GROUP},
};
#define N_OPS (sizeof ops / sizeof ops[0])

const mk_op *mk_op_find(const char *name, size_t len) {
    for (size_t i = 0; i < N_OPS; i++) {
        const mk_op *op = &ops[i];
        if ((strlen(op->name) == len && !memcmp(op->name, name, len)) ||
            (op->alias && strlen(op->alias) == len && !memcmp(op->alias, name, len)))
            return op;
    }
    return NULL;
}

const mk_op *mk_op_internal(mk_kernel_id kernel) {
    for (size_t i = 0; i < N_OPS; i++)
        if (ops[i].kernel == kernel && (ops[i].flags & MK_OP_INTERNAL)) return &ops[i];
    return NULL;
}

mk_storage mk_op_leaf_storage(const mk_op *op) {
    switch (op->leaf) {
    case MK_LEAF_CONSTANT: return MK_STORAGE_CONSTANT;
    case MK_LEAF_BUFFER: return MK_STORAGE_BUFFER;
    default: return MK_STORAGE_ARENA; /* inputs: a slot the planner places */
    }
}

bool mk_op_operand_is_bound(const mk_op *op, int k) {
    int seen = 0;
    for (const char *c = op->signature; *c; c++)
        if (*c == 'n' || *c == 'r') {
            if (seen == k) return *c == 'r';
            seen++;
        }
    return false;
}

/* ---- expressions, compiled once per process -------------------------------------- */

static mk_expr programs[N_OPS];
static bool program_ok[N_OPS];
static pthread_once_t programs_once = PTHREAD_ONCE_INIT;

static void compile_programs(void) {
    for (size_t i = 0; i < N_OPS; i++) {
        mk_error *err = NULL;
        program_ok[i] = ops[i].expr && mk_expr_compile(ops[i].expr, &programs[i], &err) == 0;
        mk_error_free(err); /* a row that fails is a bug the op tests catch */
    }
}

const mk_expr *mk_op_program(const mk_op *op) {
    if (!op || op < ops || op >= ops + N_OPS || !op->expr) return NULL;
    pthread_once(&programs_once, compile_programs);
    return program_ok[op - ops] ? &programs[op - ops] : NULL;
}

/* ---- the public view of the table -------------------------------------------------- */

MK_API size_t mk_op_count(void) { return N_OPS; }

static mk_op_desc descs[N_OPS];
static pthread_once_t descs_once = PTHREAD_ONCE_INIT;

static void fill_descs(void) {
    for (size_t i = 0; i < N_OPS; i++) {
        const mk_op *op = &ops[i];
        descs[i] = (mk_op_desc){op->name,  op->alias,  op->signature, op->role, op->leaf,
                                op->flags, op->method, op->infix,     op->expr, op->summary};
    }
}

MK_API const mk_op_desc *mk_op_info(size_t i) {
    if (i >= N_OPS) return NULL;
    pthread_once(&descs_once, fill_descs);
    return &descs[i];
}

MK_API const char *mk_op_role_name(mk_op_role role) {
    static const char *const names[] = {
        [MK_ROLE_LEAF] = "leaf",           [MK_ROLE_POINTWISE] = "pointwise",
        [MK_ROLE_REDUCTION] = "reduction", [MK_ROLE_MATMUL] = "matmul",
        [MK_ROLE_VIEW] = "view",           [MK_ROLE_INPLACE] = "inplace",
        [MK_ROLE_MOVE] = "move",           [MK_ROLE_GROUP] = "group",
    };
    return (unsigned)role < sizeof names / sizeof names[0] ? names[role] : NULL;
}

MK_API const char *mk_leaf_kind_name(mk_leaf_kind kind) {
    static const char *const names[] = {
        [MK_LEAF_INPUT] = "input", [MK_LEAF_CONSTANT] = "constant", [MK_LEAF_BUFFER] = "buffer"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : NULL;
}

int mk_node_infer(mk_node *n, mk_error **err) {
    if (n->op->infer(n, err)) return -1;
    /* results larger than their operands (a product, a gather) are bounded too */
    if (!mk_shape_numel(n->rank, n->shape))
        return FAIL(err, n, MK_ERR_SHAPE, "%s: the result %s has more than 2^48 elements",
                    n->op->name, SHAPE(n));
    return 0;
}

/* ---- the front ends' entry: one op checked outside a script ---------------- */

static int count_letters(const char *sig, const char *letters) {
    int k = 0;
    for (; *sig; sig++) k += strchr(letters, *sig) != NULL;
    return k;
}

MK_API int mk_op_infer(const char *name, const mk_tensor_info *inputs, size_t n_inputs,
                       const int64_t *attrs, size_t n_attrs, mk_tensor_info *out,
                       mk_error **err) {
    if (!name || !out || (n_inputs && !inputs) || (n_attrs && !attrs))
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_op_infer: NULL argument");
    const mk_op *op = mk_op_find(name, strlen(name));
    if (!op) return mk_fail(err, MK_ERR_NAME, 0, 0, "unknown node '%s'", name);
    if (op->role == MK_ROLE_LEAF || (op->flags & MK_OP_INTERNAL))
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_op_infer: %s is not built from operands",
                       name);
    int want_in = count_letters(op->signature, "nr");
    int want_i = count_letters(op->signature, "i");
    bool list = count_letters(op->signature, "l") > 0;
    if ((int)n_inputs != want_in)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "%s takes %d operands, got %zu", name, want_in,
                       n_inputs);
    if (list ? (n_attrs < 1 || n_attrs > MK_MAX_RANK) : (int)n_attrs != want_i)
        return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: %zu integer arguments (%s %d)", name,
                       n_attrs, list ? "a list of 1 to" : "needs",
                       list ? MK_MAX_RANK : want_i);

    mk_node operands[MK_MAX_INPUTS];
    mk_node n = {.op = op, .n_in = (int)n_inputs, .n_attr = (int)n_attrs};
    for (size_t i = 0; i < n_inputs; i++) {
        const mk_tensor_info *t = &inputs[i];
        mk_node *x = &operands[i];
        /* named as the front end names it; no statement: messages say "operand i" */
        *x = (mk_node){.name = (char *)t->name, .dtype = t->dtype, .rank = t->rank};
        if (t->rank < 1 || t->rank > MK_MAX_RANK || !mk_dtype_row_of(t->dtype) ||
            !mk_shape_numel(t->rank, t->shape))
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "%s: operand %zu is not a valid tensor",
                           name, i + 1);
        memcpy(x->shape, t->shape, sizeof x->shape);
        /* a value is only read for bounds: int64 [1] */
        if (t->value && mk_op_operand_is_bound(op, (int)i) && t->dtype == MK_DTYPE_INT64 &&
            t->rank == 1 && t->shape[0] == 1)
            x->value = t->value;
        n.in[i] = x;
    }
    if (n_attrs) memcpy(n.attr, attrs, sizeof(int64_t) * n_attrs);
    if (strchr(op->signature, 'd')) n.dtype = out->dtype; /* the dtype argument */
    if (mk_node_infer(&n, err)) return -1;
    *out = (mk_tensor_info){.name = NULL, .dtype = n.dtype, .rank = n.rank};
    memcpy(out->shape, n.shape, sizeof out->shape);
    return 0;
}
