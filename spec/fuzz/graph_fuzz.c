/*
 * graph_fuzz.c — the C API on random graphs, passes on against passes off.
 *
 * The input is a list of choices: each byte picks an op from the op table
 * (mk_op_count/mk_op_info), its operands among the nodes made so far or new
 * leaves of fitting shapes (inputs, constants, BufferTensors), and its integer
 * arguments (slice rows, a reshape's factorisation, a permutation, bounds).
 * mk_op_infer checks each node as the compiler will; most invalid nodes are
 * dropped, a few kept (the compile must then fail with a message). The script
 * is compiled on the CPU twice, with the passes and with `no_passes`, and both
 * models are evaluated twice on the same deterministic inputs (buffers keep
 * their state in between): the outputs must agree bit for bit or within 1e-5
 * relative (of the element, or of the output's largest value where a sum
 * cancels). A disagreement aborts with the script and both compiled scripts.
 *
 *     build-fuzz/fuzz/graph_fuzz -max_total_time=60 build-fuzz/corpus/graph_fuzz
 *     build-fuzz/fuzz/graph_fuzz crash-<sha1>      prints the script and both results
 *     MK_FUZZ_VERBOSE=1 build-fuzz/fuzz/graph_fuzz -runs=0 DIR   every input's script
 * Seeds: build-fuzz/seeds/graph_fuzz/ (spec/fuzz/seeds.lua; any bytes are a graph).
 */
#include <math.h>
#include <stdarg.h>

#include "fuzz.h"

#define MAX_NODES 48

typedef struct {
    int id; /* $id */
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    mk_leaf_kind leaf;
    char name[16];  /* inputs and constants */
    int64_t lo, hi; /* int64 leaves: values in [lo, hi) */
} gnode;

typedef struct {
    fuzz_bytes in;
    gnode n[MAX_NODES];
    int count;
    char text[16384];
    size_t len;
    bool full;
} gen;

static void emit(gen *g, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(g->text + g->len, sizeof g->text - g->len, fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof g->text - g->len) abort(); /* MAX_NODES lines always fit */
    g->len += (size_t)k;
}

static void emit_list(gen *g, const int64_t *v, int n) {
    emit(g, "[");
    for (int i = 0; i < n; i++) emit(g, i ? ", %lld" : "%lld", (long long)v[i]);
    emit(g, "]");
}

static unsigned take(gen *g, unsigned mod) { return fuzz_take(&g->in, mod); }

/* ---- leaves ------------------------------------------------------------------ */

static int new_leaf(gen *g, mk_leaf_kind kind, mk_dtype dtype, int rank, const int64_t *shape,
                    int64_t lo, int64_t hi) {
    if (g->count >= MAX_NODES) {
        g->full = true;
        return -1;
    }
    gnode *x = &g->n[g->count];
    *x = (gnode){.id = g->count + 1, .dtype = dtype, .rank = rank, .leaf = kind, .lo = lo, .hi = hi};
    memcpy(x->shape, shape, sizeof(int64_t) * (size_t)rank);
    const char *dt = mk_dtype_name(dtype);
    if (kind == MK_LEAF_BUFFER) {
        emit(g, "$%d = BufferTensor(%s, ", x->id, dt);
    } else {
        snprintf(x->name, sizeof x->name, "%s%d", kind == MK_LEAF_INPUT ? "in" : "c", x->id);
        emit(g, "$%d = %s(%s, %s, ", x->id, kind == MK_LEAF_INPUT ? "InputTensor" : "ConstantTensor",
             x->name, dt);
    }
    emit_list(g, shape, rank);
    emit(g, ");\n");
    return g->count++;
}

/* An input or constant (a buffer where asked) of this shape: float32 mostly. */
static int leaf_of(gen *g, mk_dtype dtype, int rank, const int64_t *shape, bool buffer_ok) {
    unsigned k = take(g, buffer_ok ? 5 : 4);
    mk_leaf_kind kind = k == 4 ? MK_LEAF_BUFFER : k >= 2 ? MK_LEAF_CONSTANT : MK_LEAF_INPUT;
    return new_leaf(g, kind, dtype, rank, shape, 0, 4);
}

static mk_dtype some_dtype(gen *g) {
    unsigned k = take(g, 32);
    if (k < 26) return MK_DTYPE_FLOAT32;
    if (k < 30) return MK_DTYPE_INT64;
    return (mk_dtype)(MK_DTYPE_FLOAT16 + k % 3);
}

