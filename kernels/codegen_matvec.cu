/*
 * codegen_matvec.cu — the CUDA C of a matrix–vector group's kernel
 * (core/product.c): a warp per column pair of each result (or two pairs:
 * warp_columns), W warps (slices) splitting k, with its prologue (the RmsNorm
 * folded in, A staged in shared memory) and its epilogues (the result's
 * program, rotation, row writes, ArgMax). A lane's step comes in two forms:
 * float32 A (put_weight_loads and put_float_math, the weights of the first
 * steps loaded before the PDL wait: put_preloads; int8 a step ahead:
 * loads_ahead) and A on the int8 grid (put_grid_copy and put_grid_step).
 * Large int8 launches instead take the tensor-core form (tc_slices to
 * put_tc_source): a warp per 16 columns, the integer MMA, A as fixed-point
 * digits.
 * What it shares with the other generated kernels is in codegen.cu (the
 * instructions of a program, the head and entry, mk_cuda_put_fault's PDL,
 * fault record and stamps); the device code pasted as it is (those, the
 * weights' loads, A's staging and the RmsNorm's terms, the MMA, the ArgMax's
 * keys and last block) is real CUDA in kernels/skeletons/.
 *
 * Why each width, count and form was chosen, with the figures and the forms
 * tried and not kept: doc/performance.md, "Matrix–vector groups".
 */
#include "cuda_device.h"
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

static const char *weight_suffix(mk_dtype d) {
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
static long long ldb_of(const mk_launch *l, const mk_product_group *pg, const mk_product_out *r,
                        int s) {
    return (long long)l->in[pg->b[r->src[s].product]].stride[1];
}

/* Bytes of the widest weight element a group's products read (int8: 1). */
static long long weight_element_bytes(const mk_product_group *pg) {
    long long es = 1;
    for (int t = 0; t < pg->n_members; t++) {
        const mk_node *m = pg->members[t];
        if (m->op->kernel != MK_KERNEL_MATMUL) continue;
        const mk_node *b = m->in[1];
        long long s = b->op->kernel == MK_KERNEL_DEQUANTIZE ? 1 : (long long)mk_dtype_size(b->dtype);
        if (s > es) es = s;
    }
    return es;
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
 * blocks of 12 warps (block_warps), so that Llama-2-7B's wo and w2 fill the
 * SMs in one wave; not for 2-byte weights, where it lost.
 */
static int warp_columns(const mk_launch *l, const mk_product_group *pg);

static int product_slices(const mk_launch *l, const mk_product_group *pg) {
    long long pairs = 0;
    for (int o = 0; o < pg->n_outs; o++) pairs += pg->out[o].n / 2;
    long long target = 3072 * weight_element_bytes(pg);
    if (target > 8192) target = 8192;
    int W = 1;
    while (W < 8 && pairs * W < target && pg->k >= 128LL * 2 * W) W *= 2;
    if (W == 2 && weight_element_bytes(pg) == 1 && warp_columns(l, pg) == 4) W = 3;
    return W;
}

/* Warps of a block: more (16, 32) or fewer lost (doc/performance.md). */
#define MK_MV_WARPS 8

/* Warps a block where W warps take a group of columns, a slice of k each
 * (product_slices; tc_slices, never 3): MK_MV_WARPS, or for W = 3, 12 (4
 * groups), so that a block holds whole groups. */
static int block_warps(int W) { return W == 3 ? 12 : MK_MV_WARPS; }

/* Result o's index among the group's ArgMax results. */
static int argmax_slot(const mk_product_group *pg, int o) {
    int slot = 0;
    for (int k = 0; k < o; k++) slot += pg->out[k].argmax;
    return slot;
}

/* The end of a kernel with ArgMax results: thread 0 of each block holding
 * warps of such a result calls mk_argmax_finish (kernels/skeletons/argmax.cuh,
 * which says how the blocks meet). */
static void put_argmax_blocks(mk_strbuf *b, const mk_product_group *pg, long long per) {
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
                      first, last, argmax_aux_offset(pg, o), M, argmax_slot(pg, o) * M, first,
                      last, (long long)r->offset);
    }
}

/*
 * Result o's weight columns to L2 for the column pair of warp index `p`
 * (local to o), before the wait for the launches before: a 128-byte line per
 * lane, the first lines of each column, as many as MK_PREFETCH_BYTES spread
 * over all the launch's columns allow. What a launch sends ahead has to stay
 * in L2 until its warps read it: more than 2 MB lost.
 */
#define MK_PREFETCH_BYTES (2LL << 20)

static long long prefetch_lines(const mk_product_group *pg) {
    long long columns = 0;
    for (int o = 0; o < pg->n_outs; o++)
        for (int s = 0; s < pg->out[o].n_src; s++) columns += (pg->out[o].src[s].product >= 0) * pg->out[o].n;
    return columns ? MK_PREFETCH_BYTES / (columns * 128) : 0;
}

static void put_prefetch(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg, int o, int W,
                         int C, long long first) {
    const mk_product_out *r = &pg->out[o];
    long long lines = prefetch_lines(pg);
    for (int s = 0; s < r->n_src; s++) {
        int pj = r->src[s].product;
        if (pj < 0) continue;
        int bk = pg->b[pj];
        long long ldb = ldb_of(l, pg, r, s);
        long long es = (long long)mk_dtype_size(l->in[bk].dtype);
        long long from = first * es, bytes = (long long)pg->k * es - from;
        if (bytes > 128 * lines) bytes = 128 * lines;
        if (bytes <= 0) continue;
        for (int c = 0; c < C; c++)
            mk_strbuf_put(b, "        for (long long k = %lldLL + 128 * (lane + 32 * slice); k < %lldLL; k += %d) "
                             "asm volatile(\"prefetch.global.L2 [%%0];\" :: \"l\"((const char *)i%d + (%d * p + %d) * %lldLL + k));\n",
                          from, from + bytes, 4096 * W, bk, C, c, ldb * es);
    }
}

/*
 * A lane's step on float32 A: E elements of k from k, its weights in one load
 * (16 bytes where E > 4) widened to float, A and the norm's weight as Q
 * float4s (E == 1: floats); int8 weights' dot products summed apart, then
 * times their block's scale. The weights come first (put_weight_loads: into
 * b{j}_{c}{tag}, with int8's scales in s{j}_{c}{tag}), so that a step's may
 * be loaded early (put_preloads); put_float_math does the rest.
 *
 * Loaded early, 16 bytes of bfloat16, float16 or int8 (E > 4) may stay as
 * they are (`raw`: b{j}_{c}{tag}r, a uint4, preload_raw) until the step's
 * math, which widens them first (put_weight_widen): half or a quarter of the
 * registers.
 */
static void put_weight_decls(mk_strbuf *b, int np, int C, int E, const char *tag,
                             const char *indent, bool raw) {
    for (int j = 0; j < np; j++)
        for (int c = 0; c < C; c++) {
            if (raw) mk_strbuf_put(b, "%suint4 b%d_%d%sr;", indent, j, c, tag);
            else if (E >= 4) mk_strbuf_put(b, "%sfloat4 b%d_%d%s[%d];", indent, j, c, tag, E / 4);
            else mk_strbuf_put(b, "%sfloat b%d_%d%s[1];", indent, j, c, tag);
            mk_strbuf_put(b, " float s%d_%d%s; (void)s%d_%d%s;\n", j, c, tag, j, c, tag);
        }
}

