/*
 * sample.cu — MK_KERNEL_SAMPLE on the GPU: run.c's sampler (core/sample.c
 * says what it computes) over rows of logits [rows, n], the temperature and
 * top-p read on the device, so that a step loop samples without the host.
 *
 * One launch: each row is a cluster of G blocks of 512 threads (G grows with
 * n, up to 16 where the device schedules such clusters, else 8, a portable
 * cluster; a 32,000-way row spreads over 16 SMs) that meet at cluster
 * barriers. What a block passes on it pushes into the shared memory of the
 * blocks that read it before the barrier, so that after it every read is
 * local (but the reads of the merged histogram):
 *
 *   1  each block: the max of x / t over its range (held in registers
 *      through the phases, where it fits) and the sum of
 *      expf(x / t - that max), pushed to every block (t <= 0: its argmax,
 *      and the lead block, rank 0, takes the row's best from the blocks');
 *   2  each block: the row's max and sum from the blocks' (each block's sum
 *      rescaled to the row's max), p = expf(x / t - max) x (1 / sum), and
 *      either its range's mass (multinomial) or its histogram of the top-p
 *      candidates (p >= cutoff), each bin added into one block's (G share
 *      the bins), from where every block reads them: mass and count per bin
 *      of the top 11 bits of a candidate's key (its probability's bits
 *      less the cutoff's, so that the bins span only [cutoff, the row's
 *      largest p], finely: a flat row of 32,000 spreads over hundreds of
 *      bins, not two). Multinomial: the lead draws the coin (run.c's
 *      xorshift64*, bit for bit) and takes the block, then the index, where
 *      the running mass first exceeds it.
 *   3  top-p, no full sort: every block makes the same plan from the
 *      histogram (no plan to pass on, no barrier): the bin where the mass
 *      from the top crosses topp (the cut), and the bins where the draw's
 *      target r = coin x the mass through the cut can fall (it rises with
 *      that mass, which lies within the cut's bin); then gathers its share
 *      of those bins' candidates into the lead's list. The lead places each
 *      candidate in run.c's order (p descending, then index) with the mass
 *      before it there (a pass over the list for each, or a bitonic sort of
 *      a list longer than RANKED), and reads the cut's mass, then the
 *      draw's candidate. More candidates than the list holds (a
 *      flat row, many equal values): the lead selects by radix instead, 11
 *      bits a level: the bin where the mass crosses, its candidates gathered
 *      (once few enough) and the next levels' histograms made of them; equal
 *      probabilities go by index.
 *
 * p is never stored: a phase that needs it again recomputes it from the
 * logits (row_probs), since the stores would hold up the next barrier.
 *
 * Long because it is one op's whole kernel: the cluster's phases, the plan
 * and the ranked or sorted list, and the radix selection the list falls back
 * to, which share the row's shared-memory layout (pick_shared), its block
 * scans and the keys (key_frame); split the radix selection into its own file
 * if a second op comes to need it. About an eighth of it is the measurements
 * below and beside the kernel (what was tried and why it was not kept), and
 * its MK_CUDA_TIMELINE stamps (struct stamps), which mirror the generated
 * kernels' (kernels/skeletons/fault.cuh) but for a 2-D grid, switched by a
 * template parameter and given their words by the host.
 *
 * Masses are fixed point (round(p x 2^31), summed in 64 bits), not run.c's
 * float32 sums in its order: the same on every run, and within about 1e-7 a
 * term (and a relative few 1e-6, the row's sum's) of exact sums. run.c's
 * float32 sums stray further on long rows, so a token may differ from run.c's
 * (and the CPU's) where the coin, or top-p's running sum, falls within
 * run.c's rounding of the boundary between two tokens: CUDA's is then the
 * exact sums' token. sample_spec's GPU case checks that, and met both: a row
 * of 513 logits of 3 values where run.c's running sum at the cut was
 * 0.970000803 against topp 0.970000029 (0.9699993 exact), the cut a
 * candidate later and the draw with it; and one of 70,000 where run.c's sum
 * of the exponentials was off by 3.2e-4 of itself, the cut 151 candidates
 * apart.
 *
 * Where the time goes: clock64 in the lead's thread 0 (a patch, not kept), on
 * the H200 at 67208a0, stories15M's random rows at -t 1 -p 0.9 (flat: about
 * 32,000 candidates, lists of 60 to 250), mean cycles of 16 draws: the wait
 * 220, the loads and the block's max 2,200, its exp-sum 1,270, barrier 1
 * 1,300, the merge 480, p and the histogram 1,540, the bins' merge and
 * barrier 2 2,200, reading them 360, the plan 3,330, the gather 1,550,
 * barrier 3 (the last block's gather) 1,620, select_ranked 4,230, the rest
 * 830: 21,100 in all, against about 8 us between greedy and sampled decoding.
 * Again at 71a4802, each phase's cost in whole steps: a patch (not kept)
 * ended the kernel after a phase with a wrong token, so that the step lost
 * the phases after it; stories15M -t 1 -p 0.9 on the H200, tok/s in three
 * rounds (greedy 13,831 / 13,564 / 13,825): the whole sampler 12,123 /
 * 12,077 / 11,967, ended before the selection 12,466 / 12,525 / 12,832,
 * before the gather 12,777 / 12,865 / 13,020, before the plan 12,999 /
 * 12,984 / 12,989; in two rounds, before the histogram 13,780 / 13,630,
 * before barrier 1 14,023 / 13,799, after the loads 14,223 / 13,941. In us a
 * token: the selection 3.6, the gather and barrier 3 1.7, the plan 0.6, p,
 * the histogram, its merge and barrier 2 4.0, barrier 1 and the merge 1.1,
 * the max and sum 0.9: 11.9 past the loads, where within 5 % of greedy
 * leaves 5.6.
 * The lists were 32 to 287 candidates (mostly 64 to 160), the radix way never
 * taken. Nor is it the flat rows' long lists that cost most: the same model
 * with its rms_final weights 4 and 8 times larger (logits as much larger,
 * peaked rows, short lists), in one call, two rounds, read greedy 13,663 /
 * 13,945 and 13,982 / 13,727 tok/s, sampled 12,550 / 12,680 and 12,533 /
 * 12,859: 8.6 and 8.4 % slower, against 12 % for the random rows in that
 * call.
 * Gathering with one atomic a block (a block scan) in place of one a warp
 * moved barrier 3 not at all (1,616 / 1,588) and the gather from 1,550 to
 * 2,160; not kept. Nor phase 1 made by the classifier: the matrix-vector
 * launch whose only result the sampler reads wrote, beside the logits, each
 * block's max and sum of expf(x / t - max / t) at the sampler's temperature
 * (a barrier at each block's end), and every block of the sampler merged
 * those (2,000 pairs for a 32,000-way row) in place of its own reductions and
 * barrier 1. On the H200 at b1be62d (-t 1 -p 0.9, 256 tokens, one call),
 * stories110M went from 4,844 / 4,848 to 4,802 / 4,777 tok/s and stories15M
 * from 12,487 / 12,490 to 12,217 / 12,180; with the sampler ignoring the
 * statistics, 4,809 / 4,755 and 12,269 / 11,999: the classifier's blocks
 * lost more than the sampler saved. Nor, with HBM idle while the sampler
 * runs, its blocks sending the next step's first weights to L2
 * (prefetch.global.L2 of the constant weights of the launches before it, in
 * order, up to a budget): on the H200 at fd767c1 (-t 1 -p 0.9, one call,
 * two rounds), stories15M went from 12,247 / 12,519 to 10,975 / 11,109
 * tok/s with 24 MB sent by the blocks other than the lead as they leave,
 * 10,681 / 10,731 by every block after phase 1, and 10,249 / 10,165 with
 * 40 MB as they leave; stories110M from 4,821 / 4,798 to 4,684 / 4,633,
 * 4,630 / 4,608 and 4,436 / 4,422. Likely because the launch ends only once
 * every block has issued its share, and the next step waits for that
 * (a patch, not kept).
 */
