/*
 * winograd.c — the CPU's Winograd convolution F(2x2, 3x3): a 3x3 window of
 * stride 1, dilation 1, one group, float32 NCHW, with a convolution group's
 * epilogue (+ bias, + residual, ReLU). conv_group.c chooses it per launch.
 *
 * Each 2x2 block of the result (a tile) comes from the 4x4 block of x under
 * it (padding read as 0):
 *     Y = Aᵀ [ Σ_c (G g_oc Gᵀ) ⊙ (Bᵀ d_c B) ] A
 * with
 *     Bᵀ = | 1  0 -1  0 |    G = | 1    0    0  |    Aᵀ = | 1  1  1  0 |
 *          | 0  1  1  0 |        | 1/2  1/2  1/2 |         | 0  1 -1 -1 |
 *          | 0 -1  1  0 |        | 1/2 -1/2  1/2 |
 *          | 0  1  0 -1 |        | 0    0    1  |
 * so the 36 multiply-adds per output and input channel of the direct form
 * become 16 per tile (4 outputs), in 16 matrix products, one per element ξ
 * of the 4x4 transformed domain:  M_ξ [O, tiles] = U_ξ [O, C] · V_ξ [C, tiles].
 *
 * The weights' transform U = G g Gᵀ is made once at prepare for constant
 * weights (in double precision, one float rounding), else at each run.
 * The tiles go eight at a time as a vector's lanes: eight neighbours along
 * one tile row (a row's last vector padded with tiles past the edge), so
 * that x's 4x4 blocks load as strided rows and the result's 2x2 blocks
 * store as two interleaved rows of 16. The tiles are cut into blocks whose
 * V (16 x C x tiles) and M (16 x O x tiles) stay in L2; a thread takes
 * whole blocks: it transforms the block's x into V, makes the 16 products
 * (for each ξ, 4 output channels at a time in a 4 x 24 register block: 12
 * accumulators, V_ξ in L1 while U_ξ streams), then transforms M back into
 * the result with the epilogue. OpenBLAS's sgemm for the products was
 * slower (a block's 24-96 tiles are too few columns for its packing).
 * Tested against double-precision loops (spec/cases/conv.lua, with
 * MK_CPU_CONV=winograd in spec/conv_spec.lua).
 */
#include "cpu.h"
#include "vec.h"

#include <stdlib.h>
#include <string.h>

enum {
    XI = 16,          /* elements of a transformed 4x4 tile */
    ROWS = 4,         /* output channels of one register block */
    V_BYTES = 384 << 10, /* a block's V, and its M: within a core's L2 beside U's stream */
    MAX_UNITS = 16,   /* vectors of eight tiles in one block, at most */
    SKEW = 16,        /* floats between one ξ's matrix and the next: a cache line */
};

struct mk_cpu_wino {
    int64_t c, o, o4;  /* o4: output channels rounded up to ROWS */
    float *u;          /* [XI][o4 / ROWS][c][ROWS] */
    bool once;         /* u made at prepare */
    int threads;       /* thread buffers in buf */
    int64_t units;     /* vectors of eight tiles in one block */
    size_t per_thread; /* floats of one thread's buffer */
    float *buf;
};

bool mk_cpu_wino_takes(const mk_conv_geom *g) {
    return g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
           g->groups == 1 && g->oh > 0 && g->ow > 0;
}

/* Tile vectors in one block for these channels: V and M within V_BYTES
 * each, in threes (the products' register block) where there are three. */
static int64_t block_units(int64_t c, int64_t o4) {
    int64_t wide = c > o4 ? c : o4;
    int64_t units = V_BYTES / (XI * wide * 8 * (int64_t)sizeof(float));
    if (units > MAX_UNITS) units = MAX_UNITS;
    return units < 1 ? 1 : units >= 3 ? units / 3 * 3 : units;
}

/*
 * Where it beats oneDNN's direct convolution (doc/performance.md, "Winograd
 * F(2x2, 3x3) for the 3x3 stride-1 convolutions"): 64 to 256 channels in
 * and out. Past 256 a block holds fewer than three tile vectors, so each
 * element of U (16 O C floats, from L3) serves too few tiles; and where a
 * quarter of the lanes would be tiles past the row's end (a 7x7 result: 4
 * tiles of 8), the products waste as much.
 */
