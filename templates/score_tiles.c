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

/*
 * Interval arithmetic over a tile: every int or float node gets [lo, hi],
 * every bool node (may be false, may be true).  A node that reads no
 * position is a point (its value, emitted as usual).  Where a rule cannot
 * bound a node it is unknown: ints [-2^62, 2^62] (sums saturate), floats
 * [-inf, inf]; a float bound that is NaN makes every comparison with it
 * "may be either".  The host version below (hv_*) follows the same rules.
 */

typedef struct ival {
    LLVMValueRef lo, hi;   /* bool: lo = may be false, hi = may be true */
} ival;

typedef struct iemitter {
    emitter pt;                       /* point values */
    LLVMValueRef q0, q1, k0, k1;      /* i64 global positions of the tile */
    ival memo[AJ_EXPR_NODES_MAX];
    bool done[AJ_EXPR_NODES_MAX];
} iemitter;

/* Whether a node's tree reads a position (it is a range over a tile). */
static bool is_positional(const iemitter *m, uint16_t id)
{
    return m->pt.s->p->reads[id] & AJ_SCORE_READS_POSITION;
}

static ival iv_unknown(aj_kb *kb, aj_expr_type t)
{
    if (t == AJ_EXPR_FLOAT)
        return (ival){aj_kb_f32(kb, -INFINITY), aj_kb_f32(kb, INFINITY)};
    if (t == AJ_EXPR_BOOL)
        return (ival){LLVMConstInt(kb->t_i1, 1, 0), LLVMConstInt(kb->t_i1, 1, 0)};
    return (ival){aj_kb_i64(kb, -UNKNOWN_INT), aj_kb_i64(kb, UNKNOWN_INT)};
}

static LLVMValueRef sel(aj_kb *kb, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildSelect(kb->b, c, a, b, "");
}

static LLVMValueRef sat(aj_kb *kb, const char *name, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef args[2] = {a, b};
    LLVMValueRef v = aj_kb_call_overloaded(kb, name, args, 2);
    v = aj_kb_smin(kb, v, aj_kb_i64(kb, UNKNOWN_INT));
    return aj_kb_smax(kb, v, aj_kb_i64(kb, -UNKNOWN_INT));
}

/* x * c for a point c, either order of the bounds; unknown on overflow */
static ival iv_scale_int(aj_kb *kb, ival x, LLVMValueRef c)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef a1 = LLVMBuildMul(b, x.lo, c, ""), a2 = LLVMBuildMul(b, x.hi, c, "");
    /* bounds and c within 2^31 keep the products exact */
    LLVMValueRef lim = aj_kb_i64(kb, INT64_C(1) << 31), nlim = aj_kb_i64(kb, -(INT64_C(1) << 31));
    LLVMValueRef small = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSLT, x.hi, lim, ""),
                                      LLVMBuildICmp(b, LLVMIntSGT, x.lo, nlim, ""), "");
    small = LLVMBuildAnd(b, small, LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSLT, c, lim, ""),
                                                LLVMBuildICmp(b, LLVMIntSGT, c, nlim, ""), ""),
                         "");
    ival u = iv_unknown(kb, AJ_EXPR_INT);
    return (ival){sel(kb, small, aj_kb_smin(kb, a1, a2), u.lo),
                  sel(kb, small, aj_kb_smax(kb, a1, a2), u.hi)};
}

static ival iv_node(iemitter *m, uint16_t id);

static LLVMValueRef fminmax(aj_kb *kb, int is_min, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef args[2] = {a, b};
    return aj_kb_call_overloaded(kb, is_min ? "llvm.minnum" : "llvm.maxnum", args, 2);
}

/*
 * A load over a box of indices: the hull of the values inside the tensor,
 * and 0 where the box reaches past it.  Boxes of more than SCAN_MAX
 * elements are not read: unknown.  (A document mask's doc[b, q] over a
 * tile's rows is a box of block_m elements.)
 */

