/*
 * run.c — evaluation: one call on a model at a time (a busy error for a
 * second), inputs copied in, the bound launches run, outputs copied out, and
 * a recurrence's steps, in the device's own loop or as evaluations here. It
 * allocates nothing.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

/* ---- one call on a model at a time ------------------------------------------------------ */

/*
 * Claims m, and each model whose memory it uses in place (share), for one call
 * that writes their memory. Another such call while it is in flight (a host
 * function of this call running or resetting m, another thread) fails with
 * MK_ERR_BUSY and changes nothing: it would rebind the input and output slots
 * under the running launches. The call holds a reference too, so mk_model_free
 * from one of its host functions frees the model when the call returns.
 */
static int model_claim(mk_model *m, const char *fn, mk_error **err) {
    for (mk_model *x = m; x; x = x->shared) {
        if (!atomic_exchange(&x->busy, true)) continue;
        for (mk_model *y = m; y != x; y = y->shared) atomic_store(&y->busy, false);
        return mk_fail(err, MK_ERR_BUSY, 0, 0,
                       "%s: %s is running (a host function of that call, or another thread, "
                       "may not run or reset it until the call returns)", fn,
                       x == m ? "the model" : "a model whose memory it shares");
    }
    atomic_fetch_add(&m->refs, 1);
    return 0;
}

static void model_unclaim(mk_model *m) {
    for (mk_model *x = m; x; x = x->shared) atomic_store(&x->busy, false);
    if (atomic_fetch_sub(&m->refs, 1) > 1) return;
    atomic_store(&m->refs, 1); /* the host freed it during the call: the last reference */
    mk_model_free(m);
}

MK_API int mk_model_reset(mk_model *m, mk_error **err) {
    if (!m) return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_model_reset: NULL model");
    if (model_claim(m, "mk_model_reset", err)) return -1;
    int rc = 0;
    for (int i = 0; i < m->graph->n_nodes && !rc; i++) {
        const mk_node *n = m->graph->nodes[i];
        if (n->owner == n && n->storage == MK_STORAGE_BUFFER &&
            m->dev->zero(m->dev_state, m->base[i], mk_node_bytes(n), err))
            rc = -1;
    }
    model_unclaim(m);
    return rc;
}

/* ---- evaluate ------------------------------------------------------------------------ */

/* Points the input copies at the caller's data, each input given once by name. */
static int bind_inputs(mk_model *m, const mk_named_tensor *inputs, size_t n_inputs,
                       mk_error **err) {
    if (n_inputs && !inputs)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "the inputs are NULL");
    for (int k = 0; k < m->n_inputs; k++) m->in_copies[k].host = NULL;
    for (size_t j = 0; j < n_inputs; j++) {
        const mk_named_tensor *t = &inputs[j];
        if (!t->name || !t->data)
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "input %zu has a NULL name or data", j);
        /* callers mostly give the inputs in the model's order; else a lookup by name */
        int k = (size_t)m->n_inputs > j && !strcmp(m->inputs[j]->name, t->name) ? (int)j : -1;
        if (k < 0) {
            const mk_node *x = mk_graph_find_name(m->graph, t->name);
            k = x ? m->input_slot[x->index] : -1;
        }
        if (k < 0)
            return mk_fail(err, MK_ERR_INPUT, 0, 0, "'%s' is not an input of this model", t->name);
        if (m->in_copies[k].host)
            return mk_fail(err, MK_ERR_INPUT, 0, 0, "input '%s' is given twice", t->name);
        m->in_copies[k].host = (void *)t->data; /* only read */
    }
    for (int k = 0; k < m->n_inputs; k++)
        if (!m->in_copies[k].host)
            return mk_fail(err, MK_ERR_INPUT, 0, 0, "input '%s' is missing", m->inputs[k]->name);
    return 0;
}

/* Points the output copies at the buffers, step `step` of each. */
static int bind_outputs(mk_model *m, const mk_buffer *outputs, size_t n_outputs, int64_t steps,
                        int64_t step, mk_error **err) {
    if (!outputs || n_outputs != (size_t)m->n_outputs)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "the model has %d output%s, %zu %s given",
                       m->n_outputs, m->n_outputs == 1 ? "" : "s", outputs ? n_outputs : 0,
                       n_outputs == 1 && outputs ? "was" : "were");
    for (int o = 0; o < m->n_outputs; o++) {
        size_t bytes = m->out_copies[o].bytes;
        if (!outputs[o].data)
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "output %d's buffer is NULL", o);
        if ((size_t)steps > SIZE_MAX / bytes || outputs[o].bytes != bytes * (size_t)steps)
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0,
                           steps == 1 ? "output %d takes %zu bytes, the buffer given has %zu"
                                      : "output %d takes %zu bytes a step, the buffer given "
                                        "has %zu for %lld steps",
                           o, bytes, outputs[o].bytes, (long long)steps);
        m->out_copies[o].host = (char *)outputs[o].data + (size_t)step * bytes;
    }
    return 0;
}

