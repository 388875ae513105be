/*
 * move.c — the CPU's data-movement kernels: the index maps of move.h (tile,
 * repeat_interleave, pad, flip), concat, gather (GatherElements),
 * index_select (ONNX Gather) and cumsum. Elements move as bytes of their
 * size, so every dtype shares one loop; operands are read through their
 * strides and the output is contiguous. Tested through the public API against
 * double-precision references (spec/cases/shape.lua).
 */
#include "cpu.h"
#include "move.h"

#include <stdlib.h>
#include <string.h>

/* Output elements per task when a launch is split among threads. */
#define CPU_MOVE_CHUNK 4096

/* Coordinates of element i of a contiguous tensor of `shape`. */
static void coords_of(int64_t i, int rank, const int64_t *shape, int64_t *c) {
    for (int d = rank - 1; d >= 0; d--) {
        c[d] = i % shape[d];
        i /= shape[d];
    }
}

static int64_t offset_of(int rank, const int64_t *c, const int64_t *stride) {
    int64_t off = 0;
    for (int d = 0; d < rank; d++) off += c[d] * stride[d];
    return off;
}

/* for each chunk of n output elements: BODY over [I0, I1), split among threads when large */
#define CPU_CHUNKS(n, I0, I1, ...)                                                          \
    do {                                                                                    \
        int64_t chunks_ = ((n) + CPU_MOVE_CHUNK - 1) / CPU_MOVE_CHUNK;                       \
        CPU_FOR(par(n), t_, chunks_, {                                                      \
            int64_t I0 = t_ * CPU_MOVE_CHUNK;                                               \
            int64_t I1 = I0 + CPU_MOVE_CHUNK < (n) ? I0 + CPU_MOVE_CHUNK : (n);             \
            __VA_ARGS__                                                                     \
        });                                                                                 \
    } while (0)

/* MK_KERNEL_TILE, REPEAT_INTERLEAVE, PAD, FLIP: out[i] = x at the map's offset,
 * or the pad value (in[1], float32 [1], converted to x's dtype as a cast does). */
int mk_cpu_index_map(const mk_launch *l, mk_error **err) {
    mk_move_map m;
    if (mk_move_map_of(l, &m)) return MK_INTERNAL(err, "an index map for another kernel");
    size_t es = mk_dtype_size(l->out.dtype);
    char fill[8] = {0};
    if (l->node->op->kernel == MK_KERNEL_PAD)
        mk_convert(fill, l->out.dtype, l->in[1].data, MK_DTYPE_FLOAT32, 1);
    char *o = l->out.data;
    const char *x = l->in[0].data;
    int64_t n = mk_tensor_numel(&l->out);
    CPU_CHUNKS(n, i0, i1, {
        for (int64_t i = i0; i < i1; i++) {
            int64_t off = mk_move_offset(&m, i);
            memcpy(o + (size_t)i * es, off < 0 ? fill : x + off * (int64_t)es, es);
        }
    });
    return 0;
}

/* MK_KERNEL_CONCAT: out = a then b along the axis. */
int mk_cpu_concat(const mk_launch *l, mk_error **err) {
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    int r = l->out.rank, axis = mk_move_axis(l->node->attr[0], r);
    size_t es = mk_dtype_size(l->out.dtype);
    int64_t n = mk_tensor_numel(&l->out), na = a->shape[axis];
    char *o = l->out.data;
    CPU_CHUNKS(n, i0, i1, {
        int64_t c[MK_MAX_RANK];
        for (int64_t i = i0; i < i1; i++) {
            coords_of(i, r, l->out.shape, c);
            const mk_tensor *x = a;
            if (c[axis] >= na) x = b, c[axis] -= na;
            memcpy(o + (size_t)i * es,
                   (const char *)x->data + offset_of(r, c, x->stride) * (int64_t)es, es);
        }
    });
    return 0;
}

/* An index of a dim of n, negative from the end; false outside [-n, n). */
static bool index_in(int64_t *id, int64_t n) {
    if (*id < 0) *id += n;
    return *id >= 0 && *id < n;
}

/* MK_KERNEL_GATHER_ELEMENTS: out[i] = x[i, axis' coordinate = index[i]]. */
int mk_cpu_gather_elements(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0], *ids = &l->in[1];
    int r = l->out.rank, axis = mk_move_axis(l->node->attr[0], r);
    size_t es = mk_dtype_size(l->out.dtype);
    int64_t n = mk_tensor_numel(&l->out), V = x->shape[axis], c[MK_MAX_RANK];
    for (int64_t i = 0; i < n; i++) { /* every index checked first: a fault writes nothing */
        coords_of(i, r, l->out.shape, c);
        int64_t id = ((const int64_t *)ids->data)[offset_of(r, c, ids->stride)];
        if (!index_in(&id, V)) return mk_fault(err, l->node, MK_FAULT_ID, id, i, V);
    }
    char *o = l->out.data;
    CPU_CHUNKS(n, i0, i1, {
        int64_t q[MK_MAX_RANK];
        for (int64_t i = i0; i < i1; i++) {
            coords_of(i, r, l->out.shape, q);
            int64_t id = ((const int64_t *)ids->data)[offset_of(r, q, ids->stride)];
            index_in(&id, V);
            q[axis] = id;
            memcpy(o + (size_t)i * es,
                   (const char *)x->data + offset_of(r, q, x->stride) * (int64_t)es, es);
        }
    });
    return 0;
}

