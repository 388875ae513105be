/*
 * vec.h — the CPU device's vector helpers, static inline so that every file
 * gets them inlined: eight floats as one vector (load8, the dot products
 * dot8 and dot, exp8), weights widened eight at a time (wload8), and the
 * int8 grid of runq.c (q8_scale, q8_value, dot_q8). Each fixes the order of
 * its sums, so every caller rounds the same way.
 */
#ifndef MK_CPU_VEC_H
#define MK_CPU_VEC_H

#include "device.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <math.h>
#include <string.h>

/* Eight floats as one vector (GCC's vector extensions). Built without AVX
 * (ARCH=, the portable build), GCC warns that returning one changes the ABI:
 * the functions that do are static and inlined, so no call crosses one. */
typedef float cpu_v8 __attribute__((vector_size(32)));
#pragma GCC diagnostic ignored "-Wpsabi"

static inline cpu_v8 load8(const float *p) {
    cpu_v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 16 lanes x (two vectors) added pairwise, then the tail t. */
static inline float lanes_total(cpu_v8 x0, cpu_v8 x1, float t) {
    cpu_v8 x = x0 + x1;
    float s = ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]));
    return s + t;
}

/*
 * The dot products of x [k] with eight columns y + j * ldy, j < 8, each dense:
 * per column 8 lanes (lane l takes i = l, l + 8, ...), the lanes added
 * pairwise ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)), then the k % 8 left
 * over in order. Attention's dot products are short (a head: 8 to 128
 * values), so the eight columns' lanes are added together, as a transpose
 * (three rounds of shuffles and adds), not eight sums of their own. dot() is
 * one column the same way.
 */
static inline cpu_v8 dot8(const float *x, const float *y, int64_t ldy, int64_t k) {
    cpu_v8 s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        cpu_v8 xv = load8(x + i);
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++)
            s[j] += xv * load8(y + j * ldy + i);
    }
    cpu_v8 h[4], q[2];
    for (int j = 0; j < 4; j++) /* [s0 + s1 of columns 2j, 2j + 1 interleaved, ...] */
        h[j] = __builtin_shufflevector(s[2 * j], s[2 * j + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               __builtin_shufflevector(s[2 * j], s[2 * j + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int j = 0; j < 2; j++)
        q[j] = __builtin_shufflevector(h[2 * j], h[2 * j + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(h[2 * j], h[2 * j + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    cpu_v8 t = __builtin_shufflevector(q[0], q[1], 0, 1, 2, 3, 8, 9, 10, 11) +
               __builtin_shufflevector(q[0], q[1], 4, 5, 6, 7, 12, 13, 14, 15);
    for (; i < k; i++)
        for (int j = 0; j < 8; j++)
            t[j] += x[i] * y[j * ldy + i];
    return t;
}

static inline float dot(const float *x, const float *y, int64_t k) {
    cpu_v8 s = {0};
    int64_t i = 0;
    for (; i + 8 <= k; i += 8)
        s += load8(x + i) * load8(y + i);
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < k; i++)
        t += x[i] * y[i];
    return t;
}

typedef uint16_t cpu_u16x8 __attribute__((vector_size(16)));
typedef uint32_t cpu_u32x8 __attribute__((vector_size(32)));
typedef int8_t cpu_i8x8 __attribute__((vector_size(8)));
typedef int32_t cpu_i32x8 __attribute__((vector_size(32)));
#ifdef __FLT16_MAX__
typedef _Float16 cpu_h8 __attribute__((vector_size(16)));
#endif

/* Eight weights from element kk of a column at p, widened. */
static inline __attribute__((always_inline)) cpu_v8 wload8(const void *p, int64_t kk, mk_dtype d) {
    switch (d) {
    case MK_DTYPE_BFLOAT16: {
        cpu_u16x8 h;
        memcpy(&h, (const uint16_t *)p + kk, sizeof h);
        return (cpu_v8)(__builtin_convertvector(h, cpu_u32x8) << 16);
    }
    case MK_DTYPE_FLOAT16: {
#ifdef __FLT16_MAX__
        cpu_h8 h;
        memcpy(&h, (const uint16_t *)p + kk, sizeof h);
        return __builtin_convertvector(h, cpu_v8);
#else
        cpu_v8 v;
        for (int i = 0; i < 8; i++) v[i] = mk_f16_to_f32(((const uint16_t *)p)[kk + i]);
        return v;
#endif
    }
    case MK_DTYPE_INT8: {
#ifdef __AVX2__ /* GCC scalarises the direct conversion of 8 int8 to floats */
        __m128i b = _mm_loadl_epi64((const __m128i *)((const int8_t *)p + kk));
        return (cpu_v8)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
#else
        cpu_i8x8 q;
        memcpy(&q, (const int8_t *)p + kk, sizeof q);
        return __builtin_convertvector(__builtin_convertvector(q, cpu_i32x8), cpu_v8);
#endif
    }
    default: return load8((const float *)p + kk);
    }
}

static inline __attribute__((always_inline)) float wload1(const void *p, int64_t kk, mk_dtype d) {
    switch (d) {
    case MK_DTYPE_BFLOAT16: return mk_bf16_to_f32(((const uint16_t *)p)[kk]);
    case MK_DTYPE_FLOAT16: return mk_f16_to_f32(((const uint16_t *)p)[kk]);
    case MK_DTYPE_INT8: return (float)((const int8_t *)p)[kk];
    default: return ((const float *)p)[kk];
    }
}

/*
 * A's int8 group · a column's (n values), exact. AVX2: |w| times x with w's
 * sign, 32 at a time (maddubs: a pair's sum is at most 2 * 128 * 127, within
 * int16, for every int8 weight, -128 included; x is never -128).
 */
static inline int32_t dot_q8(const int8_t *restrict x, const int8_t *restrict w, int64_t n) {
    int64_t i = 0;
    int32_t t = 0;
#ifdef __AVX2__
    __m256i acc = _mm256_setzero_si256();
    for (; i + 32 <= n; i += 32) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + i));
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w + i));
        __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
    }
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    t = _mm_cvtsi128_si32(h);
#endif
    for (; i < n; i++) t += (int32_t)x[i] * w[i];
    return t;
}

