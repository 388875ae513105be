/*
 * steps_test.c — the C API's own side of models of several outputs and
 * recurrences: mk_evaluate refusing several outputs, mk_model_run_steps's
 * argument checks (each leaving the model usable: an RNN cell, h' = tanh(h W
 * + b), token = argmax(h') + pos, checked against a double-precision
 * reference after each), on the CPU and on CUDA where there is a device (else
 * skipped with the reason), and the introspection of outputs and next lines.
 *
 * run_steps' values, stops, feeds, failed steps and the caller's inputs on
 * both devices are spec/steps_spec.lua's (doc/testing.md).
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

/* ---- inputs and introspection ------------------------------------------------------------ */

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

static void test_cuda_argument_errors(void) { argument_cases_on(MK_DEVICE_CUDA); }

#define CUDA_CASE(fn) RUN_IF(have_cuda, fn, cuda_reason)

int main(void) {
    test_srand(test_seed());
    if (!(ctx = test_context())) return 1;
    char why[200] = "";
    have_cuda = mk_cuda_available(why, sizeof why);
    snprintf(cuda_reason, sizeof cuda_reason, "no CUDA device: %s", why);
    RUN(test_evaluate_refuses_several_outputs);
    RUN(test_run_steps_argument_errors);
    RUN(test_introspection);
    CUDA_CASE(test_cuda_argument_errors);
    mk_context_free(ctx);
    return test_summary("steps");
}
