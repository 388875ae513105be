/*
 * file.c — tensors from files, and files written whole.
 *
 *   mapping     (moonkaas.mapping) one file's bytes, shared by every tensor
 *               made from that file and kept alive by them (user value 1 of
 *               each tensor): read into memory (files up to 64 MiB, or with
 *               copy) or mapped (mk.from_file)
 *   safetensors (moonkaas.safetensors) an open safetensors file, kept by the
 *               tensors mk.load_safetensors made from it
 *   file_writer (moonkaas.file_writer) a file being written whole
 *               (mk_file_begin), committed or aborted
 *   mk.quantize_file  float32 weights to int8 groups, read in pieces
 */
#include "lmk.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAPPINGS_KEY "moonkaas.mappings" /* weak table: file identity -> mapping */

/* ==== file mappings ========================================================== */

typedef struct {
    void *addr; /* NULL while closed */
    size_t size;
    bool copied; /* read into memory (free), else mapped (munmap) */
} lmk_mapping;

/* Files up to this size are read, not mapped: a mapped file truncated by
 * another process ends the host with SIGBUS at the next read of a lost page. */
#define LMK_READ_BYTES ((size_t)64 << 20)

static int mapping_gc(lua_State *L) {
    lmk_mapping *m = (lmk_mapping *)luaL_checkudata(L, 1, LMK_MAPPING_MT);
    if (m->addr && m->copied) free(m->addr);
    else if (m->addr) munmap(m->addr, m->size);
    m->addr = NULL;
    return 0;
}

/*
 * Pushes the mapping of the whole file `path` (size from st), sharing one per
 * file identity through a weak table so that every tensor of a checkpoint holds
 * the same mapping. A file up to LMK_READ_BYTES, or any with copy, is read
 * into memory instead (a "mapping" all the same). Errors name the file.
 */
