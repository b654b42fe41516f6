/*
 * hopper.c -- sm_90's asynchronous machinery on the emulator (hopper.h).
 *
 * Three kinds of wait join the scheduler's (emulator.c), each a thread in
 * state T_HOPPER with t->hop.wait saying which:
 *
 *   mbarrier phase   try_wait.parity P returns at once if the phase of
 *                    parity P is the one before the current; else the
 *                    thread sleeps until the current phase completes
 *   named barrier    bar.sync id, count sleeps until `count` threads have
 *                    arrived at id (bar.sync or bar.arrive); the last
 *                    arrival releases the sleepers
 *   warpgroup        setmaxnreg and wgmma: the 128 threads of a warpgroup
 *                    meet at one call; setmaxnreg.inc also waits for the
 *                    CTA's register pool
 *
 * wgmma.mma_async computes when its warpgroup meets; each thread's results
 * wait in its queue (its accumulators read NaN meanwhile) until the
 * wait_group covering their commit group lands them.  A TMA load lands its
 * box at issue and completes its bytes on the mbarrier; a TMA store writes
 * at issue.
 *
 * An mbarrier (PTX ISA, "Parallel Synchronization and Communication
 * Instructions: mbarrier") lives in the CTA's table, found
 * by its shared-memory offset, never in the 8 bytes themselves:
 *
 *     init(count)      pending = expected = count, tx = 0, phase 0
 *     arrive           pending -= 1
 *     expect_tx(n)     tx += n          (arrive.expect_tx: then arrive)
 *     complete_tx(n)   tx -= n
 *     pending == 0 and tx == 0  ──►  phase += 1, pending = expected
 *
 * Orders for the race detector (strict mode): a completion (an mbarrier
 * phase, a named barrier's round) takes a fresh stamp C of the sync
 * counter, and a thread that waited for it is ordered after the accesses
 * each arriver made before C (t->synced[arriver] = C, emulator.c): the
 * release / acquire of mbarrier.arrive and try_wait, bar.arrive and
 * bar.sync.  An arriver's accesses between its arrival and C count as
 * ordered too -- the shadow keeps one read stamp for all readers of a
 * granule, so a finer rule would blame a reader that did arrive for a
 * later one's read.
 *
 * The async proxy's hazards (strict mode): a wgmma's shared reads stay in
 * flight until the wait_group covering it (async_read, wgmma_reads_done),
 * so a TMA or store over its stage before then is a race; generic writes
 * it or a TMA store reads need a fence.proxy.async of their writer
 * (unfenced_writer); accumulators hold ACC_IN_FLIGHT until the wait and
 * must not change in between, and a wgmma on accumulators written since
 * the last wait needs a wgmma.fence (accumulator_in).
 *
 * A wait that can never end is a fault with the barrier's counts, never a
 * hang: the scheduler calls aj_sim_hopper_diagnose when nothing can move.
 */
#define _GNU_SOURCE
#include "runtime/sim/hopper.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/dtype.h"
#include "runtime/sim/sim_internal.h"

#define MAX_MBARRIERS 64
#define NAMED_BARRIERS 16
#define WARPGROUP 128
#define REGISTER_FILE 65536
#define MBARRIER_LIMIT ((1 << 20) - 1)   /* counts and tx-count: 20 bits */

enum warpgroup_op {
    WG_SETMAXNREG_INC, WG_SETMAXNREG_DEC,
    WG_WGMMA_FENCE, WG_WGMMA_COMMIT, WG_WGMMA_WAIT, WG_WGMMA,
};

/* A wgmma's results for one thread, waiting for the wait_group that lands
 * them in its accumulators. */
typedef struct wgmma_result {
    float *acc;
    int64_t group;             /* the commit group it belongs to */
    int n;                     /* accumulators: N / 2 */
    float d[128];
} wgmma_result;

/* Accumulators a thread's wait_group landed, with a checksum of what it
 * landed: a later wgmma finds whether they were written since. */
#define LANDED_ACCS 8
typedef struct landed_acc {
    float *acc;
    uint64_t sum;
} landed_acc;

typedef struct wgmma_queue {
    wgmma_result *items;       /* in issue order */
    int num, cap;
    int64_t committed;         /* commit groups closed so far */
    landed_acc landed[LANDED_ACCS];
    int num_landed;
    /* strict, a warpgroup's first thread: the shared operands of the
     * wgmmas its commit groups read, until a wait_group covers them */
    struct wgmma_read { uint32_t lo, hi; int64_t group; } *reads;
    int num_reads, cap_reads;
} wgmma_queue;

typedef struct mbarrier {
    uint32_t offset;           /* in shared memory */
    int32_t expected, pending, tx;
    uint32_t phase;            /* phases completed since init */
    /* strict: per thread, whether it arrived in the current phase, and
     * the stamp of the last completed phase it arrived at (0: none);
     * NULL otherwise */
    uint32_t *arrived, *released;
} mbarrier;

typedef struct named_barrier {
    int32_t count;             /* of the round in progress; 0: none */
    int32_t arrived;
    uint32_t *arrived_at;      /* strict: per thread, whether it arrived this round */
} named_barrier;

struct aj_sim_hopper_cta {
    int nthreads;
    int32_t launch_registers;  /* per thread, every warp at CTA start */
    mbarrier mbarriers[MAX_MBARRIERS];
    int num_mbarriers;
    named_barrier named[NAMED_BARRIERS];
    int32_t *warp_registers;   /* per warp: registers per thread */
    wgmma_queue *wgmma;        /* per thread */
    double mma_a[64][16], mma_b[256][16];   /* a wgmma's operands */
    uint32_t read_lo, read_hi;              /* the shared bytes it reads */
    uint32_t *stamps;          /* strict: the arrays above, nthreads each */
};

static const char *warpgroup_op_name(int op)
{
    static const char *const names[] = {
        [WG_SETMAXNREG_INC] = "setmaxnreg.inc.sync.aligned.u32",
        [WG_SETMAXNREG_DEC] = "setmaxnreg.dec.sync.aligned.u32",
        [WG_WGMMA_FENCE] = "wgmma.fence.sync.aligned",
        [WG_WGMMA_COMMIT] = "wgmma.commit_group.sync.aligned",
        [WG_WGMMA_WAIT] = "wgmma.wait_group.sync.aligned",
        [WG_WGMMA] = "wgmma.mma_async.sync.aligned.m64nNk16",
    };
    return names[op];
}

/* ---------------------------------------------------------------- CTA state */

static int32_t default_registers(const aj_sim_launch *launch, int nthreads)
{
    if (launch->registers > 0)
        return launch->registers;
    int warps = (nthreads + WARP - 1) / WARP;
    int32_t per_thread = REGISTER_FILE / (warps * WARP) / 8 * 8;
    return per_thread > 256 ? 256 : per_thread;
}

aj_sim_hopper_cta *aj_sim_hopper_cta_new(const aj_sim_launch *launch, int nthreads, int strict)
{
    aj_sim_hopper_cta *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->nthreads = nthreads;
    h->launch_registers = default_registers(launch, nthreads);
    h->warp_registers = calloc((size_t)(nthreads + WARP - 1) / WARP, sizeof *h->warp_registers);
    h->wgmma = calloc((size_t)nthreads, sizeof *h->wgmma);
    size_t arrays = 2 * MAX_MBARRIERS + NAMED_BARRIERS;
    if (strict)
        h->stamps = calloc(arrays * (size_t)nthreads, sizeof *h->stamps);
    if (!h->warp_registers || !h->wgmma || (strict && !h->stamps)) {
        aj_sim_hopper_cta_free(h);
        return NULL;
    }
    if (strict) {
        uint32_t *next = h->stamps;
        for (int i = 0; i < MAX_MBARRIERS; i++) {
            h->mbarriers[i].arrived = next;
            h->mbarriers[i].released = next + nthreads;
            next += 2 * nthreads;
        }
        for (int i = 0; i < NAMED_BARRIERS; i++, next += nthreads)
            h->named[i].arrived_at = next;
    }
    return h;
}

