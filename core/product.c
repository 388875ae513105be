/*
 * product.c — the matrix–vector pass: the products of a decoding step, with
 * the nodes before and after them, become one node each.
 *
 * Device-independent: it reads op roles and kernel families, never names or
 * the shape of one network. A group starts at a MatMul whose A has at most
 * MK_MATVEC_ROWS rows and whose B reads its columns contiguous (an [out, in]
 * weight through a permute, as every Linear layer holds it) or, on a device
 * that takes them (row_products), float32 rows (an MLP's [in, out] weight);
 * on one that does not (CUDA), such a float32 constant, where only products
 * read it, is held by columns instead when its product then groups
 * (hold_by_columns; the model uploads it laid out so). Float32:
 *
 *   - siblings: the other such products reading the same A (q, k and v; w1
 *     and w3) join it, up to MK_PRODUCTS_MAX;
 *   - prologue: when A is an RmsNorm read by those products alone, the norm
 *     joins and the group reads its x; likewise a LayerNorm over A's rows
 *     with a weight and bias [k], where A has at most MK_LAYER_NORM_FLOATS
 *     values and the weights are not int8; before an RmsNorm, where the
 *     device takes A on the int8 grid (mk_target.int8_products), a
 *     FakeQuantizeNode read by those products alone whose groups are the
 *     blocks of every product's int8 weights (a DequantizeNode folded in,
 *     below): the products are then runq.c's integer dot products per group
 *     (W8A8);
 *   - epilogue, per product, following its single reader: reshapes (any view
 *     that keeps the element order), pointwise nodes (a residual add, SiLU
 *     times a sibling's product), one complex rotation (RoPE), then one
 *     in-place row write (ReplaceSlice: a KV-cache row) or the ArgMax of
 *     each row (a greedy classifier: the logits are never written).
 *
 * A product whose chains meet in a pointwise node (silu(a @ w1) * (a @ w3))
 * gives one result; the others give one each. The group node stands where its
 * last member stood; every result is a GroupOutputNode view after it (of the
 * group's memory, or of the memory the row write wrote), and readers read
 * those. It is formed only where that keeps the graph's meaning: its operands
 * come before its first member, nothing between its first and last member
 * writes in place or reads what it writes, and a row write's memory is no
 * other operand's.
 *
 * Decode attention is a group too: MatMul(Q, Kt) -> SlicedSoftmax(p) ->
 * PrefixMatMul(., V, p) with the same p, each read only by the next, Q with at
 * most MK_ATTENTION_ROWS rows per batch. Scores past p are read by nobody (the
 * prefix product stops at p), so the group computes only the first p: its
 * cost grows with the position, not with the cache. A prompt's attention,
 * CausalSoftmax(p) in the middle (its scores perhaps read as [B, g, T, S] and
 * back, g query heads a kv head), is one too on a device whose target says
 * causal_attention (the CPU): any number of query rows, row i seeing p - T +
 * 1 + i % T columns, so its [B, m, S] scores are never made whole.
 *
 * Products that stay alone (more rows, a B read by rows, other dtypes) keep the
 * device's matrix kernel (BLAS, cuBLAS); the report says which and why.
 *
 * Both kinds of group share the candidate building, the span and hazard
 * checks and the node making (cand, span, make). Which products may start
 * one, and the report's lines for those that do not, are product_rules.c's;
 * the groups' classes (what a group computes) are product_describe.c's.
 */
#include "product.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    mk_node *value;        /* the chain's latest node (may be a view) */
    mk_node *end;          /* its latest node that computes */
    int stage;             /* 0 products, 1 pointwise, 2 rotated, 3 written */
    int n_nodes;
    mk_node *nodes[MK_PRODUCT_MEMBERS];
} chain;

typedef struct {
    mk_graph *g;
    mk_node *quant;        /* a FakeQuantizeNode folded in (A on the int8 grid), or NULL */
    mk_node *norm;
    int n_products;
    mk_node *products[MK_PRODUCTS_MAX];
    mk_node *folded[MK_PRODUCTS_MAX]; /* product j's folded DequantizeNode, or NULL */
    int n_chains;
    chain chains[MK_PRODUCTS_MAX];
    int n_in;
    mk_node *in[MK_MAX_INPUTS];
    bool *moved;           /* [n_nodes]: nodes that move after the group (valid) */
} cand;

static bool same_shape(const mk_node *a, const mk_node *b) {
    return a->rank == b->rank && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank);
}

/* Float32 through and through: an epilogue's program reads and writes float32. */
static bool is_pointwise(const mk_node *n) {
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k]->dtype != MK_DTYPE_FLOAT32) return false;
    return n->op->kernel == MK_KERNEL_POINTWISE && n->dtype == MK_DTYPE_FLOAT32 &&
           (mk_node_pointwise(n) || mk_op_program(n->op));
}

