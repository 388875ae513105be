/*
 * model.c — compile: the stages after parsing, in order.
 *
 *   parse → passes → plan (arena offsets) → allocate on the device → bind
 *   launches to final addresses → device prepare (CUDA: capture one graph,
 *   and the step loop's where the script has next lines)
 *
 * Then freeing, and what a compiled model says of itself (introspection).
 * Evaluation is run.c's; contexts and calls are context.c's.
 */
#include "model.h"
#include "codegen/codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- constants ----------------------------------------------------------------- */

/* data[i] for each constant leaf i; every name given exactly once. */
static int match_constants(const mk_graph *g, const mk_named_tensor *given, size_t n_given,
                           const void **data, mk_error **err) {
    for (size_t j = 0; j < n_given; j++) {
        if (!given[j].name || !given[j].data)
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "constant %zu has a NULL name or data", j);
        const mk_node *n = mk_graph_find_name(g, given[j].name);
        if (!n || n->op->leaf != MK_LEAF_CONSTANT)
            return mk_fail(err, MK_ERR_INPUT, 0, 0, "constant '%s' is not in the script",
                           given[j].name);
        if (data[n->index])
            return mk_fail(err, MK_ERR_INPUT, 0, 0, "constant '%s' is given twice",
                           given[j].name);
        data[n->index] = given[j].data;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        if (n->op->leaf == MK_LEAF_CONSTANT && !data[i])
            return mk_fail(err, MK_ERR_INPUT, n->line, n->column, "constant '%s' is not given",
                           n->name);
    }
    return 0;
}

/* ---- memory plan ------------------------------------------------------------------ */

static bool is_input(const mk_node *n) { return n->op->leaf == MK_LEAF_INPUT; }

/* A node runs a kernel unless it is a leaf or a view (in-place writes run one). */
static bool launches(const mk_node *n) {
    if (n->op->role == MK_ROLE_LEAF) return false;
    return n->storage != MK_STORAGE_VIEW || n->op->role == MK_ROLE_INPLACE;
}

/* Where a node's launch finds its arena memory besides its result's. */
typedef struct {
    int64_t scratch, state; /* offsets, or -1 */
    size_t state_bytes;
} launch_slot;

/*
 * Walks the evaluation order: an owner in the arena gets its offset at its own
 * step and is released after its last reader (through any of its views);
 * scratch (the op's, then the device's) lives for its node's step only. Inputs
 * take their slots first and keep them: they are written before the first
 * kernel runs; so does the state the device keeps per launch.
 */
