/*
 * efficient_bwd.c -- the efficient-variant backward pass (SIMT FMA), as two
 * kernels of one module run in order.  Both recompute the probabilities
 * from Q, K and the forward's LSE instead of storing them:
 *
 *   S_ij  = scale q_i . k_j  ->  score_mod, mask  (score.h, as the forward)
 *   P_ij  = exp(S_ij - LSE_i)                    (0 where hidden)
 *   dP_ij = dO_i . v_j        Delta_i = dO_i . O_i
 *   dS_ij = P_ij (dP_ij - Delta_i) [* (1 - tanh^2(t_ij / C)) with softcap]
 *
 *   stage 0, dkdv: dV_j = sum_i P_ij dO_i     dK_j = scale sum_i dS_ij q_i
 *   stage 1, dq:   dQ_i = scale sum_j dS_ij k_j
 *
 * Each gradient element is summed by one thread of one CTA in a fixed
 * order, GQA sums included (a dkdv CTA walks every query head of its
 * group), so results are bitwise reproducible without atomics.
 *
 * dkdv: one CTA per (key block of block_n keys, kv head, batch).  K and V
 * stay in shared memory; the CTA walks the query heads of its group and,
 * for each, the query blocks of block_m rows that can see its keys:
 *
 *   grid = (ceil(Sk / block_n), Hkv, B)
 *
 *            queries of the step (block_m) ──►       dK cols (D), dV cols (Dv) ──►
 *   keys g0 │ l0 l1 .. lG-1 l0 l1 .. │       g0 │ l0:4 l1:4 .. lG-1:4 l0:4 .. │
 *    │   g1 │ ...                    │       g1 │ ...                         │
 *    ▼   .. │  S^T, dP^T -> P^T, dS^T│       .. │  dK += dS^T Q, dV += P^T dO │
 *
 *   per step: barrier, load Q, dO, LSE, Delta (row groups over queries),
 *   barrier, S^T = K Q^T and dP^T = V dO^T, P^T and dS^T to shared memory,
 *   barrier, dV += P^T dO and dK += dS^T Q from shared memory.
 *
 * dq: one CTA per (query block of block_m rows, head, batch), laid out as
 * the forward (row group g owns rows, lane l key columns and 4-wide dQ
 * column chunks); Q, dO, LSE and Delta are read once, then per visible key
 * block: barrier, load K and V, barrier, S = Q K^T and dP = dO V^T, dS to
 * shared memory, barrier, dQ += dS K.
 *
 *   grid = (ceil(Sq / block_m), Hq, B)
 *
 * Both kernels: threads form R = T / G row groups of G lanes; G divides
 * the score columns of each tile (block_m or block_n) and, where it can
 * (group_lanes), D / 4 and Dv / 4; otherwise the last 4-wide chunks of a
 * head dim belong to only some lanes.  Rows that
 * see no key get zero gradients; keys no row sees get dK = dV = 0.
 * Masks use the forward's i32 bound scheme (offsets clamped to +-2^30);
 * tiles of class skip are not visited where the mask has more than its
 * band, and a tile of class full inside the lengths computes P and dS
 * with no element test (score.h's aj_score_by_tile_class).
 *
 * Options:
 *   dropout = p   both kernels recompute the forward's keep mask (the same
 *                 Philox4x32-10 key and counter, from dropout_seed,
 *                 dropout_offset, b Hq + h and the global positions) and use
 *                 m_ij = keep_ij / (1 - p): dV_j += P_ij m_ij dO_i and
 *                 dP_ij = m_ij dO_i . v_j; Delta stays dO_i . O_i.
 *   bias = add    both kernels add bias[b,h,i,j] to the scores (size-1 dims
 *                 broadcast through stride 0, as the forward), and the dq
 *                 kernel writes dbias (f32, the bias's shape) = dS summed
 *                 over the broadcast dims.  No atomics: the CTA of query
 *                 block m at (b, h) = (0 if bias broadcasts over batch else
 *                 b, 0 if it broadcasts over heads else h) owns dbias rows
 *                 of block m and walks every (b, h) pair folded onto them
 *                 in a fixed order (dQ of each pair included), adding each
 *                 pair's dS by read-modify-write; the other CTAs of the
 *                 folded pairs do nothing.  With bias the dq kernel visits
 *                 every key block (dS = 0 where hidden), so every dbias
 *                 element is written.
 *
 * Launch contract: Sq, Sk < 2^30.  Not supported: varlen.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/attn_common.h"
#include "templates/skeleton.h"
#include "templates/score.h"
#include "templates/grad_tail.h"
#include "templates/template.h"
#include "templates/tile_io.h"

#define MAX_ROWS 16   /* rows (keys or queries) a thread owns */
#define MAX_COLS 16   /* score columns a lane owns */
#define MAX_OUT 64    /* output columns a lane owns, per tensor */
#define REG_BUDGET 112

typedef struct ebwd_plan {
    aj_dtype dtype;
    int d, dv;
    int wd, wdv;   /* D and Dv rounded up to whole 4G-column chunks */
    int bm, bn, warps, threads;
    int g, r;
} ebwd_plan;

static int max_i(int a, int b) { return a > b ? a : b; }

/* Lanes per row group.  The widest that splits both tiles' score columns
 * and both head dims' 4-wide chunks evenly; where that leaves a lane more
 * than 16 columns of a head dim (odd multiples of 8 past 64), the widest
 * that splits the score columns and still gives every lane a chunk of the
 * wider head dim: the last chunks are then owned by only some lanes (the
 * shared-memory tiles are padded to whole chunks, the stores skip the pad
 * columns). */
static int group_lanes(int bm, int bn, int d, int dv)
{
    int g = 16;
    while (g > 1 && (bm % g != 0 || bn % g != 0 || d % (4 * g) != 0 || dv % (4 * g) != 0))
        g /= 2;
    if (max_i(d, dv) / g <= 16)
        return g;
    g = 16;
    while (g > 1 && (bm % g != 0 || bn % g != 0 || 4 * g > max_i(d, dv)))
        g /= 2;
    return g;
}

static int round_up(int x, int step)
{
    return (x + step - 1) / step * step;
}

/* Registers of per-thread state of each kernel (dkdv: rows are keys,
 * columns queries; dq: rows are queries, columns keys), each score
 * element a thread owns counting `per_elem` more for its option work. */
static int dkdv_regs(const ebwd_plan *p, int per_elem)
{
    int rk = p->bn / p->r, cq = p->bm / p->g;
    return rk * (p->wd / p->g + p->wdv / p->g + (2 + per_elem) * cq) + 4 * (rk + cq);
}

static int dq_regs(const ebwd_plan *p, int per_elem)
{
    int rm = p->bm / p->r, cn = p->bn / p->g;
    return rm * (p->wd / p->g + (2 + per_elem) * cn + 2) + 4 * (rm + cn);
}

