/*
 * efficient_fwd.c -- the efficient-variant forward kernel (SIMT FMA).
 *
 * One CTA computes block_m query rows of one (batch, head), walking the key
 * blocks that its mask can see with an online softmax in f32.
 *
 *   grid  = (ceil(Sq / block_m), Hq, B)       block = warps * 32 threads
 *
 * Threads form R = T / G row groups of G lanes.  Group g owns rows
 * g, g+R, g+2R, ... (rm of them); lane l of a group owns key columns
 * l, l+G, ... of the score tile (cn of them) and output columns
 * 4l..4l+3, 4l+4G.., ... (cv of them; where G does not divide Dv / 4
 * the last chunk belongs to only some lanes), so a row's softmax statistics are
 * reduced with G-lane butterflies and never leave the warp:
 *
 *              keys (block_n) ──►             out cols (Dv) ──►
 *   rows  g0 │ l0 l1 .. lG-1 l0 l1 ..│    g0 │ l0:4 l1:4 .. lG-1:4 l0:4 ..│
 *    │    g1 │ l0 l1 ..              │    g1 │ ...                        │
 *    ▼    .. │                       │    .. │                            │
 *         g0 │ (row R)               │
 *
 * Shared memory (f32): Q tile [block_m][D+4], a K-then-V tile
 * [block_n][max(D,Dv)+4] and the probabilities P [block_m][block_n+4]; the
 * +4 padding staggers rows across banks and keeps 16-byte alignment.
 *
 * Per key block:  barrier, load K, barrier, S = Q K^T (scale, score_mod,
 * mask), online softmax (rescale O, write P), barrier, load V, barrier,
 * O += P V.  Key blocks that the mask hides for every row of the CTA are
 * never visited; rows that see no key end with O = 0 and LSE = -inf.
 *
 * Options:
 *   bias = add     s = scale q.k + bias[b,h,i,j] before softcap and alibi
 *                  (tests/lib/ref.h's order); size-1 dims broadcast through
 *                  stride 0.  Masked or out-of-range elements read a clamped,
 *                  in-bounds element whose value the mask then discards.
 *   dropout = p    after the online softmax statistics (which stay those of
 *                  the undropped scores) each P_ij written for O += P V is
 *                  multiplied by keep_ij / (1 - p), keep_ij from Philox4x32-10
 *                  keyed exactly as ref_dropout_keep (tests/lib/ref.h).
 *   accumulate     the epilogue reads a prior (O, LSE) of its rows from o_acc
 *                  (f32) and lse, and writes back their log-sum-exp merge
 *                  with this call's keys (docs/design.md "Merge of two partials").
 *
 * Launch contract: Sq, Sk < 2^30; position offsets and the mask shift are
 * any i64.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/attn_common.h"
#include "templates/skeleton.h"
#include "templates/cpu_attn.h"
#include "templates/score.h"
#include "templates/template.h"
#include "templates/tile_io.h"
#include "templates/tile_pipe.h"

#define MAX_RM 16
#define MAX_CN 16
#define MAX_CV 64

typedef struct efwd_plan {
    aj_dtype dtype, kv_dtype;      /* of O; of K and V (a paged cache's, f8 inputs') */
    aj_dtype q_dtype;              /* of Q: dtype, or f8 */
    int paged;                     /* layout = paged */
    int stream;                    /* paged: K/V streamed by cp.async (emit_key_blocks) */
    int d, dv;
    int bm, bn, warps, threads;
    int g, r, rm, cn, cv;          /* see the diagram above */
    int ldq, ldkv, ldp;            /* shared-memory row pitches, in floats */
    int32_t smem_q, smem_kv, smem_p, smem_rows, smem_qrows, smem_bytes;
    int32_t smem_stage_k, smem_stage_v;   /* stream: the raw K and V tiles in flight */
} efwd_plan;

/* Registers that hold per-thread state; above this ptxas starts to spill. */
#define REG_BUDGET 112

static int max_i(int a, int b) { return a > b ? a : b; }

/* Lanes per row group.  The widest that splits the key columns and the
 * 4-wide output column chunks evenly; where that leaves a lane more than
 * 16 output columns (Dv an odd multiple of 8 past 64), the widest that
 * splits the key columns and still gives every lane a chunk, the last
 * chunks then owned by only some lanes (see cv_chunks). */
static int row_group_lanes(int bn, int dv)
{
    int g = 16;
    while (g > 1 && (bn % g != 0 || dv % (4 * g) != 0))
        g /= 2;
    if (dv / g <= 16)
        return g;
    g = 16;
    while (g > 1 && (bn % g != 0 || 4 * g > dv))
        g /= 2;
    return g;
}

/* Output column chunks per lane: ceil(Dv / 4G); chunk u of lane l holds
 * columns 4l + 4Gu .. +3, stored only where they are < Dv. */
static int cv_chunks(int g, int dv)
{
    return (dv + 4 * g - 1) / (4 * g);
}

/* The template's model of one schedule (aj_attn_plan_fn). */
static aj_status plan_schedule(aj_ctx *ctx, const aj_op *op, aj_target target,
                               const aj_schedule *s, void *out)
{
    efwd_plan *p = out;
    memset(p, 0, sizeof *p);
    p->dtype = op->dtype;
    p->kv_dtype = aj_op_kv_dtype(op);
    p->q_dtype = aj_op_q_dtype(op);
    p->paged = op->layout == AJ_LAYOUT_PAGED;
    p->d = op->head_dim;
    p->dv = aj_op_dv(op);
    p->bm = s->block_m;
    p->bn = s->block_n;
    p->warps = s->warps;
    if (s->stages > 1)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: stages = %d is not supported by efficient forward "
                       "(it loads K/V in one stage; use stages = 1)", s->stages);
    if (p->bm > 128 || p->bn > 128)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: efficient forward supports block_m and block_n up to 128 "
                       "(got block_m = %d, block_n = %d)", p->bm, p->bn);
    if (p->warps > 8)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: efficient forward supports up to 8 warps (got %d)", p->warps);
    p->threads = p->warps * 32;

    p->g = row_group_lanes(p->bn, p->dv);
    p->r = p->threads / p->g;
    if (p->bm % p->r != 0)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d is smaller than the %d row groups of %d warps "
                       "at head_dim_v = %d; use more rows or fewer warps", p->bm, p->r,
                       p->warps, p->dv);
    p->rm = p->bm / p->r;
    p->cn = p->bn / p->g;
    p->cv = 4 * cv_chunks(p->g, p->dv);
    int regs = p->rm * (p->cn + p->cv + 2) + 4 * (p->rm + p->cn);
    if (p->rm > MAX_RM || p->cn > MAX_CN || p->cv > MAX_CV || regs > REG_BUDGET)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d, warps = %d needs about %d "
                       "registers of state per thread at head_dim %d/%d (budget %d); "
                       "use smaller tiles or more warps", p->bm, p->bn, p->warps, regs,
                       p->d, p->dv, REG_BUDGET);

    p->ldq = p->d + 4;
    /* the V tile's rows cover every lane's chunks, owned or not */
    p->ldkv = max_i(p->d, p->g * p->cv) + 4;
    p->ldp = p->bn + 4;
    int64_t bytes = 4 * ((int64_t)p->bm * p->ldq + (int64_t)p->bn * p->ldkv +
                         (int64_t)p->bm * p->ldp);
    if (p->paged)   /* the key tile's row table, the packed query rows' */
        bytes += aj_tile_paged_rows_bytes(p->bn) + aj_tile_paged_rows_bytes(p->bm);
    if (bytes > aj_target_smem_limit(target))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d needs %lld bytes of shared "
                       "memory at head_dim %d/%d; %s allows %d", p->bm, p->bn,
                       (long long)bytes, p->d, p->dv, aj_target_name(target),
                       aj_target_smem_limit(target));
    if (p->paged) {
        /* streamed where a raw K and a raw V tile fit beside (d 256 with
         * an f32 cache on sm_80 does not: 219 KB) and their rows split
         * into 16-byte chunks (an f8 cache: head dims a multiple of 16);
         * else the threads load each tile as they need it */
        int size = aj_dtype_size(p->kv_dtype);
        int64_t staged = (int64_t)p->bn * (p->d + p->dv) * size;
        p->stream = (p->d * size) % 16 == 0 && (p->dv * size) % 16 == 0 &&
                    bytes + staged <= aj_target_smem_limit(target);
    }
    return AJ_OK;
}

/* Schedules in order of preference: (padded) 32 x 32 tiles keep a thread's
 * accumulators small (4 rows of at most 8 + 2 values; 8 warps halve the
 * rows past head dim 128) so that ptxas needs no spills on sm_80 or
 * sm_90; narrower key tiles and fewer warps where the output columns a
 * lane owns leave less room. */
