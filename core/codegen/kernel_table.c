/*
 * kernel_table.c — the CUDA plugin's process-wide table of compiled kernels
 * (kernels/generated.cu keeps one, under its lock): an entry per program and
 * architecture, found by the program's 64-bit hash and then by the program's
 * whole text, kept with the entry, so that two programs whose hashes collide
 * never share a kernel. Plain C without a CUDA header (the kernels are opaque
 * pointers), so that a test without a GPU checks the lookup
 * (spec/c/kernel_table_test.c).
 */
#include "codegen.h"

#include <stdlib.h>
#include <string.h>

unsigned long long mk_codegen_program_hash(const char *program) { /* FNV-1a */
    unsigned long long h = 1469598103934665603ull;
    for (const char *s = program; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

const mk_kernel_entry *mk_kernel_table_find(const mk_kernel_table *t, unsigned long long hash,
                                            int arch, const char *program) {
    for (int i = 0; i < t->n; i++) {
        const mk_kernel_entry *e = &t->entries[i];
        /* the hash only rules entries out: equal hashes of different programs
         * are rare, not impossible */
        if (e->hash == hash && e->arch == arch && !strcmp(e->program, program)) return e;
    }
    return NULL;
}

int mk_kernel_table_add(mk_kernel_table *t, unsigned long long hash, int arch,
                        const char *program, void *library, void *kernel) {
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 16;
        mk_kernel_entry *grown = realloc(t->entries, sizeof *grown * (size_t)cap);
        if (!grown) return -1;
        t->entries = grown;
        t->cap = cap;
    }
    size_t len = strlen(program) + 1;
    char *copy = malloc(len);
    if (!copy) return -1;
    memcpy(copy, program, len);
    t->entries[t->n++] = (mk_kernel_entry){hash, arch, copy, library, kernel};
    return 0;
}

void mk_kernel_table_free(mk_kernel_table *t) {
    for (int i = 0; i < t->n; i++) free(t->entries[i].program);
    free(t->entries);
    *t = (mk_kernel_table){0};
}
