/*
 * host.c -- host code: the target machine, entry wrappers and JIT of the
 * targets whose kernels run in this process (the target table's
 * AJ_FAMILY_HOST rows: sim, the GPU kernels' IR lowered for the host and
 * run by the SIMT emulator in runtime/sim; cpu, the cpu templates' work
 * items run by the cpu device's pool).
 *
 * What differs from nvptx is small and lives here and in the intrinsic
 * table's sim column:
 *
 *   kernel  void K(ptr hidden, params...)        (built by the template;
 *           hidden: the sim thread's state or the cpu work item)
 *   entry   void K.entry(ptr hidden, ptr args)   (added here: args[i]
 *           points to parameter i, as cuLaunchKernel's kernelParams do)
 *   count   (emulated targets) every basic block adds its instruction
 *           count to the thread's first field (uint64_t), after
 *           optimisation, so the emulator can report thread-instructions
 *   jit     the module becomes host object code, loaded into an LLJIT with
 *           the row's host symbols (the cpu's objects also go to the disk
 *           cache)
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/LLJIT.h>
#include <llvm-c/Orc.h>
#include <llvm-c/Target.h>

#include "codegen/codegen.h"

static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static int host_ready;

static void host_init(void)
{
    host_ready = !LLVMInitializeNativeTarget() && !LLVMInitializeNativeAsmPrinter();
}

/* LLVM's host target, registered once per process (the target machine and
 * the JIT both need it) */
static aj_status host_target_ready(aj_ctx *ctx)
{
    pthread_once(&host_once, host_init);
    return host_ready ? AJ_OK : aj_fail(ctx, AJ_ERR_CODEGEN, "the host target is not "
                                        "available in this LLVM");
}

/*
 * A host target machine at machine-level `opt_level`, which the pipeline
 * takes from the target's row (machine_opt_follows_op).  Why the rows
 * differ: the host code of sim kernels is generated without machine-level
 * optimisation (the IR pipeline still runs at the op's opt_level, the same
 * IR the GPU targets get).  The emulator's thread switches and checks
 * dominate a launch, so host code at -O2 runs it only 1.09-1.28x faster
 * (bench_sim), while its instruction scheduling is quadratic in the size of
 * the templates' unrolled blocks: -O2 made sim compiles 2.5-3x slower (a
 * paged forward 155-195 ms against 55-63) and the sim tests about 2x.
 * Even at none the instruction selector's scheduler is quadratic in a
 * block's length (its topological order, kept for physical-register
 * dependences), so sim kernels reach it in blocks of at most the row's
 * block_limit instructions (aj_host_split_blocks): a batch of eight random
 * score programs on the wgmma template compiled in 16 s whole, 0.45 s cut
 * at 256 (test_score sim wgmma random 64: 126 s, 3.7 s).
 * The cpu target's code is the kernel itself: it keeps the op's opt_level
 * (at none, the paged decode ran at half its speed, bench_decode).
 */
aj_status aj_host_target_machine(aj_ctx *ctx, aj_target target, int opt_level,
                                 LLVMTargetMachineRef *out)
{
    if (host_target_ready(ctx) != AJ_OK)
        return AJ_ERR_CODEGEN;
    char *cpu = NULL, *features = NULL;
    aj_status st = aj_host_cpu(ctx, &cpu, &features);
    if (st != AJ_OK)
        return st;
    char *triple = LLVMGetDefaultTargetTriple();
    LLVMTargetRef t = NULL;
    char *err = NULL;
    if (LLVMGetTargetFromTriple(triple, &t, &err)) {
        st = aj_fail(ctx, AJ_ERR_CODEGEN, "host target %s unavailable: %s", triple, err);
        LLVMDisposeMessage(err);
    } else {
        static const LLVMCodeGenOptLevel levels[4] = {
            LLVMCodeGenLevelNone, LLVMCodeGenLevelLess, LLVMCodeGenLevelDefault,
            LLVMCodeGenLevelAggressive};
        *out = LLVMCreateTargetMachine(t, triple, cpu, features, levels[opt_level],
                                       LLVMRelocPIC, LLVMCodeModelJITDefault);
        if (!*out)
            st = aj_fail(ctx, AJ_ERR_CODEGEN, "cannot create a host target machine");
    }
    LLVMDisposeMessage(triple);
    LLVMDisposeMessage(cpu);
    free(features);
    return st;
}

