/*
 * rows.c — the CUDA C of a row group (core/group_rows.c: a softmax,
 * log_softmax, one-axis layer_norm or rms_norm over the last axis, with the
 * pointwise program that makes its x and the one that reads its result), as
 * one kernel: RT threads take a row, thread t its elements t, t + RT, ...;
 * x is computed once through the prologue (registers, or the result's row
 * where a thread would hold more than MK_ROWS_REGS of them: each thread
 * reads back only what it wrote), reduced (skeletons/rows.cuh), and each
 * element written through the epilogue.
 *
 * A row of at most MK_ROWS_WARP elements is a warp's (MK_ROWS_PER_BLOCK rows
 * a block); a longer one a block's, of the fewest threads (128 .. 1024) that
 * leave a thread at most 8 elements. Every operand is read at its broadcast
 * strides, baked in, as the CPU reads it (core/cpu/reduce.c's
 * mk_cpu_rows_group).
 *
 * Numerics: the CPU's row functions step by step, sums in double (the max,
 * the sum of exp(x - max), the mean, the sum of squares) and each float
 * operation rounded once (__fmul_rn and friends, never contracted). Only the
 * order of the double sums differs (a tree, not a loop) and expf and logf
 * are CUDA's (2 ulp), so results agree with the CPU's within a few float32
 * ulps at any row length.
 */
#include "codegen.h"
#include "skeletons.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MK_ROWS_WARP 128      /* a row of at most this many elements is a warp's */
#define MK_ROWS_PER_BLOCK 4   /* warp rows per block */
#define MK_ROWS_REGS 16       /* elements a thread keeps in registers; more: in the result */

/* The launch's plan, read by the emitter and the grid alike. */
typedef struct {
    long long len, rows;
    int rt;      /* threads a row */
    int rb;      /* rows a block */
    int pt;      /* elements a thread */
    bool spill;  /* x kept in the result's row, not registers */
} rows_plan;

static rows_plan plan_of(const mk_launch *l) {
    rows_plan p;
    p.len = l->out.shape[l->out.rank - 1];
    p.rows = p.len ? mk_tensor_numel(&l->out) / p.len : 0;
    if (p.len <= MK_ROWS_WARP) {
        p.rt = 32;
        p.rb = MK_ROWS_PER_BLOCK;
    } else {
        p.rt = 128;
        while (p.rt < 1024 && (p.len + p.rt - 1) / p.rt > 8) p.rt *= 2;
        p.rb = 1;
    }
    p.pt = (int)((p.len + p.rt - 1) / p.rt);
    p.spill = p.pt > MK_ROWS_REGS;
    return p;
}

void mk_codegen_rows_grid(const mk_launch *l, unsigned int *blocks, unsigned int *threads) {
    rows_plan p = plan_of(l);
    *blocks = mk_cuda_blocks(p.rows, p.rb);
    *threads = (unsigned int)(p.rt * p.rb);
}

/* Whether program e reads operand register k. */
static bool reads(const mk_expr *e, int k) {
    for (int j = 0; j < e->n; j++) {
        const mk_xinsn *in = &e->insn[j];
        int a = mk_xop_arity(in->op);
        if ((a > 0 && in->x == k) || (a > 1 && in->y == k) || (a > 2 && in->z == k)) return true;
    }
    return false;
}

/* "        const float rK = (float)iK[bK + j * S];": operand k at element j. */
static void put_load(mk_strbuf *b, const mk_tensor *in, int k, const char *as) {
    long long s = in[k].stride[in[k].rank - 1];
    mk_strbuf_put(b, "        const float %s = (float)i%d[b%d", as, k, k);
    if (s) mk_strbuf_put(b, " + j * %lldLL", s);
    mk_strbuf_put(b, "];\n");
}

/* The loop over a thread's elements j of its row; X names element j's x. */
static void put_loop(mk_strbuf *b, const rows_plan *p) {
    if (p->spill)
        mk_strbuf_put(b, "    for (long long j = t; j < LEN; j += RT) {\n");
    else
        mk_strbuf_put(b, "#pragma unroll\n    for (int i = 0; i < PT; i++) {\n"
                         "        const long long j = t + (long long)i * RT;\n"
                         "        if (j >= LEN) break;\n");
}

static void row_body(mk_strbuf *b, const mk_launch *l, const mk_rows_group *rg, const rows_plan *pp);

