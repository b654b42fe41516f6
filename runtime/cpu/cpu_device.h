/*
 * cpu_device.h -- the cpu device: this host's cores, running the work
 * items of `cpu` kernels on a thread pool (internal).
 */
#ifndef AJ_RUNTIME_CPU_DEVICE_H
#define AJ_RUNTIME_CPU_DEVICE_H

#include <pthread.h>
#include <stdatomic.h>

#include "codegen/codegen.h"
#include "runtime/cpu/pool.h"

typedef struct aj_cpu_device {
    char name[64];          /* LLVM's name of the host CPU ("znver3") */
    pthread_mutex_t pool_lock;  /* guards making the pool, and the scratch */
    aj_cpu_pool *pool;      /* made at the first launch, grown to the widest launch */
    /* the scratch block (64-byte aligned) kept for the device's calls,
     * its bytes, and whether a call holds it (aj_cpu_scratch) */
    void *scratch;
    size_t scratch_bytes;
    int scratch_taken;
    /* the last launch's time per item of each stage entry (a few slots,
     * by the entry's address), which tells short launches, whose caller
     * runs items, from long ones (aj_cpu_launch) */
    struct {
        _Atomic(uintptr_t) entry;
        atomic_llong ns_per_item;
    } item_time[32];
    _Atomic(aj_cpu_threads) threads;   /* whose threads run items (aj_cpu_set_threads) */
} aj_cpu_device;

aj_status aj_cpu_device_open(aj_ctx *ctx, aj_cpu_device **out);
void aj_cpu_device_close(aj_cpu_device *cpu);
/* The cores this process may run on (sched_getaffinity), at least 1. */
int aj_cpu_default_workers(void);
/* Runs entry over every work item of grid (x, y, z) with `args` (one
 * pointer per kernel parameter, as kernelParams) on `workers` threads
 * (0: aj_cpu_default_workers()), the calling one among them where its
 * stack has room for an item's `stack_bytes` (aj_cpu_pool_run); with
 * AJ_CPU_THREADS_OPENMP on a parallel region of the process's OpenMP
 * runtime (omp.h; 0: its team size), the pool running the launch only
 * where aj_cpu_omp_run could not.  Threads may launch on one device at
 * once: each launch is a batch of its own on the shared pool. */
aj_status aj_cpu_launch(aj_ctx *ctx, aj_cpu_device *cpu, int workers, aj_host_entry_fn entry,
                        int64_t stack_bytes, const int32_t grid[3], void **args);
/* Whose threads run the device's launches (aj_device_set_cpu_threads);
 * AJ_ERR_UNSUPPORTED for AJ_CPU_THREADS_OPENMP where the process has no
 * OpenMP runtime loaded. */
aj_status aj_cpu_set_threads(aj_ctx *ctx, aj_cpu_device *cpu, aj_cpu_threads threads);
aj_cpu_threads aj_cpu_get_threads(const aj_cpu_device *cpu);
/* Host memory as the host devices (sim, cpu) hand it out: 64-byte
 * aligned, the size rounded up to 64 bytes and 64 more (a vector read
 * past a buffer's end stays inside); NULL when out of memory, free()d. */
void *aj_cpu_block(size_t bytes);
/* At least `bytes` of scratch (a backward's workspace), 64-byte aligned,
 * in *out: the device's kept block, grown where a call needs more and kept
 * until the device closes, as a GPU device's per-stream scratch is, so a
 * call of a size made before allocates nothing and touches no new page; a
 * call that finds the block held by another thread's gets a block of its
 * own.  AJ_ERR_OUT_OF_MEMORY naming the bytes. */
aj_status aj_cpu_scratch(aj_ctx *ctx, aj_cpu_device *cpu, size_t bytes, void **out);
/* Gives back what aj_cpu_scratch returned. */
void aj_cpu_scratch_release(aj_cpu_device *cpu, void *ptr);

#endif /* AJ_RUNTIME_CPU_DEVICE_H */