/* The template's model of one schedule (aj_attn_plan_fn). */
static aj_status plan_schedule(aj_ctx *ctx, const aj_op *op, aj_target target,
                               const aj_schedule *s, void *out)
{
    ebwd_plan *p = out;
    memset(p, 0, sizeof *p);
    p->dtype = op->dtype;
    p->d = op->head_dim;
    p->dv = aj_op_dv(op);
    p->bm = s->block_m;
    p->bn = s->block_n;
    p->warps = s->warps;
    if (s->stages > 1)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: stages = %d is not supported by efficient backward "
                       "(use stages = 1)", s->stages);
    if (p->bm % 4 != 0 || p->bn % 4 != 0)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: efficient backward needs block_m and block_n multiples of 4 "
                       "(got %d, %d)", p->bm, p->bn);
    if (p->bm > 128 || p->bn > 128 || p->warps > 8)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: efficient backward supports block_m and block_n up to 128 "
                       "and up to 8 warps (got %d, %d, %d)", p->bm, p->bn, p->warps);
    p->g = group_lanes(p->bm, p->bn, p->d, p->dv);
    p->wd = round_up(p->d, 4 * p->g);
    p->wdv = round_up(p->dv, 4 * p->g);
    p->threads = p->warps * 32;
    p->r = p->threads / p->g;
    if (p->bm % p->r != 0 || p->bn % p->r != 0)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d and block_n = %d must be multiples of the %d "
                       "row groups of %d warps at head_dim %d/%d", p->bm, p->bn, p->r,
                       p->warps, p->d, p->dv);
    int per_elem = aj_attn_option_regs_per_element(op);
    int regs = max_i(dkdv_regs(p, per_elem), dq_regs(p, per_elem));
    if (p->bn / p->r > MAX_ROWS || p->bm / p->r > MAX_ROWS || p->bm / p->g > MAX_COLS ||
        p->bn / p->g > MAX_COLS || max_i(p->wd, p->wdv) / p->g > MAX_OUT || regs > REG_BUDGET)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d, warps = %d needs about %d "
                       "registers of state per thread at head_dim %d/%d (budget %d); "
                       "use smaller tiles or more warps", p->bm, p->bn, p->warps, regs,
                       p->d, p->dv, REG_BUDGET);
    /* dkdv holds the most: K, V, Q, dO, P^T, dS^T and the row statistics */
    int64_t floats = (int64_t)(p->bn + p->bm) * (p->wd + 4 + p->wdv + 4) +
                     2 * (int64_t)p->bn * (p->bm + 4) + 2 * p->bm;
    if (4 * floats > aj_target_smem_limit(target))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d needs %lld bytes of shared "
                       "memory at head_dim %d/%d; %s allows %d", p->bm, p->bn,
                       (long long)(4 * floats), p->d, p->dv, aj_target_name(target),
                       aj_target_smem_limit(target));
    return AJ_OK;
}

/* Schedules in order of preference: 32 x 32 tiles on 4 warps; past head
 * dim 128, 16 keys per block on 8 warps keep the dK and dV accumulators
 * (one key row per thread) and dQ's (two query rows) clear of spills;
 * smaller tiles and fewer warps where a lane owns more columns or more
 * option work. */
static aj_status plan_kernel(aj_ctx *ctx, const aj_op *op, aj_target target, ebwd_plan *p)
{
    int wide = max_i(op->head_dim, aj_op_dv(op)) > 128;
    const aj_schedule candidates[] = {
        {32, wide ? 16 : 32, wide ? 8 : 4, 1}, {32, 32, 2, 1}, {32, 16, 4, 1}, {16, 16, 2, 1},
        {32, 32, 1, 1}, {16, 16, 1, 1}, {8, 8, 1, 1},
        /* head dims past 256 (to 512): one key row of dK and dV per thread */
        {16, 16, 8, 1},
        /* sm_89's 99 KiB of shared memory: 8 x 8 tiles where 16 x 16 do not fit */
        {8, 8, 2, 1},
    };
    const aj_attn_schedule_rule rule = {
        .candidates = candidates,
        .n = (int)(sizeof candidates / sizeof candidates[0]),
        .plan = plan_schedule,
    };
    aj_status st = aj_attn_plan_schedule(ctx, op, target, &rule, p);
    /* where shared memory is smallest (sm_89), the widest head-dim pairs
     * have no schedule: the tiles hold K, V, Q and dO rows in f32, 32 (D +
     * Dv) floats at 16 x 16, and 8 x 8 tiles need more registers than a
     * thread keeps past D + Dv of about 768 */
    if (st != AJ_OK && aj_op_schedule_is_default(op) && aj_target_smem_limit(target) < 128 * 1024)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "head_dim %d / head_dim_v %d: efficient backward does not fit the %d KiB "
                       "of shared memory of %s (its tiles hold K, V, Q and dO rows in f32; D + "
                       "Dv up to about 768 fit there); sm_80 and sm_90 take every head dim",
                       op->head_dim, aj_op_dv(op), aj_target_smem_limit(target) / 1024,
                       aj_target_name(target));
    return st;
}

static aj_status ebwd_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    aj_status st = aj_attn_check_layout_and_dims(ctx, op, "efficient backward",
                                                 AJ_HEAD_DIM_MAX_EFFICIENT);
    ebwd_plan plan;
    return st != AJ_OK ? st : aj_kctx_check_planned(ctx, op, plan_kernel(ctx, op, target, &plan));
}

/* ---------------------------------------------------------------- shared */

/* Everything the emitters below share; one per kernel. */
typedef struct ebwd {
    AJ_KCTX;                        /* skeleton.h */
    ebwd_plan p;
    LLVMValueRef lane, group;       /* i32 */
} ebwd;

/* Thread layout shared by both kernels. */
static void setup(ebwd *e, aj_kb *kb, const aj_op *op, const ebwd_plan *p,
                  const aj_score_prog *prog)
{
    memset(e, 0, sizeof *e);
    aj_kctx_init(&e->k, kb, op, prog);
    e->p = *p;
    e->tid = aj_kb_thread_id(kb);
    e->lane = LLVMBuildAnd(e->b, e->tid, aj_kb_i32(e->kb, p->g - 1), "lane");
    e->group = LLVMBuildUDiv(e->b, e->tid, aj_kb_i32(e->kb, p->g), "group");
    e->seq_q = aj_param(kb, AJ_PID(seq_q));
    e->seq_k = aj_param(kb, AJ_PID(seq_k));
}

/* Per-(batch, query head) state: the score program's, the bias slice and
 * the dropout stream's key and counter bases, as the forward sets them.
 * The band (score.h) does not depend on the head, so the ranges a kernel
 * computes before its head loop hold for every head. */
static void set_head(ebwd *e, LLVMValueRef bidx, LLVMValueRef h)
{
    aj_kb *kb = e->kb;
    int totals = e->prog->reads_totals;
    aj_kctx_set_head(&e->k, bidx, h, totals ? aj_param(kb, AJ_PID(seq_q_total)) : NULL,
                     totals ? aj_param(kb, AJ_PID(seq_k_total)) : NULL);
}

/* Rows [first, first + rows) of tensor t's slice at `base` (i64), as f32,
 * into shared memory at smem with leading dimension ld; rows at or past
 * `limit` read as zero. */
static void load_rows(ebwd *e, aj_param_source t, LLVMValueRef base, LLVMValueRef first,
                      LLVMValueRef limit, int rows, int width, int32_t smem, int ld)
{
    aj_kb *kb = e->kb;
    aj_tile_src src = {aj_param_data(kb, t), base, aj_param_stride_s(kb, t), first, limit,
                       e->p.dtype};
    aj_tile_load_f32(kb, &src, rows, width, smem, ld, e->tid, e->p.threads);
}

/* Whether dropout keeps (i, j) of the current slice, exactly as the
 * forward decides: keep iff (out[0] >> 8) >= ceil(p 2^24).  NULL without
 * dropout. */
static LLVMValueRef emit_keep(ebwd *e, LLVMValueRef i, LLVMValueRef j)
{
    if (!(e->op->dropout > 0))
        return NULL;
    return aj_attn_dropout_keep(e->kb, &e->drop, e->op->dropout, i, j);
}

/* Blocks of `per` indices in [0, n) overlapping [lo, hi]: [*begin, *end),
 * empty when hi < lo. */
