/*
 * launch.c -- aj_forward, aj_backward and aj_merge: check every argument
 * against the kernel's op (launch_shapes.c), bind them to the kernel's
 * parameter ABI by its table rows (launch_bind.c), and run the grid.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/launch_internal.h"
#include "templates/attn_common.h"
#include "templates/score.h"

/* The items of one part of a paged launch that have work: where the
 * kernel packs each KV head's query heads (layouts.h, "GQA packing":
 * padded queries here, and the group's Sq rows within the rows its first
 * stage packs) B Hkv times the group's working CTAs (the cpu: one item;
 * sim and GPUs: its row blocks of the stage's block_m, in turn), else
 * B Hq. */
static int64_t paged_working_items(const aj_kernel *kernel, const fwd_sizes *sz)
{
    int64_t group = sz->heads_q / sz->heads_kv;
    if (kernel->op.q_layout != AJ_LAYOUT_VARLEN &&
        aj_attn_paged_group_packs(group, sz->seq_q, kernel->stages[0].pack_rows)) {
        aj_launch_info li;
        aj_kernel_stage_info(kernel, 0, &li);
        int64_t bm = aj_target_desc_of(kernel->target)->simt ? li.schedule.block_m : 0;
        return sz->batch * sz->heads_kv * aj_attn_paged_workers(group, sz->seq_q, bm);
    }
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
static int64_t grid_extent(aj_extent e, const fwd_sizes *sz)
{
    const int64_t extents[AJ_EXTENT_COUNT] = {
        [AJ_EXTENT_ONE] = 1,           [AJ_EXTENT_BATCH] = sz->batch,
        [AJ_EXTENT_HEADS_Q] = sz->heads_q, [AJ_EXTENT_HEADS_KV] = sz->heads_kv,
        [AJ_EXTENT_SEQ_Q] = sz->seq_q, [AJ_EXTENT_SEQ_K] = sz->seq_k,
        [AJ_EXTENT_SPLITS] = sz->splits,
        [AJ_EXTENT_DSIDE_PARTS] = sz->dside_parts, [AJ_EXTENT_DSIDE_ELEMENTS] = sz->dside_elements,
    };
    return e > AJ_EXTENT_ONE && e < AJ_EXTENT_COUNT ? extents[e] : 1;
}

/* The items (CTAs) of stage `stage` along each grid dimension; returns
 * their product. */
static int64_t stage_grid(const aj_kernel *kernel, int stage, const fwd_sizes *sz,
                          int32_t grid[3])
{
    aj_launch_info li;
    aj_kernel_stage_info(kernel, stage, &li);
    int64_t items = 1;
    for (int d = 0; d < 3; d++) {
        int64_t e = grid_extent(li.grid[d].extent, sz);
        grid[d] = (int32_t)((e + li.grid[d].per_block - 1) / li.grid[d].per_block);
        items *= grid[d];
    }
    return items;
}

/* Runs stage `stage` of the bound kernel over the grid its launch info
 * asks for, on `stream` (sim: with `buffers` as the memory its accesses
 * may touch). */
static aj_status run_kernel(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel, int stage,
                            const fwd_sizes *sz, void **argv, const aj_sim_buffer *buffers,
                            int num_buffers, void *stream)
{
    aj_device_launch l = {
        .kernel = kernel,
        .stage = stage,
        .argv = argv,
        .buffers = buffers,
        .num_buffers = num_buffers,
        .stream = stream,
    };
    stage_grid(kernel, stage, sz, l.grid);
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
    AJ_CHECK_ARG(ctx, aj_device_runs(dev, kernel->target),
                 "%s: kernel compiled for %s cannot run on a %s device", fn,
                 aj_target_name(kernel->target), aj_target_name(aj_device_target(dev)));
    return AJ_OK;
}

/* How each launch entry point starts: check_launch as `fn`, then the
 * caller's struct `given` read into `const type *args` (its initializer
 * is AJ_<NAME>_INIT, pasted so that its error names the macro), and `op`,
 * the kernel's op; a failure returns from the entry point. */
#define BEGIN_LAUNCH(fn, kind, type, last_required, NAME)                                   \
    if (!ctx)                                                                               \
        return AJ_ERR_INVALID_ARG;                                                          \
    aj_status st = check_launch(ctx, fn, dev, kernel, given, kind);                         \
    if (st != AJ_OK)                                                                        \
        return st;                                                                          \
    AJ_READ_STRUCT_OR_RETURN(ctx, fn ": args", given, type, last_required, AJ_##NAME##_INIT, \
                             args);                                                         \
    const aj_op_info *op = &kernel->op

/* What the score programs and the block mask of a padded or varlen
 * launch read from its args (aj_fwd_args and aj_bwd_args name them alike),
 * with its resolved totals. */
typedef struct score_call {
    const aj_side_tensor *side;
    int32_t num_side;
    const aj_tensor *slopes;
    int64_t q_offset, kv_offset, sq_total, sk_total;
    const aj_block_mask *block_mask;
    void *stream;
    int32_t check_bounds;   /* check_side_bounds */
} score_call;

#define SCORE_CALL_OF(a, sq_total, sk_total)                                                 \
    {(a)->side, (a)->num_side, &(a)->alibi_slopes, (a)->q_offset, (a)->kv_offset, (sq_total), \
     (sk_total), (a)->block_mask, (a)->stream, (a)->check_side_bounds}

/* check_side_bounds: every load of the kernel's programs inside its
 * tensor over the launch's ranges (templates/score.h), or the error. */
static aj_status check_loads(aj_ctx *ctx, const char *fn, const aj_kernel *kernel,
                             const score_call *c, const fwd_sizes *sz)
{
    const aj_score_prog *prog = aj_kernel_programs(kernel);
    if (!c->check_bounds || !prog || prog->tensor_count == 0)
        return AJ_OK;
    int64_t shapes[AJ_OP_TENSORS_MAX + 1][4] = {{0}};
    for (int t = 0; t < prog->tensor_count; t++) {
        const aj_side_tensor *given = NULL;
        for (int i = 0; i < c->num_side && !given; i++)
            if (strcmp(c->side[i].name, prog->tensors[t].name) == 0)
                given = &c->side[i];
        for (int d = 0; d < prog->tensors[t].rank; d++)
            shapes[t][d] = given ? given->shape[d] : c->slopes->shape[d];
    }
    const aj_score_ranges r = {0, sz->batch - 1, sz->head_offset,
                               sz->head_offset + sz->heads_q - 1, c->q_offset,
                               c->q_offset + sz->seq_q - 1, c->kv_offset,
                               c->kv_offset + sz->seq_k - 1, c->sq_total, c->sk_total};
    char msg[512];
    if (r.b1 < 0 || r.h1 < r.h0 || sz->seq_q == 0 || sz->seq_k == 0 ||
        aj_score_loads_in_bounds(prog, (const int64_t(*)[4])shapes, &r, msg, sizeof msg))
        return AJ_OK;
    return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: check_side_bounds: %s", fn, msg);
}

/* Binds the op's score programs to the call's side tensors and slopes, then
 * its block mask (the caller's, or one built into *scratch). */
static aj_status bind_scores(aj_ctx *ctx, const char *fn, aj_device *dev,
                             const aj_kernel *kernel, const score_call *c, const fwd_sizes *sz,
                             launch_values *v, launch_scratch *ls, void **scratch)
{
    aj_status st = aj_bind_scores(ctx, fn, &kernel->op, c->side, c->num_side, c->slopes,
                                  &ls->scores);
    if (st == AJ_OK)
        st = aj_side_check_sinks(ctx, fn, aj_kernel_sinks_name(kernel), c->side, c->num_side,
                                 sz->heads_total);
    if (st == AJ_OK)
        st = check_loads(ctx, fn, kernel, c, sz);
    const aj_block_mask_shape shape = {sz->batch, sz->heads_q, sz->seq_q, sz->seq_k,
                                       c->q_offset, c->kv_offset, c->sq_total, c->sk_total,
                                       0, 0, sz->head_offset};
    if (st == AJ_OK)
        st = aj_bind_block_mask(ctx, fn, dev, kernel, &shape, c->block_mask, c->side,
                                c->num_side, c->slopes, c->stream, v, scratch);
    return st;
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
                               const aj_fwd_args *given)
{
    const aj_op_info *op = &kernel->op;
    fwd_sizes sz = {.splits = 1};
    /* kv_shared: V is k_cache's first Dv columns (and v_scale k_scale), a
     * view the kernel reads as it reads a v_cache */
    aj_fwd_args shared;
    const aj_fwd_args *a = given;
    if (kernel->kv_shared) {
        AJ_CHECK_ARG(ctx, !given->v_cache.data && !given->v_scale.data, "%s: v_cache and "
                     "v_scale stay empty with kv_shared = true (V is the first head_dim_v "
                     "columns of k_cache, scaled by k_scale)", FWD);
        shared = *given;
        shared.v_cache = given->k_cache;
        if (shared.v_cache.rank == 4)
            shared.v_cache.shape[3] = op->head_dim_v;
        shared.v_scale = given->k_scale;
        a = &shared;
    }
    aj_status st = aj_check_forward_paged(ctx, kernel, a, &sz);
    if (st != AJ_OK || sz.batch == 0 || sz.heads_q == 0 || sz.tokens_q == 0)
        return st;
    const int varlen_q = op->q_layout == AJ_LAYOUT_VARLEN;
    sz.splits = paged_splits(ctx, kernel, dev, &sz);
    size_t rows = (size_t)((varlen_q ? 1 : sz.batch) * sz.heads_q * sz.splits * sz.tokens_q);
    size_t ws_bytes = sz.splits > 1 ? rows * (size_t)(op->head_dim_v + 1) * 4 : 0;
    void *ws = NULL;
    if (ws_bytes)
        st = aj_device_scratch(dev, a->stream, ws_bytes, &ws);
    void *word = NULL;   /* this launch's status word */
    if (st == AJ_OK)
        st = aj_device_status_word(dev, &word);
    launch_scratch *ls = aj_launch_scratch_new(ctx, FWD, &st);
    launch_values v = {.given = 0};
    const aj_tensor i32s[2] = {
        {(void *)a->block_table, AJ_DTYPE_F32, 2, {sz.batch, a->max_pages}, {a->max_pages, 1}},
        {(void *)a->seqlens_k, AJ_DTYPE_F32, 1, {sz.batch}, {1}}};
    const aj_tensor status_word = {word, AJ_DTYPE_F32, 1, {1}, {1}};
    const aj_tensor ws_t = {ws, AJ_DTYPE_F32, 1, {(int64_t)(ws_bytes / 4)}, {1}};
    /* varlen queries: the packed q, o, lse as padded views (batch stride
     * 0), cu_seqlens_q beside them */
    const aj_tensor q = aj_padded_view(&a->q), o = aj_padded_view(&a->o);
    const aj_tensor lse = aj_padded_view(&a->lse);
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
        st = aj_bind_scores(ctx, FWD, op, a->side, a->num_side, &a->alibi_slopes, &ls->scores);
    if (st == AJ_OK)
        st = aj_side_check_sinks(ctx, FWD, aj_kernel_sinks_name(kernel), a->side, a->num_side,
                                 sz.heads_total);
    for (int s = 0; st == AJ_OK && s < (sz.splits > 1 ? 2 : 1); s++) {
        st = aj_bind_stage(ctx, dev, kernel, s, &v, &ls->scores, &ls->bound);
        if (st == AJ_OK)
            st = run_kernel(ctx, dev, kernel, s, &sz, ls->bound.argv, ls->bound.buffers,
                            ls->bound.nb, a->stream);
    }
    free(ls);
    if (ws)
        aj_device_scratch_release(dev, a->stream, ws);
    return aj_device_launched(ctx, dev, word, st, FWD);
}

static aj_status forward_on(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                            const aj_fwd_args *given)
{
    BEGIN_LAUNCH("aj_forward", AJ_KIND_FORWARD, aj_fwd_args, lse, FWD_ARGS);
    fwd_sizes sz = {.splits = 1};
    int varlen = op->layout == AJ_LAYOUT_VARLEN;
    if (op->layout == AJ_LAYOUT_PAGED)
        return forward_paged(ctx, dev, kernel, args);
    st = varlen ? aj_check_forward_varlen(ctx, kernel, args, &sz)
                : aj_check_forward(ctx, kernel, args, &sz);
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
            *packed[i] = aj_padded_view(packed[i]);
    }
    void *word = dev->status;   /* this launch's status word (varlen) */
    if (varlen && (st = aj_device_status_word(dev, &word)) != AJ_OK)
        return st;
    launch_scratch *ls = aj_launch_scratch_new(ctx, FWD, &st);
    if (!ls)
        return aj_device_launched(ctx, dev, varlen ? word : NULL, st, FWD);
    launch_values v;
    aj_forward_values(&as_padded, &sz, sq_total, sk_total, word, &v);
    put_scalar(&v, AJ_PSRC_tma, aj_tma_usable(dev, kernel, &v));
    void *scratch = NULL;
    const score_call call = SCORE_CALL_OF(args, sq_total, sk_total);
    st = bind_scores(ctx, FWD, dev, kernel, &call, &sz, &v, ls, &scratch);
    if (st == AJ_OK)
        st = aj_bind_stage(ctx, dev, kernel, 0, &v, &ls->scores, &ls->bound);
    if (st == AJ_OK)
        st = run_kernel(ctx, dev, kernel, 0, &sz, ls->bound.argv, ls->bound.buffers,
                        ls->bound.nb, args->stream);
    free(ls);
    if (scratch)
        aj_device_scratch_release(dev, args->stream, scratch);
    return aj_device_launched(ctx, dev, varlen ? word : NULL, st, FWD);
}

