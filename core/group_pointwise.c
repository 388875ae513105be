/*
 * group_pointwise.c — the grouping pass: pointwise trees become one node each.
 *
 * Device-independent: it reads op roles and expressions, never names. A
 * group is a root pointwise node and the pointwise nodes feeding it that
 * nobody else reads; the root becomes a PointwiseGroupNode (the op table's
 * internal row) whose program is the members' expressions composed over the
 * group's operands, and the other members leave the graph. A device runs the
 * program: the CPU as it runs one op's (over tiles), CUDA as a kernel written
 * for the group (kernels/generated.cu). So a chain like silu(a) * b reads a
 * and b once and writes once, with nothing in between.
 *
 * A member must
 *   - be pointwise with an expression, of the root's shape (its operands
 *     broadcast to the root's shape as they did to its own) and of the
 *     group's compute dtype: the dtype of its operands that are not bool, or
 *     of its result where all are bool (compute_dtype); a member of bool only
 *     (logical ops) joins any group. So one program holds values of one dtype,
 *     bool operands read as 0 or 1 and a bool result stored as != 0
 *     (mk_pointwise_compute_dtype in device.h says the same of the launch);
 *   - have exactly one reader, inside the group, and not be the output;
 *   - have no in-place write between it and the root: its operands are now
 *     read where the root stands, and a write in between could change them.
 * A group stops growing where its program would pass MK_EXPR_MAX instructions
 * or its operands the device's limit (mk_target.pointwise_operands: the
 * CPU's program runner and CUDA's generated kernels both take MK_X_IN).
 * Nothing is recomputed: results stay bit-identical to one launch per node.
 */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    mk_node *members[MK_EXPR_MAX]; /* in graph order, the root last */
    int n_members;
    mk_node *in[MK_X_IN];          /* operands from outside, in first-use order */
    int n_in;
    mk_expr program;
} group;

static bool same_shape(const mk_node *a, const mk_node *b) {
    return a->rank == b->rank && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank);
}

/* The dtype n's program computes in, or -1 for bool only (any will do). */
static int compute_dtype(const mk_node *n) {
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k]->dtype != MK_DTYPE_BOOL) return (int)n->in[k]->dtype;
    return n->dtype != MK_DTYPE_BOOL ? (int)n->dtype : -1;
}

/* The group's compute dtype, or -1 while every member is bool only. */
static int group_dtype(const group *gr) {
    for (int i = 0; i < gr->n_members; i++) {
        int d = compute_dtype(gr->members[i]);
        if (d >= 0) return d;
    }
    return -1;
}

static bool is_member(const group *gr, const mk_node *n) {
    for (int i = 0; i < gr->n_members; i++)
        if (gr->members[i] == n) return true;
    return false;
}

/* The register holding operand x of a member: a member's result, or an
 * operand from outside (a new one where there is room); -1 when there is none. */
static int register_of(group *gr, const int *result, const mk_node *x, int limit) {
    for (int i = 0; i < gr->n_members; i++)
        if (gr->members[i] == x) return result[i];
    for (int k = 0; k < gr->n_in; k++)
        if (gr->in[k] == x) return k;
    if (gr->n_in == limit) return -1;
    gr->in[gr->n_in] = (mk_node *)x;
    return gr->n_in++;
}

/* Composes the members' programs in graph order into gr->program over gr->in;
 * false when it does not fit. */
static bool compose(group *gr, int limit) {
    mk_expr *e = &gr->program;
    *e = (mk_expr){0};
    gr->n_in = 0;
    int result[MK_EXPR_MAX];
    for (int i = 0; i < gr->n_members; i++) {
        const mk_node *m = gr->members[i];
        const mk_expr *p = mk_op_program(m->op);
        int operands[MK_X_IN];
        for (int k = 0; k < m->n_in; k++)
            if ((operands[k] = register_of(gr, result, m->in[k], limit)) < 0) return false;
        if (!mk_expr_append(e, p, operands, &result[i])) return false;
    }
    /* The root's result must be the last instruction: it is (members in order). */
    e->n_in = gr->n_in;
    mk_expr_tidy(e);
    return true;
}

static bool pointwise(const mk_node *n) {
    return n->op->role == MK_ROLE_POINTWISE && n->op->kernel == MK_KERNEL_POINTWISE &&
           mk_op_program(n->op) != NULL;
}

