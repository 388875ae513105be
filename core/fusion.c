/*
 * fusion.c — the cuDNN fusion pass: picks groups of nodes that one cuDNN
 * operation graph computes and replaces each with one group node (the op
 * table's internal row of role MK_ROLE_GROUP).
 *
 * Groups (all float32, at most MK_GROUP_MAX_OPS nodes, at most MK_GROUP_MAX_INPUTS
 * distinct operands from outside):
 *
 *   matmul group    [pointwise chain feeding A] → a matrix product (A, B) → [pointwise chain]
 *   pointwise chain two or more pointwise nodes cuDNN computes (cudnn_modes below:
 *                   add, multiply, relu, silu)
 *
 * A chain follows single-consumer edges only: every node but the group's last
 * has exactly one reader, which is the next node of the group, so no one
 * outside sees an intermediate and the group's last node keeps its identity
 * (its id, its storage and any view of it): it *becomes* the group node.
 * The other members leave the graph (kept alive in the mk_fusion for reports).
 *
 * Broadcasting: the outside operand of a Sum/Hadamard may broadcast only in the
 * patterns cuDNN was checked to compute correctly (broadcast_ok below); others
 * end the chain. MK_CUDNN_BROADCAST=any in the environment lifts that limit so
 * a test can check what cuDNN does with the other patterns.
 *
 * The pass calls no device: it decides from the target (cudnn_groups) and
 * from the context's notes (mk_cudnn_note) of what the CUDA device's prepare
 * found at earlier compiles. Prepare compiles each group's plan
 * (kernels/cudnn_fuser.cu, through the context's cache of plans). Where
 * cuDNN refuses a group, or its plan needs more workspace than the group's
 * scratch, prepare says so, model.c notes it (mk_fusion_learn) and compiles
 * the model again: a refused group's nodes then stay plain nodes (plain
 * kernels), with the reason in the report, and a matmul group with a
 * prologue is tried without it; a group's scratch is its plan's workspace.
 * A group without a note is tried with no workspace.
 */
#include "passes.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fusion state ------------------------------------------------------ */

mk_fusion *mk_fusion_new(struct mk_cudnn_cache **cache, mk_cudnn_note **notes, unsigned call) {
    mk_fusion *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->cache = cache;
    f->notes = notes;
    f->call = call;
    return f;
}

/* The device released its plan and variant pack when it closed (model.c
 * closes the device before it frees the fusion state). */
static void group_free(mk_fused_group *grp) {
    if (!grp) return;
    free(grp->trace);
    free(grp);
}

void mk_cudnn_notes_free(mk_cudnn_note *n) {
    while (n) {
        mk_cudnn_note *next = n->next;
        free(n->trace);
        free(n);
        n = next;
    }
}

static const mk_cudnn_note *note_of(const mk_fusion *f, const char *trace) {
    for (const mk_cudnn_note *n = f->notes ? *f->notes : NULL; n; n = n->next)
        if (!strcmp(n->trace, trace)) return n;
    return NULL;
}

void mk_fusion_free(mk_fusion *f) {
    if (!f) return;
    for (int i = 0; i < f->n_groups; i++) group_free(f->groups[i]);
    free(f->groups);
    free(f->report.s);
    free(f);
}

/* ---- the group record's class ------------------------------------------------------ */

static void describe_group(const mk_node *n, bool brief, mk_strbuf *b) {
    const mk_fused_group *grp = mk_node_cudnn(n);
    mk_strbuf_put(b, "one cuDNN graph of %d operations over %d operands%s", grp->n_ops, grp->n_in,
                  grp->tf32 ? ", TF32" : "");
    if (!brief) {
        mk_strbuf_put(b, " for");
        mk_group_put_members(n, b);
    }
}

/* The fusion state owns the groups' bodies (the plugin's plans) and frees them. */
static const mk_group_class cudnn_class = {MK_GROUP_CUDNN, "cuDNN", describe_group, NULL};

/* ---- which nodes may join a group --------------------------------------------------- */


/* Appends one line; a report that cannot grow is cut short, never an error. */
static void report(mk_fusion *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(mk_fusion *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mk_strbuf_putv(&f->report, fmt, ap);
    va_end(ap);
    mk_strbuf_put(&f->report, "\n");
}

static int push(void ***items, int *n, int *cap, void *item) {
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 16;
        void **grown = realloc(*items, sizeof *grown * (size_t)c);
        if (!grown) return -1;
        *items = grown;
        *cap = c;
    }
    (*items)[(*n)++] = item;
    return 0;
}


