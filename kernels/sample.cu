/*
 * sample.cu — MK_KERNEL_SAMPLE on the GPU: run.c's sampler (core/sample.c
 * says what it computes) over rows of logits [rows, n], the temperature and
 * top-p read on the device, so that a step loop samples without the host.
 *
 * Three launches, each G blocks of 512 threads a row (G grows with n, up
 * to 64), so that a 32,000-way row spreads over as many SMs:
 *
 *   pass 1   each block: the max of x / t over its range and the sum of
 *            expf(x / t - that max) (t <= 0: its argmax); zeroes the row's
 *            level-0 histogram
 *   pass 2   each block: the row's max and sum from the blocks' (each block's
 *            sum rescaled to the row's max), p = expf(x / t - max) / sum into
 *            the scratch, and either its range's mass (multinomial) or the
 *            level-0 histogram of the top-p candidates (p >= cutoff): mass
 *            and count per bin of the top 11 bits of a candidate's key (its
 *            probability's bits less the cutoff's, so that the bins span
 *            [cutoff, 1] finely: a flat row of 32,000 spreads over a hundred
 *            bins, not two).
 *            Multinomial: the last block to finish (a counter) draws the
 *            coin (run.c's xorshift64*, bit for bit) and takes the block,
 *            then the index, where the running mass first exceeds it.
 *   pass 3   top-p, no full sort. Every block reads the histogram and plans
 *            alike: the bin where the mass from the top crosses topp (the
 *            cut), and the bins where the draw's target r = coin x the mass
 *            through the cut can fall (it rises with that mass, which lies
 *            within the cut's bin); each gathers its share of those bins'
 *            candidates into a list. The last block sorts the list in run.c's
 *            order (p descending, then index; bitonic, in shared memory),
 *            and one scan of its masses gives the cut's mass, then the
 *            draw's candidate. More candidates than the list holds (a flat
 *            row, many equal values): the last block selects by radix
 *            instead, 11 bits a level: the bin where the mass crosses, its
 *            candidates gathered (once few enough) and the next levels'
 *            histograms made of them; equal probabilities go by index.
 *   t <= 0   block 0 of pass 2 reduces the blocks' argmaxes; the state stays
 *
 * Masses are fixed point (round(p x 2^31), summed in 64 bits), not run.c's
 * float32 sums in its order: the same on every run, within about 1e-7 a term
 * of run.c's, so a draw may differ from run.c's (and the CPU's) only where the
 * coin falls that close to the boundary between two tokens. The row's sum
 * differs from run.c's sequential one by rounding too.
 */
#include "cuda_device.h"
#include "reduce.h"

#include <math.h>

#define THREADS 512
#define WARPS (THREADS / 32)
#define PER_THREAD 4   /* elements a thread takes in a spread pass, at least */
#define MAX_BLOCKS 64
#define LEVEL_BITS 11
#define BINS (1 << LEVEL_BITS)
#define CAP 2048       /* candidates a list (pass 3, or the radix selection) holds */
#define FULL 0xffffffffu
#define ONE 2147483648.0f /* probability 1 in fixed point */

typedef unsigned long long u64;

/* A row's bookkeeping, at the head of the scratch (core/internal.h). */
typedef struct {
    unsigned mass[BINS];        /* level 0: the candidates' mass per bin */
    unsigned count[BINS];       /* level 0: the candidates per bin */
    float max[MAX_BLOCKS];      /* pass 1, per block: max of x / t (t <= 0: the best value) */
    float sum[MAX_BLOCKS];      /* pass 1: sum of expf(x / t - that max) */
    long long best[MAX_BLOCKS]; /* pass 1, t <= 0: the block's argmax */
    u64 block_mass[MAX_BLOCKS]; /* pass 2, multinomial: the block's mass */
    unsigned done;              /* pass 2 (pass 3 for top-p): blocks finished; the last selects */
    unsigned listed;            /* pass 3: the candidates gathered into list_* */
    float list_val[CAP];
    int list_idx[CAP];
} row_book;
static_assert(sizeof(row_book) <= MK_SAMPLE_ROW_BYTES, "a row's bookkeeping outgrew its room");
static_assert(CAP <= BINS, "kth_equal lists the equal candidates in a histogram's room");
static_assert(CAP % THREADS == 0, "select_listed gives each thread CAP / THREADS candidates");

