/*
 * steps_test.c — models of several outputs and recurrences through the C API:
 * mk_model_run_steps against a double-precision reference of an RNN cell
 * (h' = tanh(h W + b), token = argmax(h') + pos; next h = h', pos = pos + 1),
 * against mk_evaluate_outputs fed by hand, its stop, its argument errors (each
 * leaving the model usable), a step that fails half way, the caller's inputs
 * left as they were, the introspection of outputs and next lines, and the same
 * on CUDA against the CPU where there is a device (else skipped with the reason).
 */
#include "moonkaas.h"
#include "test.h"

#include <stdbool.h>

static mk_context *ctx;
static int have_cuda;
static char cuda_reason[256];

/* float32 after several steps: a few roundings a step, reduced by tanh */
#define ATOL 1e-5
#define RTOL 1e-4

/* ---- the RNN cell ----------------------------------------------------------------- */

typedef struct {
    int n;
    float *w;   /* (n, n) */
    float *b;   /* (n) */
    float *h0;  /* (n) the first step's h */
    int64_t p0; /* the first step's pos */
    char script[1024];
} rnn_case;

static rnn_case rnn_new(int n) {
    rnn_case c = {.n = n, .p0 = test_randint(1, 1000)};
    c.w = malloc(sizeof(float) * (size_t)n * (size_t)n);
    c.b = malloc(sizeof(float) * (size_t)n);
    c.h0 = malloc(sizeof(float) * (size_t)n);
    double s = 1 / sqrt(n); /* h W in tanh's unsaturated range: the trajectory stays close */
    for (int i = 0; i < n * n; i++) c.w[i] = (float)test_uniform(-s, s);
    for (int i = 0; i < n; i++) c.b[i] = (float)test_uniform(-0.5, 0.5);
    for (int i = 0; i < n; i++) c.h0[i] = (float)test_uniform(-1, 1);
    snprintf(c.script, sizeof c.script,
             "$1 = InputTensor(h, float32, [%d]);\n"
             "$2 = ConstantTensor(W, float32, [%d, %d]);\n"
             "$3 = MatMulNode($1, $2);\n"
             "$4 = ConstantTensor(b, float32, [%d]);\n"
             "$5 = SumNode($3, $4);\n"
             "$6 = TanhNode($5);\n"
             "$7 = ArgMaxNode($6);\n"
             "$8 = InputTensor(pos, int64, [1]);\n"
             "$9 = SumNode($7, $8);\n"
             "result = $6, $9;\n"
             "next h = $6;\n"
             "next pos = pos + 1;\n",
             n, n, n, n);
    return c;
}

static void rnn_free(rnn_case *c) {
    free(c->w);
    free(c->b);
    free(c->h0);
}

static mk_model *rnn_compile(const rnn_case *c, mk_device dev, mk_error **err) {
    mk_named_tensor k[] = {{"W", c->w}, {"b", c->b}};
    mk_compile_options o = {.device = dev};
    return mk_compile(ctx, c->script, k, 2, &o, err);
}

/* One reference step: out = tanh(h W + b); returns argmax(out), 0-based. */
static int64_t rnn_step(const rnn_case *c, const double *h, double *out) {
    int64_t best = 0;
    for (int j = 0; j < c->n; j++) {
        double s = c->b[j];
        for (int i = 0; i < c->n; i++) s += h[i] * c->w[i * c->n + j];
        out[j] = tanh(s);
        if (out[j] > out[best]) best = j;
    }
    return best;
}

/* The argmax `got` of h is `want`, or an index whose value ties with want's. */
static bool argmax_ok(int64_t got, int64_t want, const double *h, int n) {
    return got == want || (got >= 0 && got < n && fabs(h[got] - h[want]) <= 1e-4);
}

/* steps of outputs (hs: (steps, n), toks: (steps)) against the reference
 * trajectory from the case's h0 and p0, or (chained: for runs too long for one
 * trajectory to stay close) each step against one reference step from the
 * step before it; returns 1 at the first wrong step, else 0. */