static lmk_mapping *push_mapping(lua_State *L, const char *path, const struct stat *st,
                                 bool copy) {
    char key[128];
    copy = copy || (size_t)st->st_size <= LMK_READ_BYTES;
    snprintf(key, sizeof key, "%s%llu:%llu:%lld:%lld.%09ld", copy ? "read:" : "",
             (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
             (long long)st->st_size, (long long)st->st_mtim.tv_sec, (long)st->st_mtim.tv_nsec);
    lua_getfield(L, LUA_REGISTRYINDEX, MAPPINGS_KEY);
    int cache = lua_gettop(L);
    if (lua_getfield(L, cache, key) == LUA_TUSERDATA) {
        lua_remove(L, cache);
        return (lmk_mapping *)lua_touserdata(L, -1);
    }
    lua_pop(L, 1);
    /* Closed first: if anything below fails, nothing is left to release. */
    lmk_mapping *m = (lmk_mapping *)lua_newuserdatauv(L, sizeof *m, 0);
    *m = (lmk_mapping){0};
    luaL_setmetatable(L, LMK_MAPPING_MT);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return (void)lmk_raise(L, "file error", path, "%s", strerror(errno)), NULL;
    size_t size = (size_t)st->st_size, got = 0;
    if (copy) {
        char *buf = malloc(size ? size : 1);
        while (buf && got < size) {
            ssize_t k = read(fd, buf + got, size - got);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            got += (size_t)k;
        }
        int read_errno = errno;
        close(fd);
        if (!buf) return (void)lmk_raise(L, "out of memory", path, "reading %zu bytes", size), NULL;
        m->addr = buf, m->size = size, m->copied = true;
        if (got < size) /* shortened since the stat: its windows would run past the end */
            return (void)lmk_raise(L, "file error", path, "read %zu of its %zu bytes: %s", got,
                                   size, got ? "it changed while being read" : strerror(read_errno)),
                   NULL;
    } else {
        void *addr = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        int map_errno = errno;
        close(fd);
        if (addr == MAP_FAILED)
            return (void)lmk_raise(L, "file error", path, "mmap: %s", strerror(map_errno)), NULL;
        m->addr = addr, m->size = size;
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, cache, key);
    lua_remove(L, cache);
    return m;
}

/* mk.from_file(path, {offset =, dtype =, shape =, copy =}): a read-only window
 * into the file, read into memory (files up to 64 MiB, or with copy = true) or
 * mapped (push_mapping). */
static int l_from_file(lua_State *L) {
    const char *fn = "from_file";
    int64_t shape[MK_MAX_RANK];
    if (lua_type(L, 1) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "argument #1 must be a path, got %s", luaL_typename(L, 1));
    const char *path = lua_tostring(L, 1);
    if (lua_type(L, 2) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "argument #2 must be a table {offset =, dtype =, shape =}, got %s",
                      luaL_typename(L, 2));
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        if (strcmp(k, "offset") && strcmp(k, "dtype") && strcmp(k, "shape") && strcmp(k, "copy"))
            LMK_ARG_ERROR(L, fn, "unknown option %s (offset, dtype, shape, copy)", k);
        lua_pop(L, 1);
    }
    lua_getfield(L, 2, "offset");
    int64_t offset = lua_isnil(L, -1) ? 0 : lmk_check_int(L, -1, fn, "offset");
    lua_getfield(L, 2, "dtype");
    mk_dtype dtype = lmk_check_dtype(L, -1, fn, true);
    lua_getfield(L, 2, "shape");
    if (lua_isnil(L, -1)) LMK_ARG_ERROR(L, fn, "the options need a shape");
    int rank = lmk_check_shape(L, lua_gettop(L), fn, shape);
    lua_getfield(L, 2, "copy");
    bool copy = lua_toboolean(L, -1);
    lua_pop(L, 4);
    int64_t numel;
    size_t bytes = lmk_shape_bytes(L, fn, dtype, rank, shape, &numel);
    if (offset < 0)
        lmk_raise(L, "file error", path, "offset %lld is negative", (long long)offset);
    /* Elements are read in place (and borrowed by CPU models): keep them aligned. */
    if (offset % (int64_t)mk_dtype_size(dtype))
        lmk_raise(L, "file error", path, "offset %lld is not a multiple of %zu (%s)",
                  (long long)offset, mk_dtype_size(dtype), mk_dtype_name(dtype));
    struct stat st;
    if (stat(path, &st) != 0) lmk_raise(L, "file error", path, "%s", strerror(errno));
    if (!S_ISREG(st.st_mode)) lmk_raise(L, "file error", path, "not a regular file");
    if ((uint64_t)offset > (uint64_t)st.st_size ||
        bytes > (uint64_t)st.st_size - (uint64_t)offset)
        lmk_raise(L, "file error", path,
                  "offset %lld + %zu bytes (%s %s) runs past the end of the file (%lld bytes)",
                  (long long)offset, bytes, mk_dtype_name(dtype), LMK_SHAPE_STR(rank, shape),
                  (long long)st.st_size);
    lmk_mapping *m = push_mapping(L, path, &st, copy);
    lmk_tensor *t = (lmk_tensor *)lua_newuserdatauv(L, sizeof *t, 1);
    *t = (lmk_tensor){.dtype = dtype, .rank = rank, .numel = numel, .bytes = bytes,
                      .data = (char *)m->addr + offset, .readonly = true};
    memcpy(t->shape, shape, sizeof(int64_t) * (size_t)rank);
    luaL_setmetatable(L, LMK_TENSOR_MT);
    lua_pushvalue(L, -2);
    lua_setiuservalue(L, -2, 1); /* the tensor keeps its mapping alive */
    return 1;
}

/* mk.quantize_file(path, {offset =, shape =, group =}) -> q, scale: what
 * mk.quantize(mk.from_file(path, {offset =, dtype = "float32", shape =}), group)
 * gives, without holding the float32 values: the file is read in pieces of
 * whole groups (about 1 MiB), so a conversion at load keeps only the int8
 * result resident (llama2's -q q8 on a float32 checkpoint). */
