/*
 * device.h — what a device is: launches bound to fixed addresses, the kernel
 * table per op family, the device table (mk_device_ops), the host functions a
 * call reports through, the strided walk and fault messages kernels share,
 * and the CUDA plugin's ABI: the whole interface between the core and
 * libmoonkaas_cuda.so, checked in full when the plugin is opened (plugin.c).
 */
#ifndef MK_DEVICE_H
#define MK_DEVICE_H

#include "group.h"

/*
 * The strided walk every device uses: the elements of a contiguous result of
 * `shape`, read from up to MK_WALK_MAX operands with their own strides (0 where
 * broadcast). Size-1 dims are dropped and neighbouring dims merged wherever all
 * operands are linear across them, so out [4, 8, 16] = a [4, 8, 16] + b [1, 1, 16]
 * walks as [32, 16] with b's strides [0, 1]. A plain struct, passed to CUDA
 * kernels by value.
 */
#define MK_WALK_MAX MK_X_IN
typedef struct {
    int rank; /* >= 1 */
    int n;    /* operands */
    int64_t shape[MK_MAX_RANK];
    int64_t stride[MK_WALK_MAX][MK_MAX_RANK]; /* elements */
} mk_walk;
void mk_walk_init(mk_walk *w, int rank, const int64_t *shape, int n,
                  const int64_t *const *strides);
/* Element offset of operand k at the start of row `row` (all dims but the last). */
int64_t mk_walk_row_offset(const mk_walk *w, int k, int64_t row);

/*
 * Run-time faults: a value read on the device is out of range. Kernels of
 * every device report them through mk_fault, so the message is the same on
 * each: "evaluation error: <op> $7: rows [3, 9) are out of range ...".
 */
typedef enum {
    MK_FAULT_RANGE = 1, /* begin, end, rows: rows [begin, end) are not within [0, rows] */
    MK_FAULT_ROWS,      /* begin, end, rows of the replacement: counts differ */
    MK_FAULT_PREFIX,    /* prefix, n: a prefix outside [0, n] */
    MK_FAULT_ID,        /* id, position, V: an id outside [0, V) */
    MK_FAULT_END,       /* end, n, T: a causal end outside [T, n] */
    MK_FAULT_INDEX,     /* index, position, n: an index (operand 2) outside [0, n) */
} mk_fault_kind;
int mk_fault(mk_error **err, const mk_node *n, mk_fault_kind kind, int64_t v0, int64_t v1,
             int64_t v2);

/* One kernel call, bound once at compile time to fixed device addresses. */
typedef struct mk_launch {
    const mk_node *node;
    int index;                 /* position in the launch list */
    int n_in;
    mk_tensor out;
    mk_tensor in[MK_MAX_INPUTS];
    const mk_expr *expr;       /* a pointwise op's program (MK_KERNEL_POINTWISE), else NULL */
    void *scratch;             /* scratch_bytes of arena, or NULL: the op's scratch, then
                                  the device's (mk_device_ops.launch_memory) */
    size_t scratch_bytes;
    void *state;               /* state_bytes of arena kept across evaluations (the
                                  device's launch_memory), zeroed at compile; or NULL */
    size_t state_bytes;
    void *dev;                 /* the device's per-model state (stream, handles) */
} mk_launch;

typedef int (*mk_kernel_fn)(const mk_launch *l, mk_error **err);

/*
 * The dtype a pointwise launch computes in (its program's registers): its
 * first operand that is not bool, else its result where that is not bool,
 * else float32 (bool-only logic, exact in any dtype). Bool operands load as 0
 * or 1 in it and a bool result stores (value != 0). The op rules give every
 * non-bool operand of a node one dtype, and the grouping pass keeps one
 * compute dtype per group (doc/ARCHITECTURE.md, "Bool in pointwise
 * programs"), so this names the dtype of every value the program holds.
 */
static inline mk_dtype mk_pointwise_compute_dtype(const mk_launch *l) {
    for (int k = 0; k < l->n_in; k++)
        if (l->in[k].dtype != MK_DTYPE_BOOL) return l->in[k].dtype;
    return l->out.dtype != MK_DTYPE_BOOL ? l->out.dtype : MK_DTYPE_FLOAT32;
}

/* model.c: what a launch's operands need once bound to the node's tensors:
 * each broadcast onto the result where the op broadcasts (either operand, any
 * rank: mk_tensor_broadcast), a pointwise program. */
