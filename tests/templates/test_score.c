/*
 * test_score.c -- score programs (templates/score.h) against the float64
 * reference, whose interpreter evaluates the same parsed expressions:
 *
 *   examples   every spec of examples/specs/scores (document mask, prefix LM,
 *              sliding window with sinks, chunked local, T5 relative bias,
 *              ALiBi and softcap as expressions) forward on the device
 *   random     well-typed random masks and score_mods over b, h, q, k,
 *              sq, sk, score and two small side tensors (loads in and out
 *              of range), up to 8 per launch, one per (b, h) plane
 *              (score_cases.h's rx_batch); a failing batch's cases run
 *              alone and a failing one shrinks to a small spec.  On the
 *              cpu, the block-mask lists of the examples and of the
 *              random batches from a case that is a multiple of 8 (those
 *              that take one) equal a recount of their classes
 *   builtins   causal / window / softcap / alibi written as expressions
 *              give the built-ins' results (the same programs)
 *   functions  every function (sin .. erf, pow) over argument ranges,
 *              value by value within a few ulp of the f32 rounding of
 *              the exact function
 *   classes    tile classes (host interval arithmetic) against a
 *              position-by-position count: never wrong, and exact for the
 *              band masks and the chunked mask; a score_mod whose
 *              derivative does not fit the program's nodes is refused
 *   blockmask  masks interval arithmetic cannot class read a block mask:
 *              built by the launch or passed (and reused), exact per tile,
 *              its lists the classes' non-skip tiles, the list walk's
 *              output that of the per-tile path bit for bit, refused for
 *              other sizes
 *
 * test_score DEVICE [VARIANT] [examples | random N | builtins | functions | classes | blockmask]...:
 * DEVICE is sim or cpu, VARIANT efficient (the default), flash (whose
 * kernels take f16 / bf16 only: the random and builtin cases run in f16
 * there) or wgmma (the flash forward on wgmma, schedule warpgroups = 1,
 * sim) or ws (the same warp specialised: warpgroups = 2, producer = 1,
 * the two consumer warpgroups taking turns); with no section named, all
 * of them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "score_cases.h"
#include "sim_harness.h"
#include "spec_dir.h"
#include "templates/score.h"

static aj_ctx *ctx;
static aj_device *dev;
static const char *variant_name = "efficient";
/* `test_score sim wgmma ...`: the flash forward on the wgmma template
 * (schedule warpgroups = 1; `ws`: 2 and producer = 1), these fields in
 * every spec */
static int warpgroups, producer;
static const char *extra_fields = "";

/* The most precise dtype the variant runs: the cases' dtype where the
 * spec does not fix one. */
static aj_dtype case_dtype(void)
{
    return strcmp(variant_name, "flash") == 0 ? AJ_DTYPE_F16 : AJ_DTYPE_F32;
}

static void check_mask_lists(const char *label, const char *spec, aj_dtype dt, int d,
                             const side_data *side, int B, int H, int S);
static int lists_checked;   /* masks whose lists check_mask_lists compared */

/* One forward case from spec fields; returns whether it passed. */
static bool run_fields(const char *label, aj_dtype dtype, int d, const char *tensors,
                       const char *mask, const char *mod, int B, int H, int S, uint64_t seed,
                       bool report)
{
    static char spec[16384];
    snprintf(spec, sizeof spec, "attention forward %s { %sdtype = %s head_dim = %d %s%s "
             "mask = %s score_mod = %s }", variant_name, extra_fields, aj_dtype_name(dtype), d,
             tensors[0] ? "tensors = " : "", tensors, mask, mod);
    aj_op *op = NULL;
    if (aj_op_parse(ctx, spec, strlen(spec), label, &op) != AJ_OK) {
        CHECK_MSG(0, "%s: %s", label, aj_last_error(ctx));
        return false;
    }
    aj_op_info info;
    aj_op_get_info(op, &info);
    aj_op_destroy(op);
    side_data side;
    side_make(&info, B, H, S, seed, &side);
    fwd_case c = {.label = label, .dtype = dtype, .d = d, .mask = mask, .score_mod = mod,
                  .b = B, .hq = H, .hkv = H, .sq = S, .sk = S, .magnitude = 1.0, .seed = seed};
    fwd_options x = {.tensors = tensors[0] ? tensors : NULL, .side = side.t, .num_side = side.n};
    fwd_run_options run = {.variant = strcmp(variant_name, "flash") == 0 ? AJ_VARIANT_FLASH
                                                                         : AJ_VARIANT_EFFICIENT,
                           .warpgroups = warpgroups, .producer = producer};
    fwd_result r = fwd_run_case_ext(ctx, dev, &c, &x, &run);
    /* the lists (each costs a compile and a build): on the cpu, once per
     * run (not again under AJ_CPU_ISA), for the examples and the random
     * batches from a case that is a multiple of 8; the sim's in the
     * blockmask section */
    if (aj_device_target(dev) == AJ_TARGET_CPU && !getenv("AJ_CPU_ISA") &&
        (report || seed % 8 == 0))
        check_mask_lists(label, spec, dtype, d, &side, B, H, S);
    side_free(&side);
    bool ok = r.status == AJ_OK && r.max_err_o <= 1.0 && r.max_err_lse <= 1.0 &&
              r.exact_empty_rows;
    if (report) {
        CHECK_MSG(r.status == AJ_OK, "%s: %s", label, aj_last_error(ctx));
        CHECK_MSG(r.status != AJ_OK || (r.max_err_o <= 1.0 && r.max_err_lse <= 1.0),
                  "%s: o %.3g, lse %.3g of the tolerance\n  %s", label, r.max_err_o,
                  r.max_err_lse, spec);
        CHECK_MSG(r.status != AJ_OK || r.exact_empty_rows,
                  "%s: a row without keys is not O = 0, LSE = -inf", label);
    }
    return ok;
}

