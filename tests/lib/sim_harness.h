/*
 * sim_harness.h -- running one forward problem on a device (sim or a GPU)
 * and against the float64 reference (tests, benchmarks, tests/gpu).
 *
 * Inputs are drawn from a seeded generator, rounded to the op's dtype, and
 * the reference is fed the rounded values, so any difference is the
 * kernel's own (f32 accumulation, ex2.approx, output rounding).
 */
#ifndef AJ_TESTS_SIM_HARNESS_H
#define AJ_TESTS_SIM_HARNESS_H

#include <stdint.h>

#include "attnjit/attnjit.h"
#include "ref.h"

typedef struct fwd_case {
    const char *label;
    aj_dtype dtype;
    int d, dv;
    const char *mask;          /* IR text: "none", "causal(top_left)", ... */
    const char *score_mod;     /* IR text, "none" if NULL */
    const char *schedule;      /* IR text, "default" if NULL */
    int b, hq, hkv, sq, sk;
    int64_t q_offset, kv_offset, sq_total, sk_total;
    double magnitude;          /* inputs uniform in [-magnitude, magnitude] */
    int bshd;                  /* lay q, k, v, o out as [B, S, H, D] (strided BHSD views) */
    uint64_t seed;
    /* FP8 inputs (docs/ir.md "FP8 inputs"): AJ_DTYPE_F8E4M3 or _F8E5M2
     * quantises q (when f8_q), k and v to it from their drawn values, each
     * with its amax descale (per tensor, or per head when f8_per_head);
     * the reference gets the dequantised values.  Below F8E4M3: none. */
    aj_dtype f8;
    int f8_q, f8_per_head;
} fwd_case;

/* The tests' usual case: b 1, Hq 2 over Hkv 1, Sq 67 and Sk 83 (tails on
 * both sides), inputs in [-1, 1], seed 42; a test sets what it varies. */
fwd_case fwd_case_base(const char *label, aj_dtype dtype, int d, const char *mask);

/* A case written as a table's row (case_rows.h) over base; a case that
 * needs 0 where base has another value (Sk = 0) is written out. */
fwd_case fwd_case_over(const fwd_case *base, const fwd_case *row);
/* Runs fwd_case_over(base, rows[i]) with `run`, in order. */
void fwd_case_rows(const fwd_case *base, const fwd_case *rows, int n,
                   void (*run)(const fwd_case *c));

/* The cases of head dims (Dv != D), score_mods and layout that both
 * test_sim_forward (on sim) and test_cpu_forward (on cpu) run, over
 * fwd_case_base's case. */
extern const fwd_case fwd_shape_rows[];
extern const int fwd_shape_row_count;

/* Options of a case beyond fwd_case (all zero: none). */
typedef struct fwd_options {
    /* bias = add when bias_shape[3] != 0: a bias of that shape (each dim 1
     * or full), random in [-bias_magnitude, bias_magnitude]; size-1 dims
     * get stride 0 when bias_stride0, else contiguous strides */
    int64_t bias_shape[4];
    int bias_stride0;
    double bias_magnitude;
    double dropout;            /* dropout = p when > 0, with this stream: */
    uint64_t drop_seed, drop_offset;
    /* expressions (c->mask or c->score_mod "expr(...)"): the `tensors`
     * field's text ("(doc: i32[2])", NULL: none) and the side tensors in
     * host memory, which the harness copies to the device */
    const char *tensors;
    const aj_side_tensor *side;
    int num_side;
} fwd_options;

/* The varlen case both varlen forward tests run (test_sim_flash_fwd on
 * sim, test_cpu_forward on cpu): f16 d96 causal(bottom_right), alibi and
 * dropout, with offsets, over b sequences whose totals are sq_total and
 * sk_total; *x gets its dropout stream. */
fwd_case fwd_varlen_totals_case(const fwd_case *base, int b, int64_t sq_total,
                                int64_t sk_total, fwd_options *x);

typedef struct fwd_result {
    aj_status status;
    double max_err_o;          /* max |o - ref| / (atol + rtol |ref|) (<= 1 passes) */
    double max_err_lse;
    int64_t rows_without_keys; /* reference rows with LSE = -inf */
    int exact_empty_rows;      /* 1 if every such row has O == 0 and LSE == -inf */
    uint64_t instructions;     /* sim: emulated thread-instructions */
    double seconds;            /* wall time of the launch */
} fwd_result;

/* Tolerances per dtype, relative to the float64 reference:
 *   |o - ref| <= atol + rtol * |ref|, LSE likewise with its own pair. */
typedef struct fwd_tolerance {
    double o_atol, o_rtol, lse_atol, lse_rtol;
} fwd_tolerance;

fwd_tolerance fwd_tolerance_for(aj_dtype dtype);

/* Compiles for the device's target (caching by spec text), copies the
 * inputs to the device, runs one case, copies the results back, compares. */
fwd_result fwd_run_case(aj_ctx *ctx, aj_device *dev, const fwd_case *c);
/* The same with options (bias, dropout); x may be NULL. */
fwd_result fwd_run_case_with(aj_ctx *ctx, aj_device *dev, const fwd_case *c,
                             const fwd_options *x);
/* The same for the op's variant, "flash" or "efficient" (NULL). */
fwd_result fwd_run_case_variant(aj_ctx *ctx, aj_device *dev, const fwd_case *c,
                                const fwd_options *x, const char *variant);

/* How a case runs, beyond its data (all zero: the efficient variant, one
 * padded call). */
typedef struct fwd_run_options {
    aj_variant variant;        /* AJ_VARIANT_FLASH, else the efficient variant */
    /* > 0: an accumulate = true kernel runs over that many key blocks in
     * turn (each with its kv_offset, the totals set to the whole call's),
     * from lse = -inf and an o_acc of NaN; o_acc is then compared (padded
     * layout only) */
    int accumulate_parts;
    /* non-NULL (both): layout = varlen with c->b sequences of these lengths
     * packed as [T, H, D] (c->sq and c->sk are unused) */
    const int32_t *seqlens_q, *seqlens_k;
    /* > 0: the schedule's warpgroups (the flash forward's wgmma template),
     * added to c->schedule's keys */
    int warpgroups;
    int producer;   /* with warpgroups: the schedule's producer (warp specialised) */
} fwd_run_options;

/* The same with run options; x and run may be NULL. */
fwd_result fwd_run_case_ext(aj_ctx *ctx, aj_device *dev, const fwd_case *c,
                            const fwd_options *x, const fwd_run_options *run);

/* Copies of n side tensors (host memory) in device memory: out[i] is
 * side[i] with its data on dev; *st keeps the first failure (a failed copy
 * leaves its data NULL).  side_free_device frees what side_to_device
 * allocated. */
void side_to_device(aj_device *dev, aj_status *st, const aj_side_tensor *side, int n,
                    aj_side_tensor *out);
void side_free_device(aj_device *dev, aj_side_tensor *t, int n);

/* Frees the kernels fwd_run_case compiled. */
void fwd_cache_clear(void);

#endif /* AJ_TESTS_SIM_HARNESS_H */
