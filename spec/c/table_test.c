/*
 * table_test.c — the tables front ends read through the public API: the op
 * table (mk_op_count, mk_op_info), the dtype table (mk_dtype_*), a script's
 * constants without compiling (mk_script_constants), and mk_op_infer with a
 * known value for an `r` operand.
 *
 * The op table is checked for consistency row by row (every name reachable,
 * every flag where it makes sense); table_exprs_test.c runs every pointwise
 * row's `expr`.
 *
 *   make build/tests/table_test && ./build/tests/table_test
 */
#include "table.h"

#include <ctype.h>

/* ---- helpers -------------------------------------------------------------- */

static const mk_op_desc *find_op(const char *name) {
    for (size_t i = 0; i < mk_op_count(); i++) {
        const mk_op_desc *d = mk_op_info(i);
        if (d && !strcmp(d->name, name))
            return d;
    }
    return NULL;
}

/* ---- the dtype table ------------------------------------------------------ */

static void test_dtype_table(void) {
    const struct {
        mk_dtype dt;
        const char *name;
        size_t size;
        bool is_float;
    } want[] = {
        {MK_DTYPE_FLOAT32, "float32", 4, true},   {MK_DTYPE_INT64, "int64", 8, false},
        {MK_DTYPE_FLOAT16, "float16", 2, true},   {MK_DTYPE_BFLOAT16, "bfloat16", 2, true},
        {MK_DTYPE_INT8, "int8", 1, false},        {MK_DTYPE_BOOL, "bool", 1, false},
    };
    CHECK(MK_DTYPE_COUNT == sizeof want / sizeof want[0], "MK_DTYPE_COUNT %d", MK_DTYPE_COUNT);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        mk_dtype d = want[i].dt;
        CHECK(mk_dtype_size(d) == want[i].size, "%s: size %zu", want[i].name, mk_dtype_size(d));
        CHECK(!strcmp(mk_dtype_name(d), want[i].name), "dtype %d: name '%s'", (int)d,
              mk_dtype_name(d));
        CHECK(mk_dtype_is_float(d) == want[i].is_float, "%s: is_float", want[i].name);
    }
    /* every dtype round-trips through its name */
    for (int d = 0; d < MK_DTYPE_COUNT; d++) {
        const char *name = mk_dtype_name((mk_dtype)d);
        mk_dtype back = (mk_dtype)-1;
        CHECK(mk_dtype_parse(name, strlen(name), &back) == 0 && back == (mk_dtype)d,
              "'%s' parses to %d, want %d", name, (int)back, d);
        /* the length bounds the name: "int64garbage" with len 5 is int64 */
        char longer[64];
        snprintf(longer, sizeof longer, "%sgarbage", name);
        back = (mk_dtype)-1;
        CHECK(mk_dtype_parse(longer, strlen(name), &back) == 0 && back == (mk_dtype)d,
              "'%s' (len %zu) parses to %d", longer, strlen(name), (int)back);
        /* a prefix of a name is not the name */
        CHECK(mk_dtype_parse(name, strlen(name) - 1, &back) == -1 ||
                  strlen(mk_dtype_name(back)) == strlen(name) - 1,
              "a prefix of '%s' parses", name);
    }
    const char *unknown[] = {"int32", "float", "float64", "bf16", "fp16", "Float32", "int8 ",
                             "uint8", "", "float32x", "?"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        mk_dtype out = MK_DTYPE_INT8;
        CHECK(mk_dtype_parse(unknown[i], strlen(unknown[i]), &out) == -1, "'%s' parses to %d",
              unknown[i], (int)out);
    }
    /* outside the table */
    mk_dtype outside[] = {(mk_dtype)MK_DTYPE_COUNT, (mk_dtype)(MK_DTYPE_COUNT + 7), (mk_dtype)-1,
                          (mk_dtype)1000000};
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        CHECK(mk_dtype_size(outside[i]) == 0, "dtype %d: size %zu", (int)outside[i],
              mk_dtype_size(outside[i]));
        CHECK(!strcmp(mk_dtype_name(outside[i]), "?"), "dtype %d: name '%s'", (int)outside[i],
              mk_dtype_name(outside[i]));
        CHECK(!mk_dtype_is_float(outside[i]), "dtype %d is float", (int)outside[i]);
    }
}

/* ---- the op table: consistency -------------------------------------------- */

