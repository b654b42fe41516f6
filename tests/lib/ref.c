/*
 * ref.c -- the float64 reference implementation of attention (see ref.h).
 *
 * Every entry point walks the same loop nest, one query row at a time:
 *
 *     for each sequence b, query head h (kv head hk = h / (Hq / Hkv)):
 *         for each query row i:
 *             row_scores()   t_ij (pre-softcap) and s_ij (final, -inf if hidden)
 *             ... forward or backward formula for that row ...
 *
 * so that forward and backward cannot disagree on a score, a mask or a
 * dropout decision.  No blocking, no online softmax: the row is built whole.
 */
#include "ref.h"

#include "ir/op.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- checks */

/* A malformed problem is a bug in the calling test: say what and stop. */
static void ref_fail(const char *what)
{
    fprintf(stderr, "ref: invalid problem: %s\n", what);
    abort();
}

static void check_cu(const int32_t *cu, int B, const char *name)
{
    if (cu[0] != 0)
        ref_fail(name);
    for (int b = 0; b < B; b++)
        if (cu[b + 1] < cu[b])
            ref_fail(name);
}

static void check_problem(const ref_problem *p)
{
    if (p->B < 0 || p->Hq < 1 || p->Hkv < 1 || p->Hq % p->Hkv != 0)
        ref_fail("B >= 0, Hq >= 1, Hkv >= 1 and Hq % Hkv == 0 are required");
    if (p->D < 1 || p->Dv < 1)
        ref_fail("D and Dv must be >= 1");
    if (p->cu_q) {
        if (!p->cu_k)
            ref_fail("varlen needs both cu_q and cu_k");
        check_cu(p->cu_q, p->B, "cu_q must start at 0 and not decrease");
        check_cu(p->cu_k, p->B, "cu_k must start at 0 and not decrease");
        if (p->bias)
            ref_fail("bias is supported in the padded layout only");
    } else if (p->Sq < 0 || p->Sk < 0) {
        ref_fail("Sq and Sk must be >= 0");
    }
    if ((int)p->mask < 0 || (int)p->mask >= AJ_MASK_COUNT)
        ref_fail("mask kind out of range");
    if ((int)p->align < 0 || (int)p->align >= AJ_ALIGN_COUNT)
        ref_fail("align out of range");
    if ((p->mask == AJ_MASK_EXPR || p->score_expr) && !p->expr)
        ref_fail("an expression mask or score_mod needs expr");
    if (p->score_expr && (p->softcap != 0.0 || p->alibi_slopes))
        ref_fail("a score_mod expression replaces softcap and alibi");
    if (!(p->softcap >= 0.0) || !isfinite(p->softcap))
        ref_fail("softcap must be 0 (none) or a finite positive cap");
    if (!(p->dropout_p >= 0.0 && p->dropout_p < 1.0))
        ref_fail("dropout_p must be in [0, 1)");
    if (p->bias) {
        const int64_t full[4] = {p->B, p->Hq, p->Sq, p->Sk};
        for (int d = 0; d < 4; d++)
            if (p->bias_shape[d] != 1 && p->bias_shape[d] != full[d])
                ref_fail("each bias_shape dim must be 1 or the full size");
    }
}

/* ---------------------------------------------------------------- indexing */

/* One (sequence, query head) pair: the unit the loop nest works on. */
typedef struct ref_slice {
    int64_t b;       /* batch index (padded) or sequence index (varlen) */
    int64_t h;       /* query head */
    int64_t hk;      /* kv head it reads: h / (Hq / Hkv) */
    int64_t sq, sk;  /* query and key counts of this sequence */
    int64_t sq_total, sk_total;
    int64_t shift;   /* mask diagonal: 0 or sk_total - sq_total */
    int64_t q_base;  /* position of row 0 past q_offset: 0, or sk - sq (queries_last) */
    double scale;    /* resolved: never 0 */
} ref_slice;

