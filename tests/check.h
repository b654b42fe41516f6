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

#include <stdio.h>
#include <string.h>

#include "attnjit/attnjit.h"

static int check_passed, check_failed;

#define CHECK(cond)                                                      \
    do {                                                                 \
        if (cond) {                                                      \
            check_passed++;                                              \
        } else {                                                         \
            check_failed++;                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,       \
                    __LINE__, #cond);                                    \
        }                                                                \
    } while (0)

#define CHECK_MSG(cond, ...)                                             \
    do {                                                                 \
        if (cond) {                                                      \
            check_passed++;                                              \
        } else {                                                         \
            check_failed++;                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__,       \
                    __LINE__, #cond);                                    \
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

static inline int check_report(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    return check_failed ? 1 : 0;
}

#endif /* AJ_TESTS_CHECK_H */
