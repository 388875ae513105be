/*
 * threads_test.c — the thread rules of core/moonkaas.h ("threads"), exercised
 * on the CPU device (and CUDA where there is one) through the public API
 * only, with POSIX threads:
 *
 *   - mk_cuda_available from many threads at once, as the first call of the
 *     process (the plugin is looked for once, under pthread_once);
 *   - the context-free functions (version, op and dtype tables, mk_op_infer,
 *     mk_script_format, mk_script_constants) from many threads at once, also
 *     as the first calls (the op table's descriptions are filled once);
 *   - one shared context: every thread compiles its own models (the first
 *     compiles of the process, so pointwise programs are made once under
 *     their pthread_once), evaluates them many times and frees them, with
 *     failing compiles and evaluations in between (errors are per call);
 *   - models handed from thread to thread: compiled on one, evaluated on a
 *     second, freed on a third, while the main thread frees the context with
 *     models still alive (the last model frees it);
 *   - a context per thread, freed before or after its models;
 *   - a model's read-only introspection while another thread evaluates it;
 *   - where there is a GPU, the shared context again with CUDA models, and
 *     with cuDNN-fused CUDA models.
 *
 * Two threads never evaluate the same model at once: the header forbids it.
 *
 * The models are MLPs (MatMul, Sum with a broadcast bias, ReLU), each with
 * random shapes and weights, mostly small, one per thread large enough for the
 * parallel kernels and BLAS; every output is checked against a plain
 * double-precision loop written here. Worker threads record failures in their
 * own struct (test.h's CHECK is for the main thread only) and draw random
 * numbers from their own generator, seeded from the printed seed.
 *
 *   make build/tests/threads_test && ./build/tests/threads_test
 *   make tsan            (this and every C test under ThreadSanitizer)
 */
#include "moonkaas.h"
#include "test.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>

#define N_THREADS 4
#define MAX_THREADS 8

/* Evaluations per model; fewer under valgrind (MK_VALGRIND=1), which runs one
 * thread at a time and 50 times slower. */
static int iters = 200;
static uint64_t seed;

/* ---- per-thread failures and random numbers ----------------------------------- */

typedef struct {
    int count;
    char first[1024]; /* the first failure's message */
} failures;

static void fail_at(failures *f, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_at(failures *f, int line, const char *fmt, ...) {
    if (f->count++) return;
    int k = snprintf(f->first, sizeof f->first, "threads_test.c:%d: ", line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->first + k, sizeof f->first - (size_t)k, fmt, ap);
    va_end(ap);
}
#define TCHECK(f, cond, ...) \
    do { if (!(cond)) fail_at((f), __LINE__, __VA_ARGS__); } while (0)

/* xorshift64*, one state per thread */
typedef struct { uint64_t s; } rng;

static rng rng_for(uint64_t stream) { /* splitmix64 of seed and stream: never zero */
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (rng){z ? z : 88172645463325252ull};
}
static uint64_t rng_u64(rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}
static double rng_uniform(rng *r, double lo, double hi) { /* [lo, hi) */
    return lo + (hi - lo) * (double)(rng_u64(r) >> 11) / 9007199254740992.0;
}
static int64_t rng_int(rng *r, int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)(rng_u64(r) % (uint64_t)(hi - lo + 1));
}
/* uniform in ±[0.1, 1): never zero */
static float rng_value(rng *r) {
    return (float)((rng_u64(r) & 1 ? 1.0 : -1.0) * rng_uniform(r, 0.1, 1.0));
}

/* ---- the model: y = relu(x @ w1 + b1) @ w2 + b2 ----------------------------------- */

typedef struct {
    int64_t b, i, h, o;
    float *w1; /* (i, h) */
    float *b1; /* (1, h) */
    float *w2; /* (h, o) */
    float *b2; /* (1, o) */
    double tol; /* of the magnitude (mlp_check): 1e-5, or 1e-2 where cuDNN runs in TF32 */
    char script[1024];
} mlp;

