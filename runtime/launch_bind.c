/*
 * launch_bind.c -- a launch's values and their binding: each entry point
 * fills params.def's sources from its checked arguments (the *_values
 * functions, put_tensor, put_scalar), and aj_bind_stage walks the rows a
 * compiled stage recorded and derives each parameter's value; side
 * tensors (and alibi's slopes) bind by name; the block mask is the
 * caller's or built by the plan's builder (docs/design.md, "Kernel
 * parameters").
 *
 * Binding by row keeps the launch ignorant of any one template: a
 * template may take any subset of the values below, in any order.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/launch_internal.h"
#include "templates/score.h"

static void score_bind(score_bindings *sb, const char *name, aj_param_type type,
                       aj_arg_value value)
{
    snprintf(sb->names[sb->n], sizeof sb->names[0], "%s", name);
    sb->b[sb->n] = (binding){sb->names[sb->n], type, value};
    sb->n++;
}

/* A score tensor's pointer, sizes and strides, and its sim buffer. */
static void score_bind_tensor(score_bindings *sb, const char *tensor, const void *data,
                              aj_side_dtype dtype, int rank, const int64_t *shape,
                              const int64_t *strides)
{
    char name[AJ_OP_TENSOR_NAME_MAX + 16];
    const char *stored = sb->names[sb->n];   /* the name a sim fault reports */
    score_bind(sb, tensor, AJ_PARAM_PTR, (aj_arg_value){.ptr = (void *)data});
    aj_tensor t = {(void *)data, AJ_DTYPE_F32, rank, {0}, {0}};
    for (int d = 0; d < rank; d++) {
        aj_score_param_name(name, sizeof name, tensor, 's', d);
        score_bind(sb, name, AJ_PARAM_I64, (aj_arg_value){.i64 = shape[d]});
        aj_score_param_name(name, sizeof name, tensor, 't', d);
        score_bind(sb, name, AJ_PARAM_I64, (aj_arg_value){.i64 = strides[d]});
        t.shape[d] = shape[d];
        t.strides[d] = strides[d];
    }
    sb->buffers[sb->nb++] = (aj_sim_buffer){
        stored, data, (size_t)aj_tensor_extent_bytes(&t, aj_side_dtype_bytes(dtype))};
}

aj_status aj_side_check_names(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                              const aj_side_tensor *side, int32_t num_side)
{
    AJ_CHECK_ARG(ctx, num_side >= 0 && (num_side == 0 || side),
                 "%s: num_side = %d with side %s; want a count of 0 or more, and the "
                 "tensors when it is not 0", fn, num_side, side ? "given" : "NULL");
    for (int i = 0; i < num_side; i++) {
        int known = 0;
        for (int d = 0; d < op->num_tensors; d++)
            known |= side[i].name && strcmp(side[i].name, op->tensors[d].name) == 0;
        AJ_CHECK_ARG(ctx, known, "%s: side[%d] ('%s') is not a tensor the op declares", fn, i,
                     side[i].name ? side[i].name : "(null)");
    }
    return AJ_OK;
}

aj_status aj_side_check_sinks(aj_ctx *ctx, const char *fn, const char *name,
                              const aj_side_tensor *side, int32_t num_side, int64_t heads_total)
{
    for (int i = 0; name && i < num_side; i++)
        if (side[i].name && strcmp(side[i].name, name) == 0)
            AJ_CHECK_ARG(ctx, side[i].rank == 1 && side[i].shape[0] == heads_total,
                         "%s: sinks tensor '%s' has %lld logits; want one per query head of "
                         "the op, %lld", fn, name, (long long)side[i].shape[0],
                         (long long)heads_total);
    return AJ_OK;
}

aj_status aj_check_dsinks(aj_ctx *ctx, const char *fn, bool has_sinks, const aj_tensor *dsinks,
                          int64_t heads_q)
{
    if (!dsinks->data)
        return AJ_OK;
    AJ_CHECK_ARG(ctx, has_sinks, "%s: dsinks is given, but the op has no sinks", fn);
    AJ_CHECK_ARG(ctx, dsinks->dtype == AJ_DTYPE_F32 && dsinks->rank == 1 &&
                          dsinks->shape[0] == heads_q &&
                          (dsinks->strides[0] >= 1 || heads_q <= 1),
                 "%s: dsinks is %s of rank %d, %lld elements, stride %lld; want f32 [%lld] (one "
                 "per query head of the call), a stride of 1 or more", fn,
                 aj_dtype_name(dsinks->dtype), (int)dsinks->rank, (long long)dsinks->shape[0],
                 (long long)dsinks->strides[0], (long long)heads_q);
    return AJ_OK;
}

/* Whether the view's elements are distinct places: its dims of more than
 * one element, by stride, each step past the previous dims' span. */
static bool distinct_elements(int rank, const int64_t *shape, const int64_t *strides)
{
    int order[4], n = 0;
    for (int d = 0; d < rank; d++)
        if (shape[d] > 1)
            order[n++] = d;
    for (int x = 1; x < n; x++)   /* by stride, rising */
        for (int y = x; y > 0 && strides[order[y]] < strides[order[y - 1]]; y--) {
            int t = order[y];
            order[y] = order[y - 1];
            order[y - 1] = t;
        }
    int64_t span = 1;
    for (int x = 0; x < n; x++) {
        if (strides[order[x]] < span)
            return false;
        span = strides[order[x]] * shape[order[x]];
    }
    return true;
}

