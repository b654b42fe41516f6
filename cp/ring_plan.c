/*
 * ring_plan.c -- planning and classification of a ring call (ring_plan.h):
 * checks, lengths and chunks, the ranks' agreement on the call, each
 * step's block pairs classed skip / full / partial by the score programs'
 * host intervals, and aj_ring_plan, the schedule made public.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cp/ring_plan.h"
#include "ir/diag.h"

/* ---------------------------------------------------------------- masks */

/* Which of a block's (query, key) pairs the mask shows, for every batch
 * index and head: the class the kernels' own tile classification gives
 * (templates/score.h), so a skipped block is one no kernel would touch and
 * a full block runs the kernel without the mask. */
static aj_ring_block classify(const ring_plan *p, int32_t doc, int64_t q0, int64_t nq,
                              int64_t k0, int64_t nk, int64_t sq, int64_t sk)
{
    if (nq == 0 || nk == 0)
        return AJ_RING_BLOCK_SKIP;
    if (!aj_score_has_mask(&p->prog))
        return AJ_RING_BLOCK_FULL;
    /* a mask that tells batch indices (heads) apart, through a side
     * tensor, is classed per b (h): the block is skipped where every one
     * skips it, full where every one sees all of it */
    /* (packed documents: b is the pair's document) */
    const int64_t nb = p->prog.mask_reads_b && !p->sh.varlen ? p->B : 1;
    const int64_t nh = p->prog.mask_reads_h ? p->Hq : 1;
    int skip = 1, full = 1;
    for (int64_t b = 0; b < nb && (skip || full); b++)
        for (int64_t h = 0; h < nh && (skip || full); h++) {   /* the global heads */
            aj_tile_class c = aj_score_host_class(&p->prog, p->host_side, p->cache,
                                                  !p->prog.mask_reads_b ? -1
                                                  : p->sh.varlen        ? doc
                                                                        : b,
                                                  p->prog.mask_reads_h ? p->head_offset + h : -1,
                                                  q0, q0 + nq - 1, k0, k0 + nk - 1, sq, sk);
            skip &= c == AJ_TILE_SKIP;
            full &= c == AJ_TILE_FULL;
        }
    return skip ? AJ_RING_BLOCK_SKIP : full ? AJ_RING_BLOCK_FULL : AJ_RING_BLOCK_PARTIAL;
}

/* The rank whose K/V block a step computes with: p2p receives them from
 * rank r-1 one by one (r, r-1, r-2, ...); all-gather has them all and
 * goes in rank order. */
int aj_ring_step_src(const ring_plan *p, int step)
{
    return p->rotate == AJ_ROTATE_P2P ? (p->rank + p->size - step) % p->size : step;
}

/* Ring rank r's chunks of a `seq`-long sequence: its own shard's, or
 * (method = hybrid) its group's (aj_shard_group_chunks). */
static aj_status ring_chunks(const ring_plan *p, int r, int64_t seq, aj_shard_chunk c[2],
                             int *n)
{
    return aj_shard_group_chunks(p->ctx, p->fn, p->layout, r, p->size, p->members, seq, c, n);
}

static int64_t ring_length(const ring_plan *p, int r, int64_t seq)
{
    aj_shard_chunk c[2];
    int n = 0;
    ring_chunks(p, r, seq, c, &n);
    return n == 1 ? c[0].len : c[0].len + c[1].len;
}

/* The longest chunk of any ring rank: the first S % n of n chunks are one
 * longer, and a hybrid group's run spans U of them. */
int64_t aj_ring_longest_chunk(const ring_plan *p, int64_t seq)
{
    int64_t most = 0;
    for (int r = 0; r < p->size; r++) {
        aj_shard_chunk c[2];
        int n = 0;
        ring_chunks(p, r, seq, c, &n);
        for (int i = 0; i < n; i++)
            most = c[i].len > most ? c[i].len : most;
    }
    return most;
}

/* The step's (query chunk, key chunk) pairs, in launch order, with their
 * classes, into p->pairs: the ring's schedule (aj_ring_plan), which the
 * forward and the backward both follow.  Packed documents: each
 * document's pieces (the layout's chunks of the document) of this rank
 * against src's of the same document only -- a pair from two documents
 * sees nothing and is never formed -- and no pair with an empty piece. */
