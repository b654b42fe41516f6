/*
 * schedules.h -- what every template's schedule rules share: the head-dim
 * and layout checks, the default-schedule rule (candidates in order, the
 * first whose plan fits, a per-thread state budget), and the register
 * counts the options add per score element.
 */
#ifndef AJ_TEMPLATES_SCHEDULES_H
#define AJ_TEMPLATES_SCHEDULES_H

#include "ir/op.h"

/* The padded-layout, head-dim rules both efficient templates share:
 * AJ_ERR_UNSUPPORTED naming the option, `who` ("efficient forward") in
 * the message. */
aj_status aj_attn_check_layout_and_dims(aj_ctx *ctx, const aj_op *op, const char *who, int max);
/* The largest head dims (D and Dv alike) the templates take
 * (docs/design.md, "Head dims"): the flash templates on mma.sync 512 (the
 * forward splits Dv past 256 across warp pairs, templates/flash_fwd.c
 * "Head dims past 256"; the backward's warp grids split every product's
 * columns; the wgmma forward splits Dv across its two warpgroups), their
 * wgmma backward and FP8 inputs 256, the cpu kernels' stack tiles 512. */
#define AJ_HEAD_DIM_MAX_FLASH 512
#define AJ_HEAD_DIM_MAX_GPU 256
#define AJ_HEAD_DIM_MAX_CPU 512
/* ... the efficient (SIMT) templates', whose plans size their tiles to
 * the head dims and refuse what does not fit */
#define AJ_HEAD_DIM_MAX_EFFICIENT 512
/* ... and the cpu's head_dim over a shared K/V cache (kv_shared: MLA's
 * 512 latent + 64 rope columns), its head_dim_v still within 512 */
#define AJ_HEAD_DIM_MAX_SHARED 576

/* The head-dim rule alone (multiples of 8 up to `max`), for templates
 * that take both layouts. */
aj_status aj_attn_check_dims(aj_ctx *ctx, const aj_op *op, const char *who, int max);

/*
 * The default-schedule rule of the GPU templates.  `plan` is a template's
 * model of one concrete schedule (registers, shared memory, tiling): it
 * fills the template's plan struct and returns AJ_OK, or
 * AJ_ERR_UNSUPPORTED with a message naming the limit (into ctx; ctx may
 * be NULL to probe).  aj_attn_plan_schedule completes the op's schedule
 * (its fields left at 0) from each candidate in turn, in the template's
 * order of preference, and keeps the first one `plan` accepts, so a
 * default is by construction a schedule the template's own check takes.
 * With `state`, a candidate must also keep state(plan) <= state_goal; if
 * none of the first n_main (all, when 0) does, the first of them within
 * state_limit (when set) wins; else the first of the rest within the goal,
 * else the accepted one with the least state.  When no
 * candidate is accepted, the first one's refusal is reported.
 */
typedef aj_status (*aj_attn_plan_fn)(aj_ctx *ctx, const aj_op *op, aj_target target,
                                     const aj_schedule *s, void *plan);

typedef struct aj_attn_schedule_rule {
    const aj_schedule *candidates;
    int n;
    aj_attn_plan_fn plan;
    /* optional: the op's fields over a candidate (NULL: each field the op
     * sets replaces the candidate's) */
    aj_schedule (*complete)(aj_schedule candidate, const aj_schedule *given);
    /* optional: a plan's per-thread state, and the most a default keeps */
    int (*state)(const void *plan);
    int state_goal;
    int state_limit; /* optional (0: none): past the goal, the first within it */
    int n_main;      /* optional (0: n): candidates before the last resorts */
} aj_attn_schedule_rule;

aj_status aj_attn_plan_schedule(aj_ctx *ctx, const aj_op *op, aj_target target,
                                const aj_attn_schedule_rule *rule, void *plan);

/* Registers the op's per-score-element work keeps in flight beyond the
 * score: about two each for dropout's Philox and for bias (its load).
 * The compilers interleave it over every score element a thread owns, so
 * a state model counts it per element. */
int aj_attn_option_regs_per_element(const aj_op *op);

/* One more per score element for a score mod's own temporaries (softcap's
 * tanh; an expression's, which may call tanh, exp or log): the flash
 * templates' default rules count it (softcap at head dims 200..256 beside
 * Dv 224 spilled without), their checks do not. */
int aj_attn_score_mod_regs_per_element(const aj_op *op);

#endif /* AJ_TEMPLATES_SCHEDULES_H */
