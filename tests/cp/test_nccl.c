/*
 * test_nccl.c -- the NCCL engine on stand-ins, under mpirun with P = 2, 3:
 * tests/cp/fake_nccl.c (moves the bytes over MPI and logs every NCCL
 * call) and tests/fake_cuda (device memory is host memory; in mode
 * "stuck" no event ever completes).  The stand-in libcuda cannot open an
 * aj_device, so the engine is driven through aj_comm_nccl_open_on and its
 * vtable, as cp/ring.c drives it.
 *
 * Covers: the unique id made on rank 0 only and every rank's
 * ncclCommInitRank with it; an empty exchange; an exchange's
 * GroupStart/Send/Recv/GroupEnd (peers, byte counts) and the bytes that
 * arrive; all-gather, the f32
 * reduce-scatter against a float64 sum, and the all-to-all (a group of a
 * send and a receive per peer, uneven counts); the caller's communicator used
 * and never destroyed; a stuck exchange and a stuck collective ending in
 * AJ_ERR_COMM within the timeout with ncclCommAbort; NCCL's async error;
 * a caller's communicator NCCL rejects; a third exchange in flight; an
 * exchange tested, waited for and cancelled again after the next exchange
 * took its slot (its bytes left alone); a
 * nonblocking communicator (ncclInProgress);
 * a failing ncclCommInitRank; a unique id that never comes; MPI not
 * initialised; a split (ncclCommSplit, method = hybrid's) whose parts
 * move their ranks' bytes, and a libnccl without it ($FAKE_NCCL_NO_SPLIT:
 * the stand-in built as an NCCL older than 2.18).  About 1.5 s (3 s
 * under ASAN).
 */
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cp/alltoall_check.h"
#include "cp/leak_check.h"
#include "cp/comm/comm.h"
#include "runtime/cuda/cuda_api.h"

enum { MAX_P = 4 };

static aj_ctx *ctx;
static const aj_cuda *cu;
static int rank, size;
static MPI_Comm side = MPI_COMM_NULL;   /* see check_nccl_errors */
static int fake_context;   /* a CUcontext the stand-in pushes and pops */
static const char *(*nccl_log)(void);
static void (*nccl_log_clear)(void);
static void *(*caller_comm)(void);

static aj_status open_nccl(const aj_comm_config *cc, aj_comm **out)
{
    aj_comm *c = calloc(1, sizeof *c);
    if (!c)
        return AJ_ERR_OUT_OF_MEMORY;
    c->ctx = ctx;
    c->timeout_s = cc->timeout_s > 0 ? cc->timeout_s : 60;
    aj_status st = aj_comm_nccl_open_on(c, cc, cu, &fake_context);
    if (st != AJ_OK) {
        free(c);
        return st;
    }
    *out = c;
    return AJ_OK;
}

/* A config for the NCCL engine, the rest as AJ_COMM_CONFIG_INIT. */
static aj_comm_config nccl_config(void)
{
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    cc.kind = AJ_COMM_NCCL;
    return cc;
}

/* The stand-in's log cleared, a communicator that must open (NULL, a
 * failed CHECK, when it does not). */
static aj_comm *open_logged(const aj_comm_config *cc)
{
    nccl_log_clear();
    aj_comm *comm = NULL;
    CHECK_STATUS(ctx, open_nccl(cc, &comm), AJ_OK);
    return comm;
}

static int logged(const char *line)
{
    return strstr(nccl_log(), line) != NULL;
}

#define CHECK_LOGGED(line) \
    CHECK_MSG(logged(line), "rank %d: log lacks \"%s\":\n%s", rank, (line), nccl_log())
#define CHECK_NOT_LOGGED(line) \
    CHECK_MSG(!logged(line), "rank %d: log has \"%s\":\n%s", rank, (line), nccl_log())

static unsigned char pattern(int r, size_t i)
{
    return (unsigned char)(r * 37 + i * 11 + 5);
}

