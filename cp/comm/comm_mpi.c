/*
 * comm_mpi.c -- the MPI engine: CPU ranks, nonblocking point-to-point and
 * collectives on a duplicate of the caller's communicator.
 *
 * Nothing here blocks inside MPI: every operation is started with its
 * nonblocking form (MPI_Isend / MPI_Irecv, MPI_Iallgather, ...) and
 * completed by MPI_Test polling under the comm's deadline, which both
 * progresses the transfer (MPI moves rendezvous messages only inside MPI
 * calls) and turns a silent peer into AJ_ERR_COMM.  The communicator has
 * MPI_ERRORS_RETURN, so a transport failure comes back as an error code
 * instead of aborting the job.  The exception: opening the shared-memory
 * window (mpi_shared_segments), which MPI offers only as blocking
 * collectives.
 */
#include <assert.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"
#include "cp/comm/comm_mpi.h"

typedef struct mpi_state {
    MPI_Comm comm;
    /* the shared segments (mpi_shared_segments): whether every rank is on
     * this node (-1: not asked yet), and the window while there is one */
    int one_node;
    bool has_window;
    bool broken;               /* a wait timed out: a peer may be gone */
    MPI_Win window;
    size_t window_bytes;       /* each rank's segment */
    void **segments;           /* [size] */
} mpi_state;

/* What aj_comm_req.impl holds: an exchange's receive and send, or a
 * fence's barrier (and MPI_REQUEST_NULL). */
typedef struct mpi_req {
    MPI_Request r[2];
    bool fence;                /* on completion, the window's memory barrier */
} mpi_req;

static_assert(sizeof(mpi_req) <= sizeof(((aj_comm_req *)0)->impl),
              "aj_comm_req.impl must hold an mpi_req");

static MPI_Comm mpi_comm_of(const aj_comm *comm)
{
    return ((const mpi_state *)comm->impl)->comm;
}

/* AJ_ERR_COMM with MPI's own text for `code`. */
static aj_status mpi_fail(aj_comm *comm, int code, const char *what)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(code, text, &len);
    return aj_fail(comm->ctx, AJ_ERR_COMM, "MPI: rank %d: %s failed: %s", comm->rank, what,
                   text);
}

/* Polls one request to completion under the deadline. */
static aj_status mpi_wait_one(aj_comm *comm, MPI_Request *request, const char *what)
{
    const double start = aj_now();
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(request, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mpi_fail(comm, rc, what);
        if (flag)
            return AJ_OK;
        if (aj_now() - start > comm->timeout_s) {
            ((mpi_state *)comm->impl)->broken = true;
            /* A collective cannot be cancelled; the request is left to
             * MPI, and the caller is told to end the job. */
            return aj_fail(comm->ctx, AJ_ERR_COMM, "MPI: rank %d: %s got no answer within "
                           "the comm timeout of %g s; a peer has stopped or died",
                           comm->rank, what, comm->timeout_s);
        }
        aj_comm_pause();
    }
}

static aj_status check_count(aj_comm *comm, size_t bytes, const char *what)
{
    if (bytes <= INT_MAX)
        return AJ_OK;
    return aj_fail(comm->ctx, AJ_ERR_UNSUPPORTED, "MPI: %s of %zu bytes: MPI counts are "
                   "int, so one message holds at most %d bytes (use more ranks)", what,
                   bytes, INT_MAX);
}

static aj_status mpi_exchange_start(aj_comm *comm, const void *send, void *recv, size_t bytes,
                                    int to, int from, int tag, aj_comm_req *req)
{
    aj_status st = check_count(comm, bytes, "an exchange");
    if (st != AJ_OK)
        return st;
    mpi_req *m = (mpi_req *)req->impl;
    MPI_Request *r = m->r;
    r[0] = r[1] = MPI_REQUEST_NULL;
    m->fence = false;
    /* The receive first, so an eager message from `from` lands directly. */
    int rc = MPI_Irecv(recv, (int)bytes, MPI_BYTE, from < 0 ? MPI_PROC_NULL : from, tag,
                       mpi_comm_of(comm), &r[0]);
    if (rc != MPI_SUCCESS)
        return mpi_fail(comm, rc, "MPI_Irecv");
    rc = MPI_Isend(send, (int)bytes, MPI_BYTE, to < 0 ? MPI_PROC_NULL : to, tag,
                   mpi_comm_of(comm), &r[1]);
    if (rc != MPI_SUCCESS) {
        MPI_Cancel(&r[0]);
        MPI_Request_free(&r[0]);
        return mpi_fail(comm, rc, "MPI_Isend");
    }
    if (to >= 0 && to != comm->rank)
        aj_comm_count_sent(comm, bytes);
    return AJ_OK;
}

