/*
 * arrive.cuh: how the last of a launch's blocks to finish a shared result
 * knows it is the last: after a barrier (the block's stores to the result are
 * done, at the block's scope), its thread 0 counts the block in with one
 * atomic that is a release and an acquire at the GPU's scope; the thread that
 * reads the full count has then seen every block's stores, and a barrier
 * passes that on to its block (the pattern of CUTLASS's semaphores). It
 * replaces a fence of every thread before the count and after it
 * (__threadfence, fence.sc), which was slower (doc/performance.md).
 */
static __device__ __forceinline__ unsigned int mk_arrive(unsigned int *count) {
    unsigned int before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(count) : "memory");
    return before;
}
