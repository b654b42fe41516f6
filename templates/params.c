/*
 * params.c -- the parameter table of params.def: the rows, the lists they
 * give an op, and aj_op_kernel_params.
 */
#include <stdio.h>
#include <string.h>

#include "templates/cpu_attn.h"
#include "templates/grad_tail.h"
#include "templates/params.h"
#include "templates/score.h"
#include "templates/template.h"

/* ---------------------------------------------------------------- rows */

static const struct {
    const char *name;
    bool tensor;
} sources[AJ_PSRC_COUNT] = {
#define AJ_PSOURCE(nm, kind) [AJ_PSRC_##nm] = {#nm, AJ_PKIND_##kind},
#define AJ_PKIND_TENSOR true
#define AJ_PKIND_SCALAR false
#include "templates/params.def"
#undef AJ_PKIND_TENSOR
#undef AJ_PKIND_SCALAR
};

/* In a kernel ABI's rows: the score programs' tensors, not a table row. */
enum { AJ_PRM_side = AJ_PRM_COUNT };

static const aj_param_row catalogue[AJ_PRM_COUNT] = {
#define AJ_PARAM(nm, type, how, source, dim) \
    [AJ_PRM_##nm] = {#nm, AJ_PARAM_##type, AJ_PHOW_##how, AJ_PSRC_##source, dim},
#include "templates/params.def"
};

/* When an op has a parameter. */
typedef enum aj_param_when {
    AJ_PWHEN_ALWAYS,
    AJ_PWHEN_PADDED,
    AJ_PWHEN_VARLEN,
    AJ_PWHEN_VARLEN_UNBIASED, /* varlen, and bias != add */
    AJ_PWHEN_VARLEN_TOTALS,   /* varlen, and the score programs read sq or sk */
    AJ_PWHEN_TOTALS,          /* the score programs read sq or sk */
    AJ_PWHEN_BIAS,
    AJ_PWHEN_DROPOUT,
    AJ_PWHEN_HEADS,           /* dropout, or the score programs read h */
    AJ_PWHEN_READS_H,         /* the score programs read h */
    AJ_PWHEN_PLAIN,           /* accumulate = false */
    AJ_PWHEN_ACCUMULATE,
    AJ_PWHEN_BLOCK_MASK,      /* the kernels read tile classes from a block mask */
    AJ_PWHEN_F8_KV,           /* an f8 kv_dtype (paged caches, FP8 inputs) */
    AJ_PWHEN_F8_Q,            /* an f8 q_dtype (FP8 inputs) */
    AJ_PWHEN_VARLEN_Q,        /* layout = paged with q_layout = varlen */
    AJ_PWHEN_SINKS,           /* the op has learned sinks */
    AJ_PWHEN_SIDE_GRAD,       /* a backward of an op with grad side tensors */
    AJ_PWHEN_TMA,             /* the wgmma flash forward over padded tensors */
    AJ_PWHEN_CPU_FUSES,       /* a cpu backward that has a fused plan (aj_cpu_bwd_fuses) */
} aj_param_when;

static const struct sig_row {
    aj_kernel_sig sig;
    int param;                   /* an aj_param_id, or AJ_PRM_side */
    aj_param_role role;
    aj_param_when when;
} sig_rows[] = {
#define AJ_PSIG(sig, nm, role, when) \
    {AJ_KSIG_##sig, AJ_PRM_##nm, AJ_ROLE_##role, AJ_PWHEN_##when},
#include "templates/params.def"
};

bool aj_param_source_is_tensor(aj_param_source s)
{
    return sources[s].tensor;
}

const char *aj_param_source_name(aj_param_source s)
{
    return sources[s].name;
}

const aj_param_row *aj_param_find(const char *name)
{
    for (int i = 0; i < AJ_PRM_COUNT; i++)
        if (strcmp(catalogue[i].name, name) == 0)
            return &catalogue[i];
    return NULL;
}

const aj_param_row *aj_param_row_of(int32_t id)
{
    return id >= 0 && id < AJ_PRM_COUNT ? &catalogue[id] : NULL;
}

LLVMValueRef aj_param(aj_kb *kb, aj_param_id id)
{
    return aj_kb_param_id(kb, id, catalogue[id].name);
}

/* The row deriving `how` (dim) from tensor source t, or AJ_PRM_COUNT. */
static int row_of_tensor(aj_param_source t, aj_param_how how, int dim)
{
    for (int i = 0; i < AJ_PRM_COUNT; i++)
        if (catalogue[i].source == t && catalogue[i].how == how &&
            (how == AJ_PHOW_DATA || catalogue[i].dim == dim))
            return i;
    return AJ_PRM_COUNT;
}

LLVMValueRef aj_param_data(aj_kb *kb, aj_param_source t)
{
    int id = row_of_tensor(t, AJ_PHOW_DATA, 0);
    if (id == AJ_PRM_COUNT) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "the parameter table has no data pointer of '%s'",
                   aj_param_source_name(t));
        return LLVMGetUndef(kb->t_gptr);
    }
    return aj_param(kb, (aj_param_id)id);
}

