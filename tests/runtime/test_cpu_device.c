/*
 * test_cpu_device.c -- the cpu device and target's API: opening, naming,
 * thread counts, and every error a caller can provoke (status and
 * message); and that a launch gives the same bits on 1, 2 or 3 threads
 * (each work item is computed whole by one thread, so the split cannot
 * change a result), launched from a thread with room on its stack (which
 * then runs items itself) or without; the pool's caller rule; a stage's
 * stack_bytes; launches in a child forked after one.  About 3 s.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "forked.h"
#include "codegen/codegen.h"
#include "runtime/cpu/pool.h"
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
    /* no OpenMP runtime in this process (test_cpu_omp has one) */
    CHECK(aj_device_cpu_threads(dev) == AJ_CPU_THREADS_POOL);
    CHECK_STATUS(ctx, aj_device_set_cpu_threads(dev, AJ_CPU_THREADS_OPENMP), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "needs an OpenMP runtime loaded in the process");
    CHECK(aj_device_cpu_threads(dev) == AJ_CPU_THREADS_POOL);
    CHECK_STATUS(ctx, aj_device_set_cpu_threads(dev, (aj_cpu_threads)7), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "7 is not an aj_cpu_threads");
    CHECK_STATUS(ctx, aj_device_set_cpu_threads(dev, AJ_CPU_THREADS_POOL), AJ_OK);
    CHECK(aj_device_cpu_threads(NULL) == AJ_CPU_THREADS_POOL);
    printf("cpu device: %s, %d threads by default\n", aj_device_name(dev),
           (aj_device_set_workers(dev, 0), aj_device_workers(dev)));
    aj_device_close(dev);
    CHECK(aj_device_workers(NULL) == 0);
}

/* A call made from a thread with a 256 KB stack: less than any kernel's
 * items need beside the pool's margin, so they run on workers only. */
typedef struct small_stack_call {
    aj_device *dev;
    aj_kernel *k;
    const aj_fwd_args *args;
    aj_status st;
} small_stack_call;

static void *forward_on(void *arg)
{
    small_stack_call *c = arg;
    c->st = aj_forward(ctx, c->dev, c->k, c->args);
    return NULL;
}

static bool on_small_stack(void *(*fn)(void *), void *arg)
{
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, (size_t)256 << 10);
    bool ok = pthread_create(&t, &attr, fn, arg) == 0 && pthread_join(t, NULL) == 0;
    pthread_attr_destroy(&attr);
    return ok;
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
    CHECK_STATUS(ctx, aj_device_set_cpu_threads(sim, AJ_CPU_THREADS_POOL), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "a sim device's launches do not run on host threads of its own choosing");
    CHECK(aj_device_cpu_threads(sim) == AJ_CPU_THREADS_POOL);
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
    uint16_t *q = malloc(nq * 2), *kv = malloc(nk * 2), *o[4];
    float *lse[4];
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
    /* 1, 2, 3 threads from this thread (which runs items: its stack has
     * room), then 2 from a thread whose small stack has none */
    for (int t = 0; t < 4; t++) {
        o[t] = calloc(nq, 2);
        lse[t] = calloc((size_t)B * HQ * S, 4);
        a.o = a.q;
        a.o.data = o[t];
        a.lse = (aj_tensor){lse[t], AJ_DTYPE_F32, 3, {B, HQ, S, 0}, {HQ * S, S, 1, 0}};
        CHECK_STATUS(ctx, aj_device_set_workers(dev, t < 3 ? t + 1 : 2), AJ_OK);
        if (t < 3) {
            CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
        } else {
            small_stack_call call = {dev, k, &a, AJ_ERR_INTERNAL};
            CHECK(on_small_stack(forward_on, &call));
            CHECK_STATUS(ctx, call.st, AJ_OK);
        }
    }
    for (int t = 1; t < 4; t++) {
        CHECK_MSG(memcmp(o[0], o[t], nq * 2) == 0, "O from %d threads%s differs from 1",
                  t < 3 ? t + 1 : 2, t < 3 ? "" : " (small-stack caller)");
        CHECK_MSG(memcmp(lse[0], lse[t], (size_t)B * HQ * S * 4) == 0,
                  "LSE from %d threads%s differs from 1", t < 3 ? t + 1 : 2,
                  t < 3 ? "" : " (small-stack caller)");
    }
    for (int t = 0; t < 4; t++) {
        free(o[t]);
        free(lse[t]);
    }
    free(q);
    free(kv);
    aj_device_close(dev);
    aj_kernel_destroy(k);
}

