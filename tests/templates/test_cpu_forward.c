/*
 * test_cpu_forward.c -- what the cpu target's forward adds to the matrix it
 * shares with sim (`test_sim_forward cpu`, ctest's
 * test_cpu_forward_matrix): the cpu's own schedules and odd output widths,
 * both variants, bias and dropout, longer sequences (S up to 2048), layout
 * = varlen (sequences of very different lengths, empty ones, masks per
 * sequence, GQA, alibi, dropout, totals, accumulate), and the same bits
 * from 1, 2 or 3 threads, against the float64 reference.  Tolerances as
 * sim's (sim_harness.c), which the polynomial exp2 (relative error
 * 1.7e-7 in f32, cpu_vec.h) meets.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_compile.h"
#include "fwd_check.h"
#include "sim_harness.h"
#include "test_main.h"

static aj_ctx *ctx;
static aj_device *dev;
static int cases_run;

static void run_ext(const fwd_case *c, const fwd_options *x, const fwd_run_options *how)
{
    fwd_result r = fwd_run_case_ext(ctx, dev, c, x, how);
    cases_run++;
    if (!fwd_check_result(ctx, c, &r))
        return;
    printf("%-58s O %.3f LSE %.3f empty rows %4lld  %8.2f ms\n", c->label, r.max_err_o,
           r.max_err_lse, (long long)r.rows_without_keys, r.seconds * 1e3);
}

static void run_variant(const fwd_case *c, const fwd_options *x, const char *variant)
{
    fwd_run_options how = {0};
    how.variant = variant && strcmp(variant, "flash") == 0 ? AJ_VARIANT_FLASH
                                                          : AJ_VARIANT_EFFICIENT;
    run_ext(c, x, &how);
}

static void run_with(const fwd_case *c, const fwd_options *x)
{
    run_variant(c, x, NULL);
}

static void run(const fwd_case *c)
{
    run_with(c, NULL);
}

/* head dims, score_mods and strides (fwd_shape_rows, which test_sim_forward
 * runs on sim), odd output vectors, the flash variant, the cpu's schedules */
static void test_variants(void)
{
    static const fwd_case rows[] = {
        {.label = "f32 d8 dv24 (odd output vectors)", .dtype = AJ_DTYPE_F32, .d = 8,
         .mask = "causal(top_left)", .dv = 24},
        {.label = "f16 d96 schedule (block_m 32, block_n 32)", .dtype = AJ_DTYPE_F16, .d = 96,
         .mask = "causal(bottom_right)", .schedule = "(block_m = 32, block_n = 32)"},
        {.label = "bf16 d64 schedule (block_m 16, block_n 256)", .dtype = AJ_DTYPE_BF16,
         .d = 64, .mask = "window(40, 40)", .schedule = "(block_m = 16, block_n = 256)"},
        {.label = "f32 d256 schedule (block_m 256, block_n 64)", .dtype = AJ_DTYPE_F32,
         .d = 256, .mask = "none", .schedule = "(block_m = 256, block_n = 64)", .sq = 300},
    };
    const fwd_case base = fwd_case_base(NULL, AJ_DTYPE_F16, 0, NULL);
    fwd_case_rows(&base, fwd_shape_rows, fwd_shape_row_count, run);
    fwd_case_rows(&base, rows, sizeof rows / sizeof rows[0], run);
    fwd_case c =
        fwd_case_base("flash f16 d64 softcap(5) window", AJ_DTYPE_F16, 64, "window(30, 0)");
    c.score_mod = "softcap(5.0)";
    c.magnitude = 3.0;
    run_variant(&c, NULL, "flash");
}

