/*
 * cudnn_fuser.cu — the group kernel (MK_KERNEL_CUDNN_GROUP): matrix product and
 * pointwise nodes that the
 * fusion pass (core/fusion.c) chose, run as one cuDNN operation graph built
 * through cuDNN 9's backend C API.
 *
 * Prepare time (mk_cudnn_compile_group, from the CUDA device's prepare, after
 * the planner; the fusion pass chose the group without asking the device):
 *     trace in the context's cache? → the plan (a cache hit), or the cached rejection
 *     else: tensors (3-D, or 4-D for 4-D pointwise chains; intermediates virtual)
 *           → matmul / pointwise operations → operation graph
 *           → engine configs from heuristics mode A, then the fallback list
 *           → the first config whose plan finalizes and runs once on scratch memory
 *     its workspace must fit the scratch the planner gave the group; where it
 *     does not, or cuDNN refuses the group, prepare says so and the model is
 *     compiled again (core/fusion.c: the group then has that scratch, or its
 *     nodes run on the plain kernels)
 * Capture time (mk_cuda_cudnn_group, the node's kernel, called by the CUDA
 * device while it captures the model's graph): a variant pack with the final
 * device addresses (operands, output, workspace) and cudnnBackendExecute on
 * the model's stream, which records cuDNN's kernels into the CUDA graph.
 *
 * Every cuDNN status becomes text: while building a plan it is the reason the
 * group is rejected (it then runs on the plain kernels); at execution it is an
 * MK_ERR_DEVICE error. Nothing here exits.
 *
 * Precision: float32 tensors and float32 compute, but cuDNN's matmul engines
 * run on tensor cores in TF32 (10-bit mantissa inputs); a group's `tf32` says
 * so and the model's stats count such groups. Configs without tensor cores are
 * preferred when offered; on the H200 with 9.14 none is (and with
 * NVIDIA_TF32_OVERRIDE=0 no engine is offered for a fused matmul at all, so
 * those groups are rejected and run on cuBLAS in float32). Pointwise-only
 * groups are exact float32.
 */
#include "cudnn_fuser.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Deprecated in the newest headers in favour of device properties, still the
 * way in 9.14; named by value so no deprecation warning is raised. */
static const cudnnBackendAttributeName_t ATTR_OPGRAPH_HANDLE = (cudnnBackendAttributeName_t)800;
static const cudnnBackendAttributeName_t ATTR_PLAN_HANDLE = (cudnnBackendAttributeName_t)400;


static double now_ms(void) { return mk_now_ms(); }

/* "what: CUDNN_STATUS_...: cuDNN's last message" into why. */
static void status_text(char *why, size_t size, const char *what, cudnnStatus_t st) {
    char last[512] = "";
    cudnnGetLastErrorString(last, sizeof last);
    size_t n = strlen(last);
    while (n && (last[n - 1] == '\n' || last[n - 1] == ' ')) last[--n] = 0;
    snprintf(why, size, "%s: %s%s%s", what, cudnnGetErrorString(st), n ? ": " : "", last);
}

/* ---- building blocks ------------------------------------------------------------ */

typedef struct {
    cudnnHandle_t handle;
    mk_cudnn_plan *p; /* keep[] collects every descriptor made */
    char *why;
    size_t why_size;
} builder;

#define DNN(b, what, call)                                        \
    do {                                                          \
        cudnnStatus_t st_ = (call);                               \
        if (st_ != CUDNN_STATUS_SUCCESS) {                        \
            status_text((b)->why, (b)->why_size, (what), st_);    \
            return NULL;                                          \
        }                                                         \
    } while (0)

