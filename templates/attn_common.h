/*
 * attn_common.h -- pieces every template emits the same way: tanh, the
 * dropout stream and the accumulate merge's weights (what a score becomes, the backward's P and dS, and
 * dropout's scaling are the score pipeline's, score.h).  One
 * definition each, so forward and backward can never disagree on a score
 * or a dropped element (masks and score mods themselves live in score.h;
 * the layouts' rows and pages in layouts.h; the schedule rules in
 * schedules.h, both included here for the templates that include this).
 */
#ifndef AJ_TEMPLATES_ATTN_COMMON_H
#define AJ_TEMPLATES_ATTN_COMMON_H

#include "codegen/kbuilder.h"
#include "ir/op.h"
#include "templates/layouts.h"
#include "templates/params.h"
#include "templates/schedules.h"

/* tanh(x) = sign(x) (1 - 2 / (2^(2|x| log2 e) + 1)): accurate to ~1e-7
 * absolute, unlike tanh.approx.f32 (2^-11 relative). */
LLVMValueRef aj_attn_tanh(aj_kb *kb, LLVMValueRef x);

/*
 * The dropout stream of one (batch, query head): Philox4x32-10 with key
 * (lo32(seed), hi32(seed ^ offset)) and counter (lo32(kv_pos), lo32(q_pos),
 * lo32(b Hq + h), lo32(offset)), where Hq is the op's query heads
 * (parameter heads_q_total) and h the global head (head_offset + the
 * kernel's head `h`, i32), so a head shard's kernel draws the unsharded
 * op's mask; i32 adds of local i and j to the position bases wrap as
 * lo32 of the i64 positions do.
 */
typedef struct aj_attn_dropout {
    LLVMValueRef key[2];
    LLVMValueRef ctr[4];   /* bases: lo32(kv_offset), lo32(q_offset), b Hq + h, lo32(offset) */
} aj_attn_dropout;

aj_attn_dropout aj_attn_dropout_stream(aj_kb *kb, LLVMValueRef seed, LLVMValueRef offset,
                                       LLVMValueRef q_offset, LLVMValueRef kv_offset,
                                       LLVMValueRef bidx, LLVMValueRef h);
/* Whether element (i, j) is kept: (out[0] >> 8) 2^-24 >= p, i.e.
 * (out[0] >> 8) >= ceil(p 2^24) exactly. */
LLVMValueRef aj_attn_dropout_keep(aj_kb *kb, const aj_attn_dropout *d, double p,
                                  LLVMValueRef i, LLVMValueRef j);

/*
 * accumulate on the GPU targets and sim: the weights that merge a row
 * whose LSE in log2 units is l2_new into the prior LSE lse_prior (natural
 * log, as stored; f32) by docs/design.md "Merge of two partials":
 * *w_prior, *w_new and the merged LSE *lse_out (natural log), -inf with
 * both weights 0 where both LSEs are -inf.
 */
void aj_attn_merge_weights(aj_kb *kb, LLVMValueRef lse_prior, LLVMValueRef l2_new,
                           LLVMValueRef *w_prior, LLVMValueRef *w_new, LLVMValueRef *lse_out);

/*
 * FP8 inputs (docs/ir.md "FP8 inputs"): the descales of query head h and
 * KV head hkv (i32): *score, the factor of q.k (q_scale[h] k_scale[hkv],
 * either alone where only that input is f8), and *out, the factor of P V
 * (v_scale[hkv]); NULL where no input they scale is f8.  A descale of one
 * element has stride 0 (its BSTRIDE parameter), one per head stride 1.
 */
void aj_attn_descales(aj_kb *kb, const aj_op *op, LLVMValueRef h, LLVMValueRef hkv,
                      LLVMValueRef *score, LLVMValueRef *out);

#endif /* AJ_TEMPLATES_ATTN_COMMON_H */
