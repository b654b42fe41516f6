/*
 * test_cpu_omp.c -- a cpu device's launches on the process's OpenMP
 * threads (AJ_CPU_THREADS_OPENMP, runtime/cpu/omp.c), in a process that
 * has one loaded, as PyTorch's has (this test is built with -fopenmp;
 * test_cpu_device checks the refusal where none is loaded):
 *
 *   - the team runs every item once, inside its parallel region, on both
 *     of its threads; 0 threads follow omp_set_num_threads
 *   - items no thread of the team has the stack for run none there, and
 *     a launch of them runs on the pool instead; so does a launch in a
 *     child forked after a region
 *   - forward and backward give the pool's bits, also when two threads
 *     of an enclosing parallel region launch at once (nested regions)
 *
 * About 2 s.
 */
#include <omp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "forked.h"
#include "launch_args.h"
#include "runtime/cpu/cpu_device.h"
#include "runtime/cpu/omp.h"
#include "spec_compile.h"

static aj_ctx *ctx;

enum { ITEMS = 200 };

/* Which items ran, how many inside a parallel region, on which threads. */
typedef struct team_probe {
    atomic_int runs[ITEMS], in_region, on_thread[4], widest;
    int meet;   /* an item of thread 0 or 1 waits (up to 5 s) for the other's first */
} team_probe;

