/*
 * launch.c -- aj_forward and aj_merge: check every argument against the
 * kernel's op, bind them to the kernel's parameter ABI by name, and run the
 * grid.
 *
 * Binding by name (the kernel's aj_launch_info lists "q", "stride_q_b",
 * "seq_k", ...) keeps this file ignorant of any one template: a template
 * may take any subset of the values below, in any order.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/runtime.h"
#include "runtime/sim/emulator.h"

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

static aj_status check_forward(aj_ctx *ctx, const aj_op_info *op, const aj_fwd_args *a,
                               fwd_sizes *sz)
{
    aj_status st = AJ_OK;
    AJ_TRY(check_tensor(ctx, FWD, "q", &a->q, 4, op->dtype, 1));
    AJ_TRY(check_tensor(ctx, FWD, "k", &a->k, 4, op->dtype, 1));
    AJ_TRY(check_tensor(ctx, FWD, "v", &a->v, 4, op->dtype, 1));
    /* the output: o, or the f32 accumulator o_acc of accumulate kernels */
    const char *out = op->accumulate ? "o_acc" : "o";
    const aj_tensor *o = op->accumulate ? &a->o_acc : &a->o;
    AJ_TRY(check_tensor(ctx, FWD, out, o, 4, op->accumulate ? AJ_DTYPE_F32 : op->dtype, 1));
    AJ_TRY(check_tensor(ctx, FWD, "lse", &a->lse, 3, AJ_DTYPE_F32, 0));
    sz->batch = a->q.shape[0];
    sz->heads_q = a->q.shape[1];
    sz->seq_q = a->q.shape[2];
    sz->heads_kv = a->k.shape[1];
    sz->seq_k = a->k.shape[2];
    AJ_TRY(check_dim(ctx, FWD, "q", 3, a->q.shape[3], op->head_dim, "the op's head_dim"));
    AJ_TRY(check_dim(ctx, FWD, "k", 0, a->k.shape[0], sz->batch, "q's batch"));
    AJ_TRY(check_dim(ctx, FWD, "k", 3, a->k.shape[3], op->head_dim, "the op's head_dim"));
    AJ_TRY(check_dim(ctx, FWD, "v", 0, a->v.shape[0], sz->batch, "q's batch"));
    AJ_TRY(check_dim(ctx, FWD, "v", 1, a->v.shape[1], sz->heads_kv, "k's heads"));
    AJ_TRY(check_dim(ctx, FWD, "v", 2, a->v.shape[2], sz->seq_k, "k's length"));
    AJ_TRY(check_dim(ctx, FWD, "v", 3, a->v.shape[3], op->head_dim_v, "the op's head_dim_v"));
    AJ_TRY(check_dim(ctx, FWD, out, 0, o->shape[0], sz->batch, "q's batch"));
    AJ_TRY(check_dim(ctx, FWD, out, 1, o->shape[1], sz->heads_q, "q's heads"));
    AJ_TRY(check_dim(ctx, FWD, out, 2, o->shape[2], sz->seq_q, "q's length"));
    AJ_TRY(check_dim(ctx, FWD, out, 3, o->shape[3], op->head_dim_v, "the op's head_dim_v"));
    AJ_TRY(check_dim(ctx, FWD, "lse", 0, a->lse.shape[0], sz->batch, "q's batch"));
    AJ_TRY(check_dim(ctx, FWD, "lse", 1, a->lse.shape[1], sz->heads_q, "q's heads"));
    AJ_TRY(check_dim(ctx, FWD, "lse", 2, a->lse.shape[2], sz->seq_q, "q's length"));
    if (sz->heads_kv == 0 ? sz->heads_q != 0 : sz->heads_q % sz->heads_kv != 0) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "aj_forward: q has %lld heads and k %lld; the "
                     "query heads must be a multiple of the key/value heads (GQA)",
                     (long long)sz->heads_q, (long long)sz->heads_kv);
        goto done;
    }
    if (sz->seq_q >= MAX_SEQ || sz->seq_k >= MAX_SEQ) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "aj_forward: Sq = %lld, Sk = %lld; lengths must "
                     "be below 2^30", (long long)sz->seq_q, (long long)sz->seq_k);
        goto done;
    }
    if (sz->batch > MAX_GRID_YZ || sz->heads_q > MAX_GRID_YZ) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "aj_forward: batch = %lld, heads = %lld; each "
                     "must be at most %d", (long long)sz->batch, (long long)sz->heads_q,
                     MAX_GRID_YZ);
        goto done;
    }
    if (op->score_mod == AJ_SCORE_MOD_ALIBI) {
        AJ_TRY(check_tensor(ctx, FWD, "alibi_slopes", &a->alibi_slopes, 1, AJ_DTYPE_F32, 0));
        AJ_TRY(check_dim(ctx, FWD, "alibi_slopes", 0, a->alibi_slopes.shape[0], sz->heads_q,
                         "q's heads"));
    }
    if (op->bias == AJ_BIAS_ADD) {
        AJ_TRY(check_tensor(ctx, FWD, "bias", &a->bias, 4, op->dtype, 0));
        const int64_t full[2] = {sz->batch, sz->heads_q};
        const char *what[2] = {"1 or q's batch", "1 or q's heads"};
        for (int i = 0; i < 2; i++)
            if (a->bias.shape[i] != 1 && a->bias.shape[i] != full[i]) {
                st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "aj_forward: bias.shape[%d] = %lld, "
                             "want %s", i, (long long)a->bias.shape[i], what[i]);
                goto done;
            }
        AJ_TRY(check_dim(ctx, FWD, "bias", 2, a->bias.shape[2], sz->seq_q, "q's length"));
        AJ_TRY(check_dim(ctx, FWD, "bias", 3, a->bias.shape[3], sz->seq_k, "k's length"));
    }
    if (a->sq_total < 0 || a->sk_total < 0) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "aj_forward: sq_total = %lld, sk_total = %lld; "
                     "totals are lengths (0: this call's)", (long long)a->sq_total,
                     (long long)a->sk_total);
        goto done;
    }
