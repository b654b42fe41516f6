/*
 * launch_args.h -- launch arguments the tests and benchmarks build from
 * others: a contiguous tensor over memory, and a backward's arguments from
 * its forward's (aj_backward's and the ring's).  Header-only; nothing here
 * checks or allocates.
 */
#ifndef AJ_TESTS_LAUNCH_ARGS_H
#define AJ_TESTS_LAUNCH_ARGS_H

#include <stdint.h>

#include "attnjit/attnjit.h"

/* A contiguous (row-major) tensor of `rank` dims over data. */
static inline aj_tensor tensor_contiguous(void *data, aj_dtype dtype, int rank,
                                          const int64_t *shape)
{
    aj_tensor t = {.data = data, .dtype = dtype, .rank = rank};
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        stride *= shape[i];
    }
    return t;
}

/* The same with the dims written out: the first `rank` of a, b, c, d. */
static inline aj_tensor tensor_dims(void *data, aj_dtype dtype, int rank, int64_t a, int64_t b,
                                    int64_t c, int64_t d)
{
    return tensor_contiguous(data, dtype, rank, (const int64_t[4]){a, b, c, d});
}

/* The backward of the forward launch f: every field the two share (q, k,
 * v, o, lse, positions and totals, alibi slopes, bias, dropout stream,
 * varlen offsets, side tensors, block mask, stream, head slice), with dO
 * and the gradients' tensors. */
static inline aj_bwd_args bwd_args_after(const aj_fwd_args *f, aj_tensor do_, aj_tensor dq,
                                         aj_tensor dk, aj_tensor dv)
{
    aj_bwd_args a = AJ_BWD_ARGS_INIT;
    a.q = f->q, a.k = f->k, a.v = f->v, a.o = f->o, a.lse = f->lse;
    a.do_ = do_, a.dq = dq, a.dk = dk, a.dv = dv;
    a.alibi_slopes = f->alibi_slopes, a.bias = f->bias;
    a.q_offset = f->q_offset, a.kv_offset = f->kv_offset;
    a.sq_total = f->sq_total, a.sk_total = f->sk_total;
    a.seed = f->seed, a.offset = f->offset;
    a.cu_seqlens_q = f->cu_seqlens_q, a.cu_seqlens_k = f->cu_seqlens_k, a.batch = f->batch;
    a.max_seqlen_q = f->max_seqlen_q, a.max_seqlen_k = f->max_seqlen_k;
    a.side = f->side, a.num_side = f->num_side, a.block_mask = f->block_mask;
    a.head_offset = f->head_offset, a.heads_q_total = f->heads_q_total;
    a.stream = f->stream;
    return a;
}

/* The forward whose backward is b (the inverse of bwd_args_after; o_acc
 * and the paged fields stay unset). */
static inline aj_fwd_args fwd_args_before(const aj_bwd_args *b)
{
    aj_fwd_args f = AJ_FWD_ARGS_INIT;
    f.q = b->q, f.k = b->k, f.v = b->v, f.o = b->o, f.lse = b->lse;
    f.alibi_slopes = b->alibi_slopes, f.bias = b->bias;
    f.q_offset = b->q_offset, f.kv_offset = b->kv_offset;
    f.sq_total = b->sq_total, f.sk_total = b->sk_total;
    f.seed = b->seed, f.offset = b->offset;
    f.cu_seqlens_q = b->cu_seqlens_q, f.cu_seqlens_k = b->cu_seqlens_k, f.batch = b->batch;
    f.max_seqlen_q = b->max_seqlen_q, f.max_seqlen_k = b->max_seqlen_k;
    f.side = b->side, f.num_side = b->num_side, f.block_mask = b->block_mask;
    f.head_offset = b->head_offset, f.heads_q_total = b->heads_q_total;
    f.stream = b->stream;
    return f;
}

/* The ring backward of the ring forward f: every field the two share (the
 * shards, alibi slopes, layout, rotate method, dropout stream, side
 * tensors, method and degree, varlen offsets), with dO and the gradients'
 * tensors. */
static inline aj_ring_bwd_args ring_bwd_args_after(const aj_ring_fwd_args *f, aj_tensor do_,
                                                   aj_tensor dq, aj_tensor dk, aj_tensor dv)
{
    aj_ring_bwd_args a = AJ_RING_BWD_ARGS_INIT;
    a.q = f->q, a.k = f->k, a.v = f->v, a.o = f->o, a.lse = f->lse;
    a.do_ = do_, a.dq = dq, a.dk = dk, a.dv = dv;
    a.alibi_slopes = f->alibi_slopes;
    a.layout = f->layout, a.rotate = f->rotate, a.method = f->method;
    a.ulysses_size = f->ulysses_size;
    a.seed = f->seed, a.offset = f->offset;
    a.side = f->side, a.num_side = f->num_side;
    a.cu_seqlens_q = f->cu_seqlens_q, a.cu_seqlens_k = f->cu_seqlens_k, a.batch = f->batch;
    return a;
}

#endif /* AJ_TESTS_LAUNCH_ARGS_H */
