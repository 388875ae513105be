/*
 * script.c — the IR's text form: lexer, parser (text → graph, checking every
 * node with its op's shape rule as it goes) and printer (graph → text).
 *
 *   script    := { statement } result { next }
 *   statement := '$' INT '=' NAME '(' [ arg { ',' arg } ] ')' ';'
 *   result    := 'result' '=' '$' INT { ',' '$' INT } ';'
 *   next      := 'next' NAME '=' ( '$' INT | NAME '+' ['-'] INT ) ';'
 *   arg       := '$' INT | NAME | ['-'] INT | '[' [ INT { ',' INT } ] ']'
 *
 * The result line names the outputs (several: a tuple, numbered from 0). The
 * next lines make the model a recurrence for mk_model_run_steps: at the next
 * step the input NAME holds an output's value (`next token = $40;`), or its own
 * plus an integer (`next pos = pos + 1;`, an int64 counter).
 *
 * '#' starts a comment to the end of the line. Every error carries the line and
 * column where it was found.
 */
#include "group.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- lexer ---------------------------------------------------------------- */

typedef enum { T_EOF, T_REF, T_NAME, T_INT, T_PUNCT, T_BAD } tok_kind;

typedef struct {
    tok_kind kind;
    const char *start;
    size_t len;
    int64_t value; /* T_REF, T_INT */
    int line, column;
} token;

typedef struct {
    const char *p;
    int line, column;
    token tok; /* the current token */
    mk_error **err;
} lexer;

static void advance(lexer *lx, size_t k) {
    while (k--) {
        if (*lx->p == '\n') lx->line++, lx->column = 1;
        else lx->column++;
        lx->p++;
    }
}

static void skip_space(lexer *lx) {
    for (;;) {
        if (isspace((unsigned char)*lx->p)) advance(lx, 1);
        else if (*lx->p == '#')
            while (*lx->p && *lx->p != '\n') advance(lx, 1);
        else return;
    }
}

static bool is_name_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '.'; }

/* Reads digits at p into *v; returns how many, or -1 on overflow. */
static int read_int(const char *p, int64_t *v) {
    int n = 0;
    uint64_t x = 0;
    while (isdigit((unsigned char)p[n])) {
        x = x * 10 + (uint64_t)(p[n] - '0');
        if (x > (uint64_t)INT64_MAX / 4) return -1;
        n++;
    }
    *v = (int64_t)x;
    return n;
}

static int next(lexer *lx) {
    skip_space(lx);
    token *t = &lx->tok;
    *t = (token){.start = lx->p, .line = lx->line, .column = lx->column};
    const char *p = lx->p;
    if (!*p) {
        t->kind = T_EOF;
        return 0;
    }
    size_t len = 0;
    if (*p == '$' || *p == '-' || isdigit((unsigned char)*p)) {
        size_t lead = (*p == '$' || *p == '-') ? 1 : 0;
        int n = read_int(p + lead, &t->value);
        if (n < 0)
            return mk_fail(lx->err, MK_ERR_SYNTAX, t->line, t->column, "integer too large");
        if (n == 0)
            return mk_fail(lx->err, MK_ERR_SYNTAX, t->line, t->column,
                           *p == '$' ? "expected a node number after '$'"
                                     : "expected digits after '-'");
        t->kind = *p == '$' ? T_REF : T_INT;
        if (*p == '-') t->value = -t->value;
        len = lead + (size_t)n;
        if (is_name_char(p[len]))
            return mk_fail(lx->err, MK_ERR_SYNTAX, t->line, t->column, "malformed number '%.*s'",
                           (int)(len + 1), p);
    } else if (isalpha((unsigned char)*p) || *p == '_') {
        while (is_name_char(p[len])) len++;
        t->kind = T_NAME;
    } else if (strchr("()[],;=+", *p)) {
        len = 1;
        t->kind = T_PUNCT;
    } else {
        return mk_fail(lx->err, MK_ERR_SYNTAX, t->line, t->column, "unexpected character '%c'",
                       isprint((unsigned char)*p) ? *p : '?');
    }
    t->len = len;
    advance(lx, len);
    return 0;
}

