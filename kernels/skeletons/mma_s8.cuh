/* mma_s8.cuh: the integer MMA of the tensor-core form, d += a b over 16 x 8 x 32
 * int8 (or the same sums by shuffles and DP4A before sm_80, or with MK_NO_MMA) */
static __device__ __forceinline__ void mk_mma_s8(int *d, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                                 unsigned b0, unsigned b1) {
#if __CUDA_ARCH__ >= 800 && !defined(MK_NO_MMA)
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else /* the same sums: lane (g, t) takes rows g, g + 8 and columns 2t, 2t + 1 over the lanes u of their groups */
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    for (int u = 0; u < 4; u++) {
        const int x0 = (int)__shfl_sync(0xffffffffu, a0, 4 * g + u), x1 = (int)__shfl_sync(0xffffffffu, a1, 4 * g + u);
        const int x2 = (int)__shfl_sync(0xffffffffu, a2, 4 * g + u), x3 = (int)__shfl_sync(0xffffffffu, a3, 4 * g + u);
        const int y0 = (int)__shfl_sync(0xffffffffu, b0, 8 * t + u), y1 = (int)__shfl_sync(0xffffffffu, b1, 8 * t + u);
        const int z0 = (int)__shfl_sync(0xffffffffu, b0, 8 * t + 4 + u), z1 = (int)__shfl_sync(0xffffffffu, b1, 8 * t + 4 + u);
        d[0] = __dp4a(x2, y1, __dp4a(x0, y0, d[0])); d[1] = __dp4a(x2, z1, __dp4a(x0, z0, d[1]));
        d[2] = __dp4a(x3, y1, __dp4a(x1, y0, d[2])); d[3] = __dp4a(x3, z1, __dp4a(x1, z0, d[3]));
    }
#endif
}

/* A step (128 of k) of the tensor-core form (core/codegen/matvec_tc.c's put_tc_sums)
 * for lane (g, t) of a warp's 16 columns: its 32 bytes of columns g and g + 8
 * (c0, c1: k = 32 t ..) into the MMA against A's digits at k (sD), two MMAs
 * for each 8 bytes (the lanes t = 0, 1 and t = 2, 3 hold different 64s, the
 * other 64's lanes giving zero digits); then each 64's exact integer sums
 * times the weights' scales (w0, w1) and the 64's factor (sF) added into
 * acc[column][digit]. */
static __device__ __forceinline__ void mk_tc_step(const uint4 (&c0)[2], const uint4 (&c1)[2], const float (&w0)[2],
                                                  const float (&w1)[2], const unsigned char *sD, const float *sF,
                                                  int k, int g, int t, float (&acc)[2][2]) {
    int d[2][4] = {};
#pragma unroll
    for (int jj = 0; jj < 2; jj++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint2 x = g < 4 ? *(const uint2 *)&sD[((k + 32 * t + 16 * jj + 8 * i) >> 3) * 32 + 8 * g]
                                  : make_uint2(0u, 0u);
            const unsigned a0 = i ? c0[jj].z : c0[jj].x, a1 = i ? c1[jj].z : c1[jj].x;
            const unsigned a2 = i ? c0[jj].w : c0[jj].y, a3 = i ? c1[jj].w : c1[jj].y;
            mk_mma_s8(d[0], a0, a1, a2, a3, t < 2 ? x.x : 0u, t < 2 ? x.y : 0u);
            mk_mma_s8(d[1], a0, a1, a2, a3, t < 2 ? 0u : x.x, t < 2 ? 0u : x.y);
        }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float f = sF[(k >> 6) + h], fa = w0[h] * f, fb = w1[h] * f;
        acc[0][0] += fa * (float)d[h][0]; acc[0][1] += fa * (float)d[h][1];
        acc[1][0] += fb * (float)d[h][2]; acc[1][1] += fb * (float)d[h][3];
    }
}

/* Lane (g, t)'s sum of column g + 8 h from its acc: digit n = 2 t + c weighs
 * 2^-8n (lanes t = 2, 3 hold zeros), and lane t = 0 adds t = 1's. */
static __device__ __forceinline__ float mk_tc_column(const float (&acc)[2][2], int h, int t) {
    const float u0 = __int_as_float((127 - 16 * t) << 23), u1 = __int_as_float((119 - 16 * t) << 23);
    float v = acc[h][0] * u0 + acc[h][1] * u1;
    return v + __shfl_xor_sync(0xffffffffu, v, 1);
}
