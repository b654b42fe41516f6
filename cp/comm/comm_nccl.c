/*
 * comm_nccl.c -- the NCCL engine: GPU ranks, NCCL point-to-point and
 * collectives on a comm stream, libnccl.so.2 loaded at run time.
 *
 * The library is looked for with dlopen, like the CUDA driver, so attnjit
 * builds and runs without it.  A method hands it device memory where it
 * keeps what travels there (comm->device_buffers: the ring on cuda ranks,
 * cp/ring.c), and NCCL sends and receives it in place; host buffers (the
 * methods that keep them on the host) it stages through a slot of pinned
 * host memory and device memory:
 *
 *   exchange_start                                       exchange_test
 *   send --memcpy--> pinned --HtoD--> dev.send            event done?
 *                    ncclGroupStart; ncclSend(dev.send, to);   |
 *                    ncclRecv(dev.recv, from); ncclGroupEnd    v
 *   recv <--memcpy-- pinned <--DtoH-- dev.recv; event  recv <-memcpy- pinned
 *
 * Everything after the first memcpy is queued on the comm stream and
 * returns at once: the copies are between pinned and device memory, so
 * the driver never waits for the stream inside a call (a copy from
 * pageable memory may), and a peer that never answers shows as an event
 * that never completes -- polled, under the comm's deadline, never waited
 * on.  Past the deadline the communicator is aborted (ncclCommAbort),
 * the only way to end NCCL kernels that wait for a dead peer.
 */
#include <assert.h>
#include <dlfcn.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"
#include "cp/comm/comm_mpi.h"
#include "cp/cp.h"
#include "runtime/runtime.h"

/* nccl.h's values (NCCL 2.x ABI). */
enum {
    NCCL_SUCCESS = 0,          /* ncclResult_t */
    NCCL_IN_PROGRESS = 7,
    NCCL_INT8 = 0,             /* ncclDataType_t */
    NCCL_FLOAT32 = 7,
    NCCL_SUM = 0,              /* ncclRedOp_t */
};

typedef struct ncclComm *nccl_comm_t;
typedef struct aj_nccl_config aj_nccl_config;   /* ncclConfig_t: only NULL is passed */
typedef struct aj_nccl_id {
    char internal[128];        /* NCCL_UNIQUE_ID_BYTES */
} aj_nccl_id;

/* X(field, "exported symbol", return, (parameters)) -- the NCCL entry
 * points the engine calls. */
#define AJ_NCCL_FUNCTIONS(X)                                                               \
    X(GetVersion, "ncclGetVersion", int, (int *version))                                   \
    X(GetUniqueId, "ncclGetUniqueId", int, (aj_nccl_id *id))                               \
    X(CommInitRank, "ncclCommInitRank", int,                                               \
      (nccl_comm_t *comm, int nranks, aj_nccl_id id, int rank))                            \
    X(CommCount, "ncclCommCount", int, (nccl_comm_t comm, int *count))                     \
    X(CommUserRank, "ncclCommUserRank", int, (nccl_comm_t comm, int *rank))                \
    X(CommDestroy, "ncclCommDestroy", int, (nccl_comm_t comm))                             \
    X(CommAbort, "ncclCommAbort", int, (nccl_comm_t comm))                                 \
    X(CommGetAsyncError, "ncclCommGetAsyncError", int, (nccl_comm_t comm, int *result))    \
    X(GetErrorString, "ncclGetErrorString", const char *, (int result))                    \
    X(GroupStart, "ncclGroupStart", int, (void))                                           \
    X(GroupEnd, "ncclGroupEnd", int, (void))                                               \
    X(Send, "ncclSend", int, (const void *buf, size_t count, int type, int peer,           \
                              nccl_comm_t comm, CUstream stream))                          \
    X(Recv, "ncclRecv", int, (void *buf, size_t count, int type, int peer,                 \
                              nccl_comm_t comm, CUstream stream))                          \
    X(AllGather, "ncclAllGather", int, (const void *send, void *recv, size_t count,        \
                                        int type, nccl_comm_t comm, CUstream stream))      \
    X(ReduceScatter, "ncclReduceScatter", int,                                             \
      (const void *send, void *recv, size_t count, int type, int op, nccl_comm_t comm,     \
       CUstream stream))

/* The same for entry points newer than the oldest NCCL the engine runs
 * on: NULL when the library lacks them, and only what needs them fails
 * (ncclCommSplit: NCCL 2.18). */
#define AJ_NCCL_OPTIONAL_FUNCTIONS(X)                                                      \
    X(CommSplit, "ncclCommSplit", int,                                                     \
      (nccl_comm_t comm, int color, int key, nccl_comm_t *newcomm, aj_nccl_config *config))

typedef struct aj_nccl {
#define AJ_NCCL_FIELD(field, sym, ret, params) ret (*field) params;
    AJ_NCCL_FUNCTIONS(AJ_NCCL_FIELD)
    AJ_NCCL_OPTIONAL_FUNCTIONS(AJ_NCCL_FIELD)
#undef AJ_NCCL_FIELD
} aj_nccl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static aj_nccl nccl;
static int nccl_ok;
static char nccl_error[512];

