/*
 * test_sim_flash_fwd.c -- the flash forward kernel (mma.sync, ldmatrix,
 * cp.async pipeline) on the SIMT emulator against the float64 reference.
 *
 * A covering design rather than the full product, to stay within about a
 * minute on one core: every head dim (32 .. 256 and 192/128) meets every
 * mask once, head dims that are odd multiples of 8 (8 .. 248, D != Dv) one
 * mask each, the dtypes alternating, with lengths that leave tails on both
 * sides (1, 17, 65, 130); then GQA, batches, BSHD strides, position offsets
 * and totals, softcap, alibi, dropout (exact keep mask: the reference's
 * Philox stream), every supported schedule field value, accumulate chained
 * over key blocks, and varlen batches.  Tolerances are sim_harness.c's per
 * dtype (f16: 1e-3 + 2e-3 |ref|, bf16: 8e-3 + 1.6e-2 |ref|; LSE 1e-4 +
 * 1e-5 |ref|); rows that see no key must give exactly O = 0, LSE = -inf.
 *
 * `test_sim_flash_fwd sim wgmma` (ctest test_sim_wgmma_fwd) runs the same
 * cases on the wgmma template (schedule warpgroups 1 and 2 in turn; its
 * TMA loads, and cp.async for varlen), head dims that are odd multiples
 * of 8 included, checks its TMA and cp.async loads agree bit for bit, and
 * what it refuses on other targets.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "fwd_check.h"
#include "sim_harness.h"
#include "ir/dtype.h"
#include "spec_compile.h"
#include "splitmix.h"
#include "test_main.h"

static aj_ctx *ctx;
static aj_device *dev;
static int cases_run;
/* `test_sim_flash_fwd sim wgmma`: every case on the wgmma template
 * (schedule warpgroups), 1 and 2 warpgroups in turn; `... sim ws` the
 * same warp specialised (producer = 1) */
static int wgmma, producer;

static void run_ext(const fwd_case *c, const fwd_options *x, const fwd_run_options *how)
{
    if (!check_sampled())
        return;
    fwd_run_options flash = how ? *how : (fwd_run_options){0};
    flash.variant = AJ_VARIANT_FLASH;
    /* past Dv 256 the wgmma template takes its warpgroup pair only */
    if (wgmma)
        flash.warpgroups = (c->dv ? c->dv : c->d) > 256 ? 2 : 1 + cases_run % 2;
    flash.producer = producer;
    fwd_result r = fwd_run_case_ext(ctx, dev, c, x, &flash);
    cases_run++;
    if (!fwd_check_result(ctx, c, &r))
        return;
    printf("%-56s O %.3f LSE %.3f empty rows %4lld  %5.2f s\n", c->label, r.max_err_o,
           r.max_err_lse, (long long)r.rows_without_keys, r.seconds);
}

static void run_with(const fwd_case *c, const fwd_options *x)
{
    run_ext(c, x, NULL);
}

static void run(const fwd_case *c)
{
    run_ext(c, NULL, NULL);
}

static fwd_case base(const char *label, aj_dtype dtype, int d, const char *mask)
{
    fwd_case c = fwd_case_base(label, dtype, d, mask);
    c.sq = 65;
    c.sk = 130;
    return c;
}

/* `spec` compiled for sim, its code the LLVM IR text (aj_kernel_code);
 * NULL where that fails (a failed check). */
static aj_kernel *compile_sim_ir(const char *spec, const char *name)
{
    aj_op *op = NULL;
    aj_kernel *kernel = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_SIM;
    opt.emit = AJ_EMIT_LLVM_IR;
    CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), name, &op), AJ_OK);
    if (op)
        CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &kernel), AJ_OK);
    aj_op_destroy(op);
    return kernel;
}

static const char *const matrix_masks[] = {"none", "causal(top_left)", "causal(bottom_right)",
                                           "window(40, 7, bottom_right)"};

/* Case i of a head-dim sweep at (d, dv) under mask m: dtypes alternating,
 * lengths rotating through tails. */
static void run_dims_case(int i, int d, int dv, int m)
{
    static const int lens[][2] = {{65, 130}, {130, 65}, {17, 65}, {1, 17}};
    char label[128];
    aj_dtype dt = (i + m) % 2 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16;
    const int *len = lens[(i + m) % 4];
    snprintf(label, sizeof label, "%s d%d/%d %s Sq %d Sk %d", aj_dtype_name(dt), d, dv,
             matrix_masks[m], len[0], len[1]);
    fwd_case c = base(label, dt, d, matrix_masks[m]);
    c.dv = dv;
    c.sq = len[0];
    c.sk = len[1];
    c.seed = (uint64_t)(10 * i + m + 1);
    run(&c);
}

