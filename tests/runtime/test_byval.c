/*
 * test_byval.c -- by-value kernel parameters (AJ_PARAM_BYVAL128): the
 * launch plan's list of them, their encoding at each launch, and their
 * bytes reaching the kernel on sim and cpu.
 *
 * A test-only kernel written with the kernel builder takes o (a pointer)
 * and q_desc (params.def: q's view, encoded by AJ_PENC_TENSOR_DESC) and
 * copies q_desc's 128 bytes to o.  Bound by aj_bind_stage from launch
 * values as aj_forward binds, and run through the device's launch, o must
 * hold q's address, dtype, rank, shape and strides; rebinding after q
 * moves must give the new ones (the bytes are made per launch, never
 * kept).  The same kernel for sm_90 must declare the parameter as the
 * driver copies a CUtensorMap: .param .align 64 .b8 NAME[128].  With
 * argument `cuda` (on the stand-in libcuda, tests/fake_cuda) the launch
 * must hand cuLaunchKernel the 128 bytes, q's address first.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kb_kernel.h"
#include "runtime/launch_internal.h"
#include "spec_compile.h"

static aj_ctx *ctx;
static aj_op *any_op;   /* aj_codegen_run only hands it over */

/* Copies the blob to o, eight bytes at a time (on SIMT targets thread 0);
 * user != NULL: leaves the blob unread (the PTX check). */
static aj_status build_copy(aj_kb *kb, const aj_op *unused, void *user)
{
    aj_kb_add_param(kb, "o", AJ_PARAM_PTR, AJ_PID(o));
    aj_kb_add_param(kb, "q_desc", AJ_PARAM_BYVAL128, AJ_PID(q_desc));
    aj_kb_begin(kb, kb->desc->simt ? 32 : 1);
    LLVMValueRef o = aj_param(kb, AJ_PID(o)), desc = aj_param(kb, AJ_PID(q_desc));
    if (kb->desc->simt)
        aj_kb_if_begin(kb, LLVMBuildICmp(kb->b, LLVMIntEQ, aj_kb_thread_id(kb),
                                         aj_kb_i32(kb, 0), ""));
    for (int w = 0; !user && w < AJ_BYVAL_BYTES / 8; w++) {
        LLVMValueRef at = aj_kb_i64(kb, 8 * w);
        LLVMValueRef x = aj_kb_load(kb, kb->t_i64, aj_kb_gptr_offset(kb, desc, at), 8);
        aj_kb_store(kb, x, aj_kb_gptr_offset(kb, o, at), 8);
    }
    if (kb->desc->simt)
        aj_kb_if_end(kb);
    kb_kernel_finish_one_cta(kb);
    return AJ_OK;
}

static aj_kernel *compile_copy(aj_target target, aj_emit emit, void *variant)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    opt.emit = emit;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_codegen_run(ctx, any_op, &opt, "aj_test_byval", build_copy, variant,
                                     &k), AJ_OK);
    return k;
}

/* The bytes AJ_PENC_TENSOR_DESC must give for t. */
static void expected_desc(const aj_tensor *t, unsigned char *out)
{
    aj_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.data = (uint64_t)(uintptr_t)t->data;
    d.dtype = (int32_t)t->dtype;
    d.rank = t->rank;
    for (int i = 0; i < t->rank; i++) {
        d.shape[i] = t->shape[i];
        d.strides[i] = t->strides[i];
    }
    memset(out, 0, AJ_BYVAL_BYTES);
    memcpy(out, &d, sizeof d);
}

/* Binds and runs the copy kernel on dev with q over `q_data`; o gets the
 * blob the kernel received. */