int64_t aj_side_numel(const aj_side_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->rank; d++)
        n *= t->shape[d] > 0 ? t->shape[d] : 0;
    return n;
}

const aj_side_tensor *aj_side_named(const aj_side_tensor *side, int32_t n, const char *name)
{
    for (int i = 0; name && i < n; i++)
        if (side[i].name && strcmp(side[i].name, name) == 0)
            return &side[i];
    return NULL;
}

int aj_grad_inputs(const aj_op_info *op, const aj_side_tensor *side, int32_t num_side,
                   const aj_tensor *slopes, aj_side_tensor out[AJ_OP_TENSORS_MAX + 1])
{
    int n = 0;
    for (; n < op->num_tensors; n++) {
        const aj_side_tensor *given = aj_side_named(side, num_side, op->tensors[n].name);
        out[n] = given ? *given : (aj_side_tensor){0};
    }
    if (aj_op_info_alibi_slopes(op)) {
        out[n] = (aj_side_tensor){0};
        if (slopes && slopes->data && slopes->rank == 1 && slopes->dtype == AJ_DTYPE_F32)
            out[n] = (aj_side_tensor){"alibi_slopes", slopes->data, AJ_SIDE_F32, 1,
                                      {slopes->shape[0]}, {slopes->strides[0]}};
        n++;
    }
    return n;
}

/* Input t's name and rank, as the op declares them (alibi's slopes: t =
 * num_tensors). */
static const char *input_name(const aj_op_info *op, int t, int *rank)
{
    *rank = t < op->num_tensors ? op->tensors[t].rank : 1;
    return t < op->num_tensors ? op->tensors[t].name : "alibi_slopes";
}

/* Input t's dtype's name (alibi's slopes: f32). */
static const char *input_dtype(const aj_op_info *op, int t)
{
    return aj_side_dtype_name(t < op->num_tensors ? op->tensors[t].dtype : AJ_SIDE_F32);
}

aj_status aj_check_dside_outputs(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                                 uint32_t tensor_grad, const aj_side_tensor *inputs,
                                 int32_t num_inputs, const aj_side_tensor *dside,
                                 int32_t num_dside)
{
    AJ_CHECK_ARG(ctx, num_dside >= 0 && (num_dside == 0 || dside),
                 "%s: num_dside = %d with dside %s; want a count of 0 or more, and the tensors "
                 "when it is not 0", fn, (int)num_dside, dside ? "given" : "NULL");
    if (num_dside == 0)
        return AJ_OK;
    int rank;
    for (int t = 0; t < num_inputs; t++) {
        const char *name = input_name(op, t, &rank);
        AJ_CHECK_ARG(ctx, !(tensor_grad >> t & 1u) || (inputs[t].name && inputs[t].rank == rank),
                     "%s: side tensor '%s' (%s[%d], grad) is not given", fn, name,
                     input_dtype(op, t), rank);
    }
    for (int i = 0; i < num_dside; i++) {
        const aj_side_tensor *d = &dside[i];
        int t = -1;
        for (int x = 0; x < num_inputs && t < 0; x++)
            if (d->name && strcmp(d->name, input_name(op, x, &rank)) == 0)
                t = x;
        AJ_CHECK_ARG(ctx, t >= 0, "%s: dside[%d] ('%s') is not a tensor the op declares", fn, i,
                     d->name ? d->name : "(null)");
        input_name(op, t, &rank);
        AJ_CHECK_ARG(ctx, tensor_grad >> t & 1u || t < op->num_tensors,
                     "%s: dside[%d]: alibi's slopes are not declared grad (score_mod = "
                     "alibi(grad))", fn, i);
        AJ_CHECK_ARG(ctx, tensor_grad >> t & 1u, "%s: dside[%d]: tensor '%s' is not declared "
                     "grad (tensors = (%s: %s[%d] grad))", fn, i, d->name, d->name,
                     input_dtype(op, t), rank);
        for (int j = 0; j < i; j++)
            AJ_CHECK_ARG(ctx, strcmp(dside[j].name, d->name) != 0,
                         "%s: dside[%d] and dside[%d] both name '%s'", fn, j, i, d->name);
        const aj_side_tensor *given = &inputs[t];
        AJ_CHECK_ARG(ctx, d->data, "%s: dside '%s' has no data", fn, d->name);
        AJ_CHECK_ARG(ctx, d->dtype == AJ_SIDE_F32 && d->rank == given->rank,
                     "%s: dside '%s' is %s[%d]; want f32[%d] (the gradient of side tensor "
                     "'%s')", fn, d->name, aj_side_dtype_name(d->dtype),
                     (int)d->rank, (int)given->rank, d->name);
        for (int k = 0; k < d->rank; k++) {
            AJ_CHECK_ARG(ctx, d->shape[k] == given->shape[k],
                         "%s: dside '%s' has shape[%d] = %lld; want %lld (side tensor '%s')",
                         fn, d->name, k, (long long)d->shape[k], (long long)given->shape[k],
                         d->name);
            AJ_CHECK_ARG(ctx, d->strides[k] >= 0, "%s: dside '%s' has stride[%d] = %lld; want "
                         "0 or more", fn, d->name, k, (long long)d->strides[k]);
        }
        AJ_CHECK_ARG(ctx, distinct_elements(d->rank, d->shape, d->strides),
                     "%s: dside '%s': its strides make two elements one place", fn, d->name);
    }
    return AJ_OK;
}

