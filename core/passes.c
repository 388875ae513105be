/*
 * passes.c — the ordered passes between parsing and planning. Each is a named
 * function over the graph; the table below is the whole pipeline. The
 * verifier runs last in every build: it is linear and cheap, and what it
 * checks (owners, order, dense inputs) is what the planner and binder rely on.
 */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

/* ---- consumers ----------------------------------------------------------- */

static int count_consumers(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err) {
    for (int i = 0; i < g->n_nodes; i++) g->nodes[i]->n_consumers = 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) g->nodes[i]->in[k]->n_consumers++;
    return 0;
}

/* ---- dead nodes ------------------------------------------------------------- */

/* root[i]: the index of the node at the end of node i's chain of first
 * operands through views, copies that may be views, and in-place writes:
 * every node sharing memory with node i has the same root (the converse need
 * not hold). One sweep in graph order, each node taking its first operand's
 * root, so a chain of views costs its length once, not once per node. NULL
 * when out of memory. */
static int *memory_roots(const mk_graph *g) {
    int *root = malloc(sizeof *root * (size_t)(g->n_nodes ? g->n_nodes : 1));
    for (int i = 0; root && i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        root[i] = n->op->layout && n->n_in > 0 ? root[n->in[0]->index] : i;
    }
    return root;
}

/*
 * Nodes whose result reaches neither the output nor persistent state leave the
 * graph (they would run every evaluation for nothing, and their dtypes would
 * still have to suit a kernel). Roots: the output, in-place writes into a
 * BufferTensor (the next evaluation sees them), and in-place writes into memory
 * that a live node (or the output) reads after them, through the node written
 * into or a view of it: `$5 = ReplaceSliceNode($1, ...); result = $1;` outputs
 * the write. Leaves stay: they are the model's interface (its inputs and
 * constants are given by name either way).
 */
static int drop_dead(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err) {
    if (opts->no_passes || g->n_nodes == 0) return 0;
    /* read_later[r]: the memory rooted at node r is read after the node looked at */
    bool *live = calloc((size_t)g->n_nodes * 2, sizeof *live);
    int *root = memory_roots(g);
    if (!live || !root) {
        free(live);
        free(root);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "dropping dead nodes");
    }
    bool *read_later = live + g->n_nodes;
    for (int o = 0; o < g->n_outputs; o++) {
        live[g->outputs[o]->index] = true;
        read_later[root[g->outputs[o]->index]] = true;
    }
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const mk_node *n = g->nodes[i];
        /* an in-place write's leaf: the leaf its memory is, if any */
        const mk_node *leaf = n->op->role == MK_ROLE_INPLACE ? g->nodes[root[i]] : NULL;
        if (leaf && leaf->op->role != MK_ROLE_LEAF) leaf = NULL;
        if (n->op->role == MK_ROLE_LEAF || (leaf && leaf->op->leaf == MK_LEAF_BUFFER) ||
            (n->op->role == MK_ROLE_INPLACE && read_later[root[i]]))
            live[i] = true;
        if (live[i])
            for (int k = 0; k < n->n_in; k++) {
                live[n->in[k]->index] = true;
                read_later[root[n->in[k]->index]] = true;
            }
    }
    free(root);
    int kept = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *n = g->nodes[i];
        if (!live[i]) {
            free(n->name);
            free(n);
            continue;
        }
        n->index = kept;
        g->nodes[kept++] = n;
    }
    g->n_nodes = kept;
    free(live);
    return count_consumers(g, opts, t, err);
}

/* ---- storage and views ----------------------------------------------------- */

/*
 * A copy that may be a view (its op's layout, role MK_ROLE_MOVE) is one when
 * every reader takes it with those strides, it is not the output (callers get
 * dense memory), and no in-place write into the memory it would view comes
 * between it and its last reader: the copy is what the graph means (its
 * input's values at its place), and a view read after such a write would see
 * the write.
 */
