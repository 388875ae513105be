/*
 * steps.cu — mk_model_run_steps on the GPU: one CUDA graph that loops.
 *
 * A model whose script has next lines (a recurrence: an output fed back as an
 * input, int64 counters) gets, besides its evaluation graph, a step-loop graph:
 *
 *     [inputs, control: pinned → device, fault cleared]
 *     → WHILE { launch 0 → … → launch n-1 → step kernel }
 *     → [control, fault → pinned]
 *
 * The step kernel ends each step: the step's outputs go into a pinned ring
 * (written through its device mapping; the host copies them out after the
 * graph), each fed input takes its output's value and each counter its
 * increment, in the input's device slot and in its pinned staging slot (the
 * next launch of the graph starts from there), the step is counted, and the
 * WHILE node's condition says whether another follows: more steps asked, no
 * stop value seen, no fault. One graph launch runs up to ring_steps steps
 * with no host work between them; run_steps launches it until the steps asked
 * are done (llama2 asks 16 at a time: one launch, one sync).
 *
 * Conditional nodes need a CUDA 12.4 driver. Where the loop cannot be made
 * (the driver, or inputs too many or too large for the staging kernel) the
 * reason is logged and model.c runs the steps as evaluations: the same values.
 */
#include "cuda_device.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The most steps one launch of the loop runs, and the most ring memory. */
#define MK_RING_STEPS 1024
#define MK_RING_BYTES (16u << 20)

typedef struct {
    int n_out, n_rules;
    const unsigned char *out[MK_MAX_OUTPUTS];     /* output o in the arena */
    unsigned long long out_bytes[MK_MAX_OUTPUTS];
    unsigned char *ring[MK_MAX_OUTPUTS];          /* its step 0 in the ring (mapped) */
    unsigned char *snap[MK_MAX_OUTPUTS];          /* its value for the feeds, or NULL */
    unsigned char *in[MK_MAX_INPUTS];             /* rule r's input in the arena */
    unsigned char *in_stage[MK_MAX_INPUTS];       /* its staging slot (mapped) */
    unsigned long long in_bytes[MK_MAX_INPUTS];
    int from[MK_MAX_INPUTS];                      /* the output feeding it, or -1 */
    long long add[MK_MAX_INPUTS];                 /* a counter's increment */
    mk_step_ctl *ctl;
    const mk_fault_rec *fault;
    cudaGraphConditionalHandle loop;
} mk_step_args;

/* n bytes from s to d by the block: 16-byte words where both ends allow. */
static __device__ void block_copy(unsigned char *d, const unsigned char *s, unsigned long long n) {
    unsigned long long words = 0;
    if (((unsigned long long)d | (unsigned long long)s) % 16 == 0) {
        words = n / 16;
        for (unsigned long long w = threadIdx.x; w < words; w += blockDim.x)
            ((uint4 *)d)[w] = ((const uint4 *)s)[w];
    }
    for (unsigned long long b = 16 * words + threadIdx.x; b < n; b += blockDim.x) d[b] = s[b];
}

/* One block, after the step's launches. The stop value is read, and every
 * output copied (into the ring, and a fed one into its snapshot), before any
 * input is written: an output may be an input, or a view of one, that a feed
 * or counter writes. Feeds then read the snapshots, as the host loop reads
 * the copies it made. */
__global__ void mk_step_kernel(mk_step_args a) {
    __shared__ long long step;
    __shared__ int stopped;
    if (threadIdx.x == 0) {
        step = a.ctl->step;
        stopped = a.ctl->stop &&
                  *(const long long *)a.out[a.ctl->stop_output] == a.ctl->stop_value;
    }
    __syncthreads();
    for (int o = 0; o < a.n_out; o++) {
        block_copy(a.ring[o] + step * a.out_bytes[o], a.out[o], a.out_bytes[o]);
        if (a.snap[o]) block_copy(a.snap[o], a.out[o], a.out_bytes[o]);
    }
    __syncthreads();
    for (int r = 0; r < a.n_rules; r++) {
        if (a.from[r] >= 0) {
            block_copy(a.in[r], a.snap[a.from[r]], a.in_bytes[r]);
            block_copy(a.in_stage[r], a.snap[a.from[r]], a.in_bytes[r]);
            continue;
        }
        unsigned long long *v = (unsigned long long *)a.in[r], *staged =
            (unsigned long long *)a.in_stage[r];
        for (unsigned long long e = threadIdx.x; e < a.in_bytes[r] / 8; e += blockDim.x)
            staged[e] = v[e] = v[e] + (unsigned long long)a.add[r]; /* wraps, as the host's */
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        long long next = step + 1;
        a.ctl->step = next;
        cudaGraphSetConditional(a.loop, next < a.ctl->n && !stopped && !a.fault->flag);
    }
}

