/*
 * score_host.c -- the interval rules' host backend (score_internal.h): a
 * tile's class on the host, for the ring and the block-mask checks.
 */
#include <math.h>
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
    bool fl = t->dtype == AJ_SIDE_F32, outside = false;
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
            float v = ((const float *)t->data)[at];
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
    hctx *x = malloc(sizeof *x);   /* large for a stack */
    if (!x)
        return AJ_TILE_PARTIAL;   /* always safe: every element tested */
    ival_ctx *c = &x->c;
    memset(c->done, 0, (size_t)p->e.count * sizeof c->done[0]);
    c->kb = NULL;
    c->pt = NULL;
    c->p = p;
    /* b or h unknown (any batch, any head) and loads without data are
     * ranges too */
    c->positional = AJ_SCORE_READS_POSITION | (b < 0 ? AJ_SCORE_READS(AJ_VAR_B) : 0) |
                    (h < 0 ? AJ_SCORE_READS(AJ_VAR_H) : 0) | (tensors ? 0 : AJ_SCORE_READS_LOAD);
    c->point = host_point;
    c->load = host_load;
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