void mk_codegen_rows_source(mk_strbuf *b, const mk_launch *l) {
    const mk_rows_group *rg = mk_node_rows(l->node);
    const rows_plan p = plan_of(l);
    mk_strbuf_put(b, "// moonkaas row group: %s $%d, %lld rows of %lld, %d operands\n",
                  rg->row_op->name, l->node->id, p.rows, p.len, l->n_in);
    const mk_expr *programs[2] = {&rg->prologue, &rg->epilogue};
    mk_strbuf_put(b, "%s%s", mk_skeleton_pdl, mk_codegen_helpers(programs, 2));
    mk_strbuf_put(b, "namespace rows {\nconstexpr int RT = %d, RB = %d, PT = %d;\n"
                     "constexpr long long LEN = %lldLL, ROWS = %lldLL;\n}\n",
                  p.rt, p.rb, p.pt, p.len, p.rows);
    mk_strbuf_put(b, "%s", mk_skeleton_rows);
    char name[MK_KERNEL_NAME_MAX + 16];
    mk_codegen_kernel_name(l, name, sizeof name);
    mk_strbuf_put(b, "extern \"C\" __global__ void __launch_bounds__(%d)\n%s(float *__restrict__ out",
                  p.rt * p.rb, name);
    for (int k = 0; k < l->n_in; k++)
        mk_strbuf_put(b, ", const %s *__restrict__ i%d", mk_dtype_row_of(l->in[k].dtype)->c_type, k);
    mk_strbuf_put(b, ") {\n    using namespace rows;\n    MK_PDL_START;\n    MK_PDL_WAIT;\n");
    if (p.rt > 32) mk_strbuf_put(b, "    __shared__ double sh[RT / 32];\n");
    else mk_strbuf_put(b, "    double *sh = nullptr;\n");
    mk_strbuf_put(b, "    const int t = threadIdx.x %% RT;\n"
                     "    for (long long r = (long long)blockIdx.x * RB + threadIdx.x / RT; r < ROWS;\n"
                     "         r += (long long)gridDim.x * RB) {\n");
    mk_strbuf body = {0}; /* the row's code, indented one more step below */
    row_body(&body, l, rg, &p);
    for (const char *at = body.s; at && *at;) {
        size_t n = strcspn(at, "\n");
        mk_strbuf_put(b, "%s%.*s\n", *at == '#' ? "" : "    ", (int)n, at);
        at += n + (at[n] == '\n');
    }
    if (body.failed) b->failed = true;
    free(body.s);
    mk_strbuf_put(b, "    }\n}\n");
}

