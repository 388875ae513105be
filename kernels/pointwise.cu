/*
 * pointwise.cu — elementwise ops and the permuting copy on the GPU:
 *
 *   SumNode, HadamardProductNode  out = a + b, a * b     float32, int64
 *   ReLUNode                      out = max(x, 0)        float32, int64
 *   SiLUNode                      out = x / (1 + e^-x)   float32
 *   ComplexHadamardProductNode    out [..., 2] = a * b as complex (re, im)
 *   PermuteNode                   out = x viewed with permuted strides, made contiguous
 *
 * `out` is contiguous; `b` (and complex_mul's b) arrives broadcast to out's
 * shape with stride 0 on broadcast dims; permute's x arrives as a strided
 * view with out's shape. Every kernel is memory-bound: the plain cases load
 * 16 bytes per thread, broadcasts walk strides (one or two divisions once
 * size-1 dims are dropped and linear dims merged), and transposing permutes
 * go through 32×32 shared-memory tiles so both reads and writes coalesce.
 */
#include "cuda_device.h"

/* ---- binary: sum, hadamard ---------------------------------------------- */

enum { OP_ADD, OP_MUL };

template <typename T, int OP>
static __device__ __forceinline__ T apply2(T x, T y) {
    return OP == OP_ADD ? x + y : x * y;
}
/* int64 wraps around as on the CPU (two's complement), without signed overflow. */
template <>
__device__ __forceinline__ long long apply2<long long, OP_ADD>(long long x, long long y) {
    return (long long)((unsigned long long)x + (unsigned long long)y);
}
template <>
__device__ __forceinline__ long long apply2<long long, OP_MUL>(long long x, long long y) {
    return (long long)((unsigned long long)x * (unsigned long long)y);
}

/* out [n] = a [n] op b [n], float32, four at a time (n % 4 == 0, 16-byte aligned). */
template <int OP>
static __global__ void binary_f32x4(float4 *o, const float4 *a, const float4 *b, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 x = a[i], y = b[i];
        o[i] = make_float4(apply2<float, OP>(x.x, y.x), apply2<float, OP>(x.y, y.y),
                           apply2<float, OP>(x.z, y.z), apply2<float, OP>(x.w, y.w));
    }
}

/* out [n] = a (walk wa) op b (walk wb); a linear when A_LINEAR. */
template <typename T, int OP, bool A_LINEAR, bool B_LINEAR>
static __global__ void binary_walk(T *o, const T *a, const T *b, long long n, mk_cuda_walk wa,
                                   mk_cuda_walk wb) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        T x = a[A_LINEAR ? i : mk_cuda_walk_offset(wa, i)];
        T y = b[B_LINEAR ? i : mk_cuda_walk_offset(wb, i)];
        o[i] = apply2<T, OP>(x, y);
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Enough blocks to fill the GPU's SMs several times over for a grid-stride loop. */
static unsigned int grid_for(long long n) {
    unsigned int b = mk_cuda_blocks(n, MK_CUDA_BLOCK);
    return b > 132u * 32u ? 132u * 32u : b;
}

template <typename T, int OP>
static int binary_launch(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    long long n = mk_tensor_numel(&l->out);
    mk_cuda_walk wa = mk_cuda_walk_make(l->out.rank, l->out.shape, a->stride);
    mk_cuda_walk wb = mk_cuda_walk_make(l->out.rank, l->out.shape, b->stride);
    bool la = mk_cuda_walk_linear(&wa), lb = mk_cuda_walk_linear(&wb);
    T *o = (T *)l->out.data;
    const T *pa = (const T *)a->data, *pb = (const T *)b->data;
    unsigned int grid = grid_for(n);
    if (sizeof(T) == 4 && la && lb && n % 4 == 0 && aligned16(o) && aligned16(pa) &&
        aligned16(pb)) {
        binary_f32x4<OP><<<grid_for(n / 4), MK_CUDA_BLOCK, 0, s->stream>>>(
            (float4 *)o, (const float4 *)pa, (const float4 *)pb, n / 4);
    } else if (la && lb) {
        binary_walk<T, OP, true, true><<<grid, MK_CUDA_BLOCK, 0, s->stream>>>(o, pa, pb, n, wa,
                                                                              wb);
    } else if (la) {
        binary_walk<T, OP, true, false><<<grid, MK_CUDA_BLOCK, 0, s->stream>>>(o, pa, pb, n, wa,
                                                                               wb);
    } else {
        binary_walk<T, OP, false, false><<<grid, MK_CUDA_BLOCK, 0, s->stream>>>(o, pa, pb, n, wa,
                                                                                wb);
    }
    return mk_cuda_check_launch(l, "binary", err);
}