aj_status aj_block_mask_launch(aj_ctx *ctx, aj_device *dev, const char *fn,
                               const aj_kernel *builder, const aj_block_mask_shape *shape,
                               const aj_tensor *classes, const aj_side_tensor *side,
                               int32_t num_side, const aj_tensor *slopes, void *stream)
{
    /* its own scratch: a launch that builds its mask keeps its own */
    aj_status st = AJ_OK;
    launch_scratch *ls = aj_launch_scratch_new(ctx, fn, &st);
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
    const fwd_sizes sz = {.batch = shape->batch, .heads_q = shape->heads,
                          .heads_kv = shape->heads, .seq_q = shape->seq_q,
                          .seq_k = shape->seq_k, .splits = 1, .tokens_q = shape->seq_q,
                          .head_offset = shape->head_offset, .heads_total = shape->heads};
    st = aj_bind_scores(ctx, fn, &builder->op, side, num_side, slopes, &ls->scores);
    /* its stages in order: key-block hulls, classes and row lists, key-block lists */
    for (int s = 0; st == AJ_OK && s < builder->num_stages; s++) {
        st = aj_bind_stage(ctx, dev, builder, s, &v, &ls->scores, &ls->bound);
        if (st == AJ_OK)
            st = run_kernel(ctx, dev, builder, s, &sz, ls->bound.argv, ls->bound.buffers,
                            ls->bound.nb, stream);
    }
    free(ls);
    return st;
}