/* ---------------------------------------------------------------- examples */

static void run_example(const char *name, const score_example *ex, int index, void *user)
{
    (void)user;
    if (!check_sampled())
        return;
    /* long enough for a 128-token chunk and a 64-key window to matter */
    run_fields(name, ex->info.dtype, ex->info.head_dim, ex->tensors, ex->mask, ex->mod, 2, 2,
               150, 7 + (uint64_t)index, true);
}

static void test_examples(const char *dir)
{
    int seen = 0, files = score_examples_each(ctx, dir, run_example, NULL, &seen);
    CHECK_MSG(files >= 0, "cannot open %s", dir);
    CHECK_MSG(seen == files, "%d of %d specs in %s parse: %s", seen, files, dir,
              aj_last_error(ctx));
    CHECK_MSG(seen >= 7, "only %d example specs in %s", seen, dir);
    printf("examples: %d specs on %s\n", seen, aj_target_name(aj_device_target(dev)));
}

/* ---------------------------------------------------------------- random */

/* tf's dtype by run: sim's efficient f32, flash and ws bf16, wgmma and
 * the cpu f16 (score_cases.h's rx_tensors) */
static const char *random_tensors;

/* Random case t->index alone with the tree at root (B 2, H 2); whether it
 * passed. */
static bool random_run(rx_tree *t, int root, bool report)
{
    char e[8192], label[64];
    rx_expression(t, root, t->score, e, sizeof e);
    snprintf(label, sizeof label, "random %d%s", t->index, report ? " (shrunk)" : "");
    return run_fields(label, case_dtype(), 16, random_tensors, t->score ? "causal(top_left)" : e,
                      t->score ? e : "none", 2, 2, 23, (uint64_t)t->index, report);
}

static bool random_fails(rx_tree *t, int root, void *user)
{
    (void)user;
    return !random_run(t, root, false);
}

static void random_failed(rx_tree *t, int root, void *user)
{
    (void)user;
    char e[8192];
    rx_expression(t, root, t->score, e, sizeof e);
    CHECK_MSG(0, "random case %d fails; shrunk to:\n  tensors = %s\n  %s = %s", t->index,
              random_tensors, t->score ? "score_mod" : "mask", e);
    random_run(t, root, true);
}

/* A batch of random cases (score_cases.h's rx_batch), one per (b, h)
 * plane of B 2, H 4; whether it fails. */
static bool batch_fails(rx_batch *b, void *user)
{
    (void)user;
    static char field[33000];
    char label[96];
    rx_batch_field(b, field, sizeof field);
    snprintf(label, sizeof label, "random %ss %d .. %d", b->score ? "score_mod" : "mask",
             b->t[0].index, b->t[b->count - 1].index);
    return !run_fields(label, case_dtype(), 16, random_tensors,
                       b->score ? "causal(top_left)" : field, b->score ? field : "none",
                       RX_BATCH_B, RX_BATCH_H, 23, (uint64_t)b->t[0].index, false);
}

static void test_random(int count)
{
    static rx_batch b;
    lists_checked = 0;
    count = check_sample_count(count);
    const rx_batch_runner r = {ctx, random_tensors, batch_fails, random_fails, random_failed,
                               NULL, "forward"};
    int launches = 0, failed = rx_batch_cases(&b, count, 0x5eed0000u, &r, &launches);
    printf("random: %d expressions, %s forward in %s on %s in %d launches, %d failed; the "
           "block-mask lists of %d checked\n", count, variant_name,
           aj_dtype_name(case_dtype()), aj_target_name(aj_device_target(dev)), launches, failed,
           lists_checked);
}

/* ---------------------------------------------------------------- builtins */

/* The built-ins and the expressions aj_expr_builtin_text says they are:
 * the same program, so the same outputs, bit for bit. */
/* A forward's device tensors: q, k, v of seeded values in [-0.5, 0.5)
 * (dtype dt, [B, H, S, D] contiguous), o and lse, bound in f->a; ALiBi's
 * slopes (H of them, 2^-(h+1)) as alibi_slopes and as side tensor "slp"
 * (dev_fwd_side binds it). */
typedef struct dev_fwd {
    aj_fwd_args a;
    void *mem[6];
    size_t n, elem;
    aj_side_tensor slp;
} dev_fwd;

