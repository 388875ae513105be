/*
 * frames_test.c — mk_compile_options.threads through the C API: a model of
 * one matrix–vector group (x [1, 512] @ w [512, 512] + b, ReLU) compiled with
 * threads 0 (the default), 1, 2 and 5 gives the same output bit for bit, and
 * that output matches the product computed here in double precision; the
 * compile's log says threads = 1 opened no parallel region; a negative count
 * is an MK_ERR_ARGUMENT error that leaves the context usable. MK_CPU_FORK is
 * set to "always" before the first compile, so that the default's launch
 * forks on any machine with two CPUs or more.
 */
#include "moonkaas.h"
#include "test.h"

#include <stdbool.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

enum { K = 512, N = 512 };

static mk_context *ctx;
static float x[K], w[K * N], b[N];
static double want[N];
static char last_log[1024];

static void on_log(void *user, mk_log_level level, const char *message) {
    (void)user, (void)level;
    if (!strncmp(message, "cpu: ", 5)) snprintf(last_log, sizeof last_log, "%s", message);
}

static const char *SCRIPT = "$1 = InputTensor(x, float32, [1, 512]);\n"
                            "$2 = ConstantTensor(w, float32, [512, 512]);\n"
                            "$3 = MatMulNode($1, $2);\n"
                            "$4 = ConstantTensor(b, float32, [1, 512]);\n"
                            "$5 = SumNode($3, $4);\n"
                            "$6 = ReLUNode($5);\n"
                            "result = $6;\n";

static int cpus(void) {
#ifdef _OPENMP
    int t = omp_get_max_threads();
#else
    int t = 1;
#endif
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 && online < t ? (int)online : t;
}

/* Compiles with `threads` and runs x into out (its log line in last_log);
 * false on a failure. */
static bool run_with(int threads, float *out) {
    mk_named_tensor constants[] = {{"w", w}, {"b", b}};
    mk_compile_options opts = {.threads = threads};
    mk_error *err = NULL;
    last_log[0] = '\0';
    mk_model *m = mk_compile(ctx, SCRIPT, constants, 2, &opts, &err);
    CHECK(m, "threads = %d: %s", threads, mk_error_message(err));
    mk_error_free(err);
    if (!m) return false;
    mk_named_tensor in[] = {{"x", x}};
    int rc = mk_evaluate(m, in, 1, out, N * sizeof *out, &err);
    CHECK(rc == 0, "threads = %d: %s", threads, mk_error_message(err));
    mk_error_free(err);
    mk_model_free(m);
    return rc == 0;
}

static void same_results_whatever_the_count(void) {
    static float got[4][N];
    const int counts[4] = {0, 1, 2, 5};
    for (int c = 0; c < 4; c++) {
        if (!run_with(counts[c], got[c])) return;
        if (counts[c] == 0 && cpus() > 1) {
            int forks = 0, of = 0, threads = 0;
            CHECK(sscanf(last_log, "cpu: %d of %d launches may use %d threads", &forks, &of,
                         &threads) == 3 && forks > 0 && threads >= 2,
                  "the default's log: %s", last_log);
        }
        if (counts[c] == 1)
            CHECK(strstr(last_log, "cpu: 0 of ") && strstr(last_log, "threads = 1: no parallel"),
                  "threads = 1's log: %s", last_log);
        if (counts[c] == 2 && cpus() > 1)
            CHECK(strstr(last_log, "may use 2 threads"), "threads = 2's log: %s", last_log);
    }
    for (int c = 1; c < 4; c++)
        CHECK(!memcmp(got[0], got[c], sizeof got[0]), "threads = %d differs from the default",
              counts[c]);
    for (int j = 0; j < N; j++)
        CHECK(test_close(got[0][j], want[j], 1e-5, 1e-5), "out[%d] = %g, want %g", j, got[0][j],
              want[j]);
}

static void negative_threads_is_an_argument_error(void) {
    mk_named_tensor constants[] = {{"w", w}, {"b", b}};
    mk_compile_options opts = {.threads = -1};
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, SCRIPT, constants, 2, &opts, &err);
    CHECK(!m && mk_error_code_of(err) == MK_ERR_ARGUMENT &&
              strstr(mk_error_message(err), "threads must be 0 (the default) or a positive"),
          "%s", err ? mk_error_message(err) : "compiled");
    mk_error_free(err);
    mk_model_free(m);
    float out[N];
    CHECK(run_with(1, out), "the context is usable after the error");
}

int main(void) {
    setenv("MK_CPU_FORK", "always", 1);
    test_srand(test_seed());
    for (int i = 0; i < K; i++) x[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < K * N; i++) w[i] = (float)test_uniform(-1, 1) / 16;
    for (int j = 0; j < N; j++) b[j] = (float)test_uniform(-0.5, 0.5);
    for (int j = 0; j < N; j++) {
        double s = b[j];
        for (int k = 0; k < K; k++) s += (double)x[k] * w[k * N + j];
        want[j] = s > 0 ? s : 0;
    }
    mk_error *err = NULL;
    ctx = mk_context_new(&err);
    if (!ctx) {
        printf("# %s\n", mk_error_message(err));
        return 1;
    }
    mk_context_set_log(ctx, on_log, NULL);
    RUN(same_results_whatever_the_count);
    RUN(negative_threads_is_an_argument_error);
    mk_context_free(ctx);
    return test_summary("frames_test");
}