static ref_slice make_slice(const ref_problem *p, int64_t b, int64_t h)
{
    ref_slice sl = {.b = b, .h = h, .hk = h / (p->Hq / p->Hkv)};
    if (p->cu_q) {
        sl.sq = p->cu_q[b + 1] - p->cu_q[b];
        sl.sk = p->cu_k[b + 1] - p->cu_k[b];
    } else {
        sl.sq = p->Sq;
        sl.sk = p->Sk;
    }
    sl.sq_total = p->sq_total ? p->sq_total : sl.sq;
    sl.sk_total = p->sk_total ? p->sk_total : sl.sk;
    if (p->queries_last) {
        sl.q_base = sl.sk - sl.sq;
        sl.sq_total = sl.sk_total = sl.sk;
    }
    if (p->align == AJ_ALIGN_BOTTOM_RIGHT)
        sl.shift = sl.sk_total - sl.sq_total;
    sl.scale = p->scale != 0.0 ? p->scale : 1.0 / sqrt((double)p->D);
    return sl;
}

/* Element offset of row i (query side) of head `head` in a tensor of
 * `heads` heads and row width `width`: BHSD when padded, THD when varlen. */
static int64_t q_row_at(const ref_problem *p, const ref_slice *sl, int64_t i,
                        int64_t width)
{
    if (p->cu_q)
        return ((p->cu_q[sl->b] + i) * p->Hq + sl->h) * width;
    return ((sl->b * p->Hq + sl->h) * p->Sq + i) * width;
}

/* Same for row j of the key side (k, v, dk, dv), which has Hkv heads. */
static int64_t k_row_at(const ref_problem *p, const ref_slice *sl, int64_t j,
                        int64_t width)
{
    if (p->cu_k)
        return ((p->cu_k[sl->b] + j) * p->Hkv + sl->hk) * width;
    return ((sl->b * p->Hkv + sl->hk) * p->Sk + j) * width;
}

/* lse[B][Hq][Sq] when padded, lse[Hq][Tq] when varlen. */
static int64_t lse_at(const ref_problem *p, const ref_slice *sl, int64_t i)
{
    if (p->cu_q)
        return sl->h * p->cu_q[p->B] + p->cu_q[sl->b] + i;
    return (sl->b * p->Hq + sl->h) * p->Sq + i;
}

/* Element offset of bias[b,h,i,j] in a tensor of shape bias_shape: a
 * size-1 dim always reads index 0 (broadcast). */
static int64_t bias_at(const ref_problem *p, const ref_slice *sl, int64_t i,
                       int64_t j)
{
    const int64_t *shape = p->bias_shape;
    const int64_t idx[4] = {sl->b, sl->h, i, j};
    int64_t at = 0;
    for (int d = 0; d < 4; d++)
        at = at * shape[d] + (shape[d] == 1 ? 0 : idx[d]);
    return at;
}

/* ---------------------------------------------------------------- scores */

static double dot(const double *x, const double *y, int n)
{
    double acc = 0.0;
    for (int c = 0; c < n; c++)
        acc += x[c] * y[c];
    return acc;
}

/* The point (i, j) of the slice as the expression interpreter sees it. */
static aj_expr_env expr_env(const ref_problem *p, const ref_slice *sl,
                            int64_t i, int64_t j, double score)
{
    return (aj_expr_env){
        .b = sl->b, .h = sl->h, .q = p->q_offset + sl->q_base + i,
        .k = p->kv_offset + j,
        .sq = sl->sq_total, .sk = sl->sk_total, .score = score,
        .tensors = p->tensors, .tensor_count = p->tensor_count,
    };
}

/* Whether key j is visible from query i, on global positions. */
static bool visible(const ref_problem *p, const ref_slice *sl, int64_t i,
                    int64_t j)
{
    int64_t q_pos = p->q_offset + sl->q_base + i;
    int64_t kv_pos = p->kv_offset + j;
    int64_t diag = q_pos + sl->shift;
    switch (p->mask) {
    case AJ_MASK_CAUSAL:
        return kv_pos <= diag;
    case AJ_MASK_WINDOW:
        return diag - p->window_left <= kv_pos && kv_pos <= diag + p->window_right;
    case AJ_MASK_EXPR: {
        aj_expr_env env = expr_env(p, sl, i, j, 0.0);
        return aj_expr_eval_bool(p->expr, p->mask_root, &env);
    }
    default:
        return true;
    }
}

