/*
 * conv_dnnl.c — the CPU's convolutions through oneDNN (Debian's libdnnl 2.x C
 * API), opened with dlopen the first time a model with a convolution
 * chooses it, so processes that never do map neither it nor its OpenCL
 * loader. Each launch's convolution is made once, at prepare (conv_group.c's
 * mk_cpu_conv_prepare), with the layouts oneDNN prefers (blocked, nChw8c on
 * AVX2), so that x and the result are reordered around it at every run
 * (unless handed over between convolutions in that layout: conv_group.c's
 * chain decides, mk_cpu_dnnl_conv_chain records it), constant weights once,
 * there (or with $MK_DNNL_LAYOUT=plain, NCHW as they are); a convolution
 * group's bias is oneDNN's, its residual add and ReLU post-ops (a sum into
 * the result, which first holds the residual, and an eltwise ReLU). Where
 * the library is missing or refuses the shape, the launch stays on im2col
 * (conv.c) and the compile's log says why.
 *
 * Which launches take it: conv_group.c (the rule, $MK_CPU_CONV).
 */
#include "cpu.h"
#include "conv.h"

#include <stdio.h>

#ifndef MK_WITH_DNNL /* built where oneDNN's header is missing: im2col only */

mk_cpu_dnnl_conv *mk_cpu_dnnl_conv_make(const mk_cpu_conv_spec *sp, const mk_node *node,
                                        char *why, size_t size) {
    (void)sp, (void)node;
    snprintf(why, size, "this build has no oneDNN (its header was missing)");
    return NULL;
}
void mk_cpu_dnnl_conv_free(mk_cpu_dnnl_conv *c) { (void)c; }
int mk_cpu_dnnl_conv_run(const mk_cpu_dnnl_conv *c, const mk_cpu_conv_args *a,
                         const mk_node *node, mk_error **err) {
    (void)c, (void)a, (void)node;
    return MK_INTERNAL(err, "a oneDNN convolution in a build without oneDNN");
}
int mk_cpu_dnnl_conv_block(const mk_cpu_dnnl_conv *c, mk_cpu_dnnl_chain which) {
    (void)c, (void)which;
    return 0;
}
int mk_cpu_dnnl_conv_chain(mk_cpu_dnnl_conv *c, mk_cpu_dnnl_chain what) {
    (void)c, (void)what;
    return -1;
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
    X(dnnl_primitive_execute) X(dnnl_stream_wait) X(dnnl_post_ops_create)                  \
    X(dnnl_post_ops_destroy) X(dnnl_post_ops_append_sum) X(dnnl_post_ops_append_eltwise)  \
    X(dnnl_primitive_attr_create) X(dnnl_primitive_attr_destroy)                          \
    X(dnnl_primitive_attr_set_post_ops) X(dnnl_memory_get_data_handle)                  \
    X(dnnl_set_max_cpu_isa)

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
    /* oneDNN 2.6.3's AVX-512 kernels crash on some small convolutions of
     * spec/cases/conv.lua on a Xeon with AMX (a read at address 0xc1), where
     * its AVX2 kernels are right: AVX2 at most, unless the environment names
     * the instruction set (oneDNN's ONEDNN_MAX_CPU_ISA, DNNL_MAX_CPU_ISA) */
    if (!getenv("ONEDNN_MAX_CPU_ISA") && !getenv("DNNL_MAX_CPU_ISA"))
        dnnl.dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
    if (dnnl.dnnl_engine_create(&dnnl.engine, dnnl_cpu, 0) != dnnl_success) {
        snprintf(dnnl.why, sizeof dnnl.why, "oneDNN has no CPU engine");
        dnnl.engine = NULL;
        return; /* the library stays open: a process's life, as a linked one would */
    }
}

/* ---- one launch's convolution ----------------------------------------------- */

enum { SRC, WEI, DST, BIA, N_ARGS };

