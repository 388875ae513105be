/*
 * gather.cu — data movement steered by run-time values on the GPU:
 *
 *   MK_KERNEL_EMBEDDING      out [n, D] = table [V, D] rows at ids [n] (int64, on the device)
 *   MK_KERNEL_REPLACE_SLICE  x [R, ...] rows [begin, end) = r [end - begin, ...], in place;
 *                            begin, end: int64 [1] on the device (a vector's rows are elements)
 *   MK_KERNEL_REPLACE_AT     x [N, .., S, ..] at [i, .., index[i], ..] = r [N, ..], in place;
 *                            index: int64 [N] on the device (a batch's cache rows)
 *
 * The ids and bounds are read by the kernels at run time, never baked into
 * the captured graph. A bad value skips the write and raises the model's
 * fault record (see cuda_device.h); the evaluation then fails naming the node.
 * Rows move as 16-, 8-, 4-, 2- or 1-byte units, whichever is the widest that
 * divides the row and the addresses, so tables of every dtype share one kernel.
 */
#include "cuda_device.h"

/* The widest unit (16, 8, 4, 2 or 1 bytes) dividing `bytes` and aligning every pointer. */
static int unit_for(size_t bytes, const void *p, const void *q) {
    uintptr_t a = (uintptr_t)p | (uintptr_t)q | (uintptr_t)bytes;
    for (int unit = 16; unit > 1; unit /= 2)
        if ((a & (uintptr_t)(unit - 1)) == 0) return unit;
    return 1;
}

static unsigned int grid_for(long long n) {
    unsigned int b = mk_cuda_blocks(n, MK_CUDA_BLOCK);
    return b > 132u * 32u ? 132u * 32u : b;
}

/* ---- embedding ----------------------------------------------------------- */

/* out [n, units] = table [V, units] at ids; units per row of `U`. Launched
 * with programmatic dependent launch where the device has it (a decode step
 * starts with embeddings: the launch after, a matrix-vector group, then loads
 * its weights while these run), it lets the next launch be scheduled at once
 * and waits for the launch before. */
template <typename U>
static __global__ void embedding_kernel(U *out, const U *table, const long long *ids, long long n,
                                        long long V, long long units, mk_fault_rec *fault,
                                        int launch) {
    MK_PDL_START;
    MK_PDL_WAIT;
    long long total = n * units;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        long long row = e / units, c = e - row * units;
        long long id = ids[row];
        if (id < 0 || id >= V) {
            if (c == 0) mk_raise(fault, launch, 0, MK_FAULT_ID, id, row, V);
            continue;
        }
        out[e] = table[id * units + c];
    }
}

template <typename U>
static void embedding_as(const mk_launch *l, const long long *ids, long long n, long long V,
                         long long units) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = mk_cuda_launch_config(dim3(grid_for(n * units)), dim3(MK_CUDA_BLOCK),
                                                   s->stream, s->pdl, &attr);
    cudaLaunchKernelEx(&cfg, embedding_kernel<U>, (U *)l->out.data, (const U *)l->in[0].data, ids, n,
                       V, units, s->fault, l->index);
}

/* MK_KERNEL_EMBEDDING: tables of every dtype; ids int64. */
int mk_cuda_embedding(const mk_launch *l, mk_error **err) {
    const mk_tensor *table = &l->in[0], *ids = &l->in[1];
    long long V = table->shape[0], n = mk_tensor_numel(ids);
    size_t row_bytes = (size_t)(mk_tensor_numel(table) / V) * mk_dtype_size(table->dtype);
    int unit = unit_for(row_bytes, table->data, l->out.data);
    long long units = (long long)(row_bytes / (size_t)unit);
    const long long *pid = (const long long *)ids->data;
    switch (unit) {
    case 16: embedding_as<uint4>(l, pid, n, V, units); break;
    case 8: embedding_as<uint2>(l, pid, n, V, units); break;
    case 4: embedding_as<unsigned int>(l, pid, n, V, units); break;
    case 2: embedding_as<unsigned short>(l, pid, n, V, units); break;
    default: embedding_as<unsigned char>(l, pid, n, V, units); break;
    }
    return mk_cuda_check_launch(l, "embedding", err);
}

