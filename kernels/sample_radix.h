/*
 * sample_radix.h — top-p by radix selection: the lead block's way where the
 * gathered list cannot hold the candidates (a flat row, many equal values;
 * sample.cu says when). Histograms of 11 bits of the candidates' keys a
 * level, from the row's level 0 in the scratch down to the key where the mass
 * crosses, gathering the candidates into the list once few enough; then the
 * k-th of the candidates equal to that key, by index. Included by sample.cu
 * alone.
 */
#ifndef MK_SAMPLE_RADIX_H
#define MK_SAMPLE_RADIX_H

#include "sample.h"

/* Scans sh's level histogram (1 << width bins) from its largest bin: the bin
 * where sh->above plus the mass from the top first exceeds target goes to
 * sh->bin (the mass before it to sh->above), or -1 with sh->above the whole. */
static __device__ void find_bin(pick_shared *sh, int width, u64 target) {
    const int per = BINS / THREADS; /* bins a thread takes, top down */
    int hi = (1 << width) - 1 - per * (int)threadIdx.x;
    u64 mine = 0, total;
    for (int k = 0; k < per; k++) mine += hi - k >= 0 ? sh->mass[hi - k] : 0;
    u64 above = sh->above, c = above + block_scan(mine, sh->part, &total);
    if (threadIdx.x == 0) sh->bin = -1;
    __syncthreads();
    for (int k = 0; k < per && hi - k >= 0; k++) {
        u64 next = c + sh->mass[hi - k];
        if (c <= target && target < next) sh->bin = hi - k, sh->above = c;
        c = next;
    }
    __syncthreads();
    if (sh->bin < 0 && threadIdx.x == 0) sh->above = above + total;
    __syncthreads();
}

/* f(p[j], j) for each j of this thread's stride through [0, n), the logits
 * read 16 at a time, so that their latencies overlap. Every lane calls f
 * alike (warp votes may be in it): past n with p NaN, which no comparison
 * takes. */
template <class F>
static __device__ __forceinline__ void for_each_p(const row_probs &p, long long n, F f) {
    const int batch = 16;
    for (long long base = threadIdx.x; base - threadIdx.x < n; base += (long long)batch * THREADS) {
        float v[batch];
#pragma unroll
        for (int k = 0; k < batch; k++) {
            long long j = base + (long long)k * THREADS;
            v[k] = j < n ? __ldcg(p.x + j) : __int_as_float(0x7fc00000);
        }
#pragma unroll
        for (int k = 0; k < batch; k++) f(p.of(v[k]), base + (long long)k * THREADS);
    }
}

/* sh's histogram of the candidates (gathered in sh, or every p >= cutoff of
 * the row) whose key bits above shift + width are prefix, by their width bits
 * at shift. */
static __device__ void level(pick_shared *sh, const row_probs &p, long long n, float cutoff,
                             unsigned prefix, int shift, int width) {
    __syncthreads(); /* every thread is done reading the last level's */
    for (int b = threadIdx.x; b < BINS; b += THREADS) sh->mass[b] = sh->count[b] = 0;
    __syncthreads();
    auto bin_of = [&](float v) { /* -1: not one of them */
        unsigned key = bits_of(v) - sh->base;
        if (!(v >= cutoff) || key >> (shift + width) != prefix) return -1;
        return (int)((key >> shift) & ((1u << width) - 1));
    };
    if (sh->listed >= 0) {
        for (int i = threadIdx.x; i < sh->listed; i += THREADS)
            histogram_add(sh->mass, sh->count, bin_of(__int_as_float((int)listed_bits(sh, i))),
                          sh->cand_mass[i]);
    } else {
        for_each_p(p, n, [&](float v, long long) {
            histogram_add(sh->mass, sh->count, bin_of(v), fixed(v));
        });
    }
    __syncthreads();
}

/* Gathers the row's candidates whose key bits above shift are prefix into sh. */
static __device__ void gather(pick_shared *sh, const row_probs &p, long long n, float cutoff,
                              unsigned prefix, int shift) {
    if (threadIdx.x == 0) sh->listed = 0;
    __syncthreads();
    unsigned base = sh->base;
    for_each_p(p, n, [&](float v, long long j) {
        bool in = v >= cutoff && (bits_of(v) - base) >> shift == prefix;
        unsigned vote = __ballot_sync(FULL, in), lane = threadIdx.x % 32;
        int at = 0;
        if (vote && lane == 0) at = atomicAdd(&sh->listed, __popc(vote)); /* a warp's at once */
        at = __shfl_sync(FULL, at, 0) + __popc(vote & ((1u << lane) - 1));
        if (in) list_put(sh, at, v, j);
    });
    __syncthreads();
}

