/*
 * internal.h — what the compiler's stages share: errors, the graph, the op
 * table's row type, tensors as kernels see them, and the device table.
 *
 * Stages, in order (one file each):
 *   script.c   text → graph (parse, shape/dtype rules from ops.c), graph → text
 *   passes.c   ordered passes over the graph (storage and views, the grouping passes, verify)
 *   fusion.c   the cuDNN fusion pass: which groups, and their structural traces
 *   group.c    pointwise groups; product.c matrix-vector and attention groups;
 *              gather.c one-id embeddings folded into those groups
 *   planner.c  offsets in one arena (best fit, neighbour merging)
 *   model.c    compile (plan, allocate, bind launches) and evaluate
 *   cpu.c      the CPU device: kernels and device table
 *   plugin.c   finds and opens the CUDA device plugin (dlopen) the first time CUDA is asked for
 *   kernels/   the CUDA device plugin (cuda_device.cu) and its kernels; cuDNN in cudnn_fuser.cu
 * Shared by all: ops.c (the op table: the only file that knows an op), tensor.c
 * (the dtype table, shapes, strides, the strided walk, run-time fault messages),
 * expr.c (pointwise expressions: parsed once, run by each device), error.c
 * (errors as values, the string builder, clocks).
 *
 * Long because it is the one header of core's internals: each section below
 * is one stage's share (its types and entry points) and is short; a header
 * per stage would have every stage include most of the others.
 */
#ifndef MK_INTERNAL_H
#define MK_INTERNAL_H

#include "moonkaas.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#define MK_MAX_INPUTS 16
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
 *   - int64 to float32: round to nearest (as C converts).
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
    int64_t attr[MK_MAX_RANK];    /* the integers and integer list of the signature, in order */

    /* decided by passes and the planner */
    int n_consumers;
    mk_storage storage;
    mk_node *owner;            /* the node whose memory holds this one (itself if it owns) */
    int64_t view_offset;       /* bytes from the owner's start */
    int64_t stride[MK_MAX_RANK]; /* in elements */
    int last_use;              /* index of the last node reading this owner's memory */
    size_t scratch_bytes;
    int64_t offset;            /* arena offset (owners in the arena), else -1 */

    struct mk_fused_group *group; /* a cuDNN group node: what it computes (fusion.c), else NULL */
    struct mk_pointwise_group *pw; /* a pointwise group node (group.c), else NULL */
    struct mk_product_group *prod; /* a matrix–vector group node (product.c), else NULL */
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
    int pointwise_operands;   /* set by model.c: the most operands the device's pointwise
                                 kernel reads (0: no pointwise groups) */
    int64_t int8_products;    /* set by model.c: the most elements of A (m x k) the device's
                                 matrix-vector groups take on the int8 grid (a
                                 FakeQuantizeNode folded in); 0: none */
    bool row_products;        /* set by model.c: the device's matrix-vector groups read
                                 float32 weights by rows too (mk_device_ops) */
} mk_graph;

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

/* passes.c: the ordered pass list, run between parsing and planning */
int mk_passes_run(mk_graph *g, const mk_compile_options *opts, mk_error **err);
/* group.c: the grouping pass (pointwise trees), and its lines of the fusion report */
int mk_group_pass(mk_graph *g, const mk_compile_options *opts, mk_error **err);
void mk_pointwise_group_free(struct mk_pointwise_group *pw);
int mk_group_report(const mk_graph *g, mk_strbuf *b);
/* product.c: matrix–vector groups, and their lines of the fusion report (one
 * per group, and one per product left to the device's matrix kernel) */
int mk_product_pass(mk_graph *g, const mk_compile_options *opts, mk_error **err);
void mk_product_group_free(struct mk_product_group *pg);
int mk_product_report(const mk_graph *g, mk_strbuf *b);
size_t mk_product_scratch(const mk_node *n);
/* gather.c: single-id embeddings of constant tables read by matrix-vector
 * groups become views, the groups reading their row (mk_product_gather) */
int mk_gather_pass(mk_graph *g, const mk_compile_options *opts, mk_error **err);

/* ---- pointwise expressions (expr.c) ------------------------------------------ */

