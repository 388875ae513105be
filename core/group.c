/*
 * group.c — the group record every grouping pass makes (group.h).
 *
 * A pass that runs several nodes as one launch attaches a record to the node
 * that stands for them: the members it replaced, the scratch its launch takes,
 * its class (kind, name, describe) and the kind's own body. Everything outside
 * the pass, the kind's CPU runner and its CUDA generator sees only the record:
 * the script printer, the fusion report, the DOT picture, the planner's
 * scratch, freeing, and the fault messages that name a member.
 */
#include "group.h"

#include <stdlib.h>

int mk_group_attach(mk_node *n, const mk_group_class *cls, void *body, mk_error **err) {
    mk_group *grp = calloc(1, sizeof *grp);
    if (!grp) {
        if (cls->free_body) cls->free_body(body);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping nodes: %s group $%d", cls->name, n->id);
    }
    grp->cls = cls;
    grp->body = body;
    n->group = grp;
    return 0;
}

void mk_group_leave(mk_graph *g, const bool *gone) {
    int kept = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *n = g->nodes[i];
        if (gone[i]) continue;
        n->index = kept;
        g->nodes[kept++] = n;
    }
    g->n_nodes = kept;
    for (int i = 0; i < g->n_nodes; i++) g->nodes[i]->n_consumers = 0;
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) g->nodes[i]->in[k]->n_consumers++;
}

void mk_group_free(mk_group *grp) {
    if (!grp) return;
    for (int i = 0; i < grp->n_members; i++) {
        mk_node *m = grp->members[i];
        mk_group_free(m->group); /* a product group's members may be pointwise groups */
        free(m->name);
        free(m);
    }
    if (grp->cls->free_body) grp->cls->free_body(grp->body);
    free(grp);
}

void mk_group_put_members(const mk_node *n, mk_strbuf *b) {
    const mk_group *grp = n->group;
    for (int k = 0; k < grp->n_members; k++)
        mk_strbuf_put(b, "%s %s $%d", k ? "," : "", grp->members[k]->op->name, grp->members[k]->id);
    if (grp->root_op) mk_strbuf_put(b, "%s %s $%d", grp->n_members ? "," : "", grp->root_op->name, n->id);
}

void mk_group_report(const mk_graph *g, mk_strbuf *b, int counts[MK_GROUP_KINDS]) {
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        if (!n->group) continue;
        const mk_group_class *cls = n->group->cls;
        counts[cls->kind]++;
        if (cls->kind == MK_GROUP_CUDNN) continue; /* the fusion pass reports its own */
        mk_strbuf_put(b, "%s group $%d (line %d): ", cls->name, n->id, n->line);
        cls->describe(n, false, b);
        mk_strbuf_put(b, "\n");
    }
}

size_t mk_group_scratch(const mk_node *n) { return n->group ? n->group->scratch_bytes : 0; }
