/*
 * emulator.c -- the SIMT emulator (see emulator.h).
 *
 * A CTA runs on one worker thread.  Its GPU threads are ucontext fibers on
 * guarded stacks; the worker's scheduler runs every ready fiber until it
 * blocks, then settles what the blocked ones wait for:
 *
 *     sweep: run each READY fiber ──► it returns AT_BARRIER, AT_SHFL or DONE
 *     settle: a warp whose lanes all wait at the same shfl ──► results, READY
 *             all live threads at the same barrier        ──► READY
 *     nothing READY and not all DONE ──► divergence or deadlock: an error
 *
 * A fault inside a fiber (bad access) records the error and switches back
 * to the scheduler, which abandons the CTA; other workers stop at their
 * next CTA.
 */
#define _GNU_SOURCE
#include "runtime/sim/emulator.h"

#include "ir/dtype.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#define STACK_BYTES (256 * 1024)
#define MAX_WORKERS 16
#define WARP 32

enum thread_state { T_READY, T_BARRIER, T_SHFL, T_DONE };
enum shfl_mode { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_BFLY };

struct sim_worker;

typedef struct sim_thread {
    uint64_t instructions;     /* first: bumped by the instrumented kernel */
    struct sim_worker *w;
    int32_t tid;
    enum thread_state state;
    void *site;                /* return address of the waiting call */
    /* shfl.sync operands and result */
    enum shfl_mode mode;
    uint32_t mask, value, result;
    int32_t b, c;
    ucontext_t uc;
    char *stack;               /* STACK_BYTES, with a guard page below */
} sim_thread;

typedef struct sim_worker {
    aj_sim_launch *launch;
    struct sim_run *run;
    sim_thread *threads;
    int32_t ctaid[3];
    uint8_t *smem;
    ucontext_t sched;
    int faulted;
    uint64_t instructions;
} sim_worker;

/* State shared by the workers of one launch. */
typedef struct sim_run {
    aj_sim_launch *launch;
    atomic_long next_cta;
    long num_ctas;
    atomic_int stop;
    pthread_mutex_t lock;
    char error[1024];          /* first fault, under lock */
    int have_error;
} sim_run;

/* ---------------------------------------------------------------- faults */

static void record_fault(sim_worker *w, const char *fmt, ...) AJ_PRINTF(2, 3);

static void record_fault(sim_worker *w, const char *fmt, ...)
{
    sim_run *run = w->run;
    pthread_mutex_lock(&run->lock);
    if (!run->have_error) {
        int n = snprintf(run->error, sizeof run->error, "kernel %s, CTA (%d,%d,%d): ",
                         w->launch->kernel_name, w->ctaid[0], w->ctaid[1], w->ctaid[2]);
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < sizeof run->error)
            vsnprintf(run->error + n, sizeof run->error - (size_t)n, fmt, ap);
        va_end(ap);
        run->have_error = 1;
    }
    pthread_mutex_unlock(&run->lock);
    atomic_store(&run->stop, 1);
    w->faulted = 1;
}

/* Called on a fiber: records the fault and never returns to the kernel. */
static void fault_in_thread(sim_thread *t, const char *what)
{
    record_fault(t->w, "thread %d: %s", t->tid, what);
    t->state = T_DONE;
    swapcontext(&t->uc, &t->w->sched);
    abort();   /* unreachable: a faulted CTA's fibers are never resumed */
}

static void yield_to_scheduler(sim_thread *t, enum thread_state why, void *site)
{
    t->state = why;
    t->site = site;
    swapcontext(&t->uc, &t->w->sched);
}

/* ---------------------------------------------------------------- intrinsics */

static int32_t sim_tid_x(sim_thread *t) { return t->tid; }
static int32_t sim_ctaid_x(sim_thread *t) { return t->w->ctaid[0]; }
static int32_t sim_ctaid_y(sim_thread *t) { return t->w->ctaid[1]; }
static int32_t sim_ctaid_z(sim_thread *t) { return t->w->ctaid[2]; }

static void sim_barrier(sim_thread *t)
{
    yield_to_scheduler(t, T_BARRIER, __builtin_return_address(0));
}

