/*
 * fake_cuda.c -- a stand-in libcuda.so.1 for testing attnjit's GPU path on
 * machines without a GPU.  It cannot run a kernel itself, but it holds
 * attnjit to the driver's rules and records what attnjit asked of it.
 *
 * FAKE_CUDA_MODE picks what it pretends:
 *   "no_device"  cuInit fails with CUDA_ERROR_NO_DEVICE (the default)
 *   "no_gpus"    initialises, 0 devices (the NCCL engine's tests use its
 *                memory, streams and events without an aj_device)
 *   "old_gpu"    one compute-capability 7.5 device
 *   "gpu"        FAKE_CUDA_GPUS (default 1) compute-capability 9.0 devices
 *                with 227 KiB of opt-in shared memory, as an H100/H200
 *   "stuck"      as no_gpus, but no event ever completes
 *                (CUDA_ERROR_NOT_READY), like work waiting on a dead peer
 * It marks itself as a stand-in (attnjit_stand_in_host_memory): with
 * AJ_CUDA_EMULATE=1 attnjit runs each launch again on its emulator over
 * this library's device memory, which is host memory (docs/design.md
 * "Emulated launches"), so the GPU path's results are real numbers;
 * FAKE_CUDA_NOT_HOST=1 makes it answer as a real driver would (no).
 * FAKE_CUDA_STUCK=1 makes any mode's GPU work never end: events stay
 * CUDA_ERROR_NOT_READY and cuCtxSynchronize, cuStreamSynchronize and
 * cuEventSynchronize block (for FAKE_CUDA_HANG_S seconds, default 3600),
 * as the driver does for a kernel that waits on a peer that died.
 * Built with FAKE_CUDA_OLD_DRIVER it lacks cuLaunchKernel, like a driver
 * too old for attnjit.
 *
 * What it enforces, as the driver does:
 *   - device memory comes from cuMemAlloc and is told apart from host
 *     memory by a registry of allocations.  A copy whose device side is not
 *     device memory fails with CUDA_ERROR_INVALID_VALUE; a kernel given an
 *     8-byte parameter that points into pageable host memory (a mapping of
 *     /proc/self/maps outside the registry) faults: the launch returns
 *     CUDA_SUCCESS and the
 *     context is poisoned, every later call answering
 *     CUDA_ERROR_ILLEGAL_ADDRESS (a fault is sticky, as on a GPU).
 *   - an async copy from or to pageable host memory is logged "staged":
 *     the real driver makes it synchronous.
 *   - parameters are sized by the module's PTX (.u32/.u64 ...).
 *   - a stream capture (cuStreamBeginCapture_v2 .. cuStreamEndCapture)
 *     records its stream's work into a graph that cuGraphLaunch replays,
 *     and refuses what a capture forbids ("graph capture" below).
 *   - an unloaded module's functions are dead: launching one, getting one
 *     or unloading the module again is CUDA_ERROR_INVALID_HANDLE (its
 *     memory is kept, so the mistake is an error, not a use after free);
 *     fake_cuda_live_modules() counts the modules loaded and not unloaded.
 * What it records: one line per call in a log the tests read through
 * fake_cuda_log() (dlsym), with the stream each operation went to
 * (stream=0 is the legacy default stream, stream=N the N-th created):
 *
 *   MemAlloc bytes=64 / MemFree / MemAllocHost bytes=64
 *   MemcpyHtoD bytes=64 (synchronous) / MemcpyDtoH bytes=64
 *   MemcpyHtoDAsync bytes=64 stream=1 [staged]
 *   MemcpyDtoDAsync bytes=64 stream=1 / Memcpy2DAsync DtoD width=64 height=2 stream=1
 *   MemsetD32Async words=16 stream=1
 *   LaunchKernel fn=NAME grid=4,2,1 stream=1
 *   ByValue fn=NAME param=1 bytes=128 head=0x...,0x... (after its
 *   LaunchKernel, for a by-value `.param .align A .b8 NAME[N]`: the size
 *   the PTX declares and the first two 8-byte words the driver copies)
 *   CtxSynchronize / StreamSynchronize stream=1 / EventSynchronize event=2
 *   EventRecord event=2 stream=1 / StreamWaitEvent stream=2 event=1
 *   EventElapsedTime_v2 start=1 end=2 (or " v1": the old entry point)
 *   DevicePrimaryCtxRetain dev=1 / LinkComplete / ModuleLoadData cubin
 *   ModuleUnload
 *
 * (and, with FAKE_CUDA_LOG=PREFIX, into the file PREFIX.PID as it goes)
 * Streams and events are done at once (the work is done when queued);
 * the order a GPU would give them is modelled ("stream order" below), and
 * an access out of that order is logged as a RACE.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stand_in_log.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

enum {
    SUCCESS = 0,
    INVALID_VALUE = 1,
    OUT_OF_MEMORY = 2,
    NO_DEVICE = 100,
    INVALID_IMAGE = 200,
    INVALID_HANDLE = 400,
    NOT_FOUND = 500,
    NOT_READY = 600,
    ILLEGAL_ADDRESS = 700,
};

static const char *mode(void)
{
    const char *m = getenv("FAKE_CUDA_MODE");
    return m ? m : "no_device";
}

static int mode_is(const char *m)
{
    return strcmp(mode(), m) == 0;
}

static int stuck(void)
{
    const char *s = getenv("FAKE_CUDA_STUCK");
    return mode_is("stuck") || (s && strcmp(s, "1") == 0);
}

/* ---------------------------------------------------------------- log */

const char *fake_cuda_log(void);
const char *fake_cuda_log(void)
{
    return log_text;
}

/* FAKE_CUDA_LOG=PREFIX: the log is also written to PREFIX.PID, after each
 * line, for tests that run attnjit as a program (test_cli_ring.sh): a rank
 * that mpiexec kills when another exits with an error never runs its exit
 * handlers, and its lines must still be there. */
static void write_log(void)
{
    const char *prefix = getenv("FAKE_CUDA_LOG");
    if (!prefix || !*prefix)
        return;
    char path[512];
    snprintf(path, sizeof path, "%s.%ld", prefix, (long)getpid());
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(log_text, f);
        fclose(f);
    }
}

__attribute__((constructor)) static void open_log(void)
{
    const char *prefix = getenv("FAKE_CUDA_LOG");
    if (prefix && *prefix)
        log_sink = write_log;
}

void fake_cuda_log_clear(void);
void fake_cuda_log_clear(void)
{
    log_clear();
}

