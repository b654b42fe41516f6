/*
 * bench_compile.c -- how long attnjit takes from IR text to PTX, beside
 * the time NVIDIA's ptxas then takes to assemble that PTX.
 *
 *   bench_compile [--repeat N] [--target sm_80|sm_90|sm_90a] [-O 0..3] [--csv FILE] SPEC...
 *
 * Per spec: the first in-process compile (it includes LLVM's one-time
 * target initialisation when it is the first of the process), then the
 * median and minimum of N further compiles, each parse -> verify -> build
 * -> O3 -> PTX in a fresh LLVM context; and the median wall time of N
 * ptxas runs on the same PTX (ptxas -O3, the default, as the driver's JIT
 * would).  Ratios are ptxas time over attnjit time, both measured here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnjit/attnjit.h"
#include "bench_common.h"
#include "ptxas_util.h"
#include "timing.h"

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(1 << 20);
    *len = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    return buf;
}

/* Stage times of the compiles measured, summed over repeats. */
static aj_compile_stats stage_sum;
static int opt_level = 2;

/* One full IR-text-to-PTX compile (bench_common.h); returns ms, or -1. */
static double compile_once(aj_ctx *ctx, const char *name, const char *text, size_t len,
                           aj_target target, aj_kernel **keep)
{
    return bench_compile_once(ctx, "bench_compile", name, text, len, target, opt_level,
                              &stage_sum, keep);
}

int main(int argc, char **argv)
{
    int repeat = 21;
    const char *csv_path = NULL;
    aj_target target = AJ_TARGET_SM_90;
    aj_ctx *ctx = NULL;
    aj_ctx_create(NULL, &ctx);
    int first_spec = argc;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
            repeat = atoi(argv[++i]);
        } else if (strcmp(argv[i], "-O") == 0 && i + 1 < argc) {
            opt_level = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
            csv_path = argv[++i];
        } else if (strcmp(argv[i], "--target") == 0 && i + 1 < argc) {
            if (aj_target_from_name(ctx, argv[++i], &target) != AJ_OK) {
                fprintf(stderr, "bench_compile: %s\n", aj_last_error(ctx));
                return 1;
            }
        } else {
            first_spec = i;
            break;
        }
    }
    if (first_spec == argc || repeat < 1) {
        fprintf(stderr, "usage: bench_compile [--repeat N] [--target T] [-O N] [--csv FILE] "
                        "SPEC...\n");
        return 1;
    }
    char ptxas[1024];
    int have_ptxas = ptxas_find(ptxas, sizeof ptxas);
    const char *arch = aj_target_name(target);
    FILE *csv = csv_path ? fopen(csv_path, "w") : NULL;
    if (csv)
        fprintf(csv, "spec,target,first_ms,median_ms,min_ms,ptxas_median_ms,ptx_bytes\n");

    printf("attnjit %s, LLVM %s, target %s, -O%d, %d repeats\n\n", aj_version_string(),
           aj_llvm_version(), arch, opt_level, repeat);
    printf("| spec | first (ms) | IR->PTX median (ms) | min (ms) | build / opt / emit mean (ms) "
           "| IR insts | ptxas median (ms) | ptxas / attnjit |\n"
           "|---|---:|---:|---:|---|---:|---:|---:|\n");
    double *t = calloc((size_t)repeat, sizeof *t);
    double *tp = calloc((size_t)repeat, sizeof *tp);
    int failed = 0;
    for (int s = first_spec; s < argc; s++) {
        size_t len;
        char *text = read_all(argv[s], &len);
        const char *base = strrchr(argv[s], '/') ? strrchr(argv[s], '/') + 1 : argv[s];
        if (!text) {
            fprintf(stderr, "bench_compile: cannot read %s\n", argv[s]);
            failed = 1;
            continue;
        }
        aj_kernel *k = NULL;
        double first = compile_once(ctx, base, text, len, target, &k);
        memset(&stage_sum, 0, sizeof stage_sum);
        for (int r = 0; r < repeat && first >= 0; r++)
            t[r] = compile_once(ctx, base, text, len, target, NULL);
        if (first < 0) {
            failed = 1;
            free(text);
            continue;
        }
        double med = median(t, repeat), mn = t[0];
        double ptxas_med = -1;
        size_t ptx_len = 0;
        const char *ptx = aj_kernel_code(k, &ptx_len);
        if (have_ptxas) {
            for (int r = 0; r < repeat; r++) {
                ptxas_result res;
                double t0 = now_ms();
                ptxas_run(ptxas, arch, ptx, ptx_len, &res);
                tp[r] = now_ms() - t0;
                if (res.exit_code != 0) {
                    fprintf(stderr, "bench_compile: ptxas rejected %s:\n%s\n", base, res.log);
                    failed = 1;
                    break;
                }
            }
            ptxas_med = median(tp, repeat);
        }
        char stages[96], ptxas_col[32] = "(no ptxas)", ratio[32] = "-";
        snprintf(stages, sizeof stages, "%.1f / %.1f / %.1f",
                 (stage_sum.build_ms + stage_sum.verify_ms) / repeat,
                 stage_sum.optimize_ms / repeat, stage_sum.emit_ms / repeat);
        if (ptxas_med >= 0) {
            snprintf(ptxas_col, sizeof ptxas_col, "%.1f", ptxas_med);
            snprintf(ratio, sizeof ratio, "%.1fx", ptxas_med / med);
        }
        printf("| %s | %.1f | %.1f | %.1f | %s | %d | %s | %s |\n", base, first, med, mn,
               stages, stage_sum.ir_instructions, ptxas_col, ratio);
        if (csv)
            fprintf(csv, "%s,%s,%.3f,%.3f,%.3f,%.3f,%zu\n", base, arch, first, med, mn,
                    ptxas_med, ptx_len);
        aj_kernel_destroy(k);
        free(text);
    }
    if (csv)
        fclose(csv);
    free(t);
    free(tp);
    aj_ctx_destroy(ctx);
    return failed;
}