static int plan_memory(mk_model *m, launch_slot *slot, mk_error **err) {
    mk_graph *g = m->graph;
    int n = g->n_nodes;
    int *head = malloc(sizeof *head * (size_t)(n + 1)); /* owners whose last reader is step i */
    int *link = malloc(sizeof *link * (size_t)n);
    mk_planner *p = mk_planner_new();
    size_t *device_scratch = NULL; /* [n] the device's scratch of each launch */
    int rc = -1;
    if (!head || !link || !p) {
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "planning memory");
        goto done;
    }
    double t0 = mk_now_ms();
    for (int i = 0; i < n; i++) g->nodes[i]->last_use = i;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < g->nodes[i]->n_in; k++) {
            mk_node *o = g->nodes[i]->in[k]->owner;
            if (o->last_use < i) o->last_use = i;
        }
    for (int o = 0; o < g->n_outputs; o++)
        g->outputs[o]->owner->last_use = n; /* read by the output copies */
    for (int i = 0; i <= n; i++) head[i] = -1;
    for (int i = 0; i < n; i++) {
        mk_node *o = g->nodes[i];
        if (o->owner == o && o->storage == MK_STORAGE_ARENA && !is_input(o)) {
            link[i] = head[o->last_use];
            head[o->last_use] = i;
        }
    }
    if (!(device_scratch = calloc((size_t)(n ? n : 1), sizeof *device_scratch))) goto nomem;
    for (int i = 0; i < n; i++) {
        mk_node *x = g->nodes[i];
        slot[i] = (launch_slot){.scratch = -1, .state = -1};
        if (is_input(x) && (x->offset = mk_planner_alloc(p, mk_node_bytes(x))) < 0) goto nomem;
    }
    for (int i = 0; i < n && m->dev->launch_memory; i++) {
        mk_node *x = g->nodes[i];
        if (!launches(x)) continue;
        m->dev->launch_memory(x, &device_scratch[i], &slot[i].state_bytes);
        if (slot[i].state_bytes && (slot[i].state = mk_planner_alloc(p, slot[i].state_bytes)) < 0)
            goto nomem;
    }
    for (int i = 0; i < n; i++) {
        mk_node *x = g->nodes[i];
        if (x->owner == x && x->storage == MK_STORAGE_ARENA && !is_input(x) &&
            (x->offset = mk_planner_alloc(p, mk_node_bytes(x))) < 0)
            goto nomem;
        x->scratch_bytes = (x->op->scratch ? x->op->scratch(x) : 0) + device_scratch[i];
        if (x->scratch_bytes) {
            if ((slot[i].scratch = mk_planner_alloc(p, x->scratch_bytes)) < 0) goto nomem;
            mk_planner_release(p, slot[i].scratch, x->scratch_bytes);
        }
        for (int k = head[i]; k >= 0; k = link[k])
            mk_planner_release(p, g->nodes[k]->offset, mk_node_bytes(g->nodes[k]));
    }
    m->stats.arena_bytes = mk_planner_arena_bytes(p);
    m->stats.lower_bound_bytes = mk_planner_peak_live(p);
    m->stats.device_bytes = m->dev->model_memory ? m->dev->model_memory(g) : 0;
    m->stats.plan_ms = mk_now_ms() - t0;
    rc = 0;
    goto done;
nomem:
    mk_fail(err, MK_ERR_NOMEM, 0, 0, "planning memory");
done:
    free(device_scratch);
    mk_planner_free(p);
    free(head);
    free(link);
    return rc;
}

/* ---- sharing ---------------------------------------------------------------------- */

/* A constant's bytes as the passes decided to hold them (n->upload): the
 * caller's dense row-major data, or a copy laid out by columns (a [k, n]
 * float32: product_rules.c's hold_by_columns), which *copy owns. NULL: no
 * memory, or (*err set) strides the decision does not explain. */
static const void *laid_out(const mk_node *n, const void *data, void **copy, mk_error **err) {
    int64_t dense[MK_MAX_RANK];
    mk_contiguous_strides(n->rank, n->shape, dense);
    *copy = NULL;
    switch (n->upload) {
    case MK_UPLOAD_AS_GIVEN:
        if (memcmp(dense, n->stride, sizeof dense[0] * (size_t)n->rank)) break;
        return data;
    case MK_UPLOAD_BY_COLUMNS: {
        int64_t rows = n->shape[0], cols = n->shape[1];
        if (n->rank != 2 || mk_dtype_size(n->dtype) != 4 || n->stride[0] != 1 ||
            n->stride[1] != rows)
            break;
        uint32_t *out = malloc(mk_node_bytes(n));
        if (!out) {
            mk_fail(err, MK_ERR_NOMEM, n->line, n->column, "laying out the constant '%s' by "
                    "columns", n->name);
            return NULL;
        }
        const uint32_t *in = data;
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) out[i + j * rows] = in[i * cols + j];
        return *copy = out;
    }
    }
    MK_INTERNAL(err, "the constant's strides are not those its upload says");
    return NULL;
}

static bool same_type(const mk_node *a, const mk_node *b) {
    return a->dtype == b->dtype && a->rank == b->rank &&
           !memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->rank);
}

/* The shared model's leaf whose memory leaf n uses in place, or NULL: a
 * buffer of n's name, a constant of its name, type, layout (weights held by
 * columns or not) and host data (unless constants are borrowed: then they
 * are the host's memory already). */