static aj_status exchange(aj_comm *comm, size_t bytes, unsigned char *recv, double *waited)
{
    unsigned char *send = malloc(bytes);
    for (size_t i = 0; i < bytes; i++)
        send[i] = pattern(rank, i);
    aj_comm_req req = {.what = "K/V", .to = (rank + 1) % size,
                       .from = (rank + size - 1) % size, .bytes = bytes, .posted = aj_now()};
    aj_status st = comm->engine->exchange_start(comm, send, recv, bytes, req.to, req.from, 0,
                                                &req);
    if (st == AJ_OK) {
        req.active = true;
        const double start = aj_now();
        st = aj_comm_wait(comm, &req, "test", NULL);
        if (waited)
            *waited = aj_now() - start;
    }
    free(send);
    return st;
}

/* The id, the exchange, the collectives and destroy on a communicator
 * the engine makes. */
static void check_own_comm(void)
{
    aj_comm_config cc = nccl_config();
    aj_comm *comm = open_logged(&cc);
    if (!comm)
        return;
    CHECK(comm->rank == rank && comm->size == size);
    long pid0 = rank == 0 ? (long)getpid() : 0;
    MPI_Bcast(&pid0, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    char line[160];
    if (rank == 0)
        CHECK_LOGGED("GetUniqueId");
    else
        CHECK_NOT_LOGGED("GetUniqueId");
    snprintf(line, sizeof line, "CommInitRank nranks=%d rank=%d id=fake-nccl-id-%ld\n", size,
             rank, pid0);
    CHECK_LOGGED(line);

    const size_t bytes = 1000;
    unsigned char recv[1000];
    const int to = (rank + 1) % size, from = (rank + size - 1) % size;
    /* an empty block first, while the slot is new (the driver refuses
     * 0-byte allocations) */
    CHECK_STATUS(ctx, exchange(comm, 0, recv, NULL), AJ_OK);
    CHECK_STATUS(ctx, exchange(comm, bytes, recv, NULL), AJ_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < bytes; i++)
        wrong += recv[i] != pattern(from, i);
    CHECK_MSG(wrong == 0, "rank %d: %zu of %zu bytes from rank %d wrong", rank, wrong, bytes,
              from);
    snprintf(line, sizeof line, "GroupStart\nSend count=%zu type=0 peer=%d comm=own\n"
             "Recv count=%zu type=0 peer=%d comm=own\nGroupEnd\n", bytes, to, bytes, from);
    CHECK_LOGGED(line);

    /* the ring has at most two exchanges in flight; a third is a bug */
    aj_comm_req reqs[3] = {{.what = "K/V"}, {.what = "dK/dV"}, {.what = "more"}};
    unsigned char out[3], in[3];
    for (int i = 0; i < 3; i++)
        out[i] = (unsigned char)(10 * rank + i + 1);
    for (int i = 0; i < 2; i++) {
        CHECK_STATUS(ctx, comm->engine->exchange_start(comm, &out[i], &in[i], 1, to, from, i,
                                                       &reqs[i]), AJ_OK);
        reqs[i].active = true;
    }
    CHECK_STATUS(ctx, comm->engine->exchange_start(comm, &out[2], &in[2], 1, to, from, 2,
                                                   &reqs[2]), AJ_ERR_INTERNAL);
    snprintf(line, sizeof line, "NCCL: rank %d: more than 2 exchanges in flight", rank);
    CHECK_ERROR(ctx, line);
    for (int i = 0; i < 2; i++) {
        CHECK_STATUS(ctx, aj_comm_wait(comm, &reqs[i], "test", NULL), AJ_OK);
        CHECK_MSG(in[i] == 10 * from + i + 1, "rank %d: exchange %d got %d", rank, i, in[i]);
    }

    /* an exchange seen complete (the ring's progress polling) lets go of
     * its slot: the next exchange takes it, and testing, waiting for or
     * cancelling the first again leaves its bytes alone (the ring's K/V
     * block once got the dK/dV bytes that way) */
    unsigned char first_in = 0, second_in = 0, first_out = (unsigned char)(rank + 60);
    unsigned char second_out = (unsigned char)(rank + 90);
    aj_comm_req first = {.what = "K/V", .active = true}, second = {.what = "dK/dV"};
    CHECK_STATUS(ctx, comm->engine->exchange_start(comm, &first_out, &first_in, 1, to, from, 0,
                                                   &first), AJ_OK);
    bool done = false;
    while (!done)
        CHECK_STATUS(ctx, comm->engine->exchange_test(comm, &first, &done), AJ_OK);
    first.completed = aj_now();
    CHECK_STATUS(ctx, comm->engine->exchange_start(comm, &second_out, &second_in, 1, to, from, 1,
                                                   &second), AJ_OK);
    second.active = true;
    CHECK_STATUS(ctx, aj_comm_wait(comm, &second, "test", NULL), AJ_OK);
    done = false;
    CHECK_STATUS(ctx, comm->engine->exchange_test(comm, &first, &done), AJ_OK);
    CHECK(done);
    comm->engine->exchange_cancel(comm, &first);
    CHECK_STATUS(ctx, aj_comm_wait(comm, &first, "test", NULL), AJ_OK);
    CHECK_MSG(first_in == from + 60 && second_in == from + 90, "rank %d: the exchanges got %d "
              "and %d, want %d and %d", rank, first_in, second_in, from + 60, from + 90);

    /* one-sided (the ring's skipped transfers): rank 0 sends to rank 1,
     * which only receives; the others post nothing.  Only what is sent
     * counts, and a rank that receives nothing keeps its buffer. */
    if (rank < 2) {
        const uint64_t sent_before = aj_comm_bytes_sent(comm);
        unsigned char one = (unsigned char)(rank + 42), got = 7;
        aj_comm_req req = {.what = "K/V"};
        nccl_log_clear();
        CHECK_STATUS(ctx, comm->engine->exchange_start(comm, &one, &got, 1, rank == 0 ? 1 : -1,
                                                       rank == 0 ? -1 : 0, 3, &req), AJ_OK);
        req.active = true;
        CHECK_STATUS(ctx, aj_comm_wait(comm, &req, "test", NULL), AJ_OK);
        CHECK_MSG(got == (rank == 0 ? 7 : 42), "rank %d: one-sided exchange got %d", rank, got);
        CHECK(aj_comm_bytes_sent(comm) - sent_before == (rank == 0 ? 1u : 0u));
        CHECK_LOGGED(rank == 0 ? "GroupStart\nSend count=1 type=0 peer=1 comm=own\nGroupEnd\n"
                               : "GroupStart\nRecv count=1 type=0 peer=0 comm=own\nGroupEnd\n");
    }

    unsigned char mine[24], all[MAX_P * 24];
    for (size_t i = 0; i < sizeof mine; i++)
        mine[i] = pattern(rank + 7, i);
    CHECK_STATUS(ctx, comm->engine->allgather(comm, mine, all, sizeof mine), AJ_OK);
    wrong = 0;
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < sizeof mine; i++)
            wrong += all[(size_t)r * sizeof mine + i] != pattern(r + 7, i);
    CHECK_MSG(wrong == 0, "rank %d: all-gather: %zu bytes wrong", rank, wrong);
    CHECK_LOGGED("AllGather count=24 type=0 comm=own\n");

    /* rank r's slice s of [size][count]: the sum over r goes to rank s */
    enum { COUNT = 5 };
    float send[MAX_P * COUNT], got[COUNT];
    for (int i = 0; i < size * COUNT; i++)
        send[i] = (float)(0.25 * (rank + 1) * (i + 1) - 0.1 * i);
    CHECK_STATUS(ctx, comm->engine->reduce_scatter_f32(comm, send, got, COUNT), AJ_OK);
    double worst = 0;
    for (int i = 0; i < COUNT; i++) {
        double want = 0;
        const int at = rank * COUNT + i;
        for (int r = 0; r < size; r++)
            want += (double)(float)(0.25 * (r + 1) * (at + 1) - 0.1 * at);
        worst = fmax(worst, fabs(got[i] - want) / fmax(1.0, fabs(want)));
    }
    CHECK_MSG(worst < 1e-6, "rank %d: reduce-scatter off by %g", rank, worst);
    CHECK_LOGGED("ReduceScatter count=5 type=7 op=0 comm=own\n");

    /* the all-to-all: a group of a send and a receive per peer */
    CHECK_STATUS(ctx, alltoall_check(comm), AJ_OK);
    snprintf(line, sizeof line, "Send count=%zu type=0 peer=%d comm=own\nRecv count=%zu "
             "type=0 peer=%d comm=own\n", alltoall_check_bytes(rank, size - 1), size - 1,
             alltoall_check_bytes(size - 1, rank), size - 1);
    CHECK_LOGGED(line);

    aj_comm_destroy(comm);
    CHECK_LOGGED("CommDestroy comm=own");
    CHECK_NOT_LOGGED("CommAbort");
}

