/*
 * ulysses.c -- method = ulysses (DeepSpeed Ulysses): context parallelism
 * by all-to-all, entered from aj_ring_forward and aj_ring_backward.
 *
 * Every rank holds a sequence shard of every head (shard.c's layouts, any
 * length).  An all-to-all trades it for every position of P-th of the
 * heads:
 *
 *   rank r before:  X[B, H, l_r, W]      its positions, every head
 *          sends    X[:, heads of d, :, :] to each rank d
 *          gets     from each rank s: s's positions of r's heads
 *   rank r after:   X[B, H/P, S, W]      heads r H/P .. (r+1) H/P - 1,
 *                                        the whole sequence in order
 *
 * The op's own kernel then runs once over the whole sequence (offsets 0,
 * totals S), so every mask, score_mod, expression and side tensor sees
 * exactly what one rank would; a second all-to-all sends the positions
 * back.  Query head h reads key/value head h / (Hq/Hkv), and a rank gets
 * key/value heads r Hkv/P .. and their query heads r Hq/P .., whole GQA
 * groups: the backward's dK/dV sum over a group inside the kernel, as on
 * one rank.  Hence Hkv must divide by P.
 *
 * The kernel's heads 0 .. H/P - 1 are the op's heads r H/P ..: the
 * launch says so (aj_fwd_args.head_offset = r H/P, heads_q_total = H), so
 * an expression's h, alibi's slopes[h] (the caller's whole tensor) and
 * dropout's Philox counter (b H + h) see the global head, and the rank
 * computes its heads exactly as the unsharded op does.
 *
 * Bytes: an all-to-all of a [B, H, S, W] tensor sends (P-1)/P of the
 * rank's B H (S/P) W shard and receives as much; forward q, k, v in and
 * o, lse out, backward q, k, v, o, do, lse in and dq, dk, dv out
 * (docs/ring.md has the formula per direction).
 *
 * method = hybrid (P = U x R) runs the same all-to-all inside groups of U
 * consecutive ranks (hybrid.c's sub-communicators): a rank gets H/U heads
 * of its group's positions (aj_shard_group_chunks: one run, or a head and
 * a tail run), and between the two all-to-alls the ring (ring.c) runs
 * across the R groups instead of one kernel, each group one ring rank:
 *
 *   rank (g, u):  [B, H, l_r, W] --all-to-all in group g--> [B, H/U, L_g, W]
 *                 ring over the ranks (0, u) .. (R-1, u): K/V of H/U heads
 *                 [B, H/U, L_g, W] --all-to-all in group g--> [B, H, l_r, W]
 *
 * U = P is Ulysses, U = 1 the ring (with an all-to-all of one rank).
 *
 * Packed documents (layout = varlen), method = ulysses: a shard is the
 * layout's cut of the packed axis, [l_r, H, W]; the all-to-all trades it
 * for [S, H/P, W], the packed batch whole, and the kernel runs once over
 * the caller's cu_seqlens.  method = hybrid: a shard is the ring's cut of
 * each document over the P ranks (aj_shard_varlen_chunks), so group g
 * holds, document by document, the group runs of that document (the
 * ring's pieces of it for ring rank g of R with U members); the
 * all-to-all gathers them, [L_g, H/U, W], and the varlen ring runs across
 * the groups on them as on its own pieces:
 *
 *   P = 4, U = 2, zigzag: each document d in 8 chunks d[0] .. d[7]
 *   rank 0: a[0] a[7] b[0] b[7]     group 0 = ranks 0, 1:
 *   rank 1: a[1] a[6] b[1] b[6]     a[0 1] a[6 7] b[0 1] b[6 7]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"
#include "cp/comm/comm.h"
#include "cp/cp.h"
#include "runtime/runtime.h"

/* What a Ulysses call knows once its arguments check out. */
typedef struct uly_plan {
    aj_ctx *ctx;
    aj_device *dev;
    aj_comm *comm;
    const char *fn;
    aj_cp_method method;         /* ulysses, or hybrid */
    aj_comm *a2a;                /* the all-to-all's ranks: comm, or hybrid's group */
    aj_comm *across;             /* hybrid: the ring across the groups; NULL: ulysses */
    int members, first;          /* the group's size U (P: ulysses) and first rank */
    aj_shard_chunk *runs_q, *runs_k;   /* the group's positions, in its local order */
    int32_t nruns_q, nruns_k;
    aj_shard_chunk *member;      /* room for one rank's chunks (member_chunks) */
    int per_doc;                 /* hybrid over packed documents: cut document by document */
    int64_t gq, gk;              /* their counts: the head shards' lengths */
    aj_op_info op;
    aj_score_prog prog;
    aj_shard_layout layout;
    int rank, size;
    aj_cp_shapes sh;
    int64_t sq, sk;              /* the global lengths */
    int64_t *len_q, *len_k;      /* every rank's lengths, [size] each */
    int64_t hq, hkv;             /* heads per rank */
    size_t elem;                 /* bytes per element of the op's dtype */
    aj_cp_docs docs;             /* layout = varlen: the packed batch's documents */
    aj_ring_stats *stats;
    void *stream;                /* the comm's compute stream (NULL: sim, cpu) */
    /* cuda ranks over an engine that moves device memory (NCCL): the
     * all-to-alls move device buffers and the shards never leave the
     * device (cp/ring.c's `resident`) */
    bool resident;
    bool async;                  /* as cp/ring_plan.h's */
} uly_plan;