static bool may_stay_view(const mk_graph *g, const int *root_of, const mk_node *p,
                          const int64_t *stride) {
    if (mk_is_output(g, p) || p->n_consumers == 0) return false;
    int root = root_of[p->in[0]->index];
    bool written = false;
    for (int i = p->index + 1, readers = p->n_consumers; readers > 0; i++) {
        const mk_node *c = g->nodes[i];
        for (int k = 0; k < c->n_in; k++) {
            if (c->in[k] != p) continue;
            if (written || !(c->op->takes_strided &&
                             c->op->takes_strided(k, p->rank, p->shape, stride)))
                return false;
            readers--;
        }
        written = written || (c->op->role == MK_ROLE_INPLACE && root_of[c->index] == root);
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
 * a copy that may be a view is one only where its readers take the strides. */
static int assign_storage(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                          mk_error **err) {
    int *root = memory_roots(g);
    if (!root) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "assigning storage");
    int rc = 0;
    for (int i = 0; i < g->n_nodes && !rc; i++) {
        mk_node *n = g->nodes[i];
        const mk_op *op = n->op;
        if (op->role == MK_ROLE_LEAF) {
            own(n, mk_op_leaf_storage(op));
            continue;
        }
        int64_t stride[MK_MAX_RANK];
        int64_t offset = op->layout ? op->layout(n, stride) : 0;
        bool is_view = op->layout && (op->role == MK_ROLE_VIEW || op->role == MK_ROLE_INPLACE ||
                                      (!opts->no_passes && may_stay_view(g, root, n, stride)));
        if (!is_view) {
            own(n, MK_STORAGE_ARENA);
            continue;
        }
        const mk_node *x = n->in[0];
        if (op->role == MK_ROLE_INPLACE && x->owner->storage == MK_STORAGE_CONSTANT) {
            rc = mk_fail(err, MK_ERR_ARGUMENT, n->line, n->column,
                         "%s cannot write into the constant '%s'", op->name, x->owner->name);
            break;
        }
        n->storage = MK_STORAGE_VIEW;
        n->owner = x->owner;
        n->view_offset = x->view_offset + offset;
        memcpy(n->stride, stride, sizeof n->stride);
    }
    free(root);
    return rc;
}

/* ---- verifier --------------------------------------------------------------- */

/* Invariants the planner and binder rely on. */
static int verify(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err) {
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        const mk_op *op = n->op;
        if (!n->owner || n->owner->owner != n->owner || n->owner->index > n->index)
            return MK_INTERNAL(err, "a node's owner is not an earlier owning node");
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k]->index >= n->index) return MK_INTERNAL(err, "graph is not in order");
        if (op->layout) continue; /* views, in-place writes and copies read through their layout */
        for (int k = 0; k < n->n_in; k++) {
            const mk_node *x = n->in[k];
            mk_tensor t = {.rank = x->rank};
            memcpy(t.shape, x->shape, sizeof t.shape);
            memcpy(t.stride, x->stride, sizeof t.stride);
            bool ok = op->takes_strided ? op->takes_strided(k, x->rank, x->shape, x->stride)
                                        : mk_tensor_is_contiguous(&t);
            if (!ok) return MK_INTERNAL(err, "a strided view reaches an op that cannot read it");
        }
    }
    return 0;
}

/* ---- the pipeline ------------------------------------------------------------- */

static const struct {
    const char *name;
    int (*run)(mk_graph *, const mk_compile_options *, const mk_target *, mk_error **);
} passes[] = {
    {"count-consumers", count_consumers},
    {"drop-dead", drop_dead},           /* what reaches neither the output nor a buffer */
    {"assign-storage", assign_storage}, /* views, in-place writes, copies that stay views */
    {"fuse-cudnn", mk_fusion_pass},     /* with use_cudnn: matmul/pointwise groups (fusion.c) */
    {"convs", mk_conv_pass},            /* a convolution with its epilogue (group_conv.c) */
    {"group", mk_pointwise_pass},       /* pointwise trees as one program each (group_pointwise.c) */
    {"products", mk_product_pass},      /* matrix-vector products with what surrounds them
                                           (product.c) */
    {"rows", mk_rows_pass},             /* a row reduction with its prologue and epilogue
                                           (group_rows.c) */
    {"gathers", mk_gather_pass},        /* one-id embeddings read by those groups (gather.c) */
    {"verify", verify},
};

int mk_passes_run(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err) {
    for (size_t i = 0; i < sizeof passes / sizeof passes[0]; i++)
        if (passes[i].run(g, opts, t, err)) return -1;
    return 0;
}
