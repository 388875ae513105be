/*
 * expr.c — a pointwise op's scalar expression (its row's `expr`, e.g.
 * "a * (1.0f / (1.0f + expf(-a)))") compiled to a straight-line program
 * (mk_expr in expr.h) that each device runs: the CPU over tiles of a row,
 * CUDA per element. Code generators may print the expression itself: it is
 * valid C and CUDA C.
 *
 * Grammar (C's precedence and associativity):
 *   expr    = compare [ '?' expr ':' expr ]
 *   compare = sum [ ('>' | '<' | '>=' | '<=' | '==' | '!=') sum ]
 *   sum     = product { ('+' | '-') product }
 *   product = unary { ('*' | '/') unary }
 *   unary   = '-' unary | primary
 *   primary = number | 'a' | 'b' | 'c' | f1 '(' expr ')' | f2 '(' expr ',' expr ')'
 *           | '(' expr ')'
 *   f1      = expf tanhf sqrtf fabsf logf exp2f sinf cosf erff floorf ceilf rintf
 *             expm1f log1pf (C's)
 *   f2      = powf (C's) | max | min (x > y ? x : y, x < y ? x : y) | floormod
 *             | floordiv (Python's % and //: the divisor's sign)
 * Numbers are C literals with an optional 'f' suffix. The language is C but
 * for max, min, floormod and floordiv, which the code generator prints as
 * its own (kernels/skeletons/pointwise_ops.cuh).
 */
#include "expr.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *src, *p;
    mk_expr *out;
    mk_error **err;
} parser;

static int fail_at(parser *ps, const char *what) {
    return mk_fail(ps->err, MK_ERR_INTERNAL, 0, 0,
                   "the pointwise expression \"%s\" does not compile at offset %d: %s", ps->src,
                   (int)(ps->p - ps->src), what);
}

static void skip(parser *ps) {
    while (isspace((unsigned char)*ps->p)) ps->p++;
}

static bool take(parser *ps, char c) {
    skip(ps);
    if (*ps->p != c) return false;
    ps->p++;
    return true;
}

/* Appends an instruction; its result register, or -1. */
static int emit(parser *ps, mk_xop op, int x, int y, int z, double k) {
    mk_expr *e = ps->out;
    if (x < 0 || y < 0 || z < 0) return -1;
    if (e->n == MK_EXPR_MAX) return fail_at(ps, "too many operations");
    e->insn[e->n] = (mk_xinsn){(unsigned char)op, (unsigned char)x, (unsigned char)y,
                               (unsigned char)z, k};
    if (mk_xop_float_only(op)) e->has_float_only = true;
    return MK_X_IN + e->n++;
}

static int parse_expr(parser *ps);

static int parse_primary(parser *ps) {
    skip(ps);
    const char *p = ps->p;
    if (isdigit((unsigned char)*p) || *p == '.') {
        char *end;
        double v = strtod(p, &end);
        if (end == p) return fail_at(ps, "a number");
        ps->p = end + (*end == 'f');
        return emit(ps, MK_X_CONST, 0, 0, 0, v);
    }
    if (take(ps, '(')) {
        int r = parse_expr(ps);
        if (r >= 0 && !take(ps, ')')) return fail_at(ps, "expected ')'");
        return r;
    }
    size_t len = 0;
    while (isalnum((unsigned char)p[len]) || p[len] == '_') len++;
    if (len == 1 && (*p == 'a' || *p == 'b' || *p == 'c')) {
        ps->p += 1;
        int k = *p - 'a';
        if (k + 1 > ps->out->n_in) ps->out->n_in = k + 1;
        return k;
    }
    static const struct {
        const char *name;
        mk_xop op;
    } calls[] = {
        {"expf", MK_X_EXP},       {"tanhf", MK_X_TANH},   {"sqrtf", MK_X_SQRT},
        {"fabsf", MK_X_ABS},      {"logf", MK_X_LOG},     {"exp2f", MK_X_EXP2},
        {"sinf", MK_X_SIN},       {"cosf", MK_X_COS},     {"erff", MK_X_ERF},
        {"floorf", MK_X_FLOOR},   {"ceilf", MK_X_CEIL},   {"rintf", MK_X_RINT},
        {"expm1f", MK_X_EXPM1},   {"log1pf", MK_X_LOG1P}, {"powf", MK_X_POW},
        {"max", MK_X_MAX},        {"min", MK_X_MIN},      {"floormod", MK_X_MOD},
        {"floordiv", MK_X_FLOORDIV},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++)
        if (strlen(calls[i].name) == len && !memcmp(p, calls[i].name, len)) {
            ps->p += len;
            if (!take(ps, '(')) return fail_at(ps, "expected '(' after a function");
            int r = parse_expr(ps), r2 = 0;
            if (r >= 0 && mk_xop_arity(calls[i].op) == 2) {
                if (!take(ps, ',')) return fail_at(ps, "expected ',' between two arguments");
                r2 = parse_expr(ps);
            }
            if (r >= 0 && r2 >= 0 && !take(ps, ')')) return fail_at(ps, "expected ')'");
            return emit(ps, calls[i].op, r, r2, 0, 0);
        }
    return fail_at(ps, "expected a number, a, b, c, a function or '('");
}

static int parse_unary(parser *ps) {
    if (take(ps, '-')) return emit(ps, MK_X_NEG, parse_unary(ps), 0, 0, 0);
    return parse_primary(ps);
}

static int parse_product(parser *ps) {
    int r = parse_unary(ps);
    for (;;) {
        if (take(ps, '*')) r = emit(ps, MK_X_MUL, r, parse_unary(ps), 0, 0);
        else if (take(ps, '/')) r = emit(ps, MK_X_DIV, r, parse_unary(ps), 0, 0);
        else return r;
    }
}

