/*
 * emulator.c -- the SIMT emulator (see emulator.h).
 *
 * A CTA runs on one worker thread.  Its GPU threads are ucontext fibers on
 * guarded stacks; the worker's scheduler runs every ready fiber until it
 * blocks, then settles what the blocked ones wait for:
 *
 *     sweep: run each READY fiber ──► it returns BARRIER, WARP, HOPPER or DONE
 *     settle: lanes of a warp that all wait at the same warp-collective call
 *             (shfl, vote, mma, ldmatrix, elect) ──► results computed, READY
 *             all live threads at the same barrier ──► READY
 *             hopper.c's waits that are over (mbarrier phases, warpgroups;
 *             named barriers release at their last arrival) ──► READY
 *     nothing READY and not all DONE ──► divergence or deadlock: an error
 *
 * A fault inside a fiber (bad access) records the error and switches back
 * to the scheduler, which abandons the CTA; other workers stop at their
 * next CTA.
 *
 * cp.async copies read global memory when issued and sit in the issuing
 * thread's queue until a cp.async.wait_group / wait_all covers their
 * group; only then do they land in shared memory.  Shared memory starts
 * every CTA filled with 0xFF bytes (NaN as f32, f16 and bf16), so a kernel
 * that reads a copy's destination before its wait sees NaN, not the data
 * it would usually, but not always, find on a GPU.  Copies never waited for
 * are dropped when the CTA ends.
 *
 * The emulator is stricter than the hardware where the hardware's result is
 * undefined: a collective that names a lane that exited, or a shuffle that
 * reads a lane outside its membermask, is an error, not a garbage value.
 *
 * Strict mode (the default; AJ_SIM_STRICT=0 turns it off) adds two things
 * a fixed schedule would hide:
 *   - order: each sweep visits the ready fibers in a random order, and a
 *     fiber may be preempted at any shared-memory access, so lanes of a
 *     warp interleave between synchronisation points.  The order comes
 *     from a seed (AJ_SIM_SEED, or aj_sim_launch.seed) and the CTA's index,
 *     so it does not depend on which worker runs the CTA, and every fault
 *     message names the seed.
 *   - races: a shadow per 2 bytes of shared memory remembers who wrote it and
 *     who read it, stamped with a per-worker sync counter:
 *
 *         seq ──► +1 at every bar.sync release and bar.warp.sync completion
 *                 (and at hopper.c's arrivals and releases)
 *         last_barrier = seq after the latest bar.sync (and at CTA start)
 *         synced[t][u] = the seq before which thread u's accesses are
 *                        ordered before t's: by a bar.warp.sync of t with
 *                        u, or a named barrier or mbarrier phase that u
 *                        arrived at and t waited for (hopper.c)
 *
 *     An access at stamp s by thread u is ordered before thread t's if
 *     s < last_barrier or s < synced[t][u].
 *     A read of a byte another thread wrote, unordered, is a race (RAW);
 *     so is a write of a byte another thread read, unordered (WAR), which
 *     catches the same bug when the reader happens to run first.  A
 *     cp.async destination counts as written by the issuing thread from
 *     the issue (never ordered while in flight) and again when its wait
 *     lands it, so only a barrier after the wait makes the data visible
 *     to other threads.  Other warp collectives (shfl, vote, mma,
 *     ldmatrix) order nothing, as in the PTX memory model.
 */
#define _GNU_SOURCE
/* fibers switch by longjmp between stacks, which glibc's fortified
 * longjmp takes for a corrupt jump (see the fiber switches) */
#undef _FORTIFY_SOURCE
#include "runtime/sim/sim_internal.h"

#include "ir/dtype.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>


static const char *warp_op_name(const warp_call *c)
{
    static const char *const names[] = {
        [OP_SHFL_IDX] = "shfl.sync.idx",
        [OP_SHFL_UP] = "shfl.sync.up",
        [OP_SHFL_DOWN] = "shfl.sync.down",
        [OP_SHFL_BFLY] = "shfl.sync.bfly",
        [OP_VOTE_BALLOT] = "vote.sync.ballot.b32",
        [OP_VOTE_ALL] = "vote.sync.all.pred",
        [OP_VOTE_ANY] = "vote.sync.any.pred",
        [OP_MMA_F16] = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
        [OP_MMA_BF16] = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        [OP_MMA_E4M3] = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32",
        [OP_MMA_E5M2] = "mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32",
        [OP_MMA_E4M3_E5M2] = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32",
        [OP_BAR_WARP_SYNC] = "bar.warp.sync",
        [OP_ELECT] = "elect.sync",
    };
    static const char *const ldmatrix_names[2][3] = {   /* [trans][x1, x2, x4] */
        {"ldmatrix.sync.aligned.m8n8.x1.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
         "ldmatrix.sync.aligned.m8n8.x4.shared.b16"},
        {"ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
         "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
         "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"},
    };
    if (c->op == OP_LDMATRIX)
        return ldmatrix_names[c->in.ldmatrix.trans][c->in.ldmatrix.count / 2];
    return names[c->op];
}

/* ---------------------------------------------------------------- faults */

void aj_sim_record_fault(sim_worker *w, const char *fmt, ...)
{
    sim_run *run = w->run;
    pthread_mutex_lock(&run->lock);
    if (!run->have_error) {
        int n = snprintf(run->error, sizeof run->error, "kernel %s, CTA (%d,%d,%d): ",
                         w->launch->kernel_name, w->ctaid[0], w->ctaid[1], w->ctaid[2]);
        va_list ap;
        va_start(ap, fmt);
        if (n > 0 && (size_t)n < sizeof run->error)
            n += vsnprintf(run->error + n, sizeof run->error - (size_t)n, fmt, ap);
        va_end(ap);
        if (run->strict && n > 0 && (size_t)n < sizeof run->error)
            snprintf(run->error + n, sizeof run->error - (size_t)n,
                     " (strict sim, seed %llu: AJ_SIM_SEED=%llu reproduces the schedule)",
                     (unsigned long long)run->seed, (unsigned long long)run->seed);
        run->have_error = 1;
    }
    pthread_mutex_unlock(&run->lock);
    atomic_store(&run->stop, 1);
    w->faulted = 1;
}

/*
 * Fiber switches.  A fiber's first entry is a swapcontext into the context
 * prepare_fiber made; every later switch, either way, is a setjmp /
 * longjmp pair, which saves and restores no signal mask: swapcontext's
 * two sigprocmask system calls per switch were 35-40% of an emulated
 * launch (perf, test_sim_flash_bwd).  (A longjmp to a frame on another
 * live stack: glibc's fortified longjmp refuses it, see the top of the
 * file.)  Under AddressSanitizer every switch is announced, so it tracks
 * which stack is live (without this it reports false errors on fiber
 * stacks).
 */
#if defined(__SANITIZE_ADDRESS__)
#define AJ_ASAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AJ_ASAN_FIBERS 1
#endif
#endif

#ifdef AJ_ASAN_FIBERS
#include <sanitizer/common_interface_defs.h>
#endif

