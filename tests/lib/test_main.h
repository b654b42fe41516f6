/*
 * test_main.h -- the main() of the numeric tests that run on one device:
 * the device the first argument names, the test's functions in order,
 * then the report.
 *
 *   test_x [cuda | cpu | sim]   no argument: the test's own device; cuda
 *                               with no GPU exits 77 ("skipped"), never a
 *                               fake pass (docs/design.md, Testing)
 *
 * Header-only, so that its CHECKs count in the including test (check.h
 * keeps its counters per file).
 */
#ifndef AJ_TESTS_TEST_MAIN_H
#define AJ_TESTS_TEST_MAIN_H

#include <stdio.h>
#include <string.h>

#include "check.h"

/* What a test's main() hands test_main. */
typedef struct test_main_args {
    aj_device_kind fallback; /* the device when argv[1] names none */
    aj_ctx **ctx; /* the test's own, set for its functions */
    aj_device **dev;
    void (*const *tests)(void); /* run in order, NULL-terminated */
    const int *cases; /* non-NULL: "N cases" printed at the end */
    void (*cleanup)(void); /* optional: run before the device closes */
} test_main_args;

/* The device kind argv[1] names ("cuda", "cpu", "sim"), else fallback. */
static inline aj_device_kind test_main_device(int argc, char **argv, aj_device_kind fallback)
{
    static const struct {
        const char *name;
        aj_device_kind kind;
    } names[] = {{"cuda", AJ_DEVICE_CUDA}, {"cpu", AJ_DEVICE_CPU}, {"sim", AJ_DEVICE_SIM}};
    for (size_t i = 0; argc > 1 && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(argv[1], names[i].name) == 0)
            return names[i].kind;
    return fallback;
}

/* Opens the context and device, runs the tests, closes both; returns the
 * exit code for main. */
static inline int test_main(int argc, char **argv, const test_main_args *m)
{
    aj_device_kind kind = test_main_device(argc, argv, m->fallback);
    CHECK(aj_ctx_create(NULL, m->ctx) == AJ_OK);
    aj_status st = aj_device_open(*m->ctx, kind, 0, m->dev);
    if (kind == AJ_DEVICE_CUDA && st != AJ_OK) {
        printf("SKIP %s on a GPU: %s\n", argv[0], aj_last_error(*m->ctx));
        aj_ctx_destroy(*m->ctx);
        return 77;
    }
    CHECK_STATUS(*m->ctx, st, AJ_OK);
    if (!*m->dev)
        return check_report();
    for (int i = 0; m->tests[i]; i++)
        m->tests[i]();
    if (m->cases)
        printf("%d cases\n", *m->cases);
    if (m->cleanup)
        m->cleanup();
    aj_device_close(*m->dev);
    aj_ctx_destroy(*m->ctx);
    return check_report();
}

#endif /* AJ_TESTS_TEST_MAIN_H */
