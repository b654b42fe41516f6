/*
 * test_cache_procs.c -- processes sharing one disk cache directory
 * (docs/api.md "The kernel cache", what holds when processes share it).
 *
 * WORKERS processes compile and run cpu kernels through one directory whose
 * size cap holds about three of the six kernels they ask for, so entries
 * are written, read and evicted all the time; each worker opens a new
 * context per round, so every compile goes to the disk.  Meanwhile:
 *   - a vandal process damages entries in place (a flipped payload byte, a
 *     truncation, a bad header, another key's entry copied over one: a
 *     valid file of the wrong kernel), and leaves temporary files of a
 *     writer that no longer exists, once per round a worker finishes (so
 *     damage keeps pace with the writes on a host or build of any speed:
 *     against the clock, a slow sanitizer build once saw its entries
 *     damaged faster than they could pile up to the cap, and no eviction);
 *   - one worker is killed (SIGKILL) part-way, whatever it is doing.
 * Checks: every other worker exits normally with every forward matching
 * the float64 reference (no wrong kernel was ever loaded); the damage was
 * seen (entries discarded and rebuilt); after the run, one more store
 * leaves the directory within its cap and without any temporary file of a
 * dead writer.  Then a write that fails after the context is made: a
 * warning, the kernel still returned and kept in memory.  Then processes
 * that want one kernel at the same moment: it is compiled once (the
 * compile lock), the others read its entry.
 */
#define _DEFAULT_SOURCE   /* usleep, MAP_ANONYMOUS */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache_ctx.h"
#include "check.h"
#include "fwd_check.h"
#include "sim_harness.h"
#include "spec_compile.h"
#include "temp_dir.h"

enum { WORKERS = 6, ROUNDS = 24, KILLED = 0, NUM_OPS = 6 };

static const struct {
    int d;
    const char *mask;
} ops[NUM_OPS] = {{16, "none"}, {32, "none"}, {48, "none"},
                  {16, "causal(top_left)"}, {32, "causal(bottom_right)"},
                  {48, "window(5, 3)"}};

/* What each worker tells the parent (shared memory). */
typedef struct worker_report {
    int rounds, mismatches, failures;
    unsigned long long disk_hits, disk_writes, corrupt, evictions;
} worker_report;

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static aj_ctx *new_ctx(const char *dir, uint64_t cap)
{
    /* the vandal's damage is expected: no warnings */
    return cache_ctx(&(cache_ctx_opts){.dir = dir, .max_bytes = cap, .quiet = true});
}

/* One round: a new context, one forward of a random op against the
 * reference. */
static void round_of(const char *dir, uint64_t cap, uint64_t *rng, worker_report *r)
{
    aj_ctx *ctx = new_ctx(dir, cap);
    aj_device *dev = NULL;
    if (!ctx || aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev) != AJ_OK) {
        r->failures++;
        aj_ctx_destroy(ctx);
        return;
    }
    int i = (int)(next_random(rng) % NUM_OPS);
    fwd_case c = fwd_case_base("shared cache", AJ_DTYPE_F32, ops[i].d, ops[i].mask);
    c.sq = 9 + (int)(next_random(rng) % 24);
    c.sk = 9 + (int)(next_random(rng) % 24);
    c.seed = next_random(rng);
    fwd_result res = fwd_run_case(ctx, dev, &c);
    if (res.status != AJ_OK) {
        fprintf(stderr, "worker %d: %s: %s\n", (int)getpid(), aj_status_str(res.status),
                aj_last_error(ctx));
        r->failures++;
    } else if (!(res.max_err_o <= 1.0 && res.max_err_lse <= 1.0 && res.exact_empty_rows)) {
        fprintf(stderr, "worker %d: op %d: O error %.3g, LSE error %.3g x tolerance\n",
                (int)getpid(), i, res.max_err_o, res.max_err_lse);
        r->mismatches++;
    }
    aj_cache_stats s;
    if (aj_cache_get_stats(ctx, &s) == AJ_OK) {
        r->disk_hits += s.disk_hits;
        r->disk_writes += s.disk_writes;
        r->corrupt += s.corrupt_entries;
        r->evictions += s.evictions;
    }
    r->rounds++;
    fwd_cache_clear();
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
}

