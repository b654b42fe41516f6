/*
 * driver.c -- loading the CUDA driver (libcuda.so.1) at run time, and the
 * GPU device: contexts, modules, launches, memory.
 *
 * The driver is loaded once per process; a missing driver, a missing
 * symbol or a failing cuInit makes every GPU call answer AJ_ERR_NO_DEVICE
 * with the reason, while every other target keeps working.  Calls run with
 * the device's context pushed and popped again, so the caller's current
 * context is never changed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/cache.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/runtime.h"

/* ---------------------------------------------------------------- driver */

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static aj_cuda driver;
static int driver_ok;
static char driver_error[512];

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(driver_error, sizeof driver_error,
                 "no GPU found: the CUDA driver (libcuda.so.1) cannot be loaded (%s)", dlerror());
        return;
    }
#define AJ_CUDA_RESOLVE(field, sym, params)                                                 \
    {                                                                                       \
        void *p = dlsym(h, sym);                                                            \
        if (!p) {                                                                           \
            snprintf(driver_error, sizeof driver_error,                                     \
                     "the CUDA driver lacks %s; it is too old for attnjit", sym);           \
            return;                                                                         \
        }                                                                                   \
        memcpy(&driver.field, &p, sizeof p);                                                \
    }
    AJ_CUDA_FUNCTIONS(AJ_CUDA_RESOLVE)
#undef AJ_CUDA_RESOLVE
    /* cuda.h maps cuEventElapsedTime to cuEventElapsedTime_v2 since CUDA 12.8
     * (the same signature); the table's v1 name is the floor for older
     * drivers, and a driver that has _v2 is called by it, as CUDA 13's
     * headers would */
    void *elapsed_v2 = dlsym(h, "cuEventElapsedTime_v2");
    if (elapsed_v2)
        memcpy(&driver.EventElapsedTime, &elapsed_v2, sizeof elapsed_v2);
    void *encode = dlsym(h, "cuTensorMapEncodeTiled");   /* optional: CUDA 12.0+ */
    if (encode)
        memcpy(&driver.TensorMapEncodeTiled, &encode, sizeof encode);
    void *stand_in = dlsym(h, "attnjit_stand_in_host_memory");   /* tests/fake_cuda only */
    if (stand_in)
        memcpy(&driver.stand_in_host_memory, &stand_in, sizeof stand_in);
    void *access = dlsym(h, "attnjit_stand_in_access");
    if (access)
        memcpy(&driver.stand_in_access, &access, sizeof access);
    void *capturing = dlsym(h, "cuStreamIsCapturing"), *host = dlsym(h, "cuLaunchHostFunc");
    if (capturing && host) {
        memcpy(&driver.StreamIsCapturing, &capturing, sizeof capturing);
        memcpy(&driver.LaunchHostFunc, &host, sizeof host);
    }
    void *exchange = dlsym(h, "cuThreadExchangeStreamCaptureMode");
    if (exchange)
        memcpy(&driver.ThreadExchangeStreamCaptureMode, &exchange, sizeof exchange);
    CUresult r = driver.Init(0);
    if (r != AJ_CUDA_SUCCESS) {
        const char *name = "?";
        driver.GetErrorName(r, &name);
        snprintf(driver_error, sizeof driver_error, "no GPU found: cuInit failed with %s", name);
        return;
    }
    driver.DriverGetVersion(&driver.driver_version);
    driver_ok = 1;   /* the handle stays open for the life of the process */
}

aj_status aj_cuda_get(aj_ctx *ctx, const aj_cuda **out)
{
    pthread_once(&load_once, load_driver);
    if (!driver_ok)
        return aj_fail(ctx, AJ_ERR_NO_DEVICE, "%s", driver_error);
    *out = &driver;
    return AJ_OK;
}

aj_status aj_cuda_fail(aj_ctx *ctx, const aj_cuda *cu, CUresult r, const char *what)
{
    const char *name = "CUDA_ERROR_UNKNOWN", *text = "";
    cu->GetErrorName(r, &name);
    cu->GetErrorString(r, &text);
    aj_status st;
    const char *hint = "";
    switch (r) {
    case 900: /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ... */
    case 901: case 902: case 903: case 904: case 905: case 906: case 907: case 908:
        st = AJ_ERR_UNSUPPORTED;
        hint = "; inside a CUDA graph capture: a call's first run of its size allocates its "
               "workspace, so run one before capturing (docs/api.md \"CUDA graphs\")";
        break;
    case 1:   /* CUDA_ERROR_INVALID_VALUE */
        st = AJ_ERR_INVALID_ARG;
        break;
    case 2:   /* CUDA_ERROR_OUT_OF_MEMORY */
        st = AJ_ERR_OUT_OF_MEMORY;
        break;
    case 100: /* CUDA_ERROR_NO_DEVICE */
    case 101: /* CUDA_ERROR_INVALID_DEVICE */
        st = AJ_ERR_NO_DEVICE;
        break;
    case 209: /* CUDA_ERROR_NO_BINARY_FOR_GPU */
    case 218: /* CUDA_ERROR_INVALID_PTX */
    case 222: /* CUDA_ERROR_UNSUPPORTED_PTX_VERSION */
        st = AJ_ERR_CODEGEN;
        break;
    case 700: /* CUDA_ERROR_ILLEGAL_ADDRESS */
    case 715: /* CUDA_ERROR_ILLEGAL_INSTRUCTION */
    case 716: /* CUDA_ERROR_MISALIGNED_ADDRESS */
    case 719: /* CUDA_ERROR_LAUNCH_FAILED */
        st = AJ_ERR_KERNEL_FAULT;
        break;
    default:
        st = AJ_ERR_INTERNAL;
    }
    return aj_fail(ctx, st, "%s: %s (%s)%s", what, name, text, hint);
}

