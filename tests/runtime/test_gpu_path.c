/*
 * test_gpu_path.c -- attnjit's GPU path on the stand-in libcuda
 * (tests/fake_cuda, FAKE_CUDA_MODE=gpu): it cannot run kernels, but it
 * tells device memory from host memory, poisons the context when a kernel
 * is handed host memory, and logs every call with the stream it went to.
 * So these tests check the protocol, not numbers (sim and cpu check those
 * against the float64 reference):
 *
 *   test_gpu_path launch   a forward on the caller's stream with nothing
 *                          else queued or synchronised; a backward without
 *                          a workspace twice: no allocation, free or
 *                          synchronisation on the second call; a varlen
 *                          forward with no copy back to the host; a
 *                          forward, varlen forward, paged decode and
 *                          backward captured into a CUDA graph after a
 *                          first call (nothing refused, two replays), a
 *                          first backward's allocation refused; the
 *                          memory cache's bound evicting kernels unloads
 *                          their modules (after the context's work), a
 *                          kernel the caller holds stays loaded, and one
 *                          freed after its device closed is left alone;
 *                          host memory handed to a kernel:
 *                          AJ_ERR_KERNEL_FAULT at the next synchronising
 *                          call
 *   test_gpu_path capture  (AJ_CUDA_EMULATE=1: emulated launches, real
 *                          numbers) a forward and a backward captured into
 *                          a CUDA graph compute nothing at the capture;
 *                          each of two replays writes the outputs a plain
 *                          call wrote, bit for bit
 *   test_gpu_path sass     (AJ_CACHE unset) a kernel's first load links its
 *                          PTX to a cubin (cuLinkComplete) and stores it
 *                          in the disk cache; aj_compile_many with the
 *                          device loads each kernel on its worker; a new
 *                          context (a later process) loads the cached
 *                          cubin (cuModuleLoadData) without the linker
 *   test_gpu_path ring     (mpirun) the ring forward and backward on a cuda
 *                          device: launches on the ring's own stream,
 *                          never a context synchronisation, nothing
 *                          allocated or freed between the first launch and
 *                          the last; host buffers pinned (no copy staged
 *                          through pageable memory), and a second call
 *                          pins nothing (the device reuses the blocks);
 *                          Ulysses likewise on its stream, with device
 *                          memory only
 *   test_gpu_path ring-nccl
 *                          (mpirun, the stand-in libnccl) the same over
 *                          the NCCL engine, where the ring and Ulysses are
 *                          resident: no pinned memory, K/V packed (the
 *                          all-to-all's blocks moved) on the device,
 *                          between host and device only the opening
 *                          agreement's bytes in each call, and the ring's
 *                          second call allocating nothing; then each
 *                          asynchronously (a stream of the test's): no
 *                          wait, no host copy, ordered after the stream;
 *                          hybrid and packed documents: no attention data
 *                          between host and device either
 *   test_gpu_path ring-capture
 *                          (mpirun, 2 ranks, AJ_CUDA_EMULATE=1, the
 *                          stand-in libnccl) asynchronous ring, Ulysses and
 *                          hybrid forward and backward captured into graphs
 *                          after a first call: nothing refused or computed
 *                          at the capture, two replays on both ranks
 *                          writing the plain call's bits
 *   test_gpu_path async-failure
 *                          (one rank, FAKE_CUDA_STUCK=1 or
 *                          FAKE_NCCL_MODE=async_error) an asynchronous
 *                          call returns at once; the watchdog finds the
 *                          failure, aborts NCCL, and the comm answers it
 *   test_gpu_path stuck    (mpirun, FAKE_CUDA_STUCK=1: GPU work never ends)
 *   test_gpu_path stuck-nccl
 *                          the same for the resident ring over NCCL, whose
 *                          communicator it must then abort (its transfers
 *                          are joined to its stream, never waited on)
 *                          the ring fails with AJ_ERR_COMM within its
 *                          timeout instead of hanging in the driver
 */
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check_compile.h"
#include "launch_args.h"
#include "stand_in_cuda.h"
#include "temp_dir.h"
#include "cp/cp.h"   /* aj_cp_call: the opening agreement's bytes */

static aj_ctx *ctx;
static aj_device *dev;
static const char *(*cuda_log)(void);
static void (*cuda_log_clear)(void);
static int (*stream_create)(void **stream, unsigned flags);

/* The stand-in's log hooks and cuStreamCreate, from the libcuda.so.1
 * attnjit loaded. */
static void bind_fake(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK_MSG(h, "libcuda.so.1 is not loaded: %s", dlerror());
    if (!h)
        exit(check_report());
    *(void **)&cuda_log = dlsym(h, "fake_cuda_log");
    *(void **)&cuda_log_clear = dlsym(h, "fake_cuda_log_clear");
    *(void **)&stream_create = dlsym(h, "cuStreamCreate");
    CHECK_MSG(cuda_log && cuda_log_clear && stream_create,
              "libcuda.so.1 is not the stand-in (tests/fake_cuda)");
    if (!cuda_log || !cuda_log_clear || !stream_create)
        exit(check_report());
}

#define CHECK_LOG_HAS(what)                                                                 \
    CHECK_MSG(stand_in_count(cuda_log(), what) > 0, "the driver log lacks \"%s\":\n%s",     \
              (what), cuda_log())
#define CHECK_LOG_LACKS(what)                                                               \
    CHECK_MSG(stand_in_count(cuda_log(), what) == 0, "the driver log has \"%s\":\n%s",      \
              (what), cuda_log())

static aj_kernel *compile(const char *spec)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.device = dev;
    opt.target = aj_device_target(dev);
    aj_kernel *k = check_compile(ctx, spec, "spec", &opt);
    if (!k)
        exit(check_report());
    return k;
}

/* A contiguous tensor in device memory (zeroed). */
static aj_tensor dev_tensor(aj_dtype dtype, int rank, const int64_t *shape)
{
    aj_tensor t = {.dtype = dtype, .rank = rank};
    int64_t n = 1;
    for (int i = rank - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = n;
        n *= shape[i];
    }
    size_t bytes = (size_t)n * (dtype == AJ_DTYPE_F32 ? 4 : 2);
    CHECK_STATUS(ctx, aj_device_alloc(dev, bytes, &t.data), AJ_OK);
    void *zero = calloc(1, bytes);
    CHECK_STATUS(ctx, aj_device_copy_to(dev, t.data, zero, bytes), AJ_OK);
    free(zero);
    return t;
}

enum { B = 1, H = 2, S = 64, D = 64 };

static aj_fwd_args fwd_args(void *stream)
{
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    const int64_t qs[4] = {B, H, S, D}, ls[3] = {B, H, S};
    a.q = dev_tensor(AJ_DTYPE_F16, 4, qs);
    a.k = dev_tensor(AJ_DTYPE_F16, 4, qs);
    a.v = dev_tensor(AJ_DTYPE_F16, 4, qs);
    a.o = dev_tensor(AJ_DTYPE_F16, 4, qs);
    a.lse = dev_tensor(AJ_DTYPE_F32, 3, ls);
    a.stream = stream;
    return a;
}

static void free_tensors(aj_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++)
        aj_device_free(dev, ts[i]->data);
}

/* A forward on the caller's stream queues its launch there and nothing
 * else: no synchronisation, no copy, no allocation. */
