/*
 * score_emit.c -- a score program node as LLVM values (score_internal.h).
 */
#include <assert.h>
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
/* Where indices idx (i64, or <lanes x i64>) fall in side tensor d: *at
 * the element's offset (elements) and *inside whether every index lies
 * within its size, from the tensor's size and stride parameters. */
static void element_at(aj_kb *kb, const aj_tensor_decl *d, const LLVMValueRef *idx, int lanes,
                       LLVMValueRef *inside, LLVMValueRef *at)
{
    LLVMBuilderRef b = kb->b;
#define LANES(v) (lanes ? aj_cv_splat(kb, (v), lanes) : (v))
    *inside = LANES(LLVMConstInt(kb->t_i1, 1, 0));
    *at = LANES(aj_kb_i64(kb, 0));
    char name[64];
    for (int dim = 0; dim < d->rank; dim++) {
        aj_score_param_name(name, sizeof name, d->name, 's', dim);
        LLVMValueRef size = LANES(aj_kb_param(kb, name));
        aj_score_param_name(name, sizeof name, d->name, 't', dim);
        LLVMValueRef stride = LANES(aj_kb_param(kb, name));
        *inside = LLVMBuildAnd(b, *inside, LLVMBuildICmp(b, LLVMIntULT, idx[dim], size, ""), "");
        *at = LLVMBuildAdd(b, *at, LLVMBuildMul(b, idx[dim], stride, ""), "");
    }
#undef LANES
}

/* The storage type of a side tensor's elements (i32, f32, or i16 for
 * the 16-bit floats). */
LLVMTypeRef aj_score_side_storage(aj_kb *kb, const aj_tensor_decl *d)
{
    switch (d->dtype) {
    case AJ_SIDE_I32: return kb->t_i32;
    case AJ_SIDE_F16:
    case AJ_SIDE_BF16: return kb->t_i16;
    default: return kb->t_f32;
    }
}

LLVMValueRef aj_score_side_value(aj_kb *kb, const aj_tensor_decl *d, LLVMValueRef raw)
{
    LLVMTypeRef t = LLVMTypeOf(raw);
    switch (d->dtype) {
    case AJ_SIDE_I32:
        return LLVMBuildSExt(kb->b, raw,
                             LLVMGetTypeKind(t) == LLVMVectorTypeKind
                                 ? LLVMVectorType(kb->t_i64, LLVMGetVectorSize(t))
                                 : kb->t_i64, "");
    case AJ_SIDE_F16: return aj_kb_to_f32(kb, raw, AJ_DTYPE_F16);
    case AJ_SIDE_BF16: return aj_kb_to_f32(kb, raw, AJ_DTYPE_BF16);
    default: return raw;
    }
}

LLVMValueRef aj_score_side_load(aj_kb *kb, const aj_tensor_decl *d, LLVMValueRef at)
{
    int bytes = aj_side_dtype_bytes(d->dtype);
    LLVMValueRef off = LLVMBuildShl(kb->b, at, aj_kb_i64(kb, bytes == 2 ? 1 : 2), "");
    return aj_score_side_value(kb, d, aj_kb_load(kb, aj_score_side_storage(kb, d),
                                                 aj_kb_gptr_offset(kb, aj_kb_param(kb, d->name),
                                                                   off), bytes));
}

static LLVMValueRef load_scalar_at(aj_kb *kb, const aj_tensor_decl *d, const LLVMValueRef *idx)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef inside, at;
    element_at(kb, d, idx, 0, &inside, &at);
    at = LLVMBuildSelect(b, inside, at, aj_kb_i64(kb, 0), "");
    LLVMValueRef v = aj_score_side_load(kb, d, at);
    return LLVMBuildSelect(b, inside, v, d->dtype == AJ_SIDE_I32 ? aj_kb_i64(kb, 0)
                                                                 : aj_kb_f32(kb, 0), "");
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

/* The element of each lane (idx: <W x i64> per dim): one masked gather,
 * lanes outside the tensor masked off and 0, as load_scalar_at's rule.
 * One instruction per load, not one load and its bounds per lane: a
 * program of many loads (a rope dot product) stays a small function for
 * the backend, whose time grows faster than linearly in a block's size. */
