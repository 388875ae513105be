/*
 * safetensors.c — tensors in the safetensors format: read (small files into
 * memory, large ones mapped) and written (through file.c's writer).
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON, then
 * the data. The JSON is one object: "__metadata__" (string to string, kept
 * out of the tensor list) and, per tensor, {"dtype": "F32", "shape": [2, 3],
 * "data_offsets": [begin, end]} with offsets into the data. Reading checks
 * everything a file could get wrong, naming the file and the tensor: the
 * header's length and JSON, dtypes the dtype table has (F32, F16, BF16, I64, BOOL,
 * I8), shapes (rank 1 to MK_MAX_RANK once a scalar [] reads as [1]; element
 * counts within MK_MAX_NUMEL), offsets inside the file and matching the bytes
 * the shape needs, duplicate names, ranges that do not tile the data. A
 * reader is bounded by the buffer; it never reads past it, whatever the bytes.
 */
#include "graph.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_HEADER (100u << 20) /* the format's own limit on the JSON header */
#define MAX_DEPTH 16
/* Files up to this size are read into memory, larger ones mapped (moonkaas.h says why). */
#define MK_SAFETENSORS_READ_BYTES ((size_t)64 << 20)

static const struct {
    const char *name;
    mk_dtype dtype;
} dtypes[] = {{"F32", MK_DTYPE_FLOAT32}, {"F16", MK_DTYPE_FLOAT16}, {"BF16", MK_DTYPE_BFLOAT16},
              {"I64", MK_DTYPE_INT64},   {"I8", MK_DTYPE_INT8},     {"BOOL", MK_DTYPE_BOOL}};

typedef struct {
    char *name;
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    uint64_t begin, end; /* bytes from the start of the data */
} entry;

struct mk_safetensors {
    void *map; /* the whole file: mapped read-only, or (copied) read into memory */
    size_t size;
    bool copied;
    const unsigned char *data; /* after the header */
    size_t n, cap;
    entry *entries;
    char *path;
};

/* ---- a JSON reader, just enough for the header -------------------------------- */

typedef struct {
    const char *p, *end, *path;
    const char *tensor; /* the entry being read, for messages */
    mk_error **err;
} reader;

static int bad(reader *r, const char *what) {
    return mk_fail(r->err, MK_ERR_FILE, 0, 0, "%s: the safetensors header%s%s%s: %s", r->path,
                   r->tensor ? " (tensor '" : "", r->tensor ? r->tensor : "",
                   r->tensor ? "')" : "", what);
}

static void space(reader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static bool take(reader *r, char c) {
    space(r);
    if (r->p < r->end && *r->p == c) {
        r->p++;
        return true;
    }
    return false;
}

static int hex4(reader *r, unsigned *out) {
    if (r->end - r->p < 4) return bad(r, "a \\u escape is cut short");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = r->p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return bad(r, "a \\u escape is not 4 hex digits");
        v = v * 16 + (unsigned)d;
    }
    r->p += 4;
    *out = v;
    return 0;
}

