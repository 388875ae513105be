// pointwise_ops.cuh — the operations of a pointwise program that are not one
// CUDA C expression: Python's % and // (the expression language's floormod and
// floordiv), in float32 and int64, as the CPU computes them (core/cpu/ops.c)
// and the interpreter does (kernels/pointwise.cu). The generator pastes this
// before a kernel whose program uses them.
static __device__ __forceinline__ float mk_floormod(float x, float y) {
    float r = fmodf(x, y);
    return r != 0.0f && (r < 0.0f) != (y < 0.0f) ? __fadd_rn(r, y) : r;
}
static __device__ __forceinline__ float mk_floordiv(float x, float y) {
    if (y == 0.0f) return __fdiv_rn(x, y);
    float m = fmodf(x, y), d = __fdiv_rn(__fsub_rn(x, m), y);
    if (m != 0.0f && (y < 0.0f) != (m < 0.0f)) d = __fsub_rn(d, 1.0f);
    if (d == 0.0f) return copysignf(0.0f, __fdiv_rn(x, y));
    float f = floorf(d);
    return __fsub_rn(d, f) > 0.5f ? __fadd_rn(f, 1.0f) : f;
}
// integers by 0 give 0 (NumPy's), and by -1 never divide (LLONG_MIN / -1 traps)
static __device__ __forceinline__ long long mk_floormod(long long x, long long y) {
    if (y == 0 || y == -1) return 0;
    long long r = x % y;
    return r != 0 && (r < 0) != (y < 0) ? r + y : r;
}
static __device__ __forceinline__ long long mk_floordiv(long long x, long long y) {
    if (y == 0) return 0;
    if (y == -1) return (long long)(0ull - (unsigned long long)x);
    long long q = x / y;
    return x % y != 0 && (x < 0) != (y < 0) ? q - 1 : q;
}
