/*
 * block_mask.c -- the tile classes of a launch (attnjit.h, aj_block_mask):
 * built on the launch's device by the kernel of templates/block_mask.c
 * (score.h's one rule, exact: interval classes, then the elements of the
 * tiles those leave partial), kept in device memory for the kernels,
 * which read the classes of their tiles from it (score.h,
 * aj_score_tile_class) where the op takes one (aj_score_prog.block_mask),
 * and read back to the host only when asked (aj_block_mask_counts,
 * aj_block_mask_class).
 *
 * Layout (score.h, aj_score_mask_plane_size; docs/ir.md): a plane per
 * batch index (head) only where the mask reads b (h), each the classes
 * (i32 aj_tile_class, row-major), the per-row-block and per-key-block
 * lists of non-skip tiles and the builder's key-block hulls; the kernels
 * see the plane as a [planes_b, planes_h, rows', cols] tensor (rows' >=
 * rows: the lists and hulls are rows of it too) whose size-1 dims
 * broadcast.
 *
 * (aj_side_to_host, first below, reads side tensors back for the ring's
 * host classes.)
 */
#include <pthread.h>
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
                           aj_side_dtype_name(given->dtype), given->rank,
                           aj_side_dtype_name(d->dtype), d->rank);
        int64_t last = 0;
        for (int k = 0; k < given->rank; k++) {
            if (given->shape[k] < 1 || given->strides[k] < 0)
                return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: side tensor '%s' has shape[%d] "
                               "= %lld, stride %lld; want a size of at least 1 and a stride "
                               "of at least 0", fn, d->name, k, (long long)given->shape[k],
                               (long long)given->strides[k]);
            last += (given->shape[k] - 1) * given->strides[k];
        }
        size_t bytes = (size_t)(last + 1) * (size_t)aj_side_dtype_bytes(d->dtype);
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

/* The row blocks of a mask (its tensor's rows hold the lists too). */
static int64_t mask_rows(const aj_block_mask_shape *shape)
{
    return (shape->seq_q + shape->block_m - 1) / shape->block_m;
}

struct aj_block_mask {
    aj_block_mask_shape shape;          /* what it was built for */
    uint64_t mask_hash;                 /* aj_score_mask_hash of its op */
    aj_tensor classes;                  /* on dev (aj_block_mask_tensor) */
    aj_device *dev;
    void *stream;                       /* the build's */
    pthread_mutex_t lock;               /* the host copy, made once */
    int32_t *host;                      /* NULL until a query */
    aj_tile_counts counts;
};

aj_tensor aj_block_mask_tensor(const struct aj_score_prog *p, const aj_block_mask_shape *shape,
                               void *data)
{
    int64_t rows = (shape->seq_q + shape->block_m - 1) / shape->block_m;
    int64_t cols = (shape->seq_k + shape->block_n - 1) / shape->block_n;
    int64_t planes_b = p->mask_reads_b ? shape->batch : 1;
    int64_t planes_h = p->mask_reads_h ? shape->heads : 1;
    int64_t plane = aj_score_mask_plane_size(rows, cols, aj_score_col_slots(p));
    return (aj_tensor){data, AJ_DTYPE_F32, 4, {planes_b, planes_h, plane / cols, cols},
                       {planes_h * plane, plane, cols, 1}};
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
    SAME(head_offset);
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
    *classes = m->classes;
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
    AJ_CHECK_ARG(ctx, aj_device_runs(dev, kernel->target),
                 "aj_block_mask_create: kernel compiled for %s cannot run on a %s device",
                 aj_target_name(kernel->target), aj_target_name(aj_device_target(dev)));
    aj_launch_info li;
    aj_kernel_stage_info(kernel, 0, &li);
    aj_score_prog *prog = malloc(sizeof *prog);   /* large for a stack */
    aj_block_mask *m = prog ? calloc(1, sizeof *m) : NULL;
    if (!m) {
        free(prog);
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_block_mask_create: out of memory");
    }
    aj_status st = aj_score_prog_init(ctx, op, prog);
    if (st != AJ_OK) {
        free(prog);
        free(m);
        return st;
    }
    pthread_mutex_init(&m->lock, NULL);
    m->shape = (aj_block_mask_shape){
        .batch = args->q.shape[0], .heads = args->q.shape[1],
        .seq_q = args->q.shape[2], .seq_k = args->k.shape[2],
        .q_offset = args->q_offset, .kv_offset = args->kv_offset,
        .sq_total = args->sq_total ? args->sq_total : args->q.shape[2],
        .sk_total = args->sk_total ? args->sk_total : args->k.shape[2],
        .block_m = li.schedule.block_m > 0 ? li.schedule.block_m : 64,
        .block_n = li.schedule.block_n > 0 ? li.schedule.block_n : 64,
        .head_offset = args->head_offset,
    };
    m->mask_hash = aj_score_mask_hash(prog);
    m->classes = aj_block_mask_tensor(prog, &m->shape, NULL);
    aj_score_prog_free(prog);
    free(prog);
    m->counts.block_m = m->shape.block_m;
    m->counts.block_n = m->shape.block_n;
    m->dev = dev;
    m->stream = args->stream;
    aj_kernel *builder = NULL;
    int64_t bytes = m->classes.shape[0] * m->classes.strides[0] * 4;
    st = aj_compile_block_mask(ctx, kernel, op, m->mask_hash, &builder);
    if (st == AJ_OK && bytes)
        st = aj_device_alloc(dev, (size_t)bytes, &m->classes.data);
    if (st == AJ_OK && bytes)
        st = aj_block_mask_launch(ctx, dev, "aj_block_mask_create", builder, &m->shape,
                                  &m->classes, args->side, args->num_side, &args->alibi_slopes,
                                  args->stream);
    aj_kernel_destroy(builder);
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
    if (mask->classes.data)
        aj_device_free(mask->dev, mask->classes.data);
    pthread_mutex_destroy(&mask->lock);
    free(mask->host);
    free(mask);
}

