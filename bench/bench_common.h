/*
 * bench_common.h -- what the benchmarks share: their integer options
 * ("--heads 4") as a table of names and variables, and the context and
 * device they run on.  Header-only.
 */
#ifndef AJ_BENCH_COMMON_H
#define AJ_BENCH_COMMON_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "timing.h"

typedef struct bench_int_option {
    const char *name;   /* "--heads" */
    int *value;
} bench_int_option;

/* When arg is one of the n options and a value follows (value non-NULL),
 * stores atoi(value) in its variable and returns true. */
static inline bool bench_int_arg(const bench_int_option *options, int n, const char *arg,
                                 const char *value)
{
    for (int k = 0; value && k < n; k++)
        if (strcmp(arg, options[k].name) == 0) {
            *options[k].value = atoi(value);
            return true;
        }
    return false;
}

/* A context and a device of `kind` on it; false, with "prog: error" on
 * stderr, when the device does not open. */
static inline bool bench_open(aj_device_kind kind, const char *prog, aj_ctx **ctx,
                              aj_device **dev)
{
    *ctx = NULL;
    *dev = NULL;
    aj_ctx_create(NULL, ctx);
    if (aj_device_open(*ctx, kind, 0, dev) == AJ_OK)
        return true;
    fprintf(stderr, "%s: %s\n", prog, aj_last_error(*ctx));
    return false;
}

/* One full compile of spec text (parse, verify, build, optimise, emit),
 * the cache bypassed: its wall ms, or -1 with "prog: error" on stderr.
 * The kernel's stage times are added to *stages (NULL: not kept); the
 * kernel goes to *keep (NULL: destroyed). */
static inline double bench_compile_once(aj_ctx *ctx, const char *prog, const char *name,
                                        const char *text, size_t len, aj_target target,
                                        int opt_level, aj_compile_stats *stages, aj_kernel **keep)
{
    double t0 = now_ms();
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    opt.opt_level = opt_level;
    opt.bypass_cache = true;   /* every repeat is a real compile */
    aj_status st = aj_op_parse(ctx, text, len, name, &op);
    if (st == AJ_OK)
        st = aj_compile(ctx, op, &opt, &k);
    double t1 = now_ms();
    aj_op_destroy(op);
    if (st != AJ_OK) {
        fprintf(stderr, "%s: %s: %s\n", prog, name, aj_last_error(ctx));
        return -1;
    }
    if (stages) {
        aj_compile_stats cs;
        aj_kernel_compile_stats(k, &cs);
        stages->build_ms += cs.build_ms;
        stages->verify_ms += cs.verify_ms;
        stages->optimize_ms += cs.optimize_ms;
        stages->emit_ms += cs.emit_ms;
        stages->ir_instructions = cs.ir_instructions;
    }
    if (keep)
        *keep = k;
    else
        aj_kernel_destroy(k);
    return t1 - t0;
}

#endif /* AJ_BENCH_COMMON_H */
