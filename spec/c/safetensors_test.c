/*
 * safetensors_test.c — safetensors through the C API (core/moonkaas.h):
 *
 *   test_round_trip      float32, int64 and int8 tensors saved, opened, read in place
 *   test_bad_files       a missing file, a truncated one, bad arguments to save
 *   test_mutations       every one-byte change and every truncation of a valid file
 *                        opens or fails with MK_ERR_FILE, never reading past the
 *                        bytes it was given (mk_safetensors_parse_buffer over an
 *                        exact-size copy, so ASan sees any overrun)
 */
#include "graph.h"
#include "test.h"

#include <unistd.h>

static char path[64];

static void make_path(void) {
    snprintf(path, sizeof path, "/tmp/mk_safetensors_%ld.safetensors", (long)getpid());
}

static void test_round_trip(void) {
    float f[6];
    int64_t i[3] = {-1, 1LL << 40, 7};
    int8_t b[5] = {-128, 0, 1, 2, 127};
    for (int k = 0; k < 6; k++) f[k] = (float)test_uniform(-10, 10);
    mk_tensor_info infos[3] = {{.name = "f", .dtype = MK_DTYPE_FLOAT32, .rank = 2, .shape = {2, 3}},
                               {.name = "i", .dtype = MK_DTYPE_INT64, .rank = 1, .shape = {3}},
                               {.name = "b\"q", .dtype = MK_DTYPE_INT8, .rank = 1, .shape = {5}}};
    const void *data[3] = {f, i, b};
    mk_error *err = NULL;
    CHECK(mk_safetensors_save(path, infos, data, 3, &err) == 0, "save: %s", mk_error_message(err));
    mk_safetensors *st = mk_safetensors_open(path, &err);
    CHECK(st != NULL, "open: %s", mk_error_message(err));
    if (!st) return;
    CHECK(mk_safetensors_count(st) == 3, "count %zu", mk_safetensors_count(st));
    for (size_t k = 0; k < 3 && k < mk_safetensors_count(st); k++) {
        mk_tensor_info info;
        const void *d;
        size_t bytes;
        CHECK(mk_safetensors_tensor(st, k, &info, &d, &bytes) == 0, "tensor %zu", k);
        CHECK(!strcmp(info.name, infos[k].name) && info.dtype == infos[k].dtype &&
                  info.rank == infos[k].rank &&
                  !memcmp(info.shape, infos[k].shape, sizeof(int64_t) * (size_t)info.rank),
              "tensor %zu: %s", k, info.name);
        size_t want = (size_t)mk_shape_numel(info.rank, info.shape) * mk_dtype_size(info.dtype);
        CHECK(bytes == want && !memcmp(d, data[k], want), "tensor %zu's bytes", k);
    }
    CHECK(mk_safetensors_tensor(st, 3, NULL, NULL, NULL) == -1, "tensor 3 exists");
    mk_safetensors_close(st);
    mk_error_free(err);
}

static void expect_file_error(mk_error *err, const char *what, const char *fragment) {
    CHECK(err && mk_error_code_of(err) == MK_ERR_FILE && strstr(mk_error_message(err), fragment),
          "%s: %s", what, mk_error_message(err));
    mk_error_free(err);
}

static void test_bad_files(void) {
    mk_error *err = NULL;
    CHECK(mk_safetensors_open("/nonexistent/x.safetensors", &err) == NULL, "opened");
    expect_file_error(err, "missing", "No such file");
    err = NULL;
    FILE *f = fopen(path, "wb");
    fwrite("\x10\0\0\0\0\0\0\0{\"w\"", 1, 12, f);
    fclose(f);
    CHECK(mk_safetensors_open(path, &err) == NULL, "opened a truncated file");
    expect_file_error(err, "truncated", "does not fit a file of 12 bytes");
    err = NULL;
    mk_tensor_info bad = {.name = "w", .dtype = MK_DTYPE_FLOAT32, .rank = 0};
    const void *data[1] = {&bad};
    CHECK(mk_safetensors_save(path, &bad, data, 1, &err) == -1 &&
              mk_error_code_of(err) == MK_ERR_ARGUMENT,
          "rank 0 saved: %s", mk_error_message(err));
    mk_error_free(err);
    err = NULL;
    CHECK(mk_safetensors_save(NULL, NULL, NULL, 0, &err) == -1, "NULL path saved");
    mk_error_free(err);
}

/* The file's bytes in a buffer of exactly `size` (ASan guards its end). */
static int parse_exact(const unsigned char *bytes, size_t size, size_t *count, mk_error **err) {
    unsigned char *copy = malloc(size ? size : 1);
    memcpy(copy, bytes, size);
    int rc = mk_safetensors_parse_buffer(copy, size, count, err);
    free(copy);
    return rc;
}

static void test_mutations(void) {
    float f[4] = {1, 2, 3, 4};
    int64_t i[1] = {5};
    mk_tensor_info infos[2] = {{.name = "weight.a", .dtype = MK_DTYPE_FLOAT32, .rank = 2, .shape = {2, 2}},
                               {.name = "id", .dtype = MK_DTYPE_INT64, .rank = 1, .shape = {1}}};
    const void *data[2] = {f, i};
    mk_error *err = NULL;
    CHECK(mk_safetensors_save(path, infos, data, 2, &err) == 0, "save: %s", mk_error_message(err));
    FILE *fp = fopen(path, "rb");
    unsigned char bytes[512];
    size_t size = fp ? fread(bytes, 1, sizeof bytes, fp) : 0;
    if (fp) fclose(fp);
    size_t count = 0;
    CHECK(parse_exact(bytes, size, &count, &err) == 0 && count == 2, "the valid file: %s",
          mk_error_message(err));
    int opened = 0, refused = 0;
    for (size_t n = 0; n < size; n++) { /* every truncation */
        mk_error *e = NULL;
        if (parse_exact(bytes, n, &count, &e) == 0) opened++;
        else refused += e && mk_error_code_of(e) == MK_ERR_FILE;
        mk_error_free(e);
    }
    CHECK(refused == (int)size, "%d of %zu truncations refused as file errors", refused, size);
    static const unsigned char values[] = {0, '"', '\\', '{', '}', '[', ']', ',', ':', '9', 'u',
                                           0x80, 0xff, ' '};
    refused = opened = 0;
    for (size_t at = 0; at < size; at++) /* one byte changed, everywhere, many ways */
        for (size_t v = 0; v < sizeof values; v++) {
            unsigned char copy[512];
            memcpy(copy, bytes, size);
            copy[at] = values[v];
            mk_error *e = NULL;
            if (parse_exact(copy, size, &count, &e) == 0) opened++;
            else refused += e && mk_error_code_of(e) == MK_ERR_FILE;
            mk_error_free(e);
        }
    printf("#   one-byte changes: %d open, %d refused as file errors\n", opened, refused);
    CHECK(opened + refused == (int)(size * sizeof values), "an error other than a file error");
    mk_error_free(err);
}

int main(void) {
    test_srand(test_seed());
    make_path();
    RUN(test_round_trip);
    RUN(test_bad_files);
    RUN(test_mutations);
    remove(path);
    return test_summary("safetensors");
}