static _Noreturn void worker(int index, const char *dir, uint64_t cap, worker_report *r)
{
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(index + 1);
    for (int i = 0; i < ROUNDS; i++)
        round_of(dir, cap, &rng, r);
    _exit(r->failures || r->mismatches ? 1 : 0);
}

/* The entry files (.ajk) of dir, up to cap names; their count. */
static int list_entries(const char *dir, char names[][64], int cap)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < cap;) {
        size_t len = strlen(e->d_name);
        if (len > 4 && len < 64 && strcmp(e->d_name + len - 4, ".ajk") == 0)
            snprintf(names[n++], 64, "%s", e->d_name);
    }
    if (d)
        closedir(d);
    return n;
}

/* A pid that no process has now: a child that has exited and been reaped. */
static pid_t dead_pid(void)
{
    pid_t p = fork();
    if (p == 0)
        _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

/* Damages one entry in place, one way of four, or leaves a dead writer's
 * temporary file. */
static void vandalise(const char *dir, uint64_t *rng, pid_t dead)
{
    char names[64][64], path[700], other[700];
    int n = list_entries(dir, names, 64);
    int how = (int)(next_random(rng) % 5);
    if (how == 4 || n == 0) {
        snprintf(path, sizeof path, "%s/%016llx.ajk.%ld.%u.tmp", dir,
                 (unsigned long long)next_random(rng), (long)dead, (unsigned)how);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0 && write(fd, "AJKC partial", 12) >= 0)
            close(fd);
        return;
    }
    snprintf(path, sizeof path, "%s/%s", dir, names[next_random(rng) % (uint64_t)n]);
    struct stat sb;
    int fd = open(path, O_RDWR);
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size < 64) {
        if (fd >= 0)
            close(fd);
        return;
    }
    if (how == 0) {         /* a flipped byte in the payload */
        off_t at = sb.st_size - 1 - (off_t)(next_random(rng) % 32);
        unsigned char byte = 0;
        if (pread(fd, &byte, 1, at) == 1) {
            byte ^= 0x5a;
            (void)!pwrite(fd, &byte, 1, at);
        }
    } else if (how == 1) {  /* cut short */
        (void)!ftruncate(fd, sb.st_size / 2);
    } else if (how == 2) {  /* a header that is not an entry's */
        (void)!pwrite(fd, "XXXX", 4, 0);
    } else {                /* another key's valid entry under this name */
        snprintf(other, sizeof other, "%s/%s", dir, names[next_random(rng) % (uint64_t)n]);
        FILE *src = fopen(other, "rb");
        char buf[1 << 16];
        size_t got = src ? fread(buf, 1, sizeof buf, src) : 0;
        if (src)
            fclose(src);
        if (got > 0 && ftruncate(fd, 0) == 0)
            (void)!pwrite(fd, buf, got, 0);
    }
    close(fd);
}

/* Damages an entry each time the workers' rounds, in shared memory,
 * advance (a round or more since the last damage), until *stop. */
static _Noreturn void vandal(const char *dir, volatile int *stop, pid_t dead,
                             const volatile worker_report *reports)
{
    uint64_t rng = 0x2545f4914f6cdd1dull;
    int seen = 0;
    while (!*stop) {
        int rounds = 0;
        for (int i = 0; i < WORKERS; i++)
            rounds += reports[i].rounds;
        if (rounds > seen) {
            seen = rounds;
            vandalise(dir, &rng, dead);
        }
        usleep(500 + (useconds_t)(next_random(&rng) % 2000));
    }
    _exit(0);
}

/* Every file of dir older by `seconds` (what a later run would see). */
static void age_files(const char *dir, int seconds)
{
    DIR *d = opendir(dir);
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= seconds;
    t[1] = t[0];
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.')
            utimensat(dirfd(d), e->d_name, t, 0);
    if (d)
        closedir(d);
}

/* The total size of dir's entries, and its number of temporary files. */
static long long dir_bytes(const char *dir, int *temps)
{
    DIR *d = opendir(dir);
    long long total = 0;
    *temps = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        struct stat sb;
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".tmp") == 0)
            ++*temps;
        else if (len > 4 && strcmp(e->d_name + len - 4, ".ajk") == 0 &&
                 fstatat(dirfd(d), e->d_name, &sb, 0) == 0)
            total += sb.st_size;
    }
    if (d)
        closedir(d);
    return total;
}

/* Compiles and checks one forward of head dim d (an op the workers do not
 * ask for: a store, so an eviction pass) through dir in a new context. */
