/*
 * test_sinks.c -- learned attention sinks (docs/ir.md "Sinks") against the
 * float64 reference with the sinks added (ref.h): the forward's O and LSE
 * and the backward's dQ, dK, dV and dSinks, on the device the argument
 * names (sim by default; ctest runs it on sim and cpu).
 *
 * One generator of cases walks variant x dtype x mask x layout (padded,
 * varlen) x GQA x dropout x score_mod (none, softcap, an expression over
 * h) x head dim, with sink logits that dominate some
 * heads (+6), vanish in others (-inf: the op without a sink) and sit
 * among the scores elsewhere, and lengths that leave rows with no visible
 * key (their O is 0 and their LSE the sink).  dSinks is also checked to
 * be bitwise the same on a second run, and against a central finite
 * difference of the loss sum(O * dO) in float64 (the reference's own
 * derivative is not the only witness).
 *
 *   test_sinks [cpu | sim | cuda]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"
#define BWD_STORAGE_TOLERANCE
#include "bwd_tensors.h"
#include "test_main.h"

static aj_ctx *ctx;
static aj_device *dev;
static int cases;

/* One case of the generator. */
typedef struct sink_case {
    aj_variant variant;
    aj_dtype dtype;
    const char *mask;          /* IR text */
    int d, b, hq, hkv, sq, sk;
    const char *score_mod;     /* IR text; NULL: none */
    double dropout;
    const int *lens_q, *lens_k;  /* varlen when set: b lengths each */
} sink_case;

static const char *const masks[] = {"none", "causal(bottom_right)", "window(5, 0, bottom_right)",
                                    "expr(k <= q && k % 3 != 1)"};
static const int dims[] = {32, 64, 96, 128};
static const char *const mods[] = {"none", "softcap(20.0)", "expr(score - 0.125 * h)"};
static const int varlen_q[] = {7, 0, 19}, varlen_k[] = {7, 12, 25};

static void case_label(const sink_case *c, char *out, size_t cap)
{
    snprintf(out, cap, "%s %s d%d %s %s hq%d/%d%s%s", aj_variant_name(c->variant),
             aj_dtype_name(c->dtype), c->d, c->mask, c->score_mod ? c->score_mod : "none",
             c->hq, c->hkv, c->lens_q ? " varlen" : "", c->dropout > 0 ? " dropout" : "");
}

/* The op text of a case, forward or backward. */
static aj_op *case_op(const sink_case *c, aj_kind kind, const char *label)
{
    char spec[1024];
    snprintf(spec, sizeof spec,
             "attention %s %s {\n  dtype = %s\n  head_dim = %d\n  tensors = (snk: f32[1])\n"
             "  sinks = snk\n  mask = %s\n  score_mod = %s\n  dropout = %.17g\n"
             "  layout = %s\n}\n",
             kind == AJ_KIND_FORWARD ? "forward" : "backward",
             c->variant == AJ_VARIANT_EFFICIENT ? "efficient" : "flash",
             aj_dtype_name(c->dtype), c->d, c->mask, c->score_mod ? c->score_mod : "none",
             c->dropout, c->lens_q ? "varlen" : "padded");
    return bwd_parse(ctx, spec, label);
}

static aj_kernel *compile(const aj_op *op, const char *label)
{
    return bwd_compile(ctx, dev, op, label);
}

/* The case's tensors: q k v o dout lse, the gradients, the sinks. */
typedef struct sink_io {
    tensor q, k, v, o, dout, lse, dq, dk, dv, dsinks, sinks;
    int32_t cu_q[4], cu_k[4];
    int32_t *dcu_q, *dcu_k;
} sink_io;

