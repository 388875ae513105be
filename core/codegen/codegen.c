/*
 * codegen.c — the CUDA C of each group's kernel, written from the group: a
 * pointwise group's program (core/group.c) as straight-line code over its
 * operands' walks; decode attention as flash-decoding over the first p cached
 * rows; a matrix–vector group (core/product.c) in its own file,
 * matvec.c; a row group (core/group_rows.c) in rows.c. Shapes, strides and constants are baked in, so identical
 * layers give identical source (compiled once: kernels/generated.cu). Also what a
 * launch needs beside its source: its grid and its device scratch. The
 * device code that kernels take as it is (PDL, the fault record and the
 * timeline's stamps, the attention kernel's body with its cluster barriers
 * and mk_arrive, the matrix-vector weights' loads and the MMA) is real CUDA
 * in kernels/skeletons/ (NAME.cuh), which the build embeds as the strings
 * mk_skeleton_NAME (skeletons.h, written by kernels/skeletons/embed.sh); the
 * generator writes what varies, as #defines before it (the attention's
 * shapes, strides and forms).
 *
 * Arithmetic in the pointwise parts is what the interpreter does
 * (kernels/pointwise.cu): __fadd_rn and friends, one rounding per operation, never
 * contracted; expf and tanhf are CUDA's. So a pointwise group gives the bits
 * of one launch per node, on this device and the CPU alike.
 */
#include "codegen.h"
#include "skeletons.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- names and the header ------------------------------------------------------ */

/* An op's part of a kernel's name: its Lua method ("rms_norm"), else its
 * script name in snake case without "Node" ("GroupOutput" -> "group_output"). */
static void put_op_part(mk_strbuf *b, const mk_op *op) {
    if (op->method) {
        mk_strbuf_put(b, "_%s", op->method);
        return;
    }
    const char *n = op->name;
    size_t len = strlen(n);
    if (len > 4 && !strcmp(n + len - 4, "Node")) len -= 4;
    mk_strbuf_put(b, "_");
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        bool up = c >= 'A' && c <= 'Z';
        bool after_lower = i > 0 && n[i - 1] >= 'a' && n[i - 1] <= 'z';
        bool before_lower = i + 1 < len && n[i + 1] >= 'a' && n[i + 1] <= 'z';
        if (up && after_lower && before_lower) mk_strbuf_put(b, "_");
        mk_strbuf_put(b, "%c", up ? c - 'A' + 'a' : c);
    }
}

/* The ops group node n runs, in graph order: its members' (a member that is
 * a group itself, a pointwise group a matrix-vector group took in, by its
 * own), then its root's. Returns k plus the ops put into ops[k..max). */
static int group_ops(const mk_node *n, const mk_op **ops, int k, int max) {
    for (int i = 0; n->group && i < n->group->n_members && k < max; i++) {
        const mk_node *m = n->group->members[i];
        if (m->group) k = group_ops(m, ops, k, max);
        else ops[k++] = m->op;
    }
    if (n->group && n->group->root_op && k < max) ops[k++] = n->group->root_op;
    return k;
}

void mk_codegen_kernel_name(const mk_launch *l, char *name, size_t size) {
    const mk_product_group *pg = mk_node_product(l->node);
    mk_strbuf b = {0};
    mk_strbuf_put(&b, "mk_%s", mk_node_rows(l->node)              ? "rows"
                               : !pg                                 ? "pointwise"
                               : pg->kind == MK_PRODUCT_ATTENTION ? "attention"
                                                                    : "matvec");
    const mk_op *ops[2 * MK_GROUP_MEMBERS];
    int n = group_ops(l->node, ops, 0, 2 * MK_GROUP_MEMBERS);
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen = seen || ops[j] == ops[i];
        if (seen) continue;
        size_t before = b.len;
        put_op_part(&b, ops[i]);
        if (b.len + 6 >= size || b.len > MK_KERNEL_NAME_MAX) { /* long: the first ops only */
            b.len = before;
            if (b.s) b.s[b.len] = 0;
            mk_strbuf_put(&b, "_more");
            break;
        }
    }
    snprintf(name, size, "%s", b.failed || !b.s ? "mk_group" : b.s);
    free(b.s);
}

