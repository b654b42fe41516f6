/*
 * test_sim_forward.c -- the efficient forward kernel, run on the SIMT
 * emulator, against the float64 reference.
 *
 * The exact kernel IR that becomes PTX runs here, so this proves its
 * indexing, masks, tails and shared-memory reuse.  Tolerances per dtype are
 * in sim_harness.c (fwd_tolerance_for): O within atol + rtol |ref| of the
 * reference (f32 2e-5 + 5e-5, f16 1e-3 + 2e-3, bf16 8e-3 + 1.6e-2: the
 * output's own rounding dominates), LSE within 1e-4 + 1e-5 |ref|; rows that
 * see no key must give exactly O = 0 and LSE = -inf.
 *
 * `test_sim_forward cpu` runs the same matrix on the cpu device (ctest's
 * test_cpu_forward_matrix); test_cpu_forward adds what is the cpu's own.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "fwd_check.h"
#include "sim_harness.h"
#include "test_main.h"

static aj_ctx *ctx;
static aj_device *dev;
static int cases_run;
/* `test_sim_forward cpu` runs the same cases on the cpu device, where one
 * kernel serves both variants: the matrix then alternates them */
static int on_cpu;

static void run_variant(const fwd_case *c, const char *variant)
{
    if (!check_sampled())
        return;
    fwd_result r = fwd_run_case_variant(ctx, dev, c, NULL, variant);
    cases_run++;
    if (!fwd_check_result(ctx, c, &r))
        return;
    printf("%-58s O %.3f LSE %.3f empty rows %4lld  %6.1f Minst/s\n", c->label, r.max_err_o,
           r.max_err_lse, (long long)r.rows_without_keys,
           r.seconds > 0 ? (double)r.instructions / r.seconds / 1e6 : 0.0);
}

static void run(const fwd_case *c)
{
    run_variant(c, NULL);
}

/* dtype x head dim x mask, GQA 2:1, Sq != Sk with tails */
static void test_matrix(void)
{
    static const aj_dtype dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};
    static const int dims[] = {32, 64, 96, 128, 256};
    static const char *const masks[] = {"none", "causal(top_left)", "causal(bottom_right)",
                                        "window(20, 5, bottom_right)"};
    char label[128];
    for (int t = 0; t < 3; t++)
        for (int d = 0; d < 5; d++)
            for (int m = 0; m < 4; m++) {
                const char *variant = on_cpu && (t + d + m) % 2 ? "flash" : "efficient";
                snprintf(label, sizeof label, "%s %s d%d %s", variant, aj_dtype_name(dtypes[t]),
                         dims[d], masks[m]);
                fwd_case c = fwd_case_base(label, dtypes[t], dims[d], masks[m]);
                c.seed = (uint64_t)(t * 100 + d * 10 + m + 1);
                run_variant(&c, variant);
            }
}

/* lengths 1, 17, 127, 129, 300 on both sides, both causal alignments */
static void test_lengths(void)
{
    static const int lens[] = {1, 17, 127, 129, 300};
    char label[128];
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++) {
            const char *mask = (i + j) % 2 ? "causal(bottom_right)" : "causal(top_left)";
            snprintf(label, sizeof label, "f16 d64 Sq %d Sk %d %s", lens[i], lens[j], mask);
            fwd_case c = fwd_case_base(label, AJ_DTYPE_F16, 64, mask);
            c.sq = lens[i];
            c.sk = lens[j];
            c.seed = (uint64_t)(i * 5 + j + 7);
            run(&c);
        }
}

static void test_gqa(void)
{
    static const int ratios[][2] = {{4, 4}, {4, 2}, {8, 2}, {8, 1}};
    char label[128];
    for (int i = 0; i < 4; i++) {
        snprintf(label, sizeof label, "bf16 d64 GQA Hq %d Hkv %d, batch 2", ratios[i][0],
                 ratios[i][1]);
        fwd_case c = fwd_case_base(label, AJ_DTYPE_BF16, 64, "causal(bottom_right)");
        c.hq = ratios[i][0];
        c.hkv = ratios[i][1];
        c.b = 2;
        c.sq = 40;
        c.sk = 72;
        run(&c);
    }
}

