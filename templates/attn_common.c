/*
 * attn_common.c -- attention math shared by the templates (attn_common.h).
 */
#include "templates/attn_common.h"

#include "templates/score.h"

#include <math.h>
#include <stdio.h>
#include <string.h>


LLVMValueRef aj_attn_tanh(aj_kb *kb, LLVMValueRef x)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef ax = aj_kb_call_overloaded(kb, "llvm.fabs", &x, 1);
    LLVMValueRef ex = aj_kb_exp2(kb, LLVMBuildFMul(b, ax, aj_kb_f32(kb, 2.0 * AJ_LOG2E), ""));
    LLVMValueRef r = LLVMBuildFSub(b, aj_kb_f32(kb, 1.0),
                                   LLVMBuildFDiv(b, aj_kb_f32(kb, 2.0),
                                                 LLVMBuildFAdd(b, ex, aj_kb_f32(kb, 1.0), ""),
                                                 ""), "");
    LLVMValueRef neg = LLVMBuildFCmp(b, LLVMRealOLT, x, aj_kb_f32(kb, 0), "");
    return LLVMBuildSelect(b, neg, LLVMBuildFNeg(b, r, ""), r, "");
}

aj_attn_dropout aj_attn_dropout_stream(aj_kb *kb, LLVMValueRef seed, LLVMValueRef offset,
                                       LLVMValueRef q_offset, LLVMValueRef kv_offset,
                                       LLVMValueRef bidx, LLVMValueRef h)
{
    LLVMBuilderRef b = kb->b;
    aj_attn_dropout d;
    d.key[0] = LLVMBuildTrunc(b, seed, kb->t_i32, "");
    d.key[1] = LLVMBuildTrunc(b, LLVMBuildLShr(b, LLVMBuildXor(b, seed, offset, ""),
                                               aj_kb_i64(kb, 32), ""), kb->t_i32, "");
    d.ctr[0] = LLVMBuildTrunc(b, kv_offset, kb->t_i32, "");
    d.ctr[1] = LLVMBuildTrunc(b, q_offset, kb->t_i32, "");
    LLVMValueRef head = LLVMBuildAdd(b, aj_param(kb, AJ_PID(head_offset)), h, "");
    d.ctr[2] = LLVMBuildAdd(b, LLVMBuildMul(b, bidx, aj_param(kb, AJ_PID(heads_q_total)), ""),
                            head, "");
    d.ctr[3] = LLVMBuildTrunc(b, offset, kb->t_i32, "");
    return d;
}

LLVMValueRef aj_attn_dropout_keep(aj_kb *kb, const aj_attn_dropout *d, double p,
                                  LLVMValueRef i, LLVMValueRef j)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef ctr[4] = {LLVMBuildAdd(b, d->ctr[0], j, ""), LLVMBuildAdd(b, d->ctr[1], i, ""),
                           d->ctr[2], d->ctr[3]};
    LLVMValueRef out[4];
    aj_kb_philox4x32_10(kb, ctr, d->key, out);
    LLVMValueRef u24 = LLVMBuildLShr(b, out[0], aj_kb_i32(kb, 8), "");
    double threshold = ceil(ldexp(p, 24));
    return LLVMBuildICmp(b, LLVMIntUGE, u24, aj_kb_i32(kb, (int64_t)threshold), "keep");
}

void aj_attn_merge_weights(aj_kb *kb, LLVMValueRef lse_prior, LLVMValueRef l2_new,
                           LLVMValueRef *w_prior, LLVMValueRef *w_new, LLVMValueRef *lse_out)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef l2_prior = LLVMBuildFMul(b, lse_prior, aj_kb_f32(kb, AJ_LOG2E), "");
    LLVMValueRef ninf = aj_kb_f32(kb, -INFINITY);
    LLVMValueRef mx = aj_kb_fmax(kb, l2_prior, l2_new);
    LLVMValueRef none = LLVMBuildFCmp(b, LLVMRealOEQ, mx, ninf, "");
    LLVMValueRef mx_use = LLVMBuildSelect(b, none, aj_kb_f32(kb, 0), mx, "");
    LLVMValueRef sum = LLVMBuildFAdd(b, aj_kb_exp2(kb, LLVMBuildFSub(b, l2_prior, mx_use, "")),
                                     aj_kb_exp2(kb, LLVMBuildFSub(b, l2_new, mx_use, "")), "");
    LLVMValueRef l2 = LLVMBuildFAdd(b, mx_use, aj_kb_log2(kb, sum), "");
    LLVMValueRef l2_use = LLVMBuildSelect(b, none, aj_kb_f32(kb, 0), l2, "");
    *w_prior = aj_kb_exp2(kb, LLVMBuildFSub(b, l2_prior, l2_use, ""));
    *w_new = aj_kb_exp2(kb, LLVMBuildFSub(b, l2_new, l2_use, ""));
    *lse_out = LLVMBuildSelect(b, none, ninf, LLVMBuildFMul(b, l2, aj_kb_f32(kb, AJ_LN2), ""), "");
}

/* Element `head` (i32) of a descale (f32), its stride a parameter. */
static LLVMValueRef load_descale(aj_kb *kb, aj_param_id ptr, aj_param_id stride,
                                 LLVMValueRef head)
{
    LLVMValueRef at = LLVMBuildMul(kb->b, aj_kb_sext64(kb, head), aj_param(kb, stride), "");
    return aj_kb_load(kb, kb->t_f32,
                      aj_kb_gptr_offset(kb, aj_param(kb, ptr),
                                        LLVMBuildShl(kb->b, at, aj_kb_i64(kb, 2), "")),
                      4);
}

void aj_attn_descales(aj_kb *kb, const aj_op *op, LLVMValueRef h, LLVMValueRef hkv,
                      LLVMValueRef *score, LLVMValueRef *out)
{
    *score = *out = NULL;
    if (aj_op_q_dtype(op) >= AJ_DTYPE_F8E4M3)
        *score = load_descale(kb, AJ_PID(q_scale), AJ_PID(stride_q_scale), h);
    if (aj_op_kv_dtype(op) < AJ_DTYPE_F8E4M3)
        return;
    LLVMValueRef k = load_descale(kb, AJ_PID(k_scale), AJ_PID(stride_k_scale), hkv);
    *score = *score ? LLVMBuildFMul(kb->b, *score, k, "") : k;
    *out = load_descale(kb, AJ_PID(v_scale), AJ_PID(stride_v_scale), hkv);
}