/* Pass 3's plan, the same in every block of a row: the level-0 bins whose
 * candidates the blocks gather, one or two ranges of bins in run.c's order,
 * so that the selecting block sorts them and reads both draws off one scan. */
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

/* The selecting block's shared memory (pass 2's blocks make their level-0
 * histogram in mass and count too, and pass 3 sorts the gathered there). */
typedef struct {
    unsigned mass[BINS], count[BINS]; /* a level's histogram */
    float val[CAP];                   /* the gathered candidates */
    int idx[CAP];
    int listed;                       /* how many are gathered; -1: read them from p */
    u64 part[WARPS];
    float fpart[WARPS];
    long long ipart[WARPS];
    u64 above;       /* mass of the candidates before the chosen bin */
    int bin;         /* the chosen bin, -1: no bin crosses the target */
    unsigned base;   /* a candidate's key: its bits less base (key_frame) */
    int shift0;      /* level 0 bins a key's bits from shift0 up */
    gather_plan plan;
    bin_hit hit[2];  /* plan_gather: the bins its targets fall in */
    long long index; /* a result */
    int last;        /* this block is the row's last of pass 2 */
} pick_shared;
static_assert(CAP * sizeof(u64) <= 2 * BINS * sizeof(unsigned),
              "select_listed sorts in mass and count");

/* round(p x 2^31); 0 for NaN (p <= 1: the max's term is 1). */
static __device__ __forceinline__ unsigned fixed(float p) {
    return p > 0.0f ? __float2uint_rn(p * ONE) : 0u;
}

static __device__ __forceinline__ unsigned bits_of(float p) {
    return (unsigned)__float_as_int(p) & 0x7fffffffu;
}

/* Keys for the candidates p >= cutoff (cutoff > 0): a probability's bits
 * less the cutoff's, which keeps their order and spans [cutoff, 1] only; level
 * 0 bins a key by its bits from *shift0 up, the fewest that fit BINS. A cutoff
 * that no probability reaches (or none at all, -inf) keys the bits as they are. */
static __device__ __forceinline__ void key_frame(float cutoff, unsigned *base, int *shift0) {
    *base = cutoff > 0.0f && cutoff <= 1.0f ? bits_of(cutoff) : 0u;
    unsigned top = *base ? bits_of(1.0f) - *base : 0x7fffffffu;
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

/* Is this block the last of the row's g to get here? That one sees what the
 * others wrote before. */
static __device__ bool last_block(pick_shared *sh, unsigned *done, int g) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) sh->last = atomicAdd(done, 1u) == (unsigned)g - 1;
    __syncthreads();
    if (sh->last) __threadfence();
    return sh->last;
}

/* Programmatic dependent launch (where mk_cuda_sample launches with it): wait
 * for the launch before to finish, and let the next one be scheduled. */
static __device__ __forceinline__ void pdl_enter() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* ---- pass 1 ---------------------------------------------------------------------- */

static __global__ void __launch_bounds__(THREADS)
sample_pass1(const float *logits, const float *temp, long long n, char *scratch) {
    __shared__ pick_shared sh;
    pdl_enter();
    long long row = blockIdx.x, lo, hi;
    int b = blockIdx.y, g = gridDim.y;
    row_book *bk = book_of(scratch, row);
    const float *x = logits + row * n;
    float t = *temp;
    share(n, b, g, &lo, &hi);
    for (int i = b * THREADS + threadIdx.x; i < BINS; i += g * THREADS) bk->mass[i] = bk->count[i] = 0;
    if (b == 0 && threadIdx.x == 0) bk->done = bk->listed = 0;
    if (!(t > 0.0f)) { /* as core/sample.c's argmax: NaN never wins here (see pass 2) */
        float v = -INFINITY;
        long long best = 0x7fffffffffffffffLL;
        for (long long j = lo + threadIdx.x; j < hi; j += THREADS) {
            float y = x[j];
            if (isnan(y)) y = -INFINITY;
            if (better(y, j, v, best)) v = y, best = j;
        }
        block_argmax(&v, &best, &sh);
        if (threadIdx.x == 0) bk->max[b] = v, bk->best[b] = best;
        return;
    }
    float m = -INFINITY, s = 0.0f;
    for (long long j = lo + threadIdx.x; j < hi; j += THREADS) m = fmaxf(m, x[j] / t);
    m = block_reduce<true>(m, sh.fpart);
    if (m > -INFINITY)
        for (long long j = lo + threadIdx.x; j < hi; j += THREADS) s += expf(x[j] / t - m);
    s = block_reduce<false>(s, sh.fpart);
    if (threadIdx.x == 0) bk->max[b] = m, bk->sum[b] = s;
}