static void check_forward_stream(void *stream)
{
    aj_kernel *k = compile("attention forward flash { dtype = f16 head_dim = 64 }");
    aj_fwd_args a = fwd_args(stream);
    cuda_log_clear();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
    CHECK_LOG_HAS("LaunchKernel");
    CHECK_LOG_HAS("stream=1");
    CHECK_LOG_LACKS("stream=0");
    CHECK_LOG_LACKS("Synchronize");
    CHECK_LOG_LACKS("Memcpy");
    CHECK_LOG_LACKS("MemAlloc");
    CHECK_LOG_LACKS("FAULT");
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    free_tensors((aj_tensor *[]){&a.q, &a.k, &a.v, &a.o, &a.lse}, 5);
    aj_kernel_destroy(k);
}

/* aj_backward without a workspace, twice on one stream: the device keeps
 * one and reuses it, so neither call synchronises or frees, and the
 * second allocates nothing. */
static void check_backward_workspace(void *stream)
{
    aj_kernel *k = compile("attention backward flash { dtype = f16 head_dim = 64 }");
    const int64_t qs[4] = {B, H, S, D}, ls[3] = {B, H, S};
    aj_bwd_args a = AJ_BWD_ARGS_INIT;
    aj_tensor *ts[] = {&a.q, &a.k, &a.v, &a.o, &a.do_, &a.dq, &a.dk, &a.dv};
    for (int i = 0; i < 8; i++)
        *ts[i] = dev_tensor(AJ_DTYPE_F16, 4, qs);
    a.lse = dev_tensor(AJ_DTYPE_F32, 3, ls);
    a.stream = stream;
    for (int call = 0; call < 2; call++) {
        cuda_log_clear();
        CHECK_STATUS(ctx, aj_backward(ctx, dev, k, &a), AJ_OK);
        CHECK_LOG_HAS("LaunchKernel");
        CHECK_LOG_LACKS("stream=0");
        CHECK_LOG_LACKS("Synchronize");
        CHECK_LOG_LACKS("MemFree");
        if (call == 1)
            CHECK_LOG_LACKS("MemAlloc");
    }
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    free_tensors(ts, 8);
    aj_device_free(dev, a.lse.data);
    aj_kernel_destroy(k);
}

/* n int32 values in device memory (the tensor's dtype a stand-in: the
 * launches read the pointer). */
static aj_tensor dev_i32(const int32_t *values, int64_t n)
{
    aj_tensor t = dev_tensor(AJ_DTYPE_F32, 1, &n);
    CHECK_STATUS(ctx, aj_device_copy_to(dev, t.data, values, (size_t)n * 4), AJ_OK);
    return t;
}

/* A varlen forward's arguments: two sequences packed, cu_seqlens in
 * device memory (*cq, *ck). */
static aj_fwd_args varlen_args(void *stream, aj_tensor *cq, aj_tensor *ck)
{
    const int32_t cu[3] = {0, 24, 64};
    const int64_t ts3[3] = {S, H, D}, ls[2] = {H, S};
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    aj_tensor *rows[4] = {&a.q, &a.k, &a.v, &a.o};
    for (int i = 0; i < 4; i++)
        *rows[i] = dev_tensor(AJ_DTYPE_F16, 3, ts3);
    a.lse = dev_tensor(AJ_DTYPE_F32, 2, ls);
    *cq = dev_i32(cu, 3), *ck = dev_i32(cu, 3);
    a.cu_seqlens_q = cq->data;
    a.cu_seqlens_k = ck->data;
    a.batch = 2;
    a.max_seqlen_q = a.max_seqlen_k = 40;
    a.stream = stream;
    return a;
}

/* A varlen forward reads cu_seqlens on the device only: no copy back to
 * the host, nothing but the launch on the stream. */
static void check_varlen_async(void *stream)
{
    aj_kernel *k = compile("attention forward flash { dtype = f16 head_dim = 64 "
                           "layout = varlen }");
    aj_tensor cq, ck;
    aj_fwd_args a = varlen_args(stream, &cq, &ck);
    cuda_log_clear();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
    CHECK_LOG_HAS("LaunchKernel");
    CHECK_LOG_LACKS("MemcpyDtoH");
    CHECK_LOG_LACKS("Synchronize");
    CHECK_LOG_LACKS("stream=0");
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    free_tensors((aj_tensor *[]){&a.q, &a.k, &a.v, &a.o, &a.lse, &cq, &ck}, 7);
    aj_kernel_destroy(k);
}

/* ---------------------------------------------------------------- capture */

/* The stand-in's graph capture (tests/fake_cuda: global mode, refusing
 * what a capture forbids) */
static struct {
    int (*begin)(void *stream, int mode);
    int (*end)(void *stream, void **graph);
    int (*instantiate)(void **exec, void *graph, unsigned long long flags);
    int (*launch)(void *exec, void *stream);
    int (*exec_destroy)(void *exec);
    int (*destroy)(void *graph);
} graphs;

/* Captures `call` (run once before, outside the capture, when `warm`):
 * whether the capture held (no call refused), and then replays the graph
 * twice, each replay the captured launches again. */