static const mk_expr *program_of(const mk_node *n) {
    const mk_pointwise_group *pw = mk_node_pointwise(n);
    return pw ? &pw->program : mk_op_program(n->op);
}

static void push(chain *c, mk_node *n) { c->nodes[c->n_nodes++] = n; }

static int members(const cand *c) {
    int n = (c->norm ? 1 : 0) + (c->quant ? 1 : 0);
    for (int j = 0; j < c->n_products; j++) n += c->folded[j] != NULL;
    for (int i = 0; i < c->n_chains; i++) n += c->chains[i].n_nodes;
    return n;
}

/* The chain whose value is x, or -1. */
static int chain_of(const cand *c, const mk_node *x) {
    for (int i = 0; i < c->n_chains; i++)
        if (c->chains[i].value == x) return i;
    return -1;
}

/* A ReplaceAtNode's run: the elements past its axis, written contiguous. */
static int64_t at_run(const mk_node *r) {
    int axis = (int)(r->attr[0] < 0 ? r->attr[0] + r->rank : r->attr[0]);
    int64_t run = 1;
    for (int d = axis + 1; d < r->rank; d++) run *= r->shape[d];
    return run;
}

/* Extends chain i by its value's reader where that may join; true if it grew. */
static bool extend(cand *c, int i) {
    chain *ch = &c->chains[i];
    mk_node *v = ch->value, *r = mk_product_only_reader(c->g, v);
    if (!r || ch->stage == 3 || members(c) >= MK_PRODUCT_MEMBERS) return false;
    if (mk_product_reshape_of(r, v)) {
        push(ch, r);
        ch->value = r;
        return true;
    }
    if (is_pointwise(r) && ch->stage <= 1 && same_shape(r, v)) {
        /* its operands: this value, other chains' values (they merge), or outside */
        int merge[MK_PRODUCTS_MAX], n_merge = 0;
        for (int k = 0; k < r->n_in; k++) {
            int j = chain_of(c, r->in[k]);
            if (j < 0 || j == i) continue;
            const chain *o = &c->chains[j];
            if (o->stage > 1 || !same_shape(o->value, r) || mk_product_only_reader(c->g, o->value) != r)
                return false;
            bool seen = false;
            for (int q = 0; q < n_merge; q++) seen = seen || merge[q] == j;
            if (!seen) merge[n_merge++] = j;
        }
        int total = members(c) + 1;
        if (total > MK_PRODUCT_MEMBERS) return false;
        for (int q = 0; q < n_merge; q++) { /* their nodes join this chain */
            chain *o = &c->chains[merge[q]];
            for (int t = 0; t < o->n_nodes; t++) push(ch, o->nodes[t]);
            o->n_nodes = 0;
        }
        push(ch, r);
        ch->value = ch->end = r;
        ch->stage = 1;
        /* drop the merged chains (their nodes now belong to chain i) */
        int kept = 0;
        for (int j = 0; j < c->n_chains; j++) {
            bool gone = false;
            for (int q = 0; q < n_merge; q++) gone = gone || merge[q] == j;
            if (!gone) c->chains[kept++] = c->chains[j];
        }
        c->n_chains = kept;
        return true;
    }
    if (r->op->kernel == MK_KERNEL_COMPLEX_MUL && ch->stage <= 1 && r->dtype == MK_DTYPE_FLOAT32 &&
        same_shape(r, v) && (r->in[0] == v) != (r->in[1] == v)) {
        push(ch, r);
        ch->value = ch->end = r;
        ch->stage = 2;
        return true;
    }
    /* each row's: the product's rows (a reshape may have regrouped them) */
    if (r->op->kernel == MK_KERNEL_ARGMAX && r->in[0] == v && ch->stage <= 2 && v->rank == 2 &&
        v->shape[1] == ch->nodes[0]->shape[1] && v->dtype == MK_DTYPE_FLOAT32 &&
        v->shape[1] <= 0xffffffffLL) {
        push(ch, r);
        ch->value = ch->end = r;
        ch->stage = 3;
        return true;
    }
    /* a batch's rows each at its own index (a cache row a sequence): row i of
     * the result, as v's first axis holds it, in runs of an even count
     * (CUDA writes column pairs) */
    if (r->op->kernel == MK_KERNEL_REPLACE_AT && r->in[1] == v && r->in[0] != v && r->in[2] != v &&
        r->dtype == MK_DTYPE_FLOAT32 && mk_product_dense(r->in[0]) && mk_product_dense(v) &&
        v->shape[0] == ch->nodes[0]->shape[0] &&
        mk_node_numel(v) == v->shape[0] * ch->nodes[0]->shape[1] && at_run(r) % 2 == 0) {
        push(ch, r);
        ch->value = ch->end = r;
        ch->stage = 3;
        return true;
    }
    if (r->op->kernel == MK_KERNEL_REPLACE_SLICE && r->in[1] == v && r->in[0] != v &&
        r->dtype == MK_DTYPE_FLOAT32 && mk_product_dense(r->in[0]) && v->rank >= 1 &&
        mk_node_numel(v) * r->in[0]->shape[0] == v->shape[0] * mk_node_numel(r->in[0])) {
        push(ch, r);
        ch->value = ch->end = r;
        ch->stage = 3;
        return true;
    }
    return false;
}

