/*
 * codegen_test.c — the CUDA kernels the plugin writes for pointwise groups
 * compile with NVRTC, on any machine with the plugin: NVRTC needs no GPU, so
 * CI (which has none) checks the generator too. Each graph is compiled on the
 * CPU (the grouping passes are the same for both devices, but for the rows a
 * matrix-vector group takes, mk_target.matvec_rows: 4 on both today) and
 * every group's CUDA source is written and compiled for sm_90 (device.h's
 * mk_model_check_generated). On a GPU, spec/group_spec.lua runs them.
 *
 * The graphs and shapes are a fixed corpus, drawn from CORPUS_SEED (MK_SEED
 * draws another): the same sources every run, so the kernel cache
 * ($MK_KERNEL_CACHE; spec/run_tests.sh keeps one in build/) holds them after
 * the first. The disk cache's own tests use directories of their own.
 *
 *   test_random_groups   random pointwise trees: every op with an expression,
 *                        float32 and int64, 1 to 4 operands, broadcasts, a
 *                        strided (permuted) operand read through a copy
 *   test_issue64_ops     every operation of issue 64's rows in groups (float32,
 *                        int64), bool mixed into float32 programs (comparisons,
 *                        where, logic, a bool result), and a where and a
 *                        comparison alone (the interpreter's exceptions)
 *   test_kernel_source   mk_model_kernel_source: each generated launch's CUDA C,
 *                        clear errors for library launches and bad indexes
 *   test_row_groups      row groups (softmax, log_softmax, layer_norm, rms_norm
 *                        with prologues and epilogues) at rows of 1 to 20,000
 *   test_disk_cache      the cubins kept on disk ($MK_KERNEL_CACHE): read back,
 *                        broken files replaced, "off", unusable directories
 *   test_shared_program  two layers alike share one kernel (one cubin)
 *   test_lowp_groups     matrix-vector groups of float16, bfloat16 and int8 weights
 *   test_batch_groups    a batch's: a ReplaceAt row write, attention with a
 *                        prefix a sequence
 *   test_staged_batches  8 MiB of weights (A staged): 16-bit weights' copy loads
 *                        A in batches of steps, float32's a step at a time;
 *                        a row longer than 8,192 without a norm, all at once
 *   test_gathered_operands  a group reading embeddings' rows (gather.c)
 *   test_attention_rows  an attention group's chunk: 64 cached rows for heads at
 *                        most 64 wide, 32 for wider ones and wherever the graph
 *                        puts a product's A on the int8 grid (W8A8); scores
 *                        from float4 loads where heads are a multiple of 4
 *                        wide, but on the int8 grid
 *
 * Without the plugin (CUDA=0, or none found) the tests are skipped with the
 * reason, but test_kernel_source: the core writes the source
 * (core/codegen/), NVRTC only compiles it.
 */
#include "passes.h"
#include "codegen/codegen.h"
#include "test.h"

#include <dirent.h>
#include <sys/stat.h>
#include <time.h>

static double test_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static const char *const float_unary[] = {"ReLUNode", "SiLUNode", "ExpNode", "TanhNode",
                                          "SigmoidNode", "GELUNode"};
static const char *const float_binary[] = {"SumNode", "SubNode", "HadamardProductNode", "DivNode"};
static const char *const int_unary[] = {"ReLUNode"};
static const char *const int_binary[] = {"SumNode", "SubNode", "HadamardProductNode"};

#define CORPUS_SEED 20261207u

/* $MK_KERNEL_CACHE as the test found it, put back after each test of the disk cache */
static char *outer_cache;

#define PICK(a) (a)[test_randint(0, (int64_t)(sizeof(a) / sizeof((a)[0])) - 1)]

/* A random tree of pointwise nodes over up to four inputs of shape [R, C] (some
 * [1, C] or [R, 1]: broadcast); each node is read once, so the whole tree is
 * one group. */
static void random_script(char *s, size_t size, bool f32) {
    const char *dt = f32 ? "float32" : "int64";
    int R = (int)test_randint(1, 40), C = (int)test_randint(1, 70);
    int n = 0, at = 0, top[8], depth = 0;
    int inputs = (int)test_randint(1, 4);
    for (int k = 0; k < inputs; k++) {
        int kind = k == 0 ? 0 : (int)test_randint(0, 2);
        at += snprintf(s + at, size - (size_t)at, "$%d = InputTensor(x%d, %s, [%d, %d]);\n", ++n,
                       k, dt, kind == 1 ? 1 : R, kind == 2 ? 1 : C);
    }
    top[depth++] = 1;
    int next_input = 2;
    int ops = (int)test_randint(2, 7);
    for (int i = 0; i < ops; i++) {
        int a = top[--depth];
        if (next_input <= inputs || test_randint(0, 1)) {
            int b = next_input <= inputs ? next_input++ : a;
            if (b == a) { /* a node may be read once: a fresh copy of x0 instead */
                at += snprintf(s + at, size - (size_t)at, "$%d = %s($1);\n", ++n,
                               f32 ? PICK(float_unary) : PICK(int_unary));
                b = n;
            }
            at += snprintf(s + at, size - (size_t)at, "$%d = %s($%d, $%d);\n", ++n,
                           f32 ? PICK(float_binary) : PICK(int_binary), a, b);
        } else {
            at += snprintf(s + at, size - (size_t)at, "$%d = %s($%d);\n", ++n,
                           f32 ? PICK(float_unary) : PICK(int_unary), a);
        }
        top[depth++] = n;
    }
    snprintf(s + at, size - (size_t)at, "result = $%d;\n", top[depth - 1]);
}

