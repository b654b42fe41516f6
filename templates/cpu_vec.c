/*
 * cpu_vec.c -- vector helpers of the cpu templates (cpu_vec.h).
 */
#include "templates/cpu_vec.h"

#include "codegen/codegen.h"

LLVMTypeRef aj_cv_type(aj_kb *kb, int n)
{
    return LLVMVectorType(kb->t_f32, (unsigned)n);
}

LLVMValueRef aj_cv_splat(aj_kb *kb, LLVMValueRef v, int n)
{
    LLVMTypeRef vt = LLVMVectorType(LLVMTypeOf(v), (unsigned)n);
    LLVMValueRef one = LLVMBuildInsertElement(kb->b, LLVMGetPoison(vt), v, aj_kb_i32(kb, 0), "");
    LLVMValueRef zeros = LLVMConstNull(LLVMVectorType(kb->t_i32, (unsigned)n));
    return LLVMBuildShuffleVector(kb->b, one, LLVMGetPoison(vt), zeros, "");
}

LLVMValueRef aj_cv_iota(aj_kb *kb, int n)
{
    LLVMValueRef lanes[64];
    for (int i = 0; i < n; i++)
        lanes[i] = aj_kb_i32(kb, i);
    return LLVMConstVector(lanes, (unsigned)n);
}

LLVMValueRef aj_cv_fma(aj_kb *kb, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c)
{
    LLVMValueRef args[3] = {a, b, c};
    return aj_kb_call_overloaded(kb, "llvm.fmuladd", args, 3);
}

/* The bf16 of each word's high half (odd: element 2i + 1) or low half,
 * widened to f32 */
static LLVMValueRef bf16_half(aj_kb *kb, LLVMValueRef words, int odd, int n)
{
    LLVMTypeRef vi = LLVMVectorType(kb->t_i32, (unsigned)n);
    LLVMValueRef w = LLVMBuildBitCast(kb->b, words, vi, "");
    LLVMValueRef high = aj_cv_splat(kb, aj_kb_i32(kb, (int32_t)0xffff0000u), n);
    LLVMValueRef bits = odd ? LLVMBuildAnd(kb->b, w, high, "")
                            : LLVMBuildShl(kb->b, w, aj_cv_splat(kb, aj_kb_i32(kb, 16), n), "");
    return LLVMBuildBitCast(kb->b, bits, aj_cv_type(kb, n), "");
}

LLVMValueRef aj_cv_dot_bf16(aj_kb *kb, LLVMValueRef acc, LLVMValueRef a, LLVMValueRef b, int n)
{
    if (aj_cpu_bf16_pairs() != AJ_BF16_PAIRS_NATIVE) {
        /* the stand-in: vdpbf16ps's order (the odd elements, then the even;
         * each product of two bf16 is exact in f32), without its flushing
         * of subnormals */
        acc = aj_cv_fma(kb, bf16_half(kb, a, 1, n), bf16_half(kb, b, 1, n), acc);
        return aj_cv_fma(kb, bf16_half(kb, a, 0, n), bf16_half(kb, b, 0, n), acc);
    }
    const char *name = n == 16 ? "llvm.x86.avx512bf16.dpbf16ps.512"
                               : "llvm.x86.avx512bf16.dpbf16ps.256";
    LLVMTypeRef pairs = LLVMVectorType(LLVMBFloatTypeInContext(kb->llctx), (unsigned)(2 * n));
    LLVMValueRef args[3] = {acc, LLVMBuildBitCast(kb->b, a, pairs, ""),
                            LLVMBuildBitCast(kb->b, b, pairs, "")};
    LLVMValueRef r = n == 16 || n == 8 ? aj_kb_call_intrinsic(kb, name, args, 3) : NULL;
    if (!r) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "%s is not an intrinsic of this LLVM", name);
        return acc;
    }
    return r;
}

LLVMValueRef aj_cv_max(aj_kb *kb, LLVMValueRef a, LLVMValueRef b)
{
    LLVMValueRef args[2] = {a, b};
    return aj_kb_call_overloaded(kb, "llvm.maxnum", args, 2);
}

LLVMValueRef aj_cv_max_nn(aj_kb *kb, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildSelect(kb->b, LLVMBuildFCmp(kb->b, LLVMRealOGT, a, b, ""), a, b, "");
}

/* Halves the vector until one lane is left, combining the halves. */
static LLVMValueRef reduce(aj_kb *kb, LLVMValueRef v, int n, int is_max)
{
    while (n > 1) {
        LLVMValueRef lo[32], hi[32];
        for (int i = 0; i < n / 2; i++) {
            lo[i] = aj_kb_i32(kb, i);
            hi[i] = aj_kb_i32(kb, n / 2 + i);
        }
        LLVMValueRef a = LLVMBuildShuffleVector(kb->b, v, LLVMGetPoison(LLVMTypeOf(v)),
                                                LLVMConstVector(lo, (unsigned)(n / 2)), "");
        LLVMValueRef c = LLVMBuildShuffleVector(kb->b, v, LLVMGetPoison(LLVMTypeOf(v)),
                                                LLVMConstVector(hi, (unsigned)(n / 2)), "");
        v = is_max ? aj_cv_max_nn(kb, a, c) : LLVMBuildFAdd(kb->b, a, c, "");
        n /= 2;
    }
    return LLVMBuildExtractElement(kb->b, v, aj_kb_i32(kb, 0), "");
}

