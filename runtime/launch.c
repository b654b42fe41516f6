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
#include "runtime/sim/emulator.h"
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
    return d == AJ_DTYPE_F32 ? 4 : 2;
}

#define FWD "aj_forward"

/* Rank, dtype, non-negative shape and strides, unit last stride, data. */
static aj_status check_tensor(aj_ctx *ctx, const char *fn, const char *name,
                              const aj_tensor *t, int rank, aj_dtype dtype, int aligned)
{
    if (t->rank != rank)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.rank = %d, want %d", fn, name,
                       t->rank, rank);
    if (t->dtype != dtype)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.dtype = %s, want %s", fn, name,
                       aj_dtype_name(t->dtype) ? aj_dtype_name(t->dtype) : "(invalid)",
                       aj_dtype_name(dtype));
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
    if (aligned) {
        int per16 = 16 / elem_size(dtype);
        if ((uintptr_t)t->data % 16)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.data = %p is not 16-byte "
                           "aligned", fn, name, t->data);
        for (int i = 0; i < rank - 1; i++)
            if (t->strides[i] % per16)
                return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.strides[%d] = %lld is "
                               "not a multiple of %d elements (16 bytes)", fn, name, i,
                               (long long)t->strides[i], per16);
    }
    return AJ_OK;
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
} fwd_sizes;

/* What forward and backward calls share: q, k, v and the sizes they
 * imply, lengths and grid limits, alibi slopes and the totals.  `fn`
 * names the call in messages. */
static aj_status check_qkv(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                           const aj_tensor *q, const aj_tensor *k, const aj_tensor *v,
                           const aj_tensor *alibi_slopes, int64_t sq_total, int64_t sk_total,
                           fwd_sizes *sz)
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
    if (op->score_mod == AJ_SCORE_MOD_ALIBI) {
        AJ_TRY(check_tensor(ctx, fn, "alibi_slopes", alibi_slopes, 1, AJ_DTYPE_F32, 0));
        AJ_TRY(check_dim(ctx, fn, "alibi_slopes", 0, alibi_slopes->shape[0], sz->heads_q,
                         "q's heads"));
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
    AJ_TRY(check_qkv(ctx, FWD, op, &a->q, &a->k, &a->v, &a->alibi_slopes, a->sq_total,
                     a->sk_total, sz));
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
    if (op->score_mod == AJ_SCORE_MOD_ALIBI) {
        AJ_TRY(check_tensor(ctx, FWD, "alibi_slopes", &a->alibi_slopes, 1, AJ_DTYPE_F32, 0));
        AJ_TRY(check_dim(ctx, FWD, "alibi_slopes", 0, a->alibi_slopes.shape[0], sz->heads_q,
                         "q's heads"));
    }
    if (a->sq_total < 0 || a->sk_total < 0) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: sq_total = %lld, sk_total = %lld; "
                     "totals are lengths (0: each sequence's own)", FWD,
                     (long long)a->sq_total, (long long)a->sk_total);
        goto done;
    }
    const char *out = op->accumulate ? "o_acc" : "o";
    const aj_tensor *o = op->accumulate ? &a->o_acc : &a->o;
    AJ_TRY(check_tensor(ctx, FWD, out, o, 3, op->accumulate ? AJ_DTYPE_F32 : op->dtype, 1));
    AJ_TRY(check_dim(ctx, FWD, out, 0, o->shape[0], tq, "q's total length"));
    AJ_TRY(check_dim(ctx, FWD, out, 1, o->shape[1], sz->heads_q, "q's heads"));
    AJ_TRY(check_dim(ctx, FWD, out, 2, o->shape[2], op->head_dim_v, "the op's head_dim_v"));
    AJ_TRY(check_tensor(ctx, FWD, "lse", &a->lse, 2, AJ_DTYPE_F32, 0));
    AJ_TRY(check_dim(ctx, FWD, "lse", 0, a->lse.shape[0], sz->heads_q, "q's heads"));
    AJ_TRY(check_dim(ctx, FWD, "lse", 1, a->lse.shape[1], tq, "q's total length"));
