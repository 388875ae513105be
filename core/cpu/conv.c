/*
 * conv.c — the CPU's convolutions, pooling and upsampling (the CONV,
 * CONV_TRANSPOSE, MAX_POOL, AVG_POOL, ADAPTIVE_AVG_POOL and UPSAMPLE_NEAREST
 * families), float32 NCHW; a 1-D convolution is the 2-D one with H = 1.
 *
 * A convolution is, per image and group, one matrix product:
 *   out [O/g, OH·OW] = w [O/g, C/g·kH·kW] @ cols [C/g·kH·kW, OH·OW]
 * where cols (the node's scratch) holds x's windows laid out as columns
 * (im2col), or is x itself for a 1x1 window of stride 1 without padding.
 * The product is OpenBLAS's sgemm (matmul.c's mk_cpu_sgemm). oneDNN's
 * convolution (conv_dnnl.c) takes its place where it is open and chosen.
 * A transposed convolution is the product the other way round,
 * cols [O/g·kH·kW, H·W] = w^T @ x, whose columns are then summed into the
 * output (col2im). Pooling and upsampling are plain loops over planes.
 * Tested against double-precision loops (spec/cases/conv.lua):
 *   MK_BUILD=build lua5.4 /usr/bin/busted spec/ops_spec.lua
 */
#include "cpu.h"
#include "conv.h"
#include "vec.h"

#include <math.h>
#include <string.h>

/* ---- convolution ---------------------------------------------------------- */

/* cols [C/g·kH·kW, OH·OW] of one image's group: row (c, ki, kj), column (oy, ox)
 * holds x [c, oy·sh - ph + ki·dh, ox·sw - pw + kj·dw], 0 outside x. */
static void im2col(const float *x, const mk_conv_geom *g, int64_t cg, float *cols) {
    int64_t rows = cg * g->kh * g->kw, plane = g->oh * g->ow;
    CPU_FOR(par(rows * plane), r, rows, {
        int64_t c = r / (g->kh * g->kw), ki = r / g->kw % g->kh, kj = r % g->kw;
        const float *xc = x + c * g->h * g->w;
        float *row = cols + r * plane;
        for (int64_t oy = 0; oy < g->oh; oy++) {
            int64_t iy = oy * g->sh - g->ph + ki * g->dh;
            float *o = row + oy * g->ow;
            if (iy < 0 || iy >= g->h) {
                memset(o, 0, sizeof(float) * (size_t)g->ow);
                continue;
            }
            const float *xr = xc + iy * g->w;
            int64_t ix0 = -g->pw + kj * g->dw;
            if (g->sw == 1 && ix0 >= 0 && ix0 + g->ow <= g->w) {
                memcpy(o, xr + ix0, sizeof(float) * (size_t)g->ow);
                continue;
            }
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t ix = ix0 + ox * g->sw;
                o[ox] = ix >= 0 && ix < g->w ? xr[ix] : 0.0f;
            }
        }
    });
}

/* out [N, O, OH, OW] = x [N, C, H, W] (*) w [O, C/g, kH, kW] by im2col and sgemm,
 * then the epilogue (+ bias, + residual, ReLU) over each image's result while
 * it is in cache. cols: the launch's scratch (unused for a 1x1 window of
 * stride 1 without padding, which reads x as it is). */
void mk_cpu_conv_im2col(const mk_conv_geom *g, const mk_cpu_conv_args *a, bool relu,
                        float *cols) {
    int64_t cg = g->c / g->groups, og = g->o / g->groups, k = cg * g->kh * g->kw;
    int64_t plane = g->oh * g->ow;
    bool direct = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 &&
                  g->pw == 0;
    for (int64_t b = 0; b < g->n; b++) {
        for (int64_t gi = 0; gi < g->groups; gi++) {
            const float *xg = a->x + (b * g->c + gi * cg) * g->h * g->w;
            const float *in = xg; /* direct: x itself */
            if (!direct) {
                im2col(xg, g, cg, cols);
                in = cols;
            }
            mk_cpu_sgemm(false, false, og, plane, k, a->w + gi * og * k, k, in, plane, 0.0f,
                         a->out + (b * g->o + gi * og) * plane, plane);
        }
        if (!a->bias && !a->residual && !relu) continue;
        float *ob = a->out + b * g->o * plane;
        const float *rb = a->residual ? a->residual + b * g->o * plane : NULL;
        CPU_FOR(par(g->o * plane), o, g->o, {
            float *y = ob + o * plane;
            float add = a->bias ? a->bias[o] : 0.0f;
            const float *r = rb ? rb + o * plane : NULL;
            for (int64_t p = 0; p < plane; p++) {
                float v = y[p] + add;
                if (r) v += r[p];
                y[p] = relu && !(v > 0.0f) ? 0.0f : v;
            }
        });
    }
}