LLVMValueRef aj_cv_hmax(aj_kb *kb, LLVMValueRef v, int n)
{
    return reduce(kb, v, n, 1);
}

LLVMValueRef aj_cv_hsum(aj_kb *kb, LLVMValueRef v, int n)
{
    return reduce(kb, v, n, 0);
}

/* p 2^k for integral k in [-126, 127]: vscalefps where the host has it
 * (one instruction for the shift, add and multiply; the same bits, 2^k
 * being normal) */
static LLVMValueRef times_pow2(aj_kb *kb, LLVMValueRef p, LLVMValueRef k, int n)
{
    LLVMBuilderRef b = kb->b;
    if (aj_cpu_has_feature("avx512f") && (n == 16 || (n == 8 && aj_cpu_has_feature("avx512vl")))) {
        LLVMValueRef args[5] = {p, k, LLVMGetUndef(aj_cv_type(kb, n)),
                                LLVMConstInt(n == 16 ? kb->t_i16 : kb->t_i8, ~0ull, 0),
                                aj_kb_i32(kb, 4)};   /* the current rounding */
        LLVMValueRef r = aj_kb_call_intrinsic(kb, n == 16 ? "llvm.x86.avx512.mask.scalef.ps.512"
                                                          : "llvm.x86.avx512.mask.scalef.ps.256",
                                              args, n == 16 ? 5 : 4);
        if (r)
            return r;
    }
    LLVMTypeRef vi = LLVMVectorType(kb->t_i32, (unsigned)n);
    LLVMValueRef e = LLVMBuildFPToSI(b, k, vi, "");
    e = LLVMBuildShl(b, LLVMBuildAdd(b, e, aj_cv_splat(kb, aj_kb_i32(kb, 127), n), ""),
                     aj_cv_splat(kb, aj_kb_i32(kb, 23), n), "");
    return LLVMBuildFMul(b, p, LLVMBuildBitCast(b, e, aj_cv_type(kb, n), ""), "");
}

static LLVMValueRef exp2_of(aj_kb *kb, LLVMValueRef x, int n, int clamp_high)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef lo = aj_cv_splat(kb, aj_kb_f32(kb, -126.0), n);
    LLVMValueRef hi = aj_cv_splat(kb, aj_kb_f32(kb, 127.0), n);
    /* compares, not min/max, so that NaN passes through */
    LLVMValueRef tiny = LLVMBuildFCmp(b, LLVMRealOLT, x, lo, "");
    LLVMValueRef xc = LLVMBuildSelect(b, tiny, lo, x, "");
    if (clamp_high)
        xc = LLVMBuildSelect(b, LLVMBuildFCmp(b, LLVMRealOGT, xc, hi, ""), hi, xc, "");
    LLVMValueRef k = aj_kb_call_overloaded(kb, "llvm.rint", &xc, 1);
    LLVMValueRef f = LLVMBuildFSub(b, xc, k, "");
    /* 2^f on [-1/2, 1/2], highest first: the degree-5 polynomial with
     * p(0) = 1 of least largest relative error (Lawson's reweighting of
     * least squares on Chebyshev nodes): 9.2e-8 exactly, 1.7e-7 in f32
     * with FMAs, where the degree-6 Taylor polynomial it replaced read
     * 2.2e-7 with one FMA more */
    static const double c[6] = {1.3264727213626241e-3, 9.6715128124923600e-3,
                                5.5507337448248498e-2, 2.4022242082677514e-1,
                                6.9314697759733035e-1, 1.0};
    LLVMValueRef p = aj_cv_splat(kb, aj_kb_f32(kb, c[0]), n);
    for (int i = 1; i < 6; i++)
        p = aj_cv_fma(kb, p, f, aj_cv_splat(kb, aj_kb_f32(kb, c[i]), n));
    return LLVMBuildSelect(b, tiny, LLVMConstNull(aj_cv_type(kb, n)), times_pow2(kb, p, k, n),
                           "");
}

LLVMValueRef aj_cv_exp2(aj_kb *kb, LLVMValueRef x, int n)
{
    return exp2_of(kb, x, n, 1);
}

LLVMValueRef aj_cv_exp2_softmax(aj_kb *kb, LLVMValueRef x, int n)
{
    return exp2_of(kb, x, n, 0);
}

LLVMValueRef aj_cv_tanh(aj_kb *kb, LLVMValueRef x, int n)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef ax = aj_kb_call_overloaded(kb, "llvm.fabs", &x, 1);
    LLVMValueRef one = aj_cv_splat(kb, aj_kb_f32(kb, 1.0), n);
    LLVMValueRef ex = aj_cv_exp2(kb, LLVMBuildFMul(b, ax, aj_cv_splat(kb, aj_kb_f32(kb,
                                 2.0 * AJ_LOG2E), n), ""), n);
    LLVMValueRef r = LLVMBuildFSub(b, one, LLVMBuildFDiv(b, aj_cv_splat(kb, aj_kb_f32(kb, 2.0),
                                   n), LLVMBuildFAdd(b, ex, one, ""), ""), "");
    LLVMValueRef neg = LLVMBuildFCmp(b, LLVMRealOLT, x, LLVMConstNull(aj_cv_type(kb, n)), "");
    return LLVMBuildSelect(b, neg, LLVMBuildFNeg(b, r, ""), r, "");
}

