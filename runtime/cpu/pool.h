/*
 * pool.h -- a fixed set of host threads that run the items of a launch.
 */
#ifndef AJ_RUNTIME_CPU_POOL_H
#define AJ_RUNTIME_CPU_POOL_H

#include <stdint.h>

#include "attnjit/attnjit.h"

typedef struct aj_cpu_pool aj_cpu_pool;

/* Runs item i of a batch. */
typedef void (*aj_cpu_item_fn)(void *arg, int64_t i);

/* A pool of `threads` (>= 1) worker threads started here, each with a
 * 16 MiB stack.  AJ_ERR_OUT_OF_MEMORY naming the failure if a thread
 * cannot be started. */
aj_status aj_cpu_pool_create(aj_ctx *ctx, int threads, aj_cpu_pool **out);
/* Stops and joins the workers; NULL is a no-op. */
void aj_cpu_pool_destroy(aj_cpu_pool *pool);
int aj_cpu_pool_threads(const aj_cpu_pool *pool);
/* Runs fn(arg, i) for every i in [0, n) on the pool's threads, each item
 * once, in any order, and returns when all are done.  One batch at a
 * time: calls on one pool must not overlap. */
void aj_cpu_pool_run(aj_cpu_pool *pool, int64_t n, aj_cpu_item_fn fn, void *arg);

#endif /* AJ_RUNTIME_CPU_POOL_H */
