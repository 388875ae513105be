/*
 * reduce.c — the CPU's reductions, softmaxes and norms over any axes (ops.c's
 * "reductions and norms" rows; reductions.h splits x into reductions):
 *
 *   sum, mean, max, min, prod, var   x (any strides) over an axis list, the
 *                                    result dense with those axes kept as 1
 *   argmax, argmin along an axis     int64, the first on ties, a NaN wins
 *   softmax, log_softmax             along an axis, the max subtracted first
 *   layer_norm, group_norm, rms_norm (eps an operand)   over dense rows of x
 *   batch_norm                       per element, the channel's statistics
 *
 * Sums (and products) accumulate in double, one reduction per thread's part
 * of the kept elements, so a result never depends on the thread count.
 * Tested with the other ops (spec/cases/reduce.lua, spec/reduce_spec.lua).
 */
#include "cpu.h"
#include "reductions.h"

#include <math.h>
#include <string.h>

/* x's elements in reduction o's axes, row-major: V (a float) for each, the
 * last reduced axis as the inner loop. */
#define EACH_REDUCED(p, base, V, ...)                                                      \
    do {                                                                                   \
        int last_ = (p)->red.n - 1;                                                        \
        int64_t len_ = (p)->red.shape[last_], st_ = (p)->red.stride[last_];                \
        mk_axes lines_ = (p)->red;                                                         \
        lines_.n = last_;                                                                  \
        for (int64_t l_ = 0; l_ < (p)->inner / len_; l_++) {                               \
            const float *q_ = (base) + mk_reduce_offset(&lines_, l_);                      \
            for (int64_t j_ = 0; j_ < len_; j_++) {                                        \
                float V = q_[j_ * st_];                                                    \
                __VA_ARGS__                                                                \
            }                                                                              \
        }                                                                                  \
    } while (0)

typedef enum { R_SUM, R_MEAN, R_MAX, R_MIN, R_PROD, R_VAR } reduce_kind;

/* The reduction of x at base (one output) as `kind`; correction for var. */
static float reduce_one(const mk_reduce_plan *p, const float *base, reduce_kind kind,
                        double correction) {
    switch (kind) {
    case R_SUM:
    case R_MEAN: {
        double s = 0.0;
        EACH_REDUCED(p, base, v, s += v;);
        return (float)(kind == R_MEAN ? s / (double)p->inner : s);
    }
    case R_PROD: {
        double s = 1.0;
        EACH_REDUCED(p, base, v, s *= v;);
        return (float)s;
    }
    case R_MAX:
    case R_MIN: {
        float m = base[0]; /* element 0 of the reduction: every offset 0 */
        /* a NaN, once met, stays (v > NaN and v < NaN are false) */
        EACH_REDUCED(p, base, v, {
            if (v != v || (kind == R_MAX ? v > m : v < m)) m = v;
        });
        return m;
    }
    case R_VAR: {
        double s = 0.0, ss = 0.0;
        EACH_REDUCED(p, base, v, s += v;);
        double mean = s / (double)p->inner;
        EACH_REDUCED(p, base, v, ss += ((double)v - mean) * ((double)v - mean););
        return (float)(ss / ((double)p->inner - correction));
    }
    }
    return 0.0f;
}

static int reduce(const mk_launch *l, reduce_kind kind, double correction) {
    const mk_tensor *x = &l->in[0];
    mk_reduce_plan p = mk_reduce_plan_of(x, mk_reduce_mask(l->node));
    const float *xp = x->data;
    float *out = l->out.data;
    CPU_FOR(p.outer > 1 && par(p.outer * p.inner), o, p.outer, {
        out[o] = reduce_one(&p, xp + mk_reduce_offset(&p.kept, o), kind, correction);
    });
    return 0;
}

int mk_cpu_reduce_sum(const mk_launch *l, mk_error **err) { return reduce(l, R_SUM, 0); }
int mk_cpu_reduce_mean(const mk_launch *l, mk_error **err) { return reduce(l, R_MEAN, 0); }
int mk_cpu_reduce_max(const mk_launch *l, mk_error **err) { return reduce(l, R_MAX, 0); }
int mk_cpu_reduce_min(const mk_launch *l, mk_error **err) { return reduce(l, R_MIN, 0); }
int mk_cpu_reduce_prod(const mk_launch *l, mk_error **err) { return reduce(l, R_PROD, 0); }