aj_status aj_check_dside(aj_ctx *ctx, const char *fn, const aj_op_info *op, uint32_t tensor_grad,
                         const aj_bwd_args *a, const fwd_sizes *sz, int64_t fixed_rows,
                         dside_plan *plan)
{
    memset(plan, 0, sizeof *plan);
    aj_side_tensor inputs[AJ_OP_TENSORS_MAX + 1];
    const int n = aj_grad_inputs(op, a->side, a->num_side, &a->alibi_slopes, inputs);
    aj_status st = aj_check_dside_outputs(ctx, fn, op, tensor_grad, inputs, n, a->dside,
                                          a->num_dside);
    if (st != AJ_OK || a->num_dside == 0)
        return st;
    /* each grad tensor's elements, from its side tensor (given: checked),
     * in the score program's order (templates/side_grad.c part_layout) */
    for (int t = 0; t < n; t++) {
        if (!(tensor_grad >> t & 1u))
            continue;
        plan->base[t] = plan->part_size;
        plan->part_size += aj_side_numel(&inputs[t]);
    }
    /* about 256 parts in all: one per (b, h) at least, one per 16 rows at
     * most, fewer where the sums would pass AJ_DSIDE_BYTES_MAX; or the
     * kernel's rows per part */
    int64_t bh = sz->batch * sz->heads_q, most = (sz->seq_q + 15) / 16;
    int64_t parts = bh > 0 ? (256 + bh - 1) / bh : 1;
    parts = parts > most ? most : parts;
    parts = parts < 1 ? 1 : parts;
    if (fixed_rows > 0)
        parts = sz->seq_q > 0 ? (sz->seq_q + fixed_rows - 1) / fixed_rows : 1;
    int64_t per = bh * plan->part_size * 4, want = parts;
    if (per > 0 && parts * per > AJ_DSIDE_BYTES_MAX)
        parts = fixed_rows > 0 ? 0 : AJ_DSIDE_BYTES_MAX / per;
    AJ_CHECK_ARG(ctx, parts >= 1 || per == 0,
                 "%s: the gradients of the grad side tensors (%lld elements) take %lld bytes of "
                 "partial sums for %lld (b, h) x %lld parts, more than %lld: split the call "
                 "over its heads or batch", fn, (long long)plan->part_size,
                 (long long)(want * per), (long long)bh, (long long)want,
                 (long long)AJ_DSIDE_BYTES_MAX);
    plan->count = a->num_dside;
    plan->rows = fixed_rows > 0          ? fixed_rows
                 : sz->seq_q > 0 ? (sz->seq_q + parts - 1) / parts : 1;
    plan->parts = sz->seq_q > 0 ? (sz->seq_q + plan->rows - 1) / plan->rows : 0;
    plan->parts_total = bh * plan->parts;
    return AJ_OK;
}

void aj_dside_values(const dside_plan *plan, const bwd_workspace *w, void *ws,
                     const aj_side_tensor *out, int tensor, launch_values *v)
{
    float *parts = ws ? (float *)ws + w->dside_offset : NULL;
    const aj_tensor all = {parts, AJ_DTYPE_F32, 1, {plan->parts_total * plan->part_size}, {1}};
    put_tensor(v, AJ_PSRC_dside_part, &all);
    put_scalar(v, AJ_PSRC_dside_rows, plan->rows);
    put_scalar(v, AJ_PSRC_dside_parts, plan->parts);
    put_scalar(v, AJ_PSRC_dside_part_size, plan->part_size);
    put_scalar(v, AJ_PSRC_dside_parts_total, plan->parts_total);
    if (!out)
        return;
    /* rank 4, the caller's dims last */
    aj_tensor view = {(void *)out->data, AJ_DTYPE_F32, 4, {1, 1, 1, 1}, {0, 0, 0, 0}};
    for (int d = 0; d < out->rank; d++) {
        view.shape[4 - out->rank + d] = out->shape[d];
        view.strides[4 - out->rank + d] = out->strides[d];
    }
    put_tensor(v, AJ_PSRC_dside, &view);
    put_scalar(v, AJ_PSRC_dside_base, plan->base[tensor]);
}

/* Checks the side tensors of a launch against the op's declarations and
 * binds them and alibi's slopes, as `fn` in messages. */
