/*
 * codegen.h — code generation: the CUDA C of each group's kernel, written
 * from the group and its launch (shapes, strides and constants baked in), in
 * plain C with no CUDA header, so that the core (model:kernel_source, on any
 * device and in a build without CUDA) and the CUDA plugin (which compiles and
 * launches the kernels: kernels/generated.cu) build the same files.
 *
 * Files: codegen.c (pointwise groups, decode attention, what every generated
 * kernel shares, the source as it is compiled), matvec.c, matvec_step.c and
 * matvec_tc.c (matrix–vector groups, sharing matvec.h), rows.c (row groups:
 * a softmax or norm with its prologue and epilogue), kernel_table.c (the
 * plugin's table of compiled kernels, by program). The device code the
 * kernels take as it is lives in kernels/skeletons/ (NAME.cuh), embedded by
 * the build as the strings mk_skeleton_NAME (skeletons.h).
 *
 * Also here: what the generators and the plugin's kernels must agree on (the
 * pointwise block, the grid's limit, the timeline's layout, the walk of one
 * operand), one definition for both sides.
 */
#ifndef MK_CODEGEN_H
#define MK_CODEGEN_H

#include "device.h"

#include <stdbool.h>
#include <stdint.h>

/* Threads per block for the elementwise and copy kernels. */
#define MK_CUDA_BLOCK 256

/* Blocks for n items at `per_block` each, within the grid's x limit. */
static inline unsigned int mk_cuda_blocks(long long n, long long per_block) {
    long long b = (n + per_block - 1) / per_block;
    if (b < 1) b = 1;
    if (b > 0x7fffffffLL) b = 0x7fffffffLL;
    return (unsigned int)b;
}

/* Whether a device pointer takes 16-byte (float4) loads and stores. */
static inline bool mk_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* A walk of operand `stride` alone (n = 1) over `shape` (mk_walk, core/tensor.c). */
static inline mk_walk mk_cuda_walk1(int rank, const int64_t *shape, const int64_t *stride) {
    mk_walk w;
    const int64_t *strides[1] = {stride};
    mk_walk_init(&w, rank, shape, 1, strides);
    return w;
}

/* The in-graph timeline's layout (kernels/cuda_device.h says what it is):
 * the stamps start at byte MK_TIMELINE_AT of the fault record, for a
 * launch's first MK_TIMELINE_BLOCKS blocks. */
#define MK_TIMELINE_AT 256
#define MK_TIMELINE_BLOCKS 8192

/* codegen.c: the CUDA C of a group's launch (pointwise, matrix–vector,
 * attention or rows), as the plugin compiles it (malloc'd), or NULL with *err set:
 * stamped for the timeline (stamp), at occupancy blocks an SM where > 0
 * (mk_codegen_put_head); with MK_CUDA_NO_MMA=1 in the environment, the
 * tensor-core form's sums from shuffles (matvec_tc.c; for the tests). */
char *mk_codegen_source(const mk_launch *l, bool stamp, int occupancy, mk_error **err);

/* codegen.c: a generated kernel's name, after the kind of its group and its
 * members' ops, in graph order, each once ("mk_pointwise_add_silu_mul",
 * "mk_matvec_rms_norm_matmul_argmax"), as Inductor names its kernels: never
 * a node's id, so identical layers keep one kernel. At most
 * MK_KERNEL_NAME_MAX characters before a last "_more". */
#define MK_KERNEL_NAME_MAX 96
void mk_codegen_kernel_name(const mk_launch *l, char *name, size_t size);
/* codegen.c: what decides a kernel: its source without its comments (a line
 * of comment only goes whole), malloc'd, or NULL out of memory. The kernel
 * cache's keys hash it, so a comment (the header naming the nodes, their
 * ids and lines) changes no key. */
char *mk_codegen_program(const char *src);

/* kernel_table.c: the plugin's table of compiled kernels (kernels/generated.cu
 * keeps one for the process, under its lock), each kernel opaque here. An
 * entry is found by the program's hash, then its whole text (a hash
 * collision never shares a kernel); the hash is an argument so that a test
 * can force a collision. */
typedef struct {
    unsigned long long hash; /* mk_codegen_program_hash(program) */
    int arch;
    char *program;           /* owned: the text that decides the kernel */
    void *library, *kernel;  /* cudaLibrary_t, cudaKernel_t */
} mk_kernel_entry;
typedef struct {
    mk_kernel_entry *entries; /* (cap), n used */
    int n, cap;
} mk_kernel_table;
unsigned long long mk_codegen_program_hash(const char *program);
/* The entry of program for arch, or NULL. */
const mk_kernel_entry *mk_kernel_table_find(const mk_kernel_table *t, unsigned long long hash,
                                            int arch, const char *program);
/* Adds an entry with a copy of program; -1 out of memory (the table unchanged). */
int mk_kernel_table_add(mk_kernel_table *t, unsigned long long hash, int arch,
                        const char *program, void *library, void *kernel);
/* Frees the entries and their programs (not the kernels); the table is empty after. */
void mk_kernel_table_free(mk_kernel_table *t);

/* codegen.c: the CUDA C of a group's launch, its device scratch (bytes, zero
 * between launches) and its grid. */
void mk_codegen_group_source(mk_strbuf *b, const mk_launch *l);
size_t mk_codegen_group_aux_bytes(const mk_product_group *pg);
void mk_codegen_group_grid(const mk_launch *l, unsigned int *blocks, unsigned int *threads);
/* codegen.c: helpers of every generated kernel's source: instruction j of e
 * as CUDA C, and the fault record with how a kernel raises one. */
void mk_codegen_put_insn(mk_strbuf *b, const mk_expr *e, int j, bool f32);
/* The device functions the n programs' instructions call beyond CUDA's own
 * (skeletons/pointwise_ops.cuh: floormod, floordiv), or "" where none does:
 * pasted before the kernel. */
const char *mk_codegen_helpers(const mk_expr *const *programs, int n);
void mk_codegen_put_fault(mk_strbuf *b);
/* codegen.c: a product kernel's head up to its name: extern "C" __global__
 * with its launch bounds (threads, and at least min_blocks an SM where > 0),
 * or MK_TIMELINE_OCCUPANCY blocks an SM where the source defines it. */
void mk_codegen_put_head(mk_strbuf *b, long long threads, int min_blocks);
/* codegen.c: what follows the head: the kernel's name and parameters (the
 * arguments mk_cuda_product passes), its opening brace and MK_GROUP_START. */
void mk_codegen_put_entry(mk_strbuf *b, const mk_launch *l);
/* matvec.c: the same three for a matrix–vector group. */
void mk_codegen_product_source(mk_strbuf *b, const mk_launch *l);
size_t mk_codegen_product_aux_bytes(const mk_product_group *pg);
void mk_codegen_product_grid(const mk_launch *l, unsigned int *blocks, unsigned int *threads);
/* rows.c: a row group's source and grid (it takes no device scratch). */
void mk_codegen_rows_source(mk_strbuf *b, const mk_launch *l);
void mk_codegen_rows_grid(const mk_launch *l, unsigned int *blocks, unsigned int *threads);

#endif
