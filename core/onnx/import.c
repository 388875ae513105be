/*
 * import.c — an ONNX file as a script and its constants (onnx.h): the
 * ModelProto parsed by protobuf-c (the C generated from onnx.proto at build
 * time), the opset, initializers (values.c), graph inputs with their symbolic
 * dims fixed, the nodes in dependency order, each lowered by its row of the
 * mapping table (onnx_ops.c), the result line, and the public functions.
 */
#include "onnx.h"
#include "onnx.pb-c.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- graph inputs --------------------------------------------------------- */

static const mk_onnx_shape *asked_shape(ox_import *im, const char *name) {
    for (size_t i = 0; im->opts && i < im->opts->n_shapes; i++)
        if (im->opts->shapes[i].input && !strcmp(im->opts->shapes[i].input, name))
            return &im->opts->shapes[i];
    return NULL;
}

static int graph_input(ox_import *im, const Onnx__ValueInfoProto *vi, mk_error **err) {
    const char *name = vi->name ? vi->name : "";
    const Onnx__TypeProto__Tensor *tt = vi->type ? vi->type->tensor_type : NULL;
    if (!*name) return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: a graph input has no name", im->path);
    if (!tt)
        return mk_fail(err, MK_ERR_DTYPE, 0, 0, "%s: input '%s' is not a tensor (sequences, maps "
                       "and optionals are not supported)", im->path, name);
    mk_dtype d;
    if (ox_runtime_dtype(tt->has_elem_type ? tt->elem_type : 0, &d))
        return mk_fail(err, MK_ERR_DTYPE, 0, 0, "%s: input '%s' is %s (moonkaas takes FLOAT, "
                       "INT64, FLOAT16, BFLOAT16, INT8)", im->path, name,
                       ox_type_name(tt->elem_type));
    if (!tt->shape)
        return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: input '%s' has no shape", im->path, name);
    const mk_onnx_shape *asked = asked_shape(im, name);
    int rank = (int)tt->shape->n_dim;
    if (rank > MK_MAX_RANK)
        return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: input '%s' has rank %d (at most %d)",
                       im->path, name, rank, MK_MAX_RANK);
    if (asked && asked->rank != rank)
        return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: shapes.%s has rank %d, the input has %d",
                       im->path, name, asked->rank, rank);
    ox_value *v = ox_new_value(im, name, err);
    if (!v) return -1;
    v->onnx_type = tt->elem_type, v->dtype = d, v->rank = rank;
    for (int i = 0; i < rank; i++) {
        const Onnx__TensorShapeProto__Dimension *dim = tt->shape->dim[i];
        bool fixed = dim->has_dim_value;
        if (fixed && (dim->dim_value < 1 || dim->dim_value > MK_MAX_NUMEL))
            return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: input '%s' has dim %d of %lld", im->path,
                           name, i, (long long)dim->dim_value);
        if (asked && fixed && asked->shape[i] != dim->dim_value)
            return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: shapes.%s gives dim %d as %lld, the "
                           "model fixes it at %lld", im->path, name, i,
                           (long long)asked->shape[i], (long long)dim->dim_value);
        if (!fixed && !asked)
            return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: input '%s' dim %d is symbolic ('%s'): "
                           "give the input's shape (Lua: opts.shapes = {%s = {...}})", im->path,
                           name, i,
                           dim->dim_param && *dim->dim_param ? dim->dim_param : "unnamed",
                           name);
        v->shape[i] = fixed ? dim->dim_value : asked->shape[i];
    }
    int64_t numel = 0;
    if (ox_numel(rank, v->shape, &numel) || numel == 0)
        return mk_fail(err, MK_ERR_SHAPE, 0, 0, "%s: input '%s' has no elements or more than "
                       "2^48", im->path, name);
    if (ox_define(im, v, "input", err)) return -1;
    char *sname = ox_script_name(im, name, err);
    if (!sname) return -1;
    mk_onnx *o = im->o;
    char *oname = ox_strdup(im, name, err);
    if (!oname) return -1;
    ox_input *in = &o->inputs[o->n_inputs++];
    *in = (ox_input){.onnx_name = oname, .name = sname, .dtype = d, .rank = ox_node_rank(v)};
    memcpy(in->shape, ox_node_shape(v), sizeof(int64_t) * (size_t)in->rank);
    v->node = ++im->next_id;
    mk_strbuf_put(&im->script, "$%d = InputTensor(%s, %s, ", v->node, sname, mk_dtype_name(d));
    ox_put_shape(&im->script, in->rank, in->shape);
    mk_strbuf_put(&im->script, ");\n");
    return 0;
}

