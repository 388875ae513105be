/*
 * generated.cu — the kernels core/codegen/ writes for each group: compiled with
 * NVRTC when the model is compiled, loaded with the runtime's library API and
 * launched like any kernel (so each is a node of the model's CUDA graph).
 *
 * Kernels are kept for the process, by the hash of their program (the
 * source less its comments, which name the group's nodes) and the device's
 * architecture: identical layers (same shapes, same program) compile once and
 * share one kernel, whatever the model or context; and on disk, so a second
 * process skips NVRTC. Compiling happens in prepare, before the graph is
 * captured.
 */
#include "cuda_device.h"

#include <errno.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- compiling and the process-wide cache ---------------------------------- */

/* every kernel compiled in this process, by program and architecture
 * (core/codegen/kernel_table.c) */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static mk_kernel_table cache;

/* What decides a kernel is its program: its source without its comments
 * (mk_codegen_program), which name the group's nodes, their ids and lines
 * (different from layer to layer), so that identical layers share one
 * kernel: compiles take a third of the time and decoding is no slower
 * (doc/performance.md, "Kernel cache key"), and editing a comment changes
 * no key. */

/* NVRTC's status as an error, with the first lines of its log. */
static int nvrtc_fail(mk_error **err, nvrtcProgram prog, nvrtcResult r, const mk_launch *l) {
    char log[700] = "";
    size_t size = 0;
    if (prog && nvrtcGetProgramLogSize(prog, &size) == NVRTC_SUCCESS && size > 1) {
        char *full = (char *)malloc(size);
        if (full && nvrtcGetProgramLog(prog, full) == NVRTC_SUCCESS)
            snprintf(log, sizeof log, ": %s", full);
        free(full);
    }
    return mk_fail(err, MK_ERR_DEVICE, l->node->line, l->node->column,
                   "%s: NVRTC could not compile the group's kernel: %s%s", l->node->op->name,
                   nvrtcGetErrorString(r), log);
}

/* ---- the disk cache ------------------------------------------------------------------ */

/*
 * Compiled kernels (cubins) are kept on disk so that a second process skips
 * NVRTC: in $MK_KERNEL_CACHE when set ("off" or "0": no disk cache), else
 * $XDG_CACHE_HOME/moonkaas, else $HOME/.cache/moonkaas. What is trusted and
 * checked (doc/guide.md, "Files"):
 *   - the directory is made 0700; one that another user owns or can write is
 *     refused (a log line, then no disk cache for the call);
 *   - an entry is named by the SHA-256 of everything that decides its code (the
 *     program, the architecture, NVRTC's version and options) and holds a
 *     header: a magic, that key, the cubin's size and its SHA-256. It is
 *     loaded only when all of them match and it is a regular file of this
 *     user, opened without following a link; any mismatch is a log line and a
 *     compile, whose entry replaces it;
 *   - entries are written through mk_file_write_atomic (mkstemp beside the
 *     entry, fsync, rename): readers never see half a file, and no link
 *     planted at a temporary name is followed.
 * Any trouble with the disk just means compiling.
 */
#define CACHE_MAGIC "MKKC0001"
enum { CACHE_HEADER = 8 + 32 + 8 + 32 }; /* magic, key, cubin size (LE), cubin digest */

static const char *const nvrtc_options[] = {"--std=c++17"};

static void cache_log(const mk_host *host, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cache_log(const mk_host *host, const char *fmt, ...) {
    if (!host || !host->log) return;
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    host->log(host, MK_LOG_WARNING, "kernel cache: %s", msg);
}

/* mkdir -p, new directories 0700 (a parent that exists keeps its mode). */
static bool make_dirs(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return false;
    for (char *c = p + 1; *c; c++) {
        if (*c != '/') continue;
        *c = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST) return false;
        *c = '/';
    }
    return mkdir(p, 0700) == 0 || errno == EEXIST;
}

/* The cache directory in dir, made and checked: false (logged where it is
 * refused) when there is none to use. */
