/*
 * internal.h — what the compiler's stages share: errors, the graph, the op
 * table's row type, tensors as kernels see them, and the device table.
 *
 * Stages, in order (one file each):
 *   script.c   text → graph (parse, shape/dtype rules from ops.c), graph → text
 *   passes.c   ordered passes over the graph (storage and views, cuDNN fusion, verify)
 *   fusion.c   the cuDNN fusion pass: which groups, and their structural traces
 *   planner.c  offsets in one arena (best fit, neighbour merging)
 *   model.c    compile (plan, allocate, bind launches) and evaluate
 *   cpu.c      the CPU device: kernels and device table
 *   kernels/   the CUDA device (cuda_device.cu) and its kernels; cuDNN in cudnn_fuser.cu
 * Shared by all: ops.c (the op table), tensor.c (shapes, strides), error.c
 * (errors as values, the string builder, clocks).
 */
#ifndef MK_INTERNAL_H
#define MK_INTERNAL_H

#include "moonkaas.h"

#include <stdarg.h>

#define MK_MAX_INPUTS 4
#define MK_ALIGN 256

/* ---- errors ------------------------------------------------------------- */

struct mk_error {
    mk_error_code code;
    int line, column; /* 1-based; 0 when not about the script */
    char message[];   /* the whole message, prefixes included */
};

/*
 * Stores a new error in *err (when err is not NULL and *err is still empty) and
 * returns -1, so callers write `return mk_fail(err, ...)`. The message gets the
 * kind prefix of `code` ("shape error: ") and, when line > 0, "script:L:C: ".
 */
