/*
 * context.c — contexts and what a call sees of them: the host's log, progress
 * and cancel functions, the calls in flight on each thread (they nest when a
 * host function starts a call of its own), the lock around CUDA setup, and
 * the device a compile asks for.
 */
#include "model.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- one CUDA setup at a time ---------------------------------------------- */

/*
 * Compiling for CUDA captures a graph on the model's stream, and another thread
 * that synchronizes the device meanwhile (cudaFree, cudaHostAlloc, cublasCreate
 * and cublasDestroy do) breaks that capture. So compiling and freeing CUDA
 * models, freeing a context's cuDNN cache and probing the device take one
 * process-wide lock; evaluations (each on its model's own stream) and the CPU
 * never do. Recursive: a failed compile frees its model, and a model's free its
 * context, under the lock they hold.
 */
static pthread_once_t cuda_lock_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t cuda_lock;

static void cuda_lock_init(void) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&cuda_lock, &a);
    pthread_mutexattr_destroy(&a);
}

void mk_cuda_setup_lock(bool cuda) {
    if (!cuda) return;
    pthread_once(&cuda_lock_once, cuda_lock_init);
    pthread_mutex_lock(&cuda_lock);
}

void mk_cuda_setup_unlock(bool cuda) {
    if (cuda) pthread_mutex_unlock(&cuda_lock);
}

/* ---- context --------------------------------------------------------------- */

MK_API mk_context *mk_context_new(mk_error **err) {
    mk_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "creating a context");
        return NULL;
    }
    atomic_init(&ctx->refs, 1);
    return ctx;
}

void mk_context_release(mk_context *ctx) {
    if (!ctx || atomic_fetch_sub(&ctx->refs, 1) > 1) return;
    if (ctx->cudnn) { /* made only through the plugin, so it is loaded */
        const mk_cuda_plugin *p = mk_cuda_plugin_get(NULL, 0);
        mk_cuda_setup_lock(true);
        if (p && p->cudnn_cache_free) p->cudnn_cache_free(ctx->cudnn);
        mk_cuda_setup_unlock(true);
    }
    mk_cudnn_notes_free(ctx->cudnn_notes);
    free(ctx);
}

MK_API void mk_context_free(mk_context *ctx) { mk_context_release(ctx); }

/* ---- the host's functions ------------------------------------------------------- */

MK_API void mk_context_set_log(mk_context *ctx, mk_log_fn fn, void *user) {
    if (!ctx) return;
    ctx->log = fn;
    ctx->log_user = user;
}

MK_API void mk_context_set_progress(mk_context *ctx, mk_progress_fn fn, void *user) {
    if (!ctx) return;
    ctx->progress = fn;
    ctx->progress_user = user;
}

MK_API void mk_context_cancel(mk_context *ctx) {
    if (ctx) atomic_fetch_add(&ctx->cancels, 1u);
}

MK_API const char *mk_phase_name(mk_phase phase) {
    switch (phase) {
    case MK_PHASE_COMPILE: return "compile";
    case MK_PHASE_UPLOAD: return "upload";
    case MK_PHASE_KERNELS: return "kernels";
    case MK_PHASE_RUN: return "run";
    }
    return "?";
}

static void host_log(const mk_host *h, mk_log_level level, const char *fmt, ...) {
    const mk_context *ctx = h->ctx;
    if (!ctx->log) return;
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    ctx->log(ctx->log_user, level, message);
}

static void host_progress(const mk_host *h, mk_phase phase, int64_t done, int64_t total) {
    const mk_context *ctx = h->ctx;
    if (ctx->progress) ctx->progress(ctx->progress_user, phase, done, total);
}

/* ---- calls in flight ------------------------------------------------------------ */

static _Thread_local mk_call *innermost;

static bool host_cancelled(const mk_host *h) {
    const mk_call *c = (const mk_call *)h;
    mk_context *ctx = h->ctx;
    return atomic_load(&c->stopped) || atomic_load(&ctx->cancels) != h->epoch;
}

/* Begins a call in ctx (may be NULL: the call fails on its arguments): cancels
 * after this moment stop it. */
void mk_call_begin(mk_call *c, mk_context *ctx) {
    c->host = (mk_host){.ctx = ctx,
                        .epoch = ctx ? atomic_load(&ctx->cancels) : 0,
                        .log = host_log,
                        .progress = host_progress,
                        .cancelled = host_cancelled};
    atomic_init(&c->stopped, false);
    c->outer = innermost;
    innermost = c;
}

void mk_call_end(mk_call *c) { innermost = c->outer; }

MK_API void mk_context_cancel_call(mk_context *ctx) {
    for (mk_call *c = innermost; ctx && c; c = c->outer)
        if (c->host.ctx == ctx) {
            atomic_store(&c->stopped, true);
            return;
        }
}

/* ---- devices ----------------------------------------------------------------- */

MK_API int mk_cuda_available(char *reason, size_t size) {
    const mk_cuda_plugin *p = mk_cuda_plugin_get(reason, size);
    if (!p) return 0;
    mk_cuda_setup_lock(true);
    int ok = p->probe(reason, size);
    mk_cuda_setup_unlock(true);
    return ok;
}

const mk_device_ops *mk_device_for(const mk_compile_options *opts, mk_error **err) {
    if (opts->device == MK_DEVICE_CPU) {
        if (opts->use_cudnn)
            mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "use_cudnn needs the CUDA device");
        return opts->use_cudnn ? NULL : &mk_cpu_device;
    }
    if (opts->device != MK_DEVICE_CUDA) {
        mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "unknown device %d", (int)opts->device);
        return NULL;
    }
    char reason[512];
    const mk_cuda_plugin *p = mk_cuda_plugin_get(reason, sizeof reason);
    if (!p || !p->probe(reason, sizeof reason)) {
        mk_fail(err, MK_ERR_NO_DEVICE, 0, 0, "%s", reason);
        return NULL;
    }
    if (opts->use_cudnn && !p->device->target.cudnn_groups) {
        mk_fail(err, MK_ERR_NO_DEVICE, 0, 0,
                "use_cudnn: this build's CUDA device was made without cuDNN (make CUDNN=1)");
        return NULL;
    }
    return p->device;
}
