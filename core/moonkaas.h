/*
 * moonkaas.h — the public C API of moonkaas, a small tensor compiler.
 *
 * A model is described by a *script* (the IR, HamKaas-compatible text), compiled
 * once for a device, and evaluated again and again:
 *
 *     mk_error *err = NULL;
 *     mk_context *ctx = mk_context_new(&err);
 *     const char *script =
 *         "$1 = InputTensor(x, float32, [2, 3]);\n"
 *         "$2 = ConstantTensor(w, float32, [3, 4]);\n"
 *         "$3 = MatMulNode($1, $2);\n"
 *         "$4 = ReLUNode($3);\n"
 *         "result = $4;\n";
 *     float w[12] = {...}, x[6] = {...}, y[8];
 *     mk_named_tensor constants[] = {{"w", w}};
 *     mk_model *m = mk_compile(ctx, script, constants, 1, NULL, &err);
 *     if (!m) { fprintf(stderr, "%s\n", mk_error_message(err)); mk_error_free(err); ... }
 *     mk_named_tensor inputs[] = {{"x", x}};
 *     if (mk_evaluate(m, inputs, 1, y, sizeof y, &err) != 0) { ... }
 *     mk_model_free(m);
 *     mk_context_free(ctx);
 *
 * Rules every function follows:
 *   - No global state besides tables filled once per process (pthread_once).
 *     Contexts may be shared by threads; a model is used by one thread at a
 *     time. The section "threads" below says exactly what may run at once.
 *   - Nothing here calls exit/abort. A fallible function returns NULL or -1 and,
 *     when `err` is not NULL, stores a new error the caller frees with
 *     mk_error_free. A failed call leaves the context usable.
 *   - Tensors cross the API as dense row-major arrays (float32 as `float`,
 *     int64 as `int64_t`) whose shape and dtype the script declares.
 */
#ifndef MOONKAAS_H
#define MOONKAAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MK_BUILDING) && defined(__GNUC__)
#define MK_API __attribute__((visibility("default")))
#else
#define MK_API
#endif

#define MK_VERSION_MAJOR 0
#define MK_VERSION_MINOR 1
#define MK_VERSION_PATCH 0
#define MK_MAX_RANK 6 /* dims of a tensor (was 4; mk_tensor_info holds this many) */
#define MK_MAX_OUTPUTS 8 /* nodes a script's result line may name */
/* The most elements one tensor may have (2^48): element counts and byte sizes
 * then never overflow. A larger shape is a shape error where it is declared. */
#define MK_MAX_NUMEL ((int64_t)1 << 48)

typedef struct mk_context mk_context;
typedef struct mk_model mk_model;
typedef struct mk_error mk_error;

/* ---- errors ------------------------------------------------------------- */

typedef enum {
    MK_ERR_SYNTAX = 1,  /* the script does not parse */
    MK_ERR_SHAPE,       /* shapes disagree, bad rank or dimension */
    MK_ERR_DTYPE,       /* a dtype an operation does not accept */
    MK_ERR_NAME,        /* unknown op, undefined $N, duplicate or unknown name */
    MK_ERR_ARGUMENT,    /* a bad argument to an API function */
    MK_ERR_INPUT,       /* missing, extra or duplicate inputs/constants at run/compile time */
    MK_ERR_EVAL,        /* a run-time value out of range (slice bounds, ids, prefix) */
    MK_ERR_NOMEM,       /* host or device memory exhausted */
    MK_ERR_DEVICE,      /* the device is missing or failed ("no CUDA device: ...") */
    MK_ERR_INTERNAL,    /* a broken invariant inside moonkaas (a bug: please report) */
    MK_ERR_NO_DEVICE,   /* compiled for CUDA where there is none ("no CUDA device: ...") */
    MK_ERR_FILE,        /* a file cannot be read or written, or its contents are malformed */
    MK_ERR_CANCELLED,   /* the host asked the context to stop (mk_context_cancel) */
    MK_ERR_BUSY,        /* the model is in a call already ("busy: ..."; see "host functions") */
} mk_error_code;

/* The whole message, e.g. "script:3:14: syntax error: expected ')'". */
MK_API const char *mk_error_message(const mk_error *);
MK_API mk_error_code mk_error_code_of(const mk_error *);
/* 1-based script position of the error, 0 where it is not about a script line. */
MK_API int mk_error_line(const mk_error *);
MK_API int mk_error_column(const mk_error *);
MK_API void mk_error_free(mk_error *);

/* ---- version ------------------------------------------------------------ */

/* "0.1.0"; also tells which devices this build has, e.g. "0.1.0 (cpu, cuda, cudnn)". */
MK_API const char *mk_version(void);
MK_API const char *mk_build_info(void);