/* One tensor through an all-to-all, in host memory: its sequence shard
 * `seq` [B, H, l_rank, W] and its head shard `heads` [B, H/P, S, W]. */
typedef struct uly_tensor {
    void *seq, *heads;
    int64_t H, W;
    size_t elem;
    int keys;                    /* positions of k (else of q) */
    int packed;                  /* varlen's [l, H, W] (else [B, H, l, W]; an LSE is
                                    [B, H, l] or varlen's [H, l], B = 1) */
} uly_tensor;

static size_t dtype_size(aj_dtype d)
{
    return d == AJ_DTYPE_F32 ? 4 : 2;
}

/* ---------------------------------------------------------------- set-up */

/* The call fields every rank must agree on; NULL names: the rank's own
 * lengths. */
enum { ULY_FIELDS = 16, FIELD_LQ = 5, FIELD_LK = 6 };
static const char *const uly_fields[ULY_FIELDS] = {
    "method", "kind", "batch", "q heads", "kv heads", NULL, NULL, "head_dim", "head_dim_v",
    "layout", "ulysses_size", "side tensor shapes (a digest)", "rotate",
    "cu_seqlens (a digest)", "seed", "offset"};
static const char *const method_names[AJ_METHOD_COUNT] = {"ring", "ulysses", "hybrid"};

/* A digest (FNV-1a) of the side tensors' shapes in declaration order. */
static int64_t side_digest(const aj_op_info *op, const aj_side_tensor *side, int32_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int t = 0; t < op->num_tensors; t++)
        for (int32_t i = 0; i < n; i++)
            if (strcmp(side[i].name, op->tensors[t].name) == 0)
                for (int d = 0; d < side[i].rank; d++) {
                    h ^= (uint64_t)side[i].shape[d];
                    h *= 0x100000001b3ull;
                }
    return (int64_t)h;
}

/* The group's runs of a `seq`-long axis (per_doc: of each document of
 * cu), in the group's local order, into *runs (allocated; the plan frees
 * it), their number into *n and their total into *total. */
static aj_status group_runs(uly_plan *p, const int32_t *cu, int64_t seq, aj_shard_chunk **runs,
                            int32_t *n, int64_t *total)
{
    const int U = p->members, R = p->size / U;
    const int32_t docs = p->per_doc ? p->docs.batch : 1;
    *n = 0;
    *total = 0;
    *runs = malloc(2 * (size_t)docs * sizeof **runs);
    if (!*runs)
        return aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    for (int32_t d = 0; d < docs; d++) {
        const int64_t start = p->per_doc ? cu[d] : 0;
        const int64_t len = p->per_doc ? cu[d + 1] - cu[d] : seq;
        aj_shard_chunk c[2];
        int nc = 0;
        aj_status st = aj_shard_group_chunks(p->ctx, p->fn, p->layout, p->rank / U, R, U, len,
                                             c, &nc);
        if (st != AJ_OK)
            return st;
        for (int i = 0; i < nc; i++) {
            if (c[i].len == 0)
                continue;
            (*runs)[(*n)++] = (aj_shard_chunk){.global = start + c[i].global, .local = *total,
                                               .len = c[i].len};
            *total += c[i].len;
        }
    }
    return AJ_OK;
}

/* The group's sub-communicators and positions (hybrid; Ulysses: every
 * rank, the whole sequence). */
static aj_status plan_group(uly_plan *p)
{
    aj_status st = AJ_OK;
    p->a2a = p->comm;
    p->first = 0;
    if (p->method == AJ_METHOD_HYBRID) {
        AJ_TRY(aj_cp_split(p->ctx, p->fn, p->comm, p->members, &p->a2a, &p->across));
        p->first = p->rank - p->rank % p->members;
    }
    p->resident = aj_cp_resident(p->dev, p->a2a);
    AJ_TRY(group_runs(p, p->docs.cu_q, p->sq, &p->runs_q, &p->nruns_q, &p->gq));
    AJ_TRY(group_runs(p, p->docs.cu_k, p->sk, &p->runs_k, &p->nruns_k, &p->gk));
done:
    return st;
}

/* Rank r's chunks of the query (keys: key) positions into p->member;
 * returns their number.  The plan checked the arguments already. */
static int32_t member_chunks(const uly_plan *p, int r, int keys)
{
    if (p->per_doc) {
        int32_t n = 0;
        int64_t len = 0;
        aj_shard_varlen_chunks_any(p->ctx, p->fn, p->method, p->layout, r, p->size,
                                   keys ? p->docs.cu_k : p->docs.cu_q, p->docs.batch,
                                   p->member, &n, &len);
        return n;
    }
    int n = 0;
    aj_shard_chunks_any(p->ctx, p->fn, p->layout, r, p->size, keys ? p->sk : p->sq, p->member,
                        &n);
    return n;
}

/* hybrid over packed documents: every rank's lengths must be its pieces
 * of the documents (aj_shard_varlen_chunks); the totals, cu_seqlens'. */
static aj_status check_doc_lengths(uly_plan *p)
{
    p->sq = p->docs.cu_q[p->docs.batch];
    p->sk = p->docs.cu_k[p->docs.batch];
    for (int r = 0; r < p->size; r++) {
        int64_t want[2] = {0, 0};
        for (int keys = 0; keys < 2; keys++) {
            const int32_t n = member_chunks(p, r, keys);
            for (int32_t i = 0; i < n; i++)
                want[keys] += p->member[i].len;
        }
        if (want[0] != p->len_q[r] || want[1] != p->len_k[r])
            return aj_fail(p->ctx, AJ_ERR_INVALID_ARG, "%s: rank %d holds %lld query and %lld "
                           "key positions; its pieces of the packed documents are %lld and "
                           "%lld (aj_shard_varlen_chunks, method = hybrid)", p->fn, r,
                           (long long)p->len_q[r], (long long)p->len_k[r],
                           (long long)want[0], (long long)want[1]);
    }
    return AJ_OK;
}

