/*
 * sinks_grad.h -- the stage that computes the gradient of learned sinks
 * (sinks_grad.c), appended to every backward kernel of an op with sinks.
 */
#ifndef AJ_TEMPLATES_SINKS_GRAD_H
#define AJ_TEMPLATES_SINKS_GRAD_H

#include "templates/params.h"
#include "templates/score.h"

/* Builds stage "dsinks" (parameters AJ_KSIG_SINKS_GRAD) for op (with
 * sinks) on the builder's target: dsinks[h] = -sum over the head's rows
 * of exp(sink - LSE) dO . O, in a fixed order. */
void aj_sinks_grad_build(aj_kb *kb, const aj_op *op, const aj_score_prog *prog);

#endif /* AJ_TEMPLATES_SINKS_GRAD_H */
