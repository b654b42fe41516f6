/*
 * test_sim_features.c -- the forward-side options of the efficient forward
 * (accumulate, bias = add, dropout) and the merge kernel, run on the SIMT
 * emulator against the float64 reference (tests/lib/ref.h).
 *
 *  - accumulate: calls chained over disjoint key blocks, each with its own
 *    kv_offset and slice of K/V, from a prior of LSE = -inf and O = NaN,
 *    equal one reference pass over all keys (causal and window masks with
 *    offsets, rows that see no key in some blocks or in all of them).
 *    O_acc is f32: O within 5e-5 + 1e-4 |ref|, LSE within 1e-4 + 1e-5 |ref|.
 *  - merge: against ref_merge, with rows where one or both sides are -inf
 *    (and the empty side's O is NaN), in place too; never NaN.
 *  - bias: broadcast shapes (stride 0 and contiguous) against ref_forward,
 *    with the harness's per-dtype tolerances.
 *  - dropout: the same Philox stream as ref_dropout_keep, so results agree
 *    with ref_forward within the usual tolerances, and a probe that reads
 *    the kernel's keep mask out of O (uniform scores, V = identity) checks
 *    every decision exactly and the keep rate within 5 sigma.
 *
 *   test_sim_features [cpu]: the same checks of the cpu target's kernels
 *   (forward and merge) on the cpu device (ctest test_cpu_features).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fwd_check.h"
#include "sim_harness.h"
#include "splitmix.h"
#include "test_main.h"

static aj_ctx *ctx;
static aj_device *dev;

static aj_kernel *compile(const char *spec)
{
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), "spec", &op), AJ_OK);
    if (!op)
        return NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    opt.emit = AJ_EMIT_LLVM_IR;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
    aj_op_destroy(op);
    return k;
}

static uint64_t rng_state = 7;

/* uniform in [-1, 1) (splitmix64) */
static double uniform(void)
{
    uint64_t z = splitmix_next(&rng_state);
    return 2.0 * (double)(z >> 11) / 9007199254740992.0 - 1.0;
}

/* A contiguous BHSD tensor of `dtype` with its double image. */
typedef struct tensor {
    aj_tensor t;
    double *ref;
    size_t n;
} tensor;

static tensor make(aj_dtype dtype, int64_t b, int64_t h, int64_t s, int64_t d)
{
    tensor x;
    x.n = (size_t)(b * h * s * d);
    int elem = dtype == AJ_DTYPE_F32 ? 4 : 2;
    x.t = (aj_tensor){aligned_alloc(64, (x.n * (size_t)elem + 63) / 64 * 64 + 64), dtype, 4,
                      {b, h, s, d}, {h * s * d, s * d, d, 1}};
    x.ref = calloc(x.n + 1, sizeof *x.ref);
    return x;
}

/* An LSE-shaped f32 tensor [b, h, s] (its double image too). */
static tensor make_lse(int64_t b, int64_t h, int64_t s)
{
    tensor x;
    x.n = (size_t)(b * h * s);
    x.t = (aj_tensor){aligned_alloc(64, (x.n * 4 + 63) / 64 * 64 + 64), AJ_DTYPE_F32, 3,
                      {b, h, s, 0}, {h * s, s, 1, 0}};
    x.ref = calloc(x.n + 1, sizeof *x.ref);
    return x;
}

/* Sets element i to v rounded to the dtype, in both images. */
static void set(tensor *x, size_t i, double v)
{
    float f = (float)v;
    if (x->t.dtype == AJ_DTYPE_F32) {
        ((float *)x->t.data)[i] = f;
    } else {
        uint16_t *p = (uint16_t *)x->t.data + i;
        aj_convert(&f, AJ_DTYPE_F32, p, x->t.dtype, 1);
        aj_convert(p, x->t.dtype, &f, AJ_DTYPE_F32, 1);
    }
    x->ref[i] = f;
}

static double get(const tensor *x, size_t i)
{
    float f;
    if (x->t.dtype == AJ_DTYPE_F32)
        f = ((const float *)x->t.data)[i];
    else
        aj_convert((const uint16_t *)x->t.data + i, x->t.dtype, &f, AJ_DTYPE_F32, 1);
    return f;
}