/* ---------------------------------------------------------------- row kernels */

static aj_status emulate_rows(aj_ctx *ctx, aj_device *dev, const aj_kernel *rows, int stage,
                              const aj_tensor *o, const aj_tensor *acc, const aj_tensor *lse,
                              void *stream);

static aj_status rows_on(aj_ctx *ctx, aj_device *dev, const aj_kernel *rows, int stage,
                         const aj_tensor *o, const aj_tensor *acc, const aj_tensor *lse,
                         void *stream)
{
    aj_status st = AJ_OK;
    launch_scratch *ls = aj_launch_scratch_new(ctx, "aj_rows_launch", &st);
    if (!ls)
        return st;
    /* the stages that read no LSE are bound with one over the
     * accumulator's first elements of each (b, h), never read */
    const aj_tensor unread = {acc->data, AJ_DTYPE_F32, 3, {acc->shape[0], acc->shape[1],
                              acc->shape[2]}, {acc->strides[0], acc->strides[1], 1}};
    launch_values v = {.given = 0};
    put_tensor(&v, AJ_PSRC_o, o);
    put_tensor(&v, AJ_PSRC_o_acc, acc);
    put_tensor(&v, AJ_PSRC_lse, lse ? lse : &unread);
    put_scalar(&v, AJ_PSRC_seq_q, o->shape[2]);
    const fwd_sizes sz = {.batch = o->shape[0], .heads_q = o->shape[1], .heads_kv = o->shape[1],
                          .seq_q = o->shape[2], .seq_k = o->shape[2], .splits = 1,
                          .tokens_q = o->shape[2]};
    st = aj_bind_stage(ctx, dev, rows, stage, &v, NULL, &ls->bound);
    if (st == AJ_OK)
        st = run_kernel(ctx, dev, rows, stage, &sz, ls->bound.argv, ls->bound.buffers,
                        ls->bound.nb, stream);
    free(ls);
    return st;
}

