/*
 * cuda_probe.cu — whether CUDA can run here (the plugin's probe, and a
 * model's open), the empty kernel that tells it and serves as a fence between
 * library launches, and the CUDA and cuBLAS statuses as moonkaas errors.
 */
#include "cuda_device.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* ---- errors ------------------------------------------------------------- */

int mk_cuda_fail_status(mk_error **err, cudaError_t status, const char *what,
                        const char *file, int line) {
    mk_error_code code =
        status == cudaErrorMemoryAllocation ? MK_ERR_NOMEM : MK_ERR_DEVICE;
    /* Clear the thread's last error so later launch checks see only their own. */
    cudaGetLastError();
    return mk_fail(err, code, 0, 0, "%s: %s (%s, %s:%d)", what, cudaGetErrorString(status),
                   cudaGetErrorName(status), file, line);
}

int mk_cuda_fail_blas(mk_error **err, cublasStatus_t status, const char *what,
                      const char *file, int line) {
    mk_error_code code = status == CUBLAS_STATUS_ALLOC_FAILED ? MK_ERR_NOMEM : MK_ERR_DEVICE;
    return mk_fail(err, code, 0, 0, "%s: %s (%s, %s:%d)", what, cublasGetStatusString(status),
                   cublasGetStatusName(status), file, line);
}

int mk_cuda_check_launch(const mk_launch *l, const char *kernel, mk_error **err) {
    cudaError_t status = cudaGetLastError();
    if (status == cudaSuccess) return 0;
    const mk_node *n = l->node;
    return mk_fail(err, MK_ERR_DEVICE, n->line, n->column, "%s: launching %s: %s (%s)",
                   n->op->name, kernel, cudaGetErrorString(status), cudaGetErrorName(status));
}

/* ---- probe -------------------------------------------------------------- */

/* A kernel that does nothing: probing for it tells whether this build's
 * machine code (or PTX) loads on the device; captured, it is a fence
 * (mk_cuda_capture_launches). */
static __global__ void mk_cuda_probe_kernel(void) {}

void mk_cuda_fence(cudaStream_t stream) { mk_cuda_probe_kernel<<<1, 32, 0, stream>>>(); }

static void put_reason(char *reason, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void put_reason(char *reason, size_t size, const char *fmt, ...) {
    if (!reason || !size) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, size, fmt, ap);
    va_end(ap);
}

/*
 * Whether CUDA can run here, and if not, which of four reasons: no driver at
 * all (libcuda.so.1 cannot be opened: the runtime calls that "driver version is
 * insufficient" too), a driver older than this build's runtime, no device, or a
 * device this build has no code for. A missing plugin is the core's reason
 * (core/plugin.c).
 */
int mk_cuda_probe(char *reason, size_t size) {
    int count = 0;
    cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaErrorInsufficientDriver) {
        cudaGetLastError();
        void *libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        int driver = 0, runtime = 0;
        cudaDriverGetVersion(&driver);
        cudaRuntimeGetVersion(&runtime);
        if (!libcuda || driver == 0)
            put_reason(reason, size, "no NVIDIA driver found (libcuda.so.1 not loadable)");
        else
            put_reason(reason, size, "the NVIDIA driver is too old: it runs CUDA %d.%d, this "
                       "build's runtime needs CUDA %d.%d (update the driver)", driver / 1000,
                       driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
        if (libcuda) dlclose(libcuda);
        return 0;
    }
    if (status == cudaErrorNoDevice || (status == cudaSuccess && count < 1)) {
        cudaGetLastError();
        put_reason(reason, size, "the NVIDIA driver found no CUDA-capable device");
        return 0;
    }
    if (status != cudaSuccess) {
        cudaGetLastError();
        put_reason(reason, size, "cudaGetDeviceCount: %s", cudaGetErrorString(status));
        return 0;
    }
    cudaDeviceProp prop;
    status = cudaGetDeviceProperties(&prop, 0);
    if (status != cudaSuccess) {
        cudaGetLastError();
        put_reason(reason, size, "cudaGetDeviceProperties: %s", cudaGetErrorString(status));
        return 0;
    }
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(0);
    cudaFuncAttributes attr;
    status = cudaFuncGetAttributes(&attr, mk_cuda_probe_kernel);
    cudaSetDevice(previous);
    if (status != cudaSuccess) {
        cudaGetLastError();
        put_reason(reason, size, "device 0 (%s, compute capability %d.%d) cannot run this "
                   "build's kernels: %s", prop.name, prop.major, prop.minor,
                   cudaGetErrorString(status));
        return 0;
    }
    const char *forced = getenv("MK_CUDA_ARCH"); /* checked when a model's device opens */
    put_reason(reason, size, "%s (compute capability %d.%d%s%s%s)", prop.name, prop.major,
               prop.minor, forced && *forced ? "; MK_CUDA_ARCH=" : "", forced ? forced : "",
               forced && *forced ? " forces an older one's paths" : "");
    return 1;
}
