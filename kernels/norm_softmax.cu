/*
 * norm_softmax.cu — row reductions on the GPU, over the last axis of a
 * contiguous x [rows, n]:
 *
 *   MK_KERNEL_RMS_NORM        out = w [n] * x / sqrt(mean(x²) + 1e-5)        (as run.c)
 *   MK_KERNEL_SLICED_SOFTMAX  out[:p] = softmax(x[:p]), out[p:] = x[p:];  p: int64 [1]
 *                             read on the device at run time, 0 <= p <= n, else a fault
 *   MK_KERNEL_CAUSAL_SOFTMAX  x [..., T, S]: row t as sliced_softmax with
 *                             p = end - T + 1 + t and out[p:] = 0; T <= end <= n
 *   MK_KERNEL_ARGMAX          out [rows] (int64) = index of the largest, first on ties
 *
 * A row is reduced by a group of G threads: one warp for short rows (eight
 * rows per block), a block of 512 for long ones. Partial results combine
 * through warp shuffles and, across warps, shared memory. rms_norm and
 * softmax keep rows of up to 8192 in registers (E per thread), so x is read
 * once; longer rows loop over memory again (from cache).
 */
#include "cuda_device.h"
#include "reduce.h"

#include <math.h>
#include <type_traits>

/* Rows at most this long get one warp each. */
#define SHORT_ROW 1024
#define LONG_G 512
#define SHORT_ROWS_PER_BLOCK 8

/* Reduces v over the G threads of a row's group (G = 32: the warp; else the
 * whole block, G threads). Every thread of the group gets the result. */
template <int G, bool MAX>
static __device__ __forceinline__ float group_reduce(float v) {
    v = MAX ? warp_max(v) : warp_sum(v);
    if (G == 32) return v;
    __shared__ float part[G / 32];
    __shared__ float total;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < G / 32 ? part[lane] : (MAX ? -INFINITY : 0.0f);
        t = MAX ? warp_max(t) : warp_sum(t);
        if (lane == 0) total = t;
    }
    __syncthreads();
    float r = total;
    __syncthreads(); /* part/total may be reused by the next reduction */
    return r;
}

/* The row this thread works on and its index within the row's group. */
template <int G>
static __device__ __forceinline__ long long group_row(int *tid) {
    if (G == 32) {
        *tid = threadIdx.x;
        return (long long)blockIdx.x * SHORT_ROWS_PER_BLOCK + threadIdx.y;
    }
    *tid = threadIdx.x;
    return blockIdx.x;
}

/* Launch shape for `rows` rows of a group size G. */
template <int G>
static void group_shape(long long rows, dim3 *grid, dim3 *block) {
    if (G == 32) {
        *grid = dim3(mk_cuda_blocks(rows, SHORT_ROWS_PER_BLOCK));
        *block = dim3(32, SHORT_ROWS_PER_BLOCK);
    } else {
        *grid = dim3(mk_cuda_blocks(rows, 1));
        *block = dim3(G);
    }
}

/* Calls f(G, E) (std::integral_constant<int, ...> values, for template
 * arguments) with the form that takes a row of n: G threads a row holding E
 * values each in registers, the fewest that hold it, or (LONG_G, 0) for a
 * row longer than those hold, which the looping kernel takes. */
template <class F>
static void by_row_form(long long n, F f) {
    using G32 = std::integral_constant<int, 32>;
    using GL = std::integral_constant<int, LONG_G>;
    if (n <= 32 * 4) f(G32(), std::integral_constant<int, 4>());
    else if (n <= 32 * 8) f(G32(), std::integral_constant<int, 8>());
    else if (n <= 32 * 16) f(G32(), std::integral_constant<int, 16>());
    else if (n <= 32 * 32) f(G32(), std::integral_constant<int, 32>());
    else if (n <= LONG_G * 4) f(GL(), std::integral_constant<int, 4>());
    else if (n <= LONG_G * 8) f(GL(), std::integral_constant<int, 8>());
    else if (n <= LONG_G * 16) f(GL(), std::integral_constant<int, 16>());
    else f(GL(), std::integral_constant<int, 0>());
}

/* ---- rms_norm ------------------------------------------------------------ */

template <int G>
static __global__ void rms_norm_kernel(float *out, const float *x, const float *w, long long rows,
                                       long long n) {
    int tid;
    long long row = group_row<G>(&tid);
    if (row >= rows) return; /* whole groups leave together: no barrier is split */
    const float *xr = x + row * n;
    float *o = out + row * n;
    float ss = 0.0f;
    for (long long j = tid; j < n; j += G) ss += xr[j] * xr[j];
    ss = group_reduce<G, false>(ss);
    ss /= (float)n;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
    for (long long j = tid; j < n; j += G) o[j] = w[j] * (ss * xr[j]);
}

