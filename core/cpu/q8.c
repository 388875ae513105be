/*
 * q8.c — the CPU's W8A8 products (llama2 -q q8a8: int8 weights in groups,
 * and A on runq.c's int8 grid in the same groups), with AVX2 kernels chosen
 * at run time:
 *
 *   - mk_cpu_q8_grid: A onto the int8 grid (vec.h's q8_scale and q8_value
 *     rule, which CUDA's staging.cuh follows too);
 *   - mk_cpu_mv_columns_q8: per group an exact int32 dot product, then
 *     val += (float)dot * w_scale * a_scale, group after group (the order
 *     that tells runq.c's text).
 *
 * The AVX2 kernels are compiled for AVX2 and FMA whatever the build's
 * -march; mk_cpu_q8_avx2 says at run time whether the CPU has them
 * (MK_CPU_AVX2=0 turns them off). The portable ones (vec.h) give the same
 * bits: integer sums are exact and the float32 steps are the same. The
 * product takes four columns a pass (each load of A serves four) and sends
 * the weights Q8_AHEAD bytes ahead to the cache. (Float32 A with int8
 * weights stays matmul.c's mv_columns_of: doc/performance.md says what was
 * tried.) Tested against double loops:
 *   make build/tests/q8_test && ./build/tests/q8_test
 */
#include "cpu.h"
#include "vec.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_Q8_X86 1
#define AVX2_FN __attribute__((target("avx2,fma")))
#endif

/* ---- dispatch -------------------------------------------------------------- */

static pthread_once_t q8_once = PTHREAD_ONCE_INIT;
static bool q8_avx2;

static void q8_detect(void) {
#ifdef CPU_Q8_X86
    __builtin_cpu_init();
    const char *env = getenv("MK_CPU_AVX2");
    q8_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
              !(env && !strcmp(env, "0"));
#endif
}

bool mk_cpu_q8_avx2(void) {
    pthread_once(&q8_once, q8_detect);
    return q8_avx2;
}

bool mk_cpu_q8_set_avx2(bool on) {
    pthread_once(&q8_once, q8_detect);
#ifdef CPU_Q8_X86
    if (on && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return false;
    q8_avx2 = on;
    return true;
#else
    return !on;
#endif
}

/* Bytes ahead of a quad's read position sent to the cache: a few quads of
 * the llama2 shapes, far enough to hide the last level cache's latency
 * (doc/performance.md: "CPU: int8 products"). */
#define Q8_AHEAD 4096

/* A quad's columns: pointers to columns j .. j + 3 of w and their scales (a
 * quad short of columns repeats its first, whose values are then dropped). */
static inline int quad(const cpu_weights *w, int64_t j, int64_t j1, const int8_t *b[4],
                       const float *sc[4]) {
    int cols = j1 - j < 4 ? (int)(j1 - j) : 4;
    for (int t = 0; t < 4; t++) {
        int64_t at = j + (t < cols ? t : 0);
        b[t] = (const int8_t *)w->data + at * w->ldb;
        sc[t] = w->scale + at * w->ss_n;
    }
    return cols;
}

/* ---- A on the int8 grid ---------------------------------------------------- */

#ifdef CPU_Q8_X86
/* Eight values of x / s rounded as roundf (halves away from zero: the
 * truncation, plus one away from zero where the part cut off is at least a
 * half, exact below 2^23), NaN to 0, clamped to +-127, s = 0 to 0. */
AVX2_FN static inline __m256i grid8(__m256 x, __m256 s, __m256 s_zero) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v = _mm256_div_ps(x, s);
    __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m256 half = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f),
                                _CMP_GE_OQ);
    __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f)); /* +-1, v's sign */
    __m256 r = _mm256_add_ps(t, _mm256_and_ps(half, one));
    r = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    r = _mm256_andnot_ps(_mm256_or_ps(nan, s_zero), r);
    return _mm256_cvtps_epi32(r);
}

AVX2_FN static void grid_avx2(const float *a, int64_t groups, int64_t g, int8_t *aq, float *as) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t t = 0; t < groups; t++) {
        const float *x = a + t * g;
        __m256 mx = _mm256_setzero_ps();
        for (int64_t e = 0; e < g; e += 8) /* max(|x|, mx): a NaN |x| keeps mx, as q8_scale */
            mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + e)), mx);
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float s = _mm_cvtss_f32(h) / 127.0f;
        as[t] = s;
        __m256 sv = _mm256_set1_ps(s), zero = _mm256_cmp_ps(sv, _mm256_setzero_ps(), _CMP_EQ_OQ);
        for (int64_t e = 0; e < g; e += 32) {
            __m256i q0 = grid8(_mm256_loadu_ps(x + e), sv, zero);
            __m256i q1 = grid8(_mm256_loadu_ps(x + e + 8), sv, zero);
            __m256i q2 = grid8(_mm256_loadu_ps(x + e + 16), sv, zero);
            __m256i q3 = grid8(_mm256_loadu_ps(x + e + 24), sv, zero);
            /* packs interleave the 128-bit halves: put them back in order */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(aq + t * g + e), p);
        }
    }
}
#endif

