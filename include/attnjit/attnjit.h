/*
 * attnjit.h -- the public C API of attnjit, an attention-kernel JIT.
 *
 * One umbrella header.  Conventions that hold for every call:
 *
 *  - Every fallible call returns an aj_status; AJ_OK is 0.  Results come
 *    back through out-parameters, which are written only on success.
 *  - Error text lives on the context: aj_last_error(ctx) describes the most
 *    recent failing call made with that context.  The string is owned by the
 *    context and stays valid until the next failing call on the same context
 *    or until aj_ctx_destroy().
 *  - Objects are opaque handles.  Each *_create / *_parse / aj_compile has a
 *    matching *_destroy; strings returned through `char **` are allocated by
 *    attnjit and released with aj_free().  Strings passed in are copied.
 *  - The library never prints to stdout and never exits the process; it logs
 *    through the callback in aj_ctx_config, if one is set.
 *  - A context may be shared by threads only if they do not fail at the same
 *    time; give each thread its own context for independent error text.
 *  - Versioned structs: a struct that starts with `size_t struct_size` is
 *    started from its *_INIT macro, which sets struct_size to the size of
 *    the struct the caller was built against.  attnjit accepts an older,
 *    smaller struct (at least its first version: the end of its required
 *    fields, q..lse for aj_fwd_args) and gives the fields that version lacks
 *    their defaults; it accepts a newer, larger one whose fields unknown to
 *    it are all 0.  Any other struct_size is AJ_ERR_INVALID_ARG.
 */
#ifndef ATTNJIT_H
#define ATTNJIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define AJ_VERSION_MAJOR 0
#define AJ_VERSION_MINOR 1
#define AJ_VERSION_PATCH 0

/* ---------------------------------------------------------------- status */

typedef enum aj_status {
    AJ_OK = 0,
    AJ_ERR_INVALID_ARG = 1,  /* API misuse: NULL, out of range, wrong size */
    AJ_ERR_PARSE = 2,        /* malformed IR text; message has line:column */
    AJ_ERR_VERIFY = 3,       /* well-formed IR describing an invalid op */
    AJ_ERR_UNSUPPORTED = 4,  /* valid op that no template implements yet */
    AJ_ERR_CODEGEN = 5,      /* LLVM rejected what a template built */
    AJ_ERR_NO_DEVICE = 6,    /* no CUDA driver or GPU present */
    AJ_ERR_IO = 7,           /* a file could not be read or written */
    AJ_ERR_OUT_OF_MEMORY = 8,
    AJ_ERR_INTERNAL = 9,     /* a bug in attnjit: please report it */
    AJ_ERR_KERNEL_FAULT = 10, /* a kernel misbehaved on sim: out-of-bounds or
                                misaligned access, barrier divergence,
                                deadlock (the message names kernel, CTA,
                                thread and address) */
    AJ_ERR_COMM = 11,        /* a ring peer failed or stayed silent past the
                                comm timeout; MPI or NCCL reported an error */
    AJ_STATUS_COUNT
} aj_status;

/* A static English name for a status ("AJ_ERR_PARSE"); never NULL. */
const char *aj_status_str(aj_status status);

/* ---------------------------------------------------------------- context */

typedef struct aj_ctx aj_ctx;

typedef enum aj_log_level {
    AJ_LOG_ERROR = 0,
    AJ_LOG_WARN = 1,
    AJ_LOG_INFO = 2,
    AJ_LOG_DEBUG = 3,
} aj_log_level;

typedef void (*aj_log_fn)(void *user, aj_log_level level, const char *message);

/* Where compiled kernels are kept between compiles of the same op. */
typedef enum aj_cache_mode {
    /* in memory, and on disk for PTX / LLVM IR / bitcode; the environment
     * may relocate (AJ_CACHE_DIR) or disable (AJ_CACHE=off) the disk part */
    AJ_CACHE_DEFAULT = 0,
    AJ_CACHE_MEMORY = 1,     /* in memory only */
    AJ_CACHE_OFF = 2,        /* every compile is a fresh compile */
    AJ_CACHE_MODE_COUNT
} aj_cache_mode;

/* Context configuration.  Always start from AJ_CTX_CONFIG_INIT so fields
 * added later get their defaults; struct_size tells attnjit which version of
 * the struct the caller was built against. */
typedef struct aj_ctx_config {
    size_t struct_size;
    aj_log_fn log_fn;        /* optional: NULL discards log messages */
    void *log_user;          /* passed back to log_fn */
    aj_log_level log_level;  /* messages above this level are dropped */
    aj_cache_mode cache_mode;
    /* optional: the disk cache's directory (copied).  NULL: $AJ_CACHE_DIR,
     * else $XDG_CACHE_HOME/attnjit, else $HOME/.cache/attnjit */
    const char *cache_dir;
    uint64_t cache_max_bytes;  /* disk cache size cap; 0: 1 GiB */
    /* kernels kept in memory (the least recently used go; a kernel the
     * caller still holds lives on until released); 0: 256 */
    uint64_t cache_max_kernels;
} aj_ctx_config;

#define AJ_CTX_CONFIG_INIT \
    { sizeof(aj_ctx_config), NULL, NULL, AJ_LOG_WARN, AJ_CACHE_DEFAULT, NULL, 0, 0 }

/* Creates a context.  config may be NULL for the defaults. */
aj_status aj_ctx_create(const aj_ctx_config *config, aj_ctx **out);
void aj_ctx_destroy(aj_ctx *ctx);

/* Text of the most recent failure on ctx ("" if none); owned by ctx. */
const char *aj_last_error(const aj_ctx *ctx);

/* Frees memory that attnjit handed out through a `char **` or `void **`. */
void aj_free(void *ptr);

/* "0.1.0" */
const char *aj_version_string(void);

/* ---------------------------------------------------------------- the op */

typedef enum aj_kind {
    AJ_KIND_FORWARD = 0,
    AJ_KIND_BACKWARD = 1,
    AJ_KIND_MERGE = 2,
    AJ_KIND_COUNT
} aj_kind;

typedef enum aj_variant {
    AJ_VARIANT_NONE = 0,       /* merge ops only */
    AJ_VARIANT_FLASH = 1,
    AJ_VARIANT_EFFICIENT = 2,
    AJ_VARIANT_COUNT
} aj_variant;

typedef enum aj_dtype {
    AJ_DTYPE_F16 = 0,
    AJ_DTYPE_BF16 = 1,
    AJ_DTYPE_F32 = 2,
    /* 8-bit floats: the elements of a forward's inputs only (q_dtype,
     * kv_dtype: FP8 attention, or a paged KV cache), with f32 descales;
     * an op's dtype (O's) is one of the three above */
    AJ_DTYPE_F8E4M3 = 3,       /* OCP e4m3fn: no inf, max 448 */
    AJ_DTYPE_F8E5M2 = 4,       /* OCP e5m2: inf and NaN as in IEEE */
    AJ_DTYPE_COUNT
} aj_dtype;

typedef enum aj_mask_kind {
    AJ_MASK_NONE = 0,
    AJ_MASK_CAUSAL = 1,
    AJ_MASK_WINDOW = 2,
    AJ_MASK_EXPR = 3,          /* mask = expr(E): aj_op_set_mask_expr */
    AJ_MASK_COUNT
} aj_mask_kind;

/* Where the diagonal of a causal or window mask sits when Sq != Sk:
 * top_left (shift 0, PyTorch is_causal) or bottom_right (shift Sk - Sq,
 * FlashAttention >= 2.1). */
typedef enum aj_align {
    AJ_ALIGN_TOP_LEFT = 0,
    AJ_ALIGN_BOTTOM_RIGHT = 1,
    AJ_ALIGN_COUNT
} aj_align;

typedef enum aj_score_mod {
    AJ_SCORE_MOD_NONE = 0,
    AJ_SCORE_MOD_SOFTCAP = 1,  /* s = C * tanh(s / C) */
    /* s -= slope[h] * |q_pos - kv_pos|, after a softcap where
     * aj_op_info.softcap > 0 (`softcap(C) + alibi`); the slopes are the
     * launch's alibi_slopes, or side tensor aj_op_info.alibi_tensor */
    AJ_SCORE_MOD_ALIBI = 2,
    AJ_SCORE_MOD_EXPR = 3,     /* score_mod = expr(E): aj_op_set_score_mod_expr */
    AJ_SCORE_MOD_COUNT
} aj_score_mod;

typedef enum aj_bias {
    AJ_BIAS_NONE = 0,
    AJ_BIAS_ADD = 1,           /* efficient variant only */
    AJ_BIAS_COUNT
} aj_bias;

typedef enum aj_layout {
    AJ_LAYOUT_PADDED = 0,      /* Q[B,H,S,D] with run-time strides */
    AJ_LAYOUT_VARLEN = 1,      /* Q[T,H,D] with cu_seqlens */
    AJ_LAYOUT_PAGED = 2,       /* forward: K/V in caches of pages (aj_fwd_args.paged) */
    AJ_LAYOUT_COUNT
} aj_layout;

typedef enum aj_target {
    AJ_TARGET_ANY = 0,         /* in an op: not pinned to a target */
    AJ_TARGET_SM_80 = 1,
    AJ_TARGET_SM_90 = 2,
    AJ_TARGET_SM_90A = 3,
    AJ_TARGET_SIM = 4,
    AJ_TARGET_CPU = 5,
    /* Ada (compute capability 8.9: L4, L40S, RTX 40xx): sm_80's kernels,
     * and the first GPUs with FP8 tensor cores (docs/gpu.md) */
    AJ_TARGET_SM_89 = 6,
    AJ_TARGET_COUNT
} aj_target;

/* Element type of a side tensor (`tensors = (NAME: i32[RANK], ...)`).  The
 * 16-bit floats read as their exact f32 values (a bias table in the
 * model's dtype need not be widened to pass it); a gradient is f32 whatever
 * the tensor's dtype (docs/ir.md "Side tensors"). */
typedef enum aj_side_dtype {
    AJ_SIDE_I32 = 0,
    AJ_SIDE_F32 = 1,
    AJ_SIDE_F16 = 2,
    AJ_SIDE_BF16 = 3,
    AJ_SIDE_DTYPE_COUNT
} aj_side_dtype;

/* Side tensors per op, and the longest name of one (docs/ir.md). */
#define AJ_OP_TENSORS_MAX 8
#define AJ_OP_TENSOR_NAME_MAX 31

/* A side tensor an op declares (aj_op_info.tensors). */
typedef struct aj_side_decl {
    char name[AJ_OP_TENSOR_NAME_MAX + 1];
    aj_side_dtype dtype;
    int32_t rank;
} aj_side_decl;

/* A side tensor passed to a launch by name (aj_fwd_args.side): the data of
 * declaration `name` in device memory, `dtype` and `rank` as declared,
 * every dim at least 1, strides in elements (any, 0 included).  The
 * expressions read element (i0, ..., iR-1) at sum i_d strides[d]; an index
 * outside shape reads 0.  The name is not copied: it must outlive the
 * call. */
typedef struct aj_side_tensor {
    const char *name;
    const void *data;
    aj_side_dtype dtype;
    int32_t rank;
    int64_t shape[4];
    int64_t strides[4];
} aj_side_tensor;

/* Tile schedule.  A field of 0 lets the template choose. */
typedef struct aj_schedule {
    int32_t block_m;   /* query rows per CTA */
    int32_t block_n;   /* keys per inner tile */
    int32_t warps;     /* warps per CTA */
    int32_t stages;    /* pipeline depth of K/V loads */
} aj_schedule;

