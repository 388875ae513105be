/*
 * kernel_cache_test.c — the on-disk kernel cache (kernels/generated.cu) as an
 * attacker or a broken disk meets it, through the compile-only path
 * (mk_model_check_generated: NVRTC, no GPU), which reads and writes the same
 * entries as a CUDA compile. Whether an entry was loaded or compiled again
 * shows in its inode: a load leaves the file, a compile replaces it.
 *
 *   test_corrupt_entry    a flipped byte in the cubin, "\x7fELF" and garbage:
 *                         compiled again and replaced, never loaded
 *   test_planted_entry    a valid entry of another program copied under this
 *                         program's name: compiled again
 *   test_temporary_link   links at the old predictable temporary names
 *                         (<entry>.<pid>.tmp) are not followed
 *   test_directory        a new directory is made 0700; one writable by others
 *                         or another user's is refused: nothing written there
 *   test_dump_link        an MK_CUDA_DUMP source whose name is a planted link
 *                         (it was fopen "w", which followed it): the link is
 *                         replaced by the source, its target untouched
 *
 * Without the plugin (CUDA=0, or none found) the test is skipped with the reason.
 */
#include "device.h"
#include "test.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A model with one fresh pointwise group (its shape drawn: a source no cache has). */
static mk_model *fresh_group(mk_context *ctx) {
    char text[256];
    snprintf(text, sizeof text,
             "$1 = InputTensor(x, float32, [%d, 5]);\n$2 = TanhNode($1);\n"
             "$3 = SumNode($2, $1);\nresult = $3;\n",
             (int)test_randint(1000, 1000000));
    mk_error *err = NULL;
    mk_model *m = mk_compile(ctx, text, NULL, 0, NULL, &err);
    CHECK(m != NULL, "compile: %s", mk_error_message(err));
    mk_error_free(err);
    return m;
}

/* Checks m's one generated group against the cache; true when that worked. */
static bool check(mk_model *m) {
    mk_error *err = NULL;
    int n = m ? mk_model_check_generated(m, 90, &err) : -1;
    CHECK(n == 1, "check: %d, %s", n, mk_error_message(err));
    mk_error_free(err);
    return n == 1;
}

/* The files in dir whose names end with suffix; the last one's path in path. */
static int files_ending(const char *dir, const char *suffix, char *path, size_t size) {
    int n = 0;
    size_t want = strlen(suffix);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < want || strcmp(e->d_name + len - want, suffix)) continue;
        n++;
        if (path) snprintf(path, size, "%s/%s", dir, e->d_name);
    }
    if (d) closedir(d);
    return n;
}

/* The cache's entries in dir (files ending .cubin). */
static int entries(const char *dir, char *path, size_t size) {
    return files_ending(dir, ".cubin", path, size);
}

static ino_t inode(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 ? st.st_ino : 0;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)size + 1);
    *n = s ? fread(s, 1, (size_t)size, f) : 0;
    fclose(f);
    return s;
}

/* Whether the file at path holds exactly text. */
static bool holds(const char *path, const char *text) {
    size_t n = 0;
    char *now = slurp(path, &n);
    bool same = now && n == strlen(text) && !memcmp(now, text, n);
    free(now);
    return same;
}

static void spit(const char *path, const void *s, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(s, 1, n, f);
    fclose(f);
}

static void make_cache_dir(char *dir) {
    strcpy(dir, "/tmp/mk-kernel-cache-XXXXXX");
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    setenv("MK_KERNEL_CACHE", dir, 1);
}

static void drop_cache_dir(const char *dir) {
    unsetenv("MK_KERNEL_CACHE");
    char cmd[160];
    snprintf(cmd, sizeof cmd, "chmod -R u+rwx %s; rm -rf %s", dir, dir);
    if (system(cmd) != 0) printf("#   could not remove %s\n", dir);
}

