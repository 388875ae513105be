/*
 * cudnn_test.c — the cuDNN fuser (core/fusion.c, kernels/cudnn_fuser.cu)
 * through the C API: fused groups against double-precision references written
 * here, the compile cache on repeated layers, the fallback of rejected groups,
 * broadcasting, and the error paths. Without a CUDA device only the error
 * paths run; the rest is skipped with the reason.
 *
 *   build/tests/cudnn_test                 the tests
 *   MK_CUDNN_BENCH=1 build/tests/cudnn_test   also the measurements (compile
 *                                          time of N-layer MLPs, evaluation
 *                                          with and without cuDNN)
 *
 * Fused matmuls run in TF32 (on the H200 with cuDNN 9.14 every engine cuDNN
 * offers for them uses tensor cores, and with NVIDIA_TF32_OVERRIDE=0 it offers
 * none), so results are compared with a tolerance relative to the output's
 * RMS: 1e-2 where the model reports TF32 groups, 1e-4 otherwise.
 */
#include "test.h"

#include "moonkaas.h"

#include <stdarg.h>
#include <stdbool.h>

static char reason[256];
static bool have_cuda;
/* NVIDIA_TF32_OVERRIDE=0 leaves cuDNN no engine for a fused float32 matmul
 * (seen on the H200 with 9.14): matmul groups are then rejected, not fused. */
static bool tf32_off;

/* ---- references (double precision, row-major) --------------------------------- */

typedef struct {
    int rank;
    int64_t shape[4];
    double *v;
} ref;

static int64_t numel(const ref *r) {
    int64_t n = 1;
    for (int i = 0; i < r->rank; i++) n *= r->shape[i];
    return n;
}

static ref make(int rank, const int64_t *shape) {
    ref r = {.rank = rank};
    memcpy(r.shape, shape, sizeof(int64_t) * (size_t)rank);
    r.v = calloc((size_t)numel(&r), sizeof(double));
    return r;
}

/* Uniform in [lo, hi), rounded to float32 so the reference sees what the device sees. */
static ref rnd(int rank, const int64_t *shape, double lo, double hi) {
    ref r = make(rank, shape);
    for (int64_t i = 0; i < numel(&r); i++) r.v[i] = (float)test_uniform(lo, hi);
    return r;
}

static float *f32(const ref *r) {
    float *f = malloc(sizeof(float) * (size_t)numel(r));
    for (int64_t i = 0; i < numel(r); i++) f[i] = (float)r->v[i];
    return f;
}

/* a [.., m, k] @ b [.., k, n] (rank 1: [k] @ [k, n]) */
static ref r_matmul(const ref *a, const ref *b) {
    int64_t batch = a->rank == 3 ? a->shape[0] : 1;
    int64_t m = a->rank == 1 ? 1 : a->shape[a->rank - 2], k = a->shape[a->rank - 1];
    int64_t n = b->shape[b->rank - 1];
    int64_t shape[3] = {batch, m, n};
    ref c = a->rank == 1 ? make(1, &n) : a->rank == 2 ? make(2, shape + 1) : make(3, shape);
    for (int64_t z = 0; z < batch; z++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t l = 0; l < k; l++)
                    s += a->v[(z * m + i) * k + l] * b->v[(z * k + l) * n + j];
                c.v[(z * m + i) * n + j] = s;
            }
    return c;
}

/* a op b, b broadcasting where its dims are 1 */
static ref r_binary(const ref *a, const ref *b, int mul) {
    ref c = make(a->rank, a->shape);
    int64_t idx[4];
    for (int64_t p = 0; p < numel(a); p++) {
        int64_t q = p, off = 0;
        for (int d = a->rank - 1; d >= 0; d--) {
            idx[d] = q % a->shape[d];
            q /= a->shape[d];
        }
        for (int d = 0; d < a->rank; d++) off = off * b->shape[d] + (b->shape[d] == 1 ? 0 : idx[d]);
        c.v[p] = mul ? a->v[p] * b->v[off] : a->v[p] + b->v[off];
    }
    return c;
}

static ref r_unary(const ref *a, int silu) {
    ref c = make(a->rank, a->shape);
    for (int64_t p = 0; p < numel(a); p++) {
        double x = a->v[p];
        c.v[p] = silu ? x / (1 + exp(-x)) : (x > 0 ? x : 0);
    }
    return c;
}

/* Replaces *r by f's result, freeing the old values. */
static void set(ref *r, ref next) {
    free(r->v);
    *r = next;
}

/* max |got - want| / rms(want) */
static double rel_err(const float *got, const ref *want) {
    double ss = 0, worst = 0;
    for (int64_t i = 0; i < numel(want); i++) ss += want->v[i] * want->v[i];
    double rms = sqrt(ss / (double)numel(want));
    for (int64_t i = 0; i < numel(want); i++) {
        double e = fabs(got[i] - want->v[i]);
        if (e > worst) worst = e;
    }
    return worst / (rms > 0 ? rms : 1);
}

/* ---- compiling and running ------------------------------------------------------- */

typedef struct {
    const char *name;
    const ref *value;
} feed;

static char script[1 << 16];
static size_t script_len;

static void line(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    script_len += (size_t)vsnprintf(script + script_len, sizeof script - script_len, fmt, ap);
    va_end(ap);
}