static aj_status plan_call(uly_plan *p, aj_ctx *ctx, aj_device *dev, aj_comm *comm,
                           const aj_op *op, aj_kind kind, aj_shard_layout layout,
                           aj_cp_method method, int32_t ulysses_size, aj_ring_rotate rotate,
                           const aj_tensor *q, const aj_tensor *k, const aj_tensor *v,
                           const aj_side_tensor *side, int32_t num_side, const int32_t *cu_q,
                           const int32_t *cu_k, int32_t batch, uint64_t seed,
                           uint64_t offset, aj_ring_stats *stats)
{
    aj_status st = aj_cp_check_call(ctx, p->fn, dev, comm, op, kind, layout, q, k, v, &p->op,
                                    &p->prog, &p->sh);
    if (st != AJ_OK)
        return st;
    p->ctx = ctx;
    p->dev = dev;
    p->comm = comm;
    p->layout = layout;
    p->rank = comm->rank;
    p->size = comm->size;
    p->stats = stats;
    p->elem = dtype_size(p->op.dtype);
    p->method = method;
    const aj_cp_shapes *sh = &p->sh;
    const char *name = method_names[method];
    if (method == AJ_METHOD_ULYSSES) {
        AJ_CHECK_ARG(ctx, ulysses_size == 0 || ulysses_size == p->size,
                     "%s: ulysses_size = %d over %d ranks; method = ulysses spans every rank "
                     "(0 or %d)", p->fn, (int)ulysses_size, p->size, p->size);
        p->members = p->size;
    } else {
        AJ_CHECK_ARG(ctx, ulysses_size >= 1 && ulysses_size <= p->size &&
                              p->size % ulysses_size == 0,
                     "%s: ulysses_size = %d over %d ranks; method = hybrid takes the size U "
                     "of its Ulysses groups, from 1 to P, dividing P", p->fn,
                     (int)ulysses_size, p->size);
        AJ_CHECK_ARG(ctx, (unsigned)rotate < AJ_ROTATE_COUNT,
                     "%s: rotate = %d is not a rotate method", p->fn, (int)rotate);
        p->members = ulysses_size;
    }
    if (sh->Hkv % p->members != 0)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: method = %s over %d ranks needs the "
                       "key/value heads (%lld) to divide by %d: each rank computes H_kv / %s "
                       "of them with their query heads; use method = ring", p->fn, name,
                       p->size, (long long)sh->Hkv, p->members,
                       method == AJ_METHOD_ULYSSES ? "P" : "U");
    AJ_TRY(aj_side_check_names(ctx, p->fn, &p->op, side, num_side));
    p->hq = sh->Hq / p->members;
    p->hkv = sh->Hkv / p->members;
    if (sh->varlen)
        AJ_TRY(aj_cp_read_docs(ctx, p->fn, dev, cu_q, cu_k, batch, &p->docs));
    p->per_doc = sh->varlen && method == AJ_METHOD_HYBRID;
    p->member = malloc(2 * (size_t)(p->per_doc ? p->docs.batch : 1) * sizeof *p->member);
    if (!p->member)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);

    /* the opening agreement also gathers every rank's lengths */
    const int64_t mine[ULY_FIELDS] = {method, p->op.kind, sh->B, sh->Hq, sh->Hkv,
                                      sh->lq, sh->lk, sh->D, sh->Dv, layout, p->members,
                                      side_digest(&p->op, side, num_side),
                                      method == AJ_METHOD_HYBRID ? rotate : 0, p->docs.digest,
                                      (int64_t)seed, (int64_t)offset};
    int64_t *all = calloc((size_t)p->size * ULY_FIELDS, sizeof *all);
    p->len_q = calloc(2 * (size_t)p->size, sizeof *p->len_q);
    if (!all || !p->len_q) {
        free(all);
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    }
    p->len_k = p->len_q + p->size;
    st = aj_cp_agree(ctx, comm, p->fn, op, ULY_FIELDS, uly_fields, mine, p->async, all);
    for (int r = 0; r < p->size; r++) {
        p->len_q[r] = all[r * ULY_FIELDS + FIELD_LQ];
        p->len_k[r] = all[r * ULY_FIELDS + FIELD_LK];
    }
    if (st == AJ_OK && p->per_doc)
        st = check_doc_lengths(p);
    else if (st == AJ_OK)   /* every rank's lengths must be the layout's shards of the totals */
        st = aj_cp_check_lengths(ctx, p->fn, layout, p->size, all, ULY_FIELDS, FIELD_LQ,
                                 FIELD_LK, &p->sq, &p->sk);
    free(all);
    if (st == AJ_OK && sh->varlen &&
        (p->sq != p->docs.cu_q[batch] || p->sk != p->docs.cu_k[batch]))
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: the ranks hold %lld query and %lld key "
                     "positions in all; cu_seqlens_q[%d] = %d and cu_seqlens_k[%d] = %d", p->fn,
                     (long long)p->sq, (long long)p->sk, (int)batch, (int)p->docs.cu_q[batch],
                     (int)batch, (int)p->docs.cu_k[batch]);
    if (st == AJ_OK)
        st = plan_group(p);
