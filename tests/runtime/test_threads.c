/*
 * test_threads.c -- many threads compiling and launching at once.
 *
 * Threads share what a server or a training job shares: one context (its
 * kernel cache) and one device (the cpu's thread pool, the sim's CTA
 * runners), or each has its own.  Every thread compiles its ops (the same
 * op as other threads, at the same moment, released by a barrier), then
 * launches forwards of varying shapes and checks each against the float64
 * reference.  Checks: every result matches; the shared cache compiled each
 * distinct op exactly once (misses == distinct ops), however many threads
 * asked for it at once; a fault a kernel records reaches its own launch
 * and no other, on the launch's own context (varlen_faults); the cpu
 * device's scratch is held by one thread at a time (scratch_threads);
 * nothing hangs (ctest's timeout would say so).
 *
 *   test_threads [cpu|sim]    (both when no argument)
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ref.h"
#include "runtime/runtime.h"
#include "sim_harness.h"

enum { MAX_THREADS = 16, NUM_SPECS = 3 };

/* What the threads compile: thread t takes spec t % NUM_SPECS. */
static const char *const specs[NUM_SPECS] = {
    "attention forward efficient { dtype = f32  head_dim = 32  mask = causal(top_left) }",
    "attention forward efficient { dtype = f32  head_dim = 64  head_dim_v = 32 "
    " mask = window(20, 4) }",
    "attention forward efficient { dtype = f32  head_dim = 16  score_mod = softcap(5.0) }",
};
static const aj_mask_kind spec_mask[NUM_SPECS] = {AJ_MASK_CAUSAL, AJ_MASK_WINDOW,
                                                  AJ_MASK_NONE};
static const int spec_d[NUM_SPECS][2] = {{32, 32}, {64, 32}, {16, 16}};

typedef struct run_setup {
    aj_device_kind kind;
    int threads, launches;
    int shared_ctx;            /* one context and device for all threads */
    int max_seq;               /* shapes drawn with S in [1, max_seq] */
    aj_ctx *ctx;               /* shared_ctx: the context ... */
    aj_device *dev;            /* ... and the device */
    pthread_barrier_t start;   /* every thread compiles at the same moment */
} run_setup;

typedef struct thread_result {
    int launches, mismatches, failures;
    double worst;              /* max |err| / (atol + rtol |ref|), sim_harness's f32 pair */
    char first_failure[256];
} thread_result;

