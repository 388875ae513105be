/*
 * lowp_products_test.c — products whose weights are float16, bfloat16 or int8
 * in scale blocks (alone, and folded into matrix–vector groups, also in the
 * large launches' forms), and int8 activations (FakeQuantizeNode, and
 * runq.c's W8A8 products where a group folds it in). lowp_test.c has the
 * conversions themselves.
 *
 * References are written here and in lowp.h, independently of core/:
 * products in double. Inputs are random with a printed seed. On a machine with
 * a CUDA device the same graphs run there and must equal the CPU's results
 * within float32 rounding.
 *
 *   make build/tests/lowp_products_test && ./build/tests/lowp_products_test
 */
#include "lowp.h"

#include <float.h>

/* ---- products with low-precision weights ------------------------------------------ */

/*
 * y [m, n] = x [m, k] @ W^T, W [n, k] in `kind`: float16, bfloat16, or int8 with
 * scales [n, k / 32] (the llama2.c layout). Grouped (a matrix–vector group
 * that reads the weights as they are) equals ungrouped (the nodes alone)
 * bit for bit, and both the double-precision product of the widened weights.
 */
static void product_on(mk_device dev, const char *kind, int64_t m, int64_t k, int64_t n) {
    char text[1024];
    bool q8 = !strcmp(kind, "int8");
    if (q8)
        snprintf(text, sizeof text,
                 "$1 = InputTensor(x, float32, [%lld, %lld]);\n"
                 "$2 = InputTensor(w, int8, [%lld, %lld]);\n$3 = PermuteNode($2, [1, 0]);\n"
                 "$4 = InputTensor(s, float32, [%lld, %lld]);\n$5 = PermuteNode($4, [1, 0]);\n"
                 "$6 = DequantizeNode($3, $5);\n$7 = MatMulNode($1, $6);\nresult = $7;\n",
                 (long long)m, (long long)k, (long long)n, (long long)k, (long long)n,
                 (long long)(k / 32));
    else
        snprintf(text, sizeof text,
                 "$1 = InputTensor(x, float32, [%lld, %lld]);\n"
                 "$2 = InputTensor(w, %s, [%lld, %lld]);\n$3 = PermuteNode($2, [1, 0]);\n"
                 "$4 = MatMulNode($1, $3);\nresult = $4;\n",
                 (long long)m, (long long)k, kind, (long long)n, (long long)k);
    mk_dtype wt = q8 ? MK_DTYPE_INT8 : !strcmp(kind, "float16") ? MK_DTYPE_FLOAT16 : MK_DTYPE_BFLOAT16;
    float *x = malloc(sizeof(float) * (size_t)(m * k)), *wf = malloc(sizeof(float) * (size_t)(n * k));
    float *s = malloc(sizeof(float) * (size_t)(n * k / 32 + 1));
    void *w = malloc(2 * (size_t)(n * k));
    float *y[2] = {malloc(sizeof(float) * (size_t)(m * n)), malloc(sizeof(float) * (size_t)(m * n))};
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)test_uniform(-1, 1);
    if (q8) {
        for (int64_t i = 0; i < n * k; i++) ((int8_t *)w)[i] = (int8_t)test_randint(-127, 127);
        for (int64_t i = 0; i < n * k / 32; i++) s[i] = (float)test_uniform(0.001, 0.02);
        for (int64_t i = 0; i < n * k; i++) /* row j, column c: scale [j, c / 32] */
            wf[i] = (float)((double)((int8_t *)w)[i] * s[i / k * (k / 32) + i % k / 32]);
    } else {
        float *tmp = malloc(sizeof(float) * (size_t)(n * k));
        for (int64_t i = 0; i < n * k; i++) tmp[i] = (float)test_uniform(-1, 1);
        for (int64_t i = 0; i < n * k; i++)
            ((uint16_t *)w)[i] = wt == MK_DTYPE_FLOAT16 ? f16_nearest(tmp[i]) : bf16_nearest(tmp[i]);
        for (int64_t i = 0; i < n * k; i++)
            wf[i] = (float)(wt == MK_DTYPE_FLOAT16 ? f16_value(((uint16_t *)w)[i])
                                                   : bf16_value(((uint16_t *)w)[i]));
        free(tmp);
    }
    mk_named_tensor in[] = {{"x", x}, {"w", w}, {"s", s}};
    for (int fuse = 0; fuse < 2; fuse++) {
        mk_error *err = NULL;
        mk_model *mod = compile(text, dev, fuse, &err);
        CHECK(mod != NULL, "%s: %s", kind, mk_error_message(err));
        mk_error_free(err);
        err = NULL;
        if (!mod) continue;
        if (fuse && m <= 4) {
            mk_stats st;
            mk_model_stats(mod, &st);
            const char *report = mk_model_fusion_report(mod);
            CHECK(st.launches == 1 && st.product_groups == 1, "%s: %d launches\n%s", kind,
                  st.launches, report);
            CHECK(strstr(report, q8 ? "int8 in blocks of 32, dequantized as read" : "widened as read"),
                  "%s", report);
        }
        bool staged = (q8 ? n * k + n * k / 8 : 2 * n * k) >= (8 << 20);
        if (fuse && dev == MK_DEVICE_CUDA && staged) {
            /* staged, A loaded in batches of steps, all of them at once for
             * int8 weights or where a row of more than 8,192 takes more than 8
             * (core/codegen/matvec.c's stage_batch); a float4 a thread a step, 8
             * warps a block or 12 where k is in 3 slices (block_warps) */
            char *src = mk_model_kernel_source(mod, 0, NULL);
            long long step = 128LL * (src && strstr(src, "k in 3 slices") ? 12 : 8);
            char want[32] = "xs[";
            if (q8 || k > 8192) snprintf(want, sizeof want, "xs[%lld]", ((long long)k + step - 1) / step);
            CHECK(src && strstr(src, "sA[") && strstr(src, want), "%s [%lld, %lld]: not staged as %s",
                  kind, (long long)m, (long long)k, want);
            mk_string_free(src);
        }
        if (fuse && dev == MK_DEVICE_CUDA && m == 1) {
            /* 4 columns a warp (core/codegen/matvec.c's warp_columns) where they
             * are in 4s, int8 weights with A staged, 2-byte ones where k <= 2,048 */
            bool quad = n % 4 == 0 && (q8 ? staged : k <= 2048);
            char *src = mk_model_kernel_source(mod, 0, NULL);
            CHECK(src && !strstr(src, "4 columns a warp") == !quad, "%s [1, %lld] @ [%lld]: want %s a warp",
                  kind, (long long)k, (long long)n, quad ? "4 columns" : "a pair");
            mk_string_free(src);
        }
        CHECK(mk_evaluate(mod, in, q8 ? 3 : 2, y[fuse], sizeof(float) * (size_t)(m * n), &err) == 0,
              "%s", mk_error_message(err));
        mk_error_free(err);
        mk_model_free(mod);
    }
    /* Widened weights keep their layout, so a group sums as the product alone
     * does; a DequantizeNode alone writes W^T row by row, which the product
     * then reads in another order: int8 agrees within rounding only. */
    bool same = !memcmp(y[0], y[1], sizeof(float) * (size_t)(m * n));
    CHECK(same || q8 || dev == MK_DEVICE_CUDA,
          "%s [%lld, %lld] @ [%lld]: grouped differs from alone", kind, (long long)m,
          (long long)k, (long long)n);
    /* CUDA takes x in two bfloat16 parts against bfloat16 weights (matmul.cu's
     * split_rows): 2^-16 of each term more */
    double per_term = 1e-6 + (dev == MK_DEVICE_CUDA && wt == MK_DTYPE_BFLOAT16 ? 0x1p-16 : 0.0);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double want = 0.0, mag = 0.0; /* and the sum of |terms|, float32's rounding of long sums */
            for (int64_t c = 0; c < k; c++) {
                double t = (double)x[i * k + c] * wf[j * k + c];
                want += t, mag += fabs(t);
            }
            for (int f = 0; f < 2; f++)
                if (!test_close(y[f][i * n + j], want, 1e-5, 1e-4) &&
                    !(fabs(y[f][i * n + j] - want) <= per_term * mag)) {
                    CHECK(0, "%s %s [%lld, %lld]: %g, want %g", kind, f ? "grouped" : "alone",
                          (long long)i, (long long)j, (double)y[f][i * n + j], want);
                    i = m, j = n;
                    break;
                }
        }
    free(x), free(wf), free(s), free(w), free(y[0]), free(y[1]);
}