/* "$5 = SumNode($3, $4)": a member as the script wrote it (attributes left
 * out); the group node, whose operands are the group's now, by its op alone. */
static void put_node(mk_strbuf *b, const mk_node *x, const mk_op *op, bool member) {
    mk_strbuf_put(b, "$%d = %s", x->id, op->name);
    if (!member) return;
    mk_strbuf_put(b, "(");
    for (int k = 0; k < x->n_in; k++) mk_strbuf_put(b, "%s$%d", k ? ", " : "", x->in[k]->id);
    if (x->name) mk_strbuf_put(b, "%s%s", x->n_in ? ", " : "", x->name);
    mk_strbuf_put(b, ")");
}

/* The comment after a kernel's first line: its name, the nodes it runs (its
 * "Source Nodes", with their script lines, result dtypes and shapes) and what
 * each operand i<k> is. Comments: the kernel cache's key skips them. */
/* The lines of the nodes group node n runs, in graph order (put_header). */
static void put_members(mk_strbuf *b, const mk_node *n) {
    char shape[96];
    for (int i = 0; n->group && i < n->group->n_members; i++) {
        const mk_node *m = n->group->members[i];
        if (m->group) { /* a group taken in: its own nodes */
            put_members(b, m);
            continue;
        }
        mk_strbuf_put(b, "//   ");
        put_node(b, m, m->op, true);
        mk_strbuf_put(b, "  # line %d: %s %s\n", m->line, mk_dtype_name(m->dtype),
                      mk_shape_str(m->rank, m->shape, shape, sizeof shape));
    }
    if (n->group && n->group->root_op) {
        mk_strbuf_put(b, "//   ");
        put_node(b, n, n->group->root_op, false);
        mk_strbuf_put(b, "  # line %d: %s %s\n", n->line, mk_dtype_name(n->dtype),
                      mk_shape_str(n->rank, n->shape, shape, sizeof shape));
    }
}

static void put_header(mk_strbuf *b, const mk_launch *l, const char *name) {
    const mk_node *n = l->node;
    char shape[96];
    mk_strbuf_put(b, "// kernel %s\n// Source Nodes:\n", name);
    put_members(b, n);
    mk_strbuf_put(b, "// Operands:\n");
    for (int k = 0; k < n->n_in; k++) {
        const mk_node *x = n->in[k];
        mk_strbuf_put(b, "//   i%d: $%d %s%s%s%s %s %s\n", k, x->id, x->op->name, x->name ? " '" : "",
                      x->name ? x->name : "", x->name ? "'" : "", mk_dtype_name(x->dtype),
                      mk_shape_str(x->rank, x->shape, shape, sizeof shape));
    }
}

char *mk_codegen_program(const char *src) {
    size_t n = strlen(src);
    char *out = malloc(n + 1);
    if (!out) return NULL;
    size_t o = 0, line_start = 0;
    bool had_comment = false, code = false;
    char quote = 0;
    for (size_t i = 0; i < n; i++) {
        char c = src[i], d = i + 1 < n ? src[i + 1] : 0;
        if (quote) {
            out[o++] = c;
            if (c == '\\' && d) out[o++] = src[++i];
            else if (c == quote) quote = 0;
            continue;
        }
        if (c == '"' || c == '\'') {
            quote = c;
            out[o++] = c;
            code = true;
        } else if (c == '/' && d == '/') {
            while (i + 1 < n && src[i + 1] != '\n') i++;
            had_comment = true;
        } else if (c == '/' && d == '*') {
            const char *end = strstr(src + i + 2, "*/");
            i = end ? (size_t)(end - src) + 1 : n;
            had_comment = true;
        } else if (c == '\n') {
            if (had_comment && !code) o = line_start; /* a line of comment only goes */
            else out[o++] = c;
            line_start = o;
            had_comment = code = false;
        } else {
            out[o++] = c;
            if (c != ' ' && c != '\t') code = true;
        }
    }
    if (had_comment && !code) o = line_start;
    out[o] = 0;
    return out;
}

/* ---- source ----------------------------------------------------------------- */

/* Whether e holds an operation of skeletons/pointwise_ops.cuh. */
static bool uses_helpers(const mk_expr *e) {
    for (int j = 0; j < e->n; j++)
        if (e->insn[j].op == MK_X_MOD || e->insn[j].op == MK_X_FLOORDIV) return true;
    return false;
}