static const mk_node *shared_twin(const mk_model *m, const mk_node *n) {
    const mk_model *o = m->shared;
    bool buffer = n->storage == MK_STORAGE_BUFFER;
    if (!o || !n->name || !(buffer || (n->storage == MK_STORAGE_CONSTANT && !m->borrowed)))
        return NULL;
    const mk_node *x = mk_graph_find_name(o->graph, n->name);
    if (!x || x->op->leaf != n->op->leaf || !same_type(x, n) || !o->base[x->index]) return NULL;
    if (n->storage == MK_STORAGE_CONSTANT &&
        (!m->given[n->index] || o->given[x->index] != m->given[n->index] ||
         x->upload != n->upload))
        return NULL;
    return x;
}

/* A named buffer whose name the shared model gives a buffer of another type
 * is a mistake, not a new buffer. */
static int check_shared_buffers(const mk_model *m, mk_error **err) {
    for (int i = 0; m->shared && i < m->graph->n_nodes; i++) {
        const mk_node *n = m->graph->nodes[i];
        if (n->op->leaf != MK_LEAF_BUFFER || !n->name) continue;
        const mk_node *x = mk_graph_find_name(m->shared->graph, n->name);
        if (!x || (x->op->leaf == MK_LEAF_BUFFER && same_type(x, n))) continue;
        char here[96], there[96];
        mk_shape_str(n->rank, n->shape, here, sizeof here);
        mk_shape_str(x->rank, x->shape, there, sizeof there);
        return mk_fail(err, MK_ERR_INPUT, n->line, n->column,
                       "share: buffer '%s' is %s %s here, but the shared model's '%s' is %s %s %s",
                       n->name, mk_dtype_name(n->dtype), here, x->name,
                       x->op->leaf == MK_LEAF_BUFFER ? "a buffer" : "not a buffer: a",
                       mk_dtype_name(x->dtype), there);
    }
    return 0;
}

/* The model's device memory against opts->max_bytes, before any is allocated. */
static int check_budget(const mk_model *m, const mk_compile_options *opts, mk_error **err) {
    if (!opts->max_bytes) return 0;
    size_t constants = 0, buffers = 0;
    for (int i = 0; i < m->graph->n_nodes; i++) {
        const mk_node *n = m->graph->nodes[i];
        if (n->owner != n || shared_twin(m, n)) continue;
        if (n->storage == MK_STORAGE_CONSTANT && !m->borrowed) constants += mk_node_bytes(n);
        if (n->storage == MK_STORAGE_BUFFER) buffers += mk_node_bytes(n);
    }
    size_t arena = m->stats.arena_bytes, device = m->stats.device_bytes;
    size_t total = arena + constants + buffers + device;
    if (total <= opts->max_bytes) return 0;
    return mk_fail(err, MK_ERR_NOMEM, 0, 0,
                   "the model needs %zu bytes of %s memory (arena %zu, constants %zu, buffers "
                   "%zu, the device's own %zu), more than max_bytes %zu",
                   total, m->dev->name, arena, constants, buffers, device, opts->max_bytes);
}

/* ---- allocation and binding -------------------------------------------------------- */

/* A leaf's memory could not be had or filled: the error names the leaf. */
static int leaf_failed(const mk_node *n, mk_error **err) {
    char shape[96];
    mk_shape_str(n->rank, n->shape, shape, sizeof shape);
    return mk_fail_within(err, n->line, n->column, "%s%s%s%s %s %s", n->op->name,
                          n->name ? " '" : "", n->name ? n->name : "", n->name ? "'" : "",
                          mk_dtype_name(n->dtype), shape);
}

