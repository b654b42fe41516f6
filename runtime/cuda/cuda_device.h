/*
 * cuda_device.h -- a GPU behind the CUDA driver (see driver.c).
 */
#ifndef AJ_RUNTIME_CUDA_DEVICE_H
#define AJ_RUNTIME_CUDA_DEVICE_H

#include <pthread.h>
#include <stdatomic.h>

#include "codegen/codegen.h"
#include "runtime/cuda/cuda_api.h"

/* A kernel loaded on the device: one module per kernel object, one
 * function per stage.  The kernel's release hook unloads it (so no slot
 * outlives its kernel, and a pointer names one kernel here). */
typedef struct aj_cuda_loaded {
    const aj_kernel *kernel;
    CUmodule mod;
    CUfunction fns[AJ_KB_MAX_STAGES];
} aj_cuda_loaded;

/* What the kernels' release hooks hold of a device: the device while it is
 * open (NULL from aj_cuda_device_close on), counted so that it outlives
 * both the device and the kernels. */
typedef struct aj_cuda_anchor {
    pthread_mutex_t lock;        /* guards device; held while a hook unloads */
    struct aj_cuda_device *device;
    atomic_int refs;             /* the device's and one per hook */
} aj_cuda_anchor;

/* A scratch buffer the device owns, for one stream at a time (see
 * aj_cuda_scratch). */
typedef struct aj_cuda_scratch_slot {
    CUstream stream;
    CUdeviceptr ptr;
    size_t bytes;
    CUevent used;                /* recorded after the last work that used it */
    uint64_t last_use;           /* for picking the least recently used */
    int busy;                    /* between aj_cuda_scratch and _release */
} aj_cuda_scratch_slot;

enum { AJ_CUDA_SCRATCH_SLOTS = 16 };

/* A block of pinned host memory the device keeps for reuse (see
 * aj_cuda_host_alloc). */
typedef struct aj_cuda_pinned {
    void *ptr;
    size_t bytes;
    int busy;
} aj_cuda_pinned;

enum { AJ_CUDA_PINNED_BLOCKS = 32 };

typedef struct aj_cuda_device {
    const aj_cuda *cu;
    CUdevice dev;
    CUcontext cuctx;
    int owns_primary;            /* retained the primary context: release it */
    int cc_major, cc_minor, smem_optin, sm_count;
    aj_target target;            /* what its kernels are compiled for */
    char name[128];
    pthread_mutex_t lock;        /* guards loaded */
    aj_cuda_anchor *anchor;
    aj_cuda_loaded *loaded;
    size_t num_loaded, cap_loaded;
    pthread_mutex_t scratch_lock;   /* guards scratch and scratch_clock */
    aj_cuda_scratch_slot scratch[AJ_CUDA_SCRATCH_SLOTS];
    uint64_t scratch_clock;
    pthread_mutex_t pinned_lock;    /* guards pinned */
    aj_cuda_pinned pinned[AJ_CUDA_PINNED_BLOCKS];
} aj_cuda_device;

/* GPU `index` on its primary context, or the device of `user_context` (a
 * CUcontext the caller owns) when that is not NULL. */
aj_status aj_cuda_device_open(aj_ctx *ctx, int index, void *user_context,
                              aj_cuda_device **out);
void aj_cuda_device_close(aj_cuda_device *d);

/* TMA: whether the device and its driver encode tensor maps, and the
 * encoding of one (cuTensorMapEncodeTiled; runtime.h's args). */
struct aj_tensor_map_args;
bool aj_cuda_has_tensor_map(const aj_cuda_device *d);
aj_status aj_cuda_tensor_map(aj_ctx *ctx, aj_cuda_device *d, const struct aj_tensor_map_args *a,
                             void *map);

/* Launches stage `stage` of a PTX kernel (loading its module on first
 * use) on `stream`. */
aj_status aj_cuda_launch(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k, int stage,
                         const int32_t grid[3], void **args, void *stream);

/* Loads a PTX kernel's module now (a cubin from the disk cache, else the
 * driver's JIT, stored for later runs), as its first launch would;
 * AJ_OK for kernels that are not PTX. */
aj_status aj_cuda_load(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k);

aj_status aj_cuda_alloc(aj_ctx *ctx, aj_cuda_device *d, size_t bytes, void **out);
aj_status aj_cuda_free(aj_ctx *ctx, aj_cuda_device *d, void *ptr);
aj_status aj_cuda_copy(aj_ctx *ctx, aj_cuda_device *d, void *dst, const void *src,
                       size_t bytes, int to_device);
aj_status aj_cuda_synchronize(aj_ctx *ctx, aj_cuda_device *d, void *stream);
/* Pinned host memory (cuMemAllocHost): copies between it and the device
 * are asynchronous, where pageable memory makes the driver stage them
 * synchronously.  Pinning is slow (the pages are locked and mapped), so
 * the device keeps up to AJ_CUDA_PINNED_BLOCKS blocks: a freed block
 * waits for the next call that fits in it (the smallest that fits), and
 * a call after the first of its sizes pins nothing. */