static aj_status plan_pairs(const ring_plan *p, int rank, int src, int step, int *n)
{
    const bool varlen = p->sh.varlen;
    int64_t q_at = 0, k_at = 0;   /* the document's first local positions */
    *n = 0;
    for (int32_t d = 0; d < (varlen ? p->docs.batch : 1); d++) {
        const int64_t sq = varlen ? p->docs.cu_q[d + 1] - p->docs.cu_q[d] : p->sq;
        const int64_t sk = varlen ? p->docs.cu_k[d + 1] - p->docs.cu_k[d] : p->sk;
        aj_shard_chunk qc[2], kc[2];
        int nq = 0, nk = 0;
        aj_status st = ring_chunks(p, rank, sq, qc, &nq);
        if (st == AJ_OK)
            st = ring_chunks(p, src, sk, kc, &nk);
        if (st != AJ_OK)
            return st;
        for (int i = 0; i < nq; i++)
            for (int j = 0; j < nk; j++) {
                if (varlen && (qc[i].len == 0 || kc[j].len == 0))
                    continue;
                ring_pair x = {.step = step, .src = src, .doc = d, .q = qc[i], .k = kc[j],
                               .sq = sq, .sk = sk};
                x.q.local += q_at;
                x.k.local += k_at;
                x.block = classify(p, d, x.q.global, x.q.len, x.k.global, x.k.len, sq, sk);
                p->pairs[(*n)++] = x;
            }
        q_at += ring_length(p, rank, sq);
        k_at += ring_length(p, src, sk);
    }
    return AJ_OK;
}

aj_status aj_ring_plan_step(const ring_plan *p, int step, int *n)
{
    return plan_pairs(p, p->rank, aj_ring_step_src(p, step), step, n);
}

/* Whether rank r needs rank o's K/V block (plan_needs), and how far
 * around the ring o's block must go. */
bool aj_ring_needs(const ring_plan *p, int r, int o)
{
    return r == o || !p->need || p->need[r * p->size + o];
}

int aj_ring_reach_of(const ring_plan *p, int o)
{
    return p->reach ? p->reach[o] : p->size - 1;
}

/*
 * Packed documents leave ranks that need none of a peer's keys: a
 * document shorter than 2P has no piece on some ranks, a window sees
 * only nearby pieces, contiguous causal pieces never see later ranks'.
 * From every (rank, origin) pair's classes (plan_pairs, which every rank
 * computes alike from the agreed documents) the ring moves only what a
 * rank needs:
 *
 *   p2p        origin o's block travels o -> o+1 -> ... -> o+reach[o]
 *              and no further (a rank inside that reach that needs none
 *              of it still relays it); each rank sends its dK/dV part of
 *              block o straight home to o, where o sums them, and only
 *              where it needs the block
 *   all-gather an all-to-all gathers the blocks a rank needs, another
 *              returns the dK/dV parts to their homes
 *
 *   docs 1, 1, 1, 1 (one piece each), P = 4, contiguous causal:
 *   rank 0: doc 0    every need[r][o] is false for r != o: nothing
 *   rank 1: doc 1    travels (padded sequences: every block, the
 *   ...              rotations the header describes)
 */
static aj_status plan_needs(ring_plan *p)
{
    const int P = p->size;
    if (!p->sh.varlen || P < 2)
        return AJ_OK;
    p->need = calloc((size_t)P * (size_t)P, sizeof *p->need);
    p->reach = calloc((size_t)P, sizeof *p->reach);
    if (!p->need || !p->reach)
        return aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    for (int r = 0; r < P; r++)
        for (int o = 0; o < P; o++) {
            int n = 0;
            const aj_status st = plan_pairs(p, r, o, 0, &n);
            if (st != AJ_OK)
                return st;
            for (int i = 0; i < n; i++)
                p->need[r * P + o] |= p->pairs[i].block != AJ_RING_BLOCK_SKIP;
            const int dist = (r - o + P) % P;
            if (p->need[r * P + o] && dist > p->reach[o])
                p->reach[o] = dist;
        }
    return AJ_OK;
}

/* ---------------------------------------------------------------- set-up */

/* The op's checks (aj_cp_check_op) and its mask program, and the rotate
 * method. */