/* Adds `void <entry>.entry(ptr thread, ptr args)` that unpacks args. */
void aj_host_add_entry(aj_kb *kb, const aj_kb_stage *stage)
{
    LLVMTypeRef params[2] = {kb->t_ptr, kb->t_ptr};
    LLVMTypeRef fty = LLVMFunctionType(kb->t_void, params, 2, 0);
    char name[160];
    snprintf(name, sizeof name, "%s.entry", stage->entry);
    LLVMValueRef fn = LLVMAddFunction(kb->mod, name, fty);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(kb->llctx);
    LLVMPositionBuilderAtEnd(b, LLVMAppendBasicBlockInContext(kb->llctx, fn, "entry"));
    LLVMValueRef args[AJ_KB_MAX_PARAMS + 1];
    args[0] = LLVMGetParam(fn, 0);
    LLVMValueRef argv = LLVMGetParam(fn, 1);
    LLVMTypeRef kty = LLVMGlobalGetValueType(stage->fn);
    LLVMTypeRef ktypes[AJ_KB_MAX_PARAMS + 1];
    LLVMGetParamTypes(kty, ktypes);
    for (int i = 0; i < stage->num_params; i++) {
        LLVMValueRef idx = aj_kb_i64(kb, i);
        LLVMValueRef slot = LLVMBuildGEP2(b, kb->t_ptr, argv, &idx, 1, "");
        LLVMValueRef at = LLVMBuildLoad2(b, kb->t_ptr, slot, "");
        /* a by-value blob: its address (kbuilder.c, param_llvm_type) */
        if (stage->params[i].type == AJ_PARAM_BYVAL128)
            args[i + 1] = LLVMBuildAddrSpaceCast(b, at, ktypes[i + 1], stage->params[i].name);
        else
            args[i + 1] = LLVMBuildLoad2(b, ktypes[i + 1], at, stage->params[i].name);
    }
    LLVMBuildCall2(b, kty, stage->fn, args, (unsigned)stage->num_params + 1, "");
    LLVMBuildRetVoid(b);
    LLVMDisposeBuilder(b);
}

/* Each block of each defined function adds its size to *(u64 *)thread. */
void aj_sim_count_instructions(LLVMModuleRef mod)
{
    LLVMContextRef c = LLVMGetModuleContext(mod);
    LLVMTypeRef i64 = LLVMInt64TypeInContext(c);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(c);
    for (LLVMValueRef f = LLVMGetFirstFunction(mod); f; f = LLVMGetNextFunction(f)) {
        if (LLVMIsDeclaration(f) || LLVMCountParams(f) == 0)
            continue;
        LLVMValueRef thread = LLVMGetParam(f, 0);
        for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f); bb; bb = LLVMGetNextBasicBlock(bb)) {
            int64_t n = 0;
            LLVMValueRef first_real = NULL;
            for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i; i = LLVMGetNextInstruction(i)) {
                if (!first_real && !LLVMIsAPHINode(i))
                    first_real = i;
                n++;
            }
            if (!first_real)
                continue;
            LLVMPositionBuilderBefore(b, first_real);
            LLVMValueRef old = LLVMBuildLoad2(b, i64, thread, "");
            LLVMBuildStore(b, LLVMBuildAdd(b, old, LLVMConstInt(i64, (unsigned long long)n, 0), ""),
                           thread);
        }
    }
    LLVMDisposeBuilder(b);
}

/* Every terminator of fn that branches to `to` branches to `via` instead. */
static void retarget(LLVMValueRef fn, LLVMBasicBlockRef to, LLVMBasicBlockRef via)
{
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb; bb = LLVMGetNextBasicBlock(bb)) {
        LLVMValueRef term = LLVMGetBasicBlockTerminator(bb);
        for (unsigned s = 0, n = term ? LLVMGetNumSuccessors(term) : 0; s < n; s++)
            if (LLVMGetSuccessor(term, s) == to)
                LLVMSetSuccessor(term, s, via);
    }
}

/* Cuts bb's instructions into runs of at most `limit` (its phis stay
 * together in the first), each a new block that falls through to the
 * next: the predecessors enter the first run, which takes the phis, and
 * the last keeps the terminator, so no phi anywhere changes. */
static void split_block(LLVMContextRef c, LLVMBuilderRef b, LLVMValueRef fn,
                        LLVMBasicBlockRef bb, int limit)
{
    int n = 0, phis = 0;
    for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i; i = LLVMGetNextInstruction(i)) {
        n++;
        phis += LLVMIsAPHINode(i) != NULL;
    }
    LLVMValueRef last_branch = NULL;   /* the previous run's, to bb */
    while (n - 1 > limit) {   /* the terminator stays */
        const int take = phis > limit ? phis : limit;
        phis = 0;
        LLVMBasicBlockRef run = LLVMInsertBasicBlockInContext(c, bb, "");
        if (last_branch)
            LLVMSetSuccessor(last_branch, 0, run);
        else
            retarget(fn, bb, run);   /* the first run: bb's predecessors enter it */
        LLVMPositionBuilderAtEnd(b, run);
        for (int k = 0; k < take; k++) {
            LLVMValueRef i = LLVMGetFirstInstruction(bb);
            LLVMInstructionRemoveFromParent(i);
            LLVMInsertIntoBuilder(b, i);
        }
        last_branch = LLVMBuildBr(b, bb);
        n -= take;
    }
}

