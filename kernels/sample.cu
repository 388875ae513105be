/*
 * sample.cu — MK_KERNEL_SAMPLE on the GPU: run.c's sampler (core/sample.c
 * says what it computes) over rows of logits [rows, n], the temperature and
 * top-p read on the device, so that a step loop samples without the host.
 *
 * One launch: each row is a cluster of G blocks of 512 threads (G grows with
 * n, up to 16 where the device schedules such clusters, else 8, a portable
 * cluster; a 32,000-way row spreads over 16 SMs) that meet at cluster
 * barriers. Before sm_90 (or under MK_CUDA_ARCH=80) a row is one block
 * alone, G = 1, the same kernel with block barriers for the cluster's. What a block passes on it pushes into the shared memory of the
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
 * PDL, MK_CUDA_TIMELINE's stamps and the cluster barrier's halves are the
 * generated kernels' (kernels/skeletons/: pdl.cuh, timeline.cuh, cluster.cuh),
 * the stamps numbering the blocks of a 2-D grid, switched by a template
 * parameter and given their words by the host.
 *
 * Masses are fixed point (round(p x 2^31), summed in 64 bits), not run.c's
 * float32 sums in its order: the same on every run, and within about 1e-7 a
 * term of exact sums. A token may then differ from run.c's (and the CPU's)
 * where the coin, or top-p's running sum, falls within run.c's rounding of
 * the boundary between two tokens: CUDA's is the exact sums' token
 * (sample_spec's GPU case checks that).
 *
 * The files: sample.h holds what the phases share (limits, the shared
 * memory's layout, keys, block scans); sample_list.h the plan and the list's
 * selections (phase 3); sample_radix.h the radix selection the list falls
 * back to; this file the kernel, its multinomial draw and the launch.
 *
 * Where the time goes, and the variants tried and not kept:
 * doc/performance.md, "Sampler".
 */
#include "sample.h"
#include "sample_list.h"
#include "sample_radix.h"
#define MK_CLUSTER /* the sampler's rows are clusters (sm_90+) */
#include "skeletons/cluster.cuh"

#include <cooperative_groups.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* A row's blocks, as sample_rows sees them: a thread block cluster (sm_90+:
 * another block's shared memory, the cluster barrier), or one block alone,
 * where every such call is the block's own. */
template <bool CLUSTER> struct row_blocks;
template <> struct row_blocks<false> {
    __device__ int rank() const { return 0; }
    __device__ int count() const { return 1; }
    template <typename T> __device__ T *shared_of(T *p, int) const { return p; }
    __device__ void arrive_relaxed() const {}
    __device__ void wait() const {}
    __device__ void sync() const { __syncthreads(); }
};
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
template <> struct row_blocks<true> {
    cg::cluster_group c = cg::this_cluster();
    __device__ int rank() const { return (int)c.block_rank(); }
    __device__ int count() const { return (int)c.num_blocks(); }
    template <typename T> __device__ T *shared_of(T *p, int r) const {
        return c.map_shared_rank(p, r);
    }
    __device__ void arrive_relaxed() const { mk_cluster_arrive_relaxed(); }
    __device__ void wait() const { mk_cluster_wait(); }
    __device__ void sync() const { c.sync(); }
};
#endif

#include <math.h>

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

/* ---- the kernel ------------------------------------------------------------------- */

/*
 * One row per cluster of g blocks (block rank b; the lead, rank 0, selects),
 * or per block alone (CLUSTER false: g = 1).
 * Every path ends in a cluster barrier before a block leaves while another
 * may still read its shared memory. HOLD: each thread holds its logits, then
 * their p, in registers from one load to the gather (a 32,000-way row: 8 a
 * thread), so that the phases wait on memory once; else each phase reads
 * them again. Its registers are not capped: a cap that lets the cluster
 * start beside the classifier's last blocks gained nothing.
 * STAMPED: with MK_CUDA_TIMELINE's stamps (tl), a kernel of its own, so that
 * the sampler without them is as it was (the stamps change its registers).
 */
