/*
 * test_default_schedules.c -- every default schedule is one its own
 * template accepts (issue 14's sweep).
 *
 *   accept   every case of tests/lib/sweep_cases.h (kind x variant x dtype x
 *            head dim 8..512 step 8 x mask x score mod x bias), each also
 *            with dropout, with accumulate (forward) or deterministic
 *            (backward), and with layout = varlen, and every (D, Dv) pair
 *            of the range: on sm_80, sm_90, sm_90a, sim and cpu the op's
 *            template either declines the op as a whole (a claim: "flash
 *            forward runs on f16 / bf16", "layout = varlen: ...") or its
 *            default schedule passes its own check.  A refusal that blames
 *            the schedule ("schedule: ...") of an op given no schedule is
 *            a failure.  Every template takes every head dim, but the
 *            wgmma forward and FP8 inputs on the flash forward take 8..256
 *            and refuse the rest naming the limit.
 *   ptxas    `ptxas [SHARD SHARDS]`: the GPU kernels of the sweep at their
 *            default schedules through ptxas with no spill bytes, each
 *            on sm_80 or sm_90 in turn (arch_takes; test_ptx assembles
 *            its kernels for both) (main_cases); `ptxas pairs [STRIDE
 *            [SHARD SHARDS]]`: the same for (D, Dv) pairs with D != Dv,
 *            every STRIDE-th pair (default PAIR_STRIDE; 1 is all of them);
 *            `ptxas fp8`: the efficient forward with f8 inputs, every head
 *            dim 8..512 (fp8_cases), on sm_80 and sm_90 or on sm_89 and
 *            sm_90a in turn, and the flash forward's FP8 tensor-core kernels
 *            (fp8_flash_cases: mma.sync on sm_89, wgmma on sm_90a with
 *            two warpgroups and with one, and warp specialised); `ptxas
 *            ws`: the wgmma cases warp specialised (producer = 1).
 *   numeric  `numeric`: a spread-out sample of the forward cases on sim
 *            and cpu against the float64 reference, B1 H2, S 17..40, then
 *            the head-dim walk (sweep_dim_case: every D and Dv of the
 *            device's range; the backward sample and walk run in
 *            test_sim_flash_bwd sweep).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ptxas_util.h"
#include "sim_harness.h"
#include "sweep_cases.h"
#include "templates/template.h"

static const aj_target all_targets[] = {AJ_TARGET_SM_80, AJ_TARGET_SM_89, AJ_TARGET_SM_90,
                                        AJ_TARGET_SM_90A, AJ_TARGET_SIM, AJ_TARGET_CPU};
#define N_TARGETS ((int)(sizeof all_targets / sizeof all_targets[0]))

static aj_op *parse_case(aj_ctx *ctx, const sweep_case *c)
{
    char spec[512], label[160];
    sweep_spec(c, spec, sizeof spec);
    sweep_label(c, label, sizeof label);
    aj_op *op = NULL;
    aj_status st = aj_op_parse(ctx, spec, strlen(spec), label, &op);
    CHECK_MSG(st == AJ_OK, "%s: the IR rejects a sweep case: %s", label, aj_last_error(ctx));
    return op;
}

/* ---------------------------------------------------------------- accept */

typedef struct accept_counts {
    int ops, accepted, declined;
} accept_counts;

/* Whether the op's template on `target` takes the op with its default
 * schedule (1) or declines the op as a whole (0); a default that its own
 * check refuses fails the test -- but for the warpgroups the op gives
 * (not a default), which a target without wgmma refuses, and one
 * warpgroup past Dv 256, by message. */
static int template_takes(aj_ctx *ctx, const aj_op *op, aj_target target, const char *label)
{
    const aj_template *tmpl;
    if (aj_template_find(ctx, op, target, &tmpl) != AJ_OK)
        return 0;
    if (tmpl->check(ctx, op, target) == AJ_OK)
        return 1;
    const char *msg = aj_last_error(ctx);
    int given = strstr(msg, "needs wgmma, which") ||
                strstr(msg, "splits Dv past 256 across two warpgroups");
    CHECK_MSG(strncmp(msg, "schedule:", 9) != 0 || given, "%s on %s: default refused: %s", label,
              aj_target_name(target), msg);
    return 0;
}