/* The final score for the pre-softcap score t, and ds/dt in *g. */
static double score_of(const ref_problem *p, const ref_slice *sl, int64_t i,
                       int64_t j, double t, double *g)
{
    if (p->score_expr) {
        aj_expr_env env = expr_env(p, sl, i, j, t);
        return aj_expr_eval_grad(p->expr, p->score_root, &env, g);
    }
    double s = t;
    *g = 1.0;
    if (p->softcap != 0.0) {
        double th = tanh(t / p->softcap);
        s = p->softcap * th;
        *g = 1.0 - th * th;
    }
    if (p->alibi_slopes) {
        int64_t dist = (p->q_offset + sl->q_base + i) - (p->kv_offset + j);
        s -= p->alibi_slopes[sl->h] * (double)llabs(dist);
    }
    return s;
}

bool ref_visible(const ref_problem *p, int64_t b, int64_t h, int64_t i,
                 int64_t j)
{
    ref_slice sl = make_slice(p, b, h);
    return visible(p, &sl, i, j);
}

double ref_score(const ref_problem *p, int64_t b, int64_t h, int64_t i,
                 int64_t j, double t, double *ds_dt)
{
    ref_slice sl = make_slice(p, b, h);
    double g;
    double s = score_of(p, &sl, i, j, t, &g);
    if (ds_dt)
        *ds_dt = g;
    return s;
}

/* Scores of query row i against every key of the slice:
 *   t    = scale * q.k + bias            (the pre-softcap score)
 *   s[j] = softcap(t) - alibi distance, or the score_mod expression at t
 *          (the final score; -inf if hidden)
 *   g[j] = ds/dt                         (for the backward's chain rule) */
static void row_scores(const ref_problem *p, const ref_slice *sl,
                       const double *q, const double *k, int64_t i,
                       double *g, double *s)
{
    const double *qi = q + q_row_at(p, sl, i, p->D);
    for (int64_t j = 0; j < sl->sk; j++) {
        double tj = sl->scale * dot(qi, k + k_row_at(p, sl, j, p->D), p->D);
        if (p->bias)
            tj += p->bias[bias_at(p, sl, i, j)];
        double sj = score_of(p, sl, i, j, tj, &g[j]);
        s[j] = visible(p, sl, i, j) ? sj : -INFINITY;
    }
}

/* The factor dropout puts on P_ij: keep / (1 - p), or 1 without dropout. */
static double dropout_factor(const ref_problem *p, const ref_slice *sl,
                             int64_t i, int64_t j)
{
    if (p->dropout_p == 0.0)
        return 1.0;
    bool keep = ref_dropout_keep(p->seed, p->offset, sl->b, sl->h, p->Hq,
                                 p->q_offset + sl->q_base + i, p->kv_offset + j, p->dropout_p);
    return keep ? 1.0 / (1.0 - p->dropout_p) : 0.0;
}

/* The largest key count of any sequence: the length of a row buffer. */
static int64_t max_keys(const ref_problem *p)
{
    if (!p->cu_k)
        return p->Sk;
    int64_t most = 0;
    for (int b = 0; b < p->B; b++)
        if (p->cu_k[b + 1] - p->cu_k[b] > most)
            most = p->cu_k[b + 1] - p->cu_k[b];
    return most;
}

static double *alloc_row(int64_t n)
{
    double *row = malloc((size_t)(n > 0 ? n : 1) * sizeof *row);
    if (!row)
        ref_fail("out of memory for a score row");
    return row;
}

/* Element counts of the q-side and k-side tensors with row width w. */
static int64_t q_elems(const ref_problem *p, int64_t w)
{
    int64_t rows = p->cu_q ? p->cu_q[p->B] : (int64_t)p->B * p->Sq;
    return rows * p->Hq * w;
}

