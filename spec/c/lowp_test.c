/*
 * lowp_test.c — low-precision storage: CastNode, DequantizeNode, mk_convert
 * and mk_quantize_q8, and bad scripts with low-precision dtypes. Products whose
 * weights or activations are low-precision are in lowp_products_test.c.
 *
 * References are written independently of core/ (lowp.h). Inputs are random
 * with a printed seed. On a machine with a CUDA device the same graphs run
 * there and must equal the CPU's results exactly.
 *
 *   make build/tests/lowp_test && ./build/tests/lowp_test
 */
#include "lowp.h"

static float random_float(void) {
    switch (test_randint(0, 5)) {
    case 0: return (float)test_uniform(-1e-6, 1e-6);       /* float16 subnormals */
    case 1: return (float)test_uniform(-70000, 70000);     /* past float16's range */
    case 2: return (float)ldexp(test_randint(-4096, 4096), (int)test_randint(-30, 10)) + 0.0f;
    default: return (float)test_uniform(-4, 4);
    }
}

/* ---- mk_convert and CastNode ---------------------------------------------- */

static void test_convert_floats(void) {
    enum { N = 4096 };
    static float x[N], back16[N], backb[N];
    static uint16_t h[N], b[N];
    for (int i = 0; i < N; i++) x[i] = random_float();
    /* halfway cases, both ways, and specials */
    x[0] = 1.0f + 0x1p-11f, x[1] = 1.0f + 3 * 0x1p-11f, x[2] = 65504.0f, x[3] = 65519.99f;
    x[4] = 65520.0f, x[5] = 0x1p-25f, x[6] = 3 * 0x1p-25f, x[7] = -0.0f, x[8] = INFINITY;
    x[9] = 1.0f + 0x1p-8f, x[10] = 1.0f + 3 * 0x1p-8f, x[11] = 3.3895314e38f, x[12] = NAN;
    CHECK(mk_convert(h, MK_DTYPE_FLOAT16, x, MK_DTYPE_FLOAT32, N) == 0, "to float16");
    CHECK(mk_convert(b, MK_DTYPE_BFLOAT16, x, MK_DTYPE_FLOAT32, N) == 0, "to bfloat16");
    CHECK(mk_convert(back16, MK_DTYPE_FLOAT32, h, MK_DTYPE_FLOAT16, N) == 0, "from float16");
    CHECK(mk_convert(backb, MK_DTYPE_FLOAT32, b, MK_DTYPE_BFLOAT16, N) == 0, "from bfloat16");
    int bad = 0;
    for (int i = 0; i < N && bad < 5; i++) {
        if (isnan(x[i])) {
            if (!isnan(back16[i]) || !isnan(backb[i])) {
                bad++;
                CHECK(0, "NaN lost at %d", i);
            }
            continue;
        }
        uint16_t wh = f16_nearest(x[i]), wb = bf16_nearest(x[i]);
        if (h[i] != wh || b[i] != wb) {
            bad++;
            CHECK(0, "%.9g: float16 %04x want %04x, bfloat16 %04x want %04x", (double)x[i], h[i],
                  wh, b[i], wb);
        }
        if ((double)back16[i] != f16_value(h[i]) || (double)backb[i] != bf16_value(b[i])) {
            bad++;
            CHECK(0, "widening %04x/%04x: %g %g", h[i], b[i], (double)back16[i], (double)backb[i]);
        }
    }
}

static void test_convert_integers(void) {
    float x[8] = {2.9f, -2.9f, 1e30f, -1e30f, NAN, 127.5f, -128.7f, 0.5f};
    int64_t want64[8] = {2, -2, INT64_MAX, INT64_MIN, 0, 127, -128, 0};
    int8_t want8[8] = {2, -2, 127, -128, 0, 127, -128, 0};
    int64_t i64[8];
    int8_t i8[8];
    CHECK(mk_convert(i64, MK_DTYPE_INT64, x, MK_DTYPE_FLOAT32, 8) == 0, "to int64");
    CHECK(mk_convert(i8, MK_DTYPE_INT8, x, MK_DTYPE_FLOAT32, 8) == 0, "to int8");
    for (int i = 0; i < 8; i++)
        CHECK(i64[i] == want64[i] && i8[i] == want8[i], "%g: %lld %d", (double)x[i],
              (long long)i64[i], i8[i]);
    int64_t big[3] = {1000, -1000, (1LL << 53) + 1};
    int8_t s8[3];
    float f[3];
    mk_convert(s8, MK_DTYPE_INT8, big, MK_DTYPE_INT64, 3);
    mk_convert(f, MK_DTYPE_FLOAT32, big, MK_DTYPE_INT64, 3);
    CHECK(s8[0] == 127 && s8[1] == -128, "int64 to int8 saturates: %d %d", s8[0], s8[1]);
    CHECK(f[2] == 9007199254740992.0f, "int64 to float32 rounds: %.1f", (double)f[2]);
    CHECK(mk_convert(f, (mk_dtype)9, big, MK_DTYPE_INT64, 1) == -1, "a dtype outside the table");
    CHECK(mk_convert(f, MK_DTYPE_FLOAT32, big, MK_DTYPE_INT64, -1) == -1, "n < 0");
}

