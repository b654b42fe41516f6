/*
 * wgmma.c -- wgmma.mma_async on the emulator (hopper.h; docs/sim.md,
 * "wgmma" and "The async hazards").
 *
 * The warpgroup's 128 threads meet at a wgmma (hopper.c's warpgroup
 * meetings); then the operands are read through their descriptors (or A
 * from the registers), D is computed in double and rounded once, and each
 * thread's results wait in its queue -- its accumulators hold a NaN marker
 * -- until the wait_group covering their commit group lands them.
 *
 * The async proxy's hazards (strict mode): a wgmma's shared reads stay in
 * flight until the wait_group covering it (async_read, wgmma_reads_done),
 * so a TMA or store over its stage before then is a race; generic writes
 * it reads need a fence.proxy.async of their writer (aj_sim_unfenced_writer,
 * which tma.c's stores use too); the accumulators must not change between
 * issue and wait, and a wgmma on accumulators written since the last wait
 * needs a wgmma.fence (accumulator_in).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/dtype.h"
#include "runtime/sim/hopper_internal.h"

/*
 * An operand in shared memory by its descriptor (PTX ISA, "Asynchronous
 * Warpgroup Level Matrix Shared Memory Layout").  K-major: rows of
 * 8 x 16-byte core matrices, element (row, k) of E bytes (2: f16, bf16;
 * 1: e4m3, e5m2, whose K per wgmma is 32 -- the same 32 bytes a row) at
 *
 *   no swizzle:  start + (row / 8) sbo + (Ek / 16) lbo + (row % 8) 16 + Ek % 16
 *   swizzle S:   start + (row / 8) sbo + (row % 8) S + Ek, then the 16-byte
 *                chunk (address bits 4..) XORed with bits 7.. of the address
 *                (S = 128: 3 bits, 64: 2, 32: 1), the same pattern TMA writes
 */
typedef struct smem_operand {
    uint32_t start, lbo, sbo;
    int span;                  /* swizzle bytes; 0: none */
} smem_operand;

