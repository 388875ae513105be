/*
 * test.h — the tiny harness every C test under spec/c/ uses.
 *
 * A test program calls CHECK(...) inside functions registered with RUN(fn) and
 * ends with `return test_summary();`, which prints the line spec/run_tests.sh
 * reads: "# c-test <name>: N passed, N failed, N skipped". A check counts once
 * per RUN: a test passes when all its checks hold.
 */
#ifndef MK_TEST_H
#define MK_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moonkaas.h"

static int test_passed, test_failed, test_skipped, test_cur_failed;
static const char *test_cur_name;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            if (!test_cur_failed)                                               \
                printf("not ok - %s\n", test_cur_name);                         \
            printf("#   %s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
            test_cur_failed = 1;                                                \
        }                                                                       \
    } while (0)

#define RUN(fn)                                                  \
    do {                                                         \
        test_cur_name = #fn;                                     \
        test_cur_failed = 0;                                     \
        fn();                                                    \
        if (test_cur_failed) test_failed++;                      \
        else { test_passed++; printf("ok - %s\n", #fn); }        \
        fflush(stdout);                                          \
    } while (0)

#define SKIP(fn, why)                                          \
    do {                                                       \
        test_skipped++;                                        \
        printf("ok - %s # skip %s\n", #fn, why);               \
    } while (0)

/* fn where `ok` (e.g. a CUDA device is there), else skipped with the reason. */
#define RUN_IF(ok, fn, why)                                    \
    do {                                                       \
        if (ok) RUN(fn);                                       \
        else SKIP(fn, why);                                    \
    } while (0)

/* A seed fresh per run unless MK_SEED is set; printed so a failure can be replayed. */
static inline uint64_t test_seed(void) {
    const char *s = getenv("MK_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ (uint64_t)clock();
    printf("# seed %llu (replay with MK_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    return seed;
}

static uint64_t test_rng_state = 88172645463325252ull;
static inline void test_srand(uint64_t seed) { test_rng_state = seed ? seed : 88172645463325252ull; }
static inline uint64_t test_rand_u64(void) { /* xorshift64* */
    test_rng_state ^= test_rng_state >> 12;
    test_rng_state ^= test_rng_state << 25;
    test_rng_state ^= test_rng_state >> 27;
    return test_rng_state * 0x2545F4914F6CDD1Dull;
}
/* uniform in [lo, hi) */
static inline double test_uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(test_rand_u64() >> 11) / 9007199254740992.0;
}
static inline int64_t test_randint(int64_t lo, int64_t hi) { /* [lo, hi] */
    return lo + (int64_t)(test_rand_u64() % (uint64_t)(hi - lo + 1));
}
/* |got - want| <= atol + rtol * |want| */
static inline int test_close(double got, double want, double atol, double rtol) {
    return fabs(got - want) <= atol + rtol * fabs(want);
}

/* A test program's context, or NULL after a "not ok" line saying why. */
static inline mk_context *test_context(void) {
    mk_error *err = NULL;
    mk_context *c = mk_context_new(&err);
    if (!c) printf("not ok - context: %s\n", mk_error_message(err));
    mk_error_free(err);
    return c;
}

static inline int test_summary(const char *name) {
    printf("# c-test %s: %d passed, %d failed, %d skipped\n", name, test_passed, test_failed,
           test_skipped);
    return test_failed ? 1 : 0;
}

#endif