static aj_status plan_kernel(aj_ctx *ctx, const aj_op *op, aj_target target, efwd_plan *p)
{
    int wide = max_i(op->head_dim, aj_op_dv(op)) > 128;
    /* layout = paged (decode: Sq of 1..16 rows) first tries 16-row blocks
     * over 64-key tiles, so that a tile's rows are mostly real queries and
     * its loads long */
    int paged = op->layout == AJ_LAYOUT_PAGED;
    const aj_schedule candidates[] = {
        {16, 64, 2, 1},            {16, 64, 4, 1},            {16, 32, 4, 1},
        {32, 32, wide ? 8 : 4, 1}, {32, 32, wide ? 4 : 2, 1}, {32, 32, 1, 1},
        {64, 16, 4, 1},            {32, 16, 2, 1},            {16, 16, 1, 1},
        {16, 8, 1, 1},
        /* where the shared memory is smaller (sm_89's 99 KiB) past head dim
         * 256: fewer rows and keys, 8 warps for the output columns */
        {32, 16, 8, 1},            {16, 16, 8, 1},
    };
    const int first = paged ? 0 : 3;
    const aj_attn_schedule_rule rule = {
        .candidates = candidates + first,
        .n = (int)(sizeof candidates / sizeof candidates[0]) - first,
        .plan = plan_schedule,
    };
    return aj_attn_plan_schedule(ctx, op, target, &rule, p);
}

static aj_status efwd_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    if (op->layout == AJ_LAYOUT_VARLEN && op->bias == AJ_BIAS_ADD)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "bias = add with layout = varlen: the "
                       "efficient forward on sim and GPUs takes a bias over padded tensors "
                       "only (the cpu target takes both)");
    if (aj_flash_paged_takes(op, target))   /* the parts stage on mma tiles (flash_fwd.c) */
        return aj_flash_paged_check(ctx, op, target);
    aj_status st = aj_attn_check_dims(ctx, op, op->layout == AJ_LAYOUT_PAGED ? "paged forward"
                                                                             : "efficient forward",
                                      AJ_HEAD_DIM_MAX_EFFICIENT);
    efwd_plan plan;
    return st != AJ_OK ? st : aj_kctx_check_planned(ctx, op, plan_kernel(ctx, op, target, &plan));
}

/* ---------------------------------------------------------------- build */

/* Everything the emitters below share. */
typedef struct efwd {
    AJ_KCTX;                        /* skeleton.h; sc at this CTA's (b, h) (first h when packed) */
    efwd_plan p;
    LLVMValueRef lane, group;       /* i32 */
    LLVMValueRef m0;                /* i32: first row of the row block */
    LLVMValueRef rows;              /* i32: rows (padded: seq_q; paged: heads x seq_q) */
    LLVMValueRef i_first, i_last;   /* i32: the row block's positions span these */
    LLVMValueRef row_pos[MAX_RM];   /* i32: the query position of thread row k */
    LLVMValueRef row_head[MAX_RM];  /* i32: its head after the CTA's first; NULL: 0 */
    aj_score *row_sc[MAX_RM];       /* ... at thread row k's (b, h): &sc, or per row */
    int per_row_sc;                 /* paged GQA packing with programs reading h */
    LLVMValueRef bias_row;          /* i64: element offset of bias row i (bias) */
    LLVMValueRef k_scale, v_scale;  /* f32: an f8 cache's scales, else NULL */
    LLVMValueRef acc[MAX_RM][MAX_CN];    /* vars: Q K^T partial sums */
    LLVMValueRef o[MAX_RM][MAX_CV];      /* vars: output accumulators */
    LLVMValueRef m[MAX_RM], l[MAX_RM];   /* vars: running max (log2), sum */
} efwd;

/* The output tensor: o (the op's dtype), or o_acc (f32, read and written)
 * for accumulate kernels. */
static aj_param_source out_tensor(const aj_op *op)
{
    return op->accumulate ? AJ_PSRC_o_acc : AJ_PSRC_o;
}

static LLVMValueRef row_of(efwd *e, int k)
{
    /* local row (within the CTA) of this thread's k-th row */
    return LLVMBuildAdd(e->b, e->group, aj_kb_i32(e->kb, e->p.r * k), "");
}

static LLVMValueRef key_of(efwd *e, int t)
{
    return LLVMBuildAdd(e->b, e->lane, aj_kb_i32(e->kb, e->p.g * t), "");
}

/* The row block's last row that the row space has. */
static LLVMValueRef last_row(efwd *e)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef rows = aj_kb_smin(kb, aj_kb_i32(kb, e->p.bm), LLVMBuildSub(b, e->rows, e->m0, ""));
    return LLVMBuildAdd(b, e->m0, LLVMBuildSub(b, rows, aj_kb_i32(kb, 1), ""), "");
}

/* layout = padded: row k of a thread is position m0 + row_of(k), of the
 * CTA's head. */
static void rows_padded(efwd *e)
{
    e->rows = e->seq_q;
    e->i_first = e->m0;
    e->i_last = last_row(e);
    for (int k = 0; k < e->p.rm; k++) {
        e->row_pos[k] = LLVMBuildAdd(e->b, e->m0, row_of(e, k), "");
        e->row_head[k] = NULL;
        e->row_sc[k] = &e->sc;
    }
}

/* Key-block range [n_begin, n_end) holding a key visible to some row of
 * the row block; empty when no row sees any key. */
static void key_block_range(efwd *e, LLVMValueRef *n_begin, LLVMValueRef *n_end)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef j_lo, j_hi;
    aj_score_key_range(&e->sc, e->i_first, e->i_last, e->seq_k, &j_lo, &j_hi);
    LLVMValueRef bn = aj_kb_i32(kb, e->p.bn);
    LLVMValueRef begin = LLVMBuildSDiv(b, j_lo, bn, "");
    LLVMValueRef end = LLVMBuildSDiv(b, LLVMBuildAdd(b, j_hi, bn, ""), bn, "");
    LLVMValueRef empty = LLVMBuildICmp(b, LLVMIntSLT, j_hi, j_lo, "");
    *n_begin = LLVMBuildSelect(b, empty, aj_kb_i32(kb, 0), begin, "n_begin");
    *n_end = LLVMBuildSelect(b, empty, aj_kb_i32(kb, 0), end, "n_end");
}

/* acc[k][t] = sum_d Q[row_k][d] * K[key_t][d], read from shared memory */
static void emit_qk(efwd *e)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const efwd_plan *p = &e->p;
    for (int k = 0; k < p->rm; k++)
        for (int t = 0; t < p->cn; t++)
            aj_kb_set(kb, e->acc[k][t], aj_kb_f32(kb, 0));
    LLVMValueRef d4 = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, p->d / 4),
                                      aj_kb_i32(kb, 1), "d4");
    LLVMValueRef col = LLVMBuildShl(b, d4, aj_kb_i32(kb, 2), "");
    LLVMValueRef qv[MAX_RM], kv[MAX_CN];
    for (int k = 0; k < p->rm; k++)
        qv[k] = aj_smem_load4(kb, p->smem_q, LLVMBuildAdd(b, LLVMBuildMul(b, row_of(e, k),
                                     aj_kb_i32(kb, p->ldq), ""), col, ""));
    for (int t = 0; t < p->cn; t++)
        kv[t] = aj_smem_load4(kb, p->smem_kv, LLVMBuildAdd(b, LLVMBuildMul(b, key_of(e, t),
                                     aj_kb_i32(kb, p->ldkv), ""), col, ""));
    for (int k = 0; k < p->rm; k++)
        for (int t = 0; t < p->cn; t++) {
            LLVMValueRef a = aj_kb_get(kb, e->acc[k][t]);
            for (int c = 0; c < 4; c++) {
                LLVMValueRef idx = aj_kb_i32(kb, c);
                a = aj_kb_fma(kb, LLVMBuildExtractElement(b, qv[k], idx, ""),
                              LLVMBuildExtractElement(b, kv[t], idx, ""), a);
            }
            aj_kb_set(kb, e->acc[k][t], a);
        }
    aj_kb_for_end(kb);
}

/* bias[b, h, i, j] of the row's bias (aj_score_bias's load): keys past Sk
 * read the row's last key (in bounds; masked after) */
