/*
 * test_ptx.c -- every flash-forward, efficient-forward and efficient-backward kernel of
 * the matrix dtype x head dim x mask (plus D != Dv, the score mods, and
 * for the forward accumulate, bias and dropout, for the backward bias and
 * dropout), the paged forward's parts and merge, and the merge kernel
 * compile to PTX that ptxas accepts for sm_80 and sm_90 with no spills
 * (each kernel of a multi-kernel module on its own); the example specs'
 * sm_80 and sm_90 PTX for Blackwell's sm_100 and sm_120 too.  The
 * efficient matrices generate PTX for both archs and assemble each case
 * on one of them in turn (matrix_takes: consecutive cases alternate, so
 * every dtype and head dim meets both; CI time), as test_sweep_ptxas
 * does; AJ_PTXAS_SPREAD=0 assembles every case on both.
 *
 * GQA and the sequence lengths are launch arguments, not part of the op, so
 * they do not change the kernel and are not a dimension here (the numeric
 * tests on sim cover them).  Without ptxas the PTX is still generated and
 * checked for its entry and .version, and the assembly is skipped with a
 * printed reason.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ptxas_util.h"
#include "runtime/runtime.h"
#include "templates/score.h"
#include "spec_dir.h"

static const char *const dtypes[] = {"f16", "bf16", "f32"};
static const int dims[] = {32, 64, 96, 128, 256};
static const char *const masks[] = {"none", "causal(top_left)", "causal(bottom_right)",
                                    "window(128, 0, bottom_right)"};
static const char *const archs[] = {"sm_80", "sm_90"};

static int have_ptxas;
static int spread;   /* the matrices' (matrix_takes): ptxas_spread(2) */
static char ptxas[1024];
static int kernels, assembled;

static void check_kernel(const char *label, aj_kernel *k, aj_target target, const char *arch,
                         const ptxas_result *assembled_already);

static void check_spec(aj_ctx *ctx, const char *label, const char *spec, aj_target target,
                       const char *arch)
{
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), label, &op), AJ_OK);
    if (!op)
        return;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
    aj_op_destroy(op);
    if (k)
        check_kernel(label, k, target, arch, NULL);
}

/* The PTX of a compiled kernel through ptxas for `arch` (or its report,
 * when the caller assembled it already; arch NULL: not assembled):
 * entries, no spills; releases k. */
static void check_kernel(const char *label, aj_kernel *k, aj_target target, const char *arch,
                         const ptxas_result *assembled_already)
{
    kernels++;
    size_t len;
    const char *ptx = aj_kernel_code(k, &len);
    char want[64];
    snprintf(want, sizeof want, ".version %s", aj_ptx_version(target));
    CHECK_MSG(strstr(ptx, want) != NULL, "%s: PTX lacks '%s'", label, want);
    int stages = aj_kernel_num_stages(k);
    for (int s = 0; s < stages; s++)
        CHECK_MSG(strstr(ptx, aj_kernel_stage_entry(k, s)) != NULL, "%s: entry %d missing",
                  label, s);
    if (have_ptxas && arch) {
        ptxas_result all;
        if (assembled_already)
            all = *assembled_already;
        else
            ptxas_run(ptxas, arch, ptx, len, &all);
        CHECK_MSG(all.exit_code == 0, "%s %s: ptxas failed:\n%s", label, arch, all.log);
        /* each kernel of the module (backward: dkdv, then dq) on its own */
        for (int s = 0; s < stages; s++) {
            const char *entry = aj_kernel_stage_entry(k, s);
            ptxas_result r;
            CHECK_MSG(ptxas_entry(&all, entry, &r) == 0, "%s %s: no ptxas report for %s",
                      label, arch, entry);
            CHECK_MSG(r.spill_stores == 0 && r.spill_loads == 0,
                      "%s %s: spills %d/%d bytes", label, arch, r.spill_stores, r.spill_loads);
            CHECK_MSG(r.registers > 0 && r.registers <= 255, "%s %s: %d registers", label,
                      arch, r.registers);
            aj_launch_info li;
            aj_kernel_stage_info(k, s, &li);
            printf("%-44s %s %-4s regs %3d spill %d/%d smem %6d\n", label, arch,
                   stages > 1 ? strrchr(entry, '_') + 1 : "", r.registers, r.spill_stores,
                   r.spill_loads, li.dynamic_smem);
        }
        assembled++;
    }
    aj_kernel_destroy(k);
}

