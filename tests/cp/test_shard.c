/*
 * test_shard.c -- aj_shard / aj_unshard for P = 1 .. 4 and both layouts,
 * and the error paths of the ring API: shard arguments, aj_comm_create
 * (MPI not initialised or already finalized, bad config, NCCL missing --
 * ctest runs this with an LD_LIBRARY_PATH that holds no libnccl.so.2) and
 * the argument checks of aj_ring_forward / aj_ring_backward; the chunks
 * aj_shard_get_chunks gives and the ring's schedule aj_ring_plan gives,
 * and their errors.  One rank.
 */
#include <mpi.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cp/leak_check.h"
#include "cp/cp.h"   /* aj_shard_chunks_any: the rule per document */

static aj_ctx *ctx;

/* Every rank's shard of a position buffer holds the positions its layout
 * names, and unsharding all of them rebuilds the buffer. */
static void check_positions(aj_shard_layout layout, int size)
{
    enum { S_MAX = 64 };
    const int64_t seq = 8 * size;
    int32_t full[S_MAX], back[S_MAX], shard[S_MAX];
    for (int64_t i = 0; i < seq; i++) {
        full[i] = (int32_t)i;
        back[i] = -1;
    }
    const aj_seq_shape shape = {1, seq, 1, sizeof(int32_t)};
    const int64_t local = seq / size;
    for (int r = 0; r < size; r++) {
        CHECK_STATUS(ctx, aj_shard(ctx, layout, r, size, &shape, full, shard), AJ_OK);
        int ok = 1;
        for (int64_t i = 0; i < local; i++) {
            int64_t want;
            if (layout == AJ_SHARD_CONTIGUOUS) {
                want = r * local + i;
            } else {
                const int64_t c = seq / (2 * size);
                want = i < c ? r * c + i : (2 * size - 1 - r) * c + (i - c);
            }
            ok &= shard[i] == want;
        }
        CHECK_MSG(ok, "%s P=%d rank %d: wrong positions",
                  layout == AJ_SHARD_ZIGZAG ? "zigzag" : "contiguous", size, r);
        /* the chunks name the same positions, in local order */
        aj_shard_chunk c[2];
        int n = 0;
        CHECK_STATUS(ctx, aj_shard_get_chunks(ctx, layout, r, size, seq, c, &n), AJ_OK);
        int64_t covered = 0;
        for (int j = 0; j < n; j++) {
            CHECK(c[j].local == covered);
            for (int64_t i = 0; i < c[j].len; i++)
                ok &= shard[c[j].local + i] == c[j].global + i;
            covered += c[j].len;
        }
        CHECK_MSG(ok && covered == local && n == (layout == AJ_SHARD_ZIGZAG ? 2 : 1),
                  "P=%d rank %d: aj_shard_get_chunks names other positions", size, r);
        CHECK_STATUS(ctx, aj_unshard(ctx, layout, r, size, &shape, shard, back), AJ_OK);
    }
    CHECK(memcmp(full, back, (size_t)seq * sizeof full[0]) == 0);
}

/* A [3, S, 5] double tensor: outer and inner dims travel with each
 * position. */
static void check_round_trip(aj_shard_layout layout, int size)
{
    const int64_t outer = 3, seq = 4 * size, inner = 5;
    const size_t n = (size_t)(outer * seq * inner);
    double *full = malloc(n * sizeof *full), *back = calloc(n, sizeof *back);
    double *shard = malloc(n * sizeof *shard);
    for (size_t i = 0; i < n; i++)
        full[i] = (double)i * 0.5;
    const aj_seq_shape shape = {outer, seq, inner, sizeof(double)};
    for (int r = 0; r < size; r++) {
        CHECK(aj_shard(ctx, layout, r, size, &shape, full, shard) == AJ_OK);
        /* row 0 of outer index 1 is the first position the rank holds */
        const int64_t first = layout == AJ_SHARD_CONTIGUOUS ? r * (seq / size)
                                                            : r * (seq / (2 * size));
        CHECK(shard[(seq / size) * inner] == full[(seq + first) * inner]);
        CHECK(aj_unshard(ctx, layout, r, size, &shape, shard, back) == AJ_OK);
    }
    CHECK(memcmp(full, back, n * sizeof *full) == 0);
    free(full);
    free(back);
    free(shard);
}