/* ---- context ------------------------------------------------------------ */

MK_API mk_context *mk_context_new(mk_error **err);
/* Models compiled in a context keep it alive; freeing both, in any order, is safe. */
MK_API void mk_context_free(mk_context *);

/* ---- hosts: log, progress, cancel -----------------------------------------
 *
 * The library writes nothing to stderr or stdout. What it has to say goes to
 * the context's log function, if the host set one; how far a long call has
 * come goes to its progress function. Set them before the context's models
 * compile or run (not while calls run on other threads); NULL turns them off.
 * They are called on the thread making the call.
 *
 * What a host function may do, called for a call on model M in context C
 * (a compile's M is the model it makes, which the host has not seen yet):
 *
 *   - Any model of C but M, and any other context: compile, run, reset,
 *     free, as from the host's own code. A call made there nests: it reports
 *     to the same host functions (phases interleave), and its errors and
 *     cancels are its own; the outer call then goes on where it was and
 *     loses nothing (its progress, its inputs and outputs, its result).
 *   - M itself, and any model that shares memory with M (compile's `share`,
 *     either way): mk_evaluate, mk_evaluate_outputs, mk_model_run_steps and
 *     mk_model_reset fail with MK_ERR_BUSY ("busy: ...") and change nothing;
 *     the outer call finishes correctly. mk_model_free(M) does not free it
 *     under the call: M goes when the call returns (whose outputs are then
 *     written as usual), and M may not be used after the free. The read-only
 *     mk_model_* functions (info, script, stats, reports) work.
 *   - C: mk_context_cancel stops every call in flight in C, the nested ones
 *     and the one that called the host function; mk_context_cancel_call only
 *     the innermost call of C on this thread (the one the function is called
 *     for). mk_context_free only drops the host's reference: the models of C
 *     keep it. mk_context_set_log and _set_progress take effect at the next
 *     report.
 *
 * The same MK_ERR_BUSY answers a call on M from another thread while M is in
 * a call (the "threads" rules forbid it; the check makes it an error, not a
 * race).
 */
typedef enum { MK_LOG_INFO, MK_LOG_WARNING } mk_log_level;
typedef void (*mk_log_fn)(void *user, mk_log_level level, const char *message);
MK_API void mk_context_set_log(mk_context *, mk_log_fn fn, void *user);

typedef enum {
    MK_PHASE_COMPILE, /* mk_compile's stages (parse, passes, plan, memory, bind, device): of 6 */
    MK_PHASE_UPLOAD,  /* constants copied to the device: bytes */
    MK_PHASE_KERNELS, /* kernels generated and compiled (NVRTC) for the device: kernels */
    MK_PHASE_RUN,     /* launches of one evaluation run so far: CPU launches (after each);
                       * CUDA: its one graph, 0 of 1 before it starts and 1 of 1 after */
} mk_phase;
typedef void (*mk_progress_fn)(void *user, mk_phase phase, int64_t done, int64_t total);
MK_API void mk_context_set_progress(mk_context *, mk_progress_fn fn, void *user);
/* "compile", "upload", "kernels", "run"; "?" outside the enum. */
MK_API const char *mk_phase_name(mk_phase);

/*
 * Asks every call running in the context at this moment to stop: mk_compile
 * between its stages, constants and kernels; mk_evaluate on the CPU between
 * launches, on CUDA before its graph launches (a graph runs to its end). The
 * call fails with MK_ERR_CANCELLED and leaves everything usable: a cancelled
 * compile frees what it made, a cancelled model runs again on the next call
 * (its BufferTensors may hold what the launches before the stop wrote). Calls
 * that begin afterwards are not affected. Safe from any thread, and from the
 * log and progress functions.
 */
MK_API void mk_context_cancel(mk_context *);
/* From a log or progress function: stops, as mk_context_cancel does, only the
 * call that function is called for (the innermost call in the context on this
 * thread), not the calls around it. Elsewhere it does nothing. */
MK_API void mk_context_cancel_call(mk_context *);

