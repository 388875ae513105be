/*
 * tensor.c — shapes, strides and sizes, shared by the parser, the passes, the
 * binder and the kernels.
 */
#include "internal.h"

#include <stdio.h>
#include <string.h>

int64_t mk_node_numel(const mk_node *n) {
    int64_t k = 1;
    for (int i = 0; i < n->rank; i++) k *= n->shape[i];
    return k;
}

size_t mk_node_bytes(const mk_node *n) {
    return (size_t)mk_node_numel(n) * mk_dtype_size(n->dtype);
}

void mk_contiguous_strides(int rank, const int64_t *shape, int64_t *stride) {
    int64_t s = 1;
    for (int i = rank - 1; i >= 0; i--) {
        stride[i] = s;
        s *= shape[i];
    }
}

const char *mk_shape_str(int rank, const int64_t *shape, char *buf, size_t size) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < rank && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", i ? ", " : "",
                                 (long long)shape[i]);
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

mk_tensor mk_tensor_broadcast(const mk_tensor *b, const mk_tensor *like) {
    mk_tensor t = *b;
    for (int i = 0; i < t.rank; i++) {
        if (t.shape[i] == 1 && like->shape[i] != 1) t.stride[i] = 0;
        t.shape[i] = like->shape[i];
    }
    return t;
}

int64_t mk_tensor_numel(const mk_tensor *t) {
    int64_t k = 1;
    for (int i = 0; i < t->rank; i++) k *= t->shape[i];
    return k;
}

bool mk_tensor_is_contiguous(const mk_tensor *t) {
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return false;
        s *= t->shape[i];
    }
    return true;
}