static bool cache_dir(char *dir, size_t size, const mk_host *host) {
    const char *env = getenv("MK_KERNEL_CACHE"), *xdg = getenv("XDG_CACHE_HOME"),
               *home = getenv("HOME");
    int n;
    if (env && (!strcmp(env, "off") || !strcmp(env, "0"))) return false;
    if (env && *env) n = snprintf(dir, size, "%s", env);
    else if (xdg && *xdg) n = snprintf(dir, size, "%s/moonkaas", xdg);
    else if (home && *home) n = snprintf(dir, size, "%s/.cache/moonkaas", home);
    else return false;
    if (n <= 0 || (size_t)n >= size) return false;
    if (!make_dirs(dir)) {
        cache_log(host, "cannot make %s (%s): no disk cache", dir, strerror(errno));
        return false;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        cache_log(host, "%s is not a directory: no disk cache", dir);
        return false;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 022)) {
        cache_log(host, "%s is %s (mode %03o): no disk cache; make it the user's own, mode 0700",
                  dir, st.st_uid != geteuid() ? "another user's" : "writable by others",
                  (unsigned)(st.st_mode & 0777));
        return false;
    }
    return true;
}

/* The entry's key: the SHA-256 of everything that decides the cubin. */
static void cache_key(const char *program, int arch, unsigned char key[32]) {
    int major = 0, minor = 0;
    nvrtcVersion(&major, &minor);
    mk_strbuf b = {0};
    mk_strbuf_put(&b, "moonkaas kernel cache 1\nsm_%d\nnvrtc %d.%d\n", arch, major, minor);
    for (size_t i = 0; i < sizeof nvrtc_options / sizeof nvrtc_options[0]; i++)
        mk_strbuf_put(&b, "%s\n", nvrtc_options[i]);
    mk_strbuf_put(&b, "%s", program);
    if (b.failed) memset(key, 0, 32); /* out of memory: a key no entry has */
    else mk_sha256(b.s, b.len, key);
    free(b.s);
}

static bool cache_path(char *path, size_t size, const char *dir, const unsigned char key[32],
                       int arch) {
    char hex[65];
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
    int n = snprintf(path, size, "%s/%s-sm%d.cubin", dir, hex, arch);
    return n > 0 && (size_t)n < size;
}

/* The cubin of the entry at path (malloc'd) if it is one for key, else NULL:
 * nothing there is silent, anything else there is logged. */
static char *cache_read(const char *path, const unsigned char key[32], size_t *size,
                        const mk_host *host) {
    /* no link followed; O_NONBLOCK: a FIFO planted there does not hang the open */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) cache_log(host, "%s: %s; compiled again", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    const char *why = NULL;
    char *data = NULL;
    size_t n = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) why = "not a regular file";
    else if (st.st_uid != geteuid()) why = "another user's file";
    else if (st.st_size < CACHE_HEADER + 4 || st.st_size > (1 << 30)) why = "not an entry (its size)";
    else if (!(data = (char *)malloc((size_t)st.st_size))) why = "out of memory";
    while (!why && n < (size_t)st.st_size) {
        ssize_t k = read(fd, data + n, (size_t)st.st_size - n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) why = "cut short while read";
        else n += (size_t)k;
    }
    close(fd);
    if (!why) {
        const unsigned char *h = (const unsigned char *)data;
        uint64_t bytes = 0;
        for (int i = 7; i >= 0; i--) bytes = bytes << 8 | h[8 + 32 + i];
        unsigned char digest[32];
        if (memcmp(h, CACHE_MAGIC, 8)) why = "not an entry (its magic)";
        else if (memcmp(h + 8, key, 32)) why = "an entry for another program";
        else if (bytes != n - CACHE_HEADER) why = "its size does not match its header";
        else if (mk_sha256(data + CACHE_HEADER, bytes, digest), memcmp(digest, h + 48, 32))
            why = "its cubin does not match its digest";
        else if (memcmp(data + CACHE_HEADER, "\x7f" "ELF", 4)) why = "its cubin is not an ELF file";
    }
    if (why) {
        cache_log(host, "%s: %s; compiled again", path, why);
        free(data);
        return NULL;
    }
    memmove(data, data + CACHE_HEADER, n - CACHE_HEADER);
    *size = n - CACHE_HEADER;
    return data;
}

static void cache_write(const char *path, const unsigned char key[32], const char *cubin,
                        size_t size, const mk_host *host) {
    char *entry = (char *)malloc(CACHE_HEADER + size);
    if (!entry) return;
    memcpy(entry, CACHE_MAGIC, 8);
    memcpy(entry + 8, key, 32);
    for (int i = 0; i < 8; i++) entry[40 + i] = (char)((uint64_t)size >> (8 * i));
    mk_sha256(cubin, size, (unsigned char *)entry + 48);
    memcpy(entry + CACHE_HEADER, cubin, size);
    mk_error *err = NULL;
    if (mk_file_write_atomic(path, entry, CACHE_HEADER + size, 0600, &err))
        cache_log(host, "%s", mk_error_message(err));
    mk_error_free(err);
    free(entry);
}