static void capture_call(void *stream, const char *label, int warm,
                         aj_status (*call)(void *user), void *user)
{
    if (warm)
        CHECK_STATUS(ctx, call(user), AJ_OK);
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    cuda_log_clear();
    CHECK_MSG(graphs.begin(stream, 0) == 0, "%s: cuStreamBeginCapture_v2", label);
    aj_status st = call(user);
    void *graph = NULL;
    int ended = graphs.end(stream, &graph);
    const int launches = stand_in_count(cuda_log(), "LaunchKernel");   /* outside the capture */
    CHECK_MSG(launches == 0, "%s: %d launches ran during the capture", label, launches);
    if (!warm) {   /* the first call allocates: refused, the capture invalidated */
        CHECK_MSG(st == AJ_ERR_UNSUPPORTED && ended == 901 &&
                  stand_in_count(cuda_log(), "CAPTURE REFUSED Mem"), "%s: a cold call in a capture "
                  "gave %s, end %d:\n%s", label, aj_status_str(st), ended, cuda_log());
        CHECK_ERROR(ctx, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED");
        CHECK_ERROR(ctx, "run one before capturing");
        return;
    }
    CHECK_MSG(st == AJ_OK && ended == 0 && graph, "%s: %s (%s), end %d:\n%s", label,
              aj_status_str(st), aj_last_error(ctx), ended, cuda_log());
    CHECK_LOG_LACKS("CAPTURE REFUSED");
    if (!graph)
        return;
    void *exec = NULL;
    CHECK(graphs.instantiate(&exec, graph, 0) == 0);
    cuda_log_clear();
    for (int r = 0; r < 2; r++)
        CHECK(graphs.launch(exec, stream) == 0);
    const int kernels = stand_in_count(cuda_log(), "GraphKernel");
    CHECK_MSG(kernels >= 2 && kernels % 2 == 0, "%s: %d kernels in two replays:\n%s", label,
              kernels, cuda_log());
    graphs.exec_destroy(exec);
    graphs.destroy(graph);
}

static aj_status run_forward(void *user)
{
    void **kv = user;
    return aj_forward(ctx, dev, kv[0], kv[1]);
}

static aj_status run_backward(void *user)
{
    void **kv = user;
    return aj_backward(ctx, dev, kv[0], kv[1]);
}

/* aj_forward and aj_backward (its workspace the device's) capture into a
 * CUDA graph once a call of their size has run: no allocation, query or
 * synchronisation inside (docs/api.md); a backward's first call, which
 * allocates its workspace, is refused by the capture. */
static void bind_graphs(void)
{
    *(void **)&graphs.begin = stand_in_cuda_symbol("cuStreamBeginCapture_v2");
    *(void **)&graphs.end = stand_in_cuda_symbol("cuStreamEndCapture");
    *(void **)&graphs.instantiate = stand_in_cuda_symbol("cuGraphInstantiateWithFlags");
    *(void **)&graphs.launch = stand_in_cuda_symbol("cuGraphLaunch");
    *(void **)&graphs.exec_destroy = stand_in_cuda_symbol("cuGraphExecDestroy");
    *(void **)&graphs.destroy = stand_in_cuda_symbol("cuGraphDestroy");
    CHECK(graphs.begin && graphs.end && graphs.instantiate && graphs.launch &&
          graphs.exec_destroy && graphs.destroy);
    if (!graphs.end || !graphs.instantiate || !graphs.launch || !graphs.exec_destroy ||
        !graphs.destroy)
        graphs.begin = NULL;
}

static void check_capture(void *stream)
{
    bind_graphs();
    if (!graphs.begin)
        return;
    aj_kernel *fk = compile("attention forward flash { dtype = f16 head_dim = 64 "
                            "mask = causal(bottom_right) }");
    aj_fwd_args fa = fwd_args(stream);
    capture_call(stream, "forward", 1, run_forward, (void *[]){fk, &fa});
    aj_kernel *vk = compile("attention forward flash { dtype = f16 head_dim = 64 "
                            "layout = varlen }");
    aj_tensor cq, ck;
    aj_fwd_args va = varlen_args(stream, &cq, &ck);
    capture_call(stream, "varlen forward", 1, run_forward, (void *[]){vk, &va});
    free_tensors((aj_tensor *[]){&va.q, &va.k, &va.v, &va.o, &va.lse, &cq, &ck}, 7);
    aj_kernel_destroy(vk);
    /* a paged decode (what a server captures per batch size), splits from the launch */
    aj_kernel *pk = compile("attention forward efficient { dtype = f16 head_dim = 64 "
                            "layout = paged }");
    const int64_t pq[4] = {2, 4, 1, D}, pl[3] = {2, 4, 1}, cache[4] = {8, 16, 2, D};
    aj_fwd_args pa = AJ_FWD_ARGS_INIT;
    aj_tensor *paged[4] = {&pa.q, &pa.o, &pa.k_cache, &pa.v_cache};
    for (int i = 0; i < 4; i++)
        *paged[i] = dev_tensor(AJ_DTYPE_F16, 4, i < 2 ? pq : cache);
    pa.lse = dev_tensor(AJ_DTYPE_F32, 3, pl);
    const int32_t pages[8] = {0, 1, 2, 3, 4, 5, 6, 7}, seqlens[2] = {50, 17};
    aj_tensor bt = dev_i32(pages, 8), sl = dev_i32(seqlens, 2);   /* a [2, 4] table */
    pa.block_table = bt.data;
    pa.seqlens_k = sl.data;
    pa.max_pages = 4;
    pa.stream = stream;
    capture_call(stream, "paged forward", 1, run_forward, (void *[]){pk, &pa});
    free_tensors((aj_tensor *[]){&pa.q, &pa.o, &pa.lse, &pa.k_cache, &pa.v_cache, &bt, &sl}, 7);
    aj_kernel_destroy(pk);
    /* a backward whose workspace is larger than any before: cold, then warm */
    aj_kernel *bk = compile("attention backward flash { dtype = f16 head_dim = 64 }");
    const int64_t qs[4] = {B, 2 * H, 2 * S, D}, ls[3] = {B, 2 * H, 2 * S};
    aj_bwd_args ba = AJ_BWD_ARGS_INIT;
    aj_tensor *ts[] = {&ba.q, &ba.k, &ba.v, &ba.o, &ba.do_, &ba.dq, &ba.dk, &ba.dv, &ba.lse};
    for (int i = 0; i < 8; i++)
        *ts[i] = dev_tensor(AJ_DTYPE_F16, 4, qs);
    ba.lse = dev_tensor(AJ_DTYPE_F32, 3, ls);
    ba.stream = stream;
    capture_call(stream, "backward, cold", 0, run_backward, (void *[]){bk, &ba});
    capture_call(stream, "backward", 1, run_backward, (void *[]){bk, &ba});
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    free_tensors((aj_tensor *[]){&fa.q, &fa.k, &fa.v, &fa.o, &fa.lse}, 5);
    free_tensors(ts, 9);
    aj_kernel_destroy(fk);
    aj_kernel_destroy(bk);
}

/* A tensor's bytes, read back (malloc'ed), and set to `fill` there. */
static void *read_back(const aj_tensor *t, size_t bytes, int fill)
{
    void *host = malloc(bytes), *filled = malloc(bytes);
    CHECK_STATUS(ctx, aj_device_copy_from(dev, host, t->data, bytes), AJ_OK);
    memset(filled, fill, bytes);
    CHECK_STATUS(ctx, aj_device_copy_to(dev, t->data, filled, bytes), AJ_OK);
    free(filled);
    return host;
}

/* The outputs of `call`, `n` tensors of bytes[i]: a plain call's; then a
 * capture, after which they must still hold the 0x7f bytes set before it
 * (nothing ran); then two replays, each writing the plain call's bits
 * again (emulated launches: the twin's run is each replay's host node). */
static void replay_numbers(void *stream, const char *label, aj_status (*call)(void *user),
                           void *user, aj_tensor *const *outs, const size_t *bytes, int n,
                           void (*between)(void *user))
{
    void *want[4], *got;
    CHECK_STATUS(ctx, call(user), AJ_OK);
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    for (int i = 0; i < n; i++)
        want[i] = read_back(outs[i], bytes[i], 0x7f);
    void *graph = NULL, *exec = NULL;
    CHECK(graphs.begin(stream, 0) == 0);
    CHECK_STATUS(ctx, call(user), AJ_OK);
    CHECK_MSG(graphs.end(stream, &graph) == 0 && graph, "%s: the capture failed:\n%s", label,
              cuda_log());
    for (int i = 0; i < n; i++) {
        got = read_back(outs[i], bytes[i], 0x7f);
        CHECK_MSG(((unsigned char *)got)[0] == 0x7f && ((unsigned char *)got)[bytes[i] - 1] ==
                  0x7f, "%s: output %d was written during the capture", label, i);
        free(got);
    }
    if (between)   /* (optional) work between the capture and the replays */
        between(user);
    CHECK(graph && graphs.instantiate(&exec, graph, 0) == 0);
    for (int r = 0; exec && r < 2; r++) {
        CHECK(graphs.launch(exec, stream) == 0);
        for (int i = 0; i < n; i++) {
            got = read_back(outs[i], bytes[i], 0x7f);
            CHECK_MSG(memcmp(got, want[i], bytes[i]) == 0, "%s: replay %d's output %d differs "
                      "from the plain call's", label, r, i);
            free(got);
        }
    }
    if (exec)
        graphs.exec_destroy(exec);
    if (graph)
        graphs.destroy(graph);
    for (int i = 0; i < n; i++)
        free(want[i]);
}

/* A tensor of the seeded values in [-1, 1) (f16, or f32 for lse). */
static void fill_random(aj_tensor *t, uint64_t seed)
{
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++)
        n *= t->shape[i];
    float *f = malloc((size_t)n * 4);
    void *h = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        f[i] = (float)((double)(seed >> 11) / 9007199254740992.0 * 2 - 1);
    }
    CHECK(aj_convert(f, AJ_DTYPE_F32, h, t->dtype, (size_t)n) == AJ_OK);
    CHECK_STATUS(ctx, aj_device_copy_to(dev, t->data, h, (size_t)n * aj_dtype_size(t->dtype)),
                 AJ_OK);
    free(f);
    free(h);
}