void aj_sim_hopper_cta_free(aj_sim_hopper_cta *h)
{
    if (!h)
        return;
    for (int i = 0; h->wgmma && i < h->nthreads; i++) {
        free(h->wgmma[i].items);
        free(h->wgmma[i].reads);
    }
    free(h->wgmma);
    free(h->warp_registers);
    free(h->stamps);
    free(h);
}

void aj_sim_hopper_cta_start(sim_worker *w)
{
    aj_sim_hopper_cta *h = w->hop;
    h->num_mbarriers = 0;
    for (int i = 0; i < NAMED_BARRIERS; i++)
        h->named[i].count = h->named[i].arrived = 0;
    if (h->stamps)
        memset(h->stamps, 0,
               (2 * MAX_MBARRIERS + NAMED_BARRIERS) * (size_t)h->nthreads * sizeof *h->stamps);
    for (int i = 0; i < (h->nthreads + WARP - 1) / WARP; i++)
        h->warp_registers[i] = h->launch_registers;
    for (int i = 0; i < h->nthreads; i++) {
        memset(&w->threads[i].hop, 0, sizeof w->threads[i].hop);
        h->wgmma[i].num = 0;
        h->wgmma[i].committed = 0;
        h->wgmma[i].num_landed = 0;
        h->wgmma[i].num_reads = 0;
    }
}

/* ---------------------------------------------------------------- ordering */

/* Thread t's arrival: its accesses are released at the completion it
 * takes part in. */
static void note_arrival(sim_thread *t, uint32_t *arrived)
{
    if (arrived)
        arrived[t->tid] = 1;
}

/* A completion: the arrivers' marks become its stamp in `released` (which
 * may be `arrived` itself). */
static void stamp_completion(sim_worker *w, uint32_t *arrived, uint32_t *released)
{
    if (!arrived)
        return;
    uint32_t stamp = ++w->seq;
    for (int u = 0; u < w->hop->nthreads; u++) {
        uint32_t came = arrived[u];
        arrived[u] = 0;
        released[u] = came ? stamp : 0;
    }
}

/* Thread t acquires what the arrivers at a completion released. */
static void acquire(sim_thread *t, const uint32_t *released)
{
    if (!released || !t->synced)
        return;
    for (int u = 0; u < t->w->hop->nthreads; u++)
        if (released[u] > t->synced[u])
            t->synced[u] = released[u];
}

/* ---------------------------------------------------------------- mbarrier */

static _Noreturn void thread_faultf(sim_thread *t, const char *fmt, ...) AJ_PRINTF(2, 3);

static _Noreturn void thread_faultf(sim_thread *t, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    aj_sim_thread_fault(t, msg);
}

/* The mbarrier at `bar` (8 bytes of shared memory, 8-aligned); with
 * `create` a new entry when there is none, else a fault naming `op`. */
static mbarrier *mbarrier_at(sim_thread *t, const char *op, const uint8_t *bar, int create)
{
    aj_sim_check_alignment(t, op, (uintptr_t)bar, 8, 8, ACCESS_SHARED);
    aj_sim_check_shared_bounds(t, op, (uintptr_t)bar, 8);
    aj_sim_hopper_cta *h = t->w->hop;
    uint32_t offset = (uint32_t)(bar - t->w->smem);
    for (int i = 0; i < h->num_mbarriers; i++)
        if (h->mbarriers[i].offset == offset)
            return &h->mbarriers[i];
    if (!create)
        thread_faultf(t, "%s at shared offset %u, where no mbarrier.init made an mbarrier", op,
                      offset);
    if (h->num_mbarriers == MAX_MBARRIERS)
        thread_faultf(t, "%s at shared offset %u: more than %d mbarriers in one CTA", op,
                      offset, MAX_MBARRIERS);
    mbarrier *m = &h->mbarriers[h->num_mbarriers++];
    m->offset = offset;
    return m;
}

/* Completes the current phase once every arrival and transaction is in. */
static void mbarrier_advance(sim_worker *w, mbarrier *m)
{
    if (m->pending > 0 || m->tx != 0)
        return;
    m->phase++;
    m->pending = m->expected;
    stamp_completion(w, m->arrived, m->released);
}

void aj_sim_mbarrier_init(sim_thread *t, uint8_t *bar, int32_t count)
{
    mbarrier *m = mbarrier_at(t, "mbarrier.init", bar, 1);
    if (count < 1 || count > MBARRIER_LIMIT)
        thread_faultf(t, "mbarrier.init at shared offset %u with count %d, outside 1..%d",
                      m->offset, count, MBARRIER_LIMIT);
    m->expected = m->pending = count;
    m->tx = 0;
    m->phase = 0;
    if (m->arrived) {
        memset(m->arrived, 0, (size_t)t->w->hop->nthreads * sizeof *m->arrived);
        memset(m->released, 0, (size_t)t->w->hop->nthreads * sizeof *m->released);
    }
}

static void mbarrier_add_tx(sim_thread *t, mbarrier *m, const char *op, int32_t tx)
{
    if (tx < 0 || tx > MBARRIER_LIMIT)
        thread_faultf(t, "%s at shared offset %u with %d bytes, outside 0..%d", op, m->offset,
                      tx, MBARRIER_LIMIT);
    int64_t sum = (int64_t)m->tx + tx;
    if (sum > MBARRIER_LIMIT)
        thread_faultf(t, "%s at shared offset %u: tx-count %d + %d exceeds %d", op, m->offset,
                      m->tx, tx, MBARRIER_LIMIT);
    m->tx = (int32_t)sum;
}

static void mbarrier_arrive(sim_thread *t, mbarrier *m, const char *op)
{
    if (m->pending == 0)
        thread_faultf(t, "%s at shared offset %u: every one of its %d arrivals is in, the "
                      "phase waits for tx-count %d", op, m->offset, m->expected, m->tx);
    note_arrival(t, m->arrived);
    m->pending--;
    mbarrier_advance(t->w, m);
}

void aj_sim_mbarrier_arrive(sim_thread *t, uint8_t *bar)
{
    mbarrier_arrive(t, mbarrier_at(t, "mbarrier.arrive", bar, 0), "mbarrier.arrive");
}

void aj_sim_mbarrier_arrive_expect_tx(sim_thread *t, uint8_t *bar, int32_t tx)
{
    static const char op[] = "mbarrier.arrive.expect_tx";
    mbarrier *m = mbarrier_at(t, op, bar, 0);
    mbarrier_add_tx(t, m, op, tx);
    mbarrier_arrive(t, m, op);
}

void aj_sim_mbarrier_expect_tx(sim_thread *t, uint8_t *bar, int32_t tx)
{
    static const char op[] = "mbarrier.expect_tx";
    mbarrier_add_tx(t, mbarrier_at(t, op, bar, 0), op, tx);
}