static void block_range(ebwd *e, LLVMValueRef lo, LLVMValueRef hi, int per,
                        LLVMValueRef *begin, LLVMValueRef *end)
{
    LLVMBuilderRef b = e->b;
    LLVMValueRef empty = LLVMBuildICmp(b, LLVMIntSLT, hi, lo, "");
    LLVMValueRef n = aj_kb_i32(e->kb, per);
    *begin = LLVMBuildSelect(b, empty, aj_kb_i32(e->kb, 0), LLVMBuildSDiv(b, lo, n, ""), "");
    *end = LLVMBuildSelect(b, empty, aj_kb_i32(e->kb, 0),
                           LLVMBuildSDiv(b, LLVMBuildAdd(b, hi, n, ""), n, ""), "");
}

/*
 * acc[k][t] = sum_x A[arow[k]][x] * B[bcol[t]][x] over x < width, both
 * tiles f32 in shared memory with pitches lda and ldb.
 *
 * The loop over x takes 8 columns a trip (two 4-wide loads per row; head
 * dims are multiples of 8) and is kept a loop: unrolled further, ptxas
 * keeps every trip's loads in flight and runs out of registers (spills at
 * 255 with bias and dropout), where the loop needs ~60% of them.
 */
static void emit_dots(ebwd *e, LLVMValueRef acc[MAX_ROWS][MAX_COLS], int nr,
                      const LLVMValueRef *arow, int32_t a_smem, int lda, int nc,
                      const LLVMValueRef *bcol, int32_t b_smem, int ldb, int width)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    for (int k = 0; k < nr; k++)
        for (int t = 0; t < nc; t++)
            aj_kb_set(kb, acc[k][t], aj_kb_f32(kb, 0));
    LLVMValueRef x8 =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, width / 8), aj_kb_i32(kb, 1), "x8");
    aj_kb_loop_no_unroll(kb);
    for (int half = 0; half < 2; half++) {
        LLVMValueRef col =
            LLVMBuildAdd(b, LLVMBuildShl(b, x8, aj_kb_i32(kb, 3), ""), aj_kb_i32(kb, 4 * half), "");
        LLVMValueRef av[MAX_ROWS], bv[MAX_COLS];
        for (int k = 0; k < nr; k++)
            av[k] = aj_smem_load4(
                kb, a_smem,
                LLVMBuildAdd(b, LLVMBuildMul(b, arow[k], aj_kb_i32(kb, lda), ""), col, ""));
        for (int t = 0; t < nc; t++)
            bv[t] = aj_smem_load4(
                kb, b_smem,
                LLVMBuildAdd(b, LLVMBuildMul(b, bcol[t], aj_kb_i32(kb, ldb), ""), col, ""));
        for (int k = 0; k < nr; k++)
            for (int t = 0; t < nc; t++) {
                LLVMValueRef a = aj_kb_get(kb, acc[k][t]);
                for (int c = 0; c < 4; c++) {
                    LLVMValueRef idx = aj_kb_i32(kb, c);
                    a = aj_kb_fma(kb, LLVMBuildExtractElement(b, av[k], idx, ""),
                                  LLVMBuildExtractElement(b, bv[t], idx, ""), a);
                }
                aj_kb_set(kb, acc[k][t], a);
            }
    }
    aj_kb_for_end(kb);
}

/*
 * out[k][4u+w] += sum_x A[arow[k]][x] * B[x][4 lane + 4 G u + w] over
 * x < len: the "P^T dO"-shaped products, A and B f32 in shared memory.
 */
static void emit_accumulate(ebwd *e, LLVMValueRef out[MAX_ROWS][MAX_OUT], int nr,
                            const LLVMValueRef *arow, int32_t a_smem, int lda, int len,
                            int32_t b_smem, int ldb, int width)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    int chunks = width / (4 * e->p.g);
    LLVMValueRef x4 =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, len / 4), aj_kb_i32(kb, 1), "x4");
    aj_kb_loop_no_unroll(kb);   /* as emit_dots: unrolled, ptxas spills */
    LLVMValueRef x0 = LLVMBuildShl(b, x4, aj_kb_i32(kb, 2), "");
    LLVMValueRef av[MAX_ROWS];
    for (int k = 0; k < nr; k++)
        av[k] = aj_smem_load4(
            kb, a_smem, LLVMBuildAdd(b, LLVMBuildMul(b, arow[k], aj_kb_i32(kb, lda), ""), x0, ""));
    LLVMValueRef o[MAX_ROWS][MAX_OUT];
    for (int k = 0; k < nr; k++)
        for (int c = 0; c < 4 * chunks; c++)
            o[k][c] = aj_kb_get(kb, out[k][c]);
    LLVMValueRef lane_col = LLVMBuildShl(b, e->lane, aj_kb_i32(kb, 2), "");
    for (int w = 0; w < 4; w++) {
        LLVMValueRef brow =
            LLVMBuildMul(b, LLVMBuildAdd(b, x0, aj_kb_i32(kb, w), ""), aj_kb_i32(kb, ldb), "");
        for (int u = 0; u < chunks; u++) {
            LLVMValueRef bv = aj_smem_load4(
                kb, b_smem,
                LLVMBuildAdd(b, brow, LLVMBuildAdd(b, lane_col, aj_kb_i32(kb, 4 * e->p.g * u), ""),
                             ""));
            for (int k = 0; k < nr; k++) {
                LLVMValueRef ak = LLVMBuildExtractElement(b, av[k], aj_kb_i32(kb, w), "");
                for (int x = 0; x < 4; x++)
                    o[k][4 * u + x] =
                        aj_kb_fma(kb, ak, LLVMBuildExtractElement(b, bv, aj_kb_i32(kb, x), ""),
                                  o[k][4 * u + x]);
            }
        }
    }
    for (int k = 0; k < nr; k++)
        for (int c = 0; c < 4 * chunks; c++)
            aj_kb_set(kb, out[k][c], o[k][c]);
    aj_kb_for_end(kb);
}

/* P and dS of (row i, key j) from the q.k and dO.v variables: score.h's
 * aj_score_p_ds with this kernel's head state, bias and dropout,
 * visible by aj_score_visible_in_tile (`full`, rows checked against seq_q
 * unless NULL). */
static void emit_p_ds(ebwd *e, int full, LLVMValueRef seq_q, LLVMValueRef qk_var,
                      LLVMValueRef dp_var, LLVMValueRef i, LLVMValueRef j, LLVMValueRef lse2,
                      LLVMValueRef delta, LLVMValueRef *p_out, LLVMValueRef *ds_out)
{
    aj_kb *kb = e->kb;
    aj_score_p_ds(&e->sc, aj_kb_get(kb, qk_var), aj_kb_get(kb, dp_var), i, j, lse2, delta,
                  aj_score_visible_in_tile(&e->sc, full, seq_q, e->seq_k, i, j),
                  aj_kctx_bias_at(&e->k, i, j), emit_keep(e, i, j), p_out, ds_out);
}

/*
 * Row statistics of query row i (global, < Sq checked by the caller's
 * clamp): Delta_i = dO_i . O_i, summed over the G lanes of the row group
 * (lane l reads the 4-wide chunks 4l + 4Gu), and LSE_i in log2 units.
 * `ic` is i clamped into [0, Sq - 1].
 */
