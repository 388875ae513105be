/*
 * script_errors_test.c — bad input to the script compiler and the C API:
 * every class of bad script gives an error with the right kind, line and
 * column, leaving the context usable; misused compile and evaluate calls
 * (missing, doubled or unknown tensors, short outputs) fail with their
 * messages and the model runs afterwards; a NUL byte inside a script's length
 * is a syntax error at its line and column (mk_script_check_bytes).
 */
#include "moonkaas.h"
#include "test.h"

static mk_context *ctx;

/* A bad script: the error's code, position and a fragment of its message. */
typedef struct {
    const char *script;
    mk_error_code code;
    int line, column;
    const char *fragment;
} bad_case;

#define X1 "$1 = InputTensor(x, float32, [2, 3]);\n"
#define XP X1 "$2 = InputTensor(p, int64, [1]);\n$3 = ReLUNode($1);\n"
static const bad_case bad[] = {
    /* sizes that would overflow an element count or a byte size (found by trying them:
     * before, these compiled with tiny storage and crashed at evaluate) */
    {"$1 = BufferTensor(float32, [2147483648, 2147483648]);\n$2 = ReLUNode($1);\nresult = $2;\n",
     MK_ERR_SHAPE, 1, 1, "BufferTensor: [2147483648, 2147483648] has more than 2^48 elements"},
    {"$1 = InputTensor(x, float32, [16]);\n$2 = ReshapeNode($1, [1152921504606846977, 16]);\n"
     "$3 = SliceNode($2, 0, 1);\nresult = $3;\n",
     MK_ERR_SHAPE, 2, 1, "ReshapeNode: [1152921504606846977, 16] has more than 2^48 elements"},
    {"$1 = InputTensor(x, float32, [16]);\n$2 = ReshapeNode($1, [1099511627776, 1099511627776]);\n"
     "result = $2;\n",
     MK_ERR_SHAPE, 2, 1, "has more than 2^48 elements"},
    {"$1 = InputTensor(a, float32, [16777216, 1]);\n$2 = InputTensor(b, float32, [1, 16777217]);\n"
     "$3 = MatMulNode($1, $2);\nresult = $3;\n",
     MK_ERR_SHAPE, 3, 1, "MatMulNode: the result [16777216, 16777217] has more than 2^48 elements"},
    /* syntax */
    {X1 "$2 = ReLUNode($1)\nresult = $2;", MK_ERR_SYNTAX, 3, 1, "expected ';'"},
    {X1 "$2 = ReLUNode($1;\nresult = $2;", MK_ERR_SYNTAX, 2, 17, "expected ','"},
    {X1 "$2 ReLUNode($1);\nresult = $2;", MK_ERR_SYNTAX, 2, 4, "expected '='"},
    {X1 "$2 = ReLUNode($1);\n", MK_ERR_SYNTAX, 3, 1, "'result = $N;'"},
    {"", MK_ERR_SYNTAX, 1, 1, "the end of the script"},
    {X1 "result = $1;\n$2 = ReLUNode($1);", MK_ERR_SYNTAX, 3, 1,
     "nothing but 'next' lines may follow the result line"},
    /* several outputs, and the next lines of a recurrence */
    {X1 "result = $1, ;", MK_ERR_SYNTAX, 2, 14, "expected 'result = $N;'"},
    {X1 "result = $1, $9;", MK_ERR_NAME, 2, 14, "$9 is not defined"},
    {XP "result = $3, $2;\nnext y = $3;", MK_ERR_NAME, 5, 6, "'y' is not an input"},
    {XP "result = $3, $2;\nnext x = $1;", MK_ERR_NAME, 5, 10, "$1 is not an output"},
    {XP "result = $3, $2;\nnext p = $3;", MK_ERR_DTYPE, 5, 10, "$3 is float32, input 'p' is int64"},
    {XP "result = $3;\nnext x = x + 1;", MK_ERR_DTYPE, 5, 6, "a counter is int64"},
    {XP "result = $3;\nnext p = x + 1;", MK_ERR_SYNTAX, 5, 10, "adds to its own value"},
    {XP "result = $3;\nnext p = p -1;", MK_ERR_SYNTAX, 5, 12, "expected '+'"},
    {XP "result = $3;\nnext p = p + 1;\nnext p = p + 2;", MK_ERR_NAME, 6, 6,
     "input 'p' already has a next line (line 5)"},
    {XP "result = $3;\nnext p = p + 1", MK_ERR_SYNTAX, 5, 15, "expected ';'"},
    {XP "result = $3;\nnext p = p + 1;\n$4 = ReLUNode($1);", MK_ERR_SYNTAX, 6, 1,
     "nothing but 'next' lines"},
    {XP "$4 = InputTensor(h, float32, [3]);\nresult = $3;\nnext h = $3;", MK_ERR_SHAPE, 6, 10,
     "$3 has shape [2, 3], input 'h' has [3]"},
    {X1 "$2 = ReLUNode($1) @;\nresult = $2;", MK_ERR_SYNTAX, 2, 19, "unexpected character '@'"},
    {X1 "$ = ReLUNode($1);\nresult = $2;", MK_ERR_SYNTAX, 2, 1, "node number after '$'"},
    {X1 "$0 = ReLUNode($1);\nresult = $0;", MK_ERR_SYNTAX, 2, 1, "positive"},
    {"$1 = InputTensor(x, float32, [2, 3x]);\nresult = $1;", MK_ERR_SYNTAX, 1, 34, "malformed"},
    {"$1 = InputTensor(x, float32, [2, y]);\nresult = $1;", MK_ERR_SYNTAX, 1, 34,
     "expected an integer"},
    {"$1 = InputTensor(x, float32, [99999999999999999999]);\nresult = $1;", MK_ERR_SYNTAX, 1, 31,
     "too large"},
    /* unknown op, undefined and forward references, duplicates */
    {X1 "$2 = FooNode($1);\nresult = $2;", MK_ERR_NAME, 2, 6, "unknown node 'FooNode'"},
    {X1 "$2 = ReLUNode($5);\nresult = $2;", MK_ERR_NAME, 2, 15, "$5 is used before"},
    {X1 "$2 = SumNode($1, $3);\n$3 = ReLUNode($1);\nresult = $2;", MK_ERR_NAME, 2, 18,
     "$3 is used before"},
    {X1 "$2 = ReLUNode($2);\nresult = $2;", MK_ERR_NAME, 2, 15, "$2 is used before"},
    {X1 "$1 = ReLUNode($1);\nresult = $1;", MK_ERR_NAME, 2, 1, "defined twice"},
    {X1 "result = $9;", MK_ERR_NAME, 2, 10, "$9 is not defined"},
    {X1 "$2 = InputTensor(x, float32, [2, 3]);\nresult = $2;", MK_ERR_NAME, 2, 1,
     "the name 'x' is used twice"},
    {X1 "$2 = ConstantTensor(x, float32, [2, 3]);\nresult = $2;", MK_ERR_NAME, 2, 1,
     "the name 'x' is used twice"},
    /* arity and argument kinds */
    {X1 "$2 = SumNode($1);\nresult = $2;", MK_ERR_ARGUMENT, 2, 16, "takes 2 arguments"},
    {X1 "$2 = ReLUNode($1, $1);\nresult = $2;", MK_ERR_ARGUMENT, 2, 19, "takes 1 arguments"},
    {X1 "$2 = BufferTensor(float32);\nresult = $2;", MK_ERR_ARGUMENT, 2, 26,
     "takes at least 2 arguments (a dtype, an integer list, a name (optional)), found 1"},
    {X1 "$2 = BufferTensor(float32, [2], kv, kv);\nresult = $2;", MK_ERR_ARGUMENT, 2, 37,
     "takes 3 arguments"},
    {X1 "$2 = BufferTensor(float32, [2], x);\nresult = $2;", MK_ERR_NAME, 2, 1,
     "the name 'x' is used twice"},
    {X1 "$2 = SliceNode($1, $1, 2);\nresult = $2;", MK_ERR_ARGUMENT, 2, 20,
     "argument 2 must be an integer"},
    {X1 "$2 = ReshapeNode($1, 6);\nresult = $2;", MK_ERR_ARGUMENT, 2, 22,
     "must be an integer list"},
    {"$1 = InputTensor($2, float32, [2]);\nresult = $1;", MK_ERR_ARGUMENT, 1, 18,
     "must be a name"},
    /* dtypes */
    {"$1 = InputTensor(x, int32, [2, 3]);\nresult = $1;", MK_ERR_DTYPE, 1, 21,
     "unknown dtype 'int32'"},
    {X1 "$2 = InputTensor(y, int64, [2, 3]);\n$3 = SumNode($1, $2);\nresult = $3;", MK_ERR_DTYPE,
     3, 1, "differ in dtype"},
    {"$1 = InputTensor(x, int64, [2, 3]);\n$2 = SiLUNode($1);\nresult = $2;", MK_ERR_DTYPE, 2, 1,
     "does not take int64"},
    {X1 "$2 = InputTensor(p, float32, [1]);\n$3 = SlicedSoftmaxNode($1, $2);\nresult = $3;",
     MK_ERR_DTYPE, 3, 1, "prefix ('p') must be int64"},
    {X1 "$2 = InputTensor(i, float32, [2]);\n$3 = EmbeddingNode($1, $2);\nresult = $3;",
     MK_ERR_DTYPE, 3, 1, "ids ('i') must be int64"},
    /* ranks and dims */
    {"$1 = InputTensor(x, float32, []);\nresult = $1;", MK_ERR_SHAPE, 1, 1, "rank 0"},
    {"$1 = InputTensor(x, float32, [1, 2, 3, 4, 5, 6, 7]);\nresult = $1;", MK_ERR_SHAPE, 1, 49,
     "more than 6"},
    {"$1 = InputTensor(x, float32, [2, 0]);\nresult = $1;", MK_ERR_SHAPE, 1, 1,
     "dimension 1 is 0"},
    {"$1 = BufferTensor(float32, [-2]);\nresult = $1;", MK_ERR_SHAPE, 1, 1,
     "dimension 0 is -2"},
    /* shape rules */
    {X1 "$2 = InputTensor(y, float32, [3, 2]);\n$3 = SumNode($1, $2);\nresult = $3;",
     MK_ERR_SHAPE, 3, 1, "does not broadcast"},
    {X1 "$2 = InputTensor(y, float32, [2]);\n$3 = SumNode($1, $2);\nresult = $3;", MK_ERR_SHAPE,
     3, 1, "[2, 3] does not broadcast with [2] (dims aligned from the last"},
    {X1 "$2 = MatMulNode($1, $1);\nresult = $2;", MK_ERR_SHAPE, 2, 1, "cannot multiply [2, 3] by [2, 3]"},
    {X1 "$2 = SliceNode($1, 1, 5);\nresult = $2;", MK_ERR_SHAPE, 2, 1, "rows [1, 5)"},
    {X1 "$2 = SliceNode($1, 1, 1);\nresult = $2;", MK_ERR_SHAPE, 2, 1, "rows [1, 1)"},
    {X1 "$2 = ReshapeNode($1, [4, 2]);\nresult = $2;", MK_ERR_SHAPE, 2, 1, "6 elements"},
    {X1 "$2 = PermuteNode($1, [0, 0]);\nresult = $2;", MK_ERR_SHAPE, 2, 1, "not a permutation"},
    {X1 "$2 = PermuteNode($1, [0, 1, 2]);\nresult = $2;", MK_ERR_SHAPE, 2, 1, "not a permutation"},
    {X1 "$2 = ConstantTensor(w, float32, [2]);\n$3 = RmsNormNode($1, $2);\nresult = $3;",
     MK_ERR_SHAPE, 3, 1, "must be [3]"},
    {X1 "$2 = ComplexHadamardProductNode($1, $1);\nresult = $2;", MK_ERR_SHAPE, 2, 1,
     "must be 2"},
    {X1 "$2 = InputTensor(b, int64, [2]);\n$3 = ReplaceSliceNode($1, $1, $2, $2);\nresult = $3;",
     MK_ERR_SHAPE, 3, 1, "begin ('b') must have shape [1]"},
    {X1 "$2 = InputTensor(b, int64, [1]);\n$3 = InputTensor(r, float32, [3, 3]);\n"
        "$4 = ReplaceSliceNode($1, $3, $2, $2);\nresult = $4;",
     MK_ERR_SHAPE, 4, 1, "does not fit"},
    {X1 "$2 = InputTensor(i, int64, [2, 1]);\n$3 = EmbeddingNode($1, $2);\nresult = $3;",
     MK_ERR_SHAPE, 3, 1, "ids must be [n]"},
    /* the pointwise ops added with the expression evaluator */
    {X1 "$2 = SubNode($1);\nresult = $2;", MK_ERR_ARGUMENT, 2, 16, "takes 2 arguments"},
    {X1 "$2 = DivNode($1, $1, $1);\nresult = $2;", MK_ERR_ARGUMENT, 2, 22, "takes 2 arguments"},
    {X1 "$2 = ExpNode();\nresult = $2;", MK_ERR_ARGUMENT, 2, 14, "takes 1 arguments"},
    {X1 "$2 = TanhNode($1, $1);\nresult = $2;", MK_ERR_ARGUMENT, 2, 19, "takes 1 arguments"},
    {X1 "$2 = SigmoidNode(2);\nresult = $2;", MK_ERR_ARGUMENT, 2, 18, "must be a node"},
    {X1 "$2 = GELUNode($1, $1);\nresult = $2;", MK_ERR_ARGUMENT, 2, 19, "takes 1 arguments"},
    {X1 "$2 = SubtractNode($1, $1);\nresult = $2;", MK_ERR_NAME, 2, 6,
     "unknown node 'SubtractNode'"},
    {X1 "$2 = DivNode($1, $7);\nresult = $2;", MK_ERR_NAME, 2, 18, "$7 is used before"},
    {"$1 = InputTensor(x, int64, [2, 3]);\n$2 = DivNode($1, $1);\nresult = $2;", MK_ERR_DTYPE,
     2, 1, "dtype error: DivNode does not take int64 ('x')"},
    {"$1 = InputTensor(x, int64, [2, 3]);\n$2 = ExpNode($1);\nresult = $2;", MK_ERR_DTYPE, 2, 1,
     "dtype error: ExpNode does not take int64 ('x')"},
    {"$1 = InputTensor(x, int64, [2, 3]);\n$2 = TanhNode($1);\nresult = $2;", MK_ERR_DTYPE, 2,
     1, "dtype error: TanhNode does not take int64 ('x')"},
    {"$1 = InputTensor(x, int64, [2, 3]);\n\n$2 = ReLUNode($1);\n$3 = SigmoidNode($2);\n"
     "result = $3;",
     MK_ERR_DTYPE, 4, 1, "dtype error: SigmoidNode does not take int64 ($2, line 3)"},
    {"$1 = InputTensor(x, int64, [2, 3]);\n$2 = GELUNode($1);\nresult = $2;", MK_ERR_DTYPE, 2,
     1, "dtype error: GELUNode does not take int64 ('x')"},
    {X1 "$2 = InputTensor(y, int64, [2, 3]);\n$3 = SubNode($1, $2);\nresult = $3;", MK_ERR_DTYPE,
     3, 1, "differ in dtype"},
    {X1 "$2 = InputTensor(y, float32, [3, 2]);\n$3 = SubNode($1, $2);\nresult = $3;",
     MK_ERR_SHAPE, 3, 1, "does not broadcast"},
    {X1 "$2 = InputTensor(y, float32, [2, 3, 1]);\n$3 = DivNode($1, $2);\nresult = $3;",
     MK_ERR_SHAPE, 3, 1, "does not broadcast"},
    {X1 "$2 = InputTensor(y, float32, [3, 1]);\n   $3 = DivNode($2, $1);\nresult = $3;",
     MK_ERR_SHAPE, 3, 4, "[3, 1] does not broadcast with [2, 3]"},
    /* storage dtypes: they parse; a kernel that does not take them fails the compile */
    {"$1 = InputTensor(x, float8, [2]);\nresult = $1;", MK_ERR_DTYPE, 1, 21,
     "unknown dtype 'float8'"},
    {"$1 = InputTensor(x, bf16, [2]);\nresult = $1;", MK_ERR_DTYPE, 1, 21, "unknown dtype 'bf16'"},
    {"$1 = InputTensor(x, bfloat16, [4]);\n$2 = InputTensor(w, bfloat16, [4, 3]);\n"
     "$3 = MatMulNode($1, $2);\nresult = $3;",
     MK_ERR_DTYPE, 3, 1, "dtype error: MatMulNode does not take bfloat16 ('x')"},
    {"$1 = InputTensor(x, int8, [4]);\n$2 = ReLUNode($1);\nresult = $2;", MK_ERR_DTYPE, 2, 1,
     "dtype error: int8 is not supported by ReLUNode on cpu"},
    {"$1 = InputTensor(x, float16, [4, 3]);\n$2 = InputTensor(y, float16, [1, 3]);\n"
     "$3 = SubNode($1, $2);\nresult = $3;",
     MK_ERR_DTYPE, 3, 1, "dtype error: float16 is not supported by SubNode on cpu"},
    {"$1 = InputTensor(x, int8, [4, 3]);\n$2 = InputTensor(y, int8, [4, 3]);\n"
     "$3 = SumNode($1, $2);\nresult = $3;",
     MK_ERR_DTYPE, 3, 1, "dtype error: int8 is not supported by SumNode on cpu"},
    {"$1 = InputTensor(x, bfloat16, [4, 3]);\n$2 = SliceNode($1, 1, 3);\n$3 = GELUNode($2);\n"
     "result = $3;",
     MK_ERR_DTYPE, 3, 1, "dtype error: bfloat16 is not supported by GELUNode on cpu"},
    {"$1 = InputTensor(x, float16, [4, 3]);\n$2 = ArgMaxNode($1);\nresult = $2;", MK_ERR_DTYPE, 2,
     1, "dtype error: float16 is not supported by ArgMaxNode on cpu"},
    {"$1 = InputTensor(x, bfloat16, [4, 3]);\n$2 = InputTensor(w, bfloat16, [3]);\n"
     "$3 = RmsNormNode($1, $2);\nresult = $3;",
     MK_ERR_DTYPE, 3, 1, "dtype error: bfloat16 is not supported by RmsNormNode on cpu"},
    {"$1 = InputTensor(x, bfloat16, [4, 3]);\n$2 = InputTensor(p, int64, [1]);\n"
     "$3 = SlicedSoftmaxNode($1, $2);\nresult = $3;",
     MK_ERR_DTYPE, 3, 1, "dtype error: bfloat16 is not supported by SlicedSoftmaxNode on cpu"},
    /* an integer storage type to a float-only op: refused by the op itself, like int64 */
    {"$1 = InputTensor(x, int8, [4]);\n$2 = ExpNode($1);\nresult = $2;", MK_ERR_DTYPE, 2, 1,
     "dtype error: ExpNode does not take int8 ('x')"},
    {"$1 = InputTensor(x, bfloat16, [4, 3]);\n$2 = InputTensor(y, float32, [4, 3]);\n"
     "$3 = SumNode($1, $2);\nresult = $3;",
     MK_ERR_DTYPE, 3, 1, "operands differ in dtype (bfloat16 and float32)"},
    {"$1 = InputTensor(t, float32, [10, 3]);\n$2 = InputTensor(i, int8, [2]);\n"
     "$3 = EmbeddingNode($1, $2);\nresult = $3;",
     MK_ERR_DTYPE, 3, 1, "ids ('i') must be int64, not int8"},
};

