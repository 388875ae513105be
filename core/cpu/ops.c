/*
 * ops.c — the CPU kernels of single ops: pointwise programs (an op's, or a
 * fused pointwise group's), complex_mul, permute, the conversions (cast,
 * dequantize, fake_quantize), row writes and embeddings, and the row
 * reductions (rms_norm, the softmaxes, argmax, sample). The elementwise ones
 * run a row function over the strided walk (walk_run), in tiles.
 */
#include "cpu.h"
#include "vec.h"

#include <math.h>
#include <string.h>

/* ---- the strided walk --------------------------------------------------- */

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
 * is the bytes one walk element takes in the output, in_size[k] the bytes of
 * one element of input k.
 */
static void walk_run(const mk_walk *w, size_t out_step, const size_t *in_size, char *o,
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
            at[k] = (const char *)in[k] + (size_t)(mk_walk_row_offset(w, k, row) + c0 * s[k]) * in_size[k];
        fn(ctx, o + (size_t)(row * n + c0) * out_step, at, s, len);
    });
}

/* ---- pointwise expressions ----------------------------------------------- */

/*
 * A pointwise op's program (expr.c) over one stretch, in chunks of CPU_CHUNK
 * elements: operands of the compute dtype are read in place where they are
 * contiguous (else gathered), bool operands gathered as 0 or 1; a constant is
 * one value, never a filled chunk; each instruction is one vectorisable loop
 * over the chunk into a register on the stack (or a single value when all it
 * reads are constants), and the last one writes the output directly (a bool
 * output: the chunk's values != 0, as bytes). So `a + b` is a single loop,
 * ReLU (MK_X_MAX with a constant) one, and SiLU five short passes over L1.
 * Float32 evaluates one rounding per operation (the build does not
 * contract), which keeps SiLU bit-identical to run.c's; int64 + - * wrap
 * around.
 */
#define CPU_CHUNK 256

/* What each operation means in each compute dtype; the CUDA interpreter
 * (kernels/pointwise.cu) and generated kernels (codegen.c) say the same. */
static inline float f32_neg(float x) { return -x; }
static inline float f32_abs(float x) { return fabsf(x); }
static inline float f32_add(float x, float y) { return x + y; }
static inline float f32_sub(float x, float y) { return x - y; }
static inline float f32_mul(float x, float y) { return x * y; }
static inline float f32_div(float x, float y) { return x / y; }
static inline float f32_gt(float x, float y) { return x > y ? 1.0f : 0.0f; }
static inline float f32_lt(float x, float y) { return x < y ? 1.0f : 0.0f; }
static inline float f32_ge(float x, float y) { return x >= y ? 1.0f : 0.0f; }
static inline float f32_le(float x, float y) { return x <= y ? 1.0f : 0.0f; }
static inline float f32_eq(float x, float y) { return x == y ? 1.0f : 0.0f; }
static inline float f32_ne(float x, float y) { return x != y ? 1.0f : 0.0f; }
static inline float f32_max(float x, float y) { return x > y ? x : y; }
static inline float f32_min(float x, float y) { return x < y ? x : y; }
/* Python's x % y (torch.remainder): fmod's remainder moved to the divisor's sign. */
static inline float f32_mod(float x, float y) {
    float r = fmodf(x, y);
    return r != 0.0f && (r < 0.0f) != (y < 0.0f) ? r + y : r;
}
/* Python's x // y (torch.floor_divide): (x - x % y) / y, exact where fmod is,
 * rounded to the nearest integer (floor(x / y) can miss by one). */
static inline float f32_floordiv(float x, float y) {
    if (y == 0.0f) return x / y;
    float m = fmodf(x, y), d = (x - m) / y;
    if (m != 0.0f && (y < 0.0f) != (m < 0.0f)) d -= 1.0f;
    if (d == 0.0f) return copysignf(0.0f, x / y);
    float f = floorf(d);
    return d - f > 0.5f ? f + 1.0f : f;
}