/*
 * A pointwise op's scalar expression (its row's `expr`, C syntax over a and b:
 * numbers, + - * /, unary -, < >, ?:, parentheses, expf tanhf sqrtf) compiled
 * to a straight-line program over registers. Registers 0 and 1 are a and b (a
 * fused group's program reads up to MK_X_IN operands); every instruction
 * writes a new register, the last one is the result. Each device
 * runs the program as it likes (the CPU over tiles, CUDA per element); a code
 * generator may print the expression itself instead. Evaluated in the
 * operands' dtype (float32 or int64; integer + - * wrap around), one rounding
 * per operation, so the result equals the C expression compiled without
 * contraction.
 */
typedef enum {
    MK_X_CONST, /* r[dst] = k */
    MK_X_NEG, MK_X_EXP, MK_X_TANH, MK_X_SQRT,                   /* r[dst] = f(r[x]) */
    MK_X_ADD, MK_X_SUB, MK_X_MUL, MK_X_DIV, MK_X_GT, MK_X_LT,   /* r[dst] = r[x] op r[y] */
    MK_X_SELECT,                                                /* r[dst] = r[x] ? r[y] : r[z] */
    MK_X_MAX,   /* r[dst] = r[x] > r[y] ? r[x] : r[y] (what "a > 0 ? a : 0" compiles to) */
} mk_xop;

#define MK_EXPR_MAX 32          /* instructions */
#define MK_X_IN 4               /* registers 0 .. MK_X_IN - 1 are the operands a, b, ... */

typedef struct {
    unsigned char op, x, y, z; /* mk_xop, operand registers */
    double k;                  /* MK_X_CONST */
} mk_xinsn;

typedef struct {
    int n;         /* instructions; instruction i writes register MK_X_IN + i, the last
                      one is the result */
    int n_in;      /* operands read: registers 0 .. n_in - 1 (an op's: a, or a and b) */
    bool has_float_only; /* uses / or a function: not for integer dtypes */
    mk_xinsn insn[MK_EXPR_MAX];
} mk_expr;

/* Compiles `src`; fails with MK_ERR_INTERNAL naming the expression and the position. */
int mk_expr_compile(const char *src, mk_expr *out, mk_error **err);
/* Without changing a result bit: equal constants share a register, x > y ? x : y
 * becomes MK_X_MAX, dead instructions go (mk_expr_compile and fused groups). */
void mk_expr_tidy(mk_expr *e);
/* Appends program p to e, p's operand k read from e's register operands[k];
 * *result is e's register of p's result. False (e unchanged) when e would
 * pass MK_EXPR_MAX. How groups compose their members' programs. */
bool mk_expr_append(mk_expr *e, const mk_expr *p, const int *operands, int *result);

/* What a pointwise group node computes: its members' expressions as one
 * program over its operands (in[k] is register k). The root stays in the graph
 * as the group node; the other members left it for here. */
typedef struct mk_pointwise_group {
    mk_expr program;
    const struct mk_op *root_op;   /* the root's op before it became the group */
    int n_members;
    mk_node *members[MK_EXPR_MAX]; /* the other members, in graph order, owned */
} mk_pointwise_group;
/*
 * What a matrix–vector group node computes (product.c). Decoding multiplies
 * a few rows A [m, k] by weight matrices B_j [k, n_j] whose columns lie
 * contiguous (an [out, in] weight read through a permute): the group does the
 * products reading A once, with the RmsNorm that makes A folded in (prologue)
 * and, per result, the pointwise nodes, one complex rotation (RoPE) and one
 * in-place row write that follow (epilogue). A result's element e (= row *
 * n + column, whatever views reshape it) is
 *     program(sources at e), then rotated, then written
 * where a source is a product's value at e or an operand read through the
 * broadcast of the shape it was read in. Results without a row write lie in
 * the group node's own memory at `offset`; the graph keeps a GroupOutputNode
 * view for each result, so readers need not know.
 *
 * The members (the original nodes) are kept, in graph order, for reports and
 * errors. Both devices run a group from the fields below: the CPU in one
 * parallel loop (equal to the nodes alone bit for bit), CUDA as one generated
 * kernel.
 */
