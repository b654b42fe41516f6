/*
 * cp.h -- context parallelism's internals (cp/): the shard rules, what the
 * methods share (common.c) and each method's entry, behind the front door
 * (front.c: aj_ring_forward, aj_ring_backward).
 */
#ifndef AJ_CP_CP_H
#define AJ_CP_CP_H

#include <stdbool.h>
#include <stdint.h>

#include "attnjit/attnjit.h"
#include "templates/score.h"

/* Rank `rank`'s chunks of a `seq`-long sequence (1 contiguous, 2 zigzag),
 * any length (shard.c's rule); AJ_ERR_INVALID_ARG, naming `fn`, for a bad
 * layout, rank or size. */
aj_status aj_shard_chunks_any(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int rank,
                              int size, int64_t seq, aj_shard_chunk chunks[2], int *num_chunks);
/* Group `group`'s positions, where groups of `members` consecutive ranks
 * split a layout over groups x members ranks (method = hybrid; shard.c):
 * 1 run (contiguous) or 2 (zigzag) in local order.  members = 1 is
 * aj_shard_chunks_any. */
aj_status aj_shard_group_chunks(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int group,
                                int groups, int members, int64_t seq, aj_shard_chunk chunks[2],
                                int *num_chunks);
/* The same where one rank's length must tell the totals (aj_ring_plan,
 * aj_shard_get_chunks): AJ_ERR_INVALID_ARG, naming `fn`, if seq does not
 * split evenly. */
aj_status aj_shard_chunks(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int rank,
                          int size, int64_t seq, aj_shard_chunk chunks[2], int *num_chunks);

/* ---- shared by the context-parallel methods (common.c) */

struct aj_comm;

/* A contiguous tensor of `rank` dims over `data`. */
aj_tensor aj_cp_dense(void *data, aj_dtype dtype, int rank, const int64_t *shape);
/* The shard `t` is `name`, contiguous, of `dtype` and `shape` (errors
 * name `fn`). */
aj_status aj_cp_check_dense(aj_ctx *ctx, const char *fn, const char *name, const aj_tensor *t,
                            aj_dtype dtype, int rank, const int64_t *shape);
/* This rank's shapes, as q, k and v give them. */
typedef struct aj_cp_shapes {
    int64_t B, Hq, Hkv, D, Dv;
    int64_t lq, lk;              /* this rank's lengths */
    bool varlen;                 /* layout = varlen: q, k, v, o packed [l, H, W], lse
                                    [H, l]; B = 1 */
} aj_cp_shapes;

/* A shard tensor of the call's layout: `H` heads of `len` positions, `W`
 * wide ([B, H, len, W] or varlen [len, H, W]), or for W = 0 an LSE ([B,
 * H, len] or varlen [H, len]): contiguous over `data`. */
aj_tensor aj_cp_rows(void *data, aj_dtype dtype, const aj_cp_shapes *sh, int64_t H,
                     int64_t len, int64_t W);
/* The shard `t` is `name`, as aj_cp_rows describes it (errors name `fn`). */
aj_status aj_cp_check_rows(aj_ctx *ctx, const char *fn, const char *name, const aj_tensor *t,
                           aj_dtype dtype, const aj_cp_shapes *sh, int64_t H, int64_t len,
                           int64_t W);
/* The forward's o and lse, and the backward's o, do_, lse, dq, dk and
 * dv: this rank's shards as aj_cp_rows describes them. */
aj_status aj_cp_check_fwd_outputs(aj_ctx *ctx, const char *fn, aj_dtype dt,
                                  const aj_cp_shapes *sh, const aj_tensor *o,
                                  const aj_tensor *lse);
aj_status aj_cp_check_bwd_outputs(aj_ctx *ctx, const char *fn, aj_dtype dt,
                                  const aj_cp_shapes *sh, const aj_tensor *o,
                                  const aj_tensor *do_, const aj_tensor *lse,
                                  const aj_tensor *dq, const aj_tensor *dk,
                                  const aj_tensor *dv);
/* A shard tensor seen as a padded one, [B, H, S, W] (an LSE [B, H, S]):
 * varlen's packed [l, H, W] as [1, H, l, W] with its strides (positions
 * l apart by H W), its LSE [H, l] as [1, H, l].  The padded kernels take
 * any strides, so a run of positions of it is a padded launch's tensor. */
aj_tensor aj_cp_as_padded(const aj_tensor *t, const aj_cp_shapes *sh);

/* layout = varlen: the packed batch's documents, as every rank passes
 * them (cu_seqlens in the device's memory), read into host memory and
 * checked: batch + 1 offsets from 0, never decreasing. */
