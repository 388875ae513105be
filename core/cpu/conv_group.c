/*
 * conv_group.c — the CPU's convolution launches (CONV and CONV_GROUP): their
 * plans, made once at prepare, and their runs.
 *
 * A plan holds what does not change between runs. For a group with a batch
 * norm (group_conv.c: its operands are all constants then), the weights and
 * bias with it folded in, computed in double precision:
 *     s = γ / sqrt(var + eps),  w' = w · s,  b' = (bias − mean) · s + β
 * (one float rounding each, against the nodes' several per element). And,
 * where oneDNN is open and takes the shape (conv_dnnl.c), its convolution
 * with the group's bias, residual sum and ReLU as its own bias and post-ops,
 * constant weights laid out in its blocked layout there, once. Otherwise the
 * launch runs on im2col and sgemm with the epilogue as a loop over each
 * image's result (conv.c). A 3x3 window of stride 1 runs on Winograd's
 * F(2x2, 3x3) instead where its rule says (winograd.c: its weights
 * transformed here, once, the epilogue in its last transform).
 * $MK_CPU_CONV=im2col keeps every launch on im2col; =dnnl on oneDNN (no
 * Winograd); =winograd puts every launch Winograd computes on it; unset:
 * the rule. Then which results stay in oneDNN's layout between
 * convolutions (chain): a Winograd launch reads and writes NCHW, so it is
 * no oneDNN reader (readers_take) and hands nothing on. A constant's data
 * is read here, once: a tensor changed after compile (t:set on a borrowed
 * constant) is not seen by a convolution's weights.
 */
#include "cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The convolution of launch l: its geometry and epilogue. */
static mk_cpu_conv_spec spec_of(const mk_launch *l) {
    const mk_conv_group *cg = mk_node_conv(l->node);
    if (!cg)
        return (mk_cpu_conv_spec){.g = mk_conv_geom_of(l->node)};
    return (mk_cpu_conv_spec){.g = mk_conv_geom_of(cg->conv),
                              .bias = cg->bias >= 0 || cg->bn >= 0,
                              .residual = cg->residual >= 0,
                              .relu = cg->relu};
}

static bool constant_operand(const mk_launch *l, int k) {
    const mk_node *x = l->node->in[k];
    return x->owner && x->owner->storage == MK_STORAGE_CONSTANT;
}

/* A [C] or [1] parameter's element c. */
static double param(const mk_tensor *t, int64_t c) {
    return ((const float *)t->data)[mk_tensor_numel(t) == 1 ? 0 : c];
}

/* The batch norm folded into the weights and bias (plan->w, plan->bias). */
static int fold(const mk_launch *l, const mk_conv_group *cg, const mk_conv_geom *g,
                mk_cpu_conv_plan *p) {
    int64_t per = mk_tensor_numel(&l->in[1]) / g->o; /* weights of one output channel */
    p->w = malloc(sizeof(float) * (size_t)(per * g->o));
    p->bias = malloc(sizeof(float) * (size_t)g->o);
    if (!p->w || !p->bias) return -1;
    const float *w = l->in[1].data;
    const mk_tensor *bn = &l->in[cg->bn];
    double eps = param(&bn[4], 0);
    for (int64_t o = 0; o < g->o; o++) {
        double s = param(&bn[2], o) / sqrt(param(&bn[1], o) + eps);
        double b = cg->bias >= 0 ? ((const float *)l->in[cg->bias].data)[o] : 0.0;
        p->bias[o] = (float)((b - param(&bn[0], o)) * s + param(&bn[3], o));
        for (int64_t j = 0; j < per; j++) p->w[o * per + j] = (float)(w[o * per + j] * s);
    }
    return 0;
}

/* Whether launch l's result overlaps [p, p + bytes). */
static bool overlaps(const mk_launch *l, const void *p, size_t bytes) {
    const char *o = l->out.data, *q = p;
    size_t ob = (size_t)mk_tensor_numel(&l->out) * sizeof(float);
    return q < o + ob && o < q + bytes;
}

enum { MAX_READERS = 16 };

/* The readers of a launch's result that take it in channel blocks. */
typedef struct {
    int n, launch[MAX_READERS];
    mk_cpu_dnnl_chain as[MAX_READERS]; /* SRC (x), RESIDUAL; DST: a max pool */
} readers;

static bool is_pool(const mk_launch *l) {
    return l->node->op->kernel == MK_KERNEL_MAX_POOL && l->node->rank == 4;
}