static int run_capture(void)
{
    void *stream = NULL;
    CHECK(stream_create(&stream, 1) == 0);
    bind_graphs();
    if (!graphs.begin)
        return check_report();
    aj_kernel *fk = compile("attention forward flash { dtype = f16 head_dim = 64 "
                            "mask = causal(bottom_right) }");
    aj_fwd_args fa = fwd_args(stream);
    fill_random(&fa.q, 1), fill_random(&fa.k, 2), fill_random(&fa.v, 3);
    const size_t ob = (size_t)B * H * S * D * 2, lb = (size_t)B * H * S * 4;
    replay_numbers(stream, "forward", run_forward, (void *[]){fk, &fa},
                   (aj_tensor *[]){&fa.o, &fa.lse}, (size_t[]){ob, lb}, 2, NULL);
    aj_kernel *bk = compile("attention backward flash { dtype = f16 head_dim = 64 "
                            "mask = causal(bottom_right) }");
    aj_bwd_args ba = AJ_BWD_ARGS_INIT;
    ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.o = fa.o, ba.lse = fa.lse;
    const int64_t qs[4] = {B, H, S, D};
    ba.do_ = dev_tensor(AJ_DTYPE_F16, 4, qs);
    fill_random(&ba.do_, 4);
    ba.dq = dev_tensor(AJ_DTYPE_F16, 4, qs);
    ba.dk = dev_tensor(AJ_DTYPE_F16, 4, qs);
    ba.dv = dev_tensor(AJ_DTYPE_F16, 4, qs);
    CHECK_STATUS(ctx, aj_forward(ctx, dev, fk, &fa), AJ_OK);   /* o and lse for the backward */
    ba.stream = stream;
    replay_numbers(stream, "backward", run_backward, (void *[]){bk, &ba},
                   (aj_tensor *[]){&ba.dq, &ba.dk, &ba.dv}, (size_t[]){ob, ob, ob}, 3, NULL);
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    free_tensors((aj_tensor *[]){&fa.q, &fa.k, &fa.v, &fa.o, &fa.lse, &ba.do_, &ba.dq, &ba.dk,
                                 &ba.dv}, 9);
    aj_kernel_destroy(fk);
    aj_kernel_destroy(bk);
    return check_report();
}

/* Host memory handed to a kernel: the launch is queued (as on a GPU), the
 * fault comes at the next synchronising call, as AJ_ERR_KERNEL_FAULT.  It
 * poisons the context, so it comes last. */
static void check_host_memory_faults(void *stream)
{
    aj_kernel *k = compile("attention forward flash { dtype = f16 head_dim = 64 }");
    aj_fwd_args a = fwd_args(stream);
    void *device_q = a.q.data;
    void *host_q = aligned_alloc(64, (size_t)B * H * S * D * 2);
    a.q.data = host_q;
    CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
    CHECK_LOG_HAS("FAULT");
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_ERR_KERNEL_FAULT);
    CHECK_ERROR(ctx, "CUDA_ERROR_ILLEGAL_ADDRESS");
    free(host_q);
    a.q.data = device_q;
    free_tensors((aj_tensor *[]){&a.q, &a.k, &a.v, &a.o, &a.lse}, 5);
    aj_kernel_destroy(k);
}

/* The spec of the i-th kernel of check_eviction: windows of i keys. */
static aj_kernel *compile_window(int i)
{
    char spec[160];
    snprintf(spec, sizeof spec, "attention forward flash { dtype = f16 head_dim = 64 "
             "mask = window(%d, 0) }", i);
    return compile(spec);
}

/* A kernel's module leaves the GPU with the kernel's last reference: the
 * memory cache (bound 2 here) evicts kernels no caller holds, each
 * eviction unloads its module after the context's work (cuCtxSynchronize
 * first), a kernel the caller holds stays loaded and launches, and a
 * kernel that outlives its device is freed without touching it.  The
 * stand-in counts modules and refuses a launch of an unloaded one. */
static void check_eviction(void *stream)
{
    int (*live)(void) = NULL;
    *(void **)&live = stand_in_cuda_symbol("fake_cuda_live_modules");
    CHECK_MSG(live, "the stand-in lacks fake_cuda_live_modules");
    if (!live)
        return;
    aj_fwd_args a = fwd_args(stream);
    CHECK_STATUS(ctx, aj_cache_set_max_kernels(ctx, 2), AJ_OK);
    aj_kernel *held = compile_window(1);
    CHECK_STATUS(ctx, aj_forward(ctx, dev, held, &a), AJ_OK);
    cuda_log_clear();
    enum { N = 6 };
    for (int i = 2; i < 2 + N; i++) {
        aj_kernel *k = compile_window(i);
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
        aj_kernel_destroy(k);   /* the cache keeps it until evicted */
    }
    /* the last two in the cache and the one held: every other is gone */
    CHECK_MSG(live() == 3, "%d modules loaded, expected 3", live());
    CHECK_MSG(stand_in_count(cuda_log(), "ModuleUnload") >= N - 2, "%d modules unloaded:\n%s",
              stand_in_count(cuda_log(), "ModuleUnload"), cuda_log());
    const char *sync = strstr(cuda_log(), "CtxSynchronize");
    const char *unload = strstr(cuda_log(), "ModuleUnload");
    CHECK_MSG(sync && unload && sync < unload,
              "a module was unloaded before the context's work was done:\n%s", cuda_log());
    cuda_log_clear();
    CHECK_STATUS(ctx, aj_forward(ctx, dev, held, &a), AJ_OK);   /* evicted, held: loaded */
    CHECK_LOG_LACKS("ModuleLoad");
    CHECK_LOG_LACKS("FAULT");
    aj_kernel_destroy(held);
    CHECK_MSG(live() == 2, "%d modules loaded after the held kernel was freed", live());

    /* a second device on the same GPU loads its own module of a kernel;
     * closing it unloads that one, and the kernel, freed later, leaves
     * the closed device alone */
    aj_device *other = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &other), AJ_OK);
    aj_kernel *shared = compile_window(2 + N);
    CHECK_STATUS(ctx, aj_forward(ctx, dev, shared, &a), AJ_OK);
    CHECK_STATUS(ctx, aj_forward(ctx, other, shared, &a), AJ_OK);
    const int both = live();
    aj_device_close(other);
    CHECK_MSG(live() == both - 1, "closing a device left %d of %d modules", live(), both);
    aj_kernel_destroy(shared);
    CHECK_STATUS(ctx, aj_cache_set_max_kernels(ctx, 1), AJ_OK);
    aj_kernel *last = compile_window(3 + N);   /* evicts shared: its module on dev goes */
    CHECK_STATUS(ctx, aj_forward(ctx, dev, last, &a), AJ_OK);
    aj_kernel_destroy(last);
    CHECK_MSG(live() == 1, "%d modules loaded with one kernel cached", live());
    CHECK_STATUS(ctx, aj_cache_set_max_kernels(ctx, 256), AJ_OK);
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    free_tensors((aj_tensor *[]){&a.q, &a.k, &a.v, &a.o, &a.lse}, 5);
}