static uint32_t shuffle(sim_thread *t, enum shfl_mode mode, uint32_t mask, uint32_t value,
                        int32_t b, int32_t c, void *site)
{
    t->mode = mode;
    t->mask = mask;
    t->value = value;
    t->b = b;
    t->c = c;
    yield_to_scheduler(t, T_SHFL, site);
    return t->result;
}

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

#define SHFL_F32(name, mode)                                                            \
    static float name(sim_thread *t, int32_t mask, float v, int32_t b, int32_t c)      \
    {                                                                                   \
        return u2f(shuffle(t, mode, (uint32_t)mask, f2u(v), b, c,                       \
                           __builtin_return_address(0)));                               \
    }
SHFL_F32(sim_shfl_idx_f32, SHFL_IDX)
SHFL_F32(sim_shfl_up_f32, SHFL_UP)
SHFL_F32(sim_shfl_down_f32, SHFL_DOWN)
SHFL_F32(sim_shfl_bfly_f32, SHFL_BFLY)
#undef SHFL_F32

static int32_t sim_shfl_idx_i32(sim_thread *t, int32_t mask, int32_t v, int32_t b, int32_t c)
{
    return (int32_t)shuffle(t, SHFL_IDX, (uint32_t)mask, (uint32_t)v, b, c,
                            __builtin_return_address(0));
}

/* ex2.approx.ftz / lg2.approx.ftz: subnormal inputs and results are zero */
static float flush(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }
static float sim_ex2_approx(sim_thread *t, float x) { return flush(exp2f(flush(x))); }
static float sim_lg2_approx(sim_thread *t, float x) { return log2f(flush(x)); }

/* cvt.f32.f16, cvt.rn.f16.f32, cvt.rn.bf16.f32 */
static float sim_cvt_f32_f16(sim_thread *t, uint16_t h) { return aj_f16_to_f32(h); }
static uint16_t sim_cvt_f16_f32(sim_thread *t, float f) { return aj_f32_to_f16(f); }
static uint16_t sim_cvt_bf16_f32(sim_thread *t, float f) { return aj_f32_to_bf16(f); }

static void *sim_smem(sim_thread *t) { return t->w->smem; }

/* Accesses: bit 0 of `flags` = store, bit 1 = shared memory. */
static void sim_check(sim_thread *t, int64_t addr, int32_t bytes, int32_t flags)
{
    sim_worker *w = t->w;
    const char *op = flags & 1 ? "store" : "load";
    char msg[512];
    uintptr_t a = (uintptr_t)addr;
    uintptr_t align = (uintptr_t)(bytes > 16 ? 16 : bytes);
    if (align & (align - 1))
        align = 1;
    if (a % align) {
        snprintf(msg, sizeof msg, "misaligned %s %s of %d bytes at 0x%llx",
                 flags & 2 ? "shared" : "global", op, bytes, (unsigned long long)addr);
        fault_in_thread(t, msg);
    }
    if (flags & 2) {
        uintptr_t base = (uintptr_t)w->smem;
        if (a < base || a + (uintptr_t)bytes > base + (uintptr_t)w->launch->smem_bytes) {
            snprintf(msg, sizeof msg,
                     "out-of-bounds shared %s of %d bytes at offset %lld of %d bytes of "
                     "shared memory", op, bytes, (long long)(a - base), w->launch->smem_bytes);
            fault_in_thread(t, msg);
        }
        return;
    }
    const aj_sim_buffer *near = NULL;
    long long near_dist = 0;
    for (int i = 0; i < w->launch->num_buffers; i++) {
        const aj_sim_buffer *buf = &w->launch->buffers[i];
        uintptr_t lo = (uintptr_t)buf->base, hi = lo + buf->bytes;
        if (a >= lo && a + (uintptr_t)bytes <= hi)
            return;
        long long dist = a < lo ? (long long)(lo - a) : (long long)(a + (uintptr_t)bytes - hi);
        if (!near || dist < near_dist) {
            near = buf;
            near_dist = dist;
        }
    }
    if (near)
        snprintf(msg, sizeof msg,
                 "out-of-bounds global %s of %d bytes at 0x%llx (%lld bytes %s '%s', "
                 "%zu bytes at 0x%llx)", op, bytes, (unsigned long long)addr, near_dist,
                 a < (uintptr_t)near->base ? "before" : "past the end of", near->name,
                 near->bytes, (unsigned long long)(uintptr_t)near->base);
    else
        snprintf(msg, sizeof msg, "global %s of %d bytes at 0x%llx: the launch has no buffers",
                 op, bytes, (unsigned long long)addr);
    fault_in_thread(t, msg);
}

