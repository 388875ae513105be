/* attention.cuh: the body of decode attention's kernel, flash-decoding over the
 * first p cached rows (core/codegen/codegen.c says how and why), after the
 * head and entry that codegen.c writes (MK_GROUP_START done). codegen.c
 * defines before it, as typed constants in namespace att:
 *   int T threads a block (4 a row of the chunk), C chunks a query, R rows a
 *   chunk; scores: DK q / K elements (or float4s) a thread, of DU a row;
 *   values: N columns, N2 = N + 2 floats of a chunk's part, slots of G rows'
 *   groups (GN = G N), VR rows a slot, NS slots a thread, RED floats of their
 *   sums; the combine: NO columns a thread, the first KU chunks' values at
 *   once; KL and VL 128-byte lines a K and a V row (MK_ATT_PREFETCH);
 *   prefix_fault, the fault's kind;
 *   long long CB blocks a query, M queries a batch row, S cached rows, PB
 *   batch rows a prefix (MK_IN_P holds one a run of PB, a sequence's heads); the
 *   strides q0, q1, qs (q's batch, row, element), k0, kr, ks (K's), v0, vr,
 *   vn (V's); part, the floats of the parts before the counts;
 * and as macros: the inputs MK_IN_Q, MK_IN_K, MK_IN_V, MK_IN_P (i0 ..); the
 * forms, 0 / 1: MK_ATT_EARLY (the first chunk's rows before the hint's last
 * load before the wait), MK_ATT_FLOAT4 (q and K as float4s), MK_ATT_PREFETCH
 * (rows below the hint sent to L2 before the wait); MK_CLUSTER where a
 * query's chunks are a cluster and the device has them.
 */
#if MK_ATT_FLOAT4
typedef float4 mk_qk;
#define MK_QK_ZERO make_float4(0.0f, 0.0f, 0.0f, 0.0f)
#define MK_Q_AT(e) *(const float4 *)&q[4 * (u + 4 * e)]
#define MK_K_AT(e) (const float4 *)&K[r * att::kr + 4 * (u + 4 * e)]
#else
typedef float mk_qk;
#define MK_QK_ZERO 0.0f
#define MK_Q_AT(e) q[(u + 4 * e) * att::qs]
#define MK_K_AT(e) &K[r * att::kr + (u + 4 * e) * att::ks]
#endif
#define MK_V_AT &V[y * att::vr + n * att::vn]
#if MK_ATT_EARLY /* rows before lo are loaded already */
#define MK_K_ROW(e, lo, LD) (r >= (lo) ? LD(MK_K_AT(e)) : kv[e])
#define MK_V_ROW(j, e, lo, LD) (y >= (lo) ? LD(MK_V_AT) : vv[j][e])
#else
#define MK_K_ROW(e, lo, LD) *MK_K_AT(e)
#define MK_V_ROW(j, e, lo, LD) *MK_V_AT
#endif
#ifdef MK_CLUSTER /* every block arrives (phase 0) before any writes into the lead's memory */
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
    const int tid = threadIdx.x, r = tid >> 2, u = tid & 3;
    const long long row = blockIdx.x / att::CB, t = row / att::M, i = row % att::M;
    const long long ph = ((const volatile long long *)MK_IN_P)[t / att::PB]; /* p's hint */
    const long long c0 = blockIdx.x % att::CB; /* the block's first chunk */
    mk_qk qv[att::DK], kv[att::DK];
    float vv[att::NS][att::VR];
/* rows [lo, hi) of the chunk at j0 from K and V (those from hi on zero);
 * early, by loads LD and those before lo as they are (else lo is 0: plain
 * loads: fewer registers) */
#define MK_ROWS(p) (int)((p) > j0 && (p) <= att::S ? ((p) - j0 < att::R ? (p) - j0 : att::R) : 0)
#define MK_LOAD_ROWS(lo, hi, LD) \
    _Pragma("unroll") \
    for (int e = 0; e < att::DK; e++) \
        kv[e] = u + 4 * e < att::DU && r < (hi) ? MK_K_ROW(e, lo, LD) : MK_QK_ZERO; \
    _Pragma("unroll") \
    for (int j = 0; j < att::NS; j++) { \
        const int s = tid + att::T * j, n = s % att::N, g = s / att::N; \
        _Pragma("unroll") \
        for (int e = 0; e < att::VR; e++) { \
            const int y = g + att::G * e; \
            vv[j][e] = s < att::GN && y < (hi) ? MK_V_ROW(j, e, lo, LD) : 0.0f; \
        } \
    }