#define MK_PRODUCTS_MAX 4     /* products of one group (siblings reading the same A) */
#define MK_PRODUCT_MEMBERS 32 /* nodes one group may replace */
#define MK_GATHERS_MAX 4      /* operands of one group read at a row an id picks */
#define MK_MATVEC_ROWS 4      /* rows of A a group takes; more is a matrix product */
#define MK_ATTENTION_ROWS 8   /* query rows per batch an attention group takes */
#define MK_INT8_GROUP_MAX 512 /* groups of A on the int8 grid a group takes divide this (powers
                                 of two: CUDA's 16-value lanes of a group share its maximum by
                                 butterfly shuffles within a warp) */
#define MK_ATTENTION_ROWS_MAX 12032 /* cached rows one block scores in shared memory */

typedef struct {
    int in;                /* the group node's operand k, or -1 for a product */
    int product;           /* the product's index, or -1 */
    int rank;              /* the shape the operand is read in (broadcast to it) */
    int64_t shape[MK_MAX_RANK];
} mk_product_source;

typedef struct {
    struct mk_node *end;       /* the member whose result this is */
    int n_src;
    mk_product_source src[MK_X_IN]; /* registers 0 .. n_src - 1 of the program */
    mk_expr program;           /* n == 0: the value is src[0] */
    int rotate;                /* operand of the complex multiplier (RoPE), or -1 */
    int rotate_rank;           /* the shape it is read in */
    int64_t rotate_shape[MK_MAX_RANK];
    int64_t n;                 /* columns (every product it reads has n columns) */
    int64_t offset;            /* elements into the group node's memory (no row write) */
    int row_x, row_begin, row_end; /* a row write: operands of x and its bounds, else -1 */
    int64_t row_count;         /* rows the write replaces (the replacement's first dim) */
    bool argmax;               /* the result is the ArgMax of each row (int64 [m, 1]) */
} mk_product_out;

/* An operand read at the row an id picks on the device (gather.c): it views
 * row 0 of a table of `rows` rows, and the group reads it id x row_bytes
 * further, after checking 0 <= id < rows (the error names `node`). */
typedef struct {
    int in;                /* the operand */
    int ids;               /* operand: the id, int64 [1] */
    int64_t rows, row_bytes;
    const struct mk_node *node; /* the EmbeddingNode folded in (a view of the table now) */
} mk_product_gather;

typedef enum {
    MK_PRODUCT_MATVEC,    /* products of A with their prologue and epilogues */
    MK_PRODUCT_ATTENTION, /* decode attention: Q @ Kt -> SlicedSoftmax(p) -> PrefixMatMul(., V, p) */
} mk_product_kind;

/* Decode attention's operands and sizes: Q [B, m, d] @ Kt [B, d, S], softmax of
 * the first p columns, @ V [B, S, n] over the first p rows; only those are read. */
typedef struct {
    int q, kt, v, p;          /* operands */
    int64_t batch, m, d, s, n;
    bool early;               /* no launch before writes K's or V's rows before p - 1
                                 (early_rows): CUDA loads them before its wait */
    bool int8_grid;           /* some product group of the graph takes A on runq.c's int8
                                 grid (W8A8), where the sums' last bit can change the text:
                                 CUDA keeps the order that tells runq.c's */
} mk_attention_info;

typedef struct mk_product_group {
    mk_product_kind kind;
    mk_attention_info att;         /* MK_PRODUCT_ATTENTION */
    int64_t m, k;                  /* A [m, k] */
    int a;                         /* operand: A, or the x that the RmsNorm normalises */
    int norm_w;                    /* operand: the RmsNorm's weight [k], or -1 */
    int n_products;
    int b[MK_PRODUCTS_MAX];        /* operand: B_j [k, n_j], float32, float16 or bfloat16, or
                                      int8 times the scales of a DequantizeNode folded in: */
    int b_scale[MK_PRODUCTS_MAX];  /* operand: its scales [k / group, n_j], or -1 */
    bool b_rows[MK_PRODUCTS_MAX];  /* B_j float32 held by rows (n contiguous), on a device
                                      with row_products; else its columns are contiguous */
    int64_t b_group[MK_PRODUCTS_MAX]; /* rows of B per scale (a multiple of 16) */
    int64_t a8_group;              /* A on runq.c's int8 grid in groups of this many (a
                                      FakeQuantizeNode folded in; every B int8 in blocks of
                                      as many rows): integer dot products; else 0 */
    int n_outs;
    mk_product_out out[MK_PRODUCTS_MAX];
    int n_gathers;                 /* operands read at a row an id picks (gather.c) */
    mk_product_gather gather[MK_GATHERS_MAX];
    int n_members;
    struct mk_node *members[MK_PRODUCT_MEMBERS]; /* graph order, owned */
    int64_t scratch[MK_PRODUCT_MEMBERS]; /* attention: bytes into the CPU's scratch, or -1 */
    size_t scratch_bytes;          /* the CPU's: matrix-vector, A's rows; attention, members */
} mk_product_group;

