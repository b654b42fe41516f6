/*
 * cpu_vec.h -- vector helpers the cpu templates share: <W x float> values
 * sized by the host's SIMD width, loads that widen f16 / bf16 to f32 in
 * registers, stores that round back, a polynomial exp2 and tanh, and
 * horizontal reductions.  Everything is plain LLVM IR that the x86 (or any)
 * backend selects to its own vector instructions.
 */
#ifndef AJ_TEMPLATES_CPU_VEC_H
#define AJ_TEMPLATES_CPU_VEC_H

#include "codegen/kbuilder.h"

/* <n x float> */
LLVMTypeRef aj_cv_type(aj_kb *kb, int n);
/* v broadcast to n lanes (v: f32 or i32) */
LLVMValueRef aj_cv_splat(aj_kb *kb, LLVMValueRef v, int n);
/* <n x i32> 0, 1, ..., n - 1 */
LLVMValueRef aj_cv_iota(aj_kb *kb, int n);
/* fmuladd(a, b, c) on f32 or vectors: one FMA where the host has it */
LLVMValueRef aj_cv_fma(aj_kb *kb, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c);
/* acc + the dot products of bf16 pairs: lane i of <n x float> acc gets
 * a[2i] b[2i] + a[2i+1] b[2i+1], where a and b are <n x i32> words each
 * holding two bf16 (the lower index in the low half); n = 16 or 8.  One
 * vdpbf16ps (AVX512-BF16) where aj_cpu_bf16_pairs() is native, its
 * stand-in's two FMAs where it is standin. */
LLVMValueRef aj_cv_dot_bf16(aj_kb *kb, LLVMValueRef acc, LLVMValueRef a, LLVMValueRef b, int n);
/* llvm.maxnum on f32 or vectors */
LLVMValueRef aj_cv_max(aj_kb *kb, LLVMValueRef a, LLVMValueRef b);
/* max(a, b) for a b that is never NaN: a > b ? a : b, so a NaN a gives b
 * as maxnum would, in one compare-and-select (x86's vmaxps) where maxnum
 * takes three */
LLVMValueRef aj_cv_max_nn(aj_kb *kb, LLVMValueRef a, LLVMValueRef b);
/* max or sum of the n lanes of v (a tree of halving shuffles); the max of
 * a v without NaN (aj_cv_max_nn's steps) */
LLVMValueRef aj_cv_hmax(aj_kb *kb, LLVMValueRef v, int n);
LLVMValueRef aj_cv_hsum(aj_kb *kb, LLVMValueRef v, int n);

/* 2^x lane-wise for x <= 128 (NaN stays NaN, below -126 gives 0):
 * x = k + f with k = rint(x), |f| <= 1/2, 2^f by a degree-5 polynomial
 * with p(0) = 1 (relative error 1.7e-7 in f32; 2^0 is exactly 1), 2^k put
 * in the exponent (vscalefps where the host has it). */
LLVMValueRef aj_cv_exp2(aj_kb *kb, LLVMValueRef x, int n);
/* aj_cv_exp2 of a softmax's x = s - max (or s - lse): at most a rounding
 * above 0, so without the clamp at 127 */
LLVMValueRef aj_cv_exp2_softmax(aj_kb *kb, LLVMValueRef x, int n);
/* tanh(x) = sign(x) (1 - 2 / (2^(2|x| log2 e) + 1)), as attn_common's */
LLVMValueRef aj_cv_tanh(aj_kb *kb, LLVMValueRef x, int n);

/* n elements of `dtype` at ptr widened to <n x float> (bf16 by shifting
 * into the top half, f16 by fpext) */
LLVMValueRef aj_cv_load(aj_kb *kb, LLVMValueRef ptr, aj_dtype dtype, int n);
/* <n x float> rounded to nearest even into `dtype` and stored at ptr */
void aj_cv_store(aj_kb *kb, LLVMValueRef v, LLVMValueRef ptr, aj_dtype dtype, int n);
/* aj_cv_store of an operand that only a product reading denormals as zero
 * will read (P, dS: tdpbf16ps, vdpbf16ps).  bf16 on a host with
 * avx512bf16: one vcvtneps2bf16 (round to nearest even, a denormal result
 * flushed to zero -- the same operand for such a product); else aj_cv_store. */
void aj_cv_store_operand(aj_kb *kb, LLVMValueRef v, LLVMValueRef ptr, aj_dtype dtype, int n);

/* ptr + index elements of `elem` (index i32 or i64) */
LLVMValueRef aj_cv_at(aj_kb *kb, LLVMTypeRef elem, LLVMValueRef ptr, LLVMValueRef index);
/* A 64-byte-aligned f32 array of n elements on the kernel's stack. */
LLVMValueRef aj_cv_buffer(aj_kb *kb, int n, const char *name);

#endif /* AJ_TEMPLATES_CPU_VEC_H */