static void put_weight_loads(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg,
                             const mk_product_out *r, const int *prods, int np, int C, int E,
                             const char *tag, const char *indent, bool raw) {
    for (int j = 0; j < np; j++) {
        int pj = r->src[prods[j]].product, bk = pg->b[pj];
        long long ldb = l->in[bk].stride[1];
        const char *w = weight_suffix(l->in[bk].dtype);
        for (int c = 0; c < C; c++) {
            if (raw)
                mk_strbuf_put(b, "%sb%d_%d%sr = __ldcs((const uint4 *)(B%d + %lldLL + k));\n", indent, j, c, tag,
                              j, c * ldb);
            else if (E >= 4)
                mk_strbuf_put(b, "%smk_w%d_%s(B%d + %lldLL + k, b%d_%d%s);\n", indent, E, w, j, c * ldb,
                              j, c, tag);
            else
                mk_strbuf_put(b, "%sb%d_%d%s[0] = mk_w1_%s(B%d + %lldLL + k);\n", indent, j, c, tag, w, j,
                              c * ldb);
            if (pg->b_scale[pj] < 0) continue;
            const mk_tensor *sc = &l->in[pg->b_scale[pj]];
            mk_strbuf_put(b, "%ss%d_%d%s = S%d[%lldLL + k / %lldLL * %lldLL];\n", indent, j, c, tag, j,
                          c * (long long)sc->stride[1], (long long)pg->b_group[pj],
                          (long long)sc->stride[0]);
        }
    }
}

/* The float4s of a step's raw weights (put_weight_decls), before its math. */
static void put_weight_widen(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg,
                             const mk_product_out *r, const int *prods, int np, int C, int E,
                             const char *tag) {
    for (int j = 0; j < np; j++) {
        const char *w = weight_suffix(l->in[pg->b[r->src[prods[j]].product]].dtype);
        for (int c = 0; c < C; c++)
            mk_strbuf_put(b, "            float4 b%d_%d%s[%d]; mk_x%d_%s(b%d_%d%sr, b%d_%d%s);\n", j, c, tag,
                          E / 4, E, w, j, c, tag, j, c, tag);
    }
}

static void put_float_math(mk_strbuf *b, const mk_product_group *pg, const mk_product_out *r,
                           const int *prods, int np, int C, int E, bool staged, const char *tag) {
    int M = (int)pg->m;
    long long K = (long long)pg->k;
    const char *T = E >= 4 ? "float4" : "float";
    int Q = E >= 4 ? E / 4 : 1;
    for (int j = 0; j < np; j++)
        if (pg->b_scale[r->src[prods[j]].product] >= 0) /* int8: the lane's E values lie in one block */
            for (int m = 0; m < M; m++)
                for (int c = 0; c < C; c++) mk_strbuf_put(b, "            float t%d_%d_%d = 0.0f;\n", m, c, j);
    for (int m = 0; m < M; m++)
        for (int q = 0; q < Q; q++) {
            mk_strbuf_put(b, "            %s a%d_%d = *(const %s *)(%s + %lldLL + k + %d);\n", T, m, q, T,
                          staged ? "sA" : "A", m * K, 4 * q);
            if (pg->norm_w >= 0 && !staged) /* x's squares, and w * x (1 / rms applied after the sum) */
                mk_strbuf_put(b, "            a%d_%d = mk_norm%d(a%d_%d, *(const %s *)(W + k + %d), ss[%d]);\n",
                              m, q, E >= 4 ? 4 : 1, m, q, T, 4 * q, m);
            for (int j = 0; j < np; j++)
                for (int c = 0; c < C; c++) {
                    char sum[48]; /* "acc[i][j][k]" of three ints */
                    if (pg->b_scale[r->src[prods[j]].product] >= 0) snprintf(sum, sizeof sum, "t%d_%d_%d", m, c, j);
                    else snprintf(sum, sizeof sum, "acc[%d][%d][%d]", m, c, j);
                    if (E >= 4)
                        mk_strbuf_put(b, "            %s += a%d_%d.x * b%d_%d%s[%d].x + a%d_%d.y * b%d_%d%s[%d].y"
                                         " + a%d_%d.z * b%d_%d%s[%d].z + a%d_%d.w * b%d_%d%s[%d].w;\n",
                                      sum, m, q, j, c, tag, q, m, q, j, c, tag, q, m, q, j, c, tag, q,
                                      m, q, j, c, tag, q);
                    else
                        mk_strbuf_put(b, "            %s += a%d_%d * b%d_%d%s[0];\n", sum, m, q, j, c, tag);
                }
        }
    for (int j = 0; j < np; j++)
        if (pg->b_scale[r->src[prods[j]].product] >= 0)
            for (int m = 0; m < M; m++)
                for (int c = 0; c < C; c++)
                    mk_strbuf_put(b, "            acc[%d][%d][%d] += t%d_%d_%d * s%d_%d%s;\n", m, c, j, m, c, j,
                                  j, c, tag);
}

/*
 * One step of a lane on the int8 grid (a FakeQuantizeNode folded in): its E
 * int8 weights of each column and E of A's int8 values (sQ) in one load each,
 * their exact dot product (DP4A, four at a time), then, as runq.c's matmul
 * scales a group's, acc += (float)dot * w_scale * x_scale (the lane's E
 * values lie in one group: groups are multiples of 16). A step whose weights
 * were loaded before the wait (E == 16, `tag` names them: put_preloads) takes
 * their raw 16 bytes (b{j}_{c}{tag}r) and scales from there.
 */
static void put_grid_step(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg,
                          const mk_product_out *r, const int *prods, int np, int C, int E,
                          const char *tag) {
    int M = (int)pg->m;
    long long K = (long long)pg->k, G = pg->a8_group;
    const char *QT = E == 16 ? "int4" : "int";
    bool loaded = *tag;
    for (int m = 0; m < M; m++) {
        if (E == 1) mk_strbuf_put(b, "            const int a%d = sQ[%lldLL + k];\n", m, m * K);
        else mk_strbuf_put(b, "            const %s a%d = *(const %s *)(sQ + %lldLL + k);\n", QT, m, QT, m * K);
        mk_strbuf_put(b, "            const float x%d = sXs[(%lldLL + k) / %lldLL];\n", m, m * K, G);
    }
    for (int j = 0; j < np; j++) {
        int pj = r->src[prods[j]].product;
        const mk_tensor *sc = &l->in[pg->b_scale[pj]];
        long long ldb = l->in[pg->b[pj]].stride[1];
        for (int c = 0; c < C; c++) {
            if (loaded)
                mk_strbuf_put(b, "            const int4 b%d_%d = make_int4((int)b%d_%d%sr.x, (int)b%d_%d%sr.y, "
                                 "(int)b%d_%d%sr.z, (int)b%d_%d%sr.w);\n"
                                 "            const float s%d_%d = s%d_%d%s;\n",
                              j, c, j, c, tag, j, c, tag, j, c, tag, j, c, tag, j, c, j, c, tag);
            else {
                if (E == 1) mk_strbuf_put(b, "            const int b%d_%d = __ldcs(B%d + %lldLL + k);\n", j, c, j, c * ldb);
                else mk_strbuf_put(b, "            const %s b%d_%d = __ldcs((const %s *)(B%d + %lldLL + k));\n", QT, j, c, QT, j, c * ldb);
                mk_strbuf_put(b, "            const float s%d_%d = S%d[%lldLL + k / %lldLL * %lldLL];\n", j, c, j,
                              c * (long long)sc->stride[1], (long long)pg->b_group[pj], (long long)sc->stride[0]);
            }
            for (int m = 0; m < M; m++) {
                if (E == 16)
                    mk_strbuf_put(b, "            { const int t = __dp4a(a%d.w, b%d_%d.w, __dp4a(a%d.z, b%d_%d.z, "
                                     "__dp4a(a%d.y, b%d_%d.y, __dp4a(a%d.x, b%d_%d.x, 0))));\n",
                                  m, j, c, m, j, c, m, j, c, m, j, c);
                else if (E == 4)
                    mk_strbuf_put(b, "            { const int t = __dp4a(a%d, b%d_%d, 0);\n", m, j, c);
                else
                    mk_strbuf_put(b, "            { const int t = a%d * b%d_%d;\n", m, j, c);
                mk_strbuf_put(b, "              acc[%d][%d][%d] = __fadd_rn(acc[%d][%d][%d], "
                                 "__fmul_rn(__fmul_rn((float)t, s%d_%d), x%d)); }\n",
                              m, c, j, m, c, j, j, c, m);
            }
        }
    }
}

