/*
 * launch.c -- aj_forward, aj_backward and aj_merge: check every argument against the
 * kernel's op, bind them to the kernel's parameter ABI by name, and run the
 * grid.
 *
 * Binding by name (the kernel's aj_launch_info lists "q", "stride_q_b",
 * "seq_k", ...) keeps this file ignorant of any one template: a template
 * may take any subset of the values below, in any order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "templates/attn_common.h"
#include "templates/params.h"
#include "templates/score.h"

#define MAX_SEQ ((int64_t)1 << 30)
#define MAX_GRID_YZ 65535

/* ---------------------------------------------------------------- checks */

static int64_t extent_bytes(const aj_tensor *t, int elem)
{
    int64_t last = 0;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] == 0)
            return 0;
        last += (t->shape[i] - 1) * t->strides[i];
    }
    return (last + 1) * elem;
}

static int elem_size(aj_dtype d)
{
    return aj_dtype_size(d);
}

#define FWD "aj_forward"

aj_status aj_check_rank_dtype(aj_ctx *ctx, const char *fn, const char *name,
                              const aj_tensor *t, int rank, aj_dtype dtype)
{
    if (t->rank != rank)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.rank = %d, want %d", fn, name,
                       t->rank, rank);
    if (t->dtype != dtype)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.dtype = %s, want %s", fn, name,
                       aj_dtype_name(t->dtype) ? aj_dtype_name(t->dtype) : "(invalid)",
                       aj_dtype_name(dtype));
    return AJ_OK;
}

/* data and every stride but the last (contiguous) on `bytes`-byte
 * boundaries; `why` ends the message ("" or " (reason)"). */
static aj_status check_aligned(aj_ctx *ctx, const char *fn, const char *name, const aj_tensor *t,
                               int rank, int size, int bytes, const char *why)
{
    const int per = bytes / size;
    if ((uintptr_t)t->data % (uintptr_t)bytes)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.data = %p is not %d-byte aligned%s", fn,
                       name, t->data, bytes, why);
    for (int i = 0; i < rank - 1; i++)
        if (t->strides[i] % per)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.strides[%d] = %lld is not a multiple "
                           "of %d elements (%d bytes)%s", fn, name, i, (long long)t->strides[i],
                           per, bytes, why);
    return AJ_OK;
}

/* Rank, dtype, non-negative shape and strides, unit last stride, data. */
static aj_status check_tensor(aj_ctx *ctx, const char *fn, const char *name,
                              const aj_tensor *t, int rank, aj_dtype dtype, int aligned)
{
    aj_status rd = aj_check_rank_dtype(ctx, fn, name, t, rank, dtype);
    if (rd != AJ_OK)
        return rd;
    for (int i = 0; i < rank; i++) {
        if (t->shape[i] < 0)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.shape[%d] = %lld is "
                           "negative", fn, name, i, (long long)t->shape[i]);
        if (t->strides[i] < 0)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.strides[%d] = %lld is "
                           "negative", fn, name, i, (long long)t->strides[i]);
    }
    if (t->shape[rank - 1] > 1 && t->strides[rank - 1] != 1)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.strides[%d] = %lld; the last "
                       "dimension must be contiguous (stride 1)", fn, name, rank - 1,
                       (long long)t->strides[rank - 1]);
    if (!t->data && extent_bytes(t, elem_size(dtype)) > 0)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.data is NULL", fn, name);
    return aligned ? check_aligned(ctx, fn, name, t, rank, elem_size(dtype), 16, "") : AJ_OK;
}

static aj_status check_dim(aj_ctx *ctx, const char *fn, const char *name, int i,
                           int64_t got, int64_t want, const char *what)
{
    if (got == want)
        return AJ_OK;
    return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.shape[%d] = %lld, want %lld (%s)",
                   fn, name, i, (long long)got, (long long)want, what);
}

/* The problem sizes a forward call implies, once its arguments check out. */
typedef struct fwd_sizes {
    int64_t batch, heads_q, heads_kv, seq_q, seq_k;
    int64_t splits;   /* layout = paged: split-KV parts (else 1) */
    int64_t tokens_q; /* layout = paged: a query head's rows (Sq; varlen queries: T) */
    int64_t head_offset, heads_total;   /* the call's heads in the op's (check_heads) */
} fwd_sizes;

/* The call's query heads as heads head_offset .. of the op's heads_q_total
 * (aj_fwd_args; 0: the call's own), and alibi's slopes, one per head of
 * the op: into sz->head_offset, sz->heads_total. */
static aj_status check_heads(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                             const aj_tensor *alibi_slopes, int64_t head_offset,
                             int64_t heads_q_total, fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    const int64_t total = heads_q_total ? heads_q_total : sz->heads_q;
    if (head_offset < 0 || total < sz->heads_q || head_offset > total - sz->heads_q ||
        total > INT32_MAX) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: head_offset = %lld, heads_q_total = %lld "
                     "with %lld query heads; the call's heads must be heads head_offset .. "
                     "head_offset + %lld - 1 of heads_q_total (0: the call's, then "
                     "head_offset = 0), below 2^31", fn, (long long)head_offset,
                     (long long)heads_q_total, (long long)sz->heads_q, (long long)sz->heads_q);
        goto done;
    }
    sz->head_offset = head_offset;
    sz->heads_total = total;
    if (op->score_mod == AJ_SCORE_MOD_ALIBI) {
        AJ_TRY(check_tensor(ctx, fn, "alibi_slopes", alibi_slopes, 1, AJ_DTYPE_F32, 0));
        AJ_TRY(check_dim(ctx, fn, "alibi_slopes", 0, alibi_slopes->shape[0], total,
                         heads_q_total ? "heads_q_total" : "q's heads"));
    }
done:
    return st;
}

/* What forward and backward calls share: q, k, v and the sizes they
 * imply, lengths and grid limits, alibi slopes and the totals.  `fn`
 * names the call in messages. */
static aj_status check_qkv(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                           const aj_tensor *q, const aj_tensor *k, const aj_tensor *v,
                           int64_t sq_total, int64_t sk_total, fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_tensor(ctx, fn, "q", q, 4, op->dtype, 1));
    AJ_TRY(check_tensor(ctx, fn, "k", k, 4, op->dtype, 1));
    AJ_TRY(check_tensor(ctx, fn, "v", v, 4, op->dtype, 1));
    sz->batch = q->shape[0];
    sz->heads_q = q->shape[1];
    sz->seq_q = q->shape[2];
    sz->heads_kv = k->shape[1];
    sz->seq_k = k->shape[2];
    AJ_TRY(check_dim(ctx, fn, "q", 3, q->shape[3], op->head_dim, "the op's head_dim"));
    AJ_TRY(check_dim(ctx, fn, "k", 0, k->shape[0], sz->batch, "q's batch"));
    AJ_TRY(check_dim(ctx, fn, "k", 3, k->shape[3], op->head_dim, "the op's head_dim"));
    AJ_TRY(check_dim(ctx, fn, "v", 0, v->shape[0], sz->batch, "q's batch"));
    AJ_TRY(check_dim(ctx, fn, "v", 1, v->shape[1], sz->heads_kv, "k's heads"));
    AJ_TRY(check_dim(ctx, fn, "v", 2, v->shape[2], sz->seq_k, "k's length"));
    AJ_TRY(check_dim(ctx, fn, "v", 3, v->shape[3], op->head_dim_v, "the op's head_dim_v"));
    if (sz->heads_kv == 0 ? sz->heads_q != 0 : sz->heads_q % sz->heads_kv != 0) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: q has %lld heads and k %lld; the "
                     "query heads must be a multiple of the key/value heads (GQA)", fn,
                     (long long)sz->heads_q, (long long)sz->heads_kv);
        goto done;
    }
    if (sz->seq_q >= MAX_SEQ || sz->seq_k >= MAX_SEQ) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: Sq = %lld, Sk = %lld; lengths must "
                     "be below 2^30", fn, (long long)sz->seq_q, (long long)sz->seq_k);
        goto done;
    }
    if (sz->batch > MAX_GRID_YZ || sz->heads_q > MAX_GRID_YZ) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: batch = %lld, heads = %lld; each "
                     "must be at most %d", fn, (long long)sz->batch, (long long)sz->heads_q,
                     MAX_GRID_YZ);
        goto done;
    }
    if (sq_total < 0 || sk_total < 0) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: sq_total = %lld, sk_total = %lld; "
                     "totals are lengths (0: this call's)", fn, (long long)sq_total,
                     (long long)sk_total);
        goto done;
    }
done:
    return st;
}

/* A [B, Hq, Sq, width] tensor of q's sizes (o, do, dq). */
static aj_status check_rows(aj_ctx *ctx, const char *fn, const char *name, const aj_tensor *t,
                            aj_dtype dtype, int64_t width, const char *width_what,
                            const fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_tensor(ctx, fn, name, t, 4, dtype, 1));
    AJ_TRY(check_dim(ctx, fn, name, 0, t->shape[0], sz->batch, "q's batch"));
    AJ_TRY(check_dim(ctx, fn, name, 1, t->shape[1], sz->heads_q, "q's heads"));
    AJ_TRY(check_dim(ctx, fn, name, 2, t->shape[2], sz->seq_q, "q's length"));
    AJ_TRY(check_dim(ctx, fn, name, 3, t->shape[3], width, width_what));
done:
    return st;
}

/* lse [B, Hq, Sq] f32 */
static aj_status check_lse(aj_ctx *ctx, const char *fn, const aj_tensor *lse,
                           const fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_tensor(ctx, fn, "lse", lse, 3, AJ_DTYPE_F32, 0));
    AJ_TRY(check_dim(ctx, fn, "lse", 0, lse->shape[0], sz->batch, "q's batch"));
    AJ_TRY(check_dim(ctx, fn, "lse", 1, lse->shape[1], sz->heads_q, "q's heads"));
    AJ_TRY(check_dim(ctx, fn, "lse", 2, lse->shape[2], sz->seq_q, "q's length"));
done:
    return st;
}

