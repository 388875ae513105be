// dev/gpu/memory_probe.cu: the device memory each CUDA/cuBLAS step a model's
// compile makes takes (cudaMemGetInfo around each), twice. On the GPU machine:
//   nvcc -arch=sm_90 -o /tmp/probe dev/gpu/memory_probe.cu -lcublas && /tmp/probe
// (an H100, CUDA 13: cublasCreate 66-68 MiB, a graph's first instantiation 2 MiB)
#include <cstdio>
#include <cuda_runtime.h>
#include <cublas_v2.h>
__global__ void k(float *p) { if (p) p[threadIdx.x] = 1; }
static size_t fr() { size_t f, t; cudaMemGetInfo(&f, &t); return f; }
#define STEP(name, ...) do { size_t a = fr(); __VA_ARGS__; cudaDeviceSynchronize(); size_t b = fr(); \
  printf("%-34s %8.2f MiB\n", name, ((double)a - (double)b) / 1048576.0); } while (0)
int main() {
  cudaFree(0);
  for (int round = 0; round < 2; round++) {
    printf("round %d\n", round);
    cudaStream_t s; cublasHandle_t h; float *p; cudaGraph_t g; cudaGraphExec_t e;
    STEP("cudaStreamCreate", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    STEP("cublasCreate", cublasCreate(&h));
    STEP("cublasSetStream", cublasSetStream(h, s));
    STEP("cudaMalloc 2 KiB", cudaMalloc(&p, 2048));
    STEP("first kernel launch", k<<<1, 32, 0, s>>>(p));
    STEP("capture + instantiate", cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
         k<<<1, 32, 0, s>>>(p); cudaStreamEndCapture(s, &g); cudaGraphInstantiate(&e, g, 0));
    STEP("graph launch", cudaGraphLaunch(e, s));
    STEP("destroy all", cudaGraphExecDestroy(e); cudaGraphDestroy(g); cudaFree(p); cublasDestroy(h); cudaStreamDestroy(s));
  }
  return 0;
}
