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
    if (st == cudaSuccess) st = cudaLibraryGetKernel(&kernel, *lib, "mk_pointwise");
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
    put_source(&src, l);
    if (src.failed) {
        free(src.s);
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "writing a pointwise group's kernel");
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
        if (!l->node->pw) continue;
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

int mk_cuda_generate_check(const mk_launch *l, int arch, mk_error **err) {
    if (!l->node->pw || !l->expr) return MK_INTERNAL(err, "not a pointwise group's launch");
    mk_strbuf src = {0};
    put_source(&src, l);
    int rc = src.failed ? mk_fail(err, MK_ERR_NOMEM, 0, 0, "writing a pointwise group's kernel")
                        : (compile(src.s, arch, l, NULL, err) ? 0 : -1);
    free(src.s);
    return rc;
}
