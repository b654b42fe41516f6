/*
 * device.c -- devices: every aj_device_* call, through the table of the
 * device's kind (runtime.h, aj_device_ops); the tables of sim, cpu and
 * cuda at the end.  The CUDA driver is looked for at run time
 * (runtime/cuda); without it every other device keeps working.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "runtime/sim/hopper.h"
#include "templates/attn_common.h"

static const aj_device_ops sim_ops, cpu_ops, cuda_ops;

const aj_device_ops *aj_device_ops_of(aj_device_kind kind)
{
    static const aj_device_ops *const all[] = {
        [AJ_DEVICE_SIM] = &sim_ops,
        [AJ_DEVICE_CUDA] = &cuda_ops,
        [AJ_DEVICE_CPU] = &cpu_ops,
    };
    _Static_assert(sizeof all / sizeof all[0] == AJ_DEVICE_KIND_COUNT,
                   "a table per device kind");
    return (unsigned)kind < AJ_DEVICE_KIND_COUNT ? all[kind] : NULL;
}

const char *aj_device_kind_name(aj_device_kind kind)
{
    const aj_device_ops *ops = aj_device_ops_of(kind);
    return ops ? ops->kind_caps.kind_name : NULL;
}

aj_cuda_device *aj_device_cuda(const aj_device *dev)
{
    return dev ? dev->cuda : NULL;
}

/* ---------------------------------------------------------------- open */

static aj_status set_status(aj_device *dev, uint32_t value)
{
    return aj_device_copy_to(dev, dev->status, &value, sizeof value);
}

static aj_status open_device(aj_ctx *ctx, const aj_device_ops *ops, int index,
                             void *cu_context, aj_device **out)
{
    aj_device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    dev->ctx = ctx;
    dev->ops = ops;
    dev->index = index;
    aj_status st = ops->open(dev, index, cu_context);
    void *status = NULL;
    if (st == AJ_OK)
        st = aj_device_alloc(dev, sizeof *dev->status, &status);
    dev->status = status;
    if (st == AJ_OK)
        st = set_status(dev, AJ_VARLEN_STATUS_CLEAR);
    if (st != AJ_OK) {
        aj_device_close(dev);
        return st;
    }
    *out = dev;
    return AJ_OK;
}

aj_status aj_device_open(aj_ctx *ctx, aj_device_kind kind, int index, aj_device **out)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, out, "aj_device_open: out is NULL");
    const aj_device_ops *ops = aj_device_ops_of(kind);
    AJ_CHECK_ARG(ctx, ops, "aj_device_open: kind = %d is not a device kind", (int)kind);
    AJ_CHECK_ARG(ctx, index >= 0, "aj_device_open: index = %d is negative", index);
    return open_device(ctx, ops, index, NULL, out);
}

aj_status aj_device_open_context(aj_ctx *ctx, void *cu_context, aj_device **out)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, out, "aj_device_open_context: out is NULL");
    AJ_CHECK_ARG(ctx, cu_context, "aj_device_open_context: cu_context is NULL");
    return open_device(ctx, &cuda_ops, 0, cu_context, out);
}

void aj_device_close(aj_device *dev)
{
    if (!dev)
        return;
    if (dev->status)
        dev->ops->free(dev, dev->status);
    dev->ops->close(dev);
    free(dev);
}

aj_target aj_device_target(const aj_device *dev)
{
    return dev ? dev->ops->target(dev) : AJ_TARGET_ANY;
}

bool aj_device_runs(const aj_device *dev, aj_target kernel_target)
{
    aj_target own = aj_device_target(dev);
    if (kernel_target == own)
        return true;
    /* sm_90a code runs on compute capability 9.0 itself, whose device
     * target is sm_90 (docs/gpu.md) */
    return kernel_target == AJ_TARGET_SM_90A && own == AJ_TARGET_SM_90 && dev && dev->cuda &&
           dev->cuda->cc_major == 9 && dev->cuda->cc_minor == 0;
}

aj_target aj_device_target_for(const aj_device *dev, const aj_op *op, aj_target target)
{
    return aj_op_runs_wgmma(op) && aj_device_runs(dev, AJ_TARGET_SM_90A) ? AJ_TARGET_SM_90A
                                                                        : target;
}

bool aj_device_has_tensor_map(const aj_device *dev)
{
    return dev && dev->ops->tensor_map &&
           (!dev->ops->has_tensor_map || dev->ops->has_tensor_map(dev));
}

const char *aj_device_name(const aj_device *dev)
{
    return dev ? dev->ops->device_name(dev) : "";
}

/* ---------------------------------------------------------------- caps */

/* Copies `full` into the caller's struct of out->struct_size bytes (this
 * first version or a newer, larger one: the fields it adds are zeroed). */