/* bias (broadcast and full), dropout */
static void test_bias_dropout(void)
{
    fwd_options x;
    memset(&x, 0, sizeof x);
    fwd_case c = fwd_case_base("f16 d64 bias [1, Hq, Sq, Sk] causal", AJ_DTYPE_F16, 64,
                               "causal(top_left)");
    x.bias_shape[0] = 1;
    x.bias_shape[1] = c.hq;
    x.bias_shape[2] = c.sq;
    x.bias_shape[3] = c.sk;
    x.bias_magnitude = 2.0;
    run_with(&c, &x);
    c = fwd_case_base("bf16 d128 bias [B, 1, Sq, Sk] stride 0, softcap", AJ_DTYPE_BF16, 128,
                      "none");
    c.b = 2;
    c.score_mod = "softcap(20.0)";
    x.bias_shape[0] = 2;
    x.bias_shape[1] = 1;
    x.bias_stride0 = 1;
    run_with(&c, &x);
    memset(&x, 0, sizeof x);
    c = fwd_case_base("f32 d64 dropout 0.2 causal", AJ_DTYPE_F32, 64, "causal(top_left)");
    x.dropout = 0.2;
    x.drop_seed = 0x1234567890abcdefULL;
    x.drop_offset = 77;
    run_with(&c, &x);
    c = fwd_case_base("f16 d128 dropout 0.5 window, offsets", AJ_DTYPE_F16, 128, "window(50, 10)");
    c.q_offset = 1000;
    c.kv_offset = 990;
    x.dropout = 0.5;
    x.drop_seed = 99;
    x.drop_offset = (uint64_t)1 << 33;
    run_with(&c, &x);
}

/* packed sequences of very different lengths (empty ones on either side,
 * one longer than a block), each masked with its own lengths, both
 * variants; then offsets, totals, alibi and dropout per sequence (the
 * stream's batch index is the sequence's) */
static void test_varlen(void)
{
    static const int32_t lq[] = {1, 130, 0, 17, 65, 300}, lk[] = {33, 65, 7, 0, 140, 290};
    static const char *const masks[] = {"none", "causal(top_left)", "causal(bottom_right)",
                                        "window(20, 4, bottom_right)"};
    static const aj_dtype dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32, AJ_DTYPE_F16};
    char label[128];
    for (int m = 0; m < 4; m++) {
        fwd_run_options how = {.seqlens_q = lq, .seqlens_k = lk};
        how.variant = m % 2 ? AJ_VARIANT_FLASH : AJ_VARIANT_EFFICIENT;
        snprintf(label, sizeof label, "%s %s d%d varlen B6 GQA 4:2 %s",
                 m % 2 ? "flash" : "efficient", aj_dtype_name(dtypes[m]), m < 2 ? 64 : 128,
                 masks[m]);
        fwd_case c = fwd_case_base(label, dtypes[m], m < 2 ? 64 : 128, masks[m]);
        c.b = 6;
        c.hq = 4;
        c.hkv = 2;
        c.seed = (uint64_t)(m + 100);
        run_ext(&c, NULL, &how);
    }
    fwd_run_options how = {.seqlens_q = lq, .seqlens_k = lk};
    const fwd_case base = fwd_case_base(NULL, AJ_DTYPE_F16, 0, NULL);
    fwd_options x;
    fwd_case c = fwd_varlen_totals_case(&base, 6, 400, 350, &x);
    run_ext(&c, &x, &how);
    c = fwd_case_base("bf16 d64 varlen softcap(10) window(8, 8) block_m 16", AJ_DTYPE_BF16, 64,
                      "window(8, 8)");
    c.b = 6;
    c.score_mod = "softcap(10.0)";
    c.magnitude = 3.0;
    c.schedule = "(block_m = 16, block_n = 32)";
    run_ext(&c, NULL, &how);
}

/* A device copy of host memory (freed by the caller). */
static void *to_device(const void *host, size_t bytes)
{
    void *p = NULL;
    CHECK_STATUS(ctx, aj_device_alloc(dev, bytes ? bytes : 16, &p), AJ_OK);
    if (p && bytes)
        CHECK_STATUS(ctx, aj_device_copy_to(dev, p, host, bytes), AJ_OK);
    return p;
}

