/*
 * reduce.cu — reductions, softmaxes and norms over any axes on the GPU (the
 * op table's "reductions and norms" rows; the CPU's are core/cpu/reduce.c):
 *
 *   MK_KERNEL_REDUCE_{SUM,MEAN,MAX,MIN,PROD,VAR}  x (any strides) over an axis
 *                        list into a dense result (the axes kept as 1); var:
 *                        two passes (the mean, then squared deviations) over
 *                        N - correction, a float32 [1] read on the device
 *   MK_KERNEL_ARG{MAX,MIN}_AXIS  int64 index along one axis, the first on
 *                        ties; a NaN wins, the first of them (NumPy's)
 *   MK_KERNEL_SOFTMAX, MK_KERNEL_LOG_SOFTMAX  along one axis, x any strides,
 *                        the max subtracted first
 *   MK_KERNEL_LAYER_NORM, MK_KERNEL_GROUP_NORM, MK_KERNEL_RMS_NORM_EPS
 *                        dense rows of x normalized, a weight (and bias) per
 *                        element or channel; eps a float32 [1]
 *   MK_KERNEL_BATCH_NORM per element, the channel's running statistics
 *
 * x is split as core/reductions.h says: `outer` reductions of `inner`
 * elements each. A reduction is one warp's where inner is at most
 * SHORT_INNER (eight per block), else one block of LONG_G threads'; each
 * thread takes every G-th element, partial results combine through warp
 * shuffles and, across a block's warps, shared memory. Sums accumulate in
 * float32 (the CPU's in double: gpu_spec compares within rounding).
 * Checked against the CPU by spec/gpu_spec.lua (spec/cases/reduce.lua).
 */
#include "cuda_device.h"
#include "reduce.h"

extern "C" {
#include "reductions.h"
}

#include <math.h>
#include <type_traits>

#define SHORT_INNER 1024
#define LONG_G 256
#define WARPS_PER_BLOCK 8
/* at most this many blocks; each group then loops over its reductions */
#define MAX_BLOCKS 65535

enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD };

/* a op b; for max and min a NaN on either side wins */
template <int OP>
static __device__ __forceinline__ float combine(float a, float b) {
    if (OP == R_PROD) return a * b;
    if (OP == R_MAX) return (a != a || a > b) ? a : b;
    if (OP == R_MIN) return (a != a || a < b) ? a : b;
    return a + b;
}

template <int OP>
static __device__ __forceinline__ float identity() {
    return OP == R_PROD ? 1.0f : OP == R_MAX ? -INFINITY : OP == R_MIN ? INFINITY : 0.0f;
}

/* v combined over the G threads of a reduction's group (G = 32: the warp;
 * else the whole block); every thread of the group gets the result. */
template <int OP, int G>
static __device__ __forceinline__ float group_combine(float v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v = combine<OP>(v, __shfl_xor_sync(0xffffffffu, v, d));
    if (G == 32) return v;
    __shared__ float part[G / 32];
    __shared__ float total;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < G / 32 ? part[lane] : identity<OP>();
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) t = combine<OP>(t, __shfl_xor_sync(0xffffffffu, t, d));
        if (lane == 0) total = t;
    }
    __syncthreads();
    float r = total;
    __syncthreads(); /* part and total may be reused by the next combine */
    return r;
}

/* This thread's first reduction, the step to its next, and its index in the
 * group. Every thread of a group takes the same reductions, so a block's
 * barriers are never split. */
template <int G>
static __device__ __forceinline__ long long group_first(long long *step, int *tid) {
    *tid = threadIdx.x;
    if (G == 32) {
        *step = (long long)gridDim.x * WARPS_PER_BLOCK;
        return (long long)blockIdx.x * WARPS_PER_BLOCK + threadIdx.y;
    }
    *step = gridDim.x;
    return blockIdx.x;
}

template <int G>
static void group_shape(long long reductions, dim3 *grid, dim3 *block) {
    long long per = G == 32 ? WARPS_PER_BLOCK : 1;
    long long b = (reductions + per - 1) / per;
    *grid = dim3((unsigned)(b < 1 ? 1 : b > MAX_BLOCKS ? MAX_BLOCKS : b));
    *block = G == 32 ? dim3(32, WARPS_PER_BLOCK) : dim3(G);
}

/* Calls f with G (an integral constant) for reductions of n elements. */
template <class F>
static void by_length(long long n, F f) {
    if (n <= SHORT_INNER) f(std::integral_constant<int, 32>());
    else f(std::integral_constant<int, LONG_G>());
}

/* ---- sum, mean, max, min, prod, var ---------------------------------------- */

