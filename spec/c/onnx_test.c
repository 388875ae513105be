/*
 * onnx_test.c — the ONNX importer from C (mk_onnx_load, mk_onnx_open): a
 * ModelProto built with the C protobuf-c generates from core/onnx/onnx.proto
 * and packed to a file, compiled and run against double-precision loops;
 * the names an import exposes; external data inside and outside the model's
 * folder. In a build without protobuf-c, the error that says so.
 */
#include "test.h"

#include <sys/stat.h>
#include <unistd.h>

static char dir[] = "/tmp/mk_onnx_test_XXXXXX";

#ifdef MK_WITH_ONNX
#include "onnx.pb-c.h"

enum { M = 2, K = 3, N = 4 };
static float x[M * K], w[K * N], b[N];

static Onnx__ValueInfoProto *value_info(const char *name, int elem, int rank, const int64_t *dims) {
    Onnx__ValueInfoProto *v = calloc(1, sizeof *v);
    Onnx__TypeProto *t = calloc(1, sizeof *t);
    Onnx__TypeProto__Tensor *tt = calloc(1, sizeof *tt);
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(t);
    onnx__type_proto__tensor__init(tt);
    tt->has_elem_type = 1, tt->elem_type = elem;
    if (rank >= 0) {
        Onnx__TensorShapeProto *s = calloc(1, sizeof *s);
        onnx__tensor_shape_proto__init(s);
        s->n_dim = (size_t)rank;
        s->dim = calloc((size_t)rank + 1, sizeof *s->dim);
        for (int i = 0; i < rank; i++) {
            s->dim[i] = calloc(1, sizeof **s->dim);
            onnx__tensor_shape_proto__dimension__init(s->dim[i]);
            s->dim[i]->has_dim_value = 1, s->dim[i]->dim_value = dims[i];
        }
        tt->shape = s;
    }
    t->tensor_type = tt;
    v->name = (char *)name, v->type = t;
    return v;
}

static void free_value_info(Onnx__ValueInfoProto *v) {
    Onnx__TypeProto__Tensor *tt = v->type->tensor_type;
    if (tt->shape) {
        for (size_t i = 0; i < tt->shape->n_dim; i++) free(tt->shape->dim[i]);
        free(tt->shape->dim);
        free(tt->shape);
    }
    free(tt);
    free(v->type);
    free(v);
}

