/*
 * pool.c -- the cpu device's thread pool (pool.h).
 *
 * Every call of aj_cpu_pool_run is a batch that lives on its caller's
 * stack and waits in a FIFO queue until workers join it:
 *
 *   queue:  [batch A: width 4, joined 4] -> dequeued once full
 *           [batch B: width 2, joined 1] <- the next idle worker joins B
 *           [batch C: width 8, joined 0]
 *
 * A worker joins the head batch, claims its items one at a time from the
 * batch's atomic counter (so uneven items -- causal rows near the
 * diagonal, tails -- balance themselves) and leaves when none is left.
 * A batch leaves the queue when as many workers as its width have joined
 * or when one of them found its items exhausted; its caller returns once
 * it has left the queue and the last worker inside has left it.  So any
 * number of threads may submit at once: each waits on its own batch, no
 * submitter overwrites another's, and no wake-up is lost (every state
 * change is made under the pool's lock and announced by broadcast).  The
 * pool only grows: a batch narrower than the pool is joined by at most
 * `width` workers.
 *
 * The caller runs items too, where its stack has room for them (docs/cpu.md
 * "Small shapes"): it is then one of the batch's `width` threads, claims
 * items from the same counter as soon as it has queued the batch, and waits
 * only for the items workers are still running when none is left.  Waking
 * a sleeping worker takes tens of microseconds (on a virtual machine about
 * 40 us, more than a small launch's arithmetic), and the caller's own wake
 * as much again; a caller that works meanwhile pays neither, and a batch of
 * one item, or a launch on one thread, never touches the workers.  A
 * kernel's item keeps its buffers on the stack (the stage's stack_bytes),
 * so a thread whose stack has less room left than those and a margin only
 * waits, as every caller did before; so does the caller of a long launch
 * (aj_cpu_launch passes item_stack -1, runtime/cpu/cpu_device.c).
 */
#define _GNU_SOURCE   /* pthread_getattr_np */
#include "runtime/cpu/pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"

/* Kernels keep their tiles on the stack (up to ~1.3 MB at the largest
 * schedule); give workers room whatever RLIMIT_STACK says. */
#define WORKER_STACK_BYTES ((size_t)16 << 20)

/* What a thread's stack must have left beyond an item's buffers before
 * the item runs there: the kernel's spills and the calls it makes (libm,
 * the runtime's helpers). */
#define STACK_MARGIN ((int64_t)512 << 10)

/* How many pause instructions a caller spins for its batch's last items
 * (a few tens of microseconds) before it sleeps. */
#define CALLER_SPINS 20000

typedef struct batch {
    struct batch *next_in_queue;
    aj_cpu_item_fn fn;
    void *arg;
    int64_t n;
    atomic_llong next_item;      /* the next item not yet claimed */
    int width;                   /* the most workers that may join */
    int joined;                  /* workers that joined (pool lock) */
    int inside;                  /* workers still running it (pool lock) */
    bool queued;                 /* still open to workers (pool lock) */
    atomic_bool done;            /* inside reached 0 (set under the lock) */
    pthread_cond_t finished;     /* signalled when it is done */
} batch;

struct aj_cpu_pool {
    pthread_mutex_t lock;
    pthread_cond_t posted;       /* a batch was queued, or the pool stops */
    batch *head, *tail;          /* batches open to workers, oldest first */
    pthread_t *workers;
    int started;                 /* workers running */
    int capacity;                /* length of workers[] */
    int stopping;
    unsigned generation;         /* aj_cpu_fork_generation() when made */
};

/* fork()s of which this process is the child, counted from the first
 * pool's making (pthread_atfork): a forked child has none of its parent's
 * threads, so a pool made before the fork has no workers here. */
static atomic_uint forks_seen;
static pthread_once_t watch_forks_once = PTHREAD_ONCE_INIT;

static void count_fork(void)
{
    atomic_fetch_add(&forks_seen, 1);
}

static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, count_fork);
}

unsigned aj_cpu_fork_generation(void)
{
    pthread_once(&watch_forks_once, watch_forks);
    return atomic_load(&forks_seen);
}

bool aj_cpu_pool_forked(const aj_cpu_pool *pool)
{
    return pool->generation != aj_cpu_fork_generation();
}

/* Under the lock: closes b to further workers. */
static void dequeue(aj_cpu_pool *pool, batch *b)
{
    batch **link = &pool->head;
    while (*link != b)
        link = &(*link)->next_in_queue;
    *link = b->next_in_queue;
    if (pool->tail == b) {
        pool->tail = NULL;
        for (batch *p = pool->head; p; p = p->next_in_queue)
            pool->tail = p;
    }
    b->queued = false;
}

void aj_cpu_claim_items(atomic_llong *next, int64_t n, aj_cpu_item_fn fn, void *arg)
{
    for (int64_t i = atomic_fetch_add(next, 1); i < n; i = atomic_fetch_add(next, 1))
        fn(arg, i);
}

static void drain(batch *b)
{
    aj_cpu_claim_items(&b->next_item, b->n, b->fn, b->arg);
}