static void store_one(const char *dir, uint64_t cap, int d)
{
    aj_ctx *ctx = new_ctx(dir, cap);
    aj_device *dev = NULL;
    CHECK(ctx && aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev) == AJ_OK);
    fwd_case c = fwd_case_base("outside the workers' ops", AJ_DTYPE_F32, d, "causal(top_left)");
    fwd_result r = fwd_run_case(ctx, dev, &c);
    CHECK(fwd_check_result(ctx, &c, &r));
    aj_cache_stats s;
    CHECK(aj_cache_get_stats(ctx, &s) == AJ_OK && s.disk_writes == 1);
    fwd_cache_clear();
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
}

static int warnings;

static void count_warnings(void *user, aj_log_level level, const char *msg)
{
    (void)user;
    (void)msg;
    warnings += level == AJ_LOG_WARN;
}

/* A write that fails after the context is made (here the directory is
 * gone; a full disk or a directory made read-only fail the same write):
 * a warning, the kernel returned and kept in memory, nothing left. */
static void test_write_fails(const char *parent)
{
    char sub[600];
    snprintf(sub, sizeof sub, "%s/gone", parent);
    CHECK(mkdir(sub, 0700) == 0);
    aj_ctx *ctx = cache_ctx_ok(&(cache_ctx_opts){.dir = sub, .log_fn = count_warnings});
    aj_cache_stats s;
    CHECK(aj_cache_get_stats(ctx, &s) == AJ_OK && s.disk_enabled);
    CHECK(rmdir(sub) == 0);
    const char *text = "attention forward efficient { dtype = f32 head_dim = 24 }";
    aj_kernel *k1 = NULL, *k2 = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    CHECK_STATUS(ctx, spec_compile(ctx, text, "t", &opt, &k1), AJ_OK);
    CHECK_STATUS(ctx, spec_compile(ctx, text, "t", &opt, &k2), AJ_OK);
    CHECK(aj_cache_get_stats(ctx, &s) == AJ_OK);
    CHECK_MSG(k1 && k1 == k2 && s.memory_hits == 1 && s.disk_writes == 0 && warnings == 1,
              "memory hits %llu, disk writes %llu, %d warnings",
              (unsigned long long)s.memory_hits, (unsigned long long)s.disk_writes, warnings);
    CHECK(access(sub, F_OK) != 0);   /* nothing made */
    aj_kernel_destroy(k1);
    aj_kernel_destroy(k2);
    aj_ctx_destroy(ctx);
}

/* WORKERS processes released at once into an empty directory, each
 * compiling the same cpu op: one compiles (a miss), the others wait on
 * its lock and read its entry (disk hits), and no lock file is left. */
static void test_one_compile(const char *parent)
{
    char sub[600];
    snprintf(sub, sizeof sub, "%s/together", parent);
    CHECK(mkdir(sub, 0700) == 0);
    volatile unsigned long long *shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                                               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(shared != MAP_FAILED);
    if (shared == MAP_FAILED)
        return;
    /* [0] go, [1 + 2i] misses, [2 + 2i] disk hits of worker i */
    memset((void *)shared, 0, 4096);
    fflush(NULL);
    pid_t kids[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        if ((kids[i] = fork()) != 0)
            continue;
        aj_ctx *ctx = new_ctx(sub, 0);
        while (!shared[0])
            usleep(100);
        const char *text = "attention forward efficient { dtype = f32 head_dim = 128 "
                           "mask = causal(top_left) dropout = 0.1 }";
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = AJ_TARGET_CPU;
        aj_kernel *k = NULL;
        aj_cache_stats st;
        int ok = ctx && spec_compile(ctx, text, "t", &opt, &k) == AJ_OK &&
                 aj_cache_get_stats(ctx, &st) == AJ_OK;
        if (ok) {
            shared[1 + 2 * i] = st.misses;
            shared[2 + 2 * i] = st.disk_hits;
        }
        aj_kernel_destroy(k);
        aj_ctx_destroy(ctx);
        _exit(ok ? 0 : 1);
    }
    usleep(200000);   /* every worker has its context and waits */
    shared[0] = 1;
    unsigned long long misses = 0, hits = 0;
    for (int i = 0; i < WORKERS; i++) {
        int status = 0;
        waitpid(kids[i], &status, 0);
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "worker %d failed", i);
        misses += shared[1 + 2 * i];
        hits += shared[2 + 2 * i];
    }
    CHECK_MSG(misses == 1 && hits == WORKERS - 1,
              "%d processes compiling one op at once: %llu compiles, %llu disk hits", WORKERS,
              misses, hits);
    DIR *d = opendir(sub);
    int locks = 0, entries = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        locks += strstr(e->d_name, ".lock") != NULL;
        entries += strstr(e->d_name, ".ajk") != NULL && !strstr(e->d_name, ".lock");
    }
    if (d)
        closedir(d);
    CHECK_MSG(locks == 0 && entries == 1, "%d lock files, %d entries left", locks, entries);
    printf("%d processes compiling one op at once: %llu compile, %llu disk hits\n", WORKERS,
           misses, hits);
    munmap((void *)shared, 4096);
}

