/*
 * test_ref.c -- the float64 reference of tests/lib/ref.c, checked against hand
 * computation, against itself rearranged (offsets, shards, GQA, varlen,
 * bias broadcast, merge), against finite differences (backward), and
 * against published Philox known answers and keep-rate statistics
 * (dropout).  Every other numeric test trusts this oracle, so each property
 * here is one a wrong reference would fail.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ir/op.h"
#include "ref.h"
#include "splitmix.h"

/* ---------------------------------------------------------------- helpers */

/* the state of the inputs' generator (splitmix.h) */
static uint64_t rng_state = 0x5eed5eed5eed5eedull;

/* uniform in [-amp, amp) */
static double urand(double amp)
{
    return amp * (ldexp((double)(splitmix_next(&rng_state) >> 11), -53) * 2.0 - 1.0);
}

static double *zeros(int64_t n)
{
    double *x = calloc((size_t)(n > 0 ? n : 1), sizeof *x);
    if (!x) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return x;
}

static double *randoms(int64_t n, double amp)
{
    double *x = zeros(n);
    for (int64_t e = 0; e < n; e++)
        x[e] = urand(amp);
    return x;
}

/* Largest |a - b|; equal infinities (an LSE of -inf) count as no difference. */
static double max_diff(const double *a, const double *b, int64_t n)
{
    double worst = 0.0;
    for (int64_t e = 0; e < n; e++) {
        if (a[e] == b[e])
            continue;
        double d = fabs(a[e] - b[e]);
        if (!(d <= worst))
            worst = d;  /* also catches NaN and a lone infinity */
    }
    return worst;
}

static double max_abs(const double *a, int64_t n)
{
    double m = 0.0;
    for (int64_t e = 0; e < n; e++)
        m = fmax(m, fabs(a[e]));
    return m;
}

/* Every value finite (no NaN, no inf). */
static bool all_finite(const double *a, int64_t n)
{
    for (int64_t e = 0; e < n; e++)
        if (!isfinite(a[e]))
            return false;
    return true;
}

/* Every LSE finite or -inf (an empty row); never NaN or +inf. */
static bool lse_sane(const double *a, int64_t n)
{
    for (int64_t e = 0; e < n; e++)
        if (!isfinite(a[e]) && a[e] != -INFINITY)
            return false;
    return true;
}

/* Element counts of a problem's tensors, q-side and k-side, row width w. */
static int64_t n_q(const ref_problem *p, int64_t w)
{
    return (p->cu_q ? p->cu_q[p->B] : (int64_t)p->B * p->Sq) * p->Hq * w;
}

static int64_t n_k(const ref_problem *p, int64_t w)
{
    return (p->cu_k ? p->cu_k[p->B] : (int64_t)p->B * p->Sk) * p->Hkv * w;
}

/* The tensors of one problem: random q, k, v; o and lse to be filled. */
typedef struct attn_data {
    double *q, *k, *v, *o, *lse;
} attn_data;

static attn_data make_data(const ref_problem *p, double amp)
{
    return (attn_data){
        .q = randoms(n_q(p, p->D), amp),
        .k = randoms(n_k(p, p->D), amp),
        .v = randoms(n_k(p, p->Dv), 1.0),
        .o = zeros(n_q(p, p->Dv)),
        .lse = zeros(n_q(p, 1)),
    };
}

static void free_data(attn_data *d)
{
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->o);
    free(d->lse);
}

static void forward(const ref_problem *p, attn_data *d)
{
    ref_forward(p, d->q, d->k, d->v, d->o, d->lse);
}

/* Copies n sequence rows of width w, for each of `slices` (b, h) slices of a
 * padded BHSD tensor, from row r_src of a tensor with S_src rows per slice
 * to row r_dst of one with S_dst rows per slice. */
static void copy_rows(double *dst, int64_t S_dst, int64_t r_dst,
                      const double *src, int64_t S_src, int64_t r_src,
                      int64_t slices, int64_t n, int64_t w)
{
    for (int64_t sl = 0; sl < slices; sl++)
        memcpy(dst + (sl * S_dst + r_dst) * w, src + (sl * S_src + r_src) * w,
               (size_t)(n * w) * sizeof *dst);
}

/* ---------------------------------------------------------------- philox */

/* Random123's published known answers for philox4x32_10 (its kat_vectors). */
static void test_philox_known_answers(void)
{
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t n = 0; n < sizeof kat / sizeof kat[0]; n++) {
        uint32_t out[4];
        ref_philox4x32_10(kat[n].ctr, kat[n].key, out);
        for (int w = 0; w < 4; w++)
            CHECK_MSG(out[w] == kat[n].out[w], "KAT %zu word %d: %08x, want %08x",
                      n, w, out[w], kat[n].out[w]);
    }
}

/* ref_dropout_keep follows the documented key / counter layout exactly. */
static void test_dropout_layout(void)
{
    const uint64_t seed = 0x0123456789abcdefull, offset = 0xfedcba9876543210ull;
    const int64_t Hq = 5;
    int agree = 0, total = 0;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t qp = 0; qp < 6; qp++)
                for (int64_t kp = 0; kp < 6; kp++) {
                    uint32_t key[2] = {0x89abcdefu, 0x01234567u ^ 0xfedcba98u};
                    uint32_t ctr[4] = {(uint32_t)(kp + 1000), (uint32_t)(qp + 70),
                                       (uint32_t)(b * Hq + h), 0x76543210u};
                    uint32_t out[4];
                    ref_philox4x32_10(ctr, key, out);
                    double u = (double)(out[0] >> 8) / 16777216.0;
                    for (double p = 0.1; p < 1.0; p += 0.2) {
                        bool want = u >= p;
                        bool got = ref_dropout_keep(seed, offset, b, h, Hq, qp + 70,
                                                    kp + 1000, p);
                        agree += got == want;
                        total++;
                    }
                    /* the boundary: u == p keeps, p just above u drops */
                    agree += ref_dropout_keep(seed, offset, b, h, Hq, qp + 70, kp + 1000, u);
                    agree += !ref_dropout_keep(seed, offset, b, h, Hq, qp + 70, kp + 1000,
                                               nextafter(u, 1.0));
                    total += 2;
                }
    CHECK_MSG(agree == total, "%d of %d keep decisions follow the layout", agree,
              total);
    /* p = 0 keeps everything; b and h enter only as b * Hq + h */
    CHECK(ref_dropout_keep(seed, offset, 3, 1, 4, 9, 9, 0.0));
    int same = 0;
    for (int64_t pos = 0; pos < 64; pos++)
        same += ref_dropout_keep(seed, offset, 1, 0, 4, pos, pos + 1, 0.5) ==
                ref_dropout_keep(seed, offset, 0, 4, 4, pos, pos + 1, 0.5);
    CHECK(same == 64);
}

/* Keep rates within 5 sigma; streams for other seeds, offsets and swapped
 * positions agree only as often as independent coins would. */
static void test_dropout_statistics(void)
{
    const double ps[] = {0.1, 0.5};
    for (size_t n = 0; n < sizeof ps / sizeof ps[0]; n++) {
        double p = ps[n];
        int64_t kept = 0, samples = 0, agree_seed = 0, agree_offset = 0,
                agree_swap = 0;
        for (int64_t b = 0; b < 4; b++)
            for (int64_t h = 0; h < 8; h++)
                for (int64_t qp = 0; qp < 96; qp++)
                    for (int64_t kp = 0; kp < 96; kp++) {
                        bool keep = ref_dropout_keep(42, 7, b, h, 8, qp, kp, p);
                        kept += keep;
                        agree_seed += keep == ref_dropout_keep(43, 7, b, h, 8, qp, kp, p);
                        agree_offset +=
                            keep == ref_dropout_keep(42, 7 + (1ull << 32), b, h, 8, qp, kp, p);
                        agree_swap += keep == ref_dropout_keep(42, 7, b, h, 8, kp, qp, p);
                        samples++;
                    }
        double rate = (double)kept / (double)samples;
        double sigma = sqrt(p * (1.0 - p) / (double)samples);
        CHECK_MSG(fabs(rate - (1.0 - p)) < 5.0 * sigma, "p=%g keep rate %.6f", p, rate);

        /* two independent streams agree with probability p^2 + (1-p)^2;
         * swapped positions repeat on the diagonal (96 of 96*96 per slice) */
        double want = p * p + (1.0 - p) * (1.0 - p);
        double sd = sqrt(want * (1.0 - want) / (double)samples);
        CHECK_MSG(fabs((double)agree_seed / (double)samples - want) < 5.0 * sd,
                  "p=%g seed streams agree %ld", p, (long)agree_seed);
        CHECK_MSG(fabs((double)agree_offset / (double)samples - want) < 5.0 * sd,
                  "p=%g offset streams agree %ld", p, (long)agree_offset);
        double diag = 1.0 / 96.0;
        double want_swap = diag + (1.0 - diag) * want;
        /* each off-diagonal pair is counted twice: twice the variance */
        CHECK_MSG(fabs((double)agree_swap / (double)samples - want_swap) <
                      5.0 * sqrt(2.0) * sd,
                  "p=%g swapped positions agree %ld", p, (long)agree_swap);
    }
}

