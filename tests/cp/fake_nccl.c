/*
 * fake_nccl.c -- a stand-in libnccl.so.2 for machines without NCCL or a
 * GPU.  It exports what attnjit resolves, moves the bytes over MPI (the
 * tests run it under mpirun; "device" memory is host memory in the
 * stand-in libcuda), and records every call in a log the test reads back
 * through fake_nccl_log(), one line per call:
 *
 *   GetUniqueId
 *   CommInitRank nranks=2 rank=0 id=fake-nccl-id-1234
 *   GroupStart / GroupEnd
 *   Send count=64 type=0 peer=1 comm=own      (own: made by CommInitRank,
 *   Recv count=64 type=0 peer=1 comm=own       caller: fake_nccl_caller_comm)
 *   AllGather count=8 type=0 comm=own
 *   ReduceScatter count=4 type=7 op=0 comm=own
 *   CommAbort comm=own / CommDestroy comm=own
 *   captured                                     (a group or collective queued on
 *                                                a stream the stand-in libcuda is
 *                                                capturing: recorded as a host
 *                                                function the graph's replays run)
 *   CommSplit color=1 key=3 comm=own             (the new one: comm=split; its
 *                                                ranks are an MPI_Comm_split's)
 *
 * Built twice: fake_nccl_old (-DFAKE_NCCL_NO_SPLIT) is an NCCL older than
 * 2.18, without ncclCommSplit.
 * FAKE_NCCL_MODE: "init_fails" (ncclCommInitRank answers ncclSystemError),
 * "async_error" (ncclCommGetAsyncError reports ncclRemoteError),
 * "bad_comm" (ncclCommUserRank answers ncclInvalidArgument),
 * "nonblocking" (a communicator made with config.blocking = 0: ncclGroupEnd
 * and a collective answer ncclInProgress and their work is not queued
 * yet -- here, the bytes do not move -- until ncclCommGetAsyncError,
 * polled, has answered ncclInProgress twice and then ncclSuccess; logged
 * "GroupEnd in progress" and "GetAsyncError done").
 */
#include <dlfcn.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stand_in_log.h"

enum { SUCCESS = 0, IN_PROGRESS = 7, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4, INVALID_USAGE = 5, REMOTE_ERROR = 6 };
enum { OWN = 0x4f574e, CALLER = 0x43414c, SPLIT = 0x53504c };
enum { TAG = 30303, MAX_PENDING = 64 };   /* an all-to-all: 2 per peer */

typedef struct fake_comm {
    int magic, rank, nranks;
    MPI_Comm mpi;                 /* the ranks it spans */
} fake_comm;

typedef struct pending {
    int is_send, peer;
    void *buf;
    size_t bytes;
    MPI_Comm mpi;
} pending;

/* A group's sends and receives, as ncclGroupEnd runs them. */
typedef struct group_args {
    int n;
    pending p[MAX_PENDING];
} group_args;

static pending group[MAX_PENDING];
static int group_depth, num_pending;
static void *group_stream;        /* the stream of the group's last send or receive */
static fake_comm caller_comm = {CALLER, 0, 0, MPI_COMM_NULL};

static int mode_is(const char *m)
{
    const char *v = getenv("FAKE_NCCL_MODE");
    return v && strcmp(v, m) == 0;
}

/* Nonblocking mode: the work ncclGroupEnd or a collective left in
 * progress, done when ncclCommGetAsyncError has been polled enough. */
typedef struct deferred {
    int polls_left;
    void (*run)(const void *args);
    _Alignas(16) unsigned char args[sizeof(group_args)];
} deferred;

static deferred later;

/* Graph capture (the stand-in libcuda's, tests/fake_cuda): work queued on
 * a capturing stream is recorded as a host function that the graph's
 * replays run, where NCCL records its kernels.  The record is kept for
 * the process's life (a graph may be replayed until it ends). */
static void *cuda_symbol(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return h ? dlsym(h, name) : NULL;
}

static int stream_capturing(void *stream)
{
    int (*is_capturing)(void *, int *) = NULL;
    *(void **)&is_capturing = cuda_symbol("cuStreamIsCapturing");
    int status = 0;
    return stream && is_capturing && is_capturing(stream, &status) == 0 && status == 1;
}

static void run_recorded(void *user)
{
    const deferred *d = user;
    d->run(d->args);
}

static int record_in_graph(void *stream, void (*run)(const void *), const void *args,
                           size_t bytes)
{
    int (*host_func)(void *, void (*)(void *), void *) = NULL;
    *(void **)&host_func = cuda_symbol("cuLaunchHostFunc");
    deferred *d = calloc(1, sizeof *d);
    if (!host_func || !d || bytes > sizeof d->args) {
        free(d);
        return SYSTEM_ERROR;
    }
    d->run = run;
    memcpy(d->args, args, bytes);
    note("captured");
    return host_func(stream, run_recorded, d) == 0 ? SUCCESS : SYSTEM_ERROR;
}

