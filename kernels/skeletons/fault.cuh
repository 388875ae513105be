/* fault.cuh: the fault record a product kernel raises, which the host reads
 * after the evaluation (mk_cuda_fault); where MK_TIMELINE is defined, the
 * stamps of MK_CUDA_TIMELINE (the generator defines MK_TIMELINE_BLOCKS and
 * MK_TIMELINE_AT before it, as cuda_device.h has them); and the kernel's start
 * and wait (after pdl.cuh) */
struct mk_fault_rec { unsigned int flag; int launch; int kind; int which; long long value[3]; };
static __device__ void mk_raise(mk_fault_rec *f, int launch, int which, int kind,
                                long long v0, long long v1, long long v2) {
    if (atomicCAS(&f->flag, 0u, 1u) == 0u) {
        f->launch = launch; f->kind = kind; f->which = which;
        f->value[0] = v0; f->value[1] = v1; f->value[2] = v2;
    }
}
#ifdef MK_TIMELINE /* MK_CUDA_TIMELINE: the block's start, wait and end */
struct mk_timeline {
    unsigned long long *t;
    static __device__ unsigned long long now() {
        unsigned long long v;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
        return v;
    }
    __device__ mk_timeline(mk_fault_rec *f, int launch)
        : t(blockIdx.x < MK_TIMELINE_BLOCKS ? (unsigned long long *)((char *)f + MK_TIMELINE_AT) +
                                                 3 * ((long long)launch * MK_TIMELINE_BLOCKS + blockIdx.x) : 0) {
        if (t && threadIdx.x == 0) t[0] = now();
    }
    __device__ void waited() { if (t && threadIdx.x == 0) t[1] = now(); }
    __device__ ~mk_timeline() { /* each warp's lanes as they leave together */
        if (t && (threadIdx.x & 31) == __ffs(__activemask()) - 1) atomicMax(t + 2, now());
    }
};
#define MK_TIMELINE_ENTER mk_timeline mk_tl(fault, launch)
#define MK_TIMELINE_WAITED mk_tl.waited()
#else
#define MK_TIMELINE_ENTER
#define MK_TIMELINE_WAITED
#endif
/* a product kernel's start and wait: PDL's (pdl.cuh) and the stamps */
#define MK_GROUP_START MK_PDL_START; MK_TIMELINE_ENTER
#define MK_GROUP_WAIT MK_PDL_WAIT; MK_TIMELINE_WAITED
