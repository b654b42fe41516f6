/*
 * device.c -- opening devices, and their memory.  The CUDA driver is looked
 * for at run time (runtime/cuda); without it every other device keeps
 * working.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#include "templates/attn_common.h"

static aj_status set_status(aj_device *dev, uint32_t value)
{
    return aj_device_copy_to(dev, dev->status, &value, sizeof value);
}

static aj_status new_device(aj_ctx *ctx, aj_device_kind kind, int index,
                            aj_cuda_device *cuda, aj_device **out)
{
    aj_device *dev = calloc(1, sizeof *dev);
    if (!dev) {
        aj_cuda_device_close(cuda);
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    }
    dev->ctx = ctx;
    dev->kind = kind;
    dev->index = index;
    dev->cuda = cuda;
    void *status = NULL;
    aj_status st = aj_device_alloc(dev, sizeof *dev->status, &status);
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
    AJ_CHECK_ARG(ctx, (unsigned)kind < AJ_DEVICE_KIND_COUNT,
                 "aj_device_open: kind = %d is not a device kind", (int)kind);
    AJ_CHECK_ARG(ctx, index >= 0, "aj_device_open: index = %d is negative", index);
    if (kind == AJ_DEVICE_CUDA) {
        aj_cuda_device *cuda = NULL;
        aj_status st = aj_cuda_device_open(ctx, index, NULL, &cuda);
        return st == AJ_OK ? new_device(ctx, kind, index, cuda, out) : st;
    }
    if (kind == AJ_DEVICE_CPU) {
        if (index != 0)
            return aj_fail(ctx, AJ_ERR_NO_DEVICE, "aj_device_open: the cpu device has index 0 "
                           "only (its threads are set with aj_device_set_workers), not %d",
                           index);
        aj_cpu_device *cpu = NULL;
        aj_status st = aj_cpu_device_open(ctx, &cpu);
        if (st == AJ_OK)
            st = new_device(ctx, kind, index, NULL, out);
        if (st == AJ_OK)
            (*out)->cpu = cpu;
        else
            aj_cpu_device_close(cpu);
        return st;
    }
    AJ_CHECK_ARG(ctx, index == 0, "aj_device_open: the sim device has index 0 only, not %d",
                 index);
    return new_device(ctx, kind, index, NULL, out);
}

aj_status aj_device_open_context(aj_ctx *ctx, void *cu_context, aj_device **out)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, out, "aj_device_open_context: out is NULL");
    AJ_CHECK_ARG(ctx, cu_context, "aj_device_open_context: cu_context is NULL");
    aj_cuda_device *cuda = NULL;
    aj_status st = aj_cuda_device_open(ctx, 0, cu_context, &cuda);
    return st == AJ_OK ? new_device(ctx, AJ_DEVICE_CUDA, 0, cuda, out) : st;
}

void aj_device_close(aj_device *dev)
{
    if (!dev)
        return;
    aj_device_free(dev, dev->status);
    aj_cuda_device_close(dev->cuda);
    aj_cpu_device_close(dev->cpu);
    free(dev);
}

aj_target aj_device_target(const aj_device *dev)
{
    if (!dev)
        return AJ_TARGET_ANY;
    if (dev->cpu)
        return AJ_TARGET_CPU;
    return dev->cuda ? dev->cuda->target : AJ_TARGET_SIM;
}

const char *aj_device_name(const aj_device *dev)
{
    if (!dev)
        return "";
    if (dev->cpu)
        return dev->cpu->name;
    return dev->cuda ? dev->cuda->name : "sim";
}

aj_status aj_device_alloc(aj_device *dev, size_t bytes, void **out)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, out, "aj_device_alloc: out is NULL");
    if (dev->cuda)
        return aj_cuda_alloc(dev->ctx, dev->cuda, bytes, out);
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (!p)
        return aj_fail(dev->ctx, AJ_ERR_OUT_OF_MEMORY, "aj_device_alloc: %zu bytes", bytes);
    *out = p;
    return AJ_OK;
}

aj_status aj_device_free(aj_device *dev, void *ptr)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    if (!ptr)
        return AJ_OK;
    if (dev->cuda)
        return aj_cuda_free(dev->ctx, dev->cuda, ptr);
    free(ptr);
    return AJ_OK;
}

static aj_status copy(aj_device *dev, void *dst, const void *src, size_t bytes, int to_device)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, (dst && src) || bytes == 0, "aj_device_copy_%s: NULL pointer",
                 to_device ? "to" : "from");
    if (bytes == 0)
        return AJ_OK;
    if (dev->cuda)
        return aj_cuda_copy(dev->ctx, dev->cuda, dst, src, bytes, to_device);
    memmove(dst, src, bytes);
    return AJ_OK;
}

aj_status aj_device_copy_to(aj_device *dev, void *dst, const void *host_src, size_t bytes)
{
    return copy(dev, dst, host_src, bytes, 1);
}

aj_status aj_device_copy_from(aj_device *dev, void *host_dst, const void *src, size_t bytes)
{
    return copy(dev, host_dst, src, bytes, 0);
}

/* The fault recorded in the status word (cleared again), as `fn`'s
 * AJ_ERR_INVALID_ARG. */
