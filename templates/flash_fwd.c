/*
 * flash_fwd.c -- the flash-variant forward kernel (tensor cores).
 *
 * One CTA computes block_m query rows of one (batch or sequence, head).  Q
 * is copied to shared memory once; K and V tiles of block_n keys stream
 * through a ring of `stages` shared-memory slots by cp.async, so the copy
 * of tile n + stages - 1 overlaps the math on tile n.  Each warp owns
 * 16 mt consecutive rows (mt = block_m / (16 warps), 1 or 2) and keeps
 * their scores, softmax statistics and output accumulators in registers:
 *
 *   grid = (ceil(Sq / block_m), Hq, B)   block = warps * 32 threads
 *
 *   per key tile n (slot n % stages):
 *     issue cp.async of tile n + stages - 1, commit; wait until tile n
 *     landed; barrier
 *     S = Q K^T        mma.m16n8k16, A = Q by ldmatrix.x4, B = K rows by
 *                      ldmatrix.x4 (a K row is a column of K^T)
 *     scale, score_mod; the element mask on tiles the mask does not show
 *                      in full (score.h's tile class)
 *     online softmax   row max / row sum over the 4 lanes of a quad
 *     O = O alpha + P V   A = P repacked from S's registers, B = V by
 *                      ldmatrix.x4.trans
 *     barrier (the slot may be refilled)
 *
 * The accumulator layout of S (PTX m16n8 C fragment) is the A layout of
 * the next mma once two n8 tiles are packed side by side, so P never
 * touches shared memory.  Lane 4g + t of a warp holds, per 16-row m-tile:
 *
 *              keys 8nt + 2t, 8nt + 2t + 1
 *   row g      s[nt][0]  s[nt][1]       quad (4 lanes t = 0..3) = one row's
 *   row g + 8  s[nt][2]  s[nt][3]       8 keys of tile nt: max and sum
 *                                       reduce over the quad with shfl
 *
 *   P as A of P V (keys 16kk .. 16kk + 15):
 *     a[0] = pack(s[2kk][0..1])   a[2] = pack(s[2kk+1][0..1])    row g
 *     a[1] = pack(s[2kk][2..3])   a[3] = pack(s[2kk+1][2..3])    row g + 8
 *
 * Shared memory (dtype elements, rows of aj_mma_tile_ld(width), tile_io.h:
 * D or Dv rounded up to 16, then 8 more so that the 8 rows an ldmatrix
 * reads fall in different banks):
 *
 *   Q [block_m][ld(D)] | K [stages][block_n][ld(D)] | V [stages][block_n][ld(Dv)]
 *
 * Q K^T steps through D 16 at a time; where D is an odd multiple of 8 the
 * last step reads the 8 zero pad columns of Q and K.  P V's n8 tiles cover
 * Dv exactly (the last one alone by ldmatrix.x2.trans when Dv / 8 is odd),
 * so V's pad columns are never read.
 *
 * The mask and score_mod are the op's score programs (score.h), built-in
 * or expressions alike.  Key tiles outside the CTA's band are never
 * visited; where the mask has more than its band, tiles whose class is
 * skip are neither loaded nor computed; tiles of class full skip the
 * element mask.  Rows that see no key end with O = 0 and LSE = -inf.
 *
 * With schedule warpgroups = G (sm_90a, sim) the same kernel runs its two
 * GEMMs on wgmma over swizzled shared-memory panels: see "wgmma" below;
 * with producer = 1 as well, a producer warpgroup loads and the G
 * consumer warpgroups compute: see "Warp specialisation" below.
 * With 8-bit Q, K and V both GEMMs run on the FP8 tensor cores, V's slot
 * holding V^T: see "FP8" below.
 *
 * Head dims past 256 (Dv to 512, mma.sync with 16-bit inputs): a warp's O
 * is Dv / 2 floats a thread, so Dv splits in two across warp pairs.  Warp
 * w is split w / (warps / 2) of row group w % (warps / 2).  Both warps of
 * a pair need the whole S = Q K^T of their 16 rows: with block_n >= 32
 * (pair_keys, where shared memory has room for the exchange) split s
 * computes the key tile's keys s block_n / 2 .. and the pair trade their
 * halves through shared memory (trade_scores: a 16-byte entry per lane
 * and n8 tile, a barrier between writes and reads), so both read the same
 * bits -- the same statistics and dropout draws -- and Q K^T is issued
 * once per row block; else both compute all of it.  Each runs P V for its
 * vt = ceil(dv / 16) n8 tiles of columns (at an odd dv / 8 the second
 * split's last tile covers V's zeroed pad and is not stored), and split 0
 * stores the LSE (with accumulate, after a barrier that follows every
 * warp's read of the prior).  The default is 64 x 32 tiles on 8 warps:
 * at D 512 a warp issues 128 HMMA a tile where computing all of S took
 * 192 (bench/README.md).  D alone past 256 needs no split
 * (Q's and K's widths are shared memory, not registers).  On wgmma the
 * split is the warpgroup pair's: both own the same 64 rows, warpgroup 0
 * the first 256 columns (whole panels, so its V descriptor starts a panel)
 * and warpgroup 1 the other dv - 256, each on its own wgmma N (see
 * "wgmma").
 *
 * Options: dropout (the efficient forward's Philox stream, attn_common.h),
 * accumulate (merge into a prior o_acc / lse), layout = varlen (cu_seqlens;
 * each CTA reads its sequence's bounds, rows past the sequence do nothing,
 * and the programs' totals are the sequence's).
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/attn_common.h"
#include "templates/cpu_attn.h"
#include "templates/skeleton.h"
#include "templates/score.h"
#include "templates/template.h"
#include "templates/tile_io.h"

#define MAX_MT 2                /* m-tiles (16 rows) per warp */
#define MAX_NT 16               /* n8 tiles of a key tile: block_n <= 128 */
/* n8 tiles of a warp's output columns: 256 (Dv past it splits across warp
 * pairs or warpgroups, see "Head dims past 256") */
#define MAX_VT 32
#define MAX_STAGES 3

/* The schedule values the template implements (docs/ir.md), warps first:
 * a block_m left out is derived from them. */
#define SCHEDULE_VALUES(X) \
    X(warps, "1, 2, 4 or 8", v == 1 || v == 2 || v == 4 || v == 8)             \
    X(block_m, "16, 32, 64 or 128", v == 16 || v == 32 || v == 64 || v == 128) \
    X(block_n, "16, 32, 64 or 128", v == 16 || v == 32 || v == 64 || v == 128) \
    X(stages, "1, 2 or 3", v >= 1 && v <= MAX_STAGES)

/* The most f32 values of per-thread state (O, S, statistics) a schedule
 * may keep: the default at head dim 256 (148) assembles without spills on
 * sm_80 and sm_90 with every option on, 164 spills on sm_90.  A guard
 * against schedules sure to spill, not a proof that one below it never
 * does: test_ptx checks the defaults. */
#define STATE_BUDGET 148
/* The most a default takes where a candidate fits: ptxas spills 8-16 bytes
 * at 128 x 64 tiles between 140 and 148 for some (D, Dv) pairs (160/224,
 * 184/200, 192/184, 240/216) and not for others; below 124 none of the
 * 992 pairs spills. */
#define DEFAULT_STATE 124
/* The wgmma template's: its accumulators are wgmma's registers, in the
 * same layout, with the whole tile's state live around each GEMM;
 * test_sweep_ptxas_wgmma checks its defaults for spills on sm_90a. */
#define WGMMA_STATE_BUDGET 200
/* The most a wgmma default takes (its state, the option work, and P's A
 * fragments beside S), and what one warpgroup adds to it: fitted to
 * ptxas's registers for every head dim 8..256 and a sample past it, 1 and
 * 2 warpgroups, with no options and with the heaviest set, at every
 * block_n -- the widest default with no spill anywhere; test_sweep_ptxas_
 * wgmma checks both sets.  (One warpgroup spills at state that two fit:
 * at D 112 with no options, 128 x 128 tiles on two, 64 x 64 on one.) */
#define WGMMA_DEFAULT_STATE 172
#define WGMMA_ONE_WARPGROUP_STATE 20
#define WARPGROUP_THREADS 128
/* Warp specialised with two consumer warpgroups: the registers per thread
 * the producer warpgroup gives back down to and the consumers take, out
 * of 168 each at launch (65536 / 384): 40 x 128 + 232 x 256 = 64512. */
#define WS_PRODUCER_REGS 40
#define WS_CONSUMER_REGS 232
/* The named barriers of the consumers' turns at the tensor cores: id
 * TURN_BAR + w is warpgroup w's (bar 0 is the CTA's barrier). */
#define TURN_BAR 1

typedef struct ffwd_plan {
    aj_dtype dtype;                /* O's */
    /* FP8 inputs (q_dtype = kv_dtype = f8e4m3 or f8e5m2; else 0): both
     * GEMMs on the 8-bit tensor cores (see "FP8" below) */
    aj_dtype f8;
    /* d: the Q and K tiles' width in 16-bit units, the head dim (f8: half
     * of it -- an f8 row of D bytes is D / 2 of them, and m16n8k32's A and
     * B fragments are m16n8k16's over byte pairs, so the same ldmatrix
     * addresses serve) */
    int d, dv;
    int wg;                        /* wgmma warpgroups; 0: mma.sync (see "wgmma" below) */
    /* 1: a producer warpgroup after the wg consumers loads every tile
     * (see "Warp specialisation" below) */
    int ws;
    int bm, bn, warps, stages, threads;
    int mt;                        /* m-tiles per warp */
    /* Dv's splits (1, or 2 past 256: see "Head dims past 256") and the n8
     * tiles of output columns each warp owns: dv / 8 without a split */
    int dvs, vt;
    /* shared-memory row pitches, in 16-bit units; f8's V slot holds V^T,
     * Dv rows of block_n bytes (ldv: its pitch) */
    int ldq, ldk, ldv;
    int32_t v_slot;                /* bytes of a V ring slot */
    int32_t smem_q, smem_k, smem_v;  /* byte offsets in shared memory */
    /* layout = paged (see "Paged"): the row tables of the ring's slots;
     * kv_shared: V is the K tile's first Dv columns (no V slot) */
    int paged, shared;
    int32_t smem_rows;
    /* paged with an f8 cache under 16-bit queries (see "Paged"): the
     * cache's format; its tiles land raw in stage slots (smem_stage, a
     * slot block_n x D bytes) and are widened into the one K tile */
    aj_dtype kv8;
    int32_t smem_stage;
    /* mma.sync past Dv 256 at block_n >= 32: the warps of a pair each
     * compute half the key tile's scores and trade them through shared
     * memory at smem_x (see "Head dims past 256") */
    int pair_keys;
    int32_t smem_x, x_bytes;
    int default_state;             /* the state with the score tile's option work */
} ffwd_plan;

/* Warp specialised, the consumers overlap a tile's softmax with the P V
 * before it (see "Overlap"), given two stages at least. */
static int ws_overlaps(const ffwd_plan *p)
{
    return p->ws && p->stages >= 2;
}


/*
 * Default schedules, most preferred first: 16 rows per warp, so that O
 * (Dv / 2 floats per lane), S (block_n / 2) and the statistics stay far
 * enough below 255 registers for ptxas to need no spills with every option
 * on (dropout's Philox, alibi, accumulate); 8 warps share each K/V tile,
 * and narrower key tiles make room for a wider O.  The default is the
 * first that plan_schedule accepts (the state budget, the target's shared
 * memory) whose state with the option work on S (default_state) is within
 * DEFAULT_STATE, else the accepted one with the least, with any schedule
 * field the op gives put over it; the last ones fit every head dim on
 * every target.
 */
static const aj_schedule default_candidates[] = {
    {.block_m = 128, .block_n = 64, .warps = 8, .stages = 2},
    {.block_m = 128, .block_n = 32, .warps = 8, .stages = 2},
    {.block_m = 64, .block_n = 32, .warps = 4, .stages = 2},
    {.block_m = 64, .block_n = 32, .warps = 4, .stages = 1},
    /* Dv past 256 (see "Head dims past 256"): 4 row groups of 16 rows,
     * each on a warp pair, then 2 for sm_89's 99 KiB at D 512; never
     * accepted below it (16 rows per warp would be 128 or 64 rows) */
    {.block_m = 64, .block_n = 32, .warps = 8, .stages = 2},
    {.block_m = 64, .block_n = 32, .warps = 8, .stages = 1},
    {.block_m = 32, .block_n = 32, .warps = 4, .stages = 1},
    /* D near 512 with Dv up to 256 in sm_89's 99 KiB; below D 256 the
     * 64-row ones always fit with the same state, and win the tie */
    {.block_m = 32, .block_n = 32, .warps = 2, .stages = 1},
};

/*
 * The wgmma template's (schedule warpgroups = G): 64 G rows on 4 G warps,
 * the widest key tile whose state fits; block_m and warps follow G.
 */
static const aj_schedule wgmma_candidates[] = {
    {.block_n = 128, .stages = 2},
    {.block_n = 64, .stages = 2},
    {.block_n = 32, .stages = 2},
    {.block_n = 16, .stages = 2},
};

/* `given`'s fields over candidate `s`: a block_m or warps given alone
 * brings the other with it, 16 rows per warp (at most 4 warps), as the
 * candidates have. */
static aj_schedule merge_schedule(aj_schedule s, const aj_schedule *given)
{
    if (given->block_m)
        s.block_m = given->block_m;
    else if (given->warps)
        s.block_m = 16 * given->warps;
    if (given->block_n)
        s.block_n = given->block_n;
    if (given->warps)
        s.warps = given->warps;
    else if (given->block_m)
        s.warps = s.block_m / 16 < 4 ? s.block_m / 16 : 4;
    if (given->stages)
        s.stages = given->stages;
    return s;
}

/* The warpgroups the kernel runs: the op's schedule's, except that FP8
 * inputs on a target whose mma.sync lowers them (Hopper: the target
 * table's f8_mma) and that has wgmma take wgmma -- Hopper's FP8 tensor
 * cores are wgmma's --, one warpgroup where the schedule asks for 64 rows
 * or 4 warps, else two, as FA3 does. */
static int plan_warpgroups(const aj_op *op, aj_target target)
{
    const aj_target_desc *t = aj_target_desc_of(target);
    if (op->warpgroups || !aj_op_has_f8(op) || t->f8_mma != AJ_F8_MMA_LOWERED || !t->wgmma ||
        op->layout == AJ_LAYOUT_PAGED)   /* (an f8 cache: widened, see "Paged") */
        return op->warpgroups;
    /* a schedule's rows or warps say how many (64 rows on 4 warps each) */
    const aj_schedule *s = &op->schedule;
    return s->block_m == 64 || (!s->block_m && s->warps == 4) ? 1 : 2;
}

/* The wgmma template's checks and its fixed fields: the target, 64 rows
 * per warpgroup on 4 warps each; `s` completed. */
static aj_status plan_wgmma(aj_ctx *ctx, const aj_op *op, aj_target target, aj_schedule *s,
                            ffwd_plan *p)
{
    if (!aj_target_desc_of(target)->wgmma)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: warpgroups = %d needs wgmma, which %s lacks: target sm_90a "
                       "(or sim, which emulates it), or warpgroups = 0 for the mma.sync "
                       "template", p->wg, aj_target_name(target));
    /* past Dv 256 the two warpgroups split Dv on the same 64 rows (see
     * "Head dims past 256") */
    if (p->dvs > 1 && p->wg != 2)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: warpgroups = %d at head_dim_v %d: the wgmma forward splits Dv "
                       "past 256 across two warpgroups on the same 64 rows; use warpgroups = 2",
                       p->wg, p->dv);
    if (p->dvs > 1 && op->producer)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: producer = 1 at head_dim_v %d: the warp-specialised wgmma "
                       "forward takes Dv up to 256; use producer = 0 (two warpgroups split Dv "
                       "past 256)", p->dv);
    int rows = 64 * p->wg / p->dvs;
    if (!s->block_m)
        s->block_m = rows;
    if (!s->warps)
        s->warps = 4 * p->wg;
    if (s->block_m != rows || s->warps != 4 * p->wg)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: warpgroups = %d runs block_m = %d rows on warps = %d (%s), "
                       "not block_m = %d, warps = %d", p->wg, rows, 4 * p->wg,
                       p->dvs > 1 ? "64 rows on both warpgroups of 4 warps past Dv 256"
                                  : "64 rows per warpgroup of 4 warps",
                       s->block_m, s->warps);
    return AJ_OK;
}

/* The plan's shared memory: Q's tile and the stages' K and V slots (their
 * row strides), the pairs' score exchange where it fits, refused past the
 * target's limit. */
static aj_status plan_shared(aj_ctx *ctx, const aj_op *op, aj_target target, ffwd_plan *p)
{
    /* the wgmma tiles are unpadded panels (see "wgmma"), each 1024-byte aligned */
    p->ldq = p->wg ? aj_wgmma_tile_width(p->d) : aj_mma_tile_ld(p->d);
    p->ldk = p->wg ? aj_wgmma_tile_width(p->d) : aj_mma_tile_ld(p->d);
    int vt_width = p->f8 ? p->bn / 2 : p->dv;   /* f8: V^T's rows, block_n bytes */
    p->ldv = p->wg ? aj_wgmma_tile_width(vt_width) : aj_mma_tile_ld(vt_width);
    p->v_slot = 2 * (p->f8 ? p->dv : p->bn) * p->ldv;
    p->shared = op->kv_shared;
    if (p->shared) {   /* V reads K's tile (see "Paged") */
        p->ldv = p->ldk;
        p->v_slot = 0;
    }
    int64_t bytes = 2 * (int64_t)p->bm * p->ldq +
                    (int64_t)p->stages * (2 * p->bn * p->ldk + p->v_slot);
    if (p->paged)   /* each slot's row table */
        bytes += (int64_t)p->stages * aj_tile_paged_rows_bytes(p->bn);
    if (p->kv8)   /* one K tile, the slots raw */
        bytes += (int64_t)p->stages * p->bn * p->d - (int64_t)(p->stages - 1) * 2 * p->bn * p->ldk;
    /* the pairs' score exchange, a 16-byte entry per lane, n8 tile and
     * m-tile, where it fits (where not -- sm_89's 99 KiB at the widest
     * heads -- both warps of a pair compute the whole tile) */
    int32_t exchange = (p->warps / p->dvs) * p->mt * (p->bn / 8) * 32 * 16;
    p->pair_keys = p->dvs > 1 && !p->wg && p->bn >= 32 &&
                   bytes + exchange <= aj_target_smem_limit(target);
    p->x_bytes = p->pair_keys ? exchange : 0;
    bytes += p->x_bytes;
    /* wgmma: the tiles' 1024-byte alignment and the mbarriers, at most 2 KiB
     * (warp specialised: 1 + 2 stages of them, 56 bytes) */
    bytes += p->wg ? 2 * 1024 : 0;
    if (bytes > aj_target_smem_limit(target))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d, stages = %d needs %lld bytes of "
                       "shared memory at head_dim %d/%d; %s allows %d", p->bm, p->bn,
                       p->stages, (long long)bytes, op->head_dim, p->dv, aj_target_name(target),
                       aj_target_smem_limit(target));
    return AJ_OK;
}

