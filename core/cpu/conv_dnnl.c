/*
 * conv_dnnl.c — the CPU's convolutions through oneDNN (Debian's libdnnl 2.x C
 * API), opened with dlopen the first time a model with a convolution
 * chooses it, so processes that never do map neither it nor its OpenCL
 * loader. device.c's cpu_prepare makes one oneDNN convolution per launch:
 * with the layouts oneDNN prefers (blocked, nChw8c on AVX2), so that
 * x, the weights and the result are reordered around it at every
 * evaluation (the weights too: a constant's tensor may be changed in place
 * after compile, t:set), or with $MK_DNNL_LAYOUT=plain, NCHW as they are.
 * Where the library is missing or refuses the shape, the launch stays on
 * im2col (conv.c) and the compile's log says why.
 *
 * Which launches take it: device.c's prepare_dnnl (the rule, $MK_CPU_CONV).
 */
#include "cpu.h"
#include "conv.h"

#include <stdio.h>

#ifndef MK_WITH_DNNL /* built where oneDNN's header is missing: im2col only */

mk_cpu_dnnl_conv *mk_cpu_dnnl_conv_make(const mk_launch *l, char *why, size_t size) {
    (void)l;
    snprintf(why, size, "this build has no oneDNN (its header was missing)");
    return NULL;
}
void mk_cpu_dnnl_conv_free(mk_cpu_dnnl_conv *c) { (void)c; }
int mk_cpu_dnnl_conv_run(const mk_cpu_dnnl_conv *c, const mk_launch *l, mk_error **err) {
    (void)c;
    return MK_INTERNAL(err, "a oneDNN convolution in a build without oneDNN");
}

#else

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the library ------------------------------------------------------------ */

#define DNNL_FUNCTIONS(X)                                                                   \
    X(dnnl_engine_create) X(dnnl_stream_create) X(dnnl_stream_destroy)                    \
    X(dnnl_memory_desc_init_by_tag) X(dnnl_dilated_convolution_forward_desc_init)         \
    X(dnnl_primitive_desc_create) X(dnnl_primitive_desc_query_md)                         \
    X(dnnl_primitive_desc_destroy) X(dnnl_memory_desc_equal) X(dnnl_primitive_create)     \
    X(dnnl_primitive_destroy) X(dnnl_memory_create) X(dnnl_memory_destroy)                \
    X(dnnl_memory_set_data_handle) X(dnnl_reorder_primitive_desc_create)                  \
    X(dnnl_primitive_execute) X(dnnl_stream_wait)

static struct {
#define DNNL_FIELD(f) __typeof__(f) *f;
    DNNL_FUNCTIONS(DNNL_FIELD)
#undef DNNL_FIELD
    dnnl_engine_t engine;
    char why[256]; /* why it cannot be used, or "" */
} dnnl;
static pthread_once_t dnnl_once = PTHREAD_ONCE_INIT;

static void dnnl_open(void) {
    const char *name = getenv("MK_DNNL");
    if (!name || !*name) name = "libdnnl.so.2";
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(dnnl.why, sizeof dnnl.why, "oneDNN cannot be opened: %s", dlerror());
        return;
    }
