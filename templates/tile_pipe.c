/*
 * tile_pipe.c -- the pipelined tile walk, whole tiles or by operand
 * groups (tile_pipe.h).
 */
#include "templates/tile_pipe.h"

/* Opens the block that issues the copies of the tile at walk position
 * `at` when `in` holds and, gated, only when its class is not skip, the
 * class and tile kept in pp->cls and pp->tile for the step that computes
 * it; gives the tile's block index.  issue_end closes the block. */
static LLVMValueRef issue_begin(aj_tile_pipe *pp, LLVMValueRef in, LLVMValueRef at)
{
    aj_kb *kb = pp->kb;
    if (pp->cls)
        aj_kb_set(kb, pp->cls, aj_kb_i32(kb, AJ_TILE_SKIP));
    aj_kb_if_begin(kb, in);
    if (!pp->cls)
        return at;
    LLVMValueRef c, t = aj_score_walk_tile(pp->sc, pp->walk, at, &c);
    aj_kb_set(kb, pp->cls, c);
    aj_kb_set(kb, pp->tile, t);
    aj_kb_if_begin(kb, LLVMBuildICmp(kb->b, LLVMIntNE, c, aj_kb_i32(kb, AJ_TILE_SKIP), ""));
    return t;
}

static void issue_end(aj_tile_pipe *pp)
{
    if (pp->cls)
        aj_kb_if_end(pp->kb);
    aj_kb_if_end(pp->kb);
}

/* The copies of the tile at `at` (when `in`) into buffer `which`. */
static void issue(aj_tile_pipe *pp, LLVMValueRef in, LLVMValueRef at, LLVMValueRef which)
{
    pp->copy(pp->user, issue_begin(pp, in, at), which);
    issue_end(pp);
}

void aj_tile_pipe_begin(aj_tile_pipe *pp)
{
    aj_kb *kb = pp->kb;
    const aj_score_walk *w = pp->walk;
    pp->cls = pp->gated ? aj_kb_var(kb, kb->t_i32, NULL, "cls") : NULL;
    pp->tile = pp->cls ? aj_kb_var(kb, kb->t_i32, NULL, "tile") : NULL;
    if (pp->stages == 2) {   /* the first tile's copy; each step issues the next */
        issue(pp, aj_kb_slt(kb, w->begin, w->end), w->begin, NULL);
        aj_kb_cp_async_commit(kb);
    }
}

LLVMValueRef aj_tile_pipe_step(aj_tile_pipe *pp, LLVMValueRef pos, LLVMValueRef *cls)
{
    aj_kb *kb = pp->kb;
    LLVMBuilderRef b = kb->b;
    const aj_score_walk *w = pp->walk;
    if (pp->stages != 2) {
        issue(pp, LLVMConstInt(kb->t_i1, 1, 0), pos, NULL);
        *cls = pp->cls ? aj_kb_get(kb, pp->cls) : NULL;
        LLVMValueRef x = pp->cls ? aj_kb_get(kb, pp->tile) : pos;
        aj_kb_cp_async_wait_all(kb);
        return x;
    }
    /* the class and tile issued a step ago are this step's */
    *cls = pp->cls ? aj_kb_get(kb, pp->cls) : NULL;
    LLVMValueRef x = pp->cls ? aj_kb_get(kb, pp->tile) : pos;
    LLVMValueRef cur = LLVMBuildAnd(b, LLVMBuildSub(b, pos, w->begin, ""), aj_kb_i32(kb, 1), "");
    LLVMValueRef nxt = LLVMBuildXor(b, cur, aj_kb_i32(kb, 1), "");
    pp->use(pp->user, cur);
    LLVMValueRef an = aj_kb_add(kb, pos, aj_kb_i32(kb, 1));
    issue(pp, aj_kb_slt(kb, an, w->end), an, nxt);
    aj_kb_cp_async_commit(kb);
    aj_kb_cp_async_wait(kb, 1);
    return x;
}

/* ---------------------------------------------------------------- by operand groups */

/* Operand g's copies of the tile prepared last when `live`, then -- always,
 * so that every thread's groups stay in step -- the group's close. */
static void stream_issue(aj_tile_stream *s, int g, LLVMValueRef live)
{
    aj_kb_if_begin(s->kb, live);
    s->issue(s->user, g);
    aj_kb_if_end(s->kb);
    aj_kb_cp_async_commit(s->kb);
}

void aj_tile_stream_begin(aj_tile_stream *s)
{
    aj_kb *kb = s->kb;
    const aj_score_walk *w = s->walk;
    LLVMValueRef cls, live;
    aj_kb_if_begin(kb, LLVMBuildICmp(kb->b, LLVMIntSLT, w->begin, w->end, ""));
    LLVMValueRef x = s->tile(s->user, w->begin, &cls, &live);
    aj_kb_if_begin(kb, live);
    s->prepare(s->user, x);
    aj_kb_if_end(kb);
    aj_kb_barrier(kb);
    for (int g = 0; g < s->groups; g++)
        stream_issue(s, g, live);
    aj_kb_if_end(kb);
}

LLVMValueRef aj_tile_stream_step(aj_tile_stream *s, LLVMValueRef pos, LLVMValueRef *cls,
                                 LLVMValueRef *live)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_score_walk *w = s->walk;
    LLVMValueRef one = aj_kb_i32(kb, 1), next_cls;
    LLVMValueRef x = s->tile(s->user, pos, cls, live);
    LLVMValueRef at = LLVMBuildAdd(b, pos, one, "");
    s->next = s->tile(s->user, aj_kb_smin(kb, at, LLVMBuildSub(b, w->end, one, "")), &next_cls,
                      &s->next_live);
    s->next_live = LLVMBuildAnd(b, s->next_live, LLVMBuildICmp(b, LLVMIntSLT, at, w->end, ""),
                                "");
    s->live = *live;
    return x;
}

void aj_tile_stream_operand(aj_tile_stream *s, int g)
{
    aj_kb *kb = s->kb;
    aj_kb_cp_async_wait(kb, s->groups - 1);
    aj_kb_barrier(kb);   /* operand g landed everywhere; the math before is done */
    aj_kb_if_begin(kb, s->live);
    s->land(s->user, g);
    aj_kb_if_end(kb);
    if (g == 0) {
        aj_kb_if_begin(kb, s->next_live);
        s->prepare(s->user, s->next);
        aj_kb_if_end(kb);
    }
    aj_kb_barrier(kb);   /* the slot free; (g = 0) the next tile's table written */
    stream_issue(s, g, s->next_live);
}
