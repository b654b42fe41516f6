/*
 * test_bias_program.c -- the built-in bias is a program over a side tensor
 * (docs/ir.md "bias"): `bias = add` and
 *
 *     score_mod = expr(score + B[b, h, q, k])      (b -> 0, h -> 0 where the
 *                                                   bias broadcasts there)
 *
 * over a side tensor B holding the bias's values, declared grad, compute
 * the same attention.  On the efficient variant (the one with a bias
 * input) bit for bit: o, lse, dq, dk, dv, and on the cpu dB is dbias (on
 * sim within f32 sums' rounding: its side-gradient stage has dP in
 * another order than the dq kernel that writes dbias).  The flash
 * variant has no bias input; the program gives it one: its results are
 * within the dtype's storage tolerance (doubled: both sides round) of the
 * built-in's.  One generator walks op dtype x B's dtype (the op's, f32,
 * and the other 16-bit float: the values are ones all of them hold) x
 * the four broadcasts x score_mod (none, softcap, whose program reads
 * the biased score) x mask (none, causal, a window), bottom-right over a
 * longer key total, with GQA; and two cases whose score_mod is past the
 * size at which the kernels call it instead of inlining it (the bias
 * leaf's value then an argument of the call).  Inside the kernels the
 * built-in is the score program's bias leaf, mod(score + bias): test_leaf
 * evaluates that program on the host.
 *
 *   test_bias_program [cpu | sim]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ir/dtype.h"
#include "ir/expr.h"
#include "ref.h"
#define BWD_STORAGE_TOLERANCE
#include "bwd_tensors.h"
#include "templates/score.h"
#include "test_main.h"

static aj_ctx *ctx;
static aj_device *dev;
static int cases;

enum { B = 2, HQ = 2, HKV = 1, SQ = 19, SK = 23, D = 32 };

typedef struct bias_case {
    aj_dtype dtype;        /* the op's */
    aj_side_dtype side;    /* B's */
    int bb, bh;            /* the bias's batch and head dims: 1 or full */
    const char *mask, *mod; /* mod: "none" or "softcap" */
} bias_case;

/* Case n of the sweep (n < bias_case_count()). */
static const aj_dtype op_dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};
static const char *const masks[] = {"none", "causal(bottom_right)", "window(6, 2, bottom_right)"};

static int bias_case_count(void)
{
    /* op dtype x B's dtype x broadcast (mask and mod rotate), two called programs */
    return 3 * 3 * 4 + 2;
}

static bias_case bias_case_at(int n)
{
    if (n >= 36)   /* the called ("long") programs */
        return n == 36 ? (bias_case){AJ_DTYPE_BF16, AJ_SIDE_F32, B, 1, masks[1], "long"}
                       : (bias_case){AJ_DTYPE_F16, AJ_SIDE_F16, 1, HQ, masks[0], "long"};
    static const aj_side_dtype others[3][2] = {
        {AJ_SIDE_F32, AJ_SIDE_BF16}, {AJ_SIDE_F32, AJ_SIDE_F16}, {AJ_SIDE_BF16, AJ_SIDE_F16}};
    static const aj_side_dtype own[3] = {AJ_SIDE_F16, AJ_SIDE_BF16, AJ_SIDE_F32};
    int dt = n % 3, sd = n / 3 % 3, bc = n / 9;
    return (bias_case){op_dtypes[dt], sd == 0 ? own[dt] : others[dt][sd - 1],
                       bc & 1 ? 1 : B, bc & 2 ? 1 : HQ, masks[(n + n / 9) % 3],
                       n / 2 % 2 ? "softcap" : "none"};
}

/* A score_mod of about 1200 nodes that reads the score x once: x (1 +
 * 0.02 (tanh(0.01 (q - k)) + ... + tanh(1.7 (q - k)))), past the size at
 * which the kernels call the program (score_emit.c, OUTLINE_NODES). */
