/*
 * matmul.c — the CPU's matrix products (the MatMul and PrefixMatMul kernels):
 * plain loops for small products and layouts BLAS cannot express, the
 * matrix–vector row functions that a lone product of few rows shares with the
 * groups (mk_cpu_mv_columns, mk_cpu_mv_rows; with A on the int8 grid,
 * q8.c's), and OpenBLAS, opened at run time, for many rows.
 */
#include "cpu.h"
#include "vec.h"

#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- plain loops -------------------------------------------------------- */

/*
 * c [m, n] (contiguous) = a [m, k] (strides sar, sac) @ b [k, n] (strides sbr, sbc)
 * with plain loops: for small products (a BLAS call costs more than the work,
 * and batches can then run on OpenMP threads without nesting OpenBLAS's own
 * threads) and for layouts BLAS cannot express.
 */
void mk_cpu_mm_loops(const float *a, int64_t sar, int64_t sac, const float *b, int64_t sbr,
                     int64_t sbc, float *restrict c, int64_t m, int64_t k, int64_t n) {
    for (int64_t i = 0; i < m; i++) {
        const float *ai = a + i * sar;
        float *restrict ci = c + i * n;
        if (sbc == 1 || n == 1) {
            /* b's rows are contiguous: c_ij = a_i0 b_0j + a_i1 b_1j + ..., 64
             * columns at a time in registers (in that order), then 8 (in four
             * chains, kk mod 4, added pairwise), then one (in order). */
            int64_t j = 0;
            for (; j + 64 <= n; j += 64) {
                cpu_v8 t[8] = {0};
                for (int64_t kk = 0; kk < k; kk++) {
                    float av = ai[kk * sac];
                    const float *bk = b + kk * sbr + j;
                    #pragma GCC unroll 8
                    for (int v = 0; v < 8; v++)
                        t[v] += av * load8(bk + 8 * v);
                }
                memcpy(ci + j, t, sizeof t);
            }
            for (; j + 8 <= n; j += 8) { /* four chains of kk, so the adds overlap */
                cpu_v8 t[4] = {0};
                int64_t kk = 0;
                for (; kk + 4 <= k; kk += 4)
                    #pragma GCC unroll 4
                    for (int q = 0; q < 4; q++)
                        t[q] += ai[(kk + q) * sac] * load8(b + (kk + q) * sbr + j);
                for (; kk < k; kk++)
                    t[0] += ai[kk * sac] * load8(b + kk * sbr + j);
                cpu_v8 sum = (t[0] + t[1]) + (t[2] + t[3]);
                memcpy(ci + j, &sum, sizeof sum);
            }
            for (; j < n; j++) {
                float t = 0.0f;
                for (int64_t kk = 0; kk < k; kk++)
                    t += ai[kk * sac] * b[kk * sbr + j];
                ci[j] = t;
            }
        } else if (sbr == 1 && sac == 1) {
            /* b's columns are contiguous (attention scores over a cached K):
             * vectorised dot products, eight columns at a time (dot8), then
             * one (dot), each in the same order. */
            int64_t j = 0;
            for (; j + 8 <= n; j += 8) {
                cpu_v8 t = dot8(ai, b + j * sbc, sbc, k);
                memcpy(ci + j, &t, sizeof t);
            }
            for (; j < n; j++)
                ci[j] = dot(ai, b + j * sbc, k);
        } else {
            for (int64_t j = 0; j < n; j++) {
                float t = 0.0f;
                for (int64_t kk = 0; kk < k; kk++)
                    t += ai[kk * sac] * b[kk * sbr + j * sbc];
                ci[j] = t;
            }
        }
    }
}

/* ---- matrix–vector row functions ---------------------------------------- */

/*
 * c [j - j0] = a [k] · column j of b, for j in [j0, j1): b's columns are
 * contiguous, ldb floats apart. A column at a time, summed in 16 lanes (lane
 * l takes k = l, l + 16, ...: two 8-float vectors, which the compiler maps
 * onto whatever vector registers the build has), then the lanes pairwise,
 * then the k % 16 left over in order. One column at a time keeps the weights
 * one forward stream, which the hardware prefetcher follows (columns
 * interleaved are several streams, read slower). The order of every sum is
 * written out here, not left to a vectoriser, so it is the same for every
 * caller (the product alone, a matrix–vector group: a group equals its nodes
 * bit for bit) and every build. Not inlined, for the same reason.
 */
