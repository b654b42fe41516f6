/*
 * pipeline.c -- the compile pipeline, one function calling its stages in
 * order (the diagram is in codegen.h).
 */
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>
#include <llvm-c/BitWriter.h>
#include <llvm-c/Transforms/PassBuilder.h>

#include "codegen/codegen.h"

const char *aj_llvm_version(void)
{
    return AJ_LLVM_VERSION_STRING;
}

aj_status aj_codegen_target_supported(aj_ctx *ctx, aj_target target)
{
    if (aj_target_desc_of(target)->family != AJ_FAMILY_NONE)
        return AJ_OK;
    return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "target '%s' is not implemented yet",
                   aj_target_name(target));
}

static double now_ms(void)
{
    return aj_now() * 1e3;
}

static int32_t count_instructions(LLVMModuleRef mod)
{
    int32_t n = 0;
    for (LLVMValueRef f = LLVMGetFirstFunction(mod); f; f = LLVMGetNextFunction(f))
        for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb; bb = LLVMGetNextBasicBlock(bb))
            for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i; i = LLVMGetNextInstruction(i))
                n++;
    return n;
}

static void dump_stage(aj_ctx *ctx, const aj_compile_options *opt,
                       const char *stage, LLVMModuleRef mod)
{
    if (!opt->dump_after || strcmp(opt->dump_after, stage) != 0)
        return;
    char *text = LLVMPrintModuleToString(mod);
    aj_log(ctx, AJ_LOG_DEBUG, "module after %s:\n%s", stage, text);
    LLVMDisposeMessage(text);
}

static aj_status verify_module(aj_ctx *ctx, LLVMModuleRef mod, const char *stage)
{
    char *msg = NULL;
    if (LLVMVerifyModule(mod, LLVMReturnStatusAction, &msg)) {
        aj_status st = aj_fail(ctx, AJ_ERR_CODEGEN, "invalid LLVM IR after %s: %s",
                               stage, msg ? msg : "");
        LLVMDisposeMessage(msg);
        return st;
    }
    LLVMDisposeMessage(msg);
    return AJ_OK;
}

/*
 * IR pass pipelines by opt_level.  Templates emit straight-line code with
 * mutable variables as allocas and loops they mean to keep, so level 2 --
 * the default -- runs the handful of passes that matter for such code
 * (promote to registers, CSE, combine, hoist) and leaves unrolling to the
 * templates; it costs a fifth of LLVM's default<O3> (level 3) and gave the
 * same or fewer registers in ptxas on the efficient forward kernels.  The
 * cpu kernels (explicit vectors, register tiles, loops over columns) ran
 * as fast with it as with default<O3> (bench/README.md, "bench/cpu --jit"),
 * whose unrolling only multiplied their code and the x86 backend's time.
 */
static const char *const pipelines[4] = {
    "function(sroa)",
    "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg)",
    "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,simplifycfg,"
    "loop-mssa(loop-rotate,licm),early-cse<memssa>,simplifycfg)",
    "default<O3>",
};

static aj_status optimize(aj_ctx *ctx, LLVMModuleRef mod, LLVMTargetMachineRef tm,
                          int opt_level)
{
    const char *pipeline = pipelines[opt_level];
    LLVMPassBuilderOptionsRef pbo = LLVMCreatePassBuilderOptions();
    LLVMErrorRef err = LLVMRunPasses(mod, pipeline, tm, pbo);
    LLVMDisposePassBuilderOptions(pbo);
    if (err) {
        char *msg = LLVMGetErrorMessage(err);
        aj_status st = aj_fail(ctx, AJ_ERR_CODEGEN, "LLVM optimisation failed: %s", msg);
        LLVMDisposeErrorMessage(msg);
        return st;
    }
    return AJ_OK;
}

/* A malloc'd, NUL-terminated copy of buf, which this disposes. */
static aj_status take_buffer(aj_ctx *ctx, LLVMMemoryBufferRef buf, char **code, size_t *size)
{
    *size = LLVMGetBufferSize(buf);
    *code = malloc(*size + 1);
    if (*code) {
        memcpy(*code, LLVMGetBufferStart(buf), *size);
        (*code)[*size] = '\0';
    }
    LLVMDisposeMemoryBuffer(buf);
    return *code ? AJ_OK : aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
}

