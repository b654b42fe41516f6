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

#endif /* AJ_TEMPLATES_TILE_PIPE_H */
