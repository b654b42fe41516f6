/*
 * score_tiles.c -- a node's range over a tile, emitted, and the tile walks
 * (score_internal.h).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/attn_common.h"
#include "templates/cpu_vec.h"
#include "templates/score_internal.h"

/* ---------------------------------------------------------------- intervals */

/* The interval rules' IR backend (score_ival.c): a tile's ranges emitted. */
typedef struct iemitter {
    ival_ctx c;                       /* first: the rules' context */
    emitter pt;                       /* point values */
} iemitter;

static LLVMValueRef sel(aj_kb *kb, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildSelect(kb->b, c, a, b, "");
}

static LLVMValueRef fminmax(aj_kb *kb, int is_min, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef args[2] = {a, b};
    return aj_kb_call_overloaded(kb, is_min ? "llvm.minnum" : "llvm.maxnum", args, 2);
}

/* A point node: its value, emitted as usual. */
static ival ir_point(ival_ctx *c, uint16_t id)
{
    LLVMValueRef v = aj_score_emit_node(c->pt, id);
    if (node(c->p, id)->type == AJ_EXPR_BOOL)
        return (ival){{.v = LLVMBuildNot(c->kb->b, v, "")}, {.v = v}};
    return (ival){{.v = v}, {.v = v}};
}

/*
 * A load over a box of indices: the hull of the values inside the tensor,
 * and 0 where the box reaches past it.  Boxes of more than SCAN_MAX
 * elements are not read: unknown.  (A document mask's doc[b, q] over a
 * tile's rows is a box of block_m elements.)
 */

