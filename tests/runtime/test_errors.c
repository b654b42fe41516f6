/*
 * test_errors.c -- the catalogue of bad inputs of docs/errors.md that are
 * not covered by the IR, codegen, npy and CLI tests: every launch argument
 * check of aj_forward, aj_backward and aj_merge, devices, conversions,
 * non-finite inputs and empty tensors.  Each call must return its status with a message naming the
 * problem, and the process must survive all of them.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_compile.h"
#include "launch_args.h"
#include "ref.h"

enum { B = 1, HQ = 2, HKV = 1, SQ = 20, SK = 24, D = 16 };

static aj_ctx *ctx;
static aj_device *dev;
static aj_kernel *kernel;        /* f16, head dim 16, causal */
static aj_kernel *alibi_kernel;  /* f16, head dim 16, alibi */
static aj_kernel *feature_kernel;  /* f16, head dim 16, accumulate, bias, dropout */
static aj_kernel *merge_kernel;    /* f16, head dim 16 */
static aj_kernel *bwd_kernel;      /* backward, f16, head dim 16, causal */
static aj_kernel *bwd_bias_kernel; /* backward, f16, head dim 16, causal, bias, dropout */

static _Alignas(16) uint16_t q[B * HQ * SQ * D], k[B * HKV * SK * D], v[B * HKV * SK * D],
    o[B * HQ * SQ * D];
static float lse[B * HQ * SQ], slopes[HQ];
static _Alignas(16) float o_acc[B * HQ * SQ * D];
static _Alignas(16) uint16_t bias[B * HQ * SQ * SK], o2[B * HQ * SQ * D];
static float lse2[B * HQ * SQ];
static _Alignas(16) uint16_t dout[B * HQ * SQ * D], dq[B * HQ * SQ * D], dk[B * HKV * SK * D],
    dv[B * HKV * SK * D];
static _Alignas(16) float dbias[B * HQ * SQ * SK];

static aj_tensor bhsd(void *data, aj_dtype dt, int64_t b, int64_t h, int64_t s, int64_t d)
{
    aj_tensor t = {data, dt, 4, {b, h, s, d}, {h * s * d, s * d, d, 1}};
    return t;
}

static aj_fwd_args good_args(void)
{
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = bhsd(q, AJ_DTYPE_F16, B, HQ, SQ, D);
    a.k = bhsd(k, AJ_DTYPE_F16, B, HKV, SK, D);
    a.v = bhsd(v, AJ_DTYPE_F16, B, HKV, SK, D);
    a.o = bhsd(o, AJ_DTYPE_F16, B, HQ, SQ, D);
    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {B, HQ, SQ, 0}, {HQ * SQ, SQ, 1, 0}};
    a.alibi_slopes = (aj_tensor){slopes, AJ_DTYPE_F32, 1, {HQ, 0, 0, 0}, {1, 0, 0, 0}};
    return a;
}

static aj_kernel *compile(const char *text)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_SIM;
    opt.emit = AJ_EMIT_LLVM_IR;
    return check_compile(ctx, text, "t", &opt);
}

/* The arguments of one of the three launch calls. */
typedef union call_args {
    aj_fwd_args fwd;
    aj_merge_args merge;
    aj_bwd_args bwd;
} call_args;

typedef enum { LAUNCH_FORWARD, LAUNCH_MERGE, LAUNCH_BACKWARD } launch_kind;

/* One mutation of good arguments and the message its refusal must give. */
typedef struct refusal {
    void (*mutate)(call_args *x);
    const char *needle;
} refusal;

static aj_status launch(launch_kind kind, aj_kernel *kr, call_args *x)
{
    switch (kind) {
    case LAUNCH_FORWARD: return aj_forward(ctx, dev, kr, &x->fwd);
    case LAUNCH_MERGE: return aj_merge(ctx, dev, kr, &x->merge);
    default: return aj_backward(ctx, dev, kr, &x->bwd);
    }
}

/* Each case's mutation of `good`, launched with kr: refused with
 * AJ_ERR_INVALID_ARG and a message containing the case's needle. */
static void check_refusals(launch_kind kind, aj_kernel *kr, call_args good,
                           const refusal *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        call_args x = good;
        cases[i].mutate(&x);
        aj_status st = launch(kind, kr, &x);
        CHECK_MSG(st == AJ_ERR_INVALID_ARG, "case %zu (%s): %s", i, cases[i].needle,
                  aj_status_str(st));
        CHECK_ERROR(ctx, cases[i].needle);
    }
}