done:
    return st;
}

/* ---------------------------------------------------------------- binding */

typedef struct binding {
    const char *name;
    aj_param_type type;
    aj_arg_value value;
} binding;

static aj_status bind(aj_ctx *ctx, const aj_kernel *kernel, const binding *table, int n,
                      aj_arg_value *values, void **args)
{
    aj_launch_info li;
    aj_kernel_launch_info(kernel, &li);
    for (int i = 0; i < li.num_params; i++) {
        const binding *b = NULL;
        for (int j = 0; j < n && !b; j++)
            if (strcmp(table[j].name, li.params[i].name) == 0)
                b = &table[j];
        if (!b || b->type != li.params[i].type)
            return aj_fail(ctx, AJ_ERR_INTERNAL, "kernel %s: no launch value for parameter "
                           "'%s'", aj_kernel_entry(kernel), li.params[i].name);
        values[i] = b->value;
        args[i] = &values[i];
    }
    return AJ_OK;
}

#define PTR(n, t) {n, AJ_PARAM_PTR, {.ptr = (t).data}}
#define I64(n, v) {n, AJ_PARAM_I64, {.i64 = (v)}}
#define I32(n, v) {n, AJ_PARAM_I32, {.i32 = (int32_t)(v)}}

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

/* Runs the bound kernel over the grid its launch info asks for: on the
 * GPU, or on sim with `buffers` as the memory its accesses may touch. */