/* aj_comm_split: ranks of one parity in a comm of their own, ranked by
 * rank; its all-gather hears from them only.  Without ncclCommSplit in
 * the library, a clear refusal. */
static void check_split(void)
{
    aj_comm_config cc = nccl_config();
    aj_comm *comm = open_logged(&cc), *sub = NULL;
    if (!comm)
        return;
    const int color = rank % 2;
    if (getenv("FAKE_NCCL_NO_SPLIT")) {
        CHECK_STATUS(ctx, aj_comm_split(comm, color, rank, &sub), AJ_ERR_UNSUPPORTED);
        CHECK_ERROR(ctx, "splitting the communicator needs ncclCommSplit (NCCL 2.18 or "
                    "later), which the loaded libnccl (version code 22000) lacks");
        aj_comm_destroy(comm);
        return;
    }
    CHECK_STATUS(ctx, aj_comm_split(comm, color, rank, &sub), AJ_OK);
    char line[96];
    snprintf(line, sizeof line, "CommSplit color=%d key=%d comm=own\n", color, rank);
    CHECK_LOGGED(line);
    if (sub) {
        CHECK(sub->rank == rank / 2 && sub->size == (size - color + 1) / 2);
        unsigned char mine = (unsigned char)(rank + 1), all[MAX_P] = {0};
        CHECK_STATUS(ctx, sub->engine->allgather(sub, &mine, all, 1), AJ_OK);
        for (int r = 0; r < sub->size; r++)
            CHECK_MSG(all[r] == 2 * r + color + 1, "rank %d: split all-gather got %d from %d",
                      rank, all[r], r);
        CHECK_LOGGED("AllGather count=1 type=0 comm=split\n");
        CHECK(aj_comm_bytes_sent(sub) == (uint64_t)(sub->size - 1));
    }
    aj_comm_destroy(sub);
    CHECK_LOGGED("CommDestroy comm=split");
    aj_comm_destroy(comm);
    CHECK_NOT_LOGGED("CommAbort");
}

