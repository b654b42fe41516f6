/*
 * block_mask.c -- the tile classes of a launch (attnjit.h, aj_block_mask):
 * templates/score.h's interval classification of each tile, made exact
 * where it says partial by testing the tile's elements (the mask's own
 * programs, ir/expr.h's interpreter), kept on the host for queries and on
 * the device for the kernels, which read the classes of their tiles from
 * it (score.h, aj_score_tile_class) where the op takes one
 * (aj_score_prog.block_mask).
 *
 * Layout: classes[((pb * planes_h + ph) * rows + m) * cols + n] (i32
 * aj_tile_class), a plane per batch index (head) only where the mask reads
 * b (h); the kernels see it as a [planes_b, planes_h, rows, cols] tensor
 * whose size-1 dims broadcast.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "templates/score.h"

aj_status aj_side_to_host(aj_ctx *ctx, aj_device *dev, const char *fn,
                          const aj_score_prog *p, const aj_side_tensor *side, int32_t num_side,
                          const aj_tensor *slopes, aj_side_tensor *out, void **mem)
{
    for (int t = 0; t < p->tensor_count; t++) {
        const aj_tensor_decl *d = &p->tensors[t];
        const aj_side_tensor *given = NULL;
        aj_side_tensor as_side = {0};
        if (strcmp(d->name, "alibi_slopes") == 0) {
            as_side = (aj_side_tensor){"alibi_slopes", slopes->data, AJ_SIDE_F32, 1,
                                       {slopes->shape[0]}, {slopes->strides[0]}};
            given = &as_side;
        }
        for (int i = 0; side && i < num_side && !given; i++)
            if (side[i].name && strcmp(side[i].name, d->name) == 0)
                given = &side[i];
        if (!given || !given->data)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: side tensor '%s' is not given", fn,
                           d->name);
        if (given->rank != d->rank || given->dtype != d->dtype)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: side tensor '%s' is %s[%d]; the op "
                           "declares %s[%d]", fn, d->name,
                           given->dtype == AJ_SIDE_I32 ? "i32" : "f32", given->rank,
                           d->dtype == AJ_SIDE_I32 ? "i32" : "f32", d->rank);
        int64_t last = 0;
        for (int k = 0; k < given->rank; k++) {
            if (given->shape[k] < 1 || given->strides[k] < 0)
                return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: side tensor '%s' has shape[%d] "
                               "= %lld, stride %lld; want a size of at least 1 and a stride "
                               "of at least 0", fn, d->name, k, (long long)given->shape[k],
                               (long long)given->strides[k]);
            last += (given->shape[k] - 1) * given->strides[k];
        }
        size_t bytes = (size_t)(last + 1) * 4;
        mem[t] = malloc(bytes);
        if (!mem[t])
            return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        aj_status st = aj_device_copy_from(dev, mem[t], given->data, bytes);
        if (st != AJ_OK)
            return st;
        out[t] = *given;
        out[t].data = mem[t];
    }
    return AJ_OK;
}

struct aj_block_mask {
    aj_block_mask_shape shape;          /* what it was built for */
    uint64_t mask_hash;                 /* aj_score_mask_hash of its op */
    int64_t rows, cols;
    int per_batch, per_head;            /* 0: one plane serves every b (h) */
    aj_tile_counts counts;
    int32_t *classes;                   /* host copy */
    aj_device *dev;                     /* where `device_classes` lives */
    void *device_classes;
};

/* Whether any (all) of the tile's elements inside the lengths are visible,
 * position by position: the exact class of a tile interval arithmetic left
 * partial. */
static aj_tile_class tile_by_elements(const aj_score_prog *p, aj_expr_env *env, int64_t q0,
                                      int64_t q1, int64_t k0, int64_t k1)
{
    bool any = false, all = true;
    for (int64_t q = q0; q <= q1 && (all || !any); q++)
        for (int64_t k = k0; k <= k1 && (all || !any); k++) {
            env->q = q;
            env->k = k;
            bool vis = (p->band_lo == AJ_EXPR_NONE ||
                        k >= q + aj_expr_eval(&p->e, p->band_lo, env).i) &&
                       (p->band_hi == AJ_EXPR_NONE ||
                        k <= q + aj_expr_eval(&p->e, p->band_hi, env).i) &&
                       (p->rest == AJ_EXPR_NONE || aj_expr_eval_bool(&p->e, p->rest, env));
            any = any || vis;
            all = all && vis;
        }
    return !any ? AJ_TILE_SKIP : all ? AJ_TILE_FULL : AJ_TILE_PARTIAL;
}

/* Classes every tile of `m` (sized), reading the side tensors in `tensors`
 * (host copies, in the program's order). */
