/*
 * test_sim_flash_bwd.c -- the flash backward pass (tensor cores) on sim
 * against the float64 reference backward (tests/lib/ref.c's ref_backward).
 *
 * Covers: f16 and bf16 at every head dim the template targets (32, 64,
 * 96, 128, 192, 256 and 192/128) under the four mask kinds with tails;
 * head dims that are odd multiples of 8 (8 .. 248, D != Dv both ways);
 * position offsets; GQA 2:1 and 4:1; varlen batches of very different
 * lengths (one of them empty); softcap and alibi; dropout with the
 * forward's stream; deterministic mode bitwise equal over repeated runs
 * and over different emulator worker counts; the atomic (deterministic =
 * false) mode within tolerance; explicit schedules; the workspace API and
 * its errors; expression masks and score_mods (the examples/specs/scores specs
 * and 200 random masks and score_mods of tests/lib/score_cases.h, up to 8 per
 * launch, one per (b, h) plane) with their side tensors.
 * Sizes are small: the emulator runs every GPU thread.  With
 * the argument `cuda` the same cases run on a GPU (tests/gpu/run.sh); with
 * `cpu` the varlen cases and checks run on the cpu target's kernels
 * (ctest test_cpu_varlen_bwd); `cpu scores` runs score programs backward
 * on them (ctest test_score_bwd_cpu): the examples/specs/scores specs and 200
 * random masks and score_mods (tests/lib/score_cases.h, batched as on sim), a
 * failing batch's cases rerun alone and a failing one shrunk; `sim
 * scores` (ctest test_score_bwd_sim) the same through the efficient
 * variant's GPU kernels on sim (the suite runs the flash variant's);
 * `sim full` (ctest test_sim_full_tiles_bwd) checks that both variants'
 * tiles of class full give the bits of the same mask tested per element.
 *
 * O and LSE come from ref_forward, rounded as a forward kernel stores
 * them, and the reference backward is fed the same rounded values.  Each
 * output is checked norm-wise, max |got - ref| <= atol + rtol max |ref|.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "check_compile.h"
#include "ref.h"
#include "bwd_case.h"
#include "score_cases.h"
#include "sim_harness.h"
#include "sweep_cases.h"
#include "test_main.h"

static aj_ctx *ctx;
static aj_device *dev;
static int on_cpu;   /* the cpu target's kernels */
/* `test_sim_flash_bwd sim wgmma`: every case on the wgmma kernels
 * (schedule warpgroups), 1 and 2 warpgroups in turn; a case's mma.sync
 * schedule is dropped */
static int wgmma, wgmma_refusals;
static int cases_run;

/* The tensor cores round P and dS to the dtype before the dV, dK and dQ
 * products, on top of the output rounding (2^-11, 2^-8). */
static void tolerance_for(aj_dtype dtype, double *atol, double *rtol)
{
    if (dtype == AJ_DTYPE_F16) {
        *atol = 1e-3;
        *rtol = 6e-3;
    } else {
        *atol = 4e-3;
        *rtol = 3e-2;
    }
}

/* ---------------------------------------------------------------- cases */

/* Copies of the outputs' bits (free_bits frees them). */
static void save_bits(tensor *const *outs, void **first)
{
    for (int t = 0; t < 3; t++) {
        first[t] = malloc(tensor_bytes(outs[t]) + 1);
        CHECK(aj_device_copy_from(dev, first[t], outs[t]->t.data, tensor_bytes(outs[t])) ==
              AJ_OK);
    }
}

static void free_bits(void **first)
{
    for (int t = 0; t < 3; t++)
        free(first[t]);
}

/* Poisons the outputs, runs `a` with `kernel` and wants the bits of
 * `first`; `how` says in the message what was different about the run. */
static void rerun_expect_bits(const bwd_case *c, const aj_kernel *kernel, const aj_bwd_args *a,
                              tensor *const *outs, void *const *first, const char *how)
{
    static const char *const names[3] = {"dq", "dk", "dv"};
    for (int t = 0; t < 3; t++)
        poison(outs[t]);
    CHECK_MSG(aj_backward(ctx, dev, kernel, a) == AJ_OK, "%s %s: %s", c->label, how,
              aj_last_error(ctx));
    for (int t = 0; t < 3; t++) {
        CHECK(aj_device_copy_from(dev, outs[t]->host, outs[t]->t.data,
                                  tensor_bytes(outs[t])) == AJ_OK);
        CHECK_MSG(memcmp(first[t], outs[t]->host, tensor_bytes(outs[t])) == 0,
                  "%s: %s differs %s", c->label, names[t], how);
    }
}

/* Runs `a` again with the block mask aj_block_mask_create builds for the
 * forward of c's op (its own tile: the backward reads any) and wants the
 * bits the launch's own mask gave; a mask built for another q_offset is
 * refused. */
static void rerun_passed_mask(const bwd_case *c, const aj_kernel *kernel, const aj_bwd_args *a,
                              tensor *const *outs)
{
    char spec[2048];
    snprintf(spec, sizeof spec, "attention forward %s { dtype = %s head_dim = %d "
             "head_dim_v = %d mask = %s score_mod = %s %s%s }",
             c->variant == AJ_VARIANT_EFFICIENT ? "efficient" : "flash",
             aj_dtype_name(c->dtype), c->d, c->dv ? c->dv : c->d, c->mask,
             c->score_mod ? c->score_mod : "none", c->tensors ? "tensors = " : "",
             c->tensors ? c->tensors : "");
    aj_op *fwd = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), c->label, &fwd), AJ_OK);
    aj_kernel *fk = bwd_case_kernel(ctx, dev, fwd, c);
    aj_fwd_args f = fwd_args_before(a);
    aj_block_mask *bm = NULL;
    if (fk)
        CHECK_STATUS(ctx, aj_block_mask_create(ctx, dev, fwd, fk, &f, &bm), AJ_OK);
    void *first[3];
    aj_bwd_args passed = *a;
    passed.block_mask = bm;
    if (bm) {
        save_bits(outs, first);
        rerun_expect_bits(c, kernel, &passed, outs, first,
                          "with a passed block mask from the launch's own");
        free_bits(first);
        passed.q_offset = a->q_offset + 1;
        CHECK_STATUS(ctx, aj_backward(ctx, dev, kernel, &passed), AJ_ERR_INVALID_ARG);
        char want[128];
        snprintf(want, sizeof want, "aj_backward: block_mask was built for q_offset = %lld; "
                 "this launch has %lld", (long long)a->q_offset, (long long)a->q_offset + 1);
        CHECK_ERROR(ctx, want);
    }
    aj_block_mask_destroy(bm);
    aj_kernel_destroy(fk);
    aj_op_destroy(fwd);
}

/* Runs `a` again on `workers` emulator threads and wants the bits of
 * `first` (one buffer per output). */
static void rerun_same_bits(const bwd_case *c, const aj_kernel *kernel, const aj_bwd_args *a,
                            tensor *const *outs, void *const *first, int workers)
{
    char how[64];
    snprintf(how, sizeof how, "on a rerun with %d workers", workers);
    CHECK(aj_device_set_workers(dev, workers) == AJ_OK);
    rerun_expect_bits(c, kernel, a, outs, first, how);
    CHECK(aj_device_set_workers(dev, 0) == AJ_OK);
}

/* Runs `a` again with c's twin mask, whose tiles the kernels test element
 * by element, and wants the bits of the first run (on sim the instruction
 * counts of both are printed): a tile of class full, which skips the
 * per-element mask test, gives what the test gives. */
