/*
 * gpu_check.c -- the checks only a GPU can run, in one go (tests/gpu/run.sh
 * calls it; docs/gpu.md says how).
 *
 *   gpu_check [--family F] [--out DIR] [--quick] [--dump DIR] [--specs DIR]
 *
 *   1. correctness (families efficient_fwd, flash_fwd, wgmma_fwd -- the
 *      flash forward on wgmma, on 9.0 GPUs -- and fp8: FP8 inputs on the
 *      efficient kernel and the FP8 tensor-core one, with one timed
 *      shape beside bf16): every template x
 *      dtype x head dim x mask at moderate sizes on the GPU against the
 *      float64 reference (on this machine's CPUs), with the tolerances of
 *      the sim tests;
 *   2. speed (bench): the forward kernels (the wgmma one beside them on a
 *      9.0 GPU), bf16, at B*S = 16k tokens,
 *      hidden 2048 (H = 2048 / d), S in 1k..16k, d 64 and 128, causal and
 *      not; TFLOP/s counted as FlashAttention counts them (4 B S^2 D H,
 *      halved for causal), the median of launches timed with CUDA events
 *      after warm-up; and each kernel's registers and local (spill) bytes
 *      per thread as the driver reports them (cuFuncGetAttribute);
 *   3. start-up (startup): compiling the example specs for this GPU with an
 *      empty kernel cache (cold, in parallel) and again from the cache.
 *
 * --family runs one of them (or `dump`, or `all`, the default), so that
 * tests/gpu/run.sh can give each its own process: a kernel fault leaves
 * the CUDA context unusable, and must not take the other checks with it.
 * Prints markdown tables; with --out, also writes gpu_check[_F].json and
 * gpu_check[_F].md there.  --dump writes a few cases' tensors as .npy for
 * tests/gpu/torch_compare.py.  Exit status: 0 if every check passed, 1 if
 * one failed, 77 (ctest's "skipped") where there is no usable GPU.
 */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "runtime/cuda/cuda_api.h"
#include "runtime/runtime.h"
#include "paged_cases.h"
#include "sim_harness.h"
#include "temp_dir.h"
#include "timing.h"   /* wall clock: compile times (kernels are timed with CUDA events) */
#include "tools/npy.h"

static FILE *json, *md;

/* Prints to stdout and the markdown file. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (md) {
        va_start(ap, fmt);
        vfprintf(md, fmt, ap);
        va_end(ap);
    }
}

/* ---------------------------------------------------------------- 1 */

static const aj_dtype dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};
static const char *const masks[] = {"none", "causal(top_left)", "causal(bottom_right)",
                                    "window(64, 0, bottom_right)"};

static void correctness_header(aj_device *dev, const char *family, const char *key)
{
    say("\n## Correctness of %s on %s against the float64 reference\n\n", family,
        aj_device_name(dev));
    say("| case | status | O error / tol | LSE error / tol | empty rows |\n"
        "|---|---|---:|---:|---:|\n");
    if (json)
        fprintf(json, ",\n  \"%s\": [\n", key);
}

/* One row of the table and of the JSON; 1 if the case failed. */
static int report_case(aj_ctx *ctx, const char *label, const fwd_result *r, int first)
{
    int ok = r->status == AJ_OK && r->max_err_o <= 1 && r->max_err_lse <= 1 &&
             r->exact_empty_rows;
    say("| %s | %s | %.3f | %.3f | %lld |\n", label,
        r->status == AJ_OK ? (ok ? "ok" : "WRONG") : aj_status_str(r->status), r->max_err_o,
        r->max_err_lse, (long long)r->rows_without_keys);
    if (r->status != AJ_OK)
        fprintf(stderr, "gpu_check: %s: %s\n", label, aj_last_error(ctx));
    if (json)
        fprintf(json, "%s    {\"case\": \"%s\", \"ok\": %s, \"err_o\": %.6g, \"err_lse\": %.6g}",
                first ? "" : ",\n", label, ok ? "true" : "false", r->max_err_o, r->max_err_lse);
    return !ok;
}

static int correctness_footer(int cases, int failed)
{
    if (json)
        fprintf(json, "\n  ]");
    say("\n%d cases, %d failed\n", cases, failed);
    return failed;
}

/* the efficient forward: f16 / bf16 / f32 x head dims x masks */
static int check_efficient_fwd(aj_ctx *ctx, aj_device *dev, int quick)
{
    static const int dims[] = {32, 64, 96, 128, 256, 384, 512};
    const int n_dims = (int)(sizeof dims / sizeof dims[0]);
    int failed = 0, cases = 0;
    correctness_header(dev, "the efficient forward", "correctness_efficient_fwd");
    for (int t = 0; t < 3; t++)
        for (int d = 0; d < n_dims; d++)
            for (int m = 0; m < 4; m++) {
                if (quick && (d % 2 || m % 2))
                    continue;
                char label[128];
                snprintf(label, sizeof label, "efficient fwd %s d%d %s",
                         aj_dtype_name(dtypes[t]), dims[d], masks[m]);
                fwd_case c = {label, dtypes[t], dims[d], 0, masks[m], NULL, NULL,
                              2, 8, 2, 257, 300, 0, 0, 0, 0, 1.0, 0,
                              (uint64_t)(100 * t + 10 * d + m + 1), AJ_DTYPE_F16, 0, 0};
                fwd_result r = fwd_run_case(ctx, dev, &c);
                failed += report_case(ctx, label, &r, cases++ == 0);
            }
    return correctness_footer(cases, failed);
}

/* the flash forward: f16 / bf16 x its head dims x the masks, then
 * accumulate over 3 key blocks and a varlen batch; with `wgmma` the same
 * cases on the wgmma template (schedule warpgroups 1 and 2 in turn: TMA
 * loads over padded tensors, cp.async for varlen; the bf16 cases warp
 * specialised, schedule producer = 1), on a GPU of compute
 * capability 9.0 only; past Dv 256 on the warpgroup pair that splits Dv
 * (mma.sync: warp pairs), not warp specialised */
