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

/* P = exp2(s2 - lse2) where visible, dropped P m for dV, and
 * dS = P (dP m - Delta) times the score_mod's derivative `chain` (NULL: 1;
 * 0 where hidden, whatever the derivative is there). */
static void p_ds_from_score(aj_kb *kb, const aj_op *op, LLVMValueRef s2, LLVMValueRef dp,
                            LLVMValueRef lse2, LLVMValueRef delta, LLVMValueRef visible,
                            LLVMValueRef keep, LLVMValueRef chain, LLVMValueRef *p_out,
                            LLVMValueRef *ds_out)
{
    LLVMBuilderRef b = kb->b;
    /* hidden elements never reach the exp: a row without keys has
     * LSE = -inf and would give -inf - -inf */
    LLVMValueRef pr = aj_kb_exp2(kb, LLVMBuildFSub(b, s2, lse2, ""));
    pr = LLVMBuildSelect(b, visible, pr, aj_kb_f32(kb, 0), "");
    LLVMValueRef pd = pr;
    if (keep) {   /* m = keep / (1 - p) scales P for dV and dO . v for dP */
        LLVMValueRef inv = aj_kb_f32(kb, 1.0 / (1.0 - op->dropout)), zero = aj_kb_f32(kb, 0);
        pd = LLVMBuildSelect(b, keep, LLVMBuildFMul(b, pr, inv, ""), zero, "");
        dp = LLVMBuildSelect(b, keep, LLVMBuildFMul(b, dp, inv, ""), zero, "");
    }
    LLVMValueRef ds = LLVMBuildFMul(b, pr, LLVMBuildFSub(b, dp, delta, ""), "");
    if (chain)
        ds = LLVMBuildSelect(b, visible, LLVMBuildFMul(b, ds, chain, ""), aj_kb_f32(kb, 0), "");
    *p_out = pd;
    *ds_out = ds;
}

void aj_attn_bwd_p_ds_prog(aj_kb *kb, const aj_op *op, aj_score *sc, LLVMValueRef qk,
                           LLVMValueRef dp, LLVMValueRef i, LLVMValueRef j, LLVMValueRef lse2,
                           LLVMValueRef delta, LLVMValueRef visible, LLVMValueRef bias,
                           LLVMValueRef keep, LLVMValueRef *p_out, LLVMValueRef *ds_out)
{
    LLVMBuilderRef b = kb->b;
    double scale = aj_op_scale(op);
    LLVMValueRef s2, dmod = NULL;
    if (!aj_score_has_mod(sc->p) && !bias) {
        s2 = LLVMBuildFMul(b, qk, aj_kb_f32(kb, scale * AJ_LOG2E), "");
    } else {
        LLVMValueRef t = LLVMBuildFMul(b, qk, aj_kb_f32(kb, scale), "");
        if (bias)   /* t = scale q.k + bias, before the score_mod */
            t = LLVMBuildFAdd(b, t, bias, "");
        LLVMValueRef s = aj_score_has_mod(sc->p) ? aj_score_mod_grad(sc, t, i, j, &dmod) : t;
        s2 = LLVMBuildFMul(b, s, aj_kb_f32(kb, AJ_LOG2E), "");
    }
    p_ds_from_score(kb, op, s2, dp, lse2, delta, visible, keep, dmod, p_out, ds_out);
}