static cudnnBackendDescriptor_t create(builder *b, cudnnBackendDescriptorType_t type,
                                       const char *what) {
    if (b->p->n_keep == MK_CUDNN_MAX_KEEP) {
        snprintf(b->why, b->why_size, "%s: the group needs too many descriptors", what);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    DNN(b, what, cudnnBackendCreateDescriptor(type, &d));
    b->p->keep[b->p->n_keep++] = d;
    return d;
}

static cudnnBackendDescriptor_t tensor(builder *b, int64_t uid, int rank, const int64_t *shape,
                                       const int64_t *stride, int64_t align, bool is_virtual) {
    cudnnBackendDescriptor_t t = create(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    if (!t) return NULL;
    cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
    int64_t dense[MK_MAX_RANK];
    if (!stride) { /* row-major */
        int64_t s = 1;
        for (int d = rank - 1; d >= 0; d--) {
            dense[d] = s;
            s *= shape[d];
        }
        stride = dense;
    }
    DNN(b, "tensor data type",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype));
    DNN(b, "tensor dimensions",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, shape));
    DNN(b, "tensor strides",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, stride));
    DNN(b, "tensor id",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
    DNN(b, "tensor alignment",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align));
    DNN(b, "tensor virtual flag",
        cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1,
                                 &is_virtual));
    DNN(b, "finalizing a tensor", cudnnBackendFinalize(t));
    return t;
}

static cudnnBackendDescriptor_t matmul(builder *b, cudnnBackendDescriptor_t a,
                                       cudnnBackendDescriptor_t bt, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t desc = create(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    if (!desc) return NULL;
    cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    DNN(b, "matmul compute type",
        cudnnBackendSetAttribute(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                 &compute));
    DNN(b, "finalizing the matmul descriptor", cudnnBackendFinalize(desc));
    cudnnBackendDescriptor_t op =
        create(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul operation");
    if (!op) return NULL;
    DNN(b, "matmul A", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a));
    DNN(b, "matmul B", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bt));
    DNN(b, "matmul C", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c));
    DNN(b, "matmul descriptor", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_DESC,
                                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc));
    DNN(b, "finalizing the matmul operation", cudnnBackendFinalize(op));
    return op;
}

