/*
 * fake_cuda.c -- a stand-in libcuda.so.1 for testing how attnjit loads the
 * CUDA driver on machines without a GPU.  FAKE_CUDA_MODE picks what it
 * pretends: "no_device" (cuInit fails with CUDA_ERROR_NO_DEVICE),
 * "no_gpus" (initialises, 0 devices), "old_gpu" (one compute-capability
 * 7.5 device).  Built with FAKE_CUDA_OLD_DRIVER it lacks cuLaunchKernel,
 * like a driver too old for attnjit.
 */
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

/* the rest are never reached in these scenarios, but must exist */
#define STUB(name) CUresult name(void); CUresult name(void) { return 999; }
STUB(cuDevicePrimaryCtxRetain)
STUB(cuDevicePrimaryCtxRelease_v2)
STUB(cuCtxPushCurrent_v2)
STUB(cuCtxPopCurrent_v2)
STUB(cuCtxGetDevice)
STUB(cuCtxSynchronize)
STUB(cuModuleLoadDataEx)
STUB(cuModuleUnload)
STUB(cuModuleGetFunction)
STUB(cuFuncSetAttribute)
STUB(cuFuncGetAttribute)
STUB(cuStreamSynchronize)
STUB(cuMemAlloc_v2)
STUB(cuMemFree_v2)
STUB(cuMemcpyHtoD_v2)
STUB(cuMemcpyDtoH_v2)
STUB(cuMemsetD8_v2)
STUB(cuEventCreate)
STUB(cuEventRecord)
STUB(cuEventSynchronize)
STUB(cuEventElapsedTime)
STUB(cuEventDestroy_v2)
#ifndef FAKE_CUDA_OLD_DRIVER
STUB(cuLaunchKernel)
#endif
