/*
 * test_score.c -- score programs (templates/score.h) against the float64
 * reference, whose interpreter evaluates the same parsed expressions:
 *
 *   examples   every spec of examples/specs/scores (document mask, prefix LM,
 *              sliding window with sinks, chunked local, T5 relative bias,
 *              ALiBi and softcap as expressions) forward on the device
 *   random     well-typed random masks and score_mods over b, h, q, k,
 *              sq, sk, score and two small side tensors (loads in and out
 *              of range); a failing one shrinks to a small spec
 *   builtins   causal / window / softcap / alibi written as expressions
 *              give the built-ins' results (the same programs)
 *   classes    tile classes (host interval arithmetic) against a
 *              position-by-position count: never wrong, and exact for the
 *              band masks and the chunked mask
 *
 * test_score DEVICE [VARIANT] [examples | random N | builtins | classes]...:
 * DEVICE is sim or cpu, VARIANT efficient (the default) or flash (whose
 * kernels take f16 / bf16 only: the random and builtin cases run in f16
 * there); with no section named, all of them.
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

/* The most precise dtype the variant runs: the cases' dtype where the
 * spec does not fix one. */
static aj_dtype case_dtype(void)
{
    return strcmp(variant_name, "flash") == 0 ? AJ_DTYPE_F16 : AJ_DTYPE_F32;
}

