/*
 * ops_test.c — every op on the CPU device, through the public API only: a
 * script is written, compiled with random constants and evaluated with random
 * inputs, and the output is compared with a plain double-precision loop
 * written here, independently of core/cpu/.
 *
 * Values are uniform and never zero; shapes are random; the seed is printed
 * (replay with MK_SEED=...). float32 results must satisfy
 * |got - want| <= atol + rtol·|want|, int64 results must be exact.
 *
 * Every test runs twice: with the default passes (permutes into MatMulNode
 * are strided views) and with no_passes (every permute is a copy).
 *
 *   make build/tests/ops_test && ./build/tests/ops_test
 *   valgrind -q --error-exitcode=99 ./build/tests/ops_test
 */
#include "moonkaas.h"
#include "test.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>

static mk_context *ctx;
/* Each test runs once with the default passes and once without (no views). */
static bool no_passes;

#define F32 MK_DTYPE_FLOAT32
#define I64 MK_DTYPE_INT64
#define ATOL 1e-5
#define RTOL 1e-4
/* int64 values reach 2^40 (2^25 where they are multiplied): beyond float32 and int32,
 * still exact in a double. */
#define BIG_I64 1099511627776.0
#define MUL_I64 33554432.0

/* ---- host tensors -------------------------------------------------------- */

/* A dense row-major host tensor with its values also kept as doubles (exact). */
typedef struct {
    mk_dtype dtype;
    int rank;
    int64_t shape[4];
    int64_t n;
    void *data; /* float or int64_t [n] */
    double *v;  /* the same values [n] */
} ht;

static int64_t shape_numel(int rank, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= shape[i];
    return n;
}

static ht ht_new(mk_dtype dt, int rank, const int64_t *shape) {
    ht t = {.dtype = dt, .rank = rank};
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)rank);
    t.n = shape_numel(rank, shape);
    t.data = calloc((size_t)t.n, 8);
    t.v = calloc((size_t)t.n, sizeof(double));
    return t;
}

static void ht_set(ht *t, int64_t i, double x) {
    if (t->dtype == F32) {
        ((float *)t->data)[i] = (float)x;
        t->v[i] = (float)x;
    } else {
        ((int64_t *)t->data)[i] = (int64_t)x;
        t->v[i] = (double)(int64_t)x;
    }
}

/* Uniform in ±[lo, hi) for float32 (never zero), nonzero integers in [-hi, hi] for int64. */
static double rand_value(mk_dtype dt, double lo, double hi) {
    double s = test_randint(0, 1) ? 1.0 : -1.0;
    if (dt == F32)
        return s * test_uniform(lo, hi);
    return s * (double)test_randint(1, (int64_t)hi);
}

static ht ht_rand(mk_dtype dt, int rank, const int64_t *shape) {
    ht t = ht_new(dt, rank, shape);
    for (int64_t i = 0; i < t.n; i++)
        ht_set(&t, i, rand_value(dt, 0.1, dt == F32 ? 1.0 : BIG_I64));
    return t;
}

static ht ht_rand_range(mk_dtype dt, int rank, const int64_t *shape, double lo, double hi) {
    ht t = ht_new(dt, rank, shape);
    for (int64_t i = 0; i < t.n; i++)
        ht_set(&t, i, rand_value(dt, lo, hi));
    return t;
}

static ht ht_scalar_i64(int64_t x) {
    ht t = ht_new(I64, 1, (int64_t[]){1});
    ht_set(&t, 0, (double)x);
    return t;
}

static void ht_free(ht *t) {
    free(t->data);
    free(t->v);
    t->data = t->v = NULL;
}

static const char *dtname(mk_dtype dt) { return dt == F32 ? "float32" : "int64"; }

/* "[2, 3, 4]"; a few rotating buffers so one printf can hold several. */
static const char *shp(int rank, const int64_t *shape) {
    static char bufs[8][64];
    static int k;
    char *b = bufs[k++ % 8];
    int used = sprintf(b, "[");
    for (int i = 0; i < rank; i++)
        used += sprintf(b + used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    sprintf(b + used, "]");
    return b;
}

/* Multi-index of flat index i in a row-major shape. */
static void unravel(int rank, const int64_t *shape, int64_t i, int64_t *idx) {
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = i % shape[d];
        i /= shape[d];
    }
}

static int64_t ravel(int rank, const int64_t *shape, const int64_t *idx) {
    int64_t i = 0;
    for (int d = 0; d < rank; d++)
        i = i * shape[d] + idx[d];
    return i;
}

/* ---- scripts and models -------------------------------------------------- */

typedef struct {
    char text[8192];
    size_t len;
} script;

static void say(script *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(script *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(s->text + s->len, sizeof s->text - s->len, fmt, ap);
    va_end(ap);
    if (k > 0)
        s->len += (size_t)k;
    if (s->len < sizeof s->text - 1)
        s->text[s->len++] = '\n', s->text[s->len] = 0;
}

static mk_model *compile(const script *s, const mk_named_tensor *c, size_t nc) {
    mk_error *err = NULL;
    mk_compile_options opts = {.device = MK_DEVICE_CPU, .no_passes = no_passes};
    mk_model *m = mk_compile(ctx, s->text, c, nc, &opts, &err);
    CHECK(m != NULL, "compile failed (no_passes=%d): %s\n--- script ---\n%s", no_passes,
          err ? mk_error_message(err) : "(no error)", s->text);
    mk_error_free(err);
    return m;
}

static bool evaluate(mk_model *m, const mk_named_tensor *in, size_t n_in, ht *out,
                     const script *s) {
    mk_error *err = NULL;
    size_t bytes = (size_t)out->n * mk_dtype_size(out->dtype);
    int rc = mk_evaluate(m, in, n_in, out->data, bytes, &err);
    CHECK(rc == 0, "evaluate failed: %s\n--- script ---\n%s",
          err ? mk_error_message(err) : "(no error)", s->text);
    mk_error_free(err);
    if (rc == 0)
        for (int64_t i = 0; i < out->n; i++)
            out->v[i] = out->dtype == F32 ? ((float *)out->data)[i]
                                          : (double)((int64_t *)out->data)[i];
    return rc == 0;
}

/* Compiles, evaluates once and frees: the output lands in `out` (shape set by the caller). */
static bool run_once(const script *s, const mk_named_tensor *c, size_t nc,
                     const mk_named_tensor *in, size_t n_in, ht *out) {
    mk_model *m = compile(s, c, nc);
    if (!m)
        return false;
    bool ok = evaluate(m, in, n_in, out, s);
    mk_model_free(m);
    return ok;
}

/* Compares got with want; reports the first mismatch (and how many). */
static bool same(const char *what, const ht *got, const double *want, double atol, double rtol,
                 const script *s) {
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < got->n; i++) {
        bool ok = got->dtype == I64 ? got->v[i] == want[i]
                                    : test_close(got->v[i], want[i], atol, rtol);
        if (!ok && bad++ == 0)
            first = i;
    }
    CHECK(bad == 0, "%s (no_passes=%d): %lld of %lld wrong, first at %lld: got %.9g want %.9g\n"
          "--- script ---\n%s",
          what, no_passes, (long long)bad, (long long)got->n, (long long)first,
          bad ? got->v[first] : 0.0, bad ? want[first] : 0.0, s ? s->text : "");
    return bad == 0;
}

/* Evaluation that must fail with MK_ERR_EVAL naming `node` ("ReplaceSliceNode:"). */
static void expect_eval_error(mk_model *m, const mk_named_tensor *in, size_t n_in, ht *out,
                              const char *node, const char *why) {
    mk_error *err = NULL;
    int rc = mk_evaluate(m, in, n_in, out->data, (size_t)out->n * mk_dtype_size(out->dtype),
                         &err);
    CHECK(rc != 0, "%s: evaluation succeeded", why);
    if (rc == 0)
        return;
    CHECK(err != NULL, "%s: no error object", why);
    if (!err)
        return;
    CHECK(mk_error_code_of(err) == MK_ERR_EVAL, "%s: code %d, want MK_ERR_EVAL (%s)", why,
          (int)mk_error_code_of(err), mk_error_message(err));
    CHECK(strstr(mk_error_message(err), node) != NULL, "%s: message does not name '%s': %s",
          why, node, mk_error_message(err));
    CHECK(strstr(mk_error_message(err), "evaluation error") != NULL,
          "%s: message lacks the kind prefix: %s", why, mk_error_message(err));
    CHECK(mk_error_line(err) > 0 && strncmp(mk_error_message(err), "script:", 7) == 0,
          "%s: message does not give the node's line: %s", why, mk_error_message(err));
    mk_error_free(err);
}

static void random_shape(int rank, int64_t lo, int64_t hi, int64_t *shape) {
    for (int d = 0; d < rank; d++)
        shape[d] = test_randint(lo, hi);
}

/* ---- elementwise: the binary ops (second operand broadcast) -------------- */

typedef struct {
    const char *name;
    char op;        /* + - * / */
    bool takes_i64; /* int64 too (+ - * wrap around) */
} binop;

static const binop BINOPS[] = {
    {"SumNode", '+', true},
    {"HadamardProductNode", '*', true},
    {"SubNode", '-', true},
    {"DivNode", '/', false},
};
#define N_BINOPS ((int)(sizeof BINOPS / sizeof BINOPS[0]))

/* One rounding of exact float32 operands: well within 1e-6 of the double result. */
#define BIN_ATOL 1e-30
#define BIN_RTOL 1e-6

static double ref_binop(char op, double a, double b) {
    switch (op) {
    case '+': return a + b;
    case '-': return a - b;
    case '*': return a * b;
    default: return a / b;
    }
}

/* Largest |value| of int64 operands: products stay exact in a double. */
static double i64_range(char op) { return op == '*' ? MUL_I64 : BIG_I64; }

/* want[i] = a[i] op b[i with b's 1-dims pinned to 0] over a's shape. */
static void ref_broadcast(char op, const ht *a, const ht *b, double *want) {
    for (int64_t i = 0; i < a->n; i++) {
        int64_t idx[4];
        unravel(a->rank, a->shape, i, idx);
        for (int d = 0; d < a->rank; d++)
            if (b->shape[d] == 1)
                idx[d] = 0;
        want[i] = ref_binop(op, a->v[i], b->v[ravel(b->rank, b->shape, idx)]);
    }
}

/*
 * a [shape] OP b [shape with the dims in `mask` set to 1], for every mask over
 * ranks 1–4, every binary op, both dtypes where the op takes int64; b a
 * constant or an input.
 */