/* A blocking wait for work that never ends. */
static void hang(const char *what)
{
    if (!stuck())
        return;
    note("%s HANGS", what);
    const char *s = getenv("FAKE_CUDA_HANG_S");
    sleep(s ? (unsigned)atoi(s) : 3600);
}

/* ---------------------------------------------------------------- memory */

typedef struct region {
    uintptr_t base;
    size_t bytes;
    int pinned;               /* cuMemAllocHost: host memory the GPU can map */
} region;

enum { MAX_REGIONS = 4096 };
static region regions[MAX_REGIONS];
static int num_regions;
static CUresult sticky;       /* a kernel fault poisons the context */

static const region *find(uintptr_t p, size_t bytes)
{
    for (int i = 0; i < num_regions; i++)
        if (p >= regions[i].base && p + bytes <= regions[i].base + regions[i].bytes)
            return &regions[i];
    return NULL;
}

static int is_device(uintptr_t p, size_t bytes)
{
    const region *r = find(p, bytes);
    return r && !r->pinned;
}

static int is_pinned(const void *p, size_t bytes)
{
    const region *r = find((uintptr_t)p, bytes);
    return r && r->pinned;
}

static CUresult track(void *m, size_t bytes, int pinned)
{
    if (!m)
        return OUT_OF_MEMORY;
    if (num_regions == MAX_REGIONS) {
        free(m);
        return OUT_OF_MEMORY;
    }
    regions[num_regions++] = (region){(uintptr_t)m, bytes, pinned};
    return SUCCESS;
}

static CUresult untrack(uintptr_t p, int pinned)
{
    for (int i = 0; i < num_regions; i++)
        if (regions[i].base == p && regions[i].pinned == pinned) {
            regions[i] = regions[--num_regions];
            free((void *)p);
            return SUCCESS;
        }
    return INVALID_VALUE;
}

/* ---------------------------------------------------------------- init */

/* The mark attnjit's driver loader looks for (runtime/cuda/driver.c):
 * device memory here is host memory, so AJ_CUDA_EMULATE=1 may run every
 * launch again on the emulator over it. */
int attnjit_stand_in_host_memory(void);
int attnjit_stand_in_host_memory(void)
{
    const char *v = getenv("FAKE_CUDA_NOT_HOST");   /* plays a real driver's memory */
    return !(v && strcmp(v, "1") == 0);
}

CUresult cuInit(unsigned flags);
CUresult cuInit(unsigned flags)
{
    (void)flags;
    return mode_is("no_device") ? NO_DEVICE : SUCCESS;
}

CUresult cuDriverGetVersion(int *v);
CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return SUCCESS;
}

static int gpu_count(void)
{
    if (mode_is("old_gpu"))
        return 1;
    if (!mode_is("gpu"))
        return 0;
    const char *n = getenv("FAKE_CUDA_GPUS");
    return n ? atoi(n) : 1;
}

CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGetCount(int *n)
{
    *n = gpu_count();
    return SUCCESS;
}

CUresult cuDeviceGet(int *d, int i);
CUresult cuDeviceGet(int *d, int i)
{
    if (i < 0 || i >= gpu_count())
        return 101;   /* CUDA_ERROR_INVALID_DEVICE */
    *d = i;
    return SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, int d);
CUresult cuDeviceGetName(char *name, int len, int d)
{
    (void)d;
    snprintf(name, (size_t)len, "%s", mode_is("gpu") ? "Fake GPU H200" : "Fake GPU T4");
    return SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, int attrib, int d);
CUresult cuDeviceGetAttribute(int *v, int attrib, int d)
{
    (void)d;
    const int gpu = mode_is("gpu");
    switch (attrib) {
    case 16: *v = gpu ? 132 : 40; break;         /* MULTIPROCESSOR_COUNT */
    case 75: *v = gpu ? 9 : 7; break;            /* COMPUTE_CAPABILITY_MAJOR */
    case 76: *v = gpu ? 0 : 5; break;            /* COMPUTE_CAPABILITY_MINOR */
    case 97: *v = gpu ? 232448 : 65536; break;   /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    default: *v = 65536;
    }
    return SUCCESS;
}

CUresult cuGetErrorName(CUresult r, const char **s);
CUresult cuGetErrorName(CUresult r, const char **s)
{
    *s = r == NO_DEVICE ? "CUDA_ERROR_NO_DEVICE" : r == INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE"
       : r == ILLEGAL_ADDRESS ? "CUDA_ERROR_ILLEGAL_ADDRESS" : r == NOT_READY
       ? "CUDA_ERROR_NOT_READY" : r == 900 ? "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
       : r == 901 ? "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED" : "CUDA_ERROR_UNKNOWN";
    return SUCCESS;
}

CUresult cuGetErrorString(CUresult r, const char **s);
CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = r == NO_DEVICE ? "no CUDA-capable device is detected"
       : r == INVALID_VALUE ? "invalid argument"
       : r == ILLEGAL_ADDRESS ? "an illegal memory access was encountered"
       : r == 900 ? "operation not permitted when stream is capturing" : "unknown error";
    return SUCCESS;
}

/* ---------------------------------------------------------------- context */

static int primary_context[16];

CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev);
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev)
{
    if (dev < 0 || dev >= 16 || dev >= gpu_count())
        return 101;
    note("DevicePrimaryCtxRetain dev=%d", dev);
    *ctx = &primary_context[dev];
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(int dev);
CUresult cuDevicePrimaryCtxRelease_v2(int dev)
{
    (void)dev;
    return SUCCESS;
}

static _Thread_local void *current;   /* a thread's current context, as the driver's */

CUresult cuCtxPushCurrent_v2(void *ctx);
CUresult cuCtxPushCurrent_v2(void *ctx)
{
    current = ctx;
    return SUCCESS;
}

CUresult cuCtxPopCurrent_v2(void **ctx);
CUresult cuCtxPopCurrent_v2(void **ctx)
{
    if (ctx)
        *ctx = current;
    return SUCCESS;
}

CUresult cuCtxGetDevice(int *dev);
CUresult cuCtxGetDevice(int *dev)
{
    *dev = current ? (int)((int *)current - primary_context) : 0;
    return SUCCESS;
}

/* ---------------------------------------------------------------- graph capture */

/*
 * Stream capture as the driver's global mode (CU_STREAM_CAPTURE_MODE_GLOBAL,
 * what torch.cuda.graph uses): between cuStreamBeginCapture_v2 and
 * cuStreamEndCapture on a stream, the work queued there -- and on a stream
 * that waits on an event recorded in the capture, which joins it -- is
 * recorded as the graph's nodes instead of done: async copies and memsets,
 * kernel launches, event records and waits.  While a capture is open, a
 * call a capture forbids fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
 * logged "CAPTURE REFUSED <call>", and invalidates the capture
 * (cuStreamEndCapture then answers CUDA_ERROR_STREAM_CAPTURE_INVALIDATED):
 * allocating or freeing memory, a synchronous copy or memset, synchronising
 * the context, a stream or an event, querying an event, loading a module.
 * cuGraphLaunch replays an instantiated graph's nodes in order: the copies
 * and memsets again, each kernel logged "GraphKernel fn=NAME grid=X,Y,Z"
 * (the stand-in runs no kernel), each host function (cuLaunchHostFunc)
 * called -- so attnjit's emulated launches, which queue the twin's run as
 * one inside a capture, compute again at every replay.
 */
enum { CAPTURE_UNSUPPORTED = 900, CAPTURE_INVALIDATED = 901, CAPTURE_STREAMS = 64,
       GRAPH_NODES = 512 };

typedef struct graph_node {
    enum { NODE_COPY, NODE_SET32, NODE_KERNEL, NODE_EVENT, NODE_HOST } kind;
    void *dst;
    const void *src;
    size_t n;
    unsigned value;
    char what[160];
    void (*fn)(void *);   /* NODE_HOST: cuLaunchHostFunc's */
    void *user;
} graph_node;

typedef struct graph {
    int num_nodes;
    graph_node nodes[GRAPH_NODES];
} graph;

static struct {
    int open, invalid, origin;
    unsigned char joined[CAPTURE_STREAMS];
    graph *g;
} capture;

static int stream_id(const void *s);

/* Whether work queued on stream s is recorded (s is in the open capture). */
static int capturing(const void *s)
{
    const int id = stream_id(s);
    return capture.open && id < CAPTURE_STREAMS && capture.joined[id];
}

/* The calling thread's capture mode is relaxed (cuThreadExchangeStreamCaptureMode):
 * the calls a capture forbids are its own business. */
static _Thread_local int relaxed;

CUresult cuThreadExchangeStreamCaptureMode(int *mode);
CUresult cuThreadExchangeStreamCaptureMode(int *mode)
{
    const int was = relaxed ? 2 : 0;   /* CU_STREAM_CAPTURE_MODE_RELAXED, _GLOBAL */
    relaxed = *mode == 2;
    *mode = was;
    return SUCCESS;
}

/* A call a capture forbids: refused (and the capture invalidated) while
 * one is open, unless the calling thread is relaxed. */
static int refused(const char *call)
{
    if (relaxed || !capture.open)   /* (a relaxed thread never looks at the capture) */
        return 0;
    capture.invalid = 1;
    note("CAPTURE REFUSED %s", call);
    return 1;
}

/* The open capture's next node, described by `fmt` (NULL, the capture
 * invalidated, when the graph is full). */
static graph_node *record(int kind, void *dst, const void *src, size_t n, unsigned value,
                          const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static graph_node *record(int kind, void *dst, const void *src, size_t n, unsigned value,
                          const char *fmt, ...)
{
    graph *g = capture.g;
    if (g->num_nodes == GRAPH_NODES) {
        capture.invalid = 1;
        return NULL;
    }
    graph_node *node = &g->nodes[g->num_nodes++];
    *node = (graph_node){kind, dst, src, n, value, "", NULL, NULL};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(node->what, sizeof node->what, fmt, ap);
    va_end(ap);
    return node;
}

CUresult cuStreamBeginCapture_v2(void *s, int mode);
CUresult cuStreamBeginCapture_v2(void *s, int mode)
{
    const int id = stream_id(s);
    if (capture.open || id == 0 || id >= CAPTURE_STREAMS || mode != 0)
        return INVALID_VALUE;   /* one capture, on a created stream, global mode */
    graph *g = calloc(1, sizeof *g);
    if (!g)
        return OUT_OF_MEMORY;
    memset(&capture, 0, sizeof capture);
    capture.open = 1;
    capture.origin = id;
    capture.joined[id] = 1;
    capture.g = g;
    note("StreamBeginCapture stream=%d", id);
    return SUCCESS;
}

CUresult cuStreamIsCapturing(void *s, int *status);
CUresult cuStreamIsCapturing(void *s, int *status)
{
    *status = capturing(s);   /* CU_STREAM_CAPTURE_STATUS_ACTIVE = 1 */
    return SUCCESS;
}

CUresult cuStreamEndCapture(void *s, graph **out);
CUresult cuStreamEndCapture(void *s, graph **out)
{
    if (!capture.open || stream_id(s) != capture.origin)
        return INVALID_VALUE;
    graph *g = capture.g;
    const int invalid = capture.invalid;
    note("StreamEndCapture stream=%d nodes=%d%s", capture.origin, g->num_nodes,
         invalid ? " INVALIDATED" : "");
    memset(&capture, 0, sizeof capture);
    *out = invalid ? NULL : g;
    if (invalid)
        free(g);
    return invalid ? CAPTURE_INVALIDATED : SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(graph **exec, const graph *g, unsigned long long flags);
CUresult cuGraphInstantiateWithFlags(graph **exec, const graph *g, unsigned long long flags)
{
    if (!g || flags)
        return INVALID_VALUE;
    *exec = malloc(sizeof **exec);
    if (!*exec)
        return OUT_OF_MEMORY;
    **exec = *g;
    return SUCCESS;
}

CUresult cuGraphLaunch(const graph *exec, void *s);
CUresult cuGraphLaunch(const graph *exec, void *s)
{
    if (sticky)
        return sticky;
    if (!exec || refused("GraphLaunch"))
        return exec ? CAPTURE_UNSUPPORTED : INVALID_VALUE;
    note("GraphLaunch nodes=%d stream=%d", exec->num_nodes, stream_id(s));
    for (int i = 0; i < exec->num_nodes; i++) {
        const graph_node *node = &exec->nodes[i];
        if (node->kind == NODE_COPY)
            memmove(node->dst, node->src, node->n);
        for (size_t w = 0; node->kind == NODE_SET32 && w < node->n; w++)
            memcpy((char *)node->dst + 4 * w, &node->value, 4);
        if (node->kind == NODE_KERNEL)
            note("GraphKernel %s", node->what);
        if (node->kind == NODE_HOST)
            node->fn(node->user);
    }
    return SUCCESS;
}

/* A host function in stream order: called now (the stand-in's streams are
 * done when queued), or recorded in a capture. */
CUresult cuLaunchHostFunc(void *s, void (*fn)(void *), void *user);
CUresult cuLaunchHostFunc(void *s, void (*fn)(void *), void *user)
{
    if (sticky)
        return sticky;
    if (!capturing(s)) {
        note("LaunchHostFunc stream=%d", stream_id(s));
        fn(user);
        return SUCCESS;
    }
    graph_node *node = record(NODE_HOST, NULL, NULL, 0, 0, "LaunchHostFunc");
    if (node)
        node->fn = fn, node->user = user;
    return SUCCESS;
}

CUresult cuGraphExecDestroy(graph *exec);
CUresult cuGraphExecDestroy(graph *exec)
{
    free(exec);
    return SUCCESS;
}

CUresult cuGraphDestroy(graph *g);
CUresult cuGraphDestroy(graph *g)
{
    free(g);
    return SUCCESS;
}

CUresult cuCtxSynchronize(void);
static void host_sees_all(void);
CUresult cuCtxSynchronize(void)
{
    if (refused("CtxSynchronize"))
        return CAPTURE_UNSUPPORTED;
    note("CtxSynchronize");
    hang("CtxSynchronize");
    host_sees_all();
    return sticky;
}

/* ---------------------------------------------------------------- memory */

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes)
{
    if (bytes == 0)
        return INVALID_VALUE;   /* as the driver answers */
    if (sticky)
        return sticky;
    if (refused("MemAlloc"))
        return CAPTURE_UNSUPPORTED;
    note("MemAlloc bytes=%zu", bytes);
    void *m = aligned_alloc(256, (bytes + 255) & ~(size_t)255);   /* the driver's alignment */
    *p = (CUdeviceptr)(uintptr_t)m;
    return track(m, bytes, 0);
}

CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemFree_v2(CUdeviceptr p)
{
    if (refused("MemFree"))
        return CAPTURE_UNSUPPORTED;
    note("MemFree");
    return untrack((uintptr_t)p, 0);
}

CUresult cuMemAllocHost_v2(void **p, size_t bytes);
CUresult cuMemAllocHost_v2(void **p, size_t bytes)
{
    if (refused("MemAllocHost"))
        return CAPTURE_UNSUPPORTED;
    note("MemAllocHost bytes=%zu", bytes);
    *p = malloc(bytes ? bytes : 1);
    return track(*p, bytes ? bytes : 1, 1);
}

CUresult cuMemFreeHost(void *p);
CUresult cuMemFreeHost(void *p)
{
    if (refused("MemFreeHost"))
        return CAPTURE_UNSUPPORTED;
    return untrack((uintptr_t)p, 1);
}

/* ---------------------------------------------------------------- stream order */

/*
 * The stand-in does a stream's work when it is queued, so a program that
 * forgets a wait still gets the right bytes here -- and not on a GPU.  The
 * model below keeps the order a GPU would give: a vector clock per stream
 * (entry s: the operations queued on stream s), joined by cuStreamWaitEvent
 * with the clock an event recorded, and a host clock (per thread) joined wherever the
 * host sees work finish (cuEventQuery answering success, the
 * synchronisations, a synchronous copy), which every operation queued
 * after it follows.  Each operation's device memory accesses are kept
 * (copies and memsets here; a kernel's, which attnjit's emulated launches
 * report through attnjit_stand_in_access; NCCL's, which the stand-in
 * libnccl reports through fake_cuda_queue_access), and an access that
 * overlaps an earlier one on another stream, one of them a write, without
 * the earlier being ordered before it, is logged
 *
 *   RACE RAW|WAR|WAW: <what> (<read|write>, stream S) after <what> (...)
 *
 * and counted (fake_cuda_races).  Streams past ORDER_STREAMS turn the
 * model off (logged once).
 */
enum { ORDER_STREAMS = 64, ORDER_RECORDS = 4096 };

typedef struct vclock {
    uint32_t t[ORDER_STREAMS];
} vclock;

typedef struct access_rec {
    uintptr_t lo, hi;
    int stream, write;
    uint32_t at;                 /* the operation: entry `stream` of its clock */
    char what[48];
} access_rec;

static vclock stream_clock[ORDER_STREAMS];
/* what the calling thread has seen finish: a thread that sees an event
 * done (attnjit's watchdog of asynchronous ring calls) orders nothing the
 * other threads queue */
static _Thread_local vclock host_clock;
static access_rec records[ORDER_RECORDS];
static int num_records, next_record, order_off, races;

int fake_cuda_races(void);
int fake_cuda_races(void)
{
    return races;
}

static void join(vclock *a, const vclock *b)
{
    for (int i = 0; i < ORDER_STREAMS; i++)
        if (b->t[i] > a->t[i])
            a->t[i] = b->t[i];
}

static int order_on(int s)
{
    if (s < ORDER_STREAMS)
        return !order_off;
    if (!order_off)
        note("ORDER off: more than %d streams", ORDER_STREAMS);
    order_off = 1;
    return 0;
}

/* A new operation on stream s: after the stream's earlier work and what
 * the host has seen finish. */
static void stream_op(int s)
{
    if (!order_on(s))
        return;
    join(&stream_clock[s], &host_clock);
    stream_clock[s].t[s]++;
}

/* The host has seen stream s's work so far finish. */
static void host_sees(int s)
{
    if (order_on(s))
        join(&host_clock, &stream_clock[s]);
}

static void host_sees_all(void)
{
    for (int s = 0; s < ORDER_STREAMS; s++)
        host_sees(s);
}

/* Stream s's latest operation reads (writes) [p, p + bytes); device
 * memory only. */
static void access_at(int s, const void *p, size_t bytes, int write, const char *what)
{
    const uintptr_t lo = (uintptr_t)p, hi = lo + bytes;
    if (!order_on(s) || bytes == 0 || !find(lo, 1))
        return;
    const vclock *now = &stream_clock[s];
    int seen = 0;   /* the kinds reported for this access: each once */
    for (int i = 0; i < num_records; i++) {
        const access_rec *r = &records[i];
        if (r->hi <= lo || r->lo >= hi || (!r->write && !write) || r->at <= now->t[r->stream])
            continue;
        const int kind = r->write ? (write ? 4 : 1) : 2;   /* RAW 1, WAR 2, WAW 4 */
        if (seen & kind)
            continue;
        seen |= kind;
        races++;
        note("RACE %s: %s (%s, stream %d) after %s (%s, stream %d) at 0x%llx: not ordered by "
             "an event or a host wait", kind == 1 ? "RAW" : kind == 2 ? "WAR" : "WAW", what,
             write ? "write" : "read", s, r->what, r->write ? "write" : "read", r->stream,
             (unsigned long long)(lo > r->lo ? lo : r->lo));
    }
    access_rec *slot = num_records < ORDER_RECORDS ? &records[num_records++]
                                                   : &records[next_record++ % ORDER_RECORDS];
    *slot = (access_rec){lo, hi, s, write, now->t[s], ""};
    snprintf(slot->what, sizeof slot->what, "%s", what);
}

/* ---------------------------------------------------------------- streams */

/* A stream or event is a small number: its place in creation order; an
 * event also holds the clock it recorded. */
typedef struct handle {
    int id;
} handle;

typedef struct event {
    int id;
    vclock clock;
    int captured;   /* recorded in the open capture (graph capture) */
} event;

static int next_stream = 1, next_event = 1;

static int stream_id(const void *s)
{
    return s ? ((const handle *)s)->id : 0;
}

/* A kernel's access, reported by attnjit's emulated launch after it ran
 * (the stream's latest operation is that launch). */
void attnjit_stand_in_access(void *stream, const void *p, size_t bytes, int write,
                             const char *what);
void attnjit_stand_in_access(void *stream, const void *p, size_t bytes, int write,
                             const char *what)
{
    access_at(stream_id(stream), p, bytes, write, what);
}

/* An access of a new operation on `stream` (the stand-in libnccl's sends
 * and receives). */
void fake_cuda_queue_access(void *stream, const void *p, size_t bytes, int write,
                            const char *what);
void fake_cuda_queue_access(void *stream, const void *p, size_t bytes, int write,
                            const char *what)
{
    stream_op(stream_id(stream));
    access_at(stream_id(stream), p, bytes, write, what);
}

CUresult cuStreamCreate(void **s, unsigned flags);
CUresult cuStreamCreate(void **s, unsigned flags)
{
    handle *h = malloc(sizeof *h);
    if (!h)
        return OUT_OF_MEMORY;
    h->id = next_stream++;
    note("StreamCreate stream=%d flags=%u", h->id, flags);
    *s = h;
    return SUCCESS;
}

CUresult cuStreamDestroy_v2(void *s);
CUresult cuStreamDestroy_v2(void *s)
{
    note("StreamDestroy stream=%d", stream_id(s));
    free(s);
    return SUCCESS;
}

CUresult cuStreamSynchronize(void *s);
CUresult cuStreamSynchronize(void *s)
{
    if (refused("StreamSynchronize"))
        return CAPTURE_UNSUPPORTED;
    note("StreamSynchronize stream=%d", stream_id(s));
    hang("StreamSynchronize");
    host_sees(stream_id(s));
    return sticky;
}

CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags);
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags)
{
    (void)flags;
    if (capture.open && ((const event *)e)->captured && stream_id(s) < CAPTURE_STREAMS)
        capture.joined[stream_id(s)] = 1;   /* a fork into the capture */
    if (capturing(s)) {
        record(NODE_EVENT, NULL, NULL, 0, 0, "StreamWaitEvent stream=%d event=%d", stream_id(s),
               stream_id(e));
        return SUCCESS;
    }
    note("StreamWaitEvent stream=%d event=%d", stream_id(s), stream_id(e));
    if (order_on(stream_id(s)))
        join(&stream_clock[stream_id(s)], &((const event *)e)->clock);
    return sticky;
}

