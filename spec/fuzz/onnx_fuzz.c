/*
 * onnx_fuzz.c — the ONNX importer on arbitrary bytes.
 *
 * The input is a whole .onnx file. mk_onnx_parse_buffer reads it from an
 * exact-size copy (ASan sees any read past it) with a model folder that does
 * not exist (external data cannot resolve); it must import or fail with a
 * message of a known kind, never MK_ERR_INTERNAL. Where it imports, the
 * script must compile on the CPU (or fail the same way) within
 * FUZZ_MAX_BYTES, and run once on zeroed inputs.
 *
 *     make fuzz                                  (all targets)
 *     build-fuzz/fuzz/onnx_fuzz -max_total_time=60 build-fuzz/corpus/onnx_fuzz
 * Seeds: build-fuzz/seeds/onnx_fuzz/ (spec/fuzz/seeds.lua writes them).
 */
#include "fuzz.h"

typedef struct mk_onnx mk_onnx;
mk_onnx *mk_onnx_parse_buffer(const void *data, size_t size, const char *path, const char *dir,
                              const mk_onnx_options *opts, mk_error **err);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!mk_onnx_op_count()) return 0; /* built without protobuf-c: nothing to fuzz */
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    mk_error *err = NULL;
    mk_onnx *o = mk_onnx_parse_buffer(copy, size, "fuzz.onnx", "/nonexistent-mk-fuzz", NULL, &err);
    free(copy);
    if (!o) {
        fuzz_check_error(&err, "import", NULL);
        return 0;
    }
    if (!mk_onnx_script(o)) FUZZ_FINDING("an import without a script");
    mk_context *ctx = mk_context_new(&err);
    if (!ctx) FUZZ_FINDING("context: %s", mk_error_message(err));
    mk_compile_options opts = {.device = MK_DEVICE_CPU, .max_bytes = FUZZ_MAX_BYTES, .threads = 1};
    mk_model *m = mk_onnx_compile(ctx, o, &opts, &err);
    if (!m) {
        fuzz_check_error(&err, "compile", mk_onnx_script(o));
    } else {
        size_t n = mk_model_input_count(m), outs = mk_model_output_count(m);
        mk_named_tensor in[MK_MAX_OUTPUTS * 2] = {{0}};
        mk_buffer out[MK_MAX_OUTPUTS] = {{0}};
        void *blocks[MK_MAX_OUTPUTS * 3] = {0};
        size_t nb = 0;
        bool ok = n <= MK_MAX_OUTPUTS * 2;
        for (size_t i = 0; ok && i < n; i++) {
            mk_tensor_info info;
            mk_model_input_info(m, i, &info);
            size_t bytes = mk_dtype_size(info.dtype);
            for (int k = 0; k < info.rank; k++) bytes *= (size_t)info.shape[k];
            ok = bytes <= FUZZ_MAX_DATA;
            if (ok) in[i] = (mk_named_tensor){info.name, blocks[nb++] = calloc(1, bytes)};
        }
        for (size_t i = 0; ok && i < outs; i++) {
            mk_tensor_info info;
            mk_model_output_info_at(m, i, &info);
            size_t bytes = mk_dtype_size(info.dtype);
            for (int k = 0; k < info.rank; k++) bytes *= (size_t)info.shape[k];
            ok = bytes <= FUZZ_MAX_DATA;
            if (ok) out[i] = (mk_buffer){blocks[nb++] = malloc(bytes), bytes};
        }
        if (ok && mk_evaluate_outputs(m, in, n, out, outs, &err)) fuzz_check_error(&err, "run", mk_onnx_script(o));
        for (size_t i = 0; i < nb; i++) free(blocks[i]);
        mk_model_free(m);
    }
    mk_context_free(ctx);
    mk_onnx_close(o);
    return 0;
}
