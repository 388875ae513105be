/*
 * staging.cuh: what a matrix–vector kernel (core/codegen/matvec_step.c) does to A
 * before its sums. An RmsNorm folded in multiplies x by the norm's weight as
 * it is read and sums x's squares (1 / rms scales the dot products at the
 * end). A block that stages A copies it into shared memory in one of three
 * forms: float32 (sA), on runq.c's int8 grid (sQ and its scales sXs), or as
 * the tensor-core form's fixed-point digits (sD and their factors sF). A
 * LayerNorm folded in stages x as it is, summing it (mk_sum), and normalises
 * sA in place once the block has the rows' means and variances.
 */

/* x as it is, added into sum (a LayerNorm's mean). */
static __device__ __forceinline__ float mk_sum1(float x, float &sum) {
    sum += x;
    return x;
}
static __device__ __forceinline__ float4 mk_sum4(float4 x, float &sum) {
    sum += x.x + x.y + x.z + x.w;
    return x;
}

/* x times the norm's weight w, x's squares added into sum. */
static __device__ __forceinline__ float mk_norm1(float x, float w, float &sum) {
    sum += x * x;
    return x * w;
}
static __device__ __forceinline__ float4 mk_norm4(float4 x, float4 w, float &sum) {
    sum += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
    return make_float4(x.x * w.x, x.y * w.y, x.z * w.z, x.w * w.w);
}

/* The block's sums of squares of each of its M rows, from each thread's
 * part[m], into sss[m] by way of sred (a warp's); the caller's barrier
 * follows before anyone reads sss. */
template <int M, int WARPS>
static __device__ __forceinline__ void mk_norm_sums(float (&part)[M], float (&sred)[WARPS][M], float *sss) {
    for (int m = 0; m < M; m++) {
        for (int off = 16; off > 0; off >>= 1) part[m] += __shfl_xor_sync(0xffffffffu, part[m], off);
        if ((threadIdx.x & 31) == 0) sred[threadIdx.x >> 5][m] = part[m];
    }
    __syncthreads();
    if (threadIdx.x < M) {
        float t = 0.0f;
        for (int w = 0; w < WARPS; w++) t += sred[w][threadIdx.x];
        sss[threadIdx.x] = t;
    }
}

/* 16 floats from p: four float4 loads where VEC (p 16-byte aligned). */
template <bool VEC>
static __device__ __forceinline__ void mk_load16(const float *p, float (&v)[16]) {
    if (VEC) {
        for (int i = 0; i < 4; i++) {
            const float4 t = ((const float4 *)p)[i];
            v[4 * i] = t.x; v[4 * i + 1] = t.y; v[4 * i + 2] = t.z; v[4 * i + 3] = t.w;
        }
    } else {
        for (int i = 0; i < 16; i++) v[i] = p[i];
    }
}

/* The largest |v| of a thread's 16 values. */
static __device__ __forceinline__ float mk_absmax16(const float (&v)[16]) {
    float mx = 0.0f;
    for (int j = 0; j < 16; j++)
        if (fabsf(v[j]) > mx) mx = fabsf(v[j]);
    return mx;
}

/* A thread's 16 values of A, elements i .. i + 15, onto runq.c's int8 grid,
 * as a FakeQuantizeNode rounds them: LANES threads hold a group and agree on
 * its largest |v| by shuffles (mx, a thread's), whose 127th is the group's
 * scale s; each v / s rounded (NaN to 0, clamped to +-127) goes into sQ, and
 * the group's first thread writes s into sXs. A thread that holds no values
 * (on false, mx 0) joins the shuffles only. */
template <int LANES>
static __device__ __forceinline__ void mk_grid16(const float (&v)[16], float mx, bool on, signed char *sQ,
                                                 float *sXs, long long i) {
    for (int off = 1; off < LANES; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float s = __fdiv_rn(mx, 127.0f);
    if (on) {
        unsigned int u[4] = {0u, 0u, 0u, 0u};
        for (int j = 0; j < 16; j++) {
            float r = s != 0.0f ? roundf(__fdiv_rn(v[j], s)) : 0.0f;
            r = r != r ? 0.0f : fminf(fmaxf(r, -127.0f), 127.0f);
            u[j >> 2] |= ((unsigned int)(int)r & 0xffu) << (8 * (j & 3));
        }
        *(uint4 *)(sQ + i) = make_uint4(u[0], u[1], u[2], u[3]);
        if ((threadIdx.x & (LANES - 1)) == 0) sXs[i / (16 * LANES)] = s;
    }
}

/* Four of A's values as the tensor-core form's fixed point: a half warp holds
 * the 64 of k from 64 q (lane & 15 the four at k), which it scales by 2^e (e
 * from the 64's largest |v|, so that |v 2^e| < 2^30) and rounds to integers,
 * each held as four signed base-256 digits. Digit n of the four values goes
 * into one word of sD ([k / 8][digit][8] bytes), and the weight of the 64's
 * digit 0, 2^(24 - e), into sF[q] by its first lane. A non-finite value
 * makes its 64's digits 0 and that weight NaN. */
static __device__ __forceinline__ void mk_digits4(float4 x, long long k, long long q, unsigned char *sD,
                                                  float *sF) {
    const int lane = threadIdx.x & 31;
    const float v[4] = {x.x, x.y, x.z, x.w};
    const unsigned nf = __ballot_sync(0xffffffffu, !isfinite(v[0]) || !isfinite(v[1]) || !isfinite(v[2]) || !isfinite(v[3]));
    const bool bad = (nf >> (lane & 16)) & 0xffffu;
    float mx = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const int e = min(30 - ((int)(__float_as_uint(mx) >> 23) - 126), 127); /* mx < 2^(30 - e) */
    unsigned word[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int h = 0; h < 4; h++) {
        int d = bad ? 0 : __float2int_rn(v[h] * __int_as_float((127 + e) << 23));
        for (int n = 3; n >= 0; n--) {
            const int lo = (int)(signed char)(d & 0xff);
            word[n] |= (unsigned)(lo & 0xff) << (8 * h);
            d = (d - lo) >> 8;
        }
    }
    unsigned *at = (unsigned *)(sD + (k >> 3) * 32 + (k & 7));
    at[0] = word[0]; at[2] = word[1]; at[4] = word[2]; at[6] = word[3];
    if ((lane & 15) == 0) sF[q] = bad ? __int_as_float(0x7fc00000) : __int_as_float((151 - e) << 23);
}
