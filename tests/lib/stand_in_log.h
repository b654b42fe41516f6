/*
 * stand_in_log.h -- the call log the stand-in libraries (tests/fake_cuda,
 * tests/cp/fake_nccl.c) keep for their tests: one line per call, read
 * back through each library's exported accessor.  Included by one .c
 * file per library.
 */
#ifndef AJ_TESTS_STAND_IN_LOG_H
#define AJ_TESTS_STAND_IN_LOG_H

#include <stdarg.h>
#include <stdio.h>

static char log_text[1 << 20];
static size_t log_len;
/* Called after each line when set (a library that keeps its log in a file
 * too, so that a process killed before exit leaves its lines). */
static void (*log_sink)(void);

/* Appends one line; a full log drops the rest. */
static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(log_text + log_len, sizeof log_text - log_len, fmt, ap);
    va_end(ap);
    if (n > 0 && log_len + (size_t)n + 1 < sizeof log_text) {
        log_len += (size_t)n;
        log_text[log_len++] = '\n';
        log_text[log_len] = '\0';
    }
    if (log_sink)
        log_sink();
}

static void log_clear(void)
{
    log_len = 0;
    log_text[0] = '\0';
}

#endif /* AJ_TESTS_STAND_IN_LOG_H */