/* Packed outputs: `name` [Tq, Hq, Dv] of dtype and lse [Hq, Tq] f32. */
static aj_status check_packed_out(aj_ctx *ctx, const char *name, const aj_tensor *o,
                                  aj_dtype dtype, int64_t width, int64_t tq,
                                  const aj_tensor *lse, const fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_tensor(ctx, FWD, name, o, 3, dtype, 1));
    AJ_TRY(check_dim(ctx, FWD, name, 0, o->shape[0], tq, "q's total length"));
    AJ_TRY(check_dim(ctx, FWD, name, 1, o->shape[1], sz->heads_q, "q's heads"));
    AJ_TRY(check_dim(ctx, FWD, name, 2, o->shape[2], width, "the op's head_dim_v"));
    AJ_TRY(check_tensor(ctx, FWD, "lse", lse, 2, AJ_DTYPE_F32, 0));
    AJ_TRY(check_dim(ctx, FWD, "lse", 0, lse->shape[0], sz->heads_q, "q's heads"));
    AJ_TRY(check_dim(ctx, FWD, "lse", 1, lse->shape[1], tq, "q's total length"));
done:
    return st;
}

/* bias [B or 1, Hq or 1, Sq, Sk] of the op's dtype. */
static aj_status check_bias(aj_ctx *ctx, const char *fn, const aj_tensor *bias, aj_dtype dtype,
                            const fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_tensor(ctx, fn, "bias", bias, 4, dtype, 0));
    const int64_t full[2] = {sz->batch, sz->heads_q};
    const char *what[2] = {"1 or q's batch", "1 or q's heads"};
    for (int i = 0; i < 2; i++)
        if (bias->shape[i] != 1 && bias->shape[i] != full[i]) {
            st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: bias.shape[%d] = %lld, want %s", fn, i,
                         (long long)bias->shape[i], what[i]);
            goto done;
        }
    AJ_TRY(check_dim(ctx, fn, "bias", 2, bias->shape[2], sz->seq_q, "q's length"));
    AJ_TRY(check_dim(ctx, fn, "bias", 3, bias->shape[3], sz->seq_k, "k's length"));
done:
    return st;
}

/* The varlen fields of a padded launch must be left at zero. */
static aj_status check_not_varlen(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                                  const int32_t *cu_q, const int32_t *cu_k, int32_t batch,
                                  int32_t max_q, int32_t max_k)
{
    if (op->layout == AJ_LAYOUT_PADDED && (cu_q || cu_k || batch || max_q || max_k))
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: cu_seqlens_q, cu_seqlens_k, batch, "
                       "max_seqlen_q and max_seqlen_k are for layout = varlen kernels; this "
                       "kernel's layout is padded (leave them NULL / 0)", fn);
    return AJ_OK;
}

static aj_status check_forward(aj_ctx *ctx, const aj_op_info *op, const aj_fwd_args *a,
                               fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_not_varlen(ctx, FWD, op, a->cu_seqlens_q, a->cu_seqlens_k, a->batch,
                            a->max_seqlen_q, a->max_seqlen_k));
    AJ_TRY(check_qkv(ctx, FWD, op, &a->q, &a->k, &a->v, a->sq_total, a->sk_total, sz));
    AJ_TRY(check_heads(ctx, FWD, op, &a->alibi_slopes, a->head_offset, a->heads_q_total, sz));
    /* the output: o, or the f32 accumulator o_acc of accumulate kernels */
    const char *out = op->accumulate ? "o_acc" : "o";
    const aj_tensor *o = op->accumulate ? &a->o_acc : &a->o;
    AJ_TRY(check_rows(ctx, FWD, out, o, op->accumulate ? AJ_DTYPE_F32 : op->dtype,
                      op->head_dim_v, "the op's head_dim_v", sz));
    AJ_TRY(check_lse(ctx, FWD, &a->lse, sz));
    if (op->bias == AJ_BIAS_ADD)
        AJ_TRY(check_bias(ctx, FWD, &a->bias, op->dtype, sz));
done:
    return st;
}

/*
 * layout = varlen (aj_fwd_args): q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv],
 * o or o_acc [Tq, Hq, Dv], lse [Hq, Tq], and cu_seqlens_q / _k of batch + 1
 * entries.  The grid covers batch sequences of up to max_seqlen_q rows.
 */
static aj_status check_forward_varlen(aj_ctx *ctx, const aj_op_info *op, const aj_fwd_args *a,
                                      fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_CHECK_ARG(ctx, a->cu_seqlens_q && a->cu_seqlens_k, "%s: cu_seqlens_%s is NULL; "
                 "layout = varlen kernels need cu_seqlens_q and cu_seqlens_k", FWD,
                 a->cu_seqlens_q ? "k" : "q");
    AJ_CHECK_ARG(ctx, (uintptr_t)a->cu_seqlens_q % 4 == 0 && (uintptr_t)a->cu_seqlens_k % 4 == 0,
                 "%s: cu_seqlens_q = %p, cu_seqlens_k = %p; int32 arrays must be 4-byte "
                 "aligned", FWD, (const void *)a->cu_seqlens_q, (const void *)a->cu_seqlens_k);
    AJ_CHECK_ARG(ctx, a->batch >= 1 && a->batch <= MAX_GRID_YZ, "%s: batch = %d; layout = "
                 "varlen needs the number of sequences, 1 to %d", FWD, a->batch, MAX_GRID_YZ);
    AJ_CHECK_ARG(ctx, a->max_seqlen_q >= 0 && a->max_seqlen_k >= 0 &&
                 a->max_seqlen_q < MAX_SEQ && a->max_seqlen_k < MAX_SEQ,
                 "%s: max_seqlen_q = %d, max_seqlen_k = %d; each must be 0 to 2^30 - 1", FWD,
                 a->max_seqlen_q, a->max_seqlen_k);
    AJ_TRY(check_tensor(ctx, FWD, "q", &a->q, 3, op->dtype, 1));
    AJ_TRY(check_tensor(ctx, FWD, "k", &a->k, 3, op->dtype, 1));
    AJ_TRY(check_tensor(ctx, FWD, "v", &a->v, 3, op->dtype, 1));
    int64_t tq = a->q.shape[0], tk = a->k.shape[0];
    sz->batch = a->batch;
    sz->heads_q = a->q.shape[1];
    sz->heads_kv = a->k.shape[1];
    sz->seq_q = a->max_seqlen_q;
    sz->seq_k = a->max_seqlen_k;
    AJ_TRY(check_dim(ctx, FWD, "q", 2, a->q.shape[2], op->head_dim, "the op's head_dim"));
    AJ_TRY(check_dim(ctx, FWD, "k", 2, a->k.shape[2], op->head_dim, "the op's head_dim"));
    AJ_TRY(check_dim(ctx, FWD, "v", 0, a->v.shape[0], tk, "k's total length"));
    AJ_TRY(check_dim(ctx, FWD, "v", 1, a->v.shape[1], sz->heads_kv, "k's heads"));
    AJ_TRY(check_dim(ctx, FWD, "v", 2, a->v.shape[2], op->head_dim_v, "the op's head_dim_v"));
    if (sz->heads_kv == 0 ? sz->heads_q != 0 : sz->heads_q % sz->heads_kv != 0) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: q has %lld heads and k %lld; the "
                     "query heads must be a multiple of the key/value heads (GQA)", FWD,
                     (long long)sz->heads_q, (long long)sz->heads_kv);
        goto done;
    }
    if (tq > INT32_MAX || tk > INT32_MAX || sz->heads_q > MAX_GRID_YZ) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: Tq = %lld, Tk = %lld, heads = %lld; the "
                     "totals must fit cu_seqlens' int32 and the heads %d", FWD, (long long)tq,
                     (long long)tk, (long long)sz->heads_q, MAX_GRID_YZ);
        goto done;
    }
    AJ_TRY(check_heads(ctx, FWD, op, &a->alibi_slopes, a->head_offset, a->heads_q_total, sz));
    if (a->sq_total < 0 || a->sk_total < 0) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: sq_total = %lld, sk_total = %lld; "
                     "totals are lengths (0: each sequence's own)", FWD,
                     (long long)a->sq_total, (long long)a->sk_total);
        goto done;
    }
    const char *out = op->accumulate ? "o_acc" : "o";
    const aj_tensor *o = op->accumulate ? &a->o_acc : &a->o;
    AJ_TRY(check_packed_out(ctx, out, o, op->accumulate ? AJ_DTYPE_F32 : op->dtype,
                            op->head_dim_v, tq, &a->lse, sz));
done:
    return st;
}

/*
 * layout = paged (aj_fwd_args): q [B, Hq, Sq, D], o [B, Hq, Sq, Dv], lse
 * [B, Hq, Sq], the caches [num_pages, page_size, Hkv, D or Dv] of the
 * op's kv_dtype, block_table [B, max_pages] and seqlens_k [B] (their
 * values are the kernel's to check), the f8 caches' scales.  seq_k is the
 * longest a sequence may be: max_pages page_size.
 */