static void products_on(mk_device dev) {
    const char *kinds[] = {"float16", "bfloat16", "int8"};
    for (int t = 0; t < 3; t++) {
        product_on(dev, kinds[t], 1, 32 * test_randint(1, 12), 2 * test_randint(1, 70));
        product_on(dev, kinds[t], 1, 32 * test_randint(1, 12) + (t == 2 ? 0 : test_randint(1, 31)),
                   4 * test_randint(1, 35)); /* columns in 4s: 4 a warp but in int8; k's tail */
        int64_t k = 32 * test_randint(1, 12) + (t == 2 ? 0 : test_randint(1, 31)); /* a tail */
        product_on(dev, kinds[t], test_randint(2, 4), k, 2 * test_randint(1, 70));
        product_on(dev, kinds[t], 9, 64, 10); /* too many rows for a group: the weights are widened */
    }
    for (int t = 0; t < 3; t++) { /* 8 MiB of weights: CUDA stages A, several steps a batch */
        int64_t k = t == 2 ? 32 * test_randint(65, 175) : 8 * test_randint(257, 700);
        int64_t n = 2 * ((t == 2 ? 8 << 20 : 4 << 20) / k / 2 + test_randint(1, 20));
        product_on(dev, kinds[t], test_randint(1, 2), k, n);
        if (t < 2) { /* k <= 2,048: 4 columns a warp */
            k = 8 * test_randint(128, 256);
            product_on(dev, kinds[t], 1, k, 4 * ((4 << 20) / k / 4 + test_randint(1, 20)));
        }
    }
    for (int t = 0; t < 3; t++) { /* 8 MiB and a row longer than 8,192: CUDA copies it at once */
        int64_t k = 32 * test_randint(257, 352);
        int64_t n = 2 * ((t == 2 ? 8 << 20 : 4 << 20) / k / 2 + test_randint(1, 8));
        product_on(dev, kinds[t], 1, k, n);
    }
}
/*
 * x [2, m, k] @ W [k, n] bfloat16, stored as it is read (not transposed), the
 * rows of both batches one product: prompts' shapes (more rows than any group
 * takes; on CUDA, x in two bfloat16 parts on tensor cores). Row 0 holds
 * FLT_MAX (its rounding to bfloat16 would overflow: split toward zero), row 1
 * inf and row 2 NaN, each at column 0 of a row otherwise 0; the other rows are
 * random. Each output against the product in double.
 */