/* A nonblocking communicator: ncclGroupEnd and the collectives answer
 * ncclInProgress and the stand-in moves the bytes only once
 * ncclCommGetAsyncError has been polled to ncclSuccess, so an engine that
 * queued its copy back before then would hand on stale bytes. */
static void check_nonblocking(void)
{
    setenv("FAKE_NCCL_MODE", "nonblocking", 1);
    check_own_comm();
    CHECK_LOGGED("GroupEnd in progress");
    CHECK_LOGGED("GetAsyncError done");
    unsetenv("FAKE_NCCL_MODE");
}

/* The caller's communicator and stream: used, never made or destroyed. */
static void check_caller_comm(void)
{
    aj_comm_config cc = nccl_config();
    cc.nccl_comm = caller_comm();
    cc.stream = &fake_context;
    aj_comm *comm = open_logged(&cc);
    if (!comm)
        return;
    CHECK(comm->rank == rank && comm->size == size);
    unsigned char recv[64];
    CHECK_STATUS(ctx, exchange(comm, sizeof recv, recv, NULL), AJ_OK);
    CHECK(recv[63] == pattern((rank + size - 1) % size, 63));
    char line[96];
    snprintf(line, sizeof line, "Send count=64 type=0 peer=%d comm=caller\n", (rank + 1) % size);
    CHECK_LOGGED(line);
    aj_comm_destroy(comm);
    CHECK_NOT_LOGGED("GetUniqueId");
    CHECK_NOT_LOGGED("CommInitRank");
    CHECK_NOT_LOGGED("CommDestroy");
    CHECK_NOT_LOGGED("CommAbort");
}

