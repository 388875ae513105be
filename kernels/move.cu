/*
 * move.cu — data movement on the GPU, one thread per output element
 * (grid-stride), every dtype moved as an unsigned integer of its size:
 *
 *   MK_KERNEL_TILE, REPEAT_INTERLEAVE, PAD, FLIP   out[i] = x at core/move.h's index map
 *                                                  (the CPU's map), or pad's value
 *   MK_KERNEL_CONCAT           out = a then b along an axis
 *   MK_KERNEL_GATHER_ELEMENTS  out[i] = x[i, axis' coordinate = index[i]]
 *   MK_KERNEL_INDEX_SELECT     out[pre, j.., post] = x[pre, index[j..], post]
 *   MK_KERNEL_CUMSUM           running sums along an axis, a thread per line, in
 *                              order (float32 adds as the CPU's loop does: equal)
 *
 * Operands are read through their strides; the output is contiguous. An
 * index outside [-n, n) skips the write and raises the model's fault record
 * (MK_FAULT_ID), read at run time, never baked into the captured graph.
 * Slices with a step and expand run as PERMUTE (pointwise.cu) where they
 * are copies. Checked against the CPU by spec/gpu_spec.lua (spec/cases/shape.lua).
 */
#include "cuda_device.h"

extern "C" {
#include "move.h"
}

#include <cuda_bf16.h>
#include <cuda_fp16.h>

static unsigned int grid_for(long long n) {
    unsigned int b = mk_cuda_blocks(n, MK_CUDA_BLOCK);
    return b > 132u * 32u ? 132u * 32u : b;
}

/* shapes and strides of up to three tensors, by value */
typedef struct {
    int rank;
    long long shape[MK_MAX_RANK];    /* the output's */
    long long s[3][MK_MAX_RANK];     /* operands' element strides */
} move_dims;

static move_dims dims_of(const mk_tensor *out, int n, const mk_tensor *const *in) {
    move_dims d;
    memset(&d, 0, sizeof d);
    d.rank = out->rank;
    for (int k = 0; k < out->rank; k++) d.shape[k] = out->shape[k];
    for (int j = 0; j < n; j++)
        for (int k = 0; k < in[j]->rank; k++) d.s[j][k] = in[j]->stride[k];
    return d;
}

static __device__ __forceinline__ void coords(long long i, int rank, const long long *shape,
                                              long long *c) {
    for (int d = rank - 1; d >= 0; d--) {
        c[d] = i % shape[d];
        i /= shape[d];
    }
}

static __device__ __forceinline__ long long offset(int rank, const long long *c,
                                                   const long long *s) {
    long long off = 0;
    for (int d = 0; d < rank; d++) off += c[d] * s[d];
    return off;
}

/* pad's value (float32 [1]) as dtype's bits, converted as a cast does */
static __device__ __forceinline__ unsigned long long fill_bits(const float *v, int dtype) {
    float f = *v;
    unsigned long long bits = 0;
    switch (dtype) {
    case MK_DTYPE_FLOAT32: memcpy(&bits, &f, 4); break;
    case MK_DTYPE_FLOAT16: {
        __half h = __float2half_rn(f);
        memcpy(&bits, &h, 2);
        break;
    }
    case MK_DTYPE_BFLOAT16: {
        __nv_bfloat16 h = __float2bfloat16_rn(f);
        memcpy(&bits, &h, 2);
        break;
    }
    case MK_DTYPE_INT64: {
        long long i = f != f ? 0 : f <= -9.2233720368547758e18f ? LLONG_MIN
                                 : f >= 9.2233720368547758e18f ? LLONG_MAX : (long long)f;
        memcpy(&bits, &i, 8);
        break;
    }
    case MK_DTYPE_INT8: {
        signed char i = (signed char)(f != f ? 0 : f <= -128.0f ? -128 : f >= 127.0f ? 127 : (int)f);
        memcpy(&bits, &i, 1);
        break;
    }
    }
    return bits;
}

/* ---- the index maps: tile, repeat_interleave, pad, flip ---------------------- */