done:
    return st;
}

/* ---------------------------------------------------------------- memory */

/* Buffers of the all-to-alls and the shards, zeroed: host memory, pinned
 * on cuda, so the copies to and from the device are asynchronous (a copy
 * from pageable memory may wait for the stream inside the driver); or
 * where the call is resident, blocks of device memory the comm keeps
 * (aj_comm_block_get), cleared on the call's stream.  Freed by
 * free_buffer. */
static aj_status alloc_buffer(const uly_plan *p, size_t bytes, void **out)
{
    return aj_cp_buffer(p->dev, p->comm, p->resident, bytes, 1, p->stream, out);
}

static void free_buffer(const uly_plan *p, void *ptr)
{
    aj_cp_buffer_free(p->dev, p->comm, p->resident, ptr);
}

/* Every copy and launch goes on the call's stream, in order; the host
 * waits for it (aj_cp_wait, under the comm's timeout) where it reads what
 * the device wrote, and before it frees or reuses what the device reads --
 * which a resident call never does before its end (its all-to-alls wait
 * for the stream on the device, and the stream for them), and an
 * asynchronous call not even there (`last`: the call's end). */
static aj_status copy(const uly_plan *p, void *dst, const void *src, size_t bytes,
                      int to_device)
{
    return aj_device_copy_async(p->dev, dst, src, bytes, to_device, p->stream);
}

static aj_status wait_dev(const uly_plan *p, const char *what, bool last)
{
    if (p->resident && (!last || p->async))
        return AJ_OK;
    return aj_cp_wait(p->dev, p->stream, p->comm, p->fn, what);
}

/* ---------------------------------------------------------------- all-to-all */

static const int64_t *lengths_of(const uly_plan *p, const uly_tensor *t)
{
    return t->keys ? p->len_k : p->len_q;
}

/* Bytes of one (b, head) row block of `len` positions. */
static size_t row_bytes(const uly_tensor *t, int64_t len)
{
    return (size_t)(len * t->W) * t->elem;
}

/* `height` rows of `width` bytes between x (rows xpitch apart) and y
 * (ypitch apart): x to y with into_buf, else y to x.  Memcpy, or where the
 * call is resident a device copy queued on its stream. */
static aj_status move_rows(const uly_plan *p, char *x, size_t xpitch, char *y, size_t ypitch,
                           size_t width, size_t height, int into_buf)
{
    char *dst = into_buf ? y : x;
    const char *src = into_buf ? x : y;
    const size_t dp = into_buf ? ypitch : xpitch, sp = into_buf ? xpitch : ypitch;
    if (p->resident && height == 1)
        return aj_device_copy_async(p->dev, dst, src, width, AJ_COPY_ON_DEVICE, p->stream);
    if (p->resident)
        return aj_device_copy2d_async(p->dev, dst, dp, src, sp, width, height, p->stream);
    for (size_t r = 0; r < height; r++)
        memcpy(dst + r * dp, src + r * sp, width);
    return AJ_OK;
}

/* Between the sequence shard's heads of group member `peer` and a packed
 * block [B, H/U, l_rank, W] at buf (either way); *bytes: the block's. */
static aj_status seq_block(const uly_plan *p, const uly_tensor *t, int peer, char *buf,
                           int into_buf, size_t *bytes)
{
    const int64_t h = t->H / p->members, l = lengths_of(p, t)[p->rank];
    if (t->packed) {   /* position i's heads of peer: h W elements from (i H + peer h) W */
        const size_t part = row_bytes(t, h), pos = row_bytes(t, t->H);
        *bytes = (size_t)l * part;
        return move_rows(p, (char *)t->seq + (size_t)peer * part, pos, buf, part, part,
                         (size_t)l, into_buf);
    }
    /* batch b's heads peer h .. peer h + h - 1: one run of h rows */
    const size_t row = row_bytes(t, l);
    *bytes = (size_t)(p->sh.B * h) * row;
    return move_rows(p, (char *)t->seq + (size_t)(peer * h) * row, (size_t)t->H * row, buf,
                     (size_t)h * row, (size_t)h * row, (size_t)p->sh.B, into_buf);
}

/* Where global position `pos` sits among the group's positions. */
static int64_t group_local(const aj_shard_chunk *runs, int n, int64_t pos)
{
    for (int i = 0; i < n; i++)
        if (pos >= runs[i].global && pos < runs[i].global + runs[i].len)
            return runs[i].local + pos - runs[i].global;
    return -1;
}

/* Between the head shard's positions of group member `peer` and a packed
 * block [B, H/U, l_peer, W] at buf (either way); *bytes: the block's. */