static ival iv_load(iemitter *m, const aj_expr_node *n, const ival *idx)
{
    aj_kb *kb = m->pt.s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_tensor_decl *d = &m->pt.s->p->tensors[n->u.tensor];
    int fl = d->dtype == AJ_SIDE_F32;
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
                              LLVMBuildICmp(b, LLVMIntSLT, idx[k].lo, zero64, ""),
                              LLVMBuildICmp(b, LLVMIntSGE, idx[k].hi, size, ""), ""), "");
        lo[k] = aj_kb_smax(kb, idx[k].lo, zero64);
        LLVMValueRef hi = aj_kb_smin(kb, idx[k].hi, LLVMBuildSub(b, size, one64, ""));
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
        LLVMValueRef v = aj_kb_load(kb, fl ? kb->t_f32 : kb->t_i32,
                                    aj_kb_gptr_offset(kb, aj_kb_param(kb, d->name),
                                                      LLVMBuildShl(b, at, aj_kb_i64(kb, 2), "")),
                                    4);
        if (!fl)
            v = LLVMBuildSExt(b, v, kb->t_i64, "");
        LLVMValueRef mn = aj_kb_get(kb, vmin), mx = aj_kb_get(kb, vmax);
        aj_kb_set(kb, vmin, fl ? fminmax(kb, 1, mn, v) : aj_kb_smin(kb, mn, v));
        aj_kb_set(kb, vmax, fl ? fminmax(kb, 0, mx, v) : aj_kb_smax(kb, mx, v));
    }
    aj_kb_for_end(kb);
    LLVMValueRef z = fl ? aj_kb_f32(kb, 0) : zero64;
    LLVMValueRef mn = aj_kb_get(kb, vmin), mx = aj_kb_get(kb, vmax);
    mn = sel(kb, outside, fl ? fminmax(kb, 1, mn, z) : aj_kb_smin(kb, mn, z), mn);
    mx = sel(kb, outside, fl ? fminmax(kb, 0, mx, z) : aj_kb_smax(kb, mx, z), mx);
    ival u = iv_unknown(kb, fl ? AJ_EXPR_FLOAT : AJ_EXPR_INT);
    return (ival){sel(kb, small, mn, u.lo), sel(kb, small, mx, u.hi)};
}


static ival iv_minmax(aj_kb *kb, aj_expr_type t, int is_min, ival a, ival b)
{
    if (t == AJ_EXPR_FLOAT)
        return (ival){fminmax(kb, is_min, a.lo, b.lo), fminmax(kb, is_min, a.hi, b.hi)};
    return is_min ? (ival){aj_kb_smin(kb, a.lo, b.lo), aj_kb_smin(kb, a.hi, b.hi)}
                  : (ival){aj_kb_smax(kb, a.lo, b.lo), aj_kb_smax(kb, a.hi, b.hi)};
}

