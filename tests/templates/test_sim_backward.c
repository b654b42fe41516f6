/*
 * test_sim_backward.c -- the efficient backward pass on sim against the
 * float64 reference (tests/lib/ref.c's ref_backward).
 *
 * Inputs (q, k, v, dO) are drawn from a seeded generator and rounded to
 * the op's dtype; O and LSE come from ref_forward and are rounded as a
 * forward kernel would store them (O to the dtype, LSE to f32), and the
 * reference backward is fed those same rounded values.  dQ, dK and dV are
 * outputs in the op's dtype, so each tensor is checked with a norm-wise
 * bound:
 *
 *     max |got - ref| <= atol + rtol * max |ref|       (per tensor)
 *
 * with the dtype's storage rounding (ref_storage_tolerance).  Cases with dropout pass the
 * reference the same p, seed and offset; cases with bias check dbias (f32,
 * the bias's broadcast shape) against ref_backward's dbias the same way.
 *
 *   test_sim_backward [cuda | cpu]: on sim (the default), a GPU, or the cpu
 *   target's kernels on the cpu device (ctest test_cpu_backward, which
 *   adds the flash variant and longer sequences).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"
#define BWD_STORAGE_TOLERANCE
#include "bwd_case.h"
#include "test_main.h"

static aj_ctx *ctx;
static aj_device *dev;
static int cases_run;
static int on_cpu;   /* the cpu device: test_cpu_variant_and_long runs */

/* ---------------------------------------------------------------- cases */

/* A contiguous BHSD tensor on the test's device. */
static void make(tensor *x, aj_dtype dtype, int64_t b, int64_t h, int64_t s, int64_t d)
{
    tensor_make(x, dev, dtype, 4, (const int64_t[]){b, h, s, d});
}

/* Runs one case; with c->repeat, runs it again and wants identical bits. */
static void run(const bwd_case *c)
{
    if (!check_sampled())
        return;
    cases_run++;
    aj_op *op = bwd_case_op(ctx, c);
    aj_kernel *kernel = bwd_case_kernel(ctx, dev, op, c);
    aj_op_destroy(op);
    if (!kernel)
        return;
    bwd_io x;
    bwd_io_make(&x, dev, c, NULL, NULL);
    uint64_t rng = bwd_io_fill(&x, c);
    bwd_slopes slopes;
    ref_problem p = bwd_case_problem(c, &slopes);
    bwd_slopes_on(dev, &slopes);
    /* bias: contiguous in the broadcast shape, size-1 dims stride 0 */
    int has_bias = c->bias_shape[3] != 0;
    tensor bias, dbias;
    memset(&bias, 0, sizeof bias);
    memset(&dbias, 0, sizeof dbias);
    if (has_bias) {
        const int64_t *bs = c->bias_shape;
        make(&bias, c->dtype, bs[0], bs[1], bs[2], bs[3]);
        make(&dbias, AJ_DTYPE_F32, bs[0], bs[1], bs[2], bs[3]);
        fill(&bias, 2.0, &rng);
        p.bias = bias.ref;
        memcpy(p.bias_shape, bs, sizeof p.bias_shape);
    }
    ref_forward(&p, x.q.ref, x.k.ref, x.v.ref, x.o.ref, x.lse.ref);
    store_rounded(&x.o);
    store_rounded(&x.lse);   /* -inf stays -inf */

    aj_bwd_args a = bwd_case_args(c, &x, &slopes);
    if (has_bias) {
        a.bias = bias.t;
        a.dbias = dbias.t;
        poison(&dbias);
    }
    poison(&x.dq);
    poison(&x.dk);
    poison(&x.dv);
    aj_status st = aj_backward(ctx, dev, kernel, &a);
    CHECK_MSG(st == AJ_OK, "%s: %s", c->label, aj_last_error(ctx));
    /* dbias (f32) is checked with f32's tolerance pair */
    if (st == AJ_OK)
        bwd_check_grads(c, &p, &x, has_bias ? &dbias : NULL);
    if (c->repeat && st == AJ_OK) {
        static const char *const names[4] = {"dq", "dk", "dv", "dbias"};
        tensor *outs[4] = {&x.dq, &x.dk, &x.dv, &dbias};
        int nouts = has_bias ? 4 : 3;
        void *first[4];
        for (int t = 0; t < nouts; t++) {
            first[t] = malloc(tensor_bytes(outs[t]) + 1);
            CHECK(aj_device_copy_from(dev, first[t], outs[t]->t.data, tensor_bytes(outs[t])) ==
                  AJ_OK);
            poison(outs[t]);
        }
        CHECK(aj_backward(ctx, dev, kernel, &a) == AJ_OK);
        for (int t = 0; t < nouts; t++) {
            CHECK(aj_device_copy_from(dev, outs[t]->host, outs[t]->t.data,
                                      tensor_bytes(outs[t])) == AJ_OK);
            CHECK_MSG(memcmp(first[t], outs[t]->host, tensor_bytes(outs[t])) == 0,
                      "%s: %s differs between two runs", c->label, names[t]);
            free(first[t]);
        }
    }
    if (has_bias) {
        tensor_release(&bias);
        tensor_release(&dbias);
    }
    bwd_slopes_free(&slopes);
    bwd_io_release(&x);
    aj_kernel_destroy(kernel);
}