#define CASE(name, body) static void name(call_args *x) { aj_fwd_args *a = &x->fwd; body; }
CASE(q_rank3, a->q.rank = 3)
CASE(k_dtype, a->k.dtype = AJ_DTYPE_BF16)
CASE(v_dtype_bad, a->v.dtype = (aj_dtype)9)
CASE(q_head_dim, a->q.shape[3] = 8)
CASE(k_batch, a->k.shape[0] = 2)
CASE(v_heads, a->v.shape[1] = 2)
CASE(v_len, a->v.shape[2] = SK - 1)
CASE(o_len, a->o.shape[2] = SQ + 1)
CASE(lse_dtype, a->lse.dtype = AJ_DTYPE_F16)
CASE(lse_heads, a->lse.shape[1] = 3)
CASE(neg_shape, a->k.shape[2] = -1)
CASE(neg_stride, a->q.strides[2] = -D)
CASE(last_stride, a->k.strides[3] = 2)
CASE(misaligned, a->q.data = (char *)q + 2)
CASE(stride_not16, a->v.strides[2] = D + 1)
CASE(null_data, a->o.data = NULL)
CASE(gqa, (a->q.shape[1] = 3, a->o.shape[1] = 3, a->lse.shape[1] = 3,
           a->k.shape[1] = 2, a->v.shape[1] = 2))
CASE(huge_seq, (a->k.shape[2] = (int64_t)1 << 31, a->v.shape[2] = (int64_t)1 << 31))
CASE(huge_batch, (a->q.shape[0] = 70000, a->k.shape[0] = 70000, a->v.shape[0] = 70000,
                  a->o.shape[0] = 70000, a->lse.shape[0] = 70000))
CASE(neg_total, a->sk_total = -5)
CASE(bad_size, a->struct_size = 8)
CASE(varlen_on_padded, a->max_seqlen_q = SQ)
CASE(alibi_len, a->alibi_slopes.shape[0] = 5)
CASE(alibi_rank, a->alibi_slopes.rank = 0)
#undef CASE

static void test_launch_arguments(void)
{
    static const refusal cases[] = {
        {q_rank3, "q.rank = 3, want 4"},
        {k_dtype, "k.dtype = bf16, want f16"},
        {v_dtype_bad, "v.dtype = (invalid)"},
        {q_head_dim, "q.shape[3] = 8, want 16 (the op's head_dim)"},
        {k_batch, "k.shape[0] = 2, want 1"},
        {v_heads, "v.shape[1] = 2, want 1 (k's heads)"},
        {v_len, "v.shape[2] = 23, want 24 (k's length)"},
        {o_len, "o.shape[2] = 21, want 20"},
        {lse_dtype, "lse.dtype = f16, want f32"},
        {lse_heads, "lse.shape[1] = 3, want 2"},
        {neg_shape, "k.shape[2] = -1 is negative"},
        {neg_stride, "q.strides[2] = -16 is negative"},
        {last_stride, "k.strides[3] = 2; the last dimension must be contiguous"},
        {misaligned, "q.data"},
        {stride_not16, "v.strides[2] = 17 is not a multiple of 8 elements"},
        {null_data, "o.data is NULL"},
        {gqa, "query heads must be a multiple of the key/value heads"},
        {huge_seq, "lengths must be below 2^30"},
        {huge_batch, "each must be at most 65535"},
        {neg_total, "sk_total = -5"},
        {bad_size, "struct_size = 8"},
        {varlen_on_padded, "are for layout = varlen kernels; this kernel's layout is padded"},
    };
    check_refusals(LAUNCH_FORWARD, kernel, (call_args){.fwd = good_args()}, cases,
                   sizeof cases / sizeof cases[0]);
    aj_fwd_args a = good_args();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
    CHECK_STATUS(ctx, aj_forward(ctx, NULL, kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "dev is NULL");
    CHECK_STATUS(ctx, aj_forward(ctx, dev, NULL, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "kernel is NULL");
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "args is NULL");
    CHECK(aj_forward(NULL, dev, kernel, &a) == AJ_ERR_INVALID_ARG);

    /* alibi ops need their slopes, of the right shape */
    static const refusal alibi_cases[] = {
        {alibi_len, "alibi_slopes.shape[0] = 5, want 2"},
        {alibi_rank, "alibi_slopes.rank = 0"},
    };
    check_refusals(LAUNCH_FORWARD, alibi_kernel, (call_args){.fwd = good_args()}, alibi_cases,
                   2);
    /* a head shard (aj_fwd_args.head_offset): heads head_offset .. of
     * heads_q_total, with alibi's slopes of every head */
    static float all_slopes[2 * HQ];
    a = good_args();
    a.head_offset = 1;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, alibi_kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_forward: head_offset = 1, heads_q_total = 0 with 2 query heads; the "
                "call's heads must be heads head_offset .. head_offset + 2 - 1 of "
                "heads_q_total (0: the call's, then head_offset = 0), below 2^31");
    a.heads_q_total = 2 * HQ;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, alibi_kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "alibi_slopes.shape[0] = 2, want 4 (heads_q_total)");
    a.alibi_slopes.data = all_slopes;
    a.alibi_slopes.shape[0] = 2 * HQ;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, alibi_kernel, &a), AJ_OK);
    a.head_offset = HQ + 1;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, alibi_kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "head_offset = 3, heads_q_total = 4 with 2 query heads");
    a.head_offset = -1;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, alibi_kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "head_offset = -1, heads_q_total = 4 with 2 query heads");

    /* a PTX kernel cannot run on the sim device */
    aj_op *op = NULL;
    aj_kernel *ptx = NULL;
    const char *text = "attention forward efficient { dtype = f16 head_dim = 16 }";
    aj_op_parse(ctx, text, strlen(text), "t", &op);
    CHECK_STATUS(ctx, aj_compile(ctx, op, NULL, &ptx), AJ_OK);
    a = good_args();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, ptx, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "compiled for sm_80 cannot run on a sim device");
    aj_kernel_destroy(ptx);
    aj_op_destroy(op);
}

