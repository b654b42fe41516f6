/*
 * flash_bwd.c -- the flash-variant backward pass: f16 / bf16 on tensor
 * cores (mma.sync m16n8k16 fed by ldmatrix from tiles that cp.async
 * brings into shared memory), f32 accumulation, as three kernels of one
 * module run in order.  Like the efficient backward it recomputes the
 * probabilities from Q, K and the forward's LSE:
 *
 *   S_ij  = scale q_i . k_j -> score_mod, mask        P_ij = exp(S_ij - LSE_i)
 *   dP_ij = dO_i . v_j      Delta_i = dO_i . O_i     dS_ij = P_ij (dP_ij - Delta_i) mod'
 *   dV_j = sum_i P_ij dO_i   dK_j = scale sum_i dS_ij q_i   dQ_i = scale sum_j dS_ij k_j
 *
 *   deterministic = true:   delta -> dkdv -> dq
 *   deterministic = false:  delta (+ zero dQacc) -> dkdv (+ atomic dQacc) -> dq_convert
 *
 * delta: Delta_i into an f32 workspace, one thread per query row.
 * dkdv:  one CTA per (key block of block_n keys, kv head, batch); K and V
 *        stay in shared memory while the CTA walks the query heads of its
 *        group and, for each, the query tiles of block_m rows that can see
 *        a key of the block (whole tiles outside the mask are skipped):
 *
 *          grid = (ceil(Sk / block_n), Hkv, B)
 *
 *          per query tile:  Q, dO (cp.async; with stages = 2 the next
 *          tile's copy is in flight during this one), LSE, Delta
 *            S^T  = K Q^T     dP^T = V dO^T          (block_n x block_m)
 *            P^T, dS^T -> shared memory (the op's dtype)
 *            dV += P^T dO     dK += dS^T Q           (registers, f32)
 *            [non-deterministic: dQacc += dS K by red.global.add.f32]
 *
 *        dK and dV are written once, GQA sums included: no atomics.
 * dq:    one CTA per (query block, head, batch): Q, dO once, then per key
 *        block S = Q K^T, dP = dO V^T, dS -> shared memory, dQ += dS K.
 *        Every dQ element is summed by one thread in a fixed order, so
 *        the results are bitwise reproducible run to run.
 * dq_convert: dQ = scale dQacc in the op's dtype.
 * With schedule warpgroups (sm_90a, sim) dkdv and dq run their products
 * on wgmma: see "wgmma" below.
 *
 * Warps tile each product's output (M x N) in 16-row strips: with W
 * warps and M / 16 >= W strips a warp owns M / 16 / W of them over all N
 * columns, else W / (M / 16) warps share a strip and split its columns:
 *
 *          N ──►                       N ──►
 *   M   │ w0 w0 w0 w0 │   M / 16 < W │ w0 w0 │ w2 w2 │
 *   │   │ w1 w1 w1 w1 │              │ w1 w1 │ w3 w3 │
 *   ▼   │ w2 ...      │
 *
 * Tiles in shared memory keep rows of aj_mma_tile_ld(width) elements
 * (tile_io.h): the width rounded up to 16, the pad columns zero, so that
 * a reduction over a head dim that is an odd multiple of 8 steps 16 at a
 * time, then 8 more so that the eight 16-byte rows one ldmatrix reads fall
 * in different banks.  An operand
 * whose reduction dim runs down the tile's rows (dO in dV += P^T dO, which
 * sums over dO's rows) is read with ldmatrix .trans; see warp_mma.
 *
 * Rows that see no key get dQ = 0; keys no row sees get dK = dV = 0.
 * The mask and score_mod are the op's score programs (score.h), built-in
 * or expressions alike: the band bounds the tiles each kernel walks, and
 * where the mask has more than its band, tiles whose class is skip are
 * neither loaded nor computed; a tile of class full inside the lengths
 * computes P and dS with no element test (score.h's
 * aj_score_by_tile_class).  Dropout is attn_common.h's.
 * Launch contract: Sq, Sk < 2^30; the workspace of aj_backward_workspace_size.
 */
#include <stdio.h>
#include <string.h>

#include "templates/attn_common.h"
#include "templates/grad_tail.h"
#include "templates/skeleton.h"
#include "templates/score.h"
#include "templates/template.h"
#include "templates/tile_io.h"
#include "templates/tile_pipe.h"

#define MAX_MT 4          /* 16-row strips a warp owns in one product */
#define MAX_NT 32         /* 8-column tiles a warp owns in one product */
#define STATE_BUDGET 192  /* f32 accumulators per thread, all products live at once */
#define DEFAULT_STATE 104 /* the most a default schedule takes where a candidate fits */
#define DEFAULT_LIMIT 128 /* past DEFAULT_STATE, the most before the least-state one */
#define PHILOX_STATE 32   /* dropout's Philox keys, counters and outputs per thread */
#define UNEVEN_SHARE 4    /* a product dealt to warps in uneven shares (warp_grid_for) */
/* A second stage's buffers past head dim WIDE_HEAD_DIM, where every
 * candidate but 16 x 16 tiles is out of reach and those sit at ptxas's
 * 255: 440/272 with dropout and alibi spilled 4 bytes on sm_80, 8 on sm_90
 * with 2 stages and none with 1, so the model charges the second stage
 * there */
#define WIDE_HEAD_DIM 256
#define WIDE_STAGE_REGS 16
#define DELTA_ROWS 128    /* query rows per CTA of the delta and convert kernels */
/* The wgmma kernels' (see "wgmma"): f32 values per thread, their
 * accumulators wgmma's registers; test_sweep_ptxas_wgmma_bwd checks the
 * defaults for spills on sm_90a. */
#define WGMMA_STATE_BUDGET 200
/* The most a default takes where a candidate fits (the walked tile
 * narrows for option work): ptxas's 255 registers hold it unspilled.
 * Above the budget because it counts what the budget does not (the
 * element pass's option work, dropout's Philox state). */
#define WGMMA_DEFAULT_STATE 208
#define WARPGROUP_ROWS 64
/* D + Dv: dK and dV live in registers, past it split over two
 * warpgroups (each then up to it); beside dropout's Philox state ptxas
 * spilled 8-20 bytes at D + Dv = 256 on one warpgroup (16-row walked
 * tiles, test_sweep_ptxas_wgmma_bwd) */
#define WGMMA_KEY_DIMS 256
#define WGMMA_KEY_DIMS_DROPOUT 192

static const int block_values[] = {16, 32, 64, 128};
static const int warp_values[] = {1, 2, 4, 8};

typedef struct fbwd_plan {
    aj_dtype dtype;
    int d, dv;
    int bm, bn, warps, threads, stages;
    int deterministic;
    /* wgmma warpgroups of the dkdv kernel (block_n / 64, or 2 on 64 keys
     * when split; the dq kernel runs one per 64 of its rows); 0:
     * mma.sync (see "wgmma" below) */
    int wg;
    /* wgmma, D + Dv past what one warpgroup holds: the dkdv kernel's two
     * warpgroups own the same 64 keys, one keeps dV, the other dK (see
     * "wgmma") */
    int split;
    int state;         /* f32 accumulators per thread (thread_state) */
    int default_state; /* state with the element pass's option work (thread_state) */
} fbwd_plan;

/* How the warps of a CTA tile an M x N product (see the header). */
typedef struct warp_grid {
    int wm, wn;    /* warps down M (each owns mt strips of 16 rows), across N */
    int replicas;  /* warp w computes what warp w % (wm wn) does (wgmma's split) */
    int mt, nt;    /* a warp's 16-row strips, and the most 8-column tiles it owns */
    int n;         /* the product's columns */
} warp_grid;

/*
 * The warp grid of an M x N product, 0 when the warps cannot tile it.
 * M splits evenly into 16-row strips; N's T = n / 8 column tiles are
 * dealt to the wn warp columns in shares that differ by at most one, the
 * longer ones first (warp column c owns tiles ceil(c T / wn) up to
 * ceil((c + 1) T / wn)), so that N = 232 (29 tiles) splits over 4 warp
 * columns as 8, 7, 7, 7, and N = 8 over 4 as 1, 0, 0, 0 (D = 8 beside
 * Dv = 256 needs 8 warps).  Every warp computes nt tiles ending at its
 * share's end; a short share's first one is its neighbour's last tile,
 * computed again and never stored (acc_tile_inside), so that the warp's
 * tiles stay one run of columns from one origin (warp_mma's addresses):
 *
 *   tiles   0 .. 7 | 8 .. 14 | 15 .. 21 | 22 .. 28
 *   warp c0 [0, 8)   c1 [7, 15)  c2 [14, 22)  c3 [21, 29)
 */
static int warp_grid_for(int m, int n, int warps, warp_grid *g)
{
    int strips = m / 16;
    g->n = n;
    g->replicas = 1;
    if (m % 16 != 0 || n % 8 != 0)
        return 0;
    if (strips >= warps) {
        if (strips % warps != 0)
            return 0;
        g->wm = warps;
        g->mt = strips / warps;
        g->wn = 1;
    } else {
        if (warps % strips != 0)
            return 0;
        g->wm = strips;
        g->mt = 1;
        g->wn = warps / strips;
    }
    g->nt = (n / 8 + g->wn - 1) / g->wn;
    return g->mt <= MAX_MT && g->nt <= MAX_NT;
}

static int in_list(int v, const int *list, int n)
{
    for (int i = 0; i < n; i++)
        if (list[i] == v)
            return 1;
    return 0;
}

/* Bytes of shared memory each kernel asks for (tile rows as tile_io.h lays
 * them out). */
static int32_t tile_bytes(int rows, int width)
{
    return 2 * rows * aj_mma_tile_ld(width);
}

/* A wgmma tile's bytes (tile_io.h), and the 1024-byte alignment of the
 * kernel's four (at most 3 KiB of padding). */
static int32_t wg_tile_bytes(int rows, int width)
{
    return 2 * rows * aj_wgmma_tile_width(width);
}

static int32_t wg_pair_bytes(int rows, const fbwd_plan *p)
{
    return wg_tile_bytes(rows, p->d) + wg_tile_bytes(rows, p->dv);
}

static int32_t dkdv_smem(const fbwd_plan *p)
{
    if (p->wg)   /* K, V; the Q, dO ring; the stats; atomic dQ: the dS^T tile */
        return wg_pair_bytes(p->bn, p) + p->stages * wg_pair_bytes(p->bm, p) + 3 * 1024 +
               8 * p->bm + (p->deterministic ? 0 : tile_bytes(p->bn, p->bm));
    return tile_bytes(p->bn, p->d) + tile_bytes(p->bn, p->dv) +
           p->stages * (tile_bytes(p->bm, p->d) + tile_bytes(p->bm, p->dv)) +
           2 * tile_bytes(p->bn, p->bm) + 8 * p->bm;
}

static int32_t dq_smem(const fbwd_plan *p)
{
    if (p->wg)   /* its rows are the dkdv kernel's keys, its key tiles dkdv's row tiles */
        return wg_pair_bytes(p->bn, p) + p->stages * wg_pair_bytes(p->bm, p) + 3 * 1024 +
               8 * p->bn;
    return tile_bytes(p->bm, p->d) + tile_bytes(p->bm, p->dv) +
           p->stages * (tile_bytes(p->bn, p->d) + tile_bytes(p->bn, p->dv)) +
           tile_bytes(p->bm, p->bn) + 8 * p->bm;
}

/* The products of the kernels, M x N: S^T and dP^T, dV, dK, dQacc (dkdv);
 * S and dP, dQ (dq). */
enum { PROD_ST, PROD_DV, PROD_DK, PROD_DQ, PROD_S, N_PRODS };

static void product_dims(const fbwd_plan *p, int prod, int *m, int *n)
{
    const int dims[N_PRODS][2] = {{p->bn, p->bm}, {p->bn, p->dv}, {p->bn, p->d},
                                  {p->bm, p->d}, {p->bm, p->bn}};
    *m = dims[prod][0];
    *n = dims[prod][1];
}

/* Per-thread state of the kernel that holds the most, all products of a
 * kernel live at once: dkdv holds S^T, dP^T, dK, dV (and dQacc without
 * determinism), dq holds S, dP and dQ: f32 accumulators, each score
 * element a thread owns counting `per_elem` more for its option work. */