/* ---- compiling ------------------------------------------------------------------------ */

/* An arch of MK_ARCH_PTX + a: PTX for compute_<a>, which the driver compiles
 * for the GPU it loads on (MK_CUDA_ARCH forcing an older capability: sm_80
 * machine code would not load on sm_90); else machine code for sm_<arch>. */
#define MK_ARCH_PTX 10000

/* NVRTC's cubin of src for sm_<arch> (malloc'd), or its PTX (NUL-terminated)
 * for an MK_ARCH_PTX arch, or NULL with *err set. */
static char *nvrtc_cubin(const char *src, int arch, const mk_launch *l, size_t *size,
                         mk_error **err) {
    nvrtcProgram prog = NULL;
    nvrtcResult r = nvrtcCreateProgram(&prog, src, "moonkaas_group.cu", 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        nvrtc_fail(err, NULL, r, l);
        return NULL;
    }
    char gpu[48];
    bool ptx = arch >= MK_ARCH_PTX;
    if (ptx) snprintf(gpu, sizeof gpu, "--gpu-architecture=compute_%d", arch - MK_ARCH_PTX);
    else snprintf(gpu, sizeof gpu, "--gpu-architecture=sm_%d", arch);
    /* nvcc's defaults (the interpreter's expf and tanhf are built so); the
     * group's own arithmetic is __fadd_rn and friends, never contracted */
    const char *opts[] = {gpu, nvrtc_options[0]};
    r = nvrtcCompileProgram(prog, 2, opts);
    char *cubin = NULL;
    if (r == NVRTC_SUCCESS) r = ptx ? nvrtcGetPTXSize(prog, size) : nvrtcGetCUBINSize(prog, size);
    if (r == NVRTC_SUCCESS && !(cubin = (char *)malloc(*size))) r = NVRTC_ERROR_OUT_OF_MEMORY;
    if (r == NVRTC_SUCCESS) r = ptx ? nvrtcGetPTX(prog, cubin) : nvrtcGetCUBIN(prog, cubin);
    if (r != NVRTC_SUCCESS) {
        nvrtc_fail(err, prog, r, l);
        free(cubin);
        cubin = NULL;
    }
    nvrtcDestroyProgram(&prog);
    return cubin;
}

/*
 * Compiles src for sm_<arch> (or takes the cubin from the disk cache, unless
 * disk is false; *from_disk says which) and, with lib, loads it: the kernel
 * (without lib: any non-NULL value), or NULL with *err set. host (may be
 * NULL) hears why the disk cache was passed over.
 */
static cudaKernel_t compile(const char *src, const char *program, int arch, const mk_launch *l,
                            cudaLibrary_t *lib, bool disk, bool *from_disk, const mk_host *host,
                            mk_error **err) {
    char symbol[MK_KERNEL_NAME_MAX + 16];
    mk_codegen_kernel_name(l, symbol, sizeof symbol);
    char dir[4000], path[4096];
    unsigned char key[32];
    disk = disk && arch < MK_ARCH_PTX; /* the disk keeps cubins only */
    if (disk) cache_key(program, arch, key);
    disk = disk && cache_dir(dir, sizeof dir, host) && cache_path(path, sizeof path, dir, key, arch);
    size_t size = 0;
    char *cubin = disk ? cache_read(path, key, &size, host) : NULL;
    *from_disk = cubin != NULL;
    if (!cubin) {
        if (!(cubin = nvrtc_cubin(src, arch, l, &size, err))) return NULL;
        if (disk) cache_write(path, key, cubin, size, host);
    }
    if (!lib) {
        free(cubin);
        return (cudaKernel_t)1; /* compiled; nothing to load */
    }
    cudaKernel_t kernel = NULL;
    cudaError_t st = cudaLibraryLoadData(lib, cubin, NULL, NULL, 0, NULL, NULL, 0);
    free(cubin);
    if (st == cudaSuccess) st = cudaLibraryGetKernel(&kernel, *lib, symbol);
    if (st != cudaSuccess) {
        mk_cuda_fail_status(err, st, "loading a generated kernel", __FILE__, __LINE__);
        return NULL;
    }
    return kernel;
}

/* With MK_CUDA_DUMP=DIR, each program's source is written to DIR/<hash>_sm<arch>.cu
 * (layers that share it: the last one's) for people reading what runs,
 * through mk_file_write_atomic (a file that cannot be written is skipped). */