static int parse_sum(parser *ps) {
    int r = parse_product(ps);
    for (;;) {
        if (take(ps, '+')) r = emit(ps, MK_X_ADD, r, parse_product(ps), 0, 0);
        else if (take(ps, '-')) r = emit(ps, MK_X_SUB, r, parse_product(ps), 0, 0);
        else return r;
    }
}

/* Two-character operators first: ">=" is not '>' then '='. */
static bool take2(parser *ps, const char *op) {
    skip(ps);
    if (ps->p[0] != op[0] || ps->p[1] != op[1]) return false;
    ps->p += 2;
    return true;
}

static int parse_compare(parser *ps) {
    int r = parse_sum(ps);
    if (take2(ps, ">=")) return emit(ps, MK_X_GE, r, parse_sum(ps), 0, 0);
    if (take2(ps, "<=")) return emit(ps, MK_X_LE, r, parse_sum(ps), 0, 0);
    if (take2(ps, "==")) return emit(ps, MK_X_EQ, r, parse_sum(ps), 0, 0);
    if (take2(ps, "!=")) return emit(ps, MK_X_NE, r, parse_sum(ps), 0, 0);
    if (take(ps, '>')) return emit(ps, MK_X_GT, r, parse_sum(ps), 0, 0);
    if (take(ps, '<')) return emit(ps, MK_X_LT, r, parse_sum(ps), 0, 0);
    return r;
}

static int parse_expr(parser *ps) {
    int c = parse_compare(ps);
    if (c < 0 || !take(ps, '?')) return c;
    int x = parse_expr(ps);
    if (x >= 0 && !take(ps, ':')) return fail_at(ps, "expected ':'");
    return emit(ps, MK_X_SELECT, c, x, parse_expr(ps), 0);
}

/*
 * Tidies a program without changing a result bit: equal constants share one
 * register; x > y ? x : y becomes MK_X_MAX(x, y) (ReLU: one pass instead of
 * three), x < y ? x : y MK_X_MIN; instructions nobody reads go, and registers
 * are renumbered.
 */
void mk_expr_tidy(mk_expr *e) {
    int alias[MK_X_IN + MK_EXPR_MAX]; /* register -> the register that holds its value */
    for (int r = 0; r < MK_X_IN + MK_EXPR_MAX; r++) alias[r] = r;
    for (int i = 0; i < e->n; i++) {
        mk_xinsn *in = &e->insn[i];
        in->x = (unsigned char)alias[in->x];
        in->y = (unsigned char)alias[in->y];
        in->z = (unsigned char)alias[in->z];
        if (in->op == MK_X_CONST)
            for (int j = 0; j < i; j++)
                if (e->insn[j].op == MK_X_CONST && e->insn[j].k == in->k) {
                    alias[MK_X_IN + i] = alias[MK_X_IN + j];
                    break;
                }
        if (in->op == MK_X_SELECT && in->x >= MK_X_IN) {
            const mk_xinsn *c = &e->insn[in->x - MK_X_IN];
            if ((c->op == MK_X_GT || c->op == MK_X_LT) && c->x == in->y && c->y == in->z)
                *in = (mk_xinsn){c->op == MK_X_GT ? MK_X_MAX : MK_X_MIN, c->x, c->y, 0, 0};
        }
    }
    bool live[MK_X_IN + MK_EXPR_MAX] = {false};
    live[MK_X_IN + e->n - 1] = true;
    for (int i = e->n - 1; i >= 0; i--) {
        const mk_xinsn *in = &e->insn[i];
        if (!live[MK_X_IN + i]) continue;
        int arity = mk_xop_arity(in->op);
        if (arity >= 1) live[in->x] = true;
        if (arity >= 2) live[in->y] = true;
        if (arity >= 3) live[in->z] = true;
    }
    int renum[MK_X_IN + MK_EXPR_MAX], kept = 0;
    for (int r = 0; r < MK_X_IN; r++) renum[r] = r;
    for (int i = 0; i < e->n; i++) {
        if (!live[MK_X_IN + i]) continue;
        mk_xinsn in = e->insn[i];
        in.x = (unsigned char)renum[in.x];
        in.y = (unsigned char)renum[in.y];
        in.z = (unsigned char)renum[in.z];
        renum[MK_X_IN + i] = MK_X_IN + kept;
        e->insn[kept++] = in;
    }
    e->n = kept;
}

int mk_expr_compile(const char *src, mk_expr *out, mk_error **err) {
    *out = (mk_expr){.n_in = 1};
    parser ps = {.src = src, .p = src, .out = out, .err = err};
    int r = parse_expr(&ps);
    if (r < 0) return -1;
    skip(&ps);
    if (*ps.p) return fail_at(&ps, "unexpected text after the expression");
    if (r != MK_X_IN + out->n - 1) /* a bare operand: the result must be the last one */
        return fail_at(&ps, "the expression computes nothing");
    mk_expr_tidy(out);
    return 0;
}

bool mk_expr_append(mk_expr *e, const mk_expr *p, const int *operands, int *result) {
    if (e->n + p->n > MK_EXPR_MAX) return false;
    int map[MK_X_IN + MK_EXPR_MAX];
    for (int k = 0; k < MK_X_IN; k++) map[k] = k < p->n_in ? operands[k] : 0;
    for (int j = 0; j < p->n; j++) {
        mk_xinsn in = p->insn[j];
        in.x = (unsigned char)map[in.x];
        in.y = (unsigned char)map[in.y];
        in.z = (unsigned char)map[in.z];
        map[MK_X_IN + j] = MK_X_IN + e->n;
        e->insn[e->n++] = in;
    }
    e->has_float_only = e->has_float_only || p->has_float_only;
    *result = MK_X_IN + e->n - 1;
    return true;
}
