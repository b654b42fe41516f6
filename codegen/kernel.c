/*
 * kernel.c -- the compiled kernel: code plus its launch contract.
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/codegen.h"

aj_status aj_kernel_new(aj_ctx *ctx, const aj_kb *kb, const char *entry,
                        aj_target target, aj_emit emit, const void *code,
                        size_t code_size, const aj_kernel_layout *layout,
                        aj_kernel **out)
{
    aj_kernel *k = calloc(1, sizeof *k);
    int n = kb->num_params;
    if (k) {
        k->entry = strdup(entry);
        k->code = malloc(code_size + 1);
        k->params = calloc((size_t)n + 1, sizeof *k->params);
        k->param_names = calloc((size_t)n + 1, sizeof *k->param_names);
    }
    if (!k || !k->entry || !k->code || !k->params || !k->param_names) {
        aj_kernel_destroy(k);
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory for the compiled kernel");
    }
    memcpy(k->code, code, code_size);
    k->code[code_size] = '\0';
    k->code_size = code_size;
    k->target = target;
    k->emit = emit;
    for (int i = 0; i < n; i++) {
        memcpy(k->param_names[i], kb->params[i].name, sizeof k->param_names[i]);
        k->params[i].name = k->param_names[i];
        k->params[i].type = kb->params[i].type;
    }
    k->launch.block[0] = kb->block_threads;
    k->launch.block[1] = 1;
    k->launch.block[2] = 1;
    memcpy(k->launch.grid, layout->grid, sizeof k->launch.grid);
    k->launch.dynamic_smem = kb->dynamic_smem;
    k->launch.num_params = n;
    k->launch.params = k->params;
    k->launch.schedule = layout->schedule;
    *out = k;
    return AJ_OK;
}

void aj_kernel_destroy(aj_kernel *kernel)
{
    if (!kernel)
        return;
    aj_sim_jit_dispose(kernel->jit);
    free(kernel->entry);
    free(kernel->code);
    free(kernel->params);
    free(kernel->param_names);
    free(kernel);
}

const void *aj_kernel_code(const aj_kernel *kernel, size_t *size)
{
    if (!kernel) {
        if (size)
            *size = 0;
        return NULL;
    }
    if (size)
        *size = kernel->code_size;
    return kernel->code;
}

aj_emit aj_kernel_emit(const aj_kernel *kernel)
{
    return kernel ? kernel->emit : AJ_EMIT_COUNT;
}

aj_target aj_kernel_target(const aj_kernel *kernel)
{
    return kernel ? kernel->target : AJ_TARGET_ANY;
}

const char *aj_kernel_entry(const aj_kernel *kernel)
{
    return kernel ? kernel->entry : NULL;
}

aj_status aj_kernel_launch_info(const aj_kernel *kernel, aj_launch_info *out)
{
    if (!kernel || !out)
        return AJ_ERR_INVALID_ARG;
    *out = kernel->launch;
    return AJ_OK;
}

aj_status aj_kernel_compile_stats(const aj_kernel *kernel, aj_compile_stats *out)
{
    if (!kernel || !out)
        return AJ_ERR_INVALID_ARG;
    *out = kernel->stats;
    return AJ_OK;
}