static ival iv_compare(aj_kb *kb, aj_expr_op op, aj_expr_type t, ival a, ival c)
{
    LLVMBuilderRef b = kb->b;
    if (t == AJ_EXPR_BOOL) {
        if (op != AJ_EXPR_EQ && op != AJ_EXPR_NE)
            return iv_unknown(kb, AJ_EXPR_BOOL);
        LLVMValueRef same = LLVMBuildOr(b, LLVMBuildAnd(b, a.hi, c.hi, ""),
                                        LLVMBuildAnd(b, a.lo, c.lo, ""), "");
        LLVMValueRef diff = LLVMBuildOr(b, LLVMBuildAnd(b, a.hi, c.lo, ""),
                                        LLVMBuildAnd(b, a.lo, c.hi, ""), "");
        return op == AJ_EXPR_EQ ? (ival){diff, same} : (ival){same, diff};
    }
    int fl = t == AJ_EXPR_FLOAT;
#define LT_(x, y)                                                                                  \
    (fl ? LLVMBuildFCmp(b, LLVMRealULT, x, y, "") : LLVMBuildICmp(b, LLVMIntSLT, x, y, ""))
#define LE_(x, y)                                                                                  \
    (fl ? LLVMBuildFCmp(b, LLVMRealULE, x, y, "") : LLVMBuildICmp(b, LLVMIntSLE, x, y, ""))
    ival r;
    switch (op) {
    case AJ_EXPR_LT: r = (ival){LE_(c.lo, a.hi), LT_(a.lo, c.hi)}; break;
    case AJ_EXPR_LE: r = (ival){LT_(c.lo, a.hi), LE_(a.lo, c.hi)}; break;
    case AJ_EXPR_GT: r = (ival){LE_(a.lo, c.hi), LT_(c.lo, a.hi)}; break;
    case AJ_EXPR_GE: r = (ival){LT_(a.lo, c.hi), LE_(c.lo, a.hi)}; break;
    default: {
        LLVMValueRef overlap = LLVMBuildAnd(b, LE_(a.lo, c.hi), LE_(c.lo, a.hi), "");
        LLVMValueRef eq = fl ? LLVMBuildFCmp(b, LLVMRealOEQ, a.lo, a.hi, "")
                             : LLVMBuildICmp(b, LLVMIntEQ, a.lo, a.hi, "");
        eq = LLVMBuildAnd(b, eq, fl ? LLVMBuildFCmp(b, LLVMRealOEQ, c.lo, c.hi, "")
                                    : LLVMBuildICmp(b, LLVMIntEQ, c.lo, c.hi, ""), "");
        eq = LLVMBuildAnd(b, eq, fl ? LLVMBuildFCmp(b, LLVMRealOEQ, a.lo, c.lo, "")
                                    : LLVMBuildICmp(b, LLVMIntEQ, a.lo, c.lo, ""), "");
        LLVMValueRef not_eq = LLVMBuildNot(b, eq, "");
        r = op == AJ_EXPR_EQ ? (ival){not_eq, overlap} : (ival){overlap, not_eq};
        break;
    }
    }
#undef LT_
#undef LE_
    return r;
}