static void long_mod(const char *x, char *out, size_t cap)
{
    size_t len = (size_t)snprintf(out, cap, "expr(%s * (1.0 + 0.02 * (0.0", x);
    for (int t = 1; t <= 170 && len < cap; t++)
        len += (size_t)snprintf(out + len, cap - len, " + tanh(%d.0 * 0.01 * (q - k))", t);
    snprintf(out + len, cap - len, ")))");
}

/* The op: the built-in bias (efficient) or the program over B. */
static aj_op *case_op(const bias_case *c, aj_variant variant, bool program, aj_kind kind)
{
    static char spec[8192], mod[8000];
    char load[64], x[96];
    snprintf(load, sizeof load, "B[%s, %s, q, k]", c->bb == 1 ? "0" : "b", c->bh == 1 ? "0" : "h");
    snprintf(x, sizeof x, program ? "(score + %s)" : "score", load);
    bool cap = strcmp(c->mod, "softcap") == 0;
    if (strcmp(c->mod, "long") == 0)
        long_mod(x, mod, sizeof mod);
    else if (program)
        snprintf(mod, sizeof mod, cap ? "expr(5.0 * tanh(%s / 5.0))" : "expr(%s)", x);
    else
        snprintf(mod, sizeof mod, "%s", cap ? "softcap(5.0)" : "none");
    char tail[64];
    if (program)
        snprintf(tail, sizeof tail, "tensors = (B: %s[4] grad)", aj_side_dtype_names[c->side]);
    else
        snprintf(tail, sizeof tail, "bias = add");
    snprintf(spec, sizeof spec, "attention %s %s { dtype = %s head_dim = %d mask = %s "
             "score_mod = %s %s }", kind == AJ_KIND_FORWARD ? "forward" : "backward",
             aj_variant_name(variant), aj_dtype_name(c->dtype), D, c->mask, mod, tail);
    return bwd_parse(ctx, spec, "bias program");
}

/* What a run gives back, as doubles. */
typedef struct results {
    double *o, *lse, *dq, *dk, *dv, *dbias;
} results;

static void results_free(results *r)
{
    free(r->o), free(r->lse), free(r->dq), free(r->dk), free(r->dv), free(r->dbias);
}

/* The inputs every run of a case shares. */
typedef struct inputs {
    tensor q, k, v, dout, bias;   /* bias: the op's dtype, its values B's too */
    void *side;                   /* B: the bias's values in B's dtype */
    int64_t bshape[4];
} inputs;

static void inputs_make(inputs *in, const bias_case *c, uint64_t rng)
{
    const int64_t qs[4] = {B, HQ, SQ, D}, ks[4] = {B, HKV, SK, D};
    tensor_make(&in->q, dev, c->dtype, 4, qs);
    tensor_make(&in->dout, dev, c->dtype, 4, qs);
    tensor_make(&in->k, dev, c->dtype, 4, ks);
    tensor_make(&in->v, dev, c->dtype, 4, ks);
    fill(&in->q, 1.5, &rng);
    fill(&in->k, 1.5, &rng);
    fill(&in->v, 1.0, &rng);
    fill(&in->dout, 1.0, &rng);
    memcpy(in->bshape, (int64_t[4]){c->bb, c->bh, SQ, SK}, sizeof in->bshape);
    tensor_make(&in->bias, dev, c->dtype, 4, in->bshape);
    /* values every dtype in play holds: B's rounding, then the op's */
    for (size_t e = 0; e < in->bias.n; e++) {
        float x = (float)(2.0 * ((double)(splitmix_next(&rng) >> 11) * 0x1p-53) - 1.0);
        if (c->side == AJ_SIDE_F16)
            x = aj_f16_to_f32(aj_f32_to_f16(x));
        else if (c->side == AJ_SIDE_BF16)
            x = aj_bf16_to_f32(aj_f32_to_bf16(x));
        in->bias.ref[e] = x;
    }
    store_rounded(&in->bias);
    size_t elem = (size_t)aj_side_dtype_bytes(c->side);
    void *host = malloc(in->bias.n * elem);
    for (size_t e = 0; e < in->bias.n; e++) {
        float x = (float)in->bias.ref[e];
        if (c->side == AJ_SIDE_F32)
            ((float *)host)[e] = x;
        else
            ((uint16_t *)host)[e] = c->side == AJ_SIDE_F16 ? aj_f32_to_f16(x) : aj_f32_to_bf16(x);
    }
    CHECK(aj_device_alloc(dev, in->bias.n * elem, &in->side) == AJ_OK);
    CHECK(aj_device_copy_to(dev, in->side, host, in->bias.n * elem) == AJ_OK);
    free(host);
}

