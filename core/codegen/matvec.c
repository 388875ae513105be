/*
 * matvec.c — the CUDA C of a matrix–vector group's kernel
 * (core/product.c): a warp per column pair of each result (or two pairs:
 * warp_columns), W warps (slices) splitting k, with its prologue (the RmsNorm
 * folded in, A staged in shared memory) and its epilogues (the result's
 * program, rotation, row writes, ArgMax). A lane's step comes in two forms,
 * in matvec_step.c with the weights' loads and A's staging: float32
 * A (mk_mv_put_weight_loads and mk_mv_put_float_math, the weights of the first steps
 * loaded before the PDL wait: mk_mv_put_preloads; int8 a step ahead: loads_ahead)
 * and A on the int8 grid (put_grid_copy and mk_mv_put_grid_step). Large int8
 * launches instead take the tensor-core form (matvec_tc.c: a warp
 * per 16 columns, the integer MMA, A as fixed-point digits). What the three
 * files share is declared in matvec.h.
 * What it shares with the other generated kernels is in codegen.c (the
 * instructions of a program, the head and entry, mk_codegen_put_fault's PDL,
 * fault record and stamps); the device code pasted as it is (those, the
 * weights' loads, A's staging and the RmsNorm's terms, the MMA, the ArgMax's
 * keys and last block) is real CUDA in kernels/skeletons/.
 *
 * Why each width, count and form was chosen, with the figures and the forms
 * tried and not kept: doc/performance.md, "Matrix–vector groups".
 */
#include "matvec.h"
#include "skeletons.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* "long long VAR = offset of element E of t read as (rank, shape)": e unravelled
 * over the shape, t broadcast onto it (dims of size 1 repeat). */
static void put_offset(mk_strbuf *b, const char *var, const char *e, const mk_tensor *t,
                       int rank, const int64_t *shape) {
    mk_tensor like = {.rank = rank};
    memcpy(like.shape, shape, sizeof like.shape);
    mk_tensor bt = mk_tensor_broadcast(t, &like);
    mk_walk w = mk_cuda_walk1(rank, shape, bt.stride);
    mk_strbuf_put(b, "            long long %s = 0;\n            { long long rest = %s, q;", var, e);
    for (int d = w.rank - 1; d >= 0; d--) {
        mk_strbuf_put(b, " q = rest %% %lldLL; rest /= %lldLL;", (long long)w.shape[d],
                      (long long)w.shape[d]);
        if (w.stride[0][d]) mk_strbuf_put(b, " %s += q * %lldLL;", var, (long long)w.stride[0][d]);
    }
    mk_strbuf_put(b, " (void)q; (void)rest; }\n");
}

/*
 * Weights of a matrix–vector group in any of its dtypes: the element type of
 * the generated pointer, and the suffix of the functions that load and widen
 * one, four, eight or sixteen elements to float (kernels/skeletons/weights.cuh;
 * exact, int8 multiplied by its group's scale where the caller reads it).
 *
 * Weights are read once a step, so they load evict-first (__ldcs, ld.global.cs):
 * streaming them through L2 then leaves there what is read again, the
 * kernels' code, the caches' rows and the activations.
 */
static const char *weight_ctype(mk_dtype d) {
    switch (d) {
    case MK_DTYPE_FLOAT16:
    case MK_DTYPE_BFLOAT16: return "unsigned short";
    case MK_DTYPE_INT8: return "signed char";
    default: return "float";
    }
}

const char *mk_mv_weight_suffix(mk_dtype d) {
    switch (d) {
    case MK_DTYPE_FLOAT16: return "f16";
    case MK_DTYPE_BFLOAT16: return "bf16";
    case MK_DTYPE_INT8: return "i8";
    default: return "f32";
    }
}

/* Bytes of a matrix–vector group's device scratch: per ArgMax result, the best
 * key of each row and a count (zero between launches); 0 without one. */
static long long argmax_aux_offset(const mk_product_group *pg, int o) {
    long long at = 0;
    for (int k = 0; k < o; k++)
        if (pg->out[k].argmax) at += 8 * pg->m + 8;
    return at;
}

/* The column stride of the weight that source s of result r reads. */
long long mk_mv_ldb_of(const mk_launch *l, const mk_product_group *pg, const mk_product_out *r,
                        int s) {
    return (long long)l->in[pg->b[r->src[s].product]].stride[1];
}