/* The plan of schedule `s`, or AJ_ERR_UNSUPPORTED naming the limit it
 * breaks (the message on ctx, which may be NULL). */
static aj_status plan_schedule(aj_ctx *ctx, const aj_op *op, aj_target target,
                               const aj_schedule *sched, void *out)
{
    ffwd_plan *p = out;
    aj_schedule s = *sched;
    memset(p, 0, sizeof *p);
    p->dtype = op->dtype;
    p->paged = op->layout == AJ_LAYOUT_PAGED;
    p->f8 = aj_op_has_f8(op) && !p->paged ? aj_op_kv_dtype(op) : 0;
    p->kv8 = aj_op_has_f8(op) && p->paged ? aj_op_kv_dtype(op) : 0;
    p->d = p->f8 ? op->head_dim / 2 : op->head_dim;
    p->dv = aj_op_dv(op);
    p->dvs = (p->dv + 8 * MAX_VT - 1) / (8 * MAX_VT);
    p->wg = plan_warpgroups(op, target);
    /* wgmma's split 0 takes 256 columns, whole panels, split 1 the rest
     * (see "Head dims past 256") */
    p->vt = p->wg && p->dvs > 1 ? MAX_VT : (p->dv / 8 + p->dvs - 1) / p->dvs;
    if (p->wg) {
        aj_status st = plan_wgmma(ctx, op, target, &s, p);
        if (st != AJ_OK)
            return st;
    }
#define CHECK_VALUE(field, allowed, ok)                                                    \
    {                                                                                      \
        int v = s.field;                                                                   \
        if (!(ok))                                                                         \
            return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "schedule: " #field " = %d is not "    \
                           "supported by flash forward (allowed: %s)", v, allowed);        \
    }
    SCHEDULE_VALUES(CHECK_VALUE)
#undef CHECK_VALUE
    if (s.warps % p->dvs)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: warps = %d at head_dim_v %d: flash forward splits Dv past 256 "
                       "across warp pairs, so warps must be even", s.warps, p->dv);
    /* the warps of one Dv split (all of them without one) */
    int row_warps = s.warps / p->dvs;
    if (!p->wg && s.block_m != 16 * row_warps && s.block_m != 32 * row_warps)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d with warps = %d: flash forward gives each warp "
                       "16 or 32 rows%s (block_m = %d or %d)", s.block_m, s.warps,
                       p->dvs > 1 ? ", a warp pair each row block past Dv 256" : "",
                       16 * row_warps, 32 * row_warps);
    if (p->f8 && s.block_n % 32)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_n = %d: flash forward with 8-bit inputs takes keys 32 at "
                       "a time (P V on k32 tensor-core steps); use a multiple of 32", s.block_n);
    p->bm = s.block_m;
    p->bn = s.block_n;
    p->warps = s.warps;
    p->stages = s.stages;
    p->ws = p->wg && op->producer;
    p->threads = 32 * p->warps + (p->ws ? WARPGROUP_THREADS : 0);
    p->mt = p->bm / (16 * row_warps);
    int state = p->mt * (4 * p->vt + p->bn / 2 + 4);
    if (ws_overlaps(p))   /* the held P V's A fragments (see "Overlap") */
        state += p->bn / (p->f8 ? 8 : 4);
    p->default_state = state + p->mt * p->bn / 2 *
                                   (aj_attn_option_regs_per_element(op) +
                                    aj_attn_score_mod_regs_per_element(op));
    if (p->wg && !ws_overlaps(p))   /* P's A fragments beside S (see WGMMA_DEFAULT_STATE) */
        p->default_state += p->mt * p->bn / (p->f8 ? 8 : 4) +
                            (p->wg == 1 ? WGMMA_ONE_WARPGROUP_STATE : 0);
    if (state > (p->wg ? WGMMA_STATE_BUDGET : STATE_BUDGET))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d, warps = %d keeps %d f32 values "
                       "per thread at head_dim_v %d (budget %d); use fewer rows per warp or "
                       "a smaller block_n", p->bm, p->bn, p->warps, state, p->dv,
                       p->wg ? WGMMA_STATE_BUDGET : STATE_BUDGET);
    return plan_shared(ctx, op, target, p);
}

static int plan_state(const void *plan)
{
    return ((const ffwd_plan *)plan)->default_state;
}

/* The op's schedule over the default candidates (see them); when none
 * fits, the first one's failure (attn_common.h). */
static aj_status plan_kernel(aj_ctx *ctx, const aj_op *op, aj_target target, ffwd_plan *p)
{
    int wg = plan_warpgroups(op, target) != 0;
    const aj_attn_schedule_rule rule = {
        .candidates = wg ? wgmma_candidates : default_candidates,
        .n = wg ? (int)(sizeof wgmma_candidates / sizeof wgmma_candidates[0])
                : (int)(sizeof default_candidates / sizeof default_candidates[0]),
        .plan = plan_schedule,
        .complete = wg ? NULL : merge_schedule,
        .state = plan_state,
        .state_goal = wg && !op->producer ? WGMMA_DEFAULT_STATE : DEFAULT_STATE,
    };
    return aj_attn_plan_schedule(ctx, op, target, &rule, p);
}

static aj_status ffwd_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    if (op->dtype == AJ_DTYPE_F32)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "dtype = f32: flash forward runs on f16 / bf16 tensor cores; use "
                       "`attention forward efficient` for f32");
    if (aj_op_has_f8(op)) {
        /* FP8 tensor cores: Q and K of one 8-bit format, whole k32 steps
         * of the head dim, a target whose mma.sync runs them at their rate
         * or whose wgmma does (the target table's f8_mma and wgmma) */
        const aj_f8_mma mma = aj_target_desc_of(target)->f8_mma;
        const char *why = aj_op_q_dtype(op) != aj_op_kv_dtype(op)
                              ? "needs q_dtype = kv_dtype (Q and K meet on the f8 tensor cores)"
                          : op->head_dim % 32 ? "needs a head_dim that is a multiple of 32"
                          : mma == AJ_F8_MMA_NONE
                              ? "needs FP8 tensor cores (compute capability 8.9 or newer), "
                                "which it lacks"
                          : mma == AJ_F8_MMA_LOWERED && plan_warpgroups(op, target) == 0
                              ? "needs target sm_90a on Hopper: its FP8 tensor cores are "
                                "wgmma's (ptxas lowers mma.sync e4m3 to f16 HMMA)"
                          : op->dropout > 0
                              ? "takes no dropout (its P goes to e4m3 scaled for P <= 1)"
                              : NULL;
        if (why)
            return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                           "q_dtype = %s, kv_dtype = %s, head_dim = %d: flash forward with "
                           "8-bit inputs on %s %s; `attention forward efficient` takes them",
                           aj_dtype_name(aj_op_q_dtype(op)), aj_dtype_name(aj_op_kv_dtype(op)),
                           op->head_dim, aj_target_name(target), why);
    }
    /* past 256, Dv splits across warp pairs or a warpgroup pair (see "Head
     * dims past 256"); FP8 stops at 256 */
    aj_status st =
        aj_op_has_f8(op) ? aj_attn_check_dims(ctx, op, "flash forward with 8-bit inputs",
                                              AJ_HEAD_DIM_MAX_GPU)
                         : aj_attn_check_dims(ctx, op, "flash forward", AJ_HEAD_DIM_MAX_FLASH);
    ffwd_plan plan;
    return st != AJ_OK ? st : aj_kctx_check_planned(ctx, op, plan_kernel(ctx, op, target, &plan));
}

/* ---------------------------------------------------------------- build */

typedef struct ffwd {
    AJ_KCTX;                        /* skeleton.h */
    ffwd_plan p;
    LLVMValueRef lane, g, t;        /* i32: lane, lane / 4, lane % 4 */
    LLVMValueRef wrow;              /* i32: the warp's first local row */
    /* i32: the warp's Dv split and its first output column (NULL without
     * splits: see "Head dims past 256") */
    LLVMValueRef split, vcol;
    LLVMValueRef m0;                /* i32: first query row of the CTA */
    LLVMValueRef k_src, v_src;      /* i64: element offsets of the K / V slices */
    /* i32 byte offsets of this lane's ldmatrix row addresses: Q's (with
     * smem_q) and, from a K or V slot, K's and V's; see lane_addresses */
    LLVMValueRef q_lane, k_lane, v_lane;
    LLVMValueRef s[MAX_MT][MAX_NT][4];   /* vars: scores of the current tile */
    LLVMValueRef o[MAX_MT][MAX_VT][4];   /* vars: output accumulators */
    LLVMValueRef m[MAX_MT][2], l[MAX_MT][2];  /* vars: running max (log2), lane sum */
    /* wgmma: the accumulator arrays of S ([bn/2] f32) and O ([dv/2] f32),
     * and the byte offset of the warpgroup's first Q row in Q's panel 0 */
    LLVMValueRef acc_s, acc_o, q_wg;
    LLVMValueRef acc_o1;            /* wgmma past Dv 256: split 1's (its own N) */
    /* wgmma over padded tensors: the launch's tma (i32; NULL: no TMA
     * code), the tile's batch entry and KV head, and the mbarriers' shared
     * byte offset (Q's, then one per ring slot) */
    LLVMValueRef tma, bidx, h, hkv;
    int32_t smem_bar;
    /* i32: the loading thread's index among the ld_threads that load
     * (every thread; warp specialised, the producer warpgroup's) */
    LLVMValueRef ld_tid;
    int ld_threads;
    LLVMValueRef wgi;               /* i32: the thread's warpgroup */
    /* FP8 inputs: the factors of S (q_scale k_scale) and of O (v_scale),
     * else NULL */
    LLVMValueRef s_scale, o_scale;
    /* layout = paged (see "Paged"), else NULL: the part's rows (i32, its
     * heads' seq_q queries stacked head after head, per = seq_q >= 1 rows
     * a head, the first head h0), the positions the row block spans
     * (i_first .. i_last), the caches' page strides (i64) */
    LLVMValueRef rows, per, h0, i_first, i_last;
    LLVMValueRef k_page, v_page;
    LLVMValueRef part_first, part_last;   /* i32: the split-KV part's key tiles */
} ffwd;

/* How load_tile_async finds tile row r's source: NULL, row row0 + r of
 * the slice; layout = paged, K and V through the slot's row table (i32
 * shared byte offset `table`, aj_tile_paged_rows: page[r], in_page[r]),
 * the rows `stride` apart within a page and pages stride_page apart; Q
 * as stacked heads, row r the row r % per of head r / per, the heads
 * head_stride apart (all i64). */
typedef struct row_map {
    LLVMValueRef table, stride_page;
    LLVMValueRef per, head_stride;
} row_map;

static aj_param_source out_tensor(const aj_op *op)
{
    return op->accumulate ? AJ_PSRC_o_acc : AJ_PSRC_o;
}

/* ptr addrspace(3) to byte `base + bytes` of shared memory.  Addresses are
 * built as one per-thread register plus a constant, so that ptxas folds
 * the constant into the instruction and no per-access address stays live
 * across the key loop. */
static LLVMValueRef smem_at(ffwd *e, LLVMValueRef base, int64_t bytes)
{
    return aj_smem_at(e->kb, base, bytes);
}

/* Byte offset (i32) of element (row, col) of a tile with row pitch ld. */
static LLVMValueRef tile_offset(ffwd *e, LLVMValueRef row, LLVMValueRef col, int ld)
{
    LLVMValueRef elem = aj_kb_add(e->kb, LLVMBuildMul(e->b, row, aj_kb_i32(e->kb, ld), ""), col);
    return LLVMBuildShl(e->b, elem, aj_kb_i32(e->kb, 1), "");
}

/*
 * Byte offset (i32) in a tile of `rows` x `width` elements of the 16-byte
 * chunk at (row, col), col a multiple of 8: row-major with pitch ld for
 * mma.sync; for wgmma the panel layout of "wgmma" below, swizzled.
 */
static LLVMValueRef tile_chunk(ffwd *e, LLVMValueRef row, LLVMValueRef col, int rows, int width,
                               int ld)
{
    if (!e->p.wg)
        return tile_offset(e, row, col, ld);
    return aj_wgmma_tile_offset(e->kb, row, col, rows, width);
}

/* The element offset (i64) of stacked row `row` (i32) -- row % per of
 * head row / per -- the heads head_stride apart, a head's rows `stride`
 * (i64; NULL: 1). */
static LLVMValueRef stacked_row(ffwd *e, LLVMValueRef per, LLVMValueRef head_stride,
                                LLVMValueRef row, LLVMValueRef stride)
{
    LLVMBuilderRef b = e->b;
    LLVMValueRef head = LLVMBuildUDiv(b, row, per, "");
    LLVMValueRef pos = aj_kb_sext64(e->kb, LLVMBuildSub(b, row, LLVMBuildMul(b, head, per, ""),
                                                         ""));
    return aj_kb_add(e->kb, LLVMBuildMul(b, aj_kb_sext64(e->kb, head), head_stride, ""),
                     stride ? LLVMBuildMul(b, pos, stride, "") : pos);
}

/* Tile row r (i32) of a paged tile: whether it has a page (*in) and its
 * element offset (*at, i64; 0 without a page). */
static void mapped_row(ffwd *e, const row_map *map, int rows, LLVMValueRef r, LLVMValueRef stride,
                       LLVMValueRef *in, LLVMValueRef *at)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef entry = aj_kb_add(kb, map->table, LLVMBuildShl(b, r, aj_kb_i32(kb, 2), ""));
    LLVMValueRef page = aj_kb_load(kb, kb->t_i32, smem_at(e, entry, 0), 4);
    LLVMValueRef in_page = aj_kb_load(kb, kb->t_i32, smem_at(e, entry, 4 * (int64_t)rows), 4);
    *in = LLVMBuildICmp(b, LLVMIntSGE, page, aj_kb_i32(kb, 0), "");
    LLVMValueRef off = aj_kb_add(kb, LLVMBuildMul(b, aj_kb_sext64(kb, page), map->stride_page, ""),
                                 LLVMBuildMul(b, aj_kb_sext64(kb, in_page), stride, ""));
    *at = LLVMBuildSelect(b, *in, off, aj_kb_i64(kb, 0), "");
}

/*
 * cp.async of `rows` rows of `width` 16-bit elements, starting at row `row0` of a
 * slice (element offset `base`, row stride `stride`, in the tensor's
 * elements of `esize` bytes: 1 for an f8 row of 2 width), into shared memory
 * at byte offset `dst` with pitch `ld`.  A row is width / 8 chunks of 16
 * bytes; thread tid copies chunks tid, tid + T, ...  (when T is a multiple
 * of the chunks per row, always the same column, T / (width / 8) rows
 * apart).  Rows at or past `limit` (>= 1) are zero-filled, their source
 * clamped to the last row, so the math after never meets garbage such as
 * 0 * NaN.
 */
static void load_tile_async(ffwd *e, aj_param_source tensor, int esize, LLVMValueRef base,
                            LLVMValueRef stride, LLVMValueRef row0, LLVMValueRef limit, int rows,
                            int width, LLVMValueRef dst, int ld, const row_map *map)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    int per_row = width / 8;
    int chunks = rows * per_row;
    int threads = e->ld_threads;
    /* warp specialised, the producer keeps few registers: a loop, not
     * unrolled, each chunk's address from its index */
    int rolled = e->p.ws;
    /* wgmma's swizzle repeats every 8 rows: a fixed column keeps its
     * address pattern only where the rows step by multiples of 8 */
    int fixed_col = !rolled && threads % per_row == 0 &&
                    (!e->p.wg || threads / per_row % 8 == 0);
    /* layout = paged: the chunks' addresses stay in the row block's loop
     * (see "Paged"), where LLVM would compute them all before it */
    LLVMValueRef tid = e->p.paged ? aj_kb_opaque(kb, e->ld_tid) : e->ld_tid;
    LLVMValueRef last = LLVMBuildSub(b, limit, aj_kb_i32(kb, 1), "");
    LLVMValueRef r0 = LLVMBuildUDiv(b, tid, aj_kb_i32(kb, per_row), "");
    LLVMValueRef col0 = LLVMBuildShl(b, LLVMBuildURem(b, tid, aj_kb_i32(kb, per_row), ""),
                                     aj_kb_i32(kb, 3), "");
    LLVMValueRef lane_dst = aj_kb_add(kb, dst, tile_chunk(e, r0, col0, rows, width, ld));
    for (int it = 0; it * threads < chunks && (!rolled || it == 0); it++) {
        LLVMValueRef c = rolled ? aj_kb_for_begin(kb, tid, aj_kb_i32(kb, chunks),
                                                  aj_kb_i32(kb, threads), "chunk")
                                : aj_kb_add(kb, tid, aj_kb_i32(kb, it * threads));
        int partial = !rolled && (it + 1) * threads > chunks;
        if (partial)
            aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, c, aj_kb_i32(kb, chunks), ""));
        LLVMValueRef r, col, sptr;
        if (fixed_col) {
            int dr = it * (threads / per_row);
            r = aj_kb_add(kb, r0, aj_kb_i32(kb, dr));
            col = col0;
            sptr = smem_at(e, lane_dst,
                           e->p.wg ? (int64_t)dr * aj_wgmma_panel_span(width)
                                   : 2 * (int64_t)dr * ld);
        } else {
            r = LLVMBuildUDiv(b, c, aj_kb_i32(kb, per_row), "");
            col = LLVMBuildShl(b, LLVMBuildURem(b, c, aj_kb_i32(kb, per_row), ""), aj_kb_i32(kb, 3),
                               "");
            sptr = smem_at(e, aj_kb_add(kb, dst, tile_chunk(e, r, col, rows, width, ld)), 0);
        }
        LLVMValueRef in, row_at;
        if (map && map->table) {
            mapped_row(e, map, rows, r, stride, &in, &row_at);
        } else {
            LLVMValueRef grow = aj_kb_add(kb, row0, r);
            in = LLVMBuildICmp(b, LLVMIntSLT, grow, limit, "");
            LLVMValueRef srow = aj_kb_smin(kb, grow, last);
            row_at = map ? stacked_row(e, map->per, map->head_stride, srow, stride)
                         : LLVMBuildMul(b, aj_kb_sext64(kb, srow), stride, "");
        }
        /* bytes: the row's in the tensor's elements (esize bytes), the
         * column's in 16-bit units */
        LLVMValueRef at = LLVMBuildMul(b, aj_kb_add(kb, base, row_at), aj_kb_i64(kb, esize), "");
        at = aj_kb_add(kb, at, LLVMBuildShl(b, aj_kb_sext64(kb, col), aj_kb_i64(kb, 1), ""));
        LLVMValueRef src = aj_kb_gptr_offset(kb, aj_param_data(kb, tensor), at);
        LLVMValueRef bytes = LLVMBuildSelect(b, in, aj_kb_i32(kb, 16), aj_kb_i32(kb, 0), "");
        aj_kb_cp_async_16(kb, sptr, src, bytes);
        if (partial)
            aj_kb_if_end(kb);
        if (rolled)
            aj_kb_for_end(kb);
    }
}

