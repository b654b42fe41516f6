/*
 * cuda_api.h -- the CUDA driver API as attnjit uses it, loaded at run time.
 *
 * No CUDA header or toolkit is needed to build attnjit: the few types and
 * constants used are declared here with the driver's values, and every
 * function is resolved with dlsym from libcuda.so.1 by the versioned name
 * the driver exports (the `_v2` names that cuda.h's macros select).
 */
#ifndef AJ_RUNTIME_CUDA_API_H
#define AJ_RUNTIME_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "ir/diag.h"

typedef int CUresult;                 /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUlinkState_st *CUlinkState;

enum {
    AJ_CUDA_SUCCESS = 0,
    /* CUjit_option */
    AJ_CU_JIT_INFO_LOG_BUFFER = 3,
    AJ_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
    AJ_CU_JIT_ERROR_LOG_BUFFER = 5,
    AJ_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
    AJ_CU_JIT_LOG_VERBOSE = 12,
    /* CUfunction_attribute */
    AJ_CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
    AJ_CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    AJ_CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    AJ_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    /* CUdevice_attribute */
    AJ_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    AJ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    AJ_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    AJ_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    /* CUjitInputType */
    AJ_CU_JIT_INPUT_PTX = 1,
    /* cuEventQuery: the work before the event is still running */
    AJ_CUDA_ERROR_NOT_READY = 600,
    AJ_CU_STREAM_NON_BLOCKING = 1,
    AJ_CU_EVENT_DISABLE_TIMING = 2,
};

/* cuda.h's CUDA_MEMCPY2D (v2): a copy of Height rows of WidthInBytes,
 * rows srcPitch / dstPitch apart; memory types host 1, device 2. */
typedef struct aj_cu_memcpy2d {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} aj_cu_memcpy2d;
enum { AJ_CU_MEMORYTYPE_DEVICE = 2 };

/* X(field, "exported symbol", return, (parameters)) -- one row per
 * driver function attnjit calls. */
#define AJ_CUDA_FUNCTIONS(X)                                                             \
    X(Init, "cuInit", (unsigned flags))                                                  \
    X(DriverGetVersion, "cuDriverGetVersion", (int *version))                            \
    X(DeviceGetCount, "cuDeviceGetCount", (int *count))                                  \
    X(DeviceGet, "cuDeviceGet", (CUdevice *dev, int ordinal))                            \
    X(DeviceGetName, "cuDeviceGetName", (char *name, int len, CUdevice dev))             \
    X(DeviceGetAttribute, "cuDeviceGetAttribute", (int *value, int attrib, CUdevice dev))\
    X(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", (CUcontext *ctx, CUdevice dev))\
    X(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", (CUdevice dev))           \
    X(CtxPushCurrent, "cuCtxPushCurrent_v2", (CUcontext ctx))                            \
    X(CtxPopCurrent, "cuCtxPopCurrent_v2", (CUcontext *ctx))                             \
    X(CtxGetDevice, "cuCtxGetDevice", (CUdevice *dev))                                   \
    X(CtxSynchronize, "cuCtxSynchronize", (void))                                        \
    X(ModuleLoadData, "cuModuleLoadData", (CUmodule *mod, const void *image))            \
    X(LinkCreate, "cuLinkCreate_v2",                                                     \
      (unsigned n, int *options, void **values, CUlinkState *state))                     \
    X(LinkAddData, "cuLinkAddData_v2",                                                   \
      (CUlinkState state, int type, void *data, size_t size, const char *name,           \
       unsigned n, int *options, void **values))                                         \
    X(LinkComplete, "cuLinkComplete", (CUlinkState state, void **cubin, size_t *size))   \
    X(LinkDestroy, "cuLinkDestroy", (CUlinkState state))                                 \
    X(ModuleUnload, "cuModuleUnload", (CUmodule mod))                                    \
    X(ModuleGetFunction, "cuModuleGetFunction", (CUfunction *f, CUmodule mod,            \
                                                 const char *name))                      \
    X(FuncSetAttribute, "cuFuncSetAttribute", (CUfunction f, int attrib, int value))     \
    X(FuncGetAttribute, "cuFuncGetAttribute", (int *value, int attrib, CUfunction f))    \
    X(LaunchKernel, "cuLaunchKernel",                                                    \
      (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,    \
       unsigned bz, unsigned smem, CUstream stream, void **params, void **extra))        \
    X(StreamSynchronize, "cuStreamSynchronize", (CUstream stream))                       \
    X(StreamCreate, "cuStreamCreate", (CUstream *stream, unsigned flags))                \
    X(StreamDestroy, "cuStreamDestroy_v2", (CUstream stream))                            \
    X(MemAlloc, "cuMemAlloc_v2", (CUdeviceptr *ptr, size_t bytes))                       \
    X(MemFree, "cuMemFree_v2", (CUdeviceptr ptr))                                        \
    X(MemAllocHost, "cuMemAllocHost_v2", (void **ptr, size_t bytes))                     \
    X(MemFreeHost, "cuMemFreeHost", (void *ptr))                                         \
    X(MemcpyHtoD, "cuMemcpyHtoD_v2", (CUdeviceptr dst, const void *src, size_t bytes))   \
    X(MemcpyDtoH, "cuMemcpyDtoH_v2", (void *dst, CUdeviceptr src, size_t bytes))         \
    X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2",                                           \
      (CUdeviceptr dst, const void *src, size_t bytes, CUstream stream))                 \
    X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2",                                           \
      (void *dst, CUdeviceptr src, size_t bytes, CUstream stream))                       \
    X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2",                                           \
      (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream))                 \
    X(Memcpy2DAsync, "cuMemcpy2DAsync_v2", (const aj_cu_memcpy2d *copy, CUstream stream))  \
    X(MemsetD8, "cuMemsetD8_v2", (CUdeviceptr dst, unsigned char value, size_t n))       \
    X(MemsetD32Async, "cuMemsetD32Async",                                                \
      (CUdeviceptr dst, unsigned value, size_t n, CUstream stream))                      \
    X(MemFreeAsync, "cuMemFreeAsync", (CUdeviceptr ptr, CUstream stream))                \
    X(StreamWaitEvent, "cuStreamWaitEvent", (CUstream stream, CUevent event, unsigned flags))\
    X(EventCreate, "cuEventCreate", (CUevent *event, unsigned flags))                    \
    X(EventRecord, "cuEventRecord", (CUevent event, CUstream stream))                    \
    X(EventSynchronize, "cuEventSynchronize", (CUevent event))                           \
    X(EventQuery, "cuEventQuery", (CUevent event))                                       \
    X(EventElapsedTime, "cuEventElapsedTime", (float *ms, CUevent start, CUevent end))   \
    X(EventDestroy, "cuEventDestroy_v2", (CUevent event))                                \
    X(GetErrorName, "cuGetErrorName", (CUresult error, const char **name))               \
    X(GetErrorString, "cuGetErrorString", (CUresult error, const char **text))

