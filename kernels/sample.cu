/*
 * sample.cu — MK_KERNEL_SAMPLE on the GPU: run.c's sampler (core/sample.c
 * says what it computes), one block of 1024 threads per row of logits
 * [rows, n], the temperature and top-p read on the device, so a step loop
 * samples without the host.
 *
 *   t <= 0       the block's argmax; the state unchanged
 *   softmax      max, expf, the block's sum, a division; p kept in the scratch
 *   coin         run.c's xorshift64*, bit for bit
 *   multinomial  a block scan of per-thread running sums finds the first index
 *                whose running sum exceeds the coin
 *   top-p        no sort: the candidate that run.c's sorted order would reach
 *                first past a target is found by radix selection on the
 *                probability's bits, 11 bits a level (three levels), each a
 *                histogram of the probability mass per bin, scanned from the
 *                largest; equal probabilities go by index (a block scan of
 *                their counts). Once for topp, once more for r = coin × the
 *                sum up to the cut (the first level's histogram serves both).
 *
 * Running sums are in fixed point (round(p × 2^31), summed in 64 bits), not
 * run.c's float32 sums in its order: the same on every run, and within about
 * 1e-7 per term of run.c's, so a draw may differ from run.c's (and the CPU's)
 * only where the coin falls that close to a boundary between two tokens.
 */
#include "cuda_device.h"
#include "reduce.h"

#include <math.h>

#define THREADS 1024
#define WARPS (THREADS / 32)
#define FULL 0xffffffffu
#define LEVEL_BITS 11
#define BINS (1 << LEVEL_BITS)
#define ONE 2147483648.0f /* probability 1 in fixed point */

typedef unsigned long long u64;

/* round(p × 2^31); 0 for NaN (p <= 1 always: the max's term is 1). */
static __device__ __forceinline__ unsigned fixed(float p) {
    return p > 0.0f ? __float2uint_rn(p * ONE) : 0u;
}

static __device__ __forceinline__ unsigned bits_of(float p) {
    return (unsigned)__float_as_int(p) & 0x7fffffffu;
}

/* Every thread gets the block's max (MAX) or sum of v; part: WARPS floats. */
template <bool MAX>
static __device__ float block_reduce(float v, float *part) {
    v = MAX ? warp_max(v) : warp_sum(v);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    v = part[threadIdx.x % 32];
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    return v;
}

/* The sum of v over the threads before this one; *total: over all of them.
 * part: WARPS values. */
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
    u64 w = part[lane];
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

/* Adds m to hist[bin] (bin < 0: nothing). The whole mass is at most 2^31 + n/2
 * (each term rounded), so 32 bits hold any bin's. */
static __device__ __forceinline__ void add_to_bin(unsigned *hist, int bin, unsigned m) {
    if (bin >= 0 && m) atomicAdd(&hist[bin], m);
}

typedef struct {
    unsigned hist0[BINS]; /* the first level: every candidate */
    unsigned hist[BINS];  /* the later levels, of one bin of the level before */
    u64 part[WARPS];
    float fpart[WARPS];
    long long ipart[WARPS];
    u64 above;       /* mass of the candidates ordered before the chosen bin */
    int bin;         /* the chosen bin, -1: none crosses */
    long long index; /* a result */
} sample_shared;

/* The thread's contiguous share of [0, n). */
static __device__ __forceinline__ void chunk(long long n, long long *lo, long long *hi) {
    long long c = (n + THREADS - 1) / THREADS;
    *lo = min(n, (long long)threadIdx.x * c);
    *hi = min(n, *lo + c);
}

/* One level's histogram of the candidates (p >= cutoff) whose bits above
 * `shift + width` are `prefix`, by the `width` bits at `shift`. */
static __device__ void histogram(sample_shared *sh, unsigned *hist, const float *p, long long n,
                                 float cutoff, int shift, int width, unsigned prefix) {
    for (int b = threadIdx.x; b < (1 << width); b += THREADS) hist[b] = 0;
    __syncthreads();
    for (long long base = 0; base < n; base += THREADS) {
        long long j = base + threadIdx.x;
        float v = j < n ? p[j] : 0.0f;
        unsigned bits = bits_of(v);
        bool in = j < n && v >= cutoff && (shift + width >= 31 || bits >> (shift + width) == prefix);
        add_to_bin(hist, in ? (int)((bits >> shift) & ((1u << width) - 1)) : -1, in ? fixed(v) : 0);
    }
    __syncthreads();
}