static void rerun_twin_mask(const bwd_case *c, const aj_bwd_args *a, tensor *const *outs)
{
    uint64_t full = aj_device_last_instructions(dev);
    bwd_case twin = *c;
    twin.mask = c->twin_mask;
    aj_op *op = bwd_case_op(ctx, &twin);
    aj_kernel *kernel = bwd_case_kernel(ctx, dev, op, &twin);
    void *first[3];
    save_bits(outs, first);
    if (kernel) {
        rerun_expect_bits(c, kernel, a, outs, first, "with the mask written as its twin");
        printf("    instructions: %llu with full tiles, %llu with the twin mask\n",
               (unsigned long long)full, (unsigned long long)aj_device_last_instructions(dev));
    }
    free_bits(first);
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
}

static void run_case(const bwd_case *c);

/* The most D + Dv one warpgroup of the wgmma backward holds dK and dV
 * for (past it two split them, each up to it): 256, 192 with dropout. */
static int wgmma_key_dims(const bwd_case *c)
{
    return c->dropout > 0 ? 192 : 256;
}

/* Whether the wgmma kernels refuse c rightly: at their default schedule
 * they take D + Dv up to wgmma_key_dims always, and on two warpgroups
 * D and Dv each up to it; past that a refusal naming the limit is right;
 * a schedule the case gives may be refused by its state; whatever
 * compiles runs. */
static bool wgmma_refused(const bwd_case *c)
{
    int dv = c->dv ? c->dv : c->d;
    aj_op *op = bwd_case_op(ctx, c);
    aj_kernel *k = NULL;
    aj_status st = op ? bwd_case_compile(ctx, dev, op, c, &k) : AJ_OK;
    aj_kernel_destroy(k);
    aj_op_destroy(op);
    if (st == AJ_OK)
        return false;
    const char *msg = aj_last_error(ctx);
    int most = c->d > dv ? c->d : dv, key_dims = wgmma_key_dims(c);
    bool past = most > key_dims || (c->d + dv > key_dims && c->warpgroups == 1);
    bool limit = past && (strstr(msg, "flash backward on wgmma keeps dK and dV in registers") ||
                          strstr(msg, "flash backward on wgmma (schedule warpgroups) supports"));
    bool state = c->schedule && strstr(msg, "f32 values per thread");
    CHECK_MSG(st == AJ_ERR_UNSUPPORTED && (limit || state), "%s: refused on wgmma: %s",
              c->label, msg);
    printf("  %-60s refused on wgmma: %s\n", c->label, aj_last_error(ctx));
    return true;
}

/* c as the mode runs it: in wgmma mode on 1 or 2 warpgroups, in turn,
 * without its mma.sync schedule (but a case that names warpgroups);
 * false where the wgmma kernels refuse it (rightly: wgmma_refused). */
static bool as_run(const bwd_case *c, bwd_case *w)
{
    *w = *c;
    if (!wgmma)
        return true;
    if (c->variant == AJ_VARIANT_EFFICIENT)   /* not the flash template's: run in `full` */
        return false;
    if (!w->warpgroups) {   /* past what one warpgroup holds, two split dK and dV */
        int dv = c->dv ? c->dv : c->d;
        w->warpgroups = c->d + dv > wgmma_key_dims(c) ? 2 : 1 + (cases_run + wgmma_refusals) % 2;
        w->schedule = NULL;
    }
    if (!wgmma_refused(w))
        return true;
    wgmma_refusals++;
    return false;
}

/* Runs c unless the sanitizer pass samples it out (check_sampled). */
static void run(const bwd_case *c)
{
    bwd_case w;
    if (check_sampled() && as_run(c, &w))
        run_case(&w);
}

static void run_case(const bwd_case *c)
{
    cases_run++;
    clock_t t0 = clock();
    aj_op *op = bwd_case_op(ctx, c);
    aj_kernel *kernel = bwd_case_kernel(ctx, dev, op, c);
    if (!kernel) {
        aj_op_destroy(op);
        return;
    }
    int varlen = c->lens_q != NULL;
    int32_t cu_q[17] = {0}, cu_k[17] = {0};
    int max_q = 0, max_k = 0;
    if (varlen)
        for (int i = 0; i < c->b; i++) {
            cu_q[i + 1] = cu_q[i] + c->lens_q[i];
            cu_k[i + 1] = cu_k[i] + c->lens_k[i];
            max_q = c->lens_q[i] > max_q ? c->lens_q[i] : max_q;
            max_k = c->lens_k[i] > max_k ? c->lens_k[i] : max_k;
        }
    bwd_io x;
    bwd_io_make(&x, dev, c, cu_q, cu_k);
    int32_t *cu_dev[2] = {NULL, NULL};
    if (varlen) {
        const int32_t *cu[2] = {cu_q, cu_k};
        for (int i = 0; i < 2; i++) {
            CHECK(aj_device_alloc(dev, sizeof cu_q, (void **)&cu_dev[i]) == AJ_OK);
            CHECK(aj_device_copy_to(dev, cu_dev[i], cu[i], sizeof cu_q) == AJ_OK);
        }
    }
    bwd_io_fill(&x, c);

    bwd_slopes slopes;
    ref_problem p = bwd_case_problem(c, &slopes);
    bwd_slopes_on(dev, &slopes);
    if (varlen) {
        p.cu_q = cu_q;
        p.cu_k = cu_k;
    }
    /* expressions: side tensors made up for the declarations (as long as
     * the longest sequence), the reference reading the op's own nodes */
    side_data side = {.n = 0};
    aj_side_tensor side_dev[AJ_OP_TENSORS_MAX];
    aj_op_info info;   /* side.t's names point into it */
    if (is_expr(c->mask) || is_expr(c->score_mod)) {
        aj_op_get_info(op, &info);
        int longest = varlen ? (max_q > max_k ? max_q : max_k) : (c->sq > c->sk ? c->sq : c->sk);
        side_make(&info, c->b, c->hq, longest, c->seed, &side);
        ref_use_expressions(&p, op, side.t, side.n);
    }
    aj_status side_st = AJ_OK;
    side_to_device(dev, &side_st, side.t, side.n, side_dev);
    CHECK_MSG(side_st == AJ_OK, "%s: side tensors: %s", c->label, aj_last_error(ctx));
    ref_forward(&p, x.q.ref, x.k.ref, x.v.ref, x.o.ref, x.lse.ref);
    store_rounded(&x.o);
    store_rounded(&x.lse);   /* -inf stays -inf */

    aj_bwd_args a = bwd_case_args(c, &x, &slopes);
    a.side = side_dev;
    a.num_side = side.n;
    if (varlen) {
        a.cu_seqlens_q = cu_dev[0];
        a.cu_seqlens_k = cu_dev[1];
        a.batch = c->b;
        a.max_seqlen_q = max_q;
        a.max_seqlen_k = max_k;
    }
    tensor *outs[3] = {&x.dq, &x.dk, &x.dv};
    for (int t = 0; t < 3; t++)
        poison(outs[t]);
    aj_status st = aj_backward(ctx, dev, kernel, &a);
    CHECK_MSG(st == AJ_OK, "%s: %s", c->label, aj_last_error(ctx));
    if (st == AJ_OK)
        bwd_check_grads(c, &p, &x, NULL);
    if (c->pass_mask && st == AJ_OK)
        rerun_passed_mask(c, kernel, &a, outs);
    if (c->twin_mask && st == AJ_OK)
        rerun_twin_mask(c, &a, outs);
    /* the cpu backward's two plans (templates/cpu_bwd.c): fused on one
     * worker where the op has the plan, split on more workers than (kv
     * head, batch) pairs; both the first run's bits */
    if ((c->repeat || on_cpu) && st == AJ_OK) {
        void *first[3];
        save_bits(outs, first);
        rerun_same_bits(c, kernel, &a, outs, first, 1);
        rerun_same_bits(c, kernel, &a, outs, first, on_cpu ? c->b * c->hkv + 1 : 3);
        free_bits(first);
    }
    bwd_slopes_free(&slopes);
    bwd_io_release(&x);
    for (int i = 0; i < 2; i++)
        if (cu_dev[i])
            aj_device_free(dev, cu_dev[i]);
    side_free_device(dev, side_dev, side.n);
    side_free(&side);
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
    printf("  %-60s %.2f s\n", c->label, (double)(clock() - t0) / CLOCKS_PER_SEC);
}

