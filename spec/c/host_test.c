/*
 * host_test.c — what a host gets from a context: log messages, progress and
 * cancel (moonkaas.h, "hosts").
 *
 *   test_log_and_progress   a compile reports its 6 stages in order, the
 *                           constants' bytes as they upload, one "compiled"
 *                           line; a CPU run reports each launch
 *   test_cancel_run         cancelled from the progress function at launch k:
 *                           "cancelled", then the model runs and is right
 *   test_cancel_compile     cancelled at each compile stage in turn: NULL and
 *                           "cancelled", then the compile succeeds
 *   test_cancel_thread      another thread cancels runs in a loop; the next
 *                           run after it stops is right (also under TSan)
 *   test_cancel_idle        a cancel while nothing runs stops nothing
 *   test_cancel_cuda        on a GPU: cancelled while its kernels compile,
 *                           then compiled and run; a cancel between runs
 *                           stops neither; a run cancelled from its "0 of 1"
 *                           report fails, the next one is right
 */
#include "moonkaas.h"
#include "test.h"

#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

/* A chain of L pointwise launches (no groups: fuse off) over x [n]:
 * y = relu(x * c + 1) ... ; the value is checked against the same loop in double. */
#define CHAIN 40
static char chain_script[8192];
static float weights[64];

static void make_chain(void) {
    int at = snprintf(chain_script, sizeof chain_script,
                      "$1 = InputTensor(x, float32, [64]);\n"
                      "$2 = ConstantTensor(w, float32, [64]);\n");
    int last = 1;
    for (int i = 0; i < CHAIN; i++) {
        at += snprintf(chain_script + at, sizeof chain_script - (size_t)at,
                       "$%d = HadamardProductNode($%d, $2);\n$%d = ReLUNode($%d);\n", 3 + 2 * i,
                       last, 4 + 2 * i, 3 + 2 * i);
        last = 4 + 2 * i;
    }
    snprintf(chain_script + at, sizeof chain_script - (size_t)at, "result = $%d;\n", last);
    for (int i = 0; i < 64; i++) weights[i] = (float)test_uniform(0.5, 1.1);
}

static mk_model *compile_chain(mk_context *ctx, mk_device dev, mk_error **err) {
    mk_named_tensor w = {"w", weights};
    mk_compile_options o = {.device = dev, .no_fusion = true};
    return mk_compile(ctx, chain_script, &w, 1, &o, err);
}

/* Runs the chain on x and checks it against the loop in double. */
static int run_chain(mk_model *m, mk_error **err) {
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)test_uniform(-1, 1);
    mk_named_tensor in = {"x", x};
    int rc = mk_evaluate(m, &in, 1, y, sizeof y, err);
    if (rc) return rc;
    for (int i = 0; i < 64; i++) {
        double want = x[i];
        for (int k = 0; k < CHAIN; k++) {
            want *= weights[i];
            want = want > 0 ? want : 0;
        }
        CHECK(test_close(y[i], want, 1e-5, 1e-4), "element %d: %g, want %g", i, (double)y[i], want);
    }
    return 0;
}

/* ---- what the host functions saw ---------------------------------------------- */

typedef struct {
    mk_context *ctx;
    int n_events;
    mk_phase phase[512];
    int64_t done[512], total[512];
    int logs, warnings;
    char last_log[512];
    mk_phase cancel_phase; /* cancel when this phase reports done == cancel_at */
    int64_t cancel_at;
    bool cancel_on_log;
} seen;

static void on_progress(void *user, mk_phase phase, int64_t done, int64_t total) {
    seen *s = user;
    if (s->n_events < 512) {
        s->phase[s->n_events] = phase;
        s->done[s->n_events] = done;
        s->total[s->n_events] = total;
        s->n_events++;
    }
    if (phase == s->cancel_phase && done == s->cancel_at) mk_context_cancel(s->ctx);
}

static void on_log(void *user, mk_log_level level, const char *message) {
    seen *s = user;
    s->logs++;
    s->warnings += level == MK_LOG_WARNING;
    snprintf(s->last_log, sizeof s->last_log, "%s", message);
    if (s->cancel_on_log) mk_context_cancel(s->ctx);
}

static mk_context *context_seen(seen *s) {
    mk_error *err = NULL;
    memset(s, 0, sizeof *s);
    s->cancel_at = -1;
    s->ctx = mk_context_new(&err);
    CHECK(s->ctx != NULL, "context: %s", mk_error_message(err));
    mk_error_free(err);
    mk_context_set_log(s->ctx, on_log, s);
    mk_context_set_progress(s->ctx, on_progress, s);
    return s->ctx;
}

static bool is_cancelled(const mk_error *err) {
    return err && mk_error_code_of(err) == MK_ERR_CANCELLED &&
           strstr(mk_error_message(err), "cancelled: the ") != NULL;
}

/* Threads the CPU device has (OpenMP's), as it counts them. */
static int omp_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ---- the tests ------------------------------------------------------------------ */

