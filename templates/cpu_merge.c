/*
 * cpu_merge.c -- the merge kernel of the cpu target: two partial results
 * over disjoint key sets become one (docs/design.md "Merge of two partials"):
 *
 *     LSE = logaddexp(LSE1, LSE2)
 *     O   = O1 exp(LSE1 - LSE) + O2 exp(LSE2 - LSE)
 *
 * both -inf giving O = 0 and LSE = -inf, a side at -inf contributing
 * nothing whatever its O holds (a select, never 0 * NaN).
 *
 *   grid = (ceil(S / ROWS), H, B)     one host thread per item
 *
 * An item walks its rows; each row's two LSEs are read before anything of
 * the row is written and each O chunk is read before it is written, so o
 * may be o1 or o2 and lse may be lse1 or lse2 (in place).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/cpu_attn.h"
#include "templates/template.h"

#define ROWS 64

static aj_status cmerge_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    /* the verifier bounds head_dim_v by 1024; rows are loaded 8 at a time */
    int dv = aj_op_dv(op);
    if (dv % 8 != 0)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "head_dim_v = %d: the cpu merge supports multiples of 8", dv);
    return AJ_OK;
}

/* &t[base + i] of an f32 tensor (lse), and the element offset of row i of
 * an O tensor */
static LLVMValueRef lse_at(aj_kb *kb, aj_param_source t, LLVMValueRef b, LLVMValueRef h,
                           LLVMValueRef i)
{
    return aj_cv_at(kb, kb->t_f32, aj_param_data(kb, t), LLVMBuildAdd(kb->b,
                    aj_attn_slice_base(kb, t, b, h), i, ""));
}

static LLVMValueRef o_row(aj_kb *kb, aj_param_source t, LLVMValueRef b, LLVMValueRef h,
                          LLVMValueRef i)
{
    return LLVMBuildAdd(kb->b, aj_attn_slice_base(kb, t, b, h),
                        LLVMBuildMul(kb->b, i, aj_param_stride(kb, t, 2), ""), "");
}

static aj_status cmerge_build(aj_kb *kb, const aj_op *op, void *user)
{
    LLVMBuilderRef b = kb->b;
    int dv = aj_op_dv(op);
    int w = aj_cpu_vector_width();
    int vw = dv % w == 0 ? w : 8;
    aj_params_declare(kb, AJ_KSIG_MERGE, op, NULL);
    aj_kb_begin(kb, 1);
    LLVMValueRef it[3];
    for (int d = 0; d < 3; d++)
        it[d] = aj_kb_item_id(kb, d);
    LLVMValueRef h = it[1], bidx = it[2];
    LLVMValueRef m0 = LLVMBuildMul(b, it[0], aj_kb_i32(kb, ROWS), "");
    LLVMValueRef end = aj_kb_smin(kb, LLVMBuildAdd(b, m0, aj_kb_i32(kb, ROWS), ""),
                                  aj_param(kb, AJ_PID(seq_q)));
    LLVMValueRef i = aj_kb_for_begin(kb, m0, end, aj_kb_i32(kb, 1), "row");
    {
        LLVMValueRef i64 = LLVMBuildSExt(b, i, kb->t_i64, "");
        LLVMValueRef p1 = lse_at(kb, AJ_PSRC_lse1, bidx, h, i64);
        LLVMValueRef p2 = lse_at(kb, AJ_PSRC_lse2, bidx, h, i64);
        LLVMValueRef l1 = LLVMBuildFMul(b, LLVMBuildLoad2(b, kb->t_f32, p1, ""),
                                        aj_kb_f32(kb, AJ_LOG2E), "");
        LLVMValueRef l2 = LLVMBuildFMul(b, LLVMBuildLoad2(b, kb->t_f32, p2, ""),
                                        aj_kb_f32(kb, AJ_LOG2E), "");
        LLVMValueRef ninf = aj_kb_f32(kb, -INFINITY);
        LLVMValueRef w1, w2, l, none;
        aj_cpu_merge_weights(kb, l1, l2, &w1, &w2, &l, &none);
        LLVMValueRef zero1 = LLVMBuildFCmp(b, LLVMRealOEQ, w1, aj_kb_f32(kb, 0), "");
        LLVMValueRef zero2 = LLVMBuildFCmp(b, LLVMRealOEQ, w2, aj_kb_f32(kb, 0), "");
        LLVMValueRef r1 = o_row(kb, AJ_PSRC_o1, bidx, h, i64);
        LLVMValueRef r2 = o_row(kb, AJ_PSRC_o2, bidx, h, i64);
        LLVMValueRef r = o_row(kb, AJ_PSRC_o, bidx, h, i64);
        LLVMValueRef zv = LLVMConstNull(aj_cv_type(kb, vw));
        for (int c = 0; c < dv; c += vw) {
            LLVMValueRef col = aj_kb_i64(kb, c);
            LLVMValueRef a = aj_cv_load(kb, aj_cpu_tensor_at(kb, AJ_PSRC_o1, op->dtype,
                                        LLVMBuildAdd(b, r1, col, "")), op->dtype, vw);
            LLVMValueRef x = aj_cv_load(kb, aj_cpu_tensor_at(kb, AJ_PSRC_o2, op->dtype,
                                        LLVMBuildAdd(b, r2, col, "")), op->dtype, vw);
            a = LLVMBuildSelect(b, zero1, zv, LLVMBuildFMul(b, a, aj_cv_splat(kb, w1, vw), ""),
                                "");
            x = LLVMBuildSelect(b, zero2, zv, LLVMBuildFMul(b, x, aj_cv_splat(kb, w2, vw), ""),
                                "");
            aj_cv_store(kb, LLVMBuildFAdd(b, a, x, ""), aj_cpu_tensor_at(kb, AJ_PSRC_o, op->dtype,
                        LLVMBuildAdd(b, r, col, "")), op->dtype, vw);
        }
        LLVMBuildStore(b, LLVMBuildSelect(b, none, ninf, LLVMBuildFMul(b, l,
                       aj_kb_f32(kb, AJ_LN2), ""), ""), lse_at(kb, AJ_PSRC_lse, bidx, h, i64));
    }
    aj_kb_for_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, ROWS}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {ROWS, dv, 1, 1},
    };
    aj_kb_finish(kb, &layout);
    return kb->st;
}

AJ_TEMPLATE(aj_template_cpu_merge, "cpu_merge", AJ_KIND_MERGE, AJ_VARIANT_NONE, cmerge_check,
            cmerge_build, .targets = 1u << AJ_TARGET_CPU, .stage_sigs = {AJ_KSIG_MERGE});