/* ---- threads ------------------------------------------------------------
 *
 * What may run at the same time on different threads (spec/c/threads_test.c
 * does each on the CPU device, also under ThreadSanitizer in `make tsan`, and
 * the shared context's compiles and evaluations on CUDA, with and without
 * cuDNN, where there is a GPU):
 *
 *   - Functions without a context or model: mk_version, mk_build_info, the op
 *     and dtype tables, mk_op_infer, mk_script_format, mk_script_constants,
 *     mk_cuda_available and the error functions, from any number of threads
 *     (the CUDA plugin is looked for once, the tables are filled once).
 *   - mk_compile on one context from several threads at once, on any device.
 *     Compiles for CUDA, frees of CUDA models and the CUDA probe take turns
 *     behind one process-wide lock (a graph capture breaks when another
 *     thread synchronizes the device, as cudaFree and cuBLAS's setup do), so
 *     they wait for each other; CPU compiles never wait. A context's cuDNN
 *     handle and plan cache are used only under that lock.
 *   - Different models evaluate at once, of one context or not, CPU or CUDA
 *     (each has its own memory and, on CUDA, its own stream, cuBLAS handle
 *     and graph; evaluations take no lock).
 *   - One model is used by one thread at a time: mk_evaluate and
 *     mk_model_reset write its memory and its input and output slots, so two
 *     of these calls on one model must not overlap (lock around them, or
 *     compile a model per thread; the later of two that do fails with
 *     MK_ERR_BUSY rather than racing). The read-only mk_model_* functions
 *     (input/output info, script, stats, fusion report) may run alongside any
 *     call on the model but mk_model_free. A model may change threads between
 *     calls (compiled on one, evaluated on another, freed on a third) after
 *     the usual hand-off (a mutex, a queue, pthread_join).
 *   - mk_model_free and mk_context_free on any thread, in any order: each
 *     model holds an atomic reference to its context, and the last of the
 *     context and its models to go frees it. A model is freed once no other
 *     thread uses it; a context once no mk_compile in it is still running.
 *   - Errors are per call: the thread that gets one owns it and may pass it on.
 *
 * CPU evaluation runs its own OpenMP and OpenBLAS threads inside each call;
 * several host threads evaluating at once share the machine's cores. Its
 * parallel regions ask for OpenMP's thread count of the calling thread
 * (OMP_NUM_THREADS, omp_set_num_threads) but never more than the CPUs online
 * (sysconf(_SC_NPROCESSORS_ONLN)): libgomp ends the process when it cannot
 * create a team's threads, so OMP_NUM_THREADS=60000 runs with one thread per
 * CPU instead (OpenBLAS caps its own threads the same way). A system that
 * refuses even those threads (a process or cgroup limit below the CPU count)
 * still meets libgomp's exit: OpenMP has no way to report it; set
 * OMP_NUM_THREADS within the limit there.
 *
 * Which launches use threads is decided per model at compile by a cost rule
 * (core/cpu/device.c, doc/devices.md): a parallel region is taken to cost a
 * fixed fork cost, not timed, so the first compile in a process runs no
 * parallel region; a launch forks only where its weights stream from memory
 * (the model's constants exceed its threads' L2 caches) or where its reads
 * alone take longer than two forks. A small model (a game's policy MLP, 64 ->
 * 256 -> 256 -> 8) therefore runs on the calling thread, and no OpenMP
 * worker is ever started for it. mk_compile_options.threads caps one model:
 * `threads = 1` opens no parallel region for any of its launches (the
 * compile's log says "0 of N launches may use threads"), `threads = n` at
 * most n threads; the results are the same bit for bit whatever the count.
 * OpenBLAS (only the products of many rows that no group takes) follows it in
 * its OpenMP build, opened first where installed; its pthreads build keeps
 * its own process-wide count (OPENBLAS_NUM_THREADS).
 *
 * Idle OpenMP workers spin after each parallel region before they sleep
 * (libgomp: up to GOMP_SPINCOUNT iterations, 300,000 by default, about a
 * millisecond), taking a core from the host's own threads. libgomp reads
 * OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it is loaded, before any of
 * moonkaas's code runs, so the library cannot set them: a host whose frames
 * matter and whose models do fork sets OMP_WAIT_POLICY=passive in the
 * environment it starts with (doc/devices.md).
 */

/* ---- compiling ---------------------------------------------------------- */

typedef enum { MK_DEVICE_CPU = 0, MK_DEVICE_CUDA = 1 } mk_device;

/*
 * Element types: one row each in the dtype table (size, script name, C type of
 * generated code, float or integer, accumulation type). float16, bfloat16 and
 * int8 are storage types whose kernels come later: an op given one where its
 * kernel does not take it fails to compile with, e.g.,
 * "dtype error: bfloat16 is not supported by MatMulNode on cpu".
 */
typedef enum {
    MK_DTYPE_FLOAT32 = 0,
    MK_DTYPE_INT64 = 1,
    MK_DTYPE_FLOAT16 = 2,
    MK_DTYPE_BFLOAT16 = 3,
    MK_DTYPE_INT8 = 4,
    MK_DTYPE_BOOL = 5, /* one byte, 0 or 1: comparisons' results, where's condition */
} mk_dtype;
#define MK_DTYPE_COUNT 6

/* A named dense row-major tensor; the name and shape come from the script. */
typedef struct {
    const char *name;
    const void *data;
} mk_named_tensor;