/*
 * Under ThreadSanitizer each GPU thread is a TSan fiber and every switch
 * is announced (synchronising: the scheduler's switches order what the
 * fibers of a CTA do, as the GPU's barriers and warp steps do), so TSan
 * follows the fibers' stacks and sees races between CTAs on worker
 * threads, not the fibers' interleaving on one.
 */
#if defined(__SANITIZE_THREAD__)
#define AJ_TSAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define AJ_TSAN_FIBERS 1
#endif
#endif

#ifdef AJ_TSAN_FIBERS
#include <sanitizer/tsan_interface.h>
#endif

static void tsan_fiber_create(sim_thread *t)
{
#ifdef AJ_TSAN_FIBERS
    t->tsan_fiber = __tsan_create_fiber(0);
#else
    (void)t;
#endif
}

static void tsan_fiber_destroy(sim_thread *t)
{
#ifdef AJ_TSAN_FIBERS
    if (t->tsan_fiber)
        __tsan_destroy_fiber(t->tsan_fiber);
#endif
    t->tsan_fiber = NULL;
}

static void switch_to_fiber(sim_worker *w, sim_thread *t)
{
    if (setjmp(w->back) == 0) {
#ifdef AJ_ASAN_FIBERS
        __sanitizer_start_switch_fiber(&w->asan_fake_stack, t->stack, STACK_BYTES);
#endif
#ifdef AJ_TSAN_FIBERS
        w->tsan_sched = __tsan_get_current_fiber();
        __tsan_switch_to_fiber(t->tsan_fiber, 0);
#endif
        if (t->started)
            longjmp(t->resume, 1);
        t->started = true;
        swapcontext(&w->sched, &t->uc);   /* the fiber comes back by longjmp */
    }
#ifdef AJ_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(w->asan_fake_stack, NULL, NULL);
#endif
}

/* The scheduler resumes; `dying`: the fiber will never be resumed
 * (finished or faulted). */
static _Noreturn void jump_to_scheduler(sim_thread *t, int dying)
{
    sim_worker *w = t->w;
#ifdef AJ_ASAN_FIBERS
    __sanitizer_start_switch_fiber(dying ? NULL : &t->asan_fake_stack, w->sched_stack,
                                   w->sched_stack_size);
#else
    (void)dying;
#endif
#ifdef AJ_TSAN_FIBERS
    __tsan_switch_to_fiber(w->tsan_sched, 0);
#endif
    longjmp(w->back, 1);
}

static void switch_to_scheduler(sim_thread *t, int dying)
{
    if (dying)
        jump_to_scheduler(t, 1);
    if (setjmp(t->resume) == 0)
        jump_to_scheduler(t, 0);
#ifdef AJ_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(t->asan_fake_stack, NULL, NULL);
#endif
}

/* First thing a fiber does: completes the switch that started it. */
static void fiber_started(sim_thread *t)
{
#ifdef AJ_ASAN_FIBERS
    __sanitizer_finish_switch_fiber(NULL, &t->w->sched_stack, &t->w->sched_stack_size);
#else
    (void)t;
#endif
}

/* Called on a fiber: records the fault and never returns to the kernel. */
void aj_sim_thread_fault(sim_thread *t, const char *what)
{
    aj_sim_record_fault(t->w, "thread %d: %s", t->tid, what);
    t->state = T_DONE;
    switch_to_scheduler(t, 1);
    abort();   /* unreachable: a faulted CTA's fibers are never resumed */
}

void aj_sim_thread_yield(sim_thread *t, enum thread_state why, int32_t site)
{
    t->state = why;
    t->site = site;
    switch_to_scheduler(t, 0);
}

/* ---------------------------------------------------------------- memory checks */

void aj_sim_check_alignment(sim_thread *t, const char *op, uintptr_t a, int32_t bytes,
                             uintptr_t align, int flags)
{
    if (a % align == 0)
        return;
    char msg[256];
    snprintf(msg, sizeof msg, "misaligned %s %s of %d bytes at 0x%llx (needs %zu-byte "
             "alignment)", flags & ACCESS_SHARED ? "shared" : "global", op, bytes,
             (unsigned long long)a, (size_t)align);
    aj_sim_thread_fault(t, msg);
}

void aj_sim_check_shared_bounds(sim_thread *t, const char *op, uintptr_t a, int32_t bytes)
{
    sim_worker *w = t->w;
    uintptr_t base = (uintptr_t)w->smem;
    if (a >= base && a + (uintptr_t)bytes <= base + (uintptr_t)w->launch->smem_bytes)
        return;
    char msg[256];
    snprintf(msg, sizeof msg, "out-of-bounds shared %s of %d bytes at offset %lld of %d bytes "
             "of shared memory", op, bytes, (long long)(a - base), w->launch->smem_bytes);
    aj_sim_thread_fault(t, msg);
}

/* The access must lie inside one buffer of the launch; the message names
 * the nearest one. */
void aj_sim_check_global_bounds(sim_thread *t, const char *op, uintptr_t a, int32_t bytes)
{
    const aj_sim_launch *launch = t->w->launch;
    const aj_sim_buffer *near = NULL;
    long long near_dist = 0;
    for (int i = 0; i < launch->num_buffers; i++) {
        const aj_sim_buffer *buf = &launch->buffers[i];
        uintptr_t lo = (uintptr_t)buf->base, hi = lo + buf->bytes;
        if (a >= lo && a + (uintptr_t)bytes <= hi) {
            if (launch->buffer_use) {
                const int write = strcmp(op, "store") == 0 || strcmp(op, "red.add") == 0 ||
                                  strcmp(op, "TMA store") == 0;
                atomic_fetch_or(&launch->buffer_use[i], (unsigned char)(write ? 2 : 1));
            }
            return;
        }
        long long dist = a < lo ? (long long)(lo - a) : (long long)(a + (uintptr_t)bytes - hi);
        if (!near || dist < near_dist) {
            near = buf;
            near_dist = dist;
        }
    }
    char msg[512];
    if (near)
        snprintf(msg, sizeof msg,
                 "out-of-bounds global %s of %d bytes at 0x%llx (%lld bytes %s '%s', "
                 "%zu bytes at 0x%llx)", op, bytes, (unsigned long long)a, near_dist,
                 a < (uintptr_t)near->base ? "before" : "past the end of", near->name,
                 near->bytes, (unsigned long long)(uintptr_t)near->base);
    else
        snprintf(msg, sizeof msg, "global %s of %d bytes at 0x%llx: the launch has no buffers",
                 op, bytes, (unsigned long long)a);
    aj_sim_thread_fault(t, msg);
}

/* ---------------------------------------------------------------- strict mode */

static size_t shadow_granules(const aj_sim_launch *launch)
{
    return ((size_t)launch->smem_bytes + GRANULE - 1) / GRANULE + 1;
}