static void test_binary_broadcast(void) {
    for (int rank = 1; rank <= 4; rank++)
        for (int mask = 0; mask < (1 << rank); mask++)
            for (int op = 0; op < N_BINOPS; op++)
                for (int dt = 0; dt < (BINOPS[op].takes_i64 ? 2 : 1); dt++) {
                    mk_dtype dtype = dt ? I64 : F32;
                    int64_t sa[4], sb[4];
                    random_shape(rank, 1, rank <= 2 ? 9 : 5, sa);
                    for (int d = 0; d < rank; d++)
                        sb[d] = (mask >> d) & 1 ? 1 : sa[d];
                    bool b_const = test_randint(0, 1);
                    double hi = dtype == F32 ? 1.0 : i64_range(BINOPS[op].op);
                    ht a = ht_rand_range(dtype, rank, sa, 0.1, hi);
                    ht b = ht_rand_range(dtype, rank, sb, 0.1, hi);
                    ht out = ht_new(dtype, rank, sa);
                    double *want = malloc(sizeof(double) * (size_t)a.n);
                    ref_broadcast(BINOPS[op].op, &a, &b, want);
                    script s = {0};
                    say(&s, "$1 = InputTensor(a, %s, %s);", dtname(dtype), shp(rank, sa));
                    say(&s, "$2 = %s(b, %s, %s);", b_const ? "ConstantTensor" : "InputTensor",
                        dtname(dtype), shp(rank, sb));
                    say(&s, "$3 = %s($1, $2);", BINOPS[op].name);
                    say(&s, "result = $3;");
                    mk_named_tensor an = {"a", a.data}, bn = {"b", b.data};
                    mk_named_tensor ins[2] = {an, bn};
                    if (run_once(&s, b_const ? &bn : NULL, b_const, ins, b_const ? 1 : 2, &out))
                        same(BINOPS[op].name, &out, want, BIN_ATOL, BIN_RTOL, &s);
                    free(want);
                    ht_free(&a), ht_free(&b), ht_free(&out);
                }
}

/* Large enough for the kernels' threaded paths: b contiguous, a row, a column, a scalar. */
static void test_binary_large(void) {
    int64_t sa[2] = {test_randint(150, 200), test_randint(250, 300)};
    int64_t pats[4][2] = {{sa[0], sa[1]}, {1, sa[1]}, {sa[0], 1}, {1, 1}};
    for (int p = 0; p < 4; p++)
        for (int op = 0; op < N_BINOPS; op++)
            for (int dt = 0; dt < (BINOPS[op].takes_i64 ? 2 : 1); dt++) {
                mk_dtype dtype = dt ? I64 : F32;
                double hi = dtype == F32 ? 1.0 : i64_range(BINOPS[op].op);
                ht a = ht_rand_range(dtype, 2, sa, 0.1, hi);
                ht b = ht_rand_range(dtype, 2, pats[p], 0.1, hi);
                ht out = ht_new(dtype, 2, sa);
                double *want = malloc(sizeof(double) * (size_t)a.n);
                for (int64_t i = 0; i < sa[0]; i++)
                    for (int64_t j = 0; j < sa[1]; j++) {
                        double bv = b.v[(pats[p][0] == 1 ? 0 : i) * pats[p][1] +
                                        (pats[p][1] == 1 ? 0 : j)];
                        want[i * sa[1] + j] = ref_binop(BINOPS[op].op, a.v[i * sa[1] + j], bv);
                    }
                script s = {0};
                say(&s, "$1 = InputTensor(a, %s, %s);", dtname(dtype), shp(2, sa));
                say(&s, "$2 = InputTensor(b, %s, %s);", dtname(dtype), shp(2, pats[p]));
                say(&s, "$3 = %s($1, $2);", BINOPS[op].name);
                say(&s, "result = $3;");
                mk_named_tensor ins[2] = {{"a", a.data}, {"b", b.data}};
                if (run_once(&s, NULL, 0, ins, 2, &out))
                    same("large binary", &out, want, BIN_ATOL, BIN_RTOL, &s);
                free(want);
                ht_free(&a), ht_free(&b), ht_free(&out);
            }
}

/* ---- elementwise: the unary ops ------------------------------------------ */

static double ref_relu(double x) { return x > 0 ? x : 0; }
static double ref_silu(double x) { return x / (1.0 + exp(-x)); }
static double ref_exp(double x) { return exp(x); }
static double ref_tanh(double x) { return tanh(x); }
static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
/* The tanh form: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). */
static double ref_gelu(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

typedef struct {
    const char *name;
    double (*ref)(double);
    bool takes_i64;
    /* float32 libm-grade functions: 2e-6 relative. GELU's 1 + tanh cancels for
     * x < 0, where its error is absolute (about |x|·1e-7). */
    double atol, rtol;
    double hi, wide; /* |x| of random values: usual, and wide (large tensors) */
} unop;

static const unop UNOPS[] = {
    {"ReLUNode", ref_relu, true, 0, 0, 6.0, 1e6},
    {"SiLUNode", ref_silu, false, 1e-30, 2e-6, 6.0, 80.0},
    {"ExpNode", ref_exp, false, 1e-30, 2e-6, 6.0, 85.0},
    {"TanhNode", ref_tanh, false, 1e-30, 2e-6, 4.0, 20.0},
    {"SigmoidNode", ref_sigmoid, false, 1e-30, 2e-6, 8.0, 80.0},
    {"GELUNode", ref_gelu, false, 2e-6, 2e-6, 6.0, 20.0},
};
#define N_UNOPS ((int)(sizeof UNOPS / sizeof UNOPS[0]))

/* Every unary op over ranks 1–4, small and large (threaded); int64 where taken. */
static void test_unary(void) {
    for (int u = 0; u < N_UNOPS; u++)
        for (int dt = 0; dt < (UNOPS[u].takes_i64 ? 2 : 1); dt++)
            for (int rank = 1; rank <= 4; rank++)
                for (int big = 0; big < 2; big++) {
                    int64_t sh[4];
                    random_shape(rank, 1, 6, sh);
                    if (big)
                        sh[0] = 40000 / shape_numel(rank - 1, sh + 1) + 1;
                    mk_dtype dtype = dt ? I64 : F32;
                    ht x = dtype == F32
                               ? ht_rand_range(dtype, rank, sh, 0.05,
                                               big ? UNOPS[u].wide : UNOPS[u].hi)
                               : ht_rand(dtype, rank, sh);
                    ht out = ht_new(dtype, rank, sh);
                    double *want = malloc(sizeof(double) * (size_t)x.n);
                    for (int64_t i = 0; i < x.n; i++)
                        want[i] = UNOPS[u].ref(x.v[i]);
                    script s = {0};
                    say(&s, "$1 = InputTensor(x, %s, %s);", dtname(dtype), shp(rank, sh));
                    say(&s, "$2 = %s($1);", UNOPS[u].name);
                    say(&s, "result = $2;");
                    mk_named_tensor in = {"x", x.data};
                    if (run_once(&s, NULL, 0, &in, 1, &out))
                        same(UNOPS[u].name, &out, want, UNOPS[u].atol, UNOPS[u].rtol, &s);
                    free(want);
                    ht_free(&x), ht_free(&out);
                }
}

/* ---- elementwise: special values ----------------------------------------- */

/*
 * got against the double result: NaN where it is NaN, the infinity where the
 * result is beyond float32 (exp(100), 1e30 / 1e-30), else atol + rtol·|want|
 * (results under float32's normal range pass through atol).
 */
static bool close_special(double got, double want, double atol, double rtol) {
    if (isnan(want))
        return isnan(got);
    float wf = (float)want;
    if (isinf(wf))
        return got == (double)wf;
    return test_close(got, want, atol, rtol);
}

/* x [n] through `op`; the reference `want` computed by the caller. */
static void special_case(const char *op, int n_in, const float *a, const float *b, int n,
                         double atol, double rtol, double (*ref1)(double), char bop) {
    script s = {0};
    say(&s, "$1 = InputTensor(a, float32, [%d]);", n);
    if (n_in == 2) {
        say(&s, "$2 = InputTensor(b, float32, [%d]);", n);
        say(&s, "$3 = %s($1, $2);", op);
        say(&s, "result = $3;");
    } else {
        say(&s, "$2 = %s($1);", op);
        say(&s, "result = $2;");
    }
    ht out = ht_new(F32, 1, (int64_t[]){n});
    mk_named_tensor ins[2] = {{"a", a}, {"b", b}};
    if (run_once(&s, NULL, 0, ins, (size_t)n_in, &out))
        for (int i = 0; i < n; i++) {
            double want = n_in == 2 ? ref_binop(bop, a[i], b[i]) : ref1(a[i]);
            CHECK(close_special(out.v[i], want, atol, rtol),
                  "%s (no_passes=%d) at %d: x = %.9g%s%.9g: got %.9g want %.9g", op, no_passes, i,
                  (double)a[i], n_in == 2 ? ", y = " : "", n_in == 2 ? (double)b[i] : 0.0,
                  out.v[i], want);
        }
    ht_free(&out);
}

/* Overflow, underflow, saturation, infinities and NaN, one op at a time. */
static void test_special_values(void) {
    const float inf = INFINITY, nan = NAN;
    /* Results below float32's normal range (exp(-100), sigmoid(-100)) pass
     * through this atol: a denormal or a flushed zero are both right. */
    const double tiny = 1e-37;
    struct {
        const char *op;
        double (*ref)(double);
        double atol;
        float x[16];
        int n;
    } un[] = {
        {"ExpNode", ref_exp, tiny,
         {100, -100, 89, 88.5f, -87, -103, 1e-20f, -1e-20f, 20, -20, nan, inf, -inf}, 13},
        {"TanhNode", ref_tanh, tiny,
         {20, -20, 100, -100, 9.5f, -9.5f, 1e-20f, -1e-20f, 1e-4f, nan, inf, -inf}, 12},
        {"SigmoidNode", ref_sigmoid, tiny,
         {100, -100, 80, -80, 20, -20, 1e-20f, -1e-20f, nan, inf, -inf}, 11},
        {"GELUNode", ref_gelu, 2e-6, {100, -100, 10, -10, 1e13f, -1e13f, 1e-20f, -1e-20f, nan, inf},
         10},
        {"SiLUNode", ref_silu, tiny, {100, -100, -80, 20, 1e-20f, -1e-20f, nan, inf}, 8},
        {"ReLUNode", ref_relu, 0, {1e30f, -1e30f, 1e-30f, -1e-30f, inf, -inf, 3.5f, -2.25f}, 8},
    };
    for (size_t k = 0; k < sizeof un / sizeof un[0]; k++)
        special_case(un[k].op, 1, un[k].x, NULL, un[k].n, un[k].atol, un[k].op[0] == 'R' ? 0 : 2e-6,
                     un[k].ref, 0);

    /* division by values near zero (finite, overflowing, underflowing), by zero and infinity */
    float da[] = {1, -0.5f, 0.75f, 1e30f, -1e30f, 1e-30f, 3, inf, 1, nan, 1, -1};
    float db[] = {1e-30f, 1e-37f, -3e-38f, 1e-30f, 1e-30f, 1e30f, 7, 2, inf, 1, 0, 0};
    special_case("DivNode", 2, da, db, 12, tiny, BIN_RTOL, NULL, '/');
    /* near-zero divisors drawn at random: large finite quotients */
    float ra[16], rb[16];
    for (int i = 0; i < 16; i++) {
        ra[i] = (float)rand_value(F32, 0.1, 1.0);
        rb[i] = (float)(rand_value(F32, 1.0, 10.0) * pow(10.0, -(double)test_randint(20, 37)));
    }
    special_case("DivNode", 2, ra, rb, 16, tiny, BIN_RTOL, NULL, '/');
    /* subtraction overflowing to ±inf, exact cancellation, inf - inf */
    float sa[] = {3e38f, -3e38f, 1.00000012f, 1e-30f, inf, inf, 2.5f};
    float sb[] = {-3e38f, 3e38f, 1, 1.00000012e-30f, 1, inf, nan};
    special_case("SubNode", 2, sa, sb, 7, tiny, BIN_RTOL, NULL, '-');
}

/* ---- int64: wraparound --------------------------------------------------- */

static int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t wrap_sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }

/* a (op) b over [n] with b [n] or b [1]; compared exactly as int64 (not through doubles). */
static void wrap_case(const char *op, int64_t (*ref)(int64_t, int64_t), const int64_t *a,
                      const int64_t *b, int64_t n, int64_t nb) {
    script s = {0};
    say(&s, "$1 = InputTensor(a, int64, [%lld]);", (long long)n);
    say(&s, "$2 = InputTensor(b, int64, [%lld]);", (long long)nb);
    say(&s, "$3 = %s($1, $2);", op);
    say(&s, "result = $3;");
    mk_model *m = compile(&s, NULL, 0);
    if (!m)
        return;
    int64_t *got = malloc(sizeof(int64_t) * (size_t)n);
    mk_named_tensor ins[2] = {{"a", a}, {"b", b}};
    mk_error *err = NULL;
    int rc = mk_evaluate(m, ins, 2, got, sizeof(int64_t) * (size_t)n, &err);
    CHECK(rc == 0, "%s: %s", op, mk_error_message(err));
    for (int64_t i = 0; rc == 0 && i < n; i++) {
        int64_t want = ref(a[i], b[nb == 1 ? 0 : i]);
        CHECK(got[i] == want, "%s (no_passes=%d) at %lld: %lld, %lld: got %lld want %lld", op,
              no_passes, (long long)i, (long long)a[i], (long long)b[nb == 1 ? 0 : i],
              (long long)got[i], (long long)want);
        if (got[i] != want)
            break;
    }
    mk_error_free(err);
    free(got);
    mk_model_free(m);
}

static void test_int64_wraparound(void) {
    enum { N = 64 };
    int64_t a[N] = {INT64_MIN, INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN + 5, -3, 7, INT64_MAX - 1};
    int64_t b[N] = {1, -1, INT64_MAX, INT64_MIN, 10, INT64_MAX, INT64_MIN, -2};
    for (int i = 8; i < N; i++) { /* anywhere in the range, never zero */
        do a[i] = (int64_t)test_rand_u64(); while (a[i] == 0);
        do b[i] = (int64_t)test_rand_u64(); while (b[i] == 0);
    }
    wrap_case("SubNode", wrap_sub, a, b, N, N);
    wrap_case("SumNode", wrap_add, a, b, N, N);
    /* one b for all: INT64_MIN or INT64_MAX against every a */
    int64_t bmin = INT64_MIN, bmax = INT64_MAX;
    wrap_case("SubNode", wrap_sub, a, &bmin, N, 1);
    wrap_case("SubNode", wrap_sub, a, &bmax, N, 1);
    wrap_case("SumNode", wrap_add, a, &bmax, N, 1);
}

/* ---- elementwise: complex_mul -------------------------------------------- */

/* a [..., 2] * b [..., 2] as complex numbers, b broadcast over every pattern of 1-dims. */
static void test_complex_mul(void) {
    for (int rank = 1; rank <= 4; rank++)
        for (int mask = 0; mask < (1 << (rank - 1)); mask++) {
            int64_t sa[4], sb[4];
            random_shape(rank, 1, rank <= 2 ? 40 : 6, sa);
            sa[rank - 1] = 2;
            for (int d = 0; d < rank; d++)
                sb[d] = (mask >> d) & 1 ? 1 : sa[d];
            ht a = ht_rand(F32, rank, sa), b = ht_rand(F32, rank, sb);
            ht out = ht_new(F32, rank, sa);
            double *want = malloc(sizeof(double) * (size_t)a.n);
            for (int64_t i = 0; i < a.n; i += 2) {
                int64_t idx[4];
                unravel(rank, sa, i, idx);
                for (int d = 0; d < rank; d++)
                    if (sb[d] == 1)
                        idx[d] = 0;
                int64_t j = ravel(rank, sb, idx);
                double ar = a.v[i], ai = a.v[i + 1], br = b.v[j], bi = b.v[j + 1];
                want[i] = ar * br - ai * bi;
                want[i + 1] = ar * bi + ai * br;
            }
            script s = {0};
            say(&s, "$1 = InputTensor(a, float32, %s);", shp(rank, sa));
            say(&s, "$2 = ConstantTensor(f, float32, %s);", shp(rank, sb));
            say(&s, "$3 = ComplexHadamardProductNode($1, $2);");
            say(&s, "result = $3;");
            mk_named_tensor in = {"a", a.data}, c = {"f", b.data};
            if (run_once(&s, &c, 1, &in, 1, &out))
                same("ComplexHadamardProductNode", &out, want, ATOL, RTOL, &s);
            free(want);
            ht_free(&a), ht_free(&b), ht_free(&out);
        }
}

/* ---- matmul -------------------------------------------------------------- */

/*
 * The stored form of a logical tensor L [shape] seen through PermuteNode(S, perm):
 * L.shape[d] = S.shape[perm[d]], L[idx] = S[sidx] with sidx[perm[d]] = idx[d].
 */
static ht store_permuted(const ht *L, const int *perm) {
    int64_t ss[4];
    for (int d = 0; d < L->rank; d++)
        ss[perm[d]] = L->shape[d];
    ht S = ht_new(L->dtype, L->rank, ss);
    for (int64_t i = 0; i < L->n; i++) {
        int64_t idx[4], sidx[4];
        unravel(L->rank, L->shape, i, idx);
        for (int d = 0; d < L->rank; d++)
            sidx[perm[d]] = idx[d];
        ht_set(&S, ravel(L->rank, ss, sidx), L->v[i]);
    }
    return S;
}

static bool perm_is_identity(int rank, const int *perm) {
    for (int d = 0; d < rank; d++)
        if (perm[d] != d)
            return false;
    return true;
}

static const char *perm_str(int rank, const int *perm) {
    int64_t p[4];
    for (int d = 0; d < rank; d++)
        p[d] = perm[d];
    return shp(rank, p);
}

/* want [B?, m, n] = A @ B in double, for logical (unpermuted) operands. */
static void ref_matmul(const ht *A, const ht *Bm, double *want) {
    int64_t batches = A->rank == 3 ? A->shape[0] : 1;
    int64_t m = A->rank == 1 ? 1 : A->shape[A->rank - 2], k = A->shape[A->rank - 1];
    int64_t n = Bm->shape[Bm->rank - 1];
    for (int64_t t = 0; t < batches; t++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double acc = 0;
                for (int64_t q = 0; q < k; q++)
                    acc += A->v[(t * m + i) * k + q] * Bm->v[(t * k + q) * n + j];
                want[(t * m + i) * n + j] = acc;
            }
}

/*
 * A @ B where A and B reach MatMulNode through PermuteNode(stored, perm) (no
 * permute for the identity), each a constant or an input.
 */
static void matmul_case(int rank_a, const int64_t *sa, const int *pa, const int64_t *sb,
                        const int *pb, const char *what) {
    int rank_b = rank_a == 1 ? 2 : rank_a;
    ht A = ht_rand(F32, rank_a, sa), Bm = ht_rand(F32, rank_b, sb);
    int64_t so[3], k = sa[rank_a - 1];
    int rank_o = rank_a;
    for (int d = 0; d < rank_a - 1; d++)
        so[d] = sa[d];
    so[rank_o - 1] = sb[rank_b - 1];
    ht out = ht_new(F32, rank_o, so);
    double *want = malloc(sizeof(double) * (size_t)out.n);
    ref_matmul(&A, &Bm, want);

    ht SA = store_permuted(&A, pa), SB = store_permuted(&Bm, pb);
    bool a_const = test_randint(0, 1), b_const = test_randint(0, 1);
    script s = {0};
    say(&s, "# %s", what);
    say(&s, "$1 = %s(a, float32, %s);", a_const ? "ConstantTensor" : "InputTensor",
        shp(rank_a, SA.shape));
    say(&s, "$2 = %s(b, float32, %s);", b_const ? "ConstantTensor" : "InputTensor",
        shp(rank_b, SB.shape));
    int ra = 1, rb = 2;
    if (!perm_is_identity(rank_a, pa)) {
        say(&s, "$3 = PermuteNode($1, %s);", perm_str(rank_a, pa));
        ra = 3;
    }
    if (!perm_is_identity(rank_b, pb)) {
        say(&s, "$4 = PermuteNode($2, %s);", perm_str(rank_b, pb));
        rb = 4;
    }
    say(&s, "$5 = %s($%d, $%d);", test_randint(0, 3) ? "MatMulNode" : "MulNode", ra, rb);
    say(&s, "result = $5;");
    mk_named_tensor cs[2], ins[2];
    size_t nc = 0, ni = 0;
    mk_named_tensor an = {"a", SA.data}, bn = {"b", SB.data};
    if (a_const) cs[nc++] = an; else ins[ni++] = an;
    if (b_const) cs[nc++] = bn; else ins[ni++] = bn;
    if (run_once(&s, cs, nc, ins, ni, &out))
        same(what, &out, want, 2e-5 * sqrt((double)k), RTOL, &s);
    free(want);
    ht_free(&A), ht_free(&Bm), ht_free(&SA), ht_free(&SB), ht_free(&out);
}

