/*
 * block_mask.c -- the kernel that builds a block mask (attnjit.h,
 * aj_block_mask; runtime/block_mask.c launches it): the class of every
 * block_m x block_n tile of a launch, on the launch's device, by
 * templates/score.h's one rule, and the lists of non-skip tiles the
 * attention kernels walk (score.h, aj_score_walk_*).  The band and the
 * interval arithmetic class a tile first (aj_score_tile_class, the code
 * the attention kernels run when no mask is bound); where they say
 * partial, the tile's elements decide (aj_score_visible, the kernels'
 * per-element test), so the classes are exact.  Three stages, each over
 * the planes (pb, ph) (a plane per batch index, head, only where the
 * mask reads b, h: aj_score_prog.mask_reads_b, _h):
 *
 *   hulls    grid (cols, ...)  key block n: the intervals of the rest's
 *                              nodes that read k only (doc[b, k]'s hull),
 *                              once, into the plane's hull slots
 *   classes  grid (rows, ...)  row block m: the row's hulls, then its
 *                              tiles in turn over T threads
 *                                 col  0   1  ...  T   T+1 ...
 *                                 thread t0  t1 ...  t0  t1  ...
 *                              reading the key blocks' hulls; after a
 *                              barrier thread 0 lists the non-skip ones
 *   columns  grid (cols, ...)  key block n: thread 0 lists its non-skip
 *                              tiles over the row blocks (dK/dV's walk)
 *
 * The plane's layout is score.h's (aj_score_mask_plane_size); the tile
 * is the op's schedule (block_m, block_n): runtime/block_mask.c compiles
 * the op with the tile of the kernel the mask is for.
 */
#include "templates/score.h"
#include "templates/template.h"

#define BUILD_THREADS 32   /* GPU and sim; the cpu runs a work item as one */

static aj_status block_mask_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    (void)target;
    aj_status st = aj_score_prog_check(ctx, op);
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

/* What every stage of the builder knows of its work item. */
typedef struct bmask {
    aj_kb *kb;
    const aj_op *op;
    aj_score s;
    int bm, bn, threads;
    LLVMValueRef item[3], tid;
    LLVMValueRef seq_q, seq_k, rows, cols;   /* i32 */
    LLVMValueRef plane;                      /* i64: the (b, h) plane's first i32 */
} bmask;

static void stage_begin(bmask *m, aj_kb *kb, const aj_op *op, const aj_score_prog *prog,
                        const aj_score_prog *by_intervals, const char *name)
{
    LLVMBuilderRef b = kb->b;
    m->kb = kb;
    m->op = op;
    m->bm = op->schedule.block_m;
    m->bn = op->schedule.block_n;
    const int cpu = !kb->desc->simt;
    m->threads = cpu ? 1 : BUILD_THREADS;
    aj_params_declare(kb, AJ_KSIG_BLOCK_MASK, op, prog);
    aj_kb_begin_stage(kb, name, m->threads);
    m->tid = aj_kb_i32(kb, 0);
    for (int d = 0; d < 3; d++)
        m->item[d] = aj_kb_item_id(kb, d);
    if (!cpu)
        m->tid = aj_kb_thread_id(kb);
    m->seq_q = aj_param(kb, AJ_PID(seq_q));
    m->seq_k = aj_param(kb, AJ_PID(seq_k));
    m->rows = LLVMBuildSDiv(b, LLVMBuildAdd(b, m->seq_q, aj_kb_i32(kb, m->bm - 1), ""),
                            aj_kb_i32(kb, m->bm), "rows");
    m->cols = LLVMBuildSDiv(b, LLVMBuildAdd(b, m->seq_k, aj_kb_i32(kb, m->bn - 1), ""),
                            aj_kb_i32(kb, m->bn), "cols");
    aj_score_begin(&m->s, kb, by_intervals, 0, m->item[2], m->item[1],
                   aj_param(kb, AJ_PID(q_offset)), aj_param(kb, AJ_PID(kv_offset)),
                   prog->reads_totals ? aj_param(kb, AJ_PID(seq_q_total)) : NULL,
                   prog->reads_totals ? aj_param(kb, AJ_PID(seq_k_total)) : NULL);
    m->plane = LLVMBuildAdd(
        b, LLVMBuildMul(b, LLVMBuildSExt(b, m->item[2], kb->t_i64, ""),
                        aj_param(kb, AJ_PID(block_mask_stride_b)), ""),
        LLVMBuildMul(b, LLVMBuildSExt(b, m->item[1], kb->t_i64, ""),
                     aj_param(kb, AJ_PID(block_mask_stride_h)), ""), "plane");
}