static ival iv_compute(iemitter *m, uint16_t id)
{
    aj_kb *kb = m->pt.s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_expr_node *n = &m->pt.s->p->e.nodes[id];
    aj_expr_op op = (aj_expr_op)n->op;
    aj_expr_type t = (aj_expr_type)n->type;
    if (!is_positional(m, id)) {
        LLVMValueRef v = aj_score_emit_node(&m->pt, id);
        if (t == AJ_EXPR_BOOL)
            return (ival){LLVMBuildNot(b, v, ""), v};
        return (ival){v, v};
    }
    if (op == AJ_EXPR_VAR)
        return n->u.var == AJ_VAR_Q ? (ival){m->q0, m->q1} : (ival){m->k0, m->k1};
    ival x[AJ_EXPR_RANK_MAX];
    int ar = aj_expr_arity(n);
    for (int i = 0; i < ar; i++)
        x[i] = iv_node(m, n->args[i]);
    if (op == AJ_EXPR_LOAD)
        return iv_load(m, n, x);
    aj_expr_type at = (aj_expr_type)m->pt.s->p->e.nodes[n->args[0]].type;
    int fl = t == AJ_EXPR_FLOAT;
    switch (op) {
    case AJ_EXPR_TO_FLOAT:
        return (ival){LLVMBuildSIToFP(b, x[0].lo, kb->t_f32, ""),
                      LLVMBuildSIToFP(b, x[0].hi, kb->t_f32, "")};
    case AJ_EXPR_NEG:
        return fl ? (ival){LLVMBuildFNeg(b, x[0].hi, ""), LLVMBuildFNeg(b, x[0].lo, "")}
                  : (ival){LLVMBuildNeg(b, x[0].hi, ""), LLVMBuildNeg(b, x[0].lo, "")};
    case AJ_EXPR_NOT:
        return (ival){x[0].hi, x[0].lo};
    case AJ_EXPR_ADD:
        return fl ? (ival){LLVMBuildFAdd(b, x[0].lo, x[1].lo, ""),
                           LLVMBuildFAdd(b, x[0].hi, x[1].hi, "")}
                  : (ival){sat(kb, "llvm.sadd.sat", x[0].lo, x[1].lo),
                           sat(kb, "llvm.sadd.sat", x[0].hi, x[1].hi)};
    case AJ_EXPR_SUB:
        return fl ? (ival){LLVMBuildFSub(b, x[0].lo, x[1].hi, ""),
                           LLVMBuildFSub(b, x[0].hi, x[1].lo, "")}
                  : (ival){sat(kb, "llvm.ssub.sat", x[0].lo, x[1].hi),
                           sat(kb, "llvm.ssub.sat", x[0].hi, x[1].lo)};
    case AJ_EXPR_MUL:
    case AJ_EXPR_DIV: {
        /* by a point only (the other side may be the point for a product) */
        int point = !is_positional(m, n->args[1])                        ? 1
                    : op == AJ_EXPR_MUL && !is_positional(m, n->args[0]) ? 0
                                                                         : -1;
        if (point < 0)
            return iv_unknown(kb, t);
        ival r = x[1 - point];
        LLVMValueRef c = x[point].lo;
        if (op == AJ_EXPR_MUL) {
            if (!fl)
                return iv_scale_int(kb, r, c);
            LLVMValueRef a1 = LLVMBuildFMul(b, r.lo, c, ""), a2 = LLVMBuildFMul(b, r.hi, c, "");
            LLVMValueRef neg = LLVMBuildFCmp(b, LLVMRealOLT, c, aj_kb_f32(kb, 0), "");
            return (ival){sel(kb, neg, a2, a1), sel(kb, neg, a1, a2)};
        }
        if (fl) {
            LLVMValueRef a1 = LLVMBuildFDiv(b, r.lo, c, ""), a2 = LLVMBuildFDiv(b, r.hi, c, "");
            LLVMValueRef neg = LLVMBuildFCmp(b, LLVMRealOLT, c, aj_kb_f32(kb, 0), "");
            LLVMValueRef zero = LLVMBuildFCmp(b, LLVMRealUEQ, c, aj_kb_f32(kb, 0), "");
            ival u = iv_unknown(kb, t);
            return (ival){sel(kb, zero, u.lo, sel(kb, neg, a2, a1)),
                          sel(kb, zero, u.hi, sel(kb, neg, a1, a2))};
        }
        LLVMValueRef a1 = aj_score_floor_divmod(&m->pt, r.lo, c, 0), a2 = aj_score_floor_divmod(&m->pt, r.hi, c, 0);
        return (ival){aj_kb_smin(kb, a1, a2), aj_kb_smax(kb, a1, a2)};
    }
    case AJ_EXPR_MOD: {
        if (is_positional(m, n->args[1]))
            return iv_unknown(kb, t);
        LLVMValueRef c = x[1].lo;
        LLVMValueRef r0 = aj_score_floor_divmod(&m->pt, x[0].lo, c, 1),
                     r1 = aj_score_floor_divmod(&m->pt, x[0].hi, c, 1);
        /* one period at most, not wrapping: [r0, r1]; else [0, c - 1] */
        LLVMValueRef narrow = LLVMBuildAnd(
            b, LLVMBuildICmp(b, LLVMIntSLT, sat(kb, "llvm.ssub.sat", x[0].hi, x[0].lo), c, ""),
            LLVMBuildICmp(b, LLVMIntSLE, r0, r1, ""), "");
        LLVMValueRef pos = LLVMBuildICmp(b, LLVMIntSGT, c, aj_kb_i64(kb, 0), "");
        ival u = iv_unknown(kb, t);
        return (ival){
            sel(kb, pos, sel(kb, narrow, r0, aj_kb_i64(kb, 0)), u.lo),
            sel(kb, pos, sel(kb, narrow, r1, LLVMBuildSub(b, c, aj_kb_i64(kb, 1), "")), u.hi)};
    }
    case AJ_EXPR_AND:
        return (ival){LLVMBuildOr(b, x[0].lo, x[1].lo, ""), LLVMBuildAnd(b, x[0].hi, x[1].hi, "")};
    case AJ_EXPR_OR:
        return (ival){LLVMBuildAnd(b, x[0].lo, x[1].lo, ""), LLVMBuildOr(b, x[0].hi, x[1].hi, "")};
    case AJ_EXPR_LT: case AJ_EXPR_LE: case AJ_EXPR_GT: case AJ_EXPR_GE:
    case AJ_EXPR_EQ: case AJ_EXPR_NE:
        return iv_compare(kb, op, at, x[0], x[1]);
    case AJ_EXPR_SELECT: {
        /* the arm the condition must take, else the hull of both */
        ival hull;
        if (t == AJ_EXPR_BOOL)
            hull =
                (ival){LLVMBuildOr(b, x[1].lo, x[2].lo, ""), LLVMBuildOr(b, x[1].hi, x[2].hi, "")};
        else
            hull = (ival){iv_minmax(kb, t, 1, x[1], x[2]).lo, iv_minmax(kb, t, 0, x[1], x[2]).hi};
        LLVMValueRef only_t = LLVMBuildNot(b, x[0].lo, ""), only_f = LLVMBuildNot(b, x[0].hi, "");
        return (ival){sel(kb, only_t, x[1].lo, sel(kb, only_f, x[2].lo, hull.lo)),
                      sel(kb, only_t, x[1].hi, sel(kb, only_f, x[2].hi, hull.hi))};
    }
    case AJ_EXPR_MIN: return iv_minmax(kb, t, 1, x[0], x[1]);
    case AJ_EXPR_MAX: return iv_minmax(kb, t, 0, x[0], x[1]);
    case AJ_EXPR_CLAMP: return iv_minmax(kb, t, 1, iv_minmax(kb, t, 0, x[0], x[1]), x[2]);
    case AJ_EXPR_ABS: {
        if (fl) {
            LLVMValueRef alo = aj_kb_call_overloaded(kb, "llvm.fabs", &x[0].lo, 1);
            LLVMValueRef ahi = aj_kb_call_overloaded(kb, "llvm.fabs", &x[0].hi, 1);
            LLVMValueRef straddle =
                LLVMBuildAnd(b, LLVMBuildFCmp(b, LLVMRealOLT, x[0].lo, aj_kb_f32(kb, 0), ""),
                             LLVMBuildFCmp(b, LLVMRealOGT, x[0].hi, aj_kb_f32(kb, 0), ""), "");
            return (ival){sel(kb, straddle, aj_kb_f32(kb, 0), fminmax(kb, 1, alo, ahi)),
                          fminmax(kb, 0, alo, ahi)};
        }
        LLVMValueRef nonneg = LLVMBuildICmp(b, LLVMIntSGE, x[0].lo, aj_kb_i64(kb, 0), "");
        LLVMValueRef nonpos = LLVMBuildICmp(b, LLVMIntSLE, x[0].hi, aj_kb_i64(kb, 0), "");
        LLVMValueRef nlo = LLVMBuildNeg(b, x[0].lo, ""), nhi = LLVMBuildNeg(b, x[0].hi, "");
        return (ival){sel(kb, nonneg, x[0].lo, sel(kb, nonpos, nhi, aj_kb_i64(kb, 0))),
                      sel(kb, nonneg, x[0].hi, sel(kb, nonpos, nlo, aj_kb_smax(kb, nlo, x[0].hi)))};
    }
    case AJ_EXPR_FLOOR: case AJ_EXPR_EXP: case AJ_EXPR_LOG: case AJ_EXPR_TANH:
    case AJ_EXPR_SQRT:   /* monotone; an int floor is the identity */
        if (!fl)
            return x[0];
        return (ival){aj_score_emit_math(&m->pt, op, x[0].lo), aj_score_emit_math(&m->pt, op, x[0].hi)};
    default:
        return iv_unknown(kb, t);
    }
}

