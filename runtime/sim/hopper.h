/*
 * hopper.h -- the emulator's model of sm_90's asynchronous machinery
 * (hopper.c, wgmma.c, tma.c): mbarriers with phases and transaction counts, named
 * barriers, fence.proxy.async, setmaxnreg, wgmma and TMA (with the
 * emulator's own tensor maps), and the warpgroup collectives they need.
 * docs/sim.md, "Hopper's machinery", describes the model.
 */
#ifndef AJ_RUNTIME_SIM_HOPPER_H
#define AJ_RUNTIME_SIM_HOPPER_H

#include <stdint.h>

#include "codegen/wgmma_shapes.h"
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
        int32_t scale_d, a_in_registers;
        int32_t a_type, b_type;  /* aj_dtype: f16, bf16 (k16), f8e4m3, f8e5m2 (k32) */
        int32_t trans_b;       /* 1: B is N-major (imm-trans-b) */
    } mma;
    /* the sync counter at the thread's latest fence.proxy.async: generic
     * writes before it are visible to the async proxy (TMA, wgmma) */
    uint32_t proxy_fence;
    /* a wgmma.fence since the thread's latest wgmma.wait_group */
    int wgmma_fenced;
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
 * The emulator entries of the sm_90a intrinsics.def rows, bound by
 * aj_sim_symbols as "aj_sim_<name>"; each takes the thread first and, for
 * the collectives, the call site (intrinsics.def, SIM_SYMBOL).
 */
#define AJ_SIM_HOPPER_ENTRIES(X)                                                         \
    X(mbarrier_init) X(mbarrier_arrive) X(mbarrier_arrive_expect_tx) X(mbarrier_expect_tx) \
    X(mbarrier_complete_tx) X(mbarrier_try_wait_parity) X(named_bar_sync)               \
    X(named_bar_arrive) X(fence_proxy_async) X(setmaxnreg_inc) X(setmaxnreg_dec)          \
    X(wgmma_fence) X(wgmma_commit_group) X(wgmma_wait_group)                              \
    X(tma_load_2d) X(tma_load_3d) X(tma_load_4d) X(tma_load_5d) X(tma_store_2d)           \
    X(tma_store_3d) X(tma_store_4d) X(tma_store_5d) X(bulk_commit_group)                  \
    X(bulk_wait_group_read)
/* and the wgmma entries, N by N (AJ_WGMMA_NS(AJ_SIM_WGMMA_ENTRIES) with
 * AJ_SIM_HOPPER_ENTRY(name) defined) */
