/*
 * kernel_source_test.c — the core writes every group's CUDA C itself
 * (core/codegen/), so mk_model_kernel_source works with no CUDA plugin at
 * all: in a CUDA=0 build, and here with MK_CUDA_PLUGIN naming a file that
 * does not exist (the plugin is then never loaded, whatever the build).
 *
 *   test_no_plugin       the plugin is really absent for this process
 *   test_pointwise       random pointwise chains of 2 to 6 ops over two
 *                        operands (one broadcast where drawn): the source is
 *                        the pointwise kernel of the group that took the
 *                        root's id, reading two operands, an instruction an
 *                        op at least, with each op's CUDA form (__fadd_rn for
 *                        SumNode, expf for ExpNode, ...) and none of the
 *                        forms of ops it does not hold
 *   test_matvec          random [1, K] @ [K, N] products (N even: CUDA reads
 *                        weights by column pairs) with a bias and an
 *                        activation: one matrix-vector group whose kernel
 *                        names the product, the bias's add and the activation
 *   test_kernel_header   names after the group's ops, the Source Nodes header,
 *                        one program (the cache's key) for two layers alike
 *   test_program         the program: the source without its comments
 *   test_library_launch  a launch a library runs has no source: a clear error
 *
 * The same script compiled twice gives the same source (the kernel cache's
 * key relies on it). Shapes and ops are drawn from a printed seed.
 */
#include "codegen/codegen.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_no_plugin(void) {
    char why[512];
    CHECK(mk_cuda_plugin_get(why, sizeof why) == NULL, "a plugin was loaded");
    /* a CUDA=0 build says it was built without CUDA; any other, not found */
    CHECK(strstr(why, "not found") || strstr(why, "built without CUDA"), "why: %s", why);
    printf("#   no plugin: %s\n", why);
}

/* The source of launch i of the model of text, compiled on the CPU; NULL
 * after a failed CHECK. *launches: the model's launches. */
static char *source_of(const char *text, int i, int *launches) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = ctx ? mk_compile(ctx, text, NULL, 0, NULL, &err) : NULL;
    CHECK(m != NULL, "compile: %s\n%s", mk_error_message(err), text);
    char *src = NULL;
    mk_stats st = {0};
    if (m && mk_model_stats(m, &st) == 0) {
        src = mk_model_kernel_source(m, i, &err);
        CHECK(src != NULL, "launch %d: %s\n%s", i, mk_error_message(err), mk_model_script(m));
    }
    *launches = st.launches;
    mk_error_free(err);
    mk_model_free(m);
    mk_context_free(ctx);
    return src;
}

/* A pointwise op and the CUDA C its instructions print as. */
static const struct {
    const char *op;
    bool binary;
    const char *form;
} OPS[] = {
    {"SumNode", true, "__fadd_rn("},   {"SubNode", true, "__fsub_rn("},
    {"HadamardProductNode", true, "__fmul_rn("}, {"DivNode", true, "__fdiv_rn("},
    {"ExpNode", false, "expf("},       {"TanhNode", false, "tanhf("},
    {"ReLUNode", false, " > "},
};
#define N_OPS (int)(sizeof OPS / sizeof OPS[0])
/* forms no other op of the table prints: absent unless their op is drawn */
static const int ONLY[] = {4, 5, 6};