aj_status aj_rows_launch(aj_ctx *ctx, aj_device *dev, const aj_kernel *rows, int stage,
                         const aj_tensor *o, const aj_tensor *acc, const aj_tensor *lse,
                         void *stream)
{
    if (o->shape[0] == 0 || o->shape[1] == 0 || o->shape[2] == 0)
        return AJ_OK;   /* no row */
    aj_status st = rows_on(ctx, dev, rows, stage, o, acc, lse, stream);
    if (st != AJ_OK || !dev->twin)
        return st;
    return emulate_rows(ctx, dev, rows, stage, o, acc, lse, stream);
}

/* The stage of kernel with plan `plan`, or -1. */
static int stage_of_plan(const aj_kernel *kernel, aj_stage_plan plan)
{
    for (int s = 0; s < kernel->num_stages; s++)
        if (kernel->stages[s].plan == (int32_t)plan)
            return s;
    return -1;
}

/*
 * Whether a backward launch takes its kernel's fused plan, the stage
 * AJ_STAGE_FUSED in place of the AJ_STAGE_SPLIT ones (the cpu backward,
 * templates/cpu_bwd.c; both plans give the same bits): where the fused
 * stage's items keep the device's workers busy: on one worker always;
 * else, padded, at least one item a worker and at most a fifth of the
 * workers' time idle in the rounds they take (4 items on 2 workers, 8 or
 * 10 on 4; not 3 on 2, 5 or 9 on 4).  Varlen items are as unequal as the
 * sequences, which this rule does not read: the split plan, whose items
 * are blocks of keys or queries.
 */
static int takes_fused_plan(const aj_kernel *kernel, const aj_device *dev, const fwd_sizes *sz)
{
    int s = stage_of_plan(kernel, AJ_STAGE_FUSED);
    int64_t workers = aj_device_workers(dev);
    if (s < 0 || workers == 1)
        return s >= 0;
    if (kernel->op.layout == AJ_LAYOUT_VARLEN)
        return 0;
    int32_t grid[3];
    int64_t items = stage_grid(kernel, s, sz, grid);
    int64_t rounds = (items + workers - 1) / workers;
    return items >= workers && 4 * rounds * workers <= 5 * items;
}

/* The backward workspace's rule (runtime.h, aj_workspace_rule): Delta,
 * then the dQ sums, f32, on 16 bytes: the flash backward's where the op is
 * not deterministic (atomics), the cpu's fused plan's (a call that takes
 * the split plan lays out none: workspace_layout). */
void aj_workspace_rule_of(const aj_kernel *kernel, aj_workspace_rule *out)
{
    *out = (aj_workspace_rule){.takes = aj_kernel_takes(kernel, AJ_PID(workspace))};
    if (!out->takes)
        return;
    int dq = !kernel->op.deterministic || stage_of_plan(kernel, AJ_STAGE_FUSED) >= 0;
    out->per_batch = kernel->op.layout != AJ_LAYOUT_VARLEN;
    out->align = 16;
    out->region[AJ_WS_DELTA] = (aj_ws_region){4, 1};
    out->region[AJ_WS_DQ] = (aj_ws_region){4, dq ? kernel->op.head_dim : 0};
}

/* A checked call's workspace: the rule the kernel's plan recorded (one
 * without a plan derives it here) times the call's rows. */
/* The regions of the rule's rows into w (workspace_layout); returns
 * their bytes. */
static int64_t row_regions(const aj_workspace_rule *r, const bwd_call *call, bwd_workspace *w)
{
    const fwd_sizes *sz = &call->sz;
    int64_t rows = (r->per_batch ? sz->batch : 1) * sz->heads_q * call->head_rows;
    w->stride_b = r->per_batch ? sz->heads_q * call->head_rows : 0;
    w->stride_h = call->head_rows;
    int64_t at = 0;   /* bytes */
    for (int i = 0; i < AJ_WS_REGIONS; i++) {
        const aj_ws_region *g = &r->region[i];
        at = (at + r->align - 1) / r->align * r->align;
        w->offset[i] = at / g->elem_bytes;
        at += rows * g->per_row * g->elem_bytes;
    }
    return at;
}

/* The workspace of a call that takes the kernel's fused plan or not
 * (`fused`; the dQ sums of a kernel with that plan are its alone). */