static int check_flash_fwd(aj_ctx *ctx, aj_device *dev, int quick, int wgmma)
{
    static const int flash_dims[][2] = {{32, 32},   {64, 64},   {96, 96},   {128, 128},
                                        {192, 192}, {256, 256}, {192, 128}, {384, 384},
                                        {512, 512}, {264, 512}};
    const int n_dims = (int)(sizeof flash_dims / sizeof flash_dims[0]);
    static const int32_t lq[] = {1, 300, 0, 129}, lk[] = {257, 64, 5, 0};
    int failed = 0, cases = 0;
    if (wgmma && !aj_device_runs(dev, AJ_TARGET_SM_90A)) {
        say("\nSKIP the wgmma flash forward: %s is not compute capability 9.0 (sm_90a)\n",
            aj_device_name(dev));
        return 0;
    }
    correctness_header(dev, wgmma ? "the wgmma flash forward" : "the flash forward",
                       wgmma ? "correctness_wgmma_fwd" : "correctness_flash_fwd");
    for (int t = 0; t < 2; t++)
        for (int d = 0; d < n_dims; d++)
            for (int m = 0; m < 6; m++) {
                if (quick && (d % 2 || m % 2))
                    continue;
                int split = flash_dims[d][1] > 256;
                fwd_run_options how = {.variant = AJ_VARIANT_FLASH,
                                       .warpgroups = !wgmma ? 0 : split ? 2 : 1 + (d + m) % 2,
                                       .producer = wgmma && t == 1 && !split};
                if (m == 4)
                    how.accumulate_parts = 3;
                if (m == 5) {
                    how.seqlens_q = lq;
                    how.seqlens_k = lk;
                }
                char label[128];
                snprintf(label, sizeof label, "%s fwd %s d%d/%d %s%s",
                         !wgmma ? "flash" : how.producer ? "wgmma ws" : "wgmma",
                         aj_dtype_name(dtypes[t]), flash_dims[d][0], flash_dims[d][1],
                         masks[m % 4], m == 4 ? " accumulate" : m == 5 ? " varlen" : "");
                fwd_case c = {label, dtypes[t], flash_dims[d][0], flash_dims[d][1], masks[m % 4],
                              NULL, NULL, m == 5 ? 4 : 2, 8, 2, 257, 300, 0, 0, 0, 0, 1.0, 0,
                              (uint64_t)(1000 + 100 * t + 10 * d + m), AJ_DTYPE_F16, 0, 0};
                fwd_result r = fwd_run_case_ext(ctx, dev, &c, NULL, &how);
                failed += report_case(ctx, label, &r, cases++ == 0);
            }
    return correctness_footer(cases, failed);
}

/* ---------------------------------------------------------------- 2 */

/* The kernel of spec `text` for dev, the device going with the compile
 * (the target it picks: sm_90a for the wgmma kernels on a 9.0 GPU; its
 * tuned schedules); NULL after a failure, reported. */
static aj_kernel *compile_spec(aj_ctx *ctx, aj_device *dev, const char *text)
{
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    opt.device = dev;
    if (aj_op_parse(ctx, text, strlen(text), "gpu_check", &op) != AJ_OK ||
        aj_compile(ctx, op, &opt, &k) != AJ_OK)
        fprintf(stderr, "gpu_check: %s\n%s\n", aj_last_error(ctx), text);
    aj_op_destroy(op);
    return k;
}

/* The forward of `variant` ("efficient", "flash", "wgmma": the flash
 * forward on wgmma, 2 warpgroups, which a 9.0 device compiles for sm_90a,
 * or "ws": the same warp specialised, schedule producer = 1) */
static aj_kernel *compile_for(aj_ctx *ctx, aj_device *dev, const char *variant, aj_dtype dtype,
                              int d, int causal)
{
    char text[256];
    int ws = strcmp(variant, "ws") == 0, wgmma = ws || strcmp(variant, "wgmma") == 0;
    snprintf(text, sizeof text, "attention forward %s { dtype = %s head_dim = %d "
             "mask = %s%s }", wgmma ? "flash" : variant, aj_dtype_name(dtype), d,
             causal ? "causal(bottom_right)" : "none",
             ws      ? " schedule = (warpgroups = 2, producer = 1)"
             : wgmma ? " schedule = (warpgroups = 2)"
                     : "");
    return compile_spec(ctx, dev, text);
}

static aj_tensor dev_tensor(void *p, aj_dtype dt, int64_t b, int64_t h, int64_t s, int64_t d)
{
    aj_tensor t = {p, dt, 4, {b, h, s, d}, {h * s * d, s * d, d, 1}};
    return t;
}

/*
 * CUDA events and the driver's view of a kernel, through attnjit's own
 * table of driver entry points (runtime/cuda/cuda_api.h), on the primary
 * context of GPU 0: the context aj_device_open(ctx, AJ_DEVICE_CUDA, 0, ..)
 * launches in, on the same (default) stream, so the events bracket just
 * the launch.
 */
typedef struct gpu_clock {
    const aj_cuda *cu;
    CUdevice device;
    CUcontext primary;
    CUevent start, end;
} gpu_clock;

static aj_status clock_open(aj_ctx *ctx, gpu_clock *c)
{
    memset(c, 0, sizeof *c);
    aj_status st = aj_cuda_get(ctx, &c->cu);
    if (st != AJ_OK)
        return st;
    const aj_cuda *cu = c->cu;
    CUcontext popped;
    AJ_CU_TRY(ctx, cu, cu->DeviceGet(&c->device, 0), "cuDeviceGet");
    AJ_CU_TRY(ctx, cu, cu->DevicePrimaryCtxRetain(&c->primary, c->device),
              "cuDevicePrimaryCtxRetain");
    AJ_CU_TRY(ctx, cu, cu->CtxPushCurrent(c->primary), "cuCtxPushCurrent");
    CUresult r = cu->EventCreate(&c->start, 0);
    if (r == AJ_CUDA_SUCCESS)
        r = cu->EventCreate(&c->end, 0);
    cu->CtxPopCurrent(&popped);
    AJ_CU_TRY(ctx, cu, r, "cuEventCreate");
done:
    return st;
}

static void clock_close(gpu_clock *c)
{
    const aj_cuda *cu = c->cu;
    if (!c->primary)
        return;
    CUcontext popped;
    if (cu->CtxPushCurrent(c->primary) == AJ_CUDA_SUCCESS) {
        if (c->start)
            cu->EventDestroy(c->start);
        if (c->end)
            cu->EventDestroy(c->end);
        cu->CtxPopCurrent(&popped);
    }
    cu->DevicePrimaryCtxRelease(c->device);
}

/* One aj_forward (fa) or aj_backward (ba) on the default stream, timed
 * by events around it. */
