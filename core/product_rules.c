/*
 * product_rules.c — which products and softmaxes may start a group of
 * product.c's, the layout decision for weights held by rows on a device that
 * reads them by columns, and the fusion report's line for each product or
 * softmax left to the device's own kernel, with the reason.
 */
#include "product.h"

/*
 * The DequantizeNode product p's B is, where the group can read its int8
 * weights and scales instead (folding it in): read by p alone, scale blocks
 * along k only, of a multiple of 16 rows. Else NULL.
 */
mk_node *mk_product_folded_dequantize(const mk_graph *g, const mk_node *p) {
    mk_node *d = p->in[1];
    if (d->op->kernel != MK_KERNEL_DEQUANTIZE || d->n_consumers != 1 || mk_is_output(g, d) ||
        d->owner != d || d->rank != 2)
        return NULL;
    const mk_node *q = d->in[0], *sc = d->in[1];
    int64_t group = q->shape[0] / sc->shape[0];
    return sc->shape[1] == q->shape[1] && group % 16 == 0 ? d : NULL;
}

/* What the group reads as p's B: the int8 of a folded dequantization, or B. */
const mk_node *mk_product_weights_of(const mk_graph *g, const mk_node *p) {
    const mk_node *d = mk_product_folded_dequantize(g, p);
    return d ? d->in[0] : p->in[1];
}

/* Whether weights b are read by rows: its columns are not contiguous. */
bool mk_product_by_rows(const mk_node *b) { return b->stride[0] != 1 && b->shape[0] > 1; }

/* Why product p cannot start a matrix–vector group, or NULL when it can. */
const char *mk_product_why_not(const mk_graph *g, const mk_target *t, const mk_node *p) {
    if (p->op->kernel != MK_KERNEL_MATMUL) return "not a product";
    const mk_node *a = p->in[0], *b = mk_product_weights_of(g, p);
    if (p->dtype != MK_DTYPE_FLOAT32 || a->dtype != MK_DTYPE_FLOAT32) return "not float32";
    if (a->rank != 2 || b->rank != 2) return "not [m, k] @ [k, n]";
    if (a->shape[0] > t->matvec_rows) return "more rows than the device's matrix-vector groups take";
    if (mk_product_by_rows(b) && !(t->row_products && b->stride[1] == 1 && b->dtype == MK_DTYPE_FLOAT32))
        return t->row_products ? "B's columns are not contiguous, nor its rows float32 and "
                                 "contiguous"
                               : "B's columns are not contiguous";
    if (b->shape[1] % 2 && !mk_product_by_rows(b)) /* by columns, CUDA takes them in pairs */
        return "an odd number of columns";
    return NULL;
}

/*
 * On a device whose groups read weights by columns only (row_products false:
 * CUDA), product p's float32 constant weights [k, n] held by rows (an MLP's
 * [in, out]), where only products read them as their weights, are held by
 * columns instead when p then groups: strides (1, k), and the decision
 * recorded on the constant (MK_UPLOAD_BY_COLUMNS), which model.c carries out
 * when it uploads it. A library product reads them transposed.
 */
void mk_product_hold_by_columns(const mk_graph *g, const mk_target *t, const mk_node *p) {
    if (t->row_products || p->op->kernel != MK_KERNEL_MATMUL) return;
    mk_node *w = p->in[1];
    if (w->op->leaf != MK_LEAF_CONSTANT || w->dtype != MK_DTYPE_FLOAT32 || w->rank != 2 ||
        !mk_product_by_rows(w) || w->stride[1] != 1 || mk_is_output(g, w))
        return;
    for (int j = w->index + 1; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j]->n_in; k++)
            if (g->nodes[j]->in[k] == w && (g->nodes[j]->op->kernel != MK_KERNEL_MATMUL || k != 1))
                return;
    int64_t rows = w->stride[0];
    w->stride[0] = 1;
    w->stride[1] = w->shape[0];
    w->upload = MK_UPLOAD_BY_COLUMNS;
    if (mk_product_why_not(g, t, p)) { /* p would not group: as it was */
        w->stride[0] = rows, w->stride[1] = 1;
        w->upload = MK_UPLOAD_AS_GIVEN;
    }
}