/* One forward case from spec fields; returns whether it passed. */
static bool run_fields(const char *label, aj_dtype dtype, int d, const char *tensors,
                       const char *mask, const char *mod, int B, int H, int S, uint64_t seed,
                       bool report)
{
    char spec[4096];
    snprintf(spec, sizeof spec, "attention forward %s { dtype = %s head_dim = %d %s%s "
             "mask = %s score_mod = %s }", variant_name, aj_dtype_name(dtype), d,
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
                                                                         : AJ_VARIANT_EFFICIENT};
    fwd_result r = fwd_run_case_ext(ctx, dev, &c, &x, &run);
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

static const char *const random_tensors = "(ti: i32[2], tf: f32[1])";

/* Random case t->index with the tree at root; whether it passed. */
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

static void test_random(int count)
{
    static rx_tree t;
    int failed = rx_cases(&t, count, 0x5eed0000u, random_fails, random_failed, NULL);
    printf("random: %d expressions, %s forward in %s on %s, %d failed\n", count, variant_name,
           aj_dtype_name(case_dtype()), aj_target_name(aj_device_target(dev)), failed);
}

/* ---------------------------------------------------------------- builtins */

/* The built-ins and the expressions aj_expr_builtin_text says they are:
 * the same program, so the same outputs, bit for bit. */
static void test_builtins(void)
{
    static const char *const pairs[][4] = {
        {"causal(top_left)", "none", "expr(k <= q)", "none"},
        {"causal(bottom_right)", "none", "expr(k <= q + (sk - sq))", "none"},
        {"window(9, 2, bottom_right)", "none", "expr(q + (sk - sq) - 9 <= k && k <= q + (sk - sq) + 2)", "none"},
        {"causal(top_left)", "softcap(7.0)", "causal(top_left)", "expr(7.0 * tanh(score / 7.0))"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const aj_dtype dt = case_dtype();
        const size_t elem = dt == AJ_DTYPE_F32 ? 4 : 2;
        void *o[2];
        for (int w = 0; w < 2; w++) {
            char spec[1024];
            snprintf(spec, sizeof spec, "attention forward %s { dtype = %s head_dim = 32 "
                     "mask = %s score_mod = %s }", variant_name, aj_dtype_name(dt),
                     pairs[i][2 * w], pairs[i][2 * w + 1]);
            aj_op *op = NULL;
            aj_kernel *k = NULL;
            CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), "builtin", &op), AJ_OK);
            aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
            opt.target = aj_device_target(dev);
            CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
            aj_op_destroy(op);
            enum { B = 1, H = 2, S = 37, D = 32 };
            size_t n = (size_t)B * H * S * D;
            float *q = malloc(n * 4), *kk = malloc(n * 4), *v = malloc(n * 4);
            void *staged = malloc(n * elem);
            o[w] = calloc(n, elem);
            float *lse = calloc((size_t)B * H * S, 4);
            uint64_t rng = 3;
            for (size_t e = 0; e < n; e++) {
                q[e] = (float)((double)(score_rand(&rng) >> 11) / 9007199254740992.0 - 0.5);
                kk[e] = (float)((double)(score_rand(&rng) >> 11) / 9007199254740992.0 - 0.5);
                v[e] = (float)((double)(score_rand(&rng) >> 11) / 9007199254740992.0 - 0.5);
            }
            void *dq, *dk, *dv, *dout, *dlse;
            aj_device_alloc(dev, n * elem, &dq);
            aj_device_alloc(dev, n * elem, &dk);
            aj_device_alloc(dev, n * elem, &dv);
            aj_device_alloc(dev, n * elem, &dout);
            aj_device_alloc(dev, (size_t)B * H * S * 4, &dlse);
            const float *host[3] = {q, kk, v};
            void *dev_in[3] = {dq, dk, dv};
            for (int t = 0; t < 3; t++) {
                aj_convert(host[t], AJ_DTYPE_F32, staged, dt, n);
                aj_device_copy_to(dev, dev_in[t], staged, n * elem);
            }
            aj_fwd_args a = AJ_FWD_ARGS_INIT;
            const int64_t shape[4] = {B, H, S, D}, strides[4] = {H * S * D, S * D, D, 1};
            aj_tensor *ts[4] = {&a.q, &a.k, &a.v, &a.o};
            void *ptrs[4] = {dq, dk, dv, dout};
            for (int t = 0; t < 4; t++) {
                *ts[t] = (aj_tensor){ptrs[t], dt, 4, {0}, {0}};
                memcpy(ts[t]->shape, shape, sizeof shape);
                memcpy(ts[t]->strides, strides, sizeof strides);
            }
            a.lse = (aj_tensor){dlse, AJ_DTYPE_F32, 3, {B, H, S}, {H * S, S, 1}};
            a.sk_total = S + 5;   /* bottom_right over a longer key total */
            a.kv_offset = 5;
            CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
            aj_device_copy_from(dev, o[w], dout, n * elem);
            void *all[5] = {dq, dk, dv, dout, dlse};
            for (int t = 0; t < 5; t++)
                aj_device_free(dev, all[t]);
            free(q), free(kk), free(v), free(lse), free(staged);
            aj_kernel_destroy(k);
        }
        size_t n = (size_t)2 * 37 * 32;
        CHECK_MSG(memcmp(o[0], o[1], n * elem) == 0, "%s / %s differs from %s / %s", pairs[i][0],
                  pairs[i][1], pairs[i][2], pairs[i][3]);
        free(o[0]), free(o[1]);
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
        static aj_score_prog prog;
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
        aj_op_destroy(op);
    }
    printf("classes: skip / partial / full %d / %d / %d (position by position %d / %d / %d)\n",
           counts[0], counts[1], counts[2], brute[0], brute[1], brute[2]);
}

int main(int argc, char **argv)
{
    const char *device = argc > 1 ? argv[1] : "sim";
    int first = 2;   /* the first section argument */
    if (argc > 2 && (strcmp(argv[2], "flash") == 0 || strcmp(argv[2], "efficient") == 0))
        variant_name = argv[first++];
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    CHECK_STATUS(ctx, aj_device_open(ctx, strcmp(device, "cpu") == 0 ? AJ_DEVICE_CPU
                                                                       : AJ_DEVICE_SIM, 0, &dev),
                 AJ_OK);
    if (!dev)
        return check_report();
    const char *examples = score_examples_dir();
    bool all = argc <= first;
    for (int i = first; i <= argc; i++) {
        const char *what = i < argc ? argv[i] : NULL;
        if (all || (what && strcmp(what, "examples") == 0))
            test_examples(examples);
        if (all || (what && strcmp(what, "random") == 0))
            test_random(what && i + 1 < argc ? atoi(argv[++i]) : 200);
        if (all || (what && strcmp(what, "builtins") == 0))
            test_builtins();
        if (all || (what && strcmp(what, "classes") == 0))
            test_classes();
        if (all)
            break;
    }
    fwd_cache_clear();
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return check_report();
}