static void mbarrier_complete_tx(sim_thread *t, mbarrier *m, const char *op, int32_t tx)
{
    if (tx < 0 || tx > MBARRIER_LIMIT || m->tx - tx < -MBARRIER_LIMIT)
        thread_faultf(t, "%s at shared offset %u with %d bytes: tx-count %d would leave "
                      "-%d..%d", op, m->offset, tx, m->tx, MBARRIER_LIMIT, MBARRIER_LIMIT);
    note_arrival(t, m->arrived);
    m->tx -= tx;
    mbarrier_advance(t->w, m);
}

void aj_sim_mbarrier_complete_tx(sim_thread *t, uint8_t *bar, int32_t tx)
{
    static const char op[] = "mbarrier.complete_tx";
    mbarrier_complete_tx(t, mbarrier_at(t, op, bar, 0), op, tx);
}

int32_t aj_sim_mbarrier_try_wait_parity(sim_thread *t, uint8_t *bar, int32_t parity)
{
    mbarrier *m = mbarrier_at(t, "mbarrier.try_wait.parity", bar, 0);
    if (parity != 0 && parity != 1)
        thread_faultf(t, "mbarrier.try_wait.parity at shared offset %u with parity %d, not 0 "
                      "or 1", m->offset, parity);
    if ((int32_t)(m->phase & 1) == parity) {   /* the current phase: sleep until it completes */
        t->hop.wait = AJ_SIM_WAIT_MBARRIER;
        t->hop.mbarrier = (int32_t)(m - t->w->hop->mbarriers);
        t->hop.parity = parity;
        aj_sim_thread_yield(t, T_HOPPER, t->site);
    }
    acquire(t, m->released);
    return 1;
}

/* ---------------------------------------------------------------- named barriers */

static void named_barrier_arrive(sim_thread *t, int32_t id, int32_t count, int wait)
{
    const char *op = wait ? "bar.sync" : "bar.arrive";
    aj_sim_hopper_cta *h = t->w->hop;
    int32_t warps_threads = (h->nthreads + WARP - 1) / WARP * WARP;
    if (id < 0 || id >= NAMED_BARRIERS)
        thread_faultf(t, "%s %d, %d: barrier ids are 0..%d", op, id, count, NAMED_BARRIERS - 1);
    if (count < WARP || count % WARP || count > warps_threads)
        thread_faultf(t, "%s %d, %d: the thread count must be a multiple of %d in %d..%d (the "
                      "CTA's warps)", op, id, count, WARP, WARP, warps_threads);
    named_barrier *nb = &h->named[id];
    if (nb->arrived && nb->count != count)
        thread_faultf(t, "%s %d, %d: barrier %d's round in progress counts %d threads", op,
                      id, count, id, nb->count);
    nb->count = count;
    nb->arrived++;
    note_arrival(t, nb->arrived_at);
    if (nb->arrived < count) {
        if (wait) {
            t->hop.wait = AJ_SIM_WAIT_NAMED_BARRIER;
            t->hop.bar_id = id;
            aj_sim_thread_yield(t, T_HOPPER, t->site);
        }
        return;
    }
    /* the last arrival: release the round's sleepers, and this thread */
    stamp_completion(t->w, nb->arrived_at, nb->arrived_at);
    for (int i = 0; i < h->nthreads; i++) {
        sim_thread *u = &t->w->threads[i];
        if (u->state == T_HOPPER && u->hop.wait == AJ_SIM_WAIT_NAMED_BARRIER &&
            u->hop.bar_id == id) {
            acquire(u, nb->arrived_at);
            u->state = T_READY;
        }
    }
    if (wait)
        acquire(t, nb->arrived_at);
    nb->count = nb->arrived = 0;
    if (nb->arrived_at)
        memset(nb->arrived_at, 0, (size_t)h->nthreads * sizeof *nb->arrived_at);
}

void aj_sim_named_bar_sync(sim_thread *t, int32_t site, int32_t id, int32_t count)
{
    t->site = site;
    named_barrier_arrive(t, id, count, 1);
}

void aj_sim_named_bar_arrive(sim_thread *t, int32_t site, int32_t id, int32_t count)
{
    t->site = site;
    named_barrier_arrive(t, id, count, 0);
}

/* ---------------------------------------------------------------- fence, setmaxnreg */

void aj_sim_fence_proxy_async(sim_thread *t)
{
    t->hop.proxy_fence = ++t->w->seq;
}

static void warpgroup_join(sim_thread *t, int32_t site, enum warpgroup_op op, int32_t value)
{
    int g = t->tid / WARPGROUP;
    if ((g + 1) * WARPGROUP > t->w->hop->nthreads)
        thread_faultf(t, "%s: warpgroup %d of a CTA of %d threads is not 4 whole warps",
                      warpgroup_op_name(op), g, t->w->hop->nthreads);
    t->hop.wait = AJ_SIM_WAIT_WARPGROUP;
    t->hop.wg_op = op;
    t->hop.wg_value = value;
    aj_sim_thread_yield(t, T_HOPPER, site);
}

static void setmaxnreg(sim_thread *t, int32_t site, enum warpgroup_op op, int32_t count)
{
    if (count < 24 || count > 256 || count % 8)
        thread_faultf(t, "%s %d: the count must be a multiple of 8 in 24..256",
                      warpgroup_op_name(op), count);
    int32_t current = t->w->hop->warp_registers[t->tid / WARP];
    if (op == WG_SETMAXNREG_INC ? count < current : count > current)
        thread_faultf(t, "%s %d: the warp holds %d registers per thread, %s", warpgroup_op_name(op),
                      count, current, op == WG_SETMAXNREG_INC ? "more" : "fewer");
    warpgroup_join(t, site, op, count);
}

void aj_sim_setmaxnreg_inc(sim_thread *t, int32_t site, int32_t count)
{
    setmaxnreg(t, site, WG_SETMAXNREG_INC, count);
}

void aj_sim_setmaxnreg_dec(sim_thread *t, int32_t site, int32_t count)
{
    setmaxnreg(t, site, WG_SETMAXNREG_DEC, count);
}

/* Registers the CTA's warps hold (32 lanes each, whatever their threads). */
static int64_t registers_held(const aj_sim_hopper_cta *h)
{
    int64_t sum = 0;
    for (int i = 0; i < (h->nthreads + WARP - 1) / WARP; i++)
        sum += (int64_t)h->warp_registers[i] * WARP;
    return sum;
}

/* The warpgroup at `base` meets at one setmaxnreg: 1 when done, 0 while
 * .inc waits for the pool (or after a fault). */
static int complete_setmaxnreg(sim_worker *w, sim_thread *group)
{
    aj_sim_hopper_cta *h = w->hop;
    int32_t count = group[0].hop.wg_value;
    for (int i = 1; i < WARPGROUP; i++)
        if (group[i].hop.wg_value != count) {
            aj_sim_record_fault(w, "thread %d: %s %d, while thread %d of its warpgroup asks for "
                                "%d", group[i].tid, warpgroup_op_name(group[i].hop.wg_op),
                                group[i].hop.wg_value, group[0].tid, count);
            return 0;
        }
    int32_t *regs = &h->warp_registers[group[0].tid / WARP];
    int64_t more = 0;
    for (int k = 0; k < WARPGROUP / WARP; k++)
        more += (int64_t)(count - regs[k]) * WARP;
    if (registers_held(h) + more > REGISTER_FILE)
        return 0;
    for (int k = 0; k < WARPGROUP / WARP; k++)
        regs[k] = count;
    return 1;
}