static bool is_member(const cand *c, const mk_node *x) {
    if (x == c->norm || x == c->quant) return true;
    for (int j = 0; j < c->n_products; j++)
        if (x == c->folded[j]) return true;
    for (int i = 0; i < c->n_chains; i++)
        for (int t = 0; t < c->chains[i].n_nodes; t++)
            if (c->chains[i].nodes[t] == x) return true;
    return false;
}

/* The operand index of x (added where new), or -1 when there is no room. */
static int operand(cand *c, mk_node *x) {
    for (int k = 0; k < c->n_in; k++)
        if (c->in[k] == x) return k;
    if (c->n_in == MK_MAX_INPUTS) return -1;
    c->in[c->n_in] = x;
    return c->n_in++;
}

static int product_index(const cand *c, const mk_node *x) {
    while (x->op->role == MK_ROLE_VIEW && x->n_in > 0 && is_member(c, x)) x = x->in[0];
    for (int j = 0; j < c->n_products; j++)
        if (c->products[j] == x) return j;
    return -1;
}

/* The node a member's view chain starts at (itself when it computes). */
static const mk_node *computed(const cand *c, const mk_node *x) {
    while (x->op->role == MK_ROLE_VIEW && x->n_in > 0 && is_member(c, x)) x = x->in[0];
    return x;
}

/* A source register for x as `like` reads it: a product or an operand. */
static int source_of(cand *c, mk_product_out *o, const mk_node *x, const mk_node *like) {
    int j = product_index(c, x), k = j < 0 ? operand(c, (mk_node *)x) : -1;
    if (j < 0 && k < 0) return -1;
    for (int s = 0; s < o->n_src; s++)
        if (o->src[s].product == j && o->src[s].in == k && o->src[s].rank == like->rank &&
            !memcmp(o->src[s].shape, like->shape, sizeof(int64_t) * (size_t)like->rank))
            return s;
    if (o->n_src == MK_X_IN) return -1;
    mk_product_source *s = &o->src[o->n_src];
    *s = (mk_product_source){.in = k, .product = j, .rank = like->rank};
    memcpy(s->shape, like->shape, sizeof s->shape);
    return o->n_src++;
}

/* Chain ch as a result: its program, rotation and row write; false if it does
 * not fit. */
static bool describe(cand *c, const chain *ch, mk_product_out *o) {
    *o = (mk_product_out){.end = ch->end, .rotate = -1, .row_x = -1, .row_begin = -1,
                          .row_end = -1, .row_index = -1, .row_axis = -1};
    mk_expr *e = &o->program;
    const mk_node *result[MK_PRODUCT_MEMBERS] = {0};
    int reg[MK_PRODUCT_MEMBERS];
    int n_result = 0;
    o->n = ch->nodes[0]->shape[1];
    for (int t = 0; t < ch->n_nodes; t++) {
        mk_node *m = ch->nodes[t];
        if (m->op->kernel == MK_KERNEL_MATMUL) {
            if (m->shape[1] != o->n) return false;
            continue;
        }
        if (is_pointwise(m)) {
            const mk_expr *p = program_of(m);
            int operands[MK_X_IN];
            for (int k = 0; k < m->n_in; k++) {
                const mk_node *x = computed(c, m->in[k]);
                operands[k] = -1;
                for (int q = 0; q < n_result; q++)
                    if (result[q] == x) operands[k] = reg[q];
                if (operands[k] < 0 && (operands[k] = source_of(c, o, m->in[k], m)) < 0)
                    return false;
            }
            if (!mk_expr_append(e, p, operands, &reg[n_result])) return false;
            result[n_result++] = m;
            continue;
        }
        if (m->op->kernel == MK_KERNEL_COMPLEX_MUL) {
            int k = is_member(c, m->in[0]) ? 1 : 0; /* the multiplier: the operand outside */
            if ((o->rotate = operand(c, m->in[k])) < 0) return false;
            o->rotate_rank = m->rank;
            memcpy(o->rotate_shape, m->shape, sizeof o->rotate_shape);
            continue;
        }
        if (m->op->kernel == MK_KERNEL_ARGMAX) {
            o->argmax = true;
            continue;
        }
        if (m->op->kernel == MK_KERNEL_REPLACE_SLICE) {
            if ((o->row_x = operand(c, m->in[0])) < 0 || (o->row_begin = operand(c, m->in[2])) < 0 ||
                (o->row_end = operand(c, m->in[3])) < 0)
                return false;
            o->row_count = m->in[1]->shape[0];
        }
        if (m->op->kernel == MK_KERNEL_REPLACE_AT) {
            if ((o->row_x = operand(c, m->in[0])) < 0 || (o->row_index = operand(c, m->in[2])) < 0)
                return false;
            o->row_axis = (int)(m->attr[0] < 0 ? m->attr[0] + m->rank : m->attr[0]);
            o->row_count = m->in[1]->shape[0];
        }
    }
    if (e->n == 0) { /* the product itself */
        if (source_of(c, o, ch->nodes[0], ch->nodes[0]) != 0) return false;
    } else {
        e->n_in = o->n_src;
        mk_expr_tidy(e);
    }
    return true;
}