done:
    return st;
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

typedef struct binding {
    const char *name;
    aj_param_type type;
    aj_arg_value value;
} binding;

/* The parameters of score.h's programs (the totals, alibi's slopes' size
 * and stride, each side tensor's pointer, sizes and strides) and the sim
 * buffers of the side tensors. */
#define SCORE_BINDINGS (4 + AJ_OP_TENSORS_MAX * (1 + 2 * 4))
typedef struct score_bindings {
    binding b[SCORE_BINDINGS];
    char names[SCORE_BINDINGS][AJ_OP_TENSOR_NAME_MAX + 16];
    int n;
    aj_sim_buffer buffers[AJ_OP_TENSORS_MAX];
    int nb;
} score_bindings;

static void score_bind(score_bindings *sb, const char *name, aj_param_type type,
                       aj_arg_value value)
{
    snprintf(sb->names[sb->n], sizeof sb->names[0], "%s", name);
    sb->b[sb->n] = (binding){sb->names[sb->n], type, value};
    sb->n++;
}

static void score_bind_dims(score_bindings *sb, const char *tensor, int rank,
                            const int64_t *shape, const int64_t *strides)
{
    char name[AJ_OP_TENSOR_NAME_MAX + 16];
    for (int d = 0; d < rank; d++) {
        aj_score_param_name(name, sizeof name, tensor, 's', d);
        score_bind(sb, name, AJ_PARAM_I64, (aj_arg_value){.i64 = shape[d]});
        aj_score_param_name(name, sizeof name, tensor, 't', d);
        score_bind(sb, name, AJ_PARAM_I64, (aj_arg_value){.i64 = strides[d]});
    }
}

/* Checks the side tensors of a launch against the op's declarations and
 * binds them, as `fn` in messages. */
static aj_status bind_scores(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                             const aj_side_tensor *side, int32_t num_side,
                             const aj_tensor *slopes, int64_t sq_total, int64_t sk_total,
                             score_bindings *sb)
{
    memset(sb, 0, sizeof *sb);
    score_bind(sb, "seq_q_total", AJ_PARAM_I64, (aj_arg_value){.i64 = sq_total});
    score_bind(sb, "seq_k_total", AJ_PARAM_I64, (aj_arg_value){.i64 = sk_total});
    score_bind_dims(sb, "alibi_slopes", 1, slopes->shape, slopes->strides);
    AJ_CHECK_ARG(ctx, num_side >= 0 && (num_side == 0 || side),
                 "%s: side is NULL with num_side = %d", fn, num_side);
    for (int i = 0; i < num_side; i++) {
        int known = 0;
        for (int d = 0; d < op->num_tensors; d++)
            known |= side[i].name && strcmp(side[i].name, op->tensors[d].name) == 0;
        AJ_CHECK_ARG(ctx, known, "%s: side[%d] ('%s') is not a tensor the op declares", fn, i,
                     side[i].name ? side[i].name : "(null)");
    }
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
        int64_t last = 0;
        for (int k = 0; k < t->rank; k++) {
            AJ_CHECK_ARG(ctx, t->shape[k] >= 1, "%s: side tensor '%s' has shape[%d] = %lld; "
                         "every dim must be at least 1", fn, decl->name, k,
                         (long long)t->shape[k]);
            AJ_CHECK_ARG(ctx, t->strides[k] >= 0, "%s: side tensor '%s' has stride[%d] = %lld; "
                         "strides must not be negative", fn, decl->name, k,
                         (long long)t->strides[k]);
            last += (t->shape[k] - 1) * t->strides[k];
        }
        score_bind(sb, decl->name, AJ_PARAM_PTR, (aj_arg_value){.ptr = (void *)t->data});
        score_bind_dims(sb, decl->name, t->rank, t->shape, t->strides);
        sb->buffers[sb->nb++] = (aj_sim_buffer){decl->name, t->data, (size_t)(last + 1) * 4};
    }
    return AJ_OK;
}