static aj_status mpi_exchange_test(aj_comm *comm, aj_comm_req *req, bool *done)
{
    mpi_req *m = (mpi_req *)req->impl;
    int flag = 0;
    int rc = MPI_Testall(2, m->r, &flag, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS)
        return mpi_fail(comm, rc, m->fence ? "a fence (MPI_Testall)"
                                           : "an exchange (MPI_Testall)");
    if (flag && m->fence)
        MPI_Win_sync(((mpi_state *)comm->impl)->window);
    *done = flag != 0;
    return AJ_OK;
}

static void mpi_exchange_cancel(aj_comm *comm, aj_comm_req *req)
{
    ((mpi_state *)comm->impl)->broken = true;
    mpi_req *m = (mpi_req *)req->impl;
    if (m->fence)   /* a collective cannot be cancelled: left to MPI */
        return;
    MPI_Request *r = m->r;
    for (int i = 0; i < 2; i++)
        if (r[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&r[i]);
            MPI_Request_free(&r[i]);
        }
}

static aj_status mpi_allgather(aj_comm *comm, const void *send, void *recv, size_t bytes)
{
    aj_status st = check_count(comm, bytes, "an all-gather");
    if (st != AJ_OK)
        return st;
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                            mpi_comm_of(comm), &r);
    if (rc != MPI_SUCCESS)
        return mpi_fail(comm, rc, "MPI_Iallgather");
    aj_comm_count_collective(comm, bytes);
    return mpi_wait_one(comm, &r, "MPI_Iallgather");
}

static aj_status mpi_reduce_scatter_f32(aj_comm *comm, const float *send, float *recv,
                                        size_t count)
{
    aj_status st = check_count(comm, count * sizeof(float), "a reduce-scatter");
    if (st != AJ_OK)
        return st;
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Ireduce_scatter_block(send, recv, (int)count, MPI_FLOAT, MPI_SUM,
                                       mpi_comm_of(comm), &r);
    if (rc != MPI_SUCCESS)
        return mpi_fail(comm, rc, "MPI_Ireduce_scatter_block");
    aj_comm_count_collective(comm, count * sizeof(float));
    return mpi_wait_one(comm, &r, "MPI_Ireduce_scatter_block");
}

/* counts[i] and offsets[i] as MPI's ints. */
static aj_status int_counts(aj_comm *comm, const size_t *bytes, const size_t *off, int *icount,
                            int *ioff)
{
    for (int i = 0; i < comm->size; i++) {
        aj_status st = check_count(comm, off[i] + bytes[i], "an all-to-all");
        if (st != AJ_OK)
            return st;
        icount[i] = (int)bytes[i];
        ioff[i] = (int)off[i];
    }
    return AJ_OK;
}

static aj_status mpi_alltoallv(aj_comm *comm, const void *send, const size_t *send_bytes,
                               const size_t *send_off, void *recv, const size_t *recv_bytes,
                               const size_t *recv_off)
{
    int *ints = malloc(4 * (size_t)comm->size * sizeof *ints);
    if (!ints)
        return aj_fail(comm->ctx, AJ_ERR_OUT_OF_MEMORY, "MPI: all-to-all: out of memory");
    int *sc = ints, *sd = ints + comm->size, *rc_ = ints + 2 * comm->size,
        *rd = ints + 3 * comm->size;
    aj_status st = int_counts(comm, send_bytes, send_off, sc, sd);
    if (st == AJ_OK)
        st = int_counts(comm, recv_bytes, recv_off, rc_, rd);
    if (st == AJ_OK) {
        MPI_Request r = MPI_REQUEST_NULL;
        int rc = MPI_Ialltoallv(send, sc, sd, MPI_BYTE, recv, rc_, rd, MPI_BYTE,
                                mpi_comm_of(comm), &r);
        if (rc == MPI_SUCCESS)
            aj_comm_count_alltoall(comm, send_bytes);
        st = rc != MPI_SUCCESS ? mpi_fail(comm, rc, "MPI_Ialltoallv")
                               : mpi_wait_one(comm, &r, "MPI_Ialltoallv");
    }
    free(ints);
    return st;
}

