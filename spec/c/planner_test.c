/*
 * planner_test.c — the arena planner (core/planner.c) against a brute-force
 * shadow: every free block in a plain array, best fit by a linear scan.
 *
 * Alone, while the rest of the core is not built:
 *   gcc -std=c11 -O2 -g -Wall -Wextra -Icore -Ispec/c spec/c/planner_test.c core/planner.c
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setrlimit, for the out-of-memory test */
#endif
#include "passes.h"
#include "test.h"

#include <stdbool.h>
#include <sys/resource.h>
#include <unistd.h>

/* The rounding rule, written out independently of the planner. */
static int64_t round_up(size_t bytes) {
    if (bytes == 0)
        return 256;
    size_t r = bytes % 256;
    return (int64_t)(r ? bytes - r + 256 : bytes);
}

static size_t random_size(void) {
    switch (test_randint(0, 9)) {
    case 0: return 0;
    case 1: return (size_t)test_randint(1, 255);              /* tiny */
    case 2:
    case 3: return 256 * (size_t)test_randint(1, 64);         /* exact multiples */
    case 4: return (size_t)test_randint(1 << 26, 1ll << 32);  /* huge */
    case 5: return 256 * (size_t)test_randint(1, 4) + (size_t)test_randint(-1, 1);
    default: return (size_t)test_randint(1, 1 << 20);
    }
}

/* ---- the shadow: what a best-fit planner must do, by brute force ---------- */

typedef struct {
    int64_t offset, size;
    size_t bytes; /* as requested */
} span;

#define SHADOW_CAP 8192

typedef struct {
    span live[SHADOW_CAP]; /* unordered */
    int n_live;
    span free[SHADOW_CAP]; /* sorted by offset, never two adjacent */
    int n_free;
    int64_t arena, live_sum, peak;
} shadow;

static void shadow_remove_free(shadow *s, int i) {
    memmove(&s->free[i], &s->free[i + 1], (size_t)(s->n_free - i - 1) * sizeof(span));
    s->n_free--;
}

/* Places a block the way the planner must and returns its offset. */
static int64_t shadow_alloc(shadow *s, size_t bytes) {
    int64_t size = round_up(bytes), offset;
    int best = -1;
    for (int i = 0; i < s->n_free; i++) /* address order: the first of equal sizes wins */
        if (s->free[i].size >= size && (best < 0 || s->free[i].size < s->free[best].size))
            best = i;
    if (best >= 0) {
        offset = s->free[best].offset;
        if (s->free[best].size == size) {
            shadow_remove_free(s, best);
        } else {
            s->free[best].offset += size;
            s->free[best].size -= size;
        }
    } else {
        offset = s->arena;
        span *last = s->n_free ? &s->free[s->n_free - 1] : NULL;
        if (last && last->offset + last->size == s->arena) {
            offset = last->offset;
            s->n_free--;
        }
        s->arena = offset + size;
    }
    s->live[s->n_live++] = (span){offset, size, bytes};
    s->live_sum += size;
    if (s->live_sum > s->peak)
        s->peak = s->live_sum;
    return offset;
}

/* Frees live[i] in the shadow, merging with free neighbours. */
static span shadow_release(shadow *s, int i) {
    span b = s->live[i];
    s->live[i] = s->live[--s->n_live];
    s->live_sum -= b.size;
    int j = 0;
    while (j < s->n_free && s->free[j].offset < b.offset)
        j++;
    memmove(&s->free[j + 1], &s->free[j], (size_t)(s->n_free - j) * sizeof(span));
    s->free[j] = (span){b.offset, b.size, 0};
    s->n_free++;
    if (j + 1 < s->n_free && s->free[j].offset + s->free[j].size == s->free[j + 1].offset) {
        s->free[j].size += s->free[j + 1].size;
        shadow_remove_free(s, j + 1);
    }
    if (j > 0 && s->free[j - 1].offset + s->free[j - 1].size == s->free[j].offset) {
        s->free[j - 1].size += s->free[j].size;
        shadow_remove_free(s, j);
    }
    return b;
}

