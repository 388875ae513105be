/*
 * graph.h — what every stage of the core shares: errors as values, the
 * string builder, the dtype table and its conversions, the graph (nodes in
 * evaluation order), the op table's row type, and tensors as strides over
 * memory. The stages, in order:
 *   script.c   text → graph (parse, each node checked by its op's rule), graph → text
 *   passes.c   the ordered passes (passes.h): storage and views, the grouping passes
 *              (group_pointwise.c, product.c, gather.c, fusion.c), verify
 *   planner.c  offsets in one arena (passes.h)
 *   model.c    compile (plan, allocate, bind launches) and evaluate, on a device (device.h)
 *   cpu/       the CPU device; kernels/ the CUDA device plugin, opened by plugin.c
 * Shared by all: ops.c (the op table: the only file that knows an op), tensor.c
 * (dtypes, shapes, strides, the strided walk, fault messages), expr.c
 * (pointwise expressions, expr.h), group.c (the group record, group.h),
 * error.c (errors, the string builder, clocks).
 */
#ifndef MK_GRAPH_H
#define MK_GRAPH_H

#include "moonkaas.h"
#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#define MK_MAX_INPUTS 16
/* Integer arguments of a node (signature letters i and l): a transposed
 * convolution's stride, padding, output padding and dilation pairs and groups. */
#define MK_MAX_ATTRS 10
#define MK_ALIGN 256

/* ---- errors ------------------------------------------------------------- */

struct mk_error {
    mk_error_code code;
    int line, column; /* 1-based; 0 when not about the script */
    bool is_static;   /* the out-of-memory error: never freed, its message mk_error_message's
                       * (each copy of error.c has one) */
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
/* Says what the step that failed was for, in front of *err's text, keeping its
 * kind: "out of memory: constant 'w' (64 bytes): cannot allocate ..."; the
 * line and column where the error has none. Returns -1. */
int mk_fail_within(mk_error **err, int line, int column, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
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

/* file.c: the SHA-256 digest of n bytes (the kernel cache checks entries with it) */
void mk_sha256(const void *data, size_t n, unsigned char out[32]);
/* file.c: a file's bytes, read into memory where it has at most read_limit of
 * them, else mapped read-only (a mapping reads the file as it is when a page
 * is touched). 0, or -1 with a file error naming path. */
typedef struct {
    void *data;
    size_t size;
    bool copied; /* read (free) rather than mapped (munmap) */
} mk_mapped;
int mk_file_map(const char *path, size_t read_limit, mk_mapped *out, mk_error **err);
void mk_file_unmap(mk_mapped *m);

/* ---- the dtype table (tensor.c) ------------------------------------------- */

typedef struct {
    const char *name;    /* script name */
    size_t size;         /* bytes per element */
    const char *c_type;  /* the element's type in generated CUDA C */
    bool is_float;
    mk_dtype accum;      /* what sums and products of it accumulate in */
} mk_dtype_row;

/* The row of d, or NULL outside the table. */
const mk_dtype_row *mk_dtype_row_of(mk_dtype d);
#define MK_DTYPE_BIT(d) (1u << (unsigned)(d))
#define MK_DTYPES_FLOAT \
    (MK_DTYPE_BIT(MK_DTYPE_FLOAT32) | MK_DTYPE_BIT(MK_DTYPE_FLOAT16) | MK_DTYPE_BIT(MK_DTYPE_BFLOAT16))
#define MK_DTYPES_ALL ((1u << MK_DTYPE_COUNT) - 1u)

/*
 * Element conversions, the one rule every device and the host follow (the
 * Cast node, mk_convert, the weight reads of products):
 *   - to float16 / bfloat16: round to nearest, ties to even; too large for
 *     float16 becomes ±inf; NaN stays NaN;
 *   - from float16 / bfloat16 to float32: exact;
 *   - float to integer: toward zero, saturated at the type's range, NaN → 0;
 *   - int64 to float32: round to nearest (as C converts);
 *   - to bool: 1 where the value is not 0 (NaN is not), else 0; from bool: 0 or 1.
 */
static inline float mk_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t mk_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float mk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13); /* inf, NaN */
    } else if (exp) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man) { /* subnormal: man * 2^-24, exact in float32 */
        float f = (float)man * 0x1p-24f;
        memcpy(&u, &f, sizeof u);
        u |= sign;
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t mk_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: inf */
    if (a < 0x38800000u) { /* below 2^-14: a subnormal (or zero), in units of 2^-24 */
        float x;
        memcpy(&x, &a, sizeof x);
        /* x * 2^24 < 1024 is exact to scale; rounding it to an integer rounds
         * to nearest even in the current (default) mode */
        return (uint16_t)(sign | (uint16_t)__builtin_rintf(x * 0x1p24f));
    }
    uint32_t r = a + 0x0fffu + ((a >> 13) & 1u) - (112u << 23); /* ties to even */
    return (uint16_t)(sign | (r >> 13));
}