/* First and last member index. */
static void span(const cand *c, int *first, int *last) {
    *first = c->g->n_nodes, *last = -1;
    for (int i = 0; i < c->g->n_nodes; i++)
        if (is_member(c, c->g->nodes[i])) {
            if (i < *first) *first = i;
            *last = i;
        }
}

static const mk_node *memory_of(const mk_node *x) { return x->owner; }

/* Whether the group reads operand k other than as a row write's target: as
 * A, a weight or scale, the norm's weight, an epilogue source, a rotation or
 * a row write's bounds. */
static bool operand_read(const mk_product_group *pg, int k) {
    bool read = pg->a == k || pg->norm_w == k || pg->norm_b == k || pg->norm_eps == k;
    for (int j = 0; j < pg->n_products; j++) read = read || pg->b[j] == k || pg->b_scale[j] == k;
    for (int o = 0; o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        read = read || r->rotate == k || r->row_begin == k || r->row_end == k || r->row_index == k;
        for (int s = 0; s < r->n_src; s++) read = read || r->src[s].in == k;
    }
    return read;
}

/* Whether a member before node i reads memory mem. */
static bool read_before(const cand *c, const mk_node *mem, int i) {
    for (int j = 0; j < i; j++) {
        const mk_node *m = c->g->nodes[j];
        if (!is_member(c, m)) continue;
        for (int k = 0; k < m->n_in; k++)
            if (memory_of(m->in[k]) == mem) return true;
    }
    return false;
}

/*
 * May the candidate become one node standing at its last member? Nodes
 * between its first and last member that read a member (or such a node) move
 * after it, in order (c->moved); the others stay before it. That keeps the
 * graph's meaning where no operand is moved, memory a row write writes is read
 * by a moved node only after the write and by a node that stays only before
 * it, and a write in place between stays before it and writes no memory that
 * a member before it reads (attention's V written after its scores are made,
 * in the script's order: the scores read only Q and K).
 */
static bool valid(cand *c, const mk_product_group *pg) {
    const mk_graph *g = c->g;
    int first, last;
    span(c, &first, &last);
    for (int i = first + 1; i < last; i++) {
        const mk_node *n = g->nodes[i];
        if (is_member(c, n)) continue;
        bool moved = false;
        for (int k = 0; k < n->n_in; k++)
            moved = moved || is_member(c, n->in[k]) || c->moved[n->in[k]->index];
        c->moved[i] = moved;
        if (n->op->role == MK_ROLE_INPLACE && (moved || read_before(c, n->owner, i))) return false;
        for (int o = 0; o < pg->n_outs; o++) {
            if (pg->out[o].row_x < 0) continue;
            const mk_node *written = memory_of(c->in[pg->out[o].row_x]);
            bool after = n->index > pg->out[o].end->index;
            for (int k = 0; k < n->n_in; k++)
                if (memory_of(n->in[k]) == written && after != moved) return false;
        }
    }
    for (int k = 0; k < c->n_in; k++) /* (a sibling's B may be another sibling's result) */
        if (c->in[k]->index >= last || c->moved[c->in[k]->index] || is_member(c, c->in[k]))
            return false;
    for (int o = 0; o < pg->n_outs; o++) { /* a row write's memory is no other operand's */
        if (pg->out[o].row_x < 0) continue;
        if (operand_read(pg, pg->out[o].row_x)) return false; /* x itself, read too (A = x) */
        const mk_node *x = memory_of(c->in[pg->out[o].row_x]);
        for (int k = 0; k < c->n_in; k++)
            if (k != pg->out[o].row_x && memory_of(c->in[k]) == x) return false;
    }
    return true;
}

/*
 * Products ps's A, where the group may take it on the int8 grid: a
 * FakeQuantizeNode [m, k] read by them alone, groups dividing
 * MK_INT8_GROUP_MAX, on a device that takes that many elements so, every
 * product's weights int8 in blocks of as many rows as its groups.
 */
