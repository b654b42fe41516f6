/*
 * op.h -- the attention op's data model (internal).
 *
 * An op is a small value: a handful of enums and tagged unions, no pointers
 * but the context it reports errors to.  The parser and the builder both
 * fill one; the printer, verifier and hash read it; templates read it
 * through aj_op_info or directly.
 *
 * The rules an op must obey live in one function, aj_op_check_field(), one
 * case per field of the text form.  Three callers share it:
 *
 *   aj_op_verify ---> aj_op_check ----> aj_op_check_field (every field)
 *   aj_op_parse ----> aj_op_check       (maps the field to its line:col)
 *   aj_op_set_* ----> aj_op_check_field (the field it changes, on a copy)
 */
#ifndef AJ_IR_OP_H
#define AJ_IR_OP_H

#include "attnjit/attnjit.h"
#include "ir/diag.h"
#include "ir/expr.h"

/* Defaults and limits of the op's fields (docs/ir.md). */
#define AJ_DEFAULT_HEAD_DIM 64
#define AJ_HEAD_DIM_MAX 1024
#define AJ_WINDOW_MAX INT32_MAX

typedef struct aj_mask_spec {
    aj_mask_kind kind;
    aj_align align;        /* causal and window */
    int64_t left, right;   /* window only; both >= 0 */
    uint16_t root;         /* expr only: its tree in aj_op.expr */
} aj_mask_spec;

typedef struct aj_score_mod_spec {
    aj_score_mod kind;
    double softcap;        /* softcap, and alibi after one: finite, > 0; else 0 */
    uint16_t root;         /* expr only: its tree in aj_op.expr */
    bool grad;             /* alibi only: its slopes get a gradient (alibi(grad)) */
    /* alibi only: 1 + the index of its slopes' side tensor (alibi(NAME));
     * 0: the launch's alibi_slopes */
    int32_t slopes;
} aj_score_mod_spec;

struct aj_op {
    aj_ctx *ctx;
    aj_kind kind;
    aj_variant variant;
    aj_dtype dtype;
    int32_t head_dim;      /* unused by merge ops, which keep the default */
    int32_t head_dim_v;    /* 0 until set: means head_dim */
    aj_mask_spec mask;
    aj_score_mod_spec score_mod;
    /* learned sinks (forward and backward): 1 + the index of the side
     * tensor of one logit per query head; 0: none */
    int32_t sinks;
    double scale;          /* AJ_SCALE_DEFAULT or finite > 0 */
    double dropout;        /* 0 <= p < 1 */
    aj_bias bias;
    aj_layout layout;
    aj_dtype kv_dtype;     /* when kv_dtype_set; else dtype (f8 or paged only) */
    bool kv_dtype_set;
    aj_dtype q_dtype;      /* forward only, when q_dtype_set: f8 queries; else dtype */
    bool q_dtype_set;
    int32_t splits;        /* paged only: 0 = chosen at launch */
    int32_t warpgroups;    /* flash forward: wgmma warpgroups (0: mma.sync) */
    int32_t producer;      /* wgmma: 1, a producer warpgroup loads (warp specialised) */
    aj_layout q_layout;    /* paged only: padded or varlen queries */
    bool kv_shared;        /* paged only: V is the first head_dim_v columns of K's cache */
    bool accumulate;       /* forward only */
    bool deterministic;    /* backward only */
    aj_schedule schedule;  /* 0 fields: template default */
    aj_target target;      /* AJ_TARGET_ANY: not pinned */

    /* Side tensors, in declaration order, and the nodes of the mask and
     * score_mod expressions (ir/expr.h); only the trees at the two roots
     * are live, a setter that replaces an expression drops its nodes. */
    int32_t tensor_count;
    aj_tensor_decl tensors[AJ_OP_TENSORS_MAX];
    /* bit t: tensor t is declared `grad` (f32): the backward computes
     * its gradient (docs/ir.md "Gradients of side tensors") */
    uint32_t tensor_grad;
    aj_expr expr;

    /* First builder error, kept until the op is destroyed. */
    aj_status sticky;
    char sticky_msg[256];
};