static void tall_bf16_on(mk_device dev) {
    int64_t m = test_randint(9, 40), k = test_randint(17, 300), n = test_randint(3, 90);
    char text[512];
    snprintf(text, sizeof text,
             "$1 = InputTensor(x, float32, [2, %lld, %lld]);\n$2 = InputTensor(w, bfloat16, [%lld, %lld]);\n"
             "$3 = MatMulNode($1, $2);\nresult = $3;\n",
             (long long)m, (long long)k, (long long)k, (long long)n);
    int64_t rows = 2 * m;
    float *x = malloc(sizeof(float) * (size_t)(rows * k)), *y = malloc(sizeof(float) * (size_t)(rows * n));
    uint16_t *w = malloc(2 * (size_t)(k * n));
    for (int64_t i = 0; i < rows * k; i++) x[i] = (float)test_uniform(-3, 3);
    for (int64_t i = 0; i < k * n; i++) w[i] = bf16_nearest((float)test_uniform(-1, 1));
    for (int r = 0; r < 3; r++)
        for (int64_t c = 0; c < k; c++)
            x[r * k + c] = c ? 0.0f : r == 0 ? FLT_MAX : r == 1 ? INFINITY : NAN;
    mk_named_tensor in[] = {{"x", x}, {"w", w}};
    mk_error *err = NULL;
    mk_model *mod = compile(text, dev, true, &err);
    CHECK(mod != NULL, "%s", mk_error_message(err));
    if (mod) {
        CHECK(mk_evaluate(mod, in, 2, y, sizeof(float) * (size_t)(rows * n), &err) == 0, "%s",
              mk_error_message(err));
        for (int64_t i = 0, bad = 0; i < rows && !bad; i++)
            for (int64_t j = 0; j < n && !bad; j++) {
                double want = 0.0, mag = 0.0;
                for (int64_t c = 0; c < k; c++) {
                    double t = (double)x[i * k + c] * bf16_value(w[c * n + j]);
                    want += t, mag += fabs(t);
                }
                double got = y[i * n + j];
                bool ok = isnan(want) ? isnan(got)
                          : isinf(want) ? got == want
                                        : fabs(got - want) <= (1e-6 + 0x1p-14) * mag + 1e-30;
                CHECK(ok, "[2, %lld, %lld] @ [%lld, %lld] row %lld column %lld: %g, want %g",
                      (long long)m, (long long)k, (long long)k, (long long)n, (long long)i,
                      (long long)j, got, want);
                bad = !ok;
            }
    }
    mk_error_free(err);
    mk_model_free(mod);
    free(x), free(y), free(w);
}

static void test_products_cpu(void) { products_on(MK_DEVICE_CPU); }
static void test_products_cuda(void) { products_on(MK_DEVICE_CUDA); }
static void test_tall_bf16_cpu(void) { tall_bf16_on(MK_DEVICE_CPU); }
static void test_tall_bf16_cuda(void) { tall_bf16_on(MK_DEVICE_CUDA); }

/* ---- int8 products in the large launches' forms ---------------------------------- */

/* What follows the product in an int8 case. */
typedef enum {
    TC_PLAIN,    /* y = x' W^T */
    TC_RESIDUAL, /* y + r, r an input [1, n] */
    TC_ROPE,     /* (y_2i, y_2i+1) times (f_i0, f_i1) as complex numbers */
    TC_ROW,      /* rotated, then written into row pos of a buffer [4, n] */
    TC_ARGMAX,   /* the ArgMax of y */
    TC_TWO,      /* SiLU(x' W^T) * x' W3^T: two products a result, the other form */
} tc_tail;

/* The form a large int8 launch takes (core/codegen/matvec.c), as its source names it. */
typedef enum {
    FORM_PAIR,  /* a column pair a warp */
    FORM_QUAD,  /* 4 columns a warp (warp_columns) */
    FORM_QUAD3, /* the same, k in 3 slices, 12 warps a block (product_slices) */
    FORM_TC,    /* the tensor cores */
} int8_form;

/*
 * The forms of a group with one row of x, int8 weights in groups of a
 * multiple of 64 and at least 8 MB of them (A staged), y = x' W^T, x' = x or
 * RmsNorm(x, nw) (`norm`), then `tail`: the tensor-core form (the integer MMA,
 * x as fixed-point digits), which it takes with k a multiple of 128 but not
 * of 512, results of one product each and at least 8,192 columns; else 4
 * columns a warp where the results read one product each and their columns
 * are multiples of 4;
 * else a column pair a warp (TC_TWO). The kernel's source must name the form
 * `form` says. Against double loops, within float32's rounding of the sums
 * (1e-6 of the sum of |terms|: the digits hold x to 2^-31 of each 64's
 * largest |x|); x spans twelve orders of magnitude, one 64 is zeros and one
 * subnormal. A NaN in x (`nan`) makes every result NaN, as the CPU's. With
 * MK_CUDA_NO_MMA=1 when the model is compiled, the tensor-core form's integer
 * sums come from shuffles and DP4A (the path of GPUs before sm_80): bit for
 * bit the same. Constant weights (`constant`) are loaded before the kernel's
 * wait. A row write (TC_ROW) is first given bad bounds, two rows for one and a
 * row past the buffer: each fails naming the node, and the model then runs as
 * usual.
 */