#include "cuda_device.h"
#include "reduce.h"

#include <cooperative_groups.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <math.h>

/* Threads a block. 256 (8 held a thread, 152 registers) lost on the H200 at
 * ebcf7c0: stories15M -t 1 -p 0.9 12,248 / 12,407 / 12,400 tok/s against
 * 12,517 / 12,530 / 12,435, stories110M 4,784 against 4,834, in one call. */
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

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
/* Before sm_90 the sampler is empty (no clusters; see sample_rows), so its
 * device functions go unused there. */
#pragma nv_diag_suppress 177
#endif

/* A row's level-0 histogram in the scratch (core/internal.h), where the
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

/* Programmatic dependent launch (where mk_cuda_sample launches with it): let
 * the next launch be scheduled at once, so that its blocks load their weights
 * while this one runs (it waits for this one before reading what this one
 * writes); then wait for the launch before to finish. */
static __device__ __forceinline__ void pdl_enter() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* MK_CUDA_TIMELINE's stamps of a block (cuda_device.h) in a kernel made
 * with them (ON), where tl, the launch's first, is not NULL and the block is
 * among the first MK_TIMELINE_BLOCKS: its start, the end of its wait and, as
 * each warp leaves, its end. Without, nothing. */
template <bool ON>
struct stamps {
    unsigned long long *t;
    static __device__ __forceinline__ unsigned long long now() {
        unsigned long long v;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
        return v;
    }
    static __device__ __forceinline__ unsigned long long block() {
        return (unsigned long long)blockIdx.x * gridDim.y + blockIdx.y;
    }
    __device__ stamps(unsigned long long *tl)
        : t(ON && tl && block() < MK_TIMELINE_BLOCKS ? tl + 3 * block() : nullptr) {
        if (ON && t && threadIdx.x == 0) t[0] = now();
    }
    __device__ void waited() const {
        if (ON && t && threadIdx.x == 0) t[1] = now();
    }
    __device__ ~stamps() {
        if (ON && t && (threadIdx.x & 31) == __ffs(__activemask()) - 1) atomicMax(t + 2, now());
    }
};

