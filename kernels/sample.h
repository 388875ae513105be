/*
 * sample.h — what the sampler's kernel (sample.cu) and its two top-p
 * selections (sample_list.h, sample_radix.h) share: the block's size and
 * limits, a row's shared memory (pick_shared) and bookkeeping in the scratch,
 * the fixed-point masses and the candidates' keys, and the block's
 * reductions and scans. Device code for one translation unit: sample.cu
 * includes it, through the selections.
 */
#ifndef MK_SAMPLE_H
#define MK_SAMPLE_H

#include "cuda_device.h"
#include "reduce.h"

#include <cooperative_groups.h>

#include <math.h>

/* Threads a block: 256 lost (doc/performance.md). */
#define THREADS 512
#define WARPS (THREADS / 32)
#define PER_THREAD 4   /* elements a thread takes, at least */
#define HELD 8         /* elements a thread holds in registers through the phases, at most */
#define MAX_CLUSTER 16 /* blocks a row spreads over, where the device takes such clusters */
#define PORTABLE 8     /* ... else at most a portable cluster's */
#define LEVEL_BITS 11
#define BINS (1 << LEVEL_BITS)
#define CAP 2048       /* candidates a list (the planned, or the radix selection's) holds */
#define RANKED 256     /* the most candidates select_ranked takes; select_sorted more */
#define FULL 0xffffffffu
#define ONE 2147483648.0f /* probability 1 in fixed point */

typedef unsigned long long u64;
namespace cg = cooperative_groups;


/* A row's level-0 histogram in the scratch (core/device.h), where the
 * radix selection reads it. */
typedef struct {
    unsigned mass[BINS];  /* the candidates' mass per bin */
    unsigned count[BINS]; /* the candidates per bin */
} row_book;
static_assert(sizeof(row_book) <= MK_SAMPLE_ROW_BYTES, "a row's bookkeeping outgrew its room");
static_assert(CAP <= BINS, "kth_equal lists the equal candidates in a histogram's room");
static_assert(CAP % THREADS == 0, "select_sorted gives each thread CAP / THREADS candidates");
static_assert(BINS % THREADS == 0, "a thread takes BINS / THREADS bins");

/* The plan, which every block of the row makes alike: the level-0 bins whose
 * candidates the blocks gather, one or two ranges of bins in run.c's order,
 * so that the lead block sorts them and reads both draws off one scan. */
typedef struct {
    int ranges;            /* 1 or 2; 0: radix selection over the row instead */
    int top[2], bottom[2]; /* each range's bins, range 0's above range 1's */
    u64 above[2];          /* the mass before each range (of the candidates above it) */
    u64 mass0;             /* range 0's mass */
    unsigned count0;       /* range 0's candidates */
    int cut;               /* 1: the topp cut falls in range 1 (or range 0 if one); 0: no cut */
    u64 whole;             /* the candidates' mass: the cut's where there is none */
} gather_plan;

/* A level-0 bin where a target falls: the mass and candidates above it, its own. */
typedef struct {
    int bin; /* -1: the target is past the whole mass */
    u64 above, mass, counted;
    unsigned count;
} bin_hit;

/* A block's shared memory. The lead block's (rank 0) takes the row's level-0
 * histogram and the gathered candidates from every block of the cluster. */
typedef struct {
    __align__(16) unsigned mass[BINS];
    __align__(16) unsigned count[BINS]; /* a level's histogram */
    u64 cand_key[CAP];       /* the gathered candidates' keys (candidate_key) */
    unsigned cand_mass[CAP]; /* and masses */
    int listed;     /* how many are gathered; -1: read them from p */
    float block_max;       /* t <= 0: this block's best value */
    long long block_best;  /* and its index */
    float max[MAX_CLUSTER], sum[MAX_CLUSTER]; /* every block's max of x / t and sum, pushed */
    float row_max, row_sum;                   /* the row's, from those */
    u64 masses[MAX_CLUSTER];                  /* multinomial: every block's mass, pushed */
    u64 part[WARPS];
    float fpart[WARPS];
    long long ipart[WARPS];
    u64 above;       /* mass of the candidates before the chosen bin */
    int bin;         /* the chosen bin, -1: no bin crosses the target */
    unsigned base;   /* a candidate's key: its bits less base (key_frame) */
    int shift0;      /* level 0 bins a key's bits from shift0 up */
    gather_plan plan;
    bin_hit hit[3];  /* plan_gather: the bins its targets fall in */
    long long found[2]; /* select_listed: each round's candidate (-1: none) */
    u64 through[2];     /* and the mass through it */
    long long index; /* a result */
} pick_shared;