static void io_make(sink_io *x, const sink_case *c)
{
    memset(x, 0, sizeof *x);
    if (c->lens_q) {
        for (int i = 0; i < c->b; i++) {
            x->cu_q[i + 1] = x->cu_q[i] + c->lens_q[i];
            x->cu_k[i + 1] = x->cu_k[i] + c->lens_k[i];
        }
        int64_t tq = x->cu_q[c->b], tk = x->cu_k[c->b];
        tensor_make(&x->q, dev, c->dtype, 3, (int64_t[]){tq, c->hq, c->d});
        tensor_make(&x->k, dev, c->dtype, 3, (int64_t[]){tk, c->hkv, c->d});
        tensor_make(&x->v, dev, c->dtype, 3, (int64_t[]){tk, c->hkv, c->d});
        tensor_make(&x->o, dev, c->dtype, 3, (int64_t[]){tq, c->hq, c->d});
        tensor_make(&x->dout, dev, c->dtype, 3, (int64_t[]){tq, c->hq, c->d});
        tensor_make(&x->lse, dev, AJ_DTYPE_F32, 2, (int64_t[]){c->hq, tq});
        tensor_make(&x->dq, dev, c->dtype, 3, (int64_t[]){tq, c->hq, c->d});
        tensor_make(&x->dk, dev, c->dtype, 3, (int64_t[]){tk, c->hkv, c->d});
        tensor_make(&x->dv, dev, c->dtype, 3, (int64_t[]){tk, c->hkv, c->d});
        size_t bytes = sizeof(int32_t) * (size_t)(c->b + 1);
        CHECK(aj_device_alloc(dev, bytes, (void **)&x->dcu_q) == AJ_OK);
        CHECK(aj_device_alloc(dev, bytes, (void **)&x->dcu_k) == AJ_OK);
        CHECK(aj_device_copy_to(dev, x->dcu_q, x->cu_q, bytes) == AJ_OK);
        CHECK(aj_device_copy_to(dev, x->dcu_k, x->cu_k, bytes) == AJ_OK);
    } else {
        int64_t qs[4] = {c->b, c->hq, c->sq, c->d}, ks[4] = {c->b, c->hkv, c->sk, c->d};
        tensor_make(&x->q, dev, c->dtype, 4, qs);
        tensor_make(&x->k, dev, c->dtype, 4, ks);
        tensor_make(&x->v, dev, c->dtype, 4, ks);
        tensor_make(&x->o, dev, c->dtype, 4, qs);
        tensor_make(&x->dout, dev, c->dtype, 4, qs);
        tensor_make(&x->lse, dev, AJ_DTYPE_F32, 3, (int64_t[]){c->b, c->hq, c->sq});
        tensor_make(&x->dq, dev, c->dtype, 4, qs);
        tensor_make(&x->dk, dev, c->dtype, 4, ks);
        tensor_make(&x->dv, dev, c->dtype, 4, ks);
    }
    tensor_make(&x->dsinks, dev, AJ_DTYPE_F32, 1, (int64_t[]){c->hq});
    tensor_make(&x->sinks, dev, AJ_DTYPE_F32, 1, (int64_t[]){c->hq});
}

static void io_release(sink_io *x)
{
    tensor *all[] = {&x->q, &x->k, &x->v, &x->o, &x->dout, &x->lse, &x->dq,
                     &x->dk, &x->dv, &x->dsinks, &x->sinks};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tensor_release(all[i]);
    if (x->dcu_q) {
        aj_device_free(dev, x->dcu_q);
        aj_device_free(dev, x->dcu_k);
    }
}

/* Sink logits by head: one that dominates, one that vanishes (-inf), the
 * rest among the scores. */
static void fill_sinks(tensor *s, int hq, uint64_t *rng)
{
    for (int h = 0; h < hq; h++)
        s->ref[h] = h == 0 ? 6.0 : h == 1 ? -INFINITY
                                          : 2.0 * ((double)(splitmix_next(rng) >> 11) * 0x1p-53) - 1.0;
    store_rounded(s);
}

static ref_problem case_problem(const sink_case *c, const sink_io *x, const aj_op *op,
                                const aj_side_tensor *host_side)
{
    ref_problem p = ref_problem_of(c->b, c->hq, c->hkv, c->sq, c->sk, c->d, c->d);
    ref_mask(c->mask, &p);
    if (strncmp(c->mask, "expr", 4) == 0 || (c->score_mod && strncmp(c->score_mod, "expr", 4) == 0))
        ref_use_expressions(&p, op, host_side, 1);
    if (c->score_mod && strncmp(c->score_mod, "softcap", 7) == 0)
        p.softcap = 20.0;
    if (c->lens_q) {
        p.cu_q = x->cu_q;
        p.cu_k = x->cu_k;
    }
    p.sinks = x->sinks.ref;
    p.dropout_p = c->dropout;
    p.seed = 11;
    p.offset = 3;
    return p;
}

