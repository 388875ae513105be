/*
 * matvec_tc.c — the tensor-core form of a matrix–vector kernel:
 * large int8 launches take their weights through the integer MMA
 * (mma.m16n8k32.s8, kernels/skeletons/mma_s8.cuh), A staged as fixed-point
 * digits; the staging's other parts, the epilogues and the ArgMax blocks are
 * matvec.c's and matvec_step.c's.
 */
#include "matvec.h"
#include "skeletons.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/*
 * The tensor-core form: int8 weights (with their float32 scales) through the
 * integer MMA (mma.m16n8k32.s8), where every product's weights are int8 in
 * groups of a multiple of 64, A is one row, k a multiple of 128 but not of
 * 512, each result reads one product and the launch has at least
 * MK_TC_COLUMNS columns in results of multiples of 16 (mk_mv_tc_slices). The int8
 * form above spends 3 instructions a weight widening and multiplying; here
 * the weights go into the MMA as they are loaded.
 *
 * A becomes fixed point as the block stages it (mk_mv_put_digit_copy): per 64 of k,
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
 * then run the epilogue of a column pair each (mk_mv_put_epilogue). The first
 * step's weights are loaded before the wait where they are constants.
 *
 * Faster than the int8 form for Llama-2-7B's q/k/v and stories110M's
 * classifier; too few warps below MK_TC_COLUMNS; where k is a multiple of 512
 * the 4-column int8 form (warp_columns) is faster, hence not there.
 */
#define MK_TC_COLUMNS 8192 /* the fewest columns a launch in this form has */
#define MK_TC_WARPS 2048   /* warps a launch aims for, splitting k */

/* The warps that split k in the tensor-core form, or 0 where the group does not take it. */
int mk_mv_tc_slices(const mk_launch *l, const mk_product_group *pg) {
    if (pg->m != 1 || pg->a8_group || pg->k % 128 || pg->k % 512 == 0 ||
        mk_mv_weights_per_load(l, pg) != 16 || (long long)pg->k * 4 > MK_STAGE_BYTES ||
        mk_mv_weight_bytes(l, pg) < MK_STAGE_MIN_WEIGHTS)
        return 0;
    for (int j = 0; j < pg->n_products; j++)
        if (pg->b_scale[j] < 0 || pg->b_group[j] % 64) return 0;
    for (int o = 0; o < pg->n_outs; o++)
        if (pg->out[o].row_index >= 0) return 0; /* a ReplaceAt's write: the plain form's */
    long long columns = 0;
    for (int o = 0; o < pg->n_outs; o++) {
        int prods[MK_X_IN];
        if (pg->out[o].n % 16 || mk_mv_product_sources(&pg->out[o], prods) != 1) return 0;
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
 * (mk_mv_tc_slices: A and the norm's weight are 16-byte aligned), each digit's four
 * bytes stored as one word; a warp loads MK_DIGIT_BATCH 64s before it stores
 * any, so that a warp does not wait on L2 once per 64. */
#define MK_DIGIT_BATCH 4
void mk_mv_put_digit_copy(mk_strbuf *b, const mk_product_group *pg) {
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
    mk_mv_product_sources(r, prods);
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

/* The kernel of a group in the tensor-core form (mk_mv_tc_slices: W warps a tile). */
void mk_mv_put_tc_source(mk_strbuf *b, const mk_mv_plan *p) {
    const mk_launch *l = p->l;
    const mk_product_group *pg = p->pg;
    int W = p->W;
    long long K = (long long)pg->k;
    long long per = (K / 128 + W - 1) / W * 128; /* k a slice takes */
    mk_strbuf_put(b, "// moonkaas matrix-vector group $%d: [1, %lld] @ %d products, %d results%s, "
                     "int8 on the tensor cores\n",
                  l->node->id, K, pg->n_products, pg->n_outs,
                  pg->norm_w >= 0 ? ", RmsNorm folded in" : "");
    mk_codegen_put_fault(b);
    mk_strbuf_put(b, "%s%s%s", mk_skeleton_mma_s8, mk_skeleton_staging,
                  mk_mv_argmax_slot(pg, pg->n_outs) ? mk_skeleton_argmax : "");
    /* three blocks an SM (85 registers at most) */
    mk_codegen_put_head(b, 32 * MK_MV_WARPS, 3);
    mk_codegen_put_entry(b, l);
    mk_strbuf_put(b, "    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
                     "    const long long warp = (long long)blockIdx.x * %d + (threadIdx.x >> 5);\n"
                     "    const float *A = (const float *)i%d;\n", MK_MV_WARPS, pg->a);
    if (pg->norm_w >= 0) mk_strbuf_put(b, "    const float *W = (const float *)i%d;\n", pg->norm_w);
    int slots = mk_mv_argmax_slot(pg, pg->n_outs);
    if (slots)
        mk_strbuf_put(b, "    __shared__ unsigned long long sbest[%d];\n"
                         "    if (threadIdx.x < %d) sbest[threadIdx.x] = 0ull;\n"
                         "    __syncthreads();\n", slots, slots);
    int PS = 1;
    for (int o = 0; o < pg->n_outs; o++)
        if (mk_mv_plain_sources(&pg->out[o]) > PS) PS = mk_mv_plain_sources(&pg->out[o]);
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
    bool early = mk_mv_constant_weights(l, pg);
    long long start = 0;
    for (int o = 0; early && o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        int prods[MK_X_IN];
        mk_mv_product_sources(r, prods);
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
    mk_mv_put_gathers(b, pg);
    mk_mv_put_staging(b, p);
    for (int phase = 1; phase <= 2; phase++) {
        if (phase == 2) mk_strbuf_put(b, "    __syncthreads();\n");
        start = 0;
        for (int o = 0; o < pg->n_outs; o++) {
            long long tiles = pg->out[o].n / 16;
            mk_strbuf_put(b, "    %sif (tile < %lldLL) do {\n        const long long p = tile - %lldLL;\n",
                          o ? "else " : "", start + tiles, start);
            if (phase == 1) {
                mk_strbuf_put(b, "        const long long n0 = 16 * p + 2 * (lane & 7);\n");
                mk_mv_put_epilogue_loads(b, p, o, 2, "slice == 0 && lane < 8");
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
                mk_mv_put_epilogue(b, p, o, 2, "");
            }
            mk_strbuf_put(b, "    } while (0);\n");
            start += tiles;
        }
    }
    if (slots) mk_mv_put_argmax_blocks(b, pg, 8LL * (MK_MV_WARPS / W));
    mk_strbuf_put(b, "}\n");
}