static cudnnBackendDescriptor_t pointwise(builder *b, cudnnPointwiseMode_t mode,
                                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                                          cudnnBackendDescriptor_t out) {
    cudnnBackendDescriptor_t desc = create(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    if (!desc) return NULL;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    DNN(b, "pointwise mode", cudnnBackendSetAttribute(desc, CUDNN_ATTR_POINTWISE_MODE,
                                                      CUDNN_TYPE_POINTWISE_MODE, 1, &mode));
    DNN(b, "pointwise precision", cudnnBackendSetAttribute(desc, CUDNN_ATTR_POINTWISE_MATH_PREC,
                                                           CUDNN_TYPE_DATA_TYPE, 1, &prec));
    if (mode == CUDNN_POINTWISE_SWISH_FWD) {
        /* SiLU is swish with beta 1, cuDNN's default; said explicitly where the
         * attribute takes a double, else a float, else left at the default */
        double beta = 1.0;
        float beta_f = 1.0f;
        if (cudnnBackendSetAttribute(desc, CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_DOUBLE, 1,
                                     &beta) != CUDNN_STATUS_SUCCESS)
            cudnnBackendSetAttribute(desc, CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_FLOAT, 1,
                                     &beta_f);
    }
    DNN(b, "finalizing a pointwise descriptor", cudnnBackendFinalize(desc));
    cudnnBackendDescriptor_t op =
        create(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise operation");
    if (!op) return NULL;
    DNN(b, "pointwise descriptor",
        cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc));
    DNN(b, "pointwise X", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (y)
        DNN(b, "pointwise B", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
                                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    DNN(b, "pointwise Y", cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
                                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &out));
    DNN(b, "finalizing a pointwise operation", cudnnBackendFinalize(op));
    return op;
}

/* The operation graph of g: one tensor per input, per op result (virtual but
 * the last), one operation per op. */
static cudnnBackendDescriptor_t op_graph(builder *b, const mk_fused_group *g) {
    int R = g->rank;
    cudnnBackendDescriptor_t in[MK_GROUP_MAX_INPUTS], res[MK_GROUP_MAX_OPS], ops[MK_GROUP_MAX_OPS];
    for (int k = 0; k < g->n_in; k++)
        if (!(in[k] = tensor(b, MK_CUDNN_UID_IN + k, R, g->in[k].shape, g->in[k].stride,
                             g->in[k].align, false)))
            return NULL;
    for (int i = 0; i < g->n_ops; i++) {
        const mk_group_op *op = &g->op[i];
        bool last = i == g->n_ops - 1;
        res[i] = tensor(b, last ? MK_CUDNN_UID_OUT : MK_CUDNN_UID_VIRTUAL + i, R, op->shape, NULL,
                        16, !last);
        if (!res[i]) return NULL;
        cudnnBackendDescriptor_t x[2] = {NULL, NULL};
        for (int k = 0; k < op->n_in; k++) x[k] = op->in[k] >= 0 ? in[op->in[k]] : res[-1 - op->in[k]];
        switch (op->kind) {
        case MK_GOP_MATMUL: ops[i] = matmul(b, x[0], x[1], res[i]); break;
        case MK_GOP_ADD: ops[i] = pointwise(b, CUDNN_POINTWISE_ADD, x[0], x[1], res[i]); break;
        case MK_GOP_MUL: ops[i] = pointwise(b, CUDNN_POINTWISE_MUL, x[0], x[1], res[i]); break;
        case MK_GOP_RELU: ops[i] = pointwise(b, CUDNN_POINTWISE_RELU_FWD, x[0], NULL, res[i]); break;
        case MK_GOP_SILU: ops[i] = pointwise(b, CUDNN_POINTWISE_SWISH_FWD, x[0], NULL, res[i]); break;
        default: snprintf(b->why, b->why_size, "unknown group op %d", (int)op->kind); return NULL;
        }
        if (!ops[i]) return NULL;
    }
    cudnnBackendDescriptor_t graph = create(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    if (!graph) return NULL;
    DNN(b, "graph operations", cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, g->n_ops, ops));
    DNN(b, "graph handle",
        cudnnBackendSetAttribute(graph, ATTR_OPGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &b->handle));
    DNN(b, "finalizing the operation graph", cudnnBackendFinalize(graph));
    return graph;
}

/* ---- engines and plans -------------------------------------------------------------- */

/* Elements an operand spans with its strides (for the trial buffers). */
static size_t span_bytes(int rank, const int64_t *shape, const int64_t *stride) {
    int64_t last = 0;
    for (int d = 0; d < rank; d++) last += (shape[d] - 1) * stride[d];
    return (size_t)(last + 1) * sizeof(float);
}

static void variant_pack_free(cudnnBackendDescriptor_t vp) {
    if (vp) cudnnBackendDestroyDescriptor(vp);
}

/* A finalized variant pack binding the plan's uids to these addresses. */
static cudnnStatus_t variant_pack(const mk_cudnn_plan *p, void *const *ptrs, void *workspace,
                                  cudnnBackendDescriptor_t *out, const char **what) {
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st;
    *out = NULL;
    *what = "creating a variant pack";
    if ((st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp)) != 0)
        return st;
    *what = "variant pack ids";
    if ((st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                       p->n_uids, p->uids)) != 0)
        goto fail;
    *what = "variant pack pointers";
    if ((st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                       CUDNN_TYPE_VOID_PTR, p->n_uids, ptrs)) != 0)
        goto fail;
    *what = "variant pack workspace";
    if ((st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR,
                                       1, &workspace)) != 0)
        goto fail;
    *what = "finalizing a variant pack";
    if ((st = cudnnBackendFinalize(vp)) != 0) goto fail;
    *out = vp;
    return CUDNN_STATUS_SUCCESS;
fail:
    cudnnBackendDestroyDescriptor(vp);
    return st;
}