static inline __attribute__((always_inline)) void
mv_columns_of(const float *restrict a, const cpu_weights *w, int64_t k, int64_t j0, int64_t j1,
              float *restrict c, mk_dtype d) {
    int64_t body = k - k % 16;
    size_t es = mk_dtype_size(d);
    bool q8 = d == MK_DTYPE_INT8;
    for (int64_t j = j0; j < j1; j++) {
        const char *b = (const char *)w->data + (size_t)(j * w->ldb) * es;
        const float *sc = q8 ? w->scale + j * w->ss_n : NULL; /* int8: the column's block scales */
        cpu_v8 s0 = {0}, s1 = {0};
        int64_t gk = 0, left = q8 ? w->group : 0; /* int8: the block's scale, and what it has left */
        for (int64_t kk = 0; kk < body; kk += 16) {
            cpu_v8 w0 = wload8(b, kk, d), w1 = wload8(b, kk + 8, d);
            if (q8) {
                w0 *= sc[gk], w1 *= sc[gk];
                if ((left -= 16) == 0) gk += w->ss_k, left = w->group;
            }
            s0 += w0 * load8(a + kk), s1 += w1 * load8(a + kk + 8);
        }
        float t = 0.0f;
        for (int64_t kk = body; kk < k; kk++) {
            float v = wload1(b, kk, d);
            if (q8) v *= sc[kk / w->group * w->ss_k];
            t += v * a[kk];
        }
        c[j - j0] = lanes_total(s0, s1, t);
    }
}

/* c [j - j0] = a · column j of w, j in [j0, j1); one body per weight dtype. */
__attribute__((noinline)) void mk_cpu_mv_columns(const float *restrict a, const cpu_weights *w,
                                                 int64_t k, int64_t j0, int64_t j1,
                                                 float *restrict c) {
    switch (w->dtype) {
    case MK_DTYPE_BFLOAT16: mv_columns_of(a, w, k, j0, j1, c, MK_DTYPE_BFLOAT16); break;
    case MK_DTYPE_FLOAT16: mv_columns_of(a, w, k, j0, j1, c, MK_DTYPE_FLOAT16); break;
    case MK_DTYPE_INT8: mv_columns_of(a, w, k, j0, j1, c, MK_DTYPE_INT8); break;
    default: mv_columns_of(a, w, k, j0, j1, c, MK_DTYPE_FLOAT32); break;
    }
}

/*
 * c [j] = a [k] · column j of b for j < cols, b held by rows ([k, n]: row kk
 * at b + kk * ldb, its columns contiguous): every column's sum taken over k in
 * order, each term a_k b_kj rounded and then added, so a column's value is the
 * same whichever of the three paths below takes it, in every build, wherever a
 * caller's share of the columns begins (a group equals its product alone, and
 * a split among threads changes nothing):
 *   - blocks of CPU_ROW_BLOCK columns keep their sums in CPU_ROW_VECS vector
 *     registers while b's rows stream by (with AVX-512, 256 columns: a row's
 *     whole kilobyte is one contiguous read, which L2 serves at its full rate);
 *   - then whole vectors one at a time;
 *   - then the last columns (fewer than a vector): masked loads where the
 *     build has AVX-512, else their sums in c itself (L1).
 */
#ifdef __AVX512F__
typedef float cpu_vr __attribute__((vector_size(64)));
#define CPU_ROW_VECS 16
#else
typedef float cpu_vr __attribute__((vector_size(32)));
#define CPU_ROW_VECS 8
#endif
#define CPU_ROW_LANES ((int64_t)(sizeof(cpu_vr) / sizeof(float)))
#define CPU_ROW_BLOCK (CPU_ROW_VECS * CPU_ROW_LANES)

static inline cpu_vr load_vr(const float *p) {
    cpu_vr v;
    memcpy(&v, p, sizeof v);
    return v;
}

