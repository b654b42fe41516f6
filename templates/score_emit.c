/*
 * score_emit.c -- a score program node as LLVM values (score_internal.h).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/attn_common.h"
#include "templates/cpu_attn.h"
#include "templates/cpu_vec.h"
#include "templates/score_internal.h"

/* ---------------------------------------------------------------- emit */


static LLVMTypeRef lane_type(emitter *m, LLVMTypeRef scalar)
{
    return m->lanes ? LLVMVectorType(scalar, (unsigned)m->lanes) : scalar;
}

static LLVMValueRef splat(emitter *m, LLVMValueRef v)
{
    if (!m->lanes)
        return v;
    LLVMBuilderRef b = m->s->kb->b;
    LLVMValueRef vec = LLVMGetPoison(LLVMVectorType(LLVMTypeOf(v), (unsigned)m->lanes));
    vec = LLVMBuildInsertElement(b, vec, v, aj_kb_i32(m->s->kb, 0), "");
    return LLVMBuildShuffleVector(b, vec, vec,
                                  LLVMConstNull(LLVMVectorType(m->s->kb->t_i32,
                                                               (unsigned)m->lanes)), "");
}

/* x / y and x % y flooring toward -inf, x / 0 == x % 0 == 0, as
 * ir/expr_eval.c (a divisor of 0 or -1 never reaches sdiv / srem). */
LLVMValueRef aj_score_floor_divmod(emitter *m, LLVMValueRef x, LLVMValueRef y, int want_mod)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMTypeRef t = LLVMTypeOf(x);
    LLVMValueRef zero = LLVMConstNull(t);
    LLVMValueRef one = splat(m, aj_kb_i64(kb, 1)), minus1 = splat(m, aj_kb_i64(kb, -1));
    LLVMValueRef y0 = LLVMBuildICmp(b, LLVMIntEQ, y, zero, "");
    LLVMValueRef ym1 = LLVMBuildICmp(b, LLVMIntEQ, y, minus1, "");
    LLVMValueRef safe = LLVMBuildSelect(b, LLVMBuildOr(b, y0, ym1, ""), one, y, "");
    LLVMValueRef q = LLVMBuildSDiv(b, x, safe, ""), r = LLVMBuildSRem(b, x, safe, "");
    LLVMValueRef adjust = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntNE, r, zero, ""),
                                       LLVMBuildXor(b, LLVMBuildICmp(b, LLVMIntSLT, r, zero, ""),
                                                    LLVMBuildICmp(b, LLVMIntSLT, safe, zero, ""),
                                                    ""), "");
    if (want_mod) {
        r = LLVMBuildSelect(b, adjust, LLVMBuildAdd(b, r, safe, ""), r, "");
        return LLVMBuildSelect(b, LLVMBuildOr(b, y0, ym1, ""), zero, r, "");
    }
    q = LLVMBuildSelect(b, adjust, LLVMBuildSub(b, q, one, ""), q, "");
    q = LLVMBuildSelect(b, ym1, LLVMBuildNeg(b, x, ""), q, "");
    return LLVMBuildSelect(b, y0, zero, q, "");
}


/* A side tensor's element at integer indices (scalar); 0 outside it.  The
 * index is clamped to element 0 before the load, so an out-of-range index
 * never touches memory past the tensor (the launch refuses empty ones). */
static LLVMValueRef load_scalar_at(aj_kb *kb, const aj_tensor_decl *d, const LLVMValueRef *idx)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef inside = LLVMConstInt(kb->t_i1, 1, 0);
    LLVMValueRef at = aj_kb_i64(kb, 0);
    char name[64];
    for (int dim = 0; dim < d->rank; dim++) {
        aj_score_param_name(name, sizeof name, d->name, 's', dim);
        LLVMValueRef size = aj_kb_param(kb, name);
        aj_score_param_name(name, sizeof name, d->name, 't', dim);
        LLVMValueRef stride = aj_kb_param(kb, name);
        inside = LLVMBuildAnd(b, inside, LLVMBuildICmp(b, LLVMIntULT, idx[dim], size, ""), "");
        at = LLVMBuildAdd(b, at, LLVMBuildMul(b, idx[dim], stride, ""), "");
    }
    at = LLVMBuildSelect(b, inside, at, aj_kb_i64(kb, 0), "");
    LLVMTypeRef et = d->dtype == AJ_SIDE_I32 ? kb->t_i32 : kb->t_f32;
    LLVMValueRef v = aj_kb_load(kb, et, aj_kb_gptr_offset(kb, aj_kb_param(kb, d->name),
                                                         LLVMBuildShl(b, at, aj_kb_i64(kb, 2),
                                                                      "")), 4);
    if (d->dtype == AJ_SIDE_I32)
        return LLVMBuildSelect(b, inside, LLVMBuildSExt(b, v, kb->t_i64, ""), aj_kb_i64(kb, 0),
                               "");
    return LLVMBuildSelect(b, inside, v, aj_kb_f32(kb, 0), "");
}