aj_status aj_bind_scores(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                         const aj_side_tensor *side, int32_t num_side,
                         const aj_tensor *slopes, score_bindings *sb)
{
    memset(sb, 0, sizeof *sb);
    if (aj_op_info_alibi_slopes(op))
        score_bind_tensor(sb, "alibi_slopes", slopes->data, AJ_SIDE_F32, 1, slopes->shape,
                          slopes->strides);
    aj_status st = aj_side_check_names(ctx, fn, op, side, num_side);
    if (st != AJ_OK)
        return st;
    for (int d = 0; d < op->num_tensors; d++) {
        const aj_side_decl *decl = &op->tensors[d];
        const aj_side_tensor *t = NULL;
        for (int i = 0; i < num_side && !t; i++)
            if (strcmp(side[i].name, decl->name) == 0)
                t = &side[i];
        AJ_CHECK_ARG(ctx, t, "%s: side tensor '%s' (%s[%d]) is not given", fn, decl->name,
                     aj_side_dtype_name(decl->dtype), decl->rank);
        AJ_CHECK_ARG(ctx, t->dtype == decl->dtype && t->rank == decl->rank,
                     "%s: side tensor '%s' is %s[%d]; the op declares %s[%d]", fn, decl->name,
                     aj_side_dtype_name(t->dtype), t->rank, aj_side_dtype_name(decl->dtype),
                     decl->rank);
        AJ_CHECK_ARG(ctx, t->data, "%s: side tensor '%s' has no data", fn, decl->name);
        for (int k = 0; k < t->rank; k++) {
            AJ_CHECK_ARG(ctx, t->shape[k] >= 1, "%s: side tensor '%s' has shape[%d] = %lld; "
                         "every dim must be at least 1", fn, decl->name, k,
                         (long long)t->shape[k]);
            AJ_CHECK_ARG(ctx, t->strides[k] >= 0, "%s: side tensor '%s' has stride[%d] = %lld; "
                         "strides must not be negative", fn, decl->name, k,
                         (long long)t->strides[k]);
        }
        score_bind_tensor(sb, decl->name, t->data, t->dtype, t->rank, t->shape, t->strides);
    }
    return AJ_OK;
}

int aj_kernel_takes(const aj_kernel *kernel, aj_param_id id)
{
    for (int s = 0; s < kernel->num_stages; s++)
        for (int i = 0; i < kernel->stages[s].launch.num_params; i++)
            if (kernel->stages[s].param_ids[i] == (int32_t)id)
                return 1;
    return 0;
}

/*
 * The block mask of a padded launch whose kernel reads one (score.h,
 * aj_score_prog.block_mask): `given` after checking it against the launch,
 * else one built here: the builder the kernel was compiled with (its
 * launch plan, compile.c) queued on the launch's stream ahead of it, into
 * scratch (*scratch, which the caller releases once the launch is queued);
 * else, for a kernel loaded from bytes that has no op to build it from,
 * none (the kernels then class their tiles by interval arithmetic).
 */
aj_status aj_bind_block_mask(aj_ctx *ctx, const char *fn, aj_device *dev,
                             const aj_kernel *kernel, const aj_block_mask_shape *launch,
                             const aj_block_mask *given, const aj_side_tensor *side,
                             int32_t num_side, const aj_tensor *slopes, void *stream,
                             launch_values *v, void **scratch)
{
    *scratch = NULL;
    if (!aj_kernel_takes(kernel, AJ_PID(block_mask)))
        return AJ_OK;
    const aj_score_prog *prog = aj_kernel_programs(kernel);
    aj_kernel *builder = atomic_load(&((aj_kernel *)kernel)->mask_builder);
    aj_status st = AJ_OK;
    aj_tensor classes;
    int64_t bm, bn;
    if (given) {
        st = aj_block_mask_view(ctx, fn, given, dev, prog, launch, &classes, &bm, &bn);
    } else if (prog && builder) {
        aj_launch_info li;
        aj_kernel_stage_info(kernel, 0, &li);
        aj_block_mask_shape shape = *launch;
        shape.block_m = li.schedule.block_m;
        shape.block_n = li.schedule.block_n;
        bm = shape.block_m;
        bn = shape.block_n;
        classes = aj_block_mask_tensor(prog, &shape, NULL);
        st = aj_device_scratch(dev, stream, (size_t)(classes.shape[0] * classes.strides[0] * 4),
                               scratch);
        classes.data = *scratch;
        if (st == AJ_OK)
            st = aj_block_mask_launch(ctx, dev, fn, builder, &shape, &classes, side, num_side,
                                      slopes, stream);
    } else {
        return st;
    }
    if (st != AJ_OK)
        return st;
    put_tensor(v, AJ_PSRC_block_mask, &classes);
    put_scalar(v, AJ_PSRC_block_mask_bm, bm);
    put_scalar(v, AJ_PSRC_block_mask_bn, bn);
    return AJ_OK;
}