/* ---- selection (the last block of pass 2) ---------------------------------------------- */

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

/* f(v, j) for each p[j] of this thread's stride through [0, n), read past L1
 * (other blocks wrote them) 16 loads at a time, so that their latencies
 * overlap. Every lane calls f alike (warp votes may be in it): past n with
 * v NaN, which no comparison takes. */
template <class F>
static __device__ __forceinline__ void for_each_p(const float *p, long long n, F f) {
    const int batch = 16;
    for (long long base = threadIdx.x; base - threadIdx.x < n; base += (long long)batch * THREADS) {
        float v[batch];
#pragma unroll
        for (int k = 0; k < batch; k++) {
            long long j = base + (long long)k * THREADS;
            v[k] = j < n ? __ldcg(p + j) : __int_as_float(0x7fc00000);
        }
#pragma unroll
        for (int k = 0; k < batch; k++) f(v[k], base + (long long)k * THREADS);
    }
}

/* The draw's target after a cut with mass through (> 0): run.c's r = coin x
 * the cut's mass, in fixed point, short of through. Rises with through. */
static __device__ __forceinline__ u64 draw_target(float coin, u64 through) {
    float r = coin * ((float)through / ONE);
    return min((u64)(r * ONE), through - 1);
}

/* sh's histogram of the candidates (gathered in sh, or every p >= cutoff of
 * the row) whose key bits above shift + width are prefix, by their width bits
 * at shift. */
static __device__ void level(pick_shared *sh, const float *p, long long n, float cutoff,
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
            histogram_add(sh->mass, sh->count, bin_of(sh->val[i]), fixed(sh->val[i]));
    } else {
        for_each_p(p, n, [&](float v, long long) {
            histogram_add(sh->mass, sh->count, bin_of(v), fixed(v));
        });
    }
    __syncthreads();
}

/* Gathers the row's candidates whose key bits above shift are prefix into sh. */
static __device__ void gather(pick_shared *sh, const float *p, long long n, float cutoff,
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
        if (in) sh->val[at] = v, sh->idx[at] = (int)j;
    });
    __syncthreads();
}

