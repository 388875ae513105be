/*
 * file.c — every file moonkaas writes, written whole or not at all, and the
 * digest that the kernel cache checks its entries with.
 *
 * A writer creates its temporary file with mkstemp in the target's own
 * directory: the name is unpredictable and made with O_EXCL, so a symbolic
 * link planted there is never followed, and the rename at the end stays on
 * one file system. The data is fsync'd before the rename, so a crash leaves
 * the old file or the new one, never a torn one. The file gets `mode` less
 * the process's umask.
 */
#include "graph.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct mk_file_writer {
    int fd;
    char *path, *tmp;
    char *dir; /* fsync'd after the rename */
};

/* The umask, without changing it (umask(2) would, for a moment, for every thread). */
static mode_t current_umask(void) {
    mode_t mask = 022;
    FILE *f = fopen("/proc/self/status", "re");
    if (!f) return mask;
    char line[128];
    while (fgets(line, sizeof line, f)) {
        unsigned m;
        if (sscanf(line, "Umask: %o", &m) == 1) {
            mask = (mode_t)m;
            break;
        }
    }
    fclose(f);
    return mask;
}

static void writer_free(mk_file_writer *w) {
    free(w->path);
    free(w->tmp);
    free(w->dir);
    free(w);
}

MK_API mk_file_writer *mk_file_begin(const char *path, int mode, mk_error **err) {
    if (!path) {
        mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_file_begin: NULL path");
        return NULL;
    }
    mk_file_writer *w = calloc(1, sizeof *w);
    if (!w) goto nomem;
    w->fd = -1;
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) : 0;
    const char *base = slash ? slash + 1 : path;
    if (!*base) {
        free(w);
        mk_fail(err, MK_ERR_FILE, 0, 0, "%s: not a file name", path);
        return NULL;
    }
    size_t tmp_size = dir_len + strlen(base) + 16;
    if (!(w->path = strdup(path)) || !(w->tmp = malloc(tmp_size)) ||
        !(w->dir = slash ? strndup(path, dir_len ? dir_len : 1) : strdup(".")))
        goto nomem;
    snprintf(w->tmp, tmp_size, "%.*s%s.%s.XXXXXX", (int)dir_len, path, slash ? "/" : "", base);
    if ((w->fd = mkostemp(w->tmp, O_CLOEXEC)) < 0) {
        mk_fail(err, MK_ERR_FILE, 0, 0, "%s: cannot create a temporary file beside it: %s", path,
                strerror(errno));
        writer_free(w);
        return NULL;
    }
    if (fchmod(w->fd, (mode_t)mode & ~current_umask() & 0777) != 0) {
        mk_fail(err, MK_ERR_FILE, 0, 0, "%s: %s", path, strerror(errno));
        mk_file_abort(w);
        return NULL;
    }
    return w;
nomem:
    if (w) writer_free(w);
    mk_fail(err, MK_ERR_NOMEM, 0, 0, "writing %s", path);
    return NULL;
}

MK_API int mk_file_put(mk_file_writer *w, const void *data, size_t n, mk_error **err) {
    const char *p = data;
    while (n) {
        ssize_t k = write(w->fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: %s", w->path, strerror(errno));
        p += k, n -= (size_t)k;
    }
    return 0;
}

MK_API void mk_file_abort(mk_file_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    unlink(w->tmp);
    writer_free(w);
}

MK_API int mk_file_commit(mk_file_writer *w, mk_error **err) {
    int rc = fsync(w->fd);
    int saved = errno;
    if (close(w->fd) != 0 && rc == 0) rc = -1, saved = errno;
    w->fd = -1;
    if (rc == 0 && rename(w->tmp, w->path) != 0) rc = -1, saved = errno;
    if (rc != 0) {
        mk_fail(err, MK_ERR_FILE, 0, 0, "%s: %s", w->path, strerror(saved));
        mk_file_abort(w);
        return -1;
    }
    int dir = open(w->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) { /* the rename itself durable; a file system that cannot is no error */
        fsync(dir);
        close(dir);
    }
    writer_free(w);
    return 0;
}

MK_API int mk_file_write_atomic(const char *path, const void *data, size_t n, int mode,
                                mk_error **err) {
    mk_file_writer *w = mk_file_begin(path, mode, err);
    if (!w) return -1;
    if (mk_file_put(w, data, n, err)) {
        mk_file_abort(w);
        return -1;
    }
    return mk_file_commit(w, err);
}

/* ---- SHA-256 (FIPS 180-4) ------------------------------------------------------- */

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) ((x) >> (n) | (x) << (32 - (n)))

/* One 64-byte block into the state h[8]. */
static void sha_block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ w[i - 15] >> 3;
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ w[i - 2] >> 10;
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + sha_k[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void mk_sha256(const void *data, size_t n, unsigned char out[32]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const unsigned char *p = data;
    size_t left = n;
    for (; left >= 64; p += 64, left -= 64) sha_block(h, p);
    unsigned char tail[128] = {0};
    memcpy(tail, p, left);
    tail[left] = 0x80;
    size_t blocks = left < 56 ? 1 : 2;
    uint64_t bits = (uint64_t)n * 8;
    for (int i = 0; i < 8; i++) tail[blocks * 64 - 1 - i] = (unsigned char)(bits >> (8 * i));
    for (size_t b = 0; b < blocks; b++) sha_block(h, tail + 64 * b);
    for (int i = 0; i < 8; i++)
        out[4 * i] = (unsigned char)(h[i] >> 24), out[4 * i + 1] = (unsigned char)(h[i] >> 16),
        out[4 * i + 2] = (unsigned char)(h[i] >> 8), out[4 * i + 3] = (unsigned char)h[i];
}

/* ---- files read whole or mapped ---------------------------------------------- */

int mk_file_map(const char *path, size_t read_limit, mk_mapped *out, mk_error **err) {
    *out = (mk_mapped){0};
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO does not hang the open */
    struct stat info;
    if (fd < 0 || fstat(fd, &info) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(info.st_mode)) {
        close(fd);
        return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: not a regular file", path);
    }
    size_t size = (size_t)info.st_size;
    if (size <= read_limit) {
        char *buf = malloc(size ? size : 1);
        size_t got = 0;
        while (buf && got < size) {
            ssize_t k = read(fd, buf + got, size - got);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break;
            got += (size_t)k;
        }
        close(fd);
        if (!buf) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "reading %s (%zu bytes)", path, size);
        *out = (mk_mapped){.data = buf, .size = got, .copied = true};
        return 0;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return mk_fail(err, MK_ERR_FILE, 0, 0, "%s: mmap: %s", path, strerror(e));
    *out = (mk_mapped){.data = map, .size = size, .copied = false};
    return 0;
}

void mk_file_unmap(mk_mapped *m) {
    if (m->copied) free(m->data);
    else if (m->data) munmap(m->data, m->size);
    *m = (mk_mapped){0};
}