int mk_fail(mk_error **err, mk_error_code code, int line, int column, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int mk_failv(mk_error **err, mk_error_code code, int line, int column, const char *fmt,
             va_list ap);
/* A broken invariant: MK_ERR_INTERNAL naming file:line. */
#define MK_INTERNAL(err, what) \
    mk_fail((err), MK_ERR_INTERNAL, 0, 0, "%s:%d: %s", __FILE__, __LINE__, (what))

double mk_now_ms(void);

/* A growing string for printers (script, fusion traces and reports). On out of
 * memory `failed` is set and later puts do nothing; the owner frees `s`. */
typedef struct {
    char *s;
    size_t len, cap;
    bool failed;
} mk_strbuf;
void mk_strbuf_put(mk_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mk_strbuf_putv(mk_strbuf *b, const char *fmt, va_list ap);

/* ---- graph -------------------------------------------------------------- */

typedef struct mk_op mk_op;
typedef struct mk_node mk_node;

typedef enum {
    MK_STORAGE_ARENA,    /* output (or input slot) placed by the planner */
    MK_STORAGE_CONSTANT, /* its own allocation, filled at compile */
    MK_STORAGE_BUFFER,   /* its own allocation, zero at compile, persistent */
    MK_STORAGE_VIEW,     /* no memory: uses `owner`'s at `view_offset` */
} mk_storage;

struct mk_node {
    int id;           /* the $N of the script */
    int index;        /* position in the graph's evaluation order */
    const mk_op *op;
    int line, column; /* where the statement starts */

    int n_in;
    mk_node *in[MK_MAX_INPUTS];

    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];

    /* attributes, as the script gives them */
    char *name;                   /* InputTensor/ConstantTensor name, else NULL */
    int n_attr;
    int64_t attr[MK_MAX_RANK];    /* SliceNode: begin, end; Reshape: shape; Permute: perm */

    /* decided by passes and the planner */
    int n_consumers;
    mk_storage storage;
    mk_node *owner;            /* the node whose memory holds this one (itself if it owns) */
    int64_t view_offset;       /* bytes from the owner's start */
    int64_t stride[MK_MAX_RANK]; /* in elements */
    int last_use;              /* index of the last node reading this owner's memory */
    size_t scratch_bytes;
    int64_t offset;            /* arena offset (owners in the arena), else -1 */

    struct mk_fused_group *group; /* CudnnGroupNode: what it computes (fusion.c), else NULL */
};

typedef struct {
    int n_nodes, cap;
    mk_node **nodes; /* evaluation order = script order */
    mk_node *output;
    struct mk_fusion *fusion; /* set by model.c when opts->use_cudnn, for the fusion pass */
} mk_graph;

/* script.c */
mk_graph *mk_graph_parse(const char *script, mk_error **err);
char *mk_graph_print(const mk_graph *g); /* NULL only when out of memory */
void mk_graph_free(mk_graph *g);

/* helpers used by script.c, ops.c, passes */
int64_t mk_node_numel(const mk_node *n);
size_t mk_node_bytes(const mk_node *n);
void mk_contiguous_strides(int rank, const int64_t *shape, int64_t *stride);
/* "[2, 3, 4]" into buf */
const char *mk_shape_str(int rank, const int64_t *shape, char *buf, size_t size);

/* passes.c: the ordered pass list, run between parsing and planning */
int mk_passes_run(mk_graph *g, const mk_compile_options *opts, mk_error **err);

/* ---- tensors as kernels see them ---------------------------------------- */

typedef struct {
    void *data; /* address of element [0, ..., 0] on the model's device */
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    int64_t stride[MK_MAX_RANK]; /* elements; 0 where broadcast */
} mk_tensor;

/* `b` with stride 0 on its dims of size 1 where `like` is larger (the right
 * operand of SumNode, HadamardProductNode, ComplexHadamardProductNode). */
mk_tensor mk_tensor_broadcast(const mk_tensor *b, const mk_tensor *like);
int64_t mk_tensor_numel(const mk_tensor *t);
bool mk_tensor_is_contiguous(const mk_tensor *t);

/* One kernel call, bound once at compile time to fixed device addresses. */
typedef struct mk_launch {
    const mk_node *node;
    int index;                 /* position in the launch list */
    int n_in;
    mk_tensor out;
    mk_tensor in[MK_MAX_INPUTS];
    void *scratch;             /* scratch_bytes of arena, or NULL */
    size_t scratch_bytes;
    void *dev;                 /* the device's per-model state (stream, handles) */
} mk_launch;

typedef int (*mk_kernel_fn)(const mk_launch *l, mk_error **err);

/* ---- the op table (ops.c) ----------------------------------------------- */

enum {
    MK_OPF_LEAF = 1 << 0,      /* Input/Constant/Buffer: no kernel */
    MK_OPF_POINTWISE = 1 << 1, /* elementwise (fusable) */
    MK_OPF_VIEW = 1 << 2,      /* shares its input's memory (Reshape, Slice) */
    MK_OPF_INPLACE = 1 << 3,   /* writes into its first input and returns it */
    MK_OPF_MAYBE_VIEW = 1 << 4,/* a view where every consumer takes strides (Permute) */
    MK_OPF_STRIDED_IN = 1 << 5,/* accepts strided operands (MatMul) */
    MK_OPF_BROADCAST = 1 << 6, /* the right operand broadcasts where its dim is 1 */
};

#define MK_DEVICE_COUNT 2

struct mk_op {
    const char *name;  /* script name */
    const char *alias; /* another accepted script name (MulNode), or NULL */
    /*
     * Arguments, one letter each: n node, s identifier (a name), d dtype,
     * l integer list (a shape or permutation), i integer.
     */
    const char *signature;
    unsigned flags;
    /* Shape/dtype rule: fills n->dtype/rank/shape from inputs and attributes, or
     * fails with the node's line and column. */
    int (*infer)(mk_node *n, mk_error **err);
    /* Leaves: where the data live (arena slot, constant, persistent buffer). */
    mk_storage storage;
    /* Views and in-place ops: the strides (elements) and the byte offset into the
     * input's memory at which n's elements lie; NULL for ops that own memory. */
    int64_t (*layout)(const mk_node *n, int64_t *stride);
    /* Scratch bytes the kernel needs (NULL: none). */
    size_t (*scratch)(const mk_node *n);
    mk_kernel_fn kernel[MK_DEVICE_COUNT]; /* indexed by mk_device; NULL: not on that device */
};

const mk_op *mk_op_find(const char *name, size_t len);
extern const mk_op mk_ops[];
extern const int mk_op_count;

/* ---- devices ------------------------------------------------------------ */

/* A host↔device copy of one evaluation (an input in, the output out). */
typedef struct {
    void *device;  /* address in the model's device memory */
    void *host;
    size_t bytes;
} mk_copy;

typedef struct mk_device_ops {
    const char *name;
    /* Per-model state (streams, library handles); NULL state is fine for the CPU. */
    int (*open)(void **state, mk_error **err);
    void (*close)(void *state);
    /* Device memory, allocated at compile only. alloc fails with MK_ERR_NOMEM. */
    void *(*alloc)(void *state, size_t bytes, mk_error **err);
    void (*free)(void *state, void *p);
    int (*upload)(void *state, void *dst, const void *src, size_t bytes, mk_error **err);
    int (*zero)(void *state, void *dst, size_t bytes, mk_error **err);
    /* Called once after launches are bound (CUDA: pinned staging for the copies,
     * capture the graph). The copies' `host` fields are NULL here. */
    int (*prepare)(void *state, const mk_launch *launches, int n, const mk_copy *in, int n_in,
                   const mk_copy *out, mk_error **err);
    /* One evaluation: copy inputs in, run every launch, copy the output out. */
    int (*evaluate)(void *state, const mk_launch *launches, int n, const mk_copy *in,
                    int n_in, const mk_copy *out, mk_error **err);
} mk_device_ops;

extern const mk_device_ops mk_cpu_device;
#ifdef MK_WITH_CUDA
extern const mk_device_ops mk_cuda_device;
int mk_cuda_probe(char *reason, size_t size); /* kernels/: 1 if a device is usable */
#endif

/* Kernels: one function per op family and device (cpu.c, kernels/). */
#define MK_KERNELS(X)                                                              \
    X(sum) X(hadamard) X(relu) X(silu) X(matmul) X(permute) X(replace_slice)      \
    X(rms_norm) X(complex_mul) X(sliced_softmax) X(embedding) X(argmax)

#define MK_DECLARE_CPU(k) int mk_cpu_##k(const mk_launch *l, mk_error **err);
MK_KERNELS(MK_DECLARE_CPU)
#ifdef MK_WITH_CUDA
#define MK_DECLARE_CUDA(k) int mk_cuda_##k(const mk_launch *l, mk_error **err);
MK_KERNELS(MK_DECLARE_CUDA)
#endif

/* ---- cuDNN fusion (core/fusion.c picks groups, kernels/cudnn_fuser.cu runs them) ---- */

#define MK_GROUP_MAX_OPS 16 /* nodes one fused group may replace */

typedef enum { MK_GOP_MATMUL, MK_GOP_ADD, MK_GOP_MUL, MK_GOP_RELU, MK_GOP_SILU } mk_group_op_kind;

/*
 * One operation of a group. Operands name values: k >= 0 is the fused node's
 * input k (mk_launch.in[k]), -1 - j is the result of op j of the group. Shapes
 * are padded with leading 1s to `rank` (3 for a matmul group: cuDNN's matmul
 * is [B, M, K] @ [B, K, N]).
 */
typedef struct {
    mk_group_op_kind kind;
    int n_in;
    int in[2];
    int64_t shape[MK_MAX_RANK]; /* result, dense */
} mk_group_op;

/* An external operand as the group sees it (padded to the group's rank). */
typedef struct {
    int64_t shape[MK_MAX_RANK];
    int64_t stride[MK_MAX_RANK]; /* elements; views keep theirs */
    int align;                   /* bytes the address is known to be a multiple of (4..16) */
} mk_group_input;

typedef struct mk_fused_group {
    int rank;                      /* of every tensor in the group: 3, or 4 for 4-D pointwise */
    int n_ops;
    mk_group_op op[MK_GROUP_MAX_OPS]; /* evaluation order; the last one is the output */
    int n_in;                      /* <= MK_MAX_INPUTS */
    mk_group_input in[MK_MAX_INPUTS];
    char *trace;                   /* structural key: ops, shapes, strides, dtypes, operand order */
    /* filled by the fuser */
    struct mk_cudnn_plan *plan;    /* shared through the context's cache */
    size_t workspace_bytes;        /* taken from the planner's scratch */
    bool cache_hit, tf32;
    void *varpack;                 /* bound at capture time to the model's addresses */
} mk_fused_group;

/* The fusion state of one compile, owned by the model. */
typedef struct mk_fusion {
    struct mk_cudnn_cache **cache; /* the context's cache (made on first use) */
    int n_groups, cap_groups;
    mk_fused_group **groups;       /* fused groups, owned */
    int n_dropped, cap_dropped;
    mk_node **dropped;             /* nodes the groups replaced, owned */
    int fused, cache_hits, rejected, tf32;
    mk_strbuf report;              /* one line per group tried (report.s NULL: none yet) */
} mk_fusion;

mk_fusion *mk_fusion_new(struct mk_cudnn_cache **cache);
void mk_fusion_free(mk_fusion *);
/* The pass (passes.c runs it after assign-storage when opts->use_cudnn). */
int mk_fusion_pass(mk_graph *g, const mk_compile_options *opts, mk_error **err);
/* The CudnnGroupNode row's rules: never written in scripts; scratch = cuDNN workspace. */
int mk_fusion_infer(mk_node *n, mk_error **err);
size_t mk_fusion_scratch(const mk_node *n);

#ifdef MK_WITH_CUDA
/* kernels/cudnn_fuser.cu. The cache: a cuDNN handle and plans keyed by trace. */
void mk_cudnn_cache_free(struct mk_cudnn_cache *);
/* Finds or builds g's plan. 0: fused (g->plan, workspace_bytes, cache_hit, tf32 set);
 * 1: cuDNN rejects the group, the reason in `why`; -1: a hard error (no handle). */
int mk_cudnn_compile_group(struct mk_cudnn_cache **cache, mk_fused_group *g, char *why,
                           size_t why_size, mk_error **err);
void mk_cudnn_group_release(mk_fused_group *g); /* the variant pack and the plan reference */
int mk_cuda_cudnn_group(const mk_launch *l, mk_error **err); /* the kernel: execute on the stream */
#define MK_CUDNN_KERNEL mk_cuda_cudnn_group
#else
#define MK_CUDNN_KERNEL NULL
#endif

/* ---- planner (planner.c) ------------------------------------------------ */

/*
 * Offsets in one arena. Sizes are rounded up to MK_ALIGN; every offset is a
 * multiple of MK_ALIGN. Free blocks are kept ordered by address (neighbours
 * merge on release) and by (size, address) for best fit: O(log n) each.
 * A request no free block fits takes the top of the arena (growing it, and
 * absorbing a free block that touches the top).
 */
typedef struct mk_planner mk_planner;
mk_planner *mk_planner_new(void);
void mk_planner_free(mk_planner *);
/* Offset of a new block, or -1 when host memory for bookkeeping runs out (or the
 * size cannot be an arena offset: over INT64_MAX/2). */
int64_t mk_planner_alloc(mk_planner *, size_t bytes);
/* Gives back a block allocated with these offset and bytes. */
void mk_planner_release(mk_planner *, int64_t offset, size_t bytes);
size_t mk_planner_arena_bytes(const mk_planner *); /* high-water mark */
size_t mk_planner_peak_live(const mk_planner *);   /* largest sum of live (rounded) sizes */

#endif