static int evaluate_once(mk_model *m, mk_error **err) {
    mk_call c;
    mk_call_begin(&c, m->ctx);
    int rc = m->dev->evaluate(m->dev_state, m->launches, m->n_launches, m->in_copies,
                              m->n_inputs, m->out_copies, m->n_outputs, &c.host, err);
    mk_call_end(&c);
    return rc;
}

MK_API int mk_evaluate_outputs(mk_model *m, const mk_named_tensor *inputs, size_t n_inputs,
                               const mk_buffer *outputs, size_t n_outputs, mk_error **err) {
    if (!m) return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_evaluate_outputs: NULL model");
    if (model_claim(m, "mk_evaluate", err)) return -1;
    int rc = -1;
    if (!bind_outputs(m, outputs, n_outputs, 1, 0, err) && !bind_inputs(m, inputs, n_inputs, err))
        rc = evaluate_once(m, err);
    model_unclaim(m);
    return rc;
}

MK_API int mk_evaluate(mk_model *m, const mk_named_tensor *inputs, size_t n_inputs, void *output,
                       size_t output_bytes, mk_error **err) {
    if (!m || !output)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_evaluate: NULL model or output");
    if (m->n_outputs != 1)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0,
                       "the model has %d outputs: run it with mk_evaluate_outputs",
                       m->n_outputs);
    return mk_evaluate_outputs(m, inputs, n_inputs, &(mk_buffer){output, output_bytes}, 1, err);
}

/* ---- steps ----------------------------------------------------------------------------- */

/*
 * n steps: the device's own loop where it has one (CUDA: a graph that loops on
 * the device), else each step one evaluation: a fed input reads the previous
 * step's output where the caller's buffer holds it, a counter its slot in
 * m->counters (unsigned arithmetic: a counter wraps, as two's complement does,
 * never UB).
 */
static int64_t run_steps(mk_model *m, int64_t n, const mk_named_tensor *inputs,
                         size_t n_inputs, const mk_buffer *outputs, size_t n_outputs,
                         const mk_stop *stop, mk_error **err) {
    if (n < 1)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "run_steps: n must be at least 1, got %lld",
                       (long long)n);
    const mk_graph *g = m->graph;
    if (stop && stop->enabled) {
        if (stop->output >= (size_t)m->n_outputs)
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0,
                           "run_steps: the stop names output %zu; the model has %d", stop->output,
                           m->n_outputs);
        const mk_node *o = g->outputs[stop->output];
        if (o->dtype != MK_DTYPE_INT64 || mk_node_numel(o) != 1)
            return mk_fail(err, MK_ERR_DTYPE, 0, 0,
                           "run_steps: a stop value needs an int64 output of one element; "
                           "output %zu is %s %s", stop->output, mk_dtype_name(o->dtype),
                           mk_shape_str(o->rank, o->shape, (char[96]){0}, 96));
    }
    if (bind_outputs(m, outputs, n_outputs, n, 0, err) || bind_inputs(m, inputs, n_inputs, err))
        return -1;
    if (m->dev->run_steps) {
        mk_call c;
        mk_call_begin(&c, m->ctx);
        int64_t ran = m->dev->run_steps(m->dev_state, m->launches, m->n_launches, m->in_copies,
                                        m->n_inputs, m->out_copies, m->n_outputs, n, stop,
                                        &c.host, err);
        mk_call_end(&c);
        if (ran != MK_STEPS_NO_LOOP) return ran;
    }
    char *slot = m->counters;
    for (int i = 0; i < g->n_next; i++) {
        const mk_recurrence *r = &g->next[i];
        mk_copy *c = &m->in_copies[m->input_slot[r->input->index]];
        if (r->output >= 0) continue;
        memcpy(slot, c->host, c->bytes);
        c->host = slot;
        slot += c->bytes;
    }
    for (int64_t s = 0; s < n; s++) {
        if (s > 0) {
            bind_outputs(m, outputs, n_outputs, n, s, err); /* checked above: cannot fail */
            for (int i = 0; i < g->n_next; i++) {
                const mk_recurrence *r = &g->next[i];
                mk_copy *c = &m->in_copies[m->input_slot[r->input->index]];
                if (r->output >= 0) {
                    c->host = (char *)outputs[r->output].data + (size_t)(s - 1) * c->bytes;
                    continue;
                }
                uint64_t *v = c->host; /* counters are int64 */
                for (size_t e = 0; e < c->bytes / sizeof *v; e++) v[e] += (uint64_t)r->add;
            }
        }
        if (evaluate_once(m, err)) return -1;
        if (stop && stop->enabled) {
            int64_t got;
            memcpy(&got, m->out_copies[stop->output].host, sizeof got);
            if (got == stop->value) return s + 1;
        }
    }
    return n;
}

MK_API int64_t mk_model_run_steps(mk_model *m, int64_t n, const mk_named_tensor *inputs,
                                  size_t n_inputs, const mk_buffer *outputs, size_t n_outputs,
                                  const mk_stop *stop, mk_error **err) {
    if (!m) return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_model_run_steps: NULL model");
    if (model_claim(m, "mk_model_run_steps", err)) return -1;
    int64_t ran = run_steps(m, n, inputs, n_inputs, outputs, n_outputs, stop, err);
    model_unclaim(m);
    return ran;
}