static bwd_case base(const char *label, aj_dtype dtype, int d, const char *mask)
{
    return (bwd_case){.label = label, .dtype = dtype, .d = d, .mask = mask, .b = 1, .hq = 2,
                     .hkv = 1, .sq = 37, .sk = 70, .seed = 11, .deterministic = 1};
}

static const char *const matrix_masks[4] = {"none", "causal(top_left)", "causal(bottom_right)",
                                            "window(20, 5, top_left)"};

/* One case of a head-dim sweep at (d, dv) under mask m, GQA 2:1, tails in
 * both lengths (shorter ones past head dim 128); `label` is the caller's
 * buffer. */
static void run_dims_case(char *label, size_t cap, aj_dtype dtype, int d, int dv, int m,
                          int det)
{
    snprintf(label, cap, "%s d%d/%d %s%s", aj_dtype_name(dtype), d, dv, matrix_masks[m],
             det ? "" : " atomic dq");
    bwd_case c = base(label, dtype, d, matrix_masks[m]);
    c.dv = dv;
    c.deterministic = det;
    c.sq = d > 128 || dv > 128 ? 21 : 37;
    c.sk = d > 128 || dv > 128 ? 40 : 70;
    run(&c);
}

/* dtypes x head dims x masks (rotating; every mask at d 64); deterministic
 * and atomic dq alternate */
static void test_matrix(void)
{
    static const aj_dtype dtypes[2] = {AJ_DTYPE_F16, AJ_DTYPE_BF16};
    static const int dims[7][2] = {{32, 32},   {64, 64},   {96, 96}, {128, 128},
                                   {192, 192}, {256, 256}, {192, 128}};
    char label[96];
    for (int t = 0; t < 2; t++)
        for (int d = 0; d < 7; d++)
            for (int m = 0; m < 4; m++)
                if (dims[d][0] == 64 || m == (t + d) % 4)
                    run_dims_case(label, sizeof label, dtypes[t], dims[d][0], dims[d][1], m,
                                  (t + d + m) % 2);
}

/* head dims that are not multiples of 16: S = Q K^T and dP = dO V^T end in
 * the zero pad columns of their tiles, dK, dQ and dV have an odd number of
 * n8 tiles, or (72, 200, and 136 of 72/136: counts that do not split over
 * the warp columns) uneven warp shares, whose recomputed tile is never
 * stored (200 runs with atomic dq: nor added to dQacc); D != Dv both ways;
 * masks, dtypes and the dq mode rotating */
static void test_odd_dims(void)
{
    static const int dims[][2] = {{8, 8}, {24, 24}, {40, 40}, {72, 72}, {80, 80},
                                  {200, 200}, {40, 24}, {72, 136}, {248, 8}};
    char label[96];
    for (int d = 0; d < 9; d++)
        run_dims_case(label, sizeof label, d % 2 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16, dims[d][0],
                      dims[d][1], (d + d / 4) % 4, (d / 2) % 2);
}

/* the rows over base()'s case: deterministic, or with dQ by atomics */
static void run_rows(const bwd_case *rows, int n, int deterministic)
{
    bwd_case b = base(NULL, AJ_DTYPE_F16, 0, NULL);
    b.deterministic = deterministic;
    bwd_case_rows(&b, rows, n, run);
}

/* head dims past 256 (16 x 16 tiles on 8 warps by default, each warp a
 * share of every product's columns): D = Dv, odd multiples of 8, D != Dv
 * far apart both ways, every mask and both dq modes; then dropout with
 * GQA and atomic dq at 320 */
static void test_wide_dims(void)
{
    static const int dims[][2] = {{512, 512}, {264, 264}, {512, 8}, {8, 512}, {384, 296}};
    char label[96];
    for (int d = 0; d < 5; d++)
        run_dims_case(label, sizeof label, d % 2 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16, dims[d][0],
                      dims[d][1], d % 4, d % 2);
    static const bwd_case atomic[] = {
        {.label = "bf16 d320 GQA 4:2 dropout 0.2 causal(bottom_right), atomic dq",
         .dtype = AJ_DTYPE_BF16, .d = 320, .mask = "causal(bottom_right)", .hq = 4, .hkv = 2,
         .sq = 21, .sk = 40, .dropout = 0.2, .drop_seed = 77, .drop_offset = 3},
    };
    run_rows(atomic, sizeof atomic / sizeof atomic[0], 0);
}

static void test_shapes(void)
{
    static const bwd_case rows[] = {
        {.label = "f16 d64 GQA 4:1 causal(bottom_right), batch 2", .dtype = AJ_DTYPE_F16,
         .d = 64, .mask = "causal(bottom_right)", .b = 2, .hq = 8, .hkv = 2, .sq = 33, .sk = 33},
        {.label = "bf16 d32 Sq 70, Sk 37 causal: rows without keys", .dtype = AJ_DTYPE_BF16,
         .d = 32, .mask = "causal(bottom_right)", .sq = 70, .sk = 37},
    };
    static const bwd_case atomic[] = {
        {.label = "f16 d64 Sq 1, Sk 17, atomic dq", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "none", .sq = 1, .sk = 17},
    };
    run_rows(rows, sizeof rows / sizeof rows[0], 1);
    run_rows(atomic, sizeof atomic / sizeof atomic[0], 0);
}

static void test_offsets(void)
{
    const bwd_case b = base(NULL, AJ_DTYPE_F16, 0, NULL);
    bwd_offset_cases(&b, AJ_DTYPE_F16, AJ_DTYPE_BF16, run);
}

static void test_score_mods(void)
{
    static const bwd_case rows[] = {
        {.label = "f16 d64 softcap(5) causal", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "causal(top_left)", .score_mod = "softcap(5.0)", .magnitude = 3.0},
        {.label = "bf16 d128 alibi causal(bottom_right) GQA 2:1, offsets",
         .dtype = AJ_DTYPE_BF16, .d = 128, .mask = "causal(bottom_right)", .score_mod = "alibi",
         .hq = 4, .hkv = 2, .q_offset = 7},
    };
    run_rows(rows, sizeof rows / sizeof rows[0], 1);
}

static void test_dropout(void)
{
    static const bwd_case rows[] = {
        {.label = "f16 d64 GQA 2:1 dropout 0.2 causal", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "causal(top_left)", .dropout = 0.2, .drop_seed = 0x1234567890abcdefull,
         .drop_offset = (uint64_t)3 << 33 | 5},
    };
    static const bwd_case atomic[] = {
        {.label = "bf16 d64 GQA 4:1 dropout 0.3 window, offsets, atomic dq",
         .dtype = AJ_DTYPE_BF16, .d = 64, .mask = "window(20, 5, bottom_right)", .b = 2,
         .hq = 4, .q_offset = 40, .kv_offset = 9, .dropout = 0.3, .drop_seed = 42,
         .drop_offset = 7},
    };
    run_rows(rows, sizeof rows / sizeof rows[0], 1);
    run_rows(atomic, sizeof atomic / sizeof atomic[0], 0);
}

