/*
 * ring_plan.h -- the ring's plan (internal to cp/): what a ring call
 * knows once its arguments check out -- the shards' lengths and chunks,
 * per step the (query chunk, key chunk) pairs and their class (skip /
 * full / partial), which ranks need which blocks -- made by ring_plan.c
 * before any step runs; ring.c's steps only read it.
 */
#ifndef AJ_CP_RING_PLAN_H
#define AJ_CP_RING_PLAN_H

#include "cp/comm/comm.h"
#include "cp/cp.h"
#include "runtime/runtime.h"
#include "templates/score.h"

/* One (query chunk, key chunk) pair of a step (aj_ring_pair) and the
 * totals of its sequence: the call's, or, packed documents, the pair's
 * document's; a varlen pair's globals are positions in its document. */
typedef struct ring_pair {
    int32_t step, src;
    int32_t doc;                 /* packed documents: the pair's document */
    aj_shard_chunk q, k;
    aj_ring_block block;
    int64_t sq, sk;
} ring_pair;

/* What a ring call knows once its arguments check out. */
typedef struct ring_plan {
    aj_ctx *ctx;
    aj_device *dev;
    aj_comm *comm;
    const char *fn;
    aj_op_info op;
    aj_shard_layout layout;
    aj_ring_rotate rotate;
    int rank, size;
    int members;                 /* ranks per ring rank: 1, or method = hybrid's U */
    /* method = hybrid: the rank's heads are heads head_offset .. of the
     * op's heads_q_total (aj_fwd_args); 0, 0 otherwise */
    int64_t head_offset, heads_q_total;
    int64_t B, Hq, Hkv, D, Dv;
    int64_t lq, lk;              /* this rank's lengths */
    aj_cp_shapes sh;             /* the same, with the layout of the tensors */
    aj_cp_docs docs;             /* layout = varlen: the packed batch's documents */
    ring_pair *pairs;            /* a step's pairs: 4 (varlen: 4 per document) */
    /* packed documents (plan_needs): need[r P + o], whether rank r's
     * queries see any of rank o's keys, and reach[o], the furthest ring
     * distance from o at which a rank needs o's block (0: none); NULL:
     * every rank needs every block */
    bool *need;
    int *reach;
    /* packed documents with dropout or an expression reading b: each pair
     * launches the op's varlen kernel as document `doc` of doc + 1, the
     * first doc empty (doc_cu: a step's cu_seqlens, 2 (batch + 1) int32
     * per pair in device memory, staged in doc_cu_host), so that the
     * kernel's batch index is the document's (doc_launch) */
    bool doc_kernels;
    int32_t *doc_cu, *doc_cu_host;
    size_t doc_cu_cap;           /* int32 entries of both */
    size_t *doc_cu_at;           /* [pairs]: a pair's cu_seqlens_q in them (cu_k follows) */
    int64_t sq, sk;              /* the global lengths: the sums of every rank's */
    int64_t lk_max;              /* the longest K/V shard: the size of a block's slot */
    size_t elem;                 /* bytes per element of the op's dtype */
    size_t k_elems, v_elems;     /* a K, V slot of the buffers that travel (lk_max long) */
    aj_ring_stats *stats;
    aj_score_prog prog;          /* the op's mask and score_mod (templates/score.h) */
    /* the side tensors in host memory, in the programs' order, for the
     * blocks' classes; their buffers, and the classes' load cache */
    aj_side_tensor host_side[AJ_OP_TENSORS_MAX + 1];
    void *host_mem[AJ_OP_TENSORS_MAX + 1];
    aj_score_cache *cache;
    void *stream;                /* the call's compute stream: the comm's (aj_cp_stream),
                                    or a hybrid call's (NULL: sim, cpu) */
    bool host_memory;            /* device memory is host memory (sim, cpu): the
                                    kernels read the travelling buffers in place */
    /* cuda ranks over an engine that moves device memory (NCCL): what
     * travels and what adds up stays in device memory too, the sums done
     * by the row kernels (templates/rows.c) of the op's dtype D and Dv
     * wide, and of f32 `flat` wide for whole accumulators */
    bool resident;
    /* an asynchronous call (the front door kept the caller's stream: its
     * work is all on the device): no wait at its end, and the opening
     * agreement reused where it repeats one */
    bool async;
    aj_kernel *rows_d, *rows_dv, *rows_flat;
    int64_t flat;
} ring_plan;

/* The rank whose K/V block a step computes with: p2p receives them from
 * rank r-1 one by one (r, r-1, r-2, ...); all-gather has them all and
 * goes in rank order. */
int aj_ring_step_src(const ring_plan *p, int step);

/* The longest chunk of any ring rank: the first S % n of n chunks are one
 * longer, and a hybrid group's run spans U of them. */
int64_t aj_ring_longest_chunk(const ring_plan *p, int64_t seq);

/* Step `step`'s pairs of this rank into p->pairs (*n of them), each
 * classed skip / full / partial. */
aj_status aj_ring_plan_step(const ring_plan *p, int step, int *n);

/* Whether rank r needs rank o's K/V block (plan_needs), and how far
 * around the ring o's block must go. */
bool aj_ring_needs(const ring_plan *p, int r, int o);
int aj_ring_reach_of(const ring_plan *p, int o);

/* Rank r's query (keys: key) positions: the layout's shard of the
 * totals, or of each packed document. */
int64_t aj_ring_shard_len(const ring_plan *p, int r, int keys);

/* Frees what planning allocated (the pairs, the documents, the need and
 * reach tables, the side tensors' host copies). */
void aj_ring_plan_free(ring_plan *p);

/* A collective's failure, named after the call (aj_cp_collective_status). */
aj_status aj_ring_collective_status(const ring_plan *p, aj_status st);

/* The plan of a forward (backward) call: every check, the side tensors'
 * host copies for the classes, and the ranks' agreement on the call (or,
 * inside a hybrid call, the group's agreed totals). */
aj_status aj_ring_plan_forward(ring_plan *p, aj_ctx *ctx, aj_device *dev, aj_comm *comm,
                               const aj_op *op, const aj_ring_fwd_args *a,
                               const aj_ring_group *group, aj_ring_stats *stats);
aj_status aj_ring_plan_backward(ring_plan *p, aj_ctx *ctx, aj_device *dev, aj_comm *comm,
                                const aj_op *op, const aj_ring_bwd_args *a,
                                const aj_ring_group *group, aj_ring_stats *stats);

#endif /* AJ_CP_RING_PLAN_H */