static void mlp_init(mlp *n, rng *r, bool big) {
    n->b = big ? rng_int(r, 32, 64) : rng_int(r, 1, 8);
    n->i = big ? rng_int(r, 64, 128) : rng_int(r, 1, 24);
    n->h = big ? rng_int(r, 128, 256) : rng_int(r, 1, 32);
    n->o = rng_int(r, 1, 16);
    n->tol = 1e-5;
    n->w1 = malloc(sizeof(float) * (size_t)(n->i * n->h));
    n->b1 = malloc(sizeof(float) * (size_t)n->h);
    n->w2 = malloc(sizeof(float) * (size_t)(n->h * n->o));
    n->b2 = malloc(sizeof(float) * (size_t)n->o);
    for (int64_t k = 0; k < n->i * n->h; k++) n->w1[k] = rng_value(r);
    for (int64_t k = 0; k < n->h; k++) n->b1[k] = rng_value(r);
    for (int64_t k = 0; k < n->h * n->o; k++) n->w2[k] = rng_value(r);
    for (int64_t k = 0; k < n->o; k++) n->b2[k] = rng_value(r);
    snprintf(n->script, sizeof n->script,
             "$1 = InputTensor(x, float32, [%lld, %lld]);\n"
             "$2 = ConstantTensor(w1, float32, [%lld, %lld]);\n"
             "$3 = ConstantTensor(b1, float32, [1, %lld]);\n"
             "$4 = MatMulNode($1, $2);\n"
             "$5 = SumNode($4, $3);\n"
             "$6 = ReLUNode($5);\n"
             "$7 = ConstantTensor(w2, float32, [%lld, %lld]);\n"
             "$8 = ConstantTensor(b2, float32, [1, %lld]);\n"
             "$9 = MatMulNode($6, $7);\n"
             "$10 = SumNode($9, $8);\n"
             "result = $10;\n",
             (long long)n->b, (long long)n->i, (long long)n->i, (long long)n->h,
             (long long)n->h, (long long)n->h, (long long)n->o, (long long)n->o);
}

static void mlp_free(mlp *n) {
    free(n->w1);
    free(n->b1);
    free(n->w2);
    free(n->b2);
}

static mk_model *mlp_compile_on(mk_context *ctx, const mlp *n, bool no_passes, mk_device device,
                                bool cudnn, mk_error **err) {
    mk_named_tensor c[] = {{"w1", n->w1}, {"b1", n->b1}, {"w2", n->w2}, {"b2", n->b2}};
    mk_compile_options opts = {.device = device, .no_passes = no_passes, .use_cudnn = cudnn};
    return mk_compile(ctx, n->script, c, 4, &opts, err);
}

static mk_model *mlp_compile(mk_context *ctx, const mlp *n, bool no_passes, mk_error **err) {
    return mlp_compile_on(ctx, n, no_passes, MK_DEVICE_CPU, false, err);
}

/*
 * One evaluation with fresh random inputs, checked against a double loop.
 * float32 sums of k terms are off by about k·2^-24 of the sum of the terms'
 * magnitudes, not of the result (which may cancel to near zero): the bound is
 * n->tol (1e-5) of that magnitude (carried through the second layer) plus 1e-6.
 * cuDNN's fused groups multiply in TF32 (10-bit mantissas): 1e-2 there.
 */
static void mlp_check(mk_model *m, const mlp *n, rng *r, failures *f) {
    size_t nx = (size_t)(n->b * n->i), ny = (size_t)(n->b * n->o);
    float *x = malloc(sizeof(float) * nx), *y = malloc(sizeof(float) * ny);
    double *hid = malloc(sizeof(double) * (size_t)n->h); /* (h) one row's hidden layer */
    double *mag = malloc(sizeof(double) * (size_t)n->h); /* (h) its magnitudes */
    for (size_t k = 0; k < nx; k++) x[k] = rng_value(r);
    mk_error *err = NULL;
    mk_named_tensor in[] = {{"x", x}};
    int rc = mk_evaluate(m, in, 1, y, sizeof(float) * ny, &err);
    TCHECK(f, rc == 0, "evaluate: %s", mk_error_message(err));
    mk_error_free(err);
    for (int64_t b = 0; rc == 0 && b < n->b; b++) {
        for (int64_t j = 0; j < n->h; j++) {
            double s = n->b1[j], a = fabs(n->b1[j]);
            for (int64_t k = 0; k < n->i; k++) {
                double t = (double)x[b * n->i + k] * n->w1[k * n->h + j];
                s += t, a += fabs(t);
            }
            hid[j] = s > 0 ? s : 0;
            mag[j] = a;
        }
        for (int64_t j = 0; j < n->o; j++) {
            double s = n->b2[j], a = fabs(n->b2[j]);
            for (int64_t k = 0; k < n->h; k++) {
                s += hid[k] * n->w2[k * n->o + j];
                a += mag[k] * fabs(n->w2[k * n->o + j]);
            }
            double got = y[b * n->o + j];
            TCHECK(f, fabs(got - s) <= 1e-6 + n->tol * a, "y[%lld][%lld] = %.9g, want %.9g (%s)",
                   (long long)b, (long long)j, got, s, n->script);
        }
    }
    free(x);
    free(y);
    free(hid);
    free(mag);
}