static aj_status heads_block(const uly_plan *p, const uly_tensor *t, int peer, char *buf,
                             int into_buf, size_t *bytes)
{
    const int64_t h = t->H / p->members;
    const int64_t g = t->keys ? p->gk : p->gq;
    const aj_shard_chunk *runs = t->keys ? p->runs_k : p->runs_q;
    const int32_t nruns = t->keys ? p->nruns_k : p->nruns_q;
    const int64_t l = lengths_of(p, t)[p->first + peer];
    const aj_shard_chunk *c = p->member;
    const int32_t n = member_chunks(p, p->first + peer, t->keys);
    aj_status st = AJ_OK;
    if (t->packed) {   /* [L_g, H/U, W]: a chunk's positions are one run */
        const size_t pos = row_bytes(t, h);
        for (int32_t j = 0; j < n && st == AJ_OK; j++)
            if (c[j].len > 0)
                st = move_rows(p,
                               (char *)t->heads +
                                   (size_t)group_local(runs, nruns, c[j].global) * pos,
                               0, buf + (size_t)c[j].local * pos, 0, (size_t)c[j].len * pos, 1,
                               into_buf);
        *bytes = (size_t)l * pos;
        return st;
    }
    /* a chunk's run of positions in each of the B H/U rows */
    const size_t pos = row_bytes(t, 1);
    for (int32_t j = 0; j < n && st == AJ_OK; j++)
        if (c[j].len > 0)
            st = move_rows(p, (char *)t->heads + (size_t)group_local(runs, nruns, c[j].global) *
                                                     pos,
                           (size_t)g * pos, buf + (size_t)c[j].local * pos, (size_t)l * pos,
                           (size_t)c[j].len * pos, (size_t)(p->sh.B * h), into_buf);
    *bytes = (size_t)(p->sh.B * h) * row_bytes(t, l);
    return st;
}

/* One all-to-all of n tensors, sequence shards to head shards (to_heads)
 * or back.  The block for a peer holds each tensor's part in turn. */
static aj_status alltoall(uly_plan *p, const uly_tensor *ts, int n, int to_heads)
{
    const int P = p->members;
    size_t *counts = calloc(4 * (size_t)P, sizeof *counts);
    if (!counts)
        return aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    size_t *send_bytes = counts, *send_off = counts + P, *recv_bytes = counts + 2 * P,
           *recv_off = counts + 3 * P;
    for (int peer = 0; peer < P; peer++)
        for (int i = 0; i < n; i++) {
            const int64_t h = ts[i].H / P;
            const int64_t mine = lengths_of(p, &ts[i])[p->rank];
            const int64_t theirs = lengths_of(p, &ts[i])[p->first + peer];
            const size_t out = (size_t)(p->sh.B * h) * row_bytes(&ts[i], to_heads ? mine
                                                                                   : theirs);
            const size_t in = (size_t)(p->sh.B * h) * row_bytes(&ts[i], to_heads ? theirs
                                                                                  : mine);
            send_bytes[peer] += out;
            recv_bytes[peer] += in;
        }
    size_t send_total = 0, recv_total = 0;
    for (int peer = 0; peer < P; peer++) {
        send_off[peer] = send_total;
        recv_off[peer] = recv_total;
        send_total += send_bytes[peer];
        recv_total += recv_bytes[peer];
    }
    char *send = NULL, *recv = NULL;
    aj_status st = alloc_buffer(p, send_total, (void **)&send);
    if (st == AJ_OK)
        st = alloc_buffer(p, recv_total, (void **)&recv);
    size_t moved = 0;
    for (int peer = 0; peer < P && st == AJ_OK; peer++) {
        char *at = send + send_off[peer];
        for (int i = 0; i < n && st == AJ_OK; i++, at += moved)
            st = to_heads ? seq_block(p, &ts[i], peer, at, 1, &moved)
                          : heads_block(p, &ts[i], peer, at, 1, &moved);
    }
    if (st != AJ_OK)
        goto done;
    if (P > 1) {
        const double t0 = aj_now();
        /* resident: NCCL reads the blocks once the call's stream packed
         * them (an event the engine's stream waits for) */
        aj_comm_device_transfers(p->a2a, p->resident, p->stream);
        if (st == AJ_OK)
            st = aj_cp_collective_status(p->ctx, p->fn,
                                         p->a2a->engine->alltoallv(p->a2a, send, send_bytes,
                                                                  send_off, recv, recv_bytes,
                                                                  recv_off));
        aj_comm_device_transfers(p->a2a, false, NULL);
        const double t = aj_now() - t0;
        p->stats->comm_s += t;
        p->stats->exposed_comm_s += t;
        p->stats->rotations++;
        if (st != AJ_OK)
            goto done;
    } else if (p->resident) {
        st = aj_device_copy_async(p->dev, recv, send, send_total, AJ_COPY_ON_DEVICE, p->stream);
    } else {
        memcpy(recv, send, send_total);
    }
    for (int peer = 0; peer < P && st == AJ_OK; peer++) {
        char *at = recv + recv_off[peer];
        for (int i = 0; i < n && st == AJ_OK; i++, at += moved)
            st = to_heads ? heads_block(p, &ts[i], peer, at, 0, &moved)
                          : seq_block(p, &ts[i], peer, at, 0, &moved);
    }
done:
    free_buffer(p, send);   /* (resident: a later use of the block follows on the stream) */
    free_buffer(p, recv);
    free(counts);
    return st;
}

/* ---------------------------------------------------------------- a call */

/* The tensors of a call: what the kernel reads comes in (from the
 * caller's shard `from`), what it writes goes out (to the caller's `to`). */
typedef struct uly_io {
    int64_t H, W;
    int f32, keys;               /* lse (else the op's dtype); positions of k */
    const aj_tensor *from, *to;
} uly_io;

enum { ULY_TENSORS_MAX = 9 };

/* A call's state: each tensor's host shards and its head shard on the
 * device (mem, and the kernel's view of it). */
typedef struct uly_call {
    uly_plan p;
    int n, n_in;                 /* tensors; the first n_in come in */
    uly_tensor t[ULY_TENSORS_MAX];
    void *mem[ULY_TENSORS_MAX];
    aj_tensor view[ULY_TENSORS_MAX];
    const aj_tensor *to[ULY_TENSORS_MAX];
    aj_kernel *kernel;
    aj_ring_stats stats;
    double start, launched;
} uly_call;

