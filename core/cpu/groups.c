/*
 * groups.c — the CPU's runners of product groups (product.c): attention over
 * a cache's first rows (a decode step's, or a prompt's causal one, its scores
 * a block of rows at a time), and matrix–vector groups, whose threads share
 * the results' columns and run each chunk's dot products, epilogue program,
 * rotation and row write or ArgMax in one pass. Each reuses the row functions
 * of its nodes alone (matmul.c, ops.c), so a group equals its nodes bit for
 * bit, but where the nodes alone hand a larger product to BLAS.
 */
#include "cpu.h"
#include "vec.h"

#include <math.h>
#include <string.h>

/* Where node x's values lie while group l runs: an operand of the group, a
 * result (the group's memory, or the memory a row write writes), a view of a
 * member, or a member's scratch. */
static mk_tensor member_tensor(const mk_launch *l, const mk_node *x) {
    const mk_product_group *pg = mk_node_product(l->node);
    for (int k = 0; k < l->n_in; k++)
        if (l->node->in[k] == x) return l->in[k];
    mk_tensor t = {.dtype = x->dtype, .rank = x->rank};
    memcpy(t.shape, x->shape, sizeof t.shape);
    memcpy(t.stride, x->stride, sizeof t.stride);
    if (x->op->role == MK_ROLE_INPLACE) { /* a row write: in place into its x */
        t.data = member_tensor(l, x->in[0]).data;
        return t;
    }
    if (x->storage == MK_STORAGE_VIEW) { /* a view of a member that owns memory */
        t.data = (char *)member_tensor(l, x->owner).data + x->view_offset;
        return t;
    }
    for (int o = 0; o < pg->n_outs; o++)
        if (pg->out[o].end == x) {
            t.data = (float *)l->out.data + pg->out[o].offset;
            return t;
        }
    const mk_group *grp = l->node->group;
    for (int m = 0; m < grp->n_members; m++)
        if (grp->members[m] == x) t.data = (char *)l->scratch + pg->scratch[m];
    return t;
}

/* The group's member that runs kernel k (its members may include views). */
static const mk_node *member_of(const mk_launch *l, mk_kernel_id k) {
    const mk_group *grp = l->node->group;
    for (int i = 0; i < grp->n_members; i++)
        if (grp->members[i]->op->kernel == k) return grp->members[i];
    return NULL;
}

/*
 * A prompt's causal attention: per head, its m query rows (m / T runs of T
 * queries, row i seeing the first p - T + 1 + i % T keys), MK_CAUSAL_BLOCK of
 * a run at a time: the block's scores against the keys its last row sees, in
 * the head's block of scratch, each row's softmax over its own columns (the
 * rest zeroed: the block's product adds them as 0), and the block's sum of
 * V's rows. The same loops as the nodes alone where those take
 * mk_cpu_mm_loops (products under CPU_MM_SMALL): equal to them but for the
 * sign of a zero; BLAS sums larger ones in its own order.
 */
static int cpu_causal_attention(const mk_launch *l, mk_error **err) {
    const mk_product_group *pg = mk_node_product(l->node);
    const mk_attention_info *at = &pg->att;
    const mk_node *softmax = member_of(l, MK_KERNEL_CAUSAL_SOFTMAX);
    mk_tensor out = member_tensor(l, member_of(l, MK_KERNEL_PREFIX_MATMUL));
    const mk_tensor *q = &l->in[at->q], *kt = &l->in[at->kt], *v = &l->in[at->v];
    int64_t B = at->batch, m = at->m, d = at->d, n = at->n, S = at->s, T = at->period;
    int64_t p = *(const int64_t *)l->in[at->p].data;
    if (p < T || p > S) return mk_fault(err, softmax, MK_FAULT_END, p, S, T);
    float *sc = member_tensor(l, member_of(l, MK_KERNEL_MATMUL)).data, *o = out.data;
    const float *qp = q->data, *kp = kt->data, *vp = v->data;
    int64_t seen = p - T; /* keys every row sees */
    int64_t block = T < MK_CAUSAL_BLOCK ? T : MK_CAUSAL_BLOCK; /* rows of scores a head */
    CPU_FOR(B > 1 && par(m * (d + n) * p), h, B, {
        float *st = sc + h * block * S;
        for (int64_t i0 = 0, r; i0 < m; i0 += r) {
            int64_t t0 = i0 % T; /* the block's rows: within one run of T */
            r = T - t0 < block ? T - t0 : block;
            int64_t cols = seen + t0 + r; /* what the block's last row sees */
            mk_cpu_mm_loops(qp + h * q->stride[0] + i0 * q->stride[1], q->stride[1], q->stride[2],
                            kp + h * kt->stride[0], kt->stride[1], kt->stride[2], st, r, d, cols);
            for (int64_t i = 0; i < r; i++) {
                int64_t own = seen + t0 + i + 1;
                float *row = st + i * cols;
                mk_cpu_softmax_row(row, row, own, own);
                memset(row + own, 0, (size_t)(cols - own) * sizeof(float));
            }
            mk_cpu_mm_loops(st, cols, 1, vp + h * v->stride[0], v->stride[1], v->stride[2],
                            o + (h * m + i0) * n, r, cols, n);
        }
    });
    return 0;
}

