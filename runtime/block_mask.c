/*
 * block_mask.c -- the tile classes of a launch (attnjit.h, aj_block_mask),
 * by templates/score.h's host classification: the rule the kernels apply
 * to their own tiles.
 */
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "templates/score.h"

struct aj_block_mask {
    int64_t batch, heads, rows, cols;   /* classes[((b H + h) rows + m) cols + n] */
    int per_batch, per_head;            /* 0: one plane serves every b (h) */
    aj_tile_counts counts;
    uint8_t *classes;
};

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
                 "masks are for padded forward ops", aj_kind_name(info.kind),
                 aj_variant_name(info.variant), info.layout == AJ_LAYOUT_PADDED ? "padded" : "varlen");
    AJ_CHECK_ARG(ctx, args->q.rank == 4 && args->k.rank == 4,
                 "aj_block_mask_create: q and k must be [B, H, S, D] (ranks %d, %d)",
                 args->q.rank, args->k.rank);
    aj_launch_info li;
    aj_kernel_stage_info(kernel, 0, &li);
    static _Thread_local aj_score_prog prog;
    aj_status st = aj_score_prog_init(ctx, op, &prog);
    if (st != AJ_OK)
        return st;
    aj_block_mask *m = calloc(1, sizeof *m);
    if (!m)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_block_mask_create: out of memory");
    int64_t sq = args->q.shape[2], sk = args->k.shape[2];
    int64_t bm = li.schedule.block_m > 0 ? li.schedule.block_m : 64;
    int64_t bn = li.schedule.block_n > 0 ? li.schedule.block_n : 64;
    m->batch = args->q.shape[0];
    m->heads = args->q.shape[1];
    m->rows = (sq + bm - 1) / bm;
    m->cols = (sk + bn - 1) / bn;
    m->counts.block_m = (int32_t)bm;
    m->counts.block_n = (int32_t)bn;
    /* a plane per batch index (head) only where the mask can tell them
     * apart (a side tensor is read at b's and h's of the mask's own) */
    m->per_batch = prog.mask_reads_b;
    m->per_head = prog.mask_reads_h;
    int64_t planes_b = m->per_batch ? m->batch : 1, planes_h = m->per_head ? m->heads : 1;
    size_t n = (size_t)(planes_b * planes_h * m->rows * m->cols);
    m->classes = malloc(n ? n : 1);
    aj_side_tensor tensors[AJ_OP_TENSORS_MAX + 1];
    void *mem[AJ_OP_TENSORS_MAX + 1] = {0};
    st = m->classes ? aj_side_to_host(ctx, dev, "aj_block_mask_create", &prog, args->side,
                                      args->num_side, &args->alibi_slopes, tensors, mem)
                    : aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_block_mask_create: out of memory");
    aj_score_cache *cache = calloc(1, sizeof *cache);
    if (!cache && st == AJ_OK)
        st = aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_block_mask_create: out of memory");
    int64_t sq_total = args->sq_total ? args->sq_total : sq;
    int64_t sk_total = args->sk_total ? args->sk_total : sk;
    for (int64_t b = 0; b < planes_b && st == AJ_OK; b++)
        for (int64_t h = 0; h < planes_h; h++)
            for (int64_t r = 0; r < m->rows; r++)
                for (int64_t c = 0; c < m->cols; c++) {
                    int64_t q0 = args->q_offset + r * bm, k0 = args->kv_offset + c * bn;
                    int64_t q1 = args->q_offset + (r + 1 < m->rows ? (r + 1) * bm : sq) - 1;
                    int64_t k1 = args->kv_offset + (c + 1 < m->cols ? (c + 1) * bn : sk) - 1;
                    aj_tile_class cls =
                        aj_score_has_mask(&prog)
                            ? aj_score_host_class(&prog, tensors, cache, m->per_batch ? b : -1,
                                                  m->per_head ? h : -1, q0, q1, k0, k1, sq_total,
                                                  sk_total)
                            : AJ_TILE_FULL;
                    m->classes[((b * planes_h + h) * m->rows + r) * m->cols + c] = (uint8_t)cls;
                    m->counts.tiles[cls] += (m->per_batch ? 1 : m->batch) *
                                            (m->per_head ? 1 : m->heads);
                }
    free(cache);
    for (int t = 0; t < AJ_OP_TENSORS_MAX + 1; t++)
        free(mem[t]);
    if (st != AJ_OK) {
        aj_block_mask_destroy(m);
        return st;
    }
    *out = m;
    return AJ_OK;
}

void aj_block_mask_destroy(aj_block_mask *mask)
{
    if (!mask)
        return;
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
    if (!mask || !out || b < 0 || b >= mask->batch || h < 0 || h >= mask->heads || m < 0 ||
        m >= mask->rows || n < 0 || n >= mask->cols)
        return AJ_ERR_INVALID_ARG;
    int64_t pb = mask->per_batch ? b : 0, ph = mask->per_head ? h : 0;
    int64_t planes_h = mask->per_head ? mask->heads : 1;
    *out = (aj_tile_class)mask->classes[((pb * planes_h + ph) * mask->rows + m) * mask->cols + n];
    return AJ_OK;
}
