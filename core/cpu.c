/*
 * cpu.c — the CPU device: one kernel per kernel family (plain C, OpenMP,
 * CBLAS, opened at run time) and the device table model.c evaluates through.
 * Long because it is every CPU kernel in one place, sharing the strided walk,
 * the tiling and the matrix-product helpers; the groups' loops at the end
 * reuse their row functions (mv_columns, mv_rows, program_f32, rms_row,
 * softmax_row, mm_loops), which is what keeps a group bit-identical to its
 * nodes alone.
 *
 * Every kernel receives a launch bound once at compile time (addresses are
 * final) whose dtypes model.c has checked against the table at the bottom.
 * `out` is always contiguous (row-major). Inputs are contiguous too, except:
 *   - the second operand of a broadcasting op arrives already broadcast to
 *     `out`'s shape, with stride 0 on the broadcast dims;
 *   - a copy that may be a view (permute) gets its input viewed with the
 *     output's shape and the layout's strides;
 *   - matrix products take strided operands: per matrix either column stride 1
 *     (normal) or row stride 1 (transposed), plus any batch stride.
 * The elementwise kernels walk strides for every operand anyway, so a strided
 * first operand costs speed, never correctness.
 *
 * Kernels allocate nothing. Small launches stay on one thread, outside OpenMP
 * (CPU_FOR): llama2 runs one token at a time, and an OpenMP fork costs more
 * than a 288-element add.
 *
 * Sections: helpers · pointwise expressions · complex_mul · data movement
 * (permute, replace_slice, embedding) · matmul · row reductions (rms_norm,
 * sliced_softmax, causal_softmax, argmax) · matrix–vector and attention groups ·
 * the device table.
 *
 * Tested through the public API against double-precision loops:
 *   make build/tests/ops_test && ./build/tests/ops_test
 */
#include "device.h"

#include <cblas.h>
#include <dlfcn.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Below this many elements a launch runs on the calling thread. */
#define CPU_PAR_MIN 32768
/* Elementwise work is split into tiles of at most this many elements. */
#define CPU_TILE 8192

/* ---- helpers ------------------------------------------------------------ */

static int64_t read_i64(const mk_tensor *t) { return *(const int64_t *)t->data; }

/* Inside a parallel region: this thread's part [*lo, *hi) of n items, in
 * contiguous runs in thread order (thread 0 first). */
static void my_share(int64_t n, int64_t *lo, int64_t *hi) {
#ifdef _OPENMP
    int64_t t = omp_get_thread_num(), threads = omp_get_num_threads();
#else
    int64_t t = 0, threads = 1;
#endif
    *lo = n * t / threads;
    *hi = n * (t + 1) / threads;
}

static int max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Whether the launch running on this thread may use threads at all: the
 * model's cost rule (cpu_prepare) decides per launch, cpu_evaluate sets it. */
static _Thread_local bool cpu_may_fork = true;

/* Whether `work` (elements, or multiply-adds) is worth a parallel region: the
 * launch may fork, the work is at least CPU_PAR_MIN, and there is another
 * thread to share it (a region of one thread still pays libgomp's fork and
 * join: a futex call, microseconds in a VM). */
static inline bool par(int64_t work) {
    return cpu_may_fork && work >= CPU_PAR_MIN && max_threads() > 1;
}

/*
 * for (int64_t I = 0; I < N; I++) BODY, the iterations split among the threads
 * (static schedule) where COND holds, else a plain loop on the calling thread.
 * Not `#pragma omp parallel for if (COND)`: with its condition false that
 * still enters libgomp, which costs a futex call per launch (microseconds in
 * a VM, more than a small launch's work). CPU_REGION is the same for a
 * parallel block whose threads take their parts with my_share.
 */
#define CPU_FOR(COND, I, N, ...)                                                           \
    do {                                                                                   \
        if (COND) {                                                                        \
            _Pragma("omp parallel for schedule(static)")                                   \
            for (int64_t I = 0; I < (N); I++) __VA_ARGS__                                  \
        } else {                                                                           \
            for (int64_t I = 0; I < (N); I++) __VA_ARGS__                                  \
        }                                                                                  \
    } while (0)
#define CPU_REGION(COND, ...)                                                              \
    do {                                                                                   \
        if (COND) {                                                                        \
            _Pragma("omp parallel") __VA_ARGS__                                            \
        } else {                                                                           \
            __VA_ARGS__                                                                    \
        }                                                                                  \
    } while (0)

