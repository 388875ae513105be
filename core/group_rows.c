/*
 * group_rows.c — the row-group pass: a reduction over rows (SoftmaxNode,
 * LogSoftmaxNode along the last axis, LayerNormNode of the last axis,
 * RmsNormEpsNode) with the pointwise node that makes its x (the prologue) and
 * the one that reads its result (the epilogue) becomes one node, which the
 * CPU runs as one loop over rows (core/cpu/reduce.c): a row of x is computed,
 * reduced and finished while it is in cache, and neither x nor the row op's
 * result goes through memory. So `(x * 2):softmax() + 1` is one launch.
 *
 * Runs after the pointwise and product passes, on what they left: a prologue
 * or epilogue is a pointwise node or a pointwise group, of the row op's shape
 * and dtype (its operands broadcast to it as they did), read by nothing else,
 * with no in-place write between it and the row op. The epilogue becomes the
 * group node (RowsGroupNode), the others its members. Only devices whose
 * target says row_groups get them: the CPU, and CUDA, which runs each as one
 * generated kernel (core/codegen/rows.c). On the CPU results equal the nodes
 * run alone, bit for bit (the same row functions); on CUDA within float32
 * rounding of the CPU's (rows.c says how).
 */
#include "passes.h"
#include "reductions.h"

#include <stdlib.h>
#include <string.h>

/* The row op's operand k (weight, bias, eps) for each op the group takes. */
typedef struct {
    int w, b, eps;
} row_params;

/* Whether n is a row op the group takes, and its parameters' operands. */
static bool row_op(const mk_node *n, row_params *p) {
    *p = (row_params){-1, -1, -1};
    switch (n->op->kernel) {
    case MK_KERNEL_SOFTMAX:
    case MK_KERNEL_LOG_SOFTMAX: return mk_reduce_mask(n) == 1u << (n->rank - 1);
    case MK_KERNEL_LAYER_NORM: *p = (row_params){1, 2, 3}; return n->attr[0] == 1;
    case MK_KERNEL_RMS_NORM_EPS: *p = (row_params){1, -1, 2}; return true;
    default: return false;
    }
}

/* A pointwise node or group: its program over its operands n->in[]. */
static const mk_expr *program_of(const mk_node *n) {
    const mk_pointwise_group *pw = mk_node_pointwise(n);
    if (pw) return &pw->program;
    if (n->op->role == MK_ROLE_POINTWISE && n->op->kernel == MK_KERNEL_POINTWISE)
        return mk_op_program(n->op);
    return NULL;
}

static bool same_shape(const mk_node *a, const mk_node *b) {
    return a->rank == b->rank && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank);
}

static bool write_between(const mk_graph *g, const mk_node *a, const mk_node *b) {
    for (int i = a->index + 1; i < b->index; i++)
        if (g->nodes[i]->op->role == MK_ROLE_INPLACE) return true;
    return false;
}

/* How often n reads x. */
static int reads(const mk_node *n, const mk_node *x) {
    int k = 0;
    for (int i = 0; i < n->n_in; i++) k += n->in[i] == x;
    return k;
}

/* x may move into a group at r: computed in the group, read by nothing else. */
static bool may_join(const mk_graph *g, const mk_node *x, const mk_node *r) {
    return program_of(x) && !mk_is_output(g, x) && x->owner == x &&
           x->storage == MK_STORAGE_ARENA && x->dtype == MK_DTYPE_FLOAT32 && same_shape(x, r);
}

typedef struct {
    mk_node *pro, *row, *epi; /* pro, epi may be NULL */
    mk_node *in[MK_MAX_INPUTS];
    int n_in;
} rows;

/* The register of x among the programs' operands (added where new); -1: no room. */
static int operand(rows *c, mk_node *x) {
    for (int k = 0; k < c->n_in; k++)
        if (c->in[k] == x) return k;
    if (c->n_in == MK_X_IN - 1) return -1; /* the epilogue's register for the row op */
    c->in[c->n_in] = x;
    return c->n_in++;
}

/* Appends node m's program to e, its operand `skip` read from register
 * `skip_reg`; false when it does not fit. */
static bool append(rows *c, mk_expr *e, const mk_node *m, const mk_node *skip, int skip_reg) {
    int regs[MK_X_IN], result;
    for (int k = 0; k < m->n_in; k++)
        if ((regs[k] = m->in[k] == skip ? skip_reg : operand(c, m->in[k])) < 0) return false;
    return mk_expr_append(e, program_of(m), regs, &result);
}

static void describe_rows(const mk_node *n, bool brief, mk_strbuf *b) {
    const mk_rows_group *rg = mk_node_rows(n);
    if (brief) {
        mk_strbuf_put(b, "%s rows%s%s", rg->row_op->name, rg->prologue.n ? ", prologue" : "",
                      rg->epilogue.n ? ", epilogue" : "");
        return;
    }
    mk_strbuf_put(b, "one loop over rows of %lld: %s%s%s for",
                  (long long)n->shape[n->rank - 1], rg->prologue.n ? "a pointwise prologue, " : "",
                  rg->row_op->name, rg->epilogue.n ? ", a pointwise epilogue" : "");
    mk_group_put_members(n, b);
}

