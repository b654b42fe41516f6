/*
 * test_sim_hopper.c -- the emulator's model of sm_90's asynchronous
 * machinery (runtime/sim/hopper.c, wgmma.c, tma.c), against the PTX ISA:
 *
 *   mbarrier        "Parallel Synchronization and Communication Instructions:
 *                   mbarrier": phases, the pending arrival count and the
 *                   tx-count ("Phase Completion of the mbarrier object"),
 *                   try_wait.parity on the current or preceding phase
 *   bar / barrier   the same chapter: bar.sync / bar.arrive with a barrier
 *                   id (0..15) and a thread count (a multiple of the warp size)
 *   elect.sync      the same chapter: one leader among the membermask
 *   setmaxnreg      "Miscellaneous Instructions: setmaxnreg": counts 24..256
 *                   in steps of 8, the whole warpgroup, the CTA's pool
 *   fence.proxy.async   "membar / fence": recorded per thread
 *   TMA             "Data Movement and Conversion Instructions:
 *                   cp.async.bulk.tensor": tile loads and stores of 2 to 5
 *                   dimensions, out-of-bounds fill, swizzles, the mbarrier's
 *                   transaction bytes; the tensor map by the rules of the
 *                   CUDA driver's cuTensorMapEncodeTiled
 *   wgmma           "Asynchronous Warpgroup Level Matrix Multiply-Accumulate
 *                   Instructions": the matrix descriptor, the K-major shared
 *                   memory layouts with their swizzles, the register
 *                   fragments of A and D for .m64nNk16, commit and wait
 *
 * Producer / consumer kernels written with the kernel builder check the
 * data that crosses each synchronisation and that strict mode finds them
 * race-free under several seeds, while a twin missing the wait is a race
 * under every seed.  Broken kernels check each fault and its message; a
 * wait that can never end is a deadlock fault, never a hang.  The kernels
 * are compiled for sm_90a too and, where ptxas is found, assembled.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ir/dtype.h"
#include "kb_kernel.h"
#include "codegen/wgmma_shapes.h"
#include "runtime/sim/hopper.h"

#define SEEDS 6
#define WORDS 32768

static aj_ctx *ctx;
static aj_op *op;             /* any op: aj_codegen_run only hands it over */
static char ptxas[1024];
static int have_ptxas, ptx_kernels, ptx_assembled;
static char ptxas_log[4096];  /* the latest kernel's */
_Alignas(1024) static float in[WORDS], out[WORDS];

/* A one-CTA kernel over `in` and `out` (WORDS f32 each). */
typedef struct hopper_kernel {
    const char *name;
    int threads;
    int32_t smem_bytes;
    void (*body)(aj_kb *kb, int variant);
    int variant;
} hopper_kernel;

static aj_status build(aj_kb *kb, const aj_op *unused, void *user)
{
    const hopper_kernel *k = user;
    aj_kb_add_param(kb, "in", AJ_PARAM_PTR, AJ_KB_NO_ID);
    aj_kb_add_param(kb, "out", AJ_PARAM_PTR, AJ_KB_NO_ID);
    aj_kb_smem_reserve(kb, k->smem_bytes);
    aj_kb_begin(kb, k->threads);
    k->body(kb, k->variant);
    kb_kernel_finish_one_cta(kb);
    return AJ_OK;
}

static aj_kernel *compile_for(const hopper_kernel *k, aj_target target)
{
    return kb_kernel_compile(ctx, op, k->name, build, (void *)k, target);
}

/* The sm_90a PTX holds `needle` and, where ptxas is found, assembles. */
static void check_sm90a(const hopper_kernel *k, const char *needle)
{
    aj_kernel *kern = compile_for(k, AJ_TARGET_SM_90A);
    if (!kern)
        return;
    size_t len;
    const char *ptx = aj_kernel_code(kern, &len);
    CHECK_MSG(strstr(ptx, needle) != NULL, "%s: sm_90a PTX lacks '%s'", k->name, needle);
    ptx_kernels++;
    if (have_ptxas) {
        ptxas_result r;
        ptxas_run(ptxas, "sm_90a", ptx, len, &r);
        snprintf(ptxas_log, sizeof ptxas_log, "%s", r.log);
        CHECK_MSG(r.exit_code == 0, "%s: ptxas -arch=sm_90a failed:\n%s\n%s", k->name, r.log,
                  ptx);
        ptx_assembled += r.exit_code == 0;
    }
    aj_kernel_destroy(kern);
}

/* One CTA on sim under strict mode's schedule `seed`; out starts at -1. */
static aj_status run_sim(const hopper_kernel *k, uint64_t seed)
{
    aj_kernel *kern = compile_for(k, AJ_TARGET_SIM);
    if (!kern)
        return AJ_ERR_CODEGEN;
    for (int i = 0; i < WORDS; i++)
        out[i] = -1.0f;
    const aj_sim_buffer buffers[2] = {{"in", in, sizeof in}, {"out", out, sizeof out}};
    aj_status st = kb_kernel_run_sim(ctx, kern, k->name, k->threads, buffers, 2, seed);
    aj_kernel_destroy(kern);
    return st;
}

/* The kernel faults (every seed) with a message holding each needle. */
static void expect_fault(const hopper_kernel *k, const char *const *needles)
{
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        aj_status st = run_sim(k, seed);
        CHECK_MSG(st == AJ_ERR_KERNEL_FAULT, "%s, seed %llu: %s, want a fault", k->name,
                  (unsigned long long)seed, aj_status_str(st));
        CHECK_ERROR(ctx, k->name);
        for (int n = 0; needles[n]; n++)
            CHECK_ERROR(ctx, needles[n]);
    }
}

/* ---------------------------------------------------------------- builder shorthands */

static LLVMValueRef c32(aj_kb *kb, int64_t v) { return aj_kb_i32(kb, v); }
static LLVMValueRef tid_of(aj_kb *kb) { return aj_kb_thread_id(kb); }
static LLVMValueRef tid_lt(aj_kb *kb, int n) { return aj_kb_slt(kb, tid_of(kb), c32(kb, n)); }
static LLVMValueRef sub(aj_kb *kb, LLVMValueRef a, int64_t b)
{
    return LLVMBuildSub(kb->b, a, c32(kb, b), "");
}
static LLVMValueRef smem_at(aj_kb *kb, LLVMValueRef offset) { return aj_kb_smem_ptr(kb, offset); }
static LLVMValueRef bar_at(aj_kb *kb, int offset) { return smem_at(kb, c32(kb, offset)); }

static LLVMValueRef global_at(aj_kb *kb, const char *buf, LLVMValueRef index)
{
    LLVMValueRef bytes = aj_kb_mul(kb, aj_kb_sext64(kb, index), aj_kb_i64(kb, 4));
    return aj_kb_gptr_offset(kb, aj_kb_param(kb, buf), bytes);
}

static LLVMValueRef load_in(aj_kb *kb, LLVMValueRef index)
{
    return aj_kb_load(kb, kb->t_f32, global_at(kb, "in", index), 4);
}

static void store_out(aj_kb *kb, LLVMValueRef v, LLVMValueRef index)
{
    aj_kb_store(kb, v, global_at(kb, "out", index), 4);
}

/* shared f32 word `word` of the data area (after the barriers) */
#define DATA 256
static LLVMValueRef data_word(aj_kb *kb, LLVMValueRef word)
{
    return smem_at(kb, aj_kb_add(kb, aj_kb_mul(kb, word, c32(kb, 4)), c32(kb, DATA)));
}

static void mbar_init(aj_kb *kb, int offset, int count)
{
    LLVMValueRef a[2] = {bar_at(kb, offset), c32(kb, count)};
    aj_kb_intrinsic(kb, AJ_INTR_MBARRIER_INIT, a);
}

static void mbar_init_at(aj_kb *kb, LLVMValueRef offset)
{
    LLVMValueRef a[2] = {smem_at(kb, offset), c32(kb, 1)};
    aj_kb_intrinsic(kb, AJ_INTR_MBARRIER_INIT, a);
}

static void mbar_arrive(aj_kb *kb, int offset)
{
    LLVMValueRef a[1] = {bar_at(kb, offset)};
    aj_kb_intrinsic(kb, AJ_INTR_MBARRIER_ARRIVE, a);
}

/* the rows taking (bar, bytes): arrive.expect_tx, expect_tx, complete_tx */
static void mbar_tx(aj_kb *kb, enum aj_intrinsic_id id, int offset, LLVMValueRef bytes)
{
    LLVMValueRef a[2] = {bar_at(kb, offset), bytes};
    aj_kb_intrinsic(kb, id, a);
}

static void named_bar(aj_kb *kb, enum aj_intrinsic_id id, int bar, int count)
{
    LLVMValueRef a[2] = {c32(kb, bar), c32(kb, count)};
    aj_kb_intrinsic(kb, id, a);
}

/* thread 0 initialises the mbarriers, then the CTA meets */
static void init_mbarriers(aj_kb *kb, int count0, int count1)
{
    aj_kb_if_begin(kb, tid_lt(kb, 1));
    mbar_init(kb, 0, count0);
    if (count1)
        mbar_init(kb, 8, count1);
    aj_kb_if_end(kb);
    aj_kb_barrier(kb);
}

/* ---------------------------------------------------------------- mbarrier ring */

/*
 * A two-slot-free ring of one buffer: warp 0 produces, warps 1..3 consume,
 * ROUNDS rounds.  `full` (count 32) and `empty` (count 96) at offsets 0, 8:
 *
 *   producer lane l, round r          consumer c = tid - 32, round r
 *     r > 0: wait empty, parity r-1     wait full, parity r      (RING_NO_WAIT: not)
 *     data[l] = in[32 r + l]            out[96 r + c] = data[c % 32]
 *     arrive full                       arrive empty
 */
#define ROUNDS 4
enum { RING_OK, RING_NO_WAIT };

static void ring_body(aj_kb *kb, int variant)
{
    init_mbarriers(kb, 32, 96);
    LLVMValueRef tid = tid_of(kb);
    for (int r = 0; r < ROUNDS; r++) {
        aj_kb_if_begin(kb, tid_lt(kb, 32));
        if (r > 0)
            aj_kb_mbarrier_wait(kb, bar_at(kb, 8), c32(kb, (r - 1) & 1));
        aj_kb_store(kb, load_in(kb, aj_kb_add(kb, tid, c32(kb, 32 * r))), data_word(kb, tid), 4);
        mbar_arrive(kb, 0);
        aj_kb_else(kb);
        if (variant != RING_NO_WAIT)
            aj_kb_mbarrier_wait(kb, bar_at(kb, 0), c32(kb, r & 1));
        LLVMValueRef c = sub(kb, tid, 32);
        LLVMValueRef slot = LLVMBuildAnd(kb->b, c, c32(kb, 31), "");
        store_out(kb, aj_kb_load(kb, kb->t_f32, data_word(kb, slot), 4),
                  aj_kb_add(kb, c, c32(kb, 96 * r)));
        mbar_arrive(kb, 8);
        aj_kb_if_end(kb);
    }
}