static int thread_state(const fbwd_plan *p, const warp_grid g[N_PRODS], int per_elem)
{
    int per[N_PRODS];
    for (int i = 0; i < N_PRODS; i++)
        per[i] = 4 * g[i].mt * g[i].nt;
    int dkdv = (2 + per_elem) * per[PROD_ST] + per[PROD_DV] + per[PROD_DK] +
               (p->deterministic ? 0 : per[PROD_DQ]);
    int dq = (2 + per_elem) * per[PROD_S] + per[PROD_DQ];
    return dkdv > dq ? dkdv : dq;
}

/* Registers of mma fragments a warp holds while it computes its widest
 * product: 2 per 8-column B tile, 4 per 16-row A strip.  A product of
 * many n8 tiles per warp (dV of 64 x 256 on 8 warps: 16) holds them all
 * through its k-loop, beside every accumulator. */
static int fragment_regs(const warp_grid g[N_PRODS])
{
    int most = 0;
    for (int i = 0; i < N_PRODS; i++) {
        int f = 2 * g[i].nt + 4 * g[i].mt;
        most = f > most ? f : most;
    }
    return most;
}

/* Registers the uneven shares cost (the share bounds, the inside test of
 * a short share's first tile): ptxas needs more at 232/248 on 32 x 32
 * tiles (29 and 31 tiles over 4 warp columns; 4 bytes spilled) than at
 * 256/256 (32 each; 248 registers, none). */
static int uneven_regs(const warp_grid g[N_PRODS])
{
    int regs = 0;
    for (int i = 0; i < N_PRODS; i++)
        regs += (g[i].n / 8) % g[i].wn != 0 ? UNEVEN_SHARE : 0;
    return regs;
}

/*
 * Default schedules, most preferred first, each with 2 stages and then 1
 * (for targets short of shared memory): 64 x 64 tiles on 4 warps, 8 warps
 * on narrower query tiles, narrower key blocks (32 x 32 on 8 warps keeps
 * every head dim within STATE_BUDGET); 16 x 16 tiles on 8 warps keep the
 * least state per thread (large D, Dv with dropout); the last, 16 x 16
 * tiles on 2 warps, need the least shared memory.
 */
static const aj_schedule default_candidates[] = {
    {.block_m = 64, .block_n = 64, .warps = 4, .stages = 2},
    {.block_m = 64, .block_n = 64, .warps = 4, .stages = 1},
    {.block_m = 32, .block_n = 64, .warps = 8, .stages = 2},
    {.block_m = 32, .block_n = 64, .warps = 8, .stages = 1},
    {.block_m = 32, .block_n = 32, .warps = 8, .stages = 2},
    {.block_m = 32, .block_n = 32, .warps = 8, .stages = 1},
    {.block_m = 64, .block_n = 32, .warps = 4, .stages = 2},
    {.block_m = 64, .block_n = 32, .warps = 4, .stages = 1},
    {.block_m = 32, .block_n = 32, .warps = 4, .stages = 2},
    {.block_m = 32, .block_n = 32, .warps = 4, .stages = 1},
#define N_MAIN_CANDIDATES 10 /* the rest are last resorts (aj_attn_plan_schedule) */
    {.block_m = 16, .block_n = 16, .warps = 8, .stages = 2},
    {.block_m = 16, .block_n = 16, .warps = 8, .stages = 1},
    {.block_m = 16, .block_n = 16, .warps = 2, .stages = 2},
    {.block_m = 16, .block_n = 16, .warps = 2, .stages = 1},
};

/* The plan's shared memory within the target's. */
static aj_status plan_smem(aj_ctx *ctx, aj_target target, const fbwd_plan *p)
{
    int32_t smem = dkdv_smem(p) > dq_smem(p) ? dkdv_smem(p) : dq_smem(p);
    if (smem > aj_target_smem_limit(target))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d, stages = %d needs %d bytes of "
                       "shared memory at head_dim %d/%d; %s allows %d", p->bm, p->bn,
                       p->stages, smem, p->d, p->dv, aj_target_name(target),
                       aj_target_smem_limit(target));
    return AJ_OK;
}

/*
 * The wgmma kernels' plan (schedule warpgroups = G; see "wgmma"): each
 * kernel owns block_n = 64 G of its dim on G warpgroups (dkdv: keys, dq:
 * query rows; split, dkdv's two warpgroups own the same 64 keys and dq
 * runs one) and walks the other in tiles of block_m (dkdv: query rows,
 * dq: keys; the dq stage's plan swaps the two, so that in each kernel
 * bm counts rows and bn keys).  Per thread, dkdv holds dK and dV (D / 2
 * + Dv / 2; split, past what one warpgroup holds: the larger of them)
 * with S^T and dP^T (block_m / 2 each), which become P^T and dS^T in
 * place; its atomic dQ product (mma.sync, after the GEMMs that free
 * them) takes their place; dq holds dQ (D / 2) with S and dP.
 */
static aj_status plan_wgmma(aj_ctx *ctx, const aj_op *op, aj_target target,
                            const aj_schedule *s, fbwd_plan *p)
{
    int g = p->wg = op->warpgroups;
    if (!aj_target_desc_of(target)->wgmma)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: warpgroups = %d needs wgmma, which %s lacks: target sm_90a "
                       "(or sim, which emulates it), or warpgroups = 0 for the mma.sync "
                       "template", g, aj_target_name(target));
    /* dK and dV in one warpgroup's registers up to key_dims, else split
     * over two, each up to key_dims */
    int key_dims = op->dropout > 0 ? WGMMA_KEY_DIMS_DROPOUT : WGMMA_KEY_DIMS;
    int most = p->d > p->dv ? p->d : p->dv;
    const char *with = op->dropout > 0 ? " with dropout" : "";
    p->split = p->d + p->dv > key_dims;
    if (p->split && most > key_dims)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "head_dim %d / head_dim_v %d: flash backward on wgmma keeps dK and dV in "
                       "registers, each up to %d%s; warpgroups = 0 (mma.sync) takes these",
                       p->d, p->dv, key_dims, with);
    if (p->split && g != 2)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "head_dim %d + head_dim_v %d: flash backward on wgmma keeps dK and dV in "
                       "registers, one warpgroup both up to %d%s: use warpgroups = 2 (they "
                       "split them) or 0 (mma.sync)", p->d, p->dv, key_dims, with);
    int rows = WARPGROUP_ROWS * (g >> p->split);
    p->bn = s->block_n ? s->block_n : rows;
    p->warps = s->warps ? s->warps : 4 * g;
    if (p->bn != rows || p->warps != 4 * g)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: warpgroups = %d runs flash backward's key blocks as block_n "
                       "= %d keys on warps = %d (%s), not block_n = %d, warps = %d", g, rows,
                       4 * g, p->split ? "both warpgroups on the same 64 keys: dK and dV are "
                                         "split between them"
                                       : "64 keys per warpgroup of 4 warps",
                       p->bn, p->warps);
    if (p->bm != 16 && p->bm != 32 && p->bm != 64)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d: flash backward on wgmma walks tiles of 16, 32 "
                       "or 64", p->bm);
    p->threads = 32 * p->warps;
    /* S^T and dP^T (block_m / 2 f32 each) and their 16-bit A fragments.
     * The atomic dQ product's accumulators (block_m x D over 4 G warps,
     * live after the GEMMs that free these) never exceed them: at most
     * block_m D / (128 G) <= 2 block_m. */
    int keys = p->split ? most / 2 : (p->d + p->dv) / 2, scores = 2 * p->bm;
    int state = p->state = keys + scores;   /* dq: D / 2 + the same */
    /* the element pass's option work per element of S^T and of dP^T
     * (alibi's and a window's per-element terms count too: measured on
     * sm_90a, test_sweep_ptxas_wgmma_bwd) */
    int per_elem = aj_attn_option_regs_per_element(op) + aj_attn_score_mod_regs_per_element(op) +
                   (op->score_mod.kind == AJ_SCORE_MOD_ALIBI) + (op->mask.kind == AJ_MASK_WINDOW);
    p->default_state = state + p->bm * per_elem + (op->dropout > 0 ? PHILOX_STATE : 0) +
                       (p->deterministic ? 0 : 8);   /* atomic dQ's addresses */
    if (state > WGMMA_STATE_BUDGET) {
        int fits = 0;   /* the widest tile that would fit */
        for (int bm = p->bm / 2; bm >= 16 && !fits; bm /= 2)
            fits = keys + 2 * bm <= WGMMA_STATE_BUDGET ? bm : 0;
        char use[32] = "";
        if (fits)
            snprintf(use, sizeof use, "block_m = %d or ", fits);
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d on wgmma keeps %d f32 values per "
                       "thread at head_dim %d/%d (dK and dV: %d, S and dP: %d; budget %d): use "
                       "%swarpgroups = 0 (mma.sync)", p->bm, p->bn, state, p->d, p->dv, keys,
                       scores, WGMMA_STATE_BUDGET, use);
    }
    return AJ_OK;
}

/* The plan of schedule `s`, or AJ_ERR_UNSUPPORTED naming the limit it
 * breaks (the message on ctx, which may be NULL). */
static aj_status plan_schedule(aj_ctx *ctx, const aj_op *op, aj_target target,
                               const aj_schedule *sched, void *out)
{
    fbwd_plan *p = out;
    aj_schedule s = *sched;
    memset(p, 0, sizeof *p);
    p->dtype = op->dtype;
    p->d = op->head_dim;
    p->dv = aj_op_dv(op);
    p->deterministic = op->deterministic;
    p->bm = s.block_m;
    p->bn = s.block_n;
    p->warps = s.warps;
    p->stages = s.stages;
    if (p->stages < 1 || p->stages > 2)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: stages = %d: flash backward supports 1 or 2", p->stages);
    if (op->warpgroups) {
        aj_status st = plan_wgmma(ctx, op, target, &s, p);
        return st != AJ_OK ? st : plan_smem(ctx, target, p);
    }
    if (!in_list(p->bm, block_values, 4) || !in_list(p->bn, block_values, 4))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d: flash backward supports "
                       "16, 32, 64 or 128 for each", p->bm, p->bn);
    if (!in_list(p->warps, warp_values, 4))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: warps = %d: flash backward supports 1, 2, 4 or 8",
                       p->warps);
    p->threads = 32 * p->warps;
    warp_grid g[N_PRODS];
    for (int i = 0; i < N_PRODS; i++) {
        int m, n;
        product_dims(p, i, &m, &n);
        if (!warp_grid_for(m, n, p->warps, &g[i]))
            return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                           "schedule: block_m = %d, block_n = %d, warps = %d cannot tile a "
                           "%d x %d product at head_dim %d/%d (each warp takes 1 to %d whole "
                           "16-row strips and 1 to %d whole 8-column tiles); use the defaults",
                           p->bm, p->bn, p->warps, m, n, p->d, p->dv, MAX_MT, MAX_NT);
    }
    int state = p->state = thread_state(p, g, 0);
    p->default_state = thread_state(p, g,
                                    aj_attn_option_regs_per_element(op) +
                                        aj_attn_score_mod_regs_per_element(op)) +
                       fragment_regs(g) + uneven_regs(g) + (op->dropout > 0 ? PHILOX_STATE : 0);
    if (p->stages > 1 && (p->d > WIDE_HEAD_DIM || p->dv > WIDE_HEAD_DIM))
        p->default_state += WIDE_STAGE_REGS;
    if (state > STATE_BUDGET)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "schedule: block_m = %d, block_n = %d, warps = %d needs %d f32 "
                       "accumulators per thread at head_dim %d/%d (budget %d); use smaller "
                       "tiles or more warps", p->bm, p->bn, p->warps, state, p->d, p->dv,
                       STATE_BUDGET);
    return plan_smem(ctx, target, p);
}

/*
 * The op's schedule over a default candidate: the first that plan_schedule
 * accepts with at most DEFAULT_STATE of state per thread (accumulators,
 * the element pass's option work, thread_state, and the widest product's
 * mma fragments, fragment_regs, uneven shares, uneven_regs, and dropout's
 * Philox state), else the
 * first within DEFAULT_LIMIT, else the accepted one with the least (16 x 16
 * on 8 warps); when none fits, the first one's failure
 * (aj_attn_plan_schedule).  The headroom below STATE_BUDGET is for what
 * the count leaves out (addresses, score-mod values): ptxas spills at the
 * budget's edge where the defaults must not.  The fragments matter for
 * D != Dv far apart (8/256 took 32 x 64 tiles and spilled 56 bytes; now
 * 32 x 32, none); the limit keeps 32 x 32 for head dim 256 without
 * dropout (248 registers on sm_90, no spills) where dropout at 208/88
 * spilled on it and takes 16 x 16 on 8 warps.
 */