/* chunk c's first row j0 and its K and V */
#define MK_CHUNK(c) \
    const long long j0 = (c) * att::R; \
    const float *K = (const float *)MK_IN_K + t * att::k0 + j0 * att::kr; \
    const float *V = (const float *)MK_IN_V + t * att::v0 + j0 * att::vr
#if MK_ATT_EARLY /* the first chunk's rows before the hint's last, before the wait */
    int pre = 0; /* rows of chunk c0 loaded */
    {
        MK_CHUNK(c0);
        pre = MK_ROWS(ph - 1);
        MK_LOAD_ROWS(0, pre, __ldca);
    }
#define MK_LD __ldcg
#define MK_LOADED (c == c0 ? pre : 0)
#else
#define MK_LD __ldca
#define MK_LOADED 0
#endif
#if MK_ATT_PREFETCH /* rows below the hint to L2 */
    for (long long c = c0; c < att::C; c += att::CB) {
        MK_CHUNK(c);
        const int rows = MK_ROWS(ph);
        if (rows == 0) break;
        for (int x = tid; x < rows * att::KL; x += att::T)
            asm volatile("prefetch.global.L2 [%0];" :: "l"(K + (x / att::KL) * att::kr + (x % att::KL) * 32));
        for (int x = tid; x < rows * att::VL; x += att::T)
            asm volatile("prefetch.global.L2 [%0];" :: "l"(V + (x / att::VL) * att::vr + (x % att::VL) * 32));
    }
#endif
    MK_GROUP_WAIT;
    float *part = (float *)aux;
    unsigned int *count = (unsigned int *)(part + att::part);
    __shared__ float sc[att::R], red[att::RED], pm[att::C], pl[att::C], pf[att::C];
    __shared__ float cm, cl;
    __shared__ bool last;
#ifdef MK_CLUSTER
    __shared__ float cpart[att::C * att::N2]; /* the lead's: each chunk's (m, l, acc) */
#endif
    for (long long c = c0; c < att::C; c += att::CB) {
    MK_CHUNK(c);
    const float *q = (const float *)MK_IN_Q + t * att::q0 + i * att::q1;
    /* p, q and every K and V value of the chunk's rows below the hint at once
     * (after early rows, past L1); the rows below p again where p is not the
     * hint */
    const long long p = ((const long long *)MK_IN_P)[t / att::PB];
#pragma unroll
    for (int e = 0; e < att::DK; e++) qv[e] = u + 4 * e < att::DU ? MK_Q_AT(e) : MK_QK_ZERO;
    int rows = MK_ROWS(ph);
    MK_LOAD_ROWS(MK_LOADED, rows, MK_LD);
    if (p != ph) { /* the hint was stale */
        rows = MK_ROWS(p);
        MK_LOAD_ROWS(0, rows, MK_LD);
    }
    if (p < 0 || p > att::S) {
        if (t % att::PB == 0 && i == 0 && c0 == 0 && tid == 0) /* the run's first block */
            mk_raise(fault, launch, 2, att::prefix_fault, p, att::S, 0);
        return;
    }
    if (p == 0) { /* no rows: zeros */
        if (c == 0) for (long long n = tid; n < att::N; n += att::T) o[row * att::N + n] = 0.0f;
        return;
    }
    const long long chunks = (p + (att::R - 1)) / att::R;
#ifdef MK_CLUSTER /* a cluster's chunks past p still take part in the barrier's phases */
    if (c >= chunks && chunks > 1) { mk_cluster_wait(); mk_cluster_arrive(); }
#endif
    if (c >= chunks) return;
    { /* scores */
        float s = 0.0f;
#if MK_ATT_FLOAT4
#pragma unroll
        for (int e = 0; e < att::DK; e++) { s += qv[e].x * kv[e].x; s += qv[e].y * kv[e].y;
            s += qv[e].z * kv[e].z; s += qv[e].w * kv[e].w; }
#else
#pragma unroll
        for (int e = 0; e < att::DK; e++) s += qv[e] * kv[e];
#endif
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (u == 0 && r < rows) sc[r] = s;
    }
    __syncthreads();
    /* the chunk's max and sum: warp 0 */
if constexpr (att::R <= 32) { /* a row a lane (faster than the loop below at 32 rows) */
    if (tid < 32) {
        float m = tid < rows ? sc[tid] : __int_as_float(0xff800000); // -inf
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        const float e = tid < rows ? expf(__fsub_rn(sc[tid], m)) : 0.0f;
        if (tid < rows) sc[tid] = e;
        float l = e;
        for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
        if (tid == 0) { cm = m; cl = l; }
    }
} else { /* R / 32 rows a lane */
    if (tid < 32) {
        float m = __int_as_float(0xff800000); // -inf
#pragma unroll
        for (int x = tid; x < att::R; x += 32) if (x < rows) m = fmaxf(m, sc[x]);
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        float l = 0.0f;
#pragma unroll
        for (int x = tid; x < att::R; x += 32)
            if (x < rows) { const float e = expf(__fsub_rn(sc[x], m)); sc[x] = e; l += e; }
        for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
        if (tid == 0) { cm = m; cl = l; }
    }
    }
    __syncthreads();
    /* the partial row: slot (g, n) sums its rows, then the G slots of n add up */
    float *mine = part + (row * att::C + c) * att::N2;
#ifdef MK_CLUSTER
    if (chunks > 1) { mk_cluster_wait(); mine = mk_dsmem(&cpart[c * att::N2], 0u); }
#endif
#pragma unroll
    for (int j = 0; j < att::NS; j++) {
        const int s = tid + att::T * j, g = s / att::N;
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < att::VR; e++)
            if (g + att::G * e < rows) acc += sc[g + att::G * e] * vv[j][e];
        if (s < att::GN) red[s] = acc;
    }
    __syncthreads();
    for (long long n = tid; n < att::N; n += att::T) {
        float s = 0.0f;
        for (int g = 0; g < att::G; g++) s += red[(long long)g * att::N + n];
        if (chunks == 1) o[row * att::N + n] = __fdiv_rn(s, cl); else mine[2 + n] = s;
    }
    if (tid == 0) { mine[0] = cm; mine[1] = cl; }
    /* the combining block: the lead, once every chunk's part is in its
     * memory, or the last to count itself */