/* The value of catalogue parameter `p`; 0 when its source is not given. */
static int param_value(const aj_param_row *p, const launch_values *v, aj_arg_value *out)
{
    if (!(v->given & (1ull << p->source)))
        return 0;
    const aj_tensor *t = &v->tensor[p->source];
    int64_t x = 0;
    switch (p->how) {
    case AJ_PHOW_DATA: out->ptr = t->data; return 1;
    case AJ_PHOW_STRIDE: x = t->strides[p->dim]; break;
    case AJ_PHOW_BSTRIDE: x = t->shape[p->dim] == 1 ? 0 : t->strides[p->dim]; break;
    case AJ_PHOW_SHAPE: x = t->shape[p->dim]; break;
    case AJ_PHOW_SCALAR: x = v->scalar[p->source]; break;
    case AJ_PHOW_ENCODE: return 1;   /* encoded once bound: encode_byvals */
    }
    if (p->type == AJ_PARAM_I32)
        out->i32 = (int32_t)x;
    else
        out->i64 = x;
    return 1;
}

launch_scratch *aj_launch_scratch_new(aj_ctx *ctx, const char *fn, aj_status *st)
{
    if (*st != AJ_OK)
        return NULL;
    /* its by-value blobs on AJ_BYVAL_ALIGN bytes (sizeof is a multiple) */
    launch_scratch *ls = aligned_alloc(_Alignof(launch_scratch), sizeof *ls);
    if (!ls)
        *st = aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return ls;
}

static aj_status encode_byvals(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                               int stage, const launch_values *v, bound_args *out);

aj_status aj_bind_stage(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel, int stage,
                        const launch_values *v, const score_bindings *scores,
                        bound_args *out)
{
    aj_launch_info li;
    aj_kernel_stage_info(kernel, stage, &li);
    out->nb = 0;
    for (int i = 0; i < li.num_params; i++) {
        const char *name = li.params[i].name;
        const aj_param_row *p = aj_param_row_of(kernel->stages[stage].param_ids[i]);
        int found = 0;
        if (p) {
            found = p->type == li.params[i].type && param_value(p, v, &out->values[i]);
            if (found && p->how == AJ_PHOW_DATA) {
                const aj_tensor *t = &v->tensor[p->source];
                out->buffers[out->nb++] = (aj_sim_buffer){
                    name, t->data, (size_t)aj_tensor_extent_bytes(t, aj_dtype_size(t->dtype))};
            }
        }
        for (int j = 0; !p && scores && j < scores->n && !found; j++)
            if (strcmp(scores->b[j].name, name) == 0 && scores->b[j].type == li.params[i].type) {
                out->values[i] = scores->b[j].value;
                found = 1;
            }
        if (!found)
            return aj_fail(ctx, AJ_ERR_INTERNAL, "kernel %s: no launch value for parameter "
                           "'%s'", aj_kernel_stage_entry(kernel, stage), name);
        out->argv[i] = &out->values[i];
    }
    for (int j = 0; scores && j < scores->nb; j++)
        out->buffers[out->nb++] = scores->buffers[j];
    return encode_byvals(ctx, dev, kernel, stage, v, out);
}

/* The stage's by-value arguments, encoded from their launch values into
 * out->blobs, each the argument its parameter points to (the plan's list;
 * a kernel without a plan derives it). */
static aj_status encode_byvals(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                               int stage, const launch_values *v, bound_args *out)
{
    aj_byval_args own;
    const aj_byval_args *byval = aj_kernel_byval_args(kernel);
    aj_status st = AJ_OK;
    if (!byval) {
        st = aj_byval_args_of(ctx, kernel, &own);
        byval = &own;
    }
    aj_launch_info li;
    aj_kernel_stage_info(kernel, stage, &li);
    for (int j = 0, k = 0; st == AJ_OK && j < byval->n; j++) {
        const aj_byval_arg *a = &byval->arg[j];
        if (a->stage != stage)
            continue;
        unsigned char *blob = out->blobs[k++];
        /* a TMA map the launch does not use (tma = 0): zeros, never read */
        if (a->tma && !v->scalar[AJ_PSRC_tma])
            memset(blob, 0, AJ_BYVAL_BYTES);
        else
            st = a->encode(ctx, dev, kernel, &v->tensor[a->source], blob);
        out->argv[a->index] = blob;
        out->buffers[out->nb++] = (aj_sim_buffer){li.params[a->index].name, blob,
                                                  AJ_BYVAL_BYTES};
    }
    return st;
}

/* What every attention launch fills: q, k, v, lse, the sizes, offsets,
 * totals, the dropout stream, and varlen's offsets and the device's status
 * word (templates/attn_common.h: a u32 the kernels record a cu_seqlens
 * fault in, bound as one 4-byte element). */
