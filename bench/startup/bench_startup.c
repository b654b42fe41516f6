/*
 * bench_startup.c -- what specialising kernels at start-up costs, with an
 * empty kernel cache (cold) and with a filled one (warm).
 *
 *   bench_startup [--target sm_80|sm_90|sm_90a|cpu] [--workers N]
 *
 * The set: every dtype x head dim x mask of the efficient forward examples
 * (3 x 5 x 4 = 60 kernels).  Cold: a fresh cache directory, compiled with
 * aj_compile_many on N workers (default one per core).  Warm: a new
 * context on the same directory, as a process started again would see it
 * (disk hits).  In-process: the same context again (memory hits).  For
 * cpu the disk entries hold host object code, which a warm start loads
 * into a JIT without compiling.
 *
 * On a GPU (cuda device 0) it then times each kernel's way to a loaded
 * module, one at a time: cold (IR -> PTX -> the driver's linker -> cubin
 * -> loaded, on an empty cache) and warm (kernel and cubin from the disk
 * cache -> loaded, as a new process: new context and device), through
 * aj_compile_many with options.device, which loads each kernel.  Without
 * a GPU it prints a line saying so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attnjit/attnjit.h"
#include "temp_dir.h"
#include "timing.h"

enum { MAX_OPS = 64 };
static char labels[MAX_OPS][64];   /* "f16 d64 causal(top_left)" */

static int build_ops(aj_ctx *ctx, aj_op **ops)
{
    static const char *const dtypes[] = {"f16", "bf16", "f32"};
    static const int dims[] = {32, 64, 96, 128, 256};
    static const char *const masks[] = {"none", "causal(top_left)", "causal(bottom_right)",
                                        "window(4096, 0, bottom_right)"};
    int n = 0;
    for (int t = 0; t < 3; t++)
        for (int d = 0; d < 5; d++)
            for (int m = 0; m < 4; m++) {
                char text[256];
                snprintf(text, sizeof text, "attention forward efficient { dtype = %s "
                         "head_dim = %d mask = %s }", dtypes[t], dims[d], masks[m]);
                snprintf(labels[n], sizeof labels[n], "%s d%d %s", dtypes[t], dims[d],
                         masks[m]);
                if (aj_op_parse(ctx, text, strlen(text), "startup", &ops[n]) != AJ_OK) {
                    fprintf(stderr, "bench_startup: %s\n", aj_last_error(ctx));
                    exit(1);
                }
                n++;
            }
    return n;
}

/* Compiles the set on ctx; returns ms, or -1 on a failure. */
static double compile_set(aj_ctx *ctx, aj_target target, int workers, aj_op **ops, int n)
{
    aj_compile_job jobs[MAX_OPS];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < n; i++)
        jobs[i].op = ops[i];
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    double t0 = now_ms();
    aj_status st = aj_compile_many(ctx, jobs, (size_t)n, &opt, workers);
    double ms = now_ms() - t0;
    for (int i = 0; i < n; i++)
        aj_kernel_destroy(jobs[i].kernel);
    if (st != AJ_OK) {
        fprintf(stderr, "bench_startup: %s\n", aj_last_error(ctx));
        return -1;
    }
    return ms;
}

/* One kernel compiled and loaded on a fresh device of a fresh context on
 * the cache directory `dir`: ms, or -1 on a failure. */
static double load_one(const char *dir, const aj_op *op)
{
    aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
    cfg.cache_dir = dir;
    aj_ctx *ctx = NULL;
    aj_device *dev = NULL;
    double ms = -1;
    if (aj_ctx_create(&cfg, &ctx) != AJ_OK || aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev) != AJ_OK)
        goto done;
    aj_compile_job job = {.op = op};
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.device = dev;
    opt.target = aj_device_target(dev);
    double t0 = now_ms();
    aj_status st = aj_compile_many(ctx, &job, 1, &opt, 1);
    if (st == AJ_OK)
        ms = now_ms() - t0;
    else
        fprintf(stderr, "bench_startup: %s\n", aj_last_error(ctx));
    aj_kernel_destroy(job.kernel);