/* The forked child's launch of test_fork; its check: the parent's bits */
typedef struct fork_call {
    aj_device *dev;
    const aj_kernel *k;
    const aj_fwd_args *args;
    const void *o, *lse;   /* the parent's outputs */
    size_t o_bytes, lse_bytes;
} fork_call;

static int child_launch(void *arg)
{
    const fork_call *c = arg;
    int same = aj_forward(ctx, c->dev, c->k, c->args) == AJ_OK &&
               memcmp(c->o, c->args->o.data, c->o_bytes) == 0 &&
               memcmp(c->lse, c->args->lse.data, c->lse_bytes) == 0;
    aj_device_close(c->dev);   /* drops the parent's pool, joins its own */
    return same;
}

/* A process that launched, then forked (a pre-forking server warms its
 * kernels first): the child's launches start a pool of its own (the
 * parent's workers are not in it) and give the parent's bits; the
 * parent's pool still runs.  A child that hangs is killed by its alarm
 * (before the fix, every child hung). */
static void test_fork(void)
{
    /* long enough a launch (> 1 ms) that its caller leaves every item to
     * the pool's workers */
    enum { S = 1024, D = 32 };
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, compile("attention forward flash { dtype = f32 head_dim = 32 "
                              "mask = causal(top_left) }", AJ_TARGET_CPU, AJ_EMIT_LLVM_IR, &k),
                 AJ_OK);
    aj_device *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev), AJ_OK);
    if (!k || !dev)
        return;
    static float q[2 * S * D], o[2][2 * S * D], lse[2][2 * S];
    for (int i = 0; i < 2 * S * D; i++)
        q[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = (aj_tensor){q, AJ_DTYPE_F32, 4, {1, 2, S, D}, {2 * S * D, S * D, D, 1}};
    a.k = a.v = a.q;
    CHECK_STATUS(ctx, aj_device_set_workers(dev, 2), AJ_OK);
    for (int t = 0; t < 2; t++) {   /* the parent's launch, then the child's */
        a.o = a.q;
        a.o.data = o[t];
        a.lse = (aj_tensor){lse[t], AJ_DTYPE_F32, 3, {1, 2, S, 0}, {2 * S, S, 1, 0}};
        if (t == 0) {
            /* twice: the first starts the workers, the second finds them
             * started (in_forked_child lets them settle) */
            CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
            CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
            continue;
        }
        fork_call call = {dev, k, &a, o[0], lse[0], sizeof o[0], sizeof lse[0]};
        const char *why = in_forked_child(child_launch, &call, 60);
        CHECK_MSG(!*why, "the forked child's launch %s", why);
    }
    CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);   /* the parent's pool */
    CHECK(memcmp(o[0], o[1], sizeof o[0]) == 0);
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

/* The pool's caller rule (aj_cpu_pool_run): which thread ran each item. */
typedef struct pool_probe {
    pthread_t caller;
    atomic_int on_caller, on_workers, runs[64];
    int meet;   /* an item waits (up to 5 s) until the other side has run one */
} pool_probe;