/* The arguments of accumulate, bias and dropout kernels: o_acc (f32,
 * replacing o, which is then not read), bias (broadcast dims of size 1). */
static aj_fwd_args feature_args(void)
{
    aj_fwd_args a = good_args();
    a.o = (aj_tensor){0};
    a.o_acc = bhsd(o_acc, AJ_DTYPE_F32, B, HQ, SQ, D);
    a.bias = bhsd(bias, AJ_DTYPE_F16, 1, HQ, SQ, SK);
    a.bias.strides[0] = 0;
    a.seed = ~0ull;
    a.offset = 12345;
    return a;
}

#define CASE(name, body) static void name(call_args *x) { aj_fwd_args *a = &x->fwd; body; }
CASE(acc_dtype, a->o_acc.dtype = AJ_DTYPE_F16)
CASE(acc_len, a->o_acc.shape[2] = SQ - 1)
CASE(acc_null, a->o_acc.data = NULL)
CASE(acc_misaligned, a->o_acc.data = o_acc + 1)
CASE(bias_rank, a->bias.rank = 3)
CASE(bias_dtype, a->bias.dtype = AJ_DTYPE_F32)
CASE(bias_batch, a->bias.shape[0] = 2)
CASE(bias_heads, a->bias.shape[1] = 3)
CASE(bias_len_q, a->bias.shape[2] = SQ + 1)
CASE(bias_len_k, a->bias.shape[3] = SK - 1)
CASE(bias_null, a->bias.data = NULL)
#undef CASE

static void test_feature_arguments(void)
{
    static const refusal cases[] = {
        {acc_dtype, "o_acc.dtype = f16, want f32"},
        {acc_len, "o_acc.shape[2] = 19, want 20 (q's length)"},
        {acc_null, "o_acc.data is NULL"},
        {acc_misaligned, "o_acc.data"},
        {bias_rank, "bias.rank = 3, want 4"},
        {bias_dtype, "bias.dtype = f32, want f16"},
        {bias_batch, "bias.shape[0] = 2, want 1 or q's batch"},
        {bias_heads, "bias.shape[1] = 3, want 1 or q's heads"},
        {bias_len_q, "bias.shape[2] = 21, want 20 (q's length)"},
        {bias_len_k, "bias.shape[3] = 23, want 24 (k's length)"},
        {bias_null, "bias.data is NULL"},
    };
    check_refusals(LAUNCH_FORWARD, feature_kernel, (call_args){.fwd = feature_args()}, cases,
                   sizeof cases / sizeof cases[0]);
    /* a good call: o is not needed; lse = -inf and o_acc = 0 start a pass */
    for (int i = 0; i < B * HQ * SQ; i++)
        lse[i] = -INFINITY;
    memset(o_acc, 0, sizeof o_acc);
    aj_fwd_args a = feature_args();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, feature_kernel, &a), AJ_OK);
    /* the bias's own strides are ignored where it broadcasts */
    a.bias.strides[0] = 1000000;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, feature_kernel, &a), AJ_OK);
    memset(lse, 0, sizeof lse);
}