/* The side tensor of the launch: the sinks. */
static aj_side_tensor sinks_side(const sink_io *x)
{
    aj_side_tensor t = {"snk", x->sinks.t.data, AJ_SIDE_F32, 1, {x->sinks.t.shape[0]}, {1}};
    return t;
}

static void set_varlen(const sink_case *c, const sink_io *x, const int32_t **cu_q,
                       const int32_t **cu_k, int32_t *batch, int32_t *mq, int32_t *mk)
{
    if (!c->lens_q)
        return;
    *cu_q = x->dcu_q;
    *cu_k = x->dcu_k;
    *batch = c->b;
    for (int i = 0; i < c->b; i++) {
        *mq = c->lens_q[i] > *mq ? c->lens_q[i] : *mq;
        *mk = c->lens_k[i] > *mk ? c->lens_k[i] : *mk;
    }
}

/* The loss sum(O dO) of the reference forward with sinks[h] moved by
 * delta, for the finite difference. */
static double ref_loss(const ref_problem *p0, const sink_io *x, int h, double delta)
{
    double *sinks = malloc(sizeof(double) * (size_t)p0->Hq);
    memcpy(sinks, x->sinks.ref, sizeof(double) * (size_t)p0->Hq);
    sinks[h] += delta;
    ref_problem p = *p0;
    p.sinks = sinks;
    double *o = calloc(x->o.n + 1, sizeof(double));
    ref_forward(&p, x->q.ref, x->k.ref, x->v.ref, o, NULL);
    double loss = 0;
    for (size_t i = 0; i < x->o.n; i++)
        loss += o[i] * x->dout.ref[i];
    free(o);
    free(sinks);
    return loss;
}

static void check_error(const char *label, const char *what, const tensor *t, const double *want,
                        aj_dtype dtype)
{
    double *got = calloc(t->n + 1, sizeof(double));
    read_back(t, got);
    double err = norm_error(got, want, t->n, dtype);
    CHECK_MSG(err <= 1.0, "%s: %s error %.3g of the tolerance", label, what, err);
    free(got);
}