/* ---------------------------------------------------------------- forward by hand */

/* One query, two keys: o = (e^s0 v0 + e^s1 v1) / (e^s0 + e^s1). */
static void expect_two_keys(const char *what, const ref_problem *p, const double *q,
                            const double *k, double s0, double s1)
{
    const double v[2] = {3.0, -1.0};
    double o = NAN, lse = NAN;
    ref_forward(p, q, k, v, &o, &lse);
    double want_lse = log(exp(s0) + exp(s1));
    double want_o = (3.0 * exp(s0) - 1.0 * exp(s1)) / (exp(s0) + exp(s1));
    CHECK_MSG(fabs(lse - want_lse) < 1e-14, "%s: lse %.17g, want %.17g", what, lse,
              want_lse);
    CHECK_MSG(fabs(o - want_o) < 1e-14, "%s: o %.17g, want %.17g", what, o, want_o);
}

static void test_forward_by_hand(void)
{
    ref_problem p = ref_problem_of(1, 1, 1, 1, 2, 2, 1);
    const double q[2] = {1.0, 0.0};
    const double k[4] = {2.0, 0.0, /**/ 0.0, 5.0};  /* q.k = 2, 0 */

    p.scale = 1.0;
    expect_two_keys("plain", &p, q, k, 2.0, 0.0);

    p.scale = 0.25;
    expect_two_keys("scale", &p, q, k, 0.5, 0.0);

    /* huge scores: exp(1000) overflows unless the row max comes out first */
    p.scale = 500.0;
    const double big_q[2] = {1.0, 1.0}, big_k[4] = {2.0, 0.0, /**/ 0.0, 1.998};
    double o = NAN, lse = NAN;
    const double v[2] = {3.0, -1.0};
    ref_forward(&p, big_q, big_k, v, &o, &lse);
    CHECK(fabs(lse - (1000.0 + log1p(exp(-1.0)))) < 1e-12);
    CHECK(fabs(o - (3.0 - exp(-1.0)) / (1.0 + exp(-1.0))) < 1e-12);

    /* default scale 1/sqrt(D) with D = 4: q.k = 4 -> s = 2 */
    ref_problem p4 = ref_problem_of(1, 1, 1, 1, 2, 4, 1);
    const double q4[4] = {1, 1, 1, 1};
    const double k4[8] = {1, 1, 1, 1, /**/ 0, 0, 0, 0};
    expect_two_keys("default scale", &p4, q4, k4, 2.0, 0.0);

    p.scale = 1.0;
    const double bias[2] = {-1.0, 0.5};
    p.bias = bias;
    p.bias_shape[0] = p.bias_shape[1] = p.bias_shape[2] = 1;
    p.bias_shape[3] = 2;
    expect_two_keys("bias", &p, q, k, 1.0, 0.5);
    p.bias = NULL;

    p.softcap = 1.0;
    expect_two_keys("softcap", &p, q, k, tanh(2.0), 0.0);
    p.softcap = 0.0;

    /* alibi on global positions: q_pos = 3, kv_pos = 2, 3 -> distances 1, 0 */
    const double slope[1] = {0.25};
    p.alibi_slopes = slope;
    p.q_offset = 3;
    p.kv_offset = 2;
    expect_two_keys("alibi", &p, q, k, 2.0 - 0.25, 0.0);

    /* the order: bias, then softcap, then alibi */
    p.bias = bias;
    p.softcap = 2.0;
    expect_two_keys("bias+softcap+alibi", &p, q, k, 2.0 * tanh(0.5) - 0.25,
                    2.0 * tanh(0.25));
    p = ref_problem_of(1, 1, 1, 1, 2, 2, 1);
    p.scale = 1.0;

    /* causal, one query at position 0: only key 0 is visible */
    p.mask = AJ_MASK_CAUSAL;
    ref_forward(&p, q, k, v, &o, &lse);
    CHECK(fabs(o - 3.0) < 1e-15 && fabs(lse - 2.0) < 1e-15);

    /* bottom_right: shift = 2 - 1 = 1, both keys visible */
    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    expect_two_keys("causal bottom_right", &p, q, k, 2.0, 0.0);

    /* window(0, 0) bottom_right: only key 1 */
    p.mask = AJ_MASK_WINDOW;
    ref_forward(&p, q, k, v, &o, &lse);
    CHECK(fabs(o + 1.0) < 1e-15 && fabs(lse - 0.0) < 1e-15);
}

/* ---------------------------------------------------------------- masks */

/*
 * With Dv = Sk and V = identity in every (b, kv head), row i of O is the
 * probability row P_i.  `pattern` has Sq strings of Sk characters, '1' where
 * the key must be visible; checks visibility, rows summing to 1, and that
 * empty rows give O = 0 and LSE = -inf.
 */
static void check_pattern(const char *what, const ref_problem *p0, const char *const *pattern)
{
    ref_problem p = *p0;
    p.Dv = p.Sk;
    attn_data d = make_data(&p, 1.0);
    memset(d.v, 0, (size_t)n_k(&p, p.Dv) * sizeof *d.v);
    for (int64_t sl = 0; sl < (int64_t)p.B * p.Hkv; sl++)
        for (int j = 0; j < p.Sk; j++)
            d.v[(sl * p.Sk + j) * p.Sk + j] = 1.0;
    forward(&p, &d);

    CHECK_MSG(all_finite(d.o, n_q(&p, p.Dv)), "%s: O has NaN/inf", what);
    CHECK_MSG(lse_sane(d.lse, n_q(&p, 1)), "%s: LSE has NaN/+inf", what);
    int bad = 0;
    for (int64_t sl = 0; sl < (int64_t)p.B * p.Hq; sl++)
        for (int i = 0; i < p.Sq; i++) {
            const double *P = d.o + (sl * p.Sq + i) * p.Sk;
            double lse = d.lse[sl * p.Sq + i];
            bool any = strchr(pattern[i], '1') != NULL;
            double sum = 0.0;
            for (int j = 0; j < p.Sk; j++) {
                bool want = pattern[i][j] == '1';
                bad += want ? !(P[j] > 0.0) : P[j] != 0.0;
                sum += P[j];
            }
            if (any)
                bad += !(fabs(sum - 1.0) < 1e-14) || !isfinite(lse);
            else
                bad += sum != 0.0 || lse != -INFINITY;
        }
    CHECK_MSG(bad == 0, "%s: %d entries off the pattern", what, bad);
    free_data(&d);
}

static void test_masks(void)
{
    ref_problem p = ref_problem_of(2, 2, 1, 3, 5, 4, 5);
    static const char *const all[] = {"11111", "11111", "11111"};
    check_pattern("no mask", &p, all);

    p.mask = AJ_MASK_CAUSAL;
    static const char *const causal_tl[] = {"10000", "11000", "11100"};
    check_pattern("causal top_left", &p, causal_tl);

    p.align = AJ_ALIGN_BOTTOM_RIGHT;  /* shift = 5 - 3 = 2 */
    static const char *const causal_br[] = {"11100", "11110", "11111"};
    check_pattern("causal bottom_right", &p, causal_br);

    /* totals override the call's lengths: shift = 4 - 4 = 0 */
    p.sq_total = 4;
    p.sk_total = 4;
    check_pattern("causal bottom_right, totals", &p, causal_tl);
    p.sq_total = p.sk_total = 0;

    p.mask = AJ_MASK_WINDOW;
    p.align = AJ_ALIGN_TOP_LEFT;
    p.window_left = 1;
    p.window_right = 0;
    static const char *const win_tl[] = {"10000", "11000", "01100"};
    check_pattern("window(1,0) top_left", &p, win_tl);

    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    p.window_right = 1;  /* keys i+1 .. i+3 */
    static const char *const win_br[] = {"01110", "00111", "00011"};
    check_pattern("window(1,1) bottom_right", &p, win_br);

    /* a shard: keys at global positions 2..6, queries at 0..2 */
    p.mask = AJ_MASK_CAUSAL;
    p.align = AJ_ALIGN_TOP_LEFT;
    p.kv_offset = 2;
    static const char *const shard[] = {"00000", "00000", "10000"};
    check_pattern("causal, kv_offset 2", &p, shard);

    /* every key far in the future: every row empty */
    p.kv_offset = 100;
    static const char *const none[] = {"00000", "00000", "00000"};
    check_pattern("causal, kv_offset 100", &p, none);

    /* a window that admits nothing through the q_offset */
    p.mask = AJ_MASK_WINDOW;
    p.kv_offset = 0;
    p.q_offset = -50;
    p.window_left = 3;
    p.window_right = 3;
    check_pattern("window, q_offset -50", &p, none);
}