/* The table the JIT binds; names come from codegen/intrinsics.def. */
#define SYM(name, fn) {name, (void *)(uintptr_t)fn}
static const aj_host_symbol symbols[] = {
    SYM("aj_sim_tid_x", sim_tid_x),
    SYM("aj_sim_ctaid_x", sim_ctaid_x),
    SYM("aj_sim_ctaid_y", sim_ctaid_y),
    SYM("aj_sim_ctaid_z", sim_ctaid_z),
    SYM("aj_sim_barrier", sim_barrier),
    SYM("aj_sim_shfl_bfly_f32", sim_shfl_bfly_f32),
    SYM("aj_sim_shfl_idx_f32", sim_shfl_idx_f32),
    SYM("aj_sim_shfl_up_f32", sim_shfl_up_f32),
    SYM("aj_sim_shfl_down_f32", sim_shfl_down_f32),
    SYM("aj_sim_shfl_idx_i32", sim_shfl_idx_i32),
    SYM("aj_sim_ex2_approx", sim_ex2_approx),
    SYM("aj_sim_lg2_approx", sim_lg2_approx),
    SYM("aj_sim_cvt_f32_f16", sim_cvt_f32_f16),
    SYM("aj_sim_cvt_f16_f32", sim_cvt_f16_f32),
    SYM("aj_sim_cvt_bf16_f32", sim_cvt_bf16_f32),
    SYM("aj_sim_smem", sim_smem),
    SYM("aj_sim_check", sim_check),
};
#undef SYM

const aj_host_symbol *aj_sim_symbols(size_t *count)
{
    *count = sizeof symbols / sizeof symbols[0];
    return symbols;
}

/* ---------------------------------------------------------------- scheduling */

/* Result of one lane's shfl.sync by the PTX ISA's rule for `mode`. */
static uint32_t shuffle_source(const sim_thread *warp, int lane)
{
    const sim_thread *t = &warp[lane];
    int b = t->b & 31, c = t->c & 31, seg = (t->c >> 8) & 31;
    int max_lane = (lane & seg) | (c & ~seg);
    int min_lane = lane & seg;
    int j = lane, ok = 0;
    switch (t->mode) {
    case SHFL_UP:   j = lane - b; ok = j >= max_lane; break;
    case SHFL_DOWN: j = lane + b; ok = j <= max_lane; break;
    case SHFL_BFLY: j = lane ^ b; ok = j <= max_lane; break;
    case SHFL_IDX:  j = min_lane | (b & ~seg); ok = j <= max_lane; break;
    }
    if (!ok)
        j = lane;
    return warp[j].value;
}

/* Completes a warp's shuffle once every lane of its mask waits at it. */
static int settle_shuffles(sim_worker *w, int nthreads)
{
    int released = 0;
    for (int base = 0; base < nthreads; base += WARP) {
        sim_thread *warp = &w->threads[base];
        int lanes = nthreads - base < WARP ? nthreads - base : WARP;
        int first = -1;
        for (int l = 0; l < lanes && first < 0; l++)
            if (warp[l].state == T_SHFL)
                first = l;
        if (first < 0)
            continue;
        uint32_t mask = warp[first].mask;
        int complete = 1;
        for (int l = 0; l < lanes; l++) {
            if (!(mask >> l & 1))
                continue;
            if (warp[l].state != T_SHFL || warp[l].site != warp[first].site ||
                warp[l].mask != mask)
                complete = 0;
        }
        if (!complete)
            continue;
        for (int l = 0; l < lanes; l++)
            if (mask >> l & 1)
                warp[l].result = shuffle_source(warp, l);
        for (int l = 0; l < lanes; l++)
            if (mask >> l & 1) {
                warp[l].state = T_READY;
                released++;
            }
    }
    return released;
}