static void run_case(const sink_case *c)
{
    char label[160];
    case_label(c, label, sizeof label);
    aj_op *fop = case_op(c, AJ_KIND_FORWARD, label), *bop = case_op(c, AJ_KIND_BACKWARD, label);
    aj_kernel *fk = compile(fop, label), *bk = compile(bop, label);
    if (!fk || !bk)
        goto out_ops;
    sink_io x;
    io_make(&x, c);
    uint64_t rng = 1234 + (uint64_t)cases;
    fill(&x.q, 1.5, &rng);
    fill(&x.k, 1.5, &rng);
    fill(&x.v, 1.0, &rng);
    fill(&x.dout, 1.0, &rng);
    fill_sinks(&x.sinks, c->hq, &rng);
    float host_sinks[64];
    for (int h = 0; h < c->hq; h++)
        host_sinks[h] = (float)x.sinks.ref[h];
    const aj_side_tensor host_side = {"snk", host_sinks, AJ_SIDE_F32, 1, {c->hq}, {1}};
    ref_problem p = case_problem(c, &x, fop, &host_side);
    double *o_ref = calloc(x.o.n + 1, sizeof(double));
    double *lse_ref = calloc(x.lse.n + 1, sizeof(double));
    ref_forward(&p, x.q.ref, x.k.ref, x.v.ref, o_ref, lse_ref);
    const aj_side_tensor side = sinks_side(&x);

    /* forward */
    aj_fwd_args fa = AJ_FWD_ARGS_INIT;
    fa.q = x.q.t, fa.k = x.k.t, fa.v = x.v.t, fa.o = x.o.t, fa.lse = x.lse.t;
    fa.seed = 11, fa.offset = 3;
    fa.side = &side, fa.num_side = 1;
    set_varlen(c, &x, &fa.cu_seqlens_q, &fa.cu_seqlens_k, &fa.batch, &fa.max_seqlen_q,
               &fa.max_seqlen_k);
    poison(&x.o);
    CHECK_MSG(aj_forward(ctx, dev, fk, &fa) == AJ_OK, "%s: %s", label, aj_last_error(ctx));
    check_error(label, "o", &x.o, o_ref, c->dtype);
    check_error(label, "lse", &x.lse, lse_ref, AJ_DTYPE_F16);

    /* backward from the reference's O (rounded) and LSE */
    memcpy(x.o.ref, o_ref, x.o.n * sizeof(double));
    store_rounded(&x.o);
    memcpy(x.lse.ref, lse_ref, x.lse.n * sizeof(double));
    store_rounded(&x.lse);
    memcpy(lse_ref, x.lse.ref, x.lse.n * sizeof(double));
    double *want[4] = {calloc(x.q.n + 1, 8), calloc(x.k.n + 1, 8), calloc(x.v.n + 1, 8),
                       calloc((size_t)c->hq + 1, 8)};
    ref_backward(&p, x.q.ref, x.k.ref, x.v.ref, x.o.ref, x.lse.ref, x.dout.ref, want[0],
                 want[1], want[2], NULL);
    ref_sinks_grad(&p, x.o.ref, x.lse.ref, x.dout.ref, want[3]);
    aj_bwd_args ba = AJ_BWD_ARGS_INIT;
    ba.q = x.q.t, ba.k = x.k.t, ba.v = x.v.t, ba.o = x.o.t, ba.lse = x.lse.t;
    ba.do_ = x.dout.t, ba.dq = x.dq.t, ba.dk = x.dk.t, ba.dv = x.dv.t;
    ba.seed = 11, ba.offset = 3;
    ba.side = &side, ba.num_side = 1;
    ba.dsinks = x.dsinks.t;
    set_varlen(c, &x, &ba.cu_seqlens_q, &ba.cu_seqlens_k, &ba.batch, &ba.max_seqlen_q,
               &ba.max_seqlen_k);
    poison(&x.dsinks);
    CHECK_MSG(aj_backward(ctx, dev, bk, &ba) == AJ_OK, "%s: %s", label, aj_last_error(ctx));
    check_error(label, "dq", &x.dq, want[0], c->dtype);
    check_error(label, "dk", &x.dk, want[1], c->dtype);
    check_error(label, "dv", &x.dv, want[2], c->dtype);
    check_error(label, "dsinks", &x.dsinks, want[3], AJ_DTYPE_F16);

    /* dsinks: the same bits again; the reference's derivative agrees with a
     * finite difference of its own loss (dropout off: a smooth loss) */
    float first[64], again[64];
    CHECK(aj_device_copy_from(dev, first, x.dsinks.t.data, 4 * (size_t)c->hq) == AJ_OK);
    poison(&x.dsinks);
    CHECK(aj_backward(ctx, dev, bk, &ba) == AJ_OK);
    CHECK(aj_device_copy_from(dev, again, x.dsinks.t.data, 4 * (size_t)c->hq) == AJ_OK);
    CHECK_MSG(memcmp(first, again, 4 * (size_t)c->hq) == 0, "%s: dsinks differs between runs",
              label);
    if (c->dropout == 0) {
        double exact[64];   /* from the unrounded O */
        ref_sinks_grad(&p, o_ref, lse_ref, x.dout.ref, exact);
        for (int h = 2; h < c->hq; h++) {
            double fd = (ref_loss(&p, &x, h, 1e-5) - ref_loss(&p, &x, h, -1e-5)) / 2e-5;
            CHECK_MSG(fabs(fd - exact[h]) <= 1e-6 * (1 + fabs(fd)),
                      "%s: dsinks[%d] %.9g, finite difference %.9g", label, h, exact[h], fd);
        }
    }
    for (int t = 0; t < 4; t++)
        free(want[t]);
    free(o_ref);
    free(lse_ref);
    io_release(&x);
    cases++;
out_ops:
    aj_kernel_destroy(fk);
    aj_kernel_destroy(bk);
    aj_op_destroy(fop);
    aj_op_destroy(bop);
}

/* Every variant x dtype x mask x layout, the GQA ratio, dropout and head
 * dim cycling through their values so each meets every mask. */
