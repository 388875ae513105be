/*
 * error_test.c — error.c's paths that need malloc to fail: the static
 * out-of-memory error that mk_fail leaves when even the error cannot be
 * allocated. error.c is compiled into this test with malloc replaced (so the
 * library's copy of it is not the one linked); the rest of the library's
 * behaviour on errors is every other spec's.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool malloc_fails; /* the next mallocs of error.c return NULL */

static void *error_malloc(size_t n) { return malloc_fails ? NULL : malloc(n); }

#define malloc(n) error_malloc(n)
#include "../../core/error.c"
#undef malloc

#include "test.h"

/* An error made while malloc fails: the out-of-memory error, with its
 * message, kind and no position, whatever the failure was about; freeing it
 * does nothing, and a later error does not replace it. */
static void test_error_without_memory(void) {
    mk_error *err = NULL;
    malloc_fails = true;
    int rc = mk_fail(&err, MK_ERR_SHAPE, 3, 7, "shapes %d and %d", 2, 5);
    malloc_fails = false;
    CHECK(rc == -1, "mk_fail returned %d", rc);
    CHECK(err != NULL, "no error");
    if (!err) return;
    CHECK(mk_error_code_of(err) == MK_ERR_NOMEM, "code %d", (int)mk_error_code_of(err));
    CHECK(!strcmp(mk_error_message(err), "out of memory"), "message '%s'",
          mk_error_message(err));
    CHECK(mk_error_line(err) == 0 && mk_error_column(err) == 0, "at %d:%d", mk_error_line(err),
          mk_error_column(err));
    mk_error *first = err;
    mk_fail(&err, MK_ERR_NAME, 0, 0, "a second error");
    CHECK(err == first, "the first error was replaced");
    CHECK(mk_fail_within(&err, 1, 1, "while testing") == -1 && err == first,
          "mk_fail_within changed the out-of-memory error");
    mk_error_free(err); /* static: nothing to free, twice as harmless */
    mk_error_free(err);
    CHECK(!strcmp(mk_error_message(err), "out of memory"), "message after free '%s'",
          mk_error_message(err));
}

/* With memory, the same call makes a whole error: the failure path above is
 * the only one that gives the static error. */
static void test_error_with_memory(void) {
    mk_error *err = NULL;
    mk_fail(&err, MK_ERR_SHAPE, 3, 7, "shapes %d and %d", 2, 5);
    CHECK(err != NULL, "no error");
    if (!err) return;
    CHECK(mk_error_code_of(err) == MK_ERR_SHAPE, "code %d", (int)mk_error_code_of(err));
    CHECK(!strcmp(mk_error_message(err), "script:3:7: shape error: shapes 2 and 5"),
          "message '%s'", mk_error_message(err));
    CHECK(mk_error_line(err) == 3 && mk_error_column(err) == 7, "at %d:%d", mk_error_line(err),
          mk_error_column(err));
    mk_error_free(err);
    CHECK(!strcmp(mk_error_message(NULL), "no error"), "no error's message '%s'",
          mk_error_message(NULL));
}

int main(void) {
    RUN(test_error_without_memory);
    RUN(test_error_with_memory);
    return test_summary("error");
}