/* One row r's code: its operands' rows, x, the statistics, the result. */
static void row_body(mk_strbuf *b, const mk_launch *l, const mk_rows_group *rg, const rows_plan *pp) {
    const rows_plan p = *pp;
    const mk_kernel_id kind = rg->row_op->kernel;
    const bool softmax = kind == MK_KERNEL_SOFTMAX || kind == MK_KERNEL_LOG_SOFTMAX;
    const int last = l->out.rank - 1;
    mk_tensor in[MK_MAX_INPUTS]; /* each operand at the result's shape */
    for (int k = 0; k < l->n_in; k++) in[k] = mk_tensor_broadcast(&l->in[k], &l->out);
    const char *X = p.spill ? "o[j]" : "v[i]";
    mk_strbuf_put(b, "    float *__restrict__ o = out + r * LEN;\n");
    /* each operand's row: r unravelled over the leading axes, last first */
    bool used[MK_MAX_INPUTS] = {0};
    for (int k = 0; k < l->n_in; k++)
        used[k] = (rg->prologue.n && reads(&rg->prologue, k)) || (!rg->prologue.n && k == rg->x) ||
                  (rg->epilogue.n && reads(&rg->epilogue, k)) || k == rg->w || k == rg->b ||
                  k == rg->eps;
    for (int k = 0; k < l->n_in; k++)
        if (used[k] && k != rg->eps) mk_strbuf_put(b, "    long long b%d = 0;\n", k);
    mk_strbuf_put(b, "    {\n        long long rest = r, q;\n");
    for (int d = last - 1; d >= 0; d--) {
        mk_strbuf_put(b, "        q = rest %% %lldLL; rest /= %lldLL;", (long long)l->out.shape[d],
                      (long long)l->out.shape[d]);
        for (int k = 0; k < l->n_in; k++)
            if (used[k] && k != rg->eps && in[k].stride[d])
                mk_strbuf_put(b, " b%d += q * %lldLL;", k, (long long)in[k].stride[d]);
        mk_strbuf_put(b, "\n");
    }
    mk_strbuf_put(b, "        (void)q; (void)rest;\n    }\n");

    /* x, once, through the prologue */
    if (!p.spill) mk_strbuf_put(b, "    float v[PT];\n");
    put_loop(b, &p);
    if (rg->prologue.n) {
        for (int k = 0; k < rg->prologue.n_in; k++)
            if (reads(&rg->prologue, k)) {
                char r[16];
                snprintf(r, sizeof r, "r%d", k);
                put_load(b, in, k, r);
            }
        for (int j = 0; j < rg->prologue.n; j++) mk_codegen_put_insn(b, &rg->prologue, j, true);
        mk_strbuf_put(b, "        %s = r%d;\n    }\n", X, MK_X_IN + rg->prologue.n - 1);
    } else {
        put_load(b, in, rg->x, "x");
        mk_strbuf_put(b, "        %s = x;\n    }\n", X);
    }

    /* the row's statistics */
    if (softmax) {
        mk_strbuf_put(b, "    float m = neg_inf();\n");
        put_loop(b, &p);
        mk_strbuf_put(b, "        m = %s > m ? %s : m;\n    }\n    m = row_max(m, sh);\n", X, X);
        mk_strbuf_put(b, "    double s = 0.0;\n");
        put_loop(b, &p);
        mk_strbuf_put(b, "        const float e = expf(__fsub_rn(%s, m));\n", X);
        if (kind == MK_KERNEL_SOFTMAX) mk_strbuf_put(b, "        %s = e;\n", X);
        mk_strbuf_put(b, "        s += (double)e;\n    }\n    s = row_sum(s, sh);\n");
        if (kind == MK_KERNEL_SOFTMAX) mk_strbuf_put(b, "    const float inv = (float)(1.0 / s);\n");
        else mk_strbuf_put(b, "    const float ls = (float)log(s);\n");
    } else {
        if (kind == MK_KERNEL_LAYER_NORM) {
            mk_strbuf_put(b, "    double s = 0.0;\n");
            put_loop(b, &p);
            mk_strbuf_put(b, "        s += (double)%s;\n    }\n", X);
            mk_strbuf_put(b, "    const float mean = (float)(row_sum(s, sh) / (double)LEN);\n");
        } else
            mk_strbuf_put(b, "    const float mean = 0.0f;\n");
        mk_strbuf_put(b, "    double ss = 0.0;\n");
        put_loop(b, &p);
        mk_strbuf_put(b, "        const double d = (double)%s - (double)mean;\n"
                         "        ss += d * d;\n    }\n", X);
        mk_strbuf_put(b, "    const float inv = (float)(1.0 / sqrt(row_sum(ss, sh) / (double)LEN + "
                         "(double)(float)i%d[0]));\n", rg->eps);
    }

    /* each element: the row op's value, then the epilogue */
    put_loop(b, &p);
    if (kind == MK_KERNEL_SOFTMAX)
        mk_strbuf_put(b, "        const float y = __fmul_rn(%s, inv);\n", X);
    else if (kind == MK_KERNEL_LOG_SOFTMAX)
        mk_strbuf_put(b, "        const float y = __fsub_rn(__fsub_rn(%s, m), ls);\n", X);
    else {
        put_load(b, in, rg->w, "w");
        mk_strbuf_put(b, "        %s y = __fmul_rn(__fmul_rn(__fsub_rn(%s, mean), inv), w);\n",
                      rg->b >= 0 ? "float" : "const float", X);
        if (rg->b >= 0) {
            put_load(b, in, rg->b, "bias");
            mk_strbuf_put(b, "        y = __fadd_rn(y, bias);\n");
        }
    }
    if (rg->epilogue.n) {
        for (int k = 0; k < rg->n_prog; k++)
            if (reads(&rg->epilogue, k)) {
                char r[16];
                snprintf(r, sizeof r, "r%d", k);
                put_load(b, in, k, r);
            }
        mk_strbuf_put(b, "        const float r%d = y;\n", rg->n_prog);
        for (int j = 0; j < rg->epilogue.n; j++) mk_codegen_put_insn(b, &rg->epilogue, j, true);
        mk_strbuf_put(b, "        o[j] = r%d;\n    }\n", MK_X_IN + rg->epilogue.n - 1);
    } else
        mk_strbuf_put(b, "        o[j] = y;\n    }\n");
}
