/*
 * group.h — what a group node computes: the group record every grouping pass
 * makes (group.c), and the body of each kind, which only the pass that makes
 * it, its CPU runner and its CUDA generator read.
 */
#ifndef MK_GROUP_H
#define MK_GROUP_H

#include "expr.h"

/* What a pointwise group node computes (group_pointwise.c): its members'
 * expressions as one program over its operands (in[k] is register k). The
 * root stays in the graph as the group node. */
typedef struct mk_pointwise_group {
    mk_expr program;
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
#define MK_MATVEC_ROWS 4      /* rows of A the devices' groups take; more is a matrix product */
#define MK_MATVEC_ROWS_MAX 16 /* rows of A a device's groups may take (mk_target.matvec_rows):
                                 the generators' limit */
#define MK_ATTENTION_ROWS 8   /* query rows per batch a decode attention group takes */
#define MK_CAUSAL_BLOCK 16    /* query rows a causal attention group scores at a time (the
                                 CPU's scratch: that many rows of scores a head) */
#define MK_INT8_GROUP_MAX 512 /* groups of A on the int8 grid a group takes divide this (powers
                                 of two: CUDA's 16-value lanes of a group share its maximum by
                                 butterfly shuffles within a warp) */
#define MK_LAYER_NORM_FLOATS 8192 /* A's values [m, k] a group with a LayerNorm folded in takes
                                     (CUDA normalises them in shared memory) */
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
    int row_index, row_axis;   /* a ReplaceAt write instead (bounds -1): operand of its
                                  index [m] and its axis of x (result row i goes to
                                  x[i, .., index[i], ..]), else -1 */
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
    MK_PRODUCT_ATTENTION, /* attention: Q @ Kt -> SlicedSoftmax(p) -> PrefixMatMul(., V, p)
                             (decode), or with CausalSoftmax(p) (a prompt's, causal) */
} mk_product_kind;

/* Attention's operands and sizes: Q [B, m, d] @ Kt [B, d, S], softmax of
 * the first p columns, @ V [B, S, n] over the first p rows; only those are read.
 * Causal: the m query rows are m / period runs of period (T) queries, row i
 * seeing the first p - T + 1 + i % T (T <= p <= S). */
typedef struct {
    int q, kt, v, p;          /* operands */
    int64_t batch, m, d, s, n;
    int64_t prefixes;         /* p's values: 1, or one a run of batch / prefixes (a
                                 batch's sequences, each at its own position) */
    bool early;               /* no launch before writes K's or V's rows before p - 1
                                 (early_rows): CUDA loads them before its wait */
    bool causal;              /* a prompt's: CausalSoftmax, the scores never whole (the CPU
                                 makes MK_CAUSAL_BLOCK rows of a head at a time) */
    int64_t period;           /* causal: its T, the queries of one query head (m where a kv
                                 head has one; the softmax read [B, m / T, T, S] else) */
    bool int8_grid;           /* some product group of the graph takes A on runq.c's int8
                                 grid (W8A8), where the sums' last bit can change the text:
                                 CUDA keeps the order that tells runq.c's */
} mk_attention_info;

typedef struct mk_product_group {
    mk_product_kind kind;
    mk_attention_info att;         /* MK_PRODUCT_ATTENTION */
    int64_t m, k;                  /* A [m, k] */
    int a;                         /* operand: A, or the x that the norm normalises */
    int norm_w;                    /* operand: the RmsNorm's or LayerNorm's weight [k], or -1 */
    int norm_b, norm_eps;          /* a LayerNorm's: operands of its bias [k] and eps, else -1 */
    int n_products;
    int b[MK_PRODUCTS_MAX];        /* operand: B_j [k, n_j], float32, float16 or bfloat16, or
                                      int8 times the scales of a DequantizeNode folded in: */
    int b_scale[MK_PRODUCTS_MAX];  /* operand: its scales [k / group, n_j], or -1 */
    bool b_rows[MK_PRODUCTS_MAX];  /* B_j float32 held by rows (n contiguous), on a device
                                      with row_products; else its columns are contiguous */
    int64_t b_group[MK_PRODUCTS_MAX]; /* rows of B per scale (a multiple of 16) */
    int weight_bytes;              /* of the widest weight element its products read (int8: 1) */
    int64_t a8_group;              /* A on runq.c's int8 grid in groups of this many (a
                                      FakeQuantizeNode folded in; every B int8 in blocks of
                                      as many rows): integer dot products; else 0 */
    int n_outs;
    mk_product_out out[MK_PRODUCTS_MAX];
    int n_gathers;                 /* operands read at a row an id picks (gather.c) */
    mk_product_gather gather[MK_GATHERS_MAX];
    int64_t scratch[MK_PRODUCT_MEMBERS]; /* attention: member t's bytes into the CPU's
                                            scratch, or -1 (the group's scratch_bytes: the
                                            CPU's; matrix-vector, A's rows; attention, members) */
} mk_product_group;