static mk_node *folded_quantize(const mk_graph *g, const mk_target *t, mk_node *const *ps,
                                int n_ps) {
    mk_node *a = ps[0]->in[0];
    if (a->op->kernel != MK_KERNEL_FAKE_QUANTIZE || a->n_consumers != n_ps || mk_is_output(g, a) ||
        a->owner != a || a->rank != 2 || !mk_product_dense(a->in[0]) ||
        MK_INT8_GROUP_MAX % a->attr[0] ||
        a->shape[0] * a->shape[1] > t->int8_products)
        return NULL;
    for (int j = 0; j < n_ps; j++) {
        const mk_node *d = mk_product_folded_dequantize(g, ps[j]);
        if (!d || d->in[0]->shape[0] / d->in[1]->shape[0] != a->attr[0]) return NULL;
    }
    return a;
}

/* Whether A, a LayerNorm over the last axis of [m, k], may be the prologue
 * of products ps: its weight and bias [k] float32 (not broadcast), A small
 * enough to normalise in shared memory, and no product's weights int8. */
static bool layer_norm_folds(const mk_graph *g, const mk_node *a, mk_node **ps, int n_ps) {
    if (a->op->kernel != MK_KERNEL_LAYER_NORM || a->attr[0] != 1 || a->rank != 2 ||
        a->shape[0] * a->shape[1] > MK_LAYER_NORM_FLOATS)
        return false;
    for (int i = 1; i < 3; i++)
        if (a->in[i]->rank != 1 || a->in[i]->shape[0] != a->shape[1] ||
            !mk_product_dense(a->in[i]) ||
            a->in[i]->dtype != MK_DTYPE_FLOAT32)
            return false;
    for (int j = 0; j < n_ps; j++)
        if (mk_product_folded_dequantize(g, ps[j])) return false;
    return a->in[3]->dtype == MK_DTYPE_FLOAT32;
}

/* Builds the candidate from products ps sharing A; NULL when it cannot be one. */
static mk_product_group *build(cand *c, mk_graph *g, const mk_target *t, mk_node **ps, int n_ps,
                               bool *moved) {
    *c = (cand){.g = g, .n_products = n_ps, .moved = moved};
    memset(moved, 0, sizeof *moved * (size_t)g->n_nodes);
    memcpy(c->products, ps, sizeof ps[0] * (size_t)n_ps);
    mk_node *a = ps[0]->in[0];
    int readers = n_ps; /* of the norm: the products, or the quantizer between */
    if ((c->quant = folded_quantize(g, t, ps, n_ps))) a = c->quant->in[0], readers = 1;
    if ((a->op->kernel == MK_KERNEL_RMS_NORM || layer_norm_folds(g, a, ps, n_ps)) &&
        a->n_consumers == readers && !mk_is_output(g, a) && a->owner == a &&
        a->storage == MK_STORAGE_ARENA && mk_product_dense(a->in[0]) &&
        mk_product_dense(a->in[1]) &&
        a->in[0]->dtype == MK_DTYPE_FLOAT32 && a->in[1]->dtype == MK_DTYPE_FLOAT32)
        c->norm = a;
    else if (!mk_product_dense(a))
        return NULL;
    for (int j = 0; j < n_ps; j++) {
        chain *ch = &c->chains[c->n_chains++];
        *ch = (chain){.value = ps[j], .end = ps[j]};
        push(ch, ps[j]);
    }
    for (bool grew = true; grew;) {
        grew = false;
        for (int i = 0; i < c->n_chains && !grew; i++) grew = extend(c, i);
    }
    for (int i = 0; i < c->n_chains; i++) { /* trailing views stay in the graph */
        chain *ch = &c->chains[i];
        while (ch->nodes[ch->n_nodes - 1] != ch->end) ch->n_nodes--;
        ch->value = ch->end;
    }
    mk_product_group *pg = calloc(1, sizeof *pg);
    if (!pg) return NULL;
    pg->m = a->shape[0];
    pg->k = a->shape[1];
    pg->norm_w = pg->norm_b = pg->norm_eps = -1;
    bool ln = c->norm && c->norm->op->kernel == MK_KERNEL_LAYER_NORM;
    bool ok = (pg->a = operand(c, c->norm ? c->norm->in[0] : a)) >= 0 &&
              (!c->norm || (pg->norm_w = operand(c, c->norm->in[1])) >= 0) &&
              (!ln || ((pg->norm_b = operand(c, c->norm->in[2])) >= 0 &&
                       (pg->norm_eps = operand(c, c->norm->in[3])) >= 0));
    pg->a8_group = c->quant ? c->quant->attr[0] : 0;
    pg->n_products = n_ps;
    for (int j = 0; j < n_ps && ok; j++) {
        mk_node *d = c->folded[j] = mk_product_folded_dequantize(g, ps[j]);
        pg->b_scale[j] = -1;
        pg->b_rows[j] = mk_product_by_rows(mk_product_weights_of(g, ps[j]));
        if (!d) {
            ok = (pg->b[j] = operand(c, ps[j]->in[1])) >= 0;
            continue;
        }
        pg->b_group[j] = d->in[0]->shape[0] / d->in[1]->shape[0];
        ok = (pg->b[j] = operand(c, d->in[0])) >= 0 && (pg->b_scale[j] = operand(c, d->in[1])) >= 0;
    }
    pg->n_outs = c->n_chains;
    for (int i = 0; i < c->n_chains && ok; i++) ok = describe(c, &c->chains[i], &pg->out[i]);
    if (!ok || !valid(c, pg)) {
        free(pg);
        return NULL;
    }
    return pg;
}