/* Passed as the scale to mean 1/sqrt(head_dim). */
#define AJ_SCALE_DEFAULT 0.0

/* An attention op: what to compute, not how big.  Batch, head counts,
 * lengths, strides, position offsets and dropout seeds are launch-time
 * arguments. */
typedef struct aj_op aj_op;

/* Builder.  aj_op_create makes an op with every field at its default
 * (f32, head_dim 64, no mask, ...); the setters change one field each.
 * Errors are sticky: the first failing setter's status and message are kept
 * on the op and returned again by aj_op_verify() and aj_compile(), so a chain
 * of setters can be checked once at the end.  The op keeps a pointer to ctx,
 * which must outlive it. */
aj_status aj_op_create(aj_ctx *ctx, aj_kind kind, aj_variant variant,
                       aj_op **out);
void aj_op_destroy(aj_op *op);
/* Deep copy, sticky error included. */
aj_status aj_op_clone(const aj_op *op, aj_op **out);

aj_status aj_op_set_dtype(aj_op *op, aj_dtype dtype);
/* head_dim_v == 0 means "same as head_dim". */
aj_status aj_op_set_head_dims(aj_op *op, int32_t head_dim, int32_t head_dim_v);
aj_status aj_op_set_mask_none(aj_op *op);
aj_status aj_op_set_mask_causal(aj_op *op, aj_align align);
/* Keys kv_pos with q_pos+shift-left <= kv_pos <= q_pos+shift+right. */
aj_status aj_op_set_mask_window(aj_op *op, int64_t left, int64_t right,
                                aj_align align);
aj_status aj_op_set_score_mod_none(aj_op *op);
aj_status aj_op_set_softcap(aj_op *op, double cap);
aj_status aj_op_set_alibi(aj_op *op);
/* score_mod = alibi only (the text form's `alibi(grad)`): the backward
 * gives the slopes' gradient as the dside output named "alibi_slopes",
 * f32 [heads_q_total], as a grad side tensor's (docs/ir.md "Gradients of
 * side tensors").  aj_op_set_tensor_grad(op, "alibi_slopes", grad) is
 * the same call.  Setting the score_mod again clears it. */
aj_status aj_op_set_alibi_grad(aj_op *op, bool grad);
aj_status aj_op_get_alibi_grad(const aj_op *op, bool *grad);
/* ALiBi in full (docs/ir.md "Score modifications"): the text form's
 * `[softcap(C) +] alibi[(NAME)]`.  `slopes` names a side tensor declared
 * before, f32 of rank 1 with one slope per query head (its gradient, as
 * any side tensor's: aj_op_set_tensor_grad), or is NULL / "" for the
 * launch's alibi_slopes; `softcap` > 0 caps the score first (C tanh(s /
 * C)), 0 does not. */
aj_status aj_op_set_alibi_with(aj_op *op, const char *slopes, double softcap);
/* Expressions (docs/ir.md, "Expressions").  aj_op_declare_tensor adds a
 * side input the expressions may read, after those declared before; name
 * is copied (an identifier of 1..AJ_OP_TENSOR_NAME_MAX characters that is
 * not a variable, function, keyword or launch tensor name, and not
 * declared already), rank is 1..4.  Declarations are never removed.
 * aj_op_set_mask_expr and aj_op_set_score_mod_expr parse `text`, the E of
 * `mask = expr(E)` / `score_mod = expr(E)` (NUL-terminated, copied into the
 * op as nodes; the caller keeps its string), against the tensors declared
 * so far.  Their messages place an error at "LINE:COL" within text. */
aj_status aj_op_declare_tensor(aj_op *op, const char *name,
                               aj_side_dtype dtype, int32_t rank);
aj_status aj_op_set_mask_expr(aj_op *op, const char *text);
aj_status aj_op_set_score_mod_expr(aj_op *op, const char *text);
/* A finite positive scale, or AJ_SCALE_DEFAULT. */
aj_status aj_op_set_scale(aj_op *op, double scale);
aj_status aj_op_set_dropout(aj_op *op, double p);
/* Learned attention sinks (docs/ir.md "Sinks"): `name` is a side tensor
 * declared before, f32 of rank 1, holding one logit per query head; each
 * row's softmax denominator gains exp(sink[h]) (no value: the output
 * gets nothing from it) and its LSE includes it.  NULL or "" removes
 * them.  With accumulate, the call whose kv_offset is 0 counts the sink
 * (a chain over disjoint key blocks has exactly one).  The backward's
 * gradient of the logits is aj_bwd_args.dsinks. */
aj_status aj_op_set_sinks(aj_op *op, const char *name);
/* The index (in aj_op_info.tensors) of the op's sinks tensor, or -1. */
aj_status aj_op_get_sinks(const aj_op *op, int32_t *tensor);
/* Gradients of side tensors (docs/ir.md "Gradients of side tensors"):
 * declared float tensor `name` (f32, f16, bf16) gets d(loss)/d(tensor), f32,
 * from the backward (aj_bwd_args.dside), deterministic: the text form's
 * `NAME: f32[R] grad`.
 * Not the sinks' tensor (its gradient is aj_bwd_args.dsinks).  A forward
 * ignores the flag.  Name "alibi_slopes" is aj_op_set_alibi_grad. */
aj_status aj_op_set_tensor_grad(aj_op *op, const char *name, bool grad);
/* Whether declared tensor `index` (in aj_op_info.tensors) is grad. */
aj_status aj_op_get_tensor_grad(const aj_op *op, int32_t index, bool *grad);
aj_status aj_op_set_bias(aj_op *op, aj_bias bias);
aj_status aj_op_set_layout(aj_op *op, aj_layout layout);
aj_status aj_op_set_accumulate(aj_op *op, bool accumulate);
aj_status aj_op_set_deterministic(aj_op *op, bool deterministic);
aj_status aj_op_set_schedule(aj_op *op, const aj_schedule *schedule);
aj_status aj_op_set_target(aj_op *op, aj_target target);
/* K's and V's element type; until set, the op's dtype.  layout = paged:
 * the KV caches' (f16, bf16, f32, f8e4m3, f8e5m2); padded and varlen
 * forwards: the dtype or f8e4m3 / f8e5m2 (FP8 attention, with k_scale and
 * v_scale; docs/ir.md "FP8 inputs"). */
aj_status aj_op_set_kv_dtype(aj_op *op, aj_dtype kv_dtype);
/* Padded and varlen forwards: the queries' element type, the dtype or
 * f8e4m3 / f8e5m2 (with q_scale); until set, the op's dtype, which stays
 * O's.  The text form's `q_dtype`. */
aj_status aj_op_set_q_dtype(aj_op *op, aj_dtype q_dtype);
aj_status aj_op_get_q_dtype(const aj_op *op, aj_dtype *q_dtype);
/* layout = paged only: the number of parts the key range of a sequence is
 * split into (split-KV), 1..AJ_SPLITS_MAX (each count is tested against
 * the reference; the launch heuristic chooses no more); 0 lets the launch
 * choose from the batch, heads, lengths and the device's cores.  The text
 * form's `schedule = (splits = N)`. */
#define AJ_SPLITS_MAX 16
aj_status aj_op_set_splits(aj_op *op, int32_t splits);
/* Flash forward over padded or varlen tensors, for sm_90a (and sim, which
 * emulates it): the number of consumer warpgroups (1..AJ_WARPGROUPS_MAX,
 * 64 query rows each) of the wgmma template, whose GEMMs are
 * wgmma.mma_async; 0, the default, keeps the mma.sync template, which
 * every target runs.  The text form's `schedule = (warpgroups = N)`
 * (docs/ir.md, docs/gpu.md). */
#define AJ_WARPGROUPS_MAX 2
aj_status aj_op_set_warpgroups(aj_op *op, int32_t warpgroups);
aj_status aj_op_get_warpgroups(const aj_op *op, int32_t *warpgroups);
/* With warpgroups: 1 adds a producer warpgroup that issues every load
 * (TMA, or cp.async where TMA cannot describe a tensor) into a ring of
 * shared-memory slots, handed over by full / empty mbarriers, while the
 * consumer warpgroups (setmaxnreg) run the GEMMs and the softmax, two of
 * them taking turns at the tensor cores (warp specialisation); 0, the
 * default, has every warp load and compute.  The text form's `schedule =
 * (warpgroups = N, producer = 1)` (docs/gpu.md).  Set warpgroups first
 * (and clear producer before warpgroups): producer = 1 without them is
 * AJ_ERR_VERIFY, a value other than 0 or 1 AJ_ERR_INVALID_ARG. */
aj_status aj_op_set_producer(aj_op *op, int32_t producer);
aj_status aj_op_get_producer(const aj_op *op, int32_t *producer);
/* layout = paged only: the queries' layout, AJ_LAYOUT_PADDED (q [B, Hq,
 * Sq, D], the default) or AJ_LAYOUT_VARLEN (q [T, Hq, D] with
 * cu_seqlens_q: chunked prefill).  The text form's `q_layout`. */
aj_status aj_op_set_q_layout(aj_op *op, aj_layout q_layout);
/* layout = paged only: one cache holds K and V (absorbed MLA's latent
 * cache): V is the first head_dim_v (<= head_dim) columns of k_cache's
 * rows, and aj_fwd_args.v_cache / v_scale stay empty.  Needs an explicit
 * scale (set before it).  The text form's `kv_shared = true` (docs/ir.md
 * "Shared K/V cache"). */
aj_status aj_op_set_kv_shared(aj_op *op, bool kv_shared);
aj_status aj_op_get_kv_shared(const aj_op *op, bool *kv_shared);

/* Checks the op as a whole (sticky builder error first, then every rule of
 * docs/ir.md).  Returns AJ_OK or AJ_ERR_VERIFY / AJ_ERR_INVALID_ARG with
 * one message naming the offending field. */
aj_status aj_op_verify(const aj_op *op);

/* Read-only view of an op, for embedders and tools. */
typedef struct aj_op_info {
    aj_kind kind;
    aj_variant variant;
    aj_dtype dtype;
    int32_t head_dim;
    int32_t head_dim_v;
    aj_mask_kind mask;
    aj_align mask_align;
    int64_t window_left;
    int64_t window_right;
    aj_score_mod score_mod;
    double softcap;        /* softcap(C), and alibi after one: C; else 0 */
    double scale;          /* resolved: never AJ_SCALE_DEFAULT */
    bool scale_is_default;
    double dropout;
    aj_bias bias;
    aj_layout layout;
    bool accumulate;
    bool deterministic;
    aj_schedule schedule;  /* as given; 0 fields = template default */
    aj_target target;
    /* the side tensors its expressions read, in declaration order */
    int32_t num_tensors;
    aj_side_decl tensors[AJ_OP_TENSORS_MAX];
    aj_dtype kv_dtype;     /* resolved: the dtype unless set (paged caches, f8 inputs) */
    int32_t splits;        /* as given; 0 = chosen at launch */
    aj_layout q_layout;    /* layout = paged: its queries' (else padded) */
    /* score_mod = alibi(NAME): NAME's index in tensors; -1: the slopes
     * are the launch's alibi_slopes (or there is no alibi) */
    int32_t alibi_tensor;
} aj_op_info;

aj_status aj_op_get_info(const aj_op *op, aj_op_info *out);

/* Parses one op in the text form of docs/ir.md.  `name` (may be NULL) is
 * used in messages, which read "name:LINE:COL: ...".  The result is
 * verified; on failure *out is untouched and aj_last_error(ctx) says why. */
aj_status aj_op_parse(aj_ctx *ctx, const char *text, size_t len,
                      const char *name, aj_op **out);