static LLVMValueRef load_bias(void *user, LLVMValueRef i, LLVMValueRef j)
{
    efwd *e = user;
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const aj_op *op = e->op;
    (void)i;
    LLVMValueRef jc = aj_kb_smin(kb, j, LLVMBuildSub(b, e->seq_k, aj_kb_i32(kb, 1), ""));
    LLVMValueRef at = LLVMBuildAdd(b, e->bias_row, aj_kb_sext64(kb, jc), "");
    LLVMTypeRef st = aj_kb_storage_type(kb, op->dtype);
    at = LLVMBuildMul(b, at, aj_kb_i64(kb, aj_dtype_size(op->dtype)), "");
    LLVMValueRef raw = aj_kb_load(kb, st, aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(bias)), at),
                                  (unsigned)aj_dtype_size(op->dtype));
    return aj_kb_to_f32(kb, raw, op->dtype);
}

/* The score of (row i, key j) in log2 units, or -inf where masked (in a
 * `full` tile: past the key length alone). */
static LLVMValueRef emit_score(efwd *e, aj_score *sc, LLVMValueRef acc, LLVMValueRef i,
                               LLVMValueRef j, int full)
{
    if (e->k_scale)
        acc = LLVMBuildFMul(e->b, acc, e->k_scale, "");
    aj_score_bias bias = {NULL, load_bias, e};
    LLVMValueRef s = aj_score_compose(sc, acc, AJ_SCORE_RAW,
                                      e->op->bias == AJ_BIAS_ADD ? &bias : NULL, i, j, NULL);
    LLVMValueRef visible = aj_score_visible_in_tile(sc, full, NULL, e->seq_k, i, j);
    return aj_score_hide(e->kb, s, visible);
}

/* Scores, online softmax update, rescale of O, P written to shared memory
 * (with dropout: the statistics take P undropped, shared memory gets
 * P keep / (1 - p)); a `full` tile tests no element against the mask. */
static void emit_softmax(efwd *e, LLVMValueRef n0, int full)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const efwd_plan *p = &e->p;
    for (int k = 0; k < p->rm; k++) {
        LLVMValueRef i = e->row_pos[k];
        if (e->op->bias == AJ_BIAS_ADD) {
            /* rows past Sq read the last row (in bounds; never stored) */
            LLVMValueRef ic = aj_kb_smin(kb, i, LLVMBuildSub(b, e->seq_q, aj_kb_i32(kb, 1), ""));
            e->bias_row = LLVMBuildAdd(
                b, e->bias_base,
                LLVMBuildMul(b, aj_kb_sext64(kb, ic), aj_param(kb, AJ_PID(stride_bias_s)), ""), "");
        }
        LLVMValueRef s[MAX_CN];
        LLVMValueRef mx = aj_kb_f32(kb, -INFINITY);
        for (int t = 0; t < p->cn; t++) {
            LLVMValueRef j = LLVMBuildAdd(b, n0, key_of(e, t), "");
            s[t] = emit_score(e, e->row_sc[k], aj_kb_get(kb, e->acc[k][t]), i, j, full);
            mx = aj_kb_fmax(kb, mx, s[t]);
        }
        mx = aj_kb_group_max(kb, mx, p->g);
        LLVMValueRef m_old = aj_kb_get(kb, e->m[k]);
        LLVMValueRef m_new = aj_kb_fmax(kb, m_old, mx);
        /* a row that has seen only masked keys keeps m = -inf; subtracting
         * 0 instead makes every p and alpha exactly 0, never NaN */
        LLVMValueRef none = LLVMBuildFCmp(b, LLVMRealOEQ, m_new, aj_kb_f32(kb, -INFINITY), "");
        LLVMValueRef m_use = LLVMBuildSelect(b, none, aj_kb_f32(kb, 0), m_new, "");
        LLVMValueRef alpha = aj_kb_exp2(kb, LLVMBuildFSub(b, m_old, m_use, ""));
        LLVMValueRef sum = aj_kb_f32(kb, 0);
        LLVMValueRef prow = LLVMBuildMul(b, row_of(e, k), aj_kb_i32(kb, p->ldp), "");
        for (int t = 0; t < p->cn; t++) {
            LLVMValueRef pr = aj_kb_exp2(kb, LLVMBuildFSub(b, s[t], m_use, ""));
            sum = LLVMBuildFAdd(b, sum, pr, "");
            if (e->op->dropout > 0) {
                LLVMValueRef keep = aj_attn_dropout_keep(kb, &e->drop, e->op->dropout, i,
                                                         LLVMBuildAdd(b, n0, key_of(e, t), ""));
                pr = aj_score_dropped(kb, e->op->dropout, keep, pr);
            }
            aj_smem_store1(kb, p->smem_p, LLVMBuildAdd(b, prow, key_of(e, t), ""), pr);
        }
        aj_kb_set(kb, e->l[k], aj_kb_fma(kb, aj_kb_get(kb, e->l[k]), alpha, sum));
        aj_kb_set(kb, e->m[k], m_new);
        for (int c = 0; c < p->cv; c++)
            aj_kb_set(kb, e->o[k][c], LLVMBuildFMul(b, aj_kb_get(kb, e->o[k][c]), alpha, ""));
    }
}

/* emit_softmax as aj_score_by_tile_class's body. */
typedef struct efwd_tile {
    efwd *e;
    LLVMValueRef n0;
} efwd_tile;

static void emit_softmax_tile(void *user, int full)
{
    efwd_tile *t = user;
    emit_softmax(t->e, t->n0, full);
}

/* o[k][4u+w] += sum_c P[row_k][c] * V[c][4 lane + 4 G u + w] */
static void emit_pv(efwd *e)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const efwd_plan *p = &e->p;
    int chunks = p->cv / 4;
    LLVMValueRef c4 = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, p->bn / 4),
                                      aj_kb_i32(kb, 1), "c4");
    LLVMValueRef c0 = LLVMBuildShl(b, c4, aj_kb_i32(kb, 2), "");
    LLVMValueRef pv[MAX_RM];
    for (int k = 0; k < p->rm; k++)
        pv[k] = aj_smem_load4(kb, p->smem_p, LLVMBuildAdd(b, LLVMBuildMul(b, row_of(e, k),
                                     aj_kb_i32(kb, p->ldp), ""), c0, ""));
    LLVMValueRef o[MAX_RM][MAX_CV];
    for (int k = 0; k < p->rm; k++)
        for (int c = 0; c < p->cv; c++)
            o[k][c] = aj_kb_get(kb, e->o[k][c]);
    LLVMValueRef lane_col = LLVMBuildShl(b, e->lane, aj_kb_i32(kb, 2), "");
    for (int w = 0; w < 4; w++) {
        LLVMValueRef vrow = LLVMBuildMul(b, LLVMBuildAdd(b, c0, aj_kb_i32(kb, w), ""),
                                         aj_kb_i32(kb, p->ldkv), "");
        for (int u = 0; u < chunks; u++) {
            LLVMValueRef idx = LLVMBuildAdd(b, vrow, LLVMBuildAdd(b, lane_col,
                                            aj_kb_i32(kb, 4 * p->g * u), ""), "");
            LLVMValueRef vv = aj_smem_load4(kb, p->smem_kv, idx);
            for (int k = 0; k < p->rm; k++) {
                LLVMValueRef pk = LLVMBuildExtractElement(b, pv[k], aj_kb_i32(kb, w), "");
                for (int x = 0; x < 4; x++)
                    o[k][4 * u + x] = aj_kb_fma(kb, pk, LLVMBuildExtractElement(b, vv,
                                                aj_kb_i32(kb, x), ""), o[k][4 * u + x]);
            }
        }
    }
    for (int k = 0; k < p->rm; k++)
        for (int c = 0; c < p->cv; c++)
            aj_kb_set(kb, e->o[k][c], o[k][c]);
    aj_kb_for_end(kb);
}

/*
 * accumulate: merges this call's row (O_new, L_new) into the prior
 * (O_p, L_p) read from o_acc and lse, in log2 units:
 *
 *     L = log2(2^L_p + 2^L_new)        (max first, for range)
 *     O = O_p 2^(L_p - L) + O_new 2^(L_new - L)
 *
 * Both -inf gives O = 0, L = -inf; a side at -inf weighs 0 and its O is
 * never multiplied (whatever it holds, NaN included).  The prior LSE is
 * taken from lane 0 of the row group by a group sum (the other lanes add
 * 0, exactly), so that every lane's read of it precedes lane 0's store.
 * Returns the weights of the prior and of this call's O, and stores the
 * merged LSE (ln units) in *lse_out (aj_attn_merge_weights).
 */