static void test_corrupt_entry(void) {
    char dir[64], path[512];
    make_cache_dir(dir);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = fresh_group(ctx);
    if (!check(m)) goto done;
    CHECK(entries(dir, path, sizeof path) == 1, "%d entries", entries(dir, NULL, 0));
    ino_t first = inode(path);
    CHECK(check(m) && inode(path) == first, "a good entry was not loaded");
    size_t n = 0;
    char *good = slurp(path, &n);
    CHECK(good && n > 200, "the entry: %zu bytes", n);
    if (!good) goto done;
    /* one byte of the cubin flipped, at a drawn place past the header */
    size_t at = (size_t)test_randint(100, (int64_t)n - 1);
    good[at] ^= (char)test_randint(1, 255);
    spit(path, good, n);
    ino_t flipped = inode(path);
    CHECK(check(m) && inode(path) != flipped, "a flipped byte (at %zu of %zu) was loaded", at, n);
    ino_t again = inode(path);
    CHECK(check(m) && inode(path) == again, "the replacing entry was not loaded");
    /* an ELF magic and garbage */
    static const char garbage_bytes[] = "\x7f" "ELF garbage that no loader should see";
    spit(path, garbage_bytes, sizeof garbage_bytes - 1);
    ino_t garbage = inode(path);
    CHECK(check(m) && inode(path) != garbage, "\\x7fELF and garbage was loaded");
    free(good);
done:
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
    drop_cache_dir(dir);
}

static void test_planted_entry(void) {
    char dir[64], a_path[512], b_path[512];
    make_cache_dir(dir);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *a = fresh_group(ctx), *b = fresh_group(ctx);
    if (!check(a)) goto done;
    entries(dir, a_path, sizeof a_path);
    size_t n = 0;
    char *entry_a = slurp(a_path, &n);
    CHECK(check(b) && entries(dir, NULL, 0) == 2, "%d entries", entries(dir, NULL, 0));
    /* b's entry: the one that is not a's */
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        snprintf(b_path, sizeof b_path, "%s/%s", dir, e->d_name);
        if (strstr(e->d_name, ".cubin") && strcmp(b_path, a_path)) break;
    }
    if (d) closedir(d);
    /* a's entry, valid in every byte, under b's name */
    spit(b_path, entry_a, n);
    ino_t planted = inode(b_path);
    CHECK(check(b) && inode(b_path) != planted, "another program's entry was loaded");
    size_t m = 0;
    char *entry_b = slurp(b_path, &m);
    CHECK(entry_b && (m != n || memcmp(entry_a, entry_b, n)), "b's entry is still a's");
    free(entry_a);
    free(entry_b);
done:
    mk_model_free(a);
    mk_model_free(b);
    mk_error_free(err);
    mk_context_free(ctx);
    drop_cache_dir(dir);
}

static void test_temporary_link(void) {
    char dir[64], path[512], victim[512];
    make_cache_dir(dir);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = fresh_group(ctx);
    if (!check(m)) goto done;
    entries(dir, path, sizeof path);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    char secret[64];
    snprintf(secret, sizeof secret, "the victim's own bytes %lld", (long long)test_randint(0, 1 << 30));
    spit(victim, secret, strlen(secret));
    /* the entry gone, links at the temporary names the old writer used */
    unlink(path);
    for (int d = -2; d <= 2; d++) {
        char link[600];
        snprintf(link, sizeof link, "%s.%ld.tmp", path, (long)getpid() + d);
        CHECK(symlink(victim, link) == 0, "symlink %s", link);
    }
    CHECK(check(m), "check with links planted");
    CHECK(holds(victim, secret), "the victim was written through");
    struct stat st;
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600,
          "the entry is not a regular file of mode 0600");
done:
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
    drop_cache_dir(dir);
}

