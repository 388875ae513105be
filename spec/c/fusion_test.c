/*
 * fusion_test.c — the cuDNN fusion pass chooses groups without a device
 * (core/fusion.c): from the target (cudnn_groups) and from what the CUDA
 * device's prepare found at earlier compiles (mk_cudnn_note). Here, with no
 * GPU, prepare's verdicts are set by hand, as kernels/cudnn_fuser.cu sets
 * them, and the next compile's pass must follow them:
 *
 *   test_no_target     a target without cudnn_groups gets no cuDNN group
 *   test_chosen        the matmul group and the report lines after prepare
 *   test_rejected      a refused group: its nodes stay plain, the reason is
 *                      reported, the matmul is tried without its prologue
 *   test_workspace     a plan needing workspace: the next group has it as scratch
 *
 *   make build/tests/fusion_test && ./build/tests/fusion_test
 */
#include "passes.h"
#include "test.h"

/* relu(x) @ w + b, then silu: a matmul group with a prologue and a tail */
static const char *script = "$1 = InputTensor(x, float32, [4, 8]);\n"
                            "$2 = ConstantTensor(w, float32, [8, 12]);\n"
                            "$3 = ConstantTensor(b, float32, [1, 12]);\n"
                            "$4 = ReLUNode($1);\n"
                            "$5 = MatMulNode($4, $2);\n"
                            "$6 = SumNode($5, $3);\n"
                            "$7 = SiLUNode($6);\n"
                            "result = $7;\n";

static const mk_target cudnn_target = {.pointwise_operands = MK_X_IN, .cudnn_groups = true,
                                       .matvec_rows = 16};

typedef struct {
    mk_graph *g;
    mk_fusion *f;
} compiled;

/* Parses and runs the passes as a compile for cuDNN would, with the notes. */
static compiled passes(const mk_target *t, mk_cudnn_note **notes, unsigned call) {
    compiled c = {0};
    mk_error *err = NULL;
    c.g = mk_graph_parse(script, &err);
    CHECK(c.g, "parse: %s", mk_error_message(err));
    if (!c.g) return c;
    c.f = mk_fusion_new(NULL, notes, call);
    c.g->fusion = c.f;
    mk_compile_options o = {.device = MK_DEVICE_CUDA, .use_cudnn = true, .no_fusion = true};
    CHECK(mk_passes_run(c.g, &o, t, &err) == 0, "passes: %s", mk_error_message(err));
    mk_error_free(err);
    return c;
}

static void done(compiled *c) {
    mk_graph_free(c->g);
    mk_fusion_free(c->f);
}

static const mk_node *cudnn_node(const mk_graph *g, int k) {
    for (int i = 0; i < g->n_nodes; i++)
        if (mk_node_cudnn(g->nodes[i]) && k-- == 0) return g->nodes[i];
    return NULL;
}

static void test_no_target(void) {
    mk_cudnn_note *notes = NULL;
    mk_target t = cudnn_target;
    t.cudnn_groups = false;
    compiled c = passes(&t, &notes, 1);
    CHECK(c.g && !cudnn_node(c.g, 0) && c.f->n_groups == 0, "a cuDNN group without the target");
    done(&c);
}

static void test_chosen(void) {
    mk_cudnn_note *notes = NULL;
    compiled c = passes(&cudnn_target, &notes, 1);
    const mk_node *n = c.g ? cudnn_node(c.g, 0) : NULL;
    CHECK(n && n->group->n_members == 3 && n->group->scratch_bytes == 0 && !cudnn_node(c.g, 1),
          "one group of relu, matmul, sum and silu, no workspace yet");
    if (n) { /* prepare fused it */
        mk_fused_group *grp = mk_node_cudnn(n);
        CHECK(grp->cache == NULL && grp->verdict == MK_CUDNN_UNTRIED, "untried");
        grp->verdict = MK_CUDNN_FUSED;
        snprintf(grp->why, sizeof grp->why, "engine 7");
        mk_fusion_prepared(c.f, c.g);
        CHECK(c.f->fused == 1 && c.f->cache_hits == 0 && c.f->report.s &&
                  strstr(c.f->report.s, "fused: ") && strstr(c.f->report.s, ": engine 7"),
              "report: %s", c.f->report.s ? c.f->report.s : "(none)");
        CHECK(mk_fusion_learn(c.f) == 0, "nothing to learn from a fused group");
    }
    done(&c);
    mk_cudnn_notes_free(notes);
}