/* ---------------------------------------------------------------- device */

aj_status aj_cuda_device_open(aj_ctx *ctx, int index, void *user_context,
                              aj_cuda_device **out)
{
    const aj_cuda *cu = NULL;
    aj_status st = aj_cuda_get(ctx, &cu);
    if (st != AJ_OK)
        return st;
    aj_cuda_device *d = calloc(1, sizeof *d);
    if (!d)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    d->cu = cu;
    d->anchor = calloc(1, sizeof *d->anchor);
    if (!d->anchor) {
        free(d);
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    }
    pthread_mutex_init(&d->anchor->lock, NULL);
    d->anchor->device = d;
    atomic_init(&d->anchor->refs, 1);
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->scratch_lock, NULL);
    pthread_mutex_init(&d->pinned_lock, NULL);
    if (user_context) {
        d->cuctx = (CUcontext)user_context;
        AJ_CU_TRY(ctx, cu, cu->CtxPushCurrent(d->cuctx), "cuCtxPushCurrent");
        CUresult r = cu->CtxGetDevice(&d->dev);
        CUcontext popped;
        cu->CtxPopCurrent(&popped);
        AJ_CU_TRY(ctx, cu, r, "cuCtxGetDevice");
    } else {
        int count = 0;
        AJ_CU_TRY(ctx, cu, cu->DeviceGetCount(&count), "cuDeviceGetCount");
        if (index >= count) {
            st = aj_fail(ctx, AJ_ERR_NO_DEVICE, "no GPU %d: this machine has %d", index, count);
            goto done;
        }
        AJ_CU_TRY(ctx, cu, cu->DeviceGet(&d->dev, index), "cuDeviceGet");
    }
    cu->DeviceGetName(d->name, sizeof d->name, d->dev);
    AJ_CU_TRY(ctx, cu, cu->DeviceGetAttribute(&d->cc_major,
              AJ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev), "cuDeviceGetAttribute");
    AJ_CU_TRY(ctx, cu, cu->DeviceGetAttribute(&d->cc_minor,
              AJ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev), "cuDeviceGetAttribute");
    AJ_CU_TRY(ctx, cu, cu->DeviceGetAttribute(&d->smem_optin,
              AJ_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d->dev),
              "cuDeviceGetAttribute");
    AJ_CU_TRY(ctx, cu, cu->DeviceGetAttribute(&d->sm_count,
              AJ_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->dev), "cuDeviceGetAttribute");
    if (d->cc_major < 8) {
        st = aj_fail(ctx, AJ_ERR_NO_DEVICE, "%s has compute capability %d.%d; attnjit's "
                     "kernels need 8.0 (sm_80) or newer", d->name, d->cc_major, d->cc_minor);
        goto done;
    }
    /* PTX for sm_80 runs on every 8.x GPU, sm_89's on 8.9 (Ada) and sm_90
     * PTX on 9.x and later through the driver's JIT; sm_90a only on 9.0
     * itself. */
    d->target = d->cc_major >= 9                           ? AJ_TARGET_SM_90
                : d->cc_major == 8 && d->cc_minor >= 9 ? AJ_TARGET_SM_89
                                                         : AJ_TARGET_SM_80;
    if (!d->cuctx) {   /* a usable GPU: now take its primary context */
        AJ_CU_TRY(ctx, cu, cu->DevicePrimaryCtxRetain(&d->cuctx, d->dev),
                  "cuDevicePrimaryCtxRetain");
        d->owns_primary = 1;
    }
    *out = d;
    return AJ_OK;
done:
    aj_cuda_device_close(d);
    return st;
}

static void anchor_drop(aj_cuda_anchor *a)
{
    if (atomic_fetch_sub(&a->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&a->lock);
    free(a);
}

void aj_cuda_device_close(aj_cuda_device *d)
{
    if (!d)
        return;
    /* kernels freed from now on leave the device alone (and a hook
     * unloading now finishes first) */
    pthread_mutex_lock(&d->anchor->lock);
    d->anchor->device = NULL;
    pthread_mutex_unlock(&d->anchor->lock);
    anchor_drop(d->anchor);
    if (d->cuctx && d->cu->CtxPushCurrent(d->cuctx) == AJ_CUDA_SUCCESS) {
        for (size_t i = 0; i < d->num_loaded; i++)
            d->cu->ModuleUnload(d->loaded[i].mod);
        for (int i = 0; i < AJ_CUDA_SCRATCH_SLOTS; i++) {
            if (d->scratch[i].ptr)
                d->cu->MemFree(d->scratch[i].ptr);
            if (d->scratch[i].used)
                d->cu->EventDestroy(d->scratch[i].used);
        }
        for (int i = 0; i < AJ_CUDA_PINNED_BLOCKS; i++)
            if (d->pinned[i].ptr)
                d->cu->MemFreeHost(d->pinned[i].ptr);
        CUcontext popped;
        d->cu->CtxPopCurrent(&popped);
    }
    if (d->owns_primary)
        d->cu->DevicePrimaryCtxRelease(d->dev);
    free(d->loaded);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->scratch_lock);
    pthread_mutex_destroy(&d->pinned_lock);
    free(d);
}

