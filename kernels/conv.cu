/*
 * conv.cu — convolutions, pooling and upsampling on the GPU, float32 NCHW (a
 * 1-D convolution is the 2-D one with H = 1; geometry: core/conv.h):
 *
 *   MK_KERNEL_CONV            cuDNN's convolution forward (backend API)
 *   MK_KERNEL_CONV_TRANSPOSE  cuDNN's convolution backward-data: the transposed
 *                             convolution is the gradient of a convolution
 *                             with respect to its input
 *   MK_KERNEL_MAX_POOL, AVG_POOL, ADAPTIVE_AVG_POOL, UPSAMPLE_NEAREST
 *                             plain kernels, a thread per output element
 *
 * cuDNN: one operation graph per launch, planned in prepare before the
 * capture (mk_cuda_conv_plan): engine configs from heuristics mode A, then
 * the fallback list; those without tensor cores first, and tensor-core
 * (TF32) configs only where the model was compiled with allow_tf32 (Lua:
 * tf32 = true), so results stay float32 by default. The first config whose
 * plan finalizes and runs once (on the model's own memory, before any
 * evaluation) is kept with its workspace; the kernel, called while the graph
 * is captured, executes it on the model's stream. Builds without cuDNN
 * (CUDNN=0) refuse convolutions with a device error at compile.
 * Checked against the CPU by spec/gpu_spec.lua with spec/cases/conv.lua:
 *   MK_BUILD=build lua5.4 /usr/bin/busted --run gpu spec/gpu_spec.lua
 */
#include "cuda_device.h"

extern "C" {
#include "conv.h"
}

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- pooling and upsampling --------------------------------------------------- */

struct pool_geom {
    long long planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw;
};

static pool_geom pool_geom_of(const mk_launch *l) {
    mk_conv_geom g = mk_conv_geom_of(l->node);
    return pool_geom{g.n * g.c, g.h, g.w, g.oh, g.ow, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.dh,
                     g.dw};
}

enum pool_kind { POOL_MAX, POOL_AVG, POOL_ADAPTIVE, POOL_NEAREST };

/* out [planes, oh, ow] from x [planes, h, w]: as core/cpu/conv.c's loops. */
template <pool_kind K>
static __global__ void pool_kernel(float *out, const float *x, pool_geom g) {
    long long total = g.planes * g.oh * g.ow;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        long long ox = e % g.ow, oy = e / g.ow % g.oh, p = e / (g.ow * g.oh);
        const float *xp = x + p * g.h * g.w;
        float r;
        if (K == POOL_MAX) {
            r = -INFINITY;
            for (long long ki = 0; ki < g.kh; ki++) {
                long long iy = oy * g.sh - g.ph + ki * g.dh;
                if (iy < 0 || iy >= g.h) continue;
                for (long long kj = 0; kj < g.kw; kj++) {
                    long long ix = ox * g.sw - g.pw + kj * g.dw;
                    if (ix < 0 || ix >= g.w) continue;
                    float v = xp[iy * g.w + ix];
                    if (v > r || v != v) r = v;
                }
            }
        } else if (K == POOL_AVG) { /* padding counted, the window clipped to it */
            long long y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
            long long y1 = min(y0 + g.kh, g.h + g.ph), x1 = min(x0 + g.kw, g.w + g.pw);
            float s = 0.0f;
            for (long long iy = max(y0, 0LL); iy < min(y1, g.h); iy++)
                for (long long ix = max(x0, 0LL); ix < min(x1, g.w); ix++) s += xp[iy * g.w + ix];
            r = s / (float)((y1 - y0) * (x1 - x0));
        } else if (K == POOL_ADAPTIVE) {
            long long y0 = oy * g.h / g.oh, y1 = ((oy + 1) * g.h + g.oh - 1) / g.oh;
            long long x0 = ox * g.w / g.ow, x1 = ((ox + 1) * g.w + g.ow - 1) / g.ow;
            float s = 0.0f;
            for (long long iy = y0; iy < y1; iy++)
                for (long long ix = x0; ix < x1; ix++) s += xp[iy * g.w + ix];
            r = s / (float)((y1 - y0) * (x1 - x0));
        } else {
            r = xp[oy * g.h / g.oh * g.w + ox * g.w / g.ow];
        }
        out[e] = r;
    }
}

