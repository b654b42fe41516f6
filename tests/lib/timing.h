/*
 * timing.h -- the wall clock and the medians of the benchmarks and the
 * timed tests.  Header-only.
 */
#ifndef AJ_TESTS_TIMING_H
#define AJ_TESTS_TIMING_H

#include <stdlib.h>
#include <time.h>

/* Monotonic wall-clock seconds (an arbitrary origin: take differences). */
static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double now_ms(void)
{
    return now_s() * 1e3;
}

/* qsort's order of doubles, ascending. */
static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of n values (n >= 1; v is sorted in place). */
static inline double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif /* AJ_TESTS_TIMING_H */