static const int PERM3[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};

static void test_matmul_shapes(void) {
    const int id[3] = {0, 1, 2}, tr[2] = {1, 0};
    for (int big = 0; big < 2; big++) {
        int64_t lo = big ? 70 : 1, hi = big ? 130 : 12;
        int64_t k = test_randint(lo, hi), n = test_randint(lo, hi), m = test_randint(lo, hi);
        int64_t batches = test_randint(1, big ? 3 : 6);
        /* [k] @ [k, n], B normal and transposed (x @ W^T) */
        for (int t = 0; t < 2; t++)
            matmul_case(1, (int64_t[]){k}, id, (int64_t[]){k, n}, t ? tr : id, "[k]@[k,n]");
        /* [m, k] @ [k, n], every transposition; also m == 1 */
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                matmul_case(2, (int64_t[]){m, k}, ta ? tr : id, (int64_t[]){k, n}, tb ? tr : id,
                            "[m,k]@[k,n]");
                matmul_case(2, (int64_t[]){1, k}, ta ? tr : id, (int64_t[]){k, n}, tb ? tr : id,
                            "[1,k]@[k,n]");
                matmul_case(2, (int64_t[]){m, k}, ta ? tr : id, (int64_t[]){k, 1}, tb ? tr : id,
                            "[m,k]@[k,1]");
            }
        /* [B, m, k] @ [B, k, n], every stored layout of both */
        for (int pa = 0; pa < 6; pa++)
            for (int pb = 0; pb < 6; pb++)
                if (!big || (pa + pb) % 5 == 0)
                    matmul_case(3, (int64_t[]){batches, m, k}, PERM3[pa],
                                (int64_t[]){batches, k, n}, PERM3[pb], "[B,m,k]@[B,k,n]");
    }
    /* matrix-vector shapes (at most MK_MATVEC_ROWS rows) with n past the CPU's
     * register blocks of columns (256 with AVX-512), so blocks, single vectors
     * and a masked tail each take part */
    for (int r = 0; r < 3; r++) {
        int64_t m = test_randint(1, 4), k = test_randint(1, 300), n = test_randint(250, 600);
        for (int tb = 0; tb < 2; tb++)
            matmul_case(2, (int64_t[]){m, k}, id, (int64_t[]){k, n}, tb ? tr : id, "[m<=4,k]@[k,n>=250]");
    }
}

/*
 * llama2's single-token attention over a KV cache [seq, heads, hd]:
 * scores [h, 1, seq] = q [h, 1, hd] @ K viewed [h, hd, seq];
 * out [h, 1, hd] = scores @ V viewed [h, seq, hd]. Also x @ W^T with W [out, in].
 */
static void test_matmul_attention(void) {
    int64_t seq = test_randint(5, 40), h = test_randint(2, 8), hd = test_randint(4, 24);
    int64_t kv_shape[3] = {seq, h, hd};
    ht K = ht_rand(F32, 3, kv_shape), V = ht_rand(F32, 3, kv_shape);
    ht q = ht_rand(F32, 3, (int64_t[]){h, 1, hd});
    ht att = ht_rand(F32, 3, (int64_t[]){h, 1, seq});
    ht scores = ht_new(F32, 3, (int64_t[]){h, 1, seq}), mixed = ht_new(F32, 3, (int64_t[]){h, 1, hd});
    double *want_s = malloc(sizeof(double) * (size_t)scores.n);
    double *want_m = malloc(sizeof(double) * (size_t)mixed.n);
    for (int64_t a = 0; a < h; a++) {
        for (int64_t t = 0; t < seq; t++) {
            double acc = 0;
            for (int64_t d = 0; d < hd; d++)
                acc += q.v[a * hd + d] * K.v[(t * h + a) * hd + d];
            want_s[a * seq + t] = acc;
        }
        for (int64_t d = 0; d < hd; d++) {
            double acc = 0;
            for (int64_t t = 0; t < seq; t++)
                acc += att.v[a * seq + t] * V.v[(t * h + a) * hd + d];
            want_m[a * hd + d] = acc;
        }
    }
    script s = {0};
    say(&s, "$1 = InputTensor(q, float32, [%lld, 1, %lld]);", (long long)h, (long long)hd);
    say(&s, "$2 = InputTensor(k, float32, %s);", shp(3, kv_shape));
    say(&s, "$3 = PermuteNode($2, [1, 2, 0]);");
    say(&s, "$4 = MatMulNode($1, $3);");
    say(&s, "result = $4;");
    mk_named_tensor ins[2] = {{"q", q.data}, {"k", K.data}};
    if (run_once(&s, NULL, 0, ins, 2, &scores))
        same("q @ K^T", &scores, want_s, 2e-5 * sqrt((double)hd), RTOL, &s);

    script s2 = {0};
    say(&s2, "$1 = InputTensor(att, float32, [%lld, 1, %lld]);", (long long)h, (long long)seq);
    say(&s2, "$2 = ConstantTensor(v, float32, %s);", shp(3, kv_shape));
    say(&s2, "$3 = PermuteNode($2, [1, 0, 2]);");
    say(&s2, "$4 = MatMulNode($1, $3);");
    say(&s2, "result = $4;");
    mk_named_tensor in2 = {"att", att.data}, c2 = {"v", V.data};
    if (run_once(&s2, &c2, 1, &in2, 1, &mixed))
        same("att @ V", &mixed, want_m, 2e-5 * sqrt((double)seq), RTOL, &s2);
    free(want_s), free(want_m);
    ht_free(&K), ht_free(&V), ht_free(&q), ht_free(&att), ht_free(&scores), ht_free(&mixed);

    /* y [n_out] = x [n_in] @ W^T, W [n_out, n_in] as llama2.c stores it */
    int64_t n_in = test_randint(30, 300), n_out = test_randint(30, 300);
    ht W = ht_rand(F32, 2, (int64_t[]){n_out, n_in}), x = ht_rand(F32, 1, (int64_t[]){n_in});
    ht y = ht_new(F32, 1, (int64_t[]){n_out});
    double *want = malloc(sizeof(double) * (size_t)n_out);
    for (int64_t o = 0; o < n_out; o++) {
        double acc = 0;
        for (int64_t i = 0; i < n_in; i++)
            acc += x.v[i] * W.v[o * n_in + i];
        want[o] = acc;
    }
    script s3 = {0};
    say(&s3, "$1 = InputTensor(x, float32, [%lld]);", (long long)n_in);
    say(&s3, "$2 = ConstantTensor(w, float32, [%lld, %lld]);", (long long)n_out, (long long)n_in);
    say(&s3, "$3 = PermuteNode($2, [1, 0]);");
    say(&s3, "$4 = MatMulNode($1, $3);");
    say(&s3, "result = $4;");
    mk_named_tensor in3 = {"x", x.data}, c3 = {"w", W.data};
    if (run_once(&s3, &c3, 1, &in3, 1, &y))
        same("x @ W^T", &y, want, 2e-5 * sqrt((double)n_in), RTOL, &s3);
    free(want);
    ht_free(&W), ht_free(&x), ht_free(&y);
}

/* ---- permute ------------------------------------------------------------- */

static void permute_case(mk_dtype dt, int rank, const int64_t *sh, const int *perm) {
    ht x = ht_rand(dt, rank, sh);
    int64_t so[4];
    for (int d = 0; d < rank; d++)
        so[d] = sh[perm[d]];
    ht out = ht_new(dt, rank, so);
    double *want = malloc(sizeof(double) * (size_t)x.n);
    for (int64_t i = 0; i < out.n; i++) {
        int64_t idx[4], xi[4];
        unravel(rank, so, i, idx);
        for (int d = 0; d < rank; d++)
            xi[perm[d]] = idx[d];
        want[i] = x.v[ravel(rank, sh, xi)];
    }
    /* As the result itself, and through a consumer that takes no strides (times one). */
    for (int via = 0; via < 2; via++) {
        script s = {0};
        say(&s, "$1 = InputTensor(x, %s, %s);", dtname(dt), shp(rank, sh));
        say(&s, "$2 = PermuteNode($1, %s);", perm_str(rank, perm));
        if (via) {
            say(&s, "$3 = ConstantTensor(one, %s, %s);", dtname(dt), shp(rank, so));
            say(&s, "$4 = HadamardProductNode($2, $3);");
            say(&s, "result = $4;");
        } else {
            say(&s, "result = $2;");
        }
        ht one = ht_new(dt, rank, so);
        for (int64_t i = 0; i < one.n; i++)
            ht_set(&one, i, 1.0);
        mk_named_tensor in = {"x", x.data}, c = {"one", one.data};
        if (run_once(&s, &c, via, &in, 1, &out))
            same("PermuteNode", &out, want, 0, 0, &s);
        ht_free(&one);
    }
    free(want);
    ht_free(&x), ht_free(&out);
}

static void test_permute(void) {
    for (int dt = 0; dt < 2; dt++) {
        mk_dtype dtype = dt ? I64 : F32;
        int64_t sh[4];
        random_shape(2, 2, 9, sh);
        permute_case(dtype, 2, sh, (int[]){1, 0});
        permute_case(dtype, 2, sh, (int[]){0, 1});
        /* big enough for the blocked, threaded transpose */
        permute_case(dtype, 2, (int64_t[]){test_randint(150, 260), test_randint(150, 260)},
                     (int[]){1, 0});
        for (int p = 0; p < 6; p++) {
            random_shape(3, 1, 7, sh);
            permute_case(dtype, 3, sh, PERM3[p]);
        }
        permute_case(dtype, 3, (int64_t[]){test_randint(3, 6), test_randint(40, 70),
                                           test_randint(40, 70)}, PERM3[5]);
        /* all 24 permutations of rank 4 */
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 4; b++)
                for (int c = 0; c < 4; c++) {
                    int d = 6 - a - b - c;
                    if (a == b || a == c || b == c || d < 0 || d > 3 || d == a || d == b ||
                        d == c)
                        continue;
                    random_shape(4, 1, 5, sh);
                    permute_case(dtype, 4, sh, (int[]){a, b, c, d});
                }
    }
}

/* ---- views: slice, reshape ----------------------------------------------- */