/* stream-ordered: the stand-in's streams are done when queued */
CUresult cuMemFreeAsync(CUdeviceptr p, void *s);
CUresult cuMemFreeAsync(CUdeviceptr p, void *s)
{
    if (refused("MemFreeAsync"))   /* (a graph's own frees are not modelled) */
        return CAPTURE_UNSUPPORTED;
    note("MemFreeAsync stream=%d", stream_id(s));
    return untrack((uintptr_t)p, 0);
}

CUresult cuEventCreate(void **e, unsigned flags);
CUresult cuEventCreate(void **e, unsigned flags)
{
    (void)flags;
    event *h = calloc(1, sizeof *h);
    if (!h)
        return OUT_OF_MEMORY;
    h->id = next_event++;
    *e = h;
    return SUCCESS;
}

CUresult cuEventDestroy_v2(void *e);
CUresult cuEventDestroy_v2(void *e)
{
    free(e);
    return SUCCESS;
}

CUresult cuEventRecord(void *e, void *s);
CUresult cuEventRecord(void *e, void *s)
{
    ((event *)e)->captured = capturing(s);
    if (capturing(s)) {   /* (a join back from a forked stream needs no more here) */
        record(NODE_EVENT, NULL, NULL, 0, 0, "EventRecord event=%d stream=%d", stream_id(e),
               stream_id(s));
        return SUCCESS;
    }
    note("EventRecord event=%d stream=%d", stream_id(e), stream_id(s));
    const int id = stream_id(s);
    if (order_on(id)) {   /* the stream's work so far, and what the host saw first */
        join(&stream_clock[id], &host_clock);
        ((event *)e)->clock = stream_clock[id];
    }
    return sticky;
}