static aj_merge_args merge_args(void)
{
    aj_merge_args m = AJ_MERGE_ARGS_INIT;
    m.o1 = bhsd(o, AJ_DTYPE_F16, B, HQ, SQ, D);
    m.o2 = bhsd(o2, AJ_DTYPE_F16, B, HQ, SQ, D);
    m.o = m.o1;
    m.lse1 = m.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {B, HQ, SQ, 0}, {HQ * SQ, SQ, 1, 0}};
    m.lse2 = (aj_tensor){lse2, AJ_DTYPE_F32, 3, {B, HQ, SQ, 0}, {HQ * SQ, SQ, 1, 0}};
    return m;
}

#define CASE(name, body) static void name(call_args *x) { aj_merge_args *m = &x->merge; body; }
CASE(merge_o2_len, m->o2.shape[2] = SQ - 2)
CASE(merge_o1_head_dim, m->o1.shape[3] = 8)
CASE(merge_o_dtype, m->o.dtype = AJ_DTYPE_F32)
CASE(merge_lse2_heads, m->lse2.shape[1] = 1)
CASE(merge_lse_dtype, m->lse.dtype = AJ_DTYPE_F16)
CASE(merge_o2_stride, m->o2.strides[2] = D + 1)
CASE(merge_bad_size, m->struct_size = 4)
#undef CASE

