/*
 * comm_nccl.c -- the NCCL engine: loads libnccl.so.2 at run time.
 *
 * The library is looked for with dlopen, like the CUDA driver, so attnjit
 * builds and runs without it.  The ring does not yet run on GPUs (it
 * exchanges host buffers; docs/ring.md), so this engine stops after
 * checking what a GPU ring needs: the library and its symbols, and a
 * cuda device.
 */
#include <assert.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"
#include "runtime/comm/comm.h"
#include "runtime/runtime.h"

/* X(field, "exported symbol") -- the NCCL entry points a GPU ring uses. */
#define AJ_NCCL_FUNCTIONS(X)                    \
    X(GetVersion, "ncclGetVersion")             \
    X(GetUniqueId, "ncclGetUniqueId")           \
    X(CommInitRank, "ncclCommInitRank")         \
    X(CommDestroy, "ncclCommDestroy")           \
    X(CommAbort, "ncclCommAbort")               \
    X(CommGetAsyncError, "ncclCommGetAsyncError") \
    X(GetErrorString, "ncclGetErrorString")     \
    X(GroupStart, "ncclGroupStart")             \
    X(GroupEnd, "ncclGroupEnd")                 \
    X(Send, "ncclSend")                         \
    X(Recv, "ncclRecv")                         \
    X(AllGather, "ncclAllGather")               \
    X(ReduceScatter, "ncclReduceScatter")

#define AJ_NCCL_COUNT_ONE(field, sym) +1
enum { AJ_NCCL_NUM_FUNCTIONS = 0 AJ_NCCL_FUNCTIONS(AJ_NCCL_COUNT_ONE) };
#undef AJ_NCCL_COUNT_ONE

typedef struct aj_nccl {
#define AJ_NCCL_FIELD(field, sym) void *field;
    AJ_NCCL_FUNCTIONS(AJ_NCCL_FIELD)
#undef AJ_NCCL_FIELD
} aj_nccl;

static_assert(sizeof(aj_nccl) == AJ_NCCL_NUM_FUNCTIONS * sizeof(void *),
              "one pointer per NCCL function");

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
#define AJ_NCCL_RESOLVE(field, sym)                                                 \
    if (!(nccl.field = dlsym(h, sym))) {                                            \
        snprintf(nccl_error, sizeof nccl_error, "%s lacks %s; it is too old for "   \
                 "attnjit", name, sym);                                             \
        return;                                                                     \
    }
    AJ_NCCL_FUNCTIONS(AJ_NCCL_RESOLVE)
#undef AJ_NCCL_RESOLVE
    nccl_ok = 1;   /* the handle stays open for the life of the process */
}

aj_status aj_comm_nccl_open(aj_comm *comm, const aj_comm_config *config)
{
    pthread_once(&load_once, load_nccl);
    if (!nccl_ok)
        return aj_fail(comm->ctx, AJ_ERR_NO_DEVICE, "aj_comm_create: %s", nccl_error);
    if (comm->dev->kind != AJ_DEVICE_CUDA)
        return aj_fail(comm->ctx, AJ_ERR_INVALID_ARG, "aj_comm_create: the NCCL engine needs "
                       "a cuda device, not %s; use AJ_COMM_MPI", aj_device_name(comm->dev));
    return aj_fail(comm->ctx, AJ_ERR_UNSUPPORTED, "aj_comm_create: NCCL %s found, but the "
                   "ring does not run on GPUs yet (docs/ring.md); use AJ_COMM_MPI",
                   config->nccl_comm ? "and a communicator" : "is");
}
