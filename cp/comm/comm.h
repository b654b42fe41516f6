/*
 * comm.h -- the ring's communicator (internal): one interface, an engine
 * per transport (comm_mpi.c for CPU ranks, comm_nccl.c for GPUs).
 *
 * The ring needs three things from a transport: a neighbour exchange it
 * can start, poll while kernels run, and wait for with a deadline; an
 * all-gather; and a float sum reduce-scatter.  Ulysses (ulysses.c) needs
 * an all-to-all with a count per peer.  Every wait is bounded by
 * the comm's timeout, so a silent peer becomes AJ_ERR_COMM, never a hang.
 */
#ifndef AJ_CP_COMM_COMM_H
#define AJ_CP_COMM_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "attnjit/attnjit.h"

/* One exchange in flight: send to one neighbour, receive from the other.
 * `impl` holds the engine's request handles. */
typedef struct aj_comm_req {
    bool active;
    const char *what;          /* "K/V", "dK/dV": for messages */
    int to, from;
    size_t bytes;
    double posted;             /* aj_now() when it was started */
    double completed;          /* aj_now() when it was seen done; 0 before */
    _Alignas(16) unsigned char impl[64];
} aj_comm_req;

/* A transport.  Buffers are host memory (the NCCL engine stages them
 * through device memory itself), or device memory where the comm says so
 * (device_buffers, on an engine that moves_device_memory). */
typedef struct aj_comm_engine {
    const char *name;
    /* it sends and receives device memory in place (NCCL), when the comm's
     * device_buffers says the buffers are; else it takes host memory only */
    bool moves_device_memory;
    /* Starts sending `bytes` of `send` to rank `to` and receiving as many
     * into `recv` from rank `from`; to < 0 sends nothing, from < 0
     * receives nothing (a one-sided exchange: the ring's skipped
     * transfers, ring.c). */
    aj_status (*exchange_start)(aj_comm *comm, const void *send, void *recv, size_t bytes,
                                int to, int from, int tag, aj_comm_req *req);
    /* Progresses the exchange; *done tells whether it completed. */
    aj_status (*exchange_test)(aj_comm *comm, aj_comm_req *req, bool *done);
    /* Abandons an exchange after a failure (its buffers may still be
     * touched by the transport until the comm is destroyed). */
    void (*exchange_cancel)(aj_comm *comm, aj_comm_req *req);
    /* Optional (NULL: none), device buffers only: the work queued on
     * `stream` from now on waits, on the device, for the exchange to
     * complete; the exchange is then done for the caller, who never waits
     * for it on the host (a resident ring's kernels after the transfer
     * that brings their block). */
    aj_status (*exchange_join)(aj_comm *comm, aj_comm_req *req, void *stream);
    /* Optional: ends whatever the engine left queued after a failure the
     * caller saw on its own stream (a resident call's last wait timing out
     * on a transfer joined to it): ncclCommAbort.  Any thread (the
     * watchdog's too). */
    void (*abort)(aj_comm *comm);
    /* Optional (NULL: none to ask): an error the transport found on its own
     * since its work was queued (ncclCommGetAsyncError), as text into msg
     * and AJ_ERR_COMM; AJ_OK while there is none.  Any thread: the
     * watchdog polls it (cp/comm/watch.c). */
    aj_status (*async_error)(aj_comm *comm, char *msg, size_t cap);
    /* The collectives below return once their results are in recv --
     * or, on device buffers with an after_stream (comm->device_buffers),
     * once they are queued after that stream's work, the stream then
     * waiting for them on the device. */
    /* recv [size][bytes] gets every rank's `bytes` of send, by rank. */
    aj_status (*allgather)(aj_comm *comm, const void *send, void *recv, size_t bytes);
    /* recv [count] f32 gets the sum over ranks of send's rank-th slice of
     * [size][count] f32. */
    aj_status (*reduce_scatter_f32)(aj_comm *comm, const float *send, float *recv,
                                    size_t count);
    /* Rank d gets send_bytes[d] bytes from send + send_off[d]; from rank s
     * arrive recv_bytes[s] bytes at recv + recv_off[s] (arrays of size
     * entries; a rank's own part is copied too). */
    aj_status (*alltoallv)(aj_comm *comm, const void *send, const size_t *send_bytes,
                           const size_t *send_off, void *recv, const size_t *recv_bytes,
                           const size_t *recv_off);
    /* Optional (NULL: none): memory every rank reads in place, where the
     * comm's ranks share one node.  Collective: every rank asks for the
     * same `bytes`, and seg[r] gets rank r's segment (host memory, 64-byte
     * aligned, kept until a call asks for more or the comm is destroyed;
     * a larger one replaces it, contents lost).  AJ_ERR_UNSUPPORTED, with
     * no error text: the ranks span nodes, and the caller sends messages
     * instead. */
    aj_status (*shared_segments)(aj_comm *comm, size_t bytes, void **seg);
    /* Starts a fence over the shared segments, completed like an exchange
     * (exchange_test, aj_comm_wait): what any rank wrote to them before
     * starting it, every rank reads once it completed. */
    aj_status (*shared_fence_start)(aj_comm *comm, aj_comm_req *req);
    /* Fills sub (engine, impl, rank, size) with a communicator over the
     * ranks that pass the same color, ranked by key (MPI_Comm_split,
     * ncclCommSplit); collective over comm. */
    aj_status (*split)(aj_comm *comm, int color, int key, aj_comm *sub);
    void (*destroy)(aj_comm *comm);
} aj_comm_engine;