/* Shifting q_offset and kv_offset together changes nothing. */
static void test_offset_invariance(void)
{
    const double slopes[2] = {0.3, 0.7};
    ref_problem p = ref_problem_of(2, 2, 1, 4, 6, 3, 2);
    p.alibi_slopes = slopes;
    attn_data a = make_data(&p, 1.5);
    attn_data b = make_data(&p, 1.5);
    memcpy(b.q, a.q, (size_t)n_q(&p, p.D) * sizeof *a.q);
    memcpy(b.k, a.k, (size_t)n_k(&p, p.D) * sizeof *a.k);
    memcpy(b.v, a.v, (size_t)n_k(&p, p.Dv) * sizeof *a.v);

    const struct { aj_mask_kind mask; aj_align align; } masks[] = {
        {AJ_MASK_NONE, AJ_ALIGN_TOP_LEFT},
        {AJ_MASK_CAUSAL, AJ_ALIGN_TOP_LEFT},
        {AJ_MASK_CAUSAL, AJ_ALIGN_BOTTOM_RIGHT},
        {AJ_MASK_WINDOW, AJ_ALIGN_BOTTOM_RIGHT},
    };
    for (size_t n = 0; n < sizeof masks / sizeof masks[0]; n++) {
        p.mask = masks[n].mask;
        p.align = masks[n].align;
        p.window_left = 1;
        p.window_right = 2;
        p.q_offset = p.kv_offset = 0;
        forward(&p, &a);
        p.q_offset = p.kv_offset = 1000;
        forward(&p, &b);
        CHECK_MSG(max_diff(a.o, b.o, n_q(&p, p.Dv)) == 0.0, "mask %zu: O moved", n);
        CHECK_MSG(max_diff(a.lse, b.lse, n_q(&p, 1)) == 0.0, "mask %zu: LSE moved", n);
    }
    free_data(&a);
    free_data(&b);
}

/*
 * A shard computed with offsets equals the slice of the full computation:
 *
 *     keys   0 1 2 3 | 4 5 6 7
 *   q 0..3  [ kv1  ] | [ kv2 ]     row shard rows 4..7 against all keys;
 *   q 4..7  [      ] | [     ]     key shards 0..3 and 4..7, merged.
 *
 * Dropout is on: its mask is keyed on global positions, so it must agree.
 */
static void test_shards(void)
{
    const double slopes[2] = {0.5, 0.25};
    ref_problem full = ref_problem_of(1, 2, 2, 8, 8, 4, 3);
    full.mask = AJ_MASK_CAUSAL;
    full.alibi_slopes = slopes;
    full.dropout_p = 0.2;
    full.seed = 1234;
    full.offset = 99;
    attn_data f = make_data(&full, 1.5);
    forward(&full, &f);
    const int64_t slices = full.B * full.Hq, kv_slices = full.B * full.Hkv;

    /* rows 4..7 at q_offset 4 */
    ref_problem rows = full;
    rows.Sq = 4;
    rows.q_offset = 4;
    double *q_part = zeros(n_q(&rows, rows.D));
    double *o_part = zeros(n_q(&rows, rows.Dv)), *lse_part = zeros(n_q(&rows, 1));
    double *o_want = zeros(n_q(&rows, rows.Dv)), *lse_want = zeros(n_q(&rows, 1));
    copy_rows(q_part, 4, 0, f.q, 8, 4, slices, 4, full.D);
    copy_rows(o_want, 4, 0, f.o, 8, 4, slices, 4, full.Dv);
    copy_rows(lse_want, 4, 0, f.lse, 8, 4, slices, 4, 1);
    ref_forward(&rows, q_part, f.k, f.v, o_part, lse_part);
    CHECK(max_diff(o_part, o_want, n_q(&rows, rows.Dv)) < 1e-14);
    CHECK(max_diff(lse_part, lse_want, n_q(&rows, 1)) < 1e-14);

    /* keys 0..3 and 4..7 at kv_offset 0 and 4, merged */
    ref_problem keys = full;
    keys.Sk = 4;
    double *k_part = zeros(n_k(&keys, keys.D)), *v_part = zeros(n_k(&keys, keys.Dv));
    double *o1 = zeros(n_q(&full, full.Dv)), *lse1 = zeros(n_q(&full, 1));
    double *o2 = zeros(n_q(&full, full.Dv)), *lse2 = zeros(n_q(&full, 1));
    copy_rows(k_part, 4, 0, f.k, 8, 0, kv_slices, 4, full.D);
    copy_rows(v_part, 4, 0, f.v, 8, 0, kv_slices, 4, full.Dv);
    ref_forward(&keys, f.q, k_part, v_part, o1, lse1);
    keys.kv_offset = 4;
    copy_rows(k_part, 4, 0, f.k, 8, 4, kv_slices, 4, full.D);
    copy_rows(v_part, 4, 0, f.v, 8, 4, kv_slices, 4, full.Dv);
    ref_forward(&keys, f.q, k_part, v_part, o2, lse2);
    CHECK(lse1[0] != -INFINITY && lse2[0] == -INFINITY);  /* row 0 sees key 0 only */
    ref_merge(n_q(&full, 1), full.Dv, o1, lse1, o2, lse2, o1, lse1);
    CHECK(max_diff(o1, f.o, n_q(&full, full.Dv)) < 1e-14);
    CHECK(max_diff(lse1, f.lse, n_q(&full, 1)) < 1e-14);

    free(q_part);
    free(o_part);
    free(lse_part);
    free(o_want);
    free(lse_want);
    free(k_part);
    free(v_part);
    free(o1);
    free(lse1);
    free(o2);
    free(lse2);
    free_data(&f);
}

/* bottom_right on a shard needs the totals: rows 2..3 of Sq = 4 against
 * keys 0..3 and 4..7 of Sk = 8, window(2, 1), merged. */
static void test_shards_bottom_right(void)
{
    const double slopes[2] = {0.5, 0.25};
    ref_problem full = ref_problem_of(1, 2, 1, 4, 8, 3, 2);
    full.mask = AJ_MASK_WINDOW;
    full.align = AJ_ALIGN_BOTTOM_RIGHT;
    full.window_left = 2;
    full.window_right = 1;
    full.alibi_slopes = slopes;
    attn_data f = make_data(&full, 1.5);
    forward(&full, &f);

    ref_problem part = full;
    part.Sq = 2;
    part.Sk = 4;
    part.q_offset = 2;
    part.sq_total = 4;
    part.sk_total = 8;
    double *q_part = zeros(n_q(&part, part.D));
    double *k_part = zeros(n_k(&part, part.D)), *v_part = zeros(n_k(&part, part.Dv));
    double *o_want = zeros(n_q(&part, part.Dv)), *lse_want = zeros(n_q(&part, 1));
    double *o1 = zeros(n_q(&part, part.Dv)), *lse1 = zeros(n_q(&part, 1));
    double *o2 = zeros(n_q(&part, part.Dv)), *lse2 = zeros(n_q(&part, 1));
    copy_rows(q_part, 2, 0, f.q, 4, 2, 2, 2, full.D);
    copy_rows(o_want, 2, 0, f.o, 4, 2, 2, 2, full.Dv);
    copy_rows(lse_want, 2, 0, f.lse, 4, 2, 2, 2, 1);

    for (int half = 0; half < 2; half++) {
        part.kv_offset = 4 * half;
        copy_rows(k_part, 4, 0, f.k, 8, 4 * half, 1, 4, full.D);
        copy_rows(v_part, 4, 0, f.v, 8, 4 * half, 1, 4, full.Dv);
        ref_forward(&part, q_part, k_part, v_part, half ? o2 : o1, half ? lse2 : lse1);
    }
    ref_merge(n_q(&part, 1), part.Dv, o1, lse1, o2, lse2, o1, lse1);
    CHECK(max_diff(o1, o_want, n_q(&part, part.Dv)) < 1e-14);
    CHECK(max_diff(lse1, lse_want, n_q(&part, 1)) < 1e-14);

    /* without the totals the shard's own lengths set the shift: wrong here */
    part.sq_total = part.sk_total = 0;
    ref_forward(&part, q_part, k_part, v_part, o2, lse2);
    CHECK(max_diff(lse2, lse_want, n_q(&part, 1)) > 1e-3);

    free(q_part);
    free(k_part);
    free(v_part);
    free(o_want);
    free(lse_want);
    free(o1);
    free(lse1);
    free(o2);
    free(lse2);
    free_data(&f);
}