/* $AJ_NCCL_LIBRARY names another library to load (a path, or a name the
 * loader searches for), e.g. a second NCCL install. */
static void load_nccl(void)
{
    const char *name = getenv("AJ_NCCL_LIBRARY");
    if (!name || !*name)
        name = "libnccl.so.2";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nccl_error, sizeof nccl_error,
                 "NCCL (%s) cannot be loaded (%s); install NCCL for GPU rings, "
                 "or use the MPI engine on CPU ranks", name, dlerror());
        return;
    }
#define AJ_NCCL_RESOLVE(field, sym, ret, params)                                          \
    {                                                                                     \
        void *p = dlsym(h, sym);                                                          \
        if (!p) {                                                                         \
            snprintf(nccl_error, sizeof nccl_error, "%s lacks %s; it is too old for "     \
                     "attnjit", name, sym);                                               \
            return;                                                                       \
        }                                                                                 \
        memcpy(&nccl.field, &p, sizeof p);                                                \
    }
    AJ_NCCL_FUNCTIONS(AJ_NCCL_RESOLVE)
#undef AJ_NCCL_RESOLVE
#define AJ_NCCL_RESOLVE_OPTIONAL(field, sym, ret, params) \
    {                                                     \
        void *p = dlsym(h, sym);                          \
        memcpy(&nccl.field, &p, sizeof p);                \
    }
    AJ_NCCL_OPTIONAL_FUNCTIONS(AJ_NCCL_RESOLVE_OPTIONAL)
#undef AJ_NCCL_RESOLVE_OPTIONAL
    nccl_ok = 1;   /* the handle stays open for the life of the process */
}

/* One transfer's staging: pinned host memory and device memory for what
 * goes out and what comes in, and the event after its last copy; and
 * where the NCCL calls of the transfer in it read and write (send_at,
 * recv_at): the staging buffers, or the caller's device memory. */
typedef struct nccl_slot {
    bool busy;
    CUevent done;
    CUevent ready;                        /* the caller's after_stream, recorded */
    void *host_send, *host_recv;          /* pinned */
    CUdeviceptr dev_send, dev_recv;
    size_t send_cap, recv_cap;
    CUdeviceptr send_at, recv_at;
} nccl_slot;

/* The ring keeps at most two exchanges in flight (K/V and dK/dV); a
 * collective has a slot of its own. */
enum { NCCL_EXCHANGE_SLOTS = 2, NCCL_SLOTS = NCCL_EXCHANGE_SLOTS + 1 };

typedef struct nccl_state {
    const aj_cuda *cu;
    CUcontext cuctx;                      /* NULL: whatever is current */
    nccl_comm_t comm;
    CUstream stream;
    bool owns_comm, owns_stream;
    _Atomic bool aborted;                 /* the watchdog's thread may abort too */
    nccl_slot slots[NCCL_SLOTS];
} nccl_state;

/* An exchange in flight, in aj_comm_req.impl: its slot, and where the
 * bytes go when it completes.  Once it has completed the slot is free for
 * the next exchange, so the request lets go of it (slot = -1): testing or
 * cancelling it again must not touch that exchange's slot. */
typedef struct nccl_req {
    int slot;   /* -1: completed */
    void *recv;
    size_t bytes;
} nccl_req;

static_assert(sizeof(nccl_req) <= sizeof(((aj_comm_req *)0)->impl),
              "aj_comm_req.impl must hold an nccl_req");

static nccl_state *state_of(aj_comm *comm)
{
    return comm->impl;
}

/* The engine's CUDA calls run in the device's context. */
static aj_status push_ctx(aj_comm *comm)
{
    nccl_state *s = state_of(comm);
    if (!s->cuctx)
        return AJ_OK;
    CUresult r = s->cu->CtxPushCurrent(s->cuctx);
    return r == AJ_CUDA_SUCCESS ? AJ_OK : aj_cuda_fail(comm->ctx, s->cu, r, "cuCtxPushCurrent");
}

static void pop_ctx(aj_comm *comm)
{
    nccl_state *s = state_of(comm);
    CUcontext popped;
    if (s->cuctx)
        s->cu->CtxPopCurrent(&popped);
}

static const char *nccl_text(int result)
{
    const char *text = nccl.GetErrorString(result);
    return text ? text : "unknown NCCL error";
}

/* Ends the communicator's work after a failure: NCCL kernels waiting for a
 * dead peer stop only when it is aborted.  Later calls answer AJ_ERR_COMM. */
static void abort_comm(nccl_state *s)
{
    if (!atomic_exchange(&s->aborted, true))   /* once, whichever thread comes first */
        nccl.CommAbort(s->comm);
}

static aj_status nccl_fail(aj_comm *comm, int result, const char *what)
{
    abort_comm(state_of(comm));
    return aj_fail(comm->ctx, AJ_ERR_COMM, "NCCL: rank %d: %s failed: %s", comm->rank, what,
                   nccl_text(result));
}