static int by_offset(const void *a, const void *b) {
    int64_t x = ((const span *)a)->offset, y = ((const span *)b)->offset;
    return (x > y) - (x < y);
}

/*
 * Everything checkable from outside: the planner's numbers equal the shadow's;
 * live blocks are aligned, inside the arena and disjoint; and the shadow's free
 * list is exactly the gaps between them (so the shadow itself is sound).
 */
static bool check_state(const shadow *s, const mk_planner *p) {
    static span sorted[SHADOW_CAP];
    int failed = test_cur_failed;
    CHECK((int64_t)mk_planner_arena_bytes(p) == s->arena, "arena %zu, want %lld",
          mk_planner_arena_bytes(p), (long long)s->arena);
    CHECK((int64_t)mk_planner_peak_live(p) == s->peak, "peak %zu, want %lld",
          mk_planner_peak_live(p), (long long)s->peak);
    CHECK(mk_planner_arena_bytes(p) >= mk_planner_peak_live(p), "arena below the lower bound");
    memcpy(sorted, s->live, (size_t)s->n_live * sizeof(span));
    qsort(sorted, (size_t)s->n_live, sizeof(span), by_offset);
    int64_t cursor = 0;
    int k = 0;
    for (int i = 0; i < s->n_live && !test_cur_failed; i++) {
        span b = sorted[i];
        CHECK(b.offset % 256 == 0, "offset %lld not aligned", (long long)b.offset);
        CHECK(b.offset >= cursor, "block at %lld overlaps the one ending at %lld",
              (long long)b.offset, (long long)cursor);
        CHECK(b.offset + b.size <= s->arena, "block [%lld, +%lld) outside arena %lld",
              (long long)b.offset, (long long)b.size, (long long)s->arena);
        if (b.offset > cursor) {
            CHECK(k < s->n_free && s->free[k].offset == cursor &&
                      s->free[k].size == b.offset - cursor,
                  "shadow free list misses the gap [%lld, %lld)", (long long)cursor,
                  (long long)b.offset);
            k++;
        }
        cursor = b.offset + b.size;
    }
    if (s->arena > cursor) {
        CHECK(k < s->n_free && s->free[k].offset == cursor, "shadow misses the top gap");
        k++;
    }
    CHECK(k == s->n_free, "shadow has %d free blocks, the gaps are %d", s->n_free, k);
    return test_cur_failed == failed;
}

/* ---- tests -------------------------------------------------------------- */

static void test_rounding(void) {
    mk_planner *p = mk_planner_new();
    CHECK(p != NULL, "mk_planner_new failed");
    if (!p)
        return;
    size_t req[] = {0, 1, 255, 256, 257, 511, 512, 1000};
    int64_t want = 0;
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        int64_t off = mk_planner_alloc(p, req[i]);
        CHECK(off == want, "alloc(%zu) at %lld, want %lld", req[i], (long long)off,
              (long long)want);
        want += round_up(req[i]);
    }
    CHECK((int64_t)mk_planner_arena_bytes(p) == want, "arena %zu, want %lld",
          mk_planner_arena_bytes(p), (long long)want);
    CHECK((int64_t)mk_planner_peak_live(p) == want, "peak %zu", mk_planner_peak_live(p));
    mk_planner_free(p);
}

/* Holes of 3, 1, 2 and 2 slots between live guards: each request takes the
 * smallest hole that fits, the lower one on ties, and splits it. */