static aj_status check_forward_paged(aj_ctx *ctx, const aj_op_info *op, const aj_fwd_args *a,
                                     fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    const int varlen_q = op->q_layout == AJ_LAYOUT_VARLEN;
    AJ_CHECK_ARG(ctx, !a->k.data && !a->v.data && (varlen_q || !a->cu_seqlens_q) &&
                 !a->cu_seqlens_k && !a->q_offset && !a->kv_offset && !a->sq_total &&
                 !a->sk_total, "%s: k, v, cu_seqlens, offsets and totals are not for layout = "
                 "paged kernels (the keys are k_cache and v_cache; positions follow "
                 "seqlens_k)", FWD);
    AJ_TRY(check_tensor(ctx, FWD, "q", &a->q, varlen_q ? 3 : 4, op->dtype, 1));
    AJ_TRY(check_tensor(ctx, FWD, "k_cache", &a->k_cache, 4, op->kv_dtype, 0));
    AJ_TRY(check_tensor(ctx, FWD, "v_cache", &a->v_cache, 4, op->kv_dtype, 0));
    const aj_tensor *kc = &a->k_cache;
    sz->batch = a->q.shape[0];
    sz->heads_q = a->q.shape[1];
    sz->seq_q = a->q.shape[2];
    sz->heads_kv = kc->shape[2];
    if (varlen_q) {
        /* q [T, Hq, D]: batch sequences whose chunks cu_seqlens_q gives;
         * seq_q is the longest a chunk may be (the kernel checks them) */
        AJ_CHECK_ARG(ctx, a->cu_seqlens_q && (uintptr_t)a->cu_seqlens_q % 4 == 0,
                     "%s: cu_seqlens_q = %p; q_layout = varlen needs it (int32, 4-byte "
                     "aligned)", FWD, (const void *)a->cu_seqlens_q);
        AJ_CHECK_ARG(ctx, a->batch >= 1 && a->batch <= MAX_GRID_YZ && a->q.shape[0] < MAX_SEQ &&
                     a->max_seqlen_q >= 0 && a->max_seqlen_q < MAX_SEQ,
                     "%s: batch = %d, T = %lld, max_seqlen_q = %d; q_layout = varlen needs 1 "
                     "to %d sequences, T and max_seqlen_q (0: T) below 2^30", FWD, a->batch,
                     (long long)a->q.shape[0], a->max_seqlen_q, MAX_GRID_YZ);
        sz->batch = a->batch;
        sz->heads_q = a->q.shape[1];
        sz->seq_q = a->max_seqlen_q ? a->max_seqlen_q : a->q.shape[0];
        sz->tokens_q = a->q.shape[0];
        AJ_TRY(check_dim(ctx, FWD, "q", 2, a->q.shape[2], op->head_dim, "the op's head_dim"));
    } else {
        AJ_CHECK_ARG(ctx, !a->max_seqlen_q && !a->batch, "%s: batch and max_seqlen_q are for "
                     "q_layout = varlen; this kernel's queries are padded (leave them 0)",
                     FWD);
        sz->tokens_q = sz->seq_q;
        AJ_TRY(check_dim(ctx, FWD, "q", 3, a->q.shape[3], op->head_dim, "the op's head_dim"));
    }
    AJ_TRY(check_dim(ctx, FWD, "k_cache", 3, kc->shape[3], op->head_dim, "the op's head_dim"));
    for (int i = 0; i < 3; i++)
        AJ_TRY(check_dim(ctx, FWD, "v_cache", i, a->v_cache.shape[i], kc->shape[i],
                         "k_cache's"));
    AJ_TRY(check_dim(ctx, FWD, "v_cache", 3, a->v_cache.shape[3], op->head_dim_v,
                     "the op's head_dim_v"));
    AJ_CHECK_ARG(ctx, kc->shape[1] >= 1 && kc->shape[1] <= 256 && kc->shape[0] <= INT32_MAX,
                 "%s: k_cache.shape = (%lld, %lld, ...); page_size must be 1 .. 256 and "
                 "num_pages fit int32", FWD, (long long)kc->shape[0], (long long)kc->shape[1]);
    AJ_CHECK_ARG(ctx, sz->heads_kv >= 1 && sz->heads_q % sz->heads_kv == 0,
                 "%s: q has %lld heads and k_cache %lld; the query heads must be a multiple "
                 "of the key/value heads (GQA)", FWD, (long long)sz->heads_q,
                 (long long)sz->heads_kv);
    AJ_CHECK_ARG(ctx, sz->batch <= MAX_GRID_YZ && sz->heads_q <= MAX_GRID_YZ &&
                 sz->seq_q < MAX_SEQ, "%s: batch = %lld, heads = %lld, Sq = %lld exceed "
                 "the grid (%d, %d, 2^30 - 1)", FWD, (long long)sz->batch,
                 (long long)sz->heads_q, (long long)sz->seq_q, MAX_GRID_YZ, MAX_GRID_YZ);
    AJ_CHECK_ARG(ctx, (a->block_table || sz->batch == 0) && (a->seqlens_k || sz->batch == 0) &&
                 a->max_pages >= 1 && (int64_t)a->max_pages * kc->shape[1] < MAX_SEQ,
                 "%s: block_table = %p, seqlens_k = %p, max_pages = %d; layout = paged needs "
                 "both tables and 1 .. 2^30 / page_size pages per sequence", FWD,
                 (const void *)a->block_table, (const void *)a->seqlens_k, a->max_pages);
    AJ_CHECK_ARG(ctx, (uintptr_t)a->block_table % 4 == 0 && (uintptr_t)a->seqlens_k % 4 == 0,
                 "%s: block_table = %p, seqlens_k = %p; int32 arrays must be 4-byte aligned",
                 FWD, (const void *)a->block_table, (const void *)a->seqlens_k);
    sz->seq_k = (int64_t)a->max_pages * kc->shape[1];
    if (op->kv_dtype >= AJ_DTYPE_F8E4M3) {
        AJ_TRY(check_tensor(ctx, FWD, "k_scale", &a->k_scale, 1, AJ_DTYPE_F32, 0));
        AJ_TRY(check_dim(ctx, FWD, "k_scale", 0, a->k_scale.shape[0], 1, "one scale per "
                         "tensor"));
        AJ_TRY(check_tensor(ctx, FWD, "v_scale", &a->v_scale, 1, AJ_DTYPE_F32, 0));
        AJ_TRY(check_dim(ctx, FWD, "v_scale", 0, a->v_scale.shape[0], 1, "one scale per "
                         "tensor"));
    }
    AJ_TRY(check_heads(ctx, FWD, op, &a->alibi_slopes, a->head_offset, a->heads_q_total, sz));
    if (varlen_q) {
        AJ_TRY(check_packed_out(ctx, "o", &a->o, op->dtype, op->head_dim_v, sz->tokens_q,
                                &a->lse, sz));
    } else {
        AJ_TRY(check_rows(ctx, FWD, "o", &a->o, op->dtype, op->head_dim_v,
                          "the op's head_dim_v", sz));
        AJ_TRY(check_lse(ctx, FWD, &a->lse, sz));
    }
done:
    return st;
}

/* The items of one part of a paged launch that have work: B Hkv where
 * the kernel packs each KV head's query heads into one item or CTA
 * (attn_common.h, "GQA packing": padded queries here, and the group's Sq
 * rows within the rows its first stage packs), else B Hq. */
static int64_t paged_working_items(const aj_kernel *kernel, const fwd_sizes *sz)
{
    if (kernel->op.q_layout != AJ_LAYOUT_VARLEN &&
        aj_attn_paged_group_packs(sz->heads_q / sz->heads_kv, sz->seq_q,
                                  kernel->stages[0].pack_rows))
        return sz->batch * sz->heads_kv;
    return sz->batch * sz->heads_q;
}

/* Split-KV parts of a paged launch: the op's schedule, else enough that
 * the working items of the (parts, Hq, B) grid give every core (the
 * device's workers, else its multiprocessors: aj_device_caps) two, each
 * part at least 256 keys (a part has a fixed cost: its partial's write
 * and merge), at most 16. */
static int64_t paged_splits(aj_ctx *ctx, const aj_kernel *kernel, const aj_device *dev,
                            const fwd_sizes *sz)
{
    const aj_op_info *op = &kernel->op;
    if (op->splits)
        return op->splits;
    aj_device_caps caps = AJ_DEVICE_CAPS_INIT;
    long cores = dev->workers;
    if (cores <= 0 && aj_device_get_caps(dev, &caps) == AJ_OK)
        cores = caps.multiprocessors;
    int64_t items = paged_working_items(kernel, sz), want = 2 * (cores > 0 ? cores : 1);
    int64_t by_length = sz->seq_k / 256;
    int64_t splits = items >= want ? 1 : (want + items - 1) / items;
    if (splits > by_length)
        splits = by_length;
    /* varlen queries (chunked prefill): the partials of all T rows must
     * stay within 64 Mi floats */
    if (op->q_layout == AJ_LAYOUT_VARLEN) {
        int64_t per_part = sz->heads_q * sz->tokens_q * (op->head_dim_v + 1);
        int64_t most = ((int64_t)1 << 26) / (per_part ? per_part : 1);
        splits = splits > most ? most : splits;
    }
    return splits < 1 ? 1 : splits > 16 ? 16 : splits;
}

/* A packed [T, H, D] tensor as the [1, H, T, D] view the padded binding
 * reads (batch stride 0); lse [Hq, Tq] as [1, Hq, Tq]; a tensor the op
 * does not use (o or o_acc, left empty) as it is. */
static aj_tensor padded_view(const aj_tensor *t)
{
    aj_tensor v = *t;
    if (t->rank != 2 && t->rank != 3)
        return v;
    v.rank = t->rank + 1;
    if (t->rank == 3) {
        v.shape[0] = 1, v.shape[1] = t->shape[1], v.shape[2] = t->shape[0];
        v.shape[3] = t->shape[2];
        v.strides[0] = 0, v.strides[1] = t->strides[1], v.strides[2] = t->strides[0];
        v.strides[3] = 1;
    } else {
        v.shape[0] = 1, v.shape[1] = t->shape[0], v.shape[2] = t->shape[1];
        v.strides[0] = 0, v.strides[1] = t->strides[0], v.strides[2] = 1;
    }
    return v;
}

/* ---------------------------------------------------------------- binding */

/*
 * The values of a launch: params.def's sources, which each entry point
 * fills from its checked arguments.  A kernel parameter's value follows
 * from its catalogue row (templates/params.h); the score programs' side
 * tensors (and alibi's slopes) bind by their names.
 */
typedef struct launch_values {
    aj_tensor tensor[AJ_PSRC_COUNT];
    int64_t scalar[AJ_PSRC_COUNT];
    uint64_t given;   /* a bit per source filled */
} launch_values;

_Static_assert(AJ_PSRC_COUNT <= 64, "launch_values.given holds a bit per source");

static void put_tensor(launch_values *v, aj_param_source s, const aj_tensor *t)
{
    v->tensor[s] = *t;
    v->given |= 1ull << s;
}

static void put_scalar(launch_values *v, aj_param_source s, int64_t x)
{
    v->scalar[s] = x;
    v->given |= 1ull << s;
}

typedef struct binding {
    const char *name;
    aj_param_type type;
    aj_arg_value value;
} binding;

/* The parameters of score.h's programs that are not in the catalogue
 * (alibi's slopes and each side tensor: pointer, sizes and strides) and
 * their sim buffers. */
#define SCORE_BINDINGS ((AJ_OP_TENSORS_MAX + 1) * (1 + 2 * 4))
typedef struct score_bindings {
    binding b[SCORE_BINDINGS];
    char names[SCORE_BINDINGS][AJ_OP_TENSOR_NAME_MAX + 16];
    int n;
    aj_sim_buffer buffers[AJ_OP_TENSORS_MAX + 1];
    int nb;
} score_bindings;

static void score_bind(score_bindings *sb, const char *name, aj_param_type type,
                       aj_arg_value value)
{
    snprintf(sb->names[sb->n], sizeof sb->names[0], "%s", name);
    sb->b[sb->n] = (binding){sb->names[sb->n], type, value};
    sb->n++;
}

