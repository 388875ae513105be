/*
 * dot.c — the compiled plan as a Graphviz picture (mk_graph_dot).
 *
 * A box per node with its op, shape, dtype and where its memory is (an arena
 * offset and size, its own constant or buffer, or a view or in-place write of
 * another node's); leaves are ellipses (inputs), notes (constants) and
 * cylinders (buffers). Edges run from operand to reader; a dashed grey edge
 * joins a view to the node whose memory it shares. A group (pointwise,
 * matrix-vector, attention) is a cluster holding the nodes it replaced,
 * labelled with what runs it.
 */
#include "group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* s with " and \ escaped, for a DOT string */
static void put_escaped(mk_strbuf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') mk_strbuf_put(b, "\\%c", *s);
        else if (*s == '\n') mk_strbuf_put(b, "\\n");
        else mk_strbuf_put(b, "%c", *s);
    }
}

static const char *shape_of(const mk_node *n) {
    if (n->op->role != MK_ROLE_LEAF) return "box";
    switch (n->op->leaf) {
    case MK_LEAF_CONSTANT: return "note";
    case MK_LEAF_BUFFER: return "cylinder";
    default: return "ellipse";
    }
}

/* One node's statement: "n<index> [label=..., shape=...];" (members of a group
 * have no index in the graph: they are named m<id>). */
static void put_node(mk_strbuf *b, const mk_node *n, const char *id, const char *op_name,
                     bool placed) {
    char shape[96];
    mk_shape_str(n->rank, n->shape, shape, sizeof shape);
    mk_strbuf_put(b, "  %s [shape=%s, label=\"$%d %s", id, shape_of(n), n->id, op_name);
    if (n->name) {
        mk_strbuf_put(b, " '");
        put_escaped(b, n->name);
        mk_strbuf_put(b, "'");
    }
    mk_strbuf_put(b, "\\n%s %s", mk_dtype_name(n->dtype), shape);
    if (placed) {
        size_t bytes = mk_node_bytes(n);
        switch (n->storage) {
        case MK_STORAGE_ARENA:
            mk_strbuf_put(b, "\\narena @%lld, %zu B", (long long)n->offset, bytes);
            break;
        case MK_STORAGE_CONSTANT: mk_strbuf_put(b, "\\nconstant, %zu B", bytes); break;
        case MK_STORAGE_BUFFER: mk_strbuf_put(b, "\\nbuffer, %zu B", bytes); break;
        case MK_STORAGE_VIEW:
            mk_strbuf_put(b, "\\n%s $%d +%lld B",
                          n->op->role == MK_ROLE_INPLACE ? "in place of" : "view of",
                          n->owner->id, (long long)n->view_offset);
            break;
        }
    }
    mk_strbuf_put(b, "\"];\n");
}

/* The nodes a group node replaced, or none. */
static mk_node *const *members_of(const mk_node *n, int *count) {
    *count = n->group ? n->group->n_members : 0;
    return n->group ? n->group->members : NULL;
}

