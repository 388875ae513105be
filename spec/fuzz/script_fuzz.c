/*
 * script_fuzz.c — the script parser, printer and compiler on arbitrary text.
 *
 * The input is the script (NUL-terminated copy). For each one: mk_script_format
 * (and the formatted text must format to itself), mk_script_constants, then
 * mk_compile on the CPU with every declared constant given (deterministic
 * non-zero data from the input's hash) and, where it compiles, two evaluations
 * with filled inputs (every output), a short output refused, three steps of
 * mk_model_run_steps (its next lines, if any), the stats, the compiled script
 * and a reset. Every failure
 * must be an error value with a message; MK_ERR_INTERNAL is a finding.
 *
 *     make fuzz                                  (all targets)
 *     build-fuzz/fuzz/script_fuzz -max_total_time=60 build-fuzz/corpus/script_fuzz
 * Seeds: build-fuzz/seeds/script_fuzz/ (spec/fuzz/seeds.lua: scripts from the specs and the README).
 */
#include "fuzz.h"

/* Formatting is a fixed point: the printer writes what the parser reads back unchanged. */
static void check_format(const char *text) {
    mk_error *err = NULL;
    char *once = mk_script_format(text, &err);
    if (!once) {
        fuzz_check_error(&err, "mk_script_format", text);
        return;
    }
    char *twice = mk_script_format(once, &err);
    if (!twice) {
        const char *msg = err ? mk_error_message(err) : "(no error)";
        FUZZ_FINDING("the formatted script does not parse: %s\n---- input\n%s\n---- formatted\n%s",
                     msg, text, once);
    }
    if (strcmp(once, twice))
        FUZZ_FINDING("formatting is not a fixed point\n---- once\n%s\n---- twice\n%s", once, twice);
    mk_string_free(twice);
    mk_string_free(once);
}

