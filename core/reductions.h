/*
 * reductions.h — the reductions, softmaxes and norms over any axes (the op
 * table's "reductions and norms" rows): their shape rules (ops_reduce.c), and
 * how every device splits x into what it reduces (the CPU's core/cpu/reduce.c,
 * CUDA's kernels/reduce.cu), so both read the node's axes the same way.
 *
 * A reduction of x over a set of axes is `outer` independent reductions of
 * `inner` elements each: outer runs over the kept axes, inner over the reduced
 * ones, both row-major. Element (o, i) lies at x's offset
 * mk_reduce_offset(kept, o) + mk_reduce_offset(red, i) (x's strides, any), and
 * for a result of x's shape (softmax) at the same with the result's dense
 * strides; a reduction's result (the kept axes, the others 1) is dense, so
 * its element o is at o.
 */
#ifndef MK_REDUCTIONS_H
#define MK_REDUCTIONS_H

#include "graph.h"

#ifdef __CUDACC__
#define MK_HD __host__ __device__
#else
#define MK_HD
#endif

/* ops_reduce.c: the rows' shape and dtype rules */
int mk_infer_reduce(mk_node *n, mk_error **err);      /* x, [axes] */
int mk_infer_var(mk_node *n, mk_error **err);         /* x, correction, [axes] */
int mk_infer_arg_reduce(mk_node *n, mk_error **err);  /* x, axis */
int mk_infer_softmax(mk_node *n, mk_error **err);     /* x, axis */
int mk_infer_layer_norm(mk_node *n, mk_error **err);  /* x, weight, bias, eps, k */
int mk_infer_group_norm(mk_node *n, mk_error **err);  /* x, weight, bias, eps, groups */
int mk_infer_batch_norm(mk_node *n, mk_error **err);  /* x, mean, var, weight, bias, eps */
int mk_infer_rms_norm_eps(mk_node *n, mk_error **err); /* x, weight, eps */

/* Some axes of a tensor: their sizes and strides (elements), in order. */
typedef struct {
    int n;
    int64_t shape[MK_MAX_RANK];
    int64_t stride[MK_MAX_RANK];
} mk_axes;

typedef struct {
    int64_t outer, inner; /* the reductions, and the elements each reduces */
    mk_axes kept, red;    /* x's kept and reduced axes, with x's strides */
    mk_axes kept_out, red_out; /* the same axes with the dense strides of x's shape */
} mk_reduce_plan;

/* The offset (elements) of the i-th element, row-major, of the axes a. */
static inline MK_HD int64_t mk_reduce_offset(const mk_axes *a, int64_t i) {
    int64_t off = 0;
    for (int d = a->n - 1; d >= 0; d--) {
        off += (i % a->shape[d]) * a->stride[d];
        i /= a->shape[d];
    }
    return off;
}

/* The axes node n reduces, as a bit mask over x's rank: an axis list (its
 * 'l' integers, after any 'i' ones) or one axis (its first 'i'); negative
 * ones count from the end, as Python's. The rule checked them. */
static inline unsigned mk_reduce_mask(const mk_node *n) {
    int rank = n->in[0]->rank;
    bool list = strchr(n->op->signature, 'l') != NULL;
    unsigned mask = 0;
    for (int k = 0; k < (list ? n->n_attr : 1); k++) {
        int64_t a = n->attr[k];
        mask |= 1u << (unsigned)(a < 0 ? a + rank : a);
    }
    return mask;
}

/* x (the launch's operand: shape and strides) split by the axes in mask. */
static inline mk_reduce_plan mk_reduce_plan_of(const mk_tensor *x, unsigned mask) {
    mk_reduce_plan p = {1, 1, {0}, {0}, {0}, {0}};
    int64_t dense[MK_MAX_RANK];
    mk_contiguous_strides(x->rank, x->shape, dense);
    for (int d = 0; d < x->rank; d++) {
        bool red = mask & (1u << d);
        mk_axes *a = red ? &p.red : &p.kept, *o = red ? &p.red_out : &p.kept_out;
        a->shape[a->n] = o->shape[o->n] = x->shape[d];
        a->stride[a->n++] = x->stride[d];
        o->stride[o->n++] = dense[d];
        *(red ? &p.inner : &p.outer) *= x->shape[d];
    }
    return p;
}

#endif