/*
 * Warps per column pair (1, 2, 4 or 8; per two pairs where a warp takes 4
 * columns, warp_columns, so that its launch has half the warps), splitting k:
 * enough warps in flight
 * to read the weights at full bandwidth when the columns are few (a layer's
 * [768, 768] has 384 pairs, 132 SMs want thousands of warps), none idle: a
 * launch aims for 3,072 warps per byte of weight element, at most 8,192.
 * A slice's step here is 128 float32 elements whatever the dtype (counting
 * the dtype's own step was slower).
 *
 * An int8 launch of 4 columns a warp that would take 2 slices takes 3, in
 * blocks of 12 warps (mk_mv_block_warps), so that Llama-2-7B's wo and w2 fill the
 * SMs in one wave; not for 2-byte weights, where it lost.
 */
static int warp_columns(const mk_launch *l, const mk_product_group *pg);

static int product_slices(const mk_launch *l, const mk_product_group *pg) {
    long long pairs = 0;
    for (int o = 0; o < pg->n_outs; o++) pairs += pg->out[o].n / 2;
    long long target = 3072 * pg->weight_bytes;
    if (target > 8192) target = 8192;
    int W = 1;
    while (W < 8 && pairs * W < target && pg->k >= 128LL * 2 * W) W *= 2;
    if (W == 2 && pg->weight_bytes == 1 && warp_columns(l, pg) == 4) W = 3;
    return W;
}

/* Warps a block where W warps take a group of columns, a slice of k each
 * (product_slices; mk_mv_tc_slices, never 3): MK_MV_WARPS, or for W = 3, 12 (4
 * groups), so that a block holds whole groups. */
int mk_mv_block_warps(int W) { return W == 3 ? 12 : MK_MV_WARPS; }

/* Result o's index among the group's ArgMax results. */
int mk_mv_argmax_slot(const mk_product_group *pg, int o) {
    int slot = 0;
    for (int k = 0; k < o; k++) slot += pg->out[k].argmax;
    return slot;
}

/* The end of a kernel with ArgMax results: thread 0 of each block holding
 * warps of such a result calls mk_argmax_finish (kernels/skeletons/argmax.cuh,
 * which says how the blocks meet). */
void mk_mv_put_argmax_blocks(mk_strbuf *b, const mk_product_group *pg, long long per) {
    int M = (int)pg->m;
    mk_strbuf_put(b, "    __syncthreads();\n    if (threadIdx.x != 0) return;\n");
    long long start = 0;
    for (int o = 0; o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        long long pairs = r->n / 2, first = start / per, last = (start + pairs - 1) / per;
        start += pairs;
        if (!r->argmax) continue;
        mk_strbuf_put(b, "    if (blockIdx.x >= %lldu && blockIdx.x <= %lldu)\n"
                         "        mk_argmax_finish((unsigned long long *)((char *)aux + %lldLL), %d, "
                         "sbest + %d, %lldu, %lldu, (long long *)(o + %lldLL));\n",
                      first, last, argmax_aux_offset(pg, o), M, mk_mv_argmax_slot(pg, o) * M, first,
                      last, (long long)r->offset);
    }
}

/* A result's sources that are not products (operands its program reads). */
int mk_mv_plain_sources(const mk_product_out *r) {
    int n = 0;
    for (int s = 0; s < r->n_src; s++) n += r->src[s].product < 0;
    return n;
}

/*
 * What result o's epilogue reads besides its products (its other sources, the
 * rotation's (cos, sin) pairs, a row write's bounds), loaded by the thread
 * that writes it (lane 0 of the first slice) as soon as the launches before
 * are done, into registers: pre[m][c][t] (the t-th plain source at row m,
 * column n0 + c), rot[m], wbegin and wend (a ReplaceAt's: widx[m], row m's
 * index). Its loads then overlap the
 * products' instead of following their sums, one trip to memory less.
 */
