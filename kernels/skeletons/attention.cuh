/* attention.cuh: the body of decode attention's kernel, flash-decoding over the
 * first p cached rows (core/codegen/codegen.c says how and why), after the
 * head and entry that codegen.c writes (MK_GROUP_START done). codegen.c
 * defines before it:
 *   MK_T threads a block (4 a row of the chunk), MK_C chunks a query (MK_CL as
 *   long long), MK_CBL blocks a query, MK_ML queries a batch row, MK_SL cached
 *   rows, MK_R (MK_RL, MK_RM1L = R - 1) rows a chunk;
 *   scores: MK_DK q / K elements (or float4s) a thread, of MK_DU a row;
 *   values: MK_N (MK_NL) columns, MK_N2 (MK_N2L) = N + 2 floats of a chunk's part,
 *   slots of MK_G rows' groups (MK_GN = G N), MK_VR rows a slot, MK_NS slots a
 *   thread, MK_RED floats of their sums; the combine: MK_NO columns a thread,
 *   the first MK_KU chunks' values at once;
 *   MK_KL and MK_VL 128-byte lines a K and a V row (MK_ATT_PREFETCH);
 *   strides (long long): MK_Q0L, MK_Q1L, MK_QSL (q's batch, row, element),
 *   MK_K0L, MK_KRL, MK_KSL (K's batch, row, element), MK_V0L, MK_VRL, MK_VNL;
 *   the inputs MK_IN_Q, MK_IN_K, MK_IN_V, MK_IN_P (i0 ..), MK_PARTL (floats
 *   of the parts before the counts), MK_PREFIX_FAULT (the fault's kind);
 *   0 / 1: MK_ATT_EARLY (the first chunk's rows before the hint's last load
 *   before the wait), MK_ATT_FLOAT4 (q and K as float4s), MK_ATT_PREFETCH
 *   (rows below the hint sent to L2 before the wait);
 *   MK_CLUSTER where a query's chunks are a cluster and the device has them.
 */
#if MK_ATT_FLOAT4
typedef float4 mk_qk;
#define MK_QK_ZERO make_float4(0.0f, 0.0f, 0.0f, 0.0f)
#define MK_Q_AT(e) *(const float4 *)&q[4 * (u + 4 * e)]
#define MK_K_AT(e) (const float4 *)&K[r * MK_KRL + 4 * (u + 4 * e)]
#else
typedef float mk_qk;
#define MK_QK_ZERO 0.0f
#define MK_Q_AT(e) q[(u + 4 * e) * MK_QSL]
#define MK_K_AT(e) &K[r * MK_KRL + (u + 4 * e) * MK_KSL]
#endif
#define MK_V_AT &V[y * MK_VRL + n * MK_VNL]
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
    const long long ph = *(const volatile long long *)MK_IN_P; /* p's hint */
    const int tid = threadIdx.x, r = tid >> 2, u = tid & 3;
    const long long row = blockIdx.x / MK_CBL, t = row / MK_ML, i = row % MK_ML;
    const long long c0 = blockIdx.x % MK_CBL; /* the block's first chunk */
    mk_qk qv[MK_DK], kv[MK_DK];
    float vv[MK_NS][MK_VR];
/* rows [lo, hi) of the chunk at j0 from K and V (those from hi on zero);
 * early, by loads LD and those before lo as they are (else lo is 0: plain
 * loads: fewer registers) */
#define MK_ROWS(p) (int)((p) > j0 && (p) <= MK_SL ? ((p) - j0 < MK_RL ? (p) - j0 : MK_RL) : 0)
#define MK_LOAD_ROWS(lo, hi, LD) \
    _Pragma("unroll") \
    for (int e = 0; e < MK_DK; e++) \
        kv[e] = u + 4 * e < MK_DU && r < (hi) ? MK_K_ROW(e, lo, LD) : MK_QK_ZERO; \
    _Pragma("unroll") \
    for (int j = 0; j < MK_NS; j++) { \
        const int s = tid + MK_T * j, n = s % MK_N, g = s / MK_N; \
        _Pragma("unroll") \
        for (int e = 0; e < MK_VR; e++) { \
            const int y = g + MK_G * e; \
            vv[j][e] = s < MK_GN && y < (hi) ? MK_V_ROW(j, e, lo, LD) : 0.0f; \
        } \
    }
