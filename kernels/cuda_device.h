/*
 * cuda_device.h — what the CUDA device's files share: the per-model state
 * (stream, cuBLAS handle, error word, staging, the captured graph), the fault
 * record kernels write when a run-time value is out of range, and the TRY
 * macros that turn every CUDA/cuBLAS status into an mk_error.
 *
 * Files: cuda_device.cu (device table, graph capture, staging, faults, the
 * plugin's entry), pointwise.cu, matmul.cu, norm_softmax.cu, gather.cu,
 * sample.cu, reduce.cu (one per kernel family); cudnn_fuser.cu (fused groups, CUDNN=1
 * builds only) reads the stream from the same state; timeline.cu times the
 * generated launches inside the graph (MK_CUDA_TIMELINE).
 *
 * All of this is built into build/libmoonkaas_cuda.so, a plugin that the core
 * opens (core/plugin.c) the first time CUDA is asked for. The plugin carries
 * its own copies of core/error.c and core/tensor.c, hides every symbol but
 * mk_cuda_plugin_entry (kernels/plugin.map) and binds its own references to
 * itself (-Bsymbolic), so it never reaches into the process that loads it.
 */
#ifndef MK_CUDA_DEVICE_H
#define MK_CUDA_DEVICE_H

/* what the generators (core/codegen/) and the kernels share: the pointwise
 * block, mk_cuda_blocks, mk_aligned16, mk_cuda_walk1, the timeline's layout */
extern "C" {
#include "codegen/codegen.h"
}

#include <cublas_v2.h>
#include <cuda_runtime.h>

/* The device code the generated kernels share with these (kernels/skeletons/,
 * which the generators paste into their sources, comments stripped): PDL's
 * MK_PDL_START and MK_PDL_WAIT, the fault record mk_fault_rec and mk_raise,
 * and the timeline's stamps mk_stamps. Included here once, for every file. */
#include "skeletons/pdl.cuh"
#include "skeletons/fault.cuh"
#include "skeletons/timeline.cuh"

/* Copies the graph makes as one kernel (mk_cuda_stage_launch), at most
 * MK_STAGE_COPIES of them. */
#define MK_STAGE_COPIES 8
typedef struct {
    int n;
    unsigned char *dst[MK_STAGE_COPIES];
    const unsigned char *src[MK_STAGE_COPIES]; /* NULL: fill with zeros */
    unsigned long long bytes[MK_STAGE_COPIES];
    /* where set (the graph's last copies): once every block's copies are out,
     * the last block adds one to counts[1] and writes it to *done, a word the
     * host reads (mapped); counts[0] counts the blocks (device, zeroed) */
    unsigned *done;
    unsigned *counts;
} mk_stage_copies;

/* A step loop's control word (steps.cu), in device memory and, staged, pinned. */
typedef struct {
    long long n;          /* the steps this graph launch may run */
    long long step;       /* the steps it has run */
    long long stop, stop_output, stop_value; /* stop: whether a value ends the steps */
} mk_step_ctl;