static void test_mbarrier_ring(void)
{
    for (int i = 0; i < WORDS; i++)
        in[i] = 0.25f * (float)i + 3.0f;
    const hopper_kernel ok = {"t_mbarrier_ring", 128, DATA + 128, ring_body, RING_OK};
    check_sm90a(&ok, "mbarrier.try_wait.parity.shared::cta.b64");
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        CHECK_STATUS(ctx, run_sim(&ok, seed), AJ_OK);
        int wrong = 0;
        for (int r = 0; r < ROUNDS; r++)
            for (int c = 0; c < 96; c++)
                wrong += out[96 * r + c] != in[32 * r + c % 32];
        CHECK_MSG(wrong == 0, "mbarrier ring, seed %llu: %d values crossed wrongly",
                  (unsigned long long)seed, wrong);
    }
    const hopper_kernel racy = {"t_mbarrier_ring_no_wait", 128, DATA + 128, ring_body,
                                RING_NO_WAIT};
    static const char *const race[] = {"shared-memory race: ", NULL};
    expect_fault(&racy, race);
}

/* ---------------------------------------------------------------- tx-count */

/*
 * Phase 0: thread 0 expects 256 bytes (arrive.expect_tx, or TX_SPLIT:
 * expect_tx 128 then arrive.expect_tx 128), threads 32..63 complete 8
 * each, in any order (the tx-count may dip below zero first).  Phase 1:
 * 64 bytes by threads 32..39.  TX_SHORT: thread 63 completes 0 bytes, so
 * phase 0 waits for 8 bytes forever.
 */
enum { TX_OK, TX_SPLIT, TX_SHORT };

static void tx_body(aj_kb *kb, int variant)
{
    init_mbarriers(kb, 1, 0);
    LLVMValueRef tid = tid_of(kb);
    aj_kb_if_begin(kb, tid_lt(kb, 1));
    if (variant == TX_SPLIT) {
        mbar_tx(kb, AJ_INTR_MBARRIER_EXPECT_TX, 0, c32(kb, 128));
        mbar_tx(kb, AJ_INTR_MBARRIER_ARRIVE_EXPECT_TX, 0, c32(kb, 128));
    } else {
        mbar_tx(kb, AJ_INTR_MBARRIER_ARRIVE_EXPECT_TX, 0, c32(kb, 256));
    }
    aj_kb_if_end(kb);
    aj_kb_if_begin(kb, LLVMBuildICmp(kb->b, LLVMIntSGE, tid, c32(kb, 32), ""));
    LLVMValueRef bytes = c32(kb, 8);
    if (variant == TX_SHORT)
        bytes = LLVMBuildSelect(kb->b, LLVMBuildICmp(kb->b, LLVMIntEQ, tid, c32(kb, 63), ""),
                                c32(kb, 0), bytes, "");
    mbar_tx(kb, AJ_INTR_MBARRIER_COMPLETE_TX, 0, bytes);
    aj_kb_if_end(kb);
    aj_kb_mbarrier_wait(kb, bar_at(kb, 0), c32(kb, 0));
    store_out(kb, aj_kb_f32(kb, 1.0), tid);
    aj_kb_barrier(kb);
    aj_kb_if_begin(kb, tid_lt(kb, 1));
    mbar_tx(kb, AJ_INTR_MBARRIER_ARRIVE_EXPECT_TX, 0, c32(kb, 64));
    aj_kb_if_end(kb);
    aj_kb_if_begin(kb, LLVMBuildAnd(kb->b, LLVMBuildICmp(kb->b, LLVMIntSGE, tid, c32(kb, 32), ""),
                                    tid_lt(kb, 40), ""));
    mbar_tx(kb, AJ_INTR_MBARRIER_COMPLETE_TX, 0, c32(kb, 8));
    aj_kb_if_end(kb);
    aj_kb_mbarrier_wait(kb, bar_at(kb, 0), c32(kb, 1));
    store_out(kb, aj_kb_f32(kb, 2.0), aj_kb_add(kb, tid, c32(kb, 64)));
}

static void test_mbarrier_tx(void)
{
    const hopper_kernel cases[2] = {{"t_mbarrier_tx", 64, DATA, tx_body, TX_OK},
                                    {"t_mbarrier_tx_split", 64, DATA, tx_body, TX_SPLIT}};
    check_sm90a(&cases[0], "mbarrier.complete_tx.relaxed.cta.shared::cta.b64");
    check_sm90a(&cases[1], "mbarrier.expect_tx.relaxed.cta.shared::cta.b64");
    for (int i = 0; i < 2; i++)
        for (uint64_t seed = 1; seed <= SEEDS; seed++) {
            CHECK_STATUS(ctx, run_sim(&cases[i], seed), AJ_OK);
            int wrong = 0;
            for (int t = 0; t < 64; t++)
                wrong += out[t] != 1.0f || out[64 + t] != 2.0f;
            CHECK_MSG(wrong == 0, "%s, seed %llu: %d threads passed a wait early or never",
                      cases[i].name, (unsigned long long)seed, wrong);
        }
    const hopper_kernel short_tx = {"t_mbarrier_tx_short", 64, DATA, tx_body, TX_SHORT};
    static const char *const msg[] = {
        "deadlock: thread ", "waits on the mbarrier at shared offset 0 for the phase of parity 0",
        "0 of 1 arrivals pending, tx-count 8", NULL};
    expect_fault(&short_tx, msg);
}

/* ---------------------------------------------------------------- mbarrier faults */

enum { MF_NEVER, MF_OVER_ARRIVE, MF_UNINIT, MF_COUNT0, MF_MISALIGNED, MF_PARITY, MF_TX_RANGE,
       MF_TOO_MANY, MF_TX_SUM };

static void mbarrier_fault_body(aj_kb *kb, int variant)
{
    switch (variant) {
    case MF_NEVER:   /* one arrival of two */
        init_mbarriers(kb, 2, 0);
        aj_kb_if_begin(kb, tid_lt(kb, 1));
        mbar_arrive(kb, 0);
        aj_kb_if_end(kb);
        aj_kb_mbarrier_wait(kb, bar_at(kb, 0), c32(kb, 0));
        break;
    case MF_OVER_ARRIVE:   /* the arrival is in; the phase waits for bytes */
        init_mbarriers(kb, 1, 0);
        aj_kb_if_begin(kb, tid_lt(kb, 1));
        mbar_tx(kb, AJ_INTR_MBARRIER_ARRIVE_EXPECT_TX, 0, c32(kb, 16));
        mbar_arrive(kb, 0);
        aj_kb_if_end(kb);
        break;
    case MF_UNINIT:
        aj_kb_mbarrier_wait(kb, bar_at(kb, 16), c32(kb, 0));
        break;
    case MF_COUNT0:
        init_mbarriers(kb, 0, 0);
        break;
    case MF_MISALIGNED:
        aj_kb_if_begin(kb, tid_lt(kb, 1));
        mbar_init(kb, 4, 1);
        aj_kb_if_end(kb);
        break;
    case MF_PARITY:
        init_mbarriers(kb, 1, 0);
        aj_kb_mbarrier_wait(kb, bar_at(kb, 0), c32(kb, 2));
        break;
    case MF_TOO_MANY:   /* thread t initialises the mbarriers at 16 t and 16 t + 8 */
        mbar_init_at(kb, aj_kb_mul(kb, tid_of(kb), c32(kb, 16)));
        mbar_init_at(kb, aj_kb_add(kb, aj_kb_mul(kb, tid_of(kb), c32(kb, 16)), c32(kb, 8)));
        break;
    case MF_TX_SUM:
        init_mbarriers(kb, 1, 0);
        aj_kb_if_begin(kb, tid_lt(kb, 2));
        mbar_tx(kb, AJ_INTR_MBARRIER_EXPECT_TX, 0, c32(kb, (1 << 20) - 1));
        aj_kb_if_end(kb);
        break;
    default:
        init_mbarriers(kb, 1, 0);
        mbar_tx(kb, AJ_INTR_MBARRIER_EXPECT_TX, 0, c32(kb, 1 << 20));
        break;
    }
}