/* The device's address of a place in a mapped pinned block starting at base. */
static unsigned char *mapped(const void *base, const void *host) {
    void *dev = NULL;
    if (cudaHostGetDevicePointer(&dev, (void *)base, 0) != cudaSuccess) return NULL;
    return (unsigned char *)dev + ((const unsigned char *)host - (const unsigned char *)base);
}

/* Captures the copies c as one staging kernel into g after `after` (or first). */
static int capture_copies(mk_cuda_state *s, cudaGraph_t g, const cudaGraphNode_t *after,
                          const mk_stage_copies *c, mk_error **err) {
    bool launched;
    MK_CUDA_TRY(err, cudaStreamBeginCaptureToGraph(s->stream, g, after, NULL, after ? 1 : 0,
                                                   cudaStreamCaptureModeThreadLocal));
    launched = mk_cuda_stage_launch(c, s->stream, false); /* a graph built by pieces */
    MK_CUDA_TRY(err, cudaStreamEndCapture(s->stream, &g));
    if (!launched) return MK_INTERNAL(err, "the step loop's staging kernel did not launch");
    return 0;
fail:
    return -1;
}

/* The loop cannot be made: why, for the log; not an error. */
static int no_loop(mk_cuda_state *s, cudaGraph_t g, const char *fmt, const char *what) {
    snprintf(s->loop_why, sizeof s->loop_why, fmt, what);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
    return 0;
}