/*
 * What cuDNN's pointwise modes compute, as the op table's expressions say it:
 * a pointwise node whose expression is one of these joins groups. (Other
 * pointwise ops stay plain kernels; an op whose expression changes simply
 * stops fusing.)
 */
static const struct {
    const char *expr;
    mk_group_op_kind kind;
} cudnn_modes[] = {
    {"a + b", MK_GOP_ADD},
    {"a * b", MK_GOP_MUL},
    {"a > 0 ? a : 0", MK_GOP_RELU},
    {"a * (1.0f / (1.0f + expf(-a)))", MK_GOP_SILU}, /* cuDNN's swish with beta 1 */
};

static bool same_shape(const mk_node *a, const mk_node *b);

static int kind_of(const mk_node *n) {
    if (n->dtype != MK_DTYPE_FLOAT32) return -1;
    /* HamKaas's broadcast only (a of the result's shape, b of its rank), the
     * form the descriptors are built for; NumPy's wider one runs unfused */
    if (n->op->role == MK_ROLE_POINTWISE && n->n_in == 2 &&
        (!same_shape(n->in[0], n) || n->in[1]->rank != n->rank))
        return -1;
    if (n->op->kernel == MK_KERNEL_MATMUL) /* float32 weights only: cuDNN reads them as such;
                                              HamKaas's forms, which the descriptors describe */
        return n->in[1]->dtype == MK_DTYPE_FLOAT32 && mk_matmul_is_plain(n) ? MK_GOP_MATMUL : -1;
    if (n->op->role != MK_ROLE_POINTWISE || !n->op->expr) return -1;
    for (size_t i = 0; i < sizeof cudnn_modes / sizeof cudnn_modes[0]; i++)
        if (!strcmp(n->op->expr, cudnn_modes[i].expr)) return (int)cudnn_modes[i].kind;
    return -1;
}

static bool is_pointwise(const mk_node *n) {
    int k = kind_of(n);
    return k >= 0 && k != MK_GOP_MATMUL;
}

