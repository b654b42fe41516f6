/*
 * comm.c -- aj_comm: configuration checks, the engine choice, and the
 * bounded wait every engine shares.
 */
#include "cp/comm/comm.h"

#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "ir/diag.h"
#include "runtime/runtime.h"

#define DEFAULT_TIMEOUT_S 300.0

void aj_comm_pause(void)
{
    /* 50 us: short against any block's compute, long enough that P ranks
     * on 2 cores leave each other the CPU. */
    const struct timespec nap = {0, 50 * 1000};
    sched_yield();
    nanosleep(&nap, NULL);
}

aj_status aj_comm_create(aj_ctx *ctx, aj_device *dev, const aj_comm_config *given,
                         aj_comm **out)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, out, "aj_comm_create: out is NULL");
    AJ_CHECK_ARG(ctx, dev, "aj_comm_create: dev is NULL");
    AJ_CHECK_ARG(ctx, given, "aj_comm_create: config is NULL");
    AJ_READ_STRUCT_OR_RETURN(ctx, "aj_comm_create: config", given, aj_comm_config, kind,
                             AJ_COMM_CONFIG_INIT, config);
    AJ_CHECK_ARG(ctx, (unsigned)config->kind < AJ_COMM_KIND_COUNT,
                 "aj_comm_create: config->kind = %d is not a comm kind", (int)config->kind);
    AJ_CHECK_ARG(ctx, config->timeout_s >= 0 && config->timeout_s < 1e9,
                 "aj_comm_create: config->timeout_s = %g; want seconds >= 0 (0: %g)",
                 config->timeout_s, DEFAULT_TIMEOUT_S);

    aj_comm *comm = calloc(1, sizeof *comm);
    if (!comm)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_comm_create: out of memory");
    comm->ctx = ctx;
    comm->dev = dev;
    comm->timeout_s = config->timeout_s > 0 ? config->timeout_s : DEFAULT_TIMEOUT_S;
    aj_status st = config->kind == AJ_COMM_MPI ? aj_comm_mpi_open(comm, config)
                                               : aj_comm_nccl_open(comm, config);
    if (st != AJ_OK) {
        free(comm);
        return st;
    }
    *out = comm;
    return AJ_OK;
}

aj_status aj_comm_split(aj_comm *comm, int color, int key, aj_comm **out)
{
    aj_comm *sub = calloc(1, sizeof *sub);
    if (!sub)
        return aj_fail(comm->ctx, AJ_ERR_OUT_OF_MEMORY, "aj_comm_split: out of memory");
    sub->ctx = comm->ctx;
    sub->dev = comm->dev;
    sub->timeout_s = comm->timeout_s;
    aj_status st = comm->engine->split(comm, color, key, sub);
    if (st != AJ_OK) {
        free(sub);
        return st;
    }
    *out = sub;
    return AJ_OK;
}

/* ---------------------------------------------------------------- blocks */

typedef struct aj_comm_block {
    void *ptr;
    size_t bytes;
    bool busy;
} aj_comm_block;