/*
 * FP8 (q_dtype = kv_dtype = e4m3 or e5m2): both GEMMs on the 8-bit tensor
 * cores, k32 a step -- mma.sync m16n8k32 (sm_89, sim) or wgmma m64nNk32
 * (sm_90a, sim).  Q and K are the 16-bit kernel's tiles at half the width
 * (an f8 row of D bytes is D / 2 16-bit units; the fragments and
 * descriptors of a k32 step are a k16 step's over byte pairs).  P V needs
 * both operands K-major -- the 8-bit forms have no transposed B and
 * ldmatrix's transpose is 16-bit -- so V is transposed as it is loaded:
 * its slot holds V^T, Dv rows of block_n bytes, laid out as a K tile of
 * width block_n / 2 (row pitch ldv, or wgmma's panels).  P, times 2^8
 * (P_E4M3_LOG2) and rounded to e4m3 (P <= 1 needs e4m3's mantissa bit
 * more than e5m2's range), is A straight from the S accumulators: within
 * each 16
 * keys, lane t holds keys 2t, 2t + 1, 8 + 2t, 9 + 2t of its rows, which
 * the k32 A fragment wants at k = 4t .. 4t + 3 -- so V^T's k order is
 * permuted the same way (vt_key), and the sum over keys is unchanged:
 *
 *   k (V^T's byte in the row) = 16 h + 4 t + i  <-  key 16 h + 2 t + i      (i = 0, 1)
 *                                                   key 16 h + 8 + 2 t + i - 2  (i = 2, 3)
 *
 * V^T is written with plain stores (a 4 x 4 byte block a thread a step:
 * four 32-bit loads of keys, a byte transpose, four 32-bit stores), so
 * its slot is free when refilled as for cp.async, and wgmma reads it
 * after the fence.proxy.async each thread makes before the tile's
 * barrier.  FP8 loads run by cp.async: the TMA path's tensor maps are
 * 16-bit (and V would still be the threads' to transpose).
 */

/* FP8's P enters P V times 2^8 -- its exponent's offset, exact and free --
 * so that P down to 2^-14 is a normal e4m3 (relative error at most 2^-4)
 * where e4m3's subnormals below 2^-6 would round small P to 0 and bias O
 * (the row sum takes them whole); 256 stays under e4m3's 448.  The row
 * sum takes each tile's share back down, o_scale the accumulators'. */
#define P_E4M3_LOG2 8

/* The key (within 16) whose column k16 (0..15) of V^T holds: see "FP8". */
static int vt_key(int k16)
{
    int t = k16 % 16 / 4, i = k16 % 4;
    return i < 2 ? 2 * t + i : 8 + 2 * t + i - 2;
}

/* The i32 byte offset, in the V^T slot at `vdst`, of row n (a column of
 * V) at byte `byte` (a multiple of 4) of the row. */
static LLVMValueRef vt_offset(ffwd *e, LLVMValueRef vdst, LLVMValueRef n, LLVMValueRef byte)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    /* the 16-byte chunk (8 16-bit units) holding the byte, then its place in it */
    LLVMValueRef chunk = LLVMBuildShl(b, LLVMBuildLShr(b, byte, aj_kb_i32(kb, 4), ""),
                                      aj_kb_i32(kb, 3), "");
    LLVMValueRef at = p->wg ? tile_chunk(e, n, chunk, p->dv, p->bn / 2, 0)
                            : tile_offset(e, n, chunk, p->ldv);
    return aj_kb_add(kb, vdst, aj_kb_add(kb, at, LLVMBuildAnd(b, byte, aj_kb_i32(kb, 15), "")));
}

/*
 * FP8 V: the tile at key n0 into the slot at shared byte offset `vdst` as
 * V^T in "FP8"'s key order, keys past Sk zero.  Work item c: columns
 * 4 (c % (Dv / 4)) .. +3 of V and V^T's bytes 4 L .. 4 L + 3 (L = c / (Dv /
 * 4)), which hold keys 16 h + {2t, 2t + 1, 8 + 2t, 9 + 2t} (h = L / 4, t =
 * L % 4): a warp's loads run along a row.
 */
static void load_vt_f8(ffwd *e, LLVMValueRef n0, LLVMValueRef vdst)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    int groups = p->dv / 4;
    LLVMValueRef last = LLVMBuildSub(b, e->seq_k, aj_kb_i32(kb, 1), "");
    LLVMValueRef stride = aj_param(kb, AJ_PID(stride_v_s));
    LLVMTypeRef words = LLVMVectorType(kb->t_i32, 4), bytes = LLVMVectorType(kb->t_i8, 16);
    LLVMValueRef c = aj_kb_for_begin(kb, e->ld_tid, aj_kb_i32(kb, p->bn / 4 * groups),
                                     aj_kb_i32(kb, e->ld_threads), "vtitem");
    LLVMValueRef col = LLVMBuildShl(b, LLVMBuildURem(b, c, aj_kb_i32(kb, groups), ""),
                                    aj_kb_i32(kb, 2), "");
    LLVMValueRef lg = LLVMBuildUDiv(b, c, aj_kb_i32(kb, groups), "");
    LLVMValueRef h16 = LLVMBuildShl(b, LLVMBuildLShr(b, lg, aj_kb_i32(kb, 2), ""),
                                    aj_kb_i32(kb, 4), "");
    LLVMValueRef t2 = LLVMBuildShl(b, LLVMBuildAnd(b, lg, aj_kb_i32(kb, 3), ""),
                                   aj_kb_i32(kb, 1), "");
    LLVMValueRef rows = LLVMGetUndef(words);
    for (int i = 0; i < 4; i++) {
        LLVMValueRef key = aj_kb_add(kb, h16, aj_kb_add(kb, t2, aj_kb_i32(kb, vt_key(i))));
        LLVMValueRef grow = aj_kb_add(kb, n0, key);
        LLVMValueRef in = LLVMBuildICmp(b, LLVMIntSLT, grow, e->seq_k, "");
        LLVMValueRef at = aj_kb_add(
            kb, e->v_src,
            aj_kb_add(kb, LLVMBuildMul(b, aj_kb_sext64(kb, aj_kb_smin(kb, grow, last)), stride, ""),
                      aj_kb_sext64(kb, col)));
        LLVMValueRef w =
            aj_kb_load(kb, kb->t_i32, aj_kb_gptr_offset(kb, aj_param_data(kb, AJ_PSRC_v), at), 4);
        w = LLVMBuildSelect(b, in, w, aj_kb_i32(kb, 0), "");
        rows = LLVMBuildInsertElement(b, rows, w, aj_kb_i32(kb, i), "");
    }
    /* byte j of row word i -> byte i of column word j */
    LLVMValueRef mask[16];
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 4; i++)
            mask[4 * j + i] = aj_kb_i32(kb, 4 * i + j);
    LLVMValueRef as_bytes = LLVMBuildBitCast(b, rows, bytes, "");
    LLVMValueRef cols = LLVMBuildBitCast(
        b, LLVMBuildShuffleVector(b, as_bytes, LLVMGetUndef(bytes), LLVMConstVector(mask, 16), ""),
        words, "");
    LLVMValueRef kbyte = LLVMBuildShl(b, lg, aj_kb_i32(kb, 2), "");
    for (int j = 0; j < 4; j++) {
        LLVMValueRef n = aj_kb_add(kb, col, aj_kb_i32(kb, j));
        aj_kb_store(kb, LLVMBuildExtractElement(b, cols, aj_kb_i32(kb, j), ""),
                    smem_at(e, vt_offset(e, vdst, n, kbyte), 0), 4);
    }
    aj_kb_for_end(kb);
}

/* The ring slot (i32) of walk position `at`, the walk starting at `first`. */
static LLVMValueRef ring_slot(ffwd *e, LLVMValueRef at, LLVMValueRef first)
{
    return LLVMBuildURem(e->b, LLVMBuildSub(e->b, at, first, ""),
                         aj_kb_i32(e->kb, e->p.stages), "");
}

/* i32: walk position `at`'s phase in its slot (from the walk's first). */
static LLVMValueRef slot_phase(ffwd *e, LLVMValueRef at, LLVMValueRef first)
{
    return LLVMBuildUDiv(e->b, LLVMBuildSub(e->b, at, first, ""), aj_kb_i32(e->kb, e->p.stages),
                         "");
}

/* i32: the parity an mbarrier wait takes for `phase`. */
static LLVMValueRef parity_of(ffwd *e, LLVMValueRef phase)
{
    return LLVMBuildAnd(e->b, phase, aj_kb_i32(e->kb, 1), "");
}

/* The shared byte offsets (i32) of ring slot `slot`'s K and V tiles. */
static LLVMValueRef slot_k(ffwd *e, LLVMValueRef slot)
{
    if (e->p.kv8)   /* one K tile, widened from the slot's stage (see "Paged") */
        return aj_kb_i32(e->kb, e->p.smem_k);
    return aj_kb_add(e->kb, aj_kb_i32(e->kb, e->p.smem_k),
                     LLVMBuildMul(e->b, slot, aj_kb_i32(e->kb, 2 * e->p.bn * e->p.ldk), ""));
}

static LLVMValueRef slot_v(ffwd *e, LLVMValueRef slot)
{
    if (e->p.shared)
        return slot_k(e, slot);
    return aj_kb_add(e->kb, aj_kb_i32(e->kb, e->p.smem_v),
                     LLVMBuildMul(e->b, slot, aj_kb_i32(e->kb, e->p.v_slot), ""));
}

/* An arrival on the mbarrier at shared byte offset `bar` (i32). */
static void mbar_arrive(ffwd *e, LLVMValueRef bar)
{
    LLVMValueRef at = smem_at(e, bar, 0);
    aj_kb_intrinsic(e->kb, AJ_INTR_MBARRIER_ARRIVE, &at);
}

/* i1: the launch's tma is set (the kernel has TMA code: e->tma). */
static LLVMValueRef tma_on(ffwd *e)
{
    return LLVMBuildICmp(e->b, LLVMIntNE, e->tma, aj_kb_i32(e->kb, 0), "");
}

/* The shared byte offset (i32) of ring slot `slot`'s mbarrier (TMA; warp
 * specialised, its "full" one). */
static LLVMValueRef slot_bar(ffwd *e, LLVMValueRef slot)
{
    return aj_kb_add(e->kb, aj_kb_i32(e->kb, e->smem_bar + 8),
                     LLVMBuildShl(e->b, slot, aj_kb_i32(e->kb, 3), ""));
}

/* Warp specialised: the shared byte offset (i32) of ring slot `slot`'s
 * "empty" mbarrier, which every consumer thread arrives on when done
 * with the slot. */
static LLVMValueRef empty_bar(ffwd *e, LLVMValueRef slot)
{
    return aj_kb_add(e->kb, aj_kb_i32(e->kb, e->smem_bar + 8 * (1 + e->p.stages)),
                     LLVMBuildShl(e->b, slot, aj_kb_i32(e->kb, 3), ""));
}

/* Warp specialised, where the loads are cp.async: the loading thread's
 * copies have landed and its generic writes are fenced for the async
 * proxy wgmma reads through; then it arrives on `bar` (one of
 * ld_threads arrivals). */
static void ws_copies_landed(ffwd *e, LLVMValueRef bar)
{
    aj_kb_cp_async_commit(e->kb);
    aj_kb_cp_async_wait_all(e->kb);
    aj_kb_intrinsic(e->kb, AJ_INTR_FENCE_PROXY_ASYNC, NULL);
    mbar_arrive(e, bar);
}

/* TMA loads of a wgmma tile of `rows` x `width` into shared byte offset
 * `dst`, one box per panel (params.h, AJ_PENC_TMA_*): the tensor map
 * parameter `map`'s box at (panel column, row0, head h, e->bidx),
 * completing on the mbarrier at `bar`. */
static void tma_tile(ffwd *e, aj_param_id map, LLVMValueRef dst, int rows, int width,
                     LLVMValueRef row0, LLVMValueRef h, LLVMValueRef bar)
{
    aj_kb *kb = e->kb;
    int span = aj_wgmma_panel_span(width);
    LLVMValueRef addr = LLVMBuildPtrToInt(e->b, aj_param(kb, map), kb->t_i64, "");
    for (int panel = 0; panel < aj_wgmma_tile_width(width) / (span / 2); panel++) {
        LLVMValueRef args[7] = {smem_at(e, dst, (int64_t)panel * rows * span), addr,
                                aj_kb_i32(kb, panel * span / 2), row0, h, e->bidx,
                                smem_at(e, bar, 0)};
        aj_kb_intrinsic(kb, AJ_INTR_TMA_LOAD_4D, args);
    }
}

/* layout = paged: key tile n0 .. n0 + block_n - 1's row table in slot
 * `slot`'s (every loading thread meets at a barrier once it is written:
 * the slot's last copies read the table when issued, before the barrier
 * that ended the walk position before), then K's rows from the cache's
 * pages and V's (none with kv_shared: V is K's tile). */
static void paged_kv_tile(ffwd *e, LLVMValueRef slot, LLVMValueRef n0, LLVMValueRef kdst,
                          LLVMValueRef vdst)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    LLVMValueRef table =
        aj_kb_add(kb, aj_kb_i32(kb, p->smem_rows),
                  LLVMBuildMul(e->b, slot, aj_kb_i32(kb, aj_tile_paged_rows_bytes(p->bn)), ""));
    aj_tile_paged_rows(kb, table, p->bn, n0, e->seq_k, e->bidx, e->ld_tid, e->ld_threads);
    aj_kb_barrier(kb);
    const row_map k = {table, e->k_page, NULL, NULL}, v = {table, e->v_page, NULL, NULL};
    if (p->kv8) {   /* the bytes, raw, to the slot's stage (rows of D / 2 16-bit units) */
        LLVMValueRef stage = aj_kb_add(kb, aj_kb_i32(kb, p->smem_stage),
                                       LLVMBuildMul(e->b, slot, aj_kb_i32(kb, p->bn * p->d), ""));
        load_tile_async(e, AJ_PSRC_k_cache, 1, e->k_src, aj_param(kb, AJ_PID(stride_k_cache_s)),
                        n0, e->seq_k, p->bn, p->d / 2, stage, p->d / 2, &k);
        return;
    }
    load_tile_async(e, AJ_PSRC_k_cache, 2, e->k_src, aj_param(kb, AJ_PID(stride_k_cache_s)), n0,
                    e->seq_k, p->bn, p->d, kdst, p->ldk, &k);
    if (!p->shared)
        load_tile_async(e, AJ_PSRC_v_cache, 2, e->v_src, aj_param(kb, AJ_PID(stride_v_cache_s)),
                        n0, e->seq_k, p->bn, p->dv, vdst, p->ldv, &v);
}

/* Issues the copies of key tile `n` (K and V) into ring slot
 * (at - first) % stages: `at` is its position in the walk (score.h). */
static void load_kv_tile(ffwd *e, LLVMValueRef n, LLVMValueRef at, LLVMValueRef first)
{
    const ffwd_plan *p = &e->p;
    LLVMBuilderRef b = e->b;
    LLVMValueRef slot = ring_slot(e, at, first);
    LLVMValueRef n0 = LLVMBuildMul(b, n, aj_kb_i32(e->kb, p->bn), "");
    LLVMValueRef kdst = slot_k(e, slot), vdst = slot_v(e, slot);
    if (e->tma) {   /* thread 0 issues the tile's TMA boxes, else cp.async */
        aj_kb_if_begin(e->kb, tma_on(e));
        aj_kb_if_begin(e->kb, LLVMBuildICmp(b, LLVMIntEQ, e->ld_tid, aj_kb_i32(e->kb, 0), ""));
        LLVMValueRef bar = slot_bar(e, slot);
        /* the whole boxes, the zeros past D and Dv included */
        LLVMValueRef tx[2] = {smem_at(e, bar, 0),
                              aj_kb_i32(e->kb, 2 * p->bn * p->ldk + p->v_slot)};
        aj_kb_intrinsic(e->kb, AJ_INTR_MBARRIER_ARRIVE_EXPECT_TX, tx);
        tma_tile(e, AJ_PID(k_tma), kdst, p->bn, p->d, n0, e->hkv, bar);
        tma_tile(e, AJ_PID(v_tma), vdst, p->bn, p->dv, n0, e->hkv, bar);
        aj_kb_if_end(e->kb);
        aj_kb_else(e->kb);
    }
    if (p->paged) {   /* (no TMA, not warp specialised) */
        paged_kv_tile(e, slot, n0, kdst, vdst);
        return;
    }
    load_tile_async(e, AJ_PSRC_k, p->f8 ? 1 : 2, e->k_src, aj_param(e->kb, AJ_PID(stride_k_s)),
                    n0, e->seq_k, p->bn, p->d, kdst, p->ldk, NULL);
    if (p->f8)
        load_vt_f8(e, n0, vdst);
    else
        load_tile_async(e, AJ_PSRC_v, 2, e->v_src, aj_param(e->kb, AJ_PID(stride_v_s)), n0,
                        e->seq_k, p->bn, p->dv, vdst, p->ldv, NULL);
    if (p->ws)
        ws_copies_landed(e, slot_bar(e, slot));
    if (e->tma)
        aj_kb_if_end(e->kb);
}

/* TMA, with the launch's tma set, thread 0: a walk position that loads
 * nothing still completes its slot's phase (a plain arrival), so that
 * each slot's k-th phase is the k-th position it serves.  Warp
 * specialised, every thread that loads arrives, by TMA or cp.async. */
static void tma_no_tile(ffwd *e, LLVMValueRef at, LLVMValueRef first)
{
    LLVMBuilderRef b = e->b;
    LLVMValueRef slot = ring_slot(e, at, first);
    if (e->p.ws) {
        mbar_arrive(e, slot_bar(e, slot));
        return;
    }
    aj_kb_if_begin(e->kb, LLVMBuildAnd(
        b, tma_on(e), LLVMBuildICmp(b, LLVMIntEQ, e->tid, aj_kb_i32(e->kb, 0), ""), ""));
    mbar_arrive(e, slot_bar(e, slot));
    aj_kb_if_end(e->kb);
}

/* Q's TMA boxes (with the launch's tma set, one thread), its bytes
 * expected on Q's mbarrier. */
