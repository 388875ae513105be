/*
 * pointwise.cu — elementwise ops and the permuting copy on the GPU:
 *
 *   MK_KERNEL_POINTWISE    out = the op's program (mk_expr) over a (and b), for every
 *                          op row with an expression; float32, int64 (a pointwise
 *                          group, and a node with three operands or a bool one,
 *                          runs the kernel generated.cu writes for it)
 *   MK_KERNEL_COMPLEX_MUL  out [..., 2] = a * b as complex (re, im)
 *   MK_KERNEL_PERMUTE      out = x viewed with permuted strides, made contiguous
 *
 * `out` is contiguous; `a` and `b` (complex_mul's too) arrive broadcast to
 * out's shape (NumPy's rule), with stride 0 on the dims they repeat; permute's
 * x arrives as a strided view with out's shape. Every kernel
 * is memory-bound: the plain cases load 16 bytes per thread, broadcasts walk
 * strides (mk_walk: one or two divisions once size-1 dims are dropped and
 * linear dims merged), and transposing permutes go through 32×32
 * shared-memory tiles so both reads and writes coalesce.
 *
 * The pointwise kernel is one interpreter for every op: the program (a few
 * hundred bytes) is a kernel argument, read from the constant bank; each
 * thread runs it over its elements with a register file of its own (in
 * shared memory) and a switch per instruction. The switch is uniform across
 * a warp, so it costs issue slots, not divergence. Programs of one operation
 * (a + b, a * b, expf(a), ...) are decoded on the host and run as that
 * operation. Its bandwidth is near a copy's for the cheap ops
 * (doc/performance.md, "Pointwise interpreter").
 *
 * Numerics equal the CPU's program: float32 + - * / and sqrtf are the
 * correctly rounded intrinsics (__fadd_rn, __fsub_rn, __fmul_rn, __fdiv_rn,
 * __fsqrt_rn), one rounding per operation and never contracted into an FMA
 * whatever the compiler flags; fabsf floorf ceilf rintf fmodf are exact in
 * both; expf tanhf logf exp2f sinf cosf erff expm1f log1pf powf are CUDA's
 * (within 1 to 2 ulp of the C library's, whose results are within as much of
 * the exact ones). int64 + - * and negation wrap around (done in unsigned);
 * int64 programs never hold / or a function (the core refuses them).
 *
 * Alone: `make` builds it into build/libmoonkaas_cuda.so; on a GPU,
 * build/tests/cuda_test checks every op here against the CPU device.
 */
#include "cuda_device.h"

#include <type_traits>

/* ---- the expression program ---------------------------------------------- */

/* What each operation means per dtype: the CPU's meaning (core/cpu/ops.c). */
struct f32_ops {
    static __device__ __forceinline__ float neg(float x) { return -x; }
    static __device__ __forceinline__ float abs(float x) { return fabsf(x); }
    static __device__ __forceinline__ float add(float x, float y) { return __fadd_rn(x, y); }
    static __device__ __forceinline__ float sub(float x, float y) { return __fsub_rn(x, y); }
    static __device__ __forceinline__ float mul(float x, float y) { return __fmul_rn(x, y); }
    static __device__ __forceinline__ float div(float x, float y) { return __fdiv_rn(x, y); }
    static __device__ __forceinline__ float exp(float x) { return expf(x); }
    static __device__ __forceinline__ float tanh(float x) { return tanhf(x); }
    static __device__ __forceinline__ float sqrt(float x) { return __fsqrt_rn(x); }
    static __device__ __forceinline__ float log(float x) { return logf(x); }
    static __device__ __forceinline__ float exp2(float x) { return exp2f(x); }
    static __device__ __forceinline__ float sin(float x) { return sinf(x); }
    static __device__ __forceinline__ float cos(float x) { return cosf(x); }
    static __device__ __forceinline__ float erf(float x) { return erff(x); }
    static __device__ __forceinline__ float floor(float x) { return floorf(x); }
    static __device__ __forceinline__ float ceil(float x) { return ceilf(x); }
    static __device__ __forceinline__ float rint(float x) { return rintf(x); }
    static __device__ __forceinline__ float expm1(float x) { return expm1f(x); }
    static __device__ __forceinline__ float log1p(float x) { return log1pf(x); }
    static __device__ __forceinline__ float pow(float x, float y) { return powf(x, y); }
    /* Python's % and // (the CPU's f32_mod and f32_floordiv) */
    static __device__ __forceinline__ float mod(float x, float y) {
        float r = fmodf(x, y);
        return r != 0.0f && (r < 0.0f) != (y < 0.0f) ? __fadd_rn(r, y) : r;
    }
    static __device__ __forceinline__ float floordiv(float x, float y) {
        if (y == 0.0f) return __fdiv_rn(x, y);
        float m = fmodf(x, y), d = __fdiv_rn(__fsub_rn(x, m), y);
        if (m != 0.0f && (y < 0.0f) != (m < 0.0f)) d = __fsub_rn(d, 1.0f);
        if (d == 0.0f) return copysignf(0.0f, __fdiv_rn(x, y));
        float f = floorf(d);
        return __fsub_rn(d, f) > 0.5f ? __fadd_rn(f, 1.0f) : f;
    }
};