static LLVMValueRef load_scalar(emitter *m, const aj_tensor_decl *d, const LLVMValueRef *idx)
{
    return load_scalar_at(m->s->kb, d, idx);
}

LLVMValueRef aj_score_sink(aj_kb *kb, const aj_score_prog *p, LLVMValueRef h)
{
    LLVMValueRef idx[1] = {to_i64(kb, h)};
    return load_scalar_at(kb, &p->tensors[p->sinks], idx);
}

/* exp2 / log2 of an f32 scalar: the GPU targets' approximations, the
 * cpu's inline polynomial (cpu_vec.h, one lane) and LLVM's log2 */
static LLVMValueRef scalar_exp2(aj_kb *kb, LLVMValueRef x)
{
    if (kb->desc->simt)
        return aj_kb_exp2(kb, x);
    LLVMValueRef zero = aj_kb_i32(kb, 0);
    LLVMValueRef v = LLVMBuildInsertElement(kb->b, LLVMGetPoison(aj_cv_type(kb, 1)), x, zero, "");
    return LLVMBuildExtractElement(kb->b, aj_cv_exp2(kb, v, 1), zero, "");
}

static LLVMValueRef scalar_log2(aj_kb *kb, LLVMValueRef x)
{
    return kb->desc->simt ? aj_kb_log2(kb, x) : aj_kb_call_overloaded(kb, "llvm.log2", &x, 1);
}

/*
 * The merge of the row (log2 LSE l2) with the sink's partial (O = 0, LSE
 * s2 = sink log2 e), with one exp2 and one log2 (a row's epilogue pays
 * them once): with m = max(l2, s2) one of the two terms is 2^0, the other
 * e = 2^-|l2 - s2|, so L = m + log2(1 + e) and the row's weight is
 * 2^(l2 - L) = (l2 >= s2 ? 1 : e) / (1 + e).  Both -inf: L = -inf and
 * weight 0 (no NaN from -inf - -inf).
 */
static void fold_sink(aj_kb *kb, const aj_score_prog *p, LLVMValueRef h, LLVMValueRef *l2,
                      LLVMValueRef *scale, LLVMValueRef *lse)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef s2 = LLVMBuildFMul(b, aj_score_sink(kb, p, h), aj_kb_f32(kb, AJ_LOG2E), "");
    LLVMValueRef row = *l2, ninf = aj_kb_f32(kb, -INFINITY), one = aj_kb_f32(kb, 1);
    LLVMValueRef row_first = LLVMBuildFCmp(b, LLVMRealOGE, row, s2, "");
    LLVMValueRef mx = LLVMBuildSelect(b, row_first, row, s2, "");
    LLVMValueRef none = LLVMBuildFCmp(b, LLVMRealOEQ, mx, ninf, "");
    LLVMValueRef gap = LLVMBuildFSub(b, row, s2, "");
    gap = aj_kb_call_overloaded(kb, "llvm.fabs", &gap, 1);
    LLVMValueRef e = scalar_exp2(kb, LLVMBuildSelect(b, none, ninf, LLVMBuildFNeg(b, gap, ""), ""));
    LLVMValueRef sum = LLVMBuildFAdd(b, one, e, "");
    LLVMValueRef w = LLVMBuildFDiv(b, LLVMBuildSelect(b, row_first, one, e, ""), sum, "");
    LLVMValueRef merged = LLVMBuildFAdd(b, mx, scalar_log2(kb, sum), "");
    *l2 = LLVMBuildSelect(b, none, ninf, merged, "");
    *lse = LLVMBuildFMul(b, *l2, aj_kb_f32(kb, AJ_LN2), "");
    *scale = LLVMBuildFMul(b, *scale, LLVMBuildSelect(b, none, aj_kb_f32(kb, 0), w, ""), "");
}

