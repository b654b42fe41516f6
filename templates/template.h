/*
 * template.h -- kernel templates and the registry that picks one.
 *
 * A template is a vtable: `check` says whether it implements an op on a
 * target (and names the option it lacks if not), `build` writes the kernel
 * with the kernel builder.  The registry is a static list; aj_compile walks
 * it.
 */
#ifndef AJ_TEMPLATES_TEMPLATE_H
#define AJ_TEMPLATES_TEMPLATE_H

#include "codegen/codegen.h"
#include "templates/params.h"

typedef struct aj_template {
    const char *name;          /* also the kernel name's prefix */
    aj_kind kind;
    aj_variant variant;
    /* AJ_OK, or AJ_ERR_UNSUPPORTED with a message naming the option. */
    aj_status (*check)(aj_ctx *ctx, const aj_op *op, aj_target target);
    aj_build_fn build;
    /* the targets it builds for, a mask of (1u << aj_target); 0 means the
     * SIMT targets of the target table (the GPUs' and sim) */
    unsigned targets;
    /* whether it builds layout = paged (K/V gathered through a page table) */
    bool paged;
    /* each stage's parameter list (params.def), in launch order; the rest
     * AJ_KSIG_NONE */
    aj_kernel_sig stage_sigs[AJ_KB_MAX_STAGES];
} aj_template;

/* A template's registry row `ID`: what every row names (kernel name
 * prefix, kind, variant, check, build), then, as designated initializers,
 * what only some set (targets, paged, stage_sigs). */
#define AJ_TEMPLATE(ID, NAME, KIND, VARIANT, CHECK, BUILD, ...)                                    \
    const aj_template ID = {.name = NAME,                                                          \
                            .kind = KIND,                                                          \
                            .variant = VARIANT,                                                    \
                            .check = CHECK,                                                        \
                            .build = BUILD,                                                        \
                            __VA_ARGS__}

/* A template whose one kernel serves both variants: its two registry
 * rows, ID_flash and ID_efficient, the same but for the variant. */
#define AJ_TEMPLATE_BOTH_VARIANTS(ID, NAME, KIND, CHECK, BUILD, ...)                               \
    AJ_TEMPLATE(ID##_flash, NAME, KIND, AJ_VARIANT_FLASH, CHECK, BUILD, __VA_ARGS__);              \
    AJ_TEMPLATE(ID##_efficient, NAME, KIND, AJ_VARIANT_EFFICIENT, CHECK, BUILD, __VA_ARGS__)

/* The template for the op's kind and variant on `target`;
 * AJ_ERR_UNSUPPORTED naming them if none exists. */
aj_status aj_template_find(aj_ctx *ctx, const aj_op *op, aj_target target,
                           const aj_template **out);

extern const aj_template aj_template_efficient_fwd;
extern const aj_template aj_template_efficient_bwd;
extern const aj_template aj_template_flash_bwd;
extern const aj_template aj_template_merge;
extern const aj_template aj_template_flash_fwd;
/* layout = paged on the GPU targets and sim: one kernel (efficient_fwd.c)
 * serves both variants */
extern const aj_template aj_template_paged_fwd_flash;
extern const aj_template aj_template_paged_fwd_efficient;
/* ... whose first stage is flash_fwd.c's mma tiles where the op is a
 * flash-variant shared K/V cache (16-bit or f8 values under 16-bit
 * queries) on a GPU target or sim
 * (absorbed MLA: many query heads over one latent head; flash_fwd.c,
 * "Paged"): aj_flash_paged_check is then the template's check, and
 * aj_flash_paged_parts builds that stage (*used: its schedule). */
struct aj_score_prog;
bool aj_flash_paged_takes(const aj_op *op, aj_target target);
aj_status aj_flash_paged_check(aj_ctx *ctx, const aj_op *op, aj_target target);
aj_status aj_flash_paged_parts(aj_kb *kb, const aj_op *op, const struct aj_score_prog *prog,
                               aj_schedule *used);
/* cpu: one kernel serves both variants, so each is registered twice */
extern const aj_template aj_template_cpu_fwd_flash;
extern const aj_template aj_template_cpu_fwd_efficient;
extern const aj_template aj_template_cpu_fwd_paged_flash;
extern const aj_template aj_template_cpu_fwd_paged_efficient;
extern const aj_template aj_template_cpu_bwd_flash;
extern const aj_template aj_template_cpu_bwd_efficient;
extern const aj_template aj_template_cpu_merge;
/* the block-mask builder (block_mask.c): not looked up by kind; the
 * runtime compiles an op's mask with it (aj_compile_block_mask) */
extern const aj_template aj_template_block_mask;
/* the row kernels of the context-parallel methods on a GPU (rows.c),
 * likewise compiled by the runtime (aj_compile_rows); a stage each */
extern const aj_template aj_template_rows;
typedef enum aj_rows_stage {
    AJ_ROWS_ROUND_MASKED,   /* o = round(o_acc), 0 where lse = -inf */
    AJ_ROWS_ROUND,          /* o = round(o_acc) */
    AJ_ROWS_ADD,            /* o_acc += o */
    AJ_ROWS_STORE,          /* o_acc = o */
    AJ_ROWS_ZERO,           /* o_acc = 0 */
    AJ_ROWS_STAGE_COUNT
} aj_rows_stage;

#endif /* AJ_TEMPLATES_TEMPLATE_H */
