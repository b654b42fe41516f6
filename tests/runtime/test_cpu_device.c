/*
 * test_cpu_device.c -- the cpu device and target's API: opening, naming,
 * thread counts, and every error a caller can provoke (status and
 * message); and that a launch gives the same bits on 1, 2 or 3 threads
 * (each work item is computed whole by one thread, so the split cannot
 * change a result).  About 2 s.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime/runtime.h"

static aj_ctx *ctx;

static aj_op *parse(const char *text)
{
    aj_op *op = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "spec", &op), AJ_OK);
    return op;
}

static aj_status compile(const char *text, aj_target target, aj_emit emit, aj_kernel **out)
{
    aj_op *op = parse(text);
    if (!op)
        return AJ_ERR_PARSE;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    opt.emit = emit;
    aj_status st = aj_compile(ctx, op, &opt, out);
    aj_op_destroy(op);
    return st;
}

static void test_open(void)
{
    aj_device *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CPU, 1, &dev), AJ_ERR_NO_DEVICE);
    CHECK_ERROR(ctx, "the cpu device has index 0 only");
    CHECK(dev == NULL);
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CPU, -1, &dev), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "index = -1 is negative");
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev), AJ_OK);
    if (!dev)
        return;
    CHECK(aj_device_target(dev) == AJ_TARGET_CPU);
    CHECK(strlen(aj_device_name(dev)) > 0 && strcmp(aj_device_name(dev), "sim") != 0);
    CHECK(aj_device_workers(dev) >= 1);
    CHECK_STATUS(ctx, aj_device_set_workers(dev, 3), AJ_OK);
    CHECK(aj_device_workers(dev) == 3);
    CHECK_STATUS(ctx, aj_device_set_workers(dev, -2), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "workers = -2 is negative");
    void *p = NULL;
    CHECK_STATUS(ctx, aj_device_alloc(dev, 100, &p), AJ_OK);
    CHECK(p && (uintptr_t)p % 64 == 0);
    CHECK_STATUS(ctx, aj_device_free(dev, p), AJ_OK);
    printf("cpu device: %s, %d threads by default\n", aj_device_name(dev),
           (aj_device_set_workers(dev, 0), aj_device_workers(dev)));
    aj_device_close(dev);
    CHECK(aj_device_workers(NULL) == 0);
}

/* Ops the cpu target does not implement, or implements with limits. */
static void test_unsupported(void)
{
    static const struct {
        const char *text;
        aj_emit emit;
        aj_status want;
        const char *needle;
    } cases[] = {
        {"attention forward flash { dtype = f16 head_dim = 64 }", AJ_EMIT_PTX,
         AJ_ERR_UNSUPPORTED, "emit ptx needs a GPU target; cpu kernels emit LLVM IR"},
        {"attention forward efficient { dtype = f16 head_dim = 64 layout = varlen bias = add }",
         AJ_EMIT_LLVM_IR, AJ_ERR_UNSUPPORTED,
         "bias = add with layout = varlen: cpu forward supports a bias on layout = padded only"},
        {"attention backward efficient { dtype = f32 head_dim = 32 layout = varlen bias = add }",
         AJ_EMIT_LLVM_IR, AJ_ERR_UNSUPPORTED,
         "bias = add with layout = varlen: cpu backward supports a bias on layout = padded"},
        {"attention forward flash { dtype = f16 head_dim = 100 }", AJ_EMIT_LLVM_IR,
         AJ_ERR_UNSUPPORTED, "head_dim = 100: cpu forward supports multiples of 8"},
        {"attention forward flash { dtype = f16 head_dim = 64 schedule = (warps = 4) }",
         AJ_EMIT_LLVM_IR, AJ_ERR_UNSUPPORTED, "schedule warps = 4: the cpu target has no warps"},
        {"attention forward flash { dtype = f16 head_dim = 64 schedule = (stages = 2) }",
         AJ_EMIT_LLVM_IR, AJ_ERR_UNSUPPORTED, "schedule stages = 2: the cpu target"},
        {"attention merge { dtype = f32 head_dim_v = 100 }", AJ_EMIT_LLVM_IR,
         AJ_ERR_UNSUPPORTED, "head_dim_v = 100: the cpu merge supports multiples of 8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        aj_kernel *k = NULL;
        aj_status st = compile(cases[i].text, AJ_TARGET_CPU, cases[i].emit, &k);
        CHECK_MSG(st == cases[i].want, "case %zu: %s (%s)", i, aj_status_str(st),
                  aj_last_error(ctx));
        CHECK_ERROR(ctx, cases[i].needle);
        aj_kernel_destroy(k);
    }
}

/* A kernel runs only on a device of its target. */
static void test_wrong_device(void)
{
    const char *spec = "attention forward efficient { dtype = f32 head_dim = 8 }";
    aj_kernel *cpu_k = NULL, *sim_k = NULL;
    aj_device *cpu = NULL, *sim = NULL;
    CHECK_STATUS(ctx, compile(spec, AJ_TARGET_CPU, AJ_EMIT_LLVM_IR, &cpu_k), AJ_OK);
    CHECK_STATUS(ctx, compile(spec, AJ_TARGET_SIM, AJ_EMIT_LLVM_IR, &sim_k), AJ_OK);
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CPU, 0, &cpu), AJ_OK);
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_SIM, 0, &sim), AJ_OK);
    float q[8] = {0}, o[8], lse[1];
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = (aj_tensor){q, AJ_DTYPE_F32, 4, {1, 1, 1, 8}, {8, 8, 8, 1}};
    a.k = a.v = a.q;
    a.o = (aj_tensor){o, AJ_DTYPE_F32, 4, {1, 1, 1, 8}, {8, 8, 8, 1}};
    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {1, 1, 1, 0}, {1, 1, 1, 0}};
    CHECK_STATUS(ctx, aj_forward(ctx, cpu, sim_k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "kernel compiled for sim cannot run on a cpu device");
    CHECK_STATUS(ctx, aj_forward(ctx, sim, cpu_k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "kernel compiled for cpu cannot run on a sim device");
    /* the same arguments are checked as on every device */
    a.k.shape[3] = 16;
    CHECK_STATUS(ctx, aj_forward(ctx, cpu, cpu_k, &a), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "k.shape[3] = 16, want 8");
    a.k.shape[3] = 8;
    CHECK_STATUS(ctx, aj_forward(ctx, cpu, cpu_k, &a), AJ_OK);
    CHECK(lse[0] == 0.0f);   /* one key of score 0: LSE = log 1 */
    /* the LLVM IR asked for comes with the JIT-compiled code */
    size_t size = 0;
    CHECK(aj_kernel_code(cpu_k, &size) != NULL && size > 0);
    aj_device_close(cpu);
    aj_device_close(sim);
    aj_kernel_destroy(cpu_k);
    aj_kernel_destroy(sim_k);
}

/* The same bits from 1, 2 and 3 threads, over a causal GQA problem whose
 * work items differ in size. */
static void test_threads_same_bits(void)
{
    enum { B = 2, HQ = 4, HKV = 2, S = 301, D = 64 };
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, compile("attention forward flash { dtype = bf16 head_dim = 64 "
                              "mask = causal(bottom_right) }", AJ_TARGET_CPU, AJ_EMIT_LLVM_IR,
                              &k), AJ_OK);
    aj_device *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev), AJ_OK);
    if (!k || !dev)
        return;
    size_t nq = (size_t)B * HQ * S * D, nk = (size_t)B * HKV * S * D;
    uint16_t *q = malloc(nq * 2), *kv = malloc(nk * 2), *o[3];
    float *lse[3];
    uint64_t rng = 5;
    for (size_t i = 0; i < nq; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        float x = (float)((double)(rng >> 40) / (double)(1 << 24) * 4 - 2);
        aj_convert(&x, AJ_DTYPE_F32, &q[i], AJ_DTYPE_BF16, 1);
        if (i < nk)
            kv[i] = q[i] ^ 0x0101;
    }
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = (aj_tensor){q, AJ_DTYPE_BF16, 4, {B, HQ, S, D}, {HQ * S * D, S * D, D, 1}};
    a.k = (aj_tensor){kv, AJ_DTYPE_BF16, 4, {B, HKV, S, D}, {HKV * S * D, S * D, D, 1}};
    a.v = a.k;
    for (int t = 0; t < 3; t++) {
        o[t] = calloc(nq, 2);
        lse[t] = calloc((size_t)B * HQ * S, 4);
        a.o = a.q;
        a.o.data = o[t];
        a.lse = (aj_tensor){lse[t], AJ_DTYPE_F32, 3, {B, HQ, S, 0}, {HQ * S, S, 1, 0}};
        CHECK_STATUS(ctx, aj_device_set_workers(dev, t + 1), AJ_OK);
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
    }
    for (int t = 1; t < 3; t++) {
        CHECK_MSG(memcmp(o[0], o[t], nq * 2) == 0, "O from %d threads differs from 1", t + 1);
        CHECK_MSG(memcmp(lse[0], lse[t], (size_t)B * HQ * S * 4) == 0,
                  "LSE from %d threads differs from 1", t + 1);
    }
    for (int t = 0; t < 3; t++) {
        free(o[t]);
        free(lse[t]);
    }
    free(q);
    free(kv);
    aj_device_close(dev);
    aj_kernel_destroy(k);
}