static size_t seq_bytes(const uly_plan *p, const uly_tensor *t)
{
    const int64_t l = (t->keys ? p->len_k : p->len_q)[p->rank];
    return (size_t)(p->sh.B * t->H * l * t->W) * t->elem;
}

static size_t heads_bytes(const uly_plan *p, const uly_tensor *t)
{
    const int64_t g = t->keys ? p->gk : p->gq;
    return (size_t)(p->sh.B * (t->H / p->members) * g * t->W) * t->elem;
}

static aj_status compile(uly_call *c, const aj_op *op)
{
    const double t0 = aj_now();
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.device = c->p.dev;   /* its target, and its tuned schedule if there is one */
    aj_status st = aj_compile(c->p.ctx, op, &opt, &c->kernel);
    c->stats.compile_s += aj_now() - t0;
    return st;
}

/* Everything up to the launch: the kernel, the inputs' shards to the
 * host, the all-to-all to head shards, and the head shards (inputs and
 * room for the outputs) in device memory. */
static aj_status begin(uly_call *c, const aj_op *op, const uly_io *io, int n, int n_in)
{
    uly_plan *p = &c->p;
    aj_status st = AJ_OK;
    c->n = n;
    c->n_in = n_in;
    if (!p->across)   /* hybrid: the ring compiles its own */
        AJ_TRY(compile(c, op));
    AJ_TRY(aj_cp_stream(p->dev, p->comm, &p->stream));   /* the comm's, as the ring's */
    for (int i = 0; i < n; i++) {
        uly_tensor *t = &c->t[i];
        *t = (uly_tensor){.H = io[i].H, .W = io[i].W, .elem = io[i].f32 ? 4 : p->elem,
                          .keys = io[i].keys, .packed = p->sh.varlen && !io[i].f32};
        c->to[i] = io[i].to;
        /* resident: the caller's shards are the sequence shards, the head
         * shards the kernel's tensors */
        if (p->resident)
            t->seq = io[i].from ? io[i].from->data : io[i].to->data;
        else
            AJ_TRY(alloc_buffer(p, seq_bytes(p, t), &t->seq));
        AJ_TRY(alloc_buffer(p, heads_bytes(p, t), &t->heads));
        if (io[i].from && !p->resident)
            AJ_TRY(copy(p, t->seq, io[i].from->data, seq_bytes(p, t), 0));
    }
    AJ_TRY(wait_dev(p, "copying the inputs to the host", false));
    AJ_TRY(alltoall(p, c->t, n_in, 1));
    for (int i = 0; i < n; i++) {
        const uly_tensor *t = &c->t[i];
        const size_t bytes = heads_bytes(p, t);
        if (p->resident)
            c->mem[i] = t->heads;
        else
            AJ_TRY(aj_device_alloc(p->dev, bytes ? bytes : 64, &c->mem[i]));
        if (i < n_in && !p->resident)
            AJ_TRY(copy(p, c->mem[i], t->heads, bytes, 1));
        c->view[i] = aj_cp_rows(c->mem[i], io[i].f32 ? AJ_DTYPE_F32 : p->op.dtype, &p->sh,
                                t->H / p->members, t->keys ? p->gk : p->gq,
                                io[i].f32 ? 0 : t->W);
    }
    c->launched = aj_now();
done:
    return st;
}

/* After the launch (launched: 1) or none (0: every output is 0): the
 * outputs back to the host, the all-to-all to sequence shards, and into
 * the caller's tensors. */
static aj_status end(uly_call *c, int launched)
{
    uly_plan *p = &c->p;
    aj_status st = AJ_OK;
    for (int i = c->n_in; i < c->n && launched && !p->resident; i++)
        AJ_TRY(copy(p, c->t[i].heads, c->mem[i], heads_bytes(p, &c->t[i]), 0));
    AJ_TRY(wait_dev(p, "the kernel", false));
    if (launched && !p->across) {
        c->stats.compute_s += aj_now() - c->launched;
        c->stats.launches++;
        if (aj_score_has_mask(&p->prog))
            c->stats.partial_blocks++;
        else
            c->stats.full_blocks++;
    }
    AJ_TRY(alltoall(p, c->t + c->n_in, c->n - c->n_in, 0));
    for (int i = c->n_in; i < c->n && !p->resident; i++)
        AJ_TRY(copy(p, c->to[i]->data, c->t[i].seq, seq_bytes(p, &c->t[i]), 1));
    AJ_TRY(wait_dev(p, "storing the results", true));
done:
    return st;
}

/* Frees the call (its stream's work is done, or failed) and reports. */
static aj_status finish(uly_call *c, aj_device *dev, aj_status st, aj_ring_stats *stats)
{
    const uly_plan *p = &c->p;
    for (int i = 0; i < c->n; i++) {
        if (c->mem[i] && !p->resident)
            aj_device_free(dev, c->mem[i]);
        if (!p->resident)   /* (resident: the caller's shards) */
            free_buffer(p, c->t[i].seq);
        free_buffer(p, c->t[i].heads);
    }
    aj_kernel_destroy(c->kernel);
    aj_score_prog_free(&c->p.prog);
    free(c->p.len_q);
    free(c->p.runs_q);
    free(c->p.runs_k);
    free(c->p.member);
    aj_cp_docs_free(&c->p.docs);
    c->stats.total_s = aj_now() - c->start;
    if (stats && st == AJ_OK)
        *stats = c->stats;
    return st;
}

