/*
 * score_ival.c -- the interval rules over a value domain with two
 * backends (score_internal.h): emitted LLVM values for the kernels
 * (score_tiles.c) and host scalars for the ring and the block-mask checks
 * (score_host.c).  One set of rules, so a kernel and the host cannot class
 * a tile differently.
 *
 * Every int or float node gets [lo, hi], every bool node (may be false,
 * may be true).  A node that reads nothing positional is a point (its
 * value, by the backend).  Where a rule cannot bound a node it is
 * unknown: ints [-2^62, 2^62] (sums saturate), floats [-inf, inf]; a float
 * bound that is NaN makes every comparison with it "may be either".
 */
#include <math.h>
#include <string.h>

#include "templates/score_internal.h"

/* ---------------------------------------------------------------- domain */

/* The domain's operations: one body per operation, the IR backend (c->kb)
 * emitting what the host backend computes. */

static dval d_int(ival_ctx *c, int64_t v)
{
    return c->kb ? (dval){.v = aj_kb_i64(c->kb, v)} : (dval){.i = v};
}

static dval d_flt(ival_ctx *c, float v)
{
    return c->kb ? (dval){.v = aj_kb_f32(c->kb, v)} : (dval){.f = v};
}

static dval d_bool(ival_ctx *c, bool v)
{
    return c->kb ? (dval){.v = LLVMConstInt(c->kb->t_i1, v, 0)} : (dval){.b = v};
}

static dval d_sel(ival_ctx *c, dval cond, dval a, dval b)
{
    if (c->kb)
        return (dval){.v = LLVMBuildSelect(c->kb->b, cond.v, a.v, b.v, "")};
    return cond.b ? a : b;
}

static dval d_icmp(ival_ctx *c, LLVMIntPredicate pr, dval a, dval b)
{
    if (c->kb)
        return (dval){.v = LLVMBuildICmp(c->kb->b, pr, a.v, b.v, "")};
    switch (pr) {
    case LLVMIntSLT: return (dval){.b = a.i < b.i};
    case LLVMIntSLE: return (dval){.b = a.i <= b.i};
    case LLVMIntSGT: return (dval){.b = a.i > b.i};
    case LLVMIntSGE: return (dval){.b = a.i >= b.i};
    case LLVMIntNE: return (dval){.b = a.i != b.i};
    default: return (dval){.b = a.i == b.i};
    }
}

static dval d_fcmp(ival_ctx *c, LLVMRealPredicate pr, dval a, dval b)
{
    if (c->kb)
        return (dval){.v = LLVMBuildFCmp(c->kb->b, pr, a.v, b.v, "")};
    bool nan = isnan(a.f) || isnan(b.f);
    switch (pr) {
    case LLVMRealULT: return (dval){.b = nan || a.f < b.f};
    case LLVMRealULE: return (dval){.b = nan || a.f <= b.f};
    case LLVMRealUEQ: return (dval){.b = nan || a.f == b.f};
    case LLVMRealOLT: return (dval){.b = a.f < b.f};
    case LLVMRealOGT: return (dval){.b = a.f > b.f};
    default: return (dval){.b = a.f == b.f};   /* OEQ */
    }
}

static dval d_and(ival_ctx *c, dval a, dval b)
{
    return c->kb ? (dval){.v = LLVMBuildAnd(c->kb->b, a.v, b.v, "")} : (dval){.b = a.b && b.b};
}

static dval d_or(ival_ctx *c, dval a, dval b)
{
    return c->kb ? (dval){.v = LLVMBuildOr(c->kb->b, a.v, b.v, "")} : (dval){.b = a.b || b.b};
}

static dval d_not(ival_ctx *c, dval a)
{
    return c->kb ? (dval){.v = LLVMBuildNot(c->kb->b, a.v, "")} : (dval){.b = !a.b};
}

/* ints wrap as the IR's do */
static dval d_mul(ival_ctx *c, dval a, dval b)
{
    return c->kb ? (dval){.v = LLVMBuildMul(c->kb->b, a.v, b.v, "")}
                 : (dval){.i = (int64_t)((uint64_t)a.i * (uint64_t)b.i)};
}

static dval d_sub(ival_ctx *c, dval a, dval b)
{
    return c->kb ? (dval){.v = LLVMBuildSub(c->kb->b, a.v, b.v, "")}
                 : (dval){.i = (int64_t)((uint64_t)a.i - (uint64_t)b.i)};
}