struct mk_cpu_dnnl_conv {
    dnnl_stream_t stream;
    dnnl_primitive_t conv;
    dnnl_memory_t user[N_ARGS]; /* the model's memory (handles set at each run) */
    dnnl_memory_t mine[N_ARGS]; /* oneDNN's layout where it differs, else NULL */
    dnnl_primitive_t reorder[N_ARGS];
    dnnl_memory_t res_user;     /* the residual, in the result's user layout */
    dnnl_primitive_t res_reorder; /* it into the result's layout, where that differs */
    bool weights_once;          /* the weights were laid out at make, for the model's life */
    bool bias, residual;
    /* The primitive's own layouts of x and the result, and memory over the
     * model's in them (handles set at each run) where a neighbour convolution
     * hands x, the residual or the result over in that layout (chain). */
    dnnl_memory_desc_t src_md, dst_md;
    int src_block, dst_block;   /* 8 or 16 where that layout is nChw8c or nChw16c, else 0 */
    dnnl_memory_t blk_src, blk_dst;
    bool src_blocked, dst_blocked, res_blocked;
};

void mk_cpu_dnnl_conv_free(mk_cpu_dnnl_conv *c) {
    if (!c) return;
    for (int k = 0; k < N_ARGS; k++) {
        if (c->reorder[k]) dnnl.dnnl_primitive_destroy(c->reorder[k]);
        if (c->mine[k]) dnnl.dnnl_memory_destroy(c->mine[k]);
        if (c->user[k]) dnnl.dnnl_memory_destroy(c->user[k]);
    }
    if (c->res_reorder) dnnl.dnnl_primitive_destroy(c->res_reorder);
    if (c->res_user) dnnl.dnnl_memory_destroy(c->res_user);
    if (c->blk_src) dnnl.dnnl_memory_destroy(c->blk_src);
    if (c->blk_dst) dnnl.dnnl_memory_destroy(c->blk_dst);
    if (c->conv) dnnl.dnnl_primitive_destroy(c->conv);
    if (c->stream) dnnl.dnnl_stream_destroy(c->stream);
    free(c);
}

static bool make_reorder(dnnl_primitive_t *r, const dnnl_memory_desc_t *from,
                         const dnnl_memory_desc_t *to) {
    dnnl_primitive_desc_t pd = NULL;
    bool ok = dnnl.dnnl_reorder_primitive_desc_create(&pd, from, dnnl.engine, to, dnnl.engine,
                                                      NULL) == dnnl_success &&
              dnnl.dnnl_primitive_create(r, pd) == dnnl_success;
    if (pd) dnnl.dnnl_primitive_desc_destroy(pd);
    return ok;
}

/* The memory of argument k in the layout `want` (the primitive's): the
 * model's own where they agree, else oneDNN's with a reorder between them
 * (into it for the operands, out of it for the result; for a result that a
 * residual is summed into, the residual into it). */
static bool bind_arg(mk_cpu_dnnl_conv *c, int k, const dnnl_memory_desc_t *user,
                     const dnnl_memory_desc_t *want) {
    if (dnnl.dnnl_memory_create(&c->user[k], user, dnnl.engine, DNNL_MEMORY_NONE) != dnnl_success)
        return false;
    if (dnnl.dnnl_memory_desc_equal(user, want)) return true;
    if (dnnl.dnnl_memory_create(&c->mine[k], want, dnnl.engine, DNNL_MEMORY_ALLOCATE) !=
        dnnl_success)
        return false;
    bool out = k == DST;
    return make_reorder(&c->reorder[k], out ? want : user, out ? user : want);
}

static bool run_reorder(const mk_cpu_dnnl_conv *c, dnnl_primitive_t r, dnnl_memory_t from,
                        dnnl_memory_t to) {
    return dnnl.dnnl_primitive_execute(
               r, c->stream, 2,
               (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}}) == dnnl_success;
}