/* Effective value of head_dim_v. */
static inline int32_t aj_op_dv(const aj_op *op)
{
    return op->head_dim_v ? op->head_dim_v : op->head_dim;
}

/* Every schedule field left to the template (the tuner's to choose), the
 * template itself included (warpgroups). */
static inline bool aj_op_schedule_is_default(const aj_op *op)
{
    return op->schedule.block_m == 0 && op->schedule.block_n == 0 &&
           op->schedule.warps == 0 && op->schedule.stages == 0 && op->warpgroups == 0 &&
           op->producer == 0;
}

/* Whether a launch of the op reads alibi_slopes (aj_fwd_args): score_mod
 * = alibi without a tensor of its own (alibi(NAME) reads side tensor
 * NAME). */
static inline bool aj_op_info_alibi_slopes(const aj_op_info *op)
{
    return op->score_mod == AJ_SCORE_MOD_ALIBI && op->alibi_tensor < 0;
}

/* Effective kv_dtype: the op's, or its dtype. */
static inline aj_dtype aj_op_kv_dtype(const aj_op *op)
{
    return op->kv_dtype_set ? op->kv_dtype : op->dtype;
}

/* Effective q_dtype: the op's, or its dtype. */
static inline aj_dtype aj_op_q_dtype(const aj_op *op)
{
    return op->q_dtype_set ? op->q_dtype : op->dtype;
}

/* Whether the op reads 8-bit floats: f8 queries or an f8 K/V (either
 * comes with its f32 descales, docs/ir.md "FP8 inputs"). */
static inline bool aj_op_has_f8(const aj_op *op)
{
    return aj_op_q_dtype(op) >= AJ_DTYPE_F8E4M3 || aj_op_kv_dtype(op) >= AJ_DTYPE_F8E4M3;
}

/* Whether the op's kernel runs wgmma on Hopper: the wgmma template's
 * (schedule warpgroups), and the flash forward on 8-bit inputs, whose
 * Hopper kernel is wgmma's (docs/ir.md "FP8 inputs"): sm_90a code. */
static inline bool aj_op_runs_wgmma(const aj_op *op)
{
    return op->warpgroups ||
           (op->kind == AJ_KIND_FORWARD && op->variant == AJ_VARIANT_FLASH && aj_op_has_f8(op));
}

/* Effective scale: the op's, or 1/sqrt(head_dim). */
double aj_op_scale(const aj_op *op);

/* ---------------------------------------------------------------- fields */

/* The fields of the text form, in canonical (printed) order. */
#define AJ_FIELD_LIST(X)                  \
    X(DTYPE, "dtype")                     \
    X(HEAD_DIM, "head_dim")               \
    X(HEAD_DIM_V, "head_dim_v")           \
    X(TENSORS, "tensors")                 \
    X(MASK, "mask")                       \
    X(SCORE_MOD, "score_mod")             \
    X(SINKS, "sinks")                     \
    X(SCALE, "scale")                     \
    X(DROPOUT, "dropout")                 \
    X(BIAS, "bias")                       \
    X(LAYOUT, "layout")                   \
    X(Q_DTYPE, "q_dtype")                 \
    X(KV_DTYPE, "kv_dtype")               \
    X(Q_LAYOUT, "q_layout")               \
    X(KV_SHARED, "kv_shared")             \
    X(ACCUMULATE, "accumulate")           \
    X(DETERMINISTIC, "deterministic")     \
    X(SCHEDULE, "schedule")               \
    X(TARGET, "target")

/* What a rule can blame: the header (kind and variant) or one field. */
typedef enum aj_field {
    AJ_FIELD_HEADER = 0,
#define AJ_FIELD_ENUM(e, name) AJ_FIELD_##e,
    AJ_FIELD_LIST(AJ_FIELD_ENUM)
#undef AJ_FIELD_ENUM
    AJ_FIELD_COUNT
} aj_field;

/* Names as written in the text form; [AJ_FIELD_HEADER] is "header". */
extern const char *const aj_field_names[];

/* Value names of the text form, indexed by the enum.  The public
 * aj_*_name() functions read the same tables. */