static void test_op_table_rows(void) {
    size_t n = mk_op_count();
    CHECK(n >= 23, "only %zu rows", n);
    CHECK(mk_op_info(n) == NULL && mk_op_info(n + 1) == NULL && mk_op_info((size_t)-1) == NULL,
          "a row past the end");
    CHECK(!strcmp(mk_op_role_name(MK_ROLE_POINTWISE), "pointwise") &&
              !strcmp(mk_leaf_kind_name(MK_LEAF_CONSTANT), "constant") &&
              mk_op_role_name((mk_op_role)99) == NULL && mk_leaf_kind_name((mk_leaf_kind)-1) == NULL,
          "role and leaf names");
    int leaves[4] = {0};
    const unsigned known_flags = MK_OP_BROADCAST | MK_OP_COMMUTES | MK_OP_INTERNAL | MK_OP_FUNCTION;
    for (size_t i = 0; i < n; i++) {
        const mk_op_desc *d = mk_op_info(i);
        CHECK(d != NULL, "row %zu is NULL", i);
        if (!d)
            continue;
        CHECK(mk_op_info(i) == d, "row %zu moves", i);
        CHECK(d->name && d->name[0], "row %zu has no name", i);
        if (!d->name)
            continue;
        const char *name = d->name;
        CHECK(mk_op_role_name(d->role) != NULL, "%s: its role has no name", name);
        CHECK((d->leaf == MK_LEAF_NONE) == (mk_leaf_kind_name(d->leaf) == NULL),
              "%s: leaf kind %d and its name disagree", name, (int)d->leaf);
        CHECK(d->summary && d->summary[0], "%s: no summary", name);
        CHECK(d->signature != NULL, "%s: no signature", name);
        CHECK(strspn(d->signature, "nrsdlio") == strlen(d->signature),
              "%s: signature '%s' has a letter outside n r s d l i o", name, d->signature);
        const char *o = strchr(d->signature, 'o');
        CHECK(!o || o[1] == 0, "%s: an optional name 'o' not last in '%s'", name, d->signature);
        CHECK(count_char(d->signature, 'l') <= 1, "%s: two lists in '%s'", name, d->signature);
        CHECK((d->flags & ~known_flags) == 0, "%s: unknown flags %#x", name, d->flags);
        bool leaf = d->leaf != MK_LEAF_NONE, internal = d->flags & MK_OP_INTERNAL;
        CHECK(leaf == (d->role == MK_ROLE_LEAF), "%s: leaf %d but role %d", name, (int)d->leaf,
              (int)d->role);
        if (leaf) {
            CHECK((int)d->leaf >= 1 && (int)d->leaf <= 3, "%s: leaf kind %d", name, (int)d->leaf);
            if ((int)d->leaf >= 1 && (int)d->leaf <= 3)
                leaves[d->leaf]++;
            CHECK(count_char(d->signature, 'n') + count_char(d->signature, 'r') == 0,
                  "%s: a leaf with operands '%s'", name, d->signature);
            CHECK(count_char(d->signature, 'd') == 1 && count_char(d->signature, 'l') == 1,
                  "%s: a leaf declares a dtype and a shape: '%s'", name, d->signature);
        }
        /* front ends build every op that is neither a leaf nor made by passes */
        if (!leaf && !internal)
            CHECK(d->method && d->method[0], "%s: no method for front ends", name);
        if (internal)
            CHECK(d->method == NULL && d->infix == NULL, "%s: internal, yet offered to front ends",
                  name);
        /* infix operators on two-operand broadcast rows (+ - * / % ^ //), and unary
         * minus on one operand */
        if (d->infix) {
            bool binary = !strcmp(d->signature, "nn") && (d->flags & MK_OP_BROADCAST);
            bool unary = !strcmp(d->signature, "n") && !strcmp(d->infix, "-");
            CHECK(binary || unary, "%s: infix '%s' on '%s', flags %#x", name, d->infix,
                  d->signature, d->flags);
            CHECK(!strcmp(d->infix, "//") || (strlen(d->infix) == 1 && strchr("+-*/%^", d->infix[0])),
                  "%s: infix '%s'", name, d->infix);
        }
        if (d->flags & MK_OP_BROADCAST)
            CHECK(count_char(d->signature, 'n') >= 2 && count_char(d->signature, 'n') <= 3,
                  "%s: broadcast with '%s'", name, d->signature);
        if (d->flags & MK_OP_COMMUTES)
            CHECK((d->flags & MK_OP_BROADCAST) && !strcmp(d->signature, "nn"),
                  "%s: commutes, flags %#x, '%s'", name, d->flags, d->signature);
        /* pointwise rows carry their scalar expression, an expr only on them; the
         * complex product pairs elements (re, im), so it has its own kernel instead */
        if (d->role == MK_ROLE_POINTWISE && strcmp(name, "ComplexHadamardProductNode"))
            CHECK(d->expr && d->expr[0], "%s: pointwise without an expr", name);
        if (d->expr) {
            CHECK(d->role == MK_ROLE_POINTWISE, "%s: an expr on role %d", name, (int)d->role);
            int operands = count_char(d->signature, 'n'), uses = 1; /* a, then b, then c */
            for (const char *p = d->expr; *p; p++)
                if ((*p == 'b' || *p == 'c') && (p == d->expr || !isalnum((unsigned char)p[-1])) &&
                    !isalnum((unsigned char)p[1]) && p[1] != '_' && *p - 'a' + 1 > uses)
                    uses = *p - 'a' + 1;
            CHECK(operands == uses && strlen(d->signature) == (size_t)operands,
                  "%s: expr '%s' over signature '%s'", name, d->expr, d->signature);
        }
        /* names are unique, aliases too, and differ from every name */
        for (size_t j = 0; j < i; j++) {
            const mk_op_desc *e = mk_op_info(j);
            if (!e || !e->name)
                continue;
            CHECK(strcmp(e->name, name) != 0, "%s appears twice (rows %zu, %zu)", name, j, i);
            if (d->alias)
                CHECK(strcmp(e->name, d->alias) && (!e->alias || strcmp(e->alias, d->alias)),
                      "alias %s of %s is taken by %s", d->alias, name, e->name);
            if (e->alias)
                CHECK(strcmp(e->alias, name) != 0, "%s is also an alias of %s", name, e->name);
            if (d->method && e->method)
                CHECK(strcmp(d->method, e->method) != 0, "method '%s' of %s and %s", d->method,
                      name, e->name);
        }
    }
    CHECK(leaves[MK_LEAF_INPUT] == 1 && leaves[MK_LEAF_CONSTANT] == 1 &&
              leaves[MK_LEAF_BUFFER] == 1,
          "leaf rows: input %d, constant %d, buffer %d", leaves[1], leaves[2], leaves[3]);
}