/* The post-ops: the residual summed into the result, then the ReLU. */
static bool post_ops(const mk_cpu_conv_spec *sp, dnnl_primitive_attr_t *attr) {
    *attr = NULL;
    if (!sp->residual && !sp->relu) return true;
    dnnl_post_ops_t po = NULL;
    bool ok = dnnl.dnnl_post_ops_create(&po) == dnnl_success &&
              (!sp->residual || dnnl.dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success) &&
              (!sp->relu || dnnl.dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f,
                                                              0.0f) == dnnl_success) &&
              dnnl.dnnl_primitive_attr_create(attr) == dnnl_success &&
              dnnl.dnnl_primitive_attr_set_post_ops(*attr, po) == dnnl_success;
    if (po) dnnl.dnnl_post_ops_destroy(po);
    return ok;
}

/* 8 or 16 where md is [N, C, H, W] as nChw8c or nChw16c (channels in blocks
 * of that many, each block's H x W x block values together), else 0. */
static int block_of(const dnnl_memory_desc_t *md, const dnnl_dims_t dims) {
    const dnnl_format_tag_t tags[2] = {dnnl_nChw8c, dnnl_nChw16c};
    for (int b = 0; b < 2; b++) {
        dnnl_memory_desc_t t;
        if (dnnl.dnnl_memory_desc_init_by_tag(&t, 4, dims, dnnl_f32, tags[b]) == dnnl_success &&
            dnnl.dnnl_memory_desc_equal(md, &t))
            return 8 << b;
    }
    return 0;
}

static mk_cpu_dnnl_conv *make(const mk_cpu_conv_spec *sp, const mk_node *node, char *why,
                              size_t size) {
    const mk_conv_geom g = sp->g;
    const char *layout = getenv("MK_DNNL_LAYOUT");
    bool plain = layout && !strcmp(layout, "plain");
    dnnl_dims_t xd = {g.n, g.c, g.h, g.w}, yd = {g.n, g.o, g.oh, g.ow}, bd = {g.o};
    dnnl_dims_t wd = {g.groups, g.o / g.groups, g.c / g.groups, g.kh, g.kw};
    dnnl_dims_t wd4 = {g.o, g.c / g.groups, g.kh, g.kw};
    dnnl_dims_t stride = {g.sh, g.sw}, dil = {g.dh - 1, g.dw - 1}, pad = {g.ph, g.pw};
    bool grouped = g.groups > 1;
    dnnl_memory_desc_t user[N_ARGS], any[N_ARGS];
    const dnnl_dims_t *dims[N_ARGS] = {&xd, grouped ? &wd : &wd4, &yd, &bd};
    dnnl_format_tag_t tags[N_ARGS] = {dnnl_nchw, grouped ? dnnl_goihw : dnnl_oihw, dnnl_nchw,
                                      dnnl_x};
    int ranks[N_ARGS] = {4, grouped ? 5 : 4, 4, 1};
    for (int k = 0; k < N_ARGS; k++)
        if (dnnl.dnnl_memory_desc_init_by_tag(&user[k], ranks[k], *dims[k], dnnl_f32, tags[k]) !=
                dnnl_success ||
            dnnl.dnnl_memory_desc_init_by_tag(&any[k], ranks[k], *dims[k], dnnl_f32,
                                              plain || k == BIA ? tags[k] : dnnl_format_tag_any) !=
                dnnl_success) {
            snprintf(why, size, "oneDNN refuses the shapes of %s $%d", node->op->name, node->id);
            return NULL;
        }
    dnnl_convolution_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    mk_cpu_dnnl_conv *c = calloc(1, sizeof *c);
    bool made = c && post_ops(sp, &attr) &&
                dnnl.dnnl_dilated_convolution_forward_desc_init(
                    &desc, dnnl_forward_inference, dnnl_convolution_direct, &any[SRC], &any[WEI],
                    sp->bias ? &any[BIA] : NULL, &any[DST], stride, dil, pad,
                    pad) == dnnl_success &&
                dnnl.dnnl_primitive_desc_create(&pd, &desc, attr, dnnl.engine, NULL) ==
                    dnnl_success;
    if (attr) dnnl.dnnl_primitive_attr_destroy(attr);
    if (!made) {
        snprintf(why, size, "oneDNN has no convolution for %s $%d%s", node->op->name, node->id,
                 sp->residual || sp->relu ? " with its post-ops" : "");
        free(c);
        return NULL;
    }
    c->bias = sp->bias;
    c->residual = sp->residual;
    dnnl_query_t queries[N_ARGS] = {dnnl_query_src_md, dnnl_query_weights_md, dnnl_query_dst_md,
                                    dnnl_query_weights_md};
    int index[N_ARGS] = {0, 0, 0, 1};
    c->src_md = *dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    c->dst_md = *dnnl.dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    c->src_block = block_of(&c->src_md, xd);
    c->dst_block = block_of(&c->dst_md, yd);
    bool ok = dnnl.dnnl_primitive_create(&c->conv, pd) == dnnl_success &&
              dnnl.dnnl_stream_create(&c->stream, dnnl.engine, dnnl_stream_default_flags) ==
                  dnnl_success;
    for (int k = 0; ok && k < N_ARGS; k++)
        if (k != BIA || sp->bias)
            ok = bind_arg(c, k, &user[k],
                          dnnl.dnnl_primitive_desc_query_md(pd, queries[k], index[k]));
    if (ok && sp->residual) { /* summed into the result's memory: laid out as it first */
        ok = dnnl.dnnl_memory_create(&c->res_user, &user[DST], dnnl.engine, DNNL_MEMORY_NONE) ==
             dnnl_success;
        if (ok && c->mine[DST]) {
            dnnl_primitive_t r = NULL;
            ok = make_reorder(&r, &user[DST],
                              dnnl.dnnl_primitive_desc_query_md(pd, queries[DST], 0));
            c->res_reorder = r;
        }
    }
    dnnl.dnnl_primitive_desc_destroy(pd);
    /* constant weights: laid out once, here (the model's memory or the
     * folded copy outlives the primitive) */
    if (ok && sp->weights_once) {
        ok = dnnl.dnnl_memory_set_data_handle(c->user[WEI], (void *)sp->weights_once) ==
             dnnl_success;
        if (ok && c->reorder[WEI])
            ok = run_reorder(c, c->reorder[WEI], c->user[WEI], c->mine[WEI]) &&
                 dnnl.dnnl_stream_wait(c->stream) == dnnl_success;
        c->weights_once = true;
    }
    if (!ok) {
        snprintf(why, size, "oneDNN could not make the convolution of %s $%d", node->op->name,
                 node->id);
        mk_cpu_dnnl_conv_free(c);
        return NULL;
    }
    return c;
}