/*
 * Runs a finalized plan once on scratch device memory (values do not matter),
 * outside any capture: a config that finalizes but cannot run is caught here
 * rather than while capturing the model, and runtime-compiled kernels are
 * loaded before capture. 0, or 1 with the reason.
 */
static int trial_run(mk_cudnn_cache *c, const mk_fused_group *g, mk_cudnn_plan *p,
                     cudnnBackendDescriptor_t plan, size_t workspace, char *why, size_t size) {
    void *ptrs[MK_GROUP_MAX_INPUTS + 1] = {NULL};
    void *ws = NULL;
    cudnnBackendDescriptor_t vp = NULL;
    const char *what = "";
    int rc = 1;
    size_t total = workspace;
    size_t bytes[MK_GROUP_MAX_INPUTS + 1];
    for (int k = 0; k < g->n_in; k++)
        total += bytes[k] = span_bytes(g->rank, g->in[k].shape, g->in[k].stride);
    {
        const mk_group_op *o = &g->op[g->n_ops - 1];
        int64_t dense[MK_MAX_RANK], s = 1;
        for (int d = g->rank - 1; d >= 0; d--) {
            dense[d] = s;
            s *= o->shape[d];
        }
        total += bytes[g->n_in] = span_bytes(g->rank, o->shape, dense);
    }
    if (total > g->trial_limit) return 0;
    cudaError_t ce = cudaSuccess;
    for (int k = 0; k <= g->n_in && ce == cudaSuccess; k++)
        if ((ce = cudaMalloc(&ptrs[k], bytes[k])) == cudaSuccess)
            ce = cudaMemsetAsync(ptrs[k], 0, bytes[k], c->trial);
    if (ce == cudaSuccess && workspace) ce = cudaMalloc(&ws, workspace);
    if (ce != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, size, "trial run: %s", cudaGetErrorString(ce));
        goto done;
    }
    cudnnStatus_t st;
    if ((st = variant_pack(p, ptrs, ws, &vp, &what)) != CUDNN_STATUS_SUCCESS ||
        (what = "cudnnSetStream", st = cudnnSetStream(c->handle, c->trial)) != 0 ||
        (what = "trial cudnnBackendExecute", st = cudnnBackendExecute(c->handle, plan, vp)) != 0) {
        status_text(why, size, what, st);
        goto done;
    }
    if ((ce = cudaStreamSynchronize(c->trial)) != cudaSuccess) {
        cudaGetLastError();
        snprintf(why, size, "trial run: %s", cudaGetErrorString(ce));
        goto done;
    }
    rc = 0;
done:
    cudaStreamSynchronize(c->trial);
    variant_pack_free(vp);
    for (int k = 0; k <= g->n_in; k++)
        if (ptrs[k]) cudaFree(ptrs[k]);
    if (ws) cudaFree(ws);
    cudaGetLastError();
    return rc;
}

/* The engine behind a config: its global index and whether it uses tensor cores. */
static void engine_notes(cudnnBackendDescriptor_t cfg, int64_t *index, bool *tensor_core) {
    cudnnBackendDescriptor_t engine = NULL;
    int64_t n = 0;
    *index = -1;
    *tensor_core = true; /* unknown: assume the reduced precision */
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != 0) return;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &n, &engine) == 0 && n == 1) {
        cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
        int64_t count = 0;
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                 index);
        if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                     CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                                     &count, notes) == 0) {
            *tensor_core = false;
            for (int64_t i = 0; i < count; i++)
                *tensor_core |= notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE;
        }
    }
    cudnnBackendDestroyDescriptor(engine);
}

/*
 * Engine configs for the graph from one heuristics mode, tried in order: the
 * first whose plan finalizes and passes the trial run becomes p's plan.
 * 0: planned; 1: none worked (why says the last failure).
 */
