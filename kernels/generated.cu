/*
 * generated.cu — CUDA C written for each pointwise group (core/group.c),
 * compiled with NVRTC when the model is compiled, loaded with the runtime's
 * library API and launched like any kernel (so it is a node of the model's
 * CUDA graph).
 *
 * One group, one kernel: the group's program (an mk_expr over up to MK_X_IN
 * operands) becomes straight-line code, each operand's offsets are computed
 * from the launch's walk (shapes and strides baked in as constants), and each
 * thread does elements e, e + the grid, .... Arithmetic is what the
 * interpreter does (pointwise.cu): __fadd_rn and friends, one rounding per
 * operation, never contracted; expf and tanhf are CUDA's. So a group gives the
 * bits of one launch per node, on this device and the CPU alike.
 *
 * Kernels are kept for the process, by the hash of their source and the
 * device's architecture: identical layers (same shapes, same program) compile
 * once, whatever the model or context. Compiling happens in prepare, before
 * the graph is captured.
 */
#include "cuda_device.h"

#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- source ----------------------------------------------------------------- */

/* Instruction j of e as CUDA C: "const T rK = ...;". */
static void put_insn(mk_strbuf *b, const mk_expr *e, int j, bool f32) {
    const mk_xinsn *in = &e->insn[j];
    char x[8], y[8], z[8];
    snprintf(x, sizeof x, "r%d", in->x);
    snprintf(y, sizeof y, "r%d", in->y);
    snprintf(z, sizeof z, "r%d", in->z);
    const char *T = f32 ? "float" : "long long";
    const char *U = "(unsigned long long)";
    mk_strbuf_put(b, "        const %s r%d = ", T, MK_X_IN + j);
    switch ((mk_xop)in->op) {
    case MK_X_CONST: mk_strbuf_put(b, "(%s)%a", T, in->k); break; /* the CPU's (T)k */
    case MK_X_NEG:
        if (f32) mk_strbuf_put(b, "-%s", x);
        else mk_strbuf_put(b, "(long long)(0ull - %s%s)", U, x);
        break;
    case MK_X_EXP: mk_strbuf_put(b, f32 ? "expf(%s)" : "%s", x); break;
    case MK_X_TANH: mk_strbuf_put(b, f32 ? "tanhf(%s)" : "%s", x); break;
    case MK_X_SQRT: mk_strbuf_put(b, f32 ? "__fsqrt_rn(%s)" : "%s", x); break;
    case MK_X_ADD:
        if (f32) mk_strbuf_put(b, "__fadd_rn(%s, %s)", x, y);
        else mk_strbuf_put(b, "(long long)(%s%s + %s%s)", U, x, U, y);
        break;
    case MK_X_SUB:
        if (f32) mk_strbuf_put(b, "__fsub_rn(%s, %s)", x, y);
        else mk_strbuf_put(b, "(long long)(%s%s - %s%s)", U, x, U, y);
        break;
    case MK_X_MUL:
        if (f32) mk_strbuf_put(b, "__fmul_rn(%s, %s)", x, y);
        else mk_strbuf_put(b, "(long long)(%s%s * %s%s)", U, x, U, y);
        break;
    case MK_X_DIV: mk_strbuf_put(b, f32 ? "__fdiv_rn(%s, %s)" : "%s", x, y); break;
    case MK_X_GT: mk_strbuf_put(b, "(%s > %s ? (%s)1 : (%s)0)", x, y, T, T); break;
    case MK_X_LT: mk_strbuf_put(b, "(%s < %s ? (%s)1 : (%s)0)", x, y, T, T); break;
    case MK_X_SELECT: mk_strbuf_put(b, "(%s != (%s)0 ? %s : %s)", x, T, y, z); break;
    case MK_X_MAX: mk_strbuf_put(b, "(%s > %s ? %s : %s)", x, y, x, y); break;
    }
    mk_strbuf_put(b, ";\n");
}