static const char *dims(const ref *r) {
    static char buf[8][64];
    static int next;
    char *b = buf[next++ % 8];
    int k = sprintf(b, "[");
    for (int i = 0; i < r->rank; i++) k += sprintf(b + k, "%s%lld", i ? ", " : "", (long long)r->shape[i]);
    sprintf(b + k, "]");
    return b;
}

typedef struct {
    mk_model *model;
    mk_stats stats;
    float *out;
    double err;
} result;

/*
 * Compiles `script` with the constants, runs it with the inputs and compares
 * with `want`. use_cudnn on CUDA; the model stays open in r->model.
 */
static int run_model(mk_context *ctx, bool cudnn, const feed *consts, int n_consts,
                     const feed *inputs, int n_inputs, const ref *want, result *r) {
    mk_named_tensor c[16], in[16];
    float *owned[32];
    int n_owned = 0;
    for (int i = 0; i < n_consts; i++) {
        owned[n_owned] = f32(consts[i].value);
        c[i] = (mk_named_tensor){consts[i].name, owned[n_owned++]};
    }
    for (int i = 0; i < n_inputs; i++) {
        owned[n_owned] = f32(inputs[i].value);
        in[i] = (mk_named_tensor){inputs[i].name, owned[n_owned++]};
    }
    mk_error *err = NULL;
    mk_compile_options o = {.device = MK_DEVICE_CUDA, .use_cudnn = cudnn};
    memset(r, 0, sizeof *r);
    r->model = mk_compile(ctx, script, c, (size_t)n_consts, &o, &err);
    int rc = -1;
    if (!r->model) {
        printf("#   compile: %s\n", mk_error_message(err));
        goto done;
    }
    mk_model_stats(r->model, &r->stats);
    r->out = malloc(sizeof(float) * (size_t)numel(want));
    if (mk_evaluate(r->model, in, (size_t)n_inputs, r->out, sizeof(float) * (size_t)numel(want),
                    &err)) {
        printf("#   evaluate: %s\n", mk_error_message(err));
        goto done;
    }
    r->err = rel_err(r->out, want);
    rc = 0;
done:
    mk_error_free(err);
    for (int i = 0; i < n_owned; i++) free(owned[i]);
    return rc;
}

static void result_free(result *r) {
    mk_model_free(r->model);
    free(r->out);
    memset(r, 0, sizeof *r);
}

static double tolerance(const result *r) { return r->stats.cudnn_tf32_groups ? 1e-2 : 1e-4; }

static void show(const char *what, const result *r) {
    printf("#   %s: fused %d, cache hits %d, rejected %d, tf32 %d, max err %.2e of rms, "
           "compile %.1f ms\n", what, r->stats.fused_groups, r->stats.cudnn_cache_hits,
           r->stats.cudnn_rejected, r->stats.cudnn_tf32_groups, r->err, r->stats.compile_ms);
    const char *rep = r->model ? mk_model_fusion_report(r->model) : "";
    for (const char *p = rep; *p;) {
        const char *e = strchr(p, '\n');
        int len = e ? (int)(e - p) : (int)strlen(p);
        printf("#     %.*s\n", len, p);
        p += len + (e ? 1 : 0);
    }
}

/* Checks a fused model: it ran, agrees with the reference, fused >= min_fused groups. */
static void check_fused(const char *what, mk_context *ctx, const feed *consts, int n_consts,
                        const feed *inputs, int n_inputs, const ref *want, int min_fused) {
    result r;
    int rc = run_model(ctx, true, consts, n_consts, inputs, n_inputs, want, &r);
    show(what, &r);
    CHECK(rc == 0, "%s did not run", what);
    if (rc == 0) {
        CHECK(r.err <= tolerance(&r), "%s: error %.3g of the output's rms (tolerance %.0e)", what,
              r.err, tolerance(&r));
        CHECK(r.stats.fused_groups >= min_fused, "%s: %d groups fused, expected at least %d",
              what, r.stats.fused_groups, min_fused);
    }
    result_free(&r);
}

/* ---- error paths (any machine) ------------------------------------------------------ */

static void test_errors(void) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    script_len = 0;
    line("$1 = InputTensor(x, float32, [2, 3]);\n$2 = ReLUNode($1);\n$3 = SiLUNode($2);\n"
         "result = $3;\n");
    mk_compile_options cpu = {.device = MK_DEVICE_CPU, .use_cudnn = true};
    mk_model *m = mk_compile(ctx, script, NULL, 0, &cpu, &err);
    CHECK(!m && err && mk_error_code_of(err) == MK_ERR_ARGUMENT,
          "use_cudnn on the CPU: %s", err ? mk_error_message(err) : "no error");
    mk_error_free(err);
    err = NULL;

    mk_compile_options gpu = {.device = MK_DEVICE_CUDA, .use_cudnn = true};
    m = mk_compile(ctx, script, NULL, 0, &gpu, &err);
    if (!have_cuda) {
        CHECK(!m && err && mk_error_code_of(err) == MK_ERR_NO_DEVICE &&
                  strstr(mk_error_message(err), "no CUDA device"),
              "use_cudnn without a device: %s", err ? mk_error_message(err) : "no error");
        printf("#   without a device: %s\n", err ? mk_error_message(err) : "");
    } else {
        CHECK(m != NULL, "a pointwise chain with use_cudnn: %s", err ? mk_error_message(err) : "");
    }
    mk_model_free(m);
    mk_error_free(err);
    err = NULL;

    /* the fused node is the pass's, never a script's */
    const char *bad = "$1 = InputTensor(x, float32, [2]);\n$2 = CudnnGroupNode(x);\nresult = $2;\n";
    m = mk_compile(ctx, bad, NULL, 0, NULL, &err);
    CHECK(!m && err && mk_error_code_of(err) == MK_ERR_NAME && mk_error_line(err) == 2,
          "CudnnGroupNode in a script: %s", err ? mk_error_message(err) : "no error");
    mk_error_free(err);
    mk_context_free(ctx);
}

