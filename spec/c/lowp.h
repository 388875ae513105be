/*
 * lowp.h — what lowp_test.c and lowp_products_test.c share: their context,
 * the float16 and bfloat16 references (written here, independently of core/:
 * float16 values decoded with ldexp and every float32 rounded by searching the
 * 65,536 of them; bfloat16 by comparing the two neighbours in double) and
 * compiling a script on a device.
 */
#ifndef MK_SPEC_LOWP_H
#define MK_SPEC_LOWP_H

#include "moonkaas.h"
#include "test.h"

#include <stdbool.h>

static mk_context *ctx;

/* ---- references --------------------------------------------------------- */

static double f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

/* The float16 nearest x, ties to the even pattern; past 65520 infinity. */
static uint16_t f16_nearest(float x) {
    if (isnan(x)) return 0x7e00;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a >= 65520.0) return sign | 0x7c00;
    int lo = 0, hi = 0x7bff; /* finite positive patterns are ordered like their values */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (f16_value((uint16_t)mid) <= a) lo = mid;
        else hi = mid - 1;
    }
    int best = lo;
    if (lo < 0x7bff) {
        double d0 = a - f16_value((uint16_t)lo), d1 = f16_value((uint16_t)(lo + 1)) - a;
        if (d1 < d0 || (d1 == d0 && (lo & 1))) best = lo + 1;
    }
    return sign | (uint16_t)best;
}

static double bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The bfloat16 nearest x: between x's truncation and the next pattern away
 * from zero (past the largest finite value, infinity stands at 2^128). */
static uint16_t bf16_nearest(float x) {
    if (isnan(x)) return 0x7fc0;
    uint32_t u;
    memcpy(&u, &x, 4);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1);
    if (isinf(x)) return lo;
    double vhi = (hi & 0x7fff) == 0x7f80 ? copysign(ldexp(1, 128), x) : bf16_value(hi);
    double d0 = fabs((double)x - bf16_value(lo)), d1 = fabs(vhi - (double)x);
    return d1 < d0 || (d1 == d0 && (lo & 1)) ? hi : lo;
}

static mk_model *compile(const char *text, mk_device dev, bool fuse, mk_error **err) {
    mk_compile_options o = {.device = dev, .no_fusion = !fuse};
    return mk_compile(ctx, text, NULL, 0, &o, err);
}

#endif