static int allocate(mk_model *m, const mk_host *host, mk_error **err) {
    mk_graph *g = m->graph;
    const void **const_data = m->given;
    int64_t upload_total = 0, uploaded = 0; /* constants' bytes that travel to the device */
    for (int i = 0; i < g->n_nodes && !m->borrowed; i++)
        if (g->nodes[i]->owner == g->nodes[i] && g->nodes[i]->storage == MK_STORAGE_CONSTANT &&
            !shared_twin(m, g->nodes[i]))
            upload_total += (int64_t)mk_node_bytes(g->nodes[i]);
    if (m->stats.arena_bytes &&
        !(m->arena = m->dev->alloc(m->dev_state, m->stats.arena_bytes, err)))
        return mk_fail_within(err, 0, 0, "the model's arena of intermediate values");
    for (int i = 0; i < g->n_nodes; i++) {
        mk_node *n = g->nodes[i];
        if (n->owner != n) continue;
        size_t bytes = mk_node_bytes(n);
        const mk_node *twin = shared_twin(m, n);
        if (twin) { /* the shared model's memory, as it is */
            m->base[i] = m->shared->base[twin->index];
            m->stats.shared_bytes += bytes;
            continue;
        }
        switch (n->storage) {
        case MK_STORAGE_ARENA:
            m->base[i] = (char *)m->arena + n->offset;
            break;
        case MK_STORAGE_CONSTANT:
            m->stats.constant_bytes += bytes;
            if (m->borrowed) {
                m->base[i] = (void *)const_data[i]; /* never written: in-place ops refuse it */
                break;
            }
            if (!(m->base[i] = m->dev->alloc(m->dev_state, bytes, err))) return leaf_failed(n, err);
            m->owns_alloc[i] = true;
            void *copy;
            const void *data = laid_out(n, const_data[i], &copy, err);
            if (!data) return -1;
            int status = m->dev->upload(m->dev_state, m->base[i], data, bytes, err);
            free(copy);
            if (status) return leaf_failed(n, err);
            uploaded += (int64_t)bytes;
            host->progress(host, MK_PHASE_UPLOAD, uploaded, upload_total);
            if (host->cancelled(host)) return mk_cancelled(err, "compile");
            break;
        case MK_STORAGE_BUFFER:
            m->stats.buffer_bytes += bytes;
            if (!(m->base[i] = m->dev->alloc(m->dev_state, bytes, err))) return leaf_failed(n, err);
            m->owns_alloc[i] = true;
            if (m->dev->zero(m->dev_state, m->base[i], bytes, err)) return leaf_failed(n, err);
            break;
        case MK_STORAGE_VIEW:
            return MK_INTERNAL(err, "a view owns memory");
        }
    }
    return 0;
}

static mk_tensor tensor_of(const mk_model *m, const mk_node *n) {
    mk_tensor t = {.data = (char *)m->base[n->owner->index] + n->view_offset,
                   .dtype = n->dtype,
                   .rank = n->rank};
    memcpy(t.shape, n->shape, sizeof t.shape);
    memcpy(t.stride, n->stride, sizeof t.stride);
    return t;
}

/* Does the device's kernel take every data operand's dtype and the result's? */
static int check_dtypes(const mk_model *m, const mk_node *n, const mk_kernel *k,
                        mk_error **err) {
    for (int i = -1; i < n->n_in; i++) {
        const mk_node *x = i < 0 ? n : n->in[i];
        if (i >= 0 && mk_op_operand_is_bound(n->op, i)) continue; /* int64 [1], read by all */
        if (!(k->dtypes & MK_DTYPE_BIT(x->dtype)))
            return mk_fail(err, MK_ERR_DTYPE, n->line, n->column, "%s is not supported by %s on %s",
                           mk_dtype_name(x->dtype), n->op->name, m->dev->name);
    }
    return 0;
}

int mk_launch_operands(mk_launch *l, mk_error **err) {
    const mk_node *n = l->node;
    const mk_pointwise_group *pw = mk_node_pointwise(n);
    if ((n->op->flags & MK_OP_BROADCAST) || pw) /* operands arrive broadcast to the result */
        for (int j = 0; j < n->n_in; j++) l->in[j] = mk_tensor_broadcast(&l->in[j], &l->out);
    if (n->op->kernel == MK_KERNEL_POINTWISE && !(l->expr = pw ? &pw->program : mk_op_program(n->op)))
        return MK_INTERNAL(err, "a pointwise row's expression does not compile");
    return 0;
}