static int l_quantize_file(lua_State *L) {
    const char *fn = "quantize_file";
    int64_t shape[MK_MAX_RANK];
    if (lua_type(L, 1) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "argument #1 must be a path, got %s", luaL_typename(L, 1));
    const char *path = lua_tostring(L, 1);
    if (lua_type(L, 2) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "argument #2 must be a table {offset =, shape =, group =}, got %s",
                      luaL_typename(L, 2));
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        const char *k = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?";
        if (strcmp(k, "offset") && strcmp(k, "shape") && strcmp(k, "group"))
            LMK_ARG_ERROR(L, fn, "unknown option %s (offset, shape, group)", k);
        lua_pop(L, 1);
    }
    lua_getfield(L, 2, "offset");
    int64_t offset = lua_isnil(L, -1) ? 0 : lmk_check_int(L, -1, fn, "offset");
    lua_getfield(L, 2, "group");
    if (lua_isnil(L, -1)) LMK_ARG_ERROR(L, fn, "the options need a group size");
    int64_t group = lmk_check_int(L, -1, fn, "the group size");
    lua_getfield(L, 2, "shape");
    if (lua_isnil(L, -1)) LMK_ARG_ERROR(L, fn, "the options need a shape");
    int rank = lmk_check_shape(L, lua_gettop(L), fn, shape);
    lua_pop(L, 3);
    int64_t numel, n = shape[rank - 1];
    size_t bytes = lmk_shape_bytes(L, fn, MK_DTYPE_FLOAT32, rank, shape, &numel);
    if (group < 1) LMK_ARG_ERROR(L, fn, "the group size must be positive, got %lld", (long long)group);
    if (n % group)
        LMK_ARG_ERROR(L, fn, "the group size %lld does not divide the last dim %lld of %s",
                      (long long)group, (long long)n, LMK_SHAPE_STR(rank, shape));
    if (offset < 0) lmk_raise(L, "file error", path, "offset %lld is negative", (long long)offset);
    int64_t sshape[MK_MAX_RANK];
    memcpy(sshape, shape, sizeof(int64_t) * (size_t)rank);
    sshape[rank - 1] = n / group;
    lmk_tensor *q = lmk_push_tensor(L, fn, MK_DTYPE_INT8, rank, shape);
    lmk_tensor *sc = lmk_push_tensor(L, fn, MK_DTYPE_FLOAT32, rank, sshape);

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) lmk_raise(L, "file error", path, "%s", strerror(errno));
    struct stat st;
    const char *problem = NULL;
    if (fstat(fd, &st) != 0) problem = strerror(errno);
    else if (!S_ISREG(st.st_mode)) problem = "not a regular file";
    else if ((uint64_t)offset > (uint64_t)st.st_size ||
             bytes > (uint64_t)st.st_size - (uint64_t)offset)
        problem = "the tensor runs past the end of the file";
    int64_t per = (((int64_t)1 << 20) / (group * 4) + 1) * group; /* whole groups, ~1 MiB */
    float *buf = problem ? NULL : malloc((size_t)(per < numel ? per : numel) * sizeof(float));
    if (!problem && !buf && numel) problem = "out of memory";
    for (int64_t at = 0; !problem && at < numel; at += per) {
        int64_t k = numel - at < per ? numel - at : per;
        size_t want = (size_t)k * sizeof(float), got = 0;
        while (got < want) { /* pread may return less; 0 means the file shrank */
            ssize_t r = pread(fd, (char *)buf + got, want - got, (off_t)(offset + at * 4) + (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) { problem = r < 0 ? strerror(errno) : "the file ended early"; break; }
            got += (size_t)r;
        }
        if (!problem)
            mk_quantize_q8(buf, k, group, (int8_t *)q->data + at, (float *)sc->data + at / group);
    }
    free(buf);
    close(fd);
    if (problem)
        lmk_raise(L, "file error", path, "quantize_file: %s (offset %lld, %s %s)", problem,
                  (long long)offset, "float32", LMK_SHAPE_STR(rank, shape));
    return 2;
}

/* ==== safetensors files ====================================================== */

#define LMK_SAFETENSORS_MT "moonkaas.safetensors"

static int safetensors_gc(lua_State *L) {
    mk_safetensors **h = (mk_safetensors **)luaL_checkudata(L, 1, LMK_SAFETENSORS_MT);
    mk_safetensors_close(*h);
    *h = NULL;
    return 0;
}

/* mk.load_safetensors(path [, {copy = true}]) -> {name = tensor}: read-only
 * windows into the file's bytes, which stay while any of them lives (a tensor
 * the file does not align to its element size is a copy). The bytes are read
 * into memory for a file up to 64 MiB or with copy, else mapped
 * (mk_safetensors_open: a mapped file truncated meanwhile ends the host). */
