/*
 * sim_harness.c -- one forward problem on a device against the float64
 * reference (see sim_harness.h).
 */
#include "sim_harness.h"

#include "ir/op.h"
#include "case_rows.h"
#include "spec_compile.h"
#include "splitmix.h"
#include "timing.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

fwd_tolerance fwd_tolerance_for(aj_dtype dtype)
{
    /* O is written in the op's dtype, so its rounding (2^-11 for f16,
     * 2^-8 for bf16) bounds the error; f32 sees ex2.approx (2^-22) over
     * the sum.  LSE is always f32. */
    switch (dtype) {
    case AJ_DTYPE_F16: return (fwd_tolerance){1e-3, 2e-3, 1e-4, 1e-5};
    case AJ_DTYPE_BF16: return (fwd_tolerance){8e-3, 1.6e-2, 1e-4, 1e-5};
    default: return (fwd_tolerance){2e-5, 5e-5, 1e-4, 1e-5};
    }
}

fwd_case fwd_case_base(const char *label, aj_dtype dtype, int d, const char *mask)
{
    return (fwd_case){.label = label, .dtype = dtype, .d = d, .mask = mask, .b = 1, .hq = 2,
                      .hkv = 1, .sq = 67, .sk = 83, .magnitude = 1.0, .seed = 42};
}

fwd_case fwd_case_over(const fwd_case *base, const fwd_case *row)
{
    fwd_case c = *row;
    CASE_SHARED_FIELDS(CASE_FROM_BASE)
    CASE_FROM_BASE(bshd)
    return c;
}

void fwd_case_rows(const fwd_case *base, const fwd_case *rows, int n,
                   void (*run)(const fwd_case *c))
{
    for (int i = 0; i < n; i++) {
        fwd_case c = fwd_case_over(base, &rows[i]);
        run(&c);
    }
}

fwd_case fwd_varlen_totals_case(const fwd_case *base, int b, int64_t sq_total,
                                int64_t sk_total, fwd_options *x)
{
    *x = (fwd_options){.dropout = 0.25, .drop_seed = 99, .drop_offset = 3};
    const fwd_case row = {.label = "f16 d96 varlen alibi dropout causal(bottom_right) totals",
                          .dtype = AJ_DTYPE_F16, .d = 96, .mask = "causal(bottom_right)",
                          .b = b, .score_mod = "alibi", .q_offset = 30, .kv_offset = 10,
                          .sq_total = sq_total, .sk_total = sk_total};
    return fwd_case_over(base, &row);
}

const fwd_case fwd_shape_rows[] = {
    {.label = "bf16 d192 dv128 causal", .dtype = AJ_DTYPE_BF16, .d = 192,
     .mask = "causal(top_left)", .dv = 128},
    {.label = "f16 d64 dv128", .dtype = AJ_DTYPE_F16, .d = 64, .mask = "none", .dv = 128},
    {.label = "bf16 d128 softcap(30) causal", .dtype = AJ_DTYPE_BF16, .d = 128,
     .mask = "causal(top_left)", .score_mod = "softcap(30.0)", .magnitude = 4.0},
    {.label = "f32 d64 alibi causal(bottom_right)", .dtype = AJ_DTYPE_F32, .d = 64,
     .mask = "causal(bottom_right)", .score_mod = "alibi"},
    {.label = "bf16 d64 softcap(20) + alibi window", .dtype = AJ_DTYPE_BF16, .d = 64,
     .mask = "window(40, 3, bottom_right)", .score_mod = "softcap(20.0) + alibi",
     .magnitude = 4.0},
    {.label = "f16 d64 BSHD strides, batch 2", .dtype = AJ_DTYPE_F16, .d = 64,
     .mask = "causal(top_left)", .bshd = 1, .b = 2, .hq = 4, .hkv = 2},
};
const int fwd_shape_row_count = sizeof fwd_shape_rows / sizeof fwd_shape_rows[0];

/* ---------------------------------------------------------------- kernels */

/* a spec's text at most (programs of a few thousand nodes fit) */
enum { SPEC_MAX = 8192 };

typedef struct cached_kernel {
    char spec[SPEC_MAX];
    aj_target target;          /* the device's */
    aj_kernel *kernel;
} cached_kernel;