static int run_launch(void)
{
    void *stream = NULL;
    CHECK(stream_create(&stream, 1) == 0);
    check_forward_stream(stream);
    check_backward_workspace(stream);
    check_varlen_async(stream);
    check_capture(stream);
    check_eviction(stream);
    check_host_memory_faults(stream);
    return check_report();
}

/* ---------------------------------------------------------------- sass */

static int count_files(const char *dir, const char *suffix)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c '\\.%s$'", dir, suffix);
    FILE *p = popen(cmd, "r");
    int n = 0;
    if (p) {
        if (fscanf(p, "%d", &n) != 1)
            n = 0;
        pclose(p);
    }
    return n;
}

static int run_sass(void)
{
    char dir[] = "/tmp/aj_sass_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
    cfg.cache_dir = dir;
    static const char *const specs[3] = {
        "attention forward flash { dtype = f16 head_dim = 64 }",
        "attention forward flash { dtype = bf16 head_dim = 64 }",
        "attention forward flash { dtype = f16 head_dim = 128 }",
    };
    for (int run = 0; run < 2; run++) {   /* cold, then as a new process would */
        CHECK(aj_ctx_create(&cfg, &ctx) == AJ_OK);
        CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev), AJ_OK);
        if (!dev)
            return check_report();
        bind_fake();
        cuda_log_clear();
        /* the first by a launch, the others by aj_compile_many's workers */
        aj_kernel *k = compile(specs[0]);
        aj_fwd_args a = fwd_args(NULL);
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
        aj_op *ops[2] = {NULL, NULL};
        aj_compile_job jobs[2];
        memset(jobs, 0, sizeof jobs);
        for (int i = 0; i < 2; i++) {
            CHECK_STATUS(ctx, aj_op_parse(ctx, specs[i + 1], strlen(specs[i + 1]), "spec",
                                          &ops[i]), AJ_OK);
            jobs[i].op = ops[i];
        }
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.device = dev;
        opt.target = aj_device_target(dev);
        CHECK_STATUS(ctx, aj_compile_many(ctx, jobs, 2, &opt, 2), AJ_OK);
        const int linked = stand_in_count(cuda_log(), "LinkComplete");
        const int loaded = stand_in_count(cuda_log(), "ModuleLoadData cubin");
        CHECK_MSG(loaded == 3, "run %d: %d cubins loaded, want 3:\n%s", run, loaded,
                  cuda_log());
        CHECK_MSG(linked == (run == 0 ? 3 : 0), "run %d: %d PTX linked, want %d:\n%s", run,
                  linked, run == 0 ? 3 : 0, cuda_log());
        CHECK_LOG_LACKS("ModuleLoadDataEx");
        CHECK_MSG(count_files(dir, "cubin") == 3, "%d cubins in %s, want 3",
                  count_files(dir, "cubin"), dir);
        CHECK_STATUS(ctx, aj_device_synchronize(dev, NULL), AJ_OK);
        for (int i = 0; i < 2; i++) {
            aj_kernel_destroy(jobs[i].kernel);
            aj_op_destroy(ops[i]);
        }
        free_tensors((aj_tensor *[]){&a.q, &a.k, &a.v, &a.o, &a.lse}, 5);
        aj_kernel_destroy(k);
        aj_device_close(dev);
        aj_ctx_destroy(ctx);
    }
    CHECK(temp_dir_remove(dir));
    return check_report();
}

/* ---------------------------------------------------------------- ring */

/* The log between the first launch and the last. */
static void check_between_launches(const char *what)
{
    const char *log = cuda_log();
    const char *first = strstr(log, "LaunchKernel");
    const char *last = first;
    for (const char *p = first; p; p = strstr(p + 1, "LaunchKernel"))
        last = p;
    CHECK_MSG(first, "%s: no launch:\n%s", what, log);
    if (!first)
        return;
    char *span = strndup(first, (size_t)(last - first));
    const char *bad[] = {"MemAlloc", "MemFree", "CtxSynchronize", "stream=0 ", "FAULT",
                         "REJECTED", "RACE"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK_MSG(!strstr(span, bad[i]), "%s: \"%s\" between the launches:\n%s", what,
                  bad[i], span);
    free(span);
}

/* A resident ring call's log (NCCL): no pinned memory, and between the
 * host and the device only the opening agreement's bytes, through the
 * engine's collective slot -- none of the attention data. */
static void check_resident(const char *what, int size)
{
    char line[64];
    CHECK_LOG_LACKS("MemAllocHost");
    CHECK_LOG_LACKS("RACE");   /* the stand-in's stream-order model */
    CHECK_LOG_HAS("DtoD");   /* K/V packed, or the all-to-all's blocks, on the device */
    snprintf(line, sizeof line, "MemcpyHtoDAsync bytes=%zu ", sizeof(aj_cp_call));
    CHECK_MSG(stand_in_count(cuda_log(), "MemcpyHtoD") == 1 &&
                  stand_in_count(cuda_log(), line) == 1,
              "%s: host to device, other than the agreement's %zu bytes:\n%s", what,
              sizeof(aj_cp_call), cuda_log());
    snprintf(line, sizeof line, "MemcpyDtoHAsync bytes=%zu ", sizeof(aj_cp_call) * (size_t)size);
    CHECK_MSG(stand_in_count(cuda_log(), "MemcpyDtoH") == 1 &&
                  stand_in_count(cuda_log(), line) == 1,
              "%s: device to host, other than the agreement's:\n%s", what, cuda_log());
}

/* Whether the stand-in libnccl ($AJ_NCCL_LIBRARY) logged `what`. */
static bool nccl_logged(const char *what)
{
    const char *lib = getenv("AJ_NCCL_LIBRARY");
    void *h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
    const char *(*nccl_log)(void) = NULL;
    if (h)
        *(void **)&nccl_log = dlsym(h, "fake_nccl_log");
    return nccl_log && strstr(nccl_log(), what);
}

static bool nccl_aborted(void)
{
    return nccl_logged("CommAbort");
}

/* Asynchronous calls (a stream of the test's in the args) over the NCCL
 * engine, after synchronous calls of the same shapes: the caller's last
 * write of an input is queued on its stream just before (the stand-in's
 * stream-order model sees a race unless the call's work waits for the
 * stream), and the call returns with no synchronisation, no event polled,
 * nothing copied between host and device (the opening agreement reused)
 * and no race; aj_comm_synchronize then finds every call done. */
static void check_async(aj_comm *comm, const aj_op *fop, const aj_op *bop,
                        aj_ring_fwd_args f, aj_ring_bwd_args b)
{
    int (*queries)(void) = NULL;
    int (*memset32)(void *dst, unsigned value, size_t n, void *stream) = NULL;
    *(void **)&queries = stand_in_cuda_symbol("fake_cuda_event_queries");
    *(void **)&memset32 = stand_in_cuda_symbol("cuMemsetD32Async");
    void *stream = NULL;
    CHECK(queries && memset32 && stream_create(&stream, 1) == 0);
    if (!queries || !memset32 || !stream)
        return;
    const char *names[] = {"ring forward", "ring backward", "ulysses forward",
                           "ulysses backward"};
    for (int call = 0; call < 4; call++) {
        f.method = b.method = call < 2 ? AJ_METHOD_RING : AJ_METHOD_ULYSSES;
        f.stream = b.stream = stream;
        /* (K: the calls' device copies read it, which the model sees) */
        CHECK(memset32(f.k.data, 0, (size_t)(B * H * S * D) / 2, stream) == 0);
        cuda_log_clear();
        const int polled = queries();
        CHECK_STATUS(ctx, call % 2 ? aj_ring_backward(ctx, dev, comm, bop, &b, NULL)
                                   : aj_ring_forward(ctx, dev, comm, fop, &f, NULL), AJ_OK);
        CHECK_MSG(queries() == polled, "%s: the asynchronous call polled %d events",
                  names[call], queries() - polled);
        const char *bad[] = {"Synchronize", "MemcpyHtoD", "MemcpyDtoH", "MemAllocHost",
                             "RACE", "FAULT"};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
            CHECK_MSG(!strstr(cuda_log(), bad[i]), "%s: \"%s\" in the asynchronous call:\n%s",
                      names[call], bad[i], cuda_log());
        CHECK_LOG_HAS("StreamWaitEvent");
    }
    int32_t pending = -1;
    CHECK_STATUS(ctx, aj_comm_synchronize(comm), AJ_OK);
    CHECK_STATUS(ctx, aj_comm_query(comm, &pending), AJ_OK);
    CHECK_MSG(pending == 0, "%d asynchronous calls pending after aj_comm_synchronize", pending);
    /* a synchronous call polls its end (the counter counts) */
    f.stream = NULL;
    f.method = AJ_METHOD_RING;
    const int polled = queries();
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fop, &f, NULL), AJ_OK);
    CHECK_MSG(queries() > polled, "the synchronous call polled no event");
    aj_device_stream_destroy(dev, stream);
}

