/*
 * conv.h — the geometry of a convolution or pooling node, read from its
 * attributes the one way every device and the shape rules (ops_conv.c) read
 * it. Header-only, so the CUDA plugin (which has no copy of ops_conv.c)
 * reads the same fields.
 *
 * Attributes, in signature order (core/ops.c's rows):
 *   Conv1dNode(x [N, C, L], w [O, C/g, K], stride, padding, dilation, groups)
 *   Conv2dNode(x [N, C, H, W], w [O, C/g, kH, kW], sh, sw, ph, pw, dh, dw, groups)
 *   ConvTranspose2dNode(x [N, C, H, W], w [C, O/g, kH, kW], sh, sw, ph, pw, oph, opw,
 *                       dh, dw, groups)
 *   MaxPool2dNode(x, kh, kw, sh, sw, ph, pw, dh, dw)
 *   AvgPool2dNode(x, kh, kw, sh, sw, ph, pw)
 * A 1-D convolution is the 2-D one with H = kH = 1.
 */
#ifndef MK_CONV_H
#define MK_CONV_H

#include "graph.h"

typedef struct {
    int64_t n, c, h, w;   /* input [n, c, h, w] */
    int64_t o, oh, ow;    /* output [n, o, oh, ow] */
    int64_t kh, kw;       /* window */
    int64_t sh, sw, ph, pw, dh, dw;
    int64_t oph, opw;     /* a transposed convolution's output padding */
    int64_t groups;
} mk_conv_geom;

/* Output extent of a window sweep (PyTorch's floor rule); <= 0 when the
 * dilated window does not fit the padded input. */
static inline int64_t mk_conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    int64_t span = d * (k - 1) + 1;
    return in + 2 * p < span ? 0 : (in + 2 * p - span) / s + 1;
}

/* Reads node n's operands and attributes (its kernel family says which row
 * it is); the output extents are n's own shape. */
static inline mk_conv_geom mk_conv_geom_of(const mk_node *n) {
    const mk_node *x = n->in[0];
    const int64_t *a = n->attr;
    mk_conv_geom g = {.n = x->shape[0], .c = x->shape[1], .h = 1, .w = 1, .kh = 1, .kw = 1,
                      .sh = 1, .sw = 1, .dh = 1, .dw = 1, .groups = 1};
    bool one_d = x->rank == 3;
    if (one_d) {
        g.w = x->shape[2];
    } else {
        g.h = x->shape[2];
        g.w = x->shape[3];
    }
    g.o = n->shape[1];
    g.oh = one_d ? 1 : n->shape[2];
    g.ow = n->shape[n->rank - 1];
    switch (n->op->kernel) {
    case MK_KERNEL_CONV: {
        const mk_node *wt = n->in[1];
        g.kw = wt->shape[wt->rank - 1];
        if (one_d) {
            g.sw = a[0], g.pw = a[1], g.dw = a[2], g.groups = a[3];
        } else {
            g.kh = wt->shape[2];
            g.sh = a[0], g.sw = a[1], g.ph = a[2], g.pw = a[3], g.dh = a[4], g.dw = a[5];
            g.groups = a[6];
        }
        break;
    }
    case MK_KERNEL_CONV_TRANSPOSE:
        g.kh = n->in[1]->shape[2], g.kw = n->in[1]->shape[3];
        g.sh = a[0], g.sw = a[1], g.ph = a[2], g.pw = a[3], g.oph = a[4], g.opw = a[5];
        g.dh = a[6], g.dw = a[7], g.groups = a[8];
        break;
    case MK_KERNEL_MAX_POOL:
        g.kh = a[0], g.kw = a[1], g.sh = a[2], g.sw = a[3], g.ph = a[4], g.pw = a[5];
        g.dh = a[6], g.dw = a[7];
        break;
    case MK_KERNEL_AVG_POOL:
        g.kh = a[0], g.kw = a[1], g.sh = a[2], g.sw = a[3], g.ph = a[4], g.pw = a[5];
        break;
    default: /* adaptive pooling, upsampling: the extents only */
        break;
    }
    return g;
}

#endif