/* Whether the a-th of two archs assembles case `slot` (see the top) */
static int matrix_takes(size_t a, size_t slot)
{
    return spread <= 0 || slot % (size_t)spread == a % (size_t)spread;
}

/* Every example spec a user copies from compiles and assembles too. */
static void check_example(const char *name, const char *path, const char *text, size_t len,
                          void *user)
{
    (void)path, (void)len;
    CHECK_MSG(text != NULL, "cannot read %s", path);
    for (size_t a = 0; text && a < 2; a++)
        check_spec(user, name, text, a == 0 ? AJ_TARGET_SM_80 : AJ_TARGET_SM_90, archs[a]);
}

static void check_examples(aj_ctx *ctx, const char *dir)
{
    int seen = spec_dir_each(dir, check_example, ctx);
    CHECK_MSG(seen >= 8, "only %d example specs in %s", seen, dir);
}

/*
 * Blackwell runs what exists (issue #30 stage 6): a 10.x or 12.x GPU
 * reports target sm_90 and its driver compiles the sm_90 PTX (sm_90a code
 * runs on 9.0 only), so every example spec's sm_90 kernel, and its sm_80
 * one, must assemble for sm_100 (B200) and sm_120 (RTX 50-series) with
 * no spills: each PTX for one of them in turn (matrix_takes over the
 * examples), so every example meets both archs and each arch both PTX.
 */
static void check_blackwell_example(const char *name, const char *path, const char *text,
                                    size_t len, void *user)
{
    (void)len;
    aj_ctx *ctx = user;
    static const char *const blackwell[] = {"sm_100", "sm_120"};
    static size_t seen;   /* examples so far */
    const size_t slot = seen++;
    CHECK_MSG(text != NULL, "cannot read %s", path);
    for (int t = 0; text && t < 2; t++) {
        aj_target target = t ? AJ_TARGET_SM_90 : AJ_TARGET_SM_80;
        aj_op *op = NULL;
        aj_kernel *k = NULL;
        CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), name, &op), AJ_OK);
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = target;
        if (op)
            CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
        aj_op_destroy(op);
        for (int b = 0; k && b < 2; b++) {
            if (!matrix_takes((size_t)b, slot + (size_t)t))
                continue;
            char label[160];
            snprintf(label, sizeof label, "%s (%s PTX)", name, aj_target_name(target));
            size_t n;
            const char *ptx = aj_kernel_code(k, &n);
            ptxas_result r;
            ptxas_run(ptxas, blackwell[b], ptx, n, &r);
            CHECK_MSG(r.exit_code == 0, "%s %s: ptxas failed:\n%s", label, blackwell[b], r.log);
            for (int s = 0; r.exit_code == 0 && s < aj_kernel_num_stages(k); s++) {
                ptxas_result e;
                const char *entry = aj_kernel_stage_entry(k, s);
                CHECK_MSG(ptxas_entry(&r, entry, &e) == 0 && e.spill_stores == 0 &&
                          e.spill_loads == 0, "%s %s (%s): spills %d/%d bytes", label,
                          blackwell[b], entry, e.spill_stores, e.spill_loads);
            }
            assembled++;
        }
        kernels++;
        aj_kernel_destroy(k);
    }
}

/* The block-mask builders (templates/block_mask.c) of the masks that
 * take one (a load, a product of positions) and of a band, at the tile of
 * the forward kernel they serve. */
