/*
 * onnx.h — what the ONNX importer's files share (core/onnx/):
 *   import.c    the file (protobuf-c's ModelProto), graph inputs, node order,
 *               the lowering loop, the public functions
 *   values.c    ONNX types, known values, initializers and external data,
 *               names, the rows' errors and attributes, the script lines
 *   onnx_ops.c  the mapping table: one row per ONNX op, with the moonkaas op
 *               or small subgraph it becomes and the rules of its attributes;
 *               folding of shape-computing nodes whose inputs are all known
 *
 * An ONNX value is either known at load (an initializer, a Constant, what a
 * shape-computing subgraph gives: its data on the host) or a node of the
 * script being written ($N). A known value becomes a ConstantTensor line only
 * where a run-time node reads it.
 */
#ifndef MK_ONNX_H
#define MK_ONNX_H

#include "graph.h"

/* ONNX's TensorProto.DataType numbers (the specification's) */
enum {
    OX_FLOAT = 1, OX_UINT8 = 2, OX_INT8 = 3, OX_UINT16 = 4, OX_INT16 = 5, OX_INT32 = 6,
    OX_INT64 = 7, OX_STRING = 8, OX_BOOL = 9, OX_FLOAT16 = 10, OX_DOUBLE = 11, OX_UINT32 = 12,
    OX_UINT64 = 13, OX_BFLOAT16 = 16,
};

typedef struct {
    char *name;       /* the ONNX name */
    int onnx_type;    /* TensorProto.DataType */
    mk_dtype dtype;   /* how it is held: ONNX's integer types other than int8 as int64 */
    int rank;         /* ONNX's rank, 0 for a scalar; its node has rank max(rank, 1) */
    int64_t shape[MK_MAX_RANK];
    const void *data; /* known at load: dense row-major elements of dtype, else NULL */
    int node;         /* its $N in the script, 0 while it has none */
} ox_value;

typedef struct ox_import ox_import;
typedef struct Onnx__NodeProto Onnx__NodeProto;
typedef struct Onnx__ModelProto Onnx__ModelProto;
typedef struct Onnx__TensorProto Onnx__TensorProto;

/* Files up to this size are read; larger ones mapped. */
#define OX_READ_BYTES ((size_t)64 << 20)
/* The largest value computed at load (a folded node's result). */
#define OX_FOLD_BYTES ((size_t)256 << 20)

/* ---- the import (import.c) and its values (values.c) ---------------------------- */

typedef struct {
    char *name;         /* script name */
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    const void *data;
} ox_constant;

typedef struct {
    char *onnx_name;
    char *name;         /* script name */
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
} ox_input;

struct mk_onnx {
    char *script;
    int opset;
    Onnx__ModelProto *model; /* raw_data of initializers is read in place */
    size_t n_constants, n_inputs, n_outputs;
    ox_constant *constants;
    ox_input *inputs;
    char **outputs;
    void **owned;       /* host memory the import allocated */
    size_t n_owned, cap_owned;
    mk_mapped *maps;    /* external data files */
    size_t n_maps;
};

/* names to pointers, open addressing (values by ONNX name; script names used) */
typedef struct {
    const char **keys;
    void **vals;
    size_t cap, n;
} ox_map;

struct ox_import {
    mk_onnx *o;
    const char *path;
    char *dir;          /* the model's folder, resolved */
    const mk_onnx_options *opts;
    ox_map values;      /* ONNX name -> ox_value */
    ox_map names;       /* script names taken */
    ox_value **all;     /* every value, to free */
    size_t n_all, cap_all;
    mk_strbuf script;
    int next_id;
    size_t cap_constants;
};

ox_value *ox_new_value(ox_import *im, const char *name, mk_error **err);
/* Registers v under its ONNX name: a second value of one name is an error. */
int ox_define(ox_import *im, ox_value *v, const char *what, mk_error **err);
/* A script name for an ONNX name: its characters where the script takes them,
 * '_' for the others, unique among the script's names. */
char *ox_script_name(ox_import *im, const char *onnx, mk_error **err);
char *ox_strdup(ox_import *im, const char *s, mk_error **err);
/* The element count of a shape: 0, or -1 past 2^48 or for a negative dim. */
int ox_numel(int rank, const int64_t *shape, int64_t *out);
/* A TensorProto (an initializer, a Constant's value) as a known value. */
int ox_tensor_proto(ox_import *im, const Onnx__TensorProto *t, ox_value *v, const char *what,
                    mk_error **err);
void *ox_map_get(const ox_map *m, const char *key);
int ox_map_put(ox_map *m, const char *key, void *val);
void ox_map_free(ox_map *m);
const char *ox_node_name(const Onnx__NodeProto *p); /* its name, else its first output's */
const char *ox_op_name(const Onnx__NodeProto *p);
/* How a value is held as a node: rank max(rank, 1), a scalar as [1]. */
int ox_node_rank(const ox_value *v);
const int64_t *ox_node_shape(const ox_value *v);
void ox_put_shape(mk_strbuf *b, int rank, const int64_t *shape);

/* One ONNX node being lowered: what the rows' functions read and write. */
typedef struct {
    ox_import *im;
    const Onnx__NodeProto *proto;
    int opset;
    int n_in, n_out;
    ox_value *in[MK_MAX_INPUTS]; /* NULL for an optional input left out ("") */
    ox_value *out[4];            /* filled by the row (shape, data or node) */
} ox_node;

/* A row of the mapping table. */
typedef struct {
    mk_onnx_op_desc desc; /* op type, opsets, attributes read (any other is an error), what
                             it becomes, its rules: what mk_onnx_op_info and doc/onnx.md show */
    int (*lower)(ox_node *n, mk_error **err);
} ox_row;

