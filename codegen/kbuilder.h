/*
 * kbuilder.h -- the kernel builder: what templates write kernels with.
 *
 * A thin layer over LLVM-C that knows about GPU kernels: parameters that
 * become the launch ABI, thread and block ids, dynamic shared memory
 * (addrspace 3), barriers, shuffles and votes, tensor-core mma, ldmatrix,
 * cp.async, conversions and fast exp2, structured loops and ifs, and
 * mutable variables.  Variables are allocas in the entry block; the O3
 * pipeline promotes them to registers, so templates never build phis by
 * hand.
 *
 * Every GPU operation goes through aj_kb_intrinsic() and the table in
 * intrinsics.def, so each target (nvptx, sim) lowers each one in one
 * place.  Errors are sticky: the first failure is kept in kb->st / kb->msg
 * and later calls become no-ops that return harmless values, so a template
 * checks once, at the end.
 */
#ifndef AJ_CODEGEN_KBUILDER_H
#define AJ_CODEGEN_KBUILDER_H

#include <llvm-c/Core.h>

#include "attnjit/attnjit.h"
#include "codegen/target.h"
#include "ir/diag.h"
#include "ir/dtype.h"

enum aj_intrinsic_id {
#define AJ_INTRINSIC(id, kind, text, cons, sync, nres, res, nargs, args, sim) \
    AJ_INTR_##id,
#include "codegen/intrinsics.def"
#undef AJ_INTRINSIC
    AJ_INTR_COUNT
};

/* AJ_LOG2E, AJ_LN2, AJ_2_SQRTPI: ir/dtype.h */

/* Addresses spaces of NVPTX, which the sim target mirrors. */
enum { AJ_AS_GENERIC = 0, AJ_AS_GLOBAL = 1, AJ_AS_SHARED = 3 };

#define AJ_KB_MAX_PARAMS 96
#define AJ_KB_MAX_NEST 32
#define AJ_KB_MAX_RESULTS 128  /* the most results a table row has (wgmma m64n256k16) */

#define AJ_KB_MAX_STAGES 8   /* kernels one module may hold */

/* A kernel parameter: its name, type, and its row in the parameter table
 * (templates/params.def's aj_param_id, which codegen does not interpret),
 * or AJ_KB_NO_ID for one outside the table (a side tensor's). */
#define AJ_KB_NO_ID (-1)
typedef struct aj_kb_param_decl {
    char name[32];
    aj_param_type type;
    int32_t id;
} aj_kb_param_decl;

/* How a kernel is launched, besides its parameters and CTA size. */
typedef struct aj_kernel_layout {
    aj_grid_dim grid[3];
    aj_schedule schedule;    /* resolved, no zero fields */
    /* layout = paged forward: the most rows (a KV head's query heads x
     * their queries) one item or CTA packs (attn_common.h, "GQA
     * packing"); 0 where the op's score programs keep a head per item.
     * The launch counts the items that work by it. */
    int32_t pack_rows;
    aj_stage_plan plan;      /* AJ_STAGE_EVERY unless the template has two plans
                                (attnjit.h) */
} aj_kernel_layout;

/*
 * One kernel of the module, recorded by aj_kb_finish.  An op may need
 * several kernels run in order (backward: dK/dV, then dQ); each is a
 * stage with its own entry symbol, parameters and launch shape, and they
 * share one module, so one compile and one load serve them all:
 *
 *   aj_kb_add_param..  aj_kb_begin_stage("dkdv")  body  aj_kb_finish  -> stage 0
 *   aj_kb_add_param..  aj_kb_begin_stage("dq")    body  aj_kb_finish  -> stage 1
 */