/* chunk c's first row j0 and its K and V */
#define MK_CHUNK(c) \
    const long long j0 = (c) * MK_RL; \
    const float *K = (const float *)MK_IN_K + t * MK_K0L + j0 * MK_KRL; \
    const float *V = (const float *)MK_IN_V + t * MK_V0L + j0 * MK_VRL
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
    for (long long c = c0; c < MK_CL; c += MK_CBL) {
        MK_CHUNK(c);
        const int rows = MK_ROWS(ph);
        if (rows == 0) break;
        for (int x = tid; x < rows * MK_KL; x += MK_T)
            asm volatile("prefetch.global.L2 [%0];" :: "l"(K + (x / MK_KL) * MK_KRL + (x % MK_KL) * 32));
        for (int x = tid; x < rows * MK_VL; x += MK_T)
            asm volatile("prefetch.global.L2 [%0];" :: "l"(V + (x / MK_VL) * MK_VRL + (x % MK_VL) * 32));
    }
#endif
    MK_GROUP_WAIT;
    float *part = (float *)aux;
    unsigned int *count = (unsigned int *)(part + MK_PARTL);
    __shared__ float sc[MK_R], red[MK_RED], pm[MK_C], pl[MK_C], pf[MK_C];
    __shared__ float cm, cl;
    __shared__ bool last;
#ifdef MK_CLUSTER
    __shared__ float cpart[MK_C * MK_N2]; /* the lead's: each chunk's (m, l, acc) */
