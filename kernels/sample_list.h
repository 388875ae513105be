/*
 * sample_list.h — top-p from a gathered list (sample.cu's phase 3): the plan
 * that every block makes alike from the row's merged histogram (the bins
 * whose candidates to gather), whether a candidate is planned, and the lead
 * block's selection over the list in run.c's order (p descending, then
 * index): a warp's sort for a few, the masses before each summed by lane
 * groups for up to RANKED, a bitonic sort for more. Included by sample.cu
 * alone.
 */
#ifndef MK_SAMPLE_LIST_H
#define MK_SAMPLE_LIST_H

#include "sample.h"

/*
 * sh->plan for the row: the cut (topp's mass T) falls in level-0 bin b1 at a
 * running mass C in (T, T + the largest mass a candidate of b1 may have] and
 * in (A1, A1 + M1], b1's span, so the draw's target lies between draw_target
 * of the ends of both (it rises with the cut's mass); the bins of that span
 * and b1 are the ones to gather (the candidate's bound keeps a flat row's
 * span from often reaching a second bin). Where
 * the cut takes every candidate, the draw's target is known and one bin does.
 * ranges 0: more candidates than the list holds, or none with mass. A block
 * plans from the row's histogram in its sh (every block the same plan); each
 * thread holds BINS / THREADS of its bins, top down, and where they start
 * (mass and count from the top, one scan); the thread whose bins hold a
 * target says so, the cut's first, then both of the draw's: three barriers in
 * all (planned by one warp without barriers was slower).
 */
static __device__ void plan_gather(pick_shared *sh, float topp, float coin) {
    const int per = BINS / THREADS;
    int hi = BINS - 1 - per * (int)threadIdx.x;
    u64 bin[per], mine = 0, whole;
    for (int k = 0; k < per; k++) mine += bin[k] = (u64)sh->mass[hi - k] << 32 | sh->count[hi - k];
    if (threadIdx.x < 3) sh->hit[threadIdx.x].bin = -1; /* block_scan's syncs publish it */
    u64 before = block_scan(mine, sh->part, &whole);
    whole >>= 32;
    auto locate = [&](int slot, u64 target) { /* into sh->hit[slot], where it falls here */
        u64 a = before;
        for (int k = 0; k < per; k++) {
            u64 above = a >> 32, mass = bin[k] >> 32;
            if (above <= target && target < above + mass)
                sh->hit[slot] = (bin_hit){hi - k, above, mass, a & 0xffffffffu, (unsigned)bin[k]};
            a += bin[k];
        }
    };
    locate(0, (u64)(topp * ONE));
    __syncthreads();
    bin_hit cut = sh->hit[0];
    if (cut.bin < 0) { /* no cut: the draw's target is exact */
        u64 t = whole ? draw_target(coin, whole) : 0;
        locate(1, t), locate(2, t);
    } else { /* C is at most T + the mass of b1's top probability (the top bin's is unbounded) */
        u64 t = (u64)(topp * ONE), most = cut.above + cut.mass;
        unsigned top = sh->base + ((unsigned)(cut.bin + 1) << sh->shift0) - 1u;
        if (cut.bin < BINS - 1 && top < 0x7f800000u)
            most = min(most, t + fixed(__int_as_float((int)top)));
        locate(1, draw_target(coin, t + 1));
        locate(2, draw_target(coin, most));
    }
    __syncthreads();
    if (threadIdx.x) return;
    gather_plan *pl = &sh->plan;
    bin_hit top = sh->hit[1], bottom = sh->hit[2];
    /* one range where the draw's bins reach the cut's (or there is no cut), else two */
    bool two = cut.bin >= 0 && bottom.bin > cut.bin + 1;
    if (cut.bin >= 0 && !two) bottom = cut;
    u64 count0 = bottom.counted + bottom.count - top.counted;
    u64 n = count0 + (two ? cut.count : 0);
    bool fits = whole && top.bin >= 0 && bottom.bin >= 0 && n > 0 && n <= CAP;
    pl->ranges = !fits ? 0 : two ? 2 : 1;
    pl->top[0] = top.bin, pl->bottom[0] = bottom.bin, pl->above[0] = top.above;
    pl->top[1] = pl->bottom[1] = cut.bin, pl->above[1] = cut.above;
    pl->mass0 = bottom.above + bottom.mass - top.above, pl->count0 = (unsigned)count0;
    pl->cut = cut.bin >= 0, pl->whole = whole;
}