static int plan_state(const void *plan)
{
    return ((const fbwd_plan *)plan)->default_state;
}

/* The wgmma kernels' (schedule warpgroups = G): block_n and warps follow
 * G; the widest walked tile whose state with the element pass's option
 * work is within WGMMA_DEFAULT_STATE (plan_wgmma). */
static const aj_schedule wgmma_candidates[] = {
    {.block_m = 64, .stages = 2}, {.block_m = 64, .stages = 1},
    {.block_m = 32, .stages = 2}, {.block_m = 32, .stages = 1},
    {.block_m = 16, .stages = 2}, {.block_m = 16, .stages = 1},
};

static aj_status plan_kernel(aj_ctx *ctx, const aj_op *op, aj_target target, fbwd_plan *p)
{
    int wg = op->warpgroups != 0;
    const aj_attn_schedule_rule rule = {
        .candidates = wg ? wgmma_candidates : default_candidates,
        .n = wg ? (int)(sizeof wgmma_candidates / sizeof wgmma_candidates[0])
                : (int)(sizeof default_candidates / sizeof default_candidates[0]),
        .plan = plan_schedule,
        .state = plan_state,
        .state_goal = wg ? WGMMA_DEFAULT_STATE : DEFAULT_STATE,
        .state_limit = wg ? WGMMA_DEFAULT_STATE : DEFAULT_LIMIT,
        .n_main = wg ? 0 : N_MAIN_CANDIDATES,
    };
    return aj_attn_plan_schedule(ctx, op, target, &rule, p);
}

static aj_status fbwd_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    if (op->dtype == AJ_DTYPE_F32)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "dtype = f32: flash backward runs on tensor cores and takes f16 or "
                       "bf16; use `attention backward efficient` for f32");
    aj_status st = op->warpgroups ? aj_attn_check_dims(ctx, op, "flash backward on wgmma "
                                                       "(schedule warpgroups)",
                                                       AJ_HEAD_DIM_MAX_GPU)
                                  : aj_attn_check_dims(ctx, op, "flash backward",
                                                       AJ_HEAD_DIM_MAX_FLASH);
    fbwd_plan plan;
    return st != AJ_OK ? st : aj_kctx_check_planned(ctx, op, plan_kernel(ctx, op, target, &plan));
}

/* ---------------------------------------------------------------- shared */

/* A tile of 16-bit elements in shared memory: element (r, c) at byte
 * off + 2 (r ld + c), or (wgmma, span != 0) a wgmma tile of rows x
 * width (tile_io.h) with ld = aj_wgmma_tile_width(width); off may be
 * chosen at run time (double buffers). */
typedef struct smem_tile {
    LLVMValueRef off;   /* i32 */
    int ld;
    int rows, width, span;
} smem_tile;

/* Everything the emitters share; one per kernel. */
typedef struct fbwd {
    AJ_KCTX;                              /* skeleton.h */
    fbwd_plan p;
    LLVMValueRef warp, lane, g, t;        /* i32: lane = 4 g + t */
    LLVMValueRef wgi;                     /* i32: the warpgroup (wgmma) */
    LLVMValueRef wg_row;                  /* i32: its 64 rows' group (split: 0) */
    LLVMValueRef bidx;                    /* i32: batch (varlen: sequence) */
    LLVMValueRef q_start, k_start;        /* i64: first packed row (varlen), else 0 */
    LLVMValueRef sq, sk;                  /* i64: the programs' totals (NULL: unread) */
} fbwd;

/* Thread layout and the batch (or sequence) of the CTA: lengths, packed
 * starts and the programs' totals that follow from them. */
static void setup(fbwd *f, aj_kb *kb, const aj_op *op, const fbwd_plan *p,
                  const aj_score_prog *prog)
{
    memset(f, 0, sizeof *f);
    aj_kctx_init(&f->k, kb, op, prog);
    f->p = *p;
    f->tid = aj_kb_thread_id(kb);
    f->warp = LLVMBuildLShr(f->b, f->tid, aj_kb_i32(f->kb, 5), "warp");
    f->lane = LLVMBuildAnd(f->b, f->tid, aj_kb_i32(f->kb, 31), "lane");
    f->g = LLVMBuildLShr(f->b, f->lane, aj_kb_i32(f->kb, 2), "g");
    f->t = LLVMBuildAnd(f->b, f->lane, aj_kb_i32(f->kb, 3), "t");
    if (p->wg) {
        f->wgi = LLVMBuildLShr(f->b, f->tid, aj_kb_i32(f->kb, 7), "wg");
        f->wg_row = p->split ? aj_kb_i32(f->kb, 0) : f->wgi;
    }
    f->bidx = aj_kb_block_id(kb, 2);
    aj_kctx_sequence(&f->k, f->bidx, &f->q_start, &f->k_start);
    aj_attn_score_totals(kb, prog, op->layout, f->seq_q, f->seq_k, &f->sq, &f->sk);
}

/* Per-(batch, query head) state: the score programs' and the dropout
 * stream.  The band (score.h) does not depend on the head, so the ranges
 * a kernel computes before its head loop hold for every head. */
static void set_head(fbwd *f, LLVMValueRef h)
{
    aj_kctx_set_head(&f->k, f->bidx, h, f->sq, f->sk);
}

/* Element offset (i64) of row 0 of slice (b, h) of tensor t; `start` is
 * the sequence's first packed row (0 for padded tensors). */
static LLVMValueRef row0_base(fbwd *f, aj_param_source t, LLVMValueRef h, LLVMValueRef start)
{
    return aj_kb_add(f->kb, aj_attn_slice_base(f->kb, t, f->bidx, h),
                     aj_kb_mul(f->kb, start, aj_param_stride_s(f->kb, t)));
}

/* Workspace float index of Delta_0 of (b, h). */
static LLVMValueRef ws_row0(fbwd *f, LLVMValueRef h)
{
    return aj_attn_ws_row(f->kb, f->bidx, h, f->q_start);
}

static LLVMValueRef ws_ptr(fbwd *f, LLVMValueRef float_index)
{
    return aj_kb_gptr_offset(f->kb, aj_param(f->kb, AJ_PID(workspace)),
                             aj_kb_mul(f->kb, float_index, aj_kb_i64(f->kb, 4)));
}

/* Byte pointer of element (row, col) of a shared tile. */
static LLVMValueRef tile_ptr(fbwd *f, smem_tile tile, LLVMValueRef row, LLVMValueRef col)
{
    if (tile.span)
        return aj_kb_smem_ptr(f->kb, aj_kb_add(f->kb, tile.off, aj_wgmma_tile_offset(
                                                                     f->kb, row, col,
                                                                     tile.rows, tile.width)));
    LLVMValueRef e = aj_kb_add(f->kb, aj_kb_mul(f->kb, row, aj_kb_i32(f->kb, tile.ld)), col);
    return aj_kb_smem_ptr(
        f->kb, aj_kb_add(f->kb, tile.off, LLVMBuildShl(f->b, e, aj_kb_i32(f->kb, 1), "")));
}

/* `copies` tiles of rows x width, wgmma's layout where `wgmma`. */
static smem_tile reserve_tile(fbwd *f, int rows, int width, int copies, int wgmma)
{
    if (!wgmma) {
        int32_t off = aj_kb_smem_reserve(f->kb, copies * tile_bytes(rows, width));
        return (smem_tile){aj_kb_i32(f->kb, off), aj_mma_tile_ld(width), rows, width, 0};
    }
    int32_t off = aj_kb_smem_reserve_aligned(f->kb, copies * wg_tile_bytes(rows, width), 1024);
    return (smem_tile){aj_kb_i32(f->kb, off), aj_wgmma_tile_width(width), rows, width,
                       aj_wgmma_panel_span(width)};
}

static smem_tile tile_copy(fbwd *f, smem_tile tile, int rows, LLVMValueRef which);

/* The pad columns of `rows` rows (every copy) of a tile, zeroed before
 * the kernel's first barrier; see aj_mma_tile_zero_pad (wgmma: the 8
 * columns past an odd multiple of 8, tile_io.h; generic stores, fenced
 * with the copies). */
static void zero_pads(fbwd *f, smem_tile tile, int rows, int width)
{
    aj_kb *kb = f->kb;
    if (!tile.span) {
        aj_mma_tile_zero_pad(kb, tile.off, rows, width, f->tid, f->p.threads);
        return;
    }
    if (width % 16 == 0)
        return;
    LLVMValueRef zero = LLVMConstNull(LLVMVectorType(kb->t_i32, 4));
    for (int c = 0; c < rows / tile.rows; c++) {
        smem_tile t = tile_copy(f, tile, tile.rows, aj_kb_i32(kb, c));
        LLVMValueRef r = aj_kb_for_begin(kb, f->tid, aj_kb_i32(kb, tile.rows),
                                         aj_kb_i32(kb, f->p.threads), "pad");
        aj_kb_store(kb, zero, tile_ptr(f, t, r, aj_kb_i32(kb, width)), 16);
        aj_kb_for_end(kb);
    }
}

/* Copy `which` (0 or 1) of a double-buffered tile. */
static smem_tile tile_copy(fbwd *f, smem_tile tile, int rows, LLVMValueRef which)
{
    LLVMValueRef step = aj_kb_mul(f->kb, which, aj_kb_i32(f->kb, 2 * rows * tile.ld));
    tile.off = aj_kb_add(f->kb, tile.off, step);
    return tile;
}

/*
 * Issues cp.async copies of `rows` rows of `width` elements of tensor t
 * (rows row0 .. of the slice at element `base`) into a shared tile, 16
 * bytes per copy; rows at or past `limit` are zero-filled (their source is
 * row 0, read for 0 bytes).  The caller commits and waits.
 */
static void load_tile(fbwd *f, aj_param_source t, LLVMValueRef base, LLVMValueRef row0,
                      LLVMValueRef limit, int rows, int width, smem_tile tile)
{
    aj_kb *kb = f->kb;
    LLVMBuilderRef b = f->b;
    int per_row = width / 8, chunks = rows * per_row;
    for (int x = 0; x < (chunks + f->p.threads - 1) / f->p.threads; x++) {
        LLVMValueRef c = aj_kb_add(kb, f->tid, aj_kb_i32(kb, (int64_t)x * f->p.threads));
        int guard = (x + 1) * f->p.threads > chunks;
        if (guard)
            aj_kb_if_begin(kb, aj_kb_slt(kb, c, aj_kb_i32(kb, chunks)));
        LLVMValueRef row = LLVMBuildUDiv(b, c, aj_kb_i32(kb, per_row), "");
        LLVMValueRef col =
            aj_kb_mul(kb, LLVMBuildURem(b, c, aj_kb_i32(kb, per_row), ""), aj_kb_i32(kb, 8));
        LLVMValueRef grow = aj_kb_add(kb, row0, row);
        LLVMValueRef valid = aj_kb_slt(kb, grow, limit);
        LLVMValueRef srow = LLVMBuildSelect(b, valid, grow, aj_kb_i32(kb, 0), "");
        LLVMValueRef elem = aj_kb_add(
            f->kb,
            aj_kb_add(kb, base, aj_kb_mul(kb, aj_kb_sext64(kb, srow), aj_param_stride_s(kb, t))),
            aj_kb_sext64(kb, col));
        LLVMValueRef src =
            aj_kb_gptr_offset(kb, aj_param_data(kb, t), aj_kb_mul(kb, elem, aj_kb_i64(kb, 2)));
        LLVMValueRef bytes = LLVMBuildSelect(b, valid, aj_kb_i32(kb, 16), aj_kb_i32(kb, 0), "");
        aj_kb_cp_async_16(kb, tile_ptr(f, tile, row, col), src, bytes);
        if (guard)
            aj_kb_if_end(kb);
    }
}

/* A warp's accumulators: acc[a][c][r], strip a, column tile c, register r
 * of the mma C fragment (aj_kb_mma_m16n8k16). */
typedef struct warp_acc {
    warp_grid g;
    LLVMValueRef row0, col0;   /* i32: the warp's first output row, column */
    LLVMValueRef col_own;      /* i32: the first column of the warp's share */
    LLVMValueRef v[MAX_MT][MAX_NT][4];
    LLVMValueRef arr;          /* wgmma: its accumulator array, [n / 2 x f32] */
} warp_acc;