typedef struct aj_kb_stage {
    char entry[128];           /* the kernel's symbol */
    LLVMValueRef fn;
    aj_kb_param_decl params[AJ_KB_MAX_PARAMS];
    int num_params;
    int32_t block_threads;
    int32_t min_ctas_per_sm;
    int32_t dynamic_smem;
    /* host targets: the bytes of the entry block's allocas (a work item's
     * stack buffers), which the cpu device checks a calling thread's stack
     * against before it runs items there (runtime/cpu/pool.c) */
    int64_t stack_bytes;
    aj_kernel_layout layout;
} aj_kb_stage;

/* The input tensors whose rows a kernel loads in vectors: its launch
 * contract asks each row of them to start on the kernel's row_align bytes
 * (runtime/launch_shapes.c checks it).  A paged kernel's keys and values
 * are its caches' rows (k and v stay empty there). */
typedef enum {
    AJ_ROW_Q, AJ_ROW_K, AJ_ROW_V, AJ_ROW_K_CACHE, AJ_ROW_V_CACHE, AJ_ROW_TENSORS
} aj_row_tensor;

typedef struct aj_kb {
    aj_ctx *ctx;
    aj_target target;
    const aj_target_desc *desc;   /* the target's row (codegen/target.h) */
    LLVMContextRef llctx;
    LLVMModuleRef mod;
    LLVMBuilderRef b;
    LLVMValueRef fn;           /* the kernel being built */
    LLVMBasicBlockRef entry;   /* allocas go here */
    const char *entry_name;    /* the module's symbol prefix, set by the pipeline */

    /* commonly used types */
    LLVMTypeRef t_void, t_i1, t_i16, t_i32, t_i64, t_f32, t_i8;
    LLVMTypeRef t_gptr, t_sptr;  /* ptr addrspace(1), ptr addrspace(3) */
    LLVMTypeRef t_ptr;           /* ptr (generic) */
    LLVMValueRef sim_thread;     /* sim: the hidden thread-state argument */
    LLVMValueRef work_item;      /* cpu: the hidden argument, ptr to i32 x, y, z */
    int32_t sim_sites;           /* sim: collective call sites numbered so far */
    /* NVPTX: the module's least PTX ISA version past the target's own
     * (10 x major + minor, 0: the target's), raised by instructions that
     * need it (aj_kb_mma_m16n8k32: 84); the pipeline makes the target
     * machine for it */
    int ptx_isa_min;
    void **scratch;              /* aj_kb_scratch's blocks, freed by aj_kb_dispose */
    int num_scratch, cap_scratch;

    /* the launch ABI, in declaration order */
    aj_kb_param_decl params[AJ_KB_MAX_PARAMS];
    int num_params;

    int32_t block_threads;
    int32_t min_ctas_per_sm;   /* occupancy the template designs for; >= 1 */
    int32_t dynamic_smem;      /* bytes requested with aj_kb_smem_reserve */
    int32_t smem_align;        /* the base's alignment (aj_kb_smem_reserve_aligned) */
    /* the bytes each row of q, k, v and the caches must start on
     * (aj_kb_row_align; the pipeline raises them to the defaults) */
    int32_t row_align[AJ_ROW_TENSORS];
    LLVMValueRef smem_base;

    /* the kernels finished so far, in launch order */
    aj_kb_stage stages[AJ_KB_MAX_STAGES];
    int num_stages;

    /* structured control flow: a stack of open loops and ifs */
    struct aj_kb_scope {
        int is_loop;
        int no_unroll;      /* aj_kb_loop_no_unroll */
        LLVMBasicBlockRef head, body, latch, exit, else_bb;
        LLVMValueRef var, end, step;
    } scopes[AJ_KB_MAX_NEST];
    int depth;

    aj_status st;
    char msg[512];
} aj_kb;

/* Sets up a builder for a new module; the caller owns llctx. */
aj_status aj_kb_init(aj_kb *kb, aj_ctx *ctx, LLVMContextRef llctx,
                     aj_target target, const char *module_name);
/* Frees the builder and the module. */
void aj_kb_dispose(aj_kb *kb);

/* Zeroed memory for the build (a template's score programs, too large for
 * a stack), owned by the builder and freed by aj_kb_dispose; NULL when out
 * of memory, the builder then failed. */