static aj_status check_usable(aj_comm *comm, const char *what)
{
    if (!state_of(comm)->aborted)
        return AJ_OK;
    return aj_fail(comm->ctx, AJ_ERR_COMM, "NCCL: rank %d: %s: the communicator was aborted "
                   "after an earlier failure; destroy the comm and end the job", comm->rank,
                   what);
}

static void free_buffers(const aj_cuda *cu, nccl_slot *slot)
{
    if (slot->host_send)
        cu->MemFreeHost(slot->host_send);
    if (slot->host_recv)
        cu->MemFreeHost(slot->host_recv);
    if (slot->dev_send)
        cu->MemFree(slot->dev_send);
    if (slot->dev_recv)
        cu->MemFree(slot->dev_recv);
    slot->host_send = slot->host_recv = NULL;
    slot->dev_send = slot->dev_recv = 0;
    slot->send_cap = slot->recv_cap = 0;
}

/* Grows a slot to hold `send` and `recv` bytes (in the pushed context);
 * neither side shrinks, so a slot that alternates stays allocated.  Not
 * `staged` (the caller's device memory): only the slot's event. */
static aj_status reserve(aj_comm *comm, nccl_slot *slot, bool staged, size_t send, size_t recv)
{
    nccl_state *s = state_of(comm);
    const aj_cuda *cu = s->cu;
    aj_status st = AJ_OK;
    if (!slot->done)
        AJ_CU_TRY(comm->ctx, cu, cu->EventCreate(&slot->done, AJ_CU_EVENT_DISABLE_TIMING),
                  "NCCL staging: cuEventCreate");
    if (!slot->ready)
        AJ_CU_TRY(comm->ctx, cu, cu->EventCreate(&slot->ready, AJ_CU_EVENT_DISABLE_TIMING),
                  "NCCL staging: cuEventCreate");
    if (!staged)   /* the caller's device memory: the event only */
        return AJ_OK;
    /* the driver refuses 0-byte allocations: an empty transfer gets 1 */
    send += send == 0;
    recv += recv == 0;
    if (send <= slot->send_cap && recv <= slot->recv_cap)
        return AJ_OK;
    send = send > slot->send_cap ? send : slot->send_cap;
    recv = recv > slot->recv_cap ? recv : slot->recv_cap;
    free_buffers(cu, slot);
    AJ_CU_TRY(comm->ctx, cu, cu->MemAllocHost(&slot->host_send, send),
              "NCCL staging: cuMemAllocHost");
    AJ_CU_TRY(comm->ctx, cu, cu->MemAllocHost(&slot->host_recv, recv),
              "NCCL staging: cuMemAllocHost");
    AJ_CU_TRY(comm->ctx, cu, cu->MemAlloc(&slot->dev_send, send), "NCCL staging: cuMemAlloc");
    AJ_CU_TRY(comm->ctx, cu, cu->MemAlloc(&slot->dev_recv, recv), "NCCL staging: cuMemAlloc");
    slot->send_cap = send;
    slot->recv_cap = recv;
done:
    if (st != AJ_OK)
        free_buffers(cu, slot);
    return st;
}

/* A nonblocking communicator (the caller's, made with config.blocking =
 * 0) answers ncclInProgress from ncclGroupEnd and the collectives: their
 * work is not on the stream yet, so nothing that depends on it may be
 * queued until ncclCommGetAsyncError stops answering ncclInProgress
 * (nccl.h).  Polled under the comm's deadline, as every wait is. */
static aj_status wait_in_progress(aj_comm *comm, const char *what)
{
    nccl_state *s = state_of(comm);
    const double start = aj_now();
    for (;;) {
        int async = NCCL_SUCCESS;
        int r = nccl.CommGetAsyncError(s->comm, &async);
        if (r != NCCL_SUCCESS)
            return nccl_fail(comm, r, "ncclCommGetAsyncError");
        if (async == NCCL_SUCCESS)
            return AJ_OK;
        if (async != NCCL_IN_PROGRESS)
            return nccl_fail(comm, async, what);
        if (aj_now() - start > comm->timeout_s) {
            abort_comm(s);
            return aj_fail(comm->ctx, AJ_ERR_COMM, "NCCL: rank %d: %s stayed in progress "
                           "(ncclInProgress) past the comm timeout of %g s", comm->rank, what,
                           comm->timeout_s);
        }
        aj_comm_pause();
    }
}

/* Queues: pinned send -> device, the NCCL calls `post` makes, device ->
 * pinned recv, the event.  `bytes` were already copied into host_send.
 * On the caller's device memory (comm->device_buffers: `send` and `recv`
 * are device pointers) only the NCCL calls and the event. */
typedef int (*post_fn)(nccl_state *s, nccl_slot *slot, const void *args);