static aj_status plan_op(ring_plan *p, const aj_op *op)
{
    AJ_CHECK_ARG(p->ctx, (unsigned)p->rotate < AJ_ROTATE_COUNT,
                 "%s: rotate = %d is not a rotate method", p->fn, (int)p->rotate);
    return aj_cp_check_op(p->ctx, p->fn, op, &p->op, &p->prog);
}

/* Rank r's query (keys: key) positions: the layout's shard of the
 * totals, or of each packed document. */
int64_t aj_ring_shard_len(const ring_plan *p, int r, int keys)
{
    if (!p->sh.varlen)
        return ring_length(p, r, keys ? p->sk : p->sq);
    const int32_t *cu = keys ? p->docs.cu_k : p->docs.cu_q;
    int64_t len = 0;
    for (int32_t d = 0; d < p->docs.batch; d++)
        len += ring_length(p, r, cu[d + 1] - cu[d]);
    return len;
}

/* The global lengths, the K/V slots and room for a step's pairs: any
 * length, every rank's shard shard_len of the totals.  The buffers that
 * travel hold a block in a slot of the longest shard's size; a block's
 * own length (kv_tensors) bounds what the kernels read, so the slot's
 * tail is never attended. */
static aj_status plan_chunks(ring_plan *p, int64_t sq, int64_t sk)
{
    p->sq = sq;
    p->sk = sk;
    p->lk_max = 0;
    for (int r = 0; r < p->size; r++) {
        const int64_t l = aj_ring_shard_len(p, r, 1);
        p->lk_max = l > p->lk_max ? l : p->lk_max;
    }
    p->k_elems = (size_t)(p->B * p->Hkv * p->lk_max * p->D);
    p->v_elems = (size_t)(p->B * p->Hkv * p->lk_max * p->Dv);
    const size_t pairs = 4 * (size_t)(p->sh.varlen ? p->docs.batch : 1);
    p->pairs = calloc(pairs, sizeof *p->pairs);
    if (p->doc_kernels)
        p->doc_cu_at = calloc(pairs, sizeof *p->doc_cu_at);
    if (!p->pairs || (p->doc_kernels && !p->doc_cu_at))
        return aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    return plan_needs(p);
}

/* The checks both directions share: handles, the op, q, k, v and the
 * shapes they imply (the lengths and chunks wait for the agreement). */
static aj_status plan_common(ring_plan *p, aj_ctx *ctx, aj_device *dev, aj_comm *comm,
                             const aj_op *op, aj_kind kind, aj_shard_layout layout,
                             aj_ring_rotate rotate, const aj_tensor *q, const aj_tensor *k,
                             const aj_tensor *v, const int32_t *cu_q, const int32_t *cu_k,
                             int32_t batch, aj_ring_stats *stats)
{
    p->ctx = ctx;
    p->rotate = rotate;
    AJ_CHECK_ARG(ctx, (unsigned)rotate < AJ_ROTATE_COUNT,
                 "%s: rotate = %d is not a rotate method", p->fn, (int)rotate);
    aj_cp_shapes sh;
    const aj_status st = aj_cp_check_call(ctx, p->fn, dev, comm, op, kind, layout, q, k, v,
                                          &p->op, &p->prog, &sh);
    if (st != AJ_OK)
        return st;
    /* packed documents: a launch of one piece of a document against
     * another as a padded batch of one (aj_cp_as_padded) has batch index
     * 0; dropout (the Philox counter holds b) and expressions reading b
     * need the document's, which the varlen kernel gives (doc_launch) */
    p->doc_kernels = sh.varlen && (p->op.dropout > 0 || aj_cp_reads(&p->prog, AJ_VAR_B));
    p->sh = sh;
    if (sh.varlen) {
        const aj_status docs_st = aj_cp_read_docs(ctx, p->fn, dev, cu_q, cu_k, batch, &p->docs);
        if (docs_st != AJ_OK)
            return docs_st;
    }
    p->dev = dev;
    aj_device_caps caps = AJ_DEVICE_CAPS_INIT;
    const aj_status caps_st = aj_device_get_caps(dev, &caps);
    if (caps_st != AJ_OK)
        return caps_st;
    p->host_memory = caps.host_memory;
    p->resident = aj_cp_resident(dev, comm);
    p->comm = comm;
    p->layout = layout;
    p->rank = comm->rank;
    p->size = comm->size;
    p->members = 1;
    p->stats = stats;
    p->elem = aj_dtype_size(p->op.dtype);
    p->B = sh.B;
    p->Hq = sh.Hq;
    p->Hkv = sh.Hkv;
    p->D = sh.D;
    p->Dv = sh.Dv;
    p->lq = sh.lq;
    p->lk = sh.lk;
    return AJ_OK;
}