static cached_kernel cache[128];
static int cache_len;

void fwd_cache_clear(void)
{
    for (int i = 0; i < cache_len; i++)
        aj_kernel_destroy(cache[i].kernel);
    cache_len = 0;
}

/* The case's kernel for dev.  On a GPU the device goes with the compile,
 * which then picks the code's target as for any caller (sm_90a for the
 * wgmma kernels on a 9.0 GPU); on sim and cpu, their own. */
static aj_status kernel_for(aj_ctx *ctx, aj_device *dev, const char *spec, aj_kernel **out)
{
    const aj_target target = aj_device_target(dev);
    for (int i = 0; i < cache_len; i++)
        if (strcmp(cache[i].spec, spec) == 0 && cache[i].target == target) {
            *out = cache[i].kernel;
            return AJ_OK;
        }
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    if (target != AJ_TARGET_SIM && target != AJ_TARGET_CPU)
        opt.device = dev;
    opt.emit = target == AJ_TARGET_SIM || target == AJ_TARGET_CPU ? AJ_EMIT_LLVM_IR
                                                                   : AJ_EMIT_PTX;
    aj_status st = spec_compile(ctx, spec, "case", &opt, out);
    if (st != AJ_OK)
        return st;
    /* the cache owns every kernel it hands out; when full it starts over
     * (no caller holds a kernel past its case) */
    if (cache_len == (int)(sizeof cache / sizeof cache[0]))
        fwd_cache_clear();
    snprintf(cache[cache_len].spec, sizeof cache[0].spec, "%s", spec);
    cache[cache_len].target = target;
    cache[cache_len++].kernel = *out;
    return st;
}

/* ---------------------------------------------------------------- data */

/* A BHSD tensor of the case's dtype, its double image (BHSD contiguous),
 * laid out as BHSD or BSHD. */
typedef struct host_tensor {
    aj_tensor t;
    double *ref;
    void *mem;
} host_tensor;

static void make_tensor(host_tensor *h, aj_dtype dtype, int64_t b, int64_t hs, int64_t s,
                        int64_t d, int bshd)
{
    int elem = aj_dtype_size(dtype);
    size_t n = (size_t)(b * hs * s * d);
    memset(h, 0, sizeof *h);
    h->mem = aligned_alloc(64, (n * (size_t)elem + 64) / 64 * 64 + 64);
    h->ref = calloc(n ? n : 1, sizeof(double));
    h->t.data = h->mem;
    h->t.dtype = dtype;
    h->t.rank = 4;
    h->t.shape[0] = b;
    h->t.shape[1] = hs;
    h->t.shape[2] = s;
    h->t.shape[3] = d;
    h->t.strides[3] = 1;
    if (bshd) {          /* memory order [B][S][H][D] */
        h->t.strides[1] = d;
        h->t.strides[2] = hs * d;
        h->t.strides[0] = s * hs * d;
    } else {
        h->t.strides[2] = d;
        h->t.strides[1] = s * d;
        h->t.strides[0] = hs * s * d;
    }
}

static int64_t offset_of(const aj_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return i0 * t->strides[0] + i1 * t->strides[1] + i2 * t->strides[2] + i3 * t->strides[3];
}

/* Random values, rounded to the dtype, in both images. */
static void fill_tensor(host_tensor *h, double magnitude, uint64_t *rng)
{
    const aj_tensor *t = &h->t;
    size_t r = 0;
    for (int64_t i0 = 0; i0 < t->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < t->shape[1]; i1++)
            for (int64_t i2 = 0; i2 < t->shape[2]; i2++)
                for (int64_t i3 = 0; i3 < t->shape[3]; i3++, r++) {
                    double u = (double)(splitmix_next(rng) >> 11) / 9007199254740992.0;
                    float f = (float)((2 * u - 1) * magnitude);
                    int64_t at = offset_of(t, i0, i1, i2, i3);
                    if (t->dtype == AJ_DTYPE_F32) {
                        ((float *)t->data)[at] = f;
                    } else {
                        aj_convert(&f, AJ_DTYPE_F32, (uint16_t *)t->data + at, t->dtype, 1);
                        aj_convert((uint16_t *)t->data + at, t->dtype, &f, AJ_DTYPE_F32, 1);
                    }
                    h->ref[r] = f;
                }
}