/* ---------------------------------------------------------------- GQA */

/* GQA equals MHA with each kv head repeated for its group; dK and dV of
 * GQA are the group sums of MHA's. */
static void test_gqa(void)
{
    ref_problem g = ref_problem_of(2, 6, 2, 4, 5, 3, 2);
    g.mask = AJ_MASK_CAUSAL;
    g.align = AJ_ALIGN_BOTTOM_RIGHT;
    g.softcap = 2.0;
    g.dropout_p = 0.25;
    g.seed = 77;
    ref_problem m = g;
    m.Hkv = 6;
    const int group = g.Hq / g.Hkv;

    attn_data dg = make_data(&g, 1.5);
    attn_data dm = make_data(&m, 1.5);
    memcpy(dm.q, dg.q, (size_t)n_q(&g, g.D) * sizeof *dg.q);
    for (int b = 0; b < g.B; b++)
        for (int h = 0; h < m.Hkv; h++) {
            copy_rows(dm.k + (b * m.Hkv + h) * g.Sk * g.D, g.Sk, 0,
                      dg.k + (b * g.Hkv + h / group) * g.Sk * g.D, g.Sk, 0, 1, g.Sk, g.D);
            copy_rows(dm.v + (b * m.Hkv + h) * g.Sk * g.Dv, g.Sk, 0,
                      dg.v + (b * g.Hkv + h / group) * g.Sk * g.Dv, g.Sk, 0, 1, g.Sk, g.Dv);
        }
    forward(&g, &dg);
    forward(&m, &dm);
    CHECK(max_diff(dg.o, dm.o, n_q(&g, g.Dv)) < 1e-14);
    CHECK(max_diff(dg.lse, dm.lse, n_q(&g, 1)) < 1e-14);

    double *dout = randoms(n_q(&g, g.Dv), 1.0);
    double *dq_g = zeros(n_q(&g, g.D)), *dk_g = zeros(n_k(&g, g.D)), *dv_g = zeros(n_k(&g, g.Dv));
    double *dq_m = zeros(n_q(&m, m.D)), *dk_m = zeros(n_k(&m, m.D)), *dv_m = zeros(n_k(&m, m.Dv));
    ref_backward(&g, dg.q, dg.k, dg.v, dg.o, dg.lse, dout, dq_g, dk_g, dv_g, NULL);
    ref_backward(&m, dm.q, dm.k, dm.v, dm.o, dm.lse, dout, dq_m, dk_m, dv_m, NULL);
    CHECK(max_diff(dq_g, dq_m, n_q(&g, g.D)) < 1e-13);
    double *dk_sum = zeros(n_k(&g, g.D)), *dv_sum = zeros(n_k(&g, g.Dv));
    for (int b = 0; b < g.B; b++)
        for (int h = 0; h < m.Hkv; h++) {
            for (int e = 0; e < g.Sk * g.D; e++)
                dk_sum[(b * g.Hkv + h / group) * g.Sk * g.D + e] +=
                    dk_m[(b * m.Hkv + h) * g.Sk * g.D + e];
            for (int e = 0; e < g.Sk * g.Dv; e++)
                dv_sum[(b * g.Hkv + h / group) * g.Sk * g.Dv + e] +=
                    dv_m[(b * m.Hkv + h) * g.Sk * g.Dv + e];
        }
    CHECK(max_diff(dk_g, dk_sum, n_k(&g, g.D)) < 1e-13);
    CHECK(max_diff(dv_g, dv_sum, n_k(&g, g.Dv)) < 1e-13);
    CHECK(max_abs(dk_g, n_k(&g, g.D)) > 1e-3 && max_abs(dv_g, n_k(&g, g.Dv)) > 1e-3);

    free(dout);
    free(dq_g);
    free(dk_g);
    free(dv_g);
    free(dq_m);
    free(dk_m);
    free(dv_m);
    free(dk_sum);
    free(dv_sum);
    free_data(&dg);
    free_data(&dm);
}

/* ---------------------------------------------------------------- varlen */

/*
 * Varlen equals each sequence run alone in the padded layout (positions
 * restart at 0 in every sequence).  Sequence b
 * runs as batch b of a padded problem with B = b + 1 (the other batches
 * zero), so that its dropout stream (keyed on b * Hq + h) is the same.
 * Lengths include an empty query set and an empty key set.
 */
static void test_varlen(const char *what, const ref_problem *mask, int want_empty)
{
    static const int32_t cu_q[] = {0, 3, 4, 4, 8, 10};
    static const int32_t cu_k[] = {0, 2, 7, 10, 10, 16};
    const double slopes[2] = {0.2, 0.4};
    ref_problem v = ref_problem_of(5, 2, 1, 0, 0, 3, 2);
    v.cu_q = cu_q;
    v.cu_k = cu_k;
    v.mask = mask->mask;
    v.align = mask->align;
    v.window_left = mask->window_left;
    v.window_right = mask->window_right;
    v.q_offset = mask->q_offset;
    v.alibi_slopes = slopes;
    v.softcap = 3.0;
    v.dropout_p = 0.3;
    v.seed = 0xabcdef0123ull;
    v.offset = 5;
    attn_data d = make_data(&v, 1.5);
    forward(&v, &d);
    CHECK(all_finite(d.o, n_q(&v, v.Dv)) && lse_sane(d.lse, n_q(&v, 1)));

    double *dout = randoms(n_q(&v, v.Dv), 1.0);
    double *dq = zeros(n_q(&v, v.D)), *dk = zeros(n_k(&v, v.D)), *dv = zeros(n_k(&v, v.Dv));
    ref_backward(&v, d.q, d.k, d.v, d.o, d.lse, dout, dq, dk, dv, NULL);

    const int64_t Tq = cu_q[v.B];
    const int H = v.Hq, Hk = v.Hkv;
    double worst_fwd = 0.0, worst_bwd = 0.0;
    int empty_rows = 0;
    for (int b = 0; b < v.B; b++) {
        const int sq = cu_q[b + 1] - cu_q[b], sk = cu_k[b + 1] - cu_k[b];
        ref_problem p = v;
        p.cu_q = p.cu_k = NULL;
        p.B = b + 1;
        p.Sq = sq;
        p.Sk = sk;
        attn_data pd = make_data(&p, 0.0);
        double *pdout = zeros(n_q(&p, p.Dv));
        /* pack THD -> batch b of BHSD */
        for (int h = 0; h < H; h++)
            for (int i = 0; i < sq; i++) {
                memcpy(pd.q + ((b * H + h) * sq + i) * p.D,
                       d.q + ((cu_q[b] + i) * H + h) * p.D, (size_t)p.D * sizeof(double));
                memcpy(pdout + ((b * H + h) * sq + i) * p.Dv,
                       dout + ((cu_q[b] + i) * H + h) * p.Dv, (size_t)p.Dv * sizeof(double));
            }
        for (int h = 0; h < Hk; h++)
            for (int j = 0; j < sk; j++) {
                memcpy(pd.k + ((b * Hk + h) * sk + j) * p.D,
                       d.k + ((cu_k[b] + j) * Hk + h) * p.D, (size_t)p.D * sizeof(double));
                memcpy(pd.v + ((b * Hk + h) * sk + j) * p.Dv,
                       d.v + ((cu_k[b] + j) * Hk + h) * p.Dv, (size_t)p.Dv * sizeof(double));
            }
        forward(&p, &pd);
        double *pdq = zeros(n_q(&p, p.D)), *pdk = zeros(n_k(&p, p.D)), *pdv = zeros(n_k(&p, p.Dv));
        ref_backward(&p, pd.q, pd.k, pd.v, pd.o, pd.lse, pdout, pdq, pdk, pdv, NULL);

        for (int h = 0; h < H; h++)
            for (int i = 0; i < sq; i++) {
                const double *a = d.o + ((cu_q[b] + i) * H + h) * p.Dv;
                const double *z = pd.o + ((b * H + h) * sq + i) * p.Dv;
                worst_fwd = fmax(worst_fwd, max_diff(a, z, p.Dv));
                double la = d.lse[h * Tq + cu_q[b] + i];
                double lz = pd.lse[(b * H + h) * sq + i];
                worst_fwd = fmax(worst_fwd, max_diff(&la, &lz, 1));
                empty_rows += la == -INFINITY;
                worst_bwd = fmax(worst_bwd, max_diff(dq + ((cu_q[b] + i) * H + h) * p.D,
                                                     pdq + ((b * H + h) * sq + i) * p.D, p.D));
            }
        for (int h = 0; h < Hk; h++)
            for (int j = 0; j < sk; j++) {
                worst_bwd = fmax(worst_bwd, max_diff(dk + ((cu_k[b] + j) * Hk + h) * p.D,
                                                     pdk + ((b * Hk + h) * sk + j) * p.D, p.D));
                worst_bwd = fmax(worst_bwd, max_diff(dv + ((cu_k[b] + j) * Hk + h) * p.Dv,
                                                     pdv + ((b * Hk + h) * sk + j) * p.Dv, p.Dv));
            }
        free(pdq);
        free(pdk);
        free(pdv);
        free(pdout);
        free_data(&pd);
    }
    CHECK_MSG(worst_fwd < 1e-14, "%s: forward differs by %g", what, worst_fwd);
    CHECK_MSG(worst_bwd < 1e-13, "%s: backward differs by %g", what, worst_bwd);
    CHECK_MSG(empty_rows == want_empty, "%s: %d empty rows, want %d", what, empty_rows,
              want_empty);
    free(dout);
    free(dq);
    free(dk);
    free(dv);
    free_data(&d);
}

