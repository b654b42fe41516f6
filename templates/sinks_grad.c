/*
 * sinks_grad.c -- the gradient of learned sinks (docs/design.md "Sinks"),
 * the last stage of a backward kernel whose op has them.
 *
 * The forward's softmax over a row's keys and its sink s_h has the sink's
 * probability P_sink = exp(s_h - LSE) (LSE includes the sink); the
 * sink's value is 0, so
 *
 *     dL/ds_h = - sum over the rows (b, i) of head h of  P_sink(b, i) D(b, i),
 *     D(b, i) = dO(b, h, i) . O(b, h, i)
 *
 * (the backward's Delta).  One CTA (cpu: one work item) per query head
 * walks every row of the head: thread t takes rows t, t + T, ... in order,
 * then the T partial sums are added by a fixed tree in shared memory, so
 * the result is bitwise the same every run, without atomics.  Rows whose
 * LSE is -inf (no key and a sink of -inf) add 0.  dsinks[h] is the
 * gradient of the sink of global head head_offset + h.
 *
 *   grid = (1, Hq, 1)
 */
#include <math.h>

#include "templates/attn_common.h"
#include "templates/cpu_attn.h"
#include "templates/grad_tail.h"

#define SIMT_THREADS 128

LLVMValueRef aj_tail_exp(aj_kb *kb, LLVMValueRef x)
{
    LLVMValueRef x2 = LLVMBuildFMul(kb->b, x, aj_kb_f32(kb, AJ_LOG2E), "");
    return kb->desc->simt ? aj_kb_exp2(kb, x2) : aj_kb_call_overloaded(kb, "llvm.exp2", &x2, 1);
}

LLVMValueRef aj_tail_load(aj_kb *kb, aj_param_source t, aj_dtype dtype, LLVMValueRef at)
{
    int size = aj_dtype_size(dtype);
    if (!kb->desc->simt)   /* the cpu's own widening (cpu_vec.h), one lane */
        return LLVMBuildExtractElement(kb->b,
                                       aj_cv_load(kb, aj_cpu_tensor_at(kb, t, dtype, at), dtype, 1),
                                       aj_kb_i32(kb, 0), "");
    LLVMValueRef ptr = aj_kb_gptr_offset(kb, aj_param_data(kb, t),
                                         LLVMBuildMul(kb->b, at, aj_kb_i64(kb, size), ""));
    return aj_kb_to_f32(kb, aj_kb_load(kb, aj_kb_storage_type(kb, dtype), ptr, (unsigned)size),
                        dtype);
}

LLVMValueRef aj_tail_row_dot(aj_kb *kb, aj_param_source a, LLVMValueRef row_a,
                             aj_param_source b_, LLVMValueRef row_b, int n, aj_dtype dtype)
{
    LLVMBuilderRef b = kb->b;
    /* cpu: 8 columns at a time where n allows (the cpu's loads widen) */
    int vw = !kb->desc->simt && n % 8 == 0 ? 8 : 1;
    LLVMTypeRef acc_t = vw > 1 ? aj_cv_type(kb, vw) : kb->t_f32;
    LLVMValueRef dot = aj_kb_var(kb, acc_t, LLVMConstNull(acc_t), "dot");
    LLVMValueRef d = aj_kb_for_begin(kb, aj_kb_i64(kb, 0), aj_kb_i64(kb, n), aj_kb_i64(kb, vw),
                                     "d");
    LLVMValueRef x, y;
    if (vw > 1) {
        x = aj_cv_load(kb, aj_cpu_tensor_at(kb, a, dtype, LLVMBuildAdd(b, row_a, d, "")), dtype,
                       vw);
        y = aj_cv_load(kb, aj_cpu_tensor_at(kb, b_, dtype, LLVMBuildAdd(b, row_b, d, "")),
                       dtype, vw);
    } else {
        x = aj_tail_load(kb, a, dtype, LLVMBuildAdd(b, row_a, d, ""));
        y = aj_tail_load(kb, b_, dtype, LLVMBuildAdd(b, row_b, d, ""));
    }
    aj_kb_set(kb, dot, LLVMBuildFAdd(b, aj_kb_get(kb, dot), LLVMBuildFMul(b, x, y, ""), ""));
    aj_kb_for_end(kb);
    return vw > 1 ? aj_cv_hsum(kb, aj_kb_get(kb, dot), vw) : aj_kb_get(kb, dot);
}

/* P_sink D of row i of (b, h) */
static LLVMValueRef row_term(aj_kb *kb, const aj_op *op, LLVMValueRef bidx, LLVMValueRef h,
                             LLVMValueRef i, LLVMValueRef sink)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef orow = LLVMBuildAdd(b, aj_attn_slice_base(kb, AJ_PSRC_o, bidx, h),
                                     LLVMBuildMul(b, i, aj_param_stride_s(kb, AJ_PSRC_o), ""), "");
    LLVMValueRef drow = LLVMBuildAdd(b, aj_attn_slice_base(kb, AJ_PSRC_do, bidx, h),
                                     LLVMBuildMul(b, i, aj_param_stride_s(kb, AJ_PSRC_do), ""),
                                     "");
    LLVMValueRef dsum = aj_tail_row_dot(kb, AJ_PSRC_o, orow, AJ_PSRC_do, drow, aj_op_dv(op),
                                        op->dtype);
    LLVMValueRef lse = aj_tail_load(kb, AJ_PSRC_lse, AJ_DTYPE_F32,
                                    LLVMBuildAdd(b, aj_attn_slice_base(kb, AJ_PSRC_lse, bidx, h),
                                                 i, ""));
    LLVMValueRef empty = LLVMBuildFCmp(b, LLVMRealOEQ, lse, aj_kb_f32(kb, -INFINITY), "");
    LLVMValueRef p = aj_tail_exp(kb, LLVMBuildFSub(b, sink, lse, ""));
    return LLVMBuildSelect(b, empty, aj_kb_f32(kb, 0), LLVMBuildFMul(b, p, dsum, ""), "");
}

