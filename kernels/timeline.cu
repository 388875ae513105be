/*
 * timeline.cu — where a step's time goes inside the CUDA graph, for people
 * measuring (MK_CUDA_TIMELINE=FILE; cuda_device.h says what the kernels
 * stamp). No profiler sees inside one graph launch of programmatic dependent
 * launches as cheaply: a launch's blocks start while the one before still
 * runs, so what matters is when each launch's wait ends and when its last
 * block ends.
 *
 * For each stamped launch, over the evaluations (a run_steps call's graph
 * launch counts once, with the stamps of its last step), the table has the
 * means, in microseconds from the evaluation's first stamped block start, of:
 * its first block's start, the first end of a wait, its last block's start
 * and its last warp's end; and that end less the stamped launch's before it
 * (what the launch adds to the step, with any unstamped launches between);
 * then its blocks, and for a generated kernel the waves they make (blocks
 * over what the SMs hold at once: Llama-2-7B int8's w1 / w3, 688 blocks of
 * 3 an SM on 132 SMs, 1.74; its last blocks start once the first leave).
 * The stamps cost each block two stores and a few atomics, and a stamped
 * kernel is compiled to fit as many blocks an SM as its unstamped build
 * (generated.cu): the table is close to an unstamped step, and the
 * evaluations themselves are slower (the host copies and clears the stamps
 * after each); doc/performance.md, "Timeline stamps", has the figures.
 */
#include "cuda_device.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static_assert(sizeof(mk_fault_rec) <= MK_TIMELINE_AT, "the stamps start past the fault record");

typedef struct mk_cuda_timeline {
    char *path;
    int n;                     /* the model's launches */
    unsigned *blocks;          /* [n] stamped blocks of each launch, 0: not stamped */
    unsigned *grid, *threads;  /* [n] its blocks; their threads for a generated kernel, else 0 */
    char **label;              /* [n] the group's comment line, or NULL */
    unsigned long long *stamp; /* [n][MK_TIMELINE_BLOCKS][3]: the last evaluation's */
    double (*sum)[4];          /* [n] first start, first wait, last start, last end */
    long long *runs;           /* [n] evaluations summed */
    size_t bytes;              /* of the stamps */
} mk_cuda_timeline;

const char *mk_cuda_timeline_file(void) {
    const char *path = getenv("MK_CUDA_TIMELINE");
    return path && *path ? path : NULL;
}

static void timeline_free(mk_cuda_timeline *t) {
    if (!t) return;
    for (int i = 0; t->label && i < t->n; i++) free(t->label[i]);
    free(t->label);
    free(t->blocks);
    free(t->grid);
    free(t->threads);
    free(t->stamp);
    free(t->sum);
    free(t->runs);
    free(t->path);
    free(t);
}

int mk_cuda_timeline_open(mk_cuda_state *s, const mk_launch *launches, int n, const char *path,
                          mk_error **err) {
    mk_cuda_timeline *t = (mk_cuda_timeline *)calloc(1, sizeof *t);
    if (t) {
        t->n = n;
        t->bytes = (size_t)n * MK_TIMELINE_BLOCKS * 3 * sizeof(unsigned long long);
        t->path = strdup(path);
        t->blocks = (unsigned *)calloc((size_t)n, sizeof *t->blocks);
        t->grid = (unsigned *)calloc((size_t)n, sizeof *t->grid);
        t->threads = (unsigned *)calloc((size_t)n, sizeof *t->threads);
        t->label = (char **)calloc((size_t)n, sizeof *t->label);
        t->stamp = (unsigned long long *)malloc(t->bytes);
        t->sum = (double(*)[4])calloc((size_t)n, sizeof *t->sum);
        t->runs = (long long *)calloc((size_t)n, sizeof *t->runs);
    }
    if (!t || !t->path || !t->blocks || !t->grid || !t->threads || !t->label || !t->stamp ||
        !t->sum || !t->runs) {
        timeline_free(t);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "the CUDA timeline (MK_CUDA_TIMELINE)");
    }
    for (int i = 0; i < n; i++) {
        const mk_product_group *pg = mk_node_product(launches[i].node);
        if (launches[i].node->op->kernel == MK_KERNEL_SAMPLE) {
            unsigned blocks = mk_cuda_sample_blocks(&launches[i]);
            t->blocks[i] = blocks < MK_TIMELINE_BLOCKS ? blocks : MK_TIMELINE_BLOCKS;
            t->grid[i] = blocks;
            t->label[i] = mk_cuda_sample_label(&launches[i]);
        }
        if (!pg) continue;
        unsigned blocks, threads;
        mk_codegen_group_grid(&launches[i], &blocks, &threads);
        t->blocks[i] = blocks < MK_TIMELINE_BLOCKS ? blocks : MK_TIMELINE_BLOCKS;
        t->grid[i] = blocks, t->threads[i] = threads;
        /* the source's first line names the group: "// moonkaas <group>" */
        mk_strbuf src = {0};
        mk_codegen_group_source(&src, &launches[i]);
        if (src.s) {
            const char *from = strncmp(src.s, "// moonkaas ", 12) ? src.s : src.s + 12;
            t->label[i] = strndup(from, strcspn(from, "\n"));
        }
        free(src.s);
    }
    /* the fault record again, with the stamps' room after it; nothing holds
     * its address yet (the graph is captured after the kernels are made) */
    cudaFree(s->fault);
    s->fault = NULL;
    s->timeline = t;
    MK_CUDA_TRY(err, cudaMalloc((void **)&s->fault, MK_TIMELINE_AT + t->bytes));
    MK_CUDA_TRY(err, cudaMemset(s->fault, 0, MK_TIMELINE_AT + t->bytes));
    return 0;
