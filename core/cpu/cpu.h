/*
 * cpu.h — what the CPU device's files share (device.c: the device table and
 * the cost rule for threads; ops.c: single-op kernels; matmul.c: matrix
 * products; groups.c: product groups; vec.h: vector helpers): the thread
 * helpers, the row functions a group runs as its nodes alone do (so it equals
 * them bit for bit), and the kernels the device table lists. Names shared
 * between files carry mk_cpu_ (a host linking the static library sees them);
 * the rest stay static. Tested through the public API against double-precision
 * loops:
 *   make build/tests/ops_test && ./build/tests/ops_test
 */
#ifndef MK_CPU_H
#define MK_CPU_H

#include "conv.h"
#include "device.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Shared between this folder's files only: bound inside the library. */
#pragma GCC visibility push(hidden)

/* Below this many elements a launch runs on the calling thread. */
#define CPU_PAR_MIN 32768
/* Elementwise work is split into tiles of at most this many elements. */
#define CPU_TILE 8192
/*
 * Columns a matrix–vector group (and matmul.c's mv_omp) computes together:
 * per chunk, every row of A in turn, so the chunk's weights are read from
 * memory once and from cache for the other rows. A multiple of 4
 * (mk_cpu_mv_columns_q8's quads) and of mk_cpu_mv_rows' block.
 */
#define CPU_MV_CHUNK 256

/* ---- threads ------------------------------------------------------------ */

static inline int64_t read_i64(const mk_tensor *t) { return *(const int64_t *)t->data; }
/* Prefix bound k of launch l: int64 [1], or [N], one value a run of the
 * first axis (ops_rules.c's need_bounds). Its values and count, each checked
 * within [0, hi] (else MK_FAULT_PREFIX). */
int mk_cpu_prefixes(const mk_launch *l, int k, int64_t hi, const int64_t **p, int64_t *count,
                    mk_error **err);

/* Inside a parallel region: this thread's part [*lo, *hi) of n items, in
 * contiguous runs in thread order (thread 0 first). */
static inline void my_share(int64_t n, int64_t *lo, int64_t *hi) {
#ifdef _OPENMP
    int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
#else
    int64_t t = 0, threads = 1;
#endif
    *lo = n * t / threads;
    *hi = n * (t + 1) / threads;
}

/* The CPUs online: device.c's calibration sets it at the first compile, before
 * any launch runs (1 until then). */
extern int mk_cpu_online;

/*
 * The launch running on this thread: the most threads its parallel regions
 * may take (device.c's cpu_evaluate sets it per launch from the model's cost
 * rule and its `threads` option; 1: the launch opens no region; 0 outside a
 * launch: no cap). Local-dynamic, as a static variable's access is: it is
 * the library's own.
 */
extern _Thread_local int mk_cpu_launch_threads __attribute__((tls_model("local-dynamic")));

/*
 * The threads a parallel region asks for: OpenMP's count for the calling
 * thread (OMP_NUM_THREADS, omp_set_num_threads), at most the CPUs online and
 * at most the launch's cap. libgomp ends the whole process when it cannot
 * create a team's threads, so a count no machine holds (OMP_NUM_THREADS=60000)
 * must never reach it: every region names this count (num_threads), and a
 * table per thread is this long.
 */
static inline int max_threads(void) {
#ifdef _OPENMP
    int t = omp_get_max_threads();
    if (t > mk_cpu_online) t = mk_cpu_online;
    if (mk_cpu_launch_threads > 0 && t > mk_cpu_launch_threads) t = mk_cpu_launch_threads;
    return t;
#else
    return 1;
#endif
}