/* The calling thread's cuEventQuery calls (not logged: attnjit polls
 * with them): a call that returns before its work is done makes none. */
static _Thread_local int event_queries;
int fake_cuda_event_queries(void);
int fake_cuda_event_queries(void)
{
    return event_queries;
}

CUresult cuEventQuery(void *e);
CUresult cuEventQuery(void *e)
{
    event_queries++;
    if (sticky)
        return sticky;
    if (refused("EventQuery"))
        return CAPTURE_UNSUPPORTED;
    if (stuck())
        return NOT_READY;
    join(&host_clock, &((const event *)e)->clock);
    return SUCCESS;
}

CUresult cuEventSynchronize(void *e);
CUresult cuEventSynchronize(void *e)
{
    if (refused("EventSynchronize"))
        return CAPTURE_UNSUPPORTED;
    note("EventSynchronize event=%d", stream_id(e));
    hang("EventSynchronize");
    join(&host_clock, &((const event *)e)->clock);
    return sticky;
}

/* Both entry points, told apart in the log: CUDA 13's cuda.h maps the
 * name to _v2, the one attnjit must bind where the driver has it. */
static CUresult elapsed(float *ms, const void *start, const void *end, const char *which)
{
    note("EventElapsedTime%s start=%d end=%d", which, stream_id(start), stream_id(end));
    *ms = 1.0f;
    return sticky;
}

CUresult cuEventElapsedTime_v2(float *ms, void *start, void *end);
CUresult cuEventElapsedTime_v2(float *ms, void *start, void *end)
{
    return elapsed(ms, start, end, "_v2");
}

CUresult cuEventElapsedTime(float *ms, void *start, void *end);
CUresult cuEventElapsedTime(float *ms, void *start, void *end)
{
    return elapsed(ms, start, end, " v1");
}

/* ---------------------------------------------------------------- copies */