bool mk_cpu_wino_pays(const mk_conv_geom *g) {
    int64_t tw = (g->ow + 1) / 2, twv = (tw + 7) / 8;
    return g->c >= 64 && g->o >= 64 && block_units(g->c, (g->o + ROWS - 1) / ROWS * ROWS) >= 3 &&
           4 * tw >= 3 * 8 * twv;
}

static inline cpu_v8 fma8(cpu_v8 a, cpu_v8 b, cpu_v8 c) {
#ifdef __FMA__
    return (cpu_v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return a * b + c;
#endif
}

/* Eight copies of *p (not 0 + v: the add is kept, for -0). */
static inline cpu_v8 splat8(const float *p) {
#ifdef __AVX__
    return (cpu_v8)_mm256_broadcast_ss(p);
#else
    return (cpu_v8){*p, *p, *p, *p, *p, *p, *p, *p};
#endif
}

/* U_ξ [o, c] = (G g Gᵀ)_ξ for each output and input channel, laid out for
 * the products' register blocks (ROWS output channels side by side). */
static void transform_weights(struct mk_cpu_wino *c, const float *w) {
    static const double G[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
    memset(c->u, 0, sizeof(float) * (size_t)(XI * c->o4 * c->c));
    for (int64_t o = 0; o < c->o; o++)
        for (int64_t ci = 0; ci < c->c; ci++) {
            const float *g = w + (o * c->c + ci) * 9;
            double t[4][3], u[4][4];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 3; j++)
                    t[i][j] = G[i][0] * g[j] + G[i][1] * g[3 + j] + G[i][2] * g[6 + j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    u[i][j] = t[i][0] * G[j][0] + t[i][1] * G[j][1] + t[i][2] * G[j][2];
            for (int xi = 0; xi < XI; xi++)
                c->u[((xi * (c->o4 / ROWS) + o / ROWS) * c->c + ci) * ROWS + o % ROWS] =
                    (float)u[xi / 4][xi % 4];
        }
}

mk_cpu_wino *mk_cpu_wino_make(const mk_conv_geom *g, const float *weights_once, int threads) {
    struct mk_cpu_wino *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->c = g->c, c->o = g->o, c->o4 = (g->o + ROWS - 1) / ROWS * ROWS;
    c->threads = threads > 0 ? threads : 1;
    c->units = block_units(g->c, c->o4);
    int64_t o4 = c->o4;
    int64_t nt = 8 * c->units, twv = ((g->ow + 1) / 2 + 7) / 8;
    c->per_thread = (size_t)(XI * (g->c * nt + SKEW) + XI * (o4 * nt + SKEW) +
                             4 * (16 * twv + 8));
    c->per_thread = (c->per_thread + 15) / 16 * 16; /* each thread's on its own lines */
    /* sizes in whole lines, as aligned_alloc asks */
    size_t u_floats = ((size_t)(XI * c->o4 * c->c) + 15) / 16 * 16;
    c->u = aligned_alloc(64, sizeof(float) * u_floats);
    c->buf = aligned_alloc(64, sizeof(float) * c->per_thread * (size_t)c->threads);
    if (!c->u || !c->buf) {
        mk_cpu_wino_free(c);
        return NULL;
    }
    if (weights_once) transform_weights(c, weights_once), c->once = true;
    return c;
}

void mk_cpu_wino_free(mk_cpu_wino *c) {
    if (!c) return;
    free(c->u);
    free(c->buf);
    free(c);
}

/* Eight lanes p[0], p[2], ..., p[14]. */
static inline cpu_v8 load8_even(const float *p) {
    return __builtin_shufflevector(load8(p), load8(p + 8), 0, 2, 4, 6, 8, 10, 12, 14);
}

/* V_ξ [c, 8 k .. 8 k + 7] of the eight tiles of one vector, from the four
 * rows of x under them, each from the vector's first column on (19 read). */
static void transform_input(const float *const row[4], float *v, int64_t ld) {
    cpu_v8 h[4][4]; /* d B: row r, column j */
    for (int r = 0; r < 4; r++) {
        cpu_v8 d0 = load8_even(row[r]), d1 = load8_even(row[r] + 1);
        cpu_v8 d2 = load8_even(row[r] + 2), d3 = load8_even(row[r] + 3);
        h[r][0] = d0 - d2, h[r][1] = d1 + d2, h[r][2] = d2 - d1, h[r][3] = d1 - d3;
    }
    for (int j = 0; j < 4; j++) {
        cpu_v8 t[4] = {h[0][j] - h[2][j], h[1][j] + h[2][j], h[2][j] - h[1][j], h[1][j] - h[3][j]};
        for (int i = 0; i < 4; i++) memcpy(v + (i * 4 + j) * ld, &t[i], sizeof t[i]);
    }
}

/* Keeps v in a register: GCC would otherwise fold its load into each of
 * the ROWS multiply-adds that use it, four loads where one does (the loads,
 * not the multiply-adds, then bound the products). */
#ifdef __AVX__
#define IN_REGISTER(v) __asm__("" : "+x"(v))
#else
#define IN_REGISTER(v) (void)0
#endif

/* m [ROWS][ldm] (NV vectors) = u [C][ROWS] · v [C][ldv] (NV vectors): ROWS x
 * NV accumulators in registers, the sum over c in order. */
#define PRODUCT(NV)                                                                        \
    static void product##NV(const float *u, const float *v, int64_t ldv, int64_t C,       \
                            float *m, int64_t ldm) {                                       \
        cpu_v8 acc[ROWS][NV];                                                              \
        _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; r++)                            \
            _Pragma("GCC unroll 3") for (int k = 0; k < NV; k++) acc[r][k] = (cpu_v8){0}; \
        for (int64_t c = 0; c < C; c++) {                                                  \
            cpu_v8 x[NV];                                                                  \
            _Pragma("GCC unroll 3") for (int k = 0; k < NV; k++) {                        \
                x[k] = load8(v + c * ldv + 8 * k);                                         \
                IN_REGISTER(x[k]);                                                         \
            }                                                                              \
            _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; r++) {                      \
                cpu_v8 b = splat8(u + c * ROWS + r);                                              \
                _Pragma("GCC unroll 3") for (int k = 0; k < NV; k++) acc[r][k] =          \
                    fma8(b, x[k], acc[r][k]);                                              \
            }                                                                              \
        }                                                                                  \
        _Pragma("GCC unroll 4") for (int r = 0; r < ROWS; r++)                            \
            _Pragma("GCC unroll 3") for (int k = 0; k < NV; k++)                          \
                memcpy(m + r * ldm + 8 * k, &acc[r][k], sizeof acc[r][k]);                 \
    }