void aj_score_fold_sink(aj_kb *kb, const aj_score_prog *p, LLVMValueRef h,
                        LLVMValueRef kv_offset, LLVMValueRef *l2, LLVMValueRef *scale,
                        LLVMValueRef *lse)
{
    if (!kv_offset) {
        fold_sink(kb, p, h, l2, scale, lse);
        return;
    }
    LLVMBuilderRef b = kb->b;
    LLVMValueRef first = LLVMBuildICmp(b, LLVMIntEQ, to_i64(kb, kv_offset), aj_kb_i64(kb, 0), "");
    LLVMValueRef f_l2 = *l2, f_scale = *scale, f_lse = *lse;
    fold_sink(kb, p, h, &f_l2, &f_scale, &f_lse);
    *l2 = LLVMBuildSelect(b, first, f_l2, *l2, "");
    *scale = LLVMBuildSelect(b, first, f_scale, *scale, "");
    *lse = LLVMBuildSelect(b, first, f_lse, *lse, "");
}

static LLVMValueRef emit_load(emitter *m, const aj_expr_node *n)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_tensor_decl *d = &m->s->p->tensors[n->u.tensor];
    LLVMValueRef idx[AJ_EXPR_RANK_MAX];
    for (int i = 0; i < d->rank; i++)
        idx[i] = aj_score_emit_node(m, n->args[i]);
    if (!m->lanes)
        return load_scalar(m, d, idx);
    /* lane by lane: side tensors are small tables, not streams */
    LLVMValueRef out = LLVMGetPoison(lane_type(m, n->type == AJ_EXPR_INT ? kb->t_i64
                                                                         : kb->t_f32));
    for (int l = 0; l < m->lanes; l++) {
        LLVMValueRef li = aj_kb_i32(kb, l), one[AJ_EXPR_RANK_MAX];
        for (int i = 0; i < d->rank; i++)
            one[i] = LLVMBuildExtractElement(b, idx[i], li, "");
        out = LLVMBuildInsertElement(b, out, load_scalar(m, d, one), li, "");
    }
    return out;
}

/* A cpu_vec.h function on this emission's lanes; a scalar (a uniform
 * node, a tile's bounds) goes through it as a one-lane vector. */
static LLVMValueRef host_math(emitter *m, LLVMValueRef (*fn)(aj_kb *, LLVMValueRef, int),
                              LLVMValueRef x)
{
    aj_kb *kb = m->s->kb;
    if (m->lanes)
        return fn(kb, x, m->lanes);
    LLVMValueRef zero = aj_kb_i32(kb, 0);
    LLVMValueRef v = LLVMBuildInsertElement(kb->b, LLVMGetPoison(aj_cv_type(kb, 1)), x, zero, "");
    return LLVMBuildExtractElement(kb->b, fn(kb, v, 1), zero, "");
}

/* exp, log, tanh: the cpu kernels' own (on the cpu target, for vectors
 * and scalars alike: a kernel of scalar code there, the block-mask
 * builder, computes what the vector kernels do), else the GPU targets'
 * intrinsics; sqrt and floor are LLVM's everywhere. */
LLVMValueRef aj_score_emit_math(emitter *m, aj_expr_op op, LLVMValueRef a)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    bool host = m->s->lanes > 0 || !kb->desc->simt;
    LLVMValueRef log2e = splat(m, aj_kb_f32(kb, AJ_LOG2E)), ln2 = splat(m, aj_kb_f32(kb, AJ_LN2));
    switch (op) {
    case AJ_EXPR_EXP: {
        LLVMValueRef x = LLVMBuildFMul(b, a, log2e, "");
        return host ? host_math(m, aj_cv_exp2, x) : aj_kb_exp2(kb, x);
    }
    case AJ_EXPR_LOG: {
        LLVMValueRef l2 = host ? aj_kb_call_overloaded(kb, "llvm.log2", &a, 1) : aj_kb_log2(kb, a);
        return LLVMBuildFMul(b, l2, ln2, "");
    }
    case AJ_EXPR_TANH:
        return host ? host_math(m, aj_cv_tanh, a) : aj_attn_tanh(kb, a);
    case AJ_EXPR_SQRT:
        return aj_kb_call_overloaded(kb, "llvm.sqrt", &a, 1);
    default:   /* floor */
        return aj_kb_call_overloaded(kb, "llvm.floor", &a, 1);
    }
}