void *aj_kb_scratch(aj_kb *kb, size_t bytes);
/* Frees malloc'ed p with the builder's scratch; false (the builder
 * failed, p not taken) when out of memory. */
bool aj_kb_adopt(aj_kb *kb, void *p);

/* Records the first failure and returns it. */
aj_status aj_kb_fail(aj_kb *kb, aj_status st, const char *fmt, ...)
    AJ_PRINTF(3, 4);

/* Declares a parameter of the next kernel (id: its table row, or
 * AJ_KB_NO_ID); all of them come before aj_kb_begin / aj_kb_begin_stage.
 * A name declared twice fails the build. */
void aj_kb_add_param(aj_kb *kb, const char *name, aj_param_type type, int32_t id);
/* Creates the kernel function kb->entry_name with the declared parameters
 * and `threads` threads per CTA (the launch bound); positions at entry.
 * On the sim target the function takes the emulator's thread state as a
 * hidden first argument, before the declared parameters; on cpu the
 * hidden argument points to the work item (i32 x, y, z: the CTA index a
 * GPU launch would give). */
void aj_kb_begin(aj_kb *kb, int32_t threads);
/* The same for one kernel of several: its symbol is
 * "<entry_name>_<stage_name>". */
void aj_kb_begin_stage(aj_kb *kb, const char *stage_name, int32_t threads);
/* Terminates the kernel (ret void; all scopes must be closed) and records
 * it as the next stage with its launch layout; the builder is then ready
 * for another kernel's parameters. */
void aj_kb_finish(aj_kb *kb, const aj_kernel_layout *layout);

/*
 * Helper functions of the kernel being built: a function of the module
 * named `name` (internal, noinline), taking the kernel's own arguments
 * (its hidden one and parameters, so that aj_kb_param and the target's
 * intrinsics work inside as in the kernel) and then extra[0 .. n), and
 * returning `ret`.  aj_kb_helper_begin makes it and moves the builder
 * into its body (no scope open); aj_kb_helper_arg gives its extra
 * arguments (a by-value parameter, a TMA descriptor, is not passed on:
 * poison inside); aj_kb_helper_end returns `value` and puts the builder back
 * where it was, in the kernel.  aj_kb_helper_call calls it from the
 * kernel with the kernel's arguments, then extra.  Code that LLVM's
 * backend would otherwise see at every call site (a large score
 * program, docs/design.md "Score programs") is compiled once.
 */
typedef struct aj_kb_helper_saved {
    LLVMValueRef fn, sim_thread, work_item;
    LLVMBasicBlockRef entry, at;
    int depth;
    struct aj_kb_scope scopes[AJ_KB_MAX_NEST];
} aj_kb_helper_saved;
LLVMValueRef aj_kb_helper_begin(aj_kb *kb, const char *name, LLVMTypeRef ret,
                                LLVMTypeRef *extra, int n, aj_kb_helper_saved *saved);
LLVMValueRef aj_kb_helper_arg(aj_kb *kb, int index);
void aj_kb_helper_end(aj_kb *kb, LLVMValueRef value, aj_kb_helper_saved *saved);
LLVMValueRef aj_kb_helper_call(aj_kb *kb, LLVMValueRef fn, LLVMValueRef *extra, int n);
/* The value of parameter `name` (declared earlier): for parameters
 * outside the table (side tensors'); table rows go by id. */
LLVMValueRef aj_kb_param(aj_kb *kb, const char *name);
/* The value of the parameter declared with table row `id`; a kernel
 * without it fails the build, naming `name` (the row's). */
LLVMValueRef aj_kb_param_id(aj_kb *kb, int32_t id, const char *name);

/* Emits a call of a table intrinsic; args has its NARGS values.  Returns
 * its result, or NULL for a row without one; rows with several results
 * (mma, ldmatrix .x2/.x4) go through aj_kb_intrinsic_results. */