static void dev_fwd_make(dev_fwd *f, aj_dtype dt, int B, int H, int S, int D)
{
    f->elem = dt == AJ_DTYPE_F32 ? 4 : 2;
    f->n = (size_t)B * H * S * D;
    void *staged = malloc(f->n * f->elem);
    uint64_t rng = 3;
    for (int t = 0; t < 5; t++)
        aj_device_alloc(dev, t < 4 ? f->n * f->elem : (size_t)B * H * S * 4, &f->mem[t]);
    float slopes[64];
    for (int h = 0; h < H && h < 64; h++)
        slopes[h] = ldexpf(1.0f, -(h + 1));
    aj_device_alloc(dev, (size_t)H * 4, &f->mem[5]);
    aj_device_copy_to(dev, f->mem[5], slopes, (size_t)H * 4);
    /* q, k, v drawn element by element, interleaved */
    float *qkv[3] = {malloc(f->n * 4), malloc(f->n * 4), malloc(f->n * 4)};
    for (size_t e = 0; e < f->n; e++)
        for (int t = 0; t < 3; t++)
            qkv[t][e] = (float)((double)(splitmix_next(&rng) >> 11) / 9007199254740992.0 - 0.5);
    for (int t = 0; t < 3; t++) {
        aj_convert(qkv[t], AJ_DTYPE_F32, staged, dt, f->n);
        aj_device_copy_to(dev, f->mem[t], staged, f->n * f->elem);
        free(qkv[t]);
    }
    free(staged);
    f->a = (aj_fwd_args)AJ_FWD_ARGS_INIT;
    const int64_t shape[4] = {B, H, S, D}, strides[4] = {H * S * D, S * D, D, 1};
    aj_tensor *ts[4] = {&f->a.q, &f->a.k, &f->a.v, &f->a.o};
    for (int t = 0; t < 4; t++) {
        *ts[t] = (aj_tensor){f->mem[t], dt, 4, {0}, {0}};
        memcpy(ts[t]->shape, shape, sizeof shape);
        memcpy(ts[t]->strides, strides, sizeof strides);
    }
    f->a.lse = (aj_tensor){f->mem[4], AJ_DTYPE_F32, 3, {B, H, S}, {H * S, S, 1}};
    f->a.alibi_slopes = (aj_tensor){f->mem[5], AJ_DTYPE_F32, 1, {H}, {1}};
    f->slp = (aj_side_tensor){"slp", f->mem[5], AJ_SIDE_F32, 1, {H}, {1}};
}

/* The slopes as side tensor "slp" too (an op that declares it). */
static void dev_fwd_side(dev_fwd *f)
{
    f->a.side = &f->slp;
    f->a.num_side = 1;
}

/* o, read back (malloc'ed). */
static void *dev_fwd_output(const dev_fwd *f)
{
    void *o = malloc(f->n * f->elem);
    aj_device_copy_from(dev, o, f->mem[3], f->n * f->elem);
    return o;
}

static void dev_fwd_free(dev_fwd *f)
{
    for (int t = 0; t < 6; t++)
        aj_device_free(dev, f->mem[t]);
}

/* The op of `spec` compiled for the device (NULL on failure, reported). */
static aj_kernel *compile_spec(const char *label, const char *spec, aj_op **op_out)
{
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), label, &op), AJ_OK);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    if (op)
        CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
    if (op_out)
        *op_out = op;
    else
        aj_op_destroy(op);
    return k;
}

static void test_builtins(void)
{
    static const char *const pairs[][4] = {
        {"causal(top_left)", "none", "expr(k <= q)", "none"},
        {"causal(bottom_right)", "none", "expr(k <= q + (sk - sq))", "none"},
        {"window(9, 2, bottom_right)", "none", "expr(q + (sk - sq) - 9 <= k && k <= q + (sk - sq) + 2)", "none"},
        {"causal(top_left)", "softcap(7.0)", "causal(top_left)", "expr(7.0 * tanh(score / 7.0))"},
        /* ALiBi's slopes from the launch or a side tensor, after a softcap */
        {"none", "alibi", "none", "alibi(slp)"},
        {"none", "alibi(slp)", "none", "expr(score - slp[h] * abs(q - k))"},
        {"causal(bottom_right)", "softcap(7.0) + alibi", "causal(bottom_right)",
         "softcap(7.0) + alibi(slp)"},
        {"window(9, 2, bottom_right)", "softcap(7.0) + alibi(slp)", "window(9, 2, bottom_right)",
         "expr(7.0 * tanh(score / 7.0) - slp[h] * abs(q - k))"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const aj_dtype dt = case_dtype();
        void *o[2];
        size_t bytes = 0;
        for (int w = 0; w < 2; w++) {
            char spec[1024];
            const int slp = strstr(pairs[i][2 * w + 1], "slp") != NULL;
            snprintf(spec, sizeof spec, "attention forward %s { %sdtype = %s head_dim = 32 "
                     "%smask = %s score_mod = %s }", variant_name, extra_fields,
                     aj_dtype_name(dt), slp ? "tensors = (slp: f32[1]) " : "",
                     pairs[i][2 * w], pairs[i][2 * w + 1]);
            aj_kernel *k = compile_spec("builtin", spec, NULL);
            dev_fwd f;
            dev_fwd_make(&f, dt, 1, 2, 37, 32);
            if (slp)
                dev_fwd_side(&f);
            f.a.sk_total = 37 + 5;   /* bottom_right over a longer key total */
            f.a.kv_offset = 5;
            CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &f.a), AJ_OK);
            o[w] = dev_fwd_output(&f);
            bytes = f.n * f.elem;
            dev_fwd_free(&f);
            aj_kernel_destroy(k);
        }
        CHECK_MSG(memcmp(o[0], o[1], bytes) == 0, "%s / %s differs from %s / %s", pairs[i][0],
                  pairs[i][1], pairs[i][2], pairs[i][3]);
        free(o[0]), free(o[1]);
    }
}

