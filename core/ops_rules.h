/*
 * ops_rules.h — the rules of core/ops_rules.c that the op table's rows name
 * (core/ops.c).
 */
#ifndef MK_OPS_RULES_H
#define MK_OPS_RULES_H

#include "graph.h"

/* A node's shape as text for a message; a failure at the node's script position. */
#define SHAPE(n) mk_shape_str((n)->rank, (n)->shape, (char[96]){0}, 96)

/* Errors name the op, and the script position comes from the node. */
#define FAIL(err, n, code, ...) \
    mk_fail((err), (code), (n)->line, (n)->column, __VA_ARGS__)

int mk_infer_leaf(mk_node *n, mk_error **err);
int mk_infer_pointwise(mk_node *n, mk_error **err);
int mk_infer_float_pointwise(mk_node *n, mk_error **err);
int mk_infer_compare(mk_node *n, mk_error **err);
int mk_infer_logical(mk_node *n, mk_error **err);
int mk_infer_where(mk_node *n, mk_error **err);
int mk_infer_complex_mul(mk_node *n, mk_error **err);
int mk_infer_matmul(mk_node *n, mk_error **err);
int mk_infer_prefix_matmul(mk_node *n, mk_error **err);
int mk_infer_slice(mk_node *n, mk_error **err);
int mk_infer_reshape(mk_node *n, mk_error **err);
int mk_infer_permute(mk_node *n, mk_error **err);
int mk_infer_replace_slice(mk_node *n, mk_error **err);
int mk_infer_rms_norm(mk_node *n, mk_error **err);
int mk_infer_sliced_softmax(mk_node *n, mk_error **err);
int mk_infer_causal_softmax(mk_node *n, mk_error **err);
int mk_infer_embedding(mk_node *n, mk_error **err);
int mk_infer_cast(mk_node *n, mk_error **err);
int mk_infer_dequantize(mk_node *n, mk_error **err);
int mk_infer_fake_quantize(mk_node *n, mk_error **err);
int mk_infer_argmax(mk_node *n, mk_error **err);
int mk_infer_sample(mk_node *n, mk_error **err);
int mk_infer_internal(mk_node *n, mk_error **err);
int64_t mk_layout_slice(const mk_node *n, int64_t *stride);
int64_t mk_layout_reshape(const mk_node *n, int64_t *stride);
int64_t mk_layout_permute(const mk_node *n, int64_t *stride);
int64_t mk_layout_same(const mk_node *n, int64_t *stride);
bool mk_matmul_takes(int k, int rank, const int64_t *shape, const int64_t *stride);
size_t mk_matmul_scratch(const mk_node *n);
size_t mk_sample_scratch(const mk_node *n);
bool mk_any_strides(int k, int rank, const int64_t *shape, const int64_t *stride);

#endif
