/*
 * cuda_device.cu — the CUDA device table: per-model state (device 0, one
 * stream, a cuBLAS handle bound to it with its own workspace where the model
 * has products for cuBLAS, the error word),
 * device memory, pinned staging, and the CUDA graph every evaluation replays.
 *
 * Life of a CUDA model (model.c drives it through the plugin's device table):
 *   open      probe, stream, fault record
 *   alloc/upload/zero   the arena, constants and buffers (compile time only)
 *   prepare   one pinned block for every input, every output and the fault
 *             record; then the copies and every launch are captured once:
 *                 [inputs: pinned → device] → [clear fault] → launch 0 → …
 *                 → launch n-1 → [outputs → pinned] → [fault → pinned]
 *             and instantiated (cuda_graph.cu). Up to MK_STAGE_KERNEL_MAX
 *             staged bytes the copies are two kernels through the block's
 *             device mapping (one each end, the stage kernel below), not
 *             copy-engine nodes. A capture failure is an error, never a
 *             fallback to eager launches.
 *   evaluate  host → pinned (memcpy), one graph launch, then a wait: with
 *             stage kernels a spin on a pinned word the last one writes
 *             (a microsecond sooner than a stream sync), else a sync; then
 *             either the fault as MK_ERR_EVAL naming the node, or pinned →
 *             host (cuda_graph.cu). Nothing is allocated.
 *   close     everything above, in reverse.
 *
 * CUDA is initialised only by the probe and open, so loading the plugin on a
 * machine without a GPU costs nothing and the CPU device still works.
 *
 * The plugin's one exported symbol, mk_cuda_plugin_entry, is at the end: the
 * table core/plugin.c checks (abi, struct sizes) and takes the device, the
 * probe and the cuDNN hooks from.
 */
#include "cuda_device.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- copies as kernels ---------------------------------------------------- */

/* Every copy of c, the whole grid on each: 16-byte words where both ends
 * allow (slots and device buffers are aligned), then bytes. Launched with
 * programmatic dependent launch (mk_cuda_stage_launch), it waits for the
 * launch before and lets the next be scheduled at once. */
__global__ void mk_stage_kernel(mk_stage_copies c) {
    MK_PDL_WAIT;
    MK_PDL_START;
    unsigned long long t = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (int i = 0; i < c.n; i++) {
        unsigned char *d = c.dst[i];
        const unsigned char *s = c.src[i];
        unsigned long long n = c.bytes[i], words = 0;
        if (((unsigned long long)d | (unsigned long long)s) % 16 == 0) {
            words = n / 16;
            for (unsigned long long w = t; w < words; w += step)
                ((uint4 *)d)[w] = s ? ((const uint4 *)s)[w] : make_uint4(0, 0, 0, 0);
        }
        for (unsigned long long b = 16 * words + t; b < n; b += step) d[b] = s ? s[b] : 0;
    }
    if (c.done) { /* the host's done word, once every block's copies are visible to it */
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system();
            if (atomicAdd(&c.counts[0], 1u) == gridDim.x - 1) {
                c.counts[0] = 0;
                unsigned number = ++c.counts[1];
                __threadfence_system();
                *(volatile unsigned *)c.done = number;
            }
        }
    }
}

cudaLaunchConfig_t mk_cuda_launch_config(dim3 grid, dim3 block, cudaStream_t stream, bool pdl,
                                         cudaLaunchAttribute *attr) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.stream = stream;
    attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr->val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    return cfg;
}

bool mk_cuda_stage_launch(const mk_stage_copies *c, cudaStream_t stream, bool pdl) {
    if (c->n == 0) return true;
    unsigned long long most = 0;
    for (int i = 0; i < c->n; i++) most = c->bytes[i] > most ? c->bytes[i] : most;
    unsigned int blocks = (unsigned int)((most / 16 + 255) / 256);
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = mk_cuda_launch_config(dim3(blocks ? (blocks < 64 ? blocks : 64) : 1),
                                                   dim3(256), stream, pdl, &attr);
    return cudaLaunchKernelEx(&cfg, mk_stage_kernel, *c) == cudaSuccess &&
           cudaGetLastError() == cudaSuccess;
}