/*
 * Sequences (queries, keys): (3,2) (1,5) (0,3) (4,0) (2,6).  Sequence 3 has
 * no keys: 4 empty rows per head.  Causal bottom_right (shift sk - sq per
 * sequence) also empties row 0 of sequence 0 (shift -1); window(1,0) with
 * q_offset 1 sees keys i .. i+1, which empties row 2 of sequence 0.
 */
static void test_varlens(void)
{
    ref_problem causal = {.mask = AJ_MASK_CAUSAL, .align = AJ_ALIGN_BOTTOM_RIGHT};
    test_varlen("varlen causal bottom_right", &causal, (1 + 4) * 2);
    ref_problem window = {.mask = AJ_MASK_WINDOW, .window_left = 1, .q_offset = 1};
    test_varlen("varlen window(1,0), q_offset 1", &window, (1 + 4) * 2);
}

/* ---------------------------------------------------------------- bias */

/* A broadcast bias equals its explicit expansion; its gradient is the full
 * gradient summed over the broadcast dims. */
static void test_bias_broadcast(void)
{
    static const int64_t shapes[][4] = {
        {1, 1, 4, 5}, {2, 1, 1, 5}, {1, 3, 4, 1}, {2, 3, 1, 1}, {1, 1, 1, 1}, {2, 3, 4, 5},
    };
    ref_problem p = ref_problem_of(2, 3, 3, 4, 5, 3, 2);
    p.mask = AJ_MASK_CAUSAL;
    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    p.softcap = 1.5;
    attn_data d = make_data(&p, 1.5);
    attn_data e = make_data(&p, 1.5);
    memcpy(e.q, d.q, (size_t)n_q(&p, p.D) * sizeof *d.q);
    memcpy(e.k, d.k, (size_t)n_k(&p, p.D) * sizeof *d.k);
    memcpy(e.v, d.v, (size_t)n_k(&p, p.Dv) * sizeof *d.v);
    double *dout = randoms(n_q(&p, p.Dv), 1.0);
    const int64_t full[4] = {2, 3, 4, 5};
    const int64_t n_full = 2 * 3 * 4 * 5;
    double *dq1 = zeros(n_q(&p, p.D)), *dk1 = zeros(n_k(&p, p.D)), *dv1 = zeros(n_k(&p, p.Dv));
    double *dq2 = zeros(n_q(&p, p.D)), *dk2 = zeros(n_k(&p, p.D)), *dv2 = zeros(n_k(&p, p.Dv));

    for (size_t n = 0; n < sizeof shapes / sizeof shapes[0]; n++) {
        const int64_t *shape = shapes[n];
        int64_t count = shape[0] * shape[1] * shape[2] * shape[3];
        double *bias = randoms(count, 2.0);
        double *dbias = zeros(count), *dbias_sum = zeros(count);
        double *expanded = zeros(n_full), *dexpanded = zeros(n_full);
        for (int64_t at = 0; at < n_full; at++) {
            int64_t idx[4] = {at / 60, at / 20 % 3, at / 5 % 4, at % 5}, src = 0;
            for (int dim = 0; dim < 4; dim++)
                src = src * shape[dim] + (shape[dim] == 1 ? 0 : idx[dim]);
            expanded[at] = bias[src];
        }

        ref_problem pb = p, pe = p;
        pb.bias = bias;
        memcpy(pb.bias_shape, shape, sizeof pb.bias_shape);
        pe.bias = expanded;
        memcpy(pe.bias_shape, full, sizeof pe.bias_shape);
        forward(&pb, &d);
        forward(&pe, &e);
        CHECK_MSG(max_diff(d.o, e.o, n_q(&p, p.Dv)) < 1e-14, "shape %zu: O", n);
        CHECK_MSG(max_diff(d.lse, e.lse, n_q(&p, 1)) < 1e-14, "shape %zu: LSE", n);

        ref_backward(&pb, d.q, d.k, d.v, d.o, d.lse, dout, dq1, dk1, dv1, dbias);
        ref_backward(&pe, e.q, e.k, e.v, e.o, e.lse, dout, dq2, dk2, dv2, dexpanded);
        for (int64_t at = 0; at < n_full; at++) {
            int64_t idx[4] = {at / 60, at / 20 % 3, at / 5 % 4, at % 5}, dst = 0;
            for (int dim = 0; dim < 4; dim++)
                dst = dst * shape[dim] + (shape[dim] == 1 ? 0 : idx[dim]);
            dbias_sum[dst] += dexpanded[at];
        }
        CHECK_MSG(max_diff(dbias, dbias_sum, count) < 1e-13, "shape %zu: dbias", n);
        CHECK_MSG(max_abs(dbias, count) > 1e-3, "shape %zu: dbias is zero", n);
        CHECK_MSG(max_diff(dq1, dq2, n_q(&p, p.D)) < 1e-13 &&
                  max_diff(dk1, dk2, n_k(&p, p.D)) < 1e-13 &&
                  max_diff(dv1, dv2, n_k(&p, p.Dv)) < 1e-13, "shape %zu: dq/dk/dv", n);
        free(bias);
        free(dbias);
        free(dbias_sum);
        free(expanded);
        free(dexpanded);
    }
    free(dq1);
    free(dk1);
    free(dv1);
    free(dq2);
    free(dk2);
    free(dv2);
    free(dout);
    free_data(&d);
    free_data(&e);
}

/*
 * A full-shape bias addressed independently of ref's own indexing: a
 * rank-1 bias scale * a[b,h,i] * c[b,h,j] is the same as one more head-dim
 * column, q[..., D] = a and k[..., D] = c, in a problem without bias.
 */
static void test_bias_as_extra_column(void)
{
    ref_problem p = ref_problem_of(2, 3, 3, 4, 5, 3, 2);
    p.scale = 0.5;
    p.mask = AJ_MASK_CAUSAL;
    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    ref_problem wide = p;
    wide.D = p.D + 1;
    attn_data d = make_data(&p, 1.5);
    attn_data w = make_data(&wide, 1.5);
    double *a = randoms(n_q(&p, 1), 2.0), *c = randoms(n_k(&p, 1), 2.0);
    double *bias = zeros(2 * 3 * 4 * 5);
    for (int64_t row = 0; row < n_q(&p, 1); row++) {
        memcpy(w.q + row * wide.D, d.q + row * p.D, (size_t)p.D * sizeof(double));
        w.q[row * wide.D + p.D] = a[row];
    }
    for (int64_t row = 0; row < n_k(&p, 1); row++) {
        memcpy(w.k + row * wide.D, d.k + row * p.D, (size_t)p.D * sizeof(double));
        w.k[row * wide.D + p.D] = c[row];
    }
    memcpy(w.v, d.v, (size_t)n_k(&p, p.Dv) * sizeof(double));
    for (int64_t bh = 0; bh < 2 * 3; bh++)  /* Hq == Hkv: slice bh on both sides */
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 5; j++)
                bias[(bh * 4 + i) * 5 + j] = p.scale * a[bh * 4 + i] * c[bh * 5 + j];
    p.bias = bias;
    p.bias_shape[0] = 2;
    p.bias_shape[1] = 3;
    p.bias_shape[2] = 4;
    p.bias_shape[3] = 5;
    forward(&p, &d);
    forward(&wide, &w);
    CHECK(max_diff(d.o, w.o, n_q(&p, p.Dv)) < 1e-14);
    CHECK(max_diff(d.lse, w.lse, n_q(&p, 1)) < 1e-14);
    free(a);
    free(c);
    free(bias);
    free_data(&d);
    free_data(&w);
}

