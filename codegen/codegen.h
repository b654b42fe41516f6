/*
 * codegen.h -- the compile pipeline and the compiled-kernel object.
 *
 *   op ──► build (template writes its kernels with aj_kb) ──► verify
 *      ──► optimize (default<On> on the target machine) ──► verify
 *      ──► emit (PTX | LLVM IR text | bitcode) ──► aj_kernel
 *          (sim, cpu: also host object code, loaded into an LLJIT)
 *
 * aj_codegen_run() calls the stages in this order; with the options'
 * dump_after set to a stage name, the module after that stage goes to the
 * log callback at AJ_LOG_DEBUG.  Nothing here knows which template is used:
 * the caller passes the build step as a function.  A template may write
 * several kernels ("stages", launched in order) into the one module; each
 * gets its annotations (nvptx) or host entry (sim) and its own launch
 * contract in the aj_kernel.
 */
#ifndef AJ_CODEGEN_CODEGEN_H
#define AJ_CODEGEN_CODEGEN_H

#include <stdatomic.h>

#include <llvm-c/Orc.h>
#include <llvm-c/TargetMachine.h>

#include "codegen/kbuilder.h"
#include "codegen/target.h"
#include "ir/op.h"

/* The build stage: writes the kernels (one or more stages, each closed
 * by aj_kb_finish with its layout) into kb. */
typedef aj_status (*aj_build_fn)(aj_kb *kb, const aj_op *op, void *user);

/* The sim entry point: thread state, then kernelParams-style arguments. */
typedef void (*aj_host_entry_fn)(void *thread, void **args);

/* Runs the pipeline.  host_symbols (sim only) are the emulator's functions
 * the kernel may call. */
aj_status aj_codegen_run(aj_ctx *ctx, const aj_op *op,
                         const aj_compile_options *options,
                         const char *entry_name, aj_build_fn build,
                         void *user, aj_kernel **out);

/* AJ_OK if codegen can lower for the target, else AJ_ERR_UNSUPPORTED. */
aj_status aj_codegen_target_supported(aj_ctx *ctx, aj_target target);

/* GPU targets (nvptx.c).  Marks fn as a kernel with `threads` threads per CTA, designed to run
 * at least `min_ctas_per_sm` CTAs per SM. */
/* Marks the kernel's parameters `params` (1-based, n of them; by-value
 * blobs) grid-constant: their address is the parameter space's. */
void aj_nvptx_annotate_grid_constant(LLVMModuleRef mod, LLVMValueRef fn, const int *params,
                                     int n);
void aj_nvptx_annotate_kernel(LLVMModuleRef mod, LLVMValueRef fn,
                              int32_t threads, int32_t min_ctas_per_sm);

/* Host code (host.c), the sim and cpu targets'.  Adds <stage entry>.entry,
 * the emulator's and the cpu pool's way into a stage's kernel. */
void aj_host_add_entry(aj_kb *kb, const aj_kb_stage *stage);
/* Emulated targets: every block adds its instruction count to the thread's
 * counter. */
void aj_sim_count_instructions(LLVMModuleRef mod);
/* Cuts every block longer than `limit` instructions into a chain of
 * blocks no longer (host code made without machine-level optimisation:
 * see aj_host_target_machine). */
void aj_host_split_blocks(LLVMModuleRef mod, int limit);
/* Loads kernel->object into a new LLJIT (kernel->jit), binding `symbols`,
 * and fills each stage's host_entry (sim and cpu). */
aj_status aj_host_jit(aj_ctx *ctx, aj_kernel *kernel);
void aj_host_jit_dispose(void *jit);

/* cpu target (cpu.c).  Its kernels are host functions built like sim
 * kernels (the same <entry>.entry(ptr item, ptr args) wrapper and JIT),
 * with the work item in place of the thread state. */
/* The CPU host code is compiled for: LLVM's name of the host CPU and its
 * feature string ("+avx2,-avx512f,...") less what AJ_CPU_ISA (native |
 * avx512 | avx2) masks; AJ_ERR_INVALID_ARG for another AJ_CPU_ISA.  *name
 * is freed with LLVMDisposeMessage, *features with free. */
aj_status aj_host_cpu(aj_ctx *ctx, char **name, char **features);
/* LLVM's name of the host CPU ("znver4"; "" where it has none), read once
 * per process as the features are */
const char *aj_host_cpu_name(void);
/* "cpu <name> <xxh3 of the features>": what cached host code depends on */
void aj_host_cpu_id(char *out, size_t cap);
/* Whether the features of aj_host_cpu enable f ("avx512bf16") */
int aj_cpu_has_feature(const char *f);
/* floats per SIMD register of this host: 16 with AVX-512 (or under the AMX
 * or vdpbf16ps stand-in on an AVX host), 8 with AVX, else 4 */
int aj_cpu_vector_width(void);
/* How the cpu kernels multiply bf16 in pairs (docs/cpu.md "Host features"):
 * not at all (widened to f32), by vdpbf16ps where the features of
 * aj_host_cpu have avx512bf16, or by its stand-in under AJ_CPU_BF16=standin
 * (two f32 FMAs a pair, on any AVX host, 16 floats wide), so that the pairs
 * paths run and are tested on every host */
typedef enum aj_bf16_pairs {
    AJ_BF16_PAIRS_OFF,
    AJ_BF16_PAIRS_NATIVE,
    AJ_BF16_PAIRS_STANDIN
} aj_bf16_pairs;
aj_bf16_pairs aj_cpu_bf16_pairs(void);