/* Fills values / args for stage `stage`'s parameters from the table, then
 * from the score programs' bindings (may be NULL). */
static aj_status bind(aj_ctx *ctx, const aj_kernel *kernel, int stage, const binding *table,
                      int n, const score_bindings *scores, aj_arg_value *values, void **args)
{
    aj_launch_info li;
    aj_kernel_stage_info(kernel, stage, &li);
    for (int i = 0; i < li.num_params; i++) {
        const binding *b = NULL;
        for (int j = 0; j < n && !b; j++)
            if (strcmp(table[j].name, li.params[i].name) == 0)
                b = &table[j];
        for (int j = 0; scores && j < scores->n && !b; j++)
            if (strcmp(scores->b[j].name, li.params[i].name) == 0)
                b = &scores->b[j];
        if (!b || b->type != li.params[i].type)
            return aj_fail(ctx, AJ_ERR_INTERNAL, "kernel %s: no launch value for parameter "
                           "'%s'", aj_kernel_stage_entry(kernel, stage), li.params[i].name);
        values[i] = b->value;
        args[i] = &values[i];
    }
    return AJ_OK;
}

#define PTR(n, t) {n, AJ_PARAM_PTR, {.ptr = (t).data}}
#define I64(n, v) {n, AJ_PARAM_I64, {.i64 = (v)}}
#define I32(n, v) {n, AJ_PARAM_I32, {.i32 = (int32_t)(v)}}
/* The varlen sequence lookup's sizes and the device's status word
 * (templates/attn_common.h; "batch" is bound with the other sizes). */
#define VARLEN_SIZES(dev, tokens_q, tokens_k, args)                                     \
    I32("tokens_q", tokens_q), I32("tokens_k", tokens_k),                               \
    I32("max_seqlen_q", (args)->max_seqlen_q), I32("max_seqlen_k", (args)->max_seqlen_k), \
    {"varlen_status", AJ_PARAM_PTR, {.ptr = (dev)->status}}

static int64_t grid_extent(aj_extent e, const fwd_sizes *sz)
{
    switch (e) {
    case AJ_EXTENT_BATCH: return sz->batch;
    case AJ_EXTENT_HEADS_Q: return sz->heads_q;
    case AJ_EXTENT_HEADS_KV: return sz->heads_kv;
    case AJ_EXTENT_SEQ_Q: return sz->seq_q;
    case AJ_EXTENT_SEQ_K: return sz->seq_k;
    default: return 1;
    }
}

/* Runs stage `stage` of the bound kernel over the grid its launch info
 * asks for: on the GPU, or on sim with `buffers` as the memory its
 * accesses may touch. */
static aj_status run_kernel(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel, int stage,
                            const fwd_sizes *sz, void **argv, const aj_sim_buffer *buffers,
                            int num_buffers, void *stream)
{
    aj_launch_info li;
    aj_kernel_stage_info(kernel, stage, &li);
    int32_t grid[3];
    for (int d = 0; d < 3; d++) {
        int64_t e = grid_extent(li.grid[d].extent, sz);
        grid[d] = (int32_t)((e + li.grid[d].per_block - 1) / li.grid[d].per_block);
    }
    if (dev->cuda)
        return aj_cuda_launch(ctx, dev->cuda, kernel, stage, grid, argv, stream);
    if (dev->cpu)
        return aj_cpu_launch(ctx, dev->cpu, dev->workers, kernel->stages[stage].host_entry,
                             grid, argv);
    aj_sim_launch launch = {
        .kernel_name = aj_kernel_stage_entry(kernel, stage),
        .entry = kernel->stages[stage].host_entry,
        .grid = {grid[0], grid[1], grid[2]},
        .block_threads = li.block[0],
        .smem_bytes = li.dynamic_smem,
        .args = argv,
        .buffers = buffers,
        .num_buffers = num_buffers,
        .workers = dev->workers,
    };
    aj_status st = aj_sim_run(ctx, &launch);
    dev->last_instructions = launch.instructions;
    return st;
}