/* ---- fused groups on the GPU --------------------------------------------------------- */

/* y = relu(x @ W + b), b a [1, N] row: the classic fused layer, evaluated three
 * times with fresh inputs (the captured graph replays with new data). */
static void test_matmul_bias_relu(void) {
    int64_t M = test_randint(16, 96), K = 4 * test_randint(8, 64), N = 4 * test_randint(8, 40);
    ref w = rnd(2, (int64_t[]){K, N}, -0.2, 0.2), b = rnd(2, (int64_t[]){1, N}, -1, 1);
    script_len = 0;
    line("$1 = InputTensor(x, float32, [%lld, %lld]);\n", (long long)M, (long long)K);
    line("$2 = ConstantTensor(w, float32, %s);\n$3 = ConstantTensor(b, float32, %s);\n", dims(&w), dims(&b));
    line("$4 = MatMulNode($1, $2);\n$5 = SumNode($4, $3);\n$6 = ReLUNode($5);\nresult = $6;\n");
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    feed consts[] = {{"w", &w}, {"b", &b}};
    result r = {0};
    for (int rep = 0; rep < 3; rep++) {
        ref x = rnd(2, (int64_t[]){M, K}, -1, 1);
        ref want = r_matmul(&x, &w);
        set(&want, r_binary(&want, &b, 0));
        set(&want, r_unary(&want, 0));
        if (rep == 0) {
            feed in[] = {{"x", &x}};
            int rc = run_model(ctx, true, consts, 2, in, 1, &want, &r);
            show("matmul+bias+relu", &r);
            CHECK(rc == 0, "did not run");
            CHECK(r.stats.fused_groups == 1, "fused %d groups", r.stats.fused_groups);
            CHECK(strstr(mk_model_script(r.model), "CudnnGroupNode") != NULL, "script: %s",
                  mk_model_script(r.model));
            if (!tf32_off) {
                CHECK(strstr(mk_model_fusion_report(r.model), "fused: MatMulNode $4") != NULL,
                      "report: %s", mk_model_fusion_report(r.model));
                CHECK(r.stats.launches == 1, "%d launches for one fused group", r.stats.launches);
            }
        } else if (r.model) {
            float *xf = f32(&x);
            mk_named_tensor in[] = {{"x", xf}};
            CHECK(mk_evaluate(r.model, in, 1, r.out, sizeof(float) * (size_t)numel(&want), &err) == 0,
                  "evaluation %d: %s", rep, err ? mk_error_message(err) : "");
            r.err = rel_err(r.out, &want);
            free(xf);
        }
        CHECK(r.err <= tolerance(&r), "evaluation %d: error %.3g of rms", rep, r.err);
        free(x.v);
        free(want.v);
    }
    result_free(&r);
    mk_context_free(ctx);
    free(w.v);
    free(b.v);
}

/* silu(x @ W1) * (x @ W3): the llama2 feed-forward gate. */
static void test_swiglu(void) {
    int64_t M = test_randint(1, 24), D = 8 * test_randint(4, 24), H = 8 * test_randint(4, 40);
    ref x = rnd(2, (int64_t[]){M, D}, -1, 1);
    ref w1 = rnd(2, (int64_t[]){D, H}, -0.2, 0.2), w3 = rnd(2, (int64_t[]){D, H}, -0.2, 0.2);
    ref want = r_matmul(&x, &w1), up = r_matmul(&x, &w3);
    set(&want, r_unary(&want, 1));
    set(&want, r_binary(&want, &up, 1));
    script_len = 0;
    line("$1 = InputTensor(x, float32, %s);\n$2 = ConstantTensor(w1, float32, %s);\n", dims(&x), dims(&w1));
    line("$3 = ConstantTensor(w3, float32, %s);\n$4 = MatMulNode($1, $2);\n", dims(&w3));
    line("$5 = SiLUNode($4);\n$6 = MatMulNode($1, $3);\n$7 = HadamardProductNode($5, $6);\nresult = $7;\n");
    mk_context *ctx = mk_context_new(NULL);
    feed consts[] = {{"w1", &w1}, {"w3", &w3}}, in[] = {{"x", &x}};
    check_fused("swiglu", ctx, consts, 2, in, 1, &want, !tf32_off);
    mk_context_free(ctx);
    free(x.v), free(w1.v), free(w3.v), free(want.v), free(up.v);
}

