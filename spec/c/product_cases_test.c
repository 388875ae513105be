/*
 * product_cases_test.c — matrix–vector and attention groups (core/product.c)
 * on fixed graphs written out here: what random graphs rarely reach
 * (product_test.c has those).
 *
 * test_row_fault: a row write whose bounds do not fit fails naming the
 * ReplaceSliceNode, on each device, and the model runs again afterwards;
 * test_prefix_fault: the same for an attention group's prefix (naming the
 * SlicedSoftmaxNode), then its values against a double-precision reference.
 *
 * test_argmax: a greedy classifier's ties, NaNs and signed zeros, as the CPU
 * picks them, on 8 columns and on 4,096 (split among threads and blocks).
 *
 * test_staged: a group with 8 MiB of weights, whose CUDA blocks hold A (and
 * the RmsNorm's sums) in shared memory, against double-precision loops.
 *
 * test_timeline: MK_CUDA_TIMELINE's stamped kernels (kernels/timeline.cu)
 * compile, and on a GPU write a table of in-order times.
 */
#include "device.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

/* text compiled for dev, checked to be one group in one launch; NULL (a
 * failed check) if it does not compile. */
static mk_model *compile_one_group(mk_context *ctx, const char *text, mk_device dev) {
    mk_error *err = NULL;
    mk_compile_options o = {.device = dev};
    mk_model *m = mk_compile(ctx, text, NULL, 0, &o, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    mk_error_free(err);
    if (!m) return NULL;
    mk_stats st;
    mk_model_stats(m, &st);
    CHECK(st.product_groups == 1 && st.launches == 1, "%d groups, %d launches\n%s",
          st.product_groups, st.launches, mk_model_script(m));
    return m;
}

/* A row write out of bounds: the error names the write, and the model runs again. */
static void row_fault_on(mk_device dev) {
    const char *text =
        "$1 = InputTensor(x, float32, [1, 8]);\n"
        "$2 = InputTensor(w, float32, [4, 8]);\n"
        "$3 = PermuteNode($2, [1, 0]);\n"
        "$4 = MatMulNode($1, $3);\n"
        "$5 = BufferTensor(float32, [3, 4]);\n"
        "$6 = InputTensor(pos, int64, [1]);\n"
        "$7 = InputTensor(pos1, int64, [1]);\n"
        "$8 = ReplaceSliceNode($5, $4, $6, $7);\n"
        "result = $8;\n";
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = compile_one_group(ctx, text, dev);
    if (!m) goto done;
    float x[8], w[32], out[12];
    for (int i = 0; i < 8; i++) x[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < 32; i++) w[i] = (float)test_uniform(-1, 1);
    int64_t pos = 1, pos1 = 3;
    mk_named_tensor in[4] = {{"x", x}, {"w", w}, {"pos", &pos}, {"pos1", &pos1}};
    int rc = mk_evaluate(m, in, 4, out, sizeof out, &err);
    CHECK(rc != 0 && strstr(mk_error_message(err), "script:8:1: evaluation error: ReplaceSliceNode"),
          "rows [1, 3) for one row: %s", rc ? mk_error_message(err) : "no error");
    mk_error_free(err);
    err = NULL;
    pos = 4, pos1 = 5;
    rc = mk_evaluate(m, in, 4, out, sizeof out, &err);
    CHECK(rc != 0 && strstr(mk_error_message(err), "out of range"), "row 4 of 3: %s",
          rc ? mk_error_message(err) : "no error");
    mk_error_free(err);
    err = NULL;
    pos = 2, pos1 = 3;
    rc = mk_evaluate(m, in, 4, out, sizeof out, &err);
    CHECK(rc == 0, "then a good row: %s", mk_error_message(err));
    for (int j = 0; rc == 0 && j < 4; j++) { /* row 2 = x @ w^T, rows 0 and 1 still zero */
        double want = 0.0;
        for (int k = 0; k < 8; k++) want += (double)x[k] * w[j * 8 + k];
        CHECK(test_close(out[8 + j], want, 1e-5, 1e-5) && out[j] == 0.0f && out[4 + j] == 0.0f,
              "column %d: %g, want %g", j, (double)out[8 + j], want);
    }
    mk_model_free(m);
done:
    mk_error_free(err);
    mk_context_free(ctx);
}

/* An attention prefix out of range: the error names the softmax; then a good
 * run. S cached rows: 5 (one chunk), 100 (four: a cluster on sm_90). */
#define FAULT_ROWS 100
static void prefix_fault_on(mk_device dev, int S) {
    char text[1024];
    snprintf(text, sizeof text,
             "$1 = InputTensor(q, float32, [2, 1, 4]);\n"
             "$2 = InputTensor(k, float32, [%d, 2, 4]);\n"
             "$3 = PermuteNode($2, [1, 2, 0]);\n"
             "$4 = InputTensor(p, int64, [1]);\n"
             "$5 = MatMulNode($1, $3);\n"
             "$6 = SlicedSoftmaxNode($5, $4);\n"
             "$7 = InputTensor(v, float32, [%d, 2, 3]);\n"
             "$8 = PermuteNode($7, [1, 0, 2]);\n"
             "$9 = PrefixMatMulNode($6, $8, $4);\n"
             "result = $9;\n", S, S);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = compile_one_group(ctx, text, dev);
    if (!m) goto done;
    float q[8], k[FAULT_ROWS * 8], v[FAULT_ROWS * 6], out[6];
    for (int i = 0; i < 8; i++) q[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < S * 8; i++) k[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < S * 6; i++) v[i] = (float)test_uniform(-1, 1);
    int64_t p = S + 1;
    mk_named_tensor in[4] = {{"q", q}, {"k", k}, {"p", &p}, {"v", v}};
    int rc = mk_evaluate(m, in, 4, out, sizeof out, &err);
    char want_err[160];
    snprintf(want_err, sizeof want_err,
             "script:6:1: evaluation error: SlicedSoftmaxNode: prefix %d ('p') is outside [0, %d]",
             S + 1, S);
    CHECK(rc != 0 && strstr(mk_error_message(err), want_err), "prefix %d of %d: %s", S + 1, S,
          rc ? mk_error_message(err) : "no error");
    mk_error_free(err);
    err = NULL;
    p = 3;
    rc = mk_evaluate(m, in, 4, out, sizeof out, &err);
    CHECK(rc == 0, "then a good prefix: %s", mk_error_message(err));
    for (int t = 0; rc == 0 && t < 2; t++) { /* softmax of 3 scores, then V's first 3 rows */
        double sc[3], mx = -1e300, sum = 0.0;
        for (int j = 0; j < 3; j++) {
            sc[j] = 0.0;
            for (int c = 0; c < 4; c++) sc[j] += (double)q[t * 4 + c] * k[j * 8 + t * 4 + c];
            mx = fmax(mx, sc[j]);
        }
        for (int j = 0; j < 3; j++) sum += exp(sc[j] - mx);
        for (int c = 0; c < 3; c++) {
            double want = 0.0;
            for (int j = 0; j < 3; j++) want += exp(sc[j] - mx) / sum * v[j * 6 + t * 3 + c];
            CHECK(test_close(out[t * 3 + c], want, 1e-5, 1e-5), "head %d value %d: %g, want %g",
                  t, c, (double)out[t * 3 + c], want);
        }
    }
    mk_model_free(m);
done:
    mk_error_free(err);
    mk_context_free(ctx);
}

static void test_prefix_fault_cpu(void) {
    prefix_fault_on(MK_DEVICE_CPU, 5);
    prefix_fault_on(MK_DEVICE_CPU, FAULT_ROWS);
}
static void test_prefix_fault_cuda(void) {
    prefix_fault_on(MK_DEVICE_CUDA, 5);
    prefix_fault_on(MK_DEVICE_CUDA, FAULT_ROWS);
}

/* A greedy classifier's ties and NaNs: the first largest column wins, as on the
 * CPU (whose comparison is strict from column 0): a NaN never wins, except in
 * column 0. */
static void argmax_on(mk_device dev) {
    const char *text =
        "$1 = InputTensor(x, float32, [2, 4]);\n"
        "$2 = InputTensor(w, float32, [8, 4]);\n"
        "$3 = PermuteNode($2, [1, 0]);\n"
        "$4 = MatMulNode($1, $3);\n"
        "$5 = ArgMaxNode($4);\n"
        "result = $5;\n";
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = compile_one_group(ctx, text, dev);
    if (!m) goto done;
    float x[8] = {1, 0, 0, 0, 0, 1, 0, 0}; /* row 0 reads w's column 0, row 1 column 1 */
    const struct {
        float c0[8], c1[8]; /* w[j][0] and w[j][1] */
        int64_t want[2];
    } cases[] = {
        {{1, 5, 2, 5, 0, 0, 0, 0}, {-3, -1, -2, -1, -1, -4, -9, -8}, {1, 1}}, /* ties: first */
        /* a NaN in w's row j makes both rows' column j NaN (0 * NaN) */
        {{NAN, 5, 2, 7, 0, 0, 0, 0}, {0, 1, 3, 3, -1, 2, 0, 0}, {0, 0}},      /* at 0: wins */
        {{1, NAN, 2, 7, 0, 0, 0, 0}, {0, 0, 3, 1, -1, 2, 0, 0}, {3, 2}},      /* else: never */
        {{-0.0f, 0.0f, -1, -2, -3, -4, -5, -6}, {-1, -1, -1, -1, -1, -1, -1, -0.5f}, {0, 7}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float w[32] = {0};
        for (int j = 0; j < 8; j++) w[j * 4] = cases[c].c0[j], w[j * 4 + 1] = cases[c].c1[j];
        int64_t out[2] = {-1, -1};
        mk_named_tensor in[2] = {{"x", x}, {"w", w}};
        int rc = mk_evaluate(m, in, 2, out, sizeof out, &err);
        CHECK(rc == 0, "evaluate: %s", mk_error_message(err));
        CHECK(out[0] == cases[c].want[0] && out[1] == cases[c].want[1],
              "case %zu: %lld %lld, want %lld %lld", c, (long long)out[0], (long long)out[1],
              (long long)cases[c].want[0], (long long)cases[c].want[1]);
    }
    mk_model_free(m);
done:
    mk_error_free(err);
    mk_context_free(ctx);
}

/*
 * A wide classifier (4,096 columns: the CPU's threads each take a part, the
 * GPU's blocks theirs) whose values tie often, with NaNs at chunk starts and
 * -0 next to +0: the ArgMax equals the first-largest scan from column 0.
 * x picks one column of w per row, so the logits are w's values exactly.
 */
static void argmax_wide_on(mk_device dev) {
    enum { N = 4096, K = 16 };
    char text[512];
    snprintf(text, sizeof text,
             "$1 = InputTensor(x, float32, [2, %d]);\n"
             "$2 = InputTensor(w, float32, [%d, %d]);\n"
             "$3 = PermuteNode($2, [1, 0]);\n"
             "$4 = MatMulNode($1, $3);\n"
             "$5 = ArgMaxNode($4);\n"
             "result = $5;\n",
             K, N, K);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_compile_options o = {.device = dev};
    mk_model *m = mk_compile(ctx, text, NULL, 0, &o, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    float *w = calloc((size_t)N * K, sizeof *w), x[2 * K] = {0};
    x[0] = 1.0f, x[K + 3] = 1.0f; /* row 0 reads w's column 0, row 1 column 3 */
    for (int c = 0; m && c < 6 && !test_cur_failed; c++) {
        for (int j = 0; j < N; j++) {
            /* a NaN in w's row j makes every row's column j NaN (0 * NaN) */
            bool nan = (j % 64 == 0 && j > 0 && test_randint(0, 2) == 0) || (c == 5 && j == 0);
            for (int q = 0; q < 4; q++) {
                float v = (float)test_randint(-40, 40 + 10 * c); /* later cases: one clear max */
                if (v == 0.0f && test_randint(0, 1)) v = -0.0f;
                w[j * K + q] = nan ? NAN : v; /* at column 0 a NaN wins (case 5) */
            }
        }
        int64_t out[2] = {-1, -1}, want[2];
        for (int r = 0; r < 2; r++) {
            int q = r ? 3 : 0;
            want[r] = 0;
            for (int j = 1; j < N; j++)
                if (w[j * K + q] > w[want[r] * K + q]) want[r] = j;
        }
        mk_named_tensor in[2] = {{"x", x}, {"w", w}};
        int rc = mk_evaluate(m, in, 2, out, sizeof out, &err);
        CHECK(rc == 0, "evaluate: %s", mk_error_message(err));
        CHECK(out[0] == want[0] && out[1] == want[1], "case %d: %lld %lld, want %lld %lld", c,
              (long long)out[0], (long long)out[1], (long long)want[0], (long long)want[1]);
    }
    free(w);
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

static void test_argmax_cpu(void) {
    argmax_on(MK_DEVICE_CPU);
    argmax_wide_on(MK_DEVICE_CPU);
}
static void test_argmax_cuda(void) {
    argmax_on(MK_DEVICE_CUDA);
    argmax_wide_on(MK_DEVICE_CUDA);
}

/*
 * A group big enough that CUDA's blocks hold A in shared memory (8 MiB of
 * weights, core/codegen/matvec.c's MK_STAGE_MIN_WEIGHTS), its RmsNorm's
 * squares summed by the block: two rows of x, against double-precision
 * loops. The random graphs' weights are far smaller.
 */
static void staged_on(mk_device dev) {
    enum { M = 2, K = 2048, N = 1024 };
    char text[512];
    snprintf(text, sizeof text,
             "$1 = InputTensor(x, float32, [%d, %d]);\n"
             "$2 = InputTensor(g, float32, [%d]);\n"
             "$3 = RmsNormNode($1, $2);\n"
             "$4 = InputTensor(w, float32, [%d, %d]);\n"
             "$5 = PermuteNode($4, [1, 0]);\n"
             "$6 = MatMulNode($3, $5);\n"
             "result = $6;\n",
             M, K, K, N, K);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = compile_one_group(ctx, text, dev);
    float *x = malloc(sizeof(float) * M * K), *g = malloc(sizeof(float) * K);
    float *w = malloc(sizeof(float) * N * K), *out = malloc(sizeof(float) * M * N);
    if (m && mk_cuda_plugin_get(NULL, 0)) { /* the kernel is the staged one */
        char *src = mk_model_kernel_source(m, 0, &err);
        CHECK(src && strstr(src, "sA[") && strstr(src, "float sss["), "not staged:\n%s",
              src ? src : mk_error_message(err));
        mk_string_free(src);
    }
    for (int c = 0; m && c < 2 && !test_cur_failed; c++) {
        for (int i = 0; i < M * K; i++) x[i] = (float)test_uniform(-2, 2);
        for (int i = 0; i < K; i++) g[i] = (float)test_uniform(0.5, 1.5);
        for (int i = 0; i < N * K; i++) w[i] = (float)test_uniform(-1, 1);
        mk_named_tensor in[3] = {{"x", x}, {"g", g}, {"w", w}};
        int rc = mk_evaluate(m, in, 3, out, sizeof(float) * M * N, &err);
        CHECK(rc == 0, "evaluate: %s", mk_error_message(err));
        for (int r = 0; rc == 0 && r < M && !test_cur_failed; r++) {
            double ss = 0.0;
            for (int k = 0; k < K; k++) ss += (double)x[r * K + k] * x[r * K + k];
            double inv = 1.0 / sqrt(ss / K + 1e-5);
            for (int n = 0; n < N && !test_cur_failed; n++) {
                double want = 0.0, size = 0.0;
                for (int k = 0; k < K; k++) {
                    double t = (double)x[r * K + k] * inv * g[k] * w[(size_t)n * K + k];
                    want += t, size += fabs(t);
                }
                CHECK(fabs(out[r * N + n] - want) <= 1e-5 * size, "row %d column %d: %g, want %g",
                      r, n, (double)out[r * N + n], want);
            }
        }
    }
    free(x), free(g), free(w), free(out);
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

static void test_staged_cpu(void) { staged_on(MK_DEVICE_CPU); }
static void test_staged_cuda(void) { staged_on(MK_DEVICE_CUDA); }

static void test_row_fault_cpu(void) { row_fault_on(MK_DEVICE_CPU); }
static void test_row_fault_cuda(void) { row_fault_on(MK_DEVICE_CUDA); }

/* Where the timeline's file has a table: its rows' count, each checked (first
 * start, first wait, last start, last end in order; ends in order down the
 * table), or -1 with a failed check. */
static int timeline_rows(const char *path) {
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "no timeline written to %s", path);
    if (!f) return -1;
    char line[512];
    int rows = 0, headers = 0;
    double before = 0.0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') {
            CHECK(headers > 0 || !strncmp(line, "# moonkaas CUDA timeline: a model of ", 37),
                  "header: %s", line);
            headers++;
            continue;
        }
        int launch, at = 0;
        unsigned blocks = 0;
        double first, wait, last, end, added;
        char waves[32] = "";
        int got = sscanf(line, "%d %lf %lf %lf %lf %lf %u %31s %n", &launch, &first, &wait, &last,
                         &end, &added, &blocks, waves, &at);
        bool sampler = got == 8 && strstr(line + at, "sampler $");
        CHECK(got == 8 && (strstr(line + at, "group") || sampler), "row: %s", line);
        /* the generated kernels' waves (a few blocks on many SMs: a fraction
         * of one); the sampler's clusters have none */
        double w = atof(waves);
        CHECK(blocks > 0 && (sampler ? !strcmp(waves, "-") : w > 0.0 && w < 1.0),
              "blocks %u, waves %s: %s", blocks, waves, line);
        CHECK(rows > 0 || first == 0.0, "the first row starts at %g, not 0", first);
        CHECK(first <= wait && wait <= end && first <= last && last <= end && end >= before,
              "times out of order (the row before ends at %g): %s", before, line);
        before = end;
        rows++;
    }
    fclose(f);
    CHECK(headers == 2, "%d header lines", headers);
    return rows;
}

/* The sources MK_CUDA_DUMP wrote to dir that define MK_TIMELINE_OCCUPANCY
 * as 1 or more; the files are removed, then dir. */
static int occupancies(const char *dir) {
    int found = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char file[512], line[512];
        snprintf(file, sizeof file, "%s/%s", dir, e->d_name);
        FILE *f = fopen(file, "r");
        int n = 0;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "#define MK_TIMELINE_OCCUPANCY %d", &n) == 1 && n >= 1) found++;
        if (f) fclose(f);
        remove(file);
    }
    if (d) closedir(d);
    rmdir(dir);
    return found;
}

