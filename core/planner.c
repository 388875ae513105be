/*
 * planner.c — offsets in one arena: best fit over the free blocks, neighbours
 * merged on release.
 *
 * The planner does arithmetic on offsets only; it never sees device memory.
 * model.c walks the evaluation order, calls mk_planner_alloc when an output or a
 * scratch area is first needed and mk_planner_release after its last reader,
 * then allocates mk_planner_arena_bytes of device memory once.
 *
 * Every free block is one node sitting in two treaps at once:
 *   by address         a released block finds its left and right neighbours
 *   by (size, address) the best fit is one lower-bound walk
 * Random priorities keep both balanced in expectation, so alloc and release
 * cost O(log n) in the number of free blocks. Free blocks are always maximal:
 * their neighbours are live blocks or the arena's ends (release merges, and a
 * split leaves its remainder next to the block that was live next to it).
 *
 * Node memory: release returns nothing, so it must never need malloc. The
 * planner keeps a spare list with at least one node per live block (each
 * release adds at most one free block). alloc tops it up before changing
 * anything, and returns -1, having changed nothing, when malloc fails; an alloc
 * that frees a node itself (an exact fit) needs no malloc at all.
 */
#include "passes.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

enum { BY_ADDR, BY_SIZE };

typedef struct block block;
struct block {
    int64_t offset, size; /* bytes, multiples of MK_ALIGN */
    uint64_t prio;        /* heap key of both treaps: larger sits higher */
    block *kid[2][2];     /* kid[tree][0] left, kid[tree][1] right; spares chain on kid[0][0] */
};

struct mk_planner {
    block *root[2];      /* free blocks: root[BY_ADDR], root[BY_SIZE] */
    block *spare;        /* nodes in no tree */
    int64_t n_spare;
    int64_t n_live;      /* blocks handed out and not yet released */
    int64_t top;         /* arena bytes: the high-water mark */
    int64_t live, peak;  /* sum of live sizes now, and its maximum */
    uint64_t rng;        /* treap priorities; the plan itself never depends on them */
};

/* ---- treaps ------------------------------------------------------------- */

/* Strict order of tree t; keys are unique because free blocks never overlap. */
static bool before(int t, const block *a, const block *b) {
    if (t == BY_SIZE && a->size != b->size)
        return a->size < b->size;
    return a->offset < b->offset;
}

/* Splits the treap at n into the nodes before `key` (*lo) and the rest (*hi). */
static void split(int t, block *n, const block *key, block **lo, block **hi) {
    while (n) {
        if (before(t, n, key)) {
            *lo = n;
            lo = &n->kid[t][1];
            n = n->kid[t][1];
        } else {
            *hi = n;
            hi = &n->kid[t][0];
            n = n->kid[t][0];
        }
    }
    *lo = *hi = NULL;
}

/* Joins two treaps where every node of a comes before every node of b. */
static block *join(int t, block *a, block *b) {
    block *root = NULL, **at = &root;
    while (a && b) {
        if (a->prio > b->prio) {
            *at = a;
            at = &a->kid[t][1];
            a = a->kid[t][1];
        } else {
            *at = b;
            at = &b->kid[t][0];
            b = b->kid[t][0];
        }
    }
    *at = a ? a : b;
    return root;
}

static void tree_insert(mk_planner *p, int t, block *n) {
    block **at = &p->root[t];
    while (*at && (*at)->prio > n->prio)
        at = &(*at)->kid[t][!before(t, n, *at)];
    split(t, *at, n, &n->kid[t][0], &n->kid[t][1]);
    *at = n;
}

/* n must be in tree t with the key it was inserted with. */
static void tree_remove(mk_planner *p, int t, block *n) {
    block **at = &p->root[t];
    while (*at != n)
        at = &(*at)->kid[t][!before(t, n, *at)];
    *at = join(t, n->kid[t][0], n->kid[t][1]);
}

/* The smallest free block of at least `size` bytes, lowest address on ties. */
static block *best_fit(const mk_planner *p, int64_t size) {
    block *best = NULL;
    for (block *n = p->root[BY_SIZE]; n;) {
        if (n->size >= size) {
            best = n;
            n = n->kid[BY_SIZE][0];
        } else {
            n = n->kid[BY_SIZE][1];
        }
    }
    return best;
}

/* The last free block starting below x (*left) and the first at or above (*right). */
static void neighbours(const mk_planner *p, int64_t x, block **left, block **right) {
    *left = *right = NULL;
    for (block *n = p->root[BY_ADDR]; n;) {
        if (n->offset < x) {
            *left = n;
            n = n->kid[BY_ADDR][1];
        } else {
            *right = n;
            n = n->kid[BY_ADDR][0];
        }
    }
}

/* ---- nodes -------------------------------------------------------------- */

static void node_give(mk_planner *p, block *n) {
    n->kid[0][0] = p->spare;
    p->spare = n;
    p->n_spare++;
}

/* A spare node with fresh links and priority, ready for both trees. */
static block *node_take(mk_planner *p, int64_t offset, int64_t size) {
    block *n = p->spare;
    p->spare = n->kid[0][0];
    p->n_spare--;
    *n = (block){.offset = offset, .size = size};
    p->rng ^= p->rng << 13; /* xorshift64 */
    p->rng ^= p->rng >> 7;
    p->rng ^= p->rng << 17;
    n->prio = p->rng;
    return n;
}