/* The ring tests' comm (NCCL or MPI, with a timeout), a causal f16 d 64
 * forward and backward op, and this rank's shards as forward arguments
 * (zigzag): NULL when something failed (reported). */
static aj_comm *open_ring(int nccl, double timeout_s, aj_op **fop, aj_op **bop,
                          aj_ring_fwd_args *f)
{
    aj_comm_config cc = AJ_COMM_CONFIG_INIT;
    cc.timeout_s = timeout_s;
    if (nccl)
        cc.kind = AJ_COMM_NCCL;
    aj_comm *comm = NULL;
    CHECK_STATUS(ctx, aj_comm_create(ctx, dev, &cc, &comm), AJ_OK);
    const char *fspec = "attention forward flash { dtype = f16 head_dim = 64 "
                        "mask = causal(top_left) }";
    const char *bspec = "attention backward flash { dtype = f16 head_dim = 64 "
                        "mask = causal(top_left) }";
    CHECK_STATUS(ctx, aj_op_parse(ctx, fspec, strlen(fspec), "f", fop), AJ_OK);
    CHECK_STATUS(ctx, aj_op_parse(ctx, bspec, strlen(bspec), "b", bop), AJ_OK);
    const aj_fwd_args shards = fwd_args(NULL);   /* this rank's */
    *f = (aj_ring_fwd_args)AJ_RING_FWD_ARGS_INIT;
    f->q = shards.q, f->k = shards.k, f->v = shards.v, f->o = shards.o, f->lse = shards.lse;
    f->layout = AJ_SHARD_ZIGZAG;
    if (comm && *fop && *bop)
        return comm;
    aj_comm_destroy(comm);
    return NULL;
}

/* The backward after ring forward f: its fields, with new dO, dQ, dK, dV. */
static aj_ring_bwd_args ring_bwd_of(const aj_ring_fwd_args *f)
{
    const int64_t qs[4] = {B, H, S, D};
    return ring_bwd_args_after(f, dev_tensor(AJ_DTYPE_F16, 4, qs),
                               dev_tensor(AJ_DTYPE_F16, 4, qs), dev_tensor(AJ_DTYPE_F16, 4, qs),
                               dev_tensor(AJ_DTYPE_F16, 4, qs));
}

/* An asynchronous call whose work never ends (FAKE_CUDA_STUCK=1) or whose
 * NCCL communicator reports an error (FAKE_NCCL_MODE=async_error), one
 * rank: the call returns AJ_OK at once, and the watchdog finds the
 * failure -- within the timeout, the communicator aborted -- which
 * aj_comm_synchronize, aj_comm_query and the next call then answer. */
static int run_async_failure(void)
{
    const int stuck = getenv("FAKE_CUDA_STUCK") != NULL;
    aj_op *fop = NULL, *bop = NULL;
    aj_ring_fwd_args f;
    aj_comm *comm = open_ring(1, 2, &fop, &bop, &f);
    void *stream = NULL;
    CHECK(stream_create(&stream, 1) == 0);
    if (!comm || !stream)
        return check_report();
    f.stream = stream;
    const double t0 = MPI_Wtime();
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fop, &f, NULL), AJ_OK);
    CHECK_MSG(MPI_Wtime() - t0 < 1.5, "the asynchronous call took %.1f s to return",
              MPI_Wtime() - t0);
    int32_t pending = -1;
    aj_status st = aj_comm_query(comm, &pending);
    CHECK_MSG((st == AJ_OK && pending == 1) || st == AJ_ERR_COMM,
              "aj_comm_query: status %d, %d pending; want the call pending or failed", st,
              pending);
    CHECK_STATUS(ctx, aj_comm_synchronize(comm), AJ_ERR_COMM);
    CHECK_ERROR(ctx, stuck ? "did not finish within the comm timeout of 2 s"
                           : "NCCL: rank 0: remote process exited");
    CHECK_MSG(MPI_Wtime() - t0 < 30, "the failure took %.1f s to show", MPI_Wtime() - t0);
    CHECK_MSG(nccl_aborted(), "the watchdog did not abort the NCCL communicator");
    CHECK_STATUS(ctx, aj_comm_query(comm, &pending), AJ_ERR_COMM);
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fop, &f, NULL), AJ_ERR_COMM);
    CHECK_ERROR(ctx, "aj_ring_forward: rank 0: an earlier call failed: aj_ring_forward "
                "(asynchronous");
    aj_comm_destroy(comm);
    free_tensors((aj_tensor *[]){&f.q, &f.k, &f.v, &f.o, &f.lse}, 5);
    aj_op_destroy(fop);
    aj_op_destroy(bop);
    return check_report();
}

/* A ring call for replay_numbers: forward (b NULL) or backward, on
 * inputs seeded by `seed` and the rank. */
typedef struct ring_call {
    aj_comm *comm;
    const aj_op *op;
    const aj_ring_fwd_args *f;
    const aj_ring_bwd_args *b;
    int rank;
} ring_call;

static aj_status run_ring_call(void *user)
{
    const ring_call *c = user;
    return c->b ? aj_ring_backward(ctx, dev, c->comm, c->op, c->b, NULL)
                : aj_ring_forward(ctx, dev, c->comm, c->op, c->f, NULL);
}

static void seed_inputs(const ring_call *c, uint64_t seed)
{
    const aj_ring_fwd_args *f = c->f;
    aj_tensor q = f ? f->q : c->b->q, k = f ? f->k : c->b->k, v = f ? f->v : c->b->v;
    seed += 100 * (uint64_t)c->rank;
    fill_random(&q, seed + 1), fill_random(&k, seed + 2), fill_random(&v, seed + 3);
    if (c->b)
        fill_random((aj_tensor *)&c->b->do_, seed + 4);
}

