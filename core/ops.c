/*
 * ops.c — the op table: one row per node kind with its script name, argument
 * signature, flags, shape/dtype rule and kernels per device. Nothing else in
 * the compiler switches on op names; adding an op is adding a row here and its
 * kernels (core/cpu.c, kernels/).
 */
#include "internal.h"

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
    return 0;
}

static void set_shape(mk_node *n, mk_dtype dtype, int rank, const int64_t *shape) {
    n->dtype = dtype;
    n->rank = rank;
    memmove(n->shape, shape, sizeof(int64_t) * (size_t)rank);
}

static int need_dtype(mk_node *n, const mk_node *x, unsigned allowed, mk_error **err) {
    if (allowed & (1u << x->dtype)) return 0;
    return FAIL(err, n, MK_ERR_DTYPE, "%s does not take %s (operand $%d)", n->op->name,
                mk_dtype_name(x->dtype), x->id);
}
#define F32 (1u << MK_DTYPE_FLOAT32)
#define I64 (1u << MK_DTYPE_INT64)

/* An int64 [1] operand: a dynamic bound read on the device at run time. */
static int need_scalar_i64(mk_node *n, const mk_node *x, const char *what, mk_error **err) {
    if (x->dtype != MK_DTYPE_INT64)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: %s ($%d) must be int64, not %s", n->op->name, what,
                    x->id, mk_dtype_name(x->dtype));
    if (x->rank != 1 || x->shape[0] != 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s ($%d) must have shape [1], not %s",
                    n->op->name, what, x->id, SHAPE(x));
    return 0;
}

static int infer_leaf(mk_node *n, mk_error **err) {
    if (check_dims(n, n->n_attr, n->attr, err)) return -1;
    set_shape(n, n->dtype, n->n_attr, n->attr);
    return 0;
}

/* b broadcasts onto a: same rank, each dim equal or 1 (HamKaas's rule). */
static int infer_broadcast(mk_node *n, unsigned dtypes, mk_error **err) {
    const mk_node *a = n->in[0], *b = n->in[1];
    if (need_dtype(n, a, dtypes, err)) return -1;
    if (a->dtype != b->dtype)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: operands differ in dtype (%s and %s)",
                    n->op->name, mk_dtype_name(a->dtype), mk_dtype_name(b->dtype));
    bool ok = a->rank == b->rank;
    for (int i = 0; ok && i < a->rank; i++)
        ok = b->shape[i] == a->shape[i] || b->shape[i] == 1;
    if (!ok)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: %s does not broadcast to %s (same rank, each dim equal or 1)",
                    n->op->name, SHAPE(b), SHAPE(a));
    set_shape(n, a->dtype, a->rank, a->shape);
    return 0;
}

static int infer_add_mul(mk_node *n, mk_error **err) { return infer_broadcast(n, F32 | I64, err); }

static int infer_complex_mul(mk_node *n, mk_error **err) {
    if (infer_broadcast(n, F32, err)) return -1;
    if (n->shape[n->rank - 1] != 2 || n->in[1]->shape[n->rank - 1] != 2)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: the last axis holds (re, im) and must be 2 in both, got %s and %s",
                    n->op->name, SHAPE(n->in[0]), SHAPE(n->in[1]));
    return 0;
}

static int infer_unary(mk_node *n, unsigned dtypes, mk_error **err) {
    if (need_dtype(n, n->in[0], dtypes, err)) return -1;
    set_shape(n, n->in[0]->dtype, n->in[0]->rank, n->in[0]->shape);
    return 0;
}
static int infer_relu(mk_node *n, mk_error **err) { return infer_unary(n, F32 | I64, err); }
static int infer_silu(mk_node *n, mk_error **err) { return infer_unary(n, F32, err); }

static int infer_matmul(mk_node *n, mk_error **err) {
    const mk_node *a = n->in[0], *b = n->in[1];
    if (need_dtype(n, a, F32, err) || need_dtype(n, b, F32, err)) return -1;
    int64_t out[3];
    int rank = -1;
    if (a->rank == 1 && b->rank == 2 && a->shape[0] == b->shape[0]) {
        out[0] = b->shape[1];
        rank = 1;
    } else if (a->rank == 2 && b->rank == 2 && a->shape[1] == b->shape[0]) {
        out[0] = a->shape[0], out[1] = b->shape[1];
        rank = 2;
    } else if (a->rank == 3 && b->rank == 3 && a->shape[0] == b->shape[0] &&
               a->shape[2] == b->shape[1]) {
        out[0] = a->shape[0], out[1] = a->shape[1], out[2] = b->shape[2];
        rank = 3;
    }
    if (rank < 0)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: cannot multiply %s by %s (takes [k]@[k,n], [m,k]@[k,n], [B,m,k]@[B,k,n])",
                    n->op->name, SHAPE(a), SHAPE(b));
    set_shape(n, MK_DTYPE_FLOAT32, rank, out);
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