static void free_chain(block *n) {
    while (n) {
        block *next = n->kid[0][0];
        free(n);
        n = next;
    }
}

/* Frees a treap in O(n) without recursion: rotate left children up until the
 * root has none, then free it and continue with its right subtree. */
static void free_tree(block *n) {
    while (n) {
        block *l = n->kid[BY_ADDR][0];
        if (l) {
            n->kid[BY_ADDR][0] = l->kid[BY_ADDR][1];
            l->kid[BY_ADDR][1] = n;
            n = l;
        } else {
            block *r = n->kid[BY_ADDR][1];
            free(n);
            n = r;
        }
    }
}

/* ---- the planner -------------------------------------------------------- */

/* A 0-byte request still takes one slot, so every block has its own offset. */
static int64_t rounded(size_t bytes) {
    if (bytes == 0)
        return MK_ALIGN;
    return (int64_t)((bytes + MK_ALIGN - 1) / MK_ALIGN * MK_ALIGN);
}

mk_planner *mk_planner_new(void) {
    mk_planner *p = calloc(1, sizeof *p);
    if (p)
        p->rng = 0x9E3779B97F4A7C15ull;
    return p;
}

void mk_planner_free(mk_planner *p) {
    if (!p)
        return;
    free_tree(p->root[BY_ADDR]); /* every tree node is in both trees */
    free_chain(p->spare);
    free(p);
}

int64_t mk_planner_alloc(mk_planner *p, size_t bytes) {
    if (!p || bytes > (size_t)(INT64_MAX / 2))
        return -1;
    int64_t size = rounded(bytes);
    if (p->top > INT64_MAX - size)
        return -1;
    /* Where it goes: the best fit, else the top (absorbing a free block that
     * touches it: too small, as best fit said, but it saves its bytes of growth). */
    block *b = best_fit(p, size), *hi = NULL, *none;
    if (!b) {
        neighbours(p, p->top, &hi, &none);
        if (hi && hi->offset + hi->size != p->top)
            hi = NULL;
    }
    /* Reserve the node the matching release may need before anything changes,
     * unless this placement frees one (an exact fit, or the top block absorbed). */
    bool frees_node = (b && b->size == size) || hi;
    if (!frees_node && p->n_spare <= p->n_live) {
        block *n = malloc(sizeof *n);
        if (!n)
            return -1;
        node_give(p, n);
    }

    int64_t offset;
    if (b) {
        offset = b->offset;
        tree_remove(p, BY_SIZE, b);
        if (b->size == size) {
            tree_remove(p, BY_ADDR, b);
            node_give(p, b);
        } else {
            /* The remainder keeps its place in address order: only its start moved,
             * and it stays between the same neighbours. */
            b->offset += size;
            b->size -= size;
            tree_insert(p, BY_SIZE, b);
        }
    } else {
        offset = p->top;
        if (hi) {
            offset = hi->offset;
            tree_remove(p, BY_SIZE, hi);
            tree_remove(p, BY_ADDR, hi);
            node_give(p, hi);
        }
        p->top = offset + size;
    }

    p->n_live++;
    p->live += size;
    if (p->live > p->peak)
        p->peak = p->live;
    return offset;
}

void mk_planner_release(mk_planner *p, int64_t offset, size_t bytes) {
    if (!p || offset < 0 || offset % MK_ALIGN != 0 || bytes > (size_t)(INT64_MAX / 2))
        return;
    int64_t size = rounded(bytes);
    /* A block this planner never handed out (or one released twice) is ignored:
     * release has no error to return, and the trees must stay consistent. */
    if (p->n_live == 0 || size > p->live || offset > p->top - size)
        return;
    block *left, *right;
    neighbours(p, offset, &left, &right);
    if ((left && left->offset + left->size > offset) || (right && right->offset < offset + size))
        return;

    p->n_live--;
    p->live -= size;
    bool join_left = left && left->offset + left->size == offset;
    bool join_right = right && right->offset == offset + size;
    if (join_left) {
        /* left keeps its address; only its size key changes */
        tree_remove(p, BY_SIZE, left);
        left->size += size;
        if (join_right) {
            left->size += right->size;
            tree_remove(p, BY_SIZE, right);
            tree_remove(p, BY_ADDR, right);
            node_give(p, right);
        }
        tree_insert(p, BY_SIZE, left);
    } else if (join_right) {
        /* right's start moves down to offset, still above `left`: address order holds */
        tree_remove(p, BY_SIZE, right);
        right->offset = offset;
        right->size += size;
        tree_insert(p, BY_SIZE, right);
    } else {
        /* n_spare >= n_live held before this release (n_live was >= 1): a node is there. */
        block *n = node_take(p, offset, size);
        tree_insert(p, BY_ADDR, n);
        tree_insert(p, BY_SIZE, n);
    }
}

size_t mk_planner_arena_bytes(const mk_planner *p) { return p ? (size_t)p->top : 0; }

size_t mk_planner_peak_live(const mk_planner *p) { return p ? (size_t)p->peak : 0; }