/* A cluster barrier in halves: every block arrives once it has started (no
 * memory order), and waits before it first touches another block's shared
 * memory, which it may only do once that block runs.
 *
 * The other barriers (cluster.sync) order the blocks' writes into each
 * other's shared memory, and cost: on sm_90 the arrive's release compiles to
 * MEMBAR.ALL.GPU (then ERRBAR, CGAERRBAR, UCGABAR_ARV), the wait to
 * UCGABAR_WAIT and CCTL.IVALL; fence.acq_rel.cluster and fence.release.cluster
 * before a relaxed arrive compile to the same MEMBAR.ALL.GPU (cuobjdump, CUDA
 * 13.0). Under ncu memory barriers take 1.5 of the 11.8 cycles a warp spends
 * per instruction issued (stories15M's random rows). What would avoid them:
 * the async proxy, st.async / red.async into the receiver's shared memory
 * with mbarrier::complete_tx, each block waiting on its own mbarrier for the
 * bytes it expects (known for the max and sum and for a fixed histogram
 * slice; the gather would send its count first). Not tried here; in the
 * attention's cluster combine (codegen.cu) it moved the launch from 4.12 to
 * 4.08 us a layer, tok/s within noise. */
static __device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

static __device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

/* ---- radix selection (the lead block, where the list cannot) ------------------------- */

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

/* The first index whose running mass exceeds the coin's, the g blocks' masses
 * in sh->masses; n - 1 where none does. */