/* The program of a pointwise op's `expr` (compiled once per process), or NULL
 * for ops without one (ops.c). */
const mk_expr *mk_op_program(const struct mk_op *op);

/* ---- tensors as kernels see them ---------------------------------------- */

typedef struct {
    void *data; /* address of element [0, ..., 0] on the model's device */
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    int64_t stride[MK_MAX_RANK]; /* elements; 0 where broadcast */
} mk_tensor;

/* `b` with stride 0 on its dims of size 1 where `like` is larger (the second
 * operand of an MK_OP_BROADCAST op). */
mk_tensor mk_tensor_broadcast(const mk_tensor *b, const mk_tensor *like);
int64_t mk_tensor_numel(const mk_tensor *t);
bool mk_tensor_is_contiguous(const mk_tensor *t);
/* Do t's elements fill its memory exactly, in some order of its axes (a
 * permuted dense tensor)? Then its memory converts as one run. */
bool mk_tensor_is_dense_permuted(const mk_tensor *t);

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
    void *scratch;             /* scratch_bytes of arena, or NULL */
    size_t scratch_bytes;
    void *dev;                 /* the device's per-model state (stream, handles) */
} mk_launch;

typedef int (*mk_kernel_fn)(const mk_launch *l, mk_error **err);

/* model.c: what a launch's operands need once bound to the node's tensors:
 * broadcast onto the result where the op broadcasts, a pointwise program. */
int mk_launch_operands(mk_launch *l, mk_error **err);

/* ---- the op table (ops.c) ----------------------------------------------- */

/* Kernel families: an op row names one; each device has a kernel (or none) for it. */
#define MK_KERNELS(X) \
    X(POINTWISE) X(MATMUL) X(PERMUTE) X(REPLACE_SLICE) X(RMS_NORM) X(COMPLEX_MUL) \
    X(SLICED_SOFTMAX) X(EMBEDDING) X(ARGMAX) X(CUDNN_GROUP) X(PRODUCT) \
    X(PREFIX_MATMUL) X(CAST) X(DEQUANTIZE) X(FAKE_QUANTIZE) X(SAMPLE) X(CAUSAL_SOFTMAX)
typedef enum {
    MK_KERNEL_NONE,
#define MK_KERNEL_ENUM(k) MK_KERNEL_##k,
    MK_KERNELS(MK_KERNEL_ENUM)
#undef MK_KERNEL_ENUM
    MK_KERNEL_COUNT
} mk_kernel_id;

/* A device's kernel for one family, and the dtypes it takes: model.c checks
 * every data operand and the result against `dtypes` when it binds a launch. */
typedef struct {
    mk_kernel_fn fn;  /* NULL: the device has none */
    unsigned dtypes;  /* MK_DTYPE_BIT of each dtype it handles */
} mk_kernel;

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

const mk_op *mk_op_find(const char *name, size_t len);
/* The row made only by passes that runs on `kernel` (the cuDNN group, the
 * pointwise group), or NULL. */
const mk_op *mk_op_internal(mk_kernel_id kernel);
/* Leaf storage: where a leaf's data live. */
mk_storage mk_op_leaf_storage(const mk_op *op);
/* Is node n's operand k a run-time bound (signature letter r)? */
bool mk_op_operand_is_bound(const mk_op *op, int k);

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
    int pointwise_operands;   /* the most its MK_KERNEL_POINTWISE kernel reads (<= MK_X_IN) */
    int64_t int8_products;    /* the most elements of A its matrix-vector groups take on the
                                 int8 grid (a8_group); 0: none */
    bool row_products;        /* its matrix-vector groups read float32 weights held by rows
                                 ([k, n], n contiguous: an MLP's [in, out]) as well as by
                                 columns (b_rows) */
    /* Per-model state (streams, library handles); NULL state is fine for the CPU. */
    int (*open)(void **state, mk_error **err);
    void (*close)(void *state);
    /* Device memory, allocated at compile only. alloc fails with MK_ERR_NOMEM. */
    void *(*alloc)(void *state, size_t bytes, mk_error **err);
    void (*free)(void *state, void *p);
    int (*upload)(void *state, void *dst, const void *src, size_t bytes, mk_error **err);
    int (*zero)(void *state, void *dst, size_t bytes, mk_error **err);
    /* Called once after launches are bound (CUDA: pinned staging for the copies,
     * capture the graph, and the step loop where the model has next lines).
     * The copies' `host` fields are NULL here. */
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