/* ---------------------------------------------------------------- modules */

/*
 * A kernel's module comes from a cubin (SASS): the disk cache's, for this
 * PTX, compute capability and driver, else the driver's linker's
 * (cuLinkCreate / cuLinkAddData / cuLinkComplete: the PTX JIT, ptxas in
 * the driver), which is then stored for later processes.  All of it runs
 * outside the device's lock, so aj_compile_many's workers JIT in parallel
 * and launches of loaded kernels go on meanwhile.
 */
static aj_status link_cubin(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k,
                            const char *key, CUmodule *mod)
{
    aj_status st = AJ_OK;
    const aj_cuda *cu = d->cu;
    const char *name = k->stages[0].entry;
    char error_log[8192] = "", info_log[4096] = "";
    int options[4] = {AJ_CU_JIT_ERROR_LOG_BUFFER, AJ_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                      AJ_CU_JIT_INFO_LOG_BUFFER, AJ_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES};
    void *values[4] = {error_log, (void *)(uintptr_t)sizeof error_log, info_log,
                       (void *)(uintptr_t)sizeof info_log};
    CUlinkState link = NULL;
    void *cubin = NULL;
    size_t cubin_bytes = 0;
    AJ_CU_TRY(ctx, cu, cu->LinkCreate(4, options, values, &link), "cuLinkCreate");
    CUresult r = cu->LinkAddData(link, AJ_CU_JIT_INPUT_PTX, (void *)k->code,
                                 strlen((const char *)k->code) + 1, name, 0, NULL, NULL);
    if (r == AJ_CUDA_SUCCESS)
        r = cu->LinkComplete(link, &cubin, &cubin_bytes);
    if (r != AJ_CUDA_SUCCESS) {
        st = aj_cuda_fail(ctx, cu, r, "compiling the kernel's PTX");
        aj_fail(ctx, st, "compiling %s's PTX for %s: %s", name, d->name, error_log);
        goto done;
    }
    if (info_log[0])
        aj_log(ctx, AJ_LOG_DEBUG, "CUDA JIT for %s: %s", name, info_log);
    AJ_CU_TRY(ctx, cu, cu->ModuleLoadData(mod, cubin), "cuModuleLoadData");
    aj_cache_blob_store(ctx, aj_cache_of(ctx), AJ_CACHE_CUBIN, key, cubin, cubin_bytes);
done:
    if (link)
        cu->LinkDestroy(link);   /* frees the cubin */
    return st;
}

static aj_status load_module(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k,
                             CUmodule *mod)
{
    char fields[128], key[256];
    snprintf(fields, sizeof fields, "ptx %016llx|sm_%d%d|driver %d",
             (unsigned long long)k->code_hash, d->cc_major, d->cc_minor,
             d->cu->driver_version);
    aj_cache_key(AJ_CACHE_CUBIN, fields, key, sizeof key);
    size_t bytes = 0;
    uint8_t *cubin = aj_cache_blob_lookup(ctx, aj_cache_of(ctx), AJ_CACHE_CUBIN, key, &bytes);
    if (cubin) {
        CUresult r = d->cu->ModuleLoadData(mod, cubin);
        free(cubin);
        if (r == AJ_CUDA_SUCCESS)
            return AJ_OK;
        aj_log(ctx, AJ_LOG_WARN, "kernel cache: the driver refused the cached cubin of %s; "
               "compiling its PTX again", k->stages[0].entry);
    }
    return link_cubin(ctx, d, k, key, mod);
}

/* The functions of a loaded module, with the >48 KiB shared-memory opt-in. */
static aj_status module_functions(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k,
                                  CUmodule mod, CUfunction *fns)
{
    const aj_cuda *cu = d->cu;
    for (int s = 0; s < k->num_stages; s++) {
        const aj_kernel_stage *ks = &k->stages[s];
        CUresult r = cu->ModuleGetFunction(&fns[s], mod, ks->entry);
        if (r != AJ_CUDA_SUCCESS)
            return aj_cuda_fail(ctx, cu, r, "cuModuleGetFunction");
        /* more than 48 KiB of dynamic shared memory must be asked for */
        if (ks->launch.dynamic_smem <= 48 * 1024)
            continue;
        if (ks->launch.dynamic_smem > d->smem_optin)
            return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "%s needs %d bytes of shared memory; %s "
                           "allows %d per block", ks->entry, ks->launch.dynamic_smem, d->name,
                           d->smem_optin);
        r = cu->FuncSetAttribute(fns[s], AJ_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                 ks->launch.dynamic_smem);
        if (r != AJ_CUDA_SUCCESS)
            return aj_cuda_fail(ctx, cu, r, "raising the dynamic shared memory limit");
    }
    return AJ_OK;
}