/* Whether every reader of launch i's result takes it in channel blocks of
 * b, into *r: a oneDNN convolution whose x or residual is laid out so, or
 * (depth > 0) a max pool whose own readers all take its result so; and
 * whether they are all that read its memory (the planner's last_use: an
 * output's lies past every launch). */
static bool readers_take(const cpu_state *s, const mk_launch *launches, int n, int i, int b,
                         int depth, readers *r) {
    const mk_node *node = launches[i].node;
    int last = -1;
    r->n = 0;
    if (b == 0 || node->rank != 4 || node->shape[1] % b || node->owner != node) return false;
    for (int j = i + 1; j < n; j++) {
        const mk_launch *l = &launches[j];
        for (int k = 0; k < l->node->n_in; k++) {
            const mk_node *x = l->node->in[k];
            if (x != node && x->owner != node) continue;
            const mk_conv_group *cg = mk_node_conv(l->node);
            const mk_cpu_dnnl_conv *c = s->conv[j].dnnl;
            mk_cpu_dnnl_chain as = cg && k == cg->residual ? MK_CPU_DNNL_RESIDUAL
                                   : c                     ? MK_CPU_DNNL_SRC
                                                           : MK_CPU_DNNL_DST;
            readers inner;
            bool takes = x == node && r->n < MAX_READERS &&
                         (c ? (k == 0 || as == MK_CPU_DNNL_RESIDUAL) &&
                                  mk_cpu_dnnl_conv_block(c, as) == b
                            : depth > 0 && k == 0 && is_pool(l) &&
                                  readers_take(s, launches, n, j, b, depth - 1, &inner));
            if (!takes) return false;
            r->launch[r->n] = j, r->as[r->n++] = as;
            if (l->node->index > last) last = l->node->index;
        }
    }
    return r->n > 0 && node->last_use == last;
}

/* Marks launch i's readers r as taking its result in blocks of b (a max
 * pool's readers, in turn, its result): 0, or -1 out of memory. */
static int hand_on(cpu_state *s, const mk_launch *launches, int n, const readers *r, int b,
                   bool *res_blocked) {
    for (int q = 0; q < r->n; q++) {
        int j = r->launch[q];
        if (r->as[q] != MK_CPU_DNNL_DST) {
            if (mk_cpu_dnnl_conv_chain(s->conv[j].dnnl, r->as[q])) return -1;
            if (r->as[q] == MK_CPU_DNNL_RESIDUAL) res_blocked[j] = true;
            continue;
        }
        readers next;
        s->conv[j].block = b;
        readers_take(s, launches, n, j, b, 0, &next);
        if (hand_on(s, launches, n, &next, b, res_blocked)) return -1;
    }
    return 0;
}

/* Consecutive convolutions hand their results on in oneDNN's blocked layout
 * (a max pool between them working in it too): a launch's result skips the
 * reorder to NCHW and back where every reader takes it so (readers_take). A
 * launch whose residual arrives as NCHW in its own result's memory (the
 * arena's in-place reuse) keeps reordering out, through oneDNN's buffer. */
static int chain(cpu_state *s, const mk_launch *launches, int n, const mk_host *host) {
    int kept = 0;
    bool *res_blocked = calloc((size_t)n + 1, sizeof *res_blocked);
    if (!res_blocked) return -1;
    for (int i = 0; s->conv && i < n; i++) {
        const mk_launch *l = &launches[i];
        const mk_conv_group *cg = mk_node_conv(l->node);
        mk_cpu_dnnl_conv *c = s->conv[i].dnnl;
        if (!c) continue;
        if (cg && cg->residual >= 0 && !res_blocked[i] &&
            overlaps(l, l->in[cg->residual].data,
                     (size_t)mk_tensor_numel(&l->in[cg->residual]) * sizeof(float)))
            continue;
        int b = mk_cpu_dnnl_conv_block(c, MK_CPU_DNNL_DST);
        readers r;
        if (!readers_take(s, launches, n, i, b, 1, &r)) continue;
        if (mk_cpu_dnnl_conv_chain(c, MK_CPU_DNNL_DST) ||
            hand_on(s, launches, n, &r, b, res_blocked)) {
            free(res_blocked);
            return -1;
        }
        kept++;
    }
    free(res_blocked);
    if (kept)
        host->log(host, MK_LOG_INFO,
                  "cpu: %d convolution results stay in oneDNN's layout for their readers", kept);
    return 0;
}

/* Whether a launch of geometry g runs on Winograd's F(2x2, 3x3) rather than
 * oneDNN's direct convolution: where it computes the shape (winograd.c) and,
 * unless forced ($MK_CPU_CONV=winograd), where winograd.c's
 * mk_cpu_wino_pays takes it. */