static void emit_merge_weights(efwd *e, LLVMValueRef lse_prior, LLVMValueRef l2_new,
                               LLVMValueRef *w_prior, LLVMValueRef *w_new,
                               LLVMValueRef *lse_out)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef is_lane0 = LLVMBuildICmp(b, LLVMIntEQ, e->lane, aj_kb_i32(kb, 0), "");
    lse_prior = aj_kb_group_sum(kb, LLVMBuildSelect(b, is_lane0, lse_prior, aj_kb_f32(kb, 0), ""),
                                e->p.g);
    aj_attn_merge_weights(kb, lse_prior, l2_new, w_prior, w_new, lse_out);
}

/* Where the epilogue writes: row i of head h (after the CTA's first) of
 * O at element o_base + h o_head + i o_stride of tensor parameter `o` (of
 * `dtype`), its LSE at lse_base + h lse_head + i of `lse`. */
typedef struct efwd_out {
    aj_param_source o, lse;
    aj_dtype dtype;
    LLVMValueRef o_base, o_stride, lse_base;   /* i64 */
    LLVMValueRef o_head, lse_head;             /* i64; NULL: one head */
} efwd_out;

/* The global head of thread row k: its score's, or the CTA's first plus
 * the row's head in a GQA-packed block whose programs do not read h. */
static LLVMValueRef row_head_global(efwd *e, int k)
{
    if (e->per_row_sc || !e->row_head[k])
        return e->row_sc[k]->h;
    return LLVMBuildAdd(e->b, e->sc.h, aj_kb_sext64(e->kb, e->row_head[k]), "");
}

/* O = acc / l (0 for rows that saw no key), LSE = (m + log2 l) ln 2; with
 * sinks, the sink folded in where the row is finished (not in a split-KV
 * part's partial); with accumulate, both merged into the prior (O, LSE)
 * first. */
static void emit_epilogue(efwd *e, const efwd_out *dst)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const efwd_plan *p = &e->p;
    int accumulate = e->op->accumulate;
    const aj_param_source out = dst->o;
    aj_dtype out_dtype = dst->dtype;
    LLVMValueRef o_base = dst->o_base, lse_base = dst->lse_base;
    LLVMValueRef lane_col = aj_kb_sext64(kb, LLVMBuildShl(b, e->lane, aj_kb_i32(kb, 2), ""));
    LLVMValueRef last_pos = LLVMBuildSub(b, e->seq_q, aj_kb_i32(kb, 1), "");
    for (int k = 0; k < p->rm; k++) {
        LLVMValueRef lsum = aj_kb_group_sum(kb, aj_kb_get(kb, e->l[k]), p->g);
        LLVMValueRef r = LLVMBuildAdd(b, e->m0, row_of(e, k), "");
        /* lsum is 0 only for a row that saw no key; NaN (from a NaN or Inf
         * input) counts as seen, so O and LSE become NaN, not 0 and -inf */
        LLVMValueRef seen = LLVMBuildFCmp(b, LLVMRealUNE, lsum, aj_kb_f32(kb, 0), "");
        LLVMValueRef inv = LLVMBuildSelect(b, seen, LLVMBuildFDiv(b, aj_kb_f32(kb, 1), lsum, ""),
                                           aj_kb_f32(kb, 0), "");
        LLVMValueRef l2 = LLVMBuildFAdd(b, aj_kb_get(kb, e->m[k]), aj_kb_log2(kb, lsum), "");
        l2 = LLVMBuildSelect(b, seen, l2, aj_kb_f32(kb, -INFINITY), "");
        LLVMValueRef lse = LLVMBuildFMul(b, l2, aj_kb_f32(kb, AJ_LN2), "");
        /* rows past the row space read the last position: in bounds,
         * never stored */
        LLVMValueRef ic = aj_kb_sext64(kb, aj_kb_smin(kb, e->row_pos[k], last_pos));
        LLVMValueRef lse_row = LLVMBuildAdd(b, lse_base, ic, "");
        LLVMValueRef orow = LLVMBuildAdd(b, o_base, LLVMBuildMul(b, ic, dst->o_stride, ""), "");
        if (e->row_head[k]) {
            LLVMValueRef hr = aj_kb_sext64(kb, e->row_head[k]);
            lse_row = LLVMBuildAdd(b, lse_row, LLVMBuildMul(b, hr, dst->lse_head, ""), "");
            orow = LLVMBuildAdd(b, orow, LLVMBuildMul(b, hr, dst->o_head, ""), "");
        }
        LLVMValueRef lse_ptr = aj_kb_gptr_offset(kb, aj_param_data(kb, dst->lse),
                                                 LLVMBuildMul(b, lse_row, aj_kb_i64(kb, 4), ""));
        /* an f8 cache's V scale applies to O once, not to each V */
        LLVMValueRef w_prior = NULL;
        LLVMValueRef scale_new = e->v_scale ? LLVMBuildFMul(b, inv, e->v_scale, "") : inv;
        if (aj_score_has_sinks(e->prog) && dst->o != AJ_PSRC_workspace)
            aj_score_fold_sink(kb, e->prog, row_head_global(e, k),
                               accumulate ? aj_param(kb, AJ_PID(kv_offset)) : NULL, &l2,
                               &scale_new, &lse);
        if (accumulate) {
            LLVMValueRef w_new;
            emit_merge_weights(e, aj_kb_load(kb, kb->t_f32, lse_ptr, 4), l2, &w_prior, &w_new,
                               &lse);
            scale_new = LLVMBuildFMul(b, w_new, scale_new, "");
        }
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, r, e->rows, ""));
        for (int u = 0; u < p->cv / 4; u++) {
            LLVMValueRef col = LLVMBuildAdd(b, lane_col, aj_kb_i64(kb, 4 * p->g * u), "");
            /* a last chunk past Dv holds pad columns: never stored */
            int partial = 4 * p->g * (u + 1) > p->dv;
            if (partial)
                aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, col, aj_kb_i64(kb, p->dv), ""));
            LLVMValueRef at = LLVMBuildAdd(b, orow, col, "");
            LLVMValueRef prior =
                accumulate ? aj_global_load4(kb, aj_param_data(kb, out), at, AJ_DTYPE_F32) : NULL;
            LLVMValueRef vals[4];
            for (int x = 0; x < 4; x++) {
                vals[x] = LLVMBuildFMul(b, aj_kb_get(kb, e->o[k][4 * u + x]), scale_new, "");
                if (accumulate) {
                    LLVMValueRef op = LLVMBuildFMul(b, LLVMBuildExtractElement(b, prior,
                                                    aj_kb_i32(kb, x), ""), w_prior, "");
                    LLVMValueRef zero_w = LLVMBuildFCmp(b, LLVMRealOEQ, w_prior,
                                                        aj_kb_f32(kb, 0), "");
                    op = LLVMBuildSelect(b, zero_w, aj_kb_f32(kb, 0), op, "");
                    vals[x] = LLVMBuildFAdd(b, vals[x], op, "");
                }
            }
            aj_global_store4(kb, aj_param_data(kb, out), at, vals, out_dtype);
            if (partial)
                aj_kb_if_end(kb);
        }
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, e->lane, aj_kb_i32(kb, 0), ""));
        aj_kb_store(kb, lse, lse_ptr, 4);
        aj_kb_if_end(kb);
        aj_kb_if_end(kb);
    }
}

/* The thread's state: Q K^T sums, output accumulators, running max and
 * sum, at their initial values (aj_kb_begin* first). */
static void alloc_state(efwd *e)
{
    aj_kb *kb = e->kb;
    const efwd_plan *p = &e->p;
    for (int k = 0; k < p->rm; k++) {
        for (int t = 0; t < p->cn; t++)
            e->acc[k][t] = aj_kb_var(kb, kb->t_f32, NULL, "acc");
        for (int c = 0; c < p->cv; c++)
            e->o[k][c] = aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, 0), "o");
        e->m[k] = aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, -INFINITY), "m");
        e->l[k] = aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, 0), "l");
    }
}

/* The initial state again, for the next row block of a paged part. */
static void reset_state(efwd *e)
{
    aj_kb *kb = e->kb;
    for (int k = 0; k < e->p.rm; k++) {
        for (int c = 0; c < e->p.cv; c++)
            aj_kb_set(kb, e->o[k][c], aj_kb_f32(kb, 0));
        aj_kb_set(kb, e->m[k], aj_kb_f32(kb, -INFINITY));
        aj_kb_set(kb, e->l[k], aj_kb_f32(kb, 0));
    }
}

