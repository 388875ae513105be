/*
 * error.c — errors as values, and the small facts every stage asks for
 * (version, build, the string builder, clocks).
 */
#include "graph.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The kind prefix that callers and specs match on. */
static const char *kind_of(mk_error_code code) {
    switch (code) {
    case MK_ERR_SYNTAX: return "syntax error";
    case MK_ERR_SHAPE: return "shape error";
    case MK_ERR_DTYPE: return "dtype error";
    case MK_ERR_NAME: return "name error";
    case MK_ERR_ARGUMENT: return "argument error";
    case MK_ERR_INPUT: return "input error";
    case MK_ERR_EVAL: return "evaluation error";
    case MK_ERR_NOMEM: return "out of memory";
    case MK_ERR_DEVICE: return "device error";
    case MK_ERR_INTERNAL: return "internal error";
    case MK_ERR_NO_DEVICE: return "no CUDA device";
    case MK_ERR_FILE: return "file error";
    case MK_ERR_CANCELLED: return "cancelled";
    case MK_ERR_BUSY: return "busy";
    }
    return "error";
}

/* Kept for the case where even the error cannot be allocated. Its message is
 * mk_error_message's, not in the struct: a struct with a flexible array member
 * followed by the text's room (a GNU extension) left the message in the
 * padding before that room, an empty string. */
static mk_error out_of_memory = {MK_ERR_NOMEM, 0, 0, true};
#define OUT_OF_MEMORY "out of memory"

int mk_failv(mk_error **err, mk_error_code code, int line, int column, const char *fmt,
             va_list ap) {
    if (!err || *err) return -1; /* the first error is the one that explains */
    char where[64] = "";
    if (line > 0) snprintf(where, sizeof where, "script:%d:%d: ", line, column);
    char body[1024];
    vsnprintf(body, sizeof body, fmt, ap);
    size_t n = strlen(where) + strlen(kind_of(code)) + 2 + strlen(body) + 1;
    mk_error *e = malloc(sizeof *e + n);
    if (!e) {
        *err = &out_of_memory;
        return -1;
    }
    e->code = code;
    e->line = line;
    e->column = column;
    e->is_static = false;
    snprintf(e->message, n, "%s%s: %s", where, kind_of(code), body);
    *err = e;
    return -1;
}

int mk_fail(mk_error **err, mk_error_code code, int line, int column, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mk_failv(err, code, line, column, fmt, ap);
    va_end(ap);
    return -1;
}

int mk_cancelled(mk_error **err, const char *what) {
    return mk_fail(err, MK_ERR_CANCELLED, 0, 0, "the %s was cancelled (mk_context_cancel)", what);
}

int mk_fail_within(mk_error **err, int line, int column, const char *fmt, ...) {
    mk_error *e = err ? *err : NULL;
    if (!e || e->is_static) return -1;
    const char *kind = kind_of(e->code), *body = strstr(e->message, kind);
    body = body ? body + strlen(kind) + 2 : e->message; /* after "kind: " */
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    *err = NULL;
    mk_fail(err, e->code, e->line ? e->line : line, e->line ? e->column : column, "%s: %s",
            what, body);
    mk_error_free(e);
    return -1;
}

MK_API const char *mk_error_message(const mk_error *e) {
    return !e ? "no error" : e->is_static ? OUT_OF_MEMORY : e->message;
}
MK_API mk_error_code mk_error_code_of(const mk_error *e) { return e ? e->code : 0; }
MK_API int mk_error_line(const mk_error *e) { return e ? e->line : 0; }
MK_API int mk_error_column(const mk_error *e) { return e ? e->column : 0; }

MK_API void mk_error_free(mk_error *e) {
    if (e && !e->is_static) free(e);
}

MK_API void mk_string_free(char *s) { free(s); }

#define MK_STR2(x) #x
#define MK_STR(x) MK_STR2(x)
MK_API const char *mk_version(void) {
    return MK_STR(MK_VERSION_MAJOR) "." MK_STR(MK_VERSION_MINOR) "." MK_STR(MK_VERSION_PATCH);
}

/* What this build made: the CPU always; the CUDA plugin where it was built
 * (it is opened only when CUDA is asked for: mk_cuda_available says if it loads). */
MK_API const char *mk_build_info(void) {
#if defined(MK_WITH_CUDA) && defined(MK_WITH_CUDNN)
    return "cpu (OpenMP, OpenBLAS), cuda plugin (cuBLAS, cuDNN)";
#elif defined(MK_WITH_CUDA)
    return "cpu (OpenMP, OpenBLAS), cuda plugin (cuBLAS; built without cuDNN)";
#else
    return "cpu (OpenMP, OpenBLAS)";
#endif
}

void mk_strbuf_putv(mk_strbuf *b, const char *fmt, va_list ap) {
    if (b->failed) return;
    va_list again;
    va_copy(again, ap);
    int k = vsnprintf(NULL, 0, fmt, ap);
    if (k < 0) {
        b->failed = true;
        va_end(again);
        return;
    }
    size_t need = b->len + (size_t)k + 1;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < need) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = true;
            va_end(again);
            return;
        }
        b->s = s;
        b->cap = cap;
    }
    vsnprintf(b->s + b->len, (size_t)k + 1, fmt, again);
    va_end(again);
    b->len += (size_t)k;
}

void mk_strbuf_put(mk_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    mk_strbuf_putv(b, fmt, ap);
    va_end(ap);
}

double mk_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