/* ceil(c T / wn), in columns: the first column of warp column c's share. */
static LLVMValueRef share_start(fbwd *f, const warp_grid *g, LLVMValueRef c)
{
    LLVMValueRef t = aj_kb_add(f->kb, aj_kb_mul(f->kb, c, aj_kb_i32(f->kb, g->n / 8)),
                               aj_kb_i32(f->kb, g->wn - 1));
    return aj_kb_mul(f->kb, LLVMBuildUDiv(f->b, t, aj_kb_i32(f->kb, g->wn), ""),
                     aj_kb_i32(f->kb, 8));
}

/* The first row and column of this warp's part of an M x N product, and
 * where its share starts (warp_grid_for). */
static void warp_origin(fbwd *f, warp_acc *acc)
{
    const warp_grid *g = &acc->g;
    LLVMValueRef warp = f->warp;
    if (g->replicas > 1)
        warp = LLVMBuildURem(f->b, warp, aj_kb_i32(f->kb, g->wm * g->wn), "");
    LLVMValueRef wr = LLVMBuildURem(f->b, warp, aj_kb_i32(f->kb, g->wm), "");
    LLVMValueRef wc = LLVMBuildUDiv(f->b, warp, aj_kb_i32(f->kb, g->wm), "");
    acc->row0 = aj_kb_mul(f->kb, wr, aj_kb_i32(f->kb, 16 * g->mt));
    acc->col_own = share_start(f, g, wc);
    LLVMValueRef end = share_start(f, g, aj_kb_add(f->kb, wc, aj_kb_i32(f->kb, 1)));
    acc->col0 = LLVMBuildSub(f->b, end, aj_kb_i32(f->kb, 8 * g->nt), "");
}

/* An M x N product over the warps, computed `replicas` times over (each
 * warpgroup of the split dkdv kernel: its S^T and dP^T, dK and dV). */
static void acc_init(fbwd *f, warp_acc *acc, int m, int n, const char *name, int replicas)
{
    warp_grid_for(m, n, f->p.warps / replicas, &acc->g);
    acc->g.replicas = replicas;
    warp_origin(f, acc);
    for (int a = 0; a < acc->g.mt; a++)
        for (int c = 0; c < acc->g.nt; c++)
            for (int r = 0; r < 4; r++)
                acc->v[a][c][r] = aj_kb_var(f->kb, f->kb->t_f32, aj_kb_f32(f->kb, 0), name);
    /* wgmma's products: a strip of 16 rows a warp over all N (see "wgmma") */
    int wgmma = f->p.wg && acc->g.wm * replicas == f->p.warps && acc->g.mt == 1;
    acc->arr = wgmma ? aj_kb_var(f->kb, LLVMArrayType2(f->kb->t_f32, (uint64_t)n / 2), NULL, name)
                     : NULL;
}

/* The first n columns of acc's registers as a product of its own (the
 * split dkdv kernel's dK and dV: one set of registers, a role each), with
 * its own wgmma array. */
static warp_acc acc_view(fbwd *f, const warp_acc *acc, int n, const char *name)
{
    warp_acc v = *acc;
    v.g.n = n;
    v.g.nt = n / 8;
    v.arr = aj_kb_var(f->kb, LLVMArrayType2(f->kb->t_f32, (uint64_t)n / 2), NULL, name);
    return v;
}

static void acc_zero(fbwd *f, warp_acc *acc)
{
    for (int a = 0; a < acc->g.mt; a++)
        for (int c = 0; c < acc->g.nt; c++)
            for (int r = 0; r < 4; r++)
                aj_kb_set(f->kb, acc->v[a][c][r], aj_kb_f32(f->kb, 0));
}

/* Row and column (in the product) of register r of tile (a, c):
 *
 *   lane 4g + t:   c[0] (g, 2t)   c[1] (g, 2t + 1)   c[2] (g + 8, 2t)   c[3] (g + 8, 2t + 1)
 */
static LLVMValueRef acc_row(fbwd *f, const warp_acc *acc, int a, int r)
{
    return aj_kb_add(f->kb, aj_kb_add(f->kb, acc->row0, f->g),
                     aj_kb_i32(f->kb, 16 * a + 8 * (r >> 1)));
}

static LLVMValueRef acc_col(fbwd *f, const warp_acc *acc, int c, int r)
{
    return aj_kb_add(f->kb,
                     aj_kb_add(f->kb, acc->col0, LLVMBuildShl(f->b, f->t, aj_kb_i32(f->kb, 1), "")),
                     aj_kb_i32(f->kb, 8 * c + (r & 1)));
}

/* An mma operand in shared memory.  kmajor = 0: A[m][k] is tile(m, k),
 * B[k][n] is tile(n, k) (both stored along k, plain ldmatrix); kmajor = 1:
 * A[m][k] is tile(k, m), B[k][n] is tile(k, n) (ldmatrix .trans). */
typedef struct operand {
    smem_tile tile;
    int kmajor;
    LLVMValueRef origin;   /* i32: first row (A) or column (B) of the operand in the tile */
    const warp_acc *regs;  /* wgmma's A in registers: this accumulator, its columns k */
} operand;

/* A whole tile as an operand (origin 0). */
static operand tile_op(fbwd *f, smem_tile tile, int kmajor)
{
    return (operand){tile, kmajor, aj_kb_i32(f->kb, 0), NULL};
}

/*
 * acc += A B over k = 0 .. kdim - 1 for the warp's part of the product,
 * in steps of 16: a kdim that is an odd multiple of 8 (a head dim) ends
 * in the zero pad columns of both operands' tiles.
 * One ldmatrix .x4 loads a 16 x 16 A fragment or the B fragments of two
 * 8-column tiles; lane 8 m + r addresses row r of 8 x 8 matrix m:
 *
 *   A, m = 0..3:  rows +0 / +8 (m & 1), k +0 / +8 (m >> 1)   -> a[m]
 *   B, m = 0..3:  k +0 / +8 (m & 1), columns +0 / +8 (m >> 1) -> b[m >> 1][m & 1]
 */
static void warp_mma(fbwd *f, warp_acc *acc, int kdim, const operand *A, const operand *B)
{
    aj_kb *kb = f->kb;
    LLVMBuilderRef b = f->b;
    const warp_grid *g = &acc->g;
    LLVMValueRef lr = LLVMBuildAnd(b, f->lane, aj_kb_i32(kb, 7), "");
    LLVMValueRef l8 =
        LLVMBuildAnd(b, LLVMBuildLShr(b, f->lane, aj_kb_i32(kb, 3), ""), aj_kb_i32(kb, 1), "");
    LLVMValueRef l16 = LLVMBuildLShr(b, f->lane, aj_kb_i32(kb, 4), "");
    LLVMValueRef e8 = LLVMBuildShl(b, l8, aj_kb_i32(kb, 3), ""),
                 e16 = LLVMBuildShl(b, l16, aj_kb_i32(kb, 3), "");
    LLVMValueRef ks = aj_kb_for_begin(
        kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, aj_mma_k_width(kdim) / 16), aj_kb_i32(kb, 1), "ks");
    LLVMValueRef k0 = LLVMBuildShl(b, ks, aj_kb_i32(kb, 4), "k0");
    LLVMValueRef af[MAX_MT][4], bf[MAX_NT][2];
    for (int a = 0; a < g->mt; a++) {
        LLVMValueRef m0 = aj_kb_add(kb, aj_kb_add(kb, A->origin, acc->row0), aj_kb_i32(kb, 16 * a));
        LLVMValueRef row, col;
        if (!A->kmajor) {
            row = aj_kb_add(kb, aj_kb_add(kb, m0, lr), e8);
            col = aj_kb_add(kb, k0, e16);
        } else {
            row = aj_kb_add(kb, aj_kb_add(kb, k0, e16), lr);
            col = aj_kb_add(kb, m0, e8);
        }
        aj_kb_ldmatrix(kb, 4, A->kmajor, tile_ptr(f, A->tile, row, col), af[a]);
    }
    for (int c = 0; c < g->nt; c += 2) {
        LLVMValueRef n0 = aj_kb_add(kb, aj_kb_add(kb, B->origin, acc->col0), aj_kb_i32(kb, 8 * c));
        int pair = c + 1 < g->nt;
        LLVMValueRef nsel = pair ? e16 : aj_kb_i32(kb, 0);
        LLVMValueRef row, col, out[4];
        if (!B->kmajor) {
            row = aj_kb_add(kb, aj_kb_add(kb, n0, nsel), lr);
            col = aj_kb_add(kb, k0, e8);
        } else {
            row = aj_kb_add(kb, aj_kb_add(kb, k0, e8), lr);
            col = aj_kb_add(kb, n0, nsel);
        }
        aj_kb_ldmatrix(kb, pair ? 4 : 2, B->kmajor, tile_ptr(f, B->tile, row, col), out);
        bf[c][0] = out[0];
        bf[c][1] = out[1];
        if (pair) {
            bf[c + 1][0] = out[2];
            bf[c + 1][1] = out[3];
        }
    }
    for (int a = 0; a < g->mt; a++)
        for (int c = 0; c < g->nt; c++) {
            LLVMValueRef cin[4], d[4];
            for (int r = 0; r < 4; r++)
                cin[r] = aj_kb_get(kb, acc->v[a][c][r]);
            aj_kb_mma_m16n8k16(kb, f->p.dtype, af[a], bf[c], cin, d);
            for (int r = 0; r < 4; r++)
                aj_kb_set(kb, acc->v[a][c][r], d[r]);
        }
    aj_kb_for_end(kb);
}

/* Two f32 values as one i32 of two dtype elements, the first in the low half. */
static LLVMValueRef pack2(fbwd *f, LLVMValueRef lo, LLVMValueRef hi)
{
    LLVMBuilderRef b = f->b;
    LLVMValueRef l = LLVMBuildZExt(b, aj_kb_from_f32(f->kb, lo, f->p.dtype), f->kb->t_i32, "");
    LLVMValueRef h = LLVMBuildZExt(b, aj_kb_from_f32(f->kb, hi, f->p.dtype), f->kb->t_i32, "");
    return LLVMBuildOr(b, l, LLVMBuildShl(b, h, aj_kb_i32(f->kb, 16), ""), "");
}

/* ---------------------------------------------------------------- wgmma */

/*
 * wgmma (schedule warpgroups = G, sm_90a and sim): the same kernels with
 * every product of 64-row strips on wgmma.mma_async.  A product's warp
 * grid is then 4 warps a warpgroup down M, one 16-row strip each over all
 * N columns -- wgmma's accumulator layout, warp by warp mma.sync's C
 * fragment of n8 tiles (register 4 c + r = v[0][c][r]) -- so the element
 * pass, the stores and the dQ red.add are the mma.sync kernels'.
 * Q, dO, K and V are wgmma tiles (tile_io.h: swizzled panels) that the
 * cp.async pipe fills; each thread fences the async proxy after its
 * copies land, before the barrier that hands them to wgmma.
 *
 *   dkdv (G warpgroups, warpgroup w keys 64 w ..; split, past D + Dv =
 *   256: two warpgroups on the same 64 keys, both computing S^T and
 *   dP^T, warpgroup 0 keeping dV and 1 dK in one set of registers):
 *     S^T = K Q^T, dP^T = V dO^T   A = K, V from w's rows, B = Q, dO: both K-major
 *     P^T, dS^T                    in place, in the accumulators
 *     dV += P^T dO, dK += dS^T Q   A = P^T, dS^T in registers (repacked as
 *                                  the A fragment), B = dO, Q N-major
 *     atomic dQ                    dS^T to a shared tile, dQacc += dS K on
 *                                  mma.sync as before (K's ldmatrix reads
 *                                  the swizzled tile)
 *   dq (block_m / 64 warpgroups):
 *     S = Q K^T, dP = dO V^T       K-major, as above
 *     dQ += dS K                   A = dS in registers, B = K N-major
 *
 * A step's two GEMMs (S^T and dP^T; dV and dK; S and dP) are each fenced
 * and committed, the second issued behind the first, and waited for
 * together; the accumulators pass through the products' variables around
 * them.
 */

/* A's k-step kk (16 columns of the accumulator `a`) as the A fragment:
 * n8 tiles 2 kk and 2 kk + 1, rows g and g + 8. */
static void pack_a(fbwd *f, const warp_acc *a, int kk, LLVMValueRef out[4])
{
    for (int x = 0; x < 4; x++) {
        const LLVMValueRef *v = a->v[0][2 * kk + (x >> 1)];
        int r = 2 * (x & 1);
        out[x] = pack2(f, aj_kb_get(f->kb, v[r]), aj_kb_get(f->kb, v[r + 1]));
    }
}

