/*
 * tensor.c — what every stage and every device shares about tensors: the
 * dtype table, sizes, strides, the strided walk the kernels iterate with, and
 * the messages of run-time faults (so the CPU and CUDA say the same thing).
 */
#include "device.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- the dtype table --------------------------------------------------------- */

/* Indexed by mk_dtype. The accumulation type is what sums and products of the
 * dtype are carried in (float32 for the low-precision floats). */
static const mk_dtype_row dtypes[MK_DTYPE_COUNT] = {
    [MK_DTYPE_FLOAT32] = {"float32", 4, "float", true, MK_DTYPE_FLOAT32},
    [MK_DTYPE_INT64] = {"int64", 8, "long long", false, MK_DTYPE_INT64},
    [MK_DTYPE_FLOAT16] = {"float16", 2, "__half", true, MK_DTYPE_FLOAT32},
    [MK_DTYPE_BFLOAT16] = {"bfloat16", 2, "__nv_bfloat16", true, MK_DTYPE_FLOAT32},
    [MK_DTYPE_INT8] = {"int8", 1, "signed char", false, MK_DTYPE_INT64},
    [MK_DTYPE_BOOL] = {"bool", 1, "unsigned char", false, MK_DTYPE_INT64},
};

const mk_dtype_row *mk_dtype_row_of(mk_dtype d) {
    return (unsigned)d < MK_DTYPE_COUNT ? &dtypes[d] : NULL;
}

MK_API size_t mk_dtype_size(mk_dtype d) {
    const mk_dtype_row *r = mk_dtype_row_of(d);
    return r ? r->size : 0;
}

MK_API const char *mk_dtype_name(mk_dtype d) {
    const mk_dtype_row *r = mk_dtype_row_of(d);
    return r ? r->name : "?";
}

MK_API bool mk_dtype_is_float(mk_dtype d) {
    const mk_dtype_row *r = mk_dtype_row_of(d);
    return r && r->is_float;
}

MK_API int mk_dtype_parse(const char *name, size_t len, mk_dtype *out) {
    if (!name) return -1;
    for (int d = 0; d < MK_DTYPE_COUNT; d++)
        if (strlen(dtypes[d].name) == len && !memcmp(dtypes[d].name, name, len)) {
            if (out) *out = (mk_dtype)d;
            return 0;
        }
    return -1;
}

/* ---- conversions (the rule: graph.h, before mk_bf16_to_f32) ------------------ */

/* Element i of src as a double (exact for every dtype but int64 past 2^53). */
static double load_f64(const void *src, mk_dtype d, int64_t i) {
    switch (d) {
    case MK_DTYPE_FLOAT32: return ((const float *)src)[i];
    case MK_DTYPE_FLOAT16: return mk_f16_to_f32(((const uint16_t *)src)[i]);
    case MK_DTYPE_BFLOAT16: return mk_bf16_to_f32(((const uint16_t *)src)[i]);
    case MK_DTYPE_INT8: return ((const int8_t *)src)[i];
    case MK_DTYPE_BOOL: return ((const uint8_t *)src)[i] != 0;
    default: return 0.0;
    }
}

