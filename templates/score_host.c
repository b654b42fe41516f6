/*
 * score_host.c -- the interval rules' host backend (score_internal.h): a
 * tile's class on the host, for the ring and the block-mask checks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "templates/score_internal.h"

/* ---------------------------------------------------------------- host */

/* The interval rules' host backend (score_ival.c), for the ring's
 * decisions and the block-mask checks. */
typedef struct hctx {
    ival_ctx c;                      /* first: the rules' context */
    aj_expr_env env;                 /* b, h, sq, sk, the tensors; q and k unused */
    const aj_side_tensor *tensors;   /* NULL: loads are unknown */
    aj_score_cache *cache;           /* NULL: none */
} hctx;

/* A point node: its value at the env. */
static ival host_point(ival_ctx *c, uint16_t id)
{
    const hctx *h = (const hctx *)c;
    aj_expr_scalar v = aj_expr_eval(&c->p->e, id, &h->env);
    switch (node(c->p, id)->type) {
    case AJ_EXPR_BOOL: return (ival){{.b = !v.b}, {.b = v.b}};
    case AJ_EXPR_FLOAT: return (ival){{.f = v.f}, {.f = v.f}};
    default: return (ival){{.i = v.i}, {.i = v.i}};
    }
}

/* The IR backend's load rule (score_tiles.c) on host data: the hull of
 * the values in the box inside the tensor, 0 where it reaches past it;
 * unknown past SCAN_MAX elements.  Bounds as ival of the tensor's type. */
static ival host_scan(ival_ctx *c, const aj_side_tensor *t, const ival *idx)
{
    bool fl = t->dtype != AJ_SIDE_I32, outside = false;
    int64_t lo[AJ_EXPR_RANK_MAX], ext[AJ_EXPR_RANK_MAX], count = 1;
    for (int k = 0; k < t->rank; k++) {
        outside = outside || idx[k].lo.i < 0 || idx[k].hi.i >= t->shape[k];
        lo[k] = idx[k].lo.i < 0 ? 0 : idx[k].lo.i;
        int64_t hi = idx[k].hi.i < t->shape[k] - 1 ? idx[k].hi.i : t->shape[k] - 1;
        ext[k] = hi - lo[k] + 1 > 0 ? hi - lo[k] + 1 : 0;
        count *= ext[k] < SCAN_MAX + 1 ? ext[k] : SCAN_MAX + 1;
        count = count < SCAN_MAX + 1 ? count : SCAN_MAX + 1;
    }
    if (count > SCAN_MAX)
        return aj_ival_unknown(c, fl ? AJ_EXPR_FLOAT : AJ_EXPR_INT);
    ival r = {{.i = INT64_MAX, .f = INFINITY}, {.i = INT64_MIN, .f = -INFINITY}};
    for (int64_t e = 0; e < count; e++) {
        int64_t at = 0, rest = e;
        for (int k = t->rank - 1; k >= 0; k--) {
            at += (lo[k] + rest % ext[k]) * t->strides[k];
            rest /= ext[k];
        }
        if (fl) {
            float v = aj_side_float_at(t->data, t->dtype, at);
            r.lo.f = fminf(r.lo.f, v), r.hi.f = fmaxf(r.hi.f, v);
        } else {
            int64_t v = ((const int32_t *)t->data)[at];
            r.lo.i = v < r.lo.i ? v : r.lo.i, r.hi.i = v > r.hi.i ? v : r.hi.i;
        }
    }
    if (outside) {
        r.lo.f = fminf(r.lo.f, 0), r.hi.f = fmaxf(r.hi.f, 0);
        r.lo.i = r.lo.i < 0 ? r.lo.i : 0, r.hi.i = r.hi.i > 0 ? r.hi.i : 0;
    }
    return r;
}

/* A load's hull from the cache, or scanned and kept there: the tiles of a
 * row (column) of a block mask scan the same query (key) box. */