/* relu((x + y) * z) then silu, 3-D: a standalone pointwise chain. */
static void test_pointwise_chain(void) {
    int64_t s[3] = {test_randint(1, 4), test_randint(2, 40), 4 * test_randint(1, 30)};
    ref x = rnd(3, s, -2, 2), y = rnd(3, s, -2, 2), z = rnd(3, s, -2, 2);
    ref want = r_binary(&x, &y, 0);
    set(&want, r_binary(&want, &z, 1));
    set(&want, r_unary(&want, 0));
    set(&want, r_unary(&want, 1));
    script_len = 0;
    line("$1 = InputTensor(x, float32, %s);\n$2 = InputTensor(y, float32, %s);\n", dims(&x), dims(&y));
    line("$3 = InputTensor(z, float32, %s);\n$4 = SumNode($1, $2);\n", dims(&z));
    line("$5 = HadamardProductNode($4, $3);\n$6 = ReLUNode($5);\n$7 = SiLUNode($6);\nresult = $7;\n");
    mk_context *ctx = mk_context_new(NULL);
    feed in[] = {{"x", &x}, {"y", &y}, {"z", &z}};
    /* cuDNN may have no engine for a graph without a matmul: then it must fall
     * back, with the reason, and still be right */
    check_fused("pointwise chain", ctx, NULL, 0, in, 3, &want, 0);
    mk_context_free(ctx);
    free(x.v), free(y.v), free(z.v), free(want.v);
}

/* 30 pointwise nodes in a row over three operands: split into bounded groups. */
static void test_chain_30(void) {
    int64_t s[2] = {test_randint(2, 32), 4 * test_randint(2, 32)};
    ref x = rnd(2, s, -1, 1), b = rnd(2, s, -0.5, 0.5), c = rnd(2, s, 0.5, 1.0);
    ref want = make(2, s);
    memcpy(want.v, x.v, sizeof(double) * (size_t)numel(&x));
    script_len = 0;
    line("$1 = InputTensor(x, float32, %s);\n$2 = ConstantTensor(b, float32, %s);\n", dims(&x), dims(&b));
    line("$3 = ConstantTensor(c, float32, %s);\n", dims(&c));
    int prev = 1;
    for (int i = 0; i < 30; i++) {
        int id = 4 + i;
        switch (i % 4) {
        case 0: line("$%d = SumNode($%d, $2);\n", id, prev); set(&want, r_binary(&want, &b, 0)); break;
        case 1: line("$%d = HadamardProductNode($%d, $3);\n", id, prev); set(&want, r_binary(&want, &c, 1)); break;
        case 2: line("$%d = SiLUNode($%d);\n", id, prev); set(&want, r_unary(&want, 1)); break;
        case 3: line("$%d = ReLUNode($%d);\n", id, prev); set(&want, r_unary(&want, 0)); break;
        }
        prev = id;
    }
    line("result = $%d;\n", prev);
    mk_context *ctx = mk_context_new(NULL);
    feed consts[] = {{"b", &b}, {"c", &c}}, in[] = {{"x", &x}};
    check_fused("30-node chain", ctx, consts, 2, in, 1, &want, 0);
    mk_context_free(ctx);
    free(x.v), free(b.v), free(c.v), free(want.v);
}

/* An N-layer MLP of identical layers: one plan compiled, N - 1 cache hits; a
 * second model in the same context hits for every group. */
static void mlp_script(int layers, int64_t M, int64_t D) {
    script_len = 0;
    line("$1 = InputTensor(x, float32, [%lld, %lld]);\n", (long long)M, (long long)D);
    int prev = 1, id = 2;
    for (int l = 0; l < layers; l++) {
        line("$%d = ConstantTensor(w%d, float32, [%lld, %lld]);\n", id, l, (long long)D, (long long)D);
        line("$%d = ConstantTensor(b%d, float32, [1, %lld]);\n", id + 1, l, (long long)D);
        line("$%d = MatMulNode($%d, $%d);\n$%d = SumNode($%d, $%d);\n$%d = ReLUNode($%d);\n", id + 2,
             prev, id, id + 3, id + 2, id + 1, id + 4, id + 3);
        prev = id + 4;
        id += 5;
    }
    line("result = $%d;\n", prev);
}

static void test_repeated_layers(void) {
    int layers = (int)test_randint(4, 8);
    int64_t M = test_randint(4, 32), D = 8 * test_randint(4, 16);
    ref x = rnd(2, (int64_t[]){M, D}, -1, 1);
    ref *w = calloc((size_t)layers, sizeof *w), *b = calloc((size_t)layers, sizeof *b);
    feed consts[32];
    char names[32][16];
    ref want = make(2, x.shape);
    memcpy(want.v, x.v, sizeof(double) * (size_t)numel(&x));
    for (int l = 0; l < layers; l++) {
        w[l] = rnd(2, (int64_t[]){D, D}, -1.5 / sqrt((double)D), 1.5 / sqrt((double)D));
        b[l] = rnd(2, (int64_t[]){1, D}, -0.1, 0.1);
        snprintf(names[2 * l], sizeof names[0], "w%d", l);
        snprintf(names[2 * l + 1], sizeof names[0], "b%d", l);
        consts[2 * l] = (feed){names[2 * l], &w[l]};
        consts[2 * l + 1] = (feed){names[2 * l + 1], &b[l]};
        set(&want, r_matmul(&want, &w[l]));
        set(&want, r_binary(&want, &b[l], 0));
        set(&want, r_unary(&want, 0));
    }
    mlp_script(layers, M, D);
    mk_context *ctx = mk_context_new(NULL);
    feed in[] = {{"x", &x}};
    result r1, r2;
    int rc1 = run_model(ctx, true, consts, 2 * layers, in, 1, &want, &r1);
    show("repeated layers, first model", &r1);
    int rc2 = run_model(ctx, true, consts, 2 * layers, in, 1, &want, &r2);
    show("repeated layers, second model", &r2);
    CHECK(rc1 == 0 && rc2 == 0, "the MLP did not run");
    if (rc1 == 0 && rc2 == 0) {
        CHECK(r1.err <= tolerance(&r1) && r2.err <= tolerance(&r2), "errors %.3g, %.3g of rms",
              r1.err, r2.err);
        CHECK(r1.stats.fused_groups == layers, "fused %d of %d layers", r1.stats.fused_groups, layers);
        CHECK(r1.stats.cudnn_cache_hits == layers - 1, "%d cache hits in %d identical layers",
              r1.stats.cudnn_cache_hits, layers);
        CHECK(r2.stats.cudnn_cache_hits == r2.stats.fused_groups && r2.stats.fused_groups == layers,
              "second model: %d hits of %d groups", r2.stats.cudnn_cache_hits, r2.stats.fused_groups);
        CHECK(strstr(mk_model_fusion_report(r1.model), "cache hit:") != NULL, "report: %s",
              mk_model_fusion_report(r1.model));
    }
    result_free(&r1);
    result_free(&r2);
    mk_context_free(ctx);
    for (int l = 0; l < layers; l++) free(w[l].v), free(b[l].v);
    free(w), free(b), free(x.v), free(want.v);
}