static bool same_shape(const mk_node *a, const mk_node *b) {
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

/* Pads (rank, shape) with leading 1s to `to` dims. */
static void pad_shape(int rank, const int64_t *shape, int to, int64_t *out) {
    for (int i = 0; i < to; i++) out[i] = i < to - rank ? 1 : shape[i - (to - rank)];
}

/*
 * May `b` broadcast onto a result of shape `like` inside a cuDNN graph? Equal
 * shapes always; otherwise only a row vector over the last axis ([1, 1, N],
 * the bias of a layer), which cuDNN computes correctly on the H200's 9.14.
 * (cudnn_test's probe with MK_CUDNN_BROADCAST=any found all eight patterns of
 * a [B, M, N] matmul epilogue right for one shape; until more shapes and
 * standalone chains are checked, the policy stays this narrow.)
 */
static bool broadcast_ok(const mk_node *b, const mk_node *like) {
    if (same_shape(b, like)) return true;
    const char *any = getenv("MK_CUDNN_BROADCAST");
    if (any && !strcmp(any, "any")) return true;
    for (int i = 0; i < b->rank - 1; i++)
        if (b->shape[i] != 1) return false;
    return b->shape[b->rank - 1] == like->shape[like->rank - 1];
}

/* ---- candidates ------------------------------------------------------------------ */

typedef struct {
    int n;
    mk_node *node[MK_GROUP_MAX_OPS]; /* evaluation order; the last one is the output */
    int n_ext;
    mk_node *ext[MK_GROUP_MAX_INPUTS];
} candidate;

static bool is_member(const candidate *c, const mk_node *x) {
    for (int i = 0; i < c->n; i++)
        if (c->node[i] == x) return true;
    return false;
}

/* The outside operands of c plus node x; false when they would be too many. */
static bool fits(const candidate *c, const mk_node *x) {
    if (c->n >= MK_GROUP_MAX_OPS) return false;
    const mk_node *ext[MK_GROUP_MAX_INPUTS * 2];
    int n_ext = c->n_ext;
    memcpy(ext, c->ext, sizeof(mk_node *) * (size_t)n_ext);
    for (int k = 0; k < x->n_in; k++) {
        const mk_node *in = x->in[k];
        bool seen = is_member(c, in);
        for (int j = 0; j < n_ext && !seen; j++) seen = ext[j] == in;
        if (!seen) {
            if (n_ext == MK_GROUP_MAX_INPUTS) return false;
            ext[n_ext++] = in;
        }
    }
    return true;
}

static void add_ext(candidate *c, mk_node *x) {
    for (int k = 0; k < x->n_in; k++) {
        mk_node *in = x->in[k];
        bool seen = is_member(c, in);
        for (int j = 0; j < c->n_ext && !seen; j++) seen = c->ext[j] == in;
        if (!seen) c->ext[c->n_ext++] = in;
    }
}

/* Rebuilds c's outside operands in member order (after members were dropped). */
static void recount_ext(candidate *c) {
    c->n_ext = 0;
    for (int i = 0; i < c->n; i++) add_ext(c, c->node[i]);
}

/*
 * Can `next` continue a chain whose current end is `cur`? It must be a
 * fusable pointwise node, cur's only reader, not yet taken, with its other
 * operand from outside (and broadcasting, if at all, the way cuDNN gets right).
 */
static bool extends(const mk_graph *g, const candidate *c, const mk_node *cur,
                    const mk_node *next, const bool *taken) {
    if (!next || taken[next->index] || !is_pointwise(next)) return false;
    if (mk_is_output(g, cur) || cur->n_consumers != 1) return false;
    if (next->n_in == 2) {
        const mk_node *other = next->in[0] == cur ? next->in[1] : next->in[0];
        if (is_member(c, other) || other == cur) return false;
        if (next->in[1] == cur && !same_shape(cur, next)) return false; /* cur would broadcast */
        if (next->in[0] == cur && !broadcast_ok(other, next)) return false;
    }
    return fits(c, next);
}

/*
 * Nodes that write in place (role MK_ROLE_INPLACE) between the group's first and
 * last member would be moved across: the group reads its operands at its last
 * member's step. Refuse when one writes into memory an operand lives in.
 */
static bool hazard(const mk_graph *g, const candidate *c) {
    int first = c->node[0]->index, last = c->node[c->n - 1]->index;
    for (int i = first + 1; i < last; i++) {
        const mk_node *w = g->nodes[i];
        if (w->op->role != MK_ROLE_INPLACE) continue;
        for (int k = 0; k < c->n_ext; k++)
            if (c->ext[k]->owner == w->owner) return true;
    }
    return false;
}

/* ---- candidates as groups ---------------------------------------------------------- */

static int ext_index(const candidate *c, const mk_node *x) {
    for (int k = 0; k < c->n_ext; k++)
        if (c->ext[k] == x) return k;
    return -1;
}

static int member_index(const candidate *c, const mk_node *x) {
    for (int i = 0; i < c->n; i++)
        if (c->node[i] == x) return i;
    return -1;
}

static void put_dims(mk_strbuf *b, int rank, const int64_t *d) {
    mk_strbuf_put(b, "[");
    for (int i = 0; i < rank; i++) mk_strbuf_put(b, "%s%lld", i ? "," : "", (long long)d[i]);
    mk_strbuf_put(b, "]");
}

static const char *const kind_names[] = {"matmul", "add", "mul", "relu", "silu"};

/* Bytes an operand's address is known to be a multiple of: allocations are
 * MK_ALIGN-aligned, so only the view's offset counts. */
static int align_of(const mk_node *x) {
    int64_t off = x->view_offset;
    if (off % 16 == 0) return 16;
    if (off % 8 == 0) return 8;
    return 4;
}

/* The group c describes, with its trace; NULL when out of memory. */
static mk_fused_group *group_of(const candidate *c) {
    mk_fused_group *grp = calloc(1, sizeof *grp);
    if (!grp) return NULL;
    int max_rank = 0;
    bool has_matmul = false;
    for (int i = 0; i < c->n; i++) {
        has_matmul |= kind_of(c->node[i]) == MK_GOP_MATMUL;
        if (c->node[i]->rank > max_rank) max_rank = c->node[i]->rank;
    }
    int R = has_matmul || max_rank < 3 ? 3 : max_rank;
    grp->rank = R;
    grp->n_in = c->n_ext;
    for (int k = 0; k < c->n_ext; k++) {
        const mk_node *x = c->ext[k];
        mk_group_input *in = &grp->in[k];
        pad_shape(x->rank, x->shape, R, in->shape);
        int64_t stride[MK_MAX_RANK];
        pad_shape(x->rank, x->stride, R, stride);
        /* padded dims of size 1: the stride a dense tensor would have there */
        for (int d = R - x->rank - 1; d >= 0; d--) stride[d] = in->shape[d + 1] * stride[d + 1];
        memcpy(in->stride, stride, sizeof in->stride);
        in->align = align_of(x);
    }
    grp->n_ops = c->n;
    for (int i = 0; i < c->n; i++) {
        const mk_node *n = c->node[i];
        mk_group_op *op = &grp->op[i];
        op->kind = (mk_group_op_kind)kind_of(n);
        op->n_in = n->n_in;
        pad_shape(n->rank, n->shape, R, op->shape);
        for (int k = 0; k < n->n_in; k++) {
            int j = member_index(c, n->in[k]);
            op->in[k] = j >= 0 ? -1 - j : ext_index(c, n->in[k]);
        }
        /* cuDNN broadcasts only its B operand: keep the chain's value as X
         * (add and mul commute; the outside operand then has the full shape) */
        if (op->n_in == 2 && op->kind != MK_GOP_MATMUL && op->in[1] < 0 && op->in[0] >= 0) {
            int t = op->in[0];
            op->in[0] = op->in[1];
            op->in[1] = t;
        }
    }
    mk_strbuf b = {0};
    mk_strbuf_put(&b, "f32 rank %d;", R);
    for (int k = 0; k < grp->n_in; k++) {
        mk_strbuf_put(&b, " in%d ", k);
        put_dims(&b, R, grp->in[k].shape);
        put_dims(&b, R, grp->in[k].stride);
        mk_strbuf_put(&b, "@%d;", grp->in[k].align);
    }
    for (int i = 0; i < grp->n_ops; i++) {
        const mk_group_op *op = &grp->op[i];
        mk_strbuf_put(&b, " %s(", kind_names[op->kind]);
        for (int k = 0; k < op->n_in; k++)
            mk_strbuf_put(&b, "%s%s%d", k ? "," : "", op->in[k] >= 0 ? "in" : "op", op->in[k] >= 0 ? op->in[k] : -1 - op->in[k]);
        mk_strbuf_put(&b, ")");
        put_dims(&b, R, op->shape);
        mk_strbuf_put(&b, ";");
    }
    if (b.failed || !b.s) {
        free(b.s);
        free(grp);
        return NULL;
    }
    grp->trace = b.s;
    return grp;
}

/* "<op> $4 [$1 $2] <op> $5 [$3] <op> $6": members and outside operands, for reports
 * and the script. */
static char *describe(const candidate *c) {
    mk_strbuf b = {0};
    for (int i = 0; i < c->n; i++) {
        const mk_node *n = c->node[i];
        mk_strbuf_put(&b, "%s%s $%d", i ? " " : "", n->op->name, n->id);
        bool first = true;
        for (int k = 0; k < n->n_in; k++) {
            if (is_member(c, n->in[k])) continue;
            mk_strbuf_put(&b, "%s$%d", first ? " [" : " ", n->in[k]->id);
            first = false;
        }
        if (!first) mk_strbuf_put(&b, "]");
    }
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- compile and replace --------------------------------------------------------------- */

typedef struct {
    mk_graph *g;
    mk_fusion *f;
    mk_node **sole; /* [n_nodes] each node's single reader, or NULL */
    bool *taken;    /* [n_nodes] in a group already (or in a rejected chain) */
    bool *gone;     /* [n_nodes] replaced by a group: leaves the graph */
} pass_state;

/*
 * Compiles candidate c. 0: replaced by a group node; 1: rejected (stays
 * as plain nodes, reason reported); -1: error.
 */
static int try_group(pass_state *st, const candidate *c, mk_error **err) {
    mk_fusion *f = st->f;
    char *what = describe(c);
    mk_fused_group *grp = group_of(c);
    const mk_op *group_op = mk_op_internal(MK_KERNEL_CUDNN_GROUP);
    if (!what || !grp || push((void ***)&f->groups, &f->n_groups, &f->cap_groups, grp)) {
        free(what);
        group_free(grp);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "fusing a cuDNN group");
    }
    if (!group_op) {
        free(what);
        return MK_INTERNAL(err, "no group row in the op table");
    }
    /* from here the fusion state owns grp */
    grp->cache = f->cache;
    const mk_cudnn_note *note = note_of(f, grp->trace);
    if (note && note->rejected) { /* refused at an earlier prepare */
        f->groups[--f->n_groups] = NULL;
        group_free(grp);
        report(f, "rejected: %s: %s", what, note->why);
        f->rejected++;
        free(what);
        return 1;
    }
    mk_node *o = c->node[c->n - 1];
    const mk_op *root_op = o->op;
    if (mk_group_attach(o, &cudnn_class, grp, err)) {
        free(what);
        return -1;
    }
    o->group->root_op = root_op;
    o->group->scratch_bytes = note ? note->workspace_bytes : 0;
    for (int i = 0; i + 1 < c->n; i++) o->group->members[o->group->n_members++] = c->node[i];
    for (int i = 0; i < c->n; i++) {
        st->taken[c->node[i]->index] = true;
        st->gone[c->node[i]->index] = i + 1 < c->n;
    }

    /* The last member becomes the group: same id, storage and views. */
    o->op = group_op;
    o->n_in = c->n_ext;
    for (int k = 0; k < MK_GROUP_MAX_INPUTS; k++) o->in[k] = k < c->n_ext ? c->ext[k] : NULL;
    o->n_attr = 0;
    free(o->name);
    o->name = what;
    return 0;
}

/* Extends c forward from its last member along single readers. */
static void grow_forward(pass_state *st, candidate *c) {
    for (;;) {
        mk_node *cur = c->node[c->n - 1];
        mk_node *next = st->sole[cur->index];
        if (!extends(st->g, c, cur, next, st->taken)) return;
        c->node[c->n++] = next;
        add_ext(c, next);
        if (hazard(st->g, c)) {
            c->n--;
            recount_ext(c);
            return;
        }
    }
}

/* c = pro[n-1], ..., pro[0], m: the prologue's n members nearest to A, then m. */
static void with_prologue(candidate *c, mk_node *const *pro, int n, mk_node *m) {
    c->n = 0;
    for (int k = n - 1; k >= 0; k--) c->node[c->n++] = pro[k];
    c->node[c->n++] = m;
    recount_ext(c);
}

static int fuse_matmuls(pass_state *st, mk_error **err) {
    mk_graph *g = st->g;
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *m = g->nodes[i];
        if (st->taken[i] || kind_of(m) != MK_GOP_MATMUL) continue;
        /* prologue: pointwise nodes feeding A through their first operand, each
         * read only by the next (pro[0] is A itself) */
        mk_node *pro[MK_GROUP_MAX_OPS / 2];
        int n_pro = 0;
        for (mk_node *p = m->in[0];
             n_pro < MK_GROUP_MAX_OPS / 2 && is_pointwise(p) && !st->taken[p->index] &&
             p->n_consumers == 1 && !mk_is_output(g, p) && p->owner == p &&
             !(p->n_in == 2 && !broadcast_ok(p->in[1], p));
             p = p->in[0])
            pro[n_pro++] = p;
        /* the most of it whose outside operands fit, and that moves no read
         * across an in-place write */
        candidate c = {0};
        int with_pro = n_pro;
        for (; with_pro >= 0; with_pro--) {
            with_prologue(&c, pro, with_pro, m);
            if (c.n_ext <= MK_GROUP_MAX_INPUTS && (with_pro == 0 || !hazard(g, &c))) break;
        }
        if (with_pro < 0) continue; /* unreachable: a matmul alone has two operands */
        grow_forward(st, &c);
        if (c.n < 2) continue; /* a lone matmul gains nothing from cuDNN */
        int rc = try_group(st, &c, err);
        if (rc < 0) return -1;
        if (rc == 0 || with_pro == 0) continue;
        /* rejected with a prologue: once more without it */
        memmove(c.node, c.node + with_pro, sizeof c.node[0] * (size_t)(c.n - with_pro));
        c.n -= with_pro;
        recount_ext(&c);
        if (c.n >= 2 && try_group(st, &c, err) < 0) return -1;
    }
    return 0;
}