/* A sim buffer for tensor t of elements of `elem` bytes. */
static aj_sim_buffer sim_buffer(const char *name, const aj_tensor *t, int elem)
{
    return (aj_sim_buffer){name, t->data, (size_t)extent_bytes(t, elem)};
}

/* The stride of dim i of a tensor that may broadcast there: 0 at size 1. */
static int64_t broadcast_stride(const aj_tensor *t, int i)
{
    return t->shape[i] == 1 ? 0 : t->strides[i];
}

/* The checks every launch entry point starts with, reported as `fn`.
 * Every args struct begins with its struct_size. */
static aj_status check_launch(aj_ctx *ctx, const char *fn, aj_device *dev,
                              const aj_kernel *kernel, const void *args, size_t args_size,
                              const char *init, aj_kind kind)
{
    AJ_CHECK_ARG(ctx, dev, "%s: dev is NULL", fn);
    AJ_CHECK_ARG(ctx, kernel, "%s: kernel is NULL", fn);
    AJ_CHECK_ARG(ctx, args, "%s: args is NULL", fn);
    size_t given;
    memcpy(&given, args, sizeof given);
    AJ_CHECK_ARG(ctx, given == args_size,
                 "%s: args->struct_size = %zu, want %zu; start from %s", fn, given, args_size,
                 init);
    AJ_CHECK_ARG(ctx, kernel->op.kind == kind, "%s: kernel %s computes a %s op", fn,
                 aj_kernel_entry(kernel), aj_kind_name(kernel->op.kind));
    AJ_CHECK_ARG(ctx, kernel->target == aj_device_target(dev),
                 "%s: kernel compiled for %s cannot run on a %s device", fn,
                 aj_target_name(kernel->target), aj_target_name(aj_device_target(dev)));
    return AJ_OK;
}