/* ---- errors ------------------------------------------------------------- */

int mk_cuda_fail_status(mk_error **err, cudaError_t status, const char *what,
                        const char *file, int line) {
    mk_error_code code =
        status == cudaErrorMemoryAllocation ? MK_ERR_NOMEM : MK_ERR_DEVICE;
    /* Clear the thread's last error so later launch checks see only their own. */
    cudaGetLastError();
    return mk_fail(err, code, 0, 0, "%s: %s (%s, %s:%d)", what, cudaGetErrorString(status),
                   cudaGetErrorName(status), file, line);
}

int mk_cuda_fail_blas(mk_error **err, cublasStatus_t status, const char *what,
                      const char *file, int line) {
    mk_error_code code = status == CUBLAS_STATUS_ALLOC_FAILED ? MK_ERR_NOMEM : MK_ERR_DEVICE;
    return mk_fail(err, code, 0, 0, "%s: %s (%s, %s:%d)", what, cublasGetStatusString(status),
                   cublasGetStatusName(status), file, line);
}

int mk_cuda_check_launch(const mk_launch *l, const char *kernel, mk_error **err) {
    cudaError_t status = cudaGetLastError();
    if (status == cudaSuccess) return 0;
    const mk_node *n = l->node;
    return mk_fail(err, MK_ERR_DEVICE, n->line, n->column, "%s: launching %s: %s (%s)",
                   n->op->name, kernel, cudaGetErrorString(status), cudaGetErrorName(status));
}

/* ---- probe -------------------------------------------------------------- */

/* A kernel that does nothing: probing for it tells whether this build's
 * machine code (or PTX) loads on the device; captured, it is a fence
 * (mk_cuda_capture_launches). */
static __global__ void mk_cuda_probe_kernel(void) {}

