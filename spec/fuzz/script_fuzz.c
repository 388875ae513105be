/*
 * script_fuzz.c — the script parser, printer and compiler on arbitrary text.
 *
 * The input is the script (NUL-terminated copy). For each one: mk_script_format
 * (and the formatted text must format to itself), mk_script_constants, then
 * mk_compile on the CPU with every declared constant given (deterministic
 * non-zero data from the input's hash) and, where it compiles, two evaluations
 * with filled inputs, the stats, the compiled script and a reset. Every failure
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
    mk_tensor_info out;
    if (mk_model_output_info(m, &out)) FUZZ_FINDING("mk_model_output_info failed");
    int64_t out_numel = fuzz_numel(&out);
    if (fits && out_numel > 0) {
        size_t out_bytes = (size_t)out_numel * mk_dtype_size(out.dtype);
        void *y = malloc(out_bytes);
        if (!y) abort();
        for (int rep = 0; rep < 2; rep++) {
            mk_error *err = NULL;
            if (mk_evaluate(m, inputs, n_in, y, out_bytes, &err)) fuzz_check_error(&err, "mk_evaluate", text);
        }
        /* the wrong output size is refused, never written past */
        mk_error *err = NULL;
        if (mk_evaluate(m, inputs, n_in, y, out_bytes - 1, &err) == 0)
            FUZZ_FINDING("mk_evaluate took %zu output bytes for a %zu-byte output", out_bytes - 1,
                         out_bytes);
        fuzz_check_error(&err, "mk_evaluate (short output)", text);
        free(y);
    }
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