static __device__ long long select_mult(pick_shared *sh, const row_probs &p, long long n, int g,
                                        float coin) {
    u64 target = (u64)(coin * ONE);
    if (threadIdx.x == 0) {
        u64 acc = 0;
        sh->bin = -1;
        for (int b = 0; b < g && sh->bin < 0; b++) {
            if (acc + sh->masses[b] > target) sh->bin = b, sh->above = acc;
            acc += sh->masses[b];
        }
        sh->index = n - 1;
    }
    __syncthreads();
    if (sh->bin < 0) return n - 1;
    long long blo, bhi, lo, hi;
    share(n, sh->bin, g, &blo, &bhi);
    share(bhi - blo, threadIdx.x, THREADS, &lo, &hi);
    lo += blo, hi += blo;
    u64 mass = 0, total;
    for (long long j = lo; j < hi; j++) mass += fixed(p.at(j));
    u64 before = sh->above + block_scan(mass, sh->part, &total);
    if (before <= target && target < before + mass)
        for (long long j = lo; j < hi; j++)
            if ((before += fixed(p.at(j))) > target) {
                sh->index = j;
                break;
            }
    __syncthreads();
    return sh->index;
}

/* ---- top-p: the plan, the gathered list, its sort ------------------------------- */

/*
 * sh->plan for the row: the cut (topp's mass T) falls in level-0 bin b1 at a
 * running mass C in (T, T + the largest mass a candidate of b1 may have] and
 * in (A1, A1 + M1], b1's span, so the draw's target lies between draw_target
 * of the ends of both (it rises with the cut's mass); the bins of that span
 * and b1 are the ones to gather. (With A1 and M1 alone, a flat row's span
 * often reached a second bin: lists of about 130 candidates on average,
 * against 110 with the candidate's bound, stories15M at -t 1 -p 0.9.) Where
 * the cut takes every candidate, the draw's target is known and one bin does.
 * ranges 0: more candidates than the list holds, or none with mass. A block
 * plans from the row's histogram in its sh (every block the same plan); each
 * thread holds BINS / THREADS of its bins, top down, and where they start
 * (mass and count from the top, one scan); the thread whose bins hold a
 * target says so, the cut's first, then both of the draw's: three barriers in
 * all. 3,330 cycles on the H200 (stories15M's random rows, 16 draws' mean);
 * planned by the first warp alone (64 bins a lane, the lane holding a target
 * scanning its bins; no barrier) it took 12,000, and decoding lost 5 %: not
 * kept.
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
 * Measured on the H200 (stories15M -t 1 -p 0.9, lists of about 100): this
 * form (at 71a4802 and after) reads 12,260 / 12,255 / 12,285 tok/s against
 * 12,232 / 12,234 / 12,306 for the one before, which counted every lanes-th
 * key a thread and added a group's counts by shared atomics (four barriers):
 * no faster, but simpler. One key a thread without lanes was no faster
 * either; nor batches looped without unrolling. clock64 in the lead put the
 * pass at about 3,800 cycles in every form, far more than its loads and
 * compares: under ncu (--per-token, one launch) the kernel's warps issue an
 * instruction every 11.8 cycles, stalled on fixed-latency dependencies
 * (2.6), barriers (2.1), memory barriers (1.5, the cluster barriers'
 * release) and shared loads (1.4); instruction fetch only 0.4.
 * Earlier, on the H200, cycles a call for m 64 / 100 / 150 / 256: 3,000 /
 * 4,800 / 8,900 / 12,500 where a warp reduction over part of a warp added the
 * groups' counts (a slow path), 2,500 / 3,200 / 5,400 / 8,800 with the
 * atomics. Nor placing only the candidates of the level-0 bin a target falls
 * in (the mass above it from the histogram; the draw's bin found by a warp's
 * scan of the plan's range): the list is the few bins the targets may fall
 * in, so a bin held most of it, and a thread a candidate passing over its bin
 * took longer than the lane groups. On the H200 at d3b2779 (stories15M -t 1
 * -p 0.9, two rounds in one call, the same text) 12,492 / 12,479 and 12,179 /
 * 12,239 tok/s went to 11,863 / 11,875 and 12,039 / 12,113.
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
 * before each. Measured alone on an H100, cycles a call for m 256 / 512 /
 * 1,000 / 2,000: 6,700 / 8,400 / 21,500 / 27,600, against select_ranked's
 * 7,600 / 26,000 / 130,000 / 258,000 (4 candidates a thread past 512); for m
 * 64 / 173 it took 4,200 / 6,800 against 2,100 / 4,900 (its 20 to 36 passes
 * cost about 200 cycles each), which is why it only takes the long lists.
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

/* ---- the kernel ------------------------------------------------------------------- */