static int check_rnn(const rnn_case *c, const float *hs, const int64_t *toks, int64_t steps,
                     bool chained, double atol, double rtol, const char *what) {
    int n = c->n;
    double *h = malloc(sizeof(double) * (size_t)n), *next = malloc(sizeof(double) * (size_t)n);
    int wrong = 0;
    for (int i = 0; i < n; i++) h[i] = c->h0[i];
    for (int64_t s = 0; s < steps; s++) {
        int64_t best = rnn_step(c, h, next);
        int bad = 0;
        for (int j = 0; j < n && !bad; j++)
            if (!test_close(hs[s * n + j], next[j], atol, rtol)) {
                CHECK(0, "%s: width %d, step %lld, h[%d] = %.9g, want %.9g", what, n,
                      (long long)s + 1, j, hs[s * n + j], next[j]);
                bad = 1;
            }
        int64_t got = toks[s] - (c->p0 + s);
        bool tok_ok = argmax_ok(got, best, next, n);
        CHECK(tok_ok, "%s: width %d, step %lld: token %lld - pos %lld = %lld, want %lld", what, n,
              (long long)s + 1, (long long)toks[s], (long long)(c->p0 + s), (long long)got,
              (long long)best);
        if ((wrong = bad || !tok_ok)) break;
        double *t = h;
        h = next, next = t;
        for (int i = 0; chained && i < n; i++) h[i] = hs[s * n + i];
    }
    free(h);
    free(next);
    return wrong;
}

/* Buffers for `steps` steps of the RNN's two outputs. */
typedef struct {
    float *h;     /* (steps, n) */
    int64_t *tok; /* (steps) */
    mk_buffer out[2];
} rnn_outs;

static rnn_outs outs_new(const rnn_case *c, int64_t steps) {
    rnn_outs o = {.h = calloc((size_t)(steps * c->n), sizeof(float)),
                  .tok = calloc((size_t)steps, sizeof(int64_t))};
    o.out[0] = (mk_buffer){o.h, sizeof(float) * (size_t)(steps * c->n)};
    o.out[1] = (mk_buffer){o.tok, sizeof(int64_t) * (size_t)steps};
    return o;
}

static void outs_free(rnn_outs *o) {
    free(o->h);
    free(o->tok);
}

/* Runs `steps` steps from the case's inputs and checks them; returns 0 when they are right. */
static int rnn_run_and_check(mk_model *m, const rnn_case *c, int64_t steps, const char *what) {
    int64_t pos = c->p0;
    mk_named_tensor in[] = {{"h", c->h0}, {"pos", &pos}};
    rnn_outs o = outs_new(c, steps);
    mk_error *err = NULL;
    int64_t ran = mk_model_run_steps(m, steps, in, 2, o.out, 2, NULL, &err);
    CHECK(ran == steps, "%s: ran %lld of %lld steps: %s", what, (long long)ran, (long long)steps,
          err ? mk_error_message(err) : "");
    int bad = ran != steps || check_rnn(c, o.h, o.tok, steps, steps > 100, ATOL, RTOL, what);
    mk_error_free(err);
    outs_free(&o);
    return bad ? -1 : 0;
}

/* ---- run_steps against the reference ------------------------------------------------- */

static const int widths[] = {5, 33, 64};
static const int64_t step_counts[] = {1, 7, 2500}; /* 2500: more than one launch of a device loop */

