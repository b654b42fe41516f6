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
 * wgmma.c and tma.c model wgmma and TMA, with the async proxy's hazards.
 *
 * A wait that can never end is a fault with the barrier's counts, never a
 * hang: the scheduler calls aj_sim_hopper_diagnose when nothing can move.
 */
#define _GNU_SOURCE
#include "runtime/sim/hopper.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/sim/hopper_internal.h"

static const char *warpgroup_op_name(int op)
{
    static const char *const names[] = {
        [WG_SETMAXNREG_INC] = "setmaxnreg.inc.sync.aligned.u32",
        [WG_SETMAXNREG_DEC] = "setmaxnreg.dec.sync.aligned.u32",
        [WG_WGMMA_FENCE] = "wgmma.fence.sync.aligned",
        [WG_WGMMA_COMMIT] = "wgmma.commit_group.sync.aligned",
        [WG_WGMMA_WAIT] = "wgmma.wait_group.sync.aligned",
        [WG_WGMMA] = "wgmma.mma_async.sync.aligned.m64nNk16 / k32",
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

_Noreturn void aj_sim_faultf(sim_thread *t, const char *fmt, ...)
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
        aj_sim_faultf(t, "%s at shared offset %u, where no mbarrier.init made an mbarrier", op,
                      offset);
    if (h->num_mbarriers == MAX_MBARRIERS)
        aj_sim_faultf(t, "%s at shared offset %u: more than %d mbarriers in one CTA", op,
                      offset, MAX_MBARRIERS);
    mbarrier *m = &h->mbarriers[h->num_mbarriers++];
    m->offset = offset;
    return m;
}

mbarrier *aj_sim_mbarrier_at(sim_thread *t, const char *op, const uint8_t *bar)
{
    return mbarrier_at(t, op, bar, 0);
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
        aj_sim_faultf(t, "mbarrier.init at shared offset %u with count %d, outside 1..%d",
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
        aj_sim_faultf(t, "%s at shared offset %u with %d bytes, outside 0..%d", op, m->offset,
                      tx, MBARRIER_LIMIT);
    int64_t sum = (int64_t)m->tx + tx;
    if (sum > MBARRIER_LIMIT)
        aj_sim_faultf(t, "%s at shared offset %u: tx-count %d + %d exceeds %d", op, m->offset,
                      m->tx, tx, MBARRIER_LIMIT);
    m->tx = (int32_t)sum;
}

static void mbarrier_arrive(sim_thread *t, mbarrier *m, const char *op)
{
    if (m->pending == 0)
        aj_sim_faultf(t, "%s at shared offset %u: every one of its %d arrivals is in, the "
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

void aj_sim_mbarrier_transact(sim_thread *t, mbarrier *m, const char *op, int32_t tx)
{
    if (tx < 0 || tx > MBARRIER_LIMIT || m->tx - tx < -MBARRIER_LIMIT)
        aj_sim_faultf(t, "%s at shared offset %u with %d bytes: tx-count %d would leave "
                      "-%d..%d", op, m->offset, tx, m->tx, MBARRIER_LIMIT, MBARRIER_LIMIT);
    note_arrival(t, m->arrived);
    m->tx -= tx;
    mbarrier_advance(t->w, m);
}

void aj_sim_mbarrier_complete_tx(sim_thread *t, uint8_t *bar, int32_t tx)
{
    static const char op[] = "mbarrier.complete_tx";
    aj_sim_mbarrier_transact(t, mbarrier_at(t, op, bar, 0), op, tx);
}

int32_t aj_sim_mbarrier_try_wait_parity(sim_thread *t, uint8_t *bar, int32_t parity)
{
    mbarrier *m = mbarrier_at(t, "mbarrier.try_wait.parity", bar, 0);
    if (parity != 0 && parity != 1)
        aj_sim_faultf(t, "mbarrier.try_wait.parity at shared offset %u with parity %d, not 0 "
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
        aj_sim_faultf(t, "%s %d, %d: barrier ids are 0..%d", op, id, count, NAMED_BARRIERS - 1);
    if (count < WARP || count % WARP || count > warps_threads)
        aj_sim_faultf(t, "%s %d, %d: the thread count must be a multiple of %d in %d..%d (the "
                      "CTA's warps)", op, id, count, WARP, WARP, warps_threads);
    named_barrier *nb = &h->named[id];
    if (nb->arrived && nb->count != count)
        aj_sim_faultf(t, "%s %d, %d: barrier %d's round in progress counts %d threads", op,
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

void aj_sim_warpgroup_join(sim_thread *t, int32_t site, enum warpgroup_op op, int32_t value)
{
    int g = t->tid / WARPGROUP;
    if ((g + 1) * WARPGROUP > t->w->hop->nthreads)
        aj_sim_faultf(t, "%s: warpgroup %d of a CTA of %d threads is not 4 whole warps",
                      warpgroup_op_name(op), g, t->w->hop->nthreads);
    t->hop.wait = AJ_SIM_WAIT_WARPGROUP;
    t->hop.wg_op = op;
    t->hop.wg_value = value;
    aj_sim_thread_yield(t, T_HOPPER, site);
}

static void setmaxnreg(sim_thread *t, int32_t site, enum warpgroup_op op, int32_t count)
{
    if (count < 24 || count > 256 || count % 8)
        aj_sim_faultf(t, "%s %d: the count must be a multiple of 8 in 24..256",
                      warpgroup_op_name(op), count);
    int32_t current = t->w->hop->warp_registers[t->tid / WARP];
    if (op == WG_SETMAXNREG_INC ? count < current : count > current)
        aj_sim_faultf(t, "%s %d: the warp holds %d registers per thread, %s", warpgroup_op_name(op),
                      count, current, op == WG_SETMAXNREG_INC ? "more" : "fewer");
    aj_sim_warpgroup_join(t, site, op, count);
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

/* The warpgroup meets at one call: 1 when it is done (0 while it waits,
 * or after a fault). */
static int complete_warpgroup(sim_worker *w, sim_thread *group)
{
    switch (group[0].hop.wg_op) {
    case WG_SETMAXNREG_INC:
    case WG_SETMAXNREG_DEC:
        return complete_setmaxnreg(w, group);
    case WG_WGMMA:
        return aj_sim_wgmma_complete(w, group);
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