/* n's only reader, or NULL where it has several, none, or is the output. */
mk_node *mk_product_only_reader(const mk_graph *g, const mk_node *n) {
    if (n->n_consumers != 1 || mk_is_output(g, n)) return NULL;
    for (int i = n->index + 1; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            if (g->nodes[i]->in[k] == n) return g->nodes[i];
    return NULL;
}

bool mk_product_dense(const mk_node *n) {
    int64_t s[MK_MAX_RANK];
    mk_contiguous_strides(n->rank, n->shape, s);
    for (int d = 0; d < n->rank; d++)
        if (n->shape[d] > 1 && n->stride[d] != s[d]) return false;
    return true;
}

bool mk_product_reshape_of(const mk_node *v, const mk_node *n) {
    return v->op->role == MK_ROLE_VIEW && v->op->layout && v->in[0] == n &&
           mk_node_numel(v) == mk_node_numel(n) && mk_product_dense(v) && mk_product_dense(n) &&
           v->view_offset == n->view_offset && v->owner == n->owner;
}

/* Why the softmax x cannot be the middle of an attention group on target t,
 * or NULL. A decode step's (SlicedSoftmax) takes few query rows; a prompt's
 * (CausalSoftmax) any number, on a device that runs it, its scores read as
 * [B, g, T, S] through reshapes where g query heads share a kv head. */
const char *mk_attention_why_not(const mk_graph *g, const mk_target *t, mk_node *x,
                                 mk_attention_nodes *at) {
    bool causal = x->op->kernel == MK_KERNEL_CAUSAL_SOFTMAX;
    if (causal && !t->causal_attention) return "the device has no causal attention group";
    mk_attention_nodes n = {.s = x->in[0], .x = x, .y = mk_product_only_reader(g, x)};
    if (causal && x->rank == 4) { /* [B, g, T, S] between [B, g T, S] */
        n.r1 = n.s, n.s = n.r1->in[0], n.r2 = n.y;
        n.y = n.r2 ? mk_product_only_reader(g, n.r2) : NULL;
        if (!mk_product_reshape_of(n.r1, n.s) || mk_product_only_reader(g, n.r1) != x || !n.r2 ||
            !mk_product_reshape_of(n.r2, x) || n.r2->rank != 3 || n.s->rank != 3 ||
            n.r1->shape[0] != n.s->shape[0] || n.r1->shape[3] != n.s->shape[2] ||
            n.r2->shape[1] != n.s->shape[1] || n.r2->shape[2] != n.s->shape[2])
            return "its scores are not [B, g T, S] read as [B, g, T, S] and back";
    }
    const mk_node *s = n.s, *y = n.y, *sx = n.r1 ? n.r1 : x, *xy = n.r2 ? n.r2 : x;
    if (!y || y->op->kernel != MK_KERNEL_PREFIX_MATMUL || y->in[0] != xy || y->in[2] != x->in[1])
        return "not read by one prefix product over its own prefix";
    if (s->op->kernel != MK_KERNEL_MATMUL || mk_product_only_reader(g, s) != sx || s->owner != s)
        return "its scores are not one product's, read by it alone";
    if (s->rank != 3 || y->rank != 3 || !mk_matmul_is_plain(s) || y->in[0]->rank != 3 ||
        y->in[1]->rank != 3)
        return "not [B, m, d] @ [B, d, S]";
    if (s->dtype != MK_DTYPE_FLOAT32 || y->dtype != MK_DTYPE_FLOAT32 ||
        y->in[1]->dtype != MK_DTYPE_FLOAT32)
        return "not float32";
    if (!causal && s->shape[1] > MK_ATTENTION_ROWS) return "more query rows than decoding has";
    if (!causal && s->shape[2] > MK_ATTENTION_ROWS_MAX)
        return "a cache too long for one block's shared memory";
    if (at) *at = n;
    return NULL;
}

void mk_product_report(const mk_graph *g, const mk_target *t, mk_strbuf *b) {
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        const char *why = n->op->kernel == MK_KERNEL_MATMUL ? mk_product_why_not(g, t, n) : NULL;
        if (why)
            mk_strbuf_put(b, "product $%d (line %d): the device's matrix kernel: %s\n", n->id,
                          n->line, why);
        bool softmax = n->op->kernel == MK_KERNEL_SLICED_SOFTMAX ||
                       n->op->kernel == MK_KERNEL_CAUSAL_SOFTMAX;
        const char *att = softmax ? mk_attention_why_not(g, t, g->nodes[i], NULL) : NULL;
        if (att) mk_strbuf_put(b, "softmax $%d (line %d): no attention group: %s\n", n->id, n->line, att);
    }
}