LLVMValueRef aj_kb_intrinsic(aj_kb *kb, enum aj_intrinsic_id id,
                             LLVMValueRef *args);
/* Same for any row: fills results[0 .. NRES-1]. */
void aj_kb_intrinsic_results(aj_kb *kb, enum aj_intrinsic_id id,
                             LLVMValueRef *args, LLVMValueRef *results);
/* True when every NVVM name in the table resolves in this LLVM; on
 * failure the message names the first that does not. */
aj_status aj_intrinsics_check(aj_ctx *ctx);
const char *aj_intrinsic_name(enum aj_intrinsic_id id);
/* The emulator symbols the sim lowering may call (one per table row). */
size_t aj_intrinsic_sim_symbols(const char **names, size_t cap);

/* A call of the LLVM intrinsic `name` (llvm.sqrt, llvm.fabs, ...)
 * overloaded on the type of its first argument; args has n values. */
LLVMValueRef aj_kb_call_overloaded(aj_kb *kb, const char *name, LLVMValueRef *args, int n);
/* A call of the LLVM intrinsic `name` that is not overloaded
 * (llvm.x86.avx512bf16.cvtneps2bf16.512, ...); NULL, emitting nothing,
 * where this LLVM has no intrinsic of that name. */
LLVMValueRef aj_kb_call_intrinsic(aj_kb *kb, const char *name, LLVMValueRef *args, int n);

/* constants */
LLVMValueRef aj_kb_i32(aj_kb *kb, int64_t v);
LLVMValueRef aj_kb_i64(aj_kb *kb, int64_t v);
LLVMValueRef aj_kb_f32(aj_kb *kb, double v);

/* variables: an alloca in the entry block, initialised here */
LLVMValueRef aj_kb_var(aj_kb *kb, LLVMTypeRef type, LLVMValueRef init,
                       const char *name);
LLVMValueRef aj_kb_get(aj_kb *kb, LLVMValueRef var);
void aj_kb_set(aj_kb *kb, LLVMValueRef var, LLVMValueRef value);

/* for (i = begin; i < end; i += step): returns i (an i32 or i64 phi, the
 * type of begin).  The body is emitted between begin and end calls. */
LLVMValueRef aj_kb_for_begin(aj_kb *kb, LLVMValueRef begin, LLVMValueRef end,
                             LLVMValueRef step, const char *name);
/* Asks that the innermost open loop stay a loop: neither LLVM nor ptxas
 * (`.pragma "nounroll"`) unrolls it. */
void aj_kb_loop_no_unroll(aj_kb *kb);
void aj_kb_for_end(aj_kb *kb);
/* if (cond) { ... } [else { ... }] */
void aj_kb_if_begin(aj_kb *kb, LLVMValueRef cond);
void aj_kb_else(aj_kb *kb);
void aj_kb_if_end(aj_kb *kb);

/* Shared memory: reserves `bytes` (16-byte aligned) of the kernel's dynamic
 * shared memory and returns its byte offset. */
int32_t aj_kb_smem_reserve(aj_kb *kb, int32_t bytes);
/* The same at an offset that is a multiple of `align` (a power of two, 16
 * to 1024; wgmma's and TMA's swizzled tiles need 8 swizzle rows, up to
 * 1024 bytes); the dynamic shared memory's base is then aligned as well. */
int32_t aj_kb_smem_reserve_aligned(aj_kb *kb, int32_t bytes, int32_t align);
/* The kernel loads the rows of input `t` (q, k or v) in pieces of
 * `bytes` (a power of two up to 1024), so a launch must start every row
 * on that many bytes: raises the kernel's figure, never lowers it.  Each
 * is at least the pipeline's default: q, k and v rows aj_row_align_default
 * of their element type, cache rows an element (the cpu kernel reads them
 * at any alignment; a template that loads them in chunks says so). */
