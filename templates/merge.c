/*
 * merge.c -- the merge kernel: two partial results over disjoint key sets,
 * (O1, LSE1) and (O2, LSE2), become one (docs/design.md "Merge of two partials"):
 *
 *     LSE = logaddexp(LSE1, LSE2)
 *     O   = O1 exp(LSE1 - LSE) + O2 exp(LSE2 - LSE)
 *
 * both -inf giving O = 0 and LSE = -inf, a side at -inf contributing
 * nothing whatever its O holds (never 0 * NaN).
 *
 *   grid  = (ceil(S / R), H, B)       block = 128 threads
 *
 * Threads form R = 128 / G row groups of G lanes; group g owns row
 * m0 + g, and lane l of it the 4-wide column chunks 4l, 4l + 4G, ...:
 *
 *            cols (Dv) ──►
 *   row g0 │ l0:4 l1:4 .. lG-1:4 l0:4 ..│
 *   row g1 │ ...                        │
 *
 * Lane 0 of a group reads the two LSEs and hands them to its lanes with a
 * group sum (the others add 0, exactly); every read of the row thus comes
 * before lane 0 writes LSE, so lse may be lse1 or lse2 (in place).  Each
 * element of O is read and written by one thread, so o may be o1 or o2.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/template.h"
#include "templates/tile_io.h"

#define MERGE_THREADS 128
#define MERGE_MAX_DV 1024

static aj_status merge_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    (void)target;
    return aj_row_width_check(ctx, op, MERGE_MAX_DV, "merge supports");
}

/* f32 pointer to lse tensor t at element offset `at` */
static LLVMValueRef lse_ptr(aj_kb *kb, aj_param_source t, LLVMValueRef at)
{
    return aj_kb_gptr_offset(kb, aj_param_data(kb, t), LLVMBuildMul(kb->b, at, aj_kb_i64(kb, 4),
                                                                      ""));
}

/* w * x, or 0 where w is 0 (x may then be anything, NaN included) */
static LLVMValueRef weigh(aj_kb *kb, LLVMValueRef w, LLVMValueRef x)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef zero = aj_kb_f32(kb, 0);
    LLVMValueRef w_zero = LLVMBuildFCmp(b, LLVMRealOEQ, w, zero, "");
    return LLVMBuildSelect(b, w_zero, zero, LLVMBuildFMul(b, w, x, ""), "");
}

