/*
 * fake_nccl.c -- a stand-in libnccl.so.2 that exports the symbols attnjit
 * resolves and does nothing, so the NCCL engine's checks after a
 * successful load run on machines without NCCL.
 */
int ncclGetVersion(int *version);
int ncclGetVersion(int *version)
{
    *version = 0;
    return 0;
}

#define FAKE(name)    \
    int name(void);   \
    int name(void) { return 1; }
FAKE(ncclGetUniqueId)
FAKE(ncclCommInitRank)
FAKE(ncclCommDestroy)
FAKE(ncclCommAbort)
FAKE(ncclCommGetAsyncError)
FAKE(ncclGetErrorString)
FAKE(ncclGroupStart)
FAKE(ncclGroupEnd)
FAKE(ncclSend)
FAKE(ncclRecv)
FAKE(ncclAllGather)
FAKE(ncclReduceScatter)