static void test_random_groups(void) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    CHECK(ctx != NULL, "context: %s", mk_error_message(err));
    int graphs = 40, groups = 0;
    for (int g = 0; ctx && g < graphs; g++) {
        char script[4096];
        random_script(script, sizeof script, g % 3 != 2);
        mk_model *m = mk_compile(ctx, script, NULL, 0, NULL, &err);
        CHECK(m != NULL, "compile: %s\n%s", mk_error_message(err), script);
        if (!m) break;
        int checked = mk_model_check_generated(m, 90, &err);
        CHECK(checked >= 0, "sm_90: %s\n%s", mk_error_message(err), script);
        groups += checked > 0 ? checked : 0;
        mk_model_free(m);
        if (err) break;
    }
    printf("#   %d group kernels checked with NVRTC (or found in the kernel cache)\n", groups);
    CHECK(groups >= graphs, "only %d groups in %d graphs", groups, graphs);
    mk_error_free(err);
    mk_context_free(ctx);
}

/* mk_model_kernel_source: the CUDA C of each generated launch, to read; errors
 * for the others. */
/* Issue 64's rows: each script's groups (and bool or three-operand nodes
 * alone) compile with NVRTC; want is how many generated launches it has at
 * least (a group stops at MK_EXPR_MAX instructions, and nodes of another
 * shape than the root's stay out of it). */
static void test_issue64_ops(void) {
    static const struct {
        const char *script;
        int want;
    } cases[] = {
        {"$1 = InputTensor(x, float32, [7, 33]);\n$2 = InputTensor(y, float32, [1, 33]);\n"
         "$3 = AbsNode($1);\n$4 = SqrtNode($3);\n$5 = LogNode($4);\n$6 = Exp2Node($5);\n"
         "$7 = SinNode($6);\n$8 = CosNode($7);\n$9 = ErfNode($8);\n$10 = FloorNode($9);\n"
         "$11 = CeilNode($10);\n$12 = RoundNode($11);\n$13 = RsqrtNode($12);\n"
         "$14 = PowNode($13, $2);\n$15 = ModNode($14, $2);\n$16 = FloorDivNode($15, $2);\n"
         "result = $16;\n",
         1},
        {"$1 = InputTensor(x, float32, [5, 9]);\n$2 = InputTensor(a, float32, [1]);\n"
         "$3 = LeakyReLUNode($1, $2);\n$4 = ELUNode($3, $2);\n$5 = SoftplusNode($4);\n"
         "$6 = MishNode($5);\n$7 = HardSwishNode($6);\n$8 = GELUErfNode($7);\n"
         "$9 = SignNode($8);\n$10 = ReciprocalNode($9);\n$11 = NegNode($10);\n"
         "$12 = MinimumNode($11, $2);\n$13 = MaximumNode($12, $1);\nresult = $13;\n",
         1},
        {"$1 = InputTensor(i, int64, [4, 6]);\n$2 = InputTensor(j, int64, [4, 1]);\n"
         "$3 = InputTensor(k, int64, [6]);\n$4 = ModNode($1, $2);\n$5 = FloorDivNode($4, $3);\n"
         "$6 = AbsNode($5);\n$7 = SignNode($6);\n$8 = NegNode($7);\n$9 = MinimumNode($8, $2);\n"
         "$10 = MaximumNode($9, $3);\n$11 = ClampNode($10, $2, $3);\nresult = $11;\n",
         1},
        {"$1 = InputTensor(x, float32, [3, 8]);\n$2 = InputTensor(y, float32, [8]);\n"
         "$3 = InputTensor(c, bool, [3, 1]);\n$4 = GreaterNode($1, $2);\n"
         "$5 = LogicalNotNode($3);\n$6 = LogicalAndNode($4, $5);\n$7 = LessEqualNode($1, $2);\n"
         "$8 = LogicalOrNode($6, $7);\n$9 = ExpNode($2);\n$10 = WhereNode($8, $1, $9);\n"
         "$11 = EqualNode($10, $1);\n$12 = NotEqualNode($11, $3);\nresult = $12;\n",
         2}, /* the group, and LogicalNotNode [3, 1] alone (bool) */
        {"$1 = InputTensor(i, int64, [3, 8]);\n$2 = InputTensor(j, int64, [8]);\n"
         "$3 = InputTensor(c, bool, [3, 8]);\n$4 = GreaterEqualNode($1, $2);\n"
         "$5 = WhereNode($3, $1, $2);\n$6 = LessNode($1, $2);\nresult = $4, $5, $6;\n",
         3},
    };
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    CHECK(ctx != NULL, "context: %s", mk_error_message(err));
    for (size_t i = 0; ctx && i < sizeof cases / sizeof cases[0]; i++) {
        mk_model *m = mk_compile(ctx, cases[i].script, NULL, 0, NULL, &err);
        CHECK(m != NULL, "compile: %s\n%s", mk_error_message(err), cases[i].script);
        if (!m) break;
        int checked = mk_model_check_generated(m, 90, &err);
        CHECK(checked >= cases[i].want, "sm_90: %d generated launches, want %d: %s\n%s", checked,
              cases[i].want, err ? mk_error_message(err) : "", cases[i].script);
        mk_model_free(m);
        mk_error_free(err);
        err = NULL;
    }
    mk_context_free(ctx);
}