static void accept_case(aj_ctx *ctx, const sweep_case *c, accept_counts *n)
{
    if (!sweep_case_valid(c))
        return;
    aj_op *op = parse_case(ctx, c);
    if (!op)
        return;
    char label[160];
    sweep_label(c, label, sizeof label);
    n->ops++;
    for (int t = 0; t < N_TARGETS; t++) {
        int takes = template_takes(ctx, op, all_targets[t], label);
        n->accepted += takes;
        n->declined += !takes;
        /* head dims: every template takes the whole range but FP8 inputs,
         * which take 8..256 and refuse the rest by name; past Dv 256 the
         * wgmma forward takes two warpgroups and refuses one by name */
        const char *why = takes ? "" : aj_last_error(ctx);
        if (c->warpgroups == 1 && strstr(why, "splits Dv past 256 across two warpgroups"))
            continue;
        if (all_targets[t] == AJ_TARGET_CPU)
            CHECK_MSG(!strstr(why, "head_dim"), "%s on cpu: %s", label, why);
        else if (!sweep_case_on_gpu(c))
            CHECK_MSG(!takes && (!strstr(why, "head_dim") ||
                                 strstr(why, "supports multiples of 8 up to 256")),
                      "%s on %s: %s", label, aj_target_name(all_targets[t]),
                      takes ? "taken past the GPU range" : why);
        else   /* sm_89's 99 KiB hold the efficient backward's tiles to D + Dv ~768 */
            CHECK_MSG(!strstr(why, "head_dim") ||
                          (all_targets[t] == AJ_TARGET_SM_89 &&
                           strstr(why, "efficient backward does not fit the 99 KiB")),
                      "%s on %s: %s", label, aj_target_name(all_targets[t]), why);
    }
    aj_op_destroy(op);
}

static void test_accept(aj_ctx *ctx)
{
    accept_counts n = {0};
    for (int i = 0; i < SWEEP_COUNT; i++) {
        sweep_case c = sweep_case_at(i);
        accept_case(ctx, &c, &n);
        sweep_case x = c;
        x.dropout = 0.25;
        accept_case(ctx, &x, &n);
        x = c;
        x.accumulate = c.kind == AJ_KIND_FORWARD;
        x.deterministic = c.kind == AJ_KIND_BACKWARD;
        accept_case(ctx, &x, &n);
        x = c;
        x.varlen = !c.bias;
        if (x.varlen)
            accept_case(ctx, &x, &n);
    }
    /* every (D, Dv) pair, both kinds and variants, every dtype */
    for (int kind = 0; kind < 2; kind++)
        for (int var = 0; var < 2; var++)
            for (int t = 0; t < SWEEP_N_DTYPES; t++)
                for (int d = SWEEP_DIM_STEP; d <= SWEEP_DIM_MAX; d += SWEEP_DIM_STEP)
                    for (int dv = SWEEP_DIM_STEP; dv <= SWEEP_DIM_MAX; dv += SWEEP_DIM_STEP) {
                        sweep_case c = {.kind = kind ? AJ_KIND_BACKWARD : AJ_KIND_FORWARD,
                                        .variant = var ? AJ_VARIANT_EFFICIENT : AJ_VARIANT_FLASH,
                                        .dtype = sweep_dtypes[t], .d = d, .dv = dv,
                                        .mask = sweep_masks[(d + dv) / 8 % SWEEP_N_MASKS],
                                        .score_mod = sweep_mods[d / 8 % SWEEP_N_MODS]};
                        accept_case(ctx, &c, &n);
                        /* past 256 the flash forward's wgmma template: one
                         * warpgroup refused by name, two taken */
                        if (!kind && !var && c.dtype != AJ_DTYPE_F32 &&
                            (d > SWEEP_GPU_DIM_MAX || dv > SWEEP_GPU_DIM_MAX)) {
                            c.warpgroups = 1 + d / 8 % 2;
                            accept_case(ctx, &c, &n);
                        }
                    }
    printf("accept: %d ops x %d targets: %d defaults accepted, %d declined by the template's "
           "claim, 0 defaults refused by their own check expected\n",
           n.ops, N_TARGETS, n.accepted, n.declined);
}

/* ---------------------------------------------------------------- ptxas */

/* The option sets each (kind, variant, dtype, head dim) is assembled
 * with: none; window bounds, alibi's distances, bias, dropout's Philox and
 * accumulate's merge; softcap's tanh with a causal mask; and (HEAVIEST)
 * all of them at once -- softcap and alibi in one expression, so the most
 * registers a forward or backward can need. */
#define PTXAS_SETS 3
#define HEAVIEST PTXAS_SETS

