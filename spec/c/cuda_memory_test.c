/*
 * cuda_memory_test.c — max_bytes bounds all the device memory a compile
 * takes: the arena (with each launch's device scratch and state), constants,
 * buffers and what the device allocates for the model itself
 * (mk_stats.device_bytes: cuBLAS's workspace, the fault record, the step
 * loop's words).
 *
 * For each model: compile it once without a limit (the context, cuBLAS and the
 * generated kernels are then loaded for the process), read what it needs from
 * its stats, and compile it again with exactly that as max_bytes, measuring
 * the free device memory before and after (the driver's cuMemGetInfo, opened
 * with dlopen: the test links no CUDA library). The second compile must fit,
 * take no more than it said beyond a slack for what no one can bound (the
 * stream, the cuBLAS handle, the instantiated graph; allocation granularity),
 * and one byte less must fail before anything is allocated. The models: a
 * matrix product (cuBLAS's 32 MiB workspace, which compiles took outside
 * max_bytes before), matrix-vector groups with an ArgMax (device state per
 * launch), decode attention with KV caches and next lines (state, the step
 * loop), and a row replacement that reads x's own rows (device scratch).
 *
 * On the CPU (here, without a GPU) the same models check that the stats add
 * up to what max_bytes allows: device_bytes is 0, one byte less fails.
 *
 *   make build/tests/cuda_memory_test && ./build/tests/cuda_memory_test
 *   MK_SEED=...   replay a run
 */
#include "moonkaas.h"
#include "test.h"

#include <dlfcn.h>

static mk_context *ctx;
static int (*mem_get_info)(size_t *free_b, size_t *total_b); /* cuMemGetInfo_v2 */

/* Slack: what a compile takes that max_bytes cannot count (a stream, a cuBLAS
 * handle, the instantiated graph) and the driver's rounding of each of its
 * allocations to 2 MiB pages. Well under the 32 MiB workspace. */
#define SLACK ((size_t)12 << 20)

static const char *matmul_script =
    "$1 = InputTensor(x, float32, [96, 80]);\n"
    "$2 = ConstantTensor(w, float32, [80, 112]);\n"
    "$3 = MatMulNode($1, $2);\n"
    "$4 = ReLUNode($3);\n"
    "result = $4;\n";

static const char *argmax_script =
    "$1 = InputTensor(x, float32, [1, 256]);\n"
    "$2 = ConstantTensor(w, float32, [512, 256]);\n"
    "$3 = PermuteNode($2, [1, 0]);\n"
    "$4 = MatMulNode($1, $3);\n"
    "$5 = ArgMaxNode($4);\n"
    "result = $5;\n";

/* decode attention over KV caches of 8 rows, 4 heads of 16, fed back (next) */
static const char *attention_script =
    "$1 = InputTensor(x, float32, [1, 64]);\n"
    "$2 = InputTensor(pos, int64, [1]);\n"
    "$3 = ConstantTensor(one, int64, [1]);\n"
    "$4 = BufferTensor(float32, [8, 64]);\n"
    "$5 = BufferTensor(float32, [8, 64]);\n"
    "$6 = SumNode($2, $3);\n"
    "$7 = ReplaceSliceNode($4, $1, $2, $6);\n"
    "$8 = ReplaceSliceNode($5, $1, $2, $6);\n"
    "$9 = ReshapeNode($1, [4, 1, 16]);\n"
    "$10 = ReshapeNode($7, [8, 4, 16]);\n"
    "$11 = PermuteNode($10, [1, 2, 0]);\n"
    "$12 = MatMulNode($9, $11);\n"
    "$13 = SlicedSoftmaxNode($12, $6);\n"
    "$14 = ReshapeNode($8, [8, 4, 16]);\n"
    "$15 = PermuteNode($14, [1, 0, 2]);\n"
    "$16 = PrefixMatMulNode($13, $15, $6);\n"
    "$17 = ReshapeNode($16, [1, 64]);\n"
    "result = $17;\n"
    "next x = $17;\n"
    "next pos = pos + 1;\n";

/* rows [b, e) of x replaced by x's own first two rows */
static const char *aside_script =
    "$1 = InputTensor(x, float32, [6, 32]);\n"
    "$2 = InputTensor(b, int64, [1]);\n"
    "$3 = InputTensor(e, int64, [1]);\n"
    "$4 = SliceNode($1, 0, 2);\n"
    "$5 = ReplaceSliceNode($1, $4, $2, $3);\n"
    "result = $5;\n";

static float w_data[512 * 256];
static int64_t one = 1;

static mk_model *compile_with(mk_device dev, const char *script, size_t max_bytes,
                              mk_error **err) {
    mk_named_tensor k[] = {{"w", w_data}, {"one", &one}};
    bool has_one = strstr(script, "ConstantTensor(one") != NULL;
    bool has_w = strstr(script, "ConstantTensor(w") != NULL;
    mk_compile_options o = {.device = dev, .max_bytes = max_bytes};
    return mk_compile(ctx, script, has_w ? k : k + 1, (size_t)has_w + has_one, &o, err);
}