/* round(p x 2^31); 0 for NaN (p <= 1: the max's term is 1). */
static __device__ __forceinline__ unsigned fixed(float p) {
    return p > 0.0f ? __float2uint_rn(p * ONE) : 0u;
}

/* A row's probabilities, p = expf(x / t - max) x (1 / sum) (a product, not
 * a quotient: no slow-path check per element), recomputed from its logits x
 * wherever a phase needs them again: never stored, since a block's stores
 * would hold up the cluster barrier after them (its release waits for them). */
struct row_probs {
    const float *x;
    float t, max, inv; /* inv: 1 / the sum */
    __device__ __forceinline__ float of(float y) const { return expf(y / t - max) * inv; }
    __device__ __forceinline__ float at(long long j) const { return of(__ldcg(x + j)); }
};

static __device__ __forceinline__ unsigned bits_of(float p) {
    return (unsigned)__float_as_int(p) & 0x7fffffffu;
}

/* A candidate's key in run.c's order (p descending, then index): a gathered
 * list holds the keys, which give back p and the index, and the masses. */
static __device__ __forceinline__ u64 candidate_key(float p, long long j) {
    return (u64)(0x7fffffffu - bits_of(p)) << 32 | (unsigned)j;
}

static __device__ __forceinline__ void list_put(pick_shared *to, int at, float p, long long j) {
    to->cand_key[at] = candidate_key(p, j), to->cand_mass[at] = fixed(p);
}

static __device__ __forceinline__ unsigned listed_bits(const pick_shared *sh, int i) {
    return 0x7fffffffu - (unsigned)(sh->cand_key[i] >> 32);
}

static __device__ __forceinline__ int listed_index(const pick_shared *sh, int i) {
    return (int)(sh->cand_key[i] & 0xffffffffu);
}

/* Keys for the candidates p >= cutoff (cutoff > 0) of a row whose largest
 * probability is pmax (1 / sum: its max's term is 1): a probability's bits
 * less the cutoff's, which keeps their order and spans [cutoff, pmax] only;
 * level 0 bins a key by its bits from *shift0 up, the fewest that fit BINS. A
 * cutoff that no probability reaches (or none at all, -inf) keys the bits as
 * they are. */
static __device__ __forceinline__ void key_frame(float cutoff, float pmax, unsigned *base,
                                                 int *shift0) {
    *base = cutoff > 0.0f && cutoff <= 1.0f ? bits_of(cutoff) : 0u;
    unsigned top = !*base ? 0x7fffffffu : bits_of(pmax) > *base ? bits_of(pmax) - *base : 0u;
    int width = 32 - __clz((int)top);
    *shift0 = width > LEVEL_BITS ? width - LEVEL_BITS : 0;
}

/* Adds a candidate of mass m to bin of a histogram; bin < 0 adds nothing.
 * (Plain shared atomics: the keys' fine bins keep a warp's lanes apart, and
 * aggregating a warp's equal bins with match_any cost more than it saved.) */
static __device__ __forceinline__ void histogram_add(unsigned *mass, unsigned *count, int bin,
                                                     unsigned m) {
    if (bin < 0) return;
    if (m) atomicAdd(&mass[bin], m);
    atomicAdd(&count[bin], 1u);
}

/* Every thread gets the block's max (MAX) or sum of v. */
template <bool MAX>
static __device__ float block_reduce(float v, float *part) {
    v = MAX ? warp_max(v) : warp_sum(v);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    int lane = threadIdx.x % 32;
    v = lane < WARPS ? part[lane] : (MAX ? -INFINITY : 0.0f);
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    return v;
}

