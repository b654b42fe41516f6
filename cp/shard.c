/*
 * shard.c -- aj_shard, aj_unshard, aj_shard_length and aj_shard_get_chunks:
 * a rank's positions of a sequence.
 *
 * Contiguous: the sequence cuts into P chunks, zigzag (head-tail) into
 * 2P, and rank r holds chunk r (zigzag: chunks r and 2P-1-r, so that
 * under a causal mask every rank has the same number of visible
 * (query, key) pairs):
 *
 *     chunks   0   1   2   3   4   5   6   7        P = 4
 *     rank     0   1   2   3   3   2   1   0
 *
 * Any length: S = n q + m (n chunks, 0 <= m < n) gives the first m
 * chunks q + 1 positions and the others q, so the ranks' shard lengths
 * differ by at most 1 (contiguous) or 2 (zigzag) and every even split is
 * the familiar S/n chunks.
 *
 * method = hybrid groups U consecutive ranks: group g of R = P/U holds
 * the chunks of ranks g U .. g U + U - 1, which are one run of positions
 * (contiguous) or a head run and a tail run (zigzag) -- the ring across
 * the groups sees each group as one rank of the same layout:
 *
 *     chunks   0   1   2   3   4   5   6   7        P = 4, U = 2
 *     rank     0   1   2   3   3   2   1   0
 *     group    0---0   1---1   1---1   0---0
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"
#include "cp/cp.h"

/* Chunk c of n over a sequence of `seq`: its first position and length. */
static aj_shard_chunk chunk_of(int64_t seq, int64_t n, int64_t c, int64_t local)
{
    const int64_t q = seq / n, m = seq % n;
    return (aj_shard_chunk){.global = c * q + (c < m ? c : m), .local = local,
                            .len = q + (c < m)};
}

aj_status aj_shard_chunks_any(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int rank,
                              int size, int64_t seq, aj_shard_chunk chunks[2], int *num_chunks)
{
    return aj_shard_group_chunks(ctx, fn, layout, rank, size, 1, seq, chunks, num_chunks);
}

/* Group g's runs: chunks g U .. g U + U - 1 (the ranks' heads), and for
 * zigzag chunks 2P - g U - U .. 2P - 1 - g U (their tails), each run
 * consecutive positions. */
aj_status aj_shard_group_chunks(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int group,
                                int groups, int members, int64_t seq, aj_shard_chunk chunks[2],
                                int *num_chunks)
{
    AJ_CHECK_ARG(ctx, (unsigned)layout < AJ_SHARD_LAYOUT_COUNT,
                 "%s: layout = %d is not a shard layout", fn, (int)layout);
    AJ_CHECK_ARG(ctx, groups >= 1 && members >= 1, "%s: size = %d; want at least 1 rank", fn,
                 groups * members);
    AJ_CHECK_ARG(ctx, group >= 0 && group < groups, "%s: rank = %d is outside 0 .. %d", fn,
                 group, groups - 1);
    AJ_CHECK_ARG(ctx, seq >= 0, "%s: seq = %lld is negative", fn, (long long)seq);
    const int64_t P = (int64_t)groups * members, U = members;
    const int64_t n = layout == AJ_SHARD_CONTIGUOUS ? P : 2 * P;
    const int64_t heads[2] = {group * U, 2 * P - group * U - U};
    *num_chunks = layout == AJ_SHARD_CONTIGUOUS ? 1 : 2;
    int64_t local = 0;
    for (int i = 0; i < *num_chunks; i++) {
        const aj_shard_chunk first = chunk_of(seq, n, heads[i], local);
        const aj_shard_chunk last = chunk_of(seq, n, heads[i] + U - 1, 0);
        chunks[i] = first;
        chunks[i].len = last.global + last.len - first.global;
        local += chunks[i].len;
    }
    return AJ_OK;
}

aj_status aj_shard_chunks(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int rank,
                          int size, int64_t seq, aj_shard_chunk chunks[2], int *num_chunks)
{
    aj_status st = aj_shard_chunks_any(ctx, fn, layout, rank, size, seq, chunks, num_chunks);
    if (st != AJ_OK)
        return st;
    const int64_t parts = layout == AJ_SHARD_ZIGZAG ? 2 * (int64_t)size : size;
    if (seq % parts != 0)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: a sequence of %lld positions does not "
                       "split into %lld equal %s chunks over %d ranks; one rank's length "
                       "tells the totals only for a multiple of %lld (aj_ring_forward takes "
                       "any length: docs/ring.md)",
                       fn, (long long)seq, (long long)parts,
                       layout == AJ_SHARD_ZIGZAG ? "zigzag" : "contiguous", size,
                       (long long)parts);
    return AJ_OK;
}

