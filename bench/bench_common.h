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

#endif /* AJ_BENCH_COMMON_H */