/* One product of a step: acc += A B over k = 0 .. kdim - 1. */
typedef struct gemm {
    warp_acc *acc;
    int kdim;
    operand A, B;
} gemm;

/* acc (+)= A B on wgmma, issued and committed: the warpgroup's 64 rows of
 * M; `fresh`: acc = A B. */
static void wg_issue(fbwd *f, const gemm *g, int fresh)
{
    warp_acc *acc = g->acc;
    const operand *A = &g->A, *B = &g->B;
    int kdim = g->kdim;
    aj_kb *kb = f->kb;
    enum aj_intrinsic_id row =
        aj_kb_wgmma_row(acc->g.n, f->p.dtype, f->p.dtype, A->regs != NULL, B->kmajor);
    if (!fresh)
        aj_kb_wgmma_put(kb, acc->arr, acc->g.n / 8, acc->v[0]);
    int steps = aj_mma_k_width(kdim) / 16;
    LLVMValueRef a_base = NULL, a[MAX_NT / 2][4];
    if (!A->regs)   /* the warpgroup's first row, in every panel */
        a_base = aj_kb_add(kb, A->tile.off,
                           aj_kb_mul(kb, f->wg_row, aj_kb_i32(kb, WARPGROUP_ROWS * A->tile.span)));
    /* A's registers are packed before the fence: ptxas would otherwise
     * fence again before each wgmma that reads a register written after
     * the last (C7519) */
    for (int kk = 0; A->regs && kk < steps; kk++)
        pack_a(f, A->regs, kk, a[kk]);
    /* the tiles' k-step descriptors from one opaque base each: a tile the
     * walk does not move (dkdv's K and V, dq's Q and dO) would otherwise
     * have all of them hoisted out of the walk and held in registers */
    const smem_tile *bt = &B->tile;
    LLVMValueRef b0 = aj_kb_opaque(kb, B->kmajor ? aj_wgmma_nmajor_desc(kb, bt->off, bt->rows,
                                                                         bt->width, 0, 0)
                                                 : aj_wgmma_kmajor_desc(kb, bt->off, bt->rows,
                                                                        bt->width, 0));
    LLVMValueRef a0 = A->regs ? NULL
                              : aj_kb_opaque(kb, aj_wgmma_kmajor_desc(kb, a_base, A->tile.rows,
                                                                      A->tile.width, 0));
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_FENCE, NULL);
    for (int kk = 0; kk < steps; kk++) {
        LLVMValueRef b_desc =
            B->kmajor ? aj_wgmma_nmajor_step(kb, b0, bt->width, 16 * kk)
                      : aj_wgmma_kmajor_step(kb, b0, bt->rows, bt->width, 16 * kk);
        LLVMValueRef scale = aj_kb_i32(kb, !fresh || kk > 0);
        if (A->regs) {
            LLVMValueRef args[6] = {a[kk][0], a[kk][1], a[kk][2], a[kk][3], b_desc, scale};
            aj_kb_wgmma(kb, row, acc->arr, args);
        } else {
            LLVMValueRef args[3] = {
                aj_wgmma_kmajor_step(kb, a0, A->tile.rows, A->tile.width, 16 * kk), b_desc, scale};
            aj_kb_wgmma(kb, row, acc->arr, args);
        }
    }
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_COMMIT_GROUP, NULL);
}

/* The step's n products (at most 2) on the kernel's tensor cores, in
 * order; `fresh`: each acc is zero (wgmma does not read it).  On wgmma
 * they are issued one after the other and waited for together, so that
 * the second runs behind the first. */
static void products(fbwd *f, const gemm *g, int n, int fresh)
{
    aj_kb *kb = f->kb;
    if (!f->p.wg) {
        for (int i = 0; i < n; i++)
            warp_mma(f, g[i].acc, g[i].kdim, &g[i].A, &g[i].B);
        return;
    }
    LLVMValueRef arrs[2];
    for (int i = 0; i < n; i++) {
        wg_issue(f, &g[i], fresh);
        arrs[i] = g[i].acc->arr;
    }
    aj_kb_wgmma_wait(kb, 0, arrs, n);
    for (int i = 0; i < n; i++)
        aj_kb_wgmma_take(kb, g[i].acc->arr, g[i].acc->g.n / 8, g[i].acc->v[0]);
}

/* Whether the warp's column tile c is one of its share (NULL: every
 * warp's is); only a short share's first tile is not (warp_grid_for).
 * The test is uniform over the warp. */
static LLVMValueRef acc_tile_inside(fbwd *f, const warp_acc *acc, int c)
{
    if (c > 0 || acc->g.n / 8 % acc->g.wn == 0)
        return NULL;
    return LLVMBuildICmp(f->b, LLVMIntSGE, acc->col0, acc->col_own, "");
}

/* Stores the accumulators (times `mult`) to rows of tensor t: product row
 * r is tensor row row0 + r of the slice at element `base`, skipped at or
 * past `limit`; columns are the head dim, exactly. */
static void store_acc(fbwd *f, const warp_acc *acc, aj_param_source t, LLVMValueRef base,
                      LLVMValueRef row0, LLVMValueRef limit, double mult)
{
    aj_kb *kb = f->kb;
    for (int a = 0; a < acc->g.mt; a++)
        for (int half = 0; half < 2; half++) {
            LLVMValueRef row = aj_kb_add(kb, row0, acc_row(f, acc, a, 2 * half));
            aj_kb_if_begin(kb, aj_kb_slt(kb, row, limit));
            LLVMValueRef rbase =
                aj_kb_add(kb, base, aj_kb_mul(kb, aj_kb_sext64(kb, row), aj_param_stride_s(kb, t)));
            for (int c = 0; c < acc->g.nt; c++) {
                LLVMValueRef inside = acc_tile_inside(f, acc, c);
                if (inside)
                    aj_kb_if_begin(kb, inside);
                LLVMValueRef v[2];
                for (int x = 0; x < 2; x++) {
                    v[x] = aj_kb_get(kb, acc->v[a][c][2 * half + x]);
                    if (mult != 1.0)
                        v[x] = LLVMBuildFMul(f->b, v[x], aj_kb_f32(kb, mult), "");
                }
                LLVMValueRef elem = aj_kb_add(kb, rbase, aj_kb_sext64(kb, acc_col(f, acc, c, 0)));
                aj_kb_store(kb, pack2(f, v[0], v[1]),
                            aj_kb_gptr_offset(kb, aj_param_data(kb, t),
                                              aj_kb_mul(kb, elem, aj_kb_i64(kb, 2))),
                            4);
                if (inside)
                    aj_kb_if_end(kb);
            }
            aj_kb_if_end(kb);
        }
}

/* LSE (log2 units) and Delta of query rows m0 .. m0 + rows - 1 into
 * shared memory as stats[0 .. rows) and stats[rows .. 2 rows); rows past
 * the sequence (which see no key) read row Sq - 1 and keep 0.  The
 * caller runs this only with Sq > 0. */
static void load_stats(fbwd *f, LLVMValueRef h, LLVMValueRef m0, int rows, int32_t stats)
{
    aj_kb *kb = f->kb;
    LLVMBuilderRef b = f->b;
    LLVMValueRef zero = aj_kb_f32(kb, 0);
    for (int x = 0; x < (rows + f->p.threads - 1) / f->p.threads; x++) {
        LLVMValueRef r = aj_kb_add(kb, f->tid, aj_kb_i32(kb, (int64_t)x * f->p.threads));
        int guard = (x + 1) * f->p.threads > rows;
        if (guard)
            aj_kb_if_begin(kb, aj_kb_slt(kb, r, aj_kb_i32(kb, rows)));
        LLVMValueRef i = aj_kb_add(kb, m0, r);
        LLVMValueRef valid = aj_kb_slt(kb, i, f->seq_q);
        LLVMValueRef ic =
            aj_kb_sext64(f->kb, aj_kb_smin(kb, i, LLVMBuildSub(b, f->seq_q, aj_kb_i32(kb, 1), "")));
        LLVMValueRef lse_at = aj_kb_add(
            f->kb, aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_lse, f->bidx, h), f->q_start), ic);
        LLVMValueRef lse = aj_kb_load(kb, kb->t_f32,
                                      aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(lse)),
                                                        aj_kb_mul(kb, lse_at, aj_kb_i64(kb, 4))),
                                      4);
        LLVMValueRef delta =
            aj_kb_load(kb, kb->t_f32, ws_ptr(f, aj_kb_add(kb, ws_row0(f, h), ic)), 4);
        LLVMValueRef lse2 = LLVMBuildFMul(b, lse, aj_kb_f32(kb, AJ_LOG2E), "");
        LLVMValueRef at =
            aj_kb_add(kb, aj_kb_i32(kb, stats), LLVMBuildShl(b, r, aj_kb_i32(kb, 2), ""));
        aj_kb_store(kb, LLVMBuildSelect(b, valid, lse2, zero, ""), aj_kb_smem_ptr(kb, at), 4);
        at = aj_kb_add(kb, at, aj_kb_i32(kb, 4 * rows));
        aj_kb_store(kb, LLVMBuildSelect(b, valid, delta, zero, ""), aj_kb_smem_ptr(kb, at), 4);
        if (guard)
            aj_kb_if_end(kb);
    }
}

static LLVMValueRef stat_at(fbwd *f, int32_t stats, LLVMValueRef idx)
{
    LLVMValueRef at =
        aj_kb_add(f->kb, aj_kb_i32(f->kb, stats), LLVMBuildShl(f->b, idx, aj_kb_i32(f->kb, 2), ""));
    return aj_kb_load(f->kb, f->kb->t_f32, aj_kb_smem_ptr(f->kb, at), 4);
}

/*
 * P (dropped) and dS of every element of S and dP (same warp layout) into
 * shared tiles of the dtype, as aj_score_by_tile_class's body (a `full`
 * tile, inside the lengths, tests no element).  Element
 * (r, c) of the product is query m0 + (rows_are_keys ? c : r) and key
 * n0 + (rows_are_keys ? r : c); the tiles store it at (r, c) too.  `pt`
 * may be NULL (the dq kernel keeps only dS).
 */
typedef struct p_ds_pass {
    fbwd *f;
    const warp_acc *s, *dp;
    int rows_are_keys;
    LLVMValueRef m0, n0;
    int32_t stats;
    const smem_tile *pt, *dst;   /* NULL: not stored */
    int in_place;                /* P and dS into s and dp too (wgmma's A) */
    LLVMValueRef dst_writes;     /* i1: whether this thread stores dst (NULL: all do) */
} p_ds_pass;

static void emit_p_ds_tiles(void *user, int full)
{
    const p_ds_pass *x = user;
    fbwd *f = x->f;
    const warp_acc *s = x->s, *dp = x->dp;
    int rows_are_keys = x->rows_are_keys, bm = f->p.bm;
    LLVMValueRef m0 = x->m0, n0 = x->n0;
    int32_t stats = x->stats;
    const smem_tile *pt = x->pt, *dst = x->dst;
    aj_kb *kb = f->kb;
    for (int a = 0; a < s->g.mt; a++)
        for (int c = 0; c < s->g.nt; c++) {
            LLVMValueRef pv[4], dv[4];
            for (int r = 0; r < 4; r++) {
                LLVMValueRef pr = acc_row(f, s, a, r), pc = acc_col(f, s, c, r);
                LLVMValueRef il = rows_are_keys ? pc : pr, jl = rows_are_keys ? pr : pc;
                LLVMValueRef i = aj_kb_add(kb, m0, il), j = aj_kb_add(kb, n0, jl);
                LLVMValueRef vis = aj_score_visible_in_tile(&f->sc, full, f->seq_q, f->seq_k, i, j);
                LLVMValueRef keep = f->op->dropout > 0
                                        ? aj_attn_dropout_keep(kb, &f->drop, f->op->dropout, i, j)
                                        : NULL;
                aj_score_p_ds(&f->sc, aj_kb_get(kb, s->v[a][c][r]), aj_kb_get(kb, dp->v[a][c][r]),
                              i, j, stat_at(f, stats, il),
                              stat_at(f, stats, aj_kb_add(kb, il, aj_kb_i32(kb, bm))), vis, NULL,
                              keep, &pv[r], &dv[r]);
            }
            for (int r = 0; x->in_place && r < 4; r++) {
                aj_kb_set(kb, s->v[a][c][r], pv[r]);
                aj_kb_set(kb, dp->v[a][c][r], dv[r]);
            }
            for (int half = 0; half < 2; half++) {
                LLVMValueRef row = acc_row(f, s, a, 2 * half), col = acc_col(f, s, c, 0);
                if (pt)
                    aj_kb_store(kb, pack2(f, pv[2 * half], pv[2 * half + 1]),
                                tile_ptr(f, *pt, row, col), 4);
                if (dst && x->dst_writes)
                    aj_kb_if_begin(kb, x->dst_writes);
                if (dst)
                    aj_kb_store(kb, pack2(f, dv[2 * half], dv[2 * half + 1]),
                                tile_ptr(f, *dst, row, col), 4);
                if (dst && x->dst_writes)
                    aj_kb_if_end(kb);
            }
        }
}

