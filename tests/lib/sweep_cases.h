/*
 * sweep_cases.h -- the one generator of the head-dim sweep's cases
 * (test_default_schedules.c, and the backward sample of
 * test_sim_flash_bwd.c): every op of
 *
 *   kind (forward, backward) x variant (flash, efficient) x dtype
 *   x head dim 8..512 step 8 x mask {none, causal bottom_right, window}
 *   x score mod {none, softcap, alibi} x bias {none, add}
 *
 * numbered 0 .. SWEEP_COUNT - 1, so a test can walk all of them, shard
 * them or draw a spread-out sample by index.  Cases the IR itself rejects
 * (flash with bias) are part of the numbering; sweep_spec() says so.
 * Head dims past 256 are every template's but the wgmma forward's and
 * FP8 inputs' (which refuse them by name, docs/design.md "Head dims"): the
 * (D, Dv) pairs below are the range of those two and of the flash
 * templates before, sweep_case_on_gpu says what the GPU targets take.
 *
 * Header-only with static functions (tests include it where they need it).
 */
#ifndef AJ_TESTS_SWEEP_CASES_H
#define AJ_TESTS_SWEEP_CASES_H

#include <stdio.h>

#include "attnjit/attnjit.h"

#define SWEEP_DIM_STEP 8
#define SWEEP_DIM_MAX 512       /* the cpu's and the efficient templates' head dims */
#define SWEEP_GPU_DIM_MAX 256   /* FP8 inputs' and the wgmma backward's (sim, sm_89 .. sm_90a) */
#define SWEEP_DIMS (SWEEP_DIM_MAX / SWEEP_DIM_STEP)
#define SWEEP_GPU_DIMS (SWEEP_GPU_DIM_MAX / SWEEP_DIM_STEP)

static const char *const sweep_masks[] = {"none", "causal(bottom_right)",
                                          "window(12, 3, bottom_right)"};
static const char *const sweep_mods[] = {"none", "softcap(20.0)", "alibi"};
static const aj_dtype sweep_dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};

#define SWEEP_N_MASKS ((int)(sizeof sweep_masks / sizeof sweep_masks[0]))
#define SWEEP_N_MODS ((int)(sizeof sweep_mods / sizeof sweep_mods[0]))
#define SWEEP_N_DTYPES ((int)(sizeof sweep_dtypes / sizeof sweep_dtypes[0]))
#define SWEEP_COUNT (2 * 2 * SWEEP_N_DTYPES * SWEEP_DIMS * SWEEP_N_MASKS * SWEEP_N_MODS * 2)

typedef struct sweep_case {
    aj_kind kind;          /* AJ_KIND_FORWARD or AJ_KIND_BACKWARD */
    aj_variant variant;
    aj_dtype dtype;
    int d, dv;
    const char *mask, *score_mod;
    const char *tensors;   /* the op's side tensors, NULL for none */
    int bias;
    /* options beyond the main product, off unless a caller sets them */
    double dropout;
    int accumulate, deterministic, varlen;
    int warpgroups;        /* flash forward: the wgmma template's (schedule) */
    int producer;          /* with warpgroups: warp specialised (schedule producer = 1) */
    aj_dtype f8;           /* FP8 inputs: q_dtype and kv_dtype (>= AJ_DTYPE_F8E4M3) */
    /* a shared K/V cache (layout = paged, kv_shared, an explicit scale);
     * with varlen, its queries (q_layout = varlen); kv_f8: the cache's f8
     * format under 16-bit queries (kv_dtype), else 0 */
    int shared;
    aj_dtype kv_f8;
} sweep_case;

