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
};

aj_status aj_template_find(aj_ctx *ctx, const aj_op *op,
                           const aj_template **out)
{
    for (size_t i = 0; i < sizeof templates / sizeof templates[0]; i++) {
        if (templates[i]->kind == op->kind && templates[i]->variant == op->variant) {
            *out = templates[i];
            return AJ_OK;
        }
    }
    return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "%s %s: no template implements this kind and "
                   "variant yet", aj_kind_name(op->kind), aj_variant_name(op->variant));
}
