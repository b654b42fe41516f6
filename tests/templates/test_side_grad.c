/*
 * test_side_grad.c -- gradients of side tensors declared `grad` (docs/ir.md
 * "Gradients of side tensors") against the float64 reference's derivative
 * (ref_side_grad: the interpreter's dual numbers with the tensor's element
 * the variable), on the device the argument names (sim by default; ctest
 * runs it on sim and cpu):
 *
 *   - one generator of cases walks variant x dtype x mask x GQA x head
 *     dim (learned sinks in every fifth case, dropout 0.25 in every
 *     seventh: the backward draws the reference's keep mask; a bias,
 *     broadcast over the batch, in every third efficient one, its dbias
 *     checked too) over the score_mods users
 *     write (FlexAttention's learnable
 *     relative bias rb[abs(q - k)], ALiBi's slopes as a learned tensor
 *     -- with every other mask the built-in `score_mod = alibi(grad)`,
 *     its gradient output "alibi_slopes", against the same reference -- a
 *     per-head gate, a 2-D table, two loads of one tensor, a load past
 *     the tensor's end, a grad tensor only an index reads, a tensor read
 *     at the 32 places the stages take), head dims over 8 .. 256;
 *   - a random-program sweep: score_mods from score_cases.h's generator,
 *     whose float tensor tf is grad (24 on cpu, 12 on sim);
 *   - every case: dQ, dK, dV still the reference's, dside bitwise the
 *     same on a second run on 2 worker threads (cpu: and on 1 and 3), and
 *     for some the reference's derivative against a central finite
 *     difference of its loss;
 *   - what is refused, with its message.
 *
 *   test_side_grad [cpu | sim | cuda]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"
#define BWD_STORAGE_TOLERANCE
#include "bwd_tensors.h"
#include "score_cases.h"
#include "test_main.h"

/* the loads of grad tensors a score_mod may have (templates/score.h's
 * AJ_SCORE_GRADS_MAX; docs/ir.md) */
enum { AJ_GRAD_LOADS_MAX = 32 };

static aj_ctx *ctx;
static aj_device *dev;
static int cases;

/* A score_mod and the tensors it reads, the first `grad` ones grad; for
 * ALiBi, the built-in it is, which takes its slopes as (grad) -- the
 * launch's alibi_slopes -- or (slopes), the side tensor. */
typedef struct grad_mod {
    const char *name, *tensors, *mod, *builtin;
} grad_mod;

/* side_make's data: rel (Hq, 65), slopes (Hq), every other dim 7 */
static const grad_mod mods[] = {
    {"relative bias", "(rel: f32[2] grad)", "score + rel[h, abs(q - k)]", NULL},
    {"alibi slopes", "(slopes: f32[1] grad)", "score - slopes[h] * abs(q - k)", "alibi"},
    {"softcap alibi", "(slopes: f32[1] grad)", "7.0 * tanh(score / 7.0) - slopes[h] * abs(q - k)",
     "softcap(7.0) + alibi"},
    {"head gate", "(g: f32[1] grad)",
     "score * (1.0 + 0.5 * tanh(g[h])) + g[h] * tanh(score / 4.0)", NULL},
    {"2-D table", "(tb: f32[2] grad)", "score + tb[q % 5, k % 6] * 0.5", NULL},
    {"two loads", "(rb: f32[1] grad, w: f32[1])", "score + rb[q % 7] - rb[k % 7] * w[h]", NULL},
    {"past the end", "(rb: f32[1] grad)", "score + rb[k - q + 3]", NULL},
    {"index only", "(ix: f32[1] grad, rb: f32[1] grad)",
     "score + rb[abs(q - k) % 4] * (ix[0] > 0.0 ? 1.0 : 0.5)", NULL},
};

/* score + 0.1 (rb[(q + k) % 9] + rb[(q + k + 1) % 9] + ...): a grad
 * tensor read at n places (the parser shares no leaf: n loads) */
static const char *loads_mod(int n)
{
    static char text[4096];
    int at = snprintf(text, sizeof text, "score + 0.1 * (");
    for (int i = 0; i < n; i++)
        at += snprintf(text + at, sizeof text - (size_t)at, "%srb[(q + k + %d) %% 9]",
                       i ? " + " : "", i);
    snprintf(text + at, sizeof text - (size_t)at, ")");
    return text;
}

/* the last: a product of positions, which takes a block mask */
static const char *const masks[] = {"none", "causal(bottom_right)", "window(6, 2, top_left)",
                                    "expr(k <= q && (q * k) % 5 != 2)"};
/* the backward's range, 8 .. 256 */
static const int dims[] = {8, 40, 64, 128, 200, 256};
enum { NDIMS = sizeof dims / sizeof dims[0] };

typedef struct grad_case {
    aj_variant variant;
    aj_dtype dtype;
    const char *name, *mask, *tensors, *mod;
    int d, b, hq, hkv, sq, sk;
    bool fd;          /* check the reference against a finite difference */
    bool sinks;       /* learned sinks too (tensor snk) */
    double dropout;   /* 0: none */
    bool bias;        /* bias = add, of shape (1, Hq, Sq, Sk) (efficient) */
    /* f16 / bf16: the mod's f32 tensors declared so (its values rounded);
     * else as written */
    aj_side_dtype side;
    const int *lens_q, *lens_k;   /* layout = varlen: b sequences' lengths (sq, sk: the longest) */
    /* ALIBI_FIELD: the backward is the mod's built-in with (grad), its
     * slopes aj_bwd_args.alibi_slopes; ALIBI_NAMED: with (slopes), the
     * side tensor; the reference is the mod, tensors "(slopes: f32[1]
     * grad)" */
    enum { ALIBI_EXPR, ALIBI_FIELD, ALIBI_NAMED } builtin_alibi;
    const char *builtin;
} grad_case;