int mk_launch_operands(mk_launch *l, mk_error **err);

/* A device's kernel for one family, and the dtypes it takes: model.c checks
 * every data operand and the result against `dtypes` when it binds a launch. */
typedef struct {
    mk_kernel_fn fn;  /* NULL: the device has none */
    unsigned dtypes;  /* MK_DTYPE_BIT of each dtype it handles */
} mk_kernel;

/* ---- devices ------------------------------------------------------------ */

/* A host↔device copy of one evaluation (an input in, an output out). */
typedef struct {
    void *device;  /* address in the model's device memory */
    void *host;
    size_t bytes;
} mk_copy;

/*
 * A call's view of its context's host functions (model.c): passes and devices
 * report through it, and ask whether the host cancelled the call. `epoch` is
 * the context's cancel count when the call began.
 */
typedef struct mk_host {
    void *ctx;
    unsigned epoch;
    const mk_compile_options *opts; /* the compile's options (prepare), else NULL */
    void (*log)(const struct mk_host *, mk_log_level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    void (*progress)(const struct mk_host *, mk_phase, int64_t done, int64_t total);
    bool (*cancelled)(const struct mk_host *);
} mk_host;

/* Fails with MK_ERR_CANCELLED naming what stopped ("compile", "evaluation"). */
int mk_cancelled(mk_error **err, const char *what);

/* A next line as devices take it (prepare): input slot `input` holds, at the
 * next step, output `output`'s value, or (output -1) its own plus `add`. */
typedef struct {
    int input, output;
    int64_t add;
} mk_step_rule;

/* What a device's run_steps returns where it has no loop of its own for the
 * model: model.c then runs the steps as evaluations. */
#define MK_STEPS_NO_LOOP (-2)

typedef struct mk_device_ops {
    const char *name;
    const mk_kernel *kernels; /* [MK_KERNEL_COUNT], indexed by mk_kernel_id */
    mk_target target;         /* what the passes may assume of it */
    /* The device memory a model takes beyond its nodes' (NULL: none), asked
     * before anything is allocated so that max_bytes bounds it and the stats
     * report it. launch_memory: node n's launch takes *scratch more bytes for
     * itself alone (after its op's scratch) and keeps *state bytes across
     * evaluations; the planner gives both out of the arena (mk_launch.scratch,
     * mk_launch.state). model_memory: what the device allocates itself for the
     * model at open and prepare (library workspaces, the fault record, the
     * step loop's words), which it never exceeds. */
    void (*launch_memory)(const mk_node *n, size_t *scratch, size_t *state);
    size_t (*model_memory)(const mk_graph *g);
    /* Per-model state (streams, library handles); NULL state is fine for the CPU. */
    int (*open)(void **state, mk_error **err);
    void (*close)(void *state);
    /* Device memory, allocated at compile only. alloc fails with MK_ERR_NOMEM. */
    void *(*alloc)(void *state, size_t bytes, mk_error **err);
    void (*free)(void *state, void *p);
    int (*upload)(void *state, void *dst, const void *src, size_t bytes, mk_error **err);
    int (*zero)(void *state, void *dst, size_t bytes, mk_error **err);
    /* Called once after launches are bound (CUDA: compile the cuDNN groups'
     * plans and the generated kernels, pinned staging for the copies, capture
     * the graph, and the step loop where the model has next lines). The
     * copies' `host` fields are NULL here. Returns 0, -1 with *err, or 1
     * where the passes must choose again: cuDNN refused a group, or its plan
     * needs more workspace than its scratch (mk_fused_group.verdict); model.c
     * notes it and compiles the model anew. */
    int (*prepare)(void *state, const mk_launch *launches, int n, const mk_copy *in, int n_in,
                   const mk_copy *out, int n_out, const mk_step_rule *rules, int n_rules,
                   const mk_host *host, mk_error **err);
    /* One evaluation: copy inputs in, run every launch, copy the outputs out. */
    int (*evaluate)(void *state, const mk_launch *launches, int n, const mk_copy *in,
                    int n_in, const mk_copy *out, int n_out, const mk_host *host,
                    mk_error **err);
    /* Up to `steps` steps of the recurrence given to prepare, from the inputs
     * at in[].host, step s's output o at out[o].host + s * out[o].bytes, ending
     * early as `stop` says (mk_model_run_steps). Returns the steps run, -1 with
     * *err, or MK_STEPS_NO_LOOP; NULL: no loop of its own. */
    int64_t (*run_steps)(void *state, const mk_launch *launches, int n, const mk_copy *in,
                         int n_in, const mk_copy *out, int n_out, int64_t steps,
                         const mk_stop *stop, const mk_host *host, mk_error **err);
} mk_device_ops;

extern const mk_device_ops mk_cpu_device;

/* sample.c: run.c's sampler over one row of float32 logits [n] (SampleNode on
 * the CPU): returns the token and advances *state as run.c does; probs (n
 * floats) and keys (n) are scratch. */
int64_t mk_sample_row(const float *logits, int64_t n, uint64_t *state, float temperature,
                      float topp, float *probs, uint64_t *keys);
/* The first index of the largest of x [n] (a NaN at 0 wins, any other never):
 * ArgMaxNode's row on the CPU, and the sampler's at temperature 0. */
int64_t mk_argmax_row(const float *x, int64_t n);


/*
 * The CUDA device is a plugin (build/libmoonkaas_cuda.so, from kernels/) that
 * plugin.c opens with dlopen the first time CUDA is asked for, so a CPU-only
 * process maps no CUDA library. It exports one function, MK_CUDA_PLUGIN_ENTRY,
 * returning this table. The plugin is built from the same tree as the core:
 * abi and the struct sizes guard against mixing builds.
 */
#define MK_CUDA_PLUGIN_ABI 18
#define MK_CUDA_PLUGIN_ENTRY "mk_cuda_plugin_entry"
#define MK_CUDA_PLUGIN_FILE "libmoonkaas_cuda.so"
struct mk_fused_group;
struct mk_cudnn_cache;
/* The size of every struct the core and the plugin share, as each was built:
 * the plugin's must equal the core's in full (plugin.c), or the plugin is
 * refused as built from another tree. */
typedef struct {
    size_t node, graph, op, launch, tensor, host, device, options, group, pointwise, product, fused;
} mk_abi_sizes;
#define MK_ABI_SIZES                                                                           \
    ((mk_abi_sizes){sizeof(mk_node), sizeof(mk_graph), sizeof(mk_op), sizeof(mk_launch),        \
                    sizeof(mk_tensor), sizeof(mk_host), sizeof(mk_device_ops),                  \
                    sizeof(mk_compile_options), sizeof(mk_group), sizeof(mk_pointwise_group),   \
                    sizeof(mk_product_group), sizeof(mk_fused_group)})

typedef struct {
    int abi;                      /* MK_CUDA_PLUGIN_ABI: checked before anything else is read */
    mk_abi_sizes sizes;           /* MK_ABI_SIZES, as the plugin was built */
    const mk_device_ops *device;
    int (*probe)(char *reason, size_t size); /* 1 if a device is usable, else 0 and why */
    /* cuDNN's cache of plans, a context's (NULL when the plugin was built with CUDNN=0) */
    void (*cudnn_cache_free)(struct mk_cudnn_cache *);
    /* Writes the kernel of a group's launch (pointwise or matrix–vector) and
     * compiles it with NVRTC for sm_<arch> (or takes it from the disk cache),
     * loading nothing: needs no device (CI checks the generator). */
    int (*generate_check)(const mk_launch *l, int arch, mk_error **err);
} mk_cuda_plugin;
typedef const mk_cuda_plugin *(*mk_cuda_plugin_entry_fn)(void);

/* model.c: writes and NVRTC-compiles, for sm_<arch>, the CUDA kernel of each
 * group (pointwise or matrix–vector) of a model compiled for any device, but
 * matrix–vector groups with weights read by rows (CUDA forms none); the number
 * checked, or -1. Tests use it where there is no GPU (the plugin needs none
 * for this). */
int mk_model_check_generated(const struct mk_model *m, int arch, mk_error **err);

/* plugin.c: the plugin, loaded once per process; NULL with the reason in
 * `reason` when there is none or it is broken. Thread-safe. */
const mk_cuda_plugin *mk_cuda_plugin_get(char *reason, size_t size);

/*
 * kernels/cudnn_fuser.cu: the cache (a cuDNN handle and plans keyed by trace)
 * is a context's, freed through the plugin table's cudnn_cache_free. The CUDA
 * device's prepare compiles each group's plan into it; the group's kernel is
 * the device's MK_KERNEL_CUDNN_GROUP.
 */

#endif
