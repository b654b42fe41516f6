/*
 * nvptx.c -- NVPTX target: target machines, kernel annotations, limits.
 */
#include <stdio.h>
#include <pthread.h>
#include <string.h>

#include <llvm-c/Target.h>

#include "codegen/codegen.h"

#define NVPTX_TRIPLE "nvptx64-nvidia-cuda"

static pthread_once_t nvptx_once = PTHREAD_ONCE_INIT;

static void nvptx_init(void)
{
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
}

aj_status aj_nvptx_target_machine(aj_ctx *ctx, aj_target target,
                                  int opt_level, LLVMTargetMachineRef *out)
{
    return aj_nvptx_target_machine_isa(ctx, target, opt_level, 0, out);
}

aj_status aj_nvptx_target_machine_isa(aj_ctx *ctx, aj_target target, int opt_level,
                                      int ptx_isa, LLVMTargetMachineRef *out)
{
    /* "+ptxNN" raises the module's .version past the CPU's own */
    char features[16] = "";
    if (ptx_isa > 0)
        snprintf(features, sizeof features, "+ptx%d", ptx_isa);
    pthread_once(&nvptx_once, nvptx_init);
    LLVMTargetRef t = NULL;
    char *err = NULL;
    if (LLVMGetTargetFromTriple(NVPTX_TRIPLE, &t, &err)) {
        aj_status st = aj_fail(ctx, AJ_ERR_CODEGEN, "NVPTX target unavailable: %s", err);
        LLVMDisposeMessage(err);
        return st;
    }
    static const LLVMCodeGenOptLevel levels[4] = {
        LLVMCodeGenLevelNone, LLVMCodeGenLevelLess, LLVMCodeGenLevelDefault,
        LLVMCodeGenLevelAggressive};
    LLVMTargetMachineRef tm = LLVMCreateTargetMachine(
        t, NVPTX_TRIPLE, aj_target_name(target), features, levels[opt_level],
        LLVMRelocDefault, LLVMCodeModelDefault);
    if (!tm)
        return aj_fail(ctx, AJ_ERR_CODEGEN, "cannot create an NVPTX target machine for %s",
                       aj_target_name(target));
    *out = tm;
    return AJ_OK;
}

static LLVMMetadataRef md_i32(LLVMContextRef c, int32_t v)
{
    return LLVMValueAsMetadata(LLVMConstInt(LLVMInt32TypeInContext(c), (unsigned)v, 0));
}

static void annotate(LLVMModuleRef mod, LLVMValueRef fn, const char *key, int32_t value)
{
    LLVMContextRef c = LLVMGetModuleContext(mod);
    LLVMMetadataRef ops[3] = {LLVMValueAsMetadata(fn),
                              LLVMMDStringInContext2(c, key, strlen(key)),
                              md_i32(c, value)};
    LLVMValueRef node = LLVMMetadataAsValue(c, LLVMMDNodeInContext2(c, ops, 3));
    LLVMAddNamedMetadataOperand(mod, "nvvm.annotations", node);
}

void aj_nvptx_annotate_grid_constant(LLVMModuleRef mod, LLVMValueRef fn, const int *params,
                                     int n)
{
    LLVMContextRef c = LLVMGetModuleContext(mod);
    LLVMMetadataRef list[64];
    for (int i = 0; i < n && i < 64; i++)
        list[i] = md_i32(c, params[i]);
    LLVMMetadataRef ops[3] = {LLVMValueAsMetadata(fn),
                              LLVMMDStringInContext2(c, "grid_constant", 13),
                              LLVMMDNodeInContext2(c, list, (size_t)(n < 64 ? n : 64))};
    LLVMValueRef node = LLVMMetadataAsValue(c, LLVMMDNodeInContext2(c, ops, 3));
    LLVMAddNamedMetadataOperand(mod, "nvvm.annotations", node);
}

void aj_nvptx_annotate_kernel(LLVMModuleRef mod, LLVMValueRef fn,
                              int32_t threads, int32_t min_ctas_per_sm)
{
    LLVMSetFunctionCallConv(fn, LLVMPTXKernelCallConv);
    /* !nvvm.annotations: .maxntid lets ptxas budget registers for exactly
     * this CTA size; .minnctapersm states the occupancy the template was
     * designed for.  With .maxntid alone ptxas may cap registers for an
     * occupancy nobody asked for and spill to reach it. */
    annotate(mod, fn, "maxntidx", threads);
    annotate(mod, fn, "minctasm", min_ctas_per_sm);
}