static void put_reason(char *reason, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void put_reason(char *reason, size_t size, const char *fmt, ...) {
    if (!reason || !size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, size, fmt, ap);
    va_end(ap);
}

/*
 * Whether CUDA can run here, and if not, which of four reasons: no driver at
 * all (libcuda.so.1 cannot be opened: the runtime calls that "driver version is
 * insufficient" too), a driver older than this build's runtime, no device, or a
 * device this build has no code for. A missing plugin is the core's reason
 * (core/plugin.c).
 */
static int cuda_probe(char *reason, size_t size) {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaErrorInsufficientDriver) {
        cudaGetLastError();
        void *libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        int driver = 0, runtime = 0;
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        if (!libcuda || driver == 0)
            put_reason(reason, size, "no NVIDIA driver found (libcuda.so.1 not loadable)");
        else
            put_reason(reason, size, "the NVIDIA driver is too old: it runs CUDA %d.%d, this "
                       "build's runtime needs CUDA %d.%d (update the driver)", driver / 1000,
                       driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
        if (libcuda) dlclose(libcuda);
        return 0;
    }
    if (status == cudaErrorNoDevice || (status == cudaSuccess && count < 1)) {
        cudaGetLastError();
        put_reason(reason, size, "the NVIDIA driver found no CUDA-capable device");
        return 0;
    }
    if (status != cudaSuccess) {
        cudaGetLastError();
        put_reason(reason, size, "cudaGetDeviceCount: %s", cudaGetErrorString(status));
        return 0;
    }
    cudaDeviceProp prop;
    status = cudaGetDeviceProperties(&prop, 0);
    if (status != cudaSuccess) {
        cudaGetLastError();
        put_reason(reason, size, "cudaGetDeviceProperties: %s", cudaGetErrorString(status));
        return 0;
    }
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(0);
    cudaFuncAttributes attr;
    status = cudaFuncGetAttributes(&attr, mk_cuda_probe_kernel);
    cudaSetDevice(previous);
    if (status != cudaSuccess) {
        cudaGetLastError();
        put_reason(reason, size, "device 0 (%s, compute capability %d.%d) cannot run this "
                   "build's kernels: %s", prop.name, prop.major, prop.minor,
                   cudaGetErrorString(status));
        return 0;
    }
    const char *forced = getenv("MK_CUDA_ARCH"); /* checked when a model's device opens */
    put_reason(reason, size, "%s (compute capability %d.%d%s%s%s)", prop.name, prop.major,
               prop.minor, forced && *forced ? "; MK_CUDA_ARCH=" : "", forced ? forced : "",
               forced && *forced ? " forces an older one's paths" : "");
    return 1;
}

/* ---- state -------------------------------------------------------------- */

static void cuda_close(void *state) {
    mk_cuda_state *s = (mk_cuda_state *)state;
    if (!s) return;
    cudaSetDevice(s->device);
    if (s->stream) cudaStreamSynchronize(s->stream);
    mk_cuda_close_steps(s);
    mk_cuda_timeline_close(s);
    mk_cuda_conv_close(s);
    if (s->exec) cudaGraphExecDestroy(s->exec);
    if (s->graph) cudaGraphDestroy(s->graph);
    if (s->blas) cublasDestroy(s->blas);
    if (s->blas_workspace) cudaFree(s->blas_workspace);
    if (s->fault) cudaFree(s->fault);
    if (s->done_counts) cudaFree(s->done_counts);
#ifdef MK_WITH_CUDNN
    for (int i = 0; i < s->n_cudnn; i++) mk_cudnn_group_release(s->cudnn[i]);
#endif
    free(s->cudnn);
    free(s->generated); /* the kernels stay cached for the process */
    if (s->pinned) cudaFreeHost(s->pinned);
    free(s->in_stage);
    free(s->out_stage);
    if (s->stream) cudaStreamDestroy(s->stream);
    cudaGetLastError();
    free(s);
}

/* s->arch: the device's compute capability, or MK_CUDA_ARCH's ("80" or
 * "sm_80"), which may only be older: the code paths of an older GPU run on a
 * newer one, not the other way. */
static int open_arch(mk_cuda_state *s, mk_error **err) {
    cudaDeviceProp prop;
    MK_CUDA_TRY(err, cudaGetDeviceProperties(&prop, s->device));
    s->arch = prop.major * 10 + prop.minor;
    {
        const char *forced = getenv("MK_CUDA_ARCH");
        if (!forced || !*forced) return 0;
        const char *digits = strncmp(forced, "sm_", 3) ? forced : forced + 3;
        char *end = NULL;
        long arch = strtol(digits, &end, 10);
        if (end == digits || *end || arch < 70 || arch > s->arch)
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0,
                           "MK_CUDA_ARCH=%s: not a compute capability from 70 to the "
                           "device's own %d (e.g. 80 for sm_80)", forced, s->arch);
        s->arch = (int)arch;
        s->arch_forced = true;
    }
    return 0;
fail:
    return -1;
}

static int cuda_open(void **state, mk_error **err) {
    *state = NULL;
    char reason[256];
    if (!cuda_probe(reason, sizeof reason))
        return mk_fail(err, MK_ERR_NO_DEVICE, 0, 0, "%s", reason);
    mk_cuda_state *s = (mk_cuda_state *)calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "cannot allocate the CUDA device state");
    s->device = 0;
    MK_CUDA_TRY(err, cudaSetDevice(s->device));
    if (open_arch(s, err)) goto fail;
    MK_CUDA_TRY(err, cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    MK_CUDA_TRY(err, cudaMalloc((void **)&s->fault, sizeof *s->fault));
    MK_CUDA_TRY(err, cudaMemset(s->fault, 0, sizeof *s->fault));
    *state = s;
    return 0;
fail:
    cuda_close(s);
    return -1;
}