/* The reduction at x of this thread's elements (every G-th, from tid) as OP. */
template <int OP, int G>
static __device__ __forceinline__ float reduce_part(const float *x, const mk_axes &red,
                                                    long long inner, int tid) {
    float v = identity<OP>();
    for (long long i = tid; i < inner; i += G) v = combine<OP>(v, x[mk_reduce_offset(&red, i)]);
    return v;
}

template <int OP, int G>
static __global__ void reduce_kernel(float *out, const float *x, mk_reduce_plan p) {
    int tid;
    long long step;
    for (long long o = group_first<G>(&step, &tid); o < p.outer; o += step) {
        const float *xo = x + mk_reduce_offset(&p.kept, o);
        float v = group_combine<OP, G>(reduce_part<OP, G>(xo, p.red, p.inner, tid));
        if (tid == 0) out[o] = OP == R_MEAN ? v / (float)p.inner : v;
    }
}

template <int G>
static __global__ void var_kernel(float *out, const float *x, const float *correction,
                                  mk_reduce_plan p) {
    int tid;
    long long step;
    float c = *correction;
    for (long long o = group_first<G>(&step, &tid); o < p.outer; o += step) {
        const float *xo = x + mk_reduce_offset(&p.kept, o);
        float mean = group_combine<R_SUM, G>(reduce_part<R_SUM, G>(xo, p.red, p.inner, tid)) /
                     (float)p.inner;
        float ss = 0.0f;
        for (long long i = tid; i < p.inner; i += G) {
            float d = xo[mk_reduce_offset(&p.red, i)] - mean;
            ss += d * d;
        }
        ss = group_combine<R_SUM, G>(ss);
        if (tid == 0) out[o] = ss / ((float)p.inner - c);
    }
}

static mk_reduce_plan plan_of(const mk_launch *l) {
    return mk_reduce_plan_of(&l->in[0], mk_reduce_mask(l->node));
}

template <int OP>
static int reduce(const mk_launch *l, const char *name, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    mk_reduce_plan p = plan_of(l);
    by_length(p.inner, [&](auto g) {
        constexpr int G = decltype(g)::value;
        dim3 grid, block;
        group_shape<G>(p.outer, &grid, &block);
        reduce_kernel<OP, G><<<grid, block, 0, s->stream>>>((float *)l->out.data,
                                                            (const float *)l->in[0].data, p);
    });
    return mk_cuda_check_launch(l, name, err);
}

int mk_cuda_reduce_sum(const mk_launch *l, mk_error **err) { return reduce<R_SUM>(l, "sum", err); }
int mk_cuda_reduce_mean(const mk_launch *l, mk_error **err) { return reduce<R_MEAN>(l, "mean", err); }
int mk_cuda_reduce_max(const mk_launch *l, mk_error **err) { return reduce<R_MAX>(l, "max", err); }
int mk_cuda_reduce_min(const mk_launch *l, mk_error **err) { return reduce<R_MIN>(l, "min", err); }
int mk_cuda_reduce_prod(const mk_launch *l, mk_error **err) { return reduce<R_PROD>(l, "prod", err); }

int mk_cuda_reduce_var(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    mk_reduce_plan p = plan_of(l);
    by_length(p.inner, [&](auto g) {
        constexpr int G = decltype(g)::value;
        dim3 grid, block;
        group_shape<G>(p.outer, &grid, &block);
        var_kernel<G><<<grid, block, 0, s->stream>>>((float *)l->out.data,
                                                     (const float *)l->in[0].data,
                                                     (const float *)l->in[1].data, p);
    });
    return mk_cuda_check_launch(l, "var", err);
}

/* ---- argmax, argmin along one axis ------------------------------------------- */

/* Is (v2, i2) better than (v1, i1)? A NaN beats any number, the earlier of
 * two NaNs or of equal values wins. */
template <bool MAX>
static __device__ __forceinline__ bool arg_better(float v2, long long i2, float v1, long long i1) {
    bool n1 = v1 != v1, n2 = v2 != v2;
    if (n1 || n2) return n2 && (!n1 || i2 < i1);
    return (MAX ? v2 > v1 : v2 < v1) || (v2 == v1 && i2 < i1);
}

template <bool MAX>
static __device__ __forceinline__ void warp_arg(float *v, long long *i) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, *v, d);
        long long i2 = __shfl_xor_sync(0xffffffffu, *i, d);
        if (arg_better<MAX>(v2, i2, *v, *i)) *v = v2, *i = i2;
    }
}

