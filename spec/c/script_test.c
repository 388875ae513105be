/*
 * script_test.c — the script parser and printer: HamKaas scripts compile
 * unchanged, printing round-trips, damaged scripts fail cleanly, storage
 * dtypes parse and pass through views; and what a compiled script's model
 * does with its nodes and inputs (many inputs, dead nodes, max_bytes, models
 * freed across threads). Bad scripts and API misuse: script_errors_test.c.
 */
#include "moonkaas.h"
#include "test.h"
#include "mnist_script.h"

#include <pthread.h>

static mk_context *ctx;


/* Every node of the catalogue in one script. */
static const char *every_node =
    "# a comment line\n"
    "$1 = InputTensor(x, float32, [4, 8]);   # trailing comment\n"
    "$2 = ConstantTensor(w, float32, [8, 8]);\n"
    "$3 = BufferTensor(float32, [6, 8]);\n"
    "$4 = InputTensor(pos, int64, [1]);\n"
    "$5 = InputTensor(pos1, int64, [1]);\n"
    "$6 = MatMulNode($1, $2);\n"
    "$7 = SumNode($6, $1);\n"
    "$8 = HadamardProductNode($7, $1);\n"
    "$9 = ReLUNode($8);\n"
    "$10 = SiLUNode($9);\n"
    "$11 = SliceNode($10, 1, 2);\n"
    "$12 = ReplaceSliceNode($3, $11, $4, $5);\n"
    "$13 = ReshapeNode($12, [6, 4, 2]);\n"
    "$14 = ConstantTensor(f, float32, [1, 4, 2]);\n"
    "$15 = ComplexHadamardProductNode($13, $14);\n"
    "$16 = PermuteNode($15, [1, 0, 2]);\n"
    "$17 = ReshapeNode($16, [4, 12]);\n"
    "$18 = ConstantTensor(g, float32, [12]);\n"
    "$19 = RmsNormNode($17, $18);\n"
    "$20 = SlicedSoftmaxNode($19, $5);\n"
    "$21 = ArgMaxNode($20);\n"
    "$22 = ReshapeNode($21, [4]);\n"
    "$23 = ConstantTensor(table, float32, [12, 3]);\n"
    "$24 = EmbeddingNode($23, $22);\n"
    "$25 = ConstantTensor(v, float32, [3, 5]);\n"
    "$26 = MulNode($24, $25);\n"
    "$27 = ConstantTensor(d, float32, [1, 5]);\n"
    "$28 = SubNode($26, $27);\n"
    "$29 = DivNode($28, $27);\n"
    "$30 = TanhNode($29);\n"
    "$31 = ExpNode($30);\n"
    "$32 = SigmoidNode($31);\n"
    "$33 = GELUNode($32);\n"
    "$34 = SubNode($5, $4);\n"
    "$35 = SlicedSoftmaxNode($33, $34);\n"
    "result = $35;\n";

static void test_hamkaas_mnist_parses_unchanged(void) {
    mk_error *err = NULL;
    char *text = mk_script_format(mnist, &err);
    CHECK(text != NULL, "%s", mk_error_message(err));
    /* The printer writes the canonical alias MatMulNode for MulNode; otherwise the same. */
    if (text) {
        char *again = mk_script_format(text, &err);
        CHECK(again && !strcmp(again, text), "printing is not a fixed point:\n%s\n%s", text,
              again ? again : "(null)");
        CHECK(strstr(text, "$2 = ReshapeNode($1, [128, 784]);") != NULL, "%s", text);
        CHECK(strstr(text, "$4 = MatMulNode($2, $3);") != NULL, "%s", text);
        CHECK(strstr(text, "result = $11;") != NULL, "%s", text);
        mk_string_free(again);
    }
    mk_string_free(text);
    mk_error_free(err);
}

