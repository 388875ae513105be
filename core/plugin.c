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
 *      libmoonkaas.so, build/moonkaas/ beside the Lua module core.so (and its
 *      installed copy: `make install` puts the plugin beside core.so), or the
 *      directory of a program that linked libmoonkaas.a;
 *   3. the build directory baked in at compile time (MK_CUDA_PLUGIN_DIR);
 *   4. the plain file name, through the dynamic linker's own search.
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
#include <unistd.h>

#ifndef MK_CUDA_PLUGIN_DIR
#define MK_CUDA_PLUGIN_DIR ""
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

/* Appends the plugin's path in directory dir[0 .. len) to the list, once (the
 * same directory reached two ways is searched once). */
static void add_dir(char (*paths)[PATH_MAX], int *n, const char *dir, size_t len) {
    char raw[PATH_MAX], real[PATH_MAX];
    if (!len || len >= sizeof raw) return;
    memcpy(raw, dir, len);
    raw[len] = 0;
    const char *d = realpath(raw, real) ? real : raw;
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", d, MK_CUDA_PLUGIN_FILE) >= sizeof path)
        return;
    for (int i = 0; i < *n; i++)
        if (!strcmp(paths[i], path)) return;
    memcpy(paths[(*n)++], path, strlen(path) + 1);
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
    static char paths[2][PATH_MAX]; /* under the once: never two loads at a time */
    int n = 0;
    Dl_info info;
    if (dladdr((void *)mk_cuda_plugin_get, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        if (slash) add_dir(paths, &n, info.dli_fname, (size_t)(slash - info.dli_fname));
    }
    add_dir(paths, &n, MK_CUDA_PLUGIN_DIR, strlen(MK_CUDA_PLUGIN_DIR));
    for (int i = 0; i < n; i++)
        if (plugin_try(paths[i])) return;
    if (plugin_try(MK_CUDA_PLUGIN_FILE)) return;
    mk_strbuf looked = {0};
    for (int i = 0; i < n; i++) {
        const char *slash = strrchr(paths[i], '/');
        mk_strbuf_put(&looked, "%.*s, ", (int)(slash - paths[i]), paths[i]);
    }
    snprintf(plugin_why, sizeof plugin_why,
             "moonkaas's CUDA plugin (%s) was not found (looked in: %sthe dynamic linker's "
             "path; set MK_CUDA_PLUGIN to its path)",
             MK_CUDA_PLUGIN_FILE, looked.s && !looked.failed ? looked.s : "");
    free(looked.s);
}
#endif

const mk_cuda_plugin *mk_cuda_plugin_get(char *reason, size_t size) {
    pthread_once(&plugin_once, plugin_load);
    if (!plugin && reason && size) snprintf(reason, size, "%s", plugin_why);
    return plugin;
}