template <pool_kind K>
static int pool_launch(const mk_launch *l, const char *name, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    pool_geom g = pool_geom_of(l);
    unsigned int blocks = mk_cuda_blocks(g.planes * g.oh * g.ow, MK_CUDA_BLOCK);
    if (blocks > 132u * 64u) blocks = 132u * 64u;
    pool_kernel<K><<<blocks, MK_CUDA_BLOCK, 0, s->stream>>>((float *)l->out.data,
                                                           (const float *)l->in[0].data, g);
    return mk_cuda_check_launch(l, name, err);
}

int mk_cuda_max_pool(const mk_launch *l, mk_error **err) {
    return pool_launch<POOL_MAX>(l, "max_pool", err);
}
int mk_cuda_avg_pool(const mk_launch *l, mk_error **err) {
    return pool_launch<POOL_AVG>(l, "avg_pool", err);
}
int mk_cuda_adaptive_avg_pool(const mk_launch *l, mk_error **err) {
    return pool_launch<POOL_ADAPTIVE>(l, "adaptive_avg_pool", err);
}
int mk_cuda_upsample_nearest(const mk_launch *l, mk_error **err) {
    return pool_launch<POOL_NEAREST>(l, "upsample_nearest", err);
}

/* ---- convolutions through cuDNN ------------------------------------------------ */

static bool is_conv(const mk_launch *l) {
    mk_kernel_id k = l->node->op->kernel;
    return k == MK_KERNEL_CONV || k == MK_KERNEL_CONV_TRANSPOSE;
}

#ifndef MK_WITH_CUDNN

int mk_cuda_conv_plan(mk_cuda_state *s, const mk_launch *launches, int n, const mk_host *host,
                      mk_error **err) {
    (void)s, (void)host;
    for (int i = 0; i < n; i++)
        if (is_conv(&launches[i]))
            return mk_fail(err, MK_ERR_DEVICE, launches[i].node->line, launches[i].node->column,
                           "%s $%d: convolutions on CUDA need cuDNN, and this plugin was built "
                           "without it (CUDNN=0)",
                           launches[i].node->op->name, launches[i].node->id);
    return 0;
}

void mk_cuda_conv_close(mk_cuda_state *s) { (void)s; }

int mk_cuda_conv(const mk_launch *l, mk_error **err) {
    return MK_INTERNAL(err, "a convolution launch in a build without cuDNN");
}

#else

#include <cudnn.h>

/* uids of a convolution's tensors in its graph and variant pack */
enum { UID_X = 1, UID_W = 2, UID_Y = 3 };
#define CONV_KEEP 8

/* One launch's plan: its descriptors, the variant pack with its addresses, the workspace. */
typedef struct {
    cudnnBackendDescriptor_t keep[CONV_KEEP]; /* tensors, conv, operation, graph, config */
    int n_keep;
    cudnnBackendDescriptor_t plan, pack;
    void *workspace;
    bool tf32;
    size_t clear_bytes; /* result bytes to zero before the plan runs (see post_pad) */
} conv_plan;

/* The model's cuDNN handle and a plan per launch (NULL for the others). */
struct mk_cuda_convs {
    cudnnHandle_t handle;
    conv_plan **plans; /* [n launches] */
    int n;
};