LLVMValueRef aj_cv_load(aj_kb *kb, LLVMValueRef ptr, aj_dtype dtype, int n)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef v;
    switch (dtype) {
    case AJ_DTYPE_F16:   /* as halves, widened by aj_kb_to_f32 (one rule) */
    case AJ_DTYPE_BF16:
    case AJ_DTYPE_F8E4M3:
    case AJ_DTYPE_F8E5M2: {
        LLVMTypeRef e = dtype == AJ_DTYPE_F16    ? LLVMHalfTypeInContext(kb->llctx)
                        : dtype == AJ_DTYPE_BF16 ? kb->t_i16
                                                 : kb->t_i8;
        v = LLVMBuildLoad2(b, LLVMVectorType(e, (unsigned)n), ptr, "");
        LLVMSetAlignment(v, (unsigned)aj_dtype_size(dtype));
        return aj_kb_to_f32(kb, v, dtype);
    }
    default:
        v = LLVMBuildLoad2(b, aj_cv_type(kb, n), ptr, "");
        LLVMSetAlignment(v, 4);
        return v;
    }
}

void aj_cv_store(aj_kb *kb, LLVMValueRef v, LLVMValueRef ptr, aj_dtype dtype, int n)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef out = v;
    unsigned align = 4;
    if (dtype == AJ_DTYPE_F16) {
        out = LLVMBuildFPTrunc(b, v, LLVMVectorType(LLVMHalfTypeInContext(kb->llctx),
                                                    (unsigned)n), "");
        align = 2;
    } else if (dtype == AJ_DTYPE_BF16) {
        /* round to nearest even on the bits: add 0x7fff plus the lowest
         * kept bit, keep the top half; NaN becomes a quiet NaN */
        LLVMTypeRef vi = LLVMVectorType(kb->t_i32, (unsigned)n);
        LLVMValueRef bits = LLVMBuildBitCast(b, v, vi, "");
        LLVMValueRef s16 = aj_cv_splat(kb, aj_kb_i32(kb, 16), n);
        LLVMValueRef odd = LLVMBuildAnd(b, LLVMBuildLShr(b, bits, s16, ""),
                                        aj_cv_splat(kb, aj_kb_i32(kb, 1), n), "");
        LLVMValueRef r = LLVMBuildAdd(b, bits, LLVMBuildAdd(b, odd,
                                      aj_cv_splat(kb, aj_kb_i32(kb, 0x7fff), n), ""), "");
        r = LLVMBuildLShr(b, r, s16, "");
        LLVMValueRef qnan = LLVMBuildOr(b, LLVMBuildLShr(b, bits, s16, ""),
                                        aj_cv_splat(kb, aj_kb_i32(kb, 0x40), n), "");
        LLVMValueRef nan = LLVMBuildFCmp(b, LLVMRealUNO, v, v, "");
        r = LLVMBuildSelect(b, nan, qnan, r, "");
        out = LLVMBuildTrunc(b, r, LLVMVectorType(kb->t_i16, (unsigned)n), "");
        align = 2;
    }
    LLVMValueRef st = LLVMBuildStore(b, out, ptr);
    LLVMSetAlignment(st, align);
}

void aj_cv_store_operand(aj_kb *kb, LLVMValueRef v, LLVMValueRef ptr, aj_dtype dtype, int n)
{
    LLVMValueRef h = NULL;
    if (dtype == AJ_DTYPE_BF16 && (n == 16 || n == 8) && aj_cpu_has_feature("avx512bf16"))
        h = aj_kb_call_intrinsic(kb, n == 16 ? "llvm.x86.avx512bf16.cvtneps2bf16.512"
                                             : "llvm.x86.avx512bf16.cvtneps2bf16.256", &v, 1);
    if (!h) {
        aj_cv_store(kb, v, ptr, dtype, n);
        return;
    }
    LLVMValueRef st = LLVMBuildStore(
        kb->b, LLVMBuildBitCast(kb->b, h, LLVMVectorType(kb->t_i16, (unsigned)n), ""), ptr);
    LLVMSetAlignment(st, 2);
}

LLVMValueRef aj_cv_at(aj_kb *kb, LLVMTypeRef elem, LLVMValueRef ptr, LLVMValueRef index)
{
    return LLVMBuildGEP2(kb->b, elem, ptr, &index, 1, "");
}

LLVMValueRef aj_cv_buffer(aj_kb *kb, int n, const char *name)
{
    LLVMValueRef buf = aj_kb_var(kb, LLVMArrayType(kb->t_f32, (unsigned)n), NULL, name);
    LLVMSetAlignment(buf, 64);
    return buf;
}