#define AJ_SIM_WGMMA_ENTRIES_OF(N, type)                                                   \
    AJ_SIM_HOPPER_ENTRY(wgmma_m64n##N##k16_##type##_ss)                                    \
    AJ_SIM_HOPPER_ENTRY(wgmma_m64n##N##k16_##type##_rs)                                    \
    AJ_SIM_HOPPER_ENTRY(wgmma_m64n##N##k16_##type##_ss_tb)                                 \
    AJ_SIM_HOPPER_ENTRY(wgmma_m64n##N##k16_##type##_rs_tb)
#define AJ_SIM_WGMMA_F8_ENTRIES_OF(N, a, b)                                                \
    AJ_SIM_HOPPER_ENTRY(wgmma_m64n##N##k32_##a##_##b##_ss)                                 \
    AJ_SIM_HOPPER_ENTRY(wgmma_m64n##N##k32_##a##_##b##_rs)
#define AJ_SIM_WGMMA_ENTRIES(N)                                                            \
    AJ_SIM_WGMMA_ENTRIES_OF(N, f16) AJ_SIM_WGMMA_ENTRIES_OF(N, bf16)                       \
    AJ_SIM_WGMMA_F8_ENTRIES_OF(N, e4m3, e4m3) AJ_SIM_WGMMA_F8_ENTRIES_OF(N, e5m2, e5m2)    \
    AJ_SIM_WGMMA_F8_ENTRIES_OF(N, e4m3, e5m2)

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
/* One row's entries: A by descriptor (_ss) or in registers (_rs), B
 * K-major or, with the suffix _tb, N-major (wgmma.c) */
#define AJ_SIM_WGMMA_DECLARE_TB(N, type, suffix)                                           \
    void aj_sim_wgmma_m64n##N##k16_##type##_ss##suffix(struct sim_thread *t, int32_t site, \
                                                       float *acc, uint64_t a_desc,        \
                                                       uint64_t b_desc, int32_t scale_d);  \
    void aj_sim_wgmma_m64n##N##k16_##type##_rs##suffix(struct sim_thread *t, int32_t site, \
                                                       float *acc, int32_t a0, int32_t a1, \
                                                       int32_t a2, int32_t a3,             \
                                                       uint64_t b_desc, int32_t scale_d);
#define AJ_SIM_WGMMA_DECLARE(N, type)                                                      \
    AJ_SIM_WGMMA_DECLARE_TB(N, type, ) AJ_SIM_WGMMA_DECLARE_TB(N, type, _tb)
/* and the 8-bit rows' (k32, K-major B only): A type a, B type b */
#define AJ_SIM_WGMMA_DECLARE_F8(N, a, b)                                                   \
    void aj_sim_wgmma_m64n##N##k32_##a##_##b##_ss(struct sim_thread *t, int32_t site,      \
                                                  float *acc, uint64_t a_desc,             \
                                                  uint64_t b_desc, int32_t scale_d);       \
    void aj_sim_wgmma_m64n##N##k32_##a##_##b##_rs(struct sim_thread *t, int32_t site,      \
                                                  float *acc, int32_t a0, int32_t a1,      \
                                                  int32_t a2, int32_t a3, uint64_t b_desc, \
                                                  int32_t scale_d);
#define AJ_SIM_WGMMA_DECLARE_BOTH(N)                                                       \
    AJ_SIM_WGMMA_DECLARE(N, f16) AJ_SIM_WGMMA_DECLARE(N, bf16)                             \
    AJ_SIM_WGMMA_DECLARE_F8(N, e4m3, e4m3) AJ_SIM_WGMMA_DECLARE_F8(N, e5m2, e5m2)          \
    AJ_SIM_WGMMA_DECLARE_F8(N, e4m3, e5m2)
AJ_WGMMA_NS(AJ_SIM_WGMMA_DECLARE_BOTH)
#undef AJ_SIM_WGMMA_DECLARE_BOTH
#undef AJ_SIM_WGMMA_DECLARE_F8
#undef AJ_SIM_WGMMA_DECLARE
#undef AJ_SIM_WGMMA_DECLARE_TB

/* cp.async.bulk.tensor tile loads (dst, map, coordinates, mbarrier) and
 * stores (map, coordinates, src), 2 to 5 dimensions */
void aj_sim_tma_load_2d(struct sim_thread *t, uint8_t *dst, const void *map, int32_t c0,
                        int32_t c1, uint8_t *bar);
void aj_sim_tma_load_3d(struct sim_thread *t, uint8_t *dst, const void *map, int32_t c0,
                        int32_t c1, int32_t c2, uint8_t *bar);
void aj_sim_tma_load_4d(struct sim_thread *t, uint8_t *dst, const void *map, int32_t c0,
                        int32_t c1, int32_t c2, int32_t c3, uint8_t *bar);
void aj_sim_tma_load_5d(struct sim_thread *t, uint8_t *dst, const void *map, int32_t c0,
                        int32_t c1, int32_t c2, int32_t c3, int32_t c4, uint8_t *bar);
void aj_sim_tma_store_2d(struct sim_thread *t, const void *map, int32_t c0, int32_t c1,
                         uint8_t *src);
void aj_sim_tma_store_3d(struct sim_thread *t, const void *map, int32_t c0, int32_t c1,
                         int32_t c2, uint8_t *src);
void aj_sim_tma_store_4d(struct sim_thread *t, const void *map, int32_t c0, int32_t c1,
                         int32_t c2, int32_t c3, uint8_t *src);
void aj_sim_tma_store_5d(struct sim_thread *t, const void *map, int32_t c0, int32_t c1,
                         int32_t c2, int32_t c3, int32_t c4, uint8_t *src);
void aj_sim_bulk_commit_group(struct sim_thread *t);
void aj_sim_bulk_wait_group_read(struct sim_thread *t, int32_t pending);

/*
 * The emulator's tensor map: 128 bytes (at `map`, 64-byte aligned) that
 * the TMA rows read on sim, made by the rules of the CUDA driver's
 * cuTensorMapEncodeTiled (tiled, no interleave, element strides 1):
 *
 *   base 16-byte aligned; rank 1..5; dims[i] in 1..2^32; strides (bytes,
 *   dimensions 1..rank-1) multiples of 16 and under 2^40; box[i] in
 *   1..256; box[0] elem_bytes a multiple of 16; with a swizzle of `span`
 *   bytes (32, 64, 128; 0: none) box[0] elem_bytes at most span
 *
 * oob_nan: out-of-bounds elements read as NaN (the driver's
 * CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA), else 0.  Returns
 * AJ_ERR_INVALID_ARG naming the argument a rule refuses.
 */
typedef struct aj_sim_tensor_map_args {
    int elem_bytes;            /* 1, 2, 4 or 8 */
    int rank;
    const void *base;
    uint64_t dims[5];
    uint64_t strides[5];       /* bytes; strides[0] (the element) is not read */
    uint32_t box[5];
    int span;
    int oob_nan;
} aj_sim_tensor_map_args;

aj_status aj_sim_tensor_map_encode(aj_ctx *ctx, void *map, const aj_sim_tensor_map_args *args);

#endif /* AJ_RUNTIME_SIM_HOPPER_H */