/* xorshift64*: the worker's schedule randomness, seeded per CTA */
static uint32_t next_random(sim_worker *w)
{
    w->rng ^= w->rng >> 12;
    w->rng ^= w->rng << 25;
    w->rng ^= w->rng >> 27;
    return (uint32_t)((w->rng * 0x2545f4914f6cdd1dull) >> 32);
}

/* Whether thread t's access follows one thread `other` made at `stamp`. */
static int ordered_after(const sim_thread *t, int other, uint32_t stamp)
{
    const sim_worker *w = t->w;
    return stamp < w->last_barrier || stamp < t->synced[other];
}

static void report_race(sim_thread *t, const char *op, int bytes, uintptr_t offset,
                        int other, const char *what_other)
{
    char msg[512];
    snprintf(msg, sizeof msg, "shared-memory race: %s of %d bytes at offset %llu %s thread "
             "%d with no barrier in between (bar.sync, bar.warp.sync within a warp, a named "
             "barrier or an mbarrier phase)", op, bytes, (unsigned long long)offset, what_other,
             other);
    aj_sim_thread_fault(t, msg);
}

/* The first reader of shadow s, since the last barrier, that t's write
 * does not follow; -1 if none. */
static int unordered_reader(const sim_thread *t, const smem_shadow *s)
{
    if (s->reader_warp == READERS_NONE || s->read_stamp < t->w->last_barrier)
        return -1;
    int warp = t->tid / WARP;
    if (s->reader_warp == READERS_SEVERAL) {
        int other = s->reader_a / WARP != warp ? s->reader_a : s->reader_b;
        return s->read_stamp >= t->synced[other] ? other : -1;
    }
    if (s->reader_warp != warp)
        return s->read_stamp >= t->synced[s->reader_a] ? s->reader_a : -1;
    uint32_t lanes = s->reader_lanes & ~(1u << (t->tid % WARP));
    for (; lanes; lanes &= lanes - 1) {
        int lane = __builtin_ctz(lanes);
        if (s->read_stamp >= t->synced[warp * WARP + lane])
            return warp * WARP + lane;
    }
    return -1;
}

/* Thread t reads [a, a + bytes) of shared memory. */
void aj_sim_shadow_read(sim_thread *t, const char *op, uintptr_t a, int bytes)
{
    sim_worker *w = t->w;
    uintptr_t offset = a - (uintptr_t)w->smem;
    int warp = t->tid / WARP;
    uintptr_t end = (offset + (uintptr_t)bytes + GRANULE - 1) / GRANULE;
    for (uintptr_t g = offset / GRANULE; g < end; g++) {
        smem_shadow *s = &w->shadow[g];
        if (s->write_stamp && s->writer != t->tid && !ordered_after(t, s->writer, s->write_stamp))
            report_race(t, op, bytes, offset, s->writer,
                        s->write_kind == W_CP_ASYNC_IN_FLIGHT
                            ? "reads a cp.async destination still in flight, issued by"
                        : s->write_kind == W_CP_ASYNC_LANDED
                            ? "reads cp.async data landed by the wait of"
                        : s->write_kind == W_TMA
                            ? "reads what a TMA load wrote, issued by"
                            : "reads what was stored by");
        if (s->reader_warp == READERS_NONE || s->read_stamp < w->last_barrier) {
            s->reader_warp = (int8_t)warp;
            s->reader_lanes = 0;
            s->reader_a = (int16_t)t->tid;
        } else if (s->reader_warp >= 0 && s->reader_warp != warp) {
            s->reader_warp = READERS_SEVERAL;
            s->reader_b = (int16_t)t->tid;
        }
        s->reader_lanes |= 1u << (t->tid % WARP);
        s->read_stamp = w->seq;
    }
}

/* Thread t writes [a, a + bytes) of shared memory, at `stamp`. */
void aj_sim_shadow_write(sim_thread *t, const char *op, uintptr_t a, int bytes,
                         enum write_kind kind, uint32_t stamp)
{
    sim_worker *w = t->w;
    uintptr_t offset = a - (uintptr_t)w->smem;
    uintptr_t end = (offset + (uintptr_t)bytes + GRANULE - 1) / GRANULE;
    for (uintptr_t g = offset / GRANULE; g < end; g++) {
        smem_shadow *s = &w->shadow[g];
        int reader = unordered_reader(t, s);
        if (reader >= 0)
            report_race(t, op, bytes, offset, reader, "overwrites what was read by");
        s->write_stamp = stamp;
        s->writer = (int16_t)t->tid;
        s->write_kind = (uint8_t)kind;
        s->reader_warp = READERS_NONE;
    }
}

/* A bar.sync released (or the CTA starts): every access so far is ordered
 * before every later one. */
static void shadow_barrier(sim_worker *w)
{
    w->last_barrier = ++w->seq;
}

/* Lanes `group` of the warp at `base` completed a bar.warp.sync. */
static void shadow_warp_sync(sim_worker *w, int base, uint32_t group)
{
    uint32_t stamp = ++w->seq;
    for (uint32_t a = group; a; a &= a - 1)
        for (uint32_t b = group; b; b &= b - 1)
            w->threads[base + __builtin_ctz(a)].synced[base + __builtin_ctz(b)] = stamp;
}

/* A new CTA: a barrier (nothing of the last CTA is visible) and its own
 * schedule.  Stamps only grow; before they could wrap, the shadow starts
 * over. */
static void strict_cta_start(sim_worker *w, long cta)
{
    if (w->seq > UINT32_MAX / 2) {
        memset(w->shadow, 0, shadow_granules(w->launch) * sizeof *w->shadow);
        w->seq = 0;
        for (int i = 0; i < w->launch->block_threads; i++)
            memset(w->threads[i].synced, 0,
                   (size_t)w->launch->block_threads * sizeof *w->threads[i].synced);
    }
    shadow_barrier(w);
    uint64_t z = w->run->seed + (uint64_t)cta * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;   /* splitmix64's finaliser */
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    w->rng = (z ^ (z >> 31)) | 1;
    w->preempt_countdown = 1 + next_random(w) % (2 * PREEMPT_EVERY);
}

/* Strict mode: between two accesses of shared memory another lane may run
 * (every PREEMPT_EVERY-th access on average, at random, hands the worker
 * back to the scheduler; a fiber switch costs more than an access). */
static void maybe_preempt(sim_thread *t)
{
    sim_worker *w = t->w;
    if (--w->preempt_countdown > 0)
        return;
    w->preempt_countdown = 1 + next_random(w) % (2 * PREEMPT_EVERY);
    aj_sim_thread_yield(t, T_READY, t->site);
}

/* Every load and store of the kernel: natural alignment (up to 16 bytes)
 * and bounds; bit 0 of `flags` = store, bit 1 = shared memory. */