static int plan_from(builder *b, mk_cudnn_cache *c, const mk_fused_group *g,
                     cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode,
                     const char *mode_name, int *tried) {
    mk_cudnn_plan *p = b->p;
    cudnnBackendDescriptor_t heur = NULL, cfgs[64] = {NULL};
    int64_t count = 0;
    int rc = 1;
    char last[512] = "";
    cudnnStatus_t st;
    const char *what = "creating heuristics";
    bool has_matmul = false;
    int64_t engine[64];
    bool tensor_core[64];
    if ((st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, &heur)) != 0 ||
        (what = "heuristics graph",
         st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph)) != 0 ||
        (what = "heuristics mode", st = cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE,
                                                                 CUDNN_TYPE_HEUR_MODE, 1, &mode)) != 0 ||
        (what = "finalizing heuristics", st = cudnnBackendFinalize(heur)) != 0 ||
        (what = "counting engine configs",
         st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL)) != 0) {
        char text[512];
        status_text(text, sizeof text, what, st);
        snprintf(b->why, b->why_size, "heuristics %s: %s", mode_name, text);
        goto done;
    }
    if (count > 64) count = 64;
    for (int64_t i = 0; i < count; i++)
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, &cfgs[i]) != 0) {
            count = i;
            break;
        }
    if (count > 0 &&
        (st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, cfgs)) != 0) {
        status_text(b->why, b->why_size, "reading engine configs", st);
        goto done;
    }
    if (count == 0) {
        snprintf(b->why, b->why_size, "heuristics %s offer no engine config", mode_name);
        goto done;
    }
    /* Configs whose engine avoids tensor cores compute float32 exactly: tried
     * first (pass 0), then the rest in the heuristics' order (pass 1). */
    for (int k = 0; k < g->n_ops; k++) has_matmul |= g->op[k].kind == MK_GOP_MATMUL;
    for (int64_t i = 0; i < count; i++) engine_notes(cfgs[i], &engine[i], &tensor_core[i]);
    for (int64_t j = 0; j < 2 * count; j++) {
        int64_t i = j % count;
        if ((j < count) == (has_matmul && tensor_core[i])) continue;
        cudnnBackendDescriptor_t plan = NULL;
        (*tried)++;
        what = "creating a plan";
        if ((st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan)) != 0 ||
            (what = "plan handle", st = cudnnBackendSetAttribute(plan, ATTR_PLAN_HANDLE,
                                                                 CUDNN_TYPE_HANDLE, 1, &b->handle)) != 0 ||
            (what = "plan engine config",
             st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i])) != 0 ||
            (what = "finalizing a plan", st = cudnnBackendFinalize(plan)) != 0) {
            status_text(last, sizeof last, what, st);
            if (plan) cudnnBackendDestroyDescriptor(plan);
            continue;
        }
        int64_t ws = 0, n = 0;
        if ((st = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                           CUDNN_TYPE_INT64, 1, &n, &ws)) != 0 || ws < 0) {
            status_text(last, sizeof last, "plan workspace size", st);
            cudnnBackendDestroyDescriptor(plan);
            continue;
        }
        if (trial_run(c, g, p, plan, (size_t)ws, last, sizeof last)) {
            cudnnBackendDestroyDescriptor(plan);
            continue;
        }
        if (p->n_keep == MK_CUDNN_MAX_KEEP) {
            snprintf(b->why, b->why_size, "the group needs too many descriptors");
            cudnnBackendDestroyDescriptor(plan);
            goto done;
        }
        p->plan = plan;
        p->keep[p->n_keep++] = cfgs[i]; /* the plan refers to it */
        cfgs[i] = NULL;
        p->workspace_bytes = (size_t)ws;
        p->tf32 = has_matmul && tensor_core[i];
        snprintf(p->why, sizeof p->why, "engine %lld (config %lld of %lld, heuristics %s), %s, "
                 "workspace %lld B", (long long)engine[i], (long long)i + 1, (long long)count,
                 mode_name, has_matmul ? (p->tf32 ? "TF32 matmul" : "float32 matmul") : "float32",
                 (long long)ws);
        rc = 0;
        goto done;
    }
    snprintf(b->why, b->why_size, "none of %lld engine configs from heuristics %s works; the last "
             "said: %s", (long long)count, mode_name, last);