/* CastNode float32 → dtype → float32 on a permuted input equals mk_convert. */
static void cast_on(mk_device dev) {
    const char *dtypes[] = {"float16", "bfloat16", "int64", "int8"};
    const mk_dtype ids[] = {MK_DTYPE_FLOAT16, MK_DTYPE_BFLOAT16, MK_DTYPE_INT64, MK_DTYPE_INT8};
    for (int t = 0; t < 4; t++) {
        char text[512];
        snprintf(text, sizeof text,
                 "$1 = InputTensor(x, float32, [7, 5]);\n$2 = PermuteNode($1, [1, 0]);\n"
                 "$3 = CastNode($2, %s);\n$4 = CastNode($3, float32);\nresult = $4;\n",
                 dtypes[t]);
        mk_error *err = NULL;
        mk_model *m = compile(text, dev, true, &err);
        CHECK(m != NULL, "%s: %s", dtypes[t], mk_error_message(err));
        mk_error_free(err);
        if (!m) continue;
        float x[35], xt[35], out[35], want[35];
        int64_t mid[35];
        for (int i = 0; i < 35; i++) x[i] = random_float() * (t >= 2 ? 40.0f : 1.0f);
        for (int i = 0; i < 5; i++)
            for (int j = 0; j < 7; j++) xt[i * 7 + j] = x[j * 5 + i];
        mk_convert(mid, ids[t], xt, MK_DTYPE_FLOAT32, 35);
        mk_convert(want, MK_DTYPE_FLOAT32, mid, ids[t], 35);
        mk_named_tensor in[] = {{"x", x}};
        err = NULL;
        CHECK(mk_evaluate(m, in, 1, out, sizeof out, &err) == 0, "%s", mk_error_message(err));
        CHECK(!memcmp(out, want, sizeof out), "%s: differs from mk_convert", dtypes[t]);
        mk_error_free(err);
        mk_model_free(m);
    }
}
static void test_cast_cpu(void) { cast_on(MK_DEVICE_CPU); }
static void test_cast_cuda(void) { cast_on(MK_DEVICE_CUDA); }

/* ---- quantization ----------------------------------------------------------- */

static void test_quantize(void) {
    enum { G = 32, N = 8 * G };
    float x[N], s[N / G];
    int8_t q[N];
    for (int i = 0; i < N; i++) x[i] = (float)test_uniform(-3, 3);
    for (int i = 0; i < G; i++) x[3 * G + i] = 0.0f; /* a group of zeros */
    x[5 * G] = -7.0f;                                /* -max: q -127 */
    CHECK(mk_quantize_q8(x, N, G, q, s) == 0, "quantize");
    for (int g = 0; g < N / G; g++) {
        float wmax = 0.0f;
        for (int i = 0; i < G; i++) wmax = fmaxf(wmax, fabsf(x[g * G + i]));
        float scale = wmax / 127.0f;
        CHECK(s[g] == scale, "group %d: scale %g, want %g", g, (double)s[g], (double)scale);
        for (int i = 0; i < G; i++) {
            float r = scale > 0 ? x[g * G + i] / scale : 0.0f;
            double fl = floor((double)r), want = r - fl > 0.5 ? fl + 1 : r - fl < 0.5 ? fl
                                                 : fmod(fl, 2.0) == 0 ? fl : fl + 1;
            if (q[g * G + i] != (int8_t)want) {
                CHECK(0, "x %g / %g: q %d, want %g", (double)x[g * G + i], (double)scale,
                      q[g * G + i], want);
                break;
            }
        }
    }
    CHECK(q[5 * G] == -127, "-max quantizes to -127, got %d", q[5 * G]);
    CHECK(mk_quantize_q8(x, N, 0, q, s) == -1 && mk_quantize_q8(x, N, 48, q, s) == -1,
          "a group size that is not positive or does not divide n");
}

/* ---- dequantization ------------------------------------------------------------ */