static void test_sweep(void)
{
    const int cpu = aj_device_target(dev) == AJ_TARGET_CPU;
    const aj_dtype dtypes[3] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};
    int n = 0;
    for (int var = 0; var < 2; var++)
        for (int dt = 0; dt < (cpu ? 3 : 2); dt++)
            for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++)
                for (int varlen = 0; varlen < 2; varlen++, n++) {
                    /* the GPU templates' efficient variant is padded only */
                    if ((varlen && var && !cpu) || !check_sampled())
                        continue;
                    sink_case c = {
                        .variant = var ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH,
                        .dtype = dtypes[dt],
                        .mask = masks[m],
                        .d = dims[n % 4],
                        .b = varlen ? 3 : 2,
                        .hq = 4,
                        .hkv = n % 2 ? 2 : 4,
                        .sq = 13 + n % 3 * 8,
                        .sk = 29 - n % 2 * 14,
                        .dropout = n % 3 == 2 ? 0.25 : 0,
                        .score_mod = mods[n / 2 % 3],
                    };
                    if (varlen) {
                        c.lens_q = varlen_q;
                        c.lens_k = varlen_k;
                    }
                    run_case(&c);
                }
}

/* Wrong sinks are refused: a tensor of the wrong shape at the launch, a
 * sinks name that is not declared, the wrong dtype or rank. */
static void test_errors(void)
{
    static const char *const bad[] = {
        "attention forward flash { dtype = f16\n head_dim = 32\n sinks = s\n}\n",
        "attention forward flash { dtype = f16\n head_dim = 32\n tensors = (s: i32[1])\n"
        " sinks = s\n}\n",
        "attention forward flash { dtype = f16\n head_dim = 32\n tensors = (s: f32[2])\n"
        " sinks = s\n}\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        aj_op *op = NULL;
        CHECK_STATUS(ctx, aj_op_parse(ctx, bad[i], strlen(bad[i]), "bad", &op), AJ_ERR_VERIFY);
        CHECK(strstr(aj_last_error(ctx), "sinks") != NULL);
        aj_op_destroy(op);
    }
    sink_case c = {.variant = AJ_VARIANT_FLASH, .dtype = AJ_DTYPE_F16, .mask = "none", .d = 32,
                   .b = 1, .hq = 4, .hkv = 4, .sq = 8, .sk = 8};
    aj_op *fop = case_op(&c, AJ_KIND_FORWARD, "errors");
    aj_kernel *fk = compile(fop, "errors");
    sink_io x;
    io_make(&x, &c);
    aj_side_tensor side = sinks_side(&x);
    side.shape[0] = 3;   /* one short of the heads */
    aj_fwd_args fa = AJ_FWD_ARGS_INIT;
    fa.q = x.q.t, fa.k = x.k.t, fa.v = x.v.t, fa.o = x.o.t, fa.lse = x.lse.t;
    fa.side = &side, fa.num_side = 1;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, fk, &fa), AJ_ERR_INVALID_ARG);
    CHECK(strstr(aj_last_error(ctx), "sinks tensor 'snk' has 3 logits") != NULL);
    /* the builder's setter: an undeclared name, then the round trip */
    aj_op *op = NULL;
    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_sinks(op, "snk"), AJ_ERR_VERIFY);
    aj_op_destroy(op);
    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_declare_tensor(op, "snk", AJ_SIDE_F32, 1) == AJ_OK);
    CHECK(aj_op_set_sinks(op, "snk") == AJ_OK);
    int32_t idx = -2;
    CHECK(aj_op_get_sinks(op, &idx) == AJ_OK && idx == 0);
    char *text = NULL;
    CHECK(aj_op_print(op, &text) == AJ_OK && strstr(text, "sinks = snk") != NULL);
    aj_free(text);
    aj_op_destroy(op);
    io_release(&x);
    aj_kernel_destroy(fk);
    aj_op_destroy(fop);
}

/* An accumulate chain over three key blocks, visited out of order (the
 * middle, the first, the last) from lse = -inf: the call with kv_offset 0
 * counts the sink, the others do not, and the chain's o_acc and lse are
 * the one-call result with sinks.  Both variants, causal (bottom_right,
 * the totals given) and none, f16 (and f32 on the cpu). */