/* Every width and step count on `dev`; on CUDA also against the CPU's steps. */
static void rnn_cases_on(mk_device dev) {
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++)
        for (size_t k = 0; k < sizeof step_counts / sizeof *step_counts; k++) {
            rnn_case c = rnn_new(widths[w]);
            int64_t steps = step_counts[k];
            mk_error *err = NULL;
            mk_model *m = rnn_compile(&c, dev, &err);
            CHECK(m != NULL, "width %d: %s", c.n, mk_error_message(err));
            if (m) rnn_run_and_check(m, &c, steps, dev == MK_DEVICE_CPU ? "cpu" : "cuda");
            if (m && dev != MK_DEVICE_CPU && steps <= 100) { /* longer: trajectories part */
                mk_model *cpu = rnn_compile(&c, MK_DEVICE_CPU, &err);
                int64_t p = c.p0;
                mk_named_tensor in[] = {{"h", c.h0}, {"pos", &p}};
                rnn_outs a = outs_new(&c, steps), b = outs_new(&c, steps);
                CHECK(cpu && mk_model_run_steps(m, steps, in, 2, a.out, 2, NULL, &err) == steps &&
                          mk_model_run_steps(cpu, steps, in, 2, b.out, 2, NULL, &err) == steps,
                      "cuda and cpu: %s", err ? mk_error_message(err) : "");
                for (int64_t i = 0; i < steps * c.n; i++)
                    if (!test_close(a.h[i], b.h[i], ATOL, RTOL)) {
                        CHECK(0, "width %d: cuda h %.9g, cpu %.9g at %lld", c.n, a.h[i], b.h[i],
                              (long long)i);
                        break;
                    }
                outs_free(&a);
                outs_free(&b);
                mk_model_free(cpu);
            }
            mk_model_free(m);
            mk_error_free(err);
            rnn_free(&c);
        }
}

static void test_rnn_matches_reference(void) { rnn_cases_on(MK_DEVICE_CPU); }