/* A batch's groups (issue 68): a product whose rotated rows a ReplaceAtNode
 * writes each at its own index (the group's row write), and decode attention
 * with a prefix a sequence ([3] over 6 heads). */
static void test_batch_groups(void) {
    static const char *const scripts[] = {
        "$1 = BufferTensor(float32, [3, 2, 5, 4]);\n$2 = InputTensor(x, float32, [3, 16]);\n"
        "$3 = InputTensor(w, float32, [8, 16]);\n$4 = PermuteNode($3, [1, 0]);\n"
        "$5 = MatMulNode($2, $4);\n$6 = ReshapeNode($5, [3, 4, 2]);\n"
        "$7 = InputTensor(rot, float32, [3, 8]);\n$8 = ReshapeNode($7, [3, 4, 2]);\n"
        "$9 = ComplexHadamardProductNode($6, $8);\n$10 = ReshapeNode($9, [3, 2, 4]);\n"
        "$11 = InputTensor(idx, int64, [3]);\n$12 = ReplaceAtNode($1, $10, $11, 2);\nresult = $12;\n",
        "$1 = InputTensor(q, float32, [6, 1, 4]);\n$2 = InputTensor(k, float32, [6, 8, 4]);\n"
        "$3 = PermuteNode($2, [0, 2, 1]);\n$4 = MatMulNode($1, $3);\n"
        "$5 = InputTensor(p, int64, [3]);\n$6 = SlicedSoftmaxNode($4, $5);\n"
        "$7 = InputTensor(v, float32, [6, 8, 4]);\n$8 = PrefixMatMulNode($6, $7, $5);\nresult = $8;\n",
    };
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    CHECK(ctx != NULL, "context: %s", mk_error_message(err));
    for (size_t i = 0; ctx && i < sizeof scripts / sizeof scripts[0]; i++) {
        mk_model *m = mk_compile(ctx, scripts[i], NULL, 0, NULL, &err);
        CHECK(m != NULL, "compile: %s\n%s", mk_error_message(err), scripts[i]);
        if (!m) break;
        int checked = mk_model_check_generated(m, 90, &err);
        CHECK(checked == 1, "sm_90: %d generated launches, want the group: %s\n%s", checked,
              err ? mk_error_message(err) : "", scripts[i]);
        mk_model_free(m);
        mk_error_free(err);
        err = NULL;
    }
    mk_context_free(ctx);
}