MK_API int mk_convert(void *dst, mk_dtype dd, const void *src, mk_dtype sd, int64_t n) {
    if (!mk_dtype_row_of(dd) || !mk_dtype_row_of(sd) || n < 0 || (n && (!dst || !src)))
        return -1;
    if (dd == sd) {
        memmove(dst, src, (size_t)n * mk_dtype_size(dd));
        return 0;
    }
    for (int64_t i = 0; i < n; i++) {
        if (sd == MK_DTYPE_INT64) { /* integers first: int64 to int8 saturates, to floats rounds */
            int64_t v = ((const int64_t *)src)[i];
            switch (dd) {
            case MK_DTYPE_INT8: ((int8_t *)dst)[i] = (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v); break;
            case MK_DTYPE_FLOAT32: ((float *)dst)[i] = (float)v; break;
            case MK_DTYPE_FLOAT16: ((uint16_t *)dst)[i] = mk_f32_to_f16((float)v); break;
            case MK_DTYPE_BFLOAT16: ((uint16_t *)dst)[i] = mk_f32_to_bf16((float)v); break;
            case MK_DTYPE_BOOL: ((uint8_t *)dst)[i] = v != 0; break;
            default: break;
            }
            continue;
        }
        double v = load_f64(src, sd, i); /* every other source is exact as a float32 */
        switch (dd) {
        case MK_DTYPE_FLOAT32: ((float *)dst)[i] = (float)v; break;
        case MK_DTYPE_FLOAT16: ((uint16_t *)dst)[i] = mk_f32_to_f16((float)v); break;
        case MK_DTYPE_BFLOAT16: ((uint16_t *)dst)[i] = mk_f32_to_bf16((float)v); break;
        case MK_DTYPE_INT64: ((int64_t *)dst)[i] = mk_f64_to_int(v, INT64_MIN, INT64_MAX); break;
        case MK_DTYPE_INT8: ((int8_t *)dst)[i] = (int8_t)mk_f64_to_int(v, -128, 127); break;
        case MK_DTYPE_BOOL: ((uint8_t *)dst)[i] = v != 0; break; /* NaN too, as C's (bool) */
        }
    }
    return 0;
}

MK_API int mk_quantize_q8(const float *x, int64_t n, int64_t group, int8_t *q, float *scale) {
    if (group < 1 || n < 0 || n % group || (n && (!x || !q || !scale))) return -1;
    for (int64_t g = 0; g < n / group; g++) {
        const float *xg = x + g * group;
        float wmax = 0.0f;
        for (int64_t i = 0; i < group; i++) {
            float a = fabsf(xg[i]);
            if (a > wmax) wmax = a;
        }
        float s = wmax / 127.0f;
        scale[g] = s;
        for (int64_t i = 0; i < group; i++)
            q[g * group + i] = s > 0.0f ? (int8_t)mk_f64_to_int(nearbyintf(xg[i] / s), -127, 127) : 0;
    }
    return 0;
}

/* ---- shapes and strides ------------------------------------------------------- */

int64_t mk_node_numel(const mk_node *n) {
    int64_t k = 1;
    for (int i = 0; i < n->rank; i++) k *= n->shape[i];
    return k;
}

size_t mk_node_bytes(const mk_node *n) {
    return (size_t)mk_node_numel(n) * mk_dtype_size(n->dtype);
}

int64_t mk_shape_numel(int rank, const int64_t *shape) {
    int64_t k = 1;
    for (int i = 0; i < rank; i++)
        if (shape[i] <= 0 || __builtin_mul_overflow(k, shape[i], &k) || k > MK_MAX_NUMEL)
            return 0;
    return k;
}

void mk_contiguous_strides(int rank, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i];
    }
}

const char *mk_shape_str(int rank, const int64_t *shape, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < rank && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

mk_tensor mk_tensor_broadcast(const mk_tensor *b, const mk_tensor *like) {
    mk_tensor t = *b;
    int lead = like->rank - b->rank; /* b's dims are like's last b->rank */
    t.rank = like->rank;
    for (int i = 0; i < like->rank; i++) {
        int j = i - lead;
        bool repeats = j < 0 || (b->shape[j] == 1 && like->shape[i] != 1);
        t.stride[i] = repeats ? 0 : b->stride[j];
        t.shape[i] = like->shape[i];
    }
    return t;
}

int64_t mk_tensor_numel(const mk_tensor *t) {
    int64_t k = 1;
    for (int i = 0; i < t->rank; i++) k *= t->shape[i];
    return k;
}

bool mk_tensor_is_contiguous(const mk_tensor *t) {
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}

bool mk_tensor_is_dense_permuted(const mk_tensor *t) {
    int64_t covered = 1; /* dims of size > 1, taken in increasing stride order */
    bool used[MK_MAX_RANK] = {false};
    for (;;) {
        int next = -1;
        for (int d = 0; d < t->rank; d++)
            if (!used[d] && t->shape[d] > 1 && (next < 0 || t->stride[d] < t->stride[next]))
                next = d;
        if (next < 0) return true;
        if (t->stride[next] != covered) return false;
        covered *= t->shape[next];
        used[next] = true;
    }
}

/* ---- matrices as BLAS libraries see them ---------------------------------------- */

bool mk_matrix_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool *transposed,
                      int64_t *ld) {
    if (cols == 1 || sc == 1) {
        int64_t l = rows == 1 ? cols : sr;
        if (l >= cols && l >= 1 && l <= INT32_MAX) {
            *transposed = false;
            *ld = l;
            return true;
        }
    }
    if (rows == 1 || sr == 1) {
        int64_t l = cols == 1 ? rows : sc;
        if (l >= rows && l >= 1 && l <= INT32_MAX) {
            *transposed = true;
            *ld = l;
            return true;
        }
    }
    return false;
}