void mk_cpu_q8_grid(const float *a, int64_t n, int64_t g, int8_t *aq, float *as) {
#ifdef CPU_Q8_X86
    if (g % 32 == 0 && mk_cpu_q8_avx2()) {
        grid_avx2(a, n / g, g, aq, as);
        return;
    }
#endif
    for (int64_t t = 0; t < n / g; t++) {
        as[t] = q8_scale(a + t * g, g);
        for (int64_t e = t * g; e < (t + 1) * g; e++) aq[e] = q8_value(a[e], as[t]);
    }
}

/* ---- W8A8 ------------------------------------------------------------------ */

#ifdef CPU_Q8_X86
/* Per group of g (a multiple of 32): the four columns' exact int32 dot
 * products with A's group (|w| times x with w's sign: maddubs, whose pair sums
 * stay within int16 as x is never -128), reduced together, then each column's
 * val += dot * w_scale * a_scale in float32, as the portable loop rounds it. */
AVX2_FN static void w8a8_avx2(const int8_t *restrict aq, const float *restrict as,
                              const cpu_weights *w, int64_t k, int64_t j0, int64_t j1,
                              float *restrict c) {
    const int64_t g = w->group, groups = k / g;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t j = j0; j < j1; j += 4) {
        const int8_t *b[4];
        const float *sc[4];
        int cols = quad(w, j, j1, b, sc);
        const char *ahead = (const char *)b[0] + Q8_AHEAD;
        __m128 val = _mm_setzero_ps();
        for (int64_t gi = 0; gi < groups; gi++) {
            __m256i acc[4];
            for (int t = 0; t < 4; t++) acc[t] = _mm256_setzero_si256();
            for (int64_t e = gi * g; e < (gi + 1) * g; e += 32) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(aq + e));
                _mm_prefetch(ahead + 4 * e, _MM_HINT_T0);
                _mm_prefetch(ahead + 4 * e + 64, _MM_HINT_T0);
#pragma GCC unroll 4
                for (int t = 0; t < 4; t++) {
                    __m256i wv = _mm256_loadu_si256((const __m256i *)(b[t] + e));
                    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
                    acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, ones));
                }
            }
            __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0], acc[1]),
                                          _mm256_hadd_epi32(acc[2], acc[3]));
            __m128i dots = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            int64_t at = gi * w->ss_k;
            __m128 ws = _mm_setr_ps(sc[0][at], sc[1][at], sc[2][at], sc[3][at]);
            __m128 t = _mm_mul_ps(_mm_mul_ps(_mm_cvtepi32_ps(dots), ws), _mm_set1_ps(as[gi]));
            val = _mm_add_ps(val, t);
        }
        float v[4];
        _mm_storeu_ps(v, val);
        memcpy(c + (j - j0), v, (size_t)cols * sizeof(float));
    }
}
#endif

/*
 * c [j - j0] = A on the int8 grid (values aq, one scale per group in as) ·
 * column j of int8 weights whose scale blocks are A's groups, as runq.c's
 * matmul sums them: per group an exact int32 dot product, then
 * val += (float)dot * w_scale * a_scale, group after group.
 */
void mk_cpu_mv_columns_q8(const int8_t *restrict aq, const float *restrict as,
                          const cpu_weights *w, int64_t k, int64_t j0, int64_t j1,
                          float *restrict c) {
    int64_t g = w->group;
#ifdef CPU_Q8_X86
    if (g % 32 == 0 && mk_cpu_q8_avx2()) {
        w8a8_avx2(aq, as, w, k, j0, j1, c);
        return;
    }
#endif
    for (int64_t j = j0; j < j1; j++) {
        const int8_t *b = (const int8_t *)w->data + j * w->ldb;
        const float *sc = w->scale + j * w->ss_n;
        float val = 0.0f;
        for (int64_t gi = 0; gi < k / g; gi++)
            val += (float)dot_q8(aq + gi * g, b + gi * g, g) * sc[gi * w->ss_k] * as[gi];
        c[j - j0] = val;
    }
}