/* Scans hist from its largest bin: the bin where sh->above plus the mass
 * from the top first exceeds target goes to sh->bin (its mass before, to
 * sh->above), or -1 with sh->above the whole mass. */
static __device__ void find_bin(sample_shared *sh, const unsigned *hist, int width, u64 target) {
    int bins = 1 << width, hi = bins - 1 - 2 * (int)threadIdx.x, lo = hi - 1;
    u64 a = hi >= 0 ? hist[hi] : 0, b = lo >= 0 ? hist[lo] : 0, total;
    u64 above = sh->above;
    u64 before = above + block_scan(a + b, sh->part, &total);
    if (threadIdx.x == 0) sh->bin = -1;
    __syncthreads();
    if (hi >= 0 && before <= target && before + a > target) sh->bin = hi, sh->above = before;
    else if (lo >= 0 && before + a <= target && before + a + b > target) sh->bin = lo, sh->above = before + a;
    __syncthreads();
    if (sh->bin < 0 && threadIdx.x == 0) sh->above = above + total;
    __syncthreads();
}

/*
 * The candidate that run.c's order (p descending, then index) reaches first
 * with a running sum above target, and that sum (*through); -1 where the
 * whole mass stays at or under it (*through: the whole mass). hist0 holds
 * the first level.
 */
static __device__ long long select_past(sample_shared *sh, const float *p, long long n,
                                        float cutoff, u64 target, u64 *through) {
    if (threadIdx.x == 0) sh->above = 0;
    __syncthreads();
    unsigned prefix = 0;
    int shift = 31 - LEVEL_BITS;
    find_bin(sh, sh->hist0, LEVEL_BITS, target);
    if (sh->bin < 0) {
        *through = sh->above;
        return -1;
    }
    prefix = (unsigned)sh->bin;
    while (shift > 0) {
        int width = shift < LEVEL_BITS ? shift : LEVEL_BITS;
        shift -= width;
        histogram(sh, sh->hist, p, n, cutoff, shift, width, prefix);
        find_bin(sh, sh->hist, width, target);
        prefix = prefix << width | (unsigned)sh->bin;
    }
    /* prefix: the bits of the probability where the sum crosses; among the
     * candidates equal to it, the k-th by index does */
    u64 above = sh->above, each = fixed(__int_as_float((int)prefix));
    u64 k = each ? (target - above) / each + 1 : 1, total;
    long long lo, hi, count = 0;
    chunk(n, &lo, &hi);
    for (long long j = lo; j < hi; j++) count += bits_of(p[j]) == prefix && p[j] >= cutoff;
    if (threadIdx.x == 0) sh->index = 0; /* found below: k is at most their count */
    u64 before = block_scan((u64)count, sh->part, &total);
    if (before < k && k <= before + (u64)count)
        for (long long j = lo; j < hi; j++)
            if (bits_of(p[j]) == prefix && p[j] >= cutoff && ++before == k) sh->index = j;
    __syncthreads();
    *through = above + k * each;
    return sh->index;
}

static __device__ long long sample_topp(sample_shared *sh, const float *p, long long n,
                                        float topp, float coin) {
    float cutoff = (1.0f - topp) / (float)(n - 1);
    histogram(sh, sh->hist0, p, n, cutoff, 31 - LEVEL_BITS, LEVEL_BITS, 0);
    u64 mass = 0, total;
    for (int b = threadIdx.x; b < BINS; b += THREADS) mass += sh->hist0[b];
    block_scan(mass, sh->part, &total);
    if (total == 0) { /* no candidate reaches the cutoff: all are */
        cutoff = -INFINITY;
        histogram(sh, sh->hist0, p, n, cutoff, 31 - LEVEL_BITS, LEVEL_BITS, 0);
    }
    u64 through;
    select_past(sh, p, n, cutoff, (u64)(topp * ONE), &through);
    if (through == 0) return 0; /* no mass at all: NaN logits */
    float r = coin * ((float)through / ONE);
    u64 target = min((u64)(r * ONE), through - 1);
    return select_past(sh, p, n, cutoff, target, &through);
}