/* ---- nodes in dependency order -------------------------------------------------- */

/*
 * The order nodes run in: ONNX asks writers for one where every input comes
 * before its readers; a file that breaks it is sorted here (Kahn's), and a
 * cycle, or an input no one defines, is an error naming it.
 */
static int order_nodes(ox_import *im, const Onnx__GraphProto *g, size_t *order, mk_error **err) {
    size_t n = g->n_node;
    ox_map producer = {0};
    size_t *pending = calloc(n ? n : 1, sizeof *pending), *queue = order, head = 0, tail = 0;
    int rc = -1;
    if (!pending) goto nomem;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < g->node[i]->n_output; k++) {
            const char *out = g->node[i]->output[k];
            if (!*out) continue;
            if (ox_map_get(&producer, out) || ox_map_get(&im->values, out)) {
                mk_fail(err, MK_ERR_NAME, 0, 0, "%s: ONNX node '%s' (%s): output '%s' is "
                        "defined twice", im->path, ox_node_name(g->node[i]), ox_op_name(g->node[i]),
                        out);
                goto done;
            }
            if (ox_map_put(&producer, out, (void *)(uintptr_t)(i + 1))) goto nomem;
        }
    for (size_t i = 0; i < n; i++) {
        const Onnx__NodeProto *p = g->node[i];
        for (size_t k = 0; k < p->n_input; k++) {
            const char *in = p->input[k];
            if (!*in || ox_map_get(&im->values, in)) continue;
            if (!ox_map_get(&producer, in)) {
                mk_fail(err, MK_ERR_NAME, 0, 0, "%s: ONNX node '%s' (%s): input '%s' is not "
                        "defined (no initializer, graph input or node output has that name)",
                        im->path, ox_node_name(p), ox_op_name(p), in);
                goto done;
            }
            pending[i]++;
        }
        if (!pending[i]) queue[tail++] = i;
    }
    /* readers of each node's outputs: found by a scan per finished node (graphs are
     * small next to their tensors; a reader list would cost memory for nothing) */
    while (head < tail) {
        const Onnx__NodeProto *done = g->node[queue[head++]];
        for (size_t i = 0; i < n; i++) {
            if (!pending[i]) continue;
            const Onnx__NodeProto *p = g->node[i];
            for (size_t k = 0; k < p->n_input; k++)
                for (size_t j = 0; j < done->n_output; j++)
                    if (*done->output[j] && !strcmp(p->input[k], done->output[j]) &&
                        !--pending[i])
                        queue[tail++] = i;
        }
    }
    if (tail < n) {
        for (size_t i = 0; i < n; i++)
            if (pending[i]) {
                mk_fail(err, MK_ERR_NAME, 0, 0, "%s: ONNX node '%s' (%s) is on a cycle: its "
                        "inputs depend on its own outputs", im->path, ox_node_name(g->node[i]),
                        ox_op_name(g->node[i]));
                break;
            }
        goto done;
    }
    rc = 0;
    goto done;
nomem:
    mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import");
done:
    free(pending);
    ox_map_free(&producer);
    return rc;
}

/* ---- lowering ---------------------------------------------------------------- */

static bool in_list(const char *list, const char *word) {
    size_t len = strlen(word);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ' ');
        size_t k = end ? (size_t)(end - p) : strlen(p);
        if (k == len && !memcmp(p, word, len)) return true;
        p = end ? end + 1 : p + k;
    }
    return false;
}

