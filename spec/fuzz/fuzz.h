/*
 * fuzz.h — what the libFuzzer targets in spec/fuzz/ share: a byte reader that
 * turns fuzz input into choices, deterministic tensor data, the checks that
 * make a finding abort (libFuzzer then saves the input), and a Lua host with
 * the binding linked in, as spec/c/lua_host_test.c embeds it.
 *
 * A finding is anything the library promises never to do: crash, trip a
 * sanitizer, return an error without a message, report MK_ERR_INTERNAL (a
 * broken invariant), or, in the Lua loaders, raise an error where they should
 * return nil and a message naming the file ("attempt to index a nil value").
 *
 *     make fuzz FUZZ_SECONDS=60        builds every target and runs each (spec/fuzz/run.sh)
 *     build-fuzz/fuzz/script_fuzz build-fuzz/corpus/script_fuzz   one target by hand
 *     build-fuzz/fuzz/script_fuzz crash-<sha1>                     replay one input
 */
#ifndef MK_FUZZ_H
#define MK_FUZZ_H

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moonkaas.h"

#ifndef MK_FUZZ_ROOT
#define MK_FUZZ_ROOT "."
#endif

/* Models and loaders get at most this much memory from one input: a script may
 * legitimately declare a 1 GB buffer, which is not a bug but would trip
 * libFuzzer's RSS limit. */
#define FUZZ_MAX_BYTES ((size_t)64 << 20)
/* Inputs and constants are filled only up to this many bytes; larger ones are skipped. */
#define FUZZ_MAX_DATA ((size_t)4 << 20)

/* ---- choices from bytes ------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    size_t n;
} fuzz_bytes;

/* The next byte modulo `mod` (0 when the input is used up: short inputs build small things). */
static inline unsigned fuzz_take(fuzz_bytes *b, unsigned mod) {
    if (!b->n || mod == 0) return 0;
    unsigned v = *b->p++;
    b->n--;
    return v % mod;
}

static inline uint64_t fuzz_hash(const uint8_t *data, size_t size) { /* FNV-1a */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < size; i++) h = (h ^ data[i]) * 1099511628211ull;
    return h;
}

static inline uint64_t fuzz_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/*
 * Fills `numel` elements of `dtype` from the generator: float32 values in
 * ±{0.25, 0.5, ..., 2} (never zero; sums of their products are exact, so a
 * different summation order changes nothing until a nonlinear op), int64
 * values in [0, int_range), other dtypes any non-zero byte pattern.
 */
static inline void fuzz_fill(void *dst, mk_dtype dtype, int64_t numel, uint64_t *s,
                             int64_t int_range) {
    if (dtype == MK_DTYPE_FLOAT32) {
        float *f = dst;
        for (int64_t i = 0; i < numel; i++) {
            uint64_t r = fuzz_next(s);
            f[i] = (float)(1 + r % 8) * 0.25f * ((r >> 8) & 1 ? -1.0f : 1.0f);
        }
    } else if (dtype == MK_DTYPE_INT64) {
        int64_t *v = dst;
        for (int64_t i = 0; i < numel; i++)
            v[i] = int_range > 0 ? (int64_t)(fuzz_next(s) % (uint64_t)int_range) : 0;
    } else {
        uint8_t *u = dst;
        size_t bytes = (size_t)numel * mk_dtype_size(dtype);
        for (size_t i = 0; i < bytes; i++) u[i] = (uint8_t)(1 + fuzz_next(s) % 255);
    }
}

/* Elements of a tensor description, or -1 where they do not fit FUZZ_MAX_DATA. */
static inline int64_t fuzz_numel(const mk_tensor_info *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] <= 0 || t->shape[i] > (int64_t)FUZZ_MAX_DATA) return -1;
        n *= t->shape[i];
        if (n > (int64_t)FUZZ_MAX_DATA) return -1;
    }
    return n;
}

/* ---- findings ------------------------------------------------------------------ */