/* min / max / clamp as the evaluator picks: b where b < a (b > a) or a is
 * NaN (for ints, the plain comparison). */
static LLVMValueRef pick(emitter *m, aj_expr_type t, int is_min, LLVMValueRef a, LLVMValueRef b_)
{
    LLVMBuilderRef b = m->s->kb->b;
    LLVMValueRef take_b;
    if (t == AJ_EXPR_FLOAT)
        take_b = LLVMBuildOr(b, LLVMBuildFCmp(b, is_min ? LLVMRealOLT : LLVMRealOGT, b_, a, ""),
                             LLVMBuildFCmp(b, LLVMRealUNO, a, a, ""), "");
    else
        take_b = LLVMBuildICmp(b, is_min ? LLVMIntSLT : LLVMIntSGT, b_, a, "");
    return LLVMBuildSelect(b, take_b, b_, a, "");
}

static LLVMValueRef emit_compare(emitter *m, aj_expr_op op, aj_expr_type t, LLVMValueRef a,
                                 LLVMValueRef c)
{
    LLVMBuilderRef b = m->s->kb->b;
    if (t == AJ_EXPR_FLOAT) {
        LLVMRealPredicate pr = op == AJ_EXPR_LT ? LLVMRealOLT : op == AJ_EXPR_LE ? LLVMRealOLE
                             : op == AJ_EXPR_GT ? LLVMRealOGT : op == AJ_EXPR_GE ? LLVMRealOGE
                             : op == AJ_EXPR_EQ ? LLVMRealOEQ : LLVMRealUNE;
        return LLVMBuildFCmp(b, pr, a, c, "");
    }
    /* bools compare as 0 < 1, unsigned */
    int u = t == AJ_EXPR_BOOL;
    LLVMIntPredicate pr = op == AJ_EXPR_LT ? (u ? LLVMIntULT : LLVMIntSLT)
                        : op == AJ_EXPR_LE ? (u ? LLVMIntULE : LLVMIntSLE)
                        : op == AJ_EXPR_GT ? (u ? LLVMIntUGT : LLVMIntSGT)
                        : op == AJ_EXPR_GE ? (u ? LLVMIntUGE : LLVMIntSGE)
                        : op == AJ_EXPR_EQ ? LLVMIntEQ : LLVMIntNE;
    return LLVMBuildICmp(b, pr, a, c, "");
}

static LLVMValueRef emit_leaf(emitter *m, const aj_expr_node *n)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    aj_score *s = m->s;
    if (n->op == AJ_EXPR_LIT) {
        if (n->type == AJ_EXPR_FLOAT)
            return splat(m, aj_kb_f32(kb, (float)n->u.f));
        if (n->type == AJ_EXPR_BOOL)
            return splat(m, LLVMConstInt(kb->t_i1, n->u.i != 0, 0));
        return splat(m, aj_kb_i64(kb, n->u.i));
    }
    switch (n->u.var) {
    case AJ_VAR_B: return splat(m, s->b);
    case AJ_VAR_H: return splat(m, s->h);
    case AJ_VAR_SQ: return splat(m, s->sq);
    case AJ_VAR_SK: return splat(m, s->sk);
    case AJ_VAR_Q:
        return splat(m, LLVMBuildAdd(b, s->q_origin, LLVMBuildSExt(b, m->i, kb->t_i64, ""), ""));
    case AJ_VAR_K: {
        LLVMValueRef j = LLVMBuildSExt(b, m->j, lane_type(m, kb->t_i64), "");
        return LLVMBuildAdd(b, splat(m, s->k_origin), j, "");
    }
    default:
        return m->score;
    }
}