typedef struct {
    mk_device device;      /* zero: CPU */
    bool use_cudnn;        /* CUDA only: fuse matmul/pointwise groups through cuDNN */
    bool borrow_constants; /* CPU: use the caller's constant memory in place (e.g. an mmap'd
                              checkpoint); it must outlive the model */
    bool no_passes;        /* skip optional optimisation passes (debugging) */
    bool no_fusion;        /* one launch per node: no groups (pointwise, matrix-vector) */
    bool no_kernel_cache;  /* CUDA: compile generated kernels with NVRTC even where the disk
                              cache has them (and write none); see doc/devices.md */
    size_t max_bytes;      /* 0: no limit; else the most device memory the model may take
                              (arena + copied constants + buffers + the device's own:
                              mk_stats.device_bytes), checked before anything is allocated:
                              more is an MK_ERR_NOMEM error saying how much */
    mk_model *share;       /* NULL, or a compiled model on the same device whose state and
                              weights this one uses in place (see "sharing" below) */
    int threads;           /* CPU: 0, the default (the cost rule in "threads" above); n > 0,
                              at most n threads for any of this model's launches; 1, none of
                              its launches opens an OpenMP region. Negative: MK_ERR_ARGUMENT.
                              The CUDA device ignores it */
    bool allow_tf32;       /* CUDA: convolutions may run on tensor cores in TF32 (10-bit
                              mantissa inputs) where cuDNN offers it; off, float32 only */
} mk_compile_options;

/*
 * Sharing: a model compiled with `share = other` uses other's memory for
 *   - each named BufferTensor whose name other's script gives a BufferTensor:
 *     the two are one buffer (say a KV cache that a prompt's model writes and
 *     a step model reads); the dtype and shape must match, else the compile
 *     fails (MK_ERR_INPUT naming the buffer);
 *   - each ConstantTensor given the same data pointer as other's constant of
 *     that name, dtype and shape (weights uploaded once); other constants are
 *     the model's own.
 * Neither model copies anything. The new model holds a reference to `other`,
 * so freeing them in any order is safe (other's memory goes with the last).
 * Models that share must not evaluate or reset at the same time (one thread,
 * or a lock around both); mk_model_reset zeroes the shared buffers too.
 */

/* Is a CUDA device usable? Returns 1, or 0 with a reason in `reason` (may be NULL). */
MK_API int mk_cuda_available(char *reason, size_t reason_size);

/*
 * Parses, checks, plans and compiles `script`. `constants` gives the data of every
 * ConstantTensor by name (extra or missing names are an MK_ERR_INPUT error); the
 * data are copied unless opts->borrow_constants. `opts` may be NULL (CPU defaults).
 */
MK_API mk_model *mk_compile(mk_context *, const char *script,
                            const mk_named_tensor *constants, size_t n_constants,
                            const mk_compile_options *opts, mk_error **err);

/*
 * Runs the model once. Every InputTensor must be given exactly once by name;
 * `output_bytes` must equal the output's size. BufferTensor contents persist
 * from one evaluation to the next (zero after compile). A model with several
 * outputs (`result = $4, $9;`) is run by mk_evaluate_outputs instead.
 */
MK_API int mk_evaluate(mk_model *, const mk_named_tensor *inputs, size_t n_inputs,
                       void *output, size_t output_bytes, mk_error **err);

/* Where one output goes: `bytes` must equal its size (mk_model_output_info_at). */
typedef struct {
    void *data;
    size_t bytes;
} mk_buffer;

/* Runs the model once, every output into its buffer: `n_outputs` must equal
 * mk_model_output_count. Otherwise as mk_evaluate. */
MK_API int mk_evaluate_outputs(mk_model *, const mk_named_tensor *inputs, size_t n_inputs,
                               const mk_buffer *outputs, size_t n_outputs, mk_error **err);

/*
 * Recurrence. A script's `next` lines (after its result line) say what some
 * inputs hold from one step to the next:
 *
 *     result = $40, $41;          # output 0: the logits, output 1: the token
 *     next token = $41;           # at the next step, input 'token' is output 1
 *     next pos = pos + 1;         # int64 input 'pos' counts up by one a step
 *
 * mk_model_run_steps runs up to n steps in one call: step 0 takes `inputs` (every
 * input, as mk_evaluate), each later step the same ones except that a fed input
 * holds the previous step's output and a counter its previous value plus its
 * increment; the caller's input memory is only read. Step s writes output o at
 * outputs[o].data + s * (its size): outputs[o].bytes must be n times its size.
 * With stop->enabled, the steps end after the first one whose output
 * stop->output (int64, one element) equals stop->value. Returns the number of
 * steps run (1..n), or -1 with *err set; a failed step leaves the outputs of the
 * steps before it written and the model usable. The CUDA device runs the steps
 * without returning to the host between them where the driver can (doc/guide.md).
 */