/* run_steps gives, step for step, what mk_evaluate_outputs gives fed by hand. */
static void test_steps_equal_evaluations_by_hand(void) {
    rnn_case c = rnn_new((int)test_randint(2, 48));
    int64_t steps = test_randint(2, 9);
    mk_error *err = NULL;
    mk_model *m = rnn_compile(&c, MK_DEVICE_CPU, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (m) {
        rnn_outs o = outs_new(&c, steps);
        int64_t pos = c.p0;
        mk_named_tensor in[] = {{"h", c.h0}, {"pos", &pos}};
        CHECK(mk_model_run_steps(m, steps, in, 2, o.out, 2, NULL, &err) == steps, "%s",
              mk_error_message(err));
        float *h = malloc(sizeof(float) * (size_t)c.n), *h1 = malloc(sizeof(float) * (size_t)c.n);
        memcpy(h, c.h0, sizeof(float) * (size_t)c.n);
        for (int64_t s = 0; s < steps; s++) {
            int64_t p = c.p0 + s, tok;
            mk_named_tensor hand[] = {{"pos", &p}, {"h", h}}; /* any order */
            mk_buffer out[] = {{h1, sizeof(float) * (size_t)c.n}, {&tok, sizeof tok}};
            CHECK(mk_evaluate_outputs(m, hand, 2, out, 2, &err) == 0, "%s", mk_error_message(err));
            CHECK(!memcmp(h1, o.h + s * c.n, sizeof(float) * (size_t)c.n) && tok == o.tok[s],
                  "step %lld differs from the evaluation by hand", (long long)s + 1);
            memcpy(h, h1, sizeof(float) * (size_t)c.n);
        }
        free(h);
        free(h1);
        outs_free(&o);
    }
    mk_model_free(m);
    mk_error_free(err);
    rnn_free(&c);
}

/* a' = 2 b, b' = a, where output 1 is input a itself: each input takes the
 * outputs of the step before, never an input another feed already wrote. */
static void feed_from_input_on(mk_device dev) {
    const char *script = "$1 = InputTensor(a, float32, [2]);\n"
                         "$2 = InputTensor(b, float32, [2]);\n"
                         "$3 = ConstantTensor(two, float32, [1]);\n"
                         "$4 = HadamardProductNode($2, $3);\n"
                         "result = $4, $1;\n"
                         "next a = $4;\n"
                         "next b = $1;\n";
    static const float two = 2;
    mk_named_tensor k[] = {{"two", &two}};
    mk_compile_options opts = {.device = dev};
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, script, k, 1, &opts, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    float a[2], b[2], out_2b[5 * 2] = {0}, out_a[5 * 2] = {0};
    for (int i = 0; i < 2; i++) a[i] = (float)test_uniform(0.5, 2), b[i] = (float)test_uniform(-2, -0.5);
    mk_named_tensor in[] = {{"a", a}, {"b", b}};
    mk_buffer out[] = {{out_2b, sizeof out_2b}, {out_a, sizeof out_a}};
    CHECK(m && mk_model_run_steps(m, 5, in, 2, out, 2, NULL, &err) == 5, "%s",
          err ? mk_error_message(err) : "");
    double ra[2] = {a[0], a[1]}, rb[2] = {b[0], b[1]};
    for (int s = 0, wrong = 0; m && s < 5 && !wrong; s++) {
        for (int i = 0; i < 2; i++) {
            bool ok = out_2b[s * 2 + i] == (float)(2 * rb[i]) && out_a[s * 2 + i] == (float)ra[i];
            CHECK(ok, "step %d: 2b[%d] = %g, want %g; a[%d] = %g, want %g", s + 1, i,
                  out_2b[s * 2 + i], 2 * rb[i], i, out_a[s * 2 + i], ra[i]);
            wrong |= !ok;
        }
        for (int i = 0; i < 2; i++) {
            double t = ra[i];
            ra[i] = 2 * rb[i], rb[i] = t;
        }
    }
    mk_model_free(m);
    mk_error_free(err);
}

static void test_feed_from_an_input(void) { feed_from_input_on(MK_DEVICE_CPU); }

/* ---- stop ----------------------------------------------------------------------------- */

/* x' = x / 2 fed back (exact), and the counter as an output (pos + 0). */
static const char *halving =
    "$1 = InputTensor(x, float32, [3]);\n"
    "$2 = ConstantTensor(half, float32, [1]);\n"
    "$3 = HadamardProductNode($1, $2);\n"
    "$4 = InputTensor(pos, int64, [1]);\n"
    "$5 = ConstantTensor(zero, int64, [1]);\n"
    "$6 = SumNode($4, $5);\n"
    "result = $3, $6;\n"
    "next x = $3;\n"
    "next pos = pos + 1;\n";

static mk_model *halving_compile(mk_device dev, mk_error **err) {
    static const float half = 0.5f;
    static const int64_t zero = 0;
    mk_named_tensor k[] = {{"half", &half}, {"zero", &zero}};
    mk_compile_options o = {.device = dev};
    return mk_compile(ctx, halving, k, 2, &o, err);
}

/* n steps with a stop at `value` (or none); returns the steps run and checks those. */
static int64_t halving_run(mk_model *m, int64_t n, const mk_stop *stop, int64_t p0,
                           const float *x0) {
    float *xs = calloc((size_t)n * 3, sizeof(float));
    int64_t *ps = calloc((size_t)n, sizeof(int64_t));
    mk_named_tensor in[] = {{"x", x0}, {"pos", &p0}};
    mk_buffer out[] = {{xs, sizeof(float) * 3 * (size_t)n}, {ps, sizeof(int64_t) * (size_t)n}};
    mk_error *err = NULL;
    int64_t ran = mk_model_run_steps(m, n, in, 2, out, 2, stop, &err);
    CHECK(ran >= 1, "%s", mk_error_message(err));
    for (int64_t s = 0; s < ran; s++) {
        CHECK(ps[s] == p0 + s, "step %lld: pos %lld, want %lld", (long long)s + 1,
              (long long)ps[s], (long long)(p0 + s));
        for (int i = 0; i < 3; i++)
            CHECK(xs[s * 3 + i] == (float)(x0[i] * pow(0.5, (double)s + 1)),
                  "step %lld: x[%d] = %g", (long long)s + 1, i, xs[s * 3 + i]);
    }
    mk_error_free(err);
    free(xs);
    free(ps);
    return ran;
}

static void stop_cases_on(mk_device dev) {
    mk_error *err = NULL;
    mk_model *m = halving_compile(dev, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (!m) {
        mk_error_free(err);
        return;
    }
    float x0[3];
    for (int i = 0; i < 3; i++) x0[i] = (float)test_uniform(0.5, 2);
    int64_t n = 9, p0 = test_randint(-100, 100);
    int64_t ks[] = {1, test_randint(2, n - 1), n};
    for (size_t i = 0; i < 3; i++) {
        mk_stop stop = {true, 1, p0 + ks[i] - 1};
        int64_t ran = halving_run(m, n, &stop, p0, x0);
        CHECK(ran == ks[i], "stop at %lld: ran %lld steps, want %lld", (long long)stop.value,
              (long long)ran, (long long)ks[i]);
    }
    /* from 0, a stop at 3 ends after step 4 */
    CHECK(halving_run(m, 10, &(mk_stop){true, 1, 3}, 0, x0) == 4, "from 0 to 3");
    /* never reached, or not enabled: all n */
    CHECK(halving_run(m, n, &(mk_stop){true, 1, p0 - 1}, p0, x0) == n, "never reached");
    CHECK(halving_run(m, n, &(mk_stop){false, 1, p0}, p0, x0) == n, "not enabled");
    CHECK(halving_run(m, n, NULL, p0, x0) == n, "no stop");
    mk_model_free(m);
    mk_error_free(err);
}

static void test_stop(void) { stop_cases_on(MK_DEVICE_CPU); }

/* ---- errors ----------------------------------------------------------------------------- */

/* rc is -1 with an error (*errp, read after the call) of `code` whose message
 * holds `fragment`. */
static void expect_fail(int64_t rc, mk_error **errp, mk_error_code code, const char *fragment,
                        const char *what) {
    const mk_error *err = *errp;
    CHECK(rc == -1, "%s: returned %lld", what, (long long)rc);
    CHECK(err != NULL, "%s: no error", what);
    if (!err) return;
    CHECK(mk_error_code_of(err) == code, "%s: code %d, want %d: %s", what, mk_error_code_of(err),
          code, mk_error_message(err));
    CHECK(strstr(mk_error_message(err), fragment) != NULL, "%s: '%s' lacks '%s'", what,
          mk_error_message(err), fragment);
}

static void test_evaluate_refuses_several_outputs(void) {
    rnn_case c = rnn_new(4);
    mk_error *err = NULL;
    mk_model *m = rnn_compile(&c, MK_DEVICE_CPU, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (m) {
        int64_t pos = c.p0;
        mk_named_tensor in[] = {{"h", c.h0}, {"pos", &pos}};
        float h[4];
        expect_fail(mk_evaluate(m, in, 2, h, sizeof h, &err), &err, MK_ERR_ARGUMENT,
                    "mk_evaluate_outputs", "mk_evaluate of 2 outputs");
        mk_error_free(err), err = NULL;
        CHECK(rnn_run_and_check(m, &c, 1, "after mk_evaluate") == 0, "usable");
    }
    mk_model_free(m);
    mk_error_free(err);
    rnn_free(&c);
}

/* Each bad call returns -1 with its error, and the model runs right after it. */
static void argument_cases_on(mk_device dev) {
    rnn_case c = rnn_new((int)test_randint(2, 20));
    mk_error *err = NULL;
    mk_model *m = rnn_compile(&c, dev, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (!m) {
        mk_error_free(err);
        rnn_free(&c);
        return;
    }
    int64_t pos = c.p0, n = 3;
    mk_named_tensor in[] = {{"h", c.h0}, {"pos", &pos}}, unknown[] = {{"h", c.h0}, {"z", &pos}};
    rnn_outs o = outs_new(&c, n), one = outs_new(&c, 1);
    mk_buffer three[] = {o.out[0], o.out[1], o.out[1]};
    mk_buffer short_h[] = {one.out[0], o.out[1]};
    mk_buffer long_tok[] = {o.out[0], {o.tok, o.out[1].bytes - 1}};
    mk_buffer null_data[] = {o.out[0], {NULL, o.out[1].bytes}};
    mk_stop past = {true, 2, 0}, on_float = {true, 0, 0};
    struct bad {
        const char *what;
        int64_t n;
        const mk_named_tensor *in;
        size_t n_in;
        const mk_buffer *out;
        size_t n_out;
        const mk_stop *stop;
        mk_error_code code;
        const char *fragment;
    } bad[] = {
        {"n = 0", 0, in, 2, o.out, 2, NULL, MK_ERR_ARGUMENT, "n must be at least 1, got 0"},
        {"n = -1", -1, in, 2, o.out, 2, NULL, MK_ERR_ARGUMENT, "n must be at least 1, got -1"},
        {"one output of two", n, in, 2, o.out, 1, NULL, MK_ERR_ARGUMENT,
         "the model has 2 outputs, 1 was given"},
        {"three outputs of two", n, in, 2, three, 3, NULL, MK_ERR_ARGUMENT,
         "the model has 2 outputs, 3 were given"},
        {"NULL outputs", n, in, 2, NULL, 2, NULL, MK_ERR_ARGUMENT, "the model has 2 outputs"},
        {"a buffer for one step of three", n, in, 2, short_h, 2, NULL, MK_ERR_ARGUMENT,
         "output 0 takes"},
        {"a byte short", n, in, 2, long_tok, 2, NULL, MK_ERR_ARGUMENT, "output 1 takes 8 bytes a step"},
        {"NULL data", n, in, 2, null_data, 2, NULL, MK_ERR_ARGUMENT, "output 1's buffer is NULL"},
        {"stop on output 2 of 2", n, in, 2, o.out, 2, &past, MK_ERR_ARGUMENT,
         "the stop names output 2; the model has 2"},
        {"stop on a float output", n, in, 2, o.out, 2, &on_float, MK_ERR_DTYPE,
         "a stop value needs an int64 output of one element"},
        {"a missing input", n, in, 1, o.out, 2, NULL, MK_ERR_INPUT, "input 'pos' is missing"},
        {"an unknown input", n, unknown, 2, o.out, 2, NULL, MK_ERR_INPUT, "'z' is not an input"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const struct bad *b = &bad[i];
        mk_error *e = NULL;
        int64_t rc = mk_model_run_steps(m, b->n, b->in, b->n_in, b->out, b->n_out, b->stop, &e);
        expect_fail(rc, &e, b->code, b->fragment, b->what);
        mk_error_free(e);
        char after[96];
        snprintf(after, sizeof after, "after %s", b->what);
        CHECK(rnn_run_and_check(m, &c, 2, after) == 0, "%s: not usable", after);
    }
    mk_error *e = NULL;
    expect_fail(mk_model_run_steps(NULL, n, in, 2, o.out, 2, NULL, &e), &e, MK_ERR_ARGUMENT,
                "NULL model", "NULL model");
    mk_error_free(e);
    outs_free(&o);
    outs_free(&one);
    mk_model_free(m);
    rnn_free(&c);
}

static void test_run_steps_argument_errors(void) { argument_cases_on(MK_DEVICE_CPU); }

/* A row written at the counter: out of range at step rows + 1. The steps before
 * it are written, the error says why, and the model runs again. */
static void failed_step_on(mk_device dev) {
    int rows = (int)test_randint(2, 5), d = (int)test_randint(1, 4);
    char script[512];
    snprintf(script, sizeof script,
             "$1 = BufferTensor(float32, [%d, %d]);\n"
             "$2 = InputTensor(row, float32, [1, %d]);\n"
             "$3 = InputTensor(pos, int64, [1]);\n"
             "$4 = ConstantTensor(one, int64, [1]);\n"
             "$5 = SumNode($3, $4);\n"
             "$6 = ReplaceSliceNode($1, $2, $3, $5);\n"
             "result = $6;\n"
             "next pos = pos + 1;\n",
             rows, d, d);
    static const int64_t one = 1;
    mk_named_tensor k[] = {{"one", &one}};
    mk_compile_options opts = {.device = dev};
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, script, k, 1, &opts, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (!m) {
        mk_error_free(err);
        return;
    }
    float row[4];
    for (int j = 0; j < d; j++) row[j] = (float)test_uniform(-1, 1);
    int64_t pos = 0, n = rows + 2, size = (int64_t)rows * d;
    float *out = calloc((size_t)(n * size), sizeof(float));
    mk_named_tensor in[] = {{"row", row}, {"pos", &pos}};
    mk_buffer buf = {out, sizeof(float) * (size_t)(n * size)};
    expect_fail(mk_model_run_steps(m, n, in, 2, &buf, 1, NULL, &err), &err, MK_ERR_EVAL,
                "out of range", "a row past the buffer");
    for (int64_t s = 0; s < rows; s++) /* step s + 1 has rows 0 .. s written */
        for (int64_t i = 0; i < size; i++) {
            float want = i / d <= s ? row[i % d] : 0.0f;
            if (out[s * size + i] != want) {
                CHECK(0, "step %lld, element %lld: %g, want %g", (long long)s + 1, (long long)i,
                      out[s * size + i], want);
                break;
            }
        }
    mk_error_free(err), err = NULL;
    buf.bytes = sizeof(float) * (size_t)(rows * size);
    CHECK(mk_model_reset(m, &err) == 0 && mk_model_run_steps(m, rows, in, 2, &buf, 1, NULL, &err) == rows,
          "after the failed step: %s", err ? mk_error_message(err) : "");
    for (int64_t i = 0; i < size; i++)
        CHECK(out[(rows - 1) * size + i] == row[i % d], "after the failed step: element %lld",
              (long long)i);
    free(out);
    mk_model_free(m);
    mk_error_free(err);
}

static void test_failed_step(void) { failed_step_on(MK_DEVICE_CPU); }

/* ---- inputs and introspection ------------------------------------------------------------ */

static void test_inputs_untouched(void) {
    rnn_case c = rnn_new((int)test_randint(2, 30));
    mk_error *err = NULL;
    mk_model *m = rnn_compile(&c, MK_DEVICE_CPU, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (m) {
        float *h = malloc(sizeof(float) * (size_t)c.n);
        memcpy(h, c.h0, sizeof(float) * (size_t)c.n);
        int64_t pos = c.p0, steps = test_randint(2, 8);
        mk_named_tensor in[] = {{"h", h}, {"pos", &pos}};
        rnn_outs a = outs_new(&c, steps), b = outs_new(&c, steps);
        CHECK(mk_model_run_steps(m, steps, in, 2, a.out, 2, NULL, &err) == steps, "%s",
              mk_error_message(err));
        CHECK(!memcmp(h, c.h0, sizeof(float) * (size_t)c.n), "h was written");
        CHECK(pos == c.p0, "pos was written: %lld, was %lld", (long long)pos, (long long)c.p0);
        /* so a second call starts from them again */
        CHECK(mk_model_run_steps(m, steps, in, 2, b.out, 2, NULL, &err) == steps, "%s",
              mk_error_message(err));
        CHECK(!memcmp(a.h, b.h, a.out[0].bytes) && !memcmp(a.tok, b.tok, a.out[1].bytes),
              "a second run_steps differs from the first");
        outs_free(&a);
        outs_free(&b);
        free(h);
    }
    mk_model_free(m);
    mk_error_free(err);
    rnn_free(&c);
}

static void test_introspection(void) {
    rnn_case c = rnn_new((int)test_randint(2, 30));
    mk_error *err = NULL;
    mk_model *m = rnn_compile(&c, MK_DEVICE_CPU, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (m) {
        mk_tensor_info info;
        CHECK(mk_model_output_count(m) == 2, "%zu outputs", mk_model_output_count(m));
        CHECK(mk_model_output_info_at(m, 0, &info) == 0 && info.dtype == MK_DTYPE_FLOAT32 &&
                  info.rank == 1 && info.shape[0] == c.n && info.name == NULL,
              "output 0");
        CHECK(mk_model_output_info_at(m, 1, &info) == 0 && info.dtype == MK_DTYPE_INT64 &&
                  info.rank == 1 && info.shape[0] == 1,
              "output 1");
        CHECK(mk_model_output_info(m, &info) == 0 && info.dtype == MK_DTYPE_FLOAT32, "output 0");
        CHECK(mk_model_output_info_at(m, 2, &info) == -1, "output 2 of 2");
        CHECK(mk_model_next_count(m) == 2, "%zu next lines", mk_model_next_count(m));
        size_t input;
        int output;
        int64_t add;
        /* in script order: next h = $6 (output 0), next pos = pos + 1 */
        CHECK(mk_model_next_info(m, 0, &input, &output, &add) == 0 &&
                  mk_model_input_info(m, input, &info) == 0 && !strcmp(info.name, "h") &&
                  output == 0,
              "next 0: input %zu, output %d", input, output);
        CHECK(mk_model_next_info(m, 1, &input, &output, &add) == 0 &&
                  mk_model_input_info(m, input, &info) == 0 && !strcmp(info.name, "pos") &&
                  output == -1 && add == 1,
              "next 1: input %zu, output %d, add %lld", input, output, (long long)add);
        CHECK(mk_model_next_info(m, 2, &input, &output, &add) == -1, "next 2 of 2");
        CHECK(mk_model_next_info(m, 0, NULL, &output, &add) == -1, "NULL input");
        const char *s = mk_model_script(m);
        CHECK(s && strstr(s, "\nresult = $6, $9;\nnext h = $6;\nnext pos = pos + 1;\n"), "%s",
              s ? s : "(null)");
    }
    mk_model_free(m);
    /* a model of one output and no next lines */
    const char *plain = "$1 = InputTensor(x, float32, [2]);\n$2 = ReLUNode($1);\nresult = $2;\n";
    m = mk_compile(ctx, plain, NULL, 0, NULL, &err);
    CHECK(m && mk_model_output_count(m) == 1 && mk_model_next_count(m) == 0, "plain model");
    CHECK(mk_model_output_count(NULL) == 0 && mk_model_next_count(NULL) == 0, "NULL model");
    mk_model_free(m);
    mk_error_free(err);
    rnn_free(&c);
}

/* ---- CUDA against the CPU ---------------------------------------------------------------- */

static void test_cuda_rnn(void) { rnn_cases_on(MK_DEVICE_CUDA); }
static void test_cuda_stop(void) { stop_cases_on(MK_DEVICE_CUDA); }
static void test_cuda_argument_errors(void) { argument_cases_on(MK_DEVICE_CUDA); }
static void test_cuda_failed_step(void) { failed_step_on(MK_DEVICE_CUDA); }
static void test_cuda_feed_from_an_input(void) { feed_from_input_on(MK_DEVICE_CUDA); }

#define CUDA_CASE(fn) RUN_IF(have_cuda, fn, cuda_reason)

int main(void) {
    test_srand(test_seed());
    if (!(ctx = test_context())) return 1;
    char why[200] = "";
    have_cuda = mk_cuda_available(why, sizeof why);
    snprintf(cuda_reason, sizeof cuda_reason, "no CUDA device: %s", why);
    RUN(test_rnn_matches_reference);
    RUN(test_steps_equal_evaluations_by_hand);
    RUN(test_feed_from_an_input);
    RUN(test_stop);
    RUN(test_evaluate_refuses_several_outputs);
    RUN(test_run_steps_argument_errors);
    RUN(test_failed_step);
    RUN(test_inputs_untouched);
    RUN(test_introspection);
    CUDA_CASE(test_cuda_rnn);
    CUDA_CASE(test_cuda_stop);
    CUDA_CASE(test_cuda_argument_errors);
    CUDA_CASE(test_cuda_failed_step);
    CUDA_CASE(test_cuda_feed_from_an_input);
    mk_context_free(ctx);
    return test_summary("steps");
}