static int infer_reshape(mk_node *n, mk_error **err) {
    if (check_dims(n, n->n_attr, n->attr, err)) return -1;
    int64_t k = 1;
    for (int i = 0; i < n->n_attr; i++) k *= n->attr[i];
    if (k != mk_node_numel(n->in[0]))
        return FAIL(err, n, MK_ERR_SHAPE, "%s: %s has %lld elements, %s would need %lld",
                    n->op->name, SHAPE(n->in[0]), (long long)mk_node_numel(n->in[0]),
                    mk_shape_str(n->n_attr, n->attr, (char[96]){0}, 96), (long long)k);
    set_shape(n, n->in[0]->dtype, n->n_attr, n->attr);
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
    if (need_scalar_i64(n, n->in[2], "begin", err) || need_scalar_i64(n, n->in[3], "end", err))
        return -1;
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

static int infer_rms_norm(mk_node *n, mk_error **err) {
    const mk_node *x = n->in[0], *w = n->in[1];
    if (need_dtype(n, x, F32, err) || need_dtype(n, w, F32, err)) return -1;
    if (w->rank != 1 || w->shape[0] != x->shape[x->rank - 1])
        return FAIL(err, n, MK_ERR_SHAPE, "%s: weights %s must be [%lld], the last axis of %s",
                    n->op->name, SHAPE(w), (long long)x->shape[x->rank - 1], SHAPE(x));
    set_shape(n, x->dtype, x->rank, x->shape);
    return 0;
}

static int infer_sliced_softmax(mk_node *n, mk_error **err) {
    if (need_dtype(n, n->in[0], F32, err) || need_scalar_i64(n, n->in[1], "prefix", err))
        return -1;
    set_shape(n, n->in[0]->dtype, n->in[0]->rank, n->in[0]->shape);
    return 0;
}

static int infer_embedding(mk_node *n, mk_error **err) {
    const mk_node *t = n->in[0], *ids = n->in[1];
    if (t->rank != 2)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: the table must be [V, D], not %s", n->op->name,
                    SHAPE(t));
    if (ids->dtype != MK_DTYPE_INT64)
        return FAIL(err, n, MK_ERR_DTYPE, "%s: ids ($%d) must be int64, not %s", n->op->name,
                    ids->id, mk_dtype_name(ids->dtype));
    if (ids->rank != 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: ids must be [n], not %s", n->op->name, SHAPE(ids));
    set_shape(n, t->dtype, 2, (int64_t[]){ids->shape[0], t->shape[1]});
    return 0;
}

static int infer_argmax(mk_node *n, mk_error **err) {
    if (need_dtype(n, n->in[0], F32, err)) return -1;
    set_shape(n, MK_DTYPE_INT64, n->in[0]->rank, n->in[0]->shape);
    n->shape[n->rank - 1] = 1;
    return 0;
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

/* ---- the table ------------------------------------------------------------ */

#ifdef MK_WITH_CUDA
#define KERNELS(k) {mk_cpu_##k, mk_cuda_##k}
#else
#define KERNELS(k) {mk_cpu_##k, NULL}
#endif

#define ARENA MK_STORAGE_ARENA
const mk_op mk_ops[] = {
    /* name, alias, signature, flags, infer, storage, layout, scratch, kernels */
    {"InputTensor", NULL, "sdl", MK_OPF_LEAF, infer_leaf, ARENA, NULL, NULL, {NULL, NULL}},
    {"ConstantTensor", NULL, "sdl", MK_OPF_LEAF, infer_leaf, MK_STORAGE_CONSTANT, NULL, NULL,
     {NULL, NULL}},
    {"BufferTensor", NULL, "dl", MK_OPF_LEAF, infer_leaf, MK_STORAGE_BUFFER, NULL, NULL,
     {NULL, NULL}},
    {"SumNode", NULL, "nn", MK_OPF_POINTWISE | MK_OPF_BROADCAST, infer_add_mul, ARENA, NULL, NULL, KERNELS(sum)},
    {"HadamardProductNode", NULL, "nn", MK_OPF_POINTWISE | MK_OPF_BROADCAST, infer_add_mul, ARENA, NULL, NULL,
     KERNELS(hadamard)},
    {"ReLUNode", NULL, "n", MK_OPF_POINTWISE, infer_relu, ARENA, NULL, NULL, KERNELS(relu)},
    {"SiLUNode", NULL, "n", MK_OPF_POINTWISE, infer_silu, ARENA, NULL, NULL, KERNELS(silu)},
    {"MatMulNode", "MulNode", "nn", MK_OPF_STRIDED_IN, infer_matmul, ARENA, NULL, NULL,
     KERNELS(matmul)},
    {"SliceNode", NULL, "nii", MK_OPF_VIEW, infer_slice, ARENA, layout_slice, NULL, {NULL, NULL}},
    {"ReshapeNode", NULL, "nl", MK_OPF_VIEW, infer_reshape, ARENA, layout_reshape, NULL,
     {NULL, NULL}},
    {"PermuteNode", NULL, "nl", MK_OPF_MAYBE_VIEW, infer_permute, ARENA, layout_permute, NULL,
     KERNELS(permute)},
    {"ReplaceSliceNode", NULL, "nnnn", MK_OPF_INPLACE, infer_replace_slice, ARENA, layout_same,
     NULL, KERNELS(replace_slice)},
    {"RmsNormNode", NULL, "nn", 0, infer_rms_norm, ARENA, NULL, NULL, KERNELS(rms_norm)},
    {"ComplexHadamardProductNode", NULL, "nn", MK_OPF_BROADCAST, infer_complex_mul, ARENA, NULL, NULL,
     KERNELS(complex_mul)},
    {"SlicedSoftmaxNode", NULL, "nn", 0, infer_sliced_softmax, ARENA, NULL, NULL,
     KERNELS(sliced_softmax)},
    {"EmbeddingNode", NULL, "nn", 0, infer_embedding, ARENA, NULL, NULL, KERNELS(embedding)},
    {"ArgMaxNode", NULL, "n", 0, infer_argmax, ARENA, NULL, NULL, KERNELS(argmax)},
    /* made by the fusion pass (fusion.c), never parsed: its name field describes the group */
    {"CudnnGroupNode", NULL, "s", MK_OPF_STRIDED_IN, mk_fusion_infer, ARENA, NULL,
     mk_fusion_scratch, {NULL, MK_CUDNN_KERNEL}},
};
const int mk_op_count = (int)(sizeof mk_ops / sizeof mk_ops[0]);

const mk_op *mk_op_find(const char *name, size_t len) {
    for (int i = 0; i < mk_op_count; i++) {
        const mk_op *op = &mk_ops[i];
        if ((strlen(op->name) == len && !memcmp(op->name, name, len)) ||
            (op->alias && strlen(op->alias) == len && !memcmp(op->alias, name, len)))
            return op;
    }
    return NULL;
}

/* ---- the front ends' entry: one op checked outside a script ---------------- */

static int count_letters(const char *sig, char c) {
    int k = 0;
    for (; *sig; sig++) k += *sig == c;
    return k;
}

MK_API int mk_op_infer(const char *name, const mk_tensor_info *inputs, size_t n_inputs,
                       const int64_t *attrs, size_t n_attrs, mk_tensor_info *out,
                       mk_error **err) {
    if (!name || !out || (n_inputs && !inputs) || (n_attrs && !attrs))
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_op_infer: NULL argument");
    const mk_op *op = mk_op_find(name, strlen(name));
    if (!op) return mk_fail(err, MK_ERR_NAME, 0, 0, "unknown node '%s'", name);
    if (op->flags & MK_OPF_LEAF)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_op_infer: %s has no operands", name);
    int want_in = count_letters(op->signature, 'n');
    int want_i = count_letters(op->signature, 'i');
    bool list = count_letters(op->signature, 'l') > 0;
    if ((int)n_inputs != want_in)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "%s takes %d operands, got %zu", name, want_in,
                       n_inputs);
    if (list ? (n_attrs < 1 || n_attrs > MK_MAX_RANK) : (int)n_attrs != want_i)
        return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: %zu integer arguments (%s)", name, n_attrs,
                       list ? "a list of 1 to 4" : want_i ? "needs 2" : "needs none");

    mk_node operands[MK_MAX_INPUTS];
    mk_node n = {.op = op, .n_in = (int)n_inputs, .n_attr = (int)n_attrs};
    for (size_t i = 0; i < n_inputs; i++) {
        const mk_tensor_info *t = &inputs[i];
        mk_node *x = &operands[i];
        *x = (mk_node){.id = (int)i + 1, .dtype = t->dtype, .rank = t->rank};
        if (t->rank < 1 || t->rank > MK_MAX_RANK || (t->dtype != MK_DTYPE_FLOAT32 &&
                                                     t->dtype != MK_DTYPE_INT64))
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "%s: operand %zu is not a valid tensor",
                           name, i + 1);
        memcpy(x->shape, t->shape, sizeof x->shape);
        n.in[i] = x;
    }
    if (n_attrs) memcpy(n.attr, attrs, sizeof(int64_t) * n_attrs);
    if (op->infer(&n, err)) return -1;
    *out = (mk_tensor_info){.name = NULL, .dtype = n.dtype, .rank = n.rank};
    memcpy(out->shape, n.shape, sizeof out->shape);
    return 0;
}
