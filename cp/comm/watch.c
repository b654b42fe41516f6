/*
 * watch.c -- the watchdog of a comm's asynchronous calls (docs/ring.md
 * "Asynchronous calls"; docs/design.md "Context parallelism").
 *
 * An asynchronous ring, Ulysses or hybrid call returns once its work is
 * queued, so nothing on the caller's thread sees a peer that stops or an
 * NCCL error.  Each such call leaves an event at the end of its work here;
 * one thread per comm polls the oldest and the engine's own error:
 *
 *   call 1 queued ─► event e1 ─┐   watchdog: e1 done?  next.
 *   call 2 queued ─► event e2 ─┤             e2 not done, past its
 *                              │             deadline (queued + timeout):
 *                              └──────────►  AJ_ERR_COMM, engine abort
 *
 * The failure is kept: the comm's next call, aj_comm_query and
 * aj_comm_synchronize answer it, and the abort (ncclCommAbort) ends NCCL
 * kernels that wait for a dead peer, so the caller's stream finishes
 * instead of hanging.  The thread owns a context of its own for the
 * device's errors, and touches the comm only through the engine's
 * thread-safe ops (abort, async_error).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cp/comm/comm.h"
#include "ir/diag.h"
#include "runtime/runtime.h"

/* A pending call: its event, deadline and name. */
typedef struct watch_entry {
    void *event;
    double queued, deadline;
    const char *fn;
} watch_entry;

struct aj_comm_watch {
    aj_comm *comm;
    aj_ctx *ctx;                 /* the thread's, for device errors */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t changed;      /* an entry added, done or failed; stop */
    bool stop;
    /* entries [head, head + count) of the ring are pending; the events of
     * all AJ_COMM_WATCH_MAX are the watchdog's, made when it starts */
    watch_entry ring[AJ_COMM_WATCH_MAX];
    int head, count;
    aj_status failed;
    char message[AJ_ERROR_TEXT_MAX];
};

/* Records the first failure (under mu) and ends the engine's work. */
static void fail_locked(struct aj_comm_watch *w, const char *message)
{
    if (w->failed == AJ_OK) {
        w->failed = AJ_ERR_COMM;
        snprintf(w->message, sizeof w->message, "%s", message);
    }
    w->count = 0;   /* nothing left to watch: the comm is done */
    if (w->comm->engine->abort)
        w->comm->engine->abort(w->comm);
    pthread_cond_broadcast(&w->changed);
}

/* One look at the oldest pending call; true if something changed. */
static bool poll_oldest(struct aj_comm_watch *w)
{
    aj_comm *comm = w->comm;
    watch_entry e = w->ring[w->head];
    pthread_mutex_unlock(&w->mu);
    char engine[AJ_ERROR_TEXT_MAX] = "";
    aj_status engine_st = comm->engine->async_error
                              ? comm->engine->async_error(comm, engine, sizeof engine)
                              : AJ_OK;
    bool done = false;
    aj_status st = aj_device_event_done(w->ctx, comm->dev, e.event, &done);
    const double now = aj_now();
    pthread_mutex_lock(&w->mu);
    char message[AJ_ERROR_TEXT_MAX];
    if (engine_st != AJ_OK || st != AJ_OK) {
        snprintf(message, sizeof message, "%s (asynchronous, queued %.3g s earlier): %s", e.fn,
                 now - e.queued, engine_st != AJ_OK ? engine : aj_last_error(w->ctx));
        fail_locked(w, message);
        return true;
    }
    if (done) {
        w->head = (w->head + 1) % AJ_COMM_WATCH_MAX;
        w->count--;
        pthread_cond_broadcast(&w->changed);
        return true;
    }
    if (now > e.deadline) {
        snprintf(message, sizeof message, "%s (asynchronous): its work did not finish within "
                 "the comm timeout of %g s of being queued; a peer has stopped or died, and "
                 "the communicator was aborted", e.fn, comm->timeout_s);
        fail_locked(w, message);
        return true;
    }
    return false;
}

static void *watch_main(void *arg)
{
    struct aj_comm_watch *w = arg;
    /* its event queries must not break a capture the caller begins */
    aj_device_relax_capture(w->comm->dev);
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        if (w->count == 0 || w->failed != AJ_OK) {
            pthread_cond_wait(&w->changed, &w->mu);
            continue;
        }
        if (poll_oldest(w))
            continue;
        /* not done yet: look again in a millisecond, or when told */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&w->changed, &w->mu, &until);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* The comm's watchdog, started on first use. */