static int l_load_safetensors(lua_State *L) {
    const char *fn = "load_safetensors";
    if (lua_type(L, 1) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "argument #1 must be a path, got %s", luaL_typename(L, 1));
    bool copy = false;
    if (!lua_isnoneornil(L, 2)) {
        if (lua_type(L, 2) != LUA_TTABLE)
            LMK_ARG_ERROR(L, fn, "argument #2 must be a table {copy =}, got %s",
                          luaL_typename(L, 2));
        lua_pushnil(L);
        while (lua_next(L, 2)) {
            if (lua_type(L, -2) != LUA_TSTRING || strcmp(lua_tostring(L, -2), "copy"))
                LMK_ARG_ERROR(L, fn, "unknown option %s (copy)",
                              lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : "?");
            copy = lua_toboolean(L, -1);
            lua_pop(L, 1);
        }
    }
    lua_settop(L, 1);
    /* the handle first, closed: a raise below leaves nothing open */
    mk_safetensors **h = (mk_safetensors **)lua_newuserdatauv(L, sizeof *h, 0);
    *h = NULL;
    luaL_setmetatable(L, LMK_SAFETENSORS_MT);
    int handle = lua_gettop(L);
    mk_error *err = NULL;
    const char *path = lua_tostring(L, 1);
    if (!(*h = copy ? mk_safetensors_open_copy(path, &err) : mk_safetensors_open(path, &err)))
        return lmk_raise_core(L, err);
    size_t n = mk_safetensors_count(*h);
    lua_createtable(L, 0, n > INT32_MAX ? 0 : (int)n);
    for (size_t i = 0; i < n; i++) {
        mk_tensor_info info;
        const void *data;
        size_t bytes;
        mk_safetensors_tensor(*h, i, &info, &data, &bytes);
        if ((uintptr_t)data % mk_dtype_size(info.dtype)) {
            /* a writer that did not align it: elements are read whole, so a copy */
            lmk_tensor *t = lmk_push_tensor(L, fn, info.dtype, info.rank, info.shape);
            memcpy(t->data, data, bytes);
            lua_setfield(L, -2, info.name);
            continue;
        }
        lmk_tensor *t = (lmk_tensor *)lua_newuserdatauv(L, sizeof *t, 1);
        *t = (lmk_tensor){.dtype = info.dtype, .rank = info.rank,
                          .numel = (int64_t)(bytes / mk_dtype_size(info.dtype)), .bytes = bytes,
                          .data = (void *)data, .readonly = true};
        memcpy(t->shape, info.shape, sizeof(int64_t) * (size_t)info.rank);
        luaL_setmetatable(L, LMK_TENSOR_MT);
        lua_pushvalue(L, handle);
        lua_setiuservalue(L, -2, 1); /* the tensor keeps the file mapped */
        lua_setfield(L, -2, info.name);
    }
    return 1;
}

typedef struct {
    mk_tensor_info info;
    const void *data;
} named_tensor;

static int by_name(const void *a, const void *b) {
    return strcmp(((const named_tensor *)a)->info.name, ((const named_tensor *)b)->info.name);
}

/* mk.save_safetensors(path, {name = tensor}): every tensor, in name order.
 * The names are sorted here, in C: no Lua code runs between reading the
 * table and writing (a replaced table.sort once handed back what it liked). */
static int l_save_safetensors(lua_State *L) {
    const char *fn = "save_safetensors";
    if (lua_type(L, 1) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "argument #1 must be a path, got %s", luaL_typename(L, 1));
    if (lua_type(L, 2) != LUA_TTABLE)
        LMK_ARG_ERROR(L, fn, "argument #2 must be a table {name = tensor}, got %s",
                      luaL_typename(L, 2));
    lua_settop(L, 2);
    size_t n = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        size_t len = 0;
        const char *name = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &len) : NULL;
        if (!name || !lmk_to_tensor(L, -1))
            LMK_ARG_ERROR(L, fn, "the table must map names to tensors (a %s maps to a %s)",
                          luaL_typename(L, -2), luaL_typename(L, -1));
        if (strlen(name) != len) LMK_ARG_ERROR(L, fn, "a tensor's name holds a NUL byte");
        lua_pop(L, 1);
        n++;
    }
    /* as userdata the collector frees; names and tensors anchored in table 2 */
    named_tensor *all = (named_tensor *)lua_newuserdatauv(L, sizeof *all * (n ? n : 1), 0);
    mk_tensor_info *infos = (mk_tensor_info *)lua_newuserdatauv(L, sizeof *infos * (n ? n : 1), 0);
    const void **data = (const void **)lua_newuserdatauv(L, sizeof *data * (n ? n : 1), 0);
    size_t i = 0;
    lua_pushnil(L);
    while (lua_next(L, 2)) {
        lmk_tensor *t = lmk_to_tensor(L, -1);
        all[i] = (named_tensor){.info = {.name = lua_tostring(L, -2), .dtype = t->dtype,
                                         .rank = t->rank}, .data = t->data};
        memcpy(all[i].info.shape, t->shape, sizeof(int64_t) * (size_t)t->rank);
        i++;
        lua_pop(L, 1);
    }
    qsort(all, n, sizeof *all, by_name);
    for (i = 0; i < n; i++) infos[i] = all[i].info, data[i] = all[i].data;
    mk_error *err = NULL;
    if (mk_safetensors_save(lua_tostring(L, 1), infos, data, n, &err))
        return lmk_raise_core(L, err);
    return 0;
}