static void test_kernel_source(void) {
    const char *text =
        "$1 = InputTensor(x, float32, [1, 32]);\n"
        "$2 = InputTensor(w, float32, [16, 32]);\n"
        "$3 = PermuteNode($2, [1, 0]);\n"
        "$4 = MatMulNode($1, $3);\n"
        "$5 = InputTensor(b, float32, [1, 16]);\n"
        "$6 = SumNode($4, $5);\n"
        "$7 = InputTensor(m, float32, [5, 1]);\n"
        "$8 = MatMulNode($7, $6);\n"
        "$9 = SiLUNode($8);\n"
        "$10 = HadamardProductNode($9, $5);\n"
        "result = $10;\n";
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = mk_compile(ctx, text, NULL, 0, NULL, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    if (!m) goto done;
    mk_stats st;
    mk_model_stats(m, &st);
    /* launches: the group of $4 + $6; MatMul $8 (5 rows, more than a matrix-vector
     * product: BLAS); the pointwise group */
    CHECK(st.launches == 3, "%d launches\n%s", st.launches, mk_model_script(m));
    const char *want[3] = {"moonkaas matrix-vector group $4", NULL, "moonkaas pointwise group"};
    for (int i = 0; i < st.launches && i < 3; i++) {
        char *src = mk_model_kernel_source(m, i, &err);
        if (want[i]) {
            CHECK(src && strstr(src, want[i]) && strstr(src, "extern \"C\" __global__"),
                  "launch %d: %s", i, src ? src : mk_error_message(err));
        } else {
            CHECK(!src && mk_error_code_of(err) == MK_ERR_ARGUMENT &&
                      strstr(mk_error_message(err), "launch 1 runs MatMulNode $8 with a library "
                                                    "kernel: no generated source"),
                  "launch %d: %s", i, src ? "a source" : mk_error_message(err));
        }
        mk_string_free(src);
        mk_error_free(err);
        err = NULL;
    }
    char *src = mk_model_kernel_source(m, 3, &err);
    CHECK(!src && strstr(mk_error_message(err), "launch 3 is out of range: the model has 3 (0 to 2)"),
          "%s", src ? "a source" : mk_error_message(err));
    mk_string_free(src);
    mk_model_free(m);
done:
    mk_error_free(err);
    mk_context_free(ctx);
}

/* Row groups (core/codegen/rows.c): softmax with a scale and a mask as its
 * prologue, log_softmax, layer_norm then gelu, rms_norm then a product, a
 * strided x, at rows of 1 to 20,000 (a warp's, a block's, past the registers
 * a thread keeps): each launch's source names its group and kernel, has the
 * form its plan says, and compiles with NVRTC where the plugin is. */
static void test_row_groups(bool nvrtc) {
    static const char *const forms[] = {
        "$1 = InputTensor(x, float32, [%d, %d]);\n$2 = InputTensor(s, float32, [1]);\n"
        "$3 = HadamardProductNode($1, $2);\n$4 = InputTensor(mask, float32, [1, %d]);\n"
        "$5 = SumNode($3, $4);\n$6 = SoftmaxNode($5, -1);\nresult = $6;\n",
        "$1 = InputTensor(x, float32, [%d, %d]);\n$2 = InputTensor(b, float32, [%d]);\n"
        "$3 = SubNode($1, $2);\n$4 = LogSoftmaxNode($3, -1);\n"
        "$5 = InputTensor(c, float32, [1, 1]);\n$6 = HadamardProductNode($4, $5);\n"
        "result = $6;\n",
        "$1 = InputTensor(x, float32, [%d, %d]);\n$2 = InputTensor(w, float32, [%d]);\n"
        "$3 = InputTensor(b, float32, [%d]);\n$4 = InputTensor(eps, float32, [1]);\n"
        "$5 = LayerNormNode($1, $2, $3, $4, 1);\n$6 = GELUNode($5);\nresult = $6;\n",
        "$1 = InputTensor(x, float32, [%d, %d]);\n$2 = InputTensor(w, float32, [%d]);\n"
        "$3 = InputTensor(eps, float32, [1]);\n$4 = RmsNormEpsNode($1, $2, $3);\n"
        "$5 = InputTensor(b, float32, [%d]);\n$6 = HadamardProductNode($4, $5);\nresult = $6;\n",
        "$1 = InputTensor(x, float32, [%d, %d]);\n$2 = PermuteNode($1, [1, 0]);\n"
        "$3 = SoftmaxNode($2, -1);\n$4 = InputTensor(c, float32, [1]);\n"
        "$5 = SumNode($3, $4);\nresult = $5;\n",
    };
    static const char *const names[] = {"mk_rows_mul_add_softmax", "mk_rows_sub_log_softmax_mul",
                                        "mk_rows_layer_norm_gelu", "mk_rows_rms_norm_eps_mul",
                                        "mk_rows_softmax_add"};
    static const int lens[] = {1, 31, 32, 33, 1024, 5000, 20000};
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    CHECK(ctx != NULL, "context: %s", mk_error_message(err));
    int checked = 0;
    for (size_t f = 0; ctx && f < sizeof forms / sizeof forms[0]; f++)
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            int n = lens[i], rows = n > 1000 ? 3 : 7;
            char script[1024];
            if (f == 4) snprintf(script, sizeof script, forms[f], n, rows); /* x: [n, rows] permuted */
            else snprintf(script, sizeof script, forms[f], rows, n, n, n);
            mk_model *m = mk_compile(ctx, script, NULL, 0, NULL, &err);
            CHECK(m != NULL, "compile: %s\n%s", mk_error_message(err), script);
            if (!m) break;
            char *src = mk_model_kernel_source(m, 0, &err);
            /* the plan: a warp a row up to 128 elements, 4 rows a block; else a block of
             * the fewest threads that leave a thread 8 elements; past 16 a thread,
             * x kept in the result */
            char plan[64];
            snprintf(plan, sizeof plan, "constexpr int RT = %d, RB = %d", n <= 128 ? 32 : n <= 1024 ? 128 : 1024,
                     n <= 128 ? 4 : 1);
            const char *loop = n > 16 * 1024 ? "for (long long j = t; j < LEN; j += RT)"
                                             : "for (int i = 0; i < PT; i++)";
            CHECK(src && strstr(src, "// moonkaas row group: ") && strstr(src, names[f]) &&
                      strstr(src, plan) && strstr(src, loop),
                  "form %zu, rows of %d: want %s, \"%s\", \"%s\" in\n%s", f, n, names[f], plan, loop,
                  src ? src : mk_error_message(err));
            mk_string_free(src);
            if (nvrtc) {
                int c = mk_model_check_generated(m, 90, &err);
                CHECK(c == 1, "form %zu, rows of %d: %d kernels checked: %s", f, n, c,
                      err ? mk_error_message(err) : "");
                checked += c > 0 ? c : 0;
            }
            mk_model_free(m);
            mk_error_free(err);
            err = NULL;
        }
    if (nvrtc) printf("#   %d row group kernels checked with NVRTC\n", checked);
    mk_context_free(ctx);
}
static void test_row_groups_source(void) { test_row_groups(false); }
static void test_row_groups_nvrtc(void) { test_row_groups(true); }

/* Files in dir ending in .cubin; the inode of the first in *inode (0 if none). */
static int cubins(const char *dir, ino_t *inode) {
    DIR *d = opendir(dir);
    int n = 0;
    if (inode) *inode = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 6, ".cubin")) continue;
        if (inode && !n) *inode = e->d_ino;
        n++;
    }
    if (d) closedir(d);
    return n;
}

/* A model with one fresh pointwise group (its shape drawn: a source no cache has). */
static mk_model *fresh_group(mk_context *ctx, mk_error **err) {
    char text[256];
    snprintf(text, sizeof text,
             "$1 = InputTensor(x, float32, [%d, 7]);\n$2 = SiLUNode($1);\n"
             "$3 = HadamardProductNode($2, $1);\nresult = $3;\n",
             (int)test_randint(1000, 1000000));
    return mk_compile(ctx, text, NULL, 0, NULL, err);
}

