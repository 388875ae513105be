/*
 * convert.cu — element conversions on the GPU:
 *
 *   MK_KERNEL_CAST        out = x converted to out's dtype (x strided)
 *   MK_KERNEL_DEQUANTIZE  out = q * scale, float32: q int8, scale float32 with one
 *                         value per block of q (each of its dims divides q's)
 *   MK_KERNEL_FAKE_QUANTIZE  out = s * q, x on the int8 grid per group along
 *                         the last axis (runq.c's activations: the CPU's q8_value)
 *
 * and the widening of a matrix product's low-precision weights into scratch
 * (mk_cuda_widen, for matmul.cu). The rule is the core's (graph.h, above
 * mk_bf16_to_f32): floats round to nearest even, float16 overflows to ±inf,
 * floats become integers toward zero, saturated, NaN as 0; to bool, whatever
 * is not 0 is 1.
 */
#include "cuda_device.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* Element i of x as float (int64 is read by load_i64). */
static __device__ __forceinline__ float load_f32(const void *x, int dtype, long long i) {
    switch (dtype) {
    case MK_DTYPE_FLOAT32: return ((const float *)x)[i];
    case MK_DTYPE_FLOAT16: return __half2float(((const __half *)x)[i]);
    case MK_DTYPE_BFLOAT16: return __bfloat162float(((const __nv_bfloat16 *)x)[i]);
    case MK_DTYPE_INT8: return (float)((const signed char *)x)[i];
    case MK_DTYPE_BOOL: return ((const unsigned char *)x)[i] != 0 ? 1.0f : 0.0f;
    default: return 0.0f;
    }
}

static __device__ __forceinline__ long long f32_to_int(float v, long long lo, long long hi) {
    if (v != v) return 0;
    if (v <= (float)lo) return lo;
    if (v >= (float)hi) return hi;
    return (long long)v;
}

static __device__ __forceinline__ void store(void *o, int dtype, long long i, float v,
                                             bool from_int, long long iv) {
    switch (dtype) {
    case MK_DTYPE_FLOAT32: ((float *)o)[i] = v; break;
    case MK_DTYPE_FLOAT16: ((__half *)o)[i] = __float2half_rn(v); break;
    case MK_DTYPE_BFLOAT16: ((__nv_bfloat16 *)o)[i] = __float2bfloat16_rn(v); break;
    case MK_DTYPE_INT64:
        ((long long *)o)[i] = from_int ? iv : f32_to_int(v, LLONG_MIN, LLONG_MAX);
        break;
    case MK_DTYPE_INT8:
        ((signed char *)o)[i] = (signed char)(from_int ? (iv < -128 ? -128 : iv > 127 ? 127 : iv)
                                                       : f32_to_int(v, -128, 127));
        break;
    case MK_DTYPE_BOOL: /* not 0 (NaN is not) */
        ((unsigned char *)o)[i] = from_int ? iv != 0 : v != 0.0f;
        break;
    }
}

/* out (dense, `to`) = x (walked, `from`). */
static __global__ void cast_kernel(void *out, int to, const void *x, int from, mk_walk w,
                                   long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long at = mk_cuda_walk_offset(w, i);
        if (from == MK_DTYPE_INT64) {
            long long v = ((const long long *)x)[at];
            store(out, to, i, (float)v, true, v);
        } else {
            store(out, to, i, load_f32(x, from, at), false, 0);
        }
    }
}

static unsigned int grid_for(long long n) {
    unsigned int b = mk_cuda_blocks(n, MK_CUDA_BLOCK);
    return b > 132u * 32u ? 132u * 32u : b;
}

/* out (dense, its own dtype) = x converted; on l's stream. */
static void cast_into(const mk_launch *l, const mk_tensor *out, const mk_tensor *x) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    long long n = mk_tensor_numel(x);
    mk_walk w = mk_cuda_walk1(out->rank, out->shape, x->stride);
    cast_kernel<<<grid_for(n), MK_CUDA_BLOCK, 0, s->stream>>>(out->data, out->dtype, x->data,
                                                              x->dtype, w, n);
}