static int thread_index(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The walk over out (contiguous) reading the n operands t[k] with their strides. */
static void walk_of(mk_walk *w, int rank, const int64_t *shape, int n, const mk_tensor *const *t) {
    const int64_t *strides[MK_WALK_MAX];
    for (int k = 0; k < n; k++) strides[k] = t[k]->stride;
    mk_walk_init(w, rank, shape, n, strides);
}

/*
 * One stretch of the innermost dim: n output elements at o (contiguous),
 * reading operand k at in[k] with stride s[k] (elements). ctx carries what a
 * kernel needs besides (the expression, complex_mul's strides of the (re, im)
 * axis).
 */
typedef void (*cpu_row_fn)(const void *ctx, char *o, const char *const *in, const int64_t *s,
                           int64_t n);

/*
 * Runs fn over the whole walk (its w->n operands at in[k]) in tiles of at most
 * CPU_TILE elements, in parallel when there are at least CPU_PAR_MIN. out_step
 * is the bytes one walk element takes in the output, in_size the bytes of one
 * input element.
 */
static void walk_run(const mk_walk *w, size_t out_step, size_t in_size, char *o,
                     const void *const *in, cpu_row_fn fn, const void *ctx) {
    int last = w->rank - 1;
    int64_t n = w->shape[last], s[MK_WALK_MAX];
    for (int k = 0; k < w->n; k++) s[k] = w->stride[k][last];
    int64_t total = 1;
    for (int d = 0; d < w->rank; d++)
        total *= w->shape[d];
    int64_t per_row = (n + CPU_TILE - 1) / CPU_TILE;
    int64_t tiles = (total / n) * per_row;
    CPU_FOR(tiles > 1 && par(total), t, tiles, {
        int64_t row = t / per_row, c0 = (t % per_row) * CPU_TILE;
        int64_t len = n - c0 < CPU_TILE ? n - c0 : CPU_TILE;
        const char *at[MK_WALK_MAX];
        for (int k = 0; k < w->n; k++)
            at[k] = (const char *)in[k] + (size_t)(mk_walk_row_offset(w, k, row) + c0 * s[k]) * in_size;
        fn(ctx, o + (size_t)(row * n + c0) * out_step, at, s, len);
    });
}

/* ---- pointwise expressions ----------------------------------------------- */

/*
 * A pointwise op's program (expr.c) over one stretch, in chunks of CPU_CHUNK
 * elements: a and b are read in place where they are contiguous (else
 * gathered); a constant is one value, never a filled chunk; each instruction
 * is one vectorisable loop over the chunk into a register on the stack (or a
 * single value when all it reads are constants), and the last one writes the
 * output directly. So `a + b` is a single loop, ReLU (MK_X_MAX with a
 * constant) one, and SiLU five short passes over L1. Float32 evaluates one
 * rounding per operation (the build does not contract), which keeps SiLU
 * bit-identical to run.c's; int64 + - * wrap around.
 */
#define CPU_CHUNK 256

static inline float f32_gt(float x, float y) { return x > y ? 1.0f : 0.0f; }
static inline float f32_lt(float x, float y) { return x < y ? 1.0f : 0.0f; }
static inline int64_t i64_add(int64_t x, int64_t y) { return (int64_t)((uint64_t)x + (uint64_t)y); }
static inline int64_t i64_sub(int64_t x, int64_t y) { return (int64_t)((uint64_t)x - (uint64_t)y); }
static inline int64_t i64_mul(int64_t x, int64_t y) { return (int64_t)((uint64_t)x * (uint64_t)y); }
static inline int64_t i64_neg(int64_t x) { return (int64_t)(0 - (uint64_t)x); }
#define MAX_OF(x, y) ((x) > (y) ? (x) : (y))

/* d = F(x) or F(x, y) over the chunk; an operand that is one value (sx, sy) is
 * read once, and a result of values only is itself one value. */
#define CPU_UNARY(F)                                                                         \
    do {                                                                                     \
        if (sx) {                                                                            \
            one[j] = F(x[0]);                                                                \
            break;                                                                           \
        }                                                                                    \
        _Pragma("omp simd") for (int64_t i = 0; i < len; i++) d[i] = F(x[i]);                \
        is_one = false;                                                                      \
    } while (0)
#define CPU_BINARY(F)                                                                        \
    do {                                                                                     \
        if (sx && sy) {                                                                      \
            one[j] = F(x[0], y[0]);                                                          \
            break;                                                                           \
        }                                                                                    \
        __typeof__(x[0] + 0) xv = x[0], yv = y[0];                                           \
        (void)xv, (void)yv; /* unused where F ignores an operand (no integer division) */    \
        if (sy) {                                                                            \
            _Pragma("omp simd") for (int64_t i = 0; i < len; i++) d[i] = F(x[i], yv);        \
        } else if (sx) {                                                                     \
            _Pragma("omp simd") for (int64_t i = 0; i < len; i++) d[i] = F(xv, y[i]);        \
        } else {                                                                             \
            _Pragma("omp simd") for (int64_t i = 0; i < len; i++) d[i] = F(x[i], y[i]);      \
        }                                                                                    \
        is_one = false;                                                                      \
    } while (0)

/* Defines NAME: the program over n elements of type T (see above). Integer
 * programs never hold / or functions (the op rules refuse those dtypes). */
#define CPU_PROGRAM(NAME, T, NEG, ADD, SUB, MUL, DIV, EXP, TANH, SQRT, GT, LT)               \
    static void NAME(const void *ctx, char *o_, const char *const *in, const int64_t *s,     \
                     int64_t n) {                                                            \
        const mk_expr *e = ctx;                                                              \
        T regs[MK_EXPR_MAX][CPU_CHUNK], g[MK_X_IN][CPU_CHUNK], one[MK_EXPR_MAX];             \
        for (int64_t i0 = 0; i0 < n; i0 += CPU_CHUNK) {                                      \
            int64_t len = n - i0 < CPU_CHUNK ? n - i0 : CPU_CHUNK;                           \
            const T *r[MK_X_IN + MK_EXPR_MAX];                                               \
            bool single[MK_X_IN + MK_EXPR_MAX] = {false};                                    \
            for (int k = 0; k < e->n_in; k++) { /* operands: in place, or gathered */        \
                const T *x = (const T *)in[k] + i0 * s[k];                                   \
                if (s[k] != 1)                                                               \
                    for (int64_t i = 0; i < len; i++)                                        \
                        g[k][i] = x[i * s[k]];                                               \
                r[k] = s[k] == 1 ? x : g[k];                                                 \
            }                                                                                \
            for (int j = 0; j < e->n; j++) {                                                 \
                const mk_xinsn *in = &e->insn[j];                                            \
                bool last = j == e->n - 1, is_one = true;                                    \
                T *restrict d = last ? (T *)o_ + i0 : regs[j];                               \
                const T *x = r[in->x], *y = r[in->y], *z = r[in->z];                         \
                bool sx = single[in->x], sy = single[in->y];                                 \
                switch ((mk_xop)in->op) {                                                    \
                case MK_X_CONST: one[j] = (T)in->k; break;                                   \
                case MK_X_NEG: CPU_UNARY(NEG); break;                                        \
                case MK_X_EXP: CPU_UNARY(EXP); break;                                        \
                case MK_X_TANH: CPU_UNARY(TANH); break;                                      \
                case MK_X_SQRT: CPU_UNARY(SQRT); break;                                      \
                case MK_X_ADD: CPU_BINARY(ADD); break;                                       \
                case MK_X_SUB: CPU_BINARY(SUB); break;                                       \
                case MK_X_MUL: CPU_BINARY(MUL); break;                                       \
                case MK_X_DIV: CPU_BINARY(DIV); break;                                       \
                case MK_X_GT: CPU_BINARY(GT); break;                                         \
                case MK_X_LT: CPU_BINARY(LT); break;                                         \
                case MK_X_MAX: CPU_BINARY(MAX_OF); break;                                    \
                case MK_X_SELECT: {                                                          \
                    bool sz = single[in->z];                                                 \
                    for (int64_t i = 0; i < len; i++)                                        \
                        d[i] = x[sx ? 0 : i] ? y[sy ? 0 : i] : z[sz ? 0 : i];                \
                    is_one = false;                                                          \
                    break;                                                                   \
                }                                                                            \
                }                                                                            \
                if (is_one && last) /* a constant result: write it out */                    \
                    for (int64_t i = 0; i < len; i++)                                        \
                        d[i] = one[j];                                                       \
                single[MK_X_IN + j] = is_one && !last;                                       \
                r[MK_X_IN + j] = is_one && !last ? &one[j] : d;                              \
            }                                                                                \
        }                                                                                    \
    }

#define F_NEG(x) (-(x))
#define F_ADD(x, y) ((x) + (y))
#define F_SUB(x, y) ((x) - (y))
#define F_MUL(x, y) ((x) * (y))
#define F_DIV(x, y) ((x) / (y))
#define I_NONE(x) (x)
#define I_NONE2(x, y) (x)
#define I_GT(x, y) ((int64_t)((x) > (y)))
#define I_LT(x, y) ((int64_t)((x) < (y)))
CPU_PROGRAM(program_f32, float, F_NEG, F_ADD, F_SUB, F_MUL, F_DIV, expf, tanhf, sqrtf, f32_gt,
            f32_lt)
CPU_PROGRAM(program_i64, int64_t, i64_neg, i64_add, i64_sub, i64_mul, I_NONE2, I_NONE, I_NONE,
            I_NONE, I_GT, I_LT)

/* The program runner of each dtype the device evaluates expressions in. */
static const cpu_row_fn programs[MK_DTYPE_COUNT] = {
    [MK_DTYPE_FLOAT32] = program_f32,
    [MK_DTYPE_INT64] = program_i64,
};

/* out = the program of its operands (an op's a, b broadcast; a fused group's
 * up to MK_X_IN, each with its strides); the table below lists the dtypes. */
static int cpu_pointwise(const mk_launch *l, mk_error **err) {
    if (l->expr->n_in > l->n_in || l->n_in > MK_WALK_MAX)
        return MK_INTERNAL(err, "a pointwise program reads operands its launch does not have");
    const mk_tensor *t[MK_WALK_MAX];
    const void *in[MK_WALK_MAX];
    for (int k = 0; k < l->n_in; k++) t[k] = &l->in[k], in[k] = l->in[k].data;
    mk_walk w;
    walk_of(&w, l->out.rank, l->out.shape, l->n_in, t);
    size_t es = mk_dtype_size(l->out.dtype);
    walk_run(&w, es, es, l->out.data, in, programs[l->out.dtype], l->expr);
    return 0;
}

/* ---- elementwise: complex_mul ------------------------------------------- */

/* Strides (floats) between the re and im parts of a and b. */
typedef struct {
    int64_t ia, ib;
} cpu_complex_ctx;

/* n complex numbers: o (pairs, contiguous) = a * b. */
static void row_complex_mul(const void *ctx_, char *o_, const char *const *in,
                            const int64_t *s, int64_t n) {
    const cpu_complex_ctx *ctx = ctx_;
    float *restrict o = (float *)o_;
    const float *a = (const float *)in[0], *b = (const float *)in[1];
    int64_t sa = s[0], sb = s[1];
    int64_t ia = ctx->ia, ib = ctx->ib;
    for (int64_t i = 0; i < n; i++) {
        float ar = a[i * sa], ai = a[i * sa + ia], br = b[i * sb], bi = b[i * sb + ib];
        o[2 * i] = ar * br - ai * bi;
        o[2 * i + 1] = ar * bi + ai * br;
    }
}

/* out [..., 2] = a [..., 2] * b [..., 2] as complex numbers (re, im); b broadcast. */
static int cpu_complex_mul(const mk_launch *l, mk_error **err) {
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    int r = l->out.rank;
    if (r < 1 || l->out.shape[r - 1] != 2)
        return MK_INTERNAL(err, "complex product: the last axis is not 2");
    /* Walk the complex numbers: every dim but the last. */
    mk_walk w;
    walk_of(&w, r - 1, l->out.shape, 2, (const mk_tensor *[]){a, b});
    cpu_complex_ctx ctx = {a->stride[r - 1], b->stride[r - 1]};
    walk_run(&w, 2 * sizeof(float), sizeof(float), l->out.data,
             (const void *[]){a->data, b->data}, row_complex_mul, &ctx);
    return 0;
}

/* ---- data movement: permute --------------------------------------------- */

#define CPU_COPY_ROW(NAME, T)                                                                \
    static void NAME(const void *ctx, char *o_, const char *const *in, const int64_t *s,     \
                     int64_t n) {                                                            \
        (void)ctx;                                                                           \
        T *restrict o = (T *)o_;                                                             \
        const T *a = (const T *)in[0];                                                       \
        int64_t sa = s[0];                                                                   \
        if (sa == 1)                                                                         \
            memcpy(o, a, (size_t)n * sizeof(T));                                             \
        else                                                                                 \
            for (int64_t i = 0; i < n; i++)                                                  \
                o[i] = a[i * sa];                                                            \
    }

CPU_COPY_ROW(row_copy_8, uint8_t)
CPU_COPY_ROW(row_copy_16, uint16_t)
CPU_COPY_ROW(row_copy_32, uint32_t)
CPU_COPY_ROW(row_copy_64, uint64_t)

/*
 * Transposing copies: the walk's last two dims are out [R, C] read from x with
 * strides [1, s] (x holds them as [C, R]). Copied in 32×32 blocks so both sides
 * stay in cache; the outer dims (batches) are walked as blocks too.
 */
#define CPU_BLOCK 32

typedef void (*cpu_transpose_fn)(const mk_walk *w, char *o, const char *x);

#define CPU_TRANSPOSE(NAME, T)                                                               \
    static void NAME(const mk_walk *w, char *o, const char *x) {                             \
        int r = w->rank;                                                                     \
        int64_t R = w->shape[r - 2], C = w->shape[r - 1], s = w->stride[0][r - 1];           \
        int64_t batches = 1;                                                                 \
        for (int d = 0; d < r - 2; d++)                                                      \
            batches *= w->shape[d];                                                          \
        int64_t br = (R + CPU_BLOCK - 1) / CPU_BLOCK, bc = (C + CPU_BLOCK - 1) / CPU_BLOCK;  \
        int64_t blocks = batches * br * bc;                                                  \
        CPU_FOR(par(batches * R * C), t, blocks, {                                          \
            int64_t bt = t / (br * bc), i0 = (t / bc % br) * CPU_BLOCK;                      \
            int64_t j0 = (t % bc) * CPU_BLOCK, off = 0, rest = bt;                           \
            for (int d = r - 3; d >= 0; d--) {                                               \
                off += rest % w->shape[d] * w->stride[0][d];                                 \
                rest /= w->shape[d];                                                         \
            }                                                                                \
            int64_t i1 = i0 + CPU_BLOCK < R ? i0 + CPU_BLOCK : R;                            \
            int64_t j1 = j0 + CPU_BLOCK < C ? j0 + CPU_BLOCK : C;                            \
            T *ob = (T *)o + bt * R * C;                                                     \
            const T *xb = (const T *)x + off;                                                \
            for (int64_t j = j0; j < j1; j++)                                                \
                for (int64_t i = i0; i < i1; i++)                                            \
                    ob[i * C + j] = xb[i + j * s];                                           \
        });                                                                                  \
    }

CPU_TRANSPOSE(transpose_8, uint8_t)
CPU_TRANSPOSE(transpose_16, uint16_t)
CPU_TRANSPOSE(transpose_32, uint32_t)
CPU_TRANSPOSE(transpose_64, uint64_t)

/* A permute moves elements of any dtype: only their size matters (1, 2, 4, 8 bytes). */
static const struct {
    cpu_row_fn copy;
    cpu_transpose_fn transpose;
} movers[4] = {{row_copy_8, transpose_8},
               {row_copy_16, transpose_16},
               {row_copy_32, transpose_32},
               {row_copy_64, transpose_64}};

/* out [...] (contiguous) = x viewed with the permuted shape and strides. */
static int cpu_permute(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    size_t es = mk_dtype_size(l->out.dtype);
    int size_log2 = es ? __builtin_ctzll(es) : 0;
    if (es > 8 || es != (size_t)1 << size_log2)
        return MK_INTERNAL(err, "permute: an element size other than 1, 2, 4 or 8 bytes");
    mk_walk w;
    walk_of(&w, l->out.rank, l->out.shape, 1, &x);
    int r = w.rank;
    if (r >= 2 && w.stride[0][r - 2] == 1 && w.stride[0][r - 1] != 1)
        movers[size_log2].transpose(&w, l->out.data, x->data);
    else
        walk_run(&w, es, es, l->out.data, (const void *[]){x->data}, movers[size_log2].copy,
                 NULL);
    return 0;
}

/* ---- conversions: cast, dequantize, fake_quantize ------------------------ */

/* One stretch of a cast: n elements of dtype from (stride s[0]) into o, dense. */
static void cast_row(const void *ctx, char *o, const char *const *in, const int64_t *s,
                     int64_t n) {
    const mk_dtype *d = ctx; /* to, from */
    size_t es = mk_dtype_size(d[1]);
    if (s[0] == 1) {
        mk_convert(o, d[0], in[0], d[1], n);
        return;
    }
    size_t os = mk_dtype_size(d[0]);
    for (int64_t i = 0; i < n; i++)
        mk_convert(o + (size_t)i * os, d[0], in[0] + (size_t)(i * s[0]) * es, d[1], 1);
}

/* out = x converted to out's dtype (the rule: mk_convert); x strided. */
static int cpu_cast(const mk_launch *l, mk_error **err) {
    (void)err;
    const mk_tensor *x = &l->in[0];
    mk_walk w;
    walk_of(&w, l->out.rank, l->out.shape, 1, &x);
    const mk_dtype pair[2] = {l->out.dtype, x->dtype};
    walk_run(&w, mk_dtype_size(l->out.dtype), mk_dtype_size(x->dtype), l->out.data,
             (const void *[]){x->data}, cast_row, pair);
    return 0;
}

/*
 * out = q * scale, float32: q int8 and scale float32 (both strided), scale's
 * dims dividing q's, element i taking scale[i_d / (q_d / scale_d)]. Row by row
 * of the last axis; along it the scale changes every `g` elements.
 */
static int cpu_dequantize(const mk_launch *l, mk_error **err) {
    (void)err;
    const mk_tensor *q = &l->in[0], *sc = &l->in[1];
    int r = q->rank, last = r - 1;
    int64_t n = q->shape[last], g = n / sc->shape[last], rows = mk_tensor_numel(q) / n;
    const int8_t *qd = q->data;
    const float *sd = sc->data;
    float *o = l->out.data;
    CPU_FOR(par(rows * n), row, rows, {
        int64_t qo = 0, so = 0, rest = row;
        for (int d = last - 1; d >= 0; d--) {
            int64_t i = rest % q->shape[d];
            rest /= q->shape[d];
            qo += i * q->stride[d];
            so += i / (q->shape[d] / sc->shape[d]) * sc->stride[d];
        }
        const int8_t *qr = qd + qo;
        float *orow = o + row * n;
        for (int64_t j0 = 0; j0 < n; j0 += g) {
            float s = sd[so + j0 / g * sc->stride[last]];
            for (int64_t j = j0; j < j0 + g; j++)
                orow[j] = (float)qr[j * q->stride[last]] * s;
        }
    });
    return 0;
}

/*
 * runq.c's activations on the int8 grid: a group's scale s = max |x| / 127,
 * each value round(x / s), halves away from zero. Where s is 0 (a group of
 * zeros) or x / s is not a number the value is 0, and it is clamped to
 * +-127 (s of tiny x underflows); runq.c leaves those cases undefined.
 */
static float q8_scale(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (v > m) m = v;
    }
    return m / 127.0f;
}