LLVMValueRef aj_score_emit_node(emitter *m, uint16_t id)
{
    if (!m->memo[id] && m->s->loads[id])
        m->memo[id] = splat(m, m->s->loads[id]);
    if (m->memo[id])
        return m->memo[id];
    if (m->lanes &&
        !(m->s->p->reads[id] & (AJ_SCORE_READS(AJ_VAR_K) | AJ_SCORE_READS(AJ_VAR_SCORE)))) {
        int lanes = m->lanes;
        m->lanes = 0;
        m->memo = m->umemo;
        LLVMValueRef v = aj_score_emit_node(m, id);
        m->lanes = lanes;
        m->memo = m->vmemo;
        m->memo[id] = splat(m, v);
        return m->memo[id];
    }
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_expr_node *n = &m->s->p->e.nodes[id];
    aj_expr_op op = (aj_expr_op)n->op;
    aj_expr_type t = (aj_expr_type)n->type;
    LLVMValueRef v = NULL, x[3] = {NULL, NULL, NULL};
    if (op == AJ_EXPR_LIT || op == AJ_EXPR_VAR) {
        v = emit_leaf(m, n);
    } else if (op == AJ_EXPR_LOAD) {
        v = emit_load(m, n);
    } else {
        for (int i = 0; i < aj_expr_arity(n); i++)
            x[i] = aj_score_emit_node(m, n->args[i]);
        aj_expr_type at = (aj_expr_type)m->s->p->e.nodes[n->args[0]].type;
        int fl = t == AJ_EXPR_FLOAT;
        switch (op) {
        case AJ_EXPR_TO_FLOAT: v = LLVMBuildSIToFP(b, x[0], lane_type(m, kb->t_f32), ""); break;
        case AJ_EXPR_NEG: v = fl ? LLVMBuildFNeg(b, x[0], "") : LLVMBuildNeg(b, x[0], ""); break;
        case AJ_EXPR_NOT: v = LLVMBuildNot(b, x[0], ""); break;
        case AJ_EXPR_ADD:
            v = fl ? LLVMBuildFAdd(b, x[0], x[1], "") : LLVMBuildAdd(b, x[0], x[1], "");
            break;
        case AJ_EXPR_SUB:
            v = fl ? LLVMBuildFSub(b, x[0], x[1], "") : LLVMBuildSub(b, x[0], x[1], "");
            break;
        case AJ_EXPR_MUL:
            v = fl ? LLVMBuildFMul(b, x[0], x[1], "") : LLVMBuildMul(b, x[0], x[1], "");
            break;
        case AJ_EXPR_DIV:
            v = fl ? LLVMBuildFDiv(b, x[0], x[1], "") : aj_score_floor_divmod(m, x[0], x[1], 0);
            break;
        case AJ_EXPR_MOD: v = aj_score_floor_divmod(m, x[0], x[1], 1); break;
        case AJ_EXPR_AND: v = LLVMBuildAnd(b, x[0], x[1], ""); break;
        case AJ_EXPR_OR: v = LLVMBuildOr(b, x[0], x[1], ""); break;
        case AJ_EXPR_LT: case AJ_EXPR_LE: case AJ_EXPR_GT: case AJ_EXPR_GE:
        case AJ_EXPR_EQ: case AJ_EXPR_NE:
            v = emit_compare(m, op, at, x[0], x[1]);
            break;
        case AJ_EXPR_SELECT: v = LLVMBuildSelect(b, x[0], x[1], x[2], ""); break;
        case AJ_EXPR_MIN: v = pick(m, t, 1, x[0], x[1]); break;
        case AJ_EXPR_MAX: v = pick(m, t, 0, x[0], x[1]); break;
        case AJ_EXPR_CLAMP: v = pick(m, t, 1, pick(m, t, 0, x[0], x[1]), x[2]); break;
        case AJ_EXPR_ABS:
            v = fl ? aj_kb_call_overloaded(kb, "llvm.fabs", x, 1)
                   : LLVMBuildSelect(
                         b, LLVMBuildICmp(b, LLVMIntSLT, x[0], LLVMConstNull(LLVMTypeOf(x[0])), ""),
                         LLVMBuildNeg(b, x[0], ""), x[0], "");
            break;
        case AJ_EXPR_FLOOR: v = fl ? aj_score_emit_math(m, op, x[0]) : x[0]; break;
        default: v = aj_score_emit_math(m, op, x[0]); break;
        }
    }
    m->memo[id] = v;
    return v;
}


static LLVMValueRef clamp_to_i32(aj_kb *kb, LLVMValueRef v64)
{
    v64 = aj_kb_smin(kb, v64, aj_kb_i64(kb, OFFSET_CLAMP));
    v64 = aj_kb_smax(kb, v64, aj_kb_i64(kb, -OFFSET_CLAMP));
    return LLVMBuildTrunc(kb->b, v64, kb->t_i32, "");
}


