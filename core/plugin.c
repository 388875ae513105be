/*
 * plugin.c — finds and opens the CUDA device plugin (libmoonkaas_cuda.so,
 * built from kernels/) the first time CUDA is asked for, once per process.
 *
 * The core links no CUDA library: a process that only uses the CPU never maps
 * libcudart, cuBLAS or cuDNN. The first mk_cuda_plugin_get (mk_cuda_available,
 * a compile for CUDA, the cuDNN fuser) looks for the plugin, in order:
 *
 *   1. $MK_CUDA_PLUGIN, when set: that file and nothing else;
 *   2. the directory of the file holding this core (dladdr): build/ beside
 *      libmoonkaas.so, build/moonkaas/ beside the Lua module core.so (and a
 *      rock's or `make install`'s copy beside the installed core.so), or the
 *      directory of a program that linked libmoonkaas.a;
 *   3. its moonkaas/ subdirectory: PREFIX/lib/moonkaas/ for an installed
 *      PREFIX/lib/libmoonkaas.so (the Lua module skips this: beside it only);
 *   4. the directory baked in at build time (MK_CUDA_PLUGIN_DIR: the build
 *      tree, or PREFIX/lib/moonkaas for `make install`'s libraries; the Lua
 *      module bakes none), and only while it is safe: it and every directory
 *      above it belong to root or to this process's user and no one else can
 *      write to them (a sticky /tmp excepted), and so does the plugin file.
 *      A build tree in /tmp that was deleted and made again by another user
 *      is skipped, its file never opened;
 *   5. the plain file name, through the dynamic linker's own search.
 *
 * The first file that exists is the answer: it is opened with RTLD_NOW |
 * RTLD_LOCAL (its symbols never serve anyone else), its one export
 * MK_CUDA_PLUGIN_ENTRY gives the table, and the table's abi and struct sizes
 * must be this core's. Every failure is a reason (not found, with where it
 * looked; or broken, with the loader's message) and never a crash. A plugin
 * that loads is never closed: the CUDA runtime's threads outlive any caller.
 */
#include "device.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MK_CUDA_PLUGIN_DIR
#define MK_CUDA_PLUGIN_DIR ""
#endif
/* 1 for a core that looks beside itself only (the Lua module): no moonkaas/
 * subdirectory (step 3 above). */
#ifndef MK_CUDA_PLUGIN_BESIDE_ONLY
#define MK_CUDA_PLUGIN_BESIDE_ONLY 0
#endif

static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;
static const mk_cuda_plugin *plugin;  /* set once by plugin_load, NULL when none */
static char plugin_why[1024];         /* why there is none */

#ifndef MK_WITH_CUDA
/* This build made no plugin (make CUDA=0): there is nothing to look for. */
static void plugin_load(void) {
    snprintf(plugin_why, sizeof plugin_why, "moonkaas was built without CUDA (make CUDA=1)");
}
#else
/* "moonkaas's CUDA plugin <path> is broken: <what>" into plugin_why. */
static void broken(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void broken(const char *path, const char *fmt, ...) {
    char what[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(plugin_why, sizeof plugin_why, "moonkaas's CUDA plugin %s is broken: %s", path, what);
}

/* The table of an opened plugin, or NULL (and the reason) when it is not one of ours. */
static const mk_cuda_plugin *plugin_check(void *h, const char *path) {
    dlerror();
    mk_cuda_plugin_entry_fn entry = (mk_cuda_plugin_entry_fn)dlsym(h, MK_CUDA_PLUGIN_ENTRY);
    if (!entry) {
        const char *e = dlerror();
        broken(path, "%s", e ? e : "no " MK_CUDA_PLUGIN_ENTRY);
        return NULL;
    }
    const mk_cuda_plugin *p = entry();
    if (!p) {
        broken(path, "%s returned no table", MK_CUDA_PLUGIN_ENTRY);
        return NULL;
    }
    mk_abi_sizes sizes = MK_ABI_SIZES;
    if (p->abi != MK_CUDA_PLUGIN_ABI || memcmp(&p->sizes, &sizes, sizeof sizes)) {
        broken(path,
               "it was built from another version of moonkaas (abi %d%s; this core: abi %d); "
               "rebuild it with this core",
               p->abi, p->abi == MK_CUDA_PLUGIN_ABI ? ", with other struct sizes" : "",
               MK_CUDA_PLUGIN_ABI);
        return NULL;
    }
    if (!p->device || !p->device->kernels || !p->probe) {
        broken(path, "its table has no device, kernels or probe");
        return NULL;
    }
    return p;
}

/*
 * Tries one candidate. 1: it exists, and `plugin` or `plugin_why` says how it
 * went; 0: there is no such file (searching goes on). A bare file name is left
 * to the dynamic linker, whose message says whether it was the plugin itself
 * that was missing.
 */
static int plugin_try(const char *path) {
    bool bare = !strchr(path, '/');
    if (!bare && access(path, F_OK) != 0) return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        if (!e) e = "dlopen failed";
        size_t n = strlen(path);
        if (bare && !strncmp(e, path, n) && e[n] == ':') return 0; /* it was not found */
        broken(path, "%s", e);
        return 1;
    }
    plugin = plugin_check(h, path);
    if (!plugin) dlclose(h);
    return 1;
}

/* Appends the plugin's path in directory dir[0 .. len) (and `sub`, a
 * subdirectory, when not NULL) to the list, once (the same directory reached
 * two ways is searched once). */
static void add_dir(char (*paths)[PATH_MAX], int *n, const char *dir, size_t len, const char *sub) {
    char raw[PATH_MAX], real[PATH_MAX];
    if (!len || len >= sizeof raw) return;
    memcpy(raw, dir, len);
    raw[len] = 0;
    const char *d = realpath(raw, real) ? real : raw;
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s%s%s", d, sub ? sub : "", sub ? "/" : "",
                         MK_CUDA_PLUGIN_FILE) >= sizeof path)
        return;
    for (int i = 0; i < *n; i++)
        if (!strcmp(paths[i], path)) return;
    memcpy(paths[(*n)++], path, strlen(path) + 1);
}