static inline int8_t q8_value(float x, float s) {
    float v = s != 0.0f ? roundf(x / s) : 0.0f;
    return v != v ? 0 : v > 127.0f ? 127 : v < -127.0f ? -127 : (int8_t)v;
}

/* out = s * q per group of `group` along the last axis (x dense). */
static int cpu_fake_quantize(const mk_launch *l, mk_error **err) {
    (void)err;
    int64_t g = l->node->attr[0], groups = mk_tensor_numel(&l->out) / g;
    const float *x = l->in[0].data;
    float *o = l->out.data;
    CPU_FOR(par(groups * g), i, groups, {
        const float *xi = x + i * g;
        float s = q8_scale(xi, g);
        for (int64_t j = 0; j < g; j++) o[i * g + j] = (float)q8_value(xi[j], s) * s;
    });
    return 0;
}

/* ---- data movement: replace_slice, embedding ---------------------------- */

/* Rows [begin, end) of `rows` for a write of r_rows rows: 0, or node's fault. */
static int row_bounds(const mk_node *node, int64_t begin, int64_t end, int64_t rows,
                      int64_t r_rows, mk_error **err) {
    if (begin < 0 || end > rows || begin > end)
        return mk_fault(err, node, MK_FAULT_RANGE, begin, end, rows);
    if (end - begin != r_rows)
        return mk_fault(err, node, MK_FAULT_ROWS, begin, end, r_rows);
    return 0;
}

/*
 * x [R, ...] (in place: out.data == x.data) rows [begin, end) = r [end - begin, ...];
 * begin, end: int64 [1], read now. For a vector the rows are elements. Bad
 * bounds write nothing.
 */
static int cpu_replace_slice(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0], *r = &l->in[1];
    int64_t begin = read_i64(&l->in[2]), end = read_i64(&l->in[3]);
    int64_t rows = x->shape[0], r_rows = r->shape[0];
    if (row_bounds(l->node, begin, end, rows, r_rows, err)) return -1;
    size_t es = mk_dtype_size(x->dtype);
    size_t row_bytes = (size_t)(mk_tensor_numel(x) / rows) * es;
    if ((size_t)mk_tensor_numel(r) * es != (size_t)r_rows * row_bytes)
        return MK_INTERNAL(err, "in-place write: replacement rows differ from x's rows");
    char *o = l->out.data;
    if (o != x->data) /* not bound in place: out starts as a copy of x */
        memcpy(o, x->data, (size_t)mk_tensor_numel(x) * es);
    /* memmove: r may be computed from x's own memory. */
    memmove(o + (size_t)begin * row_bytes, r->data, (size_t)r_rows * row_bytes);
    return 0;
}

/* out [n, D] = table [V, D] rows at ids [n] (int64). An id outside [0, V) writes nothing. */
static int cpu_embedding(const mk_launch *l, mk_error **err) {
    const mk_tensor *table = &l->in[0], *ids_t = &l->in[1];
    const int64_t *ids = ids_t->data;
    int64_t n = mk_tensor_numel(ids_t), V = table->shape[0];
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return mk_fault(err, l->node, MK_FAULT_ID, ids[i], i, V);
    size_t row_bytes = (size_t)(mk_tensor_numel(table) / V) * mk_dtype_size(table->dtype);
    char *o = l->out.data;
    const char *t = table->data;
    for (int64_t i = 0; i < n; i++)
        memcpy(o + (size_t)i * row_bytes, t + (size_t)ids[i] * row_bytes, row_bytes);
    return 0;
}

/* ---- matmul ------------------------------------------------------------- */

/* Eight floats as one vector (GCC's vector extensions). Built without AVX
 * (ARCH=, the portable build), GCC warns that returning one changes the ABI:
 * the functions that do are static and inlined, so no call crosses one. */
typedef float cpu_v8 __attribute__((vector_size(32)));
#pragma GCC diagnostic ignored "-Wpsabi"

static inline cpu_v8 load8(const float *p) {
    cpu_v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 16 lanes x (two vectors) added pairwise, then the tail t. */
static inline float lanes_total(cpu_v8 x0, cpu_v8 x1, float t) {
    cpu_v8 x = x0 + x1;
    float s = ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]));
    return s + t;
}

/*
 * The dot products of x [k] with eight columns y + j * ldy, j < 8, each dense:
 * per column 8 lanes (lane l takes i = l, l + 8, ...), the lanes added
 * pairwise ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), then the k % 8 left
 * over in order. Attention's dot products are short (a head: 8 to 128
 * values), so the eight columns' lanes are added together, as a transpose
 * (three rounds of shuffles and adds), not eight sums of their own. dot() is
 * one column the same way.
 */