static bool wino_chosen(const mk_conv_geom *g, bool forced) {
    if (!mk_cpu_wino_takes(g)) return false;
    return forced || mk_cpu_wino_pays(g);
}

int mk_cpu_conv_prepare(cpu_state *s, const mk_launch *launches, int n, const mk_host *host) {
    const char *path = getenv("MK_CPU_CONV");
    bool dnnl = !path || strcmp(path, "im2col");
    bool wino_forced = path && !strcmp(path, "winograd"), direct = path && !strcmp(path, "dnnl");
    for (int i = 0; i < n; i++) {
        const mk_launch *l = &launches[i];
        int kernel = l->node->op->kernel;
        if (kernel != MK_KERNEL_CONV && kernel != MK_KERNEL_CONV_GROUP) continue;
        if (!s->conv && !(s->conv = calloc((size_t)n, sizeof *s->conv))) return -1;
        mk_cpu_conv_plan *p = &s->conv[i];
        mk_cpu_conv_spec sp = spec_of(l);
        const mk_conv_group *cg = mk_node_conv(l->node);
        if (cg && cg->bn >= 0 && fold(l, cg, &sp.g, p)) return -1;
        if (!dnnl) continue;
        bool once = cg ? cg->constant_weights : constant_operand(l, 1);
        sp.weights_once = !once ? NULL : p->w ? p->w : l->in[1].data;
        if (!direct && l->in[0].dtype == MK_DTYPE_FLOAT32 && wino_chosen(&sp.g, wino_forced)) {
            int threads = s->threads ? s->threads[i] : mk_cpu_online;
            if (!(p->wino = mk_cpu_wino_make(&sp.g, sp.weights_once, threads))) return -1;
            host->log(host, MK_LOG_INFO, "cpu: %s $%d runs on Winograd F(2x2, 3x3)",
                      l->node->op->name, l->node->id);
            continue;
        }
        char why[256] = "";
        /* oneDNN fixes a primitive's thread count when it makes it: the launch's */
        int outer = mk_cpu_launch_threads;
        mk_cpu_launch_threads = s->threads[i];
        p->dnnl = mk_cpu_dnnl_conv_make(&sp, l->node, why, sizeof why);
        mk_cpu_launch_threads = outer;
        if (!p->dnnl)
            host->log(host, MK_LOG_INFO, "cpu: %s $%d runs on im2col and sgemm: %s",
                      l->node->op->name, l->node->id, why);
    }
    return chain(s, launches, n, host);
}

void mk_cpu_conv_free(cpu_state *s) {
    for (int i = 0; s->conv && i < s->n; i++) {
        mk_cpu_dnnl_conv_free(s->conv[i].dnnl);
        mk_cpu_wino_free(s->conv[i].wino);
        free(s->conv[i].w);
        free(s->conv[i].bias);
    }
    free(s->conv);
    s->conv = NULL;
}

static int run(const mk_launch *l, mk_error **err) {
    const cpu_state *s = l->dev;
    const mk_cpu_conv_plan *p = s && s->conv ? &s->conv[l->index] : NULL;
    const mk_conv_group *cg = mk_node_conv(l->node);
    mk_cpu_conv_spec sp = spec_of(l);
    mk_cpu_conv_args a = {.x = l->in[0].data, .w = l->in[1].data, .out = l->out.data,
                          .out_bytes = (size_t)mk_tensor_numel(&l->out) * sizeof(float)};
    if (cg && cg->bias >= 0) a.bias = l->in[cg->bias].data;
    if (cg && cg->residual >= 0) a.residual = l->in[cg->residual].data;
    if (p && p->w) a.w = p->w, a.bias = p->bias;
    if (cg && cg->bn >= 0 && !(p && p->w))
        return MK_INTERNAL(err, "a convolution group's batch norm was not folded");
    if (p && p->dnnl) return mk_cpu_dnnl_conv_run(p->dnnl, &a, l->node, err);
    if (p && p->wino) {
        mk_cpu_wino_run(p->wino, &sp.g, &a, sp.relu);
        return 0;
    }
    mk_cpu_conv_im2col(&sp.g, &a, sp.relu, l->scratch);
    return 0;
}

int mk_cpu_conv(const mk_launch *l, mk_error **err) { return run(l, err); }

/* group_conv.c's record: the convolution, then + bias (the batch norm
 * folded in), + residual, ReLU. */
int mk_cpu_conv_group(const mk_launch *l, mk_error **err) {
    if (!mk_node_conv(l->node)) return MK_INTERNAL(err, "a convolution group without its record");
    return run(l, err);
}