/* Is v a candidate in one of the plan's ranges? */
static __device__ __forceinline__ bool planned(const pick_shared *sh, float v, float cutoff) {
    const gather_plan *pl = &sh->plan;
    if (!(v >= cutoff)) return false;
    int bin = (int)((bits_of(v) - sh->base) >> sh->shift0);
    return (pl->bottom[0] <= bin && bin <= pl->top[0]) ||
           (pl->ranges == 2 && pl->bottom[1] <= bin && bin <= pl->top[1]);
}

/* The running mass before a candidate of range 1 (else 0), given the mass of
 * the list's candidates before it (before): range 0's are all before range 1's. */
static __device__ __forceinline__ u64 range_start(const gather_plan *pl, bool one, u64 before) {
    return one ? pl->above[1] + before - pl->mass0 : pl->above[0] + before;
}

/* The same for sorted candidate i: the list holds range 0's candidates, then range 1's. */
static __device__ __forceinline__ u64 listed_start(const gather_plan *pl, int i, u64 before) {
    return range_start(pl, i >= (int)pl->count0, before);
}

/* Whether the candidate at running mass start (its mass, its index) spans
 * round r's target; if so, it and the mass through it go to sh. */
static __device__ __forceinline__ bool spans(pick_shared *sh, int r, u64 target, u64 start,
                                             u64 mass, long long index) {
    if (!(start <= target && target < start + mass)) return false;
    sh->found[r] = index, sh->through[r] = start + mass;
    return true;
}

/* A list's two rounds, find(r, target) telling whether round r's target fell
 * on a candidate (spans, then a barrier): the cut's where the plan has one,
 * whose mass through it scales the draw's; the draw's token, or -1 where a
 * target falls outside the list. */
template <class F>
static __device__ long long cut_then_draw(const pick_shared *sh, float topp, float coin, F find) {
    u64 through = sh->plan.whole;
    if (sh->plan.cut) {
        if (!find(0, (u64)(topp * ONE))) return -1;
        through = sh->through[0];
    }
    return find(1, draw_target(coin, through)) ? sh->found[1] : -1;
}

/*
 * The token from the m <= RANKED gathered candidates, in run.c's order (p
 * descending, then index) without sorting them: the mass before each
 * candidate there is the mass of the smaller keys in the list, which `lanes`
 * consecutive threads a candidate (the most that fit a power of two) add up,
 * each over its contiguous part of the list, eight keys a batch of loads,
 * then by shuffles; its running mass from the plan's range its bin lies
 * in; then the cut's candidate, where the cut is among them, and the draw's.
 * -1 where a target falls outside them (the plan says it cannot), for the
 * radix way. Two barriers. The masses fit 32 bits: the list's sum to at most
 * one probability (2^31) and a rounding each.
 *
 * The simplest of the forms measured, and no slower (doc/performance.md).
 */
