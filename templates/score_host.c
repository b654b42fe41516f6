/*
 * score_host.c -- the programs' intervals on the host (score_internal.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "templates/attn_common.h"
#include "templates/cpu_vec.h"
#include "templates/score_internal.h"

/* ---------------------------------------------------------------- host */

/* The same interval rules over host values, for the ring's decisions. */
typedef struct hval {
    int64_t lo, hi;        /* int */
    float flo, fhi;        /* float */
    bool may_f, may_t;     /* bool */
} hval;

typedef struct hctx {
    const aj_score_prog *p;
    aj_expr_env env;       /* b, h, sq, sk; q and k unused */
    const aj_side_tensor *tensors;   /* NULL: loads are unknown */
    bool any_batch, any_head;   /* b, h unknown */
    int64_t q0, q1, k0, k1;
    aj_score_cache *cache;   /* NULL: none */
    hval memo[AJ_EXPR_NODES_MAX];
    bool done[AJ_EXPR_NODES_MAX];
} hctx;

static int64_t sat64(__int128 v)
{
    return v > UNKNOWN_INT ? UNKNOWN_INT : v < -UNKNOWN_INT ? -UNKNOWN_INT : (int64_t)v;
}

static hval hv_unknown(void)
{
    return (hval){-UNKNOWN_INT, UNKNOWN_INT, -INFINITY, INFINITY, true, true};
}

static hval hv_point(const aj_expr_node *n, aj_expr_scalar v)
{
    hval r = {0};
    if (n->type == AJ_EXPR_BOOL)
        r.may_t = v.b, r.may_f = !v.b;
    else if (n->type == AJ_EXPR_FLOAT)
        r.flo = r.fhi = v.f;
    else
        r.lo = r.hi = v.i;
    return r;
}

static int64_t hfdiv(int64_t a, int64_t c, int want_mod)
{
    if (c == 0 || (c == -1 && want_mod))
        return 0;
    if (c == -1)
        return (int64_t)(0 - (uint64_t)a);
    int64_t q = a / c, r = a % c;
    if (r != 0 && (r < 0) != (c < 0))
        q--, r += c;
    return want_mod ? r : q;
}

static bool ult(bool fl, const hval *a, int a_hi, const hval *b, int b_hi, bool or_equal)
{
    if (fl) {
        float x = a_hi ? a->fhi : a->flo, y = b_hi ? b->fhi : b->flo;
        return isnan(x) || isnan(y) || (or_equal ? x <= y : x < y);
    }
    int64_t x = a_hi ? a->hi : a->lo, y = b_hi ? b->hi : b->lo;
    return or_equal ? x <= y : x < y;
}

static hval hv_node(hctx *h, uint16_t id);

static hval hv_load(const aj_side_tensor *t, const hval *idx);

/* A load's hull from the cache, or read and kept there: the tiles of a
 * row (column) of a block mask scan the same query (key) box. */
static hval hv_load_cached(aj_score_cache *cache, int tensor, const aj_side_tensor *t,
                           const hval *idx)
{
    if (!cache)
        return hv_load(t, idx);
    uint64_t key = (uint64_t)tensor * 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < t->rank; k++)
        key = (key ^ (uint64_t)idx[k].lo) * 0xbf58476d1ce4e5b9ull ^ (uint64_t)idx[k].hi;
    aj_score_cache_entry *e = &cache->entries[(key >> 32) % AJ_SCORE_CACHE_SIZE];
    bool hit = e->used && e->tensor == tensor;
    for (int k = 0; hit && k < t->rank; k++)
        hit = e->lo[k] == idx[k].lo && e->hi[k] == idx[k].hi;
    if (!hit) {
        hval v = hv_load(t, idx);
        *e = (aj_score_cache_entry){.used = true, .tensor = tensor, .ilo = v.lo, .ihi = v.hi,
                                    .flo = v.flo, .fhi = v.fhi};
        for (int k = 0; k < t->rank; k++)
            e->lo[k] = idx[k].lo, e->hi[k] = idx[k].hi;
    }
    return (hval){e->ilo, e->ihi, e->flo, e->fhi, false, false};
}