static void test_views(void) {
    /* relu of a slice; a slice as the result; reshape of a slice */
    int64_t sh[3] = {test_randint(4, 10), test_randint(2, 6), test_randint(2, 6)};
    int64_t b = test_randint(0, sh[0] - 2), e = test_randint(b + 1, sh[0]);
    int64_t inner = sh[1] * sh[2];
    ht x = ht_rand(F32, 3, sh);
    int64_t so[3] = {e - b, sh[1], sh[2]};
    ht out = ht_new(F32, 3, so);
    double *want = malloc(sizeof(double) * (size_t)x.n);
    for (int relu = 0; relu < 2; relu++) {
        for (int64_t i = 0; i < out.n; i++) {
            double v = x.v[b * inner + i];
            want[i] = relu && v < 0 ? 0 : v;
        }
        script s = {0};
        say(&s, "$1 = InputTensor(x, float32, %s);", shp(3, sh));
        say(&s, "$2 = SliceNode($1, %lld, %lld);", (long long)b, (long long)e);
        if (relu)
            say(&s, "$3 = ReLUNode($2);");
        else
            say(&s, "$3 = SliceNode($2, 0, %lld);", (long long)(e - b));
        say(&s, "result = $3;");
        mk_named_tensor in = {"x", x.data};
        if (run_once(&s, NULL, 0, &in, 1, &out))
            same(relu ? "relu(slice)" : "slice of slice", &out, want, 0, 0, &s);
    }
    ht_free(&out);

    /* reshape of a slice, then a matmul: x[b:e] as [(e-b)·d1, d2] @ w [d2, n] */
    int64_t n = test_randint(2, 9), rows = (e - b) * sh[1];
    ht w = ht_rand(F32, 2, (int64_t[]){sh[2], n});
    ht out2 = ht_new(F32, 2, (int64_t[]){rows, n});
    double *want2 = malloc(sizeof(double) * (size_t)out2.n);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < n; j++) {
            double acc = 0;
            for (int64_t q = 0; q < sh[2]; q++)
                acc += x.v[b * inner + i * sh[2] + q] * w.v[q * n + j];
            want2[i * n + j] = acc;
        }
    script s = {0};
    say(&s, "$1 = InputTensor(x, float32, %s);", shp(3, sh));
    say(&s, "$2 = ConstantTensor(w, float32, [%lld, %lld]);", (long long)sh[2], (long long)n);
    say(&s, "$3 = SliceNode($1, %lld, %lld);", (long long)b, (long long)e);
    say(&s, "$4 = ReshapeNode($3, [%lld, %lld]);", (long long)rows, (long long)sh[2]);
    say(&s, "$5 = MatMulNode($4, $2);");
    say(&s, "result = $5;");
    mk_named_tensor in = {"x", x.data}, c = {"w", w.data};
    if (run_once(&s, &c, 1, &in, 1, &out2))
        same("matmul(reshape(slice))", &out2, want2, 2e-5 * sqrt((double)sh[2]), RTOL, &s);

    /* slice of a reshape of a weight, as the right operand: w2 [d, n] rows [b2, e2) */
    int64_t d = test_randint(6, 12), b2 = test_randint(0, 2), kk = test_randint(2, d - b2);
    ht w2 = ht_rand(F32, 1, (int64_t[]){d * n});
    ht xa = ht_rand(F32, 2, (int64_t[]){3, kk});
    ht out3 = ht_new(F32, 2, (int64_t[]){3, n});
    double want3[3 * 16];
    for (int64_t i = 0; i < 3; i++)
        for (int64_t j = 0; j < n; j++) {
            double acc = 0;
            for (int64_t q = 0; q < kk; q++)
                acc += xa.v[i * kk + q] * w2.v[(b2 + q) * n + j];
            want3[i * n + j] = acc;
        }
    script s3 = {0};
    say(&s3, "$1 = InputTensor(x, float32, [3, %lld]);", (long long)kk);
    say(&s3, "$2 = ConstantTensor(w, float32, [%lld]);", (long long)(d * n));
    say(&s3, "$3 = ReshapeNode($2, [%lld, %lld]);", (long long)d, (long long)n);
    say(&s3, "$4 = SliceNode($3, %lld, %lld);", (long long)b2, (long long)(b2 + kk));
    say(&s3, "$5 = MatMulNode($1, $4);");
    say(&s3, "result = $5;");
    mk_named_tensor in3 = {"x", xa.data}, c3 = {"w", w2.data};
    if (run_once(&s3, &c3, 1, &in3, 1, &out3))
        same("x @ slice(reshape(w))", &out3, want3, 2e-5 * sqrt((double)kk), RTOL, &s3);

    free(want), free(want2);
    ht_free(&x), ht_free(&w), ht_free(&out2), ht_free(&w2), ht_free(&xa), ht_free(&out3);
}

/* ---- elementwise ops on strided views ------------------------------------ */

static void random_perm(int rank, int *perm) {
    for (int d = 0; d < rank; d++)
        perm[d] = d;
    for (int d = rank - 1; d > 0; d--) {
        int j = (int)test_randint(0, d), t = perm[d];
        perm[d] = perm[j];
        perm[j] = t;
    }
}

/*
 * Declares the logical tensor L as a view: stored permuted by `perm` (a
 * PermuteNode over it, a strided view or, with no_passes, a copy) and, where
 * pad > 0, inside a stored tensor with `pad` more rows on each side of its
 * first axis (a SliceNode: an offset view). *store gets the data to pass as
 * `name`; returns the node that is L.
 */
static int declare_view(script *s, int *next, const char *name, bool constant, const ht *L,
                        const int *perm, int64_t pad, ht *store) {
    ht S = store_permuted(L, perm);
    if (pad > 0) {
        int64_t big[4];
        memcpy(big, S.shape, sizeof big);
        big[0] += 2 * pad;
        *store = ht_rand(L->dtype, S.rank, big);
        int64_t row = S.n / S.shape[0];
        for (int64_t i = 0; i < S.n; i++)
            ht_set(store, pad * row + i, S.v[i]);
        ht_free(&S);
    } else {
        *store = S;
    }
    int id = (*next)++;
    say(s, "$%d = %s(%s, %s, %s);", id, constant ? "ConstantTensor" : "InputTensor", name,
        dtname(L->dtype), shp(store->rank, store->shape));
    if (pad > 0) {
        say(s, "$%d = SliceNode($%d, %lld, %lld);", *next, id, (long long)pad,
            (long long)(pad + store->shape[0] - 2 * pad));
        id = (*next)++;
    }
    if (!perm_is_identity(L->rank, perm)) {
        say(s, "$%d = PermuteNode($%d, %s);", *next, id, perm_str(L->rank, perm));
        id = (*next)++;
    }
    return id;
}

/* Binary ops whose operands are permuted and sliced views, b also broadcast. */
static void test_binary_strided(void) {
    for (int rank = 1; rank <= 4; rank++)
        for (int op = 0; op < N_BINOPS; op++)
            for (int rep = 0; rep < 3; rep++) {
                mk_dtype dtype = BINOPS[op].takes_i64 && rep == 2 ? I64 : F32;
                int64_t sa[4], sb[4];
                random_shape(rank, 1, rank <= 2 ? 9 : 5, sa);
                for (int d = 0; d < rank; d++)
                    sb[d] = test_randint(0, 2) == 0 ? 1 : sa[d];
                double hi = dtype == F32 ? 1.0 : i64_range(BINOPS[op].op);
                ht a = ht_rand_range(dtype, rank, sa, 0.1, hi);
                ht b = ht_rand_range(dtype, rank, sb, 0.1, hi);
                int pa[4], pb[4];
                random_perm(rank, pa);
                random_perm(rank, pb);
                script s = {0};
                int next = 1;
                ht sta, stb;
                bool a_const = test_randint(0, 1), b_const = test_randint(0, 1);
                int ia = declare_view(&s, &next, "a", a_const, &a, pa, test_randint(0, 2), &sta);
                int ib = declare_view(&s, &next, "b", b_const, &b, pb, test_randint(0, 2), &stb);
                say(&s, "$%d = %s($%d, $%d);", next, BINOPS[op].name, ia, ib);
                say(&s, "result = $%d;", next);
                ht out = ht_new(dtype, rank, sa);
                double *want = malloc(sizeof(double) * (size_t)a.n);
                ref_broadcast(BINOPS[op].op, &a, &b, want);
                mk_named_tensor an = {"a", sta.data}, bn = {"b", stb.data}, cs[2], ins[2];
                size_t nc = 0, ni = 0;
                if (a_const) cs[nc++] = an; else ins[ni++] = an;
                if (b_const) cs[nc++] = bn; else ins[ni++] = bn;
                if (run_once(&s, cs, nc, ins, ni, &out))
                    same(BINOPS[op].name, &out, want, BIN_ATOL, BIN_RTOL, &s);
                free(want);
                ht_free(&a), ht_free(&b), ht_free(&sta), ht_free(&stb), ht_free(&out);
            }
}

/* Unary ops of permuted and sliced views. */
static void test_unary_strided(void) {
    for (int rank = 1; rank <= 4; rank++)
        for (int u = 0; u < N_UNOPS; u++)
            for (int rep = 0; rep < 2; rep++) {
                mk_dtype dtype = UNOPS[u].takes_i64 && rep == 1 ? I64 : F32;
                int64_t sh[4];
                random_shape(rank, 1, rank <= 2 ? 12 : 5, sh);
                ht x = dtype == F32 ? ht_rand_range(dtype, rank, sh, 0.05, UNOPS[u].hi)
                                    : ht_rand(dtype, rank, sh);
                int perm[4];
                random_perm(rank, perm);
                script s = {0};
                int next = 1;
                ht st;
                int ix = declare_view(&s, &next, "x", false, &x, perm, test_randint(0, 2), &st);
                say(&s, "$%d = %s($%d);", next, UNOPS[u].name, ix);
                say(&s, "result = $%d;", next);
                ht out = ht_new(dtype, rank, sh);
                double *want = malloc(sizeof(double) * (size_t)x.n);
                for (int64_t i = 0; i < x.n; i++)
                    want[i] = UNOPS[u].ref(x.v[i]);
                mk_named_tensor in = {"x", st.data};
                if (run_once(&s, NULL, 0, &in, 1, &out))
                    same(UNOPS[u].name, &out, want, UNOPS[u].atol, UNOPS[u].rtol, &s);
                free(want);
                ht_free(&x), ht_free(&st), ht_free(&out);
            }
}

/*
 * Every new op in one graph, with broadcasts between them:
 * y = relu(silu(gelu(a / b - exp(c)) * sigmoid(tanh(a)))) + exp(c),
 * a [m, n], b [1, n] (constant), c [m, 1].
 */