/* Per-model state (mk_launch.dev points here). */
typedef struct mk_cuda_state {
    int device;
    /* The compute capability (major * 10 + minor) every capability-dependent
     * path is chosen from: the GPU's, or an older one MK_CUDA_ARCH forces
     * when the device opens (doc/devices.md): generated kernels are then
     * compiled to PTX for compute_<arch>, without PDL or clusters. */
    int arch;
    bool arch_forced;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_workspace; /* cuBLAS's workspace, so capture never allocates */
    size_t blas_workspace_bytes;
    mk_fault_rec *fault; /* device */

    /* pinned staging, one block: inputs, outputs, the fault record */
    unsigned char *pinned;
    unsigned char *pinned_dev; /* the same block as the device addresses it (mapped) */
    bool stage_kernels;        /* the graph's copies are mk_stage_kernel nodes */
    void **in_stage;       /* [n_in] pointers into `pinned` */
    int n_in;
    void **out_stage;      /* [n_out] pointers into `pinned` */
    int n_out;
    mk_fault_rec *fault_stage;
    /* with stage kernels, evaluate waits for the graph by spinning on this
     * pinned word (the last stage kernel writes the evaluation's number),
     * not by a stream sync: about a microsecond sooner */
    unsigned *done_stage;
    unsigned *done_counts;  /* device: mk_stage_copies.counts */
    unsigned evaluations;   /* graph launches so far */

    cudaGraph_t graph;
    cudaGraphExec_t exec;

    /* the step loop (steps.cu): a graph whose WHILE node runs the launches and a
     * step kernel until the steps are done; NULL where the model has no next
     * lines or the loop could not be made (loop_why says why) */
    cudaGraph_t loop_graph;
    cudaGraphExec_t loop_exec;
    mk_step_ctl *ctl;            /* device */
    mk_step_ctl *ctl_stage;      /* pinned, mapped */
    unsigned char *ring;         /* pinned, mapped: ring_steps steps of every output */
    unsigned char *ring_out[MK_MAX_OUTPUTS]; /* output o's steps in the ring */
    unsigned char *snap;         /* device: each fed output's value at a step's end */
    long long ring_steps;
    char loop_why[160];

    /* [n launches] a pointwise group's generated kernel (a cudaKernel_t, kept
     * for the process by generated.cu), else NULL; NULL without groups */
    void **generated;
    bool pdl; /* generated kernels launch with programmatic dependent launch */
    /* the cuDNN groups whose plans prepare compiled (released at close: the
     * model frees the groups after closing its device) */
    mk_fused_group **cudnn;
    int n_cudnn, cap_cudnn;
    struct mk_cuda_timeline *timeline; /* MK_CUDA_TIMELINE's, else NULL */
    struct mk_cuda_convs *conv; /* conv.cu: the convolutions' cuDNN plans, else NULL */
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

/* A launch's configuration: grid, block, stream, and programmatic dependent
 * launch (the kernel may start before the launch before it ends, and waits for
 * it with griddepcontrol.wait) where pdl is true (mk_cuda_state.pdl: sm_90+,
 * MK_PDL not 0). attr holds the attribute the configuration points to. */
cudaLaunchConfig_t mk_cuda_launch_config(dim3 grid, dim3 block, cudaStream_t stream, bool pdl,
                                         cudaLaunchAttribute *attr);

/* cuda_device.cu: captures c as one kernel node on the stream (false if the
 * launch failed), and every launch's kernels (-1, or the index of the launch
 * that failed, *err set); after_ours: a kernel of ours comes right before
 * them (a library's launch then waits for it to end: see the function). */
/* pdl: with programmatic dependent launch (sm_90+: mk_cuda_state.pdl) */
bool mk_cuda_stage_launch(const mk_stage_copies *c, cudaStream_t stream, bool pdl);
int mk_cuda_capture_launches(const mk_launch *launches, int n, bool after_ours, mk_error **err);
/* cuBLAS's recommended workspace on Hopper; set once so capture never allocates. */
#define MK_BLAS_WORKSPACE (32u << 20)
/* cuBLAS runs the matrix products alone (matmul.cu): its handle and workspace
 * are the model's, made only where one of its nodes is such a product. */
static inline bool mk_cuda_uses_blas(const mk_node *n) { return n->op->kernel == MK_KERNEL_MATMUL; }
/* matmul.cu: the scratch a product with bfloat16 weights takes on tensor cores
 * (A's rows in two bfloat16 parts, then both parts' products), 0 for any other
 * product; the op's own scratch (mk_matmul_scratch's widened weights) counts
 * towards it. */
size_t mk_cuda_split_bytes(const mk_node *n);

/* cuda_graph.cu: mk_device_ops.prepare (the pinned block, cuDNN plans, the
 * cuBLAS handle, generated kernels, then the graph captured and instantiated)
 * and evaluate (one replay); the fault record as the error the CPU device
 * gives for the same value (mk_fault). */
int mk_cuda_prepare(void *state, const mk_launch *launches, int n, const mk_copy *in, int n_in,
                    const mk_copy *out, int n_out, const mk_step_rule *rules, int n_rules,
                    const mk_host *host, mk_error **err);
int mk_cuda_evaluate(void *state, const mk_launch *launches, int n, const mk_copy *in, int n_in,
                     const mk_copy *out, int n_out, const mk_host *host, mk_error **err);
int mk_cuda_fault_error(const mk_fault_rec *f, const mk_launch *launches, int n,
                        mk_error **err);

/* steps.cu: the step loop of a model with next lines (prepare: made where the
 * driver takes conditional nodes, else loop_why says why and the steps run as
 * evaluations), and mk_model_run_steps on it. */
int mk_cuda_prepare_steps(mk_cuda_state *s, const mk_launch *launches, int n, const mk_copy *in,
                          int n_in, const mk_copy *out, int n_out, const mk_step_rule *rules,
                          int n_rules, mk_error **err);
int64_t mk_cuda_run_steps(void *state, const mk_launch *launches, int n, const mk_copy *in,
                          int n_in, const mk_copy *out, int n_out, int64_t steps,
                          const mk_stop *stop, const mk_host *host, mk_error **err);
void mk_cuda_close_steps(mk_cuda_state *s);

static inline mk_cuda_state *mk_cuda_state_of(const mk_launch *l) {
    return (mk_cuda_state *)l->dev;
}

/* Pointwise groups (core/group.c) run generated kernels (generated.cu): as
 * many operands as a program reads. */
#define MK_CUDA_POINTWISE_OPERANDS MK_X_IN

/*
 * The strided walk on the device. mk_walk (core/tensor.c) drops size-1 dims
 * and merges neighbours once on the host; the kernels then turn an element
 * index of the contiguous result into each operand's element offset, with one
 * division per remaining dim (the common cases: none or one or two).
 */

/* Is operand k a plain contiguous run (offset == index)? */
static inline bool mk_cuda_walk_linear(const mk_walk *w, int k) {
    return w->rank == 1 && (w->stride[k][0] == 1 || w->shape[0] == 1);
}

/* Offsets of operands 0 .. N-1 of the walk at element i < the walk's numel
 * (the divisions are shared; the outermost dim needs none). */
template <int N>
static __device__ __forceinline__ void mk_cuda_walk_offsets(const mk_walk &w, long long i,
                                                            long long *off) {
#pragma unroll
    for (int k = 0; k < N; k++) off[k] = 0;
#pragma unroll
    for (int d = MK_MAX_RANK - 1; d >= 1; d--) {
        if (d < w.rank) {
            long long q = i / w.shape[d], r = i - q * w.shape[d];
#pragma unroll
            for (int k = 0; k < N; k++) off[k] += r * w.stride[k][d];
            i = q;
        }
    }
#pragma unroll
    for (int k = 0; k < N; k++) off[k] += i * w.stride[k][0];
}

/* The offset of operand 0 at element i. */
static __device__ __forceinline__ long long mk_cuda_walk_offset(const mk_walk &w, long long i) {
    long long off;
    mk_cuda_walk_offsets<1>(w, i, &off);
    return off;
}

/* ---- the plugin's kernels (one file per family) and its table -------------- */

int mk_cuda_pointwise(const mk_launch *l, mk_error **err);      /* pointwise.cu */
/* conv.cu: convolutions (cuDNN), pooling and upsampling. mk_cuda_conv_plan plans
 * every convolution launch before the capture (a device error where cuDNN has
 * no engine for one, or the build has no cuDNN); mk_cuda_conv_close frees them. */
int mk_cuda_conv_plan(mk_cuda_state *s, const mk_launch *launches, int n, const mk_host *host,
                      mk_error **err);
void mk_cuda_conv_close(mk_cuda_state *s);
int mk_cuda_conv(const mk_launch *l, mk_error **err);
int mk_cuda_max_pool(const mk_launch *l, mk_error **err);
int mk_cuda_avg_pool(const mk_launch *l, mk_error **err);
int mk_cuda_adaptive_avg_pool(const mk_launch *l, mk_error **err);
int mk_cuda_upsample_nearest(const mk_launch *l, mk_error **err);
/* generated.cu: compiles (NVRTC) the kernel that core/codegen/ writes for
 * every group (pointwise or matrix–vector) among the launches, into
 * s->generated, before the capture; then runs one. */
/*
 * Programmatic dependent launch (sm_90 and later): every generated kernel
 * lets the next launch be scheduled as soon as its own blocks have started
 * (launch_dependents), and waits for the launches before it to finish before
 * it reads what they wrote (wait). A matrix–vector warp first asks L2 for its
 * weight columns, which no launch writes, so they stream in while the kernel
 * before it finishes. Launched with the attribute only where the device has
 * them (mk_cuda_launch_generated); elsewhere the instructions are left out.
 *
 * The wait is cheap, and cheaper than a count in global memory polled by
 * the next launch (doc/performance.md, "The PDL wait").
 *
 * In a kernel launched so, generated or not: MK_PDL_START and MK_PDL_WAIT
 * (skeletons/pdl.cuh); in a generated product kernel MK_GROUP_START and
 * MK_GROUP_WAIT, which add the timeline's stamps (skeletons/timeline.cuh).
 */

/*
 * The in-graph timeline (timeline.cu), for people measuring where a step's
 * time goes: with MK_CUDA_TIMELINE=FILE set when a model is compiled, its
 * generated product kernels (matrix-vector and attention groups) are
 * compiled with MK_TIMELINE defined, and MK_TIMELINE_OCCUPANCY as the blocks
 * an SM of their unstamped build (mk_codegen_put_head). Each of a launch's first
 * MK_TIMELINE_BLOCKS blocks then writes three globaltimer stamps (ns, 64-bit
 * words) after the fault record, from byte MK_TIMELINE_AT on: launch l's
 * block b from word 3 * (l * MK_TIMELINE_BLOCKS + b): its start, the end of
 * its wait for the launches before, and its last warp's end (atomicMax).
 * The sampler (sample.cu) stamps its blocks alike (the same mk_stamps), given
 * the address of its launch's first stamp (mk_cuda_timeline_stamps). After every evaluation
 * the host folds them into per-launch means and clears them; when the model
 * is freed it appends the table to FILE. Other launches (cuBLAS, gathers,
 * pointwise groups) are not stamped.
 */
/* MK_TIMELINE_AT and MK_TIMELINE_BLOCKS: core/codegen/codegen.h */
struct mk_cuda_timeline;
/* timeline.cu: opens the timeline of s's n launches (allocating the fault
 * record anew with the stamps' room after it: before capture), folds in the
 * last evaluation's stamps, and writes and frees it at close. */
int mk_cuda_timeline_open(mk_cuda_state *s, const mk_launch *launches, int n, const char *path,
                          mk_error **err);
void mk_cuda_timeline_take(mk_cuda_state *s);
void mk_cuda_timeline_close(mk_cuda_state *s);
/* timeline.cu: where launch's blocks write their stamps on the device (block
 * b from word 3 b), or NULL where the launch is not stamped. */
unsigned long long *mk_cuda_timeline_stamps(const mk_cuda_state *s, int launch);
/* sample.cu: the blocks of a SampleNode launch, and its line in the timeline
 * (malloc'd, or NULL). */
unsigned int mk_cuda_sample_blocks(const mk_launch *l);
char *mk_cuda_sample_label(const mk_launch *l);
/* MK_CUDA_TIMELINE's file, or NULL where it is not set */
const char *mk_cuda_timeline_file(void);

int mk_cuda_generate(mk_cuda_state *s, const mk_launch *launches, int n, const mk_host *host,
                     mk_error **err);
int mk_cuda_pointwise_generated(const mk_launch *l, mk_error **err);
int mk_cuda_product(const mk_launch *l, mk_error **err);
int mk_cuda_rows_group(const mk_launch *l, mk_error **err); /* a row group (codegen/rows.c) */
int mk_cuda_prefix_matmul(const mk_launch *l, mk_error **err); /* matmul.cu */
int mk_cuda_cast(const mk_launch *l, mk_error **err);          /* convert.cu */
int mk_cuda_dequantize(const mk_launch *l, mk_error **err);
int mk_cuda_fake_quantize(const mk_launch *l, mk_error **err);
/* b (float16 or bfloat16) widened to float32, dense, into l's scratch: *wide. */
int mk_cuda_widen(const mk_launch *l, const mk_tensor *b, mk_tensor *wide, mk_error **err);
int mk_cuda_generate_check(const mk_launch *l, int arch, mk_error **err);
int mk_cuda_permute(const mk_launch *l, mk_error **err);        /* pointwise.cu */
int mk_cuda_complex_mul(const mk_launch *l, mk_error **err);    /* pointwise.cu */
int mk_cuda_matmul(const mk_launch *l, mk_error **err);         /* matmul.cu */
int mk_cuda_rms_norm(const mk_launch *l, mk_error **err);       /* norm_softmax.cu */
int mk_cuda_sliced_softmax(const mk_launch *l, mk_error **err); /* norm_softmax.cu */
int mk_cuda_causal_softmax(const mk_launch *l, mk_error **err); /* norm_softmax.cu */
int mk_cuda_argmax(const mk_launch *l, mk_error **err);         /* norm_softmax.cu */
int mk_cuda_sample(const mk_launch *l, mk_error **err);         /* sample.cu */
int mk_cuda_embedding(const mk_launch *l, mk_error **err);      /* gather.cu */
int mk_cuda_replace_slice(const mk_launch *l, mk_error **err);  /* gather.cu */
int mk_cuda_index_map(const mk_launch *l, mk_error **err);      /* move.cu: tile, repeat, pad, flip */
int mk_cuda_concat(const mk_launch *l, mk_error **err);         /* move.cu */
int mk_cuda_gather_elements(const mk_launch *l, mk_error **err); /* move.cu */
int mk_cuda_index_select(const mk_launch *l, mk_error **err);   /* move.cu */
int mk_cuda_cumsum(const mk_launch *l, mk_error **err);         /* move.cu */
int mk_cuda_replace_at(const mk_launch *l, mk_error **err);     /* gather.cu */
/* reductions and norms over any axes (reduce.cu) */
int mk_cuda_reduce_sum(const mk_launch *l, mk_error **err);
int mk_cuda_reduce_mean(const mk_launch *l, mk_error **err);
int mk_cuda_reduce_max(const mk_launch *l, mk_error **err);
int mk_cuda_reduce_min(const mk_launch *l, mk_error **err);
int mk_cuda_reduce_prod(const mk_launch *l, mk_error **err);
int mk_cuda_reduce_var(const mk_launch *l, mk_error **err);
int mk_cuda_argmax_axis(const mk_launch *l, mk_error **err);
int mk_cuda_argmin_axis(const mk_launch *l, mk_error **err);
int mk_cuda_softmax(const mk_launch *l, mk_error **err);
int mk_cuda_log_softmax(const mk_launch *l, mk_error **err);
int mk_cuda_layer_norm(const mk_launch *l, mk_error **err);
int mk_cuda_group_norm(const mk_launch *l, mk_error **err);
int mk_cuda_batch_norm(const mk_launch *l, mk_error **err);
int mk_cuda_rms_norm_eps(const mk_launch *l, mk_error **err);

/* A trial run of a new cuDNN plan on scratch memory is skipped above this
 * many bytes of operands (and under max_bytes: prepare_cudnn). */
#define MK_CUDNN_TRIAL_LIMIT ((size_t)1 << 31)

#ifdef MK_WITH_CUDNN
/* cudnn_fuser.cu (left out of CUDNN=0 builds): the context's cache of plans
 * (freed through the plugin table); prepare's compile of g's plan: 0 fused
 * (g->plan, workspace_bytes, cache_hit, tf32 set), 1 cuDNN refuses the group
 * (the reason in `why`), -1 a hard error; the release of its variant pack and
 * plan reference; the group's kernel. */
void mk_cudnn_cache_free(struct mk_cudnn_cache *c);
int mk_cudnn_compile_group(struct mk_cudnn_cache **cache, mk_fused_group *g, char *why,
                           size_t why_size, mk_error **err);
void mk_cudnn_group_release(mk_fused_group *g);
int mk_cuda_cudnn_group(const mk_launch *l, mk_error **err);
#endif

#endif