/* ---- replace_slice ------------------------------------------------------- */

/*
 * x [rows, row_units] (as units U): rows [begin, end) = r [r_rows, row_units].
 * Every thread checks the bounds (uniform), so a bad range writes nothing.
 */
template <typename U>
static __global__ void replace_slice_kernel(U *x, const U *r, const long long *begin_p,
                                            const long long *end_p, long long rows,
                                            long long r_rows, long long row_units,
                                            mk_fault_rec *fault, int launch) {
    long long begin = *begin_p, end = *end_p;
    bool first = blockIdx.x == 0 && threadIdx.x == 0;
    if (begin < 0 || end > rows || begin > end) {
        if (first)
            mk_raise(fault, launch, 0, MK_FAULT_RANGE, begin, end, rows);
        return;
    }
    if (end - begin != r_rows) {
        if (first)
            mk_raise(fault, launch, 0, MK_FAULT_ROWS, begin, end, r_rows);
        return;
    }
    U *dst = x + begin * row_units;
    long long total = r_rows * row_units;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x)
        dst[e] = r[e];
}

template <typename U>
static void replace_slice_as(const mk_launch *l, char *o, const char *src, long long rows,
                             long long r_rows, long long row_units) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const long long *pb = (const long long *)l->in[2].data, *pe = (const long long *)l->in[3].data;
    replace_slice_kernel<U><<<grid_for(r_rows * row_units), MK_CUDA_BLOCK, 0, s->stream>>>(
        (U *)o, (const U *)src, pb, pe, rows, r_rows, row_units, s->fault, l->index);
}

/*
 * Before an in-place write of r (r_bytes at *src) into x (x_bytes): r is
 * copied aside into the launch's scratch where it lies in x's memory (where
 * it lands is known only at run time: the CPU's memmove), then out starts as
 * a copy of x where the write is not bound in place. *src then names r's
 * bytes to write.
 */
static int in_place(const mk_launch *l, size_t x_bytes, size_t r_bytes, const char **src,
                    mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    char *o = (char *)l->out.data;
    const char *x = (const char *)l->in[0].data;
    cudaError_t status;
    if (*src < o + x_bytes && o < *src + r_bytes) {
        if (l->scratch_bytes < r_bytes) /* cuda_launch_memory asked for it */
            return MK_INTERNAL(err, "a replacement inside x without its scratch");
        char *aside = (char *)l->scratch + (l->scratch_bytes - r_bytes);
        status = cudaMemcpyAsync(aside, *src, r_bytes, cudaMemcpyDeviceToDevice, s->stream);
        if (status != cudaSuccess)
            return mk_cuda_fail_status(err, status, "cudaMemcpyAsync (in-place write: r aside)",
                                       __FILE__, __LINE__);
        *src = aside;
    }
    if (o != x) {
        status = cudaMemcpyAsync(o, x, x_bytes, cudaMemcpyDeviceToDevice, s->stream);
        if (status != cudaSuccess)
            return mk_cuda_fail_status(err, status, "cudaMemcpyAsync (in-place write: x into out)",
                                       __FILE__, __LINE__);
    }
    return 0;
}