static void fill(tensor *x, double magnitude)
{
    for (size_t i = 0; i < x->n; i++)
        set(x, i, magnitude * uniform());
}

static void release(tensor *x)
{
    free(x->t.data);
    free(x->ref);
}

/* |got - want| <= atol + rtol |want|, infinities and NaN compared exactly */
static int close_to(double got, double want, double atol, double rtol)
{
    if (isnan(want) || isinf(want))
        return isnan(want) ? isnan(got) : got == want;
    return fabs(got - want) <= atol + rtol * fabs(want);
}

/* ---------------------------------------------------------------- accumulate */

typedef struct acc_case {
    const char *label;
    aj_dtype dtype;
    int d;
    const char *mask;          /* IR text */
    aj_mask_kind mask_kind;
    aj_align align;
    int64_t left, right;
    int b, hq, hkv, sq, sk;
    int64_t q_offset, kv_offset;
    int64_t sq_total, sk_total;  /* 0: Sq, Sk of the whole pass */
    int blocks[6];             /* key block lengths, summing to sk; 0 ends */
    double dropout;
} acc_case;

/* Whether row i (local) sees a key of [j0, j1) (local) under the case's
 * mask: for counting the rows that the test must cover. */
static int row_sees_block(const acc_case *c, int64_t i, int64_t j0, int64_t j1)
{
    int64_t sq_total = c->sq_total ? c->sq_total : c->sq;
    int64_t sk_total = c->sk_total ? c->sk_total : c->sk;
    int64_t shift = c->align == AJ_ALIGN_BOTTOM_RIGHT ? sk_total - sq_total : 0;
    int64_t diag = c->q_offset + i + shift;
    int64_t lo = c->kv_offset + j0, hi = c->kv_offset + j1 - 1;
    if (j1 <= j0)
        return 0;
    if (c->mask_kind == AJ_MASK_CAUSAL)
        return lo <= diag;
    if (c->mask_kind == AJ_MASK_WINDOW)
        return lo <= diag + c->right && hi >= diag - c->left;
    return 1;
}