done:
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return ms;
}

/* The GPU part: cold and warm per kernel (see the top of the file). */
static int gpu_per_kernel(aj_op **ops, int n)
{
    aj_ctx *probe = NULL;
    aj_device *dev = NULL;
    aj_ctx_create(NULL, &probe);
    if (aj_device_open(probe, AJ_DEVICE_CUDA, 0, &dev) != AJ_OK) {
        printf("\nGPU cold/warm per kernel: skipped: %s\n", aj_last_error(probe));
        aj_ctx_destroy(probe);
        return 0;
    }
    printf("\nGPU %s: per kernel, cold (IR -> PTX -> cubin -> loaded) and warm (cubin from "
           "disk -> loaded)\n\n| kernel | cold (ms) | warm (ms) | cold / warm |\n"
           "|---|---:|---:|---:|\n", aj_device_name(dev));
    aj_device_close(dev);
    aj_ctx_destroy(probe);
    char dir[] = "/tmp/aj_startup_gpu_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    int failed = 0;
    double sum_cold = 0, sum_warm = 0;
    for (int i = 0; i < n && !failed; i++) {
        double cold = load_one(dir, ops[i]), warm = load_one(dir, ops[i]);
        failed = cold < 0 || warm < 0;
        printf("| %s | %.1f | %.2f | %.0fx |\n", labels[i], cold, warm, cold / warm);
        sum_cold += cold;
        sum_warm += warm;
    }
    printf("| all %d | %.1f | %.1f | %.0fx |\n", n, sum_cold, sum_warm, sum_cold / sum_warm);
    temp_dir_remove(dir);
    return failed;
}

int main(int argc, char **argv)
{
    aj_target target = AJ_TARGET_SM_90;
    int workers = 0;
    aj_ctx *probe = NULL;
    aj_ctx_create(NULL, &probe);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--target") == 0 && i + 1 < argc) {
            if (aj_target_from_name(probe, argv[++i], &target) != AJ_OK) {
                fprintf(stderr, "bench_startup: %s\n", aj_last_error(probe));
                return 1;
            }
        } else if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc) {
            workers = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_startup [--target T] [--workers N]\n");
            return 1;
        }
    }
    aj_ctx_destroy(probe);
    char dir[] = "/tmp/aj_startup_XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
    cfg.cache_dir = dir;
    aj_ctx *cold = NULL, *warm = NULL;
    aj_ctx_create(&cfg, &cold);
    aj_op *ops[MAX_OPS];
    int n = build_ops(cold, ops);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double t_cold = compile_set(cold, target, workers, ops, n);
    double t_mem = compile_set(cold, target, workers, ops, n);
    aj_ctx_create(&cfg, &warm);
    double t_warm = compile_set(warm, target, workers, ops, n);
    aj_cache_stats s;
    aj_cache_get_stats(warm, &s);
    printf("attnjit %s, LLVM %s, target %s, %d kernels, %d workers (%ld cores)\n\n",
           aj_version_string(), aj_llvm_version(), aj_target_name(target), n,
           workers ? workers : (int)cores, cores);
    printf("| start-up | total (ms) | per kernel (ms) | vs cold |\n|---|---:|---:|---:|\n");
    printf("| cold: empty cache, parallel compile | %.1f | %.2f | 1x |\n", t_cold, t_cold / n);
    printf("| warm: new process, disk cache | %.1f | %.3f | %.0fx faster |\n", t_warm,
           t_warm / n, t_cold / t_warm);
    printf("| warm: same process, memory cache | %.2f | %.4f | %.0fx faster |\n", t_mem,
           t_mem / n, t_cold / t_mem);
    printf("\ndisk hits %llu of %d; entries in %s\n", (unsigned long long)s.disk_hits, n, dir);
    int gpu_failed = gpu_per_kernel(ops, n);
    for (int i = 0; i < n; i++)
        aj_op_destroy(ops[i]);
    aj_ctx_destroy(cold);
    aj_ctx_destroy(warm);
    temp_dir_remove(dir);
    return t_cold < 0 || t_warm < 0 || t_mem < 0 || gpu_failed;
}