/* iv_load's rule on host data. */
static hval hv_load(const aj_side_tensor *t, const hval *idx)
{
    bool fl = t->dtype == AJ_SIDE_F32, outside = false;
    int64_t lo[AJ_EXPR_RANK_MAX], ext[AJ_EXPR_RANK_MAX], count = 1;
    for (int k = 0; k < t->rank; k++) {
        outside = outside || idx[k].lo < 0 || idx[k].hi >= t->shape[k];
        lo[k] = idx[k].lo < 0 ? 0 : idx[k].lo;
        int64_t hi = idx[k].hi < t->shape[k] - 1 ? idx[k].hi : t->shape[k] - 1;
        ext[k] = hi - lo[k] + 1 > 0 ? hi - lo[k] + 1 : 0;
        count *= ext[k] < SCAN_MAX + 1 ? ext[k] : SCAN_MAX + 1;
        count = count < SCAN_MAX + 1 ? count : SCAN_MAX + 1;
    }
    if (count > SCAN_MAX)
        return hv_unknown();
    hval r = {INT64_MAX, INT64_MIN, INFINITY, -INFINITY, false, false};
    for (int64_t e = 0; e < count; e++) {
        int64_t at = 0, rest = e;
        for (int k = t->rank - 1; k >= 0; k--) {
            at += (lo[k] + rest % ext[k]) * t->strides[k];
            rest /= ext[k];
        }
        if (fl) {
            float v = ((const float *)t->data)[at];
            r.flo = fminf(r.flo, v), r.fhi = fmaxf(r.fhi, v);
        } else {
            int64_t v = ((const int32_t *)t->data)[at];
            r.lo = v < r.lo ? v : r.lo, r.hi = v > r.hi ? v : r.hi;
        }
    }
    if (outside) {
        r.flo = fminf(r.flo, 0), r.fhi = fmaxf(r.fhi, 0);
        r.lo = r.lo < 0 ? r.lo : 0, r.hi = r.hi > 0 ? r.hi : 0;
    }
    return r;
}

/* Leaves are points (h unknown for any head; loads unknown: the host has
 * no tensor data), so a tree that reads no position comes out a point. */