static void test_pointwise(void) {
    for (int trial = 0; trial < 40; trial++) {
        int rows = (int)test_randint(1, 9), cols = (int)test_randint(1, 70);
        bool broadcast = test_randint(0, 1);
        char text[2048];
        int at = snprintf(text, sizeof text,
                          "$1 = InputTensor(x, float32, [%d, %d]);\n"
                          "$2 = InputTensor(y, float32, [%d, %d]);\n",
                          rows, cols, broadcast ? 1 : rows, cols);
        bool used[N_OPS] = {false};
        int n = (int)test_randint(2, 6), id = 3;
        for (int k = 0; k < n; k++, id++) {
            /* the first op reads both operands, so the group has two */
            int o = k == 0 ? (int)test_randint(0, 3) : (int)test_randint(0, N_OPS - 1);
            used[o] = true;
            if (k == 0) at += snprintf(text + at, sizeof text - (size_t)at, "$3 = %s($1, $2);\n", OPS[o].op);
            else if (OPS[o].binary)
                at += snprintf(text + at, sizeof text - (size_t)at, "$%d = %s($%d, $%d);\n", id,
                               OPS[o].op, id - 1, (int)test_randint(1, 2));
            else
                at += snprintf(text + at, sizeof text - (size_t)at, "$%d = %s($%d);\n", id, OPS[o].op,
                               id - 1);
        }
        snprintf(text + at, sizeof text - (size_t)at, "result = $%d;\n", id - 1);
        int launches = 0;
        char *src = source_of(text, 0, &launches), *again = source_of(text, 0, &launches);
        CHECK(launches == 1, "%d launches for\n%s", launches, text);
        if (!src || !again) {
            free(src);
            free(again);
            return;
        }
        char head[128];
        /* the group node takes the root's id; at least an instruction an op */
        snprintf(head, sizeof head, "// moonkaas pointwise group: PointwiseGroupNode $%d, 2 operands,",
                 id - 1);
        int insns = 0;
        CHECK(!strncmp(src, head, strlen(head)) && sscanf(src + strlen(head), " %d instructions", &insns) == 1 &&
                  insns >= n,
              "want \"%s\" and %d instructions at least:\n%s\n%s", head, n, text, src);
        CHECK(strstr(src, "extern \"C\" __global__") && strstr(src, "\nmk_pointwise_") &&
                  strstr(src, "(float *__restrict__ o, const float *__restrict__ i0, "
                              "const float *__restrict__ i1, long long n)"),
              "the kernel's entry:\n%s", src);
        for (int o = 0; o < N_OPS; o++)
            if (used[o]) CHECK(strstr(src, OPS[o].form), "%s: no \"%s\" in\n%s", OPS[o].op, OPS[o].form, src);
        for (size_t j = 0; j < sizeof ONLY / sizeof ONLY[0]; j++)
            if (!used[ONLY[j]])
                CHECK(!strstr(src, OPS[ONLY[j]].form), "\"%s\" without %s in\n%s\n%s", OPS[ONLY[j]].form,
                      OPS[ONLY[j]].op, text, src);
        CHECK(!strcmp(src, again), "two compiles, two sources:\n%s", text);
        free(src);
        free(again);
    }
}

static void test_matvec(void) {
    static const char *act[][2] = {{"ReLUNode", " > "}, {"TanhNode", "tanhf("}, {"ExpNode", "expf("}};
    for (int trial = 0; trial < 12; trial++) {
        int k = (int)test_randint(2, 300), n = 2 * (int)test_randint(1, 40), a = (int)test_randint(0, 2);
        char text[1024];
        snprintf(text, sizeof text,
                 "$1 = InputTensor(x, float32, [1, %d]);\n"
                 "$2 = InputTensor(w, float32, [%d, %d]);\n"
                 "$3 = PermuteNode($2, [1, 0]);\n"
                 "$4 = MatMulNode($1, $3);\n"
                 "$5 = InputTensor(b, float32, [1, %d]);\n"
                 "$6 = SumNode($4, $5);\n"
                 "$7 = %s($6);\n"
                 "result = $7;\n",
                 k, n, k, n, act[a][0]);
        int launches = 0;
        char *src = source_of(text, 0, &launches), *again = source_of(text, 0, &launches);
        CHECK(launches == 1, "%d launches for\n%s", launches, text);
        if (!src || !again) {
            free(src);
            free(again);
            return;
        }
        char head[128];
        snprintf(head, sizeof head, "// moonkaas matrix-vector group $4: [1, %d] @ 1 products, 1 results", k);
        CHECK(!strncmp(src, head, strlen(head)), "want \"%s\":\n%.200s", head, src);
        char entry[256];
        snprintf(entry, sizeof entry, "mk_matvec_matmul_add_%s(float *__restrict__ o, void *i0, "
                 "void *i1, void *i2, mk_fault_rec *fault, int launch, void *aux)",
                 a == 0 ? "relu" : a == 1 ? "tanh" : "exp");
        CHECK(strstr(src, entry), "want the entry %s in\n%s", entry, src);
        CHECK(strstr(src, "__fadd_rn(") && strstr(src, act[a][1]), "%s: the epilogue in\n%s", act[a][0], src);
        CHECK(!strcmp(src, again), "two compiles, two sources:\n%s", text);
        free(src);
        free(again);
    }
}

/*
 * Generated kernels read like Inductor's: the name says the group's kind and
 * its ops ("mk_pointwise_add_relu_mul"), a header after the first line lists
 * the source nodes with their script lines and what each operand is. The
 * kernel cache's key is the program without comments: two layers alike
 * (other ids and lines) give other sources but one program, and so one key.
 */