static int bad_dtype(const mk_launch *l, mk_error **err) {
    return mk_fail(err, MK_ERR_INTERNAL, 0, 0, "%s $%d: no CUDA kernel for dtype %s",
                   l->node->op->name, l->node->id, mk_dtype_name(l->out.dtype));
}

int mk_cuda_sum(const mk_launch *l, mk_error **err) {
    switch (l->out.dtype) {
    case MK_DTYPE_FLOAT32: return binary_launch<float, OP_ADD>(l, err);
    case MK_DTYPE_INT64: return binary_launch<long long, OP_ADD>(l, err);
    }
    return bad_dtype(l, err);
}

int mk_cuda_hadamard(const mk_launch *l, mk_error **err) {
    switch (l->out.dtype) {
    case MK_DTYPE_FLOAT32: return binary_launch<float, OP_MUL>(l, err);
    case MK_DTYPE_INT64: return binary_launch<long long, OP_MUL>(l, err);
    }
    return bad_dtype(l, err);
}

/* ---- unary: relu, silu --------------------------------------------------- */

enum { OP_RELU, OP_SILU };

template <typename T, int OP>
static __device__ __forceinline__ T apply1(T x) {
    if (OP == OP_RELU) return x > (T)0 ? x : (T)0;
    /* As run.c's SwiGLU writes it, like the CPU device. */
    return x * (1.0f / (1.0f + expf(-x)));
}

template <int OP>
static __global__ void unary_f32x4(float4 *o, const float4 *x, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 v = x[i];
        o[i] = make_float4(apply1<float, OP>(v.x), apply1<float, OP>(v.y),
                           apply1<float, OP>(v.z), apply1<float, OP>(v.w));
    }
}

template <typename T, int OP, bool LINEAR>
static __global__ void unary_walk(T *o, const T *x, long long n, mk_cuda_walk wx) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        o[i] = apply1<T, OP>(x[LINEAR ? i : mk_cuda_walk_offset(wx, i)]);
}

template <typename T, int OP>
static int unary_launch(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0];
    long long n = mk_tensor_numel(&l->out);
    mk_cuda_walk wx = mk_cuda_walk_make(l->out.rank, l->out.shape, x->stride);
    bool lin = mk_cuda_walk_linear(&wx);
    T *o = (T *)l->out.data;
    const T *px = (const T *)x->data;
    if (sizeof(T) == 4 && lin && n % 4 == 0 && aligned16(o) && aligned16(px))
        unary_f32x4<OP><<<grid_for(n / 4), MK_CUDA_BLOCK, 0, s->stream>>>(
            (float4 *)o, (const float4 *)px, n / 4);
    else if (lin)
        unary_walk<T, OP, true><<<grid_for(n), MK_CUDA_BLOCK, 0, s->stream>>>(o, px, n, wx);
    else
        unary_walk<T, OP, false><<<grid_for(n), MK_CUDA_BLOCK, 0, s->stream>>>(o, px, n, wx);
    return mk_cuda_check_launch(l, "unary", err);
}

int mk_cuda_relu(const mk_launch *l, mk_error **err) {
    switch (l->out.dtype) {
    case MK_DTYPE_FLOAT32: return unary_launch<float, OP_RELU>(l, err);
    case MK_DTYPE_INT64: return unary_launch<long long, OP_RELU>(l, err);
    }
    return bad_dtype(l, err);
}