enum { SEQS_MAX = 8 };

static aj_op *case_op(const grad_case *c, aj_kind kind, const char *label)
{
    char spec[8192], dropout[64] = "";
    if (c->dropout > 0)
        snprintf(dropout, sizeof dropout, "  dropout = %g\n", c->dropout);
    if (c->bias)
        strcat(dropout, "  bias = add\n");
    if (c->lens_q)
        strcat(dropout, "  layout = varlen\n");
    /* with sinks: their tensor declared last, `sinks = snk` */
    char tensors[512], mod[4200], decls[256] = "";
    for (const char *at = c->tensors; *at && strlen(decls) < sizeof decls - 8;) {
        bool f32 = strncmp(at, "f32[", 4) == 0 && aj_side_dtype_bytes(c->side) == 2;
        strcat(decls, f32 ? aj_side_dtype_names[c->side] : (char[2]){*at, 0});
        at += f32 ? 3 : 1;
    }
    snprintf(tensors, sizeof tensors, "  tensors = %.*s%s\n", (int)strlen(decls) - 1, decls,
             c->sinks ? ", snk: f32[1])" : ")");
    snprintf(mod, sizeof mod, "expr(%s)", c->mod);
    if (c->builtin_alibi == ALIBI_FIELD && kind == AJ_KIND_BACKWARD) {
        snprintf(tensors, sizeof tensors, "%s", c->sinks ? "  tensors = (snk: f32[1])\n" : "");
        snprintf(mod, sizeof mod, "%s(grad)", c->builtin);
    }
    if (c->builtin_alibi == ALIBI_NAMED && kind == AJ_KIND_BACKWARD)
        snprintf(mod, sizeof mod, "%s(slopes)", c->builtin);
    snprintf(spec, sizeof spec,
             "attention %s %s {\n  dtype = %s\n  head_dim = %d\n%s"
             "  mask = %s\n  score_mod = %s\n%s%s}\n",
             kind == AJ_KIND_FORWARD ? "forward" : "backward",
             c->variant == AJ_VARIANT_EFFICIENT ? "efficient" : "flash", aj_dtype_name(c->dtype),
             c->d, tensors, c->mask, mod, c->sinks ? "  sinks = snk\n" : "", dropout);
    return bwd_parse(ctx, spec, label);
}

static aj_kernel *compile(const aj_op *op, const char *label)
{
    return bwd_compile(ctx, dev, op, label);
}

static void check_error(const char *label, const char *what, const double *got, const double *want,
                        size_t n, aj_dtype dtype)
{
    double err = norm_error(got, want, n, dtype);
    CHECK_MSG(err <= 1.0, "%s: %s error %.3g of the tolerance", label, what, err);
}

/* The side tensors as f32 (a 16-bit one widened exactly, into mem[t]),
 * which a finite difference can move by less than a 16-bit ulp. */
static void widen_side(const aj_side_tensor *in, int n, aj_side_tensor *out, float **mem)
{
    for (int t = 0; t < n; t++) {
        out[t] = in[t];
        mem[t] = NULL;
        if (aj_side_dtype_bytes(in[t].dtype) == 4)
            continue;
        size_t count = 1;
        for (int d = 0; d < in[t].rank; d++)
            count *= (size_t)in[t].shape[d];   /* side_make's: contiguous */
        mem[t] = malloc(count * sizeof(float));
        CHECK(aj_convert(in[t].data, in[t].dtype == AJ_SIDE_F16 ? AJ_DTYPE_F16 : AJ_DTYPE_BF16,
                         mem[t], AJ_DTYPE_F32, count) == AJ_OK);
        out[t].data = mem[t];
        out[t].dtype = AJ_SIDE_F32;
    }
}

/* The reference's loss sum(O dO) with element e of side tensor t moved by
 * delta (the f32 data: delta is a power of two). */
static double ref_loss(ref_problem p, const aj_side_tensor *host, int t, int64_t e, float delta,
                       const tensor *q, const tensor *k, const tensor *v, const tensor *dout)
{
    float *data = (float *)host[t].data, saved = data[e];
    data[e] += delta;
    double *o = calloc(dout->n + 1, sizeof(double));
    ref_forward(&p, q->ref, k->ref, v->ref, o, NULL);
    data[e] = saved;
    double loss = 0;
    for (size_t i = 0; i < dout->n; i++)
        loss += o[i] * dout->ref[i];
    free(o);
    return loss;
}

/* One backward launch with outputs dside[0 .. count - 1], on `workers`
 * threads (0: the device's default). */
static bool run_dside(aj_kernel *bk, aj_bwd_args ba, const aj_side_tensor *dside, int count,
                      int workers, const char *label)
{
    if (workers)
        CHECK(aj_device_set_workers(dev, workers) == AJ_OK);
    ba.dside = dside;
    ba.num_dside = count;
    aj_status st = aj_backward(ctx, dev, bk, &ba);
    CHECK_MSG(st == AJ_OK, "%s: %s", label, aj_last_error(ctx));
    if (workers)
        CHECK(aj_device_set_workers(dev, 0) == AJ_OK);
    return st == AJ_OK;
}