static ival ir_load(ival_ctx *c, const aj_expr_node *n, const ival *idx)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = kb->b;
    const aj_tensor_decl *d = &c->p->tensors[n->u.tensor];
    int fl = d->dtype != AJ_SIDE_I32;
    LLVMValueRef zero64 = aj_kb_i64(kb, 0), one64 = aj_kb_i64(kb, 1);
    LLVMValueRef outside = LLVMConstInt(kb->t_i1, 0, 0), count = one64;
    LLVMValueRef lo[AJ_EXPR_RANK_MAX], ext[AJ_EXPR_RANK_MAX], stride[AJ_EXPR_RANK_MAX];
    char name[64];
    for (int k = 0; k < d->rank; k++) {
        aj_score_param_name(name, sizeof name, d->name, 's', k);
        LLVMValueRef size = aj_kb_param(kb, name);
        aj_score_param_name(name, sizeof name, d->name, 't', k);
        stride[k] = aj_kb_param(kb, name);
        outside = LLVMBuildOr(b, outside, LLVMBuildOr(b,
                              LLVMBuildICmp(b, LLVMIntSLT, idx[k].lo.v, zero64, ""),
                              LLVMBuildICmp(b, LLVMIntSGE, idx[k].hi.v, size, ""), ""), "");
        lo[k] = aj_kb_smax(kb, idx[k].lo.v, zero64);
        LLVMValueRef hi = aj_kb_smin(kb, idx[k].hi.v, LLVMBuildSub(b, size, one64, ""));
        ext[k] = aj_kb_smax(kb, LLVMBuildAdd(b, LLVMBuildSub(b, hi, lo[k], ""), one64, ""),
                            zero64);
        /* products of extents past SCAN_MAX stop mattering: saturate */
        count = aj_kb_smin(kb, LLVMBuildMul(b, count, aj_kb_smin(kb, ext[k],
                                                                 aj_kb_i64(kb, SCAN_MAX + 1)),
                                            ""), aj_kb_i64(kb, SCAN_MAX + 1));
    }
    LLVMTypeRef vt = fl ? kb->t_f32 : kb->t_i64;
    LLVMValueRef top = fl ? aj_kb_f32(kb, INFINITY) : aj_kb_i64(kb, INT64_MAX);
    LLVMValueRef bottom = fl ? aj_kb_f32(kb, -INFINITY) : aj_kb_i64(kb, INT64_MIN);
    LLVMValueRef vmin = aj_kb_var(kb, vt, top, "scan_min");
    LLVMValueRef vmax = aj_kb_var(kb, vt, bottom, "scan_max");
    LLVMValueRef small = LLVMBuildICmp(b, LLVMIntSLE, count, aj_kb_i64(kb, SCAN_MAX), "");
    /* the box's indices as an odometer (no division per element): the
     * last dim turns fastest */
    LLVMValueRef cur[AJ_EXPR_RANK_MAX];
    for (int k = 0; k < d->rank; k++)
        cur[k] = aj_kb_var(kb, kb->t_i64, lo[k], "scan_at");
    aj_kb_for_begin(kb, zero64, LLVMBuildSelect(b, small, count, zero64, ""), one64, "scan");
    {
        LLVMValueRef at = zero64, carry = LLVMConstInt(kb->t_i1, 1, 0);
        for (int k = d->rank - 1; k >= 0; k--) {
            LLVMValueRef i = aj_kb_get(kb, cur[k]);
            at = LLVMBuildAdd(b, at, LLVMBuildMul(b, i, stride[k], ""), "");
            LLVMValueRef next = LLVMBuildAdd(b, i, LLVMBuildZExt(b, carry, kb->t_i64, ""), "");
            LLVMValueRef wrap = LLVMBuildICmp(b, LLVMIntSGE, LLVMBuildSub(b, next, lo[k], ""),
                                              ext[k], "");
            aj_kb_set(kb, cur[k], sel(kb, wrap, lo[k], next));
            carry = wrap;
        }
        LLVMValueRef v = aj_score_side_load(kb, d, at);
        LLVMValueRef mn = aj_kb_get(kb, vmin), mx = aj_kb_get(kb, vmax);
        aj_kb_set(kb, vmin, fl ? fminmax(kb, 1, mn, v) : aj_kb_smin(kb, mn, v));
        aj_kb_set(kb, vmax, fl ? fminmax(kb, 0, mx, v) : aj_kb_smax(kb, mx, v));
    }
    aj_kb_for_end(kb);
    LLVMValueRef z = fl ? aj_kb_f32(kb, 0) : zero64;
    LLVMValueRef mn = aj_kb_get(kb, vmin), mx = aj_kb_get(kb, vmax);
    mn = sel(kb, outside, fl ? fminmax(kb, 1, mn, z) : aj_kb_smin(kb, mn, z), mn);
    mx = sel(kb, outside, fl ? fminmax(kb, 0, mx, z) : aj_kb_smax(kb, mx, z), mx);
    ival u = aj_ival_unknown(c, fl ? AJ_EXPR_FLOAT : AJ_EXPR_INT);
    return (ival){{.v = sel(kb, small, mn, u.lo.v)}, {.v = sel(kb, small, mx, u.hi.v)}};
}

/* An iemitter and its memos, for programs of `count` nodes. */
static size_t iemitter_bytes(int count)
{
    return sizeof(iemitter) + emitter_memo_bytes(count) + ival_memo_bytes(count);
}

/* An interval emitter over rows [i0, i1] x keys [j0, j1], holding the
 * fixed rows' intervals (aj_score_fix_rows) where there are some. */
static void iemitter_init(iemitter *m, aj_score *s, LLVMValueRef i0, LLVMValueRef i1,
                          LLVMValueRef j0, LLVMValueRef j1)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    int count = s->p->e.count;
    memset(m, 0, sizeof *m);
    char *memos = (char *)(m + 1);   /* iemitter_bytes: the point memos, the intervals' */
    emitter_init(&m->pt, memos, s, 0, aj_kb_i32(kb, 0), aj_kb_i32(kb, 0), NULL);
    ival_ctx *c = &m->c;
    ival_memo_init(c, memos + emitter_memo_bytes(count), count);
    c->kb = kb;
    c->pt = &m->pt;
    c->p = s->p;
    c->positional = AJ_SCORE_READS_POSITION;
    c->bh = false;
    c->point = ir_point;
    c->load = ir_load;
    c->q.lo.v = LLVMBuildAdd(b, s->q_origin, to_i64(kb, i0), "");
    c->q.hi.v = LLVMBuildAdd(b, s->q_origin, to_i64(kb, i1), "");
    c->k.lo.v = LLVMBuildAdd(b, s->k_origin, to_i64(kb, j0), "");
    c->k.hi.v = LLVMBuildAdd(b, s->k_origin, to_i64(kb, j1), "");
    for (int id = 0; id < s->p->e.count; id++)
        if (s->row_lo[id] || s->col_lo[id]) {
            c->memo[id] = s->row_lo[id] ? (ival){{.v = s->row_lo[id]}, {.v = s->row_hi[id]}}
                                        : (ival){{.v = s->col_lo[id]}, {.v = s->col_hi[id]}};
            c->done[id] = true;
        }
}