/* Evaluates a compiled model twice (buffers persist) with inputs from the generator. */
static void evaluate(mk_model *m, const char *text, uint64_t *seed) {
    size_t n_in = mk_model_input_count(m);
    mk_named_tensor *inputs = calloc(n_in ? n_in : 1, sizeof *inputs);
    size_t total = 0;
    bool fits = inputs != NULL;
    for (size_t i = 0; fits && i < n_in; i++) {
        mk_tensor_info info;
        if (mk_model_input_info(m, i, &info)) FUZZ_FINDING("mk_model_input_info(%zu) failed", i);
        int64_t numel = fuzz_numel(&info);
        size_t bytes = numel < 0 ? 0 : (size_t)numel * mk_dtype_size(info.dtype);
        if (numel < 0 || (total += bytes) > FUZZ_MAX_DATA) {
            fits = false;
            break;
        }
        void *data = malloc(bytes);
        if (!data) abort();
        fuzz_fill(data, info.dtype, numel, seed, 4);
        inputs[i] = (mk_named_tensor){info.name, data};
    }
    /* every output, room for STEPS steps of each (run_steps) */
    enum { STEPS = 3 };
    size_t n_out = mk_model_output_count(m);
    mk_buffer outs[MK_MAX_OUTPUTS], steps[MK_MAX_OUTPUTS];
    if (n_out < 1 || n_out > MK_MAX_OUTPUTS) FUZZ_FINDING("the model has %zu outputs", n_out);
    for (size_t o = 0; o < n_out; o++) {
        mk_tensor_info out;
        if (mk_model_output_info_at(m, o, &out)) FUZZ_FINDING("mk_model_output_info_at failed");
        int64_t numel = fuzz_numel(&out);
        size_t bytes = numel < 0 ? 0 : (size_t)numel * mk_dtype_size(out.dtype);
        if (numel < 1 || (total += STEPS * bytes) > FUZZ_MAX_DATA) fits = false;
        outs[o] = (mk_buffer){fits ? malloc(STEPS * bytes) : NULL, bytes};
        steps[o] = (mk_buffer){outs[o].data, STEPS * bytes};
        if (fits && !outs[o].data) abort();
    }
    if (fits) {
        for (int rep = 0; rep < 2; rep++) {
            mk_error *err = NULL;
            if (mk_evaluate_outputs(m, inputs, n_in, outs, n_out, &err))
                fuzz_check_error(&err, "mk_evaluate_outputs", text);
        }
        /* the wrong output size is refused, never written past */
        mk_error *err = NULL;
        outs[0].bytes--;
        if (mk_evaluate_outputs(m, inputs, n_in, outs, n_out, &err) == 0)
            FUZZ_FINDING("mk_evaluate_outputs took %zu bytes for a %zu-byte output",
                         outs[0].bytes, outs[0].bytes + 1);
        outs[0].bytes++;
        fuzz_check_error(&err, "mk_evaluate_outputs (short output)", text);
        /* the script's recurrence (or STEPS evaluations where it has none) */
        int64_t ran = mk_model_run_steps(m, STEPS, inputs, n_in, steps, n_out, NULL, &err);
        if (ran < 0) fuzz_check_error(&err, "mk_model_run_steps", text);
        else if (ran != STEPS) FUZZ_FINDING("run_steps ran %lld of %d steps", (long long)ran, STEPS);
    }
    for (size_t o = 0; o < n_out; o++) free(outs[o].data);
    for (size_t i = 0; i < n_in; i++) free((void *)inputs[i].data);
    free(inputs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    uint64_t seed = fuzz_hash(data, size);

    check_format(text);

    /* The constants it declares, each given data (unless too large to fill). */
    mk_error *err = NULL;
    size_t n_const = 0;
    mk_tensor_info *consts = mk_script_constants(text, &n_const, &err);
    if (!consts) {
        fuzz_check_error(&err, "mk_script_constants", text);
        free(text);
        return 0;
    }
    mk_named_tensor *named = calloc(n_const ? n_const : 1, sizeof *named);
    size_t total = 0;
    bool fits = named != NULL;
    for (size_t i = 0; fits && i < n_const; i++) {
        int64_t numel = fuzz_numel(&consts[i]);
        size_t bytes = numel < 0 ? 0 : (size_t)numel * mk_dtype_size(consts[i].dtype);
        if (numel < 0 || (total += bytes) > FUZZ_MAX_DATA) {
            fits = false;
            break;
        }
        void *d = malloc(bytes);
        if (!d) abort();
        fuzz_fill(d, consts[i].dtype, numel, &seed, 4);
        named[i] = (mk_named_tensor){consts[i].name, d};
    }

    mk_context *ctx = mk_context_new(&err);
    if (!ctx) FUZZ_FINDING("mk_context_new failed");
    if (fits) {
        mk_compile_options opts = {.device = MK_DEVICE_CPU, .max_bytes = FUZZ_MAX_BYTES};
        mk_model *m = mk_compile(ctx, text, named, n_const, &opts, &err);
        if (!m) {
            fuzz_check_error(&err, "mk_compile", text);
        } else {
            mk_stats st;
            if (mk_model_stats(m, &st)) FUZZ_FINDING("mk_model_stats failed");
            if (st.arena_bytes < st.lower_bound_bytes)
                FUZZ_FINDING("arena %zu bytes is below the lower bound %zu", st.arena_bytes,
                             st.lower_bound_bytes);
            const char *compiled = mk_model_script(m);
            if (!compiled) FUZZ_FINDING("mk_model_script returned NULL");
            evaluate(m, text, &seed);
            if (mk_model_reset(m, &err)) fuzz_check_error(&err, "mk_model_reset", text);
            mk_model_free(m);
        }
    }
    mk_context_free(ctx);

    for (size_t i = 0; i < n_const; i++) free((void *)named[i].data);
    free(named);
    mk_tensor_infos_free(consts);
    free(text);
    return 0;
}