/* ---- the strided walk ---------------------------------------------------------- */

void mk_walk_init(mk_walk *w, int rank, const int64_t *shape, int n,
                  const int64_t *const *strides) {
    memset(w, 0, sizeof *w);
    w->n = n;
    for (int d = 0; d < rank; d++) {
        if (shape[d] == 1) continue;
        int r = w->rank;
        bool merge = r > 0;
        for (int k = 0; k < n && merge; k++)
            merge = w->stride[k][r - 1] == strides[k][d] * shape[d];
        if (merge) {
            w->shape[r - 1] *= shape[d];
            for (int k = 0; k < n; k++) w->stride[k][r - 1] = strides[k][d];
        } else {
            w->shape[r] = shape[d];
            for (int k = 0; k < n; k++) w->stride[k][r] = strides[k][d];
            w->rank++;
        }
    }
    if (w->rank == 0) { /* a single element */
        w->rank = 1;
        w->shape[0] = 1;
    }
}

int64_t mk_walk_row_offset(const mk_walk *w, int k, int64_t row) {
    int64_t off = 0;
    for (int d = w->rank - 2; d >= 0; d--) {
        off += (row % w->shape[d]) * w->stride[k][d];
        row /= w->shape[d];
    }
    return off;
}

/* ---- naming nodes in messages ---------------------------------------------------- */

const char *mk_operand_ref(const mk_node *n, int k, char *buf, size_t size) {
    const mk_node *x = n->in[k];
    if (x->name)
        snprintf(buf, size, "'%s'", x->name);
    else if (x->id > 0 && x->line > 0)
        snprintf(buf, size, "$%d, line %d", x->id, x->line);
    else
        snprintf(buf, size, "operand %d", k + 1);
    return buf;
}

/* ---- run-time faults ------------------------------------------------------------- */

/* Each names the node's op and statement (line and column, the error's prefix)
 * and the operand whose value is wrong. */
int mk_fault(mk_error **err, const mk_node *n, mk_fault_kind kind, int64_t v0, int64_t v1,
             int64_t v2) {
    const char *op = n->op->name;
    long long a = v0, b = v1, c = v2;
    int line = n->line, col = n->column;
    switch (kind) {
    case MK_FAULT_RANGE:
        return mk_fail(err, MK_ERR_EVAL, line, col,
                       "%s: rows [%lld, %lld) (begin %s, end %s) are out of range for a first "
                       "axis of %lld", op, a, b, MK_OPERAND(n, 2), MK_OPERAND(n, 3), c);
    case MK_FAULT_ROWS:
        return mk_fail(err, MK_ERR_EVAL, line, col,
                       "%s: rows [%lld, %lld) (begin %s, end %s) are %lld rows but the "
                       "replacement %s has %lld", op, a, b, MK_OPERAND(n, 2), MK_OPERAND(n, 3),
                       b - a, MK_OPERAND(n, 1), c);
    case MK_FAULT_PREFIX:
        return mk_fail(err, MK_ERR_EVAL, line, col, "%s: prefix %lld (%s) is outside [0, %lld]",
                       op, a, MK_OPERAND(n, n->n_in - 1), b); /* the bound: the last operand */
    case MK_FAULT_ID:
        return mk_fail(err, MK_ERR_EVAL, line, col,
                       "%s: id %lld at position %lld of %s is outside [0, %lld)", op, a, b,
                       MK_OPERAND(n, 1), c);
    case MK_FAULT_INDEX:
        return mk_fail(err, MK_ERR_EVAL, line, col,
                       "%s: index %lld at position %lld of %s is outside [0, %lld)", op, a, b,
                       MK_OPERAND(n, 2), c);
    case MK_FAULT_END:
        return mk_fail(err, MK_ERR_EVAL, line, col,
                       "%s: end %lld (%s) is outside [%lld, %lld] (the rows, the columns of %s)",
                       op, a, MK_OPERAND(n, 1), c, b, MK_OPERAND(n, 0));
    }
    return mk_fail(err, MK_ERR_INTERNAL, line, col, "%s: unknown run-time fault %d", op,
                   (int)kind);
}