static void sim_check(sim_thread *t, int64_t addr, int32_t bytes, int32_t flags)
{
    const char *op = flags & ACCESS_STORE ? "store" : "load";
    uintptr_t a = (uintptr_t)addr;
    uintptr_t align = (uintptr_t)(bytes > 16 ? 16 : bytes);
    if (align & (align - 1))
        align = 1;
    aj_sim_check_alignment(t, op, a, bytes, align, flags);
    if (!(flags & ACCESS_SHARED)) {
        aj_sim_check_global_bounds(t, op, a, bytes);
        return;
    }
    aj_sim_check_shared_bounds(t, op, a, bytes);
    if (!t->w->shadow)
        return;
    maybe_preempt(t);
    if (flags & ACCESS_STORE)
        aj_sim_shadow_write(t, "store", a, bytes, W_STORE, t->w->seq);
    else
        aj_sim_shadow_read(t, "load", a, bytes);
}

/* ---------------------------------------------------------------- intrinsics */

static int32_t sim_tid_x(sim_thread *t) { return t->tid; }
static int32_t sim_ctaid_x(sim_thread *t) { return t->w->ctaid[0]; }
static int32_t sim_ctaid_y(sim_thread *t) { return t->w->ctaid[1]; }
static int32_t sim_ctaid_z(sim_thread *t) { return t->w->ctaid[2]; }

static void sim_barrier(sim_thread *t, int32_t site)
{
    aj_sim_thread_yield(t, T_BARRIER, site);
}

/* Joins the warp-collective call whose operands are in t->call; returns
 * once the scheduler has filled t->call.result. */
static void join_warp_call(sim_thread *t, int32_t site, enum warp_op op, uint32_t mask)
{
    t->call.op = op;
    t->call.mask = mask;
    int lane = t->tid % WARP;
    if (!(mask >> lane & 1)) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s with membermask 0x%08x, which leaves out the thread's "
                 "own lane %d", warp_op_name(&t->call), mask, lane);
        aj_sim_thread_fault(t, msg);
    }
    aj_sim_thread_yield(t, T_WARP, site);
}

static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint32_t shuffle(sim_thread *t, int32_t site, enum warp_op op, uint32_t mask,
                        uint32_t value, int32_t b, int32_t c)
{
    t->call.in.shfl.value = value;
    t->call.in.shfl.b = b;
    t->call.in.shfl.c = c;
    join_warp_call(t, site, op, mask);
    return t->call.result[0];
}

#define SHFL_F32(name, op)                                                              \
    static float name(sim_thread *t, int32_t site, int32_t mask, float v, int32_t b,   \
                      int32_t c)                                                        \
    {                                                                                   \
        return u2f(shuffle(t, site, op, (uint32_t)mask, f2u(v), b, c));                 \
    }
SHFL_F32(sim_shfl_idx_f32, OP_SHFL_IDX)
SHFL_F32(sim_shfl_up_f32, OP_SHFL_UP)
SHFL_F32(sim_shfl_down_f32, OP_SHFL_DOWN)
SHFL_F32(sim_shfl_bfly_f32, OP_SHFL_BFLY)
#undef SHFL_F32

static int32_t sim_shfl_idx_i32(sim_thread *t, int32_t site, int32_t mask, int32_t v,
                                int32_t b, int32_t c)
{
    return (int32_t)shuffle(t, site, OP_SHFL_IDX, (uint32_t)mask, (uint32_t)v, b, c);
}

/* vote.sync: the predicate arrives as an i32 0 or 1 (intrinsics.def) */
#define VOTE(name, op)                                                                  \
    static int32_t name(sim_thread *t, int32_t site, int32_t mask, int32_t pred)       \
    {                                                                                   \
        t->call.in.vote.pred = pred;                                                    \
        join_warp_call(t, site, op, (uint32_t)mask);                                    \
        return (int32_t)t->call.result[0];                                              \
    }
VOTE(sim_vote_ballot, OP_VOTE_BALLOT)
VOTE(sim_vote_all, OP_VOTE_ALL)
VOTE(sim_vote_any, OP_VOTE_ANY)
#undef VOTE

/* bar.warp.sync: the lanes of the membermask meet; their shared-memory
 * accesses before it are ordered before those after (strict mode) */
static void sim_bar_warp_sync(sim_thread *t, int32_t site, int32_t mask)
{
    join_warp_call(t, site, OP_BAR_WARP_SYNC, (uint32_t)mask);
}

/* elect.sync: 1 on the one lane the warp's member mask elects, else 0 */
static int32_t sim_elect_sync(sim_thread *t, int32_t site, int32_t mask)
{
    join_warp_call(t, site, OP_ELECT, (uint32_t)mask);
    return (int32_t)t->call.result[0];
}

/* mma.sync.aligned: the whole warp, all 32 lanes; d is the out-pointer of
 * a multi-result row */
#define MMA(name, op)                                                                   \
    static void name(sim_thread *t, int32_t site, int32_t a0, int32_t a1, int32_t a2,  \
                     int32_t a3, int32_t b0, int32_t b1, float c0, float c1, float c2,  \
                     float c3, float *d)                                                \
    {                                                                                   \
        uint32_t a[4] = {(uint32_t)a0, (uint32_t)a1, (uint32_t)a2, (uint32_t)a3};      \
        float c[4] = {c0, c1, c2, c3};                                                  \
        memcpy(t->call.in.mma.a, a, sizeof a);                                          \
        t->call.in.mma.b[0] = (uint32_t)b0;                                             \
        t->call.in.mma.b[1] = (uint32_t)b1;                                             \
        memcpy(t->call.in.mma.c, c, sizeof c);                                          \
        join_warp_call(t, site, op, ALL_LANES);                                         \
        memcpy(d, t->call.result, 4 * sizeof *d);                                       \
    }
MMA(sim_mma_m16n8k16_f16, OP_MMA_F16)
MMA(sim_mma_m16n8k16_bf16, OP_MMA_BF16)
MMA(sim_mma_m16n8k32_e4m3, OP_MMA_E4M3)
MMA(sim_mma_m16n8k32_e5m2, OP_MMA_E5M2)
MMA(sim_mma_m16n8k32_e4m3_e5m2, OP_MMA_E4M3_E5M2)
#undef MMA

/* ldmatrix: lanes 0 .. 8*count-1 pass row addresses, checked here so that
 * a bad one names its thread */
static void ldmatrix(sim_thread *t, int32_t site, int count, int trans, const uint8_t *row)
{
    if (t->tid % WARP < 8 * count) {
        aj_sim_check_alignment(t, "ldmatrix row read", (uintptr_t)row, 16, 16, ACCESS_SHARED);
        aj_sim_check_shared_bounds(t, "ldmatrix row read", (uintptr_t)row, 16);
        if (t->w->shadow)
            aj_sim_shadow_read(t, "ldmatrix row read", (uintptr_t)row, 16);
    }
    t->call.in.ldmatrix.row = row;
    t->call.in.ldmatrix.count = count;
    t->call.in.ldmatrix.trans = trans;
    join_warp_call(t, site, OP_LDMATRIX, ALL_LANES);
}

#define LDMATRIX_1(name, trans)                                                         \
    static int32_t name(sim_thread *t, int32_t site, const uint8_t *row)               \
    {                                                                                   \
        ldmatrix(t, site, 1, trans, row);                                               \
        return (int32_t)t->call.result[0];                                              \
    }