static dval d_neg(ival_ctx *c, dval a)
{
    return c->kb ? (dval){.v = LLVMBuildNeg(c->kb->b, a.v, "")}
                 : (dval){.i = (int64_t)(0 - (uint64_t)a.i)};
}

static dval d_smin(ival_ctx *c, dval a, dval b)
{
    return c->kb ? (dval){.v = aj_kb_smin(c->kb, a.v, b.v)} : (dval){.i = a.i < b.i ? a.i : b.i};
}

static dval d_smax(ival_ctx *c, dval a, dval b)
{
    return c->kb ? (dval){.v = aj_kb_smax(c->kb, a.v, b.v)} : (dval){.i = a.i > b.i ? a.i : b.i};
}

/* a + b or a - b, saturated to the unknown int's bounds */
static dval d_sat(ival_ctx *c, int sub, dval a, dval b)
{
    if (!c->kb) {
        __int128 v = sub ? (__int128)a.i - b.i : (__int128)a.i + b.i;
        return (dval){.i = v > UNKNOWN_INT ? UNKNOWN_INT : v < -UNKNOWN_INT ? -UNKNOWN_INT
                                                                            : (int64_t)v};
    }
    aj_kb *kb = c->kb;
    LLVMValueRef args[2] = {a.v, b.v};
    LLVMValueRef v = aj_kb_call_overloaded(kb, sub ? "llvm.ssub.sat" : "llvm.sadd.sat", args, 2);
    v = aj_kb_smin(kb, v, aj_kb_i64(kb, UNKNOWN_INT));
    return (dval){.v = aj_kb_smax(kb, v, aj_kb_i64(kb, -UNKNOWN_INT))};
}

/* min or max ignoring a NaN (llvm.minnum, fminf) */
static dval d_fminmax(ival_ctx *c, int is_min, dval a, dval b)
{
    if (!c->kb)
        return (dval){.f = is_min ? fminf(a.f, b.f) : fmaxf(a.f, b.f)};
    LLVMValueRef args[2] = {a.v, b.v};
    return (dval){.v = aj_kb_call_overloaded(c->kb, is_min ? "llvm.minnum" : "llvm.maxnum",
                                             args, 2)};
}

static dval d_farith(ival_ctx *c, aj_expr_op op, dval a, dval b)
{
    if (c->kb) {
        LLVMBuilderRef bd = c->kb->b;
        return (dval){.v = op == AJ_EXPR_ADD   ? LLVMBuildFAdd(bd, a.v, b.v, "")
                           : op == AJ_EXPR_SUB ? LLVMBuildFSub(bd, a.v, b.v, "")
                           : op == AJ_EXPR_MUL ? LLVMBuildFMul(bd, a.v, b.v, "")
                                               : LLVMBuildFDiv(bd, a.v, b.v, "")};
    }
    return (dval){.f = op == AJ_EXPR_ADD   ? a.f + b.f
                       : op == AJ_EXPR_SUB ? a.f - b.f
                       : op == AJ_EXPR_MUL ? a.f * b.f
                                           : a.f / b.f};
}

static dval d_fneg(ival_ctx *c, dval a)
{
    return c->kb ? (dval){.v = LLVMBuildFNeg(c->kb->b, a.v, "")} : (dval){.f = -a.f};
}

static dval d_fabs(ival_ctx *c, dval a)
{
    return c->kb ? (dval){.v = aj_kb_call_overloaded(c->kb, "llvm.fabs", &a.v, 1)}
                 : (dval){.f = fabsf(a.f)};
}

static dval d_to_float(ival_ctx *c, dval a)
{
    return c->kb ? (dval){.v = LLVMBuildSIToFP(c->kb->b, a.v, c->kb->t_f32, "")}
                 : (dval){.f = (float)a.i};
}

/* floor division (want_mod: the remainder), 0 by 0, -a by -1 (mod 0) */
static dval d_divmod(ival_ctx *c, dval a, dval d, int want_mod)
{
    if (c->kb)
        return (dval){.v = aj_score_floor_divmod(c->pt, a.v, d.v, want_mod)};
    if (d.i == 0 || (d.i == -1 && want_mod))
        return (dval){.i = 0};
    if (d.i == -1)
        return (dval){.i = (int64_t)(0 - (uint64_t)a.i)};
    int64_t q = a.i / d.i, r = a.i % d.i;
    if (r != 0 && (r < 0) != (d.i < 0))
        q--, r += d.i;
    return (dval){.i = want_mod ? r : q};
}

