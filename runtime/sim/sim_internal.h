/*
 * sim_internal.h -- the emulator's state, shared by emulator.c (threads,
 * scheduler, memory checks, races) and hopper.c, wgmma.c and tma.c
 * (sm_90's asynchronous machinery).  Nothing outside runtime/sim
 * includes it.
 */
#ifndef AJ_RUNTIME_SIM_INTERNAL_H
#define AJ_RUNTIME_SIM_INTERNAL_H

#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <ucontext.h>

#include "runtime/sim/emulator.h"
#include "runtime/sim/hopper.h"

#define STACK_BYTES (256 * 1024)
#define MAX_WORKERS 16
#define WARP 32
#define ALL_LANES 0xffffffffu

/* T_HOPPER: waiting in one of hopper.c's waits (t->hop.wait says which) */
enum thread_state { T_READY, T_BARRIER, T_WARP, T_HOPPER, T_DONE };

/* The warp-collective operations, settled by the scheduler. */
enum warp_op {
    OP_SHFL_IDX, OP_SHFL_UP, OP_SHFL_DOWN, OP_SHFL_BFLY,
    OP_VOTE_BALLOT, OP_VOTE_ALL, OP_VOTE_ANY,
    OP_MMA_F16, OP_MMA_BF16, OP_MMA_E4M3, OP_MMA_E5M2, OP_MMA_E4M3_E5M2,
    OP_LDMATRIX,
    OP_BAR_WARP_SYNC,
    OP_ELECT,
};

/* One lane's part in a warp-collective call: operands in, results out. */
typedef struct warp_call {
    enum warp_op op;
    uint32_t mask;             /* membermask; ALL_LANES for .aligned ops */
    union {
        struct { uint32_t value; int32_t b, c; } shfl;
        struct { int32_t pred; } vote;
        struct { uint32_t a[4], b[2]; float c[4]; } mma;
        struct { const uint8_t *row; int count, trans; } ldmatrix;
    } in;
    uint32_t result[4];
} warp_call;

/* A cp.async copy, read at issue, waiting for its wait to land. */
typedef struct cp_async_copy {
    uint8_t *dst;
    int64_t group;             /* the commit group it belongs to */
    uint8_t data[16];
} cp_async_copy;

struct sim_worker;

typedef struct sim_thread {
    uint64_t instructions;     /* first: bumped by the instrumented kernel */
    struct sim_worker *w;
    int32_t tid;
    enum thread_state state;
    int32_t site;              /* the collective it waits at (intrinsics.def) */
    warp_call call;
    cp_async_copy *copies;     /* pending, in issue order */
    int num_copies, cap_copies;
    int64_t groups_committed;
    /* strict: for each thread of the CTA, the seq before which its accesses
     * are ordered before this thread's (bar.warp.sync, named barriers,
     * mbarrier phases); NULL when not strict */
    uint32_t *synced;
    aj_sim_hopper_thread hop;
    ucontext_t uc;             /* where a fresh fiber starts (prepare_fiber) */
    jmp_buf resume;            /* where a started fiber resumes */
    bool started;
    char *stack;               /* STACK_BYTES, with a guard page below */
    void *asan_fake_stack;     /* AddressSanitizer's fiber bookkeeping */
    void *tsan_fiber;          /* ThreadSanitizer's (NULL without it) */
} sim_thread;

/* What last wrote a shared-memory byte (strict mode's race messages). */
enum write_kind { W_STORE, W_CP_ASYNC_IN_FLIGHT, W_CP_ASYNC_LANDED, W_TMA };

/* Strict mode's record of one granule of shared memory (see the top of the
 * file). */
typedef struct smem_shadow {
    uint32_t write_stamp;      /* 0: not written; UINT32_MAX: a cp.async in flight */
    uint32_t read_stamp;
    uint32_t reader_lanes;     /* the readers' lanes, when they share one warp */
    int16_t writer;
    int16_t reader_a, reader_b;   /* the first reader; the first from a second warp */
    int8_t reader_warp;        /* READERS_NONE, READERS_SEVERAL or the readers' warp */
    uint8_t write_kind;
} smem_shadow;

enum { READERS_NONE = -1, READERS_SEVERAL = -2 };
#define STAMP_IN_FLIGHT UINT32_MAX
#define PREEMPT_EVERY 32
/* The shadow's unit: 2 bytes, the narrowest shared access the templates
 * make (f16 / bf16); a 1-byte access counts as one to its whole granule. */
#define GRANULE 2

typedef struct sim_worker {
    aj_sim_launch *launch;
    struct sim_run *run;
    sim_thread *threads;
    int32_t ctaid[3];
    uint8_t *smem;
    /* strict mode: the shadow of smem, the sync counters and the CTA's
     * random schedule */
    smem_shadow *shadow;
    uint32_t seq, last_barrier;
    uint64_t rng;
    uint32_t preempt_countdown;
    int *order;
    ucontext_t sched;          /* unused: a fiber's first entry saves into it */
    jmp_buf back;              /* where the scheduler resumes */
    int faulted;
    uint64_t instructions;
    aj_sim_hopper_cta *hop;    /* hopper.c's per-CTA state */
    /* AddressSanitizer's view of the scheduler's stack, learnt when the
     * first fiber starts (see the fiber switches below) */
    void *asan_fake_stack;
    void *tsan_sched;          /* ThreadSanitizer's fiber of the scheduler */
    const void *sched_stack;
    size_t sched_stack_size;
} sim_worker;

/* State shared by the workers of one launch. */
typedef struct sim_run {
    aj_sim_launch *launch;
    atomic_long next_cta;
    long num_ctas;
    atomic_int stop;
    int strict;                /* AJ_SIM_STRICT: random order and race detection */
    uint64_t seed;
    pthread_mutex_t lock;
    char error[1024];          /* first fault, under lock */
    int have_error;
} sim_run;

/* ---------------------------------------------------------------- emulator.c's services */

/* Records the first fault of the launch (prefixed with kernel and CTA). */
void aj_sim_record_fault(sim_worker *w, const char *fmt, ...) AJ_PRINTF(2, 3);
/* Called on a fiber: records the fault, naming the thread, and never
 * returns to the kernel. */
_Noreturn void aj_sim_thread_fault(sim_thread *t, const char *what);
/* The fiber waits (state `why`, at collective `site`) until the scheduler
 * makes it READY again. */
void aj_sim_thread_yield(sim_thread *t, enum thread_state why, int32_t site);

enum { ACCESS_STORE = 1, ACCESS_SHARED = 2 };   /* aj_sim_check's flags */
void aj_sim_check_alignment(sim_thread *t, const char *op, uintptr_t a, int32_t bytes,
                             uintptr_t align, int flags);
void aj_sim_check_shared_bounds(sim_thread *t, const char *op, uintptr_t a, int32_t bytes);
void aj_sim_check_global_bounds(sim_thread *t, const char *op, uintptr_t a, int32_t bytes);
/* strict mode: thread t reads / writes [a, a + bytes) of shared memory
 * (a race is a fault); writes at `stamp` */
void aj_sim_shadow_read(sim_thread *t, const char *op, uintptr_t a, int bytes);
void aj_sim_shadow_write(sim_thread *t, const char *op, uintptr_t a, int bytes,
                         enum write_kind kind, uint32_t stamp);

#endif /* AJ_RUNTIME_SIM_INTERNAL_H */