/* The first index whose running sum exceeds coin; n - 1 where none does. */
static __device__ long long sample_mult(sample_shared *sh, const float *p, long long n,
                                        float coin) {
    long long lo, hi;
    chunk(n, &lo, &hi);
    u64 mass = 0, total;
    for (long long j = lo; j < hi; j++) mass += fixed(p[j]);
    if (threadIdx.x == 0) sh->index = n - 1;
    u64 before = block_scan(mass, sh->part, &total), target = (u64)(coin * ONE);
    if (before <= target && target < before + mass)
        for (long long j = lo; j < hi; j++)
            if ((before += fixed(p[j])) > target) {
                sh->index = j;
                break;
            }
    __syncthreads();
    return sh->index;
}

/* As core/sample.c's argmax: NaN at 0 wins, any other never. */
static __device__ long long block_argmax(sample_shared *sh, const float *x, long long n) {
    float v = -INFINITY;
    long long best = 0x7fffffffffffffffLL;
    for (long long j = threadIdx.x; j < n; j += THREADS) {
        float y = x[j];
        if (isnan(y)) y = -INFINITY;
        if (better(y, j, v, best)) v = y, best = j;
    }
    warp_argmax(&v, &best);
    if (threadIdx.x % 32 == 0) sh->fpart[threadIdx.x / 32] = v, sh->ipart[threadIdx.x / 32] = best;
    __syncthreads();
    v = sh->fpart[threadIdx.x % 32];
    best = sh->ipart[threadIdx.x % 32];
    warp_argmax(&v, &best);
    return isnan(x[0]) ? 0 : best;
}

static __global__ void __launch_bounds__(THREADS)
sample_kernel(long long *out, const float *logits, const long long *state, const float *temp,
              const float *topp_in, long long n, float *probs) {
    __shared__ sample_shared sh;
    long long row = blockIdx.x;
    const float *x = logits + row * n;
    float *p = probs + row * n, t = *temp, topp = *topp_in;
    u64 s = (u64)state[row];
    long long token;
    if (!(t > 0.0f)) {
        token = block_argmax(&sh, x, n);
    } else {
        float max = -INFINITY, sum = 0.0f;
        for (long long j = threadIdx.x; j < n; j += THREADS) max = fmaxf(max, x[j] / t);
        max = block_reduce<true>(max, sh.fpart);
        for (long long j = threadIdx.x; j < n; j += THREADS) sum += p[j] = expf(x[j] / t - max);
        sum = block_reduce<false>(sum, sh.fpart);
        for (long long j = threadIdx.x; j < n; j += THREADS) p[j] /= sum;
        __syncthreads();
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        float coin = (float)((unsigned)((s * 0x2545F4914F6CDD1Dull) >> 32) >> 8) / 16777216.0f;
        token = topp <= 0.0f || topp >= 1.0f ? sample_mult(&sh, p, n, coin)
                                             : sample_topp(&sh, p, n, topp, coin);
    }
    if (threadIdx.x == 0) {
        out[2 * row] = token;
        out[2 * row + 1] = (long long)s;
    }
}

/* MK_KERNEL_SAMPLE: logits float32 [rows, n], state int64 [rows, 1],
 * temperature and top-p float32 [1] on the device; out int64 [rows, 2]. */
int mk_cuda_sample(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    const mk_tensor *x = &l->in[0];
    long long n = x->shape[x->rank - 1], rows = mk_tensor_numel(x) / n;
    sample_kernel<<<(unsigned)rows, THREADS, 0, s->stream>>>(
        (long long *)l->out.data, (const float *)x->data, (const long long *)l->in[1].data,
        (const float *)l->in[2].data, (const float *)l->in[3].data, n, (float *)l->scratch);
    return mk_cuda_check_launch(l, "sample", err);
}
