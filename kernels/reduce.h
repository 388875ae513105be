/*
 * reduce.h — warp-level reductions the row kernels share (norm_softmax.cu,
 * sample.cu): every lane of a full warp gets the result.
 */
#ifndef MK_REDUCE_H
#define MK_REDUCE_H

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
    return v;
}

/* Is (v2, i2) a better maximum than (v1, i1)? Larger, or equal and earlier. */
static __device__ __forceinline__ bool better(float v2, long long i2, float v1, long long i1) {
    return v2 > v1 || (v2 == v1 && i2 < i1);
}

/* The largest (v, i) of the warp, the earliest i on ties. */
static __device__ __forceinline__ void warp_argmax(float *v, long long *i) {
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
        float v2 = __shfl_xor_sync(0xffffffffu, *v, d);
        long long i2 = __shfl_xor_sync(0xffffffffu, *i, d);
        if (better(v2, i2, *v, *i)) *v = v2, *i = i2;
    }
}

#endif
