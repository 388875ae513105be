/*
 * fault.cuh: the device-side error word, one for every kernel of the CUDA
 * device: the generated ones (the generators paste this file, comments
 * stripped: embed.sh) and the plugin's own (cuda_device.h includes it).
 *
 * A kernel that meets an out-of-range run-time value (slice bounds, prefix,
 * an id) skips the write and claims `flag` with atomicCAS; only the claimer
 * fills the rest. Launches run in stream order, so the first faulting launch
 * is the one reported. The captured graph clears the record at the start of
 * every evaluation; evaluate turns it into the error mk_fault (core/tensor.c)
 * words for every device (mk_cuda_fault_error). The timeline's stamps follow
 * it in the same allocation (timeline.cuh).
 */
struct mk_fault_rec {
    unsigned int flag; /* 0: no fault; 1: the fields below are being / were written */
    int launch;        /* index of the faulting launch */
    int kind;          /* mk_fault_kind (core/device.h) */
    int which;         /* in a group (core/product.c), the member that faulted, + 1; else 0 */
    long long value[3]; /* the kind's values, as mk_fault takes them */
};
/* Records a fault unless an earlier one already holds the word. */
static __device__ __forceinline__ void mk_raise(mk_fault_rec *f, int launch, int which, int kind,
                                                long long v0, long long v1, long long v2) {
    if (atomicCAS(&f->flag, 0u, 1u) == 0u) {
        f->launch = launch; f->kind = kind; f->which = which;
        f->value[0] = v0; f->value[1] = v1; f->value[2] = v2;
    }
}