void aj_score_fix_rows(aj_score *s, LLVMValueRef i0, LLVMValueRef i1)
{
    const aj_score_prog *p = s->p;
    if (p->rest == NONE)
        return;
    iemitter *m = score_scratch(s, SLOT_FIX_ROWS, iemitter_bytes(s->p->e.count));
    if (!m)
        return;
    iemitter_init(m, s, i0, i1, aj_kb_i32(s->kb, 0), aj_kb_i32(s->kb, 0));
    for (int id = 0; id < p->e.count; id++)
        if ((p->reads[id] & AJ_SCORE_READS(AJ_VAR_Q)) &&
            !(p->reads[id] & AJ_SCORE_READS_KEY)) {
            ival v = aj_ival_node(&m->c, (uint16_t)id);
            s->row_lo[id] = v.lo.v;
            s->row_hi[id] = v.hi.v;
        }
}

/* Whether node id is one of the rest's that read k and not q: fixed by
 * the keys (aj_score_fix_cols). */
static bool reads_keys_only(const aj_score_prog *p, int id)
{
    return (p->reads[id] & AJ_SCORE_READS(AJ_VAR_K)) &&
           !(p->reads[id] & (AJ_SCORE_READS(AJ_VAR_Q) | AJ_SCORE_READS(AJ_VAR_SCORE) |
                             AJ_SCORE_READS(AJ_VAR_BIAS)));
}

int aj_score_col_slots(const aj_score_prog *p)
{
    int n = 0;
    for (int id = 0; p->rest != NONE && id < p->e.count; id++)
        n += reads_keys_only(p, id);
    return n;
}

void aj_score_fix_cols(aj_score *s, LLVMValueRef j0, LLVMValueRef j1)
{
    const aj_score_prog *p = s->p;
    iemitter *m = score_scratch(s, SLOT_FIX_COLS, iemitter_bytes(s->p->e.count));
    if (!m)
        return;
    iemitter_init(m, s, aj_kb_i32(s->kb, 0), aj_kb_i32(s->kb, 0), j0, j1);
    for (int id = 0; p->rest != NONE && id < p->e.count; id++)
        if (reads_keys_only(p, id)) {
            ival v = aj_ival_node(&m->c, (uint16_t)id);
            s->col_lo[id] = v.lo.v;
            s->col_hi[id] = v.hi.v;
        }
}

/* A bound as the i64 it is kept as: ints as they are, floats' bits, bools
 * 0 or 1; and back. */
static LLVMValueRef bound_to_i64(aj_kb *kb, LLVMValueRef v)
{
    LLVMTypeRef t = LLVMTypeOf(v);
    if (t == kb->t_f32)
        v = LLVMBuildBitCast(kb->b, v, kb->t_i32, "");
    return t == kb->t_i64 ? v : LLVMBuildZExt(kb->b, v, kb->t_i64, "");
}

static LLVMValueRef bound_from_i64(aj_kb *kb, aj_expr_type t, LLVMValueRef v)
{
    if (t == AJ_EXPR_BOOL)
        return LLVMBuildTrunc(kb->b, v, kb->t_i1, "");
    if (t == AJ_EXPR_FLOAT)
        return LLVMBuildBitCast(kb->b, LLVMBuildTrunc(kb->b, v, kb->t_i32, ""), kb->t_f32, "");
    return v;
}