static void *worker_main(void *arg)
{
    aj_cpu_pool *pool = arg;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stopping && !pool->head)
            pthread_cond_wait(&pool->posted, &pool->lock);
        if (pool->stopping)
            break;
        batch *b = pool->head;
        b->joined++;
        b->inside++;
        if (b->joined == b->width)
            dequeue(pool, b);
        pthread_mutex_unlock(&pool->lock);
        drain(b);
        pthread_mutex_lock(&pool->lock);
        if (b->queued)           /* every item is claimed: no one else need join */
            dequeue(pool, b);
        if (--b->inside == 0) {   /* the last touch of b: its caller waits for the lock */
            atomic_store_explicit(&b->done, true, memory_order_release);
            pthread_cond_signal(&b->finished);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

aj_status aj_cpu_pool_create(aj_ctx *ctx, int threads, aj_cpu_pool **out)
{
    aj_cpu_pool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->posted, NULL);
    pool->generation = aj_cpu_fork_generation();
    aj_status st = aj_cpu_pool_grow(ctx, pool, threads);
    if (st != AJ_OK) {
        aj_cpu_pool_destroy(pool);
        return st;
    }
    *out = pool;
    return AJ_OK;
}

aj_status aj_cpu_pool_grow(aj_ctx *ctx, aj_cpu_pool *pool, int threads)
{
    aj_status st = AJ_OK;
    pthread_mutex_lock(&pool->lock);
    if (threads > pool->capacity) {
        pthread_t *workers = realloc(pool->workers, (size_t)threads * sizeof *workers);
        if (!workers) {
            pthread_mutex_unlock(&pool->lock);
            return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
        }
        pool->workers = workers;
        pool->capacity = threads;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, WORKER_STACK_BYTES);
    while (pool->started < threads) {
        int err = pthread_create(&pool->workers[pool->started], &attr, worker_main, pool);
        if (err) {
            st = aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "cpu device: cannot start worker thread "
                         "%d of %d: %s", pool->started + 1, threads, strerror(err));
            break;
        }
        pool->started++;
    }
    pthread_attr_destroy(&attr);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

void aj_cpu_pool_destroy(aj_cpu_pool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->posted);
    int started = pool->started;
    pthread_mutex_unlock(&pool->lock);
    for (int t = 0; t < started; t++)
        pthread_join(pool->workers[t], NULL);
    pthread_cond_destroy(&pool->posted);
    pthread_mutex_destroy(&pool->lock);
    free(pool->workers);
    free(pool);
}

/* The bytes left below the caller's frame on its thread's stack, from the
 * stack's bounds (looked up once per thread); 0 where they are unknown. */
static int64_t stack_left(void)
{
    static _Thread_local uintptr_t low;   /* 0: not looked up yet; 1: unknown */
    if (!low) {
        low = 1;
        pthread_attr_t attr;
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            void *addr;
            size_t size;
            if (pthread_attr_getstack(&attr, &addr, &size) == 0 && (uintptr_t)addr > 1)
                low = (uintptr_t)addr;
            pthread_attr_destroy(&attr);
        }
    }
    /* the frame's own address, not a local's (a sanitizer may keep those
     * on a heap "fake stack") */
    uintptr_t here = (uintptr_t)__builtin_frame_address(0);
    return low > 1 && here > low ? (int64_t)(here - low) : 0;
}

bool aj_cpu_stack_fits(int64_t item_stack)
{
    return item_stack >= 0 && stack_left() >= item_stack + STACK_MARGIN;
}

static void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

void aj_cpu_pool_run(aj_cpu_pool *pool, int width, int64_t n, int64_t item_stack,
                     aj_cpu_item_fn fn, void *arg)
{
    if (n <= 0)
        return;
    const bool caller = aj_cpu_stack_fits(item_stack);
    batch b = {.fn = fn, .arg = arg, .n = n, .queued = true};
    atomic_init(&b.next_item, 0);
    atomic_init(&b.done, false);
    pthread_mutex_lock(&pool->lock);
    /* the threads that run items, the caller among them where it can */
    int runners = width < 1 ? pool->started : width;
    if (runners > pool->started + caller)
        runners = pool->started + caller;
    b.width = runners - caller;
    if (caller && (b.width == 0 || n == 1)) {   /* this thread alone */
        pthread_mutex_unlock(&pool->lock);
        drain(&b);
        return;
    }
    pthread_cond_init(&b.finished, NULL);
    if (pool->tail)
        pool->tail->next_in_queue = &b;
    else
        pool->head = &b;
    pool->tail = &b;
    b.inside = caller;
    pthread_cond_broadcast(&pool->posted);
    if (caller) {
        pthread_mutex_unlock(&pool->lock);
        drain(&b);
        pthread_mutex_lock(&pool->lock);
        if (b.queued)            /* every item is claimed: no worker need join */
            dequeue(pool, &b);
        bool last = --b.inside == 0;
        pthread_mutex_unlock(&pool->lock);
        /* the workers still inside are each finishing one item */
        for (int k = 0; !last && k < CALLER_SPINS; k++) {
            if (atomic_load_explicit(&b.done, memory_order_acquire))
                break;
            relax();
        }
        /* done or not, the lock orders this return after the last worker's
         * touch of b (it sets done and signals under the lock) */
        pthread_mutex_lock(&pool->lock);
    }
    while (b.queued || b.inside > 0)
        pthread_cond_wait(&b.finished, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    pthread_cond_destroy(&b.finished);
}