done:
    for (int64_t i = 0; i < 64; i++)
        if (cfgs[i]) cudnnBackendDestroyDescriptor(cfgs[i]);
    if (heur) cudnnBackendDestroyDescriptor(heur);
    return rc;
}

/* ---- the cache ---------------------------------------------------------------------- */

static void plan_free(mk_cudnn_plan *p) {
    if (!p) return;
    if (p->plan) cudnnBackendDestroyDescriptor(p->plan);
    for (int i = p->n_keep - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(p->keep[i]);
    free(p->trace);
    free(p);
}

void mk_cudnn_cache_free(struct mk_cudnn_cache *c) {
    if (!c) return;
    for (mk_cudnn_plan *p = c->plans, *next; p; p = next) {
        next = p->next;
        plan_free(p);
    }
    if (c->trial) cudaStreamDestroy(c->trial);
    if (c->handle) cudnnDestroy(c->handle);
    cudaGetLastError();
    free(c);
}

static mk_cudnn_cache *cache_open(struct mk_cudnn_cache **slot, mk_error **err) {
    if (*slot) return *slot;
    size_t version = cudnnGetVersion();
    if (version < 90000) {
        mk_fail(err, MK_ERR_DEVICE, 0, 0, "cuDNN %zu.%zu is loaded; the fuser needs cuDNN 9",
                version / 10000, version / 100 % 100);
        return NULL;
    }
    mk_cudnn_cache *c = (mk_cudnn_cache *)calloc(1, sizeof *c);
    if (!c) {
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "cannot allocate the cuDNN cache");
        return NULL;
    }
    cudaError_t ce = cudaSetDevice(0); /* the CUDA device's models run on device 0 */
    if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&c->trial, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        mk_cuda_fail_status(err, ce, "creating the cuDNN fuser's stream", __FILE__, __LINE__);
        mk_cudnn_cache_free(c);
        return NULL;
    }
    cudnnStatus_t st = cudnnCreate(&c->handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        char why[600];
        status_text(why, sizeof why, "cudnnCreate", st);
        mk_fail(err, st == CUDNN_STATUS_ALLOC_FAILED ? MK_ERR_NOMEM : MK_ERR_DEVICE, 0, 0,
                "cuDNN: %s", why);
        c->handle = NULL;
        mk_cudnn_cache_free(c);
        return NULL;
    }
    *slot = c;
    return c;
}