#define DNNL_LOAD(f)                                                                       \
    if (!(dnnl.f = (__typeof__(f) *)dlsym(lib, #f))) {                                      \
        snprintf(dnnl.why, sizeof dnnl.why, "%s has no %s", name, #f);                      \
        dlclose(lib);                                                                      \
        return;                                                                            \
    }
    DNNL_FUNCTIONS(DNNL_LOAD)
#undef DNNL_LOAD
    if (dnnl.dnnl_engine_create(&dnnl.engine, dnnl_cpu, 0) != dnnl_success) {
        snprintf(dnnl.why, sizeof dnnl.why, "oneDNN has no CPU engine");
        dnnl.engine = NULL;
        return; /* the library stays open: a process's life, as a linked one would */
    }
}

/* ---- one launch's convolution ----------------------------------------------- */

enum { SRC, WEI, DST, N_ARGS };

struct mk_cpu_dnnl_conv {
    dnnl_stream_t stream;
    dnnl_primitive_t conv;
    dnnl_memory_t user[N_ARGS]; /* the model's memory (handles set at each run) */
    dnnl_memory_t mine[N_ARGS]; /* oneDNN's layout where it differs, else NULL */
    dnnl_primitive_t reorder[N_ARGS];
};

void mk_cpu_dnnl_conv_free(mk_cpu_dnnl_conv *c) {
    if (!c) return;
    for (int k = 0; k < N_ARGS; k++) {
        if (c->reorder[k]) dnnl.dnnl_primitive_destroy(c->reorder[k]);
        if (c->mine[k]) dnnl.dnnl_memory_destroy(c->mine[k]);
        if (c->user[k]) dnnl.dnnl_memory_destroy(c->user[k]);
    }
    if (c->conv) dnnl.dnnl_primitive_destroy(c->conv);
    if (c->stream) dnnl.dnnl_stream_destroy(c->stream);
    free(c);
}

/* The memory of argument k in the layout `want` (the primitive's): the
 * model's own where they agree, else oneDNN's with a reorder between them
 * (into it for x and the weights, out of it for the result). */
static bool bind_arg(mk_cpu_dnnl_conv *c, int k, const dnnl_memory_desc_t *user,
                     const dnnl_memory_desc_t *want) {
    if (dnnl.dnnl_memory_create(&c->user[k], user, dnnl.engine, DNNL_MEMORY_NONE) != dnnl_success)
        return false;
    if (dnnl.dnnl_memory_desc_equal(user, want)) return true;
    if (dnnl.dnnl_memory_create(&c->mine[k], want, dnnl.engine, DNNL_MEMORY_ALLOCATE) !=
        dnnl_success)
        return false;
    dnnl_primitive_desc_t pd = NULL;
    bool out = k == DST;
    bool ok = dnnl.dnnl_reorder_primitive_desc_create(&pd, out ? want : user, dnnl.engine,
                                                      out ? user : want, dnnl.engine,
                                                      NULL) == dnnl_success &&
              dnnl.dnnl_primitive_create(&c->reorder[k], pd) == dnnl_success;
    if (pd) dnnl.dnnl_primitive_desc_destroy(pd);
    return ok;
}

static mk_cpu_dnnl_conv *make(const mk_launch *l, char *why, size_t size) {
    mk_conv_geom g = mk_conv_geom_of(l->node);
    const char *layout = getenv("MK_DNNL_LAYOUT");
    bool plain = layout && !strcmp(layout, "plain");
    dnnl_dims_t xd = {g.n, g.c, g.h, g.w}, yd = {g.n, g.o, g.oh, g.ow};
    dnnl_dims_t wd = {g.groups, g.o / g.groups, g.c / g.groups, g.kh, g.kw};
    dnnl_dims_t wd4 = {g.o, g.c / g.groups, g.kh, g.kw};
    dnnl_dims_t stride = {g.sh, g.sw}, dil = {g.dh - 1, g.dw - 1}, pad = {g.ph, g.pw};
    bool grouped = g.groups > 1;
    dnnl_memory_desc_t user[N_ARGS], any[N_ARGS];
    const dnnl_dims_t *dims[N_ARGS] = {&xd, grouped ? &wd : &wd4, &yd};
    dnnl_format_tag_t tags[N_ARGS] = {dnnl_nchw, grouped ? dnnl_goihw : dnnl_oihw, dnnl_nchw};
    int ranks[N_ARGS] = {4, grouped ? 5 : 4, 4};
    for (int k = 0; k < N_ARGS; k++)
        if (dnnl.dnnl_memory_desc_init_by_tag(&user[k], ranks[k], *dims[k], dnnl_f32, tags[k]) !=
                dnnl_success ||
            dnnl.dnnl_memory_desc_init_by_tag(&any[k], ranks[k], *dims[k], dnnl_f32,
                                              plain ? tags[k] : dnnl_format_tag_any) !=
                dnnl_success) {
            snprintf(why, size, "oneDNN refuses the shapes of %s $%d", l->node->op->name,
                     l->node->id);
            return NULL;
        }
    dnnl_convolution_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    mk_cpu_dnnl_conv *c = calloc(1, sizeof *c);
    if (!c ||
        dnnl.dnnl_dilated_convolution_forward_desc_init(
            &desc, dnnl_forward_inference, dnnl_convolution_direct, &any[SRC], &any[WEI], NULL,
            &any[DST], stride, dil, pad, pad) != dnnl_success ||
        dnnl.dnnl_primitive_desc_create(&pd, &desc, NULL, dnnl.engine, NULL) != dnnl_success) {
        snprintf(why, size, "oneDNN has no convolution for %s $%d", l->node->op->name,
                 l->node->id);
        free(c);
        return NULL;
    }
    dnnl_query_t queries[N_ARGS] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md};
    bool ok = dnnl.dnnl_primitive_create(&c->conv, pd) == dnnl_success &&
              dnnl.dnnl_stream_create(&c->stream, dnnl.engine, dnnl_stream_default_flags) ==
                  dnnl_success;
    for (int k = 0; ok && k < N_ARGS; k++)
        ok = bind_arg(c, k, &user[k], dnnl.dnnl_primitive_desc_query_md(pd, queries[k], 0));
    dnnl.dnnl_primitive_desc_destroy(pd);
    if (!ok) {
        snprintf(why, size, "oneDNN could not make the convolution of %s $%d",
                 l->node->op->name, l->node->id);
        mk_cpu_dnnl_conv_free(c);
        return NULL;
    }
    return c;
}

mk_cpu_dnnl_conv *mk_cpu_dnnl_conv_make(const mk_launch *l, char *why, size_t size) {
    pthread_once(&dnnl_once, dnnl_open);
    if (!dnnl.engine) {
        snprintf(why, size, "%s", dnnl.why);
        return NULL;
    }
#ifdef _OPENMP
    /* oneDNN fixes a primitive's parallel split by OpenMP's count when it
     * makes it, and forks that many threads at every run whatever the count
     * then: the launch's cap (else a model of threads = 1 would fork) */
    int outer = omp_get_max_threads();
    omp_set_num_threads(max_threads());
#endif
    mk_cpu_dnnl_conv *c = make(l, why, size);
#ifdef _OPENMP
    omp_set_num_threads(outer);
#endif
    return c;
}

/* The launch's convolution: reorders in, the convolution, the reorder out. */
int mk_cpu_dnnl_conv_run(const mk_cpu_dnnl_conv *c, const mk_launch *l, mk_error **err) {
    void *data[N_ARGS] = {l->in[0].data, l->in[1].data, l->out.data};
#ifdef _OPENMP
    /* oneDNN's regions take OpenMP's count: the launch's cap for this call */
    int outer = omp_get_max_threads();
    omp_set_num_threads(max_threads());
#endif
    dnnl_memory_t use[N_ARGS];
    bool ok = true;
    for (int k = 0; k < N_ARGS; k++) {
        ok = ok && dnnl.dnnl_memory_set_data_handle(c->user[k], data[k]) == dnnl_success;
        use[k] = c->mine[k] ? c->mine[k] : c->user[k];
    }
    for (int k = SRC; ok && k <= WEI; k++)
        if (c->reorder[k])
            ok = dnnl.dnnl_primitive_execute(
                     c->reorder[k], c->stream, 2,
                     (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, c->user[k]}, {DNNL_ARG_TO, c->mine[k]}}) ==
                 dnnl_success;
    ok = ok && dnnl.dnnl_primitive_execute(c->conv, c->stream, 3,
                                           (dnnl_exec_arg_t[]){{DNNL_ARG_SRC, use[SRC]},
                                                               {DNNL_ARG_WEIGHTS, use[WEI]},
                                                               {DNNL_ARG_DST, use[DST]}}) ==
                   dnnl_success;
    if (ok && c->reorder[DST])
        ok = dnnl.dnnl_primitive_execute(
                 c->reorder[DST], c->stream, 2,
                 (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, c->mine[DST]}, {DNNL_ARG_TO, c->user[DST]}}) ==
             dnnl_success;
    ok = ok && dnnl.dnnl_stream_wait(c->stream) == dnnl_success;
#ifdef _OPENMP
    omp_set_num_threads(outer);
#endif
    if (!ok)
        return mk_fail(err, MK_ERR_DEVICE, l->node->line, l->node->column,
                       "%s $%d: oneDNN's convolution failed", l->node->op->name, l->node->id);
    return 0;
}

#endif