static int fuse_chains(pass_state *st, mk_error **err) {
    mk_graph *g = st->g;
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *p = g->nodes[i];
        if (st->taken[i] || !is_pointwise(p)) continue;
        if (p->n_in == 2 && !broadcast_ok(p->in[1], p)) continue;
        candidate c = {0};
        c.node[c.n++] = p;
        add_ext(&c, p);
        grow_forward(st, &c);
        if (c.n < 2) continue;
        int rc = try_group(st, &c, err);
        if (rc < 0) return -1;
        if (rc > 0)
            for (int k = 0; k < c.n; k++) st->taken[c.node[k]->index] = true; /* no sub-chains */
    }
    return 0;
}

/* ---- after prepare ----------------------------------------------------------------- */

/* The group's text in the report: the group node's name (describe's). */
static const char *what_of(const mk_graph *g, const mk_fused_group *grp) {
    for (int i = 0; i < g->n_nodes; i++)
        if (mk_node_cudnn(g->nodes[i]) == grp) return g->nodes[i]->name;
    return "a group";
}

void mk_fusion_prepared(mk_fusion *f, const mk_graph *g) {
    for (int i = 0; f && i < f->n_groups; i++) {
        const mk_fused_group *grp = f->groups[i];
        if (grp->verdict != MK_CUDNN_FUSED) continue;
        /* a hit: built by an earlier compile call, or by an earlier group of this one */
        const mk_cudnn_note *n = note_of(f, grp->trace);
        bool hit = grp->cache_hit && !(n && n->built_in == f->call);
        for (int j = 0; j < i && !hit; j++)
            hit = f->groups[j]->verdict == MK_CUDNN_FUSED && !strcmp(f->groups[j]->trace, grp->trace);
        report(f, "%s: %s: %s", hit ? "cache hit" : "fused", what_of(g, grp), grp->why);
        f->fused++;
        f->cache_hits += hit;
        f->tf32 += grp->tf32;
    }
}