/* A failing call must give its own error, of this code, mentioning `what`. */
static void expect_error(failures *f, mk_error *err, mk_error_code code, const char *what) {
    TCHECK(f, err && mk_error_code_of(err) == code && strstr(mk_error_message(err), what),
           "want error %d mentioning '%s', got %d: %s", (int)code, what,
           (int)mk_error_code_of(err), mk_error_message(err));
    mk_error_free(err);
}

/* Starts n threads running fn(args[k]) at once (a barrier) and joins them. */
static pthread_barrier_t start;
static void run_threads(int n, void *(*fn)(void *), void *args, size_t arg_size) {
    pthread_t t[MAX_THREADS];
    pthread_barrier_init(&start, NULL, (unsigned)n);
    for (int k = 0; k < n; k++)
        if (pthread_create(&t[k], NULL, fn, (char *)args + (size_t)k * arg_size)) {
            fprintf(stderr, "pthread_create failed\n");
            exit(2);
        }
    for (int k = 0; k < n; k++) pthread_join(t[k], NULL);
    pthread_barrier_destroy(&start);
}

/* ---- mk_cuda_available, first call, from every thread ------------------------------- */

typedef struct {
    int available;
    char reason[512];
} cuda_arg;

static void *cuda_worker(void *p) {
    cuda_arg *a = p;
    pthread_barrier_wait(&start);
    a->available = mk_cuda_available(a->reason, sizeof a->reason);
    return NULL;
}

static void test_cuda_available_concurrently(void) {
    cuda_arg a[MAX_THREADS] = {0};
    run_threads(MAX_THREADS, cuda_worker, a, sizeof a[0]);
    for (int k = 0; k < MAX_THREADS; k++) {
        CHECK(a[k].available == a[0].available, "thread %d says %d, thread 0 says %d", k,
              a[k].available, a[0].available);
        CHECK(a[k].available || a[k].reason[0], "thread %d: no CUDA and no reason", k);
        if (!a[0].available)
            CHECK(!strcmp(a[k].reason, a[0].reason), "thread %d: reason '%s', thread 0: '%s'",
                  k, a[k].reason, a[0].reason);
    }
    printf("# mk_cuda_available: %d (%s)\n", a[0].available, a[0].reason);
}

/* ---- the context-free functions, first calls, from every thread --------------------- */

typedef struct {
    int index;
    failures f;
    char *format; /* the first mk_script_format result, compared across threads */
} table_arg;

static const char *const table_script =
    "$1 = InputTensor(x, float32, [3, 5]);\n"
    "$2 = ConstantTensor(w, float32, [5, 7]);\n"
    "$3 = MatMulNode($1, $2);\n"
    "$4 = ConstantTensor(b, float32, [1, 7]);\n"
    "$5 = SumNode($3, $4);\n"
    "result = $5;\n";