/* skeletons/pointwise_ops.cuh where one of the n programs needs it, else "". */
const char *mk_codegen_helpers(const mk_expr *const *programs, int n) {
    for (int i = 0; i < n; i++)
        if (programs[i] && uses_helpers(programs[i])) return mk_skeleton_pointwise_ops;
    return "";
}

/* Instruction j of e as CUDA C: "const T rK = ...;", T float32 or int64 (f32
 * false); the CPU's meaning of each operation (core/cpu/ops.c). */
void mk_codegen_put_insn(mk_strbuf *b, const mk_expr *e, int j, bool f32) {
    const mk_xinsn *in = &e->insn[j];
    char x[8], y[8], z[8];
    snprintf(x, sizeof x, "r%d", in->x);
    snprintf(y, sizeof y, "r%d", in->y);
    snprintf(z, sizeof z, "r%d", in->z);
    const char *T = f32 ? "float" : "long long";
    const char *U = "(unsigned long long)";
    mk_strbuf_put(b, "        const %s r%d = ", T, MK_X_IN + j);
    /* C's float functions; integer programs never hold them (the op rules) */
    static const char *const f1[] = {
        [MK_X_EXP] = "expf",     [MK_X_TANH] = "tanhf",   [MK_X_SQRT] = "__fsqrt_rn",
        [MK_X_LOG] = "logf",     [MK_X_EXP2] = "exp2f",   [MK_X_SIN] = "sinf",
        [MK_X_COS] = "cosf",     [MK_X_ERF] = "erff",     [MK_X_FLOOR] = "floorf",
        [MK_X_CEIL] = "ceilf",   [MK_X_RINT] = "rintf",   [MK_X_EXPM1] = "expm1f",
        [MK_X_LOG1P] = "log1pf",
    };
    static const char *const cmp[] = {[MK_X_GT] = ">",  [MK_X_LT] = "<",  [MK_X_GE] = ">=",
                                      [MK_X_LE] = "<=", [MK_X_EQ] = "==", [MK_X_NE] = "!="};
    switch ((mk_xop)in->op) {
    case MK_X_CONST: mk_strbuf_put(b, "(%s)%a", T, in->k); break; /* the CPU's (T)k */
    case MK_X_NEG:
        if (f32) mk_strbuf_put(b, "-%s", x);
        else mk_strbuf_put(b, "(long long)(0ull - %s%s)", U, x);
        break;
    case MK_X_ABS:
        if (f32) mk_strbuf_put(b, "fabsf(%s)", x);
        else mk_strbuf_put(b, "(%s < 0 ? (long long)(0ull - %s%s) : %s)", x, U, x, x);
        break;
    case MK_X_EXP: case MK_X_TANH: case MK_X_SQRT: case MK_X_LOG: case MK_X_EXP2: case MK_X_SIN:
    case MK_X_COS: case MK_X_ERF: case MK_X_FLOOR: case MK_X_CEIL: case MK_X_RINT: case MK_X_EXPM1:
    case MK_X_LOG1P:
        if (f32) mk_strbuf_put(b, "%s(%s)", f1[in->op], x);
        else mk_strbuf_put(b, "%s", x);
        break;
    case MK_X_ADD:
        if (f32) mk_strbuf_put(b, "__fadd_rn(%s, %s)", x, y);
        else mk_strbuf_put(b, "(long long)(%s%s + %s%s)", U, x, U, y);
        break;
    case MK_X_SUB:
        if (f32) mk_strbuf_put(b, "__fsub_rn(%s, %s)", x, y);
        else mk_strbuf_put(b, "(long long)(%s%s - %s%s)", U, x, U, y);
        break;
    case MK_X_MUL:
        if (f32) mk_strbuf_put(b, "__fmul_rn(%s, %s)", x, y);
        else mk_strbuf_put(b, "(long long)(%s%s * %s%s)", U, x, U, y);
        break;
    case MK_X_DIV: mk_strbuf_put(b, f32 ? "__fdiv_rn(%s, %s)" : "%s", x, y); break;
    case MK_X_POW: mk_strbuf_put(b, f32 ? "powf(%s, %s)" : "%s", x, y); break;
    case MK_X_GT: case MK_X_LT: case MK_X_GE: case MK_X_LE: case MK_X_EQ: case MK_X_NE:
        mk_strbuf_put(b, "(%s %s %s ? (%s)1 : (%s)0)", x, cmp[in->op], y, T, T);
        break;
    case MK_X_SELECT: mk_strbuf_put(b, "(%s != (%s)0 ? %s : %s)", x, T, y, z); break;
    case MK_X_MAX: mk_strbuf_put(b, "(%s > %s ? %s : %s)", x, y, x, y); break;
    case MK_X_MIN: mk_strbuf_put(b, "(%s < %s ? %s : %s)", x, y, x, y); break;
    case MK_X_MOD: mk_strbuf_put(b, "mk_floormod(%s, %s)", x, y); break;
    case MK_X_FLOORDIV: mk_strbuf_put(b, "mk_floordiv(%s, %s)", x, y); break;
    }
    mk_strbuf_put(b, ";\n");
}