static int64_t k_elems(const ref_problem *p, int64_t w)
{
    int64_t rows = p->cu_k ? p->cu_k[p->B] : (int64_t)p->B * p->Sk;
    return rows * p->Hkv * w;
}

/* ---------------------------------------------------------------- forward */

void ref_forward(const ref_problem *p, const double *q, const double *k,
                 const double *v, double *o, double *lse)
{
    check_problem(p);
    double *g = alloc_row(max_keys(p));
    double *s = alloc_row(max_keys(p));
    for (int64_t b = 0; b < p->B; b++) {
        for (int64_t h = 0; h < p->Hq; h++) {
            ref_slice sl = make_slice(p, b, h);
            for (int64_t i = 0; i < sl.sq; i++) {
                double *oi = o + q_row_at(p, &sl, i, p->Dv);
                memset(oi, 0, (size_t)p->Dv * sizeof *oi);
                row_scores(p, &sl, q, k, i, g, s);

                /* LSE, stably: max first.  A max of -inf means no key is
                 * visible (or every visible score is -inf): O = 0, LSE = -inf.
                 * A NaN score (a NaN or Inf input) makes the whole row NaN,
                 * as IEEE arithmetic would; it is never hidden as "no key". */
                double row_max = -INFINITY;
                int nan_score = 0;
                for (int64_t j = 0; j < sl.sk; j++) {
                    nan_score |= isnan(s[j]);
                    row_max = fmax(row_max, s[j]);
                }
                if (nan_score) {
                    if (lse)
                        lse[lse_at(p, &sl, i)] = NAN;
                    for (int c = 0; c < p->Dv; c++)
                        oi[c] = NAN;
                    continue;
                }
                /* a sink is one more term of the denominator */
                double sink = p->sinks ? p->sinks[h] : -INFINITY;
                row_max = fmax(row_max, sink);
                double row_lse = -INFINITY;
                if (row_max != -INFINITY) {
                    double sum = exp(sink - row_max);
                    for (int64_t j = 0; j < sl.sk; j++)
                        sum += exp(s[j] - row_max);
                    row_lse = row_max + log(sum);
                }
                if (lse)
                    lse[lse_at(p, &sl, i)] = row_lse;
                if (row_lse == -INFINITY)
                    continue;

                /* O = dropout(P) V */
                for (int64_t j = 0; j < sl.sk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    double w = exp(s[j] - row_lse) * dropout_factor(p, &sl, i, j);
                    if (w == 0.0)
                        continue;
                    const double *vj = v + k_row_at(p, &sl, j, p->Dv);
                    for (int c = 0; c < p->Dv; c++)
                        oi[c] += w * vj[c];
                }
            }
        }
    }
    free(g);
    free(s);
}

/* ---------------------------------------------------------------- backward */

/*
 * The gradient of a scalar loss L through O, with dO = dL/dO.  Per row i,
 * with t_ij the pre-softcap score, s_ij the final score, m_ij the dropout
 * factor (keep_ij / (1-p), or 1):
 *
 *     O_i     = sum_j P_ij m_ij v_j,           P_ij = exp(s_ij - LSE_i)
 *     dV_j   += P_ij m_ij dO_i                  (the dropped P, transposed)
 *     dP_ij   = m_ij (dO_i . v_j)               (gradient w.r.t. P_ij)
 *     Delta_i = dO_i . O_i  =  sum_j P_ij dP_ij
 *     dS_ij   = P_ij (dP_ij - Delta_i)          (softmax backward)
 *     dT_ij   = dS_ij * ds_ij/dt_ij             (softcap: 1 - tanh^2(t_ij / C);
 *                                               an expression: its derivative;
 *                                               1 without)
 *     dQ_i   += scale * dT_ij k_j
 *     dK_j   += scale * dT_ij q_i
 *     dBias  += dT_ij at bias[b,h,i,j]          (summed over broadcast dims)
 *
 * Alibi and the mask are constants added to s, so they have no gradient of
 * their own, and no gradient flows to an expression's side tensors; a hidden key has P_ij = 0 and so contributes nothing, and a
 * row with LSE = -inf contributes nothing at all.  dK and dV sum over the
 * query heads of a GQA group simply because every head of the group adds
 * into the same kv-head rows.  Delta is computed from the given O (as a
 * kernel does), so O and LSE must come from ref_forward on the same inputs.
 */
