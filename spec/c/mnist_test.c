/*
 * mnist_test.c — an embedding host: uses nothing but core/moonkaas.h to compile
 * the MNIST MLP exactly as HamKaas's Python frontend prints it, with random
 * weights, and checks a batch against a double-precision reference.
 */
#include "moonkaas.h"
#include "test.h"
#include "mnist_script.h"


enum { B = 128, IN = 784, HID = 1000, OUT = 10 };

static float *random_floats(size_t n, double scale) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = (float)test_uniform(-scale, scale);
    return p;
}

static void test_mnist_mlp(void) {
    float *x = random_floats((size_t)B * IN, 1.0);
    float *w1 = random_floats((size_t)IN * HID, 1.0 / 28), *b1 = random_floats(HID, 0.5);
    float *w2 = random_floats((size_t)HID * OUT, 1.0 / 31), *b2 = random_floats(OUT, 0.5);
    float *y = malloc(sizeof(float) * B * OUT);
    double *h = malloc(sizeof(double) * HID);

    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_named_tensor constants[] = {
        {"constant_0", w1}, {"constant_1", b1}, {"constant_2", w2}, {"constant_3", b2}};
    mk_model *m = mk_compile(ctx, mnist, constants, 4, NULL, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (m) {
        mk_named_tensor inputs[] = {{"input", x}};
        /* twice: the second evaluation must not depend on leftovers of the first */
        for (int run = 0; run < 2; run++)
            CHECK(mk_evaluate(m, inputs, 1, y, sizeof(float) * B * OUT, &err) == 0, "%s",
                  mk_error_message(err));
        double worst = 0;
        for (int b = 0; b < B; b++) {
            for (int j = 0; j < HID; j++) {
                double s = b1[j];
                for (int k = 0; k < IN; k++) s += (double)x[b * IN + k] * w1[k * HID + j];
                h[j] = s > 0 ? s : 0;
            }
            for (int o = 0; o < OUT; o++) {
                double s = b2[o];
                for (int j = 0; j < HID; j++) s += h[j] * w2[j * OUT + o];
                double d = fabs(y[b * OUT + o] - s);
                if (d > worst) worst = d;
                CHECK(test_close(y[b * OUT + o], s, 1e-4, 1e-4), "y[%d][%d] = %g, want %g", b, o,
                      y[b * OUT + o], s);
            }
        }
        mk_stats st;
        mk_model_stats(m, &st);
        printf("# mnist: max abs error %.3g; arena %zu bytes, lower bound %zu (ratio %.3f), "
               "constants %zu, %d nodes, %d launches, compile %.2f ms (plan %.3f ms)\n",
               worst, st.arena_bytes, st.lower_bound_bytes,
               (double)st.arena_bytes / (double)st.lower_bound_bytes, st.constant_bytes, st.nodes,
               st.launches, st.compile_ms, st.plan_ms);
        /* 11 nodes; the bias add and the ReLU after it run as one pointwise group */
        CHECK(st.arena_bytes >= st.lower_bound_bytes && st.nodes == 10 && st.launches == 4 &&
                  st.pointwise_groups == 1,
              "stats");
    }
    mk_model_free(m);
    mk_context_free(ctx);
    mk_error_free(err);
    free(x), free(w1), free(b1), free(w2), free(b2), free(y), free(h);
}

int main(void) {
    test_srand(test_seed());
    RUN(test_mnist_mlp);
    return test_summary("mnist");
}