typedef struct {
    bool enabled;
    size_t output;  /* an int64 output of one element */
    int64_t value;
} mk_stop;

MK_API int64_t mk_model_run_steps(mk_model *, int64_t n, const mk_named_tensor *inputs,
                                  size_t n_inputs, const mk_buffer *outputs, size_t n_outputs,
                                  const mk_stop *stop, mk_error **err);

/* Zeroes every BufferTensor, as after compile (e.g. a KV cache before a new
 * generation). Costs a memset per buffer, no recompilation. */
MK_API int mk_model_reset(mk_model *, mk_error **err);

/* Frees the model (its memory goes with the last model that shares it). From a
 * host function of a call on this model, the free waits for that call to return. */
MK_API void mk_model_free(mk_model *);

/* ---- introspection ------------------------------------------------------ */

typedef struct {
    const char *name; /* NULL for the output */
    mk_dtype dtype;
    int rank;
    int64_t shape[MK_MAX_RANK];
    /* mk_op_infer only: the operand's data where the caller knows it (a front
     * end's constant bound), so its value is checked too; else NULL */
    const void *value;
} mk_tensor_info;

MK_API size_t mk_model_input_count(const mk_model *);
MK_API int mk_model_input_info(const mk_model *, size_t i, mk_tensor_info *out);
MK_API int mk_model_output_info(const mk_model *, mk_tensor_info *out); /* output 0 */
MK_API size_t mk_model_output_count(const mk_model *);
MK_API int mk_model_output_info_at(const mk_model *, size_t i, mk_tensor_info *out);
/* The model's `next` lines: how many, and the i-th: its input's index (as
 * mk_model_input_info counts), and either the output that feeds it (*output >= 0)
 * or -1 and the counter's increment in *add. */
MK_API size_t mk_model_next_count(const mk_model *);
MK_API int mk_model_next_info(const mk_model *, size_t i, size_t *input, int *output,
                              int64_t *add);
/* The script after passes, as the compiler printed it (owned by the model). */
MK_API const char *mk_model_script(const mk_model *);

typedef struct {
    size_t arena_bytes;       /* the one block all node outputs and scratch live in */
    size_t lower_bound_bytes; /* largest sum of bytes live at one step: no plan beats it */
    size_t constant_bytes;
    size_t buffer_bytes;      /* BufferTensor state */
    size_t shared_bytes;      /* constants and buffers used in place from `share` (not counted
                                 in constant_bytes or buffer_bytes) */
    int nodes;                /* nodes in the compiled graph */
    int launches;             /* kernel launches per evaluation */
    int fused_groups;         /* cuDNN groups (0 without cuDNN) */
    int pointwise_groups;     /* pointwise trees run as one program each (the grouping pass) */
    int product_groups;       /* matrix-vector products with their prologue and epilogues as
                                 one launch each (the matrix-vector pass) */
    double compile_ms;        /* parse to ready */
    double plan_ms;           /* the memory planner's share of compile_ms */
    int device;               /* mk_device */
    int cudnn_cache_hits;     /* fused groups whose plan came from the context's cache */
    int cudnn_rejected;       /* groups cuDNN could not run: plain kernels (see the report) */
    int cudnn_tf32_groups;    /* fused groups whose matmul runs on tensor cores in TF32: their
                                 error is about 1e-3 of the output's RMS, not float32's */
    size_t device_bytes;      /* what the device allocates for the model itself, beyond the
                                 arena, constants and buffers (CUDA: cuBLAS's workspace, the
                                 fault record, the step loop's words); max_bytes bounds
                                 arena + constants + buffers + device_bytes */
} mk_stats;

MK_API int mk_model_stats(const mk_model *, mk_stats *out);

/* One line per group: each pointwise group the grouping pass made (its
 * members and program), then each group the cuDNN fuser tried ("fused",
 * "cache hit" or "rejected: reason" with its nodes). Owned by the model; ""
 * when there is no group. */
MK_API const char *mk_model_fusion_report(const mk_model *);

/* The compiled plan as a Graphviz DOT picture (render with `dot -Tsvg`): a
 * node per op with its dtype, shape and memory (arena offset and size,
 * constant, buffer, view or in-place write of another node), edges from
 * operands to readers, views dashed to their owners, each pointwise group a
 * cluster of the nodes it replaced. Free with mk_string_free; NULL when out of
 * memory. */
MK_API char *mk_model_dot(const mk_model *);
/*
 * The CUDA C that runs launch i (0-based, in evaluation order: mk_stats.launches)
 * where it is a generated kernel (a pointwise, matrix-vector or attention
 * group), to read; free with mk_string_free. Works for a model compiled for
 * any device (the groups are the same; a CPU model's source is written for its
 * addresses, which may change a 16-byte load into four), and needs no CUDA
 * plugin: the core writes it (a CUDA=0 build too). NULL with an error where i
 * is out of range or the launch runs a library kernel.
 */
