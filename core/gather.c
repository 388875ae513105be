/*
 * gather.c — the gather pass: an EmbeddingNode of one id into a constant
 * table, read only by matrix-vector groups, becomes no launch of its own.
 *
 * Such a node (a decode step's token embedding, its RoPE rows at the
 * position) is one row of the table. The node turns into a view of the
 * table's row 0 (its readers' views with it), and every group that reads it,
 * or a view of it, takes the id as one more operand and a gather: at its
 * start, after the wait for the launches before, it checks the id against
 * the table's rows and reads the operand that many rows further
 * (mk_product_gather). A decode step of stories15M loses three launches of
 * 34. The table being a constant, nothing writes it between the embedding and
 * its readers, so reading it later reads the same row.
 *
 * Device-independent, after the products pass: both devices run the groups
 * from the same fields (the CPU offsets its operand before the loop, CUDA's
 * kernel after its wait). Only A (or the x its RmsNorm normalises), an
 * epilogue's operand and a rotation may be gathered: those are read after the
 * wait; weights, scales, the norm's weight and row writes' operands are not.
 */
#include "passes.h"

/* Whether group pg reads operand k only where a gather may offset it. */
static bool gatherable(const mk_product_group *pg, int k) {
    if (pg->norm_w == k || pg->norm_b == k || pg->norm_eps == k) return false;
    for (int j = 0; j < pg->n_products; j++)
        if (pg->b[j] == k || pg->b_scale[j] == k) return false;
    for (int o = 0; o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        if (r->row_x == k || r->row_begin == k || r->row_end == k || r->row_index == k)
            return false;
    }
    return true;
}

/* Whether x is e or a view whose memory is e's. */
static bool of(const mk_node *x, const mk_node *e) { return x == e || x->owner == e; }

/*
 * Whether e may become a view: every node reading it, or a view of it, is a
 * view or a matrix-vector group reading it where a gather may, with room
 * for the id and the gathers.
 */
static bool foldable(const mk_graph *g, const mk_node *e) {
    const mk_node *t = e->in[0];
    if (e->op->kernel != MK_KERNEL_EMBEDDING || e->shape[0] != 1 || e->owner != e ||
        e->storage != MK_STORAGE_ARENA || t->owner->storage != MK_STORAGE_CONSTANT ||
        t->stride[1] != 1 || t->stride[0] != t->shape[1])
        return false;
    int readers = 0;
    for (int o = 0; o < g->n_outputs; o++)
        if (of(g->outputs[o], e)) return false;
    for (int i = e->index + 1; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        if (of(n, e)) { /* a view of it, not a write in place into it */
            if (n->storage != MK_STORAGE_VIEW || n->op->role == MK_ROLE_INPLACE) return false;
            continue;
        }
        int reads = 0, fresh = 1;
        for (int k = 0; k < n->n_in; k++) {
            if (!of(n->in[k], e)) continue;
            const mk_product_group *pg = mk_node_product(n);
            if (!pg || pg->kind != MK_PRODUCT_MATVEC || !gatherable(pg, k)) return false;
            reads++;
        }
        if (!reads) continue;
        for (int k = 0; k < n->n_in; k++) fresh = fresh && n->in[k] != e->in[1];
        if (mk_node_product(n)->n_gathers + reads > MK_GATHERS_MAX || n->n_in + fresh > MK_MAX_INPUTS)
            return false;
        readers++;
    }
    return readers > 0;
}

/* e becomes a view of its table's row 0, and each group reading it gathers. */
static void fold(mk_graph *g, mk_node *e) {
    const mk_node *t = e->in[0];
    int64_t offset = t->view_offset;
    for (int i = e->index + 1; i < g->n_nodes; i++) {
        mk_node *n = g->nodes[i];
        if (of(n, e)) continue;
        int ids = -1;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == e->in[1]) ids = k;
        for (int k = 0, n_in = n->n_in; k < n_in; k++) {
            if (!of(n->in[k], e)) continue;
            if (ids < 0) {
                ids = n->n_in++;
                n->in[ids] = e->in[1];
                e->in[1]->n_consumers++;
            }
            mk_product_group *pg = mk_node_product(n);
            pg->gather[pg->n_gathers++] = (mk_product_gather){
                .in = k, .ids = ids, .rows = t->shape[0],
                .row_bytes = t->stride[0] * (int64_t)mk_dtype_size(t->dtype), .node = e};
        }
    }
    for (int i = e->index + 1; i < g->n_nodes; i++)
        if (g->nodes[i]->owner == e) { /* a view of it: of the table now */
            g->nodes[i]->owner = t->owner;
            g->nodes[i]->view_offset += offset;
        }
    e->storage = MK_STORAGE_VIEW;
    e->owner = t->owner;
    e->view_offset = offset;
    e->stride[0] = t->stride[0];
    e->stride[1] = t->stride[1];
}

int mk_gather_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err) {
    (void)opts, (void)err;
    for (int i = 0; i < g->n_nodes; i++)
        if (foldable(g, g->nodes[i])) fold(g, g->nodes[i]);
    return 0;
}