/* The side tensors (whole on every rank: the kernels read them at global
 * positions) in host memory, for the blocks' classes. */
static aj_status plan_side(ring_plan *p, const aj_side_tensor *side, int32_t num_side,
                           const aj_tensor *slopes)
{
    aj_status st = aj_side_check_names(p->ctx, p->fn, &p->op, side, num_side);
    if (st != AJ_OK || p->prog.tensor_count == 0)
        return st;
    p->cache = calloc(1, sizeof *p->cache);
    if (!p->cache)
        return aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    return aj_side_to_host(p->ctx, p->dev, p->fn, &p->prog, side, num_side, slopes,
                           p->host_side, p->host_mem);
}

void aj_ring_plan_free(ring_plan *p)
{
    aj_score_prog_free(&p->prog);
    for (int t = 0; t < AJ_OP_TENSORS_MAX + 1; t++)
        free(p->host_mem[t]);
    free(p->cache);
    free(p->pairs);
    free(p->need);
    free(p->reach);
    free(p->doc_cu_host);
    free(p->doc_cu_at);
    if (p->doc_cu)
        aj_device_free(p->dev, p->doc_cu);
    aj_cp_docs_free(&p->docs);
    aj_kernel_destroy(p->rows_d);
    aj_kernel_destroy(p->rows_dv);
    aj_kernel_destroy(p->rows_flat);
}

/* ---------------------------------------------------------------- the plan */

aj_status aj_ring_plan(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                       const aj_ring_plan_args *given, aj_ring_pair *pairs, int32_t cap,
                       int32_t *count)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_READ_STRUCT_OR_RETURN(ctx, "aj_ring_plan: args", given, aj_ring_plan_args, seq_k,
                             AJ_RING_PLAN_ARGS_INIT, args);
    ring_plan p = {.fn = "aj_ring_plan", .ctx = ctx, .dev = dev, .layout = args->layout,
                   .rotate = args->rotate, .rank = args->rank, .size = args->size,
                   .members = args->members > 1 ? args->members : 1, .B = args->batch,
                   .Hq = args->heads_q, .lq = args->seq_q, .lk = args->seq_k,
                   .head_offset = args->head_offset};
    AJ_CHECK_ARG(ctx, dev, "aj_ring_plan: dev is NULL");
    AJ_CHECK_ARG(ctx, count, "aj_ring_plan: count is NULL");
    AJ_CHECK_ARG(ctx, cap >= 0 && (cap == 0 || pairs), "aj_ring_plan: cap = %d with pairs "
                 "%s; want a count of 0 or more, and the array when it is not 0", cap,
                 pairs ? "given" : "NULL");
    AJ_CHECK_ARG(ctx, args->batch >= 1 && args->heads_q >= 1, "aj_ring_plan: batch = %lld, "
                 "heads_q = %lld; want at least 1", (long long)args->batch,
                 (long long)args->heads_q);
    AJ_CHECK_ARG(ctx, args->seq_q >= 0 && args->seq_k >= 0, "aj_ring_plan: seq_q = %lld, "
                 "seq_k = %lld; want lengths of 0 or more", (long long)args->seq_q,
                 (long long)args->seq_k);
    AJ_CHECK_ARG(ctx, args->members >= 0 && args->head_offset >= 0, "aj_ring_plan: members "
                 "= %d, head_offset = %lld; want 0 or more", (int)args->members,
                 (long long)args->head_offset);
    aj_status st = AJ_OK;
    AJ_TRY(plan_op(&p, op));
    if (p.op.layout == AJ_LAYOUT_VARLEN) {
        /* packed documents: the pieces of every document (one position
         * batch, b the document) */
        p.sh.varlen = true;
        p.B = 1;
        AJ_TRY(aj_cp_read_docs(ctx, p.fn, dev, args->cu_seqlens_q, args->cu_seqlens_k,
                               (int32_t)args->batch, &p.docs));
        AJ_TRY(plan_chunks(&p, p.docs.cu_q[p.docs.batch], p.docs.cu_k[p.docs.batch]));
    } else {
        /* one rank's lengths tell the totals only when every shard is as
         * long (a hybrid group's first member stands for the group) */
        const int P = p.size * p.members;
        aj_shard_chunk c[2];
        int nc = 0;
        AJ_CHECK_ARG(ctx, p.rank >= 0 && p.rank < p.size, "aj_ring_plan: rank = %d is outside "
                     "0 .. %d", p.rank, p.size - 1);
        AJ_TRY(aj_shard_chunks(ctx, p.fn, p.layout, p.rank * p.members, P, p.lq * P, c, &nc));
        AJ_TRY(aj_shard_chunks(ctx, p.fn, p.layout, p.rank * p.members, P, p.lk * P, c, &nc));
        AJ_TRY(plan_chunks(&p, p.lq * P, p.lk * P));
    }
    AJ_TRY(plan_side(&p, args->side, args->num_side, &args->alibi_slopes));
    *count = 0;
    for (int s = 0; s < p.size; s++) {
        int n = 0;
        AJ_TRY(aj_ring_plan_step(&p, s, &n));
        for (int i = 0; i < n; i++, ++*count)
            if (*count < cap) {
                const ring_pair *x = &p.pairs[i];
                pairs[*count] = (aj_ring_pair){.step = x->step, .src = x->src, .q = x->q,
                                               .k = x->k, .block = x->block, .doc = x->doc};
            }
    }