int mk_cuda_prepare_steps(mk_cuda_state *s, const mk_launch *launches, int n, const mk_copy *in,
                          int n_in, const mk_copy *out, int n_out, const mk_step_rule *rules,
                          int n_rules, mk_error **err) {
    /* declared ahead of the first jump to fail (C++) */
    cudaGraph_t g = NULL, body = NULL;
    cudaGraphNode_t start = NULL, loop = NULL;
    size_t count = 1, step_bytes = 0, ring_bytes = 0, at[MK_MAX_OUTPUTS], snap_bytes,
           snap_at[MK_MAX_OUTPUTS];
    bool launched = false;
    int failed_at = -1;
    long long steps;
    cudaError_t status;
    mk_step_args a;
    mk_stage_copies c;
    unsigned char *ctl_stage, *fault_stage;
    /* cudaGraphNodeParams has no default constructor: zeroed bytes instead */
    alignas(cudaGraphNodeParams) unsigned char params[sizeof(cudaGraphNodeParams)];
    cudaGraphNodeParams *p = (cudaGraphNodeParams *)params;
    if (!s->stage_kernels || n_in + 2 > MK_STAGE_COPIES)
        return no_loop(s, NULL, "%s", "its inputs are too many or too large for one staging "
                                      "kernel");
    if (n_out > MK_MAX_OUTPUTS || n_rules > MK_MAX_INPUTS)
        return MK_INTERNAL(err, "more outputs or next lines than the step kernel takes");

    /* the ring: each output's steps side by side, from 64-byte boundaries */
    for (int o = 0; o < n_out; o++) step_bytes += out[o].bytes;
    steps = step_bytes ? (long long)(MK_RING_BYTES / step_bytes) : MK_RING_STEPS;
    s->ring_steps = steps < 1 ? 1 : steps > MK_RING_STEPS ? MK_RING_STEPS : steps;
    for (int o = 0; o < n_out; o++) {
        at[o] = ring_bytes;
        ring_bytes += ((size_t)s->ring_steps * out[o].bytes + 63) / 64 * 64;
    }
    MK_CUDA_TRY(err, cudaHostAlloc((void **)&s->ring, ring_bytes ? ring_bytes : 64,
                                   cudaHostAllocMapped));
    MK_CUDA_TRY(err, cudaHostAlloc((void **)&s->ctl_stage, sizeof *s->ctl_stage,
                                   cudaHostAllocMapped));
    MK_CUDA_TRY(err, cudaMalloc((void **)&s->ctl, sizeof *s->ctl));
    snap_bytes = 0;
    for (int o = 0; o < n_out; o++) {
        bool feeds = false;
        for (int r = 0; r < n_rules; r++) feeds = feeds || rules[r].output == o;
        snap_at[o] = feeds ? snap_bytes : SIZE_MAX;
        if (feeds) snap_bytes += (out[o].bytes + 255) / 256 * 256;
    }
    if (snap_bytes) MK_CUDA_TRY(err, cudaMalloc((void **)&s->snap, snap_bytes));

    memset(&a, 0, sizeof a);
    a.n_out = n_out;
    a.n_rules = n_rules;
    for (int o = 0; o < n_out; o++) {
        s->ring_out[o] = s->ring + at[o];
        a.out[o] = (const unsigned char *)out[o].device;
        a.out_bytes[o] = out[o].bytes;
        a.ring[o] = mapped(s->ring, s->ring_out[o]);
        a.snap[o] = snap_at[o] == SIZE_MAX ? NULL : s->snap + snap_at[o];
    }
    for (int r = 0; r < n_rules; r++) {
        int k = rules[r].input;
        a.in[r] = (unsigned char *)in[k].device;
        a.in_stage[r] = mapped(s->pinned, s->in_stage[k]);
        a.in_bytes[r] = in[k].bytes;
        a.from[r] = rules[r].output;
        a.add[r] = (long long)rules[r].add;
    }
    a.ctl = s->ctl;
    a.fault = s->fault;
    ctl_stage = mapped(s->ctl_stage, s->ctl_stage);
    fault_stage = mapped(s->pinned, s->fault_stage);
    if (!ctl_stage || !fault_stage || (n_out && !a.ring[0]))
        return MK_INTERNAL(err, "pinned memory without a device mapping");

    MK_CUDA_TRY(err, cudaGraphCreate(&g, 0));
    status = cudaGraphConditionalHandleCreate(&a.loop, g, 1, cudaGraphCondAssignDefault);
    if (status != cudaSuccess)
        return no_loop(s, g, "conditional graph nodes: %s", cudaGetErrorString(status));

    /* the start: inputs and control in, fault cleared */
    memset(&c, 0, sizeof c);
    for (int i = 0; i < n_in; i++) {
        if (!in[i].bytes) continue;
        c.dst[c.n] = (unsigned char *)in[i].device;
        c.src[c.n] = mapped(s->pinned, s->in_stage[i]);
        c.bytes[c.n++] = in[i].bytes;
    }
    c.dst[c.n] = (unsigned char *)s->ctl;
    c.src[c.n] = ctl_stage;
    c.bytes[c.n++] = sizeof *s->ctl;
    c.dst[c.n] = (unsigned char *)s->fault;
    c.bytes[c.n++] = sizeof *s->fault;
    if (capture_copies(s, g, NULL, &c, err)) goto fail;
    MK_CUDA_TRY(err, cudaGraphGetNodes(g, &start, &count));

    /* the loop: the launches, then the step kernel */
    memset(params, 0, sizeof params);
    p->type = cudaGraphNodeTypeConditional;
    p->conditional.handle = a.loop;
    p->conditional.type = cudaGraphCondTypeWhile;
    p->conditional.size = 1;
    status = cudaGraphAddNode(&loop, g, &start, NULL, 1, p);
    if (status != cudaSuccess)
        return no_loop(s, g, "a WHILE node: %s", cudaGetErrorString(status));
    body = p->conditional.phGraph_out[0];
    MK_CUDA_TRY(err, cudaStreamBeginCaptureToGraph(s->stream, body, NULL, NULL, 0,
                                                   cudaStreamCaptureModeThreadLocal));
    failed_at = mk_cuda_capture_launches(launches, n, false, err);
    if (failed_at < 0) {
        mk_step_kernel<<<1, 256, 0, s->stream>>>(a);
        launched = cudaGetLastError() == cudaSuccess;
    }
    status = cudaStreamEndCapture(s->stream, &body); /* ends it whatever failed */
    if (failed_at >= 0) goto fail; /* the kernel said why */
    if (!launched || status != cudaSuccess) {
        mk_fail(err, MK_ERR_DEVICE, 0, 0, "capturing the step loop: %s",
                cudaGetErrorString(launched ? status : cudaErrorLaunchFailure));
        goto fail;
    }

    /* the end: control and fault out */
    memset(&c, 0, sizeof c);
    c.dst[c.n] = ctl_stage;
    c.src[c.n] = (const unsigned char *)s->ctl;
    c.bytes[c.n++] = sizeof *s->ctl;
    c.dst[c.n] = fault_stage;
    c.src[c.n] = (const unsigned char *)s->fault;
    c.bytes[c.n++] = sizeof *s->fault;
    if (capture_copies(s, g, &loop, &c, err)) goto fail;

    status = cudaGraphInstantiate(&s->loop_exec, g, 0);
    if (status != cudaSuccess) {
        s->loop_exec = NULL;
        return no_loop(s, g, "instantiating the step loop: %s", cudaGetErrorString(status));
    }
    s->loop_graph = g;
    MK_CUDA_TRY(err, cudaGraphUpload(s->loop_exec, s->stream));
    MK_CUDA_TRY(err, cudaStreamSynchronize(s->stream));
    return 0;
fail:
    if (g && g != s->loop_graph) cudaGraphDestroy(g);
    cudaGetLastError();
    return -1;
}