typedef struct aj_cp_docs {
    int32_t batch;
    int32_t *cu_q, *cu_k;        /* host copies, [batch + 1] each */
    int32_t max_q, max_k;        /* the longest document */
    int64_t digest;              /* of both arrays: ranks compare it */
} aj_cp_docs;
aj_status aj_cp_read_docs(aj_ctx *ctx, const char *fn, aj_device *dev, const int32_t *cu_q,
                          const int32_t *cu_k, int32_t batch, aj_cp_docs *out);
void aj_cp_docs_free(aj_cp_docs *docs);
/* Whether the op's score programs (mask or mod) read `var` (AJ_VAR_B). */
bool aj_cp_reads(const aj_score_prog *prog, int var);

/* Rank `rank`'s pieces of a packed batch of `batch` documents (cu_seqlens
 * [batch + 1], host memory), in local order: method = ring cuts each
 * document by the layout (every rank a part of every document, head and
 * tail for zigzag), and so does hybrid; Ulysses the packed axis.
 * chunk.global is the packed position; at most 2 batch pieces; *len their
 * total.  Errors name `fn`. */
aj_status aj_shard_varlen_chunks_any(aj_ctx *ctx, const char *fn, aj_cp_method method,
                                     aj_shard_layout layout, int rank, int size,
                                     const int32_t *cu_seqlens, int32_t batch,
                                     aj_shard_chunk *chunks, int32_t *count, int64_t *len);

/* The op as every method (and aj_ring_plan) takes it: a forward or
 * backward op without bias or accumulate, padded or varlen; *info, and
 * its score programs *prog.  Errors name `fn`. */
aj_status aj_cp_check_op(aj_ctx *ctx, const char *fn, const aj_op *op, aj_op_info *info,
                         aj_score_prog *prog);
/* The checks every method makes of a call: the handles, the layout, the
 * op (aj_cp_check_op, of `kind`), and q, k, v (contiguous BHSD of the op's
 * dtype, or varlen's packed [l, H, D]; GQA heads: *sh).  Errors name
 * `fn`. */
aj_status aj_cp_check_call(aj_ctx *ctx, const char *fn, aj_device *dev, struct aj_comm *comm,
                           const aj_op *op, aj_kind kind, aj_shard_layout layout,
                           const aj_tensor *q, const aj_tensor *k, const aj_tensor *v,
                           aj_op_info *info, aj_score_prog *prog, aj_cp_shapes *sh);
/* Waits for the work queued on `stream`, at most the comm's timeout
 * (AJ_ERR_COMM past it; the message names `fn` and `what`). */
aj_status aj_cp_wait(aj_device *dev, void *stream, const struct aj_comm *comm, const char *fn,
                     const char *what);
/* A collective's failure with the call's name in front of the engine's
 * message ("aj_ring_forward: MPI: rank 0: MPI_Iallgather got no answer
 * ..."); AJ_OK stays AJ_OK. */
aj_status aj_cp_collective_status(aj_ctx *ctx, const char *fn, aj_status st);

/* One small all-gather before any work: ranks whose calls differ (another
 * layout, op, length, dropout stream...) would compute a wrong answer
 * without noticing, so every rank compares its `n` values (named by
 * `names`; a NULL name: a value of the rank's own, not compared) and the
 * op's hash with rank 0's, and all fail alike.  The message is the same
 * size for every method, so ranks calling different methods meet in it
 * and are told so.  all_values (may be NULL) gets [size][n]: every rank's
 * values, whatever the status.  The comm remembers its last 8 agreements;
 * with `reuse` (an asynchronous call) one whose record this rank's repeats
 * is taken as it is, with nothing sent. */
enum { AJ_CP_CALL_FIELDS_MAX = 16 };
typedef struct aj_cp_call {      /* what each rank sends: the same size for every method */
    int64_t v[AJ_CP_CALL_FIELDS_MAX];
    char hash[AJ_HASH_HEX_LEN + 8];
} aj_cp_call;
aj_status aj_cp_agree(aj_ctx *ctx, struct aj_comm *comm, const char *fn, const aj_op *op,
                      int n, const char *const *names, const int64_t *values, bool reuse,
                      int64_t *all_values);
/* The comm's compute stream (comm->ring_stream, made on first use with the
 * comm's order_event; NULL on sim and cpu), on which every method's call
 * queues its work. */
aj_status aj_cp_stream(aj_device *dev, struct aj_comm *comm, void **out);