/* A string into a new NUL-terminated buffer (UTF-8; escapes decoded). */
static int string(reader *r, char **out) {
    *out = NULL;
    if (!take(r, '"')) return bad(r, "expected a string");
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    if (!s) return mk_fail(r->err, MK_ERR_NOMEM, 0, 0, "reading %s", r->path);
    for (;;) {
        if (r->p >= r->end) {
            free(s);
            return bad(r, "a string does not end");
        }
        unsigned c = (unsigned char)*r->p++;
        bool decoded = false; /* from a \u escape: written as UTF-8 */
        if (c == '"') break;
        if (c < 0x20) {
            free(s);
            return bad(r, "a control character inside a string");
        }
        if (c == '\\') {
            if (r->p >= r->end) {
                free(s);
                return bad(r, "a string does not end");
            }
            char e = *r->p++;
            const char *simple = strchr("\"\\/bfnrt", e);
            if (simple && e) {
                c = (unsigned char)"\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            } else if (e == 'u') {
                if (hex4(r, &c)) {
                    free(s);
                    return -1;
                }
                if (c >= 0xd800 && c < 0xdc00) { /* a surrogate pair */
                    unsigned lo;
                    if (r->end - r->p < 2 || r->p[0] != '\\' || r->p[1] != 'u') {
                        free(s);
                        return bad(r, "a lone surrogate in a \\u escape");
                    }
                    r->p += 2;
                    if (hex4(r, &lo) || lo < 0xdc00 || lo >= 0xe000) {
                        free(s);
                        return *r->err ? -1 : bad(r, "a lone surrogate in a \\u escape");
                    }
                    c = 0x10000 + ((c - 0xd800) << 10) + (lo - 0xdc00);
                } else if (c >= 0xdc00 && c < 0xe000) {
                    free(s);
                    return bad(r, "a lone surrogate in a \\u escape");
                }
                if (c == 0) {
                    free(s);
                    return bad(r, "a NUL character in a name");
                }
                decoded = true;
            } else {
                free(s);
                return bad(r, "an unknown escape in a string");
            }
        }
        /* room for up to 4 UTF-8 bytes and the NUL */
        if (n + 5 > cap) {
            char *grown = realloc(s, cap *= 2);
            if (!grown) {
                free(s);
                return mk_fail(r->err, MK_ERR_NOMEM, 0, 0, "reading %s", r->path);
            }
            s = grown;
        }
        if (!decoded || c < 0x80) {
            s[n++] = (char)c; /* as the file has it (UTF-8 bytes pass through) */
        } else if (c < 0x800) {
            s[n++] = (char)(0xc0 | c >> 6), s[n++] = (char)(0x80 | (c & 0x3f));
        } else if (c < 0x10000) {
            s[n++] = (char)(0xe0 | c >> 12), s[n++] = (char)(0x80 | (c >> 6 & 0x3f));
            s[n++] = (char)(0x80 | (c & 0x3f));
        } else {
            s[n++] = (char)(0xf0 | c >> 18), s[n++] = (char)(0x80 | (c >> 12 & 0x3f));
            s[n++] = (char)(0x80 | (c >> 6 & 0x3f)), s[n++] = (char)(0x80 | (c & 0x3f));
        }
    }
    s[n] = '\0';
    *out = s;
    return 0;
}

/* A non-negative integer (what shapes and offsets are). */
static int integer(reader *r, uint64_t *out) {
    space(r);
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return bad(r, "expected a whole number");
    uint64_t v = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        if (v > (UINT64_MAX - 9) / 10) return bad(r, "a number too large");
        v = v * 10 + (uint64_t)(*r->p++ - '0');
    }
    if (r->p < r->end && (*r->p == '.' || *r->p == 'e' || *r->p == 'E'))
        return bad(r, "expected a whole number");
    *out = v;
    return 0;
}

/* Skips any JSON value (the metadata's), at most MAX_DEPTH deep. */
static int skip_value(reader *r, int depth) {
    if (depth > MAX_DEPTH) return bad(r, "nested too deeply");
    space(r);
    if (r->p >= r->end) return bad(r, "a value is missing");
    char c = *r->p;
    if (c == '"') {
        char *s;
        if (string(r, &s)) return -1;
        free(s);
        return 0;
    }
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        r->p++;
        if (take(r, close)) return 0;
        do {
            if (c == '{') {
                char *k;
                if (string(r, &k)) return -1;
                free(k);
                if (!take(r, ':')) return bad(r, "expected ':'");
            }
            if (skip_value(r, depth + 1)) return -1;
        } while (take(r, ','));
        return take(r, close) ? 0 : bad(r, "expected ',' or the end of a list");
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(r->end - r->p) >= n && !memcmp(r->p, words[i], n)) {
            r->p += n;
            return 0;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        r->p++;
        while (r->p < r->end && strchr("0123456789.eE+-", *r->p)) r->p++;
        return 0;
    }
    return bad(r, "expected a value");
}