/* ---------------------------------------------------------------- merge */

static void test_merge(void)
{
    /* by hand: lse 0 and log 3 -> log 4; weights 1/4 and 3/4 */
    const double o1[2] = {2.0, -4.0}, o2[2] = {6.0, 8.0};
    const double l1[1] = {0.0}, l2[1] = {log(3.0)};
    double o[2], l[1];
    ref_merge(1, 2, o1, l1, o2, l2, o, l);
    CHECK(fabs(l[0] - log(4.0)) < 1e-15);
    CHECK(fabs(o[0] - 5.0) < 1e-14 && fabs(o[1] - 5.0) < 1e-14);

    /* rows: both empty; left empty (with garbage O); right empty; large lse */
    const double a_o[4 * 2] = {0, 0, NAN, NAN, 1, 2, 3, 4};
    const double a_l[4] = {-INFINITY, -INFINITY, 0.5, 800.0};
    const double b_o[4 * 2] = {0, 0, 7, 9, NAN, NAN, 5, 6};
    const double b_l[4] = {-INFINITY, 1.5, -INFINITY, 800.0};
    double mo[4 * 2], ml[4];
    ref_merge(4, 2, a_o, a_l, b_o, b_l, mo, ml);
    CHECK(all_finite(mo, 8) && lse_sane(ml, 4));
    CHECK(ml[0] == -INFINITY && mo[0] == 0.0 && mo[1] == 0.0);
    CHECK(ml[1] == 1.5 && mo[2] == 7.0 && mo[3] == 9.0);
    CHECK(ml[2] == 0.5 && mo[4] == 1.0 && mo[5] == 2.0);
    CHECK(fabs(ml[3] - (800.0 + log(2.0))) < 1e-12);
    CHECK(fabs(mo[6] - 4.0) < 1e-12 && fabs(mo[7] - 5.0) < 1e-12);  /* ulp(800) ~ 1e-13 */

    /* merging attention over two key halves equals attention over all keys */
    ref_problem full = ref_problem_of(2, 2, 1, 5, 6, 3, 4);
    attn_data f = make_data(&full, 2.0);
    forward(&full, &f);
    ref_problem half = full;
    half.Sk = 3;
    const int64_t kv_slices = full.B * full.Hkv;
    double *k_part = zeros(n_k(&half, half.D)), *v_part = zeros(n_k(&half, half.Dv));
    double *oa = zeros(n_q(&full, full.Dv)), *la = zeros(n_q(&full, 1));
    double *ob = zeros(n_q(&full, full.Dv)), *lb = zeros(n_q(&full, 1));
    double *om = zeros(n_q(&full, full.Dv)), *lm = zeros(n_q(&full, 1));
    copy_rows(k_part, 3, 0, f.k, 6, 0, kv_slices, 3, full.D);
    copy_rows(v_part, 3, 0, f.v, 6, 0, kv_slices, 3, full.Dv);
    ref_forward(&half, f.q, k_part, v_part, oa, la);
    copy_rows(k_part, 3, 0, f.k, 6, 3, kv_slices, 3, full.D);
    copy_rows(v_part, 3, 0, f.v, 6, 3, kv_slices, 3, full.Dv);
    ref_forward(&half, f.q, k_part, v_part, ob, lb);
    ref_merge(n_q(&full, 1), full.Dv, oa, la, ob, lb, om, lm);
    CHECK(max_diff(om, f.o, n_q(&full, full.Dv)) < 1e-14);
    CHECK(max_diff(lm, f.lse, n_q(&full, 1)) < 1e-14);
    /* and the halves alone are not the answer */
    CHECK(max_diff(oa, f.o, n_q(&full, full.Dv)) > 1e-3);

    free(k_part);
    free(v_part);
    free(oa);
    free(la);
    free(ob);
    free(lb);
    free(om);
    free(lm);
    free_data(&f);
}

/* ---------------------------------------------------------------- backward */

/* L = sum(O * dO) for the current inputs. */
static double loss(const ref_problem *p, const attn_data *d, const double *dout,
                   double *o_scratch, double *lse_scratch)
{
    ref_forward(p, d->q, d->k, d->v, o_scratch, lse_scratch);
    double sum = 0.0;
    for (int64_t e = 0; e < n_q(p, p->Dv); e++)
        sum += o_scratch[e] * dout[e];
    return sum;
}

/* Central differences of L over every element of x, against `analytic`:
 * the largest error relative to the largest gradient must be < 1e-6. */
static void fd_compare(const char *what, const char *name, const ref_problem *p,
                       const attn_data *d, const double *dout, double *x, int64_t n,
                       const double *analytic)
{
    const double h = 1e-5;
    double *o = zeros(n_q(p, p->Dv)), *lse = zeros(n_q(p, 1));
    double *fd = zeros(n);
    for (int64_t e = 0; e < n; e++) {
        double saved = x[e];
        x[e] = saved + h;
        double up = loss(p, d, dout, o, lse);
        x[e] = saved - h;
        double down = loss(p, d, dout, o, lse);
        x[e] = saved;
        fd[e] = (up - down) / (2.0 * h);
    }
    double scale = max_abs(fd, n);
    double err = max_diff(analytic, fd, n) / scale;
    CHECK_MSG(scale > 1e-3, "%s: d%s is all zero", what, name);
    CHECK_MSG(err < 1e-6, "%s: d%s relative error %.3g", what, name, err);
    free(o);
    free(lse);
    free(fd);
}

/* Finite-difference check of dQ, dK, dV (and dBias) of L = sum(O * dO). */
static void fd_check(const char *what, const ref_problem *p0, const int64_t *bias_shape)
{
    ref_problem p = *p0;
    attn_data d = make_data(&p, 1.5);
    double *bias = NULL, *dbias = NULL;
    int64_t n_bias = 0;
    if (bias_shape) {
        n_bias = bias_shape[0] * bias_shape[1] * bias_shape[2] * bias_shape[3];
        bias = randoms(n_bias, 1.0);
        dbias = zeros(n_bias);
        p.bias = bias;
        memcpy(p.bias_shape, bias_shape, sizeof p.bias_shape);
    }
    forward(&p, &d);
    CHECK_MSG(all_finite(d.o, n_q(&p, p.Dv)) && lse_sane(d.lse, n_q(&p, 1)),
              "%s: forward has NaN", what);
    double *dout = randoms(n_q(&p, p.Dv), 1.0);
    double *dq = zeros(n_q(&p, p.D)), *dk = zeros(n_k(&p, p.D)), *dv = zeros(n_k(&p, p.Dv));
    ref_backward(&p, d.q, d.k, d.v, d.o, d.lse, dout, dq, dk, dv, dbias);
    CHECK_MSG(all_finite(dq, n_q(&p, p.D)) && all_finite(dk, n_k(&p, p.D)) &&
              all_finite(dv, n_k(&p, p.Dv)), "%s: gradient has NaN", what);

    fd_compare(what, "q", &p, &d, dout, d.q, n_q(&p, p.D), dq);
    fd_compare(what, "k", &p, &d, dout, d.k, n_k(&p, p.D), dk);
    fd_compare(what, "v", &p, &d, dout, d.v, n_k(&p, p.Dv), dv);
    if (bias)
        fd_compare(what, "bias", &p, &d, dout, bias, n_bias, dbias);

    free(bias);
    free(dbias);
    free(dout);
    free(dq);
    free(dk);
    free(dv);
    free_data(&d);
}

static void test_backward_finite_differences(void)
{
    ref_problem p = ref_problem_of(1, 2, 2, 3, 4, 3, 2);
    fd_check("mha", &p, NULL);

    p = ref_problem_of(2, 4, 2, 3, 5, 3, 2);
    p.mask = AJ_MASK_CAUSAL;
    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    fd_check("gqa causal bottom_right", &p, NULL);

    /* row 0 sees no key (kv_offset 1): its gradient is zero, not NaN */
    p.align = AJ_ALIGN_TOP_LEFT;
    p.kv_offset = 1;
    fd_check("gqa causal, an empty row", &p, NULL);

    const double slopes[4] = {0.1, 0.2, 0.3, 0.4};
    p = ref_problem_of(2, 4, 1, 3, 4, 3, 2);
    p.softcap = 1.5;
    p.scale = 0.7;
    p.alibi_slopes = slopes;
    p.q_offset = 2;
    const int64_t bias_full[4] = {2, 4, 3, 4}, bias_bcast[4] = {2, 1, 3, 1};
    fd_check("bias + softcap + alibi", &p, bias_full);
    p.mask = AJ_MASK_CAUSAL;
    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    fd_check("broadcast bias + softcap + causal", &p, bias_bcast);

    p = ref_problem_of(1, 4, 2, 4, 6, 3, 3);
    p.mask = AJ_MASK_WINDOW;
    p.window_left = 2;
    p.window_right = 1;
    p.dropout_p = 0.3;
    p.seed = 2024;
    p.offset = 3;
    fd_check("gqa window + dropout", &p, NULL);

    static const int32_t cu_q[] = {0, 2, 5}, cu_k[] = {0, 4, 7};
    p = ref_problem_of(2, 2, 1, 0, 0, 3, 2);
    p.cu_q = cu_q;
    p.cu_k = cu_k;
    p.mask = AJ_MASK_CAUSAL;
    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    p.softcap = 2.0;
    p.dropout_p = 0.2;
    fd_check("varlen causal + softcap + dropout", &p, NULL);
}