static void *table_worker(void *p) {
    table_arg *a = p;
    failures *f = &a->f;
    pthread_barrier_wait(&start);
    for (int round = 0; round < 20; round++) {
        TCHECK(f, !strncmp(mk_version(), "0.", 2), "mk_version: %s", mk_version());
        TCHECK(f, strstr(mk_build_info(), "cpu") != NULL, "mk_build_info: %s", mk_build_info());
        size_t n_ops = mk_op_count();
        bool has_matmul = false;
        for (size_t i = 0; i < n_ops; i++) {
            const mk_op_desc *d = mk_op_info(i);
            TCHECK(f, d && d->name && d->signature && d->summary, "mk_op_info(%zu)", i);
            if (!d) continue;
            has_matmul |= !strcmp(d->name, "MatMulNode");
            TCHECK(f, mk_op_role_name(d->role) != NULL, "%s: no role name", d->name);
            TCHECK(f, (d->leaf == MK_LEAF_NONE) == (mk_leaf_kind_name(d->leaf) == NULL),
                   "%s: leaf kind name", d->name);
        }
        TCHECK(f, has_matmul && mk_op_info(n_ops) == NULL, "the op table has no MatMulNode");
        mk_dtype dt;
        TCHECK(f, mk_dtype_parse("bfloat16", 8, &dt) == 0 && dt == MK_DTYPE_BFLOAT16 &&
                      mk_dtype_size(dt) == 2 && !strcmp(mk_dtype_name(dt), "bfloat16"),
               "the dtype table");

        /* [3, 5] @ [5, 7] is [3, 7]; [3, 5] @ [4, 7] is a shape error */
        mk_tensor_info in[2] = {{.dtype = MK_DTYPE_FLOAT32, .rank = 2, .shape = {3, 5}},
                                {.dtype = MK_DTYPE_FLOAT32, .rank = 2, .shape = {5, 7}}};
        mk_tensor_info out;
        mk_error *err = NULL;
        int rc = mk_op_infer("MatMulNode", in, 2, NULL, 0, &out, &err);
        TCHECK(f, rc == 0 && out.rank == 2 && out.shape[0] == 3 && out.shape[1] == 7,
               "mk_op_infer: %s", mk_error_message(err));
        mk_error_free(err);
        err = NULL;
        in[1].shape[0] = 4;
        TCHECK(f, mk_op_infer("MatMulNode", in, 2, NULL, 0, &out, &err) != 0,
               "mk_op_infer accepted [3, 5] @ [4, 7]");
        expect_error(f, err, MK_ERR_SHAPE, "shape error");

        err = NULL;
        char *s = mk_script_format(table_script, &err);
        TCHECK(f, s && strstr(s, "MatMulNode"), "mk_script_format: %s", mk_error_message(err));
        mk_error_free(err);
        if (s && !a->format) a->format = s;
        else {
            TCHECK(f, !s || !strcmp(s, a->format), "mk_script_format changed: %s", s);
            mk_string_free(s);
        }
        err = NULL;
        TCHECK(f, mk_script_format("$1 = InputTensor(x, float32, [3, 5]);\nresult = $2;\n",
                                   &err) == NULL, "a script with an undefined $2 was formatted");
        expect_error(f, err, MK_ERR_NAME, "$2");

        err = NULL;
        size_t count = 0;
        mk_tensor_info *c = mk_script_constants(table_script, &count, &err);
        TCHECK(f, c && count == 2 && !strcmp(c[0].name, "w") && c[0].shape[1] == 7 &&
                      !strcmp(c[1].name, "b") && c[1].shape[0] == 1,
               "mk_script_constants: %zu: %s", count, mk_error_message(err));
        mk_error_free(err);
        mk_tensor_infos_free(c);
    }
    return NULL;
}

static void test_table_functions_concurrently(void) {
    table_arg a[MAX_THREADS] = {0};
    for (int k = 0; k < MAX_THREADS; k++) a[k].index = k;
    run_threads(MAX_THREADS, table_worker, a, sizeof a[0]);
    for (int k = 0; k < MAX_THREADS; k++) {
        CHECK(a[k].f.count == 0, "thread %d: %d failures, the first: %s", k, a[k].f.count,
              a[k].f.first);
        CHECK(a[k].format && a[0].format && !strcmp(a[k].format, a[0].format),
              "thread %d formatted the script differently", k);
    }
    for (int k = 0; k < MAX_THREADS; k++) mk_string_free(a[k].format);
}

/* ---- one shared context: compile, evaluate, free on every thread -------------------- */

typedef struct {
    int index;
    mk_context *ctx;
    mk_device device;
    bool cudnn;
    failures f;
    int evaluations;
} shared_arg;