static ival iv_node(iemitter *m, uint16_t id)
{
    if (!m->done[id]) {
        m->memo[id] = iv_compute(m, id);
        m->done[id] = true;
    }
    return m->memo[id];
}

/* An interval emitter over rows [i0, i1] x keys [j0, j1], holding the
 * fixed rows' intervals (aj_score_fix_rows) where there are some. */
static void iemitter_init(iemitter *m, aj_score *s, LLVMValueRef i0, LLVMValueRef i1,
                          LLVMValueRef j0, LLVMValueRef j1)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    memset(m, 0, sizeof *m);
    emitter_init(&m->pt, s, 0, aj_kb_i32(kb, 0), aj_kb_i32(kb, 0), NULL);
    m->q0 = LLVMBuildAdd(b, s->q_origin, to_i64(kb, i0), "");
    m->q1 = LLVMBuildAdd(b, s->q_origin, to_i64(kb, i1), "");
    m->k0 = LLVMBuildAdd(b, s->k_origin, to_i64(kb, j0), "");
    m->k1 = LLVMBuildAdd(b, s->k_origin, to_i64(kb, j1), "");
    for (int id = 0; id < s->p->e.count; id++)
        if (s->row_lo[id] || s->col_lo[id]) {
            m->memo[id] = s->row_lo[id] ? (ival){s->row_lo[id], s->row_hi[id]}
                                        : (ival){s->col_lo[id], s->col_hi[id]};
            m->done[id] = true;
        }
}