#endif
    for (long long c = c0; c < MK_CL; c += MK_CBL) {
    MK_CHUNK(c);
    const float *q = (const float *)MK_IN_Q + t * MK_Q0L + i * MK_Q1L;
    /* p, q and every K and V value of the chunk's rows below the hint at once
     * (after early rows, past L1); the rows below p again where p is not the
     * hint */
    const long long p = *(const long long *)MK_IN_P;
#pragma unroll
    for (int e = 0; e < MK_DK; e++) qv[e] = u + 4 * e < MK_DU ? MK_Q_AT(e) : MK_QK_ZERO;
    int rows = MK_ROWS(ph);
    MK_LOAD_ROWS(MK_LOADED, rows, MK_LD);
    if (p != ph) { /* the hint was stale */
        rows = MK_ROWS(p);
        MK_LOAD_ROWS(0, rows, MK_LD);
    }
    if (p < 0 || p > MK_SL) {
        if (blockIdx.x == 0 && tid == 0) mk_raise(fault, launch, 2, MK_PREFIX_FAULT, p, MK_SL, 0);
        return;
    }
    if (p == 0) { /* no rows: zeros */
        if (c == 0) for (long long n = tid; n < MK_NL; n += MK_T) o[row * MK_NL + n] = 0.0f;
        return;
    }
    const long long chunks = (p + MK_RM1L) / MK_RL;
#ifdef MK_CLUSTER /* a cluster's chunks past p still take part in the barrier's phases */
    if (c >= chunks && chunks > 1) { mk_cluster_wait(); mk_cluster_arrive(); }
#endif
    if (c >= chunks) return;
    { /* scores */
        float s = 0.0f;
#if MK_ATT_FLOAT4
#pragma unroll
        for (int e = 0; e < MK_DK; e++) { s += qv[e].x * kv[e].x; s += qv[e].y * kv[e].y;
            s += qv[e].z * kv[e].z; s += qv[e].w * kv[e].w; }
#else
#pragma unroll
        for (int e = 0; e < MK_DK; e++) s += qv[e] * kv[e];
#endif
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (u == 0 && r < rows) sc[r] = s;
    }
    __syncthreads();
    /* the chunk's max and sum: warp 0 */
#if MK_R <= 32 /* a row a lane (faster than the loop below at 32 rows) */
    if (tid < 32) {
        float m = tid < rows ? sc[tid] : __int_as_float(0xff800000); // -inf
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        const float e = tid < rows ? expf(__fsub_rn(sc[tid], m)) : 0.0f;
        if (tid < rows) sc[tid] = e;
        float l = e;
        for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
        if (tid == 0) { cm = m; cl = l; }
    }
#else /* R / 32 rows a lane */
    if (tid < 32) {
        float m = __int_as_float(0xff800000); // -inf
#pragma unroll
        for (int x = tid; x < MK_R; x += 32) if (x < rows) m = fmaxf(m, sc[x]);
        for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        float l = 0.0f;
#pragma unroll
        for (int x = tid; x < MK_R; x += 32)
            if (x < rows) { const float e = expf(__fsub_rn(sc[x], m)); sc[x] = e; l += e; }
        for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
        if (tid == 0) { cm = m; cl = l; }
    }
#endif
    __syncthreads();
    /* the partial row: slot (g, n) sums its rows, then the G slots of n add up */
    float *mine = part + (row * MK_CL + c) * MK_N2L;
#ifdef MK_CLUSTER
    if (chunks > 1) { mk_cluster_wait(); mine = mk_dsmem(&cpart[c * MK_N2L], 0u); }
#endif
#pragma unroll
    for (int j = 0; j < MK_NS; j++) {
        const int s = tid + MK_T * j, g = s / MK_N;
        float acc = 0.0f;
#pragma unroll
        for (int e = 0; e < MK_VR; e++)
            if (g + MK_G * e < rows) acc += sc[g + MK_G * e] * vv[j][e];
        if (s < MK_GN) red[s] = acc;
    }
    __syncthreads();
    for (long long n = tid; n < MK_NL; n += MK_T) {
        float s = 0.0f;
        for (int g = 0; g < MK_G; g++) s += red[g * MK_NL + n];
        if (chunks == 1) o[row * MK_NL + n] = __fdiv_rn(s, cl); else mine[2 + n] = s;
    }
    if (tid == 0) { mine[0] = cm; mine[1] = cl; }
    /* the combining block: the lead, once every chunk's part is in its
     * memory, or the last to count itself */
#ifdef MK_CLUSTER
    if (chunks == 1) return; /* one chunk: written as it is */
    mk_cluster_arrive();
    if (c != 0) return;
    mk_cluster_wait();
#define MK_PART(k, x) cpart[(k) * MK_N2L + (x)]
#else
    if (chunks == 1) return; /* one chunk: written as it is */
    __syncthreads();
    if (tid == 0) last = mk_arrive(&count[row]) == (unsigned int)chunks - 1u;
    __syncthreads();
    if (!last) continue; /* (a later chunk of this block's would count too) */
    if (tid == 0) count[row] = 0u;
    const float *all = part + row * MK_CL * MK_N2L;
#define MK_PART(k, x) __ldcg(&all[(k) * MK_N2L + (x)])
#endif
    /* every chunk's part: the first KU chunks' values and every (m, l) at
     * once, later chunks one by one; each chunk's factor exp(m - max) once, in
     * shared memory, for the sum and every value */
    float av[MK_NO][MK_KU];
#pragma unroll
    for (int j = 0; j < MK_NO; j++)
#pragma unroll
        for (int k = 0; k < MK_KU; k++) {
            const int n = tid + MK_T * j;
            av[j][k] = n < MK_N && k < chunks ? MK_PART(k, 2 + n) : 0.0f;
        }
    for (long long k = tid; k < chunks; k += MK_T) {
        pm[k] = MK_PART(k, 0);
        pl[k] = MK_PART(k, 1);
    }
    __syncthreads();
    float mx = __int_as_float(0xff800000);
    for (long long k = 0; k < chunks; k++) mx = fmaxf(mx, pm[k]);
    for (long long k = tid; k < chunks; k += MK_T) pf[k] = expf(__fsub_rn(pm[k], mx));
    __syncthreads();
    float sum = 0.0f;
    for (long long k = 0; k < chunks; k++) sum += pl[k] * pf[k];
#pragma unroll
    for (int j = 0; j < MK_NO; j++) {
        const long long n = tid + MK_T * j;
        if (n >= MK_NL) break;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < MK_KU; k++)
            if (k < chunks) s += av[j][k] * pf[k];
        for (long long k = MK_KU; k < chunks; k++)
            s += MK_PART(k, 2 + n) * pf[k];
        o[row * MK_NL + n] = __fdiv_rn(s, sum);
    }
#undef MK_PART
    }
}
