/*
 * file_test.c — core/file.c and the writers that use it, from C.
 *
 *   test_writer       mk_file_write_atomic / begin-put-commit-abort: a link at
 *                     the path is replaced, never followed; the mode asked less
 *                     the umask; abort and failures leave nothing behind
 *   test_sha256       mk_sha256 against FIPS 180-4's published examples
 *   test_save_names   mk_safetensors_save: a name twice is an argument error;
 *                     200,000 names are checked in n log n (pairs were n^2)
 */
#include "graph.h"
#include "test.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int files_in(const char *dir) {
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    return n;
}

static void drop(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("#   could not remove %s\n", dir);
}

static void test_writer(void) {
    char dir[] = "/tmp/mk-file-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[128], victim[128];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    FILE *f = fopen(victim, "wb");
    fputs("victim", f);
    fclose(f);
    CHECK(symlink(victim, path) == 0, "symlink");
    size_t n = (size_t)test_randint(1, 100000);
    unsigned char *data = malloc(n);
    for (size_t i = 0; i < n; i++) data[i] = (unsigned char)test_randint(0, 255);
    mk_error *err = NULL;
    CHECK(mk_file_write_atomic(path, data, n, 0600, &err) == 0, "%s", mk_error_message(err));
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size == n &&
          (st.st_mode & 0777) == 0600, "the path is not the new file of mode 0600");
    CHECK(stat(victim, &st) == 0 && st.st_size == 6, "the link's target was written");
    f = fopen(path, "rb");
    unsigned char *back = malloc(n);
    CHECK(f && fread(back, 1, n, f) == n && !memcmp(back, data, n), "the bytes read back differ");
    if (f) fclose(f);
    /* abort: nothing left, the path as it was */
    mk_file_writer *w = mk_file_begin(path, 0666, &err);
    CHECK(w && mk_file_put(w, "abc", 3, &err) == 0, "%s", mk_error_message(err));
    CHECK(files_in(dir) == 3, "%d files while writing (the temporary one among them)", files_in(dir));
    mk_file_abort(w);
    CHECK(files_in(dir) == 2 && stat(path, &st) == 0 && (size_t)st.st_size == n,
          "abort left %d files", files_in(dir));
    /* no directory to write in: a file error, nothing made */
    char missing[160];
    snprintf(missing, sizeof missing, "%s/no/such/file", dir);
    CHECK(mk_file_write_atomic(missing, "x", 1, 0666, &err) == -1 && err &&
          err->code == MK_ERR_FILE, "a missing directory: %s", mk_error_message(err));
    mk_error_free(err);
    err = NULL;
    /* a directory at the path: the rename fails, the temporary file goes */
    char sub[160];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    mkdir(sub, 0700);
    char inner[200];
    snprintf(inner, sizeof inner, "%s/x", sub);
    fclose(fopen(inner, "wb"));
    CHECK(mk_file_write_atomic(sub, "x", 1, 0666, &err) == -1 && err &&
          err->code == MK_ERR_FILE && files_in(dir) == 3,
          "a directory at the path: %s, %d files", mk_error_message(err), files_in(dir));
    mk_error_free(err);
    free(data);
    free(back);
    drop(dir);
}

static void test_sha256(void) {
    static const struct {
        const char *text;
        int repeat;
        const char *hex;
    } cases[] = {
        {"abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"a", 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t len = strlen(cases[c].text), n = len * (size_t)cases[c].repeat;
        char *buf = malloc(n + 1);
        for (int r = 0; r < cases[c].repeat; r++) memcpy(buf + (size_t)r * len, cases[c].text, len);
        unsigned char d[32];
        mk_sha256(buf, n, d);
        char hex[65];
        for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
        CHECK(!strcmp(hex, cases[c].hex), "case %zu: %s", c, hex);
        free(buf);
    }
}

static void test_save_names(void) {
    char dir[] = "/tmp/mk-file-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[128];
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    /* under valgrind (MK_VALGRIND) fewer: the same code, the bound still far below n^2 */
    size_t n = getenv("MK_VALGRIND") ? 20000 : 200000;
    mk_tensor_info *infos = calloc(n, sizeof *infos);
    const void **data = calloc(n, sizeof *data);
    char *names = malloc(n * 16);
    int8_t *bytes = malloc(n);
    for (size_t i = 0; i < n; i++) {
        snprintf(names + 16 * i, 16, "t%zu", i);
        bytes[i] = (int8_t)test_randint(-128, 127);
        infos[i] = (mk_tensor_info){.name = names + 16 * i, .dtype = MK_DTYPE_INT8, .rank = 1,
                                    .shape = {1}};
        data[i] = &bytes[i];
    }
    mk_error *err = NULL;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    CHECK(mk_safetensors_save(path, infos, data, n, &err) == 0, "%s", mk_error_message(err));
    clock_gettime(CLOCK_MONOTONIC, &b);
    double seconds = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    printf("#   %zu tensors saved in %.2f s\n", n, seconds);
    CHECK(seconds < 30, "%.1f s", seconds); /* a bound far below n^2, not a benchmark */
    mk_safetensors *st = mk_safetensors_open(path, &err);
    CHECK(st && mk_safetensors_count(st) == n, "%s", mk_error_message(err));
    size_t k = (size_t)test_randint(0, (int64_t)n - 1);
    const void *got = NULL;
    mk_tensor_info info;
    /* saved in name order: find t<k> */
    for (size_t i = 0; st && i < n; i++) {
        mk_safetensors_tensor(st, i, &info, &got, NULL);
        if (!strcmp(info.name, names + 16 * k)) break;
        got = NULL;
    }
    CHECK(got && *(const int8_t *)got == bytes[k], "t%zu read back wrong", k);
    mk_safetensors_close(st);
    /* a name twice, anywhere */
    size_t i = (size_t)test_randint(0, (int64_t)n - 1), j = (size_t)test_randint(0, (int64_t)n - 1);
    if (i == j) j = (j + 1) % n;
    infos[j].name = infos[i].name;
    CHECK(mk_safetensors_save(path, infos, data, n, &err) == -1 && err &&
          err->code == MK_ERR_ARGUMENT && strstr(mk_error_message(err), "is used twice") &&
          strstr(mk_error_message(err), infos[i].name),
          "a name twice: %s", mk_error_message(err));
    mk_error_free(err);
    free(infos);
    free(data);
    free(names);
    free(bytes);
    drop(dir);
}

int main(void) {
    test_srand(test_seed());
    RUN(test_writer);
    RUN(test_sha256);
    RUN(test_save_names);
    return test_summary("file");
}