/* The i64 slot's pointer: block_mask + 8 (at + k). */
static LLVMValueRef col_slot(aj_score *s, LLVMValueRef at, int k)
{
    LLVMBuilderRef b = s->kb->b;
    LLVMValueRef i = LLVMBuildAdd(b, at, aj_kb_i64(s->kb, k), "");
    return aj_kb_gptr_offset(s->kb, aj_param(s->kb, AJ_PID(block_mask)),
                             LLVMBuildShl(b, i, aj_kb_i64(s->kb, 3), ""));
}

void aj_score_save_cols(aj_score *s, LLVMValueRef at)
{
    for (int id = 0, k = 0; id < s->p->e.count; id++)
        if (s->col_lo[id]) {
            aj_kb_store(s->kb, bound_to_i64(s->kb, s->col_lo[id]), col_slot(s, at, k++), 8);
            aj_kb_store(s->kb, bound_to_i64(s->kb, s->col_hi[id]), col_slot(s, at, k++), 8);
        }
}

void aj_score_load_cols(aj_score *s, LLVMValueRef at)
{
    const aj_score_prog *p = s->p;
    aj_kb *kb = s->kb;
    for (int id = 0, k = 0; p->rest != NONE && id < p->e.count; id++)
        if (reads_keys_only(p, id)) {
            aj_expr_type t = (aj_expr_type)node(p, id)->type;
            s->col_lo[id] =
                bound_from_i64(kb, t, aj_kb_load(kb, kb->t_i64, col_slot(s, at, k++), 8));
            s->col_hi[id] =
                bound_from_i64(kb, t, aj_kb_load(kb, kb->t_i64, col_slot(s, at, k++), 8));
        }
}

/* The rest's class by interval arithmetic: *skip where it cannot hold,
 * *full where it must. */
static void interval_tile_class(aj_score *s, LLVMValueRef i0, LLVMValueRef i1, LLVMValueRef j0,
                                LLVMValueRef j1, LLVMValueRef *skip, LLVMValueRef *full)
{
    LLVMBuilderRef b = s->kb->b;
    iemitter *m = score_scratch(s, SLOT_TILE_CLASS, iemitter_bytes(s->p->e.count));
    if (!m) {
        *skip = *full = LLVMConstInt(s->kb->t_i1, 0, 0);
        return;
    }
    iemitter_init(m, s, i0, i1, j0, j1);
    ival r = aj_ival_node(&m->c, s->p->rest);
    *skip = LLVMBuildNot(b, r.hi.v, "");
    *full = LLVMBuildNot(b, r.lo.v, "");
}

/*
 * The rest's class where the op takes a block mask: rows [i0, i1] x keys
 * [j0, j1] meet the mask's tiles [i0 / bm, i1 / bm] x [j0 / bn, j1 / bn]
 * (its tile need not be the kernel's); the range is skip where each of
 * them is, full where each is, else partial:
 *
 *          j0/bn     j1/bn
 *   i0/bm  [S] [S] [P]        all S: skip    all F: full
 *   i1/bm  [S] [S] [S]        else (a P, or S beside F): partial
 *
 * With no mask given (a NULL pointer: a kernel loaded from bytes, whose
 * launch cannot build one) the interval rules decide.
 */