aj_status aj_comm_block_get(aj_comm *comm, size_t bytes, void **out)
{
    bytes = bytes ? (bytes + 3) / 4 * 4 : 64;   /* whole words: fill32 clears them */
    if (!comm->blocks && !(comm->blocks = calloc(AJ_COMM_BLOCKS, sizeof *comm->blocks)))
        return aj_fail(comm->ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    aj_comm_block *fit = NULL, *idle = NULL;   /* the smallest that fits; one to replace */
    for (int i = 0; i < comm->num_blocks; i++) {
        aj_comm_block *b = &comm->blocks[i];
        if (b->busy)
            continue;
        if (b->bytes >= bytes && (!fit || b->bytes < fit->bytes))
            fit = b;
        if (!idle || b->bytes < idle->bytes)
            idle = b;
    }
    if (fit) {
        fit->busy = true;
        *out = fit->ptr;
        return AJ_OK;
    }
    aj_comm_block *slot = comm->num_blocks < AJ_COMM_BLOCKS ? &comm->blocks[comm->num_blocks]
                                                            : idle;
    if (slot && slot->ptr) {   /* a kept block too small for anything now: replaced */
        aj_device_free(comm->dev, slot->ptr);
        *slot = (aj_comm_block){0};
    }
    aj_status st = aj_device_alloc(comm->dev, bytes, out);
    if (st != AJ_OK || !slot)
        return st;   /* every kept block busy: the call's own */
    *slot = (aj_comm_block){*out, bytes, true};
    if (slot == &comm->blocks[comm->num_blocks])
        comm->num_blocks++;
    return AJ_OK;
}

void aj_comm_block_put(aj_comm *comm, void *ptr)
{
    if (!ptr)
        return;
    for (int i = 0; i < comm->num_blocks; i++)
        if (comm->blocks[i].ptr == ptr) {
            comm->blocks[i].busy = false;
            return;
        }
    aj_device_free(comm->dev, ptr);   /* not kept: the call's own */
}

void aj_comm_destroy(aj_comm *comm)
{
    if (!comm)
        return;
    aj_comm_watch_free(comm);   /* its calls' work done (or failed) first */
    aj_comm_destroy(comm->group);
    aj_comm_destroy(comm->across);
    if (comm->ring_memo)
        comm->ring_memo_free(comm->ring_memo);
    if (comm->ring_stream)
        aj_device_stream_destroy(comm->dev, comm->ring_stream);
    aj_device_event_destroy(comm->dev, comm->order_event);
    for (size_t i = 0; i < sizeof comm->agreed / sizeof comm->agreed[0]; i++)
        free(comm->agreed[i]);
    for (int i = 0; i < comm->num_blocks; i++)
        aj_device_free(comm->dev, comm->blocks[i].ptr);
    free(comm->blocks);
    comm->engine->destroy(comm);
    free(comm);
}

int aj_comm_rank(const aj_comm *comm)
{
    return comm ? comm->rank : -1;
}

int aj_comm_size(const aj_comm *comm)
{
    return comm ? comm->size : -1;
}

uint64_t aj_comm_bytes_sent(const aj_comm *comm)
{
    if (!comm)
        return 0;
    return comm->bytes_sent + aj_comm_bytes_sent(comm->group) +
           aj_comm_bytes_sent(comm->across);
}

aj_status aj_comm_shared_segments(aj_comm *comm, size_t bytes, void **seg)
{
    if (comm->messages_only || !comm->engine->shared_segments)
        return AJ_ERR_UNSUPPORTED;
    return comm->engine->shared_segments(comm, bytes, seg);
}

aj_status aj_comm_wait(aj_comm *comm, aj_comm_req *req, const char *fn, double *waited_s)
{
    if (!req->active)
        return AJ_OK;
    const double start = aj_now();
    aj_status st = AJ_OK;
    /* seen completed already (exchange_progress): not tested again */
    for (bool done = req->completed != 0; !done;) {
        st = comm->engine->exchange_test(comm, req, &done);
        if (st != AJ_OK)
            break;
        if (done) {
            if (!req->completed)
                req->completed = aj_now();
            break;
        }
        double now = aj_now();
        if (now - start > comm->timeout_s) {
            comm->engine->exchange_cancel(comm, req);
            st = aj_fail(comm->ctx, AJ_ERR_COMM,
                         "%s: rank %d: %s exchange (%zu bytes to rank %d, from rank %d) "
                         "got no answer within the comm timeout of %g s; a peer has "
                         "stopped or died", fn, comm->rank, req->what, req->bytes, req->to,
                         req->from, comm->timeout_s);
            break;
        }
        aj_comm_pause();
    }
    req->active = false;
    if (waited_s)
        *waited_s += aj_now() - start;
    return st;
}