template <bool HOLD, bool STAMPED, bool CLUSTER>
static __global__ void __launch_bounds__(THREADS, 1)
sample_rows(long long *out, const float *logits, const long long *state, const float *temp,
            const float *topp_in, int steps, long long n, char *scratch, unsigned long long *tl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    /* No clusters before sm_90: there the clustered kernels are empty, and
     * mk_cuda_sample launches the lone blocks' */
    if constexpr (CLUSTER) {
        return;
    } else
#endif
    {
    __shared__ pick_shared sh;
    /* MK_CUDA_TIMELINE's stamps (skeletons/timeline.cuh) in the kernel made
     * with them, where tl, the launch's first, is not NULL and the block
     * (numbered across the 2-D grid) is among the first MK_TIMELINE_BLOCKS */
    const unsigned long long block = (unsigned long long)blockIdx.x * gridDim.y + blockIdx.y;
    mk_stamps st(STAMPED && tl && block < MK_TIMELINE_BLOCKS ? tl + 3 * block : nullptr);
    /* programmatic dependent launch (where mk_cuda_sample launches with it):
     * the next launch is scheduled at once, so that its blocks load their
     * weights while this one runs; then the launch before is waited for */
    MK_PDL_START;
    MK_PDL_WAIT;
    st.waited();
    row_blocks<CLUSTER> cluster;
    int b = cluster.rank(), g = cluster.count();
    /* the cluster barrier in halves: every block arrives once it has started
     * (no memory order), and waits before it first touches another block's
     * shared memory, which it may only do once that block runs; the other
     * barriers (cluster.sync) order the blocks' writes into each other's
     * shared memory, their release costing a MEMBAR.ALL.GPU each
     * (doc/performance.md, "Cluster barriers") */
    cluster.arrive_relaxed();
    pick_shared *lead = cluster.shared_of(&sh, 0);
    long long row = blockIdx.x, lo, hi;
    const float *x = logits + row * n;
    /* steps: bit 0, a temperature a row; bit 1, a top-p a row */
    float t = temp[(steps & 1) ? row : 0], topp = topp_in[(steps & 2) ? row : 0];
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
        cluster.wait();
        cluster.sync();
        if (b == 0 && threadIdx.x < 32) {
            v = -INFINITY, best = 0x7fffffffffffffffLL;
            for (int k = threadIdx.x; k < g; k += 32) {
                const pick_shared *o = cluster.shared_of(&sh, k);
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
    cluster.wait(); /* every block runs */
    if (threadIdx.x < g) { /* pushed into every block's room */
        pick_shared *o = cluster.shared_of(&sh, threadIdx.x);
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
                pick_shared *o = cluster.shared_of(&sh, bin_owner(k, g));
                atomicAdd(&o->mass[k], sh.mass[k]), atomicAdd(&o->count[k], c);
            }
    }
    cluster.sync();
    if (!mult) { /* every block reads the merged bins, four a load */
        for (int k = 4 * threadIdx.x; k < BINS; k += 4 * THREADS)
            if (int o = bin_owner(k, g); o != b) {
                const pick_shared *from = cluster.shared_of(&sh, o);
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
}

/* Whether the rows are clusters: the device's (or MK_CUDA_ARCH's) sm_90+. */
static bool clustered(const mk_cuda_state *s) { return s->arch >= 90; }

/* Launches the kernel over rows clusters of g blocks (or, unclustered, rows
 * blocks: g is 1), with programmatic dependent launch where the model's
 * generated kernels have it (s->pdl: sm_90+, MK_PDL not 0). */
template <typename... P, typename... A>
static cudaError_t launch(const mk_cuda_state *s, unsigned rows, unsigned g, void (*kernel)(P...),
                          A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(rows, g);
    cfg.blockDim = dim3(THREADS);
    cfg.stream = s->stream;
    cudaLaunchAttribute attr[2];
    int n = 0;
    if (clustered(s)) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = 1, attr[n].val.clusterDim.y = g, attr[n].val.clusterDim.z = 1;
        n++;
    }
    if (s->pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cfg.attrs = attr;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, (P)args...);
}

/* The most blocks a row's cluster may take with kernel: MAX_CLUSTER where
 * the device schedules clusters that wide (a non-portable size, which sm_90
 * offers; a 32,000-way row then spreads over 16 SMs, so each does half the
 * work of 8), else PORTABLE. Fewer blocks a row lost (doc/performance.md). */
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

/* A launch's rows of n logits, and the blocks g of each row's cluster (1
 * where rows are not clusters). */
static void clusters_of(const mk_launch *l, long long *rows, long long *n, long long *g) {
    const mk_tensor *x = &l->in[0];
    *n = x->shape[x->rank - 1], *rows = mk_tensor_numel(x) / *n;
    *g = 1;
    if (!clustered(mk_cuda_state_of(l))) return;
    *g = (*n + THREADS * PER_THREAD - 1) / (THREADS * PER_THREAD);
    long long widest = min(widest_cluster(sample_rows<true, false, true>),
                           widest_cluster(sample_rows<false, false, true>));
    widest = min(widest, min(widest_cluster(sample_rows<true, true, true>),
                             widest_cluster(sample_rows<false, true, true>)));
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
 * temperature and top-p float32 [1] or [rows] on the device; out int64 [rows, 2]. */
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
    char *scratch = (char *)l->scratch;
    bool hold = (n + g - 1) / g <= HELD * THREADS; /* share's longest range */
    unsigned long long *tl = mk_cuda_timeline_stamps(s, l->index);
    typedef void (*kernel_fn)(long long *, const float *, const long long *, const float *,
                              const float *, int, long long, char *, unsigned long long *);
    int steps = (mk_tensor_numel(&l->in[2]) > 1) | (mk_tensor_numel(&l->in[3]) > 1) << 1;
    static const kernel_fn kernels[2][2][2] = { /* [clustered][stamped][hold] */
        {{sample_rows<false, false, false>, sample_rows<true, false, false>},
         {sample_rows<false, true, false>, sample_rows<true, true, false>}},
        {{sample_rows<false, false, true>, sample_rows<true, false, true>},
         {sample_rows<false, true, true>, sample_rows<true, true, true>}}};
    cudaError_t st = launch(s, (unsigned)rows, (unsigned)g, kernels[clustered(s)][tl != NULL][hold],
                            (long long *)l->out.data, (const float *)x->data,
                            (const long long *)l->in[1].data, (const float *)l->in[2].data,
                            (const float *)l->in[3].data, steps, n, scratch, tl);
    if (st != cudaSuccess)
        return mk_cuda_fail_status(err, st, "launching the sampler", __FILE__, __LINE__);
    return mk_cuda_check_launch(l, "sample", err);
}