static inline int64_t i64_add(int64_t x, int64_t y) { return (int64_t)((uint64_t)x + (uint64_t)y); }
static inline int64_t i64_sub(int64_t x, int64_t y) { return (int64_t)((uint64_t)x - (uint64_t)y); }
static inline int64_t i64_mul(int64_t x, int64_t y) { return (int64_t)((uint64_t)x * (uint64_t)y); }
static inline int64_t i64_neg(int64_t x) { return (int64_t)(0 - (uint64_t)x); }
static inline int64_t i64_abs(int64_t x) { return x < 0 ? i64_neg(x) : x; }
static inline int64_t i64_gt(int64_t x, int64_t y) { return x > y; }
static inline int64_t i64_lt(int64_t x, int64_t y) { return x < y; }
static inline int64_t i64_ge(int64_t x, int64_t y) { return x >= y; }
static inline int64_t i64_le(int64_t x, int64_t y) { return x <= y; }
static inline int64_t i64_eq(int64_t x, int64_t y) { return x == y; }
static inline int64_t i64_ne(int64_t x, int64_t y) { return x != y; }
static inline int64_t i64_max(int64_t x, int64_t y) { return x > y ? x : y; }
static inline int64_t i64_min(int64_t x, int64_t y) { return x < y ? x : y; }
/* Floor division and its remainder; by 0 both give 0 (NumPy's), and by -1
 * they never divide (INT64_MIN / -1 traps). */
static inline int64_t i64_mod(int64_t x, int64_t y) {
    if (y == 0 || y == -1) return 0;
    int64_t r = x % y;
    return r != 0 && (r < 0) != (y < 0) ? r + y : r;
}
static inline int64_t i64_floordiv(int64_t x, int64_t y) {
    if (y == 0) return 0;
    if (y == -1) return i64_neg(x);
    int64_t q = x / y;
    return x % y != 0 && (x < 0) != (y < 0) ? q - 1 : q;
}
/* Integer programs never hold the float-only operations (the op rules refuse
 * those dtypes): identities so the one evaluator compiles for both. */
static inline int64_t i64_none(int64_t x) { return x; }
static inline int64_t i64_none2(int64_t x, int64_t y) { (void)y; return x; }

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
        if (sy) {                                                                            \
            _Pragma("omp simd") for (int64_t i = 0; i < len; i++) d[i] = F(x[i], yv);        \
        } else if (sx) {                                                                     \
            _Pragma("omp simd") for (int64_t i = 0; i < len; i++) d[i] = F(xv, y[i]);        \
        } else {                                                                             \
            _Pragma("omp simd") for (int64_t i = 0; i < len; i++) d[i] = F(x[i], y[i]);      \
        }                                                                                    \
        is_one = false;                                                                      \
    } while (0)

/* What one pointwise launch runs: the program, which operands are bool
 * (bit k), and whether the result is. */
typedef struct {
    const mk_expr *e;
    unsigned bool_in;
    bool bool_out;
} cpu_program;

/* Defines NAME: the program over n elements computed in T, the operations
 * P##_op (float32: f32_ and the C library's; int64: i64_). */
