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