static void test_pointwise_chain(void) {
    for (int big = 0; big < 2; big++) {
        int64_t m = big ? test_randint(200, 300) : test_randint(1, 9);
        int64_t n = big ? test_randint(200, 300) : test_randint(1, 9);
        ht a = ht_rand(F32, 2, (int64_t[]){m, n}), b = ht_rand(F32, 2, (int64_t[]){1, n});
        ht c = ht_rand(F32, 2, (int64_t[]){m, 1});
        ht out = ht_new(F32, 2, (int64_t[]){m, n});
        double *want = malloc(sizeof(double) * (size_t)out.n);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double av = a.v[i * n + j], ec = exp(c.v[i]);
                double g = ref_gelu(av / b.v[j] - ec) * ref_sigmoid(tanh(av));
                want[i * n + j] = ref_relu(ref_silu(g)) + ec;
            }
        script s = {0};
        say(&s, "$1 = InputTensor(a, float32, [%lld, %lld]);", (long long)m, (long long)n);
        say(&s, "$2 = ConstantTensor(b, float32, [1, %lld]);", (long long)n);
        say(&s, "$3 = InputTensor(c, float32, [%lld, 1]);", (long long)m);
        say(&s, "$4 = DivNode($1, $2);");
        say(&s, "$5 = ExpNode($3);");
        say(&s, "$6 = SubNode($4, $5);");
        say(&s, "$7 = GELUNode($6);");
        say(&s, "$8 = TanhNode($1);");
        say(&s, "$9 = SigmoidNode($8);");
        say(&s, "$10 = HadamardProductNode($7, $9);");
        say(&s, "$11 = SiLUNode($10);");
        say(&s, "$12 = ReLUNode($11);");
        say(&s, "$13 = SumNode($12, $5);");
        say(&s, "result = $13;");
        mk_named_tensor c_b = {"b", b.data}, ins[2] = {{"a", a.data}, {"c", c.data}};
        if (run_once(&s, &c_b, 1, ins, 2, &out))
            same("pointwise chain", &out, want, 1e-5, 1e-5, &s);
        free(want);
        ht_free(&a), ht_free(&b), ht_free(&c), ht_free(&out);
    }
}

/* ---- the new ops: bad scripts -------------------------------------------- */

/* Compiling `text` must fail with `code` at line:column, the kind prefix and `fragment`. */
static void expect_compile_error(const char *text, mk_error_code code, int line, int column,
                                 const char *kind, const char *fragment) {
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, text, NULL, 0, NULL, &err);
    CHECK(m == NULL && err != NULL, "compiled:\n%s", text);
    mk_model_free(m);
    if (!err)
        return;
    const char *msg = mk_error_message(err);
    char prefix[96];
    snprintf(prefix, sizeof prefix, "script:%d:%d: %s: ", line, column, kind);
    CHECK(mk_error_code_of(err) == code, "code %d, want %d: %s\n%s", (int)mk_error_code_of(err),
          (int)code, msg, text);
    CHECK(mk_error_line(err) == line && mk_error_column(err) == column,
          "at %d:%d, want %d:%d: %s\n%s", mk_error_line(err), mk_error_column(err), line, column,
          msg, text);
    CHECK(!strncmp(msg, prefix, strlen(prefix)), "'%s' does not start with '%s'", msg, prefix);
    CHECK(strstr(msg, fragment) != NULL, "'%s' lacks '%s'", msg, fragment);
    mk_error_free(err);
}

/* After an error the context still compiles and runs `op` (float32 [3], a - b etc.). */
static void check_context_usable(const char *op, int n_in, double (*ref1)(double), char bop) {
    float x[3], y[3], got[3];
    for (int i = 0; i < 3; i++) {
        x[i] = (float)rand_value(F32, 0.1, 2.0);
        y[i] = (float)rand_value(F32, 0.1, 2.0);
    }
    script s = {0};
    say(&s, "$1 = InputTensor(x, float32, [3]);");
    say(&s, "$2 = InputTensor(y, float32, [3]);");
    if (n_in == 2)
        say(&s, "$3 = %s($1, $2);", op);
    else
        say(&s, "$3 = %s($1);", op);
    say(&s, "result = $3;");
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, s.text, NULL, 0, NULL, &err);
    CHECK(m != NULL, "%s after an error: %s", op, mk_error_message(err));
    mk_named_tensor ins[2] = {{"x", x}, {"y", y}};
    if (m && mk_evaluate(m, ins, 2, got, sizeof got, &err) == 0) {
        for (int i = 0; i < 3; i++) {
            double want = n_in == 2 ? ref_binop(bop, x[i], y[i]) : ref1(x[i]);
            CHECK(test_close(got[i], want, 2e-6, 2e-6), "%s after an error: got %.9g want %.9g",
                  op, got[i], want);
        }
    } else if (m) {
        CHECK(0, "%s after an error: evaluate: %s", op, mk_error_message(err));
    }
    mk_model_free(m);
    mk_error_free(err);
}

static void test_new_ops_bad_scripts(void) {
    static const char *f23 = "$1 = InputTensor(a, float32, [2, 3]);\n";
    static const char *i23 = "$1 = InputTensor(a, int64, [2, 3]);\n";
    const binop *bins[2] = {&BINOPS[2], &BINOPS[3]};
    for (int k = 0; k < 2; k++) {
        const char *op = bins[k]->name;
        int len = (int)strlen(op);
        char text[512], msg[128];
        /* one operand: stops at ')'; three: at the third */
        snprintf(text, sizeof text, "%s$2 = %s($1);\nresult = $2;\n", f23, op);
        expect_compile_error(text, MK_ERR_ARGUMENT, 2, 9 + len, "argument error", "takes 2 arguments");
        check_context_usable(op, 2, NULL, bins[k]->op);
        snprintf(text, sizeof text, "%s$2 = %s($1, $1, $1);\nresult = $2;\n", f23, op);
        expect_compile_error(text, MK_ERR_ARGUMENT, 2, 15 + len, "argument error", "takes 2 arguments");
        check_context_usable(op, 2, NULL, bins[k]->op);
        /* a [2, 3] and b do not broadcast (NumPy's rule): transposed, another rank,
         * a leading dim that meets a 2 */
        const char *bshapes[3] = {"[3, 2]", "[2]", "[2, 3, 1]"};
        for (int j = 0; j < 3; j++) {
            snprintf(text, sizeof text,
                     "%s$2 = InputTensor(b, float32, %s);\n$3 = %s($1, $2);\nresult = $3;\n", f23,
                     bshapes[j], op);
            expect_compile_error(text, MK_ERR_SHAPE, 3, 1, "shape error", "does not broadcast");
            check_context_usable(op, 2, NULL, bins[k]->op);
        }
        snprintf(text, sizeof text,
                 "%s$2 = InputTensor(b, float32, [3, 1]);\n$3 = %s($2, $1);\nresult = $3;\n", f23,
                 op);
        expect_compile_error(text, MK_ERR_SHAPE, 3, 1, "shape error", "does not broadcast");
        /* mixed dtypes */
        snprintf(text, sizeof text,
                 "%s$2 = InputTensor(b, int64, [2, 3]);\n$3 = %s($1, $2);\nresult = $3;\n", f23, op);
        expect_compile_error(text, MK_ERR_DTYPE, 3, 1, "dtype error", "int64");
        check_context_usable(op, 2, NULL, bins[k]->op);
        if (!bins[k]->takes_i64) {
            snprintf(text, sizeof text,
                     "%s$2 = InputTensor(b, int64, [2, 3]);\n$3 = %s($1, $2);\nresult = $3;\n",
                     i23, op);
            snprintf(msg, sizeof msg, "script:3:1: dtype error: %s does not take int64 ('a')",
                     op);
            expect_compile_error(text, MK_ERR_DTYPE, 3, 1, "dtype error", msg);
            check_context_usable(op, 2, NULL, bins[k]->op);
        }
    }
    for (int u = 2; u < N_UNOPS; u++) { /* Exp, Tanh, Sigmoid, GELU */
        const char *op = UNOPS[u].name;
        int len = (int)strlen(op);
        char text[512], msg[128];
        snprintf(text, sizeof text, "%s$2 = %s();\nresult = $2;\n", f23, op);
        expect_compile_error(text, MK_ERR_ARGUMENT, 2, 7 + len, "argument error", "takes 1 arguments");
        check_context_usable(op, 1, UNOPS[u].ref, 0);
        snprintf(text, sizeof text, "%s$2 = %s($1, $1);\nresult = $2;\n", f23, op);
        expect_compile_error(text, MK_ERR_ARGUMENT, 2, 11 + len, "argument error", "takes 1 arguments");
        check_context_usable(op, 1, UNOPS[u].ref, 0);
        /* int64: an input, and a computed int64 node further down */
        snprintf(text, sizeof text, "%s$2 = %s($1);\nresult = $2;\n", i23, op);
        snprintf(msg, sizeof msg, "script:2:1: dtype error: %s does not take int64 ('a')", op);
        expect_compile_error(text, MK_ERR_DTYPE, 2, 1, "dtype error", msg);
        check_context_usable(op, 1, UNOPS[u].ref, 0);
        snprintf(text, sizeof text,
                 "%s$2 = InputTensor(b, int64, [1, 3]);\n$3 = SubNode($1, $2);\n"
                 "$4 = %s($3);\nresult = $4;\n", i23, op);
        snprintf(msg, sizeof msg, "script:4:1: dtype error: %s does not take int64 ($3, line 3)", op);
        expect_compile_error(text, MK_ERR_DTYPE, 4, 1, "dtype error", msg);
        check_context_usable(op, 1, UNOPS[u].ref, 0);
    }
}

/* ---- replace_slice into buffers ------------------------------------------ */

/*
 * A buffer [R, ...] written by ReplaceSliceNode at run-time rows [begin, end)
 * over several evaluations; the output (the buffer, or the buffer times a
 * constant) shows its state, which must persist. Bad bounds must fail with
 * MK_ERR_EVAL naming the node and leave the buffer untouched.
 */
