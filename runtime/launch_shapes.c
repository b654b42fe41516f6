/*
 * launch_shapes.c -- the shape rules of a launch, per layout: every
 * argument of aj_forward (padded, varlen, paged), aj_backward (padded,
 * varlen) and aj_merge checked against the kernel's op, errors naming the
 * argument, and the sizes the call implies (docs/design.md, "The life of
 * an op", step 7).  No device is touched here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/launch_internal.h"
#include "templates/attn_common.h"

/* ---------------------------------------------------------------- tensors */

int64_t aj_tensor_extent_bytes(const aj_tensor *t, int elem)
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

/* Rank, dtype, non-negative shape and strides, unit last stride, data;
 * `aligned`: 0, or every row starting on that many bytes. */
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
    if (!t->data && aj_tensor_extent_bytes(t, elem_size(dtype)) > 0)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.data is NULL", fn, name);
    return aligned ? check_aligned(ctx, fn, name, t, rank, elem_size(dtype), aligned, "")
                   : AJ_OK;
}

static aj_status check_dim(aj_ctx *ctx, const char *fn, const char *name, int i,
                           int64_t got, int64_t want, const char *what)
{
    if (got == want)
        return AJ_OK;
    return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.shape[%d] = %lld, want %lld (%s)",
                   fn, name, i, (long long)got, (long long)want, what);
}

/* ---------------------------------------------------------------- forward */

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
    if (aj_op_info_alibi_slopes(op)) {
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
static aj_status check_qkv(aj_ctx *ctx, const char *fn, const aj_op_info *op, aj_dtype q_dtype,
                           const int32_t *row_align, const aj_tensor *q, const aj_tensor *k,
                           const aj_tensor *v, int64_t sq_total, int64_t sk_total,
                           fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_tensor(ctx, fn, "q", q, 4, q_dtype, row_align[AJ_ROW_Q]));
    AJ_TRY(check_tensor(ctx, fn, "k", k, 4, op->kv_dtype, row_align[AJ_ROW_K]));
    AJ_TRY(check_tensor(ctx, fn, "v", v, 4, op->kv_dtype, row_align[AJ_ROW_V]));
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

/* One descale tensor: f32 [1] (per tensor) or [heads] (per head). */
static aj_status check_descale(aj_ctx *ctx, const char *fn, const char *name, const aj_tensor *t,
                               int64_t heads, const char *whose)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_tensor(ctx, fn, name, t, 1, AJ_DTYPE_F32, 0));
    if (t->shape[0] != 1 && t->shape[0] != heads)
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.shape[0] = %lld, want 1 (one descale "
                     "per tensor) or %lld (one per %s head)", fn, name,
                     (long long)t->shape[0], (long long)heads, whose);
done:
    return st;
}

/* The descales of 8-bit inputs (docs/ir.md "FP8 inputs"): q_scale for f8
 * queries, k_scale and v_scale for an f8 K/V, each of one element or one
 * per head; left empty otherwise. */