static int complete_wgmma(sim_worker *w, sim_thread *group);

/* The warpgroup meets at one call: 1 when it is done (0 while it waits,
 * or after a fault). */
static int complete_warpgroup(sim_worker *w, sim_thread *group)
{
    switch (group[0].hop.wg_op) {
    case WG_SETMAXNREG_INC:
    case WG_SETMAXNREG_DEC:
        return complete_setmaxnreg(w, group);
    case WG_WGMMA:
        return complete_wgmma(w, group);
    default:   /* fence, commit, wait: each thread does its part itself */
        return 1;
    }
}

/* Warpgroups whose 128 threads all wait at one call complete it. */
static int settle_warpgroups(sim_worker *w)
{
    int released = 0;
    for (int base = 0; base + WARPGROUP <= w->hop->nthreads; base += WARPGROUP) {
        sim_thread *group = &w->threads[base];
        int meet = 1;
        for (int i = 0; i < WARPGROUP && meet; i++)
            meet = group[i].state == T_HOPPER && group[i].hop.wait == AJ_SIM_WAIT_WARPGROUP &&
                   group[i].site == group[0].site && group[i].hop.wg_op == group[0].hop.wg_op;
        if (!meet || !complete_warpgroup(w, group))
            continue;
        for (int i = 0; i < WARPGROUP; i++)
            group[i].state = T_READY;
        released += WARPGROUP;
    }
    return released;
}

int aj_sim_hopper_settle(sim_worker *w)
{
    int released = 0;
    for (int i = 0; i < w->hop->nthreads; i++) {
        sim_thread *t = &w->threads[i];
        if (t->state != T_HOPPER || t->hop.wait != AJ_SIM_WAIT_MBARRIER)
            continue;
        const mbarrier *m = &w->hop->mbarriers[t->hop.mbarrier];
        if ((int32_t)(m->phase & 1) != t->hop.parity) {
            t->state = T_READY;
            released++;
        }
    }
    return released + settle_warpgroups(w);
}

/* ---------------------------------------------------------------- wgmma */

/*
 * A K-major operand in shared memory by its descriptor (PTX ISA,
 * "Asynchronous Warpgroup Level Matrix Shared Memory Layout"): rows of
 * 8 x 16-byte core matrices.  Element (row, k), 16-bit, at
 *
 *   no swizzle:  start + (row / 8) sbo + (2k / 16) lbo + (row % 8) 16 + 2k % 16
 *   swizzle S:   start + (row / 8) sbo + (row % 8) S + 2k, then the 16-byte
 *                chunk (address bits 4..) XORed with bits 7.. of the address
 *                (S = 128: 3 bits, 64: 2, 32: 1), the same pattern TMA writes
 */
typedef struct smem_operand {
    uint32_t start, lbo, sbo;
    int span;                  /* swizzle bytes; 0: none */
} smem_operand;

static uint32_t swizzled(uint32_t offset, int span)
{
    return span ? offset ^ (((offset >> 7) & (uint32_t)(span / 16 - 1)) << 4) : offset;
}

/* Decodes `desc` into *op; 0 after recording a fault (for thread t). */
static int decode_descriptor(sim_thread *t, const char *which, uint64_t desc, smem_operand *op)
{
    static const int spans[4] = {0, 128, 64, 32};
    op->start = (uint32_t)(desc & 0x3fff) << 4;
    op->lbo = (uint32_t)(desc >> 16 & 0x3fff) << 4;
    op->sbo = (uint32_t)(desc >> 32 & 0x3fff) << 4;
    op->span = spans[desc >> 62];
    const char *why = NULL;
    char msg[160];
    if (desc >> 49 & 7)
        why = "a base offset (bits 49-51), which the emulator does not model";
    else if (op->span && op->start / (uint32_t)op->span % 8) {
        snprintf(msg, sizeof msg, "a %d-byte swizzle from shared offset %u, not in the first "
                 "row of a %d-byte-aligned swizzle atom", op->span, op->start, 8 * op->span);
        why = msg;
    }
    if (why)
        aj_sim_record_fault(t->w, "thread %d: wgmma.mma_async: the %s descriptor 0x%016llx has "
                            "%s", t->tid, which, (unsigned long long)desc, why);
    return why == NULL;
}

/*
 * Strict mode: the warpgroup's first thread `lead` reads the granule at
 * `offset` through the async proxy.  What another thread wrote must be
 * ordered before it, and a generic write (a store, cp.async) needs a
 * fence.proxy.async of its writer after it; the read stays in flight (no
 * thread's access is ordered after it) until the wait_group that covers
 * the wgmma (wgmma_reads_done).  0 after recording a fault.
 */
/* The thread whose generic write of the granule at `offset` no
 * fence.proxy.async of its own has followed; -1 if none (strict). */
static int unfenced_writer(const sim_worker *w, uint32_t offset)
{
    const smem_shadow *s = &w->shadow[offset / GRANULE];
    if (!s->write_stamp || s->write_kind == W_TMA || s->write_stamp == STAMP_IN_FLIGHT)
        return -1;
    return w->threads[s->writer].hop.proxy_fence <= s->write_stamp ? s->writer : -1;
}

static int async_read(sim_thread *lead, uint32_t offset)
{
    sim_worker *w = lead->w;
    smem_shadow *s = &w->shadow[offset / GRANULE];
    if (s->write_stamp) {
        if (unfenced_writer(w, offset) >= 0) {
            aj_sim_record_fault(w, "thread %d: wgmma.mma_async reads shared offset %u, which "
                                "thread %d wrote through the generic proxy with no "
                                "fence.proxy.async after it", lead->tid, offset, s->writer);
            return 0;
        }
        if (s->writer != lead->tid &&
            (s->write_stamp == STAMP_IN_FLIGHT ||
             !(s->write_stamp < w->last_barrier || s->write_stamp < lead->synced[s->writer]))) {
            aj_sim_record_fault(w, "thread %d: shared-memory race: wgmma.mma_async reads shared "
                                "offset %u, written by thread %d with no barrier in between",
                                lead->tid, offset, s->writer);
            return 0;
        }
    }
    s->reader_warp = (int8_t)(lead->tid / WARP);
    s->reader_lanes = 1u << (lead->tid % WARP);
    s->reader_a = (int16_t)lead->tid;
    s->read_stamp = STAMP_IN_FLIGHT;
    uint32_t *lo = &w->hop->read_lo, *hi = &w->hop->read_hi;
    *lo = offset < *lo ? offset : *lo;
    *hi = offset + 2 > *hi ? offset + 2 : *hi;
    return 1;
}

/* Element (row, k) of a K-major 16-bit operand, as a double; 0 after a
 * fault (an address outside shared memory, or strict mode's checks). */
static int operand_element(sim_thread *t, const smem_operand *op, int row, int k, int bf16,
                           double *out)
{
    uint32_t bk = 2u * (uint32_t)k, offset;
    if (op->span)
        offset = swizzled(op->start + (uint32_t)(row / 8) * op->sbo +
                          (uint32_t)(row % 8 * op->span) + bk, op->span);
    else
        offset = op->start + (uint32_t)(row / 8) * op->sbo + bk / 16 * op->lbo +
                 (uint32_t)(row % 8 * 16) + bk % 16;
    if (offset + 2 > (uint32_t)t->w->launch->smem_bytes) {
        aj_sim_record_fault(t->w, "thread %d: wgmma.mma_async reads element (%d, %d) at shared "
                            "offset %u, outside the %d bytes of shared memory", t->tid, row, k,
                            offset, t->w->launch->smem_bytes);
        return 0;
    }
    if (t->w->shadow && !async_read(t, offset))
        return 0;
    uint16_t h;
    memcpy(&h, t->w->smem + offset, 2);
    *out = bf16 ? aj_bf16_to_f32(h) : aj_f16_to_f32(h);
    return 1;
}