void mk_mv_put_epilogue_loads(mk_strbuf *b, const mk_mv_plan *p, int o, int C, const char *who) {
    const mk_launch *l = p->l;
    const mk_product_group *pg = p->pg;
    const mk_product_out *r = &pg->out[o];
    int M = (int)pg->m;
    long long N = (long long)r->n;
    if (r->row_x < 0 && r->rotate < 0 && !mk_mv_plain_sources(r)) return;
    mk_strbuf_put(b, "        if (%s) {\n", who);
    if (r->row_index >= 0)
        mk_strbuf_put(b, "            for (int m = 0; m < %d; m++) widx[m] = ((const long long *)i%d)[m];\n",
                      M, r->row_index);
    else if (r->row_x >= 0)
        mk_strbuf_put(b, "            wbegin = *(const long long *)i%d; wend = *(const long long *)i%d;\n",
                      r->row_begin, r->row_end);
    if (mk_mv_plain_sources(r)) {
        mk_strbuf_put(b, "#pragma unroll\n            for (int m = 0; m < %d; m++)\n"
                         "#pragma unroll\n            for (int c = 0; c < %d; c++) {\n"
                         "            const long long e = m * %lldLL + n0 + c;\n", M, C, N);
        for (int s = 0, t = 0; s < r->n_src; s++) {
            const mk_product_source *src = &r->src[s];
            if (src->product >= 0) continue;
            char var[16];
            snprintf(var, sizeof var, "p%d", s);
            put_offset(b, var, "e", &l->in[src->in], src->rank, src->shape);
            mk_strbuf_put(b, "            pre[m][c][%d] = ((const float *)i%d)[p%d];\n", t++, src->in, s);
        }
        mk_strbuf_put(b, "            }\n");
    }
    if (r->rotate >= 0) { /* each pair h's (cos, sin) */
        mk_strbuf_put(b, "#pragma unroll\n            for (int m = 0; m < %d; m++)\n"
                         "#pragma unroll\n            for (int h = 0; h < %d; h++) {\n"
                         "            const long long e0 = m * %lldLL + n0 + 2 * h;\n", M, C / 2, N);
        put_offset(b, "q0", "e0", &l->in[r->rotate], r->rotate_rank, r->rotate_shape);
        put_offset(b, "q1", "e0 + 1", &l->in[r->rotate], r->rotate_rank, r->rotate_shape);
        mk_strbuf_put(b, "            rot[m][h][0] = ((const float *)i%d)[q0]; rot[m][h][1] = ((const float *)i%d)[q1];\n"
                         "            }\n", r->rotate, r->rotate);
    }
    mk_strbuf_put(b, "        }\n");
}

/* B{j}: the first of column n0's weights of each product result r reads (and
 * S{j}, its int8 scales). */
void mk_mv_put_column_pointers(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                               const int *prods, int np) {
    const mk_launch *l = p->l;
    const mk_product_group *pg = p->pg;
    for (int j = 0; j < np; j++) {
        int pj = r->src[prods[j]].product, bk = pg->b[pj];
        const char *ct = weight_ctype(l->in[bk].dtype);
        mk_strbuf_put(b, "        const %s *B%d = (const %s *)i%d + n0 * %lldLL;\n", ct, j, ct, bk,
                      (long long)l->in[bk].stride[1]);
        if (pg->b_scale[pj] >= 0) /* int8: column n0's scales */
            mk_strbuf_put(b, "        const float *S%d = (const float *)i%d + n0 * %lldLL;\n", j,
                          pg->b_scale[pj], (long long)l->in[pg->b_scale[pj]].stride[1]);
    }
}

/* The sources of result o that are products, and their count. */
int mk_mv_product_sources(const mk_product_out *r, int *prods) {
    int np = 0;
    for (int s = 0; s < r->n_src; s++)
        if (r->src[s].product >= 0) prods[np++] = s;
    return np;
}

/* The most products one result of the group reads (at least 1). */
int mk_mv_most_products(const mk_product_group *pg) {
    int most = 1;
    for (int o = 0; o < pg->n_outs; o++) {
        int prods[MK_X_IN], n = mk_mv_product_sources(&pg->out[o], prods);
        if (n > most) most = n;
    }
    return most;
}