static void q_by_tma(ffwd *e)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    LLVMValueRef bar_q = aj_kb_i32(kb, e->smem_bar);
    LLVMValueRef tx[2] = {smem_at(e, bar_q, 0), aj_kb_i32(kb, 2 * p->bm * p->ldq)};
    aj_kb_intrinsic(kb, AJ_INTR_MBARRIER_ARRIVE_EXPECT_TX, tx);
    tma_tile(e, AJ_PID(q_tma), aj_kb_i32(kb, p->smem_q), p->bm, p->d, e->m0, e->h, bar_q);
}

/* Q's copies by cp.async (this thread's share), from its slice `q_src`. */
static void q_by_copies(ffwd *e, LLVMValueRef q_src)
{
    const ffwd_plan *p = &e->p;
    /* layout = paged: the part's stacked heads (see "Paged") */
    row_map stacked = {NULL, NULL, NULL, NULL};
    if (e->per)
        stacked = (row_map){NULL, NULL, e->per, aj_param(e->kb, AJ_PID(stride_q_h))};
    load_tile_async(e, AJ_PSRC_q, p->f8 ? 1 : 2, q_src, aj_param(e->kb, AJ_PID(stride_q_s)), e->m0,
                    e->rows ? e->rows : e->seq_q, p->bm, p->d, aj_kb_i32(e->kb, p->smem_q), p->ldq,
                    e->per ? &stacked : NULL);
}

/* The CTA's last row that the sequence has (layout = paged: the part). */
static LLVMValueRef last_row(ffwd *e)
{
    LLVMValueRef rows = aj_kb_smin(e->kb, aj_kb_i32(e->kb, e->p.bm),
                                   LLVMBuildSub(e->b, e->rows ? e->rows : e->seq_q, e->m0, ""));
    return aj_kb_add(e->kb, e->m0, LLVMBuildSub(e->b, rows, aj_kb_i32(e->kb, 1), ""));
}

/* The query position of row r (i32) of the CTA's rows: r, or with stacked
 * heads (layout = paged) its position in its head, r % per. */
static LLVMValueRef row_pos(ffwd *e, LLVMValueRef r)
{
    return e->per ? LLVMBuildURem(e->b, r, e->per, "") : r;
}

/* The query positions the row block spans, [*first, *last]: its rows m0
 * .. last_row, or with stacked heads the range paged_rows set. */
static void block_positions(ffwd *e, LLVMValueRef *first, LLVMValueRef *last)
{
    *first = e->per ? e->i_first : e->m0;
    *last = e->per ? e->i_last : last_row(e);
}

/* Key-tile range [n_begin, n_end) holding a key that the band shows some
 * row of this CTA (empty when it shows none). */
static void key_tile_range(ffwd *e, LLVMValueRef *n_begin, LLVMValueRef *n_end)
{
    LLVMBuilderRef b = e->b;
    LLVMValueRef j_lo, j_hi, i_first, i_last;
    block_positions(e, &i_first, &i_last);
    aj_score_key_range(&e->sc, i_first, i_last, e->seq_k, &j_lo, &j_hi);
    LLVMValueRef bn = aj_kb_i32(e->kb, e->p.bn);
    LLVMValueRef begin = LLVMBuildSDiv(b, j_lo, bn, "");
    LLVMValueRef end = LLVMBuildSDiv(b, aj_kb_add(e->kb, j_hi, bn), bn, "");
    LLVMValueRef empty = LLVMBuildICmp(b, LLVMIntSLT, j_hi, j_lo, "");
    *n_begin = LLVMBuildSelect(b, empty, aj_kb_i32(e->kb, 0), begin, "n_begin");
    *n_end = LLVMBuildSelect(b, empty, aj_kb_i32(e->kb, 0), end, "n_end");
}

/* The CTA's walk: the key tiles of the band's range, or the block mask's
 * list of the row block (score.h). */
static void key_walk(ffwd *e, aj_score_walk *walk)
{
    LLVMValueRef n_begin, n_end, i_first, i_last;
    key_tile_range(e, &n_begin, &n_end);
    if (e->part_first) {   /* layout = paged: within the split-KV part's tiles */
        n_begin = aj_kb_smax(e->kb, n_begin, e->part_first);
        n_end = aj_kb_smin(e->kb, n_end, e->part_last);
    }
    block_positions(e, &i_first, &i_last);
    aj_score_walk_keys(&e->sc, walk, i_first, i_last, e->p.bn, n_begin, n_end, e->seq_q,
                       e->seq_k);
}

/* Whether the copy of the tile at walk position `at` is issued:
 * positions past the walk's end are not, and where the mask has more
 * than its band (score.h), neither are tiles of class skip; their class
 * and tile go into *cls and *tile (i32 vars; NULL: none kept, the tile is
 * the position's).  The caller commits the group, empty or not. */
static void issue_kv_tile(ffwd *e, const aj_score_walk *w, LLVMValueRef at, LLVMValueRef cls,
                          LLVMValueRef tile)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    if (cls)
        aj_kb_set(kb, cls, aj_kb_i32(kb, AJ_TILE_SKIP));
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, at, w->end, ""));
    LLVMValueRef n = at;
    if (cls) {
        LLVMValueRef c;
        n = aj_score_walk_tile(&e->sc, w, at, &c);
        aj_kb_set(kb, cls, c);
        aj_kb_set(kb, tile, n);
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntNE, c, aj_kb_i32(kb, AJ_TILE_SKIP), ""));
    }
    load_kv_tile(e, n, at, w->begin);
    int arrives = e->tma || e->p.ws;   /* a position without a tile completes its phase */
    if (cls && arrives) {
        aj_kb_else(kb);
        tma_no_tile(e, at, w->begin);
    }
    if (cls)
        aj_kb_if_end(kb);
    if (arrives) {
        aj_kb_else(kb);
        tma_no_tile(e, at, w->begin);
    }
    aj_kb_if_end(kb);
}

/*
 * The row each lane hands to ldmatrix.x4 in a 16x16 block (matrix m = l / 8
 * gets rows from lanes 8m .. 8m + 7):
 *   Q (A, non-trans)  row (l & 7) + 8 ((l >> 3) & 1), column 8 (l >> 4):
 *                     matrices rows 0-7 | 8-15 x columns 0-7 | 8-15 = a[0..3]
 *   K (B, non-trans)  key (l & 7) + 8 (l >> 4), column 8 ((l >> 3) & 1):
 *                     b[0], b[1] of keys 0-7, then of keys 8-15 (a K row is
 *                     a column of K^T)
 *   V (B, trans)      key (l & 7) + 8 ((l >> 3) & 1), column 8 (l >> 4):
 *                     b[0], b[1] of columns 0-7, then of columns 8-15
 */
static void lane_addresses(ffwd *e)
{
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    LLVMValueRef l7 = LLVMBuildAnd(b, e->lane, aj_kb_i32(e->kb, 7), "");
    LLVMValueRef bit3 =
        LLVMBuildShl(b,
                     LLVMBuildAnd(b, LLVMBuildLShr(b, e->lane, aj_kb_i32(e->kb, 3), ""),
                                  aj_kb_i32(e->kb, 1), ""),
                     aj_kb_i32(e->kb, 3), "");
    LLVMValueRef bit4 = LLVMBuildShl(b, LLVMBuildLShr(b, e->lane, aj_kb_i32(e->kb, 4), ""),
                                     aj_kb_i32(e->kb, 3), "");
    e->q_lane = aj_kb_add(
        e->kb, aj_kb_i32(e->kb, p->smem_q),
        tile_offset(e, aj_kb_add(e->kb, e->wrow, aj_kb_add(e->kb, l7, bit3)), bit4, p->ldq));
    e->k_lane = tile_offset(e, aj_kb_add(e->kb, l7, bit4), bit3, p->ldk);
    if (p->pair_keys)   /* split s of a pair: keys s block_n / 2 .. ("Head dims past 256") */
        e->k_lane = aj_kb_add(e->kb, e->k_lane,
                              LLVMBuildMul(b, e->split, aj_kb_i32(e->kb, p->bn * p->ldk), ""));
    /* f8's V^T is read as a K tile is (see "FP8") */
    e->v_lane = p->f8 ? tile_offset(e, aj_kb_add(e->kb, l7, bit4), bit3, p->ldv)
                      : tile_offset(e, aj_kb_add(e->kb, l7, bit3),
                                    e->vcol ? aj_kb_add(e->kb, bit4, e->vcol) : bit4, p->ldv);
    /* wgmma: the warpgroup's 64 rows start 64 rows into each Q panel
     * (past Dv 256 both warpgroups' at row 0) */
    e->q_wg = p->dvs > 1
                  ? aj_kb_i32(e->kb, p->smem_q)
                  : aj_kb_add(e->kb, aj_kb_i32(e->kb, p->smem_q),
                              LLVMBuildMul(b, LLVMBuildLShr(b, e->tid, aj_kb_i32(e->kb, 7), ""),
                                           aj_kb_i32(e->kb, 64 * aj_wgmma_panel_span(p->d)),
                                           ""));
}

/* ---------------------------------------------------------------- wgmma */

/*
 * wgmma (schedule warpgroups = G, sm_90a and sim): the same kernel with
 * its two GEMMs on wgmma.mma_async.  Warpgroup w (warps 4w .. 4w + 3) owns
 * rows 64 w .. 64 w + 63; wgmma's accumulator layout is, warp by warp,
 * mma.sync's C fragment of n8 tiles (register 4 j + c = s[0][j][c]), so
 * the score mods, the mask, the online softmax and the epilogue are the
 * mma.sync template's, and P, repacked as above, is wgmma's A in
 * registers.
 *
 * Shared memory holds each tile in panels of E = span / 2 columns (E 64,
 * 32 or 16, the widest dividing the width rounded up to 16:
 * aj_wgmma_panel_span), panel after panel, each a run of span-byte rows
 * under the span-byte swizzle (aj_kb_swizzle), every tile 1024-byte
 * aligned; at an odd multiple of 8 the last 8 columns are zeros
 * (wgmma_zero_pads, or TMA's fill):
 *
 *   S = Q K^T   wgmma m64n{block_n}k16 per 16 columns of D, A = Q and B =
 *               K by descriptor, both K-major: a k-step's descriptor
 *               starts in its panel, 32 bytes per step into the row; SBO
 *               = 8 rows
 *   O += P V    wgmma m64n{Dv}k16 per 16 keys, A = P in registers, B = V
 *               N-major (imm-trans-b): V's rows are its k, so the step
 *               starts 16 rows on; LBO = a panel (block_n rows), SBO = 8
 *               rows
 *
 * Past Dv 256 (schedule warpgroups = 2 only, not warp specialised) the
 * two warpgroups split Dv on the same 64 rows: both compute S, warpgroup
 * 0 runs O[:, 0:256] += P V[:, 0:256] (N 256) and warpgroup 1 O[:, 256:Dv]
 * (N = Dv - 256, its own accumulator array), in the two arms of one
 * warpgroup-uniform branch; split 1's n8 tiles past its columns stay 0
 * and are not stored.
 *
 * Q's descriptors derive from one opaque base per tile (aj_kb_opaque): the
 * D / 16 of them, loop-invariant, were otherwise hoisted out of the walk
 * and held in registers (32 of them at D 256, 64 at D 512).
 *
 * Loads, over padded tensors with the launch's `tma` set: thread 0 sets
 * up one mbarrier for Q and one per ring slot, and issues each tile as
 * TMA boxes of one panel (params.h, AJ_PENC_TMA_*) with the tile's bytes
 * expected on its slot's mbarrier; every thread waits for the slot's
 * phase of the walk position (a position that loads nothing still
 * arrives, tma_no_tile).  Otherwise (varlen, whose boxes would read the
 * next sequence's rows; a view TMA cannot describe; tma = 0) the cp.async
 * pipeline writes the same swizzled chunks -- generic writes, so each
 * thread fences the async proxy (fence.proxy.async) before the barrier
 * that hands a tile to wgmma.  Each GEMM is fenced, committed and waited
 * for whole (the accumulators pass through variables around it, which
 * registers hold on sm_90a).
 */

/* A GEMM's end, its wgmmas committed: wait until at most `pending` later
 * groups are in flight, then its n8 tiles' accumulators (register 4 j +
 * c) into the variables vars[j][c]. */
static void land_gemm(ffwd *e, LLVMValueRef acc, int pending, int n8, LLVMValueRef (*vars)[4])
{
    aj_kb *kb = e->kb;
    aj_kb_wgmma_wait(kb, pending, &acc, 1);
    aj_kb_wgmma_take(kb, acc, n8, vars);
}

/* The keys of one P V k-step: 16, or FP8's 32 (k32 on the 8-bit tensor
 * cores). */
static int pv_step_keys(const ffwd_plan *p)
{
    return p->f8 ? 32 : 16;
}

/* S = Q K^T on wgmma, issued and committed: the warpgroup's 64 rows
 * against the key tile at shared byte offset `kbase`, into acc_s. */
static void qk_wgmma_issue(ffwd *e, LLVMValueRef kbase)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    aj_dtype t = p->f8 ? p->f8 : p->dtype;   /* f8: k32 steps over the same bytes */
    enum aj_intrinsic_id row = aj_kb_wgmma_row(p->bn, t, t, 0, 0);
    /* Q's base opaque: its D / 16 k-step descriptors, loop-invariant,
     * would otherwise be hoisted out of the walk and held in registers
     * across it (two each) */
    LLVMValueRef q0 = aj_kb_opaque(kb, aj_wgmma_kmajor_desc(kb, e->q_wg, p->bm, p->d, 0));
    LLVMValueRef k0 = aj_wgmma_kmajor_desc(kb, kbase, p->bn, p->d, 0);
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_FENCE, NULL);
    for (int kk = 0; kk < aj_wgmma_tile_width(p->d) / 16; kk++) {
        LLVMValueRef args[3] = {aj_wgmma_kmajor_step(kb, q0, p->bm, p->d, 16 * kk),
                                aj_wgmma_kmajor_step(kb, k0, p->bn, p->d, 16 * kk),
                                aj_kb_i32(kb, kk > 0)};
        aj_kb_wgmma(kb, row, e->acc_s, args);
    }
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_COMMIT_GROUP, NULL);
}

/* S lands in the score variables once at most `pending` later groups are
 * in flight. */
static void qk_wgmma_land(ffwd *e, int pending)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    land_gemm(e, e->acc_s, pending, p->bn / 8, e->s[0]);
    for (int j = 0; e->s_scale && j < p->bn / 8; j++)   /* FP8: Q's and K's descales */
        for (int c = 0; c < 4; c++)
            aj_kb_set(kb, e->s[0][j][c],
                      LLVMBuildFMul(e->b, aj_kb_get(kb, e->s[0][j][c]), e->s_scale, ""));
}

/* S = Q K^T on wgmma, whole. */
static void emit_qk_wgmma(ffwd *e, LLVMValueRef kbase)
{
    qk_wgmma_issue(e, kbase);
    qk_wgmma_land(e, 0);
}

/* O's columns col .. col + n - 1 += P V on wgmma, issued and committed:
 * P's A fragments given (a[kk][0..3] per k-step: 16 keys, f8 32); V's
 * tile (f8: V^T) at shared byte offset `vbase`; O's first n / 8 n8 tiles
 * from their variables into acc_o.  `col` starts a panel. */
static void pv_wgmma_cols(ffwd *e, LLVMValueRef acc, LLVMValueRef a[][4], LLVMValueRef vbase,
                          int col, int n)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    /* f8: P in e4m3 against K-major V^T, k32 a step (see "FP8") */
    enum aj_intrinsic_id row = p->f8 ? aj_kb_wgmma_row(n, AJ_DTYPE_F8E4M3, p->f8, 1, 0)
                                     : aj_kb_wgmma_row(n, p->dtype, p->dtype, 1, 1);
    aj_kb_wgmma_put(kb, acc, n / 8, e->o[0]);
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_FENCE, NULL);
    for (int kk = 0; kk < p->bn / pv_step_keys(p); kk++) {
        LLVMValueRef b_desc =
            p->f8 ? aj_wgmma_kmajor_desc(e->kb, vbase, p->dv, p->bn / 2, 16 * kk)
                  : aj_wgmma_nmajor_desc(kb, vbase, p->bn, p->dv, col, 16 * kk);
        LLVMValueRef args[6] = {a[kk][0], a[kk][1], a[kk][2], a[kk][3], b_desc,
                                aj_kb_i32(kb, 1)};
        aj_kb_wgmma(kb, row, acc, args);
    }
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_COMMIT_GROUP, NULL);
}

/* O += P V on wgmma, issued and committed (all of Dv). */
static void pv_wgmma_issue(ffwd *e, LLVMValueRef a[][4], LLVMValueRef vbase)
{
    pv_wgmma_cols(e, e->acc_o, a, vbase, 0, e->p.dv);
}

/* O += P V on wgmma, whole; past Dv 256 each warpgroup its split's
 * columns: 256, then the rest (see "Head dims past 256"). */
static void emit_pv_wgmma(ffwd *e, LLVMValueRef a[][4], LLVMValueRef vbase)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    if (p->dvs == 1) {
        pv_wgmma_issue(e, a, vbase);
        land_gemm(e, e->acc_o, 0, p->dv / 8, e->o[0]);
        return;
    }
    int first = 8 * p->vt;
    aj_kb_if_begin(kb, LLVMBuildICmp(e->b, LLVMIntEQ, e->split, aj_kb_i32(kb, 0), ""));
    pv_wgmma_cols(e, e->acc_o, a, vbase, 0, first);
    land_gemm(e, e->acc_o, 0, p->vt, e->o[0]);
    aj_kb_else(kb);
    pv_wgmma_cols(e, e->acc_o1, a, vbase, first, p->dv - first);
    land_gemm(e, e->acc_o1, 0, (p->dv - first) / 8, e->o[0]);
    aj_kb_if_end(kb);
}

/* ---------------------------------------------------------------- mma.sync */

/* S = Q K^T for the warp's m-tiles over the key tile whose K starts at
 * shared byte offset `kbase`, into the score variables. */
/* pair_keys (see "Head dims past 256"): this warp's half of the key
 * tile's scores, acc[mi][0 .. nt/2), to its pair's exchange, and after a
 * barrier the whole tile's back into acc[mi][0 .. nt), both warps
 * reading the same bits.  Lane l's four values of n8 tile j are one
 * 16-byte entry, the pair's lane l the same (row, key) places. */