/* Every row's name (and alias) is known: mk_op_infer finds it or it is a leaf a script declares. */
static void test_op_table_names_reach(void) {
    for (size_t i = 0; i < mk_op_count(); i++) {
        const mk_op_desc *d = mk_op_info(i);
        if (!d || !d->name)
            continue;
        const char *names[2] = {d->name, d->alias};
        for (int k = 0; k < 2 && names[k]; k++) {
            mk_error *err = NULL;
            mk_tensor_info out;
            int rc = mk_op_infer(names[k], NULL, 0, NULL, 0, &out, &err);
            if (d->flags & MK_OP_INTERNAL) {
                CHECK(rc == -1, "%s: mk_op_infer builds an internal op", names[k]);
                /* nor may a script name it */
                char text[160];
                snprintf(text, sizeof text,
                         "$1 = InputTensor(x, float32, [2]);\n$2 = %s(x);\nresult = $2;\n",
                         names[k]);
                mk_error *e2 = NULL;
                char *printed = mk_script_format(text, &e2);
                CHECK(!printed && e2 && mk_error_code_of(e2) == MK_ERR_NAME &&
                          mk_error_line(e2) == 2 && mk_error_column(e2) == 6,
                      "%s in a script: %s", names[k], e2 ? mk_error_message(e2) : "accepted");
                mk_string_free(printed);
                mk_error_free(e2);
            } else if (d->leaf != MK_LEAF_NONE) {
                /* a leaf: declared in a script */
                char text[256];
                const char *sig = d->signature;
                int used = snprintf(text, sizeof text, "$1 = %s(", names[k]);
                for (const char *c = sig; *c; c++) {
                    const char *arg = *c == 's' || *c == 'o' ? "t" : *c == 'd' ? "float32" : *c == 'l' ? "[2, 3]" : "1";
                    used += snprintf(text + used, sizeof text - (size_t)used, "%s%s",
                                     c == sig ? "" : ", ", arg);
                }
                snprintf(text + used, sizeof text - (size_t)used, ");\nresult = $1;\n");
                mk_error_free(err), err = NULL;
                char *printed = mk_script_format(text, &err);
                CHECK(printed != NULL, "%s: '%s' does not parse: %s", names[k], text,
                      mk_error_message(err));
                mk_string_free(printed);
            } else {
                /* found: any complaint but "unknown" */
                CHECK(rc == -1 && err && mk_error_code_of(err) != MK_ERR_NAME &&
                          !strstr(mk_error_message(err), "unknown"),
                      "%s: %s", names[k], err ? mk_error_message(err) : "no operands accepted");
            }
            mk_error_free(err);
        }
    }
    mk_error *err = NULL;
    mk_tensor_info out, a = info(F32, 1, (int64_t[]){3});
    CHECK(mk_op_infer("NoSuchNode", &a, 1, NULL, 0, &out, &err) == -1 && err &&
              mk_error_code_of(err) == MK_ERR_NAME,
          "unknown op: %s", mk_error_message(err));
    mk_error_free(err);
}