/* MK_KERNEL_INDEX_SELECT: out[pre, j..., post] = x[pre, index[j...], post]. */
int mk_cpu_index_select(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0], *ids = &l->in[1];
    int axis = mk_move_axis(l->node->attr[0], x->rank), ri = ids->rank, r = l->out.rank;
    size_t es = mk_dtype_size(l->out.dtype);
    int64_t n = mk_tensor_numel(&l->out), V = x->shape[axis], c[MK_MAX_RANK];
    int64_t k = mk_tensor_numel(ids);
    for (int64_t i = 0; i < k; i++) {
        coords_of(i, ri, ids->shape, c);
        int64_t id = ((const int64_t *)ids->data)[offset_of(ri, c, ids->stride)];
        if (!index_in(&id, V)) return mk_fault(err, l->node, MK_FAULT_ID, id, i, V);
    }
    char *o = l->out.data;
    CPU_CHUNKS(n, i0, i1, {
        int64_t q[MK_MAX_RANK], p[MK_MAX_RANK];
        for (int64_t i = i0; i < i1; i++) {
            coords_of(i, r, l->out.shape, q);
            int64_t id = ((const int64_t *)ids->data)[offset_of(ri, q + axis, ids->stride)];
            index_in(&id, V);
            for (int d = 0; d < x->rank; d++)
                p[d] = d < axis ? q[d] : d == axis ? id : q[d - 1 + ri];
            memcpy(o + (size_t)i * es,
                   (const char *)x->data + offset_of(x->rank, p, x->stride) * (int64_t)es, es);
        }
    });
    return 0;
}

/* MK_KERNEL_CUMSUM: out[.., j, ..] = x[.., 0, ..] + ... + x[.., j, ..], in order
 * (float32 sums in float32, as the CUDA kernel adds them; int64 wraps). */
int mk_cpu_cumsum(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0];
    int r = x->rank, axis = mk_move_axis(l->node->attr[0], r);
    int64_t len = x->shape[axis], lines = mk_tensor_numel(x) / len, inner = 1;
    for (int d = axis + 1; d < r; d++) inner *= x->shape[d];
    bool f32 = x->dtype == MK_DTYPE_FLOAT32;
    CPU_FOR(par(lines * len), t, lines, {
        /* line t: outer index t / inner, inner index t % inner */
        int64_t c[MK_MAX_RANK], shape[MK_MAX_RANK];
        memcpy(shape, x->shape, sizeof shape);
        shape[axis] = 1;
        coords_of(t, r, shape, c);
        int64_t xo = offset_of(r, c, x->stride), step = x->stride[axis];
        int64_t oo = t / inner * len * inner + t % inner;
        if (f32) {
            const float *xp = (const float *)x->data + xo;
            float *op = (float *)l->out.data + oo, acc = 0.0f;
            for (int64_t j = 0; j < len; j++) op[j * inner] = acc += xp[j * step];
        } else {
            const int64_t *xp = (const int64_t *)x->data + xo;
            int64_t *op = (int64_t *)l->out.data + oo;
            uint64_t acc = 0;
            for (int64_t j = 0; j < len; j++)
                op[j * inner] = (int64_t)(acc += (uint64_t)xp[j * step]);
        }
    });
    return 0;
}

/*
 * x [N, .., S, ..] in place (out is x's memory, or starts as a copy of x)
 * with S at the node's axis: out[i, .., index[i], ..] = r[i, ..] (x's shape
 * without that axis). Every index is checked before anything is written; r
 * is copied aside first where it lies in x's memory.
 */
int mk_cpu_replace_at(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0], *r = &l->in[1];
    const int64_t *ix = l->in[2].data;
    int axis = mk_move_axis(l->node->attr[0], x->rank);
    int64_t n = x->shape[0], s = x->shape[axis], a = 1, e = 1;
    for (int d = 1; d < axis; d++) a *= x->shape[d];
    for (int d = axis + 1; d < x->rank; d++) e *= x->shape[d];
    for (int64_t i = 0; i < n; i++)
        if (ix[i] < 0 || ix[i] >= s) return mk_fault(err, l->node, MK_FAULT_INDEX, ix[i], i, s);
    size_t es = mk_dtype_size(x->dtype), run = (size_t)e * es;
    size_t x_bytes = (size_t)mk_tensor_numel(x) * es, r_bytes = (size_t)(n * a) * run;
    char *o = l->out.data, *aside = NULL;
    const char *src = r->data;
    if (src < o + x_bytes && o < src + r_bytes) {
        if (!(aside = malloc(r_bytes))) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "replace_at");
        src = memcpy(aside, src, r_bytes);
    }
    if (o != (const char *)x->data) memcpy(o, x->data, x_bytes);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < a; j++)
            memcpy(o + (size_t)((i * a + j) * s + ix[i]) * run, src + (size_t)(i * a + j) * run, run);
    free(aside);
    return 0;
}