static void *shared_worker(void *p) {
    shared_arg *a = p;
    failures *f = &a->f;
    rng r = rng_for(100 + (uint64_t)a->index);
    pthread_barrier_wait(&start);
    for (int round = 0; round < 4; round++) {
        bool big = round == 3; /* one large enough for the parallel kernels and BLAS */
        mlp n;
        mlp_init(&n, &r, big);
        if (a->cudnn) n.tol = 1e-2;
        mk_error *err = NULL;
        mk_model *m = mlp_compile_on(a->ctx, &n, (round + a->index) % 2 == 1, a->device,
                                     a->cudnn, &err);
        TCHECK(f, m != NULL, "compile: %s\n%s", mk_error_message(err), n.script);
        mk_error_free(err);
        for (int it = 0; m && it < (big ? iters / 10 + 1 : iters); it++) {
            mlp_check(m, &n, &r, f);
            a->evaluations++;
        }
        if (m) { /* a failed evaluation: its own error, the model still runs after it */
            size_t bytes = sizeof(float) * (size_t)(n.b * n.o);
            float *out = malloc(bytes + sizeof(float));
            err = NULL;
            mk_named_tensor in[] = {{"nope", n.w1}};
            TCHECK(f, mk_evaluate(m, in, 1, out, bytes + sizeof(float), &err) != 0,
                   "bad evaluate passed");
            expect_error(f, err, MK_ERR_ARGUMENT, "bytes");
            err = NULL;
            TCHECK(f, mk_evaluate(m, in, 1, out, bytes, &err) != 0, "bad evaluate passed");
            expect_error(f, err, MK_ERR_INPUT, "'nope' is not an input");
            free(out);
            mlp_check(m, &n, &r, f);
        }
        /* a failing compile in the same context, at the same time as the others' */
        err = NULL;
        TCHECK(f, !mk_compile(a->ctx, "$1 = InputTensor(x, float32, [2, 3]);\nresult = $1\n",
                              NULL, 0, NULL, &err),
               "a script without its last ';' compiled");
        expect_error(f, err, MK_ERR_SYNTAX, "syntax error");
        mk_model_free(m);
        mlp_free(&n);
    }
    return NULL;
}

static void shared_context_on(mk_device device, bool cudnn) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    CHECK(ctx != NULL, "%s", mk_error_message(err));
    if (!ctx) return;
    shared_arg a[N_THREADS] = {0};
    for (int k = 0; k < N_THREADS; k++)
        a[k] = (shared_arg){.index = k, .ctx = ctx, .device = device, .cudnn = cudnn};
    run_threads(N_THREADS, shared_worker, a, sizeof a[0]);
    int total = 0;
    for (int k = 0; k < N_THREADS; k++) {
        CHECK(a[k].f.count == 0, "thread %d: %d failures, the first: %s", k, a[k].f.count,
              a[k].f.first);
        total += a[k].evaluations;
    }
    printf("# shared context (%s): %d threads, %d checked evaluations\n",
           device == MK_DEVICE_CPU ? "cpu" : cudnn ? "cuda, cudnn" : "cuda", N_THREADS, total);
    mk_context_free(ctx);
}

static void test_shared_context(void) { shared_context_on(MK_DEVICE_CPU, false); }
/* The same on the GPU, where there is one: each model has its own stream and graph,
 * and compiles (graph captures) and frees take turns (core/model.c). */
static void test_shared_context_cuda(void) { shared_context_on(MK_DEVICE_CUDA, false); }
/* With cuDNN: the context's one cuDNN handle and plan cache serve every thread. */
static void test_shared_context_cudnn(void) { shared_context_on(MK_DEVICE_CUDA, true); }

/* ---- compiled on one thread, evaluated on a second, freed on a third ------------------ */

#define N_HANDOFF 6

typedef struct {
    mk_model *m;
    mlp *n;
} job;

/* A closable queue of jobs between two threads. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job items[N_HANDOFF];
    int head, tail;
    bool closed;
} queue;

static void queue_init(queue *q) {
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
}
static void queue_destroy(queue *q) {
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}
static void queue_push(queue *q, job j) { /* never more than N_HANDOFF in all */
    pthread_mutex_lock(&q->mu);
    q->items[q->tail++] = j;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