/* deterministic: the same bits on a rerun, on 1 and on 3 worker threads */
static void test_deterministic(void)
{
    static const bwd_case rows[] = {
        {.label = "f16 d64 GQA 4:1 causal: reruns, same bits", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "causal(top_left)", .hq = 4, .sq = 70, .sk = 70, .repeat = 1},
    };
    run_rows(rows, sizeof rows / sizeof rows[0], 1);
}

static void test_schedules(void)
{
    static const bwd_case rows[] = {
        {.label = "f16 d64 schedule (32, 32, 2 warps, 1 stage)", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "causal(top_left)",
         .schedule = "(block_m = 32, block_n = 32, warps = 2, stages = 1)"},
        /* the last resort of the default rule: 16 x 16 tiles on 8 warps,
         * where most warps' shares of the 16-column products are empty, as
         * 208/88 with dropout takes by default */
        {.label = "bf16 d208/88 default (16, 16, 8 warps), window alibi dropout 0.1",
         .dtype = AJ_DTYPE_BF16, .d = 208, .mask = "window(12, 3, bottom_right)", .dv = 88,
         .score_mod = "alibi", .dropout = 0.1, .sq = 37, .sk = 45},
    };
    static const bwd_case atomic[] = {
        {.label = "bf16 d128 schedule (128, 16, 8 warps, 2 stages), atomic dq",
         .dtype = AJ_DTYPE_BF16, .d = 128, .mask = "window(8, 8, top_left)",
         .schedule = "(block_m = 128, block_n = 16, warps = 8, stages = 2)"},
        /* dK, dV (3 tiles over 2 warp columns) and dQacc (over 4: one share
         * empty) in uneven shares, with dropout, as the default at d 24 has
         * them */
        {.label = "f16 d24 schedule (32, 64, 8 warps), dropout 0.1, atomic dq",
         .dtype = AJ_DTYPE_F16, .d = 24, .mask = "causal(bottom_right)",
         .schedule = "(block_m = 32, block_n = 64, warps = 8, stages = 2)", .dropout = 0.1},
        {.label = "f16 d40/24 schedule (16, 16, 8 warps, 1 stage), causal, atomic dq",
         .dtype = AJ_DTYPE_F16, .d = 40, .dv = 24, .mask = "causal(bottom_right)",
         .schedule = "(block_m = 16, block_n = 16, warps = 8, stages = 1)", .sk = 45},
    };
    run_rows(rows, sizeof rows / sizeof rows[0], 1);
    run_rows(atomic, sizeof atomic / sizeof atomic[0], 0);
}

/* packed sequences of very different lengths, one of them empty */
/* The cpu backward's fused plan without memory for its dQ sums (8 MB at
 * Sq 8192, D 128, two heads): in a child whose address space is capped
 * just above what it holds, aj_backward takes the split plan and gives the
 * fused plan's bits (templates/cpu_bwd.c). */
static void test_fused_without_memory(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    printf("  skipped the fused plan without memory: a sanitizer's allocator does not return "
           "NULL under an address-space cap\n");
    return;
#endif
    bwd_case c = {.label = "f32 d128 Sq 8192 Sk 16, the fused plan without memory",
                  .dtype = AJ_DTYPE_F32, .d = 128, .mask = "none", .b = 1, .hq = 2, .hkv = 1,
                  .sq = 8192, .sk = 16, .seed = 5, .deterministic = 1};
    aj_op *op = bwd_case_op(ctx, &c);
    aj_kernel *kernel = bwd_case_kernel(ctx, dev, op, &c);
    if (!kernel) {
        aj_op_destroy(op);
        return;
    }
    bwd_io x;
    bwd_io_make(&x, dev, &c, NULL, NULL);
    bwd_io_fill(&x, &c);
    bwd_slopes slopes;
    ref_problem p = bwd_case_problem(&c, &slopes);
    ref_forward(&p, x.q.ref, x.k.ref, x.v.ref, x.o.ref, x.lse.ref);
    store_rounded(&x.o);
    store_rounded(&x.lse);
    aj_bwd_args a = bwd_case_args(&c, &x, &slopes);
    tensor *outs[3] = {&x.dq, &x.dk, &x.dv};
    CHECK(aj_device_set_workers(dev, 1) == AJ_OK);   /* the fused plan */
    CHECK_MSG(aj_backward(ctx, dev, kernel, &a) == AJ_OK, "%s", aj_last_error(ctx));
    bwd_check_grads(&c, &p, &x, NULL);
    void *first[3];
    save_bits(outs, first);
    size_t ws = 0;
    CHECK(aj_backward_workspace_size(ctx, kernel, &a, &ws) == AJ_OK && ws > (8u << 20));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* a device of the child's own (the parent's pool threads are not
         * here), its one worker started before the cap; blocks of 1 MB and
         * more mapped and unmapped each time (no heap keeps the first
         * run's workspace for the second) */
        mallopt(M_MMAP_THRESHOLD, 1 << 20);
        aj_device *mine = NULL;
        if (aj_device_open(ctx, AJ_DEVICE_CPU, 0, &mine) != AJ_OK ||
            aj_device_set_workers(mine, 1) != AJ_OK)
            _exit(2);
        dev = mine;
        /* the pool's thread started by a run on a workspace of the test's
         * (the device's own scratch stays unmade) */
        aj_bwd_args given = a;
        given.workspace_bytes = ws;
        given.workspace = aligned_alloc(64, (ws + 63) / 64 * 64);
        if (!given.workspace)
            _exit(5);
        rerun_expect_bits(&c, kernel, &given, outs, first, "on the child's device");
        free(given.workspace);
        long pages = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (!f || fscanf(f, "%ld", &pages) != 1)
            _exit(3);
        fclose(f);
        struct rlimit cap = {(rlim_t)pages * 4096 + (2u << 20), RLIM_INFINITY};
        if (setrlimit(RLIMIT_AS, &cap) != 0)
            _exit(4);
        rerun_expect_bits(&c, kernel, &a, outs, first, "without memory for the fused plan");
        _exit(check_failed ? 1 : 0);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "%s: the child exited with %d (signal %d)", c.label,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1,
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    CHECK(aj_device_set_workers(dev, 0) == AJ_OK);
    free_bits(first);
    bwd_io_release(&x);
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
}

static void test_varlen(void)
{
    static const int lq1[4] = {37, 0, 5, 70}, lk1[4] = {20, 9, 64, 70};
    static const int lq2[3] = {1, 50, 17}, lk2[3] = {33, 50, 0};
    static const int lq3[2] = {12, 40}, lk3[2] = {40, 12};
    static const bwd_case rows[] = {
        {.label = "f16 d64 varlen x4 (an empty one) causal(bottom_right) GQA 2:1",
         .dtype = AJ_DTYPE_F16, .d = 64, .mask = "causal(bottom_right)", .b = 4, .lens_q = lq1,
         .lens_k = lk1},
        {.label = "f16 d32 varlen x2 dropout 0.2 causal, offsets, GQA 4:1",
         .dtype = AJ_DTYPE_F16, .d = 32, .mask = "causal(top_left)", .b = 2, .hq = 4,
         .lens_q = lq3, .lens_k = lk3, .q_offset = 3, .dropout = 0.2, .drop_seed = 77,
         .drop_offset = 12, .repeat = 1},
    };
    static const bwd_case atomic[] = {
        {.label = "bf16 d128 varlen x3 (no keys in one) window, atomic dq",
         .dtype = AJ_DTYPE_BF16, .d = 128, .mask = "window(10, 3, top_left)", .b = 3,
         .lens_q = lq2, .lens_k = lk2},
    };
    run_rows(rows, sizeof rows / sizeof rows[0], 1);
    run_rows(atomic, sizeof atomic / sizeof atomic[0], 0);
}