/* ---- the group node -------------------------------------------------------------- */

static mk_node *new_node(const mk_node *like, const mk_op *op) {
    mk_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->id = like->id;
    n->line = like->line;
    n->column = like->column;
    n->op = op;
    n->dtype = like->dtype;
    n->rank = like->rank;
    memcpy(n->shape, like->shape, sizeof n->shape);
    n->offset = -1;
    return n;
}

/* The candidate becomes a group node and its results' views, standing where
 * its last member stood; the members leave the graph. */
static int make(mk_graph *g, cand *c, mk_product_group *pg, mk_error **err) {
    int first, last;
    span(c, &first, &last);
    /* members in graph order, with the CPU's scratch for all but the results */
    mk_group *grp = calloc(1, sizeof *grp);
    if (!grp) {
        free(pg);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping matrix-vector products");
    }
    grp->cls = pg->kind == MK_PRODUCT_ATTENTION ? &mk_attention_class : &mk_matvec_class;
    grp->body = pg;
    for (int i = first; i <= last; i++)
        if (is_member(c, g->nodes[i])) grp->members[grp->n_members++] = g->nodes[i];
    int64_t total = 0;
    for (int o = 0; o < pg->n_outs; o++) {
        if (pg->out[o].row_x >= 0) continue;
        pg->out[o].offset = total; /* floats, in 64-byte steps (int64 results take two) */
        total += ((int64_t)mk_node_bytes(pg->out[o].end) / 4 + 15) / 16 * 16;
    }
    /* the CPU's scratch: a matrix-vector group's A (normalised, rows dense);
     * a decode attention group's members but its result; a causal one's
     * scores, MK_CAUSAL_BLOCK rows a head (softmaxed in place) */
    pg->weight_bytes = 1;
    for (int t = 0; t < grp->n_members; t++) {
        const mk_node *m = grp->members[t], *w = m->in[1];
        if (m->op->kernel == MK_KERNEL_MATMUL && w->op->kernel != MK_KERNEL_DEQUANTIZE &&
            (int)mk_dtype_size(w->dtype) > pg->weight_bytes)
            pg->weight_bytes = (int)mk_dtype_size(w->dtype);
        bool is_end = false;
        for (int o = 0; o < pg->n_outs; o++) is_end = is_end || pg->out[o].end == m;
        pg->scratch[t] = -1;
        if (pg->kind != MK_PRODUCT_ATTENTION || is_end || m->storage == MK_STORAGE_VIEW) continue;
        const mk_attention_info *a = &pg->att;
        if (a->causal && m->op->kernel != MK_KERNEL_MATMUL) continue;
        int64_t block = a->period < MK_CAUSAL_BLOCK ? a->period : MK_CAUSAL_BLOCK; /* a head */
        size_t bytes = a->causal ? (size_t)(a->batch * block * a->s) * sizeof(float)
                                 : mk_node_bytes(m);
        pg->scratch[t] = (int64_t)grp->scratch_bytes;
        grp->scratch_bytes += (bytes + 63) / 64 * 64;
    }
    if (pg->kind == MK_PRODUCT_MATVEC) /* A as floats; on the int8 grid, its scales and values */
        grp->scratch_bytes = (size_t)(pg->m * pg->k) * sizeof(float) +
                            (pg->a8_group ? (size_t)(pg->m * pg->k / pg->a8_group) * sizeof(float) +
                                                (size_t)(pg->m * pg->k)
                                          : 0);
    mk_node *outs[MK_PRODUCTS_MAX] = {0};
    mk_node *gn = new_node(c->products[0], mk_op_internal(MK_KERNEL_PRODUCT));
    if (!gn) goto nomem;
    gn->rank = 1;
    gn->shape[0] = total ? total : 1;
    gn->storage = MK_STORAGE_ARENA;
    gn->owner = gn;
    gn->stride[0] = 1;
    gn->n_in = c->n_in;
    memcpy(gn->in, c->in, sizeof c->in[0] * (size_t)c->n_in);
    for (int o = 0; o < pg->n_outs; o++) {
        const mk_node *end = pg->out[o].end;
        mk_node *v = outs[o] = new_node(end, mk_op_internal(MK_KERNEL_NONE));
        if (!v) goto nomem;
        v->storage = MK_STORAGE_VIEW;
        if (pg->out[o].row_x >= 0) { /* the memory written: x's, as the write returned it */
            v->owner = end->owner;
            v->view_offset = end->view_offset;
            memcpy(v->stride, end->stride, sizeof v->stride);
            v->in[v->n_in++] = c->in[pg->out[o].row_x];
        } else {
            v->owner = gn;
            v->view_offset = pg->out[o].offset * (int64_t)sizeof(float);
            mk_contiguous_strides(v->rank, v->shape, v->stride);
        }
        v->in[v->n_in++] = gn;
    }
    /* readers of a result read its view */
    for (int i = first + 1; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++)
            for (int o = 0; o < pg->n_outs; o++)
                if (g->nodes[i]->in[k] == pg->out[o].end) g->nodes[i]->in[k] = outs[o];
    for (int o = 0; o < pg->n_outs; o++) {
        for (int r = 0; r < g->n_outputs; r++)
            if (g->outputs[r] == pg->out[o].end) g->outputs[r] = outs[o];
        /* views of a result that owned its memory now view the group's */
        for (int i = first + 1; i < g->n_nodes; i++)
            if (g->nodes[i]->owner == pg->out[o].end) {
                g->nodes[i]->owner = outs[o]->owner;
                g->nodes[i]->view_offset += outs[o]->view_offset;
            }
    }
    /* the new order: members out, the group and its results at the last member */
    int extra = 1 + pg->n_outs - grp->n_members;
    if (extra > 0 && g->n_nodes + extra > g->cap) {
        mk_node **grown = realloc(g->nodes, sizeof *grown * (size_t)(g->n_nodes + extra));
        if (!grown) goto nomem;
        g->nodes = grown;
        g->cap = g->n_nodes + extra;
    }
    int n_old = g->n_nodes;
    mk_node **old = malloc(sizeof *old * (size_t)n_old);
    if (!old) goto nomem;
    memcpy(old, g->nodes, sizeof *old * (size_t)n_old);
    int kept = 0;
    for (int i = 0; i < n_old; i++) {
        if (!is_member(c, old[i]) && !c->moved[i]) g->nodes[kept++] = old[i];
        if (i != last) continue;
        g->nodes[kept++] = gn;
        for (int o = 0; o < pg->n_outs; o++) g->nodes[kept++] = outs[o];
        for (int j = first + 1; j < last; j++)
            if (c->moved[j]) g->nodes[kept++] = old[j];
    }
    free(old);
    g->n_nodes = kept;
    for (int i = 0; i < kept; i++) g->nodes[i]->index = i;
    gn->group = grp;
    for (int i = 0; i < kept; i++) g->nodes[i]->n_consumers = 0;
    for (int i = 0; i < kept; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) g->nodes[i]->in[k]->n_consumers++;
    return 0;
nomem:
    free(gn);
    for (int o = 0; o < pg->n_outs; o++) free(outs[o]);
    free(grp);
    free(pg);
    return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping matrix-vector products");
}