/*
 * One row per cluster of g blocks (block rank b; the lead, rank 0, selects).
 * Every path ends in a cluster barrier before a block leaves while another
 * may still read its shared memory. HOLD: each thread holds its logits, then
 * their p, in registers from one load to the gather (a 32,000-way row: 8 a
 * thread), so that the phases wait on memory once; else each phase reads
 * them again. Its 112 registers a thread leave no room beside a block of
 * the classifier before it; capped (__maxnreg__) at 104 / 96 / 80 / 64, so
 * that the cluster might start while the classifier's last blocks run, the
 * H200 at 1fcc590 read stories15M -t 1 -p 0.9 at 12,166 / 12,506, 12,356 /
 * 12,302, 12,248 / 12,405 and 12,040 / 12,043 tok/s against 12,217 / 12,463,
 * stories110M 4,841 / 4,800 to 4,738 / 4,790 against 4,828 / 4,818: no gain.
 * STAMPED: with MK_CUDA_TIMELINE's stamps (tl), a kernel of its own, so that
 * the sampler without them is as it was (the stamps took 2 registers).
 */
template <bool HOLD, bool STAMPED>
static __global__ void __launch_bounds__(THREADS, 1)
sample_rows(long long *out, const float *logits, const long long *state, const float *temp,
            const float *topp_in, long long n, char *scratch, unsigned long long *tl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    /* No clusters before sm_90: the plugin's machine code for older GPUs (make's
     * CUDA_ARCH) has an empty sampler, which mk_cuda_sample never launches there. */
}
#else
    __shared__ pick_shared sh;
    stamps<STAMPED> st(tl);
    pdl_enter();
    st.waited();
    cg::cluster_group cluster = cg::this_cluster();
    int b = (int)cluster.block_rank(), g = (int)cluster.num_blocks();
    cluster_arrive();
    pick_shared *lead = cluster.map_shared_rank(&sh, 0);
    long long row = blockIdx.x, lo, hi;
    const float *x = logits + row * n;
    float t = *temp, topp = *topp_in;
    long long seed = state[row]; /* loaded now, used after the barriers */
    share(n, b, g, &lo, &hi);
    float held[HELD];
    if (HOLD) {
#pragma unroll
        for (int k = 0; k < HELD; k++) {
            long long j = lo + threadIdx.x + (long long)k * THREADS;
            held[k] = j < hi ? x[j] : 0.0f;
        }
    }
    for (int k = threadIdx.x; k < BINS; k += THREADS) sh.mass[k] = sh.count[k] = 0;
    if (threadIdx.x == 0) sh.listed = 0;
    if (!(t > 0.0f)) { /* argmax, as core/sample.c's: NaN never wins but a NaN at 0 does */
        float v = -INFINITY;
        long long best = 0x7fffffffffffffffLL;
        each<HOLD>(held, x, lo, hi, [&](float y, long long j) {
            if (isnan(y)) y = -INFINITY;
            if (better(y, j, v, best)) v = y, best = j;
        });
        block_argmax(&v, &best, &sh);
        if (threadIdx.x == 0) sh.block_max = v, sh.block_best = best;
        cluster_wait();
        cluster.sync();
        if (b == 0 && threadIdx.x < 32) {
            v = -INFINITY, best = 0x7fffffffffffffffLL;
            for (int k = threadIdx.x; k < g; k += 32) {
                const pick_shared *o = cluster.map_shared_rank(&sh, k);
                if (better(o->block_max, o->block_best, v, best))
                    v = o->block_max, best = o->block_best;
            }
            warp_argmax(&v, &best);
            if (threadIdx.x == 0)
                out[2 * row] = isnan(x[0]) ? 0 : best, out[2 * row + 1] = state[row];
        }
        cluster.sync();
        return;
    }
    /* the block's max of x / t, as its max of x over t (a division by t > 0
     * keeps the order), and sum of expf(x / t - that max); held takes x / t */
    float m = -INFINITY, sum = 0.0f;
    each<HOLD>(held, x, lo, hi, [&](float y, long long) { m = fmaxf(m, y); });
    m = block_reduce<true>(m, sh.fpart) / t;
    if (HOLD) {
#pragma unroll
        for (int k = 0; k < HELD; k++)
            if (lo + threadIdx.x + (long long)k * THREADS < hi) {
                held[k] /= t;
                if (m > -INFINITY) sum += expf(held[k] - m);
            }
    } else if (m > -INFINITY) {
        for_each_in(x, lo, hi, [&](float y, long long) { sum += expf(y / t - m); });
    }
    sum = block_reduce<false>(sum, sh.fpart);
    cluster_wait(); /* every block runs */
    if (threadIdx.x < g) { /* pushed into every block's room */
        pick_shared *o = cluster.map_shared_rank(&sh, threadIdx.x);
        o->max[b] = m, o->sum[b] = sum;
    }
    cluster.sync();
    /* the row's from the blocks' (each rescaled to the row's max), summed in
     * their order by one warp (every thread making the same terms held the
     * block up for as long as the rest of the phase) */
    if (threadIdx.x < 32) {
        int k = threadIdx.x;
        float mk = k < g ? sh.max[k] : -INFINITY, max = warp_max(mk);
        float term = k < g && mk > -INFINITY ? sh.sum[k] * expf(mk - max) : 0.0f;
        sum = 0.0f;
#pragma unroll
        for (int j = 0; j < MAX_CLUSTER; j++) sum += __shfl_sync(FULL, term, j);
        if (k == 0) sh.row_max = max, sh.row_sum = sum;
    }
    __syncthreads();
    float max = sh.row_max;
    sum = sh.row_sum;
    /* p, and the block's mass (multinomial) or its candidates' histogram (top-p) */
    bool mult = topp <= 0.0f || topp >= 1.0f; /* as run.c: a NaN topp takes top-p */
    float cutoff = (1.0f - topp) / (float)(n - 1);
    float pmax = 1.0f / sum; /* the max's p: every p is at most it */
    row_probs p = {x, t, max, pmax};
    unsigned base;
    int shift0;
    key_frame(cutoff, pmax, &base, &shift0);
    if (threadIdx.x == 0) sh.base = base, sh.shift0 = shift0;
    u64 mass = 0;
    auto to_p = [&](float v) { /* v: x / t, then p */
        v = expf(v - max) * pmax; /* row_probs' p */
        if (mult)
            mass += fixed(v);
        else if (v >= cutoff)
            histogram_add(sh.mass, sh.count, min((int)((bits_of(v) - base) >> shift0), BINS - 1),
                          fixed(v));
        return v;
    };
    if (HOLD) {
#pragma unroll
        for (int k = 0; k < HELD; k++) {
            long long j = lo + threadIdx.x + (long long)k * THREADS;
            if (j < hi) held[k] = to_p(held[k]);
        }
    } else {
        for_each_in(x, lo, hi, [&](float y, long long) { to_p(y / t); });
    }
    /* the block's mass, pushed into the lead's, or its histogram, merged */
    if (mult) {
        u64 total;
        block_scan(mass, sh.part, &total);
        if (threadIdx.x == 0) lead->masses[b] = total;
    } else { /* each bin merges in one block, bin_owner's */
        __syncthreads();
        for (int k = threadIdx.x; k < BINS; k += THREADS)
            if (unsigned c = sh.count[k]; c && bin_owner(k, g) != b) {
                pick_shared *o = cluster.map_shared_rank(&sh, bin_owner(k, g));
                atomicAdd(&o->mass[k], sh.mass[k]), atomicAdd(&o->count[k], c);
            }
    }
    cluster.sync();
    if (!mult) { /* every block reads the merged bins, four a load */
        for (int k = 4 * threadIdx.x; k < BINS; k += 4 * THREADS)
            if (int o = bin_owner(k, g); o != b) {
                const pick_shared *from = cluster.map_shared_rank(&sh, o);
                uint4 m4 = *(const uint4 *)&from->mass[k], c4 = *(const uint4 *)&from->count[k];
                *(uint4 *)&sh.mass[k] = m4, *(uint4 *)&sh.count[k] = c4;
            }
        __syncthreads();
    }
    u64 next;
    float coin = coin_of(seed, &next);
    long long token = -1;
    if (mult) {
        if (b != 0) return;
        token = select_mult(&sh, p, n, g, coin);
    } else {
        /* top-p: every block makes the same plan from the same bins (no plan
         * to pass on, no barrier), then gathers its planned candidates into
         * the lead's list, a warp at a time */
        plan_gather(&sh, topp, coin);
        __syncthreads();
        if (sh.plan.ranges) {
            auto each_p = [&](auto f) { /* f(p, j) over the block's range */
                if constexpr (HOLD)
                    each<true>(held, x, lo, hi, f);
                else
                    for_each_in(x, lo, hi, [&](float y, long long j) { f(p.of(y), j); });
            };
            unsigned mine = 0, lane = threadIdx.x % 32, at;
            each_p([&](float v, long long) { mine += planned(&sh, v, cutoff); });
            at = mine;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                unsigned y = __shfl_up_sync(FULL, at, d);
                if (lane >= d) at += y;
            }
            unsigned total = __shfl_sync(FULL, at, 31), start = 0;
            if (lane == 31 && total) start = (unsigned)atomicAdd(&lead->listed, (int)total);
            at = __shfl_sync(FULL, start, 31) + at - mine;
            if (mine)
                each_p([&](float v, long long j) {
                    if (planned(&sh, v, cutoff) && at < CAP)
                        list_put(lead, at++, v, j);
                });
        }
        cluster.sync();
        if (b != 0) return;
        if (sh.plan.ranges) token = select_listed(&sh, topp, coin);
        if (token < 0) { /* the radix way, from the histogram in the scratch */
            row_book *bk = book_of(scratch, row);
            for (int k = threadIdx.x; k < BINS; k += THREADS)
                bk->mass[k] = sh.mass[k], bk->count[k] = sh.count[k];
            __syncthreads();
            token = select_topp(&sh, bk, p, n, topp, cutoff, pmax, coin);
        }
    }
    if (threadIdx.x == 0) out[2 * row] = token, out[2 * row + 1] = (long long)next;
}
#endif