#define LDMATRIX_N(name, count, trans)                                                  \
    static void name(sim_thread *t, int32_t site, const uint8_t *row, uint32_t *out)   \
    {                                                                                   \
        ldmatrix(t, site, count, trans, row);                                           \
        memcpy(out, t->call.result, count * sizeof *out);                               \
    }
LDMATRIX_1(sim_ldmatrix_x1, 0)
LDMATRIX_N(sim_ldmatrix_x2, 2, 0)
LDMATRIX_N(sim_ldmatrix_x4, 4, 0)
LDMATRIX_1(sim_ldmatrix_x1_trans, 1)
LDMATRIX_N(sim_ldmatrix_x2_trans, 2, 1)
LDMATRIX_N(sim_ldmatrix_x4_trans, 4, 1)
#undef LDMATRIX_1
#undef LDMATRIX_N

/* cp.async.cg: 16 bytes, src_bytes of them read now, the rest zeros */
static void cp_async(sim_thread *t, uint8_t *dst, const uint8_t *src, int32_t src_bytes)
{
    if (src_bytes < 0 || src_bytes > 16) {
        char msg[128];
        snprintf(msg, sizeof msg, "cp.async with src-size %d, outside 0..16", src_bytes);
        aj_sim_thread_fault(t, msg);
    }
    aj_sim_check_alignment(t, "cp.async write", (uintptr_t)dst, 16, 16,
                           ACCESS_SHARED | ACCESS_STORE);
    aj_sim_check_shared_bounds(t, "cp.async write", (uintptr_t)dst, 16);
    aj_sim_check_alignment(t, "cp.async read", (uintptr_t)src, 16, 16, 0);
    if (src_bytes > 0)
        aj_sim_check_global_bounds(t, "cp.async read", (uintptr_t)src, src_bytes);
    if (t->w->shadow)
        aj_sim_shadow_write(t, "cp.async write", (uintptr_t)dst, 16, W_CP_ASYNC_IN_FLIGHT,
                     STAMP_IN_FLIGHT);
    if (t->num_copies == t->cap_copies) {
        int cap = t->cap_copies ? 2 * t->cap_copies : 16;
        cp_async_copy *grown = realloc(t->copies, (size_t)cap * sizeof *grown);
        if (!grown)
            aj_sim_thread_fault(t, "cp.async: out of host memory for the copy queue");
        t->copies = grown;
        t->cap_copies = cap;
    }
    cp_async_copy *c = &t->copies[t->num_copies++];
    c->dst = dst;
    c->group = t->groups_committed;
    memset(c->data, 0, sizeof c->data);
    memcpy(c->data, src, (size_t)src_bytes);
}

static void sim_cp_async_16(sim_thread *t, uint8_t *dst, const uint8_t *src)
{
    cp_async(t, dst, src, 16);
}

static void sim_cp_async_16_zfill(sim_thread *t, uint8_t *dst, const uint8_t *src,
                                  int32_t src_bytes)
{
    cp_async(t, dst, src, src_bytes);
}

static void sim_cp_async_commit(sim_thread *t)
{
    t->groups_committed++;
}

/* Lands, in issue order, the copies of groups before `group_limit`. */
static void land_copies(sim_thread *t, int64_t group_limit)
{
    int kept = 0;
    for (int i = 0; i < t->num_copies; i++) {
        cp_async_copy *c = &t->copies[i];
        if (c->group < group_limit) {
            memcpy(c->dst, c->data, sizeof c->data);
            if (t->w->shadow)
                aj_sim_shadow_write(t, "cp.async write", (uintptr_t)c->dst, (int)sizeof c->data,
                             W_CP_ASYNC_LANDED, t->w->seq);
        } else
            t->copies[kept++] = *c;
    }
    t->num_copies = kept;
}

/* wait_group N: all but the N most recent committed groups are complete */
static void sim_cp_async_wait_group(sim_thread *t, int32_t pending)
{
    if (pending < 0)
        aj_sim_thread_fault(t, "cp.async.wait_group with a negative count");
    land_copies(t, t->groups_committed - pending);
}

/* wait_all is commit_group; wait_group 0 */
static void sim_cp_async_wait_all(sim_thread *t)
{
    t->groups_committed++;
    land_copies(t, t->groups_committed);
}

/* red.global.add.f32: checked as a 4-byte store, then a compare-and-swap
 * loop on the bits, since CTAs of one launch run on several host threads */
static void sim_red_add_f32(sim_thread *t, float *addr, float v)
{
    aj_sim_check_alignment(t, "red.add", (uintptr_t)addr, 4, 4, ACCESS_STORE);
    aj_sim_check_global_bounds(t, "red.add", (uintptr_t)addr, 4);
    _Atomic uint32_t *bits = (_Atomic uint32_t *)(void *)addr;
    uint32_t old = atomic_load(bits);
    while (!atomic_compare_exchange_weak(bits, &old, f2u(u2f(old) + v)))
        ;
}

/* ex2.approx.ftz / lg2.approx.ftz: subnormal inputs and results are zero */
static float flush(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }
static float sim_ex2_approx(sim_thread *t, float x) { return flush(exp2f(flush(x))); }
static float sim_lg2_approx(sim_thread *t, float x) { return log2f(flush(x)); }

/* cvt.f32.f16, cvt.rn.f16.f32, cvt.rn.bf16.f32 */
static float sim_cvt_f32_f16(sim_thread *t, uint16_t h) { return aj_f16_to_f32(h); }
static uint16_t sim_cvt_f16_f32(sim_thread *t, float f) { return aj_f32_to_f16(f); }
static uint16_t sim_cvt_bf16_f32(sim_thread *t, float f) { return aj_f32_to_bf16(f); }
static uint16_t sim_cvt_e4m3x2_f32(sim_thread *t, float hi, float lo)
{
    return (uint16_t)(aj_f32_to_f8e4m3(hi) << 8 | aj_f32_to_f8e4m3(lo));
}