static void test_accumulate(void)
{
    const int cpu = aj_device_target(dev) == AJ_TARGET_CPU;
    static const int starts[4] = {0, 10, 17, 29}, order[3] = {1, 0, 2};
    for (int var = 0; var < 2; var++)
        for (int m = 0; m < 2; m++)
            for (int dt = 0; dt < (cpu ? 2 : 1); dt++) {
                sink_case c = {.variant = var ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH,
                               .dtype = dt ? AJ_DTYPE_F32 : AJ_DTYPE_F16,
                               .mask = m ? "causal(bottom_right)" : "none",
                               .d = 64, .b = 2, .hq = 4, .hkv = 2, .sq = 13, .sk = 29};
                char label[160], spec[1024];
                case_label(&c, label, sizeof label);
                snprintf(spec, sizeof spec,
                         "attention forward %s {\n  dtype = %s\n  head_dim = 64\n"
                         "  tensors = (snk: f32[1])\n  sinks = snk\n  mask = %s\n"
                         "  accumulate = true\n}\n", var ? "efficient" : "flash",
                         aj_dtype_name(c.dtype), c.mask);
                aj_op *op = NULL;
                CHECK_MSG(aj_op_parse(ctx, spec, strlen(spec), label, &op) == AJ_OK, "%s: %s",
                          label, aj_last_error(ctx));
                aj_kernel *kern = compile(op, label);
                if (!kern) {
                    aj_op_destroy(op);
                    continue;
                }
                sink_io x;
                io_make(&x, &c);
                uint64_t rng = 99;
                fill(&x.q, 1.5, &rng);
                fill(&x.k, 1.5, &rng);
                fill(&x.v, 1.0, &rng);
                fill_sinks(&x.sinks, c.hq, &rng);
                ref_problem p = case_problem(&c, &x, op, NULL);
                double *o_ref = calloc(x.o.n + 1, sizeof(double));
                double *lse_ref = calloc(x.lse.n + 1, sizeof(double));
                ref_forward(&p, x.q.ref, x.k.ref, x.v.ref, o_ref, lse_ref);
                tensor acc;
                tensor_make(&acc, dev, AJ_DTYPE_F32, 4, (int64_t[]){c.b, c.hq, c.sq, c.d});
                for (size_t i = 0; i < acc.n; i++)
                    acc.ref[i] = 0;
                store_rounded(&acc);
                for (size_t i = 0; i < x.lse.n; i++)
                    x.lse.ref[i] = -INFINITY;
                store_rounded(&x.lse);
                const aj_side_tensor side = sinks_side(&x);
                for (int n = 0; n < 3; n++) {
                    int blk = order[n], j0 = starts[blk], len = starts[blk + 1] - j0;
                    aj_fwd_args fa = AJ_FWD_ARGS_INIT;
                    fa.q = x.q.t, fa.k = x.k.t, fa.v = x.v.t, fa.lse = x.lse.t, fa.o_acc = acc.t;
                    size_t es = (size_t)aj_dtype_size(c.dtype);
                    fa.k.data = (char *)x.k.t.data + (size_t)j0 * (size_t)x.k.t.strides[2] * es;
                    fa.v.data = (char *)x.v.t.data + (size_t)j0 * (size_t)x.v.t.strides[2] * es;
                    fa.k.shape[2] = fa.v.shape[2] = len;
                    fa.kv_offset = j0;
                    fa.sq_total = c.sq;
                    fa.sk_total = c.sk;
                    fa.side = &side, fa.num_side = 1;
                    CHECK_MSG(aj_forward(ctx, dev, kern, &fa) == AJ_OK, "%s: %s", label,
                              aj_last_error(ctx));
                }
                check_error(label, "chained o", &acc, o_ref, c.dtype);
                check_error(label, "chained lse", &x.lse, lse_ref, AJ_DTYPE_F16);
                free(o_ref);
                free(lse_ref);
                tensor_release(&acc);
                io_release(&x);
                aj_kernel_destroy(kern);
                aj_op_destroy(op);
                cases++;
            }
}

static void (*const tests[])(void) = {test_sweep, test_accumulate, test_errors, NULL};

int main(int argc, char **argv)
{
    const test_main_args m = {AJ_DEVICE_SIM, &ctx, &dev, tests, &cases, NULL};
    return test_main(argc, argv, &m);
}