int mk_cuda_silu(const mk_launch *l, mk_error **err) {
    if (l->out.dtype != MK_DTYPE_FLOAT32) return bad_dtype(l, err);
    return unary_launch<float, OP_SILU>(l, err);
}

/* ---- complex_mul --------------------------------------------------------- */

/*
 * out [..., 2] = a [..., 2] · b [..., 2] as complex numbers, one pair per
 * thread: wa/wb walk the pairs (every dim but the last), ia/ib step from re to im.
 */
static __global__ void complex_mul_kernel(float2 *o, const float *a, const float *b,
                                          long long pairs, mk_cuda_walk wa, mk_cuda_walk wb,
                                          long long ia, long long ib) {
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
    if (l->out.dtype != MK_DTYPE_FLOAT32) return bad_dtype(l, err);
    if (r < 1 || l->out.shape[r - 1] != 2)
        return MK_INTERNAL(err, "ComplexHadamardProductNode: last axis is not 2");
    long long pairs = mk_tensor_numel(&l->out) / 2;
    mk_cuda_walk wa = mk_cuda_walk_make(r - 1, l->out.shape, a->stride);
    mk_cuda_walk wb = mk_cuda_walk_make(r - 1, l->out.shape, b->stride);
    complex_mul_kernel<<<grid_for(pairs), MK_CUDA_BLOCK, 0, s->stream>>>(
        (float2 *)l->out.data, (const float *)a->data, (const float *)b->data, pairs, wa, wb,
        a->stride[r - 1], b->stride[r - 1]);
    return mk_cuda_check_launch(l, "complex_mul", err);
}

/* ---- permute ------------------------------------------------------------- */

/* out [n] (contiguous) = x at walk offsets: the general strided gather. */
template <typename T>
static __global__ void gather_walk(T *o, const T *x, long long n, mk_cuda_walk wx) {
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
                                       mk_cuda_walk wb) {
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
    mk_cuda_walk w = mk_cuda_walk_make(l->out.rank, l->out.shape, x->stride);
    T *o = (T *)l->out.data;
    const T *px = (const T *)x->data;
    int r = w.rank;
    if (mk_cuda_walk_linear(&w)) {
        if (n) {
            cudaError_t status = cudaMemcpyAsync(o, px, (size_t)n * sizeof(T),
                                                 cudaMemcpyDeviceToDevice, s->stream);
            if (status != cudaSuccess)
                return mk_cuda_fail_status(err, status, "PermuteNode: cudaMemcpyAsync", __FILE__,
                                           __LINE__);
        }
        return 0;
    }
    if (r >= 2 && w.stride[r - 2] == 1 && w.stride[r - 1] != 1) {
        long long R = w.shape[r - 2], C = w.shape[r - 1], batches = n / (R * C);
        long long ty = (R + TILE - 1) / TILE, tx = (C + TILE - 1) / TILE;
        if (batches <= 65535 && ty <= 65535 && tx <= 0x7fffffffLL) {
            mk_cuda_walk wb = mk_cuda_walk_make(r - 2, w.shape, w.stride);
            dim3 grid((unsigned)tx, (unsigned)ty, (unsigned)batches);
            transpose_tiles<T><<<grid, dim3(TILE, TILE_ROWS), 0, s->stream>>>(o, px, R, C,
                                                                              w.stride[r - 1], wb);
            return mk_cuda_check_launch(l, "transpose_tiles", err);
        }
    }
    gather_walk<T><<<grid_for(n), MK_CUDA_BLOCK, 0, s->stream>>>(o, px, n, w);
    return mk_cuda_check_launch(l, "gather_walk", err);
}

int mk_cuda_permute(const mk_launch *l, mk_error **err) {
    /* A pure data move: only the element size matters. */
    return mk_dtype_size(l->out.dtype) == 8 ? permute_launch<unsigned long long>(l, err)
                                            : permute_launch<unsigned int>(l, err);
}