/* Expression masks and score_mods through the flash backward (the
 * scores section below, with the flash variant), and a document mask at
 * one pipeline stage: each step takes its tile's class as it issues the
 * copies. */
static void test_score_examples(void);
static void test_score_random(int count);
static aj_variant score_variant = AJ_VARIANT_EFFICIENT;

static void test_expressions(void)
{
    score_variant = AJ_VARIANT_FLASH;
    test_score_examples();
    test_score_random(200);
    bwd_case d = base("f16 d32 document mask, schedule (32, 32, 2 warps, 1 stage)", AJ_DTYPE_F16,
                     32, "expr(doc[b, q] == doc[b, k] && k <= q)");
    d.tensors = "(doc: i32[2])";
    d.schedule = "(block_m = 32, block_n = 32, warps = 2, stages = 1)";
    d.b = 2;
    d.sq = d.sk = 150;
    run(&d);
}

/* Tiles of class full skip the per-element mask test: a causal mask and a
 * chunked one at 32-aligned lengths and tiles (tiles full, partial on the
 * diagonal, skipped) give the bits of the same masks written with a rest
 * the tile classes cannot decide (k % 2 is 0 or 1), whose every tile is
 * partial; both variants. */
static void test_full_tiles(void)
{
    static const struct { const char *label, *mask, *twin; } masks[2] = {
        {"causal", "causal(top_left)", "expr(k <= q && (k % 2 == 0 || k % 2 == 1))"},
        {"chunks of 64", "expr(q / 64 == k / 64)",
         "expr(q / 64 == k / 64 && (k % 2 == 0 || k % 2 == 1))"},
    };
    static const struct { aj_variant variant; const char *name, *schedule; } variants[2] = {
        {AJ_VARIANT_EFFICIENT, "efficient", "(block_m = 32, block_n = 32, warps = 2, stages = 1)"},
        {AJ_VARIANT_FLASH, "flash", "(block_m = 32, block_n = 32, warps = 2, stages = 2)"},
    };
    for (int v = 0; v < 2; v++)
        for (int m = 0; m < 2; m++) {
            char label[128];
            snprintf(label, sizeof label, "f16 d32 %s %s 128 x 128, full tiles as tested ones",
                     variants[v].name, masks[m].label);
            bwd_case c = base(label, AJ_DTYPE_F16, 32, masks[m].mask);
            c.variant = variants[v].variant;
            c.schedule = variants[v].schedule;
            c.sq = c.sk = 128;
            c.twin_mask = masks[m].twin;
            run(&c);
        }
}

/* Valid arguments of a small problem (padded, or varlen of two sequences
 * 5 + 7 queries and 9 + 3 keys) for the error checks below. */
typedef struct err_setup {
    tensor x[9];    /* q k v o do lse dq dk dv */
    int32_t *cu[2];
    aj_bwd_args a;
} err_setup;

static void make(tensor *x, aj_dtype dtype, int rank, const int64_t *shape)
{
    tensor_make(x, dev, dtype, rank, shape);
}

static void err_setup_make(err_setup *e, int varlen)
{
    static const int32_t cu_q[3] = {0, 5, 12}, cu_k[3] = {0, 9, 12};
    memset(e, 0, sizeof *e);
    const int64_t qs[4] = {1, 2, 12, 64}, ks[4] = {1, 1, 12, 64}, ls[3] = {1, 2, 12};
    const int64_t pq[3] = {12, 2, 64}, pk[3] = {12, 1, 64}, pl[2] = {2, 12};
    for (int i = 0; i < 9; i++) {
        int is_k = i == 1 || i == 2 || i == 7 || i == 8;
        if (i == 5)
            make(&e->x[i], AJ_DTYPE_F32, varlen ? 2 : 3, varlen ? pl : ls);
        else
            make(&e->x[i], AJ_DTYPE_F16, varlen ? 3 : 4,
                 varlen ? (is_k ? pk : pq) : (is_k ? ks : qs));
        memset(e->x[i].ref, 0, e->x[i].n * sizeof(double));
        store_rounded(&e->x[i]);
    }
    aj_bwd_args a = AJ_BWD_ARGS_INIT;
    a.q = e->x[0].t;
    a.k = e->x[1].t;
    a.v = e->x[2].t;
    a.o = e->x[3].t;
    a.do_ = e->x[4].t;
    a.lse = e->x[5].t;
    a.dq = e->x[6].t;
    a.dk = e->x[7].t;
    a.dv = e->x[8].t;
    if (varlen) {
        const int32_t *host[2] = {cu_q, cu_k};
        for (int i = 0; i < 2; i++) {
            CHECK(aj_device_alloc(dev, sizeof cu_q, (void **)&e->cu[i]) == AJ_OK);
            CHECK(aj_device_copy_to(dev, e->cu[i], host[i], sizeof cu_q) == AJ_OK);
        }
        a.cu_seqlens_q = e->cu[0];
        a.cu_seqlens_k = e->cu[1];
        a.batch = 2;
        a.max_seqlen_q = 7;
        a.max_seqlen_k = 9;
    }
    e->a = a;
}

static void err_setup_free(err_setup *e)
{
    for (int i = 0; i < 9; i++)
        tensor_release(&e->x[i]);
    for (int i = 0; i < 2; i++)
        if (e->cu[i])
            aj_device_free(dev, e->cu[i]);
}

static aj_kernel *compile_text(const char *text)
{
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "errors", &op), AJ_OK);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
    aj_op_destroy(op);
    return k;
}

/* aj_backward_workspace_size, a caller's workspace, and what is wrong
 * with a bad one */
static void test_workspace(void)
{
    aj_kernel *det = compile_text("attention backward flash { dtype = f16 head_dim = 64 "
                                  "deterministic = true }");
    aj_kernel *atomic = compile_text("attention backward flash { dtype = f16 head_dim = 64 }");
    aj_kernel *eff = compile_text("attention backward efficient { dtype = f16 head_dim = 64 }");
    if (!det || !atomic || !eff)
        return;
    err_setup e;
    err_setup_make(&e, 0);
    size_t bytes = 1;
    /* Delta: 1 x 2 x 12 rows, then 24 x 64 f32 dQ sums without determinism */
    CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, det, &e.a, &bytes), AJ_OK);
    CHECK_MSG(bytes == 24 * 4, "deterministic workspace: %zu bytes", bytes);
    CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, atomic, &e.a, &bytes), AJ_OK);
    CHECK_MSG(bytes == 24 * 4 + 24 * 64 * 4, "atomic workspace: %zu bytes", bytes);
    CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, eff, &e.a, &bytes), AJ_OK);
    CHECK_MSG(bytes == 0, "efficient backward workspace: %zu bytes", bytes);
    CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, det, &e.a, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_backward_workspace_size: bytes is NULL");
    CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, NULL, &e.a, &bytes), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_backward_workspace_size: kernel is NULL");
    aj_bwd_args bad = e.a;
    bad.struct_size = 8;
    CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, det, &bad, &bytes), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "args->struct_size = 8");
    bad = e.a;
    bad.dq.shape[2] = 11;
    CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, det, &bad, &bytes), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "dq.shape[2] = 11, want 12");

    void *ws = NULL;
    size_t need = 24 * 4 + 24 * 64 * 4;
    CHECK(aj_device_alloc(dev, need + 16, &ws) == AJ_OK);
    aj_bwd_args a = e.a;
    a.workspace = ws;
    a.workspace_bytes = need;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, atomic, &a), AJ_OK);
    a.workspace_bytes = need - 4;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, atomic, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_backward: workspace_bytes = 6236, want at least 6240");
    a.workspace = (char *)ws + 4;
    a.workspace_bytes = need;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, atomic, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "is not 16-byte aligned");
    aj_device_free(dev, ws);
    err_setup_free(&e);
    aj_kernel_destroy(det);
    aj_kernel_destroy(atomic);
    aj_kernel_destroy(eff);
}

