/*
 * startup_specialize.c -- what a framework does at start-up: JIT every
 * kernel it will need (each head dim x dtype, forward and backward) in one
 * parallel batch, through the on-disk kernel cache, so that the second
 * start of the process loads them instead of compiling them.
 *
 *   startup_specialize [CACHE_DIR] [--target sm_80|sm_90|sim]
 *
 * CACHE_DIR defaults to a fresh temporary directory (removed at the end),
 * so the first start is cold.  The program starts "twice" (two contexts on
 * the same directory, as two processes would), prints both times and
 * checks that the second start compiled nothing and got the same code.
 * No GPU is needed: kernels for a GPU target are PTX, loaded at launch.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnjit/attnjit.h"

/* What the application runs: its models' head dims and dtypes. */
static const int head_dims[] = {64, 128};
static const aj_dtype dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16};
static const aj_kind kinds[] = {AJ_KIND_FORWARD, AJ_KIND_BACKWARD};
enum { NUM_KERNELS = 2 * 2 * 2 };

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* One start of the application: a context on the cache directory, the ops,
 * one aj_compile_many.  Fills kernels[] (the caller releases them) and the
 * cache counters; returns the wall time in ms, or -1. */
static double start_up(const char *cache_dir, aj_target target, aj_kernel **kernels,
                       aj_cache_stats *stats)
{
    aj_ctx_config config = AJ_CTX_CONFIG_INIT;
    config.cache_dir = cache_dir;
    aj_ctx *ctx = NULL;
    double t0 = now_ms();
    if (aj_ctx_create(&config, &ctx) != AJ_OK)
        return -1;
    aj_op *ops[NUM_KERNELS] = {0};
    aj_compile_job jobs[NUM_KERNELS];
    memset(jobs, 0, sizeof jobs);
    int n = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
        for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++)
            for (size_t d = 0; d < sizeof head_dims / sizeof head_dims[0]; d++) {
                /* the builder keeps its first error; one check at the end */
                aj_op_create(ctx, kinds[k], AJ_VARIANT_EFFICIENT, &ops[n]);
                aj_op_set_dtype(ops[n], dtypes[t]);
                aj_op_set_head_dims(ops[n], head_dims[d], 0);
                aj_op_set_mask_causal(ops[n], AJ_ALIGN_BOTTOM_RIGHT);
                jobs[n].op = ops[n];
                n++;
            }
    aj_compile_options options = AJ_COMPILE_OPTIONS_INIT;
    options.target = target;
    aj_status st = aj_compile_many(ctx, jobs, (size_t)n, &options, 0);
    double ms = now_ms() - t0;
    if (st != AJ_OK)
        fprintf(stderr, "startup_specialize: %s\n", aj_last_error(ctx));
    for (int i = 0; i < n; i++) {
        if (jobs[i].status != AJ_OK)
            fprintf(stderr, "  kernel %d: %s\n", i, jobs[i].message);
        kernels[i] = jobs[i].kernel;
        aj_op_destroy(ops[i]);
    }
    aj_cache_get_stats(ctx, stats);
    aj_ctx_destroy(ctx);
    return st == AJ_OK ? ms : -1;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *target_name = "sm_90";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--target") && i + 1 < argc)
            target_name = argv[++i];
        else
            dir = argv[i];
    }
    aj_target target;
    aj_ctx *names = NULL;
    if (aj_ctx_create(NULL, &names) != AJ_OK)
        return 1;
    if (aj_target_from_name(names, target_name, &target) != AJ_OK) {
        fprintf(stderr, "startup_specialize: %s\n", aj_last_error(names));
        aj_ctx_destroy(names);
        return 2;
    }
    aj_ctx_destroy(names);
    char tmp[] = "/tmp/attnjit-startup-XXXXXX";
    if (!dir && !(dir = mkdtemp(tmp))) {
        perror("startup_specialize: mkdtemp");
        return 1;
    }

    aj_kernel *cold[NUM_KERNELS] = {0}, *warm[NUM_KERNELS] = {0};
    aj_cache_stats cold_stats, warm_stats;
    double cold_ms = start_up(dir, target, cold, &cold_stats);
    double warm_ms = start_up(dir, target, warm, &warm_stats);
    int bad = cold_ms < 0 || warm_ms < 0;

    /* the second start must have compiled nothing and got the same code
     * (sim kernels are host code in a JIT and live in memory only) */
    bool disk = cold_stats.disk_enabled && target != AJ_TARGET_SIM;
    if (!bad && disk && (warm_stats.misses != 0 || warm_stats.disk_hits != NUM_KERNELS)) {
        fprintf(stderr, "startup_specialize: second start: %llu compiles, %llu disk hits\n",
                (unsigned long long)warm_stats.misses,
                (unsigned long long)warm_stats.disk_hits);
        bad = 1;
    }
    for (int i = 0; i < NUM_KERNELS && !bad; i++) {
        size_t a = 0, b = 0;
        const void *ca = aj_kernel_code(cold[i], &a), *cb = aj_kernel_code(warm[i], &b);
        if (a != b || memcmp(ca, cb, a) != 0) {
            fprintf(stderr, "startup_specialize: kernel %d differs between starts\n", i);
            bad = 1;
        }
    }
    if (!bad) {
        printf("%d kernels for %s (f16/bf16 x d64/d128 x forward/backward)\n", NUM_KERNELS,
               target_name);
        printf("  first start  (cold cache): %8.1f ms, %llu compiled\n", cold_ms,
               (unsigned long long)cold_stats.misses);
        printf("  second start (warm cache): %8.1f ms, %llu from disk (%.0fx faster)\n",
               warm_ms, (unsigned long long)warm_stats.disk_hits, cold_ms / warm_ms);
        printf("  cache: %s\n", disk ? cold_stats.disk_dir : "memory only");
    }
    for (int i = 0; i < NUM_KERNELS; i++) {
        aj_kernel_destroy(cold[i]);
        aj_kernel_destroy(warm[i]);
    }
    if (dir == tmp) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
        if (system(cmd) != 0)
            fprintf(stderr, "startup_specialize: could not remove %s\n", tmp);
    }
    return bad;
}