/* Events that never complete: a peer that never answers. */
static void check_stuck(void)
{
    setenv("FAKE_CUDA_MODE", "stuck", 1);
    aj_comm_config cc = nccl_config();
    cc.timeout_s = 0.3;
    char text[200];

    aj_comm *comm = open_logged(&cc);
    if (comm) {
        unsigned char recv[100];
        double waited = 0;
        CHECK_STATUS(ctx, exchange(comm, sizeof recv, recv, &waited), AJ_ERR_COMM);
        snprintf(text, sizeof text, "test: rank %d: K/V exchange (100 bytes to rank %d, from "
                 "rank %d) got no answer within the comm timeout of 0.3 s", rank,
                 (rank + 1) % size, (rank + size - 1) % size);
        CHECK_ERROR(ctx, text);
        CHECK_MSG(waited >= 0.3 && waited < 3, "rank %d: waited %g s", rank, waited);
        CHECK_LOGGED("CommAbort comm=own");
        unsigned char one = 1, two[MAX_P];
        CHECK_STATUS(ctx, comm->engine->allgather(comm, &one, two, 1), AJ_ERR_COMM);
        snprintf(text, sizeof text, "NCCL: rank %d: ncclAllGather: the communicator was "
                 "aborted after an earlier failure", rank);
        CHECK_ERROR(ctx, text);
        aj_comm_destroy(comm);
        CHECK_NOT_LOGGED("CommDestroy");
    }

    comm = open_logged(&cc);
    if (comm) {
        unsigned char mine[24], all[MAX_P * 24];
        memset(mine, 1, sizeof mine);
        const double start = aj_now();
        CHECK_STATUS(ctx, comm->engine->allgather(comm, mine, all, sizeof mine), AJ_ERR_COMM);
        const double waited = aj_now() - start;
        snprintf(text, sizeof text, "NCCL: rank %d: ncclAllGather (24 bytes sent, %d "
                 "received, %d ranks) got no answer within the comm timeout of 0.3 s", rank,
                 24 * size, size);
        CHECK_ERROR(ctx, text);
        CHECK_MSG(waited >= 0.3 && waited < 3, "rank %d: waited %g s", rank, waited);
        CHECK_LOGGED("CommAbort comm=own");
        aj_comm_destroy(comm);
    }

    comm = NULL;
    CHECK_STATUS(ctx, open_nccl(&cc, &comm), AJ_OK);
    if (comm) {
        CHECK_STATUS(ctx, alltoall_check(comm), AJ_ERR_COMM);
        snprintf(text, sizeof text, "NCCL: rank %d: an all-to-all (ncclGroupStart/ncclSend/"
                 "ncclRecv per peer/ncclGroupEnd) (", rank);
        CHECK_ERROR(ctx, text);
        CHECK_ERROR(ctx, "got no answer within the comm timeout of 0.3 s");
        aj_comm_destroy(comm);
    }
    setenv("FAKE_CUDA_MODE", "no_gpus", 1);
}

/* NCCL's own errors: one reported while an exchange runs, and a
 * communicator that cannot be made. */
