/*
 * kernel_table_test.c — the CUDA plugin's in-process table of compiled kernels
 * (core/codegen/kernel_table.c, which kernels/generated.cu keeps), without a
 * GPU: the kernels are opaque pointers, so any build runs this.
 *
 *   test_collision   two programs given the same hash (a collision forced: the
 *                    lookup takes the hash as an argument) keep a kernel each;
 *                    neither is found for the other
 *   test_lookup      random programs over three architectures, against a plain
 *                    list searched by text: each finds its own kernel, a
 *                    program not added or another architecture finds none
 *   test_own_copy    the table keeps its own copy of the program's text
 */
#include "codegen/codegen.h"
#include "test.h"

/* A random program-like text of n characters (printable, never NUL). */
static char *random_text(int n) {
    char *s = malloc((size_t)n + 1);
    for (int i = 0; i < n; i++) s[i] = (char)test_randint(32, 126);
    s[n] = '\0';
    return s;
}

/* An opaque "kernel": any distinct non-NULL pointer. */
static void *kernel_no(int i) { return (void *)(uintptr_t)(0x1000 + 16 * (uintptr_t)i); }

static void test_collision(void) {
    mk_kernel_table t = {0};
    int n = (int)test_randint(1, 400);
    char *a = random_text(n), *b = malloc((size_t)n + 1);
    memcpy(b, a, (size_t)n + 1);
    int at = (int)test_randint(0, n - 1);
    b[at] = (char)(b[at] == '~' ? ' ' : b[at] + 1); /* one character apart */
    unsigned long long hash = test_rand_u64();
    int arch = 90;
    CHECK(mk_kernel_table_add(&t, hash, arch, a, NULL, kernel_no(1)) == 0, "add a");
    const mk_kernel_entry *e = mk_kernel_table_find(&t, hash, arch, b);
    CHECK(e == NULL, "b (same hash, %d characters, differing at %d) found a's kernel", n, at);
    if (!e) CHECK(mk_kernel_table_add(&t, hash, arch, b, NULL, kernel_no(2)) == 0, "add b");
    e = mk_kernel_table_find(&t, hash, arch, a);
    CHECK(e && e->kernel == kernel_no(1), "a's kernel: %p", e ? e->kernel : NULL);
    e = mk_kernel_table_find(&t, hash, arch, b);
    CHECK(e && e->kernel == kernel_no(2), "b's kernel: %p", e ? e->kernel : NULL);
    /* a prefix of a, with a's hash: a different program too */
    char keep = a[n - 1];
    a[n - 1] = '\0';
    CHECK(mk_kernel_table_find(&t, hash, arch, a) == NULL, "a prefix of a found a kernel");
    a[n - 1] = keep;
    mk_kernel_table_free(&t);
    free(a);
    free(b);
}

/* The reference: programs, architectures and kernels in a plain list. */
enum { N_PROGRAMS = 300 };
static const int arches[] = {80, 86, 90};

static void test_lookup(void) {
    mk_kernel_table t = {0};
    char *text[N_PROGRAMS];
    int arch[N_PROGRAMS];
    for (int i = 0; i < N_PROGRAMS; i++) {
        /* short texts from a small alphabet: some programs repeat, over other architectures */
        int n = (int)test_randint(1, 3);
        text[i] = malloc((size_t)n + 1);
        for (int k = 0; k < n; k++) text[i][k] = (char)test_randint('a', 'c');
        text[i][n] = '\0';
        arch[i] = arches[test_randint(0, 2)];
        int first = -1;
        for (int j = 0; j < i && first < 0; j++)
            if (arch[j] == arch[i] && !strcmp(text[j], text[i])) first = j;
        const mk_kernel_entry *e =
            mk_kernel_table_find(&t, mk_codegen_program_hash(text[i]), arch[i], text[i]);
        if (first >= 0) {
            CHECK(e && e->kernel == kernel_no(first), "%s sm%d: %p, want entry %d's", text[i],
                  arch[i], e ? e->kernel : NULL, first);
        } else {
            CHECK(e == NULL, "%s sm%d found before it was added", text[i], arch[i]);
            CHECK(mk_kernel_table_add(&t, mk_codegen_program_hash(text[i]), arch[i], text[i], NULL,
                                      kernel_no(i)) == 0,
                  "add");
        }
    }
    int distinct = t.n;
    for (int i = 0; i < N_PROGRAMS; i++) {
        int first = i;
        for (int j = 0; j < i; j++)
            if (arch[j] == arch[i] && !strcmp(text[j], text[i])) { first = j; break; }
        const mk_kernel_entry *e =
            mk_kernel_table_find(&t, mk_codegen_program_hash(text[i]), arch[i], text[i]);
        CHECK(e && e->kernel == kernel_no(first), "%s sm%d", text[i], arch[i]);
    }
    CHECK(mk_kernel_table_find(&t, mk_codegen_program_hash("abcd"), 90, "abcd") == NULL,
          "a program never added");
    CHECK(mk_kernel_table_find(&t, mk_codegen_program_hash("a"), 70, "a") == NULL,
          "an architecture never used");
    printf("# %d programs, %d entries\n", N_PROGRAMS, distinct);
    mk_kernel_table_free(&t);
    CHECK(t.n == 0 && t.entries == NULL, "freed: %d entries", t.n);
    for (int i = 0; i < N_PROGRAMS; i++) free(text[i]);
}

static void test_own_copy(void) {
    mk_kernel_table t = {0};
    char *a = random_text((int)test_randint(8, 64));
    char *want = malloc(strlen(a) + 1);
    strcpy(want, a);
    unsigned long long hash = mk_codegen_program_hash(a);
    CHECK(mk_kernel_table_add(&t, hash, 90, a, NULL, kernel_no(7)) == 0, "add");
    memset(a, '#', strlen(a)); /* the caller frees or reuses its buffer */
    free(a);
    const mk_kernel_entry *e = mk_kernel_table_find(&t, hash, 90, want);
    CHECK(e && e->kernel == kernel_no(7), "the program's kernel after its buffer went");
    mk_kernel_table_free(&t);
    free(want);
}

int main(void) {
    test_srand(test_seed());
    RUN(test_collision);
    RUN(test_lookup);
    RUN(test_own_copy);
    return test_summary("kernel_table");
}