/* After a test of the disk cache in dir: $MK_KERNEL_CACHE as it was, dir removed. */
static void drop_cache_dir(const char *dir) {
    if (outer_cache) setenv("MK_KERNEL_CACHE", outer_cache, 1);
    else unsetenv("MK_KERNEL_CACHE");
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("#   could not remove %s\n", dir);
}

/* The disk cache: a second check reads the cubin instead of compiling (the file
 * is not replaced), a broken file is compiled again and replaced, "off" writes
 * nothing, an unusable directory just means compiling. */
static void test_disk_cache(void) {
    char dir[] = "/tmp/mk-kernel-cache-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    setenv("MK_KERNEL_CACHE", dir, 1);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = fresh_group(ctx, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    if (!m) goto done;
    double t0 = test_now_ms();
    CHECK(mk_model_check_generated(m, 90, &err) == 1, "cold: %s", mk_error_message(err));
    double cold = test_now_ms() - t0;
    ino_t first = 0, again = 0;
    CHECK(cubins(dir, &first) == 1, "%d cubins after the cold check", cubins(dir, NULL));
    t0 = test_now_ms();
    CHECK(mk_model_check_generated(m, 90, &err) == 1, "warm: %s", mk_error_message(err));
    double warm = test_now_ms() - t0;
    CHECK(cubins(dir, &again) == 1 && again == first, "the warm check replaced the cubin");
    printf("#   one kernel: %.1f ms with NVRTC, %.2f ms from the disk cache\n", cold, warm);
    /* a broken file: compiled again and replaced by a good one */
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strstr(e->d_name, ".cubin")) continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "wb");
        if (f) {
            fputs("not a cubin", f);
            fclose(f);
        }
    }
    if (d) closedir(d);
    CHECK(mk_model_check_generated(m, 90, &err) == 1, "after breaking: %s", mk_error_message(err));
    CHECK(cubins(dir, &again) == 1 && again != first, "the broken cubin was not replaced");
    mk_model_free(m);
    /* off: nothing written */
    setenv("MK_KERNEL_CACHE", "off", 1);
    m = fresh_group(ctx, &err);
    CHECK(m && mk_model_check_generated(m, 90, &err) == 1 && cubins(dir, NULL) == 1,
          "off: %s, %d cubins", mk_error_message(err), cubins(dir, NULL));
    mk_model_free(m);
    /* a directory that cannot be made (a file's path below it): compiled all the same */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/%s", dir, "file");
    FILE *f = fopen(bad, "wb");
    if (f) fclose(f);
    snprintf(bad + strlen(bad), sizeof bad - strlen(bad), "/below");
    setenv("MK_KERNEL_CACHE", bad, 1);
    m = fresh_group(ctx, &err);
    CHECK(m && mk_model_check_generated(m, 90, &err) == 1, "an unusable directory: %s",
          mk_error_message(err));
    mk_model_free(m);
done:
    mk_error_free(err);
    mk_context_free(ctx);
    drop_cache_dir(dir);
}

/* Two layers alike (a product and its residual, weights of one shape, their
 * columns contiguous as CUDA reads them): their sources differ only in their
 * comments, which name the nodes, and they share one kernel: one cubin on
 * disk for both. */
static void test_shared_program(void) {
    char dir[] = "/tmp/mk-kernel-cache-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    setenv("MK_KERNEL_CACHE", dir, 1);
    int k = (int)test_randint(100, 4000) * 2; /* a shape no cache has */
    char text[512];
    snprintf(text, sizeof text,
             "$1 = InputTensor(x, float32, [1, %d]);\n"
             "$2 = InputTensor(w1, float32, [%d, %d]);\n$3 = PermuteNode($2, [1, 0]);\n"
             "$4 = MatMulNode($1, $3);\n$5 = SumNode($4, $1);\n"
             "$6 = InputTensor(w2, float32, [%d, %d]);\n$7 = PermuteNode($6, [1, 0]);\n"
             "$8 = MatMulNode($5, $7);\n$9 = SumNode($8, $5);\nresult = $9;\n",
             k, k, k, k, k);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = mk_compile(ctx, text, NULL, 0, NULL, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    char *a = m ? mk_model_kernel_source(m, 0, &err) : NULL, *b = m ? mk_model_kernel_source(m, 1, &err) : NULL;
    CHECK(a && b && strstr(a, "group $4:") && strstr(b, "group $8:"), "sources: %s",
          mk_error_message(err));
    if (a && b) {
        char *pa = mk_codegen_program(a), *pb = mk_codegen_program(b);
        CHECK(pa && pb && strcmp(a, b) && !strcmp(pa, pb), "the layers' programs differ:\n%s\n%s",
              a, b);
        free(pa);
        free(pb);
    }
    int checked = m ? mk_model_check_generated(m, 90, &err) : -1;
    CHECK(checked == 2 && cubins(dir, NULL) == 1, "%d groups, %d cubins: %s", checked,
          cubins(dir, NULL), mk_error_message(err));
    mk_string_free(a);
    mk_string_free(b);
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
    drop_cache_dir(dir);
}

/* Matrix–vector groups whose weights are float16, bfloat16 or int8 in scale
 * blocks (a DequantizeNode folded in), with four-wide loads (k a multiple of
 * 4) and without (k odd, for the widened ones). */
static void test_lowp_groups(void) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    const char *kinds[] = {"float16", "bfloat16", "int8"};
    int checked = 0;
    for (int t = 0; ctx && t < 3; t++)
        for (int k = 64; k <= 65; k++) {
            if (t == 2 && k == 65) continue; /* blocks divide k */
            char text[1024];
            if (t == 2)
                snprintf(text, sizeof text,
                         "$1 = InputTensor(x, float32, [2, %d]);\n"
                         "$2 = InputTensor(w, int8, [24, %d]);\n$3 = PermuteNode($2, [1, 0]);\n"
                         "$4 = InputTensor(s, float32, [24, %d]);\n$5 = PermuteNode($4, [1, 0]);\n"
                         "$6 = DequantizeNode($3, $5);\n$7 = MatMulNode($1, $6);\n"
                         "$8 = ArgMaxNode($7);\nresult = $8;\n",
                         k, k, k / 32);
            else
                snprintf(text, sizeof text,
                         "$1 = InputTensor(x, float32, [1, %d]);\n"
                         "$2 = InputTensor(w, %s, [24, %d]);\n$3 = PermuteNode($2, [1, 0]);\n"
                         "$4 = MatMulNode($1, $3);\n$5 = ReLUNode($4);\nresult = $5;\n",
                         k, kinds[t], k);
            mk_model *m = mk_compile(ctx, text, NULL, 0, NULL, &err);
            CHECK(m != NULL, "%s: %s", kinds[t], mk_error_message(err));
            if (!m) break;
            int n = mk_model_check_generated(m, 90, &err);
            CHECK(n == 1, "%s, k %d: %s", kinds[t], k, mk_error_message(err));
            checked += n == 1;
            mk_model_free(m);
        }
    CHECK(checked == 5, "%d of 5 kernels", checked);
    mk_error_free(err);
    mk_context_free(ctx);
}

