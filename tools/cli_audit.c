/*
 * cli_audit.c -- `attnjit audit SPEC --target T [--arch A]`: the op's
 * kernel through NVIDIA's ptxas and nvdisasm, each stage's main loop by
 * instruction class per warp and tile, and the bound an issue-rate model
 * of H100 / H200 gives it (audit.h; docs/gpu.md, "attnjit audit").  An
 * estimate, not a measurement: a GPU run decides.
 *
 * The tools: $AJ_PTXAS / $AJ_NVDISASM, else on PATH, else in
 * /usr/local/cuda/bin (the README's test command installs both from the
 * Python package index).  --arch is the SASS's: by default sm_90 for the
 * sm_80 and sm_90 targets (what an H100's driver makes of their PTX) and
 * sm_90a for sm_90a.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/audit.h"
#include "tools/cli.h"
#include "tools/find_tool.h"

/* Runs argv with stdout to `out` and stderr to `err`; its exit status, or
 * -1 if it could not run. */
static int run_tool(char *const argv[], const char *out, const char *err)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0)
            _exit(127);
        dup2(o, 1);
        dup2(e, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* ptxas -v's "<N> <what>" for `entry` (its "Function properties" block). */
static int ptxas_value(const char *log, const char *entry, const char *what)
{
    char key[200];
    snprintf(key, sizeof key, "Function properties for %s", entry);
    const char *at = strstr(log, key);
    const char *w = at ? strstr(at, what) : NULL;
    if (!w)
        return -1;
    const char *p = w;
    while (p > at && p[-1] == ' ')
        p--;
    while (p > at && p[-1] >= '0' && p[-1] <= '9')
        p--;
    return atoi(p);
}

static void print_counts(const audit_counts *c)
{
    printf("  tensor    %4d", c->tensor);
    for (int i = 0; i < c->nshapes; i++)
        printf("%s%s %d", i ? ", " : " (", c->shape[i], c->shape_count[i]);
    printf("%s\n", c->nshapes ? ")" : "");
    printf("  MUFU      %4d\n  FP32      %4d   (FFMA, FMUL, FADD, FMNMX)\n", c->mufu, c->fp32);
    printf("  shared    %4d   loads (LDS, LDSM), %d stores (STS)\n", c->lds, c->sts);
    printf("  global    %4d   (LDG, STG, LDGSTS, RED, ATOM);  TMA %d\n", c->global, c->tma);
    printf("  sync      %4d   (BAR, SYNCS, WARPGROUP, DEPBAR, WARPSYNC)\n", c->sync);
}

static int audit_stage(const aj_kernel *k, int s, const aj_op_info *info, const char *sass,
                       const char *log)
{
    const char *entry = aj_kernel_stage_entry(k, s);
    aj_launch_info li;
    aj_kernel_stage_info(k, s, &li);
    printf("\n%s: %d registers, %d / %d spill bytes (stores / loads), %d bytes of shared "
           "memory, %d threads\n", entry, ptxas_value(log, entry, "registers"),
           ptxas_value(log, entry, "bytes spill stores"),
           ptxas_value(log, entry, "bytes spill loads"), li.dynamic_smem, li.block[0]);
    audit_loop loop;
    audit_counts whole;
    int st = audit_main_loop(sass, entry, &loop, &whole);
    if (st == -1) {
        fprintf(stderr, "attnjit audit: nvdisasm's output has no function %s\n", entry);
        return CLI_EXIT_INTERNAL;
    }
    if (st == -2) {
        printf("no loop; the whole kernel, per warp: %d instructions\n", whole.total);
        print_counts(&whole);
        return CLI_EXIT_OK;
    }
    const aj_schedule *sc = &li.schedule;
    printf("main loop, 0x%lx .. 0x%lx: %d instructions per warp per %d x %d tile (every path "
           "of the body, the element mask's included)\n", loop.begin, loop.end,
           loop.counts.total, sc->block_m, sc->block_n);
    print_counts(&loop.counts);
    if (info->kind != AJ_KIND_FORWARD || info->layout == AJ_LAYOUT_PAGED) {
        printf("model: for the padded and varlen forwards only\n");
        return CLI_EXIT_OK;
    }
    int dv = info->head_dim_v ? info->head_dim_v : info->head_dim;
    double flops = 2.0 * sc->block_m * sc->block_n * (info->head_dim + dv);
    const audit_gpu *gpu = &audit_gh100;
    /* the warps that run the main loop: the schedule's (warp specialised,
     * the consumers; the producer's issue is not counted) */
    int warps = sc->warps ? sc->warps : li.block[0] / 32;
    audit_model m = audit_apply(gpu, &loop.counts, warps, flops);
    printf("model per tile, %s, clocks per SM:\n", gpu->name);
    int fp8 = loop.counts.tensor && loop.counts.fp8 == loop.counts.tensor;
    printf("  tensor    %8.0f   (%s%s: %.0f FLOP/clock/SM, %s)\n", m.tensor,
           loop.counts.hgmma ? "wgmma" : "mma.sync", fp8 ? " FP8" : "",
           m.tensor > 0 ? flops / m.tensor : 0.0,
           loop.counts.hgmma ? "documented" : "assumed 2/3 of wgmma's");
    printf("  issue     %8.0f   (%.0f warp-instructions/clock/SM, documented)\n", m.issue,
           gpu->issue);
    printf("  MUFU      %8.0f   (%.0f lanes/clock/SM, documented)\n", m.mufu, gpu->mufu);
    printf("  FP32      %8.0f   (%.0f lanes/clock/SM, documented)\n", m.fp32, gpu->fp32);
    printf("bound: %s, at most %.0f TFLOP/s on a full tile (an estimate, not a measurement; "
           "H100 and H200 share it: only memory-bound figures differ)\n", m.bound, m.tflops);
    return CLI_EXIT_OK;
}

int cli_audit(aj_ctx *ctx, int argc, char **argv)
{
    const char *spec = NULL, *target_name = NULL, *arch = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--target") == 0 && i + 1 < argc)
            target_name = argv[++i];
        else if (strcmp(argv[i], "--arch") == 0 && i + 1 < argc)
            arch = argv[++i];
        else if (argv[i][0] != '-' && !spec)
            spec = argv[i];
        else
            return cli_usage("audit: unexpected argument '%s'", argv[i]);
    }
    if (!spec || !target_name)
        return cli_usage("audit needs SPEC and --target sm_80|sm_90|sm_90a%s", "");
    aj_target target = AJ_TARGET_COUNT;
    for (int t = 0; t < AJ_TARGET_COUNT; t++)
        if (strcmp(target_name, aj_target_name((aj_target)t)) == 0)
            target = (aj_target)t;
    if (target != AJ_TARGET_SM_80 && target != AJ_TARGET_SM_90 && target != AJ_TARGET_SM_90A)
        return cli_usage("audit: --target takes sm_80, sm_90 or sm_90a, not '%s'", target_name);
    if (!arch)
        arch = target == AJ_TARGET_SM_90A ? "sm_90a" : "sm_90";
    char ptxas[1024], nvdisasm[1024];
    if (!aj_find_tool("AJ_PTXAS", "ptxas", ptxas, sizeof ptxas) ||
        !aj_find_tool("AJ_NVDISASM", "nvdisasm", nvdisasm, sizeof nvdisasm)) {
        fprintf(stderr, "attnjit audit: needs NVIDIA's ptxas and nvdisasm ($AJ_PTXAS / "
                "$AJ_NVDISASM, PATH or /usr/local/cuda/bin; pip install nvidia-cuda-nvcc-cu12 "
                "nvidia-cuda-nvdisasm): %s not found\n", access(ptxas, X_OK) ? "ptxas"
                                                                            : "nvdisasm");
        return CLI_EXIT_INPUT;
    }
    aj_op *op = NULL;
    int rc = cli_load_op(ctx, spec, &op);
    if (rc != CLI_EXIT_OK)
        return rc;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    aj_kernel *k = NULL;
    aj_status st = aj_compile(ctx, op, &opt, &k);
    aj_op_info info;
    aj_op_get_info(op, &info);
    aj_op_destroy(op);
    if (st != AJ_OK)
        return cli_report(ctx, st);
    char dir[] = "/tmp/attnjit_audit_XXXXXX", ptx[64], cubin[64], sass[64], log[64], err[64];
    if (!mkdtemp(dir)) {
        aj_kernel_destroy(k);
        fprintf(stderr, "attnjit audit: cannot make a temporary directory\n");
        return CLI_EXIT_INTERNAL;
    }
    snprintf(ptx, sizeof ptx, "%s/k.ptx", dir);
    snprintf(cubin, sizeof cubin, "%s/k.cubin", dir);
    snprintf(sass, sizeof sass, "%s/k.sass", dir);
    snprintf(log, sizeof log, "%s/ptxas.log", dir);
    snprintf(err, sizeof err, "%s/nvdisasm.log", dir);
    size_t len = 0;
    const char *code = aj_kernel_code(k, &len);
    FILE *f = fopen(ptx, "wb");
    int ok = f && fwrite(code, 1, len, f) == len;
    if (f)
        fclose(f);
    char arch_flag[64];
    snprintf(arch_flag, sizeof arch_flag, "-arch=%s", arch);
    char *ptxas_argv[] = {ptxas, arch_flag, "-v", "-o", cubin, ptx, NULL};
    char *nvdisasm_argv[] = {nvdisasm, "-c", cubin, NULL};
    char *text = NULL, *ptxas_log = NULL;
    size_t text_len = 0, log_len = 0;
    rc = CLI_EXIT_INTERNAL;
    if (!ok)
        fprintf(stderr, "attnjit audit: cannot write %s\n", ptx);
    else if (run_tool(ptxas_argv, log, log) != 0)
        fprintf(stderr, "attnjit audit: ptxas %s failed (its log: %s)\n", arch_flag, log);
    else if (run_tool(nvdisasm_argv, sass, err) != 0)
        fprintf(stderr, "attnjit audit: nvdisasm failed (its log: %s)\n", err);
    else if (cli_read_file(sass, &text, &text_len) == CLI_EXIT_OK &&
             cli_read_file(log, &ptxas_log, &log_len) == CLI_EXIT_OK) {
        printf("attnjit audit: %s %s %s d%d/%d, %s PTX as %s SASS (%s)\n",
               aj_kind_name(info.kind), aj_variant_name(info.variant),
               aj_dtype_name(info.dtype), info.head_dim,
               info.head_dim_v ? info.head_dim_v : info.head_dim, aj_target_name(target), arch,
               spec);
        rc = CLI_EXIT_OK;
        for (int s = 0; rc == CLI_EXIT_OK && s < aj_kernel_num_stages(k); s++)
            rc = audit_stage(k, s, &info, text, ptxas_log);
    }
    free(text);
    free(ptxas_log);
    if (rc == CLI_EXIT_OK) {   /* kept where something failed, for a look */
        unlink(ptx), unlink(cubin), unlink(sass), unlink(log), unlink(err);
        rmdir(dir);
    }
    aj_kernel_destroy(k);
    return rc;
}
