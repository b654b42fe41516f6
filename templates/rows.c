/*
 * rows.c -- the row kernels the context-parallel methods run on a GPU to
 * keep their sums in device memory (cp/ring.c, docs/ring.md "Devices and
 * the NCCL engine"): between a typed tensor `o` and an f32 accumulator
 * `o_acc` of the same [B, H, S, W] rows (any strides), with the op's dtype
 * and W = head_dim_v.  One stage each (aj_rows_stage, runtime.h), run by
 * aj_rows_launch (runtime/launch.c) on the row views the ring passes:
 *
 *   round_masked   o = round(o_acc), or 0 where lse = -inf (a row that saw
 *                  no key: the forward's O, whatever the accumulator holds)
 *   round          o = round(o_acc)             (dQ, dK, dV at the end)
 *   add            o_acc += o                   (a launch's gradient part)
 *   store          o_acc = o                    (the first part of a row)
 *   zero           o_acc = 0                    (rows no launch wrote)
 *
 *   grid  = (ceil(S / R), H, B)       block = 128 threads
 *
 * as the merge kernel (merge.c): R = 128 / G row groups of G lanes, lane l
 * of a group taking the 4-wide column chunks 4l, 4l + 4G, ... of its row.
 * Each element is read and written by one thread.  The stages that do not
 * read lse are bound with it all the same (runtime/launch.c passes the
 * accumulator's view), as every stage shares one parameter list.
 */
#include <math.h>

#include "templates/template.h"
#include "templates/tile_io.h"

#define ROWS_THREADS 128
#define ROWS_MAX_W 1024

static aj_status rows_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    (void)target;
    return aj_row_width_check(ctx, op, ROWS_MAX_W, "the row kernels take");
}

static const char *const stage_names[AJ_ROWS_STAGE_COUNT] = {
    [AJ_ROWS_ROUND_MASKED] = "round_masked", [AJ_ROWS_ROUND] = "round",
    [AJ_ROWS_ADD] = "add", [AJ_ROWS_STORE] = "store", [AJ_ROWS_ZERO] = "zero"};

static void build_stage(aj_kb *kb, const aj_op *op, aj_rows_stage stage)
{
    LLVMBuilderRef b = kb->b;
    const int w = aj_op_dv(op), g = aj_row_group_lanes(w), rows = ROWS_THREADS / g;
    aj_params_declare(kb, AJ_KSIG_ROWS, op, NULL);
    aj_kb_begin_stage(kb, stage_names[stage], ROWS_THREADS);

    LLVMValueRef tid = aj_kb_thread_id(kb);
    LLVMValueRef lane = LLVMBuildAnd(b, tid, aj_kb_i32(kb, g - 1), "lane");
    LLVMValueRef group = LLVMBuildUDiv(b, tid, aj_kb_i32(kb, g), "group");
    LLVMValueRef h = aj_kb_block_id(kb, 1);
    LLVMValueRef bidx = aj_kb_block_id(kb, 2);
    LLVMValueRef row = LLVMBuildAdd(b, LLVMBuildMul(b, aj_kb_block_id(kb, 0),
                                    aj_kb_i32(kb, rows), ""), group, "row");
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, row, aj_param(kb, AJ_PID(seq_q)), ""));
    LLVMValueRef keep = NULL;   /* round_masked: the row saw a key */
    if (stage == AJ_ROWS_ROUND_MASKED) {
        LLVMValueRef at = aj_row_offset(kb, AJ_PSRC_lse, bidx, h, row, 0);
        LLVMValueRef lse = aj_kb_load(
            kb, kb->t_f32,
            aj_kb_gptr_offset(kb, aj_param_data(kb, AJ_PSRC_lse),
                              LLVMBuildMul(b, at, aj_kb_i64(kb, 4), "")), 4);
        keep = LLVMBuildFCmp(b, LLVMRealONE, lse, aj_kb_f32(kb, -INFINITY), "seen");
    }
    LLVMValueRef o = aj_row_offset(kb, AJ_PSRC_o, bidx, h, row, 1);
    LLVMValueRef acc = aj_row_offset(kb, AJ_PSRC_o_acc, bidx, h, row, 1);
    LLVMValueRef o_ptr = aj_param(kb, AJ_PID(o)), acc_ptr = aj_param(kb, AJ_PID(o_acc));
    LLVMValueRef lane_col = aj_kb_sext64(kb, LLVMBuildShl(b, lane, aj_kb_i32(kb, 2), ""));
    for (int u = 0; u < w / (4 * g); u++) {
        LLVMValueRef col = LLVMBuildAdd(b, lane_col, aj_kb_i64(kb, 4 * g * u), "");
        LLVMValueRef at_o = LLVMBuildAdd(b, o, col, ""), at_acc = LLVMBuildAdd(b, acc, col, "");
        LLVMValueRef vals[4];
        LLVMValueRef x = NULL, y = NULL;
        if (stage == AJ_ROWS_ROUND_MASKED || stage == AJ_ROWS_ROUND || stage == AJ_ROWS_ADD)
            x = aj_global_load4(kb, acc_ptr, at_acc, AJ_DTYPE_F32);
        if (stage == AJ_ROWS_ADD || stage == AJ_ROWS_STORE)
            y = aj_global_load4(kb, o_ptr, at_o, op->dtype);
        for (int e = 0; e < 4; e++) {
            LLVMValueRef idx = aj_kb_i32(kb, e);
            LLVMValueRef xe = x ? LLVMBuildExtractElement(b, x, idx, "") : NULL;
            LLVMValueRef ye = y ? LLVMBuildExtractElement(b, y, idx, "") : NULL;
            switch (stage) {
            case AJ_ROWS_ROUND_MASKED:
                vals[e] = LLVMBuildSelect(b, keep, xe, aj_kb_f32(kb, 0), "");
                break;
            case AJ_ROWS_ROUND:
                vals[e] = xe;
                break;
            case AJ_ROWS_ADD:
                vals[e] = LLVMBuildFAdd(b, xe, ye, "");
                break;
            case AJ_ROWS_STORE:
                vals[e] = ye;
                break;
            default:
                vals[e] = aj_kb_f32(kb, 0);
                break;
            }
        }
        if (stage == AJ_ROWS_ROUND_MASKED || stage == AJ_ROWS_ROUND)
            aj_global_store4(kb, o_ptr, at_o, vals, op->dtype);
        else
            aj_global_store4(kb, acc_ptr, at_acc, vals, AJ_DTYPE_F32);
    }
    aj_kb_if_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, rows}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {rows, w, ROWS_THREADS / 32, 1},
    };
    aj_kb_finish(kb, &layout);
}

static aj_status rows_build(aj_kb *kb, const aj_op *op, void *user)
{
    (void)user;
    for (int s = 0; s < AJ_ROWS_STAGE_COUNT && kb->st == AJ_OK; s++)
        build_stage(kb, op, (aj_rows_stage)s);
    return kb->st;
}

/* not looked up by kind: the runtime compiles it (aj_compile_rows) */
AJ_TEMPLATE(aj_template_rows, "rows", AJ_KIND_FORWARD, AJ_VARIANT_FLASH, rows_check, rows_build,
            .stage_sigs = {AJ_KSIG_ROWS, AJ_KSIG_ROWS, AJ_KSIG_ROWS, AJ_KSIG_ROWS,
                           AJ_KSIG_ROWS});