static aj_status watch_of(aj_comm *comm, aj_ctx *ctx, struct aj_comm_watch **out)
{
    if (comm->watch) {
        *out = comm->watch;
        return AJ_OK;
    }
    struct aj_comm_watch *w = calloc(1, sizeof *w);
    if (!w)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_comm: out of memory");
    w->comm = comm;
    aj_status st = aj_ctx_create(NULL, &w->ctx);
    for (int i = 0; i < AJ_COMM_WATCH_MAX && st == AJ_OK; i++)
        st = aj_device_event_create(comm->dev, &w->ring[i].event);
    if (st == AJ_OK) {
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->changed, NULL);
        if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
            pthread_cond_destroy(&w->changed);
            pthread_mutex_destroy(&w->mu);
            st = aj_fail(ctx, AJ_ERR_INTERNAL, "aj_comm: the watchdog thread cannot start");
        }
    } else if (w->ctx) {
        st = aj_fail(ctx, st, "aj_comm: the watchdog's events: %s", aj_last_error(w->ctx));
    }
    if (st != AJ_OK) {
        for (int i = 0; i < AJ_COMM_WATCH_MAX; i++)
            aj_device_event_destroy(comm->dev, w->ring[i].event);
        aj_ctx_destroy(w->ctx);
        free(w);
        return st;
    }
    comm->watch = *out = w;
    return AJ_OK;
}

aj_status aj_comm_watch_add(aj_comm *comm, aj_ctx *ctx, void *stream, void *caller,
                            const char *fn)
{
    bool capturing = false;
    aj_status st = aj_device_capturing(ctx, comm->dev, stream, &capturing);
    if (st == AJ_OK && capturing)   /* the graph's launcher watches its replays */
        return aj_device_stream_after(comm->dev, caller, stream, comm->order_event);
    struct aj_comm_watch *w = NULL;
    AJ_TRY(watch_of(comm, ctx, &w));
    pthread_mutex_lock(&w->mu);
    while (w->count == AJ_COMM_WATCH_MAX && w->failed == AJ_OK)
        pthread_cond_wait(&w->changed, &w->mu);   /* the oldest's deadline bounds it */
    const bool failed = w->failed != AJ_OK;
    if (!failed) {
        watch_entry *e = &w->ring[(w->head + w->count) % AJ_COMM_WATCH_MAX];
        st = aj_device_event_record(comm->dev, e->event, stream);
        if (st == AJ_OK)
            st = aj_device_stream_wait_event(comm->dev, caller, e->event);
        if (st == AJ_OK) {
            e->fn = fn;
            e->queued = aj_now();
            e->deadline = e->queued + comm->timeout_s;
            w->count++;
            pthread_cond_broadcast(&w->changed);
        }
    }
    pthread_mutex_unlock(&w->mu);
    /* a failure found since this call's work was queued is the next
     * call's (or a query's) to report, whenever the watchdog finds it */
    return failed ? aj_comm_watch_check(comm, ctx, fn, NULL) : st;
done:
    return st;
}

aj_status aj_comm_watch_check(aj_comm *comm, aj_ctx *ctx, const char *fn, int32_t *pending)
{
    struct aj_comm_watch *w = comm->watch;
    if (pending)
        *pending = 0;
    if (!w)
        return AJ_OK;
    pthread_mutex_lock(&w->mu);
    const aj_status failed = w->failed;
    char message[AJ_ERROR_TEXT_MAX];
    snprintf(message, sizeof message, "%s", w->message);
    if (pending)
        *pending = w->count;
    pthread_mutex_unlock(&w->mu);
    if (failed == AJ_OK)
        return AJ_OK;
    return aj_fail(ctx, failed, "%s: rank %d: an earlier call failed: %s; destroy the comm "
                   "and end the job", fn, comm->rank, message);
}

aj_status aj_comm_watch_drain(aj_comm *comm, aj_ctx *ctx, const char *fn)
{
    struct aj_comm_watch *w = comm->watch;
    if (w) {
        pthread_mutex_lock(&w->mu);
        while (w->count > 0 && w->failed == AJ_OK)
            pthread_cond_wait(&w->changed, &w->mu);
        pthread_mutex_unlock(&w->mu);
    }
    return aj_comm_watch_check(comm, ctx, fn, NULL);
}

void aj_comm_watch_free(aj_comm *comm)
{
    struct aj_comm_watch *w = comm->watch;
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    while (w->count > 0 && w->failed == AJ_OK)   /* its calls' work, before their buffers go */
        pthread_cond_wait(&w->changed, &w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->changed);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->changed);
    pthread_mutex_destroy(&w->mu);
    for (int i = 0; i < AJ_COMM_WATCH_MAX; i++)
        aj_device_event_destroy(comm->dev, w->ring[i].event);
    aj_ctx_destroy(w->ctx);
    free(w);
    comm->watch = NULL;
}

aj_status aj_comm_query(aj_comm *comm, int32_t *pending)
{
    if (pending)
        *pending = 0;
    if (!comm)
        return AJ_ERR_INVALID_ARG;
    return aj_comm_watch_check(comm, comm->ctx, "aj_comm_query", pending);
}

aj_status aj_comm_synchronize(aj_comm *comm)
{
    if (!comm)
        return AJ_ERR_INVALID_ARG;
    return aj_comm_watch_drain(comm, comm->ctx, "aj_comm_synchronize");
}
