/*
 * group_conv.c — the convolution-group pass: a convolution (Conv1dNode,
 * Conv2dNode) with the nodes that finish its result becomes one node
 * (ConvGroupNode), which the device runs as the convolution and an epilogue
 * applied before the result leaves the cache (the CPU: oneDNN's post-ops, or
 * a loop after im2col's product; core/cpu/conv_group.c):
 *
 *     relu( batch_norm( conv(x, w) + bias ) + residual )
 *
 * each stage optional, in that order, as nn.conv2d, nn.batch_norm, a ReLU
 * and a residual block write them (a ReLU may also end the chain before a
 * residual). A batch norm joins only where its mean, var, weight, bias and
 * eps, the weights and the conv's bias are all constants: the device then
 * folds it into the weights and bias once, at prepare, in double precision
 *     w' = w · γ / sqrt(var + eps),  b' = (bias − mean) · γ / sqrt(var + eps) + β
 * and it costs nothing per run. A batch norm with a run-time operand stays
 * its own node (the chain ends before it).
 *
 * A stage joins where it is the only reader of the chain so far (which is
 * not an output, owns its arena memory, and has no in-place write between),
 * and is float32 of the convolution's shape: the bias a SumNode with an
 * operand of O values along axis 1 ([O, 1, 1], [1, O, 1, 1]...), the residual
 * a SumNode with a dense operand of the result's own shape. The last stage
 * becomes the group node, so every operand (a residual computed after the
 * convolution too) is ready. Runs before the pointwise pass, on devices
 * whose target has conv_groups (the CPU); elsewhere (CUDA) the nodes stay as
 * they are.
 */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

static bool is_op(const mk_node *n, const char *name) { return !strcmp(n->op->name, name); }

static bool same_shape(const mk_node *a, const mk_node *b) {
    return a->rank == b->rank && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->rank);
}

static bool dense(const mk_node *n) {
    int64_t s[MK_MAX_RANK];
    mk_contiguous_strides(n->rank, n->shape, s);
    return !memcmp(s, n->stride, sizeof(int64_t) * (size_t)n->rank);
}

static bool constant(const mk_node *n) {
    return n->owner && n->owner->storage == MK_STORAGE_CONSTANT;
}

/* The one node that reads `cur`, if cur may hand its value on inside a group
 * (and the reader is in no group yet). */
static mk_node *only_reader(const mk_graph *g, const bool *gone, const mk_node *cur) {
    if (cur->n_consumers != 1 || mk_is_output(g, cur) || cur->owner != cur ||
        cur->storage != MK_STORAGE_ARENA)
        return NULL;
    for (int i = cur->index + 1; i < g->n_nodes; i++) {
        mk_node *n = g->nodes[i];
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == cur) return n->group || gone[i] ? NULL : n;
        if (n->op->role == MK_ROLE_INPLACE) return NULL; /* a write between */
    }
    return NULL;
}

/* The operand of SumNode s other than cur, or NULL (s reads cur twice). */
static mk_node *other(const mk_node *s, const mk_node *cur) {
    if (s->in[0] == cur && s->in[1] != cur) return s->in[1];
    if (s->in[1] == cur && s->in[0] != cur) return s->in[0];
    return NULL;
}

/* b holds O values along the result's axis 1, read as they lie (dense). */
static bool channel_vector(const mk_node *b, const mk_node *conv) {
    int64_t o = conv->shape[1];
    if (b->dtype != MK_DTYPE_FLOAT32 || mk_node_numel(b) != o || !dense(b)) return false;
    if (b->rank > conv->rank || b->rank < conv->rank - 1) return false;
    /* aligned right against [N, O, ...]: O at axis rank - conv->rank + 1 */
    int axis = b->rank - conv->rank + 1;
    return b->shape[axis] == o;
}

static void describe_conv(const mk_node *n, bool brief, mk_strbuf *b) {
    const mk_conv_group *cg = mk_node_conv(n);
    const char *parts[4] = {cg->bias >= 0 ? "bias" : NULL, cg->bn >= 0 ? "batch norm folded" : NULL,
                            cg->residual >= 0 ? "residual add" : NULL, cg->relu ? "relu" : NULL};
    mk_strbuf_put(b, "%s%s", cg->conv->op->name, brief ? "" : " with an epilogue of");
    const char *sep = brief ? " + " : " ";
    for (int i = 0; i < 4; i++)
        if (parts[i]) {
            mk_strbuf_put(b, "%s%s", sep, parts[i]);
            sep = brief ? " + " : ", ";
        }
    if (!brief) {
        mk_strbuf_put(b, " for");
        mk_group_put_members(n, b);
    }
}