/* int64 wraps around (two's complement, computed unsigned); integer programs
 * never hold / or a float function (the core refuses them), so those are
 * identities. Division by 0 gives 0 and by -1 never divides (it traps). */
struct i64_ops {
    typedef unsigned long long U;
    static __device__ __forceinline__ long long neg(long long x) { return (long long)(0ull - (U)x); }
    static __device__ __forceinline__ long long abs(long long x) { return x < 0 ? neg(x) : x; }
    static __device__ __forceinline__ long long add(long long x, long long y) {
        return (long long)((U)x + (U)y);
    }
    static __device__ __forceinline__ long long sub(long long x, long long y) {
        return (long long)((U)x - (U)y);
    }
    static __device__ __forceinline__ long long mul(long long x, long long y) {
        return (long long)((U)x * (U)y);
    }
    static __device__ __forceinline__ long long div(long long x, long long) { return x; }
    static __device__ __forceinline__ long long pow(long long x, long long) { return x; }
    static __device__ __forceinline__ long long exp(long long x) { return x; }
    static __device__ __forceinline__ long long tanh(long long x) { return x; }
    static __device__ __forceinline__ long long sqrt(long long x) { return x; }
    static __device__ __forceinline__ long long log(long long x) { return x; }
    static __device__ __forceinline__ long long exp2(long long x) { return x; }
    static __device__ __forceinline__ long long sin(long long x) { return x; }
    static __device__ __forceinline__ long long cos(long long x) { return x; }
    static __device__ __forceinline__ long long erf(long long x) { return x; }
    static __device__ __forceinline__ long long floor(long long x) { return x; }
    static __device__ __forceinline__ long long ceil(long long x) { return x; }
    static __device__ __forceinline__ long long rint(long long x) { return x; }
    static __device__ __forceinline__ long long expm1(long long x) { return x; }
    static __device__ __forceinline__ long long log1p(long long x) { return x; }
    static __device__ __forceinline__ long long mod(long long x, long long y) {
        if (y == 0 || y == -1) return 0;
        long long r = x % y;
        return r != 0 && (r < 0) != (y < 0) ? r + y : r;
    }
    static __device__ __forceinline__ long long floordiv(long long x, long long y) {
        if (y == 0) return 0;
        if (y == -1) return neg(x);
        long long q = x / y;
        return x % y != 0 && (x < 0) != (y < 0) ? q - 1 : q;
    }
};

template <typename T> struct ops_of;
template <> struct ops_of<float> { typedef f32_ops type; };
template <> struct ops_of<long long> { typedef i64_ops type; };