static void test_every_node_round_trips(void) {
    mk_error *err = NULL;
    char *text = mk_script_format(every_node, &err);
    CHECK(text != NULL, "%s", mk_error_message(err));
    char *again = text ? mk_script_format(text, &err) : NULL;
    CHECK(again && !strcmp(again, text), "round trip differs:\n%s\n---\n%s", text ? text : "",
          again ? again : mk_error_message(err));
    /* the new ops print under their own names, operands as written */
    const char *lines[] = {"$28 = SubNode($26, $27);", "$29 = DivNode($28, $27);",
                           "$30 = TanhNode($29);",     "$31 = ExpNode($30);",
                           "$32 = SigmoidNode($31);",  "$33 = GELUNode($32);",
                           "$34 = SubNode($5, $4);"};
    for (size_t i = 0; text && i < sizeof lines / sizeof lines[0]; i++)
        CHECK(strstr(text, lines[i]) != NULL, "'%s' not in:\n%s", lines[i], text);
    mk_string_free(text);
    mk_string_free(again);
    mk_error_free(err);
}

static void test_every_node_compiles(void) {
    static float w[64], f[8], g[12], table[36], v[15], d[5];
    for (int i = 0; i < 5; i++) d[i] = (float)test_uniform(0.5, 1.5);
    for (int i = 0; i < 15; i++) v[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < 64; i++) w[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < 8; i++) f[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < 12; i++) g[i] = (float)test_uniform(0.5, 1.5);
    for (int i = 0; i < 36; i++) table[i] = (float)test_uniform(-1, 1);
    mk_named_tensor c[] = {{"w", w}, {"f", f}, {"g", g}, {"table", table}, {"v", v}, {"d", d}};
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, every_node, c, 6, NULL, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (m) {
        float x[32], y[20];
        for (int i = 0; i < 32; i++) x[i] = (float)test_uniform(-1, 1);
        int64_t pos = 2, pos1 = 3;
        mk_named_tensor in[] = {{"x", x}, {"pos", &pos}, {"pos1", &pos1}};
        CHECK(mk_evaluate(m, in, 3, y, sizeof y, &err) == 0, "%s", mk_error_message(err));
        mk_tensor_info info;
        CHECK(mk_model_output_info(m, &info) == 0 && info.rank == 2 && info.shape[0] == 4 &&
                  info.shape[1] == 5 && info.dtype == MK_DTYPE_FLOAT32,
              "output info");
        CHECK(mk_model_input_count(m) == 3, "inputs %zu", mk_model_input_count(m));
    }
    mk_model_free(m);
    mk_error_free(err);
}

/* Any prefix of a valid script, and random byte damage, fails cleanly or compiles. */
static void test_damaged_scripts_never_crash(void) {
    size_t len = strlen(every_node);
    char *buf = malloc(len + 1);
    int compiled = 0;
    for (size_t cut = 0; cut <= len; cut++) {
        memcpy(buf, every_node, cut);
        buf[cut] = 0;
        mk_error *err = NULL;
        char *s = mk_script_format(buf, &err);
        CHECK(s != NULL || (err && mk_error_message(err)[0]), "prefix %zu: no error", cut);
        compiled += s != NULL;
        mk_string_free(s);
        mk_error_free(err);
    }
    CHECK(compiled >= 1, "the whole script must parse");
    const char alphabet[] = "$=()[],;#-0123456789abcXYZ_ \n\t\x01\xff";
    for (int round = 0; round < 2000; round++) {
        memcpy(buf, every_node, len + 1);
        int edits = (int)test_randint(1, 4);
        for (int e = 0; e < edits; e++)
            buf[test_randint(0, (int64_t)len - 1)] =
                alphabet[test_randint(0, (int64_t)sizeof alphabet - 2)];
        mk_error *err = NULL;
        char *s = mk_script_format(buf, &err);
        CHECK(s != NULL || err != NULL, "round %d: neither text nor error", round);
        mk_string_free(s);
        mk_error_free(err);
    }
    free(buf);
}