void aj_score_fix_rows(aj_score *s, LLVMValueRef i0, LLVMValueRef i1)
{
    const aj_score_prog *p = s->p;
    if (p->rest == NONE)
        return;
    iemitter *m = score_scratch(s, SLOT_FIX_ROWS, sizeof *m);
    if (!m)
        return;
    iemitter_init(m, s, i0, i1, aj_kb_i32(s->kb, 0), aj_kb_i32(s->kb, 0));
    for (int id = 0; id < p->e.count; id++)
        if ((p->reads[id] & AJ_SCORE_READS(AJ_VAR_Q)) &&
            !(p->reads[id] & (AJ_SCORE_READS(AJ_VAR_K) | AJ_SCORE_READS(AJ_VAR_SCORE)))) {
            ival v = iv_node(m, (uint16_t)id);
            s->row_lo[id] = v.lo;
            s->row_hi[id] = v.hi;
        }
}

/* Whether node id is one of the rest's that read k and not q: fixed by
 * the keys (aj_score_fix_cols). */
static bool reads_keys_only(const aj_score_prog *p, int id)
{
    return (p->reads[id] & AJ_SCORE_READS(AJ_VAR_K)) &&
           !(p->reads[id] & (AJ_SCORE_READS(AJ_VAR_Q) | AJ_SCORE_READS(AJ_VAR_SCORE)));
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
    iemitter *m = score_scratch(s, SLOT_FIX_COLS, sizeof *m);
    if (!m)
        return;
    iemitter_init(m, s, aj_kb_i32(s->kb, 0), aj_kb_i32(s->kb, 0), j0, j1);
    for (int id = 0; p->rest != NONE && id < p->e.count; id++)
        if (reads_keys_only(p, id)) {
            ival v = iv_node(m, (uint16_t)id);
            s->col_lo[id] = v.lo;
            s->col_hi[id] = v.hi;
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
    iemitter *m = score_scratch(s, SLOT_TILE_CLASS, sizeof *m);
    if (!m) {
        *skip = *full = LLVMConstInt(s->kb->t_i1, 0, 0);
        return;
    }
    iemitter_init(m, s, i0, i1, j0, j1);
    ival r = iv_node(m, s->p->rest);
    *skip = LLVMBuildNot(b, r.hi, "");
    *full = LLVMBuildNot(b, r.lo, "");
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
