/*
 * timeline.cuh: MK_CUDA_TIMELINE's stamps of one block (cuda_device.h says
 * what the timeline is), for the generated kernels (pasted after fault.cuh
 * and pdl.cuh, the generator defining MK_TIMELINE_BLOCKS and MK_TIMELINE_AT
 * as core/codegen/codegen.h has them) and the plugin's sampler (sample.cu,
 * through cuda_device.h).
 *
 * mk_stamps st(t): t, the block's three words or NULL for none, gets its
 * start at once, its wait's end at st.waited() and, as each warp leaves (the
 * destructor), the latest of the warps' ends.
 */
struct mk_stamps {
    unsigned long long *t;
    static __device__ __forceinline__ unsigned long long now() {
        unsigned long long v;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
        return v;
    }
    __device__ mk_stamps(unsigned long long *t) : t(t) {
        if (t && threadIdx.x == 0) t[0] = now();
    }
    __device__ void waited() { if (t && threadIdx.x == 0) t[1] = now(); }
    __device__ ~mk_stamps() { /* each warp's lanes as they leave together */
        if (t && (threadIdx.x & 31) == __ffs(__activemask()) - 1) atomicMax(t + 2, now());
    }
};
#ifdef MK_TIMELINE /* a generated kernel built for the timeline (mk_codegen_source's stamp) */
/* Block blockIdx.x of launch's stamps, after the fault record f (cuda_device.h's
 * layout); NULL past the first MK_TIMELINE_BLOCKS blocks. */
static __device__ __forceinline__ unsigned long long *mk_stamps_at(mk_fault_rec *f, int launch) {
    return blockIdx.x < MK_TIMELINE_BLOCKS ? (unsigned long long *)((char *)f + MK_TIMELINE_AT) +
                                                 3 * ((long long)launch * MK_TIMELINE_BLOCKS + blockIdx.x) : 0;
}
#define MK_TIMELINE_ENTER mk_stamps mk_tl(mk_stamps_at(fault, launch))
#define MK_TIMELINE_WAITED mk_tl.waited()
#else
#define MK_TIMELINE_ENTER
#define MK_TIMELINE_WAITED
#endif
/* a generated product kernel's start and wait: PDL's (pdl.cuh) and the stamps */
#define MK_GROUP_START MK_PDL_START; MK_TIMELINE_ENTER
#define MK_GROUP_WAIT MK_PDL_WAIT; MK_TIMELINE_WAITED