int64_t aj_shard_length(aj_shard_layout layout, int rank, int size, int64_t seq)
{
    aj_shard_chunk c[2];
    int n = 0;
    if ((unsigned)layout >= AJ_SHARD_LAYOUT_COUNT || size < 1 || rank < 0 || rank >= size ||
        seq < 0)
        return -1;
    aj_shard_chunks_any(NULL, "", layout, rank, size, seq, c, &n);
    return n == 1 ? c[0].len : c[0].len + c[1].len;
}

aj_status aj_shard_get_chunks(aj_ctx *ctx, aj_shard_layout layout, int rank, int size,
                              int64_t seq, aj_shard_chunk chunks[2], int *num_chunks)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, chunks && num_chunks, "aj_shard_get_chunks: chunks and num_chunks must "
                 "not be NULL");
    return aj_shard_chunks(ctx, "aj_shard_get_chunks", layout, rank, size, seq, chunks,
                           num_chunks);
}

aj_status aj_shard_varlen_chunks_any(aj_ctx *ctx, const char *fn, aj_cp_method method,
                                     aj_shard_layout layout, int rank, int size,
                                     const int32_t *cu_seqlens, int32_t batch,
                                     aj_shard_chunk *chunks, int32_t *count, int64_t *len)
{
    AJ_CHECK_ARG(ctx, (unsigned)method < AJ_METHOD_COUNT,
                 "%s: method = %d is not a context-parallel method", fn, (int)method);
    AJ_CHECK_ARG(ctx, cu_seqlens && batch >= 1, "%s: cu_seqlens %s with batch = %d; want the "
                 "batch's batch + 1 offsets, batch >= 1", fn, cu_seqlens ? "given" : "NULL",
                 (int)batch);
    *count = 0;
    *len = 0;
    const int per_doc = method != AJ_METHOD_ULYSSES;   /* ring, hybrid */
    for (int32_t b = 0; b < (per_doc ? batch : 1); b++) {
        const int64_t start = per_doc ? cu_seqlens[b] : 0;
        const int64_t n = (per_doc ? cu_seqlens[b + 1] : cu_seqlens[batch]) - start;
        AJ_CHECK_ARG(ctx, cu_seqlens[0] == 0 && n >= 0, "%s: cu_seqlens[0] = %d and sequence "
                     "%d of %lld positions; want offsets from 0 that never decrease", fn,
                     (int)cu_seqlens[0], (int)b, (long long)n);
        aj_shard_chunk c[2];
        int nc = 0;
        aj_status st = aj_shard_chunks_any(ctx, fn, layout, rank, size, n, c, &nc);
        if (st != AJ_OK)
            return st;
        for (int i = 0; i < nc; i++) {
            if (c[i].len == 0)
                continue;
            chunks[(*count)++] = (aj_shard_chunk){.global = start + c[i].global,
                                                  .local = *len, .len = c[i].len};
            *len += c[i].len;
        }
    }
    return AJ_OK;
}

/* Copies the chunks (of a shard `local_seq` long) between the full tensor
 * and the shard, either way. */
static void copy_chunks(const aj_shard_chunk *chunks, int n, int64_t local_seq,
                        const aj_seq_shape *full, const void *src, void *dst, int to_shard)
{
    const size_t row = (size_t)full->inner * full->elem_size;
    for (int64_t o = 0; o < full->outer; o++)
        for (int c = 0; c < n; c++) {
            size_t g = ((size_t)o * full->seq + chunks[c].global) * row;
            size_t l = ((size_t)o * local_seq + chunks[c].local) * row;
            size_t bytes = (size_t)chunks[c].len * row;
            if (to_shard)
                memcpy((char *)dst + l, (const char *)src + g, bytes);
            else
                memcpy((char *)dst + g, (const char *)src + l, bytes);
        }
}

/* The arguments aj_shard, aj_unshard and their varlen forms share. */
static aj_status check_copy(aj_ctx *ctx, const char *fn, const aj_seq_shape *full,
                            const void *src, const void *dst, int to_shard)
{
    AJ_CHECK_ARG(ctx, full, "%s: full is NULL", fn);
    AJ_CHECK_ARG(ctx, src, "%s: %s is NULL", fn, to_shard ? "src" : "shard");
    AJ_CHECK_ARG(ctx, dst, "%s: %s is NULL", fn, to_shard ? "shard" : "dst");
    AJ_CHECK_ARG(ctx, full->outer >= 0 && full->inner >= 0,
                 "%s: full->outer = %lld, full->inner = %lld; want sizes >= 0", fn,
                 (long long)full->outer, (long long)full->inner);
    AJ_CHECK_ARG(ctx, full->elem_size > 0, "%s: full->elem_size is 0", fn);
    return AJ_OK;
}