static int bind(mk_model *m, const launch_slot *slot, mk_error **err) {
    mk_graph *g = m->graph;
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        const mk_op *op = n->op;
        if (!launches(n)) continue;
        const mk_kernel *k = &m->dev->kernels[op->kernel];
        if (op->kernel == MK_KERNEL_NONE || !k->fn)
            return mk_fail(err, MK_ERR_DEVICE, n->line, n->column, "%s has no %s kernel",
                           op->name, m->dev->name);
        if (check_dtypes(m, n, k, err)) return -1;
        mk_launch *l = &m->launches[m->n_launches];
        *l = (mk_launch){.node = n, .index = m->n_launches, .n_in = n->n_in,
                         .out = tensor_of(m, n), .dev = m->dev_state};
        m->n_launches++;
        for (int j = 0; j < n->n_in; j++) l->in[j] = tensor_of(m, n->in[j]);
        if (op->layout && op->role == MK_ROLE_MOVE) {
            /* a copy that is not a view reads its input through the view's layout */
            int64_t offset = op->layout(n, l->in[0].stride);
            l->in[0].data = (char *)l->in[0].data + offset;
            l->in[0].rank = n->rank;
            memcpy(l->in[0].shape, n->shape, sizeof n->shape);
        }
        if (mk_launch_operands(l, err)) return -1;
        if (n->scratch_bytes) {
            l->scratch = (char *)m->arena + slot[i].scratch;
            l->scratch_bytes = n->scratch_bytes;
        }
        if (slot[i].state_bytes) { /* zero once: its kernels find it as they left it */
            l->state = (char *)m->arena + slot[i].state;
            l->state_bytes = slot[i].state_bytes;
            if (m->dev->zero(m->dev_state, l->state, l->state_bytes, err)) return -1;
        }
    }
    return 0;
}

/* ---- compile ----------------------------------------------------------------------- */

#define MK_COMPILE_AGAIN_MAX 16

/* One compile; NULL with *again set (and no error) where the device's
 * prepare found cuDNN groups the passes must choose otherwise, which the
 * context now notes: the caller compiles again. */