static void plan_free(conv_plan *p) {
    if (!p) return;
    if (p->pack) cudnnBackendDestroyDescriptor(p->pack);
    if (p->plan) cudnnBackendDestroyDescriptor(p->plan);
    for (int i = p->n_keep - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(p->keep[i]);
    if (p->workspace) cudaFree(p->workspace);
    free(p);
}

void mk_cuda_conv_close(mk_cuda_state *s) {
    mk_cuda_convs *c = s->conv;
    if (!c) return;
    for (int i = 0; i < c->n; i++) plan_free(c->plans[i]);
    free(c->plans);
    if (c->handle) cudnnDestroy(c->handle);
    free(c);
    s->conv = NULL;
    cudaGetLastError();
}

/* The node's error for a cuDNN status: "Conv2dNode $3: cuDNN: what: CUDNN_STATUS_...". */
static int conv_fail(const mk_launch *l, const char *what, cudnnStatus_t st, mk_error **err) {
    char last[512] = "";
    cudnnGetLastErrorString(last, sizeof last);
    size_t n = strlen(last);
    while (n && (last[n - 1] == '\n' || last[n - 1] == ' ')) last[--n] = 0;
    return mk_fail(err, st == CUDNN_STATUS_ALLOC_FAILED ? MK_ERR_NOMEM : MK_ERR_DEVICE,
                   l->node->line, l->node->column, "%s $%d: cuDNN: %s: %s%s%s",
                   l->node->op->name, l->node->id, what, cudnnGetErrorString(st), n ? ": " : "",
                   last);
}

#define DNN(what, call)                                      \
    do {                                                     \
        cudnnStatus_t st_ = (call);                          \
        if (st_ != CUDNN_STATUS_SUCCESS) {                   \
            conv_fail(l, (what), st_, err);                  \
            return NULL;                                     \
        }                                                    \
    } while (0)

static cudnnBackendDescriptor_t keep(const mk_launch *l, conv_plan *p,
                                     cudnnBackendDescriptorType_t type, const char *what,
                                     mk_error **err) {
    cudnnBackendDescriptor_t d = NULL;
    if (p->n_keep == CONV_KEEP) {
        MK_INTERNAL(err, "a convolution plan keeps too many descriptors");
        return NULL;
    }
    DNN(what, cudnnBackendCreateDescriptor(type, &d));
    p->keep[p->n_keep++] = d;
    return d;
}

/* A float32 NCHW tensor of extents dims inside a dense one of extents full. */
static cudnnBackendDescriptor_t tensor4(const mk_launch *l, conv_plan *p, int64_t uid,
                                        const int64_t *dims, const int64_t *full,
                                        const void *data, mk_error **err) {
    cudnnBackendDescriptor_t t = keep(l, p, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "a tensor", err);
    if (!t) return NULL;
    int64_t strides[4] = {full[1] * full[2] * full[3], full[2] * full[3], full[3], 1};
    /* the widest of 16, 8, 4 bytes that its address keeps (x may be a view) */
    int64_t align = 16;
    while (align > 4 && (uintptr_t)data % (uintptr_t)align) align /= 2;
    cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
    DNN("tensor data type",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype));
    DNN("tensor dimensions",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims));
    DNN("tensor strides",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides));
    DNN("tensor id",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    DNN("tensor alignment",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    DNN("finalizing a tensor", cudnnBackendFinalize(t));
    return t;
}

/*
 * A transposed convolution's result of extent out is the input of the forward
 * convolution it is the gradient of, padded by p before and by the returned
 * amount after, which must give back its in rows: any such amount gives the
 * same result rows. Today's p where it fits, else the least that fits. Where
 * none does (an output padding past the stride, as a dilation allows), the
 * last *cut rows, which no input row reaches, are left out of the graph's
 * tensor and zeroed before the plan runs.
 */
static int64_t post_pad(int64_t in, int64_t out, int64_t k, int64_t st, int64_t p, int64_t d,
                        int64_t *cut) {
    int64_t span = d * (k - 1) + 1, least = (in - 1) * st + span - out - p;
    *cut = 0;
    if (p >= least && p <= least + st - 1) return p;
    if (least + st - 1 >= 0) return least > 0 ? least : 0;
    *cut = -least; /* rows [out - cut, out): below every window */
    return 0;
}

/*
 * The operation graph of launch l: forward, y [N, O, OH, OW] = x (*) w [O, C/g,
 * kH, kW]; transposed, the backward-data of the convolution whose input is the
 * result [N, O, OH, OW] and whose output is x, with w [C, O/g, kH, kW] as its
 * filter. Groups follow from the filter's channels (C / w's second dim).
 */
static cudnnBackendDescriptor_t conv_graph(const mk_launch *l, conv_plan *p, cudnnHandle_t h,
                                           mk_error **err) {
    mk_conv_geom g = mk_conv_geom_of(l->node);
    bool transposed = l->node->op->kernel == MK_KERNEL_CONV_TRANSPOSE;
    int64_t xd[4] = {g.n, g.c, g.h, g.w}, yd[4] = {g.n, g.o, g.oh, g.ow};
    int64_t wd[4] = {transposed ? g.c : g.o, (transposed ? g.o : g.c) / g.groups, g.kh, g.kw};
    int64_t pad[2] = {g.ph, g.pw}, post[2] = {g.ph, g.pw}, seen[4] = {g.n, g.o, g.oh, g.ow};
    if (transposed) {
        int64_t cut_h, cut_w;
        post[0] = post_pad(g.h, g.oh, g.kh, g.sh, g.ph, g.dh, &cut_h);
        post[1] = post_pad(g.w, g.ow, g.kw, g.sw, g.pw, g.dw, &cut_w);
        seen[2] -= cut_h;
        seen[3] -= cut_w;
        if (cut_h || cut_w) p->clear_bytes = (size_t)(g.n * g.o * g.oh * g.ow) * sizeof(float);
    }
    cudnnBackendDescriptor_t x = tensor4(l, p, UID_X, xd, xd, l->in[0].data, err);
    cudnnBackendDescriptor_t w = x ? tensor4(l, p, UID_W, wd, wd, l->in[1].data, err) : NULL;
    cudnnBackendDescriptor_t y = w ? tensor4(l, p, UID_Y, seen, yd, l->out.data, err) : NULL;
    if (!y) return NULL;

    cudnnBackendDescriptor_t conv =
        keep(l, p, CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "the convolution", err);
    if (!conv) return NULL;
    int64_t dims = 2, stride[2] = {g.sh, g.sw}, dil[2] = {g.dh, g.dw};
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    DNN("convolution compute type",
        cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                 &compute));
    DNN("convolution mode",
        cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE,
                                 CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    DNN("convolution dims",
        cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1,
                                 &dims));
    DNN("convolution strides",
        cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2,
                                 stride));
    DNN("convolution pre-paddings",
        cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2,
                                 pad));
    /* forward: the floor rule; transposed: post_pad */
    DNN("convolution post-paddings",
        cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2,
                                 post));
    DNN("convolution dilations",
        cudnnBackendSetAttribute(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2,
                                 dil));
    DNN("finalizing the convolution", cudnnBackendFinalize(conv));

    float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op;
    if (!transposed) {
        op = keep(l, p, CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                  "the forward operation", err);
        if (!op) return NULL;
        DNN("forward x", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
        DNN("forward w", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w));
        DNN("forward y", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
        DNN("forward descriptor",
            cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
        DNN("forward alpha",
            cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                     CUDNN_TYPE_FLOAT, 1, &alpha));
        DNN("forward beta",
            cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
                                     CUDNN_TYPE_FLOAT, 1, &beta));
    } else {
        op = keep(l, p, CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
                  "the backward-data operation", err);
        if (!op) return NULL;
        /* dy: our input x; dx: our result */
        DNN("backward-data dy",
            cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
        DNN("backward-data w",
            cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &w));
        DNN("backward-data dx",
            cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
        DNN("backward-data descriptor",
            cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &conv));
        DNN("backward-data alpha",
            cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                                     CUDNN_TYPE_FLOAT, 1, &alpha));
        DNN("backward-data beta",
            cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
                                     CUDNN_TYPE_FLOAT, 1, &beta));
    }
    DNN("finalizing the operation", cudnnBackendFinalize(op));

    cudnnBackendDescriptor_t graph =
        keep(l, p, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "the graph", err);
    if (!graph) return NULL;
    DNN("graph operations", cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &op));
    DNN("graph handle", cudnnBackendSetAttribute(graph, (cudnnBackendAttributeName_t)800,
                                                 CUDNN_TYPE_HANDLE, 1, &h));
    DNN("finalizing the graph", cudnnBackendFinalize(graph));
    return graph;
}