static void check_block_mask_builders(aj_ctx *ctx, aj_target target, const char *arch)
{
    static const char *const mask_exprs[] = {"expr(doc[b, q] == doc[b, k] && k <= q)",
                                             "expr((q * k) % 3 != 0 || k <= q)",
                                             "causal(top_left)"};
    for (size_t m = 0; m < sizeof mask_exprs / sizeof mask_exprs[0]; m++) {
        char spec[256], label[128];
        snprintf(spec, sizeof spec, "attention forward flash { dtype = bf16 head_dim = 64 "
                 "tensors = (doc: i32[2]) mask = %s }", mask_exprs[m]);
        snprintf(label, sizeof label, "block mask builder %s", mask_exprs[m]);
        aj_op *op = NULL;
        aj_kernel *k = NULL, *builder = NULL;
        CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), label, &op), AJ_OK);
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = target;
        if (op)
            CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
        aj_score_prog prog;
        if (k && aj_score_prog_init(ctx, op, &prog) == AJ_OK) {
            CHECK_STATUS(ctx, aj_compile_block_mask(ctx, k, op, aj_score_mask_hash(&prog),
                                                    &builder), AJ_OK);
            aj_score_prog_free(&prog);
        }
        if (builder)
            check_kernel(label, builder, target, arch, NULL);
        aj_kernel_destroy(k);
        aj_op_destroy(op);
    }
}

/* The flash forward: every head dim (and 192/128) x dtype x mask at its
 * default schedule, then the options that add registers (dropout's
 * Philox, alibi, accumulate, varlen), compiled together by
 * aj_compile_many and assembled by parallel ptxas runs, to use every
 * core.  A padded causal kernel is the same code for both alignments (the
 * shift is a launch argument), so the matrix takes causal(top_left) alone;
 * the varlen rows, whose kernels compute the shift, take bottom_right. */