/* [B, M, K] @ [B, K, N] + full [B, M, N] → silu, the matmul as B of the sum,
 * evaluated twice: the first evaluation is the one a race with the inputs'
 * staging spoils (test_batched_pairs); the second, its output's block holding
 * the first result, fails a plan that reads what its output held before. */
static void check_batched(mk_context *ctx, int64_t B, int64_t M, int64_t K, int64_t N) {
    ref a3 = rnd(3, (int64_t[]){B, M, K}, -1, 1), b3 = rnd(3, (int64_t[]){B, K, N}, -0.3, 0.3);
    ref r3 = rnd(3, (int64_t[]){B, M, N}, -1, 1);
    ref want = r_matmul(&a3, &b3);
    set(&want, r_binary(&want, &r3, 0));
    set(&want, r_unary(&want, 1));
    script_len = 0;
    line("$1 = InputTensor(a, float32, %s);\n$2 = InputTensor(b, float32, %s);\n", dims(&a3), dims(&b3));
    line("$3 = InputTensor(r, float32, %s);\n$4 = MatMulNode($1, $2);\n", dims(&r3));
    line("$5 = SumNode($3, $4);\n$6 = SiLUNode($5);\nresult = $6;\n");
    feed i3[] = {{"a", &a3}, {"b", &b3}, {"r", &r3}};
    char what[96];
    snprintf(what, sizeof what, "batched matmul [%lld, %lld, %lld] @ [%lld, %lld, %lld] + residual, silu",
             (long long)B, (long long)M, (long long)K, (long long)B, (long long)K, (long long)N);
    result r;
    int rc = run_model(ctx, true, NULL, 0, i3, 3, &want, &r);
    show(what, &r);
    CHECK(rc == 0, "%s did not run", what);
    if (rc == 0) {
        CHECK(r.err <= tolerance(&r), "%s: error %.3g of the output's rms (tolerance %.0e)", what,
              r.err, tolerance(&r));
        CHECK(r.stats.fused_groups >= 1, "%s: no group fused", what);
        float *in[3] = {f32(&a3), f32(&b3), f32(&r3)};
        mk_named_tensor named[3] = {{"a", in[0]}, {"b", in[1]}, {"r", in[2]}};
        mk_error *err = NULL;
        int again = mk_evaluate(r.model, named, 3, r.out, sizeof(float) * (size_t)numel(&want), &err);
        CHECK(again == 0, "%s, second evaluation: %s", what, mk_error_message(err));
        double e2 = again == 0 ? rel_err(r.out, &want) : 0;
        CHECK(e2 <= tolerance(&r), "%s, second evaluation: error %.3g of the output's rms", what, e2);
        mk_error_free(err);
        for (int k = 0; k < 3; k++) free(in[k]);
    }
    result_free(&r);
    free(a3.v), free(b3.v), free(r3.v), free(want.v);
}

/* [K] @ [K, N] + [N] → relu, and [B, M, K] @ [B, K, N] + full [B, M, N] → silu. */
static void test_ranks(void) {
    int64_t K = 4 * test_randint(4, 32), N = 4 * test_randint(4, 32);
    ref x = rnd(1, &K, -1, 1), w = rnd(2, (int64_t[]){K, N}, -0.3, 0.3), b = rnd(1, &N, -1, 1);
    ref want = r_matmul(&x, &w);
    set(&want, r_binary(&want, &b, 0));
    set(&want, r_unary(&want, 0));
    script_len = 0;
    line("$1 = InputTensor(x, float32, %s);\n$2 = ConstantTensor(w, float32, %s);\n", dims(&x), dims(&w));
    line("$3 = ConstantTensor(b, float32, %s);\n$4 = MatMulNode($1, $2);\n", dims(&b));
    line("$5 = SumNode($4, $3);\n$6 = ReLUNode($5);\nresult = $6;\n");
    mk_context *ctx = mk_context_new(NULL);
    feed c1[] = {{"w", &w}, {"b", &b}}, i1[] = {{"x", &x}};
    check_fused("vector @ matrix + bias, relu", ctx, c1, 2, i1, 1, &want, 1); /* or its tail */
    free(x.v), free(w.v), free(b.v), free(want.v);

    check_batched(ctx, test_randint(2, 5), test_randint(3, 40), K, N);
    mk_context_free(ctx);
}