/* ---- attention (a decode step's, a prompt's causal one) ------------------------ */

/* The attention group around softmax x, or NULL. */
static mk_product_group *build_attention(cand *c, mk_graph *g, const mk_target *t, mk_node *x,
                                         bool *moved) {
    mk_attention_nodes at;
    if (mk_attention_why_not(g, t, x, &at)) return NULL;
    mk_node *s = at.s, *y = at.y;
    *c = (cand){.g = g, .n_products = 1, .products = {s}, .moved = moved};
    memset(moved, 0, sizeof *moved * (size_t)g->n_nodes);
    chain *ch = &c->chains[c->n_chains++];
    *ch = (chain){.value = y, .end = y, .stage = 1};
    push(ch, s);
    if (at.r1) push(ch, at.r1);
    push(ch, x);
    if (at.r2) push(ch, at.r2);
    push(ch, y);
    mk_product_group *pg = calloc(1, sizeof *pg);
    if (!pg) return NULL;
    pg->kind = MK_PRODUCT_ATTENTION;
    mk_attention_info *a = &pg->att;
    a->q = operand(c, s->in[0]);
    a->kt = operand(c, s->in[1]);
    a->v = operand(c, y->in[1]);
    a->p = operand(c, y->in[2]);
    a->batch = s->shape[0], a->m = s->shape[1], a->d = s->in[0]->shape[2];
    a->s = s->shape[2], a->n = y->shape[2];
    a->prefixes = y->in[2]->shape[0];
    a->causal = x->op->kernel == MK_KERNEL_CAUSAL_SOFTMAX;
    a->period = a->causal ? x->shape[x->rank - 2] : a->m;
    pg->norm_w = pg->norm_b = pg->norm_eps = -1;
    pg->n_products = 1;
    pg->n_outs = 1;
    pg->out[0] = (mk_product_out){.end = y, .n = a->n, .rotate = -1, .row_x = -1,
                                  .row_begin = -1, .row_end = -1, .row_index = -1,
                                  .row_axis = -1};
    if (!valid(c, pg)) {
        free(pg);
        return NULL;
    }
    return pg;
}