/* Float to integer: toward zero, saturated to [lo, hi], NaN to 0. */
static inline int64_t mk_f64_to_int(double x, int64_t lo, int64_t hi) {
    if (x != x) return 0;
    if (x <= (double)lo) return lo;
    if (x >= (double)hi) return hi;
    return (int64_t)x;
}

/* ---- graph -------------------------------------------------------------- */

typedef struct mk_op mk_op;
typedef struct mk_node mk_node;

typedef enum {
    MK_STORAGE_ARENA,    /* output (or input slot) placed by the planner */
    MK_STORAGE_CONSTANT, /* its own allocation, filled at compile */
    MK_STORAGE_BUFFER,   /* its own allocation, zero at compile, persistent */
    MK_STORAGE_VIEW,     /* no memory: uses `owner`'s at `view_offset` */
} mk_storage;

/* How a constant's data, given dense row-major, is laid out on the device: a
 * decision a pass records (product_rules.c's hold_by_columns) and model.c
 * carries out when it uploads the constant, with the strides to match. */
typedef enum {
    MK_UPLOAD_AS_GIVEN,  /* dense row-major, as the caller gave it */
    MK_UPLOAD_BY_COLUMNS /* a [k, n] matrix held by columns: strides (1, k) */
} mk_upload;

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
    char *name;                   /* an input's or constant's name, else NULL */
    const void *value;            /* mk_op_infer only: a known operand's data, else NULL */
    int n_attr;
    int64_t attr[MK_MAX_ATTRS];   /* the integers and integer list of the signature, in order */

    /* decided by passes and the planner */
    int n_consumers;
    mk_storage storage;
    mk_node *owner;            /* the node whose memory holds this one (itself if it owns) */
    int64_t view_offset;       /* bytes from the owner's start */
    int64_t stride[MK_MAX_RANK]; /* in elements */
    mk_upload upload;          /* a constant: how model.c lays its data out */
    int last_use;              /* index of the last node reading this owner's memory */
    size_t scratch_bytes;
    int64_t offset;            /* arena offset (owners in the arena), else -1 */

    struct mk_group *group;    /* a group node: what it computes (group.c), else NULL */
};


/*
 * A recurrence line of the script (`next NAME = $N;`, `next NAME = NAME + INT;`):
 * what input `input` holds at the next step of mk_model_run_steps, output
 * `output`'s value (a feed), or, where output is -1, its own value plus `add`
 * (a counter: int64).
 */
typedef struct {
    mk_node *input;
    int output;
    int64_t add;
    int line, column; /* where the script says it */
} mk_recurrence;

typedef struct {
    int n_nodes, cap;
    mk_node **nodes; /* evaluation order = script order */
    mk_node *outputs[MK_MAX_OUTPUTS]; /* the result line's nodes, in its order */
    int n_outputs;
    mk_recurrence next[MK_MAX_INPUTS]; /* the recurrence lines, in script order */
    int n_next;
    int n_names;
    mk_node **names; /* [n_names] the named leaves, sorted by name (parse checks they differ) */
    struct mk_fusion *fusion; /* set by model.c when opts->use_cudnn, for the fusion pass */
} mk_graph;

/* What the passes may assume of the device a graph is compiled for: each
 * device's record (mk_device_ops.target), handed to every pass. Passes read
 * it; they never call a device. */