static aj_status enqueue(aj_comm *comm, nccl_slot *slot, const void *send, size_t send_bytes,
                         void *recv, size_t recv_bytes, post_fn post, const void *args,
                         const char *what)
{
    nccl_state *s = state_of(comm);
    const aj_cuda *cu = s->cu;
    const bool staged = !comm->device_buffers;
    aj_status st = AJ_OK;
    slot->send_at = staged ? slot->dev_send : (CUdeviceptr)(uintptr_t)send;
    slot->recv_at = staged ? slot->dev_recv : (CUdeviceptr)(uintptr_t)recv;
    if (!staged && comm->after_stream) {   /* after the caller's work on its buffers */
        AJ_CU_TRY(comm->ctx, cu, cu->EventRecord(slot->ready, (CUstream)comm->after_stream),
                  "NCCL: cuEventRecord");
        AJ_CU_TRY(comm->ctx, cu, cu->StreamWaitEvent(s->stream, slot->ready, 0),
                  "NCCL: cuStreamWaitEvent");
    }
    if (staged)
        AJ_CU_TRY(comm->ctx, cu, cu->MemcpyHtoDAsync(slot->dev_send, slot->host_send,
                                                     send_bytes, s->stream),
                  "NCCL staging: cuMemcpyHtoDAsync");
    int r = post(s, slot, args);
    if (r != NCCL_SUCCESS && r != NCCL_IN_PROGRESS)
        return nccl_fail(comm, r, what);
    if (r == NCCL_IN_PROGRESS)
        AJ_TRY(wait_in_progress(comm, what));
    if (staged)
        AJ_CU_TRY(comm->ctx, cu, cu->MemcpyDtoHAsync(slot->host_recv, slot->dev_recv,
                                                     recv_bytes, s->stream),
                  "NCCL staging: cuMemcpyDtoHAsync");
    AJ_CU_TRY(comm->ctx, cu, cu->EventRecord(slot->done, s->stream),
              "NCCL staging: cuEventRecord");
done:
    return st;
}

/* Whether the slot's work is done; an error NCCL reports on the way
 * aborts the communicator. */
static aj_status poll_slot(aj_comm *comm, nccl_slot *slot, const char *what, bool *done)
{
    nccl_state *s = state_of(comm);
    int async = NCCL_SUCCESS;
    int r = nccl.CommGetAsyncError(s->comm, &async);
    if (r != NCCL_SUCCESS)
        return nccl_fail(comm, r, "ncclCommGetAsyncError");
    if (async != NCCL_SUCCESS && async != NCCL_IN_PROGRESS)
        return nccl_fail(comm, async, what);
    CUresult q = s->cu->EventQuery(slot->done);
    if (q != AJ_CUDA_SUCCESS && q != AJ_CUDA_ERROR_NOT_READY) {
        abort_comm(s);
        return aj_cuda_fail(comm->ctx, s->cu, q, "NCCL staging: cuEventQuery");
    }
    *done = q == AJ_CUDA_SUCCESS;
    return AJ_OK;
}

/* ------------------------------------------------------------ exchange */

typedef struct exchange_args {
    size_t bytes;
    int to, from;
} exchange_args;

static int post_exchange(nccl_state *s, nccl_slot *slot, const void *args)
{
    const exchange_args *a = args;
    int r = nccl.GroupStart();
    if (r != NCCL_SUCCESS)
        return r;
    /* a negative peer: that side of the exchange is skipped */
    int send = a->to < 0 ? NCCL_SUCCESS
                         : nccl.Send((const void *)(uintptr_t)slot->send_at, a->bytes,
                                     NCCL_INT8, a->to, s->comm, s->stream);
    int recv = send != NCCL_SUCCESS || a->from < 0
                   ? send
                   : nccl.Recv((void *)(uintptr_t)slot->recv_at, a->bytes, NCCL_INT8,
                               a->from, s->comm, s->stream);
    /* the group is closed whatever happened inside it */
    int end = nccl.GroupEnd();
    return recv != NCCL_SUCCESS ? recv : end;
}

static aj_status nccl_exchange_start(aj_comm *comm, const void *send, void *recv,
                                     size_t bytes, int to, int from, int tag,
                                     aj_comm_req *req)
{
    (void)tag;   /* NCCL matches by order, which every rank keeps */
    nccl_state *s = state_of(comm);
    aj_status st = check_usable(comm, "an exchange");
    if (st != AJ_OK)
        return st;
    int index = 0;
    while (index < NCCL_EXCHANGE_SLOTS && s->slots[index].busy)
        index++;
    if (index == NCCL_EXCHANGE_SLOTS)
        return aj_fail(comm->ctx, AJ_ERR_INTERNAL, "NCCL: rank %d: more than %d exchanges in "
                       "flight", comm->rank, NCCL_EXCHANGE_SLOTS);
    nccl_slot *slot = &s->slots[index];
    const bool staged = !comm->device_buffers;
    AJ_TRY(push_ctx(comm));
    st = reserve(comm, slot, staged, bytes, bytes);
    if (st == AJ_OK) {
        if (staged)
            memcpy(slot->host_send, send, bytes);
        const exchange_args a = {bytes, to, from};
        st = enqueue(comm, slot, send, bytes, recv, bytes, post_exchange, &a,
                     "an exchange (ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd)");
    }
    pop_ctx(comm);
    if (st == AJ_OK) {
        if (to >= 0 && to != comm->rank)
            aj_comm_count_sent(comm, bytes);
        slot->busy = true;
        /* where the bytes go when it completes: NULL, nothing to copy (nothing
         * comes, or NCCL received them in place) */
        const nccl_req r = {index, from < 0 || !staged ? NULL : recv, bytes};
        memcpy(req->impl, &r, sizeof r);
    }
done:
    return st;
}