static void int8_case(int64_t k, int64_t n, int64_t g, bool norm, tc_tail tail, bool nan,
                      bool constant, int8_form form) {
    char text[2048];
    const char *kind = constant ? "ConstantTensor" : "InputTensor"; /* the weights' */
    int at = snprintf(text, sizeof text,
                      "$1 = InputTensor(x, float32, [1, %lld]);\n$2 = InputTensor(nw, float32, [%lld]);\n"
                      "$3 = RmsNormNode($1, $2);\n$4 = InputTensor(r, float32, [1, %lld]);\n"
                      "$5 = InputTensor(f, float32, [1, %lld, 2]);\n$6 = InputTensor(pos, int64, [1]);\n"
                      "$7 = InputTensor(pos1, int64, [1]);\n",
                      (long long)k, (long long)k, (long long)n, (long long)(n / 2));
    for (int j = 0; j < 1 + (tail == TC_TWO); j++)
        at += snprintf(text + at, sizeof text - (size_t)at,
                       "$%d = %s(w%d, int8, [%lld, %lld]);\n$%d = PermuteNode($%d, [1, 0]);\n"
                       "$%d = %s(s%d, float32, [%lld, %lld]);\n$%d = PermuteNode($%d, [1, 0]);\n"
                       "$%d = DequantizeNode($%d, $%d);\n$%d = MatMulNode($%d, $%d);\n",
                       10 * j + 10, kind, j, (long long)n, (long long)k, 10 * j + 11, 10 * j + 10,
                       10 * j + 12, kind, j, (long long)n, (long long)(k / g), 10 * j + 13,
                       10 * j + 12, 10 * j + 14, 10 * j + 11, 10 * j + 13, 10 * j + 15,
                       norm ? 3 : 1, 10 * j + 14);
    const char *tails[] = {
        "result = $15;\n",
        "$30 = SumNode($15, $4);\nresult = $30;\n",
        "$30 = ReshapeNode($15, [1, %lld, 2]);\n$31 = ComplexHadamardProductNode($30, $5);\n"
        "$32 = ReshapeNode($31, [1, %lld]);\nresult = $32;\n",
        "$30 = ReshapeNode($15, [1, %lld, 2]);\n$31 = ComplexHadamardProductNode($30, $5);\n"
        "$32 = ReshapeNode($31, [1, %lld]);\n$33 = BufferTensor(float32, [4, %lld], rows);\n"
        "$34 = ReplaceSliceNode($33, $32, $6, $7);\nresult = $34;\n",
        "$30 = ArgMaxNode($15);\nresult = $30;\n",
        "$30 = SiLUNode($15);\n$31 = HadamardProductNode($30, $25);\nresult = $31;\n",
    };
    snprintf(text + at, sizeof text - (size_t)at, tails[tail], (long long)(n / 2), (long long)n,
             (long long)n);
    float *x = malloc(sizeof(float) * (size_t)k), *nw = malloc(sizeof(float) * (size_t)k);
    float *r = malloc(sizeof(float) * (size_t)n), *f = malloc(sizeof(float) * (size_t)n);
    int8_t *w[2] = {malloc((size_t)(n * k)), malloc((size_t)(n * k))};
    size_t groups = (size_t)(n * k / g);
    float *s[2] = {malloc(sizeof(float) * groups), malloc(sizeof(float) * groups)};
    size_t out_n = tail == TC_ROW ? 4 * (size_t)n : (size_t)n;
    float *y[2] = {malloc(sizeof(float) * out_n), malloc(sizeof(float) * out_n)};
    int64_t pos = test_randint(0, 3), pos1 = pos + 1;
    for (int64_t c = 0; c < k; c++) {
        x[c] = (float)(test_uniform(-1, 1) * pow(10.0, (double)test_randint(-6, 6)));
        nw[c] = (float)test_uniform(0.5, 1.5);
    }
    int64_t zeros = 64 * test_randint(0, k / 64 - 1), tiny = 64 * test_randint(0, k / 64 - 1);
    for (int64_t c = 0; c < 64; c++)
        x[tiny + c] = (float)ldexp(test_uniform(-1, 1), -135), x[zeros + c] = 0.0f;
    if (nan) x[test_randint(0, k - 1)] = NAN;
    for (int64_t j = 0; j < n; j++) r[j] = (float)test_uniform(-10, 10);
    for (int64_t i = 0; i < n / 2; i++) {
        double a = test_uniform(0, 6.28318);
        f[2 * i] = (float)cos(a), f[2 * i + 1] = (float)sin(a);
    }
    for (int j = 0; j < 2; j++) {
        for (int64_t i = 0; i < n * k; i++) w[j][i] = (int8_t)test_randint(-127, 127);
        for (int64_t i = 0; i < n * k / g; i++) s[j][i] = (float)test_uniform(0.001, 0.02);
    }
    /* x' and each product's sums and sums of |terms|, in double */
    double *xp = malloc(sizeof(double) * (size_t)k), *sum[2], *mag[2], ss = 0.0;
    for (int64_t c = 0; c < k; c++) ss += (double)x[c] * x[c];
    for (int64_t c = 0; c < k; c++)
        xp[c] = norm ? (double)x[c] / sqrt(ss / (double)k + 1e-5) * nw[c] : x[c];
    for (int j = 0; j < 2; j++) {
        sum[j] = calloc((size_t)n, sizeof(double)), mag[j] = calloc((size_t)n, sizeof(double));
        for (int64_t row = 0; row < n && (j == 0 || tail == TC_TWO); row++)
            for (int64_t c = 0; c < k; c++) {
                double t = xp[c] * w[j][row * k + c] * s[j][row * (k / g) + c / g];
                sum[j][row] += t, mag[j][row] += fabs(t);
            }
    }
    /* the result and its error bound, column by column */
    double *want = malloc(sizeof(double) * (size_t)n), *bound = malloc(sizeof(double) * (size_t)n);
    for (int64_t j = 0; j < n; j++) {
        double a = sum[0][j], m = mag[0][j];
        if (tail == TC_RESIDUAL) want[j] = a + r[j], bound[j] = 1e-6 * m + 1e-6 * fabs(r[j]);
        else if (tail == TC_ROPE || tail == TC_ROW) {
            int64_t e = j & ~1LL;
            double re = sum[0][e], im = sum[0][e + 1], c = f[e], sn = f[e + 1];
            want[j] = j & 1 ? re * sn + im * c : re * c - im * sn;
            bound[j] = 1e-6 * (mag[0][e] + mag[0][e + 1]) + 1e-6 * (fabs(re) + fabs(im));
        } else if (tail == TC_TWO) {
            double b3 = sum[1][j], sg = 1.0 / (1.0 + exp(-a));
            want[j] = a * sg * b3;
            bound[j] = 1e-6 * (1.2 * fabs(b3) * m + fabs(a * sg) * mag[1][j]);
        } else want[j] = a, bound[j] = 1e-6 * m;
    }
    mk_named_tensor in[] = {{"x", x},         {"nw", nw},       {"r", r},   {"f", f},
                            {"pos", &pos},    {"pos1", &pos1},  {"w0", w[0]}, {"s0", s[0]},
                            {"w1", w[1]},     {"s1", s[1]}};
    int n_weights = tail == TC_TWO ? 4 : 2;
    size_t out_bytes = tail == TC_ARGMAX ? sizeof(int64_t) : sizeof(float) * out_n;
    const char *names[] = {"plain", "residual", "rope", "row write", "ArgMax", "two products"};
    const char *what = names[tail];
    for (int plain = 0; plain < 2; plain++) {
        if (plain) setenv("MK_CUDA_NO_MMA", "1", 1);
        mk_error *err = NULL;
        mk_compile_options o = {.device = MK_DEVICE_CUDA};
        mk_model *mod = mk_compile(ctx, text, constant ? in + 6 : NULL,
                                   constant ? (size_t)n_weights : 0, &o, &err);
        unsetenv("MK_CUDA_NO_MMA");
        CHECK(mod != NULL, "%s: %s", what, mk_error_message(err));
        mk_error_free(err), err = NULL;
        if (!mod) break;
        mk_stats st;
        mk_model_stats(mod, &st);
        int8_form taken = FORM_PAIR;
        for (int i = 0; i < st.launches; i++) {
            char *src = mk_model_kernel_source(mod, i, NULL);
            if (src && strstr(src, "int8 on the tensor cores")) taken = FORM_TC;
            if (src && strstr(src, "4 columns a warp")) taken = FORM_QUAD;
            if (src && strstr(src, "k in 3 slices")) taken = FORM_QUAD3;
            mk_string_free(src);
        }
        const char *forms[] = {"a pair a warp", "4 columns a warp", "4 columns a warp in 3 slices",
                               "the tensor cores"};
        CHECK(taken == form, "%s: %s taken, want %s\n%s", what, forms[taken], forms[form],
              mk_model_fusion_report(mod));
        int n_in = 6 + (constant ? 0 : n_weights);
        if (tail == TC_ROW) { /* bad bounds first: clear errors, and nothing lost */
            int64_t good[2] = {pos, pos1}, bad[2][2] = {{0, 2}, {4, 5}};
            const char *want_err[2] = {"script:18:1: evaluation error: ReplaceSliceNode", "out of range"};
            for (int b = 0; b < 2; b++) {
                pos = bad[b][0], pos1 = bad[b][1];
                int rc = mk_evaluate(mod, in, n_in, y[plain], out_bytes, &err);
                CHECK(rc != 0 && strstr(mk_error_message(err), want_err[b]), "rows [%lld, %lld): %s",
                      (long long)pos, (long long)pos1, rc ? mk_error_message(err) : "no error");
                mk_error_free(err), err = NULL;
            }
            pos = good[0], pos1 = good[1];
        }
        CHECK(mk_evaluate(mod, in, n_in, y[plain], out_bytes, &err) == 0, "%s: %s", what,
              mk_error_message(err));
        mk_error_free(err);
        mk_model_free(mod);
    }
    CHECK(!memcmp(y[0], y[1], out_bytes), "%s: the shuffles' sums differ from the MMA's", what);
    float *got = tail == TC_ROW ? y[0] + pos * n : y[0];
    if (tail == TC_ARGMAX) {
        int64_t i = *(int64_t *)y[0], best = 0;
        for (int64_t j = 1; j < n; j++) best = want[j] > want[best] ? j : best;
        CHECK(i >= 0 && i < n && want[i] >= want[best] - bound[i] - bound[best],
              "ArgMax %lld (%g), want %lld (%g)", (long long)i, i >= 0 && i < n ? want[i] : 0.0,
              (long long)best, want[best]);
    } else {
        for (int64_t j = 0; j < n; j++) {
            bool ok = nan ? isnan(got[j]) : fabs((double)got[j] - want[j]) <= bound[j] + 1e-30;
            if (!ok) {
                CHECK(0, "%s, k %lld, n %lld, g %lld%s: column %lld: %.9g, want %.9g (bound %g)",
                      what, (long long)k, (long long)n, (long long)g, norm ? ", RmsNorm" : "",
                      (long long)j, (double)got[j], want[j], bound[j]);
                break;
            }
        }
    }
    free(x), free(nw), free(r), free(f), free(xp), free(want), free(bound);
    for (int j = 0; j < 2; j++) free(w[j]), free(s[j]), free(y[j]), free(sum[j]), free(mag[j]);
}

