/*
 * matmul.cu — the matrix product (MK_KERNEL_MATMUL) through cuBLAS (float32, no TF32):
 *
 *   [k]       @ [k, n]       → [n]         cublasSgemv, or gemv_rows (below) for
 *                                          a transposed weight (llama2's x @ Wᵀ)
 *   [m, k]    @ [k, n]       → [m, n]      cublasSgemm (the same when m == 1)
 *   [B, m, k] @ [B, k, n]    → [B, m, n]   cublasSgemmStridedBatched
 *   any numpy.matmul          → a batch of   (mk_matmul_plan: batch dims broadcast, stride 0
 *                               products     where an operand repeats; [B, T, D] @ [D, O] is
 *                                            one [B·T, D] product) strided-batched over the
 *                                            innermost batch dim, in a loop over the others
 *   [m, k]    @ bfloat16 [k, n]              on tensor cores, A in two bfloat16 parts
 *                                            (split_product, below); other low-precision
 *                                            weights are widened into scratch first
 *
 * Operands may be strided views (a permuted weight, a KV cache read as
 * [heads, head, seq]): per matrix either the column stride is 1 (row-major,
 * "normal") or the row stride is 1 (stored transposed), with any batch
 * stride. cuBLAS is column-major, so the row-major product C = A·B is issued
 * as Cᵀ = Bᵀ·Aᵀ: a row-major matrix with row stride ld is, to cuBLAS, its
 * transpose stored with leading dimension ld, and a transposed view is a
 * plain column-major matrix — the transpose flags fall out of the strides.
 * Nothing is copied. The output is contiguous.
 */
#include "cuda_device.h"

#include <cuda_bf16.h>

/*
 * How cuBLAS sees one row-major operand X [rows, cols] with element strides
 * (sr, sc): as the column-major matrix Xᵀ [cols, rows] (op N, ld = sr) when
 * sc == 1, or as X itself stored column-major [rows, cols] (op T, ld = sc)
 * when sr == 1: mk_matrix_layout (tensor.c, shared with CBLAS on the CPU).
 */
typedef struct {
    cublasOperation_t op; /* applied to the stored matrix to get Xᵀ */
    long long ld;
} mm_layout;

static bool mm_layout_of(long long rows, long long cols, long long sr, long long sc,
                         mm_layout *out) {
    bool transposed;
    int64_t ld;
    if (!mk_matrix_layout(rows, cols, sr, sc, &transposed, &ld)) return false;
    out->op = transposed ? CUBLAS_OP_T : CUBLAS_OP_N; /* row-major normal is cuBLAS's Xᵀ */
    out->ld = ld;
    return true;
}

static int mm_bad_layout(const mk_launch *l, const char *which, mk_error **err) {
    const mk_tensor *t = &l->in[which[0] == 'a' ? 0 : 1];
    return mk_fail(err, MK_ERR_INTERNAL, l->node->line, l->node->column,
                   "%s: operand %s strides (%lld, %lld, %lld) are neither row- nor "
                   "column-contiguous; the passes should have copied it", l->node->op->name,
                   which, (long long)t->stride[0],
                   (long long)(t->rank > 1 ? t->stride[1] : 0),
                   (long long)(t->rank > 2 ? t->stride[2] : 0));
}

/*
 * y [n] = W [n, k] · x [k] where W's rows are contiguous (row stride ld):
 * the matrix-vector product of llama2's layout (x @ Wᵀ), which decoding one
 * token at a time is made of, so it must run at memory speed. One warp per
 * row, 16-byte loads, four in flight per lane; W is streamed (read once, kept
 * out of L2's way), x stays in cache. Needs k % 4 == 0, ld % 4 == 0 and
 * 16-byte aligned W and x (checked at capture; else cuBLAS runs it).
 */
#define GEMV_ROWS 8

static __device__ __forceinline__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