static void test_best_fit_by_hand(void) {
    const int64_t u = 256;
    mk_planner *p = mk_planner_new();
    int64_t hole[4], slots[4] = {3, 1, 2, 2};
    for (int i = 0; i < 4; i++) {
        hole[i] = mk_planner_alloc(p, (size_t)(slots[i] * u));
        mk_planner_alloc(p, 1); /* guard */
    }
    for (int i = 0; i < 4; i++)
        mk_planner_release(p, hole[i], (size_t)(slots[i] * u));
    size_t arena = mk_planner_arena_bytes(p);
    CHECK(mk_planner_alloc(p, 2 * u) == hole[2], "2 slots: not the lower 2-slot hole");
    CHECK(mk_planner_alloc(p, 2 * u - 7) == hole[3], "2 slots: not the other 2-slot hole");
    CHECK(mk_planner_alloc(p, 0) == hole[1], "1 slot: not the 1-slot hole");
    CHECK(mk_planner_alloc(p, u) == hole[0], "1 slot: not the start of the 3-slot hole");
    CHECK(mk_planner_alloc(p, 2 * u) == hole[0] + u, "2 slots: not the split remainder");
    CHECK(mk_planner_arena_bytes(p) == arena, "the arena grew while holes fit");
    CHECK(mk_planner_alloc(p, 1) == (int64_t)arena, "nothing fits: not at the top");

    /* A free block touching the top is extended, growing the arena by the difference. */
    int64_t a = mk_planner_alloc(p, 3 * u);
    mk_planner_release(p, a, 3 * u);
    CHECK(mk_planner_alloc(p, 5 * u) == a, "the top free block was not reused");
    CHECK((int64_t)mk_planner_arena_bytes(p) == a + 5 * u, "arena %zu, want %lld",
          mk_planner_arena_bytes(p), (long long)(a + 5 * u));
    mk_planner_free(p);
}

/* Three adjacent blocks freed in every order merge into one free block, which
 * one request of their total size then fills exactly. */
static void test_neighbour_merging(void) {
    static const int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                    {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int round = 0; round < 24 && !test_cur_failed; round++) {
        int perm = round % 6;
        bool guard_above = round % 12 < 6; /* else the three end at the top */
        mk_planner *p = mk_planner_new();
        mk_planner_alloc(p, random_size() % 5000); /* something live below */
        size_t bytes[3];
        int64_t off[3], total = 0;
        for (int i = 0; i < 3; i++) {
            bytes[i] = i == 1 && round >= 12 ? 0 : random_size() % 100000;
            off[i] = mk_planner_alloc(p, bytes[i]);
            total += round_up(bytes[i]);
        }
        CHECK(off[1] == off[0] + round_up(bytes[0]) && off[2] == off[1] + round_up(bytes[1]),
              "fresh blocks not adjacent");
        if (guard_above)
            mk_planner_alloc(p, 1);
        size_t arena = mk_planner_arena_bytes(p);
        for (int i = 0; i < 3; i++)
            mk_planner_release(p, off[perms[perm][i]], bytes[perms[perm][i]]);
        int64_t got = mk_planner_alloc(p, (size_t)total);
        CHECK(got == off[0], "order %d%d%d: merged block at %lld, want %lld", perms[perm][0],
              perms[perm][1], perms[perm][2], (long long)got, (long long)off[0]);
        CHECK(mk_planner_arena_bytes(p) == arena, "order %d%d%d: arena grew %zu -> %zu",
              perms[perm][0], perms[perm][1], perms[perm][2], arena, mk_planner_arena_bytes(p));
        mk_planner_free(p);
    }
}

/* Random alloc/release sequences, every step checked against the shadow. */
static void test_random_against_shadow(void) {
    static shadow s;
    static const int targets[] = {4, 40, 400, 2000};
    for (int t = 0; t < 4 && !test_cur_failed; t++) {
        memset(&s, 0, sizeof s);
        mk_planner *p = mk_planner_new();
        int ops = t == 3 ? 3000 : 6000;
        for (int op = 0; op < ops && !test_cur_failed; op++) {
            /* alloc more often below the target live count, release more above */
            bool alloc = s.n_live == 0 ||
                         (s.n_live < SHADOW_CAP - 1 &&
                          test_uniform(0, 1) < (s.n_live < targets[t] ? 0.7 : 0.3));
            if (alloc) {
                size_t bytes = random_size();
                int64_t want = shadow_alloc(&s, bytes);
                int64_t got = mk_planner_alloc(p, bytes);
                CHECK(got == want, "op %d: alloc(%zu) at %lld, best fit is %lld", op, bytes,
                      (long long)got, (long long)want);
            } else {
                span b = shadow_release(&s, (int)test_randint(0, s.n_live - 1));
                mk_planner_release(p, b.offset, b.bytes);
            }
            if (s.n_live < 200 || op % 16 == 0)
                check_state(&s, p);
        }
        /* Releasing everything leaves one free block: the whole arena. */
        while (s.n_live > 0 && !test_cur_failed) {
            span b = shadow_release(&s, (int)test_randint(0, s.n_live - 1));
            mk_planner_release(p, b.offset, b.bytes);
        }
        check_state(&s, p);
        CHECK(s.n_free <= 1, "shadow did not merge to one block");
        size_t arena = mk_planner_arena_bytes(p);
        CHECK(mk_planner_alloc(p, arena) == 0 && mk_planner_arena_bytes(p) == arena,
              "the emptied arena is not one free block");
        mk_planner_free(p);
    }
}