/* The ranks' lengths, all[r * stride + field_q] and [.. + field_k] for
 * rank r (as aj_cp_agree gathers them), sum to *sq and *sk and are each
 * rank's aj_shard_length of them.  Errors name `fn`. */
aj_status aj_cp_check_lengths(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int size,
                              const int64_t *all, int stride, int field_q, int field_k,
                              int64_t *sq, int64_t *sk);

/* method = ulysses and hybrid (ulysses.c), entered from the front door
 * (front.c) once the args are read. */
aj_status aj_ulysses_forward(aj_ctx *ctx, aj_device *dev, struct aj_comm *comm,
                             const aj_op *op, const aj_ring_fwd_args *args,
                             aj_ring_stats *stats);
aj_status aj_ulysses_backward(aj_ctx *ctx, aj_device *dev, struct aj_comm *comm,
                              const aj_op *op, const aj_ring_bwd_args *args,
                              aj_ring_stats *stats);

/* The sinks' gradient of a finished ring backward (any method): this
 * rank's rows' part, -sum exp(sink[h] - lse) dO . O per head (on the host
 * in double, rows in order; resident, by the kernel's sinks stage),
 * gathered from every rank and summed in rank order into args->dsinks
 * (common.c; resident: on the device). */
aj_status aj_cp_sinks_grad(aj_ctx *ctx, aj_device *dev, struct aj_comm *comm, const aj_op *op,
                           const aj_ring_bwd_args *args);

/* The grad side tensors' gradients of a ring backward (args->dside):
 * aj_cp_side_grad_check before the method runs (aj_check_dside_outputs,
 * and contiguous); the method leaves each rank's
 * part in the outputs; aj_cp_side_grad_sum gathers the parts from every
 * rank and writes their sum in rank order (common.c; resident: on the
 * device). */
aj_status aj_cp_side_grad_check(aj_ctx *ctx, const aj_op *op, const aj_ring_bwd_args *args);
aj_status aj_cp_side_grad_sum(aj_ctx *ctx, aj_device *dev, struct aj_comm *comm,
                              const aj_ring_bwd_args *args);
/* Whether a call of dev over `comm` is resident: cuda ranks over an
 * engine that moves device memory (NCCL), so what travels and adds up
 * stays in device memory (docs/ring.md "Devices and the NCCL engine"). */
bool aj_cp_resident(aj_device *dev, const struct aj_comm *comm);
/* A call's buffer of `bytes` (the ring's blocks and sums, Ulysses'
 * all-to-alls and shards): host memory from the device (pinned on cuda),
 * or where the call is resident a block the comm keeps; zeroed when
 * `zero` (resident: queued on `stream`).  Freed by aj_cp_buffer_free. */
aj_status aj_cp_buffer(aj_device *dev, struct aj_comm *comm, bool resident, size_t bytes,
                       int zero, void *stream, void **out);
void aj_cp_buffer_free(aj_device *dev, struct aj_comm *comm, bool resident, void *ptr);

/* Zeros `bytes` of device memory at ptr. */
aj_status aj_cp_zero(aj_ctx *ctx, aj_device *dev, const void *ptr, size_t bytes);

/* method = hybrid's ring (ulysses.c calls it between its all-to-alls):
 * each of the comm's ranks is a group of `members` ranks of a layout over
 * size x members ranks whose totals the hybrid call agreed on (sq, sk);
 * the args' tensors hold the group's positions (aj_shard_group_chunks)
 * of the rank's heads.  No agreement of its own. */
typedef struct aj_ring_group {
    int members;
    int64_t sq, sk;
    int64_t head_offset, heads_q_total;   /* the rank's heads in the op's (aj_fwd_args) */
    void *stream;                /* the hybrid call's stream, which the ring queues on */
} aj_ring_group;
aj_status aj_ring_forward_group(aj_ctx *ctx, aj_device *dev, struct aj_comm *comm,
                                const aj_op *op, const aj_ring_fwd_args *args,
                                const aj_ring_group *group, aj_ring_stats *stats);
aj_status aj_ring_backward_group(aj_ctx *ctx, aj_device *dev, struct aj_comm *comm,
                                 const aj_op *op, const aj_ring_bwd_args *args,
                                 const aj_ring_group *group, aj_ring_stats *stats);

/* method = hybrid's sub-communicators of comm for groups of U ranks
 * (hybrid.c): made on first use (collective) and kept on comm until it is
 * destroyed or another U asks; errors name `fn`. */
aj_status aj_cp_split(aj_ctx *ctx, const char *fn, struct aj_comm *comm, int U,
                      struct aj_comm **group, struct aj_comm **across);

#endif /* AJ_CP_CP_H */
