/*
 * op.c -- the attention op: builder, names, info and the verifier.
 *
 * Every rule about the values an op may hold is a case of
 * aj_op_check_field().  The setters run it on a candidate copy of the op and
 * commit the copy only if it passes, so an op built through the API never
 * holds a value the verifier would reject; a failing setter leaves the op
 * as it was and records its error as the op's sticky error (the first one
 * wins), which aj_op_verify() returns again.
 */
#include "ir/op.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- names */

#define AJ_FIELD_NAME(e, name) [AJ_FIELD_##e] = name,
const char *const aj_field_names[] = {
    [AJ_FIELD_HEADER] = "header",
    AJ_FIELD_LIST(AJ_FIELD_NAME)
};
#undef AJ_FIELD_NAME
static_assert(AJ_COUNT_OF(aj_field_names) == AJ_FIELD_COUNT, "field names");

const char *const aj_kind_names[] = {
    [AJ_KIND_FORWARD] = "forward",
    [AJ_KIND_BACKWARD] = "backward",
    [AJ_KIND_MERGE] = "merge",
};
static_assert(AJ_COUNT_OF(aj_kind_names) == AJ_KIND_COUNT, "kind names");

const char *const aj_variant_names[] = {
    [AJ_VARIANT_NONE] = "none",
    [AJ_VARIANT_FLASH] = "flash",
    [AJ_VARIANT_EFFICIENT] = "efficient",
};
static_assert(AJ_COUNT_OF(aj_variant_names) == AJ_VARIANT_COUNT,
              "variant names");

const char *const aj_dtype_names[] = {
    [AJ_DTYPE_F16] = "f16",
    [AJ_DTYPE_BF16] = "bf16",
    [AJ_DTYPE_F32] = "f32",
    [AJ_DTYPE_F8E4M3] = "f8e4m3",
    [AJ_DTYPE_F8E5M2] = "f8e5m2",
};
static_assert(AJ_COUNT_OF(aj_dtype_names) == AJ_DTYPE_COUNT, "dtype names");

const char *const aj_mask_names[] = {
    [AJ_MASK_NONE] = "none",
    [AJ_MASK_CAUSAL] = "causal",
    [AJ_MASK_WINDOW] = "window",
    [AJ_MASK_EXPR] = "expr",
};
static_assert(AJ_COUNT_OF(aj_mask_names) == AJ_MASK_COUNT, "mask names");

const char *const aj_align_names[] = {
    [AJ_ALIGN_TOP_LEFT] = "top_left",
    [AJ_ALIGN_BOTTOM_RIGHT] = "bottom_right",
};
static_assert(AJ_COUNT_OF(aj_align_names) == AJ_ALIGN_COUNT, "align names");

const char *const aj_score_mod_names[] = {
    [AJ_SCORE_MOD_NONE] = "none",
    [AJ_SCORE_MOD_SOFTCAP] = "softcap",
    [AJ_SCORE_MOD_ALIBI] = "alibi",
    [AJ_SCORE_MOD_EXPR] = "expr",
};
static_assert(AJ_COUNT_OF(aj_score_mod_names) == AJ_SCORE_MOD_COUNT,
              "score_mod names");

const char *const aj_bias_names[] = {
    [AJ_BIAS_NONE] = "none",
    [AJ_BIAS_ADD] = "add",
};
static_assert(AJ_COUNT_OF(aj_bias_names) == AJ_BIAS_COUNT, "bias names");

const char *const aj_layout_names[] = {
    [AJ_LAYOUT_PADDED] = "padded",
    [AJ_LAYOUT_VARLEN] = "varlen",
    [AJ_LAYOUT_PAGED] = "paged",
};
static_assert(AJ_COUNT_OF(aj_layout_names) == AJ_LAYOUT_COUNT,
              "layout names");

const char *const aj_target_names[] = {
    [AJ_TARGET_ANY] = "any",
    [AJ_TARGET_SM_80] = "sm_80",
    [AJ_TARGET_SM_90] = "sm_90",
    [AJ_TARGET_SM_90A] = "sm_90a",
    [AJ_TARGET_SIM] = "sim",
    [AJ_TARGET_CPU] = "cpu",
    [AJ_TARGET_SM_89] = "sm_89",
};
static_assert(AJ_COUNT_OF(aj_target_names) == AJ_TARGET_COUNT,
              "target names");

/* NULL for a value outside the enum. */
static const char *name_or_null(const char *const *names, int count,
                                int value)
{
    return value >= 0 && value < count ? names[value] : NULL;
}

const char *aj_kind_name(aj_kind kind)
{
    return name_or_null(aj_kind_names, AJ_KIND_COUNT, (int)kind);
}

const char *aj_variant_name(aj_variant variant)
{
    return name_or_null(aj_variant_names, AJ_VARIANT_COUNT, (int)variant);
}

const char *aj_dtype_name(aj_dtype dtype)
{
    return name_or_null(aj_dtype_names, AJ_DTYPE_COUNT, (int)dtype);
}

const char *aj_target_name(aj_target target)
{
    return name_or_null(aj_target_names, AJ_TARGET_COUNT, (int)target);
}

aj_status aj_target_from_name(aj_ctx *ctx, const char *name, aj_target *out)
{
    AJ_CHECK_ARG(ctx, name, "aj_target_from_name: name is NULL");
    AJ_CHECK_ARG(ctx, out, "aj_target_from_name: out is NULL");
    for (int t = 0; t < AJ_TARGET_COUNT; t++) {
        if (strcmp(name, aj_target_names[t]) == 0) {
            *out = (aj_target)t;
            return AJ_OK;
        }
    }
    return aj_fail(ctx, AJ_ERR_INVALID_ARG,
                   "aj_target_from_name: unknown target '%s' (expected any, "
                   "sm_80, sm_89, sm_90, sm_90a, sim or cpu)", name);
}

/* ---------------------------------------------------------------- create */

/* Every field at its default (docs/ir.md, "Fields"). */
static void op_init(aj_op *op, aj_ctx *ctx, aj_kind kind, aj_variant variant)
{
    memset(op, 0, sizeof *op);
    op->ctx = ctx;
    op->kind = kind;
    op->variant = variant;
    op->dtype = AJ_DTYPE_F32;
    op->head_dim = AJ_DEFAULT_HEAD_DIM;
    op->scale = AJ_SCALE_DEFAULT;
    op->sticky = AJ_OK;
}

aj_status aj_op_create(aj_ctx *ctx, aj_kind kind, aj_variant variant,
                       aj_op **out)
{
    char msg[AJ_ERROR_TEXT_MAX / 2];
    aj_status st;
    aj_op op, *made;

    AJ_CHECK_ARG(NULL, ctx, "aj_op_create: ctx is NULL");
    AJ_CHECK_ARG(ctx, out, "aj_op_create: out is NULL");
    op_init(&op, ctx, kind, variant);
    st = aj_op_check_field(&op, AJ_FIELD_HEADER, msg, sizeof msg);
    if (st != AJ_OK)
        return aj_fail(ctx, st, "aj_op_create: %s", msg);
    made = malloc(sizeof *made);
    if (!made)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_op_create: out of memory");
    *made = op;
    *out = made;
    return AJ_OK;
}

void aj_op_destroy(aj_op *op)
{
    if (op)
        aj_expr_free(&op->expr);
    free(op);
}