/* MK_KERNEL_REPLACE_SLICE: every dtype; begin and end int64 [1]. */
int mk_cuda_replace_slice(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0], *r = &l->in[1];
    long long rows = x->shape[0], r_rows = r->shape[0];
    size_t es = mk_dtype_size(x->dtype);
    size_t x_bytes = (size_t)mk_tensor_numel(x) * es;
    size_t row_bytes = x_bytes / (size_t)rows;
    size_t r_bytes = (size_t)mk_tensor_numel(r) * es;
    if (r_bytes != (size_t)r_rows * row_bytes)
        return MK_INTERNAL(err, "the replacement's rows differ from x's rows");
    char *o = (char *)l->out.data;
    const char *src = (const char *)r->data;
    if (in_place(l, x_bytes, r_bytes, &src, err)) return -1;
    int unit = unit_for(row_bytes, o, src);
    long long row_units = (long long)(row_bytes / (size_t)unit);
    switch (unit) {
    case 16: replace_slice_as<uint4>(l, o, src, rows, r_rows, row_units); break;
    case 8: replace_slice_as<uint2>(l, o, src, rows, r_rows, row_units); break;
    case 4: replace_slice_as<unsigned int>(l, o, src, rows, r_rows, row_units); break;
    case 2: replace_slice_as<unsigned short>(l, o, src, rows, r_rows, row_units); break;
    default: replace_slice_as<unsigned char>(l, o, src, rows, r_rows, row_units); break;
    }
    return mk_cuda_check_launch(l, "replace_slice", err);
}

/* ---- replace_at ---------------------------------------------------------- */

/* x [n, a, s, run] at [i, j, index[i]] = r [n, a, run], in units U; every
 * index is checked first, so a bad one writes nothing (as the CPU's). */
template <typename U>
static __global__ void replace_at_kernel(U *x, const U *r, const long long *index, long long n,
                                         long long a, long long s, long long run,
                                         mk_fault_rec *fault, int launch) {
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    for (long long i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= s) {
            if (first == 0) mk_raise(fault, launch, 0, MK_FAULT_INDEX, index[i], i, s);
            return;
        }
    for (long long e = first; e < n * a * run; e += (long long)gridDim.x * blockDim.x) {
        const long long u = e % run, row = e / run; /* row = i a + j */
        x[(row * s + index[row / a]) * run + u] = r[e];
    }
}

template <typename U>
static void replace_at_as(const mk_launch *l, char *o, const char *src, long long n, long long a,
                          long long s, long long run_units) {
    mk_cuda_state *st = mk_cuda_state_of(l);
    replace_at_kernel<U><<<grid_for(n * a * run_units), MK_CUDA_BLOCK, 0, st->stream>>>(
        (U *)o, (const U *)src, (const long long *)l->in[2].data, n, a, s, run_units, st->fault,
        l->index);
}

/* MK_KERNEL_REPLACE_AT: every dtype; x [N, .., S, ..] with S at the node's
 * axis, r x's shape without it, index int64 [N] on the device. */
int mk_cuda_replace_at(const mk_launch *l, mk_error **err) {
    const mk_tensor *x = &l->in[0], *r = &l->in[1];
    int axis = (int)(l->node->attr[0] < 0 ? l->node->attr[0] + x->rank : l->node->attr[0]);
    long long n = x->shape[0], a = 1, e = 1, S = x->shape[axis];
    for (int d = 1; d < axis; d++) a *= x->shape[d];
    for (int d = axis + 1; d < x->rank; d++) e *= x->shape[d];
    size_t es = mk_dtype_size(x->dtype), run = (size_t)e * es;
    size_t x_bytes = (size_t)mk_tensor_numel(x) * es, r_bytes = (size_t)(n * a) * run;
    char *o = (char *)l->out.data;
    const char *src = (const char *)r->data;
    if (in_place(l, x_bytes, r_bytes, &src, err)) return -1;
    int unit = unit_for(run, o, src);
    long long units = (long long)(run / (size_t)unit);
    switch (unit) {
    case 16: replace_at_as<uint4>(l, o, src, n, a, S, units); break;
    case 8: replace_at_as<uint2>(l, o, src, n, a, S, units); break;
    case 4: replace_at_as<unsigned int>(l, o, src, n, a, S, units); break;
    case 2: replace_at_as<unsigned short>(l, o, src, n, a, S, units); break;
    default: replace_at_as<unsigned char>(l, o, src, n, a, S, units); break;
    }
    return mk_cuda_check_launch(l, "replace_at", err);
}