/* ---- cuDNN fusion (core/fusion.c picks groups; the CUDA device's prepare
 *      compiles them and kernels/cudnn_fuser.cu runs them) ---- */

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

/* What the CUDA device's prepare found of a group (kernels/cudnn_fuser.cu). */
typedef enum {
    MK_CUDNN_UNTRIED,   /* not compiled yet */
    MK_CUDNN_FUSED,     /* its plan is compiled: plan, workspace_bytes, cache_hit, tf32 */
    MK_CUDNN_REJECTED,  /* cuDNN refused it: why */
    MK_CUDNN_WORKSPACE, /* its plan needs workspace_bytes, more than its scratch */
} mk_cudnn_verdict;

typedef struct mk_fused_group {
    int rank;                      /* of every tensor in the group: 3, or 4 for 4-D pointwise */
    int n_ops;
    mk_group_op op[MK_GROUP_MAX_OPS]; /* evaluation order; the last one is the output */
    int n_in;                      /* <= MK_GROUP_MAX_INPUTS */
    mk_group_input in[MK_GROUP_MAX_INPUTS];
    char *trace;                   /* structural key: ops, shapes, strides, dtypes, operand order */
    struct mk_cudnn_cache **cache; /* the context's plans, where prepare compiles this one */
    size_t trial_limit;            /* the most device memory a trial run of a new plan may
                                      take (prepare's: 0 under max_bytes, which it would pass) */
    /* filled by the CUDA device's prepare (the fuser) */
    mk_cudnn_verdict verdict;
    char why[512];                 /* cuDNN's words: the engine taken, or why it refused */
    struct mk_cudnn_plan *plan;    /* shared through the context's cache */
    size_t workspace_bytes;        /* taken from the planner's scratch */
    bool cache_hit, tf32;
    void *varpack;                 /* bound at capture time to the model's addresses */
} mk_fused_group;

/*
 * What a row group node computes (group_rows.c): a row op over the last axis
 * (SoftmaxNode, LogSoftmaxNode, LayerNormNode of one axis, RmsNormEpsNode)
 * with the pointwise program that makes its x and the one that reads its
 * result, as one loop over rows. Operands 0 .. n_prog - 1 are the programs'
 * (registers); the row op's parameters follow. Every operand is read
 * broadcast to the result's shape, as its node read it.
 */
typedef struct mk_rows_group {
    const struct mk_op *row_op; /* the row op's row */
    int n_prog;                 /* operands the programs read */
    mk_expr prologue;           /* x; n == 0: x is operand `x` as it is */
    int x;
    mk_expr epilogue;           /* the result, reading the row op's value in register
                                   n_prog; n == 0: the row op's value is the result */
    int w, b, eps;              /* operands: the row op's weight, bias and eps, or -1 */
} mk_rows_group;

/*
 * What a convolution group node computes (group_conv.c): its convolution
 * member's product over operands 0 (x) and 1 (the weights), then, each where
 * present, + bias [O] per channel, the batch norm (operands bn .. bn + 4:
 * running mean, var, weight, bias, eps; all constants, as the weights and the
 * bias then are: the device folds it into them once), + residual (of the
 * result's shape), max(., 0).
 */
typedef struct mk_conv_group {
    const struct mk_node *conv; /* the convolution member: its geometry (mk_conv_geom_of) */
    int bias;                   /* operand: [O] values, or -1 */
    int bn;                     /* operand of the batch norm's mean (four more follow), or -1 */
    int residual;               /* operand added after the batch norm, or -1 */
    bool relu;                  /* max(., 0) last */
    bool constant_weights;      /* the weights and the bias are constants: a device may lay
                                   them out (and fold the batch norm) once, at prepare */
} mk_conv_group;

/* ---- groups (group.c) ------------------------------------------------------ */

/*
 * A group node runs several nodes of the graph as one launch. Every grouping
 * pass makes the same record: the nodes it replaced (its members, which leave
 * the graph), the arena scratch its launch takes, and its class: a kind, a
 * name and a describe for reports and the DOT picture. The script printer, the
 * reports, dot.c and model.c go through the record alone; only the pass that
 * makes a kind, its CPU runner and its CUDA generator read the kind's body.
 */