static void test_rejected(void) {
    mk_cudnn_note *notes = NULL;
    compiled c = passes(&cudnn_target, &notes, 1);
    const mk_node *n = c.g ? cudnn_node(c.g, 0) : NULL;
    if (n) {
        mk_fused_group *grp = mk_node_cudnn(n);
        grp->verdict = MK_CUDNN_REJECTED;
        snprintf(grp->why, sizeof grp->why, "no engine for this graph");
        CHECK(mk_fusion_learn(c.f) == 1 && notes && notes->rejected, "the refusal noted");
    }
    done(&c);
    /* the next compile: the group with the prologue refused, then without it */
    c = passes(&cudnn_target, &notes, 1);
    n = c.g ? cudnn_node(c.g, 0) : NULL;
    CHECK(c.f && c.f->rejected == 1 && c.f->report.s &&
              strstr(c.f->report.s, "rejected: ") &&
              strstr(c.f->report.s, ": no engine for this graph"),
          "report: %s", c.f && c.f->report.s ? c.f->report.s : "(none)");
    CHECK(n && n->group->n_members == 2, "the matmul group without its prologue: %d members",
          n ? n->group->n_members : -1);
    int relus = 0;
    for (int i = 0; c.g && i < c.g->n_nodes; i++)
        relus += !strcmp(c.g->nodes[i]->op->name, "ReLUNode");
    CHECK(relus == 1, "the prologue's ReLUNode runs alone: %d", relus);
    done(&c);
    mk_cudnn_notes_free(notes);
}

static void test_workspace(void) {
    mk_cudnn_note *notes = NULL;
    compiled c = passes(&cudnn_target, &notes, 1);
    size_t want = (size_t)test_randint(1, 1 << 20) * 256;
    const mk_node *n = c.g ? cudnn_node(c.g, 0) : NULL;
    if (n) {
        mk_fused_group *grp = mk_node_cudnn(n);
        grp->verdict = MK_CUDNN_WORKSPACE; /* a plan, built now, needing more */
        grp->workspace_bytes = want;
        CHECK(mk_fusion_learn(c.f) == 1, "the workspace noted");
    }
    done(&c);
    c = passes(&cudnn_target, &notes, 1);
    n = c.g ? cudnn_node(c.g, 0) : NULL;
    CHECK(n && n->group->scratch_bytes == want && n->op->scratch(n) == want,
          "scratch %zu, want %zu", n ? n->group->scratch_bytes : 0, want);
    if (n) { /* fused now, from the cache its first try filled: no hit in this call */
        mk_fused_group *grp = mk_node_cudnn(n);
        grp->verdict = MK_CUDNN_FUSED;
        grp->cache_hit = true;
        mk_fusion_prepared(c.f, c.g);
        CHECK(c.f->fused == 1 && c.f->cache_hits == 0, "%d fused, %d hits", c.f->fused,
              c.f->cache_hits);
    }
    done(&c);
    c = passes(&cudnn_target, &notes, 2); /* a later compile call: a hit */
    n = c.g ? cudnn_node(c.g, 0) : NULL;
    if (n) {
        mk_fused_group *grp = mk_node_cudnn(n);
        grp->verdict = MK_CUDNN_FUSED;
        grp->cache_hit = true;
        mk_fusion_prepared(c.f, c.g);
        CHECK(c.f->cache_hits == 1 && strstr(c.f->report.s, "cache hit: "), "report: %s",
              c.f->report.s);
    }
    done(&c);
    mk_cudnn_notes_free(notes);
}

int main(void) {
    test_srand(test_seed());
    RUN(test_no_target);
    RUN(test_chosen);
    RUN(test_rejected);
    RUN(test_workspace);
    return test_summary("fusion_test");
}