static int lower_node(ox_import *im, const Onnx__NodeProto *p, int opset, mk_error **err) {
    ox_node n = {.im = im, .proto = p, .opset = opset};
    if (!p->op_type || !*p->op_type)
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: ONNX node '%s' has no op type", im->path,
                       ox_node_name(p));
    if (p->domain && *p->domain && strcmp(p->domain, "ai.onnx"))
        return ox_fail(&n, err, MK_ERR_NAME, "the domain '%s' is not supported (only ONNX's "
                       "own operators)", p->domain);
    bool other = false;
    const ox_row *row = ox_find_row(p->op_type, opset, &other);
    if (!row)
        return ox_fail(&n, err, MK_ERR_NAME, other ? "the importer maps %s at other opsets only "
                       "(doc/onnx.md)" : "%s is not supported (doc/onnx.md lists the ops the "
                       "importer maps)", p->op_type);
    for (size_t i = 0; i < p->n_attribute; i++) {
        const Onnx__AttributeProto *a = p->attribute[i];
        if (a->ref_attr_name && *a->ref_attr_name)
            return ox_fail(&n, err, MK_ERR_ARGUMENT, "attribute '%s' refers to a function's "
                           "attribute", a->name ? a->name : "?");
        if (!a->name || !in_list(row->desc.attributes, a->name))
            return ox_fail(&n, err, MK_ERR_ARGUMENT, "attribute '%s' is not supported (%s takes "
                           "%s)", a->name ? a->name : "?", p->op_type,
                           *row->desc.attributes ? row->desc.attributes : "none");
    }
    if (p->n_input > MK_MAX_INPUTS || p->n_output > 4)
        return ox_fail(&n, err, MK_ERR_ARGUMENT, "%zu inputs and %zu outputs are more than the "
                       "importer takes", p->n_input, p->n_output);
    n.n_in = (int)p->n_input, n.n_out = (int)p->n_output;
    for (int k = 0; k < n.n_in; k++)
        n.in[k] = *p->input[k] ? ox_map_get(&im->values, p->input[k]) : NULL;
    for (int k = 0; k < n.n_out; k++) {
        if (!*p->output[k]) continue;
        if (!(n.out[k] = ox_new_value(im, p->output[k], err))) return -1;
    }
    if (!n.n_out || !n.out[0])
        return ox_fail(&n, err, MK_ERR_ARGUMENT, "the node's first output has no name");
    if (row->lower(&n, err)) return -1;
    for (int k = 0; k < n.n_out; k++) {
        if (!n.out[k]) continue;
        if (!n.out[k]->node && !n.out[k]->data)
            return ox_fail(&n, err, MK_ERR_ARGUMENT, "output %d ('%s') is not one %s gives",
                           k + 1, n.out[k]->name, p->op_type);
        if (ox_define(im, n.out[k], "node output", err)) return -1;
    }
    return 0;
}