static mk_model *compile(mk_host *host, mk_context *ctx, const char *script,
                         const mk_named_tensor *constants, size_t n_constants,
                         const mk_compile_options *options, bool *again, mk_error **err) {
    double t0 = mk_now_ms();
    mk_compile_options opts = options ? *options : (mk_compile_options){0};
    if (!ctx || !script || (n_constants && !constants)) {
        mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_compile: NULL context, script or constants");
        return NULL;
    }
    const mk_device_ops *dev = mk_device_for(&opts, err);
    if (!dev) return NULL;

    host->opts = &opts;
    enum { STAGES = 6 }; /* parse, passes, plan, memory, bind, device */
#define STAGE_DONE(k)                                                       \
    do {                                                                    \
        host->progress(host, MK_PHASE_COMPILE, (k), STAGES);                \
        if (host->cancelled(host)) {                                        \
            mk_cancelled(err, "compile");                                   \
            goto fail;                                                      \
        }                                                                   \
    } while (0)
    if (opts.share && opts.share->dev != dev) {
        mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "share: the model to share is compiled for %s, "
                "this one for %s", opts.share->dev->name, dev->name);
        return NULL;
    }
    mk_model *m = calloc(1, sizeof *m);
    launch_slot *slot = NULL;
    if (!m) goto nomem;
    atomic_init(&m->refs, 1);
    if ((m->shared = opts.share)) atomic_fetch_add(&m->shared->refs, 1);
    m->ctx = ctx;
    atomic_fetch_add(&ctx->refs, 1);
    m->dev = dev;
    m->borrowed = opts.borrow_constants && dev == &mk_cpu_device;
    m->stats.device = (int)opts.device;
    host->progress(host, MK_PHASE_COMPILE, 0, STAGES);
    if (!(m->graph = mk_graph_parse(script, err))) goto fail;
    STAGE_DONE(1);
    mk_graph *g = m->graph;
    if (opts.use_cudnn) {
        if (!(m->fusion = mk_fusion_new(&ctx->cudnn, &ctx->cudnn_notes, ctx->compiles)))
            goto nomem;
        g->fusion = m->fusion;
    }
    if (mk_passes_run(g, &opts, &dev->target, err)) goto fail;
    STAGE_DONE(2);

    int n = g->n_nodes;
    m->given = calloc((size_t)n, sizeof *m->given);
    slot = calloc((size_t)(n ? n : 1), sizeof *slot);
    m->base = calloc((size_t)n, sizeof *m->base);
    m->owns_alloc = calloc((size_t)n, sizeof *m->owns_alloc);
    m->launches = calloc((size_t)n, sizeof *m->launches);
    m->inputs = calloc((size_t)n, sizeof *m->inputs);
    m->input_slot = calloc((size_t)n, sizeof *m->input_slot);
    if (!m->given || !slot || !m->base || !m->owns_alloc || !m->launches ||
        !m->inputs || !m->input_slot)
        goto nomem;
    if (match_constants(g, constants, n_constants, m->given, err) ||
        check_shared_buffers(m, err))
        goto fail;
    if (plan_memory(m, slot, err)) goto fail;
    if (check_budget(m, &opts, err)) goto fail;
    STAGE_DONE(3);

    if (dev->open(&m->dev_state, err)) goto fail;
    if (allocate(m, host, err)) goto fail;
    STAGE_DONE(4);
    if (bind(m, slot, err)) goto fail;
    STAGE_DONE(5);

    for (int i = 0; i < n; i++) {
        m->input_slot[i] = is_input(g->nodes[i]) ? m->n_inputs : -1;
        if (is_input(g->nodes[i])) m->inputs[m->n_inputs++] = g->nodes[i];
    }
    m->in_copies = calloc((size_t)(m->n_inputs ? m->n_inputs : 1), sizeof *m->in_copies);
    if (!m->in_copies) goto nomem;
    for (int k = 0; k < m->n_inputs; k++)
        m->in_copies[k] = (mk_copy){.device = m->base[m->inputs[k]->index],
                                    .bytes = mk_node_bytes(m->inputs[k])};
    m->n_outputs = g->n_outputs;
    m->out_copies = calloc((size_t)g->n_outputs, sizeof *m->out_copies);
    size_t counted = 0;
    for (int i = 0; i < g->n_next; i++)
        if (g->next[i].output < 0) counted += mk_node_bytes(g->next[i].input);
    m->counters = malloc(counted ? counted : 1);
    if (!m->out_copies || !m->counters) goto nomem;
    for (int o = 0; o < g->n_outputs; o++)
        m->out_copies[o] = (mk_copy){.device = tensor_of(m, g->outputs[o]).data,
                                     .bytes = mk_node_bytes(g->outputs[o])};
    mk_step_rule rules[MK_MAX_INPUTS];
    for (int i = 0; i < g->n_next; i++)
        rules[i] = (mk_step_rule){.input = m->input_slot[g->next[i].input->index],
                                  .output = g->next[i].output, .add = g->next[i].add};
    int prepared = dev->prepare(m->dev_state, m->launches, m->n_launches, m->in_copies,
                                m->n_inputs, m->out_copies, m->n_outputs, rules, g->n_next, host,
                                err);
    if (prepared < 0) goto fail;
    if (prepared > 0) { /* cuDNN refused groups, or their plans need more workspace */
        int learned = mk_fusion_learn(m->fusion);
        if (learned < 0) goto nomem;
        if (!learned) {
            MK_INTERNAL(err, "the device asked to compile again, finding nothing new");
            goto fail;
        }
        host->log(host, MK_LOG_INFO, "cuDNN: %d group%s to choose again: compiling again",
                  learned, learned == 1 ? "" : "s");
        *again = true;
        goto fail;
    }
    if (m->fusion) mk_fusion_prepared(m->fusion, g);
    STAGE_DONE(6);
