/*
 * ops_conv.c — the shape and dtype rules of the convolution and pooling rows
 * (core/ops.c's "convolution and pooling" block) and their scratch: PyTorch's
 * definitions for NCL / NCHW tensors, float32 only. The attribute order of
 * each row is in conv.h.
 */
#include "conv.h"

#include <stdio.h>

#define SHAPE(n) mk_shape_str((n)->rank, (n)->shape, (char[96]){0}, 96)
#define FAIL(err, n, code, ...) mk_fail((err), (code), (n)->line, (n)->column, __VA_ARGS__)

static int need_f32(mk_node *n, int k, const char *what, mk_error **err) {
    const mk_node *x = n->in[k];
    if (x->dtype == MK_DTYPE_FLOAT32) return 0;
    return FAIL(err, n, MK_ERR_DTYPE, "%s: %s (%s) must be float32, not %s", n->op->name, what,
                MK_OPERAND(n, k), mk_dtype_name(x->dtype));
}

static int need_rank(mk_node *n, int k, const char *what, int rank, const char *layout,
                     mk_error **err) {
    const mk_node *x = n->in[k];
    if (x->rank == rank) return 0;
    return FAIL(err, n, MK_ERR_SHAPE, "%s: %s (%s) must be %s (rank %d), not %s", n->op->name,
                what, MK_OPERAND(n, k), layout, rank, SHAPE(x));
}

/* Each of the node's window attributes in its range: sizes, strides and
 * dilations at least 1, paddings at least 0. */
static int need_at_least(mk_node *n, const char *what, int64_t v, int64_t least, mk_error **err) {
    if (v >= least) return 0;
    return FAIL(err, n, MK_ERR_SHAPE, "%s: %s is %lld (must be %lld or more)", n->op->name, what,
                (long long)v, (long long)least);
}

static int check_window(mk_node *n, const mk_conv_geom *g, mk_error **err) {
    if (need_at_least(n, "the stride", g->sh < g->sw ? g->sh : g->sw, 1, err) ||
        need_at_least(n, "the padding", g->ph < g->pw ? g->ph : g->pw, 0, err) ||
        need_at_least(n, "the dilation", g->dh < g->dw ? g->dh : g->dw, 1, err) ||
        need_at_least(n, "the kernel size", g->kh < g->kw ? g->kh : g->kw, 1, err))
        return -1;
    return 0;
}

/* The output extent of one axis, or the error of a window larger than its
 * padded input. */
static int sweep(mk_node *n, const char *axis, int64_t in, int64_t k, int64_t s, int64_t p,
                 int64_t d, int64_t *out, mk_error **err) {
    *out = mk_conv_out(in, k, s, p, d);
    if (*out > 0) return 0;
    return FAIL(err, n, MK_ERR_SHAPE,
                "%s: the %s window (%lld with dilation %lld: %lld) is larger than the padded "
                "input (%lld + 2 * %lld = %lld) of %s",
                n->op->name, axis, (long long)k, (long long)d, (long long)(d * (k - 1) + 1),
                (long long)in, (long long)p, (long long)(in + 2 * p), SHAPE(n->in[0]));
}

/* x [N, C, (H,) W] with w [O, C/g, (kH,) kW] → [N, O, (OH,) OW]. */
int mk_infer_conv(mk_node *n, mk_error **err) {
    bool one_d = n->n_attr == 4;
    int rank = one_d ? 3 : 4;
    const char *xl = one_d ? "[N, C, L]" : "[N, C, H, W]";
    const char *wl = one_d ? "[O, C/groups, K]" : "[O, C/groups, kH, kW]";
    if (need_f32(n, 0, "x", err) || need_f32(n, 1, "the weights", err) ||
        need_rank(n, 0, "x", rank, xl, err) || need_rank(n, 1, "the weights", rank, wl, err))
        return -1;
    /* the extents are not known yet: geometry of the attributes and weights only */
    const mk_node *x = n->in[0], *w = n->in[1];
    n->rank = rank;
    n->shape[1] = w->shape[0];
    mk_conv_geom g = mk_conv_geom_of(n);
    if (check_window(n, &g, err)) return -1;
    if (g.groups < 1 || g.c % g.groups || g.o % g.groups)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: groups (%lld) must divide both the input channels (%lld, of x %s) and "
                    "the output channels (%lld, of the weights %s)",
                    n->op->name, (long long)g.groups, (long long)g.c, SHAPE(x), (long long)g.o,
                    SHAPE(w));
    if (w->shape[1] != g.c / g.groups)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: the weights %s take %lld input channels per group, x %s has %lld "
                    "(%lld channels in %lld groups)",
                    n->op->name, SHAPE(w), (long long)w->shape[1], SHAPE(x),
                    (long long)(g.c / g.groups), (long long)g.c, (long long)g.groups);
    int64_t oh = 1, ow;
    if (!one_d && sweep(n, "height", g.h, g.kh, g.sh, g.ph, g.dh, &oh, err)) return -1;
    if (sweep(n, one_d ? "length" : "width", g.w, g.kw, g.sw, g.pw, g.dw, &ow, err)) return -1;
    n->dtype = MK_DTYPE_FLOAT32;
    n->shape[0] = g.n;
    n->shape[2] = one_d ? ow : oh;
    if (!one_d) n->shape[3] = ow;
    return 0;
}

/* x [N, C, H, W] with w [C, O/g, kH, kW] → [N, O, OH, OW], OH = (H - 1) sh - 2 ph +
 * dh (kH - 1) + oph + 1: the gradient of a convolution with respect to its input. */