/* One visible element (i, j) of a backward's slice: the rows and keys it
 * reads, the pre-mod score t, ds/dt (g), P, dropout's factor m and dS =
 * P (m dO . v - Delta), the gradient of the score s. */
typedef struct ref_elem {
    const ref_slice *sl;
    int64_t i, j;
    const double *qi, *kj, *vj, *doi;
    double t, g, p, m, ds;
} ref_elem;

/* Calls fn for every visible element of the problem, row by row. */
static void each_visible(const ref_problem *p, const double *q, const double *k,
                         const double *v, const double *o, const double *lse,
                         const double *dout, void (*fn)(void *, const ref_elem *), void *user)
{
    double *g = alloc_row(max_keys(p));
    double *s = alloc_row(max_keys(p));
    for (int64_t b = 0; b < p->B; b++) {
        for (int64_t h = 0; h < p->Hq; h++) {
            ref_slice sl = make_slice(p, b, h);
            for (int64_t i = 0; i < sl.sq; i++) {
                double row_lse = lse[lse_at(p, &sl, i)];
                if (row_lse == -INFINITY)
                    continue;
                row_scores(p, &sl, q, k, i, g, s);
                ref_elem e = {.sl = &sl, .i = i, .qi = q + q_row_at(p, &sl, i, p->D),
                              .doi = dout + q_row_at(p, &sl, i, p->Dv)};
                double delta = dot(e.doi, o + q_row_at(p, &sl, i, p->Dv), p->Dv);
                for (int64_t j = 0; j < sl.sk; j++) {
                    if (s[j] == -INFINITY)
                        continue;
                    e.j = j;
                    e.kj = k + k_row_at(p, &sl, j, p->D);
                    e.vj = v + k_row_at(p, &sl, j, p->Dv);
                    e.t = sl.scale * dot(e.qi, e.kj, p->D);
                    if (p->bias)
                        e.t += p->bias[bias_at(p, &sl, i, j)];
                    e.g = g[j];
                    e.p = exp(s[j] - row_lse);
                    e.m = dropout_factor(p, &sl, i, j);
                    e.ds = e.p * (e.m * dot(e.doi, e.vj, p->Dv) - delta);
                    fn(user, &e);
                }
            }
        }
    }
    free(g);
    free(s);
}

typedef struct backward_out {
    const ref_problem *p;
    double *dq, *dk, *dv, *dbias;
} backward_out;

static void backward_elem(void *user, const ref_elem *e)
{
    backward_out *x = user;
    const ref_problem *p = x->p;
    double *dqi = x->dq + q_row_at(p, e->sl, e->i, p->D);
    double *dkj = x->dk + k_row_at(p, e->sl, e->j, p->D);
    double *dvj = x->dv + k_row_at(p, e->sl, e->j, p->Dv);
    for (int c = 0; c < p->Dv; c++)
        dvj[c] += e->p * e->m * e->doi[c];
    double dt = e->ds * e->g;
    for (int c = 0; c < p->D; c++) {
        dqi[c] += e->sl->scale * dt * e->kj[c];
        dkj[c] += e->sl->scale * dt * e->qi[c];
    }
    if (x->dbias)
        x->dbias[bias_at(p, e->sl, e->i, e->j)] += dt;
}

void ref_backward(const ref_problem *p, const double *q, const double *k,
                  const double *v, const double *o, const double *lse,
                  const double *dout, double *dq, double *dk, double *dv,
                  double *dbias)
{
    check_problem(p);
    memset(dq, 0, (size_t)q_elems(p, p->D) * sizeof *dq);
    memset(dk, 0, (size_t)k_elems(p, p->D) * sizeof *dk);
    memset(dv, 0, (size_t)k_elems(p, p->Dv) * sizeof *dv);
    bool want_dbias = p->bias && dbias;
    if (want_dbias) {
        const int64_t *shape = p->bias_shape;
        int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
        memset(dbias, 0, (size_t)n * sizeof *dbias);
    }
    backward_out x = {p, dq, dk, dv, want_dbias ? dbias : NULL};
    each_visible(p, q, k, v, o, lse, dout, backward_elem, &x);
}