/* Among the candidates equal to bits, the k-th by index (k >= 1; at most their count). */
static __device__ long long kth_equal(pick_shared *sh, const row_probs &p, long long n, float cutoff,
                                      unsigned bits, u64 k) {
    __syncthreads(); /* the last level's histogram is read: its room takes the equal ones */
    int *equal = (int *)sh->count;
    if (threadIdx.x == 0) sh->index = 0, sh->bin = 0;
    __syncthreads();
    if (sh->listed >= 0) { /* gathered: the equal ones, then each counts those before it */
        for (int i = threadIdx.x; i < sh->listed; i += THREADS)
            if (listed_bits(sh, i) == bits) equal[atomicAdd(&sh->bin, 1)] = listed_index(sh, i);
        __syncthreads();
        int m = sh->bin;
        for (int i = threadIdx.x; i < m; i += THREADS) {
            u64 before = 0;
            for (int e = 0; e < m; e++) before += equal[e] < equal[i];
            if (before + 1 == k) sh->index = equal[i];
        }
    } else { /* many: a scan of each thread's count over its contiguous share */
        long long lo, hi;
        share(n, threadIdx.x, THREADS, &lo, &hi);
        u64 count = 0, total;
        for (long long j = lo; j < hi; j++) {
            float v = p.at(j);
            count += v >= cutoff && bits_of(v) == bits;
        }
        u64 before = block_scan(count, sh->part, &total);
        if (before < k && k <= before + count)
            for (long long j = lo; j < hi; j++) {
                float v = p.at(j);
                if (v >= cutoff && bits_of(v) == bits && ++before == k) sh->index = j;
            }
    }
    __syncthreads();
    return sh->index;
}

/*
 * The candidate that run.c's order (p descending, then index) reaches first
 * with a running mass above target, and that mass (*through); -1 where the
 * whole mass stays at or under it (*through: the whole mass). The row's
 * level-0 histogram is in bk, its keys as sh->base and sh->shift0 say.
 */
static __device__ long long select_past(pick_shared *sh, const row_book *bk, const row_probs &p,
                                        long long n, float cutoff, u64 target, u64 *through) {
    for (int b = threadIdx.x; b < BINS; b += THREADS) sh->mass[b] = __ldcg(&bk->mass[b]);
    if (threadIdx.x == 0) sh->above = 0;
    __syncthreads();
    find_bin(sh, LEVEL_BITS, target);
    if (sh->bin < 0) {
        *through = sh->above;
        return -1;
    }
    unsigned prefix = (unsigned)sh->bin;
    int shift = sh->shift0;
    if (threadIdx.x == 0) sh->listed = -1;
    for (;;) {
        unsigned count = shift == sh->shift0 ? __ldcg(&bk->count[sh->bin]) : sh->count[sh->bin];
        __syncthreads(); /* every thread has read sh->listed */
        bool take = sh->listed < 0 && count <= CAP;
        __syncthreads();
        if (take) gather(sh, p, n, cutoff, prefix, shift);
        if (shift == 0) break;
        int width = shift < LEVEL_BITS ? shift : LEVEL_BITS;
        shift -= width;
        level(sh, p, n, cutoff, prefix, shift, width);
        find_bin(sh, width, target);
        prefix = prefix << width | (unsigned)sh->bin;
    }
    /* prefix: the key where the mass crosses; the k-th of the candidates equal to it */
    unsigned bits = prefix + sh->base;
    u64 above = sh->above, each = fixed(__int_as_float((int)bits));
    u64 k = each ? (target - above) / each + 1 : 1;
    *through = above + k * each;
    return kth_equal(sh, p, n, cutoff, bits, k);
}

static __device__ long long select_topp(pick_shared *sh, row_book *bk, const row_probs &p,
                                        long long n, float topp, float cutoff, float pmax,
                                        float coin) {
    u64 count = 0, total;
    for (int b = threadIdx.x; b < BINS; b += THREADS) count += __ldcg(&bk->count[b]);
    if (threadIdx.x == 0) key_frame(cutoff, pmax, &sh->base, &sh->shift0);
    block_scan(count, sh->part, &total); /* its syncs publish the frame */
    if (total == 0) { /* no candidate reaches the cutoff: all are (see core/sample.c) */
        cutoff = -INFINITY;
        if (threadIdx.x == 0) key_frame(cutoff, pmax, &sh->base, &sh->shift0), sh->listed = -1;
        __syncthreads();
        level(sh, p, n, cutoff, 0, sh->shift0, LEVEL_BITS);
        for (int b = threadIdx.x; b < BINS; b += THREADS)
            bk->mass[b] = sh->mass[b], bk->count[b] = sh->count[b];
        __syncthreads();
    }
    u64 through;
    select_past(sh, bk, p, n, cutoff, (u64)(topp * ONE), &through);
    if (through == 0) return 0; /* no mass at all: NaN logits */
    return select_past(sh, bk, p, n, cutoff, draw_target(coin, through), &through);
}

#endif