static nccl_req req_of(const aj_comm_req *req)
{
    nccl_req r;
    memcpy(&r, req->impl, sizeof r);
    return r;
}

/* The exchange `r` of req is done for its caller: its slot is free for
 * the next one, and the request lets go of it. */
static void release(nccl_state *s, aj_comm_req *req, nccl_req r)
{
    s->slots[r.slot].busy = false;
    r.slot = -1;
    memcpy(req->impl, &r, sizeof r);
}

static aj_status nccl_exchange_test(aj_comm *comm, aj_comm_req *req, bool *done)
{
    nccl_req r = req_of(req);
    *done = r.slot < 0;
    if (*done)
        return AJ_OK;
    nccl_slot *slot = &state_of(comm)->slots[r.slot];
    aj_status st = check_usable(comm, "an exchange");
    if (st != AJ_OK)
        return st;
    AJ_TRY(push_ctx(comm));
    st = poll_slot(comm, slot, "an exchange", done);
    pop_ctx(comm);
    if (st == AJ_OK && *done) {
        if (r.recv)
            memcpy(r.recv, slot->host_recv, r.bytes);
        release(state_of(comm), req, r);
    }
done:
    return st;
}

static void nccl_exchange_cancel(aj_comm *comm, aj_comm_req *req)
{
    nccl_state *s = state_of(comm);
    if (req_of(req).slot < 0)
        return;   /* completed: its slot may be another exchange's now */
    nccl_slot *slot = &s->slots[req_of(req).slot];
    /* Done already: nothing to stop.  Otherwise the NCCL kernels wait for
     * a peer that is not coming, and only an abort ends them. */
    if (!s->aborted && push_ctx(comm) == AJ_OK) {
        CUresult q = s->cu->EventQuery(slot->done);
        pop_ctx(comm);
        if (q != AJ_CUDA_SUCCESS)
            abort_comm(s);
    } else {
        abort_comm(s);
    }
    slot->busy = false;
}

/* Work queued on `stream` from now on waits, on the device, for the
 * slot's transfer (in the pushed context).  The wait takes the event as
 * recorded now: the slot may record it again for its next transfer. */
static aj_status join_on_device(aj_comm *comm, nccl_slot *slot, void *stream)
{
    nccl_state *s = state_of(comm);
    CUresult q = s->cu->StreamWaitEvent((CUstream)stream, slot->done, 0);
    if (q == AJ_CUDA_SUCCESS)
        return AJ_OK;
    abort_comm(s);
    return aj_cuda_fail(comm->ctx, s->cu, q, "NCCL: cuStreamWaitEvent");
}

static aj_status nccl_exchange_join(aj_comm *comm, aj_comm_req *req, void *stream)
{
    nccl_req r = req_of(req);
    if (r.slot < 0)
        return AJ_OK;
    nccl_state *s = state_of(comm);
    aj_status st = check_usable(comm, "an exchange");
    if (st != AJ_OK)
        return st;
    AJ_TRY(push_ctx(comm));
    st = join_on_device(comm, &s->slots[r.slot], stream);
    pop_ctx(comm);
    if (st == AJ_OK)
        release(s, req, r);
done:
    return st;
}

static void nccl_abort(aj_comm *comm)
{
    abort_comm(state_of(comm));
}

static aj_status nccl_async_error(aj_comm *comm, char *msg, size_t cap)
{
    nccl_state *s = state_of(comm);
    if (atomic_load(&s->aborted))
        return AJ_OK;   /* what aborted it has said why */
    int async = NCCL_SUCCESS;
    int r = nccl.CommGetAsyncError(s->comm, &async);
    if (r == NCCL_SUCCESS && (async == NCCL_SUCCESS || async == NCCL_IN_PROGRESS))
        return AJ_OK;
    snprintf(msg, cap, "NCCL: rank %d: %s", comm->rank,
             r != NCCL_SUCCESS ? "ncclCommGetAsyncError failed" : nccl_text(async));
    return AJ_ERR_COMM;
}

/* ---------------------------------------------------------- collectives */

/* Copies `send_bytes` in, runs `post`, waits under the deadline, copies
 * `recv_bytes` out; or, on the caller's device buffers with an
 * after_stream, runs `post` after that stream's work and makes the stream
 * wait for it on the device (the host waits for nothing). */