/* correction: float32 [1], read now */
int mk_cpu_reduce_var(const mk_launch *l, mk_error **err) {
    return reduce(l, R_VAR, *(const float *)l->in[1].data);
}

/* ---- argmax, argmin along one axis ----------------------------------------- */

static int arg_reduce(const mk_launch *l, bool max) {
    const mk_tensor *x = &l->in[0];
    mk_reduce_plan p = mk_reduce_plan_of(x, mk_reduce_mask(l->node));
    int64_t n = p.inner, st = p.red.stride[0];
    const float *xp = x->data;
    int64_t *out = l->out.data;
    CPU_FOR(p.outer > 1 && par(p.outer * n), o, p.outer, {
        const float *q = xp + mk_reduce_offset(&p.kept, o);
        int64_t best = 0;
        float b = q[0];
        for (int64_t j = 1; j < n && b == b; j++) { /* the first NaN ends the search */
            float v = q[j * st];
            if (v != v || (max ? v > b : v < b)) b = v, best = j;
        }
        out[o] = best;
    });
    return 0;
}

int mk_cpu_argmax_axis(const mk_launch *l, mk_error **err) { return arg_reduce(l, true); }
int mk_cpu_argmin_axis(const mk_launch *l, mk_error **err) { return arg_reduce(l, false); }

/* ---- softmax, log_softmax along one axis ------------------------------------ */

/* o (stride ost) = softmax or log_softmax of q [n] (stride st); o may be q. */
static void softmax_row(const float *q, int64_t st, float *o, int64_t ost, int64_t n,
                        bool take_log) {
    float m = q[0];
    for (int64_t j = 1; j < n; j++)
        if (q[j * st] > m) m = q[j * st];
    double s = 0.0;
    for (int64_t j = 0; j < n; j++) {
        float e = expf(q[j * st] - m);
        if (!take_log) o[j * ost] = e;
        s += e;
    }
    if (take_log) {
        float ls = (float)log(s);
        for (int64_t j = 0; j < n; j++) o[j * ost] = q[j * st] - m - ls;
    } else {
        float inv = (float)(1.0 / s);
        for (int64_t j = 0; j < n; j++) o[j * ost] *= inv;
    }
}

static int softmax(const mk_launch *l, bool take_log) {
    const mk_tensor *x = &l->in[0];
    mk_reduce_plan p = mk_reduce_plan_of(x, mk_reduce_mask(l->node));
    int64_t n = p.inner, st = p.red.stride[0], ost = p.red_out.stride[0];
    const float *xp = x->data;
    float *out = l->out.data;
    CPU_FOR(p.outer > 1 && par(p.outer * n * 4), r, p.outer, {
        softmax_row(xp + mk_reduce_offset(&p.kept, r), st, out + mk_reduce_offset(&p.kept_out, r),
                    ost, n, take_log);
    });
    return 0;
}

int mk_cpu_softmax(const mk_launch *l, mk_error **err) { return softmax(l, false); }
int mk_cpu_log_softmax(const mk_launch *l, mk_error **err) { return softmax(l, true); }

/* ---- norms over dense rows ---------------------------------------------------- */

/*
 * rows of len elements of dense x, each normalized: (x - mean) (center) or x,
 * times 1 / sqrt(mean square + eps), times the weight, plus the bias. Element
 * j of row r takes parameter c = (r % groups) * per_group + j / spatial
 * (layer_norm and rms_norm: c = j; group_norm: its channel), at c * ws and
 * c * bs (0 where the parameter is [1]); b may be NULL.
 */
typedef struct {
    int64_t rows, len, groups, per_group, spatial;
    const float *w, *b;
    int64_t ws, bs;
    float eps;
    bool center;
} norm_rows;