static void check_flash_forward(aj_ctx *ctx, aj_target target, const char *arch)
{
    static const int flash_dims[][2] = {{32, 32}, {64, 64}, {96, 96}, {128, 128},
                                        {192, 192}, {256, 256}, {192, 128}};
    static const char *const flash_extra[][2] = {
        {"flash f16 d64 dropout+alibi window", "dtype = f16\n head_dim = 64\n dropout = 0.1\n"
                                               " score_mod = alibi\n"
                                               " mask = window(64, 0, bottom_right)"},
        {"flash bf16 d128 dropout+softcap causal", "dtype = bf16\n head_dim = 128\n"
                                                   " dropout = 0.2\n score_mod = softcap(30.0)\n"
                                                   " mask = causal(top_left)"},
        {"flash f16 d256 dropout+alibi+acc window", "dtype = f16\n head_dim = 256\n"
                                                    " dropout = 0.2\n score_mod = alibi\n"
                                                    " accumulate = true\n"
                                                    " mask = window(64, 0, bottom_right)"},
        {"flash bf16 d192/128 acc+softcap causal", "dtype = bf16\n head_dim = 192\n"
                                                   " head_dim_v = 128\n accumulate = true\n"
                                                   " score_mod = softcap(30.0)\n"
                                                   " mask = causal(bottom_right)"},
        {"flash f16 d128 varlen+dropout causal", "dtype = f16\n head_dim = 128\n"
                                                 " layout = varlen\n dropout = 0.1\n"
                                                 " mask = causal(bottom_right)"},
        {"flash bf16 d256 varlen+alibi+acc window", "dtype = bf16\n head_dim = 256\n"
                                                    " layout = varlen\n score_mod = alibi\n"
                                                    " accumulate = true\n"
                                                    " mask = window(64, 0, bottom_right)"},
        {"flash f16 d32 varlen+softcap+dropout", "dtype = f16\n head_dim = 32\n"
                                                 " layout = varlen\n dropout = 0.3\n"
                                                 " score_mod = softcap(30.0)"},
        /* past Dv 256: warp pairs, each half of O (an odd half at 264) */
        {"flash bf16 d512 dropout+alibi+acc window", "dtype = bf16\n head_dim = 512\n"
                                                     " dropout = 0.2\n score_mod = alibi\n"
                                                     " accumulate = true\n"
                                                     " mask = window(64, 0, bottom_right)"},
        {"flash f16 d264 varlen+softcap causal", "dtype = f16\n head_dim = 264\n"
                                                 " layout = varlen\n score_mod = softcap(30.0)\n"
                                                 " mask = causal(bottom_right)"},
    };
    static const char *const flash_masks[] = {"none", "causal(top_left)",
                                              "window(128, 0, bottom_right)"};
    /* every head dim that is an odd multiple of 8, and D != Dv with them,
     * once each, dtype and mask rotating */
    enum { N_ODD = 16 + 3 };
    int odd_dims[N_ODD][2];
    for (int i = 0; i < 16; i++)
        odd_dims[i][0] = odd_dims[i][1] = 8 + 16 * i;
    static const int odd_pairs[3][2] = {{40, 24}, {72, 136}, {248, 8}};
    memcpy(odd_dims[16], odd_pairs, sizeof odd_pairs);
    enum {
        N_MATRIX = 2 * 7 * 3,
        N = N_MATRIX + (int)(sizeof flash_extra / sizeof flash_extra[0]) + N_ODD
    };
    static char labels[N][128], specs[N][512];
    static aj_compile_job jobs[N];
    static aj_op *ops[N];
    static ptxas_result results[N];
    int n = 0;
    for (size_t t = 0; t < 2; t++)
        for (size_t d = 0; d < 7; d++)
            for (size_t m = 0; m < 3; m++, n++) {
                snprintf(specs[n], sizeof specs[n],
                         "attention forward flash {\n dtype = %s\n head_dim = %d\n"
                         " head_dim_v = %d\n mask = %s\n}\n", dtypes[t], flash_dims[d][0],
                         flash_dims[d][1], flash_masks[m]);
                snprintf(labels[n], sizeof labels[n], "flash %s d%d/%d %s", dtypes[t],
                         flash_dims[d][0], flash_dims[d][1], flash_masks[m]);
            }
    for (size_t i = 0; i < sizeof flash_extra / sizeof flash_extra[0]; i++, n++) {
        snprintf(specs[n], sizeof specs[n], "attention forward flash {\n %s\n}\n",
                 flash_extra[i][1]);
        snprintf(labels[n], sizeof labels[n], "%s", flash_extra[i][0]);
    }
    for (int i = 0; i < N_ODD; i++, n++) {
        const char *dt = dtypes[i % 2], *mask = flash_masks[i % 3];
        snprintf(specs[n], sizeof specs[n],
                 "attention forward flash {\n dtype = %s\n head_dim = %d\n"
                 " head_dim_v = %d\n mask = %s\n}\n", dt, odd_dims[i][0], odd_dims[i][1], mask);
        snprintf(labels[n], sizeof labels[n], "flash %s d%d/%d %s", dt, odd_dims[i][0],
                 odd_dims[i][1], mask);
    }
    for (int i = 0; i < n; i++) {
        ops[i] = NULL;
        CHECK_STATUS(ctx, aj_op_parse(ctx, specs[i], strlen(specs[i]), labels[i], &ops[i]),
                     AJ_OK);
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].op = ops[i];
    }
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    CHECK_STATUS(ctx, aj_compile_many(ctx, jobs, (size_t)n, &opt, 0), AJ_OK);
    if (have_ptxas)
        ptxas_assemble_all(ptxas, arch, jobs, results, n);
    for (int i = 0; i < n; i++) {
        CHECK_MSG(jobs[i].status == AJ_OK, "%s: %s", labels[i], jobs[i].message);
        if (jobs[i].kernel)
            check_kernel(labels[i], jobs[i].kernel, target, arch,
                         have_ptxas ? &results[i] : NULL);
        aj_op_destroy(ops[i]);
    }
}

/* The ptxas figures of every kernel (stage) of a compiled module, which
 * must spill nothing. */