/* floor, exp, log, tanh, sqrt, exp2, log2, sigmoid, erf of a float (each
 * monotone) */
static dval d_math(ival_ctx *c, aj_expr_op op, dval a)
{
    if (c->kb)
        return (dval){.v = aj_score_emit_math(c->pt, op, a.v)};
    switch (op) {
    case AJ_EXPR_FLOOR: return (dval){.f = floorf(a.f)};
    case AJ_EXPR_EXP: return (dval){.f = expf(a.f)};
    case AJ_EXPR_LOG: return (dval){.f = logf(a.f)};
    case AJ_EXPR_TANH: return (dval){.f = tanhf(a.f)};
    case AJ_EXPR_EXP2: return (dval){.f = exp2f(a.f)};
    case AJ_EXPR_LOG2: return (dval){.f = log2f(a.f)};
    case AJ_EXPR_SIGMOID: return (dval){.f = 1.0f / (1.0f + expf(-a.f))};
    case AJ_EXPR_ERF: return (dval){.f = erff(a.f)};
    default: return (dval){.f = sqrtf(a.f)};
    }
}

/* 2^s for 0 <= s <= 62 */
static dval d_pow2(ival_ctx *c, dval s)
{
    return c->kb ? (dval){.v = LLVMBuildShl(c->kb->b, aj_kb_i64(c->kb, 1), s.v, "")}
                 : (dval){.i = INT64_C(1) << s.i};
}

/* ---------------------------------------------------------------- rules */

ival aj_ival_unknown(ival_ctx *c, aj_expr_type t)
{
    if (t == AJ_EXPR_FLOAT)
        return (ival){d_flt(c, -INFINITY), d_flt(c, INFINITY)};
    if (t == AJ_EXPR_BOOL)
        return (ival){d_bool(c, 1), d_bool(c, 1)};
    return (ival){d_int(c, -UNKNOWN_INT), d_int(c, UNKNOWN_INT)};
}

bool aj_ival_by_positions(const aj_score_prog *p, const aj_expr_node *n)
{
    bool positional[2] = {false, false};
    for (int i = 0; i < 2 && i < aj_expr_arity(n); i++)
        positional[i] = (p->reads[n->args[i]] & AJ_SCORE_READS_POSITION) != 0;
    switch ((aj_expr_op)n->op) {
    case AJ_EXPR_MOD: case AJ_EXPR_DIV: case AJ_EXPR_SHL: case AJ_EXPR_SHR:
        return !positional[1];   /* by a point: product(), modulo(), shift() */
    case AJ_EXPR_MUL:
        return !(positional[0] && positional[1]);
    case AJ_EXPR_LOAD:   /* data */
    case AJ_EXPR_BIT_NOT: case AJ_EXPR_BIT_AND: case AJ_EXPR_BIT_OR: case AJ_EXPR_BIT_XOR:
    case AJ_EXPR_SIN: case AJ_EXPR_COS: case AJ_EXPR_TAN: case AJ_EXPR_POW:
        return false;   /* compute() has no rule: unknown */
    default:
        return true;
    }
}

/* Whether a node's tree reads what makes it a range. */
static bool is_positional(const ival_ctx *c, uint16_t id)
{
    return c->p->reads[id] & c->positional;
}

/* x * k for a point k, either order of the bounds; unknown on overflow */
static ival scale_int(ival_ctx *c, ival x, dval k)
{
    dval a1 = d_mul(c, x.lo, k), a2 = d_mul(c, x.hi, k);
    /* bounds and k within 2^31 keep the products exact */
    dval lim = d_int(c, INT64_C(1) << 31), nlim = d_int(c, -(INT64_C(1) << 31));
    dval small = d_and(c, d_icmp(c, LLVMIntSLT, x.hi, lim), d_icmp(c, LLVMIntSGT, x.lo, nlim));
    small = d_and(c, small, d_and(c, d_icmp(c, LLVMIntSLT, k, lim),
                                  d_icmp(c, LLVMIntSGT, k, nlim)));
    ival u = aj_ival_unknown(c, AJ_EXPR_INT);
    return (ival){d_sel(c, small, d_smin(c, a1, a2), u.lo),
                  d_sel(c, small, d_smax(c, a1, a2), u.hi)};
}