static void attention_values(const aj_tensor *q, const aj_tensor *k, const aj_tensor *v_,
                             const aj_tensor *lse, const fwd_sizes *sz, int64_t q_offset,
                             int64_t kv_offset, int64_t sq_given, int64_t sk_given,
                             int64_t sq_total, int64_t sk_total, uint64_t seed, uint64_t offset,
                             const int32_t *cu_q, const int32_t *cu_k, int32_t batch,
                             void *status, launch_values *v)
{
    v->given = 0;
    put_tensor(v, AJ_PSRC_q, q);
    put_tensor(v, AJ_PSRC_k, k);
    put_tensor(v, AJ_PSRC_v, v_);
    put_tensor(v, AJ_PSRC_lse, lse);
    /* int32 offsets, as 4-byte elements */
    const aj_tensor cu[2] = {{(void *)cu_q, AJ_DTYPE_F32, 1, {batch + 1}, {1}},
                             {(void *)cu_k, AJ_DTYPE_F32, 1, {batch + 1}, {1}}};
    put_tensor(v, AJ_PSRC_cu_seqlens_q, &cu[0]);
    put_tensor(v, AJ_PSRC_cu_seqlens_k, &cu[1]);
    const aj_tensor status_word = {status, AJ_DTYPE_F32, 1, {1}, {1}};
    put_tensor(v, AJ_PSRC_varlen_status, &status_word);
    put_scalar(v, AJ_PSRC_heads_q, sz->heads_q);
    put_scalar(v, AJ_PSRC_heads_kv, sz->heads_kv);
    put_scalar(v, AJ_PSRC_seq_q, sz->seq_q);
    put_scalar(v, AJ_PSRC_seq_k, sz->seq_k);
    put_scalar(v, AJ_PSRC_batch, sz->batch);
    put_scalar(v, AJ_PSRC_q_offset, q_offset);
    put_scalar(v, AJ_PSRC_kv_offset, kv_offset);
    put_scalar(v, AJ_PSRC_sq_total, sq_given);
    put_scalar(v, AJ_PSRC_sk_total, sk_given);
    put_scalar(v, AJ_PSRC_seq_q_total, sq_total);
    put_scalar(v, AJ_PSRC_seq_k_total, sk_total);
    put_scalar(v, AJ_PSRC_dropout_seed, (int64_t)seed);
    put_scalar(v, AJ_PSRC_dropout_offset, (int64_t)offset);
    put_scalar(v, AJ_PSRC_head_offset, sz->head_offset);
    put_scalar(v, AJ_PSRC_heads_q_total, sz->heads_total);
    /* no block mask until bind_block_mask gives one */
    const aj_tensor no_mask = {NULL, AJ_DTYPE_F32, 4, {1, 1, 1, 1}, {0, 0, 0, 0}};
    put_tensor(v, AJ_PSRC_block_mask, &no_mask);
    put_scalar(v, AJ_PSRC_block_mask_bm, 1);
    put_scalar(v, AJ_PSRC_block_mask_bn, 1);
}

void aj_forward_values(const aj_fwd_args *a, const fwd_sizes *sz, int64_t sq_total,
                       int64_t sk_total, void *status, launch_values *v)
{
    attention_values(&a->q, &a->k, &a->v, &a->lse, sz, a->q_offset, a->kv_offset, a->sq_total,
                     a->sk_total, sq_total, sk_total, a->seed, a->offset, a->cu_seqlens_q,
                     a->cu_seqlens_k, a->batch, status, v);
    put_tensor(v, AJ_PSRC_o, &a->o);
    put_tensor(v, AJ_PSRC_o_acc, &a->o_acc);
    put_tensor(v, AJ_PSRC_bias, &a->bias);
    put_tensor(v, AJ_PSRC_q_scale, &a->q_scale);
    put_tensor(v, AJ_PSRC_k_scale, &a->k_scale);
    put_tensor(v, AJ_PSRC_v_scale, &a->v_scale);
}

void aj_merge_values(const aj_merge_args *a, const fwd_sizes *sz, launch_values *v)
{
    v->given = 0;
    const aj_tensor *t[6] = {&a->o1, &a->o2, &a->o, &a->lse1, &a->lse2, &a->lse};
    const aj_param_source src[6] = {AJ_PSRC_o1, AJ_PSRC_o2, AJ_PSRC_o, AJ_PSRC_lse1,
                                    AJ_PSRC_lse2, AJ_PSRC_lse};
    for (int i = 0; i < 6; i++)
        put_tensor(v, src[i], t[i]);
    put_scalar(v, AJ_PSRC_seq_q, sz->seq_q);
}

void aj_backward_values(const aj_bwd_args *a, const fwd_sizes *sz, int64_t sq_total,
                        int64_t sk_total, const bwd_workspace *w, void *ws, void *status,
                        launch_values *v)
{
    attention_values(&a->q, &a->k, &a->v, &a->lse, sz, a->q_offset, a->kv_offset, a->sq_total,
                     a->sk_total, sq_total, sk_total, a->seed, a->offset, a->cu_seqlens_q,
                     a->cu_seqlens_k, a->batch, status, v);
    const aj_tensor *t[8] = {&a->o,    &a->do_,  &a->dq,    &a->dk,
                             &a->dv,   &a->bias, &a->dbias, &a->dsinks};
    const aj_param_source src[8] = {AJ_PSRC_o,  AJ_PSRC_do,   AJ_PSRC_dq,    AJ_PSRC_dk,
                                    AJ_PSRC_dv, AJ_PSRC_bias, AJ_PSRC_dbias, AJ_PSRC_dsinks};
    for (int i = 0; i < 8; i++)
        put_tensor(v, src[i], t[i]);
    const aj_tensor ws_t = {ws, AJ_DTYPE_F32, 1, {(int64_t)(w->bytes / 4)}, {1}};
    put_tensor(v, AJ_PSRC_workspace, &ws_t);
    put_scalar(v, AJ_PSRC_stride_ws_b, w->stride_b);
    put_scalar(v, AJ_PSRC_stride_ws_h, w->stride_h);
    put_scalar(v, AJ_PSRC_ws_dq_offset, w->offset[AJ_WS_DQ]);
}