/* SampleNode's scratch for rows of n: a head (the CPU's keys for one row, or
 * MK_SAMPLE_ROW_BYTES of a GPU's bookkeeping per row), then every row's
 * probabilities (float32: the CPU's; the GPU recomputes them). */
#define MK_SAMPLE_ROW_BYTES 20480
static inline size_t mk_sample_head(int64_t rows, int64_t n) {
    size_t keys = (size_t)n * sizeof(uint64_t), book = (size_t)rows * MK_SAMPLE_ROW_BYTES;
    return ((keys > book ? keys : book) + 255) & ~(size_t)255;
}

/*
 * The CUDA device is a plugin (build/libmoonkaas_cuda.so, from kernels/) that
 * plugin.c opens with dlopen the first time CUDA is asked for, so a CPU-only
 * process maps no CUDA library. It exports one function, MK_CUDA_PLUGIN_ENTRY,
 * returning this table. The plugin is built from the same tree as the core:
 * abi and the struct sizes guard against mixing builds.
 */
#define MK_CUDA_PLUGIN_ABI 11
#define MK_CUDA_PLUGIN_ENTRY "mk_cuda_plugin_entry"
#define MK_CUDA_PLUGIN_FILE "libmoonkaas_cuda.so"
struct mk_fused_group;
struct mk_cudnn_cache;
typedef struct {
    int abi;                      /* MK_CUDA_PLUGIN_ABI */
    size_t node_size, launch_size, op_size; /* sizeof each, as the plugin was built */
    const mk_device_ops *device;
    int (*probe)(char *reason, size_t size); /* 1 if a device is usable, else 0 and why */
    /* cuDNN (NULL when the plugin was built with CUDNN=0) */
    void (*cudnn_cache_free)(struct mk_cudnn_cache *);
    int (*cudnn_compile_group)(struct mk_cudnn_cache **cache, struct mk_fused_group *g,
                               char *why, size_t why_size, mk_error **err);
    void (*cudnn_group_release)(struct mk_fused_group *g);
    /* Writes the kernel of a group's launch (pointwise or matrix–vector) and
     * compiles it with NVRTC for sm_<arch> (or takes it from the disk cache),
     * loading nothing: needs no device (CI checks the generator). */
    int (*generate_check)(const mk_launch *l, int arch, mk_error **err);
    /* The CUDA C of a group's launch, as generate_check compiles it (malloc'd). */
    char *(*generate_source)(const mk_launch *l, mk_error **err);
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

/* ---- cuDNN fusion (core/fusion.c picks groups, kernels/cudnn_fuser.cu runs them) ---- */

#define MK_GROUP_MAX_OPS 16 /* nodes one fused group may replace */
#define MK_GROUP_MAX_INPUTS 4 /* operands of one cuDNN group */

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
    int n_in;                      /* <= MK_GROUP_MAX_INPUTS */
    mk_group_input in[MK_GROUP_MAX_INPUTS];
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
/* The group row's scratch: the cuDNN workspace. */
size_t mk_fusion_scratch(const mk_node *n);

/*
 * kernels/cudnn_fuser.cu, reached through the plugin table: the cache (a cuDNN
 * handle and plans keyed by trace) is freed with cudnn_cache_free;
 * cudnn_compile_group finds or builds g's plan: 0 fused (g->plan,
 * workspace_bytes, cache_hit, tf32 set), 1 cuDNN rejects the group (the reason
 * in `why`), -1 a hard error; cudnn_group_release drops the variant pack and
 * the plan reference. The group's kernel is the device's MK_KERNEL_CUDNN_GROUP.
 */

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