static aj_status time_launch(aj_ctx *ctx, gpu_clock *c, aj_device *dev, const aj_kernel *k,
                             const aj_fwd_args *fa, const aj_bwd_args *ba, double *ms)
{
    const aj_cuda *cu = c->cu;
    aj_status st = AJ_OK;
    CUcontext popped;
    float elapsed = 0;
    AJ_CU_TRY(ctx, cu, cu->CtxPushCurrent(c->primary), "cuCtxPushCurrent");
    CUresult r = cu->EventRecord(c->start, NULL);
    if (r == AJ_CUDA_SUCCESS) {
        st = fa ? aj_forward(ctx, dev, k, fa) : aj_backward(ctx, dev, k, ba);
        r = cu->EventRecord(c->end, NULL);
    }
    if (r == AJ_CUDA_SUCCESS)
        r = cu->EventSynchronize(c->end);
    if (r == AJ_CUDA_SUCCESS)
        r = cu->EventElapsedTime(&elapsed, c->start, c->end);
    cu->CtxPopCurrent(&popped);
    if (st == AJ_OK)
        AJ_CU_TRY(ctx, cu, r, "CUDA event timing");
    *ms = elapsed;
done:
    return st;
}

/* Registers and local memory (spills) per thread of the kernel's stage
 * `stage`, as the driver reports them after loading its PTX; -1 if it
 * cannot say. */
static void kernel_resources(gpu_clock *c, const aj_kernel *k, int stage, int *regs, int *local)
{
    const aj_cuda *cu = c->cu;
    *regs = *local = -1;
    size_t len;
    const void *ptx = aj_kernel_code(k, &len);
    CUcontext popped;
    CUmodule mod;
    CUfunction fn;
    if (!ptx || cu->CtxPushCurrent(c->primary) != AJ_CUDA_SUCCESS)
        return;
    if (cu->ModuleLoadData(&mod, ptx) == AJ_CUDA_SUCCESS) {
        if (cu->ModuleGetFunction(&fn, mod, aj_kernel_stage_entry(k, stage)) == AJ_CUDA_SUCCESS) {
            cu->FuncGetAttribute(regs, AJ_CU_FUNC_ATTRIBUTE_NUM_REGS, fn);
            cu->FuncGetAttribute(local, AJ_CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn);
        }
        cu->ModuleUnload(mod);
    }
    cu->CtxPopCurrent(&popped);
}

/* One row of the speed table and of its JSON (TFLOP/s counted as
 * FlashAttention counts them: 4 B S^2 D H, halved for causal); 1 if the
 * kernel did not run. */
static int report_speed(aj_ctx *ctx, const char *kernel, int d, int s, int b, int h, int causal,
                        aj_status st, double ms, int regs, int local, int *first)
{
    /* a backward row (kernel "..._bwd") counts FlashAttention's 2.5 forwards */
    size_t len = strlen(kernel);
    int bwd = len > 4 && strcmp(kernel + len - 4, "_bwd") == 0;
    const char *kind = bwd ? "" : " fwd";
    double flops = (bwd ? 10.0 : 4.0) * b * (double)s * s * d * h / (causal ? 2 : 1);
    if (st != AJ_OK) {
        say("| %s%s | %d | %d | %d x %d | %s | %s | - | %d | %d |\n", kernel, kind, d, s, b, h,
            causal ? "yes" : "no", aj_status_str(st), regs, local);
        fprintf(stderr, "gpu_check: %s d%d S%d: %s\n", kernel, d, s, aj_last_error(ctx));
        return 1;
    }
    say("| %s%s | %d | %d | %d x %d | %s | %.3f | %.1f | %d | %d |\n", kernel, kind, d, s, b,
        h, causal ? "yes" : "no", ms, flops / ms / 1e9, regs, local);
    if (json)
        fprintf(json, "%s    {\"kernel\": \"%s%s\", \"d\": %d, \"S\": %d, \"B\": %d, \"H\": %d, "
                "\"causal\": %s, \"ms\": %.4f, \"tflops\": %.3f, \"registers\": %d, "
                "\"local_bytes\": %d}", *first ? "" : ",\n", kernel, bwd ? "" : "_fwd", d, s, b, h,
                causal ? "true" : "false", ms, flops / ms / 1e9, regs, local);
    *first = 0;
    return 0;
}

/*
 * The median of `reps` forwards of kernel k (after 3 warm-up launches,
 * the first loading its module) over B x H x S x d inputs of `in` (bf16,
 * or f8e4m3 with descales of 1), a fixed small pattern uploaded once, o in
 * bf16; AJ_OK and *ms, or the failure.
 */
static aj_status time_kernel(aj_ctx *ctx, gpu_clock *clock, aj_device *dev, const aj_kernel *k,
                             aj_dtype in, int b, int h, int s, int d, int reps, double *ms)
{
    size_t elems = (size_t)b * h * s * d, isz = (size_t)aj_dtype_size(in);
    void *q = NULL, *kk = NULL, *v = NULL, *o = NULL, *lse = NULL, *one = NULL;
    aj_status st = AJ_OK;
    if (st == AJ_OK) st = aj_device_alloc(dev, elems * isz, &q);
    if (st == AJ_OK) st = aj_device_alloc(dev, elems * isz, &kk);
    if (st == AJ_OK) st = aj_device_alloc(dev, elems * isz, &v);
    if (st == AJ_OK) st = aj_device_alloc(dev, elems * 2, &o);
    if (st == AJ_OK) st = aj_device_alloc(dev, (size_t)b * h * s * 4, &lse);
    if (st == AJ_OK) st = aj_device_alloc(dev, 4, &one);
    unsigned char *host = malloc(elems * isz);
    for (size_t i = 0; host && i < elems; i++) {
        float f = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        aj_convert(&f, AJ_DTYPE_F32, host + i * isz, in, 1);
    }
    const float unit = 1.0f;
    if (st == AJ_OK && host) st = aj_device_copy_to(dev, q, host, elems * isz);
    if (st == AJ_OK && host) st = aj_device_copy_to(dev, kk, host, elems * isz);
    if (st == AJ_OK && host) st = aj_device_copy_to(dev, v, host, elems * isz);
    if (st == AJ_OK) st = aj_device_copy_to(dev, one, &unit, 4);
    free(host);
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = dev_tensor(q, in, b, h, s, d);
    a.k = dev_tensor(kk, in, b, h, s, d);
    a.v = dev_tensor(v, in, b, h, s, d);
    a.o = dev_tensor(o, AJ_DTYPE_BF16, b, h, s, d);
    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {b, h, s, 0}, {(int64_t)h * s, s, 1, 0}};
    if (in != AJ_DTYPE_BF16)
        a.q_scale = a.k_scale = a.v_scale = (aj_tensor){one, AJ_DTYPE_F32, 1, {1}, {1}};
    double times[16];
    for (int r = 0; r < 3 && st == AJ_OK; r++)
        st = time_launch(ctx, clock, dev, k, &a, NULL, &times[0]);
    for (int r = 0; r < reps && st == AJ_OK; r++)
        st = time_launch(ctx, clock, dev, k, &a, NULL, &times[r]);
    if (st == AJ_OK) {
        qsort(times, (size_t)reps, sizeof times[0], cmp_double);
        *ms = times[reps / 2];
    }
    void *mem[] = {q, kk, v, o, lse, one};
    for (size_t i = 0; i < sizeof mem / sizeof mem[0]; i++)
        aj_device_free(dev, mem[i]);
    return st;
}