/* head dim x mask */
static void test_matrix(void)
{
    static const int dims[][2] = {{32, 32}, {64, 64}, {96, 96}, {128, 128}, {192, 192},
                                  {256, 256}, {192, 128}};
    for (int d = 0; d < 7; d++)
        for (int m = 0; m < 4; m++)
            run_dims_case(d, dims[d][0], dims[d][1], m);
}

/* head dims that are not multiples of 16 (Q K^T's last mma step reads the
 * zero pad columns of Q and K; an odd number of n8 tiles of O), D != Dv
 * both ways, one mask each: each mask meets both dtypes */
static void test_odd_dims(void)
{
    static const int dims[][2] = {{8, 8}, {24, 24}, {40, 40}, {72, 72}, {200, 200},
                                  {40, 24}, {72, 136}, {248, 8}};
    for (int d = 0; d < 8; d++)
        run_dims_case(d, dims[d][0], dims[d][1], (d + d / 4) % 4);
}

/* the rows over base()'s case */
static void run_rows(const fwd_case *rows, int n)
{
    const fwd_case b = base(NULL, AJ_DTYPE_F16, 0, NULL);
    fwd_case_rows(&b, rows, n, run);
}

/* GQA 4:1 and MQA over a batch of 2, BSHD strides, large inputs */
static void test_heads_and_layout(void)
{
    static const fwd_case rows[] = {
        {.label = "bf16 d64 GQA 4:1 B2 causal", .dtype = AJ_DTYPE_BF16, .d = 64,
         .mask = "causal(top_left)", .b = 2, .hq = 4, .hkv = 1},
        {.label = "f16 d128 GQA 6:3 BSHD none", .dtype = AJ_DTYPE_F16, .d = 128, .mask = "none",
         .hq = 6, .hkv = 3, .bshd = 1, .sq = 33, .sk = 47},
        {.label = "f16 d64 magnitude 8 (large scores)", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "none", .magnitude = 8.0},
    };
    run_rows(rows, sizeof rows / sizeof rows[0]);
}

/* global positions: shards of a longer sequence, totals for bottom_right */
static void test_offsets(void)
{
    static const fwd_case rows[] = {
        {.label = "f16 d64 causal q_offset 100 kv_offset 64", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "causal(top_left)", .q_offset = 100, .kv_offset = 64},
        {.label = "bf16 d128 causal kv_offset past every row", .dtype = AJ_DTYPE_BF16,
         .d = 128, .mask = "causal(top_left)", .kv_offset = 1000},
        {.label = "f16 d96 causal(bottom_right) totals 300/500", .dtype = AJ_DTYPE_F16, .d = 96,
         .mask = "causal(bottom_right)", .q_offset = 200, .kv_offset = 330, .sq_total = 300,
         .sk_total = 500},
        {.label = "bf16 d64 window(16, 16) offsets", .dtype = AJ_DTYPE_BF16, .d = 64,
         .mask = "window(16, 16)", .q_offset = 70, .kv_offset = 40, .sq = 130},
    };
    run_rows(rows, sizeof rows / sizeof rows[0]);
}

static void test_score_mods(void)
{
    static const fwd_case rows[] = {
        {.label = "f16 d128 softcap(5.0) causal", .dtype = AJ_DTYPE_F16, .d = 128,
         .mask = "causal(top_left)", .score_mod = "softcap(5.0)", .magnitude = 3.0},
        {.label = "bf16 d64 alibi causal(bottom_right) offsets", .dtype = AJ_DTYPE_BF16,
         .d = 64, .mask = "causal(bottom_right)", .score_mod = "alibi", .hq = 4, .q_offset = 9},
        {.label = "f16 d256 alibi none", .dtype = AJ_DTYPE_F16, .d = 256, .mask = "none",
         .score_mod = "alibi"},
    };
    run_rows(rows, sizeof rows / sizeof rows[0]);
}

/* the keep mask is the reference's bit for bit: any mismatch moves O far
 * beyond the tolerance at p = 0.3 */
static void test_dropout(void)
{
    fwd_options x;
    memset(&x, 0, sizeof x);
    x.dropout = 0.3;
    x.drop_seed = 0x123456789abcull;
    x.drop_offset = 77;
    fwd_case c = base("f16 d64 dropout 0.3 causal B2", AJ_DTYPE_F16, 64, "causal(top_left)");
    c.b = 2;
    run_with(&c, &x);
    x.dropout = 0.1;
    x.drop_offset = (7ull << 32) + 5;
    c = base("bf16 d128 dropout 0.1 window offsets", AJ_DTYPE_BF16, 128, "window(30, 3)");
    c.q_offset = 50;
    c.kv_offset = 20;
    run_with(&c, &x);
}

