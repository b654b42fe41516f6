/*
 * skeleton.c -- the steps every attention template takes the same way
 * (skeleton.h).
 */
#include "templates/skeleton.h"

aj_status aj_kctx_programs(aj_kb *kb, const aj_op *op, const aj_score_prog **out)
{
    return aj_score_prog_scratch(kb, op, out);
}

void aj_kctx_sequence(aj_kctx *k, LLVMValueRef bidx, LLVMValueRef *q_start,
                      LLVMValueRef *k_start)
{
    aj_kb *kb = k->kb;
    if (k->op->layout == AJ_LAYOUT_VARLEN) {
        aj_attn_varlen_seq seq;
        aj_attn_varlen_seq_of(kb, bidx, &seq);
        k->seq_q = seq.len_q, k->seq_k = seq.len_k;
        *q_start = seq.start_q, *k_start = seq.start_k;
        return;
    }
    k->seq_q = aj_param(kb, AJ_PID(seq_q));
    k->seq_k = aj_param(kb, AJ_PID(seq_k));
    *q_start = *k_start = aj_kb_i64(kb, 0);
}

void aj_kctx_dropout(aj_kctx *k, LLVMValueRef bidx, LLVMValueRef h)
{
    aj_kb *kb = k->kb;
    if (k->op->dropout > 0)
        k->drop = aj_attn_dropout_stream(
            kb, aj_param(kb, AJ_PID(dropout_seed)), aj_param(kb, AJ_PID(dropout_offset)),
            aj_param(kb, AJ_PID(q_offset)), aj_param(kb, AJ_PID(kv_offset)), bidx, h);
}

LLVMValueRef aj_kctx_bias_at(const aj_kctx *k, LLVMValueRef i, LLVMValueRef j)
{
    aj_kb *kb = k->kb;
    LLVMBuilderRef b = k->b;
    aj_dtype dt = k->op->dtype;
    if (k->op->bias != AJ_BIAS_ADD)
        return NULL;
    LLVMValueRef ic = aj_kb_smin(kb, i, LLVMBuildSub(b, k->seq_q, aj_kb_i32(kb, 1), ""));
    LLVMValueRef jc = aj_kb_smin(kb, j, LLVMBuildSub(b, k->seq_k, aj_kb_i32(kb, 1), ""));
    LLVMValueRef at = LLVMBuildAdd(
        b, k->bias_base,
        LLVMBuildMul(b, aj_kb_sext64(kb, ic), aj_param(kb, AJ_PID(stride_bias_s)), ""), "");
    at = LLVMBuildAdd(b, at, aj_kb_sext64(kb, jc), "");
    at = LLVMBuildMul(b, at, aj_kb_i64(kb, aj_dtype_size(dt)), "");
    LLVMValueRef raw = aj_kb_load(kb, aj_kb_storage_type(kb, dt),
                                  aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(bias)), at),
                                  (unsigned)aj_dtype_size(dt));
    return aj_kb_to_f32(kb, raw, dt);
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
