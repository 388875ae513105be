/*
 * table_exprs_test.c — every pointwise row's `expr` in the op table, run on
 * the CPU device against an evaluation of the same C expression written
 * here (a small double-precision interpreter), on random inputs from the
 * printed seed.
 *
 *   make build/tests/table_exprs_test && ./build/tests/table_exprs_test
 */
#include "table.h"

#include <ctype.h>

/*
 * A recursive-descent reading of the C expression in a row's `expr`, in
 * double precision (C's precedence: ?: below < > below + - below * / below
 * unary -). Functions are the float libm ones, computed in double. Enough of
 * C for scalar pointwise bodies; anything else stops with `bad` set.
 */
typedef struct {
    const char *p;
    double a, b, c;
    bool bad;
} xeval;

/* Python's % and // (the language's floormod, floordiv), in double. */
static double x_floormod(double x, double y) {
    double r = fmod(x, y);
    return r != 0 && (r < 0) != (y < 0) ? r + y : r;
}
static double x_floordiv(double x, double y) {
    double m = fmod(x, y), d = (x - m) / y;
    if (m != 0 && (y < 0) != (m < 0)) d -= 1;
    double f = floor(d);
    return d - f > 0.5 ? f + 1 : f;
}
static double x_max(double x, double y) { return x > y ? x : y; }
static double x_min(double x, double y) { return x < y ? x : y; }

static double x_cond(xeval *e);

static void x_skip(xeval *e) {
    while (isspace((unsigned char)*e->p)) e->p++;
}

static bool x_take(xeval *e, const char *tok) {
    x_skip(e);
    size_t n = strlen(tok);
    if (strncmp(e->p, tok, n)) return false;
    e->p += n;
    return true;
}

static double x_primary(xeval *e) {
    x_skip(e);
    if (x_take(e, "(")) {
        double v = x_cond(e);
        if (!x_take(e, ")")) e->bad = true;
        return v;
    }
    if (isdigit((unsigned char)*e->p) || *e->p == '.') {
        char *end;
        double v = strtod(e->p, &end);
        e->p = end;
        if (*e->p == 'f' || *e->p == 'F') e->p++;
        return v;
    }
    const char *start = e->p;
    while (isalnum((unsigned char)*e->p) || *e->p == '_') e->p++;
    size_t n = (size_t)(e->p - start);
    if (n == 1 && *start == 'a') return e->a;
    if (n == 1 && *start == 'b') return e->b;
    if (n == 1 && *start == 'c') return e->c;
    static const struct { const char *name; double (*f)(double); } fns[] = {
        {"expf", exp}, {"tanhf", tanh}, {"sqrtf", sqrt}, {"logf", log}, {"fabsf", fabs},
        {"erff", erf}, {"exp2f", exp2}, {"sinf", sin}, {"cosf", cos}, {"floorf", floor},
        {"ceilf", ceil}, {"rintf", rint}, {"expm1f", expm1}, {"log1pf", log1p}};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (strlen(fns[i].name) == n && !strncmp(start, fns[i].name, n)) {
            if (!x_take(e, "(")) e->bad = true;
            double v = fns[i].f(x_cond(e));
            if (!x_take(e, ")")) e->bad = true;
            return v;
        }
    static const struct { const char *name; double (*f)(double, double); } fns2[] = {
        {"powf", pow}, {"max", x_max}, {"min", x_min}, {"floormod", x_floormod},
        {"floordiv", x_floordiv}};
    for (size_t i = 0; i < sizeof fns2 / sizeof fns2[0]; i++)
        if (strlen(fns2[i].name) == n && !strncmp(start, fns2[i].name, n)) {
            if (!x_take(e, "(")) e->bad = true;
            double x = x_cond(e);
            if (!x_take(e, ",")) e->bad = true;
            double y = x_cond(e);
            if (!x_take(e, ")")) e->bad = true;
            return fns2[i].f(x, y);
        }
    e->bad = true;
    return 0;
}

static double x_unary(xeval *e) {
    if (x_take(e, "-")) return -x_unary(e);
    return x_primary(e);
}

static double x_product(xeval *e) {
    double v = x_unary(e);
    for (;;) {
        if (x_take(e, "*")) v *= x_unary(e);
        else if (x_take(e, "/")) v /= x_unary(e);
        else return v;
    }
}

static double x_sum(xeval *e) {
    double v = x_product(e);
    for (;;) {
        if (x_take(e, "+")) v += x_product(e);
        else if (x_take(e, "-")) v -= x_product(e);
        else return v;
    }
}

static double x_compare(xeval *e) {
    double v = x_sum(e);
    if (x_take(e, ">=")) return v >= x_sum(e);
    if (x_take(e, "<=")) return v <= x_sum(e);
    if (x_take(e, "==")) return v == x_sum(e);
    if (x_take(e, "!=")) return v != x_sum(e);
    if (x_take(e, ">")) return v > x_sum(e);
    if (x_take(e, "<")) return v < x_sum(e);
    return v;
}

static double x_cond(xeval *e) {
    double c = x_compare(e);
    if (!x_take(e, "?")) return c;
    double t = x_cond(e);
    if (!x_take(e, ":")) e->bad = true;
    double f = x_cond(e);
    return c != 0 ? t : f;
}

static double x_eval(const char *expr, double a, double b, double c, bool *bad) {
    xeval e = {expr, a, b, c, false};
    double v = x_cond(&e);
    x_skip(&e);
    *bad = e.bad || *e.p;
    return v;
}