/* every supported value of each schedule field, with masks and tails */
static void test_schedules(void)
{
    static const char *const mma_scheds[] = {
        "(block_m = 16, block_n = 16, warps = 1, stages = 1)",
        "(block_m = 32, block_n = 32, warps = 1, stages = 3)",
        "(block_m = 64, block_n = 128, warps = 4, stages = 2)",
        "(block_m = 128, block_n = 64, warps = 8, stages = 3)",
        "(block_m = 128, block_n = 32, warps = 4, stages = 1)",
    };
    /* wgmma: block_m and warps follow the warpgroups */
    static const char *const wgmma_scheds[] = {
        "(block_n = 16, stages = 1)", "(block_n = 32, stages = 3)",
        "(block_n = 128, stages = 2)", "(block_n = 64, stages = 3)",
        "(block_n = 32, stages = 1)",
    };
    const char *const *scheds = wgmma ? wgmma_scheds : mma_scheds;
    char label[160];
    for (int i = 0; i < 5; i++) {
        aj_dtype dt = i % 2 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16;
        const char *mask = i % 2 ? "causal(top_left)" : "window(50, 10, bottom_right)";
        snprintf(label, sizeof label, "%s d64 %s %s", aj_dtype_name(dt), mask, scheds[i]);
        fwd_case c = base(label, dt, 64, mask);
        c.schedule = scheds[i];
        c.sq = 130;
        c.sk = 257;
        run(&c);
    }
    /* fewer key tiles than pipeline stages: one tile in a 3-slot ring */
    fwd_case c = base("f16 d128 one key tile, stages = 3", AJ_DTYPE_F16, 128, "none");
    c.schedule = wgmma ? "(block_n = 64, stages = 3)"
                       : "(block_m = 64, block_n = 64, warps = 4, stages = 3)";
    c.sq = 70;
    c.sk = 20;
    run(&c);
}

/* accumulate over 2 or 3 key blocks (from lse = -inf, o_acc = NaN) equals
 * one pass over all keys: the ring runtime's use */
static void test_accumulate(void)
{
    fwd_run_options how = {.accumulate_parts = 3};
    fwd_case c = base("f16 d64 accumulate 3 blocks causal(bottom_right)", AJ_DTYPE_F16, 64,
                      "causal(bottom_right)");
    c.sq = 40;
    c.sk = 130;
    run_ext(&c, NULL, &how);
    how.accumulate_parts = 2;
    c = base("bf16 d128 accumulate 2 blocks window, rows without keys", AJ_DTYPE_BF16, 128,
             "window(10, 0)");
    c.sq = 70;
    c.sk = 40;
    run_ext(&c, NULL, &how);
    fwd_options x;
    memset(&x, 0, sizeof x);
    x.dropout = 0.2;
    x.drop_seed = 5;
    c = base("f16 d256 accumulate 2 blocks + dropout + softcap", AJ_DTYPE_F16, 256, "none");
    c.score_mod = "softcap(20.0)";
    c.sq = 20;
    c.sk = 50;
    run_ext(&c, &x, &how);
}

/* packed sequences of very different lengths, an empty one included, each
 * masked with its own lengths */
static void test_varlen(void)
{
    static const int32_t lq[] = {1, 130, 0, 17, 65}, lk[] = {33, 65, 7, 0, 140};
    fwd_run_options how = {.seqlens_q = lq, .seqlens_k = lk};
    static const char *const masks[] = {"none", "causal(top_left)", "causal(bottom_right)",
                                        "window(20, 4, bottom_right)"};
    char label[128];
    for (int m = 0; m < 4; m++) {
        snprintf(label, sizeof label, "%s d%d varlen B5 %s", m % 2 ? "bf16" : "f16",
                 m < 2 ? 64 : 128, masks[m]);
        fwd_case c = base(label, m % 2 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16, m < 2 ? 64 : 128,
                          masks[m]);
        c.b = 5;
        c.hq = 4;
        c.hkv = 2;
        c.seed = (uint64_t)(m + 100);
        run_ext(&c, NULL, &how);
    }
    /* offsets, totals, alibi and dropout per sequence (b is the sequence) */
    const fwd_case b = base(NULL, AJ_DTYPE_F16, 0, NULL);
    fwd_options x;
    fwd_case c = fwd_varlen_totals_case(&b, 5, 200, 150, &x);
    run_ext(&c, &x, &how);
}

/* Head dims past 256: Dv split across warp pairs (mma.sync: at block_n >=
 * 32 each computing half the scores and trading them, see
 * trade_scores_taken) or the two warpgroups (wgmma: 256 columns, then the
 * rest; both computing the scores).  Odd dv / 8 (mma.sync: the second
 * split's last n8 tile on V's zero pad, not stored; wgmma: split 1's odd
 * width), D past 256 alone (no split), D != Dv both ways, GQA with dropout
 * (both halves of a pair draw the same keep mask), accumulate (the split-0
 * LSE store after every warp's read of the prior), varlen and given
 * schedules (on mma.sync the trade at 64 and 128 keys, a skipping walk,
 * one row group); every mask meets a split.  Not warp specialised (`ws`:
 * refused past 256). */