/*
 * MK_CUDA_TIMELINE: set when a model is compiled, its product groups' sources
 * define MK_TIMELINE after their first line, and NVRTC compiles them (no GPU
 * needed); on a GPU, each stamped source asks for its unstamped build's
 * blocks an SM (MK_TIMELINE_OCCUPANCY), and evaluations and then freeing the
 * model write a row per stamped launch: the two groups' and the sampler's
 * after them. Unset, the sources are as before.
 */
static void test_timeline(void) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/mk_timeline_%ld.txt", (long)getpid());
    remove(path);
    const char *text =
        "$1 = InputTensor(q, float32, [2, 1, 64]);\n"
        "$2 = InputTensor(k, float32, [70, 2, 64]);\n"
        "$3 = PermuteNode($2, [1, 2, 0]);\n"
        "$4 = InputTensor(p, int64, [1]);\n"
        "$5 = MatMulNode($1, $3);\n"
        "$6 = SlicedSoftmaxNode($5, $4);\n"
        "$7 = InputTensor(v, float32, [70, 2, 32]);\n"
        "$8 = PermuteNode($7, [1, 0, 2]);\n"
        "$9 = PrefixMatMulNode($6, $8, $4);\n"
        "$10 = ReshapeNode($9, [1, 64]);\n"
        "$11 = InputTensor(w, float32, [8, 64]);\n"
        "$12 = PermuteNode($11, [1, 0]);\n"
        "$13 = MatMulNode($10, $12);\n"
        "$14 = ReshapeNode($13, [8]);\n"
        "$15 = InputTensor(s, int64, [1]);\n"
        "$16 = InputTensor(t, float32, [1]);\n"
        "$17 = SampleNode($14, $15, $16, $16);\n"
        "result = $17;\n";
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    bool nvrtc = mk_cuda_plugin_get(NULL, 0) != NULL;
    char why[256];
    bool gpu = mk_cuda_available(why, sizeof why) == 1;
    for (int stamped = 1; stamped >= 0 && ctx && nvrtc; stamped--) {
        if (stamped) setenv("MK_CUDA_TIMELINE", path, 1);
        else unsetenv("MK_CUDA_TIMELINE");
        mk_compile_options o = {.device = MK_DEVICE_CPU};
        mk_model *m = mk_compile(ctx, text, NULL, 0, &o, &err);
        CHECK(m != NULL, "compile: %s", mk_error_message(err));
        if (!m) break;
        mk_stats st;
        mk_model_stats(m, &st);
        int sources = 0;
        for (int i = 0; i < st.launches; i++) {
            char *src = mk_model_kernel_source(m, i, NULL);
            if (!src || !strstr(src, "group $")) { /* a library's launch, or a pointwise group */
                free(src);
                continue;
            }
            const char *second = strchr(src, '\n');
            CHECK(second && (strncmp(second, "\n#define MK_TIMELINE\n", 21) == 0) == (stamped == 1),
                  "launch %d (timeline %d):\n%.300s", i, stamped, src);
            sources++;
            free(src);
        }
        CHECK(sources == 2, "%d group sources, want attention and a matrix-vector group\n%s",
              sources, mk_model_script(m));
        for (int arch = 80; arch <= 90; arch += 10)
            CHECK(mk_model_check_generated(m, arch, &err) == 2, "sm_%d: %s", arch,
                  mk_error_message(err));
        mk_model_free(m);
    }
    if (!nvrtc) printf("#   no CUDA plugin: sources not checked\n");
    setenv("MK_CUDA_TIMELINE", path, 1);
    mk_model *m = NULL;
    char dump[64];
    snprintf(dump, sizeof dump, "/tmp/mk_timeline_dump_%ld", (long)getpid());
    if (gpu && ctx) {
        mkdir(dump, 0755);
        setenv("MK_CUDA_DUMP", dump, 1);
        mk_compile_options o = {.device = MK_DEVICE_CUDA};
        m = mk_compile(ctx, text, NULL, 0, &o, &err);
        CHECK(m != NULL, "compile for CUDA: %s", mk_error_message(err));
        unsetenv("MK_CUDA_DUMP");
        int n = occupancies(dump);
        CHECK(n == 2, "%d stamped sources name their unstamped build's blocks an SM, want the "
              "two groups'", n);
    } else {
        printf("#   CUDA: %s: no evaluations stamped\n", gpu ? "no context" : why);
    }
    unsetenv("MK_CUDA_TIMELINE"); /* read when the model is compiled */
    if (m) {
        float q[128], k[70 * 128], v[70 * 64], w[512], t = 0.5f; /* t: temperature and top-p */
        for (int i = 0; i < 128; i++) q[i] = (float)test_uniform(-1, 1);
        for (int i = 0; i < 70 * 128; i++) k[i] = (float)test_uniform(-1, 1);
        for (int i = 0; i < 70 * 64; i++) v[i] = (float)test_uniform(-1, 1);
        for (int i = 0; i < 512; i++) w[i] = (float)test_uniform(-1, 1);
        int64_t p = 50, s = 7, out[2];
        mk_named_tensor in[7] = {{"q", q}, {"k", k}, {"p", &p}, {"v", v}, {"w", w}, {"s", &s},
                                 {"t", &t}};
        for (int e = 0; e < 5; e++)
            CHECK(mk_evaluate(m, in, 7, out, sizeof out, &err) == 0 && out[0] >= 0 && out[0] < 8,
                  "evaluate: %s", mk_error_message(err));
        mk_model_free(m);
        int rows = timeline_rows(path);
        CHECK(rows == 3, "%d rows in %s, want the two groups' and the sampler's", rows, path);
        FILE *f = fopen(path, "r");
        char line[512];
        bool sampler = false;
        const char *want = "sampler $17: 1 rows of 8 logits, a cluster of 1 blocks a row";
        while (f && fgets(line, sizeof line, f)) sampler |= strstr(line, want) != NULL;
        if (f) fclose(f);
        CHECK(sampler, "no sampler's row in %s", path);
        remove(path);
    }
    mk_error_free(err);
    mk_context_free(ctx);
}

int main(void) {
    /* small graphs, but the CPU's threaded paths: the cost rule would keep them on one thread */
    setenv("MK_CPU_FORK", "always", 0);
    test_srand(test_seed());
    RUN(test_row_fault_cpu);
    RUN(test_prefix_fault_cpu);
    RUN(test_argmax_cpu);
    RUN(test_staged_cpu);
    RUN(test_timeline);
    char why[256];
    if (mk_cuda_available(why, sizeof why) == 1) {
        RUN(test_row_fault_cuda);
        RUN(test_prefix_fault_cuda);
        RUN(test_argmax_cuda);
        RUN(test_staged_cuda);
    } else {
        SKIP(test_row_fault_cuda, why);
        SKIP(test_prefix_fault_cuda, why);
        SKIP(test_argmax_cuda, why);
        SKIP(test_staged_cuda, why);
    }
    return test_summary("product_cases");
}
