/*
 * schedules.c -- the schedule rules the templates share (schedules.h).
 */
#include "templates/schedules.h"

#include <stdio.h>

aj_status aj_attn_check_layout_and_dims(aj_ctx *ctx, const aj_op *op, const char *who, int max)
{
    if (op->layout != AJ_LAYOUT_PADDED)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "layout = varlen: %s supports layout = padded only", who);
    return aj_attn_check_dims(ctx, op, who, max);
}

aj_status aj_attn_check_dims(aj_ctx *ctx, const aj_op *op, const char *who, int max)
{
    int dims[2] = {op->head_dim, aj_op_dv(op)};
    const char *names[2] = {"head_dim", "head_dim_v"};
    /* a shared K/V cache's rows (MLA's latent + rope) may be wider than
     * the head dims the template takes otherwise; its V may not */
    int maxes[2] = {op->kv_shared && max >= AJ_HEAD_DIM_MAX_CPU ? AJ_HEAD_DIM_MAX_SHARED : max,
                    max};
    for (int i = 0; i < 2; i++)
        if (dims[i] % 8 != 0 || dims[i] > maxes[i])
            return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                           "%s = %d: %s supports multiples of 8 up to %d%s", names[i],
                           dims[i], who, maxes[i],
                           i == 0 && maxes[0] > max ? " with kv_shared = true" : "");
    return AJ_OK;
}

/* The op's schedule with its unset fields taken from the candidate. */
static aj_schedule complete_fieldwise(aj_schedule s, const aj_schedule *given)
{
    if (given->block_m)
        s.block_m = given->block_m;
    if (given->block_n)
        s.block_n = given->block_n;
    if (given->warps)
        s.warps = given->warps;
    if (given->stages)
        s.stages = given->stages;
    return s;
}

aj_status aj_attn_plan_schedule(aj_ctx *ctx, const aj_op *op, aj_target target,
                                const aj_attn_schedule_rule *rule, void *plan)
{
    aj_schedule (*complete)(aj_schedule, const aj_schedule *) =
        rule->complete ? rule->complete : complete_fieldwise;
    int n_main = rule->n_main > 0 ? rule->n_main : rule->n;
    int best = -1, best_state = 0, first_in_limit = -1;
    for (int i = 0; i < rule->n; i++) {
        if (i == n_main && first_in_limit >= 0)
            break;
        aj_schedule s = complete(rule->candidates[i], &op->schedule);
        if (rule->plan(NULL, op, target, &s, plan) != AJ_OK)
            continue;
        if (!rule->state)
            return AJ_OK;
        int state = rule->state(plan);
        if (state <= rule->state_goal)
            return AJ_OK;
        if (first_in_limit < 0 && state <= rule->state_limit)
            first_in_limit = i;
        if (best < 0 || state < best_state) {
            best = i;
            best_state = state;
        }
    }
    if (first_in_limit >= 0)
        best = first_in_limit;
    aj_schedule s = complete(rule->candidates[best < 0 ? 0 : best], &op->schedule);
    return rule->plan(ctx, op, target, &s, plan);
}

int aj_attn_option_regs_per_element(const aj_op *op)
{
    return 2 * (op->bias == AJ_BIAS_ADD) + 2 * (op->dropout > 0);
}

int aj_attn_score_mod_regs_per_element(const aj_op *op)
{
    /* a softcap's tanh (alone or before alibi) or an expression */
    return op->score_mod.softcap > 0 || op->score_mod.kind == AJ_SCORE_MOD_EXPR;
}
