/*
 * bwd_case.h -- one backward problem of the backward tests
 * (test_sim_backward.c, test_sim_flash_bwd.c): the case, its op, its
 * kernel, its inputs, the float64 reference problem, the launch's
 * arguments and the checks of the gradients.
 *
 *     bwd_case --bwd_case_op--> op --bwd_case_kernel--> kernel
 *        |
 *        +--bwd_io_make, bwd_io_fill--> q k v dO (random, rounded)
 *        +--bwd_case_problem--> ref_problem --ref_forward--> O, LSE (rounded)
 *        +--bwd_case_args--> aj_bwd_args --aj_backward--> dQ dK dV
 *                                          --bwd_check_grads-- ref_backward
 *
 * Header-only with static functions, so that their CHECKs count in the
 * including test (check.h keeps its counters per file); the includer
 * defines tolerance_for as bwd_tensors.h asks.
 */
#ifndef AJ_TESTS_BWD_CASE_H
#define AJ_TESTS_BWD_CASE_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"
#include "bwd_tensors.h"
#include "case_rows.h"

typedef struct bwd_case {
    const char *label;
    aj_variant variant;        /* AJ_VARIANT_EFFICIENT, else flash */
    aj_dtype dtype;
    int d, dv;                 /* dv 0: d */
    const char *mask;          /* IR text */
    const char *score_mod;     /* IR text, "none" if NULL */
    const char *tensors;       /* the `tensors` field's text, NULL: none */
    const char *schedule;      /* IR text, the default if NULL */
    int warpgroups;            /* the schedule's warpgroups (the wgmma kernels), put
                                  before the fields of `schedule` */
    int deterministic;
    int b, hq, hkv, sq, sk;
    int64_t q_offset, kv_offset, sq_total, sk_total;
    double magnitude;          /* q and k in [-magnitude, magnitude] (0: 1) */
    uint64_t seed;             /* of the inputs (0: 7) */
    double dropout;            /* dropout = p when > 0, stream (drop_seed, drop_offset) */
    uint64_t drop_seed, drop_offset;
    int64_t bias_shape[4];     /* bias = add when bias_shape[3] != 0 (each dim 1 or full) */
    const int *lens_q, *lens_k;  /* varlen when set: b sequence lengths each */
    /* test_sim_flash_bwd's reruns and checks */
    int repeat;                /* rerun, same bits (test_sim_flash_bwd: deterministic, on 1
                                  and 3 workers) */
    int pass_mask;             /* rerun with the forward's aj_block_mask_create: same bits */
    const char *twin_mask;     /* rerun with this mask, the same keys visible but no tile
                                  the kernels can class full: same bits */
    int per_plane;             /* padded: the tolerance per (b, head) plane of each output
                                  (a batch of random cases, one per plane) */
} bwd_case;

/* A case written as a table's row (case_rows.h) over base; a case that
 * needs 0 where base has another value is written out, or runs over
 * another base. */
static bwd_case bwd_case_over(const bwd_case *base, const bwd_case *row)
{
    bwd_case c = *row;
    CASE_SHARED_FIELDS(CASE_FROM_BASE)
    CASE_FROM_BASE(variant)
    CASE_FROM_BASE(tensors)
    CASE_FROM_BASE(deterministic)
    CASE_FROM_BASE(dropout)
    CASE_FROM_BASE(drop_seed)
    CASE_FROM_BASE(drop_offset)
    CASE_FROM_BASE(lens_q)
    CASE_FROM_BASE(lens_k)
    CASE_FROM_BASE(repeat)
    CASE_FROM_BASE(pass_mask)
    CASE_FROM_BASE(twin_mask)
    CASE_FROM_BASE(per_plane)
    CASE_FROM_BASE(warpgroups)
    if (!row->bias_shape[3])
        memcpy(c.bias_shape, base->bias_shape, sizeof c.bias_shape);
    return c;
}

/* Runs bwd_case_over(base, rows[i]) with `run`, in order. */
static void bwd_case_rows(const bwd_case *base, const bwd_case *rows, int n,
                          void (*run)(const bwd_case *c))
{
    for (int i = 0; i < n; i++) {
        bwd_case c = bwd_case_over(base, &rows[i]);
        run(&c);
    }
}

/* Positions of a shard of longer sequences: offsets with totals, offsets
 * past 2^31, keys all after the queries; both backward tests run them
 * over their base, in dtype `a` (the first and last) and `b`. */