/* out [N, O, OH, OW] from x [N, C, H, W] and w [C, O/g, kH, kW]: each input
 * element x [c, iy, ix] adds x · w [c, o, ki, kj] to out [o, iy·sh - ph + ki·dh,
 * ix·sw - pw + kj·dw] (inside the output). */
int mk_cpu_conv_transpose(const mk_launch *l, mk_error **err) {
    (void)err;
    mk_conv_geom g = mk_conv_geom_of(l->node);
    const float *x = l->in[0].data, *w = l->in[1].data;
    float *out = l->out.data, *cols = l->scratch;
    int64_t cg = g.c / g.groups, og = g.o / g.groups, kk = og * g.kh * g.kw;
    int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
    memset(out, 0, sizeof(float) * (size_t)(g.n * g.o * out_plane));
    for (int64_t b = 0; b < g.n; b++)
        for (int64_t gi = 0; gi < g.groups; gi++) {
            /* cols [O/g·kH·kW, H·W] = w_g^T [O/g·kH·kW, C/g] @ x_g [C/g, H·W] */
            mk_cpu_sgemm(true, false, kk, in_plane, cg, w + gi * cg * kk, kk,
                         x + (b * g.c + gi * cg) * in_plane, in_plane, 0.0f, cols, in_plane);
            float *og_out = out + (b * g.o + gi * og) * out_plane;
            /* col2im: output channels apart, so each thread owns its planes */
            CPU_FOR(par(kk * in_plane), o, og, {
                float *plane = og_out + o * out_plane;
                for (int64_t ki = 0; ki < g.kh; ki++)
                    for (int64_t kj = 0; kj < g.kw; kj++) {
                        const float *row = cols + ((o * g.kh + ki) * g.kw + kj) * in_plane;
                        for (int64_t iy = 0; iy < g.h; iy++) {
                            int64_t oy = iy * g.sh - g.ph + ki * g.dh;
                            if (oy < 0 || oy >= g.oh) continue;
                            for (int64_t ix = 0; ix < g.w; ix++) {
                                int64_t ox = ix * g.sw - g.pw + kj * g.dw;
                                if (ox >= 0 && ox < g.ow) plane[oy * g.ow + ox] += row[iy * g.w + ix];
                            }
                        }
                    }
            });
        }
    return 0;
}

/* ---- pooling and upsampling ----------------------------------------------- */

/* out [N, C, OH, OW]: the largest x over each dilated window (NaN wins, as
 * PyTorch's max does). */
/* The larger of m and v, NaN once either is: NaN wins, as PyTorch's max (a
 * comparison with NaN is false, so an m that is NaN stays). Without a
 * branch: a window's values are in no order a predictor could follow. */
static inline float max_nan(float m, float v) {
    int take = (v > m) | (v != v);
    return take ? v : m;
}

typedef int32_t pool_mask __attribute__((vector_size(32)));

/* max_nan lane by lane. */
static inline cpu_v8 max_nan8(cpu_v8 m, cpu_v8 v) {
    pool_mask take = (v > m) | (v != v);
    return (cpu_v8)(((pool_mask)v & take) | ((pool_mask)m & ~take));
}

/* col[i] = max_nan(col[i], x[i]), eight lanes at a time. */
static void max_nan_row(float *col, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        cpu_v8 r = max_nan8(load8(col + i), load8(x + i));
        memcpy(col + i, &r, sizeof r);
    }
    for (; i < n; i++) col[i] = max_nan(col[i], x[i]);
}

#define POOL_ROW 1024 /* widths whose column maxima fit a stack row: the fast form */
#define POOL_PAD 16   /* -inf columns either side of it, for the windows of the edges */

/* Eight outputs from columns p[0], p[s], ..., p[7 s] (s 1 or 2). */
static inline cpu_v8 load8_strided(const float *p, int64_t s) {
    if (s == 1) return load8(p);
    return __builtin_shufflevector(load8(p), load8(p + 8), 0, 2, 4, 6, 8, 10, 12, 14);
}

/* One plane by rows: each output row's window rows reduced to one row of
 * column maxima (eight lanes at a time), then each output element the
 * maximum of its window's columns in that row: eight outputs at a time for
 * strides 1 and 2 (the row's -inf margins standing for the padding, which a
 * maximum never takes), one at a time otherwise. */