/* Launches the kernel over rows clusters of g blocks, with programmatic
 * dependent launch where the model's generated kernels have it (s->pdl:
 * sm_90+, MK_PDL not 0). */
template <typename... P, typename... A>
static cudaError_t launch(const mk_cuda_state *s, unsigned rows, unsigned g, void (*kernel)(P...),
                          A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(rows, g);
    cfg.blockDim = dim3(THREADS);
    cfg.stream = s->stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1, attr[0].val.clusterDim.y = g, attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = s->pdl ? 2 : 1;
    return cudaLaunchKernelEx(&cfg, kernel, (P)args...);
}

/* The most blocks a row's cluster may take with kernel: MAX_CLUSTER where
 * the device schedules clusters that wide (a non-portable size, which sm_90
 * offers; a 32,000-way row then spreads over 16 SMs, so each does half the
 * work of 8), else PORTABLE. Fewer blocks a row (fewer to wait for at each
 * cluster barrier) lost on the H200 at e6ab33c, stories15M -t 1 -p 0.9 in one
 * call, tok/s: 16 blocks 12,297 / 12,183, 8 12,271 / 12,224, 4 (not holding
 * the row in registers) 11,093 / 10,915, 4 holding 16 a thread 11,529 /
 * 11,805, 2 9,828 / 9,735; MK_CUDA_TIMELINE put the sampler at 10.6 / 11.5 /
 * 15.9 us (16, 8, 4 holding); stories110M 4,831 / 4,825 / 4,681 (16, 8, 4
 * holding). */