static double half_of(uint32_t reg, int high, int bf16)
{
    uint16_t h = (uint16_t)(reg >> (16 * high));
    return bf16 ? aj_bf16_to_f32(h) : aj_f16_to_f32(h);
}

/* What the accumulators hold while a wgmma is in flight: a quiet NaN
 * with a payload, so that a write in between shows at the wait. */
#define ACC_IN_FLIGHT 0x7fc0ba5eu

static uint64_t acc_checksum(const float *acc, int n)
{
    uint64_t sum = 1469598103934665603ull;   /* FNV-1a over the bits */
    const uint8_t *p = (const uint8_t *)acc;
    for (size_t i = 0; i < (size_t)n * sizeof *acc; i++)
        sum = (sum ^ p[i]) * 1099511628211ull;
    return sum;
}

/* The accumulator a new wgmma of thread t on `acc` starts from: the
 * latest result still in flight for it, else what the registers hold --
 * which, unless a wgmma.fence came since the thread's last wait_group,
 * must be what that wait landed (PTX ISA: wgmma.fence orders register
 * accesses before a wgmma).  NULL after recording a fault. */
static const float *accumulator_in(sim_worker *w, sim_thread *t)
{
    const wgmma_queue *q = &w->hop->wgmma[t->tid];
    for (int i = q->num - 1; i >= 0; i--)
        if (q->items[i].acc == t->hop.mma.acc)
            return q->items[i].d;
    if (t->hop.wgmma_fenced)
        return t->hop.mma.acc;
    for (int i = 0; i < q->num_landed; i++)
        if (q->landed[i].acc == t->hop.mma.acc) {
            if (q->landed[i].sum == acc_checksum(t->hop.mma.acc, t->hop.wg_value / 2))
                return t->hop.mma.acc;
            aj_sim_record_fault(w, "thread %d: wgmma.mma_async on accumulators written since "
                                "the last wgmma.wait_group, with no wgmma.fence in between",
                                t->tid);
            return NULL;
        }
    aj_sim_record_fault(w, "thread %d: wgmma.mma_async on accumulators no wgmma has written, "
                        "with no wgmma.fence before it", t->tid);
    return NULL;
}

/* The lead thread's queue remembers the bytes the wgmma read (strict). */
static int note_reads(sim_worker *w, const sim_thread *lead)
{
    wgmma_queue *q = &w->hop->wgmma[lead->tid];
    if (!w->shadow || w->hop->read_lo >= w->hop->read_hi)
        return 1;
    if (q->num_reads == q->cap_reads) {
        int cap = q->cap_reads ? 2 * q->cap_reads : 4;
        struct wgmma_read *grown = realloc(q->reads, (size_t)cap * sizeof *grown);
        if (!grown)
            return 0;
        q->reads = grown;
        q->cap_reads = cap;
    }
    q->reads[q->num_reads++] = (struct wgmma_read){w->hop->read_lo, w->hop->read_hi, q->committed};
    return 1;
}

/* A wait_group by the lead thread ends the reads of the groups it covers:
 * they become ordinary reads of the lead thread now. */
static void wgmma_reads_done(sim_thread *lead, int64_t group_limit)
{
    sim_worker *w = lead->w;
    wgmma_queue *q = &w->hop->wgmma[lead->tid];
    int kept = 0;
    for (int i = 0; i < q->num_reads; i++) {
        struct wgmma_read *r = &q->reads[i];
        if (r->group >= group_limit) {
            q->reads[kept++] = *r;
            continue;
        }
        for (uint32_t g = r->lo / GRANULE; g < (r->hi + GRANULE - 1) / GRANULE; g++) {
            smem_shadow *s = &w->shadow[g];
            if (s->read_stamp == STAMP_IN_FLIGHT && s->reader_a == lead->tid)
                s->read_stamp = w->seq;
        }
    }
    q->num_reads = kept;
}

/* A (64 x 16) from the descriptor, or from the threads' registers in
 * mma.sync's A layout per warp (rows 16 w + g (+8), k 2t, 2t+1 (+8)). */
static int gather_a(sim_thread *group, double a[64][16])
{
    const sim_thread *lead = &group[0];
    int bf16 = lead->hop.mma.bf16;
    if (!lead->hop.mma.a_in_registers) {
        smem_operand op;
        if (!decode_descriptor(&group[0], "A", lead->hop.mma.a_desc, &op))
            return 0;
        for (int m = 0; m < 64; m++)
            for (int k = 0; k < 16; k++)
                if (!operand_element(&group[0], &op, m, k, bf16, &a[m][k]))
                    return 0;
        return 1;
    }
    for (int i = 0; i < WARPGROUP; i++) {
        int warp = i / WARP, g = i % WARP / 4, tq = i % 4;
        for (int r = 0; r < 4; r++)
            for (int hi = 0; hi < 2; hi++)
                a[16 * warp + g + 8 * (r & 1)][2 * tq + 8 * (r >> 1) + hi] =
                    half_of(group[i].hop.mma.a[r], hi, bf16);
    }
    return 1;
}

/* The operands every thread of the warpgroup must give alike. */
static int uniform_operands(sim_worker *w, sim_thread *group)
{
    const sim_thread *lead = &group[0];
    for (int i = 1; i < WARPGROUP; i++) {
        const sim_thread *u = &group[i];
        if (u->hop.wg_value == lead->hop.wg_value && u->hop.mma.bf16 == lead->hop.mma.bf16 &&
            u->hop.mma.b_desc == lead->hop.mma.b_desc &&
            u->hop.mma.scale_d == lead->hop.mma.scale_d &&
            (u->hop.mma.a_in_registers || u->hop.mma.a_desc == lead->hop.mma.a_desc))
            continue;
        aj_sim_record_fault(w, "thread %d: wgmma.mma_async with other operands than thread %d "
                            "of its warpgroup (descriptors 0x%016llx, 0x%016llx against "
                            "0x%016llx, 0x%016llx; scale-d %d against %d)", u->tid, lead->tid,
                            (unsigned long long)u->hop.mma.a_desc,
                            (unsigned long long)u->hop.mma.b_desc,
                            (unsigned long long)lead->hop.mma.a_desc,
                            (unsigned long long)lead->hop.mma.b_desc, u->hop.mma.scale_d,
                            lead->hop.mma.scale_d);
        return 0;
    }
    return 1;
}

/* Appends thread t's result of the wgmma in flight; NULL when out of memory. */
static wgmma_result *push_result(sim_worker *w, const sim_thread *t)
{
    wgmma_queue *q = &w->hop->wgmma[t->tid];
    if (q->num == q->cap) {
        int cap = q->cap ? 2 * q->cap : 4;
        wgmma_result *grown = realloc(q->items, (size_t)cap * sizeof *grown);
        if (!grown)
            return NULL;
        q->items = grown;
        q->cap = cap;
    }
    wgmma_result *r = &q->items[q->num++];
    r->acc = t->hop.mma.acc;
    r->group = q->committed;
    r->n = t->hop.wg_value / 2;
    return r;
}