aj_status aj_op_clone(const aj_op *op, aj_op **out)
{
    aj_op *copy;

    AJ_CHECK_ARG(NULL, op, "aj_op_clone: op is NULL");
    AJ_CHECK_ARG(op->ctx, out, "aj_op_clone: out is NULL");
    copy = malloc(sizeof *copy);
    if (!copy)
        return aj_fail(op->ctx, AJ_ERR_OUT_OF_MEMORY,
                       "aj_op_clone: out of memory");
    *copy = *op;
    if (!aj_expr_clone(&copy->expr, &op->expr)) {
        free(copy);
        return aj_fail(op->ctx, AJ_ERR_OUT_OF_MEMORY, "aj_op_clone: out of memory");
    }
    *out = copy;
    return AJ_OK;
}

/* ---------------------------------------------------------------- setters */

/* Records a setter's failure on the context and, if it is the op's first,
 * as the op's sticky error. */
static aj_status op_fail(aj_op *op, aj_status st, const char *fmt, ...)
    AJ_PRINTF(3, 4);

static aj_status op_fail(aj_op *op, aj_status st, const char *fmt, ...)
{
    char msg[sizeof op->sticky_msg];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (op->sticky == AJ_OK) {
        op->sticky = st;
        memcpy(op->sticky_msg, msg, sizeof msg);
    }
    return aj_fail(op->ctx, st, "%s", msg);
}

/* A candidate that rebuilt its arena (drop_expr) owns it: dropped with
 * the candidate, or the op's once committed. */
static void cand_drop(const aj_op *op, aj_op *cand)
{
    if (cand->expr.nodes != op->expr.nodes)
        aj_expr_free(&cand->expr);
}

/* Checks `field` of the candidate `cand` (a copy of op with the field
 * changed) and commits it to op if it passes (the op's arena replaced by
 * the candidate's when that is a new one), else drops it.  Every field but
 * dtype, head_dim_v and target is an error on a merge op, whatever its
 * value. */
static aj_status set_field(aj_op *op, const char *fn, aj_op *cand,
                           aj_field field)
{
    char msg[sizeof op->sticky_msg];
    aj_status st;

    if (op->kind == AJ_KIND_MERGE && !aj_field_in_merge(field)) {
        aj_merge_misfit_msg(field, msg, sizeof msg);
        st = AJ_ERR_VERIFY;
    } else {
        st = aj_op_check_field(cand, field, msg, sizeof msg);
    }
    if (st != AJ_OK) {
        cand_drop(op, cand);
        return op_fail(op, st, "%s: %s", fn, msg);
    }
    if (cand->expr.nodes != op->expr.nodes) {
        aj_expr_free(&op->expr);
        aj_expr_compact(&cand->expr);
    }
    *op = *cand;
    return AJ_OK;
}

/* A NULL op has no context to record the message on; the status says it. */
#define AJ_OP_ARG(op) AJ_CHECK_ARG(NULL, op, "%s: op is NULL", __func__)

/*
 * The setters that put one value in one field, from one list: (setter,
 * value type, field, the field the verifier checks).  The others below
 * normalise or check their value first.
 */
#define AJ_OP_PLAIN_SETTERS(X) \
    X(dtype, aj_dtype, dtype, DTYPE) \
    X(dropout, double, dropout, DROPOUT) \
    X(bias, aj_bias, bias, BIAS) \
    X(layout, aj_layout, layout, LAYOUT) \
    X(q_layout, aj_layout, q_layout, Q_LAYOUT) \
    X(kv_shared, bool, kv_shared, KV_SHARED) \
    X(splits, int32_t, splits, SCHEDULE) \
    X(warpgroups, int32_t, warpgroups, SCHEDULE) \
    X(producer, int32_t, producer, SCHEDULE) \
    X(accumulate, bool, accumulate, ACCUMULATE) \
    X(deterministic, bool, deterministic, DETERMINISTIC) \
    X(target, aj_target, target, TARGET)