/* ---- storage dtypes: float16, bfloat16, int8 ------------------------------ */

static const char *storage_script =
    "$1 = InputTensor(h, float16, [2, 3]);\n"
    "$2 = ConstantTensor(b, bfloat16, [4]);\n"
    "$3 = BufferTensor(int8, [3, 5]);\n"
    "$4 = InputTensor(q, int8, [6]);\n"
    "$5 = ConstantTensor(e, float16, [1, 2, 3]);\n"
    "$6 = BufferTensor(bfloat16, [2, 2]);\n"
    "$7 = InputTensor(c, bfloat16, [2, 3, 4, 5]);\n"
    "$8 = ReshapeNode($1, [3, 2]);\n"
    "result = $8;\n";

/* They parse and print under their names, as every declaration kind. */
static void test_storage_dtypes_round_trip(void) {
    mk_error *err = NULL;
    char *text = mk_script_format(storage_script, &err);
    CHECK(text != NULL, "%s", mk_error_message(err));
    if (!text) {
        mk_error_free(err);
        return;
    }
    /* each declaration line prints as written */
    const char *p = storage_script;
    while (*p) {
        const char *nl = strchr(p, '\n');
        char line[128];
        snprintf(line, sizeof line, "%.*s", (int)(nl - p), p);
        CHECK(strstr(text, line) != NULL, "'%s' not in:\n%s", line, text);
        p = nl + 1;
    }
    char *again = mk_script_format(text, &err);
    CHECK(again && !strcmp(again, text), "not a fixed point:\n%s\n---\n%s", text,
          again ? again : mk_error_message(err));
    mk_string_free(again);
    mk_string_free(text);
    mk_error_free(err);
}

/* A storage tensor through views only (no kernel): its bytes come back as they were. */
static void view_case(const char *what, const char *text, const char *in_name, size_t in_bytes,
                      bool constant, size_t begin, size_t out_bytes, mk_dtype dt, int rank,
                      const int64_t *shape) {
    unsigned char *in = malloc(in_bytes), *out = malloc(out_bytes + 8);
    for (size_t i = 0; i < in_bytes; i++) /* never zero */
        in[i] = (unsigned char)test_randint(1, 255);
    mk_named_tensor t = {in_name, in};
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, text, constant ? &t : NULL, constant, NULL, &err);
    CHECK(m != NULL, "%s: %s\n%s", what, mk_error_message(err), text);
    if (m) {
        mk_tensor_info info;
        CHECK(mk_model_output_info(m, &info) == 0 && info.dtype == dt && info.rank == rank &&
                  !memcmp(info.shape, shape, sizeof(int64_t) * (size_t)rank),
              "%s: output info dtype %d rank %d", what, (int)info.dtype, info.rank);
        size_t n_in = constant || !in_name ? 0 : 1;
        CHECK(mk_evaluate(m, &t, n_in, out, out_bytes, &err) == 0, "%s: %s", what,
              mk_error_message(err));
        if (in_name)
            CHECK(!memcmp(out, in + begin, out_bytes), "%s: the bytes differ", what);
        else
            for (size_t i = 0; i < out_bytes; i++)
                CHECK(out[i] == 0, "%s: a buffer is zero after compile; byte %zu is %d", what, i,
                      out[i]);
        mk_error_free(err), err = NULL;
        /* the output's size counts the dtype's bytes: 4 per element is wrong */
        CHECK(mk_evaluate(m, &t, n_in, out, out_bytes + 2, &err) == -1 &&
                  mk_error_code_of(err) == MK_ERR_ARGUMENT,
              "%s: a %zu-byte buffer for a %zu-byte output: %s", what, out_bytes + 2, out_bytes,
              err ? mk_error_message(err) : "accepted");
    }
    mk_error_free(err);
    mk_model_free(m);
    free(in), free(out);
}