static void probe_item(void *arg, int64_t i)
{
    pool_probe *p = arg;
    bool mine = pthread_equal(pthread_self(), p->caller);
    atomic_fetch_add(mine ? &p->on_caller : &p->on_workers, 1);
    atomic_fetch_add(&p->runs[i], 1);
    /* however late the scheduler runs a woken worker, both sides run one */
    for (int k = 0; p->meet && k < 50000 && !atomic_load(mine ? &p->on_workers : &p->on_caller);
         k++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

/* Runs 64 items (meet: see pool_probe); how many ran on this thread (-1
 * if an item did not run exactly once). */
static int probe(aj_cpu_pool *pool, int width, int64_t item_stack, int meet)
{
    pool_probe p = {.caller = pthread_self(), .meet = meet};
    aj_cpu_pool_run(pool, width, 64, item_stack, probe_item, &p);
    for (int i = 0; i < 64; i++)
        if (atomic_load(&p.runs[i]) != 1)
            return -1;
    return atomic_load(&p.on_caller);
}

typedef struct probe_call {
    aj_cpu_pool *pool;
    int on_caller;
} probe_call;

static void *probe_small_stack(void *arg)
{
    probe_call *c = arg;
    c->on_caller = probe(c->pool, 0, 0, 0);
    return NULL;
}

static void test_pool_caller(void)
{
    aj_cpu_pool *pool = NULL;
    CHECK(aj_cpu_pool_create(ctx, 2, &pool) == AJ_OK);
    if (!pool)
        return;
    /* one thread: the caller alone; never: the workers alone */
    CHECK_MSG(probe(pool, 1, 0, 0) == 64, "width 1: the caller runs every item");
    CHECK_MSG(probe(pool, 1, (int64_t)1 << 12, 0) == 64, "a small item_stack fits");
    CHECK_MSG(probe(pool, 0, -1, 0) == 0, "item_stack < 0: the caller runs none");
    CHECK_MSG(probe(pool, 0, (int64_t)1 << 40, 0) == 0, "items too big for the caller's stack");
    /* the caller and the workers share a batch */
    int mine = probe(pool, 3, 0, 1);
    CHECK_MSG(mine > 0 && mine < 64, "width 3: the caller ran %d of 64 items", mine);
    /* a thread whose stack is under the margin only waits */
    probe_call c = {pool, -2};
    CHECK(on_small_stack(probe_small_stack, &c));
    CHECK_MSG(c.on_caller == 0, "a 256 KB stack's thread ran %d items itself", c.on_caller);
    aj_cpu_pool_destroy(pool);
}

/* A cpu stage's stack_bytes: its items' buffers, growing with the head
 * dim and the blocks, and kept by the kernel's bytes (format 10). */
static void test_stack_bytes(void)
{
    aj_kernel *small = NULL, *big = NULL, *back = NULL;
    CHECK_STATUS(ctx, compile("attention forward flash { dtype = f32 head_dim = 64 "
                              "schedule = (block_m = 32, block_n = 32) }", AJ_TARGET_CPU,
                              AJ_EMIT_LLVM_IR, &small), AJ_OK);
    CHECK_STATUS(ctx, compile("attention forward flash { dtype = f32 head_dim = 512 "
                              "schedule = (block_m = 256, block_n = 256) }", AJ_TARGET_CPU,
                              AJ_EMIT_LLVM_IR, &big), AJ_OK);
    if (!small || !big)
        return;
    /* Q, Kt, V, S, O: 32 x 64 + 64 x 32 + 32 x 64 + 32 x 32 + 32 x 64 floats */
    int64_t want_small = 4 * (32 * 64 * 4 + 32 * 32);
    int64_t s = small->stages[0].stack_bytes, b = big->stages[0].stack_bytes;
    CHECK_MSG(s >= want_small && s < want_small + 4096, "d 64, 32 x 32: stack_bytes %lld, "
              "want %lld and a little", (long long)s, (long long)want_small);
    CHECK_MSG(b > (int64_t)2 << 20 && b < (int64_t)3 << 20,
              "d 512, 256 x 256: stack_bytes %lld, want 2-3 MB", (long long)b);
    uint8_t *bytes = NULL;
    size_t n = 0;
    CHECK_STATUS(ctx, aj_kernel_serialize(ctx, big, &bytes, &n), AJ_OK);
    CHECK_STATUS(ctx, aj_kernel_deserialize(ctx, bytes, n, &back), AJ_OK);
    CHECK(back && back->stages[0].stack_bytes == b);
    free(bytes);
    aj_kernel_destroy(back);
    aj_kernel_destroy(small);
    aj_kernel_destroy(big);
}

int main(void)
{
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    test_open();
    test_unsupported();
    test_wrong_device();
    test_threads_same_bits();
    test_fork();
    test_scratch();
    test_pool_caller();
    test_stack_bytes();
    aj_ctx_destroy(ctx);
    return check_report();
}