static __global__ void __launch_bounds__(32 * GEMV_ROWS)
    gemv_rows(float *y, const float *W, long long ld, const float *x, long long n, int k4) {
    long long row = (long long)blockIdx.x * GEMV_ROWS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n) return;
    const float4 *w = (const float4 *)(W + row * ld);
    const float4 *v = (const float4 *)x;
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
    int i = lane;
    for (; i + 96 < k4; i += 128) {
        float4 a0 = __ldcs(w + i), a1 = __ldcs(w + i + 32), a2 = __ldcs(w + i + 64),
               a3 = __ldcs(w + i + 96);
        acc0 += dot4(a0, v[i]);
        acc1 += dot4(a1, v[i + 32]);
        acc2 += dot4(a2, v[i + 64]);
        acc3 += dot4(a3, v[i + 96]);
    }
    for (; i < k4; i += 32) acc0 += dot4(__ldcs(w + i), v[i]);
    float acc = (acc0 + acc1) + (acc2 + acc3);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, d);
    if (lane == 0) y[row] = acc;
}

/* A cuBLAS status as an error naming the node (the library's message alone
 * does not say which product failed). */
static int mm_status(const mk_launch *l, cublasStatus_t status, const char *call,
                     mk_error **err) {
    if (status == CUBLAS_STATUS_SUCCESS) return 0;
    mk_error_code code = status == CUBLAS_STATUS_ALLOC_FAILED ? MK_ERR_NOMEM : MK_ERR_DEVICE;
    return mk_fail(err, code, l->node->line, l->node->column, "%s: %s: %s (%s)",
                   l->node->op->name, call, cublasGetStatusString(status),
                   cublasGetStatusName(status));
}

/*
 * A product with bfloat16 weights runs on tensor cores without widening them:
 * A's rows go in two bfloat16 parts, hi = A rounded and lo = (A - hi) rounded
 * (A - hi is exact), stacked [hi; lo] as one [2m, k] operand, so the weights
 * are read once; cuBLAS multiplies in float32 (CUBLAS_COMPUTE_32F) into
 * [2m, n], and C = C_hi + C_lo. hi + lo keeps 16 significant bits of each
 * value of A: relative error at most 2^-16 a term, far under the weights' own
 * rounding to bfloat16 (2^-8). A value whose rounding would overflow is
 * split toward zero instead (hi + lo never overflows); inf and NaN go whole
 * into hi (lo 0).
 */
static __global__ void split_rows(__nv_bfloat16 *parts, const float *a, long long m, long long k,
                                  long long sr, long long sc) {
    const long long total = m * k;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / k, c = i - r * k;
        const float v = a[r * sr + c * sc];
        __nv_bfloat16 hi = __float2bfloat16_rn(v), lo;
        if (!isfinite(v)) {
            lo = __float2bfloat16_rn(0.0f);
        } else if (isinf(__bfloat162float(hi))) { /* toward zero twice: hi + lo stays finite */
            hi = __float2bfloat16_rz(v);
            lo = __float2bfloat16_rz(v - __bfloat162float(hi));
        } else {
            lo = __float2bfloat16_rn(v - __bfloat162float(hi));
        }
        parts[i] = hi;
        parts[total + i] = lo;
    }
}

static __global__ void join_rows(float *c, const float *parts, long long total) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        c[i] = parts[i] + parts[total + i];
}

/* The split form's scratch: the parts of A ([2m, k] bfloat16), then their
 * products ([2m, n] float32), each 256-byte aligned; the rows m of every batch
 * (mk_matmul_plan folds them into one product where the weights repeat). */
static size_t split_parts_bytes(long long rows, long long k) {
    return ((size_t)(2 * rows * k) * 2 + 255) / 256 * 256;
}

size_t mk_cuda_split_bytes(const mk_node *n) {
    const mk_node *a = n->in[0], *b = n->in[1];
    if (b->dtype != MK_DTYPE_BFLOAT16 || b->rank != 2) return 0;
    long long k = b->shape[0], cols = b->shape[1], rows = k ? mk_node_numel(a) / k : 0;
    return split_parts_bytes(rows, k) + (size_t)(2 * rows * cols) * sizeof(float);
}