const ox_row *ox_find_row(const char *op_type, int opset, bool *other_opset);
size_t ox_row_count(void);
const ox_row *ox_row_at(size_t i);

/* ---- for the rows (import.c) ------------------------------------------------ */

/* Fails naming the node: "<kind>: ONNX node 'name' (Op, opset N): message". */
int ox_fail(ox_node *n, mk_error **err, mk_error_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Puts "ONNX node 'name' (Op, opset N)" in front of *err's message. */
int ox_within(ox_node *n, mk_error **err);

/* The node's attribute `name` of ONNX type `type` (AttributeProto's), or NULL
 * where it has none; an attribute of another type is an error. */
typedef struct Onnx__AttributeProto Onnx__AttributeProto;
const Onnx__AttributeProto *ox_attr(ox_node *n, const char *name, int type, mk_error **err);
int ox_attr_int(ox_node *n, const char *name, int64_t def, int64_t *out, mk_error **err);
int ox_attr_float(ox_node *n, const char *name, float def, float *out, mk_error **err);

/* Host memory the import owns until it is closed (zeroed). */
void *ox_alloc(ox_import *im, size_t bytes, mk_error **err);
/* out as a new known value of dtype and shape (data allocated, zeroed). */
void *ox_set_known(ox_node *n, ox_value *out, int onnx_type, int rank, const int64_t *shape,
                   mk_error **err);
/* Reads known integers (int64-held) of v into out (at most max): their count, or -1. */
int ox_known_ints(ox_node *n, const ox_value *v, const char *what, int64_t *out, int max,
                  mk_error **err);

/* The $N of v in the script, a ConstantTensor line written first where v is known. */
int ox_ref(ox_node *n, ox_value *v, mk_error **err);
/*
 * Writes `$N = op(args);` and sets out's node, dtype and shape from the op's
 * rule (mk_op_infer): operands are values (signature letters n, r), ints the
 * integers (i letters, then an l list: n_ints in all), dtype for a d letter.
 * out->rank is ONNX's rank: the rule's, or `onnx_rank` where >= 0 (a scalar
 * held as [1]).
 */
int ox_emit(ox_node *n, ox_value *out, const char *op, ox_value *const *operands, int n_operands,
            const int64_t *ints, int n_ints, mk_dtype dtype, int onnx_rank, mk_error **err);
/* A value of the node's own, for the middle of a subgraph (neither known nor a node yet). */
ox_value *ox_temp(ox_node *n, mk_error **err);
/* A Constant's tensor attribute (a TensorProto) as a known value. */
int ox_tensor_value(ox_node *n, const void *tensor, ox_value *out, mk_error **err);
/* A whole file's bytes parsed and imported (dir: its folder, for external data). */
mk_onnx *mk_onnx_parse_buffer(const void *data, size_t size, const char *path, const char *dir,
                              const mk_onnx_options *opts, mk_error **err);

/* A known int64 [1] value (a bound of SlicedSoftmaxNode, a scalar factor's source). */
ox_value *ox_known_scalar(ox_node *n, int onnx_type, double v, mk_error **err);

/* onnx_ops.c's helpers for the rows in onnx_nn.c: a needed input, an output
 * that is its input, an axis in [-rank, rank), a reshape (folded when known),
 * numpy.matmul. */
ox_value *ox_need(ox_node *n, int k, mk_error **err);
void ox_alias(ox_value *out, const ox_value *v);
int ox_axis(ox_node *n, int64_t axis, int rank, const char *what, int *out, mk_error **err);
int ox_reshape(ox_node *n, ox_value *out, ox_value *x, int rank, const int64_t *shape,
               mk_error **err);
int ox_matmul(ox_node *n, ox_value *out, ox_value *a, ox_value *b, mk_error **err);
/* The rows of onnx_nn.c (the ops of networks: pointwise, reductions, norms,
 * convolution and pooling, data movement). */
int ox_lower_pointwise(ox_node *n, mk_error **err);
int ox_lower_where(ox_node *n, mk_error **err);
int ox_lower_leaky_relu(ox_node *n, mk_error **err);
int ox_lower_gelu(ox_node *n, mk_error **err);
int ox_lower_clip(ox_node *n, mk_error **err);
int ox_lower_minmax(ox_node *n, mk_error **err);
int ox_lower_softmax(ox_node *n, mk_error **err);
int ox_lower_reduce(ox_node *n, mk_error **err);
int ox_lower_layer_norm(ox_node *n, mk_error **err);
int ox_lower_batch_norm(ox_node *n, mk_error **err);
int ox_lower_conv(ox_node *n, mk_error **err);
int ox_lower_conv_transpose(ox_node *n, mk_error **err);
int ox_lower_pool(ox_node *n, mk_error **err);
int ox_lower_global_pool(ox_node *n, mk_error **err);
int ox_lower_concat_run(ox_node *n, mk_error **err);
int ox_lower_split(ox_node *n, mk_error **err);
int ox_lower_slice_run(ox_node *n, const int64_t *b, const int64_t *e, const int64_t *st,
                       mk_error **err);
int ox_lower_expand(ox_node *n, mk_error **err);
int ox_lower_tile(ox_node *n, mk_error **err);
int ox_lower_pad(ox_node *n, mk_error **err);
int ox_lower_resize(ox_node *n, mk_error **err);
int ox_lower_range(ox_node *n, mk_error **err);
int ox_lower_constant_of_shape(ox_node *n, mk_error **err);
/* onnx_rnn.c: LSTM unrolled over the sequence. */
int ox_lower_lstm(ox_node *n, mk_error **err);

/* ONNX type to moonkaas dtype: 0, or -1 where moonkaas holds no such tensor at run time. */
int ox_runtime_dtype(int onnx_type, mk_dtype *out);
const char *ox_type_name(int onnx_type);

#endif