/* ---------------------------------------------------------------- shared memory */

/*
 * Where every rank is on one node, one MPI window of shared memory
 * (MPI_Win_allocate_shared) holds a segment per rank, which every rank
 * reads in place: no message, no copy.  The window is opened at the first
 * call that asks for segments (MPI_Comm_split_type and
 * MPI_Win_allocate_shared are blocking collectives, so it is asked for
 * only right after the ranks agreed on a call, every peer present), kept
 * in a passive-target epoch (MPI_Win_lock_all, MPI_MODE_NOCHECK) and
 * replaced, collectively, when a call needs larger segments.  A fence is
 * MPI_Win_sync (this rank's writes out), a barrier polled under the
 * deadline, and MPI_Win_sync again (the others' writes in).
 */

/* Frees the window (collective: MPI_Win_free synchronises). */
static void free_window(mpi_state *s)
{
    if (!s->has_window)
        return;
    MPI_Win_unlock_all(s->window);
    MPI_Win_free(&s->window);
    s->has_window = false;
    s->window_bytes = 0;
}

/* Whether every rank of the comm shares this node's memory. */
static aj_status ask_one_node(aj_comm *comm, mpi_state *s)
{
    MPI_Comm node = MPI_COMM_NULL;
    int rc = MPI_Comm_split_type(s->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS)
        return mpi_fail(comm, rc, "MPI_Comm_split_type");
    int n = 0;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    s->one_node = n == comm->size;
    return AJ_OK;
}

static aj_status mpi_shared_segments(aj_comm *comm, size_t bytes, void **seg)
{
    mpi_state *s = comm->impl;
    aj_status st = AJ_OK;
    if (s->one_node < 0 && (st = ask_one_node(comm, s)) != AJ_OK)
        return st;
    if (!s->one_node)
        return AJ_ERR_UNSUPPORTED;
    /* whole cache lines, and one more: the window's segments start where
     * MPI puts them, and each is used from its first 64-byte boundary on */
    const size_t line = 64, want = (bytes + line - 1) / line * line + line;
    if (want > s->window_bytes) {
        free_window(s);
        if ((st = check_count(comm, want, "a shared segment")) != AJ_OK)
            return st;
        void *mine = NULL;
        int rc = MPI_Win_allocate_shared((MPI_Aint)want, 1, MPI_INFO_NULL, s->comm, &mine,
                                         &s->window);
        if (rc != MPI_SUCCESS)
            return mpi_fail(comm, rc, "MPI_Win_allocate_shared");
        MPI_Win_lock_all(MPI_MODE_NOCHECK, s->window);
        s->has_window = true;
        s->window_bytes = want;
        for (int r = 0; r < comm->size && rc == MPI_SUCCESS; r++) {
            MPI_Aint size = 0;
            int unit = 0;
            void *base = NULL;
            rc = MPI_Win_shared_query(s->window, r, &size, &unit, &base);
            s->segments[r] = (void *)(((uintptr_t)base + line - 1) / line * line);
        }
        if (rc != MPI_SUCCESS)
            return mpi_fail(comm, rc, "MPI_Win_shared_query");
    }
    memcpy(seg, s->segments, (size_t)comm->size * sizeof *seg);
    return AJ_OK;
}

static aj_status mpi_shared_fence_start(aj_comm *comm, aj_comm_req *req)
{
    mpi_state *s = comm->impl;
    mpi_req *m = (mpi_req *)req->impl;
    m->r[0] = m->r[1] = MPI_REQUEST_NULL;
    m->fence = true;
    MPI_Win_sync(s->window);
    int rc = MPI_Ibarrier(s->comm, &m->r[0]);
    return rc == MPI_SUCCESS ? AJ_OK : mpi_fail(comm, rc, "MPI_Ibarrier");
}

/* MPI_Comm_split has no nonblocking form: it blocks until every rank of
 * comm calls it.  method = hybrid calls it right after the opening
 * agreement, which every rank passed within the timeout. */