static inline cpu_v8 dot8(const float *x, const float *y, int64_t ldy, int64_t k) {
    cpu_v8 s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        cpu_v8 xv = load8(x + i);
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            s[j] += xv * load8(y + j * ldy + i);
    }
    cpu_v8 h[4], q[2];
    for (int j = 0; j < 4; j++) /* [s0 + s1 of columns 2j, 2j + 1 interleaved, ...] */
        h[j] = __builtin_shufflevector(s[2 * j], s[2 * j + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               __builtin_shufflevector(s[2 * j], s[2 * j + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int j = 0; j < 2; j++)
        q[j] = __builtin_shufflevector(h[2 * j], h[2 * j + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(h[2 * j], h[2 * j + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    cpu_v8 t = __builtin_shufflevector(q[0], q[1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(q[0], q[1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (; i < k; i++)
        for (int j = 0; j < 8; j++)
            t[j] += x[i] * y[j * ldy + i];
    return t;
}

static inline float dot(const float *x, const float *y, int64_t k) {
    cpu_v8 s = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        s += load8(x + i) * load8(y + i);
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < k; i++)
        t += x[i] * y[i];
    return t;
}

/*
 * c [m, n] (contiguous) = a [m, k] (strides sar, sac) @ b [k, n] (strides sbr, sbc)
 * with plain loops: for small products (a BLAS call costs more than the work,
 * and batches can then run on OpenMP threads without nesting OpenBLAS's own
 * threads) and for layouts BLAS cannot express.
 */
static void mm_loops(const float *a, int64_t sar, int64_t sac, const float *b, int64_t sbr,
                     int64_t sbc, float *restrict c, int64_t m, int64_t k, int64_t n) {
    for (int64_t i = 0; i < m; i++) {
        const float *ai = a + i * sar;
        float *restrict ci = c + i * n;
        if (sbc == 1 || n == 1) {
            /* b's rows are contiguous: c_ij = a_i0 b_0j + a_i1 b_1j + ..., 64
             * columns at a time in registers (in that order), then 8 (in four
             * chains, kk mod 4, added pairwise), then one (in order). */
            int64_t j = 0;
            for (; j + 64 <= n; j += 64) {
                cpu_v8 t[8] = {0};
                for (int64_t kk = 0; kk < k; kk++) {
                    float av = ai[kk * sac];
                    const float *bk = b + kk * sbr + j;
                    #pragma GCC unroll 8
                    for (int v = 0; v < 8; v++)
                        t[v] += av * load8(bk + 8 * v);
                }
                memcpy(ci + j, t, sizeof t);
            }
            for (; j + 8 <= n; j += 8) { /* four chains of kk, so the adds overlap */
                cpu_v8 t[4] = {0};
                int64_t kk = 0;
                for (; kk + 4 <= k; kk += 4)
                    #pragma GCC unroll 4
                    for (int q = 0; q < 4; q++)
                        t[q] += ai[(kk + q) * sac] * load8(b + (kk + q) * sbr + j);
                for (; kk < k; kk++)
                    t[0] += ai[kk * sac] * load8(b + kk * sbr + j);
                cpu_v8 sum = (t[0] + t[1]) + (t[2] + t[3]);
                memcpy(ci + j, &sum, sizeof sum);
            }
            for (; j < n; j++) {
                float t = 0.0f;
                for (int64_t kk = 0; kk < k; kk++)
                    t += ai[kk * sac] * b[kk * sbr + j];
                ci[j] = t;
            }
        } else if (sbr == 1 && sac == 1) {
            /* b's columns are contiguous (attention scores over a cached K):
             * vectorised dot products, eight columns at a time (dot8), then
             * one (dot), each in the same order. */
            int64_t j = 0;
            for (; j + 8 <= n; j += 8) {
                cpu_v8 t = dot8(ai, b + j * sbc, sbc, k);
                memcpy(ci + j, &t, sizeof t);
            }
            for (; j < n; j++)
                ci[j] = dot(ai, b + j * sbc, k);
        } else {
            for (int64_t j = 0; j < n; j++) {
                float t = 0.0f;
                for (int64_t kk = 0; kk < k; kk++)
                    t += ai[kk * sac] * b[kk * sbr + j * sbc];
                ci[j] = t;
            }
        }
    }
}

/*
 * c [j - j0] = a [k] · column j of b, for j in [j0, j1): b's columns are
 * contiguous, ldb floats apart. A column at a time, summed in 16 lanes (lane
 * l takes k = l, l + 16, ...: two 8-float vectors, which the compiler maps
 * onto whatever vector registers the build has), then the lanes pairwise,
 * then the k % 16 left over in order. One column at a time keeps the weights
 * one forward stream, which the hardware prefetcher follows: four columns
 * interleaved (four streams a column apart, each of a's loads shared) read
 * 12 GB/s on one Zen 4 core against 28 for one stream. The order of every
 * sum is written out here, not left to a vectoriser, so it is the same for
 * every caller (the product alone, a matrix–vector group: a group equals its
 * nodes bit for bit) and every build. Not inlined, for the same reason.
 */

/*
 * A product's weights as mv_columns reads them: column j of B (k elements,
 * contiguous) at `data` + j * ldb elements of `dtype`, each widened to
 * float32 (exact); int8 ones times their block's scale,
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
                           (mv_rows) */
} cpu_weights;

typedef uint16_t cpu_u16x8 __attribute__((vector_size(16)));
typedef uint32_t cpu_u32x8 __attribute__((vector_size(32)));
typedef int8_t cpu_i8x8 __attribute__((vector_size(8)));
typedef int32_t cpu_i32x8 __attribute__((vector_size(32)));
#ifdef __FLT16_MAX__
typedef _Float16 cpu_h8 __attribute__((vector_size(16)));
#endif

/* Eight weights from element kk of a column at p, widened. */
static inline __attribute__((always_inline)) cpu_v8 wload8(const void *p, int64_t kk, mk_dtype d) {
    switch (d) {
    case MK_DTYPE_BFLOAT16: {
        cpu_u16x8 h;
        memcpy(&h, (const uint16_t *)p + kk, sizeof h);
        return (cpu_v8)(__builtin_convertvector(h, cpu_u32x8) << 16);
    }
    case MK_DTYPE_FLOAT16: {
#ifdef __FLT16_MAX__
        cpu_h8 h;
        memcpy(&h, (const uint16_t *)p + kk, sizeof h);
        return __builtin_convertvector(h, cpu_v8);
#else
        cpu_v8 v;
        for (int i = 0; i < 8; i++) v[i] = mk_f16_to_f32(((const uint16_t *)p)[kk + i]);
        return v;
#endif
    }
    case MK_DTYPE_INT8: {
#ifdef __AVX2__ /* GCC scalarises the direct conversion of 8 int8 to floats */
        __m128i b = _mm_loadl_epi64((const __m128i *)((const int8_t *)p + kk));
        return (cpu_v8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
#else
        cpu_i8x8 q;
        memcpy(&q, (const int8_t *)p + kk, sizeof q);
        return __builtin_convertvector(__builtin_convertvector(q, cpu_i32x8), cpu_v8);
#endif
    }
    default: return load8((const float *)p + kk);
    }
}

static inline __attribute__((always_inline)) float wload1(const void *p, int64_t kk, mk_dtype d) {
    switch (d) {
    case MK_DTYPE_BFLOAT16: return mk_bf16_to_f32(((const uint16_t *)p)[kk]);
    case MK_DTYPE_FLOAT16: return mk_f16_to_f32(((const uint16_t *)p)[kk]);
    case MK_DTYPE_INT8: return (float)((const int8_t *)p)[kk];
    default: return ((const float *)p)[kk];
    }
}

static inline __attribute__((always_inline)) void
mv_columns_of(const float *restrict a, const cpu_weights *w, int64_t k, int64_t j0, int64_t j1,
              float *restrict c, mk_dtype d) {
    int64_t body = k - k % 16;
    size_t es = mk_dtype_size(d);
    bool q8 = d == MK_DTYPE_INT8;
    for (int64_t j = j0; j < j1; j++) {
        const char *b = (const char *)w->data + (size_t)(j * w->ldb) * es;
        const float *sc = q8 ? w->scale + j * w->ss_n : NULL; /* int8: the column's block scales */
        cpu_v8 s0 = {0}, s1 = {0};
        int64_t gk = 0, left = q8 ? w->group : 0; /* int8: the block's scale, and what it has left */
        for (int64_t kk = 0; kk < body; kk += 16) {
            cpu_v8 w0 = wload8(b, kk, d), w1 = wload8(b, kk + 8, d);
            if (q8) {
                w0 *= sc[gk], w1 *= sc[gk];
                if ((left -= 16) == 0) gk += w->ss_k, left = w->group;
            }
            s0 += w0 * load8(a + kk), s1 += w1 * load8(a + kk + 8);
        }
        float t = 0.0f;
        for (int64_t kk = body; kk < k; kk++) {
            float v = wload1(b, kk, d);
            if (q8) v *= sc[kk / w->group * w->ss_k];
            t += v * a[kk];
        }
        c[j - j0] = lanes_total(s0, s1, t);
    }
}

/* c [j - j0] = a · column j of w, j in [j0, j1); one body per weight dtype. */
__attribute__((noinline)) static void mv_columns(const float *restrict a, const cpu_weights *w,
                                                 int64_t k, int64_t j0, int64_t j1,
                                                 float *restrict c) {
    switch (w->dtype) {
    case MK_DTYPE_BFLOAT16: mv_columns_of(a, w, k, j0, j1, c, MK_DTYPE_BFLOAT16); break;
    case MK_DTYPE_FLOAT16: mv_columns_of(a, w, k, j0, j1, c, MK_DTYPE_FLOAT16); break;
    case MK_DTYPE_INT8: mv_columns_of(a, w, k, j0, j1, c, MK_DTYPE_INT8); break;
    default: mv_columns_of(a, w, k, j0, j1, c, MK_DTYPE_FLOAT32); break;
    }
}

/*
 * A's int8 group · a column's (n values), exact. AVX2: |w| times x with w's
 * sign, 32 at a time (maddubs: a pair's sum is at most 2 * 128 * 127, within
 * int16, for every int8 weight, -128 included; x is never -128).
 */
static inline int32_t dot_q8(const int8_t *restrict x, const int8_t *restrict w, int64_t n) {
    int64_t i = 0;
    int32_t t = 0;
#ifdef __AVX2__
    __m256i acc = _mm256_setzero_si256();
    for (; i + 32 <= n; i += 32) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + i));
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + i));
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    t = _mm_cvtsi128_si32(h);
#endif
    for (; i < n; i++) t += (int32_t)x[i] * w[i];
    return t;
}

/*
 * c [j - j0] = A on the int8 grid (values aq, one scale per group in as) ·
 * column j of int8 weights whose scale blocks are A's groups, as runq.c's
 * matmul sums them: per group an exact int32 dot product, then
 * val += (float)dot * w_scale * a_scale, group after group.
 */
__attribute__((noinline)) static void mv_columns_q8(const int8_t *restrict aq,
                                                    const float *restrict as, const cpu_weights *w,
                                                    int64_t k, int64_t j0, int64_t j1,
                                                    float *restrict c) {
    int64_t g = w->group, j = j0;
#ifdef __AVX2__
    /* four columns at a time, each group's four sums reduced together; every
     * lane rounds as the loop below (a quad short of columns repeats its first) */
    const __m256i ones = _mm256_set1_epi16(1);
    for (; g % 32 == 0 && j < j1; j += 4) {
        int cols = j1 - j < 4 ? (int)(j1 - j) : 4;
        const int8_t *b[4];
        const float *sc[4];
        for (int t = 0; t < 4; t++) {
            int64_t at = j + (t < cols ? t : 0);
            b[t] = (const int8_t *)w->data + at * w->ldb;
            sc[t] = w->scale + at * w->ss_n;
        }
        __m128 val = _mm_setzero_ps();
        for (int64_t gi = 0; gi < k / g; gi++) {
            __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                              _mm256_setzero_si256(), _mm256_setzero_si256()};
            for (int64_t e = gi * g; e < (gi + 1) * g; e += 32) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(aq + e));
#pragma GCC unroll 4
                for (int t = 0; t < 4; t++) {
                    __m256i wv = _mm256_loadu_si256((const __m256i *)(b[t] + e));
                    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, ones));
                }
            }
            __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]),
                                          _mm256_hadd_epi32(acc[2], acc[3]));
            __m128i dots = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            int64_t at = gi * w->ss_k;
            __m128 ws = _mm_setr_ps(sc[0][at], sc[1][at], sc[2][at], sc[3][at]);
            __m128 t = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(dots), ws), _mm_set1_ps(as[gi]));
            val = _mm_add_ps(val, t);
        }
        float v[4];
        _mm_storeu_ps(v, val);
        memcpy(c + (j - j0), v, (size_t)cols * sizeof(float));
    }
#endif
    for (; j < j1; j++) {
        const int8_t *b = (const int8_t *)w->data + j * w->ldb;
        const float *sc = w->scale + j * w->ss_n;
        float val = 0.0f;
        for (int64_t gi = 0; gi < k / g; gi++)
            val += (float)dot_q8(aq + gi * g, b + gi * g, g) * sc[gi * w->ss_k] * as[gi];
        c[j - j0] = val;
    }
}

/*
 * c [j] = a [k] · column j of b for j < cols, b held by rows ([k, n]: row kk
 * at b + kk * ldb, its columns contiguous): every column's sum taken over k in
 * order, each term a_k b_kj rounded and then added, so a column's value is the
 * same whichever of the three paths below takes it, in every build, wherever a
 * caller's share of the columns begins (a group equals its product alone, and
 * a split among threads changes nothing):
 *   - blocks of CPU_ROW_BLOCK columns keep their sums in CPU_ROW_VECS vector
 *     registers while b's rows stream by (with AVX-512, 256 columns: a row's
 *     whole kilobyte is one contiguous read, which L2 serves at its full rate;
 *     four separate 256-byte runs per row came 30 % slower);
 *   - then whole vectors one at a time;
 *   - then the last columns (fewer than a vector): masked loads where the
 *     build has AVX-512, else their sums in c itself (L1).
 */
#ifdef __AVX512F__
typedef float cpu_vr __attribute__((vector_size(64)));
#define CPU_ROW_VECS 16
#else
typedef float cpu_vr __attribute__((vector_size(32)));
#define CPU_ROW_VECS 8
#endif
#define CPU_ROW_LANES ((int64_t)(sizeof(cpu_vr) / sizeof(float)))
#define CPU_ROW_BLOCK (CPU_ROW_VECS * CPU_ROW_LANES)

static inline cpu_vr load_vr(const float *p) {
    cpu_vr v;
    memcpy(&v, p, sizeof v);
    return v;
}

__attribute__((noinline)) static void mv_rows(const float *restrict a, const float *restrict b,
                                              int64_t ldb, int64_t k, int64_t cols,
                                              float *restrict c) {
    int64_t j = 0;
    for (; j + CPU_ROW_BLOCK <= cols; j += CPU_ROW_BLOCK) {
        cpu_vr s[CPU_ROW_VECS] = {0};
        for (int64_t kk = 0; kk < k; kk++) {
            const float *bk = b + kk * ldb + j;
#pragma GCC unroll 16
            for (int v = 0; v < CPU_ROW_VECS; v++) s[v] += load_vr(bk + v * CPU_ROW_LANES) * a[kk];
        }
        memcpy(c + j, s, sizeof s);
    }
    for (; j + CPU_ROW_LANES <= cols; j += CPU_ROW_LANES) {
        cpu_vr s = {0};
        for (int64_t kk = 0; kk < k; kk++) s += load_vr(b + kk * ldb + j) * a[kk];
        memcpy(c + j, &s, sizeof s);
    }
    if (j == cols) return;
#ifdef __AVX512F__
    __mmask16 mask = (__mmask16)((1u << (cols - j)) - 1);
    __m512 s = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++)
        s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, b + kk * ldb + j),
                                           _mm512_set1_ps(a[kk])));
    _mm512_mask_storeu_ps(c + j, mask, s);