static aj_status classify(aj_ctx *ctx, const aj_score_prog *p, const aj_side_tensor *tensors,
                          aj_block_mask *m)
{
    const aj_block_mask_shape *sh = &m->shape;
    aj_score_cache *cache = calloc(1, sizeof *cache);
    if (!cache)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_block_mask_create: out of memory");
    int64_t planes_b = m->per_batch ? sh->batch : 1, planes_h = m->per_head ? sh->heads : 1;
    int64_t bm = sh->block_m, bn = sh->block_n;
    aj_expr_env env = {.sq = sh->sq_total, .sk = sh->sk_total, .tensors = tensors,
                       .tensor_count = p->tensor_count};
    for (int64_t b = 0; b < planes_b; b++)
        for (int64_t h = 0; h < planes_h; h++)
            for (int64_t r = 0; r < m->rows; r++)
                for (int64_t c = 0; c < m->cols; c++) {
                    int64_t q0 = sh->q_offset + r * bm, k0 = sh->kv_offset + c * bn;
                    int64_t q1 = sh->q_offset + (r + 1 < m->rows ? (r + 1) * bm : sh->seq_q) - 1;
                    int64_t k1 = sh->kv_offset + (c + 1 < m->cols ? (c + 1) * bn : sh->seq_k) - 1;
                    aj_tile_class cls =
                        aj_score_has_mask(p)
                            ? aj_score_host_class(p, tensors, cache, m->per_batch ? b : -1,
                                                  m->per_head ? h : -1, q0, q1, k0, k1,
                                                  sh->sq_total, sh->sk_total)
                            : AJ_TILE_FULL;
                    if (cls == AJ_TILE_PARTIAL && p->block_mask) {
                        env.b = b;
                        env.h = h;
                        cls = tile_by_elements(p, &env, q0, q1, k0, k1);
                    }
                    m->classes[((b * planes_h + h) * m->rows + r) * m->cols + c] = cls;
                    m->counts.tiles[cls] += (m->per_batch ? 1 : sh->batch) *
                                            (m->per_head ? 1 : sh->heads);
                }
    free(cache);
    return AJ_OK;
}

aj_status aj_block_mask_build(aj_ctx *ctx, aj_device *dev, const char *fn,
                              const aj_score_prog *p, const aj_block_mask_shape *shape,
                              const aj_side_tensor *side, int32_t num_side,
                              const aj_tensor *slopes, aj_block_mask **out)
{
    *out = NULL;
    aj_block_mask *m = calloc(1, sizeof *m);
    if (!m)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    m->shape = *shape;
    m->mask_hash = aj_score_mask_hash(p);
    m->rows = (shape->seq_q + shape->block_m - 1) / shape->block_m;
    m->cols = (shape->seq_k + shape->block_n - 1) / shape->block_n;
    m->counts.block_m = shape->block_m;
    m->counts.block_n = shape->block_n;
    /* a plane per batch index (head) only where the mask can tell them
     * apart (a side tensor is read at b's and h's of the mask's own) */
    m->per_batch = p->mask_reads_b;
    m->per_head = p->mask_reads_h;
    int64_t planes = (m->per_batch ? shape->batch : 1) * (m->per_head ? shape->heads : 1);
    size_t bytes = (size_t)(planes * m->rows * m->cols) * sizeof m->classes[0];
    m->classes = malloc(bytes ? bytes : 1);
    aj_side_tensor tensors[AJ_OP_TENSORS_MAX + 1];
    void *mem[AJ_OP_TENSORS_MAX + 1] = {0};
    aj_status st = m->classes ? aj_side_to_host(ctx, dev, fn, p, side, num_side, slopes,
                                                tensors, mem)
                              : aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (st == AJ_OK)
        st = classify(ctx, p, tensors, m);
    for (int t = 0; t < AJ_OP_TENSORS_MAX + 1; t++)
        free(mem[t]);
    if (st == AJ_OK && bytes) {
        m->dev = dev;
        st = aj_device_alloc(dev, bytes, &m->device_classes);
        if (st == AJ_OK)
            st = aj_device_copy_to(dev, m->device_classes, m->classes, bytes);
    }
    if (st != AJ_OK) {
        aj_block_mask_destroy(m);
        return st;
    }
    *out = m;
    return AJ_OK;
}

/* Names the first field of `want` that `got` differs in. */
static aj_status check_shape(aj_ctx *ctx, const char *fn, const aj_block_mask_shape *got,
                             const aj_block_mask_shape *want)
{
#define SAME(field)                                                                           \
    AJ_CHECK_ARG(ctx, got->field == want->field, "%s: block_mask was built for " #field        \
                 " = %lld; this launch has %lld", fn, (long long)got->field,                   \
                 (long long)want->field)
    SAME(batch);
    SAME(heads);
    SAME(seq_q);
    SAME(seq_k);
    SAME(q_offset);
    SAME(kv_offset);
    SAME(sq_total);
    SAME(sk_total);
#undef SAME
    return AJ_OK;
}