/* Result o's code for the C columns of warp index `p` (local to o). */
static void put_result(mk_strbuf *b, const mk_mv_plan *p, int o, int phase) {
    const mk_product_group *pg = p->pg;
    int C = p->C, E = p->E, W = p->W, pre = p->pre;
    bool staged = p->staged;
    const mk_product_out *r = &pg->out[o];
    int M = (int)pg->m;
    long long K = (long long)pg->k;
    int prods[MK_X_IN], np = mk_mv_product_sources(r, prods); /* the products it reads, as sources */
    mk_strbuf_put(b, "        const long long n0 = %d * p;\n", C);
    mk_strbuf_put(b, "        float acc[%d][%d][%d];\n", M, C, np);
    if (phase == 2) { /* the slices' sums: this warp's and the next W - 1's */
        mk_strbuf_put(b, "        if (slice != 0 || lane != 0) break;\n");
        if (pg->norm_w >= 0 && !staged) mk_strbuf_put(b, "        float ss[%d] = {0.0f};\n", M);
        mk_strbuf_put(b, "        for (int m = 0; m < %d; m++) for (int c = 0; c < %d; c++) for (int j = 0; j < %d; j++) {\n"
                         "            float t = 0.0f;\n"
                         "            for (int w = 0; w < %d; w++) t += red[wib + w][(m * %d + c) * %d + j];\n"
                         "            acc[m][c][j] = t;\n"
                         "        }\n",
                      M, C, np, W, C, np);
        if (pg->norm_w >= 0 && !staged)
            mk_strbuf_put(b, "        for (int m = 0; m < %d; m++) for (int w = 0; w < %d; w++) ss[m] += red[wib + w][%d + m];\n",
                          M, W, M * C * np);
    } else {
    mk_strbuf_put(b, "        for (int m = 0; m < %d; m++) for (int c = 0; c < %d; c++) for (int j = 0; j < %d; j++) acc[m][c][j] = 0.0f;\n", M, C, np);
    mk_mv_put_column_pointers(b, p, r, prods, np);
    mk_mv_put_epilogue_loads(b, p, o, C, "lane == 0 && slice == 0");
    if (pg->norm_w >= 0 && !staged) mk_strbuf_put(b, "        float ss[%d] = {0.0f};\n", M);
    long long step = 32LL * E * W;
    bool raw = p->raw;
    for (int s = 0; s < pre; s++) { /* the steps whose weights were loaded before the wait */
        char tag[16]; /* "p" and an int */
        snprintf(tag, sizeof tag, "p%d", s);
        mk_strbuf_put(b, "        if (kfirst + %lldLL < %lldLL) {\n            const long long k = kfirst + %lldLL;\n",
                      s * step, K, s * step);
        if (pg->a8_group) {
            mk_mv_put_grid_step(b, p, r, prods, np, tag);
        } else {
            if (raw) mk_mv_put_weight_widen(b, p, r, prods, np, tag);
            mk_mv_put_float_math(b, p, r, prods, np, tag);
        }
        mk_strbuf_put(b, "        }\n");
    }
    bool ahead = p->ahead;
    if (ahead) { /* the loop's first step, its raw weights and scales in b{j}_{c}nr, s{j}_{c}n */
        mk_strbuf_put(b, "        {\n");
        mk_mv_put_weight_decls(b, p, np, "n", "        ", true);
        mk_strbuf_put(b, "        if (kfirst + %lldLL < %lldLL) {\n            const long long k = kfirst + %lldLL;\n",
                      pre * step, K, pre * step);
        mk_mv_put_weight_loads(b, p, r, prods, np, "n", "            ", true);
        mk_strbuf_put(b, "        }\n");
    }
    mk_strbuf_put(b, "#pragma unroll %d\n        for (long long k = kfirst + %lldLL; k < %lldLL; k += %lldLL) {\n",
                  ahead ? 1 : 4, pre * step, K, step);
    if (pg->a8_group) {
        mk_mv_put_grid_step(b, p, r, prods, np, "");
    } else if (ahead) { /* this step's from the registers, the next step's loads out, then the math */
        mk_mv_put_weight_decls(b, p, np, "", "            ", true);
        for (int j = 0; j < np; j++)
            for (int c = 0; c < C; c++)
                mk_strbuf_put(b, "            b%d_%dr = b%d_%dnr; s%d_%d = s%d_%dn;\n", j, c, j, c, j, c, j, c);
        mk_strbuf_put(b, "            if (k + %lldLL < %lldLL) { const long long next = k + %lldLL; {\n"
                         "            const long long k = next;\n", step, K, step);
        mk_mv_put_weight_loads(b, p, r, prods, np, "n", "            ", true);
        mk_strbuf_put(b, "            } }\n");
        mk_mv_put_weight_widen(b, p, r, prods, np, "");
        mk_mv_put_float_math(b, p, r, prods, np, "");
    } else {
        mk_mv_put_weight_decls(b, p, np, "", "            ", false);
        mk_mv_put_weight_loads(b, p, r, prods, np, "", "            ", false);
        mk_mv_put_float_math(b, p, r, prods, np, "");
    }
    mk_strbuf_put(b, ahead ? "        }\n        }\n" : "        }\n");
    mk_strbuf_put(b, "        for (int m = 0; m < %d; m++) for (int c = 0; c < %d; c++) for (int j = 0; j < %d; j++)\n"
                     "            for (int off = 16; off > 0; off >>= 1) acc[m][c][j] += __shfl_xor_sync(0xffffffffu, acc[m][c][j], off);\n",
                  M, C, np);
    if (pg->norm_w >= 0 && !staged)
        mk_strbuf_put(b, "        for (int m = 0; m < %d; m++)\n"
                         "            for (int off = 16; off > 0; off >>= 1) ss[m] += __shfl_xor_sync(0xffffffffu, ss[m], off);\n",
                      M);
    if (phase == 1) { /* hand the slice's sums over; the first slice finishes after the barrier */
        mk_strbuf_put(b, "        if (lane == 0) {\n"
                         "            for (int m = 0; m < %d; m++) for (int c = 0; c < %d; c++) for (int j = 0; j < %d; j++)\n"
                         "                red[wib + slice][(m * %d + c) * %d + j] = acc[m][c][j];\n",
                      M, C, np, C, np);
        if (pg->norm_w >= 0 && !staged)
            mk_strbuf_put(b, "            for (int m = 0; m < %d; m++) red[wib + slice][%d + m] = ss[m];\n",
                          M, M * C * np);
        mk_strbuf_put(b, "        }\n");
        return;
    }
    }
    mk_mv_put_epilogue(b, p, o, C, phase == 2 ? "" : "if (lane == 0) ");
}