/* The canonical text form: every field, defaults included, in the order of
 * docs/ir.md.  Parsing it gives back an equal op.  *out is freed with
 * aj_free(). */
aj_status aj_op_print(const aj_op *op, char **out);

/* Canonical hash: 16 lowercase hex digits (XXH3-64 of the canonical text),
 * stable across runs, machines and attnjit builds of the same IR version.
 * `out` must hold AJ_HASH_HEX_LEN + 1 bytes. */
#define AJ_HASH_HEX_LEN 16
aj_status aj_op_hash(const aj_op *op, char out[AJ_HASH_HEX_LEN + 1]);

/* Lower-case names used by the text form ("bf16", "sm_90a", ...). */
const char *aj_kind_name(aj_kind kind);
const char *aj_variant_name(aj_variant variant);
const char *aj_dtype_name(aj_dtype dtype);
const char *aj_target_name(aj_target target);
/* Parses a target name; AJ_ERR_INVALID_ARG if unknown. */
aj_status aj_target_from_name(aj_ctx *ctx, const char *name, aj_target *out);

/* ---------------------------------------------------------------- compile */

typedef enum aj_emit {
    AJ_EMIT_PTX = 0,       /* PTX text (GPU targets) */
    AJ_EMIT_LLVM_IR = 1,   /* optimised LLVM IR text */
    AJ_EMIT_BITCODE = 2,   /* optimised LLVM bitcode */
    /* the target's own form, and the default: PTX for GPU targets, LLVM IR
     * for sim and cpu (whose kernels are host code, JIT-compiled in
     * process); a kernel reports the form it was given (aj_kernel_emit) */
    AJ_EMIT_AUTO = 3,
    AJ_EMIT_COUNT
} aj_emit;

typedef struct aj_compile_options {
    size_t struct_size;
    aj_target target;      /* must agree with the op's target if it has one */
    aj_emit emit;
    /* 0..3.  2 (the default): attnjit's pass list for generated kernels
     * (SROA, early CSE, instcombine, loop rotation, LICM) with the NVPTX backend at
     * its default level; 3: LLVM's default<O3> and the aggressive backend;
     * 1: SROA, CSE and instcombine only; 0: SROA only.  The sim target
     * lowers the optimised IR to host code without machine-level
     * optimisation whatever the level (docs/sim.md). */
    int opt_level;
    /* optional: a stage name ("build", "verify", "optimize") after which the
     * module is printed through the log callback at AJ_LOG_DEBUG; NULL: off */
    const char *dump_after;
    /* true: compile afresh, neither reading nor filling the kernel cache */
    bool bypass_cache;
    /* optional: the device the kernel is for.  When set, `target` is the
     * device's (aj_device_target) and an op whose schedule is the default
     * gets the schedule aj_tune() found best for it on this device, if the
     * tuning database holds one (see aj_tune).  NULL: neither. */
    const struct aj_device *device;
} aj_compile_options;

#define AJ_COMPILE_OPTIONS_INIT \
    { sizeof(aj_compile_options), AJ_TARGET_SM_80, AJ_EMIT_AUTO, 2, NULL, false, NULL }

/* A compiled kernel: code plus what a launcher needs to know. */
typedef struct aj_kernel aj_kernel;

/* Compiles a verified op.  Options not implemented by any template for the
 * target give AJ_ERR_UNSUPPORTED naming the option.  options may be NULL for
 * AJ_COMPILE_OPTIONS_INIT.  The kernel comes from the context's kernel
 * cache when the same op was compiled before with the same options (in
 * this process, or on disk; see aj_ctx_config); either way the caller
 * gets its own reference and releases it with aj_kernel_destroy(). */
aj_status aj_compile(aj_ctx *ctx, const aj_op *op,
                     const aj_compile_options *options, aj_kernel **out);
/* Releases a reference; the kernel is freed with its last one. */
void aj_kernel_destroy(aj_kernel *kernel);

/* One compile of a batch: fill `op`; aj_compile_many fills the rest. */
typedef struct aj_compile_job {
    const aj_op *op;
    aj_kernel *kernel;       /* out: the caller releases it */
    aj_status status;        /* out */
    char message[512];       /* out: this job's error text, "" on success */
} aj_compile_job;

/* Compiles `n` ops on `workers` threads (0: one per core), one LLVM context
 * per compile, results in request order.  With options->device a cuda
 * device, each kernel is also loaded there on its worker: its cubin from
 * the disk cache, else the driver's PTX JIT (stored for later runs), so
 * first launches do not pay it.  A bad op fails alone, with its
 * own status and message.  Returns AJ_OK when every job succeeded, else
 * the status of the first failing job (the context's message counts the
 * failures).  The ops must not be changed while this runs. */
aj_status aj_compile_many(aj_ctx *ctx, aj_compile_job *jobs, size_t n,
                          const aj_compile_options *options, int workers);

/* Kernel cache counters of a context. */
typedef struct aj_cache_stats {
    uint64_t memory_hits, disk_hits, misses, disk_writes;
    uint64_t corrupt_entries;    /* discarded and rebuilt */
    uint64_t evictions;          /* disk entries removed by the size cap */
    bool disk_enabled;           /* false: memory only (by choice or fallback) */
    char disk_dir[512];
} aj_cache_stats;

aj_status aj_cache_get_stats(aj_ctx *ctx, aj_cache_stats *out);

/* Keeps at most max_kernels (>= 1) kernels in ctx's memory cache from now
 * on (aj_ctx_config.cache_max_kernels at creation), releasing the least
 * recently used beyond it at once.  AJ_ERR_INVALID_ARG for 0. */
aj_status aj_cache_set_max_kernels(aj_ctx *ctx, uint64_t max_kernels);

/* The emitted code (PTX or LLVM IR text, NUL-terminated; or bitcode); owned
 * by the kernel.  *size excludes the terminating NUL. */
const void *aj_kernel_code(const aj_kernel *kernel, size_t *size);
aj_emit aj_kernel_emit(const aj_kernel *kernel);
aj_target aj_kernel_target(const aj_kernel *kernel);
/* Stage 0's kernel function's symbol name; owned by the kernel. */
const char *aj_kernel_entry(const aj_kernel *kernel);

/* What a grid dimension counts: ceil(extent / per_block) CTAs. */
typedef enum aj_extent {
    AJ_EXTENT_ONE = 0,
    AJ_EXTENT_BATCH = 1,
    AJ_EXTENT_HEADS_Q = 2,
    AJ_EXTENT_HEADS_KV = 3,
    AJ_EXTENT_SEQ_Q = 4,
    AJ_EXTENT_SEQ_K = 5,
    AJ_EXTENT_SPLITS = 6,      /* layout = paged: the split-KV parts of a launch */
    /* gradients of side tensors (docs/api.md "Gradients of side
     * tensors"): the parts per (b, h) a launch sums in, and the elements
     * of the grad tensor one sum launch writes */
    AJ_EXTENT_DSIDE_PARTS = 7,
    AJ_EXTENT_DSIDE_ELEMENTS = 8,
    AJ_EXTENT_COUNT
} aj_extent;

/* The extent's name ("1", "batch", "heads_q", ..., "dside_elements"),
 * "?" for a value out of range. */
const char *aj_extent_name(aj_extent e);

typedef struct aj_grid_dim {
    aj_extent extent;
    int32_t per_block;
} aj_grid_dim;

typedef enum aj_param_type {
    AJ_PARAM_PTR = 0,      /* 64-bit global pointer */
    AJ_PARAM_I32 = 1,
    AJ_PARAM_I64 = 2,
    AJ_PARAM_F32 = 3,
    /* AJ_BYVAL_BYTES bytes passed by value, AJ_BYVAL_ALIGN-byte aligned: a
     * descriptor encoded from a tensor at each launch, as a Hopper TMA
     * CUtensorMap embeds the tensor's address, shape and strides
     * (aj_kernel_encode_param) */
    AJ_PARAM_BYVAL128 = 4,
    AJ_PARAM_COUNT
} aj_param_type;

#define AJ_BYVAL_BYTES 128
#define AJ_BYVAL_ALIGN 64

typedef struct aj_param_info {
    const char *name;      /* "q", "stride_q_b", ...; owned by the kernel */
    aj_param_type type;
} aj_param_info;

/* What a kernel parameter is (aj_op_kernel_params). */
typedef enum aj_param_role {
    AJ_ROLE_INPUT = 0,     /* a tensor the kernel reads (side tensors too) */
    AJ_ROLE_OUTPUT = 1,    /* a tensor it writes */
    AJ_ROLE_INOUT = 2,     /* a tensor it reads and writes (o_acc, lse of accumulate) */
    AJ_ROLE_WORKSPACE = 3, /* scratch the launch allocates (aj_backward_workspace_size) */
    AJ_ROLE_INDEX = 4,     /* int32 offsets: cu_seqlens_q, cu_seqlens_k */
    AJ_ROLE_STRIDE = 5,    /* a tensor's stride, in elements */
    AJ_ROLE_SIZE = 6,      /* a problem size (heads_q, seq_q) or a tensor's size */
    AJ_ROLE_OFFSET = 7,    /* a position or element offset (q_offset, kv_offset) */
    AJ_ROLE_SEED = 8,      /* dropout's seed and offset */
    AJ_ROLE_TOTAL = 9,     /* a total length (sq_total, seq_q_total) */
    AJ_ROLE_TENSOR_MAP = 10, /* a TMA tensor map of a tensor, by value: the launch
                              * encodes it (aj_kernel_encode_param) */
    AJ_ROLE_MODE = 11,     /* a launch-time choice: `tma`, 1 where the tensor maps
                            * are valid, 0 where the kernel loads by cp.async */
    AJ_ROLE_COUNT
} aj_param_role;

/* One kernel parameter as the parameter table (templates/params.def)
 * describes it. */
typedef struct aj_param_desc {
    char name[48];         /* "q", "stride_q_b", "doc_size0", ... */
    aj_param_type type;
    aj_param_role role;
    char tensor[32];       /* the tensor a pointer, stride or size belongs to
                              ("q", a side tensor's name); "" for a scalar */
    int32_t dim;           /* the dim of a stride or tensor size, else -1 */
} aj_param_desc;

/*
 * The parameters, in call order, of stage `stage` of the kernel that
 * aj_compile would build for `op` on `target`: what aj_kernel_stage_info
 * reports after the compile, known without compiling, so that a binding
 * (the Python layer, an embedding compiler) can be written by name.  Fills
 * params[0 .. min(*count, cap) - 1] and sets *count to the number of
 * parameters; num_stages (may be NULL) gets the kernel's stage count.
 * AJ_ERR_INVALID_ARG for a NULL op or count, params NULL with cap > 0, or
 * a stage outside 0 .. num_stages - 1; AJ_ERR_UNSUPPORTED when no template
 * implements the op on the target; an op that does not verify returns
 * aj_op_verify's status (its message on the op's context).
 */
aj_status aj_op_kernel_params(aj_ctx *ctx, const aj_op *op, aj_target target, int32_t stage,
                              aj_param_desc *params, int32_t cap, int32_t *count,
                              int32_t *num_stages);

typedef struct aj_launch_info {
    int32_t block[3];          /* threads per CTA */
    aj_grid_dim grid[3];       /* x, y, z */
    int32_t dynamic_smem;      /* bytes of dynamic shared memory */
    int32_t num_params;
    const aj_param_info *params;  /* owned by the kernel, in call order */
    aj_schedule schedule;      /* the resolved schedule */
} aj_launch_info;

/* Stage 0's launch contract.  AJ_ERR_INVALID_ARG if kernel or out is
 * NULL. */