static void stage_end(bmask *m, aj_extent along, int tile, const aj_score_prog *prog)
{
    const aj_kernel_layout layout = {
        .grid = {{along, tile},
                 {prog->mask_reads_h ? AJ_EXTENT_HEADS_Q : AJ_EXTENT_ONE, 1},
                 {prog->mask_reads_b ? AJ_EXTENT_BATCH : AJ_EXTENT_ONE, 1}},
        .schedule = {m->bm, m->bn, 1, 1},
    };
    aj_kb_finish(m->kb, &layout);
}

static LLVMValueRef i64v(bmask *m, LLVMValueRef v)
{
    return LLVMBuildSExt(m->kb->b, v, m->kb->t_i64, "");
}

/* Block `index` of `size` along a dimension of length `len`: [*lo, *hi]. */
static void block_of(bmask *m, LLVMValueRef index, int size, LLVMValueRef len, LLVMValueRef *lo,
                     LLVMValueRef *hi)
{
    LLVMBuilderRef b = m->kb->b;
    *lo = LLVMBuildMul(b, index, aj_kb_i32(m->kb, size), "");
    *hi = LLVMBuildSub(b, aj_kb_smin(m->kb, LLVMBuildAdd(b, *lo, aj_kb_i32(m->kb, size), ""), len),
                       aj_kb_i32(m->kb, 1), "");
}

/* The i32 at element `at` of the mask. */
static LLVMValueRef mask_at(bmask *m, LLVMValueRef at)
{
    return aj_kb_gptr_offset(m->kb, aj_param(m->kb, AJ_PID(block_mask)),
                             LLVMBuildShl(m->kb->b, at, aj_kb_i64(m->kb, 2), ""));
}

/* Where key block c's hulls start, as an i64 element index. */
static LLVMValueRef hulls_of(bmask *m, LLVMValueRef c, int slots)
{
    LLVMBuilderRef b = m->kb->b;
    LLVMValueRef rows = i64v(m, m->rows), cols = i64v(m, m->cols);
    LLVMValueRef lists = LLVMBuildAdd(b, LLVMBuildMul(b, aj_kb_i64(m->kb, 3),
                                                      LLVMBuildMul(b, rows, cols, ""), ""),
                                      LLVMBuildAdd(b, rows, cols, ""), "");
    lists = LLVMBuildAnd(b, LLVMBuildAdd(b, lists, aj_kb_i64(m->kb, 1), ""),
                         aj_kb_i64(m->kb, -2), "");
    LLVMValueRef at = LLVMBuildLShr(b, LLVMBuildAdd(b, m->plane, lists, ""), aj_kb_i64(m->kb, 1),
                                    "");
    return LLVMBuildAdd(b, at, LLVMBuildMul(b, i64v(m, c), aj_kb_i64(m->kb, 2 * slots), ""),
                        "hulls");
}

/* Appends the non-skip tiles among count classes at `classes` + k * step,
 * k rising, to the list at `list` (its count first): k << 2 | class. */
static void compact(bmask *m, LLVMValueRef classes, LLVMValueRef step, LLVMValueRef count,
                    LLVMValueRef list)
{
    aj_kb *kb = m->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef n = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, 0), "listed");
    LLVMValueRef k = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), count, aj_kb_i32(kb, 1), "k");
    LLVMValueRef cls = aj_kb_load(kb, kb->t_i32, mask_at(m, LLVMBuildAdd(b, classes,
                                  LLVMBuildMul(b, i64v(m, k), step, ""), "")), 4);
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntNE, cls, aj_kb_i32(kb, AJ_TILE_SKIP), ""));
    LLVMValueRef at = LLVMBuildAdd(b, list, LLVMBuildAdd(b, i64v(m, aj_kb_get(kb, n)),
                                                         aj_kb_i64(kb, 1), ""), "");
    aj_kb_store(kb, LLVMBuildOr(b, LLVMBuildShl(b, k, aj_kb_i32(kb, 2), ""), cls, ""),
                mask_at(m, at), 4);
    aj_kb_set(kb, n, LLVMBuildAdd(b, aj_kb_get(kb, n), aj_kb_i32(kb, 1), ""));
    aj_kb_if_end(kb);
    aj_kb_for_end(kb);
    aj_kb_store(kb, aj_kb_get(kb, n), mask_at(m, list), 4);
}

/* Stage "hulls", a CTA per key block: the intervals of the rest's nodes
 * that read keys only (doc[b, k] over the block), once for every row
 * block's tiles. */
static void build_hulls(aj_kb *kb, const aj_op *op, const aj_score_prog *prog,
                        const aj_score_prog *by_intervals)
{
    bmask m;
    stage_begin(&m, kb, op, prog, by_intervals, "hulls");
    LLVMBuilderRef b = kb->b;
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, m.tid, aj_kb_i32(kb, 0), ""));
    LLVMValueRef j0, j1;
    block_of(&m, m.item[0], m.bn, m.seq_k, &j0, &j1);
    aj_score_fix_cols(&m.s, j0, j1);
    aj_score_save_cols(&m.s, hulls_of(&m, m.item[0], aj_score_col_slots(prog)));
    aj_kb_if_end(kb);
    stage_end(&m, AJ_EXTENT_SEQ_K, m.bn, prog);
}