static LLVMValueRef load_lanes(emitter *m, const aj_tensor_decl *d, const LLVMValueRef *idx)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    const unsigned w = (unsigned)m->lanes;
    LLVMValueRef inside, at;
    element_at(kb, d, idx, m->lanes, &inside, &at);
    LLVMTypeRef et = aj_score_side_storage(kb, d);
    LLVMTypeRef vt = LLVMVectorType(et, w);
    LLVMValueRef base = aj_kb_param(kb, d->name);
    LLVMValueRef ptrs = LLVMBuildGEP2(b, et, base, &at, 1, "");
    const char *gather = "llvm.masked.gather";
    unsigned id = LLVMLookupIntrinsicID(gather, strlen(gather));
    LLVMTypeRef over[2] = {vt, LLVMTypeOf(ptrs)};
    LLVMValueRef fn = LLVMGetIntrinsicDeclaration(kb->mod, id, over, 2);
    LLVMValueRef args[4] = {ptrs, aj_kb_i32(kb, aj_side_dtype_bytes(d->dtype)), inside,
                            LLVMConstNull(vt)};
    LLVMValueRef v = LLVMBuildCall2(b, LLVMIntrinsicGetType(kb->llctx, id, over, 2), fn, args, 4,
                                    "");
    return aj_score_side_value(kb, d, v);
}

static LLVMValueRef emit_load(emitter *m, const aj_expr_node *n)
{
    const aj_tensor_decl *d = &m->s->p->tensors[n->u.tensor];
    LLVMValueRef idx[AJ_EXPR_RANK_MAX];
    for (int i = 0; i < d->rank; i++)
        idx[i] = aj_score_emit_node(m, n->args[i]);
    return m->lanes ? load_lanes(m, d, idx) : load_scalar(m, d, idx);
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

/* c (an f32 or i32 constant) in the shape of x: a scalar, or splat to
 * x's lanes. */
static LLVMValueRef like(aj_kb *kb, LLVMValueRef x, LLVMValueRef c)
{
    LLVMTypeRef t = LLVMTypeOf(x);
    if (LLVMGetTypeKind(t) != LLVMVectorTypeKind)
        return c;
    return aj_cv_splat(kb, c, (int)LLVMGetVectorSize(t));
}

/* i32 in the shape of x (f32 or <W x float>) */
static LLVMTypeRef i32_like(aj_kb *kb, LLVMValueRef x)
{
    LLVMTypeRef t = LLVMTypeOf(x);
    return LLVMGetTypeKind(t) == LLVMVectorTypeKind ? LLVMVectorType(kb->t_i32, LLVMGetVectorSize(t))
                                                    : kb->t_i32;
}

static LLVMValueRef fconst(aj_kb *kb, LLVMValueRef x, double v)
{
    return like(kb, x, aj_kb_f32(kb, v));
}

/* c[0] + t (c[1] + t (c[2] + ...)): n coefficients, lowest first */
static LLVMValueRef horner(aj_kb *kb, LLVMValueRef t, const double *c, int n)
{
    LLVMValueRef p = fconst(kb, t, c[n - 1]);
    for (int i = n - 2; i >= 0; i--)
        p = aj_cv_fma(kb, p, t, fconst(kb, t, c[i]));
    return p;
}

/* 2^x: the cpu kernels' polynomial on the host (inf from x >= 128 on, as
 * the evaluator's), the GPU targets' ex2.approx elsewhere */
static LLVMValueRef emit_exp2(emitter *m, bool host, LLVMValueRef x)
{
    aj_kb *kb = m->s->kb;
    if (!host)
        return aj_kb_exp2(kb, x);
    LLVMValueRef r = host_math(m, aj_cv_exp2, x);
    LLVMValueRef big = LLVMBuildFCmp(kb->b, LLVMRealOGE, x, fconst(kb, x, 128.0), "");
    return LLVMBuildSelect(kb->b, big, fconst(kb, x, INFINITY), r, "");
}

/*
 * e^x to about 2 ulp: x = k ln 2 + r with k = rint(x log2 e) and r by a
 * two-part ln 2 (L1 short enough that k L1 is exact for |k| < 2^8), so
 * that 2^(r log2 e) sees an argument of at most 1/2 with no rounding of
 * k in it; 2^k goes in by two exact scalings (k / 2 and the rest, each a
 * float built from its exponent bits), so overflow to inf and underflow
 * to 0 come out right.  A NaN stays NaN.
 */
static LLVMValueRef emit_exp(emitter *m, bool host, LLVMValueRef x)
{
    static const double l1 = 0.693145751953125;        /* ln 2 to 16 bits */
    static const double l2 = 1.428606765330187e-06;    /* the rest, rounded */
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMTypeRef ft = LLVMTypeOf(x);
    LLVMValueRef k = LLVMBuildFMul(b, x, fconst(kb, x, AJ_LOG2E), "");
    k = aj_kb_call_overloaded(kb, "llvm.rint", &k, 1);
    /* k within +-300 (beyond, 2^k over- or underflows anyway); NaN as 0 */
    k = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, k, fconst(kb, x, 300.0), ""),
                        fconst(kb, x, 300.0), k, "");
    k = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, k, fconst(kb, x, -300.0), ""),
                        fconst(kb, x, -300.0), k, "");
    k = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealORD, k, k, ""), k, LLVMConstNull(ft), "");
    LLVMValueRef r = LLVMBuildFSub(b, x, LLVMBuildFMul(b, k, fconst(kb, x, l1), ""), "");
    r = LLVMBuildFSub(b, r, LLVMBuildFMul(b, k, fconst(kb, x, l2), ""), "");
    LLVMValueRef v = emit_exp2(m, host, LLVMBuildFMul(b, r, fconst(kb, x, AJ_LOG2E), ""));
    LLVMValueRef ki = LLVMBuildFPToSI(b, k, i32_like(kb, x), "");
    LLVMValueRef k1 = LLVMBuildAShr(b, ki, like(kb, ki, aj_kb_i32(kb, 1)), "");
    LLVMValueRef halves[2] = {k1, LLVMBuildSub(b, ki, k1, "")};
    for (int i = 0; i < 2; i++) {
        /* 2^h for -150 <= h <= 150 as a float: h + 127 in the exponent
         * field, clamped to 1 .. 254 (2^-126 .. 2^127: the second half
         * finishes an underflow or an overflow) */
        LLVMValueRef e = LLVMBuildAdd(b, halves[i], like(kb, ki, aj_kb_i32(kb, 127)), "");
        LLVMValueRef args[2] = {e, like(kb, ki, aj_kb_i32(kb, 1))};
        e = aj_kb_call_overloaded(kb, "llvm.smax", args, 2);
        args[0] = e, args[1] = like(kb, ki, aj_kb_i32(kb, 254));
        e = aj_kb_call_overloaded(kb, "llvm.smin", args, 2);
        e = LLVMBuildShl(b, e, like(kb, ki, aj_kb_i32(kb, 23)), "");
        v = LLVMBuildFMul(b, v, LLVMBuildBitCast(b, e, ft, ""), "");
    }
    return v;
}