#define FUZZ_FINDING(...)                                        \
    do {                                                         \
        fprintf(stderr, "\n==== fuzz finding (%s:%d): ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                            \
        fprintf(stderr, "\n");                                   \
        abort();                                                 \
    } while (0)

/* An error the core returned: it must have a message and a known code, and must
 * not be an internal error (a broken invariant). Frees it and clears *errp. */
static inline void fuzz_check_error(mk_error **errp, const char *what, const char *script) {
    mk_error *err = *errp;
    *errp = NULL;
    if (!err) FUZZ_FINDING("%s failed without an error", what);
    const char *msg = mk_error_message(err);
    mk_error_code code = mk_error_code_of(err);
    if (!msg || !*msg) FUZZ_FINDING("%s: an error without a message (code %d)", what, (int)code);
    if (code < MK_ERR_SYNTAX || code > MK_ERR_FILE)
        FUZZ_FINDING("%s: error code %d outside the enum: %s", what, (int)code, msg);
    if (code == MK_ERR_INTERNAL)
        FUZZ_FINDING("%s: internal error: %s\n---- script\n%s", what, msg, script ? script : "");
    mk_error_free(err);
}

/* ---- a Lua host --------------------------------------------------------------- */

int luaopen_moonkaas_core(lua_State *L);

/*
 * Coverage of Lua code. libFuzzer sees only instrumented C, and the loaders
 * are Lua run by an uninstrumented liblua: without this it would be blind
 * (and shrink the corpus to nothing). A line hook counts each (previous line,
 * line) pair of every chunk in libFuzzer's extra counters, the section it
 * reads beside its own: new Lua paths are new features, as in C.
 */
#define FUZZ_LUA_COUNTERS (1u << 16)
__attribute__((used, section("__libfuzzer_extra_counters")))
static uint8_t fuzz_lua_counters[FUZZ_LUA_COUNTERS];
static uintptr_t fuzz_lua_prev;

static inline void fuzz_lua_hook(lua_State *L, lua_Debug *ar) {
    if (!lua_getinfo(L, "S", ar)) return;
    /* the chunk's source string lives as long as its functions: a stable id */
    uintptr_t loc = ((uintptr_t)ar->source * 0x9E3779B1u) ^ ((uintptr_t)ar->currentline * 0x85EBCA6Bu);
    fuzz_lua_counters[(loc ^ (fuzz_lua_prev >> 1)) % FUZZ_LUA_COUNTERS]++;
    fuzz_lua_prev = loc;
}

/* A state with the standard libraries, moonkaas.core registered statically and
 * the pure-Lua modules found under the repository's lua/ (package.cpath empty:
 * the binding is the one linked into this fuzzer). */
static inline lua_State *fuzz_lua_new(void) {
    lua_State *L = luaL_newstate();
    if (!L) abort();
    luaL_openlibs(L);
    luaL_requiref(L, "moonkaas.core", luaopen_moonkaas_core, 0);
    lua_pop(L, 1);
    lua_getglobal(L, "package");
    const char *root = getenv("MK_ROOT");
    if (!root || !*root) root = MK_FUZZ_ROOT;
    lua_pushfstring(L, "%s/lua/?.lua;%s/lua/?/init.lua", root, root);
    lua_setfield(L, -2, "path");
    lua_pushstring(L, "");
    lua_setfield(L, -2, "cpath");
    lua_pop(L, 1);
    lua_sethook(L, fuzz_lua_hook, LUA_MASKLINE, 0);
    return L;
}

/* Loads `code` (a chunk returning one function) and stores that function in the
 * registry; returns its reference. A chunk that does not load is the harness's bug. */
static inline int fuzz_lua_function(lua_State *L, const char *code, const char *name) {
    if (luaL_loadbuffer(L, code, strlen(code), name) != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK ||
        !lua_isfunction(L, -1)) {
        fprintf(stderr, "fuzz harness %s: %s\n", name, lua_tostring(L, -1));
        abort();
    }
    return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* Checks a lua_pcall of a harness function. The loaders report bad files as
 * return values (nil and a message naming the file) and the harnesses check
 * those messages themselves, so any error that reaches here is a finding: a
 * loader that indexed nil or did arithmetic on it ("attempt to ..."), gave a
 * library function a bad argument, raised a non-string, or failed a harness
 * check ("fuzz finding: ..."). */
static inline void fuzz_lua_check(lua_State *L, int status, const char *what) {
    if (status == LUA_OK) return;
    if (lua_type(L, -1) != LUA_TSTRING)
        FUZZ_FINDING("%s raised a %s, not a message", what, luaL_typename(L, -1));
    FUZZ_FINDING("%s: %s", what, lua_tostring(L, -1));
}

#endif