static void queue_close(queue *q) {
    pthread_mutex_lock(&q->mu);
    q->closed = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
static bool queue_pop(queue *q, job *j) { /* false: closed and empty */
    pthread_mutex_lock(&q->mu);
    while (q->head == q->tail && !q->closed) pthread_cond_wait(&q->cv, &q->mu);
    bool got = q->head < q->tail;
    if (got) *j = q->items[q->head++];
    pthread_mutex_unlock(&q->mu);
    return got;
}

typedef struct {
    mk_context *ctx;
    mlp *nets;       /* [N_HANDOFF] */
    queue compiled;  /* compiler -> evaluator */
    queue evaluated; /* evaluator -> freer */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool ctx_freed;  /* set by the main thread once it has freed the context */
    failures f[3];   /* compiler, evaluator, freer */
    int freed;
} handoff;

static void *compiler(void *p) {
    handoff *h = p;
    for (int k = 0; k < N_HANDOFF; k++) {
        mk_error *err = NULL;
        mk_model *m = mlp_compile(h->ctx, &h->nets[k], k % 2, &err);
        TCHECK(&h->f[0], m != NULL, "compile: %s", mk_error_message(err));
        mk_error_free(err);
        if (m) queue_push(&h->compiled, (job){m, &h->nets[k]});
    }
    queue_close(&h->compiled);
    return NULL;
}

static void *evaluator(void *p) {
    handoff *h = p;
    rng r = rng_for(200);
    job j;
    while (queue_pop(&h->compiled, &j)) {
        for (int it = 0; it < iters / 2 + 1; it++) mlp_check(j.m, j.n, &r, &h->f[1]);
        queue_push(&h->evaluated, j);
    }
    queue_close(&h->evaluated);
    return NULL;
}

/* Frees each model as the next one arrives and keeps the last until the main
 * thread has freed the context: that model alone keeps the context alive. */
static void *freer(void *p) {
    handoff *h = p;
    job j, held = {0};
    while (queue_pop(&h->evaluated, &j)) {
        mk_model_free(held.m);
        h->freed += held.m != NULL;
        held = j;
    }
    pthread_mutex_lock(&h->mu);
    while (!h->ctx_freed) pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    if (held.m) {
        mk_tensor_info info;
        TCHECK(&h->f[2], mk_model_output_info(held.m, &info) == 0 &&
                             info.shape[1] == held.n->o,
               "the last model's output info");
        mk_model_free(held.m);
        h->freed++;
    }
    return NULL;
}

static void test_models_across_threads(void) {
    static handoff h;
    memset(&h, 0, sizeof h);
    mk_error *err = NULL;
    h.ctx = mk_context_new(&err);
    CHECK(h.ctx != NULL, "%s", mk_error_message(err));
    if (!h.ctx) return;
    rng r = rng_for(300);
    mlp nets[N_HANDOFF];
    for (int k = 0; k < N_HANDOFF; k++) mlp_init(&nets[k], &r, false);
    h.nets = nets;
    queue_init(&h.compiled);
    queue_init(&h.evaluated);
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);

    pthread_t tc, te, tf;
    pthread_create(&tc, NULL, compiler, &h);
    pthread_create(&te, NULL, evaluator, &h);
    pthread_create(&tf, NULL, freer, &h);
    pthread_join(tc, NULL);
    /* every model is compiled; the evaluator and the freer still hold some of them */
    mk_context_free(h.ctx);
    pthread_mutex_lock(&h.mu);
    h.ctx_freed = true;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    pthread_join(te, NULL);
    pthread_join(tf, NULL);

    static const char *const who[] = {"compiler", "evaluator", "freer"};
    for (int k = 0; k < 3; k++)
        CHECK(h.f[k].count == 0, "%s: %d failures, the first: %s", who[k], h.f[k].count,
              h.f[k].first);
    CHECK(h.freed == N_HANDOFF, "%d of %d models were freed", h.freed, N_HANDOFF);
    for (int k = 0; k < N_HANDOFF; k++) mlp_free(&nets[k]);
    queue_destroy(&h.compiled);
    queue_destroy(&h.evaluated);
    pthread_mutex_destroy(&h.mu);
    pthread_cond_destroy(&h.cv);
}

/* ---- a context per thread ----------------------------------------------------------- */

static void *own_context_worker(void *p) {
    shared_arg *a = p;
    failures *f = &a->f;
    rng r = rng_for(400 + (uint64_t)a->index);
    pthread_barrier_wait(&start);
    for (int round = 0; round < 3; round++) {
        mk_error *err = NULL;
        mk_context *ctx = mk_context_new(&err);
        TCHECK(f, ctx != NULL, "context: %s", mk_error_message(err));
        mk_error_free(err);
        if (!ctx) return NULL;
        mlp n[2];
        mk_model *m[2];
        for (int k = 0; k < 2; k++) {
            mlp_init(&n[k], &r, false);
            err = NULL;
            m[k] = mlp_compile(ctx, &n[k], k == 1, &err);
            TCHECK(f, m[k] != NULL, "compile: %s", mk_error_message(err));
            mk_error_free(err);
        }
        for (int it = 0; it < iters / 2; it++)
            for (int k = 0; k < 2; k++)
                if (m[k]) {
                    mlp_check(m[k], &n[k], &r, f);
                    a->evaluations++;
                }
        /* the context first, then its models; or the other way round */
        if ((round + a->index) % 2) mk_context_free(ctx);
        for (int k = 0; k < 2; k++) {
            mk_model_free(m[k]);
            mlp_free(&n[k]);
        }
        if ((round + a->index) % 2 == 0) mk_context_free(ctx);
    }
    return NULL;
}

