/*
 * device.c — the CPU device: its table of kernels (ops.c, matmul.c,
 * groups.c) and of memory functions (host memory, aligned), the cost rule
 * that decides at compile which launches may use threads, and the evaluation
 * loop that runs a model's launches in order.
 */
#include "cpu.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int mk_cpu_online = 1;

/* cpu.h's max_threads() reads it; cpu_evaluate sets it per launch. */
_Thread_local int mk_cpu_launch_threads __attribute__((tls_model("local-dynamic"))) = 0;

/* ---- the cost rule for threads ------------------------------------------ */

/*
 * The cost rule for threads. A parallel region costs a fork and a join;
 * splitting a launch over T threads saves at most (1 - 1/T) of its time, so
 * it pays only when the launch alone takes longer than twice the fork. The
 * fork is taken to cost CPU_FORK_NS, a fixed wake cost: timing forks at the
 * first compile cost every process far more than it saved (doc/performance.md,
 * "CPU: frame times"). How long a launch takes is estimated from the bytes it
 * reads and writes: at the rate a thread reads a hot matrix (read once per
 * process, the best of six mk_cpu_mv_columns over 128 KiB) when
 * the model's constants fit in its threads' own caches (L2 times threads),
 * so that they stay hot between evaluations (a game's policy net: one
 * thread); otherwise its weights stream from the shared cache or memory,
 * which more threads read faster, and the launch may fork whenever its work
 * reaches CPU_PAR_MIN (a language model). Not the last-level cache: shared
 * with every other core and process, and what a VM reports for it can be
 * the whole host's.
 *
 * A model compiled with `threads = n` (mk_compile_options) caps every launch
 * at n threads; 1 opens no parallel region at all. MK_CPU_FORK=always lets
 * every launch fork up to that cap (the C tests set it, so that their small
 * graphs run the threaded paths); MK_CPU_FORK=never keeps every launch on the
 * calling thread.
 */
#define CPU_FORK_NS 50e3

static struct {
    double hot_bytes_ns; /* one thread reading a matrix held in cache */
    double l2_bytes;     /* one thread's own cache */
    int rule;            /* MK_CPU_FORK: 0 auto (the rule), 1 always, -1 never */
} cpu_cost;
static pthread_once_t cpu_cost_once = PTHREAD_ONCE_INIT;

static void cpu_calibrate(void) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    mk_cpu_online = cpus > 1 ? (cpus < INT_MAX ? (int)cpus : INT_MAX) : 1;
    const char *rule = getenv("MK_CPU_FORK");
    cpu_cost.rule = !rule ? 0 : !strcmp(rule, "always") ? 1 : !strcmp(rule, "never") ? -1 : 0;
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    cpu_cost.l2_bytes = l2 > 0 ? (double)l2 : 1024.0 * 1024;
    cpu_cost.hot_bytes_ns = 1.0;
    enum { K = 256, N = 128 };
    float *b = malloc((size_t)(K * N + K + N) * sizeof(float));
    if (!b) return;
    for (int i = 0; i < K * N + K; i++) b[i] = (float)(i % 7) * 0.125f;
    double best = INFINITY;
    for (int r = 0; r < 6; r++) {
        double t0 = mk_now_ms();
        mk_cpu_mv_columns(b + K * N,
                          &(cpu_weights){.data = b, .dtype = MK_DTYPE_FLOAT32, .ldb = K}, K, 0,
                          N, b + K * N + K);
        double ns = (mk_now_ms() - t0) * 1e6;
        if (ns < best) best = ns;
    }
    free(b);
    cpu_cost.hot_bytes_ns = (double)K * N * sizeof(float) / (best > 1.0 ? best : 1.0);
}

/* ---- the device's functions -------------------------------------------- */


static int cpu_open(void **state, mk_error **err) {
    cpu_state *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "the CPU device's state");
    *state = s;
    return 0;
}

static void cpu_close(void *state) {
    cpu_state *s = state;
    if (s) {
        free(s->threads);
        mk_cpu_conv_free(s);
    }
    free(s);
}