/*
 * sin, cos, tan (docs/ir.md, "Functions"): x = n pi/2 + r with |r| <=
 * pi/4 by a three-part Cody-Waite reduction (pi/2 = P1 + P2 + P3, P1 and
 * P2 short enough that n P1 and n P2 are exact for |n| < 2^13, so |x| up
 * to about 12000 loses nothing), then sin r and cos r by polynomials
 * fitted on [0, pi/4] (relative error below 1e-9 before rounding) and the
 * quadrant n mod 4.  Plain IR on every target, so cpu, sim and GPU agree;
 * a NaN or an infinity gives NaN.
 */
static LLVMValueRef emit_trig(emitter *m, aj_expr_op op, LLVMValueRef x)
{
    static const double sin_c[4] = {-1.6666666663848662e-01, 8.3333318678783240e-03,
                                    -1.9840083357432997e-04, 2.7249541065378740e-06};
    static const double cos_c[4] = {-4.9999999968735154e-01, 4.1666650478803610e-02,
                                    -1.3887581537769110e-03, 2.4462944290714410e-05};
    static const double p1 = 1.5703125;                    /* pi/2 to 8 bits */
    static const double p2 = 4.837512969970703125e-4;      /* the rest to 11 bits */
    static const double p3 = 7.549790126404332e-8;         /* the rest, rounded */
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMTypeRef ft = LLVMTypeOf(x);
    LLVMValueRef nf = LLVMBuildFMul(b, x, fconst(kb, x, 0.63661977236758134308), "");
    nf = aj_kb_call_overloaded(kb, "llvm.rint", &nf, 1);
    LLVMValueRef r = LLVMBuildFSub(b, x, LLVMBuildFMul(b, nf, fconst(kb, x, p1), ""), "");
    r = LLVMBuildFSub(b, r, LLVMBuildFMul(b, nf, fconst(kb, x, p2), ""), "");
    r = LLVMBuildFSub(b, r, LLVMBuildFMul(b, nf, fconst(kb, x, p3), ""), "");
    LLVMValueRef r2 = LLVMBuildFMul(b, r, r, "");
    LLVMValueRef sn = aj_cv_fma(kb, LLVMBuildFMul(b, r, r2, ""), horner(kb, r2, sin_c, 4), r);
    LLVMValueRef cs = aj_cv_fma(kb, r2, horner(kb, r2, cos_c, 4), fconst(kb, x, 1.0));
    /* the quadrant; a NaN, an infinity or a huge n converts as 0 (no poison) */
    LLVMValueRef ok = LLVMBuildFCmp(b, LLVMRealOLT, aj_kb_call_overloaded(kb, "llvm.fabs", &nf, 1),
                                    fconst(kb, x, 1073741824.0), "");
    nf = LLVMBuildSelect(b, ok, nf, LLVMConstNull(ft), "");
    LLVMValueRef q = LLVMBuildFPToSI(b, nf, i32_like(kb, x), "");
    LLVMValueRef zero = LLVMConstNull(LLVMTypeOf(q));
    LLVMValueRef odd = LLVMBuildICmp(b, LLVMIntNE, LLVMBuildAnd(b, q, like(kb, q, aj_kb_i32(kb, 1)),
                                                                ""), zero, "");
    /* sin: s, c, -s, -c by quadrant; cos: c, -s, -c, s */
    LLVMValueRef sin_v = LLVMBuildSelect(b, odd, cs, sn, "");
    LLVMValueRef cos_v = LLVMBuildSelect(b, odd, sn, cs, "");
    LLVMValueRef sin_neg = LLVMBuildICmp(b, LLVMIntNE, LLVMBuildAnd(b, q, like(kb, q, aj_kb_i32(kb, 2)),
                                                                    ""), zero, "");
    LLVMValueRef q1 = LLVMBuildAdd(b, q, like(kb, q, aj_kb_i32(kb, 1)), "");
    LLVMValueRef cos_neg = LLVMBuildICmp(b, LLVMIntNE, LLVMBuildAnd(b, q1, like(kb, q, aj_kb_i32(kb, 2)),
                                                                    ""), zero, "");
    sin_v = LLVMBuildSelect(b, sin_neg, LLVMBuildFNeg(b, sin_v, ""), sin_v, "");
    cos_v = LLVMBuildSelect(b, cos_neg, LLVMBuildFNeg(b, cos_v, ""), cos_v, "");
    if (op == AJ_EXPR_SIN)
        return sin_v;
    if (op == AJ_EXPR_COS)
        return cos_v;
    return LLVMBuildFDiv(b, sin_v, cos_v, "");
}