/* Between the capture and the replays: a plain call on other inputs (its
 * transfers leave other blocks in the comm's buffers, so a replay that
 * did not move them again would compute with those), then the captured
 * inputs back. */
static void other_call_between(void *user)
{
    const ring_call *c = user;
    seed_inputs(c, 50);
    CHECK_STATUS(ctx, run_ring_call(user), AJ_OK);
    CHECK_STATUS(ctx, aj_device_synchronize(dev, c->f ? c->f->stream : c->b->stream), AJ_OK);
    seed_inputs(c, 0);
}

/* Asynchronous ring and Ulysses calls captured into a CUDA graph on the
 * caller's stream (AJ_CUDA_EMULATE=1, the stand-in libnccl recording its
 * transfers as host functions): after a first call of their shape, the
 * capture refuses nothing and computes nothing, and each of two replays
 * -- the ranks replaying their graphs together -- writes the plain call's
 * bits; ring, Ulysses and hybrid (U = 1 and 2). */
static int run_ring_capture(void)
{
    aj_op *fop = NULL, *bop = NULL;
    aj_ring_fwd_args f;
    aj_comm *comm = open_ring(1, 60, &fop, &bop, &f);
    void *stream = NULL;
    CHECK(stream_create(&stream, 1) == 0);
    bind_graphs();
    if (!comm || !stream || !graphs.begin)
        return check_report();
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    f.stream = stream;
    aj_ring_bwd_args b = ring_bwd_of(&f);
    const size_t ob = (size_t)B * H * S * D * 2, lb = (size_t)B * H * S * 4;
    const char *names[4][2] = {{"ring forward", "ring backward"},
                               {"ulysses forward", "ulysses backward"},
                               {"hybrid U = 1 forward", "hybrid U = 1 backward"},
                               {"hybrid U = 2 forward", "hybrid U = 2 backward"}};
    for (int m = 0; m < 4; m++) {   /* ring, Ulysses, hybrid: U = 1 (the ring across), 2 */
        f.method = b.method = m == 0 ? AJ_METHOD_RING : m == 1 ? AJ_METHOD_ULYSSES
                                                               : AJ_METHOD_HYBRID;
        f.ulysses_size = b.ulysses_size = m >= 2 ? m - 1 : 0;
        const ring_call fc = {comm, fop, &f, NULL, rank}, bc = {comm, bop, NULL, &b, rank};
        seed_inputs(&bc, 0);
        replay_numbers(stream, names[m][0], run_ring_call,
                       (void *)&fc, (aj_tensor *[]){&f.o, &f.lse}, (size_t[]){ob, lb}, 2,
                       other_call_between);
        /* the backward reads the forward's o and lse: the plain call's */
        CHECK_STATUS(ctx, run_ring_call((void *)&fc), AJ_OK);
        CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
        replay_numbers(stream, names[m][1], run_ring_call,
                       (void *)&bc, (aj_tensor *[]){&b.dq, &b.dk, &b.dv},
                       (size_t[]){ob, ob, ob}, 3, other_call_between);
        CHECK_LOG_LACKS("CAPTURE REFUSED");
    }
    CHECK_MSG(nccl_logged("captured"), "no NCCL work was recorded in a graph");
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    CHECK_STATUS(ctx, aj_comm_synchronize(comm), AJ_OK);
    aj_comm_destroy(comm);
    free_tensors((aj_tensor *[]){&f.q, &f.k, &f.v, &f.o, &f.lse, &b.do_, &b.dq, &b.dk, &b.dv},
                 9);
    aj_device_stream_destroy(dev, stream);
    aj_op_destroy(fop);
    aj_op_destroy(bop);
    return check_report();
}

/* Hybrid (U = 1: a ring across two groups of one; U = 2: one Ulysses
 * group) and packed documents (two of 64 positions, zigzag: 64 on each
 * rank) on the resident path: no attention data between host and device,
 * nothing pinned, no race. */
static void check_resident_more(aj_comm *comm, const aj_op *fop, const aj_op *bop,
                                aj_ring_fwd_args f, aj_ring_bwd_args b)
{
    const size_t agreement = sizeof(aj_cp_call) * 2;
    for (int u = 1; u <= 2; u++) {
        f.method = b.method = AJ_METHOD_HYBRID;
        f.ulysses_size = b.ulysses_size = u;
        cuda_log_clear();
        CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fop, &f, NULL), AJ_OK);
        CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, bop, &b, NULL), AJ_OK);
        stand_in_check_small_copies(u == 1 ? "hybrid U = 1" : "hybrid U = 2", agreement);
    }
    const char *fv = "attention forward flash { dtype = f16 head_dim = 64 "
                     "mask = causal(top_left) layout = varlen }";
    const char *bv = "attention backward flash { dtype = f16 head_dim = 64 "
                     "mask = causal(top_left) layout = varlen }";
    aj_op *fvop = NULL, *bvop = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, fv, strlen(fv), "fv", &fvop), AJ_OK);
    CHECK_STATUS(ctx, aj_op_parse(ctx, bv, strlen(bv), "bv", &bvop), AJ_OK);
    const int32_t cu[3] = {0, S, 2 * S};   /* the whole batch; this rank holds S positions */
    aj_tensor cus = dev_i32(cu, 3);
    aj_tensor *packed[] = {&f.q, &f.k, &f.v, &f.o, &b.do_, &b.dq, &b.dk, &b.dv};
    for (int i = 0; i < 8; i++)   /* [S, H, D] over the same buffers */
        *packed[i] = (aj_tensor){packed[i]->data, AJ_DTYPE_F16, 3, {S, H, D}, {H * D, D, 1}};
    f.lse = (aj_tensor){f.lse.data, AJ_DTYPE_F32, 2, {H, S}, {S, 1}};
    b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o, b.lse = f.lse;
    f.method = b.method = AJ_METHOD_RING;
    f.ulysses_size = b.ulysses_size = 0;
    f.cu_seqlens_q = f.cu_seqlens_k = b.cu_seqlens_q = b.cu_seqlens_k = cus.data;
    f.batch = b.batch = 2;
    cuda_log_clear();
    CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fvop, &f, NULL), AJ_OK);
    CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, bvop, &b, NULL), AJ_OK);
    stand_in_check_small_copies("packed documents", agreement);
    free_tensors((aj_tensor *[]){&cus}, 1);
    aj_op_destroy(fvop);
    aj_op_destroy(bvop);
}

/* The sinks' gradient and a side tensor's (alibi's slopes, alibi(grad))
 * on the resident path, by ring, Ulysses and hybrid: each rank's part
 * made and the parts summed over the ranks on the device -- between host
 * and device only the agreement and the few values the ring classes its
 * blocks by, nothing pinned, no race (test_ring and test_cp check the
 * numbers). */