int mk_cudnn_compile_group(struct mk_cudnn_cache **slot, mk_fused_group *g, char *why,
                           size_t why_size, mk_error **err) {
    mk_cudnn_cache *c = cache_open(slot, err);
    if (!c) return -1;
    /* Tests of the fallback path: every group is refused, nothing is cached. */
    const char *force = getenv("MK_CUDNN_REJECT");
    if (force && *force && strcmp(force, "0")) {
        snprintf(why, why_size, "MK_CUDNN_REJECT is set in the environment");
        return 1;
    }
    mk_cudnn_plan *p = c->plans;
    while (p && strcmp(p->trace, g->trace)) p = p->next;
    bool hit = p != NULL;
    double t0 = now_ms();
    if (!p) {
        p = (mk_cudnn_plan *)calloc(1, sizeof *p);
        if (!p || !(p->trace = strdup(g->trace))) {
            free(p);
            return mk_fail(err, MK_ERR_NOMEM, 0, 0, "cannot allocate a cuDNN plan");
        }
        p->cache = c;
        p->n_uids = g->n_in + 1;
        for (int k = 0; k < g->n_in; k++) p->uids[k] = MK_CUDNN_UID_IN + k;
        p->uids[g->n_in] = MK_CUDNN_UID_OUT;
        builder b = {c->handle, p, p->why, sizeof p->why};
        cudnnBackendDescriptor_t graph = op_graph(&b, g);
        int tried = 0;
        if (!graph)
            p->rejected = true;
        else if (plan_from(&b, c, g, graph, CUDNN_HEUR_MODE_A, "A", &tried)) {
            char first[sizeof p->why];
            memcpy(first, p->why, sizeof first);
            if (plan_from(&b, c, g, graph, CUDNN_HEUR_MODE_FALLBACK, "fallback", &tried)) {
                char second[sizeof p->why];
                memcpy(second, p->why, sizeof second);
                snprintf(p->why, sizeof p->why, "%.360s; %.360s", first, second);
                p->rejected = true;
            }
        }
        if (p->rejected) { /* only the reason is kept */
            for (int i = p->n_keep - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(p->keep[i]);
            p->n_keep = 0;
        } else {
            size_t len = strlen(p->why);
            snprintf(p->why + len, sizeof p->why - len, ", planned in %.1f ms", now_ms() - t0);
        }
        p->next = c->plans;
        c->plans = p;
        c->n_plans++;
    }
    snprintf(why, why_size, "%s", p->why);
    if (p->rejected) return 1;
    g->plan = p;
    g->workspace_bytes = p->workspace_bytes;
    g->cache_hit = hit;
    g->tf32 = p->tf32;
    return 0;
}

void mk_cudnn_group_release(mk_fused_group *g) {
    if (!g) return;
    variant_pack_free((cudnnBackendDescriptor_t)g->varpack);
    g->varpack = NULL;
    g->plan = NULL; /* the cache (the context's) owns it */
}

/* ---- the kernel ------------------------------------------------------------------------- */

int mk_cuda_cudnn_group(const mk_launch *l, mk_error **err) {
    mk_cuda_state *s = mk_cuda_state_of(l);
    mk_fused_group *g = mk_node_cudnn(l->node);
    if (!g || !g->plan || l->n_in != g->n_in)
        return MK_INTERNAL(err, "a cuDNN group launch without its compiled group");
    mk_cudnn_plan *p = g->plan;
    if (l->scratch_bytes < p->workspace_bytes)
        return MK_INTERNAL(err, "a cuDNN group launch got less scratch than its workspace");
    void *ptrs[MK_GROUP_MAX_INPUTS + 1];
    for (int k = 0; k < g->n_in; k++) ptrs[k] = l->in[k].data;
    ptrs[g->n_in] = l->out.data;
    const char *what = "";
    cudnnStatus_t st;
    variant_pack_free((cudnnBackendDescriptor_t)g->varpack); /* a second capture rebinds */
    g->varpack = NULL;
    cudnnBackendDescriptor_t vp = NULL;
    /* Relaxed capture mode for the call: cuDNN may make non-stream calls
     * while it records. */
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    if ((st = variant_pack(p, ptrs, p->workspace_bytes ? l->scratch : NULL, &vp, &what)) == 0 &&
        (what = "cudnnSetStream", st = cudnnSetStream(p->cache->handle, s->stream)) == 0)
        what = "cudnnBackendExecute", st = cudnnBackendExecute(p->cache->handle, p->plan, vp);
    cudaThreadExchangeStreamCaptureMode(&mode);
    if (st != CUDNN_STATUS_SUCCESS) {
        char why[600];
        status_text(why, sizeof why, what, st);
        variant_pack_free(vp);
        return mk_fail(err, MK_ERR_DEVICE, l->node->line, l->node->column, "%s (cuDNN group): %s",
                       l->node->op->name, why);
    }
    g->varpack = vp; /* kept with the model: the captured graph was recorded from it */
    /* cuDNN reports its own launch failures in its status; a query it made
     * internally must not be blamed on the next kernel */
    cudaGetLastError();
    return 0;
}
