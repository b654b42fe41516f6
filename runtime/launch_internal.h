/*
 * launch_internal.h -- what the launch files share (docs/design.md, "The
 * life of an op", step 7):
 *
 *   launch.c         the entry points: aj_forward (padded, varlen, paged),
 *                    aj_backward and its workspace, aj_merge,
 *                    aj_block_mask_launch; grids, scratch and stages
 *   launch_shapes.c  the shape rules of each layout: every argument checked
 *                    against the kernel's op, and the sizes it implies
 *   launch_bind.c    a launch's values (params.def's sources) and their
 *                    binding to a stage's parameters
 */
#ifndef AJ_RUNTIME_LAUNCH_INTERNAL_H
#define AJ_RUNTIME_LAUNCH_INTERNAL_H

#include "runtime/runtime.h"
#include "templates/params.h"

#define MAX_SEQ ((int64_t)1 << 30)
#define MAX_GRID_YZ 65535

/* the entry points, as messages name them */
#define FWD "aj_forward"
#define BWD "aj_backward"
#define MERGE "aj_merge"

/* ---------------------------------------------------------------- sizes */

/* The problem sizes a forward call implies, once its arguments check out. */
typedef struct fwd_sizes {
    int64_t batch, heads_q, heads_kv, seq_q, seq_k;
    int64_t splits;   /* layout = paged: split-KV parts (else 1) */
    int64_t tokens_q; /* layout = paged: a query head's rows (Sq; varlen queries: T) */
    int64_t head_offset, heads_total;   /* the call's heads in the op's (check_heads) */
    /* gradients of side tensors: parts per (b, h), and the elements of
     * the tensor a sum stage writes (AJ_EXTENT_DSIDE_*) */
    int64_t dside_parts, dside_elements;
} fwd_sizes;

/* The side tensors' gradients of a backward call (templates/side_grad.c):
 * the tensors asked for and the partial sums' layout, in f32 elements. */
typedef struct dside_plan {
    int32_t count;                    /* outputs asked for (aj_bwd_args.dside) */
    int64_t parts, rows;              /* parts per (b, h), the rows each covers */
    int64_t part_size, parts_total;   /* elements of a part; parts in all */
    int64_t base[AJ_OP_TENSORS_MAX + 1];   /* each grad input's first element in a part
                                         * (aj_grad_inputs' order) */
    int64_t offset;                   /* the first part's element in the workspace */
} dside_plan;

/* A checked backward call: its sizes (varlen: batch and the longest
 * lengths, which size the grid), the query rows of each head (Sq, or Tq
 * for varlen) and the arguments as padded BHSD views (varlen: batch
 * stride 0, so that sequence b's rows start at its cu_seqlens offset). */
typedef struct bwd_call {
    fwd_sizes sz;
    int64_t head_rows;
    aj_bwd_args view;
    dside_plan dside;
    bool sinks_only;   /* aj_backward_sinks: the sinks' gradient stage alone */
} bwd_call;

/* The workspace of a backward call: its rule (runtime.h,
 * aj_workspace_rule) times the call's rows, in f32 elements: a row's
 * Delta at b stride_b + h stride_h + i, region r from offset[r]. */
typedef struct bwd_workspace {
    int64_t stride_b, stride_h;
    int64_t offset[AJ_WS_REGIONS];
    int64_t dside_offset;   /* the side tensors' partial sums (f32 elements) */
    size_t bytes;
    int fused;              /* laid out for the kernel's fused plan (launch.c) */
} bwd_workspace;

/* The workspace aj_backward binds for these arguments, checked as it
 * checks them (launch.c). */
aj_status aj_backward_workspace(aj_ctx *ctx, const aj_kernel *kernel, const aj_bwd_args *args,
                                bwd_workspace *out);

/* ---------------------------------------------------------------- shapes */

/* The bytes a tensor's elements of `elem` bytes span (0 when empty). */
int64_t aj_tensor_extent_bytes(const aj_tensor *t, int elem);

