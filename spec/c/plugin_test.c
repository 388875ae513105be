/*
 * plugin_test.c — the CUDA plugin as the core sees it (core/plugin.c,
 * kernels/cuda_device.cu's table), through device.h:
 *
 *   test_first_use_races   eight threads ask for the plugin at once: one load,
 *                          one answer (the same table, or the same reason)
 *   test_table             abi and sizes, the device's kernel table (a kernel for
 *                          every family but cuDNN's, dtypes within the dtype table,
 *                          cuDNN's hooks all there or all absent)
 *   test_exports           the plugin exports its entry and nothing else: its copies
 *                          of the core's helpers are not reachable by name
 *   test_errors_cross      an error the plugin's copy of error.c made (opening the
 *                          device on a machine without one) reads and frees in the core
 *
 * Without a plugin (CUDA=0, or none found) the plugin's cases are skipped with
 * the reason. Run: make build/tests/plugin_test && build/tests/plugin_test
 */
#include "device.h"
#include "test.h"

#include <dlfcn.h>
#include <pthread.h>

#define THREADS 8

static const mk_cuda_plugin *plugin;
static char plugin_reason[1024];

/* ---- first use from many threads ------------------------------------------------ */

typedef struct {
    pthread_barrier_t *start;
    const mk_cuda_plugin *got;
    char reason[1024];
} racer;

static void *race(void *arg) {
    racer *r = arg;
    pthread_barrier_wait(r->start);
    r->got = mk_cuda_plugin_get(r->reason, sizeof r->reason);
    return NULL;
}

static void test_first_use_races(void) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, THREADS);
    racer r[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        r[i] = (racer){.start = &start};
        CHECK(pthread_create(&t[i], NULL, race, &r[i]) == 0, "thread %d", i);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
    plugin = mk_cuda_plugin_get(plugin_reason, sizeof plugin_reason);
    for (int i = 0; i < THREADS; i++) {
        CHECK(r[i].got == plugin, "thread %d got another table", i);
        if (!plugin) CHECK(!strcmp(r[i].reason, plugin_reason), "thread %d: %s", i, r[i].reason);
    }
    if (!plugin) {
        CHECK(plugin_reason[0], "no plugin and no reason");
        printf("#   no plugin: %s\n", plugin_reason);
    }
}

/* ---- the table ----------------------------------------------------------------- */

static void test_table(void) {
    const mk_cuda_plugin *p = plugin;
    CHECK(p->abi == MK_CUDA_PLUGIN_ABI, "abi %d", p->abi);
    mk_abi_sizes sizes = MK_ABI_SIZES;
    CHECK(!memcmp(&p->sizes, &sizes, sizeof sizes), "the plugin's struct sizes differ from the core's");
    CHECK(p->device && !strcmp(p->device->name, "cuda"), "device %s",
          p->device ? p->device->name : "(none)");
    const mk_kernel *k = p->device->kernels;
    CHECK(!k[MK_KERNEL_NONE].fn, "a kernel for MK_KERNEL_NONE");
    for (int id = MK_KERNEL_NONE + 1; id < MK_KERNEL_COUNT; id++) {
        if (id == MK_KERNEL_CUDNN_GROUP) continue; /* CUDNN=1 builds only */
        /* convolution groups: only a device whose target makes them runs them */
        if (id == MK_KERNEL_CONV_GROUP) {
            CHECK(!p->device->target.conv_groups && !k[id].fn, "CUDA's convolution groups");
            continue;
        }
        CHECK(k[id].fn, "no kernel for family %d", id);
        CHECK(k[id].dtypes && !(k[id].dtypes & ~MK_DTYPES_ALL), "family %d dtypes %#x", id,
              k[id].dtypes);
        CHECK(k[id].dtypes & MK_DTYPE_BIT(MK_DTYPE_FLOAT32), "family %d without float32", id);
    }
    unsigned both = MK_DTYPE_BIT(MK_DTYPE_FLOAT32) | MK_DTYPE_BIT(MK_DTYPE_INT64);
    CHECK((k[MK_KERNEL_POINTWISE].dtypes & both) == both, "pointwise dtypes %#x",
          k[MK_KERNEL_POINTWISE].dtypes);
    CHECK(p->device->target.row_groups, "CUDA does not take row groups");
    bool cudnn = p->device->target.cudnn_groups;
    CHECK(cudnn == (p->cudnn_cache_free != NULL) && cudnn == (k[MK_KERNEL_CUDNN_GROUP].fn != NULL),
          "cuDNN hooks partly there");
    printf("#   plugin with%s cuDNN\n", cudnn ? "" : "out");
    char reason[512] = "";
    int usable = p->probe(reason, sizeof reason);
    CHECK(reason[0], "the probe says nothing");
    printf("#   probe: %d (%s)\n", usable, reason);
}

/* ---- exports -------------------------------------------------------------------- */

static void test_exports(void) {
    Dl_info info;
    CHECK(dladdr((const void *)plugin, &info) && info.dli_fname, "the table is in no object");
    if (!info.dli_fname) return;
    printf("#   plugin: %s\n", info.dli_fname);
    CHECK(strstr(info.dli_fname, MK_CUDA_PLUGIN_FILE), "the table lies in %s", info.dli_fname);
    void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    CHECK(h, "not loaded: %s", dlerror());
    if (!h) return;
    CHECK(dlsym(h, MK_CUDA_PLUGIN_ENTRY), "no entry");
    static const char *hidden[] = {"mk_fail", "mk_failv", "mk_strbuf_put", "mk_walk_init",
                                   "mk_fault", "mk_dtype_size", "mk_dtype_name",
                                   "mk_error_free", "mk_tensor_numel", "mk_cuda_pointwise",
                                   "mk_cuda_matmul", "mk_cudnn_compile_group"};
    for (size_t i = 0; i < sizeof hidden / sizeof hidden[0]; i++)
        CHECK(!dlsym(h, hidden[i]), "the plugin exports %s", hidden[i]);
    dlclose(h); /* drops the NOLOAD reference only: the core's stays */
}

/* ---- errors made by the plugin's error.c, read and freed by the core's ------------- */

static void test_errors_cross(void) {
    const mk_device_ops *d = plugin->device;
    void *state = NULL;
    mk_error *err = NULL;
    if (d->open(&state, &err) == 0) {
        printf("#   a CUDA device opened: no error to carry across\n");
        d->close(state);
        return;
    }
    CHECK(err, "open failed without an error");
    if (!err) return;
    CHECK(mk_error_code_of(err) == MK_ERR_NO_DEVICE || mk_error_code_of(err) == MK_ERR_DEVICE,
          "code %d", (int)mk_error_code_of(err));
    const char *msg = mk_error_message(err);
    CHECK(!strncmp(msg, "no CUDA device: ", 16) || !strncmp(msg, "device error: ", 14), "%s",
          msg);
    printf("#   %s\n", msg);
    mk_error_free(err);
}

int main(void) {
    RUN(test_first_use_races);
    if (plugin) {
        RUN(test_table);
        RUN(test_exports);
        RUN(test_errors_cross);
    } else {
        char why[1100];
        snprintf(why, sizeof why, "no plugin: %s", plugin_reason);
        SKIP(test_table, why);
        SKIP(test_exports, why);
        SKIP(test_errors_cross, why);
    }
    return test_summary("plugin_test");
}