/* ==== files written whole ==================================================== */

#define LMK_WRITER_MT "moonkaas.file_writer"

/* The writer of a file being written; NULL once committed or aborted. */
static mk_file_writer **check_writer(lua_State *L, const char *fn) {
    mk_file_writer **w = (mk_file_writer **)luaL_checkudata(L, 1, LMK_WRITER_MT);
    if (!*w) LMK_ARG_ERROR(L, fn, "the file was already committed or aborted");
    return w;
}

/* w:write(s, ...): appends the strings. */
static int writer_write(lua_State *L) {
    mk_file_writer **w = check_writer(L, "write");
    for (int i = 2; i <= lua_gettop(L); i++) {
        size_t len;
        const char *s = luaL_checklstring(L, i, &len);
        mk_error *err = NULL;
        if (mk_file_put(*w, s, len, &err)) return lmk_raise_core(L, err);
    }
    lua_settop(L, 1);
    return 1;
}

/* w:commit(): the file in place, whole (fsync'd, renamed over the path). */
static int writer_commit(lua_State *L) {
    mk_file_writer **w = check_writer(L, "commit");
    mk_file_writer *taken = *w;
    *w = NULL; /* commit frees it, also when it fails */
    mk_error *err = NULL;
    if (mk_file_commit(taken, &err)) return lmk_raise_core(L, err);
    return 0;
}

/* w:abort(), __gc, __close: the temporary file removed, the path untouched. */
static int writer_abort(lua_State *L) {
    mk_file_writer **w = (mk_file_writer **)luaL_checkudata(L, 1, LMK_WRITER_MT);
    mk_file_abort(*w);
    *w = NULL;
    return 0;
}

/* mk.file_writer(path [, mode]): a file written whole or not at all
 * (mk_file_begin: never through a link planted at a predictable name). */
static int l_file_writer(lua_State *L) {
    const char *fn = "file_writer";
    if (lua_type(L, 1) != LUA_TSTRING)
        LMK_ARG_ERROR(L, fn, "argument #1 must be a path, got %s", luaL_typename(L, 1));
    int64_t mode = lua_isnoneornil(L, 2) ? 0666 : lmk_check_int(L, 2, fn, "mode");
    if (mode < 0 || mode > 0777) LMK_ARG_ERROR(L, fn, "mode must be within 0 and 0777 (octal)");
    mk_file_writer **w = (mk_file_writer **)lua_newuserdatauv(L, sizeof *w, 0);
    *w = NULL;
    luaL_setmetatable(L, LMK_WRITER_MT);
    mk_error *err = NULL;
    if (!(*w = mk_file_begin(lua_tostring(L, 1), (int)mode, &err))) return lmk_raise_core(L, err);
    return 1;
}

/* ==== registration =========================================================== */

void lmk_open_file(lua_State *L) {
    static const luaL_Reg mapping_meta[] = {{"__gc", mapping_gc}, {NULL, NULL}};
    lmk_define_type(L, LMK_MAPPING_MT, mapping_meta, NULL, NULL);
    lua_pop(L, 1);
    static const luaL_Reg safetensors_meta[] = {{"__gc", safetensors_gc}, {NULL, NULL}};
    lmk_define_type(L, LMK_SAFETENSORS_MT, safetensors_meta, NULL, NULL);
    lua_pop(L, 1);
    static const luaL_Reg writer_meta[] = {{"__gc", writer_abort}, {"__close", writer_abort},
                                           {NULL, NULL}};
    static const luaL_Reg writer_methods[] = {{"write", writer_write}, {"commit", writer_commit},
                                              {"abort", writer_abort}, {NULL, NULL}};
    lmk_define_type(L, LMK_WRITER_MT, writer_meta, writer_methods, NULL);
    lua_pop(L, 1);

    if (lua_getfield(L, LUA_REGISTRYINDEX, MAPPINGS_KEY) != LUA_TTABLE) {
        lua_newtable(L);
        lua_newtable(L);
        lua_pushstring(L, "v");
        lua_setfield(L, -2, "__mode");
        lua_setmetatable(L, -2);
        lua_setfield(L, LUA_REGISTRYINDEX, MAPPINGS_KEY);
    }
    lua_pop(L, 1);

    static const luaL_Reg functions[] = {
        {"from_file", l_from_file}, {"load_safetensors", l_load_safetensors},
        {"save_safetensors", l_save_safetensors}, {"file_writer", l_file_writer},
        {"quantize_file", l_quantize_file}, {NULL, NULL}};
    luaL_setfuncs(L, functions, 0);
}