/* Batches of 2, whose inputs are staged by the stage kernel (a few KB): with
 * cuDNN 9.14, engine 4 read them before that kernel had copied them, so the
 * first evaluation was wrong and the second right, until the capture fenced
 * library launches (mk_cuda_capture_launches). */
static void test_batched_pairs(void) {
    mk_context *ctx = mk_context_new(NULL);
    check_batched(ctx, 2, 29, 36, 68);
    check_batched(ctx, 2, 35, 28, 28);
    mk_context_free(ctx);
}

/* x @ permute(W) for a llama2.c weight W [N, K] (a strided view, no copy), and
 * a prologue: relu(x + c) feeding the matmul. */
static void test_views_and_prologue(void) {
    int64_t M = test_randint(2, 40), K = 4 * test_randint(4, 32), N = 4 * test_randint(4, 32);
    ref x = rnd(2, (int64_t[]){M, K}, -1, 1), wt = rnd(2, (int64_t[]){N, K}, -0.3, 0.3);
    ref b = rnd(2, (int64_t[]){1, N}, -1, 1), c = rnd(2, (int64_t[]){M, K}, -1, 1);
    ref w = make(2, (int64_t[]){K, N});
    for (int64_t i = 0; i < K; i++)
        for (int64_t j = 0; j < N; j++) w.v[i * N + j] = wt.v[j * K + i];
    ref want = r_matmul(&x, &w);
    set(&want, r_binary(&want, &b, 0));
    set(&want, r_unary(&want, 0));
    script_len = 0;
    line("$1 = InputTensor(x, float32, %s);\n$2 = ConstantTensor(wt, float32, %s);\n", dims(&x), dims(&wt));
    line("$3 = ConstantTensor(b, float32, %s);\n$4 = PermuteNode($2, [1, 0]);\n", dims(&b));
    line("$5 = MatMulNode($1, $4);\n$6 = SumNode($5, $3);\n$7 = ReLUNode($6);\nresult = $7;\n");
    mk_context *ctx = mk_context_new(NULL);
    feed consts[] = {{"wt", &wt}, {"b", &b}}, in[] = {{"x", &x}};
    check_fused("x @ permuted W + bias, relu", ctx, consts, 2, in, 1, &want, 0);

    ref h = r_binary(&x, &c, 0);
    set(&h, r_unary(&h, 0));
    set(&want, r_matmul(&h, &w));
    set(&want, r_binary(&want, &b, 0));
    script_len = 0;
    line("$1 = InputTensor(x, float32, %s);\n$2 = ConstantTensor(w, float32, %s);\n", dims(&x), dims(&w));
    line("$3 = ConstantTensor(b, float32, %s);\n$4 = InputTensor(c, float32, %s);\n", dims(&b), dims(&c));
    line("$5 = SumNode($1, $4);\n$6 = ReLUNode($5);\n$7 = MatMulNode($6, $2);\n$8 = SumNode($7, $3);\n"
         "result = $8;\n");
    feed c2[] = {{"w", &w}, {"b", &b}}, i2[] = {{"x", &x}, {"c", &c}};
    check_fused("prologue relu(x + c) @ W + b", ctx, c2, 2, i2, 2, &want, 1);
    mk_context_free(ctx);
    free(x.v), free(wt.v), free(b.v), free(c.v), free(w.v), free(want.v), free(h.v);
}

/* Every group refused (MK_CUDNN_REJECT): plain kernels, reasons in the report. */
static void test_fallback(void) {
    int64_t M = test_randint(2, 20), K = 4 * test_randint(2, 20), N = 4 * test_randint(2, 20);
    ref x = rnd(2, (int64_t[]){M, K}, -1, 1), w = rnd(2, (int64_t[]){K, N}, -0.3, 0.3);
    ref b = rnd(2, (int64_t[]){1, N}, -1, 1);
    ref want = r_matmul(&x, &w);
    set(&want, r_binary(&want, &b, 0));
    set(&want, r_unary(&want, 1));
    script_len = 0;
    line("$1 = InputTensor(x, float32, %s);\n$2 = ConstantTensor(w, float32, %s);\n", dims(&x), dims(&w));
    line("$3 = ConstantTensor(b, float32, %s);\n$4 = MatMulNode($1, $2);\n", dims(&b));
    line("$5 = SumNode($4, $3);\n$6 = SiLUNode($5);\nresult = $6;\n");
    setenv("MK_CUDNN_REJECT", "1", 1);
    mk_context *ctx = mk_context_new(NULL);
    feed consts[] = {{"w", &w}, {"b", &b}}, in[] = {{"x", &x}};
    result r;
    int rc = run_model(ctx, true, consts, 2, in, 1, &want, &r);
    unsetenv("MK_CUDNN_REJECT");
    show("every group rejected", &r);
    CHECK(rc == 0, "the model did not run");
    if (rc == 0) {
        /* the matmul group, then its Sum + SiLU tail as a chain */
        CHECK(r.stats.fused_groups == 0 && r.stats.cudnn_rejected == 2, "fused %d, rejected %d",
              r.stats.fused_groups, r.stats.cudnn_rejected);
        CHECK(r.err <= 1e-4, "plain kernels: error %.3g of rms", r.err);
        CHECK(strstr(mk_model_fusion_report(r.model), "rejected: MatMulNode $4") &&
                  strstr(mk_model_fusion_report(r.model), "MK_CUDNN_REJECT"),
              "report: %s", mk_model_fusion_report(r.model));
    }
    result_free(&r);
    mk_context_free(ctx);
    free(x.v), free(w.v), free(b.v), free(want.v);
}