uint32_t aj_sim_swizzled(uint32_t offset, int span)
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
int aj_sim_unfenced_writer(const sim_worker *w, uint32_t offset)
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
        if (aj_sim_unfenced_writer(w, offset) >= 0) {
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

/*
 * The byte offset of element (row, k) of an operand of `esize`-byte
 * elements: K-major (above) or, for 16-bit B with imm-trans-b = 1, N-major ("Major-ness supported by
 * Strides", "Canonical Layouts"): rows (N) run along the 16-byte chunks
 * and k down them,
 *
 *   no swizzle:  start + (row / 8) sbo + (k / 8) lbo + (k % 8) 16 + 2 (row % 8)
 *   swizzle S:   start + (row / (S / 2)) lbo + (k / 8) sbo + (k % 8) S + 2 (row % (S / 2)),
 *                then swizzled as above
 *
 * (LBO and SBO trade places between the two: the ISA's tables).
 */
static uint32_t operand_offset(const smem_operand *op, int row, int k, int n_major, int esize)
{
    uint32_t r = (uint32_t)row, kk = (uint32_t)k, kb = (uint32_t)esize * kk;
    if (!n_major) {
        if (op->span)
            return aj_sim_swizzled(op->start + r / 8 * op->sbo + r % 8 * (uint32_t)op->span + kb,
                                   op->span);
        return op->start + r / 8 * op->sbo + kb / 16 * op->lbo + r % 8 * 16 + kb % 16;
    }
    if (op->span) {
        uint32_t per_row = (uint32_t)op->span / 2;
        return aj_sim_swizzled(op->start + r / per_row * op->lbo + kk / 8 * op->sbo +
                               kk % 8 * (uint32_t)op->span + 2 * (r % per_row), op->span);
    }
    return op->start + r / 8 * op->sbo + kk / 8 * op->lbo + kk % 8 * 16 + 2 * (r % 8);
}

/* Element (row, k) of an operand of `type` (N-major where n_major), as a
 * double; 0 after a fault (an address outside shared memory, or strict
 * mode's checks). */
static int operand_element(sim_thread *t, const smem_operand *op, int row, int k, int n_major,
                           aj_dtype type, double *out)
{
    int esize = aj_dtype_size(type);
    uint32_t offset = operand_offset(op, row, k, n_major, esize);
    if (offset + (uint32_t)esize > (uint32_t)t->w->launch->smem_bytes) {
        aj_sim_record_fault(t->w, "thread %d: wgmma.mma_async reads element (%d, %d) at shared "
                            "offset %u, outside the %d bytes of shared memory", t->tid, row, k,
                            offset, t->w->launch->smem_bytes);
        return 0;
    }
    if (t->w->shadow && !async_read(t, offset))
        return 0;
    uint32_t bits = 0;
    memcpy(&bits, t->w->smem + offset, (size_t)esize);   /* little-endian, as the GPU */
    *out = aj_fragment_element(type, bits, 0);
    return 1;
}

/* A wgmma's K: 16 16-bit or 32 8-bit elements, 32 bytes a row either way. */
static int wgmma_k(aj_dtype type) { return 32 / aj_dtype_size(type); }

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

/* A (64 x K) from the descriptor, or from the threads' registers in
 * mma.sync's A layout per warp, E = 4 / element size a register: rows
 * 16 w + g (+8), k E t .. E t + E - 1 (+4E) -- m16n8k16's for 16-bit,
 * m16n8k32's for 8-bit elements (PTX ISA, "Register Fragments and Shared
 * Memory Matrix Layouts", the wgmma .m64nNk16 and .m64nNk32 A fragments). */
static int gather_a(sim_thread *group, double a[64][32])
{
    const sim_thread *lead = &group[0];
    aj_dtype type = (aj_dtype)lead->hop.mma.a_type;
    int K = wgmma_k(type), E = 4 / aj_dtype_size(type);
    if (!lead->hop.mma.a_in_registers) {
        smem_operand op;
        if (!decode_descriptor(&group[0], "A", lead->hop.mma.a_desc, &op))
            return 0;
        for (int m = 0; m < 64; m++)
            for (int k = 0; k < K; k++)
                if (!operand_element(&group[0], &op, m, k, 0, type, &a[m][k]))
                    return 0;
        return 1;
    }
    for (int i = 0; i < WARPGROUP; i++) {
        int warp = i / WARP, g = i % WARP / 4, tq = i % 4;
        for (int r = 0; r < 4; r++)
            for (int e = 0; e < E; e++)
                a[16 * warp + g + 8 * (r & 1)][E * tq + 4 * E * (r >> 1) + e] =
                    aj_fragment_element(type, group[i].hop.mma.a[r], e);
    }
    return 1;
}

/* The operands every thread of the warpgroup must give alike. */
static int uniform_operands(sim_worker *w, sim_thread *group)
{
    const sim_thread *lead = &group[0];
    for (int i = 1; i < WARPGROUP; i++) {
        const sim_thread *u = &group[i];
        if (u->hop.wg_value == lead->hop.wg_value && u->hop.mma.a_type == lead->hop.mma.a_type &&
            u->hop.mma.b_type == lead->hop.mma.b_type &&
            u->hop.mma.b_desc == lead->hop.mma.b_desc &&
            u->hop.mma.scale_d == lead->hop.mma.scale_d &&
            u->hop.mma.trans_b == lead->hop.mma.trans_b &&
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
 * to f32 (as complete_mma in emulator.c).  B (N x K, K- or N-major) by its
 * descriptor.  Thread 32 w + 4 g + t holds D's register r at
 *
 *   row 16 w + g + 8 ((r >> 1) & 1),  col 8 (r >> 2) + 2 t + (r & 1)
 *
 * (PTX ISA, "Register Fragments and Shared Memory Matrix Layouts": the
 * wgmma .m64nNk16 and .m64nNk32 D fragments).  The results wait in each thread's queue;
 * its accumulators read NaN until a wait_group lands them.
 */
int aj_sim_wgmma_complete(sim_worker *w, sim_thread *group)
{
    const sim_thread *lead = &group[0];
    int n = lead->hop.wg_value, K = wgmma_k((aj_dtype)lead->hop.mma.a_type);
    aj_dtype b_type = (aj_dtype)lead->hop.mma.b_type;
    double (*a)[32] = w->hop->mma_a, (*b)[32] = w->hop->mma_b;
    smem_operand bop;
    w->hop->read_lo = UINT32_MAX;
    w->hop->read_hi = 0;
    if (!uniform_operands(w, group) || !gather_a(group, a) ||
        !decode_descriptor(&group[0], "B", lead->hop.mma.b_desc, &bop))
        return 0;
    for (int col = 0; col < n; col++)
        for (int k = 0; k < K; k++)
            if (!operand_element(&group[0], &bop, col, k, lead->hop.mma.trans_b, b_type,
                                 &b[col][k]))
                return 0;
    for (int i = 0; i < WARPGROUP; i++) {
        sim_thread *t = &group[i];
        const float *in = accumulator_in(w, t);
        if (!in)
            return 0;
        /* C by value: `in` may be a result still in the queue, which
         * push_result's realloc can move */
        float c[WGMMA_MAX_REGS];
        memcpy(c, in, (size_t)n / 2 * sizeof *c);
        wgmma_result *r = push_result(w, t);
        if (!r || (i == 0 && !note_reads(w, t))) {
            aj_sim_record_fault(w, "thread %d: wgmma.mma_async: out of host memory", t->tid);
            return 0;
        }
        int warp = i / WARP, g = i % WARP / 4, tq = i % 4;
        for (int reg = 0; reg < n / 2; reg++) {
            int row = 16 * warp + g + 8 * (reg >> 1 & 1), col = 8 * (reg >> 2) + 2 * tq + (reg & 1);
            double sum = lead->hop.mma.scale_d ? c[reg] : 0.0;
            for (int k = 0; k < K; k++)
                sum += a[row][k] * b[col][k];
            r->d[reg] = (float)sum;
        }
        uint32_t marker = ACC_IN_FLIGHT;
        for (int reg = 0; reg < n / 2; reg++)
            memcpy(&t->hop.mma.acc[reg], &marker, 4);
    }
    return 1;
}

static void wgmma_issue(sim_thread *t, int32_t site, int n, aj_dtype a_type, aj_dtype b_type,
                        int trans_b, float *acc, uint64_t b_desc, int32_t scale_d)
{
    t->hop.mma.trans_b = trans_b;
    t->hop.mma.acc = acc;
    t->hop.mma.b_desc = b_desc;
    t->hop.mma.scale_d = scale_d != 0;
    t->hop.mma.a_type = a_type;
    t->hop.mma.b_type = b_type;
    aj_sim_warpgroup_join(t, site, WG_WGMMA, n);
}

/* The entries of one row: A by descriptor (_ss) or in registers (_rs),
 * named by `stem`, of A and B types ta and tb, B K-major or N-major (tb).
 * The 16-bit rows are k16 with a _tb twin; the 8-bit ones k32, K-major. */
#define WGMMA_ENTRY_PAIR(stem, N, ta, tb, trans, suffix)                                   \
    void aj_sim_wgmma_##stem##_ss##suffix(sim_thread *t, int32_t site, float *acc,          \
                                          uint64_t a_desc, uint64_t b_desc,                 \
                                          int32_t scale_d)                                  \
    {                                                                                      \
        t->hop.mma.a_in_registers = 0;                                                     \
        t->hop.mma.a_desc = a_desc;                                                        \
        wgmma_issue(t, site, N, ta, tb, trans, acc, b_desc, scale_d);                      \
    }                                                                                      \
    void aj_sim_wgmma_##stem##_rs##suffix(sim_thread *t, int32_t site, float *acc,          \
                                          int32_t a0, int32_t a1, int32_t a2, int32_t a3,   \
                                          uint64_t b_desc, int32_t scale_d)                 \
    {                                                                                      \
        t->hop.mma.a_in_registers = 1;                                                     \
        t->hop.mma.a_desc = 0;                                                             \
        t->hop.mma.a[0] = (uint32_t)a0;                                                    \
        t->hop.mma.a[1] = (uint32_t)a1;                                                    \
        t->hop.mma.a[2] = (uint32_t)a2;                                                    \
        t->hop.mma.a[3] = (uint32_t)a3;                                                    \
        wgmma_issue(t, site, N, ta, tb, trans, acc, b_desc, scale_d);                      \
    }
#define WGMMA_ENTRIES(N, type, T)                                                          \
    WGMMA_ENTRY_PAIR(m64n##N##k16_##type, N, T, T, 0, )                                    \
    WGMMA_ENTRY_PAIR(m64n##N##k16_##type, N, T, T, 1, _tb)
#define WGMMA_ENTRIES_ALL(N)                                                               \
    WGMMA_ENTRIES(N, f16, AJ_DTYPE_F16) WGMMA_ENTRIES(N, bf16, AJ_DTYPE_BF16)              \
    WGMMA_ENTRY_PAIR(m64n##N##k32_e4m3_e4m3, N, AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E4M3, 0, )    \
    WGMMA_ENTRY_PAIR(m64n##N##k32_e5m2_e5m2, N, AJ_DTYPE_F8E5M2, AJ_DTYPE_F8E5M2, 0, )    \
    WGMMA_ENTRY_PAIR(m64n##N##k32_e4m3_e5m2, N, AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E5M2, 0, )
AJ_WGMMA_NS(WGMMA_ENTRIES_ALL)
#undef WGMMA_ENTRIES_ALL
#undef WGMMA_ENTRIES
#undef WGMMA_ENTRY_PAIR

void aj_sim_wgmma_fence(sim_thread *t, int32_t site)
{
    aj_sim_warpgroup_join(t, site, WG_WGMMA_FENCE, 0);
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
            aj_sim_faultf(t, "wgmma.wait_group: accumulator register %d was written while its "
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
    aj_sim_warpgroup_join(t, site, WG_WGMMA_COMMIT, 0);
    t->w->hop->wgmma[t->tid].committed++;
}

/* wait_group N: the results of all but the N most recent commit groups
 * land in their accumulators, in issue order */
void aj_sim_wgmma_wait_group(sim_thread *t, int32_t site, int32_t pending)
{
    if (pending < 0 || pending > 7)
        aj_sim_faultf(t, "wgmma.wait_group.sync.aligned %d: N must be 0..7", pending);
    aj_sim_warpgroup_join(t, site, WG_WGMMA_WAIT, pending);
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