/* The cpu kernel of an op's text, or NULL (the failure checked). */
static aj_kernel *compile_cpu(const char *spec)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    return check_compile(ctx, spec, "spec", &opt);
}

/*
 * accumulate with varlen: o_acc and lse of packed sequences built up by two
 * calls, over the first and the second half of each sequence's keys (one
 * sequence has no key in the first half, one none at all), from o_acc =
 * NaN and lse = -inf, against the reference over all keys.  No mask, so
 * that the positions within a part do not matter.
 */
enum { VA_B = 4, VA_HQ = 2, VA_HKV = 1, VA_D = 32 };

static void test_varlen_accumulate(void)
{
    static const int32_t lq[VA_B] = {5, 0, 40, 7}, lk[VA_B] = {30, 1, 70, 0};
    int32_t cu_q[VA_B + 1] = {0}, cu_k[VA_B + 1] = {0}, cu_part[2][VA_B + 1] = {{0}};
    int max_q = 0, max_part = 0;
    for (int b = 0; b < VA_B; b++) {
        int half = lk[b] / 2;
        cu_q[b + 1] = cu_q[b] + lq[b];
        cu_k[b + 1] = cu_k[b] + lk[b];
        cu_part[0][b + 1] = cu_part[0][b] + half;
        cu_part[1][b + 1] = cu_part[1][b] + lk[b] - half;
        max_q = lq[b] > max_q ? lq[b] : max_q;
        max_part = lk[b] - half > max_part ? lk[b] - half : max_part;
    }
    const int tq = cu_q[VA_B], tk = cu_k[VA_B];
    const size_t qn = (size_t)tq * VA_HQ * VA_D, kn = (size_t)tk * VA_HKV * VA_D;
    float *q = malloc(qn * sizeof *q), *k = malloc(kn * sizeof *k), *v = malloc(kn * sizeof *v);
    float *part_k = malloc(kn * sizeof *part_k), *part_v = malloc(kn * sizeof *part_v);
    float *o_acc = malloc(qn * sizeof *o_acc), *lse = malloc((size_t)VA_HQ * tq * sizeof *lse);
    double *qd = malloc(qn * sizeof *qd), *kd = malloc(kn * sizeof *kd);
    double *vd = malloc(kn * sizeof *vd), *o_ref = malloc(qn * sizeof *o_ref);
    double *lse_ref = malloc((size_t)VA_HQ * tq * sizeof *lse_ref);
    uint64_t rng = 2024;
    float *const ins[3] = {q, k, v};
    double *const ref_ins[3] = {qd, kd, vd};
    const size_t counts[3] = {qn, kn, kn};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < counts[t]; i++) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            ins[t][i] = (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
            ref_ins[t][i] = ins[t][i];
        }
    for (size_t i = 0; i < qn; i++)
        o_acc[i] = NAN;
    for (int i = 0; i < VA_HQ * tq; i++)
        lse[i] = -INFINITY;

    aj_kernel *kernel = compile_cpu("attention forward efficient { dtype = f32 head_dim = 32 "
                                    "layout = varlen accumulate = true }");
    const size_t row = VA_HKV * VA_D * sizeof(float);
    void *dq = to_device(q, qn * sizeof *q), *dacc = to_device(o_acc, qn * sizeof *o_acc);
    void *dlse = to_device(lse, (size_t)VA_HQ * tq * sizeof *lse);
    void *dcu_q = to_device(cu_q, sizeof cu_q);
    for (int part = 0; part < 2 && kernel; part++) {
        /* this part's keys of every sequence, packed */
        for (int b = 0; b < VA_B; b++) {
            size_t from = (size_t)cu_k[b] + (part ? (size_t)(lk[b] / 2) : 0);
            size_t n = (size_t)(cu_part[part][b + 1] - cu_part[part][b]);
            memcpy(part_k + (size_t)cu_part[part][b] * VA_HKV * VA_D, k + from * VA_HKV * VA_D,
                   n * row);
            memcpy(part_v + (size_t)cu_part[part][b] * VA_HKV * VA_D, v + from * VA_HKV * VA_D,
                   n * row);
        }
        int tpart = cu_part[part][VA_B];
        void *dk = to_device(part_k, (size_t)tpart * row);
        void *dv = to_device(part_v, (size_t)tpart * row);
        void *dcu_k = to_device(cu_part[part], sizeof cu_part[part]);
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.q = (aj_tensor){dq, AJ_DTYPE_F32, 3, {tq, VA_HQ, VA_D}, {VA_HQ * VA_D, VA_D, 1}};
        a.k = (aj_tensor){dk, AJ_DTYPE_F32, 3, {tpart, VA_HKV, VA_D}, {VA_HKV * VA_D, VA_D, 1}};
        a.v = a.k;
        a.v.data = dv;
        a.o_acc = a.q;
        a.o_acc.data = dacc;
        a.lse = (aj_tensor){dlse, AJ_DTYPE_F32, 2, {VA_HQ, tq}, {tq, 1}};
        a.cu_seqlens_q = dcu_q;
        a.cu_seqlens_k = dcu_k;
        a.batch = VA_B;
        a.max_seqlen_q = max_q;
        a.max_seqlen_k = max_part;
        CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
        CHECK_STATUS(ctx, aj_device_synchronize(dev, NULL), AJ_OK);
        aj_device_free(dev, dk);
        aj_device_free(dev, dv);
        aj_device_free(dev, dcu_k);
    }
    CHECK_STATUS(ctx, aj_device_copy_from(dev, o_acc, dacc, qn * sizeof *o_acc), AJ_OK);
    CHECK_STATUS(ctx, aj_device_copy_from(dev, lse, dlse, (size_t)VA_HQ * tq * sizeof *lse),
                 AJ_OK);

    ref_problem p = ref_problem_of(VA_B, VA_HQ, VA_HKV, 0, 0, VA_D, VA_D);
    p.cu_q = cu_q;
    p.cu_k = cu_k;
    ref_forward(&p, qd, kd, vd, o_ref, lse_ref);
    fwd_tolerance tol = fwd_tolerance_for(AJ_DTYPE_F32);
    double err_o = 0, err_lse = 0;
    int empty_rows = 0, exact = 1;
    for (int h = 0; h < VA_HQ; h++)
        for (int t = 0; t < tq; t++) {
            double lr = lse_ref[h * tq + t], lg = lse[h * tq + t];
            int empty = isinf(lr) && lr < 0;
            empty_rows += empty;
            if (empty)
                exact &= isinf(lg) && lg < 0;
            else
                err_lse = fmax(err_lse, fabs(lg - lr) / (tol.lse_atol + tol.lse_rtol * fabs(lr)));
            for (int x = 0; x < VA_D; x++) {
                size_t at = ((size_t)t * VA_HQ + (size_t)h) * VA_D + (size_t)x;
                if (empty)
                    exact &= o_acc[at] == 0.0f;
                err_o = fmax(err_o, fabs(o_acc[at] - o_ref[at]) /
                                    (tol.o_atol + tol.o_rtol * fabs(o_ref[at])));
            }
        }
    cases_run++;
    CHECK_MSG(err_o <= 1.0, "varlen accumulate: O error %.3g x tolerance", err_o);
    CHECK_MSG(err_lse <= 1.0, "varlen accumulate: LSE error %.3g x tolerance", err_lse);
    CHECK_MSG(exact, "varlen accumulate: a row without keys is not O = 0, LSE = -inf");
    CHECK_MSG(empty_rows == 7 * VA_HQ, "varlen accumulate: %d rows without keys, want %d",
              empty_rows, 7 * VA_HQ);
    printf("%-58s O %.3f LSE %.3f empty rows %4d\n", "f32 d32 varlen accumulate, 2 key halves",
           err_o, err_lse, empty_rows);
    void *const bufs[4] = {dq, dacc, dlse, dcu_q};
    for (int i = 0; i < 4; i++)
        aj_device_free(dev, bufs[i]);
    aj_kernel_destroy(kernel);
    free(q);
    free(k);
    free(v);
    free(part_k);
    free(part_v);
    free(o_acc);
    free(lse);
    free(qd);
    free(kd);
    free(vd);
    free(o_ref);
    free(lse_ref);
}