static void launch_copy(aj_device *dev, const aj_kernel *k, void *q_data, unsigned char *o,
                        bound_args *b)
{
    const aj_tensor q = {q_data, AJ_DTYPE_F16, 4, {2, 3, 5, 64}, {960, 320, 64, 1}};
    const aj_tensor ot = {o, AJ_DTYPE_F32, 1, {AJ_BYVAL_BYTES / 4}, {1}};
    launch_values v = {.given = 0};
    put_tensor(&v, AJ_PSRC_q, &q);
    put_tensor(&v, AJ_PSRC_o, &ot);
    memset(o, 0xee, AJ_BYVAL_BYTES);
    CHECK_STATUS(ctx, aj_bind_stage(ctx, dev, k, 0, &v, NULL, b), AJ_OK);
    aj_device_launch l = {
        .kernel = k, .stage = 0, .grid = {1, 1, 1}, .argv = b->argv,
        .buffers = b->buffers, .num_buffers = b->nb, .stream = NULL,
    };
    CHECK_STATUS(ctx, aj_device_launch_stage(ctx, dev, &l), AJ_OK);
    unsigned char want[AJ_BYVAL_BYTES];
    expected_desc(&q, want);
    CHECK_MSG(memcmp(o, want, AJ_BYVAL_BYTES) == 0, "%s: the kernel's blob differs from q's "
              "view", aj_target_name(k->target));
    /* what an embedder gets for the same launch */
    _Alignas(AJ_BYVAL_ALIGN) unsigned char mine[AJ_BYVAL_BYTES];
    CHECK_STATUS(ctx, aj_kernel_encode_param(ctx, dev, k, 0, 1, &q, mine), AJ_OK);
    CHECK(memcmp(mine, want, AJ_BYVAL_BYTES) == 0);
}

static void run_on(aj_device_kind kind, aj_target target)
{
    aj_device *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, kind, 0, &dev), AJ_OK);
    aj_kernel *k = compile_copy(target, AJ_EMIT_LLVM_IR, NULL);
    if (!dev || !k)
        goto done;
    /* the plan's list, as make_plan records it */
    aj_byval_args list;
    CHECK_STATUS(ctx, aj_byval_args_of(ctx, k, &list), AJ_OK);
    CHECK(list.n == 1 && list.arg[0].stage == 0 && list.arg[0].index == 1 &&
          list.arg[0].source == AJ_PSRC_q && list.arg[0].encode);
    CHECK(aj_kernel_byval_args(k) == NULL);   /* built outside aj_compile: no plan */

    static _Alignas(64) uint16_t q1[2 * 3 * 5 * 64], q2[2 * 3 * 5 * 64];
    _Alignas(64) unsigned char o[AJ_BYVAL_BYTES];
    bound_args *b = aligned_alloc(_Alignof(bound_args), sizeof *b);
    launch_copy(dev, k, q1, o, b);
    CHECK(b->argv[1] == (void *)b->blobs[0]);   /* the argument is the blob itself */
    launch_copy(dev, k, q2, o, b);              /* q moved: new bytes */
    free(b);

    /* the embedder's call refuses what is not a by-value parameter */
    const aj_tensor q = {q1, AJ_DTYPE_F16, 1, {8}, {1}};
    CHECK_STATUS(ctx, aj_kernel_encode_param(ctx, dev, k, 0, 0, &q, o), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_kernel_encode_param: parameter 0 of stage 0 ('o') is not passed by "
                "value (AJ_PARAM_BYVAL128)");
    CHECK_STATUS(ctx, aj_kernel_encode_param(ctx, dev, k, 0, 2, &q, o), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_kernel_encode_param: index = 2; stage 0 has parameters 0 .. 1");
    CHECK_STATUS(ctx, aj_kernel_encode_param(ctx, dev, k, 0, 1, &q, o + 8), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "is not 64-byte aligned");
    CHECK_STATUS(ctx, aj_kernel_encode_param(ctx, dev, k, 1, 1, &q, o), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_kernel_encode_param: stage = 1; kernel aj_test_byval has stages 0 .. 0");
done:
    aj_kernel_destroy(k);
    aj_device_close(dev);
}

/* sm_90: the parameter as the driver copies a CUtensorMap. */
static void check_ptx(void)
{
    aj_kernel *k = compile_copy(AJ_TARGET_SM_90, AJ_EMIT_PTX, (void *)1);
    if (!k)
        return;
    size_t len;
    const char *ptx = aj_kernel_code(k, &len);
    CHECK_MSG(strstr(ptx, ".param .align 64 .b8 aj_test_byval_param_1[128]") != NULL,
              "the PTX lacks the by-value parameter:\n%s", ptx);
    aj_kernel_destroy(k);
}

/* A compiled kernel's plan lists its by-value arguments: none today. */
static void check_plan(void)
{
    const char *text = "attention forward flash {\n dtype = f16\n head_dim = 64\n}";
    aj_kernel *k = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_SM_80;
    CHECK_STATUS(ctx, spec_compile(ctx, text, "t", &opt, &k), AJ_OK);
    const aj_byval_args *list = k ? aj_kernel_byval_args(k) : NULL;
    CHECK(list && list->n == 0);
    aj_kernel_destroy(k);
}

/* On the stand-in libcuda: cuLaunchKernel gets the blob's bytes (its log
 * shows the first two words: q's address, then dtype and rank). */
static void run_cuda(void)
{
    aj_device *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev), AJ_OK);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    const char *(*cuda_log)(void) = NULL;
    if (h)
        *(void **)&cuda_log = dlsym(h, "fake_cuda_log");
    CHECK_MSG(dev && cuda_log, "no stand-in libcuda (tests/fake_cuda): %s", aj_last_error(ctx));
    aj_kernel *k = dev ? compile_copy(aj_device_target(dev), AJ_EMIT_PTX, (void *)1) : NULL;
    void *q = NULL, *o = NULL;
    if (!k || !cuda_log)
        goto done;
    CHECK_STATUS(ctx, aj_device_alloc(dev, 2 * 3 * 5 * 64 * 2, &q), AJ_OK);
    CHECK_STATUS(ctx, aj_device_alloc(dev, AJ_BYVAL_BYTES, &o), AJ_OK);
    const aj_tensor qt = {q, AJ_DTYPE_F16, 4, {2, 3, 5, 64}, {960, 320, 64, 1}};
    const aj_tensor ot = {o, AJ_DTYPE_F32, 1, {AJ_BYVAL_BYTES / 4}, {1}};
    launch_values v = {.given = 0};
    put_tensor(&v, AJ_PSRC_q, &qt);
    put_tensor(&v, AJ_PSRC_o, &ot);
    bound_args *b = aligned_alloc(_Alignof(bound_args), sizeof *b);
    CHECK_STATUS(ctx, aj_bind_stage(ctx, dev, k, 0, &v, NULL, b), AJ_OK);
    aj_device_launch l = {
        .kernel = k, .stage = 0, .grid = {1, 1, 1}, .argv = b->argv,
        .buffers = b->buffers, .num_buffers = b->nb, .stream = NULL,
    };
    CHECK_STATUS(ctx, aj_device_launch_stage(ctx, dev, &l), AJ_OK);
    CHECK_STATUS(ctx, aj_device_synchronize(dev, NULL), AJ_OK);
    free(b);
    char want[160];
    snprintf(want, sizeof want, "ByValue fn=aj_test_byval param=1 bytes=128 head=0x%llx,0x%llx",
             (unsigned long long)(uintptr_t)q,
             (unsigned long long)((uint64_t)4 << 32 | (uint64_t)AJ_DTYPE_F16));
    CHECK_MSG(strstr(cuda_log(), want) != NULL, "the driver log lacks \"%s\":\n%s", want,
              cuda_log());