static hval hv_compute(hctx *h, uint16_t id)
{
    const aj_expr_node *n = &h->p->e.nodes[id];
    aj_expr_op op = (aj_expr_op)n->op;
    aj_expr_type t = (aj_expr_type)n->type;
    bool fl = t == AJ_EXPR_FLOAT;
    if (op == AJ_EXPR_LOAD && !h->tensors)
        return hv_unknown();
    if (op == AJ_EXPR_LIT || (op == AJ_EXPR_VAR && n->u.var != AJ_VAR_Q &&
                              n->u.var != AJ_VAR_K)) {
        if (op == AJ_EXPR_VAR && ((n->u.var == AJ_VAR_H && h->any_head) ||
                                  (n->u.var == AJ_VAR_B && h->any_batch)))
            return hv_unknown();
        return hv_point(n, aj_expr_eval(&h->p->e, id, &h->env));
    }
    if (op == AJ_EXPR_VAR)
        return n->u.var == AJ_VAR_Q ? (hval){.lo = h->q0, .hi = h->q1}
                                    : (hval){.lo = h->k0, .hi = h->k1};
    hval x[AJ_EXPR_RANK_MAX];
    int ar = aj_expr_arity(n);
    for (int i = 0; i < ar; i++)
        x[i] = hv_node(h, n->args[i]);
    if (op == AJ_EXPR_LOAD)
        return hv_load_cached(h->cache, n->u.tensor, &h->tensors[n->u.tensor], x);
    aj_expr_type at = (aj_expr_type)h->p->e.nodes[n->args[0]].type;
    bool point1 = ar > 1 && (at == AJ_EXPR_FLOAT ? x[1].flo == x[1].fhi : x[1].lo == x[1].hi);
    bool point0 = at == AJ_EXPR_FLOAT ? x[0].flo == x[0].fhi : x[0].lo == x[0].hi;
    hval r = {0};
    switch (op) {
    case AJ_EXPR_TO_FLOAT:
        return (hval){.flo = (float)x[0].lo, .fhi = (float)x[0].hi};
    case AJ_EXPR_NEG:
        return fl ? (hval){.flo = -x[0].fhi, .fhi = -x[0].flo}
                  : (hval){.lo = sat64(-(__int128)x[0].hi), .hi = sat64(-(__int128)x[0].lo)};
    case AJ_EXPR_NOT:
        return (hval){.may_f = x[0].may_t, .may_t = x[0].may_f};
    case AJ_EXPR_ADD:
        return fl ? (hval){.flo = x[0].flo + x[1].flo, .fhi = x[0].fhi + x[1].fhi}
                  : (hval){.lo = sat64((__int128)x[0].lo + x[1].lo),
                           .hi = sat64((__int128)x[0].hi + x[1].hi)};
    case AJ_EXPR_SUB:
        return fl ? (hval){.flo = x[0].flo - x[1].fhi, .fhi = x[0].fhi - x[1].flo}
                  : (hval){.lo = sat64((__int128)x[0].lo - x[1].hi),
                           .hi = sat64((__int128)x[0].hi - x[1].lo)};
    case AJ_EXPR_MUL:
    case AJ_EXPR_DIV: {
        int point = point1 ? 1 : op == AJ_EXPR_MUL && point0 ? 0 : -1;
        if (point < 0)
            return hv_unknown();
        hval v = x[1 - point];
        if (fl) {
            float c = x[point].flo;
            if (op == AJ_EXPR_DIV && !(c != 0))
                return hv_unknown();
            float a1 = op == AJ_EXPR_MUL ? v.flo * c : v.flo / c;
            float a2 = op == AJ_EXPR_MUL ? v.fhi * c : v.fhi / c;
            return c < 0 ? (hval){.flo = a2, .fhi = a1} : (hval){.flo = a1, .fhi = a2};
        }
        int64_t c = x[point].lo;
        if (op == AJ_EXPR_MUL) {
            const int64_t lim = INT64_C(1) << 31;
            if (!(v.hi < lim && v.lo > -lim && c < lim && c > -lim))
                return hv_unknown();
            int64_t a1 = v.lo * c, a2 = v.hi * c;
            return (hval){.lo = a1 < a2 ? a1 : a2, .hi = a1 < a2 ? a2 : a1};
        }
        int64_t a1 = hfdiv(v.lo, c, 0), a2 = hfdiv(v.hi, c, 0);
        return (hval){.lo = a1 < a2 ? a1 : a2, .hi = a1 < a2 ? a2 : a1};
    }
    case AJ_EXPR_MOD: {
        int64_t c = x[1].lo;
        if (!point1 || c <= 0)
            return hv_unknown();
        int64_t r0 = hfdiv(x[0].lo, c, 1), r1 = hfdiv(x[0].hi, c, 1);
        if (sat64((__int128)x[0].hi - x[0].lo) < c && r0 <= r1)
            return (hval){.lo = r0, .hi = r1};
        return (hval){.lo = 0, .hi = c - 1};
    }
    case AJ_EXPR_AND:
        return (hval){.may_f = x[0].may_f || x[1].may_f, .may_t = x[0].may_t && x[1].may_t};
    case AJ_EXPR_OR:
        return (hval){.may_f = x[0].may_f && x[1].may_f, .may_t = x[0].may_t || x[1].may_t};
    case AJ_EXPR_LT: case AJ_EXPR_LE: case AJ_EXPR_GT: case AJ_EXPR_GE:
    case AJ_EXPR_EQ: case AJ_EXPR_NE: {
        const hval *a = &x[0], *c = &x[1];
        if (at == AJ_EXPR_BOOL) {
            if (op != AJ_EXPR_EQ && op != AJ_EXPR_NE)
                return hv_unknown();
            bool same = (a->may_t && c->may_t) || (a->may_f && c->may_f);
            bool diff = (a->may_t && c->may_f) || (a->may_f && c->may_t);
            return op == AJ_EXPR_EQ ? (hval){.may_f = diff, .may_t = same}
                                    : (hval){.may_f = same, .may_t = diff};
        }
        bool f = at == AJ_EXPR_FLOAT;
        switch (op) {
        case AJ_EXPR_LT:
            r.may_f = ult(f, c, 0, a, 1, true), r.may_t = ult(f, a, 0, c, 1, false);
            break;
        case AJ_EXPR_LE:
            r.may_f = ult(f, c, 0, a, 1, false), r.may_t = ult(f, a, 0, c, 1, true);
            break;
        case AJ_EXPR_GT:
            r.may_f = ult(f, a, 0, c, 1, true), r.may_t = ult(f, c, 0, a, 1, false);
            break;
        case AJ_EXPR_GE:
            r.may_f = ult(f, a, 0, c, 1, false), r.may_t = ult(f, c, 0, a, 1, true);
            break;
        default: {
            bool overlap = ult(f, a, 0, c, 1, true) && ult(f, c, 0, a, 1, true);
            bool eq = f ? a->flo == a->fhi && c->flo == c->fhi && a->flo == c->flo
                        : a->lo == a->hi && c->lo == c->hi && a->lo == c->lo;
            r = op == AJ_EXPR_EQ ? (hval){.may_f = !eq, .may_t = overlap}
                                 : (hval){.may_f = overlap, .may_t = !eq};
        }
        }
        return r;
    }
    case AJ_EXPR_SELECT: {
        hval a = x[1], c = x[2];
        if (!x[0].may_f)
            return a;
        if (!x[0].may_t)
            return c;
        if (t == AJ_EXPR_BOOL)
            return (hval){.may_f = a.may_f || c.may_f, .may_t = a.may_t || c.may_t};
        return fl ? (hval){.flo = fminf(a.flo, c.flo), .fhi = fmaxf(a.fhi, c.fhi)}
                  : (hval){.lo = a.lo < c.lo ? a.lo : c.lo, .hi = a.hi > c.hi ? a.hi : c.hi};
    }
    case AJ_EXPR_MIN:
    case AJ_EXPR_MAX:
    case AJ_EXPR_CLAMP: {
        hval v = x[0];
        for (int k = 1; k < ar; k++) {
            bool is_min = op == AJ_EXPR_MIN || (op == AJ_EXPR_CLAMP && k == 2);
            if (fl)
                v = is_min ? (hval){.flo = fminf(v.flo, x[k].flo), .fhi = fminf(v.fhi, x[k].fhi)}
                           : (hval){.flo = fmaxf(v.flo, x[k].flo), .fhi = fmaxf(v.fhi, x[k].fhi)};
            else
                v = is_min ? (hval){.lo = v.lo < x[k].lo ? v.lo : x[k].lo,
                                    .hi = v.hi < x[k].hi ? v.hi : x[k].hi}
                           : (hval){.lo = v.lo > x[k].lo ? v.lo : x[k].lo,
                                    .hi = v.hi > x[k].hi ? v.hi : x[k].hi};
        }
        return v;
    }
    case AJ_EXPR_ABS:
        if (fl) {
            float alo = fabsf(x[0].flo), ahi = fabsf(x[0].fhi);
            bool straddle = x[0].flo < 0 && x[0].fhi > 0;
            return (hval){.flo = straddle ? 0 : fminf(alo, ahi), .fhi = fmaxf(alo, ahi)};
        }
        if (x[0].lo >= 0)
            return x[0];
        if (x[0].hi <= 0)
            return (hval){.lo = -x[0].hi, .hi = -x[0].lo};
        return (hval){.lo = 0, .hi = -x[0].lo > x[0].hi ? -x[0].lo : x[0].hi};
    case AJ_EXPR_FLOOR:
        return fl ? (hval){.flo = floorf(x[0].flo), .fhi = floorf(x[0].fhi)} : x[0];
    case AJ_EXPR_EXP:
        return (hval){.flo = expf(x[0].flo), .fhi = expf(x[0].fhi)};
    case AJ_EXPR_LOG:
        return (hval){.flo = logf(x[0].flo), .fhi = logf(x[0].fhi)};
    case AJ_EXPR_TANH:
        return (hval){.flo = tanhf(x[0].flo), .fhi = tanhf(x[0].fhi)};
    case AJ_EXPR_SQRT:
        return (hval){.flo = sqrtf(x[0].flo), .fhi = sqrtf(x[0].fhi)};
    default:
        return hv_unknown();
    }
}