aj_status aj_kernel_launch_info(const aj_kernel *kernel, aj_launch_info *out);

/* A kernel is one module holding one or more kernel functions ("stages")
 * that a launch runs in order on one stream: forward and merge ops have
 * one; an efficient backward has two (dK/dV, then dQ).  The number of
 * stages (0 for NULL). */
int32_t aj_kernel_num_stages(const aj_kernel *kernel);
/* Stage `stage`'s launch contract; AJ_ERR_INVALID_ARG for a NULL kernel or
 * out, or a stage outside 0 .. num_stages - 1. */
aj_status aj_kernel_stage_info(const aj_kernel *kernel, int32_t stage, aj_launch_info *out);
/* Stage `stage`'s symbol name (owned by the kernel), or NULL as above. */
const char *aj_kernel_stage_entry(const aj_kernel *kernel, int32_t stage);
/* Which launches run a stage.  A kernel's stages run in order, except
 * where it has two plans of which a launch runs one: the cpu backward's
 * split stages (dK and dV, then dQ) or its fused stage, which aj_backward
 * chooses per call (docs/cpu.md "The backward"; both give the same bits).
 * An op that cannot fuse keeps the fused stage's place, never run. */
typedef enum aj_stage_plan {
    AJ_STAGE_EVERY = 0,   /* run by every launch */
    AJ_STAGE_SPLIT = 1,   /* run unless the launch fuses */
    AJ_STAGE_FUSED = 2,   /* run instead of the split stages */
    AJ_STAGE_UNUSED = 3,  /* never run */
} aj_stage_plan;
/* Stage `stage`'s plan, or -1 for a NULL kernel or a stage outside
 * 0 .. num_stages - 1. */
int32_t aj_kernel_stage_plan(const aj_kernel *kernel, int32_t stage);

/* Where a compile spent its time (wall clock, milliseconds). */
typedef struct aj_compile_stats {
    double build_ms;      /* template writes the LLVM IR */
    double verify_ms;     /* LLVM module verifier */
    double optimize_ms;   /* IR pass pipeline */
    double emit_ms;       /* instruction selection and PTX / bitcode output */
    int32_t ir_instructions;  /* LLVM instructions after optimisation */
} aj_compile_stats;

/* AJ_ERR_INVALID_ARG if kernel or out is NULL. */
aj_status aj_kernel_compile_stats(const aj_kernel *kernel, aj_compile_stats *out);

/* ---------------------------------------------------------------- devices */

typedef enum aj_device_kind {
    AJ_DEVICE_SIM = 0,     /* the SIMT emulator: runs `sim` kernels on the host */
    AJ_DEVICE_CUDA = 1,    /* an NVIDIA GPU through the CUDA driver */
    AJ_DEVICE_CPU = 2,     /* the host's cores: runs `cpu` kernels on a thread pool */
    AJ_DEVICE_KIND_COUNT
} aj_device_kind;

/* Where kernels run.  A device keeps a pointer to ctx, which must outlive
 * it. */
typedef struct aj_device aj_device;

/* Opens device `index` of a kind.  AJ_ERR_NO_DEVICE, with a message saying
 * what is missing, where there is no such device (no CUDA driver, no GPU,
 * a GPU older than sm_80).  A CUDA device uses the GPU's primary context. */
aj_status aj_device_open(aj_ctx *ctx, aj_device_kind kind, int index, aj_device **out);
/* A CUDA device on the caller's own context (a CUcontext, which must
 * outlive the device); attnjit pushes and pops it around its calls. */
aj_status aj_device_open_context(aj_ctx *ctx, void *cu_context, aj_device **out);
void aj_device_close(aj_device *dev);
/* The compile target of the device's kernels: AJ_TARGET_SIM for sim;
 * AJ_TARGET_CPU for cpu; sm_80 for a compute-capability 8.x GPU, sm_90 for
 * 9.0 and later. */
aj_target aj_device_target(const aj_device *dev);
/* "sim", the host CPU's name (LLVM's, "znver3") for cpu, or the GPU's
 * name; owned by the device. */
const char *aj_device_name(const aj_device *dev);

/* Memory on the device (host memory, 64-byte aligned, for sim and cpu). */
aj_status aj_device_alloc(aj_device *dev, size_t bytes, void **out);
aj_status aj_device_free(aj_device *dev, void *ptr);
aj_status aj_device_copy_to(aj_device *dev, void *dst, const void *host_src, size_t bytes);
aj_status aj_device_copy_from(aj_device *dev, void *host_dst, const void *src, size_t bytes);
/* Waits for the work queued on `stream` (a CUstream; NULL: all of it).
 * cuda: then reports, as AJ_ERR_INVALID_ARG, bad cu_seqlens a varlen
 * kernel found since the last report (docs/ir.md, "varlen"). */
aj_status aj_device_synchronize(aj_device *dev, void *stream);
/* sim: host threads that run CTAs; cpu: the thread pool's size, the
 * threads that run a launch's work items (0, the default: the cores this
 * process may run on); ignored for cuda. */
aj_status aj_device_set_workers(aj_device *dev, int workers);
/* cpu: the threads a launch runs on (the set count, or what 0 resolves
 * to); 0 for other devices and NULL. */
int aj_device_workers(const aj_device *dev);
/* cpu: whose threads run a launch's work items (docs/cpu.md "Whose
 * threads").  AJ_CPU_THREADS_POOL, the default: the device's own pool.
 * AJ_CPU_THREADS_OPENMP: the OpenMP runtime the process has loaded, as a
 * framework such as PyTorch loads it (attnjit never loads one): each
 * launch is a parallel region of the set workers (0: the runtime's own
 * team size, which follows omp_set_num_threads in the calling thread), so
 * the framework's threads, awake and spinning after its own operators,
 * run the items instead of competing with the pool for the cores; items
 * whose stack buffers an OpenMP thread's stack has no room for run on the
 * pool.  Results are the same bits either way.  AJ_ERR_UNSUPPORTED where
 * no OpenMP runtime is loaded, or for a device other than cpu. */
typedef enum aj_cpu_threads {
    AJ_CPU_THREADS_POOL = 0,
    AJ_CPU_THREADS_OPENMP = 1
} aj_cpu_threads;
aj_status aj_device_set_cpu_threads(aj_device *dev, aj_cpu_threads threads);
/* The setting (AJ_CPU_THREADS_POOL for other devices and NULL). */
aj_cpu_threads aj_device_cpu_threads(const aj_device *dev);
/* sim: emulated thread-instructions of the last launch (LLVM IR
 * instructions executed, summed over GPU threads); 0 elsewhere. */
uint64_t aj_device_last_instructions(const aj_device *dev);

/* Streams: a stream of the device's own, for the work of aj_forward /
 * aj_backward / aj_merge (args->stream) and aj_device_synchronize.  cuda:
 * a non-blocking CUstream (ordered with nothing else: not the legacy
 * default stream); sim and cpu run every call to completion, so their
 * stream is NULL.  aj_device_stream_destroy lets queued work finish. */
aj_status aj_device_stream_create(aj_device *dev, void **stream);
void aj_device_stream_destroy(aj_device *dev, void *stream);
/* The device time, in *ms, of the work run(user) queues on `stream`:
 * between two CUDA events on cuda (waiting for the second), the wall
 * clock around the call on sim and cpu.  run's failure is returned. */
aj_status aj_device_time(aj_device *dev, void *stream, aj_status (*run)(void *user),
                         void *user, double *ms);

/* What a device kind is and what a device of it can do, so callers ask
 * instead of checking the kind (docs/api.md, "Devices and launches").
 * Versioned: start from AJ_DEVICE_CAPS_INIT. */
typedef struct aj_device_caps {
    size_t struct_size;
    aj_device_kind kind;
    const char *kind_name;        /* "sim", "cuda", "cpu" (static) */
    aj_target target;             /* its kernels' target; AJ_TARGET_ANY for a
                                     cuda kind not opened (it is the GPU's) */
    bool host_memory;             /* device memory is host memory the caller may
                                     read and write directly */
    bool streams;                 /* calls queue work on streams and return
                                     before it is done; false: every call runs
                                     to completion (streams are NULL) */
    bool indexed;                 /* a host may have several, by index (one per
                                     GPU); false: index 0 only */
    bool simt;                    /* kernels run as blocks of warps: schedules
                                     have warps and pipeline stages */
    bool worker_threads;          /* runs on host threads: aj_device_set_workers
                                     sets how many, aj_tune tunes the count */
    bool counts_instructions;     /* aj_device_last_instructions counts */
    int32_t max_shared_bytes;     /* shared memory a block may use (the opt-in
                                     maximum on cuda); 0: no shared memory */
    int32_t multiprocessors;      /* SMs (cuda), cores this process may use
                                     (cpu, sim's default workers); 0 unopened */
    int32_t cc_major, cc_minor;   /* compute capability (cuda), else 0 */
    int32_t driver_version;       /* cuDriverGetVersion (cuda, 13000 = 13.0), else 0 */
} aj_device_caps;

#define AJ_DEVICE_CAPS_INIT { .struct_size = sizeof(aj_device_caps) }

/* dev's capabilities.  AJ_ERR_INVALID_ARG for a NULL dev or caps, or a
 * struct_size smaller than this, the struct's first version; a newer,
 * larger struct keeps its struct_size and has the fields it adds zeroed. */
aj_status aj_device_get_caps(const aj_device *dev, aj_device_caps *caps);
/* A kind's capabilities without opening a device (what depends on the
 * device itself is 0); AJ_ERR_INVALID_ARG for a value that is not a kind. */
aj_status aj_device_kind_caps(aj_device_kind kind, aj_device_caps *caps);
/* "sim", "cuda", "cpu"; NULL for a value that is not a kind. */
const char *aj_device_kind_name(aj_device_kind kind);

/* ---------------------------------------------------------------- launch */

/* A strided view of memory the caller owns: device memory for cuda, host
 * memory for sim.  Strides are in elements; the last dimension must have
 * stride 1. */
typedef struct aj_tensor {
    void *data;
    aj_dtype dtype;
    int32_t rank;
    int64_t shape[4];
    int64_t strides[4];
} aj_tensor;

/* The tile classes of a launch (aj_block_mask_create, below). */
typedef struct aj_block_mask aj_block_mask;

/* Arguments of a forward pass.  Shapes (BHSD, as PyTorch SDPA):
 *   q [B, Hq, Sq, D]    k [B, Hkv, Sk, D]    v [B, Hkv, Sk, Dv]
 *   o [B, Hq, Sq, Dv]   lse [B, Hq, Sq] (f32)
 *   alibi_slopes [Hq] (f32), only for ops with score_mod = alibi.
 *   bias [B or 1, Hq or 1, Sq, Sk] (the op's dtype), only for ops with
 *     bias = add: added to the scaled score before softcap; a dim of size
 *     1 broadcasts (its stride is ignored).  No alignment needed.
 *   o_acc [B, Hq, Sq, Dv] (f32), only for ops with accumulate = true,
 *     which read it and lse as a prior partial result (O normalised, LSE
 *     natural log; a row with LSE = -inf is empty, whatever its O holds)
 *     and overwrite both with the log-sum-exp merge of the prior and this
 *     call's keys (docs/design.md "Merge of two partials").  Chaining calls over
 *     disjoint key blocks (each with its kv_offset) from lse = -inf gives
 *     the result of one call over all keys.  `o` is unused then.
 * q, k, v, o and o_acc have their dtype's data and batch, head and
 * sequence strides 16-byte aligned; Hq % Hkv == 0; Sq, Sk < 2^30.
 * Start from AJ_FWD_ARGS_INIT. */