static int some_shape(gen *g, int64_t *shape) {
    int rank = 1 + (int)take(g, MK_MAX_RANK);
    for (int i = 0; i < rank; i++) shape[i] = 1 + take(g, take(g, 4) ? 4 : 8);
    return rank;
}

/* An int64 [1] bound whose value is v (now and then one past what is valid,
 * which the kernels must refuse at run time). */
static int bound(gen *g, int64_t v) {
    if (take(g, 16) == 0) v += 1 + take(g, 3);
    mk_leaf_kind kind = take(g, 2) ? MK_LEAF_INPUT : MK_LEAF_CONSTANT;
    return new_leaf(g, kind, MK_DTYPE_INT64, 1, (int64_t[]){1}, v, v + 1);
}

/* ---- choosing operands ------------------------------------------------------------ */

static int pick(gen *g) {
    if (!g->count) return -1;
    unsigned recent = (unsigned)(g->count < 6 ? g->count : 6);
    return take(g, 2) ? g->count - 1 - (int)take(g, recent) : (int)take(g, (unsigned)g->count);
}

typedef bool (*fits_fn)(const gnode *a, const gnode *x);

/* A node that fits `a` (chosen among all that do), or -1 to make a new one. */
static int find(gen *g, const gnode *a, fits_fn fits) {
    int cand[MAX_NODES], n = 0;
    for (int i = 0; i < g->count; i++)
        if (fits(a, &g->n[i])) cand[n++] = i;
    if (!n || take(g, 4) == 0) return -1;
    return cand[take(g, (unsigned)n)];
}