/* FP8 inputs: h (f32, filled) quantised to f8 in place, per head (dim
 * head_axis) or per tensor: descale = amax / the format's largest finite
 * value, stored = f8(value / descale), and the double image becomes the
 * dequantised stored * descale.  scales gets the descale(s), *n_scales
 * their count. */
static void quantize_f8(host_tensor *h, aj_dtype f8, int head_axis, int per_head, float *scales,
                        int64_t *n_scales)
{
    aj_tensor *t = &h->t;
    const double largest = f8 == AJ_DTYPE_F8E4M3 ? 448.0 : 57344.0;
    const int64_t heads = per_head ? t->shape[head_axis] : 1;
    double amax[64] = {0};
    size_t r = 0;
    int64_t ix[4];
    for (ix[0] = 0; ix[0] < t->shape[0]; ix[0]++)
        for (ix[1] = 0; ix[1] < t->shape[1]; ix[1]++)
            for (ix[2] = 0; ix[2] < t->shape[2]; ix[2]++)
                for (ix[3] = 0; ix[3] < t->shape[3]; ix[3]++, r++) {
                    double *m = &amax[per_head ? ix[head_axis] : 0];
                    *m = fmax(*m, fabs(h->ref[r]));
                }
    for (int64_t g = 0; g < heads; g++)
        scales[g] = amax[g] > 0 ? (float)(amax[g] / largest) : 1.0f;
    *n_scales = heads;
    const float *src = (const float *)t->data;
    uint8_t *dst = aligned_alloc(64, ((size_t)r + 64) / 64 * 64 + 64);
    r = 0;
    for (ix[0] = 0; ix[0] < t->shape[0]; ix[0]++)
        for (ix[1] = 0; ix[1] < t->shape[1]; ix[1]++)
            for (ix[2] = 0; ix[2] < t->shape[2]; ix[2]++)
                for (ix[3] = 0; ix[3] < t->shape[3]; ix[3]++, r++) {
                    int64_t at = offset_of(t, ix[0], ix[1], ix[2], ix[3]);
                    float scale = scales[per_head ? ix[head_axis] : 0];
                    float f = src[at] / scale, back;
                    aj_convert(&f, AJ_DTYPE_F32, dst + at, f8, 1);
                    aj_convert(dst + at, f8, &back, AJ_DTYPE_F32, 1);
                    h->ref[r] = (double)back * scale;
                }
    free(h->mem);
    h->mem = t->data = dst;
    t->dtype = f8;
}

static double read_element(const aj_tensor *t, int64_t at)
{
    float f;
    if (t->dtype == AJ_DTYPE_F32)
        f = ((const float *)t->data)[at];
    else
        aj_convert((const uint16_t *)t->data + at, t->dtype, &f, AJ_DTYPE_F32, 1);
    return f;
}

static void free_tensor(host_tensor *h)
{
    free(h->mem);
    free(h->ref);
}

/* ---------------------------------------------------------------- run */

static void write_spec(const fwd_case *c, const fwd_options *x, const fwd_run_options *run,
                       char *spec, size_t cap)
{
    /* the case's schedule with the run's warpgroups (and producer) among its keys */
    char sched[160], keys[48];
    const char *given = c->schedule && strcmp(c->schedule, "default") ? c->schedule : NULL;
    snprintf(keys, sizeof keys, "warpgroups = %d%s", run->warpgroups,
             run->producer ? ", producer = 1" : "");
    if (run->warpgroups && given)
        snprintf(sched, sizeof sched, "%.*s, %s)", (int)strlen(given) - 1, given, keys);
    else if (run->warpgroups)
        snprintf(sched, sizeof sched, "(%s)", keys);
    else
        snprintf(sched, sizeof sched, "%s", given ? given : "default");
    char f8[80] = "";
    if (c->f8 >= AJ_DTYPE_F8E4M3)
        snprintf(f8, sizeof f8, "%s%s%s  kv_dtype = %s\n", c->f8_q ? "  q_dtype = " : "",
                 c->f8_q ? aj_dtype_name(c->f8) : "", c->f8_q ? "\n" : "",
                 aj_dtype_name(c->f8));
    snprintf(spec, cap,
             "attention forward %s {\n  dtype = %s\n  head_dim = %d\n"
             "  head_dim_v = %d\n  mask = %s\n  score_mod = %s\n  schedule = %s\n"
             "  bias = %s\n  dropout = %.17g\n  layout = %s\n%s  accumulate = %s\n%s%s%s}\n",
             run->variant == AJ_VARIANT_FLASH ? "flash" : "efficient",
             aj_dtype_name(c->dtype), c->d, c->dv ? c->dv : c->d, c->mask,
             c->score_mod ? c->score_mod : "none", sched,
             x->bias_shape[3] ? "add" : "none", x->dropout,
             run->seqlens_q ? "varlen" : "padded", f8,
             run->accumulate_parts > 0 ? "true" : "false",
             x->tensors ? "  tensors = " : "", x->tensors ? x->tensors : "",
             x->tensors ? "\n" : "");
}