static void test_storage_dtypes_views(void) {
    view_case("bfloat16 input, reshape, slice",
              "$1 = InputTensor(x, bfloat16, [4, 6]);\n$2 = ReshapeNode($1, [6, 4]);\n"
              "$3 = SliceNode($2, 1, 5);\nresult = $3;\n",
              "x", 48, false, 8, 32, MK_DTYPE_BFLOAT16, 2, (int64_t[]){4, 4});
    view_case("int8 input, slice, reshape",
              "$1 = InputTensor(x, int8, [10]);\n$2 = SliceNode($1, 2, 7);\n"
              "$3 = ReshapeNode($2, [5, 1]);\nresult = $3;\n",
              "x", 10, false, 2, 5, MK_DTYPE_INT8, 2, (int64_t[]){5, 1});
    view_case("float16 constant, slice",
              "$1 = ConstantTensor(w, float16, [3, 4]);\n$2 = SliceNode($1, 1, 3);\nresult = $2;\n",
              "w", 24, true, 8, 16, MK_DTYPE_FLOAT16, 2, (int64_t[]){2, 4});
    view_case("bfloat16 input as the result", "$1 = InputTensor(x, bfloat16, [5]);\nresult = $1;\n",
              "x", 10, false, 0, 10, MK_DTYPE_BFLOAT16, 1, (int64_t[]){5});
    view_case("bfloat16 buffer, reshape",
              "$1 = BufferTensor(bfloat16, [3, 4]);\n$2 = ReshapeNode($1, [12]);\nresult = $2;\n",
              NULL, 0, false, 0, 24, MK_DTYPE_BFLOAT16, 1, (int64_t[]){12});
    view_case("int8 buffer, slice",
              "$1 = BufferTensor(int8, [3, 4]);\n$2 = SliceNode($1, 2, 3);\nresult = $2;\n", NULL,
              0, false, 0, 4, MK_DTYPE_INT8, 2, (int64_t[]){1, 4});
    /* moves that are kernels but only move bytes: a permute, a run-time row write */
    {
        uint16_t x[12], y[12];
        for (int i = 0; i < 12; i++) x[i] = (uint16_t)test_randint(1, 65535);
        mk_error *e = NULL;
        mk_model *pm = mk_compile(ctx, "$1 = InputTensor(x, bfloat16, [4, 3]);\n"
                                       "$2 = PermuteNode($1, [1, 0]);\nresult = $2;\n",
                                  NULL, 0, NULL, &e);
        CHECK(pm != NULL, "bfloat16 permute: %s", mk_error_message(e));
        mk_named_tensor in = {"x", x};
        if (pm && mk_evaluate(pm, &in, 1, y, sizeof y, &e) == 0) {
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < 4; j++)
                    CHECK(y[i * 4 + j] == x[j * 3 + i], "bfloat16 permute at [%d, %d]", i, j);
        } else if (pm) {
            CHECK(0, "bfloat16 permute: %s", mk_error_message(e));
        }
        mk_model_free(pm);
        mk_error_free(e), e = NULL;
        /* int8 rows written into a buffer at run-time rows, kept across evaluations */
        mk_model *rm = mk_compile(ctx, "$1 = BufferTensor(int8, [5, 3]);\n"
                                       "$2 = InputTensor(r, int8, [2, 3]);\n"
                                       "$3 = InputTensor(b, int64, [1]);\n"
                                       "$4 = InputTensor(e, int64, [1]);\n"
                                       "$5 = ReplaceSliceNode($1, $2, $3, $4);\nresult = $5;\n",
                                  NULL, 0, NULL, &e);
        CHECK(rm != NULL, "int8 replace: %s", mk_error_message(e));
        int8_t state[15] = {0}, r[6], out[15];
        for (int step = 0; rm && step < 3; step++) {
            int64_t b = test_randint(0, 3), end = b + 2;
            for (int i = 0; i < 6; i++) r[i] = (int8_t)(test_randint(0, 1) ? 1 : -1) * (int8_t)test_randint(1, 127);
            memcpy(state + b * 3, r, 6);
            mk_named_tensor ins[3] = {{"r", r}, {"b", &b}, {"e", &end}};
            CHECK(mk_evaluate(rm, ins, 3, out, sizeof out, &e) == 0, "int8 replace: %s",
                  mk_error_message(e));
            CHECK(!memcmp(out, state, sizeof out), "int8 replace: step %d, rows [%lld, %lld)",
                  step, (long long)b, (long long)end);
        }
        mk_model_free(rm);
        mk_error_free(e);
    }
    /* an input's info carries its storage dtype */
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, "$1 = InputTensor(x, float16, [2, 3]);\n"
                                  "$2 = ReshapeNode($1, [6]);\nresult = $2;\n",
                             NULL, 0, NULL, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    mk_tensor_info info;
    CHECK(m && mk_model_input_count(m) == 1 && mk_model_input_info(m, 0, &info) == 0 &&
              info.dtype == MK_DTYPE_FLOAT16 && info.rank == 2 && info.shape[1] == 3 &&
              info.name && !strcmp(info.name, "x"),
          "input info");
    mk_model_free(m);
    mk_error_free(err);
}