int mk_infer_conv_transpose(mk_node *n, mk_error **err) {
    if (need_f32(n, 0, "x", err) || need_f32(n, 1, "the weights", err) ||
        need_rank(n, 0, "x", 4, "[N, C, H, W]", err) ||
        need_rank(n, 1, "the weights", 4, "[C, O/groups, kH, kW]", err))
        return -1;
    const mk_node *x = n->in[0], *w = n->in[1];
    n->rank = 4;
    n->shape[1] = 1;
    mk_conv_geom g = mk_conv_geom_of(n);
    if (check_window(n, &g, err)) return -1;
    if (g.groups < 1 || g.c % g.groups)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: groups (%lld) must divide the input channels (%lld, of x %s)",
                    n->op->name, (long long)g.groups, (long long)g.c, SHAPE(x));
    if (w->shape[0] != g.c)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: the weights %s are for %lld input channels, x %s has %lld", n->op->name,
                    SHAPE(w), (long long)w->shape[0], SHAPE(x), (long long)g.c);
    if (g.oph < 0 || g.opw < 0 || (g.oph >= g.sh && g.oph >= g.dh) ||
        (g.opw >= g.sw && g.opw >= g.dw))
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: the output padding (%lld, %lld) must be at least 0 and smaller than the "
                    "stride (%lld, %lld) or the dilation (%lld, %lld)",
                    n->op->name, (long long)g.oph, (long long)g.opw, (long long)g.sh,
                    (long long)g.sw, (long long)g.dh, (long long)g.dw);
    int64_t oh = (g.h - 1) * g.sh - 2 * g.ph + g.dh * (g.kh - 1) + g.oph + 1;
    int64_t ow = (g.w - 1) * g.sw - 2 * g.pw + g.dw * (g.kw - 1) + g.opw + 1;
    if (oh < 1 || ow < 1)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: the padding (%lld, %lld) leaves no output of x %s (%lld x %lld)",
                    n->op->name, (long long)g.ph, (long long)g.pw, SHAPE(x), (long long)oh,
                    (long long)ow);
    n->dtype = MK_DTYPE_FLOAT32;
    n->shape[0] = g.n;
    n->shape[1] = w->shape[1] * g.groups;
    n->shape[2] = oh;
    n->shape[3] = ow;
    return 0;
}

/* Max and average pooling: x [N, C, H, W] → [N, C, OH, OW], floor rule; a padding of
 * at most half the window (as PyTorch), so every window holds an element of x. */
int mk_infer_pool(mk_node *n, mk_error **err) {
    if (need_f32(n, 0, "x", err) || need_rank(n, 0, "x", 4, "[N, C, H, W]", err)) return -1;
    n->rank = 4;
    mk_conv_geom g = mk_conv_geom_of(n);
    if (check_window(n, &g, err)) return -1;
    if (g.ph > g.kh / 2 || g.pw > g.kw / 2)
        return FAIL(err, n, MK_ERR_SHAPE,
                    "%s: the padding (%lld, %lld) must be at most half the window (%lld, %lld)",
                    n->op->name, (long long)g.ph, (long long)g.pw, (long long)g.kh,
                    (long long)g.kw);
    int64_t oh, ow;
    if (sweep(n, "height", g.h, g.kh, g.sh, g.ph, g.dh, &oh, err) ||
        sweep(n, "width", g.w, g.kw, g.sw, g.pw, g.dw, &ow, err))
        return -1;
    n->dtype = MK_DTYPE_FLOAT32;
    memcpy(n->shape, (int64_t[]){g.n, g.c, oh, ow}, sizeof(int64_t) * 4);
    return 0;
}

/* Adaptive average pooling and nearest upsampling: x [N, C, H, W] → [N, C, oh, ow]
 * for the attributes (oh, ow). */
int mk_infer_resize(mk_node *n, mk_error **err) {
    if (need_f32(n, 0, "x", err) || need_rank(n, 0, "x", 4, "[N, C, H, W]", err)) return -1;
    const mk_node *x = n->in[0];
    if (n->attr[0] < 1 || n->attr[1] < 1)
        return FAIL(err, n, MK_ERR_SHAPE, "%s: the output size (%lld, %lld) must be positive",
                    n->op->name, (long long)n->attr[0], (long long)n->attr[1]);
    n->dtype = MK_DTYPE_FLOAT32;
    n->rank = 4;
    memcpy(n->shape, (int64_t[]){x->shape[0], x->shape[1], n->attr[0], n->attr[1]},
           sizeof(int64_t) * 4);
    return 0;
}

/* The CPU's im2col columns: [C/g · kH · kW, OH · OW] for one image and group
 * (none for a 1x1 window of stride 1 without padding, which reads x as it is). */
size_t mk_conv_scratch(const mk_node *n) {
    mk_conv_geom g = mk_conv_geom_of(n);
    if (g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0) return 0;
    return (size_t)(g.c / g.groups * g.kh * g.kw) * (size_t)(g.oh * g.ow) * sizeof(float);
}

/* The transposed convolution's columns: [O/g · kH · kW, H · W] for one image and group. */
size_t mk_conv_transpose_scratch(const mk_node *n) {
    mk_conv_geom g = mk_conv_geom_of(n);
    return (size_t)(g.o / g.groups * g.kh * g.kw) * (size_t)(g.h * g.w) * sizeof(float);
}