/* C [m, n] = A [m, k] · B, B bfloat16 [k, n] seen by cuBLAS as lb. */
static int split_product(const mk_launch *l, long long m, long long k, long long n,
                         long long a_sr, long long a_sc, const mm_layout *lb, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    __nv_bfloat16 *parts = (__nv_bfloat16 *)l->scratch;
    float *prods = (float *)((char *)l->scratch + split_parts_bytes(m, k));
    split_rows<<<mk_cuda_blocks(m * k, MK_CUDA_BLOCK), MK_CUDA_BLOCK, 0, s->stream>>>(
        parts, (const float *)l->in[0].data, m, k, a_sr, a_sc);
    if (mk_cuda_check_launch(l, "matmul (A in two bfloat16 parts)", err)) return -1;
    const float alpha = 1.0f, beta = 0.0f;
    /* Cᵀ [n, 2m] (column-major, ld n) = op(B stored) [n, k] · parts [k, 2m] */
    if (mm_status(l,
                  cublasGemmEx(s->blas, lb->op, CUBLAS_OP_N, (int)n, (int)(2 * m), (int)k, &alpha,
                               l->in[1].data, CUDA_R_16BF, (int)lb->ld, parts, CUDA_R_16BF,
                               (int)k, &beta, prods, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT),
                  "cublasGemmEx", err))
        return -1;
    join_rows<<<mk_cuda_blocks(m * n, MK_CUDA_BLOCK), MK_CUDA_BLOCK, 0, s->stream>>>(
        (float *)l->out.data, prods, m * n);
    return mk_cuda_check_launch(l, "matmul (the parts' products joined)", err);
}

/*
 * MK_KERNEL_MATMUL (float32): out = a @ b. Reduced to one (possibly batched) product
 *   C [m, n] = A [m, k] · B [k, n], batch B_count, with strides per operand.
 */
int mk_cuda_matmul(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    mk_matmul_plan p;
    mk_matmul_plan_of(a, b, &p);
    mk_tensor wide;
    bool split = b->dtype == MK_DTYPE_BFLOAT16 && b->rank == 2 && p.nb == 0 &&
                 2 * p.m <= 0x7fffffffLL; /* [hi; lo]: 2m rows for cuBLAS's int */
    if (b->dtype != MK_DTYPE_FLOAT32 && !split) { /* other low-precision weights: widened */
        if (mk_cuda_widen(l, b, &wide, err)) return -1;
        b = &wide;
        mk_matmul_plan_of(a, b, &p);
    }
    long long m = p.m, k = p.k, n = p.n;
    long long batch = p.nb ? p.batch[p.nb - 1] : 1; /* strided-batched over the innermost */
    long long a_sr = p.a_sr, a_sc = p.a_sc, b_sr = p.b_sr, b_sc = p.b_sc;
    long long a_sb = p.nb ? p.a_sb[p.nb - 1] : 0, b_sb = p.nb ? p.b_sb[p.nb - 1] : 0;
    if (m == 1 && a_sr == 0) a_sr = k * a_sc; /* a row: any row stride; mk_matrix_layout wants one */
    if (m > 0x7fffffffLL || n > 0x7fffffffLL || k > 0x7fffffffLL || batch > 0x7fffffffLL)
        return mk_fail(err, MK_ERR_SHAPE, l->node->line, l->node->column,
                       "%s: dimensions beyond cuBLAS's int range", l->node->op->name);

    mm_layout la, lb;
    if (!mm_layout_of(m, k, a_sr, a_sc, &la)) return mm_bad_layout(l, "a", err);
    if (!mm_layout_of(k, n, b_sr, b_sc, &lb)) return mm_bad_layout(l, "b", err);
    if (split) return split_product(l, m, k, n, a_sr, a_sc, &lb, err);
    const float alpha = 1.0f, beta = 0.0f;
    const float *A = (const float *)a->data, *B = (const float *)b->data;
    float *C = (float *)l->out.data;

    if (m == 1 && batch == 1) {
        /*
         * Matrix-vector: c [n] = Bᵀ-as-stored · a. The vector's increment is
         * its element stride (k == 1: any). The stored matrix is [n, k] (op N)
         * or [k, n] (op T).
         */
        int inc = k == 1 ? 1 : (int)a_sc;
        if (inc <= 0) return mm_bad_layout(l, "a", err);
        if (lb.op == CUBLAS_OP_T && inc == 1 && k % 4 == 0 && lb.ld % 4 == 0 && mk_aligned16(A) &&
            mk_aligned16(B) && k / 4 <= 0x7fffffffLL) {
            /* stored [k, n] column-major = W [n, k] row-major with row stride ld */
            gemv_rows<<<mk_cuda_blocks(n, GEMV_ROWS), 32 * GEMV_ROWS, 0, s->stream>>>(
                C, B, lb.ld, A, n, (int)(k / 4));
            return mk_cuda_check_launch(l, "gemv_rows", err);
        }
        cublasStatus_t status =
            lb.op == CUBLAS_OP_N
                ? cublasSgemv(s->blas, CUBLAS_OP_N, (int)n, (int)k, &alpha, B, (int)lb.ld, A,
                              inc, &beta, C, 1)
                : cublasSgemv(s->blas, CUBLAS_OP_T, (int)k, (int)n, &alpha, B, (int)lb.ld, A,
                              inc, &beta, C, 1);
        return mm_status(l, status, "cublasSgemv", err);
    }
    /* Cᵀ [n, m] (column-major, ld n) = op(B stored) [n, k] · op(A stored) [k, m]. */
    if (batch == 1)
        return mm_status(l,
                         cublasSgemm(s->blas, lb.op, la.op, (int)n, (int)m, (int)k, &alpha, B,
                                     (int)lb.ld, A, (int)la.ld, &beta, C, (int)n),
                         "cublasSgemm", err);
    /* the outer batch dims, one strided-batched call each */
    long long outer = p.count / batch;
    for (long long t = 0; t < outer; t++) {
        int64_t oa, ob;
        mk_matmul_batch_offsets(&p, t * batch, &oa, &ob);
        if (mm_status(l,
                      cublasSgemmStridedBatched(s->blas, lb.op, la.op, (int)n, (int)m, (int)k,
                                                &alpha, B + ob, (int)lb.ld, b_sb, A + oa,
                                                (int)la.ld, a_sb, &beta, C + t * batch * m * n,
                                                (int)n, m * n, (int)batch),
                      "cublasSgemmStridedBatched", err))
            return -1;
    }
    return 0;
}

