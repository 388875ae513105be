/*
 * matvec_step.c — a matrix–vector kernel's lane step, in the CUDA C
 * that matvec.c's kernel calls for: the weights' loads per dtype
 * (into registers, raw or widened; preloaded before the PDL wait, sent to L2,
 * or a step ahead), the step's math on float32 A or on the int8 grid, and A
 * staged in the block's shared memory (as floats, on the int8 grid, or as the
 * tensor-core form's digits) with the RmsNorm's sum of squares.
 */
#include "matvec.h"
#include "skeletons.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

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

static void put_prefetch(mk_strbuf *b, const mk_mv_plan *p, int o, long long first) {
    const mk_launch *l = p->l;
    const mk_product_group *pg = p->pg;
    int W = p->W, C = p->C;
    const mk_product_out *r = &pg->out[o];
    long long lines = prefetch_lines(pg);
    for (int s = 0; s < r->n_src; s++) {
        int pj = r->src[s].product;
        if (pj < 0) continue;
        int bk = pg->b[pj];
        long long ldb = mk_mv_ldb_of(l, pg, r, s);
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
 * times their block's scale. The weights come first (mk_mv_put_weight_loads: into
 * b{j}_{c}{tag}, with int8's scales in s{j}_{c}{tag}), so that a step's may
 * be loaded early (mk_mv_put_preloads); mk_mv_put_float_math does the rest.
 *
 * Loaded early, 16 bytes of bfloat16, float16 or int8 (E > 4) may stay as
 * they are (`raw`: b{j}_{c}{tag}r, a uint4, preload_raw) until the step's
 * math, which widens them first (mk_mv_put_weight_widen): half or a quarter of the
 * registers.
 */
void mk_mv_put_weight_decls(mk_strbuf *b, const mk_mv_plan *p, int np, const char *tag,
                            const char *indent, bool raw) {
    int C = p->C, E = p->E;
    for (int j = 0; j < np; j++)
        for (int c = 0; c < C; c++) {
            if (raw) mk_strbuf_put(b, "%suint4 b%d_%d%sr;", indent, j, c, tag);
            else if (E >= 4) mk_strbuf_put(b, "%sfloat4 b%d_%d%s[%d];", indent, j, c, tag, E / 4);
            else mk_strbuf_put(b, "%sfloat b%d_%d%s[1];", indent, j, c, tag);
            mk_strbuf_put(b, " float s%d_%d%s; (void)s%d_%d%s;\n", j, c, tag, j, c, tag);
        }
}

void mk_mv_put_weight_loads(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                            const int *prods, int np, const char *tag, const char *indent, bool raw) {
    const mk_launch *l = p->l;
    const mk_product_group *pg = p->pg;
    int C = p->C, E = p->E;
    for (int j = 0; j < np; j++) {
        int pj = r->src[prods[j]].product, bk = pg->b[pj];
        long long ldb = l->in[bk].stride[1];
        const char *w = mk_mv_weight_suffix(l->in[bk].dtype);
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

/* The float4s of a step's raw weights (mk_mv_put_weight_decls), before its math. */
void mk_mv_put_weight_widen(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                            const int *prods, int np, const char *tag) {
    const mk_launch *l = p->l;
    const mk_product_group *pg = p->pg;
    int C = p->C, E = p->E;
    for (int j = 0; j < np; j++) {
        const char *w = mk_mv_weight_suffix(l->in[pg->b[r->src[prods[j]].product]].dtype);
        for (int c = 0; c < C; c++)
            mk_strbuf_put(b, "            float4 b%d_%d%s[%d]; mk_x%d_%s(b%d_%d%sr, b%d_%d%s);\n", j, c, tag,
                          E / 4, E, w, j, c, tag, j, c, tag);
    }
}

void mk_mv_put_float_math(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                          const int *prods, int np, const char *tag) {
    const mk_product_group *pg = p->pg;
    int C = p->C, E = p->E;
    bool staged = p->staged;
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
 * were loaded before the wait (E == 16, `tag` names them: mk_mv_put_preloads) takes
 * their raw 16 bytes (b{j}_{c}{tag}r) and scales from there.
 */
void mk_mv_put_grid_step(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                         const int *prods, int np, const char *tag) {
    const mk_launch *l = p->l;
    const mk_product_group *pg = p->pg;
    int C = p->C, E = p->E;
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
    return mk_mv_most_products(pg) * C * ((raw ? 4 : E >= 4 ? E : 1) + scaled);
}

static bool preload_raw(const mk_product_group *pg, int C, int E, int W) {
    return E > 4 &&
           (pg->a8_group || step_registers(pg, C, E, false) * lane_steps(pg, E, W) > MK_PRELOAD_FLOATS);
}

/* Whether every weight and int8 scale of the group is a constant (no launch
 * writes it), so that a kernel may load them before its wait. */
bool mk_mv_constant_weights(const mk_launch *l, const mk_product_group *pg) {
    for (int j = 0; j < pg->n_products; j++)
        if (l->node->in[pg->b[j]]->owner->storage != MK_STORAGE_CONSTANT ||
            (pg->b_scale[j] >= 0 && l->node->in[pg->b_scale[j]]->owner->storage != MK_STORAGE_CONSTANT))
            return false;
    return true;
}

/* Steps of the staging copy (put_float_copy) in a block of W slices' groups
 * (mk_mv_block_warps): a float4 (E >= 4) or a float a thread a step. */
static long long copy_steps(const mk_product_group *pg, int E, int W) {
    long long step = 32LL * mk_mv_block_warps(W) * (E >= 4 ? 4 : 1);
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
    if ((pg->a8_group && E != 16) || !mk_mv_constant_weights(l, pg)) return 0;
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

void mk_mv_plan_steps(mk_mv_plan *p) {
    p->pre = preload_steps(p->l, p->pg, p->C, p->E, p->W, p->staged);
    p->raw = preload_raw(p->pg, p->C, p->E, p->W);
    p->ahead = loads_ahead(p->pg, p->E);
}

/*
 * Gathered operands (mk_product_gather), after the wait: each moves to the
 * row its id picks, or where the id is out of range stays at row 0 and the
 * fault names the EmbeddingNode folded in (which -1 - r).
 */
void mk_mv_put_gathers(mk_strbuf *b, const mk_product_group *pg) {
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
 * (b{j}_{c}p{s}, mk_mv_put_weight_loads) and sends the rest of its first columns'
 * lines to L2 (put_prefetch); then it waits.
 */
void mk_mv_put_preloads(mk_strbuf *b, const mk_mv_plan *p) {
    const mk_product_group *pg = p->pg;
    int C = p->C, E = p->E, W = p->W, pre = p->pre;
    long long K = (long long)pg->k, step = 32LL * E * W;
    bool raw = p->raw;
    mk_strbuf_put(b, "    const long long kfirst = %d * (lane + 32 * slice);\n", E);
    for (int s = 0; s < pre; s++) {
        char tag[16]; /* "p" and an int */
        snprintf(tag, sizeof tag, "p%d", s);
        mk_mv_put_weight_decls(b, p, mk_mv_most_products(pg), tag, "    ", raw);
    }
    long long start = 0;
    for (int o = 0; o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        int prods[MK_X_IN], np = mk_mv_product_sources(r, prods);
        long long groups = r->n / C; /* of C columns, a warp (and its slices) each */
        mk_strbuf_put(b, "    %sif (pair < %lldLL) {\n        const long long p = pair - %lldLL, n0 = %d * p;\n",
                      o ? "else " : "", start + groups, start, C);
        mk_mv_put_column_pointers(b, p, r, prods, np);
        for (int s = 0; s < pre; s++) {
            char tag[16]; /* "p" and an int */
            snprintf(tag, sizeof tag, "p%d", s);
            mk_strbuf_put(b, "        if (kfirst + %lldLL < %lldLL) {\n            const long long k = kfirst + %lldLL;\n",
                          s * step, K, s * step);
            mk_mv_put_weight_loads(b, p, r, prods, np, tag, "            ", raw);
            mk_strbuf_put(b, "        }\n");
        }
        put_prefetch(b, p, o, pre * step);
        mk_strbuf_put(b, "    }\n");
        start += groups;
    }
    mk_strbuf_put(b, "    MK_GROUP_WAIT;\n");
    mk_mv_put_gathers(b, pg);
}

/* The bytes of weights (and int8 scales) a matrix-vector launch reads. */
long long mk_mv_weight_bytes(const mk_launch *l, const mk_product_group *pg) {
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
    long long U = whole_copy(pg, E, W) ? steps : pg->weight_bytes == 2 ? MK_STAGE_BATCH : 1;
    return (int)(steps < U ? steps : U);
}

/* Step k of the staging copy for row m, indented by `in`: x (from `from`)
 * times the RmsNorm's weight w, its squares summed into part[m], or x summed
 * into part[m] for a LayerNorm, into sA. */
static void put_copy_store(mk_strbuf *b, const mk_product_group *pg, int V, int m, const char *in,
                           const char *from) {
    mk_strbuf_put(b, "%s*(%s *)(sA + %lldLL + k) = ", in, V == 4 ? "float4" : "float", m * (long long)pg->k);
    if (pg->norm_b >= 0) mk_strbuf_put(b, "mk_sum%d(%s, part[%d]);\n", V, from, m);
    else if (pg->norm_w >= 0) mk_strbuf_put(b, "mk_norm%d(%s, w, part[%d]);\n", V, from, m);
    else mk_strbuf_put(b, "%s;\n", from);
}

/* A into sA (times the norm's weight W, its squares summed into part[m]),
 * a float4 a thread a step where A and W are 16-byte aligned (E >= 4), U
 * steps loaded before they are stored (stage_batch). */
static void put_float_copy(mk_strbuf *b, const mk_product_group *pg, int E, int W) {
    int M = (int)pg->m;
    long long K = (long long)pg->k;
    bool norm = pg->norm_w >= 0 && pg->norm_b < 0; /* the RmsNorm's weight, read as x is */
    mk_strbuf_put(b, "    __shared__ __align__(16) float sA[%lld];\n", (long long)M * K);
    int V = E >= 4 ? 4 : 1, step = 32 * mk_mv_block_warps(W) * V, U = stage_batch(pg, E, W);
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
                     "        const bool on = k < %lldLL;\n", K, 16 * 32 * mk_mv_block_warps(W), K);
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

/*
 * A LayerNorm folded in, after the staging copy summed each row of x into
 * sss: the rows' means, the sums of squares about them (two passes, as the
 * node alone), then sA = (x - mean) / sqrt(var + eps) * w + b in place.
 */
static void put_layer_norm(mk_strbuf *b, const mk_product_group *pg) {
    int M = (int)pg->m;
    long long K = (long long)pg->k;
    mk_strbuf_put(b, "    {\n        const float *Bn = (const float *)i%d, eps = *(const float *)i%d;\n"
                     "        float mean[%d], inv[%d];\n"
                     "        for (int m = 0; m < %d; m++) mean[m] = __fdiv_rn(sss[m], (float)%lldLL), part[m] = 0.0f;\n"
                     "        for (long long k = threadIdx.x; k < %lldLL; k += blockDim.x)\n"
                     "            for (int m = 0; m < %d; m++) {\n"
                     "                const float d = sA[m * %lldLL + k] - mean[m];\n"
                     "                part[m] += d * d;\n"
                     "            }\n"
                     "        mk_norm_sums(part, sred, sss);\n"
                     "        __syncthreads();\n"
                     "        for (int m = 0; m < %d; m++)\n"
                     "            inv[m] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sss[m], (float)%lldLL), eps)));\n"
                     "        for (long long k = threadIdx.x; k < %lldLL; k += blockDim.x)\n"
                     "            for (int m = 0; m < %d; m++) {\n"
                     "                float *x = sA + m * %lldLL + k;\n"
                     "                *x = (*x - mean[m]) * inv[m] * W[k] + Bn[k];\n"
                     "            }\n"
                     "        __syncthreads();\n    }\n",
                  pg->norm_b, pg->norm_eps, M, M, M, K, K, M, K, M, K, K, M, K);
}

/*
 * The start of a kernel that holds A in shared memory, after its preloads
 * and the wait (mk_mv_put_preloads): the block copies A into sA (or, in the
 * tensor-core form, its digits into sD: `digits`), times the RmsNorm's weight
 * where one is folded in, and sums x's squares per row into sss. Every warp
 * then reads A there, not from L2: the warps of a launch would otherwise read
 * A once per column pair, as many bytes as the weights in float32 and 4 times
 * as many in int8.
 */
void mk_mv_put_staging(mk_strbuf *b, const mk_mv_plan *p) {
    const mk_product_group *pg = p->pg;
    int E = p->E, W = p->W;
    bool digits = p->tc != 0;
    int M = (int)pg->m;
    bool norm = pg->norm_w >= 0;
    if (norm)
        mk_strbuf_put(b, "    __shared__ float sss[%d], sred[%d][%d];\n    float part[%d] = {0.0f};\n", M,
                      mk_mv_block_warps(W), M, M);
    if (digits) mk_mv_put_digit_copy(b, pg);
    else if (pg->a8_group) put_grid_copy(b, pg, E >= 4, W);
    else put_float_copy(b, pg, E, W);
    if (norm) mk_strbuf_put(b, "    mk_norm_sums(part, sred, sss);\n");
    mk_strbuf_put(b, "    __syncthreads();\n");
    if (pg->norm_b >= 0) put_layer_norm(b, pg);
}