/*
 * Broadcast operands of a fused Sum after a batched matmul. With the default
 * policy every pattern must be right (cuDNN gets the ones it fuses; the rest
 * run as plain kernels). With MK_CUDNN_BROADCAST=any every pattern is fused,
 * and what cuDNN computes is printed (a probe for the policy, not a check).
 */
static void test_broadcast(void) {
    int64_t B = test_randint(2, 4), M = test_randint(3, 24), K = 4 * test_randint(2, 16),
            N = 4 * test_randint(2, 16);
    ref a = rnd(3, (int64_t[]){B, M, K}, -1, 1), w = rnd(3, (int64_t[]){B, K, N}, -0.3, 0.3);
    ref mm = r_matmul(&a, &w);
    static const int patterns[][3] = {{0, 0, 1}, {0, 1, 0}, {1, 0, 1}, {0, 1, 1},
                                      {1, 1, 0}, {1, 0, 0}, {0, 0, 0}, {1, 1, 1}};
    for (int probe = 0; probe < 2; probe++) {
        if (probe) setenv("MK_CUDNN_BROADCAST", "any", 1);
        for (size_t p = 0; p < sizeof patterns / sizeof patterns[0]; p++) {
            int64_t s[3] = {patterns[p][0] ? B : 1, patterns[p][1] ? M : 1, patterns[p][2] ? N : 1};
            ref bias = rnd(3, s, -1, 1);
            ref want = r_binary(&mm, &bias, 0);
            script_len = 0;
            line("$1 = InputTensor(a, float32, %s);\n$2 = ConstantTensor(w, float32, %s);\n", dims(&a), dims(&w));
            line("$3 = ConstantTensor(b, float32, %s);\n$4 = MatMulNode($1, $2);\n", dims(&bias));
            line("$5 = SumNode($4, $3);\nresult = $5;\n");
            mk_context *ctx = mk_context_new(NULL);
            feed consts[] = {{"w", &w}, {"b", &bias}}, in[] = {{"a", &a}};
            result r;
            int rc = run_model(ctx, true, consts, 2, in, 1, &want, &r);
            bool right = rc == 0 && r.err <= tolerance(&r);
            printf("#   broadcast %s onto [%lld, %lld, %lld]%s: %s, %s (error %.2e of rms)\n",
                   dims(&bias), (long long)B, (long long)M, (long long)N,
                   probe ? " (MK_CUDNN_BROADCAST=any)" : "",
                   rc ? "failed" : r.stats.fused_groups ? "fused" : "not fused",
                   right ? "right" : "WRONG", r.err);
            if (!probe) CHECK(right, "broadcast %s: wrong with the default policy", dims(&bias));
            result_free(&r);
            mk_context_free(ctx);
            free(bias.v);
            free(want.v);
        }
    }
    unsetenv("MK_CUDNN_BROADCAST");
    free(a.v), free(w.v), free(mm.v);
}

/* ---- measurements (MK_CUDNN_BENCH=1) ----------------------------------------------------- */

static double wall_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Mean milliseconds per evaluation over enough runs to fill ~0.5 s. */
static double eval_ms(mk_model *m, const mk_named_tensor *in, size_t n_in, void *out, size_t bytes) {
    mk_evaluate(m, in, n_in, out, bytes, NULL);
    int runs = 0;
    double t0 = wall_ms(), t;
    do {
        for (int i = 0; i < 10; i++) mk_evaluate(m, in, n_in, out, bytes, NULL);
        runs += 10;
    } while ((t = wall_ms()) - t0 < 500 && runs < 100000);
    return (t - t0) / runs;
}

static void bench_model(const char *what, const char *text, const mk_named_tensor *consts,
                        size_t n_consts, const mk_named_tensor *in, size_t n_in, size_t out_bytes) {
    void *out = malloc(out_bytes);
    double ms[2] = {0, 0}, compile[2] = {0, 0};
    int fused = 0, hits = 0, tf32 = 0;
    for (int cudnn = 0; cudnn < 2; cudnn++) {
        mk_error *err = NULL;
        mk_context *ctx = mk_context_new(NULL);
        mk_compile_options o = {.device = MK_DEVICE_CUDA, .use_cudnn = cudnn};
        mk_model *m = mk_compile(ctx, text, consts, n_consts, &o, &err);
        if (!m) {
            printf("# bench %s: %s\n", what, mk_error_message(err));
            mk_error_free(err);
            mk_context_free(ctx);
            continue;
        }
        mk_stats s;
        mk_model_stats(m, &s);
        compile[cudnn] = s.compile_ms;
        if (cudnn) fused = s.fused_groups, hits = s.cudnn_cache_hits, tf32 = s.cudnn_tf32_groups;
        ms[cudnn] = eval_ms(m, in, n_in, out, out_bytes);
        mk_model_free(m);
        mk_context_free(ctx);
    }
    printf("# bench %s: compile %.1f ms plain, %.1f ms cudnn (%d groups fused, %d cache hits, "
           "%d tf32); evaluate %.1f us plain, %.1f us cudnn\n", what, compile[0], compile[1],
           fused, hits, tf32, ms[0] * 1e3, ms[1] * 1e3);
    free(out);
}

static float *filled(size_t n, double scale) {
    float *f = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) f[i] = (float)test_uniform(-scale, scale);
    return f;
}