PRODUCT(2)
PRODUCT(3)

/* One vector: ROWS accumulators alone would wait on the multiply-add's
 * latency, so even and odd c sum apart (two sets), then together. */
static void product1(const float *u, const float *v, int64_t ldv, int64_t C, float *m,
                     int64_t ldm) {
    cpu_v8 acc[2][ROWS];
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < ROWS; r++) acc[h][r] = (cpu_v8){0};
    int64_t c = 0;
    for (; c + 2 <= C; c += 2) {
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            cpu_v8 x = load8(v + (c + h) * ldv);
            IN_REGISTER(x);
            #pragma GCC unroll 4
            for (int r = 0; r < ROWS; r++)
                acc[h][r] = fma8(splat8(u + (c + h) * ROWS + r), x, acc[h][r]);
        }
    }
    for (; c < C; c++) {
        cpu_v8 x = load8(v + c * ldv);
        for (int r = 0; r < ROWS; r++) acc[0][r] = fma8(splat8(u + c * ROWS + r), x, acc[0][r]);
    }
    for (int r = 0; r < ROWS; r++) {
        cpu_v8 t = acc[0][r] + acc[1][r];
        memcpy(m + r * ldm, &t, sizeof t);
    }
}

/* Y = Aᵀ M A of eight tiles (m: element ξ at m + ξ ldm) plus the epilogue,
 * into output plane op [OH, OW] (residual plane rp or NULL) at tile row ty,
 * tiles 8 txv ..: two rows of 16 columns, clipped to the plane. */