/* The global head of the rank's head 0: member m of its group has the
 * group's heads m H/U .. */
static int64_t head_offset(const uly_plan *p)
{
    return (int64_t)(p->rank - p->first) * p->hq;
}

/* hybrid: what the ring across the groups did, added to the call's. */
static void add_ring_stats(aj_ring_stats *to, const aj_ring_stats *ring)
{
    to->rotations += ring->rotations;
    to->launches += ring->launches;
    to->full_blocks += ring->full_blocks;
    to->partial_blocks += ring->partial_blocks;
    to->skipped_blocks += ring->skipped_blocks;
    to->compile_s += ring->compile_s;
    to->compute_s += ring->compute_s;
    to->comm_s += ring->comm_s;
    to->exposed_comm_s += ring->exposed_comm_s;
}

/* The launch's tile classes (aj_ring_fwd_args.launch_tiles). */
static aj_status count_tiles(const uly_plan *p, const aj_op *op, const aj_kernel *kernel,
                             const aj_fwd_args *f, aj_tile_counts *out)
{
    aj_block_mask *m = NULL;
    aj_status st = aj_block_mask_create(p->ctx, p->dev, op, kernel, f, &m);
    if (st == AJ_OK)
        st = aj_block_mask_counts(m, out);
    aj_block_mask_destroy(m);
    return st;
}

/* hybrid: the ring across the groups over the head shards (fwd or bwd
 * args), once their copies to the device are done. */
static aj_status ring_across(uly_call *c, const aj_op *op, const aj_ring_fwd_args *fwd,
                             const aj_ring_bwd_args *bwd)
{
    uly_plan *p = &c->p;
    const aj_ring_group group = {p->members, p->sq, p->sk, head_offset(p), p->sh.Hq,
                                 p->stream};
    aj_ring_stats ring = {0};
    aj_status st = wait_dev(p, "copying the head shards to the device", false);
    if (st == AJ_OK)
        st = fwd ? aj_ring_forward_group(p->ctx, p->dev, p->across, op, fwd, &group, &ring)
                 : aj_ring_backward_group(p->ctx, p->dev, p->across, op, bwd, &group, &ring);
    add_ring_stats(&c->stats, &ring);
    return st;
}

/* The kernel launch's fields aj_fwd_args and aj_bwd_args share besides
 * the views (plan p, arguments a: aj_ring_fwd_args or aj_ring_bwd_args):
 * the side tensors, the dropout stream, the rank's heads among the op's,
 * the stream and, layout = varlen, the caller's whole batch of
 * documents. */
#define SET_LAUNCH(l, p, a)                                         \
    do {                                                            \
        (l).side = (a)->side;                                       \
        (l).num_side = (a)->num_side;                               \
        (l).seed = (a)->seed;                                       \
        (l).offset = (a)->offset;                                   \
        (l).head_offset = head_offset(p);                           \
        (l).heads_q_total = (p)->sh.Hq;                             \
        (l).stream = (p)->stream;                                   \
        if ((p)->sh.varlen) {                                       \
            (l).cu_seqlens_q = (a)->cu_seqlens_q;                   \
            (l).cu_seqlens_k = (a)->cu_seqlens_k;                   \
            (l).batch = (p)->docs.batch;                            \
            (l).max_seqlen_q = (p)->docs.max_q;                     \
            (l).max_seqlen_k = (p)->docs.max_k;                     \
        }                                                           \
    } while (0)

/* ---------------------------------------------------------------- forward */

enum { FWD_Q, FWD_K, FWD_V, FWD_O, FWD_LSE, FWD_COUNT };

/* The head shards as the forward kernel's (aj_fwd_args) or the hybrid's
 * ring's (aj_ring_fwd_args) tensors, with alibi's slopes (every head's:
 * the kernels read the global heads'). */
#define SET_FWD_VIEWS(x, c, slopes)      \
    do {                                 \
        (x).q = (c).view[FWD_Q];         \
        (x).k = (c).view[FWD_K];         \
        (x).v = (c).view[FWD_V];         \
        (x).o = (c).view[FWD_O];         \
        (x).lse = (c).view[FWD_LSE];     \
        (x).alibi_slopes = *(slopes);    \
    } while (0)