__attribute__((noinline)) void mk_cpu_mv_rows(const float *restrict a, const float *restrict b,
                                              int64_t ldb, int64_t k, int64_t cols,
                                              float *restrict c) {
    int64_t j = 0;
    for (; j + CPU_ROW_BLOCK <= cols; j += CPU_ROW_BLOCK) {
        cpu_vr s[CPU_ROW_VECS] = {0};
        for (int64_t kk = 0; kk < k; kk++) {
            const float *bk = b + kk * ldb + j;
#pragma GCC unroll 16
            for (int v = 0; v < CPU_ROW_VECS; v++) s[v] += load_vr(bk + v * CPU_ROW_LANES) * a[kk];
        }
        memcpy(c + j, s, sizeof s);
    }
    for (; j + CPU_ROW_LANES <= cols; j += CPU_ROW_LANES) {
        cpu_vr s = {0};
        for (int64_t kk = 0; kk < k; kk++) s += load_vr(b + kk * ldb + j) * a[kk];
        memcpy(c + j, &s, sizeof s);
    }
    if (j == cols) return;
#ifdef __AVX512F__
    __mmask16 mask = (__mmask16)((1u << (cols - j)) - 1);
    __m512 s = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++)
        s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, b + kk * ldb + j),
                                           _mm512_set1_ps(a[kk])));
    _mm512_mask_storeu_ps(c + j, mask, s);
#else
    for (int64_t t = j; t < cols; t++)
        c[t] = 0.0f;
    for (int64_t kk = 0; kk < k; kk++) {
        float av = a[kk];
        const float *bk = b + kk * ldb;
#pragma omp simd
        for (int64_t t = j; t < cols; t++)
            c[t] += av * bk[t];
    }
#endif
}

/* ---- products of few rows, and OpenBLAS --------------------------------- */

/*
 * Rows of A up to which a lone product runs through mv_omp rather than BLAS:
 * a prompt of up to this many tokens (a prefill) neither loads OpenBLAS nor
 * wakes its threads, which spin against OpenMP's, then and in the decoding
 * after it; mv_omp is the faster up to about here.
 */
#define CPU_FEW_ROWS 64

/*
 * c [m, n] (contiguous) = a [m, k] (rows dense, sar apart) @ b, with b held
 * either as [n, k] rows (transposed: each output a dot product,
 * mk_cpu_mv_columns) or as [k, n] rows (normal: rows of b scaled and added,
 * mk_cpu_mv_rows), m at most CPU_FEW_ROWS: each row as a matrix–vector group
 * computes it, bit for bit, the rows together per chunk of CPU_MV_CHUNK
 * columns. Split over OpenMP threads rather than left to OpenBLAS: a
 * one-token model runs hundreds of small launches, and OpenBLAS's own threads
 * spinning between them starve OpenMP's (and the other way round).
 */
static void mv_omp(const float *a, int64_t sar, const float *b, int64_t ldb,
                   bool b_rows_are_outputs, float *c, int64_t m, int64_t k, int64_t n) {
    CPU_REGION(par(m * n * k), {
        int64_t q0, q1;
        my_share((n + 3) / 4, &q0, &q1);
        int64_t end = 4 * q1 < n ? 4 * q1 : n;
        const cpu_weights w = {.data = b, .dtype = MK_DTYPE_FLOAT32, .ldb = ldb};
        for (int64_t j = 4 * q0; j < end; j += CPU_MV_CHUNK) {
            int64_t j1 = j + CPU_MV_CHUNK < end ? j + CPU_MV_CHUNK : end;
            for (int64_t i = 0; i < m; i++)
                if (b_rows_are_outputs)
                    mk_cpu_mv_columns(a + i * sar, &w, k, j, j1, c + i * n + j);
                else
                    mk_cpu_mv_rows(a + i * sar, b + j, ldb, k, j1 - j, c + i * n + j);
        }
    });
}

/*
 * OpenBLAS, opened by the compile of the first model with a product of more
 * rows than mv_omp takes (device.c's cpu_prepare, mk_cpu_blas_needed), not
 * linked: a model whose products all run in groups or mv_omp (decoding, a
 * short prompt, a policy MLP) never loads it, so neither its 4 MB nor its
 * threads, which spin for a while after they start and would take the cores
 * from OpenMP's. An OpenMP build of OpenBLAS is opened first where one is
 * installed (Debian's libopenblas0-openmp, Fedora's libopenblaso): its
 * threads are OpenMP's own, the ones our launches use, where the pthreads
 * build's threads and OpenMP's idle workers spin against each other on the
 * same cores (a prompt's products between OpenMP launches ran up to 10x
 * slower: performance.md, "CPU: OpenBLAS's OpenMP build"). $MK_BLAS names
 * another build to open instead.
 */