/* Stage "classes", a CTA per row block: its tiles' classes, then its list. */
static void build_classes(aj_kb *kb, const aj_op *op, const aj_score_prog *prog,
                          const aj_score_prog *by_intervals)
{
    bmask m;
    stage_begin(&m, kb, op, prog, by_intervals, "classes");
    LLVMBuilderRef b = kb->b;
    LLVMValueRef i0, i1;
    block_of(&m, m.item[0], m.bm, m.seq_q, &i0, &i1);
    /* the rows' side of the intervals (doc[b, q]'s hull) once for the row */
    aj_score_fix_rows(&m.s, i0, i1);
    LLVMValueRef row = LLVMBuildAdd(b, m.plane, LLVMBuildMul(b, i64v(&m, m.item[0]),
                                    aj_param(kb, AJ_PID(block_mask_stride_m)), ""), "row");
    LLVMValueRef c = aj_kb_for_begin(kb, m.tid, m.cols, aj_kb_i32(kb, m.threads), "c");
    {
        LLVMValueRef j0, j1;
        block_of(&m, c, m.bn, m.seq_k, &j0, &j1);
        aj_score_load_cols(&m.s, hulls_of(&m, c, aj_score_col_slots(prog)));
        LLVMValueRef cls = aj_kb_var(kb, kb->t_i32, aj_score_tile_class(&m.s, i0, i1, j0, j1),
                                     "cls");
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, aj_kb_get(kb, cls),
                                         aj_kb_i32(kb, AJ_TILE_PARTIAL), ""));
        aj_kb_set(kb, cls, tile_by_elements(&m.s, i0, i1, j0, j1));
        aj_kb_if_end(kb);
        aj_kb_store(kb, aj_kb_get(kb, cls), mask_at(&m, LLVMBuildAdd(b, row, i64v(&m, c), "")),
                    4);
    }
    aj_kb_for_end(kb);
    /* every thread's classes are in memory: one thread lists them */
    if (m.threads > 1)
        aj_kb_barrier(kb);
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, m.tid, aj_kb_i32(kb, 0), ""));
    LLVMValueRef list = aj_score_mask_list_at(kb, m.plane, i64v(&m, m.rows), i64v(&m, m.cols),
                                              1, i64v(&m, m.item[0]));
    compact(&m, row, aj_kb_i64(kb, 1), m.cols, list);
    aj_kb_if_end(kb);
    stage_end(&m, AJ_EXTENT_SEQ_Q, m.bm, prog);
}

/* Stage "columns", a CTA per key block: its list over the row blocks. */
static void build_columns(aj_kb *kb, const aj_op *op, const aj_score_prog *prog,
                          const aj_score_prog *by_intervals)
{
    bmask m;
    stage_begin(&m, kb, op, prog, by_intervals, "columns");
    LLVMBuilderRef b = kb->b;
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, m.tid, aj_kb_i32(kb, 0), ""));
    LLVMValueRef col = LLVMBuildAdd(b, m.plane, i64v(&m, m.item[0]), "col");
    LLVMValueRef list = aj_score_mask_list_at(kb, m.plane, i64v(&m, m.rows), i64v(&m, m.cols),
                                              0, i64v(&m, m.item[0]));
    compact(&m, col, aj_param(kb, AJ_PID(block_mask_stride_m)), m.rows, list);
    aj_kb_if_end(kb);
    stage_end(&m, AJ_EXTENT_SEQ_K, m.bn, prog);
}

static aj_status block_mask_build(aj_kb *kb, const aj_op *op, void *user)
{
    (void)user;
    const aj_score_prog *prog = NULL;
    aj_score_prog *by_intervals = aj_kb_scratch(kb, sizeof *by_intervals);
    aj_status st = by_intervals ? aj_score_prog_scratch(kb, op, &prog) : kb->st;
    if (st != AJ_OK || !prog)
        return st != AJ_OK ? st : kb->st;
    /* this kernel makes the classes a bound mask would give: its own
     * first class is the interval rule's */
    *by_intervals = *prog;
    by_intervals->block_mask = false;
    build_hulls(kb, op, prog, by_intervals);
    build_classes(kb, op, prog, by_intervals);
    build_columns(kb, op, prog, by_intervals);
    return kb->st;
}

AJ_TEMPLATE(aj_template_block_mask, "block_mask", AJ_KIND_FORWARD, AJ_VARIANT_FLASH,
            block_mask_check, block_mask_build,
            .targets = ((1u << AJ_TARGET_COUNT) - 1) & ~(1u << AJ_TARGET_ANY),   /* every one */
            .stage_sigs = {AJ_KSIG_BLOCK_MASK, AJ_KSIG_BLOCK_MASK, AJ_KSIG_BLOCK_MASK});