/* Any length: the chunks (P contiguous, 2P zigzag) take turns, the first
 * S % n one position longer; rank r holds chunk r (and 2P-1-r), and the
 * shards cover every position once.  The expected positions are dealt
 * out chunk by chunk here, not computed by the library's formula. */
static void check_any_length(aj_shard_layout layout, int size)
{
    const int n = layout == AJ_SHARD_ZIGZAG ? 2 * size : size;
    for (int64_t seq = 0; seq <= 3 * n + 1; seq++) {
        int32_t full[64], shard[64], back[64];
        int64_t start[16], len[16], at = 0;
        for (int c = 0; c < n; c++) {
            len[c] = seq / n + (c < seq % n);
            start[c] = at;
            at += len[c];
        }
        for (int64_t i = 0; i < seq; i++) {
            full[i] = (int32_t)i;
            back[i] = -1;
        }
        const aj_seq_shape shape = {1, seq, 1, 4};
        int64_t total = 0;
        for (int r = 0; r < size; r++) {
            const int c0 = r, c1 = n - 1 - r;
            const int64_t want_len = layout == AJ_SHARD_ZIGZAG ? len[c0] + len[c1] : len[c0];
            CHECK_MSG(aj_shard_length(layout, r, size, seq) == want_len,
                      "S=%lld P=%d rank %d: aj_shard_length %lld, want %lld", (long long)seq,
                      size, r, (long long)aj_shard_length(layout, r, size, seq),
                      (long long)want_len);
            CHECK_STATUS(ctx, aj_shard(ctx, layout, r, size, &shape, full, shard), AJ_OK);
            int ok = 1;
            for (int64_t i = 0; i < len[c0]; i++)
                ok &= shard[i] == start[c0] + i;
            for (int64_t i = 0; layout == AJ_SHARD_ZIGZAG && i < len[c1]; i++)
                ok &= shard[len[c0] + i] == start[c1] + i;
            CHECK_MSG(ok, "S=%lld P=%d rank %d: wrong positions", (long long)seq, size, r);
            CHECK_STATUS(ctx, aj_unshard(ctx, layout, r, size, &shape, shard, back), AJ_OK);
            total += want_len;
        }
        CHECK(total == seq);
        CHECK(seq == 0 || memcmp(full, back, (size_t)seq * sizeof full[0]) == 0);
    }
    CHECK(aj_shard_length(layout, size, size, 8) == -1);
    CHECK(aj_shard_length(layout, 0, 0, 8) == -1);
    CHECK(aj_shard_length(layout, 0, size, -1) == -1);
    CHECK(aj_shard_length((aj_shard_layout)7, 0, size, 8) == -1);
}

/* Packed documents (lengths 1, 0, 2, 5, 9): the ring's rule (hybrid's too) gives rank r
 * the layout's chunks of each document in document order (checked
 * against aj_shard_chunks_any's positions per document), Ulysses' the
 * packed axis's; every position lands on one rank, and shard / unshard
 * round-trip. */