struct aj_comm {
    aj_ctx *ctx;
    aj_device *dev;
    const aj_comm_engine *engine;
    void *impl;                /* the engine's state */
    int rank, size;
    double timeout_s;
    uint64_t bytes_sent;       /* aj_comm_bytes_sent: the engines count */
    bool messages_only;        /* no shared segments even on one node (tests) */
    /* the buffers a method hands the engine are device memory (the ring on
     * cuda ranks over an engine that moves it: moves_device_memory), set
     * around its transfers; else host memory */
    bool device_buffers;
    /* with device_buffers: the stream whose work queued so far the
     * engine's transfers wait for on the device (an event), so the method
     * need not wait on the host before it starts one; NULL: none */
    void *after_stream;
    /* method = hybrid's sub-communicators (hybrid.c), made on first use
     * and freed with the comm: `group`, the U consecutive ranks of this
     * rank's Ulysses group, and `across`, the ranks at this rank's place
     * in every group (the ring); NULL until then */
    struct aj_comm *group, *across;
    int split_u;
    /* the ring's kernels of recent calls (ring.c), freed with the comm by
     * ring_memo_free; NULL until a ring call keeps some */
    void *ring_memo;
    void (*ring_memo_free)(void *memo);
    /* device memory the methods keep between calls (aj_comm_block),
     * freed with the comm */
    struct aj_comm_block *blocks;
    int num_blocks;
    /* the methods' compute stream (aj_cp_stream), made by the first call
     * and kept, so that the device's per-stream scratch (the flash
     * backward's workspace) serves every later call; destroyed with the
     * comm */
    void *ring_stream;
    /* the event through which a call's stream and the caller's wait for
     * each other (aj_device_stream_after); made with ring_stream */
    void *order_event;
    /* the opening agreements the comm remembers (cp/common.c:
     * aj_cp_agree), which a repeated asynchronous call reuses: malloc'd,
     * freed with the comm */
    void *agreed[8];
    uint64_t agreed_clock;
    /* the watchdog of the asynchronous calls (watch.c), NULL until the
     * first; stopped by aj_comm_destroy before anything else goes */
    struct aj_comm_watch *watch;
};

/* ---- asynchronous calls' watchdog (watch.c; docs/ring.md "Asynchronous
 * calls") */

/* After an asynchronous call's work was queued on `stream`: an event
 * recorded there, which the caller's stream `caller` waits for and the
 * watchdog thread (started by the comm's first) polls until it is done,
 * with the engine's async_error; past the comm's timeout from now, or on
 * an error, it records AJ_ERR_COMM and aborts the engine.  Inside a CUDA
 * graph capture only the wait is queued (a graph's work is its
 * launcher's to watch).  With AJ_COMM_WATCH_MAX calls pending, waits for
 * the oldest first.  `fn` names the call in messages. */
enum { AJ_COMM_WATCH_MAX = 16 };
aj_status aj_comm_watch_add(aj_comm *comm, aj_ctx *ctx, void *stream, void *caller,
                            const char *fn);
