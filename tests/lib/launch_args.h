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
#include "cp/cp.h"   /* aj_cp_dense */

/* A contiguous (row-major) tensor of `rank` dims over data: cp/common.c's
 * aj_cp_dense, which the ring's shards use (the users link the static
 * library). */
static inline aj_tensor tensor_contiguous(void *data, aj_dtype dtype, int rank,
                                          const int64_t *shape)
{
    return aj_cp_dense(data, dtype, rank, shape);
}

/* The same with the dims written out: the first `rank` of a, b, c, d. */
static inline aj_tensor tensor_dims(void *data, aj_dtype dtype, int rank, int64_t a, int64_t b,
                                    int64_t c, int64_t d)
{
    return tensor_contiguous(data, dtype, rank, (const int64_t[4]){a, b, c, d});
}

/* The fields aj_fwd_args and aj_bwd_args share, by name: q, k, v, o,
 * lse, alibi slopes, bias, positions and totals, the dropout stream,
 * varlen offsets and lengths, side tensors, block mask, head slice and
 * stream. */
#define AJ_TESTS_FWD_BWD_SHARED(X)                                               \
    X(q) X(k) X(v) X(o) X(lse) X(alibi_slopes) X(bias) X(q_offset) X(kv_offset) \
    X(sq_total) X(sk_total) X(seed) X(offset) X(cu_seqlens_q) X(cu_seqlens_k)    \
    X(batch) X(max_seqlen_q) X(max_seqlen_k) X(side) X(num_side) X(block_mask)   \
    X(head_offset) X(heads_q_total) X(stream)

#define AJ_TESTS_COPY_FIELD(name) to.name = from->name;

/* The backward of the forward launch `from`: every field the two share,
 * with dO and the gradients' tensors. */
static inline aj_bwd_args bwd_args_after(const aj_fwd_args *from, aj_tensor do_, aj_tensor dq,
                                         aj_tensor dk, aj_tensor dv)
{
    aj_bwd_args to = AJ_BWD_ARGS_INIT;
    AJ_TESTS_FWD_BWD_SHARED(AJ_TESTS_COPY_FIELD)
    to.do_ = do_, to.dq = dq, to.dk = dk, to.dv = dv;
    return to;
}

/* The forward whose backward is `from` (the inverse of bwd_args_after;
 * o_acc and the paged fields stay unset). */
static inline aj_fwd_args fwd_args_before(const aj_bwd_args *from)
{
    aj_fwd_args to = AJ_FWD_ARGS_INIT;
    AJ_TESTS_FWD_BWD_SHARED(AJ_TESTS_COPY_FIELD)
    return to;
}

/* The fields aj_ring_fwd_args and aj_ring_bwd_args share: the shards,
 * alibi slopes, layout, rotate method, dropout stream, side tensors,
 * method and degree, varlen offsets. */
#define AJ_TESTS_RING_FWD_BWD_SHARED(X)                                          \
    X(q) X(k) X(v) X(o) X(lse) X(alibi_slopes) X(layout) X(rotate) X(seed)       \
    X(offset) X(side) X(num_side) X(method) X(ulysses_size) X(cu_seqlens_q)      \
    X(cu_seqlens_k) X(batch) X(stream)

/* The ring backward of the ring forward `from`: every field the two
 * share, with dO and the gradients' tensors. */
static inline aj_ring_bwd_args ring_bwd_args_after(const aj_ring_fwd_args *from, aj_tensor do_,
                                                   aj_tensor dq, aj_tensor dk, aj_tensor dv)
{
    aj_ring_bwd_args to = AJ_RING_BWD_ARGS_INIT;
    AJ_TESTS_RING_FWD_BWD_SHARED(AJ_TESTS_COPY_FIELD)
    to.do_ = do_, to.dq = dq, to.dk = dk, to.dv = dv;
    return to;
}

#endif /* AJ_TESTS_LAUNCH_ARGS_H */