static bool is_punct(const token *t, char c) { return t->kind == T_PUNCT && *t->start == c; }

static const char *describe(const token *t, char *buf, size_t size) {
    if (t->kind == T_EOF) return "the end of the script";
    snprintf(buf, size, "'%.*s'", (int)(t->len > 40 ? 40 : t->len), t->start);
    return buf;
}

static int expect(lexer *lx, char c) {
    if (!is_punct(&lx->tok, c)) {
        char buf[64];
        return mk_fail(lx->err, MK_ERR_SYNTAX, lx->tok.line, lx->tok.column,
                       "expected '%c', found %s", c, describe(&lx->tok, buf, sizeof buf));
    }
    return next(lx);
}

/* ---- node ids → nodes ------------------------------------------------------ */

/* Open addressing on $N; scripts may number nodes however they like. */
typedef struct {
    size_t cap, used;
    mk_node **slots;
} id_map;

static size_t id_hash(int64_t id, size_t cap) {
    return (size_t)((uint64_t)id * 0x9E3779B97F4A7C15ull) & (cap - 1);
}

static mk_node *id_find(const id_map *m, int64_t id) {
    if (!m->cap) return NULL;
    for (size_t i = id_hash(id, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (!m->slots[i]) return NULL;
        if (m->slots[i]->id == id) return m->slots[i];
    }
}

static int id_put(id_map *m, mk_node *n) {
    if (2 * (m->used + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 64;
        mk_node **slots = calloc(cap, sizeof *slots);
        if (!slots) return -1;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->slots[i]) continue;
            size_t j = id_hash(m->slots[i]->id, cap);
            while (slots[j]) j = (j + 1) & (cap - 1);
            slots[j] = m->slots[i];
        }
        free(m->slots);
        m->slots = slots;
        m->cap = cap;
    }
    size_t j = id_hash(n->id, m->cap);
    while (m->slots[j]) j = (j + 1) & (m->cap - 1);
    m->slots[j] = n;
    m->used++;
    return 0;
}

/* ---- graph ------------------------------------------------------------------ */

void mk_graph_free(mk_graph *g) {
    if (!g) return;
    for (int i = 0; i < g->n_nodes; i++) {
        mk_group_free(g->nodes[i]->group);
        free(g->nodes[i]->name);
        free(g->nodes[i]);
    }
    free(g->nodes);
    free(g->names);
    free(g);
}

static int graph_add(mk_graph *g, mk_node *n) {
    if (g->n_nodes == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        mk_node **nodes = realloc(g->nodes, sizeof *nodes * (size_t)cap);
        if (!nodes) return -1;
        g->nodes = nodes;
        g->cap = cap;
    }
    n->index = g->n_nodes;
    g->nodes[g->n_nodes++] = n;
    return 0;
}

/* ---- parser ----------------------------------------------------------------- */

static const char *arg_kind(char c) {
    switch (c) {
    case 'n': return "a node ($N)";
    case 'r': return "an int64 [1] node ($N)";
    case 's': return "a name";
    case 'o': return "a name (optional)";
    case 'd': return "a dtype";
    case 'l': return "an integer list";
    default: return "an integer";
    }
}

static void describe_signature(const mk_op *op, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (const char *c = op->signature; *c && used < size; c++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", c == op->signature ? "" : ", ",
                                 arg_kind(*c));
}