#else
    for (int64_t t = j; t < cols; t++)
        c[t] = 0.0f;
    for (int64_t kk = 0; kk < k; kk++) {
        float av = a[kk];
        const float *bk = b + kk * ldb;
#pragma omp simd
        for (int64_t t = j; t < cols; t++)
            c[t] += av * bk[t];
    }
#endif
}

/*
 * Columns a matrix–vector group (and mv_omp) computes together: per chunk,
 * every row of A in turn, so the chunk's weights are read from memory once
 * and from cache for the other rows. A multiple of 4 (mv_columns' quads) and
 * of CPU_ROW_BLOCK.
 */
#define CPU_MV_CHUNK 256

/*
 * Rows of A up to which a lone product runs through mv_omp rather than BLAS:
 * a prompt of up to this many tokens (a prefill) neither loads OpenBLAS nor
 * wakes its threads, which spin against OpenMP's, then and in the decoding
 * after it. Measured on stories15M's prefill, 2 Zen 4 cores: mv_omp is 2.1x
 * OpenBLAS's speed at 8 rows, 4.6x at 64, and about even at 128.
 */
#define CPU_FEW_ROWS 64

/*
 * c [m, n] (contiguous) = a [m, k] (rows dense, sar apart) @ b, with b held
 * either as [n, k] rows (transposed: each output a dot product, mv_columns) or
 * as [k, n] rows (normal: rows of b scaled and added, mv_rows), m at most
 * CPU_FEW_ROWS: each row as a matrix–vector group computes it, bit for bit,
 * the rows together per chunk of CPU_MV_CHUNK columns. Split over OpenMP
 * threads rather than left to OpenBLAS: a one-token model runs hundreds of
 * small launches, and OpenBLAS's own threads spinning between them starve
 * OpenMP's (and the other way round) — 4× slower on 2 cores.
 */
static void mv_omp(const float *a, int64_t sar, const float *b, int64_t ldb,
                   bool b_rows_are_outputs, float *c, int64_t m, int64_t k, int64_t n) {
    CPU_REGION(par(m * n * k), {
        int64_t q0, q1;
        my_share((n + 3) / 4, &q0, &q1);
        int64_t end = 4 * q1 < n ? 4 * q1 : n;
        const cpu_weights w = {.data = b, .dtype = MK_DTYPE_FLOAT32, .ldb = ldb};
        for (int64_t j = 4 * q0; j < end; j += CPU_MV_CHUNK) {
            int64_t j1 = j + CPU_MV_CHUNK < end ? j + CPU_MV_CHUNK : end;
            for (int64_t i = 0; i < m; i++)
                if (b_rows_are_outputs)
                    mv_columns(a + i * sar, &w, k, j, j1, c + i * n + j);
                else
                    mv_rows(a + i * sar, b + j, ldb, k, j1 - j, c + i * n + j);
        }
    });
}

/*
 * OpenBLAS, opened by the compile of the first model with a product of more
 * rows than mv_omp takes (cpu_prepare, matmul_may_use_blas), not linked: a
 * model whose products all run in groups or mv_omp (decoding, a short
 * prompt, a policy MLP) never loads it, so neither its 4 MB nor its threads,
 * which spin for a while after they start and would take the cores from
 * OpenMP's. $MK_BLAS names another build to open instead (e.g.
 * Debian's OpenMP one, whose threads are OpenMP's).
 */
static struct {
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_sgemv) *sgemv;
    bool ready;    /* both found */
    char why[256]; /* why it could not be opened, or "" */
} cpu_blas;
static pthread_once_t cpu_blas_once = PTHREAD_ONCE_INIT;

static void cpu_blas_open(void) {
    const char *env = getenv("MK_BLAS");
    const char *names[] = {"libopenblas.so.0", "libopenblas.so"};
    size_t n = sizeof names / sizeof names[0];
    if (env && *env) names[0] = env, n = 1;
    for (size_t i = 0; i < n; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            snprintf(cpu_blas.why, sizeof cpu_blas.why, "%s", dlerror());
            continue;
        }
        cpu_blas.sgemm = (__typeof__(cblas_sgemm) *)dlsym(lib, "cblas_sgemm");
        cpu_blas.sgemv = (__typeof__(cblas_sgemv) *)dlsym(lib, "cblas_sgemv");
        if (cpu_blas.sgemm && cpu_blas.sgemv) {
            cpu_blas.ready = true;
            cpu_blas.why[0] = '\0';
            return; /* open for the process's life, as a linked library would be */
        }
        snprintf(cpu_blas.why, sizeof cpu_blas.why, "%s has no cblas_sgemm or cblas_sgemv",
                 names[i]);
        cpu_blas.sgemm = NULL, cpu_blas.sgemv = NULL;
        dlclose(lib);
    }
}

/* How mm_one computes a product: mv_omp, CBLAS's sgemv or sgemm, or mm_loops. */
typedef enum { CPU_MM_ROWS, CPU_MM_GEMV, CPU_MM_GEMM, CPU_MM_LOOPS } cpu_mm_way;

/* The way for a [m, k] (strides sar, sac) @ b, where ok_b says whether CBLAS
 * (and mv_omp) can read b's layout. */
static cpu_mm_way mm_way(bool ok_b, int64_t sar, int64_t sac, int64_t m, int64_t k) {
    bool ta;
    int64_t lda;
    if (!ok_b) return CPU_MM_LOOPS;
    if ((sac == 1 || k == 1) && m <= CPU_FEW_ROWS) return CPU_MM_ROWS;
    if (m == 1 && (sac != 0 || k == 1) && sac <= INT32_MAX) return CPU_MM_GEMV;
    if (m <= INT32_MAX && mk_matrix_layout(m, k, sar, sac, &ta, &lda)) return CPU_MM_GEMM;
    return CPU_MM_LOOPS;
}

/*
 * One product c [m, n] = a [m, k] @ b [k, n]: through CBLAS where the layouts
 * allow and the product has more rows than mv_omp takes. CBLAS is open when
 * it gets here (cpu_prepare opened it for any launch that may, or failed the
 * compile); should a product reach it anyway (a prefix narrowing k to a
 * layout CBLAS takes), it opens it, and without it runs mm_loops.
 */
static void mm_one(const float *a, int64_t sar, int64_t sac, const float *b, int64_t sbr,
                   int64_t sbc, float *c, int64_t m, int64_t k, int64_t n) {
    bool ta, tb;
    int64_t lda, ldb;
    bool ok_b = mk_matrix_layout(k, n, sbr, sbc, &tb, &ldb) && n <= INT32_MAX && k <= INT32_MAX;
    cpu_mm_way way = mm_way(ok_b, sar, sac, m, k);
    if (way == CPU_MM_GEMV || way == CPU_MM_GEMM) {
        pthread_once(&cpu_blas_once, cpu_blas_open);
        if (!cpu_blas.ready) way = CPU_MM_LOOPS;
    }
    switch (way) {
    case CPU_MM_ROWS:
        mv_omp(a, sar, b, ldb, tb, c, m, k, n); /* as a matrix–vector group does */
        return;
    case CPU_MM_GEMV: {
        /* c [n] = b^T a: b normal is [k, n] (Trans), transposed is held as [n, k]. */
        int incx = k == 1 ? 1 : (int)sac;
        if (!tb)
            cpu_blas.sgemv(CblasRowMajor, CblasTrans, (int)k, (int)n, 1.0f, b, (int)ldb, a, incx,
                           0.0f, c, 1);
        else
            cpu_blas.sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, b, (int)ldb, a,
                           incx, 0.0f, c, 1);
        return;
    }
    case CPU_MM_GEMM:
        mk_matrix_layout(m, k, sar, sac, &ta, &lda);
        cpu_blas.sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                       tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)lda,
                       b, (int)ldb, 0.0f, c, (int)n);
        return;
    case CPU_MM_LOOPS:
        mm_loops(a, sar, sac, b, sbr, sbc, c, m, k, n);
        return;
    }
}

/* Per-product work (m·k·n) below which batches use mm_loops, on OpenMP threads. */
#define CPU_MM_SMALL (64 * 64 * 64)

/*
 * Whether cpu_matmul may take launch l (a MatMul or a PrefixMatMul, whose
 * prefix only narrows k) to CBLAS: a product of more rows than mv_omp takes,
 * unless it is one of a batch of small ones (mm_loops). Low-precision weights
 * are widened into a layout CBLAS reads.
 */
static bool matmul_may_use_blas(const mk_launch *l) {
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    int ra = a->rank, rb = b->rank;
    int64_t m = ra == 1 ? 1 : a->shape[ra - 2], k = a->shape[ra - 1], n = b->shape[rb - 1];
    if (ra == 3 && m * k * n < CPU_MM_SMALL) return false;
    bool tb;
    int64_t ldb;
    bool ok_b = k <= INT32_MAX && n <= INT32_MAX &&
                (b->dtype != MK_DTYPE_FLOAT32 ||
                 mk_matrix_layout(k, n, b->stride[rb - 2], b->stride[rb - 1], &tb, &ldb));
    cpu_mm_way way = mm_way(ok_b, ra == 1 ? 0 : a->stride[ra - 2], a->stride[ra - 1], m, k);
    return way == CPU_MM_GEMV || way == CPU_MM_GEMM;
}

/*
 * out = a @ b, float32:
 *   [k] @ [k, n] → [n];  [m, k] @ [k, n] → [m, n];  [B, m, k] @ [B, k, n] → [B, m, n].
 * a and b are strided (see mk_matrix_layout); out is contiguous.
 */