/* Emits the requested form into a malloc'd buffer. */
static aj_status emit(aj_ctx *ctx, LLVMModuleRef mod, LLVMTargetMachineRef tm,
                      aj_emit what, char **code, size_t *size)
{
    LLVMMemoryBufferRef buf = NULL;
    char *err = NULL;
    switch (what) {
    case AJ_EMIT_PTX:
        if (LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMAssemblyFile, &err, &buf)) {
            aj_status st = aj_fail(ctx, AJ_ERR_CODEGEN, "PTX emission failed: %s", err);
            LLVMDisposeMessage(err);
            return st;
        }
        break;
    case AJ_EMIT_BITCODE:
        buf = LLVMWriteBitcodeToMemoryBuffer(mod);
        break;
    case AJ_EMIT_LLVM_IR: {
        char *text = LLVMPrintModuleToString(mod);
        *size = strlen(text);
        *code = strdup(text);
        LLVMDisposeMessage(text);
        return *code ? AJ_OK : aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    }
    default:
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "options->emit: unknown value %d", (int)what);
    }
    return take_buffer(ctx, buf, code, size);
}

/* Host object code (ELF on Linux) for the JIT and the disk cache. */
static aj_status emit_object(aj_ctx *ctx, LLVMModuleRef mod, LLVMTargetMachineRef tm,
                             char **code, size_t *size)
{
    LLVMMemoryBufferRef buf = NULL;
    char *err = NULL;
    if (LLVMTargetMachineEmitToMemoryBuffer(tm, mod, LLVMObjectFile, &err, &buf)) {
        aj_status st = aj_fail(ctx, AJ_ERR_CODEGEN, "object code emission failed: %s", err);
        LLVMDisposeMessage(err);
        return st;
    }
    return take_buffer(ctx, buf, code, size);
}

static aj_status prepare_target(aj_ctx *ctx, const aj_compile_options *options, aj_kb *kb,
                                LLVMTargetMachineRef *tm, LLVMTargetDataRef *layout);
static aj_status build_stages(aj_ctx *ctx, aj_kb *kb, const aj_op *op, aj_build_fn build,
                              void *user);
static aj_status emit_kernel(aj_ctx *ctx, const aj_compile_options *options, aj_kb *kb,
                             LLVMTargetMachineRef tm, aj_kernel **out);

aj_status aj_codegen_run(aj_ctx *ctx, const aj_op *op,
                         const aj_compile_options *options,
                         const char *entry_name, aj_build_fn build,
                         void *user, aj_kernel **out)
{
    aj_status st = AJ_OK;
    const aj_target_desc *desc = aj_target_desc_of(options->target);
    LLVMContextRef llctx = LLVMContextCreate();
    LLVMTargetMachineRef tm = NULL;
    LLVMTargetDataRef layout_data = NULL;
    aj_kb kb;
    aj_kernel *kernel = NULL;
    aj_compile_stats stats;
    double t0 = now_ms(), t1;
    memset(&stats, 0, sizeof stats);
    aj_kb_init(&kb, ctx, llctx, options->target, entry_name);
    kb.entry_name = entry_name;
    AJ_TRY(prepare_target(ctx, options, &kb, &tm, &layout_data));

    /* stage: build */
    AJ_TRY(build_stages(ctx, &kb, op, build, user));
    t1 = now_ms();
    stats.build_ms = t1 - t0;
    dump_stage(ctx, options, "build", kb.mod);

    /* stage: verify */
    t0 = now_ms();
    AJ_TRY(verify_module(ctx, kb.mod, "build"));
    t1 = now_ms();
    stats.verify_ms = t1 - t0;
    dump_stage(ctx, options, "verify", kb.mod);

    /* a module whose instructions need a newer PTX ISA than its target's
     * (aj_kb.ptx_isa_min) is emitted by a machine that declares it */
    if (kb.ptx_isa_min && desc->family == AJ_FAMILY_NVPTX) {
        LLVMDisposeTargetMachine(tm);
        tm = NULL;
        AJ_TRY(aj_nvptx_target_machine_isa(ctx, options->target, options->opt_level,
                                           kb.ptx_isa_min, &tm));
    }

    /* stage: optimize */
    t0 = now_ms();
    AJ_TRY(optimize(ctx, kb.mod, tm, options->opt_level));
    if (desc->emulated)
        aj_sim_count_instructions(kb.mod);
    if (desc->block_limit)
        aj_host_split_blocks(kb.mod, desc->block_limit);
    t1 = now_ms();
    stats.optimize_ms = t1 - t0;
    stats.ir_instructions = count_instructions(kb.mod);
    dump_stage(ctx, options, "optimize", kb.mod);

    /* stage: emit */
    t0 = now_ms();
    AJ_TRY(emit_kernel(ctx, options, &kb, tm, &kernel));
    stats.emit_ms = now_ms() - t0;
    kernel->stats = stats;
    *out = kernel;
done:
    aj_kb_dispose(&kb);
    if (layout_data)
        LLVMDisposeTargetData(layout_data);
    if (tm)
        LLVMDisposeTargetMachine(tm);
    LLVMContextDispose(llctx);
    return st;
}