/*
 * erf (docs/ir.md, "Functions"): x P(x^2) below |x| = 1, sign(x) (1 -
 * e^(-x^2) R(1/|x|)) from 1 to 4 (R fitted to erfc(x) e^(x^2)), sign(x)
 * from 4 on, where erf rounds to +-1 in f32.  Within 3 ulp of erf over
 * f32 (the fits' relative errors: 1.2e-9 and 1.4e-7 before rounding).
 */
static LLVMValueRef emit_erf(emitter *m, bool host, LLVMValueRef x)
{
    static const double small_c[7] = {1.1283791657434874e+00, -3.7612625872607150e-01,
                                      1.1283585537920744e-01, -2.6853825276938050e-02,
                                      5.1883498652757830e-03, -8.0103704958820810e-04,
                                      7.8544037829225780e-05};
    static const double tail_c[8] = {3.3298895323302430e-04, 5.5797838495905320e-01,
                                     4.9617890171566474e-02, -5.0156937737642090e-01,
                                     5.6786187061224760e-01, -3.4577798385426850e-01,
                                     1.1582343272327082e-01, -1.6683568794911046e-02};
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef a = aj_kb_call_overloaded(kb, "llvm.fabs", &x, 1);
    LLVMValueRef small = LLVMBuildFMul(b, x, horner(kb, LLVMBuildFMul(b, x, x, ""), small_c, 7), "");
    LLVMValueRef u = LLVMBuildFDiv(b, fconst(kb, x, 1.0), a, "");
    LLVMValueRef g = emit_exp2(m, host, LLVMBuildFMul(b, LLVMBuildFNeg(b, LLVMBuildFMul(b, a, a, ""),
                                                                       ""),
                                                      fconst(kb, x, AJ_LOG2E), ""));
    LLVMValueRef tail = LLVMBuildFSub(b, fconst(kb, x, 1.0),
                                      LLVMBuildFMul(b, g, horner(kb, u, tail_c, 8), ""), "");
    tail = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGE, a, fconst(kb, x, 4.0), ""),
                           fconst(kb, x, 1.0), tail, "");
    LLVMValueRef args[2] = {tail, x};
    tail = aj_kb_call_overloaded(kb, "llvm.copysign", args, 2);
    return LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOLT, a, fconst(kb, x, 1.0), ""), small, tail,
                           "");
}