static void inputs_free(inputs *in)
{
    tensor_release(&in->q), tensor_release(&in->k), tensor_release(&in->v);
    tensor_release(&in->dout), tensor_release(&in->bias);
    aj_device_free(dev, in->side);
}

static double *read_new(const tensor *t)
{
    double *x = calloc(t->n + 1, sizeof *x);
    read_back(t, x);
    return x;
}

/* One forward and backward of the case's op: the built-in's or the
 * program's; false where a kernel did not compile or a call failed
 * (reported). */
static bool run(const bias_case *c, const inputs *in, aj_variant variant, bool program,
                results *r)
{
    memset(r, 0, sizeof *r);
    aj_op *fop = case_op(c, variant, program, AJ_KIND_FORWARD);
    aj_op *bop = case_op(c, variant, program, AJ_KIND_BACKWARD);
    aj_kernel *fk = bwd_compile(ctx, dev, fop, "bias program forward");
    aj_kernel *bk = bwd_compile(ctx, dev, bop, "bias program backward");
    aj_op_destroy(fop), aj_op_destroy(bop);
    bool ok = fk && bk;
    const int64_t qs[4] = {B, HQ, SQ, D}, ks[4] = {B, HKV, SK, D}, ls[3] = {B, HQ, SQ};
    tensor o, lse, dq, dk, dv, dbias;
    tensor_make(&o, dev, c->dtype, 4, qs);
    tensor_make(&dq, dev, c->dtype, 4, qs);
    tensor_make(&dk, dev, c->dtype, 4, ks);
    tensor_make(&dv, dev, c->dtype, 4, ks);
    tensor_make(&lse, dev, AJ_DTYPE_F32, 3, ls);
    tensor_make(&dbias, dev, AJ_DTYPE_F32, 4, in->bshape);
    poison(&dbias);   /* every element must be written */
    aj_side_tensor side = {"B", in->side, c->side, 4, {0}, {0}};
    aj_side_tensor dside = {"B", dbias.t.data, AJ_SIDE_F32, 4, {0}, {0}};
    memcpy(side.shape, in->bshape, sizeof side.shape);
    memcpy(side.strides, in->bias.t.strides, sizeof side.strides);
    memcpy(dside.shape, in->bshape, sizeof dside.shape);
    memcpy(dside.strides, in->bias.t.strides, sizeof dside.strides);

    aj_fwd_args fa = AJ_FWD_ARGS_INIT;
    fa.q = in->q.t, fa.k = in->k.t, fa.v = in->v.t, fa.o = o.t, fa.lse = lse.t;
    fa.sk_total = SK + 4;   /* bottom-right over a longer key total */
    aj_bwd_args ba = AJ_BWD_ARGS_INIT;
    ba.q = in->q.t, ba.k = in->k.t, ba.v = in->v.t, ba.o = o.t, ba.lse = lse.t;
    ba.do_ = in->dout.t, ba.dq = dq.t, ba.dk = dk.t, ba.dv = dv.t;
    ba.sk_total = fa.sk_total;
    if (program) {
        fa.side = ba.side = &side;
        fa.num_side = ba.num_side = 1;
        ba.dside = &dside;
        ba.num_dside = 1;
    } else {
        fa.bias = ba.bias = in->bias.t;
        ba.dbias = dbias.t;
    }
    if (ok) {
        CHECK_STATUS(ctx, aj_forward(ctx, dev, fk, &fa), AJ_OK);
        CHECK_STATUS(ctx, aj_backward(ctx, dev, bk, &ba), AJ_OK);
        *r = (results){read_new(&o), read_new(&lse), read_new(&dq), read_new(&dk),
                       read_new(&dv), read_new(&dbias)};
    }
    tensor *all[] = {&o, &lse, &dq, &dk, &dv, &dbias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tensor_release(all[i]);
    aj_kernel_destroy(fk), aj_kernel_destroy(bk);
    return ok;
}

/* How a program's result must match the built-in's. */
typedef enum match {
    BITWISE,
    /* f32 sums of the same terms in another order: within 2^-19 of the
     * largest (sim's dB: the side-gradient stage recomputes dP = dO . v
     * in its own loop, where the efficient dq kernel has it from its) */
    F32_SUMS,
    STORAGE   /* another kernel: within twice the dtype's storage tolerance */
} match;

static void compare(const char *label, const char *name, const double *got, const double *want,
                    size_t n, aj_dtype dtype, match how)
{
    size_t bad = 0;
    double mx = 0, diff = 0;
    for (size_t e = 0; e < n; e++) {
        bad += memcmp(&got[e], &want[e], sizeof got[e]) != 0;
        mx = fmax(mx, fabs(want[e]));
        diff = fmax(diff, fabs(got[e] - want[e]));
        if (got[e] != got[e])
            diff = INFINITY;
    }
    if (how == BITWISE)
        CHECK_MSG(bad == 0, "%s: %s: %zu of %zu elements differ from the built-in bias's "
                  "(by %.3g of %.3g)", label, name, bad, n, diff, mx);
    else if (how == F32_SUMS)
        CHECK_MSG(diff <= 0x1p-19 * mx, "%s: %s: %.3g from the built-in bias's, of %.3g", label,
                  name, diff, mx);
    else
        CHECK_MSG(norm_error(got, want, n, dtype) <= 2.0, "%s: %s: %.3g x the tolerance from "
                  "the built-in bias's", label, name, norm_error(got, want, n, dtype));
}

static void run_case(const bias_case *c)
{
    char label[160];
    snprintf(label, sizeof label, "%s, B: %s[%d, %d, %d, %d], mask %s, score_mod %s",
             aj_dtype_name(c->dtype), aj_side_dtype_names[c->side], c->bb, c->bh, SQ, SK,
             c->mask, c->mod);
    inputs in;
    inputs_make(&in, c, 41 + (uint64_t)cases);
    results want, got;
    const bool cpu = aj_device_target(dev) == AJ_TARGET_CPU;
    const bool simt_f32 = c->dtype == AJ_DTYPE_F32 && !cpu;
    if (run(c, &in, AJ_VARIANT_EFFICIENT, false, &want)) {
        for (int v = 0; v < (simt_f32 ? 1 : 2); v++) {   /* sim's flash: 16-bit only */
            aj_variant variant = v ? AJ_VARIANT_FLASH : AJ_VARIANT_EFFICIENT;
            if (!run(c, &in, variant, true, &got))
                continue;
            char where[200];
            snprintf(where, sizeof where, "%s, %s", label, aj_variant_name(variant));
            const size_t nq = (size_t)B * HQ * SQ * D, nk = (size_t)B * HKV * SK * D;
            const size_t nl = (size_t)B * HQ * SQ;
            const match same = v ? STORAGE : BITWISE;
            compare(where, "o", got.o, want.o, nq, c->dtype, same);
            compare(where, "lse", got.lse, want.lse, nl, AJ_DTYPE_F32, same);
            compare(where, "dq", got.dq, want.dq, nq, c->dtype, same);
            compare(where, "dk", got.dk, want.dk, nk, c->dtype, same);
            compare(where, "dv", got.dv, want.dv, nk, c->dtype, same);
            compare(where, "dB / dbias", got.dbias, want.dbias, in.bias.n, c->dtype,
                    v ? STORAGE : cpu ? BITWISE : F32_SUMS);
            results_free(&got);
            cases++;
        }
        results_free(&want);
    }
    inputs_free(&in);
}

static void test_sweep(void)
{
    for (int n = 0; n < bias_case_count(); n++) {
        bias_case c = bias_case_at(n);
        run_case(&c);
    }
}

/* The program itself: an op with `bias = add` has the score_mod
 * mod(score + bias) over the programs' bias leaf, its derivative by the
 * score the mod's at score + bias (host evaluation against the formula);
 * an op without one has no leaf; and no text reads `bias`. */
static void test_leaf(void)
{
    static const char *const specs[2] = {
        "attention backward efficient { dtype = f32 head_dim = 32 bias = add "
        "score_mod = softcap(5.0) }",
        "attention backward efficient { dtype = f32 head_dim = 32 score_mod = softcap(5.0) }"};
    for (int with = 0; with < 2; with++) {
        aj_op *op = bwd_parse(ctx, specs[with], "bias leaf");
        aj_score_prog prog;
        if (!op || aj_score_prog_init(ctx, op, &prog) != AJ_OK) {
            CHECK_MSG(0, "%s: %s", specs[with], aj_last_error(ctx));
            aj_op_destroy(op);
            continue;
        }
        CHECK_MSG((prog.biased != AJ_EXPR_NONE) == (with == 0), "%s: biased %d", specs[with],
                  (int)prog.biased);
        for (int n = 0; n < 9; n++) {
            double score = -7.0 + 1.75 * n, bias = with == 0 ? 2.5 - 0.625 * n : 0.0;
            aj_expr_env env = {.score = score, .bias = bias};
            double t = (double)(float)((float)score + (float)bias);
            double want = 5.0 * tanh(t / 5.0), dwant = 1.0 - tanh(t / 5.0) * tanh(t / 5.0);
            double got = aj_expr_eval_f64(&prog.e, prog.mod, &env);
            double dgot = aj_expr_eval_f64(&prog.e, prog.dmod, &env);
            CHECK_MSG(fabs(got - want) <= 1e-5 && fabs(dgot - dwant) <= 1e-5,
                      "%s at score %g, bias %g: mod %.9g (want %.9g), dmod %.9g (want %.9g)",
                      specs[with], score, bias, got, want, dgot, dwant);
        }
        aj_score_prog_free(&prog);
        aj_op_destroy(op);
    }
    aj_op *op = NULL;
    const char *text = "attention forward efficient { dtype = f32 head_dim = 32 bias = add "
                       "score_mod = expr(score + bias) }";
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "t.aj", &op), AJ_ERR_PARSE);
    CHECK_ERROR(ctx, "unknown name 'bias' (variables: b, h, q, k, sq, sk, score)");
    aj_op_destroy(op);
    /* a score_mod as deep as the language allows, one deeper with the
     * bias: refused with a message, not built past the limit */
    static char deep[8192];
    int len = snprintf(deep, sizeof deep, "attention forward efficient { dtype = f32 "
                       "head_dim = 32 bias = add score_mod = expr(");
    for (int n = 1; n < AJ_EXPR_DEPTH_MAX; n++)
        len += snprintf(deep + len, sizeof deep - (size_t)len, "tanh(");
    len += snprintf(deep + len, sizeof deep - (size_t)len, "score");
    for (int n = 1; n < AJ_EXPR_DEPTH_MAX; n++)
        len += snprintf(deep + len, sizeof deep - (size_t)len, ")");
    snprintf(deep + len, sizeof deep - (size_t)len, ") }");
    op = bwd_parse(ctx, deep, "deep score_mod");
    aj_score_prog prog;
    if (op) {
        CHECK_STATUS(ctx, aj_score_prog_init(ctx, op, &prog), AJ_ERR_UNSUPPORTED);
        CHECK_ERROR(ctx, "the score_mod with the bias is deeper than 256");
    }
    aj_op_destroy(op);
}

static void (*const tests[])(void) = {test_leaf, test_sweep, NULL};

int main(int argc, char **argv)
{
    const test_main_args m = {AJ_DEVICE_SIM, &ctx, &dev, tests, &cases, NULL};
    return test_main(argc, argv, &m);
}