/* ---------------------------------------------------------------- by value */

/* AJ_PENC_TENSOR_DESC: the tensor's view (params.h, aj_tensor_desc). */
static aj_status encode_tensor_desc(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                                    const aj_tensor *t, void *out)
{
    (void)kernel;
    aj_tensor_desc d = {(uint64_t)(uintptr_t)t->data, (int32_t)t->dtype, t->rank, {0}, {0}};
    for (int i = 0; i < t->rank && i < 4; i++) {
        d.shape[i] = t->shape[i];
        d.strides[i] = t->strides[i];
    }
    memset(out, 0, AJ_BYVAL_BYTES);
    memcpy(out, &d, sizeof d);
    return AJ_OK;
}

/*
 * The TMA tensor map of a padded [B, H, S, D] tensor (params.h,
 * AJ_PENC_TMA_*): 4 dims (D, S, H, B), box (E, rows, 1, 1) with E =
 * aj_wgmma_panel_span(width) / 2 and that swizzle.  0 where TMA cannot
 * describe it (a 16-byte-aligned base, D contiguous and `width` wide, the
 * other strides multiples of 16 bytes under 2^40): the launch then runs
 * the kernel's cp.async loads.  A dim of size 1 takes the stride of the
 * dims inside it, which is never read.
 */
static int tma_describe(const aj_tensor *t, int rows, int width, aj_tensor_map_args *a)
{
    if (t->rank != 4 || (t->dtype != AJ_DTYPE_F16 && t->dtype != AJ_DTYPE_BF16) ||
        (uintptr_t)t->data % 16 || t->strides[3] != 1 || t->shape[3] != width)
        return 0;
    int span = aj_wgmma_panel_span(width);
    *a = (aj_tensor_map_args){.dtype = t->dtype, .rank = 4, .base = t->data, .span = span,
                              .box = {(uint32_t)span / 2, (uint32_t)rows, 1, 1}};
    uint64_t inner = (uint64_t)width * 2;
    for (int i = 0; i < 4; i++) {
        int dim = 3 - i;   /* map dim i is the tensor's dim 3 - i */
        uint64_t bytes = (uint64_t)t->strides[dim] * 2;
        if (t->shape[dim] < 1 || (uint64_t)t->shape[dim] > (1ull << 32))
            return 0;
        if (i && t->shape[dim] == 1)
            bytes = (inner + 15) / 16 * 16;
        else if (i && (t->strides[dim] <= 0 || bytes % 16 || bytes >= (1ull << 40)))
            return 0;
        a->dims[i] = (uint64_t)t->shape[dim];
        a->strides[i] = i ? bytes : 2;
        inner = a->strides[i] * a->dims[i];
    }
    return 1;
}

/* Q's (block_m rows, D), K's (block_n, D) or V's (block_n, Dv) box. */
static void tma_box(const aj_kernel *kernel, aj_param_encoder which, int *rows, int *width)
{
    const aj_schedule *s = &kernel->stages[0].launch.schedule;
    int d = kernel->op.head_dim, dv = kernel->op.head_dim_v ? kernel->op.head_dim_v : d;
    *rows = which == AJ_PENC_TMA_Q ? s->block_m : s->block_n;
    *width = which == AJ_PENC_TMA_V ? dv : d;
}

static aj_status encode_tma(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                            aj_param_encoder which, const aj_tensor *t, void *out)
{
    int rows, width;
    aj_tensor_map_args a;
    tma_box(kernel, which, &rows, &width);
    if (!aj_device_has_tensor_map(dev))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "kernel %s: device %s encodes no TMA tensor "
                       "maps", aj_kernel_entry(kernel), aj_device_name(dev));
    if (!tma_describe(t, rows, width, &a))
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "kernel %s: TMA cannot describe this tensor "
                       "(rank 4, f16 or bf16, a 16-byte-aligned base, dim 3 contiguous and %d "
                       "wide, the other strides multiples of 16 bytes); launch with tma = 0",
                       aj_kernel_entry(kernel), width);
    memset(out, 0, AJ_BYVAL_BYTES);
    return dev->ops->tensor_map(ctx, dev, &a, out);
}

#define TMA_ENCODER(which, fn)                                                             \
    static aj_status fn(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,              \
                        const aj_tensor *t, void *out)                                     \
    {                                                                                      \
        return encode_tma(ctx, dev, kernel, which, t, out);                                \
    }
TMA_ENCODER(AJ_PENC_TMA_Q, encode_tma_q)
TMA_ENCODER(AJ_PENC_TMA_K, encode_tma_k)
TMA_ENCODER(AJ_PENC_TMA_V, encode_tma_v)
#undef TMA_ENCODER

static const aj_byval_encode encoders[AJ_PENC_COUNT] = {
    [AJ_PENC_TENSOR_DESC] = encode_tensor_desc,
    [AJ_PENC_TMA_Q] = encode_tma_q,
    [AJ_PENC_TMA_K] = encode_tma_k,
    [AJ_PENC_TMA_V] = encode_tma_v,
};