/* A timed shape: the kernel's name in the table, its inputs' dtype, B x
 * H x S x d, causal or not. */
typedef struct speed_case {
    const char *name;
    aj_dtype in;
    int b, h, s, d, causal;
} speed_case;

/* Kernel k (NULL: its compile failed) timed on c with its registers and
 * spills, one row reported; destroys k; 1 if it did not run. */
static int measure(aj_ctx *ctx, gpu_clock *clock, aj_device *dev, aj_kernel *k,
                   const speed_case *c, int reps, int *first)
{
    int regs = -1, local = -1;
    double ms = 0;
    if (k)
        kernel_resources(clock, k, 0, &regs, &local);
    aj_status st = k ? time_kernel(ctx, clock, dev, k, c->in, c->b, c->h, c->s, c->d, reps, &ms)
                     : AJ_ERR_CODEGEN;
    aj_kernel_destroy(k);
    return report_speed(ctx, c->name, c->d, c->s, c->b, c->h, c->causal, st, ms, regs, local,
                        first);
}

/* A backward's tensors of B x H x S x d bf16, made once for every kernel
 * timed: the inputs in [-1, 1], O and dO the inputs' values, LSE a
 * constant above every row's scores, so that P stays finite and small as
 * a real backward's does. */
typedef struct bwd_inputs {
    void *buf[9];   /* q k v o do dq dk dv, then lse */
    aj_bwd_args a;
} bwd_inputs;

static aj_status bwd_inputs_make(aj_device *dev, int b, int h, int s, int d, bwd_inputs *in)
{
    size_t elems = (size_t)b * h * s * d, rows = (size_t)b * h * s;
    aj_status st = AJ_OK;
    memset(in, 0, sizeof *in);
    for (int i = 0; i < 9 && st == AJ_OK; i++)
        st = aj_device_alloc(dev, i < 8 ? elems * 2 : rows * 4, &in->buf[i]);
    uint16_t *host = malloc(elems * 2);
    float *lse = malloc(rows * 4);
    if (!host || !lse)
        st = AJ_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; st == AJ_OK && i < elems; i++) {
        float f = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        aj_convert(&f, AJ_DTYPE_F32, &host[i], AJ_DTYPE_BF16, 1);
    }
    for (size_t i = 0; st == AJ_OK && i < rows; i++)
        lse[i] = (float)sqrt((double)d) + logf((float)s);
    for (int i = 0; i < 5 && st == AJ_OK; i++)   /* q k v o do */
        st = aj_device_copy_to(dev, in->buf[i], host, elems * 2);
    if (st == AJ_OK)
        st = aj_device_copy_to(dev, in->buf[8], lse, rows * 4);
    free(host);
    free(lse);
    in->a = (aj_bwd_args)AJ_BWD_ARGS_INIT;
    aj_tensor *t[8] = {&in->a.q, &in->a.k, &in->a.v, &in->a.o, &in->a.do_, &in->a.dq,
                       &in->a.dk, &in->a.dv};
    for (int i = 0; i < 8; i++)
        *t[i] = dev_tensor(in->buf[i], AJ_DTYPE_BF16, b, h, s, d);
    in->a.lse = (aj_tensor){in->buf[8], AJ_DTYPE_F32, 3, {b, h, s, 0}, {(int64_t)h * s, s, 1, 0}};
    return st;
}

static void bwd_inputs_free(aj_device *dev, bwd_inputs *in)
{
    for (int i = 0; i < 9; i++)
        aj_device_free(dev, in->buf[i]);
}

/* Flash backward kernel k timed on `in`: the median of `reps` launches
 * after 3. */
static aj_status time_backward(aj_ctx *ctx, gpu_clock *clock, aj_device *dev,
                               const aj_kernel *k, const bwd_inputs *in, int reps, double *ms)
{
    double times[16];
    aj_status st = AJ_OK;
    for (int r = 0; r < 3 && st == AJ_OK; r++)
        st = time_launch(ctx, clock, dev, k, NULL, &in->a, &times[0]);
    for (int r = 0; r < reps && st == AJ_OK; r++)
        st = time_launch(ctx, clock, dev, k, NULL, &in->a, &times[r]);
    if (st == AJ_OK) {
        qsort(times, (size_t)reps, sizeof times[0], cmp_double);
        *ms = times[reps / 2];
    }
    return st;
}

/* The flash backward at d 128, S 4096, 4 x 16 heads, deterministic:
 * mma.sync, and on a 9.0 GPU its wgmma kernels on one and two
 * warpgroups; registers of the dkdv stage; --quick: causal only. */
static int benchmark_backward(aj_ctx *ctx, gpu_clock *clock, aj_device *dev, int quick,
                              int reps)
{
    enum { B = 4, H = 16, S = 4096, D = 128 };
    say("\n## Backward speed on %s (bf16, d %d, S %d, %d x %d heads, deterministic, "
        "CUDA events; dkdv's registers)\n\n", aj_device_name(dev), D, S, B, H);
    say("| kernel | d | S | B x H | causal | median (ms) | TFLOP/s | registers | local bytes |\n"
        "|---|---:|---:|---|---|---:|---:|---:|---:|\n");
    if (json)
        fprintf(json, ",\n  \"backward_speed\": [\n");
    static const struct { const char *name, *schedule; } kernels[] = {
        {"flash_bwd", ""},
        {"wgmma_x1_bwd", " schedule = (warpgroups = 1)"},
        {"wgmma_x2_bwd", " schedule = (warpgroups = 2)"},
    };
    int nk = aj_device_runs(dev, AJ_TARGET_SM_90A) ? 3 : 1;   /* wgmma: 9.0 only */
    int failed = 0, first = 1;
    bwd_inputs in;
    aj_status made = bwd_inputs_make(dev, B, H, S, D, &in);
    for (int i = 0; i < nk; i++)
        for (int causal = quick; causal < 2; causal++) {
            char text[256];
            snprintf(text, sizeof text, "attention backward flash { dtype = bf16 head_dim = %d "
                     "mask = %s deterministic = true%s }", D,
                     causal ? "causal(bottom_right)" : "none", kernels[i].schedule);
            aj_kernel *k = made == AJ_OK ? compile_spec(ctx, dev, text) : NULL;
            int regs = -1, local = -1;
            double ms = 0;
            if (k)
                kernel_resources(clock, k, 1, &regs, &local);
            aj_status st = made != AJ_OK ? made
                           : k           ? time_backward(ctx, clock, dev, k, &in, reps, &ms)
                                         : AJ_ERR_CODEGEN;
            aj_kernel_destroy(k);
            failed += report_speed(ctx, kernels[i].name, D, S, B, H, causal, st, ms, regs,
                                   local, &first);
        }
    bwd_inputs_free(dev, &in);
    if (json)
        fprintf(json, "\n  ]");
    return failed;
}