static aj_status check_descales(aj_ctx *ctx, const aj_op_info *op, aj_dtype q_dtype,
                           const aj_fwd_args *a, const fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    if (q_dtype >= AJ_DTYPE_F8E4M3)
        AJ_TRY(check_descale(ctx, FWD, "q_scale", &a->q_scale, sz->heads_q, "query"));
    else
        AJ_CHECK_ARG(ctx, !a->q_scale.data, "%s: q_scale is for f8 queries; this kernel's "
                     "are %s (leave it empty)", FWD, aj_dtype_name(q_dtype));
    if (op->kv_dtype >= AJ_DTYPE_F8E4M3) {
        AJ_TRY(check_descale(ctx, FWD, "k_scale", &a->k_scale, sz->heads_kv, "KV"));
        AJ_TRY(check_descale(ctx, FWD, "v_scale", &a->v_scale, sz->heads_kv, "KV"));
    } else {
        AJ_CHECK_ARG(ctx, !a->k_scale.data && !a->v_scale.data, "%s: k_scale and v_scale are "
                     "for f8 keys and values; this kernel's are %s (leave them empty)", FWD,
                     aj_dtype_name(op->kv_dtype));
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
    AJ_TRY(check_tensor(ctx, fn, name, t, 4, dtype, 16));
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
    AJ_TRY(check_tensor(ctx, FWD, name, o, 3, dtype, 16));
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

aj_status aj_check_forward(aj_ctx *ctx, const aj_kernel *kernel, const aj_fwd_args *a,
                           fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    const aj_op_info *op = &kernel->op;
    const aj_dtype q_dtype = aj_kernel_q_dtype(kernel);
    AJ_TRY(check_not_varlen(ctx, FWD, op, a->cu_seqlens_q, a->cu_seqlens_k, a->batch,
                            a->max_seqlen_q, a->max_seqlen_k));
    AJ_TRY(check_qkv(ctx, FWD, op, q_dtype, kernel->row_align, &a->q, &a->k, &a->v, a->sq_total,
                     a->sk_total, sz));
    AJ_TRY(check_descales(ctx, op, q_dtype, a, sz));
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

/* A varlen call's sizes: `batch` sequences of at most max_q queries and
 * max_k keys, the heads those of q and k ([T, H, D], checked). */
static void varlen_sizes(const aj_tensor *q, const aj_tensor *k, int batch, int max_q,
                         int max_k, fwd_sizes *sz)
{
    sz->batch = batch;
    sz->heads_q = q->shape[1];
    sz->heads_kv = k->shape[1];
    sz->seq_q = max_q;
    sz->seq_k = max_k;
}

/*
 * layout = varlen (aj_fwd_args): q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv],
 * o or o_acc [Tq, Hq, Dv], lse [Hq, Tq], and cu_seqlens_q / _k of batch + 1
 * entries.  The grid covers batch sequences of up to max_seqlen_q rows.
 */
aj_status aj_check_forward_varlen(aj_ctx *ctx, const aj_kernel *kernel, const aj_fwd_args *a,
                                  fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    const aj_op_info *op = &kernel->op;
    const aj_dtype q_dtype = aj_kernel_q_dtype(kernel);
    const int32_t *row_align = kernel->row_align;
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
    AJ_TRY(check_tensor(ctx, FWD, "q", &a->q, 3, q_dtype, row_align[AJ_ROW_Q]));
    AJ_TRY(check_tensor(ctx, FWD, "k", &a->k, 3, op->kv_dtype, row_align[AJ_ROW_K]));
    AJ_TRY(check_tensor(ctx, FWD, "v", &a->v, 3, op->kv_dtype, row_align[AJ_ROW_V]));
    int64_t tq = a->q.shape[0], tk = a->k.shape[0];
    varlen_sizes(&a->q, &a->k, a->batch, a->max_seqlen_q, a->max_seqlen_k, sz);
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
    AJ_TRY(check_descales(ctx, op, q_dtype, a, sz));
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

/* A paged cache [num_pages, page_size, Hkv, D or Dv] of the op's
 * kv_dtype, each row on the bytes the kernel reads it in (the sim/GPU
 * kernel: chunks of 16 bytes, 8 for an f8 cache it loads by threads;
 * docs/gpu.md; the cpu kernel: any element). */
static aj_status check_cache(aj_ctx *ctx, const aj_kernel *kernel, const char *name,
                             const aj_tensor *t, aj_row_tensor rows)
{
    const aj_dtype dtype = kernel->op.kv_dtype;
    const int size = elem_size(dtype), chunk = kernel->row_align[rows];
    aj_status st = check_tensor(ctx, FWD, name, t, 4, dtype, 0);
    if (st != AJ_OK || chunk <= size)
        return st;
    char why[64];
    snprintf(why, sizeof why, " (the paged kernel reads cache rows in %d-byte chunks)", chunk);
    return check_aligned(ctx, FWD, name, t, 4, size, chunk, why);
}

/*
 * layout = paged (aj_fwd_args): q [B, Hq, Sq, D], o [B, Hq, Sq, Dv], lse
 * [B, Hq, Sq], the caches [num_pages, page_size, Hkv, D or Dv] of the
 * op's kv_dtype, block_table [B, max_pages] and seqlens_k [B] (their
 * values are the kernel's to check), the f8 caches' scales.  seq_k is the
 * longest a sequence may be: max_pages page_size.
 */
aj_status aj_check_forward_paged(aj_ctx *ctx, const aj_kernel *kernel, const aj_fwd_args *a,
                                 fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    const aj_op_info *op = &kernel->op;
    const int varlen_q = op->q_layout == AJ_LAYOUT_VARLEN;
    AJ_CHECK_ARG(ctx, !a->k.data && !a->v.data && (varlen_q || !a->cu_seqlens_q) &&
                 !a->cu_seqlens_k && !a->q_offset && !a->kv_offset && !a->sq_total &&
                 !a->sk_total, "%s: k, v, cu_seqlens, offsets and totals are not for layout = "
                 "paged kernels (the keys are k_cache and v_cache; positions follow "
                 "seqlens_k)", FWD);
    AJ_TRY(check_tensor(ctx, FWD, "q", &a->q, varlen_q ? 3 : 4, op->dtype,
                        kernel->row_align[AJ_ROW_Q]));
    AJ_TRY(check_cache(ctx, kernel, "k_cache", &a->k_cache, AJ_ROW_K_CACHE));
    AJ_TRY(check_cache(ctx, kernel, "v_cache", &a->v_cache, AJ_ROW_V_CACHE));
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
    AJ_TRY(check_descales(ctx, op, op->dtype, a, sz));
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

/* A packed [T, H, D] tensor as the [1, H, T, D] view the padded binding
 * reads (batch stride 0); lse [Hq, Tq] as [1, Hq, Tq]; a tensor the op
 * does not use (o or o_acc, left empty) as it is. */
aj_tensor aj_padded_view(const aj_tensor *t)
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

/* ---------------------------------------------------------------- backward */

static aj_status check_backward_padded(aj_ctx *ctx, const aj_op_info *op,
                                       const int32_t *row_align, const aj_bwd_args *a,
                                       fwd_sizes *sz);
static aj_status check_backward_varlen(aj_ctx *ctx, const aj_op_info *op,
                                       const int32_t *row_align, const aj_bwd_args *a,
                                       bwd_call *call);

aj_status aj_check_backward(aj_ctx *ctx, const aj_kernel *kernel, const aj_bwd_args *a,
                            bwd_call *call)
{
    call->view = *a;
    if (kernel->op.layout == AJ_LAYOUT_VARLEN)
        return check_backward_varlen(ctx, &kernel->op, kernel->row_align, a, call);
    call->head_rows = a->q.shape[2];
    return check_backward_padded(ctx, &kernel->op, kernel->row_align, a, &call->sz);
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
    AJ_TRY(check_tensor(ctx, BWD, name, t, rank, dtype, rank > 2 ? 16 : 0));
    for (int i = 0; i < rank; i++)
        AJ_TRY(check_dim(ctx, BWD, name, i, t->shape[i], want[i], what[i]));
done:
    return st;
}

/* layout = varlen: q, dq [Tq, Hq, D], k, dk [Tk, Hkv, D], v, dv [Tk, Hkv, Dv],
 * o, do [Tq, Hq, Dv], lse [Hq, Tq] (aj_fwd_args); cu_seqlens_* are checked
 * against Tq and Tk by the kernels (templates/attn_common.h), on the device. */
static aj_status check_backward_varlen(aj_ctx *ctx, const aj_op_info *op,
                                       const int32_t *row_align, const aj_bwd_args *a,
                                       bwd_call *call)
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
    AJ_TRY(check_tensor(ctx, BWD, "q", &a->q, 3, op->dtype, row_align[AJ_ROW_Q]));
    AJ_TRY(check_tensor(ctx, BWD, "k", &a->k, 3, op->dtype, row_align[AJ_ROW_K]));
    int64_t tq = a->q.shape[0], tk = a->k.shape[0];
    varlen_sizes(&a->q, &a->k, a->batch, a->max_seqlen_q, a->max_seqlen_k, sz);
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
                                       const int32_t *row_align, const aj_bwd_args *a,
                                       fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_not_varlen(ctx, BWD, op, a->cu_seqlens_q, a->cu_seqlens_k, a->batch,
                            a->max_seqlen_q, a->max_seqlen_k));
    AJ_TRY(check_qkv(ctx, BWD, op, op->dtype, row_align, &a->q, &a->k, &a->v, a->sq_total,
                     a->sk_total, sz));
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
        AJ_TRY(check_tensor(ctx, BWD, names[t], grads[t], 4, op->dtype, 16));
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

/* ---------------------------------------------------------------- merge */

/* o1, o2, o [B, H, S, Dv] of the op's dtype, lse1, lse2, lse [B, H, S]
 * f32, all of o1's sizes. */
aj_status aj_check_merge(aj_ctx *ctx, const aj_op_info *op, const aj_merge_args *a,
                         fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    const char *const o_names[3] = {"o1", "o2", "o"};
    const char *const lse_names[3] = {"lse1", "lse2", "lse"};
    const aj_tensor *os[3] = {&a->o1, &a->o2, &a->o};
    const aj_tensor *lses[3] = {&a->lse1, &a->lse2, &a->lse};
    AJ_TRY(check_tensor(ctx, MERGE, "o1", &a->o1, 4, op->dtype, 16));
    memset(sz, 0, sizeof *sz);
    sz->batch = a->o1.shape[0];
    sz->heads_q = a->o1.shape[1];
    sz->seq_q = a->o1.shape[2];
    const int64_t want[4] = {sz->batch, sz->heads_q, sz->seq_q, op->head_dim_v};
    const char *const what[4] = {"o1's batch", "o1's heads", "o1's length",
                                 "the op's head_dim_v"};
    for (int t = 0; t < 3; t++) {
        AJ_TRY(check_tensor(ctx, MERGE, o_names[t], os[t], 4, op->dtype, 16));
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