/* Releases the barrier when every thread waits at the same one. */
static int settle_barrier(sim_worker *w, int nthreads)
{
    void *site = NULL;
    for (int i = 0; i < nthreads; i++) {
        if (w->threads[i].state != T_BARRIER)
            return 0;
        if (!site)
            site = w->threads[i].site;
        else if (w->threads[i].site != site)
            return 0;
    }
    for (int i = 0; i < nthreads; i++)
        w->threads[i].state = T_READY;
    return nthreads;
}

/* Nothing can move: say why, as precisely as the states allow. */
static void diagnose_stall(sim_worker *w, int nthreads)
{
    int at_barrier = -1, other_barrier = -1, done = -1, at_shfl = -1;
    for (int i = 0; i < nthreads; i++) {
        const sim_thread *t = &w->threads[i];
        if (t->state == T_BARRIER) {
            if (at_barrier < 0)
                at_barrier = i;
            else if (t->site != w->threads[at_barrier].site && other_barrier < 0)
                other_barrier = i;
        } else if (t->state == T_DONE && done < 0) {
            done = i;
        } else if (t->state == T_SHFL && at_shfl < 0) {
            at_shfl = i;
        }
    }
    if (at_barrier >= 0 && other_barrier >= 0)
        record_fault(w, "barrier divergence: thread %d waits at barrier %p, thread %d at "
                     "barrier %p", at_barrier, w->threads[at_barrier].site, other_barrier,
                     w->threads[other_barrier].site);
    else if (at_barrier >= 0 && done >= 0)
        record_fault(w, "barrier divergence: thread %d waits at a barrier that thread %d "
                     "never reaches (it has exited)", at_barrier, done);
    else if (at_shfl >= 0)
        record_fault(w, "deadlock: thread %d waits in shfl.sync (mask 0x%08x) for lanes that "
                     "exited, wait at a barrier or at another shuffle", at_shfl,
                     w->threads[at_shfl].mask);
    else
        record_fault(w, "deadlock: thread %d waits at a barrier that threads at shuffles "
                     "block", at_barrier);
}

static void thread_main(unsigned lo, unsigned hi)
{
    sim_thread *t = (sim_thread *)(((uintptr_t)hi << 32) | (uintptr_t)lo);
    t->w->launch->entry(t, t->w->launch->args);
    t->state = T_DONE;
    swapcontext(&t->uc, &t->w->sched);
}

static void run_cta(sim_worker *w)
{
    int n = w->launch->block_threads;
    memset(w->smem, 0xff, (size_t)w->launch->smem_bytes);   /* NaN: unwritten reads show */
    for (int i = 0; i < n; i++) {
        sim_thread *t = &w->threads[i];
        t->instructions = 0;
        t->state = T_READY;
        getcontext(&t->uc);
        t->uc.uc_stack.ss_sp = t->stack;
        t->uc.uc_stack.ss_size = STACK_BYTES;
        t->uc.uc_link = NULL;
        uintptr_t p = (uintptr_t)t;
        makecontext(&t->uc, (void (*)(void))thread_main, 2, (unsigned)(p & 0xffffffffu),
                    (unsigned)(p >> 32));
    }
    for (;;) {
        int ran = 0;
        for (int i = 0; i < n && !w->faulted; i++) {
            if (w->threads[i].state != T_READY)
                continue;
            swapcontext(&w->sched, &w->threads[i].uc);
            ran++;
        }
        if (w->faulted)
            return;
        int released = settle_shuffles(w, n);
        released += settle_barrier(w, n);
        if (ran || released)
            continue;
        int done = 0;
        for (int i = 0; i < n; i++)
            done += w->threads[i].state == T_DONE;
        if (done < n)
            diagnose_stall(w, n);
        break;
    }
    for (int i = 0; i < n; i++)
        w->instructions += w->threads[i].instructions;
}