static void check_varlen(aj_shard_layout layout, int size)
{
    static const int32_t cu[] = {0, 1, 1, 3, 8, 17};
    const int32_t batch = 5, T = 17;
    int32_t full[17], shard[17], back[17];
    for (int i = 0; i < T; i++) {
        full[i] = i;
        back[i] = -1;
    }
    const aj_seq_shape shape = {1, T, 1, 4};
    for (int m = 0; m < AJ_METHOD_COUNT; m++) {
        int64_t total = 0;
        for (int r = 0; r < size; r++) {
            aj_shard_chunk chunks[10];
            int32_t count = 0;
            int64_t len = 0;
            CHECK_STATUS(ctx, aj_shard_varlen_chunks(ctx, (aj_cp_method)m, layout, r, size, cu,
                                                     batch, chunks, 10, &count, &len), AJ_OK);
            /* the positions rank r should hold, in order */
            int32_t want[17];
            int64_t n = 0;
            /* the ring and hybrid cut each document; Ulysses the packed axis */
            const int per_doc = m != AJ_METHOD_ULYSSES;
            for (int32_t d = 0; d < (per_doc ? batch : 1); d++) {
                const int64_t at = per_doc ? cu[d] : 0;
                const int64_t dl = per_doc ? cu[d + 1] - cu[d] : T;
                aj_shard_chunk c[2];
                int nc = 0;
                CHECK_STATUS(ctx, aj_shard_chunks_any(ctx, "test", layout, r, size, dl, c, &nc),
                             AJ_OK);
                for (int i = 0; i < nc; i++)
                    for (int64_t j = 0; j < c[i].len; j++)
                        want[n++] = (int32_t)(at + c[i].global + j);
            }
            CHECK(len == n);
            CHECK_STATUS(ctx, aj_shard_varlen(ctx, (aj_cp_method)m, layout, r, size, cu, batch,
                                              &shape, full, shard), AJ_OK);
            CHECK_MSG(memcmp(shard, want, (size_t)n * sizeof *want) == 0,
                      "P=%d rank %d method %d layout %d: wrong positions", size, r, m,
                      (int)layout);
            CHECK_STATUS(ctx, aj_unshard_varlen(ctx, (aj_cp_method)m, layout, r, size, cu,
                                                batch, &shape, shard, back), AJ_OK);
            total += len;
        }
        CHECK(total == T && memcmp(full, back, sizeof full) == 0);
        memset(back, 0xff, sizeof back);
    }
}