void aj_kb_row_align(aj_kb *kb, aj_row_tensor t, int32_t bytes);
/* Whether `bytes` is a row alignment a kernel may state: a power of two
 * up to 1024 (aj_kb_row_align; a kernel read from bytes is checked too). */
static inline bool aj_row_align_valid(int32_t bytes)
{
    return bytes >= 1 && bytes <= 1024 && (bytes & (bytes - 1)) == 0;
}
/* The row alignment every kernel asks of a tensor of `dtype`: 16 bytes,
 * the loads' vector (8 for 8-bit floats, whose rows the templates load 8
 * elements at a time unless they say more). */
int32_t aj_row_align_default(aj_dtype dtype);

/* ptr addrspace(3) to dynamic shared memory at a byte offset (i32). */
LLVMValueRef aj_kb_smem_ptr(aj_kb *kb, LLVMValueRef byte_offset);

/* byte-offset address arithmetic for global (i64 offset) pointers */
LLVMValueRef aj_kb_gptr_offset(aj_kb *kb, LLVMValueRef base,
                               LLVMValueRef byte_offset);

/* Loads and stores through global (addrspace 1) or shared (addrspace 3)
 * pointers.  On sim each access is first checked by the emulator against
 * the buffers of the launch and the CTA's shared memory. */
LLVMValueRef aj_kb_load(aj_kb *kb, LLVMTypeRef type, LLVMValueRef ptr,
                        unsigned align);
void aj_kb_store(aj_kb *kb, LLVMValueRef value, LLVMValueRef ptr,
                 unsigned align);
/* *ptr = min(*ptr, value) for an i32 in global memory, unsigned and
 * atomic (atom.global.min.u32 on nvptx; checked like a store on sim). */
void aj_kb_atomic_umin_i32(aj_kb *kb, LLVMValueRef ptr, LLVMValueRef value);

/* GPU helpers built on the table */
LLVMValueRef aj_kb_thread_id(aj_kb *kb);
LLVMValueRef aj_kb_block_id(aj_kb *kb, int dim);   /* 0, 1, 2 */
/* The grid coordinate dim (i32) of the CTA, or on cpu of the work item. */
LLVMValueRef aj_kb_item_id(aj_kb *kb, int dim);
void aj_kb_barrier(aj_kb *kb);
/* butterfly max / sum of a float over aligned groups of `width` lanes
 * (a power of two <= 32) */
LLVMValueRef aj_kb_group_max(aj_kb *kb, LLVMValueRef v, int width);
LLVMValueRef aj_kb_group_sum(aj_kb *kb, LLVMValueRef v, int width);
LLVMValueRef aj_kb_exp2(aj_kb *kb, LLVMValueRef x);
LLVMValueRef aj_kb_log2(aj_kb *kb, LLVMValueRef x);

/* vote.sync over the full warp: the ballot (i32, bit l = lane l's i1
 * `pred`), and whether all / any lane's pred holds (i1). */
LLVMValueRef aj_kb_ballot(aj_kb *kb, LLVMValueRef pred);
LLVMValueRef aj_kb_vote_all(aj_kb *kb, LLVMValueRef pred);
LLVMValueRef aj_kb_vote_any(aj_kb *kb, LLVMValueRef pred);

/*
 * Tensor cores: d = a * b + c for one 16x8x16 tile per warp, f32
 * accumulators, dtype AJ_DTYPE_F16 or AJ_DTYPE_BF16.  Every lane of the
 * warp must make the same call.  a[4] and b[2] are i32 registers holding
 * two elements each (lower index in the low half), c[4] and d[4] f32, in
 * the PTX ISA's fragment layout.  Lane 4g + t (g = 0..7, t = 0..3) holds:
 *
 *   A 16x16, row-major       B 16x8, k x n            C, D 16x8
 *            k 2t,2t+1  k 2t+8,2t+9        n = g              n = 2t  n = 2t+1
 *   row g      a[0]       a[2]    k 2t,2t+1     b[0]   row g     c[0]    c[1]
 *   row g+8    a[1]       a[3]    k 2t+8,2t+9   b[1]   row g+8   c[2]    c[3]
 */