/* Whether one file or directory is safe to load from: it belongs to root or to
 * this process's user, and no one else may write to it, or it is a sticky
 * directory (/tmp: others' names in it cannot replace ours). */
static int safe_entry(const char *path, const struct stat *st, char *why, size_t size) {
    uid_t me = geteuid();
    if (st->st_uid != 0 && st->st_uid != me) {
        snprintf(why, size, "%s belongs to user %ld, not to root or to this user", path,
                 (long)st->st_uid);
        return 0;
    }
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX))) {
        snprintf(why, size, "%s is writable by %s", path,
                 st->st_mode & S_IWOTH ? "anyone" : "its group");
        return 0;
    }
    return 1;
}

/*
 * Whether the plugin file `path` in a baked directory may be opened: the file
 * and every directory from its own up to / pass safe_entry (symbolic links
 * resolved first). 1: safe, or absent (the search goes on); 0: unsafe, and
 * why, into why[size].
 */
static int safe_path(const char *path, char *why, size_t size) {
    char real[PATH_MAX];
    if (!realpath(path, real)) return 1; /* no such file: plugin_try says so */
    struct stat st;
    if (stat(real, &st) != 0 || !safe_entry(real, &st, why, size)) return 0;
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, size, "%s is not a regular file", real);
        return 0;
    }
    for (char *slash = strrchr(real, '/'); slash; slash = strrchr(real, '/')) {
        if (slash == real) slash[1] = 0; else *slash = 0;
        if (stat(real, &st) != 0 || !safe_entry(real, &st, why, size)) return 0;
        if (slash == real) break;
    }
    return 1;
}

static void plugin_load(void) {
    const char *env = getenv("MK_CUDA_PLUGIN");
    if (env && *env) {
        if (!plugin_try(env))
            snprintf(plugin_why, sizeof plugin_why,
                     "moonkaas's CUDA plugin (%s) was not found (MK_CUDA_PLUGIN=%s: no such file)",
                     MK_CUDA_PLUGIN_FILE, env);
        return;
    }
    static char paths[3][PATH_MAX]; /* under the once: never two loads at a time */
    int n = 0;
    Dl_info info;
    if (dladdr((void *)mk_cuda_plugin_get, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) {
            size_t len = (size_t)(slash - info.dli_fname);
            add_dir(paths, &n, info.dli_fname, len, NULL);
            if (!MK_CUDA_PLUGIN_BESIDE_ONLY) add_dir(paths, &n, info.dli_fname, len, "moonkaas");
        }
    }
    int baked = n; /* paths[baked ..): the baked directory, opened only where safe */
    add_dir(paths, &n, MK_CUDA_PLUGIN_DIR, strlen(MK_CUDA_PLUGIN_DIR), NULL);
    char skipped[PATH_MAX + 64] = "";
    for (int i = 0; i < n; i++) {
        if (i >= baked && !safe_path(paths[i], skipped, sizeof skipped)) continue;
        if (plugin_try(paths[i])) return;
    }
    if (plugin_try(MK_CUDA_PLUGIN_FILE)) return;
    mk_strbuf looked = {0};
    for (int i = 0; i < n; i++) {
        const char *slash = strrchr(paths[i], '/');
        mk_strbuf_put(&looked, "%.*s, ", (int)(slash - paths[i]), paths[i]);
    }
    int len = snprintf(plugin_why, sizeof plugin_why,
                       "moonkaas's CUDA plugin (%s) was not found (looked in: %sthe dynamic "
                       "linker's path; set MK_CUDA_PLUGIN to its path)%s%s",
                       MK_CUDA_PLUGIN_FILE, looked.s && !looked.failed ? looked.s : "",
                       skipped[0] ? "; skipped as unsafe: " : "", skipped);
    if (len >= (int)sizeof plugin_why) /* cut: say so rather than end mid-path */
        memcpy(plugin_why + sizeof plugin_why - 4, "...", 4);
    free(looked.s);
}
#endif

const mk_cuda_plugin *mk_cuda_plugin_get(char *reason, size_t size) {
    pthread_once(&plugin_once, plugin_load);
    if (!plugin && reason && size) snprintf(reason, size, "%s", plugin_why);
    return plugin;
}
