/*
 * block_mask.c -- the kernel that builds a block mask (attnjit.h,
 * aj_block_mask; runtime/block_mask.c launches it): the class of every
 * block_m x block_n tile of a launch, on the launch's device, by
 * templates/score.h's one rule.  The band and the interval arithmetic
 * class a tile first (aj_score_tile_class, the code the attention kernels
 * run when no mask is bound); where they say partial, the tile's
 * elements decide (aj_score_visible, the kernels' per-element test), so
 * the classes are exact.
 *
 *   grid  = (ceil(Sq / block_m), planes_h, planes_b)     block = T threads
 *
 *   CTA (r, ph, pb): row block r of plane (pb, ph)
 *          col  0    1    2   ...  T   T+1  ...
 *   thread      t0   t1   t2  ...  t0  t1   ...   one tile each, in turn
 *
 * A plane per batch index (head) only where the mask reads b (h)
 * (aj_score_prog.mask_reads_b, _h); the classes are i32 aj_tile_class at
 * block_mask + pb stride_b + ph stride_h + r stride_m + c.  The tile is
 * the op's schedule (block_m, block_n): runtime/block_mask.c compiles
 * the op with the tile of the kernel the mask is for.
 */
#include "templates/score.h"
#include "templates/template.h"

#define BUILD_THREADS 32   /* GPU and sim; the cpu runs a work item as one */

static aj_status block_mask_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    (void)target;
    static _Thread_local aj_score_prog prog;
    aj_status st = aj_score_prog_init(ctx, op, &prog);
    if (st != AJ_OK)
        return st;
    if (op->layout != AJ_LAYOUT_PADDED)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "block masks are for layout = padded");
    if (op->schedule.block_m < 1 || op->schedule.block_n < 1)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "a block mask's op names its tile: schedule "
                       "block_m = %d, block_n = %d", op->schedule.block_m,
                       op->schedule.block_n);
    return AJ_OK;
}

/* The tile's class, exact: any visible element and all visible, over
 * rows [i0, i1] x keys [j0, j1], row by row until one visible and one
 * hidden element are seen (a band's diagonal tile: its first row). */
static LLVMValueRef tile_by_elements(aj_score *s, LLVMValueRef i0, LLVMValueRef i1,
                                     LLVMValueRef j0, LLVMValueRef j1)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef one = aj_kb_i32(kb, 1);
    LLVMValueRef any = aj_kb_var(kb, kb->t_i1, LLVMConstInt(kb->t_i1, 0, 0), "any");
    LLVMValueRef all = aj_kb_var(kb, kb->t_i1, LLVMConstInt(kb->t_i1, 1, 0), "all");
    LLVMValueRef i = aj_kb_for_begin(kb, i0, LLVMBuildAdd(b, i1, one, ""), one, "ei");
    aj_kb_if_begin(kb, LLVMBuildOr(b, LLVMBuildNot(b, aj_kb_get(kb, any), ""),
                                   aj_kb_get(kb, all), "undecided"));
    LLVMValueRef j = aj_kb_for_begin(kb, j0, LLVMBuildAdd(b, j1, one, ""), one, "ej");
    LLVMValueRef vis = aj_score_visible(s, i, j);
    aj_kb_set(kb, any, LLVMBuildOr(b, aj_kb_get(kb, any), vis, ""));
    aj_kb_set(kb, all, LLVMBuildAnd(b, aj_kb_get(kb, all), vis, ""));
    aj_kb_for_end(kb);
    aj_kb_if_end(kb);
    aj_kb_for_end(kb);
    LLVMValueRef cls = LLVMBuildSelect(b, aj_kb_get(kb, all), aj_kb_i32(kb, AJ_TILE_FULL),
                                       aj_kb_i32(kb, AJ_TILE_PARTIAL), "");
    return LLVMBuildSelect(b, aj_kb_get(kb, any), cls, aj_kb_i32(kb, AJ_TILE_SKIP), "");
}