static void transform_output(const mk_conv_geom *g, const float *m, int64_t ldm, float add,
                             const float *rp, bool relu, float *op, int64_t ty, int64_t txv) {
    cpu_v8 a[4][2];
    for (int i = 0; i < 4; i++) {
        cpu_v8 m0 = load8(m + (i * 4) * ldm), m1 = load8(m + (i * 4 + 1) * ldm);
        cpu_v8 m2 = load8(m + (i * 4 + 2) * ldm), m3 = load8(m + (i * 4 + 3) * ldm);
        a[i][0] = m0 + m1 + m2, a[i][1] = m1 - m2 - m3;
    }
    int64_t x0 = 16 * txv, cols = g->ow - x0 < 16 ? g->ow - x0 : 16;
    for (int i = 0; i < 2; i++) {
        int64_t oy = 2 * ty + i;
        if (oy >= g->oh) break;
        cpu_v8 y0 = i == 0 ? a[0][0] + a[1][0] + a[2][0] : a[1][0] - a[2][0] - a[3][0];
        cpu_v8 y1 = i == 0 ? a[0][1] + a[1][1] + a[2][1] : a[1][1] - a[2][1] - a[3][1];
        cpu_v8 y[2] = {__builtin_shufflevector(y0, y1, 0, 8, 1, 9, 2, 10, 3, 11),
                       __builtin_shufflevector(y0, y1, 4, 12, 5, 13, 6, 14, 7, 15)};
        float *o = op + oy * g->ow + x0;
        const float *r = rp ? rp + oy * g->ow + x0 : NULL;
        if (cols == 16) {
            for (int k = 0; k < 2; k++) {
                cpu_v8 v = y[k] + add;
                if (r) v += load8(r + 8 * k);
                if (relu) v = (cpu_v8)((cpu_i32x8)v & (cpu_i32x8)(v > 0.0f));
                memcpy(o + 8 * k, &v, sizeof v);
            }
            continue;
        }
        float lanes[16];
        memcpy(lanes, y, sizeof lanes);
        for (int64_t q = 0; q < cols; q++) {
            float v = lanes[q] + add;
            if (r) v += r[q];
            o[q] = relu && !(v > 0.0f) ? 0.0f : v;
        }
    }
}

/* One block of tile vectors [u0, u0 + nu) with the calling thread's buffer. */
/* The four rows of x under tile row ty of channel plane xc, padding
 * included: rows of pad floats, column q holding x's column q - pw. */
static void pad_rows(const mk_conv_geom *g, const float *xc, int64_t ty, float *rows,
                     int64_t pad) {
    for (int r = 0; r < 4; r++) {
        int64_t iy = 2 * ty - g->ph + r;
        float *pr = rows + r * pad;
        memset(pr, 0, sizeof(float) * (size_t)pad);
        if (iy < 0 || iy >= g->h) continue;
        int64_t lo = g->pw, hi = g->pw + g->w < pad ? g->pw + g->w : pad;
        if (hi > lo) memcpy(pr + lo, xc + iy * g->w, sizeof(float) * (size_t)(hi - lo));
    }
}

/* One block of tile vectors [u0, u0 + nu) with the calling thread's buffer:
 * its V, then for each ξ all the products M_ξ (V_ξ stays in L1 while U_ξ
 * streams), then the result. */
