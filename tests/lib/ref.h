/*
 * ref.h -- the float64 reference implementation of attention.
 *
 * This is the oracle every numeric test of every target (sim, cpu, cuda) is
 * compared against, so it is written to be obviously correct, not fast: one
 * plain loop nest per formula of docs/design.md "Semantics", in double precision.
 * It is test code (linked into test executables, never into libattnjit) and
 * aborts with a message on a malformed problem.
 *
 * Scores, in the order they are built (positions are global:
 * q_pos = q_offset + i, kv_pos = kv_offset + j):
 *
 *     t = scale * q_i . k_j  +  bias[b,h,i,j]          (pre-softcap score)
 *     u = softcap ? C * tanh(t / C) : t
 *     s = u - slope[h] * |q_pos - kv_pos|              (alibi, if slopes given)
 *     s = E(score = t)                     (a score_mod expression instead)
 *     s = -inf where the mask (built-in or expression) hides kv_pos from q_pos
 *
 *     shift = 0 (top_left) or sk_total - sq_total (bottom_right)
 *     causal:            kv_pos <= q_pos + shift
 *     window(left,right): q_pos + shift - left <= kv_pos <= q_pos + shift + right
 *
 *     LSE_i = log (sum_j exp(s_ij) + exp(sink_h))   (natural log; -inf if no key
 *                                          is visible and there is no sink)
 *     P_ij  = exp(s_ij - LSE_i)           (0 where hidden)
 *     O_i   = sum_j P_ij * drop_ij * v_j  (drop_ij = keep_ij / (1 - p))
 *
 * A row with no visible key gives O = 0 and LSE = -inf, never NaN.
 * Query head h reads kv head h / (Hq / Hkv).
 */
#ifndef AJ_TESTS_REF_H
#define AJ_TESTS_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "attnjit/attnjit.h"
#include "ir/expr.h"

typedef struct ref_problem {
    int B, Hq, Hkv, D, Dv;
    /* Padded layout (cu_q == NULL): every batch has Sq queries and Sk keys;
     * tensors are contiguous BHSD: q[B][Hq][Sq][D], k[B][Hkv][Sk][D],
     * v[B][Hkv][Sk][Dv], o[B][Hq][Sq][Dv], lse[B][Hq][Sq]. */
    int Sq, Sk;
    /* Varlen layout (cu_q != NULL, then cu_k != NULL too, both [B + 1]):
     * sequence b has queries cu_q[b] .. cu_q[b+1]-1 and keys
     * cu_k[b] .. cu_k[b+1]-1; tensors are packed THD: q[Tq][Hq][D],
     * k[Tk][Hkv][D], v[Tk][Hkv][Dv], o[Tq][Hq][Dv], and lse[Hq][Tq]
     * (the PyTorch / FlashAttention varlen LSE layout), Tq = cu_q[B].
     * Sq and Sk are unused.  Row i of sequence b has q_pos = q_offset + i
     * (positions restart at every sequence); b is the sequence index. */
    const int32_t *cu_q, *cu_k;
    aj_mask_kind mask;              /* AJ_MASK_NONE / CAUSAL / WINDOW / EXPR */
    aj_align align;                 /* top_left: shift 0; bottom_right: shift =
                                       sk_total - sq_total */
    int64_t window_left, window_right;
    int64_t q_offset, kv_offset;    /* q_pos = q_offset + i, kv_pos = kv_offset + j */
    /* For the bottom_right shift; 0 means the call's own length (per
     * sequence for varlen), each total independently. */
    int64_t sq_total, sk_total;
    double scale;                   /* 0 means 1/sqrt(D) */
    double softcap;                 /* 0 means none; else s = C*tanh(s/C) */
    const double *alibi_slopes;     /* NULL: none; else [Hq] */
    /* NULL: none; else [Hq] learned sink logits: each row's softmax
     * denominator gains exp(sinks[h]), its LSE includes it, O does not */
    const double *sinks;
    /* NULL: none; else an additive bias of shape bias_shape, each of the 4
     * dims 1 or the full size (B, Hq, Sq, Sk), contiguous, broadcast over
     * the size-1 dims.  Padded layout only. */
    const double *bias;
    int64_t bias_shape[4];
    double dropout_p;               /* 0 means none; else 0 < p < 1 */
    uint64_t seed, offset;          /* the dropout stream */
    /* Expressions, evaluated by ir/expr.h's interpreter at b, h, q = q_pos,
     * k = kv_pos, sq = sq_total, sk = sk_total (the defaults above), and
     * score = t: `expr` holds the nodes (an op's arena); mask_root is read
     * when mask == AJ_MASK_EXPR, score_root when score_expr is set (then
     * softcap and alibi_slopes must be unset).  tensors[0 .. tensor_count-1]
     * are the side tensors in declaration order (out of range reads 0). */
    const aj_expr *expr;
    uint16_t mask_root, score_root;
    bool score_expr;
    const aj_side_tensor *tensors;
    int tensor_count;
    /* Varlen only: each sequence's queries are the last of its keys (the
     * paged layout, ref_paged_forward): row i of sequence b has q_pos =
     * q_offset + len_k(b) - len_q(b) + i, and both totals are len_k(b),
     * so the shift is 0 whatever the alignment. */
    bool queries_last;
} ref_problem;