static sweep_case with_options(sweep_case c, int set)
{
    int eff = c.variant == AJ_VARIANT_EFFICIENT;
    switch (set) {
    case HEAVIEST:
        c = with_options(c, 1);
        c.score_mod = "expr(20.0 * tanh(score / 20.0) - slopes[h] * abs(q - k))";
        c.tensors = "(slopes: f32[1])";
        c.deterministic = c.kind == AJ_KIND_BACKWARD;
        break;
    case 0:
        c.mask = sweep_masks[0];
        c.score_mod = sweep_mods[0];
        break;
    case 1:
        c.mask = sweep_masks[2];
        c.score_mod = sweep_mods[2];
        c.bias = eff;
        c.dropout = 0.1;
        c.accumulate = c.kind == AJ_KIND_FORWARD;
        break;
    default:
        c.mask = sweep_masks[1];
        c.score_mod = sweep_mods[1];
        c.bias = eff;
        c.deterministic = c.kind == AJ_KIND_BACKWARD;
        break;
    }
    return c;
}

/* The main product's cases for ptxas: every (kind, variant, dtype, head
 * dim) of the sweep in the HEAVIEST option set -- past 256 every third
 * head dim and 512, for CI time: the pairs'
 * head-dim walk assembles every one of them (D or Dv) too.  The other
 * sets' code is a subset of its code at the same default schedule
 * (defaults depend on the dtype, head dims and kind only); test_ptx
 * assembles the plain kernels at d 32..256 and the pairs below rotate
 * through sets 0..2. */
static int main_cases(sweep_case *out)
{
    int n = 0;
    /* the main product with mask, mod and bias at their first values is
     * every (kind, variant, dtype, dim) once */
    for (int i = 0; i < SWEEP_COUNT; i += 2 * SWEEP_N_MODS * SWEEP_N_MASKS) {
        sweep_case c = sweep_case_at(i);
        if (c.d <= SWEEP_GPU_DIM_MAX || c.d / SWEEP_DIM_STEP % 3 == 0 || c.d == SWEEP_DIM_MAX)
            out[n++] = with_options(c, HEAVIEST);
    }
    return n;
}

/* Every `stride`-th (D, Dv) pair with D != Dv to 256, each in the four
 * (kind, variant) combinations, in an option set that rotates with the
 * pair: a stride prime to the dim count walks through every D and Dv.
 * Then the pairs past it: the head-dim walk (sweep_dim_case) of both
 * kinds where D or Dv exceeds 256, its variant alternating (so every D
 * and Dv past 256 is assembled by some template). */
static int pair_cases(sweep_case *out, int stride)
{
    int n = 0;
    for (int i = 0; i < SWEEP_PAIRS; i += stride) {
        if (i / SWEEP_GPU_DIMS == i % SWEEP_GPU_DIMS)
            continue;
        for (int combo = 0; combo < 4; combo++)
            out[n++] = with_options(sweep_pair_case(i, combo),
                                    (sweep_pair_mix(i) / 3 + combo) % PTXAS_SETS);
    }
    for (int k = 0; k < SWEEP_DIMS; k++)
        for (int kind = 0; kind < 2; kind++) {   /* the walk's variant alternates with k */
            sweep_case c = sweep_dim_case(k, kind ? AJ_KIND_BACKWARD : AJ_KIND_FORWARD);
            if (c.d > SWEEP_GPU_DIM_MAX || c.dv > SWEEP_GPU_DIM_MAX)
                out[n++] = with_options(c, (k + kind) % PTXAS_SETS);
        }
    return n;
}

/* `cases` compiled for sm_80 and sm_90 at the default schedule and
 * assembled (those of shard `shard` of `shards`): every kernel of the
 * module with 0 spill bytes. */
typedef struct ptxas_arch {
    aj_target target;
    const char *arch;
} ptxas_arch;

static const ptxas_arch mma_archs[] = {{AJ_TARGET_SM_80, "sm_80"}, {AJ_TARGET_SM_90, "sm_90"},
                                       {0, NULL}};
static const ptxas_arch wgmma_archs[] = {{AJ_TARGET_SM_90A, "sm_90a"}, {0, NULL}};
static const ptxas_arch all_gpu_archs[] = {{AJ_TARGET_SM_80, "sm_80"}, {AJ_TARGET_SM_89, "sm_89"},
                                           {AJ_TARGET_SM_90, "sm_90"}, {AJ_TARGET_SM_90A, "sm_90a"},
                                           {0, NULL}};
/* the flash forward on FP8 tensor cores: Ada's mma.sync, Hopper's wgmma
 * (sm_90a takes the wgmma template without a schedule) */