/* The kernel's entry in d->loaded (under the lock), or NULL. */
static aj_cuda_loaded *find_loaded(aj_cuda_device *d, const aj_kernel *k)
{
    for (size_t i = 0; i < d->num_loaded; i++)
        if (d->loaded[i].kernel == k)
            return &d->loaded[i];
    return NULL;
}

/*
 * A kernel's release hook (aj_kernel_on_release): the last reference to
 * the kernel is gone -- the memory cache evicted it and no caller holds
 * it -- so its module leaves the device, if the device is still open.
 * Launches of it may still be queued on some stream: the module is
 * unloaded once the context's work is done (cuCtxSynchronize), which
 * costs an eviction, never a launch.
 */
static void unload_released(void *owner, const aj_kernel *k)
{
    aj_cuda_anchor *a = owner;
    pthread_mutex_lock(&a->lock);
    aj_cuda_device *d = a->device;
    CUmodule mod = NULL;
    if (d) {
        pthread_mutex_lock(&d->lock);
        aj_cuda_loaded *slot = find_loaded(d, k);
        if (slot) {
            mod = slot->mod;
            *slot = d->loaded[--d->num_loaded];
        }
        pthread_mutex_unlock(&d->lock);
    }
    if (mod && d->cu->CtxPushCurrent(d->cuctx) == AJ_CUDA_SUCCESS) {
        d->cu->CtxSynchronize();   /* a fault here is the next call's to report */
        d->cu->ModuleUnload(mod);
        CUcontext popped;
        d->cu->CtxPopCurrent(&popped);
    }
    pthread_mutex_unlock(&a->lock);
    anchor_drop(a);
}

/* The loaded function of a kernel's stage (one module per kernel and
 * device, holding every stage), loading it on first use (the context
 * pushed) and asking the kernel to unload it when it is freed.  Two
 * threads loading one kernel at once both load it; the second to finish
 * unloads its copy. */
static aj_status function_for(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k, int stage,
                              CUfunction *out)
{
    aj_status st = AJ_OK;
    pthread_mutex_lock(&d->lock);
    aj_cuda_loaded *hit = find_loaded(d, k);
    if (hit)
        *out = hit->fns[stage];
    pthread_mutex_unlock(&d->lock);
    if (hit)
        return AJ_OK;

    CUmodule mod = NULL;
    CUfunction fns[AJ_KB_MAX_STAGES] = {0};
    st = load_module(ctx, d, k, &mod);
    if (st == AJ_OK)
        st = module_functions(ctx, d, k, mod, fns);
    if (st != AJ_OK) {
        if (mod)
            d->cu->ModuleUnload(mod);
        return st;
    }
    pthread_mutex_lock(&d->lock);
    if ((hit = find_loaded(d, k))) {   /* another thread was first */
        d->cu->ModuleUnload(mod);
        *out = hit->fns[stage];
        goto done;
    }
    if (d->num_loaded == d->cap_loaded) {
        size_t cap = d->cap_loaded ? d->cap_loaded * 2 : 16;
        void *bigger = realloc(d->loaded, cap * sizeof *d->loaded);
        if (!bigger) {
            d->cu->ModuleUnload(mod);
            st = aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
            goto done;
        }
        d->loaded = bigger;
        d->cap_loaded = cap;
    }
    /* the hooks are the kernel's bookkeeping, not what it computes: a
     * const kernel takes one */
    atomic_fetch_add(&d->anchor->refs, 1);
    st = aj_kernel_on_release(ctx, (aj_kernel *)k, unload_released, d->anchor);
    if (st != AJ_OK) {
        atomic_fetch_sub(&d->anchor->refs, 1);
        d->cu->ModuleUnload(mod);
        goto done;
    }
    aj_cuda_loaded *slot = &d->loaded[d->num_loaded++];
    slot->kernel = k;
    slot->mod = mod;
    memcpy(slot->fns, fns, sizeof slot->fns);
    *out = fns[stage];
done:
    pthread_mutex_unlock(&d->lock);
    return st;
}

aj_status aj_cuda_load(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k)
{
    aj_status st = AJ_OK;
    if (k->emit != AJ_EMIT_PTX)
        return AJ_OK;   /* nothing the driver loads */
    AJ_CU_TRY(ctx, d->cu, d->cu->CtxPushCurrent(d->cuctx), "cuCtxPushCurrent");
    CUfunction fn = NULL;
    st = function_for(ctx, d, k, 0, &fn);
    CUcontext popped;
    d->cu->CtxPopCurrent(&popped);
done:
    return st;
}

aj_status aj_cuda_launch(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k, int stage,
                         const int32_t grid[3], void **args, void *stream)
{
    aj_status st = AJ_OK;
    const aj_cuda *cu = d->cu;
    int pushed = 0;
    if (k->emit != AJ_EMIT_PTX)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "kernel %s holds %s, not PTX; compile with "
                       "emit = AJ_EMIT_PTX to launch it", k->stages[0].entry,
                       k->emit == AJ_EMIT_LLVM_IR ? "LLVM IR" : "bitcode");
    AJ_CU_TRY(ctx, cu, cu->CtxPushCurrent(d->cuctx), "cuCtxPushCurrent");
    pushed = 1;
    CUfunction fn = NULL;
    AJ_TRY(function_for(ctx, d, k, stage, &fn));
    const aj_launch_info *li = &k->stages[stage].launch;
    AJ_CU_TRY(ctx, cu, cu->LaunchKernel(fn, (unsigned)grid[0], (unsigned)grid[1],
                                        (unsigned)grid[2], (unsigned)li->block[0],
                                        (unsigned)li->block[1], (unsigned)li->block[2],
                                        (unsigned)li->dynamic_smem, (CUstream)stream,
                                        args, NULL),
              "cuLaunchKernel");