/* The kernel of launch l: out (contiguous) = program(in[0], ..., in[n - 1]),
 * computed in the launch's compute dtype (mk_pointwise_compute_dtype): bool
 * operands load as 0 or 1 in it (any byte but 0 as 1), a bool result stores
 * (value != 0). */
static void put_source(mk_strbuf *b, const mk_launch *l) {
    const mk_expr *e = l->expr;
    bool f32 = mk_pointwise_compute_dtype(l) == MK_DTYPE_FLOAT32;
    const char *T = f32 ? "float" : "long long";
    const int64_t *strides[MK_WALK_MAX];
    for (int k = 0; k < l->n_in; k++) strides[k] = l->in[k].stride;
    mk_walk w;
    mk_walk_init(&w, l->out.rank, l->out.shape, l->n_in, strides);
    mk_strbuf_put(b, "// moonkaas pointwise group: %s $%d, %d operands, %d instructions\n",
                  l->node->op->name, l->node->id, l->n_in, e->n);
    char name[MK_KERNEL_NAME_MAX + 16];
    mk_codegen_kernel_name(l, name, sizeof name);
    mk_strbuf_put(b, "%s%sextern \"C\" __global__ void __launch_bounds__(%d)\n%s(%s *__restrict__ o",
                  mk_skeleton_pdl, mk_codegen_helpers(&e, 1), MK_CUDA_BLOCK, name,
                  mk_dtype_row_of(l->out.dtype)->c_type);
    for (int k = 0; k < l->n_in; k++)
        mk_strbuf_put(b, ", const %s *__restrict__ i%d", mk_dtype_row_of(l->in[k].dtype)->c_type, k);
    mk_strbuf_put(b, ", long long n) {\n    MK_PDL_START;\n    MK_PDL_WAIT;\n");
    mk_strbuf_put(b, "    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;\n"
                     "         e += (long long)gridDim.x * blockDim.x) {\n");
    /* offsets: e unravelled over the walk's dims, last first */
    for (int k = 0; k < l->n_in; k++) mk_strbuf_put(b, "        long long p%d = 0;\n", k);
    mk_strbuf_put(b, "        long long rest = e, q;\n");
    for (int d = w.rank - 1; d >= 0; d--) {
        mk_strbuf_put(b, "        q = rest %% %lldLL; rest /= %lldLL;", (long long)w.shape[d],
                      (long long)w.shape[d]);
        for (int k = 0; k < l->n_in; k++)
            if (w.stride[k][d]) mk_strbuf_put(b, " p%d += q * %lldLL;", k, (long long)w.stride[k][d]);
        mk_strbuf_put(b, "\n");
    }
    mk_strbuf_put(b, "        (void)q; (void)rest;\n");
    for (int k = 0; k < e->n_in; k++) {
        if (l->in[k].dtype == MK_DTYPE_BOOL)
            mk_strbuf_put(b, "        const %s r%d = (%s)(i%d[p%d] != 0);\n", T, k, T, k, k);
        else
            mk_strbuf_put(b, "        const %s r%d = i%d[p%d];\n", T, k, k, k);
    }
    for (int j = 0; j < e->n; j++) mk_codegen_put_insn(b, e, j, f32);
    if (l->out.dtype == MK_DTYPE_BOOL)
        mk_strbuf_put(b, "        o[e] = r%d != (%s)0;\n    }\n}\n", MK_X_IN + e->n - 1, T);
    else
        mk_strbuf_put(b, "        o[e] = r%d;\n    }\n}\n", MK_X_IN + e->n - 1);
}