static const ptxas_arch f8_mma_archs[] = {{AJ_TARGET_SM_89, "sm_89"}, {AJ_TARGET_SM_90A, "sm_90a"},
                                          {0, NULL}};

/* Whether arch `a` of a list assembles case `slot` when the cases are
 * spread over the archs, `spread` apart (0: every arch every case): arch a
 * takes the cases whose (slot + slot / 4) % spread is a % spread -- so
 * that consecutive cases (the next head dim; a pair's four (kind, variant)
 * combinations) alternate, and each kind, variant and dtype meets every
 * arch over the dims.  CI time: ptxas is most of the suite's. */
static int arch_takes(int a, int slot, int spread)
{
    return spread <= 0 || (slot + slot / 4) % spread == a % spread;
}

static void assemble_cases(aj_ctx *ctx, const sweep_case *cases, int count, int shard,
                           int shards, const ptxas_arch *archs, int spread)
{
    char ptxas[1024];
    spread = ptxas_spread(spread);
    if (!ptxas_find(ptxas, sizeof ptxas)) {
        CHECK_MSG(!ptxas_missing("ptxas sweep"), "ptxas is required");
        return;
    }
    aj_compile_job *jobs = calloc((size_t)count, sizeof *jobs);
    aj_op **ops = calloc((size_t)count, sizeof *ops);
    char(*labels)[160] = calloc((size_t)count, sizeof *labels);
    ptxas_result *results = calloc((size_t)count, sizeof *results);
    CHECK(jobs && ops && labels && results);
    for (int a = 0; archs[a].arch && jobs && ops && labels && results; a++) {
        int n = 0;
        for (int slot = 0; slot < count; slot++) {
            if (slot % shards != shard || !arch_takes(a, slot, spread))
                continue;
            const sweep_case *c = &cases[slot];
            sweep_label(c, labels[n], sizeof labels[n]);
            aj_op *op = parse_case(ctx, c);
            if (!op)
                continue;
            if (!template_takes(ctx, op, archs[a].target, labels[n])) {
                aj_op_destroy(op);
                continue;
            }
            ops[n] = op;
            memset(&jobs[n], 0, sizeof jobs[n]);
            jobs[n].op = op;
            n++;
        }
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = archs[a].target;
        aj_compile_many(ctx, jobs, (size_t)n, &opt, 0);
        ptxas_assemble_all(ptxas, archs[a].arch, jobs, results, n);
        int most_regs = 0;
        for (int j = 0; j < n; j++) {
            CHECK_MSG(jobs[j].status == AJ_OK, "%s %s: %s", labels[j], archs[a].arch,
                      jobs[j].message);
            if (jobs[j].status != AJ_OK)
                continue;
            CHECK_MSG(results[j].exit_code == 0, "%s %s: ptxas failed:\n%s", labels[j],
                      archs[a].arch, results[j].log);
            /* wgmma: no serialisation of the warpgroup's GEMMs (ptxas
             * warns where it must insert waits of its own) */
            CHECK_MSG(!strstr(results[j].log, "serializ"), "%s %s: ptxas says:\n%s",
                      labels[j], archs[a].arch, results[j].log);
            for (int st = 0; st < aj_kernel_num_stages(jobs[j].kernel); st++) {
                ptxas_result r;
                const char *entry = aj_kernel_stage_entry(jobs[j].kernel, st);
                CHECK_MSG(ptxas_entry(&results[j], entry, &r) == 0,
                          "%s %s: no ptxas report for %s", labels[j], archs[a].arch, entry);
                CHECK_MSG(r.spill_stores == 0 && r.spill_loads == 0,
                          "%s %s (%s): spills %d/%d bytes, %d registers", labels[j],
                          archs[a].arch, entry, r.spill_stores, r.spill_loads, r.registers);
                most_regs = r.registers > most_regs ? r.registers : most_regs;
            }
            aj_kernel_destroy(jobs[j].kernel);
            aj_op_destroy(ops[j]);
        }
        printf("ptxas %s: %d kernels of shard %d/%d assembled, at most %d registers\n",
               archs[a].arch, n, shard, shards, most_regs);
        /* a sweep whose every case the template refuses proves nothing */
        CHECK_MSG(n > 0, "ptxas %s: no case of the sweep compiled (shard %d/%d)", archs[a].arch,
                  shard, shards);
    }
    free(jobs);
    free(ops);
    free(labels);
    free(results);
}

