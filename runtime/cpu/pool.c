/*
 * pool.c -- the cpu device's thread pool (pool.h).
 *
 * Workers sleep on a condition variable until a batch is posted (a new
 * generation number), then claim items one at a time from an atomic
 * counter, so uneven items (causal rows near the diagonal, tails) balance
 * themselves.  The posting thread only waits until the last worker has
 * left the batch: items never run on the caller's stack, whose size the
 * library does not control.
 */
#include "runtime/cpu/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"

/* Kernels keep their tiles on the stack (up to ~1.3 MB at the largest
 * schedule); give workers room whatever RLIMIT_STACK says. */
#define WORKER_STACK_BYTES ((size_t)16 << 20)

struct aj_cpu_pool {
    int threads;
    pthread_t *workers;
    int started;                 /* workers running */
    pthread_mutex_t lock;
    pthread_cond_t posted, finished;
    uint64_t generation;         /* bumped per batch */
    int busy;                    /* workers still in the current batch */
    int stopping;
    /* the current batch */
    aj_cpu_item_fn fn;
    void *arg;
    int64_t n;
    atomic_llong next;
};

static void drain(aj_cpu_pool *pool)
{
    for (;;) {
        int64_t i = atomic_fetch_add(&pool->next, 1);
        if (i >= pool->n)
            return;
        pool->fn(pool->arg, i);
    }
}

static void *worker_main(void *arg)
{
    aj_cpu_pool *pool = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stopping && pool->generation == seen)
            pthread_cond_wait(&pool->posted, &pool->lock);
        if (pool->stopping)
            break;
        seen = pool->generation;
        pthread_mutex_unlock(&pool->lock);
        drain(pool);
        pthread_mutex_lock(&pool->lock);
        if (--pool->busy == 0)
            pthread_cond_signal(&pool->finished);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

aj_status aj_cpu_pool_create(aj_ctx *ctx, int threads, aj_cpu_pool **out)
{
    aj_cpu_pool *pool = calloc(1, sizeof *pool);
    pthread_t *workers = calloc((size_t)threads, sizeof *workers);
    if (!pool || !workers) {
        free(pool);
        free(workers);
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    }
    pool->threads = threads;
    pool->workers = workers;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->posted, NULL);
    pthread_cond_init(&pool->finished, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, WORKER_STACK_BYTES);
    for (int t = 0; t < threads; t++) {
        int err = pthread_create(&workers[t], &attr, worker_main, pool);
        if (err) {
            pthread_attr_destroy(&attr);
            aj_cpu_pool_destroy(pool);
            return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "cpu device: cannot start worker "
                           "thread %d of %d: %s", t + 1, threads, strerror(err));
        }
        pool->started++;
    }
    pthread_attr_destroy(&attr);
    *out = pool;
    return AJ_OK;
}

void aj_cpu_pool_destroy(aj_cpu_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->posted);
    pthread_mutex_unlock(&pool->lock);
    for (int t = 0; t < pool->started; t++)
        pthread_join(pool->workers[t], NULL);
    pthread_cond_destroy(&pool->posted);
    pthread_cond_destroy(&pool->finished);
    pthread_mutex_destroy(&pool->lock);
    free(pool->workers);
    free(pool);
}

int aj_cpu_pool_threads(const aj_cpu_pool *pool)
{
    return pool->threads;
}

void aj_cpu_pool_run(aj_cpu_pool *pool, int64_t n, aj_cpu_item_fn fn, void *arg)
{
    if (n <= 0)
        return;
    pool->fn = fn;
    pool->arg = arg;
    pool->n = n;
    atomic_store(&pool->next, 0);
    pthread_mutex_lock(&pool->lock);
    pool->busy = pool->started;
    pool->generation++;
    pthread_cond_broadcast(&pool->posted);
    while (pool->busy > 0)
        pthread_cond_wait(&pool->finished, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
