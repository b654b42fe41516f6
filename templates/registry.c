/*
 * registry.c -- the list of kernel templates and the lookup over it.
 */
#include "templates/template.h"

static const aj_template *const templates[] = {
    &aj_template_efficient_fwd,
    &aj_template_efficient_bwd,
    &aj_template_flash_bwd,
    &aj_template_merge,
    &aj_template_flash_fwd,
    &aj_template_paged_fwd_flash,
    &aj_template_paged_fwd_efficient,
    &aj_template_cpu_fwd_flash,
    &aj_template_cpu_fwd_efficient,
    &aj_template_cpu_fwd_paged_flash,
    &aj_template_cpu_fwd_paged_efficient,
    &aj_template_cpu_bwd_flash,
    &aj_template_cpu_bwd_efficient,
    &aj_template_cpu_merge,
};

aj_status aj_template_find(aj_ctx *ctx, const aj_op *op, aj_target target,
                           const aj_template **out)
{
    for (size_t i = 0; i < sizeof templates / sizeof templates[0]; i++) {
        /* no mask: the SIMT targets (the GPUs' and sim), by the target table */
        bool builds = templates[i]->targets ? (templates[i]->targets >> target) & 1u
                                            : aj_target_desc_of(target)->simt;
        if (templates[i]->kind == op->kind && templates[i]->variant == op->variant && builds &&
            templates[i]->paged == (op->layout == AJ_LAYOUT_PAGED)) {
            *out = templates[i];
            return AJ_OK;
        }
    }
    return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "%s %s: no template implements this kind and "
                   "variant for target %s yet", aj_kind_name(op->kind),
                   aj_variant_name(op->variant), aj_target_name(target));
}