/*
 * Decode attention over the first p cached rows only, in one parallel loop
 * over the batch (the heads): per head, the scores of its m query rows
 * against K's first p rows (dense [m, p] in the scores' scratch), their
 * softmax, and their sum of V's first p rows. Rows past p are never read, so
 * the cost grows with p, not with the cache.
 */
static int cpu_attention(const mk_launch *l, mk_error **err) {
    const mk_product_group *pg = mk_node_product(l->node);
    const mk_attention_info *at = &pg->att;
    if (at->causal) return cpu_causal_attention(l, err);
    mk_node *const *members = l->node->group->members; /* the scores, the softmax, the sum */
    const mk_node *softmax = members[1];
    mk_tensor scores = member_tensor(l, members[0]), out = member_tensor(l, members[2]);
    const mk_tensor *q = &l->in[at->q], *kt = &l->in[at->kt], *v = &l->in[at->v];
    /* the prefix: one, or one a run of B / runs heads (a batch's sequences) */
    const int64_t *ps = l->in[at->p].data;
    int64_t B = at->batch, m = at->m, d = at->d, n = at->n, runs = mk_tensor_numel(&l->in[at->p]);
    int64_t rows = 0; /* K's and V's rows read, over the heads */
    for (int64_t j = 0; j < runs; j++) {
        if (ps[j] < 0 || ps[j] > at->s) return mk_fault(err, softmax, MK_FAULT_PREFIX, ps[j], at->s, 0);
        rows += ps[j] * (B / runs);
    }
    float *sc = scores.data, *o = out.data;
    const float *qp = q->data, *kp = kt->data, *vp = v->data;
    CPU_FOR(B > 1 && par(m * (d + n) * rows), t, B, {
        int64_t p = ps[t / (B / runs)];
        float *st = sc + t * m * at->s, *ot = o + t * m * n;
        if (p == 0) {
            memset(ot, 0, (size_t)(m * n) * sizeof(float));
            continue;
        }
        mk_cpu_mm_loops(qp + t * q->stride[0], q->stride[1], q->stride[2],
                        kp + t * kt->stride[0], kt->stride[1], kt->stride[2], st, m, d, p);
        for (int64_t i = 0; i < m; i++)
            mk_cpu_softmax_row(st + i * p, st + i * p, p, p);
        mk_cpu_mm_loops(st, p, 1, vp + t * v->stride[0], v->stride[1], v->stride[2], ot, m, p,
                        n);
    });
    return 0;
}

/* dst [t] = elements e0 + t (t < len) of a result (rank >= 1, shape), read
 * from an operand broadcast onto it (its strides): one division per
 * dimension, then runs along the last one (copied, or filled where it is
 * broadcast), an odometer carrying between them; a division per element
 * cost more than the small products it follows. */
static void gather_run(float *restrict dst, const float *restrict src, int64_t e0, int64_t len,
                       int rank, const int64_t *shape, const int64_t *stride) {
    int64_t idx[MK_MAX_RANK], off = 0;
    for (int d = rank - 1; d >= 0; d--) {
        idx[d] = e0 % shape[d];
        off += idx[d] * stride[d];
        e0 /= shape[d];
    }
    int last = rank - 1;
    int64_t step = stride[last];
    while (len > 0) {
        int64_t run = shape[last] - idx[last] < len ? shape[last] - idx[last] : len;
        if (step == 1)
            memcpy(dst, src + off, (size_t)run * sizeof(float));
        else
            for (int64_t t = 0; t < run; t++) dst[t] = src[off + t * step];
        dst += run, len -= run;
        off -= idx[last] * step; /* back to the row's start */
        idx[last] = 0;
        for (int d = last - 1; d >= 0; d--) { /* the next row: an odometer */
            off += stride[d];
            if (++idx[d] < shape[d]) break;
            off -= shape[d] * stride[d];
            idx[d] = 0;
        }
    }
}