static void bwd_offset_cases(const bwd_case *base, aj_dtype a, aj_dtype b,
                             void (*run)(const bwd_case *c))
{
    static const bwd_case rows[] = {
        {.label = "d64 causal, offsets (chunk of a longer sequence)", .d = 64,
         .mask = "causal(bottom_right)", .q_offset = 100, .kv_offset = 64, .sq_total = 140,
         .sk_total = 170},
        {.label = "d64 window, offsets past 2^31", .d = 64, .mask = "window(30, 0, top_left)",
         .q_offset = ((int64_t)1 << 33) + 40, .kv_offset = (int64_t)1 << 33},
        {.label = "d32 causal, keys all in the future: every row empty", .d = 32,
         .mask = "causal(top_left)", .kv_offset = 1000},
    };
    const aj_dtype dtypes[3] = {a, b, a};
    for (int i = 0; i < 3; i++) {
        char label[96];
        snprintf(label, sizeof label, "%s %s", aj_dtype_name(dtypes[i]), rows[i].label);
        bwd_case c = bwd_case_over(base, &rows[i]);
        c.label = label;
        c.dtype = dtypes[i];
        run(&c);
    }
}

static bool is_expr(const char *field)
{
    return field && strncmp(field, "expr", 4) == 0;
}

/* The op of a case (NULL, a failed CHECK, when it does not parse). */
static aj_op *bwd_case_op(aj_ctx *ctx, const bwd_case *c)
{
    static char spec[20000];   /* random expressions run long */
    char sched[160];
    const char *schedule = c->schedule;
    if (c->warpgroups) {
        snprintf(sched, sizeof sched, "(warpgroups = %d%s%s", c->warpgroups,
                 schedule ? ", " : ")", schedule ? schedule + 1 : "");
        schedule = sched;
    }
    snprintf(spec, sizeof spec,
             "attention backward %s {\n  dtype = %s\n  head_dim = %d\n"
             "  head_dim_v = %d\n  mask = %s\n  score_mod = %s\n  bias = %s\n"
             "  dropout = %.17g\n  layout = %s\n  deterministic = %s\n%s%s%s%s%s%s}\n",
             c->variant == AJ_VARIANT_EFFICIENT ? "efficient" : "flash",
             aj_dtype_name(c->dtype), c->d, c->dv ? c->dv : c->d, c->mask,
             c->score_mod ? c->score_mod : "none", c->bias_shape[3] ? "add" : "none",
             c->dropout, c->lens_q ? "varlen" : "padded", c->deterministic ? "true" : "false",
             schedule ? "  schedule = " : "", schedule ? schedule : "", schedule ? "\n" : "",
             c->tensors ? "  tensors = " : "", c->tensors ? c->tensors : "",
             c->tensors ? "\n" : "");
    aj_op *op = NULL;
    CHECK_MSG(aj_op_parse(ctx, spec, strlen(spec), c->label, &op) == AJ_OK, "%s: %s", c->label,
              aj_last_error(ctx));
    return op;
}

/* Compiles the op for the device, its status (the message on ctx): for
 * its target, and through the device where the case names warpgroups (a
 * 9.0 GPU reports sm_90 and runs the wgmma kernels' sm_90a). */
static aj_status bwd_case_compile(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                                  const bwd_case *c, aj_kernel **k)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    if (c->warpgroups)
        opt.device = dev;
    return aj_compile(ctx, op, &opt, k);
}

/* The op compiled for the device (NULL, a failed CHECK, when it does not
 * compile; NULL without a CHECK for no op). */
static aj_kernel *bwd_case_kernel(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                                  const bwd_case *c)
{
    aj_kernel *k = NULL;
    if (op)
        CHECK_MSG(bwd_case_compile(ctx, dev, op, c, &k) == AJ_OK, "%s: %s", c->label,
                  aj_last_error(ctx));
    return k;
}

/* The nine tensors of a launch. */
typedef struct bwd_io {
    tensor q, k, v, o, dout, lse, dq, dk, dv;
} bwd_io;

/* Padded: BHSD tensors and LSE [B, Hq, Sq]; varlen: THD packed over
 * the sequences of cu_q and cu_k, LSE [Hq, Tq]. */
