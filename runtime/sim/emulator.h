/*
 * emulator.h -- the SIMT emulator that runs `sim` kernels on the host.
 *
 * One fiber per GPU thread of a CTA; CTAs spread over a pool of worker
 * threads.  Fibers switch only where a GPU thread would wait for others
 * (bar.sync and the warp collectives shfl.sync, vote.sync, mma.sync,
 * ldmatrix, elect.sync; hopper.h's mbarrier waits, named barriers and
 * warpgroup collectives) or finish, so a CTA's threads interleave exactly at
 * synchronisation points, and everything between two of them runs as
 * ordinary host code.  cp.async copies become visible in shared memory at
 * the wait that covers them, not before.
 *
 * The emulator checks every global and shared access the kernel makes
 * against the buffers of the launch (and alignment), and detects barrier
 * divergence and deadlock; each becomes an error naming the kernel, CTA,
 * thread and address, never a crash or a hang.
 *
 * Strict mode (the default; the environment's AJ_SIM_STRICT=0 turns it off)
 * runs the threads between synchronisation points in a random order from a
 * seed (aj_sim_launch.seed, else AJ_SIM_SEED: a number or `random`; the
 * fault message names it) and reports shared-memory races: a read of what
 * another thread wrote, or a write of what another thread read, with no
 * bar.sync (or bar.warp.sync between lanes of one warp) in between; cp.async
 * data counts as written by the thread that waits for it.
 */
#ifndef AJ_RUNTIME_SIM_EMULATOR_H
#define AJ_RUNTIME_SIM_EMULATOR_H

#include <stdint.h>

#include "codegen/codegen.h"

/* A buffer the kernel may touch: [base, base + bytes). */
typedef struct aj_sim_buffer {
    const char *name;
    const void *base;
    size_t bytes;
} aj_sim_buffer;

typedef struct aj_sim_launch {
    const char *kernel_name;
    aj_host_entry_fn entry;
    int32_t grid[3];
    int32_t block_threads;
    int32_t smem_bytes;
    void **args;                  /* kernelParams: args[i] -> value i */
    const aj_sim_buffer *buffers;
    int num_buffers;
    int workers;                  /* host threads; 0: one per core, at most 16 */
    uint64_t seed;                /* strict mode's schedule; 0: AJ_SIM_SEED, else 1 */
    /* registers per thread at launch, where setmaxnreg starts (hopper.c);
     * 0: the most a 65536-register file gives every warp, in steps of 8,
     * at most 256 */
    int32_t registers;
    uint64_t instructions;        /* out: emulated thread-instructions */
    /* optional out: per buffer, bit 0 once the kernel read it, bit 1 once
     * it wrote it (emulated launches report them: device.c) */
    _Atomic unsigned char *buffer_use;
} aj_sim_launch;

/* Runs the whole grid; AJ_ERR_KERNEL_FAULT (with the emulator's message) if
 * the kernel misbehaves: out-of-bounds or misaligned access, barrier
 * divergence, a collective that can never complete or reads a lane outside
 * its membermask. */
aj_status aj_sim_run(aj_ctx *ctx, aj_sim_launch *launch);

/* aj_sim_symbols (codegen/target.h): the emulator functions the sim
 * lowering calls, which the sim target's row binds in the JIT. */

#endif /* AJ_RUNTIME_SIM_EMULATOR_H */