/* Blocks of `per` indices overlapping [lo, hi]: [*begin, *end), empty
 * when hi < lo. */
static void block_range(fbwd *f, LLVMValueRef lo, LLVMValueRef hi, int per,
                        LLVMValueRef *begin, LLVMValueRef *end)
{
    LLVMBuilderRef b = f->b;
    LLVMValueRef empty = aj_kb_slt(f->kb, hi, lo);
    *begin = LLVMBuildSelect(b, empty, aj_kb_i32(f->kb, 0),
                             LLVMBuildSDiv(b, lo, aj_kb_i32(f->kb, per), ""), "");
    *end = LLVMBuildSelect(
        b, empty, aj_kb_i32(f->kb, 0),
        LLVMBuildSDiv(b, aj_kb_add(f->kb, hi, aj_kb_i32(f->kb, per)), aj_kb_i32(f->kb, per), ""),
        "");
}

/* The split dkdv kernel's warpgroup that keeps dK (1; 0 keeps dV). */
static LLVMValueRef role_dk(fbwd *f)
{
    return LLVMBuildICmp(f->b, LLVMIntNE, f->wgi, aj_kb_i32(f->kb, 0), "dk_role");
}

/* wgmma: the thread's copies (landed: the pipe waited) and pad stores
 * are generic writes that wgmma reads through the async proxy, so each
 * thread fences before the barrier that hands the tiles over. */
static void land_for_wgmma(fbwd *f)
{
    if (f->p.wg)
        aj_kb_intrinsic(f->kb, AJ_INTR_FENCE_PROXY_ASYNC, NULL);
}

/* Opens the step's work on a tile whose class (cls's value) is not skip;
 * the class is the same in every thread.  NULL: no gating. */
static void step_begin(fbwd *f, LLVMValueRef cls_value)
{
    if (cls_value)
        aj_kb_if_begin(
            f->kb, LLVMBuildICmp(f->b, LLVMIntNE, cls_value, aj_kb_i32(f->kb, AJ_TILE_SKIP), ""));
}

static void step_end(fbwd *f, LLVMValueRef cls_value)
{
    if (cls_value)
        aj_kb_if_end(f->kb);
}

/*
 * The two stages' walks (tile_pipe.h): the two operands of each tile (Q
 * and dO along the rows, K and V along the keys) stream into their
 * buffers, `stages` of each.
 *
 *   fbwd_pipe fp = {.f, .extent, .seq, .op = {operand 0, operand 1}};
 *   begin_pipe(&fp, &walk)
 *   for pos in walk:
 *       x = aj_tile_pipe_step(&fp.pipe, pos, &cls)   the tile's block index
 *       ... fp.cur[0], fp.cur[1]                     its buffers
 */
typedef struct pipe_operand {
    aj_param_source t;
    LLVMValueRef base;   /* i64: row 0 of the (b, h) slice */
    int width;           /* elements of a row */
    smem_tile tile;      /* its buffers (two with 2 stages) */
} pipe_operand;

typedef struct fbwd_pipe {
    fbwd *f;
    int extent;              /* rows of a tile: bm or bn */
    LLVMValueRef seq;        /* i32: the walked dim's length */
    pipe_operand op[2];
    smem_tile cur[2];        /* the operands' buffers of the current step */
    aj_tile_pipe pipe;
} fbwd_pipe;

/* aj_tile_pipe's copy: both operands of block x into buffer `which`. */
static void pipe_copy(void *user, LLVMValueRef x, LLVMValueRef which)
{
    fbwd_pipe *fp = user;
    fbwd *f = fp->f;
    LLVMValueRef x0 = aj_kb_mul(f->kb, x, aj_kb_i32(f->kb, fp->extent));
    for (int o = 0; o < 2; o++) {
        const pipe_operand *po = &fp->op[o];
        load_tile(f, po->t, po->base, x0, fp->seq, fp->extent, po->width,
                  which ? tile_copy(f, po->tile, fp->extent, which) : po->tile);
    }
}

/* aj_tile_pipe's use: the step's buffers into fp->cur. */
static void pipe_use(void *user, LLVMValueRef which)
{
    fbwd_pipe *fp = user;
    for (int o = 0; o < 2; o++)
        fp->cur[o] = tile_copy(fp->f, fp->op[o].tile, fp->extent, which);
}

/* The pipe over `walk`, its first copies issued; with 1 stage the
 * buffers are the operands' one each. */
static void begin_pipe(fbwd_pipe *fp, const aj_score_walk *walk)
{
    fbwd *f = fp->f;
    fp->cur[0] = fp->op[0].tile;
    fp->cur[1] = fp->op[1].tile;
    fp->pipe = (aj_tile_pipe){.kb = f->kb,
                              .sc = &f->sc,
                              .walk = walk,
                              .stages = f->p.stages,
                              .gated = aj_score_has_rest(f->prog),
                              .copy = pipe_copy,
                              .use = pipe_use,
                              .user = fp};
    aj_tile_pipe_begin(&fp->pipe);
}

/* Whether the tile at (m0, n0) lies inside both lengths. */
static LLVMValueRef tile_inside(fbwd *f, LLVMValueRef m0, LLVMValueRef n0)
{
    return LLVMBuildAnd(
        f->b,
        LLVMBuildICmp(f->b, LLVMIntSLE, aj_kb_add(f->kb, m0, aj_kb_i32(f->kb, f->p.bm)), f->seq_q,
                      ""),
        LLVMBuildICmp(f->b, LLVMIntSLE, aj_kb_add(f->kb, n0, aj_kb_i32(f->kb, f->p.bn)), f->seq_k,
                      ""),
        "");
}

/* The class of the step's tile (walk position `at`) for its element
 * pass: the one the pipe kept (cls_value, where the mask has a rest),
 * else the walk's, computed here; NULL without a mask. */
static LLVMValueRef step_class(fbwd *f, const aj_score_walk *w, LLVMValueRef cls_value,
                               LLVMValueRef at)
{
    if (cls_value || !aj_score_has_mask(f->prog))
        return cls_value;
    LLVMValueRef c;
    aj_score_walk_tile(&f->sc, w, at, &c);
    return c;
}

/* ---------------------------------------------------------------- delta */

/* The head of a stage with one thread per query row (delta, dq_convert):
 * DELTA_ROWS rows a CTA, its head *h, its row *i; opens the block of the
 * rows inside the sequence. */
static void begin_row_stage(fbwd *f, aj_kb *kb, const aj_op *op, const fbwd_plan *plan,
                            const aj_score_prog *prog, const char *name, LLVMValueRef *h,
                            LLVMValueRef *i)
{
    aj_params_declare(kb, AJ_KSIG_FLASH_BWD, op, prog);
    aj_kb_begin_stage(kb, name, DELTA_ROWS);
    fbwd_plan p1 = *plan;
    p1.threads = DELTA_ROWS;
    setup(f, kb, op, &p1, prog);
    *h = aj_kb_block_id(kb, 1);
    *i = aj_kb_add(kb, aj_kb_mul(kb, aj_kb_block_id(kb, 0), aj_kb_i32(kb, DELTA_ROWS)), f->tid);
    aj_kb_if_begin(kb, aj_kb_slt(kb, *i, f->seq_q));
}

/* Delta_i = dO_i . O_i (f32) into the workspace, one thread per row;
 * without determinism also zeroes the row's dQacc. */
static void build_delta(aj_kb *kb, const aj_op *op, const fbwd_plan *plan,
                        const aj_score_prog *prog)
{
    fbwd f;
    LLVMValueRef h, i;
    begin_row_stage(&f, kb, op, plan, prog, "delta", &h, &i);
    LLVMBuilderRef b = kb->b;
    LLVMValueRef orow =
        aj_kb_add(kb, row0_base(&f, AJ_PSRC_o, h, f.q_start),
                  aj_kb_mul(kb, aj_kb_sext64(kb, i), aj_param_stride_s(kb, AJ_PSRC_o)));
    LLVMValueRef drow =
        aj_kb_add(kb, row0_base(&f, AJ_PSRC_do, h, f.q_start),
                  aj_kb_mul(kb, aj_kb_sext64(kb, i), aj_param_stride_s(kb, AJ_PSRC_do)));
    LLVMValueRef sum = aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, 0), "sum");
    LLVMValueRef x = aj_kb_for_begin(kb, aj_kb_i64(kb, 0), aj_kb_i64(kb, plan->dv / 4),
                                     aj_kb_i64(kb, 1), "x");
    LLVMValueRef col = LLVMBuildShl(b, x, aj_kb_i64(kb, 2), "");
    LLVMTypeRef v4 = LLVMVectorType(aj_kb_storage_type(kb, plan->dtype), 4);
    LLVMValueRef ov =
        aj_kb_load(kb, v4,
                   aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(o)),
                                     aj_kb_mul(kb, aj_kb_add(kb, orow, col), aj_kb_i64(kb, 2))),
                   8);
    LLVMValueRef dv =
        aj_kb_load(kb, v4,
                   aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(do)),
                                     aj_kb_mul(kb, aj_kb_add(kb, drow, col), aj_kb_i64(kb, 2))),
                   8);
    LLVMValueRef s = aj_kb_get(kb, sum);
    for (int e = 0; e < 4; e++)
        s = aj_kb_fma(
            kb, aj_kb_to_f32(kb, LLVMBuildExtractElement(b, ov, aj_kb_i32(kb, e), ""), plan->dtype),
            aj_kb_to_f32(kb, LLVMBuildExtractElement(b, dv, aj_kb_i32(kb, e), ""), plan->dtype), s);
    aj_kb_set(kb, sum, s);
    aj_kb_for_end(kb);
    LLVMValueRef r = aj_kb_add(kb, ws_row0(&f, h), aj_kb_sext64(kb, i));
    aj_kb_store(kb, aj_kb_get(kb, sum), ws_ptr(&f, r), 4);
    if (!plan->deterministic) {
        LLVMValueRef base = aj_kb_add(kb, aj_param(kb, AJ_PID(ws_dq_offset)),
                                      aj_kb_mul(kb, r, aj_kb_i64(kb, plan->d)));
        LLVMTypeRef f4 = LLVMVectorType(kb->t_f32, 4);
        for (int c = 0; c < plan->d; c += 4)
            aj_kb_store(kb, LLVMConstNull(f4), ws_ptr(&f, aj_kb_add(kb, base, aj_kb_i64(kb, c))),
                        16);
    }
    aj_kb_if_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, DELTA_ROWS}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {plan->bm, plan->bn, plan->warps, plan->stages},
    };
    aj_kb_finish(kb, &layout);
}

/* ---------------------------------------------------------------- dkdv */

/* The atomic dQ mode's step: dQacc += dS K (A[query][key] = dS^T(key,
 * query), B[key][d] = K(key, d)) into the f32 workspace rows of the row
 * block at m0, by red.add. */