static void emit_row_stats(ebwd *e, LLVMValueRef ic, LLVMValueRef o_base, LLVMValueRef do_base,
                           LLVMValueRef lse_base, LLVMValueRef *lse2, LLVMValueRef *delta)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef i64 = aj_kb_sext64(kb, ic);
    LLVMValueRef orow =
        LLVMBuildAdd(b, o_base, LLVMBuildMul(b, i64, aj_param_stride_s(kb, AJ_PSRC_o), ""), "");
    LLVMValueRef drow =
        LLVMBuildAdd(b, do_base, LLVMBuildMul(b, i64, aj_param_stride_s(kb, AJ_PSRC_do), ""), "");
    LLVMValueRef lane_col = aj_kb_sext64(kb, LLVMBuildShl(b, e->lane, aj_kb_i32(kb, 2), ""));
    LLVMValueRef sum = aj_kb_f32(kb, 0);
    for (int u = 0; u < e->p.wdv / (4 * e->p.g); u++) {
        LLVMValueRef col = LLVMBuildAdd(b, lane_col, aj_kb_i64(kb, 4 * e->p.g * u), "");
        /* a pad chunk past Dv reads the row's last chunk and adds nothing */
        LLVMValueRef owned = NULL;
        if (4 * e->p.g * (u + 1) > e->p.dv) {
            owned = LLVMBuildICmp(b, LLVMIntSLT, col, aj_kb_i64(kb, e->p.dv), "");
            col = LLVMBuildSelect(b, owned, col, aj_kb_i64(kb, e->p.dv - 4), "");
        }
        LLVMValueRef before = sum;
        LLVMValueRef ov = aj_global_load4(kb, aj_param(kb, AJ_PID(o)),
                                          LLVMBuildAdd(b, orow, col, ""), e->p.dtype);
        LLVMValueRef dv = aj_global_load4(kb, aj_param(kb, AJ_PID(do)),
                                          LLVMBuildAdd(b, drow, col, ""), e->p.dtype);
        for (int x = 0; x < 4; x++)
            sum = aj_kb_fma(kb, LLVMBuildExtractElement(b, ov, aj_kb_i32(kb, x), ""),
                            LLVMBuildExtractElement(b, dv, aj_kb_i32(kb, x), ""), sum);
        if (owned)
            sum = LLVMBuildSelect(b, owned, sum, before, "");
    }
    *delta = aj_kb_group_sum(kb, sum, e->p.g);
    LLVMValueRef at = LLVMBuildMul(b, LLVMBuildAdd(b, lse_base, i64, ""), aj_kb_i64(kb, 4), "");
    LLVMValueRef lse =
        aj_kb_load(kb, kb->t_f32, aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(lse)), at), 4);
    *lse2 = LLVMBuildFMul(b, lse, aj_kb_f32(kb, AJ_LOG2E), "");
}

/* Stores row k's accumulators times `mult` to tensor `t` at global row
 * `row` (skipped at or past `limit`). */
static void emit_store_row(ebwd *e, aj_param_source t, LLVMValueRef base, LLVMValueRef row,
                           LLVMValueRef limit, LLVMValueRef *acc, int width, double mult)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, row, limit, ""));
    LLVMValueRef rowoff = LLVMBuildAdd(
        b, base, LLVMBuildMul(b, aj_kb_sext64(kb, row), aj_param_stride_s(kb, t), ""), "");
    LLVMValueRef lane_col = aj_kb_sext64(kb, LLVMBuildShl(b, e->lane, aj_kb_i32(kb, 2), ""));
    for (int u = 0; u < (width + 4 * e->p.g - 1) / (4 * e->p.g); u++) {
        LLVMValueRef col = LLVMBuildAdd(b, lane_col, aj_kb_i64(kb, 4 * e->p.g * u), "");
        /* a last chunk past the width holds pad columns: never stored */
        int partial = 4 * e->p.g * (u + 1) > width;
        if (partial)
            aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, col, aj_kb_i64(kb, width), ""));
        LLVMValueRef vals[4];
        for (int x = 0; x < 4; x++) {
            vals[x] = aj_kb_get(kb, acc[4 * u + x]);
            if (mult != 1.0)
                vals[x] = LLVMBuildFMul(b, vals[x], aj_kb_f32(kb, mult), "");
        }
        aj_global_store4(kb, aj_param_data(kb, t), LLVMBuildAdd(b, rowoff, col, ""), vals,
                         e->p.dtype);
        if (partial)
            aj_kb_if_end(kb);
    }
    aj_kb_if_end(kb);
}

/* One float of shared memory at float index `idx` past byte offset `off`. */
static LLVMValueRef smem_load1(ebwd *e, int32_t off, LLVMValueRef idx)
{
    LLVMValueRef bytes = LLVMBuildAdd(e->b, aj_kb_i32(e->kb, off),
                                      LLVMBuildShl(e->b, idx, aj_kb_i32(e->kb, 2), ""), "");
    return aj_kb_load(e->kb, e->kb->t_f32, aj_kb_smem_ptr(e->kb, bytes), 4);
}

static LLVMValueRef zero_var(aj_kb *kb, const char *name)
{
    return aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, 0), name);
}

/* dbias[row i, key j] (f32, element offset `row_off` + j) = ds when
 * `first`, else += ds; only inside Sq x Sk.  Each element has one writer
 * thread, which reads back only its own earlier store. */
static void emit_dbias_add(ebwd *e, LLVMValueRef row_off, LLVMValueRef i, LLVMValueRef j,
                           LLVMValueRef ds, LLVMValueRef first)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef in = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSLT, i, e->seq_q, ""),
                                   LLVMBuildICmp(b, LLVMIntSLT, j, e->seq_k, ""), "");
    aj_kb_if_begin(kb, in);
    LLVMValueRef at =
        LLVMBuildMul(b, LLVMBuildAdd(b, row_off, aj_kb_sext64(kb, j), ""), aj_kb_i64(kb, 4), "");
    LLVMValueRef ptr = aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(dbias)), at);
    /* the first pair's value is stored without reading what was there */
    LLVMValueRef old = aj_kb_load(kb, kb->t_f32, ptr, 4);
    LLVMValueRef sum = LLVMBuildFAdd(b, old, ds, "");
    aj_kb_store(kb, LLVMBuildSelect(b, first, ds, sum, ""), ptr, 4);
    aj_kb_if_end(kb);
}

/* Whether the tile at (i0, j0) lies inside the lengths (i0 NULL: the
 * keys alone). */
static LLVMValueRef tile_inside(ebwd *e, LLVMValueRef i0, LLVMValueRef j0)
{
    LLVMBuilderRef b = e->b;
    LLVMValueRef in = LLVMBuildICmp(
        b, LLVMIntSLE, LLVMBuildAdd(b, j0, aj_kb_i32(e->kb, e->p.bn), ""), e->seq_k, "");
    if (i0)
        in = LLVMBuildAnd(b, in,
                          LLVMBuildICmp(b, LLVMIntSLE,
                                        LLVMBuildAdd(b, i0, aj_kb_i32(e->kb, e->p.bm), ""),
                                        e->seq_q, ""),
                          "");
    return in;
}

/* The element passes of both kernels, as aj_score_by_tile_class's bodies
 * (a `full` tile, inside the lengths, tests no element).
 *
 * dkdv: P^T and dS^T of the block's keys by the step's queries into shared
 * memory; rows past Sq see nothing (their Q and dO tiles are zeros). */
typedef struct dkdv_pass {
    ebwd *e;
    LLVMValueRef m0, n0;
    const LLVMValueRef *keys, *qcols;
    LLVMValueRef (*s_acc)[MAX_COLS], (*dp_acc)[MAX_COLS];
    int32_t smem_stats, smem_p, smem_ds;
    int ldp;
} dkdv_pass;