/*
 * The same with the row held in registers: E elements per thread (j = tid +
 * e·G), so x is read from memory once. For rows up to G·E long.
 */
template <int G, int E>
static __global__ void rms_norm_regs(float *out, const float *x, const float *w, long long rows,
                                     long long n) {
    int tid;
    long long row = group_row<G>(&tid);
    if (row >= rows) return;
    const float *xr = x + row * n;
    float *o = out + row * n;
    float v[E];
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < E; e++) {
        long long j = tid + (long long)e * G;
        v[e] = j < n ? xr[j] : 0.0f;
        ss += v[e] * v[e];
    }
    ss = group_reduce<G, false>(ss);
    ss /= (float)n;
    ss += 1e-5f;
    ss = 1.0f / sqrtf(ss);
#pragma unroll
    for (int e = 0; e < E; e++) {
        long long j = tid + (long long)e * G;
        if (j < n) o[j] = w[j] * (ss * v[e]);
    }
}

/* MK_KERNEL_RMS_NORM: float32. */
int mk_cuda_rms_norm(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0], *w = &l->in[1];
    long long n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    float *o = (float *)l->out.data;
    const float *px = (const float *)x->data, *pw = (const float *)w->data;
    by_row_form(n, [&](auto g, auto e) {
        constexpr int G = decltype(g)::value, E = decltype(e)::value;
        dim3 grid, block;
        group_shape<G>(rows, &grid, &block);
        if constexpr (E > 0) rms_norm_regs<G, E><<<grid, block, 0, s->stream>>>(o, px, pw, rows, n);
        else rms_norm_kernel<G><<<grid, block, 0, s->stream>>>(o, px, pw, rows, n);
    });
    return mk_cuda_check_launch(l, "rms_norm", err);
}

/* ---- sliced_softmax ------------------------------------------------------ */

/*
 * Row `row`'s prefix: the bound itself (causal = 0; bound[row / run], one a
 * run of `run` rows), or for causal attention's T = causal rows per block,
 * end - T + 1 + row % T. False (and the fault raised once a run) where the
 * bound is out of range: [0, n], or [T, n] for causal.
 */
static __device__ bool softmax_prefix(const long long *bound, long long run, long long causal,
                                      long long row, long long n, int tid, mk_fault_rec *fault,
                                      int launch, long long *p) {
    long long b = bound[row / run]; /* the same for every thread: the caller's branch is uniform */
    if (b < causal || b > n) {
        if (row % run == 0 && tid == 0)
            mk_raise(fault, launch, 0, causal ? MK_FAULT_END : MK_FAULT_PREFIX, b, n, causal);
        return false;
    }
    *p = causal ? b - causal + 1 + row % causal : b;
    return true;
}

template <int G>
static __global__ void sliced_softmax_kernel(float *out, const float *x, const long long *bound,
                                             long long run, long long causal, long long rows,
                                             long long n, mk_fault_rec *fault, int launch) {
    int tid;
    long long row = group_row<G>(&tid), p;
    if (row >= rows || !softmax_prefix(bound, run, causal, row, n, tid, fault, launch, &p)) return;
    const float *xr = x + row * n;
    float *o = out + row * n;
    if (p > 0) {
        float m = -INFINITY;
        for (long long j = tid; j < p; j += G) m = fmaxf(m, xr[j]);
        m = group_reduce<G, true>(m);
        float sum = 0.0f;
        for (long long j = tid; j < p; j += G) {
            float e = expf(xr[j] - m);
            o[j] = e;
            sum += e;
        }
        sum = group_reduce<G, false>(sum);
        /* each thread divides the elements it wrote itself: no barrier needed */
        for (long long j = tid; j < p; j += G) o[j] = o[j] / sum;
    }
    for (long long j = p + tid; j < n; j += G) o[j] = causal ? 0.0f : xr[j];
}

/* The same with the row held in registers (E per thread, rows up to G·E):
 * x is read once and out written once. */