/* `ptxas [shard shards]`: the main product; `ptxas pairs [stride [shard
 * shards]]`: the (D, Dv) pairs, every PAIR_STRIDE-th by default, every
 * one with stride 1; `ptxas wgmma`: the flash forward's wgmma template. */
#define PAIR_STRIDE 29

/* The wgmma template's cases (sm_90a): every head dim (8..256) with both
 * dtypes and 1 and 2 warpgroups in turn, with no options (causal: the
 * widest default tiles) and in the HEAVIEST option set, and D != Dv pairs
 * (every D with a Dv 13 steps on) in it, then head dims past 256
 * (below); `ptxas ws` the same warp specialised (producer = 1) to 256, and
 * every fourth head dim once more with a mask whose tile classes skip
 * tiles (the consumers' skip path finishes a held P V: no wgmma may be
 * serialised there either). */
static int wgmma_cases(sweep_case *out, int producer)
{
    int n = 0;
    for (int d = SWEEP_DIM_STEP; d <= SWEEP_GPU_DIM_MAX; d += SWEEP_DIM_STEP)
        for (int dt = 0; dt < 2; dt++) {   /* f16, bf16 */
            sweep_case c = {.kind = AJ_KIND_FORWARD, .variant = AJ_VARIANT_FLASH,
                            .dtype = sweep_dtypes[dt], .d = d, .dv = d};
            sweep_case plain = c;   /* the widest tiles: no options, causal */
            plain.mask = sweep_masks[1];
            plain.score_mod = sweep_mods[0];
            plain.warpgroups = 2 - (d / 8 + dt) % 2;
            plain.producer = producer;
            out[n++] = plain;
            c = with_options(c, HEAVIEST);
            c.warpgroups = 1 + (d / 8 + dt) % 2;
            c.producer = producer;
            out[n++] = c;
            if (producer && d % 32 == 0) {
                sweep_case skips = c;
                skips.mask = "expr((k / 32) % 2 == 0)";
                out[n++] = skips;
            }
            c.dv = SWEEP_DIM_STEP * (1 + (d / SWEEP_DIM_STEP + 12) % SWEEP_GPU_DIMS);
            c.warpgroups = 3 - c.warpgroups;
            out[n++] = c;
        }
    /* past 256 (not warp specialised: refused there), every third head dim
     * and 512 as the main sweep: D = Dv on the warpgroup pair that splits
     * Dv, and D alone past 256 (Dv 13 steps on within 256) on 1 or 2 */
    for (int d = SWEEP_GPU_DIM_MAX + SWEEP_DIM_STEP; !producer && d <= SWEEP_DIM_MAX;
         d += SWEEP_DIM_STEP) {
        int k = d / SWEEP_DIM_STEP;
        if (k % 3 && d != SWEEP_DIM_MAX)
            continue;
        sweep_case c = {.kind = AJ_KIND_FORWARD, .variant = AJ_VARIANT_FLASH,
                        .dtype = sweep_dtypes[k % 2], .d = d, .dv = d, .warpgroups = 2,
                        .mask = sweep_masks[1], .score_mod = sweep_mods[0]};
        out[n++] = c;
        out[n++] = with_options(c, HEAVIEST);
        c.dv = SWEEP_DIM_STEP * (1 + (k + 12) % SWEEP_GPU_DIMS);
        c.warpgroups = 1 + k % 2;
        out[n++] = with_options(c, HEAVIEST);
    }
    return n;
}

/* The flash backward's wgmma kernels (sm_90a) at the edge of what they
 * take (D + Dv up to 256, 192 with dropout; templates/flash_bwd.c
 * "wgmma"): every D = Dv to 128 and every D with Dv = 256 - D, both
 * dtypes, 1 and 2 warpgroups, in the HEAVIEST option set (deterministic)
 * and in set 1 (dropout, atomic dQ; on two warpgroups past D = 128) in
 * turn -- with dropout past D + Dv = 192, every other pair's Dv = 192 -
 * D (D < 192), else the set without dropout. */