/* Among the candidates equal to bits, the k-th by index (k >= 1; at most their count). */
static __device__ long long kth_equal(pick_shared *sh, const float *p, long long n, float cutoff,
                                      unsigned bits, u64 k) {
    __syncthreads(); /* the last level's histogram is read: its room takes the equal ones */
    int *equal = (int *)sh->count;
    if (threadIdx.x == 0) sh->index = 0, sh->bin = 0;
    __syncthreads();
    if (sh->listed >= 0) { /* gathered: the equal ones, then each counts those before it */
        for (int i = threadIdx.x; i < sh->listed; i += THREADS)
            if (bits_of(sh->val[i]) == bits) equal[atomicAdd(&sh->bin, 1)] = sh->idx[i];
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
            float v = __ldcg(p + j);
            count += v >= cutoff && bits_of(v) == bits;
        }
        u64 before = block_scan(count, sh->part, &total);
        if (before < k && k <= before + count)
            for (long long j = lo; j < hi; j++) {
                float v = __ldcg(p + j);
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
static __device__ long long select_past(pick_shared *sh, const row_book *bk, const float *p,
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

static __device__ long long select_topp(pick_shared *sh, row_book *bk, const float *p,
                                        long long n, float topp, float cutoff, float coin) {
    u64 count = 0, total;
    for (int b = threadIdx.x; b < BINS; b += THREADS) count += __ldcg(&bk->count[b]);
    if (threadIdx.x == 0) key_frame(cutoff, &sh->base, &sh->shift0);
    block_scan(count, sh->part, &total); /* its syncs publish the frame */
    if (total == 0) { /* no candidate reaches the cutoff: all are (see core/sample.c) */
        cutoff = -INFINITY;
        if (threadIdx.x == 0) key_frame(cutoff, &sh->base, &sh->shift0), sh->listed = -1;
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

/* The first index whose running mass exceeds the coin's; n - 1 where none does. */
static __device__ long long select_mult(pick_shared *sh, const row_book *bk, const float *p,
                                        long long n, int g, float coin) {
    u64 target = (u64)(coin * ONE);
    if (threadIdx.x < 32) { /* the blocks' masses (g <= 64), a lane's two at once */
        int lane = threadIdx.x;
        u64 m0 = lane < g ? __ldcg(&bk->block_mass[lane]) : 0;
        u64 m1 = lane + 32 < g ? __ldcg(&bk->block_mass[lane + 32]) : 0;
        u64 before = 0, total;
        for (int h = 0; h < 2; h++) {
            u64 m = h ? m1 : m0, x = m;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                u64 y = __shfl_up_sync(FULL, x, d);
                if (lane >= d) x += y;
            }
            total = __shfl_sync(FULL, x, 31);
            u64 from = before + x - m; /* the mass before this lane's block */
            if (from <= target && target < from + m) sh->bin = lane + 32 * h, sh->above = from;
            before += total;
        }
        if (lane == 0) {
            sh->index = n - 1;
            if (target >= before) sh->bin = -1;
        }
    }
    __syncthreads();
    if (sh->bin < 0) return n - 1;
    long long blo, bhi, lo, hi;
    share(n, sh->bin, g, &blo, &bhi);
    share(bhi - blo, threadIdx.x, THREADS, &lo, &hi);
    lo += blo, hi += blo;
    u64 mass = 0, total;
    for (long long j = lo; j < hi; j++) mass += fixed(__ldcg(p + j));
    u64 before = sh->above + block_scan(mass, sh->part, &total);
    if (before <= target && target < before + mass)
        for (long long j = lo; j < hi; j++)
            if ((before += fixed(__ldcg(p + j))) > target) {
                sh->index = j;
                break;
            }
    __syncthreads();
    return sh->index;
}

/* ---- pass 2 ---------------------------------------------------------------------- */

static __global__ void __launch_bounds__(THREADS)
sample_pass2(long long *out, const float *logits, const long long *state, const float *temp,
             const float *topp_in, long long n, char *scratch, float *probs) {
    __shared__ pick_shared sh;
    pdl_enter();
    long long row = blockIdx.x, lo, hi;
    int b = blockIdx.y, g = gridDim.y;
    row_book *bk = book_of(scratch, row);
    const float *x = logits + row * n;
    float *p = probs + row * n, t = *temp, topp = *topp_in;
    if (!(t > 0.0f)) { /* block 0: the blocks' best; a NaN at 0 wins (core/sample.c) */
        if (b != 0 || threadIdx.x >= 32) return;
        float v = -INFINITY;
        long long best = 0x7fffffffffffffffLL;
        for (int k = threadIdx.x; k < g; k += 32)
            if (better(bk->max[k], bk->best[k], v, best)) v = bk->max[k], best = bk->best[k];
        warp_argmax(&v, &best);
        if (threadIdx.x == 0) out[2 * row] = isnan(x[0]) ? 0 : best, out[2 * row + 1] = state[row];
        return;
    }
    /* the row's max, and its sum from the blocks' (the same arithmetic in every thread) */
    float max = -INFINITY, sum = 0.0f;
    for (int k = 0; k < g; k++) max = fmaxf(max, bk->max[k]);
    for (int k = 0; k < g; k++)
        if (bk->max[k] > -INFINITY) sum += bk->sum[k] * expf(bk->max[k] - max);
    bool mult = topp <= 0.0f || topp >= 1.0f; /* as run.c: a NaN topp takes top-p */
    float cutoff = (1.0f - topp) / (float)(n - 1);
    share(n, b, g, &lo, &hi);
    for (int k = threadIdx.x; k < BINS; k += THREADS) sh.mass[k] = sh.count[k] = 0;
    __syncthreads();
    unsigned base;
    int shift0;
    key_frame(cutoff, &base, &shift0);
    u64 mass = 0;
    for (long long j = lo + threadIdx.x; j < hi; j += THREADS) {
        float v = expf(x[j] / t - max) / sum;
        p[j] = v;
        if (mult)
            mass += fixed(v);
        else if (v >= cutoff)
            histogram_add(sh.mass, sh.count, min((int)((bits_of(v) - base) >> shift0), BINS - 1),
                          fixed(v));
    }
    __syncthreads();
    if (mult) {
        u64 total;
        block_scan(mass, sh.part, &total);
        if (threadIdx.x == 0) bk->block_mass[b] = total;
    } else {
        for (int k = threadIdx.x; k < BINS; k += THREADS)
            if (sh.count[k]) {
                atomicAdd(&bk->count[k], sh.count[k]);
                if (sh.mass[k]) atomicAdd(&bk->mass[k], sh.mass[k]);
            }
    }
    if (!mult) return; /* pass 3 selects */
    /* the last block of the row to get here draws */
    if (last_block(&sh, &bk->done, g)) {
        u64 next;
        float coin = coin_of(state[row], &next);
        long long token = select_mult(&sh, bk, p, n, g, coin);
        if (threadIdx.x == 0) out[2 * row] = token, out[2 * row + 1] = (long long)next;
    }
}

/* ---- pass 3 (top-p) -------------------------------------------------------------- */

/*
 * sh->plan for the row: the cut (topp's mass) falls in level-0 bin b1 at a
 * running mass in (A1, A1 + M1], so the draw's target lies between
 * draw_target of those two (it rises with the cut's mass); the bins of that
 * span and b1 are the ones to gather. Where the cut takes every candidate,
 * the draw's target is known and one bin does. ranges 0: more candidates
 * than the list holds, or none with mass. Each thread holds BINS / THREADS
 * bins of the histogram, top down, and where they start (mass and count from
 * the top); a round finds the bins of up to two targets.
 */
static __device__ void plan_gather(pick_shared *sh, const row_book *bk, float topp, float coin) {
    const int per = BINS / THREADS;
    int hi = BINS - 1 - per * (int)threadIdx.x;
    u64 mass[per], count[per], mine = 0, counted = 0, whole, all;
    for (int k = 0; k < per; k++) {
        mass[k] = bk->mass[hi - k], count[k] = bk->count[hi - k];
        mine += mass[k], counted += count[k];
    }
    u64 before = block_scan(mine, sh->part, &whole);
    u64 counted_before = block_scan(counted, sh->part, &all);
    auto locate = [&](int nt, u64 t0, u64 t1) { /* into sh->hit[0], [1]; bin -1: none */
        if (threadIdx.x < 2) sh->hit[threadIdx.x].bin = -1;
        __syncthreads();
        u64 a = before, c = counted_before;
        for (int k = 0; k < per; k++) {
            for (int t = 0; t < nt; t++) {
                u64 target = t ? t1 : t0;
                if (a <= target && target < a + mass[k])
                    sh->hit[t] = (bin_hit){hi - k, a, mass[k], c, (unsigned)count[k]};
            }
            a += mass[k], c += count[k];
        }
        __syncthreads();
    };
    gather_plan *pl = &sh->plan;
    locate(1, (u64)(topp * ONE), 0);
    bin_hit cut = sh->hit[0];
    __syncthreads(); /* every thread has read it */
    if (cut.bin < 0 && whole == 0) { /* no candidate with mass */
        if (threadIdx.x == 0) pl->ranges = 0;
        __syncthreads();
        return;
    }
    if (cut.bin < 0) { /* no cut: the draw's target is exact */
        u64 t = draw_target(coin, whole);
        locate(2, t, t);
    } else {
        locate(2, draw_target(coin, cut.above + 1), draw_target(coin, cut.above + cut.mass));
    }
    bin_hit top = sh->hit[0], bottom = sh->hit[1];
    /* one range where the draw's bins reach the cut's (or there is no cut), else two */
    bool two = cut.bin >= 0 && bottom.bin > cut.bin + 1;
    if (cut.bin >= 0 && !two) bottom = cut;
    if (threadIdx.x == 0) {
        u64 count0 = bottom.counted + bottom.count - top.counted;
        u64 n = count0 + (two ? cut.count : 0);
        pl->ranges = top.bin < 0 || bottom.bin < 0 || n == 0 || n > CAP ? 0 : two ? 2 : 1;
        pl->top[0] = top.bin, pl->bottom[0] = bottom.bin, pl->above[0] = top.above;
        pl->top[1] = pl->bottom[1] = cut.bin, pl->above[1] = cut.above;
        pl->mass0 = bottom.above + bottom.mass - top.above, pl->count0 = (unsigned)count0;
        pl->cut = cut.bin >= 0, pl->whole = whole;
    }
    __syncthreads();
}

/* Is v a candidate in one of the plan's ranges? */
static __device__ __forceinline__ bool planned(const pick_shared *sh, float v, float cutoff) {
    const gather_plan *pl = &sh->plan;
    if (!(v >= cutoff)) return false;
    int bin = (int)((bits_of(v) - sh->base) >> sh->shift0);
    return (pl->bottom[0] <= bin && bin <= pl->top[0]) ||
           (pl->ranges == 2 && pl->bottom[1] <= bin && bin <= pl->top[1]);
}

/* Sorts keys[0, m) ascending, padded to a power of two with ~0: bitonic,
 * pair q of a stage in thread q % THREADS, so that a stage comparing within
 * 64 keys keeps to each warp's own and only a warp waits on it. */
static __device__ void sort_keys(u64 *keys, int m) {
    int size = 1;
    while (size < m) size <<= 1;
    for (int i = m + threadIdx.x; i < size; i += THREADS) keys[i] = ~0ull;
    __syncthreads();
    for (int k = 2; k <= size; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int q = threadIdx.x; q < size / 2; q += THREADS) {
                int i = ((q & ~(j - 1)) << 1) | (q & (j - 1)), other = i | j;
                u64 a = keys[i], c = keys[other];
                if ((a > c) == ((i & k) == 0)) keys[i] = c, keys[other] = a;
            }
            int next = j > 1 ? j >> 1 : k; /* the next stage's distance (k: the next k's first) */
            if (j >= 64 || next >= 64 || (j == 1 && k == size)) __syncthreads();
            else __syncwarp();
        }
}

/*
 * The token from the gathered candidates: sorted in run.c's order (p
 * descending, then index), their running masses from the plan's ranges, the
 * cut's mass where the cut is among them, then the draw's candidate. -1 where
 * a target falls outside them (the plan says it cannot), for the radix way.
 */
static __device__ long long select_listed(pick_shared *sh, const row_book *bk, float topp,
                                          float coin) {
    const int per = CAP / THREADS;
    const gather_plan *pl = &sh->plan;
    u64 *keys = (u64 *)sh->mass; /* mass and count: CAP keys */
    int m = (int)min(__ldcg(&bk->listed), (unsigned)CAP);
    for (int i = threadIdx.x; i < m; i += THREADS)
        keys[i] = (u64)(0x7fffffffu - bits_of(__ldcg(&bk->list_val[i]))) << 32 |
                  (unsigned)__ldcg(&bk->list_idx[i]);
    sort_keys(keys, m);
    /* each thread's per consecutive candidates: their masses and where each starts */
    u64 mass[per], start[per], mine = 0, total;
    for (int k = 0; k < per; k++) {
        int i = per * (int)threadIdx.x + k;
        mass[k] = i < m ? fixed(__int_as_float((int)(0x7fffffffu - (unsigned)(keys[i] >> 32)))) : 0;
        mine += mass[k];
    }
    u64 run = block_scan(mine, sh->part, &total);
    for (int k = 0; k < per; k++) {
        int i = per * (int)threadIdx.x + k;
        start[k] = i < (int)pl->count0 ? pl->above[0] + run : pl->above[1] + run - pl->mass0;
        run += mass[k];
    }
    /* the candidate whose mass spans target, and the mass through it */
    auto find = [&](u64 target, u64 *through) {
        if (threadIdx.x == 0) sh->index = -1;
        __syncthreads();
        for (int k = 0; k < per; k++)
            if (start[k] <= target && target < start[k] + mass[k]) {
                int i = per * (int)threadIdx.x + k;
                sh->index = (long long)(keys[i] & 0xffffffffu), sh->above = start[k] + mass[k];
            }
        __syncthreads();
        *through = sh->above;
        long long index = sh->index;
        __syncthreads();
        return index;
    };
    u64 through = pl->whole;
    if (pl->cut && find((u64)(topp * ONE), &through) < 0) return -1;
    return find(draw_target(coin, through), &through);
}

static __global__ void __launch_bounds__(THREADS)
sample_pass3(long long *out, const long long *state, const float *temp, const float *topp_in,
             long long n, char *scratch, const float *probs) {
    __shared__ pick_shared sh;
    pdl_enter();
    float t = *temp, topp = *topp_in;
    if (!(t > 0.0f) || topp <= 0.0f || topp >= 1.0f) return; /* pass 2 drew */
    long long row = blockIdx.x, lo, hi;
    int b = blockIdx.y, g = gridDim.y;
    row_book *bk = book_of(scratch, row);
    const float *p = probs + row * n;
    float cutoff = (1.0f - topp) / (float)(n - 1);
    u64 next;
    float coin = coin_of(state[row], &next);
    if (threadIdx.x == 0) key_frame(cutoff, &sh.base, &sh.shift0);
    plan_gather(&sh, bk, topp, coin);
    if (sh.plan.ranges) { /* this block's share of the planned candidates into the list */
        share(n, b, g, &lo, &hi);
        u64 mine = 0, total;
        for (long long j = lo + threadIdx.x; j < hi; j += THREADS)
            mine += planned(&sh, p[j], cutoff);
        u64 at = block_scan(mine, sh.part, &total);
        if (threadIdx.x == 0 && total) sh.index = atomicAdd(&bk->listed, (unsigned)total);
        __syncthreads();
        at += (u64)sh.index;
        for (long long j = lo + threadIdx.x; j < hi && mine; j += THREADS) {
            float v = p[j];
            if (planned(&sh, v, cutoff) && at < CAP)
                bk->list_val[at] = v, bk->list_idx[at++] = (int)j;
        }
    }
    if (!last_block(&sh, &bk->done, g)) return;
    long long token = sh.plan.ranges ? select_listed(&sh, bk, topp, coin) : -1;
    if (token < 0) token = select_topp(&sh, bk, p, n, topp, cutoff, coin);
    if (threadIdx.x == 0) out[2 * row] = token, out[2 * row + 1] = (long long)next;
}

/* Launches a pass over grid, with programmatic dependent launch where the
 * model's generated kernels have it (s->pdl: sm_90+, MK_PDL not 0). */
template <typename... P, typename... A>
static cudaError_t launch(const mk_cuda_state *s, dim3 grid, void (*pass)(P...), A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(THREADS);
    cfg.stream = s->stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = s->pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, pass, (P)args...);
}

/* MK_KERNEL_SAMPLE: logits float32 [rows, n], state int64 [rows, 1],
 * temperature and top-p float32 [1] on the device; out int64 [rows, 2]. */
int mk_cuda_sample(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0];
    long long n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    long long g = (n + THREADS * PER_THREAD - 1) / (THREADS * PER_THREAD);
    if (rows > 0x7fffffffLL)
        return mk_fail(err, MK_ERR_SHAPE, l->node->line, l->node->column,
                       "SampleNode: %lld rows is more than CUDA launches", rows);
    dim3 grid((unsigned)rows, (unsigned)(g < MAX_BLOCKS ? g : MAX_BLOCKS));
    char *scratch = (char *)l->scratch;
    float *probs = (float *)(scratch + mk_sample_head(rows, n));
    const float *logits = (const float *)x->data, *temp = (const float *)l->in[2].data;
    const long long *state = (const long long *)l->in[1].data;
    const float *topp = (const float *)l->in[3].data;
    long long *out = (long long *)l->out.data;
    cudaError_t st = launch(s, grid, sample_pass1, logits, temp, n, scratch);
    if (st == cudaSuccess)
        st = launch(s, grid, sample_pass2, out, logits, state, temp, topp, n, scratch, probs);
    if (st == cudaSuccess)
        st = launch(s, grid, sample_pass3, out, state, temp, topp, n, scratch, probs);
    if (st != cudaSuccess)
        return mk_cuda_fail_status(err, st, "launching the sampler", __FILE__, __LINE__);
    return mk_cuda_check_launch(l, "sample", err);
}
