/*
 * emulator.h -- the SIMT emulator that runs `sim` kernels on the host.
 *
 * One fiber per GPU thread of a CTA; CTAs spread over a pool of worker
 * threads.  Fibers switch only where a GPU thread would wait for others
 * (bar.sync and the warp collectives shfl.sync, vote.sync, mma.sync,
 * ldmatrix) or finish, so a CTA's threads interleave exactly at
 * synchronisation points, and everything between two of them runs as
 * ordinary host code.  cp.async copies become visible in shared memory at
 * the wait that covers them, not before.
 *
 * The emulator checks every global and shared access the kernel makes
 * against the buffers of the launch (and alignment), and detects barrier
 * divergence and deadlock; each becomes an error naming the kernel, CTA,
 * thread and address, never a crash or a hang.
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
    uint64_t instructions;        /* out: emulated thread-instructions */
} aj_sim_launch;

/* Runs the whole grid; AJ_ERR_KERNEL_FAULT (with the emulator's message) if
 * the kernel misbehaves: out-of-bounds or misaligned access, barrier
 * divergence, a collective that can never complete or reads a lane outside
 * its membermask. */
aj_status aj_sim_run(aj_ctx *ctx, aj_sim_launch *launch);

/* The emulator functions the sim lowering calls, for the JIT. */
const aj_host_symbol *aj_sim_symbols(size_t *count);

#endif /* AJ_RUNTIME_SIM_EMULATOR_H */