static inline int thread_index(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Whether `work` (elements, or multiply-adds) is worth a parallel region: the
 * work is at least CPU_PAR_MIN and the launch may use another thread to share
 * it (a region of one thread still pays libgomp's fork and join). */
static inline bool par(int64_t work) {
    return work >= CPU_PAR_MIN && max_threads() > 1;
}

/*
 * for (int64_t I = 0; I < N; I++) BODY, the iterations split among the threads
 * (static schedule) where COND holds, else a plain loop on the calling thread.
 * Not `#pragma omp parallel for if (COND)`: with its condition false that
 * still enters libgomp, which costs more than a small launch's work.
 * CPU_REGION is the same for a parallel block whose threads take their parts
 * with my_share.
 */
#define CPU_FOR(COND, I, N, ...)                                                           \
    do {                                                                                   \
        if (COND) {                                                                        \
            _Pragma("omp parallel for schedule(static) num_threads(max_threads())")        \
            for (int64_t I = 0; I < (N); I++) __VA_ARGS__                                  \
        } else {                                                                           \
            for (int64_t I = 0; I < (N); I++) __VA_ARGS__                                  \
        }                                                                                  \
    } while (0)
#define CPU_REGION(COND, ...)                                                              \
    do {                                                                                   \
        if (COND) {                                                                        \
            _Pragma("omp parallel num_threads(max_threads())") __VA_ARGS__                 \
        } else {                                                                           \
            __VA_ARGS__                                                                    \
        }                                                                                  \
    } while (0)

/* ---- the device's per-model state ----------------------------------------- */

/* A convolution launch as the CPU runs it (conv_group.c): its geometry and
 * epilogue, and the weights to lay out once (constant), or NULL: each run. */
typedef struct {
    mk_conv_geom g;
    bool bias, residual, relu;
    const float *weights_once;
} mk_cpu_conv_spec;

/* One run's memory: x, the weights, the per-channel bias [O] or NULL, the
 * residual of the result's shape or NULL, the result. */
typedef struct {
    const float *x, *w, *bias, *residual;
    float *out;
    size_t out_bytes;
} mk_cpu_conv_args;

/* conv_dnnl.c: oneDNN's convolution for one launch (made at prepare). */
typedef struct mk_cpu_dnnl_conv mk_cpu_dnnl_conv;
/* NULL where oneDNN is missing or refuses the launch; why says which. */
mk_cpu_dnnl_conv *mk_cpu_dnnl_conv_make(const mk_cpu_conv_spec *sp, const struct mk_node *node,
                                        char *why, size_t size);
void mk_cpu_dnnl_conv_free(mk_cpu_dnnl_conv *c);
int mk_cpu_dnnl_conv_run(const mk_cpu_dnnl_conv *c, const mk_cpu_conv_args *a,
                         const struct mk_node *node, mk_error **err);
/* Which memory of a launch lies in its primitive's layout, no longer NCHW. */
typedef enum { MK_CPU_DNNL_SRC, MK_CPU_DNNL_DST, MK_CPU_DNNL_RESIDUAL } mk_cpu_dnnl_chain;
/* The channel block (8, 16) of the primitive's layout for x, the result or
 * the residual (summed into the result), where it is nChw8c or nChw16c and
 * not NCHW; else 0 (a launch without a residual: 0 for it). */
int mk_cpu_dnnl_conv_block(const mk_cpu_dnnl_conv *c, mk_cpu_dnnl_chain which);
/* Records it on c (conv_group.c decides, at prepare): 0, or -1 out of memory. */
int mk_cpu_dnnl_conv_chain(mk_cpu_dnnl_conv *c, mk_cpu_dnnl_chain what);

/* winograd.c: the Winograd convolution F(2x2, 3x3) of one launch (made at
 * prepare; its weights transformed there where weights_once is given). */
typedef struct mk_cpu_wino mk_cpu_wino;
/* Whether the shape is one it computes: a 3x3 window, stride 1, dilation 1, one group. */
bool mk_cpu_wino_takes(const mk_conv_geom *g);
/* Whether it is taken over oneDNN's direct convolution for g (winograd.c says why). */
bool mk_cpu_wino_pays(const mk_conv_geom *g);
/* NULL: out of memory. threads: the most the launch's runs use. */
mk_cpu_wino *mk_cpu_wino_make(const mk_conv_geom *g, const float *weights_once, int threads);
void mk_cpu_wino_free(mk_cpu_wino *c);
void mk_cpu_wino_run(mk_cpu_wino *c, const mk_conv_geom *g, const mk_cpu_conv_args *a,
                     bool relu);

/* A convolution launch's plan (conv_group.c), made at prepare: the weights
 * and bias with a batch norm folded in (NULL: the operands'), and oneDNN's
 * convolution or the Winograd one (both NULL: im2col). */
typedef struct {
    float *w, *bias;
    mk_cpu_dnnl_conv *dnnl;
    mk_cpu_wino *wino;
    int block; /* a max pool's: x and the result in channel blocks of this many
                  (nChw8c, nChw16c: a convolution's layout, conv_group.c), or 0 */
} mk_cpu_conv_plan;

/* A model's state (mk_launch.dev): the most threads each of its launches may
 * use (cpu_prepare; 1: no parallel region), or NULL: no cap; its launches'
 * convolution plans ([n], zero for other launches), or NULL: none. */
typedef struct {
    int *threads;
    mk_cpu_conv_plan *conv;
    int n;
} cpu_state;

/* conv_group.c: the plans of the model's convolution launches (0, or -1
 * out of memory), which results stay in oneDNN's layout between them, and their freeing. */
int mk_cpu_conv_prepare(cpu_state *s, const mk_launch *launches, int n, const mk_host *host);
void mk_cpu_conv_free(cpu_state *s);

/* ---- row functions shared with the groups ------------------------------- */

/* A pointwise program (expr.c's mk_expr, as ctx) over one stretch of float32:
 * n elements into o, operand k at in[k] with stride s[k] (ops.c). */
void mk_cpu_program_f32(const void *ctx, char *o, const char *const *in, const int64_t *s,
                        int64_t n);
/* o [n] = w [n] * x [n] / sqrt(mean(x²) + 1e-5), as run.c's rmsnorm (o may be x;
 * ops.c, as the next two). */
void mk_cpu_rms_row(const float *x, const float *w, float *o, int64_t n);
void mk_cpu_layer_norm_row(const float *x, const float *w, const float *b, float eps, float *o,
                           int64_t n);
/* o [n] = softmax of x's first p elements, the rest copied (o may be x). */
void mk_cpu_softmax_row(const float *x, float *o, int64_t n, int64_t p);
/* Rows [begin, end) of `rows` for a write of r_rows rows: 0, or node's fault. */
int mk_cpu_row_bounds(const mk_node *node, int64_t begin, int64_t end, int64_t rows,
                      int64_t r_rows, mk_error **err);

/* c [m, n] (contiguous) = a [m, k] (strides sar, sac) @ b [k, n] (strides sbr,
 * sbc) with plain loops (matmul.c). */
void mk_cpu_mm_loops(const float *a, int64_t sar, int64_t sac, const float *b, int64_t sbr,
                     int64_t sbc, float *restrict c, int64_t m, int64_t k, int64_t n);

/*
 * A product's weights as mk_cpu_mv_columns reads them: column j of B (k
 * elements, contiguous) at `data` + j * ldb elements of `dtype`, each widened
 * to float32 (exact); int8 ones times their block's scale,
 * scale[kk / group * ss_k + j * ss_n], rounded once, as a DequantizeNode alone
 * computes them (group: a multiple of 16, so a lane block never straddles two).
 */
typedef struct {
    const void *data;
    mk_dtype dtype;
    int64_t ldb;
    const float *scale; /* int8 only */
    int64_t group, ss_k, ss_n;
    bool rows;          /* float32 held by rows instead: element (kk, j) at kk * ldb + j
                           (mk_cpu_mv_rows) */
} cpu_weights;

/* c [j - j0] = a [k] · column j of w, j in [j0, j1) (matmul.c). */
void mk_cpu_mv_columns(const float *restrict a, const cpu_weights *w, int64_t k, int64_t j0,
                       int64_t j1, float *restrict c);
/* The same with A on the int8 grid (values aq, a scale per group in as), as
 * runq.c's matmul sums it (q8.c). */
void mk_cpu_mv_columns_q8(const int8_t *restrict aq, const float *restrict as,
                          const cpu_weights *w, int64_t k, int64_t j0, int64_t j1,
                          float *restrict c);
/* a [n] onto the int8 grid in groups of g (g divides n): scales as [n / g],
 * values aq [n], by q8_scale and q8_value's rule (q8.c). */
void mk_cpu_q8_grid(const float *a, int64_t n, int64_t g, int8_t *aq, float *as);
/* Whether q8.c's AVX2 kernels run (the CPU has AVX2 and FMA, and MK_CPU_AVX2
 * is not 0); mk_cpu_q8_set_avx2 turns them off or on for a test (false where
 * the CPU lacks them), before any launch runs. */
bool mk_cpu_q8_avx2(void);
bool mk_cpu_q8_set_avx2(bool on);
/* c [j] = a [k] · column j of b for j < cols, b [k, n] held by rows ldb apart. */
void mk_cpu_mv_rows(const float *restrict a, const float *restrict b, int64_t ldb, int64_t k,
                    int64_t cols, float *restrict c);

/* c [m, n] (ldc) = op(a) @ op(b) + beta c, row-major, op the transpose where
 * ta / tb: CBLAS's sgemm, or plain loops where it cannot be opened (matmul.c). */
void mk_cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* Whether launch l (a MatMul or a PrefixMatMul) may take its product to
 * OpenBLAS, which must then be open (matmul.c). */
bool mk_cpu_blas_needed(const mk_launch *l);
/* Opens OpenBLAS once per process: NULL, or why it cannot be opened. */
const char *mk_cpu_blas_open(void);

/* ---- the kernels, one per family (device.c's table) --------------------- */

/*
 * Every kernel receives a launch bound once at compile time (addresses are
 * final) whose dtypes model.c has checked against the table. `out` is always
 * contiguous (row-major). Inputs are contiguous too, except:
 *   - the second operand of a broadcasting op arrives already broadcast to
 *     `out`'s shape, with stride 0 on the broadcast dims;
 *   - a copy that may be a view (permute) gets its input viewed with the
 *     output's shape and the layout's strides;
 *   - matrix products take strided operands: per matrix either column stride 1
 *     (normal) or row stride 1 (transposed), plus any batch stride.
 * The elementwise kernels walk strides for every operand anyway, so a strided
 * first operand costs speed, never correctness. Kernels allocate nothing.
 */
int mk_cpu_pointwise(const mk_launch *l, mk_error **err);
int mk_cpu_complex_mul(const mk_launch *l, mk_error **err);
int mk_cpu_permute(const mk_launch *l, mk_error **err);
int mk_cpu_cast(const mk_launch *l, mk_error **err);
int mk_cpu_dequantize(const mk_launch *l, mk_error **err);
int mk_cpu_fake_quantize(const mk_launch *l, mk_error **err);
int mk_cpu_replace_slice(const mk_launch *l, mk_error **err);
int mk_cpu_embedding(const mk_launch *l, mk_error **err);
int mk_cpu_rms_norm(const mk_launch *l, mk_error **err);
int mk_cpu_sliced_softmax(const mk_launch *l, mk_error **err);
int mk_cpu_causal_softmax(const mk_launch *l, mk_error **err);
int mk_cpu_argmax(const mk_launch *l, mk_error **err);
int mk_cpu_sample(const mk_launch *l, mk_error **err);
int mk_cpu_matmul(const mk_launch *l, mk_error **err);
int mk_cpu_prefix_matmul(const mk_launch *l, mk_error **err);
int mk_cpu_product(const mk_launch *l, mk_error **err);
/* move.c: tile, repeat_interleave, pad and flip (one index map), and the rest of data movement */
int mk_cpu_index_map(const mk_launch *l, mk_error **err);
int mk_cpu_concat(const mk_launch *l, mk_error **err);
int mk_cpu_gather_elements(const mk_launch *l, mk_error **err);
int mk_cpu_index_select(const mk_launch *l, mk_error **err);
int mk_cpu_cumsum(const mk_launch *l, mk_error **err);
int mk_cpu_replace_at(const mk_launch *l, mk_error **err);
/* reductions and norms over any axes (reduce.c) */
int mk_cpu_reduce_sum(const mk_launch *l, mk_error **err);
int mk_cpu_reduce_mean(const mk_launch *l, mk_error **err);
int mk_cpu_reduce_max(const mk_launch *l, mk_error **err);
int mk_cpu_reduce_min(const mk_launch *l, mk_error **err);
int mk_cpu_reduce_prod(const mk_launch *l, mk_error **err);
int mk_cpu_reduce_var(const mk_launch *l, mk_error **err);
int mk_cpu_argmax_axis(const mk_launch *l, mk_error **err);
int mk_cpu_argmin_axis(const mk_launch *l, mk_error **err);
int mk_cpu_softmax(const mk_launch *l, mk_error **err);
int mk_cpu_log_softmax(const mk_launch *l, mk_error **err);
int mk_cpu_layer_norm(const mk_launch *l, mk_error **err);
int mk_cpu_group_norm(const mk_launch *l, mk_error **err);
int mk_cpu_batch_norm(const mk_launch *l, mk_error **err);
int mk_cpu_rms_norm_eps(const mk_launch *l, mk_error **err);
/* conv.c: convolutions (im2col and sgemm, or oneDNN: conv_dnnl.c), pooling, upsampling */
int mk_cpu_conv(const mk_launch *l, mk_error **err);
void mk_cpu_conv_im2col(const mk_conv_geom *g, const mk_cpu_conv_args *a, bool relu,
                        float *cols);
int mk_cpu_conv_transpose(const mk_launch *l, mk_error **err);
int mk_cpu_max_pool(const mk_launch *l, mk_error **err);
int mk_cpu_avg_pool(const mk_launch *l, mk_error **err);
int mk_cpu_adaptive_avg_pool(const mk_launch *l, mk_error **err);
int mk_cpu_upsample_nearest(const mk_launch *l, mk_error **err);
int mk_cpu_rows_group(const mk_launch *l, mk_error **err);
int mk_cpu_conv_group(const mk_launch *l, mk_error **err);

#pragma GCC visibility pop

#endif