static void test_wide_heads(void)
{
    if (producer)
        return;
    static const struct { int d, dv, mask; } dims[] = {
        {512, 512, 2}, {264, 264, 3}, {512, 264, 1}, {264, 512, 0},
        {384, 8, 2}, {8, 512, 1}, {320, 392, 3},
    };
    for (int i = 0; i < 7; i++)
        run_dims_case(100 + i, dims[i].d, dims[i].dv, dims[i].mask);
    fwd_options x;
    memset(&x, 0, sizeof x);
    x.dropout = 0.2;
    x.drop_seed = 99;
    fwd_case c = base("bf16 d320 GQA 4:2 dropout 0.2 causal(bottom_right)", AJ_DTYPE_BF16, 320,
                      "causal(bottom_right)");
    c.hq = 4;
    c.hkv = 2;
    c.sq = 40;
    c.sk = 70;
    run_with(&c, &x);
    fwd_run_options how = {.accumulate_parts = 2};
    c = base("f16 d512/296 accumulate 2 blocks + dropout + softcap", AJ_DTYPE_F16, 512, "none");
    c.dv = 296;
    c.score_mod = "softcap(20.0)";
    c.sq = 20;
    c.sk = 50;
    run_ext(&c, &x, &how);
    static const int32_t lq[] = {17, 0, 40}, lk[] = {33, 9, 70};
    fwd_run_options var = {.seqlens_q = lq, .seqlens_k = lk};
    c = base("bf16 d384 varlen B3 window(20, 4, bottom_right)", AJ_DTYPE_BF16, 384,
             "window(20, 4, bottom_right)");
    c.b = 3;
    run_ext(&c, NULL, &var);
    c = base(wgmma ? "f16 d296 (block_n = 32, stages = 3)"
                   : "f16 d296 (block_m = 32, block_n = 16, warps = 4, stages = 3)",
             AJ_DTYPE_F16, 296, "causal(top_left)");
    c.schedule = wgmma ? "(block_n = 32, stages = 3)"
                       : "(block_m = 32, block_n = 16, warps = 4, stages = 3)";
    run(&c);
    if (wgmma)
        return;
    /* the pairs' trade at wider key tiles: 64 keys with dropout and a
     * mask whose walk skips tiles, 128 keys causal, and 16 rows a warp
     * pair on 2 warps */
    c = base("bf16 d320 (64, 64, 8, 2) dropout expr mask", AJ_DTYPE_BF16, 320,
             "expr(k <= q && (k < 4 || q - k < 40))");
    c.schedule = "(block_m = 64, block_n = 64, warps = 8, stages = 2)";
    c.sq = 70;
    c.sk = 150;
    run_with(&c, &x);
    c = base("f16 d264/320 (64, 128, 8, 1) causal", AJ_DTYPE_F16, 264, "causal(bottom_right)");
    c.dv = 320;
    c.schedule = "(block_m = 64, block_n = 128, warps = 8, stages = 1)";
    c.sk = 300;
    run(&c);
    c = base("bf16 d512/264 (16, 32, 2, 2)", AJ_DTYPE_BF16, 512, "window(30, 2, top_left)");
    c.dv = 264;
    c.schedule = "(block_m = 16, block_n = 32, warps = 2, stages = 2)";
    run(&c);
}

/* The mma.sync kernel past Dv 256 at block_n >= 32 trades halves of S
 * between the warps of a pair: at D 512 on 64 x 32 tiles a warp issues
 * 64 mma for its half of Q K^T and 64 for P V -- 128 in the module where
 * computing all of S took 192 -- and at block_n 16 (no trade) 64 + 32. */
static void trade_scores_taken(void)
{
    if (wgmma || producer)
        return;
    static const struct { int bn, calls; } want[] = {{32, 128}, {16, 96}};
    for (int i = 0; i < 2; i++) {
        char spec[160];
        snprintf(spec, sizeof spec, "attention forward flash { dtype = bf16 head_dim = 512 "
                 "schedule = (block_m = 64, block_n = %d, warps = 8) }", want[i].bn);
        aj_kernel *kernel = compile_sim_ir(spec, "trade");
        int calls = 0;
        for (const char *at = kernel ? aj_kernel_code(kernel, NULL) : NULL;
             at && (at = strstr(at, "call void @aj_sim_mma_m16n8k16")); at++)
            calls++;
        CHECK_MSG(calls == want[i].calls, "d512 block_n %d: %d mma calls, want %d", want[i].bn,
                  calls, want[i].calls);
        aj_kernel_destroy(kernel);
    }
}