/* One argument of kind `want` for node n. */
static int parse_arg(lexer *lx, const id_map *ids, mk_node *n, char want, int index) {
    token t = lx->tok;
    const mk_op *op = n->op;
    char buf[64];
    bool ok = ((want == 'n' || want == 'r') && t.kind == T_REF) ||
              ((want == 's' || want == 'o' || want == 'd') && t.kind == T_NAME) ||
              (want == 'i' && t.kind == T_INT) || (want == 'l' && is_punct(&t, '['));
    if (!ok)
        return mk_fail(lx->err, MK_ERR_ARGUMENT, t.line, t.column,
                       "%s: argument %d must be %s, found %s", op->name, index + 1, arg_kind(want),
                       describe(&t, buf, sizeof buf));
    switch (want) {
    case 'n':
    case 'r': {
        mk_node *x = id_find(ids, t.value);
        if (!x)
            return mk_fail(lx->err, MK_ERR_NAME, t.line, t.column,
                           "$%lld is used before it is defined", (long long)t.value);
        n->in[n->n_in++] = x;
        return next(lx);
    }
    case 's':
    case 'o':
        n->name = strndup(t.start, t.len);
        if (!n->name) return mk_fail(lx->err, MK_ERR_NOMEM, 0, 0, "parsing a name");
        return next(lx);
    case 'd':
        if (mk_dtype_parse(t.start, t.len, &n->dtype) != 0) {
            char known[128] = "";
            size_t used = 0;
            for (int d = 0; d < MK_DTYPE_COUNT && used < sizeof known; d++)
                used += (size_t)snprintf(known + used, sizeof known - used, "%s%s",
                                         d ? ", " : "", mk_dtype_name((mk_dtype)d));
            return mk_fail(lx->err, MK_ERR_DTYPE, t.line, t.column, "unknown dtype '%.*s' (%s)",
                           (int)t.len, t.start, known);
        }
        return next(lx);
    case 'i':
        if (n->n_attr == MK_MAX_ATTRS) return MK_INTERNAL(lx->err, "too many integer arguments");
        n->attr[n->n_attr++] = t.value;
        return next(lx);
    }
    /* 'l': [a, b, ...] */
    if (next(lx)) return -1;
    while (!is_punct(&lx->tok, ']')) {
        if (n->n_attr && expect(lx, ',')) return -1;
        if (lx->tok.kind != T_INT)
            return mk_fail(lx->err, MK_ERR_SYNTAX, lx->tok.line, lx->tok.column,
                           "expected an integer in the list, found %s",
                           describe(&lx->tok, buf, sizeof buf));
        if (n->n_attr == MK_MAX_RANK)
            return mk_fail(lx->err, MK_ERR_SHAPE, lx->tok.line, lx->tok.column,
                           "%s: more than %d entries in a shape or permutation", op->name,
                           MK_MAX_RANK);
        n->attr[n->n_attr++] = lx->tok.value;
        if (next(lx)) return -1;
    }
    return next(lx);
}

/* `$N = Op(args);` with the lexer on the '$'. Checks the node's shapes. */
static int parse_statement(lexer *lx, id_map *ids, mk_graph *g) {
    token def = lx->tok;
    if (def.value <= 0 || def.value > INT32_MAX)
        return mk_fail(lx->err, MK_ERR_SYNTAX, def.line, def.column,
                       "node numbers are positive integers, found $%lld", (long long)def.value);
    mk_node *prev = id_find(ids, def.value);
    if (prev)
        return mk_fail(lx->err, MK_ERR_NAME, def.line, def.column,
                       "$%lld is defined twice (first at line %d)", (long long)def.value,
                       prev->line);
    if (next(lx) || expect(lx, '=')) return -1;
    token name = lx->tok;
    char buf[64];
    if (name.kind != T_NAME)
        return mk_fail(lx->err, MK_ERR_SYNTAX, name.line, name.column,
                       "expected a node name, found %s", describe(&name, buf, sizeof buf));
    const mk_op *op = mk_op_find(name.start, name.len);
    if (!op)
        return mk_fail(lx->err, MK_ERR_NAME, name.line, name.column, "unknown node '%.*s'",
                       (int)name.len, name.start);
    if (op->flags & MK_OP_INTERNAL)
        return mk_fail(lx->err, MK_ERR_NAME, name.line, name.column,
                       "%s is made by the compiler's passes; scripts cannot use it", op->name);

    mk_node *n = calloc(1, sizeof *n);
    if (!n || graph_add(g, n)) {
        free(n);
        return mk_fail(lx->err, MK_ERR_NOMEM, 0, 0, "parsing the script");
    }
    n->id = (int)def.value;
    n->op = op;
    n->line = def.line;
    n->column = def.column;
    n->offset = -1;
    if (next(lx) || expect(lx, '(')) return -1;
    /* the last argument may be optional ('o'): want - 1 arguments will do */
    int want = (int)strlen(op->signature), got = 0;
    int least = want && op->signature[want - 1] == 'o' ? want - 1 : want;
    while (!is_punct(&lx->tok, ')')) {
        if (got && expect(lx, ',')) return -1;
        if (got == want) {
            char sig[160];
            describe_signature(op, sig, sizeof sig);
            return mk_fail(lx->err, MK_ERR_ARGUMENT, lx->tok.line, lx->tok.column,
                           "%s takes %d arguments (%s), found more", op->name, want, sig);
        }
        if (lx->tok.kind == T_EOF) break;
        if (parse_arg(lx, ids, n, op->signature[got], got)) return -1;
        got++;
    }
    if (got < least) {
        char sig[160];
        describe_signature(op, sig, sizeof sig);
        return mk_fail(lx->err, MK_ERR_ARGUMENT, lx->tok.line, lx->tok.column,
                       "%s takes %s%d arguments (%s), found %d", op->name,
                       least < want ? "at least " : "", least, sig, got);
    }
    if (next(lx) || expect(lx, ';')) return -1;
    if (mk_node_infer(n, lx->err)) return -1;
    if (id_put(ids, n)) return mk_fail(lx->err, MK_ERR_NOMEM, 0, 0, "parsing the script");
    return 0;
}