/* ---- numpy.matmul's batches ----------------------------------------------------- */

void mk_matmul_plan_of(const mk_tensor *a, const mk_tensor *b, mk_matmul_plan *p) {
    int ra = a->rank, rb = b->rank;
    memset(p, 0, sizeof *p);
    if (ra == 1) {
        p->m = 1, p->k = a->shape[0], p->a_sr = 0, p->a_sc = a->stride[0];
    } else {
        p->m = a->shape[ra - 2], p->k = a->shape[ra - 1];
        p->a_sr = a->stride[ra - 2], p->a_sc = a->stride[ra - 1];
    }
    if (rb == 1) {
        p->n = 1, p->b_sr = b->stride[0], p->b_sc = 1;
    } else {
        p->n = b->shape[rb - 1], p->b_sr = b->stride[rb - 2], p->b_sc = b->stride[rb - 1];
    }
    /* the batch dims, aligned from the last: a's, b's, broadcast (stride 0 where one repeats) */
    int na = ra > 2 ? ra - 2 : 0, nbb = rb > 2 ? rb - 2 : 0, nd = na > nbb ? na : nbb;
    p->batched = nd > 0;
    int64_t shape[MK_MAX_RANK], as[MK_MAX_RANK], bs[MK_MAX_RANK];
    for (int d = 0; d < nd; d++) {
        int ia = d - (nd - na), ib = d - (nd - nbb);
        int64_t da = ia < 0 ? 1 : a->shape[ia], db = ib < 0 ? 1 : b->shape[ib];
        shape[d] = da > db ? da : db;
        as[d] = ia < 0 || da == 1 ? 0 : a->stride[ia];
        bs[d] = ib < 0 || db == 1 ? 0 : b->stride[ib];
    }
    /* size-1 dims dropped; a dim merged into the one before it where both operands are linear */
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 1) continue;
        int r = p->nb;
        if (r > 0 && p->a_sb[r - 1] == as[d] * shape[d] && p->b_sb[r - 1] == bs[d] * shape[d]) {
            p->batch[r - 1] *= shape[d];
            p->a_sb[r - 1] = as[d], p->b_sb[r - 1] = bs[d];
        } else {
            p->batch[r] = shape[d], p->a_sb[r] = as[d], p->b_sb[r] = bs[d];
            p->nb++;
        }
    }
    /* B repeated across the innermost batch dim and A's rows continuing across it:
     * more rows of one product (the output is contiguous, so its rows continue too) */
    while (p->nb > 0 && p->b_sb[p->nb - 1] == 0 && p->a_sr != 0 &&
           p->a_sb[p->nb - 1] == p->m * p->a_sr) {
        p->m *= p->batch[p->nb - 1];
        p->nb--;
    }
    p->count = 1;
    for (int d = 0; d < p->nb; d++) p->count *= p->batch[d];
}

void mk_matmul_batch_offsets(const mk_matmul_plan *p, int64_t t, int64_t *a_off, int64_t *b_off) {
    int64_t oa = 0, ob = 0;
    for (int d = p->nb - 1; d >= 0; d--) {
        int64_t i = t % p->batch[d];
        t /= p->batch[d];
        oa += i * p->a_sb[d], ob += i * p->b_sb[d];
    }
    *a_off = oa, *b_off = ob;
}