/* Whether an engine config uses tensor cores (TF32 for float32 data); unknown: yes. */
static bool uses_tensor_cores(cudnnBackendDescriptor_t cfg) {
    cudnnBackendDescriptor_t engine = NULL;
    int64_t n = 0, count = 0;
    bool tc = true;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != 0) return true;
    cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &n, &engine) == 0 && n == 1 &&
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                 CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                                 &count, notes) == 0) {
        tc = false;
        for (int64_t i = 0; i < count; i++) tc |= notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
    }
    cudnnBackendDestroyDescriptor(engine);
    return tc;
}

/* A variant pack binding the launch's addresses to the graph's uids. */
static cudnnStatus_t make_pack(const mk_launch *l, void *workspace, cudnnBackendDescriptor_t *out) {
    int64_t uids[3] = {UID_X, UID_W, UID_Y};
    void *ptrs[3] = {l->in[0].data, l->in[1].data, l->out.data};
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st == 0)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3,
                                      uids);
    if (st == 0)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                      CUDNN_TYPE_VOID_PTR, 3, ptrs);
    if (st == 0)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                      1, &workspace);
    if (st == 0) st = cudnnBackendFinalize(vp);
    if (st != 0 && vp) cudnnBackendDestroyDescriptor(vp), vp = NULL;
    *out = vp;
    return st;
}