/* The bias of a case: random values rounded to the dtype, with the
 * reference's contiguous double image (NULL without bias). */
static void make_bias(const fwd_case *c, const fwd_options *x, host_tensor *h,
                      uint64_t *rng)
{
    memset(h, 0, sizeof *h);
    if (!x->bias_shape[3])
        return;
    const int64_t *sh = x->bias_shape;
    make_tensor(h, c->dtype, sh[0], sh[1], sh[2], sh[3], 0);
    fill_tensor(h, x->bias_magnitude, rng);
    if (x->bias_stride0)
        for (int i = 0; i < 3; i++)
            if (sh[i] == 1)
                h->t.strides[i] = 0;
}

/* The reference's view of the case (mask fields parsed from its text). */
static void reference_problem(const fwd_case *c, const fwd_options *x, ref_problem *p,
                              const double *slopes)
{
    memset(p, 0, sizeof *p);
    p->B = c->b;
    p->Hq = c->hq;
    p->Hkv = c->hkv;
    p->Sq = c->sq;
    p->Sk = c->sk;
    p->D = c->d;
    p->Dv = c->dv ? c->dv : c->d;
    p->q_offset = c->q_offset;
    p->kv_offset = c->kv_offset;
    p->sq_total = c->sq_total;
    p->sk_total = c->sk_total;
    p->align = strstr(c->mask, "bottom_right") ? AJ_ALIGN_BOTTOM_RIGHT : AJ_ALIGN_TOP_LEFT;
    long long left = 0, right = 0;
    if (strncmp(c->mask, "causal", 6) == 0) {
        p->mask = AJ_MASK_CAUSAL;
    } else if (sscanf(c->mask, "window(%lld, %lld", &left, &right) == 2) {
        p->mask = AJ_MASK_WINDOW;
        p->window_left = left;
        p->window_right = right;
    } else {
        p->mask = AJ_MASK_NONE;
    }
    double cap = 0;
    if (c->score_mod && sscanf(c->score_mod, "softcap(%lf", &cap) == 1)
        p->softcap = cap;
    /* alibi, or softcap(C) + alibi: the slopes the launch is given */
    const char *alibi = c->score_mod ? strstr(c->score_mod, "alibi") : NULL;
    if (alibi && strcmp(alibi, "alibi") == 0)
        p->alibi_slopes = slopes;
    p->dropout_p = x->dropout;
    p->seed = x->drop_seed;
    p->offset = x->drop_offset;
}

/* Bytes a tensor spans (its data is contiguous in every layout used here). */
static size_t device_bytes(const aj_tensor *t)
{
    size_t n = (size_t)aj_dtype_size(t->dtype);
    for (int i = 0; i < t->rank; i++)
        n *= (size_t)t->shape[i];
    return n;
}

/* Keeps the worst error; a NaN counts as infinitely bad. */
static void worst(double *max, double e)
{
    if (isnan(e))
        e = INFINITY;
    if (e > *max)
        *max = e;
}

fwd_result fwd_run_case(aj_ctx *ctx, aj_device *dev, const fwd_case *c)
{
    return fwd_run_case_with(ctx, dev, c, NULL);
}

fwd_result fwd_run_case_with(aj_ctx *ctx, aj_device *dev, const fwd_case *c,
                             const fwd_options *opts)
{
    return fwd_run_case_ext(ctx, dev, c, opts, NULL);
}