/* 128 times a number in [lo, hi] that is not a multiple of 4: k for the tensor-core form */
static int64_t tc_k(int64_t lo, int64_t hi) {
    int64_t q = test_randint(lo, hi - 1);
    return 128 * (q % 4 ? q : q + 1);
}

static void test_int8_forms_cuda(void) {
    int8_case(1152, 8192, 64, false, TC_PLAIN, false, false, FORM_TC);
    int8_case(tc_k(8, 24), 16 * test_randint(512, 1024), 64 * test_randint(1, 2), true, TC_RESIDUAL,
              false, true, FORM_TC);
    int8_case(1152, 8192, 128, true, TC_ROPE, false, false, FORM_TC);
    int8_case(1152, 8192, 64, false, TC_ROW, false, true, FORM_TC);
    int8_case(2176, 8192, 64, true, TC_ARGMAX, false, true, FORM_TC);
    int8_case(1152, 8192, 64, true, TC_TWO, false, false, FORM_PAIR);
    int8_case(1152, 8192, 64, false, TC_PLAIN, true, false, FORM_TC);
    /* k past 4,096 (up to the most A staged holds): the digit copy takes a
     * warp's 64s in more than one batch */
    int8_case(tc_k(33, 88), 8192, 64, true, TC_PLAIN, false, true, FORM_TC);
    /* k a multiple of 512: 4 columns a warp however many (Llama-2-7B's
     * q / k / v and classifier, k = 4,096) */
    int8_case(4096, 12288, 64, true, TC_PLAIN, false, true, FORM_QUAD);
    int8_case(4096, 32000, 64, true, TC_ARGMAX, false, true, FORM_QUAD);
    /* 3,072 to 6,143 columns: 4 a warp, k in 3 slices (Llama-2-7B's wo
     * and w2, k = 4,096 and 11,008), k up to 11,008, and 4 a warp in 4
     * slices at 2,048 columns; a pair where the columns are not multiples
     * of 4 */
    int8_case(2048, 4096, 64, false, TC_PLAIN, false, true, FORM_QUAD3);
    int8_case(11008, 4096, 64, false, TC_RESIDUAL, false, true, FORM_QUAD3);
    int64_t n = 4 * test_randint(1024, 2000);
    int8_case(64 * test_randint(32, 172), n, 64, false, TC_RESIDUAL, false, test_randint(0, 1),
              n < 6144 ? FORM_QUAD3 : FORM_QUAD);
    int8_case(2048, 4096, 128, true, TC_ROPE, false, false, FORM_QUAD3);
    int8_case(2048, 4096, 64, false, TC_ROW, false, true, FORM_QUAD3);
    int8_case(4096, 4092, 64, true, TC_ARGMAX, false, true, FORM_QUAD3);
    int8_case(4096, 2048, 64, true, TC_RESIDUAL, false, true, FORM_QUAD);
    /* stories15M's int8 classifier: k = 288 (no tensor cores; 18 of a
     * warp's 32 lanes have a step), groups of 32 */
    int8_case(288, 32000, 32, true, TC_ARGMAX, false, true, FORM_QUAD);
    int8_case(2048, 4096, 64, false, TC_PLAIN, true, true, FORM_QUAD3);
    int8_case(2048, 4098, 64, false, TC_RESIDUAL, false, true, FORM_PAIR);
}