static void test_merge_arguments(void)
{
    static const refusal cases[] = {
        {merge_o2_len, "aj_merge: o2.shape[2] = 18, want 20 (o1's length)"},
        {merge_o1_head_dim, "aj_merge: o1.shape[3] = 8, want 16 (the op's head_dim_v)"},
        {merge_o_dtype, "aj_merge: o.dtype = f32, want f16"},
        {merge_lse2_heads, "aj_merge: lse2.shape[1] = 1, want 2 (o1's heads)"},
        {merge_lse_dtype, "aj_merge: lse.dtype = f16, want f32"},
        {merge_o2_stride, "aj_merge: o2.strides[2] = 17 is not a multiple of 8 elements"},
        {merge_bad_size, "struct_size = 4"},
    };
    aj_merge_args m = merge_args();
    CHECK_STATUS(ctx, aj_merge(ctx, dev, merge_kernel, &m), AJ_OK);
    check_refusals(LAUNCH_MERGE, merge_kernel, (call_args){.merge = merge_args()}, cases,
                   sizeof cases / sizeof cases[0]);
    CHECK_STATUS(ctx, aj_merge(ctx, NULL, merge_kernel, &m), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_merge: dev is NULL");
    CHECK_STATUS(ctx, aj_merge(ctx, dev, merge_kernel, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_merge: args is NULL");
    /* kernels of the other kind are refused by both calls */
    CHECK_STATUS(ctx, aj_merge(ctx, dev, kernel, &m), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "computes a forward op");
    aj_fwd_args a = good_args();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, merge_kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "computes a merge op");
    /* S = 0: nothing to do */
    m.o1.shape[2] = m.o2.shape[2] = m.o.shape[2] = 0;
    m.lse1.shape[2] = m.lse2.shape[2] = m.lse.shape[2] = 0;
    CHECK_STATUS(ctx, aj_merge(ctx, dev, merge_kernel, &m), AJ_OK);
    memset(o, 0, sizeof o);
    memset(lse, 0, sizeof lse);
}

static aj_bwd_args bwd_args(void)
{
    aj_fwd_args f = good_args();
    f.alibi_slopes = (aj_tensor){0};   /* the backward kernels have no alibi */
    return bwd_args_after(&f, bhsd(dout, AJ_DTYPE_F16, B, HQ, SQ, D),
                          bhsd(dq, AJ_DTYPE_F16, B, HQ, SQ, D),
                          bhsd(dk, AJ_DTYPE_F16, B, HKV, SK, D),
                          bhsd(dv, AJ_DTYPE_F16, B, HKV, SK, D));
}

#define CASE(name, body) static void name(call_args *x) { aj_bwd_args *a = &x->bwd; body; }
CASE(bwd_dk_len, a->dk.shape[2] = SK - 2)
CASE(bwd_dv_heads, a->dv.shape[1] = HQ)
CASE(bwd_dq_dtype, a->dq.dtype = AJ_DTYPE_BF16)
CASE(bwd_do_len, a->do_.shape[2] = SQ + 1)
CASE(bwd_do_misaligned, a->do_.data = (char *)dout + 2)
CASE(bwd_lse_dtype, a->lse.dtype = AJ_DTYPE_F16)
CASE(bwd_k_head_dim, a->k.shape[3] = 8)
CASE(bwd_dq_null, a->dq.data = NULL)
CASE(bwd_neg_total, a->sq_total = -1)
CASE(bwd_bad_size, a->struct_size = 4)
#undef CASE

static void test_backward_arguments(void)
{
    static const refusal cases[] = {
        {bwd_dk_len, "aj_backward: dk.shape[2] = 22, want 24 (k's length)"},
        {bwd_dv_heads, "aj_backward: dv.shape[1] = 2, want 1 (v's heads)"},
        {bwd_dq_dtype, "aj_backward: dq.dtype = bf16, want f16"},
        {bwd_do_len, "aj_backward: do.shape[2] = 21, want 20 (q's length)"},
        {bwd_do_misaligned, "aj_backward: do.data"},
        {bwd_lse_dtype, "aj_backward: lse.dtype = f16, want f32"},
        {bwd_k_head_dim, "aj_backward: k.shape[3] = 8, want 16 (the op's head_dim)"},
        {bwd_dq_null, "aj_backward: dq.data is NULL"},
        {bwd_neg_total, "aj_backward: sq_total = -1"},
        {bwd_bad_size, "aj_backward: args->struct_size = 4"},
    };
    memset(o, 0, sizeof o);
    memset(lse, 0, sizeof lse);
    aj_bwd_args a = bwd_args();
    CHECK_STATUS(ctx, aj_backward(ctx, dev, bwd_kernel, &a), AJ_OK);
    check_refusals(LAUNCH_BACKWARD, bwd_kernel, (call_args){.bwd = bwd_args()}, cases,
                   sizeof cases / sizeof cases[0]);
    CHECK_STATUS(ctx, aj_backward(ctx, NULL, bwd_kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_backward: dev is NULL");
    CHECK_STATUS(ctx, aj_backward(ctx, dev, NULL, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_backward: kernel is NULL");
    CHECK_STATUS(ctx, aj_backward(ctx, dev, bwd_kernel, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_backward: args is NULL");
    /* kernels of the other kinds are refused, and a backward kernel by them */
    CHECK_STATUS(ctx, aj_backward(ctx, dev, kernel, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_backward: kernel aj_efficient_fwd_");
    CHECK_ERROR(ctx, "computes a forward op");
    aj_fwd_args f = good_args();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, bwd_kernel, &f), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "computes a backward op");
    /* no key: dq is written (zeros), nothing else to do */
    memset(dq, 0xff, sizeof dq);
    a.k.shape[2] = a.v.shape[2] = a.dk.shape[2] = a.dv.shape[2] = 0;
    CHECK_STATUS(ctx, aj_backward(ctx, dev, bwd_kernel, &a), AJ_OK);
    int zeros = 1;
    for (size_t i = 0; i < sizeof dq / sizeof dq[0]; i++)
        zeros &= dq[i] == 0;
    CHECK_MSG(zeros, "dq is not 0 when there are no keys");
}

/* Backward with bias = add (and dropout): bias as the forward's, dbias f32
 * of bias's shape. */
static aj_bwd_args bwd_bias_args(void)
{
    aj_bwd_args a = bwd_args();
    a.bias = bhsd(bias, AJ_DTYPE_F16, 1, HQ, SQ, SK);
    a.dbias = bhsd(dbias, AJ_DTYPE_F32, 1, HQ, SQ, SK);
    a.seed = 3;
    a.offset = 4;
    return a;
}

#define CASE(name, body) static void name(call_args *x) { aj_bwd_args *a = &x->bwd; body; }
CASE(bwd_bias_null, a->bias.data = NULL)
CASE(bwd_bias_heads, a->bias.shape[1] = 3)
CASE(bwd_bias_len_k, a->bias.shape[3] = SK - 1)
CASE(bwd_dbias_missing, a->dbias = (aj_tensor){0})
CASE(bwd_dbias_dtype, a->dbias.dtype = AJ_DTYPE_F16)
CASE(bwd_dbias_shape, a->dbias.shape[1] = 1)
CASE(bwd_dbias_len_q, a->dbias.shape[2] = SQ - 1)
CASE(bwd_dbias_null, a->dbias.data = NULL)
CASE(bwd_dbias_stride, a->dbias.strides[3] = 2)
#undef CASE

static void test_backward_bias_arguments(void)
{
    static const refusal cases[] = {
        {bwd_bias_null, "aj_backward: bias.data is NULL"},
        {bwd_bias_heads, "aj_backward: bias.shape[1] = 3, want 1 or q's heads"},
        {bwd_bias_len_k, "aj_backward: bias.shape[3] = 23, want 24 (k's length)"},
        {bwd_dbias_missing, "aj_backward: dbias.rank = 0, want 4"},
        {bwd_dbias_dtype, "aj_backward: dbias.dtype = f16, want f32"},
        {bwd_dbias_shape, "aj_backward: dbias.shape[1] = 1, want 2 (bias's size)"},
        {bwd_dbias_len_q, "aj_backward: dbias.shape[2] = 19, want 20 (bias's size)"},
        {bwd_dbias_null, "aj_backward: dbias.data is NULL"},
        {bwd_dbias_stride, "aj_backward: dbias.strides[3] = 2"},
    };
    memset(o, 0, sizeof o);
    memset(lse, 0, sizeof lse);
    memset(bias, 0, sizeof bias);
    check_refusals(LAUNCH_BACKWARD, bwd_bias_kernel, (call_args){.bwd = bwd_bias_args()}, cases,
                   sizeof cases / sizeof cases[0]);
    /* a good call writes every dbias element (finite: zero inputs) */
    memset(dbias, 0xff, sizeof dbias);
    aj_bwd_args a = bwd_bias_args();
    CHECK_STATUS(ctx, aj_backward(ctx, dev, bwd_bias_kernel, &a), AJ_OK);
    int finite = 1;
    for (int i = 0; i < HQ * SQ * SK; i++)
        finite &= isfinite(dbias[i]);
    CHECK_MSG(finite, "dbias is not fully written");
    /* a kernel without bias ignores bias and dbias */
    CHECK_STATUS(ctx, aj_backward(ctx, dev, bwd_kernel, &a), AJ_OK);
}

static void test_empty_tensors(void)
{
    aj_fwd_args a = good_args();
    /* B = 0 and Sq = 0: nothing to compute, success, no write */
    memset(o, 0x55, sizeof o);
    a.q.shape[0] = a.k.shape[0] = a.v.shape[0] = a.o.shape[0] = a.lse.shape[0] = 0;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
    a = good_args();
    a.q.shape[2] = a.o.shape[2] = a.lse.shape[2] = 0;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
    CHECK(o[0] == 0x5555);
    /* Sk = 0: every row sees no key, O = 0 and LSE = -inf */
    a = good_args();
    a.k.shape[2] = a.v.shape[2] = 0;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
    int all_empty = 1;
    for (int i = 0; i < B * HQ * SQ; i++)
        all_empty &= isinf(lse[i]) && lse[i] < 0;
    for (int i = 0; i < B * HQ * SQ * D; i++)
        all_empty &= o[i] == 0;
    CHECK(all_empty);
}

/* NaN and Inf inputs reach the outputs of the rows they touch, as in the
 * reference, and the launch succeeds. */
static void test_non_finite_inputs(void)
{
    float one = 1.0f, nan_f = NAN, inf_f = INFINITY;
    uint16_t h_one, h_nan, h_inf;
    aj_convert(&one, AJ_DTYPE_F32, &h_one, AJ_DTYPE_F16, 1);
    aj_convert(&nan_f, AJ_DTYPE_F32, &h_nan, AJ_DTYPE_F16, 1);
    aj_convert(&inf_f, AJ_DTYPE_F32, &h_inf, AJ_DTYPE_F16, 1);
    for (size_t i = 0; i < sizeof q / 2; i++)
        q[i] = h_one;
    for (size_t i = 0; i < sizeof k / 2; i++)
        k[i] = v[i] = h_one;
    /* head 0, row 3: every score of the row is NaN.  Key 0, column 2: every
     * row sees key 0, so column 2 is Inf throughout.  (An Inf in V at a key
     * a row cannot see but its tile holds gives 0 * Inf = NaN in the
     * kernel, as in FlashAttention: docs/errors.md.) */
    q[(0 * SQ + 3) * D + 5] = h_nan;
    v[0 * D + 2] = h_inf;
    aj_fwd_args a = good_args();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kernel, &a), AJ_OK);
    /* the reference on the same values */
    static double qd[B * HQ * SQ * D], kd[B * HKV * SK * D], vd[B * HKV * SK * D];
    static double od[B * HQ * SQ * D], ld[B * HQ * SQ];
    for (size_t i = 0; i < sizeof q / 2; i++) {
        float f;
        aj_convert(&q[i], AJ_DTYPE_F16, &f, AJ_DTYPE_F32, 1);
        qd[i] = f;
    }
    for (size_t i = 0; i < sizeof k / 2; i++) {
        float f;
        aj_convert(&k[i], AJ_DTYPE_F16, &f, AJ_DTYPE_F32, 1);
        kd[i] = f;
        aj_convert(&v[i], AJ_DTYPE_F16, &f, AJ_DTYPE_F32, 1);
        vd[i] = f;
    }
    ref_problem p = ref_problem_of(B, HQ, HKV, SQ, SK, D, D);
    p.mask = AJ_MASK_CAUSAL;
    ref_forward(&p, qd, kd, vd, od, ld);
    int same_pattern = 1, nan_rows = 0;
    for (int i = 0; i < B * HQ * SQ * D; i++) {
        float f;
        aj_convert(&o[i], AJ_DTYPE_F16, &f, AJ_DTYPE_F32, 1);
        int got_finite = isfinite(f), want_finite = isfinite(od[i]);
        same_pattern &= got_finite == want_finite && isnan(f) == isnan(od[i]);
        nan_rows += isnan(f) && i % D == 0;
    }
    CHECK_MSG(same_pattern, "non-finite outputs differ from the reference's");
    CHECK(nan_rows == 1);
    CHECK(isnan(lse[3]) && isnan(ld[3]));            /* the NaN row */
    CHECK(isfinite(lse[4]) && fabs(lse[4] - ld[4]) < 1e-3);
    memset(q, 0, sizeof q);
    memset(k, 0, sizeof k);
    memset(v, 0, sizeof v);
}

static void test_devices_and_helpers(void)
{
    aj_device *d = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, (aj_device_kind)7, 0, &d), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "kind = 7");
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_SIM, 1, &d), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "index 0 only");
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_SIM, -1, &d), AJ_ERR_INVALID_ARG);
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_SIM, 0, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "out is NULL");
    aj_status st = aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &d);
    CHECK_MSG(st == AJ_ERR_NO_DEVICE || st == AJ_ERR_UNSUPPORTED, "cuda: %s",
              aj_status_str(st));
    CHECK(strstr(aj_last_error(ctx), "no GPU found") || strstr(aj_last_error(ctx), "sim device"));
    CHECK(d == NULL);
    CHECK_STATUS(ctx, aj_device_set_workers(dev, -2), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "workers = -2");
    float f = 1;
    uint16_t h;
    CHECK(aj_convert(&f, (aj_dtype)5, &h, AJ_DTYPE_F16, 1) == AJ_ERR_INVALID_ARG);
    CHECK(aj_convert(NULL, AJ_DTYPE_F32, &h, AJ_DTYPE_F16, 1) == AJ_ERR_INVALID_ARG);
    CHECK(aj_convert(NULL, AJ_DTYPE_F32, NULL, AJ_DTYPE_F16, 0) == AJ_OK);
}