void aj_host_split_blocks(LLVMModuleRef mod, int limit)
{
    if (limit < 1)
        return;
    LLVMContextRef c = LLVMGetModuleContext(mod);
    LLVMBuilderRef b = LLVMCreateBuilderInContext(c);
    for (LLVMValueRef f = LLVMGetFirstFunction(mod); f; f = LLVMGetNextFunction(f)) {
        LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(f);
        while (bb) {
            LLVMBasicBlockRef next = LLVMGetNextBasicBlock(bb);
            split_block(c, b, f, bb, limit);
            bb = next;
        }
    }
    LLVMDisposeBuilder(b);
}

static aj_status orc_error(aj_ctx *ctx, LLVMErrorRef err, const char *what)
{
    char *msg = LLVMGetErrorMessage(err);
    aj_status st = aj_fail(ctx, AJ_ERR_CODEGEN, "%s: %s", what, msg);
    LLVMDisposeErrorMessage(msg);
    return st;
}

/*
 * Loads the kernel's object code into a new LLJIT and resolves
 * <entry>.entry of every stage.  The host functions the code may call are
 * defined in the JIT as absolute symbols, so nothing depends on what the
 * process exports.  The object came from this process's codegen or from
 * the disk cache (whose key pins the CPU and the features it was built for).
 */
aj_status aj_host_jit(aj_ctx *ctx, aj_kernel *kernel)
{
    const aj_target_desc *desc = aj_target_desc_of(kernel->target);
    size_t nsymbols = 0;
    const aj_host_symbol *symbols = desc->host_symbols ? desc->host_symbols(&nsymbols) : NULL;
    if (!kernel->object)
        return aj_fail(ctx, AJ_ERR_INTERNAL, "a host kernel without object code");
    if (host_target_ready(ctx) != AJ_OK)
        return AJ_ERR_CODEGEN;
    LLVMOrcLLJITRef jit = NULL;
    LLVMErrorRef err = LLVMOrcCreateLLJIT(&jit, LLVMOrcCreateLLJITBuilder());
    if (err)
        return orc_error(ctx, err, "cannot create the host JIT");
    LLVMOrcCSymbolMapPairs pairs = calloc(nsymbols ? nsymbols : 1, sizeof *pairs);
    if (!pairs) {
        aj_host_jit_dispose(jit);
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (size_t i = 0; i < nsymbols; i++) {
        pairs[i].Name = LLVMOrcLLJITMangleAndIntern(jit, symbols[i].name);
        pairs[i].Sym.Address = (LLVMOrcExecutorAddress)(uintptr_t)symbols[i].address;
        pairs[i].Sym.Flags.GenericFlags = LLVMJITSymbolGenericFlagsExported |
                                          LLVMJITSymbolGenericFlagsCallable;
        pairs[i].Sym.Flags.TargetFlags = 0;
    }
    LLVMOrcJITDylibRef jd = LLVMOrcLLJITGetMainJITDylib(jit);
    err = LLVMOrcJITDylibDefine(jd, LLVMOrcAbsoluteSymbols(pairs, nsymbols));
    free(pairs);
    if (err) {
        aj_host_jit_dispose(jit);
        return orc_error(ctx, err, "cannot define the host symbols");
    }
    LLVMMemoryBufferRef obj = LLVMCreateMemoryBufferWithMemoryRangeCopy(
        kernel->object, kernel->object_size, "aj-kernel.o");
    err = LLVMOrcLLJITAddObjectFile(jit, jd, obj);
    if (err) {
        aj_host_jit_dispose(jit);
        return orc_error(ctx, err, "cannot add the kernel's object code to the JIT");
    }
    for (int s = 0; s < kernel->num_stages; s++) {
        char name[160];
        snprintf(name, sizeof name, "%s.entry", kernel->stages[s].entry);
        LLVMOrcExecutorAddress addr = 0;
        err = LLVMOrcLLJITLookup(jit, &addr, name);
        if (err) {
            aj_host_jit_dispose(jit);
            return orc_error(ctx, err, "linking the kernel's object code failed");
        }
        kernel->stages[s].host_entry = (aj_host_entry_fn)(uintptr_t)addr;
    }
    kernel->jit = jit;
    return AJ_OK;
}

void aj_host_jit_dispose(void *jit)
{
    if (jit) {
        LLVMErrorRef err = LLVMOrcDisposeLLJIT((LLVMOrcLLJITRef)jit);
        if (err)
            LLVMConsumeError(err);
    }
}