/* ---------------------------------------------------------------- functions */

/*
 * Each function of the expression language on the device, value by value
 * against the evaluator's f32 rounding of the exact function: a score_mod
 * F(x(q)) with only key 0 kept (mask k == 0) makes each row's LSE the
 * kernel's F(x) itself (one key: m = s, l = 1), so row q checks F at x =
 * lo + step q, S of them per range.  The bound: a few ulp of the value
 * (the table's) plus 2^-22 absolute (sin and cos near their zeros: the
 * reduction's error is absolute), in f32.  The worst error per function
 * is printed in ulp.  (Values stay below 2^127 / log2 e: the kernels'
 * softmax works in log2 units.)
 */
static void test_functions(void)
{
    /* the bound in ulp: 4, but tanh's (1 - 2 / (e^2x + 1) cancels near 0)
     * and pow's (|N| roundings in its squarings and products) */
    static const struct { const char *f; double lo, hi, ulps; } cases[] = {
        {"sin(X)", -8.0, 8.0, 4}, {"sin(X)", -8192.0, 8192.0, 4}, {"cos(X)", -8.0, 8.0, 4},
        {"cos(X)", -8192.0, 8192.0, 4}, {"tan(X)", -1.5, 1.5, 4}, {"tan(X)", 3.0, 4.5, 4},
        {"sigmoid(X)", -40.0, 40.0, 4}, {"erf(X)", -5.0, 5.0, 4}, {"erf(X)", -1.1, 1.1, 4},
        {"exp2(X)", -120.0, 120.0, 4}, {"log2(X)", 1e-3, 1000.0, 4}, {"exp(X)", -100.0, 85.0, 4},
        {"tanh(X)", -10.0, 10.0, 32}, {"pow(X, 2)", -30.0, 30.0, 4}, {"pow(X, 7)", -3.0, 3.0, 7},
        {"pow(X, -3)", 0.25, 8.0, 4}, {"pow(X, 0)", -2.0, 2.0, 4}, {"pow(X, 64)", 0.5, 1.3, 64},
    };
    const int S = 1024, D = 8;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char x[128], f[160], spec[512];
        double step = (cases[c].hi - cases[c].lo) / S;
        snprintf(x, sizeof x, "(%.17g + %.17g * q)", cases[c].lo, step);
        const char *at = strstr(cases[c].f, "X");
        snprintf(f, sizeof f, "%.*s%s%s", (int)(at - cases[c].f), cases[c].f, x, at + 1);
        snprintf(spec, sizeof spec, "attention forward %s { %sdtype = %s head_dim = %d "
                 "mask = expr(k == 0) score_mod = expr(%s) }", variant_name, extra_fields,
                 aj_dtype_name(case_dtype()), D, f);
        aj_op *op = NULL;
        aj_kernel *k = compile_spec(cases[c].f, spec, &op);
        aj_score_prog prog;
        if (!k || aj_score_prog_init(ctx, op, &prog) != AJ_OK) {
            CHECK_MSG(0, "%s: %s", spec, aj_last_error(ctx));
            aj_kernel_destroy(k);
            aj_op_destroy(op);
            continue;
        }
        dev_fwd fw;
        dev_fwd_make(&fw, case_dtype(), 1, 1, S, D);
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &fw.a), AJ_OK);
        float *lse = malloc((size_t)S * 4);
        aj_device_copy_from(dev, lse, fw.mem[4], (size_t)S * 4);
        double worst = 0;
        int bad = -1;
        for (int q = 0; q < S; q++) {
            aj_expr_env env = {.q = q, .sq = S, .sk = S};
            float want = (float)aj_expr_eval_f64(&prog.e, prog.mod, &env);
            float ulp = nextafterf(fabsf(want), INFINITY) - fabsf(want);
            double err = fabs((double)lse[q] - want);
            if (isinf(want) && lse[q] == want)
                err = 0;
            double in_ulp = err / ulp;
            worst = in_ulp > worst ? in_ulp : worst;
            if (!(err <= cases[c].ulps * ulp + 0x1p-22) && bad < 0)
                bad = q;
        }
        printf("functions: %-10s on [%g, %g]: worst %.2f ulp\n", cases[c].f, cases[c].lo,
               cases[c].hi, worst);
        if (bad >= 0) {
            aj_expr_env env = {.q = bad, .sq = S, .sk = S};
            CHECK_MSG(0, "%s at q = %d: %.9g, want %.9g", f, bad, (double)lse[bad],
                      aj_expr_eval_f64(&prog.e, prog.mod, &env));
        }
        free(lse);
        dev_fwd_free(&fw);
        aj_score_prog_free(&prog);
        aj_kernel_destroy(k);
        aj_op_destroy(op);
    }
}

/* ---------------------------------------------------------------- classes */