static void bwd_io_make(bwd_io *x, aj_device *dev, const bwd_case *c, const int32_t *cu_q,
                        const int32_t *cu_k)
{
    int dv = c->dv ? c->dv : c->d;
    if (c->lens_q) {
        int64_t tq = cu_q[c->b], tk = cu_k[c->b];
        tensor_make(&x->q, dev, c->dtype, 3, (int64_t[]){tq, c->hq, c->d});
        tensor_make(&x->k, dev, c->dtype, 3, (int64_t[]){tk, c->hkv, c->d});
        tensor_make(&x->v, dev, c->dtype, 3, (int64_t[]){tk, c->hkv, dv});
        tensor_make(&x->o, dev, c->dtype, 3, (int64_t[]){tq, c->hq, dv});
        tensor_make(&x->dout, dev, c->dtype, 3, (int64_t[]){tq, c->hq, dv});
        tensor_make(&x->lse, dev, AJ_DTYPE_F32, 2, (int64_t[]){c->hq, tq});
        tensor_make(&x->dq, dev, c->dtype, 3, (int64_t[]){tq, c->hq, c->d});
        tensor_make(&x->dk, dev, c->dtype, 3, (int64_t[]){tk, c->hkv, c->d});
        tensor_make(&x->dv, dev, c->dtype, 3, (int64_t[]){tk, c->hkv, dv});
    } else {
        tensor_make(&x->q, dev, c->dtype, 4, (int64_t[]){c->b, c->hq, c->sq, c->d});
        tensor_make(&x->k, dev, c->dtype, 4, (int64_t[]){c->b, c->hkv, c->sk, c->d});
        tensor_make(&x->v, dev, c->dtype, 4, (int64_t[]){c->b, c->hkv, c->sk, dv});
        tensor_make(&x->o, dev, c->dtype, 4, (int64_t[]){c->b, c->hq, c->sq, dv});
        tensor_make(&x->dout, dev, c->dtype, 4, (int64_t[]){c->b, c->hq, c->sq, dv});
        tensor_make(&x->lse, dev, AJ_DTYPE_F32, 3, (int64_t[]){c->b, c->hq, c->sq});
        tensor_make(&x->dq, dev, c->dtype, 4, (int64_t[]){c->b, c->hq, c->sq, c->d});
        tensor_make(&x->dk, dev, c->dtype, 4, (int64_t[]){c->b, c->hkv, c->sk, c->d});
        tensor_make(&x->dv, dev, c->dtype, 4, (int64_t[]){c->b, c->hkv, c->sk, dv});
    }
}

/* q, k in [-magnitude, magnitude], v and dO in [-1, 1], from the case's
 * seed, rounded to the dtype; returns the generator's state for what the
 * caller draws next. */
static uint64_t bwd_io_fill(bwd_io *x, const bwd_case *c)
{
    uint64_t rng = c->seed ? c->seed : 7;
    double mag = c->magnitude ? c->magnitude : 1.0;
    fill(&x->q, mag, &rng);
    fill(&x->k, mag, &rng);
    fill(&x->v, 1.0, &rng);
    fill(&x->dout, 1.0, &rng);
    return rng;
}

static void bwd_io_release(bwd_io *x)
{
    tensor *all[9] = {&x->q, &x->k, &x->v, &x->o, &x->dout, &x->lse, &x->dq, &x->dk, &x->dv};
    for (int i = 0; i < 9; i++)
        tensor_release(all[i]);
}

/* alibi's slopes, 2^(-8 (h + 1) / Hq), as the reference and the launch
 * read them (bwd_slopes_on: t in the device's memory) */
typedef struct bwd_slopes {
    double ref[64];
    float f32[64];
    aj_tensor t;               /* zero: no alibi */
    aj_device *dev;            /* t.data's, once on a device */
} bwd_slopes;

/* The reference problem of a padded case (the caller sets cu_q, cu_k for
 * varlen and expressions): sizes, mask, positions, softcap or alibi
 * (slopes in s), dropout. */
static ref_problem bwd_case_problem(const bwd_case *c, bwd_slopes *s)
{
    ref_problem p = ref_problem_of(c->b, c->hq, c->hkv, c->sq, c->sk, c->d, c->dv ? c->dv : c->d);
    ref_mask(c->mask, &p);
    p.q_offset = c->q_offset;
    p.kv_offset = c->kv_offset;
    p.sq_total = c->sq_total;
    p.sk_total = c->sk_total;
    memset(s, 0, sizeof *s);
    if (c->score_mod && strcmp(c->score_mod, "alibi") == 0) {
        for (int h = 0; h < c->hq; h++) {
            s->f32[h] = (float)pow(2.0, -8.0 * (h + 1) / c->hq);
            s->ref[h] = s->f32[h];
        }
        p.alibi_slopes = s->ref;
        s->t = (aj_tensor){s->f32, AJ_DTYPE_F32, 1, {c->hq}, {1}};
    } else if (c->score_mod && !is_expr(c->score_mod)) {
        CHECK(sscanf(c->score_mod, "softcap(%lf)", &p.softcap) == 1);
    }
    p.dropout_p = c->dropout;
    p.seed = c->drop_seed;
    p.offset = c->drop_offset;
    return p;
}