/* Checks that the target can take the options, then makes its target
 * machine and gives the module its triple and data layout. */
static aj_status prepare_target(aj_ctx *ctx, const aj_compile_options *options, aj_kb *kb,
                                LLVMTargetMachineRef *tm, LLVMTargetDataRef *layout)
{
    const aj_target_desc *desc = aj_target_desc_of(options->target);
    aj_status st = aj_codegen_target_supported(ctx, options->target);
    if (st != AJ_OK)
        return st;
    if (desc->family == AJ_FAMILY_HOST && options->emit == AJ_EMIT_PTX)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "emit ptx needs a GPU target; %s kernels emit LLVM IR or bitcode",
                       aj_target_name(options->target));
    if ((st = aj_intrinsics_check(ctx)) != AJ_OK ||
        (st = desc->machine(ctx, options->target,
                            desc->machine_opt_follows_op ? options->opt_level : 0, tm)) != AJ_OK)
        return st;
    char *triple = LLVMGetTargetMachineTriple(*tm);
    LLVMSetTarget(kb->mod, triple);
    LLVMDisposeMessage(triple);
    *layout = LLVMCreateTargetDataLayout(*tm);
    LLVMSetModuleDataLayout(kb->mod, *layout);
    return AJ_OK;
}

/* The template writes its stages; each then gets what its target's
 * kernels carry (host: an entry wrapper; GPU: the kernel annotations),
 * and the kernel's row alignments at least their element types' default. */
static aj_status build_stages(aj_ctx *ctx, aj_kb *kb, const aj_op *op, aj_build_fn build,
                              void *user)
{
    aj_status st = build(kb, op, user);
    if (st == AJ_OK && kb->st != AJ_OK)
        st = kb->st;
    if (st == AJ_OK && (kb->num_stages == 0 || kb->fn))
        st = aj_kb_fail(kb, AJ_ERR_INTERNAL, "the template left a kernel unfinished");
    if (st != AJ_OK) {
        if (kb->st != AJ_OK)
            aj_fail(ctx, kb->st, "%s", kb->msg);
        return st;
    }
    for (int i = 0; i < kb->num_stages; i++) {
        const aj_kb_stage *stage = &kb->stages[i];
        if (kb->desc->family == AJ_FAMILY_HOST)
            aj_host_add_entry(kb, stage);
        else
            aj_nvptx_annotate_kernel(kb->mod, stage->fn, stage->block_threads,
                                     stage->min_ctas_per_sm);
    }
    const aj_dtype kv = aj_op_kv_dtype(op);
    const int32_t defaults[AJ_ROW_TENSORS] = {
        [AJ_ROW_Q] = aj_row_align_default(aj_op_q_dtype(op)),
        [AJ_ROW_K] = aj_row_align_default(kv), [AJ_ROW_V] = aj_row_align_default(kv),
        [AJ_ROW_K_CACHE] = aj_dtype_size(kv), [AJ_ROW_V_CACHE] = aj_dtype_size(kv)};
    for (int t = 0; t < AJ_ROW_TENSORS; t++)
        aj_kb_row_align(kb, (aj_row_tensor)t, defaults[t]);
    return AJ_OK;
}

/* The kernel from the module (sim, cpu: the IR first, then host object
 * code, which the JIT loads and the disk cache keeps). */
static aj_status emit_kernel(aj_ctx *ctx, const aj_compile_options *options, aj_kb *kb,
                             LLVMTargetMachineRef tm, aj_kernel **out)
{
    const int host = kb->desc->family == AJ_FAMILY_HOST;   /* JIT-loaded on this machine */
    aj_status st = AJ_OK;
    aj_kernel *kernel = NULL;
    char *code = NULL, *object = NULL;
    size_t code_size = 0, object_size = 0;
    AJ_TRY(emit(ctx, kb->mod, tm, options->emit, &code, &code_size));
    if (host)
        AJ_TRY(emit_object(ctx, kb->mod, tm, &object, &object_size));
    AJ_TRY(aj_kernel_new(ctx, kb->stages, kb->num_stages, options->target, options->emit,
                         code, code_size, &kernel));
    memcpy(kernel->row_align, kb->row_align, sizeof kernel->row_align);
    if (host) {
        kernel->object = object;
        kernel->object_size = object_size;
        object = NULL;
        AJ_TRY(aj_host_jit(ctx, kernel));
    }
    *out = kernel;
    kernel = NULL;
done:
    aj_kernel_destroy(kernel);
    free(code);
    free(object);
    return st;
}