static void run_block(const struct mk_cpu_wino *c, const mk_conv_geom *g,
                      const mk_cpu_conv_args *a, bool relu, int64_t u0, int64_t nu, float *buf) {
    int64_t th = (g->oh + 1) / 2, twv = ((g->ow + 1) / 2 + 7) / 8;
    int64_t nt = 8 * nu, C = c->c, pad = 16 * twv + 8;
    /* V_ξ and M_ξ a line apart from a multiple of the page: the 16 stores of
     * one tile's transform then fall in different sets of L1 */
    int64_t vs = C * nt + SKEW, ms = c->o4 * nt + SKEW;
    float *v = buf, *m = v + XI * vs, *rows = m + XI * ms;
    for (int64_t ci = 0; ci < C; ci++) {
        int64_t padded = -1; /* the tile row (b th + ty) in rows */
        for (int64_t k = 0; k < nu; k++) {
            int64_t u = u0 + k, bt = u / twv, ty = bt % th, txv = u % twv;
            const float *xc = a->x + ((bt / th) * C + ci) * g->h * g->w;
            int64_t y0 = 2 * ty - g->ph, x0 = 16 * txv - g->pw;
            const float *row[4];
            if (y0 >= 0 && y0 + 4 <= g->h && x0 >= 0 && x0 + 19 <= g->w) {
                for (int r = 0; r < 4; r++) row[r] = xc + (y0 + r) * g->w + x0;
            } else {
                if (padded != bt) pad_rows(g, xc, ty, rows, pad), padded = bt;
                for (int r = 0; r < 4; r++) row[r] = rows + r * pad + 16 * txv;
            }
            transform_input(row, v + ci * nt + 8 * k, vs);
        }
    }
    int64_t blocks = c->o4 / ROWS, plane = g->oh * g->ow;
    for (int xi = 0; xi < XI; xi++)
        for (int64_t ob = 0; ob < blocks; ob++) {
            const float *u = c->u + (xi * blocks + ob) * C * ROWS;
            const float *vx = v + xi * vs;
            float *mx = m + xi * ms + ob * ROWS * nt;
            /* threes, then a two, or two twos for 3 k + 4 (not a one) */
            int64_t k = 0, threes = nu % 3 == 1 && nu >= 4 ? nu / 3 - 1 : nu / 3;
            for (; k < 3 * threes; k += 3) product3(u, vx + 8 * k, nt, C, mx + 8 * k, nt);
            for (; k + 2 <= nu; k += 2) product2(u, vx + 8 * k, nt, C, mx + 8 * k, nt);
            if (k < nu) product1(u, vx + 8 * k, nt, C, mx + 8 * k, nt);
        }
    for (int64_t o = 0; o < c->o; o++) {
        float add = a->bias ? a->bias[o] : 0.0f;
        for (int64_t k = 0; k < nu; k++) {
            int64_t u = u0 + k, b = u / (th * twv), ty = u / twv % th, txv = u % twv;
            int64_t at = (b * c->o + o) * plane;
            transform_output(g, m + o * nt + 8 * k, ms, add,
                             a->residual ? a->residual + at : NULL, relu, a->out + at, ty, txv);
        }
    }
}

void mk_cpu_wino_run(mk_cpu_wino *c, const mk_conv_geom *g, const mk_cpu_conv_args *a,
                     bool relu) {
    if (!c->once) transform_weights(c, a->w);
    int64_t th = (g->oh + 1) / 2, twv = ((g->ow + 1) / 2 + 7) / 8;
    int64_t units = g->n * th * twv;
    int threads = max_threads();
    /* blocks of at most c->units tile vectors, as many as a multiple of the
     * threads (the static schedule then gives each thread as many), their
     * sizes q or q + 1: no block of one vector beside blocks of three where
     * it can be helped (its products would stream all of U for 8 tiles) */
    int64_t blocks = (units + c->units - 1) / c->units;
    blocks = (blocks + threads - 1) / threads * threads;
    if (blocks > units) blocks = units;
    int64_t q = units / blocks, rem = units % blocks;
    bool fork = threads <= c->threads && blocks > 1 && par(g->n * g->o * g->c * g->oh * g->ow * 9);
    CPU_FOR(fork, blk, blocks, {
        int64_t u0 = blk * q + (blk < rem ? blk : rem), nu = q + (blk < rem);
        int t = fork ? thread_index() : 0; /* a plain loop: the caller's buffer */
        run_block(c, g, a, relu, u0, nu, c->buf + (size_t)t * c->per_thread);
    });
}