/*
 * The program as the kernels run it. The core's mk_expr is in SSA form
 * (instruction i writes register MK_X_IN + i); here its registers are reassigned on
 * the host, a register reused as soon as its value is dead, so the op table's
 * programs need a handful of registers (SiLU 3, GELU 4). Constants are
 * converted to T once, on the host. A program of one instruction over a (and
 * b) is decoded on the host instead, and its kernel is that one operation.
 */
#define PW_REGS (MK_X_IN + MK_EXPR_MAX)

template <typename T>
struct pw_program {
    int n;      /* instructions */
    int result; /* the register that holds the result at the end */
    struct {
        unsigned char op, x, y, z, d; /* mk_xop, operand registers, destination */
    } insn[MK_EXPR_MAX];
    T k[MK_EXPR_MAX]; /* MK_X_CONST's value */
};

/* How many registers instruction `op` reads: x, then y, then z. */
static int x_arity(int op) { return mk_xop_arity(op); }

/* e as a pw_program with registers reassigned (linear scan over the SSA
 * values' last uses); returns the registers it needs (at least 2: a and b). */
template <typename T>
static int pw_compile(const mk_expr *e, pw_program<T> *p) {
    int last[PW_REGS], phys[PW_REGS];
    bool busy[PW_REGS] = {false};
    for (int v = 0; v < PW_REGS; v++) last[v] = -1;
    for (int i = 0; i < e->n; i++) {
        const mk_xinsn *in = &e->insn[i];
        const unsigned char reads[3] = {in->x, in->y, in->z};
        for (int k = 0; k < x_arity(in->op); k++) last[reads[k]] = i;
    }
    int result = e->n ? MK_X_IN + e->n - 1 : 0;
    last[result] = e->n; /* the result lives to the end */
    phys[0] = 0, phys[1] = 1;
    busy[0] = last[0] >= 0;
    busy[1] = e->n_in == 2 && last[1] >= 0;
    int used = 2;
    p->n = e->n;
    for (int i = 0; i < e->n; i++) {
        const mk_xinsn *in = &e->insn[i];
        const unsigned char reads[3] = {in->x, in->y, in->z};
        unsigned char reg[3] = {0, 0, 0};
        for (int k = 0; k < x_arity(in->op); k++) reg[k] = (unsigned char)phys[reads[k]];
        /* operands read for the last time free their registers: each lane reads
         * its operands before it writes the result, so the result may take one */
        for (int k = 0; k < x_arity(in->op); k++)
            if (last[reads[k]] == i) busy[phys[reads[k]]] = false;
        int d = 0;
        while (busy[d]) d++;
        busy[d] = last[MK_X_IN + i] >= 0; /* a value nobody reads frees its register at once */
        phys[MK_X_IN + i] = d;
        if (d + 1 > used) used = d + 1;
        p->insn[i] = {in->op, reg[0], reg[1], reg[2], (unsigned char)d};
        p->k[i] = in->op == MK_X_CONST ? (T)in->k : (T)0;
    }
    p->result = phys[result];
    return used;
}

/* d(w) = EXPR for every lane w. */
#define X_LANES(EXPR)                                                  \
    do {                                                               \
        _Pragma("unroll") for (int w = 0; w < W; w++) d(w) = (EXPR);   \
    } while (0)

/*
 * Runs the program over W elements at once (a[w], b[w] → out[w]): each
 * instruction is decoded once for all W lanes. The register file lives in
 * shared memory, this thread's column of it: register g, lane w at
 * file[(g·W + w)·blockDim.x] — instructions name registers at run time, and a
 * thread-local array indexed so would go to local memory (spilling to L2 at
 * full occupancy) or become select chains. Threads touch only their own
 * column (no barriers) and neighbouring threads neighbouring words (no bank
 * conflicts). GT and LT give 1 or 0; SELECT is x != 0 ? y : z.
 */