typedef struct aj_fwd_args {
    size_t struct_size;
    aj_tensor q, k, v, o, lse;
    aj_tensor alibi_slopes;
    int64_t q_offset, kv_offset;   /* global positions of row 0 and key 0 */
    int64_t sq_total, sk_total;    /* bottom_right alignment; 0: Sq and Sk */
    void *stream;                  /* cuda: a CUstream; NULL: the default */
    aj_tensor bias;                /* bias = add only */
    aj_tensor o_acc;               /* accumulate only */
    /* The dropout stream (ops with dropout > 0): element (b, h, i, j) is
     * kept iff Philox4x32-10 with key (lo32(seed), hi32(seed) ^
     * hi32(offset)) and counter (lo32(kv_pos), lo32(q_pos), lo32(b Hq + h),
     * lo32(offset)) gives out[0] with (out[0] >> 8) 2^-24 >= p; kept values
     * are scaled by 1 / (1 - p).  Any values; the backward pass must get
     * the same ones. */
    uint64_t seed, offset;
    /* layout = varlen only.  Sequences are packed: q [Tq, Hq, D],
     * k [Tk, Hkv, D], v [Tk, Hkv, Dv], o and o_acc [Tq, Hq, Dv], lse
     * [Hq, Tq]; sequence b owns rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]-1
     * of q and keys cu_seqlens_k[b] .. cu_seqlens_k[b+1]-1 of k and v.
     * cu_seqlens_* are int32 arrays of batch + 1 entries in device memory,
     * starting at 0, non-decreasing, ending at Tq (Tk).  max_seqlen_q and
     * max_seqlen_k bound every sequence's length (they size the grid).
     * Masks, offsets and totals apply per sequence (q_offset, kv_offset as
     * in the padded layout; sq_total, sk_total of 0 mean each sequence's
     * own lengths).  Must be NULL / 0 for padded kernels. */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int32_t batch;
    int32_t max_seqlen_q, max_seqlen_k;
    /* The op's side tensors (`tensors = (...)`), one per declaration, in
     * any order; NULL / 0 for ops that declare none. */
    const aj_side_tensor *side;
    int32_t num_side;
    /* Optional (added in version 2; a smaller struct has none): the tile
     * classes of this launch (aj_block_mask_create), for an op whose mask
     * interval arithmetic cannot class (docs/ir.md, "Block sparsity").
     * NULL: such a launch builds one itself, each call.  Ignored by ops
     * that need none. */
    const aj_block_mask *block_mask;
    /* Version 3.  layout = paged only (docs/ir.md "paged"); k and v stay empty, q, o
     * and lse are padded [B, Hq, Sq, D], [B, Hq, Sq, Dv], [B, Hq, Sq].
     * k_cache [num_pages, page_size, Hkv, D] and v_cache [num_pages,
     * page_size, Hkv, Dv] of the op's kv_dtype (any strides, unit last);
     * block_table: int32 [B, max_pages], contiguous, row b the pages of
     * sequence b in order; seqlens_k: int32 [B], sequence b's keys (0 ..
     * max_pages page_size); all in device memory.  The queries are the
     * last Sq positions of their sequence.  k_scale, v_scale: f32 tensors
     * of one element (or, since version 6, one per KV head) that the
     * stored K and V are multiplied by, f8 kv_dtype only (required there;
     * padded and varlen f8 ops take them too).  A bad page index or length is
     * found by the kernel (AJ_ERR_INVALID_ARG naming the sequence, as
     * varlen's offsets).  q_offset, kv_offset and the totals must be 0.
     * q_layout = varlen (chunked prefill): q [T, Hq, D], o [T, Hq, Dv], lse
     * [Hq, T] packed as layout = varlen's, with cu_seqlens_q (batch + 1
     * entries), batch and max_seqlen_q (0: T); sequence b's queries are
     * the last cu_seqlens_q[b + 1] - cu_seqlens_q[b] (at most seqlens_k[b])
     * of its positions, checked by the kernel. */
    aj_tensor k_cache, v_cache;
    const int32_t *block_table;
    int32_t max_pages;
    const int32_t *seqlens_k;
    aj_tensor k_scale, v_scale;
    /* Version 4: a head shard (as method = ulysses runs): the call's
     * heads are heads head_offset .. head_offset + Hq - 1 of an op over
     * heads_q_total query heads, so the mask's and score_mod's h (alibi's
     * slopes[h] too) is head_offset + the call's head, and dropout's
     * counter holds b heads_q_total + head_offset + h: the call computes
     * exactly those heads of the unsharded op.  heads_q_total = 0 means
     * Hq (head_offset 0); else head_offset >= 0 and head_offset + Hq <=
     * heads_q_total, and alibi_slopes has heads_q_total entries.  Read
     * only by ops with dropout or whose programs read h. */
    int64_t head_offset, heads_q_total;
    /* Version 5: non-zero asks the launch to prove, by interval
     * arithmetic over its positions, heads and batch and the side
     * tensors' shapes, that no load of the op's expressions can leave its
     * tensor (a load outside reads 0: docs/ir.md "Side tensors in
     * bounds"); one that may is AJ_ERR_INVALID_ARG naming the tensor and
     * the index's range, unless its index is guarded (clamp, min / max, a
     * select or && on a bound).  0: the rule alone, as before.  Padded
     * and varlen kernels compiled here (not loaded from bytes). */
    int32_t check_side_bounds;
    /* Version 6: FP8 inputs (docs/ir.md "FP8 inputs").  An op whose
     * q_dtype is f8 reads q as 8-bit floats and multiplies them by q_scale
     * (f32, [1]: per tensor, or [Hq]: per query head; required there); an
     * f8 kv_dtype on a padded or varlen op, k and v by k_scale and v_scale
     * (above; [1] or [Hkv], per KV head; paged caches too).  Each scales
     * what it multiplies exactly: scores use q_scale[h] k_scale[h / G]
     * q.k, outputs v_scale[h / G] P V. */
    aj_tensor q_scale;
} aj_fwd_args;

#define AJ_FWD_ARGS_INIT { .struct_size = sizeof(aj_fwd_args) }

/* Runs a compiled forward kernel on the device.  Every argument is checked
 * first; a wrong one gives AJ_ERR_INVALID_ARG naming it ("k.shape[1] = 3:
 * ..."). */
aj_status aj_forward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                     const aj_fwd_args *args);

/*
 * Tile classes (docs/ir.md, "Block sparsity").  A kernel cuts the
 * attention matrix of each (batch, head) into tiles of block_m query rows
 * by block_n keys (its schedule) and classifies each by its mask, with the
 * rule of templates/score.h (interval arithmetic over the tile's positions
 * and the side tensors' values): skipped tiles are never visited, full
 * tiles run without per-element mask tests.  A block mask holds the classes
 * of every tile of a launch, for a padded forward op, its sizes, offsets,
 * totals and side tensors (aj_fwd_args), exact (tiles the intervals leave
 * partial are tested element by element), built and kept on its device.
 * Kernels of masks the intervals cannot class from positions (loads,
 * products of positions) read it: pass it in aj_fwd_args.block_mask and
 * aj_bwd_args.block_mask, for every call with those arguments (a launch
 * given none builds its own); others classify their tiles themselves.
 * It can be kept for as long as the side tensors keep their values.
 */
typedef enum aj_tile_class {
    AJ_TILE_SKIP = 0,      /* no element visible: not visited */
    AJ_TILE_PARTIAL = 1,   /* some may be: each element tested */
    AJ_TILE_FULL = 2,      /* every element (inside the lengths) visible */
    AJ_TILE_CLASS_COUNT
} aj_tile_class;

typedef struct aj_tile_counts {
    int64_t tiles[AJ_TILE_CLASS_COUNT];   /* by aj_tile_class */
    int32_t block_m, block_n;             /* the kernel's tile */
} aj_tile_counts;

/* Classifies the tiles of kernel (compiled from op, a padded forward) for
 * a launch with `args` on dev: a generated kernel queued on args->stream
 * reads the side tensors in place and leaves the classes on the device
 * for the kernels.  *out is freed with aj_block_mask_destroy, after the
 * last launch that reads it. */
aj_status aj_block_mask_create(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                               const aj_kernel *kernel, const aj_fwd_args *args,
                               aj_block_mask **out);
void aj_block_mask_destroy(aj_block_mask *mask);
/* How many tiles of each class, over every (batch, head).  The first
 * query (this or aj_block_mask_class) waits for the build and copies the
 * classes to the host, once; queries of one mask are thread-safe. */
aj_status aj_block_mask_counts(const aj_block_mask *mask, aj_tile_counts *out);
/* The class of the tile of query block m and key block n of (b, h). */
aj_status aj_block_mask_class(const aj_block_mask *mask, int64_t b, int64_t h, int64_t m,
                              int64_t n, aj_tile_class *out);
/* The list the kernels walk (docs/ir.md, "Block sparsity"): the
 * non-skip tiles of query block `index` of (b, h) (by_keys: its key
 * blocks, rising, as the forward and dQ visit them) or of key block
 * `index` (!by_keys: its query blocks, as dK/dV visit them).  *count gets
 * their number; the first `cap` go into blocks[] and classes[] (either
 * may be NULL).  The same read-back as aj_block_mask_counts. */
aj_status aj_block_mask_list(const aj_block_mask *mask, int64_t b, int64_t h, int by_keys,
                             int64_t index, int64_t *blocks, aj_tile_class *classes,
                             int64_t cap, int64_t *count);

/* Arguments of a backward pass (kernels of `attention backward efficient`
 * and `attention backward flash`).
 * Shapes as aj_fwd_args:
 *   q [B, Hq, Sq, D]    k [B, Hkv, Sk, D]    v [B, Hkv, Sk, Dv]
 *   o, do [B, Hq, Sq, Dv]   lse [B, Hq, Sq] (f32): the forward's O and LSE
 *     and the gradient of the loss with respect to O
 *   dq (q's shape), dk (k's), dv (v's): outputs, overwritten; with GQA dk
 *     and dv sum over the query heads of each group
 *   alibi_slopes [Hq] (f32), only for ops with score_mod = alibi.
 *   bias (bias = add only): the forward's bias, [B or 1, Hq or 1, Sq, Sk]
 *     in the op's dtype, size-1 dims broadcast as in aj_forward.
 *   dbias (bias = add only): output, overwritten, f32 (whatever the op's
 *     dtype), of bias's shape: the gradient of the pre-softcap score summed
 *     over bias's broadcast dims; contiguous in its last dim (no alignment
 *     needed).  Deterministic: no atomics.
 *   seed, offset (dropout > 0 only): the dropout stream; they must equal
 *     the forward's aj_fwd_args seed and offset, so that the backward
 *     recomputes the same keep mask.
 * Rows that see no key get dq = 0; keys no row sees get dk = dv = 0.
 * The tensors have their dtype's data and batch, head and sequence strides
 * 16-byte aligned; outputs must not overlap inputs or each other;
 * Hq % Hkv == 0; Sq, Sk < 2^30.  The result is deterministic (no atomics),
 * except for flash kernels with deterministic = false, whose dq sums its
 * parts by f32 atomic adds (dk and dv stay deterministic).
 * Start from AJ_BWD_ARGS_INIT. */