static void *cpu_alloc(void *state, size_t bytes, mk_error **err) {
    (void)state;
    /* Whole MK_ALIGN blocks, so vector loops may read the tail of the last one. */
    size_t size = bytes ? (bytes + MK_ALIGN - 1) / MK_ALIGN * MK_ALIGN : MK_ALIGN;
    void *p = NULL;
    if (size < bytes || posix_memalign(&p, MK_ALIGN, size) != 0) {
        long pages = sysconf(_SC_AVPHYS_PAGES), total = sysconf(_SC_PHYS_PAGES);
        long page = sysconf(_SC_PAGESIZE);
        mk_fail(err, MK_ERR_NOMEM, 0, 0,
                "cannot allocate %zu bytes of CPU memory (%lld of %lld bytes of RAM free)", bytes,
                (long long)pages * page, (long long)total * page);
        return NULL;
    }
    return p;
}

static void cpu_free(void *state, void *p) {
    (void)state;
    free(p);
}

static int cpu_upload(void *state, void *dst, const void *src, size_t bytes, mk_error **err) {
    (void)state, (void)err;
    if (bytes)
        memcpy(dst, src, bytes);
    return 0;
}

static int cpu_zero(void *state, void *dst, size_t bytes, mk_error **err) {
    (void)state, (void)err;
    if (bytes)
        memset(dst, 0, bytes);
    return 0;
}

static size_t tensor_bytes(const mk_tensor *t) {
    return (size_t)mk_tensor_numel(t) * mk_dtype_size(t->dtype);
}

/* The cost rule above, per launch. */
static int cpu_prepare(void *state, const mk_launch *launches, int n, const mk_copy *in,
                       int n_in, const mk_copy *out, int n_out, const mk_step_rule *rules,
                       int n_rules, const mk_host *host, mk_error **err) {
    (void)in, (void)n_in, (void)out, (void)n_out, (void)rules, (void)n_rules;
    cpu_state *s = state;
    int asked = host->opts ? host->opts->threads : 0;
    if (asked < 0)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0,
                       "threads must be 0 (the default) or a positive count, got %d", asked);
    pthread_once(&cpu_cost_once, cpu_calibrate);
    /* the process's count, whatever launch this thread may be inside of (a
     * compile from a host function of an evaluation) */
    int outer = mk_cpu_launch_threads;
    mk_cpu_launch_threads = 0;
    int cap = max_threads();
    mk_cpu_launch_threads = outer;
    if (asked > 0 && asked < cap) cap = asked;
    for (int i = 0; i < n; i++) {
        int kernel = launches[i].node->op->kernel;
        bool conv = kernel == MK_KERNEL_CONV || kernel == MK_KERNEL_CONV_TRANSPOSE;
        if (!conv && ((kernel != MK_KERNEL_MATMUL && kernel != MK_KERNEL_PREFIX_MATMUL) ||
                      !mk_cpu_blas_needed(&launches[i])))
            continue;
        const char *why = mk_cpu_blas_open();
        if (why)
            return mk_fail(err, MK_ERR_DEVICE, launches[i].node->line, launches[i].node->column,
                           "%s $%d: the CPU's matrix products need OpenBLAS, which cannot be "
                           "opened: %s",
                           launches[i].node->op->name, launches[i].node->id, why);
        break;
    }
    /* the constants' bytes, each counted once (by its owner) */
    double constants = 0.0;
    const mk_node **seen = calloc((size_t)n * MK_MAX_INPUTS + 1, sizeof *seen);
    free(s->threads);
    mk_cpu_conv_free(s);
    s->n = n;
    if (!seen || !(s->threads = calloc((size_t)n + 1, sizeof *s->threads))) {
        free(seen);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "the CPU device's launch plan");
    }
    int n_seen = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < launches[i].node->n_in; k++) {
            const mk_node *x = launches[i].node->in[k];
            const mk_node *o = x->owner ? x->owner : x;
            if (o->storage != MK_STORAGE_CONSTANT) continue;
            bool known = false;
            for (int q = 0; q < n_seen && !known; q++) known = seen[q] == o;
            if (!known) seen[n_seen++] = o, constants += (double)mk_node_bytes(o);
        }
    free(seen);
    double cache_bytes = cpu_cost.l2_bytes * cap;
    bool hot = constants <= cache_bytes;
    int forks = 0;
    for (int i = 0; i < n; i++) {
        const mk_launch *l = &launches[i];
        double bytes = (double)tensor_bytes(&l->out);
        for (int k = 0; k < l->n_in; k++) bytes += (double)tensor_bytes(&l->in[k]);
        bool fork = cap > 1 && (cpu_cost.rule > 0 ||
                                (cpu_cost.rule == 0 &&
                                 (!hot || bytes / cpu_cost.hot_bytes_ns > 2 * CPU_FORK_NS)));
        s->threads[i] = fork ? cap : 1;
        forks += fork;
    }
    if (mk_cpu_conv_prepare(s, launches, n, host)) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "the CPU's convolution plans");
    if (asked == 1)
        host->log(host, MK_LOG_INFO,
                  "cpu: 0 of %d launches may use threads (the model's threads = 1: no parallel "
                  "region)", n);
    else if (cap > 1)
        host->log(host, MK_LOG_INFO,
                  "cpu: %d of %d launches may use %d threads (constants %.1f MB, %s the threads' "
                  "%.1f MB of L2; a fork is taken to cost %.0f us, a hot matrix reads at %.0f "
                  "GB/s)",
                  forks, n, cap, constants / 1e6, hot ? "within" : "beyond", cache_bytes / 1e6,
                  CPU_FORK_NS / 1e3, cpu_cost.hot_bytes_ns);
    return 0;
}