static int cpu_matmul(const mk_launch *l, mk_error **err) {
    const mk_tensor *a = &l->in[0];
    mk_tensor wide = l->in[1], *b = &wide;
    if (b->dtype != MK_DTYPE_FLOAT32) {
        /* low-precision weights, widened into scratch: in their own layout where
         * they fill their memory (a permuted weight stays transposed, read as
         * a matrix–vector group reads it), else dense */
        wide.data = l->scratch;
        wide.dtype = MK_DTYPE_FLOAT32;
        if (mk_tensor_is_dense_permuted(&l->in[1])) {
            mk_convert(l->scratch, MK_DTYPE_FLOAT32, l->in[1].data, l->in[1].dtype,
                       mk_tensor_numel(b));
        } else {
            mk_launch copy = {.node = l->node, .n_in = 1, .in = {l->in[1]}, .out = wide};
            mk_contiguous_strides(b->rank, b->shape, copy.out.stride);
            cpu_cast(&copy, err);
            wide = copy.out;
        }
    }
    float *c = l->out.data;
    const float *ap = a->data, *bp = b->data;
    if (a->rank == 1 && b->rank == 2) {
        int64_t k = a->shape[0], n = b->shape[1];
        mm_one(ap, 0, a->stride[0], bp, b->stride[0], b->stride[1], c, 1, k, n);
        return 0;
    }
    if (a->rank == 2 && b->rank == 2) {
        int64_t m = a->shape[0], k = a->shape[1], n = b->shape[1];
        mm_one(ap, a->stride[0], a->stride[1], bp, b->stride[0], b->stride[1], c, m, k, n);
        return 0;
    }
    if (a->rank == 3 && b->rank == 3) {
        int64_t B = a->shape[0], m = a->shape[1], k = a->shape[2], n = b->shape[2];
        int64_t asb = a->stride[0], bsb = b->stride[0];
        if (m * k * n < CPU_MM_SMALL) {
            /* Attention over one token: many small products, one per thread. */
            CPU_FOR(B > 1 && par(B * m * k * n / 4), t, B, {
                mm_loops(ap + t * asb, a->stride[1], a->stride[2], bp + t * bsb, b->stride[1],
                         b->stride[2], c + t * m * n, m, k, n);
            });
        } else {
            for (int64_t t = 0; t < B; t++)
                mm_one(ap + t * asb, a->stride[1], a->stride[2], bp + t * bsb, b->stride[1],
                       b->stride[2], c + t * m * n, m, k, n);
        }
        return 0;
    }
    return MK_INTERNAL(err, "matrix product: operand ranks not 1/2, 2/2 or 3/3");
}

/* out = a @ b over the first p elements of the shared axis (p: int64 [1], read
 * now, 0 <= p <= that axis): the product of a and b narrowed to them. */
static int cpu_prefix_matmul(const mk_launch *l, mk_error **err) {
    mk_launch narrow = *l;
    mk_tensor *a = &narrow.in[0], *b = &narrow.in[1];
    int64_t s = a->shape[a->rank - 1], p = read_i64(&l->in[2]);
    if (p < 0 || p > s)
        return mk_fault(err, l->node, MK_FAULT_PREFIX, p, s, 0);
    if (p == 0) {
        memset(l->out.data, 0, (size_t)mk_tensor_numel(&l->out) * sizeof(float));
        return 0;
    }
    a->shape[a->rank - 1] = p;
    b->shape[b->rank - 2] = p;
    return cpu_matmul(&narrow, err);
}

/* ---- row reductions: rms_norm, sliced_softmax, argmax ------------------- */

/* o [n] = w [n] * x [n] / sqrt(mean(x²) + 1e-5), as run.c's rmsnorm (o may be x). */
static void rms_row(const float *x, const float *w, float *o, int64_t n) {
    float ss = 0.0f;
    for (int64_t j = 0; j < n; j++)
        ss += x[j] * x[j];
    ss /= (float)n;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    #pragma omp simd
    for (int64_t j = 0; j < n; j++)
        o[j] = w[j] * (ss * x[j]);
}

/* out [rows, n] = w [n] * x [rows, n] / sqrt(mean(x²) + 1e-5), as run.c's rmsnorm. */
static int cpu_rms_norm(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0], *wt = &l->in[1];
    int64_t n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    const float *xp = x->data, *w = wt->data;
    float *out = l->out.data;
    CPU_FOR(rows > 1 && par(rows * n), r, rows, { rms_row(xp + r * n, w, out + r * n, n); });
    return 0;
}

/*
 * e^x for eight floats x <= 0, as a softmax needs them (the row's max already
 * subtracted): x = n ln2 + r with |r| <= ln2 / 2, n rounded to nearest by
 * adding 1.5 * 2^23 (so no float-to-int conversion), e^r by Cephes' expf
 * polynomial, times 2^n built in the exponent's bits. Within 2 ulp of expf;
 * 0 below -87.3 (where expf goes subnormal), -inf included; NaN stays NaN.
 */
static inline cpu_v8 exp8(cpu_v8 x) {
    const cpu_v8 lo = (cpu_v8){0} - 87.33654f, round = (cpu_v8){0} + 12582912.0f; /* 1.5 * 2^23 */
    cpu_i32x8 under = x < lo;
    x = (cpu_v8)(((cpu_i32x8)x & ~under) | ((cpu_i32x8)lo & under));
    cpu_v8 t = x * 1.44269504088896341f + round;
    cpu_v8 n = t - round;
    cpu_i32x8 two_n = ((cpu_i32x8)t - (cpu_i32x8)round + 127) << 23;
    cpu_v8 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    cpu_v8 e = 1.9875691500e-4f * r + 1.3981999507e-3f;
    e = e * r + 8.3334519073e-3f;
    e = e * r + 4.1665795894e-2f;
    e = e * r + 1.6666665459e-1f;
    e = e * r + 5.0000001201e-1f;
    e = (e * r * r + r + 1.0f) * (cpu_v8)two_n;
    return (cpu_v8)((cpu_i32x8)e & ~under);
}

/* o [n] = softmax of x's first p elements (max subtracted, as run.c), the rest
 * copied; o may be x. Eight lanes: the max, e^(x - max) (exp8), their sum in
 * lanes added pairwise then the p % 8 left over in order (expf), the quotients. */
static void softmax_row(const float *x, float *o, int64_t n, int64_t p) {
    if (p > 0) {
        cpu_v8 m = (cpu_v8){0} + x[0];
        int64_t j = 0;
        for (; j + 8 <= p; j += 8) {
            cpu_v8 v = load8(x + j);
            m = (cpu_v8)(((v > m) & (cpu_i32x8)v) | (~(v > m) & (cpu_i32x8)m));
        }
        float max = x[0];
        for (int l = 0; l < 8; l++)
            if (m[l] > max) max = m[l];
        for (; j < p; j++)
            if (x[j] > max) max = x[j];
        cpu_v8 s = {0};
        for (j = 0; j + 8 <= p; j += 8) {
            cpu_v8 e = exp8(load8(x + j) - max);
            memcpy(o + j, &e, sizeof e);
            s += e;
        }
        float sum = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
        for (; j < p; j++) {
            o[j] = expf(x[j] - max);
            sum += o[j];
        }
        #pragma omp simd
        for (j = 0; j < p; j++)
            o[j] /= sum;
    }
    if (o != x)
        memcpy(o + p, x + p, (size_t)(n - p) * sizeof(float));
}

/*
 * out [rows, n]: per row, softmax of x's first p elements (max subtracted, as
 * run.c), the other n - p copied; p: int64 [1], read now, 0 <= p <= n.
 */
static int cpu_sliced_softmax(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    int64_t p = read_i64(&l->in[1]);
    if (p < 0 || p > n)
        return mk_fault(err, l->node, MK_FAULT_PREFIX, p, n, 0);
    const float *xp = x->data;
    float *out = l->out.data;
    CPU_FOR(rows > 1 && par(rows * n * 4), r, rows, { softmax_row(xp + r * n, out + r * n, n, p); });
    return 0;
}

/*
 * out [..., T, S]: row t of each T, softmax of x's first end - T + 1 + t
 * elements (as softmax_row), the rest zero; end: int64 [1], read now,
 * T <= end <= S.
 */
static int cpu_causal_softmax(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t n = x->shape[x->rank - 1], t = x->shape[x->rank - 2], rows = mk_tensor_numel(x) / n;
    int64_t end = read_i64(&l->in[1]);
    if (end < t || end > n)
        return mk_fault(err, l->node, MK_FAULT_END, end, n, t);
    const float *xp = x->data;
    float *out = l->out.data;
    CPU_FOR(rows > 1 && par(rows * n * 4), r, rows, {
        int64_t p = end - t + 1 + r % t;
        softmax_row(xp + r * n, out + r * n, p, p);
        memset(out + r * n + p, 0, (size_t)(n - p) * sizeof(float));
    });
    return 0;
}

/* out [rows] (int64; shape [..., 1]) = index of the largest of x [rows, n], the first on ties. */
static int cpu_argmax(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    const float *xp = x->data;
    int64_t *out = l->out.data;
    CPU_FOR(rows > 1 && par(rows * n), r, rows, { out[r] = mk_argmax_row(xp + r * n, n); });
    return 0;
}

/* out [rows, 2] (int64) = run.c's (token, next state) per row of logits
 * [rows, n], from state [rows, 1] and float32 [1] temperature and top-p; the
 * rows one after another (sample.c), the keys in the scratch's head. */
static int cpu_sample(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    const int64_t *state = l->in[1].data;
    float temperature = *(const float *)l->in[2].data, topp = *(const float *)l->in[3].data;
    int64_t *out = l->out.data;
    uint64_t *keys = l->scratch;
    float *probs = (float *)((char *)l->scratch + mk_sample_head(rows, n));
    for (int64_t r = 0; r < rows; r++) {
        uint64_t s = (uint64_t)state[r];
        out[2 * r] = mk_sample_row((const float *)x->data + r * n, n, &s, temperature, topp,
                                   probs, keys);
        out[2 * r + 1] = (int64_t)s;
    }
    return 0;
}

/* ---- matrix–vector groups ---------------------------------------------- */

static const mk_kernel cpu_kernels[MK_KERNEL_COUNT];

/* Where node x's values lie while group l runs: an operand of the group, a
 * result (the group's memory, or the memory a row write writes), a view of a
 * member, or a member's scratch. */
static mk_tensor member_tensor(const mk_launch *l, const mk_node *x) {
    const mk_product_group *pg = mk_node_product(l->node);
    for (int k = 0; k < l->n_in; k++)
        if (l->node->in[k] == x) return l->in[k];
    mk_tensor t = {.dtype = x->dtype, .rank = x->rank};
    memcpy(t.shape, x->shape, sizeof t.shape);
    memcpy(t.stride, x->stride, sizeof t.stride);
    if (x->op->role == MK_ROLE_INPLACE) { /* a row write: in place into its x */
        t.data = member_tensor(l, x->in[0]).data;
        return t;
    }
    if (x->storage == MK_STORAGE_VIEW) { /* a view of a member that owns memory */
        t.data = (char *)member_tensor(l, x->owner).data + x->view_offset;
        return t;
    }
    for (int o = 0; o < pg->n_outs; o++)
        if (pg->out[o].end == x) {
            t.data = (float *)l->out.data + pg->out[o].offset;
            return t;
        }
    const mk_group *grp = l->node->group;
    for (int m = 0; m < grp->n_members; m++)
        if (grp->members[m] == x) t.data = (char *)l->scratch + pg->scratch[m];
    return t;
}

/*
 * Decode attention over the first p cached rows only, in one parallel loop
 * over the batch (the heads): per head, the scores of its m query rows
 * against K's first p rows (dense [m, p] in the scores' scratch), their
 * softmax, and their sum of V's first p rows. Rows past p are never read, so
 * the cost grows with p, not with the cache.
 */