static void trade_scores(ffwd *e, LLVMValueRef (*acc)[MAX_NT][4])
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    int nt = p->bn / 8, row_warps = p->warps / p->dvs;
    /* this lane's entry of its row group's exchange (n8 tile 0) and of its
     * half's first tile, from the thread index anew at each tile (held
     * across the walk they cost ptxas spills at the heaviest options) */
    LLVMValueRef tid = aj_kb_opaque(kb, e->tid);
    LLVMValueRef warp = LLVMBuildLShr(b, tid, aj_kb_i32(kb, 5), "");
    LLVMValueRef rg = LLVMBuildURem(b, warp, aj_kb_i32(kb, row_warps), "");
    LLVMValueRef split = LLVMBuildUDiv(b, warp, aj_kb_i32(kb, row_warps), "");
    LLVMValueRef entry = aj_kb_add(kb, LLVMBuildMul(b, rg, aj_kb_i32(kb, p->mt * nt * 32), ""),
                                   LLVMBuildAnd(b, tid, aj_kb_i32(kb, 31), ""));
    LLVMValueRef x_lane = aj_kb_add(kb, aj_kb_i32(kb, p->smem_x),
                                    LLVMBuildShl(b, entry, aj_kb_i32(kb, 4), ""));
    LLVMValueRef x_own =
        aj_kb_add(kb, x_lane, LLVMBuildMul(b, split, aj_kb_i32(kb, nt / 2 * 512), ""));
    LLVMTypeRef v4 = LLVMVectorType(kb->t_f32, 4);
    for (int mi = 0; mi < p->mt; mi++)
        for (int j = 0; j < nt / 2; j++) {
            LLVMValueRef v = LLVMGetUndef(v4);
            for (int c = 0; c < 4; c++)
                v = LLVMBuildInsertElement(b, v, acc[mi][j][c], aj_kb_i32(kb, c), "");
            aj_kb_store(kb, v, smem_at(e, x_own, 512 * (int64_t)(mi * nt + j)), 16);
        }
    aj_kb_barrier(kb);
    for (int mi = 0; mi < p->mt; mi++)
        for (int j = 0; j < nt; j++) {
            LLVMValueRef v =
                aj_kb_load(kb, v4, smem_at(e, x_lane, 512 * (int64_t)(mi * nt + j)), 16);
            for (int c = 0; c < 4; c++)
                acc[mi][j][c] = LLVMBuildExtractElement(b, v, aj_kb_i32(kb, c), "");
        }
}

static void emit_qk(ffwd *e, LLVMValueRef kbase)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    if (p->wg) {
        emit_qk_wgmma(e, kbase);
        return;
    }
    int nt = p->bn / 8;
    int own = p->pair_keys ? nt / 2 : nt;   /* the n8 tiles this warp computes */
    LLVMValueRef acc[MAX_MT][MAX_NT][4];
    for (int mi = 0; mi < p->mt; mi++)
        for (int j = 0; j < nt; j++)
            for (int c = 0; c < 4; c++)
                acc[mi][j][c] = aj_kb_f32(kb, 0);
    LLVMValueRef kt = aj_kb_add(kb, kbase, e->k_lane);
    for (int kk = 0; kk < aj_mma_k_width(p->d) / 16; kk++) {
        LLVMValueRef a[MAX_MT][4];
        for (int mi = 0; mi < p->mt; mi++)
            aj_kb_ldmatrix(kb, 4, 0, smem_at(e, e->q_lane, 2 * (16 * mi * p->ldq + 16 * kk)),
                           a[mi]);
        for (int j = 0; j < own; j += 2) {
            LLVMValueRef kf[4];
            aj_kb_ldmatrix(kb, 4, 0, smem_at(e, kt, 2 * (8 * j * p->ldk + 16 * kk)), kf);
            for (int mi = 0; mi < p->mt; mi++) {
                if (p->f8) {   /* the same fragments over byte pairs: k32 a step */
                    aj_kb_mma_m16n8k32(kb, p->f8, p->f8, a[mi], &kf[0], acc[mi][j], acc[mi][j]);
                    aj_kb_mma_m16n8k32(kb, p->f8, p->f8, a[mi], &kf[2], acc[mi][j + 1],
                                       acc[mi][j + 1]);
                    continue;
                }
                aj_kb_mma_m16n8k16(kb, p->dtype, a[mi], &kf[0], acc[mi][j], acc[mi][j]);
                aj_kb_mma_m16n8k16(kb, p->dtype, a[mi], &kf[2], acc[mi][j + 1],
                                   acc[mi][j + 1]);
            }
        }
    }
    if (p->pair_keys)
        trade_scores(e, acc);
    for (int mi = 0; mi < p->mt; mi++)
        for (int j = 0; j < nt; j++)
            for (int c = 0; c < 4; c++)
                aj_kb_set(kb, e->s[mi][j][c],
                          e->s_scale ? LLVMBuildFMul(e->b, acc[mi][j][c], e->s_scale, "")
                                     : acc[mi][j][c]);
}

/* Row (local to the CTA) of score element c of m-tile mi: g or g + 8. */
static LLVMValueRef elem_row(ffwd *e, int mi, int c)
{
    return aj_kb_add(e->kb, e->wrow,
                     aj_kb_add(e->kb, e->g, aj_kb_i32(e->kb, 16 * mi + (c >= 2 ? 8 : 0))));
}

/* Key (local to the tile) of score element c of n8 tile j: 8j + 2t + (c & 1). */
static LLVMValueRef elem_key(ffwd *e, int j, int c)
{
    return aj_kb_add(e->kb, LLVMBuildShl(e->b, e->t, aj_kb_i32(e->kb, 1), ""),
                     aj_kb_i32(e->kb, 8 * j + (c & 1)));
}

/* The position of a score element (aj_score_place). */
typedef struct elem_at {
    ffwd *e;
    LLVMValueRef n0;
    int mi, j, c;
} elem_at;

static void place_elem(void *user, LLVMValueRef *i, LLVMValueRef *j)
{
    elem_at *x = user;
    *j = aj_kb_add(x->e->kb, x->n0, elem_key(x->e, x->j, x->c));
    *i = row_pos(x->e, aj_kb_add(x->e->kb, x->e->m0, elem_row(x->e, x->mi, x->c)));
}

/* The scores in log2 units: the score pipeline's composition (score.h). */
static void emit_score_mods(ffwd *e, LLVMValueRef n0)
{
    aj_kb *kb = e->kb;
    for (int mi = 0; mi < e->p.mt; mi++)
        for (int j = 0; j < e->p.bn / 8; j++)
            for (int c = 0; c < 4; c++) {
                elem_at at = {e, n0, mi, j, c};
                aj_kb_set(kb, e->s[mi][j][c],
                          aj_score_compose_at(&e->sc, aj_kb_get(kb, e->s[mi][j][c]),
                                              AJ_SCORE_RAW, NULL, place_elem, &at));
            }
}

/* -inf for the elements a tile that is not full hides: keys past Sk, outside
 * the row's band or where the rest of the mask is false. */
static void emit_element_mask(ffwd *e, LLVMValueRef n0)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    for (int mi = 0; mi < e->p.mt; mi++)
        for (int half = 0; half < 2; half++) {
            LLVMValueRef i = row_pos(e, aj_kb_add(kb, e->m0, elem_row(e, mi, 2 * half)));
            /* in tile-local keys */
            LLVMValueRef hi = LLVMBuildSub(b, aj_score_row_hi(&e->sc, e->seq_k, i), n0, "");
            LLVMValueRef lo = e->sc.lo_off ? LLVMBuildSub(b, aj_score_row_lo(&e->sc, i), n0, "")
                                           : NULL;
            for (int j = 0; j < e->p.bn / 8; j++)
                for (int c = 2 * half; c < 2 * half + 2; c++) {
                    LLVMValueRef key = elem_key(e, j, c);
                    LLVMValueRef vis = LLVMBuildICmp(b, LLVMIntSLE, key, hi, "");
                    if (lo)
                        vis = LLVMBuildAnd(b, vis, LLVMBuildICmp(b, LLVMIntSGE, key, lo, ""), "");
                    if (aj_score_has_rest(e->prog))
                        vis = LLVMBuildAnd(
                            b, vis, aj_score_visible_rest(&e->sc, i, aj_kb_add(kb, n0, key)), "");
                    LLVMValueRef s = aj_kb_get(kb, e->s[mi][j][c]);
                    aj_kb_set(kb, e->s[mi][j][c], LLVMBuildSelect(b, vis, s,
                              aj_kb_f32(kb, -INFINITY), ""));
                }
        }
}

/* Two i16 as one i32, `lo` in the low half. */
static LLVMValueRef join16(ffwd *e, LLVMValueRef lo, LLVMValueRef hi)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef l32 = LLVMBuildZExt(b, lo, kb->t_i32, "");
    return LLVMBuildOr(b, l32, LLVMBuildShl(b, LLVMBuildZExt(b, hi, kb->t_i32, ""),
                                            aj_kb_i32(kb, 16), ""), "");
}

/* Two f32 values as a pair of the dtype in one i32 (first in the low half). */
static LLVMValueRef pack2(ffwd *e, aj_dtype dtype, LLVMValueRef lo, LLVMValueRef hi)
{
    return join16(e, aj_kb_from_f32(e->kb, lo, dtype), aj_kb_from_f32(e->kb, hi, dtype));
}

/* P's A fragment for keys 16 kk .. 16 kk + 15 from one m-tile's
 * probabilities pf[n8 tile][element] (see the diagram at the top): the
 * same registers for mma.sync and wgmma's A in registers. */
static void pack_p(ffwd *e, LLVMValueRef (*pf)[4], int kk, LLVMValueRef a[4])
{
    aj_dtype t = e->p.dtype;
    a[0] = pack2(e, t, pf[2 * kk][0], pf[2 * kk][1]);
    a[1] = pack2(e, t, pf[2 * kk][2], pf[2 * kk][3]);
    a[2] = pack2(e, t, pf[2 * kk + 1][0], pf[2 * kk + 1][1]);
    a[3] = pack2(e, t, pf[2 * kk + 1][2], pf[2 * kk + 1][3]);
}

/* FP8: P's k32 A fragment for keys 32 kk .. 32 kk + 31 (P 2^8 times
 * over: P_E4M3_LOG2) in e4m3, straight
 * from the lane's elements of n8 tiles 4 kk .. 4 kk + 3 (V^T's key order
 * matches: see "FP8"); the same registers for mma.sync and wgmma. */
static void pack_p_f8(ffwd *e, LLVMValueRef (*pf)[4], int kk, LLVMValueRef a[4])
{
    for (int r = 0; r < 4; r++) {
        int j = 4 * kk + 2 * (r >> 1), c = 2 * (r & 1);   /* rows g (r even), g + 8 */
        a[r] = join16(e, aj_kb_e4m3x2(e->kb, pf[j][c], pf[j][c + 1]),
                      aj_kb_e4m3x2(e->kb, pf[j + 1][c], pf[j + 1][c + 1]));
    }
}

/* P's A fragment for P V's k-step kk (pv_step_keys): pack_p's, or FP8's
 * pack_p_f8's -- the same registers for mma.sync and wgmma. */
static void pack_pv_a(ffwd *e, LLVMValueRef (*pf)[4], int kk, LLVMValueRef a[4])
{
    (e->p.f8 ? pack_p_f8 : pack_p)(e, pf, kk, a);
}

/* O += P V on mma.sync for the warp's m-tiles: 16-bit, A = P (pack_p) and
 * B = V by ldmatrix.trans, 16 keys a step; FP8, A = P in e4m3 (pack_p_f8)
 * and B from V^T, read as a K tile is (lane_addresses), 32 keys a step.
 * Two n8 tiles (columns of V) per ldmatrix, an odd last one alone (lanes
 * 0-15's addresses are those of its two 8x8 matrices). */
static void emit_pv_mma(ffwd *e, LLVMValueRef (*pf)[MAX_NT][4], LLVMValueRef vbase)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    const int f8 = p->f8 != 0;
    LLVMValueRef vt = aj_kb_add(kb, vbase, e->v_lane);
    LLVMValueRef acc[MAX_MT][MAX_VT][4];
    for (int mi = 0; mi < p->mt; mi++)
        for (int v = 0; v < p->vt; v++)
            for (int c = 0; c < 4; c++)
                acc[mi][v][c] = aj_kb_get(kb, e->o[mi][v][c]);
    for (int kk = 0; kk < p->bn / pv_step_keys(p); kk++) {
        LLVMValueRef a[MAX_MT][4];
        for (int mi = 0; mi < p->mt; mi++)
            pack_pv_a(e, pf[mi], kk, a[mi]);
        for (int v = 0; v < p->vt; v += 2) {
            int pair = v + 1 < p->vt;
            int64_t at = f8 ? 2 * (8 * v * p->ldv + 16 * kk) : 2 * (16 * kk * p->ldv + 8 * v);
            LLVMValueRef vf[4];
            aj_kb_ldmatrix(kb, pair ? 4 : 2, !f8, smem_at(e, vt, at), vf);
            for (int mi = 0; mi < p->mt; mi++)
                for (int x = 0; x <= pair; x++) {
                    LLVMValueRef *c = acc[mi][v + x];
                    if (f8)
                        aj_kb_mma_m16n8k32(kb, AJ_DTYPE_F8E4M3, p->f8, a[mi], &vf[2 * x], c, c);
                    else
                        aj_kb_mma_m16n8k16(kb, p->dtype, a[mi], &vf[2 * x], c, c);
                }
        }
    }
    for (int mi = 0; mi < p->mt; mi++)
        for (int v = 0; v < p->vt; v++)
            for (int c = 0; c < 4; c++)
                aj_kb_set(kb, e->o[mi][v][c], acc[mi][v][c]);
}

/* O's row half `half` (elements 2 half, 2 half + 1) of m-tile mi times
 * alpha. */
static void scale_o(ffwd *e, int mi, int half, LLVMValueRef alpha)
{
    for (int v = 0; v < e->p.vt; v++)
        for (int c = 2 * half; c < 2 * half + 2; c++)
            aj_kb_set(e->kb, e->o[mi][v][c],
                      LLVMBuildFMul(e->b, aj_kb_get(e->kb, e->o[mi][v][c]), alpha, ""));
}

/* What emit_softmax_pv leaves for later (wgmma's one m-tile a warp). */
typedef struct pv_later {
    LLVMValueRef alpha[2];              /* f32 per half of the m-tile */
    LLVMValueRef a[MAX_NT / 2][4];      /* P's A fragments, per k-step */
} pv_later;

/*
 * The online softmax of the tile and O += P V.  Per row: m_new =
 * max(m, tile max), alpha = 2^(m - m_new), P = 2^(s - m_new), l = l alpha
 * + rowsum(P) (this lane's share; the quad sums it in the epilogue),
 * O = O alpha + P V.  With dropout the statistics take P undropped and
 * P V takes P keep / (1 - p).  With `later` (wgmma, warp specialised: see
 * "Overlap"), O is left as it is and P V not issued: each half's alpha and
 * P's A fragments go there instead.
 */
static void emit_softmax_pv(ffwd *e, LLVMValueRef n0, LLVMValueRef vbase, pv_later *later)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    assert(!later || p->mt == 1);
    const aj_op *op = e->op;
    int nt = p->bn / 8;
    LLVMValueRef pf[MAX_MT][MAX_NT][4];
    for (int mi = 0; mi < p->mt; mi++)
        for (int half = 0; half < 2; half++) {
            LLVMValueRef mx = aj_kb_f32(kb, -INFINITY);
            for (int j = 0; j < nt; j++)
                for (int c = 2 * half; c < 2 * half + 2; c++)
                    mx = aj_kb_fmax(kb, mx, aj_kb_get(kb, e->s[mi][j][c]));
            mx = aj_kb_group_max(kb, mx, 4);
            LLVMValueRef m_old = aj_kb_get(kb, e->m[mi][half]);
            LLVMValueRef m_new = aj_kb_fmax(kb, m_old, mx);
            /* a row that has seen only masked keys keeps m = -inf;
             * subtracting 0 instead makes every P and alpha exactly 0 */
            LLVMValueRef none = LLVMBuildFCmp(b, LLVMRealOEQ, m_new, aj_kb_f32(kb, -INFINITY), "");
            LLVMValueRef m_use = LLVMBuildSelect(b, none, aj_kb_f32(kb, 0), m_new, "");
            LLVMValueRef alpha = aj_kb_exp2(kb, LLVMBuildFSub(b, m_old, m_use, ""));
            /* FP8: P 2^8 times over (P_E4M3_LOG2), the row sum's share
             * brought back below */
            LLVMValueRef m_exp =
                p->f8 ? LLVMBuildFSub(b, m_use, aj_kb_f32(kb, (float)P_E4M3_LOG2), "") : m_use;
            LLVMValueRef sum = aj_kb_f32(kb, 0);
            LLVMValueRef i = NULL;
            if (op->dropout > 0)
                i = aj_kb_add(kb, e->m0, elem_row(e, mi, 2 * half));
            for (int j = 0; j < nt; j++)
                for (int c = 2 * half; c < 2 * half + 2; c++) {
                    LLVMValueRef pr = aj_kb_exp2(kb, LLVMBuildFSub(b, aj_kb_get(kb, e->s[mi][j][c]),
                                                                   m_exp, ""));
                    sum = LLVMBuildFAdd(b, sum, pr, "");
                    if (op->dropout > 0) {
                        LLVMValueRef keep = aj_attn_dropout_keep(
                            kb, &e->drop, op->dropout, i, aj_kb_add(kb, n0, elem_key(e, j, c)));
                        pr = aj_score_dropped(kb, op->dropout, keep, pr);
                    }
                    pf[mi][j][c] = pr;
                }
            if (p->f8)
                sum = LLVMBuildFMul(b, sum, aj_kb_f32(kb, ldexpf(1.0f, -P_E4M3_LOG2)), "");
            aj_kb_set(kb, e->l[mi][half], aj_kb_fma(kb, aj_kb_get(kb, e->l[mi][half]), alpha, sum));
            aj_kb_set(kb, e->m[mi][half], m_new);
            if (later)
                later->alpha[half] = alpha;
            else
                scale_o(e, mi, half, alpha);
        }

    /* O += P V: A = P (see the diagram at the top), B = V */
    if (later) {
        for (int kk = 0; kk < p->bn / pv_step_keys(p); kk++)
            pack_pv_a(e, pf[0], kk, later->a[kk]);
        return;
    }
    if (p->wg) {
        LLVMValueRef a[MAX_NT / 2][4];
        for (int kk = 0; kk < p->bn / pv_step_keys(p); kk++)
            pack_pv_a(e, pf[0], kk, a[kk]);
        emit_pv_wgmma(e, a, vbase);
        return;
    }
    emit_pv_mma(e, pf, vbase);
}

/* The output element pair at element offset `at` of O: vals, or with
 * accumulate (w_prior given) vals plus the prior o_acc pair times w_prior
 * (0 where w_prior is: the prior never multiplied). */