/* Inputs in, every launch in order (stopping at the first failure, or where the
 * host cancels: checked between launches), the output out. */
static int cpu_evaluate(void *state, const mk_launch *launches, int n, const mk_copy *in,
                        int n_in, const mk_copy *out, int n_out, const mk_host *host,
                        mk_error **err) {
    const cpu_state *s = state;
    for (int i = 0; i < n_in; i++)
        if (in[i].bytes && in[i].device != in[i].host)
            memcpy(in[i].device, in[i].host, in[i].bytes);
    for (int i = 0; i < n; i++) {
        const mk_launch *l = &launches[i];
        if (host->cancelled(host))
            return mk_cancelled(err, "evaluation");
        mk_cpu_launch_threads = s->threads ? s->threads[i] : 0;
        int rc = mk_cpu_device.kernels[l->node->op->kernel].fn(l, err);
        mk_cpu_launch_threads = 0;
        if (rc != 0)
            return -1;
        host->progress(host, MK_PHASE_RUN, i + 1, n);
    }
    for (int o = 0; o < n_out; o++)
        if (out[o].bytes && out[o].device != out[o].host)
            memcpy(out[o].host, out[o].device, out[o].bytes);
    return 0;
}

/* ---- the table ---------------------------------------------------------- */

#define F32 MK_DTYPE_BIT(MK_DTYPE_FLOAT32)
#define I64 MK_DTYPE_BIT(MK_DTYPE_INT64)
#define F16 MK_DTYPE_BIT(MK_DTYPE_FLOAT16)
#define BF16 MK_DTYPE_BIT(MK_DTYPE_BFLOAT16)
/* Indexed by kernel family; the dtypes are those of every data operand and the
 * result (argmax: float32 in, int64 out; embedding: int64 ids). */
