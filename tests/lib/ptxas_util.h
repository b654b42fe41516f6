/*
 * ptxas_util.h -- runs NVIDIA's ptxas on generated PTX (tests and bench).
 *
 * ptxas is $AJ_PTXAS, else looked up on PATH, then in /usr/local/cuda/bin;
 * where it is absent, ptxas_find() says so and callers skip with that
 * reason -- unless $AJ_REQUIRE_PTXAS is set (the README's test command
 * sets it, having installed ptxas: issue #30), where ptxas_missing() makes
 * the absence a failure.
 */
#ifndef AJ_TESTS_PTXAS_UTIL_H
#define AJ_TESTS_PTXAS_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attnjit/attnjit.h"
#include "tools/find_tool.h"

/* The spread over archs a list of cases asks for (each case assembled on
 * one of `spread` archs in turn; 0: every case on every arch), unless it
 * asks for every arch (0: each arch compiles its own template there) and
 * AJ_PTXAS_SPREAD gives another -- AJ_PTXAS_SPREAD=0 assembles every case
 * on every arch (about twice the time).  Read it once per list. */
static inline int ptxas_spread(int spread)
{
    const char *env = getenv("AJ_PTXAS_SPREAD");
    return spread > 0 && env && *env ? atoi(env) : spread;
}

typedef struct ptxas_result {
    int exit_code;
    int registers;
    int spill_stores, spill_loads;   /* bytes */
    int stack_frame;                 /* bytes */
    char log[4096];
} ptxas_result;

static inline int ptxas_find(char *out, size_t cap)
{
    return aj_find_tool("AJ_PTXAS", "ptxas", out, cap);
}

/* Where ptxas_find() found none: prints why `what` is not assembled and
 * returns 0 (skip), or, with $AJ_REQUIRE_PTXAS set, prints the failure
 * and returns 1 (the caller fails the test). */
static inline int ptxas_missing(const char *what)
{
    const char *required = getenv("AJ_REQUIRE_PTXAS");
    int fail = required && *required && strcmp(required, "0") != 0;
    printf("%s %s: ptxas not found (AJ_PTXAS, PATH, /usr/local/cuda/bin)%s\n",
           fail ? "FAIL" : "SKIP", what,
           fail ? "; AJ_REQUIRE_PTXAS is set: the PTX checks must run" : "");
    return fail;
}

static inline int ptxas_field(const char *log, const char *suffix)
{
    /* finds "<N> <suffix>" and returns N, or -1 */
    const char *at = strstr(log, suffix);
    if (!at)
        return -1;
    const char *p = at;
    while (p > log && p[-1] == ' ')
        p--;
    while (p > log && p[-1] >= '0' && p[-1] <= '9')
        p--;
    return atoi(p);
}

/* Assembles `ptx` for `arch` ("sm_80") with -v; fills the result. */
static inline int ptxas_run(const char *ptxas, const char *arch, const char *ptx,
                            size_t len, ptxas_result *r)
{
    char path[] = "/tmp/aj_ptxas_XXXXXX";
    int fd = mkstemp(path);
    memset(r, 0, sizeof *r);
    r->exit_code = -1;
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "w");
    fwrite(ptx, 1, len, f);
    fclose(f);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' -arch=%s -v -o /dev/null '%s' 2>&1", ptxas, arch, path);
    FILE *p = popen(cmd, "r");
    size_t n = 0;
    if (p) {
        n = fread(r->log, 1, sizeof r->log - 1, p);
        r->log[n] = '\0';
        int status = pclose(p);
        r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    unlink(path);
    r->registers = ptxas_field(r->log, "registers");
    r->spill_stores = ptxas_field(r->log, "bytes spill stores");
    r->spill_loads = ptxas_field(r->log, "bytes spill loads");
    r->stack_frame = ptxas_field(r->log, "bytes stack frame");
    return r->exit_code;
}

/* The fields of one kernel of a module: those after ptxas's "Compiling
 * entry function '<entry>'" line.  Returns 0, or -1 if it is not there. */
static inline int ptxas_entry(const ptxas_result *r, const char *entry, ptxas_result *out)
{
    char marker[256];
    snprintf(marker, sizeof marker, "entry function '%s'", entry);
    const char *at = strstr(r->log, marker);
    *out = *r;
    if (!at)
        return -1;
    out->registers = ptxas_field(at, "registers");
    out->spill_stores = ptxas_field(at, "bytes spill stores");
    out->spill_loads = ptxas_field(at, "bytes spill loads");
    out->stack_frame = ptxas_field(at, "bytes stack frame");
    return 0;
}

/* ptxas runs of a batch, shared by worker threads (ptxas is a process of
 * its own, so this is where a multi-core machine saves time). */
typedef struct ptxas_batch {
    const char *ptxas, *arch;
    aj_compile_job *jobs;
    ptxas_result *results;
    int n;
    atomic_int next;
} ptxas_batch;

static inline void *ptxas_worker(void *arg)
{
    ptxas_batch *batch = arg;
    for (int i; (i = atomic_fetch_add(&batch->next, 1)) < batch->n;) {
        if (!batch->jobs[i].kernel)
            continue;
        size_t len;
        const char *ptx = aj_kernel_code(batch->jobs[i].kernel, &len);
        ptxas_run(batch->ptxas, batch->arch, ptx, len, &batch->results[i]);
    }
    return NULL;
}

/* Assembles the kernels of `jobs` (those that compiled) for `arch` on as
 * many threads as the machine has cores. */
static inline void ptxas_assemble_all(const char *ptxas, const char *arch,
                                      aj_compile_job *jobs, ptxas_result *results, int n)
{
    ptxas_batch batch = {ptxas, arch, jobs, results, n, 0};
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int workers = cores < 1 ? 1 : cores > 16 ? 16 : (int)cores;
    pthread_t threads[16];
    int started = 0;
    for (; started < workers; started++)
        if (pthread_create(&threads[started], NULL, ptxas_worker, &batch) != 0)
            break;
    if (started == 0)
        ptxas_worker(&batch);
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
}

#endif /* AJ_TESTS_PTXAS_UTIL_H */
