/*
 * tile_pipe.h -- the pipelined tile walk: the tiles a kernel visits along
 * a walk (score.h's aj_score_walk) copied into shared memory by cp.async
 * while the CTA computes on the tile before.
 *
 * With 2 stages each operand has two buffers; a step issues the next
 * tile's copies into the other buffer, closes the thread's copy group and
 * waits until one group is left in flight, its own (wait(1)).  Every
 * thread commits at every step, an empty group past the walk's end, so
 * the groups stay in step:
 *
 *   begin      issue T0 -> buf 0, commit
 *   step 0     issue T1 -> buf 1, commit, wait(1): T0 in    compute on buf 0
 *   step 1     issue T2 -> buf 0, commit, wait(1): T1 in    compute on buf 1
 *   ...        (a barrier before compute makes the copies the CTA's; one
 *               after it frees the buffer for the next step's issue)
 *
 * With 1 stage a step copies its own tile and waits for all.  Where the
 * mask has a rest (score.h), a skip tile is neither copied nor computed:
 * the tile's class is read when its copies are issued and kept for the
 * step that computes it (`gated`).  More stages would keep one class per
 * tile in flight; the kernels' schedules take 1 or 2.
 *
 *   aj_tile_pipe pp = {kb, &sc, &walk, stages, gated, copy, use, user};
 *   aj_tile_pipe_begin(&pp);
 *   for pos in walk.begin .. walk.end:
 *       x = aj_tile_pipe_step(&pp, pos, &cls);    block index x, class cls
 *       ... compute on the buffers `use` was given
 */
#ifndef AJ_TEMPLATES_TILE_PIPE_H
#define AJ_TEMPLATES_TILE_PIPE_H

#include "templates/score.h"

typedef struct aj_tile_pipe {
    aj_kb *kb;
    aj_score *sc;                 /* the scores the walk's classes come from */
    const aj_score_walk *walk;
    int stages;                   /* 1 or 2 */
    int gated;                    /* skip tiles are not copied (the mask has a rest) */
    /* issues the cp.async copies of the tile of block index x (i32) into
     * buffer `which` (i32 0 or 1; NULL: buffer 0); the pipe commits */
    void (*copy)(void *user, LLVMValueRef x, LLVMValueRef which);
    /* 2 stages: buffer `which` (i32) is the step's, called before the
     * next tile's copies are issued */
    void (*use)(void *user, LLVMValueRef which);
    void *user;
    LLVMValueRef cls, tile;       /* vars (gated): the class and tile issued last */
} aj_tile_pipe;

/* Before the walk's loop: with 2 stages, the first tile's copies. */
void aj_tile_pipe_begin(aj_tile_pipe *pp);

/* The step at walk position `pos`: its tile's block index, its class into
 * *cls (NULL unless gated) and, with 2 stages, its buffer through `use`,
 * its copies complete in this thread. */
LLVMValueRef aj_tile_pipe_step(aj_tile_pipe *pp, LLVMValueRef pos, LLVMValueRef *cls);

/*
 * The same walk by operand groups (the paged decode's K and V): each of
 * `groups` operands has one staging slot and its own copy group, issued
 * one tile ahead in operand order, so that a step consumes its operands
 * one at a time and each refills its slot with the next tile's copy as
 * soon as it has moved the landed one out.  The thread's groups in flight,
 * oldest first, are then always the step's own operand g and the
 * operands after it (then the next tile's before it), so wait(groups - 1)
 * lands exactly operand g:
 *
 *   begin      prepare(t0); barrier; issue 0(t0) .. G-1(t0), a commit each
 *   operand g  wait(G-1) barrier  land g(t)  [g = 0: prepare(t+1)]  barrier
 *              issue g(t+1), commit
 *              ... the template's math on operand g
 *
 * A tile whose class is skip (`live` false) is neither prepared, copied
 * nor landed; its groups are empty, committed all the same.
 *
 *   aj_tile_stream s = {kb, &walk, groups, tile, prepare, issue, land, user};
 *   aj_tile_stream_begin(&s);
 *   for pos in walk.begin .. walk.end:
 *       x = aj_tile_stream_step(&s, pos, &cls, &live);
 *       for g in 0 .. groups - 1:
 *           aj_tile_stream_operand(&s, g);
 *           ... compute on operand g where live
 */
typedef struct aj_tile_stream {
    aj_kb *kb;
    const aj_score_walk *walk;
    int groups;                   /* operands, each with its slot and copy group */
    /* the tile at walk position pos (i32): what the template calls it
     * (its first row), its class into *cls (NULL: no mask) and whether it
     * is computed into *live (i1) */
    LLVMValueRef (*tile)(void *user, LLVMValueRef pos, LLVMValueRef *cls, LLVMValueRef *live);
    /* before tile x's copies are issued, where live: what they read (the
     * paged row table) */
    void (*prepare)(void *user, LLVMValueRef x);
    /* operand g's copies of the tile prepared last into its slot, where
     * live; the stream commits */
    void (*issue)(void *user, int g);
    /* operand g's copies have landed in its slot: moves them where the
     * math reads them (live only) */
    void (*land)(void *user, int g);
    void *user;
    LLVMValueRef live, next, next_live;   /* the step's: set by aj_tile_stream_step */
} aj_tile_stream;

/* Before the walk's loop: the first tile prepared, its operands issued. */
void aj_tile_stream_begin(aj_tile_stream *s);

/* The step at walk position `pos`: its tile (tile's value), class and
 * liveness; the next tile looked up. */
LLVMValueRef aj_tile_stream_step(aj_tile_stream *s, LLVMValueRef pos, LLVMValueRef *cls,
                                 LLVMValueRef *live);

/* Operand g of the step: landed where it is read, its slot refilled with
 * the next tile's copies (operand 0 prepares that tile first). */
void aj_tile_stream_operand(aj_tile_stream *s, int g);

#endif /* AJ_TEMPLATES_TILE_PIPE_H */