/* A score tensor's pointer, sizes and strides, and its sim buffer. */
static void score_bind_tensor(score_bindings *sb, const char *tensor, const void *data,
                              int rank, const int64_t *shape, const int64_t *strides)
{
    char name[AJ_OP_TENSOR_NAME_MAX + 16];
    const char *stored = sb->names[sb->n];   /* the name a sim fault reports */
    score_bind(sb, tensor, AJ_PARAM_PTR, (aj_arg_value){.ptr = (void *)data});
    aj_tensor t = {(void *)data, AJ_DTYPE_F32, rank, {0}, {0}};
    for (int d = 0; d < rank; d++) {
        aj_score_param_name(name, sizeof name, tensor, 's', d);
        score_bind(sb, name, AJ_PARAM_I64, (aj_arg_value){.i64 = shape[d]});
        aj_score_param_name(name, sizeof name, tensor, 't', d);
        score_bind(sb, name, AJ_PARAM_I64, (aj_arg_value){.i64 = strides[d]});
        t.shape[d] = shape[d];
        t.strides[d] = strides[d];
    }
    sb->buffers[sb->nb++] = (aj_sim_buffer){stored, data, (size_t)extent_bytes(&t, 4)};
}

aj_status aj_side_check_names(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                              const aj_side_tensor *side, int32_t num_side)
{
    AJ_CHECK_ARG(ctx, num_side >= 0 && (num_side == 0 || side),
                 "%s: num_side = %d with side %s; want a count of 0 or more, and the "
                 "tensors when it is not 0", fn, num_side, side ? "given" : "NULL");
    for (int i = 0; i < num_side; i++) {
        int known = 0;
        for (int d = 0; d < op->num_tensors; d++)
            known |= side[i].name && strcmp(side[i].name, op->tensors[d].name) == 0;
        AJ_CHECK_ARG(ctx, known, "%s: side[%d] ('%s') is not a tensor the op declares", fn, i,
                     side[i].name ? side[i].name : "(null)");
    }
    return AJ_OK;
}

/* Checks the side tensors of a launch against the op's declarations and
 * binds them and alibi's slopes, as `fn` in messages. */
static aj_status bind_scores(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                             const aj_side_tensor *side, int32_t num_side,
                             const aj_tensor *slopes, score_bindings *sb)
{
    memset(sb, 0, sizeof *sb);
    if (op->score_mod == AJ_SCORE_MOD_ALIBI)
        score_bind_tensor(sb, "alibi_slopes", slopes->data, 1, slopes->shape, slopes->strides);
    aj_status st = aj_side_check_names(ctx, fn, op, side, num_side);
    if (st != AJ_OK)
        return st;
    for (int d = 0; d < op->num_tensors; d++) {
        const aj_side_decl *decl = &op->tensors[d];
        const aj_side_tensor *t = NULL;
        for (int i = 0; i < num_side && !t; i++)
            if (strcmp(side[i].name, decl->name) == 0)
                t = &side[i];
        static const char *const dts[2] = {"i32", "f32"};
        AJ_CHECK_ARG(ctx, t, "%s: side tensor '%s' (%s[%d]) is not given", fn, decl->name,
                     dts[decl->dtype], decl->rank);
        AJ_CHECK_ARG(ctx, t->dtype == decl->dtype && t->rank == decl->rank,
                     "%s: side tensor '%s' is %s[%d]; the op declares %s[%d]", fn, decl->name,
                     (unsigned)t->dtype < 2 ? dts[t->dtype] : "?", t->rank, dts[decl->dtype],
                     decl->rank);
        AJ_CHECK_ARG(ctx, t->data, "%s: side tensor '%s' has no data", fn, decl->name);
        for (int k = 0; k < t->rank; k++) {
            AJ_CHECK_ARG(ctx, t->shape[k] >= 1, "%s: side tensor '%s' has shape[%d] = %lld; "
                         "every dim must be at least 1", fn, decl->name, k,
                         (long long)t->shape[k]);
            AJ_CHECK_ARG(ctx, t->strides[k] >= 0, "%s: side tensor '%s' has stride[%d] = %lld; "
                         "strides must not be negative", fn, decl->name, k,
                         (long long)t->strides[k]);
        }
        score_bind_tensor(sb, decl->name, t->data, t->rank, t->shape, t->strides);
    }
    return AJ_OK;
}

/* Whether some stage of the kernel takes parameter `name`. */
static int kernel_takes(const aj_kernel *kernel, aj_param_id id)
{
    for (int s = 0; s < kernel->num_stages; s++)
        for (int i = 0; i < kernel->stages[s].launch.num_params; i++)
            if (kernel->stages[s].param_ids[i] == (int32_t)id)
                return 1;
    return 0;
}

/*
 * The block mask of a padded launch whose kernel reads one (score.h,
 * aj_score_prog.block_mask): `given` after checking it against the launch,
 * else one built here: the builder the kernel was compiled with (its
 * launch plan, compile.c) queued on the launch's stream ahead of it, into
 * scratch (*scratch, which the caller releases once the launch is queued);
 * else, for a kernel loaded from bytes that has no op to build it from,
 * none (the kernels then class their tiles by interval arithmetic).
 */
static aj_status bind_block_mask(aj_ctx *ctx, const char *fn, aj_device *dev,
                                 const aj_kernel *kernel, const aj_block_mask_shape *launch,
                                 const aj_block_mask *given, const aj_side_tensor *side,
                                 int32_t num_side, const aj_tensor *slopes, void *stream,
                                 launch_values *v, void **scratch)
{
    *scratch = NULL;
    if (!kernel_takes(kernel, AJ_PID(block_mask)))
        return AJ_OK;
    const aj_score_prog *prog = aj_kernel_programs(kernel);
    aj_kernel *builder = atomic_load(&((aj_kernel *)kernel)->mask_builder);
    aj_status st = AJ_OK;
    aj_tensor classes;
    int64_t bm, bn;
    if (given) {
        st = aj_block_mask_view(ctx, fn, given, dev, prog, launch, &classes, &bm, &bn);
    } else if (prog && builder) {
        aj_launch_info li;
        aj_kernel_stage_info(kernel, 0, &li);
        aj_block_mask_shape shape = *launch;
        shape.block_m = li.schedule.block_m;
        shape.block_n = li.schedule.block_n;
        bm = shape.block_m;
        bn = shape.block_n;
        classes = aj_block_mask_tensor(prog, &shape, NULL);
        st = aj_device_scratch(dev, stream, (size_t)(classes.shape[0] * classes.strides[0] * 4),
                               scratch);
        classes.data = *scratch;
        if (st == AJ_OK)
            st = aj_block_mask_launch(ctx, dev, fn, builder, &shape, &classes, side, num_side,
                                      slopes, stream);
    } else {
        return st;
    }
    if (st != AJ_OK)
        return st;
    put_tensor(v, AJ_PSRC_block_mask, &classes);
    put_scalar(v, AJ_PSRC_block_mask_bm, bm);
    put_scalar(v, AJ_PSRC_block_mask_bn, bn);
    return AJ_OK;
}

/* The value of catalogue parameter `p`; 0 when its source is not given. */
static int param_value(const aj_param_row *p, const launch_values *v, aj_arg_value *out)
{
    if (!(v->given & (1ull << p->source)))
        return 0;
    const aj_tensor *t = &v->tensor[p->source];
    int64_t x = 0;
    switch (p->how) {
    case AJ_PHOW_DATA: out->ptr = t->data; return 1;
    case AJ_PHOW_STRIDE: x = t->strides[p->dim]; break;
    case AJ_PHOW_BSTRIDE: x = t->shape[p->dim] == 1 ? 0 : t->strides[p->dim]; break;
    case AJ_PHOW_SHAPE: x = t->shape[p->dim]; break;
    case AJ_PHOW_SCALAR: x = v->scalar[p->source]; break;
    }
    if (p->type == AJ_PARAM_I32)
        out->i32 = (int32_t)x;
    else
        out->i64 = x;
    return 1;
}

/* A kernel's bound arguments, and the memory its pointers may touch (sim). */
typedef struct bound_args {
    aj_arg_value values[AJ_KB_MAX_PARAMS];
    void *argv[AJ_KB_MAX_PARAMS];
    aj_sim_buffer buffers[AJ_KB_MAX_PARAMS + AJ_OP_TENSORS_MAX + 1];
    int nb;
} bound_args;

/* A launch's scratch: its side tensors' bindings and a stage's bound
 * arguments, about 14 KiB, so on the heap rather than on a caller's stack
 * whose size the library does not know; one per launch, owned by the
 * function that launches and freed before it returns. */
typedef struct launch_scratch {
    score_bindings scores;
    bound_args bound;
} launch_scratch;

/* A new scratch, or NULL with *st = AJ_ERR_OUT_OF_MEMORY (when *st was
 * AJ_OK; a failed *st stays, and no scratch is made). */
static launch_scratch *scratch_new(aj_ctx *ctx, const char *fn, aj_status *st)
{
    if (*st != AJ_OK)
        return NULL;
    launch_scratch *ls = malloc(sizeof *ls);
    if (!ls)
        *st = aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return ls;
}

/* Binds stage `stage`'s parameters: a table row's (the kernel recorded
 * it) from `v`, a side tensor's by its name from the score programs'
 * bindings (may be NULL). */
static aj_status bind(aj_ctx *ctx, const aj_kernel *kernel, int stage, const launch_values *v,
                      const score_bindings *scores, bound_args *out)
{
    aj_launch_info li;
    aj_kernel_stage_info(kernel, stage, &li);
    out->nb = 0;
    for (int i = 0; i < li.num_params; i++) {
        const char *name = li.params[i].name;
        const aj_param_row *p = aj_param_row_of(kernel->stages[stage].param_ids[i]);
        int found = 0;
        if (p) {
            found = p->type == li.params[i].type && param_value(p, v, &out->values[i]);
            if (found && p->how == AJ_PHOW_DATA) {
                const aj_tensor *t = &v->tensor[p->source];
                out->buffers[out->nb++] = (aj_sim_buffer){
                    name, t->data, (size_t)extent_bytes(t, elem_size(t->dtype))};
            }
        }
        for (int j = 0; !p && scores && j < scores->n && !found; j++)
            if (strcmp(scores->b[j].name, name) == 0 && scores->b[j].type == li.params[i].type) {
                out->values[i] = scores->b[j].value;
                found = 1;
            }
        if (!found)
            return aj_fail(ctx, AJ_ERR_INTERNAL, "kernel %s: no launch value for parameter "
                           "'%s'", aj_kernel_stage_entry(kernel, stage), name);
        out->argv[i] = &out->values[i];
    }
    for (int j = 0; scores && j < scores->nb; j++)
        out->buffers[out->nb++] = scores->buffers[j];
    return AJ_OK;
}

/* What every attention launch fills: q, k, v, lse, the sizes, offsets,
 * totals, the dropout stream, and varlen's offsets and the device's status
 * word (templates/attn_common.h: a u32 the kernels record a cu_seqlens
 * fault in, bound as one 4-byte element). */
