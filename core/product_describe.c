/*
 * product_describe.c — the classes of the groups product.c makes: what a
 * matrix-vector or an attention group (a decode step's, or a prompt's causal
 * one) computes, in a phrase for the DOT picture and in full for its report
 * line (its products, their weights' form, folded norms and quantizers,
 * gathers, members and results).
 */
#include "passes.h"

#include <stdlib.h>

static void describe_attention(const mk_node *n, bool brief, mk_strbuf *b) {
    const mk_attention_info *a = &mk_node_product(n)->att;
    if (a->causal) {
        if (brief) {
            mk_strbuf_put(b, "causal attention, %d query rows at a time", MK_CAUSAL_BLOCK);
            return;
        }
        mk_strbuf_put(b, "one launch, causal: [%lld, %lld, %lld] queries, ", (long long)a->batch,
                      (long long)a->m, (long long)a->d);
        if (a->period == a->m)
            mk_strbuf_put(b, "row i over the first p - %lld + i", (long long)a->m - 1);
        else
            mk_strbuf_put(b, "runs of %lld (query heads sharing a kv head), row i over the first "
                             "p - %lld + i %% %lld", (long long)a->period, (long long)a->period - 1,
                          (long long)a->period);
        mk_strbuf_put(b, " of %lld cached rows (reads only those; the scores %d rows at a time, "
                         "never whole); members",
                      (long long)a->s, MK_CAUSAL_BLOCK);
        mk_group_put_members(n, b);
        return;
    }
    if (brief) {
        mk_strbuf_put(b, "decode attention over the first p rows");
        return;
    }
    mk_strbuf_put(b, "one launch, [%lld, %lld, %lld] queries over the first p of %lld cached rows "
                     "(reads only those%s); members",
                  (long long)a->batch, (long long)a->m, (long long)a->d, (long long)a->s,
                  a->early ? "; no launch before writes those before p - 1: they may load before "
                             "its wait"
                           : "");
    mk_group_put_members(n, b);
}

static void describe_matvec(const mk_node *n, bool brief, mk_strbuf *b) {
    const mk_product_group *pg = mk_node_product(n);
    if (brief) {
        mk_strbuf_put(b, "matrix-vector products with their prologue and epilogues");
        return;
    }
    mk_strbuf_put(b, "one launch, [%lld, %lld] @ %d product%s%s", (long long)pg->m, (long long)pg->k,
                  pg->n_products, pg->n_products == 1 ? "" : "s",
                  pg->norm_b >= 0   ? ", LayerNorm folded in"
                  : pg->norm_w >= 0 ? ", RmsNorm folded in"
                                    : "");
    if (pg->a8_group)
        mk_strbuf_put(b, "; A on the int8 grid in groups of %lld (FakeQuantize folded in): "
                         "integer dot products",
                      (long long)pg->a8_group);
    for (int j = 0; j < pg->n_products; j++) {
        const mk_node *w = n->in[pg->b[j]];
        if (pg->b_scale[j] >= 0)
            mk_strbuf_put(b, "; weights %d int8 in blocks of %lld, dequantized as read", j,
                          (long long)pg->b_group[j]);
        else if (w->dtype != MK_DTYPE_FLOAT32)
            mk_strbuf_put(b, "; weights %d %s, widened as read", j, mk_dtype_name(w->dtype));
        if (pg->b_rows[j]) mk_strbuf_put(b, "; weights %d read by rows", j);
    }
    for (int r = 0; r < pg->n_gathers; r++)
        mk_strbuf_put(b, "; operand %d at the row of %s $%d (folded in, no launch)", pg->gather[r].in,
                      pg->gather[r].node->op->name, pg->gather[r].node->id);
    mk_strbuf_put(b, "; members");
    mk_group_put_members(n, b);
    mk_strbuf_put(b, "; results");
    for (int o = 0; o < pg->n_outs; o++) {
        const mk_product_out *r = &pg->out[o];
        mk_strbuf_put(b, "%s $%d (%d instructions%s%s%s)", o ? "," : "", r->end->id, r->program.n,
                      r->rotate >= 0 ? ", rotated" : "", r->row_x >= 0 ? ", written into rows" : "",
                      r->argmax ? ", argmax of each row" : "");
    }
}

const mk_group_class mk_matvec_class = {MK_GROUP_PRODUCT, "matrix-vector", describe_matvec, free};
const mk_group_class mk_attention_class = {MK_GROUP_PRODUCT, "attention", describe_attention,
                                           free};
