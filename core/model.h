/*
 * model.h — what the files of a model's life share: the context and model
 * records, a call in flight, the process-wide lock around CUDA setup.
 *   context.c  contexts, the host's functions, calls in flight, choosing a device
 *   model.c    compile (constants, plan, allocate, bind, prepare), free, introspection
 *   run.c      evaluate, run steps, reset: one call on a model at a time
 */
#ifndef MK_MODEL_H
#define MK_MODEL_H

#include "passes.h"
#include "device.h"

#include <stdatomic.h>

struct mk_context {
    atomic_int refs; /* the context and each of its models hold one; models may be freed
                        on any thread */
    struct mk_cudnn_cache *cudnn; /* cuDNN handle and compiled plans, made on first use */
    mk_cudnn_note *cudnn_notes;   /* what prepare found of cuDNN groups (passes.h), under
                                     the CUDA setup lock */
    unsigned compiles;            /* mk_compile calls for CUDA (under that lock) */
    mk_log_fn log;                /* the host's functions (mk_context_set_log, _progress) */
    void *log_user;
    mk_progress_fn progress;
    void *progress_user;
    atomic_uint cancels;          /* mk_context_cancel calls so far */
};

struct mk_model {
    atomic_int refs;     /* the host's, and one per model compiled with share = this one */
    mk_model *shared;    /* the model whose memory this one uses in place (share), or NULL */
    mk_context *ctx;
    const mk_device_ops *dev;
    void *dev_state;
    mk_graph *graph;

    void *arena;         /* arena_bytes of device memory: every arena owner at its offset */
    void **base;         /* [n_nodes] device address of each owner's memory, else NULL */
    bool *owns_alloc;    /* [n_nodes] base[i] was allocated for node i (constants, buffers) */
    const void **given;  /* [n_nodes] the host data given for each constant (compared by a
                            later model's share, never read after compile) */
    bool borrowed;       /* the constants are the host's memory (borrow_constants, CPU) */

    int n_launches;
    mk_launch *launches; /* [n_launches] in evaluation order */

    int n_inputs;
    mk_node **inputs;    /* [n_inputs] input leaves, script order */
    int *input_slot;     /* [n_nodes] k where node i is inputs[k], else -1 */
    mk_copy *in_copies;  /* [n_inputs] host field filled per evaluation */
    int n_outputs;
    mk_copy *out_copies; /* [n_outputs] host field filled per evaluation */
    void *counters;      /* the next lines' counters between steps (run_steps): each
                            counted input's bytes, in the order of graph->next */

    char *script;        /* after passes */
    mk_fusion *fusion;   /* cuDNN groups and their report (use_cudnn only) */
    char *report;        /* mk_model_fusion_report: pointwise groups, then cuDNN's */
    mk_stats stats;
    atomic_bool busy;    /* a call writes its memory (evaluate, run_steps, reset): another
                            one, from a host function or a thread, is a busy error */
};

/*
 * A compile or evaluation in flight. Its host functions may start calls of
 * their own on the same thread (another model's run): those nest, innermost
 * first, so mk_context_cancel_call stops the one whose host function asked
 * and no call around it.
 */
typedef struct mk_call {
    mk_host host;          /* first: the devices hand &host back to host_cancelled */
    atomic_bool stopped;   /* mk_context_cancel_call; read by the device's threads too */
    struct mk_call *outer;    /* the call on this thread inside whose host function this began */
} mk_call;

/* Begins a call in ctx (may be NULL: the call fails on its arguments): cancels
 * after this moment stop it. mk_call_end when it returns. */
void mk_call_begin(mk_call *c, mk_context *ctx);
void mk_call_end(mk_call *c);
/* The process-wide lock around CUDA setup (compile, free, probe): a no-op where
 * `cuda` is false. Recursive. */
void mk_cuda_setup_lock(bool cuda);
void mk_cuda_setup_unlock(bool cuda);
/* Drops one reference to ctx: the host's, or a model's. */
void mk_context_release(mk_context *ctx);
/* The device table the options ask for, or NULL with *err. */
const mk_device_ops *mk_device_for(const mk_compile_options *opts, mk_error **err);

#endif