typedef enum {
    MK_GROUP_POINTWISE, /* mk_pointwise_group (group_pointwise.c) */
    MK_GROUP_PRODUCT,   /* mk_product_group: matrix-vector or decode attention (product.c) */
    MK_GROUP_CUDNN,     /* mk_fused_group: one cuDNN graph (fusion.c) */
    MK_GROUP_ROWS,      /* mk_rows_group: a row op with its prologue, epilogue (group_rows.c) */
    MK_GROUP_CONV,      /* mk_conv_group: a convolution with its epilogue (group_conv.c) */
    MK_GROUP_KINDS
} mk_group_kind;

#define MK_GROUP_MEMBERS 32 /* nodes one group may replace (a pointwise program's
                               MK_EXPR_MAX, MK_PRODUCT_MEMBERS, MK_GROUP_MAX_OPS) */

typedef struct {
    mk_group_kind kind;
    const char *name; /* as reports say it: "pointwise" group $7 (line 3): ... */
    /* What group node n computes: brief, a phrase for the DOT picture; else its
     * report line's text after "NAME group $ID (line L): ". */
    void (*describe)(const mk_node *n, bool brief, mk_strbuf *b);
    void (*free_body)(void *body); /* NULL: the body is not the group's to free */
} mk_group_class;

typedef struct mk_group {
    const mk_group_class *cls;
    const struct mk_op *root_op; /* the op of the node that became the group node, or
                                    NULL where the group node is new (product groups) */
    size_t scratch_bytes;        /* arena bytes its launch takes (the planner's) */
    int n_members;
    mk_node *members[MK_GROUP_MEMBERS]; /* the nodes it replaced, graph order, owned */
    void *body;                  /* the kind's record, as cls->kind says */
} mk_group;

/* Makes n a group node of class cls over body, with no members yet. On out of
 * memory fails, freeing body as cls frees it. */
int mk_group_attach(mk_node *n, const mk_group_class *cls, void *body, mk_error **err);
/* Frees the record, its members (and their own groups) and its body. */
void mk_group_free(mk_group *grp);
/* After a grouping pass: the nodes marked gone (the groups' members) leave
 * g's list, the rest renumbered in order and their consumers counted anew. */
void mk_group_leave(mk_graph *g, const bool *gone);
/* " Add $3, Mul $4, Relu $5": the members, then the root's op where it has one. */
void mk_group_put_members(const mk_node *n, mk_strbuf *b);
/* A line per group of g (cuDNN's are the fusion pass's report): "NAME group $ID
 * (line L): <describe>"; counts[kind] += the groups of each kind. */
void mk_group_report(const mk_graph *g, mk_strbuf *b, int counts[MK_GROUP_KINDS]);
/* The group rows' scratch (ops.c): n->group->scratch_bytes. */
size_t mk_group_scratch(const mk_node *n);

static inline void *mk_group_body(const mk_node *n, mk_group_kind kind) {
    return n->group && n->group->cls->kind == kind ? n->group->body : NULL;
}
static inline mk_pointwise_group *mk_node_pointwise(const mk_node *n) {
    return (mk_pointwise_group *)mk_group_body(n, MK_GROUP_POINTWISE);
}
static inline mk_product_group *mk_node_product(const mk_node *n) {
    return (mk_product_group *)mk_group_body(n, MK_GROUP_PRODUCT);
}
static inline struct mk_fused_group *mk_node_cudnn(const mk_node *n) {
    return (struct mk_fused_group *)mk_group_body(n, MK_GROUP_CUDNN);
}
/* A pointwise node alone that CUDA's interpreter (kernels/pointwise.cu, one
 * dtype, at most two operands) does not run: more operands (where, clamp),
 * or a bool operand or result. Its kernel is generated as a group's is. */
static inline bool mk_node_pointwise_mixed(const mk_node *n) {
    if (n->op->kernel != MK_KERNEL_POINTWISE || !n->op->expr) return false;
    bool mixed = n->n_in > 2 || n->dtype == MK_DTYPE_BOOL;
    for (int k = 0; k < n->n_in; k++) mixed = mixed || n->in[k]->dtype == MK_DTYPE_BOOL;
    return mixed;
}
static inline mk_rows_group *mk_node_rows(const mk_node *n) {
    return (mk_rows_group *)mk_group_body(n, MK_GROUP_ROWS);
}
static inline mk_conv_group *mk_node_conv(const mk_node *n) {
    return (mk_conv_group *)mk_group_body(n, MK_GROUP_CONV);
}
/* A group whose kernel the device writes (kernel_source); cuDNN builds its own. */
static inline bool mk_node_generated(const mk_node *n) {
    return mk_node_pointwise(n) || mk_node_product(n) || mk_node_rows(n) ||
           mk_node_pointwise_mixed(n);
}

#endif