/* Case `index` of the main product (dv = d, no further options). */
static inline sweep_case sweep_case_at(int index)
{
    sweep_case c = {0};
    c.bias = index % 2;
    index /= 2;
    c.score_mod = sweep_mods[index % SWEEP_N_MODS];
    index /= SWEEP_N_MODS;
    c.mask = sweep_masks[index % SWEEP_N_MASKS];
    index /= SWEEP_N_MASKS;
    c.d = c.dv = SWEEP_DIM_STEP * (1 + index % SWEEP_DIMS);
    index /= SWEEP_DIMS;
    c.dtype = sweep_dtypes[index % SWEEP_N_DTYPES];
    index /= SWEEP_N_DTYPES;
    c.variant = index % 2 ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH;
    index /= 2;
    c.kind = index % 2 ? AJ_KIND_BACKWARD : AJ_KIND_FORWARD;
    return c;
}

/* Case k (0 .. SWEEP_DIMS - 1) of the head-dim walk of `kind`: D = 8 (k +
 * 1), Dv a stride prime to the dim count on from it (so the walk meets
 * every D and every Dv once, D = Dv where the stride lands there), the
 * variant alternating, dtype, mask, mod and bias rotating with k. */
#define SWEEP_WALK_STRIDE 23

static inline sweep_case sweep_dim_case(int k, aj_kind kind)
{
    sweep_case c = {0};
    c.kind = kind;
    c.d = SWEEP_DIM_STEP * (1 + k);
    c.dv = SWEEP_DIM_STEP * (1 + (k * SWEEP_WALK_STRIDE + 7) % SWEEP_DIMS);
    c.variant = k % 2 ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH;
    c.dtype = sweep_dtypes[k / 2 % SWEEP_N_DTYPES];
    if (c.variant == AJ_VARIANT_FLASH && c.dtype == AJ_DTYPE_F32)
        c.dtype = AJ_DTYPE_F16;   /* flash runs on f16 / bf16 */
    c.mask = sweep_masks[k / 3 % SWEEP_N_MASKS];
    c.score_mod = sweep_mods[k / 5 % SWEEP_N_MODS];
    c.bias = c.variant == AJ_VARIANT_EFFICIENT && k % 4 == 1;
    return c;
}

/* Whether both head dims are in the GPU templates' range: 512, but 256
 * for FP8 inputs and the wgmma backward on the flash templates. */
static inline int sweep_case_on_gpu(const sweep_case *c)
{
    int narrow = c->f8 || (c->warpgroups && c->kind == AJ_KIND_BACKWARD);
    int max = c->variant == AJ_VARIANT_FLASH && narrow ? SWEEP_GPU_DIM_MAX : SWEEP_DIM_MAX;
    return c->d <= max && c->dv <= max;
}

/* The (D, Dv) pairs of the flash range, numbered 0 .. SWEEP_PAIRS - 1 row
 * by row (D major).  Pair `index` with D != Dv or D == Dv alike. */
#define SWEEP_PAIRS (SWEEP_GPU_DIMS * SWEEP_GPU_DIMS)

/* A number that mixes D and Dv, for rotating the other axes of a pair. */
static inline int sweep_pair_mix(int index)
{
    return index / SWEEP_GPU_DIMS + index % SWEEP_GPU_DIMS;
}

/* Case `combo` (0..3: kind x variant) of pair `index`: dtype, mask and
 * mod rotate with sweep_pair_mix so a strided walk sees each of them. */
static inline sweep_case sweep_pair_case(int index, int combo)
{
    sweep_case c = {0};
    int mix = sweep_pair_mix(index);
    c.d = SWEEP_DIM_STEP * (1 + index / SWEEP_GPU_DIMS);
    c.dv = SWEEP_DIM_STEP * (1 + index % SWEEP_GPU_DIMS);
    c.kind = combo / 2 ? AJ_KIND_BACKWARD : AJ_KIND_FORWARD;
    c.variant = combo % 2 ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH;
    c.dtype = sweep_dtypes[(mix + combo) % SWEEP_N_DTYPES];
    if (c.variant == AJ_VARIANT_FLASH && c.dtype == AJ_DTYPE_F32)
        c.dtype = AJ_DTYPE_BF16;   /* flash runs on f16 / bf16 */
    c.mask = sweep_masks[(mix / 3) % SWEEP_N_MASKS];
    c.score_mod = sweep_mods[(mix / 9) % SWEEP_N_MODS];
    return c;
}