/* Position-by-position class of a tile (the reference interpreter). */
static aj_tile_class brute_class(const aj_op *op, const aj_side_tensor *tensors, int64_t b,
                                 int64_t h, int64_t q0, int64_t q1, int64_t k0, int64_t k1,
                                 int64_t sq, int64_t sk)
{
    bool any = false, all = true;
    aj_expr_env env = {.b = b, .h = h, .sq = sq, .sk = sk, .tensors = tensors,
                       .tensor_count = tensors ? 1 : 0};
    for (int64_t q = q0; q <= q1; q++)
        for (int64_t k = k0; k <= k1; k++) {
            env.q = q, env.k = k;
            bool v = aj_expr_eval_bool(&op->expr, op->mask.root, &env);
            any = any || v;
            all = all && v;
        }
    return !any ? AJ_TILE_SKIP : all ? AJ_TILE_FULL : AJ_TILE_PARTIAL;
}

static void test_classes(void)
{
    /* exact: bands, chunks, documents aligned with the tiles; sound only:
     * the others.  doc[0, t]: documents of 20 tokens (aligned), then of 7
     * (straddling tiles) past 50; seg[t] the same as f32. */
    static const struct { const char *mask; bool exact; } masks[] = {
        {"k <= q", true},
        {"k <= q + (sk - sq)", true},
        {"q - 9 <= k && k <= q + 3", true},
        {"q / 16 == k / 16 && k <= q", true},
        {"k <= q && (k < 4 || q - k < 20)", false},
        {"k % 7 == q % 7", false},
        {"abs(q - k) * 2 <= 11 || k == 0", false},
        {"min(q, 40) >= k - 3", false},
        {"doc[b, q] == doc[b, k] && k <= q", false},
        {"doc[b, min(q, 49)] == doc[b, min(k, 49)]", true},
        {"doc[b, q + 200] == doc[b, k]", false},
        {"doc[b, q] != doc[b, k] || k >= q", false},
    };
    static int32_t doc[90];
    for (int t = 0; t < 90; t++)
        doc[t] = t < 50 ? t / 20 : 3 + (t - 50) / 7;
    const aj_side_tensor doc_t = {"doc", doc, AJ_SIDE_I32, 2, {1, 90}, {90, 1}};
    int counts[3] = {0, 0, 0}, brute[3] = {0, 0, 0};
    for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
        char spec[512];
        snprintf(spec, sizeof spec, "attention forward efficient { dtype = f16 head_dim = 16 "
                 "tensors = (doc: i32[2]) mask = expr(%s) }", masks[m].mask);
        aj_op *op = NULL;
        CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), "classes", &op), AJ_OK);
        if (!op)
            continue;
        aj_score_prog prog = {0};
        CHECK_STATUS(ctx, aj_score_prog_init(ctx, op, &prog), AJ_OK);
        const int64_t sq = 70, sk = 90;
        for (int tq = 0; tq < 7; tq++)
            for (int tk = 0; tk < 9; tk++) {
                int64_t q0 = tq * 10, k0 = tk * 10;
                aj_tile_class got = aj_score_host_class(&prog, &doc_t, NULL, 0, 1, q0, q0 + 9, k0,
                                                        k0 + 9, sq, sk);
                aj_tile_class want = brute_class(op, &doc_t, 0, 1, q0, q0 + 9, k0, k0 + 9, sq,
                                                 sk);
                counts[got]++;
                brute[want]++;
                if (masks[m].exact)
                    CHECK_MSG(got == want, "%s: tile q %lld k %lld: class %d, position by "
                              "position %d", masks[m].mask, (long long)q0, (long long)k0,
                              got, want);
                else
                    CHECK_MSG(got == want || got == AJ_TILE_PARTIAL, "%s: tile q %lld k %lld: "
                              "class %d where the positions say %d", masks[m].mask,
                              (long long)q0, (long long)k0, got, want);
            }
        aj_score_prog_free(&prog);
        aj_op_destroy(op);
    }
    printf("classes: skip / partial / full %d / %d / %d (position by position %d / %d / %d)\n",
           counts[0], counts[1], counts[2], brute[0], brute[1], brute[2]);
}

/* The terms lo .. hi-1 of tanh(score * tf[t]), summed as a balanced tree
 * (so its depth stays in the limit), appended to out. */
static void tanh_sum(int lo, int hi, char *out, size_t cap)
{
    size_t len = strlen(out);
    if (hi - lo == 1) {
        snprintf(out + len, cap - len, "tanh(score * tf[%d])", lo);
        return;
    }
    snprintf(out + len, cap - len, "(");
    tanh_sum(lo, (lo + hi) / 2, out, cap);
    len = strlen(out);
    snprintf(out + len, cap - len, " + ");
    tanh_sum((lo + hi) / 2, hi, out, cap);
    len = strlen(out);
    snprintf(out + len, cap - len, ")");
}

/* A score_mod that fits the op's nodes but not with its derivative: the
 * program is refused with a message (the differentiation stops at the
 * full arena, never reading past it), and a shorter one builds. */
static void test_program_limits(void)
{
    /* about 6 nodes per term in the op, 13 with the derivative */
    static const struct { int terms; aj_status want; } cases[] = {
        {512, AJ_ERR_UNSUPPORTED},
        {128, AJ_OK},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static char sum[32768], spec[33000];
        sum[0] = '\0';
        tanh_sum(0, cases[i].terms, sum, sizeof sum);
        snprintf(spec, sizeof spec, "attention backward flash { dtype = f16 head_dim = 16 "
                 "tensors = (tf: f32[1]) score_mod = expr(%s) }", sum);
        aj_op *op = NULL;
        CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), "limits", &op), AJ_OK);
        if (!op)
            continue;
        aj_score_prog prog;
        CHECK_STATUS(ctx, aj_score_prog_init(ctx, op, &prog), cases[i].want);
        if (cases[i].want != AJ_OK)
            CHECK_ERROR(ctx, "the score program and its derivative do not fit 4096 nodes of "
                        "depth at most 256");
        else
            aj_score_prog_free(&prog);
        aj_op_destroy(op);
    }
}

