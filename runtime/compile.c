/*
 * compile.c -- aj_compile: check the op, pick its template, run codegen.
 */
#include <stdio.h>
#include <string.h>

#include "runtime/sim/emulator.h"
#include "templates/template.h"

/* Options from a caller built against an older, shorter struct get the
 * defaults for the fields it does not know. */
static aj_status read_options(aj_ctx *ctx, const aj_compile_options *in,
                              aj_compile_options *out)
{
    const aj_compile_options defaults = AJ_COMPILE_OPTIONS_INIT;
    *out = defaults;
    if (!in)
        return AJ_OK;
    if (in->struct_size < offsetof(aj_compile_options, emit) ||
        in->struct_size > sizeof *in)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG,
                       "aj_compile: options->struct_size = %zu; start from "
                       "AJ_COMPILE_OPTIONS_INIT", in->struct_size);
    memcpy(out, in, in->struct_size);
    if ((unsigned)out->target >= AJ_TARGET_COUNT || out->target == AJ_TARGET_ANY)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG,
                       "aj_compile: options->target = %d is not a target", (int)out->target);
    if ((unsigned)out->emit >= AJ_EMIT_COUNT)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG,
                       "aj_compile: options->emit = %d is not an emit kind", (int)out->emit);
    if (out->opt_level < 0 || out->opt_level > 3)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG,
                       "aj_compile: options->opt_level = %d is outside 0..3", out->opt_level);
    return AJ_OK;
}

aj_status aj_compile(aj_ctx *ctx, const aj_op *op,
                     const aj_compile_options *options, aj_kernel **out)
{
    aj_status st = AJ_OK;
    aj_compile_options opt;
    const aj_template *tmpl = NULL;
    char hash[AJ_HASH_HEX_LEN + 1];
    char entry[64];

    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, op, "aj_compile: op is NULL");
    AJ_CHECK_ARG(ctx, out, "aj_compile: out is NULL");
    AJ_TRY(read_options(ctx, options, &opt));
    AJ_TRY(aj_op_verify(op));
    if (op->target != AJ_TARGET_ANY && op->target != opt.target) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG,
                     "aj_compile: the op is pinned to target %s but %s was asked for",
                     aj_target_name(op->target), aj_target_name(opt.target));
        goto done;
    }
    AJ_TRY(aj_codegen_target_supported(ctx, opt.target));
    AJ_TRY(aj_template_find(ctx, op, &tmpl));
    AJ_TRY(tmpl->check(ctx, op, opt.target));
    AJ_TRY(aj_op_hash(op, hash));
    snprintf(entry, sizeof entry, "aj_%s_%s", tmpl->name, hash);
    size_t nsyms = 0;
    const aj_host_symbol *syms = aj_sim_symbols(&nsyms);
    AJ_TRY(aj_codegen_run(ctx, op, &opt, entry, tmpl->build, NULL, syms, nsyms, out));
    aj_op_get_info(op, &(*out)->op);
done:
    return st;
}
