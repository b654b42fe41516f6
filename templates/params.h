/*
 * params.h -- the kernel parameter contract (params.def) as C: each
 * kernel ABI's parameter list for an op, which templates declare and
 * aj_op_kernel_params reports, and the catalogue runtime/launch_bind.c binds
 * values from.
 */
#ifndef AJ_TEMPLATES_PARAMS_H
#define AJ_TEMPLATES_PARAMS_H

#include "codegen/kbuilder.h"
#include "ir/op.h"

struct aj_score_prog;

/* The kernel ABIs: one per template and stage whose parameters differ. */
typedef enum aj_kernel_sig {
    AJ_KSIG_NONE = 0,
    AJ_KSIG_FLASH_FWD,
    AJ_KSIG_FLASH_BWD,
    AJ_KSIG_EFFICIENT_FWD,
    AJ_KSIG_EFFICIENT_BWD_DKDV,
    AJ_KSIG_EFFICIENT_BWD_DQ,
    AJ_KSIG_CPU_FWD,
    AJ_KSIG_CPU_BWD_DKDV,
    AJ_KSIG_CPU_BWD_DQ,
    AJ_KSIG_CPU_BWD_FUSED,
    AJ_KSIG_MERGE,
    AJ_KSIG_BLOCK_MASK,
    AJ_KSIG_CPU_PAGED_FWD,
    AJ_KSIG_CPU_PAGED_MERGE,
    AJ_KSIG_SINKS_GRAD,
    AJ_KSIG_SIDE_GRAD,
    AJ_KSIG_SIDE_GRAD_SUM,
    AJ_KSIG_ROWS,
    AJ_KSIG_COUNT
} aj_kernel_sig;

/* The values a launch fills: tensors, then scalars. */
typedef enum aj_param_source {
#define AJ_PSOURCE(name, kind) AJ_PSRC_##name,
#include "templates/params.def"
    AJ_PSRC_COUNT
} aj_param_source;

/* Every parameter of the table by its row: AJ_PID(dropout_seed).  A
 * template and the launcher name a parameter this way, so a typo is a
 * compile error; the kernel records each parameter's row and the launch
 * binds it by row, never by name. */
typedef enum aj_param_id {
#define AJ_PARAM(nm, type, how, source, dim) AJ_PRM_##nm,
#include "templates/params.def"
    AJ_PRM_COUNT
} aj_param_id;
#define AJ_PID(name) AJ_PRM_##name

/* How a parameter's value follows from its source. */
typedef enum aj_param_how {
    AJ_PHOW_DATA,      /* the tensor's data pointer */
    AJ_PHOW_STRIDE,    /* its stride `dim` */
    AJ_PHOW_BSTRIDE,   /* the same, 0 where the dim has size 1 (broadcast) */
    AJ_PHOW_SHAPE,     /* its size `dim` */
    AJ_PHOW_SCALAR,    /* the scalar */
    AJ_PHOW_ENCODE,    /* AJ_PARAM_BYVAL128 bytes encoded from the tensor at
                          each launch by encoder `dim` (aj_param_encoder) */
} aj_param_how;

/* The encoders of by-value parameters (runtime/launch_bind.c runs them
 * at each launch, aj_kernel_encode_param for an embedder). */
typedef enum aj_param_encoder {
    AJ_PENC_TENSOR_DESC = 0,   /* the tensor's view: aj_tensor_desc */
    /* TMA tensor maps (the device's tensor_map, cuTensorMapEncodeTiled on
     * a GPU) of a padded [B, H, S, D] tensor as 4 dims (D, S, H, B), box
     * (aj_wgmma_panel_span(width) / 2, rows, 1, 1) with that swizzle:
     * Q's rows block_m (width D), K's and V's block_n (widths D, Dv) */
    AJ_PENC_TMA_Q,
    AJ_PENC_TMA_K,
    AJ_PENC_TMA_V,
    AJ_PENC_COUNT
} aj_param_encoder;

/* The swizzle span (bytes) of a wgmma tile `width` 16-bit elements wide:
 * its rows, the width rounded up to 16 (a wgmma k-step), are cut into
 * panels of span / 2 elements, the widest of 64, 32 and 16 that divides
 * that (templates/flash_fwd.c, "wgmma"); a TMA box is one panel, its
 * columns past the width read as zeros. */
static inline int aj_wgmma_panel_span(int width)
{
    int w = (width + 15) / 16 * 16;
    return w % 64 == 0 ? 128 : w % 32 == 0 ? 64 : 32;
}

/* A wgmma tile's row width in elements: `width` rounded up to 16. */
static inline int aj_wgmma_tile_width(int width)
{
    return (width + 15) / 16 * 16;
}

/* AJ_PENC_TENSOR_DESC's bytes (the rest of the AJ_BYVAL_BYTES are zero). */
typedef struct aj_tensor_desc {
    uint64_t data;
    int32_t dtype, rank;
    int64_t shape[4], strides[4];
} aj_tensor_desc;

_Static_assert(sizeof(aj_tensor_desc) <= AJ_BYVAL_BYTES, "a tensor's view fits a blob");

/* A row of the catalogue: every parameter name a template may declare,
 * except the side tensors' (score.h). */
typedef struct aj_param_row {
    const char *name;
    aj_param_type type;
    aj_param_how how;
    aj_param_source source;
    int dim;
} aj_param_row;

/* Whether a source is a tensor (else a scalar). */
bool aj_param_source_is_tensor(aj_param_source s);
/* Its name ("q", "heads_q"). */
const char *aj_param_source_name(aj_param_source s);

/* The catalogue row named `name`, or NULL (a side tensor's parameter). */
const aj_param_row *aj_param_find(const char *name);
/* The row of `id` (AJ_KB_NO_ID and other values outside the table: NULL). */
const aj_param_row *aj_param_row_of(int32_t id);

/* In a template: the value of parameter `id` in the kernel being built
 * (declared by aj_params_declare; one the kernel lacks fails the build,
 * naming it). */
LLVMValueRef aj_param(aj_kb *kb, aj_param_id id);
/* The data pointer of tensor source t (AJ_PSRC_q ...), and its stride
 * along dim (0 batch, 1 head, 2 sequence, as the table's rows name them):
 * the parameters the table derives from it. */
LLVMValueRef aj_param_data(aj_kb *kb, aj_param_source t);
LLVMValueRef aj_param_stride(aj_kb *kb, aj_param_source t, int dim);
/* ... of the sequence dim (2: rows of [B, H, S, D]) */
static inline LLVMValueRef aj_param_stride_s(aj_kb *kb, aj_param_source t)
{
    return aj_param_stride(kb, t, 2);
}

/* The parameters of kernel ABI `sig` for `op` (verified) and its score
 * programs, in call order: fills out[0 .. min(count, cap) - 1], returns
 * count. */
int aj_params_list(aj_kernel_sig sig, const aj_op *op, const struct aj_score_prog *prog,
                   aj_param_desc *out, int cap);

/* Declares them on the kernel builder (before aj_kb_begin[_stage]). */
void aj_params_declare(aj_kb *kb, aj_kernel_sig sig, const aj_op *op,
                       const struct aj_score_prog *prog);

#endif /* AJ_TEMPLATES_PARAMS_H */