/* The kernel of launch l: out (contiguous) = program(in[0], ..., in[n - 1]). */
static void put_source(mk_strbuf *b, const mk_launch *l) {
    const mk_expr *e = l->expr;
    bool f32 = l->out.dtype == MK_DTYPE_FLOAT32;
    const char *T = f32 ? "float" : "long long";
    const int64_t *strides[MK_WALK_MAX];
    for (int k = 0; k < l->n_in; k++) strides[k] = l->in[k].stride;
    mk_walk w;
    mk_walk_init(&w, l->out.rank, l->out.shape, l->n_in, strides);
    mk_strbuf_put(b, "// moonkaas pointwise group: %s $%d, %d operands, %d instructions\n",
                  l->node->op->name, l->node->id, l->n_in, e->n);
    mk_strbuf_put(b, "extern \"C\" __global__ void __launch_bounds__(%d)\nmk_pointwise(%s *__restrict__ o",
                  MK_CUDA_BLOCK, T);
    for (int k = 0; k < l->n_in; k++) mk_strbuf_put(b, ", const %s *__restrict__ i%d", T, k);
    mk_strbuf_put(b, ", long long n) {\n");
    mk_strbuf_put(b, "    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < n;\n"
                     "         e += (long long)gridDim.x * blockDim.x) {\n");
    /* offsets: e unravelled over the walk's dims, last first */
    for (int k = 0; k < l->n_in; k++) mk_strbuf_put(b, "        long long p%d = 0;\n", k);
    mk_strbuf_put(b, "        long long rest = e, q;\n");
    for (int d = w.rank - 1; d >= 0; d--) {
        mk_strbuf_put(b, "        q = rest %% %lldLL; rest /= %lldLL;", (long long)w.shape[d],
                      (long long)w.shape[d]);
        for (int k = 0; k < l->n_in; k++)
            if (w.stride[k][d]) mk_strbuf_put(b, " p%d += q * %lldLL;", k, (long long)w.stride[k][d]);
        mk_strbuf_put(b, "\n");
    }
    mk_strbuf_put(b, "        (void)q; (void)rest;\n");
    for (int k = 0; k < e->n_in; k++)
        mk_strbuf_put(b, "        const %s r%d = i%d[p%d];\n", T, k, k, k);
    for (int j = 0; j < e->n; j++) put_insn(b, e, j, f32);
    mk_strbuf_put(b, "        o[e] = r%d;\n    }\n}\n", MK_X_IN + e->n - 1);
}

/* ---- matrix–vector groups ---------------------------------------------------- */

/* "long long VAR = offset of element E of t read as (rank, shape)": e unravelled
 * over the shape, t broadcast onto it (dims of size 1 repeat). */