static void run_accumulate(const acc_case *c)
{
    char spec[512];
    snprintf(spec, sizeof spec, "attention forward efficient { dtype = %s head_dim = %d "
             "mask = %s accumulate = true dropout = %.17g }", aj_dtype_name(c->dtype), c->d,
             c->mask, c->dropout);
    aj_kernel *kernel = compile(spec);
    if (!kernel)
        return;
    tensor q = make(c->dtype, c->b, c->hq, c->sq, c->d);
    tensor k = make(c->dtype, c->b, c->hkv, c->sk, c->d);
    tensor v = make(c->dtype, c->b, c->hkv, c->sk, c->d);
    tensor o = make(AJ_DTYPE_F32, c->b, c->hq, c->sq, c->d);
    tensor lse = make_lse(c->b, c->hq, c->sq);
    fill(&q, 1.0);
    fill(&k, 1.0);
    fill(&v, 1.0);
    /* the prior: nothing seen yet (O is garbage that must not leak) */
    for (size_t i = 0; i < o.n; i++)
        ((float *)o.t.data)[i] = NAN;
    for (size_t i = 0; i < lse.n; i++)
        ((float *)lse.t.data)[i] = -INFINITY;

    int partly_empty = 0;    /* rows that see no key in some block but some in another */
    int j0 = 0;
    for (int blk = 0; blk < 6 && c->blocks[blk]; blk++) {
        int len = c->blocks[blk];
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.q = q.t;
        a.k = k.t;
        a.v = v.t;
        /* keys j0 .. j0 + len - 1: the same strides, a later start */
        size_t skip = (size_t)j0 * (size_t)c->d * (c->dtype == AJ_DTYPE_F32 ? 4 : 2);
        a.k.data = (char *)k.t.data + skip;
        a.v.data = (char *)v.t.data + skip;
        a.k.shape[2] = a.v.shape[2] = len;
        a.o_acc = o.t;
        a.lse = lse.t;
        a.q_offset = c->q_offset;
        a.kv_offset = c->kv_offset + j0;
        a.sq_total = c->sq_total ? c->sq_total : c->sq;
        a.sk_total = c->sk_total ? c->sk_total : c->sk;
        a.seed = 0x123456789abcdefull;
        a.offset = 0xfedcba9876543210ull;
        CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
        for (int64_t i = 0; i < c->sq; i++)
            partly_empty += !row_sees_block(c, i, j0, j0 + len) &&
                            row_sees_block(c, i, 0, c->sk);
        j0 += len;
    }
    CHECK_MSG(j0 == c->sk, "%s: blocks cover %d of %d keys", c->label, j0, c->sk);

    ref_problem p = ref_problem_of(c->b, c->hq, c->hkv, c->sq, c->sk, c->d, c->d);
    p.mask = c->mask_kind;
    p.align = c->align;
    p.window_left = c->left;
    p.window_right = c->right;
    p.q_offset = c->q_offset;
    p.kv_offset = c->kv_offset;
    p.sq_total = c->sq_total;
    p.sk_total = c->sk_total;
    p.dropout_p = c->dropout;
    p.seed = 0x123456789abcdefull;
    p.offset = 0xfedcba9876543210ull;
    double *o_ref = calloc(o.n + 1, sizeof *o_ref);
    double *lse_ref = calloc(lse.n + 1, sizeof *lse_ref);
    ref_forward(&p, q.ref, k.ref, v.ref, o_ref, lse_ref);
    int bad_o = 0, bad_lse = 0, empty = 0;
    /* o_acc is f32, so f32 inputs meet f32's bound; f16 and bf16 inputs
     * the flash kernels' (a kernel may round P to the input dtype for the
     * P V product, as tensor cores and the cpu's vdpbf16ps do) */
    fwd_tolerance tol = fwd_tolerance_for(c->dtype);
    double o_atol = c->dtype == AJ_DTYPE_F32 ? 5e-5 : tol.o_atol;
    double o_rtol = c->dtype == AJ_DTYPE_F32 ? 1e-4 : tol.o_rtol;
    for (size_t r = 0; r < lse.n; r++) {
        double l = ((float *)lse.t.data)[r];
        empty += isinf(lse_ref[r]) != 0;
        bad_lse += !close_to(l, lse_ref[r], 1e-4, 1e-5);
        for (int x = 0; x < c->d; x++) {
            double got = ((float *)o.t.data)[r * (size_t)c->d + (size_t)x];
            /* an empty row is exactly 0 (never NaN from the prior) */
            bad_o += isinf(lse_ref[r]) ? got != 0.0
                                       : !close_to(got, o_ref[r * (size_t)c->d + (size_t)x],
                                                   o_atol, o_rtol);
        }
    }
    CHECK_MSG(bad_o == 0, "%s: %d O values off", c->label, bad_o);
    CHECK_MSG(bad_lse == 0, "%s: %d LSE values off", c->label, bad_lse);
    printf("%-62s rows empty in some block %4d, in all %3d\n", c->label, partly_empty, empty);
    if (c->mask_kind != AJ_MASK_NONE)
        CHECK_MSG(partly_empty > 0, "%s: no row is empty in a block; the case covers less "
                  "than it says", c->label);
    free(o_ref);
    free(lse_ref);
    release(&q);
    release(&k);
    release(&v);
    release(&o);
    release(&lse);
    aj_kernel_destroy(kernel);
}