template <typename T>
static __global__ void index_map_kernel(T *o, const T *x, const __grid_constant__ mk_move_map m,
                                        long long n, const float *value, int dtype) {
    T fill = 0;
    if (value) {
        unsigned long long bits = fill_bits(value, dtype);
        memcpy(&fill, &bits, sizeof(T)); /* little-endian: the low bytes */
    }
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long off = mk_move_offset(&m, i);
        o[i] = off < 0 ? fill : x[off];
    }
}

template <typename T>
static int index_map_as(const mk_launch *l, const mk_move_map *m, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    long long n = mk_tensor_numel(&l->out);
    const float *value = l->node->op->kernel == MK_KERNEL_PAD ? (const float *)l->in[1].data : NULL;
    index_map_kernel<T><<<grid_for(n), MK_CUDA_BLOCK, 0, s->stream>>>(
        (T *)l->out.data, (const T *)l->in[0].data, *m, n, value, (int)l->out.dtype);
    return mk_cuda_check_launch(l, "index_map_kernel", err);
}

int mk_cuda_index_map(const mk_launch *l, mk_error **err) {
    mk_move_map m;
    if (mk_move_map_of(l, &m)) return MK_INTERNAL(err, "an index map for another kernel");
    switch (mk_dtype_size(l->out.dtype)) {
    case 8: return index_map_as<unsigned long long>(l, &m, err);
    case 4: return index_map_as<unsigned int>(l, &m, err);
    case 2: return index_map_as<unsigned short>(l, &m, err);
    case 1: return index_map_as<unsigned char>(l, &m, err);
    }
    return MK_INTERNAL(err, "an element size other than 1, 2, 4 or 8 bytes");
}

/* ---- concat ----------------------------------------------------------------- */

template <typename T>
static __global__ void concat_kernel(T *o, const T *a, const T *b, const __grid_constant__ move_dims d,
                                     int axis, long long na, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long c[MK_MAX_RANK];
        coords(i, d.rank, d.shape, c);
        if (c[axis] < na) {
            o[i] = a[offset(d.rank, c, d.s[0])];
        } else {
            c[axis] -= na;
            o[i] = b[offset(d.rank, c, d.s[1])];
        }
    }
}

/* ---- gather (GatherElements) and index_select (Gather) ----------------------- */

template <typename T>
static __global__ void gather_elements_kernel(T *o, const T *x, const long long *ids,
                                              const __grid_constant__ move_dims d, int axis,
                                              long long V, long long n, mk_fault_rec *fault,
                                              int launch) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long c[MK_MAX_RANK];
        coords(i, d.rank, d.shape, c);
        long long id = ids[offset(d.rank, c, d.s[1])], at = id < 0 ? id + V : id;
        if (at < 0 || at >= V) {
            mk_raise(fault, launch, 0, MK_FAULT_ID, id, i, V);
            continue;
        }
        c[axis] = at;
        o[i] = x[offset(d.rank, c, d.s[0])];
    }
}

/* d: the output's shape, x's strides (s[0]) and the index's (s[1]), each of its own rank */
template <typename T>
static __global__ void index_select_kernel(T *o, const T *x, const long long *ids,
                                           const __grid_constant__ move_dims d, int x_rank,
                                           int ids_rank, int axis, long long V, long long n,
                                           mk_fault_rec *fault, int launch) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        long long q[MK_MAX_RANK], p[MK_MAX_RANK];
        coords(i, d.rank, d.shape, q);
        long long id = ids[offset(ids_rank, q + axis, d.s[1])], at = id < 0 ? id + V : id;
        if (at < 0 || at >= V) {
            long long pos = 0; /* the index's flat position, as the CPU reports it */
            for (int k = 0; k < ids_rank; k++) pos = pos * d.shape[axis + k] + q[axis + k];
            mk_raise(fault, launch, 0, MK_FAULT_ID, id, pos, V);
            continue;
        }
        for (int k = 0; k < x_rank; k++)
            p[k] = k < axis ? q[k] : k == axis ? at : q[k - 1 + ids_rank];
        o[i] = x[offset(x_rank, p, d.s[0])];
    }
}

/* the kernel K<T> for the element size of l's output */
#define MOVE_BY_SIZE(l, CALL)                                                               \
    switch (mk_dtype_size((l)->out.dtype)) {                                               \
    case 8: { typedef unsigned long long T; CALL; break; }                                  \
    case 4: { typedef unsigned int T; CALL; break; }                                        \
    case 2: { typedef unsigned short T; CALL; break; }                                      \
    case 1: { typedef unsigned char T; CALL; break; }                                       \
    default: return MK_INTERNAL(err, "an element size other than 1, 2, 4 or 8 bytes");      \
    }