/* y = relu(x @ w + b): w as float_data (or external data at `location`), b as raw bytes */
static int write_model(const char *path, const char *location) {
    Onnx__TensorProto tw = ONNX__TENSOR_PROTO__INIT, tb = ONNX__TENSOR_PROTO__INIT;
    int64_t wdims[2] = {K, N}, bdims[1] = {N}, xdims[2] = {M, K};
    tw.name = "w", tw.has_data_type = 1, tw.data_type = 1, tw.n_dims = 2, tw.dims = wdims;
    Onnx__StringStringEntryProto loc = ONNX__STRING_STRING_ENTRY_PROTO__INIT;
    Onnx__StringStringEntryProto *entries[1] = {&loc};
    if (location) {
        loc.key = "location", loc.value = (char *)location;
        tw.n_external_data = 1, tw.external_data = entries;
        tw.has_data_location = 1, tw.data_location = ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL;
    } else {
        tw.n_float_data = K * N, tw.float_data = w;
    }
    tb.name = "b", tb.has_data_type = 1, tb.data_type = 1, tb.n_dims = 1, tb.dims = bdims;
    tb.has_raw_data = 1, tb.raw_data = (ProtobufCBinaryData){sizeof b, (uint8_t *)b};
    Onnx__NodeProto mm = ONNX__NODE_PROTO__INIT, add = ONNX__NODE_PROTO__INIT,
                    relu = ONNX__NODE_PROTO__INIT;
    char *mm_in[] = {"input.1", "w"}, *mm_out[] = {"xw"}, *add_in[] = {"xw", "b"},
         *add_out[] = {"s"}, *relu_in[] = {"s"}, *relu_out[] = {"/y:0"};
    mm.op_type = "MatMul", mm.n_input = 2, mm.input = mm_in, mm.n_output = 1, mm.output = mm_out;
    add.op_type = "Add", add.n_input = 2, add.input = add_in, add.n_output = 1,
    add.output = add_out;
    relu.op_type = "Relu", relu.n_input = 1, relu.input = relu_in, relu.n_output = 1,
    relu.output = relu_out;
    Onnx__NodeProto *nodes[] = {&mm, &add, &relu};
    Onnx__TensorProto *inits[] = {&tw, &tb};
    Onnx__ValueInfoProto *in = value_info("input.1", 1, 2, xdims), *out = value_info("/y:0", 1, -1, NULL);
    Onnx__GraphProto g = ONNX__GRAPH_PROTO__INIT;
    g.name = "c", g.n_node = 3, g.node = nodes, g.n_initializer = 2, g.initializer = inits;
    g.n_input = 1, g.input = &in, g.n_output = 1, g.output = &out;
    Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT;
    opset.domain = "", opset.has_version = 1, opset.version = 17;
    Onnx__OperatorSetIdProto *opsets[] = {&opset};
    Onnx__ModelProto m = ONNX__MODEL_PROTO__INIT;
    m.has_ir_version = 1, m.ir_version = 8, m.graph = &g, m.n_opset_import = 1,
    m.opset_import = opsets;
    size_t size = onnx__model_proto__get_packed_size(&m);
    uint8_t *buf = malloc(size);
    onnx__model_proto__pack(&m, buf);
    free_value_info(in);
    free_value_info(out);
    FILE *f = fopen(path, "wb");
    int rc = f && fwrite(buf, 1, size, f) == size ? 0 : -1;
    if (f) fclose(f);
    free(buf);
    return rc;
}

static void check_run(mk_model *m) {
    float y[M * N];
    mk_error *err = NULL;
    mk_named_tensor in = {"input.1", x};
    CHECK(mk_evaluate(m, &in, 1, y, sizeof y, &err) == 0, "%s", mk_error_message(err));
    mk_error_free(err);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = b[j];
            for (int l = 0; l < K; l++) s += (double)x[i * K + l] * w[l * N + j];
            s = s > 0 ? s : 0;
            CHECK(test_close(y[i * N + j], s, 1e-5, 1e-5), "y[%d][%d] = %g, want %g", i, j,
                  y[i * N + j], s);
        }
}

static void test_load_and_run(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/mlp.onnx", dir);
    CHECK(write_model(path, NULL) == 0, "cannot write %s", path);
    mk_context *ctx = test_context();
    mk_error *err = NULL;
    mk_model *m = mk_onnx_load(ctx, path, NULL, NULL, &err);
    CHECK(m, "%s", mk_error_message(err));
    mk_error_free(err);
    if (m) check_run(m);
    mk_model_free(m);
    mk_context_free(ctx);
}

static void test_names(void) {
    char path[256];
    snprintf(path, sizeof path, "%s/mlp.onnx", dir);
    mk_error *err = NULL;
    mk_onnx *o = mk_onnx_open(path, NULL, &err);
    CHECK(o, "%s", mk_error_message(err));
    mk_error_free(err);
    if (!o) return;
    const char *name;
    mk_tensor_info info;
    CHECK(mk_onnx_opset(o) == 17, "opset %d", mk_onnx_opset(o));
    CHECK(mk_onnx_input_count(o) == 1 && mk_onnx_input(o, 0, &name, &info) == 0, "one input");
    CHECK(!strcmp(name, "input.1") && !strcmp(info.name, "input.1"), "%s / %s", name, info.name);
    CHECK(info.rank == 2 && info.shape[0] == M && info.shape[1] == K, "the input's shape");
    CHECK(mk_onnx_output_count(o) == 1 && !strcmp(mk_onnx_output_name(o, 0), "/y:0"), "output");
    CHECK(mk_onnx_constant_count(o) == 2, "%zu constants", mk_onnx_constant_count(o));
    CHECK(strstr(mk_onnx_script(o), "MatMulNode($1, $2)"), "%s", mk_onnx_script(o));
    mk_onnx_close(o);
}