/* AJ_ERR_COMM on ctx, naming fn, once the watchdog found a failure;
 * else AJ_OK, with the calls still pending in *pending (may be NULL). */
aj_status aj_comm_watch_check(aj_comm *comm, aj_ctx *ctx, const char *fn, int32_t *pending);
/* Waits until no call is pending or one failed (each pending call's
 * deadline bounds it); then as aj_comm_watch_check. */
aj_status aj_comm_watch_drain(aj_comm *comm, aj_ctx *ctx, const char *fn);
/* Stops the thread (after draining) and frees the watchdog; aj_comm_destroy. */
void aj_comm_watch_free(aj_comm *comm);

/* Device memory of at least `bytes` (whole 4-byte words) on the comm's
 * device, for the length of a call: a block the comm keeps from an earlier call when one fits
 * (the smallest that does), else a new one it keeps from now on (up to
 * AJ_COMM_BLOCKS; past them a block of the call's own).  A resident ring
 * (cp/ring.c) takes its buffers so, and its calls after the first of a
 * size allocate nothing.  Given back by aj_comm_block_put once the work
 * using it is done; freed by aj_comm_destroy. */
enum { AJ_COMM_BLOCKS = 32 };
aj_status aj_comm_block_get(aj_comm *comm, size_t bytes, void **out);
void aj_comm_block_put(aj_comm *comm, void *ptr);

/* The engine's next transfers move device memory in place (a resident
 * call's), each starting on the device once `after` (a stream; NULL: no
 * wait) has done the work queued on it so far -- or, on_device false,
 * host memory again. */
static inline void aj_comm_device_transfers(aj_comm *comm, bool on_device, void *after)
{
    comm->device_buffers = on_device;
    comm->after_stream = on_device ? after : NULL;
}

/* The engine's shared segments (shared_segments), or AJ_ERR_UNSUPPORTED
 * where it has none, the ranks span nodes or messages_only is set. */
aj_status aj_comm_shared_segments(aj_comm *comm, size_t bytes, void **seg);

/* What an engine hands its transport for other ranks: counted when an
 * operation is posted (aj_comm_bytes_sent). */
static inline void aj_comm_count_sent(aj_comm *comm, uint64_t bytes)
{
    comm->bytes_sent += bytes;
}
/* The same for a collective in which every rank sends `each` bytes to
 * every other. */
static inline void aj_comm_count_collective(aj_comm *comm, uint64_t each)
{
    comm->bytes_sent += each * (uint64_t)(comm->size - 1);
}
/* The same for an all-to-all: every part but the rank's own. */
static inline void aj_comm_count_alltoall(aj_comm *comm, const size_t *send_bytes)
{
    for (int peer = 0; peer < comm->size; peer++)
        if (peer != comm->rank)
            comm->bytes_sent += send_bytes[peer];
}

/* A new comm over the ranks of `comm` that pass the same color, ranked
 * by key (engine->split; collective over comm), with comm's ctx, device
 * and timeout; *out is freed with aj_comm_destroy. */
aj_status aj_comm_split(aj_comm *comm, int color, int key, aj_comm **out);

/* Gives the core to another process for a moment: ranks oversubscribing
 * the cores must not spin each other out of their time slices. */
void aj_comm_pause(void);

/* Waits for an exchange, at most the comm's timeout from now; adds the
 * time waited to *waited_s (may be NULL).  `fn` names the caller. */
aj_status aj_comm_wait(aj_comm *comm, aj_comm_req *req, const char *fn, double *waited_s);

/* The engines' constructors: fill comm->engine, comm->impl, rank, size. */
aj_status aj_comm_mpi_open(aj_comm *comm, const aj_comm_config *config);
aj_status aj_comm_nccl_open(aj_comm *comm, const aj_comm_config *config);
/* The NCCL engine on the driver `cu` and context `cuctx` (NULL: the
 * current one), without an aj_device: what aj_comm_nccl_open calls for a
 * cuda device, and what tests/cp/test_nccl.c drives on a stand-in
 * libcuda that cannot open one. */
struct aj_cuda;
aj_status aj_comm_nccl_open_on(aj_comm *comm, const aj_comm_config *config,
                               const struct aj_cuda *cu, void *cuctx);

#endif /* AJ_CP_COMM_COMM_H */