static struct {
    __typeof__(cblas_sgemm) *sgemm;
    __typeof__(cblas_sgemv) *sgemv;
    bool ready;    /* both found */
    char why[256]; /* why it could not be opened, or "" */
} cpu_blas;
static pthread_once_t cpu_blas_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__)
#define MK_MULTIARCH "x86_64-linux-gnu"
#elif defined(__aarch64__)
#define MK_MULTIARCH "aarch64-linux-gnu"
#else
#define MK_MULTIARCH "unknown"
#endif

static void cpu_blas_open(void) {
    const char *env = getenv("MK_BLAS");
    const char *names[] = {"/usr/lib/" MK_MULTIARCH "/openblas-openmp/libopenblas.so.0",
                           "libopenblaso.so.0", "libopenblas.so.0", "libopenblas.so"};
    size_t n = sizeof names / sizeof names[0];
    if (env && *env) names[0] = env, n = 1;
    for (size_t i = 0; i < n; i++) {
        void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            snprintf(cpu_blas.why, sizeof cpu_blas.why, "%s", dlerror());
            continue;
        }
        cpu_blas.sgemm = (__typeof__(cblas_sgemm) *)dlsym(lib, "cblas_sgemm");
        cpu_blas.sgemv = (__typeof__(cblas_sgemv) *)dlsym(lib, "cblas_sgemv");
        if (cpu_blas.sgemm && cpu_blas.sgemv) {
            cpu_blas.ready = true;
            cpu_blas.why[0] = '\0';
            return; /* open for the process's life, as a linked library would be */
        }
        snprintf(cpu_blas.why, sizeof cpu_blas.why, "%s has no cblas_sgemm or cblas_sgemv",
                 names[i]);
        cpu_blas.sgemm = NULL, cpu_blas.sgemv = NULL;
        dlclose(lib);
    }
}

/*
 * OpenBLAS's OpenMP build takes the calling thread's OpenMP count: around a
 * call, that count is the launch's (max_threads: its cost rule's and the
 * model's `threads`, so `threads = 1` opens no region here either, and never
 * more than the CPUs online). The pthreads build keeps its own count.
 */
static int blas_threads_begin(void) {
#ifdef _OPENMP
    int before = omp_get_max_threads();
    omp_set_num_threads(max_threads());
    return before;
#else
    return 0;
#endif
}

static void blas_threads_end(int before) {
#ifdef _OPENMP
    omp_set_num_threads(before);
#else
    (void)before;
#endif
}

const char *mk_cpu_blas_open(void) {
    pthread_once(&cpu_blas_once, cpu_blas_open);
    return cpu_blas.ready ? NULL : cpu_blas.why;
}

/*
 * c [m, n] (row stride ldc) = op(a) [m, k] @ op(b) [k, n] + beta c, row-major,
 * op(x) the transpose where ta / tb: CBLAS's sgemm where it is open (the
 * convolutions, conv.c; cpu_prepare opened it), else plain loops.
 */
void mk_cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float *a,
                  int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
    pthread_once(&cpu_blas_once, cpu_blas_open);
    if (cpu_blas.ready && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX &&
        lda <= INT32_MAX && ldb <= INT32_MAX && ldc <= INT32_MAX) {
        int before = blas_threads_begin();
        cpu_blas.sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                       tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)lda,
                       b, (int)ldb, beta, c, (int)ldc);
        blas_threads_end(before);
        return;
    }
    int64_t sar = ta ? 1 : lda, sac = ta ? lda : 1, sbr = tb ? 1 : ldb, sbc = tb ? ldb : 1;
    CPU_FOR(par(m * n * k / 4), i, m, {
        for (int64_t j = 0; j < n; j++) {
            float t = 0.0f;
            for (int64_t kk = 0; kk < k; kk++) t += a[i * sar + kk * sac] * b[kk * sbr + j * sbc];
            c[i * ldc + j] = beta == 0.0f ? t : t + beta * c[i * ldc + j];
        }
    });
}

/* How mm_one computes a product: mv_omp, CBLAS's sgemv or sgemm, or
 * mk_cpu_mm_loops. */
typedef enum { CPU_MM_ROWS, CPU_MM_GEMV, CPU_MM_GEMM, CPU_MM_LOOPS } cpu_mm_way;

/* The way for a [m, k] (strides sar, sac) @ b, where ok_b says whether CBLAS
 * (and mv_omp) can read b's layout. */