static void put_offset(mk_strbuf *b, const char *var, const char *e, const mk_tensor *t,
                       int rank, const int64_t *shape) {
    mk_tensor like = {.rank = rank};
    memcpy(like.shape, shape, sizeof like.shape);
    mk_tensor bt = mk_tensor_broadcast(t, &like);
    mk_walk w = mk_cuda_walk1(rank, shape, bt.stride);
    mk_strbuf_put(b, "            long long %s = 0;\n            { long long rest = %s, q;", var, e);
    for (int d = w.rank - 1; d >= 0; d--) {
        mk_strbuf_put(b, " q = rest %% %lldLL; rest /= %lldLL;", (long long)w.shape[d],
                      (long long)w.shape[d]);
        if (w.stride[0][d]) mk_strbuf_put(b, " %s += q * %lldLL;", var, (long long)w.stride[0][d]);
    }
    mk_strbuf_put(b, " (void)q; (void)rest; }\n");
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Result o's code for the column pair of warp index `p` (local to o). */
static void put_result(mk_strbuf *b, const mk_launch *l, const mk_product_group *pg, int o,
                       bool vec) {
    const mk_product_out *r = &pg->out[o];
    int M = (int)pg->m;
    long long K = (long long)pg->k, N = (long long)r->n;
    int prods[MK_X_IN], np = 0; /* the products it reads, as sources */
    for (int s = 0; s < r->n_src; s++)
        if (r->src[s].product >= 0) prods[np++] = s;
    mk_strbuf_put(b, "        const long long n0 = 2 * p;\n");
    mk_strbuf_put(b, "        float acc[%d][2][%d];\n", M, np);
    mk_strbuf_put(b, "        for (int m = 0; m < %d; m++) for (int c = 0; c < 2; c++) for (int j = 0; j < %d; j++) acc[m][c][j] = 0.0f;\n", M, np);
    for (int j = 0; j < np; j++) {
        int bk = pg->b[r->src[prods[j]].product];
        mk_strbuf_put(b, "        const float *B%d = (const float *)i%d + n0 * %lldLL;\n", j, bk,
                      (long long)l->in[bk].stride[1]);
    }
    const char *T = vec ? "float4" : "float";
    mk_strbuf_put(b, "        for (long long k = %s; k < %lldLL; k += %s) {\n",
                  vec ? "4 * lane" : "lane", K, vec ? "128" : "32");
    long long ldb0 = 0;
    for (int j = 0; j < np; j++) {
        int bk = pg->b[r->src[prods[j]].product];
        ldb0 = l->in[bk].stride[1];
        for (int c = 0; c < 2; c++)
            mk_strbuf_put(b, "            const %s b%d_%d = *(const %s *)(B%d + %lldLL + k);\n", T, j,
                          c, T, j, c * ldb0);
    }
    for (int m = 0; m < M; m++) {
        mk_strbuf_put(b, "            %s a%d = *(const %s *)(A + %lldLL + k);\n", T, m, T, m * K);
        if (pg->norm_w >= 0) {
            mk_strbuf_put(b, "            { const %s w = *(const %s *)(W + k);", T, T);
            if (vec)
                mk_strbuf_put(b, " a%d.x = __fmul_rn(w.x, __fmul_rn(inv[%d], a%d.x));"
                                 " a%d.y = __fmul_rn(w.y, __fmul_rn(inv[%d], a%d.y));"
                                 " a%d.z = __fmul_rn(w.z, __fmul_rn(inv[%d], a%d.z));"
                                 " a%d.w = __fmul_rn(w.w, __fmul_rn(inv[%d], a%d.w)); }\n",
                              m, m, m, m, m, m, m, m, m, m, m, m);
            else
                mk_strbuf_put(b, " a%d = __fmul_rn(w, __fmul_rn(inv[%d], a%d)); }\n", m, m, m);
        }
        for (int j = 0; j < np; j++)
            for (int c = 0; c < 2; c++) {
                if (vec)
                    mk_strbuf_put(b, "            acc[%d][%d][%d] += a%d.x * b%d_%d.x + a%d.y * b%d_%d.y"
                                     " + a%d.z * b%d_%d.z + a%d.w * b%d_%d.w;\n",
                                  m, c, j, m, j, c, m, j, c, m, j, c, m, j, c);
                else
                    mk_strbuf_put(b, "            acc[%d][%d][%d] += a%d * b%d_%d;\n", m, c, j, m, j, c);
            }
    }
    mk_strbuf_put(b, "        }\n");
    mk_strbuf_put(b, "        for (int m = 0; m < %d; m++) for (int c = 0; c < 2; c++) for (int j = 0; j < %d; j++)\n"
                     "            for (int off = 16; off > 0; off >>= 1) acc[m][c][j] += __shfl_xor_sync(0xffffffffu, acc[m][c][j], off);\n",
                  M, np);
    mk_strbuf_put(b, "        if (lane != 0) return;\n");
    if (r->row_x >= 0) { /* the bounds, checked as the CPU's ReplaceSlice checks them */
        const mk_tensor *x = &l->in[r->row_x];
        long long rows = x->shape[0];
        mk_strbuf_put(b, "        const long long begin = *(const long long *)i%d, end = *(const long long *)i%d;\n",
                      r->row_begin, r->row_end);
        mk_strbuf_put(b, "        if (begin < 0 || end > %lldLL || begin > end) { mk_raise(fault, launch, %d, %d, begin, end, %lldLL); return; }\n",
                      rows, o + 1, (int)MK_FAULT_RANGE, rows);
        mk_strbuf_put(b, "        if (end - begin != %lldLL) { mk_raise(fault, launch, %d, %d, begin, end, %lldLL); return; }\n",
                      (long long)r->row_count, o + 1, (int)MK_FAULT_ROWS, (long long)r->row_count);
        mk_strbuf_put(b, "        float *dst = (float *)i%d + begin * %lldLL;\n", r->row_x,
                      (long long)(mk_tensor_numel(x) / rows));
    } else {
        mk_strbuf_put(b, "        float *dst = o + %lldLL;\n", (long long)r->offset);
    }
    mk_strbuf_put(b, "        for (int m = 0; m < %d; m++) {\n            float v[2];\n", M);
    mk_strbuf_put(b, "            for (int c = 0; c < 2; c++) {\n");
    mk_strbuf_put(b, "            const long long e = m * %lldLL + n0 + c;\n", N);
    for (int s = 0; s < r->n_src; s++) {
        const mk_product_source *src = &r->src[s];
        if (src->product >= 0) {
            int j = 0;
            while (prods[j] != s) j++;
            mk_strbuf_put(b, "            const float r%d = acc[m][c][%d];\n", s, j);
        } else {
            char var[16];
            snprintf(var, sizeof var, "p%d", s);
            put_offset(b, var, "e", &l->in[src->in], src->rank, src->shape);
            mk_strbuf_put(b, "            const float r%d = ((const float *)i%d)[p%d];\n", s, src->in, s);
        }
    }
    const mk_expr *e = &r->program;
    for (int j = 0; j < e->n; j++) put_insn(b, e, j, true);
    mk_strbuf_put(b, "            v[c] = r%d;\n            }\n", e->n ? MK_X_IN + e->n - 1 : 0);
    mk_strbuf_put(b, "            const long long e0 = m * %lldLL + n0;\n", N);
    if (r->rotate >= 0) { /* (re, im) * (cr, ci), rounded as the complex product's kernel */
        put_offset(b, "q0", "e0", &l->in[r->rotate], r->rotate_rank, r->rotate_shape);
        put_offset(b, "q1", "e0 + 1", &l->in[r->rotate], r->rotate_rank, r->rotate_shape);
        mk_strbuf_put(b, "            const float cr = ((const float *)i%d)[q0], ci = ((const float *)i%d)[q1];\n"
                         "            const float re = __fsub_rn(__fmul_rn(v[0], cr), __fmul_rn(v[1], ci));\n"
                         "            const float im = __fadd_rn(__fmul_rn(v[0], ci), __fmul_rn(v[1], cr));\n"
                         "            v[0] = re; v[1] = im;\n",
                      r->rotate, r->rotate);
    }
    mk_strbuf_put(b, "            dst[e0] = v[0]; dst[e0 + 1] = v[1];\n        }\n");
}

/* The kernel of a matrix–vector group's launch: one warp per column pair of a
 * result (every row of A), 8 warps a block; the RmsNorm's 1 / rms of each row
 * is reduced by every block first. */
static void put_product_source(mk_strbuf *b, const mk_launch *l) {
    const mk_product_group *pg = l->node->prod;
    int M = (int)pg->m;
    long long K = (long long)pg->k;
    /* float4 loads where every row of A, the weight and each B column is 16-byte aligned */
    bool vec = K % 4 == 0 && aligned16(l->in[pg->a].data) &&
               (pg->norm_w < 0 || aligned16(l->in[pg->norm_w].data));
    for (int j = 0; j < pg->n_products && vec; j++)
        vec = aligned16(l->in[pg->b[j]].data) && l->in[pg->b[j]].stride[1] % 4 == 0;
    mk_strbuf_put(b, "// moonkaas matrix-vector group $%d: [%d, %lld] @ %d products, %d results%s\n",
                  l->node->id, M, K, pg->n_products, pg->n_outs,
                  pg->norm_w >= 0 ? ", RmsNorm folded in" : "");
    mk_strbuf_put(b, "struct mk_fault_rec { unsigned int flag; int launch; int kind; int which; long long value[3]; };\n"
                     "static __device__ void mk_raise(mk_fault_rec *f, int launch, int which, int kind,\n"
                     "                                long long v0, long long v1, long long v2) {\n"
                     "    if (atomicCAS(&f->flag, 0u, 1u) == 0u) {\n"
                     "        f->launch = launch; f->kind = kind; f->which = which;\n"
                     "        f->value[0] = v0; f->value[1] = v1; f->value[2] = v2;\n"
                     "    }\n}\n");
    mk_strbuf_put(b, "extern \"C\" __global__ void __launch_bounds__(256)\nmk_product(float *__restrict__ o");
    for (int k = 0; k < l->n_in; k++) mk_strbuf_put(b, ", void *i%d", k);
    mk_strbuf_put(b, ", mk_fault_rec *fault, int launch) {\n");
    mk_strbuf_put(b, "    const int lane = threadIdx.x & 31;\n"
                     "    const long long warp = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);\n");
    mk_strbuf_put(b, "    const float *A = (const float *)i%d;\n", pg->a);
    if (pg->norm_w >= 0) {
        mk_strbuf_put(b, "    const float *W = (const float *)i%d;\n", pg->norm_w);
        mk_strbuf_put(b, "    __shared__ float inv[%d], part[8];\n", M);
        mk_strbuf_put(b, "    for (int m = 0; m < %d; m++) {\n"
                         "        float s = 0.0f;\n"
                         "        for (long long k = threadIdx.x; k < %lldLL; k += 256) s += A[m * %lldLL + k] * A[m * %lldLL + k];\n"
                         "        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);\n"
                         "        if (lane == 0) part[threadIdx.x >> 5] = s;\n"
                         "        __syncthreads();\n"
                         "        if (threadIdx.x == 0) {\n"
                         "            float t = 0.0f;\n"
                         "            for (int w = 0; w < 8; w++) t += part[w];\n"
                         "            inv[m] = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(t, (float)%lldLL), 1e-5f)));\n"
                         "        }\n"
                         "        __syncthreads();\n"
                         "    }\n",
                      M, K, K, K, K);
    }
    long long start = 0;
    for (int o = 0; o < pg->n_outs; o++) {
        long long pairs = pg->out[o].n / 2;
        mk_strbuf_put(b, "    %sif (warp < %lldLL) {\n        const long long p = warp - %lldLL;\n",
                      o ? "else " : "", start + pairs, start);
        put_result(b, l, pg, o, vec);
        mk_strbuf_put(b, "    }\n");
        start += pairs;
    }
    mk_strbuf_put(b, "}\n");
}

/* Warps (column pairs) of a matrix–vector group's launch. */
static long long product_warps(const mk_product_group *pg) {
    long long w = 0;
    for (int o = 0; o < pg->n_outs; o++) w += pg->out[o].n / 2;
    return w;
}

/* ---- compiling and the process-wide cache ---------------------------------- */

typedef struct {
    unsigned long long hash;
    int arch;
    cudaLibrary_t library;
    cudaKernel_t kernel;
} cached_kernel;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cached_kernel *cache;
static int n_cache, cap_cache;

static unsigned long long fnv1a(const char *s) {
    unsigned long long h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* NVRTC's status as an error, with the first lines of its log. */
static int nvrtc_fail(mk_error **err, nvrtcProgram prog, nvrtcResult r, const mk_launch *l) {
    char log[700] = "";
    size_t size = 0;
    if (prog && nvrtcGetProgramLogSize(prog, &size) == NVRTC_SUCCESS && size > 1) {
        char *full = (char *)malloc(size);
        if (full && nvrtcGetProgramLog(prog, full) == NVRTC_SUCCESS)
            snprintf(log, sizeof log, ": %s", full);
        free(full);
    }
    return mk_fail(err, MK_ERR_DEVICE, l->node->line, l->node->column,
                   "%s: NVRTC could not compile the group's kernel: %s%s", l->node->op->name,
                   nvrtcGetErrorString(r), log);
}

/* Compiles src for sm_<arch> and, with lib, loads it: the kernel (without lib:
 * any non-NULL value), or NULL with *err set. */
static cudaKernel_t compile(const char *src, int arch, const mk_launch *l, cudaLibrary_t *lib,
                            mk_error **err) {
    const char *symbol = l->node->prod ? "mk_product" : "mk_pointwise";
    nvrtcProgram prog = NULL;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, "moonkaas_group.cu", 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        nvrtc_fail(err, NULL, r, l);
        return NULL;
    }
    char gpu[48];
    snprintf(gpu, sizeof gpu, "--gpu-architecture=sm_%d", arch);
    /* nvcc's defaults (the interpreter's expf and tanhf are built so); the
     * group's own arithmetic is __fadd_rn and friends, never contracted */
    const char *opts[] = {gpu, "--std=c++17"};
    r = nvrtcCompileProgram(prog, 2, opts);
    size_t size = 0;
    char *cubin = NULL;
    if (r == NVRTC_SUCCESS) r = nvrtcGetCUBINSize(prog, &size);
    if (r == NVRTC_SUCCESS && !(cubin = (char *)malloc(size))) r = NVRTC_ERROR_OUT_OF_MEMORY;
    if (r == NVRTC_SUCCESS) r = nvrtcGetCUBIN(prog, cubin);
    if (r != NVRTC_SUCCESS) {
        nvrtc_fail(err, prog, r, l);
        nvrtcDestroyProgram(&prog);
        free(cubin);
        return NULL;
    }
    nvrtcDestroyProgram(&prog);
    if (!lib) {
        free(cubin);
        return (cudaKernel_t)1; /* compiled; nothing to load */
    }
    cudaKernel_t kernel = NULL;
    cudaError_t st = cudaLibraryLoadData(lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
    free(cubin);
    if (st == cudaSuccess) st = cudaLibraryGetKernel(&kernel, *lib, symbol);
    if (st != cudaSuccess) {
        mk_cuda_fail_status(err, st, "loading a generated kernel", __FILE__, __LINE__);
        return NULL;
    }
    return kernel;
}

/* With MK_CUDA_DUMP=DIR, each group's source is written to DIR/<hash>_sm<arch>.cu
 * for people reading what runs (a file that cannot be written is skipped). */
static void dump(const char *src, unsigned long long hash, int arch) {
    const char *dir = getenv("MK_CUDA_DUMP");
    if (!dir || !*dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%016llx_sm%d.cu", dir, hash, arch);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(src, f);
    fclose(f);
}

/* The kernel of launch l: from the cache, else generated and compiled. */
static cudaKernel_t kernel_for(const mk_launch *l, int arch, mk_error **err) {
    mk_strbuf src = {0};
    if (l->node->prod) put_product_source(&src, l);
    else put_source(&src, l);
    if (src.failed) {
        free(src.s);
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "writing a group's kernel");
        return NULL;
    }
    unsigned long long hash = fnv1a(src.s);
    dump(src.s, hash, arch);
    cudaKernel_t kernel = NULL;
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < n_cache && !kernel; i++)
        if (cache[i].hash == hash && cache[i].arch == arch) kernel = cache[i].kernel;
    if (!kernel) {
        cudaLibrary_t lib = NULL;
        if (n_cache == cap_cache) {
            int cap = cap_cache ? 2 * cap_cache : 16;
            cached_kernel *grown = (cached_kernel *)realloc(cache, sizeof *cache * (size_t)cap);
            if (!grown) {
                mk_fail(err, MK_ERR_NOMEM, 0, 0, "caching a generated kernel");
            } else {
                cache = grown;
                cap_cache = cap;
            }
        }
        if (n_cache < cap_cache && (kernel = compile(src.s, arch, l, &lib, err)))
            cache[n_cache++] = (cached_kernel){hash, arch, lib, kernel};
    }
    pthread_mutex_unlock(&cache_lock);
    free(src.s);
    return kernel;
}

int mk_cuda_generate(mk_cuda_state *s, const mk_launch *launches, int n, mk_error **err) {
    int arch = 0;
    for (int i = 0; i < n; i++) {
        const mk_launch *l = &launches[i];
        if (!l->node->pw && !l->node->prod) continue;
        if (!s->generated) {
            cudaDeviceProp prop;
            MK_CUDA_TRY(err, cudaGetDeviceProperties(&prop, s->device));
            arch = prop.major * 10 + prop.minor;
            s->generated = (void **)calloc((size_t)n, sizeof *s->generated);
            if (!s->generated) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "generated kernels");
        }
        if (!(s->generated[i] = (void *)kernel_for(l, arch, err))) return -1;
    }
    return 0;
fail:
    return -1;
}