char *mk_graph_dot(const mk_graph *g) {
    mk_strbuf b = {0};
    mk_strbuf_put(&b, "digraph moonkaas {\n  rankdir=TB;\n"
                      "  node [fontname=\"monospace\", fontsize=10];\n"
                      "  edge [color=\"#555555\"];\n");
    char id[32];
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        snprintf(id, sizeof id, "n%d", n->index);
        if (!n->group) {
            put_node(&b, n, id, n->op->name, true);
            continue;
        }
        /* a group: its members inside, the group node (the root's place) last */
        mk_strbuf_put(&b, "  subgraph cluster_%d {\n    style=rounded; color=\"#3366aa\";\n",
                      n->index);
        mk_strbuf_put(&b, "    label=\"%s $%d: one kernel, ", n->op->name, n->id);
        n->group->cls->describe(n, true, &b);
        mk_strbuf_put(&b, "\";\n");
        int n_members;
        mk_node *const *members = members_of(n, &n_members);
        for (int k = 0; k < n_members; k++) {
            char mid[32];
            snprintf(mid, sizeof mid, "m%d", members[k]->id);
            mk_strbuf_put(&b, "  ");
            put_node(&b, members[k], mid, members[k]->op->name, false);
        }
        mk_strbuf_put(&b, "  ");
        put_node(&b, n, id, n->group->root_op ? n->group->root_op->name : n->op->name, true);
        mk_strbuf_put(&b, "  }\n");
    }
    /* edges: operands to readers; inside a group, between its members */
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            mk_strbuf_put(&b, "  n%d -> n%d;\n", n->in[k]->index, n->index);
        if (n->storage == MK_STORAGE_VIEW && n->owner != n)
            mk_strbuf_put(&b, "  n%d -> n%d [style=dashed, color=\"#aaaaaa\", arrowhead=none];\n",
                          n->index, n->owner->index);
        int n_members;
        mk_node *const *members = members_of(n, &n_members);
        for (int m = 0; m < n_members; m++) { /* each member feeds later members, or the group */
            const mk_node *x = members[m];
            bool read = false;
            for (int r = m + 1; r < n_members; r++)
                for (int k = 0; k < members[r]->n_in; k++)
                    if (members[r]->in[k] == x) {
                        mk_strbuf_put(&b, "  m%d -> m%d [style=bold];\n", x->id, members[r]->id);
                        read = true;
                    }
            if (!read) mk_strbuf_put(&b, "  m%d -> n%d [style=bold];\n", x->id, n->index);
        }
    }
    mk_strbuf_put(&b, "}\n");
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* ---- the arena over time ------------------------------------------------------ */

/*
 * An SVG of the plan's arena: x is the evaluation order (one column per node),
 * y the offset in bytes, one box per tensor from the node that writes it to
 * its last reader, labelled with its $N; a line marks the live-bytes lower
 * bound no plan can beat. Written here, no dependency.
 */
char *mk_graph_memory_svg(const mk_graph *g, size_t arena_bytes, size_t lower_bound) {
    const double W = 900, H = 420, left = 60, top = 30, right = 20, bottom = 40;
    double cols = g->n_nodes + 1 > 1 ? g->n_nodes + 1 : 2;
    double bytes = arena_bytes ? (double)arena_bytes : 1;
    double sx = (W - left - right) / cols, sy = (H - top - bottom) / bytes;
    mk_strbuf b = {0};
    mk_strbuf_put(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                      "font-family=\"monospace\" font-size=\"9\">\n", W, H);
    mk_strbuf_put(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f8f8f8\" "
                      "stroke=\"#999\"/>\n", left, top, W - left - right, H - top - bottom);
    mk_strbuf_put(&b, "<text x=\"%.1f\" y=\"18\" font-size=\"12\">arena: %zu bytes, live-bytes "
                      "lower bound %zu (%d nodes)</text>\n", left, arena_bytes, lower_bound,
                  g->n_nodes);
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        if (n->owner != n || n->storage != MK_STORAGE_ARENA || n->offset < 0) continue;
        double x0 = left + n->index * sx, x1 = left + (n->last_use + 1) * sx;
        double y0 = top + (double)n->offset * sy, h = (double)mk_node_bytes(n) * sy;
        unsigned hue = (unsigned)(n->id * 47) % 360;
        mk_strbuf_put(&b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                          "fill=\"hsl(%u,60%%,75%%)\" stroke=\"#333\" stroke-width=\"0.5\">"
                          "<title>$%d %s: %zu B at %lld, nodes %d to %d</title></rect>\n",
                      x0, y0, x1 - x0, h > 0.5 ? h : 0.5, hue, n->id, n->op->name,
                      mk_node_bytes(n), (long long)n->offset, n->index, n->last_use);
        if (h >= 9 && x1 - x0 >= 24)
            mk_strbuf_put(&b, "<text x=\"%.1f\" y=\"%.1f\">$%d</text>\n", x0 + 2, y0 + 9, n->id);
    }
    double yb = top + (double)lower_bound * sy;
    mk_strbuf_put(&b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c00\" "
                      "stroke-dasharray=\"4 3\"/>\n<text x=\"%.1f\" y=\"%.1f\" fill=\"#c00\">lower "
                      "bound</text>\n", left, yb, W - right, yb, W - right - 70, yb - 3);
    mk_strbuf_put(&b, "<text x=\"%.1f\" y=\"%.1f\">evaluation order →</text>\n"
                      "<text x=\"4\" y=\"%.1f\">offset ↓</text>\n</svg>\n",
                  left, H - 14, top + 10);
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