template <int G, int E>
static __global__ void sliced_softmax_regs(float *out, const float *x, const long long *bound,
                                           long long run, long long causal, long long rows,
                                           long long n, mk_fault_rec *fault, int launch) {
    int tid;
    long long row = group_row<G>(&tid), p;
    if (row >= rows || !softmax_prefix(bound, run, causal, row, n, tid, fault, launch, &p)) return;
    const float *xr = x + row * n;
    float *o = out + row * n;
    float v[E];
    float m = -INFINITY;
#pragma unroll
    for (int e = 0; e < E; e++) {
        long long j = tid + (long long)e * G;
        v[e] = j < n ? xr[j] : 0.0f;
        if (j < p) m = fmaxf(m, v[e]);
    }
    if (p > 0) {
        m = group_reduce<G, true>(m);
        float sum = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            long long j = tid + (long long)e * G;
            if (j < p) {
                v[e] = expf(v[e] - m);
                sum += v[e];
            }
        }
        sum = group_reduce<G, false>(sum);
#pragma unroll
        for (int e = 0; e < E; e++)
            if (tid + (long long)e * G < p) v[e] = v[e] / sum;
    }
#pragma unroll
    for (int e = 0; e < E; e++) {
        long long j = tid + (long long)e * G;
        if (j < n) o[j] = j < p || !causal ? v[e] : 0.0f;
    }
}

/* Both families: causal = 0 for sliced_softmax, else T (rows per block of
 * queries). float32 x; the prefix is an int64 [1] or one a run of the first
 * axis (ops_rules.c's need_bounds), the end an int64 [1]. */
static int softmax_launch(const mk_launch *l, long long causal, const char *what,
                          mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0];
    long long n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    const long long *bound = (const long long *)l->in[1].data;
    const long long run = rows / mk_tensor_numel(&l->in[1]); /* rows a bound */
    float *o = (float *)l->out.data;
    const float *px = (const float *)x->data;
    by_row_form(n, [&](auto g, auto e) {
        constexpr int G = decltype(g)::value, E = decltype(e)::value;
        dim3 grid, block;
        group_shape<G>(rows, &grid, &block);
        if constexpr (E > 0)
            sliced_softmax_regs<G, E><<<grid, block, 0, s->stream>>>(
                o, px, bound, run, causal, rows, n, s->fault, l->index);
        else
            sliced_softmax_kernel<G><<<grid, block, 0, s->stream>>>(
                o, px, bound, run, causal, rows, n, s->fault, l->index);
    });
    return mk_cuda_check_launch(l, what, err);
}

/* MK_KERNEL_SLICED_SOFTMAX: the prefix for every row, the rest copied. */
int mk_cuda_sliced_softmax(const mk_launch *l, mk_error **err) {
    return softmax_launch(l, 0, "sliced_softmax", err);
}

/* MK_KERNEL_CAUSAL_SOFTMAX: x [..., T, S], row t's prefix end - T + 1 + t, the rest zero. */
int mk_cuda_causal_softmax(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    return softmax_launch(l, x->shape[x->rank - 2], "causal_softmax", err);
}

/* ---- argmax -------------------------------------------------------------- */

/*
 * As the CPU's loop (best = 0, replaced only by a strictly larger value): a
 * NaN at index 0 wins, any other NaN never does (it compares as -inf here,
 * which loses every tie to an earlier index).
 */
template <int G>
static __global__ void argmax_kernel(long long *out, const float *x, long long rows, long long n) {
    int tid;
    long long row = group_row<G>(&tid);
    if (row >= rows) return;
    const float *xr = x + row * n;
    float v = -INFINITY;
    long long best = 0x7fffffffffffffffLL;
    for (long long j = tid; j < n; j += G) {
        float y = xr[j];
        if (isnan(y)) y = -INFINITY;
        if (better(y, j, v, best)) v = y, best = j;
    }
    warp_argmax(&v, &best);
    if (G > 32) {
        __shared__ float pv[G / 32];
        __shared__ long long pi[G / 32];
        int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
        if (lane == 0) pv[warp] = v, pi[warp] = best;
        __syncthreads();
        if (warp != 0) return;
        v = lane < G / 32 ? pv[lane] : -INFINITY;
        best = lane < G / 32 ? pi[lane] : 0x7fffffffffffffffLL;
        warp_argmax(&v, &best);
    }
    if (tid == 0) out[row] = isnan(xr[0]) ? 0 : best;
}

/* MK_KERNEL_ARGMAX: float32 x (the only float dtype in its mask), int64 out. */
int mk_cuda_argmax(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0];
    long long n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    dim3 grid, block;
    if (n <= SHORT_ROW) {
        group_shape<32>(rows, &grid, &block);
        argmax_kernel<32><<<grid, block, 0, s->stream>>>((long long *)l->out.data,
                                                         (const float *)x->data, rows, n);
    } else {
        group_shape<LONG_G>(rows, &grid, &block);
        argmax_kernel<LONG_G><<<grid, block, 0, s->stream>>>((long long *)l->out.data,
                                                             (const float *)x->data, rows, n);
    }
    return mk_cuda_check_launch(l, "argmax", err);
}
