/*
 * cluster.cuh: distributed shared memory and the cluster barrier's two
 * halves, where MK_CLUSTER is defined (a program whose blocks run as
 * clusters, sm_90+): the attention's cluster combine (pasted by the
 * generator) and the sampler (sample.cu includes it).
 *
 * mk_dsmem: the address of p in block rank's shared memory.
 * mk_cluster_arrive: the block's stores are released to the cluster;
 * mk_cluster_arrive_relaxed: no order (the sampler's first arrival, that
 * says only "this block runs"); mk_cluster_wait: every block has arrived,
 * their released stores acquired.
 */
#ifdef MK_CLUSTER
static __device__ __forceinline__ float *mk_dsmem(float *p, unsigned int rank) {
    float *r;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(r) : "l"(p), "r"(rank));
    return r;
}
static __device__ __forceinline__ void mk_cluster_arrive() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
static __device__ __forceinline__ void mk_cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
static __device__ __forceinline__ void mk_cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
#endif