template <bool MAX, int G>
static __global__ void arg_kernel(long long *out, const float *x, mk_reduce_plan p) {
    int tid;
    long long step;
    long long st = p.red.stride[0];
    for (long long o = group_first<G>(&step, &tid); o < p.outer; o += step) {
        const float *xo = x + mk_reduce_offset(&p.kept, o);
        float v = MAX ? -INFINITY : INFINITY;
        long long best = 0x7fffffffffffffffLL;
        for (long long j = tid; j < p.inner; j += G)
            if (arg_better<MAX>(xo[j * st], j, v, best)) v = xo[j * st], best = j;
        warp_arg<MAX>(&v, &best);
        if (G > 32) {
            __shared__ float pv[G / 32];
            __shared__ long long pi[G / 32];
            int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
            if (lane == 0) pv[warp] = v, pi[warp] = best;
            __syncthreads();
            if (warp == 0) {
                v = lane < G / 32 ? pv[lane] : (MAX ? -INFINITY : INFINITY);
                best = lane < G / 32 ? pi[lane] : 0x7fffffffffffffffLL;
                warp_arg<MAX>(&v, &best);
            }
            __syncthreads(); /* pv and pi are reused by the next reduction */
        }
        if (tid == 0) out[o] = best;
    }
}

template <bool MAX>
static int arg_reduce(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    mk_reduce_plan p = plan_of(l);
    by_length(p.inner, [&](auto g) {
        constexpr int G = decltype(g)::value;
        dim3 grid, block;
        group_shape<G>(p.outer, &grid, &block);
        arg_kernel<MAX, G><<<grid, block, 0, s->stream>>>((long long *)l->out.data,
                                                          (const float *)l->in[0].data, p);
    });
    return mk_cuda_check_launch(l, MAX ? "argmax" : "argmin", err);
}

int mk_cuda_argmax_axis(const mk_launch *l, mk_error **err) { return arg_reduce<true>(l, err); }
int mk_cuda_argmin_axis(const mk_launch *l, mk_error **err) { return arg_reduce<false>(l, err); }

/* ---- softmax, log_softmax along one axis ------------------------------------- */

template <bool LOG, int G>
static __global__ void softmax_kernel(float *out, const float *x, mk_reduce_plan p) {
    int tid;
    long long step;
    long long st = p.red.stride[0], ost = p.red_out.stride[0];
    for (long long r = group_first<G>(&step, &tid); r < p.outer; r += step) {
        const float *xr = x + mk_reduce_offset(&p.kept, r);
        float *o = out + mk_reduce_offset(&p.kept_out, r);
        float m = -INFINITY;
        for (long long j = tid; j < p.inner; j += G) m = fmaxf(m, xr[j * st]);
        m = group_combine<R_MAX, G>(m);
        float sum = 0.0f;
        for (long long j = tid; j < p.inner; j += G) sum += expf(xr[j * st] - m);
        sum = group_combine<R_SUM, G>(sum);
        if (LOG) {
            float ls = logf(sum);
            for (long long j = tid; j < p.inner; j += G) o[j * ost] = xr[j * st] - m - ls;
        } else {
            float inv = 1.0f / sum;
            for (long long j = tid; j < p.inner; j += G) o[j * ost] = expf(xr[j * st] - m) * inv;
        }
    }
}

template <bool LOG>
static int softmax(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    mk_reduce_plan p = plan_of(l);
    by_length(p.inner, [&](auto g) {
        constexpr int G = decltype(g)::value;
        dim3 grid, block;
        group_shape<G>(p.outer, &grid, &block);
        softmax_kernel<LOG, G><<<grid, block, 0, s->stream>>>((float *)l->out.data,
                                                              (const float *)l->in[0].data, p);
    });
    return mk_cuda_check_launch(l, LOG ? "log_softmax" : "softmax", err);
}

int mk_cuda_softmax(const mk_launch *l, mk_error **err) { return softmax<false>(l, err); }
int mk_cuda_log_softmax(const mk_launch *l, mk_error **err) { return softmax<true>(l, err); }

/* ---- norms over dense rows ------------------------------------------------------ */

/* As the CPU's norm_rows: rows of len elements, element j of row r taking
 * parameter c = (r % groups) * per_group + j / spatial at c * ws (c * bs). */
typedef struct {
    long long rows, len, groups, per_group, spatial;
    const float *w, *b; /* b may be NULL */
    long long ws, bs;
    const float *eps;   /* float32 [1], on the device */
    bool center;
} norm_rows;