static void rest_tile_class(aj_score *s, LLVMValueRef i0, LLVMValueRef i1, LLVMValueRef j0,
                            LLVMValueRef j1, LLVMValueRef *skip, LLVMValueRef *full)
{
    if (!s->p->block_mask) {
        interval_tile_class(s, i0, i1, j0, j1, skip, full);
        return;
    }
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef t1 = LLVMConstInt(kb->t_i1, 1, 0);
    LLVMValueRef all_skip = aj_kb_var(kb, kb->t_i1, t1, "mask_skip");
    LLVMValueRef all_full = aj_kb_var(kb, kb->t_i1, t1, "mask_full");
    aj_kb_if_begin(kb, LLVMBuildIsNotNull(b, s->mask_classes, ""));
    {
        aj_kb_set(kb, all_skip, t1);
        aj_kb_set(kb, all_full, t1);
        LLVMValueRef one = aj_kb_i64(kb, 1);
        LLVMValueRef r0 = LLVMBuildSDiv(b, to_i64(kb, i0), s->mask_bm, "");
        LLVMValueRef r1 =
            LLVMBuildAdd(b, LLVMBuildSDiv(b, to_i64(kb, i1), s->mask_bm, ""), one, "");
        LLVMValueRef c0 = LLVMBuildSDiv(b, to_i64(kb, j0), s->mask_bn, "");
        LLVMValueRef c1 =
            LLVMBuildAdd(b, LLVMBuildSDiv(b, to_i64(kb, j1), s->mask_bn, ""), one, "");
        LLVMValueRef r = aj_kb_for_begin(kb, r0, r1, one, "mask_r");
        LLVMValueRef row =
            LLVMBuildAdd(b, s->mask_plane, LLVMBuildMul(b, r, s->mask_stride_m, ""), "");
        LLVMValueRef c = aj_kb_for_begin(kb, c0, c1, one, "mask_c");
        LLVMValueRef at = LLVMBuildShl(b, LLVMBuildAdd(b, row, c, ""), aj_kb_i64(kb, 2), "");
        LLVMValueRef cls = aj_kb_load(kb, kb->t_i32, aj_kb_gptr_offset(kb, s->mask_classes, at), 4);
        LLVMValueRef is_skip = LLVMBuildICmp(b, LLVMIntEQ, cls, aj_kb_i32(kb, AJ_TILE_SKIP), "");
        LLVMValueRef is_full = LLVMBuildICmp(b, LLVMIntEQ, cls, aj_kb_i32(kb, AJ_TILE_FULL), "");
        aj_kb_set(kb, all_skip, LLVMBuildAnd(b, aj_kb_get(kb, all_skip), is_skip, ""));
        aj_kb_set(kb, all_full, LLVMBuildAnd(b, aj_kb_get(kb, all_full), is_full, ""));
        aj_kb_for_end(kb);
        aj_kb_for_end(kb);
    }
    aj_kb_else(kb);
    {
        LLVMValueRef iskip, ifull;
        interval_tile_class(s, i0, i1, j0, j1, &iskip, &ifull);
        aj_kb_set(kb, all_skip, iskip);
        aj_kb_set(kb, all_full, ifull);
    }
    aj_kb_if_end(kb);
    *skip = aj_kb_get(kb, all_skip);
    *full = aj_kb_get(kb, all_full);
}

LLVMValueRef aj_score_tile_class(aj_score *s, LLVMValueRef i0, LLVMValueRef i1,
                                 LLVMValueRef j0, LLVMValueRef j1)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef t1 = LLVMConstInt(kb->t_i1, 1, 0), f1 = LLVMConstInt(kb->t_i1, 0, 0);
    /* the band: skip when every key lies beyond it, full when inside */
    LLVMValueRef skip = f1, full = t1;
    if (s->hi_off) {
        skip = LLVMBuildOr(b, skip, LLVMBuildICmp(b, LLVMIntSGT, j0,
                                                  LLVMBuildAdd(b, i1, s->hi_off, ""), ""), "");
        full = LLVMBuildAnd(b, full, LLVMBuildICmp(b, LLVMIntSLE, j1,
                                                   LLVMBuildAdd(b, i0, s->hi_off, ""), ""), "");
    }
    if (s->lo_off) {
        skip = LLVMBuildOr(b, skip, LLVMBuildICmp(b, LLVMIntSLT, j1,
                                                  LLVMBuildAdd(b, i0, s->lo_off, ""), ""), "");
        full = LLVMBuildAnd(b, full, LLVMBuildICmp(b, LLVMIntSGE, j0,
                                                   LLVMBuildAdd(b, i1, s->lo_off, ""), ""), "");
    }
    LLVMValueRef skip_cls = aj_kb_i32(kb, AJ_TILE_SKIP), full_cls = aj_kb_i32(kb, AJ_TILE_FULL);
    LLVMValueRef partial_cls = aj_kb_i32(kb, AJ_TILE_PARTIAL);
    if (s->p->rest == NONE)
        return sel(kb, skip, skip_cls, sel(kb, full, full_cls, partial_cls));
    /* the rest only where the band leaves the tile: its loads' hulls are
     * the costly part of a class */
    LLVMValueRef cls = aj_kb_var(kb, kb->t_i32, skip_cls, "tile_class");
    aj_kb_if_begin(kb, LLVMBuildNot(b, skip, ""));
    {
        LLVMValueRef rest_skip, rest_full;
        rest_tile_class(s, i0, i1, j0, j1, &rest_skip, &rest_full);
        full = LLVMBuildAnd(b, full, rest_full, "");
        aj_kb_set(kb, cls, sel(kb, rest_skip, skip_cls, sel(kb, full, full_cls, partial_cls)));
    }
    aj_kb_if_end(kb);
    return aj_kb_get(kb, cls);
}