/* A copy's device side must be device memory (else INVALID_VALUE); an
 * async copy's host side in pageable memory is "staged" (synchronous). */
static CUresult copy(const char *what, void *dst, const void *src, size_t n, int dst_dev,
                     int src_dev, const void *stream, int async)
{
    if (sticky)
        return sticky;
    if (!dst || !src)
        return INVALID_VALUE;
    if ((dst_dev && !is_device((uintptr_t)dst, n)) || (src_dev && !is_device((uintptr_t)src, n))) {
        note("%s bytes=%zu REJECTED: the device side is not device memory", what, n);
        return INVALID_VALUE;
    }
    if (!async && refused(what))
        return CAPTURE_UNSUPPORTED;
    if (async && capturing(stream)) {
        record(NODE_COPY, dst, src, n, 0, "%s", what);
        return SUCCESS;
    }
    int staged = async && ((!dst_dev && !is_pinned(dst, n)) || (!src_dev && !is_pinned(src, n)));
    if (async)
        note("%s bytes=%zu stream=%d%s", what, n, stream_id(stream), staged ? " staged" : "");
    else
        note("%s bytes=%zu", what, n);
    const int s = async ? stream_id(stream) : 0;
    stream_op(s);
    if (src_dev)
        access_at(s, src, n, 0, what);
    if (dst_dev)
        access_at(s, dst, n, 1, what);
    if (!async || staged)   /* the host waits for it */
        host_sees(s);
    memmove(dst, src, n);
    return SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    return copy("MemcpyHtoD", (void *)(uintptr_t)dst, src, n, 1, 0, NULL, 0);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    return copy("MemcpyDtoH", dst, (const void *)(uintptr_t)src, n, 0, 1, NULL, 0);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *s)
{
    return copy("MemcpyHtoDAsync", (void *)(uintptr_t)dst, src, n, 1, 0, s, 1);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, void *s)
{
    return copy("MemcpyDtoHAsync", dst, (const void *)(uintptr_t)src, n, 0, 1, s, 1);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, void *s)
{
    return copy("MemcpyDtoDAsync", (void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, 1,
                1, s, 1);
}

/* cuda.h's CUDA_MEMCPY2D (v2); memory types host 1, device 2 */
typedef struct memcpy2d {
    size_t src_x, src_y;
    int src_type;
    const void *src_host;
    CUdeviceptr src_device;
    void *src_array;
    size_t src_pitch;
    size_t dst_x, dst_y;
    int dst_type;
    void *dst_host;
    CUdeviceptr dst_device;
    void *dst_array;
    size_t dst_pitch;
    size_t width, height;
} memcpy2d;

CUresult cuMemcpy2DAsync_v2(const memcpy2d *c, void *s);
CUresult cuMemcpy2DAsync_v2(const memcpy2d *c, void *s)
{
    if (sticky)
        return sticky;
    if (c->width > c->src_pitch || c->width > c->dst_pitch || c->src_x || c->src_y ||
        c->dst_x || c->dst_y)
        return INVALID_VALUE;   /* what attnjit never asks */
    const char *src = c->src_type == 2 ? (const char *)(uintptr_t)c->src_device : c->src_host;
    char *dst = c->dst_type == 2 ? (char *)(uintptr_t)c->dst_device : c->dst_host;
    const size_t src_span = c->height ? (c->height - 1) * c->src_pitch + c->width : 0;
    const size_t dst_span = c->height ? (c->height - 1) * c->dst_pitch + c->width : 0;
    if ((c->src_type == 2 && !is_device((uintptr_t)src, src_span)) ||
        (c->dst_type == 2 && !is_device((uintptr_t)dst, dst_span))) {
        note("Memcpy2DAsync width=%zu height=%zu REJECTED: the device side is not device "
             "memory", c->width, c->height);
        return INVALID_VALUE;
    }
    if (capturing(s)) {   /* a row at a time */
        for (size_t r = 0; r < c->height; r++)
            record(NODE_COPY, dst + r * c->dst_pitch, src + r * c->src_pitch, c->width, 0,
                   "Memcpy2DAsync");
        return SUCCESS;
    }
    note("Memcpy2DAsync %s width=%zu height=%zu stream=%d",
         c->src_type == 2 ? (c->dst_type == 2 ? "DtoD" : "DtoH") : "HtoD", c->width, c->height,
         stream_id(s));
    stream_op(stream_id(s));   /* (the rows' span, gaps included) */
    if (c->src_type == 2)
        access_at(stream_id(s), src, src_span, 0, "Memcpy2DAsync");
    if (c->dst_type == 2)
        access_at(stream_id(s), dst, dst_span, 1, "Memcpy2DAsync");
    for (size_t r = 0; r < c->height; r++)
        memmove(dst + r * c->dst_pitch, src + r * c->src_pitch, c->width);
    return SUCCESS;
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n)
{
    if (sticky)
        return sticky;
    if (!is_device((uintptr_t)dst, n))
        return INVALID_VALUE;
    if (refused("MemsetD8"))
        return CAPTURE_UNSUPPORTED;
    note("MemsetD8 bytes=%zu", n);
    stream_op(0);
    access_at(0, (void *)(uintptr_t)dst, n, 1, "MemsetD8");
    host_sees(0);
    memset((void *)(uintptr_t)dst, value, n);
    return SUCCESS;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, void *s);
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned value, size_t n, void *s)
{
    if (sticky)
        return sticky;
    if (!is_device((uintptr_t)dst, n * 4))
        return INVALID_VALUE;
    if (capturing(s)) {
        record(NODE_SET32, (void *)(uintptr_t)dst, NULL, n, value, "MemsetD32Async");
        return SUCCESS;
    }
    note("MemsetD32Async words=%zu stream=%d", n, stream_id(s));
    stream_op(stream_id(s));
    access_at(stream_id(s), (void *)(uintptr_t)dst, n * 4, 1, "MemsetD32Async");
    for (size_t i = 0; i < n; i++)
        memcpy((char *)(uintptr_t)dst + 4 * i, &value, 4);
    return SUCCESS;
}

/* ---------------------------------------------------------------- modules */

/* A module: the PTX it was made from (a "cubin" from the linker is the
 * PTX behind a tag).  A function: the module and its entry's name. */
typedef struct function function;

typedef struct module {
    char *ptx;             /* NULL once unloaded */
    function *functions;   /* handed out by cuModuleGetFunction, freed with the module */
    struct module *next_dead;
} module;

static _Atomic int live_modules;
static module *_Atomic dead_modules;   /* unloaded, kept (reachable) to tell their use */

int fake_cuda_live_modules(void);
int fake_cuda_live_modules(void)
{
    return live_modules;
}