static aj_status collective(aj_comm *comm, const void *send, size_t send_bytes, void *recv,
                            size_t recv_bytes, post_fn post, const void *args,
                            const char *what)
{
    nccl_state *s = state_of(comm);
    nccl_slot *slot = &s->slots[NCCL_EXCHANGE_SLOTS];
    aj_status st = check_usable(comm, what);
    if (st != AJ_OK)
        return st;
    const bool staged = !comm->device_buffers;
    AJ_TRY(push_ctx(comm));
    st = reserve(comm, slot, staged, send_bytes, recv_bytes);
    if (st == AJ_OK) {
        if (staged)
            memcpy(slot->host_send, send, send_bytes);
        st = enqueue(comm, slot, send, send_bytes, recv, recv_bytes, post, args, what);
    }
    if (st == AJ_OK && !staged && comm->after_stream) {
        /* the caller's device buffers: its stream waits for the result on
         * the device, as for a joined exchange; the host goes on */
        st = join_on_device(comm, slot, comm->after_stream);
        pop_ctx(comm);
        return st;
    }
    const double start = aj_now();
    bool finished = false;
    while (st == AJ_OK && !finished) {
        st = poll_slot(comm, slot, what, &finished);
        if (st == AJ_OK && !finished) {
            if (aj_now() - start > comm->timeout_s) {
                abort_comm(s);
                st = aj_fail(comm->ctx, AJ_ERR_COMM, "NCCL: rank %d: %s (%zu bytes sent, "
                             "%zu received, %d ranks) got no answer within the comm timeout "
                             "of %g s; a peer has stopped or died", comm->rank, what,
                             send_bytes, recv_bytes, comm->size, comm->timeout_s);
                break;
            }
            aj_comm_pause();
        }
    }
    pop_ctx(comm);
    if (st == AJ_OK && staged)
        memcpy(recv, slot->host_recv, recv_bytes);
done:
    return st;
}

static int post_allgather(nccl_state *s, nccl_slot *slot, const void *args)
{
    return nccl.AllGather((const void *)(uintptr_t)slot->send_at,
                          (void *)(uintptr_t)slot->recv_at, *(const size_t *)args, NCCL_INT8,
                          s->comm, s->stream);
}

static aj_status nccl_allgather(aj_comm *comm, const void *send, void *recv, size_t bytes)
{
    aj_comm_count_collective(comm, bytes);
    return collective(comm, send, bytes, recv, bytes * (size_t)comm->size, post_allgather,
                      &bytes, "ncclAllGather");
}

static int post_reduce_scatter(nccl_state *s, nccl_slot *slot, const void *args)
{
    return nccl.ReduceScatter((const void *)(uintptr_t)slot->send_at,
                              (void *)(uintptr_t)slot->recv_at, *(const size_t *)args,
                              NCCL_FLOAT32, NCCL_SUM, s->comm, s->stream);
}

static aj_status nccl_reduce_scatter_f32(aj_comm *comm, const float *send, float *recv,
                                         size_t count)
{
    aj_comm_count_collective(comm, count * sizeof(float));
    return collective(comm, send, count * sizeof(float) * (size_t)comm->size, recv,
                      count * sizeof(float), post_reduce_scatter, &count,
                      "ncclReduceScatter");
}

/* An all-to-all is a group of a send and a receive per peer (NCCL has no
 * all-to-all of its own), on the staged buffers at the same offsets. */
typedef struct alltoallv_args {
    int size;
    const size_t *send_bytes, *send_off, *recv_bytes, *recv_off;
} alltoallv_args;

static int post_alltoallv(nccl_state *s, nccl_slot *slot, const void *args)
{
    const alltoallv_args *a = args;
    int r = nccl.GroupStart();
    if (r != NCCL_SUCCESS)
        return r;
    for (int peer = 0; peer < a->size && r == NCCL_SUCCESS; peer++) {
        r = nccl.Send((const void *)(uintptr_t)(slot->send_at + a->send_off[peer]),
                      a->send_bytes[peer], NCCL_INT8, peer, s->comm, s->stream);
        if (r == NCCL_SUCCESS)
            r = nccl.Recv((void *)(uintptr_t)(slot->recv_at + a->recv_off[peer]),
                          a->recv_bytes[peer], NCCL_INT8, peer, s->comm, s->stream);
    }
    /* the group is closed whatever happened inside it */
    int end = nccl.GroupEnd();
    return r != NCCL_SUCCESS ? r : end;
}

/* The bytes an all-to-all's side spans: its furthest part's end. */
static size_t span(int size, const size_t *bytes, const size_t *off)
{
    size_t end = 0;
    for (int i = 0; i < size; i++)
        if (off[i] + bytes[i] > end)
            end = off[i] + bytes[i];
    return end;
}

static aj_status nccl_alltoallv(aj_comm *comm, const void *send, const size_t *send_bytes,
                                const size_t *send_off, void *recv, const size_t *recv_bytes,
                                const size_t *recv_off)
{
    const alltoallv_args a = {comm->size, send_bytes, send_off, recv_bytes, recv_off};
    aj_comm_count_alltoall(comm, send_bytes);
    return collective(comm, send, span(comm->size, send_bytes, send_off), recv,
                      span(comm->size, recv_bytes, recv_off), post_alltoallv, &a,
                      "an all-to-all (ncclGroupStart/ncclSend/ncclRecv per peer/ncclGroupEnd)");
}