static bwd_case base(const char *label, aj_dtype dtype, int d, const char *mask)
{
    return (bwd_case){.label = label, .variant = AJ_VARIANT_EFFICIENT, .dtype = dtype, .d = d,
                      .mask = mask, .b = 1, .hq = 2, .hkv = 1, .sq = 37, .sk = 70, .seed = 11};
}

/* dtypes x head dims x masks, GQA 2:1, Sq != Sk with tails */
static void test_matrix(void)
{
    static const aj_dtype dtypes[3] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};
    static const int dims[5][2] = {{32, 32}, {64, 64}, {128, 128}, {256, 256}, {192, 128}};
    static const char *const masks[4] = {"none", "causal(top_left)", "causal(bottom_right)",
                                         "window(20, 5, top_left)"};
    char labels[60][96];
    int n = 0;
    for (int t = 0; t < 3; t++)
        for (int d = 0; d < 5; d++)
            for (int m = 0; m < 4; m++) {
                /* every mask at d 64; the others rotate through the masks */
                if (dims[d][0] != 64 && m != (t + d) % 4)
                    continue;
                snprintf(labels[n], sizeof labels[n], "%s d%d/%d %s",
                         aj_dtype_name(dtypes[t]), dims[d][0], dims[d][1], masks[m]);
                bwd_case c = base(labels[n], dtypes[t], dims[d][0], masks[m]);
                c.dv = dims[d][1];
                c.sq = dims[d][0] >= 192 ? 21 : 37;
                c.sk = dims[d][0] >= 192 ? 40 : 70;
                run(&c);
                n++;
            }
}

/* the rows over base()'s case */
static void run_rows(const bwd_case *rows, int n)
{
    const bwd_case b = base(NULL, AJ_DTYPE_F16, 0, NULL);
    bwd_case_rows(&b, rows, n, run);
}

static void test_shapes(void)
{
    static const bwd_case rows[] = {
        {.label = "f32 d64 GQA 4:1 causal(bottom_right), batch 2", .dtype = AJ_DTYPE_F32,
         .d = 64, .mask = "causal(bottom_right)", .b = 2, .hq = 8, .hkv = 2, .sq = 33, .sk = 33},
        {.label = "f16 d64 Sq 1, Sk 17", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "causal(bottom_right)", .sq = 1, .sk = 17},
        {.label = "bf16 d32 Sq 70, Sk 37 causal: rows without keys", .dtype = AJ_DTYPE_BF16,
         .d = 32, .mask = "causal(bottom_right)", .sq = 70, .sk = 37},
        {.label = "f32 d8 window(3, 2) (narrow row groups)", .dtype = AJ_DTYPE_F32, .d = 8,
         .mask = "window(3, 2, top_left)"},
    };
    run_rows(rows, sizeof rows / sizeof rows[0]);
}

static void test_score_mods(void)
{
    static const bwd_case rows[] = {
        {.label = "f32 d64 softcap(5) causal", .dtype = AJ_DTYPE_F32, .d = 64,
         .mask = "causal(top_left)", .score_mod = "softcap(5.0)", .magnitude = 3.0},
        {.label = "bf16 d128 softcap(30)", .dtype = AJ_DTYPE_BF16, .d = 128, .mask = "none",
         .score_mod = "softcap(30.0)", .magnitude = 4.0},
        {.label = "f32 d64 alibi causal(bottom_right), offsets", .dtype = AJ_DTYPE_F32, .d = 64,
         .mask = "causal(bottom_right)", .score_mod = "alibi", .hq = 4, .hkv = 2, .q_offset = 7},
        {.label = "f16 d64 alibi window", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "window(16, 16, top_left)", .score_mod = "alibi"},
    };
    run_rows(rows, sizeof rows / sizeof rows[0]);
}

static void test_deterministic(void)
{
    static const bwd_case rows[] = {
        {.label = "f32 d64 GQA 4:1 causal: two runs, same bits", .dtype = AJ_DTYPE_F32, .d = 64,
         .mask = "causal(top_left)", .hq = 4, .sq = 70, .sk = 70, .repeat = 1},
        {.label = "bf16 d128 window: two runs, same bits", .dtype = AJ_DTYPE_BF16, .d = 128,
         .mask = "window(20, 5, top_left)", .repeat = 1},
    };
    run_rows(rows, sizeof rows / sizeof rows[0]);
}