static int benchmark(aj_ctx *ctx, aj_device *dev, int quick)
{
    static const int seqs[] = {1024, 2048, 4096, 8192, 16384};
    static const int dims[] = {64, 128};
    const int tokens = 16384, hidden = 2048, reps = quick ? 5 : 10;
    gpu_clock clock;
    if (clock_open(ctx, &clock) != AJ_OK) {
        fprintf(stderr, "gpu_check: CUDA events: %s\n", aj_last_error(ctx));
        return 1;
    }
    say("\n## Forward speed on %s (bf16, B*S = 16k tokens, hidden 2048, CUDA events)\n\n",
        aj_device_name(dev));
    say("| kernel | d | S | B x H | causal | median (ms) | TFLOP/s | registers | local bytes |\n"
        "|---|---:|---:|---|---|---:|---:|---:|---:|\n");
    if (json)
        fprintf(json, ",\n  \"forward_speed\": [\n");
    int failed = 0, first = 1;
    static const char *const variants[] = {"efficient", "flash", "wgmma", "ws"};
    int nv = aj_device_runs(dev, AJ_TARGET_SM_90A) ? 4 : 2;   /* wgmma, ws: 9.0 only */
    for (int vi = 0; vi < nv; vi++) {
        for (int di = 0; di < 2; di++)
            for (int si = 0; si < 5; si++)
                for (int causal = 0; causal < 2; causal++) {
                    int d = dims[di], s = seqs[si], h = hidden / d, b = tokens / s;
                    /* quick: every other length; the Hopper pair at d 128
                     * only, so the step times as many kernels as before ws */
                    if (quick && (si % 2 || (vi >= 2 && d != 128)))
                        continue;
                    aj_kernel *k = compile_for(ctx, dev, variants[vi], AJ_DTYPE_BF16, d, causal);
                    const speed_case sc = {variants[vi], AJ_DTYPE_BF16, b, h, s, d, causal};
                    failed += measure(ctx, &clock, dev, k, &sc, reps, &first);
                }
    }
    /* wide heads, S 4096: at 512 (Gemma-4's global layers) the efficient
     * forward and the flash forward's Dv split across warp pairs, and on
     * 9.0 across the wgmma warpgroup pair; at 256 the two flash kernels
     * (which the audit's model ranks the other way round: bench/README.md) */
    for (int wide = 0; wide < 2; wide++)
        for (int vi = wide ? 0 : 1; vi < (nv > 2 ? 3 : 2); vi++)
            for (int causal = 0; causal < 2; causal++) {
                const int d = wide ? 512 : 256, s = 4096;
                aj_kernel *k = compile_for(ctx, dev, variants[vi], AJ_DTYPE_BF16, d, causal);
                const speed_case sc = {variants[vi], AJ_DTYPE_BF16, tokens / s, hidden / d, s, d,
                                       causal};
                failed += measure(ctx, &clock, dev, k, &sc, reps, &first);
            }
    if (json)
        fprintf(json, "\n  ]");
    failed += benchmark_backward(ctx, &clock, dev, quick, reps);
    clock_close(&clock);
    return failed;
}

/*
 * FP8 inputs (docs/ir.md "FP8 inputs"): the efficient forward (every GPU)
 * and the flash forward's FP8 tensor-core kernel (Ada's mma.sync on 8.9,
 * Hopper's wgmma on 9.0), e4m3 and e5m2, d 64 / 128 / 256 x the masks and
 * a varlen batch, per-tensor and per-head descales, GQA 8/2, against the
 * float64 reference of the dequantised inputs (the harness allows the
 * tensor-core kernel's P in e4m3); then one shape timed, bf16 out, d 128,
 * S 4096, 16k tokens, causal and not: the FP8 kernels beside the bf16
 * flash forward.
 */
static int check_fp8(aj_ctx *ctx, aj_device *dev, int quick)
{
    static const int dims[] = {64, 128, 256};
    static const int32_t lq[] = {1, 300, 0, 129}, lk[] = {257, 64, 5, 0};
    const int tensor_cores =
        aj_device_target(dev) == AJ_TARGET_SM_89 || aj_device_runs(dev, AJ_TARGET_SM_90A);
    int failed = 0, cases = 0;
    correctness_header(dev, "FP8 inputs", "correctness_fp8");
    for (int v = 0; v < 1 + tensor_cores; v++)
        for (int d = 0; d < 3; d++)
            for (int m = 0; m < 5; m++) {
                if (quick && (d + m) % 2)
                    continue;
                fwd_run_options how = {.variant = v ? AJ_VARIANT_FLASH : AJ_VARIANT_EFFICIENT};
                if (m == 4) {
                    how.seqlens_q = lq;
                    how.seqlens_k = lk;
                }
                char label[128];
                aj_dtype f8 = (d + m / 2 + v) % 2 ? AJ_DTYPE_F8E5M2 : AJ_DTYPE_F8E4M3;
                snprintf(label, sizeof label, "%s fwd %s d%d %s%s%s", v ? "flash" : "efficient",
                         aj_dtype_name(f8), dims[d], masks[m % 4], m % 2 ? " per-head" : "",
                         m == 4 ? " varlen" : "");
                fwd_case c = fwd_case_base(label, AJ_DTYPE_BF16, dims[d], masks[m % 4]);
                c.f8 = f8;
                c.f8_q = 1;
                c.f8_per_head = m % 2;
                c.b = m == 4 ? 4 : 2;
                c.hq = 8;
                c.hkv = 2;
                c.sq = 257;
                c.sk = 300;
                c.magnitude = 2.0;
                c.seed = (uint64_t)(3000 + 100 * v + 10 * d + m);
                fwd_result r = fwd_run_case_ext(ctx, dev, &c, NULL, &how);
                failed += report_case(ctx, label, &r, cases++ == 0);
            }
    failed = correctness_footer(cases, failed);
    if (!tensor_cores)
        say("\nSKIP the FP8 tensor-core kernel: %s has no FP8 tensor cores (8.9 or 9.0)\n",
            aj_device_name(dev));

    gpu_clock clock;
    if (clock_open(ctx, &clock) != AJ_OK) {
        fprintf(stderr, "gpu_check: CUDA events: %s\n", aj_last_error(ctx));
        return failed + 1;
    }
    say("\n## FP8 forward speed on %s (bf16 out, d 128, S 4096, 4 x 16 heads)\n\n",
        aj_device_name(dev));
    say("| kernel | d | S | B x H | causal | median (ms) | TFLOP/s | registers | local bytes |\n"
        "|---|---:|---:|---|---|---:|---:|---:|---:|\n");
    if (json)
        fprintf(json, ",\n  \"fp8_speed\": [\n");
    static const struct {
        const char *name, *variant, *inputs;
        int tensor_cores;
    } kernels[] = {
        {"bf16 flash", "flash", "", 0},
        {"e4m3 efficient", "efficient", " q_dtype = f8e4m3 kv_dtype = f8e4m3", 0},
        {"e4m3 flash", "flash", " q_dtype = f8e4m3 kv_dtype = f8e4m3", 1},
    };
    int first = 1;
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        for (int causal = 0; causal < 2; causal++) {
            if (kernels[i].tensor_cores && !tensor_cores)
                continue;
            char text[256];
            snprintf(text, sizeof text, "attention forward %s { dtype = bf16 head_dim = 128%s "
                     "mask = %s }", kernels[i].variant, kernels[i].inputs,
                     causal ? "causal(bottom_right)" : "none");
            aj_kernel *k = compile_spec(ctx, dev, text);
            const speed_case sc = {kernels[i].name,
                                   kernels[i].inputs[0] ? AJ_DTYPE_F8E4M3 : AJ_DTYPE_BF16,
                                   4, 16, 4096, 128, causal};
            failed += measure(ctx, &clock, dev, k, &sc, quick ? 5 : 10, &first);
        }
    clock_close(&clock);
    if (json)
        fprintf(json, "\n  ]");
    return failed;
}