/*
 * A paged KV cache (docs/ir.md "paged"): k_cache [num_pages][page_size]
 * [Hkv][D] and v_cache [..][Dv] hold the stored values (an f8 cache's
 * codes decoded, not yet scaled), key position p of sequence b is row p %
 * page_size of page block_table[b][p / page_size], seqlens_k[b] keys.
 */
typedef struct ref_paged {
    int num_pages, page_size, max_pages;
    const double *k_cache, *v_cache;
    const int32_t *block_table;   /* [B][max_pages] */
    const int32_t *seqlens_k;     /* [B] */
    double k_scale, v_scale;      /* the dequantisation factors (1 for f16 / bf16) */
} ref_paged;

/* The forward over a paged cache: p gives B, Hq, Hkv, D, Dv, Sq (q
 * [B][Hq][Sq][D], o [B][Hq][Sq][Dv], lse [B][Hq][Sq]) and the mask, mods
 * and expressions (no bias, no dropout); the keys are gathered through
 * the table and scaled, then it is ref_forward over the sequences with
 * queries_last.  Varlen queries (chunked prefill): with p->cu_q set, q
 * [Tq][Hq][D], o [Tq][Hq][Dv] and lse [Hq][Tq] are packed, sequence b's
 * queries the last cu_q[b + 1] - cu_q[b] (<= seqlens_k[b]) of its
 * positions (Sq unused). */
void ref_paged_forward(const ref_problem *p, const ref_paged *pg, const double *q,
                       double *o, double *lse);

/* The expression fields of p from a parsed op whose mask or score_mod (or
 * both) is expr(...): the interpreter reads the op's nodes, the ones the
 * kernel compiled.  side[0 .. count-1] are the op's side tensors in host
 * memory, in declaration order.  p keeps pointers into op and side. */
void ref_use_expressions(ref_problem *p, const aj_op *op, const aj_side_tensor *side, int count);

/* Whether key j is visible from query i of sequence b, query head h, and
 * the final score s_ij for the pre-softcap score t, with ds/dt in *ds_dt
 * (may be NULL): the two steps every entry point below takes, exposed so
 * tests can compare forms position by position. */
bool ref_visible(const ref_problem *p, int64_t b, int64_t h, int64_t i,
                 int64_t j);
double ref_score(const ref_problem *p, int64_t b, int64_t h, int64_t i,
                 int64_t j, double t, double *ds_dt);

/* The tolerance of a backward's results in dtype (atol, and rtol of the
 * largest reference element): f16 and bf16 carry their storage rounding
 * (2^-11, 2^-8) plus that of the rounded O fed to Delta; f32 sees f32
 * accumulation only. */