/*
 * D = A B + (scale_d ? C : 0) for the warpgroup, in double, rounded once
 * to f32 (as complete_mma in emulator.c).  B (N x 16, K-major) by its
 * descriptor.  Thread 32 w + 4 g + t holds D's register r at
 *
 *   row 16 w + g + 8 ((r >> 1) & 1),  col 8 (r >> 2) + 2 t + (r & 1)
 *
 * (PTX ISA, "Register Fragments and Shared Memory Matrix Layouts": the
 * wgmma .m64nNk16 D fragment).  The results wait in each thread's queue;
 * its accumulators read NaN until a wait_group lands them.
 */
static int complete_wgmma(sim_worker *w, sim_thread *group)
{
    const sim_thread *lead = &group[0];
    int n = lead->hop.wg_value, bf16 = lead->hop.mma.bf16;
    double (*a)[16] = w->hop->mma_a, (*b)[16] = w->hop->mma_b;
    smem_operand bop;
    w->hop->read_lo = UINT32_MAX;
    w->hop->read_hi = 0;
    if (!uniform_operands(w, group) || !gather_a(group, a) ||
        !decode_descriptor(&group[0], "B", lead->hop.mma.b_desc, &bop))
        return 0;
    for (int col = 0; col < n; col++)
        for (int k = 0; k < 16; k++)
            if (!operand_element(&group[0], &bop, col, k, bf16, &b[col][k]))
                return 0;
    for (int i = 0; i < WARPGROUP; i++) {
        sim_thread *t = &group[i];
        const float *c = accumulator_in(w, t);
        if (!c)
            return 0;
        wgmma_result *r = push_result(w, t);
        if (!r || (i == 0 && !note_reads(w, t))) {
            aj_sim_record_fault(w, "thread %d: wgmma.mma_async: out of host memory", t->tid);
            return 0;
        }
        int warp = i / WARP, g = i % WARP / 4, tq = i % 4;
        for (int reg = 0; reg < n / 2; reg++) {
            int row = 16 * warp + g + 8 * (reg >> 1 & 1), col = 8 * (reg >> 2) + 2 * tq + (reg & 1);
            double sum = lead->hop.mma.scale_d ? c[reg] : 0.0;
            for (int k = 0; k < 16; k++)
                sum += a[row][k] * b[col][k];
            r->d[reg] = (float)sum;
        }
        uint32_t marker = ACC_IN_FLIGHT;
        for (int reg = 0; reg < n / 2; reg++)
            memcpy(&t->hop.mma.acc[reg], &marker, 4);
    }
    return 1;
}

static void wgmma_issue(sim_thread *t, int32_t site, int n, int bf16, float *acc,
                        uint64_t b_desc, int32_t scale_d)
{
    t->hop.mma.acc = acc;
    t->hop.mma.b_desc = b_desc;
    t->hop.mma.scale_d = scale_d != 0;
    t->hop.mma.bf16 = bf16;
    warpgroup_join(t, site, WG_WGMMA, n);
}

#define WGMMA_ENTRIES(N, type, bf16)                                                       \
    void aj_sim_wgmma_m64n##N##k16_##type##_ss(sim_thread *t, int32_t site, float *acc,    \
                                               uint64_t a_desc, uint64_t b_desc,           \
                                               int32_t scale_d)                            \
    {                                                                                      \
        t->hop.mma.a_in_registers = 0;                                                     \
        t->hop.mma.a_desc = a_desc;                                                        \
        wgmma_issue(t, site, N, bf16, acc, b_desc, scale_d);                               \
    }                                                                                      \
    void aj_sim_wgmma_m64n##N##k16_##type##_rs(sim_thread *t, int32_t site, float *acc,    \
                                               int32_t a0, int32_t a1, int32_t a2,         \
                                               int32_t a3, uint64_t b_desc, int32_t scale_d) \
    {                                                                                      \
        t->hop.mma.a_in_registers = 1;                                                     \
        t->hop.mma.a_desc = 0;                                                             \
        t->hop.mma.a[0] = (uint32_t)a0;                                                    \
        t->hop.mma.a[1] = (uint32_t)a1;                                                    \
        t->hop.mma.a[2] = (uint32_t)a2;                                                    \
        t->hop.mma.a[3] = (uint32_t)a3;                                                    \
        wgmma_issue(t, site, N, bf16, acc, b_desc, scale_d);                               \
    }
#define WGMMA_ENTRIES_BOTH(N) WGMMA_ENTRIES(N, f16, 0) WGMMA_ENTRIES(N, bf16, 1)
AJ_WGMMA_NS(WGMMA_ENTRIES_BOTH)
#undef WGMMA_ENTRIES_BOTH
#undef WGMMA_ENTRIES

void aj_sim_wgmma_fence(sim_thread *t, int32_t site)
{
    warpgroup_join(t, site, WG_WGMMA_FENCE, 0);
    t->hop.wgmma_fenced = 1;
}

/* Before a wait lands result r: its accumulators must still hold the
 * in-flight marker (a write in between is lost on hardware). */
static void check_in_flight(sim_thread *t, const wgmma_result *r)
{
    for (int reg = 0; reg < r->n; reg++) {
        uint32_t bits;
        memcpy(&bits, &r->acc[reg], 4);
        if (bits != ACC_IN_FLIGHT)
            thread_faultf(t, "wgmma.wait_group: accumulator register %d was written while its "
                          "wgmma was in flight (between the issue and this wait)", reg);
    }
}

static void land_result(wgmma_queue *q, const wgmma_result *r)
{
    memcpy(r->acc, r->d, (size_t)r->n * sizeof *r->d);
    int slot = 0;
    while (slot < q->num_landed && q->landed[slot].acc != r->acc)
        slot++;
    if (slot == LANDED_ACCS)
        slot = LANDED_ACCS - 1;   /* the oldest-but-one is forgotten: a fence is then needed */
    else if (slot == q->num_landed)
        q->num_landed++;
    q->landed[slot] = (landed_acc){r->acc, acc_checksum(r->acc, r->n)};
}

void aj_sim_wgmma_commit_group(sim_thread *t, int32_t site)
{
    warpgroup_join(t, site, WG_WGMMA_COMMIT, 0);
    t->w->hop->wgmma[t->tid].committed++;
}

/* wait_group N: the results of all but the N most recent commit groups
 * land in their accumulators, in issue order */
void aj_sim_wgmma_wait_group(sim_thread *t, int32_t site, int32_t pending)
{
    if (pending < 0 || pending > 7)
        thread_faultf(t, "wgmma.wait_group.sync.aligned %d: N must be 0..7", pending);
    warpgroup_join(t, site, WG_WGMMA_WAIT, pending);
    wgmma_queue *q = &t->w->hop->wgmma[t->tid];
    for (int i = 0; i < q->num; i++)
        if (q->items[i].group < q->committed - pending)
            check_in_flight(t, &q->items[i]);
    int kept = 0;
    for (int i = 0; i < q->num; i++) {
        wgmma_result *r = &q->items[i];
        int superseded = 0;   /* a later wgmma on r's accumulators is still in flight */
        for (int j = i + 1; j < q->num; j++)
            superseded |= q->items[j].acc == r->acc && q->items[j].group >= q->committed - pending;
        if (r->group >= q->committed - pending)
            q->items[kept++] = *r;
        else if (!superseded)
            land_result(q, r);
    }
    q->num = kept;
    t->hop.wgmma_fenced = 0;
    if (t->w->shadow && t->tid % WARPGROUP == 0)
        wgmma_reads_done(t, q->committed - pending);
}