/*
 * Result o's epilogue for the C columns from n0 of the thread `who` says
 * (a condition, or "" for every thread that gets here), from its sums
 * acc[m][c][j]: the RmsNorm's 1 / rms, the result's program, its rotation, and
 * its row write or ArgMax.
 */
void mk_mv_put_epilogue(mk_strbuf *b, const mk_mv_plan *p, int o, int C, const char *who) {
    const mk_launch *l = p->l;
    const mk_product_group *pg = p->pg;
    bool staged = p->staged;
    const mk_product_out *r = &pg->out[o];
    const mk_group *grp = l->node->group;
    int which = 1; /* the faulting member for the error: the row write */
    while (which < grp->n_members && grp->members[which - 1] != r->end) which++;
    int M = (int)pg->m;
    long long K = (long long)pg->k, N = (long long)r->n;
    int prods[MK_X_IN], np = mk_mv_product_sources(r, prods);
    /* the RmsNorm: the sum of x's squares, the block's or the warp's (a
     * LayerNorm has normalised sA itself) */
    if (pg->norm_w >= 0 && pg->norm_b < 0)
        mk_strbuf_put(b, "        for (int m = 0; m < %d; m++) {\n"
                         "            const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(%s[m], (float)%lldLL), 1e-5f)));\n"
                         "            for (int c = 0; c < %d; c++) for (int j = 0; j < %d; j++) acc[m][c][j] *= inv;\n"
                         "        }\n",
                      M, staged ? "sss" : "ss", K, C, np);
    /* one thread writes; no thread returns early (a block with an ArgMax
     * result meets at a barrier at the end); a fault leaves the do-while */
    mk_strbuf_put(b, "        %sdo {\n", who);
    long long at_a = 1, at_s = 1, at_e = 1; /* a ReplaceAt's x: [m, at_a, at_s, at_e] */
    if (r->row_index >= 0) { /* every index checked first, as the CPU's ReplaceAt does */
        const mk_tensor *x = &l->in[r->row_x];
        for (int d = 1; d < r->row_axis; d++) at_a *= x->shape[d];
        for (int d = r->row_axis + 1; d < x->rank; d++) at_e *= x->shape[d];
        at_s = x->shape[r->row_axis];
        mk_strbuf_put(b, "        bool bad = false;\n"
                         "        for (int m = 0; m < %d && !bad; m++)\n"
                         "            if (widx[m] < 0 || widx[m] >= %lldLL) { mk_raise(fault, launch, %d, %d, widx[m], m, %lldLL); bad = true; }\n"
                         "        if (bad) break;\n"
                         "        float *dst = (float *)i%d;\n",
                      M, at_s, which, (int)MK_FAULT_INDEX, at_s, r->row_x);
    } else if (r->row_x >= 0) { /* the bounds, checked as the CPU's ReplaceSlice checks them */
        const mk_tensor *x = &l->in[r->row_x];
        long long rows = x->shape[0];
        mk_strbuf_put(b, "        const long long begin = wbegin, end = wend;\n");
        mk_strbuf_put(b, "        if (begin < 0 || end > %lldLL || begin > end) { mk_raise(fault, launch, %d, %d, begin, end, %lldLL); break; }\n",
                      rows, which, (int)MK_FAULT_RANGE, rows);
        mk_strbuf_put(b, "        if (end - begin != %lldLL) { mk_raise(fault, launch, %d, %d, begin, end, %lldLL); break; }\n",
                      (long long)r->row_count, which, (int)MK_FAULT_ROWS, (long long)r->row_count);
        mk_strbuf_put(b, "        float *dst = (float *)i%d + begin * %lldLL;\n", r->row_x,
                      (long long)(mk_tensor_numel(x) / rows));
    } else {
        mk_strbuf_put(b, "        float *dst = o + %lldLL;\n", (long long)r->offset);
    }
    /* a pair h of columns at a time, n0 + 2 h and n0 + 2 h + 1 (rotated together) */
    mk_strbuf_put(b, "#pragma unroll\n        for (int m = 0; m < %d; m++)\n"
                     "#pragma unroll\n        for (int h = 0; h < %d; h++) {\n            float v[2];\n", M, C / 2);
    mk_strbuf_put(b, "#pragma unroll\n            for (int c = 0; c < 2; c++) {\n");
    mk_strbuf_put(b, "            const long long e = m * %lldLL + n0 + 2 * h + c;\n", N);
    for (int s = 0, t = 0; s < r->n_src; s++) {
        if (r->src[s].product >= 0) {
            int j = 0;
            while (prods[j] != s) j++;
            mk_strbuf_put(b, "            const float r%d = acc[m][2 * h + c][%d];\n", s, j);
        } else {
            mk_strbuf_put(b, "            const float r%d = pre[m][2 * h + c][%d];\n", s, t++);
        }
    }
    const mk_expr *e = &r->program;
    for (int j = 0; j < e->n; j++) mk_codegen_put_insn(b, e, j, true);
    mk_strbuf_put(b, "            v[c] = r%d;\n            }\n", e->n ? MK_X_IN + e->n - 1 : 0);
    mk_strbuf_put(b, "            const long long e0 = m * %lldLL + n0 + 2 * h;\n", N);
    if (r->rotate >= 0) /* (re, im) * (cr, ci), rounded as the complex product's kernel */
        mk_strbuf_put(b, "            const float cr = rot[m][h][0], ci = rot[m][h][1];\n"
                         "            const float re = __fsub_rn(__fmul_rn(v[0], cr), __fmul_rn(v[1], ci));\n"
                         "            const float im = __fadd_rn(__fmul_rn(v[0], ci), __fmul_rn(v[1], cr));\n"
                         "            v[0] = re; v[1] = im;\n");
    if (r->row_index >= 0) { /* column c0 = n0 + 2 h (even, as the run) at x[m, c0 / e, widx[m], c0 % e] */
        mk_strbuf_put(b, "            const long long c0 = n0 + 2 * h, at = ((m * %lldLL + c0 / %lldLL) * %lldLL + widx[m]) * %lldLL + c0 %% %lldLL;\n"
                         "            dst[at] = v[0]; dst[at + 1] = v[1];\n        }\n        } while (0);\n",
                      at_a, at_e, at_s, at_e, at_e);
        return;
    }
    if (!r->argmax) {
        mk_strbuf_put(b, "            dst[e0] = v[0]; dst[e0 + 1] = v[1];\n        }\n        } while (0);\n");
        return;
    }
    /* ArgMax: the largest key wins, first in the block's shared memory
     * (kernels/skeletons/argmax.cuh) */
    mk_strbuf_put(b, "            for (int c = 0; c < 2; c++)\n"
                     "                atomicMax(&sbest[%d + m], mk_argmax_key(v[c], (unsigned int)(n0 + 2 * h + c)));\n"
                     "        }\n"
                     "        } while (0);\n",
                  mk_mv_argmax_slot(pg, o) * M);
}