/* What cuBLAS keeps for a handle of its own (66 MiB on an H100 with CUDA
 * 13), measured here with cuBLAS itself: a model with a cuBLAS product makes
 * one, and max_bytes does not count it (doc/devices.md). Called once a
 * compile has made the device's context current. */
static size_t blas_handle_bytes(void) {
    static const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    int (*create)(void **), (*destroy)(void *);
    *(void **)&create = lib ? dlsym(lib, "cublasCreate_v2") : NULL;
    *(void **)&destroy = lib ? dlsym(lib, "cublasDestroy_v2") : NULL;
    size_t free0 = 0, free1 = 0, total = 0;
    void *h = NULL;
    if (!create || !destroy || !mem_get_info || mem_get_info(&free0, &total) ||
        create(&h) || mem_get_info(&free1, &total)) {
        printf("# cuBLAS's handle: not measured\n");
        return 0;
    }
    destroy(h);
    size_t bytes = free0 > free1 ? free0 - free1 : 0;
    printf("# cuBLAS's handle: %zu bytes\n", bytes);
    return bytes;
}

static void check_model(mk_device dev, const char *label, const char *script, bool blas) {
    mk_error *err = NULL;
    mk_model *m = compile_with(dev, script, 0, &err);
    CHECK(m, "%s: compile: %s", label, mk_error_message(err));
    if (!m) {
        mk_error_free(err);
        return;
    }
    mk_stats s;
    mk_model_stats(m, &s);
    mk_model_free(m);
    size_t need = s.arena_bytes + s.constant_bytes + s.buffer_bytes + s.device_bytes;
    printf("# %s on %s: arena %zu, constants %zu, buffers %zu, device %zu: %zu bytes\n", label,
           dev == MK_DEVICE_CUDA ? "cuda" : "cpu", s.arena_bytes, s.constant_bytes,
           s.buffer_bytes, s.device_bytes, need);
    if (dev == MK_DEVICE_CPU) CHECK(s.device_bytes == 0, "%s: the CPU's own %zu", label, s.device_bytes);

    m = compile_with(dev, script, need - 1, &err); /* one byte short */
    CHECK(!m && err && mk_error_code_of(err) == MK_ERR_NOMEM &&
              strstr(mk_error_message(err), "more than max_bytes"),
          "%s: max_bytes %zu: %s", label, need - 1, m ? "compiled" : mk_error_message(err));
    mk_model_free(m);
    mk_error_free(err);
    err = NULL;

    size_t handle = dev == MK_DEVICE_CUDA && blas ? blas_handle_bytes() : 0;
    size_t free0 = 0, free1 = 0, total = 0;
    if (mem_get_info) mem_get_info(&free0, &total);
    m = compile_with(dev, script, need, &err);
    if (mem_get_info) mem_get_info(&free1, &total);
    CHECK(m, "%s: max_bytes %zu: %s", label, need, mk_error_message(err));
    if (mem_get_info && m) {
        size_t taken = free0 > free1 ? free0 - free1 : 0;
        printf("# %s: the compile took %zu bytes of device memory, max_bytes %zu\n", label,
               taken, need);
        CHECK(taken <= need + handle + SLACK,
              "%s: the compile took %zu bytes, max_bytes %zu (+ cuBLAS's handle %zu + slack %zu)",
              label, taken, need, handle, (size_t)SLACK);
    }
    mk_model_free(m);
    mk_error_free(err);
}

static mk_device dev;

static void test_matmul(void) { check_model(dev, "matrix product", matmul_script, true); }
static void test_argmax_group(void) {
    check_model(dev, "matrix-vector ArgMax", argmax_script, false);
}
static void test_attention(void) { check_model(dev, "decode attention", attention_script, false); }
static void test_aside(void) { check_model(dev, "replace from x's own rows", aside_script, false); }

int main(void) {
    test_srand(test_seed());
    for (size_t i = 0; i < sizeof w_data / sizeof w_data[0]; i++)
        w_data[i] = (float)test_uniform(-1, 1);
    if (!(ctx = test_context())) return 1;
    char why[256];
    bool cuda = mk_cuda_available(why, sizeof why);
    printf("# CUDA: %s\n", cuda ? why : "not available");
    dev = MK_DEVICE_CPU;
    RUN(test_matmul);
    RUN(test_argmax_group);
    RUN(test_attention);
    RUN(test_aside);
    if (cuda) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib) *(void **)&mem_get_info = dlsym(lib, "cuMemGetInfo_v2");
        printf("# cuMemGetInfo: %s\n", mem_get_info ? "found" : "not found: sizes only");
    }
    dev = MK_DEVICE_CUDA;
    RUN_IF(cuda, test_matmul, why);
    RUN_IF(cuda, test_argmax_group, why);
    RUN_IF(cuda, test_attention, why);
    RUN_IF(cuda, test_aside, why);
    mk_context_free(ctx);
    return test_summary("cuda_memory_test");
}