/* ---------------------------------------------------------------- TMA */

/*
 * The emulator's tensor map (hopper.h): what cuTensorMapEncodeTiled would
 * keep, in 128 bytes.  A box lands in shared memory densely, dimension 0
 * fastest, with the swizzle of wgmma's operands (swizzled()) applied to
 * the shared offset -- which is why a swizzled destination must be aligned
 * to the pattern's 8 rows of `span` bytes (1024 for 128-byte swizzle).
 */
#define TENSOR_MAP_MAGIC 0x504d5441u   /* "ATMP" */

typedef struct sim_tensor_map {
    uint32_t magic;
    int32_t rank, elem_bytes, span, oob_nan;
    uint32_t box[5];
    uint64_t base;
    uint64_t dims[5];
    uint64_t strides[5];
} sim_tensor_map;

_Static_assert(sizeof(sim_tensor_map) == 128, "a tensor map is 128 bytes");

static aj_status tensor_map_refuse(aj_ctx *ctx, const aj_sim_tensor_map_args *a)
{
    if (a->elem_bytes != 1 && a->elem_bytes != 2 && a->elem_bytes != 4 && a->elem_bytes != 8)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: elem_bytes = %d, want 1, 2, 4 or 8",
                       a->elem_bytes);
    if (a->rank < 1 || a->rank > 5)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: rank = %d, want 1..5", a->rank);
    if ((uintptr_t)a->base % 16)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: base %p is not 16-byte aligned",
                       a->base);
    for (int i = 0; i < a->rank; i++) {
        if (a->dims[i] < 1 || a->dims[i] > (1ull << 32))
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: dims[%d] = %llu, want 1..2^32",
                           i, (unsigned long long)a->dims[i]);
        if (i > 0 && (a->strides[i] % 16 || a->strides[i] >= (1ull << 40)))
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: strides[%d] = %llu bytes, want "
                           "a multiple of 16 under 2^40", i, (unsigned long long)a->strides[i]);
        if (a->box[i] < 1 || a->box[i] > 256)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: box[%d] = %u, want 1..256", i,
                           a->box[i]);
    }
    uint32_t inner = a->box[0] * (uint32_t)a->elem_bytes;
    if (inner % 16)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: box[0] = %u elements of %d bytes "
                       "is %u bytes, not a multiple of 16", a->box[0], a->elem_bytes, inner);
    if (a->span != 0 && a->span != 32 && a->span != 64 && a->span != 128)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: span = %d, want 0 (no swizzle), "
                       "32, 64 or 128", a->span);
    if (a->span && inner > (uint32_t)a->span)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: the inner box of %u bytes exceeds "
                       "the %d-byte swizzle span", inner, a->span);
    return AJ_OK;
}

aj_status aj_sim_tensor_map_encode(aj_ctx *ctx, void *map, const aj_sim_tensor_map_args *args)
{
    if ((uintptr_t)map % 64)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: map %p is not 64-byte aligned", map);
    aj_status st = tensor_map_refuse(ctx, args);
    if (st != AJ_OK)
        return st;
    sim_tensor_map m;
    memset(&m, 0, sizeof m);
    m.magic = TENSOR_MAP_MAGIC;
    m.rank = args->rank;
    m.elem_bytes = args->elem_bytes;
    m.span = args->span;
    m.oob_nan = args->oob_nan != 0;
    m.base = (uint64_t)(uintptr_t)args->base;
    for (int i = 0; i < args->rank; i++) {
        m.box[i] = args->box[i];
        m.dims[i] = args->dims[i];
        m.strides[i] = i ? args->strides[i] : (uint64_t)args->elem_bytes;
    }
    memcpy(map, &m, sizeof m);
    return AJ_OK;
}

/* The map at `map` (global memory of the launch), checked; faults on t. */
static sim_tensor_map tensor_map_at(sim_thread *t, const char *op, const void *map, int rank)
{
    aj_sim_check_alignment(t, op, (uintptr_t)map, 128, 64, 0);
    aj_sim_check_global_bounds(t, op, (uintptr_t)map, 128);
    sim_tensor_map m;
    memcpy(&m, map, sizeof m);
    if (m.magic != TENSOR_MAP_MAGIC)
        thread_faultf(t, "%s: %p holds no tensor map (aj_sim_tensor_map_encode makes them)", op,
                      map);
    if (m.rank != rank)
        thread_faultf(t, "%s: the tensor map has rank %d", op, m.rank);
    return m;
}

static uint32_t box_bytes(const sim_tensor_map *m)
{
    uint32_t n = (uint32_t)m->elem_bytes;
    for (int i = 0; i < m->rank; i++)
        n *= m->box[i];
    return n;
}

/* The shared tile [smem, + box bytes): aligned for its swizzle, inside. */
static void check_tile(sim_thread *t, const char *op, const sim_tensor_map *m,
                       const uint8_t *smem)
{
    uintptr_t align = m->span ? 8u * (uintptr_t)m->span : 128;
    uint32_t offset = (uint32_t)(smem - t->w->smem);
    if (offset % align)
        thread_faultf(t, "%s: shared offset %u is not %zu-byte aligned, as %s needs", op, offset,
                      (size_t)align, m->span ? "the swizzle pattern" : "a bulk tensor copy");
    aj_sim_check_shared_bounds(t, op, (uintptr_t)smem, (int32_t)box_bytes(m));
}

/* Walks the box: for element e (dimension 0 fastest), its shared offset
 * from the tile, swizzled, and its global address or NULL out of bounds. */
typedef void (*box_visit)(sim_thread *t, const sim_tensor_map *m, uint32_t tile_offset,
                          uint8_t *global, void *user);

static void walk_box(sim_thread *t, const sim_tensor_map *m, uint32_t tile, const int32_t *c,
                     box_visit visit, void *user)
{
    uint32_t total = box_bytes(m) / (uint32_t)m->elem_bytes;
    for (uint32_t e = 0; e < total; e++) {
        uint32_t rest = e;
        int inside = 1;
        uint64_t at = m->base;
        for (int d = 0; d < m->rank; d++) {
            int64_t x = (int64_t)c[d] + rest % m->box[d];
            rest /= m->box[d];
            inside &= x >= 0 && (uint64_t)x < m->dims[d];
            at += (uint64_t)x * m->strides[d];
        }
        uint32_t offset = swizzled(tile + e * (uint32_t)m->elem_bytes, m->span);
        visit(t, m, offset, inside ? (uint8_t *)(uintptr_t)at : NULL, user);
    }
}

static void load_element(sim_thread *t, const sim_tensor_map *m, uint32_t offset,
                         uint8_t *global, void *user)
{
    uint8_t *dst = t->w->smem + offset;
    (void)user;
    if (global) {
        aj_sim_check_global_bounds(t, "TMA load", (uintptr_t)global, m->elem_bytes);
        memcpy(dst, global, (size_t)m->elem_bytes);
    } else if (m->oob_nan && m->elem_bytes >= 2) {
        memset(dst, 0xff, (size_t)m->elem_bytes);   /* NaN in f16, bf16, f32, f64 */
    } else {
        memset(dst, 0, (size_t)m->elem_bytes);
    }
}

static void store_element(sim_thread *t, const sim_tensor_map *m, uint32_t offset,
                          uint8_t *global, void *user)
{
    (void)user;
    if (!global)
        return;
    aj_sim_check_global_bounds(t, "TMA store", (uintptr_t)global, m->elem_bytes);
    memcpy(global, t->w->smem + offset, (size_t)m->elem_bytes);
}