static ival host_load(ival_ctx *c, const aj_expr_node *n, const ival *idx)
{
    hctx *h = (hctx *)c;
    int tensor = n->u.tensor;
    if (!h->tensors)
        return aj_ival_unknown(c, (aj_expr_type)n->type);
    const aj_side_tensor *t = &h->tensors[tensor];
    aj_score_cache *cache = h->cache;
    if (!cache)
        return host_scan(c, t, idx);
    uint64_t key = (uint64_t)tensor * 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < t->rank; k++)
        key = (key ^ (uint64_t)idx[k].lo.i) * 0xbf58476d1ce4e5b9ull ^ (uint64_t)idx[k].hi.i;
    aj_score_cache_entry *e = &cache->entries[(key >> 32) % AJ_SCORE_CACHE_SIZE];
    bool hit = e->used && e->tensor == tensor;
    for (int k = 0; hit && k < t->rank; k++)
        hit = e->lo[k] == idx[k].lo.i && e->hi[k] == idx[k].hi.i;
    if (!hit) {
        ival v = host_scan(c, t, idx);
        *e = (aj_score_cache_entry){.used = true, .tensor = tensor, .ilo = v.lo.i,
                                    .ihi = v.hi.i, .flo = v.lo.f, .fhi = v.hi.f};
        for (int k = 0; k < t->rank; k++)
            e->lo[k] = idx[k].lo.i, e->hi[k] = idx[k].hi.i;
    }
    return (ival){{.i = e->ilo, .f = e->flo}, {.i = e->ihi, .f = e->fhi}};
}

aj_tile_class aj_score_host_class(const aj_score_prog *p, const aj_side_tensor *tensors,
                                  aj_score_cache *cache, int64_t b, int64_t h, int64_t q0,
                                  int64_t q1, int64_t k0, int64_t k1, int64_t sq, int64_t sk)
{
    hctx *x = malloc(sizeof *x + ival_memo_bytes(p->e.count));   /* large for a stack */
    if (!x)
        return AJ_TILE_PARTIAL;   /* always safe: every element tested */
    ival_ctx *c = &x->c;
    ival_memo_init(c, x + 1, p->e.count);
    c->kb = NULL;
    c->pt = NULL;
    c->p = p;
    /* b or h unknown (any batch, any head) and loads without data are
     * ranges too */
    c->positional = AJ_SCORE_READS_POSITION | (b < 0 ? AJ_SCORE_READS(AJ_VAR_B) : 0) |
                    (h < 0 ? AJ_SCORE_READS(AJ_VAR_H) : 0) | (tensors ? 0 : AJ_SCORE_READS_LOAD);
    c->point = host_point;
    c->load = host_load;
    c->bh = false;
    c->q = (ival){{.i = q0}, {.i = q1}};
    c->k = (ival){{.i = k0}, {.i = k1}};
    x->env = (aj_expr_env){.b = b < 0 ? 0 : b, .h = h < 0 ? 0 : h, .sq = sq, .sk = sk,
                           .tensors = tensors, .tensor_count = tensors ? p->tensor_count : 0};
    x->tensors = tensors;
    x->cache = cache;
    bool skip = false, full = true;
    /* the band, exactly as the kernels: k in [q + lo, q + hi] */
    uint16_t bounds[2] = {p->band_lo, p->band_hi};
    for (int side = 0; side < 2; side++) {
        if (bounds[side] == NONE)
            continue;
        /* a bound that reads h for any head is its hull over heads */
        ival v = aj_ival_node(c, bounds[side]);
        if (side == 0) {    /* k >= q + lo */
            skip = skip || (__int128)k1 < (__int128)q0 + v.lo.i;
            full = full && (__int128)k0 >= (__int128)q1 + v.hi.i;
        } else {            /* k <= q + hi */
            skip = skip || (__int128)k0 > (__int128)q1 + v.hi.i;
            full = full && (__int128)k1 <= (__int128)q0 + v.lo.i;
        }
    }
    if (p->rest != NONE) {
        ival r = aj_ival_node(c, p->rest);
        skip = skip || !r.hi.b;
        full = full && !r.lo.b;
    }
    free(x);
    return skip ? AJ_TILE_SKIP : full ? AJ_TILE_FULL : AJ_TILE_PARTIAL;
}