aj_status aj_ulysses_forward(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                             const aj_ring_fwd_args *a, aj_ring_stats *stats)
{
    uly_call c = {.p = {.fn = "aj_ring_forward"}, .start = aj_now()};
    uly_plan *p = &c.p;
    aj_status st = AJ_OK;
    p->async = a->stream != NULL;
    AJ_TRY(plan_call(p, ctx, dev, comm, op, AJ_KIND_FORWARD, a->layout, a->method,
                     a->ulysses_size, a->rotate, &a->q, &a->k, &a->v, a->side, a->num_side,
                     a->cu_seqlens_q, a->cu_seqlens_k, a->batch, a->seed, a->offset,
                     &c.stats));
    const aj_cp_shapes *sh = &p->sh;
    AJ_TRY(aj_cp_check_fwd_outputs(ctx, p->fn, p->op.dtype, sh, &a->o, &a->lse));
    const uly_io io[FWD_COUNT] = {
        [FWD_Q] = {sh->Hq, sh->D, 0, 0, &a->q, NULL},
        [FWD_K] = {sh->Hkv, sh->D, 0, 1, &a->k, NULL},
        [FWD_V] = {sh->Hkv, sh->Dv, 0, 1, &a->v, NULL},
        [FWD_O] = {sh->Hq, sh->Dv, 0, 0, NULL, &a->o},
        [FWD_LSE] = {sh->Hq, 1, 1, 0, NULL, &a->lse},
    };
    AJ_TRY(begin(&c, op, io, FWD_COUNT, FWD_O));
    if (p->across) {
        aj_ring_fwd_args r = *a;
        SET_FWD_VIEWS(r, c, &a->alibi_slopes);
        AJ_TRY(ring_across(&c, op, &r, NULL));
    } else if (p->sq > 0) {
        aj_fwd_args f = AJ_FWD_ARGS_INIT;
        SET_FWD_VIEWS(f, c, &a->alibi_slopes);
        SET_LAUNCH(f, p, a);
        AJ_TRY(aj_forward(ctx, dev, c.kernel, &f));
        if (a->launch_tiles && a->launch_tiles_cap > 0)
            AJ_TRY(count_tiles(p, op, c.kernel, &f, &a->launch_tiles[0]));
    }
    AJ_TRY(end(&c, p->across || p->sq > 0));
done:
    return finish(&c, dev, st, stats);
}

/* ---------------------------------------------------------------- backward */

enum { BWD_Q, BWD_K, BWD_V, BWD_O, BWD_DO, BWD_LSE, BWD_DQ, BWD_DK, BWD_DV, BWD_COUNT };

/* The same for the backward (aj_bwd_args, aj_ring_bwd_args). */
#define SET_BWD_VIEWS(x, c, slopes)                      \
    do {                                                 \
        (x).q = (c).view[BWD_Q];                         \
        (x).k = (c).view[BWD_K];                         \
        (x).v = (c).view[BWD_V];                         \
        (x).o = (c).view[BWD_O];                         \
        (x).do_ = (c).view[BWD_DO];                      \
        (x).lse = (c).view[BWD_LSE];                     \
        (x).dq = (c).view[BWD_DQ];                       \
        (x).dk = (c).view[BWD_DK];                       \
        (x).dv = (c).view[BWD_DV];                       \
        (x).alibi_slopes = *(slopes);                    \
    } while (0)

aj_status aj_ulysses_backward(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                              const aj_ring_bwd_args *a, aj_ring_stats *stats)
{
    uly_call c = {.p = {.fn = "aj_ring_backward"}, .start = aj_now()};
    uly_plan *p = &c.p;
    aj_status st = AJ_OK;
    p->async = a->stream != NULL;
    AJ_TRY(plan_call(p, ctx, dev, comm, op, AJ_KIND_BACKWARD, a->layout, a->method,
                     a->ulysses_size, a->rotate, &a->q, &a->k, &a->v, a->side, a->num_side,
                     a->cu_seqlens_q, a->cu_seqlens_k, a->batch, a->seed, a->offset,
                     &c.stats));
    const aj_cp_shapes *sh = &p->sh;
    AJ_TRY(aj_cp_check_bwd_outputs(ctx, p->fn, p->op.dtype, sh, &a->o, &a->do_, &a->lse, &a->dq,
                                   &a->dk, &a->dv));
    const uly_io io[BWD_COUNT] = {
        [BWD_Q] = {sh->Hq, sh->D, 0, 0, &a->q, NULL},
        [BWD_K] = {sh->Hkv, sh->D, 0, 1, &a->k, NULL},
        [BWD_V] = {sh->Hkv, sh->Dv, 0, 1, &a->v, NULL},
        [BWD_O] = {sh->Hq, sh->Dv, 0, 0, &a->o, NULL},
        [BWD_DO] = {sh->Hq, sh->Dv, 0, 0, &a->do_, NULL},
        [BWD_LSE] = {sh->Hq, 1, 1, 0, &a->lse, NULL},
        [BWD_DQ] = {sh->Hq, sh->D, 0, 0, NULL, &a->dq},
        [BWD_DK] = {sh->Hkv, sh->D, 0, 1, NULL, &a->dk},
        [BWD_DV] = {sh->Hkv, sh->Dv, 0, 1, NULL, &a->dv},
    };
    AJ_TRY(begin(&c, op, io, BWD_COUNT, BWD_DQ));
    const int launch = p->sq > 0 && p->sk > 0;   /* else every gradient is 0 */
    if (p->across) {
        aj_ring_bwd_args r = *a;
        SET_BWD_VIEWS(r, c, &a->alibi_slopes);
        AJ_TRY(ring_across(&c, op, NULL, &r));
    } else if (launch) {   /* the grad side tensors: this rank's heads' part */
        aj_bwd_args b = AJ_BWD_ARGS_INIT;
        SET_BWD_VIEWS(b, c, &a->alibi_slopes);
        SET_LAUNCH(b, p, a);
        b.dside = a->dside;
        b.num_dside = a->num_dside;
        AJ_TRY(aj_backward(ctx, dev, c.kernel, &b));
    } else {
        for (int t = 0; t < a->num_dside; t++) {   /* no launch: a part of zeros */
            const size_t n = (size_t)aj_side_numel(&a->dside[t]);
            AJ_TRY(p->resident ? aj_device_fill32_async(dev, (void *)a->dside[t].data, 0, n,
                                                        p->stream)
                               : aj_cp_zero(ctx, dev, a->dside[t].data, n * 4));
        }
    }
    AJ_TRY(end(&c, p->across || launch));
done:
    return finish(&c, dev, st, stats);
}