static void attention_values(const aj_tensor *q, const aj_tensor *k, const aj_tensor *v_,
                             const aj_tensor *lse, const fwd_sizes *sz, int64_t q_offset,
                             int64_t kv_offset, int64_t sq_given, int64_t sk_given,
                             int64_t sq_total, int64_t sk_total, uint64_t seed, uint64_t offset,
                             const int32_t *cu_q, const int32_t *cu_k, int32_t batch,
                             void *status, launch_values *v)
{
    v->given = 0;
    put_tensor(v, AJ_PSRC_q, q);
    put_tensor(v, AJ_PSRC_k, k);
    put_tensor(v, AJ_PSRC_v, v_);
    put_tensor(v, AJ_PSRC_lse, lse);
    /* int32 offsets, as 4-byte elements */
    const aj_tensor cu[2] = {{(void *)cu_q, AJ_DTYPE_F32, 1, {batch + 1}, {1}},
                             {(void *)cu_k, AJ_DTYPE_F32, 1, {batch + 1}, {1}}};
    put_tensor(v, AJ_PSRC_cu_seqlens_q, &cu[0]);
    put_tensor(v, AJ_PSRC_cu_seqlens_k, &cu[1]);
    const aj_tensor status_word = {status, AJ_DTYPE_F32, 1, {1}, {1}};
    put_tensor(v, AJ_PSRC_varlen_status, &status_word);
    put_scalar(v, AJ_PSRC_heads_q, sz->heads_q);
    put_scalar(v, AJ_PSRC_heads_kv, sz->heads_kv);
    put_scalar(v, AJ_PSRC_seq_q, sz->seq_q);
    put_scalar(v, AJ_PSRC_seq_k, sz->seq_k);
    put_scalar(v, AJ_PSRC_batch, sz->batch);
    put_scalar(v, AJ_PSRC_q_offset, q_offset);
    put_scalar(v, AJ_PSRC_kv_offset, kv_offset);
    put_scalar(v, AJ_PSRC_sq_total, sq_given);
    put_scalar(v, AJ_PSRC_sk_total, sk_given);
    put_scalar(v, AJ_PSRC_seq_q_total, sq_total);
    put_scalar(v, AJ_PSRC_seq_k_total, sk_total);
    put_scalar(v, AJ_PSRC_dropout_seed, (int64_t)seed);
    put_scalar(v, AJ_PSRC_dropout_offset, (int64_t)offset);
    put_scalar(v, AJ_PSRC_head_offset, sz->head_offset);
    put_scalar(v, AJ_PSRC_heads_q_total, sz->heads_total);
    /* no block mask until bind_block_mask gives one */
    const aj_tensor no_mask = {NULL, AJ_DTYPE_F32, 4, {1, 1, 1, 1}, {0, 0, 0, 0}};
    put_tensor(v, AJ_PSRC_block_mask, &no_mask);
    put_scalar(v, AJ_PSRC_block_mask_bm, 1);
    put_scalar(v, AJ_PSRC_block_mask_bn, 1);
}

/* A forward's values (a: the padded views of its arguments). */
static void forward_values(const aj_fwd_args *a, const fwd_sizes *sz, int64_t sq_total,
                           int64_t sk_total, void *status, launch_values *v)
{
    attention_values(&a->q, &a->k, &a->v, &a->lse, sz, a->q_offset, a->kv_offset, a->sq_total,
                     a->sk_total, sq_total, sk_total, a->seed, a->offset, a->cu_seqlens_q,
                     a->cu_seqlens_k, a->batch, status, v);
    put_tensor(v, AJ_PSRC_o, &a->o);
    put_tensor(v, AJ_PSRC_o_acc, &a->o_acc);
    put_tensor(v, AJ_PSRC_bias, &a->bias);
}

typedef struct bwd_workspace bwd_workspace;

/* A backward's values (a: the padded views of its arguments), with the
 * workspace `ws` of layout w. */
static void backward_values(const aj_bwd_args *a, const fwd_sizes *sz, int64_t sq_total,
                            int64_t sk_total, const bwd_workspace *w, void *ws,
                            void *status, launch_values *v);

static void merge_values(const aj_merge_args *a, const fwd_sizes *sz, launch_values *v)
{
    v->given = 0;
    const aj_tensor *t[6] = {&a->o1, &a->o2, &a->o, &a->lse1, &a->lse2, &a->lse};
    const aj_param_source src[6] = {AJ_PSRC_o1, AJ_PSRC_o2, AJ_PSRC_o, AJ_PSRC_lse1,
                                    AJ_PSRC_lse2, AJ_PSRC_lse};
    for (int i = 0; i < 6; i++)
        put_tensor(v, src[i], t[i]);
    put_scalar(v, AJ_PSRC_seq_q, sz->seq_q);
}

static int64_t grid_extent(aj_extent e, const fwd_sizes *sz)
{
    switch (e) {
    case AJ_EXTENT_BATCH: return sz->batch;
    case AJ_EXTENT_HEADS_Q: return sz->heads_q;
    case AJ_EXTENT_HEADS_KV: return sz->heads_kv;
    case AJ_EXTENT_SEQ_Q: return sz->seq_q;
    case AJ_EXTENT_SEQ_K: return sz->seq_k;
    case AJ_EXTENT_SPLITS: return sz->splits;
    default: return 1;
    }
}

/* Runs stage `stage` of the bound kernel over the grid its launch info
 * asks for, on `stream` (sim: with `buffers` as the memory its accesses
 * may touch). */
static aj_status run_kernel(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel, int stage,
                            const fwd_sizes *sz, void **argv, const aj_sim_buffer *buffers,
                            int num_buffers, void *stream)
{
    aj_launch_info li;
    aj_kernel_stage_info(kernel, stage, &li);
    aj_device_launch l = {
        .kernel = kernel,
        .stage = stage,
        .argv = argv,
        .buffers = buffers,
        .num_buffers = num_buffers,
        .stream = stream,
    };
    for (int d = 0; d < 3; d++) {
        int64_t e = grid_extent(li.grid[d].extent, sz);
        l.grid[d] = (int32_t)((e + li.grid[d].per_block - 1) / li.grid[d].per_block);
    }
    return aj_device_launch_stage(ctx, dev, &l);
}

/* The checks every launch entry point starts with, reported as `fn`; the
 * entry point then reads its args struct (AJ_READ_STRUCT). */
static aj_status check_launch(aj_ctx *ctx, const char *fn, aj_device *dev,
                              const aj_kernel *kernel, const void *args, aj_kind kind)
{
    AJ_CHECK_ARG(ctx, dev, "%s: dev is NULL", fn);
    AJ_CHECK_ARG(ctx, kernel, "%s: kernel is NULL", fn);
    AJ_CHECK_ARG(ctx, args, "%s: args is NULL", fn);
    AJ_CHECK_ARG(ctx, kernel->op.kind == kind, "%s: kernel %s computes a %s op", fn,
                 aj_kernel_entry(kernel), aj_kind_name(kernel->op.kind));
    AJ_CHECK_ARG(ctx, kernel->target == aj_device_target(dev),
                 "%s: kernel compiled for %s cannot run on a %s device", fn,
                 aj_target_name(kernel->target), aj_target_name(aj_device_target(dev)));
    return AJ_OK;
}

/* The sim/GPU paged kernel reads cache rows in chunks of 16 bytes (8 for
 * an f8 row that is not whole 16-byte chunks; docs/gpu.md), so there a
 * cache's data and strides must fall on them; the cpu kernel reads any
 * alignment. */
static aj_status check_cache_chunks(aj_ctx *ctx, const char *name, const aj_tensor *t,
                                    aj_dtype dtype, int width)
{
    const int size = elem_size(dtype), chunk = size == 1 && width % 16 ? 8 : 16;
    return check_aligned(ctx, FWD, name, t, 4, size, chunk, chunk == 8 ?
                         " (the sim/GPU paged kernel reads cache rows in 8-byte chunks)" :
                         " (the sim/GPU paged kernel reads cache rows in 16-byte chunks)");
}

/*
 * A paged forward: stage 0 over (splits, Hq, B); with splits > 1 the
 * parts' (O, LSE) go to a workspace of the device's scratch, laid out
 *
 *   O   [B][Hq][splits][Sq][Dv]   f32, each part's normalised output
 *   LSE [B][Hq][splits][Sq]       f32, after it
 *
 * (varlen queries: B = 1 and Sq = T, each sequence at its packed rows)
 *
 * and stage 1 merges them into o and lse (the merge contract).
 */
