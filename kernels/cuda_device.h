/*
 * cuda_device.h — what the CUDA device's files share: the per-model state
 * (stream, cuBLAS handle, error word, staging, the captured graph), the fault
 * record kernels write when a run-time value is out of range, and the TRY
 * macros that turn every CUDA/cuBLAS status into an mk_error.
 *
 * Files: cuda_device.cu (device table, graph capture, staging, faults),
 * pointwise.cu, matmul.cu, norm_softmax.cu, gather.cu (one per op family);
 * cudnn_fuser.cu (fused groups) reads the stream from the same state.
 */
#ifndef MK_CUDA_DEVICE_H
#define MK_CUDA_DEVICE_H

extern "C" {
#include "internal.h"
}

#include <cublas_v2.h>
#include <cuda_runtime.h>

/*
 * The device-side error word. A kernel that meets an out-of-range run-time
 * value (slice bounds, prefix, an id) skips the write and claims `flag` with
 * atomicCAS; only the claimer fills the rest. Launches run in stream order, so
 * the first faulting launch is the one reported. The captured graph clears
 * the record at the start of every evaluation.
 */
typedef struct {
    unsigned int flag;   /* 0: no fault; 1: the fields below are being / were written */
    int launch;          /* index of the faulting launch */
    int reason;          /* MK_CUDA_FAULT_* */
    int pad;
    long long value[3];  /* reason-specific values */
} mk_cuda_fault;

enum {
    MK_CUDA_FAULT_REPLACE_RANGE = 1, /* begin, end, rows */
    MK_CUDA_FAULT_REPLACE_ROWS,      /* begin, end, replacement rows */
    MK_CUDA_FAULT_PREFIX,            /* prefix, n */
    MK_CUDA_FAULT_ID,                /* id, position, V */
};

/* Records a fault unless an earlier one already holds the word. */
static __device__ __forceinline__ void mk_cuda_fault_raise(mk_cuda_fault *f, int launch,
                                                           int reason, long long v0,
                                                           long long v1, long long v2) {
    if (atomicCAS(&f->flag, 0u, 1u) == 0u) {
        f->launch = launch;
        f->reason = reason;
        f->value[0] = v0;
        f->value[1] = v1;
        f->value[2] = v2;
    }
}

/* Per-model state (mk_launch.dev points here). */
typedef struct mk_cuda_state {
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_workspace; /* cuBLAS's workspace, so capture never allocates */
    size_t blas_workspace_bytes;
    mk_cuda_fault *fault; /* device */

    /* pinned staging, one block: inputs, the output, the fault record */
    unsigned char *pinned;
    void **in_stage;       /* [n_in] pointers into `pinned` */
    int n_in;
    void *out_stage;
    mk_cuda_fault *fault_stage;

    cudaGraph_t graph;
    cudaGraphExec_t exec;

    /* device memory kernels asked for while capturing (freed at close) */
    void **extra;
    int n_extra, cap_extra;
} mk_cuda_state;

/* Stores an error for a CUDA status: MK_ERR_NOMEM for allocation failures,
 * else MK_ERR_DEVICE; names the call and where it was made. Returns -1. */
int mk_cuda_fail_status(mk_error **err, cudaError_t status, const char *what,
                        const char *file, int line);
int mk_cuda_fail_blas(mk_error **err, cublasStatus_t status, const char *what,
                      const char *file, int line);

/* Every CUDA call goes through one of these: on failure the error is stored and
 * control jumps to the function's `fail:` label. */
#define MK_CUDA_TRY(err, call)                                                  \
    do {                                                                        \
        cudaError_t mk_status_ = (call);                                        \
        if (mk_status_ != cudaSuccess) {                                        \
            mk_cuda_fail_status((err), mk_status_, #call, __FILE__, __LINE__);  \
            goto fail;                                                          \
        }                                                                       \
    } while (0)

#define MK_BLAS_TRY(err, call)                                                  \
    do {                                                                        \
        cublasStatus_t mk_status_ = (call);                                     \
        if (mk_status_ != CUBLAS_STATUS_SUCCESS) {                              \
            mk_cuda_fail_blas((err), mk_status_, #call, __FILE__, __LINE__);    \
            goto fail;                                                          \
        }                                                                       \
    } while (0)

/* After a <<<...>>> launch: the launch's own status (bad configuration, no
 * kernel image for this device), as an error naming the node. */
int mk_cuda_check_launch(const mk_launch *l, const char *kernel, mk_error **err);

/* Device memory a kernel needs beyond its operands, allocated while the graph
 * is being captured (capture mode relaxed for the call) and owned by the
 * model's state until close. NULL with an error on failure. */
void *mk_cuda_extra(mk_cuda_state *s, size_t bytes, mk_error **err);

static inline mk_cuda_state *mk_cuda_state_of(const mk_launch *l) {
    return (mk_cuda_state *)l->dev;
}

/* Threads per block for the elementwise and copy kernels. */
#define MK_CUDA_BLOCK 256

/* Blocks for n items at `per_block` each, within the grid's x limit. */
static inline unsigned int mk_cuda_blocks(long long n, long long per_block) {
    long long b = (n + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > 0x7fffffffLL) b = 0x7fffffffLL;
    return (unsigned int)b;
}

/*
 * Index arithmetic over a contiguous output of up to MK_MAX_RANK dims: the
 * element offset in an operand with other strides (0 where broadcast). Dims
 * of size 1 are dropped and neighbours merged where the operand is linear
 * across them, so the common cases cost one or two divisions.
 */
typedef struct {
    int rank; /* >= 1 */
    int64_t shape[MK_MAX_RANK];
    int64_t stride[MK_MAX_RANK];
} mk_cuda_walk;

static inline mk_cuda_walk mk_cuda_walk_make(int rank, const int64_t *shape,
                                             const int64_t *stride) {
    mk_cuda_walk w;
    w.rank = 0;
    for (int d = 0; d < rank; d++) {
        if (shape[d] == 1) continue;
        int r = w.rank;
        if (r > 0 && w.stride[r - 1] == stride[d] * shape[d]) {
            w.shape[r - 1] *= shape[d];
            w.stride[r - 1] = stride[d];
        } else {
            w.shape[r] = shape[d];
            w.stride[r] = stride[d];
            w.rank++;
        }
    }
    if (w.rank == 0) {
        w.rank = 1;
        w.shape[0] = 1;
        w.stride[0] = 0;
    }
    return w;
}

/* Is the walk a plain contiguous run (offset == index)? */
static inline bool mk_cuda_walk_linear(const mk_cuda_walk *w) {
    return w->rank == 1 && (w->stride[0] == 1 || w->shape[0] == 1);
}

static __device__ __forceinline__ long long mk_cuda_walk_offset(const mk_cuda_walk &w,
                                                                long long i) {
    long long off = 0;
#pragma unroll
    for (int d = MK_MAX_RANK - 1; d >= 0; d--) {
        if (d < w.rank) {
            long long q = i / w.shape[d];
            off += (i - q * w.shape[d]) * w.stride[d];
            i = q;
        }
    }
    return off;
}

#endif
