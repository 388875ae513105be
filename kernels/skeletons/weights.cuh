/* weights.cuh: a matrix-vector kernel's weights in each dtype, loaded
 * evict-first (__ldcs) and widened to float32, exactly; int8 is multiplied by
 * its group's scale where the kernel reads it */
static __device__ __forceinline__ float mk_w1_f32(const float *p) { return __ldcs(p); }
static __device__ __forceinline__ void mk_w4_f32(const float *p, float4 *o) { o[0] = __ldcs((const float4 *)p); }
static __device__ __forceinline__ float mk_bf(unsigned int u) { return __uint_as_float(u << 16); }
static __device__ __forceinline__ float mk_bf_hi(unsigned int u) { return __uint_as_float(u & 0xffff0000u); }
static __device__ __forceinline__ float mk_w1_bf16(const unsigned short *p) { return mk_bf(__ldcs(p)); }
static __device__ __forceinline__ void mk_w4_bf16(const unsigned short *p, float4 *o) {
    const uint2 u = __ldcs((const uint2 *)p);
    o[0] = make_float4(mk_bf(u.x), mk_bf_hi(u.x), mk_bf(u.y), mk_bf_hi(u.y));
}
static __device__ __forceinline__ void mk_x8_bf16(uint4 u, float4 *o) {
    o[0] = make_float4(mk_bf(u.x), mk_bf_hi(u.x), mk_bf(u.y), mk_bf_hi(u.y));
    o[1] = make_float4(mk_bf(u.z), mk_bf_hi(u.z), mk_bf(u.w), mk_bf_hi(u.w));
}
static __device__ __forceinline__ void mk_w8_bf16(const unsigned short *p, float4 *o) {
    mk_x8_bf16(__ldcs((const uint4 *)p), o);
}
static __device__ __forceinline__ float mk_h2f(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
static __device__ __forceinline__ float mk_hf(unsigned int u) { return mk_h2f((unsigned short)u); }
static __device__ __forceinline__ float mk_hf_hi(unsigned int u) { return mk_h2f((unsigned short)(u >> 16)); }
static __device__ __forceinline__ float mk_w1_f16(const unsigned short *p) { return mk_h2f(__ldcs(p)); }
static __device__ __forceinline__ void mk_w4_f16(const unsigned short *p, float4 *o) {
    const uint2 u = __ldcs((const uint2 *)p);
    o[0] = make_float4(mk_hf(u.x), mk_hf_hi(u.x), mk_hf(u.y), mk_hf_hi(u.y));
}
static __device__ __forceinline__ void mk_x8_f16(uint4 u, float4 *o) {
    o[0] = make_float4(mk_hf(u.x), mk_hf_hi(u.x), mk_hf(u.y), mk_hf_hi(u.y));
    o[1] = make_float4(mk_hf(u.z), mk_hf_hi(u.z), mk_hf(u.w), mk_hf_hi(u.w));
}
static __device__ __forceinline__ void mk_w8_f16(const unsigned short *p, float4 *o) {
    mk_x8_f16(__ldcs((const uint4 *)p), o);
}
static __device__ __forceinline__ float mk_w1_i8(const signed char *p) { return (float)__ldcs(p); }
/* four int8 as floats without the quarter-rate I2F: byte + 128 as the low bits
 * of 2^23's mantissa (one PRMT), less 2^23 + 128 (exact) */
static __device__ __forceinline__ float mk_i8f(unsigned int v, unsigned int sel) {
    return __uint_as_float(__byte_perm(v, 0x4b000000u, sel)) - 8388736.0f;
}
static __device__ __forceinline__ float4 mk_i8x4(unsigned int u) {
    const unsigned int v = u ^ 0x80808080u;
    return make_float4(mk_i8f(v, 0x7540u), mk_i8f(v, 0x7541u), mk_i8f(v, 0x7542u), mk_i8f(v, 0x7543u));
}
static __device__ __forceinline__ void mk_w4_i8(const signed char *p, float4 *o) { o[0] = mk_i8x4(__ldcs((const unsigned int *)p)); }
static __device__ __forceinline__ void mk_x16_i8(uint4 u, float4 *o) {
    o[0] = mk_i8x4(u.x); o[1] = mk_i8x4(u.y); o[2] = mk_i8x4(u.z); o[3] = mk_i8x4(u.w);
}
static __device__ __forceinline__ void mk_w16_i8(const signed char *p, float4 *o) {
    mk_x16_i8(__ldcs((const uint4 *)p), o);
}