/* PDL (skeletons/pdl.cuh), the fault record and how a generated kernel raises
 * one (fault.cuh), the timeline's stamps (timeline.cuh, after the two
 * constants of their layout), and with them MK_GROUP_START and MK_GROUP_WAIT:
 * the headers the plugin's own kernels include (kernels/cuda_device.h). */
void mk_codegen_put_fault(mk_strbuf *b) {
    mk_strbuf_put(b, "%s#define MK_TIMELINE_BLOCKS %du\n#define MK_TIMELINE_AT %d\n%s%s", mk_skeleton_pdl,
                  MK_TIMELINE_BLOCKS, MK_TIMELINE_AT, mk_skeleton_fault, mk_skeleton_timeline);
}

/* A product kernel's name and parameters (the launch's output, its inputs,
 * the fault record, the launch's index and its device scratch: the arguments
 * mk_cuda_product passes), its opening brace and MK_GROUP_START. */
void mk_codegen_put_entry(mk_strbuf *b, const mk_launch *l) {
    char name[MK_KERNEL_NAME_MAX + 16];
    mk_codegen_kernel_name(l, name, sizeof name);
    mk_strbuf_put(b, "%s(float *__restrict__ o", name);
    for (int k = 0; k < l->n_in; k++) mk_strbuf_put(b, ", void *i%d", k);
    mk_strbuf_put(b, ", mk_fault_rec *fault, int launch, void *aux) {\n    MK_GROUP_START;\n");
}

/* A stamped kernel (kernels/generated.cu) defines MK_TIMELINE_OCCUPANCY as the blocks
 * an SM of its unstamped build, so that the stamps' registers change neither
 * how many blocks share an SM nor, with it, the timeline (doc/performance.md,
 * "Timeline stamps"). */
void mk_codegen_put_head(mk_strbuf *b, long long threads, int min_blocks) {
    mk_strbuf_put(b, "#ifdef MK_TIMELINE_OCCUPANCY\n"
                     "extern \"C\" __global__ void __launch_bounds__(%lld, MK_TIMELINE_OCCUPANCY)\n"
                     "#else\n", threads);
    if (min_blocks > 0)
        mk_strbuf_put(b, "extern \"C\" __global__ void __launch_bounds__(%lld, %d)\n", threads, min_blocks);
    else
        mk_strbuf_put(b, "extern \"C\" __global__ void __launch_bounds__(%lld)\n", threads);
    mk_strbuf_put(b, "#endif\n");
}