static __device__ long long select_ranked(pick_shared *sh, int m, float topp, float coin) {
    const gather_plan *pl = &sh->plan;
    const int batch = 8; /* keys a batch: its loads in flight at once */
    int lanes = 1;
    while (lanes < 32 && lanes * 2 * m <= THREADS) lanes *= 2;
    int part = (int)threadIdx.x % lanes, i = (int)threadIdx.x / lanes;
    int chunk = ((m + lanes - 1) / lanes + batch - 1) / batch * batch; /* aligns the loads */
    int lo = i < m ? min(m, part * chunk) : 0, hi = i < m ? min(m, lo + chunk) : 0;
    u64 key = i < m ? sh->cand_key[i] : 0;
    unsigned before = 0;
    int j = lo;
    for (; j + batch <= hi; j += batch) {
        ulonglong2 k[batch / 2];
        uint4 w[batch / 4];
#pragma unroll
        for (int e = 0; e < batch / 2; e++) k[e] = *(const ulonglong2 *)&sh->cand_key[j + 2 * e];
#pragma unroll
        for (int e = 0; e < batch / 4; e++) w[e] = *(const uint4 *)&sh->cand_mass[j + 4 * e];
#pragma unroll
        for (int e = 0; e < batch / 4; e++)
            before += (k[2 * e].x < key ? w[e].x : 0u) + (k[2 * e].y < key ? w[e].y : 0u) +
                      (k[2 * e + 1].x < key ? w[e].z : 0u) + (k[2 * e + 1].y < key ? w[e].w : 0u);
    }
    for (; j < hi; j++) before += sh->cand_key[j] < key ? sh->cand_mass[j] : 0u;
    for (int d = 1; d < lanes; d <<= 1) before += __shfl_xor_sync(FULL, before, d);
    bool listed = i < m && part == 0;
    u64 mass = listed ? sh->cand_mass[i] : 0; /* 0: matches no target */
    int bin = listed ? (int)((listed_bits(sh, i) - sh->base) >> sh->shift0) : 0;
    u64 start = range_start(pl, bin < pl->bottom[0], before);
    return cut_then_draw(sh, topp, coin, [&](int r, u64 target) {
        bool mine = listed && spans(sh, r, target, start, mass, listed_index(sh, i));
        return __syncthreads_or(mine) != 0;
    });
}

/*
 * The token from m > RANKED gathered candidates (m <= E x THREADS), as
 * select_ranked, whose passes over the others grow as m x m: their keys
 * sorted ascending instead (a bitonic sort over the next power of two, padded
 * with the largest key; candidate i held by thread i % THREADS as its
 * (i / THREADS)-th, its partner within the warp by a shuffle, in another warp
 * through the list's room, else in the thread's own registers), then a block
 * scan of their masses (each from its key's p, as list_put's) for the mass
 * before each. Faster than select_ranked past RANKED candidates, slower
 * below (its passes' fixed cost).
 */
template <int E>
static __device__ long long select_sorted(pick_shared *sh, int m, float topp, float coin) {
    const gather_plan *pl = &sh->plan;
    int size = 64;
    while (size < m) size <<= 1;
    const int t = (int)threadIdx.x;
    u64 key[E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        int i = t + e * THREADS;
        key[e] = i < m ? sh->cand_key[i] : ~0ull;
    }
    auto keep = [](u64 mine, u64 other, int i, int j, int k) { /* i's key after comparing with i ^ j's */
        bool low = (i & j) == 0, up = (i & k) == 0;
        return (low == up) == (mine < other) ? mine : other;
    };
    for (int k = 2; k <= size; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            if (j >= THREADS) { /* partners in this thread's own registers (the distance
                                 * d a constant, so that key stays in registers) */
#pragma unroll
                for (int d = 1; d < E; d <<= 1)
#pragma unroll
                    for (int e = 0; e < E; e++)
                        if (j == d * THREADS && !(e & d)) {
                            u64 lo = key[e], hi = key[e | d];
                            bool up = ((t + e * THREADS) & k) == 0;
                            key[e] = up == (lo < hi) ? lo : hi, key[e | d] = up == (lo < hi) ? hi : lo;
                        }
            } else if (j >= 32) { /* partners in another warp */
                __syncthreads(); /* the last such pass's reads are done */
#pragma unroll
                for (int e = 0; e < E; e++)
                    if (t + e * THREADS < size) sh->cand_key[t + e * THREADS] = key[e];
                __syncthreads();
#pragma unroll
                for (int e = 0; e < E; e++) {
                    int i = t + e * THREADS;
                    if (i < size) key[e] = keep(key[e], sh->cand_key[i ^ j], i, j, k);
                }
            } else {
#pragma unroll
                for (int e = 0; e < E; e++)
                    key[e] = keep(key[e], __shfl_xor_sync(FULL, key[e], j), t + e * THREADS, j, k);
            }
        }
    u64 start[E], mass[E], before = 0;
#pragma unroll
    for (int e = 0; e < E; e++) {
        int i = t + e * THREADS;
        mass[e] = i < m ? fixed(__int_as_float((int)(0x7fffffffu - (unsigned)(key[e] >> 32)))) : 0;
        u64 total;
        start[e] = listed_start(pl, i, before + block_scan(mass[e], sh->part, &total));
        before += total;
    }
    return cut_then_draw(sh, topp, coin, [&](int r, u64 target) {
        bool mine = false;
#pragma unroll
        for (int e = 0; e < E; e++)
            mine |= spans(sh, r, target, start[e], mass[e], (long long)(key[e] & 0xffffffffu));
        return __syncthreads_or(mine) != 0;
    });
}