/* The tensor-core form (core/codegen/matvec.c) for int8 weights in groups of 64,
 * RmsNorm folded in, 8,192 columns, k = 1,152 (a multiple of 128, not of
 * 512): with an ArgMax, and plain; compiled for
 * sm_90 (the MMA) and sm_75 (its sums by shuffles and DP4A). Two products a
 * result (SiLU(x W1^T) * x W3^T) take the other form. */
static void test_tensor_core_groups(void) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    const char *tails[] = {"$40 = ArgMaxNode($15);\nresult = $40;\n", "result = $15;\n",
                           "$30 = SiLUNode($15);\n$31 = HadamardProductNode($30, $25);\nresult = $31;\n"};
    for (int c = 0; ctx && c < 3; c++) {
        char text[2048];
        int n = 8192, at = snprintf(text, sizeof text,
            "$1 = InputTensor(x, float32, [1, 1152]);\n$2 = InputTensor(nw, float32, [1152]);\n"
            "$3 = RmsNormNode($1, $2);\n");
        for (int j = 0; j < 2; j++)
            at += snprintf(text + at, sizeof text - (size_t)at,
                           "$%d = InputTensor(w%d, int8, [%d, 1152]);\n$%d = PermuteNode($%d, [1, 0]);\n"
                           "$%d = InputTensor(s%d, float32, [%d, 18]);\n$%d = PermuteNode($%d, [1, 0]);\n"
                           "$%d = DequantizeNode($%d, $%d);\n$%d = MatMulNode($3, $%d);\n",
                           10 * j + 10, j, n, 10 * j + 11, 10 * j + 10, 10 * j + 12, j, n,
                           10 * j + 13, 10 * j + 12, 10 * j + 14, 10 * j + 11, 10 * j + 13,
                           10 * j + 15, 10 * j + 14);
        snprintf(text + at, sizeof text - (size_t)at, "%s", tails[c]);
        mk_model *m = mk_compile(ctx, text, NULL, 0, NULL, &err);
        CHECK(m != NULL, "case %d: %s", c, mk_error_message(err));
        if (!m) break;
        int found = 0;
        mk_stats st;
        mk_model_stats(m, &st);
        for (int i = 0; i < st.launches; i++) {
            char *src = mk_model_kernel_source(m, i, NULL);
            found += src && strstr(src, "int8 on the tensor cores") &&
                     strstr(src, "mma.sync.aligned.m16n8k32");
            mk_string_free(src);
        }
        CHECK(found == (c == 2 ? 0 : 1), "case %d: %d launches in the tensor-core form", c, found);
        for (int arch = 75; arch <= 90; arch += 15) {
            int checked = mk_model_check_generated(m, arch, &err);
            CHECK(checked >= 1, "case %d, sm_%d: %s", c, arch, mk_error_message(err));
        }
        mk_model_free(m);
    }
    mk_error_free(err);
    mk_context_free(ctx);
}

/* Groups with 8 MiB of weights, whose blocks stage A (RmsNorm folded in, one
 * or two rows, k past a whole batch of steps): 16-bit weights load A in
 * batches of steps (core/codegen/matvec.c's stage_batch), float32 a step at a
 * time; compiled for sm_90. */