static aj_status forward_paged(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                               const aj_fwd_args *a)
{
    const aj_op_info *op = &kernel->op;
    fwd_sizes sz = {.splits = 1};
    aj_status st = check_forward_paged(ctx, op, a, &sz);
    const int tiles_by_chunks = aj_target_desc_of(kernel->target)->simt;  /* cp.async */
    if (st == AJ_OK && tiles_by_chunks)
        st = check_cache_chunks(ctx, "k_cache", &a->k_cache, op->kv_dtype, op->head_dim);
    if (st == AJ_OK && tiles_by_chunks)
        st = check_cache_chunks(ctx, "v_cache", &a->v_cache, op->kv_dtype, op->head_dim_v);
    if (st != AJ_OK || sz.batch == 0 || sz.heads_q == 0 || sz.tokens_q == 0)
        return st;
    const int varlen_q = op->q_layout == AJ_LAYOUT_VARLEN;
    sz.splits = paged_splits(ctx, kernel, dev, &sz);
    size_t rows = (size_t)((varlen_q ? 1 : sz.batch) * sz.heads_q * sz.splits * sz.tokens_q);
    size_t ws_bytes = sz.splits > 1 ? rows * (size_t)(op->head_dim_v + 1) * 4 : 0;
    void *ws = NULL;
    if (ws_bytes)
        st = aj_device_scratch(dev, a->stream, ws_bytes, &ws);
    launch_scratch *ls = scratch_new(ctx, FWD, &st);
    launch_values v = {.given = 0};
    const aj_tensor i32s[2] = {
        {(void *)a->block_table, AJ_DTYPE_F32, 2, {sz.batch, a->max_pages}, {a->max_pages, 1}},
        {(void *)a->seqlens_k, AJ_DTYPE_F32, 1, {sz.batch}, {1}}};
    const aj_tensor status_word = {dev->status, AJ_DTYPE_F32, 1, {1}, {1}};
    const aj_tensor ws_t = {ws, AJ_DTYPE_F32, 1, {(int64_t)(ws_bytes / 4)}, {1}};
    /* varlen queries: the packed q, o, lse as padded views (batch stride
     * 0), cu_seqlens_q beside them */
    const aj_tensor q = padded_view(&a->q), o = padded_view(&a->o), lse = padded_view(&a->lse);
    const aj_tensor cu_q = {(void *)a->cu_seqlens_q, AJ_DTYPE_F32, 1, {sz.batch + 1}, {1}};
    put_tensor(&v, AJ_PSRC_q, varlen_q ? &q : &a->q);
    put_tensor(&v, AJ_PSRC_o, varlen_q ? &o : &a->o);
    put_tensor(&v, AJ_PSRC_lse, varlen_q ? &lse : &a->lse);
    put_tensor(&v, AJ_PSRC_cu_seqlens_q, &cu_q);
    put_tensor(&v, AJ_PSRC_k_cache, &a->k_cache);
    put_tensor(&v, AJ_PSRC_v_cache, &a->v_cache);
    put_tensor(&v, AJ_PSRC_block_table, &i32s[0]);
    put_tensor(&v, AJ_PSRC_seqlens_k, &i32s[1]);
    put_tensor(&v, AJ_PSRC_k_scale, &a->k_scale);
    put_tensor(&v, AJ_PSRC_v_scale, &a->v_scale);
    put_tensor(&v, AJ_PSRC_varlen_status, &status_word);
    put_tensor(&v, AJ_PSRC_workspace, &ws_t);
    put_scalar(&v, AJ_PSRC_heads_q, sz.heads_q);
    put_scalar(&v, AJ_PSRC_heads_kv, sz.heads_kv);
    put_scalar(&v, AJ_PSRC_seq_q, sz.seq_q);
    put_scalar(&v, AJ_PSRC_batch, sz.batch);
    put_scalar(&v, AJ_PSRC_max_pages, a->max_pages);
    put_scalar(&v, AJ_PSRC_splits, sz.splits);
    put_scalar(&v, AJ_PSRC_head_offset, sz.head_offset);
    if (st == AJ_OK)
        st = bind_scores(ctx, FWD, op, a->side, a->num_side, &a->alibi_slopes, &ls->scores);
    for (int s = 0; st == AJ_OK && s < (sz.splits > 1 ? 2 : 1); s++) {
        st = bind(ctx, kernel, s, &v, &ls->scores, &ls->bound);
        if (st == AJ_OK)
            st = run_kernel(ctx, dev, kernel, s, &sz, ls->bound.argv, ls->bound.buffers,
                            ls->bound.nb, a->stream);
    }
    free(ls);
    if (ws)
        aj_device_scratch_release(dev, a->stream, ws);
    return st == AJ_OK ? aj_device_launched(dev, FWD) : st;
}

aj_status aj_forward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                     const aj_fwd_args *given)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    aj_status st = check_launch(ctx, "aj_forward", dev, kernel, given, AJ_KIND_FORWARD);
    if (st != AJ_OK)
        return st;
    AJ_READ_STRUCT_OR_RETURN(ctx, "aj_forward: args", given, aj_fwd_args, lse, AJ_FWD_ARGS_INIT,
                             args);
    const aj_op_info *op = &kernel->op;
    fwd_sizes sz = {.splits = 1};
    int varlen = op->layout == AJ_LAYOUT_VARLEN;
    if (op->layout == AJ_LAYOUT_PAGED)
        return forward_paged(ctx, dev, kernel, args);
    st = varlen ? check_forward_varlen(ctx, op, args, &sz) : check_forward(ctx, op, args, &sz);
    if (st != AJ_OK)
        return st;
    if (sz.batch == 0 || sz.heads_q == 0 || sz.seq_q == 0)
        return AJ_OK;   /* no output row: nothing to launch */

    int64_t sq_total = args->sq_total ? args->sq_total : sz.seq_q;
    int64_t sk_total = args->sk_total ? args->sk_total : sz.seq_k;
    /* varlen: the packed tensors as padded views, so one table binds both */
    aj_fwd_args as_padded = *args;
    if (varlen) {
        aj_tensor *packed[6] = {&as_padded.q, &as_padded.k, &as_padded.v, &as_padded.o,
                                &as_padded.o_acc, &as_padded.lse};
        for (int i = 0; i < 6; i++)
            *packed[i] = padded_view(packed[i]);
    }
    launch_scratch *ls = scratch_new(ctx, FWD, &st);
    if (!ls)
        return st;
    launch_values v;
    forward_values(&as_padded, &sz, sq_total, sk_total, dev->status, &v);
    st = bind_scores(ctx, FWD, op, args->side, args->num_side, &args->alibi_slopes, &ls->scores);
    void *scratch = NULL;
    const aj_block_mask_shape shape = {sz.batch, sz.heads_q, sz.seq_q, sz.seq_k, args->q_offset,
                                       args->kv_offset, sq_total, sk_total, 0, 0,
                                       sz.head_offset};
    if (st == AJ_OK)
        st = bind_block_mask(ctx, FWD, dev, kernel, &shape, args->block_mask, args->side,
                             args->num_side, &args->alibi_slopes, args->stream, &v, &scratch);
    if (st == AJ_OK)
        st = bind(ctx, kernel, 0, &v, &ls->scores, &ls->bound);
    if (st == AJ_OK)
        st = run_kernel(ctx, dev, kernel, 0, &sz, ls->bound.argv, ls->bound.buffers,
                        ls->bound.nb, args->stream);
    free(ls);
    if (scratch)
        aj_device_scratch_release(dev, args->stream, scratch);
    return st == AJ_OK && varlen ? aj_device_launched(dev, FWD) : st;
}

aj_status aj_block_mask_launch(aj_ctx *ctx, aj_device *dev, const char *fn,
                               const aj_kernel *builder, const aj_block_mask_shape *shape,
                               const aj_tensor *classes, const aj_side_tensor *side,
                               int32_t num_side, const aj_tensor *slopes, void *stream)
{
    /* its own scratch: a launch that builds its mask keeps its own */
    aj_status st = AJ_OK;
    launch_scratch *ls = scratch_new(ctx, fn, &st);
    if (!ls)
        return st;
    launch_values v = {.given = 0};
    put_tensor(&v, AJ_PSRC_block_mask, classes);
    put_scalar(&v, AJ_PSRC_seq_q, shape->seq_q);
    put_scalar(&v, AJ_PSRC_seq_k, shape->seq_k);
    put_scalar(&v, AJ_PSRC_q_offset, shape->q_offset);
    put_scalar(&v, AJ_PSRC_kv_offset, shape->kv_offset);
    put_scalar(&v, AJ_PSRC_seq_q_total, shape->sq_total);
    put_scalar(&v, AJ_PSRC_seq_k_total, shape->sk_total);
    put_scalar(&v, AJ_PSRC_head_offset, shape->head_offset);
    const fwd_sizes sz = {shape->batch, shape->heads, shape->heads, shape->seq_q, shape->seq_k, 1,
                          shape->seq_q, shape->head_offset, shape->heads};
    st = bind_scores(ctx, fn, &builder->op, side, num_side, slopes, &ls->scores);
    /* its stages in order: key-block hulls, classes and row lists, key-block lists */
    for (int s = 0; st == AJ_OK && s < builder->num_stages; s++) {
        st = bind(ctx, builder, s, &v, &ls->scores, &ls->bound);
        if (st == AJ_OK)
            st = run_kernel(ctx, dev, builder, s, &sz, ls->bound.argv, ls->bound.buffers,
                            ls->bound.nb, stream);
    }
    free(ls);
    return st;
}

/* ---------------------------------------------------------------- backward */

#define BWD "aj_backward"

/* A checked backward call: its sizes (varlen: batch and the longest
 * lengths, which size the grid), the query rows of each head (Sq, or Tq
 * for varlen) and the arguments as padded BHSD views (varlen: batch
 * stride 0, so that sequence b's rows start at its cu_seqlens offset). */
typedef struct bwd_call {
    fwd_sizes sz;
    int64_t head_rows;
    aj_bwd_args view;
} bwd_call;

static aj_status check_backward_padded(aj_ctx *ctx, const aj_op_info *op,
                                       const aj_bwd_args *a, fwd_sizes *sz);
static aj_status check_backward_varlen(aj_ctx *ctx, const aj_op_info *op,
                                       const aj_bwd_args *a, bwd_call *call);

static aj_status check_backward(aj_ctx *ctx, const aj_op_info *op, const aj_bwd_args *a,
                                bwd_call *call)
{
    call->view = *a;
    if (op->layout == AJ_LAYOUT_VARLEN)
        return check_backward_varlen(ctx, op, a, call);
    call->head_rows = a->q.shape[2];
    return check_backward_padded(ctx, op, a, &call->sz);
}

/* [T, H, width] packed rows as a [batch, H, T, width] view with batch
 * stride 0. */
static aj_tensor packed_view(const aj_tensor *t, int64_t batch)
{
    aj_tensor v = *t;
    v.rank = 4;
    const int64_t shape[4] = {batch, t->shape[1], t->shape[0], t->shape[2]};
    const int64_t strides[4] = {0, t->strides[1], t->strides[0], 1};
    memcpy(v.shape, shape, sizeof shape);
    memcpy(v.strides, strides, sizeof strides);
    return v;
}

/* Shape `want` of a rank-`rank` tensor, each dim named by `what`. */
static aj_status check_shape(aj_ctx *ctx, const char *name, const aj_tensor *t, int rank,
                             aj_dtype dtype, const int64_t *want, const char *const *what)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_tensor(ctx, BWD, name, t, rank, dtype, rank > 2));
    for (int i = 0; i < rank; i++)
        AJ_TRY(check_dim(ctx, BWD, name, i, t->shape[i], want[i], what[i]));
done:
    return st;
}

/* layout = varlen: q, dq [Tq, Hq, D], k, dk [Tk, Hkv, D], v, dv [Tk, Hkv, Dv],
 * o, do [Tq, Hq, Dv], lse [Hq, Tq] (aj_fwd_args); cu_seqlens_* are checked
 * against Tq and Tk by the kernels (templates/attn_common.h), on the device. */
