/*
 * omp.c -- a cpu launch's items on the process's OpenMP threads (omp.h).
 *
 * A framework such as PyTorch runs its own operators on an OpenMP team
 * whose threads spin for a while after each parallel region.  On a
 * machine with as many cores as threads, a launch on attnjit's own pool
 * then competes with those spinning threads for every core, and each of
 * its workers must be woken; measured on a 2-core host, a training step
 * of a small attention spent more than a third of its time in the
 * framework's spinning threads (docs/cpu.md "Whose threads").  Run on the
 * framework's team instead, the items start on threads that are already
 * awake, and nothing competes.
 *
 * attnjit never loads an OpenMP runtime: it looks for one the process
 * has loaded (dlopen with RTLD_NOLOAD under the runtimes' usual names)
 * and calls its GOMP_parallel, the entry GCC emits for `#pragma omp
 * parallel` and which LLVM's and Intel's runtimes export too.  Each
 * thread of the team claims items from one atomic counter, as the pool's
 * workers do, where its stack has room for an item; where no thread's has
 * (a kernel of large tiles, a runtime whose threads have small stacks),
 * or in a child forked after the runtime was found, the launch goes back
 * to the caller, which runs it on the pool.
 */
#define _GNU_SOURCE   /* RTLD_NOLOAD */
#include "runtime/cpu/omp.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stddef.h>

typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads,
                                 unsigned flags);

/* The runtimes' library names, GNU's first (PyTorch's Linux wheels). */
static const char *const runtime_names[] = {"libgomp.so.1", "libomp.so", "libomp.so.5",
                                            "libiomp5.so"};

/* Found once, then kept: a loaded runtime stays loaded (a framework
 * does not unload its own); with the fork count of the process that found
 * it (aj_cpu_fork_generation), since a child forked after that has none
 * of the team's threads, and GNU OpenMP's regions there would wait for
 * them forever. */
static _Atomic(gomp_parallel_fn) found;
static atomic_uint found_generation;

static gomp_parallel_fn find_parallel(void)
{
    gomp_parallel_fn known = atomic_load_explicit(&found, memory_order_acquire);
    if (known)
        return known;
    for (size_t i = 0; i < sizeof runtime_names / sizeof runtime_names[0]; i++) {
        void *lib = dlopen(runtime_names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (!lib)
            continue;
        void *sym = dlsym(lib, "GOMP_parallel");
        dlclose(lib);   /* the process keeps it loaded: it was before */
        if (sym) {
            atomic_store(&found_generation, aj_cpu_fork_generation());
            atomic_store_explicit(&found, (gomp_parallel_fn)sym, memory_order_release);
            return (gomp_parallel_fn)sym;
        }
    }
    return NULL;
}

bool aj_cpu_omp_available(void)
{
    return find_parallel() != NULL;
}

typedef struct team_batch {
    aj_cpu_item_fn fn;
    void *arg;
    int64_t n, item_stack;
    atomic_llong next_item;
} team_batch;

static void team_main(void *data)
{
    team_batch *b = data;
    if (aj_cpu_stack_fits(b->item_stack))   /* else the others', or the pool's */
        aj_cpu_claim_items(&b->next_item, b->n, b->fn, b->arg);
}

bool aj_cpu_omp_run(int threads, int64_t n, int64_t item_stack, aj_cpu_item_fn fn, void *arg)
{
    gomp_parallel_fn parallel = find_parallel();
    if (!parallel || atomic_load(&found_generation) != aj_cpu_fork_generation())
        return false;
    team_batch b = {.fn = fn, .arg = arg, .n = n, .item_stack = item_stack};
    atomic_init(&b.next_item, 0);
    /* threads 0: the runtime's own team size (the caller's
     * omp_set_num_threads, PyTorch's torch.set_num_threads) */
    parallel(team_main, &b, threads > 0 ? (unsigned)threads : 0u, 0u);
    /* a thread that claims one item drains the counter: all or none ran */
    return atomic_load(&b.next_item) >= n;
}