/* One op the template refuses on a target: the op's fields, and the
 * message's needle (NULL: it compiles). */
typedef struct refusal {
    aj_target target;
    const char *fields, *needle;
} refusal;

/* Each row compiled for its target: AJ_ERR_UNSUPPORTED with its needle in
 * the message, or AJ_OK without one. */
static void expect_refusals(const refusal *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char spec[256];
        snprintf(spec, sizeof spec, "attention forward flash { %s }", rows[i].fields);
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = rows[i].target;
        aj_kernel *k = NULL;
        CHECK_STATUS(ctx, spec_compile(ctx, spec, "w.aj", &opt, &k),
                     rows[i].needle ? AJ_ERR_UNSUPPORTED : AJ_OK);
        if (rows[i].needle)
            CHECK_ERROR(ctx, rows[i].needle);
        aj_kernel_destroy(k);
    }
}

/* What the flash forward refuses past 256, by message: an odd warp count
 * (no warp pairs), one warpgroup, a warp-specialised or 128-row wgmma
 * schedule, FP8 inputs (up to 256), and past 512. */
static void test_wide_refusals(void)
{
    static const refusal rows[] = {
        {AJ_TARGET_SIM, "dtype = f16 head_dim = 512 schedule = (block_m = 16, warps = 1)",
         "warps = 1 at head_dim_v 512: flash forward splits Dv past 256 across warp pairs"},
        {AJ_TARGET_SIM, "dtype = bf16 head_dim = 264 schedule = (warpgroups = 1)",
         "warpgroups = 1 at head_dim_v 264: the wgmma forward splits Dv past 256 across two "
         "warpgroups on the same 64 rows; use warpgroups = 2"},
        {AJ_TARGET_SM_90A, "dtype = f16 head_dim = 64 head_dim_v = 320 "
                           "schedule = (warpgroups = 2, producer = 1)",
         "producer = 1 at head_dim_v 320: the warp-specialised wgmma forward takes Dv up to 256"},
        {AJ_TARGET_SM_90A, "dtype = f16 head_dim = 512 schedule = (warpgroups = 2, block_m = 128)",
         "warpgroups = 2 runs block_m = 64 rows on warps = 8 (64 rows on both warpgroups of 4 "
         "warps past Dv 256), not block_m = 128"},
        {AJ_TARGET_SM_90A, "dtype = bf16 head_dim = 512 schedule = (warpgroups = 2)", NULL},
        {AJ_TARGET_SM_90A, "dtype = bf16 head_dim = 264 head_dim_v = 128 "
                           "schedule = (warpgroups = 1)", NULL},
        {AJ_TARGET_SM_89, "dtype = bf16 q_dtype = f8e4m3 kv_dtype = f8e4m3 head_dim = 288",
         "head_dim = 288: flash forward with 8-bit inputs supports multiples of 8 up to 256"},
        {AJ_TARGET_SM_80, "dtype = f16 head_dim = 64 head_dim_v = 520",
         "head_dim_v = 520: flash forward supports multiples of 8 up to 512"},
    };
    expect_refusals(rows, sizeof rows / sizeof rows[0]);
}

/* ---------------------------------------------------------------- varlen arguments */

enum { VB = 2, VTQ = 8, VTK = 6, VHQ = 2, VHKV = 1, VD = 32 };
static _Alignas(16) uint16_t vq[VTQ * VHQ * VD], vk[VTK * VHKV * VD], vv[VTK * VHKV * VD],
    vo[VTQ * VHQ * VD];
static float vlse[VHQ * VTQ];
static int32_t cu_q[VB + 1] = {0, 3, 8}, cu_k[VB + 1] = {0, 4, 6};

static aj_tensor thd(void *data, int64_t t, int64_t h, int64_t d)
{
    return (aj_tensor){data, AJ_DTYPE_F16, 3, {t, h, d, 0}, {h * d, d, 1, 0}};
}

static aj_fwd_args varlen_args(void)
{
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = thd(vq, VTQ, VHQ, VD);
    a.k = thd(vk, VTK, VHKV, VD);
    a.v = thd(vv, VTK, VHKV, VD);
    a.o = thd(vo, VTQ, VHQ, VD);
    a.lse = (aj_tensor){vlse, AJ_DTYPE_F32, 2, {VHQ, VTQ, 0, 0}, {VTQ, 1, 0, 0}};
    a.cu_seqlens_q = cu_q;
    a.cu_seqlens_k = cu_k;
    a.batch = VB;
    a.max_seqlen_q = 5;
    a.max_seqlen_k = 4;
    return a;
}

static int32_t bad_cu[VB + 1];