static void run_case(const grad_case *c, const char *label)
{
    aj_op *fop = case_op(c, AJ_KIND_FORWARD, label), *bop = case_op(c, AJ_KIND_BACKWARD, label);
    aj_kernel *bk = compile(bop, label);
    if (!fop || !bk)
        goto out_ops;
    /* the reference's tensors (built-in alibi: its slopes first, which
     * the backward takes as alibi_slopes) */
    aj_op_info info;
    CHECK(aj_op_get_info(fop, &info) == AJ_OK);
    uint64_t rng = 77 + (uint64_t)cases;
    side_data host;
    side_make(&info, c->b, c->hq, c->sq, rng, &host);
    aj_side_tensor side[AJ_OP_TENSORS_MAX], dside[AJ_OP_TENSORS_MAX];
    void *dmem[AJ_OP_TENSORS_MAX] = {0};
    tensor gout[AJ_OP_TENSORS_MAX];
    int grads[AJ_OP_TENSORS_MAX], ngrad = 0;
    for (int t = 0; t < info.num_tensors; t++) {
        size_t bytes = (size_t)aj_side_dtype_bytes(host.t[t].dtype);
        for (int d = 0; d < host.t[t].rank; d++)
            bytes *= (size_t)host.t[t].shape[d];
        side[t] = host.t[t];
        CHECK(aj_device_alloc(dev, bytes, &dmem[t]) == AJ_OK);
        CHECK(aj_device_copy_to(dev, dmem[t], host.t[t].data, bytes) == AJ_OK);
        side[t].data = dmem[t];
        bool g = false;
        CHECK(aj_op_get_tensor_grad(fop, t, &g) == AJ_OK);
        if (!g)
            continue;
        tensor_make(&gout[ngrad], dev, AJ_DTYPE_F32, host.t[t].rank, host.t[t].shape);
        poison(&gout[ngrad]);   /* every element must be written */
        dside[ngrad] = host.t[t];
        dside[ngrad].data = gout[ngrad].t.data;
        dside[ngrad].dtype = AJ_SIDE_F32;   /* whatever the tensor's */
        if (c->builtin_alibi == ALIBI_FIELD && t == 0)
            dside[ngrad].name = "alibi_slopes";
        grads[ngrad++] = t;
    }

    /* padded: BHSD, LSE [B, Hq, Sq]; varlen: THD packed over the
     * sequences, LSE [Hq, Tq] */
    int32_t cu_q[SEQS_MAX + 1] = {0}, cu_k[SEQS_MAX + 1] = {0};
    for (int s = 0; c->lens_q && s < c->b; s++)
        cu_q[s + 1] = cu_q[s] + c->lens_q[s], cu_k[s + 1] = cu_k[s] + c->lens_k[s];
    const int rank = c->lens_q ? 3 : 4;
    const int64_t(*shapes)[4] = c->lens_q
        ? (const int64_t[3][4]){{cu_q[c->b], c->hq, c->d}, {cu_k[c->b], c->hkv, c->d},
                                {c->hq, cu_q[c->b]}}
        : (const int64_t[3][4]){{c->b, c->hq, c->sq, c->d}, {c->b, c->hkv, c->sk, c->d},
                                {c->b, c->hq, c->sq}};
    tensor q, k, v, o, dout, lse, dq, dk, dv;
    tensor *const rows_q[] = {&q, &o, &dout, &dq}, *const rows_k[] = {&k, &v, &dk, &dv};
    for (int i = 0; i < 4; i++) {
        tensor_make(rows_q[i], dev, c->dtype, rank, shapes[0]);
        tensor_make(rows_k[i], dev, c->dtype, rank, shapes[1]);
    }
    tensor_make(&lse, dev, AJ_DTYPE_F32, rank - 1, shapes[2]);
    fill(&q, 1.5, &rng);
    fill(&k, 1.5, &rng);
    fill(&v, 1.0, &rng);
    fill(&dout, 1.0, &rng);
    ref_problem p = ref_problem_of(c->b, c->hq, c->hkv, c->sq, c->sk, c->d, c->d);
    void *dcu[2] = {NULL, NULL};
    if (c->lens_q) {
        p.cu_q = cu_q, p.cu_k = cu_k;
        CHECK(aj_device_alloc(dev, sizeof cu_q, &dcu[0]) == AJ_OK);
        CHECK(aj_device_alloc(dev, sizeof cu_k, &dcu[1]) == AJ_OK);
        CHECK(aj_device_copy_to(dev, dcu[0], cu_q, sizeof cu_q) == AJ_OK);
        CHECK(aj_device_copy_to(dev, dcu[1], cu_k, sizeof cu_k) == AJ_OK);
    }
    ref_mask(c->mask, &p);
    ref_use_expressions(&p, fop, host.t, info.num_tensors);
    double sinks[64];
    if (c->sinks) {   /* the last tensor */
        const float *logits = host.t[info.num_tensors - 1].data;
        for (int h = 0; h < c->hq; h++)
            sinks[h] = logits[h];
        p.sinks = sinks;
    }
    tensor bias = {0}, dbias = {0};
    if (c->bias) {   /* broadcast over the batch */
        const int64_t bs[4] = {1, c->hq, c->sq, c->sk};
        tensor_make(&bias, dev, c->dtype, 4, bs);
        tensor_make(&dbias, dev, AJ_DTYPE_F32, 4, bs);
        fill(&bias, 2.0, &rng);
        poison(&dbias);
        p.bias = bias.ref;
        memcpy(p.bias_shape, bs, sizeof p.bias_shape);
    }
    p.dropout_p = c->dropout;   /* the backward's stream is the reference's */
    p.seed = 0x5eed0000u + (uint64_t)cases;
    p.offset = (uint64_t)cases << 33 | 12;
    ref_forward(&p, q.ref, k.ref, v.ref, o.ref, lse.ref);
    double *o_exact = malloc((o.n + 1) * sizeof(double)), *lse_exact = malloc((lse.n + 1) * 8);
    memcpy(o_exact, o.ref, o.n * sizeof(double));
    memcpy(lse_exact, lse.ref, lse.n * sizeof(double));
    store_rounded(&o);
    store_rounded(&lse);

    aj_bwd_args ba = AJ_BWD_ARGS_INIT;
    ba.q = q.t, ba.k = k.t, ba.v = v.t, ba.o = o.t, ba.lse = lse.t;
    ba.do_ = dout.t, ba.dq = dq.t, ba.dk = dk.t, ba.dv = dv.t;
    ba.side = side, ba.num_side = info.num_tensors;
    if (c->builtin_alibi == ALIBI_FIELD) {   /* slopes: side[0] as a tensor */
        ba.alibi_slopes = (aj_tensor){(void *)side[0].data, AJ_DTYPE_F32, 1, {c->hq}, {1}};
        ba.side = side + 1, ba.num_side = info.num_tensors - 1;
    }
    ba.seed = p.seed, ba.offset = p.offset;
    if (c->bias)
        ba.bias = bias.t, ba.dbias = dbias.t;
    if (c->lens_q) {
        ba.cu_seqlens_q = dcu[0], ba.cu_seqlens_k = dcu[1];
        ba.batch = c->b, ba.max_seqlen_q = c->sq, ba.max_seqlen_k = c->sk;
    }
    if (!run_dside(bk, ba, dside, ngrad, 0, label))
        goto out;
    const size_t n_all = q.n + k.n + v.n + dbias.n;
    double *want = malloc(sizeof(double) * (n_all + 4));
    double *got = malloc(sizeof(double) * (n_all + 4));
    ref_backward(&p, q.ref, k.ref, v.ref, o.ref, lse.ref, dout.ref, want, want + q.n,
                 want + q.n + k.n, c->bias ? want + q.n + k.n + v.n : NULL);
    read_back(&dq, got);
    read_back(&dk, got + q.n);
    read_back(&dv, got + q.n + k.n);
    check_error(label, "dq", got, want, q.n, c->dtype);
    check_error(label, "dk", got + q.n, want + q.n, k.n, c->dtype);
    check_error(label, "dv", got + q.n + k.n, want + q.n + k.n, v.n, c->dtype);
    if (c->bias) {   /* dbias beside the side tensors' gradients */
        read_back(&dbias, got + q.n + k.n + v.n);
        check_error(label, "dbias", got + q.n + k.n + v.n, want + q.n + k.n + v.n, dbias.n,
                    c->dtype == AJ_DTYPE_BF16 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16);
    }
    free(want);
    free(got);

    double *first[AJ_OP_TENSORS_MAX];
    for (int x = 0; x < ngrad; x++) {
        int t = grads[x];
        size_t n = gout[x].n;
        double *want_g = malloc((n + 1) * sizeof(double));
        first[x] = malloc((n + 1) * sizeof(double));
        ref_side_grad(&p, q.ref, k.ref, v.ref, o.ref, lse.ref, dout.ref, t, want_g);
        read_back(&gout[x], first[x]);
        char what[64];
        snprintf(what, sizeof what, "d%s", info.tensors[t].name);
        /* sums of many terms: the f16 rows' tolerance, bf16's for bf16 */
        check_error(label, what, first[x], want_g, n,
                    c->dtype == AJ_DTYPE_BF16 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16);
        if (c->fd && x == 0) {
            /* the reference's own derivative against its loss, from the
             * unrounded O and LSE */
            ref_side_grad(&p, q.ref, k.ref, v.ref, o_exact, lse_exact, dout.ref, t, want_g);
            aj_side_tensor wide[AJ_OP_TENSORS_MAX];
            float *wmem[AJ_OP_TENSORS_MAX];
            widen_side(host.t, info.num_tensors, wide, wmem);
            ref_problem pw = p;
            ref_use_expressions(&pw, fop, wide, info.num_tensors);
            for (int64_t e = 0; e < (int64_t)n && e < 3; e++) {
                const float h = 0x1p-9f;
                double fd = (ref_loss(pw, wide, t, e, h, &q, &k, &v, &dout) -
                             ref_loss(pw, wide, t, e, -h, &q, &k, &v, &dout)) / (2.0 * h);
                CHECK_MSG(fabs(fd - want_g[e]) <= 2e-4 * (1 + fabs(fd)),
                          "%s: d%s[%lld] %.9g, finite difference %.9g", label,
                          info.tensors[t].name, (long long)e, want_g[e], fd);
            }
            for (int w = 0; w < info.num_tensors; w++)
                free(wmem[w]);
        }
        free(want_g);
    }
    /* the same bits again, and on other thread counts (sim, which runs a
     * launch slowly: on 2) */
    const int workers[3] = {2, 1, 3};
    const int reruns = aj_device_target(dev) == AJ_TARGET_CPU ? 3 : 1;
    for (int w = 0; w < reruns; w++) {
        for (int x = 0; x < ngrad; x++)
            poison(&gout[x]);
        if (!run_dside(bk, ba, dside, ngrad, workers[w], label))
            break;
        for (int x = 0; x < ngrad; x++) {
            double *again = malloc((gout[x].n + 1) * sizeof(double));
            read_back(&gout[x], again);
            CHECK_MSG(memcmp(first[x], again, gout[x].n * sizeof(double)) == 0,
                      "%s: d%s differs on %d workers", label, info.tensors[grads[x]].name,
                      workers[w]);
            free(again);
        }
    }
    for (int x = 0; x < ngrad; x++)
        free(first[x]);
    cases++;
out:
    free(o_exact);
    free(lse_exact);
    tensor *all[] = {&q, &k, &v, &o, &dout, &lse, &dq, &dk, &dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tensor_release(all[i]);
    if (c->bias) {
        tensor_release(&bias);
        tensor_release(&dbias);
    }
    aj_device_free(dev, dcu[0]);
    aj_device_free(dev, dcu[1]);
    for (int t = 0; t < info.num_tensors; t++)
        aj_device_free(dev, dmem[t]);
    for (int x = 0; x < ngrad; x++)
        tensor_release(&gout[x]);
    side_free(&host);
out_ops:
    aj_kernel_destroy(bk);
    aj_op_destroy(bop);
    aj_op_destroy(fop);
}

/* Case n of the sweep: every score_mod x variant x mask, the dtype, GQA
 * ratio, head dim and lengths cycling so that each meets every mask. */
static grad_case sweep_case(int n, int dtypes)
{
    static const aj_dtype order[3] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};
    const int nmasks = (int)(sizeof masks / sizeof masks[0]), mk = n % nmasks;
    const int var = n / nmasks % 2, m = n / nmasks / 2;
    return (grad_case){
        .variant = var ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH,
        .dtype = order[n % dtypes],
        .name = mods[m].name,
        .mask = masks[mk],
        .tensors = mods[m].tensors,
        .mod = mods[m].mod,
        .d = dims[n % NDIMS],
        .b = 2,
        .hq = 4,
        .hkv = n % 2 ? 2 : 4,
        .sq = 9 + n % 3 * 10,
        .sk = 23 - n % 2 * 8,
        .fd = mk == 0 && var == 0,
        /* ALiBi's built-ins with every other mask, its two slopes in turn */
        .builtin_alibi = !mods[m].builtin || mk % 2 == 0 ? ALIBI_EXPR
                         : mk == 1 ? ALIBI_FIELD : ALIBI_NAMED,
        .builtin = mods[m].builtin,
        .sinks = n % 5 == 3,
        .dropout = n % 7 == 4 ? 0.25 : 0.0,
        .bias = var == 1 && n % 3 == 0,
        .side = mods[m].builtin ? AJ_SIDE_F32 : (aj_side_dtype[3]){AJ_SIDE_F32, AJ_SIDE_BF16,
                                                                   AJ_SIDE_F16}[n / 2 % 3],
    };
}