aj_status aj_forward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                     const aj_fwd_args *args)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    aj_status st = check_launch(ctx, "aj_forward", dev, kernel, args, sizeof *args,
                                "AJ_FWD_ARGS_INIT", AJ_KIND_FORWARD);
    if (st != AJ_OK)
        return st;
    const aj_op_info *op = &kernel->op;
    fwd_sizes sz;
    int varlen = op->layout == AJ_LAYOUT_VARLEN;
    st = varlen ? check_forward_varlen(ctx, op, args, &sz) : check_forward(ctx, op, args, &sz);
    if (st != AJ_OK)
        return st;
    if (sz.batch == 0 || sz.heads_q == 0 || sz.seq_q == 0)
        return AJ_OK;   /* no output row: nothing to launch */

    int64_t sq_total = args->sq_total ? args->sq_total : sz.seq_q;
    int64_t sk_total = args->sk_total ? args->sk_total : sz.seq_k;
    int64_t shift = op->mask_align == AJ_ALIGN_BOTTOM_RIGHT ? sk_total - sq_total : 0;
    /* varlen: the packed tensors as padded views, so one table binds both */
    aj_fwd_args as_padded = *args;
    if (varlen) {
        aj_tensor *packed[6] = {&as_padded.q, &as_padded.k, &as_padded.v, &as_padded.o,
                                &as_padded.o_acc, &as_padded.lse};
        for (int i = 0; i < 6; i++)
            *packed[i] = padded_view(packed[i]);
    }
    const aj_fwd_args *a = &as_padded;
    const binding table[] = {
        PTR("q", a->q), PTR("k", a->k), PTR("v", a->v), PTR("o", a->o), PTR("lse", a->lse),
        PTR("alibi_slopes", a->alibi_slopes),
        I64("stride_q_b", a->q.strides[0]), I64("stride_q_h", a->q.strides[1]),
        I64("stride_q_s", a->q.strides[2]), I64("stride_k_b", a->k.strides[0]),
        I64("stride_k_h", a->k.strides[1]), I64("stride_k_s", a->k.strides[2]),
        I64("stride_v_b", a->v.strides[0]), I64("stride_v_h", a->v.strides[1]),
        I64("stride_v_s", a->v.strides[2]), I64("stride_o_b", a->o.strides[0]),
        I64("stride_o_h", a->o.strides[1]), I64("stride_o_s", a->o.strides[2]),
        I64("stride_lse_b", a->lse.strides[0]), I64("stride_lse_h", a->lse.strides[1]),
        I32("heads_q", sz.heads_q), I32("heads_kv", sz.heads_kv),
        I32("seq_q", sz.seq_q), I32("seq_k", sz.seq_k),
        I64("q_offset", a->q_offset), I64("kv_offset", a->kv_offset),
        I64("mask_shift", shift),
        PTR("bias", a->bias), I64("stride_bias_b", broadcast_stride(&a->bias, 0)),
        I64("stride_bias_h", broadcast_stride(&a->bias, 1)),
        I64("stride_bias_s", a->bias.strides[2]),
        PTR("o_acc", a->o_acc), I64("stride_o_acc_b", a->o_acc.strides[0]),
        I64("stride_o_acc_h", a->o_acc.strides[1]), I64("stride_o_acc_s", a->o_acc.strides[2]),
        I64("dropout_seed", (int64_t)a->seed), I64("dropout_offset", (int64_t)a->offset),
        {"cu_seqlens_q", AJ_PARAM_PTR, {.ptr = (void *)a->cu_seqlens_q}},
        {"cu_seqlens_k", AJ_PARAM_PTR, {.ptr = (void *)a->cu_seqlens_k}},
        I64("sq_total", a->sq_total), I64("sk_total", a->sk_total),
        VARLEN_SIZES(dev, args->q.shape[0], args->k.shape[0], args), I32("batch", sz.batch),
    };
    static _Thread_local score_bindings scores;
    st = bind_scores(ctx, FWD, op, a->side, a->num_side, &a->alibi_slopes, sq_total, sk_total,
                     &scores);
    aj_arg_value values[AJ_KB_MAX_PARAMS];
    void *argv[AJ_KB_MAX_PARAMS];
    if (st == AJ_OK)
        st = bind(ctx, kernel, 0, table, (int)(sizeof table / sizeof table[0]), &scores, values,
                  argv);
    if (st != AJ_OK)
        return st;

    int elem = elem_size(op->dtype);
    aj_sim_buffer buffers[10 + AJ_OP_TENSORS_MAX];
    int nb = 0;
    for (int i = 0; i < scores.nb; i++)
        buffers[nb++] = scores.buffers[i];
    buffers[nb++] = sim_buffer("q", &a->q, elem);
    buffers[nb++] = sim_buffer("k", &a->k, elem);
    buffers[nb++] = sim_buffer("v", &a->v, elem);
    buffers[nb++] = op->accumulate ? sim_buffer("o_acc", &a->o_acc, 4)
                                   : sim_buffer("o", &a->o, elem);
    buffers[nb++] = sim_buffer("lse", &a->lse, 4);
    if (op->score_mod == AJ_SCORE_MOD_ALIBI)
        buffers[nb++] = sim_buffer("alibi_slopes", &a->alibi_slopes, 4);
    if (op->bias == AJ_BIAS_ADD)
        buffers[nb++] = sim_buffer("bias", &a->bias, elem);
    if (varlen) {
        size_t cu_bytes = ((size_t)a->batch + 1) * sizeof(int32_t);
        buffers[nb++] = (aj_sim_buffer){"cu_seqlens_q", a->cu_seqlens_q, cu_bytes};
        buffers[nb++] = (aj_sim_buffer){"cu_seqlens_k", a->cu_seqlens_k, cu_bytes};
        buffers[nb++] = (aj_sim_buffer){"varlen_status", dev->status, sizeof(uint32_t)};
    }
    st = run_kernel(ctx, dev, kernel, 0, &sz, argv, buffers, nb, args->stream);
    return st == AJ_OK && varlen ? aj_device_launched(dev, FWD) : st;
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
    if (op->score_mod == AJ_SCORE_MOD_ALIBI) {
        AJ_TRY(check_tensor(ctx, BWD, "alibi_slopes", &a->alibi_slopes, 1, AJ_DTYPE_F32, 0));
        AJ_TRY(check_dim(ctx, BWD, "alibi_slopes", 0, a->alibi_slopes.shape[0], sz->heads_q,
                         "q's heads"));
    }
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
    AJ_TRY(check_qkv(ctx, BWD, op, &a->q, &a->k, &a->v, &a->alibi_slopes, a->sq_total,
                     a->sk_total, sz));
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