#define CASE(name, body) static void name(aj_fwd_args *a) { body; }
CASE(v_cu_null, a->cu_seqlens_k = NULL)
CASE(v_cu_misaligned, a->cu_seqlens_q = (const int32_t *)((const char *)cu_q + 2))
CASE(v_batch0, a->batch = 0)
CASE(v_max_neg, a->max_seqlen_q = -1)
CASE(v_q_rank, a->q.rank = 4)
CASE(v_k_dim, a->k.shape[2] = 16)
CASE(v_v_len, a->v.shape[0] = VTK - 1)
CASE(v_gqa, a->k.shape[1] = 3; a->v.shape[1] = 3)
CASE(v_o_len, a->o.shape[0] = VTQ + 1)
CASE(v_lse_rank, a->lse.rank = 3)
CASE(v_lse_len, a->lse.shape[1] = VTQ - 1)
CASE(v_totals, a->sk_total = -5)
CASE(v_cu_start, memcpy(bad_cu, (int32_t[]){1, 3, 8}, sizeof bad_cu); a->cu_seqlens_q = bad_cu)
CASE(v_cu_down, memcpy(bad_cu, (int32_t[]){0, 3, 2}, sizeof bad_cu); a->cu_seqlens_k = bad_cu)
CASE(v_cu_long, a->max_seqlen_q = 4)
CASE(v_cu_end, memcpy(bad_cu, (int32_t[]){0, 3, 7}, sizeof bad_cu); a->cu_seqlens_q = bad_cu)
#undef CASE

/* aj_forward's varlen checks: status and message of each */
static void test_varlen_arguments(void)
{
    static const char spec[] = "attention forward flash { dtype = f16 head_dim = 32 "
                               "layout = varlen mask = causal(bottom_right) }";
    aj_kernel *kernel = compile_sim_ir(spec, "varlen");
    if (!kernel)
        return;
    aj_fwd_args good = varlen_args();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &good), AJ_OK);
    static const struct {
        void (*mutate)(aj_fwd_args *);
        const char *needle;
    } cases[] = {
        {v_cu_null, "aj_forward: cu_seqlens_k is NULL; layout = varlen kernels need "
                    "cu_seqlens_q and cu_seqlens_k"},
        {v_cu_misaligned, "int32 arrays must be 4-byte aligned"},
        {v_batch0, "aj_forward: batch = 0; layout = varlen needs the number of sequences, "
                   "1 to 65535"},
        {v_max_neg, "aj_forward: max_seqlen_q = -1, max_seqlen_k = 4; each must be 0 to "
                    "2^30 - 1"},
        {v_q_rank, "aj_forward: q.rank = 4, want 3"},
        {v_k_dim, "aj_forward: k.shape[2] = 16, want 32 (the op's head_dim)"},
        {v_v_len, "aj_forward: v.shape[0] = 5, want 6 (k's total length)"},
        {v_gqa, "aj_forward: q has 2 heads and k 3; the query heads must be a multiple"},
        {v_o_len, "aj_forward: o.shape[0] = 9, want 8 (q's total length)"},
        {v_lse_rank, "aj_forward: lse.rank = 3, want 2"},
        {v_lse_len, "aj_forward: lse.shape[1] = 7, want 8 (q's total length)"},
        {v_totals, "aj_forward: sq_total = 0, sk_total = -5; totals are lengths (0: each "
                   "sequence's own)"},
        /* found by the kernels, on the device (templates/attn_common.h) */
        {v_cu_start, "aj_forward: cu_seqlens_q[0] is not 0 (found by the kernel of "
                     "sequence 0, which skipped it)"},
        {v_cu_down, "aj_forward: cu_seqlens_k[2] is below cu_seqlens_k[1]; offsets must not "
                    "decrease"},
        {v_cu_long, "aj_forward: sequence 1 has more queries than max_seqlen_q"},
        {v_cu_end, "aj_forward: cu_seqlens_q[2] is not Tq (q's tokens)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        aj_fwd_args a = varlen_args();
        cases[i].mutate(&a);
        aj_status st = aj_forward(ctx, dev, kernel, &a);
        CHECK_MSG(st == AJ_ERR_INVALID_ARG, "varlen case %zu (%s): %s", i, cases[i].needle,
                  aj_status_str(st));
        CHECK_ERROR(ctx, cases[i].needle);
    }
    /* a fault is reported once: the status word is clear again */
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &good), AJ_OK);
    aj_kernel_destroy(kernel);
}

/* key tiles outside the causal band are never loaded or computed: the
 * emulated instructions of a causal pass over a square problem are about
 * 0.56 (36 of 64 tiles) of the unmasked one's, plus the diagonal tiles' mask */
