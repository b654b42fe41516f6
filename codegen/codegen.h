/*
 * codegen.h -- the compile pipeline and the compiled-kernel object.
 *
 *   op ──► build (template writes the kernel with aj_kb) ──► verify
 *      ──► optimize (default<On> on the target machine) ──► verify
 *      ──► emit (PTX | LLVM IR text | bitcode) ──► aj_kernel
 *
 * aj_codegen_run() calls the stages in this order; with the options'
 * dump_after set to a stage name, the module after that stage goes to the
 * log callback at AJ_LOG_DEBUG.  Nothing here knows which template is used:
 * the caller passes the build step as a function.
 */
#ifndef AJ_CODEGEN_CODEGEN_H
#define AJ_CODEGEN_CODEGEN_H

#include <stdatomic.h>

#include <llvm-c/Orc.h>
#include <llvm-c/TargetMachine.h>

#include "codegen/kbuilder.h"
#include "ir/op.h"

/* What a template tells the pipeline besides the module it built. */
typedef struct aj_kernel_layout {
    aj_grid_dim grid[3];
    aj_schedule schedule;    /* resolved, no zero fields */
} aj_kernel_layout;

/* The build stage: writes one kernel into kb and fills the layout. */
typedef aj_status (*aj_build_fn)(aj_kb *kb, const aj_op *op, void *user,
                                 aj_kernel_layout *layout);

/* A host function the sim target's JIT binds a symbol to. */
typedef struct aj_host_symbol {
    const char *name;
    void *address;
} aj_host_symbol;

/* The sim entry point: thread state, then kernelParams-style arguments. */
typedef void (*aj_host_entry_fn)(void *thread, void **args);

/* Runs the pipeline.  host_symbols (sim only) are the emulator's functions
 * the kernel may call. */
aj_status aj_codegen_run(aj_ctx *ctx, const aj_op *op,
                         const aj_compile_options *options,
                         const char *entry_name, aj_build_fn build,
                         void *user, const aj_host_symbol *host_symbols,
                         size_t num_host_symbols, aj_kernel **out);

/* AJ_OK if codegen can lower for the target, else AJ_ERR_UNSUPPORTED. */
aj_status aj_codegen_target_supported(aj_ctx *ctx, aj_target target);

/* GPU targets */
bool aj_target_is_nvptx(aj_target target);
/* Largest dynamic shared memory a CTA may use on the target (bytes). */
int32_t aj_target_smem_limit(aj_target target);
aj_status aj_nvptx_target_machine(aj_ctx *ctx, aj_target target,
                                  int opt_level, LLVMTargetMachineRef *out);
/* Marks fn as a kernel with `threads` threads per CTA, designed to run
 * at least `min_ctas_per_sm` CTAs per SM. */
void aj_nvptx_annotate_kernel(LLVMModuleRef mod, LLVMValueRef fn,
                              int32_t threads, int32_t min_ctas_per_sm);

/* sim target (sim.c) */
aj_status aj_sim_target_machine(aj_ctx *ctx, int opt_level, LLVMTargetMachineRef *out);
void aj_sim_add_entry(aj_kb *kb, const char *entry_name);
void aj_sim_count_instructions(LLVMModuleRef mod);
aj_status aj_sim_jit(aj_ctx *ctx, LLVMOrcThreadSafeContextRef tsctx, LLVMModuleRef mod,
                     const char *entry_name, const aj_host_symbol *symbols,
                     size_t nsymbols, aj_kernel *kernel);
void aj_sim_jit_dispose(void *jit);

/* the kernel object (kernel.c); shared by reference count with the cache */
struct aj_kernel {
    atomic_int refs;
    aj_target target;
    aj_emit emit;
    char *entry;
    char *code;              /* NUL-terminated even for bitcode */
    size_t code_size;
    uint64_t code_hash;      /* XXH3-64 of code: tells loaded modules apart */
    aj_launch_info launch;
    aj_compile_stats stats;
    aj_param_info *params;
    char (*param_names)[32];
    aj_op_info op;               /* what the kernel computes, for launches */
    void *jit;                   /* sim: the LLJIT that owns the code */
    aj_host_entry_fn host_entry; /* sim: <entry>.entry */
};

/* Makes a kernel that owns a copy of code and of kb's parameter list. */
aj_status aj_kernel_new(aj_ctx *ctx, const aj_kb *kb, const char *entry,
                        aj_target target, aj_emit emit, const void *code,
                        size_t code_size, const aj_kernel_layout *layout,
                        aj_kernel **out);

/* Adds a reference (released by aj_kernel_destroy). */
aj_kernel *aj_kernel_retain(aj_kernel *kernel);

/* A kernel's code and launch contract as bytes, for the disk cache; sim
 * kernels (host code in a JIT) have no byte form.  *out is malloc'd. */
aj_status aj_kernel_serialize(aj_ctx *ctx, const aj_kernel *kernel, uint8_t **out,
                              size_t *size);
/* The inverse; AJ_ERR_IO if the bytes are not a kernel of this build. */
aj_status aj_kernel_deserialize(aj_ctx *ctx, const uint8_t *data, size_t size,
                                aj_kernel **out);

#endif /* AJ_CODEGEN_CODEGEN_H */
