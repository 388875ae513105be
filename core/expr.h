/*
 * expr.h — pointwise expressions: an op row's scalar expression compiled once
 * to a straight-line program that every device runs (expr.c).
 */
#ifndef MK_EXPR_H
#define MK_EXPR_H

#include "graph.h"

/* ---- pointwise expressions (expr.c) ------------------------------------------ */

/*
 * A pointwise op's scalar expression (its row's `expr`, C syntax over a, b
 * and c: numbers, + - * /, unary -, > < >= <= == !=, ?:, parentheses, and the
 * functions of mk_expr_compile's grammar in expr.c) compiled to a
 * straight-line program over registers. Registers 0 .. 2 are a, b, c (a
 * fused group's program reads up to MK_X_IN operands); every instruction
 * writes a new register, the last one is the result. Each device runs the
 * program as it likes (the CPU over tiles, CUDA per element); a code
 * generator prints it instruction by instruction. Evaluated in one compute
 * dtype, float32 or int64 (integer + - * wrap around), one rounding per
 * operation, so the result equals the C expression compiled without
 * contraction. Comparisons give 1 or 0 in that dtype; a bool operand is read
 * as 0 or 1 in it and a bool result stored as (value != 0) (the rule of
 * mixed programs: mk_pointwise_compute_dtype in device.h).
 */
typedef enum {
    MK_X_CONST, /* r[dst] = k */
    MK_X_NEG, MK_X_EXP, MK_X_TANH, MK_X_SQRT,                   /* r[dst] = f(r[x]) */
    MK_X_ADD, MK_X_SUB, MK_X_MUL, MK_X_DIV, MK_X_GT, MK_X_LT,   /* r[dst] = r[x] op r[y] */
    MK_X_SELECT,                                                /* r[dst] = r[x] ? r[y] : r[z] */
    MK_X_MAX,   /* r[dst] = r[x] > r[y] ? r[x] : r[y] (what "a > 0 ? a : 0" compiles to) */
    /* r[dst] = f(r[x]): fabsf logf exp2f sinf cosf erff floorf ceilf rintf (ties to
     * even) expm1f log1pf */
    MK_X_ABS, MK_X_LOG, MK_X_EXP2, MK_X_SIN, MK_X_COS, MK_X_ERF, MK_X_FLOOR, MK_X_CEIL,
    MK_X_RINT, MK_X_EXPM1, MK_X_LOG1P,
    /* r[dst] = r[x] op r[y]: powf; min (r[x] < r[y] ? r[x] : r[y]); Python's % and //
     * (floormod, floordiv: the divisor's sign; integers by 0 give 0); >= <= == != */
    MK_X_POW, MK_X_MIN, MK_X_MOD, MK_X_FLOORDIV, MK_X_GE, MK_X_LE, MK_X_EQ, MK_X_NE,
} mk_xop;

/* How many registers instruction `op` reads: x, then y, then z. */
static inline int mk_xop_arity(int op) {
    switch (op) {
    case MK_X_CONST: return 0;
    case MK_X_SELECT: return 3;
    case MK_X_ADD: case MK_X_SUB: case MK_X_MUL: case MK_X_DIV: case MK_X_GT: case MK_X_LT:
    case MK_X_MAX: case MK_X_POW: case MK_X_MIN: case MK_X_MOD: case MK_X_FLOORDIV:
    case MK_X_GE: case MK_X_LE: case MK_X_EQ: case MK_X_NE:
        return 2;
    default: return 1;
    }
}

/* Operations only floats have (their programs are refused for int64). */
static inline bool mk_xop_float_only(int op) {
    switch (op) {
    case MK_X_DIV: case MK_X_EXP: case MK_X_TANH: case MK_X_SQRT: case MK_X_LOG: case MK_X_EXP2:
    case MK_X_SIN: case MK_X_COS: case MK_X_ERF: case MK_X_FLOOR: case MK_X_CEIL: case MK_X_RINT:
    case MK_X_EXPM1: case MK_X_LOG1P: case MK_X_POW:
        return true;
    default: return false;
    }
}

#define MK_EXPR_MAX 32          /* instructions */
#define MK_X_IN 4               /* registers 0 .. MK_X_IN - 1 are the operands a, b, ... */

typedef struct {
    unsigned char op, x, y, z; /* mk_xop, operand registers */
    double k;                  /* MK_X_CONST */
} mk_xinsn;

typedef struct {
    int n;         /* instructions; instruction i writes register MK_X_IN + i, the last
                      one is the result */
    int n_in;      /* operands read: registers 0 .. n_in - 1 (an op's: a, a and b, or a b c) */
    bool has_float_only; /* uses / or a function: not for integer dtypes */
    mk_xinsn insn[MK_EXPR_MAX];
} mk_expr;

/* Compiles `src`; fails with MK_ERR_INTERNAL naming the expression and the position. */
int mk_expr_compile(const char *src, mk_expr *out, mk_error **err);
/* Without changing a result bit: equal constants share a register, x > y ? x : y
 * becomes MK_X_MAX, dead instructions go (mk_expr_compile and fused groups). */
void mk_expr_tidy(mk_expr *e);
/* Appends program p to e, p's operand k read from e's register operands[k];
 * *result is e's register of p's result. False (e unchanged) when e would
 * pass MK_EXPR_MAX. How groups compose their members' programs. */
bool mk_expr_append(mk_expr *e, const mk_expr *p, const int *operands, int *result);

/* The program of a pointwise op's `expr` (compiled once per process), or NULL
 * for ops without one (ops.c). */
const mk_expr *mk_op_program(const struct mk_op *op);

#endif
