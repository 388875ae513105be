/*
 * expr.h — pointwise expressions: an op row's scalar expression compiled once
 * to a straight-line program that every device runs (expr.c).
 */
#ifndef MK_EXPR_H
#define MK_EXPR_H

#include "graph.h"

/* ---- pointwise expressions (expr.c) ------------------------------------------ */

/*
 * A pointwise op's scalar expression (its row's `expr`, C syntax over a and b:
 * numbers, + - * /, unary -, < >, ?:, parentheses, expf tanhf sqrtf) compiled
 * to a straight-line program over registers. Registers 0 and 1 are a and b (a
 * fused group's program reads up to MK_X_IN operands); every instruction
 * writes a new register, the last one is the result. Each device
 * runs the program as it likes (the CPU over tiles, CUDA per element); a code
 * generator may print the expression itself instead. Evaluated in the
 * operands' dtype (float32 or int64; integer + - * wrap around), one rounding
 * per operation, so the result equals the C expression compiled without
 * contraction.
 */
typedef enum {
    MK_X_CONST, /* r[dst] = k */
    MK_X_NEG, MK_X_EXP, MK_X_TANH, MK_X_SQRT,                   /* r[dst] = f(r[x]) */
    MK_X_ADD, MK_X_SUB, MK_X_MUL, MK_X_DIV, MK_X_GT, MK_X_LT,   /* r[dst] = r[x] op r[y] */
    MK_X_SELECT,                                                /* r[dst] = r[x] ? r[y] : r[z] */
    MK_X_MAX,   /* r[dst] = r[x] > r[y] ? r[x] : r[y] (what "a > 0 ? a : 0" compiles to) */
} mk_xop;

#define MK_EXPR_MAX 32          /* instructions */
#define MK_X_IN 4               /* registers 0 .. MK_X_IN - 1 are the operands a, b, ... */

typedef struct {
    unsigned char op, x, y, z; /* mk_xop, operand registers */
    double k;                  /* MK_X_CONST */
} mk_xinsn;

typedef struct {
    int n;         /* instructions; instruction i writes register MK_X_IN + i, the last
                      one is the result */
    int n_in;      /* operands read: registers 0 .. n_in - 1 (an op's: a, or a and b) */
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