/* The token from m <= 32 gathered candidates, as select_ranked: lane i
 * holds the i-th in run.c's order after a bitonic sort across the warp; a
 * scan of the masses, then a ballot for each target. The other warps wait at
 * one barrier. */
static __device__ long long select_warp(pick_shared *sh, int m, float topp, float coin) {
    const gather_plan *pl = &sh->plan;
    if (threadIdx.x < 32) {
        int lane = threadIdx.x;
        u64 key = lane < m ? sh->cand_key[lane] : ~0ull;
        for (int k = 2; k <= 32; k <<= 1)
            for (int j = k >> 1; j > 0; j >>= 1) {
                u64 other = __shfl_xor_sync(FULL, key, j);
                bool low = (lane & j) == 0, up = (lane & k) == 0 || k == 32;
                key = (low == up) == (key < other) ? key : other;
            }
        unsigned bits = 0x7fffffffu - (unsigned)(key >> 32);
        u64 mass = lane < m ? fixed(__int_as_float((int)bits)) : 0, run = mass;
        for (int d = 1; d < 32; d <<= 1) {
            u64 y = __shfl_up_sync(FULL, run, d);
            if (lane >= d) run += y;
        }
        run -= mass; /* the mass before this candidate */
        u64 start = listed_start(pl, lane, run);
        auto find = [&](u64 target, u64 *through) -> long long { /* -1: none */
            unsigned hit = __ballot_sync(FULL, start <= target && target < start + mass);
            if (!hit) return -1;
            int at = __ffs(hit) - 1;
            *through = __shfl_sync(FULL, start + mass, at);
            return (long long)(__shfl_sync(FULL, key, at) & 0xffffffffu);
        };
        u64 through = pl->whole;
        long long token = pl->cut ? find((u64)(topp * ONE), &through) : 0;
        if (token >= 0) token = find(draw_target(coin, through), &through);
        if (lane == 0) sh->found[0] = token;
    }
    __syncthreads();
    return sh->found[0];
}

/* select_warp where a warp holds them all (a peaked row's usual few), else
 * select_ranked, or select_sorted for long lists. */
static __device__ long long select_listed(pick_shared *sh, float topp, float coin) {
    int m = min(sh->listed, CAP);
    return m <= 32       ? select_warp(sh, m, topp, coin)
           : m <= RANKED  ? select_ranked(sh, m, topp, coin)
           : m <= THREADS ? select_sorted<1>(sh, m, topp, coin)
                          : select_sorted<CAP / THREADS>(sh, m, topp, coin);
}

#endif