typedef struct aj_bwd_args {
    size_t struct_size;
    aj_tensor q, k, v, o, lse, do_;  /* do_: dO (`do` is a C keyword) */
    aj_tensor dq, dk, dv;
    aj_tensor alibi_slopes;
    int64_t q_offset, kv_offset;     /* global positions of row 0 and key 0 */
    int64_t sq_total, sk_total;      /* bottom_right alignment; 0: Sq and Sk */
    void *stream;                    /* cuda: a CUstream; NULL: the default */
    aj_tensor bias, dbias;           /* bias = add only (dbias: f32 output) */
    uint64_t seed, offset;           /* dropout > 0 only: the forward's stream */
    /* layout = varlen only: as in aj_fwd_args (dq, dk, dv, do take the
     * packed shapes of q, k, v and o) */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int32_t batch;
    int32_t max_seqlen_q, max_seqlen_k;
    /* Scratch device memory of the flash backward (Delta and, with
     * deterministic = false, the f32 dQ sums): at least
     * aj_backward_workspace_size() bytes, 16-byte aligned, not overlapping
     * any tensor; its contents on entry do not matter and on return are
     * unspecified.  NULL: the device's own: for cuda a buffer per stream
     * (up to 16 streams at a time) that grows when a call needs more and is
     * reused, in stream order, by later calls -- after the first call of a
     * size nothing is allocated and nothing synchronises, so the call can
     * be captured in a CUDA graph; sim and cpu use host memory of the
     * call's own.
     * Kernels that need none ignore both fields. */
    void *workspace;
    size_t workspace_bytes;
    /* The op's side tensors, as aj_fwd_args.side (no gradient flows to
     * them). */
    const aj_side_tensor *side;
    int32_t num_side;
    /* Optional (version 2): as aj_fwd_args.block_mask; the forward's mask
     * serves (the kernels read it in any tile size). */
    const aj_block_mask *block_mask;
    /* Version 3: a head shard (as method = ulysses runs): the call's
     * heads are heads head_offset .. head_offset + Hq - 1 of an op over
     * heads_q_total query heads, so the mask's and score_mod's h (alibi's
     * slopes[h] too) is head_offset + the call's head, and dropout's
     * counter holds b heads_q_total + head_offset + h: the call computes
     * exactly those heads of the unsharded op.  heads_q_total = 0 means
     * Hq (head_offset 0); else head_offset >= 0 and head_offset + Hq <=
     * heads_q_total, and alibi_slopes has heads_q_total entries.  Read
     * only by ops with dropout or whose programs read h. */
    int64_t head_offset, heads_q_total;
    /* Version 4, ops with sinks only (aj_op_set_sinks): output, f32 [Hq]
     * (any stride), overwritten: dsinks[h] is the gradient of the sink of
     * global head head_offset + h, summed over the batch and the rows in
     * a fixed order (bitwise repeatable, no atomics): -sum_rows exp(sink
     * - lse) dO . O.  lse and o must be the forward's, whose LSE
     * includes the sink.  Empty (NULL data): not computed. */
    aj_tensor dsinks;
    /* Version 4 too: as aj_fwd_args.check_side_bounds. */
    int32_t check_side_bounds;
    /* Version 5, ops with grad side tensors (aj_op_set_tensor_grad):
     * outputs, one per grad tensor wanted, named as declared, f32 of the
     * same rank and shape as that tensor in `side`, any strides >= 0 that
     * do not make two elements one, not overlapping any other tensor.
     * Overwritten with d(loss)/d(tensor): every visible element's term,
     * summed in an order fixed by the shapes (docs/api.md "Gradients of
     * side tensors"), so bitwise repeatable run to run and for any
     * number of threads, without atomics.  The sums take workspace
     * (aj_backward_workspace_size counts it); a call whose sums would
     * take more than 1 GiB is refused.  A grad tensor not named here is
     * not computed. */
    const aj_side_tensor *dside;
    int32_t num_dside;
} aj_bwd_args;

#define AJ_BWD_ARGS_INIT { .struct_size = sizeof(aj_bwd_args) }

/* Runs a compiled backward kernel on the device: its stages in order (on
 * `stream` for cuda).  Every argument is checked first, as by aj_forward
 * ("aj_backward: dk.shape[2] = 5, want 7 (k's length)"). */
aj_status aj_backward(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                      const aj_bwd_args *args);

/* The bytes of workspace aj_backward needs for these arguments (0 for
 * kernels without one, such as the efficient variant's): in *bytes.  The
 * arguments are checked as by aj_backward; the workspace fields are not
 * read. */
aj_status aj_backward_workspace_size(aj_ctx *ctx, const aj_kernel *kernel,
                                     const aj_bwd_args *args, size_t *bytes);

/*
 * The bytes of by-value parameter `index` (type AJ_PARAM_BYVAL128) of
 * stage `stage`, encoded for a launch on `dev` from `tensor` (the tensor
 * the parameter's aj_param_desc names) into out[0 .. AJ_BYVAL_BYTES - 1]
 * (AJ_BYVAL_ALIGN-byte aligned, the caller's).  aj_forward, aj_backward
 * and aj_merge do this at every launch.  The bytes embed the tensor's
 * address, shape and strides: an embedder launching the kernel itself
 * calls this before each launch (again whenever the tensor moves or
 * changes shape) and passes out as the parameter's kernelParams entry.
 * AJ_ERR_INVALID_ARG for a NULL argument, a kernel of another target
 * than dev's, a stage or index outside the kernel's, a parameter of
 * another type, or a misaligned out.
 */
aj_status aj_kernel_encode_param(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                                 int32_t stage, int32_t index, const aj_tensor *tensor,
                                 void *out);

/* Arguments of a merge of two partial results over disjoint key sets
 * (kernels of `attention merge { dtype, head_dim_v }`):
 *   o1, o2, o [B, H, S, Dv] (the op's dtype)   lse1, lse2, lse [B, H, S] (f32)
 * lse = logaddexp(lse1, lse2), o = o1 exp(lse1 - lse) + o2 exp(lse2 - lse);
 * both -inf gives o = 0 and lse = -inf, and a side whose lse is -inf
 * contributes nothing, whatever its o holds.  o may be o1 or o2 and lse
 * may be lse1 or lse2 (in place); other overlaps are not allowed.  o1, o2
 * and o have their data and batch, head and sequence strides 16-byte
 * aligned; S < 2^30.  Start from AJ_MERGE_ARGS_INIT. */
typedef struct aj_merge_args {
    size_t struct_size;
    aj_tensor o1, lse1, o2, lse2, o, lse;
    void *stream;                  /* cuda: a CUstream; NULL: the default */
} aj_merge_args;

#define AJ_MERGE_ARGS_INIT { .struct_size = sizeof(aj_merge_args) }

/* Runs a compiled merge kernel on the device; every argument is checked
 * first, as by aj_forward ("aj_merge: o2.shape[2] = 5, want 7 (o1's
 * length)"). */
aj_status aj_merge(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel,
                   const aj_merge_args *args);

/* ---------------------------------------------------------------- ring */

/* Context parallelism (docs/ring.md): P ranks each hold a shard of the
 * sequence; K/V blocks travel around the ring while the kernels compute,
 * and partial results merge by their log-sum-exp.  Every rank of the
 * communicator makes the same calls in the same order. */

typedef enum aj_comm_kind {
    AJ_COMM_MPI = 0,           /* CPU ranks: MPI nonblocking send/recv */
    AJ_COMM_NCCL = 1,          /* GPUs: NCCL send/recv of device memory in
                                  place, stream-ordered (docs/ring.md) */
    AJ_COMM_KIND_COUNT
} aj_comm_kind;

/* Communicator configuration.  Start from AJ_COMM_CONFIG_INIT. */
typedef struct aj_comm_config {
    size_t struct_size;
    aj_comm_kind kind;
    /* optional: a pointer to the caller's MPI_Comm (MPI must be
     * initialised, with MPI_THREAD_SINGLE or more); NULL: MPI_COMM_WORLD.
     * attnjit duplicates it, so its traffic never matches the caller's.
     * For NCCL without nccl_comm, the communicator over which rank 0
     * broadcasts the NCCL unique id. */
    const void *mpi_comm;
    /* NCCL only, optional: the caller's ncclComm_t (which must outlive
     * the aj_comm); NULL: attnjit creates one over mpi_comm. */
    void *nccl_comm;
    /* NCCL only, optional: the CUstream comm runs on; NULL: attnjit
     * creates one. */
    void *stream;
    /* A peer that does not answer within this many seconds fails the
     * call with AJ_ERR_COMM instead of hanging; 0: 300 s. */
    double timeout_s;
} aj_comm_config;

#define AJ_COMM_CONFIG_INIT \
    { sizeof(aj_comm_config), AJ_COMM_MPI, NULL, NULL, NULL, 0.0 }

typedef struct aj_comm aj_comm;

/* Opens a communicator over the ranks of config->mpi_comm (collective:
 * every rank calls it).  dev is the device the ring's kernels run on
 * (NCCL needs a cuda device; MPI accepts any and stages cuda memory
 * through the host).  AJ_ERR_NO_DEVICE if libnccl.so.2 cannot be loaded;
 * AJ_ERR_COMM if MPI is not initialised or a peer does not join within
 * the timeout.  The NCCL engine has not run on a GPU yet (docs/ring.md);
 * on a timeout or NCCL error it aborts the NCCL communicator, the
 * caller's nccl_comm too, which is otherwise never destroyed.  The comm
 * keeps pointers to ctx and dev, which must outlive it; *out is freed
 * with aj_comm_destroy(). */
aj_status aj_comm_create(aj_ctx *ctx, aj_device *dev, const aj_comm_config *config,
                         aj_comm **out);
/* Frees the comm; requests still in flight after a failure are cancelled.
 * After AJ_ERR_COMM the peers may be out of step: destroy the comm and
 * end the job (MPI_Abort) rather than calling the ring again. */
void aj_comm_destroy(aj_comm *comm);
int aj_comm_rank(const aj_comm *comm);   /* -1 for NULL */
int aj_comm_size(const aj_comm *comm);   /* -1 for NULL */
/* The payload bytes this rank has handed its transport for other ranks
 * since the comm was made (exchanges, collectives and all-to-alls; a
 * rank's part for itself does not count): what the ring and Ulysses move
 * per rank, for the formulas in docs/ring.md.  0 for NULL. */
uint64_t aj_comm_bytes_sent(const aj_comm *comm);
/* The comm's asynchronous calls (aj_ring_forward, "Asynchronous calls"):
 * *pending (may be NULL) gets how many have work not yet done; AJ_OK, or
 * AJ_ERR_COMM with the watchdog's message once one has failed (and every
 * later call and query then fails so). */
aj_status aj_comm_query(aj_comm *comm, int32_t *pending);
/* Waits until the comm's asynchronous calls are done (each within the
 * comm's timeout of being queued), then answers as aj_comm_query. */
aj_status aj_comm_synchronize(aj_comm *comm);

/* How a sequence is split over P ranks.  Any length S: cut into n chunks
 * (n = P contiguous, 2P zigzag), chunk c holds S/n positions, one more for
 * c < S % n (aj_shard_length gives a rank's total). */
typedef enum aj_shard_layout {
    /* rank r holds chunk r: positions [r S/P, (r+1) S/P) when P divides S */
    AJ_SHARD_CONTIGUOUS = 0,
    /* 2P chunks; rank r holds chunks r and 2P-1-r (head and tail), which
     * gives every rank the same causal work */
    AJ_SHARD_ZIGZAG = 1,
    AJ_SHARD_LAYOUT_COUNT
} aj_shard_layout;

/* How many of a `seq`-long sequence's positions rank `rank` of `size`
 * holds (-1 for a bad layout, rank, size or a negative seq). */
int64_t aj_shard_length(aj_shard_layout layout, int rank, int size, int64_t seq);