/* Thread, lane and row group; shared memory for the tiles. */
static void begin_cta(efwd *e)
{
    aj_kb *kb = e->kb;
    efwd_plan *p = &e->p;
    p->smem_q = aj_kb_smem_reserve(kb, 4 * p->bm * p->ldq);
    p->smem_kv = aj_kb_smem_reserve(kb, 4 * p->bn * p->ldkv);
    p->smem_p = aj_kb_smem_reserve(kb, 4 * p->bm * p->ldp);
    if (p->paged) {
        p->smem_rows = aj_kb_smem_reserve(kb, aj_tile_paged_rows_bytes(p->bn));
        p->smem_qrows = aj_kb_smem_reserve(kb, aj_tile_paged_rows_bytes(p->bm));
        /* cache rows go in 16-byte chunks (cp.async when streamed), 8-byte
         * ones for an f8 cache loaded by the threads (aj_tile_load) */
        int chunk = p->stream || aj_dtype_size(p->kv_dtype) > 1 ? 16 : 8;
        aj_kb_row_align(kb, AJ_ROW_K_CACHE, chunk);
        aj_kb_row_align(kb, AJ_ROW_V_CACHE, chunk);
    }
    if (p->stream) {
        int size = aj_dtype_size(p->kv_dtype);
        p->smem_stage_k = aj_kb_smem_reserve(kb, p->bn * p->d * size);
        p->smem_stage_v = aj_kb_smem_reserve(kb, p->bn * p->dv * size);
    }
    alloc_state(e);
    e->tid = aj_kb_thread_id(kb);
    e->lane = LLVMBuildAnd(e->b, e->tid, aj_kb_i32(kb, p->g - 1), "lane");
    e->group = LLVMBuildUDiv(e->b, e->tid, aj_kb_i32(kb, p->g), "group");
}

/* The key blocks' sources (row0, or a paged tile's row table, set per
 * block); paged: the sequence whose block-table row the tiles read. */
typedef struct efwd_kv {
    aj_tile_src k, v;
    LLVMValueRef bidx;                       /* paged, else NULL */
    LLVMValueRef k_stride_page, v_stride_page;   /* paged: i64 */
} efwd_kv;

/* S = Q K^T of the key tile at n0 (K in shared memory), then the softmax
 * of its class cls (NULL: no mask). */
static void emit_scores(efwd *e, LLVMValueRef cls, LLVMValueRef n0)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    emit_qk(e);
    efwd_tile tile = {e, n0};
    LLVMValueRef inside = LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildAdd(b, n0, aj_kb_i32(kb, e->p.bn),
                                        ""), e->seq_k, "");
    aj_score_by_tile_class(kb, cls, inside, emit_softmax_tile, &tile);
}

/* The tile at walk position pos: its first key (i32), and whether it is
 * computed at all (i1: its class is not skip). */
static LLVMValueRef walk_tile(efwd *e, const aj_score_walk *walk, LLVMValueRef pos,
                              LLVMValueRef *cls, LLVMValueRef *live)
{
    aj_kb *kb = e->kb;
    *cls = NULL;
    LLVMValueRef n = aj_score_walk_tile(&e->sc, walk, pos,
                                        aj_score_has_mask(e->prog) ? cls : NULL);
    *live = aj_score_has_rest(e->prog)
                ? LLVMBuildICmp(e->b, LLVMIntNE, *cls, aj_kb_i32(kb, AJ_TILE_SKIP), "")
                : LLVMConstInt(kb->t_i1, 1, 0);
    return LLVMBuildMul(e->b, n, aj_kb_i32(kb, e->p.bn), "n0");
}

/* stream (layout = paged on sim/GPU, plan_schedule's choice): K and V
 * come through cp.async one tile ahead by operand (aj_tile_stream, K
 * operand 0, V 1), so that a tile's copy from the pages overlaps the math
 * of the one before.  One row table serves: V(t+1)'s issue, its last
 * reader, is behind the next tile's first barrier before the next
 * prepare rewrites it. */
typedef struct efwd_stream {
    efwd *e;
    efwd_kv *kv;
    const aj_score_walk *walk;
    /* per operand (K, V): its pages, their page stride (i64), its row
     * width and its staging buffer */
    const aj_tile_src *src[2];
    LLVMValueRef stride_page[2];
    int width[2];
    int32_t stage[2];
} efwd_stream;

static LLVMValueRef stream_tile(void *user, LLVMValueRef pos, LLVMValueRef *cls,
                                LLVMValueRef *live)
{
    efwd_stream *s = user;
    return walk_tile(s->e, s->walk, pos, cls, live);
}

/* the row table of the tile at n0 */
static void stream_prepare(void *user, LLVMValueRef n0)
{
    efwd_stream *s = user;
    efwd *e = s->e;
    aj_tile_paged_rows(e->kb, aj_kb_i32(e->kb, e->p.smem_rows), e->p.bn, n0, e->seq_k,
                       s->kv->bidx, e->tid, e->p.threads);
}

/* K's or V's rows from the pages into their staging buffer, raw */
static void stream_issue(void *user, int g)
{
    efwd_stream *s = user;
    efwd *e = s->e;
    aj_kb *kb = e->kb;
    aj_tile_issue_paged_async(kb, s->src[g], aj_kb_i32(kb, e->p.smem_rows), s->stride_page[g],
                              e->p.bn, s->width[g], aj_kb_i32(kb, s->stage[g]), e->tid,
                              e->p.threads);
}

/* K or V widened to f32 into the key tile's buffer */
static void stream_land(void *user, int g)
{
    efwd_stream *s = user;
    efwd *e = s->e;
    const efwd_plan *p = &e->p;
    aj_tile_widen_staged_f32(e->kb, p->kv_dtype, aj_kb_i32(e->kb, s->stage[g]), p->bn,
                             s->width[g], p->smem_kv, p->ldkv, e->tid, p->threads);
}

static void emit_key_blocks_streamed(efwd *e, efwd_kv *kv, const aj_score_walk *walk)
{
    aj_kb *kb = e->kb;
    const efwd_plan *p = &e->p;
    efwd_stream user = {e, kv, walk, {&kv->k, &kv->v}, {kv->k_stride_page, kv->v_stride_page},
                        {p->d, p->dv}, {p->smem_stage_k, p->smem_stage_v}};
    aj_tile_stream s = {.kb = kb, .walk = walk, .groups = 2, .tile = stream_tile,
                        .prepare = stream_prepare, .issue = stream_issue, .land = stream_land,
                        .user = &user};
    aj_tile_stream_begin(&s);
    LLVMValueRef at = aj_kb_for_begin(kb, walk->begin, walk->end, aj_kb_i32(kb, 1), "walk");
    LLVMValueRef cls, live;
    LLVMValueRef n0 = aj_tile_stream_step(&s, at, &cls, &live);
    aj_tile_stream_operand(&s, 0);   /* K(t) in, K(t+1) issued */
    aj_kb_if_begin(kb, live);
    emit_scores(e, cls, n0);
    aj_kb_if_end(kb);
    aj_tile_stream_operand(&s, 1);   /* V(t) in (P fully written), V(t+1) issued */
    aj_kb_if_begin(kb, live);
    emit_pv(e);
    aj_kb_if_end(kb);
    aj_kb_for_end(kb);
}

/*
 * Key blocks [n_begin, n_end) of the rows at e->m0, streamed (above) or,
 * per block: (paged) the row table of its keys -- its last readers, the
 * previous block's V loads, are behind that block's last barrier -- then
 * barrier, load K, barrier, S = Q K^T, softmax, barrier, load V, barrier,
 * O += P V.
 */
static void emit_key_blocks(efwd *e, efwd_kv *kv, LLVMValueRef n_begin, LLVMValueRef n_end)
{
    aj_kb *kb = e->kb;
    const efwd_plan *p = &e->p;
    /* the key blocks of the range, or the block mask's list of the row
     * block (score.h); the same class in every thread */
    aj_score_walk walk;
    aj_score_walk_keys(&e->sc, &walk, e->i_first, e->i_last, p->bn, n_begin, n_end, e->seq_q,
                       e->seq_k);
    if (p->stream) {
        emit_key_blocks_streamed(e, kv, &walk);
        return;
    }
    LLVMValueRef at = aj_kb_for_begin(kb, walk.begin, walk.end, aj_kb_i32(kb, 1), "walk");
    LLVMValueRef cls, live;
    LLVMValueRef n0 = walk_tile(e, &walk, at, &cls, &live);
    aj_kb_if_begin(kb, live);
    kv->k.row0 = kv->v.row0 = n0;
    LLVMValueRef rows = kv->bidx ? aj_kb_i32(kb, p->smem_rows) : NULL;
    if (rows)
        aj_tile_paged_rows(kb, rows, p->bn, n0, e->seq_k, kv->bidx, e->tid, p->threads);
    aj_kb_barrier(kb);   /* previous block's readers of K/V and P are done */
    aj_tile_load_paged_f32(kb, &kv->k, rows, kv->k_stride_page, p->bn, p->d, p->smem_kv,
                           p->ldkv, e->tid, p->threads);
    aj_kb_barrier(kb);
    emit_scores(e, cls, n0);
    aj_kb_barrier(kb);   /* K fully read; P fully written */
    aj_tile_load_paged_f32(kb, &kv->v, rows, kv->v_stride_page, p->bn, p->dv, p->smem_kv,
                           p->ldkv, e->tid, p->threads);
    aj_kb_barrier(kb);
    emit_pv(e);
    aj_kb_if_end(kb);
    aj_kb_for_end(kb);
}

