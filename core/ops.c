/*
 * ops.c — the op table: one row per node kind, and the only file that knows
 * an op. A row gives the script name and argument signature, the role the
 * passes read, the front ends' method and operator, the scalar expression of a
 * pointwise op, the shape/dtype rule, the view layout, which operands may be
 * strided, scratch, and the kernel family each device looks up.
 *
 * Adding a pointwise op is adding a row with its expression: every device runs
 * expressions (core/cpu/ops.c over tiles, kernels/pointwise.cu per element) and the Lua
 * binding makes its method from the row. Other ops add a kernel family
 * (MK_KERNELS in graph.h) and a kernel per device.
 */
#include "group.h"
#include "ops_rules.h"
#include "reductions.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* ---- the table ------------------------------------------------------------ */

#define ROW(name_, sig, role_, flags_, method_, infix_, expr_, summary_)                         \
    .name = name_, .signature = sig, .role = role_, .flags = flags_, .method = method_,          \
    .infix = infix_, .expr = expr_, .summary = summary_
#define POINTWISE(name_, sig, flags_, method_, infix_, expr_, summary_)                          \
    {ROW(name_, sig, MK_ROLE_POINTWISE, flags_, method_, infix_, expr_, summary_),               \
     .infer = mk_infer_pointwise, .kernel = MK_KERNEL_POINTWISE}
/* A pointwise row with its own dtype rule (activations: floats; comparisons:
 * bool results; logical ops: bool operands). */
#define POINTWISE_RULE(name_, sig, flags_, method_, infix_, expr_, infer_, summary_)             \
    {ROW(name_, sig, MK_ROLE_POINTWISE, flags_, method_, infix_, expr_, summary_),               \
     .infer = infer_, .kernel = MK_KERNEL_POINTWISE}
#define BINARY (MK_OP_BROADCAST)
#define COMMUTING (MK_OP_BROADCAST | MK_OP_COMMUTES)