#ifdef MK_CLUSTER
    if (chunks == 1) return; /* one chunk: written as it is */
    mk_cluster_arrive();
    if (c != 0) return;
    mk_cluster_wait();
#define MK_PART(k, x) cpart[(long long)(k) * att::N2 + (x)]
#else
    if (chunks == 1) return; /* one chunk: written as it is */
    __syncthreads();
    if (tid == 0) last = mk_arrive(&count[row]) == (unsigned int)chunks - 1u;
    __syncthreads();
    if (!last) continue; /* (a later chunk of this block's would count too) */
    if (tid == 0) count[row] = 0u;
    const float *all = part + row * att::C * att::N2;
#define MK_PART(k, x) __ldcg(&all[(long long)(k) * att::N2 + (x)])
#endif
    /* every chunk's part: the first KU chunks' values and every (m, l) at
     * once, later chunks one by one; each chunk's factor exp(m - max) once, in
     * shared memory, for the sum and every value */
    float av[att::NO][att::KU];
#pragma unroll
    for (int j = 0; j < att::NO; j++)
#pragma unroll
        for (int k = 0; k < att::KU; k++) {
            const int n = tid + att::T * j;
            av[j][k] = n < att::N && k < chunks ? MK_PART(k, 2 + n) : 0.0f;
        }
    for (long long k = tid; k < chunks; k += att::T) {
        pm[k] = MK_PART(k, 0);
        pl[k] = MK_PART(k, 1);
    }
    __syncthreads();
    float mx = __int_as_float(0xff800000);
    for (long long k = 0; k < chunks; k++) mx = fmaxf(mx, pm[k]);
    for (long long k = tid; k < chunks; k += att::T) pf[k] = expf(__fsub_rn(pm[k], mx));
    __syncthreads();
    float sum = 0.0f;
    for (long long k = 0; k < chunks; k++) sum += pl[k] * pf[k];
#pragma unroll
    for (int j = 0; j < att::NO; j++) {
        const long long n = tid + att::T * j;
        if (n >= att::N) break;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < att::KU; k++)
            if (k < chunks) s += av[j][k] * pf[k];
        for (long long k = att::KU; k < chunks; k++)
            s += MK_PART(k, 2 + n) * pf[k];
        o[row * att::N + n] = __fdiv_rn(s, sum);
    }
#undef MK_PART
    }
}