/* Releases the planner never handed out are ignored, not trusted. */
static void test_bad_release(void) {
    mk_planner *p = mk_planner_new();
    int64_t a = mk_planner_alloc(p, 1000), b = mk_planner_alloc(p, 300);
    mk_planner_alloc(p, 10);
    mk_planner_release(p, a, 1000);
    mk_planner_release(p, a, 1000);      /* twice */
    mk_planner_release(p, a + 256, 256); /* inside a free block */
    mk_planner_release(p, b + 1, 300);   /* misaligned */
    mk_planner_release(p, 1 << 30, 256); /* beyond the arena */
    mk_planner_release(p, -256, 256);
    size_t arena = mk_planner_arena_bytes(p);
    CHECK(mk_planner_alloc(p, 1024) == a, "the free block was damaged");
    CHECK(mk_planner_alloc(p, 1) == (int64_t)arena, "a bogus release freed memory");
    mk_planner_release(p, b, 300);
    CHECK(mk_planner_alloc(p, 512) == b, "the real release was lost");
    mk_planner_free(p);
    mk_planner_free(NULL);
    CHECK(mk_planner_alloc(NULL, 1) == -1, "alloc on NULL");
    mk_planner_release(NULL, 0, 1);
}

/*
 * Host memory runs out: under a tight address-space limit mk_planner_alloc
 * must return -1 and change nothing, and releases must still work (they never
 * allocate). Checks wait until the limit is lifted, since printf may allocate.
 */
static void test_host_oom(void) {
    enum { CAP = 1 << 22 };
    int64_t *offs = malloc(CAP * sizeof *offs);
    mk_planner *p = mk_planner_new();
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    bool have_vm = f && fscanf(f, "%lu", &pages) == 1;
    if (f)
        fclose(f);
    struct rlimit old, tight;
    CHECK(offs && p && have_vm && getrlimit(RLIMIT_AS, &old) == 0, "setup failed");
    if (test_cur_failed) {
        free(offs);
        mk_planner_free(p);
        return;
    }
    tight = old;
    tight.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (16u << 20);
    if (old.rlim_cur != RLIM_INFINITY && old.rlim_cur < tight.rlim_cur)
        tight.rlim_cur = old.rlim_cur;

    int n = 0;
    int64_t failed = 0;
    size_t arena_before = 0, peak_before = 0, arena_after = 0, peak_after = 0;
    bool refilled = true;
    if (setrlimit(RLIMIT_AS, &tight) == 0) {
        while (n < CAP) {
            arena_before = mk_planner_arena_bytes(p);
            peak_before = mk_planner_peak_live(p);
            int64_t off = mk_planner_alloc(p, 256);
            if (off < 0) {
                failed = off;
                break;
            }
            offs[n++] = off;
        }
        arena_after = mk_planner_arena_bytes(p);
        peak_after = mk_planner_peak_live(p);
        /* free every other block, take the holes back, then free all */
        for (int i = 0; i < n; i += 2)
            mk_planner_release(p, offs[i], 256);
        for (int i = 0; i < n; i += 2)
            refilled = refilled && mk_planner_alloc(p, 1) == offs[i];
        for (int i = n - 1; i >= 0; i--)
            mk_planner_release(p, offs[i], 256);
        setrlimit(RLIMIT_AS, &old);
    }
    CHECK(failed == -1, "no failure after %d allocations under the limit", n);
    CHECK(arena_after == arena_before && peak_after == peak_before,
          "the failed alloc changed the arena (%zu -> %zu) or peak", arena_before, arena_after);
    CHECK(refilled, "allocations after the failure did not reuse the holes");
    size_t arena = mk_planner_arena_bytes(p);
    CHECK(arena == (size_t)n * 256 && mk_planner_alloc(p, arena) == 0 &&
              mk_planner_arena_bytes(p) == arena,
          "after releasing everything the arena is not one free block");
    printf("# planner: out of host memory after %d live blocks\n", n);
    mk_planner_free(p);
    free(offs);
}