static void test_mbarrier_faults(void)
{
    static const struct {
        const char *name;
        int variant;
        const char *needles[4];   /* NULL-terminated */
    } cases[] = {
        {"t_mbarrier_never", MF_NEVER,
         {"deadlock: thread ", "for the phase of parity 0", "1 of 2 arrivals pending, tx-count 0"}},
        {"t_mbarrier_over_arrive", MF_OVER_ARRIVE,
         {"thread 0: mbarrier.arrive at shared offset 0: every one of its 1 arrivals is in",
          "waits for tx-count 16"}},
        {"t_mbarrier_uninit", MF_UNINIT,
         {"mbarrier.try_wait.parity at shared offset 16, where no mbarrier.init made an mbarrier"}},
        {"t_mbarrier_count0", MF_COUNT0,
         {"thread 0: mbarrier.init at shared offset 0 with count 0, outside 1..1048575"}},
        {"t_mbarrier_misaligned", MF_MISALIGNED,
         {"thread 0: misaligned shared mbarrier.init of 8 bytes", "needs 8-byte alignment"}},
        {"t_mbarrier_parity", MF_PARITY, {"with parity 2, not 0 or 1"}},
        {"t_mbarrier_tx_range", MF_TX_RANGE,
         {"mbarrier.expect_tx at shared offset 0 with 1048576 bytes, outside 0..1048575"}},
        {"t_mbarrier_too_many", MF_TOO_MANY, {": more than 64 mbarriers in one CTA"}},
        {"t_mbarrier_tx_sum", MF_TX_SUM,
         {"mbarrier.expect_tx at shared offset 0: tx-count 1048575 + 1048575 exceeds 1048575"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const hopper_kernel k = {cases[i].name, 64, DATA + 1024, mbarrier_fault_body,
                                 cases[i].variant};
        expect_fault(&k, cases[i].needles);
    }
}

/* ---------------------------------------------------------------- named barriers */

/*
 * Warps 0-1 produce, warps 2-3 consume, over barrier 1 (full) and
 * barrier 2 (empty), 128 threads each, the pattern of a warp-specialised
 * kernel:
 *
 *   producer p, round r               consumer c = tid - 64, round r
 *     r > 0: bar.sync 2, 128            bar.sync 1, 128   (NB_NONE: none,
 *     data[p] = in[64 r + p]                               NB_OWN: bar.sync 3, 64)
 *     bar.arrive 1, 128                 out[64 r + c] = data[c]
 *                                       bar.arrive 2, 128
 */
enum { NB_OK, NB_NONE, NB_OWN };

static void named_ring_body(aj_kb *kb, int variant)
{
    LLVMValueRef tid = tid_of(kb);
    for (int r = 0; r < ROUNDS; r++) {
        aj_kb_if_begin(kb, tid_lt(kb, 64));
        if (r > 0)
            named_bar(kb, AJ_INTR_NAMED_BAR_SYNC, 2, 128);
        aj_kb_store(kb, load_in(kb, aj_kb_add(kb, tid, c32(kb, 64 * r))), data_word(kb, tid), 4);
        named_bar(kb, AJ_INTR_NAMED_BAR_ARRIVE, 1, 128);
        aj_kb_else(kb);
        if (variant == NB_OK)
            named_bar(kb, AJ_INTR_NAMED_BAR_SYNC, 1, 128);
        else if (variant == NB_OWN)
            named_bar(kb, AJ_INTR_NAMED_BAR_SYNC, 3, 64);
        LLVMValueRef c = sub(kb, tid, 64);
        store_out(kb, aj_kb_load(kb, kb->t_f32, data_word(kb, c), 4),
                  aj_kb_add(kb, c, c32(kb, 64 * r)));
        named_bar(kb, AJ_INTR_NAMED_BAR_ARRIVE, 2, 128);
        aj_kb_if_end(kb);
    }
}

enum { NF_ID, NF_COUNT, NF_MISMATCH, NF_SHORT };

static void named_fault_body(aj_kb *kb, int variant)
{
    switch (variant) {
    case NF_ID:
        named_bar(kb, AJ_INTR_NAMED_BAR_SYNC, 16, 128);
        break;
    case NF_COUNT:
        named_bar(kb, AJ_INTR_NAMED_BAR_SYNC, 1, 48);
        break;
    case NF_MISMATCH:   /* neither group can complete alone */
        aj_kb_if_begin(kb, tid_lt(kb, 32));
        named_bar(kb, AJ_INTR_NAMED_BAR_SYNC, 1, 64);
        aj_kb_else(kb);
        named_bar(kb, AJ_INTR_NAMED_BAR_SYNC, 1, 128);
        aj_kb_if_end(kb);
        break;
    default:   /* warp 3 exits */
        aj_kb_if_begin(kb, tid_lt(kb, 96));
        named_bar(kb, AJ_INTR_NAMED_BAR_SYNC, 1, 128);
        aj_kb_if_end(kb);
        break;
    }
}

static void test_named_barriers(void)
{
    const hopper_kernel ok = {"t_named_ring", 128, DATA + 256, named_ring_body, NB_OK};
    check_sm90a(&ok, "bar.arrive");
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        CHECK_STATUS(ctx, run_sim(&ok, seed), AJ_OK);
        int wrong = 0;
        for (int i = 0; i < 64 * ROUNDS; i++)
            wrong += out[i] != in[i];
        CHECK_MSG(wrong == 0, "named-barrier ring, seed %llu: %d values crossed wrongly",
                  (unsigned long long)seed, wrong);
    }
    static const char *const race[] = {"shared-memory race: ", NULL};
    const hopper_kernel none = {"t_named_ring_none", 128, DATA + 256, named_ring_body, NB_NONE};
    const hopper_kernel own = {"t_named_ring_own", 128, DATA + 256, named_ring_body, NB_OWN};
    expect_fault(&none, race);
    expect_fault(&own, race);

    static const struct {
        const char *name;
        int variant;
        const char *needles[3];   /* NULL-terminated */
    } cases[] = {
        {"t_named_id", NF_ID, {"bar.sync 16, 128: barrier ids are 0..15"}},
        {"t_named_count", NF_COUNT,
         {"bar.sync 1, 48: the thread count must be a multiple of 32 in 32..128"}},
        {"t_named_mismatch", NF_MISMATCH, {"barrier 1's round in progress counts"}},
        {"t_named_short", NF_SHORT,
         {"deadlock: thread ", "waits at named barrier 1 for 128 threads, 96 arrived"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const hopper_kernel k = {cases[i].name, 128, DATA, named_fault_body, cases[i].variant};
        expect_fault(&k, cases[i].needles);
    }
}

/* ---------------------------------------------------------------- elect.sync, fence */

/* out[t] = elect.sync 0xffffffff; out[64 + t] = elect.sync 0xaaaaaaaa on
 * the odd lanes (the even ones store 7) */
static void elect_body(aj_kb *kb, int variant)
{
    LLVMValueRef tid = tid_of(kb);
    LLVMValueRef all = c32(kb, -1);
    LLVMValueRef e = aj_kb_intrinsic(kb, AJ_INTR_ELECT_SYNC, &all);
    store_out(kb, LLVMBuildSIToFP(kb->b, e, kb->t_f32, ""), tid);
    LLVMValueRef odd = LLVMBuildICmp(kb->b, LLVMIntNE, LLVMBuildAnd(kb->b, tid, c32(kb, 1), ""),
                                     c32(kb, 0), "");
    aj_kb_if_begin(kb, odd);
    LLVMValueRef mask = c32(kb, (int32_t)0xaaaaaaaau);
    e = aj_kb_intrinsic(kb, AJ_INTR_ELECT_SYNC, &mask);
    store_out(kb, LLVMBuildSIToFP(kb->b, e, kb->t_f32, ""), aj_kb_add(kb, tid, c32(kb, 64)));
    aj_kb_else(kb);
    store_out(kb, aj_kb_f32(kb, 7.0), aj_kb_add(kb, tid, c32(kb, 64)));
    aj_kb_if_end(kb);
}

/* each thread writes its word, fences, reads it back */
static void fence_body(aj_kb *kb, int variant)
{
    LLVMValueRef tid = tid_of(kb);
    aj_kb_store(kb, load_in(kb, tid), data_word(kb, tid), 4);
    aj_kb_intrinsic(kb, AJ_INTR_FENCE_PROXY_ASYNC, NULL);
    store_out(kb, aj_kb_load(kb, kb->t_f32, data_word(kb, tid), 4), tid);
}

static void test_elect_and_fence(void)
{
    const hopper_kernel elect = {"t_elect", 64, DATA, elect_body, 0};
    check_sm90a(&elect, "elect.sync");
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        CHECK_STATUS(ctx, run_sim(&elect, seed), AJ_OK);
        /* one leader per warp and mask, in the mask, the same lane each time */
        for (int w = 0; w < 2; w++) {
            int leaders = 0, odd_leaders = 0, leader = -1, odd_leader = -1;
            for (int l = 0; l < 32; l++) {
                float a = out[32 * w + l], b = out[64 + 32 * w + l];
                leaders += a == 1.0f;
                leader = a == 1.0f ? l : leader;
                odd_leaders += b == 1.0f;
                odd_leader = b == 1.0f ? l : odd_leader;
                CHECK(a == 0.0f || a == 1.0f);
                CHECK(l % 2 ? b == 0.0f || b == 1.0f : b == 7.0f);
            }
            CHECK_MSG(leaders == 1 && odd_leaders == 1 && odd_leader % 2 == 1,
                      "elect.sync, warp %d: %d leaders, %d odd (lane %d)", w, leaders,
                      odd_leaders, odd_leader);
            CHECK_MSG(leader == 0 && odd_leader == 1, "the emulator elects the lowest lane: "
                      "%d, %d", leader, odd_leader);
        }
    }
    const hopper_kernel fence = {"t_fence_proxy_async", 64, DATA + 256, fence_body, 0};
    check_sm90a(&fence, "fence.proxy.async.shared::cta");
    CHECK_STATUS(ctx, run_sim(&fence, 1), AJ_OK);
    for (int t = 0; t < 64; t++)
        CHECK(out[t] == in[t]);
}

/* ---------------------------------------------------------------- setmaxnreg */

/*
 * 384 threads start with 168 registers each (65536 / 384, in steps of 8):
 * 64512 of the register file.  SR_OK: warpgroup 0 gives back down to 40,
 * warpgroups 1 and 2 take 232 -- which fits only after the release, so
 * the increases wait for it.  Each thread then stores 1.
 */
/* Threads below `split` call (first, first_count), the others (second,
 * second_count); a count of 0: no call. */
typedef struct setmaxnreg_plan {
    int split;
    enum aj_intrinsic_id first, second;
    int first_count, second_count;
} setmaxnreg_plan;

enum { SR_OK, SR_POOL, SR_BAD_COUNT, SR_BELOW, SR_SPLIT, SR_EXIT, SR_PARTIAL, SR_ABOVE,
       SR_VALUES };
#define INC AJ_INTR_SETMAXNREG_INC
#define DEC AJ_INTR_SETMAXNREG_DEC
static const setmaxnreg_plan setmaxnreg_plans[] = {
    [SR_OK] = {128, DEC, INC, 40, 232},
    [SR_POOL] = {0, INC, INC, 0, 232},
    [SR_BAD_COUNT] = {0, INC, INC, 0, 250},
    [SR_BELOW] = {0, INC, INC, 0, 160},
    [SR_SPLIT] = {64, DEC, DEC, 40, 48},   /* two calls in one warpgroup */
    [SR_EXIT] = {96, DEC, DEC, 40, 0},     /* warp 3 exits */
    [SR_PARTIAL] = {0, DEC, DEC, 0, 40},
    [SR_ABOVE] = {0, DEC, DEC, 0, 176},
    [SR_VALUES] = {0, DEC, DEC, 0, 0},     /* a count that differs by thread: below */
};
#undef INC
#undef DEC

static void setmaxnreg_call(aj_kb *kb, enum aj_intrinsic_id id, int count)
{
    LLVMValueRef n = c32(kb, count);
    if (count)
        aj_kb_intrinsic(kb, id, &n);
}

static void setmaxnreg_body(aj_kb *kb, int variant)
{
    const setmaxnreg_plan *p = &setmaxnreg_plans[variant];
    if (variant == SR_VALUES) {   /* sim only: nvptx wants a constant */
        LLVMValueRef n = LLVMBuildSelect(kb->b, tid_lt(kb, 64), c32(kb, 40), c32(kb, 48), "");
        aj_kb_intrinsic(kb, AJ_INTR_SETMAXNREG_DEC, &n);
    }
    aj_kb_if_begin(kb, tid_lt(kb, p->split));
    setmaxnreg_call(kb, p->first, p->first_count);
    aj_kb_else(kb);
    setmaxnreg_call(kb, p->second, p->second_count);
    aj_kb_if_end(kb);
    store_out(kb, aj_kb_f32(kb, 1.0), tid_of(kb));
}

static void test_setmaxnreg(void)
{
    const hopper_kernel ok = {"t_setmaxnreg", 384, DATA, setmaxnreg_body, SR_OK};
    check_sm90a(&ok, "setmaxnreg.inc.sync.aligned.u32 232");
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        CHECK_STATUS(ctx, run_sim(&ok, seed), AJ_OK);
        int done = 0;
        for (int t = 0; t < 384; t++)
            done += out[t] == 1.0f;
        CHECK_MSG(done == 384, "setmaxnreg, seed %llu: %d of 384 threads went on",
                  (unsigned long long)seed, done);
    }
    static const struct {
        const char *name;
        int variant, threads;
        const char *needles[4];   /* NULL-terminated */
    } cases[] = {
        {"t_setmaxnreg_pool", SR_POOL, 384,
         {"deadlock: warpgroup ", "waits in setmaxnreg.inc.sync.aligned.u32 232 for registers",
          "hold 64512 of the register file's 65536"}},
        {"t_setmaxnreg_count", SR_BAD_COUNT, 128,
         {"setmaxnreg.inc.sync.aligned.u32 250: the count must be a multiple of 8 in 24..256"}},
        {"t_setmaxnreg_below", SR_BELOW, 384,
         {"setmaxnreg.inc.sync.aligned.u32 160: the warp holds 168 registers per thread, more"}},
        {"t_setmaxnreg_split", SR_SPLIT, 128,
         {"deadlock: thread ", "for all 128 threads of warpgroup 0",
          "waits in setmaxnreg.dec.sync.aligned.u32 at another call"}},
        {"t_setmaxnreg_exit", SR_EXIT, 128,
         {"deadlock: thread ", "waits in setmaxnreg.dec.sync.aligned.u32 40 for all 128 threads",
          "thread 96 has exited"}},
        {"t_setmaxnreg_above", SR_ABOVE, 384,
         {"setmaxnreg.dec.sync.aligned.u32 176: the warp holds 168 registers per thread, fewer"}},
        {"t_setmaxnreg_values", SR_VALUES, 128,
         {"setmaxnreg.dec.sync.aligned.u32 48, while thread 0 of its warpgroup asks for 40"}},
        {"t_setmaxnreg_partial", SR_PARTIAL, 96,
         {"setmaxnreg.dec.sync.aligned.u32: warpgroup 0 of a CTA of 96 threads is not 4 whole "
          "warps"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const hopper_kernel k = {cases[i].name, cases[i].threads, DATA, setmaxnreg_body,
                                 cases[i].variant};
        expect_fault(&k, cases[i].needles);
    }
}

/* ---------------------------------------------------------------- wgmma */

/*
 * D (64 x N) = A (64 x K) B^T (B: N x K) + C over K / 16 chained wgmmas,
 * both operands K-major in shared memory (A optionally in registers), laid
 * out on the host by the PTX ISA's canonical layouts ("Shared Memory
 * Matrix Layout"), which the emulator reads through the descriptors:
 *
 *   none:  8 x 16-byte core matrices; k-blocks of 8 LBO = 128 bytes apart,
 *          8-row groups SBO = K / 8 * 128 apart; K = 32 (two wgmmas, the
 *          second starting 2 LBO further)
 *   S-byte swizzle (S = 32, 64, 128): rows of S bytes (K = S / 2), 8-row
 *          atoms SBO = 8 S apart, the 16-byte chunk of byte b of row r at
 *          chunk ^ (r % 8 >> (128 / S >> 1)); wgmma s starts 32 s bytes
 *          into the row
 *
 * or B N-major (imm-trans-b = 1: the _TB rows), by the ISA's canonical
 * N-major layouts ("Canonical Layouts", the CuTe forms transcribed):
 *
 *   none:  ((8,1,m),(8,k)) : ((1,8,SBO),(8,LBO))      in elements
 *   S-byte swizzle, E = S / 2 elements a row:
 *          ((8,E/8,m),(8,k)) : ((1,8,LBO),(E,SBO)), then the swizzle
 *
 * with the ISA's own examples ("MN-Major, no-swizzling / 32B / 64B
 * swizzling and bf16 type": N 16 / 32 / 64, their LBO and SBO) and the
 * 128-byte case of the flash forward's P V (B = V: N = Dv in 64-wide
 * panels LBO = K S apart, k-groups SBO = 8 S apart); wgmma s starts two
 * k-groups further.
 */
typedef struct wgmma_case {
    int n, bf16, a_in_registers, span;   /* span: swizzle bytes, 0 none */
    int scale_d;                         /* 0: D = A B, C ignored */
    int probe;                           /* 1: also read acc[0] before the wait */
    int a_start;                         /* A's descriptor starts this far into the tile */
    int no_proxy_fence;                  /* 1: the image's stores lack fence.proxy.async */
    int n_major_b, b_lbo, b_sbo;         /* B N-major, its LBO and SBO in bytes */
    aj_dtype f8a, f8b;                   /* 8-bit A and B (k32 rows); 0: 16-bit, by bf16 */
} wgmma_case;

#define IMG_WORDS 10240        /* the shared image: A at 0, B at 8192, 40 KiB */
#define B_BASE 8192
#define AREG_OFF 12288         /* in: the A register fragments (RS) */
#define C_OFF 16384            /* in: C, 128 registers a thread */
#define PROBE_OFF 16384        /* out: acc[0] read before the wait */

static aj_dtype a_type(const wgmma_case *c)
{
    return c->f8a ? c->f8a : c->bf16 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16;
}
static aj_dtype b_type(const wgmma_case *c)
{
    return c->f8b ? c->f8b : c->bf16 ? AJ_DTYPE_BF16 : AJ_DTYPE_F16;
}
static int esize(const wgmma_case *c) { return aj_dtype_size(a_type(c)); }
/* the elements of a row: S bytes with a swizzle, else 64 bytes (two
 * wgmmas of 32 bytes each, whatever the element size) */
static int wgmma_k(const wgmma_case *c) { return (c->span ? c->span : 64) / esize(c); }
static int wgmma_swizzle_mode(int span) { return aj_kb_swizzle_mode(span); }
static int wgmma_sbo(const wgmma_case *c) { return c->span ? 8 * c->span : 64 / 16 * 128; }

/* byte offset of element (row, k) of a K-major operand at `base` */
static uint32_t kmajor_offset(const wgmma_case *c, uint32_t base, int row, int k)
{
    uint32_t b = (uint32_t)(esize(c) * k);
    if (!c->span)
        return base + (uint32_t)(row / 8 * wgmma_sbo(c)) + b / 16 * 128 + (uint32_t)(row % 8) * 16 +
               b % 16;
    uint32_t off = base + (uint32_t)(row / 8 * wgmma_sbo(c) + row % 8 * c->span) + b;
    return off ^ ((off >> 7 & (uint32_t)(c->span / 16 - 1)) << 4);
}

/* byte offset of element (n, k) of B at `base`: K-major, or N-major */
static uint32_t b_offset(const wgmma_case *c, uint32_t base, int n, int k)
{
    if (!c->n_major_b)
        return kmajor_offset(c, base, n, k);
    uint32_t nn = (uint32_t)n, kk = (uint32_t)k, lbo = (uint32_t)c->b_lbo, sbo = (uint32_t)c->b_sbo;
    if (!c->span)
        return base + nn / 8 * sbo + kk / 8 * lbo + kk % 8 * 16 + 2 * (nn % 8);
    uint32_t e = (uint32_t)c->span / 2;
    uint32_t off = base + nn / e * lbo + kk / 8 * sbo + kk % 8 * (uint32_t)c->span + 2 * (nn % e);
    return off ^ ((off >> 7 & (uint32_t)(c->span / 16 - 1)) << 4);
}

static enum aj_intrinsic_id wgmma_row(const wgmma_case *c)
{
    return aj_kb_wgmma_row(c->n, a_type(c), b_type(c), c->a_in_registers, c->n_major_b);
}

static const wgmma_case *current_wgmma;

static LLVMValueRef acc_at(aj_kb *kb, LLVMValueRef acc, int r)
{
    LLVMValueRef idx[2] = {c32(kb, 0), c32(kb, r)};
    return LLVMBuildInBoundsGEP2(kb->b, LLVMGetAllocatedType(acc), acc, idx, 2, "");
}

static LLVMValueRef load_in_i32(aj_kb *kb, LLVMValueRef index)
{
    return aj_kb_load(kb, kb->t_i32, global_at(kb, "in", index), 4);
}

static void wgmma_body(aj_kb *kb, int variant)
{
    const wgmma_case *c = current_wgmma;
    int regs = c->n / 2, steps = wgmma_k(c) * esize(c) / 32;
    LLVMValueRef tid = tid_of(kb);
    LLVMValueRef i = aj_kb_for_begin(kb, tid, c32(kb, IMG_WORDS), c32(kb, 128), "i");
    aj_kb_store(kb, load_in_i32(kb, i), smem_at(kb, aj_kb_mul(kb, i, c32(kb, 4))), 4);
    aj_kb_for_end(kb);
    if (!c->no_proxy_fence)
        aj_kb_intrinsic(kb, AJ_INTR_FENCE_PROXY_ASYNC, NULL);
    aj_kb_barrier(kb);
    LLVMValueRef acc = aj_kb_var(kb, LLVMArrayType2(kb->t_f32, (uint64_t)regs), NULL, "acc");
    LLVMValueRef c_base = aj_kb_add(kb, aj_kb_mul(kb, tid, c32(kb, 128)), c32(kb, C_OFF));
    for (int r = 0; r < regs; r++)
        LLVMBuildStore(kb->b, load_in(kb, aj_kb_add(kb, c_base, c32(kb, r))), acc_at(kb, acc, r));
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_FENCE, NULL);
    for (int step = 0; step < steps; step++) {
        int advance = c->span ? 32 * step : 2 * 128 * step;
        /* N-major: two k-groups on (SBO apart with a swizzle, LBO without) */
        int b_advance = !c->n_major_b ? advance : 2 * step * (c->span ? c->b_sbo : c->b_lbo);
        LLVMValueRef b_desc = aj_kb_wgmma_desc(
            kb, smem_at(kb, c32(kb, B_BASE + b_advance)), c->n_major_b ? c->b_lbo : 128,
            c->n_major_b ? c->b_sbo : wgmma_sbo(c), wgmma_swizzle_mode(c->span));
        LLVMValueRef scale = c32(kb, step > 0 || c->scale_d);
        if (c->a_in_registers) {
            LLVMValueRef at = aj_kb_add(kb, aj_kb_mul(kb, tid, c32(kb, 4)),
                                        c32(kb, AREG_OFF + 512 * step));
            LLVMValueRef args[6] = {load_in_i32(kb, at),
                                    load_in_i32(kb, aj_kb_add(kb, at, c32(kb, 1))),
                                    load_in_i32(kb, aj_kb_add(kb, at, c32(kb, 2))),
                                    load_in_i32(kb, aj_kb_add(kb, at, c32(kb, 3))), b_desc, scale};
            aj_kb_wgmma(kb, wgmma_row(c), acc, args);
        } else {
            LLVMValueRef args[3] = {
                aj_kb_wgmma_desc(kb, smem_at(kb, c32(kb, c->a_start + advance)), 128, wgmma_sbo(c),
                                 wgmma_swizzle_mode(c->span)),
                b_desc, scale};
            aj_kb_wgmma(kb, wgmma_row(c), acc, args);
        }
    }
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_COMMIT_GROUP, NULL);
    if (c->probe)
        store_out(kb, LLVMBuildLoad2(kb->b, kb->t_f32, acc_at(kb, acc, 0), ""),
                  aj_kb_add(kb, tid, c32(kb, PROBE_OFF)));
    aj_kb_wgmma_wait(kb, 0, &acc, 1);
    for (int r = 0; r < regs; r++)
        store_out(kb, LLVMBuildLoad2(kb->b, kb->t_f32, acc_at(kb, acc, r), ""),
                  aj_kb_add(kb, aj_kb_mul(kb, tid, c32(kb, regs)), c32(kb, r)));
}

/* f's bits in `type` (16- or 8-bit) */
static uint16_t to_elem(float f, aj_dtype type)
{
    uint16_t bits = 0;
    aj_convert(&f, AJ_DTYPE_F32, &bits, type, 1);
    return bits;
}

static void set_elem(uint32_t offset, uint16_t bits, aj_dtype type)
{
    memcpy((char *)in + offset, &bits, (size_t)aj_dtype_size(type));
}

/* Fills in: the shared image of A and B, A's register fragments, C; and
 * the float64 D (64 x n) into d. */
static void wgmma_inputs(const wgmma_case *c, double (*d)[256])
{
    static uint16_t a[64][128], b[256][128];
    int k_total = wgmma_k(c), es = esize(c);
    const aj_dtype ta = a_type(c), tb = b_type(c);
    memset(in, 0, sizeof in);
    uint64_t state = 0x9e3779b97f4a7c15ull * (uint64_t)(c->n + 7 * c->span + 3 * c->bf16 +
                                                        11 * c->f8a + 13 * c->f8b + 1);
    for (int m = 0; m < 64; m++)
        for (int k = 0; k < k_total; k++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            a[m][k] = to_elem((float)((int)(state >> 40 & 15) - 7) / 8.0f, ta);
            set_elem(kmajor_offset(c, 0, m, k), a[m][k], ta);
        }
    for (int nn = 0; nn < c->n; nn++)
        for (int k = 0; k < k_total; k++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            /* e5m2 B past e4m3's 448 in one column: an e4m3 decoding shows */
            float scale = tb == AJ_DTYPE_F8E5M2 && nn == 5 ? 1024.0f : 1.0f;
            b[nn][k] = to_elem(scale * (float)((int)(state >> 40 & 15) - 7) / 4.0f, tb);
            set_elem(b_offset(c, B_BASE, nn, k), b[nn][k], tb);
        }
    /* A's fragment of wgmma `step`, thread 32 w + 4 g + t, register r, E =
     * 4 / element size a register: row 16 w + g + 8 (r & 1), k
     * 32 / size step + E t + 4E (r >> 1) + e (element e from the low end) */
    int E = 4 / es;
    for (int step = 0; step < k_total * es / 32; step++)
        for (int t = 0; t < 128; t++)
            for (int r = 0; r < 4; r++) {
                int row = 16 * (t / 32) + t % 32 / 4 + 8 * (r & 1);
                int k = 32 / es * step + E * (t % 4) + 4 * E * (r >> 1);
                uint32_t reg = 0;
                for (int e = 0; e < E; e++)
                    reg |= (uint32_t)a[row][k + e] << (8 * es * e);
                memcpy(&in[AREG_OFF + 512 * step + 4 * t + r], &reg, 4);
            }
    for (int row = 0; row < 64; row++)
        for (int col = 0; col < c->n; col++) {
            double sum = 0;
            for (int k = 0; k < k_total; k++)
                sum += (double)aj_fragment_element(ta, a[row][k], 0) *
                       (double)aj_fragment_element(tb, b[col][k], 0);
            d[row][col] = sum;
        }
    /* C, at each thread's registers (D's layout), and into d */
    for (int t = 0; t < 128; t++)
        for (int r = 0; r < c->n / 2; r++) {
            int row = 16 * (t / 32) + t % 32 / 4 + 8 * (r >> 1 & 1);
            int col = 8 * (r >> 2) + 2 * (t % 4) + (r & 1);
            float cv = (float)((row * 3 + col * 5) % 17) - 8.0f;
            in[C_OFF + 128 * t + r] = cv;
            d[row][col] += c->scale_d ? cv : 0.0;
        }
}

static void test_wgmma(void)
{
    static const wgmma_case cases[] = {
        /* n, bf16, A in registers, swizzle, scale-d, probe, A's start, no proxy fence,
         * B N-major, B's LBO, SBO */
        {64, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0},    {128, 1, 0, 128, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {256, 0, 0, 64, 1, 0, 0, 0, 0, 0, 0, 0, 0},  {64, 1, 0, 32, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {128, 0, 1, 128, 1, 0, 0, 0, 0, 0, 0, 0, 0}, {256, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {64, 0, 0, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0},  {256, 0, 0, 128, 1, 1, 0, 0, 0, 0, 0, 0, 0},
        {8, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},     {24, 0, 1, 64, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {200, 1, 0, 128, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        /* B N-major: the ISA's three bf16 examples (LBO, SBO from its tables) ... */
        {16, 1, 0, 0, 1, 0, 0, 0, 1, 256, 128, 0, 0},  {32, 1, 1, 32, 1, 0, 0, 0, 1, 256, 512, 0, 0},
        {64, 1, 0, 64, 1, 0, 0, 0, 1, 512, 1024, 0, 0},
        /* ... and P V's: V in 64-column panels of K = 64 keys, f16 and bf16 */
        {128, 0, 1, 128, 1, 0, 0, 0, 1, 8192, 1024, 0, 0}, {256, 1, 1, 128, 0, 0, 0, 0, 1, 8192, 1024, 0, 0},
        {64, 0, 0, 128, 1, 0, 0, 0, 1, 8192, 1024, 0, 0},
        /* 8-bit (k32): Q K^T's (both by descriptor, one format) and P V's
         * (A = P e4m3 in registers, B = the transposed V, e4m3 or e5m2),
         * every swizzle */
        {64, 0, 0, 128, 1, 0, 0, 0, 0, 0, 0, AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E4M3},
        {128, 0, 0, 64, 1, 0, 0, 0, 0, 0, 0, AJ_DTYPE_F8E5M2, AJ_DTYPE_F8E5M2},
        {32, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E4M3},
        {128, 0, 1, 128, 1, 0, 0, 0, 0, 0, 0, AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E4M3},
        {256, 0, 1, 64, 0, 0, 0, 0, 0, 0, 0, AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E5M2},
        {96, 0, 1, 32, 1, 0, 0, 0, 0, 0, 0, AJ_DTYPE_F8E4M3, AJ_DTYPE_F8E5M2},
        {8, 0, 0, 128, 1, 0, 0, 0, 0, 0, 0, AJ_DTYPE_F8E5M2, AJ_DTYPE_F8E5M2},
    };
    static double d[64][256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const wgmma_case *c = &cases[i];
        char name[64];
        const char *ta = c->f8a ? (c->f8a == AJ_DTYPE_F8E4M3 ? "e4m3" : "e5m2")
                         : c->bf16 ? "bf16" : "f16";
        const char *tb = c->f8b ? (c->f8b == AJ_DTYPE_F8E4M3 ? "e4m3" : "e5m2") : ta;
        snprintf(name, sizeof name, "t_wgmma_n%d_%s_%s_%s_sw%d%s%s", c->n, ta, tb,
                 c->a_in_registers ? "rs" : "ss", c->span, c->scale_d ? "" : "_zero_c",
                 c->n_major_b ? "_nmajor" : "");
        current_wgmma = c;
        const hopper_kernel k = {name, 128, 40960, wgmma_body, 0};
        char needle[96];
        snprintf(needle, sizeof needle, "wgmma.mma_async.sync.aligned.m64n%dk%d.f32.%s.%s", c->n,
                 c->f8a ? 32 : 16, ta, tb);
        check_sm90a(&k, needle);
        wgmma_inputs(c, d);
        /* the first case is the fixed twin of t_wgmma_no_proxy_fence: every seed */
        for (uint64_t seed = 2; i == 0 && seed <= SEEDS; seed++)
            CHECK_STATUS(ctx, run_sim(&k, seed), AJ_OK);
        CHECK_STATUS(ctx, run_sim(&k, 1), AJ_OK);
        int wrong = 0;
        for (int t = 0; t < 128; t++)
            for (int r = 0; r < c->n / 2; r++) {
                int row = 16 * (t / 32) + t % 32 / 4 + 8 * (r >> 1 & 1);
                int col = 8 * (r >> 2) + 2 * (t % 4) + (r & 1);
                double want = d[row][col], got = out[c->n / 2 * t + r];
                if (fabs(got - want) > 1e-5 * (1.0 + fabs(want)) && wrong++ < 4)
                    fprintf(stderr, "%s: thread %d register %d (D[%d][%d]) = %g, want %g\n",
                            name, t, r, row, col, got, want);
            }
        CHECK_MSG(wrong == 0, "%s: %d accumulators differ from the float64 product", name, wrong);
        /* the accumulators pass through the wait (aj_kb_wgmma_wait), so
         * ptxas needs to inject no wait of its own -- except where the
         * probe reads one early */
        if (have_ptxas)
            CHECK_MSG((strstr(ptxas_log, "C7517") != NULL) == c->probe &&
                      !strstr(ptxas_log, "serializ"), "%s: ptxas says:\n%s", name, ptxas_log);
        for (int t = 0; c->probe && t < 128; t++)
            CHECK_MSG(isnan(out[PROBE_OFF + t]), "%s: thread %d read %g from its accumulator "
                      "before the wait, want NaN (in flight)", name, t, out[PROBE_OFF + t]);
    }
}

/* One m64n64k16 wgmma whose operands are wrong: B's descriptor differs
 * between threads (WM_UNIFORM), reaches past shared memory (WM_BOUNDS) or
 * has a base offset (WM_BASE). */
enum { WM_UNIFORM, WM_BOUNDS, WM_BASE };

static void wgmma_misuse_body(aj_kb *kb, int variant)
{
    LLVMValueRef acc = aj_kb_var(kb, LLVMArrayType2(kb->t_f32, 32), NULL, "acc");
    LLVMValueRef b_offset = variant == WM_UNIFORM
        ? LLVMBuildSelect(kb->b, tid_lt(kb, 64), c32(kb, 0), c32(kb, 1024), "")
        : c32(kb, variant == WM_BOUNDS ? 3072 : 0);
    LLVMValueRef b_desc = aj_kb_wgmma_desc(kb, smem_at(kb, b_offset), 128, 256,
                                           AJ_WGMMA_SWIZZLE_NONE);
    if (variant == WM_BASE)
        b_desc = LLVMBuildOr(kb->b, b_desc, aj_kb_i64(kb, 1ll << 49), "");
    LLVMValueRef args[3] = {aj_kb_wgmma_desc(kb, smem_at(kb, c32(kb, 0)), 128, 256,
                                             AJ_WGMMA_SWIZZLE_NONE), b_desc, c32(kb, 0)};
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_FENCE, NULL);
    aj_kb_wgmma(kb, AJ_INTR_WGMMA_M64N64K16_F16_SS, acc, args);
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_COMMIT_GROUP, NULL);
    aj_kb_wgmma_wait(kb, 0, &acc, 1);
}

/* A 128-byte-swizzled A from the second row of its atom; a wait_group 8. */
static void wgmma_wait_8_body(aj_kb *kb, int variant)
{
    LLVMValueRef n = c32(kb, 8);
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_WAIT_GROUP, &n);
}

static void test_wgmma_faults(void)
{
    static const wgmma_case misaligned = {64, 0, 0, 128, 1, 0, 128, 0, 0, 0, 0, 0, 0};
    static const wgmma_case unfenced = {64, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0};
    current_wgmma = &misaligned;
    const hopper_kernel k = {"t_wgmma_swizzle_start", 128, 40960, wgmma_body, 0};
    static const char *const start[] = {
        "thread 0: wgmma.mma_async: the A descriptor 0x40000040",
        "has a 128-byte swizzle from shared offset 128, not in the first row of a "
        "1024-byte-aligned swizzle atom", NULL};
    expect_fault(&k, start);
    current_wgmma = &unfenced;
    const hopper_kernel k2 = {"t_wgmma_no_proxy_fence", 128, 40960, wgmma_body, 0};
    static const char *const proxy[] = {
        "wgmma.mma_async reads shared offset ", "which thread ",
        "wrote through the generic proxy with no fence.proxy.async after it", NULL};
    expect_fault(&k2, proxy);
    static const struct {
        const char *name;
        int variant;
        const char *needle;
    } misuse[] = {
        {"t_wgmma_nonuniform", WM_UNIFORM, "wgmma.mma_async with other operands than thread 0 "
         "of its warpgroup"},
        {"t_wgmma_bounds", WM_BOUNDS, "thread 0: wgmma.mma_async reads element (32, 0) at shared "
         "offset 4096, outside the 4096 bytes of shared memory"},
        {"t_wgmma_base_offset", WM_BASE, "has a base offset (bits 49-51), which the emulator "
         "does not model"},
    };
    for (size_t i = 0; i < sizeof misuse / sizeof misuse[0]; i++) {
        const hopper_kernel k3 = {misuse[i].name, 128, 4096, wgmma_misuse_body, misuse[i].variant};
        const char *needles[2] = {misuse[i].needle, NULL};
        expect_fault(&k3, needles);
    }
    const hopper_kernel wait8 = {"t_wgmma_wait_8", 128, DATA, wgmma_wait_8_body, 0};
    static const char *const wait[] = {"wgmma.wait_group.sync.aligned 8: N must be 0..7", NULL};
    expect_fault(&wait8, wait);
}

/* ---------------------------------------------------------------- TMA */

/*
 * A tensor of `rank` dimensions in `in` (its map at byte 0 of in, the data
 * at DATA_BYTE, dimension 0 contiguous, rows padded to a multiple of 16
 * bytes), one box of it at coordinates c.  TMA_LOAD: thread 0 expects the
 * box's bytes and issues the load into shared TILE, every thread waits on
 * the mbarrier (TMA_NO_WAIT: does not) and copies the tile to out.
 * TMA_STORE: the threads write the tile from in[STORE_SRC ..], fence,
 * meet, and thread 0 stores it to a tensor in `out` (map at byte 128 of in).
 */
enum { TMA_LOAD, TMA_NO_WAIT, TMA_STORE, TMA_STORE_NO_FENCE };
typedef struct tma_case {
    const char *name;
    int kind, rank, elem_bytes, span, oob_nan;
    uint64_t dims[5];
    uint32_t box[5];
    int32_t c[5];
    int tile;                  /* shared offset of the box */
} tma_case;

#define DATA_BYTE 4096
#define STORE_SRC 16384        /* in: the tile the store kernel writes */
#define TILE_WORDS 4096        /* at most 16 KiB of box */

static const tma_case *current_tma;

static uint32_t tma_box_bytes(const tma_case *c)
{
    uint32_t n = (uint32_t)c->elem_bytes;
    for (int d = 0; d < c->rank; d++)
        n *= c->box[d];
    return n;
}

static void tma_strides(const tma_case *c, uint64_t *strides)
{
    strides[0] = (uint64_t)c->elem_bytes;
    for (int d = 1; d < c->rank; d++) {
        uint64_t row = d == 1 ? c->dims[0] * (uint64_t)c->elem_bytes
                              : c->dims[d - 1] * strides[d - 1];
        strides[d] = (row + 15) / 16 * 16;
    }
}

static void tma_call(aj_kb *kb, const tma_case *c, int load)
{
    /* [load][rank - 2] */
    static const enum aj_intrinsic_id ids[2][4] = {
        {AJ_INTR_TMA_STORE_2D, AJ_INTR_TMA_STORE_3D, AJ_INTR_TMA_STORE_4D, AJ_INTR_TMA_STORE_5D},
        {AJ_INTR_TMA_LOAD_2D, AJ_INTR_TMA_LOAD_3D, AJ_INTR_TMA_LOAD_4D, AJ_INTR_TMA_LOAD_5D},
    };
    const int rank = c->rank;
    CHECK_MSG(rank >= 2 && rank <= 5, "%s: rank %d", c->name, rank);
    LLVMValueRef args[8];
    int n = 0;
    if (load)
        args[n++] = smem_at(kb, c32(kb, c->tile));
    args[n++] = LLVMBuildPtrToInt(kb->b, global_at(kb, "in", c32(kb, load ? 0 : 32)), kb->t_i64,
                                  "");
    for (int d = 0; d < c->rank; d++)
        args[n++] = c32(kb, c->c[d]);
    args[n++] = load ? bar_at(kb, 0) : smem_at(kb, c32(kb, c->tile));
    aj_kb_intrinsic(kb, ids[load != 0][rank < 2 ? 0 : rank > 5 ? 3 : rank - 2], args);
}

static void tma_body(aj_kb *kb, int variant)
{
    const tma_case *c = current_tma;
    LLVMValueRef tid = tid_of(kb);
    int words = (int)tma_box_bytes(c) / 4;
    if (c->kind == TMA_STORE || c->kind == TMA_STORE_NO_FENCE) {
        LLVMValueRef i = aj_kb_for_begin(kb, tid, c32(kb, words), c32(kb, 128), "i");
        aj_kb_store(kb, load_in_i32(kb, aj_kb_add(kb, i, c32(kb, STORE_SRC))),
                    smem_at(kb, aj_kb_add(kb, aj_kb_mul(kb, i, c32(kb, 4)), c32(kb, c->tile))), 4);
        aj_kb_for_end(kb);
        if (c->kind == TMA_STORE)
            aj_kb_intrinsic(kb, AJ_INTR_FENCE_PROXY_ASYNC, NULL);
        aj_kb_barrier(kb);
        aj_kb_if_begin(kb, tid_lt(kb, 1));
        tma_call(kb, c, 0);
        aj_kb_intrinsic(kb, AJ_INTR_BULK_COMMIT_GROUP, NULL);
        LLVMValueRef zero = c32(kb, 0);
        aj_kb_intrinsic(kb, AJ_INTR_BULK_WAIT_GROUP_READ, &zero);
        aj_kb_if_end(kb);
        return;
    }
    init_mbarriers(kb, 1, 0);
    aj_kb_if_begin(kb, tid_lt(kb, 1));
    mbar_tx(kb, AJ_INTR_MBARRIER_ARRIVE_EXPECT_TX, 0, c32(kb, (int64_t)tma_box_bytes(c)));
    tma_call(kb, c, 1);
    aj_kb_if_end(kb);
    if (c->kind != TMA_NO_WAIT)
        aj_kb_mbarrier_wait(kb, bar_at(kb, 0), c32(kb, 0));
    LLVMValueRef i = aj_kb_for_begin(kb, tid, c32(kb, words), c32(kb, 128), "i");
    LLVMValueRef v = aj_kb_load(kb, kb->t_i32,
                                smem_at(kb, aj_kb_add(kb, aj_kb_mul(kb, i, c32(kb, 4)),
                                                      c32(kb, c->tile))), 4);
    aj_kb_store(kb, v, global_at(kb, "out", i), 4);
    aj_kb_for_end(kb);
}

/* The box's element e: its global element index (or -1 out of bounds)
 * and its byte in the tile, swizzled like the hardware's. */
static int64_t tma_element(const tma_case *c, const uint64_t *strides, uint32_t e,
                           uint32_t *tile_byte)
{
    uint32_t rest = e;
    int64_t at = 0;
    int inside = 1;
    for (int d = 0; d < c->rank; d++) {
        int64_t x = (int64_t)c->c[d] + rest % c->box[d];
        rest /= c->box[d];
        inside &= x >= 0 && (uint64_t)x < c->dims[d];
        at += x * (int64_t)strides[d];
    }
    uint32_t off = (uint32_t)c->tile + e * (uint32_t)c->elem_bytes;
    if (c->span)
        off ^= (off >> 7 & (uint32_t)(c->span / 16 - 1)) << 4;
    *tile_byte = off - (uint32_t)c->tile;
    return inside ? at : -1;
}

static void encode_map(const tma_case *c, void *map, const void *base)
{
    aj_sim_tensor_map_args a = {c->elem_bytes, c->rank, base, {0}, {0}, {0}, c->span, c->oob_nan};
    tma_strides(c, a.strides);
    memcpy(a.dims, c->dims, sizeof a.dims);
    memcpy(a.box, c->box, sizeof a.box);
    CHECK_STATUS(ctx, aj_sim_tensor_map_encode(ctx, map, &a), AJ_OK);
}

static void check_tma_case(const tma_case *c)
{
    uint64_t strides[5];
    tma_strides(c, strides);
    memset(in, 0, sizeof in);
    uint8_t *data = (uint8_t *)in + DATA_BYTE;
    for (int i = DATA_BYTE; i < (int)sizeof in; i++)
        ((uint8_t *)in)[i] = (uint8_t)(i * 7 + 3);
    encode_map(c, in, data);
    encode_map(c, (uint8_t *)in + 128, out);
    current_tma = c;
    const hopper_kernel k = {c->name, 128, 32768, tma_body, 0};
    if (c->kind != TMA_STORE_NO_FENCE)
        check_sm90a(&k, c->kind == TMA_STORE ? "cp.async.bulk.tensor"
                                             : "mbarrier::complete_tx::bytes");
    uint32_t total = tma_box_bytes(c) / (uint32_t)c->elem_bytes;
    if (c->kind == TMA_NO_WAIT) {
        static const char *const race[] = {"shared-memory race: ", NULL};
        expect_fault(&k, race);
        return;
    }
    if (c->kind == TMA_STORE_NO_FENCE) {
        static const char *const unfenced[] = {
            "cp.async.bulk.tensor (TMA store) reads shared offset 1024, which thread 0 wrote "
            "through the generic proxy with no fence.proxy.async after it", NULL};
        expect_fault(&k, unfenced);
        return;
    }
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        CHECK_STATUS(ctx, run_sim(&k, seed), AJ_OK);
        int wrong = 0;
        for (uint32_t e = 0; e < total; e++) {
            uint32_t byte;
            int64_t at = tma_element(c, strides, e, &byte);
            uint8_t want[8], got[8];
            if (c->kind == TMA_STORE) {
                if (at < 0)
                    continue;
                memcpy(want, (uint8_t *)in + 4 * STORE_SRC + byte, (size_t)c->elem_bytes);
                memcpy(got, (uint8_t *)out + at, (size_t)c->elem_bytes);
            } else {
                if (at >= 0)
                    memcpy(want, data + at, (size_t)c->elem_bytes);
                else
                    memset(want, c->oob_nan ? 0xff : 0, (size_t)c->elem_bytes);
                memcpy(got, (uint8_t *)out + byte, (size_t)c->elem_bytes);
            }
            if (memcmp(want, got, (size_t)c->elem_bytes) && wrong++ < 4)
                fprintf(stderr, "%s: box element %u (tile byte %u, global %lld) differs\n",
                        c->name, e, byte, (long long)at);
        }
        CHECK_MSG(wrong == 0, "%s, seed %llu: %d elements wrong", c->name,
                  (unsigned long long)seed, wrong);
    }
}

static void test_tma(void)
{
    static const tma_case cases[] = {
        /* 128-byte swizzle, out of bounds past both ends, zeros / NaN */
        {"t_tma_2d_sw128", TMA_LOAD, 2, 2, 128, 0, {100, 50}, {64, 16}, {64, 40}, 1024},
        {"t_tma_2d_sw128_nan", TMA_LOAD, 2, 2, 128, 1, {100, 50}, {64, 16}, {64, 40}, 1024},
        {"t_tma_2d_sw64", TMA_LOAD, 2, 2, 64, 0, {40, 30}, {32, 8}, {-8, 0}, 512},
        {"t_tma_3d_sw32", TMA_LOAD, 3, 2, 32, 0, {16, 5, 3}, {16, 4, 2}, {0, 3, -1}, 256},
        {"t_tma_4d", TMA_LOAD, 4, 4, 0, 1, {8, 3, 2, 3}, {4, 2, 2, 2}, {6, -1, 1, 2}, 128},
        {"t_tma_5d", TMA_LOAD, 5, 4, 0, 0, {4, 3, 2, 2, 3}, {4, 2, 2, 2, 2}, {0, 2, 1, -1, 2}, 128},
        {"t_tma_2d_store", TMA_STORE, 2, 2, 128, 0, {100, 50}, {64, 16}, {64, 40}, 1024},
        {"t_tma_3d_store", TMA_STORE, 3, 4, 0, 0, {8, 5, 3}, {4, 4, 2}, {6, 3, 2}, 128},
        {"t_tma_no_wait", TMA_NO_WAIT, 2, 2, 128, 0, {100, 50}, {64, 16}, {0, 0}, 1024},
        {"t_tma_store_no_fence", TMA_STORE_NO_FENCE, 2, 2, 128, 0, {100, 50}, {64, 16}, {64, 40},
         1024},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_tma_case(&cases[i]);
}

/* Each rule of cuTensorMapEncodeTiled refuses with a message. */
static void test_tensor_map_rules(void)
{
    static const struct {
        aj_sim_tensor_map_args a;
        int misalign_map;
        const char *needle;
    } cases[] = {
        {{2, 2, (const char *)in + 8, {64, 8}, {0, 128}, {64, 8}, 0, 0}, 0,
         "is not 16-byte aligned"},
        {{2, 6, in, {64, 8}, {0, 128}, {64, 8}, 0, 0}, 0, "rank = 6, want 1..5"},
        {{3, 2, in, {64, 8}, {0, 192}, {64, 8}, 0, 0}, 0, "elem_bytes = 3"},
        {{2, 2, in, {64, 0}, {0, 128}, {64, 8}, 0, 0}, 0, "dims[1] = 0, want 1..2^32"},
        {{2, 2, in, {64, 8}, {0, 136}, {64, 8}, 0, 0}, 0,
         "strides[1] = 136 bytes, want a multiple of 16 under 2^40"},
        {{2, 2, in, {64, 8}, {0, 1ull << 40}, {64, 8}, 0, 0}, 0, "under 2^40"},
        {{2, 2, in, {64, 8}, {0, 128}, {64, 257}, 0, 0}, 0, "box[1] = 257, want 1..256"},
        {{2, 2, in, {64, 8}, {0, 128}, {12, 8}, 0, 0}, 0,
         "box[0] = 12 elements of 2 bytes is 24 bytes, not a multiple of 16"},
        {{2, 2, in, {128, 8}, {0, 256}, {128, 8}, 128, 0}, 0,
         "the inner box of 256 bytes exceeds the 128-byte swizzle span"},
        {{2, 2, in, {64, 8}, {0, 128}, {64, 8}, 48, 0}, 0, "span = 48"},
        {{2, 2, in, {64, 8}, {0, 128}, {64, 8}, 0, 0}, 1, "is not 64-byte aligned"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        _Alignas(64) uint8_t map[192];
        CHECK_STATUS(ctx, aj_sim_tensor_map_encode(ctx, map + 32 * cases[i].misalign_map,
                                                   &cases[i].a), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, cases[i].needle);
    }
}

static void bulk_wait_64_body(aj_kb *kb, int variant)
{
    LLVMValueRef n = c32(kb, 64);
    aj_kb_intrinsic(kb, AJ_INTR_BULK_WAIT_GROUP_READ, &n);
}

/* TMA misuse on sim: a 128-byte-swizzled box at a 512-aligned offset; a
 * map never encoded; a 3-d copy through a 2-d map; a map over memory that
 * is not the launch's; a bulk wait_group 64. */
static void test_tma_faults(void)
{
    static const tma_case unaligned = {"t_tma_unaligned", TMA_LOAD, 2, 2, 128, 0, {100, 50},
                                       {64, 16}, {0, 0}, 512};
    static const tma_case rank3 = {"t_tma_rank", TMA_LOAD, 3, 2, 0, 0, {64, 8, 2}, {64, 8, 1},
                                   {0, 0, 0}, 1024};
    static const char *const align[] = {
        "thread 0: cp.async.bulk.tensor (TMA load): shared offset 512 is not 1024-byte aligned, "
        "as the swizzle pattern needs", NULL};
    static const char *const unmapped[] = {"holds no tensor map", NULL};
    static const char *const rank[] = {"the tensor map has rank 2", NULL};
    memset(in, 0, sizeof in);
    current_tma = &unaligned;
    encode_map(&unaligned, in, (uint8_t *)in + DATA_BYTE);
    const hopper_kernel k1 = {"t_tma_unaligned", 128, 32768, tma_body, 0};
    expect_fault(&k1, align);
    current_tma = &rank3;
    const hopper_kernel k2 = {"t_tma_rank", 128, 32768, tma_body, 0};
    expect_fault(&k2, rank);
    memset(in, 0, 128);
    expect_fault(&k2, unmapped);

    static const tma_case outside = {"t_tma_outside", TMA_LOAD, 2, 2, 0, 0, {64, 8}, {64, 8},
                                     {0, 0}, 1024};
    _Alignas(16) static uint16_t elsewhere[64 * 8];
    encode_map(&outside, in, elsewhere);
    current_tma = &outside;
    const hopper_kernel k3 = {"t_tma_outside", 128, 32768, tma_body, 0};
    static const char *const bounds[] = {"out-of-bounds global TMA load of 2 bytes", NULL};
    expect_fault(&k3, bounds);
    const hopper_kernel k4 = {"t_bulk_wait_64", 128, DATA, bulk_wait_64_body, 0};
    static const char *const wait[] = {"cp.async.bulk.wait_group.read 64: N must be 0..63", NULL};
    expect_fault(&k4, wait);
}

/* ---------------------------------------------------------------- async hazards */

/*
 * A TMA + wgmma pipeline of one stage: thread 128 (the producer) loads A
 * (64 x 64) and B's rows 0..63 (64 x 64, both f16, K-major, 128-byte
 * swizzle) by TMA on `full`, waits for `empty` and loads B's rows 64..127
 * into the same stage; warpgroup 0 waits for `full`, computes D = A B^T in
 * four k-steps and releases the stage on `empty` (count 128).  The
 * variants break one rule each (issue #30, stage 1 d):
 *
 *   AP_EARLY_RELEASE      releases the stage before its wgmma's wait_group
 *   AP_ACC_WRITE          writes an accumulator between issue and wait
 *   AP_NO_FENCE           no wgmma.fence before the first wgmma
 *   AP_RESCALE_NO_FENCE   rescales D after the wait, then wgmmas again with
 *                         no wgmma.fence in between (AP_RESCALE: with one)
 */
enum { AP_OK, AP_EARLY_RELEASE, AP_ACC_WRITE, AP_NO_FENCE, AP_RESCALE, AP_RESCALE_NO_FENCE };
#define AP_A_TILE 9216
#define AP_B_TILE 1024
#define AP_A_BYTE 4096         /* in: A, then B (128 rows) */
#define AP_B_BYTE (4096 + 8192)

static void ap_wgmmas(aj_kb *kb, LLVMValueRef acc, int scale_first)
{
    for (int step = 0; step < 4; step++) {
        LLVMValueRef args[3] = {
            aj_kb_wgmma_desc(kb, smem_at(kb, c32(kb, AP_A_TILE + 32 * step)), 16, 1024,
                             AJ_WGMMA_SWIZZLE_128B),
            aj_kb_wgmma_desc(kb, smem_at(kb, c32(kb, AP_B_TILE + 32 * step)), 16, 1024,
                             AJ_WGMMA_SWIZZLE_128B),
            c32(kb, step > 0 || scale_first)};
        aj_kb_wgmma(kb, AJ_INTR_WGMMA_M64N64K16_F16_SS, acc, args);
    }
    aj_kb_intrinsic(kb, AJ_INTR_WGMMA_COMMIT_GROUP, NULL);
}

static void ap_tma(aj_kb *kb, int map_byte, int tile, int row)
{
    LLVMValueRef map = global_at(kb, "in", c32(kb, map_byte / 4));
    LLVMValueRef args[5] = {smem_at(kb, c32(kb, tile)),
                            LLVMBuildPtrToInt(kb->b, map, kb->t_i64, ""),
                            c32(kb, 0), c32(kb, row), bar_at(kb, 0)};
    aj_kb_intrinsic(kb, AJ_INTR_TMA_LOAD_2D, args);
}

static void ap_producer(aj_kb *kb)
{
    mbar_tx(kb, AJ_INTR_MBARRIER_ARRIVE_EXPECT_TX, 0, c32(kb, 16384));
    ap_tma(kb, 0, AP_A_TILE, 0);
    ap_tma(kb, 128, AP_B_TILE, 0);
    aj_kb_mbarrier_wait(kb, bar_at(kb, 8), c32(kb, 0));
    mbar_tx(kb, AJ_INTR_MBARRIER_ARRIVE_EXPECT_TX, 0, c32(kb, 8192));
    ap_tma(kb, 128, AP_B_TILE, 64);
    aj_kb_mbarrier_wait(kb, bar_at(kb, 0), c32(kb, 1));
}

static void ap_consumer(aj_kb *kb, int variant, LLVMValueRef acc)
{
    aj_kb_mbarrier_wait(kb, bar_at(kb, 0), c32(kb, 0));
    if (variant != AP_NO_FENCE)
        aj_kb_intrinsic(kb, AJ_INTR_WGMMA_FENCE, NULL);
    ap_wgmmas(kb, acc, 0);
    if (variant == AP_ACC_WRITE)
        LLVMBuildStore(kb->b, aj_kb_f32(kb, 0.0), acc_at(kb, acc, 0));
    if (variant != AP_EARLY_RELEASE)
        aj_kb_wgmma_wait(kb, 0, &acc, 1);
    if (variant == AP_RESCALE || variant == AP_RESCALE_NO_FENCE) {
        for (int r = 0; r < 32; r++) {
            LLVMValueRef at = acc_at(kb, acc, r);
            LLVMBuildStore(kb->b, LLVMBuildFMul(kb->b, LLVMBuildLoad2(kb->b, kb->t_f32, at, ""),
                                                aj_kb_f32(kb, 0.5), ""), at);
        }
        if (variant == AP_RESCALE)
            aj_kb_intrinsic(kb, AJ_INTR_WGMMA_FENCE, NULL);
        ap_wgmmas(kb, acc, 1);
        aj_kb_wgmma_wait(kb, 0, &acc, 1);
    }
    mbar_arrive(kb, 8);
}

static void async_pipeline_body(aj_kb *kb, int variant)
{
    init_mbarriers(kb, 1, 128);
    LLVMValueRef acc = aj_kb_var(kb, LLVMArrayType2(kb->t_f32, 32), NULL, "acc");
    LLVMValueRef tid = tid_of(kb);
    aj_kb_if_begin(kb, LLVMBuildICmp(kb->b, LLVMIntEQ, tid, c32(kb, 128), ""));
    ap_producer(kb);
    aj_kb_if_end(kb);
    aj_kb_if_begin(kb, tid_lt(kb, 128));
    ap_consumer(kb, variant, acc);
    aj_kb_if_end(kb);
    aj_kb_barrier(kb);
    aj_kb_if_begin(kb, tid_lt(kb, 128));
    if (variant == AP_EARLY_RELEASE)
        aj_kb_wgmma_wait(kb, 0, &acc, 1);
    for (int r = 0; r < 32; r++)
        store_out(kb, LLVMBuildLoad2(kb->b, kb->t_f32, acc_at(kb, acc, r), ""),
                  aj_kb_add(kb, aj_kb_mul(kb, tid, c32(kb, 32)), c32(kb, r)));
    aj_kb_if_end(kb);
}

/* A and B in `in` with their tensor maps; d = A B0^T (B0: B's rows 0..63). */
static void async_pipeline_inputs(double (*d)[256])
{
    memset(in, 0, sizeof in);
    uint16_t *a = (uint16_t *)((uint8_t *)in + AP_A_BYTE);
    uint16_t *b = (uint16_t *)((uint8_t *)in + AP_B_BYTE);
    for (int i = 0; i < 64 * 64; i++)
        a[i] = aj_f32_to_f16((float)(i * 7 % 13 - 6) / 8.0f);
    for (int i = 0; i < 128 * 64; i++)
        b[i] = aj_f32_to_f16((float)(i * 5 % 11 - 5) / 4.0f);
    aj_sim_tensor_map_args am = {2, 2, a, {64, 64}, {0, 128}, {64, 64}, 128, 0};
    aj_sim_tensor_map_args bm = {2, 2, b, {64, 128}, {0, 128}, {64, 64}, 128, 0};
    CHECK_STATUS(ctx, aj_sim_tensor_map_encode(ctx, in, &am), AJ_OK);
    CHECK_STATUS(ctx, aj_sim_tensor_map_encode(ctx, (uint8_t *)in + 128, &bm), AJ_OK);
    for (int m = 0; m < 64; m++)
        for (int n = 0; n < 64; n++) {
            double sum = 0;
            for (int k = 0; k < 64; k++)
                sum += (double)aj_f16_to_f32(a[64 * m + k]) * aj_f16_to_f32(b[64 * n + k]);
            d[m][n] = sum;
        }
}

static void test_async_hazards(void)
{
    static double d[64][256];
    async_pipeline_inputs(d);
    static const struct {
        const char *name;
        int variant;
        double scale;          /* the good ones' D = scale A B0^T */
        const char *needles[3];
    } cases[] = {
        {"t_async_pipeline", AP_OK, 1.0, {NULL}},
        {"t_async_rescale", AP_RESCALE, 1.5, {NULL}},
        {"t_async_early_release", AP_EARLY_RELEASE, 0,
         {"shared-memory race: TMA load", "overwrites what was read by thread 0"}},
        {"t_async_acc_write", AP_ACC_WRITE, 0,
         {"accumulator register 0 was written while its wgmma was in flight"}},
        {"t_async_no_fence", AP_NO_FENCE, 0,
         {"wgmma.mma_async on accumulators no wgmma has written, with no wgmma.fence"}},
        {"t_async_rescale_no_fence", AP_RESCALE_NO_FENCE, 0,
         {"on accumulators written since the last wgmma.wait_group, with no wgmma.fence"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const hopper_kernel k = {cases[i].name, 256, 20480, async_pipeline_body,
                                 cases[i].variant};
        if (cases[i].needles[0]) {
            expect_fault(&k, cases[i].needles);
            continue;
        }
        check_sm90a(&k, "cp.async.bulk.tensor.2d");
        for (uint64_t seed = 1; seed <= SEEDS; seed++) {
            CHECK_STATUS(ctx, run_sim(&k, seed), AJ_OK);
            int wrong = 0;
            for (int t = 0; t < 128; t++)
                for (int r = 0; r < 32; r++) {
                    int row = 16 * (t / 32) + t % 32 / 4 + 8 * (r >> 1 & 1);
                    int col = 8 * (r >> 2) + 2 * (t % 4) + (r & 1);
                    double want = cases[i].scale * d[row][col];
                    wrong += fabs(out[32 * t + r] - want) > 1e-4 * (1 + fabs(want));
                }
            CHECK_MSG(wrong == 0, "%s, seed %llu: %d accumulators wrong", cases[i].name,
                      (unsigned long long)seed, wrong);
        }
    }
}

int main(void)
{
    have_ptxas = kb_kernel_setup(&ctx, &op, ptxas, sizeof ptxas, "sm_90a");

    test_mbarrier_ring();
    test_mbarrier_tx();
    test_mbarrier_faults();
    test_named_barriers();
    test_elect_and_fence();
    test_setmaxnreg();
    test_wgmma();
    test_wgmma_faults();
    test_tensor_map_rules();
    test_tma();
    test_tma_faults();
    test_async_hazards();

    printf("PTX: %d kernels generated, %d assembled by ptxas (sm_90a)\n", ptx_kernels,
           ptx_assembled);
    aj_op_destroy(op);
    aj_ctx_destroy(ctx);
    return check_report();
}