static void test_context_per_thread(void) {
    shared_arg a[N_THREADS] = {0};
    for (int k = 0; k < N_THREADS; k++) a[k].index = k;
    run_threads(N_THREADS, own_context_worker, a, sizeof a[0]);
    for (int k = 0; k < N_THREADS; k++)
        CHECK(a[k].f.count == 0, "thread %d: %d failures, the first: %s", k, a[k].f.count,
              a[k].f.first);
}

/* ---- introspection of a model while another thread evaluates it --------------------- */

typedef struct {
    int index;
    mk_model *m;
    const mlp *n;
    mk_stats stats;     /* as read before the threads start */
    const char *script; /* as read before the threads start */
    const char *report; /* mk_model_fusion_report, as read before the threads start */
    failures f;
} look_arg;

static void *look_worker(void *p) {
    look_arg *a = p;
    failures *f = &a->f;
    pthread_barrier_wait(&start);
    if (a->index == 0) { /* the one thread that evaluates */
        rng r = rng_for(500);
        for (int it = 0; it < iters; it++) mlp_check(a->m, a->n, &r, f);
        return NULL;
    }
    for (int it = 0; it < iters; it++) {
        mk_tensor_info in, out;
        mk_stats st;
        TCHECK(f, mk_model_input_count(a->m) == 1, "input count");
        TCHECK(f, mk_model_input_info(a->m, 0, &in) == 0 && !strcmp(in.name, "x") &&
                      in.shape[0] == a->n->b && in.shape[1] == a->n->i,
               "input info");
        TCHECK(f, mk_model_output_info(a->m, &out) == 0 && out.shape[1] == a->n->o,
               "output info");
        TCHECK(f, mk_model_stats(a->m, &st) == 0 && st.arena_bytes == a->stats.arena_bytes &&
                      st.launches == a->stats.launches,
               "stats");
        TCHECK(f, mk_model_script(a->m) == a->script, "script");
        TCHECK(f, mk_model_fusion_report(a->m) == a->report, "fusion report");
    }
    return NULL;
}

static void test_introspection_while_evaluating(void) {
    rng r = rng_for(600);
    mlp n;
    mlp_init(&n, &r, false);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = ctx ? mlp_compile(ctx, &n, false, &err) : NULL;
    CHECK(m != NULL, "%s", mk_error_message(err));
    mk_error_free(err);
    if (m) {
        look_arg a[3] = {0};
        for (int k = 0; k < 3; k++) {
            a[k] = (look_arg){.index = k, .m = m, .n = &n, .script = mk_model_script(m),
                             .report = mk_model_fusion_report(m)};
            mk_model_stats(m, &a[k].stats);
        }
        run_threads(3, look_worker, a, sizeof a[0]);
        for (int k = 0; k < 3; k++)
            CHECK(a[k].f.count == 0, "thread %d: %d failures, the first: %s", k, a[k].f.count,
                  a[k].f.first);
    }
    mk_model_free(m);
    mk_context_free(ctx);
    mlp_free(&n);
}

int main(void) {
    /* small graphs, but the CPU's threaded paths: the cost rule would keep them on one thread */
    setenv("MK_CPU_FORK", "always", 0);
    seed = test_seed();
    if (getenv("MK_VALGRIND")) iters = 10;
    /* first: these are the process's first calls into the once-filled tables */
    RUN(test_cuda_available_concurrently);
    RUN(test_table_functions_concurrently);
    RUN(test_shared_context); /* the process's first compiles */
    RUN(test_models_across_threads);
    RUN(test_context_per_thread);
    RUN(test_introspection_while_evaluating);
    if (mk_cuda_available(NULL, 0)) {
        RUN(test_shared_context_cuda);
        if (strstr(mk_build_info(), "cuDNN"))
            RUN(test_shared_context_cudnn);
        else
            SKIP(test_shared_context_cudnn, "built without cuDNN");
    } else {
        SKIP(test_shared_context_cuda, "no CUDA device");
        SKIP(test_shared_context_cudnn, "no CUDA device");
    }
    return test_summary("threads_test");
}