static void *sim_smem(sim_thread *t) { return t->w->smem; }

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
    SYM("aj_sim_vote_ballot", sim_vote_ballot),
    SYM("aj_sim_vote_all", sim_vote_all),
    SYM("aj_sim_vote_any", sim_vote_any),
    SYM("aj_sim_bar_warp_sync", sim_bar_warp_sync),
    SYM("aj_sim_mma_m16n8k16_f16", sim_mma_m16n8k16_f16),
    SYM("aj_sim_mma_m16n8k16_bf16", sim_mma_m16n8k16_bf16),
    SYM("aj_sim_mma_m16n8k32_e4m3", sim_mma_m16n8k32_e4m3),
    SYM("aj_sim_mma_m16n8k32_e5m2", sim_mma_m16n8k32_e5m2),
    SYM("aj_sim_mma_m16n8k32_e4m3_e5m2", sim_mma_m16n8k32_e4m3_e5m2),
    SYM("aj_sim_ldmatrix_x1", sim_ldmatrix_x1),
    SYM("aj_sim_ldmatrix_x2", sim_ldmatrix_x2),
    SYM("aj_sim_ldmatrix_x4", sim_ldmatrix_x4),
    SYM("aj_sim_ldmatrix_x1_trans", sim_ldmatrix_x1_trans),
    SYM("aj_sim_ldmatrix_x2_trans", sim_ldmatrix_x2_trans),
    SYM("aj_sim_ldmatrix_x4_trans", sim_ldmatrix_x4_trans),
    SYM("aj_sim_cp_async_16", sim_cp_async_16),
    SYM("aj_sim_cp_async_16_zfill", sim_cp_async_16_zfill),
    SYM("aj_sim_cp_async_commit", sim_cp_async_commit),
    SYM("aj_sim_cp_async_wait_group", sim_cp_async_wait_group),
    SYM("aj_sim_cp_async_wait_all", sim_cp_async_wait_all),
    SYM("aj_sim_red_add_f32", sim_red_add_f32),
    SYM("aj_sim_ex2_approx", sim_ex2_approx),
    SYM("aj_sim_lg2_approx", sim_lg2_approx),
    SYM("aj_sim_cvt_f32_f16", sim_cvt_f32_f16),
    SYM("aj_sim_cvt_f16_f32", sim_cvt_f16_f32),
    SYM("aj_sim_cvt_bf16_f32", sim_cvt_bf16_f32),
    SYM("aj_sim_cvt_e4m3x2_f32", sim_cvt_e4m3x2_f32),
    SYM("aj_sim_smem", sim_smem),
    SYM("aj_sim_check", sim_check),
    SYM("aj_sim_elect_sync", sim_elect_sync),
#define AJ_SIM_HOPPER_ENTRY(name) SYM("aj_sim_" #name, aj_sim_##name),
    AJ_SIM_HOPPER_ENTRIES(AJ_SIM_HOPPER_ENTRY)
    AJ_WGMMA_NS(AJ_SIM_WGMMA_ENTRIES)
#undef AJ_SIM_HOPPER_ENTRY
};
#undef SYM

const aj_host_symbol *aj_sim_symbols(size_t *count)
{
    *count = sizeof symbols / sizeof symbols[0];
    return symbols;
}

/* ---------------------------------------------------------------- warp collectives */

/* The lane whose value lane `lane` receives, by the PTX ISA's shfl.sync
 * rule (c = clamp in bits 0..4, segment mask in bits 8..12). */
static int shuffle_source(const warp_call *call, int lane)
{
    int b = call->in.shfl.b & 31, c = call->in.shfl.c & 31, seg = (call->in.shfl.c >> 8) & 31;
    int max_lane = (lane & seg) | (c & ~seg);
    int min_lane = lane & seg;
    int j = lane, ok = 0;
    switch (call->op) {
    case OP_SHFL_UP:   j = lane - b; ok = j >= max_lane; break;
    case OP_SHFL_DOWN: j = lane + b; ok = j <= max_lane; break;
    case OP_SHFL_BFLY: j = lane ^ b; ok = j <= max_lane; break;
    default:           j = min_lane | (b & ~seg); ok = j <= max_lane; break;
    }
    return ok ? j : lane;
}

static int complete_shuffle(sim_worker *w, sim_thread *warp, int base, uint32_t group)
{
    for (int l = 0; l < WARP; l++) {
        if (!(group >> l & 1))
            continue;
        int j = shuffle_source(&warp[l].call, l);
        if (!(group >> j & 1)) {
            aj_sim_record_fault(w, "thread %d: %s reads lane %d, which is not in its membermask "
                         "0x%08x (the value would be undefined)", base + l,
                         warp_op_name(&warp[l].call), j, group);
            return 0;
        }
        warp[l].call.result[0] = warp[j].call.in.shfl.value;
    }
    return 1;
}

static void complete_vote(sim_thread *warp, uint32_t group)
{
    uint32_t ballot = 0;
    for (int l = 0; l < WARP; l++)
        if (group >> l & 1 && warp[l].call.in.vote.pred)
            ballot |= 1u << l;
    for (int l = 0; l < WARP; l++) {
        if (!(group >> l & 1))
            continue;
        switch (warp[l].call.op) {
        case OP_VOTE_BALLOT: warp[l].call.result[0] = ballot; break;
        case OP_VOTE_ALL: warp[l].call.result[0] = ballot == group; break;
        default: warp[l].call.result[0] = ballot != 0; break;
        }
    }
}

/* The element types of an mma op's A and B. */
static void mma_types(int op, aj_dtype *a, aj_dtype *b)
{
    switch (op) {
    case OP_MMA_F16: *a = *b = AJ_DTYPE_F16; break;
    case OP_MMA_BF16: *a = *b = AJ_DTYPE_BF16; break;
    case OP_MMA_E4M3: *a = *b = AJ_DTYPE_F8E4M3; break;
    case OP_MMA_E5M2: *a = *b = AJ_DTYPE_F8E5M2; break;
    default: *a = AJ_DTYPE_F8E4M3; *b = AJ_DTYPE_F8E5M2; break;
    }
}

/*
 * mma.m16n8k16 (f16, bf16) and mma.m16n8k32 (e4m3, e5m2), f32
 * accumulation: E elements a register (2 or 4), K = 8 E.  Lane 4g + t
 * holds (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point
 * type" and "... for mma.m16n8k32"; element e of a register, lowest
 * first):
 *
 *   A 16xK, a[r] element e at            B Kx8, b[r] element e at
 *     row g + 8 (r & 1),                   k E t + 4E r + e,
 *     col E t + 4E (r >> 1) + e            col g
 *
 *   C, D 16x8, c[i] at row g + 8 (i >> 1), col 2t + (i & 1)
 *
 * The products of the inputs are exact in double, and so is their sum
 * with c in all but extreme cases; the result is rounded to f32 once.
 * (Tensor cores round the sum differently in the last bits; kernels are
 * tested against tolerances that allow for that.)
 */
static void complete_mma(sim_thread *warp, int op)
{
    aj_dtype ta, tb;
    mma_types(op, &ta, &tb);
    const int E = 4 / aj_dtype_size(ta), K = 8 * E;
    double a[16][32], b[32][8], d[16][8];
    for (int lane = 0; lane < WARP; lane++) {
        const warp_call *c = &warp[lane].call;
        int g = lane >> 2, t = lane & 3;
        for (int r = 0; r < 4; r++)
            for (int e = 0; e < E; e++)
                a[g + 8 * (r & 1)][E * t + 4 * E * (r >> 1) + e] =
                    aj_fragment_element(ta, c->in.mma.a[r], e);
        for (int r = 0; r < 2; r++)
            for (int e = 0; e < E; e++)
                b[E * t + 4 * E * r + e][g] = aj_fragment_element(tb, c->in.mma.b[r], e);
        for (int i = 0; i < 4; i++)
            d[g + 8 * (i >> 1)][2 * t + (i & 1)] = c->in.mma.c[i];
    }
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 8; n++)
            for (int k = 0; k < K; k++)
                d[m][n] += a[m][k] * b[k][n];
    for (int lane = 0; lane < WARP; lane++) {
        int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; i++)
            warp[lane].call.result[i] = f2u((float)d[g + 8 * (i >> 1)][2 * t + (i & 1)]);
    }
}