static int wgmma_bwd_cases(sweep_case *out)
{
    int n = 0;
    for (int d = SWEEP_DIM_STEP; d < SWEEP_GPU_DIM_MAX; d += SWEEP_DIM_STEP) {
        int k = d / SWEEP_DIM_STEP;
        for (int pair = 0; pair < (d <= SWEEP_GPU_DIM_MAX / 2 ? 2 : 1); pair++) {
            int dv = pair ? d : SWEEP_GPU_DIM_MAX - d;
            sweep_case c = {.kind = AJ_KIND_BACKWARD, .variant = AJ_VARIANT_FLASH,
                            .dtype = sweep_dtypes[(k + pair) % 2], .d = d, .dv = dv};
            int atomic = (k + pair) % 2;
            c = with_options(c, atomic ? 1 : HEAVIEST);
            if (c.d + c.dv > 192 && !pair && c.d < 192 && k % 2)
                c.dv = 192 - c.d;
            else if (c.d + c.dv > 192)
                c.dropout = 0;
            c.deterministic = !atomic;
            c.warpgroups = atomic && d > SWEEP_GPU_DIM_MAX / 2 ? 2 : 1 + (k / 2 + pair) % 2;
            out[n++] = c;
        }
    }
    /* past 256, two warpgroups split dK and dV: D = Dv to 256, and D + Dv
     * = 320 from D 64 to 256 (with dropout where D and Dv are within 192) */
    for (int d = SWEEP_DIM_STEP; d <= SWEEP_GPU_DIM_MAX; d += SWEEP_DIM_STEP)
        for (int pair = 0; pair < 2; pair++) {
            int k = d / SWEEP_DIM_STEP, dv = pair ? 320 - d : d;
            if ((pair ? d % 16 || dv > SWEEP_GPU_DIM_MAX : d <= SWEEP_GPU_DIM_MAX / 2))
                continue;
            sweep_case c = {.kind = AJ_KIND_BACKWARD, .variant = AJ_VARIANT_FLASH,
                            .dtype = sweep_dtypes[(k + pair) % 2], .d = d, .dv = dv};
            int atomic = (k + pair) % 2;
            c = with_options(c, atomic ? 1 : HEAVIEST);
            c.deterministic = !atomic;
            c.dropout = (d > 192 || dv > 192) ? 0 : c.dropout;
            c.warpgroups = 2;
            out[n++] = c;
        }
    return n;
}

/* FP8 inputs (the efficient forward's, docs/ir.md "FP8 inputs"): every
 * head dim 8..512 with D = Dv, and every fourth with a Dv 13 steps on,
 * e4m3 and e5m2, bf16 and f16 outputs, padded and varlen in turn, in the
 * heaviest option set the layout allows (varlen: no bias on the GPU
 * templates). */
static int fp8_cases(sweep_case *out)
{
    int n = 0;
    for (int d = SWEEP_DIM_STEP; d <= SWEEP_DIM_MAX; d += SWEEP_DIM_STEP)
        for (int pair = 0; pair < (d / SWEEP_DIM_STEP % 4 == 0 ? 2 : 1); pair++) {
            int k = d / SWEEP_DIM_STEP;
            sweep_case c = {.kind = AJ_KIND_FORWARD, .variant = AJ_VARIANT_EFFICIENT,
                            .dtype = sweep_dtypes[(k + pair) % 2], .d = d, .dv = d};
            c = with_options(c, HEAVIEST);
            c.f8 = (k + pair) / 2 % 2 ? AJ_DTYPE_F8E5M2 : AJ_DTYPE_F8E4M3;
            c.varlen = (k + pair) % 3 == 0;
            c.bias = c.bias && !c.varlen;
            if (pair)
                c.dv = SWEEP_DIM_STEP * (1 + (k - 1 + 13) % SWEEP_DIMS);
            out[n++] = c;
        }
    return n;
}

/* The flash forward's FP8 tensor-core kernel: every head dim it takes
 * (multiples of 32 to 256), D = Dv and D with the next Dv, both formats,
 * padded and varlen, the heaviest options it takes (no dropout). */
static int fp8_flash_cases(sweep_case *out)
{
    int n = 0;
    for (int d = 32; d <= SWEEP_GPU_DIM_MAX; d += 32)
        for (int pair = 0; pair < 2; pair++) {
            sweep_case c = {.kind = AJ_KIND_FORWARD, .variant = AJ_VARIANT_FLASH,
                            .dtype = sweep_dtypes[(d / 32 + pair) % 2], .d = d, .dv = d};
            c = with_options(c, HEAVIEST);
            c.dropout = 0;
            c.f8 = (d / 32 + pair) % 2 ? AJ_DTYPE_F8E5M2 : AJ_DTYPE_F8E4M3;
            c.varlen = pair;
            if (pair)
                c.dv = d % 256 + 32;
            out[n++] = c;
        }
    return n;
}