static void test_bad_scripts(void) {
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const bad_case *c = &bad[i];
        mk_error *err = NULL;
        mk_model *m = mk_compile(ctx, c->script, NULL, 0, NULL, &err);
        CHECK(m == NULL && err != NULL, "case %zu compiled", i);
        if (!err) {
            mk_model_free(m);
            continue;
        }
        const char *msg = mk_error_message(err);
        char prefix[64];
        snprintf(prefix, sizeof prefix, "script:%d:%d: ", c->line, c->column);
        CHECK(mk_error_code_of(err) == c->code, "case %zu: code %d, want %d: %s", i,
              mk_error_code_of(err), c->code, msg);
        CHECK(mk_error_line(err) == c->line && mk_error_column(err) == c->column,
              "case %zu: at %d:%d, want %d:%d: %s", i, mk_error_line(err),
              mk_error_column(err), c->line, c->column, msg);
        CHECK(!strncmp(msg, prefix, strlen(prefix)), "case %zu: message '%s' lacks '%s'", i, msg,
              prefix);
        CHECK(strstr(msg, c->fragment) != NULL, "case %zu: message '%s' lacks '%s'", i, msg,
              c->fragment);
        mk_error_free(err);
    }
}

static void test_context_usable_after_errors(void) {
    mk_error *err = NULL;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mk_model *m = mk_compile(ctx, bad[i].script, NULL, 0, NULL, &err);
        mk_model_free(m);
        mk_error_free(err);
        err = NULL;
    }
    const char *ok = "$1 = InputTensor(x, float32, [3]);\n$2 = ReLUNode($1);\nresult = $2;\n";
    mk_model *m = mk_compile(ctx, ok, NULL, 0, NULL, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    float x[3] = {-1.5f, 2.0f, 0.25f}, y[3];
    mk_named_tensor in[] = {{"x", x}};
    CHECK(m && mk_evaluate(m, in, 1, y, sizeof y, &err) == 0 && y[0] == 0 && y[1] == 2.0f &&
              y[2] == 0.25f,
          "relu after errors: %s", mk_error_message(err));
    mk_model_free(m);
    mk_error_free(err);
}