static int import_graph(ox_import *im, mk_error **err) {
    mk_onnx *o = im->o;
    const Onnx__ModelProto *m = o->model;
    const Onnx__GraphProto *g = m->graph;
    if (!g) return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: the model has no graph", im->path);
    o->opset = 0;
    for (size_t i = 0; i < m->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *s = m->opset_import[i];
        if (!s->domain || !*s->domain || !strcmp(s->domain, "ai.onnx"))
            o->opset = s->has_version ? (int)(s->version > INT_MAX ? INT_MAX : s->version) : 0;
    }
    if (o->opset < 13 || o->opset > 21)
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: ONNX opset %d is not supported (13 to 21)",
                       im->path, o->opset);
    for (size_t i = 0; i < g->n_initializer; i++) {
        const Onnx__TensorProto *t = g->initializer[i];
        if (!t->name || !*t->name)
            return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: initializer %zu has no name", im->path, i);
        ox_value *v = ox_new_value(im, t->name, err);
        if (!v || ox_tensor_proto(im, t, v, "initializer", err) ||
            ox_define(im, v, "initializer", err))
            return -1;
    }
    if (!(o->inputs = calloc(g->n_input ? g->n_input : 1, sizeof *o->inputs)))
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import");
    for (size_t i = 0; i < g->n_input; i++) {
        /* an input an initializer also names has a default: here it is a constant */
        if (g->input[i]->name && ox_map_get(&im->values, g->input[i]->name)) {
            ox_value *v = ox_map_get(&im->values, g->input[i]->name);
            if (v->data) continue;
        }
        if (graph_input(im, g->input[i], err)) return -1;
    }
    for (size_t i = 0; im->opts && i < im->opts->n_shapes; i++) {
        const char *name = im->opts->shapes[i].input;
        ox_value *v = name ? ox_map_get(&im->values, name) : NULL;
        if (!v || v->data)
            return mk_fail(err, MK_ERR_INPUT, 0, 0, "%s: shapes names '%s', which is not a graph "
                           "input", im->path, name ? name : "(null)");
    }
    size_t *order = malloc((g->n_node ? g->n_node : 1) * sizeof *order);
    if (!order) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import");
    if (order_nodes(im, g, order, err)) {
        free(order);
        return -1;
    }
    for (size_t i = 0; i < g->n_node; i++)
        if (lower_node(im, g->node[order[i]], o->opset, err)) {
            free(order);
            return -1;
        }
    free(order);

    if (!g->n_output) return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: the graph has no outputs", im->path);
    if (g->n_output > MK_MAX_OUTPUTS)
        return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "%s: %zu graph outputs (moonkaas models have "
                       "at most %d)", im->path, g->n_output, MK_MAX_OUTPUTS);
    if (!(o->outputs = calloc(g->n_output, sizeof *o->outputs)))
        return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import");
    int refs[MK_MAX_OUTPUTS];
    Onnx__NodeProto none = ONNX__NODE_PROTO__INIT;
    none.op_type = "graph output";
    for (size_t i = 0; i < g->n_output; i++) {
        const char *name = g->output[i]->name ? g->output[i]->name : "";
        ox_value *v = ox_map_get(&im->values, name);
        if (!v)
            return mk_fail(err, MK_ERR_NAME, 0, 0, "%s: graph output '%s' is not defined",
                           im->path, name);
        ox_node n = {.im = im, .proto = &none, .opset = o->opset};
        none.name = (char *)name;
        if ((refs[i] = ox_ref(&n, v, err)) < 0) return -1;
        if (!(o->outputs[i] = ox_strdup(im, name, err))) return -1;
        o->n_outputs++;
    }
    mk_strbuf_put(&im->script, "result = ");
    for (size_t i = 0; i < g->n_output; i++)
        mk_strbuf_put(&im->script, "%s$%d", i ? ", " : "", refs[i]);
    mk_strbuf_put(&im->script, ";\n");
    if (im->script.failed) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import: the script");
    o->script = im->script.s;
    im->script.s = NULL;
    return 0;
}

/* ---- the public functions ------------------------------------------------------ */

MK_API void mk_onnx_close(mk_onnx *o) {
    if (!o) return;
    if (o->model) onnx__model_proto__free_unpacked(o->model, NULL);
    for (size_t i = 0; i < o->n_owned; i++) free(o->owned[i]);
    for (size_t i = 0; i < o->n_maps; i++) mk_file_unmap(&o->maps[i]);
    free(o->owned);
    free(o->maps);
    free(o->constants);
    free(o->inputs);
    free(o->outputs);
    free(o->script);
    free(o);
}

/* Parses a whole file's bytes (for fuzzing too: no file). */
mk_onnx *mk_onnx_parse_buffer(const void *data, size_t size, const char *path, const char *dir,
                              const mk_onnx_options *opts, mk_error **err) {
    mk_onnx *o = calloc(1, sizeof *o);
    if (!o) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import"), NULL;
    o->model = onnx__model_proto__unpack(NULL, size, data);
    if (!o->model) {
        mk_onnx_close(o);
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: not an ONNX model (the protobuf does not "
                       "parse: a truncated file, or a field of the wrong type)", path), NULL;
    }
    ox_import im = {.o = o, .path = path, .dir = (char *)dir, .opts = opts};
    /* the rows read their errors back (an attribute of the wrong type): always collect one */
    mk_error *local = NULL;
    int rc = import_graph(&im, &local);
    if (rc && !local) MK_INTERNAL(&local, "an import failed without an error");
    if (err && !*err) *err = local;
    else mk_error_free(local);
    for (size_t i = 0; i < im.n_all; i++) {
        free(im.all[i]->name);
        free(im.all[i]);
    }
    free(im.all);
    free(im.script.s);
    ox_map_free(&im.values);
    ox_map_free(&im.names);
    if (rc) {
        mk_onnx_close(o);
        return NULL;
    }
    return o;
}