template <typename T, int W>
static __device__ __forceinline__ void x_run(const pw_program<T> &p, const T *a, const T *b,
                                             T *out) {
    typedef typename ops_of<T>::type O;
    extern __shared__ __align__(16) unsigned char pw_file[];
    T *file = (T *)pw_file + threadIdx.x;
    const int step = blockDim.x;
#define REG(g, w) file[((g) * W + (w)) * step]
#pragma unroll
    for (int w = 0; w < W; w++) REG(0, w) = a[w], REG(1, w) = b[w];
    for (int i = 0; i < p.n; i++) {
        const int op = p.insn[i].op, x = p.insn[i].x, y = p.insn[i].y, z = p.insn[i].z,
                  dst = p.insn[i].d;
#define d(w) REG(dst, w)
        switch (op) {
        case MK_X_CONST: X_LANES(p.k[i]); break;
        case MK_X_NEG: X_LANES(O::neg(REG(x, w))); break;
        case MK_X_EXP: X_LANES(O::exp(REG(x, w))); break;
        case MK_X_TANH: X_LANES(O::tanh(REG(x, w))); break;
        case MK_X_SQRT: X_LANES(O::sqrt(REG(x, w))); break;
        case MK_X_ADD: X_LANES(O::add(REG(x, w), REG(y, w))); break;
        case MK_X_SUB: X_LANES(O::sub(REG(x, w), REG(y, w))); break;
        case MK_X_MUL: X_LANES(O::mul(REG(x, w), REG(y, w))); break;
        case MK_X_DIV: X_LANES(O::div(REG(x, w), REG(y, w))); break;
        case MK_X_GT: X_LANES(REG(x, w) > REG(y, w) ? (T)1 : (T)0); break;
        case MK_X_LT: X_LANES(REG(x, w) < REG(y, w) ? (T)1 : (T)0); break;
        case MK_X_SELECT: X_LANES(REG(x, w) != (T)0 ? REG(y, w) : REG(z, w)); break;
        case MK_X_MAX: X_LANES(REG(x, w) > REG(y, w) ? REG(x, w) : REG(y, w)); break;
        case MK_X_MIN: X_LANES(REG(x, w) < REG(y, w) ? REG(x, w) : REG(y, w)); break;
        case MK_X_GE: X_LANES(REG(x, w) >= REG(y, w) ? (T)1 : (T)0); break;
        case MK_X_LE: X_LANES(REG(x, w) <= REG(y, w) ? (T)1 : (T)0); break;
        case MK_X_EQ: X_LANES(REG(x, w) == REG(y, w) ? (T)1 : (T)0); break;
        case MK_X_NE: X_LANES(REG(x, w) != REG(y, w) ? (T)1 : (T)0); break;
        case MK_X_ABS: X_LANES(O::abs(REG(x, w))); break;
        case MK_X_LOG: X_LANES(O::log(REG(x, w))); break;
        case MK_X_EXP2: X_LANES(O::exp2(REG(x, w))); break;
        case MK_X_SIN: X_LANES(O::sin(REG(x, w))); break;
        case MK_X_COS: X_LANES(O::cos(REG(x, w))); break;
        case MK_X_ERF: X_LANES(O::erf(REG(x, w))); break;
        case MK_X_FLOOR: X_LANES(O::floor(REG(x, w))); break;
        case MK_X_CEIL: X_LANES(O::ceil(REG(x, w))); break;
        case MK_X_RINT: X_LANES(O::rint(REG(x, w))); break;
        case MK_X_EXPM1: X_LANES(O::expm1(REG(x, w))); break;
        case MK_X_LOG1P: X_LANES(O::log1p(REG(x, w))); break;
        case MK_X_POW: X_LANES(O::pow(REG(x, w), REG(y, w))); break;
        case MK_X_MOD: X_LANES(O::mod(REG(x, w), REG(y, w))); break;
        case MK_X_FLOORDIV: X_LANES(O::floordiv(REG(x, w), REG(y, w))); break;
        }
#undef d
    }
#pragma unroll
    for (int w = 0; w < W; w++) out[w] = REG(p.result, w);
#undef REG
}