static void replace_case(mk_dtype dt, int rank, bool through) {
    int64_t sh[4], rs[4];
    random_shape(rank, 2, 5, sh);
    sh[0] = test_randint(6, 12);
    memcpy(rs, sh, sizeof sh);
    rs[0] = test_randint(1, 3);
    int64_t row = shape_numel(rank - 1, sh + 1), R = sh[0], k = rs[0];
    ht scale = ht_rand_range(dt, rank, sh, 0.1, dt == F32 ? 1.0 : 9.0);
    script s = {0};
    say(&s, "$1 = InputTensor(begin, int64, [1]);");
    say(&s, "$2 = InputTensor(end, int64, [1]);");
    say(&s, "$3 = InputTensor(r, %s, %s);", dtname(dt), shp(rank, rs));
    say(&s, "$4 = BufferTensor(%s, %s);", dtname(dt), shp(rank, sh));
    say(&s, "$5 = ReplaceSliceNode($4, $3, $1, $2);");
    if (through) {
        say(&s, "$6 = ConstantTensor(scale, %s, %s);", dtname(dt), shp(rank, sh));
        say(&s, "$7 = HadamardProductNode($5, $6);");
        say(&s, "result = $7;");
    } else {
        say(&s, "result = $5;");
    }
    mk_named_tensor c = {"scale", scale.data};
    mk_model *m = compile(&s, &c, through);
    if (!m) {
        ht_free(&scale);
        return;
    }
    double *state = calloc((size_t)(R * row), sizeof(double));
    double *want = malloc(sizeof(double) * (size_t)(R * row));
    ht out = ht_new(dt, rank, sh);
    for (int step = 0; step < 8; step++) {
        ht r = ht_rand(dt, rank, rs);
        int64_t begin = test_randint(0, R - k);
        ht hb = ht_scalar_i64(begin), he = ht_scalar_i64(begin + k);
        mk_named_tensor ins[3] = {{"begin", hb.data}, {"end", he.data}, {"r", r.data}};
        if (step == 3 || step == 6) {
            /* out of range in every way: nothing may be written */
            int64_t bad[5][2] = {{-1, k - 1}, {R - k + 1, R + 1}, {begin, begin + k + 1},
                                 {begin + k, begin}, {R + 5, R + 5 + k}};
            ht r_bad = ht_rand(dt, rank, rs);
            mk_named_tensor bad_ins[3] = {ins[0], ins[1], {"r", r_bad.data}};
            for (int j = 0; j < 5; j++) {
                ((int64_t *)hb.data)[0] = bad[j][0];
                ((int64_t *)he.data)[0] = bad[j][1];
                expect_eval_error(m, bad_ins, 3, &out, "ReplaceSliceNode:",
                                  "ReplaceSlice bounds");
            }
            ht_free(&r_bad);
            /* the next good evaluation shows the buffer as it was, plus r */
            ((int64_t *)hb.data)[0] = begin;
            ((int64_t *)he.data)[0] = begin + k;
        }
        for (int64_t i = 0; i < k * row; i++)
            state[begin * row + i] = r.v[i];
        for (int64_t i = 0; i < R * row; i++)
            want[i] = through ? state[i] * scale.v[i] : state[i];
        if (evaluate(m, ins, 3, &out, &s))
            same("ReplaceSliceNode state", &out, want, ATOL, RTOL, &s);
        ht_free(&r), ht_free(&hb), ht_free(&he);
    }
    mk_model_free(m);
    free(state), free(want);
    ht_free(&out), ht_free(&scale);
}

static void test_replace_slice(void) {
    for (int rank = 1; rank <= 4; rank++) {
        replace_case(F32, rank, false);
        replace_case(I64, rank, rank % 2 == 0);
        replace_case(F32, rank, true);
    }
}

/*
 * A Fibonacci-like recurrence kept in a buffer F [N, 1] (int64, exact):
 * step t reads F[t-2] and F[t-1] through EmbeddingNode (run-time ids), adds
 * them and a random x_t, and writes F[t] with ReplaceSliceNode. Steps 0 and 1
 * read rows not yet written (zero).
 */
static void test_fibonacci_buffer(void) {
    int64_t N = test_randint(12, 30);
    script s = {0};
    say(&s, "$1 = InputTensor(ids, int64, [2]);");
    say(&s, "$2 = InputTensor(at, int64, [1]);");
    say(&s, "$3 = InputTensor(next, int64, [1]);");
    say(&s, "$4 = InputTensor(x, int64, [1, 1]);");
    say(&s, "$5 = BufferTensor(int64, [%lld, 1]);", (long long)N);
    say(&s, "$6 = EmbeddingNode($5, $1);");
    say(&s, "$7 = SliceNode($6, 0, 1);");
    say(&s, "$8 = SliceNode($6, 1, 2);");
    say(&s, "$9 = SumNode($7, $8);");
    say(&s, "$10 = SumNode($9, $4);");
    say(&s, "$11 = ReplaceSliceNode($5, $10, $2, $3);");
    say(&s, "result = $11;");
    mk_model *m = compile(&s, NULL, 0);
    if (!m)
        return;
    double *F = calloc((size_t)N, sizeof(double));
    ht out = ht_new(I64, 2, (int64_t[]){N, 1});
    for (int64_t t = 0; t < N; t++) {
        int64_t ids[2] = {t >= 2 ? t - 2 : N - 1, t >= 1 ? t - 1 : N - 1};
        int64_t at = t, next = t + 1, x = test_randint(1, 3);
        F[t] = F[ids[0]] + F[ids[1]] + (double)x;
        mk_named_tensor ins[4] = {{"ids", ids}, {"at", &at}, {"next", &next}, {"x", &x}};
        if (!evaluate(m, ins, 4, &out, &s) || !same("Fibonacci buffer", &out, F, 0, 0, &s))
            break;
    }
    mk_model_free(m);
    free(F);
    ht_free(&out);
}

/* ---- rows: rms_norm, sliced_softmax, argmax ------------------------------ */

static void test_rms_norm(void) {
    for (int rank = 1; rank <= 4; rank++)
        for (int big = 0; big < 2; big++) {
            int64_t sh[4];
            random_shape(rank, 1, 6, sh);
            sh[rank - 1] = test_randint(1, 300);
            if (big && rank > 1)
                sh[0] = 40000 / shape_numel(rank - 1, sh + 1) + 1;
            int64_t n = sh[rank - 1];
            ht x = ht_rand_range(F32, rank, sh, 0.1, 4.0), w = ht_rand(F32, 1, &n);
            ht out = ht_new(F32, rank, sh);
            double *want = malloc(sizeof(double) * (size_t)x.n);
            for (int64_t r = 0; r < x.n / n; r++) {
                double ss = 0;
                for (int64_t j = 0; j < n; j++)
                    ss += x.v[r * n + j] * x.v[r * n + j];
                double scale = 1.0 / sqrt(ss / (double)n + 1e-5);
                for (int64_t j = 0; j < n; j++)
                    want[r * n + j] = w.v[j] * x.v[r * n + j] * scale;
            }
            script s = {0};
            say(&s, "$1 = InputTensor(x, float32, %s);", shp(rank, sh));
            say(&s, "$2 = ConstantTensor(w, float32, [%lld]);", (long long)n);
            say(&s, "$3 = RmsNormNode($1, $2);");
            say(&s, "result = $3;");
            mk_named_tensor in = {"x", x.data}, c = {"w", w.data};
            if (run_once(&s, &c, 1, &in, 1, &out))
                same("RmsNormNode", &out, want, ATOL, RTOL, &s);
            free(want);
            ht_free(&x), ht_free(&w), ht_free(&out);
        }
}

static void ref_sliced_softmax(const ht *x, int64_t p, double *want) {
    int64_t n = x->shape[x->rank - 1];
    for (int64_t r = 0; r < x->n / n; r++) {
        const double *xr = x->v + r * n;
        double *o = want + r * n;
        double max = -INFINITY, sum = 0;
        for (int64_t j = 0; j < p; j++)
            max = xr[j] > max ? xr[j] : max;
        for (int64_t j = 0; j < p; j++)
            sum += exp(xr[j] - max);
        for (int64_t j = 0; j < n; j++)
            o[j] = j < p ? exp(xr[j] - max) / sum : xr[j];
    }
}

/* Prefixes 0, 1, n and random, evaluated on one model; then prefix n + 1 and -1 fail. */
static void test_sliced_softmax(void) {
    for (int rank = 1; rank <= 4; rank++)
        for (int big = 0; big < 2; big++) {
            int64_t sh[4];
            random_shape(rank, 1, 5, sh);
            sh[rank - 1] = test_randint(2, big ? 600 : 40);
            if (big && rank > 1)
                sh[0] = 20000 / shape_numel(rank - 1, sh + 1) + 1;
            int64_t n = sh[rank - 1];
            script s = {0};
            say(&s, "$1 = InputTensor(p, int64, [1]);");
            say(&s, "$2 = InputTensor(x, float32, %s);", shp(rank, sh));
            say(&s, "$3 = SlicedSoftmaxNode($2, $1);");
            say(&s, "result = $3;");
            mk_model *m = compile(&s, NULL, 0);
            if (!m)
                return;
            ht out = ht_new(F32, rank, sh);
            double *want = malloc(sizeof(double) * (size_t)out.n);
            int64_t prefixes[6] = {0, 1, n, test_randint(1, n), n + 1, -1};
            for (int i = 0; i < 6; i++) {
                ht x = ht_rand_range(F32, rank, sh, 0.1, 8.0);
                mk_named_tensor ins[2] = {{"p", &prefixes[i]}, {"x", x.data}};
                if (i >= 4) {
                    expect_eval_error(m, ins, 2, &out, "SlicedSoftmaxNode:", "prefix");
                } else {
                    ref_sliced_softmax(&x, prefixes[i], want);
                    if (evaluate(m, ins, 2, &out, &s))
                        same("SlicedSoftmaxNode", &out, want, ATOL, RTOL, &s);
                }
                ht_free(&x);
            }
            /* still usable after the failures */
            int64_t p = test_randint(0, n);
            ht x = ht_rand_range(F32, rank, sh, 0.1, 8.0);
            mk_named_tensor ins[2] = {{"p", &p}, {"x", x.data}};
            ref_sliced_softmax(&x, p, want);
            if (evaluate(m, ins, 2, &out, &s))
                same("SlicedSoftmaxNode after errors", &out, want, ATOL, RTOL, &s);
            ht_free(&x);
            mk_model_free(m);
            free(want);
            ht_free(&out);
        }
}

/*
 * The softmax's exponential to within a few float32 ulp over its whole range:
 * rows whose max is 0 and whose other values sweep [-100, 0] (past -87.3,
 * where e^x leaves the normal floats) with a -inf among them, so every output
 * is e^x / sum. 16 ulp of slack covers the float sum; a wrong polynomial
 * term or range reduction is off by far more.
 */