static void emit_dkdv_pass(void *user, int full)
{
    const dkdv_pass *x = user;
    ebwd *e = x->e;
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    for (int t = 0; t < e->p.bm / e->p.g; t++) {
        LLVMValueRef i = LLVMBuildAdd(b, x->m0, x->qcols[t], "");
        LLVMValueRef lse2 = smem_load1(e, x->smem_stats, x->qcols[t]);
        LLVMValueRef delta =
            smem_load1(e, x->smem_stats, LLVMBuildAdd(b, x->qcols[t], aj_kb_i32(kb, e->p.bm), ""));
        for (int k = 0; k < e->p.bn / e->p.r; k++) {
            LLVMValueRef j = LLVMBuildAdd(b, x->n0, x->keys[k], "");
            LLVMValueRef pr, ds;
            emit_p_ds(e, full, e->seq_q, x->s_acc[k][t], x->dp_acc[k][t], i, j, lse2, delta,
                      &pr, &ds);
            LLVMValueRef idx = LLVMBuildAdd(
                b, LLVMBuildMul(b, x->keys[k], aj_kb_i32(kb, x->ldp), ""), x->qcols[t], "");
            aj_smem_store1(kb, x->smem_p, idx, pr);
            aj_smem_store1(kb, x->smem_ds, idx, ds);
        }
    }
}

/* dq: dS of the CTA's rows by the key block into shared memory and, with
 * bias, into dbias (hidden elements add 0). */
typedef struct dq_pass {
    ebwd *e;
    LLVMValueRef n0;
    const LLVMValueRef *rows, *kcols, *gi, *lse2, *delta, *dbias_row;
    LLVMValueRef (*s_acc)[MAX_COLS], (*dp_acc)[MAX_COLS];
    LLVMValueRef first;
    int32_t smem_ds;
    int lds;
} dq_pass;

static void emit_dq_pass(void *user, int full)
{
    const dq_pass *x = user;
    ebwd *e = x->e;
    for (int k = 0; k < e->p.bm / e->p.r; k++)
        for (int t = 0; t < e->p.bn / e->p.g; t++) {
            LLVMValueRef j = LLVMBuildAdd(e->b, x->n0, x->kcols[t], "");
            LLVMValueRef pr, ds;
            emit_p_ds(e, full, NULL, x->s_acc[k][t], x->dp_acc[k][t], x->gi[k], j, x->lse2[k],
                      x->delta[k], &pr, &ds);
            aj_smem_store1(
                e->kb, x->smem_ds,
                LLVMBuildAdd(e->b, LLVMBuildMul(e->b, x->rows[k], aj_kb_i32(e->kb, x->lds), ""),
                             x->kcols[t], ""),
                ds);
            if (x->dbias_row)
                emit_dbias_add(e, x->dbias_row[k], x->gi[k], j, ds, x->first);
        }
}

/* ---------------------------------------------------------------- stages */

/* A kernel of this template: its parameters and name, whether a CTA owns
 * a key block (dkdv) or a query block (dq), and the gradients a thread
 * sums, out[0] and out[1] (dkdv: dK over D, dV over Dv; dq: dQ over D). */
typedef struct ebwd_stage {
    aj_kernel_sig sig;
    const char *name;
    int by_keys;
    int n_out;
    const char *out_names[2];
} ebwd_stage;

static const ebwd_stage dkdv_stage = {AJ_KSIG_EFFICIENT_BWD_DKDV, "dkdv", 1, 2, {"dk", "dv"}};
static const ebwd_stage dq_stage = {AJ_KSIG_EFFICIENT_BWD_DQ, "dq", 0, 1, {"dq", NULL}};

enum { OUT_DK = 0, OUT_DV = 1, OUT_DQ = 0 };
enum { W_D = 0, W_DV = 1 };

/* A CTA of either kernel: the block it owns (dkdv: keys x0 .., of KV head
 * `head`; dq: query rows x0 .., of query head `head`), the thread's nr
 * rows of it (group + R k) and nc columns of a step (lane + G t), a
 * step's S and dP sums and the gradient rows it adds up.  Its f32 tiles,
 * D and Dv wide (W_D, W_DV): the block's own (dkdv: K, V; dq: Q, dO) and
 * a step's walked past it (dkdv: Q, dO; dq: K, V). */
typedef struct ebwd_cta {
    ebwd e;
    int nr, nc;
    LLVMValueRef rows[MAX_ROWS], cols[MAX_COLS];                /* i32 */
    LLVMValueRef s[MAX_ROWS][MAX_COLS], dp[MAX_ROWS][MAX_COLS];  /* vars, set per step */
    LLVMValueRef out[2][MAX_ROWS][MAX_OUT];                      /* vars, from zero */
    int32_t own[2], walked[2];   /* shared tiles [W_D], [W_DV]: the block's, a step's */
    int ld[2];                   /* their pitches in floats */
    LLVMValueRef x0, head, bidx;                                 /* i32 */
    LLVMValueRef group_size;                                     /* i32: Hq / Hkv */
} ebwd_cta;

/* The prologue both kernels share: parameters, thread layout, the
 * thread's sums and its place in the block. */
static void begin_cta(ebwd_cta *c, aj_kb *kb, const aj_op *op, const ebwd_plan *plan,
                      const aj_score_prog *prog, const ebwd_stage *st)
{
    aj_params_declare(kb, st->sig, op, prog);
    aj_kb_begin_stage(kb, st->name, plan->threads);
    setup(&c->e, kb, op, plan, prog);
    const ebwd_plan *p = &c->e.p;
    LLVMBuilderRef b = kb->b;
    int block = st->by_keys ? p->bn : p->bm, step = st->by_keys ? p->bm : p->bn;
    c->nr = block / p->r;
    c->nc = step / p->g;
    for (int k = 0; k < c->nr; k++) {
        for (int t = 0; t < c->nc; t++) {
            c->s[k][t] = aj_kb_var(kb, kb->t_f32, NULL, "s");
            c->dp[k][t] = aj_kb_var(kb, kb->t_f32, NULL, "dp");
        }
        for (int o = 0; o < st->n_out; o++)
            for (int x = 0; x < (o == 0 ? p->wd : p->wdv) / p->g; x++)
                c->out[o][k][x] = zero_var(kb, st->out_names[o]);
    }
    c->x0 = LLVMBuildMul(b, aj_kb_block_id(kb, 0), aj_kb_i32(kb, block),
                         st->by_keys ? "n0" : "m0");
    c->head = aj_kb_block_id(kb, 1);
    c->bidx = aj_kb_block_id(kb, 2);
    c->group_size =
        LLVMBuildSDiv(b, aj_param(kb, AJ_PID(heads_q)), aj_param(kb, AJ_PID(heads_kv)), "");
    c->ld[W_D] = p->wd + 4;
    c->ld[W_DV] = p->wdv + 4;
    for (int x = 0; x < 2; x++)
        c->own[x] = aj_kb_smem_reserve(kb, 4 * block * c->ld[x]);
    for (int x = 0; x < 2; x++)
        c->walked[x] = aj_kb_smem_reserve(kb, 4 * step * c->ld[x]);
    for (int k = 0; k < c->nr; k++)
        c->rows[k] = LLVMBuildAdd(b, c->e.group, aj_kb_i32(kb, p->r * k), "");
    for (int t = 0; t < c->nc; t++)
        c->cols[t] = LLVMBuildAdd(b, c->e.lane, aj_kb_i32(kb, p->g * t), "");
}

/* A step's S and dP: the thread's rows of the own tiles by its columns
 * of the walked ones (dkdv: S^T = K Q^T, dP^T = V dO^T; dq: S = Q K^T,
 * dP = dO V^T). */