void aj_kb_mma_m16n8k16(aj_kb *kb, aj_dtype dtype, const LLVMValueRef a[4],
                        const LLVMValueRef b[2], const LLVMValueRef c[4],
                        LLVMValueRef d[4]);

/*
 * mma.sync m16n8k32 with 8-bit float inputs (A and B of AJ_DTYPE_F8E4M3
 * or _F8E5M2: both the same, or A e4m3 and B e5m2), f32 accumulation:
 * the same as m16n8k16's but that a[4] and
 * b[2] hold four elements each, the lowest index in the lowest byte (PTX
 * ISA "Matrix Fragments for mma.m16n8k32"):
 *
 *   A 16x32, row-major: a[r] holds row g + 8 (r & 1), k 4t + 16 (r >> 1) .. +3
 *   B 32x8, k x n:      b[r] holds column g, k 4t + 16 r .. +3
 *   C, D:               as m16n8k16's
 *
 * The bytes of A's row and of B's column are k-consecutive: ldmatrix
 * (16-bit elements) loads both from k-contiguous rows, as for f16 tiles of
 * half the width.  sim runs it; on NVPTX targets it needs compute
 * capability 8.9 and PTX ISA 8.4 (kb->ptx_isa_min): the target table's
 * f8_mma says what a target makes of it (sm_89 native, sm_90 / sm_90a
 * lowered to f16 HMMA by ptxas, sm_80 refused: no FP8 tensor cores).
 */
void aj_kb_mma_m16n8k32(aj_kb *kb, aj_dtype a_type, aj_dtype b_type, const LLVMValueRef a[4],
                        const LLVMValueRef b[2], const LLVMValueRef c[4], LLVMValueRef d[4]);

/*
 * ldmatrix: `count` (1, 2, 4) 8x8 matrices of 16-bit elements from shared
 * memory, one i32 (two elements) per lane per matrix into out[0..count-1].
 * Lane 8m + r passes the address of row r of matrix m (16 bytes, 16-byte
 * aligned); every lane of the warp must make the same call.  Lane 4g + t
 * receives row g, columns 2t and 2t+1 -- or with `trans` column g, rows 2t
 * and 2t+1, which is the fragment of the transposed matrix.
 */
void aj_kb_ldmatrix(aj_kb *kb, int count, int trans, LLVMValueRef smem_ptr,
                    LLVMValueRef out[4]);

/*
 * cp.async: an asynchronous 16-byte copy from global to shared memory
 * (both 16-byte aligned).  With src_bytes (an i32 0..16, or NULL for 16)
 * only that many bytes are read and the rest of the 16 are zero-filled.
 * The copy lands only at a wait that covers its group: commit closes the
 * group of copies issued since the last commit; wait(n) returns once at
 * most the n most recent groups are still pending; wait_all waits for
 * every copy, committed or not.
 */
void aj_kb_cp_async_16(aj_kb *kb, LLVMValueRef smem_ptr, LLVMValueRef gptr,
                       LLVMValueRef src_bytes);
void aj_kb_cp_async_commit(aj_kb *kb);
void aj_kb_cp_async_wait(aj_kb *kb, int pending_groups);
void aj_kb_cp_async_wait_all(aj_kb *kb);

/*
 * mbarrier (sm_90a; the rows MBARRIER_* of intrinsics.def): waits until
 * the phase of `parity` (an i32 0 or 1) of the mbarrier at `bar` (shared,
 * 8-byte aligned) has completed, retrying try_wait.parity while it
 * returns 0.
 */
void aj_kb_mbarrier_wait(aj_kb *kb, LLVMValueRef bar, LLVMValueRef parity);