static void test_op_infer(void) {
    mk_error *err = NULL;
    mk_tensor_info a = {.dtype = MK_DTYPE_FLOAT32, .rank = 2, .shape = {5, 7}};
    mk_tensor_info b = {.dtype = MK_DTYPE_FLOAT32, .rank = 2, .shape = {7, 3}}, out;
    mk_tensor_info ab[] = {a, b}, aa[] = {a, a};
    CHECK(mk_op_infer("MatMulNode", ab, 2, NULL, 0, &out, &err) == 0 && out.rank == 2 &&
              out.shape[0] == 5 && out.shape[1] == 3,
          "%s", mk_error_message(err));
    CHECK(mk_op_infer("MatMulNode", aa, 2, NULL, 0, &out, &err) == -1 &&
              strstr(mk_error_message(err), "shape error: MatMulNode: cannot multiply [5, 7] by [5, 7]"),
          "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    int64_t perm[] = {1, 0};
    CHECK(mk_op_infer("PermuteNode", &a, 1, perm, 2, &out, &err) == 0 && out.shape[0] == 7,
          "%s", mk_error_message(err));
    CHECK(mk_op_infer("NoSuchNode", &a, 1, NULL, 0, &out, &err) == -1, "unknown op");
    mk_error_free(err);
}

/* 20,000 inputs given in a shuffled order (the lookup by name was a linear scan
 * per input: 4.6 s per evaluation with 40,000), duplicates and unknown names. */
static void test_many_inputs(void) {
    enum { N = 20000 };
    size_t cap = (size_t)N * 96;
    char *script = malloc(cap);
    size_t at = 0;
    for (int i = 0; i < N; i++)
        at += (size_t)snprintf(script + at, cap - at, "$%d = InputTensor(x%d, float32, [1]);\n",
                               i + 1, i);
    int last = 1;
    for (int i = 1; i < N; i++) {
        at += (size_t)snprintf(script + at, cap - at, "$%d = SumNode($%d, $%d);\n", N + i, last,
                               i + 1);
        last = N + i;
    }
    snprintf(script + at, cap - at, "result = $%d;\n", last);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = mk_compile(ctx, script, NULL, 0, NULL, &err);
    CHECK(m != NULL, "compile: %s", err ? mk_error_message(err) : "");
    mk_error_free(err);
    err = NULL;
    if (m) {
        static float values[N];
        static char names[N][16];
        static mk_named_tensor inputs[N];
        double want = 0;
        for (int i = 0; i < N; i++) {
            values[i] = (float)test_randint(-8, 8); /* small integers: the sum is exact */
            want += values[i];
            snprintf(names[i], sizeof names[i], "x%d", i);
            inputs[i] = (mk_named_tensor){names[i], &values[i]};
        }
        for (int i = N - 1; i > 0; i--) { /* shuffled */
            int j = (int)test_randint(0, i);
            mk_named_tensor t = inputs[i];
            inputs[i] = inputs[j];
            inputs[j] = t;
        }
        float got = 0;
        CHECK(mk_evaluate(m, inputs, N, &got, sizeof got, &err) == 0 && got == (float)want,
              "shuffled inputs: got %g, want %g (%s)", got, want, err ? mk_error_message(err) : "");
        mk_error_free(err);
        err = NULL;
        mk_named_tensor saved = inputs[N - 1];
        inputs[N - 1] = inputs[0]; /* one given twice, one missing */
        CHECK(mk_evaluate(m, inputs, N, &got, sizeof got, &err) != 0 &&
                  mk_error_code_of(err) == MK_ERR_INPUT &&
                  strstr(mk_error_message(err), "given twice"),
              "a duplicate: %s", err ? mk_error_message(err) : "no error");
        mk_error_free(err);
        err = NULL;
        inputs[N - 1] = (mk_named_tensor){"nobody", &values[0]};
        CHECK(mk_evaluate(m, inputs, N, &got, sizeof got, &err) != 0 &&
                  strstr(mk_error_message(err), "'nobody' is not an input"),
              "an unknown name: %s", err ? mk_error_message(err) : "no error");
        mk_error_free(err);
        err = NULL;
        inputs[N - 1] = saved;
        CHECK(mk_evaluate(m, inputs, N, &got, sizeof got, &err) == 0 && got == (float)want,
              "again: %s", err ? mk_error_message(err) : "");
        mk_error_free(err);
    }
    mk_model_free(m);
    mk_context_free(ctx);
    free(script);
}

/* Models of one context freed on several threads at once, the context too: the
 * reference count is atomic (with a plain int two releases could both see 1 and
 * free the context twice, or neither). ASan and valgrind see the double free. */
enum { FREERS = 8, PER_THREAD = 16 };
static mk_model *to_free[FREERS][PER_THREAD];

static void *free_models(void *arg) {
    mk_model **models = arg;
    for (int i = 0; i < PER_THREAD; i++) mk_model_free(models[i]);
    return NULL;
}

static void test_models_freed_across_threads(void) {
    const char *script = "$1 = InputTensor(x, float32, [4]);\n$2 = ReLUNode($1);\nresult = $2;\n";
    for (int round = 0; round < 20; round++) {
        mk_error *err = NULL;
        mk_context *shared = mk_context_new(&err);
        bool ok = shared != NULL;
        for (int t = 0; t < FREERS; t++)
            for (int i = 0; i < PER_THREAD; i++)
                ok &= (to_free[t][i] = mk_compile(shared, script, NULL, 0, NULL, &err)) != NULL;
        CHECK(ok, "compile: %s", err ? mk_error_message(err) : "");
        mk_error_free(err);
        pthread_t threads[FREERS];
        for (int t = 0; t < FREERS; t++) pthread_create(&threads[t], NULL, free_models, to_free[t]);
        mk_context_free(shared);
        for (int t = 0; t < FREERS; t++) pthread_join(threads[t], NULL);
    }
}

/* Nodes that reach neither the output nor a buffer do not run (before: they ran
 * every evaluation, and a dead bfloat16 ReLU made compile fail); an in-place
 * write into a buffer is state and stays, though the output does not read it. */
static void test_dead_nodes(void) {
    mk_error *err = NULL;
    mk_context *c = mk_context_new(&err);
    const char *dead = "$1 = InputTensor(x, float32, [4]);\n"
                       "$2 = ReLUNode($1);\n"     /* dead */
                       "$3 = ExpNode($2);\n"      /* dead */
                       "$4 = SiLUNode($1);\n"
                       "result = $4;\n";
    for (int passes = 0; passes < 2; passes++) {
        mk_compile_options o = {.no_passes = passes == 0};
        mk_model *m = mk_compile(c, dead, NULL, 0, &o, &err);
        mk_stats st;
        CHECK(m && mk_model_stats(m, &st) == 0 && st.launches == (passes ? 1 : 3),
              "passes %d: %d launches (%s)", passes, m ? st.launches : -1,
              err ? mk_error_message(err) : "");
        mk_model_free(m);
        mk_error_free(err);
        err = NULL;
    }
    const char *bf16 = "$1 = InputTensor(x, bfloat16, [4]);\n"
                       "$2 = ReLUNode($1);\n"     /* dead: no kernel needed */
                       "$3 = ReshapeNode($1, [2, 2]);\n"
                       "result = $3;\n";
    mk_model *m = mk_compile(c, bf16, NULL, 0, NULL, &err);
    CHECK(m != NULL, "a dead bfloat16 ReLU: %s", err ? mk_error_message(err) : "");
    mk_model_free(m);
    mk_error_free(err);
    err = NULL;

    const char *state = "$1 = BufferTensor(float32, [4]);\n"
                        "$2 = InputTensor(x, float32, [4]);\n"
                        "$3 = SumNode($1, $2);\n"  /* reads the buffer before the write */
                        "$4 = ConstantTensor(b, int64, [1]);\n"
                        "$5 = ConstantTensor(e, int64, [1]);\n"
                        "$6 = ReplaceSliceNode($1, $2, $4, $5);\n" /* read by no one */
                        "result = $3;\n";
    int64_t b = 0, e = 4;
    mk_named_tensor k[] = {{"b", &b}, {"e", &e}};
    m = mk_compile(c, state, k, 2, NULL, &err);
    CHECK(m != NULL, "state: %s", err ? mk_error_message(err) : "");
    if (m) {
        float x[4], y[4];
        for (int i = 0; i < 4; i++) x[i] = (float)test_randint(1, 100);
        mk_named_tensor in[] = {{"x", x}};
        bool ok = mk_evaluate(m, in, 1, y, sizeof y, &err) == 0;
        for (int i = 0; i < 4; i++) ok &= y[i] == x[i];
        ok &= mk_evaluate(m, in, 1, y, sizeof y, &err) == 0;
        for (int i = 0; i < 4; i++) ok &= y[i] == 2 * x[i]; /* the first run's write */
        CHECK(ok, "the buffer write must stay: %s", err ? mk_error_message(err) : "values");
    }
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(c);
}

/* max_bytes bounds what a model may take before anything is allocated (before,
 * nothing bounded what a script asked for). */
static void test_max_bytes(void) {
    const char *script = "$1 = InputTensor(x, float32, [1024]);\n"
                         "$2 = ConstantTensor(w, float32, [1024]);\n"
                         "$3 = BufferTensor(float32, [4096]);\n"
                         "$4 = SumNode($1, $2);\n"
                         "result = $4;\n";
    static float w[1024];
    for (int i = 0; i < 1024; i++) w[i] = (float)test_uniform(-1, 1);
    mk_named_tensor k[] = {{"w", w}};
    mk_error *err = NULL;
    mk_compile_options o = {.max_bytes = 4096 * 4 + 1024 * 4}; /* buffer + constant: no arena */
    mk_model *m = mk_compile(ctx, script, k, 1, &o, &err);
    CHECK(!m && err && mk_error_code_of(err) == MK_ERR_NOMEM &&
              strstr(mk_error_message(err), "constants 4096, buffers 16384") &&
              strstr(mk_error_message(err), "more than max_bytes 20480"),
          "over the limit: %s", err ? mk_error_message(err) : "compiled");
    mk_error_free(err);
    err = NULL;
    o.max_bytes = 64 << 10;
    m = mk_compile(ctx, script, k, 1, &o, &err);
    CHECK(m != NULL, "under the limit: %s", err ? mk_error_message(err) : "");
    mk_model_free(m);
    mk_error_free(err);
    err = NULL;
    o = (mk_compile_options){.max_bytes = 4096 * 4 + 1, .borrow_constants = true};
    m = mk_compile(ctx, script, k, 1, &o, &err); /* borrowed constants cost nothing */
    CHECK(!m && strstr(mk_error_message(err), "constants 0,"), "borrowed: %s",
          err ? mk_error_message(err) : "compiled");
    mk_error_free(err);
}

/* An in-place write whose result no one uses is still seen by whatever reads
 * the memory it wrote after it: the output itself or a later node. Found by
 * spec/fuzz/graph_fuzz.c: drop-dead removed the write with passes on, so the
 * two compiles disagreed (passes off runs every node). */
static void test_dead_nodes_keep_writes_read_later(void) {
    const char *scripts[] = {
        "$1 = InputTensor(x, float32, [4]);\n"
        "$2 = InputTensor(r, float32, [2]);\n"
        "$3 = ConstantTensor(b, int64, [1]);\n"
        "$4 = ConstantTensor(e, int64, [1]);\n"
        "$5 = ReplaceSliceNode($1, $2, $3, $4);\n"
        "result = $1;\n",
        "$1 = InputTensor(x, float32, [4]);\n"
        "$2 = SliceNode($1, 0, 4);\n"            /* a view placed before the write */
        "$3 = InputTensor(r, float32, [2]);\n"
        "$4 = ConstantTensor(b, int64, [1]);\n"
        "$5 = ConstantTensor(e, int64, [1]);\n"
        "$6 = ReplaceSliceNode($1, $3, $4, $5);\n"
        "$7 = ReLUNode($2);\n"                   /* reads it after the write */
        "result = $7;\n",
    };
    int64_t b = 1, e = 3;
    mk_named_tensor k[] = {{"b", &b}, {"e", &e}};
    float x[4], r[2], want[4], y[4];
    for (int i = 0; i < 4; i++) x[i] = (float)test_randint(-50, 50) + 0.5f;
    for (int i = 0; i < 2; i++) r[i] = (float)test_randint(-50, 50) + 0.25f;
    mk_named_tensor in[] = {{"x", x}, {"r", r}};
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 4; i++) {
            want[i] = i >= b && i < e ? r[i - b] : x[i];
            if (s == 1 && want[i] < 0) want[i] = 0;
        }
        for (int passes = 0; passes < 2; passes++) {
            mk_error *err = NULL;
            mk_compile_options o = {.no_passes = !passes};
            mk_model *m = mk_compile(ctx, scripts[s], k, 2, &o, &err);
            int rc = m ? mk_evaluate(m, in, 2, y, sizeof y, &err) : -1;
            CHECK(rc == 0, "script %d, passes %d: %s", s, passes, err ? mk_error_message(err) : "");
            for (int i = 0; rc == 0 && i < 4; i++)
                CHECK(y[i] == want[i], "script %d, passes %d: y[%d] = %g, want %g", s, passes, i,
                      y[i], want[i]);
            mk_model_free(m);
            mk_error_free(err);
        }
    }
}

int main(void) {
    test_srand(test_seed());
    mk_error *err = NULL;
    ctx = mk_context_new(&err);
    RUN(test_hamkaas_mnist_parses_unchanged);
    RUN(test_every_node_round_trips);
    RUN(test_every_node_compiles);
    RUN(test_damaged_scripts_never_crash);
    RUN(test_many_inputs);
    RUN(test_models_freed_across_threads);
    RUN(test_dead_nodes);
    RUN(test_dead_nodes_keep_writes_read_later);
    RUN(test_max_bytes);
    RUN(test_op_infer);
    RUN(test_storage_dtypes_round_trip);
    RUN(test_storage_dtypes_views);
    mk_context_free(ctx);
    return test_summary("script");
}