static int write_caps(const aj_device_caps *full, aj_device_caps *out)
{
    const size_t given = out->struct_size;
    if (given < sizeof *full)
        return 0;
    memcpy(out, full, sizeof *full);
    memset((char *)out + sizeof *full, 0, given - sizeof *full);
    out->struct_size = given;
    return 1;
}

aj_status aj_device_kind_caps(aj_device_kind kind, aj_device_caps *caps)
{
    const aj_device_ops *ops = aj_device_ops_of(kind);
    if (!ops || !caps)
        return AJ_ERR_INVALID_ARG;
    return write_caps(&ops->kind_caps, caps) ? AJ_OK : AJ_ERR_INVALID_ARG;
}

aj_status aj_device_get_caps(const aj_device *dev, aj_device_caps *caps)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, caps, "aj_device_get_caps: caps is NULL");
    aj_device_caps full = dev->ops->kind_caps;
    full.target = dev->ops->target(dev);
    dev->ops->caps(dev, &full);
    AJ_CHECK_ARG(dev->ctx, write_caps(&full, caps),
                 "aj_device_get_caps: caps->struct_size = %zu is smaller than any version of "
                 "the struct (at least %zu); start from AJ_DEVICE_CAPS_INIT", caps->struct_size,
                 sizeof full);
    return AJ_OK;
}

/* ---------------------------------------------------------------- memory */

aj_status aj_device_alloc(aj_device *dev, size_t bytes, void **out)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, out, "aj_device_alloc: out is NULL");
    return dev->ops->alloc(dev, bytes, out);
}

aj_status aj_device_free(aj_device *dev, void *ptr)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    return ptr ? dev->ops->free(dev, ptr) : AJ_OK;
}

aj_status aj_device_host_alloc(aj_device *dev, size_t bytes, int zero, void **out)
{
    aj_status st = dev->ops->host_alloc(dev, bytes, out);
    if (st == AJ_OK && zero)
        memset(*out, 0, bytes);
    return st;
}

void aj_device_host_free(aj_device *dev, void *ptr)
{
    if (ptr)
        dev->ops->host_free(dev, ptr);
}

static aj_status copy(aj_device *dev, void *dst, const void *src, size_t bytes, int to_device)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, (dst && src) || bytes == 0, "aj_device_copy_%s: NULL pointer",
                 to_device ? "to" : "from");
    return bytes == 0 ? AJ_OK : dev->ops->copy(dev, dst, src, bytes, to_device);
}

aj_status aj_device_copy_to(aj_device *dev, void *dst, const void *host_src, size_t bytes)
{
    return copy(dev, dst, host_src, bytes, 1);
}

aj_status aj_device_copy_from(aj_device *dev, void *host_dst, const void *src, size_t bytes)
{
    return copy(dev, host_dst, src, bytes, 0);
}

aj_status aj_device_copy_async(aj_device *dev, void *dst, const void *src, size_t bytes,
                               int to_device, void *stream)
{
    return bytes == 0 ? AJ_OK : dev->ops->copy_async(dev, dst, src, bytes, to_device, stream);
}

aj_status aj_device_copy2d_async(aj_device *dev, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t height, void *stream)
{
    if (width == 0 || height == 0)
        return AJ_OK;
    return dev->ops->copy2d_async(dev, dst, dpitch, src, spitch, width, height, stream);
}

aj_status aj_device_fill32_async(aj_device *dev, void *dst, uint32_t value, size_t count,
                                 void *stream)
{
    return count == 0 ? AJ_OK : dev->ops->fill32_async(dev, dst, value, count, stream);
}

aj_status aj_device_scratch(aj_device *dev, void *stream, size_t bytes, void **out)
{
    return dev->ops->scratch(dev, stream, bytes, out);
}

void aj_device_scratch_release(aj_device *dev, void *stream, void *ptr)
{
    dev->ops->scratch_release(dev, stream, ptr);
}

/* ---------------------------------------------------------------- work */

static void describe_fault(uint32_t code, char *fault, size_t size);

/* The fault recorded in status word `word`, as `fn`'s AJ_ERR_INVALID_ARG
 * on ctx. The device's own word (`reused`), which later launches write
 * again, is cleared; a launch's own word is about to be freed. */
static aj_status take_status(aj_ctx *ctx, aj_device *dev, void *word, int reused,
                             const char *fn)
{
    uint32_t code = AJ_VARLEN_STATUS_CLEAR;
    aj_status st = aj_device_copy_from(dev, &code, word, sizeof code);
    if (st != AJ_OK || code == AJ_VARLEN_STATUS_CLEAR)
        return st;
    const uint32_t clear = AJ_VARLEN_STATUS_CLEAR;
    if (reused && (st = aj_device_copy_to(dev, word, &clear, sizeof clear)) != AJ_OK)
        return st;
    char fault[160];
    describe_fault(code, fault, sizeof fault);
    return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s (found by the kernel of sequence %u, "
                   "which skipped it)", fn, fault, code >> 4);
}