typedef struct {
    int pointwise_operands; /* the most operands its pointwise group kernels read
                               (0: no pointwise groups) */
    int64_t int8_products;  /* the most elements of A (m x k) its matrix-vector groups take
                               on the int8 grid (a FakeQuantizeNode folded in); 0: none */
    bool row_products;      /* its matrix-vector groups read float32 weights by rows too
                               ([k, n], n contiguous: an MLP's [in, out]), not only by columns */
    bool cudnn_groups;      /* it runs cuDNN groups (fusion.c), compiling their plans in its
                               prepare (CUDA built with cuDNN) */
    bool row_groups;        /* it runs row groups (group_rows.c): a row reduction with its
                               pointwise prologue and epilogue */
    bool conv_groups;       /* it runs convolution groups (group_conv.c): a convolution with
                               its bias, batch norm (folded), residual add and ReLU */
    int matvec_rows;        /* the most rows of A its matrix-vector groups take, at most
                               MK_MATVEC_ROWS_MAX (more: a matrix product) */
    bool causal_attention;  /* it runs a prompt's causal attention as one group (product.c):
                               Q @ Kt -> CausalSoftmax(p) -> PrefixMatMul(., V, p) */
} mk_target;

/* Whether n is one of g's outputs (its value is copied out: no group may absorb it). */
static inline bool mk_is_output(const mk_graph *g, const mk_node *n) {
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == n) return true;
    return false;
}

/* script.c */
mk_graph *mk_graph_parse(const char *script, mk_error **err);
char *mk_graph_print(const mk_graph *g); /* NULL only when out of memory */
/* The leaf named `name` (an input or a constant), or NULL: O(log n). */
mk_node *mk_graph_find_name(const mk_graph *g, const char *name);
void mk_graph_free(mk_graph *g);

/* helpers used by script.c, ops.c, passes */
int64_t mk_node_numel(const mk_node *n);
size_t mk_node_bytes(const mk_node *n);
void mk_contiguous_strides(int rank, const int64_t *shape, int64_t *stride);
/* The element count of a shape, checked: 0 when a dim is not positive or the
 * count would pass MK_MAX_NUMEL (also where the product overflows). */
int64_t mk_shape_numel(int rank, const int64_t *shape);
/* op->infer and then the size check every result passes (script.c, mk_op_infer). */
int mk_node_infer(mk_node *n, mk_error **err);
/* "[2, 3, 4]" into buf */
const char *mk_shape_str(int rank, const int64_t *shape, char *buf, size_t size);
/* How a message names operand k of n: its name ('x') where it has one, its
 * statement ($3, line 2) in a script, else its place (operand 2). */
const char *mk_operand_ref(const mk_node *n, int k, char *buf, size_t size);
#define MK_OPERAND(n, k) mk_operand_ref((n), (k), (char[80]){0}, 80)

/* dot.c: the compiled graph as Graphviz DOT (NULL when out of memory) */
char *mk_graph_dot(const mk_graph *g);
/* dot.c: the arena over the evaluation order as SVG (NULL when out of memory) */
char *mk_graph_memory_svg(const mk_graph *g, size_t arena_bytes, size_t lower_bound);

/* safetensors.c: checks the header of a whole file's bytes (for fuzzing: no file,
 * no mapping); the tensors it names in *count. */
int mk_safetensors_parse_buffer(const void *file, size_t size, size_t *count, mk_error **err);

/* ---- the op table (ops.c) ----------------------------------------------- */

/* Kernel families: an op row names one; each device has a kernel (or none) for it. */
#define MK_KERNELS(X) \
    X(POINTWISE) X(MATMUL) X(PERMUTE) X(REPLACE_SLICE) X(RMS_NORM) X(COMPLEX_MUL) \
    X(SLICED_SOFTMAX) X(EMBEDDING) X(ARGMAX) X(CUDNN_GROUP) X(PRODUCT) \
    X(PREFIX_MATMUL) X(CAST) X(DEQUANTIZE) X(FAKE_QUANTIZE) X(SAMPLE) X(CAUSAL_SOFTMAX) \
    X(CONCAT) X(TILE) X(REPEAT_INTERLEAVE) X(PAD) X(FLIP) X(GATHER_ELEMENTS) X(INDEX_SELECT) \
    X(CUMSUM) \
    X(REDUCE_SUM) X(REDUCE_MEAN) X(REDUCE_MAX) X(REDUCE_MIN) X(REDUCE_PROD) X(REDUCE_VAR) \
    X(ARGMAX_AXIS) X(ARGMIN_AXIS) X(SOFTMAX) X(LOG_SOFTMAX) X(LAYER_NORM) X(GROUP_NORM) \
    X(BATCH_NORM) X(RMS_NORM_EPS) X(ROWS_GROUP) \
    X(CONV) X(CONV_TRANSPOSE) X(MAX_POOL) X(AVG_POOL) X(ADAPTIVE_AVG_POOL) X(UPSAMPLE_NEAREST) \
    X(CONV_GROUP) \
    X(REPLACE_AT)