static int defer(void (*run)(const void *), const void *args, size_t bytes, void *stream)
{
    if (stream_capturing(stream))
        return record_in_graph(stream, run, args, bytes);
    if (!mode_is("nonblocking")) {
        run(args);
        return SUCCESS;
    }
    later.polls_left = 2;
    later.run = run;
    memcpy(later.args, args, bytes);
    return IN_PROGRESS;
}

static const char *who(const fake_comm *c)
{
    return c->magic == OWN ? "own" : c->magic == CALLER ? "caller" : c->magic == SPLIT ? "split"
                                                                                        : "bad";
}

static size_t type_size(int type)
{
    return type == 7 ? 4 : 1;   /* ncclFloat32, else the byte types */
}

/* ---- what the test reads */

const char *fake_nccl_log(void);
const char *fake_nccl_log(void)
{
    return log_text;
}

void fake_nccl_log_clear(void);
void fake_nccl_log_clear(void)
{
    log_clear();
}

/* A communicator "the caller made", over MPI_COMM_WORLD. */
void *fake_nccl_caller_comm(void);
void *fake_nccl_caller_comm(void)
{
    MPI_Comm_rank(MPI_COMM_WORLD, &caller_comm.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &caller_comm.nranks);
    caller_comm.mpi = MPI_COMM_WORLD;
    return &caller_comm;
}

/* ---- the NCCL API */

int ncclGetVersion(int *version);
int ncclGetVersion(int *version)
{
    *version = 22000;
    return SUCCESS;
}

const char *ncclGetErrorString(int result);
const char *ncclGetErrorString(int result)
{
    return result == SYSTEM_ERROR ? "unhandled system error (fake)"
         : result == INVALID_ARGUMENT ? "invalid argument (fake)"
         : result == REMOTE_ERROR ? "remote process exited or there was a network error (fake)"
                                  : "fake NCCL error";
}

typedef struct { char internal[128]; } fake_id;

int ncclGetUniqueId(fake_id *id);
int ncclGetUniqueId(fake_id *id)
{
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "fake-nccl-id-%ld", (long)getpid());
    note("GetUniqueId");
    return SUCCESS;
}

int ncclCommInitRank(fake_comm **comm, int nranks, fake_id id, int rank);
int ncclCommInitRank(fake_comm **comm, int nranks, fake_id id, int rank)
{
    id.internal[sizeof id.internal - 1] = '\0';
    note("CommInitRank nranks=%d rank=%d id=%s", nranks, rank, id.internal);
    if (mode_is("init_fails"))
        return SYSTEM_ERROR;
    fake_comm *c = malloc(sizeof *c);
    if (!c)
        return SYSTEM_ERROR;
    *c = (fake_comm){OWN, rank, nranks, MPI_COMM_WORLD};
    *comm = c;
    return SUCCESS;
}

int ncclCommCount(const fake_comm *comm, int *count);
int ncclCommCount(const fake_comm *comm, int *count)
{
    *count = comm->nranks;
    return SUCCESS;
}

int ncclCommUserRank(const fake_comm *comm, int *rank);
int ncclCommUserRank(const fake_comm *comm, int *rank)
{
    if (mode_is("bad_comm"))
        return INVALID_ARGUMENT;
    *rank = comm->rank;
    return SUCCESS;
}

static int finish(fake_comm *comm, const char *what)
{
    note("%s comm=%s", what, who(comm));
    if (comm->magic == SPLIT)
        MPI_Comm_free(&comm->mpi);
    if (comm->magic == OWN || comm->magic == SPLIT)
        free(comm);
    return SUCCESS;
}

#ifndef FAKE_NCCL_NO_SPLIT
int ncclCommSplit(const fake_comm *comm, int color, int key, fake_comm **newcomm,
                  void *config);
int ncclCommSplit(const fake_comm *comm, int color, int key, fake_comm **newcomm,
                  void *config)
{
    note("CommSplit color=%d key=%d comm=%s%s", color, key, who(comm),
         config ? " config" : "");
    fake_comm *c = malloc(sizeof *c);
    if (!c)
        return SYSTEM_ERROR;
    c->magic = SPLIT;
    MPI_Comm_split(comm->mpi, color, key, &c->mpi);
    MPI_Comm_rank(c->mpi, &c->rank);
    MPI_Comm_size(c->mpi, &c->nranks);
    *newcomm = c;
    return SUCCESS;
}
#endif

int ncclCommDestroy(fake_comm *comm);
int ncclCommDestroy(fake_comm *comm)
{
    return finish(comm, "CommDestroy");
}

int ncclCommAbort(fake_comm *comm);
int ncclCommAbort(fake_comm *comm)
{
    return finish(comm, "CommAbort");
}

int ncclCommGetAsyncError(const fake_comm *comm, int *result);
int ncclCommGetAsyncError(const fake_comm *comm, int *result)
{
    (void)comm;
    if (later.run && --later.polls_left < 0) {
        later.run(later.args);
        later.run = NULL;
        note("GetAsyncError done");
    }
    *result = mode_is("async_error") ? REMOTE_ERROR : later.run ? IN_PROGRESS : SUCCESS;
    return SUCCESS;
}

int ncclGroupStart(void);
int ncclGroupStart(void)
{
    note("GroupStart");
    group_depth++;
    return SUCCESS;
}