MK_API mk_onnx *mk_onnx_open(const char *path, const mk_onnx_options *opts, mk_error **err) {
    if (!path) return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_onnx_open: NULL path"), NULL;
    for (size_t i = 0; opts && i < opts->n_shapes; i++) {
        const mk_onnx_shape *s = &opts->shapes[i];
        bool ok = s->input && s->rank >= 0 && s->rank <= MK_MAX_RANK;
        for (int k = 0; ok && k < s->rank; k++) ok = s->shape[k] >= 1;
        if (!ok)
            return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_onnx_open: shapes[%zu] is not a name "
                           "with a shape of rank 0 to %d and positive dims", i, MK_MAX_RANK), NULL;
    }
    mk_mapped file;
    if (mk_file_map(path, OX_READ_BYTES, &file, err)) return NULL;
    char *real = realpath(path, NULL), *slash = real ? strrchr(real, '/') : NULL;
    if (!slash) {
        free(real);
        mk_file_unmap(&file);
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: cannot resolve its folder", path), NULL;
    }
    *slash = 0;
    mk_onnx *o = mk_onnx_parse_buffer(file.data, file.size, path, real, opts, err);
    mk_file_unmap(&file); /* protobuf-c copied what it keeps */
    free(real);
    return o;
}

MK_API const char *mk_onnx_script(const mk_onnx *o) { return o ? o->script : NULL; }
MK_API int mk_onnx_opset(const mk_onnx *o) { return o ? o->opset : 0; }
MK_API size_t mk_onnx_constant_count(const mk_onnx *o) { return o ? o->n_constants : 0; }
MK_API size_t mk_onnx_input_count(const mk_onnx *o) { return o ? o->n_inputs : 0; }
MK_API size_t mk_onnx_output_count(const mk_onnx *o) { return o ? o->n_outputs : 0; }

MK_API int mk_onnx_constant(const mk_onnx *o, size_t i, mk_tensor_info *info, const void **data) {
    if (!o || i >= o->n_constants) return -1;
    const ox_constant *c = &o->constants[i];
    if (info) {
        *info = (mk_tensor_info){.name = c->name, .dtype = c->dtype, .rank = c->rank};
        memcpy(info->shape, c->shape, sizeof info->shape);
    }
    if (data) *data = c->data;
    return 0;
}

MK_API int mk_onnx_input(const mk_onnx *o, size_t i, const char **onnx_name, mk_tensor_info *info) {
    if (!o || i >= o->n_inputs) return -1;
    const ox_input *in = &o->inputs[i];
    if (onnx_name) *onnx_name = in->onnx_name;
    if (info) {
        *info = (mk_tensor_info){.name = in->name, .dtype = in->dtype, .rank = in->rank};
        memcpy(info->shape, in->shape, sizeof info->shape);
    }
    return 0;
}

MK_API const char *mk_onnx_output_name(const mk_onnx *o, size_t i) {
    return o && i < o->n_outputs ? o->outputs[i] : NULL;
}

MK_API mk_model *mk_onnx_compile(mk_context *ctx, const mk_onnx *o, const mk_compile_options *opts,
                                 mk_error **err) {
    if (!o) return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_onnx_compile: NULL import"), NULL;
    mk_named_tensor *named = malloc((o->n_constants ? o->n_constants : 1) * sizeof *named);
    if (!named) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "ONNX import"), NULL;
    for (size_t i = 0; i < o->n_constants; i++)
        named[i] = (mk_named_tensor){o->constants[i].name, o->constants[i].data};
    mk_compile_options copy = opts ? *opts : (mk_compile_options){.device = MK_DEVICE_CPU};
    copy.borrow_constants = false; /* the import may be closed after */
    mk_model *m = mk_compile(ctx, o->script, named, o->n_constants, &copy, err);
    free(named);
    return m;
}

MK_API mk_model *mk_onnx_load(mk_context *ctx, const char *path, const mk_onnx_options *oopts,
                              const mk_compile_options *opts, mk_error **err) {
    mk_onnx *o = mk_onnx_open(path, oopts, err);
    if (!o) return NULL;
    mk_model *m = mk_onnx_compile(ctx, o, opts, err);
    mk_onnx_close(o);
    return m;
}
