/*
 * codegen_test.c — the CUDA kernels the plugin writes for pointwise groups
 * compile with NVRTC, on any machine with the plugin: NVRTC needs no GPU, so
 * CI (which has none) checks the generator too. Each graph is compiled on the
 * CPU (the grouping pass is the same for both devices) and every group's CUDA
 * source is written and compiled for sm_90 and sm_80 (internal.h's
 * mk_model_check_generated). On a GPU, spec/group_spec.lua runs them.
 *
 *   test_random_groups   random pointwise trees: every op with an expression,
 *                        float32 and int64, 1 to 4 operands, broadcasts, a
 *                        strided (permuted) operand read through a copy
 *
 * Without the plugin (CUDA=0, or none found) the test is skipped with the reason.
 */
#include "internal.h"
#include "test.h"

static const char *const float_unary[] = {"ReLUNode", "SiLUNode", "ExpNode", "TanhNode",
                                          "SigmoidNode", "GELUNode"};
static const char *const float_binary[] = {"SumNode", "SubNode", "HadamardProductNode", "DivNode"};
static const char *const int_unary[] = {"ReLUNode"};
static const char *const int_binary[] = {"SumNode", "SubNode", "HadamardProductNode"};

#define PICK(a) (a)[test_randint(0, (int64_t)(sizeof(a) / sizeof((a)[0])) - 1)]

/* A random tree of pointwise nodes over up to four inputs of shape [R, C] (some
 * [1, C] or [R, 1]: broadcast); each node is read once, so the whole tree is
 * one group. */
static void random_script(char *s, size_t size, bool f32) {
    const char *dt = f32 ? "float32" : "int64";
    int R = (int)test_randint(1, 40), C = (int)test_randint(1, 70);
    int n = 0, at = 0, top[8], depth = 0;
    int inputs = (int)test_randint(1, 4);
    for (int k = 0; k < inputs; k++) {
        int kind = k == 0 ? 0 : (int)test_randint(0, 2);
        at += snprintf(s + at, size - (size_t)at, "$%d = InputTensor(x%d, %s, [%d, %d]);\n", ++n,
                       k, dt, kind == 1 ? 1 : R, kind == 2 ? 1 : C);
    }
    top[depth++] = 1;
    int next_input = 2;
    int ops = (int)test_randint(2, 7);
    for (int i = 0; i < ops; i++) {
        int a = top[--depth];
        if (next_input <= inputs || test_randint(0, 1)) {
            int b = next_input <= inputs ? next_input++ : a;
            if (b == a) { /* a node may be read once: a fresh copy of x0 instead */
                at += snprintf(s + at, size - (size_t)at, "$%d = %s($1);\n", ++n,
                               f32 ? PICK(float_unary) : PICK(int_unary));
                b = n;
            }
            at += snprintf(s + at, size - (size_t)at, "$%d = %s($%d, $%d);\n", ++n,
                           f32 ? PICK(float_binary) : PICK(int_binary), a, b);
        } else {
            at += snprintf(s + at, size - (size_t)at, "$%d = %s($%d);\n", ++n,
                           f32 ? PICK(float_unary) : PICK(int_unary), a);
        }
        top[depth++] = n;
    }
    snprintf(s + at, size - (size_t)at, "result = $%d;\n", top[depth - 1]);
}

static void test_random_groups(void) {
    test_srand(test_seed());
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    CHECK(ctx != NULL, "context: %s", mk_error_message(err));
    /* under valgrind (MK_VALGRIND) a few graphs: NVRTC is slow there */
    int graphs = getenv("MK_VALGRIND") ? 3 : 60, groups = 0;
    for (int g = 0; ctx && g < graphs; g++) {
        char script[4096];
        random_script(script, sizeof script, g % 3 != 2);
        mk_model *m = mk_compile(ctx, script, NULL, 0, NULL, &err);
        CHECK(m != NULL, "compile: %s\n%s", mk_error_message(err), script);
        if (!m) break;
        for (int arch = 80; arch <= 90; arch += 10) {
            int checked = mk_model_check_generated(m, arch, &err);
            CHECK(checked >= 0, "sm_%d: %s\n%s", arch, mk_error_message(err), script);
            if (checked < 0) break;
            groups += checked;
        }
        mk_model_free(m);
        if (err) break;
    }
    printf("#   %d group kernels compiled with NVRTC\n", groups);
    CHECK(groups > graphs, "only %d groups in %d graphs", groups, graphs);
    mk_error_free(err);
    mk_context_free(ctx);
}

int main(void) {
    char why[512];
    if (!mk_cuda_plugin_get(why, sizeof why)) {
        SKIP(test_random_groups, why);
    } else {
        RUN(test_random_groups);
    }
    return test_summary("codegen");
}