/* dropout: the forward's keep mask recomputed in both stages */
static void test_dropout(void)
{
    static const char *const masks[2] = {"none", "causal(top_left)"};
    static const double ps[2] = {0.1, 0.3};
    char labels[4][96];
    int n = 0;
    for (int m = 0; m < 2; m++)
        for (int x = 0; x < 2; x++) {
            snprintf(labels[n], sizeof labels[n], "f32 d64 GQA 2:1 dropout %.1f %s", ps[x],
                     masks[m]);
            bwd_case c = base(labels[n], AJ_DTYPE_F32, 64, masks[m]);
            c.dropout = ps[x];
            c.drop_seed = 0x1234567890abcdefull + (uint64_t)n;
            c.drop_offset = (uint64_t)n << 33 | 5;
            run(&c);
            n++;
        }
    static const bwd_case rows[] = {
        {.label = "f16 d64 GQA 4:1 dropout 0.2 window, offsets", .dtype = AJ_DTYPE_F16, .d = 64,
         .mask = "window(20, 5, bottom_right)", .b = 2, .hq = 4, .hkv = 1, .q_offset = 40,
         .kv_offset = 9, .dropout = 0.2, .drop_seed = 42, .drop_offset = 7},
        {.label = "bf16 d128 dropout 0.3 causal: two runs, same bits", .dtype = AJ_DTYPE_BF16,
         .d = 128, .mask = "causal(bottom_right)", .dropout = 0.3, .drop_seed = 99,
         .repeat = 1},
    };
    run_rows(rows, sizeof rows / sizeof rows[0]);
}

static void test_offsets(void)
{
    const bwd_case b = base(NULL, AJ_DTYPE_F16, 0, NULL);
    bwd_offset_cases(&b, AJ_DTYPE_F32, AJ_DTYPE_F16, run);
}

/* bias and dbias over every broadcast shape */
static void test_bias(void)
{
    static const int shapes[4][2] = {{1, 1}, {0, 1}, {1, 0}, {0, 0}};  /* 1: full, 0: size 1 */
    char labels[4][96];
    for (int s = 0; s < 4; s++) {
        bwd_case c = base(labels[s], AJ_DTYPE_F32, 64, s % 2 ? "causal(top_left)" : "none");
        c.b = 2;
        c.hq = 4;
        c.hkv = 2;
        c.sq = 37;
        c.sk = 45;
        c.bias_shape[0] = shapes[s][0] ? c.b : 1;
        c.bias_shape[1] = shapes[s][1] ? c.hq : 1;
        c.bias_shape[2] = c.sq;
        c.bias_shape[3] = c.sk;
        snprintf(labels[s], sizeof labels[s], "f32 d64 GQA bias [%lld, %lld, Sq, Sk] %s",
                 (long long)c.bias_shape[0], (long long)c.bias_shape[1], c.mask);
        c.repeat = s == 3;
        run(&c);
    }
    static const bwd_case rows[] = {
        {.label = "bf16 d64 bias [1, H, Sq, Sk] softcap(5) causal", .dtype = AJ_DTYPE_BF16,
         .d = 64, .mask = "causal(bottom_right)", .score_mod = "softcap(5.0)", .magnitude = 3.0,
         .bias_shape = {1, 2, 37, 70}},
        {.label = "f16 d32 bias [B, 1, Sq, Sk] + dropout 0.25 window", .dtype = AJ_DTYPE_F16,
         .d = 32, .mask = "window(10, 3, top_left)", .b = 2, .dropout = 0.25, .drop_seed = 5,
         .drop_offset = 1, .bias_shape = {2, 1, 37, 70}, .repeat = 1},
    };
    run_rows(rows, sizeof rows / sizeof rows[0]);
}

/* cpu only: the flash variant (the same kernels) and lengths sim cannot
 * afford */
static void test_cpu_variant_and_long(void)
{
    static const bwd_case rows[] = {
        {.label = "flash bf16 d128 GQA 2:1 causal(bottom_right)", .variant = AJ_VARIANT_FLASH,
         .dtype = AJ_DTYPE_BF16, .d = 128, .mask = "causal(bottom_right)"},
        {.label = "flash f16 d64 S 512 causal, GQA 2:1: two runs, same bits",
         .variant = AJ_VARIANT_FLASH, .dtype = AJ_DTYPE_F16, .d = 64, .mask = "causal(top_left)",
         .sq = 512, .sk = 512, .repeat = 1},
        {.label = "f32 d128 Sq 200 Sk 500 window(100, 20), dropout 0.1", .dtype = AJ_DTYPE_F32,
         .d = 128, .mask = "window(100, 20, bottom_right)", .sq = 200, .sk = 500, .dropout = 0.1,
         .drop_seed = 3},
    };
    if (on_cpu)
        run_rows(rows, sizeof rows / sizeof rows[0]);
}

/* test_sim_backward [cuda | cpu]: on the sim device (ctest), on a GPU
 * (tests/gpu/run.sh), where no GPU means exit 77, "skipped", or on the
 * cpu device. */
int main(int argc, char **argv)
{
    static void (*const tests[])(void) = {
        test_matrix, test_shapes, test_offsets, test_score_mods, test_deterministic,
        test_dropout, test_bias, test_cpu_variant_and_long, NULL};
    on_cpu = test_main_device(argc, argv, AJ_DEVICE_SIM) == AJ_DEVICE_CPU;
    return test_main(argc, argv,
                     &(test_main_args){.fallback = AJ_DEVICE_SIM, .ctx = &ctx, .dev = &dev,
                                       .tests = tests, .cases = &cases_run});
}