static void test_staged_batches(void) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    const char *kinds[] = {"bfloat16", "float16", "float32", "bfloat16", "float32"};
    for (int c = 0; ctx && c < 5; c++) {
        bool norm = c < 3; /* else a row longer than 8,192, copied at once */
        int rows = c == 1 || !norm ? 1 : 2, es = strcmp(kinds[c], "float32") ? 2 : 4;
        int k = norm ? 8 * (int)test_randint(513, 700) : 8 * (int)test_randint(1025, 1408);
        int n = 2 * ((8 << 20) / (2 * es * k) + 1); /* column pairs */
        char text[1024], want[32] = "xs[";
        int at = snprintf(text, sizeof text, "$1 = InputTensor(x, float32, [%d, %d]);\n", rows, k);
        if (norm)
            at += snprintf(text + at, sizeof text - (size_t)at,
                           "$2 = InputTensor(g, float32, [%d]);\n$3 = RmsNormNode($1, $2);\n", k);
        snprintf(text + at, sizeof text - (size_t)at,
                 "$4 = InputTensor(w, %s, [%d, %d]);\n$5 = PermuteNode($4, [1, 0]);\n"
                 "$6 = MatMulNode($%d, $5);\nresult = $6;\n",
                 kinds[c], n, k, norm ? 3 : 1);
        if (!norm) snprintf(want, sizeof want, "xs[%d]", (k + 1023) / 1024);
        mk_model *m = mk_compile(ctx, text, NULL, 0, NULL, &err);
        CHECK(m != NULL, "%s: %s", kinds[c], mk_error_message(err));
        if (!m) break;
        char *src = mk_model_kernel_source(m, 0, &err);
        CHECK(src && strstr(src, "sA[") && !strstr(src, "float sss[") == !norm, "%s, k %d: not staged",
              kinds[c], k);
        CHECK(src && !strstr(src, want) == (c == 2), "%s, k %d: %s%s", kinds[c], k,
              c == 2 ? "batches, want none" : "no ", c == 2 ? "" : want);
        mk_string_free(src);
        CHECK(mk_model_check_generated(m, 90, &err) == 1, "%s, sm_90: %s", kinds[c],
              mk_error_message(err));
        mk_model_free(m);
    }
    mk_error_free(err);
    mk_context_free(ctx);
}

/* A matrix-vector group reading two single-id embeddings of constant tables
 * (as A and as its epilogue's operand, gather.c): one launch, which offsets
 * both operands on the device, and compiles. */
static void test_gathered_operands(void) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    static float table[7 * 64], rows[7 * 24];
    for (int i = 0; i < 7 * 64; i++) table[i] = (float)test_uniform(-1.0, 1.0);
    for (int i = 0; i < 7 * 24; i++) rows[i] = (float)test_uniform(-1.0, 1.0);
    const mk_named_tensor consts[] = {{"table", table}, {"rows", rows}};
    const char *text = "$1 = ConstantTensor(table, float32, [7, 64]);\n"
                       "$2 = InputTensor(id, int64, [1]);\n$3 = EmbeddingNode($1, $2);\n"
                       "$4 = InputTensor(w, float32, [24, 64]);\n$5 = PermuteNode($4, [1, 0]);\n"
                       "$6 = MatMulNode($3, $5);\n$7 = ConstantTensor(rows, float32, [7, 24]);\n"
                       "$8 = InputTensor(pos, int64, [1]);\n$9 = EmbeddingNode($7, $8);\n"
                       "$10 = SumNode($6, $9);\nresult = $10;\n";
    mk_model *m = ctx ? mk_compile(ctx, text, consts, 2, NULL, &err) : NULL;
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    if (m) {
        mk_stats st;
        CHECK(mk_model_stats(m, &st) == 0 && st.launches == 1, "%d launches:\n%s", st.launches,
              mk_model_fusion_report(m));
        char *src = mk_model_kernel_source(m, 0, &err);
        CHECK(src && strstr(src, "const long long id = *(const long long *)i"), "source: %s",
              src ? src : mk_error_message(err));
        free(src);
        CHECK(mk_model_check_generated(m, 90, &err) == 1, "%s", mk_error_message(err));
    }
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
}

/* The attention source of a decode attention graph, heads d = n wide, K
 * read permuted from rows of d as the caches hold it, s of them (buffers, or
 * inputs where `inputs`), its result read by a product (on the int8 grid
 * where w8a8); NULL on failure. */