int mk_fusion_learn(mk_fusion *f) {
    int learned = 0;
    for (int i = 0; f && i < f->n_groups; i++) {
        const mk_fused_group *grp = f->groups[i];
        mk_cudnn_note *n = (mk_cudnn_note *)note_of(f, grp->trace);
        bool news = grp->verdict == MK_CUDNN_REJECTED ||
                    (grp->verdict == MK_CUDNN_WORKSPACE &&
                     !(n && !n->rejected && n->workspace_bytes >= grp->workspace_bytes));
        bool built = grp->verdict != MK_CUDNN_UNTRIED && !grp->cache_hit;
        if (!news && !built) continue;
        if (!n) {
            if (!(n = calloc(1, sizeof *n)) || !(n->trace = strdup(grp->trace))) {
                free(n);
                return -1;
            }
            n->next = *f->notes;
            *f->notes = n;
        }
        if (built) n->built_in = f->call; /* the next try finds it cached: not a hit */
        if (!news) continue;
        n->rejected = grp->verdict == MK_CUDNN_REJECTED;
        n->workspace_bytes = grp->workspace_bytes;
        snprintf(n->why, sizeof n->why, "%s", grp->why);
        learned++;
    }
    return learned;
}

int mk_fusion_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err) {
    if (!opts->use_cudnn || opts->no_passes || !g->fusion || !t->cudnn_groups) return 0;
    pass_state st = {.g = g, .f = g->fusion};
    size_t n = (size_t)(g->n_nodes ? g->n_nodes : 1);
    int rc = -1;
    st.sole = calloc(n, sizeof *st.sole);
    st.taken = calloc(n, sizeof *st.taken);
    st.gone = calloc(n, sizeof *st.gone);
    if (!st.sole || !st.taken || !st.gone) {
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "fusing cuDNN groups");
        goto done;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *x = g->nodes[i];
        for (int k = 0; k < x->n_in; k++)
            if (x->in[k]->n_consumers == 1) st.sole[x->in[k]->index] = x;
    }
    rc = fuse_matmuls(&st, err) || fuse_chains(&st, err) ? -1 : 0;

    /* The replaced members leave the evaluation order (the fusion owns them now,
     * also when a later group failed); indices and readers again. */
    int kept = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *x = g->nodes[i];
        if (st.gone[i]) continue;
        x->index = kept;
        g->nodes[kept++] = x;
    }
    g->n_nodes = kept;
    for (int i = 0; i < g->n_nodes; i++) g->nodes[i]->n_consumers = 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) g->nodes[i]->in[k]->n_consumers++;
done:
    free(st.sole);
    free(st.taken);
    free(st.gone);
    return rc;
}