static void emit_step_dots(ebwd_cta *c)
{
    ebwd *e = &c->e;
    emit_dots(e, c->s, c->nr, c->rows, c->own[W_D], c->ld[W_D], c->nc, c->cols, c->walked[W_D],
              c->ld[W_D], e->p.d);
    emit_dots(e, c->dp, c->nr, c->rows, c->own[W_DV], c->ld[W_DV], c->nc, c->cols,
              c->walked[W_DV], c->ld[W_DV], e->p.dv);
}

/* Either kernel's walk (dkdv: row blocks of `per` rows, dq: key blocks
 * of `per` keys): per tile at its walk position, its first row or key x0
 * (named `name`) and class (NULL without a mask), a barrier (the previous
 * step's readers are done), then `step`; with `skips` (a mask rest the
 * walk's band does not bound) only where the class is not skip. */
static void walk_steps(ebwd_cta *c, const aj_score_walk *walk, int per, const char *name,
                       int skips, void (*step)(void *user, LLVMValueRef x0, LLVMValueRef cls),
                       void *user)
{
    ebwd *e = &c->e;
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef at = aj_kb_for_begin(kb, walk->begin, walk->end, aj_kb_i32(kb, 1), "walk");
    LLVMValueRef cls = NULL;
    LLVMValueRef x = aj_score_walk_tile(&e->sc, walk, at, aj_score_has_mask(e->prog) ? &cls
                                                                                      : NULL);
    LLVMValueRef x0 = LLVMBuildMul(b, x, aj_kb_i32(kb, per), name);
    if (skips)
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntNE, cls, aj_kb_i32(kb, AJ_TILE_SKIP), ""));
    aj_kb_barrier(kb);   /* the previous step's readers are done */
    step(user, x0, cls);
    if (skips)
        aj_kb_if_end(kb);
    aj_kb_for_end(kb);
}

/* The end of either kernel: its launch layout, a CTA per block it owns. */
static void finish_cta(ebwd_cta *c, const ebwd_stage *st)
{
    const ebwd_plan *p = &c->e.p;
    aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, p->bm}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {p->bm, p->bn, p->warps, 1},
    };
    if (st->by_keys) {
        layout.grid[0] = (aj_grid_dim){AJ_EXTENT_SEQ_K, p->bn};
        layout.grid[1].extent = AJ_EXTENT_HEADS_KV;
    }
    aj_kb_finish(c->e.kb, &layout);
}

/* ---------------------------------------------------------------- dkdv */

/* Element offsets (i64) of the (b, h) slices a step reads. */
typedef struct head_slices {
    LLVMValueRef q, o, dout, lse;
} head_slices;

/* The dkdv CTA: beside K, V (own) and a step's Q, dO (walked), its P^T,
 * dS^T and row stats in shared memory; the row blocks the band shows its
 * keys. */
typedef struct dkdv_cta {
    ebwd_cta c;
    int ldp;
    int32_t smem_p, smem_ds, smem_stats;
    LLVMValueRef j_last;           /* i32: the block's last key inside Sk */
    LLVMValueRef m_begin, m_end;   /* i32: row blocks holding a row that sees one */
    const head_slices *hs;         /* the current head's slices */
} dkdv_cta;

static void dkdv_prologue(dkdv_cta *d, aj_kb *kb, const aj_op *op, const ebwd_plan *plan,
                          const aj_score_prog *prog)
{
    ebwd_cta *c = &d->c;
    begin_cta(c, kb, op, plan, prog, &dkdv_stage);
    ebwd *e = &c->e;
    const ebwd_plan *p = &e->p;
    LLVMBuilderRef b = kb->b;
    d->ldp = p->bm + 4;
    d->smem_p = aj_kb_smem_reserve(kb, 4 * p->bn * d->ldp);
    d->smem_ds = aj_kb_smem_reserve(kb, 4 * p->bn * d->ldp);
    d->smem_stats = aj_kb_smem_reserve(kb, 4 * 2 * p->bm);   /* lse2[bm], delta[bm] */
    load_rows(e, AJ_PSRC_k, aj_attn_slice_base(kb, AJ_PSRC_k, c->bidx, c->head), c->x0,
              e->seq_k, p->bn, p->d, c->own[W_D], c->ld[W_D]);
    load_rows(e, AJ_PSRC_v, aj_attn_slice_base(kb, AJ_PSRC_v, c->bidx, c->head), c->x0,
              e->seq_k, p->bn, p->dv, c->own[W_DV], c->ld[W_DV]);

    /* query rows the band shows a key of this block (for every head) */
    set_head(e, c->bidx, LLVMBuildMul(b, c->head, c->group_size, ""));
    d->j_last = LLVMBuildSub(
        b, aj_kb_smin(kb, LLVMBuildAdd(b, c->x0, aj_kb_i32(kb, p->bn), ""), e->seq_k),
        aj_kb_i32(kb, 1), "");
    LLVMValueRef i_lo, i_hi;
    aj_score_row_range(&e->sc, c->x0, d->j_last, e->seq_q, &i_lo, &i_hi);
    block_range(e, i_lo, i_hi, p->bm, &d->m_begin, &d->m_end);
}

/* A step's row stats: LSE and Delta of its rows m0 .. into shared memory,
 * by row groups over the rows. */
static void dkdv_row_stats(dkdv_cta *d, LLVMValueRef m0, const head_slices *hs)
{
    ebwd *e = &d->c.e;
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ebwd_plan *p = &e->p;
    LLVMValueRef last = LLVMBuildSub(b, e->seq_q, aj_kb_i32(kb, 1), "");
    for (int k = 0; k < (p->bm + p->r - 1) / p->r; k++) {
        LLVMValueRef row = LLVMBuildAdd(b, e->group, aj_kb_i32(kb, p->r * k), "");
        LLVMValueRef rowc = aj_kb_smin(kb, row, aj_kb_i32(kb, p->bm - 1));
        LLVMValueRef ic = aj_kb_smin(kb, LLVMBuildAdd(b, m0, rowc, ""), last);
        LLVMValueRef lse2, delta;
        emit_row_stats(e, ic, hs->o, hs->dout, hs->lse, &lse2, &delta);
        LLVMValueRef store = LLVMBuildICmp(b, LLVMIntEQ, e->lane, aj_kb_i32(kb, 0), "");
        store = LLVMBuildAnd(b, store, LLVMBuildICmp(b, LLVMIntSLT, row, aj_kb_i32(kb, p->bm), ""),
                             "");
        aj_kb_if_begin(kb, store);
        aj_smem_store1(kb, d->smem_stats, row, lse2);
        aj_smem_store1(kb, d->smem_stats, LLVMBuildAdd(b, row, aj_kb_i32(kb, p->bm), ""), delta);
        aj_kb_if_end(kb);
    }
}

/* walk_steps' step, the row block at m0 (class cls): its Q, dO and stats,
 * S^T and dP^T, P^T and dS^T, then dV += P^T dO and dK += dS^T Q. */
static void dkdv_step(void *user, LLVMValueRef m0, LLVMValueRef cls)
{
    dkdv_cta *d = user;
    const head_slices *hs = d->hs;
    ebwd_cta *c = &d->c;
    ebwd *e = &c->e;
    aj_kb *kb = e->kb;
    const ebwd_plan *p = &e->p;
    load_rows(e, AJ_PSRC_q, hs->q, m0, e->seq_q, p->bm, p->d, c->walked[W_D], c->ld[W_D]);
    load_rows(e, AJ_PSRC_do, hs->dout, m0, e->seq_q, p->bm, p->dv, c->walked[W_DV], c->ld[W_DV]);
    dkdv_row_stats(d, m0, hs);
    aj_kb_barrier(kb);
    emit_step_dots(c);
    dkdv_pass pass = {e, m0, c->x0, c->rows, c->cols, c->s, c->dp, d->smem_stats, d->smem_p,
                      d->smem_ds, d->ldp};
    aj_score_by_tile_class(kb, cls, tile_inside(e, m0, c->x0), emit_dkdv_pass, &pass);
    aj_kb_barrier(kb);   /* P^T and dS^T complete */
    emit_accumulate(e, c->out[OUT_DV], c->nr, c->rows, d->smem_p, d->ldp, p->bm, c->walked[W_DV],
                    c->ld[W_DV], p->wdv);
    emit_accumulate(e, c->out[OUT_DK], c->nr, c->rows, d->smem_ds, d->ldp, p->bm, c->walked[W_D],
                    c->ld[W_D], p->wd);
}