static bwd_workspace workspace_layout(const aj_kernel *kernel, const bwd_call *call, int fused)
{
    aj_workspace_rule own;
    const aj_workspace_rule *r = aj_kernel_workspace_rule(kernel);
    if (!r) {
        aj_workspace_rule_of(kernel, &own);
        r = &own;
    }
    int has_plan = stage_of_plan(kernel, AJ_STAGE_FUSED) >= 0;
    fused = fused && has_plan;
    if (has_plan && !fused) {
        own = *r;
        own.region[AJ_WS_DQ].per_row = 0;
        r = &own;
    }
    bwd_workspace w = {0, 0, {0}, 0, 0, fused};
    int64_t at = r->takes ? row_regions(r, call, &w) : 0;   /* bytes */
    /* then the side tensors' partial sums (templates/side_grad.c) */
    if (call->dside.count > 0) {
        at = (at + 15) / 16 * 16;
        w.dside_offset = at / 4;
        at += call->dside.parts_total * call->dside.part_size * 4;
    }
    w.bytes = (size_t)at;
    return w;
}

/* The stages of a backward's tail (templates/grad_tail.h), by their
 * entries' names: what each is, or TAIL_NONE for the template's own. */
typedef enum tail_stage { TAIL_NONE, TAIL_SINKS, TAIL_DSIDE, TAIL_DSIDE_SUM } tail_stage;

static tail_stage tail_of(const aj_kernel *kernel, int s)
{
    static const char *const suffix[] = {NULL, "_dsinks", "_dside", "_dside_sum"};
    const char *entry = aj_kernel_stage_entry(kernel, s);
    size_t n = strlen(entry);
    for (int t = TAIL_DSIDE_SUM; t > TAIL_NONE; t--)
        if (n > strlen(suffix[t]) && strcmp(entry + n - strlen(suffix[t]), suffix[t]) == 0)
            return (tail_stage)t;
    return TAIL_NONE;
}

/* The rows per part of the side tensors' sums the kernel fixes: where no
 * "dside" stage of its own adds into the parts, the tile rows of the
 * template's stage that does (the cpu's dq stage); 0: the launch chooses. */
static int64_t dside_fixed_rows(const aj_kernel *kernel)
{
    for (int s = 0; s < kernel->num_stages; s++)
        if (tail_of(kernel, s) == TAIL_DSIDE)
            return 0;
    for (int s = 0; s < kernel->num_stages; s++)
        for (int i = 0; tail_of(kernel, s) == TAIL_NONE && i < kernel->stages[s].launch.num_params;
             i++)
            if (kernel->stages[s].param_ids[i] == (int32_t)AJ_PID(dside_part))
                return kernel->stages[s].launch.schedule.block_m;
    return 0;
}

/* A backward call's checks: its shapes, dsinks and dside. */
static aj_status check_call(aj_ctx *ctx, const aj_kernel *kernel, const aj_bwd_args *args,
                            bwd_call *call)
{
    aj_status st = aj_check_backward(ctx, kernel, args, call);
    if (st == AJ_OK)
        st = aj_check_dsinks(ctx, BWD, kernel->sinks >= 0, &args->dsinks, call->sz.heads_q);
    if (st == AJ_OK)
        st = aj_check_dside(ctx, BWD, &kernel->op, kernel->tensor_grad, args, &call->sz,
                            dside_fixed_rows(kernel), &call->dside);
    return st;
}

aj_status aj_backward_workspace(aj_ctx *ctx, const aj_kernel *kernel, const aj_bwd_args *args,
                                bwd_workspace *out)
{
    bwd_call call;
    aj_status st = check_call(ctx, kernel, args, &call);
    if (st == AJ_OK)
        *out = workspace_layout(kernel, &call, 1);   /* the most a call may take */
    return st;
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
    bwd_workspace w;
    aj_status st = aj_backward_workspace(ctx, kernel, args, &w);
    if (st == AJ_OK)
        *bytes = w.bytes;
    return st;
}

static aj_status run_backward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                              const bwd_call *call, const bwd_workspace *w, void *ws, void *word);

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

static aj_status backward_on(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                             const aj_bwd_args *given, bool sinks_only)
{
    BEGIN_LAUNCH("aj_backward", AJ_KIND_BACKWARD, aj_bwd_args, dv, BWD_ARGS);
    bwd_call call;
    st = check_call(ctx, kernel, args, &call);
    if (st != AJ_OK)
        return st;
    call.sinks_only = sinks_only;
    if (sinks_only && (kernel->sinks < 0 || !args->dsinks.data || call.dside.count))
        return aj_fail(ctx, AJ_ERR_INTERNAL, "%s: the sinks' stage alone wants an op with "
                       "sinks, dsinks and no dside", BWD);
    const fwd_sizes *sz = &call.sz;
    /* no gradient element: nothing to launch (but dsinks and dside, 0) */
    if ((sz->batch == 0 || sz->heads_kv == 0 || (sz->seq_q == 0 && sz->seq_k == 0)) &&
        !args->dsinks.data && call.dside.count == 0)
        return AJ_OK;

    /* the plan decides the workspace; where the fused plan's dQ sums do
     * not fit in memory, the split plan, which needs none */
    bwd_workspace w = workspace_layout(kernel, &call, takes_fused_plan(kernel, dev, sz));
    if (sinks_only)   /* (the sinks' stage reads none) */
        w.bytes = 0;
    void *ws = NULL;
    int scratch = 0;
    st = bind_workspace(ctx, dev, args, &w, &ws, &scratch);
    if (st == AJ_ERR_OUT_OF_MEMORY && w.fused && !args->workspace) {
        aj_log(ctx, AJ_LOG_DEBUG, "%s: no memory for the fused plan's %zu-byte workspace; "
               "the split plan", BWD, w.bytes);
        w = workspace_layout(kernel, &call, 0);
        st = bind_workspace(ctx, dev, args, &w, &ws, &scratch);
    }
    const int varlen = op->layout == AJ_LAYOUT_VARLEN;
    void *word = dev->status;   /* this launch's status word (varlen) */
    if (st == AJ_OK && varlen)
        st = aj_device_status_word(dev, &word);
    if (st == AJ_OK)
        st = run_backward(ctx, dev, kernel, &call, &w, ws, word);
    if (scratch)
        aj_device_scratch_release(dev, args->stream, ws);
    return aj_device_launched(ctx, dev, varlen ? word : NULL, st, BWD);
}