static void check_shard_errors(void)
{
    int32_t buf[64] = {0};
    aj_seq_shape shape = {1, 12, 1, 4};
    CHECK_STATUS(ctx, aj_shard(ctx, AJ_SHARD_CONTIGUOUS, 4, 4, &shape, buf, buf),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_shard: rank = 4 is outside 0 .. 3");
    CHECK_STATUS(ctx, aj_shard(ctx, AJ_SHARD_CONTIGUOUS, 0, 0, &shape, buf, buf),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_shard: size = 0; want at least 1 rank");
    CHECK_STATUS(ctx, aj_shard(ctx, (aj_shard_layout)7, 0, 2, &shape, buf, buf),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_shard: layout = 7 is not a shard layout");
    CHECK_STATUS(ctx, aj_shard(ctx, AJ_SHARD_CONTIGUOUS, 0, 2, &shape, NULL, buf),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_shard: src is NULL");
    CHECK_STATUS(ctx, aj_unshard(ctx, AJ_SHARD_CONTIGUOUS, 0, 2, NULL, buf, buf),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_unshard: full is NULL");
    shape.elem_size = 0;
    CHECK_STATUS(ctx, aj_shard(ctx, AJ_SHARD_CONTIGUOUS, 0, 2, &shape, buf, buf),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_shard: full->elem_size is 0");
    aj_shard_chunk c[2];
    int n = 0;
    CHECK_STATUS(ctx, aj_shard_get_chunks(ctx, AJ_SHARD_ZIGZAG, 0, 4, 20, c, &n),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_shard_get_chunks: a sequence of 20 positions does not split into 8 "
                "equal zigzag chunks over 4 ranks");
    CHECK_STATUS(ctx, aj_shard_get_chunks(ctx, AJ_SHARD_ZIGZAG, 0, 4, 24, NULL, &n),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_shard_get_chunks: chunks and num_chunks must not be NULL");
}

static void check_comm_errors(aj_device *dev)
{
    aj_comm *comm = NULL;
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, NULL, &comm), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_comm_create: config is NULL");
    cc.struct_size = 8;
    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_comm_create: config->struct_size = 8");
    cc = (aj_comm_config)AJ_COMM_CONFIG_INIT;
    cc.kind = (aj_comm_kind)5;
    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_comm_create: config->kind = 5 is not a comm kind");
    cc.kind = AJ_COMM_MPI;
    cc.timeout_s = -1;
    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_comm_create: config->timeout_s = -1");
    cc.timeout_s = 0;
    CHECK_STATUS(ctx, aj_comm_create(ctx, NULL, &cc, &comm), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_comm_create: dev is NULL");
    /* ctest points AJ_NCCL_LIBRARY at a library that does not exist */
    cc.kind = AJ_COMM_NCCL;
    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_ERR_NO_DEVICE);
    CHECK_ERROR(ctx, "nowhere/libnccl.so.2) cannot be loaded");
    CHECK_ERROR(ctx, "or use the MPI engine on CPU ranks");
    CHECK(comm == NULL);
    CHECK(aj_comm_rank(NULL) == -1 && aj_comm_size(NULL) == -1);
}

static aj_op *parse(const char *text)
{
    aj_op *op = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "t", &op), AJ_OK);
    return op;
}

static aj_tensor dense4(void *data, aj_dtype dt, int64_t b, int64_t h, int64_t s, int64_t d)
{
    return (aj_tensor){.data = data, .dtype = dt, .rank = 4, .shape = {b, h, s, d},
                       .strides = {h * s * d, s * d, d, 1}};
}

/* The ring's schedule for a causal mask, P = 2, zigzag (chunks of 8 of a
 * 32-long sequence: rank 0 holds 0..7 and 24..31, rank 1 8..23): rank 0
 * computes with its own block, then rank 1's, and of the 8 pairs skips
 * the 3 that lie above the diagonal. */
static void check_ring_plan(aj_device *dev)
{
    aj_op *causal = parse("attention forward flash { dtype = f32 head_dim = 8 "
                          "mask = causal(top_left) }");
    aj_ring_plan_args a = AJ_RING_PLAN_ARGS_INIT;
    a.layout = AJ_SHARD_ZIGZAG;
    a.rank = 0;
    a.size = 2;
    a.batch = a.heads_q = 1;
    a.seq_q = a.seq_k = 16;
    aj_ring_pair pairs[8];
    int32_t count = 0;
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, causal, &a, pairs, 8, &count), AJ_OK);
    const struct { int step, src; int64_t q, k; aj_ring_block block; } want[8] = {
        {0, 0, 0, 0, AJ_RING_BLOCK_PARTIAL},  {0, 0, 0, 24, AJ_RING_BLOCK_SKIP},
        {0, 0, 24, 0, AJ_RING_BLOCK_FULL},    {0, 0, 24, 24, AJ_RING_BLOCK_PARTIAL},
        {1, 1, 0, 8, AJ_RING_BLOCK_SKIP},     {1, 1, 0, 16, AJ_RING_BLOCK_SKIP},
        {1, 1, 24, 8, AJ_RING_BLOCK_FULL},    {1, 1, 24, 16, AJ_RING_BLOCK_FULL}};
    CHECK(count == 8);
    for (int i = 0; i < 8 && i < count; i++)
        CHECK_MSG(pairs[i].step == want[i].step && pairs[i].src == want[i].src &&
                      pairs[i].q.global == want[i].q && pairs[i].k.global == want[i].k &&
                      pairs[i].q.len == 8 && pairs[i].k.len == 8 &&
                      pairs[i].q.local == (want[i].q ? 8 : 0) &&
                      pairs[i].k.local == (want[i].k == 0 || want[i].k == 8 ? 0 : 8) &&
                      pairs[i].block == want[i].block,
                  "pair %d: step %d src %d q %lld k %lld class %d", i, pairs[i].step,
                  pairs[i].src, (long long)pairs[i].q.global, (long long)pairs[i].k.global,
                  pairs[i].block);
    /* all-gather goes in rank order: rank 1 starts with rank 0's block;
     * a short array gets the first pairs and the whole count */
    a.rotate = AJ_ROTATE_ALLGATHER;
    a.rank = 1;
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, causal, &a, pairs, 2, &count), AJ_OK);
    CHECK(count == 8 && pairs[0].src == 0 && pairs[1].src == 0 && pairs[0].q.global == 8);
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, causal, &a, NULL, 0, &count), AJ_OK);
    CHECK(count == 8);

    CHECK_STATUS(ctx, aj_ring_plan(ctx, NULL, causal, &a, NULL, 0, &count), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_plan: dev is NULL");
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, causal, &a, NULL, 2, &count), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_plan: cap = 2 with pairs NULL");
    a.seq_q = 9;
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, causal, &a, NULL, 0, &count), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_plan: a sequence of 18 positions does not split into 4 equal "
                "zigzag chunks");
    a.seq_q = 16;
    a.batch = 0;
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, causal, &a, NULL, 0, &count), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_plan: batch = 0, heads_q = 1; want at least 1");
    a.batch = 1;
    aj_op *merge = parse("attention merge { dtype = f32 head_dim_v = 8 }");
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, merge, &a, NULL, 0, &count), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_plan: the op is `attention merge`; want a forward or backward op");
    aj_op *doc = parse("attention forward flash { dtype = f32 head_dim = 8 "
                       "tensors = (doc: i32[2]) mask = expr(doc[b, q] == doc[b, k]) }");
    CHECK_STATUS(ctx, aj_ring_plan(ctx, dev, doc, &a, NULL, 0, &count), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_plan: side tensor 'doc' is not given");
    aj_op_destroy(doc);
    aj_op_destroy(merge);
    aj_op_destroy(causal);
}

