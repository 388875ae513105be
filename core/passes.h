/*
 * passes.h — the stages between parsing and binding: the ordered passes
 * (passes.c) with the grouping passes, the cuDNN fusion state, and the
 * planner. Passes read the graph, the compile options and the target; they
 * include no device header (spec/layering_spec.lua).
 */
#ifndef MK_PASSES_H
#define MK_PASSES_H

#include "group.h"

/* passes.c: the ordered pass list, run between parsing and planning */
int mk_passes_run(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err);
/* group_pointwise.c: the grouping pass (pointwise trees) */
int mk_pointwise_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err);
/* product.c: matrix–vector and attention groups, and the fusion report's line
 * for each product or softmax left to the device's own kernel, saying why */
int mk_product_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err);
void mk_product_report(const mk_graph *g, const mk_target *t, mk_strbuf *b);
/* product_describe.c: the classes of product.c's groups */
extern const mk_group_class mk_matvec_class, mk_attention_class;
/* gather.c: single-id embeddings of constant tables read by matrix-vector
 * groups become views, the groups reading their row (mk_product_gather) */
int mk_gather_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err);

/* group_rows.c: a row op with its pointwise prologue and epilogue, on devices
 * whose target has row_groups */
int mk_rows_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                 mk_error **err);
/* group_conv.c: a convolution with its bias, batch norm, residual add and
 * ReLU, on devices whose target has conv_groups */
int mk_conv_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                 mk_error **err);
/*
 * What a CUDA device's prepare found of a cuDNN group at an earlier compile,
 * by the group's trace: that cuDNN refuses it (why), or the workspace its
 * plan needs. A context keeps them; the fusion pass decides from them and
 * from the target, never asking a device.
 */
typedef struct mk_cudnn_note {
    struct mk_cudnn_note *next;
    char *trace;
    bool rejected;
    size_t workspace_bytes;
    unsigned built_in;  /* the compile call (mk_fusion.call) that built its plan */
    char why[512];
} mk_cudnn_note;
void mk_cudnn_notes_free(mk_cudnn_note *);

/* The fusion state of one compile, owned by the model. */
typedef struct mk_fusion {
    struct mk_cudnn_cache **cache; /* the context's cache of plans (made on first use) */
    mk_cudnn_note **notes;         /* the context's notes */
    unsigned call;                 /* the context's count of compile calls, this one's */
    int n_groups, cap_groups;
    mk_fused_group **groups;       /* fused groups, owned */
    int fused, cache_hits, rejected, tf32;
    mk_strbuf report;              /* one line per group tried (report.s NULL: none yet) */
} mk_fusion;

mk_fusion *mk_fusion_new(struct mk_cudnn_cache **cache, mk_cudnn_note **notes, unsigned call);
void mk_fusion_free(mk_fusion *);
/* After the device's prepare: a line in the report per group it compiled
 * ("fused", or "cache hit" where an earlier compile call built its plan,
 * with cuDNN's words), and the counts. */
void mk_fusion_prepared(mk_fusion *, const mk_graph *g);
/* After a prepare that found groups cuDNN refuses, or whose plans need more
 * workspace than they were given: notes for the next compile's pass. Returns
 * how many are new (0: nothing learned), or -1 out of memory. */
int mk_fusion_learn(mk_fusion *);
/* The pass (passes.c runs it after assign-storage when opts->use_cudnn). */
int mk_fusion_pass(mk_graph *g, const mk_compile_options *opts, const mk_target *t,
                    mk_error **err);

/* ---- planner (planner.c) ------------------------------------------------ */

/*
 * Offsets in one arena. Sizes are rounded up to MK_ALIGN; every offset is a
 * multiple of MK_ALIGN. Free blocks are kept ordered by address (neighbours
 * merge on release) and by (size, address) for best fit: O(log n) each.
 * A request no free block fits takes the top of the arena (growing it, and
 * absorbing a free block that touches the top).
 */
typedef struct mk_planner mk_planner;
mk_planner *mk_planner_new(void);
void mk_planner_free(mk_planner *);
/* Offset of a new block, or -1 when host memory for bookkeeping runs out (or the
 * size cannot be an arena offset: over INT64_MAX/2). */
int64_t mk_planner_alloc(mk_planner *, size_t bytes);
/* Gives back a block allocated with these offset and bytes. */
void mk_planner_release(mk_planner *, int64_t offset, size_t bytes);
size_t mk_planner_arena_bytes(const mk_planner *); /* high-water mark */
size_t mk_planner_peak_live(const mk_planner *);   /* largest sum of live (rounded) sizes */

#endif