static double now_ms(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Timings, printed only: a long chain and a long random sequence. */
static void time_planner(void) {
    enum { CHAIN = 100000, OPS = 1000000, LIVE = 10000 };
    int64_t *off = malloc(LIVE * sizeof *off);
    size_t *bytes = malloc(LIVE * sizeof *bytes);
    mk_planner *p = mk_planner_new();
    CHECK(off && bytes && p, "out of memory");
    if (test_cur_failed)
        goto done;

    double t0 = now_ms();
    int64_t prev = -1;
    size_t prev_bytes = 0;
    for (int i = 0; i < CHAIN; i++) {
        size_t b = (size_t)test_randint(1, 1 << 20);
        int64_t o = mk_planner_alloc(p, b);
        if (prev >= 0)
            mk_planner_release(p, prev, prev_bytes);
        prev = o;
        prev_bytes = b;
    }
    double t1 = now_ms();
    printf("# planner: chain of %d blocks: %.1f ms (%.0f ns/op), arena %.1f MiB, lower bound "
           "%.1f MiB\n",
           CHAIN, t1 - t0, (t1 - t0) * 1e6 / (2.0 * CHAIN), mk_planner_arena_bytes(p) / 1048576.0,
           mk_planner_peak_live(p) / 1048576.0);
    mk_planner_free(p);

    p = mk_planner_new();
    int n = 0;
    t0 = now_ms();
    for (int op = 0; op < OPS; op++) {
        if (n == 0 || (n < LIVE && test_rand_u64() % 2)) {
            bytes[n] = (size_t)test_randint(0, 1 << 16);
            off[n] = mk_planner_alloc(p, bytes[n]);
            n++;
        } else {
            int i = (int)(test_rand_u64() % (uint64_t)n);
            mk_planner_release(p, off[i], bytes[i]);
            off[i] = off[--n];
            bytes[i] = bytes[n];
        }
    }
    t1 = now_ms();
    printf("# planner: %d random ops (up to %d live): %.1f ms (%.0f ns/op), arena %.1f MiB, "
           "lower bound %.1f MiB\n",
           OPS, LIVE, t1 - t0, (t1 - t0) * 1e6 / OPS, mk_planner_arena_bytes(p) / 1048576.0,
           mk_planner_peak_live(p) / 1048576.0);
done:
    mk_planner_free(p);
    free(off);
    free(bytes);
}

/* Address-space limits break AddressSanitizer, ThreadSanitizer and valgrind, which map
 * their own memory. */
static const char *oom_test_blocked(void) {
#if defined(__SANITIZE_ADDRESS__)
    return "AddressSanitizer";
#elif defined(__SANITIZE_THREAD__)
    return "ThreadSanitizer";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return "AddressSanitizer";
#endif
#endif
    const char *preload = getenv("LD_PRELOAD");
    if (preload && strstr(preload, "vgpreload"))
        return "valgrind";
    return NULL;
}

int main(void) {
    test_srand(test_seed());
    RUN(test_rounding);
    RUN(test_best_fit_by_hand);
    RUN(test_neighbour_merging);
    RUN(test_random_against_shadow);
    RUN(test_bad_release);
    const char *blocked = oom_test_blocked();
    if (blocked)
        SKIP(test_host_oom, blocked);
    else
        RUN(test_host_oom);
    RUN(time_planner);
    return test_summary("planner");
}