static void test_accumulate(void)
{
    const acc_case cases[] = {
        {"f16 d64 causal, 3 blocks, q_offset 40", AJ_DTYPE_F16, 64, "causal(top_left)",
         AJ_MASK_CAUSAL, AJ_ALIGN_TOP_LEFT, 0, 0, 1, 2, 1, 50, 120, 40, 0, 0, 0,
         {32, 40, 48}, 0},
        {"bf16 d32 causal(bottom_right), GQA, uneven blocks", AJ_DTYPE_BF16, 32,
         "causal(bottom_right)", AJ_MASK_CAUSAL, AJ_ALIGN_BOTTOM_RIGHT, 0, 0, 2, 4, 2, 37, 90,
         0, 0, 0, 0, {40, 30, 20}, 0},
        {"f32 d64 window(10, 5), offsets, 4 blocks", AJ_DTYPE_F32, 64, "window(10, 5)",
         AJ_MASK_WINDOW, AJ_ALIGN_TOP_LEFT, 10, 5, 1, 2, 2, 40, 100, 1000, 990, 0, 0,
         {24, 24, 24, 28}, 0},
        {"f16 d64 window(4, 0, bottom_right), shard totals", AJ_DTYPE_F16, 64,
         "window(4, 0, bottom_right)", AJ_MASK_WINDOW, AJ_ALIGN_BOTTOM_RIGHT, 4, 0, 1, 2, 1,
         33, 64, 128, 64, 512, 512, {16, 16, 16, 16}, 0},
        {"f16 d64 causal, queries before every key of block 2..3", AJ_DTYPE_F16, 64,
         "causal(top_left)", AJ_MASK_CAUSAL, AJ_ALIGN_TOP_LEFT, 0, 0, 1, 1, 1, 30, 96, 0, 16,
         0, 0, {32, 32, 32}, 0},
        {"f32 d32 no mask, 2 blocks", AJ_DTYPE_F32, 32, "none", AJ_MASK_NONE,
         AJ_ALIGN_TOP_LEFT, 0, 0, 1, 2, 1, 20, 48, 0, 0, 0, 0, {16, 32}, 0},
        {"f16 d32 causal + dropout 0.25, 3 blocks", AJ_DTYPE_F16, 32, "causal(top_left)",
         AJ_MASK_CAUSAL, AJ_ALIGN_TOP_LEFT, 0, 0, 1, 2, 1, 40, 72, 30, 0, 0, 0, {24, 24, 24},
         0.25},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_accumulate(&cases[i]);
}

/* ---------------------------------------------------------------- merge */

static void run_merge(const char *label, aj_dtype dtype, int dv, int b, int h, int s,
                      int in_place)
{
    char spec[256];
    snprintf(spec, sizeof spec, "attention merge { dtype = %s head_dim_v = %d }",
             aj_dtype_name(dtype), dv);
    aj_kernel *kernel = compile(spec);
    if (!kernel)
        return;
    tensor o1 = make(dtype, b, h, s, dv), o2 = make(dtype, b, h, s, dv);
    tensor o = make(dtype, b, h, s, dv);
    tensor l1 = make_lse(b, h, s), l2 = make_lse(b, h, s), l = make_lse(b, h, s);
    fill(&o1, 1.0);
    fill(&o2, 1.0);
    /* row kinds by r % 5: both finite, 1 empty, 2 empty, both empty, far apart */
    int empties = 0;
    for (size_t r = 0; r < l1.n; r++) {
        double a = 8.0 * uniform(), z = 8.0 * uniform();
        switch (r % 5) {
        case 1: a = -INFINITY; break;
        case 2: z = -INFINITY; break;
        case 3: a = z = -INFINITY; empties++; break;
        case 4: a += 60.0; break;
        default: break;
        }
        ((float *)l1.t.data)[r] = (float)a;
        ((float *)l2.t.data)[r] = (float)z;
        l1.ref[r] = (float)a;
        l2.ref[r] = (float)z;
        /* an empty side's O is garbage that must not leak */
        for (int x = 0; x < dv; x++) {
            size_t e = r * (size_t)dv + (size_t)x;
            if (isinf(a))
                set(&o1, e, NAN);
            if (isinf(z))
                set(&o2, e, NAN);
        }
    }
    double *o_ref = calloc(o.n + 1, sizeof *o_ref), *l_ref = calloc(l.n + 1, sizeof *l_ref);
    ref_merge((int64_t)l.n, dv, o1.ref, l1.ref, o2.ref, l2.ref, o_ref, l_ref);

    aj_merge_args a = AJ_MERGE_ARGS_INIT;
    a.o1 = o1.t;
    a.lse1 = l1.t;
    a.o2 = o2.t;
    a.lse2 = l2.t;
    a.o = in_place ? o1.t : o.t;
    a.lse = in_place ? l1.t : l.t;
    CHECK_STATUS(ctx, aj_merge(ctx, dev, kernel, &a), AJ_OK);
    const tensor *got_o = in_place ? &o1 : &o;
    const float *got_l = (const float *)(in_place ? l1.t.data : l.t.data);
    double atol = dtype == AJ_DTYPE_F32 ? 1e-6 : dtype == AJ_DTYPE_F16 ? 1e-3 : 8e-3;
    double rtol = dtype == AJ_DTYPE_F32 ? 1e-5 : dtype == AJ_DTYPE_F16 ? 2e-3 : 1.6e-2;
    int bad = 0, nans = 0;
    for (size_t r = 0; r < l.n; r++) {
        nans += isnan(got_l[r]);
        bad += !close_to(got_l[r], l_ref[r], 1e-5, 1e-6);
        for (int x = 0; x < dv; x++) {
            size_t e = r * (size_t)dv + (size_t)x;
            double g = get(got_o, e);
            nans += isnan(g);
            bad += !close_to(g, o_ref[e], atol, rtol);
        }
    }
    CHECK_MSG(nans == 0, "%s: %d NaN outputs", label, nans);
    CHECK_MSG(bad == 0, "%s: %d outputs off", label, bad);
    if (l.n > 3)
        CHECK(empties > 0);
    printf("%-62s rows %5zu, both sides empty %4d\n", label, l.n, empties);
    free(o_ref);
    free(l_ref);
    release(&o1);
    release(&o2);
    release(&o);
    release(&l1);
    release(&l2);
    release(&l);
    aj_kernel_destroy(kernel);
}

static void test_merge(void)
{
    run_merge("merge f32 dv64", AJ_DTYPE_F32, 64, 2, 3, 37, 0);
    run_merge("merge f16 dv128, in place (o = o1, lse = lse1)", AJ_DTYPE_F16, 128, 1, 2, 70, 1);
    run_merge("merge bf16 dv40 (2-lane rows)", AJ_DTYPE_BF16, 40, 2, 1, 45, 0);
    run_merge("merge f32 dv256, one row", AJ_DTYPE_F32, 256, 1, 1, 1, 0);
}

/* Two halves of the keys through a plain forward each (f32 O), merged,
 * equal one pass: the ring's forward step. */
static void test_merge_of_forwards(void)
{
    enum { SQ = 40, SK = 64, DD = 32, HQ = 2 };
    aj_kernel *fwd = compile("attention forward efficient { dtype = f32 head_dim = 32 "
                             "mask = causal(top_left) }");
    aj_kernel *mrg = compile("attention merge { dtype = f32 head_dim_v = 32 }");
    if (!fwd || !mrg)
        return;
    tensor q = make(AJ_DTYPE_F32, 1, HQ, SQ, DD), k = make(AJ_DTYPE_F32, 1, 1, SK, DD);
    tensor v = make(AJ_DTYPE_F32, 1, 1, SK, DD);
    tensor o[2] = {make(AJ_DTYPE_F32, 1, HQ, SQ, DD), make(AJ_DTYPE_F32, 1, HQ, SQ, DD)};
    tensor l[2] = {make_lse(1, HQ, SQ), make_lse(1, HQ, SQ)};
    fill(&q, 1.0);
    fill(&k, 1.0);
    fill(&v, 1.0);
    for (int half = 0; half < 2; half++) {
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.q = q.t;
        a.k = k.t;
        a.v = v.t;
        a.k.data = (float *)k.t.data + half * (SK / 2) * DD;
        a.v.data = (float *)v.t.data + half * (SK / 2) * DD;
        a.k.shape[2] = a.v.shape[2] = SK / 2;
        a.kv_offset = half * (SK / 2);
        a.o = o[half].t;
        a.lse = l[half].t;
        CHECK_STATUS(ctx, aj_forward(ctx, dev, fwd, &a), AJ_OK);
    }
    aj_merge_args m = AJ_MERGE_ARGS_INIT;
    m.o1 = m.o = o[0].t;
    m.lse1 = m.lse = l[0].t;
    m.o2 = o[1].t;
    m.lse2 = l[1].t;
    CHECK_STATUS(ctx, aj_merge(ctx, dev, mrg, &m), AJ_OK);
    ref_problem p = ref_problem_of(1, HQ, 1, SQ, SK, DD, DD);
    p.mask = AJ_MASK_CAUSAL;
    double *o_ref = calloc(o[0].n, sizeof *o_ref), *l_ref = calloc(l[0].n, sizeof *l_ref);
    ref_forward(&p, q.ref, k.ref, v.ref, o_ref, l_ref);
    int bad = 0;
    for (size_t r = 0; r < l[0].n; r++) {
        bad += !close_to(((float *)l[0].t.data)[r], l_ref[r], 1e-4, 1e-5);
        for (int x = 0; x < DD; x++)
            bad += !close_to(((float *)o[0].t.data)[r * DD + (size_t)x], o_ref[r * DD + (size_t)x],
                             5e-5, 1e-4);
    }
    CHECK_MSG(bad == 0, "forward halves + merge: %d values off", bad);
    printf("%-62s %s\n", "f32 causal: two forward halves merged = one pass", bad ? "FAIL" : "ok");
    free(o_ref);
    free(l_ref);
    release(&q);
    release(&k);
    release(&v);
    for (int i = 0; i < 2; i++) {
        release(&o[i]);
        release(&l[i]);
    }
    aj_kernel_destroy(fwd);
    aj_kernel_destroy(mrg);
}

/* ---------------------------------------------------------------- bias, dropout */

static void run_case(const fwd_case *c, const fwd_options *x)
{
    fwd_result r = fwd_run_case_with(ctx, dev, c, x);
    if (!fwd_check_result(ctx, c, &r))
        return;
    printf("%-62s O %.3f LSE %.3f empty rows %4lld\n", c->label, r.max_err_o, r.max_err_lse,
           (long long)r.rows_without_keys);
}

static fwd_case base(const char *label, aj_dtype dtype, int d, const char *mask)
{
    fwd_case c = fwd_case_base(label, dtype, d, mask);
    c.b = 2;
    c.sq = 45;
    c.sk = 70;
    c.seed = 11;
    return c;
}

static void test_bias(void)
{
    static const struct {
        const char *label;
        int full_b, full_h, stride0;
    } shapes[] = {
        {"bias [1, 1, Sq, Sk] stride 0", 0, 0, 1},
        {"bias [B, 1, Sq, Sk] stride 0", 1, 0, 1},
        {"bias [1, Hq, Sq, Sk] contiguous", 0, 1, 0},
        {"bias [B, Hq, Sq, Sk]", 1, 1, 0},
    };
    static const aj_dtype dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32, AJ_DTYPE_F16};
    static const char *const masks[] = {"causal(top_left)", "none", "window(12, 3)",
                                        "causal(bottom_right)"};
    char labels[4][128];
    for (int i = 0; i < 4; i++) {
        snprintf(labels[i], sizeof labels[i], "%s d64 %s, %s", aj_dtype_name(dtypes[i]),
                 masks[i], shapes[i].label);
        fwd_case c = base(labels[i], dtypes[i], 64, masks[i]);
        fwd_options x = {.bias_shape = {shapes[i].full_b ? c.b : 1, shapes[i].full_h ? c.hq : 1,
                                        c.sq, c.sk},
                         .bias_stride0 = shapes[i].stride0, .bias_magnitude = 3.0};
        c.seed = (uint64_t)i + 20;
        run_case(&c, &x);
    }
    fwd_case c = base("bf16 d128 bias [B, 1, Sq, Sk] + softcap(5) (bias before cap)",
                      AJ_DTYPE_BF16, 128, "causal(top_left)");
    c.score_mod = "softcap(5.0)";
    c.magnitude = 2.0;
    fwd_options x = {.bias_shape = {c.b, 1, c.sq, c.sk}, .bias_magnitude = 4.0};
    run_case(&c, &x);
    c = base("f32 d32 bias [1, Hq, Sq, Sk] + alibi, q_offset 20", AJ_DTYPE_F32, 32,
             "causal(bottom_right)");
    c.score_mod = "alibi";
    c.q_offset = 20;
    x = (fwd_options){.bias_shape = {1, c.hq, c.sq, c.sk}, .bias_stride0 = 1,
                      .bias_magnitude = 2.0};
    run_case(&c, &x);
}