/* out [t, i, j] = sum over q < p of a [t, i, q] b [t, q, j], a thread per output
 * (attention over a cache's first p rows: small products, p read here; one p,
 * or prefix[t / run], one a run of `run` batches). */
static __global__ void prefix_matmul_kernel(float *c, const float *a, const float *b,
                                            const long long *prefix, long long run, long long m,
                                            long long n, long long s, long long total,
                                            long long a_sb, long long a_sr, long long a_sc,
                                            long long b_sb, long long b_sr, long long b_sc,
                                            mk_fault_rec *fault, int launch) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long j = e % n, r = e / n, i = r % m, t = r / m, p = prefix[t / run];
        if (p < 0 || p > s) {
            if (t % run == 0 && i == 0 && j == 0) /* once a run */
                mk_raise(fault, launch, 0, MK_FAULT_PREFIX, p, s, 0);
            continue;
        }
        const float *ar = a + t * a_sb + i * a_sr, *bc = b + t * b_sb + j * b_sc;
        float acc = 0.0f;
        for (long long q = 0; q < p; q++) acc += ar[q * a_sc] * bc[q * b_sr];
        c[e] = acc;
    }
}

/* The same in tiles, for many rows (a prompt's attention: m = group x tokens):
 * a block takes 32 x 32 outputs of one batch, A's and B's 32 x 32 pieces of the
 * shared axis through shared memory, each thread 4 outputs of a column. Each
 * output sums its terms in the same order as prefix_matmul_kernel, so both
 * give the same values; positions past p enter as 0 * 0. */