/* layout = padded, and varlen (the packed tensors as [1, H, T, D] views,
 * sequence b's rows and keys from cu_seqlens, aj_kctx_sequence): grid
 * (ceil(Sq / bm), Hq, B), Sq the longest sequence's. */
static void build_padded(efwd *e)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const aj_op *op = e->op;
    const efwd_plan *p = &e->p;
    aj_params_declare(kb, AJ_KSIG_EFFICIENT_FWD, op, e->prog);
    aj_kb_begin(kb, p->threads);
    begin_cta(e);
    LLVMValueRef mblk = aj_kb_block_id(kb, 0);
    LLVMValueRef h = aj_kb_block_id(kb, 1);
    LLVMValueRef bidx = aj_kb_block_id(kb, 2);
    e->m0 = LLVMBuildMul(b, mblk, aj_kb_i32(kb, p->bm), "m0");
    LLVMValueRef q_start, k_start;
    aj_kctx_sequence(&e->k, bidx, &q_start, &k_start);
    /* varlen: the CTAs past this sequence's rows have nothing to do (the
     * same branch for every thread of the CTA) */
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, e->m0, e->seq_q, ""));
    rows_padded(e);
    LLVMValueRef group_size =
        LLVMBuildSDiv(b, aj_param(kb, AJ_PID(heads_q)), aj_param(kb, AJ_PID(heads_kv)), "");
    LLVMValueRef hkv = LLVMBuildSDiv(b, h, group_size, "hkv");
    aj_attn_descales(kb, op, h, hkv, &e->k_scale, &e->v_scale);
    LLVMValueRef sq, sk;
    aj_attn_score_totals(kb, e->prog, op->layout, e->seq_q, e->seq_k, &sq, &sk);
    aj_kctx_set_head(&e->k, bidx, h, sq, sk);
    LLVMValueRef q_base = aj_cpu_seq_base(kb, AJ_PSRC_q, bidx, h, q_start);
    aj_tile_src qsrc = {aj_param(kb, AJ_PID(q)),
                        q_base,
                        aj_param(kb, AJ_PID(stride_q_s)),
                        e->m0,
                        e->seq_q,
                        p->q_dtype};
    aj_tile_load_f32(kb, &qsrc, p->bm, p->d, p->smem_q, p->ldq, e->tid, p->threads);

    efwd_kv kv = {
        .k = {aj_param(kb, AJ_PID(k)), aj_cpu_seq_base(kb, AJ_PSRC_k, bidx, hkv, k_start),
              aj_param(kb, AJ_PID(stride_k_s)), NULL, e->seq_k, p->kv_dtype},
        .v = {aj_param(kb, AJ_PID(v)), aj_cpu_seq_base(kb, AJ_PSRC_v, bidx, hkv, k_start),
              aj_param(kb, AJ_PID(stride_v_s)), NULL, e->seq_k, p->kv_dtype},
    };
    LLVMValueRef n_begin, n_end;
    key_block_range(e, &n_begin, &n_end);
    emit_key_blocks(e, &kv, n_begin, n_end);
    const efwd_out out = {out_tensor(op), AJ_PSRC_lse, op->accumulate ? AJ_DTYPE_F32 : p->dtype,
                          aj_cpu_seq_base(kb, out_tensor(op), bidx, h, q_start),
                          aj_param_stride(kb, out_tensor(op), 2),
                          aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_lse, bidx, h), q_start),
                          NULL, NULL};
    emit_epilogue(e, &out);
    aj_kb_if_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, p->bm}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {p->bm, p->bn, p->warps, 1},
    };
    aj_kb_finish(kb, &layout);
}

/*
 * layout = paged, a row block's rows (GQA packing, attn_common.h): the
 * CTA's row space is `heads` query heads of seq_q queries each, stacked
 * head after head, so that thread row k of the block at m0 is row r =
 * m0 + row_of(k) of the stack, head r / seq_q, position r % seq_q:
 *
 *   r:    0 .. seq_q-1 | seq_q .. 2 seq_q-1 | ...   (rows)
 *   head: h0           | h0 + 1             | ...
 *
 * Rows past the stack read its last row (in bounds, never stored).  The
 * positions the block spans (for its key range): its rows' own where it
 * lies within one head, else all of them.  With per_row_sc each row's
 * score programs are begun at its own head (alibi's slope, expressions
 * reading h).
 */
static void rows_paged(efwd *e, LLVMValueRef bidx, LLVMValueRef h0, LLVMValueRef q_origin,
                       LLVMValueRef total)
{
    aj_kb *kb = e->kb;
    aj_score *row_scores = aj_kb_scratch(kb, MAX_RM * sizeof *row_scores);
    if (!row_scores)
        return;
    LLVMBuilderRef b = e->b;
    LLVMValueRef one = aj_kb_i32(kb, 1);
    LLVMValueRef last = LLVMBuildSub(b, e->rows, one, "");
    LLVMValueRef per = aj_kb_smax(kb, e->seq_q, one);   /* (>= 1 where a row exists) */
    for (int k = 0; k < e->p.rm; k++) {
        LLVMValueRef r = aj_kb_smin(kb, LLVMBuildAdd(b, e->m0, row_of(e, k), ""), last);
        e->row_head[k] = LLVMBuildUDiv(b, r, per, "row_head");
        e->row_pos[k] = LLVMBuildSub(b, r, LLVMBuildMul(b, e->row_head[k], per, ""), "row_pos");
        e->row_sc[k] = &e->sc;
        if (e->per_row_sc) {
            aj_score_begin(&row_scores[k], kb, e->prog, 0, bidx,
                           LLVMBuildAdd(b, h0, e->row_head[k], ""), q_origin, aj_kb_i64(kb, 0),
                           total, total);
            e->row_sc[k] = &row_scores[k];
        }
    }
    aj_attn_paged_span(kb, e->m0, last_row(e), per, e->seq_q, &e->i_first, &e->i_last);
}

/* A paged part's CTA (build_paged_parts): its set-up (aj_attn_paged_cta:
 * sequence, part, heads, row blocks and key blocks), its KV head (i64)
 * and whether the op packs at all. */
typedef struct paged_part {
    aj_paged_cta c;
    LLVMValueRef hkv;                 /* i64: the KV head */
    int packable;
} paged_part;

/* The parts stage's prologue: the CTA's set-up, the f8 caches' descales
 * (of the KV head all packed heads share) and the score programs at (b,
 * h0). */
static void paged_part_begin(efwd *e, paged_part *pt)
{
    aj_kb *kb = e->kb;
    const aj_op *op = e->op;
    const efwd_plan *p = &e->p;
    aj_params_declare(kb, AJ_KSIG_CPU_PAGED_FWD, op, e->prog);
    aj_kb_begin_stage(kb, "parts", p->threads);
    begin_cta(e);
    pt->packable = aj_attn_paged_packable(e->prog, true);
    e->per_row_sc = pt->packable && !aj_attn_paged_packable(e->prog, false);
    const aj_paged_cta *c = &pt->c;
    aj_attn_paged_cta(kb, op, e->prog->reads_totals, pt->packable, p->bm, p->bn, &pt->c);
    e->seq_q = c->seq_q;
    e->seq_k = c->seq_k;
    e->rows = c->rows;
    pt->hkv = aj_kb_sext64(kb, c->hkv);
    aj_attn_descales(kb, op, c->h, c->hkv, &e->k_scale, &e->v_scale);
    aj_score_begin(&e->sc, kb, e->prog, 0, c->bidx, c->h0, c->q_origin, aj_kb_i64(kb, 0),
                   c->total, c->total);
}