static aj_status run_kernel(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                            const fwd_sizes *sz, void **argv, const aj_sim_buffer *buffers,
                            int num_buffers, void *stream)
{
    aj_launch_info li;
    aj_kernel_launch_info(kernel, &li);
    int32_t grid[3];
    for (int d = 0; d < 3; d++) {
        int64_t e = grid_extent(li.grid[d].extent, sz);
        grid[d] = (int32_t)((e + li.grid[d].per_block - 1) / li.grid[d].per_block);
    }
    if (dev->cuda)
        return aj_cuda_launch(ctx, dev->cuda, kernel, grid, argv, stream);
    aj_sim_launch launch = {
        .kernel_name = aj_kernel_entry(kernel),
        .entry = kernel->host_entry,
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

aj_status aj_forward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                     const aj_fwd_args *args)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, dev, "aj_forward: dev is NULL");
    AJ_CHECK_ARG(ctx, kernel, "aj_forward: kernel is NULL");
    AJ_CHECK_ARG(ctx, args, "aj_forward: args is NULL");
    AJ_CHECK_ARG(ctx, args->struct_size == sizeof *args,
                 "aj_forward: args->struct_size = %zu, want %zu; start from AJ_FWD_ARGS_INIT",
                 args->struct_size, sizeof *args);
    const aj_op_info *op = &kernel->op;
    AJ_CHECK_ARG(ctx, op->kind == AJ_KIND_FORWARD,
                 "aj_forward: kernel %s computes a %s op", aj_kernel_entry(kernel),
                 aj_kind_name(op->kind));
    AJ_CHECK_ARG(ctx, kernel->target == aj_device_target(dev),
                 "aj_forward: kernel compiled for %s cannot run on a %s device",
                 aj_target_name(kernel->target), aj_target_name(aj_device_target(dev)));
    fwd_sizes sz;
    aj_status st = check_forward(ctx, op, args, &sz);
    if (st != AJ_OK)
        return st;
    if (sz.batch == 0 || sz.heads_q == 0 || sz.seq_q == 0)
        return AJ_OK;   /* no output row: nothing to launch */

    int64_t sq_total = args->sq_total ? args->sq_total : sz.seq_q;
    int64_t sk_total = args->sk_total ? args->sk_total : sz.seq_k;
    int64_t shift = op->mask_align == AJ_ALIGN_BOTTOM_RIGHT ? sk_total - sq_total : 0;
    const aj_fwd_args *a = args;
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
    };
    aj_arg_value values[AJ_KB_MAX_PARAMS];
    void *argv[AJ_KB_MAX_PARAMS];
    st = bind(ctx, kernel, table, (int)(sizeof table / sizeof table[0]), values, argv);
    if (st != AJ_OK)
        return st;

    int elem = elem_size(op->dtype);
    aj_sim_buffer buffers[8];
    int nb = 0;
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
    return run_kernel(ctx, dev, kernel, &sz, argv, buffers, nb, args->stream);
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
    AJ_CHECK_ARG(ctx, dev, "aj_merge: dev is NULL");
    AJ_CHECK_ARG(ctx, kernel, "aj_merge: kernel is NULL");
    AJ_CHECK_ARG(ctx, args, "aj_merge: args is NULL");
    AJ_CHECK_ARG(ctx, args->struct_size == sizeof *args,
                 "aj_merge: args->struct_size = %zu, want %zu; start from AJ_MERGE_ARGS_INIT",
                 args->struct_size, sizeof *args);
    const aj_op_info *op = &kernel->op;
    AJ_CHECK_ARG(ctx, op->kind == AJ_KIND_MERGE,
                 "aj_merge: kernel %s computes a %s op", aj_kernel_entry(kernel),
                 aj_kind_name(op->kind));
    AJ_CHECK_ARG(ctx, kernel->target == aj_device_target(dev),
                 "aj_merge: kernel compiled for %s cannot run on a %s device",
                 aj_target_name(kernel->target), aj_target_name(aj_device_target(dev)));
    fwd_sizes sz;
    aj_status st = check_merge(ctx, op, args, &sz);
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
    st = bind(ctx, kernel, table, (int)(sizeof table / sizeof table[0]), values, argv);
    if (st != AJ_OK)
        return st;
    int elem = elem_size(op->dtype);
    const aj_sim_buffer buffers[6] = {
        sim_buffer("o1", &a->o1, elem), sim_buffer("o2", &a->o2, elem),
        sim_buffer("o", &a->o, elem), sim_buffer("lse1", &a->lse1, 4),
        sim_buffer("lse2", &a->lse2, 4), sim_buffer("lse", &a->lse, 4),
    };
    return run_kernel(ctx, dev, kernel, &sz, argv, buffers, 6, a->stream);
}