static void check_stages(const char *label, const char *arch, aj_kernel *k)
{
    size_t len;
    const char *ptx = aj_kernel_code(k, &len);
    ptxas_result all;
    ptxas_run(ptxas, arch, ptx, len, &all);
    CHECK_MSG(all.exit_code == 0, "%s %s: ptxas failed:\n%s", label, arch, all.log);
    for (int s = 0; s < aj_kernel_num_stages(k); s++) {
        const char *entry = aj_kernel_stage_entry(k, s);
        ptxas_result r;
        CHECK_MSG(ptxas_entry(&all, entry, &r) == 0, "%s %s: no ptxas report for %s", label,
                  arch, entry);
        CHECK_MSG(r.spill_stores == 0 && r.spill_loads == 0, "%s %s %s: spills %d/%d bytes",
                  label, arch, entry, r.spill_stores, r.spill_loads);
        aj_launch_info li;
        aj_kernel_stage_info(k, s, &li);
        printf("%-44s %s %-10s regs %3d spill %d/%d smem %6d\n", label, arch,
               strstr(entry, "_bwd_") ? strchr(strstr(entry, "_bwd_") + 5, '_') + 1 : entry,
               r.registers, r.spill_stores, r.spill_loads, li.dynamic_smem);
    }
    assembled++;
}

/*
 * The flash backward's default schedules: each head dim on both GPU
 * targets, deterministic (delta, dkdv, dq) and atomic (delta, dkdv,
 * dq_convert) modules, the dtypes and masks rotating; then the options
 * that add code to the element pass (softcap, alibi, dropout, varlen);
 * then head dims that are odd multiples of 8 or split their tiles over
 * the warps unevenly (80, 176), one mode each.  Every D = Dv of the range
 * is test_sweep_ptxas's.  Not yet here because their defaults still spill
 * with some masks: D != Dv pairs far apart (72/136, 248/8, 8/256: a
 * product of many n8 tiles per warp beside a narrow one, whose mma
 * fragments the state model does not count).  Compiled in parallel with
 * aj_compile_many, then assembled one by one.
 */
static void check_flash_bwd(aj_ctx *ctx)
{
    static const int fdims[7][2] = {{32, 32},   {64, 64},   {96, 96}, {128, 128},
                                    {192, 192}, {256, 256}, {192, 128}};
    static const char *const extras[4] = {
        "dtype = f16 head_dim = 128 score_mod = softcap(30.0) dropout = 0.1 "
        "mask = causal(top_left)",
        "dtype = bf16 head_dim = 64 score_mod = alibi layout = varlen deterministic = true "
        "mask = causal(bottom_right)",
        "dtype = bf16 head_dim = 256 dropout = 0.2 deterministic = true "
        "mask = window(64, 0, bottom_right)",
        /* past 256: 16 x 16 tiles on 8 warps, the most registers there */
        "dtype = bf16 head_dim = 512 score_mod = softcap(30.0) dropout = 0.2 "
        "mask = window(64, 0, bottom_right)",
    };
    static const int odd_dims[10] = {8, 24, 40, 72, 80, 88, 152, 176, 216, 248};
    enum { PER_ARCH = 14 + 4 + 10, N = 2 * PER_ARCH };
    char labels[N][96], specs[N][320];
    aj_op *ops[N] = {0};
    aj_compile_job jobs[N];
    memset(jobs, 0, sizeof jobs);
    for (int a = 0; a < 2; a++) {
        for (int i = 0; i < 14; i++) {
            int d = i / 2, det = i % 2, x = a * PER_ARCH + i;
            const char *dt = dtypes[(d + det + a) % 2];
            const char *mask = masks[(d + det + a) % 4];
            snprintf(specs[x], sizeof specs[x], "attention backward flash { dtype = %s "
                     "head_dim = %d head_dim_v = %d mask = %s deterministic = %s }", dt,
                     fdims[d][0], fdims[d][1], mask, det ? "true" : "false");
            snprintf(labels[x], sizeof labels[x], "flash bwd %s d%d/%d %s%s", dt, fdims[d][0],
                     fdims[d][1], det ? "det " : "", mask);
        }
        for (int i = 0; i < 4; i++) {
            int x = a * PER_ARCH + 14 + i;
            snprintf(specs[x], sizeof specs[x], "attention backward flash { %s }", extras[i]);
            snprintf(labels[x], sizeof labels[x], "flash bwd extra %d", i);
        }
        for (int i = 0; i < 10; i++) {
            int x = a * PER_ARCH + 18 + i, det = (i + a) % 2;
            const char *dt = dtypes[i % 2], *mask = masks[(i + a) % 4];
            snprintf(specs[x], sizeof specs[x], "attention backward flash { dtype = %s "
                     "head_dim = %d mask = %s deterministic = %s }", dt, odd_dims[i], mask,
                     det ? "true" : "false");
            snprintf(labels[x], sizeof labels[x], "flash bwd %s d%d %s%s", dt, odd_dims[i],
                     det ? "det " : "", mask);
        }
    }
    for (int x = 0; x < N; x++) {
        CHECK_STATUS(ctx, aj_op_parse(ctx, specs[x], strlen(specs[x]), labels[x], &ops[x]),
                     AJ_OK);
        jobs[x].op = ops[x];
    }
    for (int a = 0; a < 2; a++) {
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = a == 0 ? AJ_TARGET_SM_80 : AJ_TARGET_SM_90;
        aj_compile_job *mine = &jobs[a * PER_ARCH];
        CHECK_STATUS(ctx, aj_compile_many(ctx, mine, PER_ARCH, &opt, 0), AJ_OK);
        for (int i = 0; i < PER_ARCH; i++) {
            CHECK_MSG(mine[i].status == AJ_OK, "%s: %s", labels[a * PER_ARCH + i],
                      mine[i].message);
            if (!mine[i].kernel)
                continue;
            kernels++;
            if (have_ptxas)
                check_stages(labels[a * PER_ARCH + i], archs[a], mine[i].kernel);
            aj_kernel_destroy(mine[i].kernel);
        }
    }
    for (int x = 0; x < N; x++)
        aj_op_destroy(ops[x]);
}