/* How K/V reach every rank. */
typedef enum aj_ring_rotate {
    AJ_ROTATE_P2P = 0,         /* P-1 neighbour exchanges, overlapped */
    AJ_ROTATE_ALLGATHER = 1,   /* one all-gather of K/V (reduce-scatter of
                                  dK/dV in the backward) */
    AJ_ROTATE_COUNT
} aj_ring_rotate;

/* How the ranks share the attention of a sequence-sharded problem. */
typedef enum aj_cp_method {
    /* K/V blocks travel to every rank (rotate: p2p or all-gather); any
     * length */
    AJ_METHOD_RING = 0,
    /* DeepSpeed Ulysses: an all-to-all turns the sequence shards into
     * head shards of the whole sequence (H_kv / P key/value heads and
     * their query heads per rank), the kernel runs over the whole
     * sequence, and an all-to-all turns the result back.  H_kv must
     * divide by P; any length. */
    AJ_METHOD_ULYSSES = 1,
    /* 2-D (USP): P = U x R ranks, U = ulysses_size.  Ulysses' all-to-all
     * inside each group of U consecutive ranks (H_kv / U heads per rank,
     * the group's positions), and the ring (rotate, overlap, skip rules,
     * layout) across the R groups among the ranks at the same place in
     * theirs.  The library splits the comm itself (MPI_Comm_split,
     * ncclCommSplit) on the first call and keeps the parts on it.  U must
     * divide P and H_kv; any length.  U = P is Ulysses, U = 1 the ring. */
    AJ_METHOD_HYBRID = 2,
    AJ_METHOD_COUNT
} aj_cp_method;

/* A tensor with a sequence dim, seen as [outer, seq, inner] contiguous
 * elements of elem_size bytes: outer is the product of the dims before
 * the sequence dim, inner of those after (BHSD q: outer = B H, seq = S,
 * inner = D; an int32 position buffer [S]: outer = inner = 1). */
typedef struct aj_seq_shape {
    int64_t outer, seq, inner;
    size_t elem_size;
} aj_seq_shape;

/* Copies rank `rank`'s shard of `full` (full->seq positions, any length)
 * into `shard` ([outer, aj_shard_length(...), inner]).  Host memory; the
 * caller owns both. */
aj_status aj_shard(aj_ctx *ctx, aj_shard_layout layout, int rank, int size,
                   const aj_seq_shape *full, const void *src, void *shard);
/* The inverse: writes rank `rank`'s shard back into its positions of
 * `dst` ([outer, full->seq, inner]), leaving the other positions alone. */
aj_status aj_unshard(aj_ctx *ctx, aj_shard_layout layout, int rank, int size,
                     const aj_seq_shape *full, const void *shard, void *dst);

/* One contiguous run of a rank's positions: `len` positions from global
 * position `global`, stored in the shard from local position `local`. */
typedef struct aj_shard_chunk {
    int64_t global, local, len;
} aj_shard_chunk;

/* Rank `rank`'s chunks of a `seq`-long sequence, in local order, into
 * chunks[] (1 contiguous, 2 zigzag) and their number into *num_chunks:
 * the rule aj_shard, aj_unshard and the ring follow, for a caller that
 * moves the positions itself (attnjit.torch.shard).  The ring's rule:
 * AJ_ERR_INVALID_ARG when seq does not split evenly (aj_shard takes any
 * length, with these chunks where it does). */
aj_status aj_shard_get_chunks(aj_ctx *ctx, aj_shard_layout layout, int rank, int size,
                              int64_t seq, aj_shard_chunk chunks[2], int *num_chunks);

/* Packed documents (layout = varlen, docs/ring.md): rank `rank`'s pieces
 * of a batch of `batch` documents (cu_seqlens: int32 [batch + 1], host
 * memory), in local order, into chunks[] (the first min(cap, count)), their
 * number into *count and their total into *length (the rank's shard length
 * of the packed axis).  method = AJ_METHOD_RING cuts every document by the
 * layout (zigzag: each document's 2P chunks, head and tail, so causal work
 * balances per document; at most 2 batch pieces; a document shorter than
 * 2P leaves some ranks none of it), and so does AJ_METHOD_HYBRID (as its
 * padded shards are the ring's: a group of U ranks then holds the head and
 * tail runs of U consecutive chunks of each document); AJ_METHOD_ULYSSES
 * cuts the packed axis (as aj_shard_length).  chunk.global is the packed
 * position. */
aj_status aj_shard_varlen_chunks(aj_ctx *ctx, aj_cp_method method, aj_shard_layout layout,
                                 int rank, int size, const int32_t *cu_seqlens, int32_t batch,
                                 aj_shard_chunk *chunks, int32_t cap, int32_t *count,
                                 int64_t *length);
/* aj_shard and aj_unshard of a packed tensor by those pieces: full->seq is
 * cu_seqlens[batch] (q [T, H, D]: outer 1, inner H D; an LSE [H, T]:
 * outer H, inner 1).  Host memory; the caller owns both. */
aj_status aj_shard_varlen(aj_ctx *ctx, aj_cp_method method, aj_shard_layout layout, int rank,
                          int size, const int32_t *cu_seqlens, int32_t batch,
                          const aj_seq_shape *full, const void *src, void *shard);
aj_status aj_unshard_varlen(aj_ctx *ctx, aj_cp_method method, aj_shard_layout layout, int rank,
                            int size, const int32_t *cu_seqlens, int32_t batch,
                            const aj_seq_shape *full, const void *shard, void *dst);

/* What one ring call did and where its time went (wall clock). */
typedef struct aj_ring_stats {
    int32_t rotations;       /* buffer exchanges with the neighbours (p2p:
                                forward P-1, backward 2P-1; 0 for P = 1)
                                or collectives (all-gather); packed
                                documents over messages: the exchanges
                                this rank posts (docs/ring.md) */
    int32_t launches;        /* kernel launches: full + partial blocks */
    int32_t full_blocks;     /* launched without the mask: all visible */
    int32_t partial_blocks;  /* launched with the mask */
    int32_t skipped_blocks;  /* fully masked: not launched */
    double compile_s;        /* compiling the kernels (0 when cached) */
    double compute_s;        /* kernels and host-side accumulation */
    double comm_s;           /* from posting an exchange to its completion */
    double exposed_comm_s;   /* waiting on comm with nothing to compute */
    double total_s;          /* the whole call, compile included */
} aj_ring_stats;

/* Arguments of a ring forward: this rank's shards, laid out by `layout`
 * (an op with sinks counts each row's sink once, whatever the method:
 * docs/ring.md "Sinks")
 * (q [B, Hq, lq, D], k [B, Hkv, lk, D], v [B, Hkv, lk, Dv], o and lse
 * likewise, with lq = aj_shard_length(layout, rank, P, Sq): any length),
 * in the device's memory.  The totals Sq, Sk are the sums of every rank's
 * lengths; global positions and the bottom_right totals follow.  The
 * op is a padded `attention forward flash` or `efficient` without bias
 * (expressions and side tensors included);
 * the ring compiles its kernels (accumulate = true, masked and unmasked)
 * for the device (its target, and its tuned schedule if aj_tune recorded
 * one) through the context's kernel cache, and the comm keeps them for
 * its later ring calls of the same op (forward and backward, on the
 * comm's own ctx and dev; aj_comm_destroy frees them).  o is written in
 * the op's dtype, lse in f32.  Start from AJ_RING_FWD_ARGS_INIT. */
typedef struct aj_ring_fwd_args {
    size_t struct_size;
    aj_tensor q, k, v, o, lse;
    aj_tensor alibi_slopes;          /* score_mod = alibi only: [Hq] f32 */
    aj_shard_layout layout;
    aj_ring_rotate rotate;
    uint64_t seed, offset;           /* dropout > 0 only */
    /* the op's side tensors (tensors = (...)), by name, in the device's
     * memory: whole, not sharded -- the same on every rank, indexed by
     * global positions as the expressions read them (docs/ring.md).
     * Added in version 2 of the struct: a caller built against the first
     * (struct_size up to rotate's seed and offset) passes none. */
    const aj_side_tensor *side;
    int32_t num_side;
    /* optional (version 2): launch n's tile classes (as aj_block_mask_counts
     * of the launch: the cost of classifying every tile on the host) into
     * launch_tiles[n] for n < launch_tiles_cap, in launch order (this
     * rank's stats.launches of them); NULL: not counted */
    aj_tile_counts *launch_tiles;
    int32_t launch_tiles_cap;
    /* version 3: the method (a caller built against an older struct gets
     * the ring) and the Ulysses degree: ulysses 0 or P (the comm's size),
     * hybrid U (1 .. P, dividing P), ring 0 */
    aj_cp_method method;
    int32_t ulysses_size;
    /* version 4: layout = varlen ops only (docs/ring.md "Packed
     * documents"): the WHOLE packed batch's offsets, int32 [batch + 1]
     * each, in the device's memory, the same on every rank.  q, k, v, o
     * are then this rank's pieces, packed [l, H, D] (aj_shard_varlen with
     * the method), lse [Hq, lq]. */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    int32_t batch;
    /* version 5, optional: the caller's stream (cuda: a CUstream), which
     * orders the call: its work starts after the work queued on stream
     * so far, and work queued on stream after it sees its results.  A
     * call the comm can run on the device alone (aj_ring_forward's
     * "Asynchronous calls") returns once its work is queued; any other
     * waits for stream first and for its results before returning.
     * NULL: the call waits for its results (as before). */
    void *stream;
} aj_ring_fwd_args;

#define AJ_RING_FWD_ARGS_INIT { .struct_size = sizeof(aj_ring_fwd_args) }

/* Runs the forward over the ring; stats may be NULL.  All ranks must pass
 * the same op, shapes, layout, rotate method and dropout stream: the call
 * starts with a small all-gather that compares them, and a difference
 * fails every rank with AJ_ERR_INVALID_ARG naming it.  (A rank that fails
 * its own argument checks before that leaves the others to time out with
 * AJ_ERR_COMM.)
 *
 * Asynchronous calls (docs/ring.md): a call given a stream on cuda ranks
 * over NCCL, padded layout, returning no dsinks or side gradients, queues
 * its work and returns without waiting for it.  It skips the opening
 * all-gather when this rank's call repeats one the ranks agreed on before
 * (one of the comm's last 8 agreements, synchronous calls' included), so
 * such a call never waits on the host: a CUDA graph can capture it.  A
 * failure after it returned -- an NCCL error, or work not done within the
 * comm's timeout of being queued -- is found by the comm's watchdog
 * thread, which aborts the NCCL communicator; the comm's next call,
 * aj_comm_query and aj_comm_synchronize then answer AJ_ERR_COMM.  A rank
 * whose call differs from its peers' where they skip the agreement is
 * found by the timeout, not named. */
aj_status aj_ring_forward(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                          const aj_ring_fwd_args *args, aj_ring_stats *stats);

/* Arguments of a ring backward: the shards of aj_ring_fwd_args plus the
 * forward's o and lse (the ring's, i.e. global), do_, and the outputs dq,
 * dk, dv (shapes of q, k, v, the op's dtype).  dK/dV accumulate in f32
 * while they travel; dQ accumulates locally in f32. */