static aj_status take_status(aj_device *dev, const char *fn)
{
    uint32_t code = AJ_VARLEN_STATUS_CLEAR;
    aj_status st = aj_device_copy_from(dev, &code, dev->status, sizeof code);
    if (st != AJ_OK || code == AJ_VARLEN_STATUS_CLEAR)
        return st;
    st = set_status(dev, AJ_VARLEN_STATUS_CLEAR);
    if (st != AJ_OK)
        return st;
    const unsigned seq = code >> 4, next = seq + 1;
    const char c = code & 8 ? 'k' : 'q';
    const char *what = c == 'k' ? "keys" : "queries";
    char fault[160];
    switch ((aj_varlen_fault)(code & 7)) {
    case AJ_VARLEN_FIRST_NOT_ZERO:
        snprintf(fault, sizeof fault, "cu_seqlens_%c[0] is not 0", c);
        break;
    case AJ_VARLEN_DECREASING:
        snprintf(fault, sizeof fault, "cu_seqlens_%c[%u] is below cu_seqlens_%c[%u]; offsets "
                 "must not decrease", c, next, c, seq);
        break;
    case AJ_VARLEN_OUT_OF_RANGE:
        snprintf(fault, sizeof fault, "cu_seqlens_%c[%u] or [%u] is outside 0 .. T%c (%c's "
                 "tokens)", c, seq, next, c, c);
        break;
    case AJ_VARLEN_TOO_LONG:
        snprintf(fault, sizeof fault, "sequence %u has more %s than max_seqlen_%c", seq, what,
                 c);
        break;
    case AJ_VARLEN_LAST_NOT_TOTAL:
        snprintf(fault, sizeof fault, "cu_seqlens_%c[%u] is not T%c (%c's tokens)", c, next, c,
                 c);
        break;
    case AJ_PAGED_BAD_PAGE:
        snprintf(fault, sizeof fault, "block_table row %u holds a page outside 0 .. "
                 "num_pages - 1 (k_cache.shape[0])", seq);
        break;
    case AJ_PAGED_BAD_LENGTH:
        snprintf(fault, sizeof fault, "seqlens_k[%u] is negative or beyond its block_table "
                 "row (max_pages x page_size keys)", seq);
        break;
    default:
        snprintf(fault, sizeof fault, "fault code %u", code & 7);
    }
    return aj_fail(dev->ctx, AJ_ERR_INVALID_ARG, "%s: %s (found by the kernel of sequence %u, "
                   "which skipped it)", fn, fault, seq);
}

aj_status aj_device_load_kernel(aj_ctx *ctx, aj_device *dev, const aj_kernel *k)
{
    return dev->cuda ? aj_cuda_load(ctx, dev->cuda, k) : AJ_OK;
}

aj_status aj_device_launched(aj_device *dev, const char *fn)
{
    return dev->cuda ? AJ_OK : take_status(dev, fn);
}

aj_status aj_device_synchronize(aj_device *dev, void *stream)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    if (!dev->cuda)
        return AJ_OK;   /* sim and cpu reported it at the launch */
    aj_status st = aj_cuda_synchronize(dev->ctx, dev->cuda, stream);
    return st == AJ_OK ? take_status(dev, "a varlen launch") : st;
}

/* ---------------------------------------------------------------- streams */

aj_status aj_device_stream_create(aj_device *dev, void **stream)
{
    *stream = NULL;
    return dev->cuda ? aj_cuda_stream_create(dev->ctx, dev->cuda, stream) : AJ_OK;
}

void aj_device_stream_destroy(aj_device *dev, void *stream)
{
    if (dev->cuda)
        aj_cuda_stream_destroy(dev->cuda, stream);
}

aj_status aj_device_copy_async(aj_device *dev, void *dst, const void *src, size_t bytes,
                               int to_device, void *stream)
{
    if (bytes == 0)
        return AJ_OK;
    if (dev->cuda)
        return aj_cuda_copy_async(dev->ctx, dev->cuda, dst, src, bytes, to_device, stream);
    memmove(dst, src, bytes);
    return AJ_OK;
}

aj_status aj_device_wait(aj_device *dev, void *stream, double timeout_s, const char *what)
{
    return dev->cuda ? aj_cuda_wait(dev->ctx, dev->cuda, stream, timeout_s, what) : AJ_OK;
}

aj_status aj_device_scratch(aj_device *dev, void *stream, size_t bytes, void **out)
{
    if (dev->cuda)
        return aj_cuda_scratch(dev->ctx, dev->cuda, stream, bytes, out);
    return aj_device_alloc(dev, bytes, out);
}

void aj_device_scratch_release(aj_device *dev, void *stream, void *ptr)
{
    if (dev->cuda)
        aj_cuda_scratch_release(dev->cuda, stream);
    else
        aj_device_free(dev, ptr);
}

aj_status aj_device_set_workers(aj_device *dev, int workers)
{
    if (!dev)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(dev->ctx, workers >= 0, "aj_device_set_workers: workers = %d is negative",
                 workers);
    dev->workers = workers;
    return AJ_OK;
}

int aj_device_workers(const aj_device *dev)
{
    if (!dev || !dev->cpu)
        return 0;
    return dev->workers ? dev->workers : aj_cpu_default_workers();
}

uint64_t aj_device_last_instructions(const aj_device *dev)
{
    return dev ? dev->last_instructions : 0;
}