done:
    if (pushed) {
        CUcontext popped;
        cu->CtxPopCurrent(&popped);
    }
    return st;
}

/* ---------------------------------------------------------------- memory */

#define WITH_CONTEXT(d, call, what)                                      \
    do {                                                                 \
        AJ_CU_TRY(ctx, (d)->cu, (d)->cu->CtxPushCurrent((d)->cuctx),     \
                  "cuCtxPushCurrent");                                   \
        CUresult r_ = (call);                                            \
        CUcontext popped_;                                               \
        (d)->cu->CtxPopCurrent(&popped_);                                \
        AJ_CU_TRY(ctx, (d)->cu, r_, what);                               \
    } while (0)

aj_status aj_cuda_alloc(aj_ctx *ctx, aj_cuda_device *d, size_t bytes, void **out)
{
    aj_status st = AJ_OK;
    CUdeviceptr p = 0;
    WITH_CONTEXT(d, d->cu->MemAlloc(&p, bytes ? bytes : 1), "cuMemAlloc");
    *out = (void *)(uintptr_t)p;
done:
    return st;
}

aj_status aj_cuda_free(aj_ctx *ctx, aj_cuda_device *d, void *ptr)
{
    aj_status st = AJ_OK;
    WITH_CONTEXT(d, d->cu->MemFree((CUdeviceptr)(uintptr_t)ptr), "cuMemFree");
done:
    return st;
}

aj_status aj_cuda_copy(aj_ctx *ctx, aj_cuda_device *d, void *dst, const void *src,
                       size_t bytes, int to_device)
{
    aj_status st = AJ_OK;
    if (to_device)
        WITH_CONTEXT(d, d->cu->MemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes),
                     "cuMemcpyHtoD");
    else
        WITH_CONTEXT(d, d->cu->MemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes),
                     "cuMemcpyDtoH");
done:
    return st;
}

aj_status aj_cuda_synchronize(aj_ctx *ctx, aj_cuda_device *d, void *stream)
{
    aj_status st = AJ_OK;
    if (stream)
        WITH_CONTEXT(d, d->cu->StreamSynchronize((CUstream)stream), "cuStreamSynchronize");
    else
        WITH_CONTEXT(d, d->cu->CtxSynchronize(), "cuCtxSynchronize");
done:
    return st;
}

aj_status aj_cuda_host_alloc(aj_ctx *ctx, aj_cuda_device *d, size_t bytes, void **out)
{
    aj_status st = AJ_OK;
    if (!bytes)
        bytes = 1;
    /* the smallest idle block that fits; else an empty entry, or the
     * smallest idle block (too small: it makes room) */
    pthread_mutex_lock(&d->pinned_lock);
    aj_cuda_pinned *fit = NULL, *room = NULL;
    for (int i = 0; i < AJ_CUDA_PINNED_BLOCKS; i++) {
        aj_cuda_pinned *b = &d->pinned[i];
        if (b->busy)
            continue;
        if (b->ptr && b->bytes >= bytes && (!fit || b->bytes < fit->bytes))
            fit = b;
        if (!room || (room->ptr && (!b->ptr || b->bytes < room->bytes)))
            room = b;
    }
    if (fit) {
        fit->busy = 1;
        *out = fit->ptr;
        pthread_mutex_unlock(&d->pinned_lock);
        return AJ_OK;
    }
    if (room)
        room->busy = 1;   /* ours while the lock is dropped for the driver */
    pthread_mutex_unlock(&d->pinned_lock);
    void *old = room ? room->ptr : NULL, *p = NULL;
    if (old)
        WITH_CONTEXT(d, d->cu->MemFreeHost(old), "cuMemFreeHost");
    WITH_CONTEXT(d, d->cu->MemAllocHost(&p, bytes), "cuMemAllocHost");
    *out = p;
done:
    if (room) {
        pthread_mutex_lock(&d->pinned_lock);
        room->ptr = st == AJ_OK ? p : NULL;
        room->bytes = st == AJ_OK ? bytes : 0;
        room->busy = st == AJ_OK;
        pthread_mutex_unlock(&d->pinned_lock);
    }
    return st;
}

void aj_cuda_host_free(aj_cuda_device *d, void *ptr)
{
    pthread_mutex_lock(&d->pinned_lock);
    for (int i = 0; i < AJ_CUDA_PINNED_BLOCKS; i++)
        if (d->pinned[i].ptr == ptr && d->pinned[i].busy) {
            d->pinned[i].busy = 0;   /* kept for the next call */
            pthread_mutex_unlock(&d->pinned_lock);
            return;
        }
    pthread_mutex_unlock(&d->pinned_lock);
    CUcontext popped;   /* every entry was busy when it was pinned */
    if (ptr && d->cu->CtxPushCurrent(d->cuctx) == AJ_CUDA_SUCCESS) {
        d->cu->MemFreeHost(ptr);
        d->cu->CtxPopCurrent(&popped);
    }
}