int aj_tma_usable(const aj_device *dev, const aj_kernel *kernel, const launch_values *v)
{
    static const struct { aj_param_encoder which; aj_param_source source; } maps[3] = {
        {AJ_PENC_TMA_Q, AJ_PSRC_q}, {AJ_PENC_TMA_K, AJ_PSRC_k}, {AJ_PENC_TMA_V, AJ_PSRC_v}};
    if (!aj_device_has_tensor_map(dev))
        return 0;
    for (int i = 0; i < 3; i++) {
        int rows, width;
        aj_tensor_map_args a;
        tma_box(kernel, maps[i].which, &rows, &width);
        if (!(v->given & (1ull << maps[i].source)) ||
            !tma_describe(&v->tensor[maps[i].source], rows, width, &a))
            return 0;
    }
    return 1;
}

aj_status aj_byval_args_of(aj_ctx *ctx, const aj_kernel *kernel, aj_byval_args *out)
{
    out->n = 0;
    for (int s = 0; s < kernel->num_stages; s++)
        for (int i = 0; i < kernel->stages[s].launch.num_params; i++) {
            const aj_param_row *p = aj_param_row_of(kernel->stages[s].param_ids[i]);
            if (!p || p->how != AJ_PHOW_ENCODE)
                continue;
            if (out->n == AJ_BYVAL_MAX || (unsigned)p->dim >= AJ_PENC_COUNT)
                return aj_fail(ctx, AJ_ERR_INTERNAL, "kernel %s: more than %d by-value "
                               "parameters, or '%s' has no encoder", aj_kernel_entry(kernel),
                               AJ_BYVAL_MAX, p->name);
            out->arg[out->n++] = (aj_byval_arg){s, i, p->source, encoders[p->dim],
                                                p->dim >= AJ_PENC_TMA_Q && p->dim <= AJ_PENC_TMA_V};
        }
    return AJ_OK;
}

aj_status aj_kernel_encode_param(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                                 int32_t stage, int32_t index, const aj_tensor *tensor,
                                 void *out)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    const char *fn = "aj_kernel_encode_param";
    AJ_CHECK_ARG(ctx, dev && kernel && tensor && out, "%s: %s is NULL", fn,
                 !dev ? "dev" : !kernel ? "kernel" : !tensor ? "tensor" : "out");
    AJ_CHECK_ARG(ctx, aj_device_runs(dev, kernel->target),
                 "%s: kernel compiled for %s cannot run on a %s device", fn,
                 aj_target_name(kernel->target), aj_target_name(aj_device_target(dev)));
    AJ_CHECK_ARG(ctx, stage >= 0 && stage < kernel->num_stages, "%s: stage = %d; kernel %s "
                 "has stages 0 .. %d", fn, stage, aj_kernel_entry(kernel),
                 kernel->num_stages - 1);
    aj_launch_info li;
    aj_kernel_stage_info(kernel, stage, &li);
    AJ_CHECK_ARG(ctx, index >= 0 && index < li.num_params, "%s: index = %d; stage %d has "
                 "parameters 0 .. %d", fn, index, stage, li.num_params - 1);
    const aj_param_row *p = aj_param_row_of(kernel->stages[stage].param_ids[index]);
    AJ_CHECK_ARG(ctx, li.params[index].type == AJ_PARAM_BYVAL128 && p &&
                 p->how == AJ_PHOW_ENCODE, "%s: parameter %d of stage %d ('%s') is not "
                 "passed by value (AJ_PARAM_BYVAL128)", fn, index, stage, li.params[index].name);
    AJ_CHECK_ARG(ctx, (uintptr_t)out % AJ_BYVAL_ALIGN == 0, "%s: out = %p is not %d-byte "
                 "aligned", fn, out, AJ_BYVAL_ALIGN);
    return encoders[p->dim](ctx, dev, kernel, tensor, out);
}

/* ---------------------------------------------------------------- sources */

uint64_t aj_launch_sources(aj_kind kind)
{
    launch_values v = {.given = 0};
    const fwd_sizes sz = {0};
    if (kind == AJ_KIND_FORWARD) {
        const aj_fwd_args a = AJ_FWD_ARGS_INIT;
        aj_forward_values(&a, &sz, 0, 0, NULL, &v);
    } else if (kind == AJ_KIND_BACKWARD) {
        const aj_bwd_args a = AJ_BWD_ARGS_INIT;
        const bwd_workspace w = {0, 0, {0}, 0, 0, 0};
        aj_backward_values(&a, &sz, 0, 0, &w, NULL, NULL, &v);
        const dside_plan plan = {0};
        const aj_side_tensor out = {.rank = 1, .shape = {1}, .strides = {1}};
        aj_dside_values(&plan, &w, NULL, &out, 0, &v);
    } else if (kind == AJ_KIND_MERGE) {
        const aj_merge_args a = AJ_MERGE_ARGS_INIT;
        aj_merge_values(&a, &sz, &v);
    }
    return v.given;
}