/* The checks of each layout (launch_shapes.c), errors naming the
 * argument: a padded, varlen or paged forward, a backward (padded or
 * varlen, by the op), a merge.  They fill the sizes the call implies.
 * q, k and v rows (paged: q's and the caches') start on the kernel's
 * row_align bytes, which its template stated (aj_kb_row_align). */
aj_status aj_check_forward(aj_ctx *ctx, const aj_kernel *kernel, const aj_fwd_args *a,
                           fwd_sizes *sz);
aj_status aj_check_forward_varlen(aj_ctx *ctx, const aj_kernel *kernel, const aj_fwd_args *a,
                                  fwd_sizes *sz);
aj_status aj_check_forward_paged(aj_ctx *ctx, const aj_kernel *kernel, const aj_fwd_args *a,
                                 fwd_sizes *sz);
aj_status aj_check_backward(aj_ctx *ctx, const aj_kernel *kernel, const aj_bwd_args *a,
                            bwd_call *call);
aj_status aj_check_merge(aj_ctx *ctx, const aj_op_info *op, const aj_merge_args *a,
                         fwd_sizes *sz);

/* A packed [T, H, D] tensor as the [1, H, T, D] view the padded binding
 * reads (launch_shapes.c). */
aj_tensor aj_padded_view(const aj_tensor *t);

/* ---------------------------------------------------------------- values */

/*
 * The values of a launch: params.def's sources, which each entry point
 * fills from its checked arguments.  A kernel parameter's value follows
 * from its catalogue row (templates/params.h); the score programs' side
 * tensors (and alibi's slopes) bind by their names.
 */
typedef struct launch_values {
    aj_tensor tensor[AJ_PSRC_COUNT];
    int64_t scalar[AJ_PSRC_COUNT];
    uint64_t given;   /* a bit per source filled */
} launch_values;

_Static_assert(AJ_PSRC_COUNT <= 64, "launch_values.given holds a bit per source");

static inline void put_tensor(launch_values *v, aj_param_source s, const aj_tensor *t)
{
    v->tensor[s] = *t;
    v->given |= 1ull << s;
}

static inline void put_scalar(launch_values *v, aj_param_source s, int64_t x)
{
    v->scalar[s] = x;
    v->given |= 1ull << s;
}

typedef struct binding {
    const char *name;
    aj_param_type type;
    aj_arg_value value;
} binding;

/* The parameters of score.h's programs that are not in the catalogue
 * (alibi's slopes and each side tensor: pointer, sizes and strides) and
 * their sim buffers. */
#define SCORE_BINDINGS ((AJ_OP_TENSORS_MAX + 1) * (1 + 2 * 4))
typedef struct score_bindings {
    binding b[SCORE_BINDINGS];
    char names[SCORE_BINDINGS][AJ_OP_TENSOR_NAME_MAX + 16];
    int n;
    aj_sim_buffer buffers[AJ_OP_TENSORS_MAX + 1];
    int nb;
} score_bindings;

/* A kernel's bound arguments, the bytes of its by-value ones, and the
 * memory its pointers may touch (sim). */
typedef struct bound_args {
    _Alignas(AJ_BYVAL_ALIGN) unsigned char blobs[AJ_BYVAL_MAX][AJ_BYVAL_BYTES];
    aj_arg_value values[AJ_KB_MAX_PARAMS];
    void *argv[AJ_KB_MAX_PARAMS];
    aj_sim_buffer buffers[AJ_KB_MAX_PARAMS + AJ_OP_TENSORS_MAX + 1];
    int nb;
} bound_args;

/* A launch's scratch: its side tensors' bindings and a stage's bound
 * arguments, about 15 KiB, so on the heap rather than on a caller's stack
 * whose size the library does not know; one per launch, owned by the
 * function that launches and freed before it returns. */
typedef struct launch_scratch {
    score_bindings scores;
    bound_args bound;
} launch_scratch;

/* ---------------------------------------------------------------- binding */

/* A new scratch, or NULL with *st = AJ_ERR_OUT_OF_MEMORY (when *st was
 * AJ_OK; a failed *st stays, and no scratch is made). */