typedef enum {
    MK_KERNEL_NONE,
#define MK_KERNEL_ENUM(k) MK_KERNEL_##k,
    MK_KERNELS(MK_KERNEL_ENUM)
#undef MK_KERNEL_ENUM
    MK_KERNEL_COUNT
} mk_kernel_id;

struct mk_op {
    const char *name;      /* script name */
    const char *alias;     /* another accepted script name, or NULL */
    const char *signature; /* one letter per argument, as mk_op_desc says */
    mk_op_role role;
    mk_leaf_kind leaf;
    unsigned flags;        /* MK_OP_* */
    const char *method, *infix, *expr, *summary; /* as mk_op_desc */
    /* Shape/dtype rule: fills n->dtype/rank/shape from inputs and attributes, or
     * fails with the node's line and column. */
    int (*infer)(mk_node *n, mk_error **err);
    /* Views, in-place ops and copies that may be views: the strides (elements)
     * and the byte offset into the first input's memory at which n's elements
     * lie; NULL for ops that own memory. A MK_ROLE_MOVE op with a layout is a
     * view where every reader takes its strides, else a copy that reads its
     * input through them. */
    int64_t (*layout)(const mk_node *n, int64_t *stride);
    /* May operand k be read as a strided view with these shape and strides?
     * NULL: every operand must be dense. */
    bool (*takes_strided)(int k, int rank, const int64_t *shape, const int64_t *stride);
    /* Scratch bytes the kernel needs (NULL: none). */
    size_t (*scratch)(const mk_node *n);
    mk_kernel_id kernel;
};

/* ops_conv.c: the convolution and pooling rows' shape rules and scratch. */
int mk_infer_conv(mk_node *n, mk_error **err);
int mk_infer_conv_transpose(mk_node *n, mk_error **err);
int mk_infer_pool(mk_node *n, mk_error **err);
int mk_infer_resize(mk_node *n, mk_error **err);
size_t mk_conv_scratch(const mk_node *n);
size_t mk_conv_transpose_scratch(const mk_node *n);

const mk_op *mk_op_find(const char *name, size_t len);
/* The row made only by passes that runs on `kernel` (the cuDNN group, the
 * pointwise group), or NULL. */
const mk_op *mk_op_internal(mk_kernel_id kernel);
/* Is matmul n one of HamKaas's forms, [k]@[k,n], [m,k]@[k,n] or [B,m,k]@[B,k,n]
 * (the forms cuDNN's fusion and the attention groups are built for)? */
bool mk_matmul_is_plain(const mk_node *n);
/* ops_shape.c: the rules and layouts of the shape and data-movement rows */
enum { MK_PAD_CONSTANT, MK_PAD_REFLECT, MK_PAD_EDGE }; /* PadNode's mode argument */
int mk_infer_slice_axis(mk_node *n, mk_error **err);
int mk_infer_squeeze(mk_node *n, mk_error **err);
int mk_infer_unsqueeze(mk_node *n, mk_error **err);
int mk_infer_flatten(mk_node *n, mk_error **err);
int mk_infer_expand(mk_node *n, mk_error **err);
int mk_infer_flip(mk_node *n, mk_error **err);
int mk_infer_concat(mk_node *n, mk_error **err);
int mk_infer_pad(mk_node *n, mk_error **err);
int mk_infer_tile(mk_node *n, mk_error **err);
int mk_infer_repeat_interleave(mk_node *n, mk_error **err);
int mk_infer_gather_elements(mk_node *n, mk_error **err);
int mk_infer_index_select(mk_node *n, mk_error **err);
int mk_infer_cumsum(mk_node *n, mk_error **err);
int mk_infer_replace_at(mk_node *n, mk_error **err);
int64_t mk_layout_slice_axis(const mk_node *n, int64_t *stride);
int64_t mk_layout_dense(const mk_node *n, int64_t *stride);
int64_t mk_layout_expand(const mk_node *n, int64_t *stride);
/* Leaf storage: where a leaf's data live. */
mk_storage mk_op_leaf_storage(const mk_op *op);
/* Is node n's operand k a run-time bound (signature letter r)? */
bool mk_op_operand_is_bound(const mk_op *op, int k);

