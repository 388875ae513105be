/*
 * cudnn_fuser.h — the cuDNN fuser's own types (kernels/cudnn_fuser.cu): the
 * per-context compile cache and the plans in it. The rest of moonkaas sees
 * only the plugin table's hooks (core/device.h's mk_cuda_plugin:
 * cudnn_compile_group, cudnn_group_release, cudnn_cache_free) and the
 * device's MK_KERNEL_CUDNN_GROUP kernel, mk_cuda_cudnn_group (declared in
 * cuda_device.h). Built only with CUDNN=1.
 *
 * Everything cuDNN goes through its backend C API (cudnnBackendCreateDescriptor,
 * SetAttribute, Finalize, Execute): tensors are 3-D ([B, M, K] @ [B, K, N] for
 * the matmul, 4-D for 4-D pointwise chains), float32 data with float32 compute.
 */
#ifndef MK_CUDNN_FUSER_H
#define MK_CUDNN_FUSER_H

#include "cuda_device.h"

#include <cudnn.h>

/* Unique ids of a group's tensors: inputs 1..n_in, the output, intermediates. */
#define MK_CUDNN_UID_IN 1
#define MK_CUDNN_UID_OUT 100
#define MK_CUDNN_UID_VIRTUAL 1000

/* Descriptors one plan keeps alive: tensors, ops, graph, engine config, plan. */
#define MK_CUDNN_MAX_KEEP (4 * MK_GROUP_MAX_OPS + MK_GROUP_MAX_INPUTS + 8)

/*
 * One entry of the cache: the plan compiled for a trace, or the reason cuDNN
 * rejected it (rejections are cached too: a repeated layer is asked once).
 */
typedef struct mk_cudnn_plan {
    struct mk_cudnn_plan *next;
    char *trace;
    bool rejected;
    char why[768];                 /* rejection reason, else engine/precision/time */
    cudnnBackendDescriptor_t plan; /* the finalized execution plan */
    cudnnBackendDescriptor_t keep[MK_CUDNN_MAX_KEEP];
    int n_keep;
    int n_uids;
    int64_t uids[MK_GROUP_MAX_INPUTS + 1]; /* inputs in order, then the output */
    size_t workspace_bytes;
    bool tf32;                     /* the engine runs on tensor cores (TF32 for float32) */
    struct mk_cudnn_cache *cache;
} mk_cudnn_plan;

/* Per context: one cuDNN handle (its stream is set per capture) and the plans. */
typedef struct mk_cudnn_cache {
    cudnnHandle_t handle;
    cudaStream_t trial;  /* where a new plan runs once on scratch memory before use */
    mk_cudnn_plan *plans;
    int n_plans;
} mk_cudnn_cache;

#endif