static void test_directory(void) {
    char dir[64], sub[128];
    make_cache_dir(dir);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    /* made 0700, parents too */
    snprintf(sub, sizeof sub, "%s/new/cache", dir);
    setenv("MK_KERNEL_CACHE", sub, 1);
    mk_model *m = fresh_group(ctx);
    struct stat st;
    CHECK(check(m) && entries(sub, NULL, 0) == 1, "%d entries", entries(sub, NULL, 0));
    CHECK(stat(sub, &st) == 0 && (st.st_mode & 0777) == 0700, "made %03o",
          (unsigned)(st.st_mode & 0777));
    mk_model_free(m);
    /* writable by others: refused, nothing written, compiled all the same */
    chmod(sub, 0777);
    m = fresh_group(ctx);
    CHECK(check(m) && entries(sub, NULL, 0) == 1, "a world-writable directory took %d entries",
          entries(sub, NULL, 0));
    mk_model_free(m);
    chmod(sub, 0720); /* group-writable */
    m = fresh_group(ctx);
    CHECK(check(m) && entries(sub, NULL, 0) == 1, "a group-writable directory took %d entries",
          entries(sub, NULL, 0));
    mk_model_free(m);
    /* another user's (only root can make one) */
    chmod(sub, 0700);
    if (geteuid() == 0 && chown(sub, 65534, 65534) == 0) {
        m = fresh_group(ctx);
        CHECK(check(m) && entries(sub, NULL, 0) == 1, "another user's directory took %d entries",
              entries(sub, NULL, 0));
        mk_model_free(m);
    } else {
        printf("#   not root: another user's directory is not tried\n");
    }
    /* a file where the directory should be */
    snprintf(sub, sizeof sub, "%s/file", dir);
    spit(sub, "x", 1);
    setenv("MK_KERNEL_CACHE", sub, 1);
    m = fresh_group(ctx);
    CHECK(check(m), "a file as the directory");
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
    drop_cache_dir(dir);
}

static void test_dump_link(void) {
    char dir[64], dump[64], path[512], victim[512];
    make_cache_dir(dir);
    strcpy(dump, "/tmp/mk-cuda-dump-XXXXXX");
    CHECK(mkdtemp(dump) != NULL, "mkdtemp");
    setenv("MK_CUDA_DUMP", dump, 1);
    mk_error *err = NULL;
    mk_context *ctx = mk_context_new(&err);
    mk_model *m = fresh_group(ctx);
    if (!check(m)) goto done;
    int dumped = files_ending(dump, ".cu", path, sizeof path); /* the dumped source */
    CHECK(dumped == 1, "%d sources dumped", dumped);
    size_t n = 0;
    char *source = slurp(path, &n);
    CHECK(source && n > 0 && strstr(source, "__global__"), "the dumped source: %zu bytes", n);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    char secret[64];
    snprintf(secret, sizeof secret, "the victim's own bytes %lld",
             (long long)test_randint(0, 1 << 30));
    spit(victim, secret, strlen(secret));
    /* the source's name a link to the victim; the next check dumps it again */
    unlink(path);
    CHECK(symlink(victim, path) == 0, "symlink %s", path);
    CHECK(check(m), "check with a link at the source's name");
    CHECK(holds(victim, secret), "the victim was written through");
    struct stat st;
    size_t r = 0;
    char *again = slurp(path, &r);
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && again && r == n &&
              !memcmp(again, source, n),
          "the dump is not the source as a regular file");
    free(again);
    free(source);
done:
    unsetenv("MK_CUDA_DUMP");
    mk_model_free(m);
    mk_error_free(err);
    mk_context_free(ctx);
    drop_cache_dir(dir);
    drop_cache_dir(dump);
}

int main(void) {
    test_srand(test_seed());
    char why[512];
    if (!mk_cuda_plugin_get(why, sizeof why)) {
        SKIP(test_corrupt_entry, why);
        SKIP(test_planted_entry, why);
        SKIP(test_temporary_link, why);
        SKIP(test_directory, why);
        SKIP(test_dump_link, why);
    } else {
        RUN(test_corrupt_entry);
        RUN(test_planted_entry);
        RUN(test_temporary_link);
        RUN(test_directory);
        RUN(test_dump_link);
    }
    return test_summary("kernel_cache");
}
