/*
 * passes.c — the ordered passes between parsing and planning. Each is a named
 * function over the graph; the table below is the whole pipeline. The
 * verifier runs last in every build: it is linear and cheap, and what it
 * checks (owners, order, dense inputs) is what the planner and binder rely on.
 */
#include "internal.h"

#include <string.h>

/* ---- consumers ----------------------------------------------------------- */

static int count_consumers(mk_graph *g, const mk_compile_options *opts, mk_error **err) {
    for (int i = 0; i < g->n_nodes; i++) g->nodes[i]->n_consumers = 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) g->nodes[i]->in[k]->n_consumers++;
    return 0;
}

/* ---- storage and views ----------------------------------------------------- */

/* Can MatMul read operand `which` of shape/strides (rank, shape, stride) as is?
 * Each matrix needs a unit stride along one of its two axes (normal or
 * transposed for BLAS); a batch may have any stride. A vector must be dense. */
static bool matmul_takes(int rank, const int64_t *shape, const int64_t *stride) {
    if (rank == 1) return shape[0] == 1 || stride[0] == 1;
    int r = rank - 2, c = rank - 1;
    return stride[c] == 1 || stride[r] == 1 || shape[r] == 1 || shape[c] == 1;
}

/* A PermuteNode is a view when every reader is a MatMul that takes its strides
 * and it is not the output (callers get dense memory). */
static bool permute_is_view(const mk_graph *g, const mk_node *p, const int64_t *stride) {
    if (p == g->output || p->n_consumers == 0) return false;
    for (int i = p->index + 1; i < g->n_nodes; i++) {
        const mk_node *c = g->nodes[i];
        for (int k = 0; k < c->n_in; k++)
            if (c->in[k] == p && !((c->op->flags & MK_OPF_STRIDED_IN) &&
                                   matmul_takes(p->rank, p->shape, stride)))
                return false;
    }
    return true;
}

static void own(mk_node *n, mk_storage storage) {
    n->storage = storage;
    n->owner = n;
    n->view_offset = 0;
    mk_contiguous_strides(n->rank, n->shape, n->stride);
}

/* Owners for every node: leaves own their storage kind; views and in-place ops
 * share their first input's owner at the offset and strides their layout gives;
 * a PermuteNode is a view only where its readers take strides, else a copy. */
static int assign_storage(mk_graph *g, const mk_compile_options *opts, mk_error **err) {
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *n = g->nodes[i];
        const mk_op *op = n->op;
        if (op->flags & MK_OPF_LEAF) {
            own(n, op->storage);
            continue;
        }
        int64_t stride[MK_MAX_RANK];
        int64_t offset = op->layout ? op->layout(n, stride) : 0;
        bool is_view = (op->flags & (MK_OPF_VIEW | MK_OPF_INPLACE)) ||
                       ((op->flags & MK_OPF_MAYBE_VIEW) && !opts->no_passes &&
                        permute_is_view(g, n, stride));
        if (!is_view) {
            own(n, MK_STORAGE_ARENA);
            continue;
        }
        const mk_node *x = n->in[0];
        if ((op->flags & MK_OPF_INPLACE) && x->owner->storage == MK_STORAGE_CONSTANT)
            return mk_fail(err, MK_ERR_ARGUMENT, n->line, n->column,
                           "%s cannot write into ConstantTensor $%d", op->name, x->owner->id);
        n->storage = MK_STORAGE_VIEW;
        n->owner = x->owner;
        n->view_offset = x->view_offset + offset;
        memcpy(n->stride, stride, sizeof n->stride);
    }
    return 0;
}

/* ---- verifier --------------------------------------------------------------- */

/* Invariants the planner and binder rely on. */
static int verify(mk_graph *g, const mk_compile_options *opts, mk_error **err) {
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        if (!n->owner || n->owner->owner != n->owner || n->owner->index > n->index)
            return MK_INTERNAL(err, "a node's owner is not an earlier owning node");
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]->index >= n->index) return MK_INTERNAL(err, "graph is not in order");
        bool dense_needed = !(n->op->flags & (MK_OPF_STRIDED_IN | MK_OPF_MAYBE_VIEW |
                                              MK_OPF_VIEW | MK_OPF_INPLACE));
        for (int k = 0; k < n->n_in && dense_needed; k++) {
            mk_tensor t = {.rank = n->in[k]->rank};
            memcpy(t.shape, n->in[k]->shape, sizeof t.shape);
            memcpy(t.stride, n->in[k]->stride, sizeof t.stride);
            if (!mk_tensor_is_contiguous(&t))
                return MK_INTERNAL(err, "a strided view reaches an op that needs dense input");
        }
    }
    return 0;
}

/* ---- the pipeline ------------------------------------------------------------- */

static const struct {
    const char *name;
    int (*run)(mk_graph *, const mk_compile_options *, mk_error **);
} passes[] = {
    {"count-consumers", count_consumers},
    {"assign-storage", assign_storage}, /* views: reshape, slice, permute into matmul */
    {"fuse-cudnn", mk_fusion_pass},     /* with use_cudnn: matmul/pointwise groups (fusion.c) */
    {"verify", verify},
};

int mk_passes_run(mk_graph *g, const mk_compile_options *opts, mk_error **err) {
    for (size_t i = 0; i < sizeof passes / sizeof passes[0]; i++)
        if (passes[i].run(g, opts, err)) return -1;
    return 0;
}