/* ---------------------------------------------------------------- loads in bounds */

/* What a node is known to be where the walk stands: a guard's refinement
 * of one node's interval. */
typedef struct guard {
    uint64_t hash;     /* of the node, by structure: equal trees, one guard */
    int64_t lo, hi;
} guard;

enum { GUARDS_MAX = 16 };

typedef struct bounds_walk {
    const aj_score_prog *p;
    const aj_score_ranges *r;
    const int64_t (*shapes)[4];
    hctx *x;
    uint64_t *hash;                     /* every node's, by structure */
    ival *narrowed;                     /* guarded's scratch */
    guard g[GUARDS_MAX];
    int ng;
    char *msg;
    size_t cap;
    bool found;
} bounds_walk;

/* The interval of node id under the walk's guards: a fresh context whose
 * guarded nodes (every node of a guard's structure) start from their own
 * intervals narrowed by the guards. */
static ival guarded(bounds_walk *w, uint16_t id)
{
    ival_ctx *c = &w->x->c;
    const int count = w->p->e.count;
    const size_t n = (size_t)count * sizeof c->done[0];
    ival *narrowed = w->narrowed;
    bool hit[AJ_EXPR_NODES_MAX] = {false};
    memset(c->done, 0, n);
    for (int v = 0; v < count; v++)
        for (int i = 0; i < w->ng; i++)
            if (w->hash[v] == w->g[i].hash && !hit[v]) {
                narrowed[v] = aj_ival_node(c, (uint16_t)v);
                hit[v] = true;
            }
    for (int v = 0; v < count; v++)
        for (int i = 0; hit[v] && i < w->ng; i++)
            if (w->hash[v] == w->g[i].hash) {
                narrowed[v].lo.i = narrowed[v].lo.i > w->g[i].lo ? narrowed[v].lo.i : w->g[i].lo;
                narrowed[v].hi.i = narrowed[v].hi.i < w->g[i].hi ? narrowed[v].hi.i : w->g[i].hi;
            }
    memset(c->done, 0, n);
    for (int v = 0; v < count; v++)
        if (hit[v]) {
            c->memo[v] = narrowed[v];
            c->done[v] = true;
        }
    return aj_ival_node(c, id);
}

/* The band's rule (k in [q + lo, q + hi]) as guards on q - k and k - q,
 * the relative position tables index by. */
static void band_guards(bounds_walk *w)
{
    if (w->p->band_lo == NONE && w->p->band_hi == NONE)
        return;
    ival_ctx *c = &w->x->c;
    memset(c->done, 0, (size_t)w->p->e.count * sizeof c->done[0]);
    int64_t lo = INT64_MIN / 4, hi = INT64_MAX / 4;
    if (w->p->band_lo != NONE)
        lo = aj_ival_node(c, w->p->band_lo).lo.i;   /* its least over the heads */
    if (w->p->band_hi != NONE)
        hi = aj_ival_node(c, w->p->band_hi).hi.i;
    const uint64_t vq = aj_score_node_hash(AJ_EXPR_VAR, AJ_EXPR_INT, AJ_VAR_Q, NULL, 0);
    const uint64_t vk = aj_score_node_hash(AJ_EXPR_VAR, AJ_EXPR_INT, AJ_VAR_K, NULL, 0);
    const uint64_t k_minus_q = aj_score_node_hash(AJ_EXPR_SUB, AJ_EXPR_INT, 0,
                                                  (uint64_t[]){vk, vq}, 2);
    const uint64_t q_minus_k = aj_score_node_hash(AJ_EXPR_SUB, AJ_EXPR_INT, 0,
                                                  (uint64_t[]){vq, vk}, 2);
    w->g[w->ng++] = (guard){k_minus_q, lo, hi};
    /* q - k = -(k - q): its lower bound from hi, its upper from lo, each
     * unbounded where that side of the band is */
    w->g[w->ng++] = (guard){q_minus_k, hi == INT64_MAX / 4 ? INT64_MIN / 4 : -hi,
                            lo == INT64_MIN / 4 ? INT64_MAX / 4 : -lo};
}