aj_status aj_cuda_host_alloc(aj_ctx *ctx, aj_cuda_device *d, size_t bytes, void **out);
void aj_cuda_host_free(aj_cuda_device *d, void *ptr);

/* Stream-ordered work, never a whole-context synchronisation: a
 * non-blocking stream of the device's own; a copy queued on `stream` (the
 * host side pageable or pinned); a wait for the work queued on `stream`
 * so far, by polling an event, that gives up after timeout_s seconds with
 * AJ_ERR_COMM ("`what` did not finish within ...": a peer's work it
 * depends on has stopped) rather than block inside the driver. */
enum { AJ_COPY_ON_DEVICE = 2 };   /* copy_async's to_device: device to device */
aj_status aj_cuda_stream_create(aj_ctx *ctx, aj_cuda_device *d, void **stream);
void aj_cuda_stream_destroy(aj_cuda_device *d, void *stream);
aj_status aj_cuda_copy_async(aj_ctx *ctx, aj_cuda_device *d, void *dst, const void *src,
                             size_t bytes, int to_device, void *stream);
/* height rows of width bytes, device to device, rows dpitch / spitch
 * bytes apart, queued on stream */
aj_status aj_cuda_copy2d_async(aj_ctx *ctx, aj_cuda_device *d, void *dst, size_t dpitch,
                               const void *src, size_t spitch, size_t width, size_t height,
                               void *stream);
/* Whether `stream` is being captured into a CUDA graph (false where the
 * driver lacks cuStreamIsCapturing or cuLaunchHostFunc); and fn(user)
 * queued on it as a host function (cuLaunchHostFunc: in a capture, a node
 * each replay runs).  For emulated launches. */
aj_status aj_cuda_capturing(aj_ctx *ctx, aj_cuda_device *d, void *stream, bool *capturing);
aj_status aj_cuda_host_func(aj_ctx *ctx, aj_cuda_device *d, void *stream, void (*fn)(void *),
                            void *user);
/* Events (CUevent, timing disabled): `event` marks the work queued on
 * `stream` so far (record); work queued on `stream` from now on waits for
 * the event's latest record, on the device (wait); whether that work is
 * done, without waiting (done; any thread, errors on `ctx`). */
aj_status aj_cuda_event_create(aj_ctx *ctx, aj_cuda_device *d, void **event);
void aj_cuda_event_destroy(aj_cuda_device *d, void *event);
aj_status aj_cuda_event_record(aj_ctx *ctx, aj_cuda_device *d, void *event, void *stream);
aj_status aj_cuda_stream_wait_event(aj_ctx *ctx, aj_cuda_device *d, void *stream, void *event);
aj_status aj_cuda_event_done(aj_ctx *ctx, aj_cuda_device *d, void *event, bool *done);
/* The calling thread's capture mode made relaxed (where the driver can):
 * its calls no longer fail, nor invalidate, another thread's capture in
 * the global mode (the ring's watchdog, cp/comm/watch.c). */
void aj_cuda_relax_capture_mode(aj_cuda_device *d);
/* count u32 words of device memory at dst set to value, queued on stream */
aj_status aj_cuda_fill32_async(aj_ctx *ctx, aj_cuda_device *d, void *dst, uint32_t value,
                               size_t count, void *stream);
aj_status aj_cuda_wait(aj_ctx *ctx, aj_cuda_device *d, void *stream, double timeout_s,
                       const char *what);

/* A scratch buffer of at least `bytes` for work queued on `stream`,
 * owned by the device and reused across calls: one per stream, for up to
 * AJ_CUDA_SCRATCH_SLOTS streams, grown (never shrunk) when a call needs
 * more, the old buffer freed in stream order (cuMemFreeAsync).  A slot
 * that last served another stream is taken over after that stream's work
 * on it (cuStreamWaitEvent).  No call synchronises; a call after the first
 * of its size allocates nothing.  aj_cuda_scratch_release(stream) after
 * queueing the work that uses it. */
aj_status aj_cuda_scratch(aj_ctx *ctx, aj_cuda_device *d, void *stream, size_t bytes,
                          void **out);
void aj_cuda_scratch_release(aj_cuda_device *d, void *stream);

/* What the driver made of a kernel's stage (loading it on first use):
 * registers and local-memory (spill) bytes per thread, and the most
 * threads per block it can launch with. */
typedef struct aj_cuda_resources {
    int registers, local_bytes, max_threads;
} aj_cuda_resources;

aj_status aj_cuda_stage_resources(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k,
                                  int stage, aj_cuda_resources *out);

/* GPU time of the work `run(user)` queues on `stream`, between two events. */
aj_status aj_cuda_time(aj_ctx *ctx, aj_cuda_device *d, void *stream,
                       aj_status (*run)(void *user), void *user, double *ms);

#endif /* AJ_RUNTIME_CUDA_DEVICE_H */