done:
    aj_ring_plan_free(&p);
    return st;
}

aj_status aj_ring_collective_status(const ring_plan *p, aj_status st)
{
    return aj_cp_collective_status(p->ctx, p->fn, st);
}

/* What every rank's call must agree on, in the order of call_fields;
 * NULL names: the rank's own lengths, the shards of the totals. */
enum { CALL_FIELDS = 16, FIELD_LQ = 5, FIELD_LK = 6 };
static const char *const call_fields[CALL_FIELDS] = {
    "method", "kind", "batch", "q heads", "kv heads", NULL, NULL, "head_dim",
    "head_dim_v", "layout", "rotate", "seed", "offset", "side tensor shapes (a digest)",
    "host-memory device (cpu, sim: 1)", "cu_seqlens (a digest)"};

/* A digest (FNV-1a) of the side tensors' shapes: ranks whose side tensors
 * differ in size would read different data at the same positions. */
static int64_t side_shapes_digest(const ring_plan *p)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int t = 0; t < p->prog.tensor_count; t++)
        for (int k = 0; k < p->host_side[t].rank; k++) {
            h ^= (uint64_t)p->host_side[t].shape[k];
            h *= 0x100000001b3ull;
        }
    return (int64_t)h;
}

/* Every rank's call must match rank 0's (aj_cp_agree), its lengths the
 * layout's shards of the totals; then the plan's lengths and chunks. */
static aj_status agree_on_call(ring_plan *p, const aj_op *op, aj_ring_rotate rotate,
                               uint64_t seed, uint64_t offset)
{
    int64_t mine[CALL_FIELDS] = {AJ_METHOD_RING, p->op.kind, p->B, p->Hq, p->Hkv, p->lq, p->lk,
                                 p->D, p->Dv, p->layout, rotate, (int64_t)seed,
                                 (int64_t)offset, side_shapes_digest(p), p->host_memory,
                                 p->docs.digest};
    if (p->op.dropout == 0)
        mine[11] = mine[12] = 0;   /* no dropout: the stream is unused */
    int64_t *all = calloc((size_t)p->size * CALL_FIELDS, sizeof *all);
    if (!all)
        return aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    aj_status st = aj_cp_agree(p->ctx, p->comm, p->fn, op, CALL_FIELDS, call_fields, mine,
                               p->async, all);
    int64_t sq = 0, sk = 0;
    if (st == AJ_OK && !p->sh.varlen)
        st = aj_cp_check_lengths(p->ctx, p->fn, p->layout, p->size, all, CALL_FIELDS,
                                 FIELD_LQ, FIELD_LK, &sq, &sk);
    if (st == AJ_OK && p->sh.varlen) {   /* each rank's pieces of every document */
        sq = p->docs.cu_q[p->docs.batch];
        sk = p->docs.cu_k[p->docs.batch];
        for (int r = 0; r < p->size && st == AJ_OK; r++) {
            const int64_t lq = all[r * CALL_FIELDS + FIELD_LQ];
            const int64_t lk = all[r * CALL_FIELDS + FIELD_LK];
            if (lq != aj_ring_shard_len(p, r, 0) || lk != aj_ring_shard_len(p, r, 1))
                st = aj_fail(p->ctx, AJ_ERR_INVALID_ARG, "%s: rank %d holds %lld query and "
                             "%lld key positions; its pieces of the packed documents are %lld "
                             "and %lld (aj_shard_varlen_chunks, method = ring)", p->fn, r,
                             (long long)lq, (long long)lk, (long long)aj_ring_shard_len(p, r, 0),
                             (long long)aj_ring_shard_len(p, r, 1));
        }
    }
    free(all);
    return st == AJ_OK ? plan_chunks(p, sq, sk) : st;
}