static const mk_group_class conv_class = {MK_GROUP_CONV, "conv", describe_conv, free};

typedef struct {
    mk_node *conv, *bias_add, *bn, *relu, *res_add, *last;
    mk_node *bias, *residual;
} chain;

/* The stages after c that join it (chain.last is c where none does). */
static chain follow(const mk_graph *g, const bool *gone, mk_node *c) {
    chain ch = {.conv = c, .last = c};
    mk_node *n = only_reader(g, gone, c);
    mk_node *v;
    if (n && is_op(n, "SumNode") && (v = other(n, c)) && channel_vector(v, c) &&
        same_shape(n, c)) {
        ch.bias_add = n, ch.bias = v, ch.last = n;
        n = only_reader(g, gone, n);
    }
    if (n && is_op(n, "BatchNormNode") && n->in[0] == ch.last && constant(c->in[1]) &&
        (!ch.bias || constant(ch.bias))) {
        bool all = true;
        for (int k = 1; k <= 5; k++) all = all && constant(n->in[k]) && dense(n->in[k]);
        if (all) {
            ch.bn = n, ch.last = n;
            n = only_reader(g, gone, n);
        }
    }
    if (n && is_op(n, "SumNode") && (v = other(n, ch.last)) && same_shape(v, c) &&
        same_shape(n, c) && v->dtype == MK_DTYPE_FLOAT32 && dense(v)) {
        ch.res_add = n, ch.residual = v, ch.last = n;
        n = only_reader(g, gone, n);
    }
    if (n && is_op(n, "ReLUNode")) ch.relu = n, ch.last = n;
    return ch;
}

static int make_group(chain *ch, bool *gone, mk_error **err) {
    mk_conv_group *cg = calloc(1, sizeof *cg);
    if (!cg) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping convolutions");
    mk_node *in[MK_MAX_INPUTS];
    int n_in = 0;
    in[n_in++] = ch->conv->in[0];
    in[n_in++] = ch->conv->in[1];
    cg->conv = ch->conv;
    cg->bias = cg->bn = cg->residual = -1;
    if (ch->bias) cg->bias = n_in, in[n_in++] = ch->bias;
    if (ch->bn) {
        cg->bn = n_in;
        for (int k = 1; k <= 5; k++) in[n_in++] = ch->bn->in[k];
    }
    if (ch->residual) cg->residual = n_in, in[n_in++] = ch->residual;
    cg->relu = ch->relu != NULL;
    cg->constant_weights = constant(ch->conv->in[1]) && (!ch->bias || constant(ch->bias));

    mk_node *root = ch->last;
    const mk_op *root_op = root->op;
    if (mk_group_attach(root, &conv_class, cg, err)) return -1;
    mk_group *grp = root->group;
    grp->root_op = root_op;
    grp->scratch_bytes = mk_conv_scratch(ch->conv);
    mk_node *members[5] = {ch->conv, ch->bias_add, ch->bn, ch->res_add, ch->relu};
    for (int i = 0; i < 5; i++)
        if (members[i] && members[i] != root) {
            grp->members[grp->n_members++] = members[i];
            gone[members[i]->index] = true;
        }
    root->op = mk_op_internal(MK_KERNEL_CONV_GROUP);
    root->n_in = n_in;
    memcpy(root->in, in, sizeof in[0] * (size_t)n_in);
    root->n_attr = 0;
    return 0;
}

int mk_conv_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                 mk_error **err) {
    if (opts->no_passes || opts->no_fusion || !t->conv_groups || g->n_nodes == 0) return 0;
    bool *gone = calloc((size_t)g->n_nodes, sizeof *gone);
    if (!gone) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "grouping convolutions");
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *c = g->nodes[i];
        if (gone[i] || c->op->kernel != MK_KERNEL_CONV || c->group) continue;
        chain ch = follow(g, gone, c);
        if (ch.last == c) continue;
        if (make_group(&ch, gone, err)) {
            free(gone);
            return -1;
        }
    }
    mk_group_leave(g, gone);
    free(gone);
    return 0;
}