/* q [6, 64] int8 read permuted as [64, 6] with scales [64 / 16, 6 / 3] (permuted too). */
static void dequantize_on(mk_device dev) {
    const char *text =
        "$1 = InputTensor(q, int8, [6, 64]);\n$2 = PermuteNode($1, [1, 0]);\n"
        "$3 = InputTensor(s, float32, [2, 4]);\n$4 = PermuteNode($3, [1, 0]);\n"
        "$5 = DequantizeNode($2, $4);\nresult = $5;\n";
    mk_error *err = NULL;
    mk_model *m = compile(text, dev, true, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    mk_error_free(err);
    if (!m) return;
    int8_t q[384];
    float s[8], out[384];
    for (int i = 0; i < 384; i++) q[i] = (int8_t)test_randint(-128, 127);
    for (int i = 0; i < 8; i++) s[i] = (float)test_uniform(0.01, 2);
    mk_named_tensor in[] = {{"q", q}, {"s", s}};
    err = NULL;
    CHECK(mk_evaluate(m, in, 2, out, sizeof out, &err) == 0, "%s", mk_error_message(err));
    for (int i = 0; i < 64; i++) /* out [i, j] = q [j, i] * s^T [i / 16, j / 3] = s [j / 3, i / 16] */
        for (int j = 0; j < 6; j++) {
            float want = (float)((double)q[j * 64 + i] * s[(j / 3) * 4 + i / 16]);
            if (out[i * 6 + j] != want) {
                CHECK(0, "[%d, %d]: %g, want %g", i, j, (double)out[i * 6 + j], (double)want);
                i = 64;
                break;
            }
        }
    mk_error_free(err);
    mk_model_free(m);
}
static void test_dequantize_cpu(void) { dequantize_on(MK_DEVICE_CPU); }
static void test_dequantize_cuda(void) { dequantize_on(MK_DEVICE_CUDA); }

/* ---- bad input -------------------------------------------------------------------- */

static void test_bad_scripts(void) {
    const struct {
        const char *text, *fragment;
    } cases[] = {
        {"$1 = InputTensor(q, float32, [4, 8]);\n$2 = InputTensor(s, float32, [4, 1]);\n"
         "$3 = DequantizeNode($1, $2);\nresult = $3;",
         "script:3:1: dtype error: DequantizeNode does not take float32"},
        {"$1 = InputTensor(q, int8, [4, 8]);\n$2 = InputTensor(s, float32, [4, 3]);\n"
         "$3 = DequantizeNode($1, $2);\nresult = $3;",
         "script:3:1: shape error: DequantizeNode: scales [4, 3] do not divide [4, 8]"},
        {"$1 = InputTensor(q, int8, [4, 8]);\n$2 = InputTensor(s, float32, [4]);\n"
         "$3 = DequantizeNode($1, $2);\nresult = $3;",
         "do not divide [4, 8] into blocks"},
        {"$1 = InputTensor(x, float32, [2, 96]);\n$2 = FakeQuantizeNode($1, 64);\nresult = $2;",
         "script:2:1: shape error: FakeQuantizeNode: groups of 64 do not divide the last axis of [2, 96]"},
        {"$1 = InputTensor(x, float32, [2, 96]);\n$2 = FakeQuantizeNode($1, 0);\nresult = $2;",
         "groups of 0 do not divide"},
        {"$1 = InputTensor(x, bfloat16, [2, 96]);\n$2 = FakeQuantizeNode($1, 32);\nresult = $2;",
         "script:2:1: dtype error: FakeQuantizeNode does not take bfloat16"},
        {"$1 = InputTensor(x, float32, [4]);\n$2 = CastNode($1, float8);\nresult = $2;",
         "script:2:19: dtype error: unknown dtype 'float8'"},
        {"$1 = InputTensor(x, float32, [4]);\n$2 = CastNode($1);\nresult = $2;", "CastNode"},
        {"$1 = InputTensor(x, bfloat16, [1, 4]);\n$2 = InputTensor(w, bfloat16, [4, 2]);\n"
         "$3 = MatMulNode($1, $2);\nresult = $3;",
         "script:3:1: dtype error: MatMulNode does not take bfloat16"},
        {"$1 = InputTensor(x, float32, [1, 1, 4]);\n$2 = InputTensor(v, bfloat16, [1, 4, 2]);\n"
         "$3 = InputTensor(p, int64, [1]);\n$4 = PrefixMatMulNode($1, $2, $3);\nresult = $4;",
         "script:4:1: dtype error: bfloat16 is not supported by PrefixMatMulNode on cpu"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mk_error *err = NULL;
        mk_model *m = compile(cases[i].text, MK_DEVICE_CPU, true, &err);
        const char *msg = m ? "(compiled)" : mk_error_message(err);
        CHECK(!m && strstr(msg, cases[i].fragment), "case %zu: '%s' lacks '%s'", i, msg,
              cases[i].fragment);
        mk_model_free(m);
        mk_error_free(err);
    }
    /* the context is still fine */
    mk_error *err = NULL;
    mk_model *m = compile("$1 = InputTensor(x, float32, [2]);\n$2 = CastNode($1, bfloat16);\n"
                          "result = $2;", MK_DEVICE_CPU, true, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    char *text = m ? mk_script_format(mk_model_script(m), &err) : NULL;
    CHECK(text && strstr(text, "CastNode($1, bfloat16)"), "%s", text ? text : mk_error_message(err));
    mk_string_free(text);
    mk_model_free(m);
    mk_error_free(err);
}

int main(void) {
    setenv("MK_CPU_FORK", "always", 0); /* small graphs, but the threaded paths */
    test_srand(test_seed());
    if (!(ctx = test_context())) return 1;
    RUN(test_convert_floats);
    RUN(test_convert_integers);
    RUN(test_quantize);
    RUN(test_cast_cpu);
    RUN(test_dequantize_cpu);
    RUN(test_bad_scripts);
    char why[256];
    if (mk_cuda_available(why, sizeof why) == 1) {
        RUN(test_cast_cuda);
        RUN(test_dequantize_cuda);
    } else {
        SKIP(test_cast_cuda, why);
        SKIP(test_dequantize_cuda, why);
    }
    mk_context_free(ctx);
    return test_summary("lowp");
}