#undef STAGE_DONE
    if (!(m->script = mk_graph_print(g))) goto nomem;
    mk_strbuf report = {0};
    int groups[MK_GROUP_KINDS] = {0};
    mk_group_report(g, &report, groups);
    mk_product_report(g, &m->dev->target, &report);
    m->stats.pointwise_groups = groups[MK_GROUP_POINTWISE];
    m->stats.product_groups = groups[MK_GROUP_PRODUCT];
    if (m->fusion && m->fusion->report.s) mk_strbuf_put(&report, "%s", m->fusion->report.s);
    if (report.failed) {
        free(report.s);
        goto nomem;
    }
    m->report = report.s;

    m->stats.nodes = n;
    m->stats.launches = m->n_launches;
    if (m->fusion) {
        m->stats.fused_groups = m->fusion->fused;
        m->stats.cudnn_cache_hits = m->fusion->cache_hits;
        m->stats.cudnn_rejected = m->fusion->rejected;
        m->stats.cudnn_tf32_groups = m->fusion->tf32;
    }
    m->stats.compile_ms = mk_now_ms() - t0;
    host->log(host, MK_LOG_INFO,
             "compiled for %s in %.1f ms: %d nodes, %d launches (%d pointwise, %d matrix-vector "
             "groups), arena %zu bytes",
             dev->name, m->stats.compile_ms, n, m->n_launches, m->stats.pointwise_groups,
             m->stats.product_groups, m->stats.arena_bytes);
    if (m->fusion && m->fusion->rejected)
        host->log(host, MK_LOG_WARNING,
                 "cuDNN rejected %d group%s: they run on the plain kernels (the fusion report "
                 "says why)", m->fusion->rejected, m->fusion->rejected == 1 ? "" : "s");
    free(slot);
    return m;
nomem:
    mk_fail(err, MK_ERR_NOMEM, 0, 0, "compiling the model");
fail:
    free(slot);
    mk_model_free(m);
    return NULL;
}

MK_API mk_model *mk_compile(mk_context *ctx, const char *script,
                            const mk_named_tensor *constants, size_t n_constants,
                            const mk_compile_options *options, mk_error **err) {
    bool cuda = options && options->device == MK_DEVICE_CUDA;
    mk_call c;
    mk_call_begin(&c, ctx);
    mk_cuda_setup_lock(cuda);
    /* Each compile again notes one more cuDNN group at least: a few suffice. */
    mk_model *m = NULL;
    bool again = true;
    if (cuda && ctx) ctx->compiles++;
    for (int k = 0; !m && again; k++) {
        again = false;
        if (k == MK_COMPILE_AGAIN_MAX) {
            mk_fail(err, MK_ERR_INTERNAL, 0, 0, "cuDNN: still choosing groups after %d compiles",
                    k);
            break;
        }
        m = compile(&c.host, ctx, script, constants, n_constants, options, &again, err);
    }
    mk_cuda_setup_unlock(cuda);
    mk_call_end(&c);
    return m;
}

static void model_free(mk_model *m) {
    if (!m || atomic_fetch_sub(&m->refs, 1) > 1) return; /* a sharing model still needs it */
    if (m->graph && m->base && m->owns_alloc)
        for (int i = 0; i < m->graph->n_nodes; i++)
            if (m->owns_alloc[i]) m->dev->free(m->dev_state, m->base[i]);
    if (m->arena) m->dev->free(m->dev_state, m->arena);
    if (m->dev_state) m->dev->close(m->dev_state);
    mk_fusion_free(m->fusion); /* after close: the captured graph no longer needs the groups */
    mk_graph_free(m->graph);
    free(m->base);
    free(m->owns_alloc);
    free(m->launches);
    free(m->inputs);
    free(m->input_slot);
    free(m->in_copies);
    free(m->out_copies);
    free(m->counters);
    free(m->given);
    free(m->script);
    free(m->report);
    mk_context_release(m->ctx);
    mk_model *shared = m->shared;
    free(m);
    model_free(shared); /* under the lock mk_model_free took: both are on one device */
}

MK_API void mk_model_free(mk_model *m) {
    bool cuda = m && m->dev && m->dev != &mk_cpu_device;
    mk_cuda_setup_lock(cuda);
    model_free(m);
    mk_cuda_setup_unlock(cuda);
}

/* ---- introspection --------------------------------------------------------------------- */

static void info_of(const mk_node *n, mk_tensor_info *out) {
    *out = (mk_tensor_info){.name = n->name, .dtype = n->dtype, .rank = n->rank};
    memcpy(out->shape, n->shape, sizeof out->shape);
}