/* Side tensors of an expression op: each declared one given, no other,
 * of the declared dtype and rank, with every dim at least 1; a block mask
 * is for padded forward ops. */
static void test_side_tensor_arguments(void)
{
    const char *spec = "attention forward efficient { dtype = f16 head_dim = 16 "
                       "tensors = (doc: i32[2]) mask = expr(doc[b, q] == doc[b, k]) }";
    aj_kernel *kr = compile(spec);
    aj_op *op = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), "t", &op), AJ_OK);
    static int32_t doc[B * SK];
    const aj_side_tensor good = {"doc", doc, AJ_SIDE_I32, 2, {B, SK}, {SK, 1}};
    aj_side_tensor side[2] = {good, good};
    aj_fwd_args a = good_args();
    a.side = side;
    a.num_side = 1;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, kr, &a), AJ_OK);
    static const struct { int field; int64_t value; const char *want; } cases[] = {
        {0, 0, "aj_forward: side tensor 'doc' (i32[2]) is not given"},
        {1, 0, "aj_forward: side[0] ('dok') is not a tensor the op declares"},
        {2, 0, "aj_forward: side tensor 'doc' is f32[2]; the op declares i32[2]"},
        {3, 1, "aj_forward: side tensor 'doc' is i32[1]; the op declares i32[2]"},
        {4, 0, "aj_forward: side tensor 'doc' has shape[1] = 0; every dim must be at least 1"},
        {5, 0, "aj_forward: side tensor 'doc' has no data"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        side[0] = good;
        a.num_side = 1;
        switch (cases[i].field) {
        case 0: a.num_side = 0; break;
        case 1: side[0].name = "dok"; break;
        case 2: side[0].dtype = AJ_SIDE_F32; break;
        case 3: side[0].rank = 1; break;
        case 4: side[0].shape[1] = 0; break;
        default: side[0].data = NULL; break;
        }
        CHECK_STATUS(ctx, aj_forward(ctx, dev, kr, &a), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, cases[i].want);
    }
    side[0] = good;
    a.num_side = 1;
    aj_block_mask *m = NULL;
    aj_tile_counts counts;
    CHECK_STATUS(ctx, aj_block_mask_create(ctx, dev, op, kr, &a, &m), AJ_OK);
    CHECK(aj_block_mask_counts(m, &counts) == AJ_OK &&
          counts.tiles[AJ_TILE_SKIP] + counts.tiles[AJ_TILE_PARTIAL] +
                  counts.tiles[AJ_TILE_FULL] > 0);
    aj_tile_class cls;
    CHECK(aj_block_mask_class(m, 0, 0, 0, 0, &cls) == AJ_OK && cls == AJ_TILE_FULL);
    CHECK(aj_block_mask_class(m, 0, 0, 0, 99, &cls) == AJ_ERR_INVALID_ARG);
    int64_t count = -1;
    CHECK(aj_block_mask_list(m, 0, 0, 1, 0, NULL, NULL, 0, &count) == AJ_OK && count > 0);
    CHECK(aj_block_mask_list(m, 0, 0, 0, 99, NULL, NULL, 0, &count) == AJ_ERR_INVALID_ARG);
    CHECK(aj_block_mask_list(m, 0, 0, 1, 0, NULL, NULL, -1, &count) == AJ_ERR_INVALID_ARG);
    aj_block_mask_destroy(m);
    aj_op *merge = NULL;
    const char *mspec = "attention merge { dtype = f16 head_dim_v = 16 }";
    CHECK_STATUS(ctx, aj_op_parse(ctx, mspec, strlen(mspec), "t", &merge), AJ_OK);
    CHECK_STATUS(ctx, aj_block_mask_create(ctx, dev, merge, merge_kernel, &a, &m),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "block masks are for padded forward ops");
    aj_op_destroy(merge);
    aj_op_destroy(op);
    aj_kernel_destroy(kr);
}