/* x^n for an int literal n (|n| <= AJ_EXPR_POW_MAX): squarings and
 * products, 1 / x^-n for n < 0, 1 for n == 0 */
static LLVMValueRef emit_pow(emitter *m, LLVMValueRef x, int64_t n)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef r = NULL, base = x;
    for (uint64_t e = n < 0 ? (uint64_t)-n : (uint64_t)n; e; e >>= 1) {
        if (e & 1)
            r = r ? LLVMBuildFMul(b, r, base, "") : base;
        if (e > 1)
            base = LLVMBuildFMul(b, base, base, "");
    }
    if (!r)
        return fconst(kb, x, 1.0);
    return n < 0 ? LLVMBuildFDiv(b, fconst(kb, x, 1.0), r, "") : r;
}

/* log, tanh, exp2, log2: the cpu kernels' own (on the cpu target, for
 * vectors and scalars alike: a kernel of scalar code there, the
 * block-mask builder, computes what the vector kernels do), else the GPU
 * targets' intrinsics; exp and sigmoid reduce by ln 2 first (emit_exp);
 * sqrt and floor are LLVM's everywhere; sin, cos, tan and erf the same
 * plain IR on every target. */
LLVMValueRef aj_score_emit_math(emitter *m, aj_expr_op op, LLVMValueRef a)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    bool host = m->s->lanes > 0 || !kb->desc->simt;
    LLVMValueRef ln2 = fconst(kb, a, AJ_LN2);
    switch (op) {
    case AJ_EXPR_EXP:
        return emit_exp(m, host, a);
    case AJ_EXPR_EXP2:
        return emit_exp2(m, host, a);
    case AJ_EXPR_LOG:
    case AJ_EXPR_LOG2: {
        LLVMValueRef l2 = host ? aj_kb_call_overloaded(kb, "llvm.log2", &a, 1) : aj_kb_log2(kb, a);
        return op == AJ_EXPR_LOG ? LLVMBuildFMul(b, l2, ln2, "") : l2;
    }
    case AJ_EXPR_TANH:
        return host ? host_math(m, aj_cv_tanh, a) : aj_attn_tanh(kb, a);
    case AJ_EXPR_SIGMOID: {
        LLVMValueRef e = emit_exp(m, host, LLVMBuildFNeg(b, a, ""));
        return LLVMBuildFDiv(b, fconst(kb, a, 1.0), LLVMBuildFAdd(b, fconst(kb, a, 1.0), e, ""), "");
    }
    case AJ_EXPR_SIN:
    case AJ_EXPR_COS:
    case AJ_EXPR_TAN:
        return emit_trig(m, op, a);
    case AJ_EXPR_ERF:
        return emit_erf(m, host, a);
    case AJ_EXPR_SQRT:
        return aj_kb_call_overloaded(kb, "llvm.sqrt", &a, 1);
    default:   /* floor */
        return aj_kb_call_overloaded(kb, "llvm.floor", &a, 1);
    }
}

/* x << s for every count s (ir/expr.h): 0 from s >= 64 on, an
 * arithmetic shift right by -s (at most 63) for s < 0; no count reaches
 * LLVM's shifts out of their range (poison there). */
static LLVMValueRef emit_shl(emitter *m, LLVMValueRef x, LLVMValueRef s)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef zero = LLVMConstNull(LLVMTypeOf(x)), c63 = like(kb, x, aj_kb_i64(kb, 63));
    LLVMValueRef out = LLVMBuildICmp(b, LLVMIntUGT, s, c63, "");   /* s >= 64 or s < 0 */
    LLVMValueRef left = LLVMBuildShl(b, x, LLVMBuildSelect(b, out, zero, s, ""), "");
    left = LLVMBuildSelect(b, out, zero, left, "");
    LLVMValueRef args[2] = {LLVMBuildSub(b, zero, s, ""), c63};
    LLVMValueRef right = LLVMBuildAShr(b, x, aj_kb_call_overloaded(kb, "llvm.umin", args, 2), "");
    return LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, s, zero, ""), right, left, "");
}