static int cpu_attention(const mk_launch *l, mk_error **err) {
    const mk_product_group *pg = mk_node_product(l->node);
    const mk_attention_info *at = &pg->att;
    mk_node *const *members = l->node->group->members; /* the scores, the softmax, the sum */
    const mk_node *softmax = members[1];
    mk_tensor scores = member_tensor(l, members[0]), out = member_tensor(l, members[2]);
    const mk_tensor *q = &l->in[at->q], *kt = &l->in[at->kt], *v = &l->in[at->v];
    int64_t B = at->batch, m = at->m, d = at->d, n = at->n, p = read_i64(&l->in[at->p]);
    if (p < 0 || p > at->s) return mk_fault(err, softmax, MK_FAULT_PREFIX, p, at->s, 0);
    float *sc = scores.data, *o = out.data;
    const float *qp = q->data, *kp = kt->data, *vp = v->data;
    CPU_FOR(B > 1 && par(B * m * (d + n) * p), t, B, {
        float *st = sc + t * m * p, *ot = o + t * m * n;
        if (p == 0) {
            memset(ot, 0, (size_t)(m * n) * sizeof(float));
            continue;
        }
        mm_loops(qp + t * q->stride[0], q->stride[1], q->stride[2], kp + t * kt->stride[0],
                 kt->stride[1], kt->stride[2], st, m, d, p);
        for (int64_t i = 0; i < m; i++)
            softmax_row(st + i * p, st + i * p, p, p);
        mm_loops(st, p, 1, vp + t * v->stride[0], v->stride[1], v->stride[2], ot, m, p, n);
    });
    return 0;
}

/*
 * A matrix–vector group (product.c) in one parallel region. A's rows go
 * dense into scratch first, normalised where the group folds the RmsNorm in
 * (rms_row, as the node alone). The threads then share the results' columns
 * in contiguous runs of quads; per chunk of CPU_MV_CHUNK columns and row of
 * A, a thread takes its products' dot products (mv_columns; mv_rows for
 * weights held by rows), gathers the operands the epilogue reads
 * (gather_run), runs the epilogue's program (program_f32),
 * rotates the pairs, and writes the values (into the group's memory or the
 * rows a write replaces) or keeps the row's best for the ArgMax. Every value
 * is the one the nodes alone compute, bit for bit; the logits of a greedy
 * classifier are never stored. Except where a FakeQuantize is folded in: A
 * then goes onto the int8 grid (q8_scale, q8_value, as the node alone) and
 * the products are runq.c's integer dot products (mv_columns_q8), which the
 * nodes alone (a float32 product of the rounded values) equal only up to
 * rounding.
 */
/* dst [t] = elements e0 + t (t < len) of a result (rank >= 1, shape), read
 * from an operand broadcast onto it (its strides): one division per
 * dimension, then runs along the last one (copied, or filled where it is
 * broadcast), an odometer carrying between them. An element-by-element
 * division cost more than the small products it follows. */
static void gather_run(float *restrict dst, const float *restrict src, int64_t e0, int64_t len,
                       int rank, const int64_t *shape, const int64_t *stride) {
    int64_t idx[MK_MAX_RANK], off = 0;
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = e0 % shape[d];
        off += idx[d] * stride[d];
        e0 /= shape[d];
    }
    int last = rank - 1;
    int64_t step = stride[last];
    while (len > 0) {
        int64_t run = shape[last] - idx[last] < len ? shape[last] - idx[last] : len;
        if (step == 1)
            memcpy(dst, src + off, (size_t)run * sizeof(float));
        else
            for (int64_t t = 0; t < run; t++) dst[t] = src[off + t * step];
        dst += run, len -= run;
        off -= idx[last] * step; /* back to the row's start */
        idx[last] = 0;
        for (int d = last - 1; d >= 0; d--) { /* the next row: an odometer */
            off += stride[d];
            if (++idx[d] < shape[d]) break;
            off -= shape[d] * stride[d];
            idx[d] = 0;
        }
    }
}

typedef struct {
    float v;
    int64_t at; /* -1: none yet */
} cpu_best;

/* A result as its chunks read it, resolved once per launch. */
typedef struct {
    const mk_product_out *r;
    const float *data[MK_X_IN];           /* per source: the operand (not a product) */
    cpu_weights w[MK_X_IN];               /* per source: a product's weights */
    int64_t stride[MK_X_IN][MK_MAX_RANK]; /* an operand's, broadcast onto its shape */
    const float *rot;                     /* the rotation's (cos, sin) operand, or NULL */
    int64_t rot_stride[MK_MAX_RANK];
    void *dst;                            /* element 0 of the values; ArgMax: row ids */
} cpu_mv_out;

/* Operand t broadcast onto (rank, shape): its strides into s. */
static void broadcast_strides(const mk_tensor *t, int rank, const int64_t *shape, int64_t *s) {
    mk_tensor like = {.rank = rank};
    memcpy(like.shape, shape, sizeof like.shape);
    mk_tensor b = mk_tensor_broadcast(t, &like);
    memcpy(s, b.stride, sizeof b.stride);
}

/* Columns [j0, j1) of row i of result x (j0 a multiple of 4); a the row of A,
 * or aq and as that row on the int8 grid (a FakeQuantize folded in). */
static void mv_chunk(const cpu_mv_out *x, const float *a, const int8_t *aq, const float *as,
                     int64_t k, int64_t i, int64_t j0, int64_t j1, cpu_best *best) {
    const mk_product_out *r = x->r;
    float src[MK_X_IN][CPU_MV_CHUNK], v[CPU_MV_CHUNK];
    const char *in[MK_X_IN];
    const int64_t ones[MK_X_IN] = {1, 1, 1, 1};
    int64_t len = j1 - j0, e0 = i * r->n + j0;
    for (int s = 0; s < r->n_src; s++) {
        const mk_product_source *ps = &r->src[s];
        if (ps->product >= 0 && aq)
            mv_columns_q8(aq, as, &x->w[s], k, j0, j1, src[s]);
        else if (ps->product >= 0 && x->w[s].rows)
            mv_rows(a, (const float *)x->w[s].data + j0, x->w[s].ldb, k, len, src[s]);
        else if (ps->product >= 0)
            mv_columns(a, &x->w[s], k, j0, j1, src[s]);
        else
            gather_run(src[s], x->data[s], e0, len, ps->rank, ps->shape, x->stride[s]);
        in[s] = (const char *)src[s];
    }
    const float *val = src[0];
    if (r->program.n) {
        program_f32(&r->program, (char *)v, in, ones, len);
        val = v;
    }
    if (x->rot) { /* (re, im) pairs times the rotation's, as complex_mul rounds them */
        float rot[CPU_MV_CHUNK];
        gather_run(rot, x->rot, e0, len, r->rotate_rank, r->rotate_shape, x->rot_stride);
        for (int64_t t = 0; t < len; t += 2) {
            float cr = rot[t], ci = rot[t + 1];
            float re = val[t], im = val[t + 1];
            v[t] = re * cr - im * ci;
            v[t + 1] = re * ci + im * cr;
        }
        val = v;
    }
    if (!r->argmax) {
        memcpy((float *)x->dst + e0, val, (size_t)len * sizeof(float));
        return;
    }
    for (int64_t t = 0; t < len; t++) /* as cpu_argmax: column 0, then only larger ones */
        if (j0 + t == 0 || val[t] > best->v) best->v = val[t], best->at = j0 + t;
}

static int cpu_matvec(const mk_launch *l, mk_error **err) {
    const mk_product_group *pg = mk_node_product(l->node);
    const mk_tensor *at = &l->in[pg->a];
    int64_t m = pg->m, k = pg->k, rs = at->stride[0], cs = at->stride[1];
    float *a = l->scratch;
    for (int64_t i = 0; i < m; i++) {
        const float *row = (const float *)at->data + i * rs;
        if (cs == 1)
            memcpy(a + i * k, row, (size_t)k * sizeof(float));
        else
            for (int64_t j = 0; j < k; j++) a[i * k + j] = row[j * cs];
        if (pg->norm_w >= 0) rms_row(a + i * k, l->in[pg->norm_w].data, a + i * k, k);
    }
    int64_t g = pg->a8_group, groups = g ? m * k / g : 0;
    float *as = a + m * k;                     /* A on the int8 grid: a scale per group, */
    int8_t *aq = (int8_t *)(as + groups);      /* and the values */
    for (int64_t t = 0; t < groups; t++) {
        as[t] = q8_scale(a + t * g, g);
        for (int64_t e = t * g; e < (t + 1) * g; e++) aq[e] = q8_value(a[e], as[t]);
    }
    cpu_mv_out outs[MK_PRODUCTS_MAX];
    int64_t quads = 0, first[MK_PRODUCTS_MAX + 1]; /* result o's quads from first[o] */
    for (int o = 0; o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        cpu_mv_out *x = &outs[o];
        *x = (cpu_mv_out){.r = r, .dst = (float *)l->out.data + r->offset};
        for (int s = 0; s < r->n_src; s++) {
            const mk_product_source *ps = &r->src[s];
            int j = ps->product;
            const mk_tensor *t = &l->in[j >= 0 ? pg->b[j] : ps->in];
            x->data[s] = t->data;
            if (j < 0) {
                broadcast_strides(t, ps->rank, ps->shape, x->stride[s]);
                continue;
            }
            x->w[s] = (cpu_weights){.data = t->data, .dtype = t->dtype, .ldb = t->stride[1]};
            if (pg->b_rows[j]) x->w[s].ldb = t->stride[0], x->w[s].rows = true;
            if (pg->b_scale[j] >= 0) {
                const mk_tensor *sc = &l->in[pg->b_scale[j]];
                x->w[s].scale = sc->data;
                x->w[s].group = pg->b_group[j];
                x->w[s].ss_k = sc->stride[0];
                x->w[s].ss_n = sc->stride[1];
            }
        }
        if (r->rotate >= 0) {
            x->rot = l->in[r->rotate].data;
            broadcast_strides(&l->in[r->rotate], r->rotate_rank, r->rotate_shape, x->rot_stride);
        }
        if (r->row_x >= 0) { /* checked now, as the write alone would */
            const mk_tensor *w = &l->in[r->row_x];
            int64_t begin = read_i64(&l->in[r->row_begin]), end = read_i64(&l->in[r->row_end]);
            if (row_bounds(r->end, begin, end, w->shape[0], r->row_count, err)) return -1;
            x->dst = (float *)w->data + begin * (mk_tensor_numel(w) / w->shape[0]);
        }
        first[o] = quads;
        quads += (r->n + 3) / 4;
    }
    first[pg->n_outs] = quads;
    int threads = max_threads();
    cpu_best best[threads][MK_PRODUCTS_MAX][MK_MATVEC_ROWS];
    for (int t = 0; t < threads; t++)
        for (int o = 0; o < MK_PRODUCTS_MAX; o++)
            for (int i = 0; i < MK_MATVEC_ROWS; i++) best[t][o][i] = (cpu_best){-INFINITY, -1};
    CPU_REGION(par(m * k * 4 * quads), {
        int64_t q0, q1;
        my_share(quads, &q0, &q1);
        int me = thread_index();
        for (int o = 0; o < pg->n_outs; o++) {
            int64_t n = pg->out[o].n;
            int64_t j = 4 * (q0 > first[o] ? q0 - first[o] : 0);
            int64_t end = 4 * (q1 < first[o + 1] ? q1 - first[o] : first[o + 1] - first[o]);
            if (end > n) end = n;
            for (; j < end; j += CPU_MV_CHUNK) {
                int64_t j1 = j + CPU_MV_CHUNK < end ? j + CPU_MV_CHUNK : end;
                for (int64_t i = 0; i < m; i++)
                    mv_chunk(&outs[o], a + i * k, g ? aq + i * k : NULL, g ? as + i * (k / g) : NULL,
                             k, i, j, j1, &best[me][o][i]);
            }
        }
    });
    for (int o = 0; o < pg->n_outs; o++) /* the threads' bests, in column order */
        for (int64_t i = 0; pg->out[o].argmax && i < m; i++) {
            cpu_best b = {-INFINITY, -1};
            for (int t = 0; t < threads; t++)
                if (best[t][o][i].at >= 0 && (b.at < 0 || best[t][o][i].v > b.v)) b = best[t][o][i];
            ((int64_t *)outs[o].dst)[i] = b.at;
        }
    return 0;
}