static void accumulate_dq(fbwd *f, warp_acc *dq, LLVMValueRef m0, LLVMValueRef dq_row0,
                          smem_tile dst, smem_tile kt)
{
    aj_kb *kb = f->kb;
    const fbwd_plan *p = &f->p;
    acc_zero(f, dq);
    operand dsa_t = tile_op(f, dst, 1), kb_k = tile_op(f, kt, 1);
    warp_mma(f, dq, p->bn, &dsa_t, &kb_k);
    for (int a = 0; a < dq->g.mt; a++)
        for (int r = 0; r < 4; r++) {
            LLVMValueRef i = aj_kb_add(kb, m0, acc_row(f, dq, a, r));
            aj_kb_if_begin(kb, aj_kb_slt(kb, i, f->seq_q));
            LLVMValueRef row =
                aj_kb_add(f->kb, dq_row0, aj_kb_mul(kb, aj_kb_sext64(kb, i), aj_kb_i64(kb, p->d)));
            for (int c = 0; c < dq->g.nt; c++) {
                LLVMValueRef inside = acc_tile_inside(f, dq, c);
                if (inside)
                    aj_kb_if_begin(kb, inside);
                LLVMValueRef at = aj_kb_add(kb, row, aj_kb_sext64(kb, acc_col(f, dq, c, r)));
                LLVMValueRef args[2] = {ws_ptr(f, at), aj_kb_get(kb, dq->v[a][c][r])};
                aj_kb_intrinsic(kb, AJ_INTR_RED_ADD_F32, args);
                if (inside)
                    aj_kb_if_end(kb);
            }
            aj_kb_if_end(kb);
        }
}

/* ---------------------------------------------------------------- walk stages */

/*
 * dkdv and dq have one shape: a CTA owns a block whose two tiles stay in
 * shared memory (dkdv: keys n0 .. of KV head hkv, K and V; dq: rows m0 ..
 * of head h, Q and dO) and walks the other dim's tiles past it (Q and dO;
 * K and V) through the tile pipe (tile_pipe.h), `stages` buffers each; S and dP are the
 * step's products.
 */
typedef struct walk_cta {
    fbwd f;
    smem_tile own[2], walked[2];   /* the resident tiles; the walked tiles' buffers */
    warp_acc s, dp;
    LLVMValueRef x0;               /* i32: the owned block's first key (dkdv) or row (dq) */
    LLVMValueRef head;             /* i32: block index 1, KV head (dkdv) or head (dq) */
    LLVMValueRef group;            /* i32: Hq / Hkv */
} walk_cta;

/* The stage's parameters, thread layout, tiles (pads zeroed) and S, dP;
 * on wgmma a warpgroup per 64 rows of the owned block. */
static void begin_walk_stage(walk_cta *w, aj_kb *kb, const aj_op *op, const fbwd_plan *plan,
                             const aj_score_prog *prog, const char *name, int by_keys)
{
    fbwd_plan stage = *plan;
    if (plan->wg && !by_keys) {   /* dq owns block_n rows, walks block_m keys (plan_wgmma) */
        stage.bm = plan->bn;
        stage.bn = plan->bm;
        stage.warps = stage.bm / 16;   /* a warpgroup per 64 of its rows; never split */
        stage.threads = 32 * stage.warps;
        stage.split = 0;
    }
    aj_params_declare(kb, AJ_KSIG_FLASH_BWD, op, prog);
    aj_kb_begin_stage(kb, name, stage.threads);
    fbwd *f = &w->f;
    setup(f, kb, op, &stage, prog);
    const fbwd_plan *p = &f->p;
    int own = by_keys ? p->bn : p->bm, walked = by_keys ? p->bm : p->bn;
    w->own[0] = reserve_tile(f, own, p->d, 1, p->wg);
    w->own[1] = reserve_tile(f, own, p->dv, 1, p->wg);
    w->walked[0] = reserve_tile(f, walked, p->d, p->stages, p->wg);
    w->walked[1] = reserve_tile(f, walked, p->dv, p->stages, p->wg);
    zero_pads(f, w->own[0], own, p->d);
    zero_pads(f, w->own[1], own, p->dv);
    zero_pads(f, w->walked[0], p->stages * walked, p->d);
    zero_pads(f, w->walked[1], p->stages * walked, p->dv);
    acc_init(f, &w->s, own, walked, "s", 1 + p->split);
    acc_init(f, &w->dp, own, walked, "dp", 1 + p->split);
}

/* The CTA's block and GQA group; opens the block of a CTA inside the
 * sequence (varlen: the grid covers the longest one). */
static void open_block(walk_cta *w, int by_keys)
{
    fbwd *f = &w->f;
    aj_kb *kb = f->kb;
    w->x0 = aj_kb_mul(kb, aj_kb_block_id(kb, 0), aj_kb_i32(kb, by_keys ? f->p.bn : f->p.bm));
    w->head = aj_kb_block_id(kb, 1);
    w->group = LLVMBuildSDiv(f->b, aj_param(kb, AJ_PID(heads_q)), aj_param(kb, AJ_PID(heads_kv)),
                             "group");
    aj_kb_if_begin(kb, aj_kb_slt(kb, w->x0, by_keys ? f->seq_k : f->seq_q));
}

/* The end of the stage: its layout, a CTA per owned block. */
static void finish_walk_stage(walk_cta *w, int by_keys)
{
    const fbwd_plan *p = &w->f.p;
    aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, p->bm}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {p->bm, p->bn, p->warps, p->stages},
    };
    if (by_keys) {
        layout.grid[0] = (aj_grid_dim){AJ_EXTENT_SEQ_K, p->bn};
        layout.grid[1].extent = AJ_EXTENT_HEADS_KV;
    }
    aj_kb_finish(w->f.kb, &layout);
}

/* ---------------------------------------------------------------- dkdv */

/* The dkdv CTA: P^T and dS^T tiles, the step's row stats, dK and dV (and,
 * atomic dQ mode, the step's dQ); the row blocks the band shows its keys. */
typedef struct dkdv_cta {
    walk_cta w;
    smem_tile ptt, dst;
    int32_t stats;
    warp_acc dk, dv, dq;
    LLVMValueRef j_last;           /* i32: the block's last key inside Sk */
    LLVMValueRef m_begin, m_end;   /* i32 */
} dkdv_cta;

static void dkdv_prologue(dkdv_cta *d, aj_kb *kb, const aj_op *op, const fbwd_plan *plan,
                          const aj_score_prog *prog)
{
    walk_cta *w = &d->w;
    fbwd *f = &w->f;
    begin_walk_stage(w, kb, op, plan, prog, "dkdv", 1);
    const fbwd_plan *p = &f->p;
    LLVMBuilderRef b = kb->b;
    d->ptt = d->dst = (smem_tile){0};
    if (!p->wg)   /* wgmma: P^T and dS^T stay in registers (but atomic dQ's dS^T) */
        d->ptt = reserve_tile(f, p->bn, p->bm, 1, 0);
    if (!p->wg || !p->deterministic)
        d->dst = reserve_tile(f, p->bn, p->bm, 1, 0);
    d->stats = aj_kb_smem_reserve(kb, 8 * p->bm);
    if (p->split) {   /* one set of registers: dV in warpgroup 0, dK in 1 */
        acc_init(f, &d->dv, p->bn, p->d > p->dv ? p->d : p->dv, "kv", 2);
        d->dk = acc_view(f, &d->dv, p->d, "dk");
        d->dv = acc_view(f, &d->dv, p->dv, "dv");
    } else {
        acc_init(f, &d->dk, p->bn, p->d, "dk", 1);
        acc_init(f, &d->dv, p->bn, p->dv, "dv", 1);
    }
    if (!p->deterministic)
        acc_init(f, &d->dq, p->bm, p->d, "dq", 1);
    open_block(w, 1);
    LLVMValueRef n0 = w->x0;
    LLVMValueRef k_base = row0_base(f, AJ_PSRC_k, w->head, f->k_start);
    LLVMValueRef v_base = row0_base(f, AJ_PSRC_v, w->head, f->k_start);
    load_tile(f, AJ_PSRC_k, k_base, n0, f->seq_k, p->bn, p->d, w->own[0]);
    load_tile(f, AJ_PSRC_v, v_base, n0, f->seq_k, p->bn, p->dv, w->own[1]);
    aj_kb_cp_async_commit(kb);

    /* query rows the band shows a key of this block (for every head) */
    set_head(f, aj_kb_mul(kb, w->head, w->group));
    d->j_last = LLVMBuildSub(b, aj_kb_smin(kb, aj_kb_add(kb, n0, aj_kb_i32(kb, p->bn)), f->seq_k),
                             aj_kb_i32(kb, 1), "");
    LLVMValueRef i_lo, i_hi;
    aj_score_row_range(&f->sc, n0, d->j_last, f->seq_q, &i_lo, &i_hi);
    block_range(f, i_lo, i_hi, p->bm, &d->m_begin, &d->m_end);
}

/* The step of row block m0 (class cls_m, walk position pos), Q and dO in
 * q_cur, do_cur: S^T, dP^T, then P^T, dS^T, then dV, dK (and dQ). */
static void dkdv_step(dkdv_cta *d, const aj_score_walk *walk, LLVMValueRef pos, LLVMValueRef h,
                      LLVMValueRef m0, LLVMValueRef cls_m, smem_tile q_cur, smem_tile do_cur,
                      LLVMValueRef dq_row0)
{
    walk_cta *w = &d->w;
    fbwd *f = &w->f;
    aj_kb *kb = f->kb;
    const fbwd_plan *p = &f->p;
    smem_tile kt = w->own[0], vt = w->own[1];
    step_begin(f, cls_m);
    load_stats(f, h, m0, p->bm, d->stats);
    land_for_wgmma(f);
    aj_kb_barrier(kb);   /* K, V, Q, dO and the stats are in */

    /* S^T = K Q^T, dP^T = V dO^T: A = K (keys x d), B[d][query] = Q(query, d) */
    acc_zero(f, &w->s);
    acc_zero(f, &w->dp);
    const gemm scores[2] = {{&w->s, p->d, tile_op(f, kt, 0), tile_op(f, q_cur, 0)},
                            {&w->dp, p->dv, tile_op(f, vt, 0), tile_op(f, do_cur, 0)}};
    products(f, scores, 2, 1);
    /* split: both warpgroups compute the same dS^T; the dK one stores it */
    p_ds_pass pass = {f, &w->s, &w->dp, 1, m0, w->x0, d->stats, p->wg ? NULL : &d->ptt,
                      p->wg && p->deterministic ? NULL : &d->dst, p->wg,
                      p->split ? role_dk(f) : NULL};
    aj_score_by_tile_class(kb, step_class(f, walk, cls_m, pos), tile_inside(f, m0, w->x0),
                           emit_p_ds_tiles, &pass);
    if (!p->wg || !p->deterministic)
        aj_kb_barrier(kb);   /* P^T and dS^T are complete */

    /* dV += P^T dO, dK += dS^T Q: B[query][d] = tile(query, d), k-major */
    gemm grads[2] = {{&d->dv, p->bm, tile_op(f, d->ptt, 0), tile_op(f, do_cur, 1)},
                     {&d->dk, p->bm, tile_op(f, d->dst, 0), tile_op(f, q_cur, 1)}};
    if (p->wg) {   /* wgmma: A from the accumulators */
        grads[0].A = (operand){.regs = &w->s};
        grads[1].A = (operand){.regs = &w->dp};
    }
    if (p->split) {   /* warpgroup 0 dV, 1 dK */
        aj_kb_if_begin(kb, role_dk(f));
        products(f, &grads[1], 1, 0);
        aj_kb_else(kb);
        products(f, &grads[0], 1, 0);
        aj_kb_if_end(kb);
    } else {
        products(f, grads, 2, 0);
    }
    if (!p->deterministic)
        accumulate_dq(f, &d->dq, m0, dq_row0, d->dst, kt);
    aj_kb_barrier(kb);   /* this step's readers are done before the next copies */
    step_end(f, cls_m);
}

/* The query heads of the KV head's group, and per head the row blocks of
 * the range, or the block mask's list of the key block (score.h), Q and
 * dO streamed through the pipe. */
static void dkdv_mainloop(dkdv_cta *d)
{
    walk_cta *w = &d->w;
    fbwd *f = &w->f;
    aj_kb *kb = f->kb;
    const fbwd_plan *p = &f->p;
    LLVMValueRef hq = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), w->group, aj_kb_i32(kb, 1), "hq");
    LLVMValueRef h = aj_kb_add(kb, aj_kb_mul(kb, w->head, w->group), hq);
    set_head(f, h);
    LLVMValueRef q_base = row0_base(f, AJ_PSRC_q, h, f->q_start);
    LLVMValueRef do_base = row0_base(f, AJ_PSRC_do, h, f->q_start);
    LLVMValueRef dq_row0 = NULL;
    if (!p->deterministic)
        dq_row0 = aj_kb_add(kb, aj_param(kb, AJ_PID(ws_dq_offset)),
                            aj_kb_mul(kb, ws_row0(f, h), aj_kb_i64(kb, p->d)));
    aj_score_walk walk;
    aj_score_walk_rows(&f->sc, &walk, w->x0, d->j_last, p->bm, d->m_begin, d->m_end, f->seq_q,
                       f->seq_k);
    fbwd_pipe fp = {.f = f, .extent = p->bm, .seq = f->seq_q,
                    .op = {{AJ_PSRC_q, q_base, p->d, w->walked[0]},
                           {AJ_PSRC_do, do_base, p->dv, w->walked[1]}}};
    begin_pipe(&fp, &walk);
    LLVMValueRef pos = aj_kb_for_begin(kb, walk.begin, walk.end, aj_kb_i32(kb, 1), "walk");
    LLVMValueRef cls_m;
    LLVMValueRef m0 = aj_kb_mul(kb, aj_tile_pipe_step(&fp.pipe, pos, &cls_m), aj_kb_i32(kb, p->bm));
    dkdv_step(d, &walk, pos, h, m0, cls_m, fp.cur[0], fp.cur[1], dq_row0);
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