struct function {
    module *mod;
    char name[128];
    function *next;
};

static const char cubin_tag[] = "FAKE-CUBIN\n";

static CUresult load(module **out, const char *image, const char *how)
{
    if (sticky)
        return sticky;
    if (!image || (strncmp(image, cubin_tag, sizeof cubin_tag - 1) != 0 &&
                   !strstr(image, ".entry")))
        return INVALID_IMAGE;
    if (refused(how))
        return CAPTURE_UNSUPPORTED;
    note("%s", how);
    module *m = calloc(1, sizeof *m);
    if (!m)
        return OUT_OF_MEMORY;
    m->ptx = strdup(image);
    live_modules++;
    *out = m;
    return SUCCESS;
}

CUresult cuModuleLoadDataEx(module **mod, const void *image, unsigned n, int *options,
                            void **values);
CUresult cuModuleLoadDataEx(module **mod, const void *image, unsigned n, int *options,
                            void **values)
{
    (void)n, (void)options, (void)values;
    const char *text = image;
    return load(mod, image, strncmp(text, cubin_tag, sizeof cubin_tag - 1) == 0
                                ? "ModuleLoadDataEx cubin" : "ModuleLoadDataEx ptx");
}

CUresult cuModuleLoadData(module **mod, const void *image);
CUresult cuModuleLoadData(module **mod, const void *image)
{
    const char *text = image;
    return load(mod, image, strncmp(text, cubin_tag, sizeof cubin_tag - 1) == 0
                                ? "ModuleLoadData cubin" : "ModuleLoadData ptx");
}

CUresult cuModuleUnload(module *m);
CUresult cuModuleUnload(module *m)
{
    if (!m || !m->ptx)
        return INVALID_HANDLE;
    note("ModuleUnload");
    free(m->ptx);
    m->ptx = NULL;
    live_modules--;
    m->next_dead = dead_modules;
    while (!atomic_compare_exchange_weak(&dead_modules, &m->next_dead, m))
        ;
    return SUCCESS;
}

/* The `.entry NAME(` of a module's PTX, or NULL. */
static const char *entry_of(const module *m, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = strstr(m->ptx, ".entry "); p; p = strstr(p + 1, ".entry ")) {
        const char *n = p + 7;
        while (*n == ' ')
            n++;
        if (strncmp(n, name, len) == 0 && (n[len] == '(' || n[len] == ' ' || n[len] == '\n'))
            return n + len;
    }
    return NULL;
}

CUresult cuModuleGetFunction(function **f, module *m, const char *name);
CUresult cuModuleGetFunction(function **f, module *m, const char *name)
{
    if (!m || !m->ptx)
        return INVALID_HANDLE;
    if (!entry_of(m, name))
        return NOT_FOUND;
    function *fn = malloc(sizeof *fn);
    if (!fn)
        return OUT_OF_MEMORY;
    fn->mod = m;
    snprintf(fn->name, sizeof fn->name, "%s", name);
    fn->next = m->functions;   /* lives as long as its module, as the driver's do */
    m->functions = fn;
    *f = fn;
    return SUCCESS;
}

CUresult cuFuncSetAttribute(function *f, int attrib, int value);
CUresult cuFuncSetAttribute(function *f, int attrib, int value)
{
    (void)f, (void)attrib, (void)value;
    return SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, int attrib, function *f);
CUresult cuFuncGetAttribute(int *value, int attrib, function *f)
{
    (void)f;
    *value = attrib == 0 ? 1024 : attrib == 4 ? 128 : 0;   /* threads, registers, spills */
    return SUCCESS;
}

#ifndef FAKE_CUDA_OLD_DRIVER   /* a driver without cuLaunchKernel */
/* The byte size of each `.param` of an entry (4 or 8; LLVM's PTX for the
 * CUDA driver interface does not mark pointers: a pointer is an 8-byte
 * value that lies in memory, see host_memory), or a by-value array's N
 * (`.param .align A .b8 NAME[N]`, a CUtensorMap's form). */
static int parse_params(const char *p, int *bytes, int max)
{
    int n = 0;
    const char *end = strchr(p, ')');
    for (const char *q = strstr(p, ".param"); q && q < end && n < max;
         q = strstr(q + 1, ".param")) {
        const char *type = q + 6;
        while (*type == ' ')
            type++;
        const char *array = strchr(type, '[');
        const char *next = strpbrk(type, ",)");
        if (strncmp(type, ".align", 6) == 0 && array && next && array < next)
            bytes[n++] = atoi(array + 1);
        else
            bytes[n++] = strncmp(type + 2, "32", 2) == 0 ? 4 : 8;   /* .u32 .b32 .f32 .s32 */
    }
    return n;
}

/* This process's host mappings (/proc/self/maps), read once per launch
 * and only when a parameter might be an address. */
typedef struct {
    int read;
    size_t n, cap;
    uintptr_t (*range)[2];
} host_maps;

/* Whether v is an address of this process's host memory: a GPU given it
 * faults.  (Nothing is mapped below 64 KiB, vm.mmap_min_addr's default:
 * the sizes and strides among the parameters are not addresses.) */
static int host_memory(host_maps *m, uintptr_t v)
{
    if (v < 65536)
        return 0;
    if (!m->read) {
        m->read = 1;
        FILE *f = fopen("/proc/self/maps", "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            unsigned long lo = 0, hi = 0;
            if (sscanf(line, "%lx-%lx", &lo, &hi) != 2)
                continue;
            if (m->n == m->cap) {
                size_t cap = m->cap ? 2 * m->cap : 256;
                void *grown = realloc(m->range, cap * sizeof *m->range);
                if (!grown)
                    break;
                m->range = grown;
                m->cap = cap;
            }
            m->range[m->n][0] = lo;
            m->range[m->n][1] = hi;
            m->n++;
        }
        if (f)
            fclose(f);
    }
    for (size_t i = 0; i < m->n; i++)
        if (v >= m->range[i][0] && v < m->range[i][1])
            return 1;
    return 0;
}

CUresult cuLaunchKernel(function *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, void *stream, void **params,
                        void **extra);