/* A matrix-vector group with its gathered operands at their ids' rows
 * (mk_product_gather): the error of the EmbeddingNode folded in where an id
 * is out of range. */
static int cpu_product(const mk_launch *l, mk_error **err) {
    const mk_product_group *pg = mk_node_product(l->node);
    if (pg->kind == MK_PRODUCT_ATTENTION) return cpu_attention(l, err);
    if (!pg->n_gathers) return cpu_matvec(l, err);
    mk_launch at = *l;
    for (int r = 0; r < pg->n_gathers; r++) {
        const mk_product_gather *ga = &pg->gather[r];
        int64_t id = *(const int64_t *)l->in[ga->ids].data;
        if (id < 0 || id >= ga->rows) return mk_fault(err, ga->node, MK_FAULT_ID, id, 0, ga->rows);
        at.in[ga->in].data = (char *)at.in[ga->in].data + id * ga->row_bytes;
    }
    return cpu_matvec(&at, err);
}

/* ---- the device table --------------------------------------------------- */

/*
 * The cost rule for threads. A parallel region costs a fork and a join
 * (measured once per process: the median of empty regions); splitting a
 * launch over T threads saves at most (1 - 1/T) of its time, so it pays only
 * when the launch alone takes longer than twice the fork. How long a launch
 * takes is estimated from the bytes it reads and writes: at the rate a
 * thread reads a hot matrix (measured once, mv_columns over 128 KiB) when
 * the model's constants fit in the threads' own caches (L2 times threads),
 * so that they stay hot between evaluations (a game's policy net: one
 * thread); otherwise its weights stream from the shared cache or memory,
 * which more threads read faster, and the launch may fork whenever its work
 * reaches CPU_PAR_MIN (a language model). Not the last-level cache: shared
 * with every other core and process, and what a VM reports for it can be
 * the whole host's (533 MB on the development machine).
 *
 * MK_CPU_FORK=always lets every launch fork (the C tests set it, so that their
 * small graphs run the threaded paths); MK_CPU_FORK=never keeps every launch
 * on the calling thread.
 */
static struct {
    double fork_ns;      /* an empty parallel region of all threads */
    double hot_bytes_ns; /* one thread reading a matrix held in cache */
    double cache_bytes;  /* the threads' own caches: L2 times threads */
    int rule;            /* MK_CPU_FORK: 0 auto (the rule), 1 always, -1 never */
} cpu_cost;
static pthread_once_t cpu_cost_once = PTHREAD_ONCE_INIT;

static int by_value(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static void cpu_calibrate(void) {
    const char *rule = getenv("MK_CPU_FORK");
    cpu_cost.rule = !rule ? 0 : !strcmp(rule, "always") ? 1 : !strcmp(rule, "never") ? -1 : 0;
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    cpu_cost.cache_bytes = (l2 > 0 ? (double)l2 : 1024.0 * 1024) * max_threads();
    cpu_cost.fork_ns = 0.0;
    cpu_cost.hot_bytes_ns = 1.0;
    if (max_threads() < 2) return; /* nothing forks */
    double t[15];
    for (int r = 0; r < 18; r++) {
        double t0 = mk_now_ms();
#pragma omp parallel
        {
            (void)thread_index();
        }
        if (r >= 3) t[r - 3] = (mk_now_ms() - t0) * 1e6;
    }
    qsort(t, 15, sizeof t[0], by_value);
    cpu_cost.fork_ns = t[7];
    enum { K = 256, N = 128 };
    float *b = malloc((size_t)(K * N + K + N) * sizeof(float));
    if (!b) return;
    for (int i = 0; i < K * N + K; i++) b[i] = (float)(i % 7) * 0.125f;
    double best = INFINITY;
    for (int r = 0; r < 6; r++) {
        double t0 = mk_now_ms();
        mv_columns(b + K * N, &(cpu_weights){.data = b, .dtype = MK_DTYPE_FLOAT32, .ldb = K}, K,
                   0, N, b + K * N + K);
        double ns = (mk_now_ms() - t0) * 1e6;
        if (ns < best) best = ns;
    }
    free(b);
    cpu_cost.hot_bytes_ns = (double)K * N * sizeof(float) / (best > 1.0 ? best : 1.0);
}

/* A model's launches that may fork (cpu_prepare), or NULL: all may. */
typedef struct {
    bool *may_fork;
} cpu_state;

static int cpu_open(void **state, mk_error **err) {
    cpu_state *s = calloc(1, sizeof *s);
    if (!s) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "the CPU device's state");
    *state = s;
    return 0;
}

static void cpu_close(void *state) {
    cpu_state *s = state;
    if (s) free(s->may_fork);
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
    pthread_once(&cpu_cost_once, cpu_calibrate);
    for (int i = 0; i < n; i++) {
        int kernel = launches[i].node->op->kernel;
        if ((kernel != MK_KERNEL_MATMUL && kernel != MK_KERNEL_PREFIX_MATMUL) ||
            !matmul_may_use_blas(&launches[i]))
            continue;
        pthread_once(&cpu_blas_once, cpu_blas_open);
        if (!cpu_blas.ready)
            return mk_fail(err, MK_ERR_DEVICE, launches[i].node->line, launches[i].node->column,
                           "%s $%d: the CPU's matrix products need OpenBLAS, which cannot be "
                           "opened: %s",
                           launches[i].node->op->name, launches[i].node->id, cpu_blas.why);
        break;
    }
    /* the constants' bytes, each counted once (by its owner) */
    double constants = 0.0;
    const mk_node **seen = calloc((size_t)n * MK_MAX_INPUTS + 1, sizeof *seen);
    free(s->may_fork);
    if (!seen || !(s->may_fork = calloc((size_t)n + 1, sizeof *s->may_fork))) {
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
    bool hot = constants <= cpu_cost.cache_bytes;
    int forks = 0;
    for (int i = 0; i < n; i++) {
        const mk_launch *l = &launches[i];
        double bytes = (double)tensor_bytes(&l->out);
        for (int k = 0; k < l->n_in; k++) bytes += (double)tensor_bytes(&l->in[k]);
        s->may_fork[i] = cpu_cost.rule > 0 ||
                         (cpu_cost.rule == 0 && cpu_cost.fork_ns > 0 &&
                          (!hot || bytes / cpu_cost.hot_bytes_ns > 2 * cpu_cost.fork_ns));
        forks += s->may_fork[i];
    }
    if (cpu_cost.fork_ns > 0)
        host->log(host, MK_LOG_INFO,
                  "cpu: %d of %d launches may use %d threads (constants %.1f MB, %s the threads' "
                  "%.1f MB of L2; a fork costs %.1f us, a hot matrix reads at %.0f GB/s)",
                  forks, n, max_threads(), constants / 1e6, hot ? "within" : "beyond",
                  cpu_cost.cache_bytes / 1e6, cpu_cost.fork_ns / 1e3, cpu_cost.hot_bytes_ns);
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
        cpu_may_fork = !s->may_fork || s->may_fork[i];
        if (mk_cpu_device.kernels[l->node->op->kernel].fn(l, err) != 0)
            return -1;
        host->progress(host, MK_PHASE_RUN, i + 1, n);
    }
    cpu_may_fork = true;
    for (int o = 0; o < n_out; o++)
        if (out[o].bytes && out[o].device != out[o].host)
            memcpy(out[o].host, out[o].device, out[o].bytes);
    return 0;
}

#define F32 MK_DTYPE_BIT(MK_DTYPE_FLOAT32)
#define I64 MK_DTYPE_BIT(MK_DTYPE_INT64)
#define F16 MK_DTYPE_BIT(MK_DTYPE_FLOAT16)
#define BF16 MK_DTYPE_BIT(MK_DTYPE_BFLOAT16)
/* Indexed by kernel family; the dtypes are those of every data operand and the
 * result (argmax: float32 in, int64 out; embedding: int64 ids). */
static const mk_kernel cpu_kernels[MK_KERNEL_COUNT] = {
    [MK_KERNEL_POINTWISE] = {cpu_pointwise, F32 | I64},
    [MK_KERNEL_MATMUL] = {cpu_matmul, F32 | F16 | BF16}, /* a and out float32 (the op's rule) */
    [MK_KERNEL_PERMUTE] = {cpu_permute, MK_DTYPES_ALL},
    [MK_KERNEL_REPLACE_SLICE] = {cpu_replace_slice, MK_DTYPES_ALL},
    [MK_KERNEL_RMS_NORM] = {cpu_rms_norm, F32},
    [MK_KERNEL_COMPLEX_MUL] = {cpu_complex_mul, F32},
    [MK_KERNEL_SLICED_SOFTMAX] = {cpu_sliced_softmax, F32},
    [MK_KERNEL_CAUSAL_SOFTMAX] = {cpu_causal_softmax, F32},
    [MK_KERNEL_EMBEDDING] = {cpu_embedding, MK_DTYPES_ALL},
    [MK_KERNEL_ARGMAX] = {cpu_argmax, F32 | I64},
    [MK_KERNEL_PRODUCT] = {cpu_product, F32 | I64 | F16 | BF16 | MK_DTYPE_BIT(MK_DTYPE_INT8)},
    [MK_KERNEL_PREFIX_MATMUL] = {cpu_prefix_matmul, F32}, /* the prefix: a bound */
    [MK_KERNEL_CAST] = {cpu_cast, MK_DTYPES_ALL},
    [MK_KERNEL_DEQUANTIZE] = {cpu_dequantize, F32 | MK_DTYPE_BIT(MK_DTYPE_INT8)},
    [MK_KERNEL_FAKE_QUANTIZE] = {cpu_fake_quantize, F32},
    [MK_KERNEL_SAMPLE] = {cpu_sample, F32 | I64},
};

const mk_device_ops mk_cpu_device = {
    .name = "cpu",
    .kernels = cpu_kernels,
    .target = {.pointwise_operands = MK_X_IN, .int8_products = INT64_MAX, .row_products = true},
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .zero = cpu_zero,
    .prepare = cpu_prepare,
    .evaluate = cpu_evaluate,
};