static ival minmax(ival_ctx *c, aj_expr_type t, int is_min, ival a, ival b)
{
    if (t == AJ_EXPR_FLOAT)
        return (ival){d_fminmax(c, is_min, a.lo, b.lo), d_fminmax(c, is_min, a.hi, b.hi)};
    return is_min ? (ival){d_smin(c, a.lo, b.lo), d_smin(c, a.hi, b.hi)}
                  : (ival){d_smax(c, a.lo, b.lo), d_smax(c, a.hi, b.hi)};
}

/* x < y, x <= y on a type: floats unordered (a NaN bound: may be either) */
static dval lt(ival_ctx *c, int fl, dval x, dval y)
{
    return fl ? d_fcmp(c, LLVMRealULT, x, y) : d_icmp(c, LLVMIntSLT, x, y);
}

static dval le(ival_ctx *c, int fl, dval x, dval y)
{
    return fl ? d_fcmp(c, LLVMRealULE, x, y) : d_icmp(c, LLVMIntSLE, x, y);
}

static dval eq(ival_ctx *c, int fl, dval x, dval y)
{
    return fl ? d_fcmp(c, LLVMRealOEQ, x, y) : d_icmp(c, LLVMIntEQ, x, y);
}

static ival compare(ival_ctx *c, aj_expr_op op, aj_expr_type t, ival a, ival b)
{
    if (t == AJ_EXPR_BOOL) {
        if (op != AJ_EXPR_EQ && op != AJ_EXPR_NE)
            return aj_ival_unknown(c, AJ_EXPR_BOOL);
        dval same = d_or(c, d_and(c, a.hi, b.hi), d_and(c, a.lo, b.lo));
        dval diff = d_or(c, d_and(c, a.hi, b.lo), d_and(c, a.lo, b.hi));
        return op == AJ_EXPR_EQ ? (ival){diff, same} : (ival){same, diff};
    }
    int fl = t == AJ_EXPR_FLOAT;
    switch (op) {
    case AJ_EXPR_LT: return (ival){le(c, fl, b.lo, a.hi), lt(c, fl, a.lo, b.hi)};
    case AJ_EXPR_LE: return (ival){lt(c, fl, b.lo, a.hi), le(c, fl, a.lo, b.hi)};
    case AJ_EXPR_GT: return (ival){le(c, fl, a.lo, b.hi), lt(c, fl, b.lo, a.hi)};
    case AJ_EXPR_GE: return (ival){lt(c, fl, a.lo, b.hi), le(c, fl, b.lo, a.hi)};
    default: {
        dval overlap = d_and(c, le(c, fl, a.lo, b.hi), le(c, fl, b.lo, a.hi));
        dval same = eq(c, fl, a.lo, a.hi);
        same = d_and(c, same, eq(c, fl, b.lo, b.hi));
        same = d_and(c, same, eq(c, fl, a.lo, b.lo));
        dval differ = d_not(c, same);
        return op == AJ_EXPR_EQ ? (ival){differ, overlap} : (ival){overlap, differ};
    }
    }
}

/* a * k, a / k for a point k (the other side may be the point for a product) */
static ival product(ival_ctx *c, const aj_expr_node *n, const ival *x)
{
    aj_expr_op op = (aj_expr_op)n->op;
    aj_expr_type t = (aj_expr_type)n->type;
    int point = !is_positional(c, n->args[1])                        ? 1
                : op == AJ_EXPR_MUL && !is_positional(c, n->args[0]) ? 0
                                                                     : -1;
    if (point < 0)
        return aj_ival_unknown(c, t);
    ival r = x[1 - point];
    dval k = x[point].lo;
    if (t != AJ_EXPR_FLOAT) {
        if (op == AJ_EXPR_MUL)
            return scale_int(c, r, k);
        dval a1 = d_divmod(c, r.lo, k, 0), a2 = d_divmod(c, r.hi, k, 0);
        return (ival){d_smin(c, a1, a2), d_smax(c, a1, a2)};
    }
    dval a1 = d_farith(c, op, r.lo, k), a2 = d_farith(c, op, r.hi, k);
    dval neg = d_fcmp(c, LLVMRealOLT, k, d_flt(c, 0));
    if (op == AJ_EXPR_MUL)
        return (ival){d_sel(c, neg, a2, a1), d_sel(c, neg, a1, a2)};
    dval zero = d_fcmp(c, LLVMRealUEQ, k, d_flt(c, 0));
    ival u = aj_ival_unknown(c, t);
    return (ival){d_sel(c, zero, u.lo, d_sel(c, neg, a2, a1)),
                  d_sel(c, zero, u.hi, d_sel(c, neg, a1, a2))};
}