mk_cpu_dnnl_conv *mk_cpu_dnnl_conv_make(const mk_cpu_conv_spec *sp, const mk_node *node,
                                        char *why, size_t size) {
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
    mk_cpu_dnnl_conv *c = make(sp, node, why, size);
#ifdef _OPENMP
    omp_set_num_threads(outer);
#endif
    return c;
}

/* ---- convolutions handing their results on in oneDNN's layout ------------- */

/* Argument k's own buffer and reorder, no longer used. */
static void drop(mk_cpu_dnnl_conv *c, int k) {
    if (c->reorder[k]) dnnl.dnnl_primitive_destroy(c->reorder[k]);
    if (c->mine[k]) dnnl.dnnl_memory_destroy(c->mine[k]);
    c->reorder[k] = NULL;
    c->mine[k] = NULL;
}

int mk_cpu_dnnl_conv_block(const mk_cpu_dnnl_conv *c, mk_cpu_dnnl_chain which) {
    /* (a block is never NCHW's layout: mine[] holds it, until chained) */
    if (which == MK_CPU_DNNL_SRC) return c->src_block;
    if (which == MK_CPU_DNNL_RESIDUAL) return c->residual ? c->dst_block : 0;
    return c->dst_block;
}

int mk_cpu_dnnl_conv_chain(mk_cpu_dnnl_conv *c, mk_cpu_dnnl_chain what) {
    if (what == MK_CPU_DNNL_SRC) {
        if (!c->blk_src && dnnl.dnnl_memory_create(&c->blk_src, &c->src_md, dnnl.engine,
                                                   DNNL_MEMORY_NONE) != dnnl_success)
            return -1;
        c->src_blocked = true;
        drop(c, SRC); /* x arrives in the layout: oneDNN's copy is not needed */
        return 0;
    }
    if (what == MK_CPU_DNNL_RESIDUAL) {
        c->res_blocked = true;
        return 0;
    }
    if (!c->blk_dst && dnnl.dnnl_memory_create(&c->blk_dst, &c->dst_md, dnnl.engine,
                                               DNNL_MEMORY_NONE) != dnnl_success)
        return -1;
    c->dst_blocked = true;
    drop(c, DST);
    return 0;
}