/* Templates that do not compile expressions yet refuse them with
 * AJ_ERR_UNSUPPORTED naming the field and the template, never with a
 * wrong kernel. */
/* Every GPU template reads its mask and score_mod through score.h, so an
 * expression op compiles for every GPU target (no template refuses one). */
static void test_expression_ops_compile(void)
{
    static const char *const specs[] = {
        "attention forward flash { dtype = f16 head_dim = 16 mask = expr(k <= q) }",
        "attention backward flash { dtype = f16 head_dim = 16 score_mod = expr(score * 2.0) }",
        "attention forward efficient { dtype = f16 head_dim = 16 "
        "score_mod = expr(score - abs(q - k)) }",
        "attention backward efficient { dtype = f16 head_dim = 16 mask = expr(k >= q - 4) }",
    };
    const aj_target targets[] = {AJ_TARGET_SM_80, AJ_TARGET_SM_90, AJ_TARGET_SM_90A,
                                 AJ_TARGET_SIM};
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++) {
            aj_op *op = NULL;
            aj_kernel *kr = NULL;
            CHECK_STATUS(ctx, aj_op_parse(ctx, specs[i], strlen(specs[i]), "t", &op), AJ_OK);
            aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
            opt.target = targets[t];
            CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &kr), AJ_OK);
            CHECK_MSG(kr != NULL, "%s on %s: no kernel", specs[i], aj_target_name(targets[t]));
            aj_kernel_destroy(kr);
            aj_op_destroy(op);
        }
    }
}

