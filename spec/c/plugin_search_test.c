/*
 * plugin_search_test.c — where core/plugin.c looks for the CUDA plugin, and
 * that a baked directory (MK_CUDA_PLUGIN_DIR: the build tree, or `make
 * install`'s lib/moonkaas) is opened only while it is safe. The issue it
 * guards: a rock built in /tmp/luarocks_moonkaas-...-<pid>/ baked that deleted
 * tree in; anyone who made it again could have the core dlopen (and run the
 * constructors of) their own library.
 *
 * plugin.c is compiled into this test with MK_CUDA_PLUGIN_DIR naming a
 * variable, so each case bakes its own directory under /tmp and runs the
 * search again (plugin_load) as a fresh process would:
 *
 *   test_safe_dir_searched     a directory of this user's, 0755, under the sticky
 *                              /tmp: its file is opened (a junk file: "is broken")
 *   test_writable_skipped      the directory, its parent or the file writable by
 *                              the group or anyone: not opened, and the reason
 *                              says which and why; a sticky parent is fine
 *   test_other_owner_skipped   the directory or the file of another user (as
 *                              root: chown to 65534): not opened
 *   test_missing_dir           a baked directory that is gone: "was not found"
 *   test_no_constructor_runs   the real plugin copied into another user's
 *                              directory is never mapped; in a safe one it loads
 *                              (skipped where the build made no plugin)
 *
 * Fails on the old plugin.c, which opened any baked directory's file. Run:
 * make build/tests/plugin_search_test && build/tests/plugin_search_test
 */
#include <limits.h>

static char baked_dir[PATH_MAX];
#define MK_CUDA_PLUGIN_DIR baked_dir
#ifndef MK_WITH_CUDA
#define MK_WITH_CUDA /* the search is the same in a CUDA=0 build; test it there too */
#endif
#include "plugin.c"

#include "test.h"

#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[64];  /* a fresh directory under /tmp, this test's */
static char dir[128];  /* root/build, baked into the search */
static char file[256]; /* dir/libmoonkaas_cuda.so */

/* The search as a fresh process runs it: "loaded", or the reason there is none. */
static const char *search(void) {
    plugin = NULL;
    plugin_why[0] = 0;
    plugin_load();
    return plugin ? "loaded" : plugin_why;
}

static void write_junk(const char *path) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("not a shared object\n", f);
        fclose(f);
    }
    chmod(path, 0644);
}

/* root/build with a junk plugin file, every mode safe. */
static void fresh_tree(void) {
    mkdir(dir, 0755);
    chmod(root, 0700);
    chmod(dir, 0755);
    CHECK(chown(dir, geteuid(), getegid()) == 0, "chown: %s", strerror(errno));
    write_junk(file);
    CHECK(chown(file, geteuid(), getegid()) == 0, "chown: %s", strerror(errno));
}

static int opened(const char *why) { return strstr(why, file) && strstr(why, "is broken"); }

static void test_safe_dir_searched(void) {
    fresh_tree();
    const char *why = search();
    CHECK(opened(why), "a safe baked directory was not searched: %s", why);
}

/* The search skipped the file, saying `unsafe` (a path and why) and nothing opened. */
static void check_skipped(const char *unsafe) {
    const char *why = search();
    CHECK(!opened(why), "an unsafe baked directory's file was opened: %s", why);
    CHECK(strstr(why, "was not found") != NULL, "%s", why);
    CHECK(strstr(why, "skipped as unsafe: ") && strstr(why, unsafe), "no \"%s\" in: %s", unsafe, why);
}

static void test_writable_skipped(void) {
    char expect[512];
    fresh_tree();
    chmod(dir, 0777);
    snprintf(expect, sizeof expect, "%s is writable by anyone", dir);
    check_skipped(expect);
    chmod(dir, 0775);
    snprintf(expect, sizeof expect, "%s is writable by its group", dir);
    check_skipped(expect);

    fresh_tree();
    chmod(root, 0777);
    snprintf(expect, sizeof expect, "%s is writable by anyone", root);
    check_skipped(expect);
    chmod(root, 01777); /* sticky, as /tmp: others cannot replace our names in it */
    const char *why = search();
    CHECK(opened(why), "a sticky parent stopped the search: %s", why);

    fresh_tree();
    chmod(file, 0666);
    snprintf(expect, sizeof expect, "%s is writable by anyone", file);
    check_skipped(expect);
    fresh_tree();
}

static void test_other_owner_skipped(void) {
    char expect[512];
    fresh_tree();
    CHECK(chown(dir, 65534, 65534) == 0, "chown: %s", strerror(errno));
    snprintf(expect, sizeof expect, "%s belongs to user 65534", dir);
    check_skipped(expect);
    fresh_tree();
    CHECK(chown(file, 65534, 65534) == 0, "chown: %s", strerror(errno));
    snprintf(expect, sizeof expect, "%s belongs to user 65534", file);
    check_skipped(expect);
    fresh_tree();
}

static void test_missing_dir(void) {
    fresh_tree();
    unlink(file);
    rmdir(dir);
    const char *why = search();
    CHECK(strstr(why, "was not found") != NULL, "%s", why);
    CHECK(strstr(why, "skipped") == NULL, "a missing directory is not unsafe: %s", why);
    fresh_tree();
}

static int mapped(const char *path) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[PATH_MAX + 128];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, path)) found = 1;
    if (f) fclose(f);
    return found;
}

static char real_plugin[PATH_MAX]; /* the build's plugin, beside tests/ */

static int copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    char buf[1 << 16];
    size_t n;
    int ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    return ok;
}

static void test_no_constructor_runs(void) {
    fresh_tree();
    CHECK(copy_file(real_plugin, file), "cannot copy %s to %s", real_plugin, file);
    chmod(file, 0755);
    CHECK(chown(dir, 65534, 65534) == 0, "chown: %s", strerror(errno));
    const char *why = search();
    CHECK(!plugin && !mapped(file), "a plugin in another user's directory was loaded: %s", why);
    CHECK(chown(dir, geteuid(), getegid()) == 0, "chown: %s", strerror(errno));
    why = search();
    CHECK(plugin && mapped(file), "the plugin in a safe directory did not load: %s", why);
}

static void cleanup(void) {
    chmod(root, 0700);
    unlink(file);
    rmdir(dir);
    rmdir(root);
}

int main(void) {
    unsetenv("MK_CUDA_PLUGIN");
    snprintf(root, sizeof root, "/tmp/mk-plugin-search-XXXXXX");
    if (!mkdtemp(root)) {
        printf("not ok - mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    snprintf(dir, sizeof dir, "%s/build", root);
    snprintf(file, sizeof file, "%s/%s", dir, MK_CUDA_PLUGIN_FILE);
    snprintf(baked_dir, sizeof baked_dir, "%s", dir);
    printf("# baked directory %s\n", dir);

    RUN(test_safe_dir_searched);
    RUN(test_writable_skipped);
    RUN_IF(geteuid() == 0, test_other_owner_skipped, "not root: cannot give a file to another user");
    RUN(test_missing_dir);

    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    slash = strrchr(exe, '/'); /* build/tests -> build */
    if (slash) *slash = 0;
    snprintf(real_plugin, sizeof real_plugin, "%.*s/%s", PATH_MAX - 40, exe, MK_CUDA_PLUGIN_FILE);
    RUN_IF(geteuid() == 0 && access(real_plugin, R_OK) == 0, test_no_constructor_runs,
           "not root, or no plugin built (CUDA=0)");
    cleanup();
    return test_summary("plugin_search_test");
}