/* [n, n, ...] into out (at most `most`); its length in *count. */
static int int_list(reader *r, uint64_t *out, int most, int *count, const char *what) {
    *count = 0;
    if (!take(r, '[')) return bad(r, what);
    if (take(r, ']')) return 0;
    do {
        if (*count == most) return bad(r, what);
        if (integer(r, &out[(*count)++])) return -1;
    } while (take(r, ','));
    return take(r, ']') ? 0 : bad(r, what);
}

/* One tensor's object: dtype, shape and data_offsets, each once. */
static int tensor_entry(reader *r, entry *e) {
    bool have_dtype = false, have_shape = false, have_offsets = false;
    if (!take(r, '{')) return bad(r, "expected {\"dtype\", \"shape\", \"data_offsets\"}");
    bool empty = take(r, '}');
    if (!empty) do {
        char *key;
        if (string(r, &key)) return -1;
        if (!take(r, ':')) {
            free(key);
            return bad(r, "expected ':'");
        }
        int rc = 0;
        if (!strcmp(key, "dtype") && !have_dtype) {
            char *name;
            have_dtype = true;
            if ((rc = string(r, &name)) == 0) {
                size_t i = 0;
                while (i < sizeof dtypes / sizeof dtypes[0] && strcmp(dtypes[i].name, name)) i++;
                if (i == sizeof dtypes / sizeof dtypes[0]) {
                    char what[128];
                    snprintf(what, sizeof what, "dtype %.40s is not one moonkaas has "
                             "(F32, F16, BF16, I64, I8, BOOL)", name);
                    rc = bad(r, what);
                } else {
                    e->dtype = dtypes[i].dtype;
                }
                free(name);
            }
        } else if (!strcmp(key, "shape") && !have_shape) {
            uint64_t dims[MK_MAX_RANK];
            have_shape = true;
            rc = int_list(r, dims, MK_MAX_RANK, &e->rank, "shape must be a list of at most 6 "
                                                           "whole numbers");
            for (int k = 0; !rc && k < e->rank; k++) {
                if (dims[k] == 0 || dims[k] > (uint64_t)MK_MAX_NUMEL)
                    rc = bad(r, "a dimension is 0 or too large (moonkaas has no empty tensors)");
                else
                    e->shape[k] = (int64_t)dims[k];
            }
            if (!rc && e->rank == 0) e->rank = 1, e->shape[0] = 1; /* a scalar */
        } else if (!strcmp(key, "data_offsets") && !have_offsets) {
            uint64_t off[2];
            int n;
            have_offsets = true;
            rc = int_list(r, off, 2, &n, "data_offsets must be [begin, end]");
            if (!rc && n != 2) rc = bad(r, "data_offsets must be [begin, end]");
            e->begin = off[0], e->end = off[1];
        } else {
            char what[96];
            snprintf(what, sizeof what, "unexpected or repeated key '%.40s'", key);
            rc = bad(r, what);
        }
        free(key);
        if (rc) return -1;
    } while (take(r, ','));
    if (!empty && !take(r, '}')) return bad(r, "expected ',' or '}'");
    if (!have_dtype || !have_shape || !have_offsets)
        return bad(r, "each tensor needs dtype, shape and data_offsets");
    return 0;
}