/* Whether the IR accepts the case at all (the verifier's rules, not a
 * template's): bias is the efficient variant's, accumulate the forward's,
 * deterministic the backward's. */
static inline int sweep_case_valid(const sweep_case *c)
{
    if (c->bias && c->variant != AJ_VARIANT_EFFICIENT)
        return 0;
    if (c->accumulate && c->kind != AJ_KIND_FORWARD)
        return 0;
    if (c->deterministic && c->kind != AJ_KIND_BACKWARD)
        return 0;
    return 1;
}

/* The case's IR text; returns its length (>= cap: did not fit). */
static inline int sweep_spec(const sweep_case *c, char *buf, size_t cap)
{
    return snprintf(buf, cap,
                    "attention %s %s {\n  dtype = %s\n  head_dim = %d\n  head_dim_v = %d\n"
                    "  mask = %s\n  score_mod = %s\n  bias = %s\n  dropout = %g\n"
                    "  layout = %s\n%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s%s}\n",
                    aj_kind_name(c->kind), aj_variant_name(c->variant),
                    aj_dtype_name(c->dtype), c->d, c->dv, c->mask, c->score_mod,
                    c->bias ? "add" : "none", c->dropout,
                    c->shared ? "paged" : c->varlen ? "varlen" : "padded",
                    !c->shared ? ""
                    : c->varlen ? "  kv_shared = true\n  scale = 0.07\n  q_layout = varlen\n"
                                : "  kv_shared = true\n  scale = 0.07\n",
                    c->kv_f8 ? "  kv_dtype = " : "", c->kv_f8 ? aj_dtype_name(c->kv_f8) : "",
                    c->kv_f8 ? "\n" : "",
                    c->f8 ? "  q_dtype = " : "", c->f8 ? aj_dtype_name(c->f8) : "",
                    c->f8 ? "\n  kv_dtype = " : "", c->f8 ? aj_dtype_name(c->f8) : "",
                    c->f8 ? "\n" : "",
                    c->tensors ? "  tensors = " : "", c->tensors ? c->tensors : "",
                    c->tensors ? "\n" : "", c->accumulate ? "  accumulate = true\n" : "",
                    c->deterministic ? "  deterministic = true\n" : "",
                    c->warpgroups == 1   ? "  schedule = (warpgroups = 1"
                    : c->warpgroups == 2 ? "  schedule = (warpgroups = 2"
                                         : "",
                    !c->warpgroups ? "" : c->producer ? ", producer = 1)\n" : ")\n");
}

/* A short label: "bwd efficient bf16 d72/72 causal(bottom_right) alibi bias". */
static inline void sweep_label(const sweep_case *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s %s %s%s%s d%d/%d %s %s%s%s%s%s%s%s%s%s%s",
             c->kind == AJ_KIND_FORWARD ? "fwd" : "bwd", aj_variant_name(c->variant),
             c->f8 ? aj_dtype_name(c->f8) : "", c->f8 ? "/" : "", aj_dtype_name(c->dtype),
             c->d, c->dv, c->mask,
             c->score_mod, c->bias ? " bias" : "", c->dropout > 0 ? " dropout" : "",
             c->accumulate ? " accumulate" : c->deterministic ? " deterministic" : "",
             c->varlen ? " varlen" : "",
             c->warpgroups == 1 ? " wgmma x1" : c->warpgroups == 2 ? " wgmma x2" : "",
             c->producer ? " + producer" : "", c->shared ? " paged kv_shared" : "",
             c->kv_f8 ? " cache " : "", c->kv_f8 ? aj_dtype_name(c->kv_f8) : "");
}

#endif /* AJ_TESTS_SWEEP_CASES_H */