static cpu_mm_way mm_way(bool ok_b, int64_t sar, int64_t sac, int64_t m, int64_t k) {
    bool ta;
    int64_t lda;
    if (!ok_b) return CPU_MM_LOOPS;
    if ((sac == 1 || k == 1) && m <= CPU_FEW_ROWS) return CPU_MM_ROWS;
    if (m == 1 && (sac != 0 || k == 1) && sac <= INT32_MAX) return CPU_MM_GEMV;
    if (m <= INT32_MAX && mk_matrix_layout(m, k, sar, sac, &ta, &lda)) return CPU_MM_GEMM;
    return CPU_MM_LOOPS;
}

/*
 * One product c [m, n] = a [m, k] @ b [k, n]: through CBLAS where the layouts
 * allow and the product has more rows than mv_omp takes. CBLAS is open when
 * it gets here (device.c's cpu_prepare opened it for any launch that may, or
 * failed the compile); should a product reach it anyway (a prefix narrowing k
 * to a layout CBLAS takes), it opens it, and without it runs mk_cpu_mm_loops.
 */
static void mm_one(const float *a, int64_t sar, int64_t sac, const float *b, int64_t sbr,
                   int64_t sbc, float *c, int64_t m, int64_t k, int64_t n) {
    bool ta, tb;
    int64_t lda, ldb;
    bool ok_b = mk_matrix_layout(k, n, sbr, sbc, &tb, &ldb) && n <= INT32_MAX && k <= INT32_MAX;
    cpu_mm_way way = mm_way(ok_b, sar, sac, m, k);
    if (way == CPU_MM_GEMV || way == CPU_MM_GEMM) {
        pthread_once(&cpu_blas_once, cpu_blas_open);
        if (!cpu_blas.ready) way = CPU_MM_LOOPS;
    }
    switch (way) {
    case CPU_MM_ROWS:
        mv_omp(a, sar, b, ldb, tb, c, m, k, n); /* as a matrix–vector group does */
        return;
    case CPU_MM_GEMV: {
        /* c [n] = b^T a: b normal is [k, n] (Trans), transposed is held as [n, k]. */
        int incx = k == 1 ? 1 : (int)sac, before = blas_threads_begin();
        if (!tb)
            cpu_blas.sgemv(CblasRowMajor, CblasTrans, (int)k, (int)n, 1.0f, b, (int)ldb, a, incx,
                           0.0f, c, 1);
        else
            cpu_blas.sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, b, (int)ldb, a,
                           incx, 0.0f, c, 1);
        blas_threads_end(before);
        return;
    }
    case CPU_MM_GEMM: {
        mk_matrix_layout(m, k, sar, sac, &ta, &lda);
        int before = blas_threads_begin();
        cpu_blas.sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                       tb ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)lda,
                       b, (int)ldb, 0.0f, c, (int)n);
        blas_threads_end(before);
        return;
    }
    case CPU_MM_LOOPS:
        mk_cpu_mm_loops(a, sar, sac, b, sbr, sbc, c, m, k, n);
        return;
    }
}

/* Per-product work (m·k·n) below which batches use mk_cpu_mm_loops, on OpenMP
 * threads. */
#define CPU_MM_SMALL (64 * 64 * 64)

/*
 * Whether mk_cpu_matmul may take launch l (a MatMul or a PrefixMatMul, whose
 * prefix only narrows k) to CBLAS: a product of more rows than mv_omp takes,
 * unless it is one of a batch of small ones (mk_cpu_mm_loops). Low-precision
 * weights are widened into a layout CBLAS reads.
 */
bool mk_cpu_blas_needed(const mk_launch *l) {
    const mk_tensor *a = &l->in[0], *b = &l->in[1];
    mk_matmul_plan p;
    mk_matmul_plan_of(a, b, &p);
    if (p.batched && p.m * p.k * p.n < CPU_MM_SMALL) return false;
    bool tb;
    int64_t ldb;
    bool ok_b = p.k <= INT32_MAX && p.n <= INT32_MAX &&
                (b->dtype != MK_DTYPE_FLOAT32 ||
                 mk_matrix_layout(p.k, p.n, p.b_sr, p.b_sc, &tb, &ldb));
    cpu_mm_way way = mm_way(ok_b, p.a_sr, p.a_sc, p.m, p.k);
    return way == CPU_MM_GEMV || way == CPU_MM_GEMM;
}