/* A score_mod of about 1600 nodes with its derivative, past the size at
 * which the kernels call the program instead of inlining it at every
 * element (score_emit.c, OUTLINE_NODES): the forward against the
 * reference, with a mask and without. */
static void test_outlined(void)
{
    static char mod[16384];
    snprintf(mod, sizeof mod, "expr(score + 0.02 * ");
    tanh_sum(0, 120, mod, sizeof mod);
    strcat(mod, ")");
    static const char *const masks[2] = {"causal(bottom_right)", "none"};
    for (int m = 0; m < 2; m++) {
        char label[64];
        snprintf(label, sizeof label, "outlined program, mask %s", masks[m]);
        run_fields(label, case_dtype(), 32, "(tf: f32[1])", masks[m], mod, 2, 2, 37 + m * 20,
                   900 + (uint64_t)m, true);
    }
}

/* ---------------------------------------------------------------- block masks */

/* The lists of block mask `bm` (aj_block_mask_list: what the kernels
 * walk) against a recount of its classes (aj_block_mask_class): for every
 * (b, h), every query block's key blocks and every key block's query
 * blocks that are not skip, in order, with their classes. */
static void check_lists(const char *label, const aj_block_mask *bm, int B, int H, int S)
{
    aj_tile_counts counts;
    CHECK_STATUS(ctx, aj_block_mask_counts(bm, &counts), AJ_OK);
    const int64_t blocks[2] = {(S + counts.block_m - 1) / counts.block_m,
                               (S + counts.block_n - 1) / counts.block_n};
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int by_keys = 0; by_keys < 2; by_keys++)
                for (int64_t i = 0; i < blocks[!by_keys]; i++) {
                    int64_t got[256], n = -1, want = 0;
                    aj_tile_class cls[256];
                    CHECK_STATUS(ctx, aj_block_mask_list(bm, b, h, by_keys, i, got, cls, 256,
                                                         &n), AJ_OK);
                    for (int64_t j = 0; j < blocks[by_keys] && n <= 256; j++) {
                        aj_tile_class c = AJ_TILE_SKIP;
                        aj_block_mask_class(bm, b, h, by_keys ? i : j, by_keys ? j : i, &c);
                        if (c == AJ_TILE_SKIP)
                            continue;
                        CHECK_MSG(want < n && got[want] == j && cls[want] == c,
                                  "%s: b %d h %d %s block %lld: entry %lld is %lld (class %d), "
                                  "the classes say %lld (class %d)", label, b, h,
                                  by_keys ? "query" : "key", (long long)i, (long long)want,
                                  want < n ? (long long)got[want] : -1LL,
                                  want < n ? (int)cls[want] : -1, (long long)j, (int)c);
                        want++;
                    }
                    CHECK_MSG(n == want, "%s: b %d h %d %s block %lld lists %lld tiles; the "
                              "classes have %lld", label, b, h, by_keys ? "query" : "key",
                              (long long)i, (long long)n, (long long)want);
                }
}

/* For a case whose op takes a block mask: one built for it, its lists
 * against its classes (check_lists). */
static void check_mask_lists(const char *label, const char *spec, aj_dtype dt, int d,
                             const side_data *side, int B, int H, int S)
{
    aj_op *op = NULL;
    if (aj_op_parse(ctx, spec, strlen(spec), label, &op) != AJ_OK)
        return;
    aj_score_prog prog;
    bool takes = aj_score_prog_init(ctx, op, &prog) == AJ_OK && prog.block_mask;
    aj_score_prog_free(&prog);
    if (!takes) {
        aj_op_destroy(op);
        return;
    }
    aj_kernel *k = compile_spec(label, spec, NULL);
    dev_fwd f;
    dev_fwd_make(&f, dt, B, H, S, d);
    aj_status st = AJ_OK;
    aj_side_tensor on_dev[8];
    side_to_device(dev, &st, side->t, side->n, on_dev);
    f.a.side = on_dev;
    f.a.num_side = side->n;
    aj_block_mask *bm = NULL;
    if (k && st == AJ_OK)
        CHECK_STATUS(ctx, aj_block_mask_create(ctx, dev, op, k, &f.a, &bm), AJ_OK);
    if (bm) {
        check_lists(label, bm, B, H, S);
        lists_checked++;
    }
    aj_block_mask_destroy(bm);
    side_free_device(dev, on_dev, side->n);
    dev_fwd_free(&f);
    aj_kernel_destroy(k);
    aj_op_destroy(op);
}

/*
 * Masks interval arithmetic cannot class take a block mask
 * (score.h: aj_score_prog.block_mask): the launch builds one when none is
 * passed, and a passed one (aj_block_mask_create) gives the same output,
 * call after call; its tile classes equal a position-by-position count;
 * one built for other sizes is refused with a message naming the size.
 * Masks of positions alone keep their in-kernel classes.
 */