/* ---------------------------------------------------------------- 3 */

static int startup(aj_device *dev, const char *specs_dir)
{
    char cache_dir[] = "/tmp/aj_gpu_cache_XXXXXX";
    if (!mkdtemp(cache_dir))
        return 1;
    DIR *d = opendir(specs_dir);
    char *texts[64];
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < 64;) {
        if (!strstr(e->d_name, ".aj"))
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", specs_dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        texts[n] = calloc(1, 8192);
        size_t len = fread(texts[n], 1, 8191, f);
        texts[n][len] = '\0';
        fclose(f);
        n++;
    }
    if (d)
        closedir(d);
    double ms[2] = {0, 0};
    int failed = 0;
    for (int pass = 0; pass < 2; pass++) {
        aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
        cfg.cache_dir = cache_dir;
        aj_ctx *ctx = NULL;
        aj_ctx_create(&cfg, &ctx);
        aj_compile_job jobs[64];
        aj_op *ops[64];
        memset(jobs, 0, sizeof jobs);
        for (int i = 0; i < n; i++) {
            ops[i] = NULL;
            aj_op_parse(ctx, texts[i], strlen(texts[i]), "spec", &ops[i]);
            jobs[i].op = ops[i];
        }
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = aj_device_target(dev);
        double t0 = now_ms();
        if (aj_compile_many(ctx, jobs, (size_t)n, &opt, 0) != AJ_OK) {
            fprintf(stderr, "gpu_check: start-up compile: %s\n", aj_last_error(ctx));
            failed = 1;
        }
        ms[pass] = now_ms() - t0;
        for (int i = 0; i < n; i++) {
            aj_kernel_destroy(jobs[i].kernel);
            aj_op_destroy(ops[i]);
        }
        aj_ctx_destroy(ctx);
    }
    say("\n## Start-up: the %d example specs for %s\n\n| cache | total (ms) | per kernel (ms) |\n"
        "|---|---:|---:|\n| cold (empty, parallel) | %.1f | %.2f |\n| warm (disk) | %.1f | %.2f |\n"
        "\nwarm is %.0fx faster\n", n, aj_target_name(aj_device_target(dev)), ms[0],
        ms[0] / (n ? n : 1), ms[1], ms[1] / (n ? n : 1), ms[0] / (ms[1] > 0 ? ms[1] : 1));
    if (json)
        fprintf(json, ",\n  \"startup\": {\"specs\": %d, \"cold_ms\": %.2f, \"warm_ms\": %.2f}",
                n, ms[0], ms[1]);
    for (int i = 0; i < n; i++)
        free(texts[i]);
    temp_dir_remove(cache_dir);
    return failed;
}

/* ---------------------------------------------------------------- dump */