/* ---------------------------------------------------------------- streams */

aj_status aj_cuda_stream_create(aj_ctx *ctx, aj_cuda_device *d, void **stream)
{
    aj_status st = AJ_OK;
    CUstream s = NULL;
    WITH_CONTEXT(d, d->cu->StreamCreate(&s, AJ_CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    *stream = s;
done:
    return st;
}

/* A call whose failure nobody can act on (a destroy), in d's context. */
#define IN_CONTEXT(d, call)                                          \
    do {                                                             \
        CUcontext popped_;                                           \
        if ((d)->cu->CtxPushCurrent((d)->cuctx) == AJ_CUDA_SUCCESS) { \
            (call);                                                  \
            (d)->cu->CtxPopCurrent(&popped_);                        \
        }                                                            \
    } while (0)

void aj_cuda_stream_destroy(aj_cuda_device *d, void *stream)
{
    if (stream)
        IN_CONTEXT(d, d->cu->StreamDestroy((CUstream)stream));   /* its work finishes first */
}

aj_status aj_cuda_event_create(aj_ctx *ctx, aj_cuda_device *d, void **event)
{
    aj_status st = AJ_OK;
    *event = NULL;   /* (CUevent is a pointer) */
    WITH_CONTEXT(d, d->cu->EventCreate((CUevent *)event, AJ_CU_EVENT_DISABLE_TIMING),
                 "cuEventCreate");
done:
    return st;
}

void aj_cuda_event_destroy(aj_cuda_device *d, void *event)
{
    if (event)
        IN_CONTEXT(d, d->cu->EventDestroy((CUevent)event));
}

aj_status aj_cuda_event_record(aj_ctx *ctx, aj_cuda_device *d, void *event, void *stream)
{
    aj_status st = AJ_OK;
    WITH_CONTEXT(d, d->cu->EventRecord((CUevent)event, (CUstream)stream), "cuEventRecord");
done:
    return st;
}

aj_status aj_cuda_stream_wait_event(aj_ctx *ctx, aj_cuda_device *d, void *stream, void *event)
{
    aj_status st = AJ_OK;
    WITH_CONTEXT(d, d->cu->StreamWaitEvent((CUstream)stream, (CUevent)event, 0),
                 "cuStreamWaitEvent");
done:
    return st;
}

aj_status aj_cuda_event_done(aj_ctx *ctx, aj_cuda_device *d, void *event, bool *done)
{
    aj_status st = AJ_OK;
    const aj_cuda *cu = d->cu;
    AJ_CU_TRY(ctx, cu, cu->CtxPushCurrent(d->cuctx), "cuCtxPushCurrent");
    CUresult r = cu->EventQuery((CUevent)event);
    CUcontext popped;
    cu->CtxPopCurrent(&popped);
    *done = r == AJ_CUDA_SUCCESS;
    if (r != AJ_CUDA_ERROR_NOT_READY)
        AJ_CU_TRY(ctx, cu, r, "cuEventQuery");
done:
    return st;
}

aj_status aj_cuda_copy_async(aj_ctx *ctx, aj_cuda_device *d, void *dst, const void *src,
                             size_t bytes, int to_device, void *stream)
{
    aj_status st = AJ_OK;
    if (to_device == AJ_COPY_ON_DEVICE)
        WITH_CONTEXT(d, d->cu->MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst,
                                               (CUdeviceptr)(uintptr_t)src, bytes,
                                               (CUstream)stream), "cuMemcpyDtoDAsync");
    else if (to_device)
        WITH_CONTEXT(d, d->cu->MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, bytes,
                                               (CUstream)stream), "cuMemcpyHtoDAsync");
    else
        WITH_CONTEXT(d, d->cu->MemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, bytes,
                                               (CUstream)stream), "cuMemcpyDtoHAsync");
done:
    return st;
}

aj_status aj_cuda_copy2d_async(aj_ctx *ctx, aj_cuda_device *d, void *dst, size_t dpitch,
                               const void *src, size_t spitch, size_t width, size_t height,
                               void *stream)
{
    aj_status st = AJ_OK;
    const aj_cu_memcpy2d c = {.srcMemoryType = AJ_CU_MEMORYTYPE_DEVICE,
                              .srcDevice = (CUdeviceptr)(uintptr_t)src, .srcPitch = spitch,
                              .dstMemoryType = AJ_CU_MEMORYTYPE_DEVICE,
                              .dstDevice = (CUdeviceptr)(uintptr_t)dst, .dstPitch = dpitch,
                              .WidthInBytes = width, .Height = height};
    WITH_CONTEXT(d, d->cu->Memcpy2DAsync(&c, (CUstream)stream), "cuMemcpy2DAsync");
done:
    return st;
}

aj_status aj_cuda_fill32_async(aj_ctx *ctx, aj_cuda_device *d, void *dst, uint32_t value,
                               size_t count, void *stream)
{
    aj_status st = AJ_OK;
    WITH_CONTEXT(d, d->cu->MemsetD32Async((CUdeviceptr)(uintptr_t)dst, value, count,
                                          (CUstream)stream), "cuMemsetD32Async");
done:
    return st;
}