static void test_api_misuse(void) {
    mk_error *err = NULL;
    const char *ok = "$1 = InputTensor(x, float32, [3]);\n$2 = ConstantTensor(c, float32, [3]);\n"
                     "$3 = SumNode($1, $2);\nresult = $3;\n";
    float c[3] = {1, 2, 3}, x[3] = {0.5f, 0.25f, 0.125f}, y[3];
    CHECK(mk_compile(ctx, ok, NULL, 0, NULL, &err) == NULL &&
              strstr(mk_error_message(err), "input error: constant 'c' is not given"),
          "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    mk_named_tensor two[] = {{"c", c}, {"c", c}};
    CHECK(mk_compile(ctx, ok, two, 2, NULL, &err) == NULL &&
              strstr(mk_error_message(err), "given twice"),
          "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    mk_named_tensor extra[] = {{"c", c}, {"d", c}};
    CHECK(mk_compile(ctx, ok, extra, 2, NULL, &err) == NULL &&
              strstr(mk_error_message(err), "'d' is not in the script"),
          "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    CHECK(mk_compile(ctx, NULL, NULL, 0, NULL, &err) == NULL && err, "NULL script");
    mk_error_free(err), err = NULL;
    CHECK(mk_model_reset(NULL, &err) == -1 && mk_error_code_of(err) == MK_ERR_ARGUMENT,
          "reset NULL");
    mk_error_free(err), err = NULL;

    mk_model *m = mk_compile(ctx, ok, two, 1, NULL, &err);
    CHECK(m != NULL, "%s", mk_error_message(err));
    if (!m) return;
    mk_named_tensor in[] = {{"x", x}, {"x", x}}, wrong[] = {{"z", x}};
    CHECK(mk_evaluate(m, in, 0, y, sizeof y, &err) == -1 &&
              strstr(mk_error_message(err), "input 'x' is missing"),
          "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    CHECK(mk_evaluate(m, in, 2, y, sizeof y, &err) == -1 &&
              strstr(mk_error_message(err), "given twice"),
          "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    CHECK(mk_evaluate(m, wrong, 1, y, sizeof y, &err) == -1 &&
              strstr(mk_error_message(err), "'z' is not an input"),
          "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    CHECK(mk_evaluate(m, in, 1, y, 8, &err) == -1 && strstr(mk_error_message(err), "12 bytes"),
          "%s", mk_error_message(err));
    mk_error_free(err), err = NULL;
    CHECK(mk_evaluate(m, in, 1, y, sizeof y, &err) == 0 && y[0] == 1.5f && y[2] == 3.125f,
          "after misuse: %s", mk_error_message(err));
    mk_model_free(m);
    mk_error_free(err);
}

/* A NUL byte inside the length a host holds: a syntax error at its line and
 * column (issue 66: the text after it vanished, a script's next line with it),
 * the position counted here from the definition (lines from 1 after each
 * '\n', columns from 1 in bytes). Nothing before len: 0. */
static void test_nul_bytes(void) {
    static const char script[] = "$1 = InputTensor(pos, int64, [1]);\n$2 = SumNode($1, $1);\n"
                                 "result = $2;\nnext pos = pos + 1;\n";
    size_t n = sizeof script - 1;
    char text[sizeof script + 1];
    mk_error *err = NULL;
    CHECK(mk_script_check_bytes(script, n, &err) == 0 && !err, "%s", mk_error_message(err));
    for (int k = 0; k < 8; k++) {
        size_t at = k == 0 ? 0 : k == 1 ? n : (size_t)test_randint(1, (int64_t)n - 1);
        memcpy(text, script, at);
        text[at] = '\0';
        memcpy(text + at + 1, script + at, n - at);
        int line = 1, column = 1;
        for (size_t i = 0; i < at; i++) {
            if (script[i] == '\n') line++, column = 1;
            else column++;
        }
        CHECK(mk_script_check_bytes(text, n + 1, &err) == -1 &&
                  mk_error_code_of(err) == MK_ERR_SYNTAX && mk_error_line(err) == line &&
                  mk_error_column(err) == column &&
                  strstr(mk_error_message(err), "a NUL byte in the script"),
              "NUL at byte %zu (line %d, column %d): %s", at, line, column, mk_error_message(err));
        mk_error_free(err), err = NULL;
        /* a length that stops before the NUL sees none */
        CHECK(mk_script_check_bytes(text, at, &err) == 0 && !err, "length %zu: %s", at,
              mk_error_message(err));
        mk_error_free(err), err = NULL;
    }
    CHECK(mk_script_check_bytes(NULL, 4, &err) == -1 && mk_error_code_of(err) == MK_ERR_ARGUMENT,
          "NULL script: %s", mk_error_message(err));
    mk_error_free(err);
}

int main(void) {
    mk_error *err = NULL;
    ctx = mk_context_new(&err);
    test_srand(test_seed());
    RUN(test_bad_scripts);
    RUN(test_context_usable_after_errors);
    RUN(test_api_misuse);
    RUN(test_nul_bytes);
    mk_context_free(ctx);
    return test_summary("script_errors");
}