/* --------------------------------------------------------------- life */

/* ncclCommSplit with a NULL config: the new communicator inherits the
 * parent's (blocking or not); it runs on the parent's stream, with slots
 * of its own. */
static aj_status nccl_split(aj_comm *comm, int color, int key, aj_comm *sub)
{
    nccl_state *s = state_of(comm);
    if (!nccl.CommSplit) {
        int version = 0;
        nccl.GetVersion(&version);
        return aj_fail(comm->ctx, AJ_ERR_UNSUPPORTED, "NCCL: rank %d: splitting the "
                       "communicator needs ncclCommSplit (NCCL 2.18 or later), which the "
                       "loaded libnccl (version code %d) lacks", comm->rank, version);
    }
    aj_status st = check_usable(comm, "ncclCommSplit");
    if (st != AJ_OK)
        return st;
    nccl_state *n = calloc(1, sizeof *n);
    if (!n)
        return aj_fail(comm->ctx, AJ_ERR_OUT_OF_MEMORY, "NCCL: split: out of memory");
    n->cu = s->cu;
    n->cuctx = s->cuctx;
    n->stream = s->stream;
    AJ_TRY(push_ctx(comm));
    int r = nccl.CommSplit(s->comm, color, key, &n->comm, NULL);
    sub->impl = n;   /* the new communicator's waits and failures are its own */
    sub->rank = comm->rank;
    if (r == NCCL_IN_PROGRESS)   /* a nonblocking parent: so is the new one */
        st = wait_in_progress(sub, "ncclCommSplit");
    else if (r != NCCL_SUCCESS)
        st = aj_fail(comm->ctx, AJ_ERR_COMM, "NCCL: rank %d: ncclCommSplit (color %d) "
                     "failed: %s", comm->rank, color, nccl_text(r));
    if (st == AJ_OK) {
        r = nccl.CommUserRank(n->comm, &sub->rank);
        if (r == NCCL_SUCCESS)
            r = nccl.CommCount(n->comm, &sub->size);
        if (r != NCCL_SUCCESS)
            st = nccl_fail(sub, r, "ncclCommUserRank on the split communicator");
    }
    pop_ctx(comm);
done:
    if (st != AJ_OK) {
        sub->impl = NULL;
        free(n);
        return st;
    }
    n->owns_comm = true;
    sub->impl = n;
    sub->engine = comm->engine;
    return AJ_OK;
}

static void nccl_destroy(aj_comm *comm)
{
    nccl_state *s = state_of(comm);
    const bool in_context = push_ctx(comm) == AJ_OK;
    if (s->owns_comm && !s->aborted)
        nccl.CommDestroy(s->comm);
    if (in_context) {
        for (int i = 0; i < NCCL_SLOTS; i++) {
            free_buffers(s->cu, &s->slots[i]);
            if (s->slots[i].done)
                s->cu->EventDestroy(s->slots[i].done);
            if (s->slots[i].ready)
                s->cu->EventDestroy(s->slots[i].ready);
        }
        if (s->owns_stream)
            s->cu->StreamDestroy(s->stream);
        pop_ctx(comm);
    }
    free(s);
}

static const aj_comm_engine nccl_engine = {
    .name = "nccl",
    .moves_device_memory = true,
    .exchange_start = nccl_exchange_start,
    .exchange_test = nccl_exchange_test,
    .exchange_cancel = nccl_exchange_cancel,
    .exchange_join = nccl_exchange_join,
    .abort = nccl_abort,
    .async_error = nccl_async_error,
    .allgather = nccl_allgather,
    .reduce_scatter_f32 = nccl_reduce_scatter_f32,
    .alltoallv = nccl_alltoallv,
    .split = nccl_split,
    .destroy = nccl_destroy,
};

