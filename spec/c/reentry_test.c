/*
 * reentry_test.c — what a host function may do with the library that calls it
 * (moonkaas.h, "hosts"), on the CPU device:
 *
 *   test_free_running       mk_model_free of the running model from its progress
 *                           function: the run finishes right, the model goes
 *                           after it (ASan and valgrind see no leak)
 *   test_busy               mk_evaluate, mk_evaluate_outputs, mk_model_run_steps
 *                           and mk_model_reset of the running model: MK_ERR_BUSY
 *                           ("busy: "); the run is right, the model runs after
 *   test_nested             another model run from the progress function: both
 *                           right, the outer run's events all reported
 *   test_cancel_call        mk_context_cancel_call in the nested run stops it
 *                           alone; mk_context_cancel there stops both
 *   test_shared_busy        a model sharing the running one's buffer: busy
 *   test_free_shared_mid_compile   the share model freed by a compile's progress
 *                           function: the new model has its cache and weight
 *   test_threads_busy       two threads run one model (which the threads rules
 *                           forbid): each call is right or busy, never wrong
 *                           (also under ThreadSanitizer)
 */
#include "moonkaas.h"
#include "test.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>

/* x [16] through L launches of y = relu(y * w) (fuse off: one launch a node) */
#define CHAIN 3
#define N 16
static char chain_script[4096];

static void make_chain(void) {
    int at = snprintf(chain_script, sizeof chain_script,
                      "$1 = InputTensor(x, float32, [%d]);\n"
                      "$2 = InputTensor(w, float32, [%d]);\n", N, N);
    int last = 1;
    for (int i = 0; i < CHAIN; i++) {
        at += snprintf(chain_script + at, sizeof chain_script - (size_t)at,
                       "$%d = HadamardProductNode($%d, $2);\n$%d = ReLUNode($%d);\n", 3 + 2 * i,
                       last, 4 + 2 * i, 3 + 2 * i);
        last = 4 + 2 * i;
    }
    snprintf(chain_script + at, sizeof chain_script - (size_t)at, "result = $%d;\n", last);
}