static char *attention_source(mk_context *ctx, int d, int s, bool w8a8, bool inputs) {
    char text[1024], k[64], v[64];
    if (inputs) {
        snprintf(k, sizeof k, "InputTensor(k, float32, [1, %d, %d])", s, d);
        snprintf(v, sizeof v, "InputTensor(v, float32, [1, %d, %d])", s, d);
    } else {
        snprintf(k, sizeof k, "BufferTensor(float32, [1, %d, %d], k)", s, d);
        snprintf(v, sizeof v, "BufferTensor(float32, [1, %d, %d], v)", s, d);
    }
    int at = snprintf(text, sizeof text,
                      "$1 = InputTensor(q, float32, [1, 2, %d]);\n$2 = %s;\n$3 = %s;\n"
                      "$4 = InputTensor(p, int64, [1]);\n"
                      "$20 = PermuteNode($2, [0, 2, 1]);\n"
                      "$5 = MatMulNode($1, $20);\n$6 = SlicedSoftmaxNode($5, $4);\n"
                      "$7 = PrefixMatMulNode($6, $3, $4);\n$8 = ReshapeNode($7, [1, %d]);\n",
                      d, k, v, 2 * d);
    if (w8a8)
        snprintf(text + at, sizeof text - (size_t)at,
                 "$9 = FakeQuantizeNode($8, 32);\n$10 = InputTensor(w, int8, [8, %d]);\n"
                 "$11 = PermuteNode($10, [1, 0]);\n$12 = InputTensor(s, float32, [8, %d]);\n"
                 "$13 = PermuteNode($12, [1, 0]);\n$14 = DequantizeNode($11, $13);\n"
                 "$15 = MatMulNode($9, $14);\nresult = $15;\n", 2 * d, 2 * d / 32);
    else
        snprintf(text + at, sizeof text - (size_t)at,
                 "$9 = InputTensor(w, float32, [%d, 8]);\n$10 = MatMulNode($8, $9);\nresult = $10;\n",
                 2 * d);
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, text, NULL, 0, NULL, &err);
    CHECK(m != NULL, "compile: %s\n%s", mk_error_message(err), text);
    char *found = NULL;
    mk_stats st;
    for (int i = 0; m && !found && mk_model_stats(m, &st) == 0 && i < st.launches; i++) {
        char *src = mk_model_kernel_source(m, i, &err);
        mk_error_free(err);
        err = NULL;
        if (src && strstr(src, "moonkaas attention group")) found = src;
        else free(src);
    }
    CHECK(found != NULL, "no attention group:\n%s", m ? mk_model_fusion_report(m) : text);
    if (found) CHECK(mk_model_check_generated(m, 90, &err) >= 1, "%s", mk_error_message(err));
    mk_error_free(err);
    mk_model_free(m);
    return found;
}

/* An attention group's chunk rows, as the source's first line says: 64 for
 * heads 48 or 64 wide, 32 for 96, and 32 where a product takes A on the int8
 * grid (where the sums' last bit can change runq.c's text); and q and K as
 * float4s where rows are a multiple of 4 wide, but on the int8 grid and
 * where a cluster's chunks load early rows (300 rows: 5 chunks of 64), which
 * they do from buffers, not from inputs (product.c's early_rows). */
static void test_attention_rows(void) {
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    const struct { int d, s; bool w8a8, inputs; const char *want; bool float4; int dk; } cases[] = {
        {48, 600, false, false, "600 cached rows in chunks of 64, 48 values", true, 3},
        {64, 600, false, false, "600 cached rows in chunks of 64, 64 values", true, 4},
        {96, 600, false, false, "600 cached rows in chunks of 32, 96 values", true, 6},
        {6, 600, false, false, "600 cached rows in chunks of 64, 6 values", false, 2},
        {48, 600, true, false, "600 cached rows in chunks of 32, 48 values", false, 12},
        {64, 300, false, false, "300 cached rows in chunks of 64, 64 values", false, 16},
        {64, 300, false, true, "300 cached rows in chunks of 64, 64 values", true, 4},
    };
    for (size_t c = 0; ctx && c < sizeof cases / sizeof cases[0]; c++) {
        char *src = attention_source(ctx, cases[c].d, cases[c].s, cases[c].w8a8, cases[c].inputs);
        /* the scores' form, as the constants before attention.cuh say: q and K as
         * float4s or floats, and how many of them a thread holds */
        char form[80];
        snprintf(form, sizeof form, ", DK = %d, DU = ", cases[c].dk);
        const char *f4 = cases[c].float4 ? "#define MK_ATT_FLOAT4 1\n" : "#define MK_ATT_FLOAT4 0\n";
        CHECK(src && strstr(src, cases[c].want) && strstr(src, form) && strstr(src, f4),
              "heads %d%s%s: want \"%s\", \"%s\" and \"%s\" in\n%.300s", cases[c].d,
              cases[c].w8a8 ? " (W8A8)" : "", cases[c].inputs ? " (input caches)" : "",
              cases[c].want, form, f4, src ? src : "(none)");
        free(src);
    }
    mk_error_free(err);
    mk_context_free(ctx);
}

int main(void) {
    const char *seed = getenv("MK_SEED"), *cache = getenv("MK_KERNEL_CACHE");
    unsigned long long corpus = seed ? strtoull(seed, NULL, 10) : CORPUS_SEED;
    printf("# corpus seed %llu (%s)\n", corpus, seed ? "MK_SEED" : "fixed; MK_SEED=N draws another");
    test_srand(corpus);
    outer_cache = cache ? strdup(cache) : NULL;
    char why[512];
    if (!mk_cuda_plugin_get(why, sizeof why)) {
        SKIP(test_random_groups, why);
        RUN(test_kernel_source); /* the core writes the source: no plugin needed */
        RUN(test_row_groups_source);
        SKIP(test_disk_cache, why);
        SKIP(test_lowp_groups, why);
        SKIP(test_tensor_core_groups, why);
        SKIP(test_staged_batches, why);
        SKIP(test_shared_program, why);
        SKIP(test_gathered_operands, why);
        SKIP(test_attention_rows, why);
        SKIP(test_batch_groups, why);
    } else {
        RUN(test_random_groups);
        RUN(test_issue64_ops);
        RUN(test_kernel_source);
        RUN(test_row_groups_nvrtc);
        RUN(test_disk_cache);
        RUN(test_shared_program);
        RUN(test_lowp_groups);
        RUN(test_tensor_core_groups);
        RUN(test_staged_batches);
        RUN(test_gathered_operands);
        RUN(test_attention_rows);
        RUN(test_batch_groups);
    }
    free(outer_cache);
    return test_summary("codegen");
}