/*
 * wgmma (sm_90a; the rows WGMMA_* of intrinsics.def), the 128 threads of a
 * warpgroup together.  D (64 x N, f32) = A (64 x 16) * B (16 x N) + D, or
 * + 0 where scale_d is 0.  `acc` is the thread's accumulators, an
 * aj_kb_var of [N/2 x f32] type, in the PTX ISA's layout (thread 32 w +
 * 4 g + t, register r):
 *
 *   row 16 w + g + 8 ((r >> 1) & 1),  col 8 (r >> 2) + 2 t + (r & 1)
 *
 * args: the _SS rows (a_desc i64, b_desc i64, scale_d i32), the _RS rows
 * (a0..a3 i32: A's rows 16 w + g (+8), k 2t, 2t+1 (+8), as mma.sync's A
 * fragment, then b_desc, scale_d).  The descriptors: aj_kb_wgmma_desc.
 * The results are in `acc` only after a wgmma.wait_group that covers the
 * commit group: aj_kb_wgmma_wait(kb, n, accs, count) waits until at most
 * n groups are pending and keeps every use of the listed accumulators after
 * the wait.
 */
void aj_kb_wgmma(aj_kb *kb, enum aj_intrinsic_id id, LLVMValueRef acc, LLVMValueRef *args);
/* Between an accumulator variable `acc` and a template's variables of
 * its n8 tiles (register 4 j + c is vars[j][c], mma.sync's C fragment of
 * tile j): put before a wgmma that adds to it, take once a wait covers it. */
void aj_kb_wgmma_put(aj_kb *kb, LLVMValueRef acc, int n8, LLVMValueRef (*vars)[4]);
void aj_kb_wgmma_take(aj_kb *kb, LLVMValueRef acc, int n8, LLVMValueRef (*vars)[4]);
/* The row of m64nNk16 (A and B both f16 or both bf16) or m64nNk32 (8-bit
 * floats: e4m3 x e4m3, e5m2 x e5m2, e4m3 x e5m2), A in registers (_RS) or
 * by descriptor (_SS), B N-major (_TB, 16-bit only) or K-major;
 * AJ_INTR_COUNT for a combination or an N that has none
 * (codegen/wgmma_shapes.h). */
enum aj_intrinsic_id aj_kb_wgmma_row(int n, aj_dtype a_type, aj_dtype b_type, int a_in_registers,
                                     int n_major_b);
void aj_kb_wgmma_wait(aj_kb *kb, int pending, const LLVMValueRef *accs, int count);
/* A shared-memory matrix descriptor (i64) for `smem_ptr` (K-major, the
 * byte offsets lbo and sbo, swizzle AJ_WGMMA_SWIZZLE_*). */
enum { AJ_WGMMA_SWIZZLE_NONE = 0, AJ_WGMMA_SWIZZLE_128B = 1, AJ_WGMMA_SWIZZLE_64B = 2,
       AJ_WGMMA_SWIZZLE_32B = 3 };
LLVMValueRef aj_kb_wgmma_desc(aj_kb *kb, LLVMValueRef smem_ptr, int lbo, int sbo, int swizzle);
/* The descriptor `desc` with its start address `bytes` on (a multiple of
 * 16, the sum within shared memory: the 14-bit field cannot carry). */
LLVMValueRef aj_kb_wgmma_desc_plus(aj_kb *kb, LLVMValueRef desc, int64_t bytes);
/* v as a value the optimiser cannot see through (NVPTX: a volatile mov;
 * elsewhere v itself), so that what is computed from it stays where it
 * is built: a loop-invariant base whose many offsets would otherwise be
 * hoisted out of the loop and held in registers across it. */
LLVMValueRef aj_kb_opaque(aj_kb *kb, LLVMValueRef v);
/* Byte offset `offset` (i32, from a base aligned to 8 span-byte rows) under
 * the span-byte swizzle (span 32, 64 or 128) that wgmma and TMA share: the
 * 16-byte chunk (bits 4..) XORed with bits 7.. (span / 16 - 1 of them). */