/* MODE: the one operation (an mk_xop) of a one-instruction program, or PW_INTERP. */
enum { PW_INTERP = -1 };

template <typename T, int W, int MODE>
static __device__ __forceinline__ void pw_eval(const pw_program<T> &p, const T *a, const T *b,
                                               T *out) {
    typedef typename ops_of<T>::type O;
    if constexpr (MODE == PW_INTERP) {
        x_run<T, W>(p, a, b, out);
    } else {
#pragma unroll
        for (int w = 0; w < W; w++) {
            T x = a[w], y = b[w];
            switch (MODE) {
            case MK_X_NEG: out[w] = O::neg(x); break;
            case MK_X_EXP: out[w] = O::exp(x); break;
            case MK_X_TANH: out[w] = O::tanh(x); break;
            case MK_X_SQRT: out[w] = O::sqrt(x); break;
            case MK_X_ADD: out[w] = O::add(x, y); break;
            case MK_X_SUB: out[w] = O::sub(x, y); break;
            case MK_X_MUL: out[w] = O::mul(x, y); break;
            case MK_X_DIV: out[w] = O::div(x, y); break;
            }
        }
    }
}

/* ---- pointwise kernels ----------------------------------------------------- */

/* Where the operands' elements lie, per element index of the contiguous result. */
enum {
    WALK_NONE, /* a (and b) linear */
    WALK_A,    /* a through the walk (operand 0), b linear */
    WALK_B,    /* a linear, b through the walk (operand 0) */
    WALK_AB,   /* both through one walk (operands 0 and 1): the divisions are shared */
};

/* out [n4 * 4] = program(a, b), float32, four at a time (both linear, 16-byte aligned). */
template <int N_IN, int MODE>
static __global__ void pointwise_f32x4(float4 *o, const float4 *a, const float4 *b, long long n4,
                                       const __grid_constant__ pw_program<float> p) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 x = a[i], y = N_IN == 2 ? b[i] : x;
        float va[4] = {x.x, x.y, x.z, x.w}, vb[4] = {y.x, y.y, y.z, y.w}, vo[4];
        pw_eval<float, 4, MODE>(p, va, vb, vo);
        o[i] = make_float4(vo[0], vo[1], vo[2], vo[3]);
    }
}

/* out [n] = program(a, b) with each operand linear or walked, as WALK says. */
template <typename T, int N_IN, int WALK, int MODE>
static __global__ void pointwise_walk(T *o, const T *a, const T *b, long long n,
                                      const __grid_constant__ pw_program<T> p,
                                      const __grid_constant__ mk_walk w) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long off[2] = {i, i};
        if (WALK == WALK_AB) mk_cuda_walk_offsets<2>(w, i, off);
        else if (WALK == WALK_A) off[0] = mk_cuda_walk_offset(w, i);
        else if (WALK == WALK_B) off[1] = mk_cuda_walk_offset(w, i);
        T x = a[off[0]], y = N_IN == 2 ? b[off[1]] : x, r;
        pw_eval<T, 1, MODE>(p, &x, &y, &r);
        o[i] = r;
    }
}

/* Blocks of `block` threads for n items: enough to fill the GPU's SMs several
 * times over for a grid-stride loop. */
static unsigned int grid_for(long long n, int block = MK_CUDA_BLOCK) {
    unsigned int b = mk_cuda_blocks(n, block);
    unsigned int most = 132u * 32u * (MK_CUDA_BLOCK / block);
    return b > most ? most : b;
}

/* Threads per block and shared bytes of the interpreter's register file:
 * `regs` registers of W lanes per thread, within the 48 KiB a launch gets
 * without asking. */
static int file_block(int regs, int W, size_t size, size_t *bytes) {
    int block = MK_CUDA_BLOCK;
    while (block > 32 && (size_t)regs * W * block * size > 48u * 1024u) block /= 2;
    *bytes = (size_t)regs * W * block * size;
    return block;
}

/* Launches the kernel of MODE for l's layout: 16-byte vectors where everything
 * is linear and aligned, else the walk that costs least. */