/* Elements of k a lane takes per step: 16 bytes of weights a load (4 float32,
 * 8 float16/bfloat16, 16 int8) where every product's weights have one size and
 * A, the norm's weight and each column are 16-byte aligned; else 4 (when the
 * weights align to 4 elements), else 1. */
int mk_mv_weights_per_load(const mk_launch *l, const mk_product_group *pg) {
    long long K = (long long)pg->k;
    if (!mk_aligned16(l->in[pg->a].data) ||
        (pg->norm_w >= 0 && !mk_aligned16(l->in[pg->norm_w].data)))
        return 1;
    size_t es = mk_dtype_size(l->in[pg->b[0]].dtype);
    for (int E = (int)(16 / es); E >= 4; E = E > 4 ? 4 : 0) {
        bool ok = K % E == 0;
        for (int j = 0; j < pg->n_products && ok; j++) {
            const mk_tensor *w = &l->in[pg->b[j]];
            size_t bytes = (size_t)E * mk_dtype_size(w->dtype);
            ok = (E == 4 || mk_dtype_size(w->dtype) == es) && ((uintptr_t)w->data % bytes) == 0 &&
                 ((size_t)w->stride[1] * mk_dtype_size(w->dtype)) % bytes == 0;
        }
        if (ok) return E;
    }
    return 1;
}