template <typename K>
static long long widest_cluster(K kernel) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, MAX_CLUSTER);
    cfg.blockDim = dim3(THREADS);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1, attr.val.clusterDim.y = MAX_CLUSTER, attr.val.clusterDim.z = 1;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
            cudaSuccess ||
        cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
        cudaGetLastError(); /* not an error of the launch: the portable size then */
        return PORTABLE;
    }
    return clusters > 0 ? MAX_CLUSTER : PORTABLE;
}

/* A launch's rows of n logits, and the blocks g of each row's cluster. */
static void clusters_of(const mk_launch *l, long long *rows, long long *n, long long *g) {
    const mk_tensor *x = &l->in[0];
    *n = x->shape[x->rank - 1], *rows = mk_tensor_numel(x) / *n;
    *g = (*n + THREADS * PER_THREAD - 1) / (THREADS * PER_THREAD);
    long long widest = min(widest_cluster(sample_rows<true, false>),
                           widest_cluster(sample_rows<false, false>));
    widest = min(widest, min(widest_cluster(sample_rows<true, true>),
                             widest_cluster(sample_rows<false, true>)));
    *g = *g < widest ? *g : widest;
}

unsigned int mk_cuda_sample_blocks(const mk_launch *l) {
    long long rows, n, g;
    clusters_of(l, &rows, &n, &g);
    return rows * g < 0xffffffffLL ? (unsigned int)(rows * g) : 0xffffffffu;
}

