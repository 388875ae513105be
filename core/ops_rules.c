/*
 * ops_rules.c — the shape/dtype rules, view layouts and strided-operand rules
 * of the op table's first rows (core/ops.c): leaves, pointwise, products,
 * llama2's norms and softmaxes, views, casts and quantization, the sampler.
 * The newer families keep theirs beside them (ops_shape.c, ops_reduce.c,
 * ops_conv.c). Each rule fills a node's dtype, rank and shape from its
 * operands and attributes, or fails naming the op and the node's line.
 */
#include "ops_rules.h"
#include "group.h"
#include "reductions.h"

#include <stdio.h>
#include <string.h>

/* ---- shape/dtype rules ---------------------------------------------------- */


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

/* A bound of one value, or of one a run (signature letter r): int64 [1], or
 * [N] where N > 1 divides `lead`, the leading dim that it splits into N equal
 * runs, each with its own value (a batch's sequences, each at its own
 * position); lead 0 takes [1] only. */
static int need_bounds(mk_node *n, int k, const char *what, int64_t lead, mk_error **err) {
    const mk_node *x = n->in[k];
    if (x->dtype == MK_DTYPE_INT64 && x->rank == 1 && x->shape[0] > 1 && lead > 0 &&
        lead % x->shape[0] == 0)
        return 0;
    if (x->dtype != MK_DTYPE_INT64 || x->rank != 1 || x->shape[0] == 1 || lead <= 0)
        return need_bound(n, k, what, err);
    return FAIL(err, n, MK_ERR_SHAPE,
                "%s: %s (%s) must have shape [1], or [N] with N dividing %lld (one a run of the "
                "first axis), not %s",
                n->op->name, what, MK_OPERAND(n, k), (long long)lead, SHAPE(x));
}

/* A bound's value where the caller knows it (mk_op_infer from a front end). */
static bool known(const mk_node *x, int64_t *v) {
    if (!x->value) return false;
    *v = *(const int64_t *)x->value;
    return true;
}

int mk_infer_leaf(mk_node *n, mk_error **err) {
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
int mk_infer_pointwise(mk_node *n, mk_error **err) {
    const mk_expr *e = mk_op_program(n->op);
    if (!e) return MK_INTERNAL(err, "a pointwise row's expression does not compile");
    unsigned dtypes = e->has_float_only ? MK_DTYPES_FLOAT
                                        : MK_DTYPES_ALL & ~MK_DTYPE_BIT(MK_DTYPE_BOOL);
    return infer_broadcast(n, dtypes, err);
}

/* Activations: floats only, whatever their expression. */
int mk_infer_float_pointwise(mk_node *n, mk_error **err) {
    return infer_broadcast(n, MK_DTYPES_FLOAT, err);
}

/* Comparisons: two operands of one dtype (bool too), broadcast; a bool result. */
int mk_infer_compare(mk_node *n, mk_error **err) {
    if (infer_broadcast(n, MK_DTYPES_ALL, err)) return -1;
    n->dtype = MK_DTYPE_BOOL;
    return 0;
}

/* logical_and, _or, _not: bool operands, broadcast; a bool result. */
int mk_infer_logical(mk_node *n, mk_error **err) {
    return infer_broadcast(n, MK_DTYPE_BIT(MK_DTYPE_BOOL), err);
}

/* where(c, a, b): c bool, a and b of one dtype, the three broadcast together. */
int mk_infer_where(mk_node *n, mk_error **err) {
    if (n->in[0]->dtype != MK_DTYPE_BOOL)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: the condition (%s) must be bool, not %s",
                    n->op->name, MK_OPERAND(n, 0), mk_dtype_name(n->in[0]->dtype));
    if (same_dtype(n, 1, 3, MK_DTYPES_ALL, err) || broadcast(n, 0, 3, err)) return -1;
    n->dtype = n->in[1]->dtype;
    return 0;
}