/* The box lands at issue: in strict mode its bytes count as written by
 * the issuing thread, so only the mbarrier's completion (which the
 * transaction bytes hold back) orders a reader after them. */
static void tma_load(sim_thread *t, int rank, uint8_t *dst, const void *map, const int32_t *c,
                     uint8_t *bar)
{
    static const char op[] = "cp.async.bulk.tensor (TMA load)";
    sim_tensor_map m = tensor_map_at(t, op, map, rank);
    check_tile(t, op, &m, dst);
    mbarrier *mb = mbarrier_at(t, op, bar, 0);
    uint32_t tile = (uint32_t)(dst - t->w->smem);
    if (t->w->shadow)
        aj_sim_shadow_write(t, "TMA load", (uintptr_t)dst, (int)box_bytes(&m), W_TMA,
                            t->w->seq);
    walk_box(t, &m, tile, c, load_element, NULL);
    mbarrier_complete_tx(t, mb, op, (int32_t)box_bytes(&m));
}

static void tma_store(sim_thread *t, int rank, const void *map, const int32_t *c, uint8_t *src)
{
    static const char op[] = "cp.async.bulk.tensor (TMA store)";
    sim_tensor_map m = tensor_map_at(t, op, map, rank);
    check_tile(t, op, &m, src);
    if (t->w->shadow) {
        uint32_t tile = (uint32_t)(src - t->w->smem);
        for (uint32_t b = 0; b < box_bytes(&m); b += GRANULE) {
            int writer = unfenced_writer(t->w, tile + b);
            if (writer >= 0)
                thread_faultf(t, "%s reads shared offset %u, which thread %d wrote through the "
                              "generic proxy with no fence.proxy.async after it", op, tile + b,
                              writer);
        }
        aj_sim_shadow_read(t, "TMA store", (uintptr_t)src, (int)box_bytes(&m));
    }
    walk_box(t, &m, (uint32_t)(src - t->w->smem), c, store_element, NULL);
}

void aj_sim_tma_load_2d(sim_thread *t, uint8_t *dst, const void *map, int32_t c0, int32_t c1,
                        uint8_t *bar)
{
    tma_load(t, 2, dst, map, (const int32_t[]){c0, c1}, bar);
}

void aj_sim_tma_load_3d(sim_thread *t, uint8_t *dst, const void *map, int32_t c0, int32_t c1,
                        int32_t c2, uint8_t *bar)
{
    tma_load(t, 3, dst, map, (const int32_t[]){c0, c1, c2}, bar);
}

void aj_sim_tma_load_4d(sim_thread *t, uint8_t *dst, const void *map, int32_t c0, int32_t c1,
                        int32_t c2, int32_t c3, uint8_t *bar)
{
    tma_load(t, 4, dst, map, (const int32_t[]){c0, c1, c2, c3}, bar);
}

void aj_sim_tma_load_5d(sim_thread *t, uint8_t *dst, const void *map, int32_t c0, int32_t c1,
                        int32_t c2, int32_t c3, int32_t c4, uint8_t *bar)
{
    tma_load(t, 5, dst, map, (const int32_t[]){c0, c1, c2, c3, c4}, bar);
}

void aj_sim_tma_store_2d(sim_thread *t, const void *map, int32_t c0, int32_t c1, uint8_t *src)
{
    tma_store(t, 2, map, (const int32_t[]){c0, c1}, src);
}

void aj_sim_tma_store_3d(sim_thread *t, const void *map, int32_t c0, int32_t c1, int32_t c2,
                         uint8_t *src)
{
    tma_store(t, 3, map, (const int32_t[]){c0, c1, c2}, src);
}

void aj_sim_tma_store_4d(sim_thread *t, const void *map, int32_t c0, int32_t c1, int32_t c2,
                         int32_t c3, uint8_t *src)
{
    tma_store(t, 4, map, (const int32_t[]){c0, c1, c2, c3}, src);
}

void aj_sim_tma_store_5d(sim_thread *t, const void *map, int32_t c0, int32_t c1, int32_t c2,
                         int32_t c3, int32_t c4, uint8_t *src)
{
    tma_store(t, 5, map, (const int32_t[]){c0, c1, c2, c3, c4}, src);
}

/* The stores are done at issue, so the bulk groups only count. */
void aj_sim_bulk_commit_group(sim_thread *t)
{
    (void)t;
}

void aj_sim_bulk_wait_group_read(sim_thread *t, int32_t pending)
{
    if (pending < 0 || pending > 63)
        thread_faultf(t, "cp.async.bulk.wait_group.read %d: N must be 0..63", pending);
}

/* ---------------------------------------------------------------- deadlock */

/* What thread u of a warpgroup does instead of meeting the others at their call. */
static void describe_absent(const sim_thread *u, char *out, size_t cap)
{
    if (u->state == T_DONE)
        snprintf(out, cap, "thread %d has exited", u->tid);
    else if (u->state == T_HOPPER && u->hop.wait == AJ_SIM_WAIT_WARPGROUP)
        snprintf(out, cap, "thread %d waits in %s at another call", u->tid,
                 warpgroup_op_name(u->hop.wg_op));
    else
        snprintf(out, cap, "thread %d waits elsewhere", u->tid);
}

void aj_sim_hopper_diagnose(sim_worker *w, int tid)
{
    const aj_sim_hopper_cta *h = w->hop;
    const sim_thread *t = &w->threads[tid];
    if (t->hop.wait == AJ_SIM_WAIT_MBARRIER) {
        const mbarrier *m = &h->mbarriers[t->hop.mbarrier];
        aj_sim_record_fault(w, "deadlock: thread %d waits on the mbarrier at shared offset %u "
                            "for the phase of parity %d to complete, and no thread can make it: "
                            "%d of %d arrivals pending, tx-count %d", tid, m->offset,
                            t->hop.parity, m->pending, m->expected, m->tx);
        return;
    }
    if (t->hop.wait == AJ_SIM_WAIT_NAMED_BARRIER) {
        const named_barrier *nb = &h->named[t->hop.bar_id];
        aj_sim_record_fault(w, "deadlock: thread %d waits at named barrier %d for %d threads, "
                            "%d arrived and no other thread can arrive", tid, t->hop.bar_id,
                            nb->count, nb->arrived);
        return;
    }
    const sim_thread *group = &w->threads[tid - tid % WARPGROUP];
    char absent[128] = "";
    for (int i = 0; i < WARPGROUP && !absent[0]; i++)
        if (group[i].state != T_HOPPER || group[i].hop.wait != AJ_SIM_WAIT_WARPGROUP ||
            group[i].site != t->site)
            describe_absent(&group[i], absent, sizeof absent);
    if (absent[0])
        aj_sim_record_fault(w, "deadlock: thread %d waits in %s %d for all %d threads of "
                            "warpgroup %d; %s", tid, warpgroup_op_name(t->hop.wg_op),
                            t->hop.wg_value, WARPGROUP, tid / WARPGROUP, absent);
    else
        aj_sim_record_fault(w, "deadlock: warpgroup %d waits in %s %d for registers: the CTA's "
                            "warps hold %lld of the register file's %d and none releases any",
                            tid / WARPGROUP, warpgroup_op_name(t->hop.wg_op), t->hop.wg_value,
                            (long long)registers_held(h), REGISTER_FILE);
}