static uint32_t element16(const uint8_t *row, int col)
{
    uint16_t v;
    memcpy(&v, row + 2 * col, 2);
    return v;
}

/*
 * ldmatrix.m8n8.b16: lane 8m + r gave the address of row r of matrix m.
 * Lane 4g + t receives, in result[m], two 16-bit elements (lo, hi):
 *
 *            cols 0,1  2,3  4,5  6,7              .trans: lane 4g + t gets
 *   row 0      T0   T1   T2   T3                  column g, rows 2t, 2t+1
 *   row 1      T4   T5   T6   T7                  (the fragment of the
 *   ...                                            transposed matrix)
 *   row 7      T28  T29  T30  T31
 */
static void complete_ldmatrix(sim_thread *warp)
{
    int count = warp[0].call.in.ldmatrix.count, trans = warp[0].call.in.ldmatrix.trans;
    for (int m = 0; m < count; m++)
        for (int lane = 0; lane < WARP; lane++) {
            int g = lane >> 2, t = lane & 3;
            const sim_thread *rows = &warp[8 * m];
            uint32_t lo, hi;
            if (trans) {
                lo = element16(rows[2 * t].call.in.ldmatrix.row, g);
                hi = element16(rows[2 * t + 1].call.in.ldmatrix.row, g);
            } else {
                lo = element16(rows[g].call.in.ldmatrix.row, 2 * t);
                hi = element16(rows[g].call.in.ldmatrix.row, 2 * t + 1);
            }
            warp[lane].call.result[m] = lo | hi << 16;
        }
}

/* Computes the results of the call that every lane of `group` waits at;
 * 0 after recording a fault. */
static int complete_warp_call(sim_worker *w, sim_thread *warp, int base, uint32_t group)
{
    int lead = __builtin_ctz(group);
    switch (warp[lead].call.op) {
    case OP_SHFL_IDX:
    case OP_SHFL_UP:
    case OP_SHFL_DOWN:
    case OP_SHFL_BFLY:
        return complete_shuffle(w, warp, base, group);
    case OP_VOTE_BALLOT:
    case OP_VOTE_ALL:
    case OP_VOTE_ANY:
        complete_vote(warp, group);
        break;
    case OP_MMA_F16:
    case OP_MMA_BF16:
    case OP_MMA_E4M3:
    case OP_MMA_E5M2:
    case OP_MMA_E4M3_E5M2:
        complete_mma(warp, warp[lead].call.op);
        break;
    case OP_LDMATRIX:
        complete_ldmatrix(warp);
        break;
    case OP_BAR_WARP_SYNC:
        if (w->shadow)
            shadow_warp_sync(w, base, group);
        break;
    case OP_ELECT:
        /* the PTX ISA asks only that the choice be deterministic for a
         * mask; the emulator elects the lowest lane */
        for (uint32_t l = group; l; l &= l - 1)
            warp[__builtin_ctz(l)].call.result[0] = (int)__builtin_ctz(l) == lead;
        break;
    }
    return 1;
}

/* The lanes that wait at the same call as `lead`, with the same mask. */
static uint32_t lanes_meeting(const sim_thread *warp, int lanes, int lead)
{
    uint32_t group = 0;
    for (int l = 0; l < lanes; l++)
        if (warp[l].state == T_WARP && warp[l].site == warp[lead].site &&
            warp[l].call.mask == warp[lead].call.mask)
            group |= 1u << l;
    return group;
}

/* Completes every warp-collective call whose lanes have all arrived. */
static int settle_warps(sim_worker *w, int nthreads)
{
    int released = 0;
    for (int base = 0; base < nthreads; base += WARP) {
        sim_thread *warp = &w->threads[base];
        int lanes = nthreads - base < WARP ? nthreads - base : WARP;
        uint32_t waiting = 0;
        for (int l = 0; l < lanes; l++)
            if (warp[l].state == T_WARP)
                waiting |= 1u << l;
        while (waiting) {
            uint32_t group = lanes_meeting(warp, lanes, __builtin_ctz(waiting));
            waiting &= ~group;
            if (group != warp[__builtin_ctz(group)].call.mask)
                continue;
            if (!complete_warp_call(w, warp, base, group))
                return released;
            for (int l = 0; l < lanes; l++)
                if (group >> l & 1) {
                    warp[l].state = T_READY;
                    released++;
                }
        }
    }
    return released;
}

/* ---------------------------------------------------------------- scheduling */

/* Releases the barrier when every thread waits at the same one. */
static int settle_barrier(sim_worker *w, int nthreads)
{
    for (int i = 0; i < nthreads; i++)
        if (w->threads[i].state != T_BARRIER || w->threads[i].site != w->threads[0].site)
            return 0;
    for (int i = 0; i < nthreads; i++)
        w->threads[i].state = T_READY;
    if (w->shadow)
        shadow_barrier(w);
    return nthreads;
}

/* Thread `tid` waits in a warp collective that can never complete: name
 * the first lane it waits for and what that lane does instead. */
static void diagnose_warp_wait(sim_worker *w, int nthreads, int tid)
{
    const sim_thread *t = &w->threads[tid];
    int base = tid - tid % WARP;
    const sim_thread *warp = &w->threads[base];
    int lanes = nthreads - base < WARP ? nthreads - base : WARP;
    uint32_t missing = t->call.mask & ~lanes_meeting(warp, lanes, tid - base);
    int lane = __builtin_ctz(missing);
    char who[192], mask[64];
    if (t->call.op == OP_MMA_F16 || t->call.op == OP_MMA_BF16 || t->call.op == OP_MMA_E4M3 ||
        t->call.op == OP_MMA_E5M2 || t->call.op == OP_LDMATRIX)
        snprintf(mask, sizeof mask, "all 32 lanes of the warp");
    else
        snprintf(mask, sizeof mask, "membermask 0x%08x", t->call.mask);
    if (lane >= lanes)
        snprintf(who, sizeof who, "lane %d does not exist (the CTA has %d threads)", lane,
                 nthreads);
    else if (warp[lane].state == T_DONE)
        snprintf(who, sizeof who, "lane %d has exited", lane);
    else if (warp[lane].state == T_BARRIER)
        snprintf(who, sizeof who, "lane %d waits at a barrier", lane);
    else if (warp[lane].site != t->site)
        snprintf(who, sizeof who, "lane %d waits in %s at another call", lane,
                 warp_op_name(&warp[lane].call));
    else
        snprintf(who, sizeof who, "lane %d waits at the same call with membermask 0x%08x",
                 lane, warp[lane].call.mask);
    aj_sim_record_fault(w, "deadlock: thread %d waits in %s (%s) for lanes 0x%08x; %s", tid,
                 warp_op_name(&t->call), mask, missing, who);
}