static void store_o_pair(ffwd *e, LLVMValueRef at, LLVMValueRef vals[2], LLVMValueRef w_prior,
                         int partial)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const aj_param_source out = out_tensor(e->op);
    if (partial) {   /* layout = paged: the f32 partial of the split-KV workspace */
        LLVMTypeRef pair = LLVMVectorType(kb->t_f32, 2);
        LLVMValueRef vec = LLVMGetUndef(pair);
        for (int x = 0; x < 2; x++)
            vec = LLVMBuildInsertElement(b, vec, vals[x], aj_kb_i32(kb, x), "");
        aj_kb_store(kb, vec, aj_kb_gptr_offset(kb, aj_param_data(kb, AJ_PSRC_workspace),
                                               LLVMBuildMul(b, at, aj_kb_i64(kb, 4), "")), 8);
        return;
    }
    if (!w_prior) {
        LLVMValueRef ptr = aj_kb_gptr_offset(kb, aj_param_data(kb, out),
                                             LLVMBuildMul(b, at, aj_kb_i64(kb, 2), ""));
        aj_kb_store(kb, pack2(e, e->p.dtype, vals[0], vals[1]), ptr, 4);
        return;
    }
    LLVMTypeRef pair = LLVMVectorType(kb->t_f32, 2);
    LLVMValueRef ptr = aj_kb_gptr_offset(kb, aj_param_data(kb, out),
                                         LLVMBuildMul(b, at, aj_kb_i64(kb, 4), ""));
    LLVMValueRef prior = aj_kb_load(kb, pair, ptr, 8);
    LLVMValueRef zero_w = LLVMBuildFCmp(b, LLVMRealOEQ, w_prior, aj_kb_f32(kb, 0), "");
    LLVMValueRef vec = LLVMGetUndef(pair);
    for (int x = 0; x < 2; x++) {
        LLVMValueRef op = LLVMBuildFMul(
            b, LLVMBuildExtractElement(b, prior, aj_kb_i32(kb, x), ""), w_prior, "");
        op = LLVMBuildSelect(b, zero_w, aj_kb_f32(kb, 0), op, "");
        vec = LLVMBuildInsertElement(b, vec, LLVMBuildFAdd(b, vals[x], op, ""),
                                     aj_kb_i32(kb, x), "");
    }
    aj_kb_store(kb, vec, ptr, 8);
}

/*
 * accumulate: the merge of this call's row (O_new, L_new, log2) into the
 * prior (O_p, L_p) of o_acc and lse, as the efficient forward does:
 * L = log2(2^L_p + 2^L_new), weights 2^(L_p - L) and 2^(L_new - L); both
 * -inf gives O = 0 and L = -inf, and a side at -inf weighs exactly 0.  The
 * prior LSE comes from lane t = 0 of the quad by a quad sum, so that every
 * lane's read precedes lane 0's store; the weights are
 * aj_attn_merge_weights'.
 */
static void emit_merge_weights(ffwd *e, LLVMValueRef lse_prior, LLVMValueRef l2_new,
                               LLVMValueRef *w_prior, LLVMValueRef *w_new, LLVMValueRef *lse_out)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    LLVMValueRef t0 = LLVMBuildICmp(b, LLVMIntEQ, e->t, aj_kb_i32(kb, 0), "");
    lse_prior = aj_kb_group_sum(kb, LLVMBuildSelect(b, t0, lse_prior, aj_kb_f32(kb, 0), ""), 4);
    aj_attn_merge_weights(kb, lse_prior, l2_new, w_prior, w_new, lse_out);
}

/* The LSE's address of row `ic` (i32, within the sequence). */
static LLVMValueRef lse_at(ffwd *e, LLVMValueRef lse_base, LLVMValueRef ic)
{
    aj_kb *kb = e->kb;
    return aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(lse)),
                             LLVMBuildMul(e->b, aj_kb_add(kb, lse_base, aj_kb_sext64(kb, ic)),
                                          aj_kb_i64(kb, 4), ""));
}

/* Where the epilogue stores: O's slice (i64 element offset) and row
 * stride in the op's output, the LSE's slice; layout = paged (see
 * "Paged"), the stacked heads' strides (o_head, lse_head: i64, else
 * NULL) and, for the part of a split-KV launch, f32 partials in the
 * workspace (`partial`: no sink folded, the merge stage's work). */
typedef struct ffwd_out {
    LLVMValueRef o_base, o_stride, lse_base;
    LLVMValueRef o_head, lse_head;
    int partial;
} ffwd_out;

/* Row ic's (i32) O row (i64 element offset) and LSE address. */
static void row_dest(ffwd *e, const ffwd_out *out, LLVMValueRef ic, LLVMValueRef *orow,
                     LLVMValueRef *lse_ptr)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    if (!out->o_head) {
        *lse_ptr = lse_at(e, out->lse_base, ic);
        *orow = aj_kb_add(kb, out->o_base,
                          LLVMBuildMul(b, aj_kb_sext64(kb, ic), out->o_stride, ""));
        return;
    }
    LLVMValueRef lse =
        aj_kb_add(kb, out->lse_base, stacked_row(e, e->per, out->lse_head, ic, NULL));
    *lse_ptr = aj_kb_gptr_offset(kb, aj_param_data(kb, out->partial ? AJ_PSRC_workspace
                                                                    : AJ_PSRC_lse),
                                 LLVMBuildMul(b, lse, aj_kb_i64(kb, 4), ""));
    *orow = aj_kb_add(kb, out->o_base, stacked_row(e, e->per, out->o_head, ic, out->o_stride));
}

/* O = acc / l (0 for rows that saw no key), LSE = (m + log2 l) ln 2, merged
 * into the prior with accumulate; each lane stores its column pairs, lane
 * t = 0 of the quad (of Dv split 0) the LSE.  With Dv split, every warp of
 * a row reads the prior LSE before a barrier and split 0 stores the new
 * one after it. */
static void emit_epilogue(ffwd *e, const ffwd_out *out)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    int accumulate = e->op->accumulate;
    LLVMValueRef rows = e->rows ? e->rows : e->seq_q;
    LLVMValueRef last_row = LLVMBuildSub(b, rows, aj_kb_i32(kb, 1), "");
    LLVMValueRef col_t = aj_kb_sext64(kb, LLVMBuildShl(b, e->t, aj_kb_i32(kb, 1), ""));
    if (e->vcol)
        col_t = aj_kb_add(kb, col_t, aj_kb_sext64(kb, e->vcol));
    LLVMValueRef lse_prior[MAX_MT][2] = {{NULL}};
    if (accumulate && e->split) {
        for (int mi = 0; mi < p->mt; mi++)
            for (int half = 0; half < 2; half++)
                lse_prior[mi][half] = aj_kb_load(
                    kb, kb->t_f32,
                    lse_at(e, out->lse_base,
                           aj_kb_smin(kb, aj_kb_add(kb, e->m0, elem_row(e, mi, 2 * half)),
                                      last_row)),
                    4);
        aj_kb_barrier(kb);
    }
    /* n8 tiles from `guarded` on may lie past Dv, never stored: on
     * mma.sync the last split's last one at an odd dv / 8 (computed on V's
     * zero pad columns); on wgmma split 1's past its dv - 256 columns */
    int guarded = p->dvs * p->vt == p->dv / 8 ? p->vt
                  : p->wg                     ? (p->dv - 8 * p->vt) / 8
                                              : p->vt - 1;
    LLVMValueRef lse_owner =
        e->split ? LLVMBuildICmp(b, LLVMIntEQ, e->split, aj_kb_i32(kb, 0), "") : NULL;
    for (int mi = 0; mi < p->mt; mi++)
        for (int half = 0; half < 2; half++) {
            LLVMValueRef lsum = aj_kb_group_sum(kb, aj_kb_get(kb, e->l[mi][half]), 4);
            LLVMValueRef i = aj_kb_add(kb, e->m0, elem_row(e, mi, 2 * half));
            /* lsum is 0 only for a row that saw no key; NaN counts as seen */
            LLVMValueRef seen = LLVMBuildFCmp(b, LLVMRealUNE, lsum, aj_kb_f32(kb, 0), "");
            LLVMValueRef inv = LLVMBuildSelect(b, seen,
                                               LLVMBuildFDiv(b, aj_kb_f32(kb, 1), lsum, ""),
                                               aj_kb_f32(kb, 0), "");
            LLVMValueRef l2 = LLVMBuildFAdd(b, aj_kb_get(kb, e->m[mi][half]),
                                            aj_kb_log2(kb, lsum), "");
            l2 = LLVMBuildSelect(b, seen, l2, aj_kb_f32(kb, -INFINITY), "");
            LLVMValueRef lse = LLVMBuildFMul(b, l2, aj_kb_f32(kb, AJ_LN2), "");
            if (aj_score_has_sinks(e->prog) && !out->partial) {
                /* the programs' head (head_offset's included; stacked heads:
                 * the row's own, the first's plus its place) */
                LLVMValueRef sink_h = e->sc.h;
                if (e->per)
                    sink_h = aj_kb_add(kb, sink_h, aj_kb_sext64(kb, LLVMBuildUDiv(
                                                       b, aj_kb_smin(kb, i, last_row), e->per,
                                                       "")));
                aj_score_fold_sink(kb, e->prog, sink_h,
                                   accumulate ? aj_param(kb, AJ_PID(kv_offset)) : NULL, &l2, &inv,
                                   &lse);
            }
            if (e->o_scale)   /* FP8: V's descale, and P's 2^8 (P_E4M3_LOG2) */
                inv = LLVMBuildFMul(b, inv, e->o_scale, "");
            /* rows past Sq read the last row: in bounds, never stored */
            LLVMValueRef ic = aj_kb_smin(kb, i, last_row);
            LLVMValueRef lse_ptr, orow;
            row_dest(e, out, ic, &orow, &lse_ptr);
            LLVMValueRef w_prior = NULL, scale_new = inv;
            if (accumulate) {
                LLVMValueRef w_new;
                emit_merge_weights(e,
                                   lse_prior[mi][half] ? lse_prior[mi][half]
                                                   : aj_kb_load(kb, kb->t_f32, lse_ptr, 4),
                                   l2, &w_prior, &w_new, &lse);
                scale_new = LLVMBuildFMul(b, w_new, inv, "");
            }
            aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, i, rows, ""));
            for (int v = 0; v < p->vt; v++) {
                if (v >= guarded)
                    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT,
                                                     aj_kb_add(kb, e->vcol, aj_kb_i32(kb, 8 * v)),
                                                     aj_kb_i32(kb, p->dv), ""));
                LLVMValueRef at = aj_kb_add(kb, orow, aj_kb_add(kb, col_t, aj_kb_i64(kb, 8 * v)));
                LLVMValueRef vals[2];
                for (int x = 0; x < 2; x++)
                    vals[x] = LLVMBuildFMul(b, aj_kb_get(kb, e->o[mi][v][2 * half + x]),
                                            scale_new, "");
                store_o_pair(e, at, vals, accumulate ? w_prior : NULL, out->partial);
                if (v >= guarded)
                    aj_kb_if_end(kb);
            }
            LLVMValueRef t0 = LLVMBuildICmp(b, LLVMIntEQ, e->t, aj_kb_i32(kb, 0), "");
            aj_kb_if_begin(kb, lse_owner ? LLVMBuildAnd(b, t0, lse_owner, "") : t0);
            aj_kb_store(kb, lse, lse_ptr, 4);
            aj_kb_if_end(kb);
            aj_kb_if_end(kb);
        }
}

/* Whether the kernel has TMA code: wgmma over padded tensors of 16 bits
 * (FP8 loads by cp.async: see "FP8"). */
static int uses_tma(const ffwd *e)
{
    return e->p.wg && e->op->layout == AJ_LAYOUT_PADDED && !e->p.f8;
}

/* Shared memory for Q and the K/V ring, and the thread's accumulators:
 * S, O, and each row's running max m and sum l. */
static void alloc_state(ffwd *e)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    int align = p->wg ? 1024 : 16;   /* wgmma: 8 rows of a 128-byte swizzle */
    e->p.smem_q = aj_kb_smem_reserve_aligned(kb, 2 * p->bm * p->ldq, align);
    e->p.smem_k = aj_kb_smem_reserve_aligned(kb, 2 * (p->kv8 ? 1 : p->stages) * p->bn * p->ldk,
                                             align);
    if (p->kv8)
        e->p.smem_stage = aj_kb_smem_reserve_aligned(kb, p->stages * p->bn * p->d, 16);
    if (p->pair_keys)
        e->p.smem_x = aj_kb_smem_reserve_aligned(kb, p->x_bytes, 16);
    if (!p->shared)
        e->p.smem_v = aj_kb_smem_reserve_aligned(kb, p->stages * p->v_slot, align);
    if (p->paged)
        e->p.smem_rows = aj_kb_smem_reserve(kb, p->stages * aj_tile_paged_rows_bytes(p->bn));
    if (uses_tma(e) || p->ws)   /* Q's and the slots' mbarriers (warp specialised: two a slot) */
        e->smem_bar = aj_kb_smem_reserve_aligned(kb, 8 * (1 + p->stages * (p->ws ? 2 : 1)), 16);
    if (p->wg) {
        e->acc_s = aj_kb_var(kb, LLVMArrayType2(kb->t_f32, (uint64_t)p->bn / 2), NULL, "acc_s");
        e->acc_o = aj_kb_var(kb, LLVMArrayType2(kb->t_f32, (uint64_t)p->vt * 4), NULL, "acc_o");
        if (p->dvs > 1)
            e->acc_o1 = aj_kb_var(kb, LLVMArrayType2(kb->t_f32, (uint64_t)(p->dv / 2 - 4 * p->vt)),
                                  NULL, "acc_o1");
    }
    for (int mi = 0; mi < p->mt; mi++) {
        for (int j = 0; j < p->bn / 8; j++)
            for (int c = 0; c < 4; c++)
                e->s[mi][j][c] = aj_kb_var(kb, kb->t_f32, NULL, "s");
        for (int v = 0; v < p->vt; v++)
            for (int c = 0; c < 4; c++)
                e->o[mi][v][c] = aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, 0), "o");
        for (int half = 0; half < 2; half++) {
            e->m[mi][half] = aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, -INFINITY), "m");
            e->l[mi][half] = aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, 0), "l");
        }
    }
}

/* The thread's ids: its lane, the mma fragment's group g and thread t,
 * and its warp's first row. */
static void thread_coords(ffwd *e)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    e->tid = aj_kb_thread_id(kb);
    e->lane = LLVMBuildAnd(b, e->tid, aj_kb_i32(kb, 31), "lane");
    e->g = LLVMBuildLShr(b, e->lane, aj_kb_i32(kb, 2), "g");
    e->t = LLVMBuildAnd(b, e->lane, aj_kb_i32(kb, 3), "t");
    LLVMValueRef warp = LLVMBuildLShr(b, e->tid, aj_kb_i32(kb, 5), "");
    if (p->dvs > 1) {   /* warp = split * row_warps + row group */
        LLVMValueRef row_warps = aj_kb_i32(kb, p->warps / p->dvs);
        e->split = LLVMBuildUDiv(b, warp, row_warps, "split");
        e->vcol = LLVMBuildMul(b, e->split, aj_kb_i32(kb, 8 * p->vt), "vcol");
        warp = LLVMBuildURem(b, warp, row_warps, "");
    }
    e->wrow = LLVMBuildMul(b, warp, aj_kb_i32(kb, 16 * p->mt), "wrow");
    e->ld_tid = e->tid;
    e->ld_threads = p->threads;
    if (p->ws) {   /* the producer warpgroup, after the consumers, loads */
        e->wgi = LLVMBuildLShr(b, e->tid, aj_kb_i32(kb, 7), "wg");
        e->ld_tid = LLVMBuildSub(b, e->tid, aj_kb_i32(kb, WARPGROUP_THREADS * p->wg), "ld_tid");
        e->ld_threads = WARPGROUP_THREADS;
    }
}

/* wgmma, loading by cp.async, where D is an odd multiple of 8: the 8
 * columns past D of every Q row and K row of each slot, which the last
 * k-step of Q K^T reads, hold zeros (the loads never write them; TMA's
 * boxes zero-fill them itself).  Generic stores, fenced with the copies. */
static void wgmma_zero_pads(ffwd *e)
{
    const ffwd_plan *p = &e->p;
    aj_kb *kb = e->kb;
    if (p->d % 16 == 0)
        return;
    LLVMValueRef zero = LLVMConstNull(LLVMVectorType(kb->t_i32, 4));
    const struct { int32_t base; int rows, slots, slot_bytes; } tiles[2] = {
        {p->smem_q, p->bm, 1, 0}, {p->smem_k, p->bn, p->stages, 2 * p->bn * p->ldk}};
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < tiles[t].slots; s++) {
            LLVMValueRef base = aj_kb_i32(kb, tiles[t].base + s * tiles[t].slot_bytes);
            LLVMValueRef r = aj_kb_for_begin(kb, e->ld_tid, aj_kb_i32(kb, tiles[t].rows),
                                             aj_kb_i32(kb, e->ld_threads), "pad");
            LLVMValueRef at = tile_chunk(e, r, aj_kb_i32(kb, p->d), tiles[t].rows, p->d, 0);
            aj_kb_store(kb, zero, smem_at(e, aj_kb_add(kb, base, at), 0), 16);
            aj_kb_for_end(kb);
        }
}

/* The prologue: Q's and the K slots' pad columns (before the barrier of
 * the first tile), Q with the first tile's group, then the key tiles up
 * to stages - 1, each its own commit group. */
static void prologue(ffwd *e, aj_score_walk *walk, LLVMValueRef q_src, int gated,
                     LLVMValueRef *ahead, LLVMValueRef *ahead_tile)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    if (!p->wg) {   /* wgmma's pad columns: wgmma_zero_pads, for the cp.async loads */
        aj_mma_tile_zero_pad(kb, aj_kb_i32(kb, p->smem_q), p->bm, p->d, e->tid, p->threads);
        aj_mma_tile_zero_pad(kb, aj_kb_i32(kb, p->smem_k), (p->kv8 ? 1 : p->stages) * p->bn, p->d,
                             e->tid, p->threads);
        /* Dv split at an odd dv / 8: the last split's last n8 tile reads
         * V's pad columns (see "Head dims past 256"; kv_shared: K's
         * columns past Dv, finite, for output columns never stored) */
        if (p->dvs * p->vt > p->dv / 8 && !p->shared)
            aj_mma_tile_zero_pad(kb, aj_kb_i32(kb, p->smem_v), p->stages * p->bn, p->dv, e->tid,
                                 p->threads);
    }
    if (e->tma) {   /* thread 0 sets up the mbarriers and loads Q by TMA */
        LLVMBuilderRef b = e->b;
        LLVMValueRef t0 = LLVMBuildICmp(b, LLVMIntEQ, e->tid, aj_kb_i32(kb, 0), "");
        aj_kb_if_begin(kb, tma_on(e));
        aj_kb_if_begin(kb, t0);
        for (int s = 0; s <= p->stages; s++) {
            LLVMValueRef init[2] = {smem_at(e, aj_kb_i32(kb, e->smem_bar), 8 * s),
                                    aj_kb_i32(kb, 1)};
            aj_kb_intrinsic(kb, AJ_INTR_MBARRIER_INIT, init);
        }
        aj_kb_intrinsic(kb, AJ_INTR_FENCE_PROXY_ASYNC, NULL);
        aj_kb_if_end(kb);
        aj_kb_barrier(kb);
        aj_kb_if_begin(kb, t0);
        q_by_tma(e);
        aj_kb_if_end(kb);
        aj_kb_else(kb);
    }
    if (p->wg)
        wgmma_zero_pads(e);
    q_by_copies(e, q_src);
    if (e->tma)
        aj_kb_if_end(kb);
    for (int s = 0; s < p->stages - 1; s++) {
        issue_kv_tile(e, walk, aj_kb_add(kb, walk->begin, aj_kb_i32(kb, s)),
                      gated ? ahead[s] : NULL, gated ? ahead_tile[s] : NULL);
        aj_kb_cp_async_commit(kb);
    }
}