/* The words of a status code: which check failed, for which sequence. */
static void describe_fault(uint32_t code, char *fault, size_t size)
{
    const unsigned seq = code >> 4, next = seq + 1;
    const char c = code & 8 ? 'k' : 'q';
    const char *what = c == 'k' ? "keys" : "queries";
    switch ((aj_varlen_fault)(code & 7)) {
    case AJ_VARLEN_FIRST_NOT_ZERO:
        snprintf(fault, size, "cu_seqlens_%c[0] is not 0", c);
        break;
    case AJ_VARLEN_DECREASING:
        snprintf(fault, size, "cu_seqlens_%c[%u] is below cu_seqlens_%c[%u]; offsets "
                 "must not decrease", c, next, c, seq);
        break;
    case AJ_VARLEN_OUT_OF_RANGE:
        snprintf(fault, size, "cu_seqlens_%c[%u] or [%u] is outside 0 .. T%c (%c's "
                 "tokens)", c, seq, next, c, c);
        break;
    case AJ_VARLEN_TOO_LONG:
        snprintf(fault, size, "sequence %u has more %s than max_seqlen_%c", seq, what,
                 c);
        break;
    case AJ_VARLEN_LAST_NOT_TOTAL:
        snprintf(fault, size, "cu_seqlens_%c[%u] is not T%c (%c's tokens)", c, next, c,
                 c);
        break;
    case AJ_PAGED_BAD_PAGE:
        snprintf(fault, size, "block_table row %u holds a page outside 0 .. "
                 "num_pages - 1 (k_cache.shape[0])", seq);
        break;
    case AJ_PAGED_BAD_LENGTH:   /* = AJ_PAGED_QUERIES_BEYOND_KEYS where c is q */
        if (c == 'q')
            snprintf(fault, size, "sequence %u has more queries (cu_seqlens_q[%u] - "
                     "cu_seqlens_q[%u]) than keys (seqlens_k[%u])", seq, next, seq, seq);
        else
            snprintf(fault, size, "seqlens_k[%u] is negative or beyond its "
                     "block_table row (max_pages x page_size keys)", seq);
        break;
    default:
        snprintf(fault, size, "fault code %u", code & 7);
    }
}

aj_status aj_device_load_kernel(aj_ctx *ctx, aj_device *dev, const aj_kernel *k)
{
    return dev->ops->load_kernel(ctx, dev, k);
}

aj_status aj_device_launch_stage(aj_ctx *ctx, aj_device *dev, const aj_device_launch *l)
{
    return dev->ops->launch(ctx, dev, l);
}

aj_status aj_device_stage_resources(aj_ctx *ctx, aj_device *dev, const aj_kernel *k, int stage,
                                    aj_cuda_resources *out)
{
    if (!dev->ops->stage_resources)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "%s has no driver to report what a kernel "
                       "uses", aj_device_name(dev));
    return dev->ops->stage_resources(ctx, dev, k, stage, out);
}

aj_status aj_device_status_word(aj_device *dev, void **out)
{
    *out = dev->status;
    if (dev->ops->kind_caps.streams)
        return AJ_OK;
    void *word = NULL;
    uint32_t clear = AJ_VARLEN_STATUS_CLEAR;
    aj_status st = aj_device_alloc(dev, sizeof clear, &word);
    if (st == AJ_OK)
        st = aj_device_copy_to(dev, word, &clear, sizeof clear);
    if (st != AJ_OK && word)
        aj_device_free(dev, word);
    if (st == AJ_OK)
        *out = word;
    return st;
}

aj_status aj_device_launched(aj_ctx *ctx, aj_device *dev, void *word, aj_status st,
                             const char *fn)
{
    if (dev->ops->kind_caps.streams || !word || word == dev->status)
        return st;
    if (st == AJ_OK)
        st = take_status(ctx, dev, word, 0, fn);
    aj_device_free(dev, word);
    return st;
}

aj_status aj_device_synchronize(aj_device *dev, void *stream)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    if (!dev->ops->kind_caps.streams)
        return AJ_OK;   /* sim and cpu reported it at the launch */
    aj_status st = dev->ops->synchronize(dev, stream);
    return st == AJ_OK ? take_status(dev->ctx, dev, dev->status, 1, "a varlen launch") : st;
}

aj_status aj_device_stream_create(aj_device *dev, void **stream)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, stream, "aj_device_stream_create: stream is NULL");
    *stream = NULL;
    return dev->ops->stream_create(dev, stream);
}