/* Whether A is staged in shared memory: on the int8 grid (made there), with
 * a LayerNorm folded in (normalised there; the products pass keeps A within
 * MK_LAYER_NORM_FLOATS), or where its rows fit MK_STAGE_BYTES and the launch
 * reads at least MK_STAGE_MIN_WEIGHTS. */
static bool staged_a(const mk_launch *l, const mk_product_group *pg) {
    return pg->a8_group || pg->norm_b >= 0 ||
           ((long long)pg->m * pg->k * (long long)sizeof(float) <= MK_STAGE_BYTES &&
            mk_mv_weight_bytes(l, pg) >= MK_STAGE_MIN_WEIGHTS);
}

/*
 * Columns a warp takes (C): 4, two pairs, where A is one row, each result
 * reads one product and has columns in 4s, and the weights are either int8,
 * 16 a lane's step, with A staged (all of Llama-2-7B's launches but w1 / w3,
 * stories15M's classifier), or 2 bytes with k at most 2,048 (all of stories
 * 15M's and 110M's but w1 / w3); else 2, a pair. A warp's step then loads
 * 4 columns' weights a lane and reads A's values once for 4 columns, not
 * 2; the launch has half the warps (W slices each as before: product_slices
 * counts pairs) and half the blocks, each staging A once.
 * Where the weights are int8 with A unstaged, or 2 bytes with a long k, or
 * float32, pairs were faster.
 */
static int warp_columns(const mk_launch *l, const mk_product_group *pg) {
    if (pg->m != 1 || pg->a8_group || mk_mv_most_products(pg) != 1 || mk_mv_tc_slices(l, pg)) return 2;
    for (int o = 0; o < pg->n_outs; o++)
        if (pg->out[o].n % 4) return 2;
    if (pg->weight_bytes == 2) return pg->k <= 2048 ? 4 : 2;
    if (pg->weight_bytes != 1 || mk_mv_weights_per_load(l, pg) != 16 || !staged_a(l, pg))
        return 2;
    for (int j = 0; j < pg->n_products; j++)
        if (pg->b_scale[j] < 0) return 2;
    return 4;
}

/* The kernel of a matrix–vector group's launch: one warp per C columns of a
 * result (every row of A; warp_columns) and slice of k (W of them,
 * product_slices), mk_mv_block_warps(W) warps a block, each on its own: a warp
 * reads all of A, so it sums the RmsNorm's squares of x in the same loop and
 * scales its dot products of w * x by 1 / rms at the end (no block-wide step
 * unless A is staged). */