/* Nothing can move: say why, as precisely as the states allow. */
static void diagnose_stall(sim_worker *w, int nthreads)
{
    int at_barrier = -1, other_barrier = -1, done = -1, at_warp = -1;
    for (int i = 0; i < nthreads; i++) {
        const sim_thread *t = &w->threads[i];
        if (t->state == T_HOPPER) {
            aj_sim_hopper_diagnose(w, i);
            return;
        }
        if (t->state == T_BARRIER) {
            if (at_barrier < 0)
                at_barrier = i;
            else if (t->site != w->threads[at_barrier].site && other_barrier < 0)
                other_barrier = i;
        } else if (t->state == T_DONE && done < 0) {
            done = i;
        } else if (t->state == T_WARP && at_warp < 0) {
            at_warp = i;
        }
    }
    if (at_barrier >= 0 && other_barrier >= 0)
        aj_sim_record_fault(w, "barrier divergence: thread %d waits at barrier call #%d, thread %d "
                     "at barrier call #%d", at_barrier, w->threads[at_barrier].site,
                     other_barrier, w->threads[other_barrier].site);
    else if (at_warp >= 0)
        diagnose_warp_wait(w, nthreads, at_warp);
    else if (at_barrier >= 0 && done >= 0)
        aj_sim_record_fault(w, "barrier divergence: thread %d waits at a barrier that thread %d "
                     "never reaches (it has exited)", at_barrier, done);
    else
        aj_sim_record_fault(w, "deadlock: no thread of the CTA can proceed");
}

static void thread_main(unsigned lo, unsigned hi)
{
    sim_thread *t = (sim_thread *)(((uintptr_t)hi << 32) | (uintptr_t)lo);
    fiber_started(t);
    t->w->launch->entry(t, t->w->launch->args);
    t->state = T_DONE;
    switch_to_scheduler(t, 1);
}

/* A fresh fiber for t at thread_main.  (A function of its own: getcontext
 * returns twice, and no caller variable may live across it.) */
static __attribute__((noinline)) void prepare_fiber(sim_thread *t)
{
    t->instructions = 0;
    t->state = T_READY;
    t->num_copies = 0;
    t->groups_committed = 0;
    t->started = false;
    getcontext(&t->uc);
    t->uc.uc_stack.ss_sp = t->stack;
    t->uc.uc_stack.ss_size = STACK_BYTES;
    t->uc.uc_link = NULL;
    uintptr_t p = (uintptr_t)t;
    makecontext(&t->uc, (void (*)(void))thread_main, 2, (unsigned)(p & 0xffffffffu),
                (unsigned)(p >> 32));
}

/* The order of the next sweep: 0..n-1, or in strict mode a random
 * permutation (Fisher-Yates). */
static void sweep_order(sim_worker *w, int n)
{
    for (int i = 0; i < n; i++)
        w->order[i] = i;
    if (!w->shadow)
        return;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(next_random(w) % (uint32_t)(i + 1));
        int k = w->order[i];
        w->order[i] = w->order[j];
        w->order[j] = k;
    }
}

static void run_cta(sim_worker *w, long cta)
{
    int n = w->launch->block_threads;
    memset(w->smem, 0xff, (size_t)w->launch->smem_bytes);   /* NaN: unwritten reads show */
    if (w->shadow)
        strict_cta_start(w, cta);
    aj_sim_hopper_cta_start(w);
    for (int i = 0; i < n; i++)
        prepare_fiber(&w->threads[i]);
    for (;;) {
        int ran = 0;
        sweep_order(w, n);
        for (int i = 0; i < n && !w->faulted; i++) {
            sim_thread *t = &w->threads[w->order[i]];
            if (t->state != T_READY)
                continue;
            switch_to_fiber(w, t);
            ran++;
        }
        if (w->faulted)
            return;
        int released = settle_warps(w, n);
        if (w->faulted)
            return;
        released += settle_barrier(w, n);
        released += aj_sim_hopper_settle(w);
        if (w->faulted)
            return;
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
        run_cta(w, c);
    }
    return NULL;
}

/* ---------------------------------------------------------------- setup */

static void free_worker(sim_worker *w, int nthreads)
{
    if (w->threads)
        for (int i = 0; i < nthreads; i++) {
            if (w->threads[i].stack)
                munmap(w->threads[i].stack - getpagesize(), STACK_BYTES + (size_t)getpagesize());
            tsan_fiber_destroy(&w->threads[i]);
            free(w->threads[i].copies);
            free(w->threads[i].synced);
        }
    free(w->threads);
    free(w->smem);
    free(w->shadow);
    free(w->order);
    aj_sim_hopper_cta_free(w->hop);
}

static int init_worker(sim_worker *w, sim_run *run, int nthreads)
{
    memset(w, 0, sizeof *w);
    w->launch = run->launch;
    w->run = run;
    w->threads = calloc((size_t)nthreads, sizeof *w->threads);
    w->smem = aligned_alloc(16, ((size_t)run->launch->smem_bytes + 15) / 16 * 16 + 16);
    w->order = malloc((size_t)nthreads * sizeof *w->order);
    if (run->strict)
        w->shadow = calloc(shadow_granules(run->launch), sizeof *w->shadow);
    w->hop = aj_sim_hopper_cta_new(run->launch, nthreads, run->strict);
    if (!w->threads || !w->smem || !w->order || (run->strict && !w->shadow) || !w->hop)
        return -1;
    size_t page = (size_t)getpagesize();
    for (int i = 0; i < nthreads; i++) {
        sim_thread *t = &w->threads[i];
        t->w = w;
        t->tid = i;
        if (run->strict && !(t->synced = calloc((size_t)nthreads, sizeof *t->synced)))
            return -1;
        /* a PROT_NONE page below each stack turns an overflow into a crash
         * at the guard, not silent corruption of a neighbour */
        char *m = mmap(NULL, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            return -1;
        mprotect(m, page, PROT_NONE);
        t->stack = m + page;
        tsan_fiber_create(t);
    }
    return 0;
}

/* Strict unless AJ_SIM_STRICT=0; the seed is the launch's, else
 * AJ_SIM_SEED's (a number, or `random` for one from the clock), else 1. */
static void sim_strictness(const aj_sim_launch *launch, int *strict, uint64_t *seed)
{
    const char *env = getenv("AJ_SIM_STRICT");
    *strict = !(env && strcmp(env, "0") == 0);
    *seed = launch->seed;
    env = getenv("AJ_SIM_SEED");
    if (!*seed && env && strcmp(env, "random") == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        *seed = (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec;
    } else if (!*seed && env && *env) {
        *seed = strtoull(env, NULL, 0);
    }
    if (!*seed)
        *seed = 1;
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
    sim_strictness(launch, &run.strict, &run.seed);
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
