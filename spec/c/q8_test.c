/*
 * q8_test.c — the CPU's W8A8 kernels (core/cpu/q8.c) against loops written
 * from their definitions, with the AVX2 kernels and with the portable ones
 * (mk_cpu_q8_set_avx2), on random shapes from the printed seed:
 *   - mk_cpu_q8_grid: per group s = max |x| / 127 (float32), each value
 *     x / s (float32) rounded half away from zero, NaN 0, clamped to +-127,
 *     0 where s is 0: every value and scale exact;
 *   - mk_cpu_mv_columns_q8: runq.c's sum, val += (float)dot * ws * as group
 *     after group (exact), and within 1e-6 of the double-precision sum of
 *     |terms| of the product; any column range (quads short of columns),
 *     weights -128 to 127, scales held either way round, ldb past k.
 *   make build/tests/q8_test && ./build/tests/q8_test
 */
#include "test.h"

#include "cpu/cpu.h"

/* The grid value of x for scale s, from the definition. */
static int8_t grid_value(float x, float s) {
    if (s == 0.0f) return 0;
    float v = x / s;
    if (v != v) return 0;
    double r = v >= 0 ? floor((double)v + 0.5) : -floor(-(double)v + 0.5);
    return (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
}

/* A group of g values of a random kind: uniform at a random magnitude,
 * exact halves of a power-of-two scale, zeros, or with NaN / inf / tiny ones. */
static void fill_group(float *x, int64_t g) {
    int kind = (int)test_randint(0, 5);
    double mag = pow(10.0, test_uniform(-3, 2));
    for (int64_t e = 0; e < g; e++) x[e] = (float)(test_uniform(-1, 1) * mag);
    if (kind == 1) { /* s = 0.25 exactly; values n + 1/2 steps of it */
        for (int64_t e = 0; e < g; e++) x[e] = 0.25f * ((float)test_randint(-126, 125) + 0.5f);
        x[test_randint(0, g - 1)] = 127 * 0.25f;
    } else if (kind == 2) {
        memset(x, 0, sizeof(float) * (size_t)g);
        if (test_randint(0, 1)) x[test_randint(0, g - 1)] = -0.0f;
    } else if (kind == 3) {
        x[test_randint(0, g - 1)] = NAN;
    } else if (kind == 4) {
        x[test_randint(0, g - 1)] = test_randint(0, 1) ? INFINITY : -INFINITY;
    } else if (kind == 5) {
        for (int64_t e = 0; e < g; e++) x[e] = (float)(test_uniform(-1, 1) * 1e-40); /* subnormal */
    }
}

static void test_grid(void) {
    const int64_t gs[] = {8, 16, 32, 64, 96, 128, 256};
    for (int rep = 0; rep < 300; rep++) {
        int64_t g = gs[test_randint(0, 6)], groups = test_randint(1, 12), n = g * groups;
        float *x = malloc(sizeof(float) * (size_t)n), *as = malloc(sizeof(float) * (size_t)groups);
        int8_t *aq = malloc((size_t)n);
        for (int64_t t = 0; t < groups; t++) fill_group(x + t * g, g);
        for (int avx2 = 0; avx2 < 2; avx2++) {
            if (!mk_cpu_q8_set_avx2(avx2)) continue;
            mk_cpu_q8_grid(x, n, g, aq, as);
            for (int64_t t = 0; t < groups; t++) {
                float m = 0.0f;
                for (int64_t e = 0; e < g; e++)
                    if (fabsf(x[t * g + e]) > m) m = fabsf(x[t * g + e]);
                float s = m / 127.0f;
                CHECK(memcmp(&as[t], &s, sizeof s) == 0, "avx2 %d g %lld group %lld: scale %g, want %g",
                      avx2, (long long)g, (long long)t, (double)as[t], (double)s);
                for (int64_t e = t * g; e < (t + 1) * g; e++)
                    if (aq[e] != grid_value(x[e], s)) {
                        CHECK(0, "avx2 %d g %lld [%lld] = %.9g / %.9g: %d, want %d", avx2, (long long)g,
                              (long long)e, (double)x[e], (double)s, aq[e], grid_value(x[e], s));
                        break;
                    }
            }
        }
        free(x), free(as), free(aq);
    }
    mk_cpu_q8_set_avx2(true);
}

static void test_w8a8(void) {
    const int64_t gs[] = {16, 32, 64, 128};
    for (int rep = 0; rep < 200; rep++) {
        int64_t g = gs[test_randint(0, 3)], groups = test_randint(1, 12), k = g * groups;
        int64_t n = test_randint(1, 70), pad = test_randint(0, 1) * test_randint(1, 40);
        int64_t ldb = k + pad;
        bool by_groups = test_randint(0, 1); /* scales [n, k / g] or [k / g, n] */
        int8_t *w = malloc((size_t)(n * ldb)), *aq = malloc((size_t)k);
        float *sc = malloc(sizeof(float) * (size_t)(n * groups)), *as = malloc(sizeof(float) * (size_t)groups);
        float *c[2] = {malloc(sizeof(float) * (size_t)n), malloc(sizeof(float) * (size_t)n)};
        for (int64_t i = 0; i < n * ldb; i++) w[i] = (int8_t)test_randint(-128, 127);
        for (int64_t i = 0; i < k; i++) aq[i] = (int8_t)test_randint(-127, 127);
        for (int64_t i = 0; i < n * groups; i++) sc[i] = (float)test_uniform(1e-4, 1e-2);
        for (int64_t i = 0; i < groups; i++) as[i] = (float)test_uniform(1e-3, 1e-1);
        cpu_weights cw = {.data = w, .dtype = MK_DTYPE_INT8, .ldb = ldb, .scale = sc, .group = g,
                          .ss_k = by_groups ? 1 : n, .ss_n = by_groups ? groups : 1};
        int64_t j0 = test_randint(0, n - 1), j1 = test_randint(j0 + 1, n);
        for (int avx2 = 0; avx2 < 2; avx2++) {
            if (!mk_cpu_q8_set_avx2(avx2)) continue;
            memset(c[avx2], 0xff, sizeof(float) * (size_t)n);
            mk_cpu_mv_columns_q8(aq, as, &cw, k, j0, j1, c[avx2]);
            for (int64_t j = j0; j < j1; j++) {
                float val = 0.0f; /* runq.c's matmul */
                double want = 0.0, mag = 0.0;
                for (int64_t gi = 0; gi < groups; gi++) {
                    int32_t dot = 0;
                    double d = 0.0;
                    for (int64_t e = gi * g; e < (gi + 1) * g; e++) {
                        dot += (int32_t)aq[e] * w[j * ldb + e];
                        d += (double)aq[e] * w[j * ldb + e];
                    }
                    float ws = sc[j * cw.ss_n + gi * cw.ss_k];
                    val += (float)dot * ws * as[gi];
                    want += d * ws * as[gi];
                    for (int64_t e = gi * g; e < (gi + 1) * g; e++)
                        mag += fabs((double)aq[e] * w[j * ldb + e] * ws * as[gi]);
                }
                float got = c[avx2][j - j0];
                if (memcmp(&got, &val, sizeof val) || fabs(got - want) > 1e-6 * mag) {
                    CHECK(0, "avx2 %d k %lld g %lld n %lld [%lld, %lld) column %lld: %.9g, runq.c's %.9g, "
                          "double %.9g", avx2, (long long)k, (long long)g, (long long)n, (long long)j0,
                          (long long)j1, (long long)j, (double)got, (double)val, want);
                    break;
                }
            }
            if (j1 - j0 < n) CHECK(isnan(c[avx2][j1 - j0]), "wrote past column %lld", (long long)j1);
        }
        free(w), free(aq), free(sc), free(as), free(c[0]), free(c[1]);
    }
    mk_cpu_q8_set_avx2(true);
}

int main(void) {
    test_srand(test_seed());
    printf("# AVX2 kernels: %s\n", mk_cpu_q8_avx2() ? "yes" : "no (portable only)");
    RUN(test_grid);
    RUN(test_w8a8);
    return test_summary("q8_test");
}