/*
 * Decode attention, split along the cache (flash-decoding): chunks of R
 * cached rows (att_rows), CB blocks of 4R threads per query row (batch t,
 * row i), block b taking chunks b, b + CB, ... in turn; chunks at or past p
 * do nothing. CB is the chunks' count, or fewer where the launch would then
 * pass MK_ATT_WAVE blocks (att_blocks): a block per chunk of a long cache is
 * mostly blocks with nothing to do, in several waves. A block scores a
 * chunk's rows (4 threads a row), takes the chunk's max m and the sum l of
 * exp(score - m), and its partial row acc = sum of exp(score - m) V_j. One
 * chunk's block combines every chunk's (m, l, acc), as the softmax over all p
 * scores: M = max m, out = sum acc e^(m - M) / sum l e^(m - M). Rows past p
 * add nothing.
 *
 * R is 64 where q's and V's rows are at most 64 wide (MK_ATT_NARROW), else 32
 * (MK_ATT_CHUNK): fewer chunks to combine for the same registers a thread.
 * Where a product takes A on the int8 grid (W8A8, mk_attention_info.int8_grid)
 * R stays 32: longer chunks sum in another order, which changed runq.c's text.
 *
 * Where a query has at most MK_ATT_CLUSTER chunks and the device has thread
 * block clusters (sm_90), its chunks are one cluster: each writes its part
 * into chunk 0's shared memory (distributed shared memory) and arrives at the
 * cluster barrier; only chunk 0 waits, then combines from its own memory.
 * Every block arrives once at its start, and waits on that before its first
 * write, so that chunk 0's memory is there. Otherwise each writes its part to
 * `part` in global memory and counts itself in `count` (mk_arrive); the last
 * to finish combines them and sets the count back to zero for the next
 * evaluation.
 *
 * Early rows: where no launch before writes the rows before p - 1
 * (mk_attention_info.early: a decode step writes row p - 1 alone) and the
 * chunks are a cluster, a block loads its first chunk's rows before the
 * hint's last before the wait, and only the rest after it, past L1 (which may
 * hold that row's line as it was).
 *
 * Scores from float4 loads of q and K where their rows are 16-byte aligned
 * (att_float4): thread (r, u) takes the 16-byte chunks u, u + 4, ... of its
 * row, a quarter of the load instructions, and a warp's load reads 64
 * contiguous bytes of each of its 8 rows, not 16. Not with early rows, nor
 * on the int8 grid (the order of the sums, as above).
 *
 * The kernel is bound by latency, not bytes (a chunk is a few KB), so it is
 * written as few dependent trips to memory. Before the wait for the launches
 * before, a thread reads p as a hint (it may still change: a launch before may
 * write it); after, it loads p, its part of q and every K value it scores and
 * V value it sums among the hint's rows at once, into registers. Where p turns
 * out not to be the hint, it loads the rows again. Chunk 0 loads every part at
 * once. Sums run in the order of a plain loop (k, then rows, then chunks),
 * each thread's own, in either combine.
 *
 * Where the chunks are not a cluster, each block first sends its chunks'
 * K and V rows below the hint to L2, before the wait (prefetches: L2 is
 * where every write lands, so a row the launch before writes is still read
 * as written; the loads after the wait then find the rest in L2, not DRAM).
 *
 * Every choice here was measured, and the variants tried and not kept are
 * listed: doc/performance.md, "Decode attention".
 */
#define MK_ATT_CHUNK 32
#define MK_ATT_NARROW 64 /* q's and V's rows at most this wide: chunks twice as long */
#define MK_ATT_COMBINE 16 /* chunks whose parts the combining block loads at once */
/* Not 16, a non-portable cluster: slower (doc/performance.md). */
#define MK_ATT_CLUSTER 8  /* the most chunks of a cluster: a portable cluster */
#define MK_ATT_WAVE 512   /* blocks a launch aims for past the cluster's chunks: about one
                             wave (132 SMs, 4 of its blocks each) */

/* Whether a thread's scores take q and K as float4s (see above): rows of
 * contiguous, 16-byte aligned floats, and not on the int8 grid. */
static bool att_float4(const mk_launch *l) {
    const mk_attention_info *a = &mk_node_product(l->node)->att;
    const mk_tensor *q = &l->in[a->q], *kt = &l->in[a->kt];
    return !a->int8_grid && a->d % 4 == 0 && q->stride[2] == 1 && kt->stride[1] == 1 &&
           q->stride[1] % 4 == 0 && q->stride[0] % 4 == 0 && kt->stride[2] % 4 == 0 &&
           kt->stride[0] % 4 == 0 && mk_aligned16(q->data) && mk_aligned16(kt->data);
}

/* Rows of a chunk, chunks of a query's cache, blocks per query, and the floats
 * of partial results of a group. */
static long long att_rows(const mk_attention_info *a) {
    return a->d <= MK_ATT_NARROW && a->n <= MK_ATT_NARROW && !a->int8_grid ? 2 * MK_ATT_CHUNK
                                                                          : MK_ATT_CHUNK;
}
static long long att_chunks(const mk_attention_info *a) {
    return (a->s + att_rows(a) - 1) / att_rows(a);
}
static long long att_blocks(const mk_attention_info *a) {
    long long C = att_chunks(a), cb = MK_ATT_WAVE / (a->batch * a->m);
    if (C <= MK_ATT_CLUSTER || cb >= C) return C;
    return cb < 1 ? 1 : cb;
}
static size_t att_part_floats(const mk_attention_info *a) {
    return (size_t)(a->batch * a->m * att_chunks(a) * (a->n + 2));
}

/* A decode attention group's kernel: skeletons/attention.cuh after what it
 * varies in: its shapes and strides as typed constants, its inputs and forms
 * as macros. */