LLVMValueRef aj_param_stride(aj_kb *kb, aj_param_source t, int dim)
{
    int id = row_of_tensor(t, AJ_PHOW_STRIDE, dim);
    if (id == AJ_PRM_COUNT)
        id = row_of_tensor(t, AJ_PHOW_BSTRIDE, dim);
    if (id == AJ_PRM_COUNT) {
        aj_kb_fail(kb, AJ_ERR_INTERNAL, "the parameter table has no stride %d of '%s'", dim,
                   aj_param_source_name(t));
        return LLVMGetUndef(kb->t_i64);
    }
    return aj_param(kb, (aj_param_id)id);
}

/* ---------------------------------------------------------------- lists */

static bool op_has(aj_param_when when, const aj_op *op, const aj_score_prog *prog)
{
    switch (when) {
    case AJ_PWHEN_ALWAYS: return true;
    case AJ_PWHEN_PADDED: return op->layout == AJ_LAYOUT_PADDED;
    case AJ_PWHEN_VARLEN: return op->layout == AJ_LAYOUT_VARLEN;
    case AJ_PWHEN_VARLEN_UNBIASED:
        return op->layout == AJ_LAYOUT_VARLEN && op->bias != AJ_BIAS_ADD;
    case AJ_PWHEN_VARLEN_TOTALS: return op->layout == AJ_LAYOUT_VARLEN && prog->reads_totals;
    case AJ_PWHEN_TOTALS: return prog->reads_totals;
    case AJ_PWHEN_BIAS: return op->bias == AJ_BIAS_ADD;
    case AJ_PWHEN_DROPOUT: return op->dropout > 0;
    case AJ_PWHEN_HEADS: return op->dropout > 0 || prog->reads_h;
    case AJ_PWHEN_READS_H: return prog->reads_h;
    case AJ_PWHEN_PLAIN: return !op->accumulate;
    case AJ_PWHEN_ACCUMULATE: return op->accumulate;
    case AJ_PWHEN_BLOCK_MASK: return prog->block_mask;
    case AJ_PWHEN_F8_KV: return aj_op_kv_dtype(op) >= AJ_DTYPE_F8E4M3;
    case AJ_PWHEN_F8_Q: return aj_op_q_dtype(op) >= AJ_DTYPE_F8E4M3;
    case AJ_PWHEN_VARLEN_Q:
        return op->layout == AJ_LAYOUT_PAGED && op->q_layout == AJ_LAYOUT_VARLEN;
    case AJ_PWHEN_SINKS: return aj_score_has_sinks(prog);
    case AJ_PWHEN_SIDE_GRAD: return prog->tensor_grad != 0;
    case AJ_PWHEN_TMA: return op->warpgroups && op->layout == AJ_LAYOUT_PADDED;
    case AJ_PWHEN_CPU_FUSES: return aj_cpu_bwd_fuses(op, prog);
    }
    return false;
}

/* Appends a parameter (and its table row to ids, if not NULL), counting
 * those that do not fit. */
static void put(aj_param_desc *out, int32_t *ids, int cap, int *n, const char *name,
                aj_param_type type, aj_param_role role, const char *tensor, int dim, int32_t id)
{
    if (*n < cap && ids)
        ids[*n] = id;
    if (*n < cap) {
        aj_param_desc *d = &out[*n];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "%s", name);
        snprintf(d->tensor, sizeof d->tensor, "%s", tensor);
        d->type = type;
        d->role = role;
        d->dim = dim;
    }
    (*n)++;
}