/* The efficient template of `direction` ("forward", "backward") for every
 * dtype x head dim x each mask_step-th mask, on archs[a]; labels start
 * with prefix. */
static void check_matrix(aj_ctx *ctx, const char *direction, const char *prefix,
                         size_t mask_step, size_t a)
{
    char spec[512], label[128];
    const aj_target target = a == 0 ? AJ_TARGET_SM_80 : AJ_TARGET_SM_90;
    for (size_t t = 0; t < 3; t++)
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
            for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m += mask_step) {
                snprintf(spec, sizeof spec,
                         "attention %s efficient {\n dtype = %s\n head_dim = %d\n"
                         " mask = %s\n}\n", direction, dtypes[t], dims[d], masks[m]);
                snprintf(label, sizeof label, "%s%s d%d %s", prefix, dtypes[t], dims[d],
                         masks[m]);
                check_spec(ctx, label, spec, target,
                           matrix_takes(a, t + d + m / mask_step) ? archs[a] : NULL);
            }
}

/* The efficient template of `direction` with each row's {label, fields}. */
static void check_fields(aj_ctx *ctx, const char *direction, const char *const (*rows)[2],
                         size_t n, aj_target target, const char *arch)
{
    char spec[512];
    for (size_t i = 0; i < n; i++) {
        snprintf(spec, sizeof spec, "attention %s efficient {\n %s\n}\n", direction,
                 rows[i][1]);
        check_spec(ctx, rows[i][0], spec, target, arch);
    }
}