#define PM_TILE 32
#define PM_ROWS 8 /* threads down a tile: PM_TILE / PM_ROWS outputs each */
static __global__ void __launch_bounds__(PM_TILE *PM_ROWS)
    prefix_matmul_tiles(float *c, const float *a, const float *b, const long long *prefix,
                        long long run, long long m, long long n, long long s, long long tiles_n,
                        long long a_sb, long long a_sr, long long a_sc, long long b_sb,
                        long long b_sr, long long b_sc, mk_fault_rec *fault, int launch) {
    __shared__ float As[PM_TILE][PM_TILE + 1], Bs[PM_TILE][PM_TILE + 1];
    const long long t = blockIdx.x / tiles_n, j0 = blockIdx.x % tiles_n * PM_TILE,
                    i0 = (long long)blockIdx.y * PM_TILE, p = prefix[t / run];
    const int tx = threadIdx.x % PM_TILE, ty = threadIdx.x / PM_TILE;
    if (p < 0 || p > s) {
        if (t % run == 0 && i0 == 0 && j0 == 0 && threadIdx.x == 0) /* once a run */
            mk_raise(fault, launch, 0, MK_FAULT_PREFIX, p, s, 0);
        return;
    }
    const float *at = a + t * a_sb, *bt = b + t * b_sb;
    float acc[PM_TILE / PM_ROWS] = {};
    for (long long q0 = 0; q0 < p; q0 += PM_TILE) {
        for (int r = ty; r < PM_TILE; r += PM_ROWS) {
            const long long i = i0 + r, q = q0 + r;
            As[r][tx] = i < m && q0 + tx < p ? at[i * a_sr + (q0 + tx) * a_sc] : 0.0f;
            Bs[r][tx] = q < p && j0 + tx < n ? bt[q * b_sr + (j0 + tx) * b_sc] : 0.0f;
        }
        __syncthreads();
        for (int q = 0; q < PM_TILE; q++) {
            const float bq = Bs[q][tx];
#pragma unroll
            for (int r = 0; r < PM_TILE / PM_ROWS; r++) acc[r] += As[ty + r * PM_ROWS][q] * bq;
        }
        __syncthreads();
    }
    for (int r = 0; r < PM_TILE / PM_ROWS; r++) {
        const long long i = i0 + ty + r * PM_ROWS, j = j0 + tx;
        if (i < m && j < n) c[(t * m + i) * n + j] = acc[r];
    }
}

/* MK_KERNEL_PREFIX_MATMUL (float32): a @ b over the first p of the shared axis,
 * p an int64 [1], or [N] one a run of the batch, read on the device (so no
 * cuBLAS: its k is a host value). */
int mk_cuda_prefix_matmul(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    int ra = a->rank, rb = b->rank;
    long long m = ra == 1 ? 1 : a->shape[ra - 2], n = b->shape[rb - 1], k = a->shape[ra - 1];
    long long a_sr = ra == 1 ? 0 : a->stride[ra - 2], a_sc = a->stride[ra - 1];
    long long b_sr = b->stride[rb - 2], b_sc = b->stride[rb - 1];
    long long a_sb = ra == 3 ? a->stride[0] : 0, b_sb = rb == 3 ? b->stride[0] : 0;
    long long total = mk_tensor_numel(&l->out);
    long long run = (ra == 3 ? a->shape[0] : 1) / mk_tensor_numel(&l->in[2]); /* batches a prefix */
    if (m >= PM_TILE && total > 0) {
        long long tiles_n = (n + PM_TILE - 1) / PM_TILE, batches = total / (m * n);
        dim3 grid((unsigned)(batches * tiles_n), (unsigned)((m + PM_TILE - 1) / PM_TILE));
        prefix_matmul_tiles<<<grid, PM_TILE * PM_ROWS, 0, s->stream>>>(
            (float *)l->out.data, (const float *)a->data, (const float *)b->data,
            (const long long *)l->in[2].data, run, m, n, k, tiles_n, a_sb, a_sr, a_sc, b_sb, b_sr,
            b_sc, s->fault, l->index);
        return mk_cuda_check_launch(l, "prefix_matmul_tiles", err);
    }
    unsigned int blocks = mk_cuda_blocks(total, MK_CUDA_BLOCK);
    if (blocks > 132u * 16u) blocks = 132u * 16u;
    prefix_matmul_kernel<<<blocks, MK_CUDA_BLOCK, 0, s->stream>>>(
        (float *)l->out.data, (const float *)a->data, (const float *)b->data,
        (const long long *)l->in[2].data, run, m, n, k, total, a_sb, a_sr, a_sc, b_sb, b_sr, b_sc,
        s->fault, l->index);
    return mk_cuda_check_launch(l, "prefix_matmul_kernel", err);
}