static void probe_item(void *arg, int64_t i)
{
    team_probe *p = arg;
    atomic_fetch_add(&p->runs[i], 1);
    if (omp_get_level() == 0)   /* outside any region (a team of one is inside one) */
        return;
    atomic_fetch_add(&p->in_region, 1);
    int t = omp_get_thread_num(), n = omp_get_num_threads();
    atomic_fetch_add(&p->on_thread[t < 4 ? t : 3], 1);
    int w = atomic_load(&p->widest);
    while (n > w && !atomic_compare_exchange_weak(&p->widest, &w, n))
        ;
    for (int k = 0; p->meet && t < 2 && k < 50000 && !atomic_load(&p->on_thread[1 - t]); k++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

/* Whether every item ran exactly once (none: `none_ran`). */
static int ran_once(const team_probe *p, int none_ran)
{
    for (int i = 0; i < ITEMS; i++)
        if (atomic_load(&p->runs[i]) != (none_ran ? 0 : 1))
            return 0;
    return 1;
}

static void test_team(void)
{
    CHECK(aj_cpu_omp_available());
    team_probe p = {.meet = 1};
    CHECK(aj_cpu_omp_run(2, ITEMS, 0, probe_item, &p));
    CHECK_MSG(ran_once(&p, 0), "a team of 2: every item once");
    CHECK_MSG(atomic_load(&p.in_region) == ITEMS, "%d of %d items in the parallel region",
              atomic_load(&p.in_region), ITEMS);
    CHECK_MSG(atomic_load(&p.on_thread[0]) > 0 && atomic_load(&p.on_thread[1]) > 0,
              "both threads of the team ran items (%d, %d)", atomic_load(&p.on_thread[0]),
              atomic_load(&p.on_thread[1]));
    CHECK(atomic_load(&p.widest) == 2);

    /* 0 threads: the runtime's team size, which the caller sets */
    omp_set_num_threads(1);
    team_probe one = {.meet = 0};
    CHECK(aj_cpu_omp_run(0, ITEMS, 0, probe_item, &one));
    CHECK(ran_once(&one, 0) && atomic_load(&one.widest) == 1);
    omp_set_num_threads(2);
    team_probe two = {.meet = 0};
    CHECK(aj_cpu_omp_run(0, ITEMS, 0, probe_item, &two));
    CHECK_MSG(ran_once(&two, 0) && atomic_load(&two.widest) == 2,
              "omp_set_num_threads(2), 0 threads: a team of %d", atomic_load(&two.widest));

    /* no thread has a terabyte of stack: none runs, the caller is told */
    team_probe big = {.meet = 0};
    CHECK(!aj_cpu_omp_run(2, ITEMS, (int64_t)1 << 40, probe_item, &big));
    CHECK_MSG(ran_once(&big, 1), "items too big for every stack ran on none");
}

/* A cpu launch of probe items through the device (aj_cpu_launch). */
static team_probe *launched;

static void launch_entry(void *thread, void **args)
{
    (void)args;
    const int32_t *item = thread;   /* (x, y, z) of a (ITEMS, 1, 1) grid */
    probe_item(launched, item[0]);
}

/* The forked child's launch of test_launch; its check: every item once,
 * none in a parallel region (on the pool) */
static team_probe in_child;

static int child_launch(void *cpu)
{
    const int32_t grid[3] = {ITEMS, 1, 1};
    return aj_cpu_launch(ctx, cpu, 2, launch_entry, 0, grid, NULL) == AJ_OK &&
           ran_once(&in_child, 0) && atomic_load(&in_child.in_region) == 0;
}

static void test_launch(void)
{
    aj_cpu_device *cpu = NULL;
    CHECK_STATUS(ctx, aj_cpu_device_open(ctx, &cpu), AJ_OK);
    if (!cpu)
        return;
    CHECK_STATUS(ctx, aj_cpu_set_threads(ctx, cpu, AJ_CPU_THREADS_OPENMP), AJ_OK);
    const int32_t grid[3] = {ITEMS, 1, 1};
    team_probe on_team = {.meet = 0};
    launched = &on_team;
    CHECK_STATUS(ctx, aj_cpu_launch(ctx, cpu, 2, launch_entry, 0, grid, NULL), AJ_OK);
    CHECK(ran_once(&on_team, 0) && atomic_load(&on_team.in_region) == ITEMS);
    /* items whose stack no OpenMP thread has: the pool's workers run them
     * (they take any item: their stacks are the pool's to size), outside
     * any parallel region */
    team_probe on_pool = {.meet = 0};
    launched = &on_pool;
    CHECK_STATUS(ctx, aj_cpu_launch(ctx, cpu, 2, launch_entry, (int64_t)1 << 40, grid, NULL),
                 AJ_OK);
    CHECK_MSG(ran_once(&on_pool, 0) && atomic_load(&on_pool.in_region) == 0,
              "items too big for the team: %d ran in a parallel region",
              atomic_load(&on_pool.in_region));
    /* a child forked after a parallel region: GNU OpenMP's threads are not
     * in it (its regions would wait for them forever), so its launches run
     * on a pool of its own */
    launched = &in_child;
    const char *why = in_forked_child(child_launch, cpu, 60);
    CHECK_MSG(!*why, "the forked child's launch %s", why);
    aj_cpu_device_close(cpu);
}

/* A causal GQA problem's forward and backward outputs (bf16, so every
 * product's order shows in the bits). */
enum { B = 2, HQ = 4, HKV = 2, S = 173, D = 64 };
#define NQ ((size_t)B * HQ * S * D)
#define NK ((size_t)B * HKV * S * D)

typedef struct outputs {
    _Alignas(64) uint16_t o[NQ];
    _Alignas(64) uint16_t dq[NQ];
    _Alignas(64) uint16_t dk[NK];
    _Alignas(64) uint16_t dv[NK];
    _Alignas(64) float lse[B * HQ * S];
} outputs;

typedef struct problem {
    aj_device *dev;
    aj_kernel *fwd, *bwd;
    _Alignas(64) uint16_t q[NQ];
    _Alignas(64) uint16_t kv[NK];
    _Alignas(64) uint16_t do_[NQ];
} problem;

static aj_status run(problem *p, outputs *out)
{
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = tensor_dims(p->q, AJ_DTYPE_BF16, 4, B, HQ, S, D);
    a.k = a.v = tensor_dims(p->kv, AJ_DTYPE_BF16, 4, B, HKV, S, D);
    a.o = tensor_dims(out->o, AJ_DTYPE_BF16, 4, B, HQ, S, D);
    a.lse = tensor_dims(out->lse, AJ_DTYPE_F32, 3, B, HQ, S, 0);
    aj_status st = aj_forward(ctx, p->dev, p->fwd, &a);
    if (st != AJ_OK)
        return st;
    aj_bwd_args g = bwd_args_after(&a, tensor_dims(p->do_, AJ_DTYPE_BF16, 4, B, HQ, S, D),
                                   tensor_dims(out->dq, AJ_DTYPE_BF16, 4, B, HQ, S, D),
                                   tensor_dims(out->dk, AJ_DTYPE_BF16, 4, B, HKV, S, D),
                                   tensor_dims(out->dv, AJ_DTYPE_BF16, 4, B, HKV, S, D));
    return aj_backward(ctx, p->dev, p->bwd, &g);
}

static void test_same_bits(void)
{
    static problem p;
    static outputs pool, team, nested[2];
    const char *mask = "mask = causal(bottom_right) }";
    char text[160];
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    snprintf(text, sizeof text, "attention forward flash { dtype = bf16 head_dim = 64 %s", mask);
    CHECK_STATUS(ctx, spec_compile(ctx, text, "fwd", &opt, &p.fwd), AJ_OK);
    snprintf(text, sizeof text, "attention backward flash { dtype = bf16 head_dim = 64 %s", mask);
    CHECK_STATUS(ctx, spec_compile(ctx, text, "bwd", &opt, &p.bwd), AJ_OK);
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_CPU, 0, &p.dev), AJ_OK);
    if (!p.fwd || !p.bwd || !p.dev)
        return;
    uint64_t rng = 11;
    for (size_t i = 0; i < NQ; i++) {
        float x[2];
        for (int j = 0; j < 2; j++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            x[j] = (float)((double)(rng >> 40) / (double)(1 << 24) * 4 - 2);
        }
        aj_convert(&x[0], AJ_DTYPE_F32, &p.q[i], AJ_DTYPE_BF16, 1);
        aj_convert(&x[1], AJ_DTYPE_F32, &p.do_[i], AJ_DTYPE_BF16, 1);
        if (i < NK)
            p.kv[i] = p.q[i] ^ 0x0101;
    }
    CHECK_STATUS(ctx, run(&p, &pool), AJ_OK);
    CHECK_STATUS(ctx, aj_device_set_cpu_threads(p.dev, AJ_CPU_THREADS_OPENMP), AJ_OK);
    CHECK(aj_device_cpu_threads(p.dev) == AJ_CPU_THREADS_OPENMP);
    CHECK_STATUS(ctx, run(&p, &team), AJ_OK);
    CHECK_MSG(memcmp(&pool, &team, sizeof pool) == 0,
              "OpenMP threads' bits differ from the pool's");
    /* two threads of a parallel region launch at once: each launch's region
     * nests (a team of one, the launching thread) */
    aj_status st[2] = {AJ_ERR_INTERNAL, AJ_ERR_INTERNAL};
#pragma omp parallel num_threads(2)
    {
        int t = omp_get_thread_num();
        if (t < 2)
            st[t] = run(&p, &nested[t]);
    }
    for (int t = 0; t < 2; t++) {
        CHECK_STATUS(ctx, st[t], AJ_OK);
        CHECK_MSG(memcmp(&pool, &nested[t], sizeof pool) == 0,
                  "thread %d of an enclosing region: bits differ from the pool's", t);
    }
    aj_device_close(p.dev);
    aj_kernel_destroy(p.fwd);
    aj_kernel_destroy(p.bwd);
}

int main(void)
{
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    omp_set_num_threads(2);
    test_team();
    test_launch();
    test_same_bits();
    aj_ctx_destroy(ctx);
    return check_report();
}