/* Adds what `cond` being `truth` says of an int node compared with a
 * point (x < C, C <= x, x == C, and their ands / ors / nots). */
static void refine(bounds_walk *w, uint16_t cond, bool truth)
{
    const aj_expr_node *n = node(w->p, cond);
    if (n->op == AJ_EXPR_NOT) {
        refine(w, n->args[0], !truth);
        return;
    }
    if ((n->op == AJ_EXPR_AND && truth) || (n->op == AJ_EXPR_OR && !truth)) {
        refine(w, n->args[0], truth);
        refine(w, n->args[1], truth);
        return;
    }
    if (n->op < AJ_EXPR_LT || n->op > AJ_EXPR_NE || w->ng == GUARDS_MAX)
        return;
    uint16_t a = n->args[0], b = n->args[1];
    if (node(w->p, a)->type != AJ_EXPR_INT)
        return;
    ival_ctx *c = &w->x->c;
    bool a_point = !(w->p->reads[a] & c->positional), b_point = !(w->p->reads[b] & c->positional);
    if (a_point == b_point)
        return;
    aj_expr_op op = (aj_expr_op)n->op;
    if (a_point) {   /* C op x  ->  x op' C */
        static const aj_expr_op flip[] = {[AJ_EXPR_LT] = AJ_EXPR_GT, [AJ_EXPR_LE] = AJ_EXPR_GE,
                                          [AJ_EXPR_GT] = AJ_EXPR_LT, [AJ_EXPR_GE] = AJ_EXPR_LE,
                                          [AJ_EXPR_EQ] = AJ_EXPR_EQ, [AJ_EXPR_NE] = AJ_EXPR_NE};
        op = flip[op];
        uint16_t t = a;
        a = b, b = t;
    }
    if (!truth) {
        static const aj_expr_op neg[] = {[AJ_EXPR_LT] = AJ_EXPR_GE, [AJ_EXPR_LE] = AJ_EXPR_GT,
                                         [AJ_EXPR_GT] = AJ_EXPR_LE, [AJ_EXPR_GE] = AJ_EXPR_LT,
                                         [AJ_EXPR_EQ] = AJ_EXPR_NE, [AJ_EXPR_NE] = AJ_EXPR_EQ};
        op = neg[op];
    }
    memset(c->done, 0, (size_t)w->p->e.count * sizeof c->done[0]);
    int64_t k = aj_ival_node(c, b).lo.i;
    guard g = {w->hash[a], INT64_MIN / 4, INT64_MAX / 4};
    switch (op) {
    case AJ_EXPR_LT: g.hi = k - 1; break;
    case AJ_EXPR_LE: g.hi = k; break;
    case AJ_EXPR_GT: g.lo = k + 1; break;
    case AJ_EXPR_GE: g.lo = k; break;
    case AJ_EXPR_EQ: g.lo = g.hi = k; break;
    default: return;
    }
    w->g[w->ng++] = g;
    /* abs(x) <= C: x in [-C, C] */
    if (node(w->p, a)->op == AJ_EXPR_ABS && g.hi < INT64_MAX / 4 && w->ng < GUARDS_MAX)
        w->g[w->ng++] = (guard){w->hash[node(w->p, a)->args[0]], -g.hi, g.hi};
}