enum { AJ_CUDA_FUNCTION_COUNT_CHECK = 0
#define AJ_CUDA_COUNT(field, sym, params) +1
    AJ_CUDA_FUNCTIONS(AJ_CUDA_COUNT)
#undef AJ_CUDA_COUNT
};

/* cuTensorMapEncodeTiled (CUDA 12.0+): optional, NULL in an older
 * driver, whose devices then load by cp.async (docs/gpu.md).  The enum
 * values are the driver's: data type f16 6, bf16 9; swizzle none 0, 32 B
 * 1, 64 B 2, 128 B 3; L2 promotion 128 B 2; interleave and OOB fill 0. */
typedef CUresult (*aj_cu_tensor_map_encode_tiled)(
    void *map, int data_type, uint32_t rank, void *base, const uint64_t *dims,
    const uint64_t *strides, const uint32_t *box, const uint32_t *element_strides,
    int interleave, int swizzle, int l2_promotion, int oob_fill);

typedef struct aj_cuda {
#define AJ_CUDA_FIELD(field, sym, params) CUresult (*field) params;
    AJ_CUDA_FUNCTIONS(AJ_CUDA_FIELD)
#undef AJ_CUDA_FIELD
    aj_cu_tensor_map_encode_tiled TensorMapEncodeTiled;
    /* A stand-in libcuda's mark (tests/fake_cuda): its device memory is
     * host memory, so the emulator can run each launch again over it
     * (emulated launches, docs/design.md); NULL in a real driver. */
    int (*stand_in_host_memory)(void);
    /* the stand-in's stream-order model: a kernel's read (write) of device
     * memory, reported by the emulated launch after the launch on
     * `stream` (tests/fake_cuda); NULL in a real driver */
    void (*stand_in_access)(CUstream stream, const void *p, size_t bytes, int write,
                            const char *what);
    /* cuStreamIsCapturing and cuLaunchHostFunc (CUDA 10+), for emulated
     * launches inside a CUDA graph capture (the twin's run queued as a host
     * function, aj_cuda_host_func); NULL where the driver lacks them */
    CUresult (*StreamIsCapturing)(CUstream stream, int *status);
    CUresult (*LaunchHostFunc)(CUstream stream, void (*fn)(void *), void *user);
    /* cuThreadExchangeStreamCaptureMode (CUDA 10.1+): the calling thread's
     * capture mode (relaxed: 2), for the ring's watchdog thread, whose
     * event queries another thread's global-mode capture would otherwise
     * refuse; NULL where the driver lacks it */
    CUresult (*ThreadExchangeStreamCaptureMode)(int *mode);
    int driver_version;
} aj_cuda;

/* The driver, loaded and initialised once per process (thread-safe).
 * AJ_ERR_NO_DEVICE with a message saying what is missing. */
aj_status aj_cuda_get(aj_ctx *ctx, const aj_cuda **out);

/* Maps a CUresult to AJ_ERR_NO_DEVICE / AJ_ERR_INVALID_ARG / AJ_ERR_INTERNAL
 * with "what: CUDA_ERROR_NAME (description)" on ctx. */
aj_status aj_cuda_fail(aj_ctx *ctx, const aj_cuda *cu, CUresult r, const char *what);

/* Evaluates a driver call; on failure records it and jumps to `done`
 * with `st` set (the enclosing function declares both). */
#define AJ_CU_TRY(ctx, cu, call, what)                        \
    do {                                                      \
        CUresult cu_r_ = (call);                              \
        if (cu_r_ != AJ_CUDA_SUCCESS) {                       \
            st = aj_cuda_fail((ctx), (cu), cu_r_, (what));    \
            goto done;                                        \
        }                                                     \
    } while (0)

#endif /* AJ_RUNTIME_CUDA_API_H */