/* Rank 0's ncclGetUniqueId, broadcast over `parent` under the deadline. */
static aj_status share_unique_id(aj_comm *comm, MPI_Comm parent, aj_nccl_id *id)
{
    int r = comm->rank == 0 ? nccl.GetUniqueId(id) : NCCL_SUCCESS;
    if (r != NCCL_SUCCESS)
        return aj_fail(comm->ctx, AJ_ERR_COMM, "aj_comm_create: ncclGetUniqueId failed: %s",
                       nccl_text(r));
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Ibcast(id, (int)sizeof *id, MPI_BYTE, 0, parent, &request) != MPI_SUCCESS)
        return aj_fail(comm->ctx, AJ_ERR_COMM, "aj_comm_create: rank %d: MPI_Ibcast of the "
                       "NCCL unique id failed", comm->rank);
    const double start = aj_now();
    for (;;) {
        int flag = 0;
        if (MPI_Test(&request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return aj_fail(comm->ctx, AJ_ERR_COMM, "aj_comm_create: rank %d: MPI_Ibcast of "
                           "the NCCL unique id failed", comm->rank);
        if (flag)
            return AJ_OK;
        if (aj_now() - start > comm->timeout_s)
            return aj_fail(comm->ctx, AJ_ERR_COMM, "aj_comm_create: rank %d: the NCCL unique "
                           "id from rank 0 did not come within the comm timeout of %g s "
                           "(every rank must call aj_comm_create)", comm->rank,
                           comm->timeout_s);
        aj_comm_pause();
    }
}

/* The communicator: the caller's, or one made over MPI. */
static aj_status open_comm(aj_comm *comm, const aj_comm_config *config, nccl_state *s)
{
    if (config->nccl_comm) {
        s->comm = config->nccl_comm;
        int r = nccl.CommUserRank(s->comm, &comm->rank);
        if (r == NCCL_SUCCESS)
            r = nccl.CommCount(s->comm, &comm->size);
        if (r != NCCL_SUCCESS)
            return aj_fail(comm->ctx, AJ_ERR_INVALID_ARG, "aj_comm_create: config->nccl_comm "
                           "is not a usable NCCL communicator: %s", nccl_text(r));
        return AJ_OK;
    }
    MPI_Comm parent;
    aj_status st = aj_comm_mpi_parent(comm, config, "the NCCL engine broadcasts its unique id "
                                      "over MPI (or pass config->nccl_comm)", &parent);
    if (st != AJ_OK)
        return st;
    MPI_Comm_rank(parent, &comm->rank);
    MPI_Comm_size(parent, &comm->size);
    aj_nccl_id id;
    memset(&id, 0, sizeof id);
    st = share_unique_id(comm, parent, &id);
    if (st != AJ_OK)
        return st;
    /* Blocks in NCCL's own bootstrap until every rank has joined (NCCL's
     * socket timeouts bound it, not comm->timeout_s). */
    int r = nccl.CommInitRank(&s->comm, comm->size, id, comm->rank);
    if (r != NCCL_SUCCESS)
        return aj_fail(comm->ctx, AJ_ERR_COMM, "aj_comm_create: rank %d: ncclCommInitRank "
                       "(%d ranks) failed: %s", comm->rank, comm->size, nccl_text(r));
    s->owns_comm = true;
    return AJ_OK;
}

aj_status aj_comm_nccl_open_on(aj_comm *comm, const aj_comm_config *config,
                               const aj_cuda *cu, void *cuctx)
{
    pthread_once(&load_once, load_nccl);
    if (!nccl_ok)
        return aj_fail(comm->ctx, AJ_ERR_NO_DEVICE, "aj_comm_create: %s", nccl_error);
    nccl_state *s = calloc(1, sizeof *s);
    if (!s)
        return aj_fail(comm->ctx, AJ_ERR_OUT_OF_MEMORY, "aj_comm_create: out of memory");
    s->cu = cu;
    s->cuctx = cuctx;
    comm->impl = s;
    aj_status st = AJ_OK;
    AJ_TRY(push_ctx(comm));
    if (config->stream) {
        s->stream = config->stream;
    } else {
        CUresult r = cu->StreamCreate(&s->stream, AJ_CU_STREAM_NON_BLOCKING);
        if (r == AJ_CUDA_SUCCESS)
            s->owns_stream = true;
        else
            st = aj_cuda_fail(comm->ctx, cu, r, "aj_comm_create: cuStreamCreate");
    }
    if (st == AJ_OK)
        st = open_comm(comm, config, s);
    if (st == AJ_OK) {
        /* the collective slot, sized for every call's opening agreement
         * (cp/common.c): no call pins memory for it */
        st = reserve(comm, &s->slots[NCCL_EXCHANGE_SLOTS], true, sizeof(aj_cp_call),
                     sizeof(aj_cp_call) * (size_t)comm->size);
        if (st != AJ_OK) {
            for (int i = 0; i < NCCL_SLOTS; i++) {
                if (s->slots[i].done)
                    cu->EventDestroy(s->slots[i].done);
                if (s->slots[i].ready)
                    cu->EventDestroy(s->slots[i].ready);
            }
            if (s->owns_comm)
                nccl.CommDestroy(s->comm);
        }
    }
    if (st != AJ_OK && s->owns_stream)
        cu->StreamDestroy(s->stream);
    pop_ctx(comm);
done:
    if (st != AJ_OK) {
        free(s);
        comm->impl = NULL;
        return st;
    }
    comm->engine = &nccl_engine;
    return AJ_OK;
}

aj_status aj_comm_nccl_open(aj_comm *comm, const aj_comm_config *config)
{
    pthread_once(&load_once, load_nccl);
    if (!nccl_ok)
        return aj_fail(comm->ctx, AJ_ERR_NO_DEVICE, "aj_comm_create: %s", nccl_error);
    const aj_cuda_device *cuda = aj_device_cuda(comm->dev);
    if (!cuda)
        return aj_fail(comm->ctx, AJ_ERR_INVALID_ARG, "aj_comm_create: the NCCL engine needs "
                       "a cuda device, not %s; use AJ_COMM_MPI", aj_device_name(comm->dev));
    return aj_comm_nccl_open_on(comm, config, cuda->cu, cuda->cuctx);
}
