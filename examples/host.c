/*
 * host.c — a tour of the C API (core/moonkaas.h): a context, a script with a
 * constant, compile, introspection, evaluation checked against plain C, an
 * error as a value, a recurrence run in one call, and the log function.
 *
 *     make examples && build/examples/host
 *     cc examples/host.c $(pkg-config --cflags --libs moonkaas) -o host   (installed)
 *
 * It links libmoonkaas.a only: no Lua. Exits non-zero if a result is wrong.
 */
#include "moonkaas.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static void on_log(void *user, mk_log_level level, const char *message) {
    (void)user;
    printf("  log (%s): %s\n", level == MK_LOG_WARNING ? "warning" : "info", message);
}

static int fail(const char *what, mk_error *err) {
    printf("host: %s: %s\n", what, err ? mk_error_message(err) : "wrong result");
    mk_error_free(err);
    return 1;
}

int main(void) {
    printf("moonkaas %s: %s\n", mk_version(), mk_build_info());
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    if (!ctx) return fail("context", err);
    mk_context_set_log(ctx, on_log, NULL);

    /* y = relu(x @ w): x [2, 3] fed each run, w [3, 4] given at compile time. */
    const char *script = "$1 = InputTensor(x, float32, [2, 3]);\n"
                         "$2 = ConstantTensor(w, float32, [3, 4]);\n"
                         "$3 = MatMulNode($1, $2);\n"
                         "$4 = ReLUNode($3);\n"
                         "result = $4;\n";
    float w[12], x[6], y[8];
    srand(7);
    for (int i = 0; i < 12; i++) w[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int i = 0; i < 6; i++) x[i] = (float)rand() / RAND_MAX * 2 - 1;
    mk_named_tensor constants[] = {{"w", w}};
    mk_model *m = mk_compile(ctx, script, constants, 1, NULL, &err); /* NULL: CPU defaults */
    if (!m) return fail("compile", err);

    mk_tensor_info in;
    mk_model_input_info(m, 0, &in);
    mk_stats st;
    mk_model_stats(m, &st);
    printf("input '%s' rank %d [%lld, %lld]; %d nodes, %d launches, arena %zu bytes\n", in.name,
           in.rank, (long long)in.shape[0], (long long)in.shape[1], st.nodes, st.launches,
           st.arena_bytes);

    mk_named_tensor inputs[] = {{"x", x}};
    if (mk_evaluate(m, inputs, 1, y, sizeof y, &err) != 0) return fail("evaluate", err);
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 4; j++) {
            double s = 0;
            for (int k = 0; k < 3; k++) s += (double)x[i * 3 + k] * w[k * 4 + j];
            s = s > 0 ? s : 0;
            if (fabs(y[i * 4 + j] - s) > 1e-5 + 1e-5 * fabs(s)) return fail("evaluate", NULL);
        }
    }
    printf("y = relu(x @ w): row 1 %.4f %.4f %.4f %.4f (checked)\n", y[0], y[1], y[2], y[3]);

    /* Errors are values: a wrong output size, then a script that does not parse.
     * The context stays usable after each. */
    if (mk_evaluate(m, inputs, 1, y, 4, &err) == 0) return fail("a short output was accepted", NULL);
    printf("error, as expected: %s\n", mk_error_message(err));
    mk_error_free(err), err = NULL;
    if (mk_compile(ctx, "$1 = ReLUNode(;\n", NULL, 0, NULL, &err)) return fail("bad script", NULL);
    printf("error at line %d, column %d: %s\n", mk_error_line(err), mk_error_column(err),
           mk_error_message(err));
    mk_error_free(err), err = NULL;
    mk_model_free(m);

    /* A recurrence: h <- h * 0.5 + 1 for 8 steps in one call (h -> 2). */
    const char *steps = "$1 = InputTensor(h, float32, [1]);\n"
                        "$2 = ConstantTensor(half, float32, [1]);\n"
                        "$3 = ConstantTensor(one, float32, [1]);\n"
                        "$4 = HadamardProductNode($1, $2);\n"
                        "$5 = SumNode($4, $3);\n"
                        "result = $5;\n"
                        "next h = $5;\n";
    float half = 0.5f, one = 1.0f, h0 = 0.0f, hs[8];
    mk_named_tensor c2[] = {{"half", &half}, {"one", &one}};
    mk_model *r = mk_compile(ctx, steps, c2, 2, NULL, &err);
    if (!r) return fail("compile steps", err);
    mk_named_tensor start[] = {{"h", &h0}};
    mk_buffer outs[] = {{hs, sizeof hs}};
    int64_t n = mk_model_run_steps(r, 8, start, 1, outs, 1, NULL, &err);
    if (n != 8) return fail("run_steps", err);
    double want = 0;
    for (int s = 0; s < 8; s++) {
        want = want * 0.5 + 1;
        if (fabs(hs[s] - want) > 1e-6) return fail("run_steps", NULL);
    }
    printf("8 steps in one call: h = %.6f ... %.6f (checked)\n", hs[0], hs[7]);
    mk_model_free(r);
    mk_context_free(ctx);
    printf("host: ok\n");
    return 0;
}