static void max_pool_plane(const mk_conv_geom *g, const float *xp, float *op) {
    float row[POOL_PAD + POOL_ROW + POOL_PAD + 8];
    float *col = row + POOL_PAD;
    /* the columns the vector windows read, [first, end) */
    int64_t first = -g->pw, end = (g->ow - 1) * g->sw - g->pw + (g->kw - 1) * g->dw + g->sw;
    bool vec = (g->sw == 1 || g->sw == 2) && first >= -POOL_PAD && end <= g->w + POOL_PAD;
    for (int64_t i = 0; i < POOL_PAD; i++) row[i] = -INFINITY;
    for (int64_t i = g->w; i < g->w + POOL_PAD; i++) col[i] = -INFINITY;
    for (int64_t oy = 0; oy < g->oh; oy++) {
        for (int64_t ix = 0; ix < g->w; ix++) col[ix] = -INFINITY;
        for (int64_t ki = 0; ki < g->kh; ki++) {
            int64_t iy = oy * g->sh - g->ph + ki * g->dh;
            if (iy >= 0 && iy < g->h) max_nan_row(col, xp + iy * g->w, g->w);
        }
        float *o = op + oy * g->ow;
        int64_t ox = 0;
        for (; vec && ox + 8 <= g->ow; ox += 8) {
            cpu_v8 m = load8_strided(col + ox * g->sw - g->pw, g->sw);
            for (int64_t kj = 1; kj < g->kw; kj++)
                m = max_nan8(m, load8_strided(col + ox * g->sw - g->pw + kj * g->dw, g->sw));
            memcpy(o + ox, &m, sizeof m);
        }
        for (; ox < g->ow; ox++) {
            int64_t ix0 = ox * g->sw - g->pw, last = ix0 + (g->kw - 1) * g->dw;
            float m = -INFINITY;
            if (ix0 >= 0 && last < g->w) { /* inside the row: no bounds to check */
                for (int64_t kj = 0; kj < g->kw; kj++) m = max_nan(m, col[ix0 + kj * g->dw]);
            } else {
                for (int64_t kj = 0; kj < g->kw; kj++) {
                    int64_t ix = ix0 + kj * g->dw;
                    if (ix >= 0 && ix < g->w) m = max_nan(m, col[ix]);
                }
            }
            o[ox] = m;
        }
    }
}

/* One block of b channels (x [H, W, b], out [OH, OW, b]: nChw8c, nChw16c)
 * where the convolutions around the pool keep oneDNN's layout: each
 * output's b lanes the maximum of its window's, eight at a time. */
static void max_pool_block(const mk_conv_geom *g, int64_t b, const float *xp, float *op) {
    for (int64_t oy = 0; oy < g->oh; oy++)
        for (int64_t ox = 0; ox < g->ow; ox++)
            for (int64_t lane = 0; lane < b; lane += 8) {
                cpu_v8 m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                            -INFINITY, -INFINITY, -INFINITY, -INFINITY};
                for (int64_t ki = 0; ki < g->kh; ki++) {
                    int64_t iy = oy * g->sh - g->ph + ki * g->dh;
                    if (iy < 0 || iy >= g->h) continue;
                    for (int64_t kj = 0; kj < g->kw; kj++) {
                        int64_t ix = ox * g->sw - g->pw + kj * g->dw;
                        if (ix >= 0 && ix < g->w)
                            m = max_nan8(m, load8(xp + (iy * g->w + ix) * b + lane));
                    }
                }
                memcpy(op + (oy * g->ow + ox) * b + lane, &m, sizeof m);
            }
}

int mk_cpu_max_pool(const mk_launch *l, mk_error **err) {
    (void)err;
    mk_conv_geom g = mk_conv_geom_of(l->node);
    const float *x = l->in[0].data;
    float *out = l->out.data;
    const cpu_state *s = l->dev;
    int64_t b = s && s->conv ? s->conv[l->index].block : 0;
    if (b) {
        int64_t blocks = g.n * g.c / b;
        CPU_FOR(par(g.n * g.c * g.oh * g.ow * g.kh * g.kw), p, blocks, {
            max_pool_block(&g, b, x + p * g.h * g.w * b, out + p * g.oh * g.ow * b);
        });
        return 0;
    }
    int64_t planes = g.n * g.c;
    CPU_FOR(par(planes * g.oh * g.ow * g.kh * g.kw), p, planes, {
        const float *xp = x + p * g.h * g.w;
        float *op = out + p * g.oh * g.ow;
        if (g.w <= POOL_ROW) {
            max_pool_plane(&g, xp, op);
            continue;
        }
        for (int64_t oy = 0; oy < g.oh; oy++)
            for (int64_t ox = 0; ox < g.ow; ox++) {
                float m = -INFINITY;
                for (int64_t ki = 0; ki < g.kh; ki++) {
                    int64_t iy = oy * g.sh - g.ph + ki * g.dh;
                    if (iy < 0 || iy >= g.h) continue;
                    for (int64_t kj = 0; kj < g.kw; kj++) {
                        int64_t ix = ox * g.sw - g.pw + kj * g.dw;
                        if (ix >= 0 && ix < g.w) m = max_nan(m, xp[iy * g.w + ix]);
                    }
                }
                op[oy * g.ow + ox] = m;
            }
    });
    return 0;
}

