/*
 * pool.h -- a fixed set of host threads that run the items of a launch.
 */
#ifndef AJ_RUNTIME_CPU_POOL_H
#define AJ_RUNTIME_CPU_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "attnjit/attnjit.h"

typedef struct aj_cpu_pool aj_cpu_pool;

/* Runs item i of a batch. */
typedef void (*aj_cpu_item_fn)(void *arg, int64_t i);

/* A pool of `threads` (>= 1) worker threads started here, each with a
 * 16 MiB stack.  AJ_ERR_OUT_OF_MEMORY naming the failure if a thread
 * cannot be started. */
aj_status aj_cpu_pool_create(aj_ctx *ctx, int threads, aj_cpu_pool **out);
/* Stops and joins the workers; NULL is a no-op.  Not for a forked pool. */
void aj_cpu_pool_destroy(aj_cpu_pool *pool);
/* How many fork()s this process is the child of, counted from the first
 * call (which watches them with pthread_atfork; the first pool makes it). */
unsigned aj_cpu_fork_generation(void);
/* Whether this process is a child forked after the pool was made: its
 * workers stayed in the parent, so the pool can neither run a batch nor
 * be joined here, only dropped (its memory is the parent's copy). */
bool aj_cpu_pool_forked(const aj_cpu_pool *pool);
/* Starts workers until the pool has at least `threads`; it never shrinks.
 * Safe while batches run.  AJ_ERR_OUT_OF_MEMORY as for create (the
 * workers started before the failure stay). */
aj_status aj_cpu_pool_grow(aj_ctx *ctx, aj_cpu_pool *pool, int threads);
/* Runs fn(arg, i) for every i in [0, n) on at most `width` threads (< 1:
 * as many as the pool has workers; never more than its workers and the
 * caller), each item once, in any order, and returns when all are done.
 * The calling thread is one of them where its stack has item_stack bytes
 * and a margin left (item_stack < 0: never): an item's stack buffers (a
 * stage's stack_bytes).  Any number of threads may call it at once on one
 * pool: batches are served in the order they came. */
void aj_cpu_pool_run(aj_cpu_pool *pool, int width, int64_t n, int64_t item_stack,
                     aj_cpu_item_fn fn, void *arg);

/* Whether the calling thread's stack has room for an item whose buffers
 * take item_stack bytes (< 0: never), beside a margin for the kernel's
 * spills and the calls it makes; false where its bounds are unknown. */
bool aj_cpu_stack_fits(int64_t item_stack);
/* Runs fn(arg, i) for items claimed one at a time from *next (shared by
 * the threads of a batch) until none below n is left. */
void aj_cpu_claim_items(atomic_llong *next, int64_t n, aj_cpu_item_fn fn, void *arg);

#endif /* AJ_RUNTIME_CPU_POOL_H */