/* Row r of nr from q (stride st; its parameters at c0 = (r % groups) * per_group) into o
 * (dense); o may be q. */
static void norm_row(const norm_rows *nr, int64_t r, const float *q, int64_t st, float *o) {
    double s = 0.0, ss = 0.0;
    if (nr->center)
        for (int64_t j = 0; j < nr->len; j++) s += q[j * st];
    float mean = (float)(s / (double)nr->len);
    for (int64_t j = 0; j < nr->len; j++) {
        double d = (double)q[j * st] - mean;
        ss += d * d;
    }
    float inv = (float)(1.0 / sqrt(ss / (double)nr->len + nr->eps));
    int64_t c0 = (r % nr->groups) * nr->per_group;
    for (int64_t j = 0; j < nr->len; j++) {
        int64_t c = c0 + j / nr->spatial;
        float y = (q[j * st] - mean) * inv * nr->w[c * nr->ws];
        o[j] = nr->b ? y + nr->b[c * nr->bs] : y;
    }
}

static void norm_run(const norm_rows *nr, const float *x, float *out) {
    CPU_FOR(nr->rows > 1 && par(nr->rows * nr->len * 2), r, nr->rows,
            { norm_row(nr, r, x + r * nr->len, 1, out + r * nr->len); });
}

/* One dense row of n as LayerNormNode computes it (a product group's prologue). */
void mk_cpu_layer_norm_row(const float *x, const float *w, const float *b, float eps, float *o,
                           int64_t n) {
    norm_rows nr = {1, n, 1, 0, 1, w, b, 1, 1, eps, true};
    norm_row(&nr, 0, x, 1, o);
}

static int64_t param_step(const mk_tensor *t) { return mk_tensor_numel(t) == 1 ? 0 : 1; }

/* x, weight, bias, eps, k: the last k axes */
int mk_cpu_layer_norm(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t len = 1;
    for (int d = x->rank - (int)l->node->attr[0]; d < x->rank; d++) len *= x->shape[d];
    norm_rows nr = {mk_tensor_numel(x) / len, len, 1, 0, 1, l->in[1].data, l->in[2].data,
                    param_step(&l->in[1]), param_step(&l->in[2]),
                    *(const float *)l->in[3].data, true};
    norm_run(&nr, x->data, l->out.data);
    return 0;
}

/* x [N, C, ...], weight, bias, eps, groups */
int mk_cpu_group_norm(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t groups = l->node->attr[0], c = x->shape[1];
    int64_t spatial = mk_tensor_numel(x) / (x->shape[0] * c);
    norm_rows nr = {x->shape[0] * groups, c / groups * spatial, groups, c / groups, spatial,
                    l->in[1].data, l->in[2].data, param_step(&l->in[1]), param_step(&l->in[2]),
                    *(const float *)l->in[3].data, true};
    norm_run(&nr, x->data, l->out.data);
    return 0;
}

/* x, weight [n], eps: no centering, no bias */
int mk_cpu_rms_norm_eps(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t len = x->shape[x->rank - 1];
    norm_rows nr = {mk_tensor_numel(x) / len, len, 1, 0, 1, l->in[1].data, NULL,
                    param_step(&l->in[1]), 0, *(const float *)l->in[2].data, false};
    norm_run(&nr, x->data, l->out.data);
    return 0;
}

/* x [N, C, ...], mean, var, weight, bias [C] (or [1]), eps */
int mk_cpu_batch_norm(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int64_t n = mk_tensor_numel(x), c = x->shape[1], spatial = n / (x->shape[0] * c);
    const float *m = l->in[1].data, *v = l->in[2].data, *w = l->in[3].data, *b = l->in[4].data;
    int64_t ms = param_step(&l->in[1]), vs = param_step(&l->in[2]), ws = param_step(&l->in[3]),
            bs = param_step(&l->in[4]);
    float eps = *(const float *)l->in[5].data;
    const float *xp = x->data;
    float *out = l->out.data;
    CPU_FOR(par(n), i, n, {
        int64_t ch = i / spatial % c;
        float inv = 1.0f / sqrtf(v[ch * vs] + eps);
        out[i] = (xp[i] - m[ch * ms]) * inv * w[ch * ws] + b[ch * bs];
    });
    return 0;
}