/* the varlen arguments aj_backward checks: status and message each */
static void test_varlen_errors(void)
{
    aj_kernel *k = compile_text("attention backward flash { dtype = f16 head_dim = 64 "
                                "layout = varlen mask = causal(bottom_right) }");
    if (!k)
        return;
    err_setup e;
    err_setup_make(&e, 1);
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &e.a), AJ_OK);
    size_t bytes = 0;
    CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, k, &e.a, &bytes), AJ_OK);
    /* Delta and the dQ sums (the cpu's fused plan's; sim's atomic dQ) */
    CHECK_MSG(bytes == 24 * 4 + 24 * 64 * 4, "varlen workspace: %zu bytes", bytes);

    aj_bwd_args a = e.a;
    a.cu_seqlens_k = NULL;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "cu_seqlens_q and cu_seqlens_k are required by layout = varlen kernels "
                     "(got a pointer and NULL)");
    a = e.a;
    a.max_seqlen_q = -1;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "max_seqlen_q = -1");
    a = e.a;
    a.batch = -2;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "batch = -2");
    a = e.a;
    a.max_seqlen_k = 8;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "sequence 0 has more keys than max_seqlen_k");
    a = e.a;
    a.batch = 1;   /* cu_seqlens_q[1] = 5 is not Tq */
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "cu_seqlens_q[1] is not Tq (q's tokens)");
    static const int32_t down[3] = {0, 9, 7}, shifted[3] = {1, 5, 12};
    CHECK(aj_device_copy_to(dev, e.cu[1], down, sizeof down) == AJ_OK);
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &e.a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "cu_seqlens_k[2] is below cu_seqlens_k[1]; offsets must not decrease "
                     "(found by the kernel of sequence 1");
    CHECK(aj_device_copy_to(dev, e.cu[0], shifted, sizeof shifted) == AJ_OK);
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &e.a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "cu_seqlens_q[0] is not 0");
    a = e.a;
    a.lse.shape[1] = 11;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "lse.shape[1] = 11, want 12 (q's tokens)");
    a = e.a;
    a.q = e.x[6].t;
    a.q.rank = 4;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "q.rank = 4, want 3");
    a = e.a;
    a.dk.shape[1] = 2;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "dk.shape[1] = 2, want 1 (k's heads)");
    err_setup_free(&e);
    aj_kernel_destroy(k);
}

/* The backward half of the head-dim sweep (test_default_schedules.c runs
 * the forward half): every SWEEP_SAMPLE_STRIDE-th case of
 * tests/lib/sweep_cases.h that is a backward op, both variants, on this
 * device, B1 H2, lengths 17..40 from the case's index.  Bias cases run
 * without the bias here (their dbias is test_sim_backward's); the
 * template's claim decides which cases a device takes (flash f32: none).
 * On cpu, where one kernel serves both variants and a backward takes about
 * a second to compile, every fourth case of the sample.  Then the
 * head-dim walk (sweep_dim_case): every D and Dv of the device's range. */
#define SWEEP_SAMPLE_STRIDE 37

/* Backward sweep case `s` (number i: lengths, GQA and seed) on this
 * device: 1 when it ran, 0 when the device's template declines it. */
static int run_sweep_case(int i, sweep_case s)
{
    s.bias = 0;
    char spec[512], label[160];
    sweep_spec(&s, spec, sizeof spec);
    sweep_label(&s, label, sizeof label);
    aj_op *op = NULL;
    aj_kernel *probe = NULL;
    CHECK_MSG(aj_op_parse(ctx, spec, strlen(spec), label, &op) == AJ_OK, "%s: %s", label,
              aj_last_error(ctx));
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    aj_status st = op ? aj_compile(ctx, op, &opt, &probe) : AJ_ERR_INVALID_ARG;
    aj_op_destroy(op);
    aj_kernel_destroy(probe);
    if (st != AJ_OK) {   /* declined: the accept sweep fails refused defaults */
        CHECK_MSG(strncmp(aj_last_error(ctx), "schedule:", 9) != 0, "%s: %s", label,
                  aj_last_error(ctx));
        return 0;
    }
    bwd_case c = base(label, s.dtype, s.d, s.mask);
    c.variant = s.variant;
    c.dv = s.dv;
    c.score_mod = strcmp(s.score_mod, "none") ? s.score_mod : NULL;
    c.hkv = i % 2 ? 1 : 2;
    c.sq = 17 + i % 24;
    c.sk = 17 + (i / 24) % 24;
    c.seed = (uint64_t)i;
    c.deterministic = s.variant == AJ_VARIANT_FLASH && i % 3 == 0;
    run(&c);
    return 1;
}

static void test_sweep_sample(void)
{
    int ran = 0, walked = 0;
    int stride = on_cpu ? 4 * SWEEP_SAMPLE_STRIDE : SWEEP_SAMPLE_STRIDE;
    for (int i = 0; i < SWEEP_COUNT; i += stride) {
        sweep_case s = sweep_case_at(i);
        if (s.kind == AJ_KIND_BACKWARD)
            ran += run_sweep_case(i, s);
    }
    for (int k = 0; k < SWEEP_DIMS; k++)
        walked += run_sweep_case(SWEEP_COUNT + k, sweep_dim_case(k, AJ_KIND_BACKWARD));
    printf("sweep: %d backward cases and %d of the head-dim walk on %s against the "
           "reference\n", ran, walked, aj_target_name(aj_device_target(dev)));
}

/* ---------------------------------------------------------------- scores */

/* Every spec of examples/specs/scores ($AJ_SCORE_EXAMPLES) as a backward op of
 * its dtype, head dim, tensors, mask and score_mod: B 2, GQA 2:1, lengths
 * past a 128-token chunk and a 64-key window; then a document mask over
 * the bottom-right diagonal of varlen sequences, whose totals are each
 * sequence's own. */
static bwd_case score_case(const char *name, aj_dtype dtype, int d, const char *mask)
{
    const bwd_case b = base(NULL, AJ_DTYPE_F16, 0, NULL);
    const bwd_case row = {.label = name, .variant = score_variant, .dtype = dtype, .d = d,
                          .mask = mask, .b = 2, .hq = 4, .hkv = 2, .sq = 150, .sk = 160};
    return bwd_case_over(&b, &row);
}

static void run_score_example(const char *name, const score_example *ex, int index, void *user)
{
    (void)user;
    bwd_case c = score_case(name, ex->info.dtype, ex->info.head_dim, ex->mask);
    c.score_mod = strcmp(ex->mod, "none") ? ex->mod : NULL;
    c.tensors = ex->tensors[0] ? ex->tensors : NULL;
    c.seed = 21 + (uint64_t)index;
    run(&c);
}