/* The query heads of the KV head's group, and per head the row blocks of
 * the range, or the block mask's list of the key block (score.h). */
static void dkdv_mainloop(dkdv_cta *d)
{
    ebwd_cta *c = &d->c;
    ebwd *e = &c->e;
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef hq =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), c->group_size, aj_kb_i32(kb, 1), "hq");
    LLVMValueRef h = LLVMBuildAdd(b, LLVMBuildMul(b, c->head, c->group_size, ""), hq, "h");
    set_head(e, c->bidx, h);
    head_slices hs;
    hs.q = aj_attn_slice_base(kb, AJ_PSRC_q, c->bidx, h);
    hs.o = aj_attn_slice_base(kb, AJ_PSRC_o, c->bidx, h);
    hs.dout = aj_attn_slice_base(kb, AJ_PSRC_do, c->bidx, h);
    hs.lse = aj_attn_slice_base(kb, AJ_PSRC_lse, c->bidx, h);
    aj_score_walk walk;
    aj_score_walk_rows(&e->sc, &walk, c->x0, d->j_last, e->p.bm, d->m_begin, d->m_end, e->seq_q,
                       e->seq_k);
    d->hs = &hs;
    /* skip tiles only where the mask has a rest: the band bounds the walk */
    walk_steps(c, &walk, e->p.bm, "m0", aj_score_has_rest(e->prog), dkdv_step, d);
    aj_kb_for_end(kb);
}

/* dK (times the scale) and dV of the block's keys. */
static void dkdv_epilogue(dkdv_cta *d)
{
    ebwd_cta *c = &d->c;
    ebwd *e = &c->e;
    const ebwd_plan *p = &e->p;
    LLVMValueRef dk_base = aj_attn_slice_base(e->kb, AJ_PSRC_dk, c->bidx, c->head);
    LLVMValueRef dv_base = aj_attn_slice_base(e->kb, AJ_PSRC_dv, c->bidx, c->head);
    for (int k = 0; k < c->nr; k++) {
        LLVMValueRef j = LLVMBuildAdd(e->b, c->x0, c->rows[k], "");
        emit_store_row(e, AJ_PSRC_dk, dk_base, j, e->seq_k, c->out[OUT_DK][k], p->d,
                       aj_op_scale(e->op));
        emit_store_row(e, AJ_PSRC_dv, dv_base, j, e->seq_k, c->out[OUT_DV][k], p->dv, 1.0);
    }
    finish_cta(c, &dkdv_stage);
}

static void build_dkdv(aj_kb *kb, const aj_op *op, const ebwd_plan *plan,
                       const aj_score_prog *prog)
{
    dkdv_cta d;
    dkdv_prologue(&d, kb, op, plan, prog);
    dkdv_mainloop(&d);
    dkdv_epilogue(&d);
}

/* ---------------------------------------------------------------- dq */

/* The dq CTA: beside Q, dO (own) and a key block's K, V (walked), its dS
 * in shared memory; per thread row its global row gi, LSE (log2), Delta and (bias)
 * dbias row; with bias, `first`: whether the pair writes dbias. */
typedef struct dq_cta {
    ebwd_cta c;
    int has_bias;
    int lds;
    int32_t smem_ds;
    LLVMValueRef h, first;        /* i32: the (b, h) pair's head; i1 (bias) */
    LLVMValueRef k_base, v_base;  /* i64 */
    LLVMValueRef gi[MAX_ROWS], lse2[MAX_ROWS], delta[MAX_ROWS], dbias_row[MAX_ROWS];
} dq_cta;

/* With bias: opens the loop over the (b, h) pairs folded onto this CTA's
 * dbias slice (none unless the CTA owns it), pair x = (x / nh, x % nh)
 * over the broadcast dims, *bidx and *h becoming the pair's, dQ zeroed;
 * returns `first`, whether dbias is written, not added to.  The caller
 * closes the loop. */
static LLVMValueRef begin_bias_pairs(ebwd *e, LLVMValueRef *bidx, LLVMValueRef *h,
                                     LLVMValueRef dq[][MAX_OUT], int rm)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ebwd_plan *p = &e->p;
    LLVMValueRef bc_b =
        LLVMBuildICmp(b, LLVMIntEQ, aj_param(kb, AJ_PID(bias_batch)), aj_kb_i32(kb, 1), "");
    LLVMValueRef bc_h =
        LLVMBuildICmp(b, LLVMIntEQ, aj_param(kb, AJ_PID(bias_heads)), aj_kb_i32(kb, 1), "");
    LLVMValueRef zero = aj_kb_i32(kb, 0), one = aj_kb_i32(kb, 1);
    LLVMValueRef own_b = LLVMBuildOr(b, LLVMBuildNot(b, bc_b, ""),
                                     LLVMBuildICmp(b, LLVMIntEQ, *bidx, zero, ""), "");
    LLVMValueRef own_h = LLVMBuildOr(b, LLVMBuildNot(b, bc_h, ""),
                                     LLVMBuildICmp(b, LLVMIntEQ, *h, zero, ""), "");
    LLVMValueRef nb = LLVMBuildSelect(b, bc_b, aj_param(kb, AJ_PID(batch)), one, "");
    LLVMValueRef nh = LLVMBuildSelect(b, bc_h, aj_param(kb, AJ_PID(heads_q)), one, "");
    LLVMValueRef pairs = LLVMBuildSelect(b, LLVMBuildAnd(b, own_b, own_h, ""),
                                         LLVMBuildMul(b, nb, nh, ""), zero, "pairs");
    LLVMValueRef x = aj_kb_for_begin(kb, zero, pairs, one, "pair");
    *bidx = LLVMBuildSelect(b, bc_b, LLVMBuildUDiv(b, x, nh, ""), *bidx, "");
    *h = LLVMBuildSelect(b, bc_h, LLVMBuildURem(b, x, nh, ""), *h, "");
    LLVMValueRef first = LLVMBuildICmp(b, LLVMIntEQ, x, zero, "first");
    aj_kb_barrier(kb);   /* the previous pair's readers of Q, dO, dS are done */
    for (int k = 0; k < rm; k++)
        for (int c = 0; c < p->wd / p->g; c++)
            aj_kb_set(kb, dq[k][c], aj_kb_f32(kb, 0));
    return first;
}

/* The CTA's rows at their (b, h) (with bias, per pair of the loop this
 * opens): K/V slices, Q and dO tiles, each row's LSE (log2), Delta and
 * (bias) the element offset of its dbias row. */