int64_t mk_cuda_run_steps(void *state, const mk_launch *launches, int n, const mk_copy *in,
                          int n_in, const mk_copy *out, int n_out, int64_t steps,
                          const mk_stop *stop, const mk_host *host, mk_error **err) {
    mk_cuda_state *s = (mk_cuda_state *)state;
    if (!s->loop_exec) return MK_STEPS_NO_LOOP;
    bool stopping = stop && stop->enabled;
    int64_t done = 0;
    host->progress(host, MK_PHASE_RUN, 0, steps);
    MK_CUDA_TRY(err, cudaSetDevice(s->device));
    /* the stream is idle here (every call ends in a sync): the slots are free */
    for (int i = 0; i < n_in; i++)
        if (in[i].bytes) memcpy(s->in_stage[i], in[i].host, in[i].bytes);
    while (done < steps) {
        if (host->cancelled(host)) return mk_cancelled(err, "evaluation");
        long long k = steps - done < s->ring_steps ? steps - done : s->ring_steps;
        *s->ctl_stage = (mk_step_ctl){.n = k, .stop = stopping,
                                      .stop_output = stopping ? (long long)stop->output : 0,
                                      .stop_value = stopping ? stop->value : 0};
        MK_CUDA_TRY(err, cudaGraphLaunch(s->loop_exec, s->stream));
        MK_CUDA_TRY(err, cudaStreamSynchronize(s->stream));
        if (s->timeline) mk_cuda_timeline_take(s);
        long long ran = s->ctl_stage->step;
        bool faulted = s->fault_stage->flag != 0;
        if (faulted) ran--; /* the faulting step's outputs are not given, as on the CPU */
        for (int o = 0; o < n_out; o++)
            memcpy((unsigned char *)out[o].host + (size_t)done * out[o].bytes, s->ring_out[o],
                   (size_t)ran * out[o].bytes);
        done += ran;
        if (faulted) return mk_cuda_fault_error(s->fault_stage, launches, n, err);
        host->progress(host, MK_PHASE_RUN, done, steps);
        if (stopping) {
            long long last;
            memcpy(&last, (unsigned char *)out[stop->output].host + (size_t)(done - 1) * 8, 8);
            if (last == stop->value) break;
        }
    }
    return done;
fail:
    cudaStreamSynchronize(s->stream);
    cudaGetLastError();
    return -1;
}

void mk_cuda_close_steps(mk_cuda_state *s) {
    if (s->loop_exec) cudaGraphExecDestroy(s->loop_exec);
    if (s->loop_graph) cudaGraphDestroy(s->loop_graph);
    if (s->ctl) cudaFree(s->ctl);
    if (s->snap) cudaFree(s->snap);
    if (s->ctl_stage) cudaFreeHost(s->ctl_stage);
    if (s->ring) cudaFreeHost(s->ring);
}