static bool fits_broadcast(const gnode *a, const gnode *x) {
    if (x->dtype != a->dtype || x->rank != a->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (x->shape[i] != a->shape[i] && x->shape[i] != 1) return false;
    return true;
}

static bool fits_matmul(const gnode *a, const gnode *x) {
    if (x->dtype != MK_DTYPE_FLOAT32) return false;
    if (a->rank == 1) return x->rank == 2 && x->shape[0] == a->shape[0];
    if (a->rank == 2) return x->rank == 2 && x->shape[0] == a->shape[1];
    return a->rank == 3 && x->rank == 3 && x->shape[0] == a->shape[0] && x->shape[1] == a->shape[2];
}

static bool fits_norm(const gnode *a, const gnode *x) {
    return x->dtype == a->dtype && x->rank == 1 && x->shape[0] == a->shape[a->rank - 1];
}

static bool fits_rows(const gnode *a, const gnode *x) { /* replacement rows of a */
    if (x->dtype != a->dtype || x->rank != a->rank || x->shape[0] > a->shape[0]) return false;
    for (int i = 1; i < a->rank; i++)
        if (x->shape[i] != a->shape[i]) return false;
    return true;
}

static bool fits_table(const gnode *a, const gnode *x) {
    (void)a;
    return x->rank == 2;
}

/* ---- one node ------------------------------------------------------------------ */

/* Emits `$id = op(args);` when mk_op_infer accepts it (or, now and then, when it
 * does not: the compile must then fail cleanly). Returns the node or -1. */
static int node(gen *g, const mk_op_desc *d, const int *ins, int n_in, const int64_t *attrs,
                int n_attrs) {
    if (g->count >= MAX_NODES) {
        g->full = true;
        return -1;
    }
    mk_tensor_info infos[4], out;
    for (int i = 0; i < n_in; i++) {
        const gnode *x = &g->n[ins[i]];
        infos[i] = (mk_tensor_info){.dtype = x->dtype, .rank = x->rank};
        memcpy(infos[i].shape, x->shape, sizeof x->shape);
    }
    mk_error *err = NULL;
    bool valid = mk_op_infer(d->name, infos, (size_t)n_in, attrs, (size_t)n_attrs, &out, &err) == 0;
    if (!valid) {
        fuzz_check_error(&err, "mk_op_infer", g->text);
        if (take(g, 16)) return -1;
        out = (mk_tensor_info){.dtype = MK_DTYPE_FLOAT32, .rank = 1, .shape = {1}};
    }
    gnode *y = &g->n[g->count];
    *y = (gnode){.id = g->count + 1, .dtype = out.dtype, .rank = out.rank};
    memcpy(y->shape, out.shape, sizeof y->shape);
    emit(g, "$%d = %s(", y->id, d->name);
    int k = 0, a = 0;
    for (const char *c = d->signature; *c; c++) {
        if (c != d->signature) emit(g, ", ");
        if (*c == 'n' || *c == 'r') emit(g, "$%d", g->n[ins[k++]].id);
        else if (*c == 'i') emit(g, "%lld", (long long)attrs[a++]);
        else if (*c == 'l') emit_list(g, attrs + a, n_attrs - a), a = n_attrs;
    }
    emit(g, ");\n");
    return g->count++;
}

/* A factorisation of x's element count into 1 to MK_MAX_RANK dimensions. */
static int reshape_to(gen *g, const gnode *x, int64_t *dims) {
    int64_t left = 1;
    for (int i = 0; i < x->rank; i++) left *= x->shape[i];
    int rank = 0, want = 1 + (int)take(g, MK_MAX_RANK);
    while (rank < want - 1) {
        int64_t divs[64];
        int n = 0;
        for (int64_t d = 1; d <= left && n < 64; d++)
            if (left % d == 0) divs[n++] = d;
        dims[rank++] = divs[take(g, (unsigned)n)];
        left /= dims[rank - 1];
    }
    dims[rank++] = left;
    return rank;
}

static void step(gen *g, const mk_op_desc *d) {
    int x = pick(g), ins[4];
    int64_t attrs[MK_MAX_RANK];
    if (x < 0) return;
    const gnode *a = &g->n[x];
    const char *name = d->name;
    if (d->role == MK_ROLE_LEAF) {
        int64_t shape[MK_MAX_RANK]; /* a new shape, or x's (to combine with it) */
        int rank = a->rank;
        memcpy(shape, a->shape, sizeof shape);
        if (take(g, 2)) rank = some_shape(g, shape);
        new_leaf(g, d->leaf, some_dtype(g), rank, shape, 0, 4);
    } else if (!strcmp(name, "MatMulNode")) {
        int y = find(g, a, fits_matmul);
        if (y < 0 && a->rank <= 3) {
            int64_t s[3] = {a->shape[0], 1 + take(g, 4), 0};
            if (a->rank == 2) s[0] = a->shape[1];
            if (a->rank == 3) s[1] = a->shape[2], s[2] = 1 + take(g, 4);
            y = leaf_of(g, MK_DTYPE_FLOAT32, a->rank == 1 ? 2 : a->rank, s, false);
            a = &g->n[x];
        }
        if (y >= 0) node(g, d, (int[]){x, y}, 2, NULL, 0);
    } else if (!strcmp(name, "RmsNormNode")) {
        int y = find(g, a, fits_norm);
        if (y < 0) y = leaf_of(g, a->dtype, 1, &a->shape[a->rank - 1], false);
        if (y >= 0) node(g, d, (int[]){x, y}, 2, NULL, 0);
    } else if (!strcmp(name, "EmbeddingNode")) {
        int t = a->rank == 2 ? x : find(g, a, fits_table);
        if (t < 0) t = leaf_of(g, MK_DTYPE_FLOAT32, 2, (int64_t[]){1 + take(g, 6), 1 + take(g, 4)}, false);
        if (t < 0) return;
        int64_t rows = g->n[t].shape[0], hi = rows + (take(g, 16) == 0);
        int ids = new_leaf(g, take(g, 2) ? MK_LEAF_INPUT : MK_LEAF_CONSTANT, MK_DTYPE_INT64, 1,
                           (int64_t[]){1 + take(g, 4)}, 0, hi);
        if (ids >= 0) node(g, d, (int[]){t, ids}, 2, NULL, 0);
    } else if (!strcmp(name, "SlicedSoftmaxNode")) {
        int p = bound(g, take(g, (unsigned)a->shape[a->rank - 1] + 1));
        if (p >= 0) node(g, d, (int[]){x, p}, 2, NULL, 0);
    } else if (!strcmp(name, "SliceNode")) {
        attrs[0] = take(g, (unsigned)a->shape[0]);
        attrs[1] = attrs[0] + 1 + take(g, (unsigned)(a->shape[0] - attrs[0]));
        node(g, d, &x, 1, attrs, 2);
    } else if (!strcmp(name, "ReshapeNode")) {
        int rank = reshape_to(g, a, attrs);
        node(g, d, &x, 1, attrs, rank);
    } else if (!strcmp(name, "PermuteNode")) {
        for (int i = 0; i < a->rank; i++) attrs[i] = i;
        for (int i = a->rank - 1; i > 0; i--) { /* Fisher–Yates */
            int j = (int)take(g, (unsigned)i + 1);
            int64_t t = attrs[i];
            attrs[i] = attrs[j], attrs[j] = t;
        }
        node(g, d, &x, 1, attrs, a->rank);
    } else if (!strcmp(name, "ReplaceSliceNode")) {
        /* into a buffer mostly: its writes persist, and views of it are read around them */
        if (take(g, 3)) {
            int64_t shape[MK_MAX_RANK];
            int rank = some_shape(g, shape);
            int buf = -1;
            for (int i = g->count - 1; i >= 0 && take(g, 3); i--)
                if (g->n[i].leaf == MK_LEAF_BUFFER) buf = i;
            x = buf >= 0 ? buf : new_leaf(g, MK_LEAF_BUFFER, MK_DTYPE_FLOAT32, rank, shape, 0, 4);
            if (x < 0) return;
            a = &g->n[x];
        }
        int r = find(g, a, fits_rows);
        if (r < 0) {
            int64_t s[MK_MAX_RANK];
            memcpy(s, a->shape, sizeof s);
            s[0] = 1 + take(g, (unsigned)a->shape[0]);
            r = leaf_of(g, a->dtype, a->rank, s, false);
            a = &g->n[x];
        }
        if (r < 0) return;
        int64_t k = g->n[r].shape[0], begin = take(g, (unsigned)(a->shape[0] - k + 1));
        if (k > a->shape[0]) begin = 0;
        ins[0] = x, ins[1] = r;
        if ((ins[2] = bound(g, begin)) < 0 || (ins[3] = bound(g, begin + k)) < 0) return;
        node(g, d, ins, 4, NULL, 0);
    } else if (!strcmp(d->signature, "n")) {
        node(g, d, &x, 1, NULL, 0);
    } else if (!strcmp(d->signature, "nn")) { /* pointwise binary: b broadcast onto a */
        int y = find(g, a, fits_broadcast);
        if (y < 0) {
            int64_t s[MK_MAX_RANK];
            for (int i = 0; i < a->rank; i++) s[i] = take(g, 3) ? a->shape[i] : 1;
            y = leaf_of(g, a->dtype, a->rank, s, true);
            a = &g->n[x];
        }
        if (y >= 0) node(g, d, (int[]){x, y}, 2, NULL, 0);
    }
}

/* ---- compile, evaluate, compare -------------------------------------------------------- */

typedef struct {
    mk_named_tensor *t;
    size_t n;
} tensors;

static void tensors_free(tensors *ts) {
    for (size_t i = 0; i < ts->n; i++) free((void *)ts->t[i].data);
    free(ts->t);
}

/* Data for the leaves of one kind: int64 within each leaf's [lo, hi), the rest
 * from fuzz_fill; deterministic in the input's hash. */
static tensors leaf_data(const gen *g, mk_leaf_kind kind, uint64_t seed) {
    tensors ts = {calloc(MAX_NODES, sizeof(mk_named_tensor)), 0};
    if (!ts.t) abort();
    for (int i = 0; i < g->count; i++) {
        const gnode *x = &g->n[i];
        if (x->leaf != kind) continue;
        int64_t numel = 1;
        for (int k = 0; k < x->rank; k++) numel *= x->shape[k];
        void *d = malloc((size_t)numel * mk_dtype_size(x->dtype));
        if (!d) abort();
        uint64_t s = seed ^ (uint64_t)x->id * 0x9E3779B97F4A7C15ull;
        fuzz_fill(d, x->dtype, numel, &s, x->hi - x->lo);
        if (x->dtype == MK_DTYPE_INT64)
            for (int64_t k = 0; k < numel; k++) ((int64_t *)d)[k] += x->lo;
        ts.t[ts.n++] = (mk_named_tensor){x->name, d};
    }
    return ts;
}

static void report(const char *text, mk_model *on, mk_model *off, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "\n==== graph_fuzz: passes on and off disagree: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n---- script\n%s---- compiled with passes\n%s---- compiled with no_passes\n%s",
            text, mk_model_script(on), mk_model_script(off));
    abort();
}