static void test_sweep(void)
{
    const int cpu = aj_device_target(dev) == AJ_TARGET_CPU;
    const int count = (int)(sizeof mods / sizeof mods[0] * 2 * (sizeof masks / sizeof masks[0]));
    for (int n = 0; n < count; n++) {
        grad_case c = sweep_case(n, cpu ? 3 : 2);   /* f32: the cpu's */
        if (!check_sampled())
            continue;
        char label[256];
        snprintf(label, sizeof label, "%s%s (%s) %s %s d%d %s hq%d/%d%s%s%s",
                 c.builtin_alibi == ALIBI_FIELD ? "built-in " :
                 c.builtin_alibi == ALIBI_NAMED ? "built-in named " : "", c.name,
                 aj_side_dtype_names[c.side], aj_variant_name(c.variant),
                 aj_dtype_name(c.dtype), c.d, c.mask, c.hq, c.hkv,
                 c.sinks ? " sinks" : "", c.dropout > 0 ? " dropout" : "",
                 c.bias ? " bias" : "");
        run_case(&c, label);
    }
}

/* Random score_mods (score_cases.h) over tf, which is grad, and ti. */
static void test_random(void)
{
    const int cpu = aj_device_target(dev) == AJ_TARGET_CPU;
    const int count = check_sample_count(cpu ? 24 : 12);
    for (int i = 0; i < count; i++) {
        rx_tree t;
        int root = rx_case_tree(&t, 0x51de, 2 * i + 1);
        char field[8192], body[8192];
        rx_expression(&t, root, true, field, sizeof field);
        /* rx_expression's expr(...) around the body: the case takes the body */
        snprintf(body, sizeof body, "%.*s", (int)strlen(field) - 6, field + 5);
        grad_case c = {
            .variant = i % 2 ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH,
            .dtype = cpu && i % 3 == 0 ? AJ_DTYPE_F32 : AJ_DTYPE_F16,
            .mask = masks[i % 4],
            .tensors = "(ti: i32[2], tf: f32[1] grad)",
            .mod = body,
            .d = 32,
            .b = 2,
            .hq = 2,
            .hkv = 1,
            .sq = 11 + i % 3 * 6,
            .sk = 17,
        };
        char label[9000];
        snprintf(label, sizeof label, "random %d %s %s: %s", i, aj_variant_name(c.variant),
                 c.mask, body);
        run_case(&c, label);
    }
}