static void test_dropout(void)
{
    fwd_case c = base("f16 d64 dropout 0.1 causal", AJ_DTYPE_F16, 64, "causal(top_left)");
    fwd_options x = {.dropout = 0.1, .drop_seed = 1234};
    run_case(&c, &x);
    c = base("bf16 d64 dropout 0.5, window, offsets, 64-bit seed/offset", AJ_DTYPE_BF16, 64,
             "window(20, 4, bottom_right)");
    c.q_offset = 300;
    c.kv_offset = 280;
    x = (fwd_options){.dropout = 0.5, .drop_seed = 0xdeadbeefcafef00dull,
                      .drop_offset = 0x0000000500000010ull};
    run_case(&c, &x);
    c = base("f32 d32 dropout 0.3 + bias [1, 1, Sq, Sk], GQA 4:2", AJ_DTYPE_F32, 32, "none");
    c.hq = 4;
    c.hkv = 2;
    x = (fwd_options){.bias_shape = {1, 1, c.sq, c.sk}, .bias_stride0 = 1,
                      .bias_magnitude = 1.0, .dropout = 0.3, .drop_seed = 99, .drop_offset = 7};
    run_case(&c, &x);
}

/*
 * The keep mask itself: with q = 0 every score is 0, so P_ij = 1/Sk, and
 * with V = identity (Dv = Sk) O[i][j] = keep_ij / ((1 - p) Sk).  Every
 * decision must match ref_dropout_keep, and the keep rate must be within
 * 5 sigma of 1 - p.
 */