void aj_sinks_grad_build(aj_kb *kb, const aj_op *op, const aj_score_prog *prog)
{
    LLVMBuilderRef b = kb->b;
    const int simt = kb->desc->simt;
    const int threads = simt ? SIMT_THREADS : 1;
    aj_params_declare(kb, AJ_KSIG_SINKS_GRAD, op, prog);
    aj_kb_begin_stage(kb, "dsinks", threads);
    LLVMValueRef tid, h;
    if (simt) {
        tid = aj_kb_thread_id(kb);
        h = aj_kb_block_id(kb, 1);
    } else {
        tid = aj_kb_i32(kb, 0);
        h = aj_kb_item_id(kb, 1);
    }
    LLVMValueRef h64 = LLVMBuildSExt(b, h, kb->t_i64, "");
    LLVMValueRef hg = LLVMBuildAdd(b, h64, LLVMBuildSExt(b, aj_param(kb, AJ_PID(head_offset)),
                                                        kb->t_i64, ""), "");
    LLVMValueRef sink = aj_score_sink(kb, prog, hg);
    /* varlen: one packed row space (the view's batch stride is 0) */
    LLVMValueRef nb = op->layout == AJ_LAYOUT_VARLEN
                          ? aj_kb_i64(kb, 1)
                          : LLVMBuildSExt(b, aj_param(kb, AJ_PID(batch)), kb->t_i64, "");
    LLVMValueRef ns = LLVMBuildSExt(b, aj_param(kb, AJ_PID(tokens_q)), kb->t_i64, "");
    LLVMValueRef acc = aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, 0), "acc");
    LLVMValueRef r = aj_kb_for_begin(kb, LLVMBuildSExt(b, tid, kb->t_i64, ""),
                                     LLVMBuildMul(b, nb, ns, ""), aj_kb_i64(kb, threads), "r");
    {
        LLVMValueRef bidx = LLVMBuildSDiv(b, r, ns, ""), i = LLVMBuildSRem(b, r, ns, "");
        aj_kb_set(kb, acc, LLVMBuildFAdd(b, aj_kb_get(kb, acc),
                                         row_term(kb, op, bidx, h64, i, sink), ""));
    }
    aj_kb_for_end(kb);
    LLVMValueRef total = aj_kb_get(kb, acc);
    if (simt) {
        int32_t red = aj_kb_smem_reserve(kb, 4 * threads);
        LLVMValueRef mine = aj_kb_smem_ptr(kb, LLVMBuildAdd(b, aj_kb_i32(kb, red),
                                           LLVMBuildShl(b, tid, aj_kb_i32(kb, 2), ""), ""));
        aj_kb_store(kb, total, mine, 4);
        aj_kb_barrier(kb);
        for (int s = threads / 2; s >= 1; s /= 2) {
            aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntULT, tid, aj_kb_i32(kb, s), ""));
            LLVMValueRef other = aj_kb_smem_ptr(
                kb, LLVMBuildAdd(b, aj_kb_i32(kb, red),
                                 LLVMBuildShl(b, LLVMBuildAdd(b, tid, aj_kb_i32(kb, s), ""),
                                              aj_kb_i32(kb, 2), ""), ""));
            aj_kb_store(kb, LLVMBuildFAdd(b, aj_kb_load(kb, kb->t_f32, mine, 4),
                                          aj_kb_load(kb, kb->t_f32, other, 4), ""), mine, 4);
            aj_kb_if_end(kb);
            aj_kb_barrier(kb);
        }
        total = aj_kb_load(kb, kb->t_f32, mine, 4);
    }
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, tid, aj_kb_i32(kb, 0), ""));
    LLVMValueRef at = LLVMBuildMul(b, h64, aj_param(kb, AJ_PID(stride_dsinks)), "");
    aj_kb_store(kb, LLVMBuildFNeg(b, total, ""),
                aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(dsinks)),
                                  LLVMBuildShl(b, at, aj_kb_i64(kb, 2), "")), 4);
    aj_kb_if_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_ONE, 1}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_ONE, 1}},
        .schedule = {threads, aj_op_dv(op), simt ? threads / 32 : 1, 1},
    };
    aj_kb_finish(kb, &layout);
}

int aj_grad_tail_sigs(const aj_op *op, aj_target target, aj_kernel_sig *sigs)
{
    int n = 0;
    if (op->kind != AJ_KIND_BACKWARD)
        return 0;
    if (op->sinks)
        sigs[n++] = AJ_KSIG_SINKS_GRAD;
    if (op->tensor_grad) {
        if (target != AJ_TARGET_CPU)   /* the cpu's parts are its dq stage's */
            sigs[n++] = AJ_KSIG_SIDE_GRAD;
        sigs[n++] = AJ_KSIG_SIDE_GRAD_SUM;
    }
    return n;
}

void aj_grad_tail_build(aj_kb *kb, const aj_op *op, const aj_score_prog *prog)
{
    if (aj_score_has_sinks(prog))
        aj_sinks_grad_build(kb, op, prog);
    if (prog->tensor_grad)
        aj_side_grad_build(kb, op, prog);
}
