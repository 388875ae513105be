/*
 * cuda_graph.cu — a CUDA model's graph: prepare stages every input, output
 * and the fault record in one pinned block, makes cuDNN's plans, cuBLAS's
 * handle and the generated kernels, then captures the copies and every launch
 * once and instantiates the graph; evaluate replays it and waits (see
 * cuda_device.cu's header for a model's whole life).
 */
#include "cuda_device.h"

#include <stdlib.h>
#include <string.h>

/* Staging slots start on this boundary (wide host copies). */
#define MK_STAGE_ALIGN 64
/* Up to this many staged bytes (and MK_STAGE_COPIES copies at each end), the
 * graph's copies are two small kernels reading and writing the pinned block
 * through its device mapping: a copy-engine node costs a few microseconds of
 * latency each, which is most of a small model's evaluation. More goes by
 * the copy engines. */
#define MK_STAGE_KERNEL_MAX (64u << 10)

/* ---- prepare: the pinned block, plans and handles, the capture ------------- */

static unsigned char *stage_on_device(const mk_cuda_state *s, const void *host) {
    return s->pinned_dev + ((const unsigned char *)host - s->pinned);
}

static size_t stage_round(size_t bytes) {
    return (bytes + MK_STAGE_ALIGN - 1) / MK_STAGE_ALIGN * MK_STAGE_ALIGN;
}

/*
 * Compiles the plan of each cuDNN group (the fusion pass chose them from the
 * target alone): 0 all are ready, 1 some must be chosen otherwise (cuDNN
 * refuses one, or its plan needs more workspace than the planner gave its
 * launch: the group's verdict says which), -1 an error. The plans are
 * released at close.
 */
static int prepare_cudnn(mk_cuda_state *s, const mk_launch *launches, int n, const mk_host *host,
                         mk_error **err) {
    int again = 0;
    /* a trial run's buffers would be device memory max_bytes does not count */
    size_t trial = host->opts && host->opts->max_bytes ? 0 : MK_CUDNN_TRIAL_LIMIT;
    for (int i = 0; i < n; i++) {
        mk_fused_group *g = mk_node_cudnn(launches[i].node);
        if (!g) continue;
#ifdef MK_WITH_CUDNN
        if (s->n_cudnn == s->cap_cudnn) {
            int cap = s->cap_cudnn ? 2 * s->cap_cudnn : 8;
            mk_fused_group **grown =
                (mk_fused_group **)realloc(s->cudnn, (size_t)cap * sizeof *grown);
            if (!grown) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "the CUDA device's cuDNN groups");
            s->cudnn = grown;
            s->cap_cudnn = cap;
        }
        g->trial_limit = trial;
        int rc = mk_cudnn_compile_group(g->cache, g, g->why, sizeof g->why, err);
        if (rc < 0) return -1;
        if (rc == 0) s->cudnn[s->n_cudnn++] = g; /* holds a plan: released at close */
        if (rc > 0) g->verdict = MK_CUDNN_REJECTED;
        else if (g->workspace_bytes > launches[i].scratch_bytes) g->verdict = MK_CUDNN_WORKSPACE;
        else g->verdict = MK_CUDNN_FUSED;
        again = again || g->verdict != MK_CUDNN_FUSED;
#else
        return MK_INTERNAL(err, "a cuDNN group in a build without cuDNN");
#endif
    }
    return again;
}