static void test_block_masks(void)
{
    static const struct { const char *mask; bool takes; } masks[] = {
        {"(q * k) % 3 != 0 || k <= q", true},
        {"doc[b, q] == doc[b, k] && k <= q", true},
        {"k % (q + 1) == 0", true},
        {"q / 16 == k / 16 && k <= q", false},
        {"k <= q", false},
    };
    enum { B = 2, H = 2, S = 150, D = 32 };
    static int32_t doc[B * S];
    for (int t = 0; t < B * S; t++)
        doc[t] = t < S ? t / 20 : (t - S) / 9;
    const aj_side_tensor doc_host = {"doc", doc, AJ_SIDE_I32, 2, {B, S}, {S, 1}};
    aj_side_tensor doc_dev;
    aj_status st = AJ_OK;
    side_to_device(dev, &st, &doc_host, 1, &doc_dev);
    CHECK_STATUS(ctx, st, AJ_OK);
    const aj_dtype dt = case_dtype();
    for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
        const char *mask = masks[m].mask;
        char spec[512], fields[256];
        snprintf(spec, sizeof spec, "attention forward %s { %sdtype = %s head_dim = %d "
                 "tensors = (doc: i32[2]) mask = expr(%s) }", variant_name, extra_fields,
                 aj_dtype_name(dt), D, mask);
        aj_op *op = NULL;
        aj_kernel *k = compile_spec("block mask", spec, &op);
        if (!k) {
            aj_op_destroy(op);
            continue;
        }
        aj_score_prog prog = {0};
        CHECK_STATUS(ctx, aj_score_prog_init(ctx, op, &prog), AJ_OK);
        CHECK_MSG(prog.block_mask == masks[m].takes, "%s: takes a block mask: %d, want %d",
                  mask, prog.block_mask, masks[m].takes);
        aj_score_prog_free(&prog);
        /* against the float64 reference, with the mask the launch builds */
        snprintf(fields, sizeof fields, "expr(%s)", mask);
        run_fields(mask, dt, D, "(doc: i32[2])", fields, "none", B, H, 150, 5 + m, true);

        dev_fwd f;
        dev_fwd_make(&f, dt, B, H, S, D);
        f.a.side = &doc_dev;
        f.a.num_side = 1;
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &f.a), AJ_OK);
        void *implicit = dev_fwd_output(&f);
        aj_block_mask *bm = NULL;
        CHECK_STATUS(ctx, aj_block_mask_create(ctx, dev, op, k, &f.a, &bm), AJ_OK);
        f.a.block_mask = bm;
        for (int call = 0; bm && call < 2; call++) {   /* one mask, reused */
            CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &f.a), AJ_OK);
            void *passed = dev_fwd_output(&f);
            CHECK_MSG(memcmp(implicit, passed, f.n * f.elem) == 0,
                      "%s: call %d with a passed block mask differs from the launch's own",
                      mask, call);
            free(passed);
        }
        aj_tile_counts counts = {0};
        if (bm)
            aj_block_mask_counts(bm, &counts);
        if (bm && counts.block_n % 2 == 0) {
            /* a mask of tiles half as wide: the kernel classes each of its
             * tiles from the two it covers, walking every tile of the band
             * (no list) -- the list walk's output, bit for bit */
            char other_spec[640];
            snprintf(other_spec, sizeof other_spec, "attention forward %s { dtype = %s "
                     "head_dim = %d tensors = (doc: i32[2]) mask = expr(%s) schedule = "
                     "(block_m = %d, block_n = %d%s) }", variant_name, aj_dtype_name(dt), D,
                     mask, counts.block_m, counts.block_n / 2,
                     producer ? ", warpgroups = 2, producer = 1"
                     : warpgroups ? ", warpgroups = 1" : "");
            aj_op *other_op = NULL;
            aj_kernel *other_k = compile_spec("block mask tile", other_spec, &other_op);
            aj_block_mask *halves = NULL;
            if (other_k)
                CHECK_STATUS(ctx, aj_block_mask_create(ctx, dev, other_op, other_k, &f.a,
                                                       &halves), AJ_OK);
            f.a.block_mask = halves;
            if (halves)
                CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &f.a), AJ_OK);
            void *per_tile = dev_fwd_output(&f);
            CHECK_MSG(!halves || memcmp(implicit, per_tile, f.n * f.elem) == 0,
                      "%s: the per-tile path (a mask of %d x %d tiles) differs from the list "
                      "walk", mask, counts.block_m, counts.block_n / 2);
            free(per_tile);
            f.a.block_mask = bm;
            aj_block_mask_destroy(halves);
            aj_kernel_destroy(other_k);
            aj_op_destroy(other_op);
        }
        if (bm && strstr(mask, "doc[")) {
            /* the kernels read the mask: one built from other documents
             * (each token its own) skips tiles this one shows */
            static int32_t own[B * S];
            for (int t = 0; t < B * S; t++)
                own[t] = t;
            const aj_side_tensor own_host = {"doc", own, AJ_SIDE_I32, 2, {B, S}, {S, 1}};
            aj_side_tensor own_dev;
            side_to_device(dev, &st, &own_host, 1, &own_dev);
            aj_block_mask *other = NULL;
            f.a.side = &own_dev;
            CHECK_STATUS(ctx, aj_block_mask_create(ctx, dev, op, k, &f.a, &other), AJ_OK);
            f.a.side = &doc_dev;
            f.a.block_mask = other;
            CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &f.a), AJ_OK);
            void *wrong = dev_fwd_output(&f);
            CHECK_MSG(memcmp(implicit, wrong, f.n * f.elem) != 0,
                      "%s: a mask of other documents does not change the output", mask);
            free(wrong);
            f.a.block_mask = bm;
            aj_block_mask_destroy(other);
            side_free_device(dev, &own_dev, 1);
        }
        int64_t rows = (S + counts.block_m - 1) / counts.block_m;
        int64_t cols = (S + counts.block_n - 1) / counts.block_n, seen[3] = {0, 0, 0};
        for (int b = 0; bm && b < B; b++)
            for (int h = 0; h < H; h++)
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = 0; c < cols; c++) {
                        int64_t q0 = r * counts.block_m, k0 = c * counts.block_n;
                        int64_t q1 = q0 + counts.block_m > S ? S - 1 : q0 + counts.block_m - 1;
                        int64_t k1 = k0 + counts.block_n > S ? S - 1 : k0 + counts.block_n - 1;
                        aj_tile_class got = AJ_TILE_CLASS_COUNT;
                        aj_block_mask_class(bm, b, h, r, c, &got);
                        aj_tile_class want = brute_class(op, &doc_host, b, h, q0, q1, k0, k1, S, S);
                        if (got < AJ_TILE_CLASS_COUNT)
                            seen[got]++;
                        CHECK_MSG(got == want, "%s: b %d tile (%lld, %lld): class %d, "
                                  "position by position %d", mask, b, (long long)r,
                                  (long long)c, got, want);
                    }
        for (int c = 0; bm && c < 3; c++)
            CHECK_MSG(seen[c] == counts.tiles[c], "%s: %lld tiles of class %d, counts say %lld",
                      mask, (long long)seen[c], c, (long long)counts.tiles[c]);
        if (bm)
            check_lists(mask, bm, B, H, S);
        if (bm && masks[m].takes) {
            /* built for kv_offset 0: a launch at another offset is refused */
            f.a.kv_offset = 5;
            CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &f.a), AJ_ERR_INVALID_ARG);
            CHECK_ERROR(ctx, "aj_forward: block_mask was built for kv_offset = 0; this launch "
                        "has 5");
            f.a.kv_offset = 0;
            f.a.q = (aj_tensor){f.a.q.data, dt, 4, {B, H, S - 1, D}, {H * S * D, S * D, D, 1}};
            f.a.o.shape[2] = S - 1;
            f.a.lse.shape[2] = S - 1;
            CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &f.a), AJ_ERR_INVALID_ARG);
            CHECK_ERROR(ctx, "aj_forward: block_mask was built for seq_q = 150; this launch "
                        "has 149");
        }
        printf("block mask %s: skip / partial / full %lld / %lld / %lld\n", mask,
               (long long)counts.tiles[0], (long long)counts.tiles[1], (long long)counts.tiles[2]);
        aj_block_mask_destroy(bm);
        free(implicit);
        dev_fwd_free(&f);
        aj_kernel_destroy(k);
        aj_op_destroy(op);
    }
    side_free_device(dev, &doc_dev, 1);
}