static hval hv_node(hctx *h, uint16_t id)
{
    if (!h->done[id]) {
        h->memo[id] = hv_compute(h, id);
        h->done[id] = true;
    }
    return h->memo[id];
}

aj_tile_class aj_score_host_class(const aj_score_prog *p, const aj_side_tensor *tensors,
                                  aj_score_cache *cache, int64_t b, int64_t h, int64_t q0,
                                  int64_t q1, int64_t k0, int64_t k1, int64_t sq, int64_t sk)
{
    hctx *c = malloc(sizeof *c);   /* large for a stack */
    if (!c)
        return AJ_TILE_PARTIAL;   /* always safe: every element tested */
    memset(c->done, 0, (size_t)p->e.count * sizeof c->done[0]);
    c->p = p;
    c->cache = cache;
    c->env = (aj_expr_env){.b = b < 0 ? 0 : b, .h = h < 0 ? 0 : h, .sq = sq, .sk = sk};
    c->any_batch = b < 0;
    c->tensors = tensors;
    c->any_head = h < 0;
    c->q0 = q0, c->q1 = q1, c->k0 = k0, c->k1 = k1;
    bool skip = false, full = true;
    /* the band, exactly as the kernels: k in [q + lo, q + hi] */
    uint16_t bounds[2] = {p->band_lo, p->band_hi};
    for (int side = 0; side < 2; side++) {
        if (bounds[side] == NONE)
            continue;
        /* a bound that reads h for any head is its hull over heads */
        hval v = hv_node(c, bounds[side]);
        if (side == 0) {    /* k >= q + lo */
            skip = skip || (__int128)k1 < (__int128)q0 + v.lo;
            full = full && (__int128)k0 >= (__int128)q1 + v.hi;
        } else {            /* k <= q + hi */
            skip = skip || (__int128)k0 > (__int128)q1 + v.hi;
            full = full && (__int128)k1 <= (__int128)q0 + v.lo;
        }
    }
    if (p->rest != NONE) {
        hval r = hv_node(c, p->rest);
        skip = skip || !r.may_t;
        full = full && !r.may_f;
    }
    free(c);
    return skip ? AJ_TILE_SKIP : full ? AJ_TILE_FULL : AJ_TILE_PARTIAL;
}