/* The part's K/V sources: the KV head's pages, through the block table. */
static void paged_kv(efwd *e, const paged_part *pt, efwd_kv *kv)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const efwd_plan *p = &e->p;
    LLVMValueRef hkv = pt->hkv;
    *kv = (efwd_kv){
        .k = {aj_param(kb, AJ_PID(k_cache)),
              LLVMBuildMul(b, hkv, aj_param(kb, AJ_PID(stride_k_cache_h)), ""),
              aj_param(kb, AJ_PID(stride_k_cache_s)), NULL, NULL, p->kv_dtype},
        .v = {aj_param(kb, AJ_PID(v_cache)),
              LLVMBuildMul(b, hkv, aj_param(kb, AJ_PID(stride_v_cache_h)), ""),
              aj_param(kb, AJ_PID(stride_v_cache_s)), NULL, NULL, p->kv_dtype},
        .bidx = pt->c.bidx,
        .k_stride_page = aj_param(kb, AJ_PID(stride_k_cache_page)),
        .v_stride_page = aj_param(kb, AJ_PID(stride_v_cache_page)),
    };
}

/* Where the part's rows go (aj_attn_paged_dests): outs[0] o and lse (one
 * part), outs[1] the workspace's partials. */
static void paged_outs(efwd *e, const paged_part *pt, efwd_out outs[2])
{
    aj_paged_dest d[2];
    aj_attn_paged_dests(e->kb, e->op, &pt->c, e->p.dv, d);
    outs[0] = (efwd_out){AJ_PSRC_o, AJ_PSRC_lse, e->p.dtype, d[0].o_base, d[0].o_stride,
                         d[0].lse_base, d[0].o_head, d[0].lse_head};
    outs[1] = (efwd_out){AJ_PSRC_workspace, AJ_PSRC_workspace, AJ_DTYPE_F32, d[1].o_base,
                         d[1].o_stride, d[1].lse_base, d[1].o_head, d[1].lse_head};
}

/* The row block at mb of the part's rows: its Q through the stacked row
 * table, its key blocks within the part's, its output. */
static void paged_row_block(efwd *e, const paged_part *pt, efwd_kv *kv, const efwd_out outs[2],
                            const aj_tile_src *qsrc, LLVMValueRef mb)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const efwd_plan *p = &e->p;
    e->m0 = mb;
    reset_state(e);
    rows_paged(e, pt->c.bidx, pt->c.h0, pt->c.q_origin, pt->c.total);
    /* the previous row block's readers of Q and its row table are done
     * (it may have had no key block, whose barriers say so) */
    LLVMValueRef qrows = aj_kb_i32(kb, p->smem_qrows);
    aj_kb_barrier(kb);
    aj_tile_stacked_rows(kb, qrows, p->bm, mb, e->rows, e->seq_q, e->tid, p->threads);
    aj_kb_barrier(kb);
    aj_tile_load_paged_f32(kb, qsrc, qrows, aj_param(kb, AJ_PID(stride_q_h)), p->bm, p->d,
                           p->smem_q, p->ldq, e->tid, p->threads);
    LLVMValueRef n_begin, n_end;
    key_block_range(e, &n_begin, &n_end);
    emit_key_blocks(e, kv, aj_kb_smax(kb, n_begin, pt->c.first), aj_kb_smin(kb, n_end, pt->c.last));
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, pt->c.splits, aj_kb_i32(kb, 1), ""));
    emit_epilogue(e, &outs[0]);
    aj_kb_else(kb);
    emit_epilogue(e, &outs[1]);
    aj_kb_if_end(kb);
}

/*
 * layout = paged, stage 0: grid (splits, Hq, B), one CTA per part of a
 * (sequence, query head) -- or, GQA-packed (attn_common.h's rule: the
 * group's heads x queries at most AJ_PAGED_PACK_ROWS, a mask whose tile
 * classes do not read h), of a (sequence, KV head): the rows of all its
 * query heads (rows_paged), their row blocks taken in turn by the
 * group's CTAs (CTA h0 + w: blocks w, w + G, ...; those past the rows
 * have none), so each page of the KV head is read once per part and row
 * block, and a group of many rows spreads over its CTAs.
 * Part s takes key blocks [s per, (s + 1) per), per = ceil(blocks /
 * splits), of the sequence's seqlens_k[b] keys (checked:
 * aj_attn_paged_len), each tile's rows gathered through the block table
 * (aj_tile_paged_rows, which checks the pages it looks up), for the rows
 * in blocks of bm, the queries being the sequence's last Sq positions
 * (q_layout = varlen: its chunk of the packed rows, cu_seqlens_q's pair,
 * checked by aj_attn_paged_queries: a chunk longer than the sequence is a
 * fault naming it).  Q rows come through a row table too
 * (aj_tile_stacked_rows: head, position).  One part writes o and lse;
 * more write their partials to the workspace (runtime/launch.c,
 * aj_attn_paged_part_row_of) for stage 1.  K/V tiles stream by cp.async
 * where plan_schedule lets them (emit_key_blocks_streamed), raw -- f8
 * caches as bytes -- and widen in shared memory; k_scale multiplies the
 * scores, v_scale the output.
 */
static void build_paged_parts(efwd *e)
{
    paged_part pt;
    paged_part_begin(e, &pt);
    efwd_kv kv;
    paged_kv(e, &pt, &kv);
    efwd_out outs[2];
    paged_outs(e, &pt, outs);
    aj_tile_src qsrc = {aj_param(e->kb, AJ_PID(q)),
                        aj_cpu_seq_base(e->kb, AJ_PSRC_q, pt.c.bidx, pt.c.h0, pt.c.start_q),
                        aj_param(e->kb, AJ_PID(stride_q_s)),
                        NULL,
                        NULL,
                        e->p.dtype};
    LLVMValueRef mb = aj_kb_for_begin(e->kb, pt.c.first_mb, e->rows, pt.c.mb_step, "mb");
    paged_row_block(e, &pt, &kv, outs, &qsrc, mb);
    aj_kb_for_end(e->kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SPLITS, 1}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {e->p.bm, e->p.bn, e->p.warps, 1},
        .pack_rows = pt.packable ? AJ_PAGED_PACK_ROWS : 0,
    };
    aj_kb_finish(e->kb, &layout);
}

/* Split-KV merge: the LSE of partial row `row` (i64, counted from the
 * workspace's first partial row) in log2 units, from the LSE block at
 * lse_at of workspace ws */
static LLVMValueRef part_lse2(aj_kb *kb, LLVMValueRef ws, LLVMValueRef lse_at, LLVMValueRef row)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef at = LLVMBuildShl(b, LLVMBuildAdd(b, lse_at, row, ""), aj_kb_i64(kb, 2), "");
    return LLVMBuildFMul(b, aj_kb_load(kb, kb->t_f32, aj_kb_gptr_offset(kb, ws, at), 4),
                         aj_kb_f32(kb, AJ_LOG2E), "");
}

/* Split-KV merge: element (i, c) of the merged O (the op's dtype) at
 * o_base, and from column 0 row i's LSE at lse_base (i, c: i32) */
static void store_merged(efwd *e, LLVMValueRef o_base, LLVMValueRef lse_base, LLVMValueRef i,
                         LLVMValueRef c, LLVMValueRef val, LLVMValueRef lse)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef oat = LLVMBuildAdd(
        b,
        LLVMBuildAdd(b, o_base,
                     LLVMBuildMul(b, aj_kb_sext64(kb, i), aj_param(kb, AJ_PID(stride_o_s)), ""),
                     ""),
        LLVMBuildZExt(b, c, kb->t_i64, ""), "");
    int size = aj_dtype_size(e->p.dtype);
    aj_kb_store(kb, aj_kb_from_f32(kb, val, e->p.dtype),
                aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(o)),
                                  LLVMBuildMul(b, oat, aj_kb_i64(kb, size), "")),
                (unsigned)size);
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, c, aj_kb_i32(kb, 0), ""));
    LLVMValueRef lat = LLVMBuildAdd(b, lse_base, aj_kb_sext64(kb, i), "");
    aj_kb_store(kb, lse,
                aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(lse)),
                                  LLVMBuildShl(b, lat, aj_kb_i64(kb, 2), "")),
                4);
    aj_kb_if_end(kb);
}

/*
 * layout = paged, stage 1 (run for splits > 1): grid (1, Hq, B), thread t
 * takes elements t, t + T, ... of the (Sq, Dv) rows and merges their
 * parts by log-sum-exp (docs/design.md "Merge of two partials", over splits
 * parts), in log2 units:
 *
 *   m = max_s L_s,  w_s = 2^(L_s - m),  O = sum_s w_s O_s / sum_s w_s,
 *   LSE = (m + log2 sum_s w_s) ln 2
 *
 * no part with a key (every L_s = -inf) giving O = 0, LSE = -inf; a part
 * without a key wrote O_s = 0 and weighs 0.
 */