/* x >> s == x << -s; 0 for s == INT64_MIN, whose negation wraps */
static LLVMValueRef emit_shr(emitter *m, LLVMValueRef x, LLVMValueRef s)
{
    aj_kb *kb = m->s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef zero = LLVMConstNull(LLVMTypeOf(x));
    LLVMValueRef v = emit_shl(m, x, LLVMBuildSub(b, zero, s, ""));
    LLVMValueRef min = LLVMBuildICmp(b, LLVMIntEQ, s, like(kb, x, aj_kb_i64(kb, INT64_MIN)), "");
    return LLVMBuildSelect(b, min, zero, v, "");
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
    case AJ_VAR_BIAS:
        return aj_score_bias_at(m->bias, m->i, m->j);
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
        !(m->s->p->reads[id] & AJ_SCORE_READS_KEY)) {
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
        case AJ_EXPR_BIT_NOT: v = LLVMBuildNot(b, x[0], ""); break;
        case AJ_EXPR_BIT_AND: v = LLVMBuildAnd(b, x[0], x[1], ""); break;
        case AJ_EXPR_BIT_OR: v = LLVMBuildOr(b, x[0], x[1], ""); break;
        case AJ_EXPR_BIT_XOR: v = LLVMBuildXor(b, x[0], x[1], ""); break;
        case AJ_EXPR_SHL: v = emit_shl(m, x[0], x[1]); break;
        case AJ_EXPR_SHR: v = emit_shr(m, x[0], x[1]); break;
        case AJ_EXPR_POW: v = emit_pow(m, x[0], m->s->p->e.nodes[n->args[1]].u.i); break;
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
    /* the per-node values, one block (zeroed) in the builder's scratch */
    size_t count = p->e.count ? (size_t)p->e.count : 1;
    LLVMValueRef *per_node = aj_kb_scratch(kb, 5 * count * sizeof *per_node);
    if (!per_node)
        return;
    s->loads = per_node;
    s->row_lo = per_node + count;
    s->row_hi = per_node + 2 * count;
    s->col_lo = per_node + 3 * count;
    s->col_hi = per_node + 4 * count;
    /* the band's bounds read no position: one scalar emission per CTA */
    emitter *m = score_emitter(s, SLOT_BAND, 0, aj_kb_i32(kb, 0), aj_kb_i32(kb, 0), NULL);
    if (!m)
        return;
    LLVMValueRef delta = LLVMBuildSub(kb->b, q_origin, k_origin, "delta");
    if (p->band_hi != NONE)
        s->hi_off = clamp_to_i32(kb, LLVMBuildAdd(kb->b, delta, aj_score_emit_node(m, p->band_hi), ""));
    if (p->band_lo != NONE)
        s->lo_off = clamp_to_i32(kb, LLVMBuildAdd(kb->b, delta, aj_score_emit_node(m, p->band_lo), ""));
    /* loads that stay the same over the CTA's tiles, read here once: no
     * key loop then keeps their addresses and bounds live */
    for (int id = 0; id < p->e.count; id++)
        if (node(p, id)->op == AJ_EXPR_LOAD &&
            !(p->reads[id] & (AJ_SCORE_READS_POSITION | AJ_SCORE_READS_KEY)))
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

/* ---------------------------------------------------------------- outlined */

/* Programs of more nodes than this are called, not inlined: the mod (and
 * its derivative) is emitted once per kernel as a helper function
 * (aj_kb_helper_begin) that every element calls.  A tile emits the
 * program at each of its elements, and LLVM's backend is slower than
 * linear in one block's size (bench/README.md "program size"); below
 * it, inlined code keeps the loads an element's neighbours share. */
enum { OUTLINE_NODES = 1024 };

/* i (and j) as i32 (or <lanes x i32>): what the helpers take. */
static LLVMValueRef as_i32(aj_kb *kb, LLVMValueRef v)
{
    LLVMTypeRef t = LLVMTypeOf(v);
    LLVMTypeRef e = LLVMGetTypeKind(t) == LLVMVectorTypeKind ? LLVMGetElementType(t) : t;
    if (LLVMGetIntTypeWidth(e) == 32)
        return v;
    LLVMTypeRef to = e == t ? kb->t_i32 : LLVMVectorType(kb->t_i32, LLVMGetVectorSize(t));
    return LLVMBuildTrunc(kb->b, v, to, "");
}

/* Starts emitter m's emission of the score_mod: the bias leaf's value
 * `bias`, and the biased score (score + bias) made first, where the
 * pipeline adds the bias before any other node of the mod. */
static void begin_mod(emitter *m, const aj_score_bias *bias)
{
    m->bias = bias;
    if (m->s->p->biased != NONE)
        aj_score_emit_node(m, m->s->p->biased);
}

/* Slot `slot`'s helper in this kernel (SLOT_MOD: the mod; SLOT_GRAD: {the
 * mod, d mod / d score}), made on first use, called at (score, i, j) and
 * the bias leaf's value: its result.  NULL when the builder failed. */
static LLVMValueRef call_outlined(aj_score *s, int slot, LLVMValueRef score,
                                  const aj_score_bias *bias, LLVMValueRef i, LLVMValueRef j)
{
    aj_kb *kb = s->kb;
    const int w = s->lanes;
    LLVMTypeRef tf = w ? LLVMVectorType(kb->t_f32, (unsigned)w) : kb->t_f32;
    LLVMTypeRef ti = w ? LLVMVectorType(kb->t_i32, (unsigned)w) : kb->t_i32;
    LLVMTypeRef pair[2] = {tf, tf};
    LLVMTypeRef ret = slot == SLOT_MOD ? tf : LLVMStructTypeInContext(kb->llctx, pair, 2, 0);
    char name[192];
    size_t len = 0;
    const char *kernel = LLVMGetValueName2(kb->fn, &len);
    snprintf(name, sizeof name, "%.*s.score_%s", (int)len, kernel,
             slot == SLOT_MOD ? "mod" : "grad");
    LLVMValueRef fn = LLVMGetNamedFunction(kb->mod, name);
    const int nargs = s->p->biased != NONE ? 10 : 9;
    if (!fn) {
        /* score, i, j, what the program's leaves read, the bias term */
        LLVMTypeRef extra[10] = {tf, kb->t_i32, ti, kb->t_i64, kb->t_i64,
                                 kb->t_i64, kb->t_i64, kb->t_i64, kb->t_i64, tf};
        aj_kb_helper_saved *saved = aj_kb_scratch(kb, sizeof *saved);
        LLVMValueRef *loads = aj_kb_scratch(kb, (size_t)s->p->e.count * sizeof *loads + 1);
        aj_score_bias *term = aj_kb_scratch(kb, sizeof *term);
        if (!saved || !loads || !term ||
            !(fn = aj_kb_helper_begin(kb, name, ret, extra, (unsigned)nargs, saved)))
            return NULL;
        aj_score in = *s;   /* its leaves the helper's arguments; loads read inside */
        LLVMValueRef *leaf[6] = {&in.b, &in.h, &in.q_origin, &in.k_origin, &in.sq, &in.sk};
        for (int a = 0; a < 6; a++)
            *leaf[a] = aj_kb_helper_arg(kb, 3 + a);
        in.loads = loads;
        memset(in.scratch, 0, sizeof in.scratch);
        emitter *m = score_emitter(&in, slot, w, aj_kb_helper_arg(kb, 1),
                                   aj_kb_helper_arg(kb, 2), aj_kb_helper_arg(kb, 0));
        *term = (aj_score_bias){nargs > 9 ? aj_kb_helper_arg(kb, 9) : NULL, NULL, NULL};
        if (m)
            begin_mod(m, term);
        LLVMValueRef v = m ? aj_score_emit_node(m, s->p->mod) : LLVMGetUndef(tf);
        if (slot == SLOT_GRAD) {
            LLVMValueRef d = !m                    ? LLVMGetUndef(tf)
                             : s->p->dmod == NONE ? splat(m, aj_kb_f32(kb, 1))
                                                  : aj_score_emit_node(m, s->p->dmod);
            v = LLVMBuildInsertValue(kb->b, LLVMBuildInsertValue(kb->b, LLVMGetUndef(ret), v,
                                                                 0, ""), d, 1, "");
        }
        aj_kb_helper_end(kb, v, saved);
    }
    /* made in this order (an initializer's order of evaluation is the
     * compiler's): the IR is the same from every build */
    LLVMValueRef i32 = as_i32(kb, i), j32 = as_i32(kb, j);
    LLVMValueRef term = nargs > 9 ? aj_score_bias_at(bias, i, j) : NULL;
    LLVMValueRef args[10] = {score, i32, j32, s->b, s->h, s->q_origin, s->k_origin, s->sq, s->sk,
                             term};
    return aj_kb_helper_call(kb, fn, args, (unsigned)nargs);
}

LLVMValueRef aj_score_bias_at(const aj_score_bias *bias, LLVMValueRef i, LLVMValueRef j)
{
    assert(bias);   /* a program with a bias leaf is emitted with its value */
    return bias->value ? bias->value : bias->load(bias->user, i, j);
}

LLVMValueRef aj_score_mod_value(aj_score *s, LLVMValueRef score, const aj_score_bias *bias,
                                LLVMValueRef i, LLVMValueRef j)
{
    if (s->p->mod == NONE)
        return score;
    if (s->p->e.count > OUTLINE_NODES) {
        LLVMValueRef v = call_outlined(s, SLOT_MOD, score, bias, i, j);
        return v ? v : score;
    }
    emitter *m = score_emitter(s, SLOT_MOD, s->lanes, i, j, score);
    if (!m)
        return score;
    begin_mod(m, bias);
    return aj_score_emit_node(m, s->p->mod);
}

LLVMValueRef aj_score_mod_grad(aj_score *s, LLVMValueRef score, const aj_score_bias *bias,
                               LLVMValueRef i, LLVMValueRef j, LLVMValueRef *d)
{
    aj_kb *kb = s->kb;
    emitter *m = score_emitter(s, SLOT_GRAD, s->lanes, i, j, score);
    if (!m) {
        *d = score;
        return score;
    }
    if (s->p->mod == NONE) {
        *d = splat(m, aj_kb_f32(kb, 1));
        return score;
    }
    if (s->p->e.count > OUTLINE_NODES) {
        LLVMValueRef r = call_outlined(s, SLOT_GRAD, score, bias, i, j);
        *d = r ? LLVMBuildExtractValue(kb->b, r, 1, "") : score;
        return r ? LLVMBuildExtractValue(kb->b, r, 0, "") : score;
    }
    begin_mod(m, bias);
    LLVMValueRef v = aj_score_emit_node(m, s->p->mod);
    *d = s->p->dmod == NONE ? splat(m, aj_kb_f32(kb, 1)) : aj_score_emit_node(m, s->p->dmod);
    return v;
}

LLVMValueRef aj_score_tensor_numel(aj_kb *kb, const aj_tensor_decl *d)
{
    LLVMValueRef n = aj_kb_i64(kb, 1);
    char name[64];
    for (int dim = 0; dim < d->rank; dim++) {
        aj_score_param_name(name, sizeof name, d->name, 's', dim);
        n = LLVMBuildMul(kb->b, n, aj_kb_param(kb, name), "");
    }
    return n;
}

LLVMValueRef aj_score_mod_side_grads(aj_score *s, LLVMValueRef t, const aj_score_bias *bias,
                                     LLVMValueRef i, LLVMValueRef j, LLVMValueRef *val,
                                     LLVMValueRef *at)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_score_prog *p = s->p;
    emitter *m = score_emitter(s, SLOT_GRAD, s->lanes, i, j, t);
    if (!m || p->mod == NONE)
        return t;
    begin_mod(m, bias);
    /* with lanes a uniform value may come as a scalar: every value a vector */
#define LANES(x) (s->lanes && LLVMGetTypeKind(LLVMTypeOf(x)) != LLVMVectorTypeKind ? splat(m, x) : (x))
    LLVMValueRef v = aj_score_emit_node(m, p->mod);
    for (int g = 0; g < p->num_grads; g++) {
        const aj_expr_node *n = node(p, p->grads[g].load);
        const aj_tensor_decl *d = &p->tensors[n->u.tensor];
        val[g] = LANES(aj_score_emit_node(m, p->grads[g].d));
        /* the element's row-major index in the tensor's shape */
        LLVMValueRef inside = splat(m, LLVMConstInt(kb->t_i1, 1, 0));
        LLVMValueRef flat = splat(m, aj_kb_i64(kb, 0));
        char name[64];
        for (int dim = 0; dim < d->rank; dim++) {
            LLVMValueRef x = LANES(aj_score_emit_node(m, n->args[dim]));
            aj_score_param_name(name, sizeof name, d->name, 's', dim);
            LLVMValueRef size = splat(m, aj_kb_param(kb, name));
            inside = LLVMBuildAnd(b, inside, LLVMBuildICmp(b, LLVMIntULT, x, size, ""), "");
            flat = LLVMBuildAdd(b, LLVMBuildMul(b, flat, size, ""), x, "");
        }
        at[g] = LLVMBuildSelect(b, inside, flat, splat(m, aj_kb_i64(kb, -1)), "");
    }
#undef LANES
    return v;
}

LLVMValueRef aj_score_visible_rest(aj_score *s, LLVMValueRef i, LLVMValueRef j)
{
    emitter *m = score_emitter(s, SLOT_REST, s->lanes, i, j, NULL);
    if (!m)
        return LLVMConstInt(s->kb->t_i1, 1, 0);
    if (s->p->rest == NONE)
        return splat(m, LLVMConstInt(s->kb->t_i1, 1, 0));
    return aj_score_emit_node(m, s->p->rest);
}

LLVMValueRef aj_score_visible(aj_score *s, LLVMValueRef i, LLVMValueRef j)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    emitter *m = score_emitter(s, SLOT_VISIBLE, s->lanes, i, j, NULL);
    if (!m)
        return LLVMConstInt(kb->t_i1, 1, 0);
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