static aj_status mpi_split(aj_comm *comm, int color, int key, aj_comm *sub)
{
    mpi_state *s = calloc(1, sizeof *s);
    if (!s)
        return aj_fail(comm->ctx, AJ_ERR_OUT_OF_MEMORY, "MPI: split: out of memory");
    int rc = MPI_Comm_split(mpi_comm_of(comm), color, key, &s->comm);
    if (rc != MPI_SUCCESS) {
        free(s);
        return mpi_fail(comm, rc, "MPI_Comm_split");
    }
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    /* a sub-communicator exchanges messages: no shared segments (its
     * bytes are what aj_comm_bytes_sent and the hybrid formula count) */
    s->one_node = 0;
    MPI_Comm_rank(s->comm, &sub->rank);
    MPI_Comm_size(s->comm, &sub->size);
    sub->impl = s;
    sub->engine = comm->engine;
    return AJ_OK;
}

static void mpi_destroy(aj_comm *comm)
{
    mpi_state *s = comm->impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    /* MPI_Win_free waits for every rank: not with a peer that may be gone
     * (the window is then left to MPI) */
    if (!finalized && !s->broken)
        free_window(s);
    if (!finalized)
        MPI_Comm_free(&s->comm);
    free(s->segments);
    free(s);
}

static const aj_comm_engine mpi_engine = {
    .name = "mpi",
    .exchange_start = mpi_exchange_start,
    .exchange_test = mpi_exchange_test,
    .exchange_cancel = mpi_exchange_cancel,
    .allgather = mpi_allgather,
    .reduce_scatter_f32 = mpi_reduce_scatter_f32,
    .alltoallv = mpi_alltoallv,
    .shared_segments = mpi_shared_segments,
    .shared_fence_start = mpi_shared_fence_start,
    .split = mpi_split,
    .destroy = mpi_destroy,
};

aj_status aj_comm_mpi_parent(aj_comm *comm, const aj_comm_config *config, const char *needs,
                             MPI_Comm *parent)
{
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return aj_fail(comm->ctx, AJ_ERR_COMM, "aj_comm_create: MPI is %s; %s",
                       finalized ? "already finalized" : "not initialised", needs);
    *parent = config->mpi_comm ? *(const MPI_Comm *)config->mpi_comm : MPI_COMM_WORLD;
    if (*parent == MPI_COMM_NULL)
        return aj_fail(comm->ctx, AJ_ERR_INVALID_ARG,
                       "aj_comm_create: config->mpi_comm points to MPI_COMM_NULL");
    return AJ_OK;
}

aj_status aj_comm_mpi_open(aj_comm *comm, const aj_comm_config *config)
{
    MPI_Comm parent;
    aj_status st = aj_comm_mpi_parent(comm, config, "call MPI_Init before aj_comm_create and "
                                      "MPI_Finalize after aj_comm_destroy", &parent);
    if (st != AJ_OK)
        return st;
    mpi_state *s = calloc(1, sizeof *s);
    if (!s)
        return aj_fail(comm->ctx, AJ_ERR_OUT_OF_MEMORY, "aj_comm_create: out of memory");
    MPI_Comm_rank(parent, &comm->rank);
    MPI_Comm_size(parent, &comm->size);
    s->one_node = -1;
    s->segments = calloc((size_t)comm->size, sizeof *s->segments);
    if (!s->segments) {
        free(s);
        return aj_fail(comm->ctx, AJ_ERR_OUT_OF_MEMORY, "aj_comm_create: out of memory");
    }
    /* A private duplicate: the ring's tags never match the caller's
     * messages.  MPI_Comm_idup is collective, so it too waits under the
     * deadline. */
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_Comm_idup(parent, &s->comm, &r);
    st = rc == MPI_SUCCESS ? AJ_OK : mpi_fail(comm, rc, "MPI_Comm_idup");
    comm->impl = s;
    if (st == AJ_OK)
        st = mpi_wait_one(comm, &r, "MPI_Comm_idup (every rank must call aj_comm_create)");
    if (st != AJ_OK) {
        free(s->segments);
        free(s);
        comm->impl = NULL;
        return st;
    }
    MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
    comm->engine = &mpi_engine;
    return AJ_OK;
}