/* What is refused, with its message. */
/* spec parses and its compile is AJ_ERR_UNSUPPORTED with `needle`. */
static void check_unsupported(const char *spec, const char *needle)
{
    aj_op *op = NULL;
    CHECK(aj_op_parse(ctx, spec, strlen(spec), "unsupported", &op) == AJ_OK);
    aj_kernel *k = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, needle);
    aj_op_destroy(op);
}

/* dside "alibi_slopes": refused where the op's slopes are not grad, and
 * checked against alibi_slopes' shape where they are. */
static void test_alibi_errors(void)
{
    static const char *const specs[2] = {
        "attention backward efficient { dtype = f16 head_dim = 32 score_mod = alibi }",
        "attention backward efficient { dtype = f16 head_dim = 32 score_mod = alibi(grad) }"};
    tensor q, k, v, o, dout, lse, dq, dk, dv, slopes, dslopes;
    int64_t qs[4] = {1, 2, 8, 32};
    tensor *all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    for (int i = 0; i < 8; i++)
        tensor_make(all[i], dev, AJ_DTYPE_F16, 4, qs);
    tensor_make(&lse, dev, AJ_DTYPE_F32, 3, (int64_t[]){1, 2, 8});
    tensor_make(&slopes, dev, AJ_DTYPE_F32, 1, (int64_t[]){2});
    tensor_make(&dslopes, dev, AJ_DTYPE_F32, 1, (int64_t[]){3});
    aj_bwd_args ba = AJ_BWD_ARGS_INIT;
    ba.q = q.t, ba.k = k.t, ba.v = v.t, ba.o = o.t, ba.lse = lse.t;
    ba.do_ = dout.t, ba.dq = dq.t, ba.dk = dk.t, ba.dv = dv.t, ba.alibi_slopes = slopes.t;
    aj_side_tensor d = {"alibi_slopes", dslopes.t.data, AJ_SIDE_F32, 1, {3}, {1}};
    ba.dside = &d, ba.num_dside = 1;
    static const char *const needles[2] = {"alibi's slopes are not declared grad",
                                           "has shape[0] = 3; want 2"};
    for (int i = 0; i < 2; i++) {
        aj_op *op = bwd_parse(ctx, specs[i], "alibi errors");
        aj_kernel *bk = compile(op, "alibi errors");
        if (bk) {
            CHECK_STATUS(ctx, aj_backward(ctx, dev, bk, &ba), AJ_ERR_INVALID_ARG);
            CHECK_ERROR(ctx, needles[i]);
        }
        aj_kernel_destroy(bk);
        aj_op_destroy(op);
    }
    for (int i = 0; i < 8; i++)
        tensor_release(all[i]);
    tensor_release(&lse);
    tensor_release(&slopes);
    tensor_release(&dslopes);
}