CUresult cuLaunchKernel(function *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, void *stream, void **params,
                        void **extra)
{
    (void)bx, (void)by, (void)bz, (void)smem, (void)extra;
    if (sticky)
        return sticky;
    if (!f || gx == 0 || gy == 0 || gz == 0 || gy > 65535 || gz > 65535)
        return INVALID_VALUE;
    if (!f->mod->ptx) {
        note("FAULT: %s is a function of an unloaded module", f->name);
        return INVALID_HANDLE;
    }
    if (capturing(stream)) {
        record(NODE_KERNEL, NULL, NULL, 0, 0, "fn=%s grid=%u,%u,%u", f->name, gx, gy, gz);
    } else {
        note("LaunchKernel fn=%s grid=%u,%u,%u stream=%d", f->name, gx, gy, gz,
             stream_id(stream));
        stream_op(stream_id(stream));   /* its accesses: attnjit_stand_in_access */
    }
    int bytes[256];
    int n = parse_params(entry_of(f->mod, f->name), bytes, 256);
    host_maps maps = {0};
    for (int i = 0; i < n; i++) {
        if (bytes[i] > 8) {
            uint64_t head[2];
            memcpy(head, params[i], sizeof head);
            note("ByValue fn=%s param=%d bytes=%d head=0x%llx,0x%llx", f->name, i, bytes[i],
                 (unsigned long long)head[0], (unsigned long long)head[1]);
        }
        if (bytes[i] != 8)
            continue;
        uintptr_t v;
        memcpy(&v, params[i], sizeof v);
        if (v == 0 || find(v, 1) || !host_memory(&maps, v))
            continue;   /* NULL, device or pinned memory, or not an address */
        note("FAULT: %s parameter %d = %p is host memory, not device memory", f->name, i,
             (void *)v);
        sticky = ILLEGAL_ADDRESS;   /* reported by the next synchronising call */
    }
    free(maps.range);
    return SUCCESS;
}
#endif

/* ---------------------------------------------------------------- TMA */

#ifndef FAKE_CUDA_OLD_DRIVER   /* CUDA 12.0's; an old driver lacks it */
/* cuTensorMapEncodeTiled: the driver's documented rules checked (a
 * 64-byte-aligned map, a 16-byte-aligned base, dims 1..2^32, strides
 * multiples of 16 under 2^40, boxes 1..256, the inner box within the
 * swizzle span, unit element strides); the call logged, and the map's
 * first words the base and (rank, swizzle, box 0, box 1), which
 * cuLaunchKernel's log shows where a kernel is handed it. */
CUresult cuTensorMapEncodeTiled(void *map, int type, uint32_t rank, void *base,
                                const uint64_t *dims, const uint64_t *strides,
                                const uint32_t *box, const uint32_t *elem, int interleave,
                                int swizzle, int l2, int oob);
CUresult cuTensorMapEncodeTiled(void *map, int type, uint32_t rank, void *base,
                                const uint64_t *dims, const uint64_t *strides,
                                const uint32_t *box, const uint32_t *elem, int interleave,
                                int swizzle, int l2, int oob)
{
    static const int spans[4] = {0, 32, 64, 128};
    int bytes = type == 6 || type == 9 ? 2 : 0;   /* f16, bf16: what attnjit encodes */
    if (!map || (uintptr_t)map % 64 || (uintptr_t)base % 16 || rank < 1 || rank > 5 ||
        !bytes || interleave || swizzle < 0 || swizzle > 3 || l2 < 0 || l2 > 3 || oob)
        return INVALID_VALUE;
    for (uint32_t i = 0; i < rank; i++) {
        if (dims[i] < 1 || dims[i] > (1ull << 32) || box[i] < 1 || box[i] > 256 || elem[i] != 1)
            return INVALID_VALUE;
        if (i && (strides[i - 1] % 16 || strides[i - 1] >= (1ull << 40)))
            return INVALID_VALUE;
    }
    if (box[0] * bytes % 16 || (swizzle && box[0] * (uint32_t)bytes > (uint32_t)spans[swizzle]))
        return INVALID_VALUE;
    char text[256];
    int n = snprintf(text, sizeof text, "TensorMapEncodeTiled type=%d rank=%u dims=", type, rank);
    for (uint32_t i = 0; i < rank; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s%llu", i ? "," : "",
                      (unsigned long long)dims[i]);
    n += snprintf(text + n, sizeof text - (size_t)n, " strides=");
    for (uint32_t i = 1; i < rank; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s%llu", i > 1 ? "," : "",
                      (unsigned long long)strides[i - 1]);
    n += snprintf(text + n, sizeof text - (size_t)n, " box=");
    for (uint32_t i = 0; i < rank; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s%u", i ? "," : "", box[i]);
    note("%s swizzle=%d", text, swizzle);
    memset(map, 0, 128);
    uint64_t head[2] = {(uint64_t)(uintptr_t)base,
                        rank | (uint64_t)swizzle << 8 | (uint64_t)box[0] << 16 |
                            (uint64_t)box[1] << 32};
    memcpy(map, head, sizeof head);
    return SUCCESS;
}
#endif

/* ---------------------------------------------------------------- linker */

/* cuLinkCreate / AddData / Complete: the "cubin" is the PTX behind a tag,
 * owned by the link state as the driver's is. */
typedef struct link_state {
    char *image;
} link_state;

CUresult cuLinkCreate_v2(unsigned n, int *options, void **values, link_state **out);
CUresult cuLinkCreate_v2(unsigned n, int *options, void **values, link_state **out)
{
    (void)n, (void)options, (void)values;
    if (sticky)
        return sticky;
    link_state *s = calloc(1, sizeof *s);
    if (!s)
        return OUT_OF_MEMORY;
    *out = s;
    return SUCCESS;
}

CUresult cuLinkAddData_v2(link_state *s, int type, void *data, size_t size, const char *name,
                          unsigned n, int *options, void **values);
CUresult cuLinkAddData_v2(link_state *s, int type, void *data, size_t size, const char *name,
                          unsigned n, int *options, void **values)
{
    (void)name, (void)n, (void)options, (void)values;
    if (type != 1 || !strstr(data, ".entry"))   /* CU_JIT_INPUT_PTX */
        return 218;   /* CUDA_ERROR_INVALID_PTX */
    s->image = malloc(sizeof cubin_tag + size);
    if (!s->image)
        return OUT_OF_MEMORY;
    memcpy(s->image, cubin_tag, sizeof cubin_tag - 1);
    memcpy(s->image + sizeof cubin_tag - 1, data, size);
    s->image[sizeof cubin_tag - 1 + size] = '\0';
    return SUCCESS;
}

CUresult cuLinkComplete(link_state *s, void **cubin, size_t *size);
CUresult cuLinkComplete(link_state *s, void **cubin, size_t *size)
{
    if (!s->image)
        return INVALID_VALUE;
    note("LinkComplete");
    *cubin = s->image;
    *size = strlen(s->image) + 1;
    return SUCCESS;
}

CUresult cuLinkDestroy(link_state *s);
CUresult cuLinkDestroy(link_state *s)
{
    free(s->image);
    free(s);
    return SUCCESS;
}