static aj_status block_mask_build(aj_kb *kb, const aj_op *op, void *user)
{
    (void)user;
    LLVMBuilderRef b = kb->b;
    static _Thread_local aj_score_prog prog, by_intervals;
    aj_status st = aj_score_prog_init(kb->ctx, op, &prog);
    if (st != AJ_OK)
        return st;
    /* this kernel makes the classes a bound mask would give: its own
     * first class is the interval rule's */
    by_intervals = prog;
    by_intervals.block_mask = false;
    const int bm = op->schedule.block_m, bn = op->schedule.block_n;
    const int cpu = kb->target == AJ_TARGET_CPU;
    const int threads = cpu ? 1 : BUILD_THREADS;
    aj_params_declare(kb, AJ_KSIG_BLOCK_MASK, op, &prog);
    aj_kb_begin(kb, threads);

    LLVMValueRef item[3], tid = aj_kb_i32(kb, 0);
    for (int d = 0; d < 3; d++)
        item[d] = cpu ? LLVMBuildLoad2(b, kb->t_i32,
                                       LLVMBuildGEP2(b, kb->t_i32, kb->work_item,
                                                     (LLVMValueRef[]){aj_kb_i32(kb, d)}, 1, ""),
                                       "")
                      : aj_kb_block_id(kb, d);
    if (!cpu)
        tid = aj_kb_thread_id(kb);
    LLVMValueRef seq_q = aj_kb_param(kb, "seq_q"), seq_k = aj_kb_param(kb, "seq_k");
    aj_score s;
    aj_score_begin(&s, kb, &by_intervals, 0, item[2], item[1], aj_kb_param(kb, "q_offset"),
                   aj_kb_param(kb, "kv_offset"),
                   prog.reads_totals ? aj_kb_param(kb, "seq_q_total") : NULL,
                   prog.reads_totals ? aj_kb_param(kb, "seq_k_total") : NULL);
    LLVMValueRef one = aj_kb_i32(kb, 1);
    LLVMValueRef i0 = LLVMBuildMul(b, item[0], aj_kb_i32(kb, bm), "i0");
    LLVMValueRef i1 = LLVMBuildSub(b, aj_kb_smin(kb, LLVMBuildAdd(b, i0, aj_kb_i32(kb, bm), ""),
                                                 seq_q), one, "i1");
    /* the rows' side of the intervals (doc[b, q]'s hull) once for the row */
    aj_score_fix_rows(&s, i0, i1);
    LLVMValueRef cols = LLVMBuildSDiv(b, LLVMBuildAdd(b, seq_k, aj_kb_i32(kb, bn - 1), ""),
                                      aj_kb_i32(kb, bn), "cols");
    LLVMValueRef row = LLVMBuildAdd(
        b, LLVMBuildAdd(b, LLVMBuildMul(b, LLVMBuildSExt(b, item[2], kb->t_i64, ""),
                                        aj_kb_param(kb, "block_mask_stride_b"), ""),
                        LLVMBuildMul(b, LLVMBuildSExt(b, item[1], kb->t_i64, ""),
                                     aj_kb_param(kb, "block_mask_stride_h"), ""), ""),
        LLVMBuildMul(b, LLVMBuildSExt(b, item[0], kb->t_i64, ""),
                     aj_kb_param(kb, "block_mask_stride_m"), ""), "row");
    LLVMValueRef c = aj_kb_for_begin(kb, tid, cols, aj_kb_i32(kb, threads), "c");
    {
        LLVMValueRef j0 = LLVMBuildMul(b, c, aj_kb_i32(kb, bn), "j0");
        LLVMValueRef j1 = LLVMBuildSub(
            b, aj_kb_smin(kb, LLVMBuildAdd(b, j0, aj_kb_i32(kb, bn), ""), seq_k), one, "j1");
        LLVMValueRef cls = aj_kb_var(kb, kb->t_i32, aj_score_tile_class(&s, i0, i1, j0, j1),
                                     "cls");
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, aj_kb_get(kb, cls),
                                         aj_kb_i32(kb, AJ_TILE_PARTIAL), ""));
        aj_kb_set(kb, cls, tile_by_elements(&s, i0, i1, j0, j1));
        aj_kb_if_end(kb);
        LLVMValueRef at = LLVMBuildAdd(b, row, LLVMBuildSExt(b, c, kb->t_i64, ""), "");
        aj_kb_store(kb, aj_kb_get(kb, cls),
                    aj_kb_gptr_offset(kb, aj_kb_param(kb, "block_mask"),
                                      LLVMBuildShl(b, at, aj_kb_i64(kb, 2), "")), 4);
    }
    aj_kb_for_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, bm},
                 {prog.mask_reads_h ? AJ_EXTENT_HEADS_Q : AJ_EXTENT_ONE, 1},
                 {prog.mask_reads_b ? AJ_EXTENT_BATCH : AJ_EXTENT_ONE, 1}},
        .schedule = {bm, bn, 1, 1},
    };
    aj_kb_finish(kb, &layout);
    return kb->st;
}

const aj_template aj_template_block_mask = {
    .name = "block_mask",
    .kind = AJ_KIND_FORWARD,
    .variant = AJ_VARIANT_FLASH,
    .check = block_mask_check,
    .build = block_mask_build,
    .targets = (1u << AJ_TARGET_SM_80) | (1u << AJ_TARGET_SM_90) | (1u << AJ_TARGET_SM_90A) |
               (1u << AJ_TARGET_SIM) | (1u << AJ_TARGET_CPU),
    .stage_sigs = {AJ_KSIG_BLOCK_MASK},
};