/*
 * e^x for eight floats x <= 0, as a softmax needs them (the row's max already
 * subtracted): x = n ln2 + r with |r| <= ln2 / 2, n rounded to nearest by
 * adding 1.5 * 2^23 (so no float-to-int conversion), e^r by Cephes' expf
 * polynomial, times 2^n built in the exponent's bits. Within 2 ulp of expf;
 * 0 below -87.3 (where expf goes subnormal), -inf included; NaN stays NaN.
 */
static inline cpu_v8 exp8(cpu_v8 x) {
    const cpu_v8 lo = (cpu_v8){0} - 87.33654f, round = (cpu_v8){0} + 12582912.0f; /* 1.5 * 2^23 */
    cpu_i32x8 under = x < lo;
    x = (cpu_v8)(((cpu_i32x8)x & ~under) | ((cpu_i32x8)lo & under));
    cpu_v8 t = x * 1.44269504088896341f + round;
    cpu_v8 n = t - round;
    cpu_i32x8 two_n = ((cpu_i32x8)t - (cpu_i32x8)round + 127) << 23;
    cpu_v8 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    cpu_v8 e = 1.9875691500e-4f * r + 1.3981999507e-3f;
    e = e * r + 8.3334519073e-3f;
    e = e * r + 4.1665795894e-2f;
    e = e * r + 1.6666665459e-1f;
    e = e * r + 5.0000001201e-1f;
    e = (e * r * r + r + 1.0f) * (cpu_v8)two_n;
    return (cpu_v8)((cpu_i32x8)e & ~under);
}

/*
 * runq.c's activations on the int8 grid: a group's scale s = max |x| / 127,
 * each value round(x / s), halves away from zero. Where s is 0 (a group of
 * zeros) or x / s is not a number the value is 0, and it is clamped to
 * +-127 (s of tiny x underflows); runq.c leaves those cases undefined.
 */
static inline float q8_scale(const float *x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (v > m) m = v;
    }
    return m / 127.0f;
}

static inline int8_t q8_value(float x, float s) {
    float v = s != 0.0f ? roundf(x / s) : 0.0f;
    return v != v ? 0 : v > 127.0f ? 127 : v < -127.0f ? -127 : (int8_t)v;
}

#endif