/*
 * The engine configs of one heuristics mode for the graph, tried in order
 * (float32 ones first; tensor-core ones only with tf32): the first that
 * finalizes and runs once becomes p's plan. 0, 1 where none works (last
 * says why), -1 on an error that is not the config's.
 */
static int try_mode(const mk_launch *l, conv_plan *p, cudnnHandle_t h,
                    cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode, bool tf32,
                    cudaStream_t stream, char *last, size_t last_size, mk_error **err) {
    cudnnBackendDescriptor_t heur = NULL, cfgs[32] = {NULL};
    int64_t count = 0;
    int rc = 1;
    bool tc[32];
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur) != 0 ||
        cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph) != 0 ||
        cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
                                 &mode) != 0 ||
        cudnnBackendFinalize(heur) != 0 ||
        cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL) != 0) {
        snprintf(last, last_size, "the heuristics could not be read");
        goto done;
    }
    if (count > 32) count = 32;
    for (int64_t i = 0; i < count; i++)
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]) != 0) {
            count = i;
            break;
        }
    if (count > 0 && cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count,
                                              cfgs) != 0)
        count = 0;
    for (int64_t i = 0; i < count; i++) tc[i] = uses_tensor_cores(cfgs[i]);
    for (int64_t j = 0; j < 2 * count; j++) {
        int64_t i = j % count;
        if ((j < count) == tc[i] || (tc[i] && !tf32)) continue;
        cudnnBackendDescriptor_t plan = NULL, pack = NULL;
        int64_t ws = 0, n = 0;
        void *workspace = NULL;
        cudnnStatus_t st;
        if ((st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan)) != 0 ||
            (st = cudnnBackendSetAttribute(plan, (cudnnBackendAttributeName_t)400,
                                           CUDNN_TYPE_HANDLE, 1, &h)) != 0 ||
            (st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i])) != 0 ||
            (st = cudnnBackendFinalize(plan)) != 0 ||
            (st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                           CUDNN_TYPE_INT64, 1, &n, &ws)) != 0) {
            snprintf(last, last_size, "config %lld: %s", (long long)i, cudnnGetErrorString(st));
            if (plan) cudnnBackendDestroyDescriptor(plan);
            continue;
        }
        cudaError_t ce = ws > 0 ? cudaMalloc(&workspace, (size_t)ws) : cudaSuccess;
        if (ce != cudaSuccess) {
            cudaGetLastError();
            snprintf(last, last_size, "config %lld: its workspace of %lld bytes: %s",
                     (long long)i, (long long)ws, cudaGetErrorString(ce));
            cudnnBackendDestroyDescriptor(plan);
            continue;
        }
        /* the trial: once on the model's memory, before any evaluation */
        if ((st = make_pack(l, workspace, &pack)) != 0 || (st = cudnnSetStream(h, stream)) != 0 ||
            (st = cudnnBackendExecute(h, plan, pack)) != 0 ||
            cudaStreamSynchronize(stream) != cudaSuccess) {
            cudaGetLastError();
            snprintf(last, last_size, "config %lld: trial run: %s", (long long)i,
                     st ? cudnnGetErrorString(st) : "the stream failed");
            if (pack) cudnnBackendDestroyDescriptor(pack);
            cudnnBackendDestroyDescriptor(plan);
            if (workspace) cudaFree(workspace);
            continue;
        }
        if (p->n_keep == CONV_KEEP) {
            rc = MK_INTERNAL(err, "a convolution plan keeps too many descriptors");
        } else {
            p->keep[p->n_keep++] = cfgs[i]; /* the plan refers to it */
            cfgs[i] = NULL;
            p->plan = plan;
            p->pack = pack;
            p->workspace = workspace;
            p->tf32 = tc[i];
            rc = 0;
        }
        goto done;
    }
    if (count == 0) snprintf(last, last_size, "the heuristics offer no engine config");