/* ---- int8 activations: FakeQuantizeNode, W8A8 products ------------------------------ */

/* runq.c's quantize(), written out: s = max |x| / 127 in float32, q = x / s
 * rounded half away from zero (0 where s is 0 or x is NaN, within +-127). */
static float ref_q8(const float *x, int n, int8_t *q) {
    float m = 0.0f;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > m) m = fabsf(x[i]);
    float s = m / 127.0f;
    for (int i = 0; i < n; i++) {
        float r = s > 0.0f ? x[i] / s : 0.0f;
        double a = floor(fabs((double)r) + 0.5); /* halves away from zero */
        double v = isnan(r) ? 0.0 : fmin(a, 127.0);
        q[i] = (int8_t)(r < 0 ? -v : v);
    }
    return s;
}

/* x [R, 64] read permuted from [64, R], groups of 16 along the last axis:
 * halves (x / s = k + 1/2 exactly), a group of zeros, a NaN, -max. */
static void fake_quantize_on(mk_device dev) {
    enum { R = 6, K = 64, G = 16 };
    const char *text = "$1 = InputTensor(x, float32, [64, 6]);\n$2 = PermuteNode($1, [1, 0]);\n"
                       "$3 = FakeQuantizeNode($2, 16);\nresult = $3;\n";
    mk_error *err = NULL;
    mk_model *m = compile(text, dev, true, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    mk_error_free(err);
    if (!m) return;
    float xt[K * R], x[R * K], out[R * K], want[R * K];
    for (int i = 0; i < R * K; i++) x[i] = (float)test_uniform(-3, 3);
    for (int i = 0; i < G; i++) x[i] = 0.0f;        /* row 0, group 0: zeros */
    x[G] = 15.875f;                                  /* group 1: s = 0.125 exactly */
    for (int i = 1; i < G; i++) x[G + i] = (float)((2 * test_randint(-60, 60) + 1) * 0.0625);
    x[2 * G + 3] = NAN;                              /* group 2: NaN counts as 0 */
    x[K + 5] = -7.5f;                                /* row 1, group 0: -max */
    for (int i = 0; i < R; i++)
        for (int j = 0; j < K; j++) xt[j * R + i] = x[i * K + j];
    for (int g = 0; g < R * K / G; g++) {
        int8_t q[G];
        float s = ref_q8(x + g * G, G, q);
        for (int i = 0; i < G; i++) want[g * G + i] = (float)((double)q[i] * s);
    }
    mk_named_tensor in[] = {{"x", xt}};
    err = NULL;
    CHECK(mk_evaluate(m, in, 1, out, sizeof out, &err) == 0, "%s", mk_error_message(err));
    for (int i = 0; i < R * K; i++)
        if (out[i] != want[i]) {
            CHECK(0, "element %d (x %g): %g, want %g", i, (double)x[i], (double)out[i],
                  (double)want[i]);
            break;
        }
    CHECK(out[G + 1] == (float)(x[G + 1] < 0 ? -0.125 : 0.125) * ceilf(fabsf(x[G + 1]) / 0.125f),
          "a half rounds away from zero: %g from %g", (double)out[G + 1], (double)x[G + 1]);
    CHECK(out[K + 5] == -7.5f && out[2 * G + 3] == 0.0f, "-max %g, NaN %g", (double)out[K + 5],
          (double)out[2 * G + 3]);
    mk_error_free(err);
    mk_model_free(m);
}
static void test_fake_quantize_cpu(void) { fake_quantize_on(MK_DEVICE_CPU); }
static void test_fake_quantize_cuda(void) { fake_quantize_on(MK_DEVICE_CUDA); }

/*
 * FakeQuantize(x, G) @ (W int8 in blocks of G along k)^T, x [m, k], W [n, k]:
 * the group takes A on the int8 grid: on the CPU it equals runq.c's matmul bit
 * for bit (an int32 dot product per group, val += (float)dot * ws * xs in
 * group order), on CUDA within rounding (the lanes' sums meet in another
 * order); the nodes alone (the float32 product of the rounded values) within
 * rounding too. The group again with W and its scales as constants, whose
 * first steps a CUDA kernel loads before its wait: the same. With an RmsNorm
 * before, the CPU's group equals the same graph fed the norm's output; CUDA's
 * within rounding.
 */
static void w8a8_on(mk_device dev, int64_t m, int64_t k, int64_t n, int64_t G) {
    char text[1536], ctext[1536], plain[1536];
    const char *body =
        "$4 = %s(w, int8, [%lld, %lld]);\n$5 = PermuteNode($4, [1, 0]);\n"
        "$6 = %s(s, float32, [%lld, %lld]);\n$7 = PermuteNode($6, [1, 0]);\n"
        "$8 = DequantizeNode($5, $7);\n$9 = MatMulNode($3, $8);\nresult = $9;\n";
    int at = snprintf(text, sizeof text,
                      "$1 = InputTensor(x, float32, [%lld, %lld]);\n$2 = InputTensor(nw, float32, [%lld]);\n"
                      "$3 = FakeQuantizeNode($1, %lld);\n",
                      (long long)m, (long long)k, (long long)k, (long long)G);
    memcpy(ctext, text, (size_t)at);
    snprintf(text + at, sizeof text - (size_t)at, body, "InputTensor", (long long)n, (long long)k,
             "InputTensor", (long long)n, (long long)(k / G));
    snprintf(ctext + at, sizeof ctext - (size_t)at, body, "ConstantTensor", (long long)n, (long long)k,
             "ConstantTensor", (long long)n, (long long)(k / G));
    float *x = malloc(sizeof(float) * (size_t)(m * k)), *nw = malloc(sizeof(float) * (size_t)k);
    float *s = malloc(sizeof(float) * (size_t)(n * k / G)), *y[3], *want = malloc(sizeof(float) * (size_t)(m * n));
    int8_t *w = malloc((size_t)(n * k)), *xq = malloc((size_t)k);
    float *xs = malloc(sizeof(float) * (size_t)(k / G));
    for (int f = 0; f < 3; f++) y[f] = malloc(sizeof(float) * (size_t)(m * n));
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)test_uniform(-2, 2);
    for (int64_t i = 0; i < k; i++) nw[i] = (float)test_uniform(0.5, 1.5);
    for (int64_t i = 0; i < n * k; i++) w[i] = (int8_t)test_randint(-128, 127);
    for (int64_t i = 0; i < n * k / G; i++) s[i] = (float)test_uniform(0.001, 0.02);
    for (int64_t i = 0; i < m; i++) {
        for (int64_t g = 0; g < k / G; g++) xs[g] = ref_q8(x + i * k + g * G, (int)G, xq + g * G);
        for (int64_t j = 0; j < n; j++) {
            float val = 0.0f;
            for (int64_t g = 0; g < k / G; g++) {
                int32_t dot = 0;
                for (int64_t c = g * G; c < (g + 1) * G; c++) dot += (int32_t)xq[c] * w[j * k + c];
                float t = (float)dot * s[j * (k / G) + g];
                val = val + t * xs[g];
            }
            want[i * n + j] = val;
        }
    }
    mk_named_tensor in[] = {{"x", x}, {"nw", nw}, {"w", w}, {"s", s}};
    /* 0: the nodes; 1: the group; 2: the group with constant weights, which
     * the kernel loads before its wait */
    for (int fuse = 0; fuse < 3; fuse++) {
        mk_error *err = NULL;
        bool constant = fuse == 2;
        mk_compile_options o = {.device = dev, .no_fusion = !fuse};
        mk_model *mod = mk_compile(ctx, constant ? ctext : text, constant ? in + 2 : NULL, constant ? 2 : 0,
                                   &o, &err);
        CHECK(mod != NULL, "%s", mk_error_message(err));
        mk_error_free(err);
        err = NULL;
        if (!mod) continue;
        const char *report = mk_model_fusion_report(mod);
        bool grid = strstr(report, "A on the int8 grid in groups of") != NULL;
        CHECK(grid == (fuse >= 1 && 512 % G == 0), "fuse %d: %s", fuse, report);
        CHECK(mk_evaluate(mod, in, constant ? 2 : 4, y[fuse], sizeof(float) * (size_t)(m * n), &err) == 0,
              "%s", mk_error_message(err));
        mk_error_free(err);
        mk_model_free(mod);
        for (int64_t e = 0; e < m * n; e++) {
            bool ok = grid && dev == MK_DEVICE_CPU ? y[fuse][e] == want[e]
                                                   : test_close(y[fuse][e], want[e], 1e-4, 1e-4);
            if (!ok) {
                CHECK(0, "[%lld, %lld, %lld] / %lld, fuse %d, element %lld: %.9g, want %.9g",
                      (long long)m, (long long)k, (long long)n, (long long)G, fuse, (long long)e,
                      (double)y[fuse][e], (double)want[e]);
                break;
            }
        }
    }
    /* the RmsNorm folded in too: equal to the graph above fed the norm's output */
    at = snprintf(plain, sizeof plain,
                  "$1 = InputTensor(x, float32, [%lld, %lld]);\n$2 = InputTensor(nw, float32, [%lld]);\n"
                  "$3 = RmsNormNode($1, $2);\nresult = $3;\n",
                  (long long)m, (long long)k, (long long)k);
    mk_error *err = NULL;
    mk_model *norm = compile(plain, dev, true, &err);
    char normed[1536];
    at = snprintf(normed, sizeof normed,
                  "$1 = InputTensor(x, float32, [%lld, %lld]);\n$2 = InputTensor(nw, float32, [%lld]);\n"
                  "$10 = RmsNormNode($1, $2);\n$3 = FakeQuantizeNode($10, %lld);\n",
                  (long long)m, (long long)k, (long long)k, (long long)G);
    snprintf(normed + at, sizeof normed - (size_t)at, body, "InputTensor", (long long)n, (long long)k,
             "InputTensor", (long long)n, (long long)(k / G));
    mk_model *both = norm ? compile(normed, dev, true, &err) : NULL;
    mk_model *after = both ? compile(text, dev, true, &err) : NULL;
    CHECK(after != NULL, "%s", mk_error_message(err));
    if (after) {
        float *xn = malloc(sizeof(float) * (size_t)(m * k));
        mk_named_tensor in2[] = {{"x", xn}, {"nw", nw}, {"w", w}, {"s", s}};
        CHECK(mk_evaluate(norm, in, 2, xn, sizeof(float) * (size_t)(m * k), &err) == 0 &&
                  mk_evaluate(after, in2, 4, y[0], sizeof(float) * (size_t)(m * n), &err) == 0 &&
                  mk_evaluate(both, in, 4, y[1], sizeof(float) * (size_t)(m * n), &err) == 0,
              "%s", mk_error_message(err));
        const char *report = mk_model_fusion_report(both);
        bool folds = 512 % G == 0; /* else both stay nodes, as above */
        CHECK(!folds || (strstr(report, "RmsNorm folded in") && strstr(report, "A on the int8 grid")),
              "%s", report);
        for (int64_t e = 0; e < m * n; e++) {
            /* CUDA rounds x * w on the grid of its own scale, the norm's 1 / rms
             * applied after: a value may land one step over (0.02 here) */
            bool ok = dev == MK_DEVICE_CPU ? y[0][e] == y[1][e]
                                           : test_close(y[1][e], y[0][e], 0.1, 1e-3);
            if (!ok) {
                CHECK(0, "element %lld: the group with its RmsNorm gives %.9g, the norm then the "
                         "group %.9g", (long long)e, (double)y[1][e], (double)y[0][e]);
                break;
            }
        }
        free(xn);
    }
    mk_model_free(norm), mk_model_free(both), mk_model_free(after);
    mk_error_free(err);
    free(x), free(nw), free(s), free(want), free(w), free(xq), free(xs), free(y[0]), free(y[1]), free(y[2]);
}