/* A pointwise group's launch: its generated kernel over the whole result. */
int mk_cuda_pointwise_generated(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    if (!s->generated || !s->generated[l->index])
        return MK_INTERNAL(err, "a pointwise group without its generated kernel");
    long long n = mk_tensor_numel(&l->out);
    void *out = l->out.data, *in[MK_X_IN];
    void *args[MK_X_IN + 2];
    int a = 0;
    args[a++] = &out;
    for (int k = 0; k < l->n_in; k++) {
        in[k] = l->in[k].data;
        args[a++] = &in[k];
    }
    args[a++] = &n;
    unsigned int blocks = mk_cuda_blocks(n, MK_CUDA_BLOCK);
    if (blocks > 132u * 16u) blocks = 132u * 16u;
    cudaError_t st = cudaLaunchKernel((const void *)s->generated[l->index], dim3(blocks),
                                      dim3(MK_CUDA_BLOCK), args, 0, s->stream);
    if (st != cudaSuccess) return mk_cuda_fail_status(err, st, "launching a generated kernel",
                                                      __FILE__, __LINE__);
    return mk_cuda_check_launch(l, "generated pointwise", err);
}

/* A matrix–vector group's launch: its generated kernel, a warp per column pair. */
int mk_cuda_product(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    if (!s->generated || !s->generated[l->index])
        return MK_INTERNAL(err, "a matrix-vector group without its generated kernel");
    void *out = l->out.data, *in[MK_MAX_INPUTS];
    void *args[MK_MAX_INPUTS + 3];
    int a = 0, index = l->index;
    void *fault = s->fault;
    args[a++] = &out;
    for (int k = 0; k < l->n_in; k++) {
        in[k] = l->in[k].data;
        args[a++] = &in[k];
    }
    args[a++] = &fault;
    args[a++] = &index;
    unsigned int blocks = mk_cuda_blocks(product_warps(l->node->prod), 8);
    cudaError_t st = cudaLaunchKernel((const void *)s->generated[l->index], dim3(blocks), dim3(256),
                                      args, 0, s->stream);
    if (st != cudaSuccess) return mk_cuda_fail_status(err, st, "launching a generated kernel",
                                                      __FILE__, __LINE__);
    return mk_cuda_check_launch(l, "generated matrix-vector group", err);
}

int mk_cuda_generate_check(const mk_launch *l, int arch, mk_error **err) {
    if (!(l->node->pw && l->expr) && !l->node->prod) return MK_INTERNAL(err, "not a group's launch");
    mk_strbuf src = {0};
    if (l->node->prod) put_product_source(&src, l);
    else put_source(&src, l);
    if (!src.failed) dump(src.s, fnv1a(src.s), arch);
    int rc = src.failed ? mk_fail(err, MK_ERR_NOMEM, 0, 0, "writing a group's kernel")
                        : (compile(src.s, arch, l, NULL, err) ? 0 : -1);
    free(src.s);
    return rc;
}