template <typename T, int N_IN, int MODE>
static void pointwise_run(const mk_launch *l, const pw_program<T> &p, int regs) {
    cudaStream_t stream = mk_cuda_state_of(l)->stream;
    const mk_tensor *a = &l->in[0], *b = N_IN == 2 ? &l->in[1] : &l->in[0];
    long long n = mk_tensor_numel(&l->out);
    int r = l->out.rank;
    /* Each operand alone merges best; one shared walk when neither is linear. */
    mk_walk wa = mk_cuda_walk1(r, l->out.shape, a->stride);
    mk_walk wb = mk_cuda_walk1(r, l->out.shape, b->stride);
    bool la = mk_cuda_walk_linear(&wa, 0), lb = N_IN == 1 || mk_cuda_walk_linear(&wb, 0);
    T *o = (T *)l->out.data;
    const T *pa = (const T *)a->data, *pb = (const T *)b->data;
    size_t smem = 0;
    int block = MK_CUDA_BLOCK;
    if constexpr (std::is_same<T, float>::value) {
        if (la && lb && n % 4 == 0 && mk_aligned16(o) && mk_aligned16(pa) && mk_aligned16(pb)) {
            if (MODE == PW_INTERP) block = file_block(regs, 4, sizeof(T), &smem);
            pointwise_f32x4<N_IN, MODE><<<grid_for(n / 4, block), block, smem, stream>>>(
                (float4 *)o, (const float4 *)pa, (const float4 *)pb, n / 4, p);
            return;
        }
    }
    if (MODE == PW_INTERP) block = file_block(regs, 1, sizeof(T), &smem);
    unsigned int grid = grid_for(n, block);
    if (la && lb) {
        pointwise_walk<T, N_IN, WALK_NONE, MODE><<<grid, block, smem, stream>>>(o, pa, pb, n, p,
                                                                                wa);
    } else if (lb) {
        pointwise_walk<T, N_IN, WALK_A, MODE><<<grid, block, smem, stream>>>(o, pa, pb, n, p, wa);
    } else if (la) {
        pointwise_walk<T, N_IN, WALK_B, MODE><<<grid, block, smem, stream>>>(o, pa, pb, n, p, wb);
    } else {
        const int64_t *strides[2] = {a->stride, b->stride};
        mk_walk wab;
        mk_walk_init(&wab, r, l->out.shape, 2, strides);
        pointwise_walk<T, N_IN, WALK_AB, MODE><<<grid, block, smem, stream>>>(o, pa, pb, n, p,
                                                                             wab);
    }
}

/* The one operation of a program that is one instruction over a (and b), else -1. */
static int single_op(const mk_expr *e) {
    if (e->n != 1) return -1;
    const mk_xinsn *in = &e->insn[0];
    int arity = x_arity(in->op);
    if (arity == 1 && in->x == 0 &&
        (in->op == MK_X_NEG || in->op == MK_X_EXP || in->op == MK_X_TANH || in->op == MK_X_SQRT))
        return in->op;
    if (arity == 2 && in->x == 0 && in->y == 1 &&
        (in->op == MK_X_ADD || in->op == MK_X_SUB || in->op == MK_X_MUL || in->op == MK_X_DIV))
        return in->op;
    return -1;
}