/* ---------------------------------------------------------------- dropout */

/*
 * Forward with dropout equals O rebuilt from the undropped probabilities
 * and the explicit keep mask; LSE does not change.  P comes from a run with
 * V = identity and no dropout (row i of O is P_i); keep decisions from
 * ref_dropout_keep at global positions.
 */
static void test_dropout_forward(void)
{
    ref_problem p = ref_problem_of(2, 2, 1, 5, 7, 4, 3);
    p.mask = AJ_MASK_CAUSAL;
    p.align = AJ_ALIGN_BOTTOM_RIGHT;
    p.q_offset = 3;
    p.kv_offset = 1;
    attn_data d = make_data(&p, 1.5);
    forward(&p, &d);
    double *lse0 = zeros(n_q(&p, 1));
    memcpy(lse0, d.lse, (size_t)n_q(&p, 1) * sizeof *lse0);

    /* P: the same scores with V = identity */
    ref_problem pi = p;
    pi.Dv = p.Sk;
    double *eye = zeros(n_k(&pi, pi.Dv)), *P = zeros(n_q(&pi, pi.Dv));
    for (int64_t sl = 0; sl < (int64_t)p.B * p.Hkv; sl++)
        for (int j = 0; j < p.Sk; j++)
            eye[(sl * p.Sk + j) * p.Sk + j] = 1.0;
    ref_forward(&pi, d.q, d.k, eye, P, NULL);

    p.dropout_p = 0.4;
    p.seed = 0x1111222233334444ull;
    p.offset = 0x0000000500000006ull;
    forward(&p, &d);
    double *again = zeros(n_q(&p, p.Dv));
    ref_forward(&p, d.q, d.k, d.v, again, NULL);
    CHECK(max_diff(again, d.o, n_q(&p, p.Dv)) == 0.0);  /* deterministic */
    CHECK(max_diff(lse0, d.lse, n_q(&p, 1)) == 0.0);     /* LSE undropped */

    double worst = 0.0;
    int dropped = 0, visible = 0;
    for (int b = 0; b < p.B; b++)
        for (int h = 0; h < p.Hq; h++)
            for (int i = 0; i < p.Sq; i++) {
                double want[3] = {0, 0, 0};
                for (int j = 0; j < p.Sk; j++) {
                    double pij = P[((b * p.Hq + h) * p.Sq + i) * p.Sk + j];
                    bool keep = ref_dropout_keep(p.seed, p.offset, b, h, p.Hq,
                                                 p.q_offset + i, p.kv_offset + j,
                                                 p.dropout_p);
                    visible += pij > 0.0;
                    dropped += pij > 0.0 && !keep;
                    if (!keep)
                        continue;
                    const double *vj = d.v + ((b * p.Hkv + 0) * p.Sk + j) * p.Dv;
                    for (int c = 0; c < p.Dv; c++)
                        want[c] += pij / (1.0 - p.dropout_p) * vj[c];
                }
                const double *oi = d.o + ((b * p.Hq + h) * p.Sq + i) * p.Dv;
                worst = fmax(worst, max_diff(oi, want, p.Dv));
            }
    CHECK_MSG(worst < 1e-14, "dropout forward differs by %g", worst);
    CHECK_MSG(dropped > 0 && dropped < visible, "%d of %d dropped", dropped, visible);

    free(lse0);
    free(eye);
    free(P);
    free(again);
    free_data(&d);
}

/* ---------------------------------------------------------------- expressions */

/* A built-in op written as the expressions aj_expr_builtin_text gives for
 * it (with `slopes: f32[1]` declared for alibi); NULL on failure. */
static aj_op *builtin_as_expr(aj_ctx *ctx, const aj_op *builtin)
{
    char text[256];
    bool slopes = false;
    aj_op *op = NULL;

    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_expr_builtin_text(builtin, false, text, sizeof text, &slopes));
    if (text[0])
        CHECK_STATUS(ctx, aj_op_set_mask_expr(op, text), AJ_OK);
    CHECK(aj_expr_builtin_text(builtin, true, text, sizeof text, &slopes));
    if (slopes)
        CHECK(aj_op_declare_tensor(op, "slopes", AJ_SIDE_F32, 1) == AJ_OK);
    if (text[0])
        CHECK_STATUS(ctx, aj_op_set_score_mod_expr(op, text), AJ_OK);
    return op;
}

/* The reference problem of the built-in forms of op (softcap, slopes). */
static void set_builtins(ref_problem *p, const aj_op *op, const double *slopes)
{
    p->mask = op->mask.kind;
    p->align = op->mask.align;
    p->window_left = op->mask.left;
    p->window_right = op->mask.right;
    p->softcap = op->score_mod.kind == AJ_SCORE_MOD_SOFTCAP ? op->score_mod.softcap : 0.0;
    p->alibi_slopes = op->score_mod.kind == AJ_SCORE_MOD_ALIBI ? slopes : NULL;
}

/* The same problem through op's expressions. */
static void set_exprs(ref_problem *p, const aj_op *op, const aj_side_tensor *tensors)
{
    p->expr = &op->expr;
    p->mask = op->mask.kind;
    p->mask_root = op->mask.root;
    p->score_expr = op->score_mod.kind == AJ_SCORE_MOD_EXPR;
    p->score_root = op->score_mod.root;
    p->tensors = tensors;
    p->tensor_count = op->tensor_count;
}

static bool close_to(double a, double b, double tol)
{
    return fabs(a - b) <= tol * (1.0 + fabs(a));
}

/*
 * Every built-in mask and score_mod equals the expression
 * aj_expr_builtin_text gives for it: visibility exactly and scores (and
 * ds/dt) to f32 rounding, position by position over a shard with offsets
 * and Sq != Sk; then the whole forward and backward agree.
 */