/* The slopes copied to the device's memory, where a launch reads them (a
 * GPU cannot read the host's f32); bwd_slopes_free releases them. */
static void bwd_slopes_on(aj_device *dev, bwd_slopes *s)
{
    if (!s->t.data)
        return;
    size_t bytes = (size_t)s->t.shape[0] * sizeof(float);
    void *d = NULL;
    CHECK(aj_device_alloc(dev, bytes, &d) == AJ_OK);
    if (d)
        CHECK(aj_device_copy_to(dev, d, s->f32, bytes) == AJ_OK);
    s->t.data = d;
    s->dev = dev;
}

static void bwd_slopes_free(bwd_slopes *s)
{
    if (s->dev && s->t.data)
        aj_device_free(s->dev, s->t.data);
    s->dev = NULL;
}

/* The launch's arguments over x: the case's positions, totals, dropout
 * stream and alibi slopes. */
static aj_bwd_args bwd_case_args(const bwd_case *c, const bwd_io *x, const bwd_slopes *s)
{
    aj_bwd_args a = AJ_BWD_ARGS_INIT;
    a.q = x->q.t, a.k = x->k.t, a.v = x->v.t, a.o = x->o.t, a.lse = x->lse.t;
    a.do_ = x->dout.t, a.dq = x->dq.t, a.dk = x->dk.t, a.dv = x->dv.t;
    a.alibi_slopes = s->t;
    a.q_offset = c->q_offset, a.kv_offset = c->kv_offset;
    a.sq_total = c->sq_total, a.sk_total = c->sk_total;
    a.seed = c->drop_seed, a.offset = c->drop_offset;
    return a;
}

/* The max over the planes of x (its first two dims; one plane when
 * not per_plane) of norm_error's plane-wise error in dtype's pair. */
static double plane_error(const bwd_case *c, const tensor *x, const double *got,
                          const double *want, aj_dtype dtype)
{
    size_t planes = c->per_plane ? (size_t)(x->t.shape[0] * x->t.shape[1]) : 1;
    size_t n = x->n / planes;
    double err = 0;
    for (size_t p = 0; p < planes; p++)
        err = fmax(err, norm_error(got + p * n, want + p * n, n, dtype));
    return err;
}

/* Checks dQ, dK, dV (and dbias, f32, in f32's pair, when given) against
 * ref_backward of p over x's inputs, and that rows with LSE = -inf (no
 * visible key) have exactly zero dQ (rows of [.., S, D] padded; varlen
 * LSE is [H, T] and dq [T, H, D]). */
static void bwd_check_grads(const bwd_case *c, const ref_problem *p, bwd_io *x, tensor *dbias)
{
    int nouts = dbias ? 4 : 3;
    size_t n_bias = dbias ? dbias->n : 0;
    double *want[4] = {calloc(x->q.n + 1, 8), calloc(x->k.n + 1, 8), calloc(x->v.n + 1, 8),
                       calloc(n_bias + 1, 8)};
    double *got[4] = {calloc(x->q.n + 1, 8), calloc(x->k.n + 1, 8), calloc(x->v.n + 1, 8),
                      calloc(n_bias + 1, 8)};
    ref_backward(p, x->q.ref, x->k.ref, x->v.ref, x->o.ref, x->lse.ref, x->dout.ref, want[0],
                 want[1], want[2], dbias ? want[3] : NULL);
    const tensor *outs[4] = {&x->dq, &x->dk, &x->dv, dbias};
    static const char *const names[4] = {"dq", "dk", "dv", "dbias"};
    for (int t = 0; t < nouts; t++) {
        read_back(outs[t], got[t]);
        double err = plane_error(c, outs[t], got[t], want[t], t == 3 ? AJ_DTYPE_F32 : c->dtype);
        CHECK_MSG(err <= 1.0, "%s: %s error %.3g of the tolerance%s", c->label, names[t], err,
                  c->per_plane ? " (in a plane)" : "");
    }
    for (size_t r = 0; r < x->lse.n; r++) {
        if (x->lse.ref[r] != -INFINITY)
            continue;
        size_t tq = (size_t)x->q.t.shape[0];
        size_t row = c->lens_q ? (r % tq) * (size_t)c->hq + r / tq : r;
        for (int e = 0; e < c->d; e++)
            CHECK_MSG(got[0][row * (size_t)c->d + (size_t)e] == 0.0,
                      "%s: dq row %zu (no visible key) is not 0", c->label, r);
    }
    for (int t = 0; t < 4; t++) {
        free(want[t]);
        free(got[t]);
    }
}

#endif /* AJ_TESTS_BWD_CASE_H */