#define MERGE_THREADS 128
static void build_paged_merge(efwd *e)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const efwd_plan *p = &e->p;
    aj_params_declare(kb, AJ_KSIG_CPU_PAGED_MERGE, e->op, e->prog);
    aj_kb_begin_stage(kb, "merge", MERGE_THREADS);
    LLVMValueRef mx = aj_kb_var(kb, kb->t_f32, NULL, "mx");
    LLVMValueRef sum = aj_kb_var(kb, kb->t_f32, NULL, "sum");
    LLVMValueRef acc = aj_kb_var(kb, kb->t_f32, NULL, "acc");
    LLVMValueRef h = aj_kb_block_id(kb, 1);
    LLVMValueRef bidx = aj_kb_block_id(kb, 2);
    /* sq: the rows between parts; len_q, start_q: the sequence's (varlen
     * queries: its chunk of the T packed rows) */
    const int varlen_q = e->op->q_layout == AJ_LAYOUT_VARLEN;
    LLVMValueRef sq = aj_param(kb, varlen_q ? AJ_PID(tokens_q) : AJ_PID(seq_q));
    LLVMValueRef splits = aj_param(kb, AJ_PID(splits));
    LLVMValueRef len_q = sq, start_q = aj_kb_i64(kb, 0);
    if (varlen_q)
        aj_attn_paged_queries(kb, bidx, aj_attn_paged_len(kb, bidx), aj_param(kb, AJ_PID(seq_q)),
                              &start_q, &len_q);
    LLVMValueRef ws = aj_param(kb, AJ_PID(workspace));
    LLVMValueRef lse_at;
    LLVMValueRef row0 = LLVMBuildAdd(b, aj_attn_paged_part_row_of(kb, bidx, h, aj_kb_i32(kb, 0),
                                                                  p->dv, varlen_q, &lse_at),
                                     start_q, "");
    LLVMValueRef o_base = aj_cpu_seq_base(kb, AJ_PSRC_o, bidx, h, start_q);
    LLVMValueRef lse_base =
        LLVMBuildAdd(b, aj_attn_slice_base(kb, AJ_PSRC_lse, bidx, h), start_q, "");
    LLVMValueRef ninf = aj_kb_f32(kb, -INFINITY), zero = aj_kb_f32(kb, 0);
    LLVMValueRef elems = LLVMBuildMul(b, len_q, aj_kb_i32(kb, p->dv), "");
    LLVMValueRef x = aj_kb_for_begin(kb, aj_kb_thread_id(kb), elems,
                                     aj_kb_i32(kb, MERGE_THREADS), "x");
    {
        LLVMValueRef i = LLVMBuildUDiv(b, x, aj_kb_i32(kb, p->dv), "");
        LLVMValueRef c = LLVMBuildURem(b, x, aj_kb_i32(kb, p->dv), "");
        /* partial row of part s: row0 + s Sq + i */
        LLVMValueRef s = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), splits, aj_kb_i32(kb, 1), "s");
        LLVMValueRef r = aj_kb_sext64(kb, LLVMBuildAdd(b, LLVMBuildMul(b, s, sq, ""), i, ""));
        LLVMValueRef l2 = part_lse2(kb, ws, lse_at, LLVMBuildAdd(b, row0, r, ""));
        LLVMValueRef init = LLVMBuildICmp(b, LLVMIntEQ, s, aj_kb_i32(kb, 0), "");
        aj_kb_set(kb, mx, LLVMBuildSelect(b, init, l2, aj_kb_fmax(kb, aj_kb_get(kb, mx), l2), ""));
        aj_kb_for_end(kb);
        LLVMValueRef none = LLVMBuildFCmp(b, LLVMRealOEQ, aj_kb_get(kb, mx), ninf, "");
        LLVMValueRef m_use = LLVMBuildSelect(b, none, zero, aj_kb_get(kb, mx), "");
        aj_kb_set(kb, sum, zero);
        aj_kb_set(kb, acc, zero);
        s = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), splits, aj_kb_i32(kb, 1), "s");
        r = LLVMBuildAdd(b, row0,
                         aj_kb_sext64(kb, LLVMBuildAdd(b, LLVMBuildMul(b, s, sq, ""), i, "")), "");
        LLVMValueRef w =
            aj_kb_exp2(kb, LLVMBuildFSub(b, part_lse2(kb, ws, lse_at, r), m_use, ""));
        LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildMul(b, r, aj_kb_i64(kb, p->dv), ""),
                                       LLVMBuildZExt(b, c, kb->t_i64, ""), "");
        LLVMValueRef part_o = aj_kb_load(kb, kb->t_f32, aj_kb_gptr_offset(kb, ws,
                                         LLVMBuildShl(b, at, aj_kb_i64(kb, 2), "")), 4);
        aj_kb_set(kb, sum, LLVMBuildFAdd(b, aj_kb_get(kb, sum), w, ""));
        aj_kb_set(kb, acc, aj_kb_fma(kb, w, part_o, aj_kb_get(kb, acc)));
        aj_kb_for_end(kb);
        LLVMValueRef total = aj_kb_get(kb, sum);
        LLVMValueRef val = LLVMBuildSelect(b, none, zero, LLVMBuildFDiv(b, aj_kb_get(kb, acc),
                                           total, ""), "");
        LLVMValueRef l2_all = LLVMBuildFAdd(b, m_use, aj_kb_log2(kb, total), "");
        LLVMValueRef lse = LLVMBuildSelect(b, none, ninf, LLVMBuildFMul(b, l2_all,
                                           aj_kb_f32(kb, AJ_LN2), ""), "");
        if (aj_score_has_sinks(e->prog)) {
            LLVMValueRef l2_row = LLVMBuildSelect(b, none, ninf, l2_all, "");
            LLVMValueRef scale = aj_kb_f32(kb, 1);
            aj_score_fold_sink(kb, e->prog, LLVMBuildAdd(b, h, aj_param(kb, AJ_PID(head_offset)),
                                                         ""),
                               NULL, &l2_row, &scale, &lse);
            val = LLVMBuildFMul(b, val, scale, "");
        }
        store_merged(e, o_base, lse_base, i, c, val, lse);
    }
    aj_kb_for_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_ONE, 1}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {p->bm, p->bn, MERGE_THREADS / 32, 1},
    };
    aj_kb_finish(kb, &layout);
}

static aj_status efwd_build(aj_kb *kb, const aj_op *op, void *user)
{
    (void)user;
    efwd e;
    memset(&e, 0, sizeof e);
    const aj_score_prog *prog;
    if (aj_flash_paged_takes(op, kb->target)) {   /* mma tiles (flash_fwd.c, "Paged") */
        aj_schedule used;
        aj_status st = aj_kctx_programs(kb, op, &prog);
        st = st != AJ_OK ? st : aj_flash_paged_parts(kb, op, prog, &used);
        if (st != AJ_OK)
            return st;
        aj_kctx_init(&e.k, kb, op, prog);
        e.p.dtype = op->dtype;   /* what the merge reads of a plan */
        e.p.dv = aj_op_dv(op);
        e.p.bm = used.block_m;
        e.p.bn = used.block_n;
        build_paged_merge(&e);
        return kb->st;
    }
    aj_status st =
        aj_kctx_plan_programs(kb, op, plan_kernel(kb->ctx, op, kb->target, &e.p), &prog);
    if (st != AJ_OK)
        return st;
    aj_kctx_init(&e.k, kb, op, prog);
    if (e.p.paged) {
        build_paged_parts(&e);
        build_paged_merge(&e);
    } else {
        build_padded(&e);
    }
    return kb->st;
}

AJ_TEMPLATE(aj_template_efficient_fwd, "efficient_fwd", AJ_KIND_FORWARD, AJ_VARIANT_EFFICIENT,
            efwd_check, efwd_build, .stage_sigs = {AJ_KSIG_EFFICIENT_FWD});

/* layout = paged, both variants: a decode kernel is bound by the K/V
 * bytes it streams, which the SIMT FMA tiles keep up with (the flash
 * template's mma tiles would idle on Sq <= 16 rows) -- except absorbed
 * MLA's, whose 16-128 query heads over one latent head are rows enough:
 * its parts stage is the flash template's (aj_flash_paged_takes) */
AJ_TEMPLATE_BOTH_VARIANTS(aj_template_paged_fwd, "paged_fwd", AJ_KIND_FORWARD, efwd_check,
                          efwd_build, .paged = true,
                          .stage_sigs = {AJ_KSIG_CPU_PAGED_FWD, AJ_KSIG_CPU_PAGED_MERGE});