void ref_sinks_grad(const ref_problem *p, const double *o, const double *lse,
                    const double *dout, double *dsinks)
{
    check_problem(p);
    for (int64_t h = 0; h < p->Hq; h++) {
        dsinks[h] = 0.0;
        for (int64_t b = 0; b < p->B; b++) {
            ref_slice sl = make_slice(p, b, h);
            for (int64_t i = 0; i < sl.sq; i++) {
                double row_lse = lse[lse_at(p, &sl, i)];
                if (row_lse == -INFINITY)
                    continue;
                const double *oi = o + q_row_at(p, &sl, i, p->Dv);
                const double *doi = dout + q_row_at(p, &sl, i, p->Dv);
                dsinks[h] -= exp(p->sinks[h] - row_lse) * dot(doi, oi, p->Dv);
            }
        }
    }
}

typedef struct side_grad_out {
    const ref_problem *p;
    int tensor;
    double *grad;
} side_grad_out;

/* The elements of the tensor the score reads at e, then d score / d each. */
static void side_grad_elem(void *user, const ref_elem *e)
{
    side_grad_out *x = user;
    if (x->tensor == REF_ALIBI_SLOPES) {   /* d(u - slope[h] |dist|) / d slope[h] */
        int64_t dist = (x->p->q_offset + e->sl->q_base + e->i) - (x->p->kv_offset + e->j);
        x->grad[e->sl->h] -= e->ds * (double)llabs(dist);
        return;
    }
    enum { LOADED_MAX = 64 };
    int64_t loaded[LOADED_MAX];
    int count = 0;
    aj_expr_env env = expr_env(x->p, e->sl, e->i, e->j, e->t);
    env.grad_tensor = x->tensor + 1;
    env.grad_elem = -1;
    env.loaded = loaded;
    env.loaded_cap = LOADED_MAX;
    env.nloaded = &count;
    double d;
    aj_expr_eval_grad(x->p->expr, x->p->score_root, &env, &d);
    env.loaded = NULL;
    for (int a = 0; a < count; a++) {
        bool seen = false;
        for (int b = 0; b < a; b++)
            seen = seen || loaded[b] == loaded[a];
        if (seen)
            continue;
        env.grad_elem = loaded[a];
        aj_expr_eval_grad(x->p->expr, x->p->score_root, &env, &d);
        x->grad[loaded[a]] += e->ds * d;
    }
}

void ref_side_grad(const ref_problem *p, const double *q, const double *k, const double *v,
                   const double *o, const double *lse, const double *dout, int tensor,
                   double *grad)
{
    check_problem(p);
    int64_t n = p->Hq;
    if (tensor == REF_ALIBI_SLOPES) {
        if (!p->alibi_slopes)
            ref_fail("ref_side_grad: REF_ALIBI_SLOPES without alibi_slopes");
    } else if (!p->score_expr || tensor < 0 || tensor >= p->tensor_count) {
        ref_fail("ref_side_grad: a score_mod expression and one of its tensors");
    } else {
        const aj_side_tensor *t = &p->tensors[tensor];
        n = 1;
        for (int d = 0; d < t->rank; d++)
            n *= t->shape[d];
    }
    memset(grad, 0, (size_t)n * sizeof *grad);
    side_grad_out x = {p, tensor, grad};
    each_visible(p, q, k, v, o, lse, dout, side_grad_elem, &x);
}

/* ---------------------------------------------------------------- merge */