/*
 * Whether no launch before attention group n writes K's or V's rows before
 * p - 1 in the evaluation (mk_attention_info.early): each is a buffer's or a
 * constant's memory (made before the evaluation) whose only writers before n
 * write one row ending at n's own p (a decode step's cache row), in place or
 * as a group's row write. Not an input's: on CUDA a launch before may still
 * be copying it in (the staging kernel, which lets the launch after it start
 * early), and early loads read the evaluation before's rows.
 */
static bool early_rows(const mk_graph *g, const mk_node *n) {
    const mk_attention_info *a = &mk_node_product(n)->att;
    const mk_node *p = n->in[a->p];
    for (int k = 0; k < 2; k++) {
        const mk_node *mem = n->in[k ? a->v : a->kt]->owner;
        if (mem->storage != MK_STORAGE_BUFFER && mem->storage != MK_STORAGE_CONSTANT) return false;
        for (int i = 0; i < n->index; i++) {
            const mk_node *w = g->nodes[i];
            if (w->op->role == MK_ROLE_INPLACE && w->owner == mem &&
                (w->op->kernel != MK_KERNEL_REPLACE_SLICE || w->in[3] != p ||
                 w->in[1]->shape[0] != 1))
                return false;
            const mk_product_group *wg = mk_node_product(w);
            for (int o = 0; wg && o < wg->n_outs; o++) {
                const mk_product_out *r = &wg->out[o];
                if (r->row_x >= 0 && w->in[r->row_x]->owner == mem &&
                    (r->row_end < 0 || w->in[r->row_end] != p || r->row_count != 1))
                    return false;
            }
        }
    }
    return true;
}

/* The products that may join p: p and the later ones reading its A, in order. */
static int siblings(const mk_graph *g, const mk_target *t, mk_node *p, mk_node **ps) {
    int n = 0;
    for (int i = p->index; i < g->n_nodes && n < MK_PRODUCTS_MAX; i++) {
        mk_node *q = g->nodes[i];
        if (q->op->kernel == MK_KERNEL_MATMUL && q->in[0] == p->in[0] && !mk_product_why_not(g, t, q))
            ps[n++] = q;
    }
    return n;
}

int mk_product_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err) {
    if (opts->no_passes || opts->no_fusion || g->n_nodes == 0) return 0;
    /* room for the nodes a group adds (its node and results beyond its members);
     * grown as groups add them (a lone product's group adds one) */
    int room = g->n_nodes + MK_PRODUCTS_MAX + 1;
    bool *moved = malloc(sizeof *moved * (size_t)room);
    if (!moved) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping matrix-vector products");
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->n_nodes + MK_PRODUCTS_MAX + 1 > room) {
            room = 2 * g->n_nodes + MK_PRODUCTS_MAX + 1;
            bool *more = realloc(moved, sizeof *moved * (size_t)room);
            if (!more) {
                free(moved);
                return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping matrix-vector products");
            }
            moved = more;
        }
        mk_node *p = g->nodes[i];
        cand c;
        mk_product_group *pg = NULL;
        mk_product_hold_by_columns(g, t, p);
        int kernel = p->op->kernel;
        if (kernel == MK_KERNEL_SLICED_SOFTMAX || kernel == MK_KERNEL_CAUSAL_SOFTMAX) {
            pg = build_attention(&c, g, t, p, moved);
        } else if (!mk_product_why_not(g, t, p)) {
            mk_node *ps[MK_PRODUCTS_MAX];
            int n_ps = siblings(g, t, p, ps);
            pg = build(&c, g, t, ps, n_ps, moved);
            if (!pg && n_ps > 1) pg = build(&c, g, t, ps, 1, moved);
        }
        if (!pg) continue;
        int first, last;
        span(&c, &first, &last);
        if (make(g, &c, pg, err)) {
            free(moved);
            return -1;
        }
        i = first - 1; /* nodes before the group kept their places; go on from there */
    }
    free(moved);
    bool int8_grid = false;
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_product_group *pg = mk_node_product(g->nodes[i]);
        int8_grid |= pg && pg->a8_group;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        mk_product_group *pg = mk_node_product(g->nodes[i]);
        if (pg && pg->kind == MK_PRODUCT_ATTENTION) {
            pg->att.early = early_rows(g, g->nodes[i]);
            pg->att.int8_grid = int8_grid;
        }
    }
    return 0;
}