static void put_attention_source(mk_strbuf *b, const mk_launch *l) {
    const mk_product_group *pg = mk_node_product(l->node);
    const mk_attention_info *a = &pg->att;
    const mk_tensor *q = &l->in[a->q], *kt = &l->in[a->kt], *v = &l->in[a->v];
    const long long M = a->m, D = a->d, S = a->s, N = a->n, C = att_chunks(a), R = att_rows(a);
    const long long CB = att_blocks(a); /* blocks per query */
    const long long T = 4 * R;
    const bool cluster = C >= 2 && C <= MK_ATT_CLUSTER;
    const bool early = a->early && cluster; /* (measured: see above) */
    /* scores: thread (r, u), 4 a row, sums k = u, u + 4, ... or, as float4s,
     * the chunks k / 4 = u, u + 4, ... (DU of them a row): DK of them */
    const bool f4 = att_float4(l) && !early; /* (measured: see above) */
    const long long DU = f4 ? D / 4 : D, DK = (DU + 3) / 4;
    /* values: slot s = (g, n) sums rows g, g + G, ... (VR of them) of column n;
     * thread tid holds slots tid, tid + T, ... (NS of them) */
    long long G = N <= T ? T / N : 1;
    if (G > R) G = R;
    const long long VR = (R + G - 1) / G, NS = (G * N + T - 1) / T;
    /* the combine: thread tid combines columns tid, tid + T, ... (NO of them) */
    const long long NO = (N + T - 1) / T, KU = C < MK_ATT_COMBINE ? C : MK_ATT_COMBINE;
    const long long qs = q->stride[2], ks = kt->stride[1], kr = kt->stride[2];
    const long long vr = v->stride[1], vn = v->stride[2];
    mk_strbuf_put(b, "// moonkaas attention group $%d: [%lld, %lld, %lld] queries, %lld cached rows "
                     "in chunks of %lld, %lld values\n",
                  l->node->id, (long long)a->batch, M, D, S, R, N);
    if (cluster) /* a query's chunks are a cluster where the device has them */
        mk_strbuf_put(b, "#if __CUDA_ARCH__ >= 900\n#define MK_CLUSTER\n#endif\n");
    mk_codegen_put_fault(b);
    mk_strbuf_put(b, "%s%s", mk_skeleton_cluster, mk_skeleton_arrive);
    /* attention.cuh's shapes and strides, typed: int where the skeleton's
     * arithmetic is int, long long where it is 64-bit */
    const long long KL = (D * 4 + 127) / 128, VL = (N * 4 + 127) / 128; /* lines a row */
    mk_strbuf_put(b, "namespace att {\n"
                     "constexpr int T = %lld, C = %lld, R = %lld, DK = %lld, DU = %lld, N = %lld, N2 = %lld;\n"
                     "constexpr int G = %lld, GN = %lld, VR = %lld, NS = %lld, RED = %lld, NO = %lld, KU = %lld;\n"
                     "constexpr int KL = %lld, VL = %lld, prefix_fault = %d;\n"
                     "constexpr long long CB = %lldLL, M = %lldLL, S = %lldLL, PB = %lldLL, part = %lldLL;\n"
                     "constexpr long long q0 = %lldLL, q1 = %lldLL, qs = %lldLL, k0 = %lldLL, kr = %lldLL, ks = %lldLL;\n"
                     "constexpr long long v0 = %lldLL, vr = %lldLL, vn = %lldLL;\n"
                     "}\n",
                  T, C, R, DK, DU, N, N + 2, G, G * N, VR, NS, G * N > T ? G * N : T, NO, KU, KL, VL,
                  (int)MK_FAULT_PREFIX, CB, M, S, (long long)(a->batch / a->prefixes),
                  (long long)att_part_floats(a),
                  (long long)q->stride[0], (long long)q->stride[1], qs, (long long)kt->stride[0], kr, ks,
                  (long long)v->stride[0], vr, vn);
    mk_strbuf_put(b, "#define MK_IN_Q i%d\n#define MK_IN_K i%d\n#define MK_IN_V i%d\n#define MK_IN_P i%d\n"
                     "#define MK_ATT_EARLY %d\n#define MK_ATT_FLOAT4 %d\n#define MK_ATT_PREFETCH %d\n",
                  a->q, a->kt, a->v, a->p, early, f4, !cluster && ks == 1 && vn == 1);
    mk_codegen_put_head(b, T, 0);
    if (cluster) mk_strbuf_put(b, "#ifdef MK_CLUSTER\n__cluster_dims__(%lld, 1, 1)\n#endif\n", C);
    mk_codegen_put_entry(b, l);
    mk_strbuf_put(b, "%s", mk_skeleton_attention);
}