/* dK (times the scale) and dV of the block's keys. */
static void dkdv_epilogue(dkdv_cta *d)
{
    walk_cta *w = &d->w;
    fbwd *f = &w->f;
    aj_kb_cp_async_wait_all(f->kb);
    if (f->p.split)   /* each warpgroup its own */
        aj_kb_if_begin(f->kb, role_dk(f));
    store_acc(f, &d->dk, AJ_PSRC_dk, row0_base(f, AJ_PSRC_dk, w->head, f->k_start), w->x0,
              f->seq_k, aj_op_scale(f->op));
    if (f->p.split)
        aj_kb_else(f->kb);
    store_acc(f, &d->dv, AJ_PSRC_dv, row0_base(f, AJ_PSRC_dv, w->head, f->k_start), w->x0,
              f->seq_k, 1.0);
    if (f->p.split)
        aj_kb_if_end(f->kb);
    aj_kb_if_end(f->kb);
    finish_walk_stage(w, 1);
}

static void build_dkdv(aj_kb *kb, const aj_op *op, const fbwd_plan *plan,
                       const aj_score_prog *prog)
{
    dkdv_cta d;
    dkdv_prologue(&d, kb, op, plan, prog);
    dkdv_mainloop(&d);
    dkdv_epilogue(&d);
}

/* ---------------------------------------------------------------- dq */

/* The deterministic dQ CTA: beside Q, dO (own) and the key blocks' K, V
 * (walked), its dS tile, the rows' stats and dQ; the rows' last row. */
typedef struct dq_cta {
    walk_cta w;
    smem_tile dst;
    int32_t stats;
    warp_acc dq;
    LLVMValueRef i_last;   /* i32 */
} dq_cta;

/* The rows' Q, dO and stats, the K/V slices of their KV head. */
static void dq_prologue(dq_cta *d, aj_kb *kb, const aj_op *op, const fbwd_plan *plan,
                        const aj_score_prog *prog, LLVMValueRef *k_base, LLVMValueRef *v_base)
{
    walk_cta *w = &d->w;
    fbwd *f = &w->f;
    begin_walk_stage(w, kb, op, plan, prog, "dq", 0);
    const fbwd_plan *p = &f->p;
    LLVMBuilderRef b = kb->b;
    d->dst = (smem_tile){0};
    if (!p->wg)   /* wgmma: dS stays in registers */
        d->dst = reserve_tile(f, p->bm, p->bn, 1, 0);
    d->stats = aj_kb_smem_reserve(kb, 8 * p->bm);
    acc_init(f, &d->dq, p->bm, p->d, "dq", 1);
    open_block(w, 0);
    LLVMValueRef m0 = w->x0, h = w->head;
    set_head(f, h);
    LLVMValueRef hkv = LLVMBuildSDiv(b, h, w->group, "hkv");
    *k_base = row0_base(f, AJ_PSRC_k, hkv, f->k_start);
    *v_base = row0_base(f, AJ_PSRC_v, hkv, f->k_start);
    load_tile(f, AJ_PSRC_q, row0_base(f, AJ_PSRC_q, h, f->q_start), m0, f->seq_q, p->bm, p->d,
              w->own[0]);
    load_tile(f, AJ_PSRC_do, row0_base(f, AJ_PSRC_do, h, f->q_start), m0, f->seq_q, p->bm, p->dv,
              w->own[1]);
    aj_kb_cp_async_commit(kb);
    load_stats(f, h, m0, p->bm, d->stats);
    LLVMValueRef rows_here =
        aj_kb_smin(kb, aj_kb_i32(kb, p->bm), LLVMBuildSub(b, f->seq_q, m0, ""));
    d->i_last = aj_kb_add(kb, m0, LLVMBuildSub(b, rows_here, aj_kb_i32(kb, 1), ""));
}

/* The step of key block n0 (class cls_n, walk position pos), K and V in
 * k_cur, v_cur: S, dP, then dS, then dQ += dS K. */
static void dq_step(dq_cta *d, const aj_score_walk *walk, LLVMValueRef pos, LLVMValueRef n0,
                    LLVMValueRef cls_n, smem_tile k_cur, smem_tile v_cur)
{
    walk_cta *w = &d->w;
    fbwd *f = &w->f;
    aj_kb *kb = f->kb;
    const fbwd_plan *p = &f->p;
    LLVMValueRef m0 = w->x0;
    step_begin(f, cls_n);
    land_for_wgmma(f);
    aj_kb_barrier(kb);   /* Q, dO, stats (first step), K and V are in */

    /* S = Q K^T, dP = dO V^T: B[d][key] = K(key, d) */
    acc_zero(f, &w->s);
    acc_zero(f, &w->dp);
    const gemm scores[2] = {{&w->s, p->d, tile_op(f, w->own[0], 0), tile_op(f, k_cur, 0)},
                            {&w->dp, p->dv, tile_op(f, w->own[1], 0), tile_op(f, v_cur, 0)}};
    products(f, scores, 2, 1);
    p_ds_pass pass = {f, &w->s, &w->dp, 0, m0, n0, d->stats, NULL, p->wg ? NULL : &d->dst,
                      p->wg, NULL};
    aj_score_by_tile_class(kb, step_class(f, walk, cls_n, pos), tile_inside(f, m0, n0),
                           emit_p_ds_tiles, &pass);
    if (!p->wg)
        aj_kb_barrier(kb);   /* dS is complete */

    /* dQ += dS K: B[key][d] = K(key, d), k-major (wgmma: dS from the accumulators) */
    gemm dq = {&d->dq, p->bn, tile_op(f, d->dst, 0), tile_op(f, k_cur, 1)};
    if (p->wg)
        dq.A = (operand){.regs = &w->dp};
    products(f, &dq, 1, 0);
    aj_kb_barrier(kb);   /* this step's readers are done before the next copies */
    step_end(f, cls_n);
}

/* The deterministic dQ stage: the rows' Q, dO and stats resident, the
 * key blocks of the range (or the block mask's list of the row block,
 * score.h) streamed through the pipe; dQ += dS K per block. */
static void build_dq(aj_kb *kb, const aj_op *op, const fbwd_plan *plan,
                     const aj_score_prog *prog)
{
    dq_cta d;
    walk_cta *w = &d.w;
    fbwd *f = &w->f;
    LLVMValueRef k_base, v_base;
    dq_prologue(&d, kb, op, plan, prog, &k_base, &v_base);
    const fbwd_plan *p = &f->p;
    LLVMValueRef m0 = w->x0;
    LLVMValueRef n_begin, n_end, j_lo, j_hi;
    aj_score_key_range(&f->sc, m0, d.i_last, f->seq_k, &j_lo, &j_hi);
    block_range(f, j_lo, j_hi, p->bn, &n_begin, &n_end);
    aj_score_walk walk;
    aj_score_walk_keys(&f->sc, &walk, m0, d.i_last, p->bn, n_begin, n_end, f->seq_q, f->seq_k);
    fbwd_pipe fp = {.f = f, .extent = p->bn, .seq = f->seq_k,
                    .op = {{AJ_PSRC_k, k_base, p->d, w->walked[0]},
                           {AJ_PSRC_v, v_base, p->dv, w->walked[1]}}};
    begin_pipe(&fp, &walk);
    LLVMValueRef pos = aj_kb_for_begin(kb, walk.begin, walk.end, aj_kb_i32(kb, 1), "walk");
    LLVMValueRef cls_n;
    LLVMValueRef n0 = aj_kb_mul(kb, aj_tile_pipe_step(&fp.pipe, pos, &cls_n), aj_kb_i32(kb, p->bn));
    dq_step(&d, &walk, pos, n0, cls_n, fp.cur[0], fp.cur[1]);
    aj_kb_for_end(kb);
    aj_kb_cp_async_wait_all(kb);
    store_acc(f, &d.dq, AJ_PSRC_dq, row0_base(f, AJ_PSRC_dq, w->head, f->q_start), m0, f->seq_q,
              aj_op_scale(op));
    aj_kb_if_end(kb);
    finish_walk_stage(w, 0);
}

/* ---------------------------------------------------------------- dq_convert */

/* dQ = scale dQacc in the op's dtype, one thread per query row. */
static void build_dq_convert(aj_kb *kb, const aj_op *op, const fbwd_plan *plan,
                             const aj_score_prog *prog)
{
    fbwd f;
    LLVMValueRef h, i;
    begin_row_stage(&f, kb, op, plan, prog, "dq_convert", &h, &i);
    LLVMBuilderRef b = kb->b;
    LLVMValueRef src = aj_kb_add(
        kb, aj_param(kb, AJ_PID(ws_dq_offset)),
        aj_kb_mul(kb, aj_kb_add(kb, ws_row0(&f, h), aj_kb_sext64(kb, i)), aj_kb_i64(kb, plan->d)));
    LLVMValueRef dst =
        aj_kb_add(kb, row0_base(&f, AJ_PSRC_dq, h, f.q_start),
                  aj_kb_mul(kb, aj_kb_sext64(kb, i), aj_param_stride_s(kb, AJ_PSRC_dq)));
    LLVMTypeRef f4 = LLVMVectorType(kb->t_f32, 4);
    LLVMValueRef x = aj_kb_for_begin(kb, aj_kb_i64(kb, 0), aj_kb_i64(kb, plan->d / 4),
                                     aj_kb_i64(kb, 1), "x");
    LLVMValueRef col = LLVMBuildShl(b, x, aj_kb_i64(kb, 2), "");
    LLVMValueRef v = aj_kb_load(kb, f4, ws_ptr(&f, aj_kb_add(kb, src, col)), 16);
    LLVMValueRef sv[4];
    for (int e = 0; e < 4; e++)
        sv[e] = LLVMBuildFMul(b, LLVMBuildExtractElement(b, v, aj_kb_i32(kb, e), ""),
                              aj_kb_f32(kb, aj_op_scale(op)), "");
    LLVMValueRef lo = pack2(&f, sv[0], sv[1]), hi = pack2(&f, sv[2], sv[3]);
    LLVMValueRef at = aj_kb_mul(kb, aj_kb_add(kb, dst, col), aj_kb_i64(kb, 2));
    aj_kb_store(kb, lo, aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(dq)), at), 4);
    aj_kb_store(
        kb, hi,
        aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(dq)), aj_kb_add(kb, at, aj_kb_i64(kb, 4))), 4);
    aj_kb_for_end(kb);
    aj_kb_if_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, DELTA_ROWS}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {plan->bm, plan->bn, plan->warps, plan->stages},
    };
    aj_kb_finish(kb, &layout);
}

static aj_status fbwd_build(aj_kb *kb, const aj_op *op, void *user)
{
    (void)user;
    fbwd_plan plan;
    const aj_score_prog *prog;
    aj_status st =
        aj_kctx_plan_programs(kb, op, plan_kernel(kb->ctx, op, kb->target, &plan), &prog);
    if (st != AJ_OK)
        return st;
    build_delta(kb, op, &plan, prog);
    build_dkdv(kb, op, &plan, prog);
    if (plan.deterministic)
        build_dq(kb, op, &plan, prog);
    else
        build_dq_convert(kb, op, &plan, prog);
    aj_grad_tail_build(kb, op, prog);
    return kb->st;
}

AJ_TEMPLATE(aj_template_flash_bwd, "flash_bwd", AJ_KIND_BACKWARD, AJ_VARIANT_FLASH, fbwd_check,
            fbwd_build, .stage_sigs = {AJ_KSIG_FLASH_BWD, AJ_KSIG_FLASH_BWD, AJ_KSIG_FLASH_BWD});