int mk_cuda_prepare(void *state, const mk_launch *launches, int n, const mk_copy *in,
                    int n_in, const mk_copy *out, int n_out, const mk_step_rule *rules,
                    int n_rules, const mk_host *host, mk_error **err) {
    mk_cuda_state *s = (mk_cuda_state *)state;
    cudaGraph_t graph = NULL;
    bool capturing = false;
    int failed_at = -1;
    MK_CUDA_TRY(err, cudaSetDevice(s->device));
    cudaGetLastError(); /* a stale launch error must not be blamed on a kernel below */
    if (s->exec || s->pinned)
        return MK_INTERNAL(err, "cuda prepare called twice for one model");

    /* One pinned block: [input 0][input 1]…[output 0]…[fault record][done word]. */
    {
        size_t total = 0;
        for (int i = 0; i < n_in; i++) total += stage_round(in[i].bytes);
        for (int o = 0; o < n_out; o++) total += stage_round(out[o].bytes);
        total += stage_round(sizeof(mk_fault_rec)) + stage_round(sizeof(unsigned));
        s->in_stage = (void **)calloc((size_t)(n_in ? n_in : 1), sizeof *s->in_stage);
        s->out_stage = (void **)calloc((size_t)(n_out ? n_out : 1), sizeof *s->out_stage);
        if (!s->in_stage || !s->out_stage)
            return mk_fail(err, MK_ERR_NOMEM, 0, 0, "cannot allocate the staging table");
        s->n_in = n_in;
        s->n_out = n_out;
        MK_CUDA_TRY(err, cudaHostAlloc((void **)&s->pinned, total, cudaHostAllocMapped));
        MK_CUDA_TRY(err, cudaHostGetDevicePointer((void **)&s->pinned_dev, s->pinned, 0));
        s->stage_kernels = total <= MK_STAGE_KERNEL_MAX && n_in + 1 <= MK_STAGE_COPIES &&
                           n_out + 1 <= MK_STAGE_COPIES;
        size_t at = 0;
        for (int i = 0; i < n_in; i++) {
            s->in_stage[i] = s->pinned + at;
            at += stage_round(in[i].bytes);
        }
        for (int o = 0; o < n_out; o++) {
            s->out_stage[o] = s->pinned + at;
            at += stage_round(out[o].bytes);
        }
        s->fault_stage = (mk_fault_rec *)(s->pinned + at);
        memset(s->fault_stage, 0, sizeof *s->fault_stage);
        at += stage_round(sizeof(mk_fault_rec));
        s->done_stage = (unsigned *)(s->pinned + at);
        *s->done_stage = 0;
        if (s->stage_kernels) {
            MK_CUDA_TRY(err, cudaMalloc((void **)&s->done_counts, 2 * sizeof(unsigned)));
            MK_CUDA_TRY(err, cudaMemset(s->done_counts, 0, 2 * sizeof(unsigned)));
        }
    }

    /* cuDNN's plans first: where a group must be chosen otherwise, the model
     * is compiled anew (model.c), so nothing else need be made */
    {
        int again = prepare_cudnn(s, launches, n, host, err);
        if (again) return again;
    }

    /* cuBLAS, where the model has products for it: a handle takes device
     * memory of its own, so models without products make none. The
     * workspace is set now, so capture never allocates (cuda_model_memory
     * counted it). */
    for (int i = 0; i < n && !s->blas_workspace; i++) {
        if (!mk_cuda_uses_blas(launches[i].node)) continue;
        MK_BLAS_TRY(err, cublasCreate(&s->blas));
        /* cublasSetStream resets the workspace, so the stream goes first. */
        MK_BLAS_TRY(err, cublasSetStream(s->blas, s->stream));
        MK_BLAS_TRY(err, cublasSetPointerMode(s->blas, CUBLAS_POINTER_MODE_HOST));
        /* Plain float32 products (no TF32): results agree with the CPU far under 1e-3. */
        MK_BLAS_TRY(err, cublasSetMathMode(s->blas, CUBLAS_DEFAULT_MATH));
        s->blas_workspace_bytes = MK_BLAS_WORKSPACE;
        MK_CUDA_TRY(err, cudaMalloc(&s->blas_workspace, s->blas_workspace_bytes));
        MK_BLAS_TRY(err, cublasSetWorkspace(s->blas, s->blas_workspace, s->blas_workspace_bytes));
    }

    /* Generated kernels are compiled and loaded now: loading is no capture work. */
    if (mk_cuda_generate(s, launches, n, host, err)) return -1;
    /* cuDNN plans the convolutions (and runs each once) outside the capture too */
    if (mk_cuda_conv_plan(s, launches, n, host, err)) return -1;

    /*
     * Capture. Thread-local mode: a forbidden call on this thread (an
     * allocation, a sync) breaks this capture only, never another context's.
     */
    MK_CUDA_TRY(err, cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
    capturing = true;
    /* The graph opens with the inputs' copies from their pinned slots, so an
     * evaluation is memcpys on the host, one graph launch and one sync. */
    if (s->stage_kernels) { /* one kernel: the inputs, and the fault record cleared */
        mk_stage_copies c = {0};
        for (int i = 0; i < n_in; i++) {
            if (!in[i].bytes) continue;
            c.dst[c.n] = (unsigned char *)in[i].device;
            c.src[c.n] = stage_on_device(s, s->in_stage[i]);
            c.bytes[c.n++] = in[i].bytes;
        }
        c.dst[c.n] = (unsigned char *)s->fault;
        c.bytes[c.n++] = sizeof *s->fault;
        if (!mk_cuda_stage_launch(&c, s->stream, s->pdl)) failed_at = -2;
    } else {
        for (int i = 0; failed_at == -1 && i < n_in; i++)
            if (in[i].bytes && cudaMemcpyAsync(in[i].device, s->in_stage[i], in[i].bytes,
                                               cudaMemcpyHostToDevice, s->stream) != cudaSuccess)
                failed_at = -2;
        if (failed_at == -1 &&
            cudaMemsetAsync(s->fault, 0, sizeof *s->fault, s->stream) != cudaSuccess)
            failed_at = -2;
    }
    if (failed_at == -1) failed_at = mk_cuda_capture_launches(launches, n, s->stage_kernels, err);
    /* the graph's last nodes bring the output and the fault record back to pinned memory */
    if (failed_at == -1 && s->stage_kernels) {
        mk_stage_copies c = {0};
        for (int o = 0; o < n_out; o++) {
            if (!out[o].bytes) continue;
            c.dst[c.n] = stage_on_device(s, s->out_stage[o]);
            c.src[c.n] = (const unsigned char *)out[o].device;
            c.bytes[c.n++] = out[o].bytes;
        }
        c.dst[c.n] = stage_on_device(s, s->fault_stage);
        c.src[c.n] = (const unsigned char *)s->fault;
        c.bytes[c.n++] = sizeof *s->fault;
        c.done = (unsigned *)stage_on_device(s, s->done_stage);
        c.counts = s->done_counts;
        if (!mk_cuda_stage_launch(&c, s->stream, s->pdl)) failed_at = -2;
    } else if (failed_at == -1) {
        for (int o = 0; failed_at == -1 && o < n_out; o++)
            if (out[o].bytes && cudaMemcpyAsync(s->out_stage[o], out[o].device, out[o].bytes,
                                                cudaMemcpyDeviceToHost, s->stream) != cudaSuccess)
                failed_at = -2;
        if (failed_at == -1 && cudaMemcpyAsync(s->fault_stage, s->fault, sizeof *s->fault,
                                               cudaMemcpyDeviceToHost, s->stream) != cudaSuccess)
            failed_at = -2;
    }
    {
        cudaError_t status = cudaStreamEndCapture(s->stream, &graph);
        capturing = false;
        if (failed_at == -2) {
            mk_fail(err, MK_ERR_DEVICE, 0, 0, "capturing the CUDA graph: an input, output or "
                    "error-word copy failed: %s", cudaGetErrorString(status));
            goto fail;
        }
        if (failed_at >= 0) {
            /* The kernel stored the reason; say that it broke the capture. */
            goto fail;
        }
        if (status != cudaSuccess) {
            mk_fail(err, MK_ERR_DEVICE, 0, 0, "capturing the CUDA graph of %d launches: %s (%s)",
                    n, cudaGetErrorString(status), cudaGetErrorName(status));
            cudaGetLastError();
            goto fail;
        }
    }
    MK_CUDA_TRY(err, cudaGraphInstantiate(&s->exec, graph, 0));
    s->graph = graph;
    graph = NULL;
    /* Uploading now keeps the first evaluation's latency like every other. */
    MK_CUDA_TRY(err, cudaGraphUpload(s->exec, s->stream));
    MK_CUDA_TRY(err, cudaStreamSynchronize(s->stream));
    if (n_rules > 0) {
        if (mk_cuda_prepare_steps(s, launches, n, in, n_in, out, n_out, rules, n_rules, err))
            return -1;
        if (!s->loop_exec)
            host->log(host, MK_LOG_INFO, "cuda: run_steps runs its steps as evaluations: %s",
                      s->loop_why);
    }
    return 0;
fail:
    if (capturing) {
        cudaGraph_t broken = NULL;
        cudaStreamEndCapture(s->stream, &broken);
        if (broken) cudaGraphDestroy(broken);
    }
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    return -1;
}

/* ---- evaluate ------------------------------------------------------------ */

/* The fault record as the error the CPU device gives for the same value (mk_fault). */
int mk_cuda_fault_error(const mk_fault_rec *f, const mk_launch *launches, int n,
                        mk_error **err) {
    if (f->launch < 0 || f->launch >= n)
        return mk_fail(err, MK_ERR_INTERNAL, 0, 0, "a CUDA kernel reported launch %d of %d",
                       f->launch, n);
    const mk_node *node = launches[f->launch].node; /* in a group: the member that faulted */
    const mk_product_group *pg = mk_node_product(node);
    if (node->group && f->which > 0 && f->which <= node->group->n_members)
        node = node->group->members[f->which - 1];
    else if (pg && f->which < 0 && -f->which <= pg->n_gathers) /* (gathers) */
        node = pg->gather[-f->which - 1].node;
    return mk_fault(err, node, (mk_fault_kind)f->kind, f->value[0], f->value[1], f->value[2]);
}

/* Spins until the graph's last stage kernel writes `number` to the done word;
 * now and then asks the stream, so that a failed graph is an error, not a
 * wait without end. The graph may still be ending: its stream is not idle,
 * but every staging slot is free (its last kernel has read and written them). */
static int wait_done(mk_cuda_state *s, unsigned number, mk_error **err) {
    for (unsigned spin = 1;; spin++) {
        if (__atomic_load_n(s->done_stage, __ATOMIC_ACQUIRE) == number) return 0;
        if (spin % 4096) continue;
        cudaError_t status = cudaStreamQuery(s->stream);
        if (status == cudaErrorNotReady) continue;
        if (status != cudaSuccess)
            return mk_cuda_fail_status(err, status, "running the CUDA graph", __FILE__, __LINE__);
        if (__atomic_load_n(s->done_stage, __ATOMIC_ACQUIRE) == number) return 0;
        return MK_INTERNAL(err, "the CUDA graph ended without writing its done word");
    }
}

int mk_cuda_evaluate(void *state, const mk_launch *launches, int n, const mk_copy *in,
                     int n_in, const mk_copy *out, int n_out, const mk_host *host,
                     mk_error **err) {
    mk_cuda_state *s = (mk_cuda_state *)state;
    /* one graph is one launch: the host hears 0 of 1 and may cancel before it
     * starts; once launched, it runs to its end */
    host->progress(host, MK_PHASE_RUN, 0, 1);
    if (host->cancelled(host)) return mk_cancelled(err, "evaluation");
    if (!s->exec || n_in != s->n_in || n_out != s->n_out)
        return MK_INTERNAL(err, "cuda evaluate before prepare, or with other copies");
    MK_CUDA_TRY(err, cudaSetDevice(s->device));
    /* the slots are free: the last evaluation waited for its graph's last kernel */
    for (int i = 0; i < n_in; i++)
        if (in[i].bytes) memcpy(s->in_stage[i], in[i].host, in[i].bytes);
    MK_CUDA_TRY(err, cudaGraphLaunch(s->exec, s->stream));
    s->evaluations++;
    if (s->stage_kernels) {
        if (wait_done(s, s->evaluations, err)) goto fail;
    } else {
        MK_CUDA_TRY(err, cudaStreamSynchronize(s->stream));
    }
    if (s->timeline) mk_cuda_timeline_take(s);
    if (s->fault_stage->flag) return mk_cuda_fault_error(s->fault_stage, launches, n, err);
    for (int o = 0; o < n_out; o++)
        if (out[o].bytes) memcpy(out[o].host, s->out_stage[o], out[o].bytes);
    host->progress(host, MK_PHASE_RUN, 1, 1);
    return 0;
fail:
    /* Leave the stream idle so the staging buffers are free for the next call. */
    cudaStreamSynchronize(s->stream);
    cudaGetLastError();
    return -1;
}