static void dump(const char *src, unsigned long long hash, int arch) {
    const char *dir = getenv("MK_CUDA_DUMP");
    if (!dir || !*dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%016llx_sm%d.cu", dir, hash, arch);
    mk_error *err = NULL;
    mk_file_write_atomic(path, src, strlen(src), 0666, &err);
    mk_error_free(err);
}

/* The source of a group's launch, as it is compiled (malloc'd), or NULL:
 * with MK_CUDA_TIMELINE, product kernels stamp their blocks (timeline.cu). */
static char *generate_source(const mk_launch *l, mk_error **err) {
    return mk_codegen_source(l, mk_cuda_timeline_file(), 0, err);
}

/* The kernel of src for launch l: from the cache, else compiled. */
static cudaKernel_t kernel_of(const mk_launch *l, char *src, int arch, bool disk, int *compiled,
                              int *from_disk, const mk_host *host, mk_error **err) {
    char *program = src ? mk_codegen_program(src) : NULL;
    if (!program) {
        if (src) mk_fail(err, MK_ERR_NOMEM, 0, 0, "a generated kernel's program");
        free(src);
        return NULL;
    }
    unsigned long long hash = mk_codegen_program_hash(program);
    dump(src, hash, arch);
    cudaKernel_t kernel = NULL;
    pthread_mutex_lock(&cache_lock);
    const mk_kernel_entry *hit = mk_kernel_table_find(&cache, hash, arch, program);
    if (hit) kernel = (cudaKernel_t)hit->kernel;
    else {
        cudaLibrary_t lib = NULL;
        bool disk_hit = false;
        if ((kernel = compile(src, program, arch, l, &lib, disk, &disk_hit, host, err))) {
            if (mk_kernel_table_add(&cache, hash, arch, program, (void *)lib, (void *)kernel)) {
                mk_fail(err, MK_ERR_NOMEM, 0, 0, "caching a generated kernel");
                cudaLibraryUnload(lib);
                kernel = NULL;
            } else {
                ++*(disk_hit ? from_disk : compiled);
            }
        }
    }
    pthread_mutex_unlock(&cache_lock);
    free(program);
    free(src);
    return kernel;
}

/* The kernel of launch l. Stamped for the timeline, a product kernel keeps
 * the blocks an SM of its unstamped build, which is compiled first. */
static cudaKernel_t kernel_for(const mk_launch *l, int arch, bool disk, int *compiled,
                               int *from_disk, const mk_host *host, mk_error **err) {
    bool stamp = mk_cuda_timeline_file() && mk_node_product(l->node);
    cudaKernel_t kernel = kernel_of(l, mk_codegen_source(l, false, 0, err), arch, disk, compiled,
                                    from_disk, host, err);
    if (!kernel || !stamp) return kernel;
    unsigned int blocks, threads;
    mk_codegen_group_grid(l, &blocks, &threads);
    int occupancy = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occupancy, (const void *)kernel, (int)threads,
                                                      0) != cudaSuccess) {
        cudaGetLastError(); /* stamped as before, at whatever occupancy */
        occupancy = 0;
    }
    return kernel_of(l, mk_codegen_source(l, true, occupancy, err), arch, disk, compiled, from_disk,
                     host, err);
}

int mk_cuda_generate(mk_cuda_state *s, const mk_launch *launches, int n, const mk_host *host,
                     mk_error **err) {
    int arch = 0, total = 0, done = 0, compiled = 0, from_disk = 0;
    for (int i = 0; i < n; i++) total += mk_node_generated(launches[i].node);
    const char *timeline = mk_cuda_timeline_file();
    if (timeline && total && mk_cuda_timeline_open(s, launches, n, timeline, err)) return -1;
    double t0 = mk_now_ms();
    for (int i = 0; i < n; i++) {
        const mk_launch *l = &launches[i];
        if (!mk_node_generated(l->node)) continue;
        if (host->cancelled(host)) return mk_cancelled(err, "compile");
        if (!s->generated) { /* the capability, forced or not (cuda_device.cu's open_arch) */
            arch = s->arch_forced ? MK_ARCH_PTX + s->arch : s->arch;
            const char *pdl = getenv("MK_PDL");
            s->pdl = s->arch >= 90 && !(pdl && !strcmp(pdl, "0"));
            s->generated = (void **)calloc((size_t)n, sizeof *s->generated);
            if (!s->generated) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "generated kernels");
        }
        bool disk = !(host->opts && host->opts->no_kernel_cache);
        if (!(s->generated[i] = (void *)kernel_for(l, arch, disk, &compiled, &from_disk, host, err)))
            return -1;
        host->progress(host, MK_PHASE_KERNELS, ++done, total);
    }
    if (total)
        host->log(host, MK_LOG_INFO, "%d generated kernels ready for %s_%d in %.1f ms: %d compiled "
                  "with NVRTC, %d from the disk cache, the rest from this process's", total,
                  s->arch_forced ? "compute" : "sm", s->arch,
                  mk_now_ms() - t0, compiled, from_disk);
    return 0;
}