extern const char *const aj_kind_names[];
extern const char *const aj_variant_names[];
extern const char *const aj_dtype_names[];
extern const char *const aj_mask_names[];
extern const char *const aj_align_names[];
extern const char *const aj_score_mod_names[];
extern const char *const aj_bias_names[];
extern const char *const aj_layout_names[];
extern const char *const aj_target_names[];

/* Merge ops accept only dtype, head_dim_v and target. */
bool aj_field_in_merge(aj_field field);
/* "FIELD does not apply to merge ops (...)" into msg. */
void aj_merge_misfit_msg(aj_field field, char *msg, size_t cap);

/* ---------------------------------------------------------------- rules */

/* Checks one field of op (AJ_FIELD_HEADER: kind and variant).  Returns
 * AJ_OK; AJ_ERR_INVALID_ARG when the value is out of range on its own;
 * AJ_ERR_VERIFY when a valid value does not fit the op's kind or variant.
 * On failure msg holds one sentence naming the field and the value.  The
 * setters pass the status on; the verifier reports both as AJ_ERR_VERIFY. */
aj_status aj_op_check_field(const aj_op *op, aj_field field, char *msg,
                            size_t cap);

/* The verifier: checks the header, then each field in canonical order, and
 * stops at the first violation.  Returns AJ_OK or AJ_ERR_VERIFY with the
 * message in msg and the offending field in *bad_field (may be NULL). */
aj_status aj_op_check(const aj_op *op, aj_field *bad_field, char *msg,
                      size_t cap);

/* Value rules the parser needs before a value reaches the op, because 0 is
 * the op's "not set" sentinel for head_dim_v and scale.  Each returns true
 * when the value is acceptable, else writes the verifier's message. */
bool aj_head_dim_ok(const char *field, int64_t head_dim, char *msg,
                    size_t cap);
bool aj_scale_ok(double scale, char *msg, size_t cap);

/* ---------------------------------------------------------------- text */

/* Longest canonical text of an op, terminating NUL included: under 700
 * bytes of fixed fields, 8 tensor declarations of under 48 bytes, and
 * under 40 bytes per expression node (the longest: a load of rank 4, a
 * number, a clamp). */
#define AJ_CANONICAL_MAX 16384

/* The scope an op's mask (score_mod false) or score_mod expression is
 * typed in: the op's tensors, and `score` for the score_mod. */
aj_expr_scope aj_op_expr_scope(const aj_op *op, bool score_mod);

/* The tensors a backward's gradient is asked for, bit t: the op's
 * tensor_grad, and bit tensor_count for alibi(grad)'s slopes (the score
 * program's tensor after the op's own); 0 for other kinds. */
uint32_t aj_op_grad_bits(const aj_op *op);

/* Parses `text` (len bytes), an expression of the op's mask (score_mod
 * false) or score_mod, into op->expr, typed against op's tensors; the root
 * in *root.  The bool / float result rule is aj_op_check_field's.  On
 * failure msg holds "LINE:COL: what" (positions within text) and the
 * status is AJ_ERR_PARSE (syntax) or AJ_ERR_VERIFY (types, names,
 * limits). */
aj_status aj_expr_parse(aj_op *op, bool score_mod, const char *text,
                        size_t len, uint16_t *root, char *msg, size_t cap);

/* Writes the canonical text of op into buf (NUL-terminated) and its length,
 * without the NUL, into *len.  AJ_ERR_INTERNAL if it does not fit. */
aj_status aj_op_canonical(const aj_op *op, char *buf, size_t cap,
                          size_t *len);

/* Room for any number aj_format_number writes, NUL included. */
#define AJ_NUMBER_MAX 48

/* The canonical spelling of a double: the shortest decimal that reads back
 * to the same value, always with a '.' or an exponent ("30.0", "0.1",
 * "1e-05"); "nan", "inf" and "-inf" for messages about bad values.  The
 * decimal point is '.' whatever the C locale says. */
void aj_format_number(double value, char out[AJ_NUMBER_MAX]);

#endif /* AJ_IR_OP_H */
