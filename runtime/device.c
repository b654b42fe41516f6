/*
 * device.c -- opening devices.  The CUDA driver is looked for at run time
 * (dlopen); without it every other device keeps working.
 */
#include <dlfcn.h>
#include <stdlib.h>

#include "runtime/runtime.h"

static aj_status probe_cuda(aj_ctx *ctx)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return aj_fail(ctx, AJ_ERR_NO_DEVICE,
                       "no GPU found: the CUDA driver (libcuda.so.1) cannot be loaded (%s)",
                       dlerror());
    dlclose(h);
    return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                   "the CUDA driver is present, but this build of attnjit cannot launch on "
                   "GPUs yet; use the sim device");
}

aj_status aj_device_open(aj_ctx *ctx, aj_device_kind kind, int index, aj_device **out)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, out, "aj_device_open: out is NULL");
    AJ_CHECK_ARG(ctx, (unsigned)kind < AJ_DEVICE_KIND_COUNT,
                 "aj_device_open: kind = %d is not a device kind", (int)kind);
    AJ_CHECK_ARG(ctx, index >= 0, "aj_device_open: index = %d is negative", index);
    if (kind == AJ_DEVICE_CUDA)
        return probe_cuda(ctx);
    AJ_CHECK_ARG(ctx, index == 0, "aj_device_open: the sim device has index 0 only, not %d",
                 index);
    aj_device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    dev->ctx = ctx;
    dev->kind = kind;
    dev->index = index;
    *out = dev;
    return AJ_OK;
}

void aj_device_close(aj_device *dev)
{
    free(dev);
}

aj_target aj_device_target(const aj_device *dev)
{
    return dev && dev->kind == AJ_DEVICE_SIM ? AJ_TARGET_SIM : AJ_TARGET_ANY;
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

uint64_t aj_device_last_instructions(const aj_device *dev)
{
    return dev ? dev->last_instructions : 0;
}