static void *cuda_alloc(void *state, size_t bytes, mk_error **err) {
    mk_cuda_state *s = (mk_cuda_state *)state;
    void *p = NULL;
    cudaError_t status;
    if ((status = cudaSetDevice(s->device)) != cudaSuccess) {
        mk_cuda_fail_status(err, status, "cudaSetDevice", __FILE__, __LINE__);
        return NULL;
    }
    /* Round up to whole MK_ALIGN blocks: vector loads may touch the tail. */
    size_t size = bytes ? (bytes + MK_ALIGN - 1) / MK_ALIGN * MK_ALIGN : MK_ALIGN;
    status = size < bytes ? cudaErrorMemoryAllocation : cudaMalloc(&p, size);
    if (status != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky: the context stays usable */
        if (status == cudaErrorMemoryAllocation) {
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            cudaGetLastError();
            mk_fail(err, MK_ERR_NOMEM, 0, 0,
                    "cannot allocate %zu bytes of CUDA device memory (%zu of %zu free)", bytes,
                    free_b, total_b);
        } else {
            mk_cuda_fail_status(err, status, "cudaMalloc", __FILE__, __LINE__);
        }
        return NULL;
    }
    return p;
}

static void cuda_free(void *state, void *p) {
    (void)state;
    if (p) cudaFree(p);
}

static int cuda_upload(void *state, void *dst, const void *src, size_t bytes, mk_error **err) {
    mk_cuda_state *s = (mk_cuda_state *)state;
    if (!bytes) return 0;
    MK_CUDA_TRY(err, cudaSetDevice(s->device));
    MK_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s->stream));
    MK_CUDA_TRY(err, cudaStreamSynchronize(s->stream));
    return 0;
fail:
    return -1;
}

static int cuda_zero(void *state, void *dst, size_t bytes, mk_error **err) {
    mk_cuda_state *s = (mk_cuda_state *)state;
    if (!bytes) return 0;
    MK_CUDA_TRY(err, cudaSetDevice(s->device));
    MK_CUDA_TRY(err, cudaMemsetAsync(dst, 0, bytes, s->stream));
    MK_CUDA_TRY(err, cudaStreamSynchronize(s->stream));
    return 0;
fail:
    return -1;
}

/* ---- the model's device memory, asked before the planner runs ---------------- */

/* mk_device_ops.launch_memory: a matrix-vector or attention group keeps its
 * partial results, keys and counts (zero between launches) as state; a
 * replacement that may lie inside the x it replaces rows of is copied aside
 * into scratch first (gather.cu), as the CPU's memmove would. */
static void cuda_launch_memory(const mk_node *n, size_t *scratch, size_t *state) {
    const mk_product_group *pg = mk_node_product(n);
    *scratch = *state = 0;
    if (pg) *state = mk_codegen_group_aux_bytes(pg);
    if (n->op->kernel == MK_KERNEL_MATMUL) {
        size_t need = mk_cuda_split_bytes(n), have = n->op->scratch ? n->op->scratch(n) : 0;
        *scratch = need > have ? need - have : 0;
    }
    if ((n->op->kernel == MK_KERNEL_REPLACE_SLICE || n->op->kernel == MK_KERNEL_REPLACE_AT) &&
        n->in[1]->owner == n->in[0]->owner)
        *scratch = mk_node_bytes(n->in[1]);
}

/* mk_device_ops.model_memory: what open and prepare allocate for the model,
 * as they allocate it (the driver rounds each allocation up further). */
static size_t cuda_model_memory(const mk_graph *g) {
    size_t bytes = sizeof(mk_fault_rec) + 2 * sizeof(unsigned); /* fault record, done counts */
    bool blas = false;
    for (int i = 0; i < g->n_nodes; i++) blas = blas || mk_cuda_uses_blas(g->nodes[i]);
    if (blas) bytes += MK_BLAS_WORKSPACE;
    if (g->n_next) { /* the step loop: its control word and each fed output's snapshot */
        bytes += sizeof(mk_step_ctl);
        for (int o = 0; o < g->n_outputs; o++) {
            bool feeds = false;
            for (int r = 0; r < g->n_next; r++) feeds = feeds || g->next[r].output == o;
            if (feeds) bytes += (mk_node_bytes(g->outputs[o]) + 255) / 256 * 256;
        }
    }
    return bytes;
}