static aj_status run_stages(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                            const bwd_call *call, const bwd_workspace *w, void *ws,
                            launch_values *v, launch_scratch *ls);

/* Binds and runs the stages of a checked backward launch. */
static aj_status run_backward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                              const bwd_call *call, const bwd_workspace *w, void *ws, void *word)
{
    const fwd_sizes sz = call->sz;
    const aj_bwd_args *a = &call->view;
    aj_status st = AJ_OK;
    int64_t sq_total = a->sq_total ? a->sq_total : sz.seq_q;
    int64_t sk_total = a->sk_total ? a->sk_total : sz.seq_k;
    launch_scratch *ls = aj_launch_scratch_new(ctx, BWD, &st);
    if (!ls)
        return st;
    launch_values v;
    aj_backward_values(a, &sz, sq_total, sk_total, w, ws, word, &v);
    aj_dside_values(&call->dside, w, ws, NULL, 0, &v);
    void *scratch = NULL;
    const score_call scores = SCORE_CALL_OF(a, sq_total, sk_total);
    st = bind_scores(ctx, BWD, dev, kernel, &scores, &sz, &v, ls, &scratch);
    if (st == AJ_OK)
        st = run_stages(ctx, dev, kernel, call, w, ws, &v, ls);
    free(ls);
    if (scratch)
        aj_device_scratch_release(dev, a->stream, scratch);
    return st;
}

/* Stage s of a bound backward launch over grid sizes sz, unless its grid
 * is empty; adds its instructions to *instructions. */
static aj_status run_stage(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel, int s,
                           const fwd_sizes *sz, const launch_values *v, launch_scratch *ls,
                           void *stream, uint64_t *instructions)
{
    aj_launch_info li;
    aj_kernel_stage_info(kernel, s, &li);
    for (int d = 0; d < 3; d++)
        if (grid_extent(li.grid[d].extent, sz) == 0)
            return AJ_OK;
    aj_status st = aj_bind_stage(ctx, dev, kernel, s, v, &ls->scores, &ls->bound);
    if (st == AJ_OK)
        st = run_kernel(ctx, dev, kernel, s, sz, ls->bound.argv, ls->bound.buffers, ls->bound.nb,
                        stream);
    if (st == AJ_OK)
        *instructions += dev->last_instructions;
    return st;
}

/* Runs the stages of a bound backward launch in order: the template's
 * (those of the plan it takes), then its tail's (templates/grad_tail.h)
 * that the call asks for: the sinks' gradient with dsinks, the side
 * tensors' partial sums and one sum per output of dside. */
static aj_status run_stages(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                            const bwd_call *call, const bwd_workspace *w, void *ws,
                            launch_values *v, launch_scratch *ls)
{
    const aj_bwd_args *a = &call->view;
    fwd_sizes sz = call->sz;
    sz.dside_parts = call->dside.parts;
    aj_status st = AJ_OK;
    uint64_t instructions = 0;
    const aj_stage_plan skipped = w->fused ? AJ_STAGE_SPLIT : AJ_STAGE_FUSED;
    for (int s = 0; s < kernel->num_stages && st == AJ_OK; s++) {
        tail_stage tail = tail_of(kernel, s);
        if (kernel->stages[s].plan == (int32_t)skipped ||
            kernel->stages[s].plan == (int32_t)AJ_STAGE_UNUSED)
            continue;
        if ((tail == TAIL_SINKS && !a->dsinks.data) || (call->sinks_only && tail != TAIL_SINKS) ||
            ((tail == TAIL_DSIDE || tail == TAIL_DSIDE_SUM) && call->dside.count == 0))
            continue;
        if (tail != TAIL_DSIDE_SUM) {
            st = run_stage(ctx, dev, kernel, s, &sz, v, ls, a->stream, &instructions);
            continue;
        }
        for (int i = 0; i < call->dside.count && st == AJ_OK; i++) {
            const aj_side_tensor *out = &a->dside[i];
            int t = 0;   /* checked: one of the op's tensors, else alibi's slopes */
            while (t < kernel->op.num_tensors && strcmp(kernel->op.tensors[t].name, out->name))
                t++;
            fwd_sizes one = sz;
            one.dside_elements = 1;
            for (int d = 0; d < out->rank; d++)
                one.dside_elements *= out->shape[d];
            aj_dside_values(&call->dside, w, ws, out, t, v);
            st = run_stage(ctx, dev, kernel, s, &one, v, ls, a->stream, &instructions);
        }
    }
    dev->last_instructions = instructions;
    return st;
}

/* ---------------------------------------------------------------- merge */