static void bench(void) {
    /* N-layer MLPs, [64, 1024] activations: compile time shows the cache */
    int64_t M = 64, D = 1024;
    for (int layers = 1; layers <= 32; layers *= 32) {
        mlp_script(layers, M, D);
        mk_named_tensor consts[64];
        float *data[64];
        char names[64][16];
        for (int l = 0; l < layers; l++) {
            snprintf(names[2 * l], sizeof names[0], "w%d", l);
            snprintf(names[2 * l + 1], sizeof names[0], "b%d", l);
            data[2 * l] = filled((size_t)(D * D), 1.5 / sqrt((double)D));
            data[2 * l + 1] = filled((size_t)D, 0.1);
            consts[2 * l] = (mk_named_tensor){names[2 * l], data[2 * l]};
            consts[2 * l + 1] = (mk_named_tensor){names[2 * l + 1], data[2 * l + 1]};
        }
        float *x = filled((size_t)(M * D), 1);
        mk_named_tensor in[] = {{"x", x}};
        char what[64];
        snprintf(what, sizeof what, "MLP %d x [%lld, %lld]", layers, (long long)M, (long long)D);
        bench_model(what, script, consts, (size_t)(2 * layers), in, 1, sizeof(float) * (size_t)(M * D));
        for (int i = 0; i < 2 * layers; i++) free(data[i]);
        free(x);
    }
    /* the llama2-7B feed-forward block at one token: x [1, 4096], hidden 11008 */
    int64_t dim = 4096, hidden = 11008;
    script_len = 0;
    line("$1 = InputTensor(x, float32, [1, %lld]);\n", (long long)dim);
    line("$2 = ConstantTensor(w1, float32, [%lld, %lld]);\n", (long long)dim, (long long)hidden);
    line("$3 = ConstantTensor(w3, float32, [%lld, %lld]);\n", (long long)dim, (long long)hidden);
    line("$4 = ConstantTensor(w2, float32, [%lld, %lld]);\n", (long long)hidden, (long long)dim);
    line("$5 = MatMulNode($1, $2);\n$6 = SiLUNode($5);\n$7 = MatMulNode($1, $3);\n");
    line("$8 = HadamardProductNode($6, $7);\n$9 = MatMulNode($8, $4);\n$10 = SumNode($9, $1);\n");
    line("result = $10;\n");
    float *w1 = filled((size_t)(dim * hidden), 0.02), *w3 = filled((size_t)(dim * hidden), 0.02);
    float *w2 = filled((size_t)(dim * hidden), 0.02), *x = filled((size_t)dim, 1);
    mk_named_tensor consts[] = {{"w1", w1}, {"w3", w3}, {"w2", w2}}, in[] = {{"x", x}};
    bench_model("llama2-7B FFN [1, 4096] x 11008", script, consts, 3, in, 1, sizeof(float) * (size_t)dim);
    /* the same at 64 tokens (prefill-like shape) */
    script_len = 0;
    line("$1 = InputTensor(x, float32, [64, %lld]);\n", (long long)dim);
    line("$2 = ConstantTensor(w1, float32, [%lld, %lld]);\n", (long long)dim, (long long)hidden);
    line("$3 = ConstantTensor(w3, float32, [%lld, %lld]);\n", (long long)dim, (long long)hidden);
    line("$4 = ConstantTensor(w2, float32, [%lld, %lld]);\n", (long long)hidden, (long long)dim);
    line("$5 = MatMulNode($1, $2);\n$6 = SiLUNode($5);\n$7 = MatMulNode($1, $3);\n");
    line("$8 = HadamardProductNode($6, $7);\n$9 = MatMulNode($8, $4);\n$10 = SumNode($9, $1);\n");
    line("result = $10;\n");
    float *x64 = filled((size_t)(64 * dim), 1);
    mk_named_tensor in64[] = {{"x", x64}};
    bench_model("llama2-7B FFN [64, 4096] x 11008", script, consts, 3, in64, 1,
                sizeof(float) * (size_t)(64 * dim));
    free(w1), free(w3), free(w2), free(x), free(x64);
}

int main(void) {
    test_srand(test_seed());
    have_cuda = mk_cuda_available(reason, sizeof reason);
    const char *tf32 = getenv("NVIDIA_TF32_OVERRIDE");
    tf32_off = tf32 && !strcmp(tf32, "0");
    printf("# %s; cuda: %s\n", mk_build_info(), reason);
    RUN(test_errors);
    if (!have_cuda) {
        SKIP(test_matmul_bias_relu, reason);
        SKIP(test_swiglu, reason);
        SKIP(test_pointwise_chain, reason);
        SKIP(test_chain_30, reason);
        SKIP(test_repeated_layers, reason);
        SKIP(test_ranks, reason);
        SKIP(test_batched_pairs, reason);
        SKIP(test_views_and_prologue, reason);
        SKIP(test_fallback, reason);
        SKIP(test_broadcast, reason);
        return test_summary("cudnn");
    }
    RUN(test_matmul_bias_relu);
    RUN(test_swiglu);
    RUN(test_pointwise_chain);
    RUN(test_chain_30);
    RUN(test_repeated_layers);
    RUN(test_ranks);
    RUN(test_batched_pairs);
    RUN(test_views_and_prologue);
    RUN(test_fallback);
    RUN(test_broadcast);
    const char *b = getenv("MK_CUDNN_BENCH");
    if (b && *b && strcmp(b, "0")) bench();
    return test_summary("cudnn");
}