char *mk_cuda_sample_label(const mk_launch *l) {
    long long rows, n, g;
    clusters_of(l, &rows, &n, &g);
    char *label = (char *)malloc(128);
    if (label)
        snprintf(label, 128,
                 "sampler $%d: %lld rows of %lld logits, a cluster of %lld blocks a row",
                 l->node->id, rows, n, g);
    return label;
}

/* MK_KERNEL_SAMPLE: logits float32 [rows, n], state int64 [rows, 1],
 * temperature and top-p float32 [1] on the device; out int64 [rows, 2]. */
int mk_cuda_sample(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0];
    long long n, rows, g;
    clusters_of(l, &rows, &n, &g);
    if (rows > 0x7fffffffLL)
        return mk_fail(err, MK_ERR_SHAPE, l->node->line, l->node->column,
                       "SampleNode: %lld rows is more than CUDA launches", rows);
    if (n > 0x7fffffffLL) /* indices are int, sums of counts 32 bits */
        return mk_fail(err, MK_ERR_SHAPE, l->node->line, l->node->column,
                       "SampleNode: rows of %lld logits are more than CUDA's sampler takes "
                       "(2^31 - 1)", n);
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, s->device) == cudaSuccess &&
        major < 9)
        return mk_fail(err, MK_ERR_DEVICE, l->node->line, l->node->column,
                       "SampleNode: CUDA's sampler runs each row as a thread block cluster, "
                       "which needs compute capability 9.0 or later (this device's is %d.x); "
                       "sample on the CPU", major);
    char *scratch = (char *)l->scratch;
    bool hold = (n + g - 1) / g <= HELD * THREADS; /* share's longest range */
    unsigned long long *tl = mk_cuda_timeline_stamps(s, l->index);
    cudaError_t st = launch(s, (unsigned)rows, (unsigned)g,
                            tl ? (hold ? sample_rows<true, true> : sample_rows<false, true>)
                               : (hold ? sample_rows<true, false> : sample_rows<false, false>),
                            (long long *)l->out.data, (const float *)x->data,
                            (const long long *)l->in[1].data, (const float *)l->in[2].data,
                            (const float *)l->in[3].data, n, scratch, tl);
    if (st != cudaSuccess)
        return mk_cuda_fail_status(err, st, "launching the sampler", __FILE__, __LINE__);
    return mk_cuda_check_launch(l, "sample", err);
}
