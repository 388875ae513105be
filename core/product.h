/*
 * product.h — what product.c (the matrix-vector and attention pass) shares
 * with product_rules.c (which products and softmaxes may start a group, the
 * constant-layout decision, and the report's lines for those that do not).
 */
#ifndef MK_PRODUCT_H
#define MK_PRODUCT_H

#include "passes.h"

/* The DequantizeNode product p's B is where the group reads its int8 weights
 * and scales instead (folded in), else NULL. */
mk_node *mk_product_folded_dequantize(const mk_graph *g, const mk_node *p);
/* What the group reads as p's B: the int8 of a folded dequantization, or B. */
const mk_node *mk_product_weights_of(const mk_graph *g, const mk_node *p);
/* Whether weights b are read by rows: its columns are not contiguous. */
bool mk_product_by_rows(const mk_node *b);
/* Why product p cannot start a matrix-vector group on target t, or NULL. */
const char *mk_product_why_not(const mk_graph *g, const mk_target *t, const mk_node *p);
/* Holds p's float32 constant weights by columns where t's groups read only
 * those and p then groups (the layout model.c uploads). */
void mk_product_hold_by_columns(const mk_graph *g, const mk_target *t, const mk_node *p);
/* Whether n's elements lie in row-major order (dims of 1 aside). */
bool mk_product_dense(const mk_node *n);
/* Whether view v holds n's elements as they are, in another shape (a dense
 * view of dense n at its offset): a reshape a group may pass through. */
bool mk_product_reshape_of(const mk_node *v, const mk_node *n);
/* The nodes of an attention group around its softmax x: the scores s, the
 * prefix product y and, for a causal one whose query heads share kv heads,
 * the reshapes between (r1: s as [B, g, T, S] for the softmax, r2: back to
 * [B, g T, S] for y), else NULL. */
typedef struct {
    mk_node *s, *r1, *x, *r2, *y;
} mk_attention_nodes;
/* n's only reader, or NULL where it has several, none, or is the output. */
mk_node *mk_product_only_reader(const mk_graph *g, const mk_node *n);
/* Why the softmax x (sliced, or causal on a target with causal_attention)
 * cannot be the middle of an attention group on target t, or NULL; where it
 * can, its nodes into *at (if not NULL). */
const char *mk_attention_why_not(const mk_graph *g, const mk_target *t, mk_node *x,
                                 mk_attention_nodes *at);

#endif