/* The cpu device's scratch (aj_cpu_scratch): kept between calls (the
 * same block again, nothing made), grown where a call needs more, 64-byte
 * aligned; a call that finds it held gets a block of its own. */
static void test_scratch(void)
{
    aj_device *d = NULL;
    CHECK(aj_device_open(ctx, AJ_DEVICE_CPU, 0, &d) == AJ_OK);
    void *a = NULL, *b = NULL, *c = NULL, *e = NULL;
    CHECK(aj_device_scratch(d, NULL, 100000, &a) == AJ_OK && a && (uintptr_t)a % 64 == 0);
    memset(a, 1, 100000);
    aj_device_scratch_release(d, NULL, a);
    CHECK(aj_device_scratch(d, NULL, 50000, &b) == AJ_OK && b == a);
    CHECK(aj_device_scratch(d, NULL, 1000, &c) == AJ_OK && c && c != b && (uintptr_t)c % 64 == 0);
    memset(c, 2, 1000);
    aj_device_scratch_release(d, NULL, c);
    aj_device_scratch_release(d, NULL, b);
    CHECK(aj_device_scratch(d, NULL, (size_t)1 << 22, &e) == AJ_OK && e && (uintptr_t)e % 64 == 0);
    memset(e, 3, (size_t)1 << 22);
    aj_device_scratch_release(d, NULL, e);
    void *again = NULL;
    CHECK(aj_device_scratch(d, NULL, 100, &again) == AJ_OK && again == e);
    aj_device_scratch_release(d, NULL, again);
    aj_device_close(d);
}

int main(void)
{
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    test_open();
    test_unsupported();
    test_wrong_device();
    test_threads_same_bits();
    test_scratch();
    aj_ctx_destroy(ctx);
    return check_report();
}