/* Input and constant names are how callers address tensors: each once. */
/* By name, then by script order. */
static int by_name(const void *x, const void *y) {
    const mk_node *a = *(mk_node *const *)x, *b = *(mk_node *const *)y;
    int c = strcmp(a->name, b->name);
    return c ? c : (a->index > b->index) - (a->index < b->index);
}

/* Input and constant names are how callers address tensors: each once. Sorts
 * them into g->names (for mk_graph_find_name), so 40,000 inputs cost a sort,
 * not 40,000² comparisons. */
static int index_names(mk_graph *g, mk_error **err) {
    g->names = malloc(sizeof *g->names * (size_t)(g->n_nodes ? g->n_nodes : 1));
    if (!g->names) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "indexing the script's names");
    g->n_names = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->name) g->names[g->n_names++] = g->nodes[i];
    qsort(g->names, (size_t)g->n_names, sizeof *g->names, by_name);
    for (int i = 1; i < g->n_names; i++) {
        const mk_node *first = g->names[i - 1], *again = g->names[i];
        if (!strcmp(first->name, again->name))
            return mk_fail(err, MK_ERR_NAME, again->line, again->column,
                           "the name '%s' is used twice (first by $%d at line %d)", again->name,
                           first->id, first->line);
    }
    return 0;
}