static void test_score_examples(void)
{
    const char *dir = score_examples_dir();
    int seen = 0, files = score_examples_each(ctx, dir, run_score_example, NULL, &seen);
    CHECK_MSG(files >= 0, "cannot open %s", dir);
    CHECK_MSG(seen == files, "%d of %d specs in %s parse: %s", seen, files, dir,
              aj_last_error(ctx));
    CHECK_MSG(seen >= 7, "only %d example specs in %s", seen, dir);
    static const int lq[3] = {40, 0, 23}, lk[3] = {45, 9, 70};
    /* a mask interval arithmetic cannot class: the launches build its
     * block mask (runtime/block_mask.c), exact per tile */
    bwd_case nl = score_case("nonlinear mask, block mask built by the launch", AJ_DTYPE_BF16,
                            32, "expr((q * k) % 3 != 0 || k <= q)");
    run(&nl);
    bwd_case doc = score_case("document mask, the forward's block mask passed", AJ_DTYPE_BF16, 32,
                             "expr(doc[b, q] == doc[b, k] && k <= q)");
    doc.tensors = "(doc: i32[2])";
    doc.pass_mask = 1;
    run(&doc);
    bwd_case c = base("varlen x3 document mask, bottom_right by expression", AJ_DTYPE_BF16, 32,
                     "expr(doc[b, q] == doc[b, k] && k <= q + (sk - sq))");
    c.variant = score_variant;
    c.tensors = "(doc: i32[2])";
    c.b = 3;
    c.lens_q = lq;
    c.lens_k = lk;
    if (on_cpu || score_variant == AJ_VARIANT_FLASH) {
        run(&c);
        return;
    }
    /* the efficient backward's GPU template takes padded layouts only:
     * refused, naming the layout (the flash variant's run above has it) */
    aj_op *op = bwd_case_op(ctx, &c);
    aj_kernel *k = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    aj_status st = op ? aj_compile(ctx, op, &opt, &k) : AJ_ERR_INVALID_ARG;
    CHECK_MSG(st == AJ_ERR_UNSUPPORTED && strstr(aj_last_error(ctx), "layout = varlen"),
              "%s: %s (%s)", c.label, aj_status_str(st), aj_last_error(ctx));
    aj_kernel_destroy(k);
    aj_op_destroy(op);
}

/* The random cases' side tensors, tf bf16 on the cpu and f16 on sim
 * (score_cases.h's rx_tensors). */
static const char *random_tensors(void)
{
    return rx_tensors(on_cpu ? AJ_SIDE_BF16 : AJ_SIDE_F16);
}

/* The problem of the random cases: a position offset, two small side
 * tensors, f16, head dim 16, B 2; `mask` and `score_mod` as a case's. */
static bwd_case random_problem(const char *label, const char *field, bool score, uint64_t seed)
{
    const bwd_case b = base(NULL, AJ_DTYPE_F16, 0, NULL);
    const bwd_case row = {.label = label, .variant = score_variant, .dtype = AJ_DTYPE_F16,
                          .d = 16, .mask = score ? "causal(top_left)" : field,
                          .score_mod = score ? field : NULL, .tensors = random_tensors(),
                          .b = 2, .sq = 23, .sk = 30, .q_offset = 3, .seed = seed};
    return bwd_case_over(&b, &row);
}

/* Whether c fails, its failures left uncounted (their messages still
 * print: a batch's cases run alone, and shrink probes, only once the
 * batch has failed). */
static bool case_fails(const bwd_case *c)
{
    int passed = check_passed, failed = check_failed;
    bwd_case w;
    if (as_run(c, &w))
        run_case(&w);
    bool fails = check_failed > failed;
    check_passed = passed;
    check_failed = failed;
    return fails;
}

/* Random case t->index alone, the tree at root (Hq 2, GQA 2:1). */
static bool random_fails(rx_tree *t, int root, void *user)
{
    (void)user;
    static char text[8192], label[64];
    rx_expression(t, root, t->score, text, sizeof text);
    snprintf(label, sizeof label, "random %s %d", t->score ? "score_mod" : "mask", t->index);
    bwd_case c = random_problem(label, text, t->score, (uint64_t)t->index + 1);
    return case_fails(&c);
}

static void random_failed(rx_tree *t, int root, void *user)
{
    (void)user;
    char text[8192];
    rx_expression(t, root, t->score, text, sizeof text);
    CHECK_MSG(0, "random backward case %d fails; shrunk to:\n  tensors = %s\n  %s = %s",
              t->index, random_tensors(), t->score ? "score_mod" : "mask", text);
}

/* A batch of random cases (score_cases.h's rx_batch), one per (b, h)
 * plane of B 2, Hq 4, GQA 2:1, the tolerance per plane; whether it
 * fails (sampled out under AJ_TEST_SAMPLE: passes). */
static bool batch_fails(rx_batch *b, void *user)
{
    (void)user;
    static char field[33000], label[96];
    if (!check_sampled())
        return false;
    rx_batch_field(b, field, sizeof field);
    snprintf(label, sizeof label, "random %ss %d .. %d (%d planes)",
             b->score ? "score_mod" : "mask", b->t[0].index, b->t[b->count - 1].index, b->count);
    bwd_case c = random_problem(label, field, b->score, (uint64_t)b->t[0].index + 1);
    c.hq = RX_BATCH_H;
    c.hkv = RX_BATCH_H / 2;
    c.b = RX_BATCH_B;
    c.per_plane = 1;
    return case_fails(&c);
}

/* `count` random masks and score_mods over b, h, q, k, sq, sk, score and
 * two small side tensors backward, in batches (rx_batch_cases). */
static void test_score_random(int count)
{
    static rx_batch b;
    count = check_sample_count(count);
    const rx_batch_runner r = {ctx, random_tensors(), batch_fails, random_fails, random_failed,
                               NULL, "backward"};
    int launches = 0, failed = rx_batch_cases(&b, count, 0xbacc0000u, &r, &launches);
    printf("random: %d expressions backward on %s in %d launches, %d failed\n", count,
           aj_target_name(aj_device_target(dev)), launches, failed);
}

/* the score programs' sample: the repeats under AJ_CPU_ISA (their code
 * differs from this host's in vector width alone) take a quarter of it */
static void test_score_sample(void)
{
    test_score_examples();
    test_score_random(getenv("AJ_CPU_ISA") ? 50 : 200);
}

/* The wgmma kernels run on sim and sm_90a GPUs: another GPU skips them
 * (exit 77, tests/gpu/run.sh's flash_bwd_wgmma step). */
static void test_wgmma_target(void)
{
    bwd_case c = base("f16 d64 on wgmma", AJ_DTYPE_F16, 64, "none");
    c.warpgroups = 1;
    aj_op *op = bwd_case_op(ctx, &c);
    aj_kernel *k = NULL;
    aj_status st = op ? bwd_case_compile(ctx, dev, op, &c, &k) : AJ_ERR_INTERNAL;
    aj_kernel_destroy(k);
    aj_op_destroy(op);
    if (st == AJ_ERR_UNSUPPORTED && aj_device_target(dev) != AJ_TARGET_SIM) {
        printf("SKIP: the flash backward's wgmma kernels need sm_90a, which %s does not run: "
               "%s\n", aj_target_name(aj_device_target(dev)), aj_last_error(ctx));
        exit(77);
    }
    CHECK_MSG(st == AJ_OK, "%s: %s", c.label, aj_last_error(ctx));
}

/* Explicit schedules on wgmma: each walked tile, one and two stages, one
 * and two warpgroups; a schedule whose state is past the budget refused
 * by name, with the widest tile that fits (which the defaults take). */