typedef struct aj_ring_bwd_args {
    size_t struct_size;
    aj_tensor q, k, v, o, lse, do_;
    aj_tensor dq, dk, dv;
    aj_tensor alibi_slopes;
    aj_shard_layout layout;
    aj_ring_rotate rotate;
    uint64_t seed, offset;
    const aj_side_tensor *side;      /* as aj_ring_fwd_args (version 2) */
    int32_t num_side;
    aj_cp_method method;             /* as aj_ring_fwd_args (version 3) */
    int32_t ulysses_size;
    const int32_t *cu_seqlens_q, *cu_seqlens_k;   /* as aj_ring_fwd_args (version 4) */
    int32_t batch;
    /* Version 5, ops with sinks only: output, f32 [Hq] (the op's query
     * heads; any stride), the sinks' gradient over the WHOLE sequence:
     * each rank's rows' part (aj_bwd_args.dsinks) gathered from every
     * rank and summed in rank order, the same on every rank.  Every rank
     * passes one, or none does.  Empty (NULL data): not computed. */
    aj_tensor dsinks;
    /* Version 6, ops with grad side tensors (any layout): outputs as
     * aj_bwd_args.dside (contiguous here), the gradients over the WHOLE
     * sequence: each rank's rows' parts summed in step order, then
     * gathered from every rank and summed in rank order, the same bits on
     * every rank.  Every rank passes the same list, or none does. */
    const aj_side_tensor *dside;
    int32_t num_dside;
    void *stream;                    /* as aj_ring_fwd_args (version 7) */
} aj_ring_bwd_args;

#define AJ_RING_BWD_ARGS_INIT { .struct_size = sizeof(aj_ring_bwd_args) }

/* Runs the backward over the ring (op: `attention backward flash` or
 * `efficient`, matching the forward's fields). */
aj_status aj_ring_backward(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                           const aj_ring_bwd_args *args, aj_ring_stats *stats);

/* What the ring does with one (query chunk, key chunk) pair, from the
 * op's mask at the pair's global positions (the kernels' own tile
 * classes, templates/score_host.c): nothing visible, no launch; everything
 * visible, the op without its mask; else the op. */
typedef enum aj_ring_block {
    AJ_RING_BLOCK_SKIP = 0,
    AJ_RING_BLOCK_FULL = 1,
    AJ_RING_BLOCK_PARTIAL = 2,
    AJ_RING_BLOCK_COUNT
} aj_ring_block;

/* One pair of a ring call, in the order the ring visits them: at ring
 * step `step` this rank holds the K/V block of rank `src`, and computes
 * its query chunk q against that block's key chunk k (q.local is in this
 * rank's shard, k.local in src's; the globals are the launch's q_offset
 * and kv_offset, the totals P seq_q and P seq_k).  A forward merges
 * every launch into its f32 accumulator (accumulate = true), in order.
 * Packed documents: the pair's document `doc` (0 otherwise); its globals
 * are positions in it, its totals the document's lengths, and the locals
 * positions in the packed shards.  (doc sits in what was the struct's
 * tail padding: the size is unchanged.) */
typedef struct aj_ring_pair {
    int32_t step, src;
    aj_shard_chunk q, k;
    aj_ring_block block;
    int32_t doc;
} aj_ring_pair;

/* The facts a ring call's plan depends on.  Start from
 * AJ_RING_PLAN_ARGS_INIT. */
typedef struct aj_ring_plan_args {
    size_t struct_size;
    aj_shard_layout layout;
    aj_ring_rotate rotate;
    int32_t rank, size;              /* this rank of `size` */
    int64_t batch, heads_q;          /* q's B and Hq (masks that read b or h) */
    int64_t seq_q, seq_k;            /* this rank's shard lengths: Sq/P, Sk/P */
    /* optional: as aj_ring_fwd_args, in the memory of aj_ring_plan's dev */
    aj_tensor alibi_slopes;
    const aj_side_tensor *side;
    int32_t num_side;
    /* Version 2 (0 keeps version 1's meaning).  method = hybrid's ring
     * across its groups: `members` ranks (U) make one ring rank; rank and
     * size are then the group's index and the group count R (seq_q, seq_k
     * stay this rank's shard lengths: a group holds U times them), heads_q
     * counts this rank's heads and head_offset is the first one's index
     * among the op's (member m of a group: m Hq/U), by which a mask that
     * reads h is classed.  0 or 1: the ring over every rank. */
    int32_t members;
    int64_t head_offset;
    /* layout = varlen ops: the whole packed batch's offsets, int32
     * [batch + 1] each, in the memory of aj_ring_plan's dev (as
     * aj_ring_fwd_args); batch is then the document count, and seq_q,
     * seq_k are not read (the shards are the documents' pieces,
     * aj_shard_varlen_chunks). */
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
} aj_ring_plan_args;

#define AJ_RING_PLAN_ARGS_INIT { .struct_size = sizeof(aj_ring_plan_args) }

/* The ring's schedule for rank args->rank, as aj_ring_forward and
 * aj_ring_backward follow it: every (query chunk, key chunk) pair of
 * every step (P of them contiguous, 4P zigzag; packed documents: per
 * document, pairs with an empty piece left out), skipped ones included,
 * in order, for a caller that runs the exchange itself
 * (attnjit.torch.ring_attention, hybrid's ring across its groups too).
 * Padded ops need even shards (one rank's lengths give the totals).  op:
 * the forward or backward op as the ring takes it; dev: where the side
 * tensors and offsets are.  Writes the first
 * min(cap, count) pairs to `pairs` (NULL when cap is 0) and the count to
 * *count.  No communication. */
aj_status aj_ring_plan(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                       const aj_ring_plan_args *args, aj_ring_pair *pairs, int32_t cap,
                       int32_t *count);

/* Converts `count` elements between dtypes, rounding to nearest even (as
 * the kernels do; to an f8 dtype saturating at its largest finite, as PTX's
 * cvt.rn.satfinite).  src and dst must not overlap unless they are equal and
 * the element sizes match.  AJ_ERR_INVALID_ARG for a bad dtype or NULL. */
aj_status aj_convert(const void *src, aj_dtype src_dtype, void *dst, aj_dtype dst_dtype,
                     size_t count);

/* Bytes per element of a dtype: 4, 2 or 1 (the f8 dtypes); 0 for a value
 * outside the enum. */
int aj_dtype_size(aj_dtype dtype);

/* ---------------------------------------------------------------- tuning */

/* The problem a tuning run times, and how.  Start from AJ_TUNE_OPTIONS_INIT;
 * a field of 0 takes the default named beside it. */
typedef struct aj_tune_options {
    size_t struct_size;
    /* problem size; defaults per device: cuda B 4, Hq 16, S 4096; cpu B 1,
     * Hq 8, S 2048; sim B 1, Hq 2, S 128 (the emulator is slow).  Hkv
     * defaults to Hq, Sk to Sq. */
    int32_t batch, heads_q, heads_kv, seq_q, seq_k;
    double budget_s;          /* wall-clock budget; 0: none.  Candidates not
                                 timed when it runs out are reported so */
    int32_t warmup;           /* untimed runs per candidate; 0: 1 */
    int32_t repeats;          /* timed runs per candidate (median); 0: 5 */
    int32_t compile_workers;  /* threads compiling candidates; 0: one per core */
    bool no_persist;          /* true: do not write the tuning database */
    /* optional: called after each candidate is compiled or timed */
    void (*progress)(void *user, int32_t done, int32_t total, const char *what);
    void *progress_user;
    /* 1: the flash templates' Hopper kernels (schedule warpgroups,
     * producer; docs/gpu.md) among the candidates of a flash op that sets
     * no warpgroups, where the device runs them (a 9.0 GPU: sm_90a code;
     * sim).  0 (the default): not -- no GPU has run them yet, and the
     * tuner times candidates without checking their output */
    int32_t wgmma;
} aj_tune_options;

#define AJ_TUNE_OPTIONS_INIT { .struct_size = sizeof(aj_tune_options) }

/* One candidate of a tuning run. */
typedef struct aj_tune_result {
    aj_schedule requested;    /* the schedule tried (0 fields: template default) */
    aj_schedule schedule;     /* what the template resolved it to */
    int32_t workers;          /* cpu: threads it ran on; 0 elsewhere */
    aj_status status;         /* AJ_OK unless pruned; else why it was */
    bool timed;               /* false: pruned, or left out by the budget */
    char message[256];        /* "" when timed; else the reason */
    double median_ms, min_ms; /* timed candidates only */
    bool is_default;          /* the template's default schedule */
    /* the wgmma kernels' warpgroups and producer (aj_op_set_warpgroups,
     * aj_op_set_producer; 0: mma.sync).  They sit in what was the struct's
     * tail padding, so its size is the first version's: arrays from and
     * for either header have the same stride. */
    int8_t warpgroups, producer;
} aj_tune_result;

/* Tunes an op's schedule on a device: builds the template's configuration
 * space (block_m, block_n, warps, stages; on cpu also the thread count),
 * prunes what the template rejects (AJ_ERR_UNSUPPORTED, with its message)
 * and, on a GPU, what the driver reports as spilling or over its limits;
 * compiles the rest in parallel; times each on the device with random
 * inputs (cuda: CUDA events; cpu and sim: wall clock), median of
 * `repeats` after `warmup`; and, unless no_persist, records the fastest in
 * the tuning database under the context's cache directory, keyed by the
 * op's hash, the device's name and its driver version.  A later
 * aj_compile of the same op with aj_compile_options.device set to such a
 * device picks that schedule.  *results (released with aj_free) lists
 * every candidate, timed ones first, fastest first; *count their number.
 * Forward and backward ops with layout = padded only.  With options->wgmma
 * (above), a flash op's space also holds the wgmma kernels: warpgroups 1
 * and 2, producer 0 and 1 (forward), their block_n (forward) or block_m
 * (backward) and stages; the winner's warpgroups go into the database
 * with its schedule, and aj_compile of the op (no warpgroups of its own)
 * for the device then compiles that kernel (sm_90a on a 9.0 GPU).  Every
 * candidate that runs wgmma (those, an op's own warpgroups, FP8 flash
 * forwards) is compiled for sm_90a where the device runs it, as aj_compile
 * does.  AJ_OK if at least one candidate was timed. */
aj_status aj_tune(aj_ctx *ctx, struct aj_device *dev, const aj_op *op,
                  const aj_tune_options *options, aj_tune_result **results, int32_t *count);

/* The tuning database's schedule for op on dev: AJ_OK and *schedule (and
 * *workers, may be NULL, the cpu thread count) if one is recorded;
 * AJ_ERR_IO if none is (or the database is off: cache mode memory or
 * off).  Where a wgmma kernel won, the schedule alone is not the kernel
 * (its warpgroups and producer are not in it): aj_tune_lookup_result has
 * them. */
aj_status aj_tune_lookup(aj_ctx *ctx, const struct aj_device *dev, const aj_op *op,
                         aj_schedule *schedule, int32_t *workers);
/* The same record whole, as the result row that won: its requested
 * schedule, workers, warpgroups and producer, median_ms, timed = true;
 * the other fields 0.  AJ_ERR_IO as aj_tune_lookup. */
aj_status aj_tune_lookup_result(aj_ctx *ctx, const struct aj_device *dev, const aj_op *op,
                                aj_tune_result *out);

/* ---------------------------------------------------------------- info */

/* "19.1.7": the LLVM that attnjit links. */
const char *aj_llvm_version(void);
/* PTX ISA version emitted for a GPU target ("7.8"), or NULL. */
const char *aj_ptx_version(aj_target target);
/* The cpu target on this host, for people (`attnjit info` prints it):
 * the CPU features its kernels are compiled for (from CPUID, less what
 * AJ_CPU_ISA masks) and the path each choice takes, with the reason --
 * vector width, bf16 products, AMX tiles (docs/cpu.md "Host features").
 * Lines "name  value\n".  Writes at most cap bytes (NUL included) to buf
 * (NULL with cap 0 to measure); returns the whole text's length. */
size_t aj_cpu_describe(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* ATTNJIT_H */