/* A result's sources that are not products (operands its program reads). */
static int plain_sources(const mk_product_out *r) {
    int n = 0;
    for (int s = 0; s < r->n_src; s++) n += r->src[s].product < 0;
    return n;
}

/*
 * What result o's epilogue reads besides its products (its other sources, the
 * rotation's (cos, sin) pairs, a row write's bounds), loaded by the thread
 * that writes it (lane 0 of the first slice) as soon as the launches before
 * are done, into registers: pre[m][c][t] (the t-th plain source at row m,
 * column n0 + c), rot[m] and wbegin, wend. Its loads then overlap the
 * products' instead of following their sums, one trip to memory less.
 */
static void put_epilogue_loads(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg, int o,
                               int C, const char *who) {
    const mk_product_out *r = &pg->out[o];
    int M = (int)pg->m;
    long long N = (long long)r->n;
    if (r->row_x < 0 && r->rotate < 0 && !plain_sources(r)) return;
    mk_strbuf_put(b, "        if (%s) {\n", who);
    if (r->row_x >= 0)
        mk_strbuf_put(b, "            wbegin = *(const long long *)i%d; wend = *(const long long *)i%d;\n",
                      r->row_begin, r->row_end);
    if (plain_sources(r)) {
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
static void put_column_pointers(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg,
                                const mk_product_out *r, const int *prods, int np) {
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
static int product_sources(const mk_product_out *r, int *prods) {
    int np = 0;
    for (int s = 0; s < r->n_src; s++)
        if (r->src[s].product >= 0) prods[np++] = s;
    return np;
}

/* The most products one result of the group reads (at least 1). */
static int most_products(const mk_product_group *pg) {
    int most = 1;
    for (int o = 0; o < pg->n_outs; o++) {
        int prods[MK_X_IN], n = product_sources(&pg->out[o], prods);
        if (n > most) most = n;
    }
    return most;
}

/*
 * Steps of a lane whose weights are loaded before the wait for the launches
 * before, into registers, where every weight and int8 scale is a constant (no
 * launch writes it): as many as MK_PRELOAD_FLOATS floats of registers hold, at least one, at
 * most the lane's steps. A launch's first wave of blocks then has its weights
 * on the way while the launch before finishes, and every block while it
 * stages A. On the int8 grid only where a step is 16 bytes a column (E ==
 * 16), which stay raw until the step's DP4As.
 *
 * 16 bytes of a narrower dtype (E > 4) stay raw until the step's math
 * (preload_raw) unless the lane's steps all fit widened: widened at the load,
 * int8 took 4 times the registers. 32 floats beat 16 and 64.
 */
#define MK_PRELOAD_FLOATS 32

/* A lane's steps along k, and the registers a step's weights take preloaded:
 * 16 raw bytes or E floats a column, and an int8 scale. */
static long long lane_steps(const mk_product_group *pg, int E, int W) {
    return ((long long)pg->k + 32LL * E * W - 1) / (32LL * E * W);
}
static int step_registers(const mk_product_group *pg, int C, int E, bool raw) {
    bool scaled = false;
    for (int j = 0; j < pg->n_products; j++) scaled |= pg->b_scale[j] >= 0;
    return most_products(pg) * C * ((raw ? 4 : E >= 4 ? E : 1) + scaled);
}

static bool preload_raw(const mk_product_group *pg, int C, int E, int W) {
    return E > 4 &&
           (pg->a8_group || step_registers(pg, C, E, false) * lane_steps(pg, E, W) > MK_PRELOAD_FLOATS);
}

/* Whether every weight and int8 scale of the group is a constant (no launch
 * writes it), so that a kernel may load them before its wait. */
static bool constant_weights(const mk_launch *l, const mk_product_group *pg) {
    for (int j = 0; j < pg->n_products; j++)
        if (l->node->in[pg->b[j]]->owner->storage != MK_STORAGE_CONSTANT ||
            (pg->b_scale[j] >= 0 && l->node->in[pg->b_scale[j]]->owner->storage != MK_STORAGE_CONSTANT))
            return false;
    return true;
}

/* Steps of the staging copy (put_float_copy) in a block of W slices' groups
 * (block_warps): a float4 (E >= 4) or a float a thread a step. */
static long long copy_steps(const mk_product_group *pg, int E, int W) {
    long long step = 32LL * block_warps(W) * (E >= 4 ? 4 : 1);
    return ((long long)pg->k + step - 1) / step;
}

/* Whether the staging copy loads every step at once (stage_batch says why):
 * without a norm, and of more than MK_STAGE_WHOLE steps or 8-bit weights. */
#define MK_STAGE_WHOLE 8
static bool whole_copy(const mk_product_group *pg, int E, int W) {
    return !pg->a8_group && pg->norm_w < 0 &&
           (copy_steps(pg, E, W) > MK_STAGE_WHOLE || weight_element_bytes(pg) == 1);
}

/* Steps of weights a lane loads before the wait: MK_PRELOAD_FLOATS'
 * registers, one where A is staged (staged) by a whole copy, whose loads take
 * the room. */
static int preload_steps(const mk_launch *l, const mk_product_group *pg, int C, int E, int W,
                         bool staged) {
    if ((pg->a8_group && E != 16) || !constant_weights(l, pg)) return 0;
    long long steps = lane_steps(pg, E, W);
    long long pre = MK_PRELOAD_FLOATS / step_registers(pg, C, E, preload_raw(pg, C, E, W));
    if (pre < 1 || (staged && whole_copy(pg, E, W))) pre = 1;
    return (int)(pre < steps ? pre : steps);
}

/*
 * Int8 weights (16 a lane's step) are loaded a step ahead: a step's loop
 * iteration sends the next step's raw 16 bytes and scale of each column out
 * before its own math, which is 3 instructions a weight (widen, less the
 * offset, multiply-add), so that a warp has loads in flight while it
 * computes; the loop is not unrolled (the registers of one step ahead are all
 * it holds). Not for bfloat16 (a third of int8's math a byte) nor on the int8
 * grid (W8A8, less math still): it helps only where the math hides the loads.
 */
static bool loads_ahead(const mk_product_group *pg, int E) { return E == 16 && !pg->a8_group; }

/*
 * Gathered operands (mk_product_gather), after the wait: each moves to the
 * row its id picks, or where the id is out of range stays at row 0 and the
 * fault names the EmbeddingNode folded in (which -1 - r).
 */
static void put_gathers(mk_strbuf *b, const mk_product_group *pg) {
    for (int r = 0; r < pg->n_gathers; r++) {
        const mk_product_gather *ga = &pg->gather[r];
        mk_strbuf_put(b, "    {\n"
                         "        const long long id = *(const long long *)i%d;\n"
                         "        if (id >= 0 && id < %lldLL) i%d = (char *)i%d + id * %lldLL;\n"
                         "        else if (blockIdx.x == 0 && threadIdx.x == 0) mk_raise(fault, launch, %d, %d, id, 0, %lldLL);\n"
                         "    }\n",
                      ga->ids, (long long)ga->rows, ga->in, ga->in, (long long)ga->row_bytes, -1 - r,
                      (int)MK_FAULT_ID, (long long)ga->rows);
    }
    if (pg->n_gathers) mk_strbuf_put(b, "    A = (const float *)i%d;\n", pg->a);
}

/*
 * The start of every matrix-vector kernel, before the wait for the launches
 * before: each warp loads the weights of its first `pre` steps into registers
 * (b{j}_{c}p{s}, put_weight_loads) and sends the rest of its first columns'
 * lines to L2 (put_prefetch); then it waits.
 */
static void put_preloads(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg, int C, int E,
                         int W, int pre) {
    long long K = (long long)pg->k, step = 32LL * E * W;
    bool raw = preload_raw(pg, C, E, W);
    mk_strbuf_put(b, "    const long long kfirst = %d * (lane + 32 * slice);\n", E);
    for (int s = 0; s < pre; s++) {
        char tag[16]; /* "p" and an int */
        snprintf(tag, sizeof tag, "p%d", s);
        put_weight_decls(b, most_products(pg), C, E, tag, "    ", raw);
    }
    long long start = 0;
    for (int o = 0; o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        int prods[MK_X_IN], np = product_sources(r, prods);
        long long groups = r->n / C; /* of C columns, a warp (and its slices) each */
        mk_strbuf_put(b, "    %sif (pair < %lldLL) {\n        const long long p = pair - %lldLL, n0 = %d * p;\n",
                      o ? "else " : "", start + groups, start, C);
        put_column_pointers(b, l, pg, r, prods, np);
        for (int s = 0; s < pre; s++) {
            char tag[16]; /* "p" and an int */
            snprintf(tag, sizeof tag, "p%d", s);
            mk_strbuf_put(b, "        if (kfirst + %lldLL < %lldLL) {\n            const long long k = kfirst + %lldLL;\n",
                          s * step, K, s * step);
            put_weight_loads(b, l, pg, r, prods, np, C, E, tag, "            ", raw);
            mk_strbuf_put(b, "        }\n");
        }
        put_prefetch(b, l, pg, o, W, C, pre * step);
        mk_strbuf_put(b, "    }\n");
        start += groups;
    }
    mk_strbuf_put(b, "    MK_GROUP_WAIT;\n");
    put_gathers(b, pg);
}

static void put_epilogue(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg, int o,
                         int C, bool staged, const char *who);

/* Result o's code for the C columns of warp index `p` (local to o). */
static void put_result(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg, int o,
                       int C, int E, int W, int pre, int phase, bool staged) {
    const mk_product_out *r = &pg->out[o];
    int M = (int)pg->m;
    long long K = (long long)pg->k;
    int prods[MK_X_IN], np = product_sources(r, prods); /* the products it reads, as sources */
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
    put_column_pointers(b, l, pg, r, prods, np);
    put_epilogue_loads(b, l, pg, o, C, "lane == 0 && slice == 0");
    if (pg->norm_w >= 0 && !staged) mk_strbuf_put(b, "        float ss[%d] = {0.0f};\n", M);
    long long step = 32LL * E * W;
    bool raw = preload_raw(pg, C, E, W);
    for (int s = 0; s < pre; s++) { /* the steps whose weights were loaded before the wait */
        char tag[16]; /* "p" and an int */
        snprintf(tag, sizeof tag, "p%d", s);
        mk_strbuf_put(b, "        if (kfirst + %lldLL < %lldLL) {\n            const long long k = kfirst + %lldLL;\n",
                      s * step, K, s * step);
        if (pg->a8_group) {
            put_grid_step(b, l, pg, r, prods, np, C, E, tag);
        } else {
            if (raw) put_weight_widen(b, l, pg, r, prods, np, C, E, tag);
            put_float_math(b, pg, r, prods, np, C, E, staged, tag);
        }
        mk_strbuf_put(b, "        }\n");
    }
    bool ahead = loads_ahead(pg, E);
    if (ahead) { /* the loop's first step, its raw weights and scales in b{j}_{c}nr, s{j}_{c}n */
        mk_strbuf_put(b, "        {\n");
        put_weight_decls(b, np, C, E, "n", "        ", true);
        mk_strbuf_put(b, "        if (kfirst + %lldLL < %lldLL) {\n            const long long k = kfirst + %lldLL;\n",
                      pre * step, K, pre * step);
        put_weight_loads(b, l, pg, r, prods, np, C, E, "n", "            ", true);
        mk_strbuf_put(b, "        }\n");
    }
    mk_strbuf_put(b, "#pragma unroll %d\n        for (long long k = kfirst + %lldLL; k < %lldLL; k += %lldLL) {\n",
                  ahead ? 1 : 4, pre * step, K, step);
    if (pg->a8_group) {
        put_grid_step(b, l, pg, r, prods, np, C, E, "");
    } else if (ahead) { /* this step's from the registers, the next step's loads out, then the math */
        put_weight_decls(b, np, C, E, "", "            ", true);
        for (int j = 0; j < np; j++)
            for (int c = 0; c < C; c++)
                mk_strbuf_put(b, "            b%d_%dr = b%d_%dnr; s%d_%d = s%d_%dn;\n", j, c, j, c, j, c, j, c);
        mk_strbuf_put(b, "            if (k + %lldLL < %lldLL) { const long long next = k + %lldLL; {\n"
                         "            const long long k = next;\n", step, K, step);
        put_weight_loads(b, l, pg, r, prods, np, C, E, "n", "            ", true);
        mk_strbuf_put(b, "            } }\n");
        put_weight_widen(b, l, pg, r, prods, np, C, E, "");
        put_float_math(b, pg, r, prods, np, C, E, staged, "");
    } else {
        put_weight_decls(b, np, C, E, "", "            ", false);
        put_weight_loads(b, l, pg, r, prods, np, C, E, "", "            ", false);
        put_float_math(b, pg, r, prods, np, C, E, staged, "");
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
    put_epilogue(b, l, pg, o, C, staged, phase == 2 ? "" : "if (lane == 0) ");
}

/*
 * Result o's epilogue for the C columns from n0 of the thread `who` says
 * (a condition, or "" for every thread that gets here), from its sums
 * acc[m][c][j]: the RmsNorm's 1 / rms, the result's program, its rotation, and
 * its row write or ArgMax.
 */
static void put_epilogue(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg, int o,
                         int C, bool staged, const char *who) {
    const mk_product_out *r = &pg->out[o];
    int which = 1; /* the faulting member for the error: the row write */
    while (which < pg->n_members && pg->members[which - 1] != r->end) which++;
    int M = (int)pg->m;
    long long K = (long long)pg->k, N = (long long)r->n;
    int prods[MK_X_IN], np = product_sources(r, prods);
    if (pg->norm_w >= 0) /* the RmsNorm: the sum of x's squares, the block's or the warp's */
        mk_strbuf_put(b, "        for (int m = 0; m < %d; m++) {\n"
                         "            const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(%s[m], (float)%lldLL), 1e-5f)));\n"
                         "            for (int c = 0; c < %d; c++) for (int j = 0; j < %d; j++) acc[m][c][j] *= inv;\n"
                         "        }\n",
                      M, staged ? "sss" : "ss", K, C, np);
    /* one thread writes; no thread returns early (a block with an ArgMax
     * result meets at a barrier at the end); a fault leaves the do-while */
    mk_strbuf_put(b, "        %sdo {\n", who);
    if (r->row_x >= 0) { /* the bounds, checked as the CPU's ReplaceSlice checks them */
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
    for (int j = 0; j < e->n; j++) mk_cuda_put_insn(b, e, j, true);
    mk_strbuf_put(b, "            v[c] = r%d;\n            }\n", e->n ? MK_X_IN + e->n - 1 : 0);
    mk_strbuf_put(b, "            const long long e0 = m * %lldLL + n0 + 2 * h;\n", N);
    if (r->rotate >= 0) /* (re, im) * (cr, ci), rounded as the complex product's kernel */
        mk_strbuf_put(b, "            const float cr = rot[m][h][0], ci = rot[m][h][1];\n"
                         "            const float re = __fsub_rn(__fmul_rn(v[0], cr), __fmul_rn(v[1], ci));\n"
                         "            const float im = __fadd_rn(__fmul_rn(v[0], ci), __fmul_rn(v[1], cr));\n"
                         "            v[0] = re; v[1] = im;\n");
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
                  argmax_slot(pg, o) * M);
}

/* Elements of k a lane takes per step: 16 bytes of weights a load (4 float32,
 * 8 float16/bfloat16, 16 int8) where every product's weights have one size and
 * A, the norm's weight and each column are 16-byte aligned; else 4 (when the
 * weights align to 4 elements), else 1. */
static int weights_per_load(const mk_launch *l, const mk_product_group *pg) {
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

/* A block holds A in shared memory where A's bytes fit under the 48 KiB of
 * static shared memory (with room for the slices' sums and ArgMax keys;
 * Llama-2-7B's [1, 11008] fits) and the launch reads enough weights that
 * the copy's barrier is a small part of it (8 MB: stories110M's launches were
 * slower staged, Llama-2-7B's faster). */
#define MK_STAGE_BYTES (44 * 1024)
#define MK_STAGE_MIN_WEIGHTS (8LL << 20)

/* The bytes of weights (and int8 scales) a matrix-vector launch reads. */
static long long weight_bytes(const mk_launch *l, const mk_product_group *pg) {
    long long n = 0;
    for (int j = 0; j < pg->n_products; j++) {
        const mk_tensor *w = &l->in[pg->b[j]];
        n += (long long)mk_tensor_numel(w) * (long long)mk_dtype_size(w->dtype);
        if (pg->b_scale[j] >= 0) n += (long long)mk_tensor_numel(&l->in[pg->b_scale[j]]) * 4;
    }
    return n;
}

/*
 * Steps of A a thread of the staging copy (put_float_copy) loads before it
 * stores any: one load at a time waits on L2 once a step, 11 times for
 * Llama-2-7B's [1, 11008]. A whole copy (whole_copy: without a norm, of more
 * than MK_STAGE_WHOLE steps, as w2's [1, 11008], or for 8-bit weights, as
 * int8's wo) loads them all at once (44 registers at most: MK_STAGE_BYTES),
 * its launch preloading one step of weights to make room (preload_steps);
 * else MK_STAGE_BATCH where the weights are 16-bit floats, else 1 (more a
 * batch cost int8 and float32 registers, and blocks an SM).
 */
#define MK_STAGE_BATCH 4

static int stage_batch(const mk_product_group *pg, int E, int W) {
    long long steps = copy_steps(pg, E, W);
    long long U = whole_copy(pg, E, W) ? steps : weight_element_bytes(pg) == 2 ? MK_STAGE_BATCH : 1;
    return (int)(steps < U ? steps : U);
}

/* Step k of the staging copy for row m, indented by `in`: x (from `from`)
 * times the norm's weight w, its squares summed into part[m], into sA. */
static void put_copy_store(mk_strbuf *b, const mk_product_group *pg, int V, int m, const char *in,
                           const char *from) {
    mk_strbuf_put(b, "%s*(%s *)(sA + %lldLL + k) = ", in, V == 4 ? "float4" : "float", m * (long long)pg->k);
    if (pg->norm_w >= 0) mk_strbuf_put(b, "mk_norm%d(%s, w, part[%d]);\n", V, from, m);
    else mk_strbuf_put(b, "%s;\n", from);
}

/* A into sA (times the norm's weight W, its squares summed into part[m]),
 * a float4 a thread a step where A and W are 16-byte aligned (E >= 4), U
 * steps loaded before they are stored (stage_batch). */
static void put_float_copy(mk_strbuf *b, const mk_product_group *pg, int E, int W) {
    int M = (int)pg->m;
    long long K = (long long)pg->k;
    bool norm = pg->norm_w >= 0;
    mk_strbuf_put(b, "    __shared__ __align__(16) float sA[%lld];\n", (long long)M * K);
    int V = E >= 4 ? 4 : 1, step = 32 * block_warps(W) * V, U = stage_batch(pg, E, W);
    const char *T = V == 4 ? "float4" : "float";
    char from[96];
    if (U == 1) { /* a step at a time */
        mk_strbuf_put(b, "    for (long long k = %d * threadIdx.x; k < %lldLL; k += %d) {\n", V, K, step);
        if (norm) mk_strbuf_put(b, "        const %s w = *(const %s *)(W + k);\n", T, T);
        for (int m = 0; m < M; m++) {
            snprintf(from, sizeof from, "*(const %s *)(A + %lldLL + k)", T, m * K);
            put_copy_store(b, pg, V, m, "        ", from);
        }
        mk_strbuf_put(b, "    }\n");
        return;
    }
    mk_strbuf_put(b, "    for (long long k0 = %d * threadIdx.x; k0 < %lldLL; k0 += %d) {\n"
                     "        %s xs[%d][%d];\n", V, K, U * step, T, U, M);
    if (norm) mk_strbuf_put(b, "        %s ws[%d];\n", T, U);
    mk_strbuf_put(b, "#pragma unroll\n"
                     "        for (int u = 0; u < %d; u++) {\n"
                     "            const long long k = k0 + %d * u;\n"
                     "            if (k >= %lldLL) break;\n", U, step, K);
    if (norm) mk_strbuf_put(b, "            ws[u] = *(const %s *)(W + k);\n", T);
    for (int m = 0; m < M; m++)
        mk_strbuf_put(b, "            xs[u][%d] = *(const %s *)(A + %lldLL + k);\n", m, T, m * K);
    mk_strbuf_put(b, "        }\n"
                     "#pragma unroll\n"
                     "        for (int u = 0; u < %d; u++) {\n"
                     "            const long long k = k0 + %d * u;\n"
                     "            if (k >= %lldLL) break;\n", U, step, K);
    if (norm) mk_strbuf_put(b, "            const %s w = ws[u];\n", T);
    for (int m = 0; m < M; m++) {
        snprintf(from, sizeof from, "xs[u][%d]", m);
        put_copy_store(b, pg, V, m, "            ", from);
    }
    mk_strbuf_put(b, "        }\n    }\n");
}

/*
 * A onto runq.c's int8 grid as the block copies it (a FakeQuantizeNode folded
 * in): thread t takes 16 consecutive values a step (x times the norm's weight,
 * whose squares go into part[m]), and mk_grid16 (skeletons/staging.cuh)
 * rounds them into sQ as the FakeQuantizeNode does, the G / 16 threads of a
 * group agreeing on its scale, which goes into sXs. With a norm, the values
 * are x * w: the group's scale makes up for 1 / rms, which the dot products
 * take at the end.
 */
static void put_grid_copy(mk_strbuf *b, const mk_product_group *pg, bool vec, int W) {
    int M = (int)pg->m;
    long long K = (long long)pg->k, G = pg->a8_group;
    bool norm = pg->norm_w >= 0;
    const char *V = vec ? "true" : "false";
    mk_strbuf_put(b, "    __shared__ __align__(16) signed char sQ[%lld];\n    __shared__ float sXs[%lld];\n",
                  (long long)M * K, (long long)M * K / G);
    mk_strbuf_put(b, "    for (long long k0 = 0; k0 < %lldLL; k0 += %d) {\n"
                     "        const long long k = k0 + 16 * threadIdx.x;\n"
                     "        const bool on = k < %lldLL;\n", K, 16 * 32 * block_warps(W), K);
    if (norm) mk_strbuf_put(b, "        float w[16];\n        if (on) mk_load16<%s>(W + k, w);\n", V);
    for (int m = 0; m < M; m++) {
        long long at = (long long)m * K;
        mk_strbuf_put(b, "        {\n            float v[16], mx = 0.0f;\n"
                         "            if (on) {\n                mk_load16<%s>(A + %lldLL + k, v);\n", V, at);
        if (norm)
            mk_strbuf_put(b, "                for (int i = 0; i < 16; i++) v[i] = mk_norm1(v[i], w[i], part[%d]);\n", m);
        mk_strbuf_put(b, "                mx = mk_absmax16(v);\n            }\n"
                         "            mk_grid16<%lld>(v, mx, on, sQ, sXs, %lldLL + k);\n        }\n", G / 16, at);
    }
    mk_strbuf_put(b, "    }\n");
}

static void put_digit_copy(mk_strbuf *b, const mk_product_group *pg);

/*
 * The start of a kernel that holds A in shared memory, after its preloads
 * and the wait (put_preloads): the block copies A into sA (or, in the
 * tensor-core form, its digits into sD: `digits`), times the RmsNorm's weight
 * where one is folded in, and sums x's squares per row into sss. Every warp
 * then reads A there, not from L2: the warps of a launch would otherwise read
 * A once per column pair, as many bytes as the weights in float32 and 4 times
 * as many in int8.
 */
static void put_staging(mk_strbuf *b, const mk_product_group *pg, int E, int W, bool digits) {
    int M = (int)pg->m;
    bool norm = pg->norm_w >= 0;
    if (norm)
        mk_strbuf_put(b, "    __shared__ float sss[%d], sred[%d][%d];\n    float part[%d] = {0.0f};\n", M,
                      block_warps(W), M, M);
    if (digits) put_digit_copy(b, pg);
    else if (pg->a8_group) put_grid_copy(b, pg, E >= 4, W);
    else put_float_copy(b, pg, E, W);
    if (norm) mk_strbuf_put(b, "    mk_norm_sums(part, sred, sss);\n");
    mk_strbuf_put(b, "    __syncthreads();\n");
}

/*
 * The tensor-core form: int8 weights (with their float32 scales) through the
 * integer MMA (mma.m16n8k32.s8), where every product's weights are int8 in
 * groups of a multiple of 64, A is one row, k a multiple of 128 but not of
 * 512, each result reads one product and the launch has at least
 * MK_TC_COLUMNS columns in results of multiples of 16 (tc_slices). The int8
 * form above spends 3 instructions a weight widening and multiplying; here
 * the weights go into the MMA as they are loaded.
 *
 * A becomes fixed point as the block stages it (put_digit_copy): per 64 of k,
 * x times 2^e (e from the 64's largest |x|, so that |x 2^e| < 2^30) rounded
 * to an integer, held as four signed base-256 digits (the MMA's n = 0..3), a
 * relative error of 2^-31 of the 64's largest |x|; a non-finite x makes its
 * 64's factor NaN. A warp takes 16 columns (rows g and g + 8 of the MMA for
 * lane g * 4 + t) and its slice of k, 128 a step: each lane loads 32 bytes of
 * both its columns (lane t the bytes 32 t ..), and every 8 bytes of them are
 * an MMA's k = 4 t .. 4 t + 3 and 16 + 4 t .. (the order of k within an MMA
 * does not change its sum, so A's digits are read in the same order). An MMA
 * sums over the four lanes t; lanes 0, 1 and 2, 3 hold different 64s, so each
 * 8 bytes take two MMAs, the other 64's lanes giving zero digits. Per 64, the
 * exact integer sums D (at most 64 x 128 x 128) times the weight's scale and
 * the 64's factor add into float32 sums per digit, which lanes t = 0, 1 weigh
 * by 2^-8n and add at the end. Before sm_80 (or with MK_NO_MMA defined, for
 * the tests) mk_mma_s8 makes the same integer sums by shuffles and DP4A.
 *
 * The slices' sums meet in shared memory; lanes 0..7 of a tile's first warp
 * then run the epilogue of a column pair each (put_epilogue). The first
 * step's weights are loaded before the wait where they are constants.
 *
 * Faster than the int8 form for Llama-2-7B's q/k/v and stories110M's
 * classifier; too few warps below MK_TC_COLUMNS; where k is a multiple of 512
 * the 4-column int8 form (warp_columns) is faster, hence not there.
 */
#define MK_TC_COLUMNS 8192 /* the fewest columns a launch in this form has */
#define MK_TC_WARPS 2048   /* warps a launch aims for, splitting k */

/* The warps that split k in the tensor-core form, or 0 where the group does not take it. */
static int tc_slices(const mk_launch *l, const mk_product_group *pg) {
    if (pg->m != 1 || pg->a8_group || pg->k % 128 || pg->k % 512 == 0 ||
        weights_per_load(l, pg) != 16 || (long long)pg->k * 4 > MK_STAGE_BYTES ||
        weight_bytes(l, pg) < MK_STAGE_MIN_WEIGHTS)
        return 0;
    for (int j = 0; j < pg->n_products; j++)
        if (pg->b_scale[j] < 0 || pg->b_group[j] % 64) return 0;
    long long columns = 0;
    for (int o = 0; o < pg->n_outs; o++) {
        int prods[MK_X_IN];
        if (pg->out[o].n % 16 || product_sources(&pg->out[o], prods) != 1) return 0;
        columns += pg->out[o].n;
    }
    if (columns < MK_TC_COLUMNS) return 0;
    int W = 1;
    while (W < MK_MV_WARPS && columns / 16 * W < MK_TC_WARPS) W *= 2;
    return W;
}

/* A (times the norm's weight, its squares into part[0]) as four digits per
 * element in sD ([k / 8][digit][8] bytes) and each 64's factor of digit 0 in
 * sF (mk_digits4, skeletons/staging.cuh): half a warp a 64, a float4 a lane
 * (tc_slices: A and the norm's weight are 16-byte aligned), each digit's four
 * bytes stored as one word; a warp loads MK_DIGIT_BATCH 64s before it stores
 * any, so that a warp does not wait on L2 once per 64. */
#define MK_DIGIT_BATCH 4
static void put_digit_copy(mk_strbuf *b, const mk_product_group *pg) {
    long long K = (long long)pg->k, Q = K / 64; /* Q is even: k is a multiple of 128 */
    bool norm = pg->norm_w >= 0;
    int U = (int)((Q / 2 + MK_MV_WARPS - 1) / MK_MV_WARPS);
    if (U > MK_DIGIT_BATCH) U = MK_DIGIT_BATCH;
    mk_strbuf_put(b, "    __shared__ __align__(16) unsigned char sD[%lld];\n    __shared__ float sF[%lld];\n"
                     "    for (long long q0 = 2 * (threadIdx.x >> 5) + (lane >> 4); q0 < %lldLL; q0 += %d) {\n"
                     "        float4 xs[%d];\n",
                  4 * K, Q, Q, 2 * MK_MV_WARPS * U, U);
    if (norm) mk_strbuf_put(b, "        float4 ws[%d];\n", U);
    mk_strbuf_put(b, "#pragma unroll\n"
                     "        for (int u = 0; u < %d; u++) {\n"
                     "            const long long k = 64 * (q0 + %d * u) + 4 * (lane & 15);\n"
                     "            if (k >= %lldLL) break;\n"
                     "            xs[u] = *(const float4 *)(A + k);%s\n"
                     "        }\n"
                     "#pragma unroll\n"
                     "        for (int u = 0; u < %d; u++) {\n"
                     "            const long long q = q0 + %d * u, k = 64 * q + 4 * (lane & 15);\n"
                     "            if (q >= %lldLL) break; /* alike for the warp's two 64s (Q is even) */\n"
                     "            mk_digits4(%s, k, q, sD, sF);\n"
                     "        }\n"
                     "    }\n",
                  U, 2 * MK_MV_WARPS, K, norm ? " ws[u] = *(const float4 *)(W + k);" : "", U,
                  2 * MK_MV_WARPS, Q, norm ? "mk_norm4(xs[u], ws[u], part[0])" : "xs[u]");
}


/* B0, B1, S0, S1: lane (g, t)'s first weights (at k = 32 t) and scales of
 * columns 16 p + g and 16 p + g + 8 of product source s of result r. */
static void put_tc_pointers(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg,
                            const mk_product_out *r, int s) {
    int pj = r->src[s].product, bk = pg->b[pj], sk = pg->b_scale[pj];
    long long ldb = (long long)l->in[bk].stride[1];
    const mk_tensor *sc = &l->in[sk];
    mk_strbuf_put(b, "        B0 = (const signed char *)i%d + (16 * p + g) * %lldLL + 32 * t; B1 = B0 + %lldLL;\n"
                     "        S0 = (const float *)i%d + (16 * p + g) * %lldLL; S1 = S0 + %lldLL;\n",
                  bk, ldb, 8 * ldb, sk, (long long)sc->stride[1], 8 * (long long)sc->stride[1]);
}

static void put_tc_loads(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg, int pj,
                         const char *k) {
    long long G = (long long)pg->b_group[pj], ss = (long long)l->in[pg->b_scale[pj]].stride[0];
    /* a step's 32 bytes of each column and the scales of its two 64s (k a
     * multiple of 128, so 64 h of it lies in one group) */
    mk_strbuf_put(b, "ld0[0] = __ldcs((const uint4 *)(B0 + %s)); ld0[1] = __ldcs((const uint4 *)(B0 + %s + 16));"
                     " ld1[0] = __ldcs((const uint4 *)(B1 + %s)); ld1[1] = __ldcs((const uint4 *)(B1 + %s + 16));",
                  k, k, k, k);
    for (int h = 0; h < 2; h++)
        mk_strbuf_put(b, " s0[%d] = S0[(%s + %d) / %lldLL * %lldLL]; s1[%d] = S1[(%s + %d) / %lldLL * %lldLL];",
                      h, k, 64 * h, G, ss, h, k, 64 * h, G, ss);
}

/* Result o's sums for tile p (16 columns) in the tensor-core form: its one
 * product over the warp's slice [kb, ke) of k (the first step's weights in
 * ld0, ld1, s0, s1 already where `loaded`), a step ahead, each step's math in
 * mk_tc_step and each column's sum in mk_tc_column (skeletons/mma_s8.cuh),
 * into red. */
static void put_tc_sums(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg, int o,
                        bool loaded) {
    const mk_product_out *r = &pg->out[o];
    int prods[MK_X_IN];
    product_sources(r, prods);
    int pj = r->src[prods[0]].product;
    mk_strbuf_put(b, "        float acc[2][2] = {};\n");
    if (!loaded) {
        put_tc_pointers(b, l, pg, r, prods[0]);
        mk_strbuf_put(b, "        if (kb < ke) { ");
        put_tc_loads(b, l, pg, pj, "kb");
        mk_strbuf_put(b, " }\n");
    }
    mk_strbuf_put(b, "#pragma unroll 1\n"
                     "        for (int k = kb; k < ke; k += 128) {\n"
                     "            const uint4 c0[2] = {ld0[0], ld0[1]}, c1[2] = {ld1[0], ld1[1]};\n"
                     "            const float w0[2] = {s0[0], s0[1]}, w1[2] = {s1[0], s1[1]};\n"
                     "            if (k + 128 < ke) { const int kn = k + 128; ");
    put_tc_loads(b, l, pg, pj, "kn");
    mk_strbuf_put(b, " }\n"
                     "            mk_tc_step(c0, c1, w0, w1, sD, sF, k, g, t, acc);\n"
                     "        }\n"
                     "#pragma unroll\n"
                     "        for (int h = 0; h < 2; h++) {\n"
                     "            const float v = mk_tc_column(acc, h, t);\n"
                     "            if (t == 0) red[wib + slice][8 * h + g] = v;\n"
                     "        }\n");
}

/* The kernel of a group in the tensor-core form (tc_slices: W warps a tile). */
static void put_tc_source(mk_strbuf *b, const mk_launch *l, int W) {
    const mk_product_group *pg = l->node->prod;
    long long K = (long long)pg->k;
    long long per = (K / 128 + W - 1) / W * 128; /* k a slice takes */
    mk_strbuf_put(b, "// moonkaas matrix-vector group $%d: [1, %lld] @ %d products, %d results%s, "
                     "int8 on the tensor cores\n",
                  l->node->id, K, pg->n_products, pg->n_outs,
                  pg->norm_w >= 0 ? ", RmsNorm folded in" : "");
    mk_cuda_put_fault(b);
    mk_strbuf_put(b, "%s%s%s", mk_skeleton_mma_s8, mk_skeleton_staging,
                  argmax_slot(pg, pg->n_outs) ? mk_skeleton_argmax : "");
    /* three blocks an SM (85 registers at most) */
    mk_cuda_put_head(b, 32 * MK_MV_WARPS, 3);
    mk_cuda_put_entry(b, l);
    mk_strbuf_put(b, "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
                     "    const long long warp = (long long)blockIdx.x * %d + (threadIdx.x >> 5);\n"
                     "    const float *A = (const float *)i%d;\n", MK_MV_WARPS, pg->a);
    if (pg->norm_w >= 0) mk_strbuf_put(b, "    const float *W = (const float *)i%d;\n", pg->norm_w);
    int slots = argmax_slot(pg, pg->n_outs);
    if (slots)
        mk_strbuf_put(b, "    __shared__ unsigned long long sbest[%d];\n"
                         "    if (threadIdx.x < %d) sbest[threadIdx.x] = 0ull;\n"
                         "    __syncthreads();\n", slots, slots);
    int PS = 1;
    for (int o = 0; o < pg->n_outs; o++)
        if (plain_sources(&pg->out[o]) > PS) PS = plain_sources(&pg->out[o]);
    mk_strbuf_put(b, "    const long long tile = warp / %d;\n"
                     "    const int slice = (int)(warp %% %d), wib = (int)(threadIdx.x >> 5) - slice;\n"
                     "    const int kb = slice * %lld, ke = min(%lld, kb + %lld); /* the warp's k */\n"
                     "    __shared__ float red[%d][16];\n"
                     "    float pre[1][2][%d], rot[1][1][2];\n    long long wbegin = 0, wend = 0;\n"
                     "    (void)pre; (void)rot; (void)wbegin; (void)wend;\n"
                     "    uint4 ld0[2], ld1[2]; /* a step's weights of columns g and g + 8 */\n"
                     "    float s0[2], s1[2];\n"
                     "    const signed char *B0, *B1;\n    const float *S0, *S1;\n",
                  W, W, per, K, per, MK_MV_WARPS, PS);
    /* the warp's first step before the wait, where the weights are constants */
    bool early = constant_weights(l, pg);
    long long start = 0;
    for (int o = 0; early && o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        int prods[MK_X_IN];
        product_sources(r, prods);
        long long tiles = r->n / 16;
        mk_strbuf_put(b, "    %sif (tile < %lldLL) {\n        const long long p = tile - %lldLL;\n",
                      o ? "else " : "", start + tiles, start);
        put_tc_pointers(b, l, pg, r, prods[0]);
        mk_strbuf_put(b, "        if (kb < ke) { ");
        put_tc_loads(b, l, pg, r->src[prods[0]].product, "kb");
        mk_strbuf_put(b, " }\n    }\n");
        start += tiles;
    }
    mk_strbuf_put(b, "    MK_GROUP_WAIT;\n");
    put_gathers(b, pg);
    put_staging(b, pg, 16, W, true);
    for (int phase = 1; phase <= 2; phase++) {
        if (phase == 2) mk_strbuf_put(b, "    __syncthreads();\n");
        start = 0;
        for (int o = 0; o < pg->n_outs; o++) {
            long long tiles = pg->out[o].n / 16;
            mk_strbuf_put(b, "    %sif (tile < %lldLL) do {\n        const long long p = tile - %lldLL;\n",
                          o ? "else " : "", start + tiles, start);
            if (phase == 1) {
                mk_strbuf_put(b, "        const long long n0 = 16 * p + 2 * (lane & 7);\n");
                put_epilogue_loads(b, l, pg, o, 2, "slice == 0 && lane < 8");
                put_tc_sums(b, l, pg, o, early);
            } else { /* lane q < 8 of the tile's first warp: its column pair 2q, 2q + 1 */
                mk_strbuf_put(b, "        if (slice != 0 || lane >= 8) break;\n"
                                 "        const long long n0 = 16 * p + 2 * lane;\n"
                                 "        float acc[1][2][1];\n"
                                 "        for (int c = 0; c < 2; c++) {\n"
                                 "            float s = 0.0f;\n"
                                 "            for (int w = 0; w < %d; w++) s += red[wib + w][2 * lane + c];\n"
                                 "            acc[0][c][0] = s;\n"
                                 "        }\n", W);
                put_epilogue(b, l, pg, o, 2, true, "");
            }
            mk_strbuf_put(b, "    } while (0);\n");
            start += tiles;
        }
    }
    if (slots) put_argmax_blocks(b, pg, 8LL * (MK_MV_WARPS / W));
    mk_strbuf_put(b, "}\n");
}

/* Whether A is staged in shared memory: on the int8 grid (made there), or
 * where its rows fit MK_STAGE_BYTES and the launch reads at least
 * MK_STAGE_MIN_WEIGHTS. */
static bool staged_a(const mk_launch *l, const mk_product_group *pg) {
    return pg->a8_group || ((long long)pg->m * pg->k * (long long)sizeof(float) <= MK_STAGE_BYTES &&
                            weight_bytes(l, pg) >= MK_STAGE_MIN_WEIGHTS);
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
    if (pg->m != 1 || pg->a8_group || most_products(pg) != 1 || tc_slices(l, pg)) return 2;
    for (int o = 0; o < pg->n_outs; o++)
        if (pg->out[o].n % 4) return 2;
    if (weight_element_bytes(pg) == 2) return pg->k <= 2048 ? 4 : 2;
    if (weight_element_bytes(pg) != 1 || weights_per_load(l, pg) != 16 || !staged_a(l, pg))
        return 2;
    for (int j = 0; j < pg->n_products; j++)
        if (pg->b_scale[j] < 0) return 2;
    return 4;
}

/* The kernel of a matrix–vector group's launch: one warp per C columns of a
 * result (every row of A; warp_columns) and slice of k (W of them,
 * product_slices), block_warps(W) warps a block, each on its own: a warp
 * reads all of A, so it sums the RmsNorm's squares of x in the same loop and
 * scales its dot products of w * x by 1 / rms at the end (no block-wide step
 * unless A is staged). */
void mk_cuda_product_source(mk_strbuf *b, const mk_launch *l) {
    const mk_product_group *pg = l->node->prod;
    if (int W = tc_slices(l, pg)) {
        put_tc_source(b, l, W);
        return;
    }
    int M = (int)pg->m;
    long long K = (long long)pg->k;
    /* float4 loads where every row of A, the weight and each B column is 16-byte aligned */
    int E = weights_per_load(l, pg);
    bool staged = staged_a(l, pg);
    int C = warp_columns(l, pg), W = product_slices(l, pg), BW = block_warps(W);
    mk_strbuf_put(b, "// moonkaas matrix-vector group $%d: [%d, %lld] @ %d products, %d results%s%s%s\n",
                  l->node->id, M, K, pg->n_products, pg->n_outs,
                  pg->norm_w >= 0 ? ", RmsNorm folded in" : "", C == 4 ? ", 4 columns a warp" : "",
                  W == 3 ? ", k in 3 slices" : "");
    mk_cuda_put_fault(b);
    mk_strbuf_put(b, "%s%s%s", mk_skeleton_weights,
                  staged || pg->norm_w >= 0 ? mk_skeleton_staging : "",
                  argmax_slot(pg, pg->n_outs) ? mk_skeleton_argmax : "");
    mk_cuda_put_head(b, 32 * BW, 0);
    mk_cuda_put_entry(b, l);
    mk_strbuf_put(b, "    const int lane = threadIdx.x & 31;\n"
                     "    const long long warp = (long long)blockIdx.x * %d + (threadIdx.x >> 5);\n", BW);
    mk_strbuf_put(b, "    const float *A = (const float *)i%d;\n", pg->a);
    if (pg->norm_w >= 0) mk_strbuf_put(b, "    const float *W = (const float *)i%d;\n", pg->norm_w);
    int slots = argmax_slot(pg, pg->n_outs);
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
    int PS = 1; /* registers of the epilogues' loads (put_epilogue_loads) */
    for (int o = 0; o < pg->n_outs; o++)
        if (plain_sources(&pg->out[o]) > PS) PS = plain_sources(&pg->out[o]);
    mk_strbuf_put(b, "    float pre[%d][%d][%d], rot[%d][%d][2];\n    long long wbegin = 0, wend = 0;\n"
                     "    (void)pre; (void)rot; (void)wbegin; (void)wend;\n", M, C, PS, M, C / 2);
    int pre = preload_steps(l, pg, C, E, W, staged);
    put_preloads(b, l, pg, C, E, W, pre);
    if (staged) put_staging(b, pg, E, W, false);
    for (int phase = W > 1 ? 1 : 0; phase <= (W > 1 ? 2 : 0); phase++) {
        if (phase == 2) mk_strbuf_put(b, "    __syncthreads();\n");
        long long start = 0;
        for (int o = 0; o < pg->n_outs; o++) {
            long long groups = pg->out[o].n / C; /* of C columns, a warp (and its slices) each */
            mk_strbuf_put(b, "    %sif (pair < %lldLL) do {\n        const long long p = pair - %lldLL;\n",
                          o ? "else " : "", start + groups, start);
            put_result(b, l, pg, o, C, E, W, pre, phase, staged);
            mk_strbuf_put(b, "    } while (0);\n");
            start += groups;
        }
    }
    if (slots) put_argmax_blocks(b, pg, C / 2 * (BW / W));
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
size_t mk_cuda_product_aux_bytes(const mk_product_group *pg) {
    return (size_t)argmax_aux_offset(pg, pg->n_outs);
}

/* The grid of a group's launch: block_warps(W) warps a block, W of them the
 * C columns of warp_columns (in the tensor-core form, a tile of 16 columns). */
void mk_cuda_product_grid(const mk_launch *l, unsigned int *blocks, unsigned int *threads) {
    const mk_product_group *pg = l->node->prod;
    int tc = tc_slices(l, pg), W = tc ? tc : product_slices(l, pg);
    *blocks = mk_cuda_blocks(product_warps(pg, tc ? 16 : warp_columns(l, pg), W), block_warps(W));
    *threads = 32 * (unsigned int)block_warps(W);
}
