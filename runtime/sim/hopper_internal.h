/*
 * hopper_internal.h -- what the three files of the emulator's Hopper model
 * share: hopper.c (CTA state, mbarriers, named barriers, setmaxnreg, the
 * warpgroup meetings and deadlocks), wgmma.c and tma.c.  Nothing outside
 * runtime/sim includes it.
 */
#ifndef AJ_RUNTIME_SIM_HOPPER_INTERNAL_H
#define AJ_RUNTIME_SIM_HOPPER_INTERNAL_H

#include "runtime/sim/hopper.h"
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

/* The most accumulators a thread has in one wgmma: N / 2 at N = 256. */
#define WGMMA_MAX_REGS 128

/* A wgmma's results for one thread, waiting for the wait_group that lands
 * them in its accumulators. */
typedef struct wgmma_result {
    float *acc;
    int64_t group;             /* the commit group it belongs to */
    int n;                     /* accumulators: N / 2 */
    float d[WGMMA_MAX_REGS];
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
    double mma_a[64][32], mma_b[256][32];   /* a wgmma's operands (K 16 or 32) */
    uint32_t read_lo, read_hi;              /* the shared bytes it reads */
    uint32_t *stamps;          /* strict: the arrays above, nthreads each */
};

/* hopper.c: a fault of thread t with a formatted message (never returns) */
_Noreturn void aj_sim_faultf(sim_thread *t, const char *fmt, ...) AJ_PRINTF(2, 3);
/* hopper.c: the mbarrier at `bar`, checked; a fault naming `op` if none */
mbarrier *aj_sim_mbarrier_at(sim_thread *t, const char *op, const uint8_t *bar);
/* hopper.c: thread t completes `tx` transaction bytes on m */
void aj_sim_mbarrier_transact(sim_thread *t, mbarrier *m, const char *op, int32_t tx);
/* hopper.c: t waits until its warpgroup meets at this call */
void aj_sim_warpgroup_join(sim_thread *t, int32_t site, enum warpgroup_op op, int32_t value);

/* wgmma.c: the warpgroup meets at a wgmma.mma_async; 0 after a fault */
int aj_sim_wgmma_complete(sim_worker *w, sim_thread *group);
/* wgmma.c: a shared offset under a swizzle of `span` bytes (0: none), the
 * pattern wgmma reads and TMA writes */
uint32_t aj_sim_swizzled(uint32_t offset, int span);
/* wgmma.c (strict): the thread whose generic write of the granule at
 * `offset` no fence.proxy.async of its own has followed; -1 if none */
int aj_sim_unfenced_writer(const sim_worker *w, uint32_t offset);

#endif /* AJ_RUNTIME_SIM_HOPPER_INTERNAL_H */