static void walk(bounds_walk *w, uint16_t id)
{
    if (id == NONE || w->found)
        return;
    const aj_expr_node *n = node(w->p, id);
    const int ng = w->ng;
    switch (n->op) {
    case AJ_EXPR_SELECT:
        walk(w, n->args[0]);
        refine(w, n->args[0], true);
        walk(w, n->args[1]);
        w->ng = ng;
        refine(w, n->args[0], false);
        walk(w, n->args[2]);
        w->ng = ng;
        return;
    case AJ_EXPR_AND:
    case AJ_EXPR_OR:
        walk(w, n->args[0]);
        refine(w, n->args[0], n->op == AJ_EXPR_AND);
        walk(w, n->args[1]);
        w->ng = ng;
        return;
    default:
        break;
    }
    for (int i = 0; i < aj_expr_arity(n); i++)
        walk(w, n->args[i]);
    if (n->op != AJ_EXPR_LOAD || w->found)
        return;
    const aj_tensor_decl *d = &w->p->tensors[n->u.tensor];
    for (int k = 0; k < d->rank; k++) {
        ival v = guarded(w, n->args[k]);
        int64_t ext = w->shapes[n->u.tensor][k];
        if (v.lo.i >= 0 && v.hi.i < ext)
            continue;
        char lo[32], hi[32];
        snprintf(lo, sizeof lo, "%lld", (long long)v.lo.i);
        snprintf(hi, sizeof hi, "%lld", (long long)v.hi.i);
        snprintf(w->msg, w->cap, "side tensor '%s': index %d of a load may be %s .. %s over the "
                 "launch's positions and heads, outside its %lld elements (such a load reads "
                 "0); guard it (clamp, min / max or a select on a bound), or launch without "
                 "check_side_bounds (Python: oob=\"zero\") to read 0 there",
                 d->name, k, v.lo.i <= -(1LL << 61) ? "unbounded" : lo,
                 v.hi.i >= (1LL << 61) ? "unbounded" : hi, (long long)ext);
        w->found = true;
        return;
    }
}

bool aj_score_loads_in_bounds(const aj_score_prog *p, const int64_t (*shapes)[4],
                              const aj_score_ranges *r, char *msg, size_t cap)
{
    const int count = p->e.count;
    hctx *x = calloc(1, sizeof *x + ival_memo_bytes(count));   /* large for a stack */
    if (!x)
        return true;   /* the rule (a read past a tensor is 0) still holds */
    ival_ctx *c = &x->c;
    ival_memo_init(c, x + 1, count);
    c->p = p;
    /* positions, b, h and every load (no data: the values are unknown) vary */
    c->positional = AJ_SCORE_READS_POSITION | AJ_SCORE_READS(AJ_VAR_B) |
                    AJ_SCORE_READS(AJ_VAR_H) | AJ_SCORE_READS_LOAD;
    c->point = host_point;
    c->load = host_load;
    c->bh = true;
    c->q = (ival){{.i = r->q0}, {.i = r->q1}};
    c->k = (ival){{.i = r->k0}, {.i = r->k1}};
    c->b = (ival){{.i = r->b0}, {.i = r->b1}};
    c->h = (ival){{.i = r->h0}, {.i = r->h1}};
    x->env = (aj_expr_env){.sq = r->sq, .sk = r->sk};
    bounds_walk *w = calloc(1, sizeof *w);
    uint64_t *hash = calloc(count ? count : 1, sizeof *hash);
    ival *narrowed = calloc(count ? count : 1, sizeof *narrowed);
    if (!w || !hash || !narrowed) {
        free(w), free(hash), free(narrowed), free(x);
        return true;
    }
    *w = (bounds_walk){.p = p, .r = r, .shapes = shapes, .x = x, .hash = hash,
                       .narrowed = narrowed, .msg = msg, .cap = cap};
    aj_score_hash_nodes(p, w->hash);
    /* the band's bounds hold wherever a load's value can matter: the
     * score_mod's and the rest's (a hidden key's score is never used) */
    band_guards(w);
    const uint16_t roots[4] = {p->mod, p->band_lo, p->band_hi, p->rest};
    for (int i = 0; i < 4; i++)
        walk(w, roots[i]);
    bool found = w->found;
    free(w), free(hash), free(narrowed), free(x);
    return !found;
}