/* The scores of key tile n0 / block_n, of class cls: the score mods, then
 * the mask where the tile is not full. */
static void score_tile(ffwd *e, LLVMValueRef n0, LLVMValueRef cls)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    emit_score_mods(e, n0);
    LLVMValueRef full = LLVMBuildAnd(
        b, LLVMBuildICmp(b, LLVMIntEQ, cls, aj_kb_i32(kb, AJ_TILE_FULL), ""),
        LLVMBuildICmp(b, LLVMIntSLE, aj_kb_add(kb, n0, aj_kb_i32(kb, e->p.bn)), e->seq_k, ""),
        "full");
    aj_kb_if_begin(kb, LLVMBuildNot(b, full, ""));
    emit_element_mask(e, n0);
    aj_kb_if_end(kb);
}

/* Warp specialised with two consumer warpgroups: `id` (bar.sync or
 * bar.arrive) on the turn barrier of the thread's warpgroup (other = 0) or
 * of the other one (1), the two warpgroups' threads counted; the id a
 * constant in each branch, so that ptxas sees which barriers are used. */
static void turn_bar(ffwd *e, enum aj_intrinsic_id id, int other)
{
    aj_kb *kb = e->kb;
    aj_kb_if_begin(kb, LLVMBuildICmp(e->b, LLVMIntEQ, e->wgi, aj_kb_i32(kb, 0), ""));
    for (int w = 0; w < 2; w++) {
        LLVMValueRef args[2] = {aj_kb_i32(kb, TURN_BAR + (w ^ other)),
                                aj_kb_i32(kb, 2 * WARPGROUP_THREADS)};
        aj_kb_intrinsic(kb, id, args);
        if (w == 0)
            aj_kb_else(kb);
    }
    aj_kb_if_end(kb);
}

/* Key tile n of class cls, its K and V at shared byte offsets kbase and
 * vbase: S = Q K^T, the score mods, the mask where the tile is not full,
 * the online softmax and O += P V.  Warp specialised (without overlap:
 * stages = 1) with two consumer warpgroups, each takes its turn at Q K^T:
 * it waits for its turn's named barrier before the GEMM and, once it has
 * S, arrives on the other's, so one warpgroup's softmax overlaps the
 * other's GEMM (compute_tile_overlapped grants the turn once both of its
 * GEMMs are issued). */
static void compute_tile(ffwd *e, LLVMValueRef n, LLVMValueRef cls, LLVMValueRef kbase,
                         LLVMValueRef vbase)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    int turns = p->ws && p->wg == 2;
    LLVMValueRef n0 = LLVMBuildMul(b, n, aj_kb_i32(kb, p->bn), "n0");
    if (turns)
        turn_bar(e, AJ_INTR_NAMED_BAR_SYNC, 0);
    emit_qk(e, kbase);
    if (turns)
        turn_bar(e, AJ_INTR_NAMED_BAR_ARRIVE, 1);
    score_tile(e, n0, cls);
    emit_softmax_pv(e, n0, vbase, NULL);
}

/* An f8 cache's tile (see "Paged"): the landed bytes of slot `slot`'s
 * stage into the K tile as the queries' 16-bit type, 16 a thread a step --
 * an f16's bits by aj_kb_f8_to_f16_bits (e4m3 at 2^-8 its value, which
 * the descales take back: paged_descales), a bf16 the top half of that
 * f16's f32 (at most 4 significant bits: exact). */
static void widen_kv8(ffwd *e, LLVMValueRef slot)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    int per_row = p->d / 16;
    LLVMValueRef stage = aj_kb_add(kb, aj_kb_i32(kb, p->smem_stage),
                                   LLVMBuildMul(b, slot, aj_kb_i32(kb, p->bn * p->d), ""));
    LLVMValueRef c = aj_kb_for_begin(kb, e->tid, aj_kb_i32(kb, p->bn * per_row),
                                     aj_kb_i32(kb, p->threads), "widen");
    LLVMValueRef r = LLVMBuildUDiv(b, c, aj_kb_i32(kb, per_row), "");
    LLVMValueRef col = LLVMBuildShl(b, LLVMBuildURem(b, c, aj_kb_i32(kb, per_row), ""),
                                    aj_kb_i32(kb, 4), "");
    LLVMValueRef src = aj_kb_add(kb, stage, aj_kb_add(kb, LLVMBuildMul(b, r, aj_kb_i32(kb, p->d),
                                                                        ""), col));
    LLVMValueRef h = aj_kb_f8_to_f16_bits(
        kb, aj_kb_load(kb, LLVMVectorType(kb->t_i8, 16), smem_at(e, src, 0), 16), p->kv8);
    if (p->dtype == AJ_DTYPE_BF16) {
        LLVMValueRef sixteen[16];
        for (int i = 0; i < 16; i++)
            sixteen[i] = aj_kb_i32(kb, 16);
        LLVMValueRef f = LLVMBuildFPExt(
            b, LLVMBuildBitCast(b, h, LLVMVectorType(LLVMHalfTypeInContext(kb->llctx), 16), ""),
            LLVMVectorType(kb->t_f32, 16), "");
        LLVMValueRef top = LLVMBuildLShr(b, LLVMBuildBitCast(b, f, LLVMVectorType(kb->t_i32, 16),
                                                             ""),
                                         LLVMConstVector(sixteen, 16), "");
        h = LLVMBuildTrunc(b, top, LLVMVectorType(kb->t_i16, 16), "");
    }
    /* two 16-byte stores: the K tile's row r, columns col .. col + 15 */
    LLVMValueRef dst = aj_kb_add(kb, aj_kb_i32(kb, p->smem_k), tile_offset(e, r, col, p->ldk));
    for (int half = 0; half < 2; half++) {
        LLVMValueRef idx[8];
        for (int i = 0; i < 8; i++)
            idx[i] = aj_kb_i32(kb, 8 * half + i);
        LLVMValueRef part = LLVMBuildShuffleVector(b, h, LLVMGetUndef(LLVMTypeOf(h)),
                                                   LLVMConstVector(idx, 8), "");
        aj_kb_store(kb, part, smem_at(e, dst, 16 * half), 16);
    }
    aj_kb_for_end(kb);
}

/* The mainloop over the walk's key tiles: refill, wait, and compute_tile. */
static void mainloop(ffwd *e, aj_score_walk *walk, int gated, LLVMValueRef *ahead,
                     LLVMValueRef *ahead_tile)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    LLVMValueRef at = aj_kb_for_begin(kb, walk->begin, walk->end, aj_kb_i32(kb, 1), "walk");
    /* refill the slot the previous iteration freed, then wait for tile n:
     * every iteration commits one group, empty or not, so that
     * stages - 1 pending groups always means "tile n has landed" */
    issue_kv_tile(e, walk, aj_kb_add(kb, at, aj_kb_i32(kb, p->stages - 1)),
                  gated ? ahead[p->stages - 1] : NULL, gated ? ahead_tile[p->stages - 1] : NULL);
    aj_kb_cp_async_commit(kb);
    aj_kb_cp_async_wait(kb, p->stages - 1);
    LLVMValueRef slot = ring_slot(e, at, walk->begin);
    if (e->tma) {   /* TMA: the slot's phase of this position (tma_no_tile) */
        aj_kb_if_begin(kb, tma_on(e));
        aj_kb_mbarrier_wait(kb, smem_at(e, slot_bar(e, slot), 0),
                            parity_of(e, slot_phase(e, at, walk->begin)));
        aj_kb_if_end(kb);
    }
    if (p->wg)   /* the copies' generic writes, to the async proxy wgmma reads through */
        aj_kb_intrinsic(kb, AJ_INTR_FENCE_PROXY_ASYNC, NULL);
    aj_kb_barrier(kb);
    if (p->kv8) {   /* the slot's f8 tile into the K tile (see "Paged") */
        widen_kv8(e, slot);
        aj_kb_barrier(kb);
    }
    LLVMValueRef kbase = slot_k(e, slot), vbase = slot_v(e, slot);
    LLVMValueRef cls = NULL, n = at;
    if (gated) {   /* the ring moves on; the class is the same in every thread */
        cls = aj_kb_get(kb, ahead[0]);
        n = aj_kb_get(kb, ahead_tile[0]);
        for (int s = 0; s + 1 < p->stages; s++) {
            aj_kb_set(kb, ahead[s], aj_kb_get(kb, ahead[s + 1]));
            aj_kb_set(kb, ahead_tile[s], aj_kb_get(kb, ahead_tile[s + 1]));
        }
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntNE, cls, aj_kb_i32(kb, AJ_TILE_SKIP), ""));
    } else {
        n = aj_score_walk_tile(&e->sc, walk, at, &cls);
    }
    compute_tile(e, n, cls, kbase, vbase);
    if (gated)
        aj_kb_if_end(kb);
    aj_kb_barrier(kb);   /* every warp is done with the slot */
    aj_kb_for_end(kb);
}

/* ---------------------------------------------------------------- warp specialisation */

/*
 * Warp specialisation (schedule producer = 1 with warpgroups = G, sm_90a
 * and sim): a producer warpgroup after the G consumer warpgroups issues
 * every load; the consumers only compute.  Each ring slot has two
 * mbarriers:
 *
 *   full[s]    the tile is in slot s: the producer's arrival with the
 *              tile's bytes expected (TMA: one arrival by its thread 0),
 *              or each of its 128 threads' arrival once its cp.async
 *              copies have landed and are fenced for the async proxy
 *              (ws_copies_landed); a position that loads nothing still
 *              arrives
 *   empty[s]   every consumer thread arrives once its warpgroup's P V
 *              has passed wgmma's wait: the slot may be refilled
 *
 * Walk position r (from the walk's first) uses slot r % stages in its
 * phase r / stages: the consumers wait for full's phase of that parity,
 * the producer, from r = stages on, for empty's phase r / stages - 1.
 * Q has its own full barrier, filled the same way.  With two consumer
 * warpgroups the producer gives registers back (setmaxnreg.dec to
 * WS_PRODUCER_REGS) and the consumers take them (setmaxnreg.inc to
 * WS_CONSUMER_REGS); the consumers take turns at the tensor cores by the
 * named barriers of turn_bar (warpgroup 1 first grants warpgroup 0 its
 * turn, and warpgroup 0 takes the last grant after its loop, so every
 * phase of both barriers completes).  The consumers never meet at the
 * CTA's barrier after the set-up, and the producer leaves when its walk
 * is issued.
 */

/* Thread 0 sets up the mbarriers: Q's and each slot's full one expect
 * one arrival by TMA or ld_threads by cp.async, each empty one an arrival
 * by every consumer thread.  Then the whole CTA meets. */
static void ws_setup(ffwd *e)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    LLVMValueRef fills = aj_kb_i32(kb, e->ld_threads);
    if (e->tma)
        fills = LLVMBuildSelect(b, tma_on(e), aj_kb_i32(kb, 1), fills, "");
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, e->tid, aj_kb_i32(kb, 0), ""));
    for (int s = 0; s < 1 + 2 * p->stages; s++) {
        LLVMValueRef init[2] = {
            smem_at(e, aj_kb_i32(kb, e->smem_bar), 8 * s),
            s <= p->stages ? fills : aj_kb_i32(kb, WARPGROUP_THREADS * p->wg)};
        aj_kb_intrinsic(kb, AJ_INTR_MBARRIER_INIT, init);
    }
    aj_kb_intrinsic(kb, AJ_INTR_FENCE_PROXY_ASYNC, NULL);
    aj_kb_if_end(kb);
    aj_kb_barrier(kb);
}

/* The producer warpgroup: Q, then the walk's tiles, each once its slot is
 * empty (the first `stages` are).  With TMA, thread 0 alone issues. */
static void ws_producer(ffwd *e, LLVMValueRef q_src, int gated)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    if (p->wg == 2) {
        LLVMValueRef regs = aj_kb_i32(kb, WS_PRODUCER_REGS);
        aj_kb_intrinsic(kb, AJ_INTR_SETMAXNREG_DEC, &regs);
    }
    aj_score_walk the_walk, *walk = &the_walk;
    key_walk(e, walk);   /* after setmaxnreg: nothing of it lives across */
    LLVMValueRef t0 = LLVMBuildICmp(b, LLVMIntEQ, e->ld_tid, aj_kb_i32(kb, 0), "");
    if (e->tma) {
        aj_kb_if_begin(kb, LLVMBuildOr(b, t0, LLVMBuildNot(b, tma_on(e), ""), ""));
        aj_kb_if_begin(kb, tma_on(e));
        q_by_tma(e);
        aj_kb_else(kb);
    }
    wgmma_zero_pads(e);
    q_by_copies(e, q_src);
    ws_copies_landed(e, aj_kb_i32(kb, e->smem_bar));
    if (e->tma)
        aj_kb_if_end(kb);
    LLVMValueRef cls = NULL, tile = NULL;
    if (gated) {
        cls = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, AJ_TILE_SKIP), "cls");
        tile = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, 0), "tile");
    }
    LLVMValueRef at = aj_kb_for_begin(kb, walk->begin, walk->end, aj_kb_i32(kb, 1), "produce");
    LLVMValueRef phase = slot_phase(e, at, walk->begin);
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntUGE, phase, aj_kb_i32(kb, 1), ""));
    LLVMValueRef prior = LLVMBuildSub(b, phase, aj_kb_i32(kb, 1), "");
    aj_kb_mbarrier_wait(kb, smem_at(e, empty_bar(e, ring_slot(e, at, walk->begin)), 0),
                        parity_of(e, prior));
    aj_kb_if_end(kb);
    issue_kv_tile(e, walk, at, cls, tile);
    aj_kb_for_end(kb);
    if (e->tma)
        aj_kb_if_end(kb);
}

/*
 * Overlap (warp specialised, stages >= 2; FA3's intra-warpgroup overlap):
 * a consumer warpgroup issues tile t's S = Q K^T and, behind it, the P V
 * of the tile it computed before (held: its P kept as A fragments, its
 * slot not yet given back), waits for S alone (wait_group 1), runs t's
 * score mods, mask and softmax while that P V runs, then waits for it,
 * gives its slot back and scales O by t's alpha; t's P V is held in turn.
 * A position the mask skips, and the walk's end, first finish the held
 * P V, so that a slot is never held across a position whose own slot the
 * producer may need.  With one stage the producer would wait for the slot
 * the held P V reads while the consumers wait for its next tile in that
 * same slot: stages = 1 takes no overlap.
 */
typedef struct ws_held {
    LLVMValueRef held, slot;            /* i32 vars: a P V is held; its slot */
    LLVMValueRef a[MAX_NT / 2][4];      /* i32 vars: its P's A fragments */
} ws_held;

static void held_init(ffwd *e, ws_held *h)
{
    aj_kb *kb = e->kb;
    h->held = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, 0), "held");
    h->slot = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, 0), "held_slot");
    for (int kk = 0; kk < e->p.bn / pv_step_keys(&e->p); kk++)
        for (int c = 0; c < 4; c++)
            h->a[kk][c] = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, 0), "held_p");
}

/* i1: a P V is held. */
static LLVMValueRef is_held(ffwd *e, const ws_held *h)
{
    return LLVMBuildICmp(e->b, LLVMIntNE, aj_kb_get(e->kb, h->held), aj_kb_i32(e->kb, 0), "");
}

/* The held P V issued, behind whatever is in flight; with `otherwise`
 * (a slot whose tile has landed) the same wgmmas where none is held, P
 * zero against that slot's V, so that every path issues them (ptxas
 * serialises wgmma that some paths issue and others do not). */
static void held_issue(ffwd *e, const ws_held *h, LLVMValueRef otherwise)
{
    aj_kb *kb = e->kb;
    const ffwd_plan *p = &e->p;
    LLVMValueRef held = otherwise ? is_held(e, h) : NULL;
    LLVMValueRef a[MAX_NT / 2][4];
    for (int kk = 0; kk < p->bn / pv_step_keys(p); kk++)
        for (int c = 0; c < 4; c++) {
            a[kk][c] = aj_kb_get(kb, h->a[kk][c]);
            if (held)
                a[kk][c] = LLVMBuildSelect(e->b, held, a[kk][c], aj_kb_i32(kb, 0), "");
        }
    LLVMValueRef slot = aj_kb_get(kb, h->slot);
    if (held)
        slot = LLVMBuildSelect(e->b, held, slot, otherwise, "");
    pv_wgmma_issue(e, a, slot_v(e, slot));
}

/* The P V issued last landed in O (nothing else in flight); a held one's
 * slot given back. */
static void held_land(ffwd *e, const ws_held *h)
{
    land_gemm(e, e->acc_o, 0, e->p.dv / 8, e->o[0]);
    aj_kb_if_begin(e->kb, is_held(e, h));
    mbar_arrive(e, empty_bar(e, aj_kb_get(e->kb, h->slot)));
    aj_kb_if_end(e->kb);
}

/* A held P V, issued and landed: none held after. */
static void held_finish(ffwd *e, ws_held *h)
{
    aj_kb_if_begin(e->kb, is_held(e, h));
    held_issue(e, h, NULL);
    held_land(e, h);
    aj_kb_set(e->kb, h->held, aj_kb_i32(e->kb, 0));
    aj_kb_if_end(e->kb);
}

/* compute_tile, overlapped (see above): key tile n of class cls, its K at
 * shared byte offset kbase, in ring slot `slot`. */
static void compute_tile_overlapped(ffwd *e, LLVMValueRef n, LLVMValueRef cls,
                                    LLVMValueRef kbase, LLVMValueRef slot, ws_held *h)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    int turns = p->wg == 2;
    LLVMValueRef n0 = LLVMBuildMul(b, n, aj_kb_i32(kb, p->bn), "n0");
    if (turns)
        turn_bar(e, AJ_INTR_NAMED_BAR_SYNC, 0);
    qk_wgmma_issue(e, kbase);
    held_issue(e, h, slot);   /* none held: P = 0 against this tile's V */
    if (turns)
        turn_bar(e, AJ_INTR_NAMED_BAR_ARRIVE, 1);
    qk_wgmma_land(e, 1);   /* S alone: the P V behind it runs on */
    score_tile(e, n0, cls);
    pv_later later;
    emit_softmax_pv(e, n0, NULL, &later);
    held_land(e, h);
    for (int half = 0; half < 2; half++)
        scale_o(e, 0, half, later.alpha[half]);
    for (int kk = 0; kk < p->bn / pv_step_keys(p); kk++)
        for (int c = 0; c < 4; c++)
            aj_kb_set(kb, h->a[kk][c], later.a[kk][c]);
    aj_kb_set(kb, h->slot, slot);
    aj_kb_set(kb, h->held, aj_kb_i32(kb, 1));
}