static aj_status check_backward_varlen(aj_ctx *ctx, const aj_op_info *op,
                                       const aj_bwd_args *a, bwd_call *call)
{
    aj_status st = AJ_OK;
    fwd_sizes *sz = &call->sz;
    if (!a->cu_seqlens_q || !a->cu_seqlens_k)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: cu_seqlens_q and cu_seqlens_k are "
                       "required by layout = varlen kernels (got %s and %s)", BWD,
                       a->cu_seqlens_q ? "a pointer" : "NULL",
                       a->cu_seqlens_k ? "a pointer" : "NULL");
    if (a->batch < 0 || a->batch > MAX_GRID_YZ)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: batch = %d; want 0 .. %d sequences", BWD,
                       a->batch, MAX_GRID_YZ);
    if (a->max_seqlen_q < 0 || a->max_seqlen_k < 0 || a->max_seqlen_q >= MAX_SEQ ||
        a->max_seqlen_k >= MAX_SEQ)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: max_seqlen_q = %d, max_seqlen_k = %d; "
                       "each must be in 0 .. 2^30 - 1", BWD, a->max_seqlen_q, a->max_seqlen_k);
    AJ_TRY(check_tensor(ctx, BWD, "q", &a->q, 3, op->dtype, 1));
    AJ_TRY(check_tensor(ctx, BWD, "k", &a->k, 3, op->dtype, 1));
    int64_t tq = a->q.shape[0], tk = a->k.shape[0];
    sz->batch = a->batch;
    sz->heads_q = a->q.shape[1];
    sz->heads_kv = a->k.shape[1];
    sz->seq_q = a->max_seqlen_q;
    sz->seq_k = a->max_seqlen_k;
    call->head_rows = tq;
    const char *const qwhat[3] = {"q's tokens", "q's heads", "the op's head_dim"};
    const char *const owhat[3] = {"q's tokens", "q's heads", "the op's head_dim_v"};
    const char *const kwhat[3] = {"k's tokens", "k's heads", "the op's head_dim"};
    const char *const vwhat[3] = {"k's tokens", "k's heads", "the op's head_dim_v"};
    const int64_t qs[3] = {tq, sz->heads_q, op->head_dim};
    const int64_t os[3] = {tq, sz->heads_q, op->head_dim_v};
    const int64_t ks[3] = {tk, sz->heads_kv, op->head_dim};
    const int64_t vs[3] = {tk, sz->heads_kv, op->head_dim_v};
    AJ_TRY(check_shape(ctx, "q", &a->q, 3, op->dtype, qs, qwhat));
    AJ_TRY(check_shape(ctx, "k", &a->k, 3, op->dtype, ks, kwhat));
    AJ_TRY(check_shape(ctx, "v", &a->v, 3, op->dtype, vs, vwhat));
    if (sz->heads_kv == 0 ? sz->heads_q != 0 : sz->heads_q % sz->heads_kv != 0)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: q has %lld heads and k %lld; the query "
                       "heads must be a multiple of the key/value heads (GQA)", BWD,
                       (long long)sz->heads_q, (long long)sz->heads_kv);
    if (sz->heads_q > MAX_GRID_YZ)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: heads = %lld; at most %d", BWD,
                       (long long)sz->heads_q, MAX_GRID_YZ);
    AJ_TRY(check_shape(ctx, "o", &a->o, 3, op->dtype, os, owhat));
    AJ_TRY(check_shape(ctx, "do", &a->do_, 3, op->dtype, os, owhat));
    AJ_TRY(check_shape(ctx, "dq", &a->dq, 3, op->dtype, qs, qwhat));
    AJ_TRY(check_shape(ctx, "dk", &a->dk, 3, op->dtype, ks, kwhat));
    AJ_TRY(check_shape(ctx, "dv", &a->dv, 3, op->dtype, vs, vwhat));
    const int64_t ls[2] = {sz->heads_q, tq};
    const char *const lwhat[2] = {"q's heads", "q's tokens"};
    AJ_TRY(check_shape(ctx, "lse", &a->lse, 2, AJ_DTYPE_F32, ls, lwhat));
    AJ_TRY(check_heads(ctx, BWD, op, &a->alibi_slopes, a->head_offset, a->heads_q_total, sz));
    if (a->sq_total < 0 || a->sk_total < 0)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: sq_total = %lld, sk_total = %lld; "
                       "totals are lengths (0: each sequence's own)", BWD,
                       (long long)a->sq_total, (long long)a->sk_total);
    aj_bwd_args *v = &call->view;
    v->q = packed_view(&a->q, a->batch);
    v->k = packed_view(&a->k, a->batch);
    v->v = packed_view(&a->v, a->batch);
    v->o = packed_view(&a->o, a->batch);
    v->do_ = packed_view(&a->do_, a->batch);
    v->dq = packed_view(&a->dq, a->batch);
    v->dk = packed_view(&a->dk, a->batch);
    v->dv = packed_view(&a->dv, a->batch);
    v->lse.rank = 3;
    const int64_t lshape[3] = {a->batch, sz->heads_q, tq};
    const int64_t lstrides[3] = {0, a->lse.strides[0], 1};
    memcpy(v->lse.shape, lshape, sizeof lshape);
    memcpy(v->lse.strides, lstrides, sizeof lstrides);
done:
    return st;
}

static aj_status check_backward_padded(aj_ctx *ctx, const aj_op_info *op,
                                       const aj_bwd_args *a, fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_not_varlen(ctx, BWD, op, a->cu_seqlens_q, a->cu_seqlens_k, a->batch,
                            a->max_seqlen_q, a->max_seqlen_k));
    AJ_TRY(check_qkv(ctx, BWD, op, &a->q, &a->k, &a->v, a->sq_total, a->sk_total, sz));
    AJ_TRY(check_heads(ctx, BWD, op, &a->alibi_slopes, a->head_offset, a->heads_q_total, sz));
    AJ_TRY(check_rows(ctx, BWD, "o", &a->o, op->dtype, op->head_dim_v, "the op's head_dim_v",
                      sz));
    AJ_TRY(check_lse(ctx, BWD, &a->lse, sz));
    AJ_TRY(check_rows(ctx, BWD, "do", &a->do_, op->dtype, op->head_dim_v,
                      "the op's head_dim_v", sz));
    AJ_TRY(check_rows(ctx, BWD, "dq", &a->dq, op->dtype, op->head_dim, "the op's head_dim", sz));
    /* dk and dv: the shapes of k and v */
    const char *const names[2] = {"dk", "dv"};
    const aj_tensor *grads[2] = {&a->dk, &a->dv}, *like[2] = {&a->k, &a->v};
    const char *const what[2][4] = {
        {"k's batch", "k's heads", "k's length", "the op's head_dim"},
        {"v's batch", "v's heads", "v's length", "the op's head_dim_v"}};
    for (int t = 0; t < 2; t++) {
        AJ_TRY(check_tensor(ctx, BWD, names[t], grads[t], 4, op->dtype, 1));
        for (int i = 0; i < 4; i++)
            AJ_TRY(check_dim(ctx, BWD, names[t], i, grads[t]->shape[i], like[t]->shape[i],
                             what[t][i]));
    }
    if (op->bias == AJ_BIAS_ADD) {
        AJ_TRY(check_bias(ctx, BWD, &a->bias, op->dtype, sz));
        /* dbias: f32, of bias's own shape */
        AJ_TRY(check_tensor(ctx, BWD, "dbias", &a->dbias, 4, AJ_DTYPE_F32, 0));
        for (int i = 0; i < 4; i++)
            AJ_TRY(check_dim(ctx, BWD, "dbias", i, a->dbias.shape[i], a->bias.shape[i],
                             "bias's size"));
    }
done:
    return st;
}

/*
 * The workspace of kernels that take one (the flash backward), in f32
 * elements:
 *
 *   [0, rows)                       Delta of each (b, h, i): b stride_b + h stride_h + i
 *   [dq_offset, dq_offset + rows D) dQ sums (deterministic = false only)
 *
 * rows = B Hq Sq (varlen: Hq Tq); dq_offset is rows rounded up to 16 bytes.
 */
struct bwd_workspace {
    int64_t stride_b, stride_h, dq_offset;
    size_t bytes;
};

static bwd_workspace workspace_layout(const aj_kernel *kernel, const bwd_call *call)
{
    bwd_workspace w = {0, 0, 0, 0};
    if (!kernel_takes(kernel, AJ_PID(workspace)))
        return w;
    const fwd_sizes *sz = &call->sz;
    int varlen = kernel->op.layout == AJ_LAYOUT_VARLEN;
    /* varlen: sequence b's rows follow from its cu_seqlens_q offset */
    int64_t rows = (varlen ? 1 : sz->batch) * sz->heads_q * call->head_rows;
    w.stride_b = varlen ? 0 : sz->heads_q * call->head_rows;
    w.stride_h = call->head_rows;
    w.dq_offset = (rows + 3) / 4 * 4;
    int64_t floats = w.dq_offset + (kernel->op.deterministic ? 0 : rows * kernel->op.head_dim);
    w.bytes = (size_t)floats * 4;
    return w;
}

static void backward_values(const aj_bwd_args *a, const fwd_sizes *sz, int64_t sq_total,
                            int64_t sk_total, const bwd_workspace *w, void *ws,
                            void *status, launch_values *v)
{
    attention_values(&a->q, &a->k, &a->v, &a->lse, sz, a->q_offset, a->kv_offset, a->sq_total,
                     a->sk_total, sq_total, sk_total, a->seed, a->offset, a->cu_seqlens_q,
                     a->cu_seqlens_k, a->batch, status, v);
    const aj_tensor *t[7] = {&a->o, &a->do_, &a->dq, &a->dk, &a->dv, &a->bias, &a->dbias};
    const aj_param_source src[7] = {AJ_PSRC_o, AJ_PSRC_do, AJ_PSRC_dq, AJ_PSRC_dk, AJ_PSRC_dv,
                                    AJ_PSRC_bias, AJ_PSRC_dbias};
    for (int i = 0; i < 7; i++)
        put_tensor(v, src[i], t[i]);
    const aj_tensor ws_t = {ws, AJ_DTYPE_F32, 1, {(int64_t)(w->bytes / 4)}, {1}};
    put_tensor(v, AJ_PSRC_workspace, &ws_t);
    put_scalar(v, AJ_PSRC_stride_ws_b, w->stride_b);
    put_scalar(v, AJ_PSRC_stride_ws_h, w->stride_h);
    put_scalar(v, AJ_PSRC_ws_dq_offset, w->dq_offset);
}