#define DEFINE_SETTER(name, type, field, checked)                  \
    aj_status aj_op_set_##name(aj_op *op, type value)              \
    {                                                              \
        AJ_OP_ARG(op);                                             \
        aj_op cand = *op;                                          \
        cand.field = value;                                        \
        return set_field(op, __func__, &cand, AJ_FIELD_##checked); \
    }
AJ_OP_PLAIN_SETTERS(DEFINE_SETTER)
#undef DEFINE_SETTER

aj_status aj_op_set_head_dims(aj_op *op, int32_t head_dim, int32_t head_dim_v)
{
    char msg[sizeof op->sticky_msg];
    aj_op cand;
    aj_status st;

    AJ_OP_ARG(op);
    cand = *op;
    if (op->kind == AJ_KIND_MERGE) {
        /* A merge has one head dim, that of O, and it is head_dim_v; the
         * "0 means same as head_dim" shorthand has nothing to refer to. */
        if (head_dim != 0)
            return op_fail(op, AJ_ERR_VERIFY,
                           "%s: head_dim %d does not apply to merge ops "
                           "(pass 0 and give the dim as head_dim_v)",
                           __func__, (int)head_dim);
        if (!aj_head_dim_ok("head_dim_v", head_dim_v, msg, sizeof msg))
            return op_fail(op, AJ_ERR_INVALID_ARG, "%s: %s", __func__, msg);
        cand.head_dim_v = head_dim_v;
        return set_field(op, __func__, &cand, AJ_FIELD_HEAD_DIM_V);
    }
    cand.head_dim = head_dim;
    cand.head_dim_v = head_dim_v;
    st = aj_op_check_field(&cand, AJ_FIELD_HEAD_DIM, msg, sizeof msg);
    if (st != AJ_OK)
        return op_fail(op, st, "%s: %s", __func__, msg);
    return set_field(op, __func__, &cand, AJ_FIELD_HEAD_DIM_V);
}

/* Gives cand a new arena with only the tree of the expression field that
 * is not `field` (which is being replaced), so replaced expressions leave
 * no nodes behind; the op's arena, which cand shared, is not touched.
 * False when out of memory. */
static bool drop_expr(aj_op *cand, aj_field field)
{
    uint16_t *keep = field == AJ_FIELD_MASK ? &cand->score_mod.root
                                            : &cand->mask.root;
    bool kept = field == AJ_FIELD_MASK
                    ? cand->score_mod.kind == AJ_SCORE_MOD_EXPR
                    : cand->mask.kind == AJ_MASK_EXPR;
    aj_expr fresh = { 0 };

    /* The kept tree came from an arena of the same limit, so it fits. */
    if (kept && !aj_expr_copy(&fresh, &cand->expr, *keep, keep)) {
        aj_expr_free(&fresh);
        return false;
    }
    cand->expr = fresh;
    return true;
}

static aj_status set_mask(aj_op *op, const char *fn, aj_mask_spec mask)
{
    aj_op cand = *op;

    if (!drop_expr(&cand, AJ_FIELD_MASK))
        return op_fail(op, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    cand.mask = mask;
    return set_field(op, fn, &cand, AJ_FIELD_MASK);
}

aj_status aj_op_set_mask_none(aj_op *op)
{
    AJ_OP_ARG(op);
    return set_mask(op, __func__, (aj_mask_spec){ .kind = AJ_MASK_NONE });
}

aj_status aj_op_set_mask_causal(aj_op *op, aj_align align)
{
    AJ_OP_ARG(op);
    return set_mask(op, __func__,
                    (aj_mask_spec){ .kind = AJ_MASK_CAUSAL, .align = align });
}

aj_status aj_op_set_mask_window(aj_op *op, int64_t left, int64_t right,
                                aj_align align)
{
    AJ_OP_ARG(op);
    return set_mask(op, __func__,
                    (aj_mask_spec){ .kind = AJ_MASK_WINDOW, .align = align,
                                    .left = left, .right = right });
}

static aj_status set_score_mod(aj_op *op, const char *fn,
                               aj_score_mod_spec score_mod)
{
    aj_op cand = *op;

    if (!drop_expr(&cand, AJ_FIELD_SCORE_MOD))
        return op_fail(op, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    cand.score_mod = score_mod;
    return set_field(op, fn, &cand, AJ_FIELD_SCORE_MOD);
}

/* Parses text as the mask (field MASK) or score_mod expression of a
 * candidate and sets it. */
static aj_status set_expr(aj_op *op, const char *fn, aj_field field,
                          const char *text)
{
    const bool score_mod = field == AJ_FIELD_SCORE_MOD;
    char msg[sizeof op->sticky_msg - 64];
    aj_op cand;
    uint16_t root;
    aj_status st;

    if (!text)
        return op_fail(op, AJ_ERR_INVALID_ARG, "%s: text is NULL", fn);
    if (op->kind == AJ_KIND_MERGE) {
        aj_merge_misfit_msg(field, msg, sizeof msg);
        return op_fail(op, AJ_ERR_VERIFY, "%s: %s", fn, msg);
    }
    cand = *op;
    if (!drop_expr(&cand, field))
        return op_fail(op, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    st = aj_expr_parse(&cand, score_mod, text, strlen(text), &root, msg,
                       sizeof msg);
    if (st != AJ_OK) {
        cand_drop(op, &cand);
        return op_fail(op, st, "%s: %s", fn, msg);
    }
    if (score_mod)
        cand.score_mod = (aj_score_mod_spec){ .kind = AJ_SCORE_MOD_EXPR,
                                              .root = root };
    else
        cand.mask = (aj_mask_spec){ .kind = AJ_MASK_EXPR, .root = root };
    return set_field(op, fn, &cand, field);
}

aj_status aj_op_set_mask_expr(aj_op *op, const char *text)
{
    AJ_OP_ARG(op);
    return set_expr(op, __func__, AJ_FIELD_MASK, text);
}

aj_status aj_op_set_score_mod_expr(aj_op *op, const char *text)
{
    AJ_OP_ARG(op);
    return set_expr(op, __func__, AJ_FIELD_SCORE_MOD, text);
}

aj_status aj_op_declare_tensor(aj_op *op, const char *name,
                               aj_side_dtype dtype, int32_t rank)
{
    aj_op cand;

    AJ_OP_ARG(op);
    if (!name)
        return op_fail(op, AJ_ERR_INVALID_ARG, "%s: name is NULL", __func__);
    if (op->tensor_count == AJ_OP_TENSORS_MAX)
        return op_fail(op, AJ_ERR_VERIFY, "%s: more than %d tensors",
                       __func__, AJ_OP_TENSORS_MAX);
    if (strlen(name) > AJ_OP_TENSOR_NAME_MAX)
        return op_fail(op, AJ_ERR_INVALID_ARG, "%s: tensor name '%.40s...' is "
                       "longer than %d characters", __func__, name,
                       AJ_OP_TENSOR_NAME_MAX);
    cand = *op;
    snprintf(cand.tensors[cand.tensor_count].name,
             sizeof cand.tensors[0].name, "%s", name);
    cand.tensors[cand.tensor_count].dtype = dtype;
    cand.tensors[cand.tensor_count].rank = rank;
    cand.tensor_count++;
    return set_field(op, __func__, &cand, AJ_FIELD_TENSORS);
}

aj_status aj_op_set_tensor_grad(aj_op *op, const char *name, bool grad)
{
    AJ_OP_ARG(op);
    if (!name)
        return op_fail(op, AJ_ERR_INVALID_ARG, "%s: name is NULL", __func__);
    if (strcmp(name, "alibi_slopes") == 0)
        return aj_op_set_alibi_grad(op, grad);
    for (int i = 0; i < op->tensor_count; i++) {
        if (strcmp(op->tensors[i].name, name) != 0)
            continue;
        aj_op cand = *op;
        cand.tensor_grad = grad ? cand.tensor_grad | 1u << i : cand.tensor_grad & ~(1u << i);
        return set_field(op, __func__, &cand, AJ_FIELD_TENSORS);
    }
    return op_fail(op, AJ_ERR_INVALID_ARG, "%s: no side tensor '%.40s' is declared", __func__,
                   name);
}

aj_status aj_op_get_tensor_grad(const aj_op *op, int32_t index, bool *grad)
{
    AJ_OP_ARG(op);
    AJ_CHECK_ARG(op->ctx, grad, "aj_op_get_tensor_grad: grad is NULL");
    AJ_CHECK_ARG(op->ctx, index >= 0 && index < op->tensor_count,
                 "aj_op_get_tensor_grad: index = %d; the op declares %d tensors", (int)index,
                 (int)op->tensor_count);
    *grad = (op->tensor_grad >> index) & 1u;
    return AJ_OK;
}

aj_expr_scope aj_op_expr_scope(const aj_op *op, bool score_mod)
{
    return (aj_expr_scope){ .tensors = op->tensors,
                            .count = op->tensor_count,
                            .score = score_mod };
}

aj_status aj_op_set_score_mod_none(aj_op *op)
{
    AJ_OP_ARG(op);
    return set_score_mod(op, __func__,
                         (aj_score_mod_spec){ .kind = AJ_SCORE_MOD_NONE });
}

aj_status aj_op_set_softcap(aj_op *op, double cap)
{
    AJ_OP_ARG(op);
    return set_score_mod(op, __func__,
                         (aj_score_mod_spec){ .kind = AJ_SCORE_MOD_SOFTCAP,
                                              .softcap = cap });
}

aj_status aj_op_set_alibi(aj_op *op)
{
    AJ_OP_ARG(op);
    return set_score_mod(op, __func__,
                         (aj_score_mod_spec){ .kind = AJ_SCORE_MOD_ALIBI });
}

/* 1 + the index of declared tensor `name` (NULL or "": none, 0), for a
 * field that names one (sinks, alibi(NAME)); -1, reported as `fn: what`,
 * when no tensor has that name. */
static int32_t named_tensor(aj_op *op, const char *fn, const char *what, const char *name)
{
    if (!name || !*name)
        return 0;
    for (int i = 0; i < op->tensor_count; i++)
        if (strcmp(op->tensors[i].name, name) == 0)
            return i + 1;
    op_fail(op, AJ_ERR_VERIFY, "%s: %s: no side tensor of that name is declared "
            "(aj_op_declare_tensor it as f32, rank 1, first)", fn, what);
    return -1;
}

aj_status aj_op_set_alibi_with(aj_op *op, const char *slopes, double softcap)
{
    AJ_OP_ARG(op);
    char what[AJ_OP_TENSOR_NAME_MAX + 16];
    snprintf(what, sizeof what, "alibi(%.*s)", AJ_OP_TENSOR_NAME_MAX, slopes ? slopes : "");
    aj_score_mod_spec mod = {.kind = AJ_SCORE_MOD_ALIBI, .softcap = softcap,
                             .slopes = named_tensor(op, __func__, what, slopes)};
    return mod.slopes < 0 ? AJ_ERR_VERIFY : set_score_mod(op, __func__, mod);
}

aj_status aj_op_set_alibi_grad(aj_op *op, bool grad)
{
    AJ_OP_ARG(op);
    if (op->score_mod.kind != AJ_SCORE_MOD_ALIBI)
        return op_fail(op, AJ_ERR_INVALID_ARG, "%s: the score_mod is %s; only alibi's slopes "
                       "take this flag (a side tensor's gradient: aj_op_set_tensor_grad)",
                       __func__, aj_score_mod_names[op->score_mod.kind]);
    if (op->score_mod.slopes)
        return op_fail(op, AJ_ERR_INVALID_ARG, "%s: the slopes of alibi(%s) are a side tensor: "
                       "its gradient is the tensor's (aj_op_set_tensor_grad)", __func__,
                       op->tensors[op->score_mod.slopes - 1].name);
    aj_op cand = *op;
    cand.score_mod.grad = grad;
    return set_field(op, __func__, &cand, AJ_FIELD_SCORE_MOD);
}

aj_status aj_op_get_alibi_grad(const aj_op *op, bool *grad)
{
    AJ_OP_ARG(op);
    AJ_CHECK_ARG(op->ctx, grad, "aj_op_get_alibi_grad: grad is NULL");
    *grad = op->score_mod.kind == AJ_SCORE_MOD_ALIBI && op->score_mod.grad;
    return AJ_OK;
}

uint32_t aj_op_grad_bits(const aj_op *op)
{
    if (op->kind != AJ_KIND_BACKWARD)
        return 0;
    uint32_t slopes = op->score_mod.kind == AJ_SCORE_MOD_ALIBI && op->score_mod.grad;
    return op->tensor_grad | slopes << op->tensor_count;
}

aj_status aj_op_set_scale(aj_op *op, double scale)
{
    aj_op cand;

    AJ_OP_ARG(op);
    cand = *op;
    /* -0.0 compares equal to AJ_SCALE_DEFAULT: store the one default. */
    cand.scale = scale == AJ_SCALE_DEFAULT ? AJ_SCALE_DEFAULT : scale;
    return set_field(op, __func__, &cand, AJ_FIELD_SCALE);
}

aj_status aj_op_set_kv_dtype(aj_op *op, aj_dtype kv_dtype)
{
    aj_op cand;

    AJ_OP_ARG(op);
    cand = *op;
    cand.kv_dtype = kv_dtype;
    cand.kv_dtype_set = true;
    return set_field(op, __func__, &cand, AJ_FIELD_KV_DTYPE);
}

aj_status aj_op_set_q_dtype(aj_op *op, aj_dtype q_dtype)
{
    AJ_OP_ARG(op);
    aj_op cand = *op;
    cand.q_dtype = q_dtype;
    cand.q_dtype_set = true;
    return set_field(op, __func__, &cand, AJ_FIELD_Q_DTYPE);
}

aj_status aj_op_get_q_dtype(const aj_op *op, aj_dtype *q_dtype)
{
    AJ_OP_ARG(op);
    AJ_CHECK_ARG(NULL, q_dtype, "%s: q_dtype is NULL", __func__);
    *q_dtype = aj_op_q_dtype(op);
    return AJ_OK;
}

aj_status aj_op_set_sinks(aj_op *op, const char *name)
{
    AJ_OP_ARG(op);
    aj_op cand = *op;
    char what[AJ_OP_TENSOR_NAME_MAX + 16];
    snprintf(what, sizeof what, "sinks = %.*s", AJ_OP_TENSOR_NAME_MAX, name ? name : "");
    cand.sinks = named_tensor(op, __func__, what, name);
    return cand.sinks < 0 ? AJ_ERR_VERIFY : set_field(op, __func__, &cand, AJ_FIELD_SINKS);
}

aj_status aj_op_get_sinks(const aj_op *op, int32_t *tensor)
{
    AJ_OP_ARG(op);
    AJ_CHECK_ARG(op->ctx, tensor, "aj_op_get_sinks: tensor is NULL");
    *tensor = op->sinks - 1;
    return AJ_OK;
}

aj_status aj_op_get_kv_shared(const aj_op *op, bool *kv_shared)
{
    AJ_OP_ARG(op);
    AJ_CHECK_ARG(NULL, kv_shared, "%s: kv_shared is NULL", __func__);
    *kv_shared = op->kv_shared;
    return AJ_OK;
}

aj_status aj_op_get_warpgroups(const aj_op *op, int32_t *warpgroups)
{
    AJ_OP_ARG(op);
    AJ_CHECK_ARG(NULL, warpgroups, "%s: warpgroups is NULL", __func__);
    *warpgroups = op->warpgroups;
    return AJ_OK;
}

aj_status aj_op_get_producer(const aj_op *op, int32_t *producer)
{
    AJ_OP_ARG(op);
    AJ_CHECK_ARG(NULL, producer, "%s: producer is NULL", __func__);
    *producer = op->producer;
    return AJ_OK;
}

aj_status aj_op_set_schedule(aj_op *op, const aj_schedule *schedule)
{
    aj_op cand;

    AJ_OP_ARG(op);
    if (!schedule)
        return op_fail(op, AJ_ERR_INVALID_ARG, "%s: schedule is NULL",
                       __func__);
    cand = *op;
    cand.schedule = *schedule;
    return set_field(op, __func__, &cand, AJ_FIELD_SCHEDULE);
}

/* ---------------------------------------------------------------- verify */

aj_status aj_op_verify(const aj_op *op)
{
    char msg[AJ_ERROR_TEXT_MAX / 2];

    AJ_OP_ARG(op);
    if (op->sticky != AJ_OK)
        return aj_fail(op->ctx, op->sticky, "%s", op->sticky_msg);
    if (aj_op_check(op, NULL, msg, sizeof msg) != AJ_OK)
        return aj_fail(op->ctx, AJ_ERR_VERIFY, "aj_op_verify: %s", msg);
    return AJ_OK;
}

aj_status aj_op_check(const aj_op *op, aj_field *bad_field, char *msg,
                      size_t cap)
{
    for (int f = 0; f < AJ_FIELD_COUNT; f++) {
        if (aj_op_check_field(op, (aj_field)f, msg, cap) != AJ_OK) {
            if (bad_field)
                *bad_field = (aj_field)f;
            return AJ_ERR_VERIFY;
        }
    }
    return AJ_OK;
}

static bool field_is_default(const aj_op *op, aj_field field);
static aj_status check_enum(const char *what, int value, int count,
                            char *msg, size_t cap);
static aj_status check_header(const aj_op *op, char *msg, size_t cap);
static aj_status check_tensors(const aj_op *op, char *msg, size_t cap);
static aj_status check_mask(const aj_op *op, char *msg, size_t cap);
static aj_status check_score_mod(const aj_op *op, char *msg, size_t cap);
static aj_status check_sinks(const aj_op *op, char *msg, size_t cap);
static aj_status check_dropout(double p, char *msg, size_t cap);
static aj_status check_schedule(const aj_schedule *s, char *msg, size_t cap);
static aj_status check_layout(const aj_op *op, char *msg, size_t cap);
static aj_status check_splits(const aj_op *op, char *msg, size_t cap);
static aj_status check_warpgroups(const aj_op *op, char *msg, size_t cap);
static aj_status check_q_layout(const aj_op *op, char *msg, size_t cap);
static aj_status check_kv_shared(const aj_op *op, char *msg, size_t cap);
static aj_status check_q_dtype(const aj_op *op, char *msg, size_t cap);
static aj_status check_kv_dtype(const aj_op *op, char *msg, size_t cap);

aj_status aj_op_check_field(const aj_op *op, aj_field field, char *msg,
                            size_t cap)
{
    aj_status st;

    if (op->kind == AJ_KIND_MERGE && !aj_field_in_merge(field) &&
        !field_is_default(op, field)) {
        aj_merge_misfit_msg(field, msg, cap);
        return AJ_ERR_VERIFY;
    }
    switch (field) {
    case AJ_FIELD_HEADER:
        return check_header(op, msg, cap);
    case AJ_FIELD_DTYPE:
        /* the f8 dtypes are inputs' (q_dtype, kv_dtype), not O's */
        return check_enum("dtype", (int)op->dtype, AJ_DTYPE_F8E4M3, msg, cap);
    case AJ_FIELD_HEAD_DIM:
        return aj_head_dim_ok("head_dim", op->head_dim, msg, cap)
                   ? AJ_OK : AJ_ERR_INVALID_ARG;
    case AJ_FIELD_HEAD_DIM_V:
        return op->head_dim_v == 0 ||
                       aj_head_dim_ok("head_dim_v", op->head_dim_v, msg, cap)
                   ? AJ_OK : AJ_ERR_INVALID_ARG;
    case AJ_FIELD_TENSORS:
        return check_tensors(op, msg, cap);
    case AJ_FIELD_MASK:
        return check_mask(op, msg, cap);
    case AJ_FIELD_SCORE_MOD:
        return check_score_mod(op, msg, cap);
    case AJ_FIELD_SINKS:
        return check_sinks(op, msg, cap);
    case AJ_FIELD_SCALE:
        return op->scale == AJ_SCALE_DEFAULT || aj_scale_ok(op->scale, msg, cap)
                   ? AJ_OK : AJ_ERR_INVALID_ARG;
    case AJ_FIELD_DROPOUT:
        return check_dropout(op->dropout, msg, cap);
    case AJ_FIELD_BIAS:
        if ((st = check_enum("bias", (int)op->bias, AJ_BIAS_COUNT, msg, cap)))
            return st;
        if (op->bias == AJ_BIAS_ADD && op->variant != AJ_VARIANT_EFFICIENT) {
            snprintf(msg, cap, "bias = add needs the efficient variant; "
                               "flash has no bias input");
            return AJ_ERR_VERIFY;
        }
        return AJ_OK;
    case AJ_FIELD_LAYOUT:
        return check_layout(op, msg, cap);
    case AJ_FIELD_Q_DTYPE:
        return check_q_dtype(op, msg, cap);
    case AJ_FIELD_KV_DTYPE:
        return check_kv_dtype(op, msg, cap);
    case AJ_FIELD_Q_LAYOUT:
        return check_q_layout(op, msg, cap);
    case AJ_FIELD_KV_SHARED:
        return check_kv_shared(op, msg, cap);
    case AJ_FIELD_ACCUMULATE:
        if (op->accumulate && op->kind != AJ_KIND_FORWARD) {
            snprintf(msg, cap, "accumulate = true applies only to forward "
                               "ops, not %s", aj_kind_names[op->kind]);
            return AJ_ERR_VERIFY;
        }
        if (op->accumulate && op->layout == AJ_LAYOUT_PAGED) {
            snprintf(msg, cap, "accumulate = true does not apply to layout = "
                               "paged (split-KV merges its own partials)");
            return AJ_ERR_VERIFY;
        }
        return AJ_OK;
    case AJ_FIELD_DETERMINISTIC:
        if (op->deterministic && op->kind != AJ_KIND_BACKWARD) {
            snprintf(msg, cap, "deterministic = true applies only to backward "
                               "ops, not %s", aj_kind_names[op->kind]);
            return AJ_ERR_VERIFY;
        }
        return AJ_OK;
    case AJ_FIELD_SCHEDULE:
        if ((st = check_schedule(&op->schedule, msg, cap)) ||
            (st = check_splits(op, msg, cap)))
            return st;
        return check_warpgroups(op, msg, cap);
    case AJ_FIELD_TARGET:
        return check_enum("target", (int)op->target, AJ_TARGET_COUNT, msg, cap);
    case AJ_FIELD_COUNT:
        break;
    }
    snprintf(msg, cap, "no field %d", (int)field);
    return AJ_ERR_INTERNAL;
}

bool aj_field_in_merge(aj_field field)
{
    return field == AJ_FIELD_DTYPE || field == AJ_FIELD_HEAD_DIM_V ||
           field == AJ_FIELD_TARGET;
}

void aj_merge_misfit_msg(aj_field field, char *msg, size_t cap)
{
    snprintf(msg, cap,
             "%s does not apply to merge ops (merge takes only dtype, "
             "head_dim_v and target)", aj_field_names[field]);
}

/* Whether a field holds its aj_op_create() value. */
static bool field_is_default(const aj_op *op, aj_field field)
{
    switch (field) {
    case AJ_FIELD_HEADER:        return true;
    case AJ_FIELD_DTYPE:         return op->dtype == AJ_DTYPE_F32;
    case AJ_FIELD_HEAD_DIM:      return op->head_dim == AJ_DEFAULT_HEAD_DIM;
    case AJ_FIELD_HEAD_DIM_V:    return op->head_dim_v == 0;
    case AJ_FIELD_TENSORS:       return op->tensor_count == 0 && op->tensor_grad == 0;
    case AJ_FIELD_MASK:          return op->mask.kind == AJ_MASK_NONE;
    case AJ_FIELD_SCORE_MOD:     return op->score_mod.kind == AJ_SCORE_MOD_NONE;
    case AJ_FIELD_SINKS:         return op->sinks == 0;
    case AJ_FIELD_SCALE:         return op->scale == AJ_SCALE_DEFAULT;
    case AJ_FIELD_DROPOUT:       return op->dropout == 0.0;
    case AJ_FIELD_BIAS:          return op->bias == AJ_BIAS_NONE;
    case AJ_FIELD_LAYOUT:        return op->layout == AJ_LAYOUT_PADDED;
    case AJ_FIELD_Q_DTYPE:       return !op->q_dtype_set;
    case AJ_FIELD_KV_DTYPE:      return !op->kv_dtype_set;
    case AJ_FIELD_Q_LAYOUT:      return op->q_layout == AJ_LAYOUT_PADDED;
    case AJ_FIELD_KV_SHARED:     return !op->kv_shared;
    case AJ_FIELD_ACCUMULATE:    return !op->accumulate;
    case AJ_FIELD_DETERMINISTIC: return !op->deterministic;
    case AJ_FIELD_SCHEDULE:
        return aj_op_schedule_is_default(op) && op->splits == 0;
    case AJ_FIELD_TARGET:        return op->target == AJ_TARGET_ANY;
    case AJ_FIELD_COUNT:         break;
    }
    return false;
}

/* An enum value read from the API may be anything the caller cast. */
static aj_status check_enum(const char *what, int value, int count,
                            char *msg, size_t cap)
{
    if (value >= 0 && value < count)
        return AJ_OK;
    snprintf(msg, cap, "%s %d is out of range (want 0..%d)", what, value,
             count - 1);
    return AJ_ERR_INVALID_ARG;
}

static aj_status check_header(const aj_op *op, char *msg, size_t cap)
{
    aj_status st;

    if ((st = check_enum("kind", (int)op->kind, AJ_KIND_COUNT, msg, cap)) ||
        (st = check_enum("variant", (int)op->variant, AJ_VARIANT_COUNT, msg,
                         cap)))
        return st;
    if (op->kind == AJ_KIND_MERGE && op->variant != AJ_VARIANT_NONE) {
        snprintf(msg, cap, "merge ops take no variant, got %s",
                 aj_variant_names[op->variant]);
        return AJ_ERR_VERIFY;
    }
    if (op->kind != AJ_KIND_MERGE && op->variant == AJ_VARIANT_NONE) {
        snprintf(msg, cap, "%s ops need variant flash or efficient, got none",
                 aj_kind_names[op->kind]);
        return AJ_ERR_VERIFY;
    }
    return AJ_OK;
}

bool aj_head_dim_ok(const char *field, int64_t head_dim, char *msg,
                    size_t cap)
{
    if (head_dim >= 1 && head_dim <= AJ_HEAD_DIM_MAX)
        return true;
    snprintf(msg, cap, "%s %lld is out of range (want 1..%d)", field,
             (long long)head_dim, AJ_HEAD_DIM_MAX);
    return false;
}

bool aj_scale_ok(double scale, char *msg, size_t cap)
{
    char num[AJ_NUMBER_MAX];

    if (isfinite(scale) && scale > 0)
        return true;
    aj_format_number(scale, num);
    snprintf(msg, cap,
             "scale %s is out of range (want default or a finite number > 0)",
             num);
    return false;
}

static aj_status check_window_bound(const char *what, int64_t bound,
                                    char *msg, size_t cap)
{
    if (bound >= 0 && bound <= AJ_WINDOW_MAX)
        return AJ_OK;
    snprintf(msg, cap, "window %s %lld is out of range (want 0..%d)", what,
             (long long)bound, AJ_WINDOW_MAX);
    return AJ_ERR_INVALID_ARG;
}

static bool is_identifier(const char *name)
{
    if (!((name[0] >= 'a' && name[0] <= 'z') ||
          (name[0] >= 'A' && name[0] <= 'Z') || name[0] == '_'))
        return false;
    for (const char *c = name + 1; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
              (*c >= '0' && *c <= '9') || *c == '_'))
            return false;
    return true;
}

/* Each declaration: an identifier that is not reserved nor taken, a dtype,
 * a rank of 1..4. */
/* sinks = NAME: a declared f32[1] tensor of one logit per query head
 * (docs/ir.md "Sinks"). */
static aj_status check_sinks(const aj_op *op, char *msg, size_t cap)
{
    if (op->sinks == 0)
        return AJ_OK;
    if (op->sinks < 0 || op->sinks > op->tensor_count) {
        snprintf(msg, cap, "sinks names tensor %d of %d declared", (int)op->sinks - 1,
                 (int)op->tensor_count);
        return AJ_ERR_INVALID_ARG;
    }
    const aj_tensor_decl *t = &op->tensors[op->sinks - 1];
    if (op->tensor_grad >> (op->sinks - 1) & 1u) {
        snprintf(msg, cap, "sinks = %s: the sinks' tensor is not declared grad (the "
                 "backward's dsinks is its gradient)", t->name);
        return AJ_ERR_VERIFY;
    }
    if (t->dtype != AJ_SIDE_F32 || t->rank != 1) {
        snprintf(msg, cap, "sinks = %s: the sink logits are f32[1] (one per query head), "
                 "not %s[%d]", t->name, aj_side_dtype_names[t->dtype], (int)t->rank);
        return AJ_ERR_VERIFY;
    }
    return AJ_OK;
}

static aj_status check_tensors(const aj_op *op, char *msg, size_t cap)
{
    if (op->tensor_count < 0 || op->tensor_count > AJ_OP_TENSORS_MAX) {
        snprintf(msg, cap, "tensor count %d is out of range (want 0..%d)",
                 (int)op->tensor_count, AJ_OP_TENSORS_MAX);
        return AJ_ERR_INVALID_ARG;
    }
    for (int i = 0; i < op->tensor_count; i++) {
        const aj_tensor_decl *t = &op->tensors[i];
        const char *end = memchr(t->name, '\0', sizeof t->name);
        size_t len = end ? (size_t)(end - t->name) : sizeof t->name;

        if (len == sizeof t->name || !is_identifier(t->name)) {
            snprintf(msg, cap, "tensor name '%.*s' is not an identifier of "
                     "1..%d characters", (int)len, t->name,
                     AJ_OP_TENSOR_NAME_MAX);
            return AJ_ERR_INVALID_ARG;
        }
        const char *why = aj_expr_name_reserved(t->name, len);
        if (why) {
            snprintf(msg, cap, "tensor name '%s' is reserved (%s)", t->name, why);
            return AJ_ERR_INVALID_ARG;
        }
        for (int j = 0; j < i; j++) {
            const char *other = op->tensors[j].name;
            if (strcmp(other, t->name) == 0) {
                snprintf(msg, cap, "tensor '%s' is declared twice", t->name);
                return AJ_ERR_INVALID_ARG;
            }
            if (aj_expr_side_forms_clash(other, strlen(other), t->name, len) ||
                aj_expr_side_forms_clash(t->name, len, other, strlen(other))) {
                snprintf(msg, cap, "tensors '%s' and '%s' clash: a side tensor's "
                         "sizes and strides are kernel parameters NAME_size<d> and "
                         "NAME_stride<d>", other, t->name);
                return AJ_ERR_INVALID_ARG;
            }
        }
        if ((unsigned)t->dtype >= AJ_SIDE_DTYPE_COUNT) {
            snprintf(msg, cap, "tensor '%s' has dtype %d, out of range "
                     "(want i32, f32, f16 or bf16)", t->name, (int)t->dtype);
            return AJ_ERR_INVALID_ARG;
        }
        if (t->rank < 1 || t->rank > AJ_EXPR_RANK_MAX) {
            snprintf(msg, cap, "tensor '%s' has rank %d, out of range (want "
                     "1..%d)", t->name, (int)t->rank, AJ_EXPR_RANK_MAX);
            return AJ_ERR_INVALID_ARG;
        }
        if ((op->tensor_grad >> i & 1u) && t->dtype == AJ_SIDE_I32) {
            snprintf(msg, cap, "tensor '%s' is declared grad but is %s: only a float tensor "
                     "(f32, f16, bf16) has a gradient", t->name, aj_side_dtype_names[t->dtype]);
            return AJ_ERR_VERIFY;
        }
    }
    if (op->tensor_count < 32 && (op->tensor_grad >> op->tensor_count) != 0) {
        snprintf(msg, cap, "tensor_grad marks tensors past the %d declared",
                 (int)op->tensor_count);
        return AJ_ERR_INVALID_ARG;
    }
    return AJ_OK;
}

static aj_status check_mask(const aj_op *op, char *msg, size_t cap)
{
    const aj_mask_spec *mask = &op->mask;
    const aj_expr_scope scope = aj_op_expr_scope(op, false);
    aj_status st;

    if ((st = check_enum("mask", (int)mask->kind, AJ_MASK_COUNT, msg, cap)))
        return st;
    if (mask->kind == AJ_MASK_NONE)
        return AJ_OK;
    if (mask->kind == AJ_MASK_EXPR)
        return aj_expr_check(&op->expr, mask->root, &scope, AJ_EXPR_BOOL,
                             "the mask", msg, cap) ? AJ_OK : AJ_ERR_INVALID_ARG;
    if ((st = check_enum("mask align", (int)mask->align, AJ_ALIGN_COUNT, msg,
                         cap)))
        return st;
    if (mask->kind == AJ_MASK_CAUSAL)
        return AJ_OK;
    if ((st = check_window_bound("left", mask->left, msg, cap)))
        return st;
    return check_window_bound("right", mask->right, msg, cap);
}

static aj_status check_alibi_slopes(const aj_op *op, char *msg, size_t cap);

static aj_status check_score_mod(const aj_op *op, char *msg, size_t cap)
{
    const aj_score_mod_spec *mod = &op->score_mod;
    const aj_expr_scope scope = aj_op_expr_scope(op, true);
    char num[AJ_NUMBER_MAX];
    aj_status st;

    if ((st = check_enum("score_mod", (int)mod->kind, AJ_SCORE_MOD_COUNT, msg,
                         cap)))
        return st;
    if (mod->kind == AJ_SCORE_MOD_EXPR)
        return aj_expr_check(&op->expr, mod->root, &scope, AJ_EXPR_FLOAT,
                             "the score_mod", msg, cap) ? AJ_OK
                                                        : AJ_ERR_INVALID_ARG;
    if (mod->kind == AJ_SCORE_MOD_ALIBI && mod->slopes &&
        (st = check_alibi_slopes(op, msg, cap)) != AJ_OK)
        return st;
    if ((mod->kind != AJ_SCORE_MOD_SOFTCAP &&
         (mod->kind != AJ_SCORE_MOD_ALIBI || mod->softcap == 0)) ||
        (isfinite(mod->softcap) && mod->softcap > 0))
        return AJ_OK;
    aj_format_number(mod->softcap, num);
    snprintf(msg, cap, "softcap %s is out of range (want a finite number > 0)",
             num);
    return AJ_ERR_INVALID_ARG;
}

/* alibi(NAME): a declared f32[1] tensor of one slope per query head, its
 * gradient its own (no alibi(grad) flag). */
static aj_status check_alibi_slopes(const aj_op *op, char *msg, size_t cap)
{
    const aj_score_mod_spec *mod = &op->score_mod;
    if (mod->slopes < 0 || mod->slopes > op->tensor_count) {
        snprintf(msg, cap, "alibi names tensor %d of %d declared", (int)mod->slopes - 1,
                 (int)op->tensor_count);
        return AJ_ERR_INVALID_ARG;
    }
    const aj_tensor_decl *t = &op->tensors[mod->slopes - 1];
    if (t->dtype != AJ_SIDE_F32 || t->rank != 1) {
        snprintf(msg, cap, "alibi(%s): the slopes are f32[1] (one per query head), not "
                 "%s[%d]", t->name, aj_side_dtype_names[t->dtype], (int)t->rank);
        return AJ_ERR_INVALID_ARG;
    }
    if (mod->grad) {
        snprintf(msg, cap, "alibi(%s): the slopes' gradient is the tensor's (declare it "
                 "%s: f32[1] grad), not alibi(grad)'s", t->name, t->name);
        return AJ_ERR_INVALID_ARG;
    }
    return AJ_OK;
}

static aj_status check_dropout(double p, char *msg, size_t cap)
{
    char num[AJ_NUMBER_MAX];

    /* Written so that NaN fails both comparisons. */
    if (p >= 0 && p < 1)
        return AJ_OK;
    aj_format_number(p, num);
    snprintf(msg, cap, "dropout %s is out of range (want 0 <= p < 1)", num);
    return AJ_ERR_INVALID_ARG;
}

static bool is_pow2(int32_t v)
{
    return v > 0 && (v & (v - 1)) == 0;
}

/* 0 lets the template choose; anything else must be a size the templates
 * can tile with. */
static aj_status check_schedule(const aj_schedule *s, char *msg, size_t cap)
{
    static const char *const tile = "0 or a power of two in 16..256";
    const struct {
        const char *key;
        int32_t value, lo, hi;
        bool pow2;
        const char *want;
    } keys[] = {
        { "block_m", s->block_m, 16, 256, true, tile },
        { "block_n", s->block_n, 16, 256, true, tile },
        { "warps", s->warps, 1, 16, true, "0, 1, 2, 4, 8 or 16" },
        { "stages", s->stages, 1, 8, false, "0..8" },
    };

    for (size_t i = 0; i < AJ_COUNT_OF(keys); i++) {
        int32_t v = keys[i].value;

        if (v == 0 || (v >= keys[i].lo && v <= keys[i].hi &&
                       (!keys[i].pow2 || is_pow2(v))))
            continue;
        snprintf(msg, cap, "schedule %s %d is out of range (want %s)",
                 keys[i].key, (int)v, keys[i].want);
        return AJ_ERR_INVALID_ARG;
    }
    return AJ_OK;
}

/* Paged KV is an inference layout: a forward without the training-only
 * inputs (bias, dropout). */
static aj_status check_layout(const aj_op *op, char *msg, size_t cap)
{
    aj_status st;

    if ((st = check_enum("layout", (int)op->layout, AJ_LAYOUT_COUNT, msg, cap)))
        return st;
    if (op->layout != AJ_LAYOUT_PAGED)
        return AJ_OK;
    if (op->kind != AJ_KIND_FORWARD) {
        snprintf(msg, cap, "layout = paged applies only to forward ops, not %s "
                           "(a KV cache is read, not differentiated)",
                 aj_kind_names[op->kind]);
        return AJ_ERR_VERIFY;
    }
    if (op->bias == AJ_BIAS_ADD) {
        snprintf(msg, cap, "layout = paged takes no bias (bias = add)");
        return AJ_ERR_VERIFY;
    }
    if (op->dropout > 0) {
        snprintf(msg, cap, "layout = paged takes no dropout (an inference layout)");
        return AJ_ERR_VERIFY;
    }
    return AJ_OK;
}

/* FP8 inputs (docs/ir.md "FP8 inputs"): an f8 element type, other than
 * the op's dtype (O's), is a forward's only: read, dequantised by the
 * call's descales, never differentiated. */
static aj_status f8_forward_only(const aj_op *op, const char *field, aj_dtype dtype,
                                 char *msg, size_t cap)
{
    if (op->kind == AJ_KIND_FORWARD)
        return AJ_OK;
    snprintf(msg, cap, "%s = %s applies only to forward ops, not %s (8-bit inputs are "
                       "read with their descales, not differentiated)", field,
             aj_dtype_names[dtype], aj_kind_names[op->kind]);
    return AJ_ERR_VERIFY;
}

/* The queries' element type: the op's dtype, or f8 on a padded or varlen
 * forward (a paged op's queries stay 16-bit; its caches may be f8). */
static aj_status check_q_dtype(const aj_op *op, char *msg, size_t cap)
{
    aj_status st;

    if ((st = check_enum("q_dtype", (int)op->q_dtype, AJ_DTYPE_COUNT, msg, cap)))
        return st;
    if (!op->q_dtype_set || op->q_dtype == op->dtype)
        return AJ_OK;
    if (op->q_dtype < AJ_DTYPE_F8E4M3) {
        snprintf(msg, cap, "q_dtype = %s differs from dtype = %s; the queries are the op's "
                           "dtype or 8-bit floats (f8e4m3, f8e5m2)",
                 aj_dtype_names[op->q_dtype], aj_dtype_names[op->dtype]);
        return AJ_ERR_VERIFY;
    }
    if ((st = f8_forward_only(op, "q_dtype", op->q_dtype, msg, cap)))
        return st;
    if (op->layout == AJ_LAYOUT_PAGED) {
        snprintf(msg, cap, "q_dtype = %s: a paged op's queries are its dtype (its caches "
                           "may be 8-bit: kv_dtype)", aj_dtype_names[op->q_dtype]);
        return AJ_ERR_VERIFY;
    }
    return AJ_OK;
}

/* K's and V's element type: any for a paged cache; else the op's dtype
 * or f8 on a forward. */
static aj_status check_kv_dtype(const aj_op *op, char *msg, size_t cap)
{
    aj_status st;

    if ((st = check_enum("kv_dtype", (int)op->kv_dtype, AJ_DTYPE_COUNT, msg, cap)))
        return st;
    if (!op->kv_dtype_set || op->layout == AJ_LAYOUT_PAGED || op->kv_dtype == op->dtype)
        return AJ_OK;
    if (op->kv_dtype < AJ_DTYPE_F8E4M3) {
        snprintf(msg, cap, "kv_dtype = %s differs from dtype = %s on layout = %s; K and V "
                           "are the op's dtype or 8-bit floats (f8e4m3, f8e5m2), other "
                           "element types are paged caches' only",
                 aj_dtype_names[op->kv_dtype], aj_dtype_names[op->dtype],
                 aj_layout_names[op->layout]);
        return AJ_ERR_VERIFY;
    }
    return f8_forward_only(op, "kv_dtype", op->kv_dtype, msg, cap);
}

/* The queries of a paged op: padded [B, Hq, Sq, D] (the default) or
 * varlen [T, Hq, D] with cu_seqlens_q (chunked prefill). */
static aj_status check_q_layout(const aj_op *op, char *msg, size_t cap)
{
    aj_status st;

    if ((st = check_enum("q_layout", (int)op->q_layout, AJ_LAYOUT_COUNT, msg, cap)))
        return st;
    if (op->q_layout == AJ_LAYOUT_PAGED) {
        snprintf(msg, cap, "q_layout paged is not a query layout (want padded or varlen)");
        return AJ_ERR_INVALID_ARG;
    }
    if (op->q_layout != AJ_LAYOUT_PADDED && op->layout != AJ_LAYOUT_PAGED) {
        snprintf(msg, cap, "q_layout applies only to layout = paged (the layout of its "
                           "queries), not %s", aj_layout_names[op->layout]);
        return AJ_ERR_VERIFY;
    }
    return AJ_OK;
}

/* One cache for K and V (absorbed MLA: the latent rows, V their first
 * head_dim_v columns): paged only, Dv <= D, and the scale given, since
 * 1/sqrt(head_dim) is not MLA's (docs/ir.md "Shared K/V cache"). */
static aj_status check_kv_shared(const aj_op *op, char *msg, size_t cap)
{
    if (!op->kv_shared)
        return AJ_OK;
    if (op->layout != AJ_LAYOUT_PAGED) {
        snprintf(msg, cap, "kv_shared = true applies only to layout = paged (one cache "
                           "holds K and V), not %s", aj_layout_names[op->layout]);
        return AJ_ERR_VERIFY;
    }
    if (aj_op_dv(op) > op->head_dim) {
        snprintf(msg, cap, "kv_shared = true: head_dim_v = %d exceeds head_dim = %d (V is "
                           "the first head_dim_v columns of the cache's rows)",
                 aj_op_dv(op), op->head_dim);
        return AJ_ERR_VERIFY;
    }
    if (op->scale == AJ_SCALE_DEFAULT) {
        snprintf(msg, cap, "kv_shared = true needs an explicit scale (set it before "
                           "kv_shared): 1/sqrt(head_dim) = 1/sqrt(%d) is not the softmax "
                           "scale of absorbed MLA, which is 1/sqrt(qk_nope_head_dim + "
                           "qk_rope_head_dim) times its YaRN factor", op->head_dim);
        return AJ_ERR_VERIFY;
    }
    return AJ_OK;
}

static aj_status check_splits(const aj_op *op, char *msg, size_t cap)
{
    if (op->splits < 0 || op->splits > AJ_SPLITS_MAX) {
        snprintf(msg, cap, "schedule splits %d is out of range (want 0..%d)",
                 (int)op->splits, AJ_SPLITS_MAX);
        return AJ_ERR_INVALID_ARG;
    }
    if (op->splits && op->layout != AJ_LAYOUT_PAGED) {
        snprintf(msg, cap, "schedule splits applies only to layout = paged, "
                           "not %s", aj_layout_names[op->layout]);
        return AJ_ERR_VERIFY;
    }
    return AJ_OK;
}

/* The wgmma flash templates' warpgroups (docs/ir.md, schedule): 0 (the
 * mma.sync template), 1 or 2, on a flash forward or backward over padded
 * or varlen tensors; a producer warpgroup on the forward. */
static aj_status check_warpgroups(const aj_op *op, char *msg, size_t cap)
{
    if (op->warpgroups < 0 || op->warpgroups > AJ_WARPGROUPS_MAX) {
        snprintf(msg, cap, "schedule warpgroups %d is out of range (want 0..%d)",
                 (int)op->warpgroups, AJ_WARPGROUPS_MAX);
        return AJ_ERR_INVALID_ARG;
    }
    if (op->warpgroups && (op->kind == AJ_KIND_MERGE || op->variant != AJ_VARIANT_FLASH ||
                           op->layout == AJ_LAYOUT_PAGED)) {
        snprintf(msg, cap, "schedule warpgroups applies only to flash forward and backward ops "
                 "over padded or varlen tensors (the wgmma templates), not %s %s over %s",
                 aj_kind_names[op->kind], op->variant == AJ_VARIANT_FLASH ? "flash" : "efficient",
                 op->layout == AJ_LAYOUT_PAGED ? "paged caches" : "these tensors");
        return AJ_ERR_VERIFY;
    }
    if (op->producer != 0 && op->producer != 1) {
        snprintf(msg, cap, "schedule producer %d is out of range (want 0 or 1)",
                 (int)op->producer);
        return AJ_ERR_INVALID_ARG;
    }
    if (op->producer && !op->warpgroups) {
        snprintf(msg, cap, "schedule producer = 1 specialises the wgmma template's warps: it "
                 "needs warpgroups = 1 or 2");
        return AJ_ERR_VERIFY;
    }
    if (op->producer && op->kind != AJ_KIND_FORWARD) {
        snprintf(msg, cap, "schedule producer = 1 applies to the flash forward only (the wgmma "
                 "backward is not warp specialised)");
        return AJ_ERR_VERIFY;
    }
    return AJ_OK;
}

/* ---------------------------------------------------------------- info */

double aj_op_scale(const aj_op *op)
{
    return op->scale == AJ_SCALE_DEFAULT ? 1.0 / sqrt((double)op->head_dim)
                                         : op->scale;
}

aj_status aj_op_get_info(const aj_op *op, aj_op_info *out)
{
    AJ_OP_ARG(op);
    AJ_CHECK_ARG(op->ctx, out, "aj_op_get_info: out is NULL");
    *out = (aj_op_info){
        .kind = op->kind,
        .variant = op->variant,
        .dtype = op->dtype,
        .head_dim = op->head_dim,
        .head_dim_v = aj_op_dv(op),
        .mask = op->mask.kind,
        .mask_align = op->mask.align,
        .window_left = op->mask.left,
        .window_right = op->mask.right,
        .score_mod = op->score_mod.kind,
        .softcap = op->score_mod.softcap,
        .scale = aj_op_scale(op),
        .scale_is_default = op->scale == AJ_SCALE_DEFAULT,
        .dropout = op->dropout,
        .bias = op->bias,
        .layout = op->layout,
        .accumulate = op->accumulate,
        .deterministic = op->deterministic,
        .schedule = op->schedule,
        .target = op->target,
        .num_tensors = op->tensor_count,
        .kv_dtype = aj_op_kv_dtype(op),
        .splits = op->splits,
        .q_layout = op->q_layout,
        .alibi_tensor = op->score_mod.kind == AJ_SCORE_MOD_ALIBI ? op->score_mod.slopes - 1
                                                                 : -1,
    };
    for (int i = 0; i < op->tensor_count; i++) {
        snprintf(out->tensors[i].name, sizeof out->tensors[i].name, "%s", op->tensors[i].name);
        out->tensors[i].dtype = op->tensors[i].dtype;
        out->tensors[i].rank = op->tensors[i].rank;
    }
    return AJ_OK;
}