void aj_device_stream_destroy(aj_device *dev, void *stream)
{
    if (dev && stream)
        dev->ops->stream_destroy(dev, stream);
}

aj_status aj_device_wait(aj_device *dev, void *stream, double timeout_s, const char *what)
{
    return dev->ops->wait(dev, stream, timeout_s, what);
}

aj_status aj_device_event_create(aj_device *dev, void **event)
{
    *event = NULL;
    return dev->ops->event_create ? dev->ops->event_create(dev, event) : AJ_OK;
}

void aj_device_event_destroy(aj_device *dev, void *event)
{
    if (event && dev->ops->event_destroy)
        dev->ops->event_destroy(dev, event);
}

aj_status aj_device_event_record(aj_device *dev, void *event, void *stream)
{
    return dev->ops->event_record ? dev->ops->event_record(dev, event, stream) : AJ_OK;
}

aj_status aj_device_stream_wait_event(aj_device *dev, void *stream, void *event)
{
    return dev->ops->stream_wait_event ? dev->ops->stream_wait_event(dev, stream, event)
                                       : AJ_OK;
}

aj_status aj_device_event_done(aj_ctx *ctx, aj_device *dev, void *event, bool *done)
{
    *done = true;
    return dev->ops->event_done ? dev->ops->event_done(ctx, dev, event, done) : AJ_OK;
}

aj_status aj_device_capturing(aj_ctx *ctx, aj_device *dev, void *stream, bool *capturing)
{
    *capturing = false;
    return dev->cuda ? aj_cuda_capturing(ctx, dev->cuda, stream, capturing) : AJ_OK;
}

void aj_device_relax_capture(aj_device *dev)
{
    if (dev->cuda)
        aj_cuda_relax_capture_mode(dev->cuda);
}

aj_status aj_device_stream_after(aj_device *dev, void *waiter, void *after, void *event)
{
    if (waiter == after)
        return AJ_OK;
    aj_status st = aj_device_event_record(dev, event, after);
    return st == AJ_OK ? aj_device_stream_wait_event(dev, waiter, event) : st;
}

aj_status aj_device_time(aj_device *dev, void *stream, aj_status (*run)(void *user),
                         void *user, double *ms)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, run && ms, "aj_device_time: run or ms is NULL");
    return dev->ops->time(dev, stream, run, user, ms);
}

aj_status aj_device_set_workers(aj_device *dev, int workers)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, workers >= 0, "aj_device_set_workers: workers = %d is negative",
                 workers);
    dev->workers = workers;
    if (dev->twin)   /* emulated launches: the emulator's threads */
        dev->twin->workers = workers;
    return AJ_OK;
}

aj_status aj_device_set_cpu_threads(aj_device *dev, aj_cpu_threads threads)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, threads == AJ_CPU_THREADS_POOL || threads == AJ_CPU_THREADS_OPENMP,
                 "aj_device_set_cpu_threads: %d is not an aj_cpu_threads", (int)threads);
    if (!dev->cpu)
        return aj_fail(dev->ctx, AJ_ERR_UNSUPPORTED,
                       "aj_device_set_cpu_threads: a %s device's launches do not run on host "
                       "threads of its own choosing (cpu devices only)", aj_device_name(dev));
    return aj_cpu_set_threads(dev->ctx, dev->cpu, threads);
}

aj_cpu_threads aj_device_cpu_threads(const aj_device *dev)
{
    return dev && dev->cpu ? aj_cpu_get_threads(dev->cpu) : AJ_CPU_THREADS_POOL;
}

int aj_device_workers(const aj_device *dev)
{
    if (!dev || !dev->ops->kind_caps.worker_threads)
        return 0;
    return dev->workers ? dev->workers : aj_cpu_default_workers();
}

uint64_t aj_device_last_instructions(const aj_device *dev)
{
    return dev ? dev->last_instructions : 0;
}

/* A kind's aj_device_caps: what every device of it is, its flags a set of
 * these. */
enum {
    HOST_MEMORY = 1,
    STREAMS = 2,
    INDEXED = 4,
    SIMT = 8,
    WORKER_THREADS = 16,
    COUNTS_INSTRUCTIONS = 32,
};

#define KIND_CAPS(kind_, name_, target_, flags_)                                          \
    {                                                                                     \
        .struct_size = sizeof(aj_device_caps), .kind = (kind_), .kind_name = (name_),     \
        .target = (target_), .host_memory = ((flags_) & HOST_MEMORY) != 0,                \
        .streams = ((flags_) & STREAMS) != 0, .indexed = ((flags_) & INDEXED) != 0,       \
        .simt = ((flags_) & SIMT) != 0, .worker_threads = ((flags_) & WORKER_THREADS) != 0, \
        .counts_instructions = ((flags_) & COUNTS_INSTRUCTIONS) != 0,                     \
    }