static aj_status merge_on(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                          const aj_merge_args *given)
{
    BEGIN_LAUNCH("aj_merge", AJ_KIND_MERGE, aj_merge_args, lse, MERGE_ARGS);
    fwd_sizes sz = {.splits = 1};
    st = aj_check_merge(ctx, op, args, &sz);
    if (st != AJ_OK)
        return st;
    if (sz.batch == 0 || sz.heads_q == 0 || sz.seq_q == 0)
        return AJ_OK;   /* no row: nothing to launch */

    launch_scratch *ls = aj_launch_scratch_new(ctx, MERGE, &st);
    if (!ls)
        return st;
    launch_values v;
    aj_merge_values(args, &sz, &v);
    st = aj_bind_stage(ctx, dev, kernel, 0, &v, NULL, &ls->bound);
    if (st == AJ_OK)
        st = run_kernel(ctx, dev, kernel, 0, &sz, ls->bound.argv, ls->bound.buffers,
                        ls->bound.nb, args->stream);
    free(ls);
    return st;
}

/* ---------------------------------------------------------------- emulated launches */

/*
 * On a cuda device with a sim twin (AJ_CUDA_EMULATE=1 on a stand-in
 * libcuda, device.c: open_twin), every launch is queued on the GPU as
 * ever -- the stand-in checks its memory and logs it -- and then the
 * kernel's sim twin (aj_compile_twin: the same op and schedule) runs the
 * same call over the same buffers, which are host memory there, so what
 * the GPU path computes are real numbers (docs/design.md "Emulated
 * launches").  The stand-in does a stream's work when it is queued, so
 * running the twin at once keeps the stream's order.  The twin gets the
 * device's own workspace and builds its own block masks: those the GPU
 * path holds were never written.  It keeps the call's stream, which the
 * sim ignores but names in the accesses its launches report to the
 * stand-in's stream-order model (device.c: sim_launch).
 */

/*
 * Inside a CUDA graph capture the GPU launch is recorded, not run, so the
 * twin's run must be too: it is queued on the stream as a host function
 * (aj_cuda_host_func), a node each replay of the graph runs, over a copy
 * of the call's arguments (side tensors and their names included) that
 * lives, with the twin, until the device closes.
 */
typedef struct aj_emulated_run {
    struct aj_emulated_run *next;
    aj_ctx *ctx;
    aj_device *sim;
    aj_kernel *twin;
    aj_status (*run)(struct aj_emulated_run *r);
    bool sinks_only;   /* a backward's: aj_backward_sinks */
    union {
        aj_fwd_args fwd;
        aj_bwd_args bwd;
        aj_merge_args merge;
        struct {
            int stage;
            aj_tensor o, acc, lse;
            bool has_lse;
            void *stream;
        } rows;
    } a;
    aj_side_tensor side[AJ_OP_TENSORS_MAX + 1], dside[AJ_OP_TENSORS_MAX + 1];
    char names[2][AJ_OP_TENSORS_MAX + 1][AJ_OP_TENSOR_NAME_MAX + 1];
} aj_emulated_run;

static void run_captured(void *user)
{
    aj_emulated_run *r = user;
    if (r->run(r) != AJ_OK)
        fprintf(stderr, "attnjit: an emulated launch replayed from a CUDA graph failed: %s\n",
                aj_last_error(r->ctx));
}

/* Copies n side tensors and their names into the run's slot `which`
 * (NULL past its room, which a call that passed its checks never needs). */
static const aj_side_tensor *keep_side(aj_emulated_run *r, int which, const aj_side_tensor *t,
                                       int32_t n)
{
    aj_side_tensor *to = which ? r->dside : r->side;
    if (n > AJ_OP_TENSORS_MAX + 1)
        return NULL;
    for (int32_t i = 0; i < n; i++) {
        to[i] = t[i];
        snprintf(r->names[which][i], sizeof r->names[which][i], "%s", t[i].name);
        to[i].name = r->names[which][i];
    }
    return n ? to : NULL;
}

/* Queues r on the capturing stream: r, and its twin, are then the
 * device's (on failure r is freed, the twin left to the caller). */
static aj_status emulate_captured(aj_ctx *ctx, aj_device *dev, void *stream, aj_emulated_run *r)
{
    aj_status st = aj_cuda_host_func(ctx, dev->cuda, stream, run_captured, r);
    if (st != AJ_OK) {
        free(r);
        return st;
    }
    r->next = atomic_load(&dev->captured);
    while (!atomic_compare_exchange_weak(&dev->captured, &r->next, r))
        ;
    return AJ_OK;
}

void aj_emulated_runs_free(aj_device *dev)
{
    for (aj_emulated_run *r = atomic_exchange(&dev->captured, NULL), *next; r; r = next) {
        next = r->next;
        aj_kernel_destroy(r->twin);
        free(r);
    }
}

static aj_status run_fwd(aj_emulated_run *r)
{
    return forward_on(r->ctx, r->sim, r->twin, &r->a.fwd);
}

static aj_status run_bwd(aj_emulated_run *r)
{
    return backward_on(r->ctx, r->sim, r->twin, &r->a.bwd, r->sinks_only);
}

static aj_status run_merge(aj_emulated_run *r)
{
    return merge_on(r->ctx, r->sim, r->twin, &r->a.merge);
}

static aj_status run_rows(aj_emulated_run *r)
{
    return rows_on(r->ctx, r->sim, r->twin, r->a.rows.stage, &r->a.rows.o, &r->a.rows.acc,
                   r->a.rows.has_lse ? &r->a.rows.lse : NULL, r->a.rows.stream);
}

/* Runs twin run r (heap; its ctx, sim, twin, run and arguments filled)
 * on the emulator now, then frees it and its twin; or, inside a capture on
 * `stream`, queues it as a host node each replay runs (r and its twin are
 * then the device's). */