static void w8a8s_on(mk_device dev) {
    w8a8_on(dev, 1, 64 * test_randint(1, 6), 2 * test_randint(1, 70), 64);
    w8a8_on(dev, test_randint(2, 4), 32 * test_randint(1, 9), 2 * test_randint(1, 70), 32);
    w8a8_on(dev, 1, 16 * test_randint(1, 9), 6, 16); /* not a multiple of 32: the scalar loop */
    /* groups that do not divide 512 stay nodes (CUDA's lanes share a group's
     * maximum by butterfly shuffles): the float product of the rounded values */
    w8a8_on(dev, test_randint(1, 4), 48 * test_randint(1, 5), 6, 48);
}
static void test_w8a8_cpu(void) { w8a8s_on(MK_DEVICE_CPU); }
static void test_w8a8_cuda(void) { w8a8s_on(MK_DEVICE_CUDA); }

int main(void) {
    setenv("MK_CPU_FORK", "always", 0); /* small graphs, but the threaded paths */
    test_srand(test_seed());
    if (!(ctx = test_context())) return 1;
    RUN(test_products_cpu);
    RUN(test_tall_bf16_cpu);
    RUN(test_fake_quantize_cpu);
    RUN(test_w8a8_cpu);
    char why[256];
    if (mk_cuda_available(why, sizeof why) == 1) {
        RUN(test_products_cuda);
        RUN(test_tall_bf16_cuda);
        RUN(test_fake_quantize_cuda);
        RUN(test_w8a8_cuda);
        RUN(test_int8_forms_cuda);
    } else {
        SKIP(test_products_cuda, why);
        SKIP(test_tall_bf16_cuda, why);
        SKIP(test_fake_quantize_cuda, why);
        SKIP(test_w8a8_cuda, why);
        SKIP(test_int8_forms_cuda, why);
    }
    mk_context_free(ctx);
    return test_summary("lowp_products");
}