static void test_softmax_exp(void) {
    int64_t rows = test_randint(2, 5), n = test_randint(300, 700);
    int64_t sh[2] = {rows, n};
    script s = {0};
    say(&s, "$1 = InputTensor(p, int64, [1]);");
    say(&s, "$2 = InputTensor(x, float32, [%lld, %lld]);", (long long)rows, (long long)n);
    say(&s, "$3 = SlicedSoftmaxNode($2, $1);");
    say(&s, "result = $3;");
    mk_model *m = compile(&s, NULL, 0);
    if (!m)
        return;
    ht x = ht_new(F32, 2, sh), out = ht_new(F32, 2, sh);
    for (int64_t i = 0; i < x.n; i++)
        ht_set(&x, i, -test_uniform(0.0, 100.0));
    for (int64_t r = 0; r < rows; r++) { /* a 0 (the row's max, so x - max is exact) and a -inf elsewhere */
        int64_t zero = test_randint(0, n - 1), inf = test_randint(0, n - 2);
        ht_set(&x, r * n + zero, 0.0);
        ht_set(&x, r * n + inf + (inf >= zero), -INFINITY);
    }
    double *want = malloc(sizeof(double) * (size_t)x.n);
    ref_sliced_softmax(&x, n, want);
    mk_named_tensor ins[2] = {{"p", &n}, {"x", x.data}};
    if (evaluate(m, ins, 2, &out, &s))
        same("SlicedSoftmaxNode over [-100, 0]", &out, want, 1e-37, 16 * 0x1p-24, &s);
    free(want);
    ht_free(&x), ht_free(&out);
    mk_model_free(m);
}

/* Embedding from float32 and int64 tables; ids repeat; bad ids (V, -1, huge) fail. */
static void test_embedding(void) {
    for (int dt = 0; dt < 2; dt++)
        for (int tconst = 0; tconst < 2; tconst++) {
            mk_dtype dtype = dt ? I64 : F32;
            int64_t V = test_randint(1, 40), D = test_randint(1, 70), n = test_randint(1, 12);
            ht table = ht_rand(dtype, 2, (int64_t[]){V, D});
            ht out = ht_new(dtype, 2, (int64_t[]){n, D});
            script s = {0};
            say(&s, "$1 = %s(table, %s, [%lld, %lld]);", tconst ? "ConstantTensor" : "InputTensor",
                dtname(dtype), (long long)V, (long long)D);
            say(&s, "$2 = InputTensor(ids, int64, [%lld]);", (long long)n);
            say(&s, "$3 = EmbeddingNode($1, $2);");
            say(&s, "result = $3;");
            mk_named_tensor c = {"table", table.data};
            mk_model *m = compile(&s, &c, tconst);
            if (!m) {
                ht_free(&table), ht_free(&out);
                return;
            }
            int64_t *ids = malloc(sizeof(int64_t) * (size_t)n);
            double *want = malloc(sizeof(double) * (size_t)out.n);
            for (int round = 0; round < 5; round++) {
                for (int64_t i = 0; i < n; i++)
                    ids[i] = test_randint(0, V - 1);
                mk_named_tensor ins[2] = {{"ids", ids}, {"table", table.data}};
                size_t n_in = tconst ? 1 : 2;
                if (round == 2 || round == 3) {
                    int64_t bad[3] = {V, -1, INT64_MAX};
                    for (int j = 0; j < 3; j++) {
                        ids[test_randint(0, n - 1)] = bad[j];
                        expect_eval_error(m, ins, n_in, &out, "EmbeddingNode:", "ids");
                        for (int64_t i = 0; i < n; i++)
                            ids[i] = test_randint(0, V - 1);
                    }
                }
                for (int64_t i = 0; i < n; i++)
                    for (int64_t j = 0; j < D; j++)
                        want[i * D + j] = table.v[ids[i] * D + j];
                if (evaluate(m, ins, n_in, &out, &s))
                    same("EmbeddingNode", &out, want, 0, 0, &s);
            }
            mk_model_free(m);
            free(ids), free(want);
            ht_free(&table), ht_free(&out);
        }
}

/* ArgMax over the last axis, with ties planted (the first index wins). */
static void test_argmax(void) {
    for (int rank = 1; rank <= 4; rank++)
        for (int ties = 0; ties < 2; ties++) {
            int64_t sh[4];
            random_shape(rank, 1, 6, sh);
            sh[rank - 1] = test_randint(1, 300);
            int64_t n = sh[rank - 1];
            ht x = ht_rand_range(F32, rank, sh, 0.1, 3.0);
            int64_t so[4];
            memcpy(so, sh, sizeof so);
            so[rank - 1] = 1;
            ht out = ht_new(I64, rank, so);
            double *want = malloc(sizeof(double) * (size_t)out.n);
            for (int64_t r = 0; r < out.n; r++) {
                double *xr = x.v + r * n;
                float *xf = (float *)x.data + r * n;
                if (ties && n > 1) {
                    /* the same largest value at two or three places */
                    int64_t a = test_randint(0, n - 1), b = test_randint(0, n - 1);
                    int64_t c = test_randint(0, n - 1);
                    xf[a] = xf[b] = xf[c] = 5.0f;
                    xr[a] = xr[b] = xr[c] = 5.0;
                }
                int64_t best = 0;
                for (int64_t j = 1; j < n; j++)
                    if (xr[j] > xr[best])
                        best = j;
                want[r] = (double)best;
            }
            script s = {0};
            say(&s, "$1 = InputTensor(x, float32, %s);", shp(rank, sh));
            say(&s, "$2 = ArgMaxNode($1);");
            say(&s, "result = $2;");
            mk_named_tensor in = {"x", x.data};
            if (run_once(&s, NULL, 0, &in, 1, &out))
                same("ArgMaxNode", &out, want, 0, 0, &s);
            free(want);
            ht_free(&x), ht_free(&out);
        }
}

/* ---- a small llama-like chain -------------------------------------------- */

/*
 * Several ops in one model, evaluated repeatedly with a KV-cache-like buffer:
 * h = rmsnorm(x, g); k = h @ Wk^T; cache[pos] = k; scores = q @ cache^T over
 * the first pos+1 rows (sliced softmax); the output is the softmaxed scores.
 */
static void test_chain(void) {
    int64_t D = test_randint(8, 40), S = test_randint(4, 10);
    ht Wk = ht_rand(F32, 2, (int64_t[]){D, D}), g = ht_rand(F32, 1, &D);
    script s = {0};
    say(&s, "$1 = InputTensor(pos, int64, [1]);");
    say(&s, "$2 = InputTensor(pos1, int64, [1]);");
    say(&s, "$3 = InputTensor(x, float32, [1, %lld]);", (long long)D);
    say(&s, "$4 = ConstantTensor(g, float32, [%lld]);", (long long)D);
    say(&s, "$5 = ConstantTensor(wk, float32, [%lld, %lld]);", (long long)D, (long long)D);
    say(&s, "$6 = BufferTensor(float32, [%lld, %lld]);", (long long)S, (long long)D);
    say(&s, "$7 = RmsNormNode($3, $4);");
    say(&s, "$8 = PermuteNode($5, [1, 0]);");
    say(&s, "$9 = MatMulNode($7, $8);");
    say(&s, "$10 = ReplaceSliceNode($6, $9, $1, $2);");
    say(&s, "$11 = PermuteNode($10, [1, 0]);");
    say(&s, "$12 = MatMulNode($7, $11);");
    say(&s, "$13 = SlicedSoftmaxNode($12, $2);");
    say(&s, "result = $13;");
    mk_named_tensor c[2] = {{"g", g.data}, {"wk", Wk.data}};
    mk_model *m = compile(&s, c, 2);
    if (!m) {
        ht_free(&Wk), ht_free(&g);
        return;
    }
    double *cache = calloc((size_t)(S * D), sizeof(double));
    double *want = malloc(sizeof(double) * (size_t)S);
    double *h = malloc(sizeof(double) * (size_t)D);
    ht out = ht_new(F32, 2, (int64_t[]){1, S});
    for (int64_t pos = 0; pos < S; pos++) {
        ht x = ht_rand(F32, 2, (int64_t[]){1, D});
        double ss = 0;
        for (int64_t j = 0; j < D; j++)
            ss += x.v[j] * x.v[j];
        double scale = 1.0 / sqrt(ss / (double)D + 1e-5);
        for (int64_t j = 0; j < D; j++)
            h[j] = g.v[j] * x.v[j] * scale;
        for (int64_t o = 0; o < D; o++) {
            double acc = 0;
            for (int64_t j = 0; j < D; j++)
                acc += h[j] * Wk.v[o * D + j];
            cache[pos * D + o] = acc;
        }
        ht sc = ht_new(F32, 2, (int64_t[]){1, S});
        for (int64_t t = 0; t < S; t++) {
            double acc = 0;
            for (int64_t j = 0; j < D; j++)
                acc += h[j] * cache[t * D + j];
            sc.v[t] = acc;
        }
        ref_sliced_softmax(&sc, pos + 1, want);
        int64_t p = pos, p1 = pos + 1;
        mk_named_tensor ins[3] = {{"pos", &p}, {"pos1", &p1}, {"x", x.data}};
        if (evaluate(m, ins, 3, &out, &s))
            same("chain", &out, want, 1e-4, 1e-3, &s);
        ht_free(&x), ht_free(&sc);
    }
    mk_model_free(m);
    free(cache), free(want), free(h);
    ht_free(&Wk), ht_free(&g), ht_free(&out);
}

int main(void) {
    /* small graphs, but the CPU's threaded paths: the cost rule would keep them on one thread */
    setenv("MK_CPU_FORK", "always", 0);
    test_srand(test_seed());
    mk_error *err = NULL;
    ctx = mk_context_new(&err);
    if (!ctx) {
        printf("# no context: %s\n", err ? mk_error_message(err) : "?");
        mk_error_free(err);
        return 1;
    }
    for (int pass = 0; pass < 2; pass++) {
        no_passes = pass == 1;
        printf("# passes %s\n", no_passes ? "off" : "on");
        RUN(test_binary_broadcast);
        RUN(test_binary_large);
        RUN(test_unary);
        RUN(test_special_values);
        RUN(test_int64_wraparound);
        RUN(test_binary_strided);
        RUN(test_unary_strided);
        RUN(test_pointwise_chain);
        RUN(test_new_ops_bad_scripts);
        RUN(test_complex_mul);
        RUN(test_matmul_shapes);
        RUN(test_matmul_attention);
        RUN(test_permute);
        RUN(test_views);
        RUN(test_replace_slice);
        RUN(test_fibonacci_buffer);
        RUN(test_rms_norm);
        RUN(test_sliced_softmax);
        RUN(test_softmax_exp);
        RUN(test_embedding);
        RUN(test_argmax);
        RUN(test_chain);
    }
    mk_context_free(ctx);
    return test_summary("ops");
}