template <typename T, int N_IN>
static void pointwise_dispatch(const mk_launch *l) {
    constexpr bool is_float = std::is_same<T, float>::value;
    pw_program<T> p;
    int regs = pw_compile(l->expr, &p);
    switch (single_op(l->expr)) {
    case MK_X_ADD: if constexpr (N_IN == 2) return pointwise_run<T, 2, MK_X_ADD>(l, p, regs); break;
    case MK_X_SUB: if constexpr (N_IN == 2) return pointwise_run<T, 2, MK_X_SUB>(l, p, regs); break;
    case MK_X_MUL: if constexpr (N_IN == 2) return pointwise_run<T, 2, MK_X_MUL>(l, p, regs); break;
    case MK_X_DIV:
        if constexpr (N_IN == 2 && is_float) return pointwise_run<T, 2, MK_X_DIV>(l, p, regs);
        break;
    case MK_X_NEG: if constexpr (N_IN == 1) return pointwise_run<T, 1, MK_X_NEG>(l, p, regs); break;
    case MK_X_EXP:
        if constexpr (N_IN == 1 && is_float) return pointwise_run<T, 1, MK_X_EXP>(l, p, regs);
        break;
    case MK_X_TANH:
        if constexpr (N_IN == 1 && is_float) return pointwise_run<T, 1, MK_X_TANH>(l, p, regs);
        break;
    case MK_X_SQRT:
        if constexpr (N_IN == 1 && is_float) return pointwise_run<T, 1, MK_X_SQRT>(l, p, regs);
        break;
    }
    pointwise_run<T, N_IN, PW_INTERP>(l, p, regs);
}

/* MK_KERNEL_POINTWISE: float32 and int64 (the device table says so; model.c checks). */
int mk_cuda_pointwise(const mk_launch *l, mk_error **err) {
    /* a group, or one node of bool or three operands: its own kernel */
    if (mk_node_generated(l->node)) return mk_cuda_pointwise_generated(l, err);
    if (!l->expr || l->expr->n_in > l->n_in || l->n_in > 2)
        return MK_INTERNAL(err, "a pointwise launch without its program or its operands");
    bool two = l->expr->n_in == 2;
    if (l->out.dtype == MK_DTYPE_INT64) {
        if (two) pointwise_dispatch<long long, 2>(l);
        else pointwise_dispatch<long long, 1>(l);
    } else {
        if (two) pointwise_dispatch<float, 2>(l);
        else pointwise_dispatch<float, 1>(l);
    }
    return mk_cuda_check_launch(l, "pointwise", err);
}

/* ---- complex_mul --------------------------------------------------------- */

/*
 * out [..., 2] = a [..., 2] · b [..., 2] as complex numbers, one pair per
 * thread: wa/wb walk the pairs (every dim but the last), ia/ib step from re to im.
 */
static __global__ void complex_mul_kernel(float2 *o, const float *a, const float *b,
                                          long long pairs, const __grid_constant__ mk_walk wa,
                                          const __grid_constant__ mk_walk wb, long long ia,
                                          long long ib) {
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < pairs;
         p += (long long)gridDim.x * blockDim.x) {
        long long oa = mk_cuda_walk_offset(wa, p), ob = mk_cuda_walk_offset(wb, p);
        float ar = a[oa], ai = a[oa + ia], br = b[ob], bi = b[ob + ib];
        o[p] = make_float2(ar * br - ai * bi, ar * bi + ai * br);
    }
}

int mk_cuda_complex_mul(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    int r = l->out.rank;
    if (r < 1 || l->out.shape[r - 1] != 2) return MK_INTERNAL(err, "the last axis is not 2");
    long long pairs = mk_tensor_numel(&l->out) / 2;
    mk_walk wa = mk_cuda_walk1(r - 1, l->out.shape, a->stride);
    mk_walk wb = mk_cuda_walk1(r - 1, l->out.shape, b->stride);
    complex_mul_kernel<<<grid_for(pairs), MK_CUDA_BLOCK, 0, s->stream>>>(
        (float2 *)l->out.data, (const float *)a->data, (const float *)b->data, pairs, wa, wb,
        a->stride[r - 1], b->stride[r - 1]);
    return mk_cuda_check_launch(l, "complex_mul", err);
}

/* ---- permute ------------------------------------------------------------- */

/* out [n] (contiguous) = x at walk offsets: the general strided gather. */
template <typename T>
static __global__ void gather_walk(T *o, const T *x, long long n,
                                   const __grid_constant__ mk_walk wx) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        o[i] = x[mk_cuda_walk_offset(wx, i)];
}

#define TILE 32
#define TILE_ROWS 8