template <int G>
static __global__ void norm_kernel(float *out, const float *x, norm_rows nr) {
    int tid;
    long long step;
    float eps = *nr.eps;
    for (long long r = group_first<G>(&step, &tid); r < nr.rows; r += step) {
        const float *xr = x + r * nr.len;
        float *o = out + r * nr.len;
        float mean = 0.0f;
        if (nr.center) {
            float s = 0.0f;
            for (long long j = tid; j < nr.len; j += G) s += xr[j];
            mean = group_combine<R_SUM, G>(s) / (float)nr.len;
        }
        float ss = 0.0f;
        for (long long j = tid; j < nr.len; j += G) {
            float d = xr[j] - mean;
            ss += d * d;
        }
        ss = group_combine<R_SUM, G>(ss);
        float inv = 1.0f / sqrtf(ss / (float)nr.len + eps);
        long long c0 = (r % nr.groups) * nr.per_group;
        for (long long j = tid; j < nr.len; j += G) {
            long long c = c0 + j / nr.spatial;
            float y = (xr[j] - mean) * inv * nr.w[c * nr.ws];
            o[j] = nr.b ? y + nr.b[c * nr.bs] : y;
        }
    }
}

static long long param_step(const mk_tensor *t) { return mk_tensor_numel(t) == 1 ? 0 : 1; }

static int norm(const mk_launch *l, const norm_rows &nr, const char *name, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    by_length(nr.len, [&](auto g) {
        constexpr int G = decltype(g)::value;
        dim3 grid, block;
        group_shape<G>(nr.rows, &grid, &block);
        norm_kernel<G><<<grid, block, 0, s->stream>>>((float *)l->out.data,
                                                      (const float *)l->in[0].data, nr);
    });
    return mk_cuda_check_launch(l, name, err);
}

/* x, weight, bias, eps, k: the last k axes */
int mk_cuda_layer_norm(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    long long len = 1;
    for (int d = x->rank - (int)l->node->attr[0]; d < x->rank; d++) len *= x->shape[d];
    norm_rows nr = {mk_tensor_numel(x) / len, len, 1, 0, 1,
                    (const float *)l->in[1].data, (const float *)l->in[2].data,
                    param_step(&l->in[1]), param_step(&l->in[2]),
                    (const float *)l->in[3].data, true};
    return norm(l, nr, "layer_norm", err);
}

/* x [N, C, ...], weight, bias, eps, groups */
int mk_cuda_group_norm(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    long long groups = l->node->attr[0], c = x->shape[1];
    long long spatial = mk_tensor_numel(x) / (x->shape[0] * c);
    norm_rows nr = {x->shape[0] * groups, c / groups * spatial, groups, c / groups, spatial,
                    (const float *)l->in[1].data, (const float *)l->in[2].data,
                    param_step(&l->in[1]), param_step(&l->in[2]),
                    (const float *)l->in[3].data, true};
    return norm(l, nr, "group_norm", err);
}

/* x, weight [n], eps: no centering, no bias */
int mk_cuda_rms_norm_eps(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    long long len = x->shape[x->rank - 1];
    norm_rows nr = {mk_tensor_numel(x) / len, len, 1, 0, 1, (const float *)l->in[1].data, NULL,
                    param_step(&l->in[1]), 0, (const float *)l->in[2].data, false};
    return norm(l, nr, "rms_norm", err);
}

/* ---- batch norm: per element ----------------------------------------------------- */

typedef struct {
    const float *m, *v, *w, *b, *eps;
    long long ms, vs, ws, bs; /* 0 where the statistic is [1] */
    long long n, c, spatial;
} batch_norm_args;

static __global__ void batch_norm_kernel(float *out, const float *x, batch_norm_args a) {
    float eps = *a.eps;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (long long)gridDim.x * blockDim.x) {
        long long ch = i / a.spatial % a.c;
        float inv = 1.0f / sqrtf(a.v[ch * a.vs] + eps);
        out[i] = (x[i] - a.m[ch * a.ms]) * inv * a.w[ch * a.ws] + a.b[ch * a.bs];
    }
}

int mk_cuda_batch_norm(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0];
    long long n = mk_tensor_numel(x), c = x->shape[1];
    batch_norm_args a = {(const float *)l->in[1].data, (const float *)l->in[2].data,
                         (const float *)l->in[3].data, (const float *)l->in[4].data,
                         (const float *)l->in[5].data, param_step(&l->in[1]),
                         param_step(&l->in[2]),        param_step(&l->in[3]),
                         param_step(&l->in[4]),        n, c, n / (x->shape[0] * c)};
    long long blocks = (n + 255) / 256;
    batch_norm_kernel<<<(unsigned)(blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks), 256, 0,
                        s->stream>>>((float *)l->out.data, (const float *)x->data, a);
    return mk_cuda_check_launch(l, "batch_norm", err);
}