int main(int argc, char **argv)
{
    const char *device = argc > 1 ? argv[1] : "sim";
    int first = 2;   /* the first section argument */
    if (argc > 2 && (strcmp(argv[2], "flash") == 0 || strcmp(argv[2], "efficient") == 0))
        variant_name = argv[first++];
    else if (argc > 2 && strcmp(argv[2], "wgmma") == 0) {
        variant_name = "flash";
        warpgroups = 1;
        extra_fields = "schedule = (warpgroups = 1) ";
        first++;
    } else if (argc > 2 && strcmp(argv[2], "ws") == 0) {
        variant_name = "flash";
        warpgroups = 2;
        producer = 1;
        extra_fields = "schedule = (warpgroups = 2, producer = 1) ";
        first++;
    }
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    CHECK_STATUS(ctx, aj_device_open(ctx, strcmp(device, "cpu") == 0 ? AJ_DEVICE_CPU
                                                                       : AJ_DEVICE_SIM, 0, &dev),
                 AJ_OK);
    if (!dev)
        return check_report();
    const char *examples = score_examples_dir();
    random_tensors = rx_tensors(aj_device_target(dev) == AJ_TARGET_CPU || (warpgroups &&
                                !producer) ? AJ_SIDE_F16
                                : strcmp(variant_name, "flash") == 0 ? AJ_SIDE_BF16
                                : AJ_SIDE_F32);
    bool all = argc <= first;
    for (int i = first; i <= argc; i++) {
        const char *what = i < argc ? argv[i] : NULL;
        if (all || (what && strcmp(what, "examples") == 0))
            test_examples(examples);
        if (all || (what && strcmp(what, "random") == 0))
            test_random(what && i + 1 < argc ? atoi(argv[++i]) : 200);
        if (all || (what && strcmp(what, "builtins") == 0))
            test_builtins();
        if (all || (what && strcmp(what, "functions") == 0))
            test_functions();
        if (all || (what && strcmp(what, "classes") == 0)) {
            test_classes();
            test_program_limits();
            test_outlined();
        }
        if (all || (what && strcmp(what, "blockmask") == 0))
            test_block_masks();
        if (all)
            break;
    }
    fwd_cache_clear();
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return check_report();
}