aj_status aj_cuda_capturing(aj_ctx *ctx, aj_cuda_device *d, void *stream, bool *capturing)
{
    aj_status st = AJ_OK;
    int status = 0;
    *capturing = false;
    if (!d->cu->StreamIsCapturing || !d->cu->LaunchHostFunc)
        return AJ_OK;
    WITH_CONTEXT(d, d->cu->StreamIsCapturing((CUstream)stream, &status), "cuStreamIsCapturing");
    *capturing = status == 1;   /* CU_STREAM_CAPTURE_STATUS_ACTIVE */
done:
    return st;
}

void aj_cuda_relax_capture_mode(aj_cuda_device *d)
{
    int mode = 2;   /* CU_STREAM_CAPTURE_MODE_RELAXED */
    if (d->cu->ThreadExchangeStreamCaptureMode)
        d->cu->ThreadExchangeStreamCaptureMode(&mode);
}

aj_status aj_cuda_host_func(aj_ctx *ctx, aj_cuda_device *d, void *stream, void (*fn)(void *),
                            void *user)
{
    aj_status st = AJ_OK;
    WITH_CONTEXT(d, d->cu->LaunchHostFunc((CUstream)stream, fn, user), "cuLaunchHostFunc");
done:
    return st;
}

aj_status aj_cuda_wait(aj_ctx *ctx, aj_cuda_device *d, void *stream, double timeout_s,
                       const char *what)
{
    aj_status st = AJ_OK;
    const aj_cuda *cu = d->cu;
    CUevent done_event = NULL;
    int pushed = 0;
    AJ_CU_TRY(ctx, cu, cu->CtxPushCurrent(d->cuctx), "cuCtxPushCurrent");
    pushed = 1;
    AJ_CU_TRY(ctx, cu, cu->EventCreate(&done_event, AJ_CU_EVENT_DISABLE_TIMING),
              "cuEventCreate");
    AJ_CU_TRY(ctx, cu, cu->EventRecord(done_event, (CUstream)stream), "cuEventRecord");
    const double start = aj_now();
    for (;;) {
        CUresult r = cu->EventQuery(done_event);
        if (r == AJ_CUDA_SUCCESS)
            break;
        if (r != AJ_CUDA_ERROR_NOT_READY)
            AJ_CU_TRY(ctx, cu, r, what);
        if (aj_now() - start > timeout_s) {
            st = aj_fail(ctx, AJ_ERR_COMM, "%s did not finish within the comm timeout of "
                         "%g s; the GPU work waits on a peer that has stopped or died", what,
                         timeout_s);
            goto done;
        }
        const struct timespec pause = {0, 20000};   /* 20 us: the host core for others */
        nanosleep(&pause, NULL);
    }
done:
    if (done_event)
        cu->EventDestroy(done_event);
    if (pushed) {
        CUcontext popped;
        cu->CtxPopCurrent(&popped);
    }
    return st;
}

/* ---------------------------------------------------------------- scratch */

/* The slot for `stream`: its own, else the least recently used idle one. */
static aj_cuda_scratch_slot *scratch_slot(aj_cuda_device *d, CUstream stream)
{
    aj_cuda_scratch_slot *best = NULL;
    for (int i = 0; i < AJ_CUDA_SCRATCH_SLOTS; i++) {
        aj_cuda_scratch_slot *s = &d->scratch[i];
        if (s->busy)
            continue;
        if (s->ptr && s->stream == stream)
            return s;
        if (!best || s->last_use < best->last_use)
            best = s;
    }
    return best;
}

aj_status aj_cuda_scratch(aj_ctx *ctx, aj_cuda_device *d, void *stream, size_t bytes,
                          void **out)
{
    aj_status st = AJ_OK;
    const aj_cuda *cu = d->cu;
    const CUstream s = (CUstream)stream;
    int pushed = 0;
    pthread_mutex_lock(&d->scratch_lock);
    aj_cuda_scratch_slot *slot = scratch_slot(d, s);
    if (!slot) {
        st = aj_fail(ctx, AJ_ERR_UNSUPPORTED, "more than %d launches without a workspace are "
                     "in flight at once on this device; pass a workspace "
                     "(aj_backward_workspace_size)", AJ_CUDA_SCRATCH_SLOTS);
        goto done;
    }
    AJ_CU_TRY(ctx, cu, cu->CtxPushCurrent(d->cuctx), "cuCtxPushCurrent");
    pushed = 1;
    if (!slot->used)
        AJ_CU_TRY(ctx, cu, cu->EventCreate(&slot->used, AJ_CU_EVENT_DISABLE_TIMING),
                  "cuEventCreate");
    /* another stream's buffer: its work on it comes first */
    if (slot->ptr && slot->stream != s)
        AJ_CU_TRY(ctx, cu, cu->StreamWaitEvent(s, slot->used, 0), "cuStreamWaitEvent");
    slot->stream = s;
    if (slot->bytes < bytes) {
        if (slot->ptr)
            AJ_CU_TRY(ctx, cu, cu->MemFreeAsync(slot->ptr, s), "cuMemFreeAsync");
        slot->ptr = 0;
        slot->bytes = 0;
        AJ_CU_TRY(ctx, cu, cu->MemAlloc(&slot->ptr, bytes ? bytes : 1), "cuMemAlloc");
        slot->bytes = bytes;
    }
    slot->busy = 1;
    slot->last_use = ++d->scratch_clock;
    *out = (void *)(uintptr_t)slot->ptr;
done:
    if (pushed) {
        CUcontext popped;
        cu->CtxPopCurrent(&popped);
    }
    pthread_mutex_unlock(&d->scratch_lock);
    return st;
}

