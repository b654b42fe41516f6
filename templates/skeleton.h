/*
 * skeleton.h -- what every attention template's kernel state begins with
 * (docs/design.md "Templates"): the kernel context, and the steps each
 * template takes the same way (its score programs, the per-(b, h) set-up of
 * scores, bias and dropout).
 *
 * A template's state embeds the context first, as AJ_KCTX:
 *
 *   typedef struct efwd {
 *       AJ_KCTX;              e->kb, e->op, e->sc ... and the whole as &e->k
 *       efwd_plan p;          the template's own fields
 *       ...
 *   } efwd;
 *
 * so its code reads the context's fields as its own and passes &e->k to
 * the shared steps below.
 *
 * The cpu templates (cpu_fwd.c, cpu_bwd.c) use kb, b, op, prog and drop
 * (aj_kctx_dropout) and leave sc, tid, seq_q, seq_k and bias_base unset:
 * their scores, lengths and bias slice are their aj_cpu_attn's
 * (cpu_attn.h, per (b, h) by aj_cpu_attn_init), and a work item is one
 * host thread, with no thread index.  The fields stay in the one layout
 * so that every template's state begins the same way.
 */
#ifndef AJ_TEMPLATES_SKELETON_H
#define AJ_TEMPLATES_SKELETON_H

#include "templates/attn_common.h"
#include "templates/score.h"

#define AJ_KCTX_FIELDS                                                                             \
    aj_kb *kb;                                                                                     \
    LLVMBuilderRef b;                                                                              \
    const aj_op *op;                                                                               \
    const aj_score_prog *prog;  /* the mask and score_mod (score.h) */                             \
    aj_score sc;                /* ... at the current (b, h) (GPU targets, sim; cpu: unset) */     \
    aj_attn_dropout drop;       /* the dropout stream of the current (b, h) */                     \
    LLVMValueRef tid;           /* i32: the thread (GPU targets, sim; cpu: unset) */               \
    LLVMValueRef seq_q, seq_k;  /* i32: the current sequence's lengths */                          \
    LLVMValueRef bias_base;     /* i64: element offset of the bias slice (b, h) (bias = add) */

typedef struct aj_kctx {
    AJ_KCTX_FIELDS
} aj_kctx;

/* The context as a template's first member: its fields by name, the whole
 * as `k` (the same storage). */
#define AJ_KCTX                                                                                    \
    union {                                                                                        \
        aj_kctx k;                                                                                 \
        struct {                                                                                   \
            AJ_KCTX_FIELDS                                                                         \
        };                                                                                         \
    }

/* The op's score programs, made in the builder's scratch (too large for a
 * stack) for the whole build; the status of aj_score_prog_init. */
aj_status aj_kctx_programs(aj_kb *kb, const aj_op *op, const aj_score_prog **out);

/* A check's last step, once the op's dims passed: the template's plan
 * (`planned`, its status, returned when it failed), then the op's score
 * programs (aj_score_prog_check). */
static inline aj_status aj_kctx_check_planned(aj_ctx *ctx, const aj_op *op, aj_status planned)
{
    return planned != AJ_OK ? planned : aj_score_prog_check(ctx, op);
}

/* A build's first step: the template's plan (`planned`, its status,
 * returned when it failed) and then the op's score programs into *out
 * (aj_kctx_programs). */
static inline aj_status aj_kctx_plan_programs(aj_kb *kb, const aj_op *op, aj_status planned,
                                              const aj_score_prog **out)
{
    *out = NULL;
    return planned != AJ_OK ? planned : aj_kctx_programs(kb, op, out);
}

/* The context's builder, op and programs (the rest stays as it is). */
static inline void aj_kctx_init(aj_kctx *k, aj_kb *kb, const aj_op *op,
                                const aj_score_prog *prog)
{
    k->kb = kb;
    k->b = kb->b;
    k->op = op;
    k->prog = prog;
}

/* The sequence of batch entry bidx (i32): its lengths into k->seq_q and
 * k->seq_k (layout = varlen: from cu_seqlens, aj_attn_varlen_seq_of; else
 * the parameters seq_q and seq_k) and its first packed query row and key
 * into *q_start and *k_start (i64; 0 for padded tensors). */
void aj_kctx_sequence(aj_kctx *k, LLVMValueRef bidx, LLVMValueRef *q_start,
                      LLVMValueRef *k_start);

/* The dropout stream of (bidx, h) into k->drop, for an op with dropout. */
void aj_kctx_dropout(aj_kctx *k, LLVMValueRef bidx, LLVMValueRef h);

/* bias[b, h, i, j] of the slice at k->bias_base (scalar i, j, i32; rows
 * past seq_q and keys past seq_k read the last, in bounds), as f32; NULL
 * without bias = add. */
LLVMValueRef aj_kctx_bias_at(const aj_kctx *k, LLVMValueRef i, LLVMValueRef j);

/* Per (b, h), scalar code: the score programs at (bidx, h) with the
 * totals sq, sk (NULL where unread), the bias slice's base (bias = add)
 * and the dropout stream. */
void aj_kctx_set_head(aj_kctx *k, LLVMValueRef bidx, LLVMValueRef h, LLVMValueRef sq,
                      LLVMValueRef sk);

#endif /* AJ_TEMPLATES_SKELETON_H */