MK_API char *mk_model_kernel_source(const mk_model *, int launch, mk_error **err);
/* The arena as an SVG picture: x the evaluation order, y the offset, a box per
 * tensor from the node that writes it to its last reader, the live-bytes
 * lower bound as a line. Free with mk_string_free; NULL when out of memory. */
MK_API char *mk_model_memory_svg(const mk_model *);

/* The script as the compiler prints it after parsing and checking, without
 * compiling; for tools and tests. Free with mk_string_free. */
MK_API char *mk_script_format(const char *script, mk_error **err);
/* A script ends at its first NUL. A host that holds the script's length (a
 * Lua string, a file read whole) checks it with this first: 0, or -1 with a
 * syntax error at the line and column of a NUL before len (the text after it
 * would otherwise vanish unseen). */
MK_API int mk_script_check_bytes(const char *script, size_t len, mk_error **err);
MK_API void mk_string_free(char *);

/*
 * Checks one operation exactly as the compiler does for a script line and gives
 * its output's dtype and shape: `op` is a script name ("MatMulNode"), `inputs`
 * the operands' types in order, `attrs` the integer arguments (SliceNode: begin,
 * end; ReshapeNode: the shape; PermuteNode: the permutation). Front ends use it
 * to raise shape errors when a node is built. Not for Input/Constant/BufferTensor.
 * Where an `r` operand's `value` is given, its bounds are checked as well. An
 * op with a dtype argument (CastNode) takes it in out->dtype on entry.
 */
MK_API int mk_op_infer(const char *op, const mk_tensor_info *inputs, size_t n_inputs,
                       const int64_t *attrs, size_t n_attrs, mk_tensor_info *out,
                       mk_error **err);

/* The ConstantTensor declarations of a script, in script order (name, dtype,
 * shape), without compiling it: *count entries, freed with mk_tensor_infos_free.
 * Front ends check the tensors they pass against it. Not NULL on success, also
 * when there are none; NULL with an error when the script does not parse. */
MK_API mk_tensor_info *mk_script_constants(const char *script, size_t *count, mk_error **err);
MK_API void mk_tensor_infos_free(mk_tensor_info *);

/* ---- files written whole ------------------------------------------------
 *
 * Every file moonkaas writes goes through a writer, and a host may use one
 * too: mk_file_begin creates a temporary file with mkstemp beside path (an
 * unpredictable name made with O_EXCL: a link planted there is never
 * followed), mk_file_put appends, mk_file_commit fsyncs it and renames it over
 * path (a link at path is replaced, not followed), mk_file_abort removes it.
 * Readers of path see the old file or the new one, never part of one. Commit
 * and abort free the writer (commit also when it fails). The file gets mode
 * (0666, 0600) less the umask.
 */
typedef struct mk_file_writer mk_file_writer;
MK_API mk_file_writer *mk_file_begin(const char *path, int mode, mk_error **err);
MK_API int mk_file_put(mk_file_writer *w, const void *data, size_t n, mk_error **err);
MK_API int mk_file_commit(mk_file_writer *w, mk_error **err);
MK_API void mk_file_abort(mk_file_writer *w);
/* begin, one put, commit */
MK_API int mk_file_write_atomic(const char *path, const void *data, size_t n, int mode,
                                mk_error **err);

/* ---- safetensors files ---------------------------------------------------
 *
 * The format most weights are kept in: an 8-byte length, a JSON header naming
 * each tensor's dtype (F32, F16, BF16, I64, I8, BOOL here), shape and byte range,
 * then the data. Opening maps the file read-only and checks the whole header
 * (malformed JSON, unknown dtypes, offsets outside the file or not matching
 * the shape, duplicate names, byte ranges that overlap, repeat, leave a gap
 * or leave bytes after the last tensor are MK_ERR_FILE errors naming the file
 * and the tensors); tensors are read in place, valid until mk_safetensors_close.
 * A file up to 64 MiB is read into memory; a larger one is mapped, and a
 * mapping reads the file as it is when a page is touched: a file truncated
 * by another process while open ends the host with SIGBUS at the next read of
 * a page past its new end. mk_safetensors_open_copy reads any file into
 * memory (the cost: its size in memory, once), for files that may change. A
 * scalar (shape []) reads as [1]. The format does not promise alignment: a
 * tensor's data is aligned to its element size only where the writer put it so
 * (mk_safetensors_save does); copy it before reading elements where it is not.
 */