/* ---- the kernels ---------------------------------------------------------- */

#define F32 MK_DTYPE_BIT(MK_DTYPE_FLOAT32)
#define I64 MK_DTYPE_BIT(MK_DTYPE_INT64)
#define F16 MK_DTYPE_BIT(MK_DTYPE_FLOAT16)
#define BF16 MK_DTYPE_BIT(MK_DTYPE_BFLOAT16)

/* The kernels, indexed by mk_kernel_id, and the dtypes each takes (model.c
 * checks every launch's operands and result against them at compile time). */
struct cuda_kernel_table {
    mk_kernel k[MK_KERNEL_COUNT];
    constexpr cuda_kernel_table() : k() {
        /* every family set, so a family without a CUDA kernel is {NULL, 0}: GCC
         * takes a constexpr table only when each element was written */
        for (mk_kernel &e : k) e = {NULL, 0};
        k[MK_KERNEL_POINTWISE] = {mk_cuda_pointwise, F32 | I64 | MK_DTYPE_BIT(MK_DTYPE_BOOL)};
        k[MK_KERNEL_MATMUL] = {mk_cuda_matmul, F32 | F16 | BF16};           /* a, out: float32 */
        k[MK_KERNEL_PERMUTE] = {mk_cuda_permute, MK_DTYPES_ALL};
        k[MK_KERNEL_REPLACE_SLICE] = {mk_cuda_replace_slice, MK_DTYPES_ALL};
        k[MK_KERNEL_REPLACE_AT] = {mk_cuda_replace_at, MK_DTYPES_ALL};     /* index: int64 */
        k[MK_KERNEL_RMS_NORM] = {mk_cuda_rms_norm, F32};
        k[MK_KERNEL_COMPLEX_MUL] = {mk_cuda_complex_mul, F32};
        k[MK_KERNEL_SLICED_SOFTMAX] = {mk_cuda_sliced_softmax, F32};       /* the prefix: a bound */
        k[MK_KERNEL_CAUSAL_SOFTMAX] = {mk_cuda_causal_softmax, F32};       /* the end: a bound */
        k[MK_KERNEL_EMBEDDING] = {mk_cuda_embedding, MK_DTYPES_ALL};       /* ids: int64 */
        k[MK_KERNEL_ARGMAX] = {mk_cuda_argmax, F32 | I64};                 /* int64: the result */
        k[MK_KERNEL_PRODUCT] = {mk_cuda_product, F32 | I64 | F16 | BF16 | MK_DTYPE_BIT(MK_DTYPE_INT8)};
        /* int64: row bounds; float16, bfloat16, int8: weights */
        k[MK_KERNEL_PREFIX_MATMUL] = {mk_cuda_prefix_matmul, F32};         /* the prefix: a bound */
        k[MK_KERNEL_CAST] = {mk_cuda_cast, MK_DTYPES_ALL};
        k[MK_KERNEL_DEQUANTIZE] = {mk_cuda_dequantize, F32 | MK_DTYPE_BIT(MK_DTYPE_INT8)};
        k[MK_KERNEL_FAKE_QUANTIZE] = {mk_cuda_fake_quantize, F32};
        k[MK_KERNEL_SAMPLE] = {mk_cuda_sample, F32 | I64};                 /* int64: state, result */
        /* shape and data movement (move.cu): every dtype; pad's value float32, indices int64 */
        k[MK_KERNEL_CONCAT] = {mk_cuda_concat, MK_DTYPES_ALL};
        k[MK_KERNEL_TILE] = {mk_cuda_index_map, MK_DTYPES_ALL};
        k[MK_KERNEL_REPEAT_INTERLEAVE] = {mk_cuda_index_map, MK_DTYPES_ALL};
        k[MK_KERNEL_PAD] = {mk_cuda_index_map, MK_DTYPES_ALL};
        k[MK_KERNEL_FLIP] = {mk_cuda_index_map, MK_DTYPES_ALL};
        k[MK_KERNEL_GATHER_ELEMENTS] = {mk_cuda_gather_elements, MK_DTYPES_ALL};
        k[MK_KERNEL_INDEX_SELECT] = {mk_cuda_index_select, MK_DTYPES_ALL};
        k[MK_KERNEL_CUMSUM] = {mk_cuda_cumsum, F32 | I64};
        /* convolution and pooling (conv.cu) */
        k[MK_KERNEL_CONV] = {mk_cuda_conv, F32};
        k[MK_KERNEL_CONV_TRANSPOSE] = {mk_cuda_conv, F32};
        k[MK_KERNEL_MAX_POOL] = {mk_cuda_max_pool, F32};
        k[MK_KERNEL_AVG_POOL] = {mk_cuda_avg_pool, F32};
        k[MK_KERNEL_ADAPTIVE_AVG_POOL] = {mk_cuda_adaptive_avg_pool, F32};
        k[MK_KERNEL_UPSAMPLE_NEAREST] = {mk_cuda_upsample_nearest, F32};
        /* reductions and norms (reduce.cu): float32; argmax, argmin: int64 out */
        k[MK_KERNEL_REDUCE_SUM] = {mk_cuda_reduce_sum, F32};
        k[MK_KERNEL_REDUCE_MEAN] = {mk_cuda_reduce_mean, F32};
        k[MK_KERNEL_REDUCE_MAX] = {mk_cuda_reduce_max, F32};
        k[MK_KERNEL_REDUCE_MIN] = {mk_cuda_reduce_min, F32};
        k[MK_KERNEL_REDUCE_PROD] = {mk_cuda_reduce_prod, F32};
        k[MK_KERNEL_REDUCE_VAR] = {mk_cuda_reduce_var, F32};
        k[MK_KERNEL_ARGMAX_AXIS] = {mk_cuda_argmax_axis, F32 | I64};
        k[MK_KERNEL_ARGMIN_AXIS] = {mk_cuda_argmin_axis, F32 | I64};
        k[MK_KERNEL_SOFTMAX] = {mk_cuda_softmax, F32};
        k[MK_KERNEL_LOG_SOFTMAX] = {mk_cuda_log_softmax, F32};
        k[MK_KERNEL_LAYER_NORM] = {mk_cuda_layer_norm, F32};
        k[MK_KERNEL_GROUP_NORM] = {mk_cuda_group_norm, F32};
        k[MK_KERNEL_BATCH_NORM] = {mk_cuda_batch_norm, F32};
        k[MK_KERNEL_RMS_NORM_EPS] = {mk_cuda_rms_norm_eps, F32};
        k[MK_KERNEL_ROWS_GROUP] = {mk_cuda_rows_group, F32}; /* generated (codegen/rows.c) */
#ifdef MK_WITH_CUDNN
        k[MK_KERNEL_CUDNN_GROUP] = {mk_cuda_cudnn_group, F32};
#else
        k[MK_KERNEL_CUDNN_GROUP] = {NULL, 0}; /* CUDNN=0: no fused groups */
#endif
    }
};
static constexpr cuda_kernel_table cuda_kernels;