static const mk_group_class rows_class = {MK_GROUP_ROWS, "rows", describe_rows, free};

/* The last of c's nodes becomes the group node; the others its members. */
static int make_group(rows *c, const row_params *p, bool *gone, mk_error **err) {
    mk_rows_group *rg = calloc(1, sizeof *rg);
    if (!rg) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping rows");
    rg->row_op = c->row->op;
    rg->x = -1;
    if (c->pro && !append(c, &rg->prologue, c->pro, NULL, -1)) goto no_room;
    if (!c->pro && (rg->x = operand(c, c->row->in[0])) < 0) goto no_room;
    int value = MK_X_IN - 1; /* the row op's value: renumbered below */
    if (c->epi && !append(c, &rg->epilogue, c->epi, c->row, value)) goto no_room;
    rg->n_prog = c->n_in;
    /* the row op's value sits right after the programs' operands */
    for (int i = 0; i < rg->epilogue.n; i++) {
        mk_xinsn *in = &rg->epilogue.insn[i];
        if (in->x == value) in->x = (unsigned char)c->n_in;
        if (in->y == value) in->y = (unsigned char)c->n_in;
        if (in->z == value) in->z = (unsigned char)c->n_in;
    }
    rg->prologue.n_in = c->n_in;
    rg->epilogue.n_in = c->n_in + 1;
    mk_expr_tidy(&rg->prologue);
    mk_expr_tidy(&rg->epilogue);
    int params[3] = {p->w, p->b, p->eps}, *at[3] = {&rg->w, &rg->b, &rg->eps};
    for (int i = 0; i < 3; i++) {
        *at[i] = params[i] < 0 ? -1 : c->n_in;
        if (params[i] >= 0) c->in[c->n_in++] = c->row->in[params[i]];
    }

    mk_node *root = c->epi ? c->epi : c->row;
    mk_group *old = root->group; /* an epilogue that is a pointwise group: its members join */
    const mk_op *root_op = old ? old->root_op : root->op;
    root->group = NULL;
    if (mk_group_attach(root, &rows_class, rg, err)) {
        root->group = old;
        return -1;
    }
    mk_group *grp = root->group;
    grp->root_op = root_op;
    mk_node *members[2] = {c->pro, c->epi ? c->row : NULL};
    for (int i = 0; i < 2; i++)
        if (members[i]) {
            grp->members[grp->n_members++] = members[i];
            gone[members[i]->index] = true;
        }
    if (old) {
        for (int i = 0; i < old->n_members; i++) grp->members[grp->n_members++] = old->members[i];
        old->n_members = 0;
        mk_group_free(old);
    }
    /* in the script's order, as reports list members */
    for (int i = 1; i < grp->n_members; i++)
        for (int j = i; j > 0 && grp->members[j - 1]->id > grp->members[j]->id; j--) {
            mk_node *t = grp->members[j];
            grp->members[j] = grp->members[j - 1];
            grp->members[j - 1] = t;
        }
    root->op = mk_op_internal(MK_KERNEL_ROWS_GROUP);
    root->n_in = c->n_in;
    memcpy(root->in, c->in, sizeof root->in[0] * (size_t)c->n_in);
    return 0;
no_room:
    free(rg);
    return 1;
}

int mk_rows_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                 mk_error **err) {
    if (opts->no_passes || opts->no_fusion || !t->row_groups || g->n_nodes == 0) return 0;
    bool *gone = calloc((size_t)g->n_nodes, sizeof *gone);
    if (!gone) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping rows");
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *r = g->nodes[i];
        row_params p;
        if (gone[i] || !row_op(r, &p)) continue;
        rows c = {.row = r};
        mk_node *x = r->in[0];
        if (x->n_consumers == 1 && may_join(g, x, r) && !write_between(g, x, r) && !gone[x->index])
            c.pro = x;
        /* the epilogue: the one node that reads r, right as it is */
        for (int j = i + 1; j < g->n_nodes && !c.epi && r->n_consumers > 0; j++) {
            mk_node *e = g->nodes[j];
            if (!reads(e, r)) continue;
            if (reads(e, r) == r->n_consumers && !mk_is_output(g, r) && r->owner == r &&
                r->storage == MK_STORAGE_ARENA && program_of(e) && e->owner == e && same_shape(e, r) &&
                e->dtype == MK_DTYPE_FLOAT32 && !write_between(g, r, e) &&
                (!e->group || e->group->n_members <= MK_GROUP_MEMBERS - 2))
                c.epi = e;
            break;
        }
        if (!c.pro && !c.epi) continue;
        int rc = make_group(&c, &p, gone, err);
        if (rc < 0) {
            free(gone);
            return -1;
        }
    }
    mk_group_leave(g, gone);
    free(gone);
    return 0;
}