void ref_merge(int64_t rows, int dv, const double *o1, const double *lse1,
               const double *o2, const double *lse2, double *o, double *lse)
{
    for (int64_t r = 0; r < rows; r++) {
        double l1 = lse1[r], l2 = lse2[r];
        if (l1 == -INFINITY && l2 == -INFINITY) {
            for (int c = 0; c < dv; c++)
                o[r * dv + c] = 0.0;
            lse[r] = -INFINITY;
            continue;
        }
        /* logaddexp, stably; one side may be -inf (exp gives 0). */
        double m = fmax(l1, l2);
        double l = m + log(exp(l1 - m) + exp(l2 - m));
        double w1 = l1 == -INFINITY ? 0.0 : exp(l1 - l);
        double w2 = l2 == -INFINITY ? 0.0 : exp(l2 - l);
        for (int c = 0; c < dv; c++) {
            double a = w1 != 0.0 ? o1[r * dv + c] * w1 : 0.0;
            double z = w2 != 0.0 ? o2[r * dv + c] * w2 : 0.0;
            o[r * dv + c] = a + z;
        }
        lse[r] = l;
    }
}

/* ---------------------------------------------------------------- dropout */

bool ref_dropout_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t h,
                      int64_t Hq, int64_t q_pos, int64_t kv_pos, double p)
{
    const uint32_t key[2] = {
        (uint32_t)seed,
        (uint32_t)(seed >> 32) ^ (uint32_t)(offset >> 32),
    };
    const uint32_t ctr[4] = {
        (uint32_t)(uint64_t)kv_pos,
        (uint32_t)(uint64_t)q_pos,
        (uint32_t)(uint64_t)(b * Hq + h),
        (uint32_t)offset,
    };
    uint32_t out[4];
    ref_philox4x32_10(ctr, key, out);
    double u = ldexp((double)(out[0] >> 8), -24);  /* 24 bits in [0, 1) */
    return u >= p;
}

/*
 * Philox4x32-10.  One round on the 4-word counter (x0, x1, x2, x3) with the
 * round key (k0, k1), where hi/lo are the halves of a 32x32 -> 64 product:
 *
 *     x0' = hi(M1 * x2) ^ x1 ^ k0      x1' = lo(M1 * x2)
 *     x2' = hi(M0 * x0) ^ x3 ^ k1      x3' = lo(M0 * x0)
 *
 * and the key takes a Weyl step (k0 += W0, k1 += W1) between rounds.
 */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define PHILOX_ROUNDS 10