static void test_tile_skipping(void)
{
    uint64_t inst[2];
    static const char *const masks[2] = {"none", "causal(top_left)"};
    fwd_run_options how = {.variant = AJ_VARIANT_FLASH, .warpgroups = wgmma,
                           .producer = producer};
    for (int m = 0; m < 2; m++) {
        fwd_case c = base(masks[m], AJ_DTYPE_F16, 32, masks[m]);
        c.hq = 1;
        c.sq = c.sk = 512;
        c.schedule = wgmma ? "(block_n = 64)" : "(block_m = 64, block_n = 64, warps = 4)";
        fwd_result r = fwd_run_case_ext(ctx, dev, &c, NULL, &how);
        CHECK_MSG(r.status == AJ_OK && r.max_err_o <= 1.0, "tile skipping %s: %s, O error %.3g",
                  masks[m], aj_status_str(r.status), r.max_err_o);
        inst[m] = r.instructions;
    }
    double ratio = (double)inst[1] / (double)inst[0];
    printf("causal / none emulated instructions at 512 x 512: %.3f\n", ratio);
    CHECK_MSG(ratio > 0.45 && ratio < 0.75, "causal pass runs %.3f of the unmasked one's "
              "instructions; tiles above the diagonal are not skipped", ratio);
}

/* Expression masks whose tile classes skip key tiles between computed
 * ones (one middle tile; every other tile), both dtypes, so that on the
 * wgmma template each runs on one and on two warpgroups: warp specialised,
 * a skipped position finishes the P V held from the tile before. */
static void test_skipped_tiles(void)
{
    static const struct {
        const char *mask;
        int block_n;
    } masks[] = {{"expr(k < 64 || k >= 128)", 64}, {"expr((k / 32) % 2 == 0)", 32}};
    char label[160], sched[96];
    for (int m = 0; m < 2; m++)
        for (int t = 0; t < 2; t++) {
            aj_dtype dt = t ? AJ_DTYPE_BF16 : AJ_DTYPE_F16;
            snprintf(label, sizeof label, "%s d64 %s, skipped tiles", aj_dtype_name(dt),
                     masks[m].mask);
            fwd_case c = base(label, dt, 64, masks[m].mask);
            snprintf(sched, sizeof sched,
                     wgmma ? "(block_n = %d)" : "(block_m = 64, block_n = %d, warps = 4)",
                     masks[m].block_n);
            c.schedule = sched;
            c.sq = 130;
            c.sk = 200;
            run(&c);
        }
}

/* What the wgmma template refuses, by message: GPU targets without wgmma,
 * rows or warps other than 64 and 4 per warpgroup, and (warp specialised)
 * a tile whose state with the held P V's fragments is over the budget
 * (without the producer the same tile fits); the cpu, whose template is
 * its own, compiles the op as it is (NULL needle). */
static void test_wgmma_refusals(void)
{
#define F16_D64 "dtype = f16 head_dim = 64 schedule = "
    static const refusal rows[] = {
        {AJ_TARGET_SM_80, F16_D64 "(warpgroups = 1)",
         "schedule: warpgroups = 1 needs wgmma, which sm_80 lacks: target sm_90a"},
        {AJ_TARGET_SM_90, F16_D64 "(warpgroups = 2)",
         "schedule: warpgroups = 2 needs wgmma, which sm_90 lacks"},
        {AJ_TARGET_CPU, F16_D64 "(warpgroups = 1)", NULL},
        {AJ_TARGET_SIM, F16_D64 "(block_m = 64, warpgroups = 2)",
         "schedule: warpgroups = 2 runs block_m = 128 rows on warps = 8 (64 rows per "
         "warpgroup of 4 warps), not block_m = 64, warps = 8"},
        {AJ_TARGET_SM_90A, F16_D64 "(warps = 4, warpgroups = 2)", "not block_m = 128, warps = 4"},
        {AJ_TARGET_SM_90A, "dtype = f16 head_dim = 64 head_dim_v = 208 schedule = (block_n = 128, "
         "warpgroups = 2)", NULL},
        {AJ_TARGET_SM_90A, "dtype = f16 head_dim = 64 head_dim_v = 208 schedule = (block_n = 128, "
         "warpgroups = 2, producer = 1)", "schedule: block_m = 128, block_n = 128, warps = 8 keeps "
         "204 f32 values per thread at head_dim_v 208 (budget 200)"},
    };
#undef F16_D64
    expect_refusals(rows, sizeof rows / sizeof rows[0]);
}

/*
 * The wgmma forward's two loads agree bit for bit: K and V as an expanded
 * view (batch stride 0, which TMA cannot describe: the launch sets tma = 0
 * and the kernel loads by cp.async) against the same values laid out in
 * full (TMA).  The emulated instruction counts differ: each path ran.  At
 * d 40 the last k-step reads 8 pad columns: TMA's boxes zero-fill them,
 * the cp.async path zeroes them once (wgmma_zero_pads).  In `ws` mode the
 * kernel is warp specialised on two consumer warpgroups: its producer
 * loads by TMA from one thread, or by cp.async from all of them.
 */