/* ---- row groups: a row op with its pointwise prologue and epilogue ------------- */

/* Elements of the epilogue run at a time: the row op's values are copied out of
 * the result first, which the epilogue then overwrites. */
#define EPILOGUE_CHUNK 256

/*
 * Per row of the result (group_rows.c's mk_rows_group): x from the prologue
 * into the result's row (or operand x as it is), the row op over it in place,
 * then the epilogue over the row op's values. The same row functions and
 * programs as the nodes alone, so the same bits. Each operand is read
 * broadcast to the result's shape, as its node read it.
 */
int mk_cpu_rows_group(const mk_launch *l, mk_error **err) {
    const mk_rows_group *rg = mk_node_rows(l->node);
    if (!rg || rg->n_prog >= MK_X_IN)
        return MK_INTERNAL(err, "a row group without its record");
    const mk_tensor *out = &l->out;
    int last = out->rank - 1;
    int64_t len = out->shape[last], rows = mk_tensor_numel(out) / len;
    mk_axes lead[MK_MAX_INPUTS]; /* each operand's row: its strides over the leading axes */
    int64_t s[MK_MAX_INPUTS];    /* and along the row */
    mk_tensor in[MK_MAX_INPUTS];
    for (int k = 0; k < l->n_in; k++) {
        in[k] = mk_tensor_broadcast(&l->in[k], out);
        lead[k] = (mk_axes){.n = last};
        for (int d = 0; d < last; d++)
            lead[k].shape[d] = out->shape[d], lead[k].stride[d] = in[k].stride[d];
        s[k] = in[k].stride[last];
    }
    mk_kernel_id kind = rg->row_op->kernel;
    norm_rows nr = {1, len, 1, 0, 1, NULL, NULL, 0, 0, 0.0f, kind == MK_KERNEL_LAYER_NORM};
    if (rg->w >= 0) nr.ws = s[rg->w];
    if (rg->b >= 0) nr.bs = s[rg->b];
    if (rg->eps >= 0) nr.eps = *(const float *)in[rg->eps].data;
    CPU_FOR(rows > 1 && par(rows * len * 4), r, rows, {
        float *o = (float *)out->data + r * len;
        const char *at[MK_MAX_INPUTS];
        for (int k = 0; k < l->n_in; k++)
            at[k] = (const char *)in[k].data +
                    (size_t)mk_reduce_offset(&lead[k], r) * sizeof(float);
        const float *q = o;
        int64_t st = 1;
        if (rg->prologue.n)
            mk_cpu_program_f32(&rg->prologue, (char *)o, at, s, len);
        else
            q = (const float *)at[rg->x], st = s[rg->x];
        if (kind == MK_KERNEL_SOFTMAX || kind == MK_KERNEL_LOG_SOFTMAX) {
            softmax_row(q, st, o, 1, len, kind == MK_KERNEL_LOG_SOFTMAX);
        } else {
            norm_rows row = nr;
            row.w = (const float *)at[rg->w];
            row.b = rg->b >= 0 ? (const float *)at[rg->b] : NULL;
            norm_row(&row, 0, q, st, o);
        }
        for (int64_t c0 = 0; rg->epilogue.n && c0 < len; c0 += EPILOGUE_CHUNK) {
            int64_t n = len - c0 < EPILOGUE_CHUNK ? len - c0 : EPILOGUE_CHUNK;
            float value[EPILOGUE_CHUNK];
            memcpy(value, o + c0, (size_t)n * sizeof(float));
            const char *in[MK_X_IN];
            int64_t si[MK_X_IN];
            for (int k = 0; k < rg->n_prog; k++)
                in[k] = at[k] + (size_t)(c0 * s[k]) * sizeof(float), si[k] = s[k];
            in[rg->n_prog] = (const char *)value, si[rg->n_prog] = 1;
            mk_cpu_program_f32(&rg->epilogue, (char *)(o + c0), in, si, n);
        }
    });
    return 0;
}