#define CPU_PROGRAM(NAME, T, P, EXP, TANH, SQRT, LOG, EXP2, SIN, COS, ERF, FLOOR, CEIL, RINT,   \
                    EXPM1, LOG1P, DIV, POW)                                                  \
    static void NAME(const void *ctx, char *o_, const char *const *in, const int64_t *s,     \
                     int64_t n) {                                                            \
        const cpu_program *pr = ctx;                                                         \
        const mk_expr *e = pr->e;                                                            \
        T regs[MK_EXPR_MAX][CPU_CHUNK], g[MK_X_IN][CPU_CHUNK], one[MK_EXPR_MAX];             \
        for (int64_t i0 = 0; i0 < n; i0 += CPU_CHUNK) {                                      \
            int64_t len = n - i0 < CPU_CHUNK ? n - i0 : CPU_CHUNK;                           \
            const T *r[MK_X_IN + MK_EXPR_MAX];                                               \
            bool single[MK_X_IN + MK_EXPR_MAX] = {false};                                    \
            for (int k = 0; k < e->n_in; k++) { /* operands: in place, or gathered */        \
                if (pr->bool_in & (1u << k)) {                                               \
                    const unsigned char *x = (const unsigned char *)in[k] + i0 * s[k];       \
                    for (int64_t i = 0; i < len; i++)                                        \
                        g[k][i] = x[i * s[k]] != 0;                                          \
                    r[k] = g[k];                                                             \
                    continue;                                                                \
                }                                                                            \
                const T *x = (const T *)in[k] + i0 * s[k];                                   \
                if (s[k] != 1)                                                               \
                    for (int64_t i = 0; i < len; i++)                                        \
                        g[k][i] = x[i * s[k]];                                               \
                r[k] = s[k] == 1 ? x : g[k];                                                 \
            }                                                                                \
            for (int j = 0; j < e->n; j++) {                                                 \
                const mk_xinsn *in = &e->insn[j];                                            \
                bool last = j == e->n - 1, is_one = true;                                    \
                T *restrict d = last && !pr->bool_out ? (T *)o_ + i0 : regs[j];              \
                const T *x = r[in->x], *y = r[in->y], *z = r[in->z];                         \
                bool sx = single[in->x], sy = single[in->y];                                 \
                switch ((mk_xop)in->op) {                                                    \
                case MK_X_CONST: one[j] = (T)in->k; break;                                   \
                case MK_X_NEG: CPU_UNARY(P##_neg); break;                                    \
                case MK_X_ABS: CPU_UNARY(P##_abs); break;                                    \
                case MK_X_EXP: CPU_UNARY(EXP); break;                                        \
                case MK_X_TANH: CPU_UNARY(TANH); break;                                      \
                case MK_X_SQRT: CPU_UNARY(SQRT); break;                                      \
                case MK_X_LOG: CPU_UNARY(LOG); break;                                        \
                case MK_X_EXP2: CPU_UNARY(EXP2); break;                                      \
                case MK_X_SIN: CPU_UNARY(SIN); break;                                        \
                case MK_X_COS: CPU_UNARY(COS); break;                                        \
                case MK_X_ERF: CPU_UNARY(ERF); break;                                        \
                case MK_X_FLOOR: CPU_UNARY(FLOOR); break;                                    \
                case MK_X_CEIL: CPU_UNARY(CEIL); break;                                      \
                case MK_X_RINT: CPU_UNARY(RINT); break;                                      \
                case MK_X_EXPM1: CPU_UNARY(EXPM1); break;                                    \
                case MK_X_LOG1P: CPU_UNARY(LOG1P); break;                                    \
                case MK_X_ADD: CPU_BINARY(P##_add); break;                                   \
                case MK_X_SUB: CPU_BINARY(P##_sub); break;                                   \
                case MK_X_MUL: CPU_BINARY(P##_mul); break;                                   \
                case MK_X_DIV: CPU_BINARY(DIV); break;                                       \
                case MK_X_POW: CPU_BINARY(POW); break;                                       \
                case MK_X_GT: CPU_BINARY(P##_gt); break;                                     \
                case MK_X_LT: CPU_BINARY(P##_lt); break;                                     \
                case MK_X_GE: CPU_BINARY(P##_ge); break;                                     \
                case MK_X_LE: CPU_BINARY(P##_le); break;                                     \
                case MK_X_EQ: CPU_BINARY(P##_eq); break;                                     \
                case MK_X_NE: CPU_BINARY(P##_ne); break;                                     \
                case MK_X_MAX: CPU_BINARY(P##_max); break;                                   \
                case MK_X_MIN: CPU_BINARY(P##_min); break;                                   \
                case MK_X_MOD: CPU_BINARY(P##_mod); break;                                   \
                case MK_X_FLOORDIV: CPU_BINARY(P##_floordiv); break;                         \
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
            if (pr->bool_out) {                                                              \
                const T *v = regs[e->n - 1];                                                 \
                for (int64_t i = 0; i < len; i++)                                            \
                    ((unsigned char *)o_)[i0 + i] = v[i] != 0;                               \
            }                                                                                \
        }                                                                                    \
    }

CPU_PROGRAM(program_f32, float, f32, expf, tanhf, sqrtf, logf, exp2f, sinf, cosf, erff, floorf,
            ceilf, rintf, expm1f, log1pf, f32_div, powf)
CPU_PROGRAM(program_i64, int64_t, i64, i64_none, i64_none, i64_none, i64_none, i64_none, i64_none,
            i64_none, i64_none, i64_none, i64_none, i64_none, i64_none, i64_none, i64_none2,
            i64_none2)

void mk_cpu_program_f32(const void *ctx, char *o, const char *const *in, const int64_t *s,
                        int64_t n) {
    cpu_program pr = {ctx, 0, false};
    program_f32(&pr, o, in, s, n);
}

/* out = the program of its operands (an op's a, b broadcast; a fused group's
 * up to MK_X_IN, each with its strides), computed in the launch's compute
 * dtype (mk_pointwise_compute_dtype); device.c's table lists the dtypes. */
int mk_cpu_pointwise(const mk_launch *l, mk_error **err) {
    if (l->expr->n_in > l->n_in || l->n_in > MK_WALK_MAX)
        return MK_INTERNAL(err, "a pointwise program reads operands its launch does not have");
    const mk_tensor *t[MK_WALK_MAX];
    const void *in[MK_WALK_MAX];
    size_t in_size[MK_WALK_MAX];
    cpu_program pr = {l->expr, 0, l->out.dtype == MK_DTYPE_BOOL};
    for (int k = 0; k < l->n_in; k++) {
        t[k] = &l->in[k], in[k] = l->in[k].data;
        in_size[k] = mk_dtype_size(l->in[k].dtype);
        if (l->in[k].dtype == MK_DTYPE_BOOL) pr.bool_in |= 1u << k;
    }
    mk_walk w;
    walk_of(&w, l->out.rank, l->out.shape, l->n_in, t);
    mk_dtype c = mk_pointwise_compute_dtype(l);
    if (c != MK_DTYPE_FLOAT32 && c != MK_DTYPE_INT64)
        return MK_INTERNAL(err, "a pointwise program in a dtype other than float32 or int64");
    walk_run(&w, mk_dtype_size(l->out.dtype), in_size, l->out.data, in,
             c == MK_DTYPE_INT64 ? program_i64 : program_f32, &pr);
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
int mk_cpu_complex_mul(const mk_launch *l, mk_error **err) {
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    int r = l->out.rank;
    if (r < 1 || l->out.shape[r - 1] != 2)
        return MK_INTERNAL(err, "complex product: the last axis is not 2");
    /* Walk the complex numbers: every dim but the last. */
    mk_walk w;
    walk_of(&w, r - 1, l->out.shape, 2, (const mk_tensor *[]){a, b});
    cpu_complex_ctx ctx = {a->stride[r - 1], b->stride[r - 1]};
    walk_run(&w, 2 * sizeof(float), (const size_t[]){sizeof(float), sizeof(float)}, l->out.data,
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
int mk_cpu_permute(const mk_launch *l, mk_error **err) {
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
        walk_run(&w, es, &es, l->out.data, (const void *[]){x->data}, movers[size_log2].copy,
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
int mk_cpu_cast(const mk_launch *l, mk_error **err) {
    (void)err;
    const mk_tensor *x = &l->in[0];
    mk_walk w;
    walk_of(&w, l->out.rank, l->out.shape, 1, &x);
    const mk_dtype pair[2] = {l->out.dtype, x->dtype};
    walk_run(&w, mk_dtype_size(l->out.dtype), (const size_t[]){mk_dtype_size(x->dtype)}, l->out.data,
             (const void *[]){x->data}, cast_row, pair);
    return 0;
}

/*
 * out = q * scale, float32: q int8 and scale float32 (both strided), scale's
 * dims dividing q's, element i taking scale[i_d / (q_d / scale_d)]. Row by row
 * of the last axis; along it the scale changes every `g` elements.
 */
int mk_cpu_dequantize(const mk_launch *l, mk_error **err) {
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


/* out = s * q per group of `group` along the last axis (x dense). */
int mk_cpu_fake_quantize(const mk_launch *l, mk_error **err) {
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
int mk_cpu_row_bounds(const mk_node *node, int64_t begin, int64_t end, int64_t rows,
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
int mk_cpu_replace_slice(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0], *r = &l->in[1];
    int64_t begin = read_i64(&l->in[2]), end = read_i64(&l->in[3]);
    int64_t rows = x->shape[0], r_rows = r->shape[0];
    if (mk_cpu_row_bounds(l->node, begin, end, rows, r_rows, err)) return -1;
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
int mk_cpu_embedding(const mk_launch *l, mk_error **err) {
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

/* ---- row reductions: rms_norm, the softmaxes, argmax, sample ------------ */

/* o [n] = w [n] * x [n] / sqrt(mean(x²) + 1e-5), as run.c's rmsnorm (o may be x). */
void mk_cpu_rms_row(const float *x, const float *w, float *o, int64_t n) {
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
int mk_cpu_rms_norm(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0], *wt = &l->in[1];
    int64_t n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    const float *xp = x->data, *w = wt->data;
    float *out = l->out.data;
    CPU_FOR(rows > 1 && par(rows * n), r, rows, { mk_cpu_rms_row(xp + r * n, w, out + r * n, n); });
    return 0;
}

/* o [n] = softmax of x's first p elements (max subtracted, as run.c), the rest
 * copied; o may be x. Eight lanes: the max, e^(x - max) (exp8), their sum in
 * lanes added pairwise then the p % 8 left over in order (expf), the quotients. */
void mk_cpu_softmax_row(const float *x, float *o, int64_t n, int64_t p) {
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

int mk_cpu_prefixes(const mk_launch *l, int k, int64_t hi, const int64_t **p, int64_t *count,
                    mk_error **err) {
    *p = l->in[k].data;
    *count = mk_tensor_numel(&l->in[k]);
    for (int64_t i = 0; i < *count; i++)
        if ((*p)[i] < 0 || (*p)[i] > hi)
            return mk_fault(err, l->node, MK_FAULT_PREFIX, (*p)[i], hi, 0);
    return 0;
}

/*
 * out [rows, n]: per row, softmax of x's first p elements (max subtracted, as
 * run.c), the other n - p copied; p the bound's value for the row's run of the
 * first axis (mk_cpu_prefixes), read now, 0 <= p <= n.
 */
int mk_cpu_sliced_softmax(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n, runs;
    const int64_t *p;
    if (mk_cpu_prefixes(l, 1, n, &p, &runs, err)) return -1;
    int64_t run = rows / runs;
    const float *xp = x->data;
    float *out = l->out.data;
    CPU_FOR(rows > 1 && par(rows * n * 4), r, rows,
            { mk_cpu_softmax_row(xp + r * n, out + r * n, n, p[r / run]); });
    return 0;
}

/*
 * out [..., T, S]: row t of each T, softmax of x's first end - T + 1 + t
 * elements (as mk_cpu_softmax_row), the rest zero; end: int64 [1], read now,
 * T <= end <= S.
 */
int mk_cpu_causal_softmax(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t n = x->shape[x->rank - 1], t = x->shape[x->rank - 2], rows = mk_tensor_numel(x) / n;
    int64_t end = read_i64(&l->in[1]);
    if (end < t || end > n)
        return mk_fault(err, l->node, MK_FAULT_END, end, n, t);
    const float *xp = x->data;
    float *out = l->out.data;
    CPU_FOR(rows > 1 && par(rows * n * 4), r, rows, {
        int64_t p = end - t + 1 + r % t;
        mk_cpu_softmax_row(xp + r * n, out + r * n, p, p);
        memset(out + r * n + p, 0, (size_t)(n - p) * sizeof(float));
    });
    return 0;
}

/* out [rows] (int64; shape [..., 1]) = index of the largest of x [rows, n], the first on ties. */
int mk_cpu_argmax(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    const float *xp = x->data;
    int64_t *out = l->out.data;
    CPU_FOR(rows > 1 && par(rows * n), r, rows, { out[r] = mk_argmax_row(xp + r * n, n); });
    return 0;
}

/* out [rows, 2] (int64) = run.c's (token, next state) per row of logits
 * [rows, n], from state [rows, 1] and float32 temperature and top-p ([1], or
 * one a row); the rows one after another (sample.c), the keys in the
 * scratch's head. */
int mk_cpu_sample(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    const int64_t *state = l->in[1].data;
    const float *temperature = l->in[2].data, *topp = l->in[3].data;
    int64_t ts = mk_tensor_numel(&l->in[2]) > 1, ps = mk_tensor_numel(&l->in[3]) > 1; /* steps */
    int64_t *out = l->out.data;
    uint64_t *keys = l->scratch;
    float *probs = (float *)((char *)l->scratch + mk_sample_head(rows, n));
    for (int64_t r = 0; r < rows; r++) {
        uint64_t s = (uint64_t)state[r];
        out[2 * r] = mk_sample_row((const float *)x->data + r * n, n, &s, temperature[r * ts],
                                   topp[r * ps], probs, keys);
        out[2 * r + 1] = (int64_t)s;
    }
    return 0;
}