static void test_kernel_header(void) {
    const char *text = "$1 = InputTensor(x, float32, [4, 8]);\n"
                       "$2 = InputTensor(y, float32, [4, 8]);\n"
                       "$3 = SumNode($1, $2);\n"
                       "$4 = ReLUNode($3);\n"
                       "$5 = HadamardProductNode($4, $2);\n"
                       "$6 = SumNode($5, $2);\n"  /* a second layer alike */
                       "$7 = ReLUNode($6);\n"
                       "$8 = HadamardProductNode($7, $2);\n"
                       "result = $5, $8;\n";
    int launches = 0;
    char *a = source_of(text, 0, &launches), *b = source_of(text, 1, &launches);
    CHECK(launches == 2, "%d launches", launches);
    if (!a || !b) {
        free(a);
        free(b);
        return;
    }
    CHECK(strstr(a, "// kernel mk_pointwise_add_relu_mul\n// Source Nodes:\n"
                    "//   $3 = SumNode($1, $2)  # line 3: float32 [4, 8]\n"
                    "//   $4 = ReLUNode($3)  # line 4: float32 [4, 8]\n"
                    "//   $5 = HadamardProductNode  # line 5: float32 [4, 8]\n"
                    "// Operands:\n"
                    "//   i0: $1 InputTensor 'x' float32 [4, 8]\n"
                    "//   i1: $2 InputTensor 'y' float32 [4, 8]\n"),
          "the header:\n%s", a);
    CHECK(strstr(a, "\nmk_pointwise_add_relu_mul(float *__restrict__ o"), "the name:\n%s", a);
    CHECK(strstr(b, "//   $6 = SumNode($5, $2)  # line 6:"), "the second layer's header:\n%s", b);
    char *pa = mk_codegen_program(a), *pb = mk_codegen_program(b);
    CHECK(pa && pb && strcmp(a, b) && !strcmp(pa, pb), "two layers alike, two programs:\n%s\n%s",
          pa ? pa : "(null)", pb ? pb : "(null)");
    CHECK(pa && !strstr(pa, "//") && !strstr(pa, "Source Nodes") && strstr(pa, "__fadd_rn("),
          "the program keeps the code alone:\n%s", pa ? pa : "(null)");
    free(pa);
    free(pb);
    free(a);
    free(b);
}

/* mk_codegen_program drops comments, lines of comment only whole, and keeps
 * literals that look like comments. */
static void test_program(void) {
    static const char *cases[][2] = {
        {"// head\nint a; // tail\n  /* block */\nint b;\n", "int a; \nint b;\n"},
        {"const char *s = \"// not a comment /* nor this */\";\n",
         "const char *s = \"// not a comment /* nor this */\";\n"},
        {"int c = '/' / 2; /* one\nspanning */ int d;\n", "int c = '/' / 2;  int d;\n"},
        {"x /* open", "x "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = mk_codegen_program(cases[i][0]);
        CHECK(got && !strcmp(got, cases[i][1]), "case %zu: got \"%s\", want \"%s\"", i,
              got ? got : "(null)", cases[i][1]);
        free(got);
    }
}

static void test_library_launch(void) {
    /* five rows: more than a matrix-vector product, so a library's kernel */
    const char *text = "$1 = InputTensor(m, float32, [5, 3]);\n"
                       "$2 = InputTensor(w, float32, [3, 4]);\n"
                       "$3 = MatMulNode($1, $2);\n"
                       "result = $3;\n";
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = ctx ? mk_compile(ctx, text, NULL, 0, NULL, &err) : NULL;
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    char *src = m ? mk_model_kernel_source(m, 0, &err) : NULL;
    CHECK(m && !src && mk_error_code_of(err) == MK_ERR_ARGUMENT &&
              strstr(mk_error_message(err), "launch 0 runs MatMulNode $3 with a library kernel"),
          "%s", src ? src : mk_error_message(err));
    free(src);
    mk_error_free(err);
    mk_model_free(m);
    mk_context_free(ctx);
}

int main(void) {
    /* no plugin, whatever the build: a file that is not there */
    setenv("MK_CUDA_PLUGIN", "/nonexistent/libmoonkaas_cuda.so", 1);
    test_srand(test_seed());
    RUN(test_no_plugin);
    RUN(test_pointwise);
    RUN(test_matvec);
    RUN(test_kernel_header);
    RUN(test_program);
    RUN(test_library_launch);
    return test_summary("kernel_source");
}