aj_status aj_block_mask_view(aj_ctx *ctx, const char *fn, const aj_block_mask *m,
                             const aj_device *dev, const aj_score_prog *p,
                             const aj_block_mask_shape *launch, aj_tensor *classes,
                             int64_t *block_m, int64_t *block_n)
{
    AJ_CHECK_ARG(ctx, m->dev == dev, "%s: block_mask was built on another device", fn);
    aj_status st = check_shape(ctx, fn, &m->shape, launch);
    if (st != AJ_OK)
        return st;
    AJ_CHECK_ARG(ctx, !p || aj_score_mask_hash(p) == m->mask_hash,
                 "%s: block_mask was built for an op with another mask", fn);
    int64_t planes_h = m->per_head ? m->shape.heads : 1;
    *classes = (aj_tensor){m->device_classes, AJ_DTYPE_F32, 4,
                           {m->per_batch ? m->shape.batch : 1, planes_h, m->rows, m->cols},
                           {planes_h * m->rows * m->cols, m->rows * m->cols, m->cols, 1}};
    *block_m = m->shape.block_m;
    *block_n = m->shape.block_n;
    return AJ_OK;
}

aj_status aj_block_mask_create(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                               const aj_kernel *kernel, const aj_fwd_args *args,
                               aj_block_mask **out)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, dev && op && kernel && args && out,
                 "aj_block_mask_create: dev, op, kernel, args and out must not be NULL");
    *out = NULL;
    aj_op_info info;
    aj_op_get_info(op, &info);
    AJ_CHECK_ARG(ctx, info.kind == AJ_KIND_FORWARD && info.layout == AJ_LAYOUT_PADDED,
                 "aj_block_mask_create: the op is `attention %s %s` with layout = %s; block "
                 "masks are for padded forward ops (the backward reads its forward's)",
                 aj_kind_name(info.kind), aj_variant_name(info.variant),
                 info.layout == AJ_LAYOUT_PADDED ? "padded" : "varlen");
    AJ_CHECK_ARG(ctx, args->q.rank == 4 && args->k.rank == 4,
                 "aj_block_mask_create: q and k must be [B, H, S, D] (ranks %d, %d)",
                 args->q.rank, args->k.rank);
    aj_launch_info li;
    aj_kernel_stage_info(kernel, 0, &li);
    static _Thread_local aj_score_prog prog;
    aj_status st = aj_score_prog_init(ctx, op, &prog);
    if (st != AJ_OK)
        return st;
    aj_block_mask_shape shape = {
        .batch = args->q.shape[0], .heads = args->q.shape[1],
        .seq_q = args->q.shape[2], .seq_k = args->k.shape[2],
        .q_offset = args->q_offset, .kv_offset = args->kv_offset,
        .sq_total = args->sq_total ? args->sq_total : args->q.shape[2],
        .sk_total = args->sk_total ? args->sk_total : args->k.shape[2],
        .block_m = li.schedule.block_m > 0 ? li.schedule.block_m : 64,
        .block_n = li.schedule.block_n > 0 ? li.schedule.block_n : 64,
    };
    return aj_block_mask_build(ctx, dev, "aj_block_mask_create", &prog, &shape, args->side,
                               args->num_side, &args->alibi_slopes, out);
}

void aj_block_mask_destroy(aj_block_mask *mask)
{
    if (!mask)
        return;
    if (mask->device_classes)
        aj_device_free(mask->dev, mask->device_classes);
    free(mask->classes);
    free(mask);
}

aj_status aj_block_mask_counts(const aj_block_mask *mask, aj_tile_counts *out)
{
    if (!mask || !out)
        return AJ_ERR_INVALID_ARG;
    *out = mask->counts;
    return AJ_OK;
}

aj_status aj_block_mask_class(const aj_block_mask *mask, int64_t b, int64_t h, int64_t m,
                              int64_t n, aj_tile_class *out)
{
    if (!mask || !out || b < 0 || b >= mask->shape.batch || h < 0 || h >= mask->shape.heads ||
        m < 0 || m >= mask->rows || n < 0 || n >= mask->cols)
        return AJ_ERR_INVALID_ARG;
    int64_t pb = mask->per_batch ? b : 0, ph = mask->per_head ? h : 0;
    int64_t planes_h = mask->per_head ? mask->shape.heads : 1;
    *out = (aj_tile_class)mask->classes[((pb * planes_h + ph) * mask->rows + m) * mask->cols + n];
    return AJ_OK;
}