/* ---------------------------------------------------------------- walks */

LLVMValueRef aj_score_mask_list_at(aj_kb *kb, LLVMValueRef plane, LLVMValueRef rows,
                                   LLVMValueRef cols, int by_keys, LLVMValueRef block)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef one = aj_kb_i64(kb, 1);
    LLVMValueRef at = LLVMBuildAdd(b, plane, LLVMBuildMul(b, rows, cols, ""), "");
    if (by_keys)
        return LLVMBuildAdd(b, at, LLVMBuildMul(b, block, LLVMBuildAdd(b, cols, one, ""), ""),
                            "row_list");
    at = LLVMBuildAdd(b, at, LLVMBuildMul(b, rows, LLVMBuildAdd(b, cols, one, ""), ""), "");
    return LLVMBuildAdd(b, at, LLVMBuildMul(b, block, LLVMBuildAdd(b, rows, one, ""), ""),
                        "col_list");
}

/*
 * A walk's set-up (score.h).  The list applies where the mask is given,
 * its tile along the walk is the walk's, and the fixed range [lo, hi] is
 * one of its blocks across:
 *
 *   keys:  bn == mask_bn, lo % mask_bm == 0, hi + 1 == min(lo + mask_bm, Sq)
 *          list of row block lo / mask_bm: plane + rows cols + m (cols + 1)
 *   rows:  bm == mask_bm, lo % mask_bn == 0, hi + 1 == min(lo + mask_bn, Sk)
 *          list of key block lo / mask_bn: plane + rows cols
 *                                          + rows (cols + 1) + n (rows + 1)
 */
static void walk_begin(aj_score *s, aj_score_walk *w, int along_keys, LLVMValueRef lo,
                       LLVMValueRef hi, int size, LLVMValueRef first, LLVMValueRef end,
                       LLVMValueRef seq_q, LLVMValueRef seq_k)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    *w = (aj_score_walk){.begin = first, .end = end, .along_keys = along_keys, .size = size,
                         .lo = lo, .hi = hi, .first = first, .last = end,
                         .seq = along_keys ? seq_k : seq_q};
    if (!s->p->block_mask)
        return;
    LLVMValueRef q = to_i64(kb, seq_q), k = to_i64(kb, seq_k), one = aj_kb_i64(kb, 1);
    LLVMValueRef rows = LLVMBuildSDiv(
        b, LLVMBuildAdd(b, q, LLVMBuildSub(b, s->mask_bm, one, ""), ""), s->mask_bm, "mask_rows");
    LLVMValueRef cols = s->mask_stride_m;
    LLVMValueRef along = along_keys ? s->mask_bn : s->mask_bm;
    LLVMValueRef across = along_keys ? s->mask_bm : s->mask_bn;
    LLVMValueRef lo64 = to_i64(kb, lo), hi64 = to_i64(kb, hi);
    LLVMValueRef block_end = aj_kb_smin(kb, LLVMBuildAdd(b, lo64, across, ""), along_keys ? q : k);
    LLVMValueRef ok = LLVMBuildIsNotNull(b, s->mask_classes, "");
    ok = LLVMBuildAnd(b, ok, LLVMBuildICmp(b, LLVMIntEQ, along, aj_kb_i64(kb, size), ""), "");
    ok = LLVMBuildAnd(b, ok, LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildSRem(b, lo64, across, ""),
                                           aj_kb_i64(kb, 0), ""), "");
    ok = LLVMBuildAnd(b, ok, LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildAdd(b, hi64, one, ""),
                                           block_end, ""), "listed");
    LLVMValueRef block = LLVMBuildSDiv(b, lo64, across, "");
    LLVMValueRef at = aj_score_mask_list_at(kb, s->mask_plane, rows, cols, along_keys, block);
    LLVMValueRef count = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, 0), "list_count");
    aj_kb_if_begin(kb, ok);
    aj_kb_set(kb, count, aj_kb_load(kb, kb->t_i32, aj_kb_gptr_offset(kb, s->mask_classes,
                                    LLVMBuildShl(b, at, aj_kb_i64(kb, 2), "")), 4));
    aj_kb_if_end(kb);
    w->listed = ok;
    w->entries = LLVMBuildAdd(b, at, one, "entries");
    w->begin = LLVMBuildSelect(b, ok, aj_kb_i32(kb, 0), first, "walk_begin");
    w->end = LLVMBuildSelect(b, ok, aj_kb_get(kb, count), end, "walk_end");
}

