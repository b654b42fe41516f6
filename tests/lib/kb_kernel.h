/*
 * kb_kernel.h -- test kernels written directly with the kernel builder
 * (codegen/kbuilder.h): the one-CTA launch they end with, their compile
 * for a target, and one CTA of them on the emulator.  Header-only, so that
 * the CHECKs count in the including test (check.h).
 */
#ifndef AJ_TESTS_KB_KERNEL_H
#define AJ_TESTS_KB_KERNEL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "codegen/codegen.h"
#include "ptxas_util.h"
#include "runtime/sim/emulator.h"

/*
 * A test's start: strict mode on (its races need the detector), a context,
 * an op for aj_codegen_run to hand over (any op: the test kernels ignore
 * it), and ptxas found (into ptxas[cap]) or a printed reason why the PTX
 * of the `what` kernels is checked but not assembled.  Returns whether
 * ptxas was found.
 */
static inline int kb_kernel_setup(aj_ctx **ctx, aj_op **op, char *ptxas, size_t cap,
                                  const char *what)
{
    setenv("AJ_SIM_STRICT", "1", 1);
    CHECK(aj_ctx_create(NULL, ctx) == AJ_OK);
    static const char spec[] = "attention forward efficient { dtype = f16 head_dim = 64 }";
    CHECK_STATUS(*ctx, aj_op_parse(*ctx, spec, strlen(spec), "t.aj", op), AJ_OK);
    int found = ptxas_find(ptxas, cap);
    if (!found) {
        char label[128];
        snprintf(label, sizeof label, "assembling the %s PTX of the test kernels (generated "
                 "and checked all the same)", what);
        CHECK_MSG(!ptxas_missing(label), "ptxas is required");
    }
    return found;
}

/* Ends the kernel being built as a launch of one CTA. */
static inline void kb_kernel_finish_one_cta(aj_kb *kb)
{
    aj_kernel_layout layout;
    memset(&layout, 0, sizeof layout);
    for (int d = 0; d < 3; d++)
        layout.grid[d] = (aj_grid_dim){AJ_EXTENT_ONE, 1};
    aj_kb_finish(kb, &layout);
}

/* The kernel `build` writes, for `target`: LLVM IR for sim (the emulator
 * runs it), PTX for a GPU target; NULL after a failed CHECK naming it. */
static inline aj_kernel *kb_kernel_compile(aj_ctx *ctx, const aj_op *op, const char *name,
                                           aj_build_fn build, void *user, aj_target target)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    opt.emit = target == AJ_TARGET_SIM ? AJ_EMIT_LLVM_IR : AJ_EMIT_PTX;
    aj_kernel *out = NULL;
    aj_status st = aj_codegen_run(ctx, op, &opt, name, build, user, &out);
    CHECK_MSG(st == AJ_OK, "%s for %s: %s", name, aj_target_name(target), aj_last_error(ctx));
    return out;
}

/* Stage 0 of sim kernel `kern` as one CTA of `threads` on one worker, its
 * i-th parameter pointing to buffers[i] (n of them, at most 8), under
 * strict mode's schedule `seed` (0: the default). */
static inline aj_status kb_kernel_run_sim(aj_ctx *ctx, const aj_kernel *kern, const char *name,
                                          int threads, const aj_sim_buffer *buffers, int n,
                                          uint64_t seed)
{
    void *ptrs[8], *args[8];
    for (int i = 0; i < n && i < 8; i++) {
        ptrs[i] = (void *)buffers[i].base;
        args[i] = &ptrs[i];
    }
    aj_sim_launch launch = {
        .kernel_name = name,
        .entry = kern->stages[0].host_entry,
        .grid = {1, 1, 1},
        .block_threads = threads,
        .smem_bytes = kern->stages[0].launch.dynamic_smem,
        .args = args,
        .buffers = buffers,
        .num_buffers = n,
        .workers = 1,
        .seed = seed,
    };
    return aj_sim_run(ctx, &launch);
}

#endif /* AJ_TESTS_KB_KERNEL_H */