static const mk_kernel cpu_kernels[MK_KERNEL_COUNT] = {
    [MK_KERNEL_POINTWISE] = {mk_cpu_pointwise, F32 | I64 | MK_DTYPE_BIT(MK_DTYPE_BOOL)},
    [MK_KERNEL_MATMUL] = {mk_cpu_matmul, F32 | F16 | BF16}, /* a and out float32 (the op's rule) */
    [MK_KERNEL_PERMUTE] = {mk_cpu_permute, MK_DTYPES_ALL},
    [MK_KERNEL_REPLACE_SLICE] = {mk_cpu_replace_slice, MK_DTYPES_ALL},
    [MK_KERNEL_RMS_NORM] = {mk_cpu_rms_norm, F32},
    [MK_KERNEL_COMPLEX_MUL] = {mk_cpu_complex_mul, F32},
    [MK_KERNEL_SLICED_SOFTMAX] = {mk_cpu_sliced_softmax, F32},
    [MK_KERNEL_CAUSAL_SOFTMAX] = {mk_cpu_causal_softmax, F32},
    [MK_KERNEL_EMBEDDING] = {mk_cpu_embedding, MK_DTYPES_ALL},
    [MK_KERNEL_ARGMAX] = {mk_cpu_argmax, F32 | I64},
    [MK_KERNEL_PRODUCT] = {mk_cpu_product, F32 | I64 | F16 | BF16 | MK_DTYPE_BIT(MK_DTYPE_INT8)},
    [MK_KERNEL_PREFIX_MATMUL] = {mk_cpu_prefix_matmul, F32}, /* the prefix: a bound */
    [MK_KERNEL_CAST] = {mk_cpu_cast, MK_DTYPES_ALL},
    [MK_KERNEL_DEQUANTIZE] = {mk_cpu_dequantize, F32 | MK_DTYPE_BIT(MK_DTYPE_INT8)},
    [MK_KERNEL_FAKE_QUANTIZE] = {mk_cpu_fake_quantize, F32},
    [MK_KERNEL_SAMPLE] = {mk_cpu_sample, F32 | I64},
    /* shape and data movement (move.c): every dtype moves as bytes; pad's value float32 */
    [MK_KERNEL_CONCAT] = {mk_cpu_concat, MK_DTYPES_ALL},
    [MK_KERNEL_TILE] = {mk_cpu_index_map, MK_DTYPES_ALL},
    [MK_KERNEL_REPEAT_INTERLEAVE] = {mk_cpu_index_map, MK_DTYPES_ALL},
    [MK_KERNEL_PAD] = {mk_cpu_index_map, MK_DTYPES_ALL},
    [MK_KERNEL_FLIP] = {mk_cpu_index_map, MK_DTYPES_ALL},
    [MK_KERNEL_GATHER_ELEMENTS] = {mk_cpu_gather_elements, MK_DTYPES_ALL}, /* index: int64 */
    [MK_KERNEL_INDEX_SELECT] = {mk_cpu_index_select, MK_DTYPES_ALL},       /* index: int64 */
    [MK_KERNEL_CUMSUM] = {mk_cpu_cumsum, F32 | I64},
    [MK_KERNEL_REPLACE_AT] = {mk_cpu_replace_at, MK_DTYPES_ALL}, /* index: int64 */
    /* reductions and norms (reduce.c): float32; argmax, argmin: int64 out */
    [MK_KERNEL_REDUCE_SUM] = {mk_cpu_reduce_sum, F32},
    [MK_KERNEL_REDUCE_MEAN] = {mk_cpu_reduce_mean, F32},
    [MK_KERNEL_REDUCE_MAX] = {mk_cpu_reduce_max, F32},
    [MK_KERNEL_REDUCE_MIN] = {mk_cpu_reduce_min, F32},
    [MK_KERNEL_REDUCE_PROD] = {mk_cpu_reduce_prod, F32},
    [MK_KERNEL_REDUCE_VAR] = {mk_cpu_reduce_var, F32},
    [MK_KERNEL_ARGMAX_AXIS] = {mk_cpu_argmax_axis, F32 | I64},
    [MK_KERNEL_ARGMIN_AXIS] = {mk_cpu_argmin_axis, F32 | I64},
    [MK_KERNEL_SOFTMAX] = {mk_cpu_softmax, F32},
    [MK_KERNEL_LOG_SOFTMAX] = {mk_cpu_log_softmax, F32},
    [MK_KERNEL_LAYER_NORM] = {mk_cpu_layer_norm, F32},
    [MK_KERNEL_GROUP_NORM] = {mk_cpu_group_norm, F32},
    [MK_KERNEL_BATCH_NORM] = {mk_cpu_batch_norm, F32},
    [MK_KERNEL_RMS_NORM_EPS] = {mk_cpu_rms_norm_eps, F32},
    /* convolution and pooling (conv.c) */
    [MK_KERNEL_CONV] = {mk_cpu_conv, F32},
    [MK_KERNEL_CONV_TRANSPOSE] = {mk_cpu_conv_transpose, F32},
    [MK_KERNEL_MAX_POOL] = {mk_cpu_max_pool, F32},
    [MK_KERNEL_AVG_POOL] = {mk_cpu_avg_pool, F32},
    [MK_KERNEL_ADAPTIVE_AVG_POOL] = {mk_cpu_adaptive_avg_pool, F32},
    [MK_KERNEL_UPSAMPLE_NEAREST] = {mk_cpu_upsample_nearest, F32},
    [MK_KERNEL_ROWS_GROUP] = {mk_cpu_rows_group, F32},
    [MK_KERNEL_CONV_GROUP] = {mk_cpu_conv_group, F32},
};

const mk_device_ops mk_cpu_device = {
    .name = "cpu",
    .kernels = cpu_kernels,
    .target = {.matvec_rows = MK_MATVEC_ROWS, .pointwise_operands = MK_X_IN,
               .int8_products = INT64_MAX, .row_products = true,
               .row_groups = true, .conv_groups = true, .causal_attention = true},
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .zero = cpu_zero,
    .prepare = cpu_prepare,
    .evaluate = cpu_evaluate,
};