/* ---- capture: every launch, and the fences a library's launch needs -------- */

/*
 * Our kernels let the launch after them start early (griddepcontrol.
 * launch_dependents at their start: the stage kernel, generated kernels,
 * gathers, the sampler), for kernels of ours that wait for them
 * (griddepcontrol.wait) before they read. What ours load before their wait
 * and keep (constant weights, a buffer's rows that no launch before writes)
 * is never an input's, whose stage kernel may still be copying it in: an
 * attention group that loaded an input cache's rows early read the evaluation
 * before's (product.c's early_rows). Only a hint checked after the wait (the
 * attention's p) may be. At their start, not after their wait: so the
 * launches two ahead load their weights while the attention runs
 * (doc/performance.md, "Launches and dependencies").
 * A library's launch (cuBLAS, cuDNN)
 * launches its kernels as it pleases: seen with cuDNN 9.14, engine 4 of a
 * batch of 2 read its operands before the stage kernel before it had copied
 * them, so a model's first evaluation was wrong and the next right
 * (cudnn_test's test_batched_pairs). So a library's launch that follows a
 * kernel of ours is fenced: the probe's empty kernel goes between them,
 * launched without the attribute, so it starts once ours has ended and lets
 * nothing start before it has. Ours may be one that triggers nothing (a fence
 * more than needed, but no list to keep of which of ours trigger early); a
 * library's launch after a library's is the library's affair. Decoding has
 * no fenced launch (all its launches are ours).
 *
 * A launch per group, each waiting for the one before, rather than one
 * persistent kernel whose phases meet at grid barriers: a dependent step
 * costs about as much however it is made, and a launch with PDL is the
 * cheapest way (doc/performance.md, "Launches and dependencies").
 */