/* A [1, T, H, D] contiguous tensor seen as the packed [T, H, D] of varlen. */
static void to_packed(aj_tensor *t)
{
    for (int i = 0; i < 3; i++) {
        t->shape[i] = t->shape[i + 1];
        t->strides[i] = t->strides[i + 1];
    }
    t->shape[3] = t->strides[3] = 0;
    t->rank = 3;
}

/* Copies host memory to a new device buffer (*dev_ptr), keeping the first
 * failure in *st. */
static void to_device(aj_device *dev, aj_status *st, const void *host, size_t bytes,
                      void **dev_ptr)
{
    *dev_ptr = NULL;
    if (*st == AJ_OK)
        *st = aj_device_alloc(dev, bytes ? bytes : 16, dev_ptr);
    if (*st == AJ_OK && bytes)
        *st = aj_device_copy_to(dev, *dev_ptr, host, bytes);
}

void side_to_device(aj_device *dev, aj_status *st, const aj_side_tensor *side, int n,
                    aj_side_tensor *out)
{
    for (int i = 0; i < n; i++) {
        out[i] = side[i];
        size_t elems = 1;
        for (int d = 0; d < out[i].rank; d++)
            elems += (size_t)((out[i].shape[d] - 1) * out[i].strides[d]);
        void *p = NULL;
        to_device(dev, st, side[i].data, elems * (size_t)aj_side_dtype_bytes(side[i].dtype), &p);
        out[i].data = p;
    }
}

void side_free_device(aj_device *dev, aj_side_tensor *t, int n)
{
    for (int i = 0; i < n; i++)
        if (t[i].data)
            aj_device_free(dev, (void *)t[i].data);
}

/* Runs the launch(es) of a case: one call, or accumulate calls over
 * `parts` key blocks in turn. */
static aj_status launch(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel, const fwd_case *c,
                        const aj_fwd_args *a, int parts)
{
    if (parts <= 0)
        return aj_forward(ctx, dev, kernel, a);
    int elem = aj_dtype_size(a->k.dtype);
    for (int part = 0; part < parts; part++) {
        int64_t k0 = (int64_t)c->sk * part / parts, k1 = (int64_t)c->sk * (part + 1) / parts;
        aj_fwd_args x = *a;
        x.k.data = (char *)a->k.data + k0 * a->k.strides[2] * elem;
        x.v.data = (char *)a->v.data + k0 * a->v.strides[2] * elem;
        x.k.shape[2] = x.v.shape[2] = k1 - k0;
        x.kv_offset = c->kv_offset + k0;
        x.sq_total = c->sq_total ? c->sq_total : c->sq;
        x.sk_total = c->sk_total ? c->sk_total : c->sk;
        aj_status st = aj_forward(ctx, dev, kernel, &x);
        if (st != AJ_OK)
            return st;
    }
    return AJ_OK;
}

