/*
 * test_cache_memory.c -- the in-memory kernel cache is bounded
 * (aj_ctx_config.cache_max_kernels, docs/api.md "The kernel cache").
 *
 * - Least recently used goes: with room for 3, after A B C, a hit on A and
 *   a store of D, A and C are still hits and B is a miss.
 * - A kernel the caller holds outlives its eviction (the sanitizer pass
 *   would see a use after free).
 * - aj_cache_set_max_kernels lowers the bound and releases the least
 *   recently used beyond it at once; 0 is refused.
 * - Evicting frees: 48 distinct cpu kernels compiled through a context
 *   that keeps 4 grow the resident memory by a fraction of what the same
 *   48 cost through a context that keeps them all (the cpu kernel's JIT
 *   and code go with its last reference).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache_ctx.h"
#include "check.h"
#include "spec_compile.h"

static aj_ctx *new_ctx(uint64_t max_kernels)
{
    return cache_ctx_ok(&(cache_ctx_opts){.mode = AJ_CACHE_MEMORY, .max_kernels = max_kernels});
}

/* The cpu kernel of op number i (a window of i keys to the left). */
static aj_kernel *compile(aj_ctx *ctx, int i)
{
    char text[160];
    snprintf(text, sizeof text, "attention forward efficient { dtype = f32 head_dim = 32 "
             "mask = window(%d, 0) }", i);
    aj_kernel *k = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    CHECK_STATUS(ctx, spec_compile(ctx, text, "t", &opt, &k), AJ_OK);
    return k;
}

/* Compiles op i and says whether it was a memory hit. */
static int hit(aj_ctx *ctx, int i)
{
    uint64_t before = cache_stats(ctx).memory_hits;
    aj_kernel_destroy(compile(ctx, i));
    return cache_stats(ctx).memory_hits == before + 1;
}

static void test_least_recently_used(void)
{
    aj_ctx *ctx = new_ctx(3);
    enum { A = 1, B = 2, C = 3, D = 4 };
    aj_kernel *held = compile(ctx, B);   /* the caller keeps B */
    CHECK(!hit(ctx, A) && !hit(ctx, C));
    CHECK(hit(ctx, A));                 /* A is now more recent than B and C */
    CHECK(!hit(ctx, D));                /* the store of D evicts B */
    CHECK_MSG(hit(ctx, A) && hit(ctx, C) && hit(ctx, D), "A, C, D stay");
    size_t n = 0;
    CHECK(aj_kernel_code(held, &n) && n > 0 && aj_kernel_target(held) == AJ_TARGET_CPU);
    CHECK(!hit(ctx, B));                /* B was evicted: compiled again */
    aj_kernel_destroy(held);
    aj_ctx_destroy(ctx);
}

static void test_lowered_bound(void)
{
    aj_ctx *ctx = new_ctx(8);
    for (int i = 1; i <= 5; i++)
        CHECK(!hit(ctx, i));
    CHECK_STATUS(ctx, aj_cache_set_max_kernels(ctx, 0), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "keep at least 1");
    CHECK_STATUS(ctx, aj_cache_set_max_kernels(ctx, 2), AJ_OK);   /* 4 and 5 stay */
    CHECK_MSG(hit(ctx, 5) && hit(ctx, 4), "the two most recent stay");
    CHECK(!hit(ctx, 3));                /* released at once; its store evicts 5 */
    CHECK(hit(ctx, 4) && !hit(ctx, 5));
    aj_ctx_destroy(ctx);
}

static long resident_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Resident growth over `count` distinct compiles through a context that
 * keeps max_kernels (after a first 8, so one-time costs are paid). */
static long growth_kib(uint64_t max_kernels, int first, int count)
{
    aj_ctx *ctx = new_ctx(max_kernels);
    for (int i = 0; i < 8; i++)
        aj_kernel_destroy(compile(ctx, first + i));
    long before = resident_kib();
    for (int i = 8; i < 8 + count; i++)
        aj_kernel_destroy(compile(ctx, first + i));
    long after = resident_kib();
    aj_ctx_destroy(ctx);
    return after - before;
}

static void test_eviction_frees(void)
{
    enum { COUNT = 40 };
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer keeps freed memory in quarantine: resident memory
     * says nothing here (the plain pass measures it; LeakSanitizer checks
     * that every kernel is freed by the end) */
    printf("SKIP resident growth: AddressSanitizer's quarantine holds freed memory\n");
    return;
#endif
    long kept = growth_kib(1000, 10, COUNT);
    long bounded = growth_kib(4, 100, COUNT);   /* other ops: no hits */
    printf("resident growth over %d compiles: %ld KiB keeping all, %ld KiB keeping 4\n",
           COUNT, kept, bounded);
    CHECK_MSG(kept > 0 && bounded * 4 < kept, "keeping 4: %ld KiB, keeping all: %ld KiB",
              bounded, kept);
}

int main(void)
{
    test_least_recently_used();
    test_lowered_bound();
    test_eviction_frees();
    return check_report();
}