enum { TB = 2, TH = 2, TS = 70, TD = 40, TN = TB * TH * TS * TD };
static _Alignas(64) uint16_t tq[TN], tk[TN], tv[TN], to[2][TN];
static float tlse[2][TB * TH * TS];

static void test_tma_fallback(void)
{
    const char *spec = producer ? "attention forward flash { dtype = f16 head_dim = 40 mask = "
                                  "causal(bottom_right) schedule = (warpgroups = 2, producer = 1) }"
                                : "attention forward flash { dtype = f16 head_dim = 40 mask = "
                                  "causal(bottom_right) schedule = (warpgroups = 1) }";
    uint64_t rng = 7;
    for (int i = 0; i < TN; i++) {
        tq[i] = aj_f32_to_f16((float)((int)(splitmix_next(&rng) % 2001) - 1000) / 1000.0f);
        /* batch 1's K and V repeat batch 0's */
        int j = i % (TH * TS * TD);
        tk[i] = i == j ? aj_f32_to_f16((float)((int)(splitmix_next(&rng) % 2001) - 1000) / 700.0f)
                       : tk[j];
        tv[i] = i == j ? aj_f32_to_f16((float)((int)(splitmix_next(&rng) % 2001) - 1000) / 500.0f)
                       : tv[j];
    }
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_SIM;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, spec_compile(ctx, spec, "tma.aj", &opt, &k), AJ_OK);
    uint64_t inst[2] = {0, 0};
    for (int pass = 0; k && pass < 2; pass++) {
        const int64_t full[4] = {TH * TS * TD, TS * TD, TD, 1};
        const int64_t expanded[4] = {0, TS * TD, TD, 1};
        const int64_t *kv = pass ? expanded : full;
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.q = (aj_tensor){tq, AJ_DTYPE_F16, 4, {TB, TH, TS, TD}, {full[0], full[1], full[2], 1}};
        a.k = (aj_tensor){tk, AJ_DTYPE_F16, 4, {TB, TH, TS, TD}, {kv[0], kv[1], kv[2], 1}};
        a.v = (aj_tensor){tv, AJ_DTYPE_F16, 4, {TB, TH, TS, TD}, {kv[0], kv[1], kv[2], 1}};
        a.o = (aj_tensor){to[pass], AJ_DTYPE_F16, 4, {TB, TH, TS, TD},
                          {full[0], full[1], full[2], 1}};
        a.lse = (aj_tensor){tlse[pass], AJ_DTYPE_F32, 3, {TB, TH, TS, 0}, {TH * TS, TS, 1, 0}};
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
        inst[pass] = aj_device_last_instructions(dev);
    }
    CHECK_MSG(memcmp(to[0], to[1], sizeof to[0]) == 0 &&
                  memcmp(tlse[0], tlse[1], sizeof tlse[0]) == 0,
              "the TMA and cp.async loads give different outputs");
    CHECK_MSG(inst[0] != inst[1], "both launches ran %llu emulated instructions: one path only",
              (unsigned long long)inst[0]);
    printf("TMA / cp.async loads at d 40: emulated instructions %llu / %llu\n",
           (unsigned long long)inst[0], (unsigned long long)inst[1]);
    aj_kernel_destroy(k);
}

int main(int argc, char **argv)
{
    static void (*const tests[])(void) = {
        test_matrix, test_odd_dims, test_heads_and_layout, test_offsets, test_score_mods,
        test_dropout, test_schedules, test_accumulate, test_varlen, test_varlen_arguments,
        test_tile_skipping, test_skipped_tiles, test_wide_heads, trade_scores_taken,
        test_wide_refusals, NULL};
    /* the same cases on the wgmma template; the varlen argument checks are
     * the launch's, the same for both */
    static void (*const wgmma_tests[])(void) = {
        test_matrix, test_odd_dims, test_heads_and_layout, test_offsets, test_score_mods,
        test_dropout, test_schedules, test_accumulate, test_varlen, test_tile_skipping,
        test_skipped_tiles, test_wide_heads, test_wide_refusals, test_wgmma_refusals,
        test_tma_fallback, NULL};
    producer = argc > 2 && strcmp(argv[2], "ws") == 0;
    wgmma = producer || (argc > 2 && strcmp(argv[2], "wgmma") == 0);
    return test_main(argc, argv,
                     &(test_main_args){.fallback = AJ_DEVICE_SIM, .ctx = &ctx, .dev = &dev,
                                       .tests = wgmma ? wgmma_tests : tests,
                                       .cases = &cases_run, .cleanup = fwd_cache_clear});
}