/* out [N, C, OH, OW]: the sum of x over each window divided by the window's
 * size, padding included (PyTorch's count_include_pad); a window reaching
 * past the padding (the floor rule's last one) counts only to the padding's end. */
int mk_cpu_avg_pool(const mk_launch *l, mk_error **err) {
    (void)err;
    mk_conv_geom g = mk_conv_geom_of(l->node);
    const float *x = l->in[0].data;
    float *out = l->out.data;
    int64_t planes = g.n * g.c;
    CPU_FOR(par(planes * g.oh * g.ow * g.kh * g.kw), p, planes, {
        const float *xp = x + p * g.h * g.w;
        float *op = out + p * g.oh * g.ow;
        for (int64_t oy = 0; oy < g.oh; oy++)
            for (int64_t ox = 0; ox < g.ow; ox++) {
                int64_t y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
                int64_t y1 = y0 + g.kh, x1 = x0 + g.kw;
                if (y1 > g.h + g.ph) y1 = g.h + g.ph;
                if (x1 > g.w + g.pw) x1 = g.w + g.pw;
                int64_t count = (y1 - y0) * (x1 - x0);
                float s = 0.0f;
                for (int64_t iy = y0 < 0 ? 0 : y0; iy < (y1 < g.h ? y1 : g.h); iy++)
                    for (int64_t ix = x0 < 0 ? 0 : x0; ix < (x1 < g.w ? x1 : g.w); ix++)
                        s += xp[iy * g.w + ix];
                op[oy * g.ow + ox] = s / (float)count;
            }
    });
    return 0;
}

/* out [N, C, oh, ow]: cell (i, j) the mean of x's rows [floor(i H / oh),
 * ceil((i + 1) H / oh)) and its columns alike. */
int mk_cpu_adaptive_avg_pool(const mk_launch *l, mk_error **err) {
    (void)err;
    mk_conv_geom g = mk_conv_geom_of(l->node);
    const float *x = l->in[0].data;
    float *out = l->out.data;
    int64_t planes = g.n * g.c;
    CPU_FOR(par(planes * g.h * g.w), p, planes, {
        const float *xp = x + p * g.h * g.w;
        float *op = out + p * g.oh * g.ow;
        for (int64_t i = 0; i < g.oh; i++) {
            int64_t y0 = i * g.h / g.oh, y1 = ((i + 1) * g.h + g.oh - 1) / g.oh;
            for (int64_t j = 0; j < g.ow; j++) {
                int64_t x0 = j * g.w / g.ow, x1 = ((j + 1) * g.w + g.ow - 1) / g.ow;
                float s = 0.0f;
                for (int64_t iy = y0; iy < y1; iy++)
                    for (int64_t ix = x0; ix < x1; ix++) s += xp[iy * g.w + ix];
                op[i * g.ow + j] = s / (float)((y1 - y0) * (x1 - x0));
            }
        }
    });
    return 0;
}

/* out [N, C, oh, ow]: element (i, j) is x's (floor(i H / oh), floor(j W / ow)). */
int mk_cpu_upsample_nearest(const mk_launch *l, mk_error **err) {
    (void)err;
    mk_conv_geom g = mk_conv_geom_of(l->node);
    const float *x = l->in[0].data;
    float *out = l->out.data;
    int64_t planes = g.n * g.c;
    CPU_FOR(par(planes * g.oh * g.ow), p, planes, {
        const float *xp = x + p * g.h * g.w;
        float *op = out + p * g.oh * g.ow;
        for (int64_t i = 0; i < g.oh; i++) {
            const float *xr = xp + i * g.h / g.oh * g.w;
            for (int64_t j = 0; j < g.ow; j++) op[i * g.ow + j] = xr[j * g.w / g.ow];
        }
    });
    return 0;
}