/* Shared K/V caches of 16-bit values (kv_shared, absorbed MLA's layout,
 * on the flash variant's mma tiles: flash_fwd.c "Paged"): every third
 * head dim to 576, and 512, 520 and 576, each with Dv = D (512 past it)
 * and no options, and with the head-dim walk's Dv under D and the
 * heaviest set a paged op takes (none of dropout, bias, accumulate) or
 * softcap with a causal mask, in turn; both dtypes, varlen queries at
 * every other head dim; an e4m3 or e5m2 cache (widened in shared memory)
 * at every other head dim of whole 16-byte rows. */
static int shared_cases(sweep_case *out)
{
    int n = 0;
    for (int k = 1; k <= 72; k++) {
        if (k % 3 && k != 64 && k != 65)
            continue;
        for (int pair = 0; pair < 2; pair++) {
            sweep_case c = {.kind = AJ_KIND_FORWARD, .variant = AJ_VARIANT_FLASH,
                            .dtype = sweep_dtypes[(k + pair) % 2], .d = 8 * k,
                            .dv = 8 * k < 512 ? 8 * k : 512, .shared = 1};
            c = with_options(c, pair ? (k % 2 ? HEAVIEST : 2) : 0);
            c.bias = c.accumulate = c.deterministic = 0;
            c.dropout = 0;
            c.varlen = k % 2;
            if (k % 2 == 0 && (k + pair) % 4 < 2)
                c.kv_f8 = pair ? AJ_DTYPE_F8E5M2 : AJ_DTYPE_F8E4M3;
            if (pair)
                c.dv = 8 * (1 + (k * 13 + 5) % (k < 64 ? k : 64));
            out[n++] = c;
        }
    }
    return n;
}

static void test_ptxas(aj_ctx *ctx, int argc, char **argv)
{
    static sweep_case cases[4 * SWEEP_PAIRS + 2 * 2 * SWEEP_N_DTYPES * SWEEP_DIMS * PTXAS_SETS +
                            2 * SWEEP_DIMS];
    if (argc > 2 && strcmp(argv[2], "fp8") == 0) {
        int n = fp8_cases(cases);
        printf("ptxas fp8: %d efficient forward cases with f8 inputs\n", n);
        assemble_cases(ctx, cases, n, 0, 1, all_gpu_archs, 2);
        n = fp8_flash_cases(cases);
        printf("ptxas fp8: %d flash forward cases on FP8 tensor cores\n", n);
        assemble_cases(ctx, cases, n, 0, 1, f8_mma_archs, 0);
        for (int i = 0; i < n; i++)   /* and on one warpgroup (sm_90a's default: two) */
            cases[i].warpgroups = 1;
        printf("ptxas fp8: the same on one warpgroup\n");
        assemble_cases(ctx, cases, n, 0, 1, wgmma_archs, 0);
        for (int i = 0; i < n; i++) {   /* and warp specialised, two and one in turn */
            cases[i].warpgroups = 1 + i % 2;
            cases[i].producer = 1;
        }
        printf("ptxas fp8: the same warp specialised\n");
        assemble_cases(ctx, cases, n, 0, 1, wgmma_archs, 0);
        return;
    }
    if (argc > 2 && strcmp(argv[2], "shared") == 0) {
        int n = shared_cases(cases);
        printf("ptxas shared: %d paged forward cases over a shared K/V cache on mma tiles\n", n);
        assemble_cases(ctx, cases, n, 0, 1, all_gpu_archs, 2);
        return;
    }
    if (argc > 2 && strcmp(argv[2], "wgmma_bwd") == 0) {
        int n = wgmma_bwd_cases(cases);
        printf("ptxas wgmma_bwd: %d flash backward cases on wgmma\n", n);
        assemble_cases(ctx, cases, n, 0, 1, wgmma_archs, 0);
        return;
    }
    int ws = argc > 2 && strcmp(argv[2], "ws") == 0;
    if (ws || (argc > 2 && strcmp(argv[2], "wgmma") == 0)) {
        int n = wgmma_cases(cases, ws);
        printf("ptxas %s: %d flash forward cases on the wgmma template%s\n", argv[2], n,
               ws ? ", warp specialised" : "");
        assemble_cases(ctx, cases, n, 0, 1, wgmma_archs, 0);
        return;
    }
    int pairs = argc > 2 && strcmp(argv[2], "pairs") == 0;
    int at = 2 + pairs;
    int stride = pairs && argc > at ? atoi(argv[at++]) : PAIR_STRIDE;
    int shard = argc > at + 1 ? atoi(argv[at]) : 0;
    int shards = argc > at + 1 ? atoi(argv[at + 1]) : 1;
    if (stride < 1 || shards < 1 || shard < 0 || shard >= shards) {
        CHECK_MSG(0, "usage: ptxas [pairs [STRIDE]] [SHARD SHARDS]");
        return;
    }
    int n = pairs ? pair_cases(cases, stride) : main_cases(cases);
    if (pairs)
        printf("ptxas pairs: every %d-th (D, Dv) pair with D != Dv and the head-dim walk past "
               "256, %d cases\n", stride, n);
    assemble_cases(ctx, cases, n, shard, shards, mma_archs, 2);
}

