/*
 * bench_q8_products.c — one decoding step's int8 matrix–vector products of a
 * llama2 shape on one thread, timed alone: the CPU's float32-activation path
 * (mk_cpu_mv_columns, -q q8) and its W8A8 path (mk_cpu_q8_grid, then
 * mk_cpu_mv_columns_q8, -q q8a8), over weights laid out as llama2 holds them
 * (every layer's seven, then the classifier), so they stream from the last
 * level cache (stories15M, 17 MB) or memory (stories110M, 117 MB). Prints the
 * fastest of the repeats (the machine is shared). Build it against a build's
 * static library (-DBENCH_SCALAR_GRID for one older than core/cpu/q8.c) and
 * run it beside another build's:
 *   cc -O2 -march=native -fopenmp -Icore -o /tmp/bq8 scripts/bench_q8_products.c \
 *       build/libmoonkaas.a -lm -ldl -pthread -lprotobuf-c
 *   /tmp/bq8 15M; /tmp/bq8 110M
 */
#include "cpu/cpu.h"
#include "cpu/vec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct {
    int64_t k, n;
    int8_t *w;  /* [n, k] */
    float *sc;  /* [n, k / g] */
} bench_mat;

int main(int argc, char **argv) {
    bool big = argc > 1 && !strcmp(argv[1], "110M");
    int64_t D = big ? 768 : 288, H = big ? 2048 : 768, L = big ? 12 : 6, g = big ? 64 : 32, V = 32000;
    int64_t nm = L * 7 + 1, c0 = 0;
    bench_mat *ms = malloc(sizeof *ms * (size_t)nm);
    for (int64_t l = 0; l < L; l++) {
        int64_t kn[7][2] = {{D, D}, {D, D}, {D, D}, {D, D}, {D, H}, {D, H}, {H, D}};
        for (int t = 0; t < 7; t++) ms[c0++] = (bench_mat){kn[t][0], kn[t][1], NULL, NULL};
    }
    ms[c0++] = (bench_mat){D, V, NULL, NULL};
    srand(1);
    for (int64_t i = 0; i < nm; i++) {
        int64_t k = ms[i].k, n = ms[i].n;
        ms[i].w = malloc((size_t)(n * k));
        ms[i].sc = malloc(sizeof(float) * (size_t)(n * k / g));
        for (int64_t e = 0; e < n * k; e++) ms[i].w[e] = (int8_t)(rand() % 255 - 127);
        for (int64_t e = 0; e < n * k / g; e++) ms[i].sc[e] = 0.001f * (float)(1 + rand() % 100);
    }
    float *a = malloc(sizeof(float) * (size_t)H), *as = malloc(sizeof(float) * (size_t)H);
    float *c = malloc(sizeof(float) * (size_t)V);
    int8_t *aq = malloc((size_t)H);
    for (int64_t i = 0; i < H; i++) a[i] = (float)(rand() % 2000 - 1000) / 1000.0f;
    double best[2] = {1e9, 1e9};
    for (int r = 0; r < (big ? 15 : 60); r++)
        for (int v = 0; v < 2; v++) {
            double t0 = now();
            for (int64_t i = 0; i < nm; i++) {
                int64_t k = ms[i].k, n = ms[i].n;
                cpu_weights cw = {.data = ms[i].w, .dtype = MK_DTYPE_INT8, .ldb = k, .scale = ms[i].sc,
                                  .group = g, .ss_k = 1, .ss_n = k / g};
#ifdef BENCH_SCALAR_GRID /* a build before mk_cpu_q8_grid: groups.c's loop then */
                for (int64_t t = 0; v && t < k / g; t++) {
                    as[t] = q8_scale(a + t * g, g);
                    for (int64_t e = t * g; e < (t + 1) * g; e++) aq[e] = q8_value(a[e], as[t]);
                }
#else
                if (v) mk_cpu_q8_grid(a, k, g, aq, as);
#endif
                for (int64_t j = 0; j < n; j += CPU_MV_CHUNK) {
                    int64_t j1 = j + CPU_MV_CHUNK < n ? j + CPU_MV_CHUNK : n;
                    if (v)
                        mk_cpu_mv_columns_q8(aq, as, &cw, k, j, j1, c + j);
                    else
                        mk_cpu_mv_columns(a, &cw, k, j, j1, c + j);
                }
            }
            double t = now() - t0;
            if (t < best[v]) best[v] = t;
        }
    printf("%s, one thread, a step's products: q8 %.0f us, q8a8 (grid included) %.0f us\n",
           big ? "110M" : "15M", best[0] * 1e6, best[1] * 1e6);
    return 0;
}
