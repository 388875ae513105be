/*
 * table.h — what table_test.c and table_exprs_test.c share: their context,
 * dtype shorthands, and small helpers to read op rows and build tensor infos.
 */
#ifndef MK_SPEC_TABLE_H
#define MK_SPEC_TABLE_H

#include "moonkaas.h"
#include "test.h"

#include <stdbool.h>

static mk_context *ctx;

#define F32 MK_DTYPE_FLOAT32
#define I64 MK_DTYPE_INT64

static int count_char(const char *s, char c) {
    int k = 0;
    for (; s && *s; s++)
        k += *s == c;
    return k;
}

static mk_tensor_info info(mk_dtype dt, int rank, const int64_t *shape) {
    mk_tensor_info t = {.dtype = dt, .rank = rank};
    memcpy(t.shape, shape, sizeof(int64_t) * (size_t)rank);
    return t;
}

#endif
