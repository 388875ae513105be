/*
 * sample.c — run.c's sampler over one row of logits, on the CPU, operation
 * for operation in float32 so that the same logits and seed pick run.c's token
 * (llama2.c's run.c, built without -ffast-math):
 *
 *   generator  xorshift64*: s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
 *              u32 = (s * 0x2545F4914F6CDD1D) >> 32; coin = (u32 >> 8) / 2^24
 *   t <= 0     the argmax (the first index of the largest); the state unchanged
 *   t > 0      p = softmax(logits / t): max subtracted, expf, a sequential sum,
 *              a division; one coin; then
 *     0 < topp < 1   top-p: the candidates p >= (1 - topp) / (n - 1), ordered by
 *                    p descending then index (run.c's qsort is glibc's stable
 *                    merge sort), cut where the running float sum first exceeds
 *                    topp; r = coin * that sum; the first candidate whose running
 *                    sum exceeds r (the last on rounding shortfall)
 *     otherwise      the first index whose running sum exceeds coin (n - 1 on
 *                    shortfall)
 *
 * run.c reads before its candidate array when no probability reaches the
 * cutoff (possible only for tiny n and topp < 1/2); here every index is a
 * candidate then. A NaN anywhere still picks an index in [0, n).
 *
 * Only the candidates that can precede the cut are sorted: the exact sum of
 * the probabilities per binary exponent says which exponents the cut cannot
 * reach, and sorting each exponent class on its own gives the same order as
 * sorting them all (a larger exponent is a larger probability).
 */
#include "device.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint32_t random_u32(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545F4914F6CDD1Dull) >> 32);
}

static float random_f32(uint64_t *s) {
    return (float)(random_u32(s) >> 8) / 16777216.0f;
}

static uint32_t float_bits(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

int64_t mk_argmax_row(const float *x, int64_t n) {
    int64_t best = 0;
    float max = x[0];
    for (int64_t j = 1; j < n; j++)
        if (x[j] > max) {
            max = x[j];
            best = j;
        }
    return best;
}

/* p = softmax(x / t) as run.c: each step rounded to float32, the sum in order. */
static void softmax(const float *x, float *p, int64_t n, float t) {
    for (int64_t j = 0; j < n; j++) p[j] = x[j] / t;
    float max = p[0];
    for (int64_t j = 1; j < n; j++)
        if (p[j] > max) max = p[j];
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        p[j] = expf(p[j] - max);
        sum += p[j];
    }
    for (int64_t j = 0; j < n; j++) p[j] /= sum;
}

/* A candidate's key: ascending keys are descending probabilities (the bits of
 * a non-negative float order as the value), then ascending indices. */
static uint64_t key_of(float p, int64_t i) {
    return (uint64_t)(0x7FFFFFFFu - (float_bits(p) & 0x7FFFFFFFu)) << 32 | (uint64_t)i;
}
static int64_t key_index(uint64_t k) { return (int64_t)(k & 0xFFFFFFFFu); }
static unsigned key_exponent(uint64_t k) {
    return (0x7FFFFFFFu - (uint32_t)(k >> 32)) >> 23;
}

static int compare_keys(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Moves the keys whose exponent is at least e to the front; returns their count. */
static int64_t partition(uint64_t *keys, int64_t n, unsigned e) {
    int64_t m = 0;
    for (int64_t j = 0; j < n; j++)
        if (key_exponent(keys[j]) >= e) {
            uint64_t k = keys[m];
            keys[m++] = keys[j];
            keys[j] = k;
        }
    return m;
}

static int64_t sample_topp(const float *p, int64_t n, float topp, float coin, uint64_t *keys) {
    const float cutoff = (1.0f - topp) / (float)(n - 1);
    int64_t n0 = 0;
    for (int64_t i = 0; i < n; i++)
        if (p[i] >= cutoff) keys[n0++] = key_of(p[i], i);
    if (n0 == 0)
        for (int64_t i = 0; i < n; i++) keys[n0++] = key_of(p[i], i);

    /* The highest exponent whose candidates and those above it pass topp by a
     * margin: the cut falls among them unless float rounding says otherwise. */
    double by_exponent[256] = {0}, total = 0.0;
    for (int64_t j = 0; j < n0; j++) by_exponent[key_exponent(keys[j])] += p[key_index(keys[j])];
    unsigned bound = 0;
    for (int e = 255; e >= 0; e--) {
        total += by_exponent[e];
        if (total > (double)topp + 1e-3) {
            bound = (unsigned)e;
            break;
        }
    }
    int64_t sorted = partition(keys, n0, bound), last = n0 - 1;
    qsort(keys, (size_t)sorted, sizeof *keys, compare_keys);
    float cumulative = 0.0f;
    for (int64_t j = 0; j < n0; j++) {
        if (j == sorted) { /* rounding kept the sum under topp: sort the rest too */
            qsort(keys + sorted, (size_t)(n0 - sorted), sizeof *keys, compare_keys);
            sorted = n0;
        }
        cumulative += p[key_index(keys[j])];
        if (cumulative > topp) {
            last = j;
            break;
        }
    }

    float r = coin * cumulative, cdf = 0.0f;
    for (int64_t j = 0; j <= last; j++) {
        cdf += p[key_index(keys[j])];
        if (r < cdf) return key_index(keys[j]);
    }
    return key_index(keys[last]);
}

int64_t mk_sample_row(const float *logits, int64_t n, uint64_t *state, float temperature,
                      float topp, float *probs, uint64_t *keys) {
    if (!(temperature > 0.0f)) return mk_argmax_row(logits, n);
    softmax(logits, probs, n, temperature);
    float coin = random_f32(state);
    if (topp <= 0.0f || topp >= 1.0f) { /* as run.c: a NaN topp takes the top-p path */
        float cdf = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            cdf += probs[i];
            if (coin < cdf) return i;
        }
        return n - 1;
    }
    return sample_topp(probs, n, topp, coin, keys);
}
