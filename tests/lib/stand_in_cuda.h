/*
 * stand_in_cuda.h -- a test's view of the stand-in libcuda
 * (tests/fake_cuda) that attnjit loaded: its exports by name, its call
 * log, and the check that a call moved no attention data between host and
 * device.  Where libcuda.so.1 is not loaded or is not the stand-in, the
 * symbols are NULL and the log is empty.
 */
#ifndef AJ_TESTS_STAND_IN_CUDA_H
#define AJ_TESTS_STAND_IN_CUDA_H

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* Symbol `name` of the libcuda.so.1 attnjit loaded, or NULL. */
static inline void *stand_in_cuda_symbol(const char *name)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return h ? dlsym(h, name) : NULL;
}

/* The stand-in's log since it was last cleared ("" without the stand-in). */
static inline const char *stand_in_cuda_log(void)
{
    const char *(*log)(void) = NULL;
    *(void **)&log = stand_in_cuda_symbol("fake_cuda_log");
    return log ? log() : "";
}

static inline void stand_in_cuda_log_clear(void)
{
    void (*clear)(void) = NULL;
    *(void **)&clear = stand_in_cuda_symbol("fake_cuda_log_clear");
    if (clear)
        clear();
}

/* How many times `what` occurs in `log`. */
static inline int stand_in_count(const char *log, const char *what)
{
    int n = 0;
    for (const char *p = strstr(log, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* The log since the last clear moved at most `limit` bytes in each copy
 * between host and device (the opening agreement, a few documents'
 * offsets, the values a ring classes its blocks by: no attention data),
 * pinned no host memory and saw no stream-order race; failures name
 * `what`. */
static inline void stand_in_check_small_copies(const char *what, size_t limit)
{
    const char *log = stand_in_cuda_log();
    CHECK_MSG(stand_in_count(log, "MemAllocHost") == 0, "%s: host memory pinned:\n%s", what,
              log);
    CHECK_MSG(stand_in_count(log, "RACE") == 0, "%s: a stream-order race:\n%s", what, log);
    const char *kinds[] = {"MemcpyHtoD", "MemcpyDtoH"};
    for (int k = 0; k < 2; k++)
        for (const char *at = strstr(log, kinds[k]); at; at = strstr(at + 1, kinds[k])) {
            const char *b = strstr(at, "bytes="), *eol = strchr(at, '\n');
            if (b && eol && b > eol)   /* (another line's) */
                b = NULL;
            const size_t bytes = b ? strtoull(b + 6, NULL, 10) : 0;
            CHECK_MSG(b && bytes <= limit, "%s: %.40s: more than %zu bytes between host and "
                      "device", what, at, limit);
        }
}

#endif /* AJ_TESTS_STAND_IN_CUDA_H */