/* Device scratch of a group's launch: the attention's partial results and
 * counts, or the ArgMax results' keys and counts; 0 for none. */
size_t mk_codegen_group_aux_bytes(const mk_product_group *pg) {
    if (pg->kind == MK_PRODUCT_ATTENTION)
        return att_part_floats(&pg->att) * sizeof(float) +
               (size_t)(pg->att.batch * pg->att.m) * sizeof(unsigned int);
    return mk_codegen_product_aux_bytes(pg);
}

/* The source of a group's launch, whichever kind. */
void mk_codegen_group_source(mk_strbuf *b, const mk_launch *l) {
    const mk_product_group *pg = mk_node_product(l->node);
    if (mk_node_rows(l->node)) mk_codegen_rows_source(b, l);
    else if (!pg) put_source(b, l); /* a pointwise group, or one node the interpreter does not run */
    else if (pg->kind == MK_PRODUCT_ATTENTION) put_attention_source(b, l);
    else mk_codegen_product_source(b, l);
}

/* The grid of a matrix-vector, attention or row group's launch. */
void mk_codegen_group_grid(const mk_launch *l, unsigned int *blocks, unsigned int *threads) {
    const mk_product_group *pg = mk_node_product(l->node);
    if (!pg) mk_codegen_rows_grid(l, blocks, threads);
    else if (pg->kind == MK_PRODUCT_ATTENTION) { /* att_blocks blocks per query */
        *blocks = mk_cuda_blocks(pg->att.batch * pg->att.m * att_blocks(&pg->att), 1);
        *threads = (unsigned int)(4 * att_rows(&pg->att));
    } else
        mk_codegen_product_grid(l, blocks, threads);
}

/* The source of a group's launch as the plugin compiles it (see codegen.h):
 * after the first line, the comment naming the group, the timeline's and
 * MK_NO_MMA's defines (product kernels), then the header (put_header). */
char *mk_codegen_source(const mk_launch *l, bool stamp, int occupancy, mk_error **err) {
    if (!(mk_node_generated(l->node) &&
          (l->expr || mk_node_product(l->node) || mk_node_rows(l->node)))) {
        MK_INTERNAL(err, "not a group's launch");
        return NULL;
    }
    const mk_product_group *pg = mk_node_product(l->node);
    if (pg && pg->kind == MK_PRODUCT_ATTENTION && pg->att.causal) {
        mk_fail(err, MK_ERR_DEVICE, l->node->line, l->node->column,
                "%s $%d is a causal attention group, which only the CPU runs: no CUDA source",
                l->node->op->name, l->node->id);
        return NULL;
    }
    mk_strbuf src = {0};
    mk_codegen_group_source(&src, l);
    const char *line = NULL, *no_mma = getenv("MK_CUDA_NO_MMA");
    bool plain = no_mma && !strcmp(no_mma, "1");
    if (!src.failed && src.s) line = strchr(src.s, '\n');
    if (line) {
        bool product = mk_node_product(l->node) != NULL;
        char occ[64] = "", name[MK_KERNEL_NAME_MAX + 16];
        if (product && stamp && occupancy > 0)
            snprintf(occ, sizeof occ, "#define MK_TIMELINE_OCCUPANCY %d\n", occupancy);
        mk_codegen_kernel_name(l, name, sizeof name);
        mk_strbuf full = {0};
        mk_strbuf_put(&full, "%.*s%s%s%s", (int)(line + 1 - src.s), src.s,
                      product && stamp ? "#define MK_TIMELINE\n" : "", occ,
                      product && plain ? "#define MK_NO_MMA\n" : "");
        put_header(&full, l, name);
        mk_strbuf_put(&full, "%s", line + 1);
        free(src.s);
        src = full;
    }
    if (src.failed) {
        free(src.s);
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "writing a group's kernel");
        return NULL;
    }
    return src.s;
}
