/*
 * share_test.c — two models over one state through the C API (compile's
 * `share`): a prompt model writes rows of a named cache through a weight, a
 * step model writes one more and reads the whole cache, against the rows
 * computed here in double precision. The writer is freed first (the step model
 * keeps the memory), a buffer of the same name and another shape is refused
 * (the shared model still runs), and the weight, given the same data, is
 * copied to the device once.
 */
#include "moonkaas.h"
#include "test.h"

#include <stdbool.h>

enum { ROWS = 6, DIM = 4, PROMPT = 3 };

static mk_context *ctx;
static float w[DIM * DIM];

/* cache [ROWS, DIM]: rows [p, p + n) := x [n, DIM] @ w; the result: the cache, doubled */
static mk_model *cache_model(mk_device dev, int n, mk_model *share, mk_error **err) {
    char script[512];
    snprintf(script, sizeof script,
             "$1 = BufferTensor(float32, [%d, %d], cache);\n"
             "$2 = InputTensor(x, float32, [%d, %d]);\n"
             "$3 = ConstantTensor(w, float32, [%d, %d]);\n"
             "$4 = MatMulNode($2, $3);\n"
             "$5 = InputTensor(p, int64, [1]);\n"
             "$6 = InputTensor(e, int64, [1]);\n"
             "$7 = ReplaceSliceNode($1, $4, $5, $6);\n"
             "$8 = SumNode($7, $7);\n"
             "result = $8;\n",
             ROWS, DIM, n, DIM, DIM, DIM);
    mk_named_tensor constants[] = {{"w", w}};
    mk_compile_options opts = {.device = dev, .share = share};
    return mk_compile(ctx, script, constants, 1, &opts, err);
}

/* Runs rows [p, p + n) from x and checks the doubled cache against want (updated). */
static void put_rows(mk_model *m, int p, int n, const float *x, double *want) {
    int64_t begin = p, end = p + n;
    mk_named_tensor in[] = {{"x", x}, {"p", &begin}, {"e", &end}};
    float got[ROWS * DIM];
    mk_error *err = NULL;
    int rc = mk_evaluate(m, in, 3, got, sizeof got, &err);
    CHECK(rc == 0, "%s", mk_error_message(err));
    mk_error_free(err);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < DIM; j++) {
            double s = 0;
            for (int k = 0; k < DIM; k++) s += (double)x[r * DIM + k] * w[k * DIM + j];
            want[(p + r) * DIM + j] = s;
        }
    for (int i = 0; rc == 0 && i < ROWS * DIM; i++)
        CHECK(test_close(got[i], 2 * want[i], 1e-5, 1e-5), "cache[%d] = %g, want %g", i, got[i],
              2 * want[i]);
}

static void share_on(mk_device dev) {
    mk_error *err = NULL;
    mk_model *prompt = cache_model(dev, PROMPT, NULL, &err);
    CHECK(prompt != NULL, "%s", mk_error_message(err));
    mk_model *step = prompt ? cache_model(dev, 1, prompt, &err) : NULL;
    CHECK(step != NULL, "%s", mk_error_message(err));
    mk_error_free(err);
    if (!step) {
        mk_model_free(prompt);
        return;
    }
    mk_stats st;
    mk_model_stats(step, &st);
    /* the cache and the weight (copied once: the same host data, not borrowed) */
    CHECK(st.shared_bytes == ROWS * DIM * sizeof(float) + sizeof w && st.buffer_bytes == 0 &&
              st.constant_bytes == 0,
          "shared %zu, buffers %zu", st.shared_bytes, st.buffer_bytes);

    double want[ROWS * DIM] = {0};
    float x[PROMPT * DIM];
    for (int i = 0; i < PROMPT * DIM; i++) x[i] = (float)test_uniform(-1, 1);
    put_rows(prompt, 0, PROMPT, x, want);
    mk_model_free(prompt); /* the step model holds the cache */
    for (int p = PROMPT; p < ROWS; p++) {
        for (int i = 0; i < DIM; i++) x[i] = (float)test_uniform(-1, 1);
        put_rows(step, p, 1, x, want);
    }

    /* a buffer of the shared name and another shape: refused, the step model unchanged */
    mk_compile_options opts = {.device = dev, .share = step};
    mk_model *bad = mk_compile(ctx,
                               "$1 = BufferTensor(float32, [2, 2], cache);\n"
                               "$2 = SumNode($1, $1);\nresult = $2;\n",
                               NULL, 0, &opts, &err);
    CHECK(!bad && mk_error_code_of(err) == MK_ERR_INPUT &&
              strstr(mk_error_message(err), "share: buffer 'cache' is float32 [2, 2] here"),
          "%s", bad ? "compiled" : mk_error_message(err));
    mk_error_free(err);
    put_rows(step, ROWS - 1, 1, x, want);
    mk_model_free(step);
}

static void share_cpu(void) { share_on(MK_DEVICE_CPU); }
static void share_cuda(void) { share_on(MK_DEVICE_CUDA); }

int main(void) {
    test_srand(test_seed());
    if (!(ctx = test_context())) return 1;
    for (int i = 0; i < DIM * DIM; i++) w[i] = (float)test_uniform(-1, 1);
    char why[256];
    int cuda = mk_cuda_available(why, sizeof why);
    RUN(share_cpu);
    RUN_IF(cuda, share_cuda, why);
    mk_context_free(ctx);
    return test_summary("share");
}
