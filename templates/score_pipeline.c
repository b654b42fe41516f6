/*
 * score_pipeline.c -- the score pipeline (score.h, docs/design.md "The
 * score pipeline"): what every template does between q.k and P V, and
 * between dO.v and dS, written once.
 */
#include "templates/score.h"

#include <assert.h>
#include <math.h>

/* The constant c in the type of x (f32, or splat over x's lanes). */
static LLVMValueRef like(aj_kb *kb, LLVMValueRef x, double c)
{
    LLVMValueRef v = aj_kb_f32(kb, c);
    LLVMTypeRef t = LLVMTypeOf(x);
    if (LLVMGetTypeKind(t) != LLVMVectorTypeKind)
        return v;
    unsigned n = LLVMGetVectorSize(t);
    /* folds to a constant vector */
    LLVMValueRef one = LLVMBuildInsertElement(kb->b, LLVMGetPoison(t), v, aj_kb_i32(kb, 0), "");
    return LLVMBuildShuffleVector(kb->b, one, LLVMGetPoison(t),
                                  LLVMConstNull(LLVMVectorType(kb->t_i32, n)), "");
}

/* aj_score_compose's body; with `place` (not NULL) the positions are
 * placed where they are first needed (after the scale). */
static LLVMValueRef compose(aj_score *s, LLVMValueRef qk, aj_score_units has,
                            const aj_score_bias *bias, aj_score_place place, void *user,
                            LLVMValueRef i, LLVMValueRef j, LLVMValueRef *dmod)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    if (dmod)
        *dmod = NULL;
    /* the template gives the bias leaf's value exactly when the program has one */
    assert(!bias == (s->p->biased == AJ_EXPR_NONE));
    if (!aj_score_has_mod(s->p)) {   /* scale and log2 e in one multiplication */
        if (has == AJ_SCORE_LOG2)
            return qk;
        return LLVMBuildFMul(b, qk, like(kb, qk, (has == AJ_SCORE_RAW ? s->p->scale : 1.0) *
                                                     AJ_LOG2E), "");
    }
    assert(has != AJ_SCORE_LOG2);   /* log2 e cannot go before a score_mod or a bias */
    LLVMValueRef t = has == AJ_SCORE_RAW ? LLVMBuildFMul(b, qk, like(kb, qk, s->p->scale), "")
                                         : qk;
    if (place)
        place(user, &i, &j);
    /* the bias alone has derivative 1: no chain rule (*dmod stays NULL) */
    t = dmod && !aj_score_mod_is_bias(s->p) ? aj_score_mod_grad(s, t, bias, i, j, dmod)
                                            : aj_score_mod_value(s, t, bias, i, j);
    return LLVMBuildFMul(b, t, like(kb, t, AJ_LOG2E), "");
}

LLVMValueRef aj_score_compose(aj_score *s, LLVMValueRef qk, aj_score_units has,
                              const aj_score_bias *bias, LLVMValueRef i, LLVMValueRef j,
                              LLVMValueRef *dmod)
{
    return compose(s, qk, has, bias, NULL, NULL, i, j, dmod);
}

LLVMValueRef aj_score_compose_at(aj_score *s, LLVMValueRef qk, aj_score_units has,
                                 const aj_score_bias *bias, aj_score_place place, void *user)
{
    return compose(s, qk, has, bias, place, user, NULL, NULL, NULL);
}

LLVMValueRef aj_score_hide(aj_kb *kb, LLVMValueRef s2, LLVMValueRef visible)
{
    return LLVMBuildSelect(kb->b, visible, s2, like(kb, s2, -INFINITY), "");
}

LLVMValueRef aj_score_dropped(aj_kb *kb, double p, LLVMValueRef keep, LLVMValueRef x)
{
    LLVMValueRef kept = LLVMBuildFMul(kb->b, x, like(kb, x, 1.0 / (1.0 - p)), "");
    return LLVMBuildSelect(kb->b, keep, kept, LLVMConstNull(LLVMTypeOf(x)), "");
}

LLVMValueRef aj_score_ds(aj_kb *kb, LLVMValueRef p, LLVMValueRef dp, LLVMValueRef delta,
                         LLVMValueRef chain, LLVMValueRef live)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef ds = LLVMBuildFMul(b, p, LLVMBuildFSub(b, dp, delta, ""), "");
    if (chain)   /* the chain rule through the score_mod, 0 where not live */
        ds = LLVMBuildSelect(b, live, LLVMBuildFMul(b, ds, chain, ""),
                             LLVMConstNull(LLVMTypeOf(ds)), "");
    return ds;
}

void aj_score_p_ds(aj_score *s, LLVMValueRef qk, LLVMValueRef dp, LLVMValueRef i,
                   LLVMValueRef j, LLVMValueRef lse2, LLVMValueRef delta, LLVMValueRef visible,
                   LLVMValueRef bias, LLVMValueRef keep, LLVMValueRef *p_out,
                   LLVMValueRef *ds_out)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    LLVMValueRef dmod;
    aj_score_bias term = {bias, NULL, NULL};
    LLVMValueRef s2 = aj_score_compose(s, qk, AJ_SCORE_RAW, bias ? &term : NULL, i, j, &dmod);
    /* hidden elements never reach the exp: a row without keys has
     * LSE = -inf and would give -inf - -inf */
    LLVMValueRef pr = aj_kb_exp2(kb, LLVMBuildFSub(b, s2, lse2, ""));
    pr = LLVMBuildSelect(b, visible, pr, aj_kb_f32(kb, 0), "");
    LLVMValueRef pd = pr;
    if (keep) {   /* m = keep / (1 - p) scales P for dV and dO . v for dP */
        pd = aj_score_dropped(kb, s->p->dropout, keep, pr);
        dp = aj_score_dropped(kb, s->p->dropout, keep, dp);
    }
    *p_out = pd;
    *ds_out = aj_score_ds(kb, pr, dp, delta, dmod, visible);
}
