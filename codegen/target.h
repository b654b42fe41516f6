/*
 * target.h -- the target table: one row per compile target saying how its
 * kernels are built, loaded and cached (codegen/target.c).
 *
 * Code that differs by target reads a field of its row instead of
 * comparing target values, so a new target (a Hopper-only ISA, another
 * GPU family) is a row here plus its templates.  The runtime's device
 * table (runtime/device.c) says which target each device runs.
 */
#ifndef AJ_CODEGEN_TARGET_H
#define AJ_CODEGEN_TARGET_H

#include <stdbool.h>
#include <stddef.h>

#include <llvm-c/TargetMachine.h>

#include "attnjit/attnjit.h"

/* What a compile (or the driver's linker) makes: the kinds of entry the
 * kernel cache keeps, each a row of runtime/cache.c's entry_kinds. */
typedef enum aj_cache_kind {
    AJ_CACHE_NONE = -1,   /* a target no row serves: memory only */
    AJ_CACHE_PTX = 0,
    AJ_CACHE_CPU_OBJECT,
    AJ_CACHE_SIM_OBJECT,
    AJ_CACHE_CUBIN,
    AJ_CACHE_KIND_COUNT
} aj_cache_kind;

/* How a target's code is made and loaded. */
typedef enum aj_target_family {
    AJ_FAMILY_NONE,    /* no code generation (AJ_TARGET_ANY) */
    AJ_FAMILY_NVPTX,   /* PTX from LLVM's NVPTX backend, loaded by the CUDA driver */
    AJ_FAMILY_HOST,    /* host object code, JIT-loaded into this process */
} aj_target_family;

/* The argument a kernel takes before its parameters. */
typedef enum aj_hidden_arg {
    AJ_HIDDEN_NONE,         /* GPU kernels: their parameters only */
    AJ_HIDDEN_SIM_THREAD,   /* the emulated thread's state (runtime/sim) */
    AJ_HIDDEN_WORK_ITEM,    /* the cpu work item: ptr to i32 x, y, z */
} aj_hidden_arg;

/* One host function JIT-loaded code may call, bound by name. */
typedef struct aj_host_symbol {
    const char *name;
    void *address;
} aj_host_symbol;

typedef aj_status (*aj_machine_fn)(aj_ctx *ctx, aj_target target, int opt_level,
                                   LLVMTargetMachineRef *out);

/* mma.sync with 8-bit float inputs (m16n8k32 e4m3 / e5m2) on a target. */
typedef enum aj_f8_mma {
    AJ_F8_MMA_NONE,      /* no FP8 tensor cores: the instruction is refused */
    AJ_F8_MMA_LOWERED,   /* accepted, but ptxas lowers it to f8-to-f16 unpacks and f16
                          * HMMA (Hopper, whose FP8 tensor cores are wgmma's) */
    AJ_F8_MMA_NATIVE,    /* at the FP8 rate (Ada's QMMA); sim emulates it */
} aj_f8_mma;

typedef struct aj_target_desc {
    aj_target_family family;
    aj_hidden_arg hidden;
    /* the kernels are CTAs of SIMT threads (the GPU templates); false:
     * cpu work items (the cpu templates) */
    bool simt;
    /* run by the SIMT emulator: every access checked, shared memory and
     * instruction counts through it */
    bool emulated;
    int32_t smem_limit;        /* bytes of dynamic shared memory a CTA may use */
    aj_f8_mma f8_mma;          /* mma.sync m16n8k32 e4m3 / e5m2 */
    /* Hopper's asynchronous machinery: wgmma, TMA, mbarriers (sm_90a;
     * sim emulates it) */
    bool wgmma;
    const char *ptx_isa;       /* nvptx: the PTX ISA version LLVM 19 emits; else NULL */
    aj_machine_fn machine;     /* the LLVM target machine; NULL for AJ_FAMILY_NONE */
    /* machine-level code generation at the op's opt_level; false: none
     * (sim: see codegen/host.c) */
    bool machine_opt_follows_op;
    /* host code at machine level none: its blocks cut to at most this many
     * instructions before instruction selection (0: left whole; codegen/
     * host.c, aj_host_split_blocks) */
    int32_t block_limit;
    aj_cache_kind cache_kind;  /* what its compiles make */
    /* host family: the functions its code may call (NULL: none), bound by
     * name whenever its object code is loaded (codegen/host.c) */
    const aj_host_symbol *(*host_symbols)(size_t *count);
} aj_target_desc;

/* The row of `target`; a value outside the enum gets AJ_TARGET_ANY's. */
const aj_target_desc *aj_target_desc_of(aj_target target);

/* GPU targets: whether the row is NVPTX's. */
bool aj_target_is_nvptx(aj_target target);
/* Largest dynamic shared memory a CTA may use on the target (bytes). */
int32_t aj_target_smem_limit(aj_target target);

/* The machines the rows name (codegen/nvptx.c, codegen/host.c). */
/* The NVPTX machine for a module that needs PTX ISA `ptx_isa` (10 x major
 * + minor; 0: the target's own; aj_kb.ptx_isa_min). */
aj_status aj_nvptx_target_machine_isa(aj_ctx *ctx, aj_target target, int opt_level,
                                      int ptx_isa, LLVMTargetMachineRef *out);
aj_status aj_nvptx_target_machine(aj_ctx *ctx, aj_target target, int opt_level,
                                  LLVMTargetMachineRef *out);
aj_status aj_host_target_machine(aj_ctx *ctx, aj_target target, int opt_level,
                                 LLVMTargetMachineRef *out);
/* The host functions the rows bind: the C library's for cpu kernels
 * (codegen/cpu.c); the emulator's for sim kernels (runtime/sim/emulator.c,
 * the sim target's side of its ABI). */
const aj_host_symbol *aj_cpu_symbols(size_t *count);
const aj_host_symbol *aj_sim_symbols(size_t *count);

#endif /* AJ_CODEGEN_TARGET_H */