/* A few cases' inputs and outputs as .npy, for torch_compare.py. */
static int dump_cases(aj_ctx *ctx, aj_device *dev, const char *dir)
{
    static const struct { aj_dtype dt; int d; int causal; } cases[] = {
        {AJ_DTYPE_F16, 64, 0}, {AJ_DTYPE_BF16, 128, 1}, {AJ_DTYPE_F16, 256, 1}};
    mkdir(dir, 0755);
    int failed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int b = 2, h = 4, s = 384, d = cases[c].d;
        size_t n = (size_t)b * h * s * d;
        float *f = malloc(n * 4 * 3), *out = malloc(n * 4), *lse = malloc((size_t)b * h * s * 4);
        uint16_t *hq = malloc(n * 2 * 3), *ho = malloc(n * 2);
        for (size_t i = 0; i < n * 3; i++) {
            float x = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
            aj_convert(&x, AJ_DTYPE_F32, &hq[i], cases[c].dt, 1);
            aj_convert(&hq[i], cases[c].dt, &f[i], AJ_DTYPE_F32, 1);
        }
        aj_kernel *k = compile_for(ctx, dev, "efficient", cases[c].dt, d, cases[c].causal);
        void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dlse = NULL;
        aj_status st = k ? AJ_OK : AJ_ERR_CODEGEN;
        if (st == AJ_OK) st = aj_device_alloc(dev, n * 2, &dq);
        if (st == AJ_OK) st = aj_device_alloc(dev, n * 2, &dk);
        if (st == AJ_OK) st = aj_device_alloc(dev, n * 2, &dv);
        if (st == AJ_OK) st = aj_device_alloc(dev, n * 2, &dout);
        if (st == AJ_OK) st = aj_device_alloc(dev, (size_t)b * h * s * 4, &dlse);
        if (st == AJ_OK) st = aj_device_copy_to(dev, dq, hq, n * 2);
        if (st == AJ_OK) st = aj_device_copy_to(dev, dk, hq + n, n * 2);
        if (st == AJ_OK) st = aj_device_copy_to(dev, dv, hq + 2 * n, n * 2);
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.q = dev_tensor(dq, cases[c].dt, b, h, s, d);
        a.k = dev_tensor(dk, cases[c].dt, b, h, s, d);
        a.v = dev_tensor(dv, cases[c].dt, b, h, s, d);
        a.o = dev_tensor(dout, cases[c].dt, b, h, s, d);
        a.lse = (aj_tensor){dlse, AJ_DTYPE_F32, 3, {b, h, s, 0}, {(int64_t)h * s, s, 1, 0}};
        if (st == AJ_OK) st = aj_forward(ctx, dev, k, &a);
        if (st == AJ_OK) st = aj_device_copy_from(dev, ho, dout, n * 2);
        if (st == AJ_OK) st = aj_device_copy_from(dev, lse, dlse, (size_t)b * h * s * 4);
        if (st == AJ_OK) {
            aj_convert(ho, cases[c].dt, out, AJ_DTYPE_F32, n);
            char name[64], path[1024], err[256];
            int64_t shape[4] = {b, h, s, d}, lshape[3] = {b, h, s};
            snprintf(name, sizeof name, "%s_d%d_%s", aj_dtype_name(cases[c].dt), d,
                     cases[c].causal ? "causal_bottom_right" : "none");
            const char *names[5] = {"q", "k", "v", "o", "lse"};
            for (int t = 0; t < 5; t++) {
                snprintf(path, sizeof path, "%s/%s.%s.npy", dir, name, names[t]);
                npy_status ns = t < 3 ? npy_write_f32(path, f + (size_t)t * n, 4, shape, err,
                                                      sizeof err)
                              : t == 3 ? npy_write_f32(path, out, 4, shape, err, sizeof err)
                                       : npy_write_f32(path, lse, 3, lshape, err, sizeof err);
                if (ns != NPY_OK) {
                    fprintf(stderr, "gpu_check: %s\n", err);
                    failed++;
                }
            }
        } else {
            fprintf(stderr, "gpu_check: dump: %s\n", aj_last_error(ctx));
            failed++;
        }
        aj_device_free(dev, dq);
        aj_device_free(dev, dk);
        aj_device_free(dev, dv);
        aj_device_free(dev, dout);
        aj_device_free(dev, dlse);
        aj_kernel_destroy(k);
        free(f), free(out), free(lse), free(hq), free(ho);
    }
    return failed;
}

/* report_case for a paged case's result. */
static int report_paged(aj_ctx *ctx, const char *label, const paged_result *r, int first)
{
    fwd_result fr;
    memset(&fr, 0, sizeof fr);
    fr.status = r->status;
    fr.max_err_o = r->err_o;
    fr.max_err_lse = r->err_lse;
    fr.exact_empty_rows = r->exact_empty;
    return report_case(ctx, label, &fr, first);
}

/* The paged cases, each compiled, run against the float64 reference and
 * reported; the last two's times into last[0..1] (NAN where one failed).
 * Returns the failures. */
static int run_paged_cases(aj_ctx *ctx, aj_device *dev, const paged_case *cases, int n,
                           double last[2])
{
    int failed = 0;
    last[0] = last[1] = NAN;
    for (int i = 0; i < n; i++) {
        char label[160];
        paged_label(&cases[i], label, sizeof label);
        aj_kernel *k = NULL;
        paged_result r = {paged_compile(ctx, dev, &cases[i], &k), 0, 0, 1, 0};
        if (r.status == AJ_OK)
            r = paged_run(ctx, dev, k, &cases[i]);
        aj_kernel_destroy(k);
        failed += report_paged(ctx, label, &r, i == 0);
        if (i >= n - 2 && r.status == AJ_OK)
            last[i - (n - 2)] = r.seconds;
    }
    return failed;
}

/*
 * Absorbed MLA (kv_shared, docs/ir.md "Shared K/V cache"): first the
 * shared caches' sweep (paged_shared_case: head dims to 576, groups to 64
 * heads, both tiles) against the float64 reference, then DeepSeek-V3's
 * latent rows (576 = 512 + 64, V their first 512 columns), 128 query
 * heads over the one latent head, a decode (Sq 1) over 4 contexts (1
 * with --quick) of 4096 in pages of 64, bf16, causal, the scale
 * 1/sqrt(192) x 1.25, on the flash variant's mma tiles (flash_fwd.c
 * "Paged") and on the efficient variant's SIMT tiles, one after the
 * other in the same run, each checked and timed (best of 10): latent
 * bytes read per second, TFLOP/s and the mma tiles' speedup.
 */
static int check_mla(aj_ctx *ctx, aj_device *dev, int quick)
{
    enum { CTX = 4096 };
    const int B = quick ? 1 : 4;   /* (the host's float64 reference: 1.1 GFLOP a sequence) */
    static int32_t lens[4];
    for (int b = 0; b < B; b++)
        lens[b] = CTX;
    paged_case cases[PAGED_SHARED_CASES + 2];
    int n = 0;
    for (int i = 0; i < PAGED_SHARED_CASES; i++)
        cases[n++] = paged_shared_case(i);
    for (int efficient = 0; efficient < 2; efficient++) {
        paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 576, lens, B);
        c.dv = 512;
        c.shared = 1;
        c.scale = 1.0 / sqrt(192.0) * 1.25;
        c.hq = 128;
        c.hkv = 1;
        c.page_size = 64;
        c.mask = AJ_MASK_CAUSAL;
        c.repeat = quick ? 3 : 10;
        c.efficient = efficient;
        cases[n++] = c;
    }
    correctness_header(dev, "absorbed MLA decode", "correctness_mla");
    double best[2];
    int failed = correctness_footer(n, run_paged_cases(ctx, dev, cases, n, best));
    double bytes = (double)B * CTX * 576 * 2;
    double flops = 2.0 * B * CTX * 128 * (576 + 512);
    say("\n## MLA decode on %s: B %d, context %d, 128 heads over one latent head, 576/512, "
        "bf16, page 64\n\n| tiles | ms | latent GB/s | TFLOP/s |\n|---|---:|---:|---:|\n"
        "| mma (flash) | %.4f | %.1f | %.2f |\n| SIMT (efficient) | %.4f | %.1f | %.2f |\n\n"
        "mma tiles %.2fx the SIMT tiles (best of %d)\n", aj_device_name(dev), B, CTX,
        best[0] * 1e3, bytes / best[0] * 1e-9, flops / best[0] * 1e-12, best[1] * 1e3,
        bytes / best[1] * 1e-9, flops / best[1] * 1e-12, best[1] / best[0], quick ? 3 : 10);
    if (json)
        fprintf(json, ",\n  \"mla_decode\": {\"seconds\": %.6g, \"seconds_simt\": %.6g, "
                "\"latent_bytes\": %.6g, \"flops\": %.6g}", best[0], best[1], bytes, flops);
    return failed;
}