void aj_score_begin(aj_score *s, aj_kb *kb, const aj_score_prog *p, int lanes, LLVMValueRef b,
                    LLVMValueRef h, LLVMValueRef q_origin, LLVMValueRef k_origin,
                    LLVMValueRef sq, LLVMValueRef sk)
{
    memset(s, 0, sizeof *s);
    s->kb = kb;
    s->p = p;
    s->lanes = lanes;
    s->b = to_i64(kb, b);
    s->h_local = s->h = to_i64(kb, h);
    if (p->reads_h)
        s->h = LLVMBuildAdd(kb->b, s->h_local, to_i64(kb, aj_param(kb, AJ_PID(head_offset))),
                            "h_global");
    s->q_origin = q_origin;
    s->k_origin = k_origin;
    s->sq = sq ? sq : aj_kb_i64(kb, 0);
    s->sk = sk ? sk : aj_kb_i64(kb, 0);
    /* the band's bounds read no position: one scalar emission per CTA */
    emitter *m = score_scratch(s, SLOT_BAND, sizeof *m);
    if (!m)
        return;
    emitter_init(m, s, 0, aj_kb_i32(kb, 0), aj_kb_i32(kb, 0), NULL);
    LLVMValueRef delta = LLVMBuildSub(kb->b, q_origin, k_origin, "delta");
    if (p->band_hi != NONE)
        s->hi_off = clamp_to_i32(kb, LLVMBuildAdd(kb->b, delta, aj_score_emit_node(m, p->band_hi), ""));
    if (p->band_lo != NONE)
        s->lo_off = clamp_to_i32(kb, LLVMBuildAdd(kb->b, delta, aj_score_emit_node(m, p->band_lo), ""));
    /* loads that stay the same over the CTA's tiles, read here once: no
     * key loop then keeps their addresses and bounds live */
    for (int id = 0; id < p->e.count; id++)
        if (node(p, id)->op == AJ_EXPR_LOAD &&
            !(p->reads[id] & (AJ_SCORE_READS_POSITION | AJ_SCORE_READS(AJ_VAR_SCORE))))
            s->loads[id] = aj_score_emit_node(m, id);
    if (p->block_mask) {
        LLVMBuilderRef bd = kb->b;
        s->mask_classes = aj_param(kb, AJ_PID(block_mask));
        s->mask_plane = LLVMBuildAdd(
            bd, LLVMBuildMul(bd, s->b, aj_param(kb, AJ_PID(block_mask_stride_b)), ""),
            LLVMBuildMul(bd, s->h_local, aj_param(kb, AJ_PID(block_mask_stride_h)), ""),
            "mask_plane");
        s->mask_stride_m = aj_param(kb, AJ_PID(block_mask_stride_m));
        s->mask_bm = aj_param(kb, AJ_PID(block_mask_bm));
        s->mask_bn = aj_param(kb, AJ_PID(block_mask_bn));
    }
}

LLVMValueRef aj_score_mod_value(aj_score *s, LLVMValueRef score, LLVMValueRef i, LLVMValueRef j)
{
    if (s->p->mod == NONE)
        return score;
    emitter *m = score_scratch(s, SLOT_MOD, sizeof *m);
    if (!m)
        return score;
    emitter_init(m, s, s->lanes, i, j, score);
    return aj_score_emit_node(m, s->p->mod);
}

LLVMValueRef aj_score_mod_grad(aj_score *s, LLVMValueRef score, LLVMValueRef i, LLVMValueRef j,
                               LLVMValueRef *d)
{
    aj_kb *kb = s->kb;
    emitter *m = score_scratch(s, SLOT_GRAD, sizeof *m);
    if (!m) {
        *d = score;
        return score;
    }
    emitter_init(m, s, s->lanes, i, j, score);
    if (s->p->mod == NONE) {
        *d = splat(m, aj_kb_f32(kb, 1));
        return score;
    }
    LLVMValueRef v = aj_score_emit_node(m, s->p->mod);
    *d = s->p->dmod == NONE ? splat(m, aj_kb_f32(kb, 1)) : aj_score_emit_node(m, s->p->dmod);
    return v;
}