static void check_ring_errors(aj_device *dev)
{
    aj_comm *comm = NULL;
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_OK);
    CHECK(aj_comm_rank(comm) == 0 && aj_comm_size(comm) == 1);
    aj_op *fwd = parse("attention forward efficient { dtype = f32 head_dim = 8 }");
    aj_op *bwd = parse("attention backward efficient { dtype = f32 head_dim = 8 }");
    aj_op *acc = parse("attention forward efficient { dtype = f32 head_dim = 8 "
                       "accumulate = true }");
    aj_op *bias = parse("attention forward efficient { dtype = f32 head_dim = 8 bias = add }");
    float *m = aligned_alloc(64, 4096);
    memset(m, 0, 4096);
    aj_ring_fwd_args fa = AJ_RING_FWD_ARGS_INIT;
    fa.q = dense4(m, AJ_DTYPE_F32, 1, 1, 6, 8);
    fa.k = fa.q;
    fa.v = fa.q;
    fa.o = fa.q;
    fa.lse = (aj_tensor){.data = m, .dtype = AJ_DTYPE_F32, .rank = 3, .shape = {1, 1, 6},
                         .strides = {6, 6, 1}};
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fwd, NULL, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: args is NULL");
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, NULL, fwd, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: comm is NULL");
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, bwd, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: the op is `attention backward efficient`; want "
                "`attention forward flash` or `attention forward efficient`");
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, acc, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "accumulate = true: the ring sets it on its own kernels");
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, bias, &fa, NULL), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "bias = add: the ring does not shard a bias tensor");
    fa.layout = AJ_SHARD_ZIGZAG;
    fa.q.shape[2] = 5;
    fa.o.shape[2] = 5;
    fa.lse.shape[2] = 5;
    fa.k.shape[2] = 5;
    fa.v.shape[2] = 5;
    /* any length: chunks of 3 and 2 positions */
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fwd, &fa, NULL), AJ_OK);
    fa.layout = AJ_SHARD_CONTIGUOUS;
    fa.q = dense4(m, AJ_DTYPE_F32, 1, 1, 6, 8);
    fa.k = fa.q;
    fa.v = fa.q;
    fa.o = fa.q;
    fa.lse.shape[2] = 6;
    fa.k.strides[2] = 16;
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fwd, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: k.strides[2] = 16; ring shards must be contiguous");
    fa.k.strides[2] = 8;
    fa.o.shape[2] = 4;
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fwd, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: o.shape[2] = 4, want 6");
    fa.o.shape[2] = 6;
    fa.struct_size = 4;
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fwd, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "args->struct_size = 4");
    /* version 1 of the struct (no side tensors) is still accepted */
    fa.struct_size = offsetof(aj_ring_fwd_args, side);
    fa.side = (const aj_side_tensor *)1;   /* beyond version 1: never read */
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fwd, &fa, NULL), AJ_OK);
    fa.side = NULL;
    fa.struct_size = sizeof fa;
    /* side tensors: each the op declares, checked before any work */
    aj_op *doc = parse("attention forward efficient { dtype = f32 head_dim = 8 "
                       "tensors = (doc: i32[2]) mask = expr(doc[b, q] == doc[b, k]) }");
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, doc, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: side tensor 'doc' is not given");
    int32_t ids[6] = {0, 0, 1, 1, 1, 2};
    aj_side_tensor side = {"doc", ids, AJ_SIDE_F32, 2, {1, 6}, {6, 1}};
    fa.side = &side;
    fa.num_side = 1;
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, doc, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: side tensor 'doc' is f32[2]; the op declares i32[2]");
    side.name = "docs";
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, doc, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: side[0] ('docs') is not a tensor the op declares");
    side.name = "doc";
    side.dtype = AJ_SIDE_I32;
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, doc, &fa, NULL), AJ_OK);
    fa.num_side = -1;
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, doc, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: num_side = -1 with side given; want a count of 0 or more");
    fa.num_side = 0;
    fa.side = NULL;
    aj_op_destroy(doc);
    fa.rotate = (aj_ring_rotate)9;
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fwd, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: rotate = 9 is not a rotate method");
    fa.rotate = AJ_ROTATE_P2P;

    aj_ring_bwd_args ba = AJ_RING_BWD_ARGS_INIT;
    ba.q = ba.k = ba.v = ba.o = ba.do_ = ba.dq = ba.dk = ba.dv = fa.q;
    ba.lse = fa.lse;
    ba.dq.dtype = AJ_DTYPE_F16;
    CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, bwd, &ba, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_backward: dq.dtype = f16, want f32");
    CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, fwd, &ba, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "want `attention backward flash` or `attention backward efficient`");

    /* a comm made for another device */
    aj_device *other = NULL;
    CHECK(aj_device_open(ctx, AJ_DEVICE_SIM, 0, &other) == AJ_OK);
    CHECK_STATUS(ctx, aj_ring_forward(ctx, other, comm, fwd, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_ring_forward: comm was created for another device");
    aj_device_close(other);

    free(m);
    aj_op_destroy(fwd);
    aj_op_destroy(bwd);
    aj_op_destroy(acc);
    aj_op_destroy(bias);
    aj_comm_destroy(comm);
}

int main(int argc, char **argv)
{
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    aj_device *dev = NULL;
    CHECK(aj_device_open(ctx, AJ_DEVICE_SIM, 0, &dev) == AJ_OK);
    aj_comm *comm = NULL;
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    if (argc > 1 && strcmp(argv[1], "nccl-loaded") == 0) {
        /* AJ_NCCL_LIBRARY is a stand-in that loads: the device is next */
        cc.kind = AJ_COMM_NCCL;
        CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, "aj_comm_create: the NCCL engine needs a cuda device, not sim");
        aj_device_close(dev);
        aj_ctx_destroy(ctx);
        return check_report();
    }
    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_ERR_COMM);
    CHECK_ERROR(ctx, "aj_comm_create: MPI is not initialised; call MPI_Init before "
                "aj_comm_create");

    MPI_Init(&argc, &argv);
    for (int size = 1; size <= 4; size++)
        for (int l = 0; l < AJ_SHARD_LAYOUT_COUNT; l++) {
            check_positions((aj_shard_layout)l, size);
            check_round_trip((aj_shard_layout)l, size);
            check_any_length((aj_shard_layout)l, size);
            check_varlen((aj_shard_layout)l, size);
        }
    check_shard_errors();
    check_ring_plan(dev);
    check_comm_errors(dev);
    check_ring_errors(dev);
    CHECK_MSG(!leak_check_before_finalize(), "leaks (LeakSanitizer's report above)");
    MPI_Finalize();

    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_ERR_COMM);
    CHECK_ERROR(ctx, "aj_comm_create: MPI is already finalized");
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return check_report();
}
