/*
 * argmax.cuh: the ArgMax of a matrix–vector launch's result (core/codegen/matvec.c),
 * one per row of its [m, n] result, in two steps.
 *
 * In the epilogue each lane turns its values into keys and keeps the largest
 * of its block's in shared memory (sbest, a key a row). A key orders the
 * values (the float's bits flipped to an unsigned order, -0 as +0), then the
 * lower column; a NaN never wins, except in column 0 where it always does:
 * the CPU's strict comparison from x[0] gives the same.
 *
 * At the kernel's end, after a barrier, thread 0 of each block holding warps
 * of the result (blocks first to last) merges the block's keys into the
 * launch's (best, in the device scratch) and counts itself in. Each but the
 * last of those blocks then leaves without waiting for a return (a release
 * reduction); the last polls the count until every other is in, then writes
 * each row's column and clears the keys and the count for the next launch.
 * (The other blocks are all resident or done by then: only one block waits.)
 * (Faster than every block waiting for its count's return: doc/performance.md.)
 */
static __device__ __forceinline__ unsigned long long mk_argmax_key(float v, unsigned int col) {
    const float x = __fadd_rn(v, 0.0f);
    const unsigned int bits = __float_as_uint(x);
    const unsigned int ord = x != x ? (col == 0 ? 0xffffffffu : 0u)
                           : (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return ((unsigned long long)ord << 32) | (0xffffffffu - col);
}

/* Thread 0 of block blockIdx.x in [first, last]: the block's keys (sbest, a
 * row each of rows) into the launch's (best; its count follows the keys),
 * and, in the last, each row's column into dst. */
static __device__ __forceinline__ void mk_argmax_finish(unsigned long long *best, int rows,
                                                        const unsigned long long *sbest,
                                                        unsigned int first, unsigned int last,
                                                        long long *dst) {
    unsigned int *done = (unsigned int *)(best + rows);
    for (int m = 0; m < rows; m++) atomicMax(&best[m], sbest[m]);
    if (blockIdx.x != last) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(done) : "memory");
    } else {
        unsigned int n;
        do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(n) : "l"(done) : "memory");
        while (n != last - first);
        for (int m = 0; m < rows; m++)
            dst[m] = (long long)(0xffffffffu - (unsigned int)(atomicExch(&best[m], 0ull) & 0xffffffffull));
        atomicExch(done, 0u);
    }
}