typedef struct mk_safetensors mk_safetensors;
MK_API mk_safetensors *mk_safetensors_open(const char *path, mk_error **err);
MK_API mk_safetensors *mk_safetensors_open_copy(const char *path, mk_error **err);
MK_API size_t mk_safetensors_count(const mk_safetensors *);
/* Tensor i, in the header's order: its name, dtype and shape in *info (the
 * name lives as long as the file is open), its bytes at *data. Any out
 * pointer may be NULL. Returns -1 when i is out of range. */
MK_API int mk_safetensors_tensor(const mk_safetensors *, size_t i, mk_tensor_info *info,
                                 const void **data, size_t *bytes);
MK_API void mk_safetensors_close(mk_safetensors *);
/* Writes n tensors (infos[i] names and describes data[i]) to path, whole or
 * not at all (a temporary file of an unpredictable name beside it, fsync'd
 * and renamed over it; a link planted anywhere is replaced, never followed). */
MK_API int mk_safetensors_save(const char *path, const mk_tensor_info *infos,
                               const void *const *data, size_t n, mk_error **err);

/* ---- ONNX models ----------------------------------------------------------
 *
 * An ONNX file (a ModelProto of opset 13 to 21) becomes a script and its
 * constants, compiled like any other (doc/onnx.md lists the ops it maps):
 *
 *     mk_onnx_shape fix[] = {{"x", 4, {1, 3, 224, 224}}};
 *     mk_onnx_options oo = {fix, 1};
 *     mk_model *m = mk_onnx_load(ctx, "net.onnx", &oo, NULL, &err);
 *
 * Initializers become ConstantTensors (external data is mapped, and must lie
 * in the model's folder); graph inputs become InputTensors, their symbolic
 * dims (dim_param) fixed by `shapes` or an error naming them; shape-computing
 * nodes (Shape, Gather, Concat, ... whose inputs are all known) are folded at
 * load. An op, attribute or type the importer does not map is an error naming
 * the node, its op type and opset, and the attribute. Inputs keep their ONNX
 * names in the script where those are script names ([A-Za-z_][A-Za-z0-9_.]*),
 * else they get one (mk_onnx_input tells it); the outputs are the graph's, in
 * its order. A build without protobuf-c fails every open with
 * "file error: ... built without protobuf-c".
 */
typedef struct mk_onnx mk_onnx;
typedef struct {
    const char *input; /* a graph input's ONNX name */
    int rank;
    int64_t shape[MK_MAX_RANK];
} mk_onnx_shape;
typedef struct {
    const mk_onnx_shape *shapes; /* the whole shape of inputs with symbolic dims */
    size_t n_shapes;
} mk_onnx_options;

MK_API mk_onnx *mk_onnx_open(const char *path, const mk_onnx_options *opts, mk_error **err);
/* The script the file became (owned by the import). */
MK_API const char *mk_onnx_script(const mk_onnx *);
MK_API int mk_onnx_opset(const mk_onnx *);
/* Constant i: its script name, dtype and shape in *info, its bytes at *data
 * (valid until mk_onnx_close). -1 past the end. */
MK_API size_t mk_onnx_constant_count(const mk_onnx *);
MK_API int mk_onnx_constant(const mk_onnx *, size_t i, mk_tensor_info *info, const void **data);
/* Input i: its ONNX name, and its script name, dtype and shape in *info. */
MK_API size_t mk_onnx_input_count(const mk_onnx *);
MK_API int mk_onnx_input(const mk_onnx *, size_t i, const char **onnx_name, mk_tensor_info *info);
/* Output i's ONNX name (the script's result line names them in this order), or NULL. */
MK_API size_t mk_onnx_output_count(const mk_onnx *);
MK_API const char *mk_onnx_output_name(const mk_onnx *, size_t i);
MK_API void mk_onnx_close(mk_onnx *);
/* Compiles an import (its constants copied: the import may be closed after). */
MK_API mk_model *mk_onnx_compile(mk_context *, const mk_onnx *, const mk_compile_options *opts,
                                 mk_error **err);
/* mk_onnx_open, mk_onnx_compile, mk_onnx_close. */
MK_API mk_model *mk_onnx_load(mk_context *, const char *path, const mk_onnx_options *oopts,
                              const mk_compile_options *opts, mk_error **err);

/* The importer's mapping table: one row per ONNX op it maps. */
typedef struct {
    const char *op_type;  /* "Gemm" */
    int since, until;     /* the opsets it covers */
    const char *attributes; /* the attributes it reads, space-separated */
    const char *becomes;  /* the moonkaas op or subgraph */
    const char *rules;    /* what it takes and what it refuses */
} mk_onnx_op_desc;
MK_API size_t mk_onnx_op_count(void);
MK_API const mk_onnx_op_desc *mk_onnx_op_info(size_t i);