/* SampleNode's scratch for rows of n: a head (the CPU's keys for one row, or
 * MK_SAMPLE_ROW_BYTES of a GPU's bookkeeping per row), then every row's
 * probabilities (float32: the CPU's; the GPU recomputes them). */
#define MK_SAMPLE_ROW_BYTES 20480
static inline size_t mk_sample_head(int64_t rows, int64_t n) {
    size_t keys = (size_t)n * sizeof(uint64_t), book = (size_t)rows * MK_SAMPLE_ROW_BYTES;
    return ((keys > book ? keys : book) + 255) & ~(size_t)255;
}

/* ---- tensors as kernels see them ---------------------------------------- */

typedef struct {
    void *data; /* address of element [0, ..., 0] on the model's device */
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    int64_t stride[MK_MAX_RANK]; /* elements; 0 where broadcast */
} mk_tensor;

/* `b` read as `like`'s shape, NumPy's way: dims aligned from the last, b's
 * missing leading dims and its dims of size 1 where `like` is larger repeat
 * (stride 0). Any operand of an MK_OP_BROADCAST op or a pointwise group. */
mk_tensor mk_tensor_broadcast(const mk_tensor *b, const mk_tensor *like);
int64_t mk_tensor_numel(const mk_tensor *t);
bool mk_tensor_is_contiguous(const mk_tensor *t);
/* Do t's elements fill its memory exactly, in some order of its axes (a
 * permuted dense tensor)? Then its memory converts as one run. */
bool mk_tensor_is_dense_permuted(const mk_tensor *t);

/*
 * One matrix operand rows × cols with element strides (sr, sc) as BLAS
 * libraries take it: normal when sc == 1 (ld = sr), transposed when sr == 1
 * (the memory holds cols × rows, ld = sc); a dim of size 1 makes its stride
 * irrelevant. False when neither fits (or ld would not be an int). CBLAS on
 * the CPU and cuBLAS (which sees the row-major matrix as its transpose) both
 * read their flags from it.
 */
bool mk_matrix_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, bool *transposed,
                      int64_t *ld);

/*
 * numpy.matmul's a @ b as a batch of products C [m, n] = A [m, k] · B [k, n]
 * (tensor.c; the CPU and CUDA kernels both read it): a [k] is one row (a_sr
 * 0), b [k] one column; the batch dims are the operands' leading dims
 * broadcast together, size-1 dims dropped, neighbours merged where both
 * operands are linear across them, and the innermost ones folded into A's
 * rows where B repeats across them ([B, T, D] @ [D, O] is one [B·T, D]
 * product). Batch strides are 0 where an operand repeats. The output is
 * contiguous: batch t's C starts at t · m · n.
 */
typedef struct {
    int64_t m, k, n;
    int64_t a_sr, a_sc, b_sr, b_sc; /* the matrices' element strides */
    int nb;                         /* batch dims left (0: one product) */
    int64_t batch[MK_MAX_RANK], a_sb[MK_MAX_RANK], b_sb[MK_MAX_RANK];
    int64_t count;                  /* products: the batch dims' product */
    bool batched;                   /* the operands had batch dims (a batch of one included) */
} mk_matmul_plan;
void mk_matmul_plan_of(const mk_tensor *a, const mk_tensor *b, mk_matmul_plan *p);
/* Element offsets of batch t's A and B. */
void mk_matmul_batch_offsets(const mk_matmul_plan *p, int64_t t, int64_t *a_off, int64_t *b_off);

#endif