static ival modulo(ival_ctx *c, const aj_expr_node *n, const ival *x)
{
    aj_expr_type t = (aj_expr_type)n->type;
    if (is_positional(c, n->args[1]))
        return aj_ival_unknown(c, t);
    dval k = x[1].lo;
    dval r0 = d_divmod(c, x[0].lo, k, 1), r1 = d_divmod(c, x[0].hi, k, 1);
    /* one period at most, not wrapping: [r0, r1]; else [0, k - 1] */
    dval narrow = d_and(c, d_icmp(c, LLVMIntSLT, d_sat(c, 1, x[0].hi, x[0].lo), k),
                        d_icmp(c, LLVMIntSLE, r0, r1));
    dval pos = d_icmp(c, LLVMIntSGT, k, d_int(c, 0));
    ival u = aj_ival_unknown(c, t);
    return (ival){d_sel(c, pos, d_sel(c, narrow, r0, d_int(c, 0)), u.lo),
                  d_sel(c, pos, d_sel(c, narrow, r1, d_sub(c, k, d_int(c, 1))), u.hi)};
}

/* x << s, x >> s for a point s: a product by 2^s (0 <= s <= 30), a floor
 * division by it (0 <= s <= 62), else unknown */
static ival shift(ival_ctx *c, const aj_expr_node *n, const ival *x)
{
    ival u = aj_ival_unknown(c, AJ_EXPR_INT);
    if (is_positional(c, n->args[1]))
        return u;
    int left = n->op == AJ_EXPR_SHL;
    dval s = x[1].lo;
    dval valid = d_and(c, d_icmp(c, LLVMIntSGE, s, d_int(c, 0)),
                       d_icmp(c, LLVMIntSLE, s, d_int(c, left ? 30 : 62)));
    dval k = d_pow2(c, d_sel(c, valid, s, d_int(c, 0)));
    ival r;
    if (left) {
        r = scale_int(c, x[0], k);
    } else {
        r = (ival){d_divmod(c, x[0].lo, k, 0), d_divmod(c, x[0].hi, k, 0)};
    }
    return (ival){d_sel(c, valid, r.lo, u.lo), d_sel(c, valid, r.hi, u.hi)};
}

static ival absolute(ival_ctx *c, int fl, ival x)
{
    if (fl) {
        dval alo = d_fabs(c, x.lo), ahi = d_fabs(c, x.hi);
        dval straddle = d_and(c, d_fcmp(c, LLVMRealOLT, x.lo, d_flt(c, 0)),
                              d_fcmp(c, LLVMRealOGT, x.hi, d_flt(c, 0)));
        return (ival){d_sel(c, straddle, d_flt(c, 0), d_fminmax(c, 1, alo, ahi)),
                      d_fminmax(c, 0, alo, ahi)};
    }
    dval nonneg = d_icmp(c, LLVMIntSGE, x.lo, d_int(c, 0));
    dval nonpos = d_icmp(c, LLVMIntSLE, x.hi, d_int(c, 0));
    dval nlo = d_neg(c, x.lo), nhi = d_neg(c, x.hi);
    return (ival){d_sel(c, nonneg, x.lo, d_sel(c, nonpos, nhi, d_int(c, 0))),
                  d_sel(c, nonneg, x.hi, d_sel(c, nonpos, nlo, d_smax(c, nlo, x.hi)))};
}

/* the arm the condition must take, else the hull of both */
static ival choose(ival_ctx *c, aj_expr_type t, const ival *x)
{
    ival hull;
    if (t == AJ_EXPR_BOOL)
        hull = (ival){d_or(c, x[1].lo, x[2].lo), d_or(c, x[1].hi, x[2].hi)};
    else
        hull = (ival){minmax(c, t, 1, x[1], x[2]).lo, minmax(c, t, 0, x[1], x[2]).hi};
    dval only_t = d_not(c, x[0].lo), only_f = d_not(c, x[0].hi);
    return (ival){d_sel(c, only_t, x[1].lo, d_sel(c, only_f, x[2].lo, hull.lo)),
                  d_sel(c, only_t, x[1].hi, d_sel(c, only_f, x[2].hi, hull.hi))};
}