/* ------------------------------------------------- host memory (sim, cpu)
 *
 * Device memory is host memory; copies are memmove and every call runs to
 * completion, so streams are NULL and waits return at once. */

/* aj_cpu_block's memory, or AJ_ERR_OUT_OF_MEMORY naming `what`. */
static aj_status aligned_host(aj_device *dev, size_t bytes, const char *what, void **out)
{
    void *p = aj_cpu_block(bytes);
    if (!p)
        return aj_fail(dev->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: %zu bytes", what, bytes);
    *out = p;
    return AJ_OK;
}

static aj_status host_alloc(aj_device *dev, size_t bytes, void **out)
{
    return aligned_host(dev, bytes, "aj_device_alloc", out);
}

static aj_status host_buffer_alloc(aj_device *dev, size_t bytes, void **out)
{
    return aligned_host(dev, bytes, "host buffers", out);
}

static aj_status host_free(aj_device *dev, void *ptr)
{
    (void)dev;
    free(ptr);
    return AJ_OK;
}

static void host_free_void(aj_device *dev, void *ptr)
{
    host_free(dev, ptr);
}

static aj_status host_copy(aj_device *dev, void *dst, const void *src, size_t bytes,
                           int to_device)
{
    (void)dev, (void)to_device;
    memmove(dst, src, bytes);
    return AJ_OK;
}

static aj_status host_copy_async(aj_device *dev, void *dst, const void *src, size_t bytes,
                                 int to_device, void *stream)
{
    (void)stream;
    return host_copy(dev, dst, src, bytes, to_device);
}

static aj_status host_copy2d_async(aj_device *dev, void *dst, size_t dpitch, const void *src,
                                   size_t spitch, size_t width, size_t height, void *stream)
{
    (void)dev;
    (void)stream;
    for (size_t r = 0; r < height; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return AJ_OK;
}

static aj_status host_fill32_async(aj_device *dev, void *dst, uint32_t value, size_t count,
                                   void *stream)
{
    (void)dev;
    (void)stream;
    for (size_t i = 0; i < count; i++)
        memcpy((char *)dst + 4 * i, &value, 4);
    return AJ_OK;
}

static aj_status host_stream_create(aj_device *dev, void **stream)
{
    (void)dev;
    *stream = NULL;
    return AJ_OK;
}

static void host_stream_destroy(aj_device *dev, void *stream)
{
    (void)dev, (void)stream;
}

static aj_status host_synchronize(aj_device *dev, void *stream)
{
    (void)dev, (void)stream;
    return AJ_OK;
}

static aj_status host_wait(aj_device *dev, void *stream, double timeout_s, const char *what)
{
    (void)dev, (void)stream, (void)timeout_s, (void)what;
    return AJ_OK;
}

static aj_status host_time(aj_device *dev, void *stream, aj_status (*run)(void *user),
                           void *user, double *ms)
{
    (void)dev, (void)stream;
    const double t0 = aj_now();
    aj_status st = run(user);
    *ms = (aj_now() - t0) * 1e3;
    return st;
}

/* The cpu device keeps its scratch (aj_cpu_scratch); sim allocates per call. */
static aj_status host_scratch(aj_device *dev, void *stream, size_t bytes, void **out)
{
    (void)stream;
    if (dev->cpu)
        return aj_cpu_scratch(dev->ctx, dev->cpu, bytes, out);
    return host_alloc(dev, bytes, out);
}

static void host_scratch_release(aj_device *dev, void *stream, void *ptr)
{
    (void)stream;
    if (dev->cpu)
        aj_cpu_scratch_release(dev->cpu, ptr);
    else
        host_free(dev, ptr);
}

static aj_status host_load_kernel(aj_ctx *ctx, aj_device *dev, const aj_kernel *k)
{
    (void)ctx, (void)dev, (void)k;
    return AJ_OK;   /* the JIT made its host code at compile time */
}

/* The slots sim and cpu share: host memory, no streams. */
#define HOST_MEMORY_OPS                                                 \
    .alloc = host_alloc, .free = host_free,                             \
    .host_alloc = host_buffer_alloc, .host_free = host_free_void,              \
    .copy = host_copy, .copy_async = host_copy_async,                   \
    .fill32_async = host_fill32_async,                                  \
    .copy2d_async = host_copy2d_async,                                  \
    .stream_create = host_stream_create,                                \
    .stream_destroy = host_stream_destroy,                              \
    .synchronize = host_synchronize, .wait = host_wait,                 \
    .time = host_time, .scratch = host_scratch,                         \
    .scratch_release = host_scratch_release,                            \
    .load_kernel = host_load_kernel,                                    \
    .stage_resources = NULL

/* The kind's target, for the kinds whose devices all have one (sim, cpu). */
static aj_target kind_target(const aj_device *dev)
{
    return dev->ops->kind_caps.target;
}

/* ---------------------------------------------------------------- sim */

static aj_status sim_open(aj_device *dev, int index, void *cu_context)
{
    (void)cu_context;
    AJ_CHECK_ARG(dev->ctx, index == 0, "aj_device_open: the sim device has index 0 only, "
                 "not %d", index);
    return AJ_OK;
}

static void sim_close(aj_device *dev)
{
    (void)dev;
}

static const char *sim_name(const aj_device *dev)
{
    (void)dev;
    return "sim";
}

static void sim_caps(const aj_device *dev, aj_device_caps *c)
{
    (void)dev;
    c->max_shared_bytes = aj_target_smem_limit(AJ_TARGET_SIM);
    c->multiprocessors = aj_cpu_default_workers();
}

/* The emulator's own tensor map, by the driver's rules (sim/tma.c). */
static aj_status sim_tensor_map(aj_ctx *ctx, aj_device *dev, const aj_tensor_map_args *a,
                                void *map)
{
    (void)dev;
    aj_sim_tensor_map_args s = {.elem_bytes = 2, .rank = a->rank, .base = a->base,
                                .span = a->span};
    for (int i = 0; i < a->rank && i < 5; i++) {
        s.dims[i] = a->dims[i];
        s.strides[i] = a->strides[i];
        s.box[i] = a->box[i];
    }
    return aj_sim_tensor_map_encode(ctx, map, &s);
}

/* A twin's launch (emulated launches): what it read and wrote, for the
 * stand-in's stream-order model, as the accesses of the launch the cuda
 * device queued on l->stream. */
static void report_accesses(const aj_device *dev, const aj_device_launch *l,
                            const _Atomic unsigned char *use)
{
    const aj_cuda *cu = dev->twin_of->cuda->cu;
    for (int i = 0; use && cu->stand_in_access && i < l->num_buffers; i++)
        for (int write = 0; write < 2; write++)
            if (use[i] & (1 << write))
                cu->stand_in_access((CUstream)l->stream, l->buffers[i].base,
                                    l->buffers[i].bytes, write, l->buffers[i].name);
}

static aj_status sim_launch(aj_ctx *ctx, aj_device *dev, const aj_device_launch *l)
{
    aj_launch_info li;
    aj_kernel_stage_info(l->kernel, l->stage, &li);
    _Atomic unsigned char *use = dev->twin_of ? calloc((size_t)l->num_buffers + 1, 1) : NULL;
    aj_sim_launch launch = {
        .kernel_name = aj_kernel_stage_entry(l->kernel, l->stage),
        .entry = l->kernel->stages[l->stage].host_entry,
        .grid = {l->grid[0], l->grid[1], l->grid[2]},
        .block_threads = li.block[0],
        .smem_bytes = li.dynamic_smem,
        .args = l->argv,
        .buffers = l->buffers,
        .num_buffers = l->num_buffers,
        .workers = dev->workers,
        .buffer_use = use,
    };
    aj_status st = aj_sim_run(ctx, &launch);
    dev->last_instructions = launch.instructions;
    if (st == AJ_OK && use)
        report_accesses(dev, l, use);
    free((void *)use);
    return st;
}

static const aj_device_ops sim_ops = {
    .kind_caps = KIND_CAPS(AJ_DEVICE_SIM, "sim", AJ_TARGET_SIM,
                           HOST_MEMORY | SIMT | COUNTS_INSTRUCTIONS),
    .tune_batch = 1, .tune_heads = 2, .tune_seq = 128,
    HOST_MEMORY_OPS,
    .open = sim_open,
    .close = sim_close,
    .target = kind_target,
    .device_name = sim_name,
    .caps = sim_caps,
    .launch = sim_launch,
    .tensor_map = sim_tensor_map,
};

/* ---------------------------------------------------------------- cpu */

static aj_status cpu_open(aj_device *dev, int index, void *cu_context)
{
    (void)cu_context;
    if (index != 0)
        return aj_fail(dev->ctx, AJ_ERR_NO_DEVICE, "aj_device_open: the cpu device has index 0 "
                       "only (its threads are set with aj_device_set_workers), not %d", index);
    return aj_cpu_device_open(dev->ctx, &dev->cpu);
}

static void cpu_close(aj_device *dev)
{
    aj_cpu_device_close(dev->cpu);
}

static const char *cpu_name(const aj_device *dev)
{
    return dev->cpu->name;
}

static void cpu_caps(const aj_device *dev, aj_device_caps *c)
{
    (void)dev;
    c->multiprocessors = aj_cpu_default_workers();
}

static aj_status cpu_launch(aj_ctx *ctx, aj_device *dev, const aj_device_launch *l)
{
    const aj_kernel_stage *ks = &l->kernel->stages[l->stage];
    return aj_cpu_launch(ctx, dev->cpu, dev->workers, ks->host_entry, ks->stack_bytes, l->grid,
                         l->argv);
}

static const aj_device_ops cpu_ops = {
    .kind_caps = KIND_CAPS(AJ_DEVICE_CPU, "cpu", AJ_TARGET_CPU, HOST_MEMORY | WORKER_THREADS),
    .tune_batch = 1, .tune_heads = 8, .tune_seq = 2048,
    HOST_MEMORY_OPS,
    .open = cpu_open,
    .close = cpu_close,
    .target = kind_target,
    .device_name = cpu_name,
    .caps = cpu_caps,
    .launch = cpu_launch,
};

/* ---------------------------------------------------------------- cuda */

/* Emulated launches (docs/design.md "Emulated launches"): with
 * AJ_CUDA_EMULATE=1, on a stand-in libcuda whose device memory is host
 * memory, the device keeps a sim twin that runs each launch's op again
 * over the same buffers (launch.c: emulate_forward and its twins), so a
 * stand-in GPU's results are real numbers.  A real driver refuses the
 * mode. */
static aj_status open_twin(aj_device *dev)
{
    const char *mode = getenv("AJ_CUDA_EMULATE");
    if (!mode || !*mode || strcmp(mode, "0") == 0)
        return AJ_OK;
    if (strcmp(mode, "1") != 0)
        return aj_fail(dev->ctx, AJ_ERR_INVALID_ARG,
                       "aj_device_open: AJ_CUDA_EMULATE = '%s'; it takes 1 (emulated launches "
                       "on a stand-in libcuda) or 0", mode);
    const aj_cuda *cu = dev->cuda->cu;
    if (!cu->stand_in_host_memory || !cu->stand_in_host_memory())
        return aj_fail(dev->ctx, AJ_ERR_UNSUPPORTED,
                       "aj_device_open: AJ_CUDA_EMULATE=1 runs every launch again on the "
                       "emulator over the device's memory, which needs a stand-in libcuda "
                       "whose device memory is host memory (tests/fake_cuda); this driver's "
                       "is not");
    aj_status st = open_device(dev->ctx, &sim_ops, 0, NULL, &dev->twin);
    if (st == AJ_OK)
        dev->twin->twin_of = dev;
    return st;
}

static aj_status cuda_open(aj_device *dev, int index, void *cu_context)
{
    aj_status st = aj_cuda_device_open(dev->ctx, index, cu_context, &dev->cuda);
    return st == AJ_OK ? open_twin(dev) : st;
}

static void cuda_close(aj_device *dev)
{
    aj_emulated_runs_free(dev);
    aj_device_close(dev->twin);
    aj_cuda_device_close(dev->cuda);
}

static aj_status cuda_tensor_map(aj_ctx *ctx, aj_device *dev, const aj_tensor_map_args *a,
                                 void *map)
{
    return aj_cuda_tensor_map(ctx, dev->cuda, a, map);
}

static bool cuda_has_tensor_map(const aj_device *dev)
{
    return aj_cuda_has_tensor_map(dev->cuda);
}

static aj_target cuda_target(const aj_device *dev)
{
    return dev->cuda->target;
}

static const char *cuda_name(const aj_device *dev)
{
    return dev->cuda->name;
}

static void cuda_caps(const aj_device *dev, aj_device_caps *c)
{
    const aj_cuda_device *d = dev->cuda;
    c->max_shared_bytes = d->smem_optin;
    c->multiprocessors = d->sm_count;
    c->cc_major = d->cc_major;
    c->cc_minor = d->cc_minor;
    c->driver_version = d->cu->driver_version;
}

static aj_status cuda_alloc(aj_device *dev, size_t bytes, void **out)
{
    return aj_cuda_alloc(dev->ctx, dev->cuda, bytes, out);
}

static aj_status cuda_free(aj_device *dev, void *ptr)
{
    return aj_cuda_free(dev->ctx, dev->cuda, ptr);
}

static aj_status cuda_host_alloc(aj_device *dev, size_t bytes, void **out)
{
    return aj_cuda_host_alloc(dev->ctx, dev->cuda, bytes, out);
}

static void cuda_host_free(aj_device *dev, void *ptr)
{
    aj_cuda_host_free(dev->cuda, ptr);
}

static aj_status cuda_copy(aj_device *dev, void *dst, const void *src, size_t bytes,
                           int to_device)
{
    return aj_cuda_copy(dev->ctx, dev->cuda, dst, src, bytes, to_device);
}

static aj_status cuda_copy_async(aj_device *dev, void *dst, const void *src, size_t bytes,
                                 int to_device, void *stream)
{
    return aj_cuda_copy_async(dev->ctx, dev->cuda, dst, src, bytes, to_device, stream);
}

static aj_status cuda_copy2d_async(aj_device *dev, void *dst, size_t dpitch, const void *src,
                                   size_t spitch, size_t width, size_t height, void *stream)
{
    return aj_cuda_copy2d_async(dev->ctx, dev->cuda, dst, dpitch, src, spitch, width, height,
                                stream);
}

static aj_status cuda_fill32_async(aj_device *dev, void *dst, uint32_t value, size_t count,
                                   void *stream)
{
    return aj_cuda_fill32_async(dev->ctx, dev->cuda, dst, value, count, stream);
}

static aj_status cuda_stream_create(aj_device *dev, void **stream)
{
    return aj_cuda_stream_create(dev->ctx, dev->cuda, stream);
}

static void cuda_stream_destroy(aj_device *dev, void *stream)
{
    aj_cuda_stream_destroy(dev->cuda, stream);
}

static aj_status cuda_synchronize(aj_device *dev, void *stream)
{
    return aj_cuda_synchronize(dev->ctx, dev->cuda, stream);
}

static aj_status cuda_wait(aj_device *dev, void *stream, double timeout_s, const char *what)
{
    return aj_cuda_wait(dev->ctx, dev->cuda, stream, timeout_s, what);
}

static aj_status cuda_time(aj_device *dev, void *stream, aj_status (*run)(void *user),
                           void *user, double *ms)
{
    return aj_cuda_time(dev->ctx, dev->cuda, stream, run, user, ms);
}

static aj_status cuda_scratch(aj_device *dev, void *stream, size_t bytes, void **out)
{
    return aj_cuda_scratch(dev->ctx, dev->cuda, stream, bytes, out);
}

static void cuda_scratch_release(aj_device *dev, void *stream, void *ptr)
{
    (void)ptr;   /* the device keeps it for the stream's next call */
    aj_cuda_scratch_release(dev->cuda, stream);
}

static aj_status cuda_event_create(aj_device *dev, void **event)
{
    return aj_cuda_event_create(dev->ctx, dev->cuda, event);
}

static void cuda_event_destroy(aj_device *dev, void *event)
{
    aj_cuda_event_destroy(dev->cuda, event);
}

static aj_status cuda_event_record(aj_device *dev, void *event, void *stream)
{
    return aj_cuda_event_record(dev->ctx, dev->cuda, event, stream);
}

static aj_status cuda_stream_wait_event(aj_device *dev, void *stream, void *event)
{
    return aj_cuda_stream_wait_event(dev->ctx, dev->cuda, stream, event);
}

static aj_status cuda_event_done(aj_ctx *ctx, aj_device *dev, void *event, bool *done)
{
    return aj_cuda_event_done(ctx, dev->cuda, event, done);
}

static aj_status cuda_load_kernel(aj_ctx *ctx, aj_device *dev, const aj_kernel *k)
{
    return aj_cuda_load(ctx, dev->cuda, k);
}

static aj_status cuda_launch(aj_ctx *ctx, aj_device *dev, const aj_device_launch *l)
{
    return aj_cuda_launch(ctx, dev->cuda, l->kernel, l->stage, l->grid, l->argv, l->stream);
}

static aj_status cuda_stage_resources(aj_ctx *ctx, aj_device *dev, const aj_kernel *k,
                                      int stage, aj_cuda_resources *out)
{
    return aj_cuda_stage_resources(ctx, dev->cuda, k, stage, out);
}

static const aj_device_ops cuda_ops = {
    .kind_caps = KIND_CAPS(AJ_DEVICE_CUDA, "cuda", AJ_TARGET_ANY, STREAMS | INDEXED | SIMT),
    .tune_batch = 4, .tune_heads = 16, .tune_seq = 4096,
    .open = cuda_open,
    .close = cuda_close,
    .target = cuda_target,
    .device_name = cuda_name,
    .caps = cuda_caps,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .copy = cuda_copy,
    .copy_async = cuda_copy_async,
    .fill32_async = cuda_fill32_async,
    .copy2d_async = cuda_copy2d_async,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .synchronize = cuda_synchronize,
    .wait = cuda_wait,
    .time = cuda_time,
    .scratch = cuda_scratch,
    .scratch_release = cuda_scratch_release,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_done = cuda_event_done,
    .load_kernel = cuda_load_kernel,
    .launch = cuda_launch,
    .stage_resources = cuda_stage_resources,
    .tensor_map = cuda_tensor_map,
    .has_tensor_map = cuda_has_tensor_map,
};
