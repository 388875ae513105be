/* rows.cuh: a row group's reductions over the RT threads that take a row
 * (core/codegen/rows.c writes rows::RT before it): butterfly shuffles within
 * a warp, so that every lane ends with the same bits, then, where a row is
 * several warps (a block), the warps' values through shared memory `sh`
 * (RT / 32 of them) and shuffles again. Sums are doubles, as the CPU's. */
namespace rows {

/* -infinity (NVRTC has no math.h) */
__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* x > m ? x : m: a NaN never wins, as the CPU's softmax_row after its first element */
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

__device__ __forceinline__ double row_sum(double v, double *sh) {
    v = warp_sum(v);
    if (RT == 32) return v;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); /* the last reduction's reads of sh are done */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return warp_sum(lane < RT / 32 ? sh[lane] : 0.0);
}

__device__ __forceinline__ float row_max(float v, double *sh) {
    v = warp_max(v);
    if (RT == 32) return v;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return warp_max(lane < RT / 32 ? (float)sh[lane] : neg_inf());
}

} // namespace rows