/* The host copy of the classes and their counts, made on the first query
 * (after the build's stream has run it). */
static aj_status read_back(aj_block_mask *m)
{
    pthread_mutex_lock(&m->lock);
    aj_status st = AJ_OK;
    const aj_tensor *t = &m->classes;
    int64_t n = t->shape[0] * t->strides[0];
    if (!m->host) {
        int32_t *host = malloc(n ? (size_t)n * sizeof *host : 1);
        st = host ? aj_device_synchronize(m->dev, m->stream) : AJ_ERR_OUT_OF_MEMORY;
        if (st == AJ_OK)
            st = aj_device_copy_from(m->dev, host, t->data, (size_t)n * sizeof *host);
        /* a plane that serves every batch index (head) counts for each */
        int64_t times = (t->shape[0] == 1 ? m->shape.batch : 1) *
                        (t->shape[1] == 1 ? m->shape.heads : 1);
        int64_t tiles = mask_rows(&m->shape) * t->shape[3];
        for (int64_t i = 0; st == AJ_OK && i < n; i++)
            if (i % t->strides[1] < tiles && (uint32_t)host[i] < AJ_TILE_CLASS_COUNT)
                m->counts.tiles[host[i]] += times;
        if (st == AJ_OK)
            m->host = host;
        else
            free(host);
    }
    pthread_mutex_unlock(&m->lock);
    return st;
}

aj_status aj_block_mask_counts(const aj_block_mask *mask, aj_tile_counts *out)
{
    if (!mask || !out)
        return AJ_ERR_INVALID_ARG;
    aj_status st = read_back((aj_block_mask *)mask);
    if (st == AJ_OK)
        *out = mask->counts;
    return st;
}

aj_status aj_block_mask_class(const aj_block_mask *mask, int64_t b, int64_t h, int64_t m,
                              int64_t n, aj_tile_class *out)
{
    if (!mask || !out)
        return AJ_ERR_INVALID_ARG;
    const aj_tensor *t = &mask->classes;
    if (b < 0 || b >= mask->shape.batch || h < 0 || h >= mask->shape.heads || m < 0 ||
        m >= mask_rows(&mask->shape) || n < 0 || n >= t->shape[3])
        return AJ_ERR_INVALID_ARG;
    aj_status st = read_back((aj_block_mask *)mask);
    if (st != AJ_OK)
        return st;
    int64_t pb = t->shape[0] == 1 ? 0 : b, ph = t->shape[1] == 1 ? 0 : h;
    *out = (aj_tile_class)mask->host[pb * t->strides[0] + ph * t->strides[1] +
                                     m * t->strides[2] + n];
    return AJ_OK;
}

aj_status aj_block_mask_list(const aj_block_mask *mask, int64_t b, int64_t h, int by_keys,
                             int64_t index, int64_t *blocks, aj_tile_class *classes,
                             int64_t cap, int64_t *count)
{
    if (!mask || !count || cap < 0)
        return AJ_ERR_INVALID_ARG;
    const aj_tensor *t = &mask->classes;
    int64_t rows = mask_rows(&mask->shape), cols = t->shape[3];
    if (b < 0 || b >= mask->shape.batch || h < 0 || h >= mask->shape.heads || index < 0 ||
        index >= (by_keys ? rows : cols))
        return AJ_ERR_INVALID_ARG;
    aj_status st = read_back((aj_block_mask *)mask);
    if (st != AJ_OK)
        return st;
    int64_t pb = t->shape[0] == 1 ? 0 : b, ph = t->shape[1] == 1 ? 0 : h;
    const int32_t *list = mask->host + pb * t->strides[0] + ph * t->strides[1] +
                          aj_score_mask_list_offset(rows, cols, by_keys, index);
    *count = list[0];
    for (int64_t i = 0; i < list[0] && i < cap; i++) {
        if (blocks)
            blocks[i] = list[1 + i] >> 2;
        if (classes)
            classes[i] = (aj_tile_class)(list[1 + i] & 3);
    }
    return AJ_OK;
}