/* A consumer warpgroup: each walk position once its slot is full, then
 * the slot given back (see above; with overlap, when its P V has run). */
static void ws_consumer(ffwd *e, int gated)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    const ffwd_plan *p = &e->p;
    LLVMValueRef pair = aj_kb_i32(kb, 2 * WARPGROUP_THREADS);
    LLVMValueRef first_wg =
        p->wg == 2 ? LLVMBuildICmp(b, LLVMIntEQ, e->wgi, aj_kb_i32(kb, 0), "") : NULL;
    int overlap = ws_overlaps(p);
    ws_held h;
    if (overlap)
        held_init(e, &h);
    if (p->wg == 2) {
        LLVMValueRef regs = aj_kb_i32(kb, WS_CONSUMER_REGS);
        aj_kb_intrinsic(kb, AJ_INTR_SETMAXNREG_INC, &regs);
    }
    aj_score_walk the_walk, *walk = &the_walk;
    key_walk(e, walk);   /* after setmaxnreg: nothing of it lives across */
    if (p->wg == 2) {
        aj_kb_if_begin(kb, LLVMBuildNot(b, first_wg, ""));   /* warpgroup 0's first turn */
        LLVMValueRef grant[2] = {aj_kb_i32(kb, TURN_BAR), pair};
        aj_kb_intrinsic(kb, AJ_INTR_NAMED_BAR_ARRIVE, grant);
        aj_kb_if_end(kb);
    }
    aj_kb_mbarrier_wait(kb, smem_at(e, aj_kb_i32(kb, e->smem_bar), 0), aj_kb_i32(kb, 0));
    LLVMValueRef at = aj_kb_for_begin(kb, walk->begin, walk->end, aj_kb_i32(kb, 1), "consume");
    LLVMValueRef slot = ring_slot(e, at, walk->begin);
    aj_kb_mbarrier_wait(kb, smem_at(e, slot_bar(e, slot), 0),
                        parity_of(e, slot_phase(e, at, walk->begin)));
    LLVMValueRef kbase = slot_k(e, slot), vbase = slot_v(e, slot);
    LLVMValueRef cls;
    LLVMValueRef n = aj_score_walk_tile(&e->sc, walk, at, &cls);
    LLVMValueRef computed =
        gated ? LLVMBuildICmp(b, LLVMIntNE, cls, aj_kb_i32(kb, AJ_TILE_SKIP), "") : NULL;
    if (gated)
        aj_kb_if_begin(kb, computed);
    if (overlap)
        compute_tile_overlapped(e, n, cls, kbase, slot, &h);
    else
        compute_tile(e, n, cls, kbase, vbase);
    if (gated && overlap) {   /* a skipped position: the held P V first */
        aj_kb_else(kb);
        held_finish(e, &h);
    }
    if (gated)
        aj_kb_if_end(kb);
    /* the slot back now, but for a tile whose P V is held */
    if (overlap && gated)
        aj_kb_if_begin(kb, LLVMBuildNot(b, computed, ""));
    if (!overlap || gated)
        mbar_arrive(e, empty_bar(e, slot));
    if (overlap && gated)
        aj_kb_if_end(kb);
    aj_kb_for_end(kb);
    if (overlap)
        held_finish(e, &h);
    if (p->wg == 2) {   /* warpgroup 1's last grant */
        aj_kb_if_begin(kb, first_wg);
        LLVMValueRef last[2] = {aj_kb_i32(kb, TURN_BAR), pair};
        aj_kb_intrinsic(kb, AJ_INTR_NAMED_BAR_SYNC, last);
        aj_kb_if_end(kb);
    }
}

/* Without warp specialisation: every warp loads and computes; Q has
 * landed and every visited tile is done after it. */
static void every_warp_loads(ffwd *e, aj_score_walk *walk, LLVMValueRef q_src, int gated)
{
    aj_kb *kb = e->kb;
    /* with a mask rest, the tiles in flight and their classes: ahead[s]
     * is position at + s's, taken when its copy was issued (issue_kv_tile) */
    LLVMValueRef ahead[MAX_STAGES], ahead_tile[MAX_STAGES];
    for (int s = 0; gated && s < e->p.stages; s++) {
        ahead[s] = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, AJ_TILE_SKIP), "cls");
        ahead_tile[s] = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, 0), "tile");
    }
    prologue(e, walk, q_src, gated, ahead, ahead_tile);
    if (e->tma) {   /* Q's box has landed */
        aj_kb_if_begin(kb, tma_on(e));
        aj_kb_mbarrier_wait(kb, smem_at(e, aj_kb_i32(kb, e->smem_bar), 0), aj_kb_i32(kb, 0));
        aj_kb_if_end(kb);
    }
    mainloop(e, walk, gated, ahead, ahead_tile);
    aj_kb_cp_async_wait_all(kb);   /* Q's copy, when no tile was visited */
}

static aj_status ffwd_build(aj_kb *kb, const aj_op *op, void *user)
{
    (void)user;
    ffwd e;
    memset(&e, 0, sizeof e);
    const aj_score_prog *prog;
    aj_status st =
        aj_kctx_plan_programs(kb, op, plan_kernel(kb->ctx, op, kb->target, &e.p), &prog);
    if (st != AJ_OK)
        return st;
    const ffwd_plan *p = &e.p;
    LLVMBuilderRef b = kb->b;
    aj_kctx_init(&e.k, kb, op, prog);

    aj_params_declare(kb, AJ_KSIG_FLASH_FWD, op, prog);
    if (p->f8) {   /* FP8: Q's and K's rows move by 16-byte cp.async (load_tile_async) */
        aj_kb_row_align(kb, AJ_ROW_Q, 16);
        aj_kb_row_align(kb, AJ_ROW_K, 16);
    }
    aj_kb_begin(kb, p->threads);
    alloc_state(&e);
    thread_coords(&e);
    LLVMValueRef mblk = aj_kb_block_id(kb, 0);
    LLVMValueRef h = aj_kb_block_id(kb, 1);
    LLVMValueRef bidx = aj_kb_block_id(kb, 2);
    e.m0 = LLVMBuildMul(b, mblk, aj_kb_i32(kb, p->bm), "m0");
    LLVMValueRef q_start, k_start;
    aj_kctx_sequence(&e.k, bidx, &q_start, &k_start);
    /* the grid covers the longest sequence; the CTAs past this one's end
     * have nothing to do */
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, e.m0, e.seq_q, ""));
    LLVMValueRef group_size =
        LLVMBuildSDiv(b, aj_param(kb, AJ_PID(heads_q)), aj_param(kb, AJ_PID(heads_kv)), "");
    LLVMValueRef hkv = LLVMBuildSDiv(b, h, group_size, "hkv");
    e.bidx = bidx;
    e.h = h;
    e.hkv = hkv;
    if (p->f8) {   /* FP8: the descales, and O's 2^8 (P_E4M3_LOG2) back out */
        aj_attn_descales(kb, op, h, hkv, &e.s_scale, &e.o_scale);
        e.o_scale = LLVMBuildFMul(b, e.o_scale, aj_kb_f32(kb, ldexpf(1.0f, -P_E4M3_LOG2)), "");
    }
    if (uses_tma(&e))
        e.tma = aj_param(kb, AJ_PID(tma));
    LLVMValueRef sq, sk;
    aj_attn_score_totals(kb, prog, op->layout, e.seq_q, e.seq_k, &sq, &sk);
    aj_kctx_set_head(&e.k, bidx, h, sq, sk);
    /* slice bases: (b, h) plus, for varlen, the sequence's first row */
    LLVMValueRef q_src = aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_q, bidx, h),
                                   LLVMBuildMul(b, q_start, aj_param(kb, AJ_PID(stride_q_s)), ""));
    e.k_src = aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_k, bidx, hkv),
                        LLVMBuildMul(b, k_start, aj_param(kb, AJ_PID(stride_k_s)), ""));
    e.v_src = aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_v, bidx, hkv),
                        LLVMBuildMul(b, k_start, aj_param(kb, AJ_PID(stride_v_s)), ""));
    LLVMValueRef o_base =
        aj_kb_add(kb, aj_attn_slice_base(kb, out_tensor(op), bidx, h),
                  LLVMBuildMul(b, q_start, aj_param_stride(kb, out_tensor(op), 2), ""));
    LLVMValueRef lse_base = aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_lse, bidx, h), q_start);
    const ffwd_out out = {o_base, aj_param_stride(kb, out_tensor(op), 2), lse_base, NULL, NULL, 0};

    lane_addresses(&e);
    int gated = aj_score_has_rest(prog);
    if (p->ws) {   /* the consumers, then the producer (see "Warp specialisation") */
        ws_setup(&e);
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntULT, e.tid,
                                         aj_kb_i32(kb, WARPGROUP_THREADS * p->wg), ""));
        ws_consumer(&e, gated);
        emit_epilogue(&e, &out);
        aj_kb_else(kb);
        ws_producer(&e, q_src, gated);
        aj_kb_if_end(kb);
    } else {
        aj_score_walk walk;
        key_walk(&e, &walk);
        every_warp_loads(&e, &walk, q_src, gated);
        emit_epilogue(&e, &out);
    }
    aj_kb_if_end(kb);

    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, p->bm}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {p->bm, p->bn, p->warps, p->stages},
    };
    aj_kb_finish(kb, &layout);
    return kb->st;
}

/* ---------------------------------------------------------------- paged */

/*
 * Paged (layout = paged with kv_shared = true: absorbed MLA's decode over
 * one latent cache; docs/ir.md "Shared K/V cache"): the query heads of a
 * KV head, 16-128 of them against MLA's one, make the rows of a decode
 * step many enough for the tensor cores.  The efficient template's paged
 * build calls aj_flash_paged_parts for its first stage (the same
 * parameters, grid and split-KV workspace; its merge stage follows):
 *
 *   grid = (splits, Hq, B); part s takes key tiles [part_first, part_last)
 *   rows = the group's heads x Sq stacked head after head (GQA packing,
 *          layouts.h: where the group's rows fit AJ_PAGED_PACK_ROWS and
 *          the programs read no head; else one head's Sq rows), row r of
 *          head r / Sq at position r % Sq
 *   CTA h of the group takes row blocks m0 = (h % G) bm, + G bm, ... (the
 *          others of an unpacked op none past its own head's)
 *
 * Each row block is the kernel above with three differences: Q's rows come
 * as stacked heads (q_by_copies: row_map), each K tile's rows through the
 * block table (paged_kv_tile: a row table per ring slot, aj_tile_paged_
 * rows), and V is the K tile's first Dv columns read in place (p->shared:
 * no V slot, V's ldmatrix.trans at K's pitch).  The score programs see a
 * row's position (row_pos) and the block's span of positions
 * (block_positions), at head h0.  One part writes O and the LSE, more
 * write f32 partials to the workspace (row_dest) for the merge; learned
 * sinks fold at each row's own head where O is final.  Queries of the
 * output's 16-bit dtype over a cache of it or of f8 (widen_kv8: its tiles
 * land raw in a stage per slot and are widened, exactly, into one K tile;
 * paged_descales), D up to 576.
 */

/* The initial state again (O = 0, m = -inf, l = 0), for the next row block. */
static void reset_state(ffwd *e)
{
    aj_kb *kb = e->kb;
    for (int mi = 0; mi < e->p.mt; mi++) {
        for (int v = 0; v < e->p.vt; v++)
            for (int c = 0; c < 4; c++)
                aj_kb_set(kb, e->o[mi][v][c], aj_kb_f32(kb, 0));
        for (int half = 0; half < 2; half++) {
            aj_kb_set(kb, e->m[mi][half], aj_kb_f32(kb, -INFINITY));
            aj_kb_set(kb, e->l[mi][half], aj_kb_f32(kb, 0));
        }
    }
}

bool aj_flash_paged_takes(const aj_op *op, aj_target target)
{
    aj_dtype dt = op->dtype, kv = aj_op_kv_dtype(op);
    /* an f8 cache is widened in 16-byte chunks of a row */
    int f8 = (kv == AJ_DTYPE_F8E4M3 || kv == AJ_DTYPE_F8E5M2) && op->head_dim % 16 == 0;
    return op->variant == AJ_VARIANT_FLASH && op->layout == AJ_LAYOUT_PAGED && op->kv_shared &&
           aj_target_desc_of(target)->simt && !op->warpgroups &&
           (dt == AJ_DTYPE_F16 || dt == AJ_DTYPE_BF16) && aj_op_q_dtype(op) == dt &&
           (kv == dt || f8);
}

aj_status aj_flash_paged_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    aj_status st = aj_attn_check_dims(ctx, op, "paged forward", AJ_HEAD_DIM_MAX_EFFICIENT);
    ffwd_plan plan;
    return st != AJ_OK ? st : aj_kctx_check_planned(ctx, op, plan_kernel(ctx, op, target, &plan));
}

/* The part's CTA (aj_attn_paged_cta: its sequence, stacked heads, row
 * blocks and key tiles), the score programs at (b, h0), and the caches'
 * KV head and page strides. */
static void paged_begin(ffwd *e, aj_paged_cta *c)
{
    aj_kb *kb = e->kb;
    LLVMBuilderRef b = e->b;
    aj_attn_paged_cta(kb, e->op, e->prog->reads_totals, aj_attn_paged_packable(e->prog, false),
                      e->p.bm, e->p.bn, c);
    e->h = c->h;
    e->bidx = c->bidx;
    e->seq_q = c->seq_q;
    e->seq_k = c->seq_k;
    e->hkv = c->hkv;
    e->h0 = c->h0;
    e->rows = c->rows;
    e->per = aj_kb_smax(kb, e->seq_q, aj_kb_i32(kb, 1));
    e->part_first = c->first;
    e->part_last = c->last;
    aj_score_begin(&e->sc, kb, e->prog, 0, c->bidx, c->h0, c->q_origin, aj_kb_i64(kb, 0),
                   c->total, c->total);
    LLVMValueRef hkv = aj_kb_sext64(kb, e->hkv);
    e->k_src = LLVMBuildMul(b, hkv, aj_param(kb, AJ_PID(stride_k_cache_h)), "");
    e->v_src = LLVMBuildMul(b, hkv, aj_param(kb, AJ_PID(stride_v_cache_h)), "");
    e->k_page = aj_param(kb, AJ_PID(stride_k_cache_page));
    e->v_page = aj_param(kb, AJ_PID(stride_v_cache_page));
}

/* An f8 cache's descales: S's factor k_scale and O's v_scale (k_scale:
 * V is K's columns, runtime/launch.c), each times 2^8 for e4m3, whose
 * widened tile holds 2^-8 its values (widen_kv8). */
static void paged_descales(ffwd *e)
{
    LLVMValueRef score, out;
    aj_attn_descales(e->kb, e->op, e->h, e->hkv, &score, &out);
    LLVMValueRef f = aj_kb_f32(e->kb, e->p.kv8 == AJ_DTYPE_F8E4M3 ? AJ_F8E4M3_F16_FACTOR : 1.0f);
    e->s_scale = LLVMBuildFMul(e->b, score, f, "k_scale");
    e->o_scale = LLVMBuildFMul(e->b, out, f, "v_scale");
}

/* Where the part's rows go (aj_attn_paged_dests): outs[0] O and the LSE
 * (one part), outs[1] the workspace's f32 partials. */
static void paged_outs(ffwd *e, const aj_paged_cta *c, ffwd_out outs[2])
{
    aj_paged_dest d[2];
    aj_attn_paged_dests(e->kb, e->op, c, e->p.dv, d);
    for (int i = 0; i < 2; i++)
        outs[i] = (ffwd_out){d[i].o_base, d[i].o_stride, d[i].lse_base, d[i].o_head,
                             d[i].lse_head, i};
}

aj_status aj_flash_paged_parts(aj_kb *kb, const aj_op *op, const aj_score_prog *prog,
                               aj_schedule *used)
{
    ffwd e;
    memset(&e, 0, sizeof e);
    aj_status st = plan_kernel(kb->ctx, op, kb->target, &e.p);
    if (st != AJ_OK)
        return st;
    const ffwd_plan *p = &e.p;
    LLVMBuilderRef b = kb->b;
    aj_kctx_init(&e.k, kb, op, prog);
    aj_params_declare(kb, AJ_KSIG_CPU_PAGED_FWD, op, prog);
    /* cache rows move by 16-byte cp.async: the launch checks the caches */
    aj_kb_row_align(kb, AJ_ROW_K_CACHE, 16);
    aj_kb_row_align(kb, AJ_ROW_V_CACHE, 16);
    aj_kb_begin_stage(kb, "parts", p->threads);
    alloc_state(&e);
    thread_coords(&e);
    aj_paged_cta c;
    paged_begin(&e, &c);
    if (p->kv8)
        paged_descales(&e);
    LLVMValueRef q_src = aj_cpu_seq_base(kb, AJ_PSRC_q, c.bidx, c.h0, c.start_q);
    lane_addresses(&e);
    int gated = aj_score_has_rest(prog);
    e.m0 = aj_kb_for_begin(kb, c.first_mb, c.rows, c.mb_step, "mb");
    reset_state(&e);
    aj_attn_paged_span(kb, e.m0, last_row(&e), e.per, e.seq_q, &e.i_first, &e.i_last);
    aj_kb_barrier(kb);   /* the previous row block's readers of Q are done */
    aj_score_walk walk;
    key_walk(&e, &walk);
    every_warp_loads(&e, &walk, q_src, gated);
    ffwd_out outs[2];
    paged_outs(&e, &c, outs);
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntEQ, c.splits, aj_kb_i32(kb, 1), ""));
    emit_epilogue(&e, &outs[0]);
    aj_kb_else(kb);
    emit_epilogue(&e, &outs[1]);
    aj_kb_if_end(kb);
    aj_kb_for_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SPLITS, 1}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {p->bm, p->bn, p->warps, p->stages},
        .pack_rows = aj_attn_paged_packable(prog, false) ? AJ_PAGED_PACK_ROWS : 0,
    };
    aj_kb_finish(kb, &layout);
    *used = layout.schedule;
    return kb->st;
}

AJ_TEMPLATE(aj_template_flash_fwd, "flash_fwd", AJ_KIND_FORWARD, AJ_VARIANT_FLASH, ffwd_check,
            ffwd_build, .stage_sigs = {AJ_KSIG_FLASH_FWD});
