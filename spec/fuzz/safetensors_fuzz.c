/*
 * safetensors_fuzz.c — the safetensors reader on arbitrary bytes.
 *
 * The input is a whole file. mk_safetensors_parse_buffer reads it from an
 * exact-size copy (ASan sees any read past it); it must open or fail with
 * MK_ERR_FILE. Where it opens, the bytes go to a file that mk_safetensors_open
 * maps, every tensor's bytes are read, and mk_safetensors_save writes them to
 * a second file that must open to the same names, dtypes, shapes and bytes.
 *
 *     make fuzz                                  (all targets)
 *     build-fuzz/fuzz/safetensors_fuzz -max_total_time=60 build-fuzz/corpus/safetensors_fuzz
 * Seeds: build-fuzz/seeds/safetensors_fuzz/ (spec/fuzz/seeds.lua writes them).
 */
#include "fuzz.h"

#include <unistd.h>

int mk_safetensors_parse_buffer(const void *file, size_t size, size_t *count, mk_error **err);

static void write_all(const char *path, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) FUZZ_FINDING("cannot write %s", path);
    if (size && fwrite(data, 1, size, f) != size) FUZZ_FINDING("cannot write %s", path);
    fclose(f);
}

/* Opens path and checks each tensor's bytes can be read; the file, or aborts. */
static mk_safetensors *open_all(const char *path, unsigned *sum) {
    mk_error *err = NULL;
    mk_safetensors *st = mk_safetensors_open(path, &err);
    if (!st) FUZZ_FINDING("a file the buffer reader accepted does not open: %s",
                          mk_error_message(err));
    for (size_t i = 0; i < mk_safetensors_count(st); i++) {
        const void *data;
        size_t bytes;
        if (mk_safetensors_tensor(st, i, NULL, &data, &bytes)) FUZZ_FINDING("tensor %zu", i);
        for (size_t k = 0; k < bytes; k++) *sum += ((const unsigned char *)data)[k];
    }
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    size_t count = 0;
    mk_error *err = NULL;
    int rc = mk_safetensors_parse_buffer(copy, size, &count, &err);
    free(copy);
    if (rc) {
        if (!err || mk_error_code_of(err) != MK_ERR_FILE)
            FUZZ_FINDING("refused without a file error: %s", err ? mk_error_message(err) : "-");
        mk_error_free(err);
        return 0;
    }
    char in[64], out[64];
    snprintf(in, sizeof in, "/tmp/mk_fuzz_st_%ld.in", (long)getpid());
    snprintf(out, sizeof out, "/tmp/mk_fuzz_st_%ld.out", (long)getpid());
    write_all(in, data, size);
    unsigned sum = 0;
    mk_safetensors *a = open_all(in, &sum);
    size_t n = mk_safetensors_count(a);
    if (n != count) FUZZ_FINDING("%zu tensors from the buffer, %zu from the file", count, n);
    mk_tensor_info *infos = calloc(n ? n : 1, sizeof *infos);
    const void **ptrs = calloc(n ? n : 1, sizeof *ptrs);
    for (size_t i = 0; i < n; i++) mk_safetensors_tensor(a, i, &infos[i], &ptrs[i], NULL);
    if (mk_safetensors_save(out, infos, ptrs, n, &err))
        FUZZ_FINDING("saving what was read: %s", mk_error_message(err));
    mk_safetensors *b = open_all(out, &sum);
    if (mk_safetensors_count(b) != n) FUZZ_FINDING("the saved file holds another count");
    for (size_t i = 0; i < n; i++) { /* saved in the given order */
        mk_tensor_info t;
        const void *d;
        size_t bytes, want_bytes;
        mk_safetensors_tensor(b, i, &t, &d, &bytes);
        mk_safetensors_tensor(a, i, NULL, NULL, &want_bytes);
        if (strcmp(t.name, infos[i].name) || t.dtype != infos[i].dtype || t.rank != infos[i].rank ||
            memcmp(t.shape, infos[i].shape, sizeof(int64_t) * (size_t)t.rank) ||
            bytes != want_bytes || memcmp(d, ptrs[i], bytes))
            FUZZ_FINDING("tensor %zu ('%s') changed through a save", i, infos[i].name);
    }
    mk_safetensors_close(b);
    free(infos);
    free(ptrs);
    mk_safetensors_close(a);
    remove(in);
    remove(out);
    return 0;
}