MK_API size_t mk_model_input_count(const mk_model *m) { return m ? (size_t)m->n_inputs : 0; }

MK_API int mk_model_input_info(const mk_model *m, size_t i, mk_tensor_info *out) {
    if (!m || !out || i >= (size_t)m->n_inputs) return -1;
    info_of(m->inputs[i], out);
    return 0;
}

MK_API int mk_model_output_info(const mk_model *m, mk_tensor_info *out) {
    return mk_model_output_info_at(m, 0, out);
}

MK_API size_t mk_model_output_count(const mk_model *m) { return m ? (size_t)m->n_outputs : 0; }

MK_API int mk_model_output_info_at(const mk_model *m, size_t i, mk_tensor_info *out) {
    if (!m || !out || i >= (size_t)m->n_outputs) return -1;
    info_of(m->graph->outputs[i], out);
    out->name = NULL;
    return 0;
}

MK_API size_t mk_model_next_count(const mk_model *m) { return m ? (size_t)m->graph->n_next : 0; }

MK_API int mk_model_next_info(const mk_model *m, size_t i, size_t *input, int *output,
                              int64_t *add) {
    if (!m || !input || !output || !add || i >= (size_t)m->graph->n_next) return -1;
    const mk_recurrence *r = &m->graph->next[i];
    *input = (size_t)m->input_slot[r->input->index];
    *output = r->output;
    *add = r->output < 0 ? r->add : 0;
    return 0;
}

MK_API const char *mk_model_script(const mk_model *m) { return m ? m->script : NULL; }

int mk_model_check_generated(const mk_model *m, int arch, mk_error **err) {
    char why[256];
    const mk_cuda_plugin *p = mk_cuda_plugin_get(why, sizeof why);
    if (!p) return mk_fail(err, MK_ERR_NO_DEVICE, 0, 0, "%s", why);
    int checked = 0;
    for (int i = 0; i < m->n_launches; i++) {
        const mk_node *n = m->launches[i].node;
        if (!mk_node_generated(n)) continue;
        const mk_product_group *pg = mk_node_product(n);
        /* groups CUDA does not form: weights read by rows, causal attention */
        bool rows = pg && pg->kind == MK_PRODUCT_ATTENTION && pg->att.causal;
        for (int j = 0; pg && j < pg->n_products; j++) rows = rows || pg->b_rows[j];
        if (rows) continue;
        if (p->generate_check(&m->launches[i], arch, err)) return -1;
        checked++;
    }
    return checked;
}

MK_API char *mk_model_dot(const mk_model *m) { return m ? mk_graph_dot(m->graph) : NULL; }

MK_API char *mk_model_kernel_source(const mk_model *m, int launch, mk_error **err) {
    if (!m) {
        mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_model_kernel_source: NULL model");
        return NULL;
    }
    if (launch < 0 || launch >= m->n_launches) {
        mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "launch %d is out of range: the model has %d (0 to %d)",
                launch, m->n_launches, m->n_launches - 1);
        return NULL;
    }
    const mk_launch *l = &m->launches[launch];
    if (!mk_node_generated(l->node)) {
        mk_fail(err, MK_ERR_ARGUMENT, l->node->line, l->node->column,
                "launch %d runs %s $%d with a library kernel: no generated source", launch,
                l->node->op->name, l->node->id);
        return NULL;
    }
    /* written by the core's generator, as the CUDA plugin compiles it (stamped
     * where MK_CUDA_TIMELINE is set): no plugin, no GPU needed */
    const char *timeline = getenv("MK_CUDA_TIMELINE");
    return mk_codegen_source(l, timeline && *timeline, 0, err);
}

MK_API char *mk_model_memory_svg(const mk_model *m) {
    return m ? mk_graph_memory_svg(m->graph, m->stats.arena_bytes, m->stats.lower_bound_bytes)
             : NULL;
}

MK_API const char *mk_model_fusion_report(const mk_model *m) {
    return m && m->report ? m->report : "";
}

MK_API int mk_model_stats(const mk_model *m, mk_stats *out) {
    if (!m || !out) return -1;
    *out = m->stats;
    return 0;
}
