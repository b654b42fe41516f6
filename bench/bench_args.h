/*
 * bench_args.h -- the benchmarks' integer options ("--heads 4"): a table
 * of option names and the variables their values go to.  Header-only.
 */
#ifndef AJ_BENCH_ARGS_H
#define AJ_BENCH_ARGS_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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

#endif /* AJ_BENCH_ARGS_H */