static inline void ref_storage_tolerance(aj_dtype dtype, double *atol, double *rtol)
{
    switch (dtype) {
    case AJ_DTYPE_F16: *atol = 1e-3; *rtol = 4e-3; break;
    case AJ_DTYPE_BF16: *atol = 4e-3; *rtol = 2.4e-2; break;
    default: *atol = 2e-5; *rtol = 1e-4; break;
    }
}

/* Forward: writes o and lse (shapes above); lse may be NULL. */
/* A padded problem of these sizes; every other field zero: no mask, the
 * default scale, offsets 0, the call's own totals. */
static inline ref_problem ref_problem_of(int B, int Hq, int Hkv, int Sq, int Sk, int D, int Dv)
{
    return (ref_problem){.B = B, .Hq = Hq, .Hkv = Hkv, .D = D, .Dv = Dv, .Sq = Sq, .Sk = Sk};
}

void ref_forward(const ref_problem *p, const double *q, const double *k,
                 const double *v, double *o, double *lse);

/* Backward of ref_forward, given its o and lse and the upstream gradient
 * dout (shape of o).  Overwrites dq, dk, dv (shapes of q, k, v).  dbias may
 * be NULL; when p->bias is set and dbias is not NULL, dbias has bias_shape
 * and is the gradient summed over the broadcast dims.  The math is written
 * above ref_backward in ref.c. */
void ref_backward(const ref_problem *p, const double *q, const double *k,
                  const double *v, const double *o, const double *lse,
                  const double *dout, double *dq, double *dk, double *dv,
                  double *dbias);

/* The gradient of the loss with respect to p->sinks (set): dsinks[h] =
 * -sum over the rows of head h of exp(sinks[h] - LSE) dO . O, from the
 * forward's o and lse (which include the sinks) and dout. */
void ref_sinks_grad(const ref_problem *p, const double *o, const double *lse,
                    const double *dout, double *dsinks);

/* The gradient of the loss (sum O * dout) with respect to side tensor
 * `tensor` of the score_mod expression (p->score_expr; with the bias and
 * dropout of the problem), row-major in its shape: every visible (b, h,
 * i, j)'s dS times
 * d score / d element, by the interpreter's dual numbers with the
 * element the variable (aj_expr_env.grad_tensor).  From the forward's o
 * and lse.  tensor = REF_ALIBI_SLOPES: the gradient of the built-in
 * alibi's slopes (p->alibi_slopes), [Hq]. */
enum { REF_ALIBI_SLOPES = -1 };
void ref_side_grad(const ref_problem *p, const double *q, const double *k, const double *v,
                   const double *o, const double *lse, const double *dout, int tensor,
                   double *grad);

/* Merge of two partial results over disjoint key sets, `rows` rows of width
 * dv: lse = logaddexp(lse1, lse2), o = o1*exp(lse1-lse) + o2*exp(lse2-lse).
 * Both -inf gives o = 0, lse = -inf (never NaN); a side whose lse is -inf
 * contributes nothing, whatever its o holds.  o may alias o1 or o2, and lse
 * may alias lse1 or lse2. */
void ref_merge(int64_t rows, int dv, const double *o1, const double *lse1,
               const double *o2, const double *lse2, double *o, double *lse);

/* The dropout keep decision for query head h of batch (or sequence) b with
 * Hq query heads, at global positions (q_pos, kv_pos).  Philox4x32-10 with
 *     key     = (lo32(seed), hi32(seed) ^ hi32(offset))
 *     counter = (lo32(kv_pos), lo32(q_pos), lo32(b * Hq + h), lo32(offset))
 * u = (out[0] >> 8) * 2^-24; keep iff u >= p (so p = 0 keeps everything). */
bool ref_dropout_keep(uint64_t seed, uint64_t offset, int64_t b, int64_t h,
                      int64_t Hq, int64_t q_pos, int64_t kv_pos, double p);

/* Philox4x32-10 (Salmon, Moraes, Dror, Shaw, SC'11): one 128-bit block. */
void ref_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2],
                       uint32_t out[4]);

#endif /* AJ_TESTS_REF_H */