typedef struct thread_arg {
    run_setup *setup;
    int index;
    thread_result result;
} thread_arg;

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float uniform(uint64_t *s)
{
    return (float)((double)(next_random(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static aj_tensor bhsd(float *data, int64_t b, int64_t h, int64_t s, int64_t d)
{
    return (aj_tensor){data, AJ_DTYPE_F32, 4, {b, h, s, d}, {h * s * d, s * d, d, 1}};
}

static void fail_with(thread_result *r, aj_ctx *ctx, const char *what)
{
    if (!r->failures++)
        snprintf(r->first_failure, sizeof r->first_failure, "%s: %s", what,
                 aj_last_error(ctx));
}

/* One forward of spec `s` at a random shape, against the reference. */
static void launch_and_check(aj_ctx *ctx, aj_device *dev, aj_kernel *kernel, int s,
                             uint64_t *rng, thread_result *r)
{
    const int b = 1 + (int)(next_random(rng) % 2), hkv = 1 + (int)(next_random(rng) % 2);
    const int hq = hkv * (1 + (int)(next_random(rng) % 2));
    const int sq = 1 + (int)(next_random(rng) % 48), sk = 1 + (int)(next_random(rng) % 48);
    const int d = spec_d[s][0], dv = spec_d[s][1];
    const size_t nq = (size_t)b * hq * sq * d, nk = (size_t)b * hkv * sk * d;
    const size_t nv = (size_t)b * hkv * sk * dv, no = (size_t)b * hq * sq * dv;
    const size_t nl = (size_t)b * hq * sq;
    float *f = malloc((nq + nk + nv + no + nl) * sizeof *f);
    double *dd = malloc((nq + nk + nv + no + nl) * sizeof *dd);
    if (!f || !dd) {
        free(f);
        free(dd);
        r->failures++;
        return;
    }
    float *q = f, *k = q + nq, *v = k + nk, *o = v + nv, *lse = o + no;
    double *dq = dd, *dk = dq + nq, *dv_ = dk + nk, *ro = dv_ + nv, *rl = ro + no;
    for (size_t i = 0; i < nq + nk + nv; i++) {
        f[i] = uniform(rng);
        dd[i] = f[i];
    }
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = bhsd(q, b, hq, sq, d);
    a.k = bhsd(k, b, hkv, sk, d);
    a.v = bhsd(v, b, hkv, sk, dv);
    a.o = bhsd(o, b, hq, sq, dv);
    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {b, hq, sq}, {(int64_t)hq * sq, sq, 1}};
    r->launches++;
    if (aj_forward(ctx, dev, kernel, &a) != AJ_OK) {
        fail_with(r, ctx, "aj_forward");
        goto done;
    }
    ref_problem p = {.B = b, .Hq = hq, .Hkv = hkv, .D = d, .Dv = dv, .Sq = sq, .Sk = sk,
                     .mask = spec_mask[s], .align = AJ_ALIGN_TOP_LEFT,
                     .window_left = 20, .window_right = 4, .softcap = s == 2 ? 5.0 : 0};
    ref_forward(&p, dq, dk, dv_, ro, rl);
    const fwd_tolerance tol = fwd_tolerance_for(AJ_DTYPE_F32);
    double worst = 0;
    for (size_t i = 0; i < no; i++)
        worst = fmax(worst, fabs(o[i] - ro[i]) / (tol.o_atol + tol.o_rtol * fabs(ro[i])));
    for (size_t i = 0; i < nl; i++) {
        if (isinf(rl[i]))
            worst = fmax(worst, lse[i] == rl[i] ? 0 : INFINITY);
        else
            worst = fmax(worst, fabs(lse[i] - rl[i]) / (tol.lse_atol + tol.lse_rtol * fabs(rl[i])));
    }
    r->worst = fmax(r->worst, worst);
    r->mismatches += !(worst <= 1.0);
done:
    free(f);
    free(dd);
}

static void *thread_main(void *arg)
{
    thread_arg *t = arg;
    run_setup *su = t->setup;
    thread_result *r = &t->result;
    aj_ctx *ctx = su->ctx;
    aj_device *dev = su->dev;
    aj_op *op = NULL;
    aj_kernel *kernel = NULL;
    const int s = t->index % NUM_SPECS;
    if (!su->shared_ctx) {
        if (aj_ctx_create(NULL, &ctx) != AJ_OK || aj_device_open(ctx, su->kind, 0, &dev) != AJ_OK) {
            fail_with(r, ctx, "context or device");
            pthread_barrier_wait(&su->start);
            goto done;
        }
    }
    if (aj_op_parse(ctx, specs[s], strlen(specs[s]), "thread", &op) != AJ_OK)
        fail_with(r, ctx, "aj_op_parse");
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    pthread_barrier_wait(&su->start);
    if (op && aj_compile(ctx, op, &opt, &kernel) != AJ_OK)
        fail_with(r, ctx, "aj_compile");
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(t->index + 1);
    for (int i = 0; kernel && i < su->launches; i++)
        launch_and_check(ctx, dev, kernel, s, &rng, r);
done:
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
    if (!su->shared_ctx) {
        aj_device_close(dev);
        aj_ctx_destroy(ctx);
    }
    return NULL;
}

static void run(aj_device_kind kind, int threads, int launches, int shared_ctx)
{
    run_setup su = {.kind = kind, .threads = threads, .launches = launches,
                    .shared_ctx = shared_ctx};
    thread_arg args[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    if (shared_ctx) {
        CHECK(aj_ctx_create(NULL, &su.ctx) == AJ_OK);
        CHECK_STATUS(su.ctx, aj_device_open(su.ctx, kind, 0, &su.dev), AJ_OK);
        if (!su.dev)
            return;
    }
    pthread_barrier_init(&su.start, NULL, (unsigned)threads);
    for (int t = 0; t < threads; t++) {
        args[t] = (thread_arg){.setup = &su, .index = t};
        CHECK(pthread_create(&ids[t], NULL, thread_main, &args[t]) == 0);
    }
    int total = 0, mismatches = 0, failures = 0;
    double worst = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(ids[t], NULL);
        const thread_result *r = &args[t].result;
        total += r->launches;
        mismatches += r->mismatches;
        failures += r->failures;
        worst = fmax(worst, r->worst);
        CHECK_MSG(r->failures == 0, "thread %d: %s", t, r->first_failure);
    }
    pthread_barrier_destroy(&su.start);
    const char *name = kind == AJ_DEVICE_CPU ? "cpu" : "sim";
    CHECK_MSG(total == threads * launches, "%s: %d of %d launches ran", name, total,
              threads * launches);
    CHECK_MSG(mismatches == 0, "%s: %d launches differ from the reference (worst %.3g x tol)",
              name, mismatches, worst);
    printf("%s, %2d threads, %s: %d launches, worst error %.3f x tolerance, %d failed\n", name,
           threads, shared_ctx ? "one context and device" : "a context each", total, worst,
           failures);
    if (shared_ctx) {
        aj_cache_stats stats;
        CHECK(aj_cache_get_stats(su.ctx, &stats) == AJ_OK);
        const int distinct = threads < NUM_SPECS ? threads : NUM_SPECS;
        CHECK_MSG(stats.misses == (uint64_t)distinct,
                  "%s: %llu compiles for %d distinct ops asked for by %d threads at once",
                  name, (unsigned long long)stats.misses, distinct, threads);
        printf("    cache: %llu compiles, %llu hits for %d threads\n",
               (unsigned long long)stats.misses, (unsigned long long)stats.memory_hits,
               threads);
        aj_device_close(su.dev);
        aj_ctx_destroy(su.ctx);
    }
}

/*
 * Faults the kernels record, under threads: a varlen forward with
 * decreasing cu_seqlens_q in one thread while another launches good ones
 * on the same context and device.  Every bad launch must report its own
 * fault and every good one none (one status word for the device let a
 * good launch read, and clear, the other thread's fault).
 */
enum { FAULT_T = 6, FAULT_H = 2, FAULT_D = 16, FAULT_LAUNCHES = 150 };

typedef struct fault_arg {
    aj_ctx *ctx;
    aj_device *dev;
    aj_kernel *kernel;
    const int32_t *cu;          /* device memory: the call's cu_seqlens_q */
    const int32_t *cu_k;        /* ... and cu_seqlens_k (good) */
    void *x, *o, *lse;          /* device memory */
    aj_status want;
    pthread_barrier_t *start;
    int wrong;                  /* launches whose status or message was not the one wanted */
    char first_wrong[256];
} fault_arg;

static void *fault_main(void *arg)
{
    fault_arg *f = arg;
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = (aj_tensor){f->x, AJ_DTYPE_F32, 3, {FAULT_T, FAULT_H, FAULT_D},
                      {FAULT_H * FAULT_D, FAULT_D, 1}};
    a.k = a.v = a.q;
    a.o = a.q;
    a.o.data = f->o;
    a.lse = (aj_tensor){f->lse, AJ_DTYPE_F32, 2, {FAULT_H, FAULT_T}, {FAULT_T, 1}};
    a.batch = 2;
    a.max_seqlen_q = a.max_seqlen_k = 4;
    a.cu_seqlens_q = f->cu;
    a.cu_seqlens_k = f->cu_k;
    pthread_barrier_wait(f->start);
    for (int i = 0; i < FAULT_LAUNCHES; i++) {
        aj_status st = aj_forward(f->ctx, f->dev, f->kernel, &a);
        int ok = st == f->want &&
                 (st == AJ_OK || strstr(aj_last_error(f->ctx), "cu_seqlens_q[2] is below"));
        if (!ok && !f->wrong++)
            snprintf(f->first_wrong, sizeof f->first_wrong, "launch %d: %s (%s)", i,
                     aj_status_str(st), st == AJ_OK ? "" : aj_last_error(f->ctx));
    }
    return NULL;
}

/* On the cpu (sim takes varlen in flash kernels of f16 / bf16 only; its
 * status word comes from the same aj_device_status_word). */
static void varlen_faults(aj_device_kind kind)
{
    const char *name = kind == AJ_DEVICE_CPU ? "cpu" : "sim";
    aj_ctx *ctx[2] = {NULL, NULL};   /* a context each: errors are per context */
    aj_device *dev = NULL;
    CHECK(aj_ctx_create(NULL, &ctx[0]) == AJ_OK && aj_ctx_create(NULL, &ctx[1]) == AJ_OK);
    CHECK_STATUS(ctx[0], aj_device_open(ctx[0], kind, 0, &dev), AJ_OK);
    const char *spec = "attention forward efficient { dtype = f32  head_dim = 16  "
                       "layout = varlen }";
    aj_op *op = NULL;
    aj_kernel *kernel = NULL;
    CHECK_STATUS(ctx[0], aj_op_parse(ctx[0], spec, strlen(spec), "faults", &op), AJ_OK);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = dev ? aj_device_target(dev) : AJ_TARGET_CPU;
    if (dev && op)
        CHECK_STATUS(ctx[0], aj_compile(ctx[0], op, &opt, &kernel), AJ_OK);
    if (!kernel) {
        aj_op_destroy(op);
        aj_device_close(dev);
        aj_ctx_destroy(ctx[0]);
        aj_ctx_destroy(ctx[1]);
        return;
    }
    static const float zeros[FAULT_T * FAULT_H * FAULT_D];
    const int32_t good[3] = {0, 2, FAULT_T}, down[3] = {0, 4, 3};
    /* per thread: x (q, k, v), o, lse; then the two offset arrays */
    enum { X, O, LSE, PER_THREAD, GOOD = 2 * PER_THREAD, DOWN, BUFFERS };
    void *mem[BUFFERS] = {NULL};
    for (int i = 0; i < BUFFERS; i++) {
        const void *init = i == GOOD ? (const void *)good : i == DOWN ? (const void *)down : zeros;
        size_t bytes = i >= GOOD ? sizeof good : i % PER_THREAD == LSE ? FAULT_H * FAULT_T * 4
                                                                       : sizeof zeros;
        CHECK(aj_device_alloc(dev, bytes, &mem[i]) == AJ_OK &&
              aj_device_copy_to(dev, mem[i], init, bytes) == AJ_OK);
    }
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, 2);
    fault_arg args[2];
    for (int t = 0; t < 2; t++)
        args[t] = (fault_arg){ctx[t], dev, kernel, mem[t ? DOWN : GOOD], mem[GOOD],
                              mem[t * PER_THREAD + X], mem[t * PER_THREAD + O],
                              mem[t * PER_THREAD + LSE], t ? AJ_ERR_INVALID_ARG : AJ_OK,
                              &start, 0, ""};
    pthread_t ids[2];
    for (int t = 0; t < 2; t++)
        CHECK(pthread_create(&ids[t], NULL, fault_main, &args[t]) == 0);
    for (int t = 0; t < 2; t++)
        pthread_join(ids[t], NULL);
    pthread_barrier_destroy(&start);
    CHECK_MSG(args[0].wrong == 0, "%s: %d of %d good launches got a fault: %s", name,
              args[0].wrong, FAULT_LAUNCHES, args[0].first_wrong);
    CHECK_MSG(args[1].wrong == 0, "%s: %d of %d bad launches did not report theirs: %s", name,
              args[1].wrong, FAULT_LAUNCHES, args[1].first_wrong);
    printf("%s, 2 threads: %d good and %d faulting varlen launches, each with its own status\n",
           name, FAULT_LAUNCHES, FAULT_LAUNCHES);
    for (int i = 0; i < BUFFERS; i++)
        aj_device_free(dev, mem[i]);
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
    aj_device_close(dev);
    aj_ctx_destroy(ctx[0]);
    aj_ctx_destroy(ctx[1]);
}

/* Threads taking and giving back the cpu device's scratch at once
 * (aj_cpu_scratch): each fills what it holds with its own byte and finds
 * it unchanged before giving it back, so no two ever hold one block. */
typedef struct scratch_job {
    aj_device *dev;
    int id, bad;
} scratch_job;

static void *scratch_main(void *arg)
{
    scratch_job *j = arg;
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(j->id + 1);
    for (int i = 0; i < 200; i++) {
        size_t bytes = 64 + next_random(&rng) % (256 << 10);
        void *p = NULL;
        if (aj_device_scratch(j->dev, NULL, bytes, &p) != AJ_OK || !p || (uintptr_t)p % 64) {
            j->bad++;
            continue;
        }
        memset(p, j->id, bytes);
        for (size_t k = 0; k < bytes; k += 97)
            j->bad += ((unsigned char *)p)[k] != (unsigned char)j->id;
        aj_device_scratch_release(j->dev, NULL, p);
    }
    return NULL;
}

static void scratch_threads(void)
{
    aj_ctx *ctx = NULL;
    aj_device *dev = NULL;
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    CHECK(aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev) == AJ_OK);
    pthread_t t[8];
    scratch_job jobs[8];
    for (int i = 0; i < 8; i++) {
        jobs[i] = (scratch_job){dev, i + 1, 0};
        CHECK(pthread_create(&t[i], NULL, scratch_main, &jobs[i]) == 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        CHECK_MSG(jobs[i].bad == 0, "scratch: thread %d found %d bytes not its own", i,
                  jobs[i].bad);
    }
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    if (!only || strcmp(only, "cpu") == 0) {
        run(AJ_DEVICE_CPU, 2, 20, 1);    /* the report's case: two threads, one kernel */
        run(AJ_DEVICE_CPU, 16, 12, 1);
        run(AJ_DEVICE_CPU, 8, 8, 0);
        varlen_faults(AJ_DEVICE_CPU);
        scratch_threads();
    }
    if (!only || strcmp(only, "sim") == 0) {
        run(AJ_DEVICE_SIM, 8, 4, 1);
        run(AJ_DEVICE_SIM, 4, 2, 0);
    }
    return check_report();
}