/*
 * Transposing copy: out [batches, R, C] (contiguous) from x where out's last
 * two dims read x with strides (1, s), i.e. x holds each matrix as [C, R];
 * the batch dims read x with the walk wb. Tiles of 32×32 through shared
 * memory (one column of padding against bank conflicts): reads run along R,
 * writes along C, both coalesced. Grid: (C tiles, R tiles, batches).
 */
template <typename T>
static __global__ void transpose_tiles(T *o, const T *x, long long R, long long C, long long s,
                                       const __grid_constant__ mk_walk wb) {
    __shared__ T tile[TILE][TILE + 1];
    long long batch = blockIdx.z;
    const T *xb = x + mk_cuda_walk_offset(wb, batch);
    T *ob = o + batch * R * C;
    long long i0 = (long long)blockIdx.y * TILE, j0 = (long long)blockIdx.x * TILE;
    /* read: x[i, j] at i + j*s, threads along i */
    for (int k = threadIdx.y; k < TILE; k += TILE_ROWS) {
        long long i = i0 + threadIdx.x, j = j0 + k;
        if (i < R && j < C) tile[k][threadIdx.x] = xb[i + j * s];
    }
    __syncthreads();
    /* write: out[i, j] at i*C + j, threads along j */
    for (int k = threadIdx.y; k < TILE; k += TILE_ROWS) {
        long long i = i0 + k, j = j0 + threadIdx.x;
        if (i < R && j < C) ob[i * C + j] = tile[threadIdx.x][k];
    }
}

template <typename T>
static int permute_launch(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0];
    long long n = mk_tensor_numel(&l->out);
    mk_walk w = mk_cuda_walk1(l->out.rank, l->out.shape, x->stride);
    T *o = (T *)l->out.data;
    const T *px = (const T *)x->data;
    int r = w.rank;
    if (mk_cuda_walk_linear(&w, 0)) {
        if (n) {
            cudaError_t status = cudaMemcpyAsync(o, px, (size_t)n * sizeof(T),
                                                 cudaMemcpyDeviceToDevice, s->stream);
            if (status != cudaSuccess)
                return mk_cuda_fail_status(err, status, "cudaMemcpyAsync (a permute that is a "
                                           "plain copy)", __FILE__, __LINE__);
        }
        return 0;
    }
    if (r >= 2 && w.stride[0][r - 2] == 1 && w.stride[0][r - 1] != 1) {
        long long R = w.shape[r - 2], C = w.shape[r - 1], batches = n / (R * C);
        long long ty = (R + TILE - 1) / TILE, tx = (C + TILE - 1) / TILE;
        if (batches <= 65535 && ty <= 65535 && tx <= 0x7fffffffLL) {
            mk_walk wb = mk_cuda_walk1(r - 2, w.shape, w.stride[0]);
            dim3 grid((unsigned)tx, (unsigned)ty, (unsigned)batches);
            transpose_tiles<T><<<grid, dim3(TILE, TILE_ROWS), 0, s->stream>>>(o, px, R, C,
                                                                              w.stride[0][r - 1], wb);
            return mk_cuda_check_launch(l, "transpose_tiles", err);
        }
    }
    gather_walk<T><<<grid_for(n), MK_CUDA_BLOCK, 0, s->stream>>>(o, px, n, w);
    return mk_cuda_check_launch(l, "gather_walk", err);
}

/* MK_KERNEL_PERMUTE: every dtype. A pure data move: only the element size matters. */
int mk_cuda_permute(const mk_launch *l, mk_error **err) {
    switch (mk_dtype_size(l->out.dtype)) {
    case 8: return permute_launch<unsigned long long>(l, err);
    case 4: return permute_launch<unsigned int>(l, err);
    case 2: return permute_launch<unsigned short>(l, err);
    case 1: return permute_launch<unsigned char>(l, err);
    }
    return MK_INTERNAL(err, "an element size other than 1, 2, 4 or 8 bytes");
}