/* The sum of v over the threads before this one; *total: over all. */
static __device__ u64 block_scan(u64 v, u64 *part, u64 *total) {
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    u64 x = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u64 y = __shfl_up_sync(FULL, x, d);
        if (lane >= d) x += y;
    }
    if (lane == 31) part[warp] = x;
    __syncthreads();
    u64 w = lane < WARPS ? part[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u64 y = __shfl_up_sync(FULL, w, d);
        if (lane >= d) w += y;
    }
    u64 before = __shfl_sync(FULL, w, (warp + 31) % 32);
    *total = __shfl_sync(FULL, w, 31);
    __syncthreads();
    return (warp ? before : 0) + x - v;
}

/* The largest (v, i) of the block, the earliest i on ties; thread 0 has it. */
static __device__ void block_argmax(float *v, long long *i, pick_shared *sh) {
    warp_argmax(v, i);
    if (threadIdx.x % 32 == 0) sh->fpart[threadIdx.x / 32] = *v, sh->ipart[threadIdx.x / 32] = *i;
    __syncthreads();
    int lane = threadIdx.x % 32;
    *v = lane < WARPS ? sh->fpart[lane] : -INFINITY;
    *i = lane < WARPS ? sh->ipart[lane] : 0x7fffffffffffffffLL;
    warp_argmax(v, i);
}

/* The block of g that merges level-0 bin k of the row's histogram: spread
 * over the cluster, since one block taking every block's adds waited on its
 * shared memory's atomics; four bins at a time, which the lead then reads
 * in one load. */
static __device__ __forceinline__ int bin_owner(int k, int g) { return (k / 4) * g / (BINS / 4); }

/* [lo, hi): block b's share of [0, n) among g; or this thread's of [lo, hi). */
static __device__ __forceinline__ void share(long long n, int b, int g, long long *lo,
                                             long long *hi) {
    long long c = (n + g - 1) / g;
    *lo = min(n, (long long)b * c);
    *hi = min(n, *lo + c);
}

static __device__ __forceinline__ row_book *book_of(char *scratch, long long row) {
    return (row_book *)(scratch + row * MK_SAMPLE_ROW_BYTES);
}

/* run.c's random_f32: the state advanced (xorshift64*) into *next; the coin in [0, 1). */
static __device__ __forceinline__ float coin_of(long long state, u64 *next) {
    u64 s = (u64)state;
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    *next = s;
    return (float)((unsigned)((s * 0x2545F4914F6CDD1Dull) >> 32) >> 8) / 16777216.0f;
}

/* The draw's target after a cut with mass through (> 0): run.c's r = coin x
 * the cut's mass, in fixed point, short of through. Rises with through. */
static __device__ __forceinline__ u64 draw_target(float coin, u64 through) {
    float r = coin * ((float)through / ONE);
    return min((u64)(r * ONE), through - 1);
}

/* f(a[j], j) for this thread's j of [lo, hi) (a stride of THREADS), in order,
 * the loads 8 at a time so that their latencies overlap (one at a time, a
 * 32,000-way row's four passes were mostly waiting on memory). */
template <class F>
static __device__ __forceinline__ void for_each_in(const float *a, long long lo, long long hi,
                                                   F f) {
    const int batch = 8;
    for (long long at = lo + threadIdx.x; at < hi; at += (long long)batch * THREADS) {
        float v[batch];
#pragma unroll
        for (int k = 0; k < batch; k++) {
            long long j = at + (long long)k * THREADS;
            v[k] = j < hi ? a[j] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < batch; k++)
            if (at + (long long)k * THREADS < hi) f(v[k], at + (long long)k * THREADS);
    }
}

/* f(v, j) for this thread's j of [lo, hi) (a stride of THREADS), in order:
 * v from held (held[k] is element lo + threadIdx.x + k x THREADS) where HOLD
 * (the block's range is at most HELD x THREADS), else read from a. */
template <bool HOLD, class F>
static __device__ __forceinline__ void each(const float *held, const float *a, long long lo,
                                            long long hi, F f) {
    if (HOLD) {
#pragma unroll
        for (int k = 0; k < HELD; k++) {
            long long j = lo + threadIdx.x + (long long)k * THREADS;
            if (j < hi) f(held[k], j);
        }
    } else {
        for_each_in(a, lo, hi, f);
    }
}

#endif