/* One kernel of a compiled module, launched in stage order. */
typedef struct aj_kernel_stage {
    char entry[128];
    aj_launch_info launch;
    int32_t pack_rows;           /* aj_kernel_layout's */
    int32_t plan;                /* aj_kernel_layout's (an aj_stage_plan) */
    int64_t stack_bytes;         /* aj_kb_stage's: a host work item's stack buffers */
    aj_param_info params[AJ_KB_MAX_PARAMS];
    char param_names[AJ_KB_MAX_PARAMS][32];
    /* each parameter's table row, which the launcher binds it by
     * (AJ_KB_NO_ID: a side tensor's, bound by name) */
    int32_t param_ids[AJ_KB_MAX_PARAMS];
    aj_host_entry_fn host_entry; /* sim, cpu: <entry>.entry */
} aj_kernel_stage;

/* What the runtime derives once from a kernel's op to launch it (its
 * launch plan, runtime/compile.c), hung on the kernel: codegen knows only
 * how to free it. */
typedef struct aj_kernel_plan {
    void (*destroy)(struct aj_kernel_plan *plan);
} aj_kernel_plan;

/* Something a runtime layer holds for a kernel and must let go of when
 * the kernel is freed (a GPU device's module of it, runtime/cuda/driver.c):
 * release runs once, from the last aj_kernel_destroy, before the kernel's
 * memory goes.  Hooks are pushed (aj_kernel_on_release) while the kernel
 * is referenced, so none is added while they run. */
typedef struct aj_kernel_hook {
    void (*release)(void *owner, const aj_kernel *kernel);
    void *owner;
    struct aj_kernel_hook *next;
} aj_kernel_hook;

/* the kernel object (kernel.c); shared by reference count with the cache */
struct aj_kernel {
    atomic_int refs;
    aj_target target;
    aj_emit emit;
    char *code;              /* NUL-terminated even for bitcode */
    size_t code_size;
    uint64_t code_hash;      /* XXH3-64 of code: tells loaded modules apart */
    int num_stages;          /* >= 1 */
    aj_kernel_stage *stages;
    aj_compile_stats stats;
    aj_op_info op;               /* what the kernel computes, for launches */
    int32_t sinks;               /* the op's sinks tensor, an index in op.tensors; -1: none */
    uint32_t tensor_grad;        /* bit t: op.tensors[t] is grad, bit num_tensors alibi's
                                  * slopes (a backward's: aj_op_grad_bits) */
    uint32_t kv_shared;          /* 1: layout = paged reading V from k_cache (kv_shared) */
    aj_dtype q_dtype;            /* f8 queries' element type (q_dtype); else unread:
                                  * aj_kernel_q_dtype */
    /* the bytes each row of q, k and v must start on: the width of the
     * template's loads (aj_kb_row_align) */
    int32_t row_align[AJ_ROW_TENSORS];
    char *object;                /* sim, cpu: the host object code (ELF) */
    size_t object_size;
    void *jit;                   /* sim, cpu: the LLJIT that runs the object */
    /* the op it was compiled from (NULL: loaded from bytes), owned: a
     * launch that builds a block mask reads its score programs; set once
     * (runtime/compile.c), shared kernels race to set the same op */
    _Atomic(aj_op *) source;
    /* the first block-mask builder compiled for it (runtime/compile.c,
     * aj_compile_block_mask), a reference, and its mask's hash (set
     * first, once) */
    _Atomic(aj_kernel *) mask_builder;
    _Atomic(uint64_t) mask_builder_hash;
    /* a GPU kernel's sim twin, which emulated launches run again over the
     * same buffers (runtime/compile.c, aj_compile_twin), a reference, set
     * once */
    _Atomic(aj_kernel *) twin;
    /* the launch plan, set once after source (runtime/compile.c) */
    _Atomic(aj_kernel_plan *) plan;
    /* run and freed by the last aj_kernel_destroy (aj_kernel_on_release) */
    _Atomic(aj_kernel_hook *) hooks;
};

/* The element type of the kernel's queries: its op's dtype, or f8. */
static inline aj_dtype aj_kernel_q_dtype(const aj_kernel *k)
{
    return k->q_dtype >= AJ_DTYPE_F8E4M3 ? k->q_dtype : k->op.dtype;
}

/* Makes a kernel that owns a copy of code and of the stages' launch
 * contracts. */
aj_status aj_kernel_new(aj_ctx *ctx, const aj_kb_stage *stages, int num_stages,
                        aj_target target, aj_emit emit, const void *code,
                        size_t code_size, aj_kernel **out);

/* Adds a reference (released by aj_kernel_destroy). */
aj_kernel *aj_kernel_retain(aj_kernel *kernel);

/* Calls release(owner, kernel) when the kernel is freed; the caller holds
 * a reference.  Thread-safe (hooks are pushed atomically). */
aj_status aj_kernel_on_release(aj_ctx *ctx, aj_kernel *kernel,
                               void (*release)(void *owner, const aj_kernel *kernel),
                               void *owner);

/* A kernel's code (and a host kernel's object code) and launch contract as
 * bytes, for the disk cache.  *out is malloc'd. */
aj_status aj_kernel_serialize(aj_ctx *ctx, const aj_kernel *kernel, uint8_t **out,
                              size_t *size);
/* The inverse, cpu kernels loaded into their JIT; AJ_ERR_IO if the bytes
 * are not a kernel of this build, AJ_ERR_CODEGEN if the object does not
 * link. */
aj_status aj_kernel_deserialize(aj_ctx *ctx, const uint8_t *data, size_t size,
                                aj_kernel **out);

#endif /* AJ_CODEGEN_CODEGEN_H */
