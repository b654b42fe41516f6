/*
 * omp.h -- the items of a cpu launch on the threads of the OpenMP runtime
 * the process has loaded (a framework's), instead of the device's pool.
 */
#ifndef AJ_RUNTIME_CPU_OMP_H
#define AJ_RUNTIME_CPU_OMP_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/cpu/pool.h"

/* Whether the process has an OpenMP runtime loaded (attnjit never loads
 * one itself). */
bool aj_cpu_omp_available(void);
/* Runs fn(arg, i) for every i in [0, n), each once, on a parallel region
 * of `threads` threads of that runtime (0: its default team size), and
 * returns true when they are all done; false, having run none, where no
 * runtime is loaded, this process is a child forked after it was found
 * (GNU OpenMP's threads do not survive fork), or no thread of the team
 * has the stack for an item (aj_cpu_stack_fits(item_stack)). */
bool aj_cpu_omp_run(int threads, int64_t n, int64_t item_stack, aj_cpu_item_fn fn, void *arg);

#endif /* AJ_RUNTIME_CPU_OMP_H */