/* MK_KERNEL_CAST: every dtype to every dtype. */
int mk_cuda_cast(const mk_launch *l, mk_error **err) {
    cast_into(l, &l->out, &l->in[0]);
    return mk_cuda_check_launch(l, "cast", err);
}

/* b (a product's weights, float16 or bfloat16) widened, dense, into l's scratch. */
int mk_cuda_widen(const mk_launch *l, const mk_tensor *b, mk_tensor *wide, mk_error **err) {
    *wide = *b;
    wide->data = l->scratch;
    wide->dtype = MK_DTYPE_FLOAT32;
    if (mk_tensor_is_dense_permuted(b)) { /* in its own layout: one run of its memory */
        mk_tensor run = {b->data, b->dtype, 1, {mk_tensor_numel(b)}, {1}};
        mk_tensor into = run;
        into.data = l->scratch;
        into.dtype = MK_DTYPE_FLOAT32;
        cast_into(l, &into, &run);
    } else {
        mk_contiguous_strides(b->rank, b->shape, wide->stride);
        cast_into(l, wide, b);
    }
    return mk_cuda_check_launch(l, "matmul (widening the weights)", err);
}

/* Per dim of the output: q's and scale's strides and the block size. */
typedef struct {
    int rank;
    long long shape[MK_MAX_RANK], q_stride[MK_MAX_RANK], s_stride[MK_MAX_RANK],
        block[MK_MAX_RANK];
} dequantize_args;

static __global__ void dequantize_kernel(float *out, const signed char *q, const float *scale,
                                         dequantize_args a, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long rest = i, qo = 0, so = 0;
        for (int d = a.rank - 1; d >= 0; d--) {
            long long c = rest % a.shape[d];
            rest /= a.shape[d];
            qo += c * a.q_stride[d];
            so += c / a.block[d] * a.s_stride[d];
        }
        out[i] = (float)q[qo] * scale[so];
    }
}

/* MK_KERNEL_DEQUANTIZE */
int mk_cuda_dequantize(const mk_launch *l, mk_error **err) {
    const mk_tensor *q = &l->in[0], *sc = &l->in[1];
    dequantize_args a = {q->rank};
    for (int d = 0; d < q->rank; d++) {
        a.shape[d] = q->shape[d];
        a.q_stride[d] = q->stride[d];
        a.s_stride[d] = sc->stride[d];
        a.block[d] = q->shape[d] / sc->shape[d];
    }
    long long n = mk_tensor_numel(q);
    dequantize_kernel<<<grid_for(n), MK_CUDA_BLOCK, 0, mk_cuda_state_of(l)->stream>>>(
        (float *)l->out.data, (const signed char *)q->data, (const float *)sc->data, a, n);
    return mk_cuda_check_launch(l, "dequantize", err);
}

/* One thread per group of g (x dense): s = max |x| / 127, q = round(x / s)
 * halves away from zero, 0 where s is 0 or x / s is NaN, clamped to +-127. */
static __global__ void fake_quantize_kernel(float *out, const float *x, long long g,
                                            long long groups) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < groups;
         i += (long long)gridDim.x * blockDim.x) {
        const float *xi = x + i * g;
        float m = 0.0f;
        for (long long j = 0; j < g; j++) {
            const float v = fabsf(xi[j]);
            if (v > m) m = v;
        }
        const float s = __fdiv_rn(m, 127.0f);
        for (long long j = 0; j < g; j++) {
            float v = s != 0.0f ? roundf(__fdiv_rn(xi[j], s)) : 0.0f;
            v = v != v ? 0.0f : v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            out[i * g + j] = __fmul_rn(v, s);
        }
    }
}

/* MK_KERNEL_FAKE_QUANTIZE */
int mk_cuda_fake_quantize(const mk_launch *l, mk_error **err) {
    long long g = l->node->attr[0], groups = mk_tensor_numel(&l->out) / g;
    fake_quantize_kernel<<<grid_for(groups), MK_CUDA_BLOCK, 0, mk_cuda_state_of(l)->stream>>>(
        (float *)l->out.data, (const float *)l->in[0].data, g, groups);
    return mk_cuda_check_launch(l, "fake_quantize", err);
}