/* The launch's convolution: x reordered in (unless handed over in the
 * primitive's layout), the residual into the result's memory first, the
 * convolution with its bias and post-ops, the result reordered out (unless
 * handed on in its layout). */
int mk_cpu_dnnl_conv_run(const mk_cpu_dnnl_conv *c, const mk_cpu_conv_args *a,
                         const mk_node *node, mk_error **err) {
#ifdef _OPENMP
    /* oneDNN's regions take OpenMP's count: the launch's cap for this call */
    int outer = omp_get_max_threads();
    omp_set_num_threads(max_threads());
#endif
    const void *data[N_ARGS] = {a->x, a->w, a->out, a->bias};
    dnnl_memory_t use[N_ARGS];
    bool ok = true;
    for (int k = 0; k < N_ARGS; k++) {
        if (!c->user[k]) continue;
        if (k != WEI || !c->weights_once)
            ok = ok && dnnl.dnnl_memory_set_data_handle(c->user[k], (void *)data[k]) ==
                           dnnl_success;
        use[k] = c->mine[k] ? c->mine[k] : c->user[k];
    }
    if (c->src_blocked) {
        use[SRC] = c->blk_src;
        ok = ok && dnnl.dnnl_memory_set_data_handle(c->blk_src, (void *)a->x) == dnnl_success;
    } else if (ok && c->reorder[SRC]) {
        ok = run_reorder(c, c->reorder[SRC], c->user[SRC], c->mine[SRC]);
    }
    if (c->dst_blocked) {
        use[DST] = c->blk_dst;
        ok = ok && dnnl.dnnl_memory_set_data_handle(c->blk_dst, a->out) == dnnl_success;
    }
    if (ok && c->reorder[WEI] && !c->weights_once)
        ok = run_reorder(c, c->reorder[WEI], c->user[WEI], c->mine[WEI]);
    if (ok && c->residual) {
        void *into = a->out;
        if (use[DST] == c->mine[DST])
            ok = dnnl.dnnl_memory_get_data_handle(c->mine[DST], &into) == dnnl_success;
        if (c->res_blocked || use[DST] == c->user[DST]) { /* laid out as the result already */
            if (ok && a->residual != into) memcpy(into, a->residual, a->out_bytes);
        } else {
            ok = ok &&
                 dnnl.dnnl_memory_set_data_handle(c->res_user, (void *)a->residual) ==
                     dnnl_success &&
                 run_reorder(c, c->res_reorder, c->res_user, use[DST]);
        }
    }
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, use[SRC]},
                               {DNNL_ARG_WEIGHTS, use[WEI]},
                               {DNNL_ARG_DST, use[DST]},
                               {DNNL_ARG_BIAS, c->bias ? use[BIA] : NULL}};
    ok = ok && dnnl.dnnl_primitive_execute(c->conv, c->stream, c->bias ? 4 : 3, args) ==
                   dnnl_success;
    if (ok && c->reorder[DST] && !c->dst_blocked)
        ok = run_reorder(c, c->reorder[DST], c->mine[DST], c->user[DST]);
    ok = ok && dnnl.dnnl_stream_wait(c->stream) == dnnl_success;
#ifdef _OPENMP
    omp_set_num_threads(outer);
#endif
    if (!ok)
        return mk_fail(err, MK_ERR_DEVICE, node->line, node->column,
                       "%s $%d: oneDNN's convolution failed", node->op->name, node->id);
    return 0;
}

#endif
