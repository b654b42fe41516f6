/*
 * cpu_device.c -- the cpu device (cpu_device.h).
 *
 * A launch's grid is a list of work items (x, y, z) = (query block, head,
 * batch); item i of the list is
 *
 *   x = gx - 1 - i % gx,  y = i / gx % gy,  z = i / (gx gy)
 *
 * so that the heaviest blocks of a causal mask (the last rows) are
 * claimed first and the light ones fill the gaps at the end.
 */
#define _GNU_SOURCE   /* sched_getaffinity, CPU_COUNT */
#include "runtime/cpu/cpu_device.h"

#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "codegen/amx.h"
#include "runtime/cpu/omp.h"

aj_status aj_cpu_device_open(aj_ctx *ctx, aj_cpu_device **out)
{
    aj_status st = aj_cpu_amx_check_runnable(ctx);
    if (st != AJ_OK)
        return st;
    aj_cpu_device *cpu = calloc(1, sizeof *cpu);
    if (!cpu)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    const char *name = aj_host_cpu_name();
    pthread_mutex_init(&cpu->pool_lock, NULL);
    snprintf(cpu->name, sizeof cpu->name, "%s", *name ? name : "cpu");
    *out = cpu;
    return AJ_OK;
}

void aj_cpu_device_close(aj_cpu_device *cpu)
{
    if (!cpu)
        return;
    free(cpu->scratch);
    if (cpu->pool && !aj_cpu_pool_forked(cpu->pool))   /* else its workers are the parent's */
        aj_cpu_pool_destroy(cpu->pool);
    pthread_mutex_destroy(&cpu->pool_lock);
    free(cpu);
}

int aj_cpu_default_workers(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 1;
    int n = CPU_COUNT(&set);
    return n > 0 ? n : 1;
}

typedef struct launch {
    aj_host_entry_fn entry;
    int32_t grid[3];
    void **args;
} launch;

static void run_item(void *arg, int64_t i)
{
    const launch *l = arg;
    int64_t gx = l->grid[0], gy = l->grid[1];
    int32_t item[3] = {(int32_t)(gx - 1 - i % gx), (int32_t)(i / gx % gy),
                       (int32_t)(i / (gx * gy))};
    l->entry(item, l->args);
}

/* A launch this long or longer (expected from its entry's last time per
 * item) runs on the pool alone, its caller waiting: the caller's share of
 * a core is the scheduler's to give, and a thread that has been running
 * (the caller, busy with the framework's work between launches) loses to
 * other busy threads (a framework's spinning OpenMP workers) where pool
 * workers that mostly sleep do not; the wake-ups the caller saves, about
 * 80 us, are noise there.  Shorter launches gain those 80 us. */
#define CALLER_LAUNCH_NS 1000000

aj_status aj_cpu_launch(aj_ctx *ctx, aj_cpu_device *cpu, int workers, aj_host_entry_fn entry,
                        int64_t stack_bytes, const int32_t grid[3], void **args)
{
    launch l = {entry, {grid[0], grid[1], grid[2]}, args};
    const int64_t n = (int64_t)grid[0] * grid[1] * grid[2];
    if (n <= 0)
        return AJ_OK;
    if (atomic_load(&cpu->threads) == AJ_CPU_THREADS_OPENMP &&
        aj_cpu_omp_run(workers, n, stack_bytes, run_item, &l))
        return AJ_OK;   /* else (no thread had the stack; a forked child) the pool */
    int threads = workers > 0 ? workers : aj_cpu_default_workers();
    pthread_mutex_lock(&cpu->pool_lock);
    if (cpu->pool && aj_cpu_pool_forked(cpu->pool))
        cpu->pool = NULL;   /* made in the parent, its workers there: dropped */
    aj_status st = cpu->pool ? aj_cpu_pool_grow(ctx, cpu->pool, threads)
                             : aj_cpu_pool_create(ctx, threads, &cpu->pool);
    aj_cpu_pool *pool = cpu->pool;
    pthread_mutex_unlock(&cpu->pool_lock);
    if (st != AJ_OK)
        return st;
    /* a heuristic: slots may be overwritten by another entry's time */
    uintptr_t key = (uintptr_t)entry;
    size_t slot = (size_t)(key >> 4) % (sizeof cpu->item_time / sizeof cpu->item_time[0]);
    int64_t per_item = atomic_load(&cpu->item_time[slot].entry) == key
                           ? atomic_load(&cpu->item_time[slot].ns_per_item) : 0;
    const bool short_launch = per_item * n / threads < CALLER_LAUNCH_NS;
    const double t0 = aj_now();
    aj_cpu_pool_run(pool, threads, n, short_launch ? stack_bytes : -1, run_item, &l);
    atomic_store(&cpu->item_time[slot].ns_per_item, (int64_t)((aj_now() - t0) * 1e9) * threads / n);
    atomic_store(&cpu->item_time[slot].entry, key);
    return AJ_OK;
}

aj_status aj_cpu_set_threads(aj_ctx *ctx, aj_cpu_device *cpu, aj_cpu_threads threads)
{
    if (threads == AJ_CPU_THREADS_OPENMP && !aj_cpu_omp_available())
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "aj_device_set_cpu_threads: AJ_CPU_THREADS_OPENMP needs an OpenMP runtime "
                       "loaded in the process (libgomp, libomp or libiomp5, as a framework such "
                       "as PyTorch loads it); none is, and attnjit does not load one");
    atomic_store(&cpu->threads, threads);
    return AJ_OK;
}

aj_cpu_threads aj_cpu_get_threads(const aj_cpu_device *cpu)
{
    return atomic_load(&cpu->threads);
}

void *aj_cpu_block(size_t bytes)
{
    return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
}

aj_status aj_cpu_scratch(aj_ctx *ctx, aj_cpu_device *cpu, size_t bytes, void **out)
{
    *out = NULL;
    pthread_mutex_lock(&cpu->pool_lock);
    int mine = !cpu->scratch_taken;
    if (mine && cpu->scratch_bytes < bytes) {
        free(cpu->scratch);
        cpu->scratch = aj_cpu_block(bytes);
        cpu->scratch_bytes = cpu->scratch ? bytes : 0;
    }
    if (mine && cpu->scratch) {
        cpu->scratch_taken = 1;
        *out = cpu->scratch;
    }
    pthread_mutex_unlock(&cpu->pool_lock);
    if (!*out && !mine)
        *out = aj_cpu_block(bytes);
    if (!*out)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "the device's scratch: %zu bytes", bytes);
    return AJ_OK;
}

void aj_cpu_scratch_release(aj_cpu_device *cpu, void *ptr)
{
    pthread_mutex_lock(&cpu->pool_lock);
    int kept = ptr && ptr == cpu->scratch;
    if (kept)
        cpu->scratch_taken = 0;
    pthread_mutex_unlock(&cpu->pool_lock);
    if (!kept)
        free(ptr);
}