static void check_nccl_errors(void)
{
    aj_comm_config cc = nccl_config();
    char text[200];

    setenv("FAKE_NCCL_MODE", "async_error", 1);
    aj_comm *comm = open_logged(&cc);
    if (comm) {
        unsigned char recv[10];
        CHECK_STATUS(ctx, exchange(comm, sizeof recv, recv, NULL), AJ_ERR_COMM);
        snprintf(text, sizeof text, "NCCL: rank %d: an exchange failed: remote process exited "
                 "or there was a network error (fake)", rank);
        CHECK_ERROR(ctx, text);
        CHECK_LOGGED("CommAbort comm=own");
        aj_comm_destroy(comm);
    }

    /* rank 0 stays away: the others' unique id never comes (over a
     * communicator of its own, where rank 0 completes the broadcast
     * afterwards; `side` is freed after the leak check, as the engine
     * leaves the request of a broadcast that timed out to MPI) */
    MPI_Comm_dup(MPI_COMM_WORLD, &side);
    if (rank != 0) {
        aj_comm_config late = cc;
        late.mpi_comm = &side;
        late.timeout_s = 0.3;
        comm = NULL;
        CHECK_STATUS(ctx, open_nccl(&late, &comm), AJ_ERR_COMM);
        snprintf(text, sizeof text, "aj_comm_create: rank %d: the NCCL unique id from rank 0 "
                 "did not come within the comm timeout of 0.3 s", rank);
        CHECK_ERROR(ctx, text);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        char id[128] = "";
        MPI_Bcast(id, sizeof id, MPI_BYTE, 0, side);
    }

    setenv("FAKE_NCCL_MODE", "bad_comm", 1);
    aj_comm_config theirs = cc;
    theirs.nccl_comm = caller_comm();
    comm = NULL;
    CHECK_STATUS(ctx, open_nccl(&theirs, &comm), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_comm_create: config->nccl_comm is not a usable NCCL communicator: "
                "invalid argument (fake)");

    setenv("FAKE_NCCL_MODE", "init_fails", 1);
    comm = NULL;
    CHECK_STATUS(ctx, open_nccl(&cc, &comm), AJ_ERR_COMM);
    snprintf(text, sizeof text, "aj_comm_create: rank %d: ncclCommInitRank (%d ranks) failed: "
             "unhandled system error (fake)", rank, size);
    CHECK_ERROR(ctx, text);
    unsetenv("FAKE_NCCL_MODE");
}

static int load_log(void)
{
    void *h = dlopen(getenv("AJ_NCCL_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        return 0;
    void *p[3] = {dlsym(h, "fake_nccl_log"), dlsym(h, "fake_nccl_log_clear"),
                  dlsym(h, "fake_nccl_caller_comm")};
    memcpy(&nccl_log, &p[0], sizeof p[0]);
    memcpy(&nccl_log_clear, &p[1], sizeof p[1]);
    memcpy(&caller_comm, &p[2], sizeof p[2]);
    dlclose(h);
    return nccl_log && nccl_log_clear && caller_comm;
}

int main(int argc, char **argv)
{
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    if (aj_cuda_get(ctx, &cu) != AJ_OK) {
        printf("skipped: the stand-in libcuda did not load (%s)\n", aj_last_error(ctx));
        aj_ctx_destroy(ctx);
        return 77;
    }
    /* before MPI_Init: the engine cannot broadcast its unique id */
    aj_comm_config cc = nccl_config();
    aj_comm *comm = NULL;
    CHECK_STATUS(ctx, open_nccl(&cc, &comm), AJ_ERR_COMM);
    CHECK_ERROR(ctx, "aj_comm_create: MPI is not initialised; the NCCL engine broadcasts its "
                "unique id over MPI (or pass config->nccl_comm)");
    CHECK_MSG(load_log(), "the stand-in libnccl ($AJ_NCCL_LIBRARY) lacks its log");
    if (!nccl_log) {
        aj_ctx_destroy(ctx);
        return check_report();
    }

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK_MSG(size >= 2 && size <= MAX_P, "run with 2 to %d ranks, not %d", MAX_P, size);
    if (size >= 2 && size <= MAX_P && getenv("FAKE_NCCL_NO_SPLIT")) {
        check_split();
    } else if (size >= 2 && size <= MAX_P) {
        check_split();
        check_own_comm();
        check_nonblocking();
        check_caller_comm();
        check_stuck();
        check_nccl_errors();
    }
    CHECK_MSG(!leak_check_before_finalize(), "leaks (LeakSanitizer's report above)");
    if (side != MPI_COMM_NULL)
        MPI_Comm_free(&side);
    MPI_Finalize();
    aj_ctx_destroy(ctx);
    return check_report();
}