done:
    if (q)
        aj_device_free(dev, q);
    if (o)
        aj_device_free(dev, o);
    aj_kernel_destroy(k);
    aj_device_close(dev);
}

/*
 * The wgmma flash forward on the stand-in (a 9.0 GPU): aj_forward encodes
 * Q's, K's and V's tensor maps through cuTensorMapEncodeTiled -- 4 dims
 * (D, S, H, B) with byte strides, boxes of one 128-byte panel by block_m
 * or block_n rows, 128-byte swizzle -- and hands their 128 bytes to
 * cuLaunchKernel; with K and V as expanded views (batch stride 0) it
 * encodes none and passes zeros (tma = 0: the kernel's cp.async loads).
 */
static void run_cuda_tma(void)
{
    enum { B = 2, H = 2, S = 96, D = 128 };
    aj_device *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev), AJ_OK);
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    const char *(*cuda_log)(void) = NULL;
    void (*cuda_log_clear)(void) = NULL;
    if (h) {
        *(void **)&cuda_log = dlsym(h, "fake_cuda_log");
        *(void **)&cuda_log_clear = dlsym(h, "fake_cuda_log_clear");
    }
    static const char spec[] = "attention forward flash { dtype = bf16 head_dim = 128 "
                               "mask = causal(bottom_right) schedule = (warpgroups = 2) }";
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.device = dev;
    aj_kernel *k = NULL;
    if (dev)
        CHECK_STATUS(ctx, spec_compile(ctx, spec, "tma.aj", &opt, &k), AJ_OK);
    void *mem[5] = {NULL};
    const size_t bytes = (size_t)B * H * S * D * 2;
    for (int i = 0; k && i < 5; i++)
        CHECK_STATUS(ctx, aj_device_alloc(dev, bytes, &mem[i]), AJ_OK);
    if (!k || !cuda_log || !cuda_log_clear || !mem[4])
        goto done;
    CHECK(aj_kernel_target(k) == AJ_TARGET_SM_90A);
    aj_launch_info info;
    CHECK_STATUS(ctx, aj_kernel_launch_info(k, &info), AJ_OK);
    for (int pass = 0; pass < 2; pass++) {
        int64_t kb = pass ? 0 : (int64_t)H * S * D;
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.q = (aj_tensor){mem[0], AJ_DTYPE_BF16, 4, {B, H, S, D}, {H * S * D, S * D, D, 1}};
        a.k = (aj_tensor){mem[1], AJ_DTYPE_BF16, 4, {B, H, S, D}, {kb, S * D, D, 1}};
        a.v = (aj_tensor){mem[2], AJ_DTYPE_BF16, 4, {B, H, S, D}, {kb, S * D, D, 1}};
        a.o = (aj_tensor){mem[3], AJ_DTYPE_BF16, 4, {B, H, S, D}, {H * S * D, S * D, D, 1}};
        a.lse = (aj_tensor){mem[4], AJ_DTYPE_F32, 3, {B, H, S, 0}, {H * S, S, 1, 0}};
        cuda_log_clear();
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
        CHECK_STATUS(ctx, aj_device_synchronize(dev, NULL), AJ_OK);
        const char *log = cuda_log();
        char want[3][200];
        snprintf(want[0], sizeof want[0], "TensorMapEncodeTiled type=9 rank=4 dims=%d,%d,%d,%d "
                 "strides=%d,%d,%d box=64,%d,1,1 swizzle=3", D, S, H, B, 2 * D, 2 * S * D,
                 2 * H * S * D, (int)info.schedule.block_m);
        snprintf(want[1], sizeof want[1], "TensorMapEncodeTiled type=9 rank=4 dims=%d,%d,%d,%d "
                 "strides=%d,%d,%d box=64,%d,1,1 swizzle=3", D, S, H, B, 2 * D, 2 * S * D,
                 2 * H * S * D, (int)info.schedule.block_n);
        snprintf(want[2], sizeof want[2], "ByValue fn=%s param=", aj_kernel_entry(k));
        if (pass == 0) {
            CHECK_MSG(strstr(log, want[0]) && strstr(log, want[1]), "the driver log lacks the "
                      "tensor maps:\n%s\nwant:\n%s\n%s", log, want[0], want[1]);
            char head[64];
            snprintf(head, sizeof head, "bytes=128 head=0x%llx,",
                     (unsigned long long)(uintptr_t)mem[0]);
            CHECK_MSG(strstr(log, head), "cuLaunchKernel was not handed Q's map:\n%s", log);
        } else {
            CHECK_MSG(!strstr(log, "TensorMapEncodeTiled"), "an expanded K encoded a map:\n%s",
                      log);
            CHECK_MSG(strstr(log, "bytes=128 head=0x0,0x0"), "the unused maps are not zeros:\n%s",
                      log);
        }
        CHECK_MSG(strstr(log, want[2]) != NULL, "no by-value parameter launched:\n%s", log);
    }
done:
    for (int i = 0; i < 5; i++)
        if (mem[i])
            aj_device_free(dev, mem[i]);
    aj_kernel_destroy(k);
    aj_device_close(dev);
}

int main(int argc, char **argv)
{
    CHECK_STATUS(ctx, aj_ctx_create(NULL, &ctx), AJ_OK);
    const char *text = "attention forward flash {\n dtype = f16\n head_dim = 64\n}";
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "t", &any_op), AJ_OK);
    if (argc > 1 && strcmp(argv[1], "cuda") == 0) {
        run_cuda();
        run_cuda_tma();
    } else {
        run_on(AJ_DEVICE_SIM, AJ_TARGET_SIM);
        run_on(AJ_DEVICE_CPU, AJ_TARGET_CPU);
        check_ptx();
        check_plan();
    }
    aj_op_destroy(any_op);
    aj_ctx_destroy(ctx);
    return check_report();
}