/*
 * layout = paged: paged_gpu_cases (test_sim_paged's) against the float64
 * reference, then a decode of bench/decode's heads at a quarter of its
 * batch (the inputs are generated and checked on the host): batch 8,
 * context 4096, Hq 32, Hkv 8, d 128, bf16 queries and cache, page size
 * 16, pages shuffled, with the launch's split count and unsplit (splits =
 * 1), each the best of 10 calls (aj_forward + synchronize) and checked:
 * the KV bytes the call must read per second, and the split speedup.
 */
static int check_paged(aj_ctx *ctx, aj_device *dev, int quick)
{
    enum { B = 8, CTX = 4096 };
    paged_case cases[PAGED_GPU_CASES + 2];
    int n = paged_gpu_cases(cases), failed = 0;
    static int32_t lens[B];
    for (int b = 0; b < B; b++)
        lens[b] = CTX;
    for (int unsplit = 0; unsplit < 2; unsplit++) {
        paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 128, lens, B);
        c.hq = 32;
        c.hkv = 8;
        c.splits = unsplit;
        c.repeat = quick ? 3 : 10;
        cases[n++] = c;
    }
    correctness_header(dev, "the paged forward", "correctness_paged");
    double best[2];
    failed = correctness_footer(n, run_paged_cases(ctx, dev, cases, n, best));
    double bytes = (double)B * CTX * 8 * (128 + 128) * 2;
    say("\n## Paged decode on %s: B %d, context %d, Hq 32, Hkv 8, d 128, bf16, page 16\n\n"
        "| splits | ms | KV GB/s |\n|---|---:|---:|\n| launch's | %.4f | %.1f |\n"
        "| 1 | %.4f | %.1f |\n\nsplit speedup %.2fx (aj_forward + synchronize, best of %d)\n",
        aj_device_name(dev), B, CTX, best[0] * 1e3, bytes / best[0] * 1e-9, best[1] * 1e3,
        bytes / best[1] * 1e-9, best[1] / best[0], quick ? 3 : 10);
    if (json)
        fprintf(json, ",\n  \"paged_decode\": {\"seconds_split\": %.6g, \"seconds_unsplit\": "
                "%.6g, \"kv_bytes\": %.6g}", best[0], best[1], bytes);
    return failed + check_mla(ctx, dev, quick);
}

static const char *const families[] = {"all",   "efficient_fwd", "flash_fwd", "wgmma_fwd", "fp8",
                                       "paged", "bench",         "startup",   "dump"};

int main(int argc, char **argv)
{
    const char *out_dir = NULL, *dump_dir = NULL, *specs = "examples/specs", *family = "all";
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out_dir = argv[++i];
        else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc)
            dump_dir = argv[++i];
        else if (strcmp(argv[i], "--specs") == 0 && i + 1 < argc)
            specs = argv[++i];
        else if (strcmp(argv[i], "--family") == 0 && i + 1 < argc)
            family = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else {
            fprintf(stderr, "usage: gpu_check [--family all|efficient_fwd|flash_fwd|wgmma_fwd|"
                    "fp8|paged|bench|startup|dump] [--out DIR] [--dump DIR] [--specs DIR] "
                    "[--quick]\n");
            return 2;
        }
    }
    int known = 0;
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        known |= strcmp(family, families[i]) == 0;
    if (!known || (strcmp(family, "dump") == 0 && !dump_dir)) {
        fprintf(stderr, "gpu_check: %s\n", known ? "--family dump needs --dump DIR"
                                                 : "unknown --family");
        return 2;
    }
    int all = strcmp(family, "all") == 0;
    aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
    cfg.cache_mode = AJ_CACHE_MEMORY;
    aj_ctx *ctx = NULL;
    aj_ctx_create(&cfg, &ctx);
    aj_device *dev = NULL;
    if (aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev) != AJ_OK) {
        printf("SKIP gpu_check: %s\n", aj_last_error(ctx));
        aj_ctx_destroy(ctx);
        return 77;
    }
    if (out_dir) {
        char path[1024], suffix[64] = "";
        if (!all)
            snprintf(suffix, sizeof suffix, "_%s", family);
        mkdir(out_dir, 0755);
        snprintf(path, sizeof path, "%s/gpu_check%s.json", out_dir, suffix);
        json = fopen(path, "w");
        snprintf(path, sizeof path, "%s/gpu_check%s.md", out_dir, suffix);
        md = fopen(path, "w");
    }
    if (json)
        fprintf(json, "{\n  \"device\": \"%s\",\n  \"target\": \"%s\",\n  \"family\": \"%s\"",
                aj_device_name(dev), aj_target_name(aj_device_target(dev)), family);
    say("# attnjit GPU check (%s): %s (%s), attnjit %s, LLVM %s\n", family, aj_device_name(dev),
        aj_target_name(aj_device_target(dev)), aj_version_string(), aj_llvm_version());
    int failed = 0;
    if (all || strcmp(family, "efficient_fwd") == 0)
        failed += check_efficient_fwd(ctx, dev, quick);
    if (all || strcmp(family, "flash_fwd") == 0)
        failed += check_flash_fwd(ctx, dev, quick, 0);
    if (all || strcmp(family, "wgmma_fwd") == 0)
        failed += check_flash_fwd(ctx, dev, quick, 1);
    if (all || strcmp(family, "fp8") == 0)
        failed += check_fp8(ctx, dev, quick);
    if (all || strcmp(family, "paged") == 0)
        failed += check_paged(ctx, dev, quick);
    if (dump_dir && (all || strcmp(family, "dump") == 0))
        failed += dump_cases(ctx, dev, dump_dir);
    if (all || strcmp(family, "bench") == 0)
        failed += benchmark(ctx, dev, quick);
    if (all || strcmp(family, "startup") == 0)
        failed += startup(dev, specs);
    if (json) {
        fprintf(json, ",\n  \"failed\": %d\n}\n", failed);
        fclose(json);
    }
    if (md)
        fclose(md);
    fwd_cache_clear();
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    printf("\ngpu_check: %s\n", failed ? "FAILED" : "all checks passed");
    return failed ? 1 : 0;
}