/* One variant of the op compiled for the device: with or without its
 * mask, accumulate-mode for the forward, padded. */

/* The call's lengths and chunks: agreed by the ranks, or (method =
 * hybrid, which agreed already) the group's. */
static aj_status plan_lengths(ring_plan *p, const aj_op *op, const aj_ring_group *group,
                              aj_ring_rotate rotate, uint64_t seed, uint64_t offset)
{
    if (!group)
        return agree_on_call(p, op, rotate, seed, offset);
    p->members = group->members;
    p->stream = group->stream;
    p->head_offset = group->head_offset;
    p->heads_q_total = group->heads_q_total;
    return plan_chunks(p, group->sq, group->sk);
}

aj_status aj_ring_plan_forward(ring_plan *p, aj_ctx *ctx, aj_device *dev, aj_comm *comm,
                               const aj_op *op, const aj_ring_fwd_args *a,
                               const aj_ring_group *group, aj_ring_stats *stats)
{
    aj_status st = AJ_OK;
    p->async = a->stream != NULL;
    AJ_TRY(plan_common(p, ctx, dev, comm, op, AJ_KIND_FORWARD, a->layout, a->rotate, &a->q,
                       &a->k, &a->v, a->cu_seqlens_q, a->cu_seqlens_k, a->batch, stats));
    AJ_TRY(aj_cp_check_fwd_outputs(ctx, p->fn, p->op.dtype, &p->sh, &a->o, &a->lse));
    AJ_TRY(plan_side(p, a->side, a->num_side, &a->alibi_slopes));
    AJ_CHECK_ARG(ctx, a->launch_tiles_cap >= 0 && (a->launch_tiles_cap == 0 || a->launch_tiles),
                 "%s: launch_tiles_cap = %d with launch_tiles %s; want a count of 0 or more, "
                 "and the array when it is not 0", p->fn, a->launch_tiles_cap,
                 a->launch_tiles ? "given" : "NULL");
    AJ_TRY(plan_lengths(p, op, group, a->rotate, a->seed, a->offset));
done:
    return st;
}

aj_status aj_ring_plan_backward(ring_plan *p, aj_ctx *ctx, aj_device *dev, aj_comm *comm,
                                const aj_op *op, const aj_ring_bwd_args *a,
                                const aj_ring_group *group, aj_ring_stats *stats)
{
    aj_status st = AJ_OK;
    p->async = a->stream != NULL;
    AJ_TRY(plan_common(p, ctx, dev, comm, op, AJ_KIND_BACKWARD, a->layout, a->rotate, &a->q,
                       &a->k, &a->v, a->cu_seqlens_q, a->cu_seqlens_k, a->batch, stats));
    AJ_TRY(aj_cp_check_bwd_outputs(ctx, p->fn, p->op.dtype, &p->sh, &a->o, &a->do_, &a->lse,
                                   &a->dq, &a->dk, &a->dv));
    AJ_TRY(plan_side(p, a->side, a->num_side, &a->alibi_slopes));
    AJ_TRY(plan_lengths(p, op, group, a->rotate, a->seed, a->offset));
done:
    return st;
}