LLVMValueRef aj_score_visible_rest(aj_score *s, LLVMValueRef i, LLVMValueRef j)
{
    emitter *m = score_scratch(s, SLOT_REST, sizeof *m);
    if (!m)
        return LLVMConstInt(s->kb->t_i1, 1, 0);
    emitter_init(m, s, s->lanes, i, j, NULL);
    if (s->p->rest == NONE)
        return splat(m, LLVMConstInt(s->kb->t_i1, 1, 0));
    return aj_score_emit_node(m, s->p->rest);
}

LLVMValueRef aj_score_visible(aj_score *s, LLVMValueRef i, LLVMValueRef j)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    emitter *m = score_scratch(s, SLOT_VISIBLE, sizeof *m);
    if (!m)
        return LLVMConstInt(kb->t_i1, 1, 0);
    emitter_init(m, s, s->lanes, i, j, NULL);
    LLVMValueRef vis = aj_score_visible_rest(s, i, j);
    if (s->hi_off)
        vis = LLVMBuildAnd(b, vis, LLVMBuildICmp(b, LLVMIntSLE, j,
                                                 splat(m, LLVMBuildAdd(b, i, s->hi_off, "")),
                                                 ""), "");
    if (s->lo_off)
        vis = LLVMBuildAnd(b, vis, LLVMBuildICmp(b, LLVMIntSGE, j,
                                                 splat(m, LLVMBuildAdd(b, i, s->lo_off, "")),
                                                 ""), "");
    return vis;
}

LLVMValueRef aj_score_visible_in_tile(aj_score *s, int full, LLVMValueRef seq_q,
                                      LLVMValueRef seq_k, LLVMValueRef i, LLVMValueRef j)
{
    LLVMBuilderRef b = s->kb->b;
    if (full)
        return LLVMConstInt(s->kb->t_i1, 1, 0);
    LLVMValueRef hi = aj_score_row_hi(s, seq_k, i);
    if (seq_q)   /* a row past the query length: no key at or below -1 */
        hi = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, i, seq_q, ""), hi,
                             aj_kb_i32(s->kb, -1), "");
    LLVMValueRef vis = LLVMBuildICmp(b, LLVMIntSLE, j, hi, "");
    if (s->lo_off)
        vis = LLVMBuildAnd(b, vis, LLVMBuildICmp(b, LLVMIntSGE, j, aj_score_row_lo(s, i), ""),
                           "");
    if (aj_score_has_rest(s->p))
        vis = LLVMBuildAnd(b, vis, aj_score_visible_rest(s, i, j), "");
    return vis;
}

void aj_score_by_tile_class(aj_kb *kb, LLVMValueRef cls, LLVMValueRef inside,
                            aj_score_tile_body body, void *user)
{
    if (!cls) {
        body(user, 0);
        return;
    }
    LLVMBuilderRef b = kb->b;
    aj_kb_if_begin(kb, LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntEQ, cls,
                                                     aj_kb_i32(kb, AJ_TILE_FULL), ""),
                                    inside, "full"));
    body(user, 1);
    aj_kb_else(kb);
    body(user, 0);
    aj_kb_if_end(kb);
}

void aj_score_key_range(aj_score *s, LLVMValueRef i0, LLVMValueRef i1, LLVMValueRef seq_k,
                        LLVMValueRef *j_lo, LLVMValueRef *j_hi)
{
    *j_lo = aj_score_row_lo(s, i0);
    *j_hi = aj_score_row_hi(s, seq_k, i1);
}

void aj_score_row_range(aj_score *s, LLVMValueRef j0, LLVMValueRef j1, LLVMValueRef seq_q,
                        LLVMValueRef *i_lo, LLVMValueRef *i_hi)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    /* j <= i + hi_off  <=>  i >= j - hi_off;  j >= i + lo_off  <=>  i <= j - lo_off */
    LLVMValueRef lo = aj_kb_i32(kb, 0), hi = LLVMBuildSub(b, seq_q, aj_kb_i32(kb, 1), "");
    if (s->hi_off)
        lo = aj_kb_smax(kb, lo, LLVMBuildSub(b, j0, s->hi_off, ""));
    if (s->lo_off)
        hi = aj_kb_smin(kb, hi, LLVMBuildSub(b, j1, s->lo_off, ""));
    *i_lo = lo;
    *i_hi = hi;
}