static void test_wgmma_schedules(void)
{
    static const int lens_q[3] = {5, 70, 33}, lens_k[3] = {66, 9, 80};
    static const bwd_case rows[] = {
        {.label = "bf16 d160/136 wgmma x2 split, varlen x3 causal(bottom_right)",
         .dtype = AJ_DTYPE_BF16, .d = 160, .dv = 136, .mask = "causal(bottom_right)", .b = 3,
         .lens_q = lens_q, .lens_k = lens_k, .warpgroups = 2},
        {.label = "f16 d64 wgmma x1 (block_m = 16, stages = 1) causal", .dtype = AJ_DTYPE_F16,
         .d = 64, .mask = "causal(bottom_right)", .warpgroups = 1,
         .schedule = "(block_m = 16, stages = 1)"},
        {.label = "bf16 d128 wgmma x2 (block_m = 32, stages = 2) window, atomic dq",
         .dtype = AJ_DTYPE_BF16, .d = 128, .mask = "window(20, 5, top_left)", .warpgroups = 2,
         .schedule = "(block_m = 32, stages = 2)", .deterministic = -1},
        {.label = "bf16 d256/192 wgmma x2 split (block_m = 16, stages = 1), atomic dq",
         .dtype = AJ_DTYPE_BF16, .d = 256, .dv = 192, .mask = "causal(bottom_right)",
         .sq = 21, .sk = 40, .warpgroups = 2, .schedule = "(block_m = 16, stages = 1)",
         .deterministic = -1},
        /* split (two warpgroups share the keys, one keeps dV, the other
         * dK) with D < Dv, two key blocks and full tiles, dropout, varlen */
        {.label = "f16 d120/200 wgmma x2 split, Sk 150: two key blocks, full tiles",
         .dtype = AJ_DTYPE_F16, .d = 120, .dv = 200, .mask = "none", .sq = 70, .sk = 150,
         .warpgroups = 2},
        {.label = "bf16 d104 wgmma x2 split, dropout 0.2 window, GQA 4:2, atomic dq",
         .dtype = AJ_DTYPE_BF16, .d = 104, .mask = "window(30, 10, bottom_right)", .hq = 4,
         .hkv = 2, .sk = 140, .dropout = 0.2, .drop_seed = 5, .drop_offset = 9,
         .warpgroups = 2, .deterministic = -1},
        {.label = "f16 d40/72 wgmma x2 (block_m = 64, stages = 1) GQA 4:2", .dtype = AJ_DTYPE_F16,
         .d = 40, .dv = 72, .mask = "none", .hq = 4, .hkv = 2, .warpgroups = 2,
         .schedule = "(block_m = 64, stages = 1)"},
        {.label = "bf16 d64 wgmma x1 (block_m = 64, block_n = 64, warps = 4), reruns",
         .dtype = AJ_DTYPE_BF16, .d = 64, .mask = "causal(top_left)", .warpgroups = 1,
         .schedule = "(block_m = 64, block_n = 64, warps = 4)", .repeat = 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        bwd_case c = bwd_case_over(&(bwd_case){.b = 1, .hq = 2, .hkv = 1, .sq = 37, .sk = 70,
                                               .seed = 11, .deterministic = 1},
                                   &rows[i]);
        c.deterministic = rows[i].deterministic != -1;
        run(&c);
    }
    /* GPU targets without wgmma; past the budget at D 128 (the advice: a
     * tile that fits); what the kernels do not take */
    static const struct { aj_target target; const char *sched, *want; } refused[] = {
        {AJ_TARGET_SM_80, "(warpgroups = 1)", "schedule: warpgroups = 1 needs wgmma, which "
         "sm_80 lacks: target sm_90a"},
        {AJ_TARGET_SM_90, "(warpgroups = 2)", "needs wgmma, which sm_90 lacks"},
        {AJ_TARGET_SIM, "(warpgroups = 1, block_m = 128)", "schedule: block_m = 128: flash "
         "backward on wgmma walks tiles of 16, 32 or 64"},
        {AJ_TARGET_SIM, "(warpgroups = 2, block_m = 64)", "on wgmma keeps 256 f32 values per "
         "thread at head_dim 128/128 (dK and dV: 128, S and dP: 128; budget 200): use block_m "
         "= 32 or"},
        {AJ_TARGET_SM_90A, "(warpgroups = 1, block_n = 128)", "schedule: warpgroups = 1 runs "
         "flash backward's key blocks as block_n = 64 keys on warps = 4"},
    };
    aj_compile_options sim = AJ_COMPILE_OPTIONS_INIT;
    sim.target = AJ_TARGET_SIM;
    check_compile_refused(ctx, "attention backward flash { dtype = f16 head_dim = 192 "
                          "schedule = (warpgroups = 1) }", "t.aj", &sim, AJ_ERR_UNSUPPORTED,
                          "head_dim 192 + head_dim_v 192: flash backward on wgmma keeps dK "
                          "and dV in registers, one warpgroup both up to 256: use warpgroups "
                          "= 2 (they split them) or 0 (mma.sync)");
    check_compile_refused(ctx, "attention backward flash { dtype = f16 head_dim = 200 "
                          "dropout = 0.1 schedule = (warpgroups = 2) }", "t.aj", &sim,
                          AJ_ERR_UNSUPPORTED, "head_dim 200 / head_dim_v 200: flash backward "
                          "on wgmma keeps dK and dV in registers, each up to 192 with dropout");
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        char spec[256];
        snprintf(spec, sizeof spec, "attention backward flash { dtype = f16 head_dim = 128 "
                 "schedule = %s }", refused[i].sched);
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = refused[i].target;
        check_compile_refused(ctx, spec, "t.aj", &opt, AJ_ERR_UNSUPPORTED, refused[i].want);
    }
}

/* test_sim_flash_bwd [cuda | cpu | sim] [sweep | scores | full | wgmma]: on the sim
 * device (ctest), on a GPU (tests/gpu/run.sh), where no GPU means exit 77,
 * "skipped", or the varlen part on the cpu device; with `sweep`, the
 * backward half of the head-dim sweep instead, with `scores` the score
 * programs' sample (on sim the flash variant's also runs in the suite),
 * with `full` full tiles against tested ones (test_full_tiles), with
 * `wgmma` the suite on the wgmma kernels (schedule warpgroups). */
int main(int argc, char **argv)
{
    static void (*const suite[])(void) = {
        test_matrix, test_odd_dims, test_wide_dims, test_shapes, test_offsets, test_score_mods,
        test_dropout, test_deterministic, test_schedules, test_expressions, test_varlen,
        test_workspace, test_varlen_errors, NULL};
    static void (*const cpu_suite[])(void) = {test_varlen, test_varlen_errors,
                                              test_fused_without_memory, NULL};
    static void (*const sweep[])(void) = {test_sweep_sample, NULL};
    static void (*const full[])(void) = {test_full_tiles, NULL};
    static void (*const scores[])(void) = {test_score_sample, NULL};
    /* the suite on the wgmma kernels, less the cpu-only and argument checks */
    static void (*const wgmma_suite[])(void) = {
        test_wgmma_target, test_matrix, test_odd_dims, test_wide_dims, test_shapes,
        test_offsets, test_score_mods, test_dropout, test_deterministic, test_wgmma_schedules,
        test_expressions, test_varlen, test_full_tiles, NULL};
    static const struct {
        const char *name;
        void (*const *tests)(void);
    } modes[] = {{"sweep", sweep}, {"full", full}, {"scores", scores}, {"wgmma", wgmma_suite}};
    on_cpu = test_main_device(argc, argv, AJ_DEVICE_SIM) == AJ_DEVICE_CPU;
    test_main_args m = {.fallback = AJ_DEVICE_SIM, .ctx = &ctx, .dev = &dev,
                        .tests = on_cpu ? cpu_suite : suite, .cases = &cases_run};
    for (size_t i = 0; argc > 2 && i < sizeof modes / sizeof modes[0]; i++)
        if (strcmp(argv[2], modes[i].name) == 0)
            m.tests = modes[i].tests;
    wgmma = m.tests == wgmma_suite;
    return test_main(argc, argv, &m);
}