int main(void)
{
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_SIM, 0, &dev), AJ_OK);
    kernel = compile("attention forward efficient { dtype = f16 head_dim = 16 "
                     "mask = causal(top_left) }");
    alibi_kernel = compile("attention forward efficient { dtype = f16 head_dim = 16 "
                           "score_mod = alibi }");
    feature_kernel = compile("attention forward efficient { dtype = f16 head_dim = 16 "
                             "mask = causal(top_left) accumulate = true bias = add "
                             "dropout = 0.25 }");
    merge_kernel = compile("attention merge { dtype = f16 head_dim_v = 16 }");
    bwd_kernel = compile("attention backward efficient { dtype = f16 head_dim = 16 "
                         "mask = causal(top_left) }");
    bwd_bias_kernel = compile("attention backward efficient { dtype = f16 head_dim = 16 "
                              "mask = causal(top_left) bias = add dropout = 0.25 }");
    if (dev && kernel && alibi_kernel && feature_kernel && merge_kernel && bwd_kernel &&
        bwd_bias_kernel) {
        test_launch_arguments();
        test_feature_arguments();
        test_merge_arguments();
        test_backward_arguments();
        test_backward_bias_arguments();
        test_empty_tensors();
        test_non_finite_inputs();
        test_devices_and_helpers();
        test_side_tensor_arguments();
    }
    test_expression_ops_compile();
    aj_kernel_destroy(kernel);
    aj_kernel_destroy(alibi_kernel);
    aj_kernel_destroy(feature_kernel);
    aj_kernel_destroy(merge_kernel);
    aj_kernel_destroy(bwd_kernel);
    aj_kernel_destroy(bwd_bias_kernel);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return check_report();
}