mk_node *mk_graph_find_name(const mk_graph *g, const char *name) {
    int lo = 0, hi = g->n_names;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(g->names[mid]->name, name);
        if (!c) return g->names[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ---- result and next lines ---------------------------------------------------- */

static bool is_word(const token *t, const char *w) {
    return t->kind == T_NAME && t->len == strlen(w) && !memcmp(t->start, w, t->len);
}

/* result := 'result' '=' '$' INT { ',' '$' INT } ';' */
static int parse_result(lexer *lx, const id_map *ids, mk_graph *g) {
    char buf[64];
    if (!is_word(&lx->tok, "result"))
        return mk_fail(lx->err, MK_ERR_SYNTAX, lx->tok.line, lx->tok.column,
                       "expected a statement '$N = ...;' or 'result = $N;', found %s",
                       describe(&lx->tok, buf, sizeof buf));
    if (next(lx) || expect(lx, '=')) return -1;
    for (;;) {
        token t = lx->tok;
        if (t.kind != T_REF)
            return mk_fail(lx->err, MK_ERR_SYNTAX, t.line, t.column,
                           "expected 'result = $N;' (or '$N, $M, ...'), found %s",
                           describe(&t, buf, sizeof buf));
        mk_node *n = id_find(ids, t.value);
        if (!n)
            return mk_fail(lx->err, MK_ERR_NAME, t.line, t.column, "$%lld is not defined",
                           (long long)t.value);
        if (g->n_outputs == MK_MAX_OUTPUTS)
            return mk_fail(lx->err, MK_ERR_SYNTAX, t.line, t.column,
                           "a script has at most %d outputs", MK_MAX_OUTPUTS);
        g->outputs[g->n_outputs++] = n;
        if (next(lx)) return -1;
        if (!is_punct(&lx->tok, ',')) break;
        if (next(lx)) return -1;
    }
    return expect(lx, ';');
}

/* A next line as written: names are looked up once the script is read. */
typedef struct {
    token input, from; /* from: '$N' (a feed) or the counter's own name */
    int64_t add;
    int line, column;
} next_line;

/* next := 'next' NAME '=' ( '$' INT | NAME '+' ['-'] INT ) ';' */
static int parse_next(lexer *lx, next_line *lines, int *n_lines) {
    char buf[64];
    next_line l = {.line = lx->tok.line, .column = lx->tok.column};
    if (*n_lines == MK_MAX_INPUTS)
        return mk_fail(lx->err, MK_ERR_SYNTAX, l.line, l.column,
                       "a script has at most %d next lines", MK_MAX_INPUTS);
    if (next(lx)) return -1;
    l.input = lx->tok;
    if (l.input.kind != T_NAME)
        return mk_fail(lx->err, MK_ERR_SYNTAX, l.input.line, l.input.column,
                       "expected an input's name after 'next', found %s",
                       describe(&l.input, buf, sizeof buf));
    if (next(lx) || expect(lx, '=')) return -1;
    l.from = lx->tok;
    if (l.from.kind == T_NAME) {
        if (next(lx) || expect(lx, '+')) return -1;
        if (lx->tok.kind != T_INT)
            return mk_fail(lx->err, MK_ERR_SYNTAX, lx->tok.line, lx->tok.column,
                           "expected the integer a counter adds, found %s",
                           describe(&lx->tok, buf, sizeof buf));
        l.add = lx->tok.value;
    } else if (l.from.kind != T_REF) {
        return mk_fail(lx->err, MK_ERR_SYNTAX, l.from.line, l.from.column,
                       "expected 'next %.*s = $N;' or 'next %.*s = %.*s + 1;', found %s",
                       (int)l.input.len, l.input.start, (int)l.input.len, l.input.start,
                       (int)l.input.len, l.input.start, describe(&l.from, buf, sizeof buf));
    }
    if (next(lx) || expect(lx, ';')) return -1;
    lines[(*n_lines)++] = l;
    return 0;
}

/* The checks of a next line against the script it ends, into g->next. */
static int resolve_next(mk_graph *g, const next_line *l, mk_error **err) {
    const token *t = &l->input;
    /* a name is as long as memory allows, here as in every other position */
    char *key = strndup(t->start, t->len);
    if (!key) return mk_fail(err, MK_ERR_NOMEM, 0, 0, "parsing a name");
    mk_node *in = mk_graph_find_name(g, key);
    free(key);
    if (!in || in->op->leaf != MK_LEAF_INPUT)
        return mk_fail(err, MK_ERR_NAME, t->line, t->column,
                       "next: '%.*s' is not an input of the script", (int)t->len, t->start);
    const char *name = in->name;
    for (int i = 0; i < g->n_next; i++)
        if (g->next[i].input == in)
            return mk_fail(err, MK_ERR_NAME, t->line, t->column,
                           "next: input '%s' already has a next line (line %d)", name,
                           g->next[i].line);
    mk_recurrence r = {.input = in, .output = -1, .add = l->add, .line = l->line,
                       .column = l->column};
    const token *f = &l->from;
    if (f->kind == T_NAME) { /* a counter */
        if (f->len != t->len || memcmp(f->start, t->start, t->len))
            return mk_fail(err, MK_ERR_SYNTAX, f->line, f->column,
                           "next: a counter adds to its own value: 'next %s = %s + N;'", name,
                           name);
        if (in->dtype != MK_DTYPE_INT64)
            return mk_fail(err, MK_ERR_DTYPE, t->line, t->column,
                           "next: the counter '%s' is %s; a counter is int64", name,
                           mk_dtype_name(in->dtype));
    } else { /* a feed: one of the outputs, as the input is */
        for (int o = 0; o < g->n_outputs && r.output < 0; o++)
            if (g->outputs[o]->id == f->value) r.output = o;
        if (r.output < 0)
            return mk_fail(err, MK_ERR_NAME, f->line, f->column,
                           "next: $%lld is not an output (only the result line's nodes feed "
                           "inputs)", (long long)f->value);
        const mk_node *o = g->outputs[r.output];
        if (o->dtype != in->dtype)
            return mk_fail(err, MK_ERR_DTYPE, f->line, f->column,
                           "next: $%d is %s, input '%s' is %s", o->id, mk_dtype_name(o->dtype),
                           name, mk_dtype_name(in->dtype));
        bool same = o->rank == in->rank;
        for (int k = 0; same && k < o->rank; k++) same = o->shape[k] == in->shape[k];
        if (!same)
            return mk_fail(err, MK_ERR_SHAPE, f->line, f->column,
                           "next: $%d has shape %s, input '%s' has %s", o->id,
                           mk_shape_str(o->rank, o->shape, (char[96]){0}, 96), name,
                           mk_shape_str(in->rank, in->shape, (char[96]){0}, 96));
    }
    g->next[g->n_next++] = r;
    return 0;
}

mk_graph *mk_graph_parse(const char *script, mk_error **err) {
    if (!script) {
        mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "the script is NULL");
        return NULL;
    }
    mk_graph *g = calloc(1, sizeof *g);
    id_map ids = {0};
    lexer lx = {.p = script, .line = 1, .column = 1, .err = err};
    if (!g) {
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "parsing the script");
        return NULL;
    }
    if (next(&lx)) goto fail;
    while (lx.tok.kind == T_REF)
        if (parse_statement(&lx, &ids, g)) goto fail;

    if (parse_result(&lx, &ids, g)) goto fail;
    next_line lines[MK_MAX_INPUTS];
    int n_lines = 0;
    while (lx.tok.kind == T_NAME && is_word(&lx.tok, "next"))
        if (parse_next(&lx, lines, &n_lines)) goto fail;
    if (lx.tok.kind != T_EOF) {
        char buf[64];
        mk_fail(err, MK_ERR_SYNTAX, lx.tok.line, lx.tok.column,
                "nothing but 'next' lines may follow the result line, found %s",
                describe(&lx.tok, buf, sizeof buf));
        goto fail;
    }
    if (index_names(g, err)) goto fail;
    for (int i = 0; i < n_lines; i++)
        if (resolve_next(g, &lines[i], err)) goto fail;
    free(ids.slots);
    return g;
fail:
    free(ids.slots);
    mk_graph_free(g);
    return NULL;
}

