/*
 * sample.cu — MK_KERNEL_SAMPLE on the GPU: run.c's sampler (core/sample.c
 * says what it computes) over rows of logits [rows, n], the temperature and
 * top-p read on the device, so that a step loop samples without the host.
 *
 * Two launches, each G blocks of 512 threads a row (G grows with n, up to
 * 64), so that a 32,000-way row spreads over as many SMs:
 *
 *   pass 1   each block: the max of x / t over its range and the sum of
 *            expf(x / t - that max) (t <= 0: its argmax); zeroes the row's
 *            level-0 histogram
 *   pass 2   each block: the row's max and sum from the blocks' (each block's
 *            sum rescaled to the row's max), p = expf(x / t - max) / sum into
 *            the scratch, and either its range's mass (multinomial) or the
 *            level-0 histogram of the top-p candidates (p >= cutoff): mass
 *            and count per bin of the probability's top 11 bits. The last
 *            block to finish (a counter) draws the coin (run.c's xorshift64*,
 *            bit for bit) and selects:
 *     multinomial  the block, then the index, where the running mass first
 *                  exceeds the coin (block scans)
 *     top-p        no sort: the candidate that run.c's order (p descending,
 *                  then index) reaches first with a running mass above a
 *                  target, by radix selection, 11 bits a level: the level-0
 *                  histogram names the bin where the mass from the top
 *                  crosses; that bin's candidates are gathered into shared
 *                  memory (once few enough) and the next levels' histograms
 *                  made of them; equal probabilities go by index. Once for
 *                  topp, once more for r = coin x the mass up to the cut.
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
#define CAP 2048       /* candidates the selecting block gathers */
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
    unsigned done;              /* pass 2: blocks finished; the last one selects */
} row_book;
static_assert(sizeof(row_book) <= MK_SAMPLE_ROW_BYTES, "a row's bookkeeping outgrew its room");
static_assert(CAP <= BINS, "kth_equal lists the equal candidates in a histogram's room");

/* The selecting block's shared memory (pass 2's blocks make their level-0
 * histogram in mass and count too). */
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
    long long index; /* a result */
    int last;        /* this block is the row's last of pass 2 */
} pick_shared;

/* round(p x 2^31); 0 for NaN (p <= 1: the max's term is 1). */
static __device__ __forceinline__ unsigned fixed(float p) {
    return p > 0.0f ? __float2uint_rn(p * ONE) : 0u;
}