int mk_cuda_concat(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    const mk_tensor *ops[2] = {a, b};
    move_dims d = dims_of(&l->out, 2, ops);
    int axis = mk_move_axis(l->node->attr[0], l->out.rank);
    long long n = mk_tensor_numel(&l->out);
    MOVE_BY_SIZE(l, (concat_kernel<T><<<grid_for(n), MK_CUDA_BLOCK, 0, s->stream>>>(
                        (T *)l->out.data, (const T *)a->data, (const T *)b->data, d, axis,
                        a->shape[axis], n)));
    return mk_cuda_check_launch(l, "concat_kernel", err);
}

int mk_cuda_gather_elements(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0], *ids = &l->in[1];
    const mk_tensor *ops[2] = {x, ids};
    move_dims d = dims_of(&l->out, 2, ops);
    int axis = mk_move_axis(l->node->attr[0], l->out.rank);
    long long n = mk_tensor_numel(&l->out);
    MOVE_BY_SIZE(l, (gather_elements_kernel<T><<<grid_for(n), MK_CUDA_BLOCK, 0, s->stream>>>(
                        (T *)l->out.data, (const T *)x->data, (const long long *)ids->data, d,
                        axis, x->shape[axis], n, s->fault, l->index)));
    return mk_cuda_check_launch(l, "gather_elements_kernel", err);
}

int mk_cuda_index_select(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0], *ids = &l->in[1];
    const mk_tensor *ops[2] = {x, ids};
    move_dims d = dims_of(&l->out, 2, ops);
    int axis = mk_move_axis(l->node->attr[0], x->rank);
    long long n = mk_tensor_numel(&l->out);
    MOVE_BY_SIZE(l, (index_select_kernel<T><<<grid_for(n), MK_CUDA_BLOCK, 0, s->stream>>>(
                        (T *)l->out.data, (const T *)x->data, (const long long *)ids->data, d,
                        x->rank, ids->rank, axis, x->shape[axis], n, s->fault, l->index)));
    return mk_cuda_check_launch(l, "index_select_kernel", err);
}

/* ---- cumsum ------------------------------------------------------------------ */

/* line t (all dims but the axis, in order): x at its strides, out contiguous */
template <typename T>
static __global__ void cumsum_kernel(T *o, const T *x, const __grid_constant__ move_dims d,
                                     int axis, long long lines, long long inner) {
    long long len = d.shape[axis], step = d.s[0][axis];
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < lines;
         t += (long long)gridDim.x * blockDim.x) {
        long long c[MK_MAX_RANK], shape[MK_MAX_RANK];
        for (int k = 0; k < d.rank; k++) shape[k] = k == axis ? 1 : d.shape[k];
        coords(t, d.rank, shape, c);
        const T *xp = x + offset(d.rank, c, d.s[0]);
        T *op = o + t / inner * len * inner + t % inner;
        T acc = 0;
        for (long long j = 0; j < len; j++) op[j * inner] = acc += xp[j * step];
    }
}

int mk_cuda_cumsum(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0];
    const mk_tensor *ops[1] = {x};
    move_dims d = dims_of(&l->out, 1, ops);
    int axis = mk_move_axis(l->node->attr[0], x->rank);
    long long lines = mk_tensor_numel(x) / x->shape[axis], inner = 1;
    for (int k = axis + 1; k < x->rank; k++) inner *= x->shape[k];
    if (x->dtype == MK_DTYPE_FLOAT32)
        cumsum_kernel<float><<<grid_for(lines), MK_CUDA_BLOCK, 0, s->stream>>>(
            (float *)l->out.data, (const float *)x->data, d, axis, lines, inner);
    else /* int64, wrapping as the CPU's unsigned sums do */
        cumsum_kernel<unsigned long long><<<grid_for(lines), MK_CUDA_BLOCK, 0, s->stream>>>(
            (unsigned long long *)l->out.data, (const unsigned long long *)x->data, d, axis,
            lines, inner);
    return mk_cuda_check_launch(l, "cumsum_kernel", err);
}