static mk_model *compile_chain(mk_context *ctx) {
    mk_error *err = NULL;
    mk_compile_options o = {.no_fusion = true};
    mk_model *m = mk_compile(ctx, chain_script, NULL, 0, &o, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    mk_error_free(err);
    return m;
}

typedef struct {
    float x[N], w[N], y[N];
} chain_io;

static void fill(chain_io *io) {
    for (int i = 0; i < N; i++) {
        io->x[i] = (float)test_uniform(-1, 1);
        io->w[i] = (float)test_uniform(0.5, 1.5);
        io->y[i] = (float)test_uniform(-9, 9); /* overwritten by a run */
    }
}

static int run_chain(mk_model *m, chain_io *io, mk_error **err) {
    mk_named_tensor in[] = {{"x", io->x}, {"w", io->w}};
    return mk_evaluate(m, in, 2, io->y, sizeof io->y, err);
}

/* The chain in double, against io->y. */
static void check_chain(const chain_io *io, const char *what) {
    for (int i = 0; i < N; i++) {
        double want = io->x[i];
        for (int k = 0; k < CHAIN; k++) want = fmax(want * io->w[i], 0);
        CHECK(test_close(io->y[i], want, 1e-6, 1e-5), "%s: y[%d] = %g, want %g", what, i,
              (double)io->y[i], want);
    }
}

static bool is_busy(const mk_error *err) {
    return err && mk_error_code_of(err) == MK_ERR_BUSY &&
           !strncmp(mk_error_message(err), "busy: ", 6);
}

/* ---- what a progress function does, and saw --------------------------------- */

typedef struct {
    mk_context *ctx;
    mk_model *model;   /* the outer run's model */
    mk_model *other;   /* run from the progress function, or NULL */
    int at;            /* the outer run's launch at which to act */
    enum { DO_FREE, DO_BUSY, DO_NESTED } action;
    enum { INNER_NONE, INNER_CANCEL_CALL, INNER_CANCEL_ALL } inner;
    int depth;
    int outer_events, inner_events;
    int busy;          /* busy errors seen */
    int nested_rc;
    mk_error *nested_err;
    chain_io nested;
} host;

static void on_progress(void *user, mk_phase phase, int64_t done, int64_t total) {
    host *h = user;
    if (phase != MK_PHASE_RUN) return;
    if (h->depth) {
        h->inner_events++;
        if (h->inner == INNER_CANCEL_CALL) mk_context_cancel_call(h->ctx);
        if (h->inner == INNER_CANCEL_ALL) mk_context_cancel(h->ctx);
        return;
    }
    h->outer_events++;
    if (done != h->at) return;
    mk_error *err = NULL;
    chain_io io;
    fill(&io);
    mk_named_tensor in[] = {{"x", io.x}, {"w", io.w}};
    switch (h->action) {
    case DO_FREE:
        mk_model_free(h->model);
        break;
    case DO_BUSY: {
        h->busy += run_chain(h->model, &io, &err) != 0 && is_busy(err);
        mk_error_free(err), err = NULL;
        mk_buffer out = {io.y, sizeof io.y};
        h->busy += mk_evaluate_outputs(h->model, in, 2, &out, 1, &err) != 0 && is_busy(err);
        mk_error_free(err), err = NULL;
        h->busy += mk_model_run_steps(h->model, 1, in, 2, &out, 1, NULL, &err) < 0 &&
                   is_busy(err);
        mk_error_free(err), err = NULL;
        h->busy += mk_model_reset(h->model, &err) != 0 && is_busy(err);
        mk_error_free(err), err = NULL;
        mk_stats st; /* the read-only functions work */
        h->busy += mk_model_stats(h->model, &st) == 0 && st.launches == 2 * CHAIN;
        break;
    }
    case DO_NESTED:
        h->depth = 1;
        fill(&h->nested);
        h->nested_rc = run_chain(h->other, &h->nested, &h->nested_err);
        h->depth = 0;
        break;
    }
    (void)total;
}

static mk_context *context_with(host *h) {
    memset(h, 0, sizeof *h);
    h->ctx = test_context();
    if (h->ctx) mk_context_set_progress(h->ctx, on_progress, h);
    return h->ctx;
}

/* ---- the tests ------------------------------------------------------------------ */

static void test_free_running(void) {
    host h;
    mk_context *ctx = context_with(&h);
    if (!ctx || !(h.model = compile_chain(ctx))) return;
    h.action = DO_FREE;
    h.at = 1;
    chain_io io;
    fill(&io);
    mk_error *err = NULL;
    int rc = run_chain(h.model, &io, &err); /* frees the model as it returns */
    CHECK(rc == 0, "%s", mk_error_message(err));
    mk_error_free(err);
    if (rc == 0) check_chain(&io, "the run whose model was freed");
    CHECK(h.outer_events == 2 * CHAIN, "%d events of %d", h.outer_events, 2 * CHAIN);
    mk_context_free(ctx);
}

static void test_busy(void) {
    host h;
    mk_context *ctx = context_with(&h);
    if (!ctx || !(h.model = compile_chain(ctx))) return;
    h.action = DO_BUSY;
    h.at = 2;
    chain_io io;
    fill(&io);
    mk_error *err = NULL;
    int rc = run_chain(h.model, &io, &err);
    CHECK(rc == 0, "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    if (rc == 0) check_chain(&io, "the outer run");
    CHECK(h.busy == 5, "%d of 5: four calls busy, stats working", h.busy);
    h.at = -1;
    fill(&io);
    rc = run_chain(h.model, &io, &err);
    CHECK(rc == 0, "after: %s", mk_error_message(err));
    mk_error_free(err);
    if (rc == 0) check_chain(&io, "the run after");
    mk_model_free(h.model);
    mk_context_free(ctx);
}

/* Runs `outer`, which runs `other` at launch 2 (inner: what the inner run's
 * progress function does); returns the outer run's status, error in *err. */
static int nested(host *h, chain_io *io, mk_error **err) {
    h->action = DO_NESTED;
    h->at = 2;
    fill(io);
    return run_chain(h->model, io, err);
}

static void test_nested(void) {
    host h;
    mk_context *ctx = context_with(&h);
    if (!ctx || !(h.model = compile_chain(ctx)) || !(h.other = compile_chain(ctx))) return;
    chain_io io;
    mk_error *err = NULL;
    int rc = nested(&h, &io, &err);
    CHECK(rc == 0, "%s", mk_error_message(err));
    mk_error_free(err);
    if (rc == 0) check_chain(&io, "the outer run");
    CHECK(h.nested_rc == 0, "%s", mk_error_message(h.nested_err));
    if (h.nested_rc == 0) check_chain(&h.nested, "the nested run");
    CHECK(h.outer_events == 2 * CHAIN && h.inner_events == 2 * CHAIN, "events %d and %d",
          h.outer_events, h.inner_events);
    mk_error_free(h.nested_err);
    mk_model_free(h.model);
    mk_model_free(h.other);
    mk_context_free(ctx);
}

static void test_cancel_call(void) {
    host h;
    mk_context *ctx = context_with(&h);
    if (!ctx || !(h.model = compile_chain(ctx)) || !(h.other = compile_chain(ctx))) return;
    chain_io io;
    mk_error *err = NULL;
    h.inner = INNER_CANCEL_CALL;
    int rc = nested(&h, &io, &err);
    CHECK(rc == 0, "the outer run: %s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    if (rc == 0) check_chain(&io, "the outer run");
    CHECK(h.nested_rc != 0 && mk_error_code_of(h.nested_err) == MK_ERR_CANCELLED,
          "the nested run: %d %s", h.nested_rc, h.nested_err ? mk_error_message(h.nested_err) : "");
    CHECK(h.inner_events == 1 && h.outer_events == 2 * CHAIN, "events: inner %d, outer %d",
          h.inner_events, h.outer_events);
    mk_error_free(h.nested_err), h.nested_err = NULL;

    h.inner = INNER_CANCEL_ALL; /* stops the calls around it too */
    h.inner_events = h.outer_events = 0;
    rc = nested(&h, &io, &err);
    CHECK(rc != 0 && mk_error_code_of(err) == MK_ERR_CANCELLED, "the outer run: %d", rc);
    CHECK(h.nested_rc != 0 && mk_error_code_of(h.nested_err) == MK_ERR_CANCELLED,
          "the nested run: %d", h.nested_rc);
    mk_error_free(err), err = NULL;
    mk_error_free(h.nested_err), h.nested_err = NULL;
    mk_context_cancel_call(ctx); /* no call in flight: nothing to stop */
    h.at = -1;
    rc = run_chain(h.model, &io, &err);
    CHECK(rc == 0, "after: %s", mk_error_message(err));
    mk_error_free(err);
    if (rc == 0) check_chain(&io, "the run after");
    mk_model_free(h.model);
    mk_model_free(h.other);
    mk_context_free(ctx);
}

/* ---- sharing ---------------------------------------------------------------------- */

/* cache [N] := x at the writer; the reader gives cache * w (w a constant) */
static const char *writer_script =
    "$1 = BufferTensor(float32, [16], cache);\n"
    "$2 = InputTensor(x, float32, [16]);\n"
    "$3 = InputTensor(p, int64, [1]);\n"
    "$4 = InputTensor(e, int64, [1]);\n"
    "$5 = ReplaceSliceNode($1, $2, $3, $4);\n"
    "$6 = ReLUNode($5);\n"
    "$7 = ReLUNode($6);\n"
    "result = $7;\n";
static const char *reader_script =
    "$1 = BufferTensor(float32, [16], cache);\n"
    "$2 = ConstantTensor(w, float32, [16]);\n"
    "$3 = HadamardProductNode($1, $2);\n"
    "result = $3;\n";

typedef struct {
    mk_context *ctx;
    mk_model *writer, *reader;
    int busy;
    bool free_writer_at_stage_2;
} share_host;

static void share_progress(void *user, mk_phase phase, int64_t done, int64_t total) {
    share_host *h = user;
    (void)total;
    if (phase == MK_PHASE_COMPILE && done == 2 && h->free_writer_at_stage_2) {
        mk_model_free(h->writer);
        h->writer = NULL;
    }
    if (phase == MK_PHASE_RUN && done == 1 && h->reader) {
        float y[N];
        mk_error *err = NULL;
        h->busy += mk_evaluate(h->reader, NULL, 0, y, sizeof y, &err) != 0 && is_busy(err);
        mk_error_free(err);
    }
}

static void test_shared_busy(void) {
    share_host h = {.ctx = test_context()};
    if (!h.ctx) return;
    mk_context_set_progress(h.ctx, share_progress, &h);
    mk_error *err = NULL;
    mk_compile_options o = {.no_fusion = true};
    float w[N], x[N], y[N];
    for (int i = 0; i < N; i++) w[i] = (float)test_uniform(0.5, 1.5), x[i] = (float)test_uniform(-1, 1);
    mk_named_tensor wc = {"w", w};
    h.writer = mk_compile(h.ctx, writer_script, NULL, 0, &o, &err);
    CHECK(h.writer != NULL, "%s", mk_error_message(err));
    o.share = h.writer;
    h.reader = h.writer ? mk_compile(h.ctx, reader_script, &wc, 1, &o, &err) : NULL;
    CHECK(h.reader != NULL, "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    if (!h.reader) return;
    int64_t p = 0, e = N;
    mk_named_tensor in[] = {{"x", x}, {"p", &p}, {"e", &e}};
    int rc = mk_evaluate(h.writer, in, 3, y, sizeof y, &err);
    CHECK(rc == 0, "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    CHECK(h.busy == 1, "the reader ran inside the writer's run");
    mk_model *reader = h.reader;
    h.reader = NULL;
    rc = mk_evaluate(reader, NULL, 0, y, sizeof y, &err);
    CHECK(rc == 0, "%s", mk_error_message(err));
    mk_error_free(err);
    for (int i = 0; rc == 0 && i < N; i++)
        CHECK(test_close(y[i], (double)x[i] * w[i], 1e-6, 1e-6), "y[%d] = %g", i, (double)y[i]);
    mk_model_free(h.writer);
    mk_model_free(reader);
    mk_context_free(h.ctx);
}

static void test_free_shared_mid_compile(void) {
    share_host h = {.ctx = test_context()};
    if (!h.ctx) return;
    mk_context_set_progress(h.ctx, share_progress, &h);
    mk_error *err = NULL;
    float w[N], x[N], y[N];
    for (int i = 0; i < N; i++) w[i] = (float)test_uniform(0.5, 1.5), x[i] = (float)test_uniform(-1, 1);
    mk_named_tensor wc = {"w", w};
    h.writer = mk_compile(h.ctx, writer_script, NULL, 0, NULL, &err);
    CHECK(h.writer != NULL, "%s", mk_error_message(err));
    int64_t p = 0, e = N;
    mk_named_tensor in[] = {{"x", x}, {"p", &p}, {"e", &e}};
    int rc = h.writer ? mk_evaluate(h.writer, in, 3, y, sizeof y, &err) : -1;
    CHECK(rc == 0, "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    if (rc) return;
    h.free_writer_at_stage_2 = true;
    mk_compile_options o = {.share = h.writer};
    mk_model *reader = mk_compile(h.ctx, reader_script, &wc, 1, &o, &err);
    CHECK(reader != NULL && h.writer == NULL, "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    rc = reader ? mk_evaluate(reader, NULL, 0, y, sizeof y, &err) : -1;
    CHECK(rc == 0, "%s", mk_error_message(err));
    mk_error_free(err);
    for (int i = 0; rc == 0 && i < N; i++)
        CHECK(test_close(y[i], (double)x[i] * w[i], 1e-6, 1e-6), "y[%d] = %g", i, (double)y[i]);
    mk_model_free(reader);
    mk_context_free(h.ctx);
}

/* ---- two threads on one model ------------------------------------------------------ */

typedef struct {
    mk_model *m;
    uint64_t seed;
    int ok, busy, wrong;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    uint64_t s = r->seed;
    for (int k = 0; k < 300; k++) {
        chain_io io;
        for (int i = 0; i < N; i++) { /* the test's generator is not for two threads */
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            io.x[i] = (float)((double)(s >> 40) / (double)(1 << 24) * 2 - 1);
            io.w[i] = (float)(0.5 + (double)((s >> 16) & 0xffffff) / (double)(1 << 24));
        }
        mk_error *err = NULL;
        if (run_chain(r->m, &io, &err) != 0) {
            if (is_busy(err)) r->busy++;
            else r->wrong++;
            mk_error_free(err);
            continue;
        }
        bool right = true;
        for (int i = 0; i < N; i++) {
            double want = io.x[i];
            for (int c = 0; c < CHAIN; c++) want = fmax(want * io.w[i], 0);
            right = right && test_close(io.y[i], want, 1e-6, 1e-5);
        }
        if (right) r->ok++;
        else r->wrong++;
    }
    return NULL;
}

static void test_threads_busy(void) {
    mk_context *ctx = test_context();
    mk_model *m = ctx ? compile_chain(ctx) : NULL;
    if (!m) return;
    racer r[2] = {{.m = m, .seed = test_rand_u64()}, {.m = m, .seed = test_rand_u64()}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, race, &r[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    CHECK(r[0].wrong + r[1].wrong == 0, "%d wrong results or errors other than busy",
          r[0].wrong + r[1].wrong);
    CHECK(r[0].ok + r[1].ok + r[0].busy + r[1].busy == 600 && r[0].ok + r[1].ok > 0,
          "%d right, %d busy", r[0].ok + r[1].ok, r[0].busy + r[1].busy);
    printf("# two threads on one model: %d right, %d busy\n", r[0].ok + r[1].ok,
           r[0].busy + r[1].busy);
    mk_model_free(m);
    mk_context_free(ctx);
}

int main(void) {
    test_srand(test_seed());
    make_chain();
    RUN(test_free_running);
    RUN(test_busy);
    RUN(test_nested);
    RUN(test_cancel_call);
    RUN(test_shared_busy);
    RUN(test_free_shared_mid_compile);
    RUN(test_threads_busy);
    return test_summary("reentry");
}