fail:
    return -1;
}

unsigned long long *mk_cuda_timeline_stamps(const mk_cuda_state *s, int launch) {
    const mk_cuda_timeline *t = s->timeline;
    if (!t || launch < 0 || launch >= t->n || !t->blocks[launch]) return NULL;
    return (unsigned long long *)((char *)s->fault + MK_TIMELINE_AT) +
           3 * (size_t)launch * MK_TIMELINE_BLOCKS;
}

void mk_cuda_timeline_take(mk_cuda_state *s) {
    mk_cuda_timeline *t = s->timeline;
    unsigned char *at = (unsigned char *)s->fault + MK_TIMELINE_AT;
    if (cudaMemcpy(t->stamp, at, t->bytes, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemset(at, 0, t->bytes) != cudaSuccess) {
        cudaGetLastError();
        return; /* a timeline without this evaluation */
    }
    unsigned long long t0 = ~0ull;
    for (int i = 0; i < t->n; i++)
        for (unsigned b = 0; b < t->blocks[i]; b++) {
            unsigned long long start = t->stamp[3 * ((size_t)i * MK_TIMELINE_BLOCKS + b)];
            if (start && start < t0) t0 = start;
        }
    for (int i = 0; i < t->n; i++) {
        unsigned long long first = ~0ull, wait = ~0ull, last = 0, end = 0;
        for (unsigned b = 0; b < t->blocks[i]; b++) {
            const unsigned long long *v = &t->stamp[3 * ((size_t)i * MK_TIMELINE_BLOCKS + b)];
            if (!v[0]) continue; /* a block that did not run (a faulted evaluation) */
            if (v[0] < first) first = v[0];
            if (v[0] > last) last = v[0];
            if (v[1] && v[1] < wait) wait = v[1];
            if (v[2] > end) end = v[2];
        }
        if (!last || wait == ~0ull || !end) continue;
        t->sum[i][0] += (double)(first - t0);
        t->sum[i][1] += (double)(wait - t0);
        t->sum[i][2] += (double)(last - t0);
        t->sum[i][3] += (double)(end - t0);
        t->runs[i]++;
    }
}

/* Launch i's blocks over those the device's SMs hold at once (its generated
 * kernel's occupancy), into w ("-" where not known: the sampler's clusters). */
static void waves_of(const mk_cuda_state *s, const mk_cuda_timeline *t, int i, int sms, char *w,
                     size_t size) {
    int per = 0;
    snprintf(w, size, "-");
    if (!t->threads[i] || !s->generated || !s->generated[i] || sms <= 0) return;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, (const void *)s->generated[i],
                                                      (int)t->threads[i], 0) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    if (per > 0) snprintf(w, size, "%.3g", (double)t->grid[i] / ((double)per * sms));
}

void mk_cuda_timeline_close(mk_cuda_state *s) {
    mk_cuda_timeline *t = s->timeline;
    if (!t) return;
    s->timeline = NULL;
    long long runs = 0;
    for (int i = 0; i < t->n; i++) runs = t->runs[i] > runs ? t->runs[i] : runs;
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, s->device) != cudaSuccess)
        cudaGetLastError();
    /* appended (several models share one file), never through a link planted at
     * the path; a file that cannot be written is skipped */
    int fd = runs ? open(t->path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "a") : NULL;
    if (fd >= 0 && !f) close(fd);
    if (f) {
        fprintf(f, "# moonkaas CUDA timeline: a model of %d launches, %lld evaluations; means in "
                   "microseconds from an evaluation's first stamped block start; its blocks, and "
                   "waves of them (blocks over those the SMs hold at once)\n"
                   "# launch  first start  first wait  last start  last end  added  blocks  waves  group\n",
                t->n, runs);
        double before = 0.0;
        for (int i = 0; i < t->n; i++) {
            if (!t->runs[i]) continue;
            double m[4];
            for (int k = 0; k < 4; k++) m[k] = t->sum[i][k] / (double)t->runs[i] * 1e-3;
            char w[32];
            waves_of(s, t, i, sms, w, sizeof w);
            fprintf(f, "%8d  %11.2f  %10.2f  %10.2f  %8.2f  %5.2f  %6u  %7s  %s\n", i, m[0], m[1],
                    m[2], m[3], m[3] - before, t->grid[i], w, t->label[i] ? t->label[i] : "");
            before = m[3];
        }
        fclose(f);
    }
    timeline_free(t);
}