int main(void)
{
    char dir[] = "/tmp/aj_cache_procs_XXXXXX";
    if (!temp_dir_make(dir))
        return 1;
    int temps = 0;
    store_one(dir, 0, 40);   /* the size of one entry: what the cap is measured in */
    const uint64_t cap = (uint64_t)(dir_bytes(dir, &temps) * 7 / 2);
    worker_report *reports = mmap(NULL, sizeof(worker_report) * WORKERS + sizeof(int),
                                  PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(reports != MAP_FAILED);
    if (reports == MAP_FAILED)
        return check_report();
    memset(reports, 0, sizeof(worker_report) * WORKERS + sizeof(int));
    volatile int *stop = (volatile int *)(reports + WORKERS);

    fflush(NULL);
    pid_t dead = dead_pid();
    pid_t vandal_pid = fork();
    if (vandal_pid == 0)
        vandal(dir, stop, dead, reports);
    pid_t kids[WORKERS];
    for (int i = 0; i < WORKERS; i++)
        if ((kids[i] = fork()) == 0)
            worker(i, dir, cap, &reports[i]);
    /* the killed worker: after a few rounds, mid-way through whatever it does */
    while (reports[KILLED].rounds < 3 && waitpid(kids[KILLED], NULL, WNOHANG) == 0)
        usleep(1000);
    usleep((useconds_t)(getpid() % 7) * 1000);
    kill(kids[KILLED], SIGKILL);

    worker_report sum = {0};
    for (int i = 0; i < WORKERS; i++) {
        int status = 0;
        waitpid(kids[i], &status, 0);
        if (i == KILLED)
            continue;
        CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "worker %d: %d mismatches, %d failures", i, reports[i].mismatches,
                  reports[i].failures);
        sum.rounds += reports[i].rounds;
        sum.mismatches += reports[i].mismatches;
        sum.disk_hits += reports[i].disk_hits;
        sum.disk_writes += reports[i].disk_writes;
        sum.corrupt += reports[i].corrupt;
        sum.evictions += reports[i].evictions;
    }
    *stop = 1;
    waitpid(vandal_pid, NULL, 0);
    CHECK_MSG(sum.rounds == (WORKERS - 1) * ROUNDS, "%d rounds", sum.rounds);
    CHECK_MSG(sum.disk_hits > 0 && sum.disk_writes > 0 && sum.evictions > 0,
              "disk hits %llu, writes %llu, evictions %llu", sum.disk_hits, sum.disk_writes,
              sum.evictions);
    CHECK_MSG(sum.corrupt > 0, "the vandal's damage was never seen");

    /* later: one more store sweeps the dead writers' files and holds the cap */
    age_files(dir, 60);
    store_one(dir, cap, 64);
    long long bytes = dir_bytes(dir, &temps);
    CHECK_MSG(bytes <= (long long)cap, "%lld bytes in the directory, cap %llu", bytes,
              (unsigned long long)cap);
    CHECK_MSG(temps == 0, "%d temporary files of dead writers left", temps);
    printf("%d workers (1 killed), %d rounds checked, %d mismatches; disk hits %llu, writes "
           "%llu, damaged entries rebuilt %llu, evictions %llu; after: %lld of %llu bytes, "
           "%d temporary files\n", WORKERS, sum.rounds, sum.mismatches, sum.disk_hits,
           sum.disk_writes, sum.corrupt, sum.evictions, bytes, (unsigned long long)cap, temps);
    test_write_fails(dir);
    test_one_compile(dir);
    temp_dir_remove(dir);
    return check_report();
}