static void test_external_data(void) {
    char path[256], bin[256], outside[256], link[256];
    snprintf(path, sizeof path, "%s/ext.onnx", dir);
    snprintf(bin, sizeof bin, "%s/w.bin", dir);
    FILE *f = fopen(bin, "wb");
    CHECK(f && fwrite(w, sizeof w, 1, f) == 1, "cannot write %s", bin);
    if (f) fclose(f);
    CHECK(write_model(path, "w.bin") == 0, "cannot write %s", path);
    mk_context *ctx = test_context();
    mk_error *err = NULL;
    mk_model *m = mk_onnx_load(ctx, path, NULL, NULL, &err);
    CHECK(m, "%s", mk_error_message(err));
    mk_error_free(err);
    err = NULL;
    if (m) check_run(m);
    mk_model_free(m);
    /* a link inside the folder to a file outside it is outside */
    snprintf(outside, sizeof outside, "%s.outside.bin", dir);
    snprintf(link, sizeof link, "%s/link.bin", dir);
    f = fopen(outside, "wb");
    if (f) fwrite(w, sizeof w, 1, f), fclose(f);
    CHECK(symlink(outside, link) == 0, "symlink");
    const char *bad[] = {"link.bin", "../outside.bin", "/etc/passwd"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(write_model(path, bad[i]) == 0, "cannot write %s", path);
        m = mk_onnx_load(ctx, path, NULL, NULL, &err);
        CHECK(!m && mk_error_code_of(err) == MK_ERR_FILE &&
                  strstr(mk_error_message(err), "is not a file inside the model's folder"),
              "%s: %s", bad[i], mk_error_message(err));
        mk_error_free(err);
        err = NULL;
        mk_model_free(m);
    }
    CHECK(write_model(path, "missing.bin") == 0, "cannot write %s", path);
    m = mk_onnx_load(ctx, path, NULL, NULL, &err);
    CHECK(!m && strstr(mk_error_message(err), "'missing.bin': no such file in the model's folder"),
          "%s", mk_error_message(err));
    mk_error_free(err);
    unlink(link);
    unlink(outside);
    unlink(bin);
    mk_context_free(ctx);
}

static void test_missing_file(void) {
    mk_error *err = NULL;
    mk_onnx *o = mk_onnx_open("/nonexistent/model.onnx", NULL, &err);
    CHECK(!o && mk_error_code_of(err) == MK_ERR_FILE &&
              strstr(mk_error_message(err), "/nonexistent/model.onnx"),
          "%s", mk_error_message(err));
    mk_error_free(err);
    CHECK(!mk_onnx_open("/nonexistent/model.onnx", NULL, NULL), "without an error pointer");
}

int main(void) {
    test_srand(test_seed());
    for (int i = 0; i < M * K; i++) x[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < K * N; i++) w[i] = (float)test_uniform(-1, 1);
    for (int i = 0; i < N; i++) b[i] = (float)test_uniform(-1, 1);
    if (!mkdtemp(dir)) {
        printf("not ok - mkdtemp\n");
        return 1;
    }
    RUN(test_load_and_run);
    RUN(test_names);
    RUN(test_external_data);
    RUN(test_missing_file);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("# could not remove %s\n", dir);
    return test_summary("onnx_test");
}
#else
static void test_without_protobuf_c(void) {
    mk_error *err = NULL;
    mk_onnx *o = mk_onnx_open("model.onnx", NULL, &err);
    CHECK(!o && strstr(mk_error_message(err), "built without protobuf-c"), "%s",
          mk_error_message(err));
    mk_error_free(err);
    CHECK(mk_onnx_op_count() == 0, "a table without an importer");
}

int main(void) {
    (void)dir;
    RUN(test_without_protobuf_c);
    return test_summary("onnx_test");
}
#endif
