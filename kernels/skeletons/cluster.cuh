/* cluster.cuh: distributed shared memory and the cluster barrier's two halves
 * (the attention's cluster combine): the address of p in block rank's memory */
#ifdef MK_CLUSTER
static __device__ __forceinline__ float *mk_dsmem(float *p, unsigned int rank) {
    float *r;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(p), "r"(rank));
    return r;
}
static __device__ __forceinline__ void mk_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
static __device__ __forceinline__ void mk_cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
#endif