static ival compute(ival_ctx *c, uint16_t id)
{
    const aj_expr_node *n = node(c->p, id);
    aj_expr_op op = (aj_expr_op)n->op;
    aj_expr_type t = (aj_expr_type)n->type;
    if (!is_positional(c, id))
        return c->point(c, id);
    if (op == AJ_EXPR_VAR) {   /* q, k; b or h for any batch or head, or their ranges */
        if (n->u.var == AJ_VAR_Q || n->u.var == AJ_VAR_K)
            return n->u.var == AJ_VAR_Q ? c->q : c->k;
        if (c->bh && (n->u.var == AJ_VAR_B || n->u.var == AJ_VAR_H))
            return n->u.var == AJ_VAR_B ? c->b : c->h;
        return aj_ival_unknown(c, t);
    }
    ival x[AJ_EXPR_RANK_MAX];
    int ar = aj_expr_arity(n);
    for (int i = 0; i < ar; i++)
        x[i] = aj_ival_node(c, n->args[i]);
    if (op == AJ_EXPR_LOAD)
        return c->load(c, n, x);
    int fl = t == AJ_EXPR_FLOAT;
    switch (op) {
    case AJ_EXPR_TO_FLOAT:
        return (ival){d_to_float(c, x[0].lo), d_to_float(c, x[0].hi)};
    case AJ_EXPR_NEG:
        return fl ? (ival){d_fneg(c, x[0].hi), d_fneg(c, x[0].lo)}
                  : (ival){d_neg(c, x[0].hi), d_neg(c, x[0].lo)};
    case AJ_EXPR_NOT:
        return (ival){x[0].hi, x[0].lo};
    case AJ_EXPR_ADD:
        return fl ? (ival){d_farith(c, op, x[0].lo, x[1].lo), d_farith(c, op, x[0].hi, x[1].hi)}
                  : (ival){d_sat(c, 0, x[0].lo, x[1].lo), d_sat(c, 0, x[0].hi, x[1].hi)};
    case AJ_EXPR_SUB:
        return fl ? (ival){d_farith(c, op, x[0].lo, x[1].hi), d_farith(c, op, x[0].hi, x[1].lo)}
                  : (ival){d_sat(c, 1, x[0].lo, x[1].hi), d_sat(c, 1, x[0].hi, x[1].lo)};
    case AJ_EXPR_MUL:
    case AJ_EXPR_DIV:
        return product(c, n, x);
    case AJ_EXPR_MOD:
        return modulo(c, n, x);
    case AJ_EXPR_SHL: case AJ_EXPR_SHR:
        return shift(c, n, x);
    case AJ_EXPR_AND:
        return (ival){d_or(c, x[0].lo, x[1].lo), d_and(c, x[0].hi, x[1].hi)};
    case AJ_EXPR_OR:
        return (ival){d_and(c, x[0].lo, x[1].lo), d_or(c, x[0].hi, x[1].hi)};
    case AJ_EXPR_LT: case AJ_EXPR_LE: case AJ_EXPR_GT: case AJ_EXPR_GE:
    case AJ_EXPR_EQ: case AJ_EXPR_NE:
        return compare(c, op, (aj_expr_type)node(c->p, n->args[0])->type, x[0], x[1]);
    case AJ_EXPR_SELECT:
        return choose(c, t, x);
    case AJ_EXPR_MIN: return minmax(c, t, 1, x[0], x[1]);
    case AJ_EXPR_MAX: return minmax(c, t, 0, x[0], x[1]);
    case AJ_EXPR_CLAMP: return minmax(c, t, 1, minmax(c, t, 0, x[0], x[1]), x[2]);
    case AJ_EXPR_ABS:
        return absolute(c, fl, x[0]);
    case AJ_EXPR_FLOOR: case AJ_EXPR_EXP: case AJ_EXPR_LOG: case AJ_EXPR_TANH:
    case AJ_EXPR_SQRT: case AJ_EXPR_EXP2: case AJ_EXPR_LOG2: case AJ_EXPR_SIGMOID:
    case AJ_EXPR_ERF:   /* monotone; an int floor is the identity */
        if (!fl)
            return x[0];
        return (ival){d_math(c, op, x[0].lo), d_math(c, op, x[0].hi)};
    default:
        return aj_ival_unknown(c, t);
    }
}

ival aj_ival_node(ival_ctx *c, uint16_t id)
{
    if (!c->done[id]) {
        c->memo[id] = compute(c, id);
        c->done[id] = true;
    }
    return c->memo[id];
}
