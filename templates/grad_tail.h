/*
 * grad_tail.h -- the stages a backward kernel ends with when its op has
 * parameters beyond Q, K and V (docs/design.md "Gradients of side
 * tensors"), one list for every backward template:
 *
 *   "dsinks"      (sinks_grad.c)  an op with learned sinks
 *   "dside"       (side_grad.c)   an op with grad side tensors: each part
 *                                 of a (b, h)'s rows into its partial sums
 *   "dside_sum"   (side_grad.c)   the parts added in order, per tensor
 *
 * and the small pieces those stages share.
 */
#ifndef AJ_TEMPLATES_GRAD_TAIL_H
#define AJ_TEMPLATES_GRAD_TAIL_H

#include "templates/params.h"
#include "templates/score.h"

/* The tail's stages of `op` (a backward: else none) on `target` into
 * sigs (at most 3), in launch order; returns their number. */
int aj_grad_tail_sigs(const aj_op *op, aj_target target, aj_kernel_sig *sigs);

/* Builds them, after the template's own stages. */
void aj_grad_tail_build(aj_kb *kb, const aj_op *op, const aj_score_prog *prog);

/* Builds stage "dsinks" (AJ_KSIG_SINKS_GRAD) for op (with sinks):
 * dsinks[h] = -sum over the head's rows of exp(sink - LSE) dO . O, in a
 * fixed order. */
void aj_sinks_grad_build(aj_kb *kb, const aj_op *op, const aj_score_prog *prog);
/* Builds stages "dside" (AJ_KSIG_SIDE_GRAD; not on the cpu) and
 * "dside_sum" (AJ_KSIG_SIDE_GRAD_SUM) for op (with grad tensors). */
void aj_side_grad_build(aj_kb *kb, const aj_op *op, const aj_score_prog *prog);

/* The partial sums of part (b, h, m) (i32 or i64 indices), zeroed by
 * `threads` threads (thread tid) where `on` (i1; NULL: always) holds,
 * from the parameters dside_part, dside_parts, dside_part_size and the
 * side tensors' sizes; each grad tensor's first element in it into
 * base[t] (i64). */
LLVMValueRef aj_side_grad_part(aj_kb *kb, const aj_score_prog *p, LLVMValueRef bidx,
                               LLVMValueRef h, LLVMValueRef m, LLVMValueRef tid, int threads,
                               LLVMValueRef on, LLVMValueRef *base);
/* The cpu's terms of row i and keys jv (s->lanes lanes): dS (the
 * gradient of the score, P (dP - Delta)) times each grad load's
 * derivative at the score t = scale q.k (and the bias leaf's value
 * `bias`, NULL: none), added to the part in (load, lane) order where
 * `live` (<W x i1>) holds and the element is inside its tensor. */
void aj_side_grad_add_lanes(aj_score *s, const LLVMValueRef *base, LLVMValueRef part,
                            LLVMValueRef t, const aj_score_bias *bias, LLVMValueRef ds,
                            LLVMValueRef live, LLVMValueRef i, LLVMValueRef jv);

/* The element of tensor parameter t (of dtype) at element offset `at`
 * (i64), as f32. */
LLVMValueRef aj_tail_load(aj_kb *kb, aj_param_source t, aj_dtype dtype, LLVMValueRef at);
/* sum over d < n of a[row_a + d] b[row_b + d] (f32) for tensor
 * parameters a and b of dtype, row offsets in elements (i64); the cpu
 * reads 8 columns at a time where n allows. */
LLVMValueRef aj_tail_row_dot(aj_kb *kb, aj_param_source a, LLVMValueRef row_a,
                             aj_param_source b_, LLVMValueRef row_b, int n, aj_dtype dtype);
/* exp(x) of f32 x on the target. */
LLVMValueRef aj_tail_exp(aj_kb *kb, LLVMValueRef x);

#endif /* AJ_TEMPLATES_GRAD_TAIL_H */
