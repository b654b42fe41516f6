/*
 * fake_cuda.c -- a stand-in libcuda.so.1 for testing how attnjit loads the
 * CUDA driver on machines without a GPU.  FAKE_CUDA_MODE picks what it
 * pretends: "no_device" (cuInit fails with CUDA_ERROR_NO_DEVICE),
 * "no_gpus" (initialises, 0 devices), "old_gpu" (one compute-capability
 * 7.5 device).  Built with FAKE_CUDA_OLD_DRIVER it lacks cuLaunchKernel,
 * like a driver too old for attnjit.
 *
 * For the NCCL engine's tests (tests/ring/test_nccl.c) it also keeps
 * "device" memory in host memory, copies with memcpy, and has streams and
 * events that are done at once -- or never, in mode "stuck", where every
 * event stays CUDA_ERROR_NOT_READY like a kernel waiting on a dead peer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;

static const char *mode(void)
{
    const char *m = getenv("FAKE_CUDA_MODE");
    return m ? m : "no_device";
}

CUresult cuInit(unsigned flags);
CUresult cuInit(unsigned flags)
{
    return strcmp(mode(), "no_device") == 0 ? 100 : 0;
}

CUresult cuDriverGetVersion(int *v);
CUresult cuDriverGetVersion(int *v)
{
    *v = 12040;
    return 0;
}

CUresult cuDeviceGetCount(int *n);
CUresult cuDeviceGetCount(int *n)
{
    *n = strcmp(mode(), "old_gpu") == 0 ? 1 : 0;
    return 0;
}

CUresult cuDeviceGet(int *d, int i);
CUresult cuDeviceGet(int *d, int i)
{
    *d = i;
    return 0;
}

CUresult cuDeviceGetName(char *name, int len, int d);
CUresult cuDeviceGetName(char *name, int len, int d)
{
    strncpy(name, "Fake GPU T4", (size_t)len);
    return 0;
}

CUresult cuDeviceGetAttribute(int *v, int attrib, int d);
CUresult cuDeviceGetAttribute(int *v, int attrib, int d)
{
    *v = attrib == 75 ? 7 : attrib == 76 ? 5 : 65536;
    return 0;
}

CUresult cuGetErrorName(CUresult r, const char **s);
CUresult cuGetErrorName(CUresult r, const char **s)
{
    *s = r == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}

CUresult cuGetErrorString(CUresult r, const char **s);
CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = r == 100 ? "no CUDA-capable device is detected" : "unknown error";
    return 0;
}

/* device memory is host memory; a copy is done when it is queued */
CUresult cuMemAlloc_v2(unsigned long long *p, size_t bytes);
CUresult cuMemAlloc_v2(unsigned long long *p, size_t bytes)
{
    if (bytes == 0)
        return 1;   /* CUDA_ERROR_INVALID_VALUE, as the driver answers */
    void *m = malloc(bytes);
    *p = (unsigned long long)(uintptr_t)m;
    return m ? 0 : 2;   /* CUDA_ERROR_OUT_OF_MEMORY */
}

CUresult cuMemFree_v2(unsigned long long p);
CUresult cuMemFree_v2(unsigned long long p)
{
    free((void *)(uintptr_t)p);
    return 0;
}

/* pinned host memory is host memory */
CUresult cuMemAllocHost_v2(void **p, size_t bytes);
CUresult cuMemAllocHost_v2(void **p, size_t bytes)
{
    *p = malloc(bytes);
    return *p ? 0 : 2;
}

CUresult cuMemFreeHost(void *p);
CUresult cuMemFreeHost(void *p)
{
    free(p);
    return 0;
}

CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *s);
CUresult cuMemcpyHtoDAsync_v2(unsigned long long dst, const void *src, size_t n, void *s)
{
    if (!dst || !src)
        return 1;   /* CUDA_ERROR_INVALID_VALUE */
    memcpy((void *)(uintptr_t)dst, src, n);
    return 0;
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t n, void *s);
CUresult cuMemcpyDtoHAsync_v2(void *dst, unsigned long long src, size_t n, void *s)
{
    if (!dst || !src)
        return 1;
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}

/* streams and events are tokens: the work they order is already done */
static int token;

CUresult cuStreamCreate(void **s, unsigned flags);
CUresult cuStreamCreate(void **s, unsigned flags)
{
    *s = &token;
    return 0;
}

CUresult cuEventCreate(void **e, unsigned flags);
CUresult cuEventCreate(void **e, unsigned flags)
{
    *e = &token;
    return 0;
}

CUresult cuEventQuery(void *e);
CUresult cuEventQuery(void *e)
{
    return strcmp(mode(), "stuck") == 0 ? 600 : 0;   /* CUDA_ERROR_NOT_READY */
}

#define OK(name) CUresult name(void); CUresult name(void) { return 0; }
OK(cuCtxPushCurrent_v2)
OK(cuCtxPopCurrent_v2)
OK(cuStreamDestroy_v2)
OK(cuEventRecord)
OK(cuEventDestroy_v2)

/* the rest are never reached in these scenarios, but must exist */
#define STUB(name) CUresult name(void); CUresult name(void) { return 999; }
STUB(cuDevicePrimaryCtxRetain)
STUB(cuDevicePrimaryCtxRelease_v2)
STUB(cuCtxGetDevice)
STUB(cuCtxSynchronize)
STUB(cuModuleLoadDataEx)
STUB(cuModuleUnload)
STUB(cuModuleGetFunction)
STUB(cuFuncSetAttribute)
STUB(cuFuncGetAttribute)
STUB(cuStreamSynchronize)
STUB(cuMemcpyHtoD_v2)
STUB(cuMemcpyDtoH_v2)
STUB(cuMemsetD8_v2)
STUB(cuEventSynchronize)
STUB(cuEventElapsedTime)
#ifndef FAKE_CUDA_OLD_DRIVER
STUB(cuLaunchKernel)
#endif
