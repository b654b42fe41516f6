/*
 * check.h -- the tiny assertion kit of attnjit's C tests.
 *
 * CHECK records a failure with file:line and carries on, so one run shows
 * every broken assertion; a test's main() ends with `return check_report();`
 * which prints "N passed, N failed" and exits non-zero on any failure.
 * CHECK_STATUS and CHECK_ERROR compare a status and the context's message.
 */
#ifndef AJ_TESTS_CHECK_H
#define AJ_TESTS_CHECK_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "splitmix.h"

static int check_passed, check_failed;

/* Counts one check's outcome; a failure also begins its line on stderr,
 * "file:line: CHECK failed: cond", which the caller ends. */
static inline bool check_record(bool ok, const char *file, int line, const char *cond)
{
    if (ok) {
        check_passed++;
        return true;
    }
    check_failed++;
    fprintf(stderr, "%s:%d: CHECK failed: %s", file, line, cond);
    return false;
}

#define CHECK(cond)                                                      \
    do {                                                                 \
        if (!check_record((cond), __FILE__, __LINE__, #cond))            \
            fputc('\n', stderr);                                         \
    } while (0)

#define CHECK_MSG(cond, ...)                                             \
    do {                                                                 \
        if (!check_record((cond), __FILE__, __LINE__, #cond)) {          \
            fputs(": ", stderr);                                         \
            fprintf(stderr, __VA_ARGS__);                                \
            fputc('\n', stderr);                                         \
        }                                                                \
    } while (0)

/* The call returned `want`; on mismatch prints the context's error. */
#define CHECK_STATUS(ctx, call, want)                                    \
    do {                                                                 \
        aj_status got_ = (call);                                         \
        CHECK_MSG(got_ == (want), "%s returned %s, want %s (%s)", #call, \
                  aj_status_str(got_), aj_status_str(want),              \
                  aj_last_error(ctx));                                   \
    } while (0)

/* The context's last error contains `needle`. */
#define CHECK_ERROR(ctx, needle)                                         \
    CHECK_MSG(strstr(aj_last_error(ctx), (needle)) != NULL,              \
              "error \"%s\" lacks \"%s\"", aj_last_error(ctx), (needle))

/* Case sampling.  The sanitizer pass of scripts/setup.sh sets
 * AJ_TEST_SAMPLE=N: the numeric tests' case runners then run about one
 * case in N -- the first, then those whose index hashes to 0 mod N, not
 * every N-th, which would see one option only of a table that cycles
 * through 2, 3 or N -- and random generators 1/N of their count.  The
 * plain pass runs them all; check_report says how many ran.  The
 * sanitizers watch the host code (IR building, launches, the sim), which
 * every case of a runner shares. */
static int check_sample_seen, check_sample_ran;

static inline int check_sample_stride(void)
{
    const char *env = getenv("AJ_TEST_SAMPLE");
    int n = env ? atoi(env) : 1;
    return n > 1 ? n : 1;
}

/* Whether the case runner should run its next case. */
static inline bool check_sampled(void)
{
    uint64_t index = (uint64_t)check_sample_seen++;
    bool run = index == 0 || splitmix_next(&index) % (uint64_t)check_sample_stride() == 0;
    check_sample_ran += run;
    return run;
}

/* A random generator's count under sampling (at least 1). */
static inline int check_sample_count(int count)
{
    int n = count / check_sample_stride();
    return n > 0 ? n : 1;
}

static inline int check_report(void)
{
    if (check_sample_stride() > 1)
        printf("AJ_TEST_SAMPLE=%d: %d of %d cases run\n", check_sample_stride(),
               check_sample_ran, check_sample_seen);
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif /* AJ_TESTS_CHECK_H */