int main(int argc, char **argv)
{
    aj_ctx *ctx = NULL;
    aj_ctx_create(NULL, &ctx);
    have_ptxas = ptxas_find(ptxas, sizeof ptxas);
    spread = ptxas_spread(2);
    if (!have_ptxas)
        CHECK_MSG(!ptxas_missing("ptxas assembly (PTX is still generated and checked)"),
                  "ptxas is required");
    char spec[512];
    for (size_t a = 0; a < 2; a++) {
        aj_target target = a == 0 ? AJ_TARGET_SM_80 : AJ_TARGET_SM_90;
        check_matrix(ctx, "forward", "", 1, a);
        /* Dv != D, and the score modifications */
        static const char *const extra[][2] = {
            {"bf16 d192/128", "dtype = bf16\n head_dim = 192\n head_dim_v = 128"},
            {"f16 d64/128", "dtype = f16\n head_dim = 64\n head_dim_v = 128"},
            {"bf16 d128 softcap", "dtype = bf16\n head_dim = 128\n score_mod = softcap(30.0)\n"
                                  " mask = causal(top_left)"},
            {"f16 d64 alibi", "dtype = f16\n head_dim = 64\n score_mod = alibi\n"
                              " mask = causal(bottom_right)"},
            {"f32 d8", "dtype = f32\n head_dim = 8"},
            {"f16 d256 (16,16,2)", "dtype = f16\n head_dim = 256\n"
                                   " schedule = (block_m = 16, block_n = 16, warps = 2)"},
            {"bf16 d64 (64,64,8)", "dtype = bf16\n head_dim = 64\n"
                                   " schedule = (block_m = 64, block_n = 64, warps = 8)"},
            /* accumulate, bias, dropout, alone and together */
            {"f16 d128 accumulate causal", "dtype = f16\n head_dim = 128\n"
                                           " mask = causal(top_left)\n accumulate = true"},
            {"f32 d256 accumulate", "dtype = f32\n head_dim = 256\n accumulate = true"},
            {"bf16 d64 bias softcap", "dtype = bf16\n head_dim = 64\n bias = add\n"
                                      " score_mod = softcap(30.0)\n mask = causal(top_left)"},
            {"f16 d256 bias", "dtype = f16\n head_dim = 256\n bias = add"},
            {"f16 d128 dropout causal", "dtype = f16\n head_dim = 128\n dropout = 0.1\n"
                                        " mask = causal(bottom_right)"},
            {"f32 d64 dropout alibi", "dtype = f32\n head_dim = 64\n dropout = 0.5\n"
                                      " score_mod = alibi"},
            {"bf16 d128 acc+bias+dropout window", "dtype = bf16\n head_dim = 128\n"
                                                  " accumulate = true\n bias = add\n"
                                                  " dropout = 0.2\n"
                                                  " mask = window(64, 0, bottom_right)"},
            {"f16 d256 acc+bias+dropout", "dtype = f16\n head_dim = 256\n accumulate = true\n"
                                          " bias = add\n dropout = 0.2"},
            /* layout = paged: the split-KV parts and their merge, an f8
             * cache and the widest head dim (the most registers: about
             * 200, with the packed rows' heads and positions) */
            {"paged f16/e4m3 d128 causal", "dtype = f16\n head_dim = 128\n layout = paged\n"
                                           " kv_dtype = f8e4m3\n mask = causal(bottom_right)"},
            {"paged f16 d256 alibi", "dtype = f16\n head_dim = 256\n layout = paged\n"
                                     " score_mod = alibi\n mask = causal(bottom_right)"},
            /* an f32 cache at d256: its K/V tiles stream by cp.async on
             * sm_90, not on sm_80 (no room for the staged tiles) */
            {"paged f32 d256", "dtype = f32\n head_dim = 256\n layout = paged"},
            /* varlen queries (chunked prefill), a window beside alibi (each
             * packed row's own head) */
            {"paged bf16/e5m2 d256 varlen window alibi",
             "dtype = bf16\n head_dim = 256\n layout = paged\n q_layout = varlen\n"
             " kv_dtype = f8e5m2\n score_mod = alibi\n mask = window(64, 0, bottom_right)"},
            /* absorbed MLA over one latent cache (kv_shared): DeepSeek's
             * 576 / 512, a bf16 and an e4m3 cache */
            {"paged mla bf16 d576/512 causal",
             "dtype = bf16\n head_dim = 576\n head_dim_v = 512\n scale = 0.09\n"
             " layout = paged\n kv_shared = true\n mask = causal(bottom_right)"},
            {"paged mla bf16/e4m3 d576/512", "dtype = bf16\n head_dim = 576\n head_dim_v = 512\n"
                                             " scale = 0.09\n layout = paged\n"
                                             " kv_dtype = f8e4m3\n kv_shared = true"},
            /* the efficient forward's widest head dims */
            {"f16 d512 softcap causal", "dtype = f16\n head_dim = 512\n"
                                        " score_mod = softcap(30.0)\n mask = causal(top_left)"},
            {"f32 d384/512 bias", "dtype = f32\n head_dim = 384\n head_dim_v = 512\n"
                                  " bias = add"},
        };
        check_fields(ctx, "forward", extra, sizeof extra / sizeof extra[0], target, archs[a]);
        /* the backward pass: both kernels of every dtype x head dim, with no
         * mask and with a window (whose bounds are a superset of causal's) */
        check_matrix(ctx, "backward", "bwd ", 3, a);
        static const char *const bwd_extra[][2] = {
            {"bwd bf16 d192/128", "dtype = bf16\n head_dim = 192\n head_dim_v = 128"},
            {"bwd bf16 d128 softcap", "dtype = bf16\n head_dim = 128\n"
                                      " score_mod = softcap(30.0)\n mask = causal(top_left)"},
            {"bwd f16 d64 alibi", "dtype = f16\n head_dim = 64\n score_mod = alibi\n"
                                  " mask = causal(bottom_right)"},
            {"bwd f32 d256 alibi window", "dtype = f32\n head_dim = 256\n score_mod = alibi\n"
                                          " mask = window(64, 0, bottom_right)"},
            {"bwd f32 d8", "dtype = f32\n head_dim = 8"},
            {"bwd bf16 d512 causal", "dtype = bf16\n head_dim = 512\n"
                                     " mask = causal(bottom_right)"},
            {"bwd f16 d264/512 dropout", "dtype = f16\n head_dim = 264\n head_dim_v = 512\n"
                                         " dropout = 0.1"},
            /* dropout, bias (dbias), alone and together */
            {"bwd f16 d128 dropout causal", "dtype = f16\n head_dim = 128\n dropout = 0.1\n"
                                            " mask = causal(top_left)"},
            {"bwd f32 d256 dropout", "dtype = f32\n head_dim = 256\n dropout = 0.3"},
            {"bwd bf16 d64 bias softcap", "dtype = bf16\n head_dim = 64\n bias = add\n"
                                          " score_mod = softcap(30.0)"},
            {"bwd f16 d256 bias window", "dtype = f16\n head_dim = 256\n bias = add\n"
                                         " mask = window(64, 0, bottom_right)"},
            {"bwd bf16 d128 bias+dropout alibi", "dtype = bf16\n head_dim = 128\n bias = add\n"
                                                 " dropout = 0.2\n score_mod = alibi"},
        };
        check_fields(ctx, "backward", bwd_extra, sizeof bwd_extra / sizeof bwd_extra[0], target,
                     archs[a]);
        check_flash_forward(ctx, target, archs[a]);
        check_block_mask_builders(ctx, target, archs[a]);
        /* the merge kernel */
        static const char *const merges[][2] = {
            {"merge f16 dv64", "dtype = f16 head_dim_v = 64"},
            {"merge bf16 dv128", "dtype = bf16 head_dim_v = 128"},
            {"merge f32 dv256", "dtype = f32 head_dim_v = 256"},
            {"merge f16 dv40", "dtype = f16 head_dim_v = 40"},
            {"merge f32 dv1024", "dtype = f32 head_dim_v = 1024"},
        };
        for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
            snprintf(spec, sizeof spec, "attention merge { %s }\n", merges[i][1]);
            check_spec(ctx, merges[i][0], spec, target, archs[a]);
        }
    }
    check_flash_bwd(ctx);
    if (argc > 1)
        check_examples(ctx, argv[1]);
    if (argc > 1 && have_ptxas) {
        int before = assembled;
        CHECK(spec_dir_each(argv[1], check_blackwell_example, ctx) >= 8);
        printf("Blackwell: %d example kernels (sm_80 and sm_90 PTX) assembled for sm_100 / "
               "sm_120, no spills\n", assembled - before);
    }
    printf("%d kernels generated, %d assembled by ptxas\n", kernels, assembled);
    aj_ctx_destroy(ctx);
    return check_report();
}