/* global positions: a shard of a longer sequence masks as the whole would */
static void test_offsets_and_empty_rows(void)
{
    static const fwd_case rows[] = {
        {.label = "f32 d64 causal, q_offset 300 kv_offset 256", .dtype = AJ_DTYPE_F32, .d = 64,
         .mask = "causal(top_left)", .q_offset = 300, .kv_offset = 256},
        {.label = "f16 d64 causal, queries before every key: all rows empty",
         .dtype = AJ_DTYPE_F16, .d = 64, .mask = "causal(top_left)", .kv_offset = 1000},
        {.label = "bf16 d128 bottom_right Sq 100 > Sk 40: leading rows empty",
         .dtype = AJ_DTYPE_BF16, .d = 128, .mask = "causal(bottom_right)", .sq = 100, .sk = 40},
        {.label = "f16 d64 bottom_right with totals (shard of 4096 x 4096)",
         .dtype = AJ_DTYPE_F16, .d = 64, .mask = "causal(bottom_right)", .q_offset = 2048,
         .kv_offset = 1024, .sq_total = 4096, .sk_total = 4096},
        {.label = "f32 d32 window(8, 8) at offsets around 2^40", .dtype = AJ_DTYPE_F32, .d = 32,
         .mask = "window(8, 8)", .q_offset = (int64_t)1 << 40,
         .kv_offset = ((int64_t)1 << 40) + 30},
        {.label = "f16 d64 window, negative offsets", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "window(10, 3, bottom_right)", .q_offset = -50, .kv_offset = -70},
    };
    const fwd_case base = fwd_case_base(NULL, AJ_DTYPE_F16, 0, NULL);
    fwd_case_rows(&base, rows, sizeof rows / sizeof rows[0], run);

    fwd_case c = fwd_case_base("f16 d64 Sk = 0: every row empty", AJ_DTYPE_F16, 64, "none");
    c.sk = 0;
    run(&c);
}

/* |q|, |k| up to 100 at d 64: scores around 1e3..1e4 */
static void test_magnitude(void)
{
    static const fwd_case rows[] = {
        {.label = "f16 d64 scores ~1e4", .dtype = AJ_DTYPE_F16, .d = 64, .mask = "none"},
        {.label = "bf16 d128 scores ~1e4, causal", .dtype = AJ_DTYPE_BF16, .d = 128,
         .mask = "causal(top_left)"},
        {.label = "f32 d64 scores ~1e4, window", .dtype = AJ_DTYPE_F32, .d = 64,
         .mask = "window(16, 0)"},
    };
    fwd_case base = fwd_case_base(NULL, AJ_DTYPE_F16, 0, NULL);
    base.magnitude = 100.0;
    fwd_case_rows(&base, rows, sizeof rows / sizeof rows[0], run);
}

/* head dims, score_mods and strides (fwd_shape_rows, which test_cpu_forward
 * runs on cpu), narrow row groups, then warps and SIMT schedules: sim only */
static void test_variants(void)
{
    static const fwd_case rows[] = {
        {.label = "f32 d8 (narrow row groups)", .dtype = AJ_DTYPE_F32, .d = 8,
         .mask = "causal(top_left)"},
        {.label = "f16 d96 schedule (32, 64, 4)", .dtype = AJ_DTYPE_F16, .d = 96,
         .mask = "causal(bottom_right)", .schedule = "(block_m = 32, block_n = 64, warps = 4)"},
        {.label = "bf16 d64 schedule (64, 16, 8)", .dtype = AJ_DTYPE_BF16, .d = 64,
         .mask = "window(40, 40)", .schedule = "(block_m = 64, block_n = 16, warps = 8)"},
        {.label = "f32 d256 schedule (16, 16, 2)", .dtype = AJ_DTYPE_F32, .d = 256,
         .mask = "none", .schedule = "(block_m = 16, block_n = 16, warps = 2)"},
    };
    if (on_cpu)
        return;
    const fwd_case base = fwd_case_base(NULL, AJ_DTYPE_F16, 0, NULL);
    fwd_case_rows(&base, fwd_shape_rows, fwd_shape_row_count, run);
    fwd_case_rows(&base, rows, sizeof rows / sizeof rows[0], run);
}

int main(int argc, char **argv)
{
    static void (*const tests[])(void) = {
        test_matrix, test_lengths, test_gqa, test_offsets_and_empty_rows, test_magnitude,
        test_variants, NULL};
    on_cpu = test_main_device(argc, argv, AJ_DEVICE_SIM) == AJ_DEVICE_CPU;
    return test_main(argc, argv,
                     &(test_main_args){.fallback = AJ_DEVICE_SIM, .ctx = &ctx, .dev = &dev,
                                       .tests = tests, .cases = &cases_run,
                                       .cleanup = fwd_cache_clear});
}