static void dq_prologue(dq_cta *d, aj_kb *kb, const aj_op *op, const ebwd_plan *plan,
                        const aj_score_prog *prog)
{
    ebwd_cta *c = &d->c;
    d->has_bias = op->bias == AJ_BIAS_ADD;
    begin_cta(c, kb, op, plan, prog, &dq_stage);
    ebwd *e = &c->e;
    const ebwd_plan *p = &e->p;
    LLVMBuilderRef b = kb->b;
    d->lds = p->bn + 4;
    d->smem_ds = aj_kb_smem_reserve(kb, 4 * p->bm * d->lds);
    LLVMValueRef m0 = c->x0;
    d->h = c->head;
    /* with bias, the loop over the (b, h) pairs folded onto the CTA's dbias */
    d->first = d->has_bias ? begin_bias_pairs(e, &c->bidx, &d->h, c->out[OUT_DQ], c->nr) : NULL;
    LLVMValueRef hkv = LLVMBuildSDiv(b, d->h, c->group_size, "hkv");
    set_head(e, c->bidx, d->h);
    d->k_base = aj_attn_slice_base(kb, AJ_PSRC_k, c->bidx, hkv);
    d->v_base = aj_attn_slice_base(kb, AJ_PSRC_v, c->bidx, hkv);
    load_rows(e, AJ_PSRC_q, aj_attn_slice_base(kb, AJ_PSRC_q, c->bidx, d->h), m0, e->seq_q,
              p->bm, p->d, c->own[W_D], c->ld[W_D]);
    load_rows(e, AJ_PSRC_do, aj_attn_slice_base(kb, AJ_PSRC_do, c->bidx, d->h), m0, e->seq_q,
              p->bm, p->dv, c->own[W_DV], c->ld[W_DV]);
    LLVMValueRef o_base = aj_attn_slice_base(kb, AJ_PSRC_o, c->bidx, d->h);
    LLVMValueRef do_base = aj_attn_slice_base(kb, AJ_PSRC_do, c->bidx, d->h);
    LLVMValueRef lse_base = aj_attn_slice_base(kb, AJ_PSRC_lse, c->bidx, d->h);
    LLVMValueRef dbias_base =
        d->has_bias ? aj_attn_slice_base(kb, AJ_PSRC_dbias, c->bidx, d->h) : NULL;
    LLVMValueRef last = LLVMBuildSub(b, e->seq_q, aj_kb_i32(kb, 1), "");
    for (int k = 0; k < c->nr; k++) {
        d->gi[k] = LLVMBuildAdd(b, m0, c->rows[k], "");
        emit_row_stats(e, aj_kb_smin(kb, d->gi[k], last), o_base, do_base, lse_base, &d->lse2[k],
                       &d->delta[k]);
        if (d->has_bias)
            d->dbias_row[k] = LLVMBuildAdd(
                b, dbias_base,
                LLVMBuildMul(b, aj_kb_sext64(kb, d->gi[k]), aj_param(kb, AJ_PID(stride_dbias_s)),
                             ""),
                "");
    }
}

/* walk_steps' step, the key block at n0 (class cls): K and V, S and dP,
 * dS (and dbias), then dQ += dS K. */
static void dq_step(void *user, LLVMValueRef n0, LLVMValueRef cls)
{
    dq_cta *d = user;
    ebwd_cta *c = &d->c;
    ebwd *e = &c->e;
    aj_kb *kb = e->kb;
    const ebwd_plan *p = &e->p;
    load_rows(e, AJ_PSRC_k, d->k_base, n0, e->seq_k, p->bn, p->d, c->walked[W_D], c->ld[W_D]);
    load_rows(e, AJ_PSRC_v, d->v_base, n0, e->seq_k, p->bn, p->dv, c->walked[W_DV], c->ld[W_DV]);
    aj_kb_barrier(kb);
    emit_step_dots(c);
    dq_pass pass = {e,        n0,       c->rows, c->cols, d->gi, d->lse2, d->delta,
                    d->has_bias ? d->dbias_row : NULL, c->s, c->dp, d->first, d->smem_ds, d->lds};
    aj_score_by_tile_class(kb, cls, tile_inside(e, NULL, n0), emit_dq_pass, &pass);
    aj_kb_barrier(kb);   /* dS complete */
    emit_accumulate(e, c->out[OUT_DQ], c->nr, c->rows, d->smem_ds, d->lds, p->bn, c->walked[W_D],
                    c->ld[W_D], p->wd);
}

/* The key blocks holding a key visible to some row of the CTA (the
 * range, or the block mask's list of the row block, score.h); with bias
 * every key block, so that hidden elements get dbias = 0. */
static void dq_mainloop(dq_cta *d)
{
    ebwd_cta *c = &d->c;
    ebwd *e = &c->e;
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ebwd_plan *p = &e->p;
    LLVMValueRef m0 = c->x0;
    LLVMValueRef n_begin, n_end;
    LLVMValueRef rows_here =
        aj_kb_smin(kb, aj_kb_i32(kb, p->bm), LLVMBuildSub(b, e->seq_q, m0, ""));
    LLVMValueRef i_last =
        LLVMBuildAdd(b, m0, LLVMBuildSub(b, rows_here, aj_kb_i32(kb, 1), ""), "");
    if (d->has_bias) {
        n_begin = aj_kb_i32(kb, 0);
        n_end = LLVMBuildSDiv(b, LLVMBuildAdd(b, e->seq_k, aj_kb_i32(kb, p->bn - 1), ""),
                              aj_kb_i32(kb, p->bn), "");
    } else {
        LLVMValueRef j_lo_all, j_hi_all;
        aj_score_key_range(&e->sc, m0, i_last, e->seq_k, &j_lo_all, &j_hi_all);
        block_range(e, j_lo_all, j_hi_all, p->bn, &n_begin, &n_end);
    }
    aj_score_walk walk;
    aj_score_walk_keys(&e->sc, &walk, m0, i_last, p->bn, n_begin, n_end, e->seq_q, e->seq_k);
    if (d->has_bias)
        aj_score_walk_every(&walk);
    walk_steps(c, &walk, p->bn, "n0", aj_score_has_rest(e->prog) && !d->has_bias, dq_step, d);
}

/* dQ (times the scale) of the CTA's rows; with bias, the pair loop's end. */
static void dq_epilogue(dq_cta *d)
{
    ebwd_cta *c = &d->c;
    ebwd *e = &c->e;
    LLVMValueRef dq_base = aj_attn_slice_base(e->kb, AJ_PSRC_dq, c->bidx, d->h);
    for (int k = 0; k < c->nr; k++)
        emit_store_row(e, AJ_PSRC_dq, dq_base, d->gi[k], e->seq_q, c->out[OUT_DQ][k], e->p.d,
                       aj_op_scale(e->op));
    if (d->has_bias)
        aj_kb_for_end(e->kb);   /* the pair loop */
    finish_cta(c, &dq_stage);
}

static void build_dq(aj_kb *kb, const aj_op *op, const ebwd_plan *plan,
                     const aj_score_prog *prog)
{
    dq_cta d;
    dq_prologue(&d, kb, op, plan, prog);
    dq_mainloop(&d);
    dq_epilogue(&d);
}

static aj_status ebwd_build(aj_kb *kb, const aj_op *op, void *user)
{
    (void)user;
    ebwd_plan plan;
    const aj_score_prog *prog;
    aj_status st =
        aj_kctx_plan_programs(kb, op, plan_kernel(kb->ctx, op, kb->target, &plan), &prog);
    if (st != AJ_OK)
        return st;
    build_dkdv(kb, op, &plan, prog);
    build_dq(kb, op, &plan, prog);
    aj_grad_tail_build(kb, op, prog);
    return kb->st;
}

AJ_TEMPLATE(aj_template_efficient_bwd, "efficient_bwd", AJ_KIND_BACKWARD, AJ_VARIANT_EFFICIENT,
            ebwd_check, ebwd_build,
            .stage_sigs = {AJ_KSIG_EFFICIENT_BWD_DKDV, AJ_KSIG_EFFICIENT_BWD_DQ});