static void test_builtin_expressions(void)
{
    static const char *const masks[] = {
        "none", "causal(top_left)", "causal(bottom_right)", "window(3, 1)",
        "window(2, 0, bottom_right)",
    };
    static const char *const mods[] = { "none", "softcap(1.5)", "alibi" };
    static const double slopes[4] = { 0.5, 0.25, 0.125, 0.0625 };
    static const float slopes_f32[4] = { 0.5f, 0.25f, 0.125f, 0.0625f };
    const aj_side_tensor tensors[] = { { "slopes", slopes_f32, AJ_SIDE_F32, 1, { 4 }, { 1 } } };
    const double ts[] = { -3.25, -0.5, 0.0, 0.75, 2.5 };
    aj_ctx *ctx = NULL;

    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
        for (size_t s = 0; s < sizeof mods / sizeof mods[0]; s++) {
            char spec[512], what[128];
            aj_op *builtin = NULL, *expr;
            snprintf(spec, sizeof spec, "attention forward flash {\n  dtype = f32\n"
                     "  head_dim = 4\n  mask = %s\n  score_mod = %s\n}\n", masks[m], mods[s]);
            snprintf(what, sizeof what, "%s + %s", masks[m], mods[s]);
            CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), what, &builtin), AJ_OK);
            if (!builtin)
                continue;
            expr = builtin_as_expr(ctx, builtin);

            ref_problem pb = ref_problem_of(2, 4, 2, 5, 7, 4, 3), pe;
            pb.q_offset = 3;
            pb.kv_offset = 1;
            pb.sq_total = 9;
            pb.sk_total = 12;
            pb.scale = 0.8;
            pe = pb;
            set_builtins(&pb, builtin, slopes);
            set_exprs(&pe, expr, tensors);
            int bad = 0;
            for (int b = 0; b < pb.B; b++)
                for (int h = 0; h < pb.Hq; h++)
                    for (int i = 0; i < pb.Sq; i++)
                        for (int j = 0; j < pb.Sk; j++) {
                            bad += ref_visible(&pb, b, h, i, j) != ref_visible(&pe, b, h, i, j);
                            for (size_t t = 0; t < sizeof ts / sizeof ts[0]; t++) {
                                double gb, ge;
                                double sb = ref_score(&pb, b, h, i, j, ts[t], &gb);
                                double se = ref_score(&pe, b, h, i, j, ts[t], &ge);
                                bad += !close_to(sb, se, 1e-6) || !close_to(gb, ge, 1e-6);
                            }
                        }
            CHECK_MSG(bad == 0, "%s: %d positions differ from the expression", what, bad);

            /* forward and backward through the expressions */
            attn_data db = make_data(&pb, 1.0), de = make_data(&pe, 1.0);
            memcpy(de.q, db.q, (size_t)n_q(&pb, pb.D) * sizeof *db.q);
            memcpy(de.k, db.k, (size_t)n_k(&pb, pb.D) * sizeof *db.k);
            memcpy(de.v, db.v, (size_t)n_k(&pb, pb.Dv) * sizeof *db.v);
            forward(&pb, &db);
            forward(&pe, &de);
            CHECK_MSG(max_diff(db.o, de.o, n_q(&pb, pb.Dv)) < 1e-5 &&
                      max_diff(db.lse, de.lse, n_q(&pb, 1)) < 1e-5, "%s: forward differs", what);
            double *dout = randoms(n_q(&pb, pb.Dv), 1.0);
            double *g[2][3];
            for (int r = 0; r < 2; r++) {
                g[r][0] = zeros(n_q(&pb, pb.D));
                g[r][1] = zeros(n_k(&pb, pb.D));
                g[r][2] = zeros(n_k(&pb, pb.Dv));
            }
            ref_backward(&pb, db.q, db.k, db.v, db.o, db.lse, dout, g[0][0], g[0][1], g[0][2], NULL);
            ref_backward(&pe, de.q, de.k, de.v, de.o, de.lse, dout, g[1][0], g[1][1], g[1][2], NULL);
            CHECK_MSG(max_diff(g[0][0], g[1][0], n_q(&pb, pb.D)) < 1e-5 &&
                      max_diff(g[0][1], g[1][1], n_k(&pb, pb.D)) < 1e-5 &&
                      max_diff(g[0][2], g[1][2], n_k(&pb, pb.Dv)) < 1e-5 &&
                      max_abs(g[0][0], n_q(&pb, pb.D)) > 0.0,
                      "%s: backward differs", what);
            for (int r = 0; r < 2; r++)
                for (int c = 0; c < 3; c++)
                    free(g[r][c]);
            free(dout);
            free_data(&db);
            free_data(&de);
            aj_op_destroy(expr);
            aj_op_destroy(builtin);
        }
    }
    aj_ctx_destroy(ctx);
}

/* A document mask from a side tensor, whose last position lies outside
 * the tensor (reads 0), in the reference against the rule by hand. */
static void test_document_mask(void)
{
    static const int32_t doc[2][5] = { { 1, 1, 2, 2, 2 }, { 1, 2, 2, 3, 0 } };
    const aj_side_tensor tensors[] = { { "doc", doc, AJ_SIDE_I32, 2, { 2, 5 }, { 5, 1 } } };
    aj_ctx *ctx = NULL;
    aj_op *op = NULL;

    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_declare_tensor(op, "doc", AJ_SIDE_I32, 2) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_mask_expr(op, "doc[b, q] == doc[b, k] && k <= q"), AJ_OK);
    ref_problem p = ref_problem_of(2, 1, 1, 6, 6, 2, 2);
    set_exprs(&p, op, tensors);
    int bad = 0;
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 6; j++) {
                int di = i < 5 ? doc[b][i] : 0, dj = j < 5 ? doc[b][j] : 0;
                bad += ref_visible(&p, b, 0, i, j) != (di == dj && j <= i);
            }
    CHECK_MSG(bad == 0, "document mask: %d positions wrong", bad);
    /* the rows see their own documents only: O row 5 of batch 1 (doc 0,
     * outside the tensor) sees keys 4 and 5, whose doc is 0 too */
    attn_data d = make_data(&p, 1.0);
    forward(&p, &d);
    CHECK(all_finite(d.o, n_q(&p, p.Dv)) && lse_sane(d.lse, n_q(&p, 1)));
    free_data(&d);
    aj_op_destroy(op);
    aj_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- paged */

/*
 * A paged cache equals the padded problem whose queries sit at q_offset =
 * Sk - Sq: each batch's K/V rows scattered over shuffled pages of a cache
 * with spare pages, scaled by k_scale / v_scale, causal (top_left) and
 * alibi on absolute positions; one sequence of length 0 (O = 0, LSE =
 * -inf), whose padded twin is a batch with every key masked.
 */
static void test_paged(void)
{
    const int B = 2, Hq = 4, Hkv = 2, Sq = 3, Sk = 11, D = 4, Dv = 3;
    const int page_sizes[] = {1, 4, 16};
    for (size_t ps_i = 0; ps_i < sizeof page_sizes / sizeof page_sizes[0]; ps_i++) {
        int ps = page_sizes[ps_i], per_seq = (Sk + ps - 1) / ps;
        int num_pages = B * per_seq + 3, max_pages = per_seq + 1;
        double slopes[4] = {0.5, 0.25, 0.125, 0.0625};
        ref_problem g = ref_problem_of(B, Hq, Hkv, Sq, Sk, D, Dv);
        g.mask = AJ_MASK_CAUSAL;
        g.alibi_slopes = slopes;
        g.q_offset = Sk - Sq;
        attn_data d = make_data(&g, 1.5);
        forward(&g, &d);

        /* pages in reverse order of use, so that no sequence's are contiguous */
        double *kc = zeros((int64_t)num_pages * ps * Hkv * D);
        double *vc = zeros((int64_t)num_pages * ps * Hkv * Dv);
        int32_t *table = calloc((size_t)(B * max_pages), sizeof *table);
        int32_t lens[2] = {Sk, Sk};
        const double k_scale = 0.5, v_scale = 4.0;
        for (int b = 0; b < B; b++)
            for (int n = 0; n < per_seq; n++)
                table[b * max_pages + n] = num_pages - 1 - (b * per_seq + n);
        for (int b = 0; b < B; b++)
            for (int j = 0; j < Sk; j++)
                for (int hk = 0; hk < Hkv; hk++) {
                    int64_t row = (int64_t)table[b * max_pages + j / ps] * ps + j % ps;
                    for (int c = 0; c < D; c++)
                        kc[(row * Hkv + hk) * D + c] =
                            d.k[(((int64_t)b * Hkv + hk) * Sk + j) * D + c] / k_scale;
                    for (int c = 0; c < Dv; c++)
                        vc[(row * Hkv + hk) * Dv + c] =
                            d.v[(((int64_t)b * Hkv + hk) * Sk + j) * Dv + c] / v_scale;
                }
        ref_paged pg = {num_pages, ps, max_pages, kc, vc, table, lens, k_scale, v_scale};
        ref_problem pp = g;
        pp.q_offset = 0;
        double *o = zeros(n_q(&g, Dv)), *lse = zeros(n_q(&g, 1));
        ref_paged_forward(&pp, &pg, d.q, o, lse);
        CHECK_MSG(max_diff(o, d.o, n_q(&g, Dv)) < 1e-13, "page_size %d: o", ps);
        CHECK_MSG(max_diff(lse, d.lse, n_q(&g, 1)) < 1e-13, "page_size %d: lse", ps);

        /* sequence 1 empty: its rows see nothing */
        lens[1] = 0;
        ref_paged_forward(&pp, &pg, d.q, o, lse);
        int64_t half = n_q(&g, 1) / 2;
        CHECK(max_diff(lse, d.lse, half) < 1e-13);
        for (int64_t r = half; r < 2 * half; r++) {
            CHECK(lse[r] == -INFINITY);
            for (int c = 0; c < Dv; c++)
                CHECK(o[r * Dv + c] == 0.0);
        }
        free(o);
        free(lse);
        free(kc);
        free(vc);
        free(table);
        free_data(&d);
    }
}

int main(void)
{
    test_philox_known_answers();
    test_dropout_layout();
    test_dropout_statistics();
    test_forward_by_hand();
    test_masks();
    test_offset_invariance();
    test_shards();
    test_shards_bottom_right();
    test_gqa();
    test_varlens();
    test_bias_broadcast();
    test_bias_as_extra_column();
    test_merge();
    test_backward_finite_differences();
    test_dropout_forward();
    test_builtin_expressions();
    test_document_mask();
    test_paged();
    return check_report();
}