aj_status aj_backward_workspace_size(aj_ctx *ctx, const aj_kernel *kernel,
                                     const aj_bwd_args *given, size_t *bytes)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    const char *fn = "aj_backward_workspace_size";
    AJ_CHECK_ARG(ctx, kernel, "%s: kernel is NULL", fn);
    AJ_CHECK_ARG(ctx, given, "%s: args is NULL", fn);
    AJ_CHECK_ARG(ctx, bytes, "%s: bytes is NULL", fn);
    AJ_READ_STRUCT_OR_RETURN(ctx, "aj_backward_workspace_size: args", given, aj_bwd_args, dv,
                             AJ_BWD_ARGS_INIT, args);
    AJ_CHECK_ARG(ctx, kernel->op.kind == AJ_KIND_BACKWARD, "%s: kernel %s computes a %s op",
                 fn, aj_kernel_entry(kernel), aj_kind_name(kernel->op.kind));
    bwd_call call;
    aj_status st = check_backward(ctx, &kernel->op, args, &call);
    if (st != AJ_OK)
        return st;
    *bytes = workspace_layout(kernel, &call).bytes;
    return AJ_OK;
}

static aj_status run_backward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                              const aj_bwd_args *args, const fwd_sizes *sz,
                              const bwd_workspace *w, void *ws);

/* The workspace a launch uses: the caller's, checked, or (*scratch set)
 * the device's scratch for the call's stream, which the caller of this
 * releases once the launches are queued: no allocation after the first
 * call of a size, no synchronisation, no free (aj_device_scratch). */
static aj_status bind_workspace(aj_ctx *ctx, aj_device *dev, const aj_bwd_args *a,
                                const bwd_workspace *w, void **ws, int *scratch)
{
    *ws = a->workspace;
    *scratch = 0;
    if (w->bytes == 0)
        return AJ_OK;
    if (!a->workspace) {
        aj_status st = aj_device_scratch(dev, a->stream, w->bytes, ws);
        *scratch = st == AJ_OK;
        return st;
    }
    if (a->workspace_bytes < w->bytes)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: workspace_bytes = %zu, want at least %zu "
                       "(aj_backward_workspace_size; or NULL workspace to use the device's)",
                       BWD, a->workspace_bytes, w->bytes);
    if ((uintptr_t)a->workspace % 16)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: workspace = %p is not 16-byte aligned",
                       BWD, a->workspace);
    return AJ_OK;
}

aj_status aj_backward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                      const aj_bwd_args *given)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    aj_status st = check_launch(ctx, "aj_backward", dev, kernel, given, AJ_KIND_BACKWARD);
    if (st != AJ_OK)
        return st;
    AJ_READ_STRUCT_OR_RETURN(ctx, "aj_backward: args", given, aj_bwd_args, dv, AJ_BWD_ARGS_INIT,
                             args);
    const aj_op_info *op = &kernel->op;
    bwd_call call;
    st = check_backward(ctx, op, args, &call);
    if (st != AJ_OK)
        return st;
    const fwd_sizes *sz = &call.sz;
    if (sz->batch == 0 || sz->heads_kv == 0 || (sz->seq_q == 0 && sz->seq_k == 0))
        return AJ_OK;   /* no gradient element: nothing to launch */

    bwd_workspace w = workspace_layout(kernel, &call);
    void *ws = NULL;
    int scratch = 0;
    st = bind_workspace(ctx, dev, args, &w, &ws, &scratch);
    if (st == AJ_OK)
        st = run_backward(ctx, dev, kernel, &call.view, sz, &w, ws);
    if (scratch)
        aj_device_scratch_release(dev, args->stream, ws);
    return st == AJ_OK && op->layout == AJ_LAYOUT_VARLEN ? aj_device_launched(dev, BWD) : st;
}

static aj_status run_stages(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                            const aj_bwd_args *a, const fwd_sizes *szp, const launch_values *v,
                            launch_scratch *ls);

/* Binds and runs the stages of a checked backward launch. */
static aj_status run_backward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                              const aj_bwd_args *args, const fwd_sizes *szp,
                              const bwd_workspace *w, void *ws)
{
    const aj_op_info *op = &kernel->op;
    const fwd_sizes sz = *szp;
    aj_status st = AJ_OK;
    int64_t sq_total = args->sq_total ? args->sq_total : sz.seq_q;
    int64_t sk_total = args->sk_total ? args->sk_total : sz.seq_k;
    const aj_bwd_args *a = args;
    launch_scratch *ls = scratch_new(ctx, BWD, &st);
    if (!ls)
        return st;
    launch_values v;
    backward_values(a, &sz, sq_total, sk_total, w, ws, dev->status, &v);
    st = bind_scores(ctx, BWD, op, a->side, a->num_side, &a->alibi_slopes, &ls->scores);
    void *scratch = NULL;
    const aj_block_mask_shape shape = {sz.batch, sz.heads_q, sz.seq_q, sz.seq_k, a->q_offset,
                                       a->kv_offset, sq_total, sk_total, 0, 0,
                                       sz.head_offset};
    if (st == AJ_OK)
        st = bind_block_mask(ctx, BWD, dev, kernel, &shape, a->block_mask, a->side, a->num_side,
                             &a->alibi_slopes, a->stream, &v, &scratch);
    if (st == AJ_OK)
        st = run_stages(ctx, dev, kernel, a, &sz, &v, ls);
    free(ls);
    if (scratch)
        aj_device_scratch_release(dev, a->stream, scratch);
    return st;
}

/* Runs the stages of a bound backward launch in order; an empty grid (no
 * key or no query) is skipped. */
static aj_status run_stages(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                            const aj_bwd_args *a, const fwd_sizes *szp, const launch_values *v,
                            launch_scratch *ls)
{
    const fwd_sizes sz = *szp;
    aj_status st = AJ_OK;
    uint64_t instructions = 0;
    for (int s = 0; s < kernel->num_stages; s++) {
        aj_launch_info li;
        aj_kernel_stage_info(kernel, s, &li);
        int empty = 0;
        for (int d = 0; d < 3; d++)
            empty |= grid_extent(li.grid[d].extent, &sz) == 0;
        if (empty)
            continue;
        st = bind(ctx, kernel, s, v, &ls->scores, &ls->bound);
        if (st == AJ_OK)
            st = run_kernel(ctx, dev, kernel, s, &sz, ls->bound.argv, ls->bound.buffers,
                            ls->bound.nb, a->stream);
        if (st != AJ_OK)
            return st;
        instructions += dev->last_instructions;
    }
    dev->last_instructions = instructions;
    return AJ_OK;
}

/* ---------------------------------------------------------------- merge */

#define MERGE "aj_merge"

/* o1, o2, o [B, H, S, Dv] of the op's dtype, lse1, lse2, lse [B, H, S]
 * f32, all of o1's sizes. */
static aj_status check_merge(aj_ctx *ctx, const aj_op_info *op, const aj_merge_args *a,
                             fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    const char *const o_names[3] = {"o1", "o2", "o"};
    const char *const lse_names[3] = {"lse1", "lse2", "lse"};
    const aj_tensor *os[3] = {&a->o1, &a->o2, &a->o};
    const aj_tensor *lses[3] = {&a->lse1, &a->lse2, &a->lse};
    AJ_TRY(check_tensor(ctx, MERGE, "o1", &a->o1, 4, op->dtype, 1));
    memset(sz, 0, sizeof *sz);
    sz->batch = a->o1.shape[0];
    sz->heads_q = a->o1.shape[1];
    sz->seq_q = a->o1.shape[2];
    const int64_t want[4] = {sz->batch, sz->heads_q, sz->seq_q, op->head_dim_v};
    const char *const what[4] = {"o1's batch", "o1's heads", "o1's length",
                                 "the op's head_dim_v"};
    for (int t = 0; t < 3; t++) {
        AJ_TRY(check_tensor(ctx, MERGE, o_names[t], os[t], 4, op->dtype, 1));
        AJ_TRY(check_tensor(ctx, MERGE, lse_names[t], lses[t], 3, AJ_DTYPE_F32, 0));
        for (int i = 0; i < 4; i++)
            AJ_TRY(check_dim(ctx, MERGE, o_names[t], i, os[t]->shape[i], want[i], what[i]));
        for (int i = 0; i < 3; i++)
            AJ_TRY(check_dim(ctx, MERGE, lse_names[t], i, lses[t]->shape[i], want[i], what[i]));
    }
    if (sz->seq_q >= MAX_SEQ) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "aj_merge: S = %lld; lengths must be below 2^30",
                     (long long)sz->seq_q);
        goto done;
    }
    if (sz->batch > MAX_GRID_YZ || sz->heads_q > MAX_GRID_YZ) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "aj_merge: batch = %lld, heads = %lld; each "
                     "must be at most %d", (long long)sz->batch, (long long)sz->heads_q,
                     MAX_GRID_YZ);
        goto done;
    }
done:
    return st;
}

aj_status aj_merge(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                   const aj_merge_args *given)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    aj_status st = check_launch(ctx, "aj_merge", dev, kernel, given, AJ_KIND_MERGE);
    if (st != AJ_OK)
        return st;
    AJ_READ_STRUCT_OR_RETURN(ctx, "aj_merge: args", given, aj_merge_args, lse,
                             AJ_MERGE_ARGS_INIT, args);
    const aj_op_info *op = &kernel->op;
    fwd_sizes sz = {.splits = 1};
    st = check_merge(ctx, op, args, &sz);
    if (st != AJ_OK)
        return st;
    if (sz.batch == 0 || sz.heads_q == 0 || sz.seq_q == 0)
        return AJ_OK;   /* no row: nothing to launch */

    launch_scratch *ls = scratch_new(ctx, MERGE, &st);
    if (!ls)
        return st;
    launch_values v;
    merge_values(args, &sz, &v);
    st = bind(ctx, kernel, 0, &v, NULL, &ls->bound);
    if (st == AJ_OK)
        st = run_kernel(ctx, dev, kernel, 0, &sz, ls->bound.argv, ls->bound.buffers,
                        ls->bound.nb, args->stream);
    free(ls);
    return st;
}

uint64_t aj_launch_sources(aj_kind kind)
{
    launch_values v = {.given = 0};
    const fwd_sizes sz = {0};
    if (kind == AJ_KIND_FORWARD) {
        const aj_fwd_args a = AJ_FWD_ARGS_INIT;
        forward_values(&a, &sz, 0, 0, NULL, &v);
    } else if (kind == AJ_KIND_BACKWARD) {
        const aj_bwd_args a = AJ_BWD_ARGS_INIT;
        const bwd_workspace w = {0, 0, 0, 0};
        backward_values(&a, &sz, 0, 0, &w, NULL, NULL, &v);
    } else if (kind == AJ_KIND_MERGE) {
        const aj_merge_args a = AJ_MERGE_ARGS_INIT;
        merge_values(&a, &sz, &v);
    }
    return v.given;
}