/* Launches a generated kernel, with programmatic dependent launch where the
 * device has it (sm_90+) and MK_PDL is not 0 (to measure without it). */
static int launch_generated(const mk_launch *l, unsigned int blocks, unsigned int threads,
                            void **args, const char *what, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = mk_cuda_launch_config(dim3(blocks), dim3(threads), s->stream, s->pdl, &attr);
    cudaError_t st = cudaLaunchKernelExC(&cfg, (const void *)s->generated[l->index], args);
    if (st != cudaSuccess)
        return mk_cuda_fail_status(err, st, "launching a generated kernel", __FILE__, __LINE__);
    return mk_cuda_check_launch(l, what, err);
}

/* A pointwise group's launch: its generated kernel over the whole result. */
int mk_cuda_pointwise_generated(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    if (!s->generated || !s->generated[l->index])
        return MK_INTERNAL(err, "a pointwise group without its generated kernel");
    long long n = mk_tensor_numel(&l->out);
    void *out = l->out.data, *in[MK_X_IN];
    void *args[MK_X_IN + 2];
    int a = 0;
    args[a++] = &out;
    for (int k = 0; k < l->n_in; k++) {
        in[k] = l->in[k].data;
        args[a++] = &in[k];
    }
    args[a++] = &n;
    unsigned int blocks = mk_cuda_blocks(n, MK_CUDA_BLOCK);
    if (blocks > 132u * 16u) blocks = 132u * 16u;
    return launch_generated(l, blocks, MK_CUDA_BLOCK, args, "generated pointwise", err);
}

/* A matrix–vector group's launch: its generated kernel, a warp per column pair. */
int mk_cuda_product(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    if (!s->generated || !s->generated[l->index])
        return MK_INTERNAL(err, "a matrix-vector group without its generated kernel");
    void *out = l->out.data, *in[MK_MAX_INPUTS];
    void *args[MK_MAX_INPUTS + 5];
    int a = 0, index = l->index;
    void *fault = s->fault;
    args[a++] = &out;
    for (int k = 0; k < l->n_in; k++) {
        in[k] = l->in[k].data;
        args[a++] = &in[k];
    }
    args[a++] = &fault;
    args[a++] = &index;
    const mk_product_group *pg = mk_node_product(l->node);
    unsigned int blocks, threads;
    mk_codegen_group_grid(l, &blocks, &threads);
    /* its partial results and counts: state the planner gave it (cuda_launch_memory) */
    void *aux = l->state;
    if (l->state_bytes < mk_codegen_group_aux_bytes(pg))
        return MK_INTERNAL(err, "a group without its device state");
    args[a++] = &aux;
    return launch_generated(l, blocks, threads, args, "generated matrix-vector group", err);
}

/* A row group's launch: its generated kernel, a warp or a block per row
 * (core/codegen/rows.c). */
int mk_cuda_rows_group(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    if (!s->generated || !s->generated[l->index])
        return MK_INTERNAL(err, "a row group without its generated kernel");
    void *out = l->out.data, *in[MK_MAX_INPUTS];
    void *args[MK_MAX_INPUTS + 1];
    int a = 0;
    args[a++] = &out;
    for (int k = 0; k < l->n_in; k++) {
        in[k] = l->in[k].data;
        args[a++] = &in[k];
    }
    unsigned int blocks, threads;
    mk_codegen_group_grid(l, &blocks, &threads);
    return launch_generated(l, blocks, threads, args, "generated row group", err);
}

/* Writes and compiles (or finds on disk) a group's kernel, loading nothing. */
int mk_cuda_generate_check(const mk_launch *l, int arch, mk_error **err) {
    char *src = generate_source(l, err);
    if (!src) return -1;
    char *program = mk_codegen_program(src);
    int rc = -1;
    bool from_disk = false;
    if (!program) mk_fail(err, MK_ERR_NOMEM, 0, 0, "a generated kernel's program");
    else {
        dump(src, mk_codegen_program_hash(program), arch);
        rc = compile(src, program, arch, l, NULL, true, &from_disk, NULL, err) ? 0 : -1;
    }
    free(program);
    free(src);
    return rc;
}