done:
    for (int64_t i = 0; i < 32; i++)
        if (cfgs[i]) cudnnBackendDestroyDescriptor(cfgs[i]);
    if (heur) cudnnBackendDestroyDescriptor(heur);
    return rc;
}

int mk_cuda_conv_plan(mk_cuda_state *s, const mk_launch *launches, int n, const mk_host *host,
                      mk_error **err) {
    bool any = false;
    for (int i = 0; i < n && !any; i++) any = is_conv(&launches[i]);
    if (!any) return 0;
    bool tf32 = host->opts && host->opts->allow_tf32;
    mk_cuda_convs *c = (mk_cuda_convs *)calloc(1, sizeof *c);
    if (!c || !(c->plans = (conv_plan **)calloc((size_t)n, sizeof *c->plans))) {
        free(c);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "cannot allocate the convolutions' plans");
    }
    s->conv = c;
    c->n = n;
    cudnnStatus_t st = cudnnCreate(&c->handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        c->handle = NULL;
        return conv_fail(&launches[0], "cudnnCreate", st, err);
    }
    for (int i = 0; i < n; i++) {
        const mk_launch *l = &launches[i];
        if (!is_conv(l)) continue;
        conv_plan *p = (conv_plan *)calloc(1, sizeof *p);
        if (!p) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "cannot allocate a convolution plan");
        c->plans[i] = p;
        cudnnBackendDescriptor_t graph = conv_graph(l, p, c->handle, err);
        if (!graph) return -1;
        char first[256] = "", second[256] = "";
        int rc = try_mode(l, p, c->handle, graph, CUDNN_HEUR_MODE_A, tf32, s->stream, first,
                          sizeof first, err);
        if (rc == 1)
            rc = try_mode(l, p, c->handle, graph, CUDNN_HEUR_MODE_FALLBACK, tf32, s->stream,
                          second, sizeof second, err);
        if (rc < 0) return -1;
        if (rc == 1)
            return mk_fail(err, MK_ERR_DEVICE, l->node->line, l->node->column,
                           "%s $%d: no cuDNN engine runs this convolution in %s (heuristics A: "
                           "%s; fallback: %s)",
                           l->node->op->name, l->node->id,
                           tf32 ? "float32 or TF32" : "float32 (tf32 = true allows TF32)", first,
                           second);
        if (p->tf32)
            host->log(host, MK_LOG_INFO, "cuda: %s $%d runs on tensor cores in TF32 (allow_tf32)",
                      l->node->op->name, l->node->id);
    }
    return 0;
}

/* The plan's execution on the model's stream (prepare planned it; the graph
 * being captured records cuDNN's kernels). */
int mk_cuda_conv(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    conv_plan *p = s->conv && l->index < s->conv->n ? s->conv->plans[l->index] : NULL;
    if (!p || !p->plan) return MK_INTERNAL(err, "a convolution launch without its plan");
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudnnStatus_t st = cudnnSetStream(s->conv->handle, s->stream);
    const char *what = "cudnnSetStream";
    if (p->clear_bytes && cudaMemsetAsync(l->out.data, 0, p->clear_bytes, s->stream) != cudaSuccess)
        what = "clearing the rows no window reaches", st = CUDNN_STATUS_EXECUTION_FAILED;
    if (st == CUDNN_STATUS_SUCCESS)
        what = "cudnnBackendExecute", st = cudnnBackendExecute(s->conv->handle, p->plan, p->pack);
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaGetLastError(); /* cuDNN reports its own launches in its status */
    if (st != CUDNN_STATUS_SUCCESS) return conv_fail(l, what, st, err);
    return 0;
}

#endif