static aj_status run_or_capture(aj_ctx *ctx, aj_device *dev, void *stream, aj_emulated_run *r)
{
    aj_kernel *twin = r->twin;
    bool capturing = false;
    aj_status st = aj_cuda_capturing(ctx, dev->cuda, stream, &capturing);
    if (st == AJ_OK && capturing) {
        st = emulate_captured(ctx, dev, stream, r);   /* (r freed on a failure) */
        if (st != AJ_OK)
            aj_kernel_destroy(twin);
        return st;
    }
    if (st == AJ_OK)
        st = r->run(r);
    aj_kernel_destroy(twin);
    free(r);
    return st;
}

/* A run record of `twin` (st: how making it went) on dev's twin device;
 * on a failure *out is NULL, the twin freed and the failure on ctx. */
static aj_status new_run(aj_ctx *ctx, aj_device *dev, aj_kernel *twin, aj_status st,
                         aj_emulated_run **out)
{
    *out = st == AJ_OK ? calloc(1, sizeof **out) : NULL;
    if (!*out) {
        aj_kernel_destroy(twin);
        return st != AJ_OK ? st : aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    }
    (*out)->ctx = ctx, (*out)->sim = dev->twin, (*out)->twin = twin;
    return AJ_OK;
}

/* `keep` fills r_ (its run and arguments) from on_sim. */
#define EMULATE(fn, type, last_required, NAME, keep, ...)                                     \
    do {                                                                                      \
        AJ_READ_STRUCT_OR_RETURN(ctx, fn ": args", given, type, last_required,                \
                                 AJ_##NAME##_INIT, args);                                     \
        type on_sim = *args;   /* (its stream: the sim ignores it, its accesses name it) */  \
        __VA_ARGS__;                                                                          \
        aj_kernel *twin = NULL;                                                               \
        aj_emulated_run *r_ = NULL;                                                           \
        aj_status emu_st = aj_compile_twin(ctx, kernel, &twin);                               \
        emu_st = new_run(ctx, dev, twin, emu_st, &r_);                                        \
        if (emu_st != AJ_OK)                                                                  \
            return emu_st;                                                                    \
        keep;                                                                                 \
        return run_or_capture(ctx, dev, args->stream, r_);                                    \
    } while (0)

/* A row kernel's launch again on the emulator (the ring's sums): now, or
 * inside a capture at each replay, as emulate_forward does. */
static aj_status emulate_rows(aj_ctx *ctx, aj_device *dev, const aj_kernel *rows, int stage,
                              const aj_tensor *o, const aj_tensor *acc, const aj_tensor *lse,
                              void *stream)
{
    aj_kernel *twin = NULL;
    aj_emulated_run *r = NULL;
    aj_status st = aj_compile_rows(ctx, AJ_TARGET_SIM, rows->op.dtype, rows->op.head_dim_v,
                                   &twin);
    AJ_TRY(new_run(ctx, dev, twin, st, &r));
    r->run = run_rows;
    r->a.rows.stage = stage, r->a.rows.o = *o, r->a.rows.acc = *acc;
    r->a.rows.has_lse = lse != NULL, r->a.rows.stream = stream;
    if (lse)
        r->a.rows.lse = *lse;
    return run_or_capture(ctx, dev, stream, r);
done:
    return st;
}

static aj_status emulate_forward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                                 const aj_fwd_args *given)
{
    EMULATE("aj_forward", aj_fwd_args, lse, FWD_ARGS,
            (r_->run = run_fwd, r_->a.fwd = on_sim,
             r_->a.fwd.side = keep_side(r_, 0, on_sim.side, on_sim.num_side)),
            on_sim.block_mask = NULL);
}

static aj_status emulate_backward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                                  const aj_bwd_args *given, bool sinks_only)
{
    EMULATE("aj_backward", aj_bwd_args, dv, BWD_ARGS,
            (r_->run = run_bwd, r_->sinks_only = sinks_only, r_->a.bwd = on_sim,
             r_->a.bwd.side = keep_side(r_, 0, on_sim.side, on_sim.num_side),
             r_->a.bwd.dside = keep_side(r_, 1, on_sim.dside, on_sim.num_dside)),
            on_sim.block_mask = NULL; on_sim.workspace = NULL; on_sim.workspace_bytes = 0);
}

static aj_status emulate_merge(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                               const aj_merge_args *given)
{
    EMULATE("aj_merge", aj_merge_args, lse, MERGE_ARGS,
            (r_->run = run_merge, r_->a.merge = on_sim), (void)0);
}

aj_status aj_forward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                     const aj_fwd_args *given)
{
    aj_status st = forward_on(ctx, dev, kernel, given);
    return st == AJ_OK && dev->twin ? emulate_forward(ctx, dev, kernel, given) : st;
}

aj_status aj_backward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                      const aj_bwd_args *given)
{
    aj_status st = backward_on(ctx, dev, kernel, given, false);
    return st == AJ_OK && dev->twin ? emulate_backward(ctx, dev, kernel, given, false) : st;
}

aj_status aj_backward_sinks(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                            const aj_bwd_args *args)
{
    aj_status st = backward_on(ctx, dev, kernel, args, true);
    return st == AJ_OK && dev->twin ? emulate_backward(ctx, dev, kernel, args, true) : st;
}

aj_status aj_merge(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                   const aj_merge_args *given)
{
    aj_status st = merge_on(ctx, dev, kernel, given);
    return st == AJ_OK && dev->twin ? emulate_merge(ctx, dev, kernel, given) : st;
}