static __device__ __forceinline__ unsigned bits_of(float p) {
    return (unsigned)__float_as_int(p) & 0x7fffffffu;
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

/* ---- pass 1 ---------------------------------------------------------------------- */

static __global__ void __launch_bounds__(THREADS)
sample_pass1(const float *logits, const float *temp, long long n, char *scratch) {
    __shared__ pick_shared sh;
    long long row = blockIdx.x, lo, hi;
    int b = blockIdx.y, g = gridDim.y;
    row_book *bk = book_of(scratch, row);
    const float *x = logits + row * n;
    float t = *temp;
    share(n, b, g, &lo, &hi);
    for (int i = b * THREADS + threadIdx.x; i < BINS; i += g * THREADS) bk->mass[i] = bk->count[i] = 0;
    if (b == 0 && threadIdx.x == 0) bk->done = 0;
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

/* sh's histogram of the candidates (gathered in sh, or every p >= cutoff of
 * the row) whose bits above shift + width are prefix, by their width bits at
 * shift. */
static __device__ void level(pick_shared *sh, const float *p, long long n, float cutoff,
                             unsigned prefix, int shift, int width) {
    __syncthreads(); /* every thread is done reading the last level's */
    for (int b = threadIdx.x; b < BINS; b += THREADS) sh->mass[b] = sh->count[b] = 0;
    __syncthreads();
    auto add = [&](float v) {
        unsigned bits = bits_of(v);
        if (bits >> (shift + width) != prefix) return;
        int bin = (int)((bits >> shift) & ((1u << width) - 1));
        unsigned m = fixed(v);
        if (m) atomicAdd(&sh->mass[bin], m);
        atomicAdd(&sh->count[bin], 1u);
    };
    if (sh->listed >= 0) {
        for (int i = threadIdx.x; i < sh->listed; i += THREADS) add(sh->val[i]);
    } else {
        for_each_p(p, n, [&](float v, long long) {
            if (v >= cutoff) add(v);
        });
    }
    __syncthreads();
}

/* Gathers the row's candidates whose bits above shift are prefix into sh. */
static __device__ void gather(pick_shared *sh, const float *p, long long n, float cutoff,
                              unsigned prefix, int shift) {
    if (threadIdx.x == 0) sh->listed = 0;
    __syncthreads();
    for_each_p(p, n, [&](float v, long long j) {
        bool in = v >= cutoff && bits_of(v) >> shift == prefix;
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
 * level-0 histogram is in bk.
 */
static __device__ long long select_past(pick_shared *sh, const row_book *bk, const float *p,
                                        long long n, float cutoff, u64 target, u64 *through) {
    for (int b = threadIdx.x; b < BINS; b += THREADS) sh->mass[b] = __ldcg(&bk->mass[b]);
    if (threadIdx.x == 0) sh->above = 0, sh->listed = -1;
    __syncthreads();
    find_bin(sh, LEVEL_BITS, target);
    if (sh->bin < 0) {
        *through = sh->above;
        return -1;
    }
    unsigned prefix = (unsigned)sh->bin;
    int shift = 31 - LEVEL_BITS;
    for (;;) {
        unsigned count = shift == 31 - LEVEL_BITS ? __ldcg(&bk->count[sh->bin]) : sh->count[sh->bin];
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
    /* prefix: the probability where the mass crosses; the k-th of those equal to it */
    u64 above = sh->above, each = fixed(__int_as_float((int)prefix));
    u64 k = each ? (target - above) / each + 1 : 1;
    *through = above + k * each;
    return kth_equal(sh, p, n, cutoff, prefix, k);
}

static __device__ long long select_topp(pick_shared *sh, row_book *bk, const float *p,
                                        long long n, float topp, float cutoff, float coin) {
    u64 count = 0, total;
    for (int b = threadIdx.x; b < BINS; b += THREADS) count += __ldcg(&bk->count[b]);
    block_scan(count, sh->part, &total);
    if (total == 0) { /* no candidate reaches the cutoff: all are (see core/sample.c) */
        cutoff = -INFINITY;
        if (threadIdx.x == 0) sh->listed = -1;
        __syncthreads();
        level(sh, p, n, cutoff, 0, 31 - LEVEL_BITS, LEVEL_BITS);
        for (int b = threadIdx.x; b < BINS; b += THREADS)
            bk->mass[b] = sh->mass[b], bk->count[b] = sh->count[b];
        __syncthreads();
    }
    u64 through;
    select_past(sh, bk, p, n, cutoff, (u64)(topp * ONE), &through);
    if (through == 0) return 0; /* no mass at all: NaN logits */
    float r = coin * ((float)through / ONE);
    u64 target = min((u64)(r * ONE), through - 1);
    return select_past(sh, bk, p, n, cutoff, target, &through);
}

/* The first index whose running mass exceeds the coin's; n - 1 where none does. */
static __device__ long long select_mult(pick_shared *sh, const row_book *bk, const float *p,
                                        long long n, int g, float coin) {
    u64 target = (u64)(coin * ONE);
    if (threadIdx.x == 0) {
        u64 acc = 0;
        sh->bin = -1;
        for (int b = 0; b < g && sh->bin < 0; b++) {
            u64 m = __ldcg(&bk->block_mass[b]);
            if (acc + m > target) sh->bin = b, sh->above = acc;
            acc += m;
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
    u64 mass = 0;
    for (long long j = lo + threadIdx.x; j < hi; j += THREADS) {
        float v = expf(x[j] / t - max) / sum;
        p[j] = v;
        if (mult) {
            mass += fixed(v);
        } else if (v >= cutoff) {
            int bin = (int)(bits_of(v) >> (31 - LEVEL_BITS));
            unsigned m = fixed(v);
            if (m) atomicAdd(&sh.mass[bin], m);
            atomicAdd(&sh.count[bin], 1u);
        }
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
    /* the last block of the row to get here selects */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) sh.last = atomicAdd(&bk->done, 1u) == (unsigned)g - 1;
    __syncthreads();
    if (!sh.last) return;
    __threadfence();
    u64 s = (u64)state[row];
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    float coin = (float)((unsigned)((s * 0x2545F4914F6CDD1Dull) >> 32) >> 8) / 16777216.0f;
    long long token = mult ? select_mult(&sh, bk, p, n, g, coin)
                           : select_topp(&sh, bk, p, n, topp, cutoff, coin);
    if (threadIdx.x == 0) out[2 * row] = token, out[2 * row + 1] = (long long)s;
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
    sample_pass1<<<grid, THREADS, 0, s->stream>>>(logits, temp, n, scratch);
    sample_pass2<<<grid, THREADS, 0, s->stream>>>((long long *)l->out.data, logits,
                                                  (const long long *)l->in[1].data, temp,
                                                  (const float *)l->in[3].data, n, scratch, probs);
    return mk_cuda_check_launch(l, "sample", err);
}