int mk_infer_complex_mul(mk_node *n, mk_error **err) {
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
int mk_infer_matmul(mk_node *n, mk_error **err) {
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
int mk_infer_prefix_matmul(mk_node *n, mk_error **err) {
    const mk_node *a = n->in[0], *b = n->in[1];
    if (matmul_dtypes(n, err)) return -1;
    int64_t out[MK_MAX_RANK];
    int rank;
    if (!plain_matmul_shape(a, b, out, &rank))
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: cannot multiply %s by %s (takes [k]@[k,n], [m,k]@[k,n], [B,m,k]@[B,k,n])",
                    n->op->name, SHAPE(a), SHAPE(b));
    set_shape(n, MK_DTYPE_FLOAT32, rank, out);
    if (need_bounds(n, 2, "the prefix", rank == 3 ? out[0] : 0, err)) return -1;
    int64_t p, s = n->in[0]->shape[n->in[0]->rank - 1];
    if (known(n->in[2], &p) && (p < 0 || p > s))
        return FAIL(err, n, MK_ERR_SHAPE, "%s: prefix %lld is outside [0, %lld]", n->op->name,
                    (long long)p, (long long)s);
    return 0;
}

int mk_infer_slice(mk_node *n, mk_error **err) {
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
int mk_infer_reshape(mk_node *n, mk_error **err) {
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

int mk_infer_permute(mk_node *n, mk_error **err) {
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

int mk_infer_replace_slice(mk_node *n, mk_error **err) {
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

int mk_infer_rms_norm(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0], *w = n->in[1];
    if (need_dtype(n, 0, MK_DTYPES_FLOAT, err) || need_dtype(n, 1, MK_DTYPES_FLOAT, err))
        return -1;
    if (w->rank != 1 || w->shape[0] != x->shape[x->rank - 1])
        return FAIL(err, n, MK_ERR_SHAPE, "%s: weights %s must be [%lld], the last axis of %s",
                    n->op->name, SHAPE(w), (long long)x->shape[x->rank - 1], SHAPE(x));
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

int mk_infer_sliced_softmax(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    if (need_dtype(n, 0, MK_DTYPES_FLOAT, err) ||
        need_bounds(n, 1, "prefix", x->rank >= 2 ? x->shape[0] : 0, err))
        return -1;
    int64_t p, cols = x->shape[x->rank - 1];
    if (known(n->in[1], &p) && (p < 0 || p > cols))
        return FAIL(err, n, MK_ERR_SHAPE, "%s: prefix %lld is outside [0, %lld] for %s",
                    n->op->name, (long long)p, (long long)cols, SHAPE(x));
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

/* x [..., T, S]: row t of the T keeps end - T + 1 + t columns, so end lies in [T, S]. */
int mk_infer_causal_softmax(mk_node *n, mk_error **err) {
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

int mk_infer_embedding(mk_node *n, mk_error **err) {
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
int mk_infer_cast(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    if (!mk_dtype_row_of(n->dtype))
        return FAIL(err, n, MK_ERR_DTYPE, "%s: no target dtype", n->op->name);
    set_shape(n, n->dtype, x->rank, x->shape);
    return 0;
}

/* q int8 times scale float32 in blocks: scale has q's rank, each of its dims
 * dividing q's; element i of q takes scale[i_d / (q_d / scale_d) ...]. */
int mk_infer_dequantize(mk_node *n, mk_error **err) {
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
int mk_infer_fake_quantize(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0];
    int64_t g = n->attr[0], last = x->shape[x->rank - 1];
    if (need_dtype(n, 0, MK_DTYPE_BIT(MK_DTYPE_FLOAT32), err)) return -1;
    if (g < 1 || last % g)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: groups of %lld do not divide the last axis of %s",
                    n->op->name, (long long)g, SHAPE(x));
    set_shape(n, MK_DTYPE_FLOAT32, x->rank, x->shape);
    return 0;
}

int mk_infer_argmax(mk_node *n, mk_error **err) {
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
 * temperature and top-p float32 [1], or one a row ([rows]); result int64
 * [..., 2]: (token, state). */
int mk_infer_sample(mk_node *n, mk_error **err) {
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
    int64_t rows = mk_node_numel(x) / x->shape[x->rank - 1];
    for (int k = 2; k < 4; k++) {
        const mk_node *v = n->in[k];
        if (rows > 1 && v->dtype == MK_DTYPE_FLOAT32 && v->rank == 1 && v->shape[0] == rows) continue;
        if (need_scalar(n, k, k == 2 ? "the temperature" : "top-p", err)) return -1;
    }
    set_shape(n, MK_DTYPE_INT64, x->rank, x->shape);
    n->shape[n->rank - 1] = 2;
    return 0;
}

/* The rows' probabilities after a head (mk_sample_head). */
size_t mk_sample_scratch(const mk_node *n) {
    const mk_node *x = n->in[0];
    int64_t cols = x->shape[x->rank - 1], rows = mk_node_numel(x) / cols;
    return mk_sample_head(rows, cols) + (size_t)mk_node_numel(x) * sizeof(float);
}

/* Rows only passes make: a script naming one is refused before this runs. */
int mk_infer_internal(mk_node *n, mk_error **err) {
    return FAIL(err, n, MK_ERR_NAME, "%s is made by the compiler's passes; scripts cannot use it",
                n->op->name);
}

/* ---- view layouts: strides and byte offset into the input's memory ---------- */

int64_t mk_layout_slice(const mk_node *n, int64_t *stride) {
    const mk_node *x = n->in[0]; /* rows [begin, end) of x: an offset, same strides */
    memcpy(stride, x->stride, sizeof x->stride);
    return n->attr[0] * x->stride[0] * (int64_t)mk_dtype_size(x->dtype);
}

int64_t mk_layout_reshape(const mk_node *n, int64_t *stride) {
    mk_contiguous_strides(n->rank, n->shape, stride); /* x is dense (the verifier checks) */
    return 0;
}

int64_t mk_layout_permute(const mk_node *n, int64_t *stride) {
    for (int k = 0; k < n->rank; k++) stride[k] = n->in[0]->stride[n->attr[k]];
    return 0;
}

int64_t mk_layout_same(const mk_node *n, int64_t *stride) {
    memcpy(stride, n->in[0]->stride, sizeof n->in[0]->stride); /* in place: x itself */
    return 0;
}

/* ---- strided operands --------------------------------------------------------- */

/* A matrix product reads each matrix with a unit stride along one of its two
 * axes (normal or transposed for BLAS) and any batch stride; a vector must be
 * dense. */
bool mk_matmul_takes(int k, int rank, const int64_t *shape, const int64_t *stride) {
    (void)k;
    if (rank == 1) return shape[0] == 1 || stride[0] == 1;
    int r = rank - 2, c = rank - 1;
    for (int d = 0; d < r; d++) /* batch strides as cuBLAS takes them: never negative */
        if (stride[d] < 0) return false;
    return stride[c] == 1 || stride[r] == 1 || shape[r] == 1 || shape[c] == 1;
}

/* A product alone with low-precision weights widens them into scratch first
 * (a matrix–vector group reads them as they are). */
size_t mk_matmul_scratch(const mk_node *n) {
    const mk_node *b = n->in[1];
    return b->dtype == MK_DTYPE_FLOAT32 ? 0 : (size_t)mk_node_numel(b) * sizeof(float);
}

/* Kernels that walk any strides (a fused group's operands keep theirs). */
bool mk_any_strides(int k, int rank, const int64_t *shape, const int64_t *stride) {
    (void)k, (void)rank, (void)shape, (void)stride;
    return true;
}