void aj_cuda_scratch_release(aj_cuda_device *d, void *stream)
{
    pthread_mutex_lock(&d->scratch_lock);
    for (int i = 0; i < AJ_CUDA_SCRATCH_SLOTS; i++) {
        aj_cuda_scratch_slot *slot = &d->scratch[i];
        if (!slot->busy || slot->stream != (CUstream)stream)
            continue;
        CUcontext popped;
        if (d->cu->CtxPushCurrent(d->cuctx) == AJ_CUDA_SUCCESS) {
            d->cu->EventRecord(slot->used, (CUstream)stream);
            d->cu->CtxPopCurrent(&popped);
        }
        slot->busy = 0;
        break;
    }
    pthread_mutex_unlock(&d->scratch_lock);
}

/* ---------------------------------------------------------------- tuning */

aj_status aj_cuda_stage_resources(aj_ctx *ctx, aj_cuda_device *d, const aj_kernel *k,
                                  int stage, aj_cuda_resources *out)
{
    aj_status st = AJ_OK;
    const aj_cuda *cu = d->cu;
    AJ_CU_TRY(ctx, cu, cu->CtxPushCurrent(d->cuctx), "cuCtxPushCurrent");
    CUfunction fn = NULL;
    st = function_for(ctx, d, k, stage, &fn);
    if (st == AJ_OK) {
        CUresult r = cu->FuncGetAttribute(&out->registers, AJ_CU_FUNC_ATTRIBUTE_NUM_REGS, fn);
        if (r == AJ_CUDA_SUCCESS)
            r = cu->FuncGetAttribute(&out->local_bytes, AJ_CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
                                     fn);
        if (r == AJ_CUDA_SUCCESS)
            r = cu->FuncGetAttribute(&out->max_threads,
                                     AJ_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn);
        if (r != AJ_CUDA_SUCCESS)
            st = aj_cuda_fail(ctx, cu, r, "cuFuncGetAttribute");
    }
    CUcontext popped;
    cu->CtxPopCurrent(&popped);
done:
    return st;
}

aj_status aj_cuda_time(aj_ctx *ctx, aj_cuda_device *d, void *stream,
                       aj_status (*run)(void *user), void *user, double *ms)
{
    aj_status st = AJ_OK;
    const aj_cuda *cu = d->cu;
    CUevent start = NULL, end = NULL;
    WITH_CONTEXT(d, cu->EventCreate(&start, 0), "cuEventCreate");
    WITH_CONTEXT(d, cu->EventCreate(&end, 0), "cuEventCreate");
    WITH_CONTEXT(d, cu->EventRecord(start, (CUstream)stream), "cuEventRecord");
    AJ_TRY(run(user));
    WITH_CONTEXT(d, cu->EventRecord(end, (CUstream)stream), "cuEventRecord");
    WITH_CONTEXT(d, cu->EventSynchronize(end), "cuEventSynchronize");
    float elapsed = 0;
    WITH_CONTEXT(d, cu->EventElapsedTime(&elapsed, start, end), "cuEventElapsedTime");
    *ms = elapsed;
done:
    if (start || end) {
        CUcontext popped;
        if (cu->CtxPushCurrent(d->cuctx) == AJ_CUDA_SUCCESS) {
            if (start)
                cu->EventDestroy(start);
            if (end)
                cu->EventDestroy(end);
            cu->CtxPopCurrent(&popped);
        }
    }
    return st;
}

/* ---------------------------------------------------------------- TMA */

bool aj_cuda_has_tensor_map(const aj_cuda_device *d)
{
    return d->cu->TensorMapEncodeTiled && d->cc_major >= 9;
}

aj_status aj_cuda_tensor_map(aj_ctx *ctx, aj_cuda_device *d, const aj_tensor_map_args *a,
                             void *map)
{
    aj_status st = AJ_OK;
    if (!aj_cuda_has_tensor_map(d))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "%s cannot encode TMA tensor maps (compute "
                       "capability %d.%d; cuTensorMapEncodeTiled %s)", d->name, d->cc_major,
                       d->cc_minor, d->cu->TensorMapEncodeTiled ? "found" : "missing");
    uint32_t element_strides[5] = {1, 1, 1, 1, 1};
    int swizzle = a->span == 128 ? 3 : a->span == 64 ? 2 : a->span == 32 ? 1 : 0;
    AJ_CU_TRY(ctx, d->cu,
              d->cu->TensorMapEncodeTiled(map, a->dtype == AJ_DTYPE_BF16 ? 9 : 6,
                                          (uint32_t)a->rank, (void *)a->base, a->dims,
                                          a->strides + 1, a->box, element_strides, 0, swizzle,
                                          2, 0),
              "cuTensorMapEncodeTiled");
done:
    return st;
}