void mk_codegen_product_source(mk_strbuf *b, const mk_launch *l) {
    mk_mv_plan plan, *p = &plan;
    mk_mv_plan_of(l, p);
    if (p->tc) {
        mk_mv_put_tc_source(b, p);
        return;
    }
    const mk_product_group *pg = p->pg;
    int M = (int)pg->m;
    long long K = (long long)pg->k;
    int C = p->C, W = p->W, BW = p->BW;
    bool staged = p->staged;
    mk_strbuf_put(b, "// moonkaas matrix-vector group $%d: [%d, %lld] @ %d products, %d results%s%s%s\n",
                  l->node->id, M, K, pg->n_products, pg->n_outs,
                  pg->norm_b >= 0   ? ", LayerNorm folded in"
                  : pg->norm_w >= 0 ? ", RmsNorm folded in"
                                    : "",
                  C == 4 ? ", 4 columns a warp" : "",
                  W == 3 ? ", k in 3 slices" : "");
    mk_codegen_put_fault(b);
    const mk_expr *programs[MK_PRODUCTS_MAX];
    for (int o = 0; o < pg->n_outs; o++) programs[o] = &pg->out[o].program;
    mk_strbuf_put(b, "%s", mk_codegen_helpers(programs, pg->n_outs));
    mk_strbuf_put(b, "%s%s%s", mk_skeleton_weights,
                  staged || pg->norm_w >= 0 ? mk_skeleton_staging : "",
                  mk_mv_argmax_slot(pg, pg->n_outs) ? mk_skeleton_argmax : "");
    mk_codegen_put_head(b, 32 * BW, 0);
    mk_codegen_put_entry(b, l);
    mk_strbuf_put(b, "    const int lane = threadIdx.x & 31;\n"
                     "    const long long warp = (long long)blockIdx.x * %d + (threadIdx.x >> 5);\n", BW);
    mk_strbuf_put(b, "    const float *A = (const float *)i%d;\n", pg->a);
    if (pg->norm_w >= 0) mk_strbuf_put(b, "    const float *W = (const float *)i%d;\n", pg->norm_w);
    int slots = mk_mv_argmax_slot(pg, pg->n_outs);
    if (slots) /* each ArgMax result's best key per row, for this block */
        mk_strbuf_put(b, "    __shared__ unsigned long long sbest[%d];\n"
                         "    if (threadIdx.x < %d) sbest[threadIdx.x] = 0ull;\n"
                         "    __syncthreads();\n",
                      slots * M, slots * M);
    /* `pair` indexes the warps' C columns (a pair, or two) */
    mk_strbuf_put(b, "    const long long pair = warp / %d;\n"
                     "    const int slice = (int)(warp %% %d), wib = (int)(threadIdx.x >> 5) - slice;\n"
                     "    (void)wib;\n",
                  W, W);
    int R = 0; /* floats a warp hands over: acc and ss */
    for (int o = 0; o < pg->n_outs; o++) {
        int np = 0;
        for (int k = 0; k < pg->out[o].n_src; k++) np += pg->out[o].src[k].product >= 0;
        int need = (int)pg->m * C * np + (int)pg->m;
        if (need > R) R = need;
    }
    if (W > 1) mk_strbuf_put(b, "    __shared__ float red[%d][%d];\n", BW, R);
    int PS = 1; /* registers of the epilogues' loads (mk_mv_put_epilogue_loads) */
    for (int o = 0; o < pg->n_outs; o++)
        if (mk_mv_plain_sources(&pg->out[o]) > PS) PS = mk_mv_plain_sources(&pg->out[o]);
    mk_strbuf_put(b, "    float pre[%d][%d][%d], rot[%d][%d][2];\n    long long wbegin = 0, wend = 0, widx[%d];\n"
                     "    (void)pre; (void)rot; (void)wbegin; (void)wend; (void)widx;\n", M, C, PS, M, C / 2, M);
    mk_mv_put_preloads(b, p);
    if (staged) mk_mv_put_staging(b, p);
    for (int phase = W > 1 ? 1 : 0; phase <= (W > 1 ? 2 : 0); phase++) {
        if (phase == 2) mk_strbuf_put(b, "    __syncthreads();\n");
        long long start = 0;
        for (int o = 0; o < pg->n_outs; o++) {
            long long groups = pg->out[o].n / C; /* of C columns, a warp (and its slices) each */
            mk_strbuf_put(b, "    %sif (pair < %lldLL) do {\n        const long long p = pair - %lldLL;\n",
                          o ? "else " : "", start + groups, start);
            put_result(b, p, o, phase);
            mk_strbuf_put(b, "    } while (0);\n");
            start += groups;
        }
    }
    if (slots) mk_mv_put_argmax_blocks(b, pg, C / 2 * (BW / W));
    mk_strbuf_put(b, "}\n");
}

/* Warps of a matrix–vector group's launch, a slice of C columns each, W slices. */
static long long product_warps(const mk_product_group *pg, int C, int W) {
    long long w = 0;
    for (int o = 0; o < pg->n_outs; o++) w += pg->out[o].n / C;
    return w * W;
}

/* Device scratch of a group's launch: per ArgMax result, the best key of each
 * row and a count (zero between launches); 0 without one. */
size_t mk_codegen_product_aux_bytes(const mk_product_group *pg) {
    return (size_t)argmax_aux_offset(pg, pg->n_outs);
}

/* The plan of launch l's group (mk_mv_plan): the form, the loads' width, the
 * columns and slices a warp takes, A's staging, the preloads, and the grid:
 * mk_mv_block_warps(W) warps a block, W of them the C columns of warp_columns
 * (in the tensor-core form, a tile of 16 columns). */
void mk_mv_plan_of(const mk_launch *l, mk_mv_plan *p) {
    const mk_product_group *pg = mk_node_product(l->node);
    *p = (mk_mv_plan){.l = l, .pg = pg, .tc = mk_mv_tc_slices(l, pg)};
    /* float4 loads where every row of A, the weight and each B column is 16-byte aligned */
    p->E = mk_mv_weights_per_load(l, pg);
    p->staged = p->tc || staged_a(l, pg);
    p->C = p->tc ? 16 : warp_columns(l, pg);
    p->W = p->tc ? p->tc : product_slices(l, pg);
    p->BW = mk_mv_block_warps(p->W);
    if (!p->tc) mk_mv_plan_steps(p);
    p->blocks = mk_cuda_blocks(product_warps(pg, p->C, p->W), p->BW);
    p->threads = 32 * (unsigned int)p->BW;
}

void mk_codegen_product_grid(const mk_launch *l, unsigned int *blocks, unsigned int *threads) {
    mk_mv_plan p;
    mk_mv_plan_of(l, &p);
    *blocks = p.blocks;
    *threads = p.threads;
}
