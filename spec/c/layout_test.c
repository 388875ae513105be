/*
 * layout_test.c — how a constant is laid out on the device is a decision the
 * passes record on its node (mk_node.upload), which model.c carries out when
 * it uploads it, rather than a guess from strides.
 *
 * An MLP's [in, out] float32 weight read only as a matrix–vector product's B:
 * on a target whose groups read weights by columns only (CUDA's), the
 * matrix-vector pass holds it by columns (strides (1, k), MK_UPLOAD_BY_COLUMNS);
 * on one that reads rows too (the CPU's), it stays as given; a weight that
 * something else reads too stays as given on both. On the CPU the compiled
 * model then equals a double-precision reference (random weights from the
 * printed seed); on a GPU product_test and gpu_spec check the CUDA upload.
 *
 *   make build/tests/layout_test && ./build/tests/layout_test
 */
#include "passes.h"
#include "test.h"

enum { K = 24, N = 10 };

static const char *mlp = "$1 = InputTensor(x, float32, [1, 24]);\n"
                         "$2 = ConstantTensor(w, float32, [24, 10]);\n"
                         "$3 = MatMulNode($1, $2);\n"
                         "$4 = SiLUNode($3);\n"
                         "result = $4;\n";

/* the weight is an output too: nothing may change how it is held */
static const char *shown = "$1 = InputTensor(x, float32, [1, 24]);\n"
                           "$2 = ConstantTensor(w, float32, [24, 10]);\n"
                           "$3 = MatMulNode($1, $2);\n"
                           "result = $3, $2;\n";

/* The weight's node after the passes for target t. */
static void decision(const char *script, bool row_products, mk_upload *upload, int64_t *stride) {
    mk_error *err = NULL;
    mk_graph *g = mk_graph_parse(script, &err);
    CHECK(g, "parse: %s", mk_error_message(err));
    if (!g) return;
    mk_compile_options o = {0};
    mk_target t = {.pointwise_operands = MK_X_IN, .int8_products = 0, .matvec_rows = 4,
                   .row_products = row_products};
    int rc = mk_passes_run(g, &o, &t, &err);
    CHECK(rc == 0, "passes: %s", mk_error_message(err));
    const mk_node *w = mk_graph_find_name(g, "w");
    CHECK(w, "the weight left the graph");
    if (w) {
        *upload = w->upload;
        stride[0] = w->stride[0];
        stride[1] = w->stride[1];
    }
    mk_graph_free(g);
    mk_error_free(err);
}

static void test_recorded(void) {
    mk_upload u = MK_UPLOAD_AS_GIVEN;
    int64_t s[2] = {0, 0};
    decision(mlp, false, &u, s);
    CHECK(u == MK_UPLOAD_BY_COLUMNS && s[0] == 1 && s[1] == K,
          "columns-only target: upload %d, strides (%lld, %lld)", (int)u, (long long)s[0],
          (long long)s[1]);
    decision(mlp, true, &u, s);
    CHECK(u == MK_UPLOAD_AS_GIVEN && s[0] == N && s[1] == 1,
          "rows-too target: upload %d, strides (%lld, %lld)", (int)u, (long long)s[0],
          (long long)s[1]);
    decision(shown, false, &u, s);
    CHECK(u == MK_UPLOAD_AS_GIVEN && s[0] == N && s[1] == 1,
          "an output weight: upload %d, strides (%lld, %lld)", (int)u, (long long)s[0],
          (long long)s[1]);
}

/* The CPU model against a reference: silu(x @ w) in double precision. */
static void test_values(void) {
    static float x[K], w[K * N], y[N];
    for (int i = 0; i < K; i++) x[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < K * N; i++) w[i] = (float)test_uniform(-1, 1);
    mk_error *err = NULL;
    mk_context *ctx = test_context();
    if (!ctx) return;
    mk_named_tensor k[] = {{"w", w}}, in[] = {{"x", x}};
    mk_model *m = mk_compile(ctx, mlp, k, 1, NULL, &err);
    CHECK(m && mk_evaluate(m, in, 1, y, sizeof y, &err) == 0, "%s", mk_error_message(err));
    for (int j = 0; m && j < N; j++) {
        double s = 0;
        for (int i = 0; i < K; i++) s += (double)x[i] * w[i * N + j];
        double want = s / (1 + exp(-s));
        CHECK(test_close(y[j], want, 1e-5, 1e-5), "y[%d] = %.9g, want %.9g", j, y[j], want);
    }
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

int main(void) {
    test_srand(test_seed());
    RUN(test_recorded);
    RUN(test_values);
    return test_summary("layout_test");
}