/* ---- printer ---------------------------------------------------------------- */

char *mk_graph_print(const mk_graph *g) {
    mk_strbuf b = {0};
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *n = g->nodes[i];
        mk_strbuf_put(&b, "$%d = %s(", n->id, n->op->name);
        if (n->op->flags & MK_OP_INTERNAL) { /* a group node, or a result of a product group */
            for (int k = 0; k < n->n_in; k++) mk_strbuf_put(&b, "%s$%d", k ? ", " : "", n->in[k]->id);
            mk_strbuf_put(&b, ");");
            if (n->group) {
                mk_strbuf_put(&b, "  # %s group, one launch for", n->group->cls->name);
                mk_group_put_members(n, &b);
            } else {
                mk_strbuf_put(&b, "  # a result of the group, view of $%d", n->owner->id);
            }
            mk_strbuf_put(&b, "\n");
            continue;
        }
        int in = 0, attr = 0;
        for (const char *c = n->op->signature; *c; c++) {
            if (*c == 'o' && !n->name) continue;
            if (c != n->op->signature) mk_strbuf_put(&b, ", ");
            switch (*c) {
            case 'n':
            case 'r': mk_strbuf_put(&b, "$%d", n->in[in++]->id); break;
            case 's':
            case 'o': mk_strbuf_put(&b, "%s", n->name); break;
            case 'd': mk_strbuf_put(&b, "%s", mk_dtype_name(n->dtype)); break;
            case 'i': mk_strbuf_put(&b, "%lld", (long long)n->attr[attr++]); break;
            case 'l':
                mk_strbuf_put(&b, "[");
                for (int k = 0; k < n->n_attr; k++) mk_strbuf_put(&b, "%s%lld", k ? ", " : "", (long long)n->attr[k]);
                mk_strbuf_put(&b, "]");
                break;
            }
        }
        mk_strbuf_put(&b, ");");
        /* What the passes decided, for people reading the compiled script. */
        if (n->op->kernel == MK_KERNEL_EMBEDDING && n->storage == MK_STORAGE_VIEW)
            mk_strbuf_put(&b, "  # row $%d of $%d, read there by the groups (no launch)",
                          n->in[1]->id, n->owner->id);
        else if (n->storage == MK_STORAGE_VIEW && n->op->role != MK_ROLE_VIEW)
            mk_strbuf_put(&b, "  # %s of $%d",
                          n->op->role == MK_ROLE_INPLACE ? "in place" : "view", n->owner->id);
        mk_strbuf_put(&b, "\n");
    }
    mk_strbuf_put(&b, "result = ");
    for (int o = 0; o < g->n_outputs; o++) mk_strbuf_put(&b, "%s$%d", o ? ", " : "", g->outputs[o]->id);
    mk_strbuf_put(&b, ";\n");
    for (int i = 0; i < g->n_next; i++) {
        const mk_recurrence *r = &g->next[i];
        if (r->output >= 0)
            mk_strbuf_put(&b, "next %s = $%d;\n", r->input->name, g->outputs[r->output]->id);
        else
            mk_strbuf_put(&b, "next %s = %s + %lld;\n", r->input->name, r->input->name,
                          (long long)r->add);
    }
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