void ref_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                       uint32_t out[4])
{
    uint32_t x[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < PHILOX_ROUNDS; round++) {
        if (round > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * x[0];
        uint64_t p1 = (uint64_t)PHILOX_M1 * x[2];
        uint32_t y0 = (uint32_t)(p1 >> 32) ^ x[1] ^ k0;
        uint32_t y1 = (uint32_t)p1;
        uint32_t y2 = (uint32_t)(p0 >> 32) ^ x[3] ^ k1;
        uint32_t y3 = (uint32_t)p0;
        x[0] = y0;
        x[1] = y1;
        x[2] = y2;
        x[3] = y3;
    }
    memcpy(out, x, sizeof x);
}

void ref_use_expressions(ref_problem *p, const aj_op *op, const aj_side_tensor *side, int count)
{
    p->expr = &op->expr;
    if (op->mask.kind == AJ_MASK_EXPR) {
        p->mask = AJ_MASK_EXPR;
        p->mask_root = op->mask.root;
    }
    if (op->score_mod.kind == AJ_SCORE_MOD_EXPR) {
        p->score_expr = true;
        p->score_root = op->score_mod.root;
    }
    p->tensors = side;
    p->tensor_count = count;
}

/* ---------------------------------------------------------------- paged */

void ref_paged_forward(const ref_problem *p, const ref_paged *pg, const double *q,
                       double *o, double *lse)
{
    const bool packed = p->cu_q != NULL;
    if (p->bias || p->dropout_p != 0.0 || (!packed && p->Sq < 0))
        ref_fail("a paged forward takes no bias or dropout");
    int B = p->B, Sq = p->Sq, D = p->D, Dv = p->Dv;
    int32_t *cu_q = malloc((size_t)(B + 1) * sizeof *cu_q);
    int32_t *cu_k = malloc((size_t)(B + 1) * sizeof *cu_k);
    if (!cu_q || !cu_k)
        ref_fail("out of memory");
    cu_q[0] = cu_k[0] = 0;
    for (int b = 0; b < B; b++) {
        int32_t len = pg->seqlens_k[b];
        if (len < 0 || len > (int64_t)pg->max_pages * pg->page_size)
            ref_fail("seqlens_k[b] must be in 0 .. max_pages * page_size");
        cu_q[b + 1] = packed ? p->cu_q[b + 1] : cu_q[b] + Sq;
        if (packed && (cu_q[b + 1] < cu_q[b] || cu_q[b + 1] - cu_q[b] > len))
            ref_fail("sequence b's queries must be 0 .. seqlens_k[b]");
        cu_k[b + 1] = cu_k[b] + len;
    }
    int64_t tq = cu_q[B], tk = cu_k[B];
    double *kp = calloc((size_t)(tk * p->Hkv * D + 1), sizeof *kp);
    double *vp = calloc((size_t)(tk * p->Hkv * Dv + 1), sizeof *vp);
    double *qp = calloc((size_t)(tq * p->Hq * D + 1), sizeof *qp);
    double *op = calloc((size_t)(tq * p->Hq * Dv + 1), sizeof *op);
    double *lp = calloc((size_t)(tq * p->Hq + 1), sizeof *lp);
    if (!kp || !vp || !qp || !op || !lp)
        ref_fail("out of memory");
    /* gather: key j of sequence b from its page, dequantised */
    for (int b = 0; b < B; b++)
        for (int64_t j = 0; j < pg->seqlens_k[b]; j++) {
            int32_t page = pg->block_table[(int64_t)b * pg->max_pages + j / pg->page_size];
            if (page < 0 || page >= pg->num_pages)
                ref_fail("a block_table entry is outside the cache");
            int64_t row = (int64_t)page * pg->page_size + j % pg->page_size;
            for (int hk = 0; hk < p->Hkv; hk++) {
                for (int c = 0; c < D; c++)
                    kp[((cu_k[b] + j) * p->Hkv + hk) * D + c] =
                        pg->k_scale * pg->k_cache[(row * p->Hkv + hk) * D + c];
                for (int c = 0; c < Dv; c++)
                    vp[((cu_k[b] + j) * p->Hkv + hk) * Dv + c] =
                        pg->v_scale * pg->v_cache[(row * p->Hkv + hk) * Dv + c];
            }
        }
    ref_problem v = *p;
    v.cu_q = cu_q;
    v.cu_k = cu_k;
    v.queries_last = true;
    if (packed) {   /* the packed layout is the varlen reference's own */
        ref_forward(&v, q, kp, vp, o, lse);
    } else {
        /* BHSD <-> THD for the queries and outputs, [B][Hq][Sq] <-> [Hq][Tq] */
        for (int b = 0; b < B; b++)
            for (int h = 0; h < p->Hq; h++)
                for (int i = 0; i < Sq; i++)
                    memcpy(&qp[((int64_t)(cu_q[b] + i) * p->Hq + h) * D],
                           &q[(((int64_t)b * p->Hq + h) * Sq + i) * D], (size_t)D * sizeof *q);
        ref_forward(&v, qp, kp, vp, op, lp);
        for (int b = 0; b < B; b++)
            for (int h = 0; h < p->Hq; h++)
                for (int i = 0; i < Sq; i++) {
                    int64_t at = ((int64_t)b * p->Hq + h) * Sq + i;
                    memcpy(&o[at * Dv], &op[((int64_t)(cu_q[b] + i) * p->Hq + h) * Dv],
                           (size_t)Dv * sizeof *o);
                    if (lse)
                        lse[at] = lp[(int64_t)h * tq + cu_q[b] + i];
                }
    }
    free(cu_q);
    free(cu_k);
    free(kp);
    free(vp);
    free(qp);
    free(op);
    free(lp);
}