/* ---- the op table ------------------------------------------------------- */

/* What an op is to the passes (the grouping pass reads only this). */
typedef enum {
    MK_ROLE_LEAF,      /* InputTensor, ConstantTensor, BufferTensor: data, no kernel */
    MK_ROLE_POINTWISE, /* elementwise; `expr` gives the scalar expression where there is one */
    MK_ROLE_REDUCTION, /* reduces or normalises along some axes */
    MK_ROLE_MATMUL,    /* a matrix product */
    MK_ROLE_VIEW,      /* new shape or strides over its input's memory, no kernel */
    MK_ROLE_INPLACE,   /* writes into its first operand and returns it */
    MK_ROLE_MOVE,      /* moves data (a copy that may become a view, a gather) */
    MK_ROLE_GROUP,     /* made by a fusion pass: several nodes as one */
} mk_op_role;

typedef enum { MK_LEAF_NONE, MK_LEAF_INPUT, MK_LEAF_CONSTANT, MK_LEAF_BUFFER } mk_leaf_kind;

enum {
    MK_OP_BROADCAST = 1 << 0, /* the operands broadcast as NumPy's do: dims aligned from
                                 the last, each pair equal or one of them 1 (a missing
                                 leading dim is 1); the result takes the larger */
    MK_OP_COMMUTES = 1 << 1,  /* a op b == b op a */
    MK_OP_INTERNAL = 1 << 2,  /* made by passes: scripts and front ends cannot build it */
    MK_OP_FUNCTION = 1 << 3,  /* front ends offer it as a function (mk.embedding(t, ids)),
                                 not as a method of its first operand */
};

typedef struct {
    const char *name;      /* script name, "MatMulNode" */
    const char *alias;     /* another accepted script name ("MulNode"), or NULL */
    /* One letter per argument: n a node; r an int64 [1] node read on the device
     * at run time (a bound: slice ends, a prefix); s a name; o a name that may
     * be left out (last only); d a dtype; l an integer list (shape,
     * permutation); i an integer. */
    const char *signature;
    mk_op_role role;
    mk_leaf_kind leaf;
    unsigned flags;        /* MK_OP_* */
    const char *method;    /* the front ends' name ("matmul", "sliced_softmax"), or NULL */
    const char *infix;     /* the front ends' operator ("+", "-", "*", "/"), or NULL */
    const char *expr;      /* pointwise: the scalar expression over a (and b), in C
                              ("a > 0 ? a : 0"); NULL where the op has its own kernel */
    const char *summary;   /* one line: what it computes */
} mk_op_desc;

/* The op table, for front ends and tools: rows 0 .. mk_op_count() - 1.
 * mk_op_info returns NULL past the end; the strings are static. A signature
 * holds at most one l, which takes every integer its i letters leave. */
MK_API size_t mk_op_count(void);
MK_API const mk_op_desc *mk_op_info(size_t i);
/* "pointwise", "reduction", ...; "input", "constant", "buffer" (NULL for
 * MK_LEAF_NONE or a value outside the enum). */
MK_API const char *mk_op_role_name(mk_op_role);
MK_API const char *mk_leaf_kind_name(mk_leaf_kind);

/* ---- dtypes ------------------------------------------------------------- */

MK_API size_t mk_dtype_size(mk_dtype);       /* bytes; 0 outside the table */
MK_API const char *mk_dtype_name(mk_dtype);  /* "float32"; "?" outside the table */
MK_API bool mk_dtype_is_float(mk_dtype);
/* The dtype a script name ("bfloat16", len bytes) stands for: 0, or -1 when unknown. */
MK_API int mk_dtype_parse(const char *name, size_t len, mk_dtype *out);

/* Converts n dense elements of src (dtype sd) into dst (dtype dd), as the
 * CastNode does on every device: to float16 / bfloat16 rounding to nearest
 * (ties to even, float16 overflow to ±inf), float to integer toward zero and
 * saturated (NaN to 0). 0, or -1 for a dtype outside the table or n < 0. */
MK_API int mk_convert(void *dst, mk_dtype dd, const void *src, mk_dtype sd, int64_t n);

/* llama2.c's int8 quantization (export.py's quantize_q80) of n floats in
 * groups of `group` consecutive ones: per group scale = max |x| / 127 and
 * q = x / scale rounded to the nearest integer, ties to even (a group of zeros:
 * scale 0, q 0). q gets n values and scale n / group. -1 where group < 1 or
 * does not divide n. A DequantizeNode of the two (groups along the last axis:
 * q [.., n], scale [.., n / group]) gives back q × scale. */
MK_API int mk_quantize_q8(const float *x, int64_t n, int64_t group, int8_t *q, float *scale);

#ifdef __cplusplus
}
#endif
#endif
