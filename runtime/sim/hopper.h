/*
 * hopper.h -- the emulator's model of sm_90's asynchronous machinery
 * (hopper.c): mbarriers with phases and transaction counts, named
 * barriers, fence.proxy.async, setmaxnreg and wgmma, and the warpgroup
 * collectives they need.  docs/sim.md, "Hopper's machinery", describes the model.
 */
#ifndef AJ_RUNTIME_SIM_HOPPER_H
#define AJ_RUNTIME_SIM_HOPPER_H

#include <stdint.h>

#include "runtime/sim/emulator.h"

struct sim_thread;
struct sim_worker;

/* What a thread in state T_HOPPER waits for. */
enum aj_sim_hopper_wait {
    AJ_SIM_WAIT_MBARRIER,       /* a phase of an mbarrier to complete */
    AJ_SIM_WAIT_NAMED_BARRIER,  /* bar.sync id, count: the count to arrive */
    AJ_SIM_WAIT_WARPGROUP,      /* the 128 threads of its warpgroup (setmaxnreg, wgmma) */
};

/* Per thread: the wait in progress and what the race detector needs. */
typedef struct aj_sim_hopper_thread {
    enum aj_sim_hopper_wait wait;
    int32_t mbarrier;          /* AJ_SIM_WAIT_MBARRIER: index in the CTA's table */
    int32_t parity;            /*   and the parity of the phase waited for */
    int32_t bar_id;            /* AJ_SIM_WAIT_NAMED_BARRIER: 0..15 */
    int32_t wg_op, wg_value;   /* AJ_SIM_WAIT_WARPGROUP: the operation and its operand */
    struct {                   /* wgmma.mma_async's operands (wg_value: N) */
        float *acc;
        uint64_t a_desc, b_desc;
        uint32_t a[4];
        int32_t scale_d, bf16, a_in_registers;
    } mma;
    /* the sync counter at the thread's latest fence.proxy.async: generic
     * writes before it are visible to the async proxy (TMA, wgmma) */
    uint32_t proxy_fence;
} aj_sim_hopper_thread;

/* Per CTA: the mbarriers, named barriers and register pool. */
typedef struct aj_sim_hopper_cta aj_sim_hopper_cta;

/* NULL when out of memory; freed (NULL too) by aj_sim_hopper_cta_free. */
/* `strict`: keep the arrival stamps the race detector orders by. */
aj_sim_hopper_cta *aj_sim_hopper_cta_new(const aj_sim_launch *launch, int nthreads, int strict);
void aj_sim_hopper_cta_free(aj_sim_hopper_cta *h);
/* A new CTA of worker w: no mbarriers, every barrier empty, the register
 * pool as launched. */
void aj_sim_hopper_cta_start(struct sim_worker *w);
/* The scheduler's settle step: threads whose wait is over become READY;
 * returns how many (0 after recording a fault). */
int aj_sim_hopper_settle(struct sim_worker *w);
/* Thread tid waits in T_HOPPER and nothing can move: records why. */
void aj_sim_hopper_diagnose(struct sim_worker *w, int tid);

/*
 * The emulator entries of hopper.c's intrinsics.def rows, bound by
 * aj_sim_symbols as "aj_sim_<name>"; each takes the thread first and, for
 * the collectives, the call site (intrinsics.def, SIM_SYMBOL).
 */
#define AJ_SIM_HOPPER_ENTRIES(X)                                                         \
    X(mbarrier_init) X(mbarrier_arrive) X(mbarrier_arrive_expect_tx) X(mbarrier_expect_tx) \
    X(mbarrier_complete_tx) X(mbarrier_try_wait_parity) X(named_bar_sync)               \
    X(named_bar_arrive) X(fence_proxy_async) X(setmaxnreg_inc) X(setmaxnreg_dec)          \
    X(wgmma_fence) X(wgmma_commit_group) X(wgmma_wait_group)                              \
    AJ_SIM_WGMMA_ENTRIES(X, 64) AJ_SIM_WGMMA_ENTRIES(X, 128) AJ_SIM_WGMMA_ENTRIES(X, 256)
#define AJ_SIM_WGMMA_ENTRIES(X, N)                                                         \
    X(wgmma_m64n##N##k16_f16_ss) X(wgmma_m64n##N##k16_f16_rs)                             \
    X(wgmma_m64n##N##k16_bf16_ss) X(wgmma_m64n##N##k16_bf16_rs)

void aj_sim_mbarrier_init(struct sim_thread *t, uint8_t *bar, int32_t count);
void aj_sim_mbarrier_arrive(struct sim_thread *t, uint8_t *bar);
void aj_sim_mbarrier_arrive_expect_tx(struct sim_thread *t, uint8_t *bar, int32_t tx);
void aj_sim_mbarrier_expect_tx(struct sim_thread *t, uint8_t *bar, int32_t tx);
void aj_sim_mbarrier_complete_tx(struct sim_thread *t, uint8_t *bar, int32_t tx);
int32_t aj_sim_mbarrier_try_wait_parity(struct sim_thread *t, uint8_t *bar, int32_t parity);
void aj_sim_named_bar_sync(struct sim_thread *t, int32_t site, int32_t id, int32_t count);
void aj_sim_named_bar_arrive(struct sim_thread *t, int32_t site, int32_t id, int32_t count);
void aj_sim_fence_proxy_async(struct sim_thread *t);
void aj_sim_setmaxnreg_inc(struct sim_thread *t, int32_t site, int32_t count);
void aj_sim_setmaxnreg_dec(struct sim_thread *t, int32_t site, int32_t count);
void aj_sim_wgmma_fence(struct sim_thread *t, int32_t site);
void aj_sim_wgmma_commit_group(struct sim_thread *t, int32_t site);
void aj_sim_wgmma_wait_group(struct sim_thread *t, int32_t site, int32_t pending);
#define AJ_SIM_WGMMA_DECLARE(N, type)                                                      \
    void aj_sim_wgmma_m64n##N##k16_##type##_ss(struct sim_thread *t, int32_t site,        \
                                               float *acc, uint64_t a_desc,                \
                                               uint64_t b_desc, int32_t scale_d);          \
    void aj_sim_wgmma_m64n##N##k16_##type##_rs(struct sim_thread *t, int32_t site,        \
                                               float *acc, int32_t a0, int32_t a1,         \
                                               int32_t a2, int32_t a3, uint64_t b_desc,    \
                                               int32_t scale_d);
AJ_SIM_WGMMA_DECLARE(64, f16)
AJ_SIM_WGMMA_DECLARE(128, f16)
AJ_SIM_WGMMA_DECLARE(256, f16)
AJ_SIM_WGMMA_DECLARE(64, bf16)
AJ_SIM_WGMMA_DECLARE(128, bf16)
AJ_SIM_WGMMA_DECLARE(256, bf16)
#undef AJ_SIM_WGMMA_DECLARE

#endif /* AJ_RUNTIME_SIM_HOPPER_H */