/* Whether some stage of the kernel takes parameter `name`. */
static int kernel_takes(const aj_kernel *kernel, const char *name)
{
    for (int s = 0; s < kernel->num_stages; s++) {
        aj_launch_info li;
        aj_kernel_stage_info(kernel, s, &li);
        for (int i = 0; i < li.num_params; i++)
            if (strcmp(li.params[i].name, name) == 0)
                return 1;
    }
    return 0;
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
typedef struct bwd_workspace {
    int64_t stride_b, stride_h, dq_offset;
    size_t bytes;
} bwd_workspace;

static bwd_workspace workspace_layout(const aj_kernel *kernel, const bwd_call *call)
{
    bwd_workspace w = {0, 0, 0, 0};
    if (!kernel_takes(kernel, "workspace"))
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

aj_status aj_backward_workspace_size(aj_ctx *ctx, const aj_kernel *kernel,
                                     const aj_bwd_args *args, size_t *bytes)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    const char *fn = "aj_backward_workspace_size";
    AJ_CHECK_ARG(ctx, kernel, "%s: kernel is NULL", fn);
    AJ_CHECK_ARG(ctx, args, "%s: args is NULL", fn);
    AJ_CHECK_ARG(ctx, bytes, "%s: bytes is NULL", fn);
    AJ_CHECK_ARG(ctx, args->struct_size == sizeof *args,
                 "%s: args->struct_size = %zu, want %zu; start from AJ_BWD_ARGS_INIT", fn,
                 args->struct_size, sizeof *args);
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
                      const aj_bwd_args *args)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    aj_status st = check_launch(ctx, "aj_backward", dev, kernel, args, sizeof *args,
                                "AJ_BWD_ARGS_INIT", AJ_KIND_BACKWARD);
    if (st != AJ_OK)
        return st;
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
    int64_t shift = op->mask_align == AJ_ALIGN_BOTTOM_RIGHT ? sk_total - sq_total : 0;
    const aj_bwd_args *a = args;
    const aj_tensor ws_t = {ws, AJ_DTYPE_F32, 1, {(int64_t)(w->bytes / 4)}, {1}};
    const aj_tensor cu_q = {(void *)a->cu_seqlens_q, AJ_DTYPE_F32, 1, {a->batch + 1}, {1}};
    const aj_tensor cu_k = {(void *)a->cu_seqlens_k, AJ_DTYPE_F32, 1, {a->batch + 1}, {1}};
    const binding table[] = {
        PTR("workspace", ws_t), I64("stride_ws_b", w->stride_b),
        I64("stride_ws_h", w->stride_h), I64("ws_dq_offset", w->dq_offset),
        PTR("cu_seqlens_q", cu_q), PTR("cu_seqlens_k", cu_k),
        I64("sq_total", a->sq_total), I64("sk_total", a->sk_total),
        PTR("q", a->q), PTR("k", a->k), PTR("v", a->v), PTR("o", a->o), PTR("do", a->do_),
        PTR("lse", a->lse), PTR("dq", a->dq), PTR("dk", a->dk), PTR("dv", a->dv),
        PTR("alibi_slopes", a->alibi_slopes),
        I64("stride_q_b", a->q.strides[0]), I64("stride_q_h", a->q.strides[1]),
        I64("stride_q_s", a->q.strides[2]), I64("stride_k_b", a->k.strides[0]),
        I64("stride_k_h", a->k.strides[1]), I64("stride_k_s", a->k.strides[2]),
        I64("stride_v_b", a->v.strides[0]), I64("stride_v_h", a->v.strides[1]),
        I64("stride_v_s", a->v.strides[2]), I64("stride_o_b", a->o.strides[0]),
        I64("stride_o_h", a->o.strides[1]), I64("stride_o_s", a->o.strides[2]),
        I64("stride_do_b", a->do_.strides[0]), I64("stride_do_h", a->do_.strides[1]),
        I64("stride_do_s", a->do_.strides[2]), I64("stride_dq_b", a->dq.strides[0]),
        I64("stride_dq_h", a->dq.strides[1]), I64("stride_dq_s", a->dq.strides[2]),
        I64("stride_dk_b", a->dk.strides[0]), I64("stride_dk_h", a->dk.strides[1]),
        I64("stride_dk_s", a->dk.strides[2]), I64("stride_dv_b", a->dv.strides[0]),
        I64("stride_dv_h", a->dv.strides[1]), I64("stride_dv_s", a->dv.strides[2]),
        I64("stride_lse_b", a->lse.strides[0]), I64("stride_lse_h", a->lse.strides[1]),
        I32("heads_q", sz.heads_q), I32("heads_kv", sz.heads_kv),
        I32("seq_q", sz.seq_q), I32("seq_k", sz.seq_k),
        I64("q_offset", a->q_offset), I64("kv_offset", a->kv_offset),
        I64("mask_shift", shift),
        PTR("bias", a->bias), I64("stride_bias_b", broadcast_stride(&a->bias, 0)),
        I64("stride_bias_h", broadcast_stride(&a->bias, 1)),
        I64("stride_bias_s", a->bias.strides[2]),
        PTR("dbias", a->dbias), I64("stride_dbias_b", broadcast_stride(&a->dbias, 0)),
        I64("stride_dbias_h", broadcast_stride(&a->dbias, 1)),
        I64("stride_dbias_s", a->dbias.strides[2]),
        I32("batch", sz.batch), I32("bias_batch", a->bias.shape[0]),
        I32("bias_heads", a->bias.shape[1]),
        I64("dropout_seed", (int64_t)a->seed), I64("dropout_offset", (int64_t)a->offset),
        VARLEN_SIZES(dev, a->q.shape[2], a->k.shape[2], a),   /* packed: [B, H, T, D] views */
    };
    static _Thread_local score_bindings scores;
    st = bind_scores(ctx, BWD, op, a->side, a->num_side, &a->alibi_slopes, sq_total, sk_total,
                     &scores);
    if (st != AJ_OK)
        return st;
    int elem = elem_size(op->dtype);
    aj_sim_buffer buffers[15 + AJ_OP_TENSORS_MAX];
    int nb = 0;
    for (int i = 0; i < scores.nb; i++)
        buffers[nb++] = scores.buffers[i];
    if (w->bytes)
        buffers[nb++] = (aj_sim_buffer){"workspace", ws, w->bytes};
    if (op->layout == AJ_LAYOUT_VARLEN) {   /* int32, as wide as f32 */
        buffers[nb++] = sim_buffer("cu_seqlens_q", &cu_q, 4);
        buffers[nb++] = sim_buffer("cu_seqlens_k", &cu_k, 4);
        buffers[nb++] = (aj_sim_buffer){"varlen_status", dev->status, sizeof(uint32_t)};
    }
    buffers[nb++] = sim_buffer("q", &a->q, elem);
    buffers[nb++] = sim_buffer("k", &a->k, elem);
    buffers[nb++] = sim_buffer("v", &a->v, elem);
    buffers[nb++] = sim_buffer("o", &a->o, elem);
    buffers[nb++] = sim_buffer("do", &a->do_, elem);
    buffers[nb++] = sim_buffer("lse", &a->lse, 4);
    buffers[nb++] = sim_buffer("dq", &a->dq, elem);
    buffers[nb++] = sim_buffer("dk", &a->dk, elem);
    buffers[nb++] = sim_buffer("dv", &a->dv, elem);
    if (op->score_mod == AJ_SCORE_MOD_ALIBI)
        buffers[nb++] = sim_buffer("alibi_slopes", &a->alibi_slopes, 4);
    if (op->bias == AJ_BIAS_ADD) {
        buffers[nb++] = sim_buffer("bias", &a->bias, elem);
        buffers[nb++] = sim_buffer("dbias", &a->dbias, 4);
    }
    /* the stages in order; an empty grid (no key or no query) is skipped */
    uint64_t instructions = 0;
    for (int s = 0; s < kernel->num_stages; s++) {
        aj_launch_info li;
        aj_kernel_stage_info(kernel, s, &li);
        int empty = 0;
        for (int d = 0; d < 3; d++)
            empty |= grid_extent(li.grid[d].extent, &sz) == 0;
        if (empty)
            continue;
        aj_arg_value values[AJ_KB_MAX_PARAMS];
        void *argv[AJ_KB_MAX_PARAMS];
        st = bind(ctx, kernel, s, table, (int)(sizeof table / sizeof table[0]), &scores, values,
                  argv);
        if (st == AJ_OK)
            st = run_kernel(ctx, dev, kernel, s, &sz, argv, buffers, nb, a->stream);
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
                   const aj_merge_args *args)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    aj_status st = check_launch(ctx, "aj_merge", dev, kernel, args, sizeof *args,
                                "AJ_MERGE_ARGS_INIT", AJ_KIND_MERGE);
    if (st != AJ_OK)
        return st;
    const aj_op_info *op = &kernel->op;
    fwd_sizes sz;
    st = check_merge(ctx, op, args, &sz);
    if (st != AJ_OK)
        return st;
    if (sz.batch == 0 || sz.heads_q == 0 || sz.seq_q == 0)
        return AJ_OK;   /* no row: nothing to launch */

    const aj_merge_args *a = args;
    const binding table[] = {
        PTR("o1", a->o1), PTR("o2", a->o2), PTR("o", a->o),
        PTR("lse1", a->lse1), PTR("lse2", a->lse2), PTR("lse", a->lse),
        I64("stride_o1_b", a->o1.strides[0]), I64("stride_o1_h", a->o1.strides[1]),
        I64("stride_o1_s", a->o1.strides[2]), I64("stride_o2_b", a->o2.strides[0]),
        I64("stride_o2_h", a->o2.strides[1]), I64("stride_o2_s", a->o2.strides[2]),
        I64("stride_o_b", a->o.strides[0]), I64("stride_o_h", a->o.strides[1]),
        I64("stride_o_s", a->o.strides[2]),
        I64("stride_lse1_b", a->lse1.strides[0]), I64("stride_lse1_h", a->lse1.strides[1]),
        I64("stride_lse2_b", a->lse2.strides[0]), I64("stride_lse2_h", a->lse2.strides[1]),
        I64("stride_lse_b", a->lse.strides[0]), I64("stride_lse_h", a->lse.strides[1]),
        I32("seq_q", sz.seq_q),
    };
    aj_arg_value values[AJ_KB_MAX_PARAMS];
    void *argv[AJ_KB_MAX_PARAMS];
    st = bind(ctx, kernel, 0, table, (int)(sizeof table / sizeof table[0]), NULL, values, argv);
    if (st != AJ_OK)
        return st;
    int elem = elem_size(op->dtype);
    const aj_sim_buffer buffers[6] = {
        sim_buffer("o1", &a->o1, elem), sim_buffer("o2", &a->o2, elem),
        sim_buffer("o", &a->o, elem), sim_buffer("lse1", &a->lse1, 4),
        sim_buffer("lse2", &a->lse2, 4), sim_buffer("lse", &a->lse, 4),
    };
    return run_kernel(ctx, dev, kernel, 0, &sz, argv, buffers, 6, a->stream);
}