/* The rows of the ops that front ends map operators and methods onto. */
static void test_op_table_known_rows(void) {
    const struct {
        const char *name, *sig, *infix;
        unsigned flags; /* BROADCAST | COMMUTES as expected */
    } rows[] = {
        {"SumNode", "nn", "+", MK_OP_BROADCAST | MK_OP_COMMUTES},
        {"HadamardProductNode", "nn", "*", MK_OP_BROADCAST | MK_OP_COMMUTES},
        {"SubNode", "nn", "-", MK_OP_BROADCAST},
        {"DivNode", "nn", "/", MK_OP_BROADCAST},
        {"ExpNode", "n", NULL, 0},
        {"TanhNode", "n", NULL, 0},
        {"SigmoidNode", "n", NULL, 0},
        {"GELUNode", "n", NULL, 0},
        {"ReLUNode", "n", NULL, 0},
        {"SiLUNode", "n", NULL, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const mk_op_desc *d = find_op(rows[i].name);
        CHECK(d != NULL, "no row %s", rows[i].name);
        if (!d)
            continue;
        CHECK(!strcmp(d->signature, rows[i].sig), "%s: signature '%s'", d->name, d->signature);
        CHECK(d->role == MK_ROLE_POINTWISE, "%s: role %d", d->name, (int)d->role);
        CHECK(d->expr != NULL, "%s: no expr", d->name);
        CHECK((d->flags & (MK_OP_BROADCAST | MK_OP_COMMUTES)) == rows[i].flags,
              "%s: flags %#x", d->name, d->flags);
        CHECK(!(d->flags & MK_OP_INTERNAL), "%s: internal", d->name);
        CHECK(rows[i].infix ? d->infix && !strcmp(d->infix, rows[i].infix) : d->infix == NULL,
              "%s: infix '%s'", d->name, d->infix ? d->infix : "(none)");
    }
    const mk_op_desc *mm = find_op("MatMulNode");
    CHECK(mm && mm->alias && !strcmp(mm->alias, "MulNode") && mm->role == MK_ROLE_MATMUL,
          "MatMulNode: alias %s", mm && mm->alias ? mm->alias : "(none)");
    const mk_op_desc *rs = find_op("ReplaceSliceNode"), *ss = find_op("SlicedSoftmaxNode");
    CHECK(rs && !strcmp(rs->signature, "nnrr") && rs->role == MK_ROLE_INPLACE,
          "ReplaceSliceNode: '%s'", rs ? rs->signature : "(missing)");
    CHECK(ss && !strcmp(ss->signature, "nr"), "SlicedSoftmaxNode: '%s'",
          ss ? ss->signature : "(missing)");
    const struct { const char *name; mk_leaf_kind leaf; } leaves[] = {
        {"InputTensor", MK_LEAF_INPUT}, {"ConstantTensor", MK_LEAF_CONSTANT},
        {"BufferTensor", MK_LEAF_BUFFER}};
    for (int i = 0; i < 3; i++) {
        const mk_op_desc *d = find_op(leaves[i].name);
        CHECK(d && d->leaf == leaves[i].leaf && d->role == MK_ROLE_LEAF, "%s: leaf %d",
              leaves[i].name, d ? (int)d->leaf : -1);
    }
}

/* Operand k of a pointwise row as the row takes it: float32, else bool
 * (where's condition, the logical ops' operands); the dtypes in dts. */
static bool row_dtypes(const mk_op_desc *d, int ops, mk_dtype *dts) {
    static const int64_t s[2] = {3, 2};
    for (int form = 0; form < 3; form++) { /* all float32; a bool first; all bool */
        mk_tensor_info in[3], out;
        for (int k = 0; k < ops; k++) {
            dts[k] = form == 2 || (form == 1 && k == 0) ? MK_DTYPE_BOOL : F32;
            in[k] = info(dts[k], 2, s);
        }
        mk_error *err = NULL;
        bool ok = mk_op_infer(d->name, in, (size_t)ops, NULL, 0, &out, &err) == 0;
        mk_error_free(err);
        if (ok) return true;
    }
    return false;
}

/* Every pointwise row keeps its operands' shape; broadcast rows take any
 * operand with 1-dims or fewer dims, and refuse dims that differ. */
static void test_op_table_pointwise_infer(void) {
    int64_t sa[2] = {3, 2}, sb[2] = {1, 2};
    for (size_t i = 0; i < mk_op_count(); i++) {
        const mk_op_desc *d = mk_op_info(i);
        if (!d || d->role != MK_ROLE_POINTWISE || (d->flags & MK_OP_INTERNAL))
            continue;
        int ops = count_char(d->signature, 'n');
        mk_dtype dts[3];
        CHECK(row_dtypes(d, ops, dts), "%s takes neither float32 nor bool operands", d->name);
        mk_tensor_info in[3], out;
        for (int k = 0; k < ops; k++) in[k] = info(dts[k], 2, sa);
        mk_error *err = NULL;
        CHECK(mk_op_infer(d->name, in, (size_t)ops, NULL, 0, &out, &err) == 0 &&
                  (out.dtype == F32 || out.dtype == MK_DTYPE_BOOL) && out.rank == 2 &&
                  out.shape[0] == 3 && out.shape[1] == 2,
              "%s on [3, 2]: %s", d->name, mk_error_message(err));
        mk_error_free(err), err = NULL;
        if (d->flags & MK_OP_BROADCAST) {
            for (int k = 0; k < ops; k++) { /* NumPy's rule: any side broadcasts, ranks may differ */
                mk_tensor_info v[3] = {in[0], in[1], in[ops - 1]};
                v[k] = info(dts[k], 2, sb);
                CHECK(mk_op_infer(d->name, v, (size_t)ops, NULL, 0, &out, &err) == 0 &&
                          out.rank == 2 && out.shape[0] == 3 && out.shape[1] == 2,
                      "%s: operand %d [1, 2]: %s", d->name, k, mk_error_message(err));
                mk_error_free(err), err = NULL;
                v[k] = info(dts[k], 1, (int64_t[]){2});
                CHECK(mk_op_infer(d->name, v, (size_t)ops, NULL, 0, &out, &err) == 0 &&
                          out.rank == 2 && out.shape[0] == 3 && out.shape[1] == 2,
                      "%s: operand %d [2]: %s", d->name, k, mk_error_message(err));
                mk_error_free(err), err = NULL;
                v[k] = info(dts[k], 2, (int64_t[]){2, 2});
                CHECK(mk_op_infer(d->name, v, (size_t)ops, NULL, 0, &out, &err) == -1 && err &&
                          mk_error_code_of(err) == MK_ERR_SHAPE &&
                          !strncmp(mk_error_message(err), "shape error: ", 13),
                      "%s: operand %d [2, 2]: %s", d->name, k,
                      err ? mk_error_message(err) : "accepted");
                mk_error_free(err), err = NULL;
            }
        }
        /* one operand too many or too few */
        mk_tensor_info four[4] = {in[0], in[0], in[0], in[0]};
        CHECK(mk_op_infer(d->name, four, (size_t)ops + 1, NULL, 0, &out, &err) == -1 && err &&
                  mk_error_code_of(err) == MK_ERR_ARGUMENT,
              "%s with %d operands: %s", d->name, ops + 1, err ? mk_error_message(err) : "accepted");
        mk_error_free(err), err = NULL;
        CHECK(mk_op_infer(d->name, four, (size_t)ops - 1, NULL, 0, &out, &err) == -1 && err &&
                  mk_error_code_of(err) == MK_ERR_ARGUMENT,
              "%s with %d operands: %s", d->name, ops - 1, err ? mk_error_message(err) : "accepted");
        mk_error_free(err);
    }
}

/* ---- the new ops through mk_op_infer ---------------------------------------- */

static void test_op_infer_new_ops(void) {
    mk_error *err = NULL;
    mk_tensor_info out;
    mk_tensor_info a = info(F32, 3, (int64_t[]){4, 5, 6}), b = info(F32, 3, (int64_t[]){4, 1, 6});
    mk_tensor_info ai = info(I64, 3, (int64_t[]){4, 5, 6}), bi = info(I64, 3, (int64_t[]){1, 5, 1});
    mk_tensor_info ab[2] = {a, b}, abi[2] = {ai, bi}, ba[2] = {b, a}, mixed[2] = {a, bi};
    CHECK(mk_op_infer("SubNode", ab, 2, NULL, 0, &out, &err) == 0 && out.dtype == F32 &&
              out.rank == 3 && out.shape[1] == 5,
          "SubNode f32: %s", mk_error_message(err));
    CHECK(mk_op_infer("SubNode", abi, 2, NULL, 0, &out, &err) == 0 && out.dtype == I64 &&
              out.shape[0] == 4 && out.shape[2] == 6,
          "SubNode i64: %s", mk_error_message(err));
    CHECK(mk_op_infer("DivNode", ab, 2, NULL, 0, &out, &err) == 0 && out.dtype == F32,
          "DivNode f32: %s", mk_error_message(err));
    CHECK(mk_op_infer("DivNode", abi, 2, NULL, 0, &out, &err) == -1 && err &&
              mk_error_code_of(err) == MK_ERR_DTYPE && mk_error_line(err) == 0 &&
              !strcmp(mk_error_message(err), "dtype error: DivNode does not take int64 (operand 1)"),
          "DivNode i64: %s", err ? mk_error_message(err) : "accepted");
    mk_error_free(err), err = NULL;
    const char *sb[2] = {"SubNode", "DivNode"};
    mk_tensor_info unaligned[2] = {a, info(F32, 2, (int64_t[]){4, 6})};
    for (int k = 0; k < 2; k++) {
        /* the first operand broadcasts too (NumPy's rule) */
        CHECK(mk_op_infer(sb[k], ba, 2, NULL, 0, &out, &err) == 0 && out.rank == 3 &&
                  out.shape[0] == 4 && out.shape[1] == 5 && out.shape[2] == 6,
              "%s [4,1,6] - [4,5,6]: %s", sb[k], mk_error_message(err));
        mk_error_free(err), err = NULL;
        CHECK(mk_op_infer(sb[k], unaligned, 2, NULL, 0, &out, &err) == -1 && err &&
                  mk_error_code_of(err) == MK_ERR_SHAPE && strstr(mk_error_message(err), sb[k]) &&
                  strstr(mk_error_message(err), "does not broadcast"),
              "%s [4,5,6] - [4,6]: %s", sb[k], err ? mk_error_message(err) : "accepted");
        mk_error_free(err), err = NULL;
        CHECK(mk_op_infer(sb[k], mixed, 2, NULL, 0, &out, &err) == -1 && err &&
                  mk_error_code_of(err) == MK_ERR_DTYPE,
              "%s float32 with int64: %s", sb[k], err ? mk_error_message(err) : "accepted");
        mk_error_free(err), err = NULL;
    }
    const char *un[] = {"ExpNode", "TanhNode", "SigmoidNode", "GELUNode"};
    for (int k = 0; k < 4; k++) {
        CHECK(mk_op_infer(un[k], &a, 1, NULL, 0, &out, &err) == 0 && out.dtype == F32 &&
                  out.rank == 3 && out.shape[2] == 6,
              "%s: %s", un[k], mk_error_message(err));
        char want[128];
        snprintf(want, sizeof want, "dtype error: %s does not take int64 (operand 1)", un[k]);
        CHECK(mk_op_infer(un[k], &ai, 1, NULL, 0, &out, &err) == -1 && err &&
                  mk_error_code_of(err) == MK_ERR_DTYPE && !strcmp(mk_error_message(err), want),
              "%s int64: %s", un[k], err ? mk_error_message(err) : "accepted");
        mk_error_free(err), err = NULL;
    }
    /* a dtype outside the table is refused, not read */
    mk_tensor_info bad = info((mk_dtype)99, 1, (int64_t[]){3});
    CHECK(mk_op_infer("ExpNode", &bad, 1, NULL, 0, &out, &err) == -1 && err,
          "dtype 99 accepted");
    mk_error_free(err);
}

/* ---- mk_op_infer with known bounds ------------------------------------------- */

/* rc and, on failure, a shape error naming `op` without a script position. */
static void expect_infer(const char *op, mk_tensor_info *in, size_t n, bool ok, const char *what) {
    mk_error *err = NULL;
    mk_tensor_info out;
    int rc = mk_op_infer(op, in, n, NULL, 0, &out, &err);
    if (ok) {
        CHECK(rc == 0, "%s: %s", what, mk_error_message(err));
    } else {
        CHECK(rc == -1 && err, "%s: accepted", what);
        if (err) {
            CHECK(mk_error_code_of(err) == MK_ERR_SHAPE, "%s: code %d: %s", what,
                  (int)mk_error_code_of(err), mk_error_message(err));
            CHECK(!strncmp(mk_error_message(err), "shape error: ", 13) &&
                      strstr(mk_error_message(err), op),
                  "%s: '%s'", what, mk_error_message(err));
            CHECK(mk_error_line(err) == 0, "%s: a script line %d", what, mk_error_line(err));
        }
    }
    mk_error_free(err);
}

static void test_op_infer_known_bounds(void) {
    int64_t R = test_randint(4, 12), D = test_randint(1, 9), k = test_randint(1, 3);
    mk_tensor_info in[4] = {info(F32, 2, (int64_t[]){R, D}), info(F32, 2, (int64_t[]){k, D}),
                            info(I64, 1, (int64_t[]){1}), info(I64, 1, (int64_t[]){1})};
    int64_t begin, end;
    /* unknown bounds: only shapes are checked */
    expect_infer("ReplaceSliceNode", in, 4, true, "ReplaceSliceNode, bounds unknown");
    in[2].value = &begin;
    in[3].value = &end;
    int64_t good = test_randint(0, R - k);
    begin = good, end = good + k;
    expect_infer("ReplaceSliceNode", in, 4, true, "ReplaceSliceNode, bounds in range");
    begin = 0, end = k;
    expect_infer("ReplaceSliceNode", in, 4, true, "ReplaceSliceNode at row 0");
    begin = R - k, end = R;
    expect_infer("ReplaceSliceNode", in, 4, true, "ReplaceSliceNode at the end");
    const int64_t bad[][2] = {{-1, k - 1}, {R - k + 1, R + 1}, {R, R + k}, {good + k, good},
                              {good, good + k + 1}, {INT64_MIN, INT64_MIN + k}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        begin = bad[i][0], end = bad[i][1];
        char what[128];
        snprintf(what, sizeof what, "ReplaceSliceNode rows [%lld, %lld) of %lld, %lld given",
                 (long long)begin, (long long)end, (long long)R, (long long)k);
        expect_infer("ReplaceSliceNode", in, 4, false, what);
    }
    /* one bound known, the other not: the known one is still checked */
    in[3].value = NULL;
    begin = R + 1;
    expect_infer("ReplaceSliceNode", in, 4, false, "ReplaceSliceNode begin past the end, end unknown");
    begin = good;
    expect_infer("ReplaceSliceNode", in, 4, true, "ReplaceSliceNode begin known, end unknown");
    /* a value on a data operand is not a bound */
    in[2].value = in[3].value = NULL;
    float data[256];
    for (int i = 0; i < 256; i++) data[i] = (float)test_uniform(0.1, 1);
    in[1].value = data;
    expect_infer("ReplaceSliceNode", in, 4, true, "ReplaceSliceNode with a value on r");

    int64_t n = test_randint(2, 50), p;
    mk_tensor_info sm[2] = {info(F32, 2, (int64_t[]){3, n}), info(I64, 1, (int64_t[]){1})};
    expect_infer("SlicedSoftmaxNode", sm, 2, true, "SlicedSoftmaxNode, prefix unknown");
    sm[1].value = &p;
    int64_t ok_p[] = {0, 1, n, test_randint(1, n)};
    for (int i = 0; i < 4; i++) {
        p = ok_p[i];
        char what[96];
        snprintf(what, sizeof what, "SlicedSoftmaxNode prefix %lld of %lld", (long long)p,
                 (long long)n);
        expect_infer("SlicedSoftmaxNode", sm, 2, true, what);
    }
    int64_t bad_p[] = {n + 1, n + test_randint(2, 100), -1, INT64_MIN, INT64_MAX};
    for (int i = 0; i < 5; i++) {
        p = bad_p[i];
        char what[96];
        snprintf(what, sizeof what, "SlicedSoftmaxNode prefix %lld of %lld", (long long)p,
                 (long long)n);
        expect_infer("SlicedSoftmaxNode", sm, 2, false, what);
    }
}

/* ---- mk_script_constants --------------------------------------------------------- */

static void test_script_constants(void) {
    const char *text = "$1 = InputTensor(x, float32, [2, 3]);\n"
                       "$2 = ConstantTensor(w, float32, [3, 4]);\n"
                       "$3 = MatMulNode($1, $2);\n"
                       "$4 = ConstantTensor(bias, float32, [1, 4]);\n"
                       "$5 = SubNode($3, $4);\n"
                       "$6 = ConstantTensor(steps, int64, [1]);\n"
                       "$7 = ConstantTensor(half, bfloat16, [2, 2, 2, 2]);\n"
                       "$8 = BufferTensor(float32, [4]);\n"
                       "$9 = ConstantTensor(q, int8, [5]);\n"
                       "$10 = ConstantTensor(h, float16, [7, 1]);\n"
                       "result = $5;\n";
    /* a copy freed before the result is read: the names belong to the result */
    char *copy = strdup(text);
    size_t count = 99;
    mk_error *err = NULL;
    mk_tensor_info *c = mk_script_constants(copy, &count, &err);
    free(copy);
    CHECK(c != NULL, "%s", mk_error_message(err));
    const struct {
        const char *name;
        mk_dtype dt;
        int rank;
        int64_t shape[4];
    } want[] = {{"w", F32, 2, {3, 4}},
                {"bias", F32, 2, {1, 4}},
                {"steps", I64, 1, {1}},
                {"half", MK_DTYPE_BFLOAT16, 4, {2, 2, 2, 2}},
                {"q", MK_DTYPE_INT8, 1, {5}},
                {"h", MK_DTYPE_FLOAT16, 2, {7, 1}}};
    CHECK(count == 6, "count %zu", count);
    for (size_t i = 0; c && i < 6 && i < count; i++) {
        CHECK(c[i].name && !strcmp(c[i].name, want[i].name), "constant %zu: name %s", i,
              c[i].name ? c[i].name : "(null)");
        CHECK(c[i].dtype == want[i].dt && c[i].rank == want[i].rank &&
                  !memcmp(c[i].shape, want[i].shape, sizeof(int64_t) * (size_t)want[i].rank),
              "constant %zu (%s): dtype %d rank %d", i, want[i].name, (int)c[i].dtype, c[i].rank);
        CHECK(c[i].value == NULL, "constant %zu: a value", i);
    }
    mk_tensor_infos_free(c);
    mk_error_free(err), err = NULL;

    /* none: not NULL, zero entries */
    count = 99;
    c = mk_script_constants("$1 = InputTensor(x, float32, [3]);\n$2 = ExpNode($1);\nresult = $2;\n",
                            &count, &err);
    CHECK(c != NULL && count == 0, "no constants: %p, count %zu: %s", (void *)c, count,
          mk_error_message(err));
    mk_tensor_infos_free(c);
    mk_error_free(err), err = NULL;

    /* a bad script: NULL and the parser's error, where it is */
    const struct {
        const char *text;
        mk_error_code code;
        int line, column;
    } bad[] = {
        {"$1 = ConstantTensor(w, float32, [3]);\n$2 = ExpNode($1)\nresult = $2;\n", MK_ERR_SYNTAX,
         3, 1},
        {"$1 = ConstantTensor(w, float33, [3]);\nresult = $1;\n", MK_ERR_DTYPE, 1, 24},
        {"$1 = ConstantTensor(w, int64, [3]);\n$2 = ExpNode($1);\nresult = $2;\n", MK_ERR_DTYPE, 2,
         1},
        {"$1 = ConstantTensor(w, float32, [3]);\n$2 = FooNode($1);\nresult = $2;\n", MK_ERR_NAME, 2,
         6},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        count = 99;
        c = mk_script_constants(bad[i].text, &count, &err);
        CHECK(c == NULL && err, "bad script %zu accepted", i);
        if (err) {
            CHECK(mk_error_code_of(err) == bad[i].code && mk_error_line(err) == bad[i].line &&
                      mk_error_column(err) == bad[i].column,
                  "bad script %zu: code %d at %d:%d: %s", i, (int)mk_error_code_of(err),
                  mk_error_line(err), mk_error_column(err), mk_error_message(err));
            /* the same error as the printer gives */
            mk_error *e2 = NULL;
            char *s = mk_script_format(bad[i].text, &e2);
            CHECK(!s && e2 && !strcmp(mk_error_message(e2), mk_error_message(err)),
                  "bad script %zu: '%s' vs the printer's '%s'", i, mk_error_message(err),
                  e2 ? mk_error_message(e2) : "(none)");
            mk_string_free(s);
            mk_error_free(e2);
        }
        mk_tensor_infos_free(c);
        mk_error_free(err), err = NULL;
    }
    c = mk_script_constants(NULL, &count, &err);
    CHECK(c == NULL && err, "NULL script accepted");
    mk_error_free(err);
    mk_tensor_infos_free(NULL);
}

int main(void) {
    test_srand(test_seed());
    mk_error *err = NULL;
    ctx = mk_context_new(&err);
    if (!ctx) {
        printf("# no context: %s\n", err ? mk_error_message(err) : "?");
        mk_error_free(err);
        return 1;
    }
    RUN(test_dtype_table);
    RUN(test_op_table_rows);
    RUN(test_op_table_names_reach);
    RUN(test_op_table_known_rows);
    RUN(test_op_table_pointwise_infer);
    RUN(test_op_infer_new_ops);
    RUN(test_op_infer_known_bounds);
    RUN(test_script_constants);
    mk_context_free(ctx);
    return test_summary("table");
}