typedef struct {
    float v;
    int64_t at; /* -1: none yet */
} cpu_best;

/* A result as its chunks read it, resolved once per launch. */
typedef struct {
    const mk_product_out *r;
    const float *data[MK_X_IN];           /* per source: the operand (not a product) */
    cpu_weights w[MK_X_IN];               /* per source: a product's weights */
    int64_t stride[MK_X_IN][MK_MAX_RANK]; /* an operand's, broadcast onto its shape */
    const float *rot;                     /* the rotation's (cos, sin) operand, or NULL */
    int64_t rot_stride[MK_MAX_RANK];
    void *dst;                            /* element 0 of the values; ArgMax: row ids */
    const int64_t *at;                    /* a ReplaceAt write: row i's index, or NULL; x */
    int64_t at_a, at_s, at_e;             /* [m, at_a, at_s, at_e] around its axis (at_s) */
} cpu_mv_out;

/* Operand t broadcast onto (rank, shape): its strides into s. */
static void broadcast_strides(const mk_tensor *t, int rank, const int64_t *shape, int64_t *s) {
    mk_tensor like = {.rank = rank};
    memcpy(like.shape, shape, sizeof like.shape);
    mk_tensor b = mk_tensor_broadcast(t, &like);
    memcpy(s, b.stride, sizeof b.stride);
}

/* Columns [j0, j1) of row i of result x (j0 a multiple of 4); a the row of A,
 * or aq and as that row on the int8 grid (a FakeQuantize folded in). */
static void mv_chunk(const cpu_mv_out *x, const float *a, const int8_t *aq, const float *as,
                     int64_t k, int64_t i, int64_t j0, int64_t j1, cpu_best *best) {
    const mk_product_out *r = x->r;
    float src[MK_X_IN][CPU_MV_CHUNK], v[CPU_MV_CHUNK];
    const char *in[MK_X_IN];
    const int64_t ones[MK_X_IN] = {1, 1, 1, 1};
    int64_t len = j1 - j0, e0 = i * r->n + j0;
    for (int s = 0; s < r->n_src; s++) {
        const mk_product_source *ps = &r->src[s];
        if (ps->product >= 0 && aq)
            mk_cpu_mv_columns_q8(aq, as, &x->w[s], k, j0, j1, src[s]);
        else if (ps->product >= 0 && x->w[s].rows)
            mk_cpu_mv_rows(a, (const float *)x->w[s].data + j0, x->w[s].ldb, k, len, src[s]);
        else if (ps->product >= 0)
            mk_cpu_mv_columns(a, &x->w[s], k, j0, j1, src[s]);
        else
            gather_run(src[s], x->data[s], e0, len, ps->rank, ps->shape, x->stride[s]);
        in[s] = (const char *)src[s];
    }
    const float *val = src[0];
    if (r->program.n) {
        mk_cpu_program_f32(&r->program, (char *)v, in, ones, len);
        val = v;
    }
    if (x->rot) { /* (re, im) pairs times the rotation's, as complex_mul rounds them */
        float rot[CPU_MV_CHUNK];
        gather_run(rot, x->rot, e0, len, r->rotate_rank, r->rotate_shape, x->rot_stride);
        for (int64_t t = 0; t < len; t += 2) {
            float cr = rot[t], ci = rot[t + 1];
            float re = val[t], im = val[t + 1];
            v[t] = re * cr - im * ci;
            v[t + 1] = re * ci + im * cr;
        }
        val = v;
    }
    if (x->at) { /* column j of row i at x[i, j / at_e, at[i], j % at_e], in runs */
        for (int64_t t = 0; t < len;) {
            int64_t j = j0 + t, e = j % x->at_e, run = x->at_e - e < len - t ? x->at_e - e : len - t;
            int64_t to = ((i * x->at_a + j / x->at_e) * x->at_s + x->at[i]) * x->at_e + e;
            memcpy((float *)x->dst + to, val + t, (size_t)run * sizeof(float));
            t += run;
        }
        return;
    }
    if (!r->argmax) {
        memcpy((float *)x->dst + e0, val, (size_t)len * sizeof(float));
        return;
    }
    for (int64_t t = 0; t < len; t++) /* as mk_cpu_argmax: column 0, then only larger ones */
        if (j0 + t == 0 || val[t] > best->v) best->v = val[t], best->at = j0 + t;
}