static void test_log_and_progress(void) {
    seen s;
    mk_context *ctx = context_seen(&s);
    mk_error *err = NULL;
    /* a copied constant (not borrowed) is uploaded even on the CPU */
    mk_named_tensor w = {"w", weights};
    mk_compile_options o = {.device = MK_DEVICE_CPU, .no_fusion = true};
    mk_model *m = mk_compile(ctx, chain_script, &w, 1, &o, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    int64_t stage = -1, uploaded = 0;
    for (int i = 0; i < s.n_events; i++) {
        if (s.phase[i] == MK_PHASE_COMPILE) {
            CHECK(s.done[i] == stage + 1 && s.total[i] == 6, "stage %lld of %lld after %lld",
                  (long long)s.done[i], (long long)s.total[i], (long long)stage);
            stage = s.done[i];
        }
        if (s.phase[i] == MK_PHASE_UPLOAD) {
            CHECK(stage == 3 && s.done[i] > uploaded && s.done[i] <= s.total[i],
                  "upload %lld of %lld in stage %lld", (long long)s.done[i],
                  (long long)s.total[i], (long long)stage);
            uploaded = s.done[i];
        }
    }
    CHECK(stage == 6, "the last stage reported: %lld", (long long)stage);
    CHECK(uploaded == (int64_t)sizeof weights, "uploaded %lld bytes", (long long)uploaded);
    /* with threads, the CPU's line on which launches may fork comes first */
    CHECK(s.logs == 1 + (omp_threads() > 1) && s.warnings == 0 &&
              strstr(s.last_log, "compiled for cpu in "),
          "%d log lines, the last: %s", s.logs, s.last_log);
    s.n_events = 0;
    CHECK(m && run_chain(m, &err) == 0, "run: %s", mk_error_message(err));
    CHECK(s.n_events == 2 * CHAIN, "%d run events for %d launches", s.n_events, 2 * CHAIN);
    for (int i = 0; i < s.n_events; i++)
        CHECK(s.phase[i] == MK_PHASE_RUN && s.done[i] == i + 1 && s.total[i] == 2 * CHAIN,
              "event %d: %s %lld of %lld", i, mk_phase_name(s.phase[i]), (long long)s.done[i],
              (long long)s.total[i]);
    CHECK(!strcmp(mk_phase_name(MK_PHASE_KERNELS), "kernels") &&
              !strcmp(mk_phase_name((mk_phase)99), "?"),
          "phase names");
    /* host functions off: nothing is called */
    mk_context_set_log(ctx, NULL, NULL);
    mk_context_set_progress(ctx, NULL, NULL);
    s.n_events = s.logs = 0;
    CHECK(m && run_chain(m, &err) == 0 && s.n_events == 0 && s.logs == 0, "after clearing");
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

static void test_cancel_run(void) {
    seen s;
    mk_context *ctx = context_seen(&s);
    mk_error *err = NULL;
    mk_model *m = compile_chain(ctx, MK_DEVICE_CPU, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    for (int at = 1; m && at <= 2 * CHAIN; at += 13) {
        s.cancel_phase = MK_PHASE_RUN;
        s.cancel_at = at;
        s.n_events = 0;
        int rc = run_chain(m, &err);
        CHECK(rc != 0 && is_cancelled(err), "cancelled at launch %d: %s", at,
              rc ? mk_error_message(err) : "it ran to the end");
        bool last = at == 2 * CHAIN; /* cancelled after the last launch: nothing left to stop */
        CHECK(last || s.n_events == at, "%d launches ran after a cancel at %d", s.n_events, at);
        mk_error_free(err);
        err = NULL;
        s.cancel_at = -1;
        CHECK(run_chain(m, &err) == 0, "the run after: %s", mk_error_message(err));
    }
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

static void test_cancel_compile(void) {
    seen s;
    mk_context *ctx = context_seen(&s);
    mk_error *err = NULL;
    for (int stage = 0; stage <= 6; stage++) {
        s.cancel_phase = MK_PHASE_COMPILE;
        s.cancel_at = stage;
        mk_model *m = compile_chain(ctx, MK_DEVICE_CPU, &err);
        /* stage 0 is reported before parsing: the stop comes at stage 1's check */
        CHECK(m == NULL && is_cancelled(err), "cancelled at stage %d: %s", stage,
              m ? "it compiled" : mk_error_message(err));
        mk_model_free(m);
        mk_error_free(err);
        err = NULL;
    }
    s.cancel_at = -1;
    mk_model *m = compile_chain(ctx, MK_DEVICE_CPU, &err);
    CHECK(m != NULL && run_chain(m, &err) == 0, "after the cancels: %s", mk_error_message(err));
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

typedef struct {
    mk_context *ctx;
    atomic_bool stop;
    atomic_int cancels;
    unsigned seed; /* the canceller's sleeps */
} canceller;

static void *cancel_loop(void *arg) {
    canceller *c = arg;
    while (!atomic_load(&c->stop)) {
        mk_context_cancel(c->ctx);
        atomic_fetch_add(&c->cancels, 1);
        /* 0.1 to 0.3 ms, drawn: a fixed sleep locked in step with the runs'
         * loop (two runs a cancel, every cancel in the loop's sleep: 0 runs
         * cancelled in 2,000, one test in five on the 2-core box) */
        struct timespec ts = {0, 100000 + (long)(rand_r(&c->seed) % 200000)};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_cancel_thread(void) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = compile_chain(ctx, MK_DEVICE_CPU, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    canceller c = {.ctx = ctx, .seed = (unsigned)test_randint(1, 1 << 30)};
    /* exact sleeps for both threads: with the kernel's default slack of 50 us
     * their wakeups share timer expiries, and a cancel then lands as the next
     * run starts (one test in a few dozen cancelled 1 run of 2,000) */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    atomic_init(&c.stop, false);
    atomic_init(&c.cancels, 0);
    pthread_t t;
    pthread_create(&t, NULL, cancel_loop, &c);
    int cancelled = 0, ran = 0;
    for (int i = 0; m && i < 2000 && cancelled < 3; i++) {
        int rc = run_chain(m, &err);
        if (rc) {
            CHECK(is_cancelled(err), "a run failed otherwise: %s", mk_error_message(err));
            cancelled++;
        } else {
            ran++;
        }
        mk_error_free(err);
        err = NULL;
        /* between frames, as a host would: a CPU run makes no system call, and
         * under valgrind (one thread at a time) the canceller runs only when
         * this thread blocks in one (sched_yield was not enough: in one CI run
         * the canceller never ran in 2,000 frames) */
        struct timespec ts = {0, 50000}; /* 0.05 ms */
        nanosleep(&ts, NULL);
    }
    atomic_store(&c.stop, true);
    pthread_join(t, NULL);
    printf("#   %d runs cancelled, %d ran, %d cancels sent\n", cancelled, ran,
           atomic_load(&c.cancels));
    /* valgrind runs one thread at a time and switches at system calls, which
     * a CPU run makes none of: there the cancels land between runs only */
    CHECK(cancelled > 0 || getenv("MK_VALGRIND"), "no run was cancelled in 2000");
    CHECK(atomic_load(&c.cancels) > 0, "the canceller never ran");
    CHECK(m && run_chain(m, &err) == 0, "the run after: %s", mk_error_message(err));
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

static void test_cancel_idle(void) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_context_cancel(ctx); /* nothing runs: nothing to stop */
    mk_model *m = compile_chain(ctx, MK_DEVICE_CPU, &err);
    mk_context_cancel(ctx);
    CHECK(m != NULL && run_chain(m, &err) == 0, "after idle cancels: %s", mk_error_message(err));
    mk_context_cancel(NULL); /* harmless */
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

static void test_cancel_cuda(void) {
    seen s;
    mk_context *ctx = context_seen(&s);
    mk_error *err = NULL;
    /* a graph with groups: its kernels compile one by one */
    s.cancel_phase = MK_PHASE_KERNELS;
    s.cancel_at = 1;
    mk_named_tensor w = {"w", weights};
    mk_compile_options o = {.device = MK_DEVICE_CUDA};
    mk_model *m = mk_compile(ctx, chain_script, &w, 1, &o, &err);
    CHECK(m == NULL && is_cancelled(err), "cancelled while kernels compile: %s",
          m ? "it compiled" : mk_error_message(err));
    mk_model_free(m);
    mk_error_free(err);
    err = NULL;
    s.cancel_at = -1;
    m = compile_chain(ctx, MK_DEVICE_CUDA, &err);
    CHECK(m != NULL && run_chain(m, &err) == 0, "compiled and run: %s", mk_error_message(err));
    mk_context_cancel(ctx); /* between runs: stops nothing */
    CHECK(m && run_chain(m, &err) == 0, "an idle cancel stopped a run: %s", mk_error_message(err));
    /* a run hears "0 of 1" before its graph launches and may cancel there */
    s.n_events = 0;
    s.cancel_phase = MK_PHASE_RUN;
    s.cancel_at = 0;
    CHECK(m && run_chain(m, &err) != 0 && is_cancelled(err), "cancelled before the graph: %s",
          err ? mk_error_message(err) : "it ran");
    CHECK(s.n_events == 1 && s.phase[0] == MK_PHASE_RUN && s.total[0] == 1,
          "a cancelled CUDA run reports 0 of 1 only (%d events)", s.n_events);
    mk_error_free(err);
    err = NULL;
    s.cancel_at = -1;
    s.n_events = 0;
    CHECK(m && run_chain(m, &err) == 0, "the run after the cancel: %s", mk_error_message(err));
    CHECK(s.n_events == 2 && s.done[0] == 0 && s.done[1] == 1 && s.total[1] == 1,
          "a CUDA run reports 0 of 1, then 1 of 1 (%d events)", s.n_events);
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

int main(void) {
    test_srand(test_seed());
    make_chain();
    RUN(test_log_and_progress);
    RUN(test_cancel_run);
    RUN(test_cancel_compile);
    RUN(test_cancel_thread);
    RUN(test_cancel_idle);
    char why[256];
    if (mk_cuda_available(why, sizeof why) == 1) RUN(test_cancel_cuda);
    else SKIP(test_cancel_cuda, why);
    return test_summary("host");
}
