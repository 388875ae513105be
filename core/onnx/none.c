/*
 * none.c — the ONNX entry points of a build without protobuf-c (the Makefile
 * compiles this file instead of import.c and onnx_ops.c when protoc-c or
 * libprotobuf-c is missing): every open fails, saying why.
 */
#include "graph.h"

MK_API mk_onnx *mk_onnx_open(const char *path, const mk_onnx_options *opts, mk_error **err) {
    (void)opts;
    mk_fail(err, MK_ERR_FILE, 0, 0, "%s: moonkaas was built without protobuf-c: it cannot read "
            "ONNX files (install libprotobuf-c-dev and protobuf-c-compiler, and rebuild)",
            path ? path : "(null)");
    return NULL;
}
MK_API const char *mk_onnx_script(const mk_onnx *o) { (void)o; return NULL; }
MK_API int mk_onnx_opset(const mk_onnx *o) { (void)o; return 0; }
MK_API size_t mk_onnx_constant_count(const mk_onnx *o) { (void)o; return 0; }
MK_API int mk_onnx_constant(const mk_onnx *o, size_t i, mk_tensor_info *info, const void **data) {
    (void)o, (void)i, (void)info, (void)data;
    return -1;
}
MK_API size_t mk_onnx_input_count(const mk_onnx *o) { (void)o; return 0; }
MK_API int mk_onnx_input(const mk_onnx *o, size_t i, const char **name, mk_tensor_info *info) {
    (void)o, (void)i, (void)name, (void)info;
    return -1;
}
MK_API size_t mk_onnx_output_count(const mk_onnx *o) { (void)o; return 0; }
MK_API const char *mk_onnx_output_name(const mk_onnx *o, size_t i) { (void)o, (void)i; return NULL; }
MK_API void mk_onnx_close(mk_onnx *o) { (void)o; }
MK_API mk_model *mk_onnx_compile(mk_context *ctx, const mk_onnx *o, const mk_compile_options *opts,
                                 mk_error **err) {
    (void)ctx, (void)o, (void)opts;
    mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_onnx_compile: moonkaas was built without protobuf-c");
    return NULL;
}
MK_API mk_model *mk_onnx_load(mk_context *ctx, const char *path, const mk_onnx_options *oopts,
                              const mk_compile_options *opts, mk_error **err) {
    (void)ctx, (void)opts;
    mk_onnx_close(mk_onnx_open(path, oopts, err));
    return NULL;
}
MK_API size_t mk_onnx_op_count(void) { return 0; }
MK_API const mk_onnx_op_desc *mk_onnx_op_info(size_t i) { (void)i; return NULL; }
