/*
 * matvec.h — what the three files of the matrix–vector generator share
 * (matvec.c: the kernel's layout, results and epilogues;
 * matvec_step.c: a lane's step, its weights' loads and A's staging;
 * matvec_tc.c: the tensor-core form). Each function writes CUDA C into
 * b for the group of launch l, as its comment where it is defined says.
 */
#ifndef MK_CODEGEN_MATVEC_H
#define MK_CODEGEN_MATVEC_H

#include "codegen.h"

/* Warps of a block: more (16, 32) or fewer lost (doc/performance.md). */
#define MK_MV_WARPS 8

/* A block holds A in shared memory where A's bytes fit under the 48 KiB of
 * static shared memory (with room for the slices' sums and ArgMax keys;
 * Llama-2-7B's [1, 11008] fits) and the launch reads enough weights that
 * the copy's barrier is a small part of it (8 MB: stories110M's launches were
 * slower staged, Llama-2-7B's faster). */
#define MK_STAGE_BYTES (44 * 1024)
#define MK_STAGE_MIN_WEIGHTS (8LL << 20)

/*
 * A matrix–vector launch's plan: every choice its kernel's source and its grid
 * depend on, made in one place (mk_mv_plan_of) and read by the emitters and
 * the grid alike, so the two cannot disagree.
 */
typedef struct {
    const mk_launch *l;
    const mk_product_group *pg;
    int tc;          /* warps that split k in the tensor-core form (mk_mv_tc_slices), or 0 */
    int E;           /* weights a lane loads at once (mk_mv_weights_per_load) */
    int C;           /* columns a warp: 2 or 4 (warp_columns); a tile of 16 in the tc form */
    int W;           /* warps that split k (product_slices, or tc) */
    int BW;          /* warps a block (mk_mv_block_warps) */
    bool staged;     /* A in shared memory (staged_a; always in the tc form) */
    int pre;         /* steps whose weights a lane loads before the wait (preload_steps) */
    bool raw;        /* those weights kept as raw bytes until their step (preload_raw) */
    bool ahead;      /* int8 weights loaded a step ahead (loads_ahead) */
    unsigned int blocks, threads; /* the grid */
} mk_mv_plan;

/* matvec.c */
void mk_mv_plan_of(const mk_launch *l, mk_mv_plan *p);
const char *mk_mv_weight_suffix(mk_dtype d);
long long mk_mv_ldb_of(const mk_launch *l, const mk_product_group *pg, const mk_product_out *r, int s);
int mk_mv_block_warps(int W);
int mk_mv_argmax_slot(const mk_product_group *pg, int o);
void mk_mv_put_argmax_blocks(mk_strbuf *b, const mk_product_group *pg, long long per);
int mk_mv_plain_sources(const mk_product_out *r);
void mk_mv_put_epilogue_loads(mk_strbuf *b, const mk_mv_plan *p, int o, int C, const char *who);
void mk_mv_put_column_pointers(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                               const int *prods, int np);
int mk_mv_product_sources(const mk_product_out *r, int *prods);
int mk_mv_most_products(const mk_product_group *pg);
void mk_mv_put_epilogue(mk_strbuf *b, const mk_mv_plan *p, int o, int C, const char *who);
int mk_mv_weights_per_load(const mk_launch *l, const mk_product_group *pg);

/* matvec_step.c */
void mk_mv_put_weight_decls(mk_strbuf *b, const mk_mv_plan *p, int np, const char *tag,
                            const char *indent, bool raw);
void mk_mv_put_weight_loads(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                            const int *prods, int np, const char *tag, const char *indent, bool raw);
void mk_mv_put_weight_widen(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                            const int *prods, int np, const char *tag);
void mk_mv_put_float_math(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                          const int *prods, int np, const char *tag);
void mk_mv_put_grid_step(mk_strbuf *b, const mk_mv_plan *p, const mk_product_out *r,
                         const int *prods, int np, const char *tag);
void mk_mv_plan_steps(mk_mv_plan *p); /* pre, raw and ahead, from the rest of the plan */
bool mk_mv_constant_weights(const mk_launch *l, const mk_product_group *pg);
void mk_mv_put_gathers(mk_strbuf *b, const mk_product_group *pg);
void mk_mv_put_preloads(mk_strbuf *b, const mk_mv_plan *p);
long long mk_mv_weight_bytes(const mk_launch *l, const mk_product_group *pg);
void mk_mv_put_staging(mk_strbuf *b, const mk_mv_plan *p);

/* matvec_tc.c */
int mk_mv_tc_slices(const mk_launch *l, const mk_product_group *pg);
void mk_mv_put_digit_copy(mk_strbuf *b, const mk_product_group *pg);
void mk_mv_put_tc_source(mk_strbuf *b, const mk_mv_plan *p);

#endif
