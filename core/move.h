/*
 * move.h — the index maps of the data-movement kernels that read each output
 * element from one place of x or write a fill value (tile, repeat_interleave,
 * pad, flip), shared by the CPU (core/cpu/move.c) and CUDA (kernels/move.cu)
 * so both compute the same element at the same place.
 *
 * Per output dim d the map says which index of x's dim d element o reads:
 *   SAME     o                        (concat's other dims, a dim left alone)
 *   MOD      o mod n                  (tile: x's n repeated)
 *   DIV      o / arg                  (repeat_interleave: each index arg times)
 *   FLIP     n - 1 - o
 *   PAD      o - arg, the fill value outside [0, n)     (arg: the pad before)
 *   REFLECT  o - arg mirrored about the ends, edges not repeated (numpy's "reflect")
 *   EDGE     o - arg clamped to [0, n - 1]              (numpy's "edge")
 * Output dims that x lacks (tile's reps longer than x's rank) have n 1, stride 0.
 */
#ifndef MK_MOVE_H
#define MK_MOVE_H

#include "device.h"

#include <string.h>

#ifdef __CUDACC__
#define MK_MOVE_FN static __host__ __device__ __forceinline__
#else
#define MK_MOVE_FN static inline
#endif

enum { MK_MAP_SAME, MK_MAP_MOD, MK_MAP_DIV, MK_MAP_FLIP, MK_MAP_PAD, MK_MAP_REFLECT, MK_MAP_EDGE };

typedef struct {
    int rank;                  /* the output's */
    int64_t shape[MK_MAX_RANK]; /* the output's (contiguous) */
    int64_t n[MK_MAX_RANK];     /* x's dims, aligned with the output's */
    int64_t stride[MK_MAX_RANK]; /* x's element strides */
    int kind[MK_MAX_RANK];      /* MK_MAP_* */
    int64_t arg[MK_MAX_RANK];
} mk_move_map;

/* Element offset in x that output element i reads, or -1 for the fill value. */
MK_MOVE_FN int64_t mk_move_offset(const mk_move_map *m, int64_t i) {
    int64_t off = 0;
    bool fill = false;
    for (int d = m->rank - 1; d >= 0; d--) {
        int64_t o = i % m->shape[d], n = m->n[d], j = o;
        i /= m->shape[d];
        switch (m->kind[d]) {
        case MK_MAP_MOD: j = o % n; break;
        case MK_MAP_DIV: j = o / m->arg[d]; break;
        case MK_MAP_FLIP: j = n - 1 - o; break;
        case MK_MAP_PAD:
            j = o - m->arg[d];
            if (j < 0 || j >= n) fill = true, j = 0;
            break;
        case MK_MAP_REFLECT: /* pads are below n (the op's rule): one mirror suffices */
            j = o - m->arg[d];
            if (j < 0) j = -j;
            if (j >= n) j = 2 * (n - 1) - j;
            break;
        case MK_MAP_EDGE:
            j = o - m->arg[d];
            j = j < 0 ? 0 : j >= n ? n - 1 : j;
            break;
        default: break;
        }
        off += j * m->stride[d];
    }
    return fill ? -1 : off;
}

/* The map of launch l (a TILE, REPEAT_INTERLEAVE, PAD or FLIP kernel): -1 for
 * another kernel. */
static inline int mk_move_map_of(const mk_launch *l, mk_move_map *m) {
    const mk_node *node = l->node;
    const mk_tensor *x = &l->in[0], *o = &l->out;
    int r = o->rank, lead = r - x->rank; /* tile: x's dims are the output's last */
    memset(m, 0, sizeof *m); /* C and CUDA C++ alike: no compound literal */
    m->rank = r;
    for (int d = 0; d < r; d++) {
        m->shape[d] = o->shape[d];
        m->n[d] = d < lead ? 1 : x->shape[d - lead];
        m->stride[d] = d < lead ? 0 : x->stride[d - lead];
        m->kind[d] = MK_MAP_SAME;
    }
    int64_t axis = node->attr[0];
    switch (node->op->kernel) {
    case MK_KERNEL_TILE:
        for (int d = 0; d < r; d++) m->kind[d] = MK_MAP_MOD;
        return 0;
    case MK_KERNEL_REPEAT_INTERLEAVE: /* RepeatInterleaveNode(x, repeats, axis) */
        axis = node->attr[1] < 0 ? node->attr[1] + r : node->attr[1];
        m->kind[axis] = MK_MAP_DIV;
        m->arg[axis] = node->attr[0];
        return 0;
    case MK_KERNEL_FLIP:
        if (axis < 0) axis += r;
        m->kind[axis] = MK_MAP_FLIP;
        return 0;
    case MK_KERNEL_PAD: { /* PadNode(x, value, axis, before, after, mode) */
        static const int kinds[] = {MK_MAP_PAD, MK_MAP_REFLECT, MK_MAP_EDGE};
        if (axis < 0) axis += r;
        m->kind[axis] = kinds[node->attr[3]];
        m->arg[axis] = node->attr[1];
        return 0;
    }
    default: return -1;
    }
}

/* Axis a of rank r, from the end where negative (the ops' rules checked it). */
static inline int mk_move_axis(int64_t a, int r) { return (int)(a < 0 ? a + r : a); }

#endif