/*
 * A matrix–vector group (product.c) in one parallel region. A's rows go
 * dense into scratch first, normalised where the group folds a norm in
 * (mk_cpu_rms_row, mk_cpu_layer_norm_row: as the node alone). The threads
 * then share the results' columns in contiguous runs of quads; per chunk of
 * CPU_MV_CHUNK columns and row of A, a thread takes its products' dot
 * products (mk_cpu_mv_columns; mk_cpu_mv_rows for weights held by rows),
 * gathers the operands the epilogue reads (gather_run), runs the epilogue's
 * program (mk_cpu_program_f32), rotates the pairs, and writes the values (into the
 * group's memory or the rows a write replaces) or keeps the row's best for
 * the ArgMax. Every value is the one the nodes alone compute, bit for bit;
 * the logits of a greedy classifier are never stored. Except where a
 * FakeQuantize is folded in: A then goes onto the int8 grid
 * (mk_cpu_q8_grid: q8_scale and q8_value's rule, as the node alone) and the
 * products are runq.c's integer dot products (mk_cpu_mv_columns_q8), which
 * the nodes alone (a float32 product of the rounded values) equal only up
 * to rounding.
 */
static int cpu_matvec(const mk_launch *l, mk_error **err) {
    const mk_product_group *pg = mk_node_product(l->node);
    const mk_tensor *at = &l->in[pg->a];
    int64_t m = pg->m, k = pg->k, rs = at->stride[0], cs = at->stride[1];
    float *a = l->scratch;
    for (int64_t i = 0; i < m; i++) {
        const float *row = (const float *)at->data + i * rs;
        if (cs == 1)
            memcpy(a + i * k, row, (size_t)k * sizeof(float));
        else
            for (int64_t j = 0; j < k; j++) a[i * k + j] = row[j * cs];
        if (pg->norm_b >= 0)
            mk_cpu_layer_norm_row(a + i * k, l->in[pg->norm_w].data, l->in[pg->norm_b].data,
                                  *(const float *)l->in[pg->norm_eps].data, a + i * k, k);
        else if (pg->norm_w >= 0)
            mk_cpu_rms_row(a + i * k, l->in[pg->norm_w].data, a + i * k, k);
    }
    int64_t g = pg->a8_group, groups = g ? m * k / g : 0;
    float *as = a + m * k;                     /* A on the int8 grid: a scale per group, */
    int8_t *aq = (int8_t *)(as + groups);      /* and the values */
    if (g) mk_cpu_q8_grid(a, m * k, g, aq, as);
    cpu_mv_out outs[MK_PRODUCTS_MAX];
    int64_t quads = 0, first[MK_PRODUCTS_MAX + 1]; /* result o's quads from first[o] */
    for (int o = 0; o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        cpu_mv_out *x = &outs[o];
        *x = (cpu_mv_out){.r = r, .dst = (float *)l->out.data + r->offset};
        for (int s = 0; s < r->n_src; s++) {
            const mk_product_source *ps = &r->src[s];
            int j = ps->product;
            const mk_tensor *t = &l->in[j >= 0 ? pg->b[j] : ps->in];
            x->data[s] = t->data;
            if (j < 0) {
                broadcast_strides(t, ps->rank, ps->shape, x->stride[s]);
                continue;
            }
            x->w[s] = (cpu_weights){.data = t->data, .dtype = t->dtype, .ldb = t->stride[1]};
            if (pg->b_rows[j]) x->w[s].ldb = t->stride[0], x->w[s].rows = true;
            if (pg->b_scale[j] >= 0) {
                const mk_tensor *sc = &l->in[pg->b_scale[j]];
                x->w[s].scale = sc->data;
                x->w[s].group = pg->b_group[j];
                x->w[s].ss_k = sc->stride[0];
                x->w[s].ss_n = sc->stride[1];
            }
        }
        if (r->rotate >= 0) {
            x->rot = l->in[r->rotate].data;
            broadcast_strides(&l->in[r->rotate], r->rotate_rank, r->rotate_shape, x->rot_stride);
        }
        if (r->row_index >= 0) { /* ReplaceAt's: every index checked first, as alone */
            const mk_tensor *w = &l->in[r->row_x];
            x->at = l->in[r->row_index].data;
            x->at_a = 1, x->at_s = w->shape[r->row_axis], x->at_e = 1;
            for (int d = 1; d < r->row_axis; d++) x->at_a *= w->shape[d];
            for (int d = r->row_axis + 1; d < w->rank; d++) x->at_e *= w->shape[d];
            for (int64_t i = 0; i < m; i++)
                if (x->at[i] < 0 || x->at[i] >= x->at_s)
                    return mk_fault(err, r->end, MK_FAULT_INDEX, x->at[i], i, x->at_s);
            x->dst = w->data;
        } else if (r->row_x >= 0) { /* checked now, as the write alone would */
            const mk_tensor *w = &l->in[r->row_x];
            int64_t begin = read_i64(&l->in[r->row_begin]), end = read_i64(&l->in[r->row_end]);
            if (mk_cpu_row_bounds(r->end, begin, end, w->shape[0], r->row_count, err)) return -1;
            x->dst = (float *)w->data + begin * (mk_tensor_numel(w) / w->shape[0]);
        }
        first[o] = quads;
        quads += (r->n + 3) / 4;
    }
    first[pg->n_outs] = quads;
    int threads = max_threads();
    cpu_best best[threads][MK_PRODUCTS_MAX][MK_MATVEC_ROWS];
    for (int t = 0; t < threads; t++)
        for (int o = 0; o < MK_PRODUCTS_MAX; o++)
            for (int i = 0; i < MK_MATVEC_ROWS; i++) best[t][o][i] = (cpu_best){-INFINITY, -1};
    CPU_REGION(par(m * k * 4 * quads), {
        int64_t q0, q1;
        my_share(quads, &q0, &q1);
        int me = thread_index();
        for (int o = 0; o < pg->n_outs; o++) {
            int64_t n = pg->out[o].n;
            int64_t j = 4 * (q0 > first[o] ? q0 - first[o] : 0);
            int64_t end = 4 * (q1 < first[o + 1] ? q1 - first[o] : first[o + 1] - first[o]);
            if (end > n) end = n;
            for (; j < end; j += CPU_MV_CHUNK) {
                int64_t j1 = j + CPU_MV_CHUNK < end ? j + CPU_MV_CHUNK : end;
                for (int64_t i = 0; i < m; i++)
                    mv_chunk(&outs[o], a + i * k, g ? aq + i * k : NULL, g ? as + i * (k / g) : NULL,
                             k, i, j, j1, &best[me][o][i]);
            }
        }
    });
    for (int o = 0; o < pg->n_outs; o++) /* the threads' bests, in column order */
        for (int64_t i = 0; pg->out[o].argmax && i < m; i++) {
            cpu_best b = {-INFINITY, -1};
            for (int t = 0; t < threads; t++)
                if (best[t][o][i].at >= 0 && (b.at < 0 || best[t][o][i].v > b.v)) b = best[t][o][i];
            ((int64_t *)outs[o].dst)[i] = b.at;
        }
    return 0;
}

/* A product group: attention, or a matrix–vector group with its gathered
 * operands at their ids' rows (mk_product_gather): the error of the
 * EmbeddingNode folded in where an id is out of range. */
int mk_cpu_product(const mk_launch *l, mk_error **err) {
    const mk_product_group *pg = mk_node_product(l->node);
    if (pg->kind == MK_PRODUCT_ATTENTION) return cpu_attention(l, err);
    if (!pg->n_gathers) return cpu_matvec(l, err);
    mk_launch at = *l;
    for (int r = 0; r < pg->n_gathers; r++) {
        const mk_product_gather *ga = &pg->gather[r];
        int64_t id = *(const int64_t *)l->in[ga->ids].data;
        if (id < 0 || id >= ga->rows) return mk_fault(err, ga->node, MK_FAULT_ID, id, 0, ga->rows);
        at.in[ga->in].data = (char *)at.in[ga->in].data + id * ga->row_bytes;
    }
    return cpu_matvec(&at, err);
}