static aj_status merge_build(aj_kb *kb, const aj_op *op, void *user)
{
    (void)user;
    LLVMBuilderRef b = kb->b;
    int dv = aj_op_dv(op);
    int g = aj_row_group_lanes(dv);
    int rows = MERGE_THREADS / g;
    aj_params_declare(kb, AJ_KSIG_MERGE, op, NULL);
    aj_kb_begin(kb, MERGE_THREADS);

    LLVMValueRef tid = aj_kb_thread_id(kb);
    LLVMValueRef lane = LLVMBuildAnd(b, tid, aj_kb_i32(kb, g - 1), "lane");
    LLVMValueRef group = LLVMBuildUDiv(b, tid, aj_kb_i32(kb, g), "group");
    LLVMValueRef h = aj_kb_block_id(kb, 1);
    LLVMValueRef bidx = aj_kb_block_id(kb, 2);
    LLVMValueRef seq = aj_param(kb, AJ_PID(seq_q));
    LLVMValueRef row = LLVMBuildAdd(b, LLVMBuildMul(b, aj_kb_block_id(kb, 0),
                                    aj_kb_i32(kb, rows), ""), group, "row");
    /* rows past S read the last row (in bounds) and store nothing; every
     * lane still takes part in the group sums */
    LLVMValueRef rc = aj_kb_smin(kb, row, LLVMBuildSub(b, seq, aj_kb_i32(kb, 1), ""));
    LLVMValueRef is_lane0 = LLVMBuildICmp(b, LLVMIntEQ, lane, aj_kb_i32(kb, 0), "");
    LLVMValueRef zero = aj_kb_f32(kb, 0), ninf = aj_kb_f32(kb, -INFINITY);

    /* LSEs in log2 units, broadcast from lane 0 */
    LLVMValueRef l2[2];
    static const aj_param_source lse_in[2] = {AJ_PSRC_lse1, AJ_PSRC_lse2};
    for (int s = 0; s < 2; s++) {
        LLVMValueRef at = aj_row_offset(kb, lse_in[s], bidx, h, rc, 0);
        LLVMValueRef v = aj_kb_load(kb, kb->t_f32, lse_ptr(kb, lse_in[s], at), 4);
        v = aj_kb_group_sum(kb, LLVMBuildSelect(b, is_lane0, v, zero, ""), g);
        l2[s] = LLVMBuildFMul(b, v, aj_kb_f32(kb, AJ_LOG2E), "");
    }
    /* L = max + log2(2^(L1 - max) + 2^(L2 - max)); with both -inf the
     * max is taken as 0, so that both weights are exactly 0 */
    LLVMValueRef mx = aj_kb_fmax(kb, l2[0], l2[1]);
    LLVMValueRef none = LLVMBuildFCmp(b, LLVMRealOEQ, mx, ninf, "");
    LLVMValueRef mx_use = LLVMBuildSelect(b, none, zero, mx, "");
    LLVMValueRef sum = LLVMBuildFAdd(b, aj_kb_exp2(kb, LLVMBuildFSub(b, l2[0], mx_use, "")),
                                     aj_kb_exp2(kb, LLVMBuildFSub(b, l2[1], mx_use, "")), "");
    LLVMValueRef l = LLVMBuildFAdd(b, mx_use, aj_kb_log2(kb, sum), "");
    LLVMValueRef l_use = LLVMBuildSelect(b, none, zero, l, "");
    LLVMValueRef w1 = aj_kb_exp2(kb, LLVMBuildFSub(b, l2[0], l_use, ""));
    LLVMValueRef w2 = aj_kb_exp2(kb, LLVMBuildFSub(b, l2[1], l_use, ""));
    LLVMValueRef lse = LLVMBuildSelect(b, none, ninf,
                                       LLVMBuildFMul(b, l, aj_kb_f32(kb, AJ_LN2), ""), "");

    LLVMValueRef o1 = aj_row_offset(kb, AJ_PSRC_o1, bidx, h, rc, 1);
    LLVMValueRef o2 = aj_row_offset(kb, AJ_PSRC_o2, bidx, h, rc, 1);
    LLVMValueRef o = aj_row_offset(kb, AJ_PSRC_o, bidx, h, rc, 1);
    LLVMValueRef lane_col = aj_kb_sext64(kb, LLVMBuildShl(b, lane, aj_kb_i32(kb, 2), ""));
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, row, seq, ""));
    for (int u = 0; u < dv / (4 * g); u++) {
        LLVMValueRef col = LLVMBuildAdd(b, lane_col, aj_kb_i64(kb, 4 * g * u), "");
        LLVMValueRef x1 = aj_global_load4(kb, aj_param(kb, AJ_PID(o1)),
                                          LLVMBuildAdd(b, o1, col, ""), op->dtype);
        LLVMValueRef x2 = aj_global_load4(kb, aj_param(kb, AJ_PID(o2)),
                                          LLVMBuildAdd(b, o2, col, ""), op->dtype);
        LLVMValueRef vals[4];
        for (int x = 0; x < 4; x++) {
            LLVMValueRef idx = aj_kb_i32(kb, x);
            vals[x] = LLVMBuildFAdd(b, weigh(kb, w1, LLVMBuildExtractElement(b, x1, idx, "")),
                                    weigh(kb, w2, LLVMBuildExtractElement(b, x2, idx, "")), "");
        }
        aj_global_store4(kb, aj_param(kb, AJ_PID(o)), LLVMBuildAdd(b, o, col, ""), vals, op->dtype);
    }
    aj_kb_if_begin(kb, is_lane0);
    aj_kb_store(kb, lse, lse_ptr(kb, AJ_PSRC_lse, aj_row_offset(kb, AJ_PSRC_lse, bidx, h, rc, 0)), 4);
    aj_kb_if_end(kb);
    aj_kb_if_end(kb);
    /* block_n: the columns a row group covers */
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, rows}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {rows, dv, MERGE_THREADS / 32, 1},
    };
    aj_kb_finish(kb, &layout);
    return kb->st;
}

AJ_TEMPLATE(aj_template_merge, "merge", AJ_KIND_MERGE, AJ_VARIANT_NONE, merge_check, merge_build,
            .stage_sigs = {AJ_KSIG_MERGE});