static const mk_op ops[] = {
    {ROW("InputTensor", "sdl", MK_ROLE_LEAF, MK_OP_FUNCTION, "input", NULL, NULL,
         "a tensor fed at every evaluation"),
     .leaf = MK_LEAF_INPUT, .infer = mk_infer_leaf},
    {ROW("ConstantTensor", "sdl", MK_ROLE_LEAF, MK_OP_FUNCTION, "constant", NULL, NULL,
         "weights, given at compile time"),
     .leaf = MK_LEAF_CONSTANT, .infer = mk_infer_leaf},
    {ROW("BufferTensor", "dlo", MK_ROLE_LEAF, MK_OP_FUNCTION, "buffer", NULL, NULL,
         "persistent state, zero after compile, kept across evaluations; a name lets another "
         "model share it"),
     .leaf = MK_LEAF_BUFFER, .infer = mk_infer_leaf},

    POINTWISE("SumNode", "nn", COMMUTING, "add", "+", "a + b", "a + b, broadcast as NumPy's"),
    POINTWISE("SubNode", "nn", BINARY, "sub", "-", "a - b", "a - b, broadcast as NumPy's"),
    POINTWISE("HadamardProductNode", "nn", COMMUTING, "mul", "*", "a * b",
              "a * b elementwise, broadcast as NumPy's"),
    POINTWISE("DivNode", "nn", BINARY, "div", "/", "a / b", "a / b, broadcast as NumPy's"),
    POINTWISE("ReLUNode", "n", 0, "relu", NULL, "a > 0 ? a : 0", "max(x, 0)"),
    /* as run.c's SwiGLU writes it, so llama2 outputs match run.c bit for bit */
    POINTWISE("SiLUNode", "n", 0, "silu", NULL, "a * (1.0f / (1.0f + expf(-a)))",
              "x * sigmoid(x)"),
    POINTWISE("ExpNode", "n", 0, "exp", NULL, "expf(a)", "e^x"),
    POINTWISE("TanhNode", "n", 0, "tanh", NULL, "tanhf(a)", "tanh(x)"),
    POINTWISE("SigmoidNode", "n", 0, "sigmoid", NULL, "1.0f / (1.0f + expf(-a))",
              "1 / (1 + e^-x)"),
    POINTWISE("GELUNode", "n", 0, "gelu", NULL,
              "0.5f * a * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a)))",
              "GELU, tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"),

    /* ---- pointwise: math, activations, comparisons, logic (issue 64) ---- */
    POINTWISE("NegNode", "n", 0, "neg", "-", "-a", "-x"),
    POINTWISE("AbsNode", "n", 0, "abs", NULL, "fabsf(a)", "|x| (int64: wraps at its minimum)"),
    POINTWISE("SqrtNode", "n", 0, "sqrt", NULL, "sqrtf(a)", "square root"),
    POINTWISE("RsqrtNode", "n", 0, "rsqrt", NULL, "1.0f / sqrtf(a)", "1 / sqrt(x)"),
    POINTWISE("LogNode", "n", 0, "log", NULL, "logf(a)", "natural logarithm"),
    POINTWISE("Exp2Node", "n", 0, "exp2", NULL, "exp2f(a)", "2^x"),
    POINTWISE("SinNode", "n", 0, "sin", NULL, "sinf(a)", "sine"),
    POINTWISE("CosNode", "n", 0, "cos", NULL, "cosf(a)", "cosine"),
    POINTWISE("ErfNode", "n", 0, "erf", NULL, "erff(a)", "the error function"),
    POINTWISE("FloorNode", "n", 0, "floor", NULL, "floorf(a)", "largest integer <= x"),
    POINTWISE("CeilNode", "n", 0, "ceil", NULL, "ceilf(a)", "smallest integer >= x"),
    POINTWISE("RoundNode", "n", 0, "round", NULL, "rintf(a)",
              "nearest integer, ties to even (torch.round, ONNX Round)"),
    POINTWISE("SignNode", "n", 0, "sign", NULL, "(a > 0) - (a < 0)", "1, 0 or -1"),
    POINTWISE("ReciprocalNode", "n", 0, "reciprocal", NULL, "1.0f / a", "1 / x"),
    POINTWISE_RULE("LeakyReLUNode", "nn", BINARY, "leaky_relu", NULL, "a > 0 ? a : b * a",
                   mk_infer_float_pointwise,
                   "x where x > 0, else alpha x (alpha: float32 [1] or broadcast; Lua's default "
                   "0.01)"),
    POINTWISE_RULE("ELUNode", "nn", BINARY, "elu", NULL, "a > 0 ? a : b * expm1f(a)",
                   mk_infer_float_pointwise,
                   "x where x > 0, else alpha (e^x - 1) (Lua's default alpha 1)"),
    POINTWISE_RULE("SoftplusNode", "n", 0, "softplus", NULL, "a > 20.0f ? a : log1pf(expf(a))",
                   mk_infer_float_pointwise, "log(1 + e^x); x itself past 20 (torch's threshold)"),
    POINTWISE_RULE("GELUErfNode", "n", 0, "gelu_erf", NULL,
                   "a * 0.5f * (1.0f + erff(a * 0.70710678118654752f))", mk_infer_float_pointwise,
                   "GELU, erf form: x/2 (1 + erf(x / sqrt(2))) (GELUNode is the tanh form)"),
    POINTWISE_RULE("HardSwishNode", "n", 0, "hardswish", NULL,
                   "a * min(max(a + 3.0f, 0.0f), 6.0f) / 6.0f", mk_infer_float_pointwise,
                   "x min(max(x + 3, 0), 6) / 6"),
    POINTWISE_RULE("MishNode", "n", 0, "mish", NULL,
                   "a * tanhf(a > 20.0f ? a : log1pf(expf(a)))", mk_infer_float_pointwise,
                   "x tanh(softplus(x))"),
    POINTWISE("PowNode", "nn", BINARY, "pow", "^", "powf(a, b)",
              "a^b (C's powf), broadcast as NumPy's"),
    POINTWISE("MinimumNode", "nn", COMMUTING, "minimum", NULL, "min(a, b)",
              "a < b ? a : b, broadcast as NumPy's (b where either is NaN)"),
    POINTWISE("MaximumNode", "nn", COMMUTING, "maximum", NULL, "max(a, b)",
              "a > b ? a : b, broadcast as NumPy's (b where either is NaN)"),
    POINTWISE("ModNode", "nn", BINARY, "mod", "%", "floormod(a, b)",
              "a - b floor(a / b): the divisor's sign, as Python's % and torch.remainder "
              "(int64 by 0: 0)"),
    POINTWISE("FloorDivNode", "nn", BINARY, "floor_div", "//", "floordiv(a, b)",
              "floor(a / b) as Python's // (int64 by 0: 0)"),
    POINTWISE("ClampNode", "nnn", BINARY, "clamp", NULL, "min(max(a, b), c)",
              "min(max(x, lo), hi), the three broadcast as NumPy's"),
    POINTWISE_RULE("EqualNode", "nn", COMMUTING, "eq", NULL, "a == b", mk_infer_compare,
                   "a == b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("NotEqualNode", "nn", COMMUTING, "ne", NULL, "a != b", mk_infer_compare,
                   "a != b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("LessNode", "nn", BINARY, "lt", NULL, "a < b", mk_infer_compare,
                   "a < b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("LessEqualNode", "nn", BINARY, "le", NULL, "a <= b", mk_infer_compare,
                   "a <= b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("GreaterNode", "nn", BINARY, "gt", NULL, "a > b", mk_infer_compare,
                   "a > b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("GreaterEqualNode", "nn", BINARY, "ge", NULL, "a >= b", mk_infer_compare,
                   "a >= b as bool, broadcast as NumPy's"),
    POINTWISE_RULE("WhereNode", "nnn", BINARY | MK_OP_FUNCTION, "where", NULL, "a ? b : c",
                   mk_infer_where, "where(c, a, b): a where the bool c holds, else b; the three broadcast "
                   "as NumPy's"),
    POINTWISE_RULE("LogicalAndNode", "nn", COMMUTING, "logical_and", NULL, "min(a, b)",
                   mk_infer_logical, "a and b, bool"),
    POINTWISE_RULE("LogicalOrNode", "nn", COMMUTING, "logical_or", NULL, "max(a, b)",
                   mk_infer_logical, "a or b, bool"),
    POINTWISE_RULE("LogicalNotNode", "n", 0, "logical_not", NULL, "a == 0", mk_infer_logical,
                   "not a, bool"),
    {ROW("ComplexHadamardProductNode", "nn", MK_ROLE_POINTWISE, COMMUTING, "complex_mul", NULL,
         NULL, "a * b as complex numbers (re, im) along a last axis of 2, broadcast as NumPy's"),
     .infer = mk_infer_complex_mul, .kernel = MK_KERNEL_COMPLEX_MUL},

    {ROW("MatMulNode", "nn", MK_ROLE_MATMUL, 0, "matmul", NULL, NULL,
         "a @ b as numpy.matmul: [.., m, k] @ [.., k, n] with batch dims broadcast; a [k] "
         "is a row and b [k] a column, dropped from the result"),
     .alias = "MulNode", .infer = mk_infer_matmul, .takes_strided = mk_matmul_takes,
     .scratch = mk_matmul_scratch, .kernel = MK_KERNEL_MATMUL},
    {ROW("PrefixMatMulNode", "nnr", MK_ROLE_MATMUL, 0, "matmul_prefix", NULL, NULL,
         "a @ b over the first p elements of the shared axis (attention over a cache's first "
         "p rows)"),
     .infer = mk_infer_prefix_matmul, .takes_strided = mk_matmul_takes,
     .kernel = MK_KERNEL_PREFIX_MATMUL},
    {ROW("RmsNormNode", "nn", MK_ROLE_REDUCTION, 0, "rms_norm", NULL, NULL,
         "w * x / sqrt(mean(x^2) + 1e-5) over the last axis"),
     .infer = mk_infer_rms_norm, .kernel = MK_KERNEL_RMS_NORM},
    {ROW("SlicedSoftmaxNode", "nr", MK_ROLE_REDUCTION, 0, "sliced_softmax", NULL, NULL,
         "softmax of the first prefix elements of each row, the rest unchanged"),
     .infer = mk_infer_sliced_softmax, .kernel = MK_KERNEL_SLICED_SOFTMAX},
    {ROW("CausalSoftmaxNode", "nr", MK_ROLE_REDUCTION, 0, "causal_softmax", NULL, NULL,
         "causal attention's softmax over the last axis of x [..., T, S]: row t of the T over "
         "its first end - T + 1 + t elements, the rest zero (T queries after end - T cached "
         "keys)"),
     .infer = mk_infer_causal_softmax, .kernel = MK_KERNEL_CAUSAL_SOFTMAX},
    {ROW("ArgMaxNode", "n", MK_ROLE_REDUCTION, 0, "argmax", NULL, NULL,
         "int64 index of the largest element of the last axis (the first on ties)"),
     .infer = mk_infer_argmax, .kernel = MK_KERNEL_ARGMAX},
    {ROW("SampleNode", "nnnn", MK_ROLE_REDUCTION, 0, "sample", NULL, NULL,
         "run.c's sampler per row of logits: int64 (token, next generator state) from the "
         "state, a temperature and a top-p (float32 [1], or [rows]: one a row); "
         "temperature > 0 draws from the "
         "softmax of logits / temperature (top-p when 0 < p < 1), otherwise the argmax and the "
         "state unchanged"),
     .infer = mk_infer_sample, .scratch = mk_sample_scratch, .kernel = MK_KERNEL_SAMPLE},
    /* ---- reductions and norms ---- */
    /* rules in ops_reduce.c; kernels in core/cpu/reduce.c and kernels/reduce.cu. Axes are
     * 0-based, negative ones from the end; a reduced axis stays as 1 in the script (the Lua
     * methods drop it unless keepdims = true). Lua: x:sum([axes][, {keepdims = bool}]),
     * axes an integer or a list, all axes when left out; the same for mean, max, min, prod */
/* a reduction over an axis list, and one along a single axis: operands of any strides */
#define REDUCTION(name_, method_, summary_, infer_, kernel_)                                     \
    {ROW(name_, "nl", MK_ROLE_REDUCTION, 0, method_, NULL, NULL, summary_), .infer = infer_,      \
     .takes_strided = mk_any_strides, .kernel = MK_KERNEL_##kernel_}
#define REDUCTION_AT(name_, method_, summary_, infer_, kernel_)                                  \
    {ROW(name_, "ni", MK_ROLE_REDUCTION, 0, method_, NULL, NULL, summary_), .infer = infer_,      \
     .takes_strided = mk_any_strides, .kernel = MK_KERNEL_##kernel_}
    REDUCTION("ReduceSumNode", "sum", "sum over the listed axes, each kept as 1 (Lua: "
              "x:sum([axes][, {keepdims = false}]), all axes when left out)",
              mk_infer_reduce, REDUCE_SUM),
    REDUCTION("ReduceMeanNode", "mean", "mean over the listed axes, each kept as 1 (Lua: "
              "x:mean([axes][, {keepdims = false}]))", mk_infer_reduce, REDUCE_MEAN),
    REDUCTION("ReduceMaxNode", "max", "largest element over the listed axes, each kept as 1; "
              "NaN if any is (Lua: x:max([axes][, {keepdims = false}]))",
              mk_infer_reduce, REDUCE_MAX),
    REDUCTION("ReduceMinNode", "min", "smallest element over the listed axes, each kept as 1; "
              "NaN if any is (Lua: x:min([axes][, {keepdims = false}]))",
              mk_infer_reduce, REDUCE_MIN),
    REDUCTION("ReduceProdNode", "prod", "product over the listed axes, each kept as 1 (Lua: "
              "x:prod([axes][, {keepdims = false}]))", mk_infer_reduce, REDUCE_PROD),
    {ROW("ReduceVarNode", "nnl", MK_ROLE_REDUCTION, 0, "var", NULL, NULL,
         "variance over the listed axes, sum((x - mean)^2) / (N - correction), correction a "
         "float32 [1] (0: NumPy's default, 1: torch's); each axis kept as 1 (Lua: "
         "x:var([axes][, {correction = 0, keepdims = false}]))"),
     .infer = mk_infer_var, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_REDUCE_VAR},
    REDUCTION_AT("ArgMaxAxisNode", "argmax_axis", "int64 index of the largest element along "
                 "one axis, the first on ties (a NaN wins), the axis kept as 1 (Lua: "
                 "x:argmax(axis[, {keepdims = false}]); x:argmax() is ArgMaxNode)",
                 mk_infer_arg_reduce, ARGMAX_AXIS),
    REDUCTION_AT("ArgMinAxisNode", "argmin", "int64 index of the smallest element along one "
                 "axis, the first on ties (a NaN wins), the axis kept as 1 (Lua: "
                 "x:argmin([axis][, {keepdims = false}]); without an axis the last, kept)",
                 mk_infer_arg_reduce, ARGMIN_AXIS),
    REDUCTION_AT("SoftmaxNode", "softmax", "e^(x - max) / sum(e^(x - max)) along one axis "
                 "(Lua: x:softmax([axis]), the last when left out)", mk_infer_softmax, SOFTMAX),
    REDUCTION_AT("LogSoftmaxNode", "log_softmax", "x - max - log(sum(e^(x - max))) along one "
                 "axis (Lua: x:log_softmax([axis]), the last when left out)", mk_infer_softmax,
                 LOG_SOFTMAX),
    {ROW("LayerNormNode", "nnnni", MK_ROLE_REDUCTION, 0, "layer_norm", NULL, NULL,
         "(x - mean) / sqrt(var + eps) * weight + bias over x's last k axes (var: the mean "
         "square deviation); weight and bias of those axes' shape or [1], eps float32 [1] "
         "(Lua: x:layer_norm([k][, {weight =, bias =, eps = 1e-5}]), k 1 when left out)"),
     .infer = mk_infer_layer_norm, .kernel = MK_KERNEL_LAYER_NORM},
    {ROW("GroupNormNode", "nnnni", MK_ROLE_REDUCTION, 0, "group_norm", NULL, NULL,
         "x [N, C, ...] normalized per sample over each of `groups` groups of C / groups "
         "channels, as layer_norm, then weight [C] * . + bias [C] (or [1]) (Lua: "
         "x:group_norm(groups[, {weight =, bias =, eps = 1e-5}]))"),
     .infer = mk_infer_group_norm, .kernel = MK_KERNEL_GROUP_NORM},
    {ROW("BatchNormNode", "nnnnnn", MK_ROLE_REDUCTION, 0, "batch_norm", NULL, NULL,
         "inference batch norm of x [N, C, ...] over channel axis 1: (x - mean) / sqrt(var + "
         "eps) * weight + bias, each [C] (or [1]) (Lua: x:batch_norm(mean, var[, {weight =, "
         "bias =, eps = 1e-5}]))"),
     .infer = mk_infer_batch_norm, .kernel = MK_KERNEL_BATCH_NORM},
    {ROW("RmsNormEpsNode", "nnn", MK_ROLE_REDUCTION, 0, "rms_norm_eps", NULL, NULL,
         "w * x / sqrt(mean(x^2) + eps) over the last axis, eps float32 [1] (Lua: "
         "x:rms_norm(w, eps); x:rms_norm(w) is RmsNormNode, eps 1e-5)"),
     .infer = mk_infer_rms_norm_eps, .kernel = MK_KERNEL_RMS_NORM_EPS},
    /* made by the row-group pass (group_rows.c) */
    {ROW("RowsGroupNode", "s", MK_ROLE_GROUP, MK_OP_INTERNAL, NULL, NULL, NULL,
         "a row reduction with the pointwise nodes before and after it, as one loop"),
     .infer = mk_infer_internal, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_ROWS_GROUP},

    {ROW("SliceNode", "nii", MK_ROLE_VIEW, 0, "slice", NULL, NULL,
         "rows [begin, end) of the first axis"),
     .infer = mk_infer_slice, .layout = mk_layout_slice},
    {ROW("ReshapeNode", "nl", MK_ROLE_VIEW, 0, "reshape", NULL, NULL,
         "the same elements in a new shape"),
     .infer = mk_infer_reshape, .layout = mk_layout_reshape},
    {ROW("PermuteNode", "nl", MK_ROLE_MOVE, 0, "permute", NULL, NULL, "axes reordered"),
     .infer = mk_infer_permute, .layout = mk_layout_permute, .kernel = MK_KERNEL_PERMUTE},
    {ROW("ReplaceSliceNode", "nnrr", MK_ROLE_INPLACE, 0, "replace", NULL, NULL,
         "writes r into rows [begin, end) of x in place and returns x"),
     .infer = mk_infer_replace_slice, .layout = mk_layout_same, .kernel = MK_KERNEL_REPLACE_SLICE},
    {ROW("ReplaceAtNode", "nnni", MK_ROLE_INPLACE, 0, "replace_at", NULL, NULL,
         "writes r into x in place at one position of axis for each entry i of x's first axis, "
         "x[i, .., index[i], ..] = r[i, ..], and returns x: r is x's shape without axis "
         "(axis >= 1), index int64 [x's first dim] (a batch's cache rows, each sequence at its "
         "own position)"),
     .infer = mk_infer_replace_at, .layout = mk_layout_same, .kernel = MK_KERNEL_REPLACE_AT},
    {ROW("CastNode", "nd", MK_ROLE_MOVE, 0, "cast", NULL, NULL,
         "x converted to dtype (floats round to nearest even; to integers toward zero, "
         "saturated)"),
     .infer = mk_infer_cast, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_CAST},
    {ROW("DequantizeNode", "nn", MK_ROLE_MOVE, 0, "dequantize", NULL, NULL,
         "float32 q * scale: int8 q, float32 scale with one value per block of q (each of its "
         "dims divides q's)"),
     .infer = mk_infer_dequantize, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_DEQUANTIZE},
    {ROW("FakeQuantizeNode", "ni", MK_ROLE_REDUCTION, 0, "fake_quantize", NULL, NULL,
         "x on the int8 grid of its groups of g along the last axis: s = max|x| / 127 per "
         "group, s * round(x / s), halves away from zero (runq.c's activations; 0 where s is 0)"),
     .infer = mk_infer_fake_quantize, .kernel = MK_KERNEL_FAKE_QUANTIZE},
    {ROW("EmbeddingNode", "nn", MK_ROLE_MOVE, MK_OP_FUNCTION, "embedding", NULL, NULL,
         "rows of table [V, D] picked by int64 ids [n]"),
     .infer = mk_infer_embedding, .kernel = MK_KERNEL_EMBEDDING},

    /* ---- shape and data movement ---- */
    /* rules and layouts in ops_shape.c; axes negative from the end; the rows
     * with a layout and the PERMUTE kernel are views where their readers take
     * the strides, else strided copies */
    {ROW("SliceAxisNode", "niiii", MK_ROLE_MOVE, 0, "slice_axis", NULL, NULL,
         "x[begin:end:step] along axis, as Python slices (bounds negative from the end, "
         "clamped; step positive): a strided view where its readers take one"),
     .infer = mk_infer_slice_axis, .layout = mk_layout_slice_axis, .takes_strided = mk_any_strides,
     .kernel = MK_KERNEL_PERMUTE},
    {ROW("SqueezeNode", "ni", MK_ROLE_VIEW, 0, "squeeze", NULL, NULL,
         "x without axis, which must be 1 (a view)"),
     .infer = mk_infer_squeeze, .layout = mk_layout_dense},
    {ROW("UnsqueezeNode", "ni", MK_ROLE_VIEW, 0, "unsqueeze", NULL, NULL,
         "x with a new axis of 1 at axis of the result (a view)"),
     .infer = mk_infer_unsqueeze, .layout = mk_layout_dense},
    {ROW("FlattenNode", "nii", MK_ROLE_VIEW, 0, "flatten", NULL, NULL,
         "axes start to end of x (both included) as one (a view)"),
     .infer = mk_infer_flatten, .layout = mk_layout_dense},
    {ROW("ExpandNode", "nl", MK_ROLE_MOVE, 0, "expand", NULL, NULL,
         "x broadcast to shape as NumPy's (-1 keeps x's dim): a view with stride 0 where its "
         "readers take one"),
     .infer = mk_infer_expand, .layout = mk_layout_expand, .takes_strided = mk_any_strides,
     .kernel = MK_KERNEL_PERMUTE},
    {ROW("FlipNode", "ni", MK_ROLE_MOVE, 0, "flip", NULL, NULL, "x reversed along axis"),
     .infer = mk_infer_flip, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_FLIP},
    {ROW("ConcatNode", "nni", MK_ROLE_MOVE, 0, "concat", NULL, NULL,
         "a then b along axis (same dtype, equal dims but that axis)"),
     .infer = mk_infer_concat, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_CONCAT},
    {ROW("PadNode", "nniiii", MK_ROLE_MOVE, 0, "pad_axis", NULL, NULL,
         "x with before and after elements added along axis: mode 0 the value (float32 [1], "
         "converted to x's dtype), 1 reflect (numpy's), 2 edge"),
     .infer = mk_infer_pad, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_PAD},
    {ROW("TileNode", "nl", MK_ROLE_MOVE, 0, "tile", NULL, NULL,
         "numpy.tile: x repeated reps times along each axis"),
     .infer = mk_infer_tile, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_TILE},
    {ROW("RepeatInterleaveNode", "nii", MK_ROLE_MOVE, 0, "repeat_interleave", NULL, NULL,
         "each index of axis repeated `repeats` times in place (torch.repeat_interleave)"),
     .infer = mk_infer_repeat_interleave, .takes_strided = mk_any_strides,
     .kernel = MK_KERNEL_REPEAT_INTERLEAVE},
    {ROW("GatherElementsNode", "nni", MK_ROLE_MOVE, 0, "gather", NULL, NULL,
         "torch.gather / ONNX GatherElements: out[i] = x[i with axis' index = index[i]], "
         "int64 index (negative from the end) of x's rank"),
     .infer = mk_infer_gather_elements, .takes_strided = mk_any_strides,
     .kernel = MK_KERNEL_GATHER_ELEMENTS},
    {ROW("IndexSelectNode", "nni", MK_ROLE_MOVE, 0, "index_select", NULL, NULL,
         "ONNX Gather: x's axis replaced by int64 index's dims (negative from the end)"),
     .infer = mk_infer_index_select, .takes_strided = mk_any_strides,
     .kernel = MK_KERNEL_INDEX_SELECT},
    {ROW("CumsumNode", "ni", MK_ROLE_REDUCTION, 0, "cumsum", NULL, NULL,
         "running sums along axis, in order (float32, int64)"),
     .infer = mk_infer_cumsum, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_CUMSUM},
    /* ---- convolution and pooling ---- */
    /* PyTorch's definitions for NCL / NCHW float32 tensors; the shape rules are
     * in ops_conv.c, the attribute order in conv.h. A bias is a SumNode of a
     * [O, 1(, 1)] view after the product (the Lua methods' `bias` option). */
    {ROW("Conv1dNode", "nniiii", MK_ROLE_MATMUL, 0, "conv1d", NULL, NULL,
         "1-D cross-correlation of x [N, C, L] with w [O, C/groups, K]: stride, padding, "
         "dilation, groups"),
     .infer = mk_infer_conv, .scratch = mk_conv_scratch, .kernel = MK_KERNEL_CONV},
    {ROW("Conv2dNode", "nniiiiiii", MK_ROLE_MATMUL, 0, "conv2d", NULL, NULL,
         "2-D cross-correlation of x [N, C, H, W] with w [O, C/groups, kH, kW]: stride (h, w), "
         "padding (h, w), dilation (h, w), groups"),
     .infer = mk_infer_conv, .scratch = mk_conv_scratch, .kernel = MK_KERNEL_CONV},
    {ROW("ConvTranspose2dNode", "nniiiiiiiii", MK_ROLE_MATMUL, 0, "conv_transpose2d", NULL,
         NULL,
         "transposed 2-D convolution of x [N, C, H, W] with w [C, O/groups, kH, kW]: stride "
         "(h, w), padding (h, w), output padding (h, w), dilation (h, w), groups"),
     .infer = mk_infer_conv_transpose, .scratch = mk_conv_transpose_scratch,
     .kernel = MK_KERNEL_CONV_TRANSPOSE},
    {ROW("MaxPool2dNode", "niiiiiiii", MK_ROLE_REDUCTION, 0, "max_pool2d", NULL, NULL,
         "the largest element of each window of x [N, C, H, W]: kernel (h, w), stride (h, w), "
         "padding (h, w; at most half the kernel), dilation (h, w); floor rule"),
     .infer = mk_infer_pool, .kernel = MK_KERNEL_MAX_POOL},
    {ROW("AvgPool2dNode", "niiiiii", MK_ROLE_REDUCTION, 0, "avg_pool2d", NULL, NULL,
         "the mean of each window of x [N, C, H, W], padding counted (kernel (h, w), stride "
         "(h, w), padding (h, w; at most half the kernel)); floor rule"),
     .infer = mk_infer_pool, .kernel = MK_KERNEL_AVG_POOL},
    {ROW("AdaptiveAvgPool2dNode", "nii", MK_ROLE_REDUCTION, 0, "adaptive_avg_pool2d", NULL,
         NULL,
         "x [N, C, H, W] averaged into [N, C, oh, ow]: cell (i, j) over rows "
         "[floor(i H / oh), ceil((i + 1) H / oh)) and the columns alike; (1, 1) is global "
         "pooling"),
     .infer = mk_infer_resize, .kernel = MK_KERNEL_ADAPTIVE_AVG_POOL},
    {ROW("UpsampleNearest2dNode", "nii", MK_ROLE_MOVE, 0, "upsample_nearest2d", NULL, NULL,
         "x [N, C, H, W] resized to [N, C, oh, ow] by nearest neighbour: element (i, j) is x's "
         "(floor(i H / oh), floor(j W / ow))"),
     .infer = mk_infer_resize, .kernel = MK_KERNEL_UPSAMPLE_NEAREST},
    /* made by the convolution-group pass (group_conv.c) */
    {ROW("ConvGroupNode", "s", MK_ROLE_GROUP, MK_OP_INTERNAL, NULL, NULL, NULL,
         "a convolution with its bias, batch norm (folded into the weights), residual add and "
         "ReLU, as one launch"),
     .infer = mk_infer_internal, .scratch = mk_group_scratch, .kernel = MK_KERNEL_CONV_GROUP},

    /* made by the cuDNN fusion pass (fusion.c), never parsed: its name field
     * describes the group */
    /* made by the grouping pass (group.c): a pointwise tree as one program */
    {ROW("PointwiseGroupNode", "s", MK_ROLE_GROUP, MK_OP_INTERNAL, NULL, NULL, NULL,
         "several pointwise nodes run as one program"),
     .infer = mk_infer_internal, .takes_strided = mk_any_strides, .kernel = MK_KERNEL_POINTWISE},
    /* made by the matrix–vector pass (product.c): products with their prologue
     * and epilogues as one node, and a view standing for each of its results */
    {ROW("ProductGroupNode", "s", MK_ROLE_GROUP, MK_OP_INTERNAL, NULL, NULL, NULL,
         "matrix-vector products with the nodes before and after them, as one"),
     .infer = mk_infer_internal, .takes_strided = mk_any_strides, .scratch = mk_group_scratch,
     .kernel = MK_KERNEL_PRODUCT},
    {ROW("GroupOutputNode", "s", MK_ROLE_VIEW, MK_OP_INTERNAL, NULL, NULL, NULL,
         "a result of a group: a view of the memory the group wrote"),
     .infer = mk_infer_internal, .takes_strided = mk_any_strides},
    {ROW("CudnnGroupNode", "s", MK_ROLE_GROUP, MK_OP_INTERNAL, NULL, NULL, NULL,
         "a cuDNN graph of several nodes"),
     .infer = mk_infer_internal, .takes_strided = mk_any_strides, .scratch = mk_group_scratch,
     .kernel = MK_KERNEL_CUDNN_GROUP},
};
#define N_OPS (sizeof ops / sizeof ops[0])

const mk_op *mk_op_find(const char *name, size_t len) {
    for (size_t i = 0; i < N_OPS; i++) {
        const mk_op *op = &ops[i];
        if ((strlen(op->name) == len && !memcmp(op->name, name, len)) ||
            (op->alias && strlen(op->alias) == len && !memcmp(op->alias, name, len)))
            return op;
    }
    return NULL;
}

const mk_op *mk_op_internal(mk_kernel_id kernel) {
    for (size_t i = 0; i < N_OPS; i++)
        if (ops[i].kernel == kernel && (ops[i].flags & MK_OP_INTERNAL)) return &ops[i];
    return NULL;
}

mk_storage mk_op_leaf_storage(const mk_op *op) {
    switch (op->leaf) {
    case MK_LEAF_CONSTANT: return MK_STORAGE_CONSTANT;
    case MK_LEAF_BUFFER: return MK_STORAGE_BUFFER;
    default: return MK_STORAGE_ARENA; /* inputs: a slot the planner places */
    }
}

bool mk_op_operand_is_bound(const mk_op *op, int k) {
    int seen = 0;
    for (const char *c = op->signature; *c; c++)
        if (*c == 'n' || *c == 'r') {
            if (seen == k) return *c == 'r';
            seen++;
        }
    return false;
}

/* ---- expressions, compiled once per process -------------------------------------- */

static mk_expr programs[N_OPS];
static bool program_ok[N_OPS];
static pthread_once_t programs_once = PTHREAD_ONCE_INIT;

static void compile_programs(void) {
    for (size_t i = 0; i < N_OPS; i++) {
        mk_error *err = NULL;
        program_ok[i] = ops[i].expr && mk_expr_compile(ops[i].expr, &programs[i], &err) == 0;
        mk_error_free(err); /* a row that fails is a bug the op tests catch */
    }
}

const mk_expr *mk_op_program(const mk_op *op) {
    if (!op || op < ops || op >= ops + N_OPS || !op->expr) return NULL;
    pthread_once(&programs_once, compile_programs);
    return program_ok[op - ops] ? &programs[op - ops] : NULL;
}

/* ---- the public view of the table -------------------------------------------------- */

MK_API size_t mk_op_count(void) { return N_OPS; }

static mk_op_desc descs[N_OPS];
static pthread_once_t descs_once = PTHREAD_ONCE_INIT;

static void fill_descs(void) {
    for (size_t i = 0; i < N_OPS; i++) {
        const mk_op *op = &ops[i];
        descs[i] = (mk_op_desc){op->name,  op->alias,  op->signature, op->role, op->leaf,
                                op->flags, op->method, op->infix,     op->expr, op->summary};
    }
}

MK_API const mk_op_desc *mk_op_info(size_t i) {
    if (i >= N_OPS) return NULL;
    pthread_once(&descs_once, fill_descs);
    return &descs[i];
}

MK_API const char *mk_op_role_name(mk_op_role role) {
    static const char *const names[] = {
        [MK_ROLE_LEAF] = "leaf",           [MK_ROLE_POINTWISE] = "pointwise",
        [MK_ROLE_REDUCTION] = "reduction", [MK_ROLE_MATMUL] = "matmul",
        [MK_ROLE_VIEW] = "view",           [MK_ROLE_INPLACE] = "inplace",
        [MK_ROLE_MOVE] = "move",           [MK_ROLE_GROUP] = "group",
    };
    return (unsigned)role < sizeof names / sizeof names[0] ? names[role] : NULL;
}

MK_API const char *mk_leaf_kind_name(mk_leaf_kind kind) {
    static const char *const names[] = {
        [MK_LEAF_INPUT] = "input", [MK_LEAF_CONSTANT] = "constant", [MK_LEAF_BUFFER] = "buffer"};
    return (unsigned)kind < sizeof names / sizeof names[0] ? names[kind] : NULL;
}

int mk_node_infer(mk_node *n, mk_error **err) {
    if (n->op->infer(n, err)) return -1;
    /* results larger than their operands (a product, a gather) are bounded too */
    if (!mk_shape_numel(n->rank, n->shape))
        return FAIL(err, n, MK_ERR_SHAPE, "%s: the result %s has more than 2^48 elements",
                    n->op->name, SHAPE(n));
    return 0;
}

/* ---- the front ends' entry: one op checked outside a script ---------------- */

static int count_letters(const char *sig, const char *letters) {
    int k = 0;
    for (; *sig; sig++) k += strchr(letters, *sig) != NULL;
    return k;
}

MK_API int mk_op_infer(const char *name, const mk_tensor_info *inputs, size_t n_inputs,
                       const int64_t *attrs, size_t n_attrs, mk_tensor_info *out,
                       mk_error **err) {
    if (!name || !out || (n_inputs && !inputs) || (n_attrs && !attrs))
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_op_infer: NULL argument");
    const mk_op *op = mk_op_find(name, strlen(name));
    if (!op) return mk_fail(err, MK_ERR_NAME, 0, 0, "unknown node '%s'", name);
    if (op->role == MK_ROLE_LEAF || (op->flags & MK_OP_INTERNAL))
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_op_infer: %s is not built from operands",
                       name);
    int want_in = count_letters(op->signature, "nr");
    int want_i = count_letters(op->signature, "i");
    bool list = count_letters(op->signature, "l") > 0;
    if ((int)n_inputs != want_in)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "%s takes %d operands, got %zu", name, want_in,
                       n_inputs);
    if (list ? (n_attrs < 1 || n_attrs > MK_MAX_RANK) : (int)n_attrs != want_i)
        return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: %zu integer arguments (%s %d)", name,
                       n_attrs, list ? "a list of 1 to" : "needs",
                       list ? MK_MAX_RANK : want_i);

    mk_node operands[MK_MAX_INPUTS];
    mk_node n = {.op = op, .n_in = (int)n_inputs, .n_attr = (int)n_attrs};
    for (size_t i = 0; i < n_inputs; i++) {
        const mk_tensor_info *t = &inputs[i];
        mk_node *x = &operands[i];
        /* named as the front end names it; no statement: messages say "operand i" */
        *x = (mk_node){.name = (char *)t->name, .dtype = t->dtype, .rank = t->rank};
        if (t->rank < 1 || t->rank > MK_MAX_RANK || !mk_dtype_row_of(t->dtype) ||
            !mk_shape_numel(t->rank, t->shape))
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "%s: operand %zu is not a valid tensor",
                           name, i + 1);
        memcpy(x->shape, t->shape, sizeof x->shape);
        /* a value is only read for bounds: int64 [1] */
        if (t->value && mk_op_operand_is_bound(op, (int)i) && t->dtype == MK_DTYPE_INT64 &&
            t->rank == 1 && t->shape[0] == 1)
            x->value = t->value;
        n.in[i] = x;
    }
    if (n_attrs) memcpy(n.attr, attrs, sizeof(int64_t) * n_attrs);
    if (strchr(op->signature, 'd')) n.dtype = out->dtype; /* the dtype argument */
    if (mk_node_infer(&n, err)) return -1;
    *out = (mk_tensor_info){.name = NULL, .dtype = n.dtype, .rank = n.rank};
    memcpy(out->shape, n.shape, sizeof out->shape);
    return 0;
}