/* Is there an in-place write after x and before the root? */
static bool write_between(const mk_graph *g, const mk_node *x, const mk_node *root) {
    for (int i = x->index + 1; i < root->index; i++)
        if (g->nodes[i]->op->role == MK_ROLE_INPLACE) return true;
    return false;
}

static bool may_join(const mk_graph *g, const group *gr, const mk_node *x) {
    const mk_node *root = gr->members[gr->n_members - 1];
    int dx = compute_dtype(x), dg = group_dtype(gr);
    return pointwise(x) && !mk_is_output(g, x) && x->n_consumers == 1 && x->owner == x &&
           x->storage == MK_STORAGE_ARENA && (dx < 0 || dg < 0 || dx == dg) &&
           same_shape(x, root) && !is_member(gr, x) && !write_between(g, x, root);
}

/* Adds x in graph order. */
static void insert(group *gr, mk_node *x) {
    int at = gr->n_members;
    while (at > 0 && gr->members[at - 1]->index > x->index) {
        gr->members[at] = gr->members[at - 1];
        at--;
    }
    gr->members[at] = x;
    gr->n_members++;
}

static void remove_member(group *gr, const mk_node *x) {
    int at = 0;
    while (gr->members[at] != x) at++;
    memmove(&gr->members[at], &gr->members[at + 1],
            sizeof gr->members[0] * (size_t)(gr->n_members - at - 1));
    gr->n_members--;
}

/* Grows the group from its members' operands until nothing more may join;
 * each candidate joins only if the program still fits. */
static void grow(const mk_graph *g, group *gr, int limit) {
    bool grew = true;
    while (grew && gr->n_members < MK_EXPR_MAX) {
        grew = false;
        for (int i = gr->n_members - 1; i >= 0 && !grew; i--) {
            mk_node *m = gr->members[i];
            for (int k = 0; k < m->n_in && !grew; k++) {
                mk_node *x = m->in[k];
                if (!may_join(g, gr, x)) continue;
                insert(gr, x);
                grew = compose(gr, limit);
                if (!grew) remove_member(gr, x);
            }
        }
    }
    compose(gr, limit); /* the program of the members that stayed */
}

static void describe_group(const mk_node *n, bool brief, mk_strbuf *b) {
    const mk_pointwise_group *pw = mk_node_pointwise(n);
    if (brief) {
        mk_strbuf_put(b, "%d instructions over %d operands", pw->program.n, n->n_in);
        return;
    }
    mk_strbuf_put(b, "one launch of %d instructions over %d operand%s for", pw->program.n, n->n_in,
                  n->n_in == 1 ? "" : "s");
    mk_group_put_members(n, b);
}

static const mk_group_class pointwise_class = {MK_GROUP_POINTWISE, "pointwise", describe_group, free};

/* The root becomes the group node; the other members move into the group. */
static int make_group(const group *gr, bool *gone, mk_error **err) {
    mk_node *root = gr->members[gr->n_members - 1];
    mk_pointwise_group *pw = calloc(1, sizeof *pw);
    if (!pw || mk_group_attach(root, &pointwise_class, pw, err))
        return pw ? -1 : mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping pointwise nodes");
    pw->program = gr->program;
    root->group->root_op = root->op;
    root->group->n_members = gr->n_members - 1;
    for (int i = 0; i < root->group->n_members; i++) {
        root->group->members[i] = gr->members[i];
        gone[gr->members[i]->index] = true;
    }
    root->op = mk_op_internal(MK_KERNEL_POINTWISE);
    root->n_in = gr->n_in;
    memcpy(root->in, gr->in, sizeof root->in[0] * (size_t)gr->n_in);
    return 0;
}

int mk_pointwise_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err) {
    int limit = t->pointwise_operands < MK_X_IN ? t->pointwise_operands : MK_X_IN;
    if (opts->no_passes || opts->no_fusion || limit < 1 || g->n_nodes == 0) return 0;
    bool *gone = calloc((size_t)g->n_nodes, sizeof *gone);
    if (!gone) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping pointwise nodes");
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        mk_node *root = g->nodes[i];
        if (gone[i] || !pointwise(root)) continue;
        group gr = {.members = {root}, .n_members = 1};
        if (!compose(&gr, limit)) continue;
        grow(g, &gr, limit);
        if (gr.n_members < 2) continue;
        if (make_group(&gr, gone, err)) {
            free(gone);
            return -1;
        }
    }
    mk_group_leave(g, gone);
    free(gone);
    return 0;
}