static void entries_free(mk_safetensors *st) {
    for (size_t i = 0; i < st->n; i++) free(st->entries[i].name);
    free(st->entries);
    st->entries = NULL;
    st->n = st->cap = 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* No name twice: sorted, so a header of a million names is not a trillion
 * comparisons. */
static int unique(mk_safetensors *st, reader *r) {
    const char **names = malloc(sizeof *names * (st->n ? st->n : 1));
    if (!names) return mk_fail(r->err, MK_ERR_NOMEM, 0, 0, "reading %s", st->path);
    for (size_t i = 0; i < st->n; i++) names[i] = st->entries[i].name;
    qsort(names, st->n, sizeof *names, by_name);
    const char *twice = NULL;
    for (size_t i = 1; i < st->n && !twice; i++)
        if (!strcmp(names[i - 1], names[i])) twice = names[i];
    r->tensor = twice;
    free(names);
    return twice ? bad(r, "the name is used twice") : 0;
}

typedef struct {
    uint64_t begin, end;
    const char *name;
} range;

static int by_begin(const void *a, const void *b) {
    const range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* The tensors' byte ranges tile the data, as the format requires: no two
 * overlap, none repeats another, no byte between them or after the last one
 * belongs to no tensor (a reader of one tensor could otherwise be handed bytes
 * a writer meant as another's, or hidden data). */
static int tiled(mk_safetensors *st, uint64_t data_size, reader *r) {
    range *rs = malloc(sizeof *rs * (st->n ? st->n : 1));
    if (!rs) return mk_fail(r->err, MK_ERR_NOMEM, 0, 0, "reading %s", st->path);
    for (size_t i = 0; i < st->n; i++)
        rs[i] = (range){st->entries[i].begin, st->entries[i].end, st->entries[i].name};
    qsort(rs, st->n, sizeof *rs, by_begin);
    char what[400];
    what[0] = '\0';
    uint64_t at = 0; /* where the bytes read so far end */
    for (size_t i = 0; i < st->n && !what[0]; i++) {
        if (rs[i].begin < at)
            snprintf(what, sizeof what, "tensors '%.100s' [%llu, %llu) and '%.100s' [%llu, %llu) "
                     "%s", rs[i - 1].name, (unsigned long long)rs[i - 1].begin,
                     (unsigned long long)rs[i - 1].end, rs[i].name,
                     (unsigned long long)rs[i].begin, (unsigned long long)rs[i].end,
                     rs[i].begin == rs[i - 1].begin && rs[i].end == rs[i - 1].end
                         ? "share the same bytes" : "overlap");
        else if (rs[i].begin > at)
            snprintf(what, sizeof what, "bytes [%llu, %llu) %s%.100s%s tensor '%.100s' belong to "
                     "no tensor", (unsigned long long)at, (unsigned long long)rs[i].begin,
                     i ? "between tensor '" : "before the first", i ? rs[i - 1].name : "",
                     i ? "' and" : "", rs[i].name);
        at = rs[i].end;
    }
    if (!what[0] && at != data_size)
        snprintf(what, sizeof what, "%llu bytes after %s%.100s%s belong to no tensor",
                 (unsigned long long)(data_size - at), st->n ? "the last tensor '" : "the header",
                 st->n ? rs[st->n - 1].name : "", st->n ? "'" : "");
    free(rs);
    if (!what[0]) return 0;
    r->tensor = NULL;
    return bad(r, what);
}

/* Reads the header of the file's bytes into st's entries, checking each against the data. */
static int parse(mk_safetensors *st, const unsigned char *file, size_t size, mk_error **err) {
    reader r = {.path = st->path, .err = err};
    if (size < 8) return bad(&r, "the file is shorter than the 8-byte header length");
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | file[i];
    if (n < 2 || n > MAX_HEADER || n > size - 8) {
        char what[120];
        snprintf(what, sizeof what, "its length %llu does not fit a file of %zu bytes (at most "
                 "100 MiB)", (unsigned long long)n, size);
        return bad(&r, what);
    }
    r.p = (const char *)file + 8;
    r.end = r.p + n;
    st->data = file + 8 + n;
    uint64_t data_size = size - 8 - n;
    if (!take(&r, '{')) return bad(&r, "it is not a JSON object");
    bool empty = take(&r, '}');
    if (!empty) do {
        char *name;
        if (string(&r, &name)) return -1;
        if (!take(&r, ':')) {
            free(name);
            return bad(&r, "expected ':'");
        }
        if (!strcmp(name, "__metadata__")) {
            free(name);
            if (skip_value(&r, 0)) return -1;
            continue;
        }
        if (st->n == st->cap) {
            size_t cap = st->cap ? 2 * st->cap : 16;
            entry *grown = realloc(st->entries, sizeof *grown * cap);
            if (!grown) {
                free(name);
                return mk_fail(err, MK_ERR_NOMEM, 0, 0, "reading %s", st->path);
            }
            st->entries = grown, st->cap = cap;
        }
        entry *e = &st->entries[st->n++];
        *e = (entry){.name = name};
        r.tensor = name;
        if (tensor_entry(&r, e)) return -1;
        int64_t numel = mk_shape_numel(e->rank, e->shape);
        if (!numel) return bad(&r, "its shape has more than 2^48 elements");
        uint64_t bytes = (uint64_t)numel * mk_dtype_size(e->dtype);
        if (e->begin > e->end || e->end > data_size) {
            char what[160];
            snprintf(what, sizeof what, "data_offsets [%llu, %llu] are outside the %llu bytes "
                     "of data", (unsigned long long)e->begin, (unsigned long long)e->end,
                     (unsigned long long)data_size);
            return bad(&r, what);
        }
        if (e->end - e->begin != bytes) {
            char what[160];
            snprintf(what, sizeof what, "data_offsets hold %llu bytes, the shape needs %llu",
                     (unsigned long long)(e->end - e->begin), (unsigned long long)bytes);
            return bad(&r, what);
        }
        r.tensor = NULL;
    } while (take(&r, ','));
    if (!empty && !take(&r, '}')) return bad(&r, "expected ',' or '}'");
    space(&r);
    if (r.p != r.end) return bad(&r, "text after the JSON object");
    return unique(st, &r) || tiled(st, data_size, &r) ? -1 : 0;
}

/* ---- the C API ------------------------------------------------------------------- */

int mk_safetensors_parse_buffer(const void *file, size_t size, size_t *count, mk_error **err) {
    mk_safetensors st = {.path = "buffer"};
    int rc = parse(&st, file, size, err);
    *count = st.n;
    entries_free(&st);
    return rc;
}

/* The whole file into memory, as much of it as a read gets (a file truncated
 * meanwhile reads shorter, and its header then no longer fits). */
static void *read_whole(int fd, size_t size, size_t *got) {
    char *buf = malloc(size ? size : 1);
    *got = 0;
    if (!buf) return NULL;
    while (*got < size) {
        ssize_t k = read(fd, buf + *got, size - *got);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        *got += (size_t)k;
    }
    return buf;
}

static mk_safetensors *open_file(const char *path, bool copy, mk_error **err) {
    if (!path) {
        mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_safetensors_open: NULL path");
        return NULL;
    }
    mk_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "opening %s", path);
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO does not hang the open */
    struct stat info;
    if (fd < 0 || fstat(fd, &info) != 0) {
        mk_fail(err, MK_ERR_FILE, 0, 0, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(info.st_mode)) {
        mk_fail(err, MK_ERR_FILE, 0, 0, "%s: not a regular file", path);
        goto fail;
    }
    size_t size = (size_t)info.st_size;
    if (copy || size <= MK_SAFETENSORS_READ_BYTES) {
        if (!(st->map = read_whole(fd, size, &st->size))) {
            mk_fail(err, MK_ERR_NOMEM, 0, 0, "reading %s (%zu bytes)", path, size);
            goto fail;
        }
        st->copied = true;
    } else {
        void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            mk_fail(err, MK_ERR_FILE, 0, 0, "%s: mmap: %s", path, strerror(errno));
            goto fail;
        }
        st->map = map;
        st->size = size;
    }
    close(fd);
    fd = -1;
    if (parse(st, st->map, st->size, err)) goto fail;
    return st;
fail:
    if (fd >= 0) close(fd);
    mk_safetensors_close(st);
    return NULL;
}

MK_API mk_safetensors *mk_safetensors_open(const char *path, mk_error **err) {
    return open_file(path, false, err);
}

MK_API mk_safetensors *mk_safetensors_open_copy(const char *path, mk_error **err) {
    return open_file(path, true, err);
}

MK_API size_t mk_safetensors_count(const mk_safetensors *st) { return st ? st->n : 0; }

MK_API int mk_safetensors_tensor(const mk_safetensors *st, size_t i, mk_tensor_info *info,
                                 const void **data, size_t *bytes) {
    if (!st || i >= st->n) return -1;
    const entry *e = &st->entries[i];
    if (info) {
        *info = (mk_tensor_info){.name = e->name, .dtype = e->dtype, .rank = e->rank};
        memcpy(info->shape, e->shape, sizeof e->shape);
    }
    if (data) *data = st->data + e->begin;
    if (bytes) *bytes = (size_t)(e->end - e->begin);
    return 0;
}

MK_API void mk_safetensors_close(mk_safetensors *st) {
    if (!st) return;
    if (st->copied) free(st->map);
    else if (st->map) munmap(st->map, st->size);
    entries_free(st);
    free(st->path);
    free(st);
}

/* name as a JSON string */
static void put_json_string(mk_strbuf *b, const char *s) {
    mk_strbuf_put(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') mk_strbuf_put(b, "\\%c", *p);
        else if (*p < 0x20) mk_strbuf_put(b, "\\u%04x", *p);
        else mk_strbuf_put(b, "%c", *p);
    }
    mk_strbuf_put(b, "\"");
}

MK_API int mk_safetensors_save(const char *path, const mk_tensor_info *infos,
                               const void *const *data, size_t n, mk_error **err) {
    if (!path || (n && (!infos || !data)))
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_safetensors_save: NULL argument");
    mk_strbuf b = {0};
    uint64_t offset = 0;
    mk_strbuf_put(&b, "{");
    for (size_t i = 0; i < n; i++) {
        const mk_tensor_info *t = &infos[i];
        const char *code = NULL;
        for (size_t k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
            if (dtypes[k].dtype == t->dtype) code = dtypes[k].name;
        int64_t numel = t->rank >= 1 && t->rank <= MK_MAX_RANK ? mk_shape_numel(t->rank, t->shape) : 0;
        if (!t->name || !code || !numel || !data[i]) {
            free(b.s);
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "%s: tensor %zu ('%s') is not one "
                           "safetensors can hold here (a name, a dtype the format names, a "
                           "shape, data)", path, i, t->name ? t->name : "");
        }
        uint64_t bytes = (uint64_t)numel * mk_dtype_size(t->dtype);
        mk_strbuf_put(&b, "%s", i ? "," : "");
        put_json_string(&b, t->name);
        mk_strbuf_put(&b, ":{\"dtype\":\"%s\",\"shape\":[", code);
        for (int k = 0; k < t->rank; k++)
            mk_strbuf_put(&b, "%s%lld", k ? "," : "", (long long)t->shape[k]);
        mk_strbuf_put(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                      (unsigned long long)(offset + bytes));
        offset += bytes;
    }
    /* no name twice (sorted: n log n, where pairs were n^2) */
    const char **names = malloc(sizeof *names * (n ? n : 1));
    if (!names) {
        free(b.s);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "writing %s", path);
    }
    for (size_t i = 0; i < n; i++) names[i] = infos[i].name;
    qsort(names, n, sizeof *names, by_name);
    for (size_t i = 1; i < n; i++)
        if (!strcmp(names[i - 1], names[i])) {
            int rc = mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "%s: the name '%s' is used twice", path,
                             names[i]);
            free(names);
            free(b.s);
            return rc;
        }
    free(names);
    mk_strbuf_put(&b, "}");
    while (!b.failed && b.len % 8) mk_strbuf_put(&b, " "); /* data 8-byte aligned */
    if (b.failed) {
        free(b.s);
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "writing %s", path);
    }
    mk_file_writer *w = mk_file_begin(path, 0666, err);
    if (!w) {
        free(b.s);
        return -1;
    }
    unsigned char len[8];
    for (int k = 0; k < 8; k++) len[k] = (unsigned char)((uint64_t)b.len >> (8 * k));
    int rc = mk_file_put(w, len, 8, err) || mk_file_put(w, b.s, b.len, err) ? -1 : 0;
    for (size_t i = 0; !rc && i < n; i++) {
        size_t bytes = (size_t)mk_shape_numel(infos[i].rank, infos[i].shape) *
                       mk_dtype_size(infos[i].dtype);
        rc = mk_file_put(w, data[i], bytes, err);
    }
    free(b.s);
    if (rc) {
        mk_file_abort(w);
        return -1;
    }
    return mk_file_commit(w, err);
}