static void *worker_main(void *arg)
{
    sim_worker *w = arg;
    sim_run *run = w->run;
    const int32_t *grid = w->launch->grid;
    for (;;) {
        if (atomic_load(&run->stop))
            break;
        long c = atomic_fetch_add(&run->next_cta, 1);
        if (c >= run->num_ctas)
            break;
        w->ctaid[0] = (int32_t)(c % grid[0]);
        w->ctaid[1] = (int32_t)(c / grid[0] % grid[1]);
        w->ctaid[2] = (int32_t)(c / grid[0] / grid[1]);
        run_cta(w);
    }
    return NULL;
}

/* ---------------------------------------------------------------- setup */

static void free_worker(sim_worker *w, int nthreads)
{
    if (w->threads)
        for (int i = 0; i < nthreads; i++)
            if (w->threads[i].stack)
                munmap(w->threads[i].stack - getpagesize(), STACK_BYTES + (size_t)getpagesize());
    free(w->threads);
    free(w->smem);
}

static int init_worker(sim_worker *w, sim_run *run, int nthreads)
{
    memset(w, 0, sizeof *w);
    w->launch = run->launch;
    w->run = run;
    w->threads = calloc((size_t)nthreads, sizeof *w->threads);
    w->smem = aligned_alloc(16, ((size_t)run->launch->smem_bytes + 15) / 16 * 16 + 16);
    if (!w->threads || !w->smem)
        return -1;
    size_t page = (size_t)getpagesize();
    for (int i = 0; i < nthreads; i++) {
        sim_thread *t = &w->threads[i];
        t->w = w;
        t->tid = i;
        /* a PROT_NONE page below each stack turns an overflow into a crash
         * at the guard, not silent corruption of a neighbour */
        char *m = mmap(NULL, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            return -1;
        mprotect(m, page, PROT_NONE);
        t->stack = m + page;
    }
    return 0;
}

aj_status aj_sim_run(aj_ctx *ctx, aj_sim_launch *launch)
{
    long ctas = (long)launch->grid[0] * launch->grid[1] * launch->grid[2];
    launch->instructions = 0;
    if (ctas == 0)
        return AJ_OK;
    if (launch->block_threads < 1 || launch->block_threads > 1024)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "sim launch: %d threads per CTA is outside "
                       "1..1024", launch->block_threads);
    int workers = launch->workers;
    if (workers <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        workers = cores > 0 ? (int)cores : 1;
    }
    if (workers > MAX_WORKERS)
        workers = MAX_WORKERS;
    if (workers > ctas)
        workers = (int)ctas;

    sim_run run;
    memset(&run, 0, sizeof run);
    run.launch = launch;
    run.num_ctas = ctas;
    atomic_init(&run.next_cta, 0);
    atomic_init(&run.stop, 0);
    pthread_mutex_init(&run.lock, NULL);
    sim_worker w[MAX_WORKERS];
    pthread_t tids[MAX_WORKERS];
    int started = 0, ok = 1;
    for (int i = 0; i < workers && ok; i++) {
        ok = init_worker(&w[i], &run, launch->block_threads) == 0;
        if (!ok) {
            free_worker(&w[i], launch->block_threads);
            break;
        }
        /* worker 0 runs on the caller's thread */
        if (i > 0 && pthread_create(&tids[i], NULL, worker_main, &w[i]) != 0) {
            free_worker(&w[i], launch->block_threads);
            break;
        }
        started++;
    }
    if (started > 0)
        worker_main(&w[0]);
    else
        atomic_store(&run.stop, 1);
    for (int i = 0; i < started; i++) {
        if (i > 0)
            pthread_join(tids[i], NULL);
        launch->instructions += w[i].instructions;
        free_worker(&w[i], launch->block_threads);
    }
    pthread_mutex_destroy(&run.lock);
    if (run.have_error)
        return aj_fail(ctx, AJ_ERR_KERNEL_FAULT, "%s", run.error);
    if (started == 0)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "sim launch: cannot set up a worker "
                       "(%d threads of %d KiB stacks)", launch->block_threads,
                       STACK_BYTES / 1024);
    return AJ_OK;
}