fwd_result fwd_run_case_ext(aj_ctx *ctx, aj_device *dev, const fwd_case *c,
                            const fwd_options *opts, const fwd_run_options *run)
{
    static const fwd_options no_options;
    static const fwd_run_options no_run;
    if (!opts)
        opts = &no_options;
    if (!run)
        run = &no_run;
    fwd_result r;
    memset(&r, 0, sizeof r);
    static _Thread_local char spec[SPEC_MAX];
    write_spec(c, opts, run, spec, sizeof spec);
    aj_kernel *kernel = NULL;
    r.status = kernel_for(ctx, dev, spec, &kernel);
    if (r.status != AJ_OK)
        return r;

    int dv = c->dv ? c->dv : c->d;
    int varlen = run->seqlens_q != NULL;
    int accumulate = run->accumulate_parts > 0;
    uint64_t rng = c->seed ? c->seed : 1;
    /* varlen: cumulative lengths, and one [1, T, H, D] tensor per input */
    int32_t *cu_q = calloc((size_t)c->b + 1, sizeof *cu_q);
    int32_t *cu_k = calloc((size_t)c->b + 1, sizeof *cu_k);
    for (int b = 0; varlen && b < c->b; b++) {
        cu_q[b + 1] = cu_q[b] + run->seqlens_q[b];
        cu_k[b + 1] = cu_k[b] + run->seqlens_k[b];
    }
    int64_t nb = varlen ? 1 : c->b;
    int64_t sq = varlen ? cu_q[c->b] : c->sq, sk = varlen ? cu_k[c->b] : c->sk;
    host_tensor q, k, v, o, o_acc;
    /* FP8 inputs are drawn in f32, then quantised (below) */
    const int f8 = c->f8 >= AJ_DTYPE_F8E4M3, head_axis = varlen ? 2 : 1;
    const aj_dtype q_drawn = f8 && c->f8_q ? AJ_DTYPE_F32 : c->dtype;
    const aj_dtype kv_drawn = f8 ? AJ_DTYPE_F32 : c->dtype;
    if (varlen) {
        make_tensor(&q, q_drawn, 1, sq, c->hq, c->d, 0);
        make_tensor(&k, kv_drawn, 1, sk, c->hkv, c->d, 0);
        make_tensor(&v, kv_drawn, 1, sk, c->hkv, dv, 0);
        make_tensor(&o, c->dtype, 1, sq, c->hq, dv, 0);
        make_tensor(&o_acc, AJ_DTYPE_F32, 1, sq, c->hq, dv, 0);
    } else {
        make_tensor(&q, q_drawn, nb, c->hq, sq, c->d, c->bshd);
        make_tensor(&k, kv_drawn, nb, c->hkv, sk, c->d, c->bshd);
        make_tensor(&v, kv_drawn, nb, c->hkv, sk, dv, c->bshd);
        make_tensor(&o, c->dtype, nb, c->hq, sq, dv, c->bshd);
        make_tensor(&o_acc, AJ_DTYPE_F32, nb, c->hq, sq, dv, c->bshd);
    }
    fill_tensor(&q, c->magnitude, &rng);
    fill_tensor(&k, c->magnitude, &rng);
    fill_tensor(&v, 1.0, &rng);
    /* FP8 inputs: quantised with their descales (the head axis is dim 2
     * of varlen's [1, T, H, D], else dim 1); q only with f8_q */
    float descales[3][64];
    int64_t n_descales[3] = {0, 0, 0};
    host_tensor *quantised[3] = {&q, &k, &v};
    for (int i = c->f8_q ? 0 : 1; f8 && i < 3; i++)
        quantize_f8(quantised[i], c->f8, head_axis, c->f8_per_head, descales[i], &n_descales[i]);
    /* a prior that must not leak: lse = -inf rows ignore whatever O holds */
    size_t acc_elems = (size_t)(nb * c->hq * sq * dv);
    for (size_t i = 0; i < acc_elems; i++)
        ((float *)o_acc.t.data)[i] = NAN;
    host_tensor bias;
    make_bias(c, opts, &bias, &rng);
    size_t rows = (size_t)nb * (size_t)c->hq * (size_t)sq;
    float *lse = malloc((rows ? rows : 1) * sizeof *lse);
    for (size_t i = 0; i < rows; i++)
        lse[i] = -INFINITY;
    float *slopes = malloc((size_t)(c->hq ? c->hq : 1) * sizeof *slopes);
    double *slopes_ref = malloc((size_t)(c->hq ? c->hq : 1) * sizeof *slopes_ref);
    for (int h = 0; h < c->hq; h++) {   /* ALiBi's geometric slopes */
        slopes[h] = (float)pow(2.0, -8.0 * (h + 1) / c->hq);
        slopes_ref[h] = slopes[h];
    }

    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = q.t;
    a.k = k.t;
    a.v = v.t;
    a.o = o.t;
    if (varlen) {
        /* lse [Hq, Tq] */
        a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 2, {c->hq, sq, 0, 0}, {sq, 1, 0, 0}};
        to_packed(&a.q);
        to_packed(&a.k);
        to_packed(&a.v);
        to_packed(&a.o);
        to_packed(&o_acc.t);
        a.batch = c->b;
        for (int b = 0; b < c->b; b++) {
            if (run->seqlens_q[b] > a.max_seqlen_q)
                a.max_seqlen_q = run->seqlens_q[b];
            if (run->seqlens_k[b] > a.max_seqlen_k)
                a.max_seqlen_k = run->seqlens_k[b];
        }
    } else {
        a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {c->b, c->hq, c->sq, 0},
                            {(int64_t)c->hq * c->sq, c->sq, 1, 0}};
    }
    a.alibi_slopes = (aj_tensor){slopes, AJ_DTYPE_F32, 1, {c->hq, 0, 0, 0}, {1, 0, 0, 0}};
    a.q_offset = c->q_offset;
    a.kv_offset = c->kv_offset;
    a.sq_total = c->sq_total;
    a.sk_total = c->sk_total;
    a.bias = bias.t;
    if (accumulate)
        a.o_acc = o_acc.t;
    a.seed = opts->drop_seed;
    a.offset = opts->drop_offset;
    /* the tensors travel to the device and back (for sim: host copies) */
    aj_tensor *scale_args[3] = {&a.q_scale, &a.k_scale, &a.v_scale};
    for (int i = 0; i < 3; i++)
        if (n_descales[i])
            *scale_args[i] = (aj_tensor){descales[i], AJ_DTYPE_F32, 1, {n_descales[i]}, {1}};
    aj_tensor *moved[11] = {&a.q, &a.k, &a.v, &a.o, &a.lse, &a.alibi_slopes, &a.o_acc, &a.bias};
    size_t bytes[11];
    void *host[11];
    int n_moved = opts->bias_shape[3] ? 8 : 7;
    for (int i = 0; i < 3; i++)   /* the descales, where given */
        if (n_descales[i])
            moved[n_moved++] = scale_args[i];
    for (int i = 0; i < n_moved; i++) {
        host[i] = moved[i]->data;
        bytes[i] = moved[i]->data ? device_bytes(moved[i]) : 0;
        to_device(dev, &r.status, host[i], bytes[i], &moved[i]->data);
    }
    aj_side_tensor side_dev[AJ_OP_TENSORS_MAX];
    side_to_device(dev, &r.status, opts->side, opts->num_side, side_dev);
    a.side = side_dev;
    a.num_side = opts->num_side;
    void *cu_dev[2] = {NULL, NULL};
    if (varlen) {
        size_t cu_bytes = ((size_t)c->b + 1) * sizeof(int32_t);
        to_device(dev, &r.status, cu_q, cu_bytes, &cu_dev[0]);
        to_device(dev, &r.status, cu_k, cu_bytes, &cu_dev[1]);
        a.cu_seqlens_q = cu_dev[0];
        a.cu_seqlens_k = cu_dev[1];
    }
    double t0 = now_s();
    if (r.status == AJ_OK)
        r.status = launch(ctx, dev, kernel, c, &a, run->accumulate_parts);
    if (r.status == AJ_OK)
        r.status = aj_device_synchronize(dev, NULL);
    r.seconds = now_s() - t0;
    r.instructions = aj_device_last_instructions(dev);
    aj_tensor *out = accumulate ? &a.o_acc : &a.o;
    for (int i = 0; i < n_moved; i++) {
        if (r.status == AJ_OK && bytes[i] && (moved[i] == out || moved[i] == &a.lse))
            r.status = aj_device_copy_from(dev, host[i], moved[i]->data, bytes[i]);
        if (moved[i]->data)
            aj_device_free(dev, moved[i]->data);
    }
    for (int i = 0; i < 2; i++)
        if (cu_dev[i])
            aj_device_free(dev, cu_dev[i]);
    side_free_device(dev, side_dev, opts->num_side);
    const aj_tensor *got_o = accumulate ? &o_acc.t : &o.t;
    if (varlen)
        to_packed(&o.t);

    if (r.status == AJ_OK) {
        ref_problem p;
        reference_problem(c, opts, &p, slopes_ref);
        aj_op *op = NULL;
        if (strncmp(c->mask, "expr", 4) == 0 ||
            (c->score_mod && strncmp(c->score_mod, "expr", 4) == 0)) {
            if (aj_op_parse(ctx, spec, strlen(spec), "case", &op) == AJ_OK)
                ref_use_expressions(&p, op, opts->side, opts->num_side);
        }
        if (varlen) {
            p.cu_q = cu_q;
            p.cu_k = cu_k;
        }
        if (opts->bias_shape[3]) {
            p.bias = bias.ref;
            memcpy(p.bias_shape, opts->bias_shape, sizeof p.bias_shape);
        }
        double *o_ref = calloc(rows * (size_t)dv + 1, sizeof *o_ref);
        double *lse_ref = calloc(rows + 1, sizeof *lse_ref);
        ref_forward(&p, q.ref, k.ref, v.ref, o_ref, lse_ref);
        fwd_tolerance tol = fwd_tolerance_for(c->dtype);
        /* The flash forward's FP8 tensor-core kernel rounds P to e4m3 for
         * P V (docs/ir.md, "FP8 inputs"): each term P_j V_j carries a
         * relative error up to 2^-4, so O's element x may be off by
         * 2^-4 sum_j w_j |V_jx| (w: the attention weights) more -- the
         * reference over |V| gives that sum. */
        double *o_abs = NULL;
        if (run->variant == AJ_VARIANT_FLASH && c->f8 && c->f8_q &&
            aj_device_target(dev) != AJ_TARGET_CPU) {
            size_t n_v = (size_t)(nb * c->hkv * sk * dv);
            double *v_abs = malloc(n_v * sizeof *v_abs), *lse_abs = calloc(rows + 1, sizeof *lse_abs);
            o_abs = calloc(rows * (size_t)dv + 1, sizeof *o_abs);
            for (size_t x = 0; x < n_v; x++)
                v_abs[x] = fabs(v.ref[x]);
            ref_forward(&p, q.ref, k.ref, v_abs, o_abs, lse_abs);
            free(v_abs);
            free(lse_abs);
        }
        r.exact_empty_rows = 1;
        /* padded: row (b, h, i) is lse[row] and o_ref[row]; varlen: row
         * (h, t) is lse[h Tq + t] and o_ref[t Hq + h] */
        for (size_t row = 0; row < rows; row++) {
            int64_t b = 0, h, i, o_row = (int64_t)row;
            if (varlen) {
                h = (int64_t)row / sq;
                i = (int64_t)row % sq;
                o_row = i * c->hq + h;
            } else {
                b = (int64_t)row / ((int64_t)c->hq * sq);
                h = (int64_t)row / sq % c->hq;
                i = (int64_t)row % sq;
            }
            double lr = lse_ref[row], lg = lse[row];
            int empty = isinf(lr) && lr < 0;
            r.rows_without_keys += empty;
            if (empty && !(isinf(lg) && lg < 0))
                r.exact_empty_rows = 0;
            if (!empty)
                worst(&r.max_err_lse, fabs(lg - lr) / (tol.lse_atol + tol.lse_rtol * fabs(lr)));
            for (int x = 0; x < dv; x++) {
                int64_t at = varlen ? i * got_o->strides[0] + h * got_o->strides[1] + x
                                    : offset_of(got_o, b, h, i, x);
                double got = read_element(got_o, at);
                double want = o_ref[(size_t)o_row * (size_t)dv + (size_t)x];
                if (empty && got != 0.0)
                    r.exact_empty_rows = 0;
                double p8 = o_abs ? 0x1p-4 * o_abs[(size_t)o_row * (size_t)dv + (size_t)x] : 0.0;
                worst(&r.max_err_o,
                      fabs(got - want) / (tol.o_atol + tol.o_rtol * fabs(want) + p8));
            }
        }
        free(o_abs);
        free(o_ref);
        free(lse_ref);
        aj_op_destroy(op);
    }
    free_tensor(&q);
    free_tensor(&k);
    free_tensor(&v);
    free_tensor(&o);
    free_tensor(&o_acc);
    free_tensor(&bias);
    free(cu_q);
    free(cu_k);
    free(lse);
    free(slopes);
    free(slopes_ref);
    return r;
}

fwd_result fwd_run_case_variant(aj_ctx *ctx, aj_device *dev, const fwd_case *c,
                                const fwd_options *x, const char *variant)
{
    fwd_run_options run = {0};
    run.variant = variant && strcmp(variant, "flash") == 0 ? AJ_VARIANT_FLASH
                                                          : AJ_VARIANT_EFFICIENT;
    return fwd_run_case_ext(ctx, dev, c, x, &run);
}
