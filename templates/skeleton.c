/*
 * skeleton.c -- the steps every attention template takes the same way
 * (skeleton.h).
 */
#include "templates/skeleton.h"

aj_status aj_kctx_programs(aj_kb *kb, const aj_op *op, const aj_score_prog **out)
{
    return aj_score_prog_scratch(kb, op, out);
}

void aj_kctx_dropout(aj_kctx *k, LLVMValueRef bidx, LLVMValueRef h)
{
    aj_kb *kb = k->kb;
    if (k->op->dropout > 0)
        k->drop = aj_attn_dropout_stream(
            kb, aj_param(kb, AJ_PID(dropout_seed)), aj_param(kb, AJ_PID(dropout_offset)),
            aj_param(kb, AJ_PID(q_offset)), aj_param(kb, AJ_PID(kv_offset)), bidx, h);
}

void aj_kctx_set_head(aj_kctx *k, LLVMValueRef bidx, LLVMValueRef h, LLVMValueRef sq,
                      LLVMValueRef sk)
{
    aj_kb *kb = k->kb;
    aj_score_begin(&k->sc, kb, k->prog, 0, bidx, h, aj_param(kb, AJ_PID(q_offset)),
                   aj_param(kb, AJ_PID(kv_offset)), sq, sk);
    if (k->op->bias == AJ_BIAS_ADD)
        k->bias_base = aj_attn_slice_base(kb, AJ_PSRC_bias, bidx, h);
    aj_kctx_dropout(k, bidx, h);
}