static void test_pointwise_exprs_run(void) {
    for (size_t r = 0; r < mk_op_count(); r++) {
        const mk_op_desc *d = mk_op_info(r);
        if (!d || !d->expr || (d->flags & MK_OP_INTERNAL))
            continue;
        int ops = count_char(d->signature, 'n');
        bool bad = false;
        x_eval(d->expr, 0.5, 0.25, 0.75, &bad);
        CHECK(!bad, "%s: cannot read expr \"%s\"", d->name, d->expr);
        if (bad)
            continue;
        for (int dt = 0; dt < 2; dt++) {
            mk_dtype dtype = dt ? I64 : F32;
            /* int64 where the op takes it */
            mk_tensor_info in[3] = {info(dtype, 1, (int64_t[]){1}), info(dtype, 1, (int64_t[]){1}),
                                    info(dtype, 1, (int64_t[]){1})};
            mk_tensor_info o;
            mk_error *err = NULL;
            bool takes = mk_op_infer(d->name, in, (size_t)ops, NULL, 0, &o, &err) == 0;
            mk_error_free(err), err = NULL;
            if (!takes) {
                /* the rows of bool operands (logic, where) run in spec/cases/pointwise.lua */
                mk_tensor_info bools[3] = {info(MK_DTYPE_BOOL, 1, (int64_t[]){1}), in[1], in[2]};
                bool of_bool = mk_op_infer(d->name, bools, (size_t)ops, NULL, 0, &o, &err) == 0;
                mk_error_free(err), err = NULL;
                for (int k = 1; k < ops; k++) bools[k] = bools[0];
                of_bool = of_bool || mk_op_infer(d->name, bools, (size_t)ops, NULL, 0, &o, &err) == 0;
                mk_error_free(err), err = NULL;
                CHECK(dt == 1 || of_bool, "%s does not take float32", d->name);
                continue;
            }
            bool to_bool = o.dtype == MK_DTYPE_BOOL; /* comparisons */
            enum { N = 257 };
            float fa[N], fb[N], fc[N];
            int64_t ia[N], ib[N], ic[N];
            for (int i = 0; i < N; i++) {
                double s = test_randint(0, 1) ? 1 : -1, t = test_randint(0, 1) ? 1 : -1;
                fa[i] = (float)(s * test_uniform(0.05, 4.0));
                fb[i] = (float)(t * test_uniform(0.25, 4.0));
                fc[i] = (float)test_uniform(0.25, 4.0);
                ia[i] = (int64_t)s * test_randint(1, 1000);
                ib[i] = (int64_t)t * test_randint(1, 1000);
                ic[i] = test_randint(1, 1000);
            }
            char text[512];
            snprintf(text, sizeof text,
                     "$1 = InputTensor(a, %s, [%d]);\n$2 = InputTensor(b, %s, [%d]);\n"
                     "$3 = InputTensor(c, %s, [%d]);\n$4 = %s($1%s%s);\nresult = $4;\n",
                     mk_dtype_name(dtype), N, mk_dtype_name(dtype), N, mk_dtype_name(dtype), N,
                     d->name, ops >= 2 ? ", $2" : "", ops == 3 ? ", $3" : "");
            mk_model *m = mk_compile(ctx, text, NULL, 0, NULL, &err);
            CHECK(m != NULL, "%s: %s", d->name, mk_error_message(err));
            union { float f[N]; int64_t i[N]; unsigned char b[N]; } got;
            mk_named_tensor ins[3] = {{"a", dt ? (void *)ia : (void *)fa},
                                      {"b", dt ? (void *)ib : (void *)fb},
                                      {"c", dt ? (void *)ic : (void *)fc}};
            size_t bytes = (size_t)N * mk_dtype_size(o.dtype);
            if (m && mk_evaluate(m, ins, 3, &got, bytes, &err) == 0) {
                int wrong = 0;
                for (int i = 0; i < N && !wrong; i++) {
                    double av = dt ? (double)ia[i] : fa[i], bv = dt ? (double)ib[i] : fb[i];
                    double cv = dt ? (double)ic[i] : fc[i];
                    double want = x_eval(d->expr, av, bv, cv, &bad);
                    double g = to_bool ? (double)got.b[i] : dt ? (double)got.i[i] : got.f[i];
                    /* int64 and bool: exact; float32: one C expression in float, ~1e-6
                     * (NaN where the double is: pow, log, sqrt of negatives) */
                    bool ok = dt || to_bool ? g == want
                                            : (isnan(g) && isnan(want)) || test_close(g, want, 1e-5, 1e-5);
                    CHECK(ok, "%s %s (\"%s\") at a = %.9g, b = %.9g: got %.9g want %.9g", d->name,
                          mk_dtype_name(dtype), d->expr, av, bv, g, want);
                    wrong = !ok;
                }
                printf("#   %-22s %-7s \"%s\"\n", d->name, mk_dtype_name(dtype), d->expr);
            } else if (m) {
                CHECK(0, "%s: evaluate: %s", d->name, mk_error_message(err));
            }
            mk_model_free(m);
            mk_error_free(err);
        }
    }
}

int main(void) {
    test_srand(test_seed());
    if (!(ctx = test_context())) return 1;
    RUN(test_pointwise_exprs_run);
    mk_context_free(ctx);
    return test_summary("table_exprs");
}