static bool library_launch(const mk_launch *l) {
    mk_kernel_id id = l->node->op->kernel;
    return id == MK_KERNEL_MATMUL || id == MK_KERNEL_CUDNN_GROUP;
}

int mk_cuda_capture_launches(const mk_launch *launches, int n, bool after_ours, mk_error **err) {
    for (int i = 0; i < n; i++) {
        const mk_launch *l = &launches[i];
        /* model.c bound only launches whose kernel this table has (and whose dtypes it takes) */
        mk_kernel_id id = l->node->op->kernel;
        mk_kernel_fn kernel = (unsigned)id < MK_KERNEL_COUNT ? cuda_kernels.k[id].fn : NULL;
        if (!kernel) {
            MK_INTERNAL(err, "a launch whose kernel the CUDA device does not have");
            return i;
        }
        if (after_ours && library_launch(l)) {
            mk_cuda_probe_kernel<<<1, 32, 0, mk_cuda_state_of(l)->stream>>>();
            if (mk_cuda_check_launch(l, "fence", err)) return i;
        }
        if (kernel(l, err) != 0) return i;
        after_ours = !library_launch(l);
    }
    return -1;
}

/* ---- the device table and the plugin's entry ---------------------------------- */

#ifdef MK_WITH_CUDNN
#define CUDNN_GROUPS true /* prepare compiles their plans (prepare_cudnn) */
#else
#define CUDNN_GROUPS false
#endif

/* int8_products: the generated matrix-vector kernels make A's int8 values and
 * scales in static shared memory (core/codegen/matvec_step.c's put_grid_copy); they read
 * weights by columns only (row_products false); row groups are generated kernels; no
 * convolution groups; matrix-vector groups of up to MK_MATVEC_ROWS_MAX rows (a batch's
 * 16 slots reading each weight once: doc/performance.md, "Batched decoding") */
static const mk_device_ops cuda_device = {
    "cuda",       cuda_kernels.k,
    {MK_CUDA_POINTWISE_OPERANDS, 32768, false, CUDNN_GROUPS, true, false, MK_MATVEC_ROWS_MAX},
    cuda_launch_memory, cuda_model_memory,
    cuda_open,    cuda_close,     cuda_alloc, cuda_free, cuda_upload,
    cuda_zero,    mk_cuda_prepare, mk_cuda_evaluate, mk_cuda_run_steps,
};

static const mk_cuda_plugin plugin = {
    MK_CUDA_PLUGIN_ABI,
    MK_ABI_SIZES,
    &cuda_device,
    cuda_probe,
#ifdef MK_WITH_CUDNN
    mk_cudnn_cache_free,
#else
    NULL,
#endif
    mk_cuda_generate_check,
};

/* The plugin's only exported symbol (kernels/plugin.map), MK_CUDA_PLUGIN_ENTRY. */
extern "C" MK_API const mk_cuda_plugin *mk_cuda_plugin_entry(void) { return &plugin; }
