/*
 * cache_ctx.h -- a context for the kernel-cache tests (test_cache.c,
 * test_cache_memory.c, test_cache_procs.c, test_host_cache.c):
 * AJ_CTX_CONFIG_INIT with the cache fields a test sets, created; and its
 * cache's counters.  Header-only, after check.h (its CHECKs count in the
 * including test).
 */
#ifndef AJ_TESTS_CACHE_CTX_H
#define AJ_TESTS_CACHE_CTX_H

#include <stdbool.h>

#include "attnjit/attnjit.h"
#include "check.h"

typedef struct cache_ctx_opts {
    const char *dir;                  /* cache_dir; NULL: the default */
    aj_cache_mode mode;               /* 0: AJ_CACHE_DEFAULT */
    uint64_t max_bytes, max_kernels;  /* 0: the defaults */
    aj_log_fn log_fn;                 /* NULL: messages discarded */
    bool quiet;                       /* log errors only (damage the test makes) */
} cache_ctx_opts;

/* The context, or NULL when aj_ctx_create fails. */
static inline aj_ctx *cache_ctx(const cache_ctx_opts *o)
{
    aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
    cfg.cache_dir = o->dir;
    cfg.cache_mode = o->mode;
    cfg.cache_max_bytes = o->max_bytes;
    cfg.cache_max_kernels = o->max_kernels;
    cfg.log_fn = o->log_fn;
    if (o->quiet)
        cfg.log_level = AJ_LOG_ERROR;
    aj_ctx *ctx = NULL;
    return aj_ctx_create(&cfg, &ctx) == AJ_OK ? ctx : NULL;
}

/* The same, a failed CHECK where it fails. */
static inline aj_ctx *cache_ctx_ok(const cache_ctx_opts *o)
{
    aj_ctx *ctx = cache_ctx(o);
    CHECK(ctx != NULL);
    return ctx;
}

/* The cache's counters (a failed CHECK if they cannot be read). */
static inline aj_cache_stats cache_stats(aj_ctx *ctx)
{
    aj_cache_stats s;
    CHECK(aj_cache_get_stats(ctx, &s) == AJ_OK);
    return s;
}

#endif /* AJ_TESTS_CACHE_CTX_H */