static void compare(const char *text, mk_model *on, mk_model *off, const mk_tensor_info *out,
                    const void *ya, const void *yb, int64_t numel, int rep) {
    if (out->dtype != MK_DTYPE_FLOAT32) {
        if (memcmp(ya, yb, (size_t)numel * mk_dtype_size(out->dtype)))
            report(text, on, off, "%s outputs differ (evaluation %d)", mk_dtype_name(out->dtype), rep + 1);
        return;
    }
    const float *a = ya, *b = yb;
    double scale = 0;
    for (int64_t i = 0; i < numel; i++)
        if (isfinite(a[i]) && fabs(a[i]) > scale) scale = fabs(a[i]);
    for (int64_t i = 0; i < numel; i++) {
        if (a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))) continue;
        double tol = 1e-5 * fmax(fmax(fabs(a[i]), fabs(b[i])), scale);
        if (isfinite(a[i]) && isfinite(b[i]) && fabs((double)a[i] - b[i]) <= tol) continue;
        report(text, on, off, "element %lld: %.9g with passes, %.9g without (evaluation %d)",
               (long long)i, a[i], b[i], rep + 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static gen g;
    memset(&g, 0, sizeof g);
    g.in = (fuzz_bytes){data, size};
    size_t n_ops = mk_op_count();

    int64_t shape[MK_MAX_RANK];
    int rank = some_shape(&g, shape);
    new_leaf(&g, take(&g, 4) ? MK_LEAF_INPUT : MK_LEAF_BUFFER, some_dtype(&g), rank, shape, 0, 4);
    for (unsigned steps = 1 + take(&g, 24); steps-- && !g.full;) {
        const mk_op_desc *d = mk_op_info(take(&g, (unsigned)n_ops));
        if (d && !(d->flags & MK_OP_INTERNAL)) step(&g, d);
    }
    /* the output: the last node mostly, else any */
    int out_node = take(&g, 4) ? g.count - 1 : (int)take(&g, (unsigned)g.count);
    emit(&g, "result = $%d;\n", g.n[out_node].id);

    uint64_t seed = fuzz_hash(data, size);
    tensors consts = leaf_data(&g, MK_LEAF_CONSTANT, seed), inputs = leaf_data(&g, MK_LEAF_INPUT, seed);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    if (!ctx) FUZZ_FINDING("mk_context_new failed");
    mk_compile_options opt_on = {.max_bytes = FUZZ_MAX_BYTES};
    mk_compile_options opt_off = {.no_passes = true, .max_bytes = FUZZ_MAX_BYTES};
    mk_model *on = mk_compile(ctx, g.text, consts.t, consts.n, &opt_on, &err);
    if (!on) fuzz_check_error(&err, "mk_compile (passes)", g.text);
    mk_model *off = mk_compile(ctx, g.text, consts.t, consts.n, &opt_off, &err);
    if (getenv("MK_FUZZ_VERBOSE"))
        fprintf(stderr, "%s# passes: %s; no_passes: %s\n", g.text, on ? "compiled" : "failed",
                off ? "compiled" : err ? mk_error_message(err) : "failed");
    if (!off) fuzz_check_error(&err, "mk_compile (no_passes)", g.text);

    if (on && off) {
        mk_tensor_info out, out_off;
        if (mk_model_output_info(on, &out) || mk_model_output_info(off, &out_off) ||
            out.dtype != out_off.dtype || out.rank != out_off.rank ||
            memcmp(out.shape, out_off.shape, sizeof out.shape))
            report(g.text, on, off, "the outputs' types differ");
        int64_t numel = 1;
        for (int i = 0; i < out.rank; i++) numel *= out.shape[i];
        size_t bytes = (size_t)numel * mk_dtype_size(out.dtype);
        void *ya = malloc(bytes), *yb = malloc(bytes);
        if (!ya || !yb) abort();
        for (int rep = 0; rep < 2; rep++) {
            mk_error *ea = NULL, *eb = NULL;
            int ra = mk_evaluate(on, inputs.t, inputs.n, ya, bytes, &ea);
            int rb = mk_evaluate(off, inputs.t, inputs.n, yb, bytes, &eb);
            /* no_passes runs every node the passes keep (and the dead ones): where the
             * optimised model refuses a bound, so must the plain one */
            if (ra && !rb)
                report(g.text, on, off, "only the model with passes fails: %s", mk_error_message(ea));
            if (ra) fuzz_check_error(&ea, "mk_evaluate (passes)", g.text);
            if (rb) fuzz_check_error(&eb, "mk_evaluate (no_passes)", g.text);
            if (ra || rb) break; /* a failed evaluation may have written part of a buffer */
            compare(g.text, on, off, &out, ya, yb, numel, rep);
        }
        free(ya);
        free(yb);
    }
    mk_model_free(on);
    mk_model_free(off);
    mk_context_free(ctx);
    tensors_free(&consts);
    tensors_free(&inputs);
    return 0;
}