launch_scratch *aj_launch_scratch_new(aj_ctx *ctx, const char *fn, aj_status *st);

/* Whether some stage of the kernel takes parameter `id`. */
int aj_kernel_takes(const aj_kernel *kernel, aj_param_id id);

/* The name of a kernel's sinks tensor (aj_kernel.sinks), NULL: none. */
static inline const char *aj_kernel_sinks_name(const aj_kernel *kernel)
{
    return kernel->sinks >= 0 ? kernel->op.tensors[kernel->sinks].name : NULL;
}

/* Checks the side tensors of a launch against the op's declarations and
 * binds them and alibi's slopes, as `fn` in messages. */
aj_status aj_bind_scores(aj_ctx *ctx, const char *fn, const aj_op_info *op,
                         const aj_side_tensor *side, int32_t num_side,
                         const aj_tensor *slopes, score_bindings *sb);

/* The block mask of a padded launch whose kernel reads one: the given
 * one, or one the plan's builder makes into scratch (*scratch, which the
 * caller releases once the launch is queued); into v (launch_bind.c). */
aj_status aj_bind_block_mask(aj_ctx *ctx, const char *fn, aj_device *dev,
                             const aj_kernel *kernel, const aj_block_mask_shape *launch,
                             const aj_block_mask *given, const aj_side_tensor *side,
                             int32_t num_side, const aj_tensor *slopes, void *stream,
                             launch_values *v, void **scratch);

/* Binds stage `stage`'s parameters for a launch on dev: a table row's
 * (the kernel recorded it) from `v`, a side tensor's by its name from the
 * score programs' bindings (may be NULL), then encodes its by-value
 * arguments (the plan's aj_byval_args) from `v`. */
aj_status aj_bind_stage(aj_ctx *ctx, aj_device *dev, const aj_kernel *kernel, int stage,
                        const launch_values *v, const score_bindings *scores,
                        bound_args *out);

/* The values of each entry point (a: the padded views of its arguments;
 * backward: with the workspace `ws` of layout w). */
/* The wgmma flash forward's `tma` (params.def): 1 where the device
 * encodes tensor maps and TMA can describe q, k and v at the kernel's
 * boxes (launch_bind.c), else 0 -- the kernel then loads by cp.async. */
int aj_tma_usable(const aj_device *dev, const aj_kernel *kernel, const launch_values *v);
void aj_forward_values(const aj_fwd_args *a, const fwd_sizes *sz, int64_t sq_total,
                       int64_t sk_total, void *status, launch_values *v);
void aj_backward_values(const aj_bwd_args *a, const fwd_sizes *sz, int64_t sq_total,
                        int64_t sk_total, const bwd_workspace *w, void *ws, void *status,
                        launch_values *v);
/* The most bytes of partial sums the side tensors' gradients take. */
#define AJ_DSIDE_BYTES_MAX ((int64_t)1 << 30)

/* Checks aj_bwd_args.dside (as `fn`) against the op's grad tensors
 * (tensor_grad) and the side tensors given, and plans the partial sums
 * of a call of sizes sz (templates/side_grad.c): parts of fixed_rows rows
 * where the kernel fixes them (not 0), else of the rows it chooses. */
aj_status aj_check_dside(aj_ctx *ctx, const char *fn, const aj_op_info *op, uint32_t tensor_grad,
                         const aj_bwd_args *a, const fwd_sizes *sz, int64_t fixed_rows,
                         dside_plan *plan);

/* The values of the side tensors' gradient stages (plan's parts in ws),
 * and of the sum stage writing output `out` of grad tensor `tensor`
 * (out NULL: the parts' stage only). */
void aj_dside_values(const dside_plan *plan, const bwd_workspace *w, void *ws,
                     const aj_side_tensor *out, int tensor, launch_values *v);
void aj_merge_values(const aj_merge_args *a, const fwd_sizes *sz, launch_values *v);

#endif /* AJ_RUNTIME_LAUNCH_INTERNAL_H */