/* The side tensors: NAME, then NAME_size<d> and NAME_stride<d> per dim. */
static void put_side(aj_param_desc *out, int32_t *ids, int cap, int *n,
                     const aj_score_prog *prog)
{
    char name[sizeof out->name];
    for (int t = 0; t < prog->tensor_count; t++) {
        const aj_tensor_decl *d = &prog->tensors[t];
        put(out, ids, cap, n, d->name, AJ_PARAM_PTR, AJ_ROLE_INPUT, d->name, -1, AJ_KB_NO_ID);
        for (int i = 0; i < d->rank; i++) {
            aj_score_param_name(name, sizeof name, d->name, 's', i);
            put(out, ids, cap, n, name, AJ_PARAM_I64, AJ_ROLE_SIZE, d->name, i, AJ_KB_NO_ID);
            aj_score_param_name(name, sizeof name, d->name, 't', i);
            put(out, ids, cap, n, name, AJ_PARAM_I64, AJ_ROLE_STRIDE, d->name, i,
                AJ_KB_NO_ID);
        }
    }
}

/* aj_params_list, with each parameter's table row in ids (may be NULL). */
static int list_params(aj_kernel_sig sig, const aj_op *op, const aj_score_prog *prog,
                       aj_param_desc *out, int32_t *ids, int cap)
{
    int n = 0;
    for (size_t i = 0; i < sizeof sig_rows / sizeof sig_rows[0]; i++) {
        const struct sig_row *r = &sig_rows[i];
        if (r->sig != sig || !op_has(r->when, op, prog))
            continue;
        if (r->param == AJ_PRM_side) {
            put_side(out, ids, cap, &n, prog);
            continue;
        }
        const aj_param_row *p = &catalogue[r->param];
        int tensor = aj_param_source_is_tensor(p->source);
        put(out, ids, cap, &n, p->name, p->type, r->role,
            tensor ? aj_param_source_name(p->source) : "",
            tensor && p->how != AJ_PHOW_DATA ? p->dim : -1, r->param);
    }
    return n;
}

int aj_params_list(aj_kernel_sig sig, const aj_op *op, const aj_score_prog *prog,
                   aj_param_desc *out, int cap)
{
    return list_params(sig, op, prog, out, NULL, cap);
}

void aj_params_declare(aj_kb *kb, aj_kernel_sig sig, const aj_op *op,
                       const aj_score_prog *prog)
{
    aj_param_desc list[AJ_KB_MAX_PARAMS];
    int32_t ids[AJ_KB_MAX_PARAMS];
    int n = list_params(sig, op, prog, list, ids, AJ_KB_MAX_PARAMS);
    if (n > AJ_KB_MAX_PARAMS) {
        aj_kb_fail(kb, AJ_ERR_UNSUPPORTED, "the op's kernel takes %d parameters in one stage "
                   "(its side tensors' among them); at most %d", n, AJ_KB_MAX_PARAMS);
        return;
    }
    for (int i = 0; i < n; i++)
        aj_kb_add_param(kb, list[i].name, list[i].type, ids[i]);
}

/* ---------------------------------------------------------------- API */

aj_status aj_op_kernel_params(aj_ctx *ctx, const aj_op *op, aj_target target, int32_t stage,
                              aj_param_desc *params, int32_t cap, int32_t *count,
                              int32_t *num_stages)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    const char *fn = "aj_op_kernel_params";
    AJ_CHECK_ARG(ctx, op, "%s: op is NULL", fn);
    AJ_CHECK_ARG(ctx, count, "%s: count is NULL", fn);
    AJ_CHECK_ARG(ctx, cap >= 0 && (params || cap == 0), "%s: params is NULL with cap = %d", fn,
                 cap);
    AJ_CHECK_ARG(ctx, (unsigned)target < AJ_TARGET_COUNT, "%s: target = %d is not a target",
                 fn, (int)target);
    aj_status st = aj_op_verify(op);   /* reports on the op's context */
    if (st != AJ_OK)
        return st;
    const aj_template *tmpl = NULL;
    AJ_TRY(aj_template_find(ctx, op, target, &tmpl));
    int stages = 0;
    while (stages < AJ_KB_MAX_STAGES && tmpl->stage_sigs[stages] != AJ_KSIG_NONE)
        stages++;
    /* a backward ends with the stages of its other gradients (grad_tail.h) */
    aj_kernel_sig tail[4];
    int template_stages = stages;
    stages += aj_grad_tail_sigs(op, target, tail);
    if (num_stages)
        *num_stages = stages;
    AJ_CHECK_ARG(ctx, stage >= 0 && stage < stages, "%s: stage = %d; the %s kernel has "
                 "stages 0 .. %d", fn, stage, tmpl->name, stages - 1);
    aj_score_prog prog;
    AJ_TRY(aj_score_prog_init(ctx, op, &prog));
    *count = aj_params_list(stage >= template_stages ? tail[stage - template_stages]
                                                     : tmpl->stage_sigs[stage],
                            op, &prog, params, cap);
    aj_score_prog_free(&prog);
done:
    return st;
}
