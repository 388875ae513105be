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
 * Long because it is one skeleton whose parts all write into the same warp
 * layout (its C columns, slice, lane, step k) and its registers: the weight
 * loads per dtype, preloads, prefetch and staging before the sums, the two
 * step forms, the slices' reduction and the epilogues after. The int8 grid
 * (put_grid_copy, put_grid_step) and the tensor-core form, which shares the
 * staging, the epilogues and the ArgMax blocks, are the parts that could move
 * out if they grow. A third of its lines are comments, most of them the
 * measurements of forms tried and not kept, beside the code they concern; the
 * device code it pastes unchanged is already out, in kernels/skeletons/.
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
 * kernels' code, the caches' rows and the activations. On the H200 at 5548bef
 * (tok/s, plain loads to evict-first): stories110M 4,475 / 4,485 to 4,555 /
 * 4,572, in bfloat16 5,151 to 5,309, in int8 4,907 to 5,026; stories15M
 * 12,150 to 13,035; MK_CUDA_TIMELINE put 110M's attention at 4.6 us after its
 * wait, against 5.3.
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

/*
 * Warps per column pair (1, 2, 4 or 8; per two pairs where a warp takes 4
 * columns, warp_columns, so that its launch has half the warps), splitting k:
 * enough warps in flight
 * to read the weights at full bandwidth when the columns are few (a layer's
 * [768, 768] has 384 pairs, 132 SMs want thousands of warps), none idle: a
 * launch aims for 3,072 warps per byte of weight element, at most 8,192.
 * Measured on the H200 with Llama-2-7B (tok/s at targets 3,072 / 4,096 /
 * 6,144 / 8,192 warps, whatever the dtype): int8 327 / 326 / 296 / 308,
 * bfloat16 - / 229 / 248 / 242; stories110M and 15M split alike at each.
 * Again at 67208a0 (H200, bfloat16, 2 runs each): targets of 1,536 / 2,048 /
 * 3,072 / 4,096 warps a byte gave 272.2 / 272.8 / 271.9 and 272.1 / 267.8.
 * A slice's step here is 128 float32 elements whatever the dtype, so where k
 * is short a narrower dtype's last slices may have no step at all (stories
 * 110M's q/k/v: k = 768 is 3 steps of 256 in bfloat16, 4 slices). Counting
 * the dtype's own step (16 bytes a lane) leaves none idle, but it was slower
 * on the H200 at eab74b9: stories110M bfloat16 5,107 / 5,127 to 4,925 tok/s,
 * int8 4,869 / 4,833 to 4,024; stories15M bfloat16 13,088 / 13,033 to 11,763.
 * Nor fewer warps, so that stories110M's q/k/v blocks (576, whose last 48
 * start about 2 us after their wait under MK_CUDA_TIMELINE) fit beside w2's:
 * targets of 2,048 / 1,536 warps (q/k/v and w1 / w3 at 2 slices) gave
 * 4,643 and 4,681 / 4,583 tok/s against 4,645 / 4,606, in bfloat16 5,231
 * against 5,420 (H200, 75f6300).
 *
 * An int8 launch of 4 columns a warp that would take 2 slices takes 3, in
 * blocks of 12 warps (block_warps): Llama-2-7B's wo and w2, whose 256 blocks
 * of 8 warps had left 16 warps an SM (2 blocks), now have 24 in as many
 * blocks, in one wave. MK_CUDA_TIMELINE had them stream at 2.6 and 3.2 TB/s
 * against q/k/v's 3.7 (24 warps an SM). On the H200 at 9c49fbd (one call,
 * alternating, bench_llama2 --7b --precision q8), Llama-2-7B went from 431.4
 * / 433.1 / 432.5 tok/s to 454.9 / 453.2 / 455.6; in blocks of 6 warps (512
 * blocks, 4 an SM) to 416.7 / 414.7 / 416.4. Not for 2-byte weights (in
 * the next call, against the same): 3 slices for every 4-column launch of 2
 * (stories15M's q/k/v and wo, k = 288) took stories15M in bfloat16 from
 * 14,090 / 13,871 to 13,958 / 13,803; 3 for stories110M's (k = 768, 3
 * bfloat16 steps, at 4 slices one idle) from 6,136 / 6,103 to 6,028 / 6,009.
 * Nor 3 slices for bfloat16's wo and w2 in Llama-2-7B (a pair a warp, 4
 * slices: 1,024 blocks, 2.6 waves; at 3, 512 blocks of 12 warps, 1.9): on
 * the H200 at 08c6696 (one call, alternating), 281.2 / 282.7 tok/s to 281.0
 * / 281.4.
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

/* Warps of a block. On the H200 at eab74b9, 16 and 32 warps a block for the
 * groups with k >= 4,096 (A staged once a block, for twice or four times the
 * column pairs) took Llama-2-7B in bfloat16 from 270.4 to 254.6 and 264.5
 * tok/s, in int8 from 368.4 to 343.7 (16); 16 a block everywhere took
 * stories110M from 4,392 to 4,148. Fewer for w1 / w3 alone, so that its
 * 5,504 warps fill whole waves (7 a block: 787 blocks, 1.99 waves of 3 an SM,
 * against 688 in 1.74), on the H200 at ce3f9a3 (one call, alternating): int8
 * 419.8 / 419.8 against 416.4 / 417.6 / 417.0, 5 or 6 a block 411.7 / 410.9
 * and 410.9; bfloat16 283.0 / 282.4 against 281.9 / 282.9 / 282.0. Not kept:
 * 0.7 % in int8 alone, and a block fitted to whole waves needs the device's
 * SMs and the kernel's registers, which the source does not know. */
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
 * in L2 until its warps read it: measured on the H200, sending every column
 * whole took Llama-2-7B from 315 to 275 tok/s in int8 and from 240 to 198 in
 * bfloat16 (the first wave's columns outgrow L2 and are read twice), and
 * stories110M in float32 from 3,008 (512 bytes a column) to 2,788. 4 MB in
 * place of 2 at 67208a0: Llama-2-7B bfloat16 272.1 against 271.9 / 272.1.
 * More at 6e22c9b (H200): 12 and 24 MB gave Llama-2-7B bfloat16 264.8 and
 * 257.4 against 269.5 / 268.6, int8 336.1 (24 MB) against 367.0; 16 MB gave
 * stories110M 4,409 against 4,402.
 * Nor 24 MB where A is an attention group's result (whose launch reads no
 * weights, so that memory idles while it runs; Llama-2-7B int8's wo whole,
 * 17 MB): on the H200 at fbee6b2 (one call, alternating), Llama-2-7B int8
 * went from 425.4 / 426.4 to 417.0 / 418.1 tok/s, stories15M from 13,531 /
 * 13,481 to 13,604 / 13,739, stories110M 5,058 to 5,067 (bfloat16 5,883 to
 * 5,878).
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
 * int8 took 4 times the registers (stories110M in int8 went from 4,326 to
 * 3,998 tok/s); raw, Llama-2-7B went from 258 to 265 tok/s in bfloat16 and
 * from 308 to 332 in int8, stories110M from 4,430 to 4,880 in int8, but 1 %
 * slower in bfloat16, whose steps fit widened.
 * Measured on the H200 (tok/s at 16 / 32 / 64 floats): Llama-2-7B bfloat16
 * 251 / 265 / 257, stories15M float32 about 10,000 / 10,200 / 10,200; at
 * 67208a0, 64 floats: Llama-2-7B bfloat16 264.0 against 271.9 / 272.1.
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
           (copy_steps(pg, E, W) > MK_STAGE_WHOLE || pg->weight_bytes == 1);
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
 * it holds). Measured on the H200, Llama-2-7B in int8: 332 tok/s as the
 * other dtypes (loads at the step, unrolled by 4, where the compiler loads
 * one step at a time), 361 a step ahead, 337 two steps ahead (97 registers),
 * 311 three, 357 two only where results read one product (q/k/v, wo, w2);
 * 346 a step ahead unrolled by 4. Not for bfloat16 (265 before,
 * 256 a step ahead: a third of int8's math a byte) nor on the int8 grid
 * (W8A8, whose DP4As are less math a byte still): on the H200 at 20fc405 (one
 * call, alternating), a step ahead there took Llama-2-7B -q q8a8 from 351.4 /
 * 351.5 tok/s to 353.1 / 351.9, stories110M from 3,576 to 3,584 and
 * stories15M from 8,910 to 8,785.
 * Nor helped, on an H100 (not yet measured on the H200): bfloat16's loop
 * loading 2 or 4 steps' raw weights together before their math, in place of
 * the loop unrolled by 4 (Llama-2-7B 201.4 / 201.6 tok/s before; 2 steps
 * where results read one product 201.8, 4 steps 201.4, 2 everywhere 201.7);
 * stories110M in float32 and bfloat16 alike, within noise.
 * A microbenchmark of Llama-2-7B's int8 q/k/v shape alone (H200, at eab74b9,
 * 4 copies of the weights past L2, x staged as here): a step ahead streams at
 * 2.13 TB/s (63 registers, 4 blocks an SM); a cp.async ring of 2 / 3 / 4
 * steps a warp in shared memory, 2.26 / 2.17 / 2.10; 2 steps ahead at 40
 * registers (6 blocks an SM), 2.69; the same loop without the widening math,
 * 3.2. So the int8 launch is held by its math and its warps an SM, not by
 * its bytes in flight; the generated q/k/v takes 78 registers (3 blocks).
 * Yet fewer registers through fewer preloads lost (H200, at 49997a7, int8):
 * MK_PRELOAD_FLOATS 10 / 20 for int8 (78 / 62 / 80 / 63 / 64 registers for
 * q/k/v, wo, w1 / w3, w2, the classifier became 64 / 48 / 80 / 48 / 56 at
 * 10) took Llama-2-7B from 369.6 / 369.1 to 333.1 / 345.0 tok/s, and with
 * __launch_bounds__(256, 4) (64 registers at most, no spills) to 357.1 /
 * 355.3; stories110M 4,834 to 4,838 (10) and 4,718 (20, 4 blocks). Nor on
 * w1 / w3 alone (80 registers, 688 blocks: 1.74 waves of 3 blocks an SM;
 * H200, d3b2779, one call): __launch_bounds__(256, 4) (64 registers, no
 * spills) took Llama-2-7B from 404.1 / 401.4 to 386.2 / 385.0 tok/s, k in 2
 * slices to 396.4, both to 400.8. Nor in
 * bfloat16 (H200, at 1fcc590; q/k/v and w1 / w3 at 70 and 76 registers, 3
 * blocks an SM): __launch_bounds__(256, 4) took Llama-2-7B from 275.4 /
 * 273.4 / 275.2 to 264.5 / 263.5 tok/s (222.3 at 5 blocks), stories110M from
 * 5,786 / 5,890 to 5,550 / 5,494. Nor __launch_bounds__(256, 3) on
 * bfloat16's w1 / w3 alone, now at 84 registers (2 blocks an SM; at 80, 3,
 * with 80 bytes spilled): on the H200 at 08c6696 (one call, alternating),
 * Llama-2-7B went from 281.2 / 282.7 to 277.1 / 277.2.
 * Nor, for bfloat16, feeding warps by bulk copies (cp.async.bulk into a ring
 * of S chunks of C rows a warp, mbarrier waits; persistent warps walking
 * their column pairs): a microbenchmark of Llama-2-7B's shapes alone on the
 * H200 (4 copies of the weights past L2, 40 launches) streamed q/k/v at 3.44
 * to 3.64 TB/s against 3.79 in this kernel's form, w1 / w3 3.65 to 3.93
 * against 3.99, w2 3.34 against 3.56 (C 256 to 2,048, S 3 to 16, 4 or 8
 * warps a block, 1 or 2 blocks an SM); only wo, at 4,096 columns, went from
 * 2.47 to 2.87 (the model's wo splits k in 4 slices). MK_CUDA_TIMELINE puts
 * the model's q/k/v at the same 3.8 TB/s: what Llama-2-7B loses to the
 * bandwidth is each launch's start and end, not its stream.
 * Nor, in int8, more bytes in flight without registers: each step sending
 * the lines of the step 2 or 4 ahead to L2 (prefetch.global.L2 from one lane
 * in 8) took Llama-2-7B from 405.8 / 405.0 to 394.2 / 382.9 tok/s (H200, at
 * 99c9460, one call).
 * Nor less math through DP4A: where A is one staged row (Llama-2-7B's wo,
 * w1 / w3 and w2), A staged as the tensor-core form's digits (put_digit_copy)
 * and a lane's 16 weights of a column taken in 16 DP4As, the digits' sums
 * weighed by 2^-8n (about 58 instructions per 32 weights a step against 107).
 * On the H200 at ce3f9a3 (one call, alternating), Llama-2-7B int8 went from
 * 420.4 / 420.2 / 420.3 to 361.5 / 360.5 tok/s (w1 / w3 at 80 registers and 56
 * bytes spilled under __launch_bounds__(256, 3)), 360.6 / 357.6 without the
 * bound (94 registers, 2 blocks an SM). With the digit copy replaced by a
 * plain copy of A's bits (wrong sums: a bound on the loop alone), 382.0 /
 * 383.3 against 415.4 / 415.0 / 416.7 in the next call: each block making the
 * digits of the whole A costs wo's and w2's short blocks much, and the DP4A
 * loop is slower than this one even without it (lowp_test passed; the patch
 * is not kept).
 * Nor two steps ahead where a warp takes 4 columns (warp_columns) and a lane
 * has more than 8 steps (w2's 11; 80 registers, 3 blocks an SM), though alone
 * w2 streamed at 13.4 us against 14.8 a step ahead (98 registers, 2 blocks an
 * SM): on the H200 at 2395c22 (one call, alternating), Llama-2-7B int8 went
 * from 427.2 / 427.9 to 424.6 / 426.3 tok/s (lowp_test passed).
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
    const mk_group *grp = l->node->group;
    int which = 1; /* the faulting member for the error: the row write */
    while (which < grp->n_members && grp->members[which - 1] != r->end) which++;
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
 * the copy's barrier is a small part of it: on the H200, stories110M's
 * launches (at most 2 MB of bfloat16 a layer) were 4 % slower staged,
 * Llama-2-7B's (16 MB and more) 5 % faster in bfloat16 and 10 % in int8.
 * Nor a larger shared-memory carveout (cudaFuncAttributePreferredShared-
 * MemoryCarveout 100, so that four of w2's blocks of 44 KB fit an SM beside
 * an L1 of 28 KB): on the H200 at 1b4afc7, Llama-2-7B in int8 went from
 * 393.5 to 359.5 tok/s with it on the kernels staging more than 32 KB (w2)
 * alone, 391.2 to 360.6 on every kernel; bfloat16 274.6 to 263.9 (w2 at 2
 * slices, 265.5), stories110M in bfloat16 5,908 to 5,709. The occupancy API
 * gives w2 (62 registers) 4 blocks an SM either way; MK_CUDA_TIMELINE's raw
 * stamps saw at most 396 of its 512 blocks at once (3 an SM) either way. */
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
 * else MK_STAGE_BATCH where the weights are 16-bit floats, else 1.
 * Measured on the H200 against 1b4afc7 (bench_llama2 --7b, one run each,
 * same call): bfloat16 at 4 a batch 278.5 / 278.2 / 278.3 tok/s against
 * 275.2 / 274.7 / 273.3, at 2 a batch 266.6 / 266.4. In int8, 2 a batch (the
 * tensor-core form's digit copy too) 395.1 / 393.6 against 393.8 / 393.6, 4
 * a batch 375.2: w2 went from 62 to 70 registers, 3 blocks an SM. At
 * a98edba, int8's w2 alone (P steps preloaded, U a batch): P 3 U 1 (then)
 * 394.6 / 394.4, P 1 U 11 (now) 401.1 / 400.7, P 2 U 4 397.4, P 2 U 6 397.6,
 * P 2 U 2 396.5; P 1 U 4 346.8 and U 6 350.2 at 48 registers, which let 5
 * blocks an SM take w2's 512, leaving 29 SMs idle. At 9ca5f6e, int8's wo
 * (4 steps) whole: 407.2 / 404.6 against 402.3 / 399.8 (2 a batch, 403.6;
 * 4 a batch with the preloads as they were, 65 registers, 3 blocks an SM).
 * At 260b377, int8's w1 / w3 (a norm, 4 steps) all at once, 80 registers as
 * before: 415.0 / 415.4 / 415.2 against 417.7 / 417.7 / 416.1. Not measured
 * in float32, where 4 a batch takes wo from 64 to 74 registers and w1 / w3
 * from 73 to 88 (ptxas, sm_90).
 */
#define MK_STAGE_BATCH 4

static int stage_batch(const mk_product_group *pg, int E, int W) {
    long long steps = copy_steps(pg, E, W);
    long long U = whole_copy(pg, E, W) ? steps : pg->weight_bytes == 2 ? MK_STAGE_BATCH : 1;
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
 * Measured on the H200 against 0830b77 (bench_llama2 --precision q8, one
 * call each): Llama-2-7B 376.2 to 393.4 tok/s, then 376.5 to 391.7;
 * stories110M (its classifier alone takes this form) 5,442 to 5,479.
 * MK_CUDA_TIMELINE: a layer's q/k/v from 21.4 to 23.5 us to 18.1 to 19.6, the
 * classifier from 56.6 to 53.8. Not for results of two products (w1 / w3,
 * SiLU(x W1^T) * x W3^T; a warp a product's slice): 29.7 us against 28 in
 * the int8 form, Llama-2-7B 378.5 tok/s with them, 367.9 at 4 slices.
 * Measured alone (a microbenchmark of Llama-2-7B's int8 shapes, 4 copies of
 * the weights past L2, launches back to back): q/k/v (12,288 x 4,096) 27.0
 * us in the int8 form, 18.9 here (4 slices); 22,016 x 4,096 40.7 against
 * 29.8 (2 slices); but w2 (4,096 x 11,008) 20.6 against 24.7 at best and wo
 * (4,096 x 4,096) 9.3 against 11.5: 256 tiles of 16 columns are too few
 * warps (hence MK_TC_COLUMNS). Loading 16 bytes of a column a lane (64 of k
 * a step) gave 2.1 TB/s for q/k/v, 64 bytes 2.2; 8 columns a warp (the
 * weights as the MMA's B) 2.6.
 * Still the faster at 3f652ed (H200, one call), though the int8 form has
 * gained since: without this form Llama-2-7B went from 402.3 / 402.1 to
 * 383.2 / 384.2 tok/s (q/k/v alone 385.3, the classifier alone 401.7), and
 * MK_CUDA_TIMELINE put a layer's q/k/v at 23.6 us against 19.8, the
 * classifier at 58.9 against 51.4.
 * Nor, on the H200 at 99c9460 (Llama-2-7B int8, one call each, base 405.8
 * / 405.0 then 404.8 / 404.9 then 405.8 / 404.0 tok/s):
 *   - each load 64 contiguous bytes of a column (lane t the bytes 16 t ..
 *     and 64 + 16 t ..), so that an MMA's k lie in one 64 and each 8 bytes
 *     take one MMA, not two (half the MMAs; q/k/v at 78 registers without
 *     spills, against 80 with 8 bytes spilled): 396.6 / 394.0. A lane's 32
 *     contiguous bytes, each load touching all four sectors of its lines,
 *     stream faster;
 *   - sending later steps' lines to L2 (prefetch.global.L2, no registers):
 *     2 or 4 steps ahead in the loop, 402.3 / 394.3; steps 2 and 3 before
 *     the wait, 402.2;
 *   - the classifier at 4 blocks an SM (64 registers, no spills: its 500
 *     blocks in 0.95 waves, not 1.26): 407.1 / 405.2, within a call's
 *     noise, and the blocks an SM hold depend on the device, which the
 *     source does not know.
 * Nor, on the H200 at f2bb78f (base 416.6 / 416.8 tok/s in the same
 * call): each warp's steps through a ring of S slots in shared memory by
 * cp.async (the scales too; 52 KiB of dynamic shared memory a block, still
 * 3 blocks an SM, 70 registers), S - 1 steps in flight against one now. With a lane
 * copying the 32 bytes it reads, 333 tok/s (S = 2, 3, 4: 343, 333, 338);
 * with 8 lanes copying a column's 128 bytes (whole lines), 395.1 at S = 2,
 * 378.9 / 378.3 at S = 3, 382.8 at S = 4. More steps in flight made it
 * slower, so this form is not waiting on its loads' latency alone.
 * Still too few warps for wo and w2 (4,096 columns, 8 slices) after the
 * digit copy's batching: on the H200 at 3bf2fa8 (one call), MK_TC_COLUMNS
 * at 4,096 took Llama-2-7B int8 from 416.2 / 417.4 to 400.8 / 401.7 tok/s,
 * and w2 alone in this form to 402.6.
 * Nor slices interleaved by step (warp s of a tile taking steps s, s + W,
 * s + 2W, ..., so that a tile's W warps read W x 128 contiguous bytes of each
 * of their 16 rows at once, as the int8 form's slices do; same registers): on
 * the H200 at ce3f9a3 (one call, alternating), 419.2 / 421.1 tok/s against
 * 420.4 / 420.2 / 420.3, within the noise.
 * Since warps took 4 columns (warp_columns), that form is the faster where k
 * is a multiple of 512 (a warp's step: 32 lanes of 16 bytes, none idle): on
 * the H200 at 5d73ddd (one call, alternating), Llama-2-7B int8 with its
 * q/k/v and classifier (k = 4,096) in it went from 427.8 / 429.9 to 435.9 /
 * 435.1 tok/s. Not stories110M's classifier (k = 768, a warp's second step
 * half idle): with it in 4 columns, not here, stories110M int8 went from
 * 5,476 / 5,488 to 5,417 / 5,421 (next call; its other launches in 4 columns
 * too, in both). Hence k not a multiple of 512 here.
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
 * any. A warp a 64 (two elements a lane, a byte a digit, one 64's loads at a
 * time: eight trips to L2 in a row for [1, 4096]) held up every launch in
 * this form: on the H200 against 279ef91 (one call, alternating), Llama-2-7B
 * in int8 went from 402.5 / 404.5 to 414.7 / 417.5 tok/s, stories110M (its
 * classifier) from 5,517 / 5,520 to 5,555 / 5,551; the digits are the same.
 * What is left of its cost is small: with the digits replaced by a plain copy
 * of A's bits (wrong sums, a bound), Llama-2-7B went from 415.4 / 415.0 /
 * 416.7 to 418.5 / 418.3 (H200, ce3f9a3, one call). */
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
    const mk_product_group *pg = mk_node_product(l->node);
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
 * Measured alone (a microbenchmark of Llama-2-7B's int8 shapes on the H200,
 * 4 copies of the weights past L2, launches back to back with PDL, a
 * hand-written kernel of this form against the generated one with a pair a
 * warp): wo (4,096 x 4,096) 6.65 against 7.64 us, w2 (4,096 x 11,008) 14.8
 * against 16.6; 8 columns a warp (127 registers) 7.45 and 17.8; w1 / w3 (two
 * products, 8 rows a warp at 4 columns, 128 registers) 26.8 against 25.9.
 * In the model (H200, bench_llama2 --7b --precision q8, one call, alternating
 * with the pair form; wo at 71 registers and w2 at 79, 3 blocks an SM):
 * Llama-2-7B 427.2 / 428.6 tok/s against 420.7 / 418.7. stories15M's int8
 * classifier takes it too (k = 288 keeps it off the tensor cores): in the
 * next call, 13,435 / 13,513 tok/s against 13,295 / 13,247.
 * Which launches gain, measured in the model (H200, against 5d73ddd, each
 * comparison alternating in one call, tok/s). With 4 columns wherever a
 * result reads one product, bfloat16 gains where k is short (stories110M
 * 5,861 / 5,938 to 6,040 / 6,114; stories15M 13,308 / 13,625 to 14,015 /
 * 13,979, its q/k/v spilling 72 bytes) and loses where it is long
 * (Llama-2-7B, k of 4,096 and 11,008: 284.3 / 285.3 to 281.3 / 282.2); int8
 * loses where A is not staged (stories110M 5,557 / 5,513 to 5,476 / 5,488,
 * stories15M 13,819 / 13,595 to 12,830 / 12,838), float32 too (stories110M
 * 5,037 to 4,997, stories15M 13,955 to 13,100). Chosen by staging, not k
 * (bfloat16 in 4 columns only where A is not staged, the classifiers in
 * pairs), stories15M lost (13,696 / 13,660 to 13,307 / 13,339) and
 * stories110M gained less (5,886 / 5,915 to 5,983 / 6,022). As landed (k at
 * most 2,048): stories110M 5,872 / 5,921 to 6,069 / 6,126, stories15M
 * 13,701 / 13,780 to 14,152 / 13,976, in float16 13,659 to 14,023.
 * Nor stories110M's w2 (k = 2,048, bfloat16: 192 blocks, 0.29 waves,
 * MK_CUDA_TIMELINE 2.52 us a layer, against float32's 1.8 to 2.3 in pairs)
 * in pairs (k below 2,048 for 4 columns: 384 blocks): on the H200 at
 * 9805f9d (one call, alternating), 6,130 / 6,081 / 6,130 tok/s to 6,046 /
 * 6,118 / 6,061, w2 2.69 us a layer.
 * Nor, to fill a wave, twice the slices where an int8 launch in this form
 * has 2 (Llama-2-7B's wo and w2 at 4: 512 blocks each, wo at 60 registers
 * and 4 blocks an SM, w2 at 79 and 3): on the H200 at b25fb43 (one call,
 * alternating), 433.1 / 432.7 to 422.1 / 422.2 tok/s.
 */
static int warp_columns(const mk_launch *l, const mk_product_group *pg) {
    if (pg->m != 1 || pg->a8_group || most_products(pg) != 1 || tc_slices(l, pg)) return 2;
    for (int o = 0; o < pg->n_outs; o++)
        if (pg->out[o].n % 4) return 2;
    if (pg->weight_bytes == 2) return pg->k <= 2048 ? 4 : 2;
    if (pg->weight_bytes != 1 || weights_per_load(l, pg) != 16 || !staged_a(l, pg))
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
    const mk_product_group *pg = mk_node_product(l->node);
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
    const mk_product_group *pg = mk_node_product(l->node);
    int tc = tc_slices(l, pg), W = tc ? tc : product_slices(l, pg);
    *blocks = mk_cuda_blocks(product_warps(pg, tc ? 16 : warp_columns(l, pg), W), block_warps(W));
    *threads = 32 * (unsigned int)block_warps(W);
}