static void test_dropout_mask(void)
{
    enum { HQ = 2, SQ = 128, SK = 64 };
    const double p = 0.3;
    const uint64_t seed = 0x0123456789abcdefull, offset = 0x100000002ull;
    const int64_t q_offset = 4096, kv_offset = 100;
    char spec[256];
    snprintf(spec, sizeof spec, "attention forward efficient { dtype = f32 head_dim = %d "
             "dropout = %.17g }", SK, p);
    aj_kernel *kernel = compile(spec);
    if (!kernel)
        return;
    tensor q = make(AJ_DTYPE_F32, 1, HQ, SQ, SK), k = make(AJ_DTYPE_F32, 1, 1, SK, SK);
    tensor v = make(AJ_DTYPE_F32, 1, 1, SK, SK), o = make(AJ_DTYPE_F32, 1, HQ, SQ, SK);
    tensor l = make_lse(1, HQ, SQ);
    fill(&k, 1.0);
    for (size_t i = 0; i < q.n; i++)
        set(&q, i, 0.0);
    for (size_t i = 0; i < v.n; i++)
        set(&v, i, i / SK == i % SK ? 1.0 : 0.0);
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = q.t;
    a.k = k.t;
    a.v = v.t;
    a.o = o.t;
    a.lse = l.t;
    a.q_offset = q_offset;
    a.kv_offset = kv_offset;
    a.seed = seed;
    a.offset = offset;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
    long kept = 0, mismatches = 0, off_value = 0;
    const double kept_value = 1.0 / ((1.0 - p) * SK);
    for (int h = 0; h < HQ; h++)
        for (int i = 0; i < SQ; i++)
            for (int j = 0; j < SK; j++) {
                double g = ((float *)o.t.data)[((size_t)h * SQ + (size_t)i) * SK + (size_t)j];
                int keep = g != 0.0;
                kept += keep;
                mismatches += keep != ref_dropout_keep(seed, offset, 0, h, HQ, q_offset + i,
                                                       kv_offset + j, p);
                off_value += keep && fabs(g - kept_value) > 1e-6 * kept_value;
            }
    double n = (double)HQ * SQ * SK;
    double sigma = sqrt(n * p * (1 - p));
    CHECK_MSG(mismatches == 0, "dropout mask: %ld decisions differ from ref_dropout_keep",
              mismatches);
    CHECK_MSG(off_value == 0, "dropout mask: %ld kept values are not 1/((1-p) Sk)", off_value);
    CHECK_MSG(fabs((double)kept - n * (1 - p)) <= 5 * sigma,
              "dropout keep rate %.4f, want %.4f +- %.4f", kept / n, 1 - p, 5 * sigma / n);
    printf("%-62s keep rate %.4f (want %.2f +- %.4f), %ld mismatches\n",
           "dropout mask probe p = 0.3", kept / n, 1 - p, 5 * sigma / n, mismatches);
    release(&q);
    release(&k);
    release(&v);
    release(&o);
    release(&l);
    aj_kernel_destroy(kernel);
}

int main(int argc, char **argv)
{
    static void (*const tests[])(void) = {
        test_accumulate, test_merge, test_merge_of_forwards, test_bias, test_dropout,
        test_dropout_mask, NULL};
    return test_main(argc, argv,
                     &(test_main_args){.fallback = AJ_DEVICE_SIM, .ctx = &ctx, .dev = &dev,
                                       .tests = tests, .cleanup = fwd_cache_clear});
}