static void test_errors(void)
{
    static const struct {
        const char *spec, *needle;
        aj_status st;
    } bad[] = {
        {"attention backward flash { dtype = f16 head_dim = 32 tensors = (t: i32[1] grad) "
         "score_mod = expr(score + t[0]) }", "only a float tensor (f32, f16, bf16) has a "
         "gradient", AJ_ERR_VERIFY},
        {"attention backward flash { dtype = f16 head_dim = 32 tensors = (s: f32[1] grad) "
         "sinks = s }", "dsinks", AJ_ERR_VERIFY},
        {"attention backward flash { dtype = f16 head_dim = 32 tensors = (t: f32[1] gard) }",
         "'grad', ',' or ')'", AJ_ERR_PARSE},
        {"attention backward flash { dtype = f16 head_dim = 32 score_mod = alibi(grd) }",
         "alibi(grd): no side tensor of that name", AJ_ERR_VERIFY},
        {"attention backward flash { dtype = f16 head_dim = 32 score_mod = alibi(3) }",
         "expected grad or a tensor name (alibi(grad)", AJ_ERR_PARSE},
        {"attention backward flash { dtype = f16 head_dim = 32 tensors = (s: i32[1]) "
         "score_mod = alibi(s) }", "alibi(s): the slopes are f32[1]", AJ_ERR_VERIFY},
        {"attention backward flash { dtype = f16 head_dim = 32 score_mod = softcap(5) + none }",
         "expected alibi (softcap(C) + alibi", AJ_ERR_PARSE},
        {"attention backward flash { dtype = f16 head_dim = 32 score_mod = softcap(0) + alibi }",
         "softcap 0 is out of range", AJ_ERR_VERIFY},
        {"attention backward flash { dtype = f16 head_dim = 32 score_mod = alibi(grad }",
         "')' after alibi(grad", AJ_ERR_PARSE},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        aj_op *op = NULL;
        CHECK_STATUS(ctx, aj_op_parse(ctx, bad[i].spec, strlen(bad[i].spec), "bad", &op),
                     bad[i].st);
        CHECK_ERROR(ctx, bad[i].needle);
        aj_op_destroy(op);
    }
    /* one load more than the gradient stages take (test_loads takes them
     * all) */
    char spec[4600];
    snprintf(spec, sizeof spec, "attention backward efficient { dtype = f32 head_dim = 32 "
             "tensors = (rb: f32[1] grad) score_mod = expr(%s) }",
             loads_mod(AJ_GRAD_LOADS_MAX + 1));
    check_unsupported(spec, "reads grad tensors at more than 32 places");
    /* the builder: set, read back, print, parse back */
    aj_op *op = NULL;
    CHECK(aj_op_create(ctx, AJ_KIND_BACKWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_declare_tensor(op, "rb", AJ_SIDE_F32, 1) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_tensor_grad(op, "nope", true), AJ_ERR_INVALID_ARG);
    aj_op_destroy(op);
    CHECK(aj_op_create(ctx, AJ_KIND_BACKWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_declare_tensor(op, "rb", AJ_SIDE_F32, 1) == AJ_OK);
    CHECK(aj_op_set_tensor_grad(op, "rb", true) == AJ_OK);
    bool g = false;
    CHECK(aj_op_get_tensor_grad(op, 0, &g) == AJ_OK && g);
    CHECK_STATUS(ctx, aj_op_get_tensor_grad(op, 1, &g), AJ_ERR_INVALID_ARG);
    char *text = NULL;
    CHECK(aj_op_print(op, &text) == AJ_OK && strstr(text, "rb: f32[1] grad") != NULL);
    aj_op *back = NULL;
    CHECK(text && aj_op_parse(ctx, text, strlen(text), "printed", &back) == AJ_OK);
    g = false;
    CHECK(back && aj_op_get_tensor_grad(back, 0, &g) == AJ_OK && g);
    aj_op_destroy(back);
    aj_free(text);
    aj_op_destroy(op);
    /* alibi(grad): only on alibi, cleared with the score_mod, printed */
    CHECK(aj_op_create(ctx, AJ_KIND_BACKWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_alibi_grad(op, true), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "the score_mod is none; only alibi's slopes");
    CHECK(aj_op_set_alibi(op) == AJ_OK && aj_op_set_tensor_grad(op, "alibi_slopes", true) == 0);
    CHECK(aj_op_get_alibi_grad(op, &g) == AJ_OK && g);
    CHECK(aj_op_print(op, &text) == AJ_OK && strstr(text, "score_mod = alibi(grad)") != NULL);
    CHECK(text && aj_op_parse(ctx, text, strlen(text), "printed", &back) == AJ_OK);
    g = false;
    CHECK(back && aj_op_get_alibi_grad(back, &g) == AJ_OK && g);
    aj_op_destroy(back);
    aj_free(text);
    CHECK(aj_op_set_alibi(op) == AJ_OK && aj_op_get_alibi_grad(op, &g) == AJ_OK && !g);
    /* alibi(NAME) after a softcap: the setter, the info, the text both
     * ways; its gradient is the tensor's, not alibi(grad)'s */
    CHECK_STATUS(ctx, aj_op_set_alibi_with(op, "sl", 5.0), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "alibi(sl): no side tensor of that name is declared");
    CHECK(aj_op_declare_tensor(op, "sl", AJ_SIDE_F32, 1) == AJ_OK &&
          aj_op_set_tensor_grad(op, "sl", true) == AJ_OK &&
          aj_op_set_alibi_with(op, "sl", 5.0) == AJ_OK);
    aj_op_info info;
    CHECK(aj_op_get_info(op, &info) == AJ_OK && info.score_mod == AJ_SCORE_MOD_ALIBI &&
          info.softcap == 5.0 && info.alibi_tensor == 0);
    CHECK_STATUS(ctx, aj_op_set_alibi_grad(op, true), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "the slopes of alibi(sl) are a side tensor");
    CHECK(aj_op_print(op, &text) == AJ_OK &&
          strstr(text, "score_mod = softcap(5.0) + alibi(sl)") != NULL);
    CHECK(text && aj_op_parse(ctx, text, strlen(text), "printed", &back) == AJ_OK);
    CHECK(back && aj_op_get_info(back, &info) == AJ_OK && info.softcap == 5.0 &&
          info.alibi_tensor == 0);
    aj_op_destroy(back);
    aj_free(text);
    CHECK_STATUS(ctx, aj_op_set_alibi_with(op, NULL, -2.0), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "softcap -2.0 is out of range");
    CHECK(aj_op_set_alibi_with(op, "", 0) == AJ_OK && aj_op_get_info(op, &info) == AJ_OK &&
          info.alibi_tensor == -1 && info.softcap == 0);
    aj_op_destroy(op);

    /* launch arguments */
    grad_case c = {.variant = AJ_VARIANT_EFFICIENT, .dtype = AJ_DTYPE_F16, .mask = "none",
                   .tensors = "(rb: f32[1] grad, w: f32[1])",
                   .mod = "score + rb[abs(q - k)] * w[0]",
                   .d = 32, .b = 1, .hq = 2, .hkv = 2, .sq = 8, .sk = 8};
    aj_op *bop = case_op(&c, AJ_KIND_BACKWARD, "errors");
    aj_kernel *bk = compile(bop, "errors");
    tensor q, k, v, o, dout, lse, dq, dk, dv;
    int64_t qs[4] = {1, 2, 8, 32};
    tensor *all[] = {&q, &k, &v, &o, &dout, &dq, &dk, &dv};
    for (int i = 0; i < 8; i++)
        tensor_make(all[i], dev, c.dtype, 4, qs);
    tensor_make(&lse, dev, AJ_DTYPE_F32, 3, (int64_t[]){1, 2, 8});
    void *data = NULL, *gdata = NULL;
    CHECK(aj_device_alloc(dev, 64 * 4, &data) == AJ_OK);
    CHECK(aj_device_alloc(dev, 64 * 4, &gdata) == AJ_OK);
    aj_side_tensor side[2] = {{"rb", data, AJ_SIDE_F32, 1, {16}, {1}},
                              {"w", data, AJ_SIDE_F32, 1, {4}, {1}}};
    aj_bwd_args ba = AJ_BWD_ARGS_INIT;
    ba.q = q.t, ba.k = k.t, ba.v = v.t, ba.o = o.t, ba.lse = lse.t;
    ba.do_ = dout.t, ba.dq = dq.t, ba.dk = dk.t, ba.dv = dv.t;
    ba.side = side, ba.num_side = 2;
    static const struct {
        aj_side_tensor d;
        const char *needle;
    } wrong[] = {
        {{"w", NULL, AJ_SIDE_F32, 1, {4}, {1}}, "tensor 'w' is not declared grad"},
        {{"zz", NULL, AJ_SIDE_F32, 1, {4}, {1}}, "is not a tensor the op declares"},
        {{"rb", NULL, AJ_SIDE_F32, 1, {15}, {1}}, "has shape[0] = 15; want 16"},
        {{"rb", NULL, AJ_SIDE_I32, 1, {16}, {1}}, "want f32[1]"},
        {{"rb", NULL, AJ_SIDE_F32, 1, {16}, {0}}, "make two elements one place"},
        {{"rb", NULL, AJ_SIDE_F32, 1, {16}, {-1}}, "want 0 or more"},
    };
    for (size_t i = 0; bk && i < sizeof wrong / sizeof wrong[0]; i++) {
        aj_side_tensor d = wrong[i].d;
        d.data = gdata;
        ba.dside = &d, ba.num_dside = 1;
        CHECK_STATUS(ctx, aj_backward(ctx, dev, bk, &ba), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, wrong[i].needle);
    }
    /* the same tensor twice; sums past the limit (the shape alone decides:
     * nothing is launched) */
    aj_side_tensor twice[2] = {{"rb", gdata, AJ_SIDE_F32, 1, {16}, {1}},
                               {"rb", gdata, AJ_SIDE_F32, 1, {16}, {1}}};
    ba.dside = twice, ba.num_dside = 2;
    if (bk) {
        CHECK_STATUS(ctx, aj_backward(ctx, dev, bk, &ba), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, "both name 'rb'");
    }
    aj_side_tensor huge[2] = {{"rb", data, AJ_SIDE_F32, 1, {(int64_t)1 << 29}, {1}}, side[1]};
    aj_side_tensor dhuge = huge[0];
    dhuge.data = gdata;
    ba.side = huge, ba.dside = &dhuge, ba.num_dside = 1;
    size_t bytes = 0;
    if (bk) {
        CHECK_STATUS(ctx, aj_backward_workspace_size(ctx, bk, &ba, &bytes), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, "partial sums");
        /* a small one: the sums are in the workspace size */
        ba.side = side, ba.dside = twice, ba.num_dside = 1;
        size_t without = 0;
        aj_bwd_args none = ba;
        none.num_dside = 0;
        CHECK(aj_backward_workspace_size(ctx, bk, &none, &without) == AJ_OK);
        CHECK(aj_backward_workspace_size(ctx, bk, &ba, &bytes) == AJ_OK);
        CHECK_MSG(bytes >= without + 2 * 16 * 4, "workspace %zu with dside, %zu without", bytes,
                  without);
    }
    for (int i = 0; i < 8; i++)
        tensor_release(all[i]);
    tensor_release(&lse);
    aj_device_free(dev, data);
    aj_device_free(dev, gdata);
    aj_kernel_destroy(bk);
    aj_op_destroy(bop);
    test_alibi_errors();
}

/* A grad tensor read at the 32 places the stages take, on each variant
 * (its terms fill a step's shared memory: one row per step on sim). */
static void test_loads(void)
{
    for (int var = 0; var < 2; var++) {
        if (!check_sampled())
            continue;
        grad_case c = sweep_case(var ? 4 : 8, 2);   /* mask none; dropout, sinks */
        c.name = "32 loads";
        c.tensors = "(rb: f32[1] grad)";
        c.mod = loads_mod(AJ_GRAD_LOADS_MAX);
        c.fd = false;   /* its curvature is the finite difference's error */
        char label[128];
        snprintf(label, sizeof label, "32 loads %s %s d%d%s%s", aj_variant_name(c.variant),
                 aj_dtype_name(c.dtype), c.d, c.sinks ? " sinks" : "",
                 c.dropout > 0 ? " dropout" : "");
        run_case(&c, label);
    }
}

/* layout = varlen: sequences of 5, 0, 13 and 1 queries (9, 3, 13 and 1
 * keys), b the sequence and a part's rows its own; four score_mods,
 * causal(bottom_right) per sequence; flash on sim and cpu, efficient on
 * cpu (sim's efficient backward has no varlen). */
static void test_varlen(void)
{
    static const int lens_q[4] = {5, 0, 13, 1}, lens_k[4] = {9, 3, 13, 1};
    const int cpu = aj_device_target(dev) == AJ_TARGET_CPU;
    for (int m = 0; m < 4; m++)
        for (int var = 0; var < (cpu ? 2 : 1); var++) {
            if (!check_sampled())
                continue;
            grad_case c = sweep_case(m * 8 + var * 4 + 1, cpu ? 3 : 2);
            c.b = 4, c.sq = 13, c.sk = 13;
            c.lens_q = lens_q, c.lens_k = lens_k;
            c.bias = false, c.fd = false;
            char label[256];
            snprintf(label, sizeof label, "varlen %s %s %s d%d %s hq%d/%d%s%s", c.name,
                     aj_variant_name(c.variant), aj_dtype_name(c.dtype), c.d, c.mask, c.hq,
                     c.hkv, c.sinks ? " sinks" : "", c.dropout > 0 ? " dropout" : "");
            run_case(&c, label);
        }
}

/* A score_mod of about 1500 nodes with its derivative, which the kernels
 * call instead of inlining at every element (score_emit.c,
 * OUTLINE_NODES): dQ, dK, dV and drb against the reference, both
 * variants (sim: flash). */
static void test_outlined(void)
{
    static char mod[8192];
    int at = snprintf(mod, sizeof mod, "score + rb[abs(q - k) %% 9] + 0.02 * (");
    for (int t = 0; t < 110; t++)
        at += snprintf(mod + at, sizeof mod - (size_t)at, "%stanh(score * w[%d])", t ? " + " : "",
                       t % 7);
    snprintf(mod + at, sizeof mod - (size_t)at, ")");
    const int cpu = aj_device_target(dev) == AJ_TARGET_CPU;
    for (int var = 0; var < (cpu ? 2 : 1); var++) {
        grad_case c = {.variant = var ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH,
                       .dtype = AJ_DTYPE_F16, .name = "outlined", .mask = masks[1],
                       .tensors = "(rb: f32[1] grad, w: f32[1])", .mod = mod, .d = 32, .b = 2,
                       .hq = 2, .hkv = 1, .sq = 19, .sk = 23};
        char label[64];
        snprintf(label, sizeof label, "outlined program, %s", aj_variant_name(c.variant));
        run_case(&c, label);
    }
}

static void (*const tests[])(void) = {test_sweep, test_random, test_loads, test_varlen,
                                      test_outlined, test_errors, NULL};

int main(int argc, char **argv)
{
    const test_main_args m = {AJ_DEVICE_SIM, &ctx, &dev, tests, &cases, NULL};
    return test_main(argc, argv, &m);
}