/* The group's sends and receives, all at once, over MPI. */
static void run_group(const void *args);

int ncclGroupEnd(void);
int ncclGroupEnd(void)
{
    note("GroupEnd");
    if (group_depth == 0)
        return INVALID_USAGE;
    if (--group_depth > 0)
        return SUCCESS;
    group_args ga = {.n = num_pending};
    memcpy(ga.p, group, (size_t)num_pending * sizeof group[0]);
    num_pending = 0;
    int r = defer(run_group, &ga, sizeof ga, group_stream);
    if (r == IN_PROGRESS)
        note("GroupEnd in progress");
    return r;
}

static void run_group(const void *args)
{
    const group_args *g = args;
    MPI_Request r[MAX_PENDING];
    for (int i = 0; i < g->n; i++) {
        const pending *p = &g->p[i];
        if (p->is_send)
            MPI_Isend(p->buf, (int)p->bytes, MPI_BYTE, p->peer, TAG, p->mpi, &r[i]);
        else
            MPI_Irecv(p->buf, (int)p->bytes, MPI_BYTE, p->peer, TAG, p->mpi, &r[i]);
    }
    MPI_Waitall(g->n, r, MPI_STATUSES_IGNORE);
}

/* What NCCL reads and writes on `stream`, told to the stand-in libcuda's
 * stream-order model (tests/fake_cuda: fake_cuda_queue_access) when it is
 * the libcuda loaded. */
static void queued(void *stream, const void *buf, size_t bytes, int write, const char *what)
{
    if (stream_capturing(stream))
        return;   /* recorded, not done: a replay's work is the graph's order */
    void (*tell)(void *, const void *, size_t, int, const char *) = NULL;
    *(void **)&tell = cuda_symbol("fake_cuda_queue_access");
    if (tell)
        tell(stream, buf, bytes, write, what);
}

static int queue(int is_send, void *buf, size_t count, int type, int peer,
                 const fake_comm *comm, void *stream)
{
    group_stream = stream;
    note("%s count=%zu type=%d peer=%d comm=%s", is_send ? "Send" : "Recv", count, type, peer,
         who(comm));
    if (group_depth == 0 || num_pending == MAX_PENDING)
        return INVALID_USAGE;   /* the engine always groups its pair */
    group[num_pending++] = (pending){is_send, peer, buf, count * type_size(type), comm->mpi};
    return SUCCESS;
}

int ncclSend(const void *buf, size_t count, int type, int peer, const fake_comm *comm,
             void *stream);
int ncclSend(const void *buf, size_t count, int type, int peer, const fake_comm *comm,
             void *stream)
{
    queued(stream, buf, count * type_size(type), 0, "ncclSend");
    return queue(1, (void *)buf, count, type, peer, comm, stream);
}

int ncclRecv(void *buf, size_t count, int type, int peer, const fake_comm *comm, void *stream);
int ncclRecv(void *buf, size_t count, int type, int peer, const fake_comm *comm, void *stream)
{
    queued(stream, buf, count * type_size(type), 1, "ncclRecv");
    return queue(0, buf, count, type, peer, comm, stream);
}

typedef struct collective_args {
    const void *send;
    void *recv;
    size_t count;
    MPI_Comm mpi;
} collective_args;

static void run_allgather(const void *args)
{
    const collective_args *a = args;
    MPI_Allgather(a->send, (int)a->count, MPI_BYTE, a->recv, (int)a->count, MPI_BYTE, a->mpi);
}

static void run_reduce_scatter(const void *args)
{
    const collective_args *a = args;
    MPI_Reduce_scatter_block(a->send, a->recv, (int)a->count, MPI_FLOAT, MPI_SUM, a->mpi);
}

int ncclAllGather(const void *send, void *recv, size_t count, int type,
                  const fake_comm *comm, void *stream);
int ncclAllGather(const void *send, void *recv, size_t count, int type,
                  const fake_comm *comm, void *stream)
{
    note("AllGather count=%zu type=%d comm=%s", count, type, who(comm));
    queued(stream, send, count * type_size(type), 0, "ncclAllGather");
    queued(stream, recv, count * type_size(type) * (size_t)comm->nranks, 1, "ncclAllGather");
    const collective_args a = {send, recv, count * type_size(type), comm->mpi};
    return defer(run_allgather, &a, sizeof a, stream);
}

int ncclReduceScatter(const void *send, void *recv, size_t count, int type, int op,
                      const fake_comm *comm, void *stream);
int ncclReduceScatter(const void *send, void *recv, size_t count, int type, int op,
                      const fake_comm *comm, void *stream)
{
    note("ReduceScatter count=%zu type=%d op=%d comm=%s", count, type, op, who(comm));
    if (type != 7 || op != 0)
        return INVALID_USAGE;   /* the stand-in sums floats only */
    queued(stream, send, count * 4 * (size_t)comm->nranks, 0, "ncclReduceScatter");
    queued(stream, recv, count * 4, 1, "ncclReduceScatter");
    const collective_args a = {send, recv, count, comm->mpi};
    return defer(run_reduce_scatter, &a, sizeof a, stream);
}