void aj_score_walk_keys(aj_score *s, aj_score_walk *w, LLVMValueRef i0, LLVMValueRef i1,
                        int bn, LLVMValueRef n_first, LLVMValueRef n_end, LLVMValueRef seq_q,
                        LLVMValueRef seq_k)
{
    walk_begin(s, w, 1, i0, i1, bn, n_first, n_end, seq_q, seq_k);
}

void aj_score_walk_rows(aj_score *s, aj_score_walk *w, LLVMValueRef j0, LLVMValueRef j1,
                        int bm, LLVMValueRef m_first, LLVMValueRef m_end, LLVMValueRef seq_q,
                        LLVMValueRef seq_k)
{
    walk_begin(s, w, 0, j0, j1, bm, m_first, m_end, seq_q, seq_k);
}

/* The class of tile t of the walk by aj_score_tile_class. */
static LLVMValueRef walk_class(aj_score *s, const aj_score_walk *w, LLVMValueRef t)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef t0 = LLVMBuildMul(b, t, aj_kb_i32(kb, w->size), "");
    LLVMValueRef t1 =
        LLVMBuildSub(b, aj_kb_smin(kb, LLVMBuildAdd(b, t0, aj_kb_i32(kb, w->size), ""), w->seq),
                     aj_kb_i32(kb, 1), "");
    return w->along_keys ? aj_score_tile_class(s, w->lo, w->hi, t0, t1)
                         : aj_score_tile_class(s, t0, t1, w->lo, w->hi);
}

LLVMValueRef aj_score_walk_tile(aj_score *s, const aj_score_walk *w, LLVMValueRef pos,
                                LLVMValueRef *cls)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    if (!w->listed) {
        if (cls)
            *cls = walk_class(s, w, pos);
        return pos;
    }
    LLVMValueRef tile = aj_kb_var(kb, kb->t_i32, pos, "walk_tile");
    LLVMValueRef c = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, AJ_TILE_SKIP), "walk_class");
    aj_kb_if_begin(kb, w->listed);
    {
        LLVMValueRef at = LLVMBuildAdd(b, w->entries, to_i64(kb, pos), "");
        LLVMValueRef e = aj_kb_load(kb, kb->t_i32, aj_kb_gptr_offset(kb, s->mask_classes,
                                    LLVMBuildShl(b, at, aj_kb_i64(kb, 2), "")), 4);
        LLVMValueRef t = LLVMBuildAShr(b, e, aj_kb_i32(kb, 2), "");
        LLVMValueRef in = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSGE, t, w->first, ""),
                                       LLVMBuildICmp(b, LLVMIntSLT, t, w->last, ""), "");
        aj_kb_set(kb, tile, t);
        aj_kb_set(kb, c, sel(kb, in, LLVMBuildAnd(b, e, aj_kb_i32(kb, 3), ""),
                             aj_kb_i32(kb, AJ_TILE_SKIP)));
    }
    aj_kb_else(kb);
    aj_kb_set(kb, c, walk_class(s, w, pos));
    aj_kb_if_end(kb);
    if (cls)
        *cls = aj_kb_get(kb, c);
    return aj_kb_get(kb, tile);
}