/*
 * out = a @ b, float32, as numpy.matmul (mk_matmul_plan: a batch of products
 * C [m, n] = A [m, k] · B [k, n], the batch dims broadcast with stride 0):
 *   [k] @ [k, n] → [n];  [m, k] @ [k, n] → [m, n];  [B, m, k] @ [B, k, n] → [B, m, n];
 *   [B, T, D] @ [D, O] → [B, T, O] (one product of B·T rows); [.., m, k] @ [k] → [.., m].
 * a and b are strided (see mk_matrix_layout); out is contiguous.
 */
int mk_cpu_matmul(const mk_launch *l, mk_error **err) {
    mk_tensor wide = l->in[1], *b = &wide;
    if (b->dtype != MK_DTYPE_FLOAT32) {
        /* low-precision weights, widened into scratch: in their own layout where
         * they fill their memory (a permuted weight stays transposed, read as
         * a matrix–vector group reads it), else dense */
        wide.data = l->scratch;
        wide.dtype = MK_DTYPE_FLOAT32;
        if (mk_tensor_is_dense_permuted(&l->in[1])) {
            mk_convert(l->scratch, MK_DTYPE_FLOAT32, l->in[1].data, l->in[1].dtype,
                       mk_tensor_numel(b));
        } else {
            mk_launch copy = {.node = l->node, .n_in = 1, .in = {l->in[1]}, .out = wide};
            mk_contiguous_strides(b->rank, b->shape, copy.out.stride);
            mk_cpu_cast(&copy, err);
            wide = copy.out;
        }
    }
    mk_matmul_plan p;
    mk_matmul_plan_of(&l->in[0], b, &p);
    float *c = l->out.data;
    const float *ap = l->in[0].data, *bp = b->data;
    int64_t m = p.m, k = p.k, n = p.n;
    if (!p.batched) {
        mm_one(ap, p.a_sr, p.a_sc, bp, p.b_sr, p.b_sc, c, m, k, n);
        return 0;
    }
    if (m * k * n < CPU_MM_SMALL) {
        /* Attention over one token: many small products, one per thread. */
        CPU_FOR(p.count > 1 && par(p.count * m * k * n / 4), t, p.count, {
            int64_t oa, ob;
            mk_matmul_batch_offsets(&p, t, &oa, &ob);
            mk_cpu_mm_loops(ap + oa, p.a_sr, p.a_sc, bp + ob, p.b_sr, p.b_sc, c + t * m * n, m,
                            k, n);
        });
    } else {
        for (int64_t t = 0; t < p.count; t++) {
            int64_t oa, ob;
            mk_matmul_batch_offsets(&p, t, &oa, &ob);
            mm_one(ap + oa, p.a_sr, p.a_sc, bp + ob, p.b_sr, p.b_sc, c + t * m * n, m, k, n);
        }
    }
    return 0;
}

/* out = a @ b over the first p elements of the shared axis (p: int64 [1], or
 * one a run of the batch; read now, 0 <= p <= that axis): the product of a and
 * b narrowed to them, a run at a time. */
int mk_cpu_prefix_matmul(const mk_launch *l, mk_error **err) {
    int64_t s = l->in[0].shape[l->in[0].rank - 1], runs;
    const int64_t *p;
    if (mk_cpu_prefixes(l, 2, s, &p, &runs, err)) return -1;
    /* runs > 1: [L, m, s] @ [L, s, n], each run of L / runs batches its own product */
    int64_t per = runs > 1 ? l->in[0].shape[0] / runs : 0;
    for (int64_t j = 0; j < runs; j++) {
        mk_launch narrow = *l;
        mk_tensor *a = &narrow.in[0], *b = &narrow.in[1], *o = &narrow.out;
        if (runs > 1) {
            a->data = (float *)a->data + j * per * a->stride[0];
            b->data = (float *)b->data + j * per * b->stride[0];
            o->data = (float *)o->data + j * per * o->stride[0];
            a->shape[0] = b->shape[0] = o->shape[0] = per;
        }
        if (p[j] == 0) {
            memset(o->data, 0, (size_t)mk_tensor_numel(o) * sizeof(float));
            continue;
        }
        a->shape[a->rank - 1] = p[j];
        b->shape[b->rank - 2] = p[j];
        if (mk_cpu_matmul(&narrow, err)) return -1;
    }
    return 0;
}