static void check_resident_side_grads(aj_comm *comm, aj_ring_fwd_args f, aj_ring_bwd_args b)
{
    const char *text[2] = {
        "attention forward flash { dtype = f16 head_dim = 64 mask = causal(top_left) "
        "tensors = (snk: f32[1]) sinks = snk score_mod = alibi }",
        "attention backward flash { dtype = f16 head_dim = 64 mask = causal(top_left) "
        "tensors = (snk: f32[1]) sinks = snk score_mod = alibi(grad) }"};
    aj_op *op[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++)
        CHECK_STATUS(ctx, aj_op_parse(ctx, text[i], strlen(text[i]), "side", &op[i]), AJ_OK);
    const int64_t h = H;
    aj_tensor snk = dev_tensor(AJ_DTYPE_F32, 1, &h), slopes = dev_tensor(AJ_DTYPE_F32, 1, &h);
    aj_tensor dsinks = dev_tensor(AJ_DTYPE_F32, 1, &h), dslopes = dev_tensor(AJ_DTYPE_F32, 1, &h);
    const float logits[H] = {0.5f, -1.0f}, m[H] = {0.25f, 0.5f};
    CHECK_STATUS(ctx, aj_device_copy_to(dev, snk.data, logits, sizeof logits), AJ_OK);
    CHECK_STATUS(ctx, aj_device_copy_to(dev, slopes.data, m, sizeof m), AJ_OK);
    aj_side_tensor side = {"snk", snk.data, AJ_SIDE_F32, 1, {H}, {1}};
    aj_side_tensor dside = {"alibi_slopes", dslopes.data, AJ_SIDE_F32, 1, {H}, {1}};
    f.side = b.side = &side;
    f.num_side = b.num_side = 1;
    f.alibi_slopes = b.alibi_slopes = slopes;
    b.dsinks = dsinks;
    b.dside = &dside;
    b.num_dside = 1;
    const aj_cp_method methods[3] = {AJ_METHOD_RING, AJ_METHOD_ULYSSES, AJ_METHOD_HYBRID};
    const char *names[3] = {"ring: dsinks, dalibi_slopes", "ulysses: dsinks, dalibi_slopes",
                            "hybrid U = 1: dsinks, dalibi_slopes"};
    for (int m_ = 0; m_ < 3 && op[0] && op[1]; m_++) {
        f.method = b.method = methods[m_];
        f.ulysses_size = b.ulysses_size = methods[m_] == AJ_METHOD_HYBRID;
        CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, op[0], &f, NULL), AJ_OK);
        cuda_log_clear();
        CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, op[1], &b, NULL), AJ_OK);
        stand_in_check_small_copies(names[m_], sizeof(aj_cp_call) * 2);
        CHECK_MSG(stand_in_count(cuda_log(), "LaunchKernel") > 0, "%s: no launch", names[m_]);
    }
    free_tensors((aj_tensor *[]){&snk, &slopes, &dsinks, &dslopes}, 4);
    aj_op_destroy(op[0]);
    aj_op_destroy(op[1]);
}

static int run_ring(int stuck, int nccl)
{
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    aj_op *fop = NULL, *bop = NULL;
    aj_ring_fwd_args f;
    aj_comm *comm = open_ring(nccl, stuck ? 2 : 60, &fop, &bop, &f);
    if (!comm)
        return check_report();
    const double t0 = MPI_Wtime();
    cuda_log_clear();
    aj_status st = aj_ring_forward(ctx, dev, comm, fop, &f, NULL);
    if (stuck) {
        CHECK_STATUS(ctx, st, AJ_ERR_COMM);
        CHECK_ERROR(ctx, "timeout");
        double waited = MPI_Wtime() - t0;
        CHECK_MSG(waited < 30, "the stuck ring took %.1f s to fail", waited);
        if (nccl)   /* its transfers joined to its stream: only an abort ends them */
            CHECK_MSG(nccl_aborted(), "the stuck resident ring did not abort its NCCL "
                      "communicator");
    } else {
        CHECK_STATUS(ctx, st, AJ_OK);
        CHECK_LOG_LACKS("CtxSynchronize");
        CHECK_LOG_LACKS(" staged");   /* host buffers pinned: copies stay async */
        if (nccl)
            check_resident("aj_ring_forward", size);
        else
            CHECK_LOG_HAS("MemAllocHost");
        check_between_launches("aj_ring_forward");
        aj_ring_bwd_args b = ring_bwd_of(&f);
        for (int call = 0; call < 2; call++) {
            cuda_log_clear();
            CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, bop, &b, NULL), AJ_OK);
            CHECK_LOG_LACKS("CtxSynchronize");
            CHECK_LOG_LACKS(" staged");
            if (call == 1)   /* the first call's pinned buffers, reused */
                CHECK_LOG_LACKS("MemAllocHost");
            if (call == 1 && nccl) {   /* and the resident ring's device blocks */
                CHECK_LOG_LACKS("MemAlloc bytes");
                CHECK_LOG_LACKS("MemFree");
            }
            if (nccl)
                check_resident("aj_ring_backward", size);
            check_between_launches("aj_ring_backward");
        }
        /* method = ulysses (H = 2 heads over 2 ranks): its one launch on
         * the call's stream, device memory only, no synchronisation */
        f.method = b.method = AJ_METHOD_ULYSSES;
        for (int call = 0; call < 2; call++) {   /* (resident: each call's log) */
            cuda_log_clear();
            if (call == 0)
                CHECK_STATUS(ctx, aj_ring_forward(ctx, dev, comm, fop, &f, NULL), AJ_OK);
            else
                CHECK_STATUS(ctx, aj_ring_backward(ctx, dev, comm, bop, &b, NULL), AJ_OK);
            CHECK_MSG(strstr(cuda_log(), "LaunchKernel"), "ulysses: no launch:\n%s",
                      cuda_log());
            const char *bad[] = {"Synchronize", "stream=0 ", "FAULT", "REJECTED", "RACE"};
            for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
                CHECK_LOG_LACKS(bad[i]);
            if (nccl)
                check_resident(call ? "ulysses backward" : "ulysses forward", size);
        }
        if (nccl) {
            check_async(comm, fop, bop, f, b);
            check_resident_more(comm, fop, bop, f, b);
            check_resident_side_grads(comm, f, b);
        }
        free_tensors((aj_tensor *[]){&b.do_, &b.dq, &b.dk, &b.dv}, 4);
    }
    free_tensors((aj_tensor *[]){&f.q, &f.k, &f.v, &f.o, &f.lse}, 5);
    aj_comm_destroy(comm);
    aj_op_destroy(fop);
    aj_op_destroy(bop);
    return check_report();
}

int main(int argc, char **argv)
{
    const char *what = argc > 1 ? argv[1] : "";
    const int nccl = strcmp(what, "ring-nccl") == 0 || strcmp(what, "stuck-nccl") == 0;
    const int stuck = strcmp(what, "stuck") == 0 || strcmp(what, "stuck-nccl") == 0;
    const int ring = !stuck && (nccl || strcmp(what, "ring") == 0);
    const int capture = strcmp(what, "capture") == 0;
    const int async_failure = strcmp(what, "async-failure") == 0;
    const int ring_capture = strcmp(what, "ring-capture") == 0;
    if (strcmp(what, "sass") == 0)
        return run_sass();
    const int mpi = ring || stuck || async_failure || ring_capture;
    if (!mpi && !capture && strcmp(what, "launch") != 0) {
        fprintf(stderr, "usage: test_gpu_path launch|capture|sass|ring|ring-nccl|stuck|"
                "stuck-nccl|async-failure|ring-capture\n");
        return 2;
    }
    if (mpi)
        MPI_Init(&argc, &argv);
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev), AJ_OK);
    if (!dev)
        return check_report();
    bind_fake();
    int rc = ring || stuck      ? run_ring(stuck, nccl)
             : async_failure    ? run_async_failure()
             : ring_capture     ? run_ring_capture()
             : capture          ? run_capture()
                                : run_launch();
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    if (mpi)
        MPI_Finalize();
    return rc;
}