MK_API int mk_script_check_bytes(const char *script, size_t len, mk_error **err) {
    if (!script) return mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "the script is NULL");
    const char *nul = memchr(script, '\0', len);
    if (!nul) return 0;
    int line = 1, column = 1;
    for (const char *p = script; p < nul; p++) {
        if (*p == '\n') line++, column = 1;
        else column++;
    }
    return mk_fail(err, MK_ERR_SYNTAX, line, column, "a NUL byte in the script");
}

MK_API char *mk_script_format(const char *script, mk_error **err) {
    mk_graph *g = mk_graph_parse(script, err);
    if (!g) return NULL;
    char *s = mk_graph_print(g);
    if (!s) mk_fail(err, MK_ERR_NOMEM, 0, 0, "printing the script");
    mk_graph_free(g);
    return s;
}

MK_API mk_tensor_info *mk_script_constants(const char *script, size_t *count, mk_error **err) {
    if (!count) {
        mk_fail(err, MK_ERR_ARGUMENT, 0, 0, "mk_script_constants: NULL count");
        return NULL;
    }
    *count = 0;
    mk_graph *g = mk_graph_parse(script, err);
    if (!g) return NULL;
    /* One block: the entries, then their names. */
    size_t n = 0, names = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op->leaf == MK_LEAF_CONSTANT) {
            n++;
            names += strlen(g->nodes[i]->name) + 1;
        }
    mk_tensor_info *out = malloc(n * sizeof *out + names + 1);
    if (!out) {
        mk_fail(err, MK_ERR_NOMEM, 0, 0, "listing the script's constants");
        mk_graph_free(g);
        return NULL;
    }
    char *name = (char *)(out + n);
    for (int i = 0; i < g->n_nodes; i++) {
        const mk_node *x = g->nodes[i];
        if (x->op->leaf != MK_LEAF_CONSTANT) continue;
        mk_tensor_info *t = &out[(*count)++];
        *t = (mk_tensor_info){.name = name, .dtype = x->dtype, .rank = x->rank};
        memcpy(t->shape, x->shape, sizeof t->shape);
        size_t len = strlen(x->name) + 1;
        memcpy(name, x->name, len);
        name += len;
    }
    mk_graph_free(g);
    return out;
}

MK_API void mk_tensor_infos_free(mk_tensor_info *infos) { free(infos); }