LLVMValueRef aj_kb_swizzle(aj_kb *kb, LLVMValueRef offset, int span);
/* The swizzle mode (AJ_WGMMA_SWIZZLE_*) of a span of 128, 64 or 32 bytes;
 * 0 (none) for any other. */
int aj_kb_swizzle_mode(int span);

/* element conversions between a storage dtype and f32 */
LLVMTypeRef aj_kb_storage_type(aj_kb *kb, aj_dtype dtype); /* i8, i16 or f32 */
/* v (the storage type of dtype, a scalar or a vector; an f16 also as
 * halves) as f32 of its shape: the one widening rule of every target */
LLVMValueRef aj_kb_to_f32(aj_kb *kb, LLVMValueRef v, aj_dtype dtype);
/* An f8 byte (i8, or a vector of them) as the bits of an f16 (i16 or a
 * vector): e5m2 is the top byte of an f16, exactly; e4m3 (magnitude bits
 * << 7) is the f16 of 2^-8 its value, subnormals included, so its f32 is
 * that f16's times AJ_F8E4M3_F16_FACTOR (its NaN, S.1111.111, reads as
 * 480).  One rule for every target: aj_kb_to_f32 and the cpu vector loads
 * widen through it. */
#define AJ_F8E4M3_F16_FACTOR 256.0f
/* Two f32 as a pair of e4m3 in an i16, `lo` in the low byte, rounded to
 * nearest even and saturated at +-448 (cvt.rn.satfinite.e4m3x2.f32: targets
 * with FP8 -- the target table's f8_mma -- and sim). */
LLVMValueRef aj_kb_e4m3x2(aj_kb *kb, LLVMValueRef lo, LLVMValueRef hi);
LLVMValueRef aj_kb_f8_to_f16_bits(aj_kb *kb, LLVMValueRef v, aj_dtype dtype);
LLVMValueRef aj_kb_from_f32(aj_kb *kb, LLVMValueRef v, aj_dtype dtype);
/* (the element sizes: aj_dtype_size, attnjit.h) */

/* arithmetic shorthands (f32 and integer) */
LLVMValueRef aj_kb_fmax(aj_kb *kb, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef aj_kb_fma(aj_kb *kb, LLVMValueRef a, LLVMValueRef b,
                       LLVMValueRef c);
/* Integer arithmetic the templates write everywhere (wrapping, as LLVM's) */
static inline LLVMValueRef aj_kb_add(aj_kb *kb, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildAdd(kb->b, a, b, "");
}
static inline LLVMValueRef aj_kb_mul(aj_kb *kb, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildMul(kb->b, a, b, "");
}
static inline LLVMValueRef aj_kb_slt(aj_kb *kb, LLVMValueRef a, LLVMValueRef b)
{
    return LLVMBuildICmp(kb->b, LLVMIntSLT, a, b, "");
}
/* An i32 index as i64 (sign-extended). */
static inline LLVMValueRef aj_kb_sext64(aj_kb *kb, LLVMValueRef v)
{
    return LLVMBuildSExt(kb->b, v, kb->t_i64, "");
}
LLVMValueRef aj_kb_smin(aj_kb *kb, LLVMValueRef a, LLVMValueRef b);
LLVMValueRef aj_kb_smax(aj_kb *kb, LLVMValueRef a, LLVMValueRef b);

/* Philox4x32-10 (Salmon et al., SC'11) on i32 values: one 128-bit block
 * out[0..3] from the counter ctr[0..3] and key key[0..1], as plain integer
 * IR (the 32x32 -> 64 products are i64 multiplies), so every target runs
 * the same bits as tests/lib/ref.c's ref_philox4x32_10. */
void aj_kb_philox4x32_10(aj_kb *kb, const LLVMValueRef ctr[4],
                         const LLVMValueRef key[2], LLVMValueRef out[4]);

#endif /* AJ_CODEGEN_KBUILDER_H */