/* ---------------------------------------------------------------- numeric */

/* Every SWEEP_SAMPLE_STRIDE-th case of the product: a prime stride walks
 * through every head dim, dtype, mask, mod and bias in turn. */
#define SWEEP_SAMPLE_STRIDE 37

/* One forward sweep case on `dev`, B1 H2, lengths 17..40 from the index;
 * 0 where the device's template declines the op (flash f32 on sim). */
static int run_forward_sample(aj_ctx *ctx, aj_device *dev, int index, const sweep_case *c)
{
    char label[160];
    sweep_label(c, label, sizeof label);
    aj_op *op = parse_case(ctx, c);
    int takes = op && template_takes(ctx, op, aj_device_target(dev), label);
    aj_op_destroy(op);
    if (!takes)
        return 0;
    fwd_case fc = {.label = label, .dtype = c->dtype, .d = c->d, .dv = c->dv, .mask = c->mask,
                   .score_mod = c->score_mod, .b = 1, .hq = 2, .hkv = index % 2 ? 1 : 2,
                   .sq = 17 + index % 24, .sk = 17 + (index / 24) % 24, .seed = (uint64_t)index};
    fwd_options x = {0};
    if (c->bias) {
        x.bias_shape[0] = 1;
        x.bias_shape[1] = 2;
        x.bias_shape[2] = fc.sq;
        x.bias_shape[3] = fc.sk;
        x.bias_magnitude = 1.0;
    }
    fwd_run_options run = {.variant = c->variant};
    fwd_result r = fwd_run_case_ext(ctx, dev, &fc, &x, &run);
    CHECK_MSG(r.status == AJ_OK, "%s on %s: %s", label, aj_target_name(aj_device_target(dev)),
              aj_last_error(ctx));
    if (r.status != AJ_OK)
        return 1;
    CHECK_MSG(r.max_err_o <= 1.0 && r.max_err_lse <= 1.0,
              "%s on %s: o %.3g, lse %.3g of the tolerance", label,
              aj_target_name(aj_device_target(dev)), r.max_err_o, r.max_err_lse);
    CHECK_MSG(r.exact_empty_rows, "%s: a row without keys is not O = 0, LSE = -inf", label);
    return 1;
}

static void test_numeric(aj_ctx *ctx)
{
    static const aj_device_kind kinds[2] = {AJ_DEVICE_SIM, AJ_DEVICE_CPU};
    for (int d = 0; d < 2; d++) {
        aj_device *dev;
        CHECK_STATUS(ctx, aj_device_open(ctx, kinds[d], 0, &dev), AJ_OK);
        int ran = 0;
        for (int i = 0; i < SWEEP_COUNT; i += SWEEP_SAMPLE_STRIDE) {
            sweep_case c = sweep_case_at(i);
            if (c.kind != AJ_KIND_FORWARD || !sweep_case_valid(&c))
                continue;
            ran += run_forward_sample(ctx, dev, i, &c);
        }
        int walked = 0;
        for (int k = 0; k < SWEEP_DIMS; k++) {
            sweep_case c = sweep_dim_case(k, AJ_KIND_FORWARD);
            walked += run_forward_sample(ctx, dev, SWEEP_COUNT + k, &c);
        }
        printf("numeric: %d forward sweep cases and %d of the head-dim walk on %s against the "
               "reference\n", ran, walked, aj_target_name(aj_device_target(dev)));
        fwd_cache_clear();
        aj_device_close(dev);
    }
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    aj_ctx *ctx;
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    const char *mode = argc > 1 ? argv[1] : "accept";
    if (strcmp(mode, "accept") == 0)
        test_accept(ctx);
    else if (strcmp(mode, "numeric") == 0)
        test_numeric(ctx);
    else if (strcmp(mode, "ptxas") == 0)
        test_ptxas(ctx, argc, argv);
    aj_ctx_destroy(ctx);
    return check_report();
}