/* the cheap target takes longer sequences than sim can */
static void test_long(void)
{
    fwd_case c = fwd_case_base("bf16 d128 S 2048 causal", AJ_DTYPE_BF16, 128, "causal(top_left)");
    c.hq = 1;
    c.sq = 2048;
    c.sk = 2048;
    run(&c);
    c = fwd_case_base("f16 d64 Sq 1000 Sk 2048 bottom_right", AJ_DTYPE_F16, 64,
                      "causal(bottom_right)");
    c.hq = 1;
    c.sq = 1000;
    c.sk = 2048;
    run(&c);
    c = fwd_case_base("f32 d128 S 1024 window(256, 0)", AJ_DTYPE_F32, 128, "window(256, 0)");
    c.hq = 1;
    c.sq = 1024;
    c.sk = 1024;
    run(&c);
}

/* Bad cu_seqlens found by the cpu kernels themselves (no host read-back):
 * the call answers AJ_ERR_INVALID_ARG naming the offsets, the sequence is
 * skipped, and the next good call is clean. */
static void test_varlen_bad_offsets(void)
{
    aj_kernel *kernel = compile_cpu("attention forward flash { dtype = f32 head_dim = 32 "
                                    "layout = varlen }");
    if (!kernel)
        return;
    enum { T = 6, H = 2, D = 32 };
    static float zeros[T * H * D], lse[H * T];
    const int32_t good[3] = {0, 2, T}, down[3] = {0, 4, 3}, long_k[3] = {0, 1, T};
    void *x = to_device(zeros, sizeof zeros), *o = to_device(zeros, sizeof zeros);
    void *dl = to_device(lse, sizeof lse);
    void *cu[3] = {to_device(good, sizeof good), to_device(down, sizeof down),
                   to_device(long_k, sizeof long_k)};
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = (aj_tensor){x, AJ_DTYPE_F32, 3, {T, H, D}, {H * D, D, 1}};
    a.k = a.v = a.q;
    a.o = a.q;
    a.o.data = o;
    a.lse = (aj_tensor){dl, AJ_DTYPE_F32, 2, {H, T}, {T, 1}};
    a.batch = 2;
    a.max_seqlen_q = a.max_seqlen_k = 4;
    a.cu_seqlens_q = a.cu_seqlens_k = cu[0];
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
    a.cu_seqlens_q = cu[1];
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_forward: cu_seqlens_q[2] is below cu_seqlens_q[1]; offsets must not "
                     "decrease (found by the kernel of sequence 1, which skipped it)");
    a.cu_seqlens_q = cu[0];
    a.cu_seqlens_k = cu[2];   /* sequence 1 has 5 keys, max_seqlen_k 4 */
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_forward: sequence 1 has more keys than max_seqlen_k");
    a.cu_seqlens_k = cu[0];
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
    void *all[] = {x, o, dl, cu[0], cu[1], cu[2]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        aj_device_free(dev, all[i]);
    aj_kernel_destroy(kernel);
}

/* the device test_main opened is the cpu's */
static void test_device(void)
{
    CHECK(aj_device_target(dev) == AJ_TARGET_CPU);
    printf("device %s\n", aj_device_name(dev));
}

int main(int argc, char **argv)
{
    static void (*const tests[])(void) = {
        test_device, test_variants, test_bias_dropout, test_varlen, test_varlen_accumulate,
        test_varlen_bad_offsets, test_long, NULL};
    return test_main(argc, argv,
                     &(test_main_args){.fallback = AJ_DEVICE_CPU, .ctx = &ctx, .dev = &dev,
                                       .tests = tests, .cases = &cases_run,
                                       .cleanup = fwd_cache_clear});
}