static aj_status shard_copy(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int rank,
                            int size, const aj_seq_shape *full, const void *src, void *dst,
                            int to_shard)
{
    aj_status st = check_copy(ctx, fn, full, src, dst, to_shard);
    aj_shard_chunk chunks[2];
    int n = 0;
    if (st == AJ_OK)
        st = aj_shard_chunks_any(ctx, fn, layout, rank, size, full->seq, chunks, &n);
    if (st != AJ_OK)
        return st;
    copy_chunks(chunks, n, aj_shard_length(layout, rank, size, full->seq), full, src, dst,
                to_shard);
    return AJ_OK;
}

aj_status aj_shard(aj_ctx *ctx, aj_shard_layout layout, int rank, int size,
                   const aj_seq_shape *full, const void *src, void *shard)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    return shard_copy(ctx, "aj_shard", layout, rank, size, full, src, shard, 1);
}

aj_status aj_unshard(aj_ctx *ctx, aj_shard_layout layout, int rank, int size,
                     const aj_seq_shape *full, const void *shard, void *dst)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    return shard_copy(ctx, "aj_unshard", layout, rank, size, full, shard, dst, 0);
}

/* ---------------------------------------------------------------- varlen */

aj_status aj_shard_varlen_chunks(aj_ctx *ctx, aj_cp_method method, aj_shard_layout layout,
                                 int rank, int size, const int32_t *cu_seqlens, int32_t batch,
                                 aj_shard_chunk *chunks, int32_t cap, int32_t *count,
                                 int64_t *length)
{
    const char *fn = "aj_shard_varlen_chunks";
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, count && length, "%s: count and length must not be NULL", fn);
    AJ_CHECK_ARG(ctx, cap >= 0 && (cap == 0 || chunks), "%s: cap = %d with chunks %s; want a "
                 "count of 0 or more, and the array when it is not 0", fn, (int)cap,
                 chunks ? "given" : "NULL");
    AJ_CHECK_ARG(ctx, batch >= 1 && batch <= INT32_MAX / 2, "%s: batch = %d", fn, (int)batch);
    aj_shard_chunk *all = malloc(2 * (size_t)batch * sizeof *all);
    if (!all)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    aj_status st = aj_shard_varlen_chunks_any(ctx, fn, method, layout, rank, size, cu_seqlens,
                                              batch, all, count, length);
    for (int32_t i = 0; st == AJ_OK && i < *count && i < cap; i++)
        chunks[i] = all[i];
    free(all);
    return st;
}

static aj_status varlen_copy(aj_ctx *ctx, const char *fn, aj_cp_method method,
                             aj_shard_layout layout, int rank, int size,
                             const int32_t *cu_seqlens, int32_t batch, const aj_seq_shape *full,
                             const void *src, void *dst, int to_shard)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    aj_status st = check_copy(ctx, fn, full, src, dst, to_shard);
    if (st != AJ_OK)
        return st;
    AJ_CHECK_ARG(ctx, batch >= 1 && batch <= INT32_MAX / 2 && cu_seqlens,
                 "%s: cu_seqlens %s with batch = %d; want the batch's batch + 1 offsets", fn,
                 cu_seqlens ? "given" : "NULL", (int)batch);
    AJ_CHECK_ARG(ctx, full->seq == cu_seqlens[batch], "%s: full->seq = %lld; the packed batch "
                 "has cu_seqlens[%d] = %d positions", fn, (long long)full->seq, (int)batch,
                 (int)cu_seqlens[batch]);
    aj_shard_chunk *chunks = malloc(2 * (size_t)batch * sizeof *chunks);
    if (!chunks)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    int32_t n = 0;
    int64_t len = 0;
    st = aj_shard_varlen_chunks_any(ctx, fn, method, layout, rank, size, cu_seqlens, batch,
                                    chunks, &n, &len);
    if (st == AJ_OK)
        copy_chunks(chunks, n, len, full, src, dst, to_shard);
    free(chunks);
    return st;
}

aj_status aj_shard_varlen(aj_ctx *ctx, aj_cp_method method, aj_shard_layout layout, int rank,
                          int size, const int32_t *cu_seqlens, int32_t batch,
                          const aj_seq_shape *full, const void *src, void *shard)
{
    return varlen_copy(ctx, "aj_shard_varlen", method, layout, rank, size, cu_seqlens, batch,
                       full, src, shard, 1);
}

aj_status aj_unshard_varlen(aj_ctx *ctx, aj_cp_method method, aj_shard_layout layout, int rank,
                            int size, const int32_t *cu_seqlens, int32_t batch,
                            const aj_seq_shape *full, const void *shard, void *dst)
{
    return varlen_copy(ctx, "aj_unshard_varlen", method, layout, rank, size, cu_seqlens, batch,
                       full, shard, dst, 0);
}
