/*
 * test_cache.c -- the kernel cache (memory and disk) and aj_compile_many.
 *
 * Hit, miss, a corrupt and a truncated entry (discarded and rebuilt, never
 * used), two processes compiling one op at once (one compiles, the other
 * waits on its lock and reads the entry) and two writing one entry at
 * once, a directory that cannot be used (memory only, with a warning),
 * eviction under a size cap, the switches that turn caching off; then
 * batches of good and bad ops.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache_ctx.h"
#include "check.h"
#include "runtime/cache.h"
#include "temp_dir.h"

static char dir[] = "/tmp/aj_cache_test_XXXXXX";
static int warnings;

static void count_warnings(void *user, aj_log_level level, const char *msg)
{
    if (level == AJ_LOG_WARN)
        warnings++;
}

static aj_ctx *new_ctx(const char *cache_dir, aj_cache_mode mode, uint64_t max_bytes)
{
    return cache_ctx_ok(&(cache_ctx_opts){.dir = cache_dir, .mode = mode,
                                           .max_bytes = max_bytes, .log_fn = count_warnings});
}

static aj_op *op_for(aj_ctx *ctx, int head_dim)
{
    char text[256];
    snprintf(text, sizeof text, "attention forward efficient { dtype = bf16 head_dim = %d "
             "mask = causal(top_left) }", head_dim);
    aj_op *op = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "t", &op), AJ_OK);
    return op;
}

static aj_kernel *compile(aj_ctx *ctx, int head_dim)
{
    aj_op *op = op_for(ctx, head_dim);
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_compile(ctx, op, NULL, &k), AJ_OK);
    aj_op_destroy(op);
    return k;
}

/* The single entry file of the cache directory (the tests keep one). */
static int entry_file(char *out, size_t cap)
{
    DIR *d = opendir(dir);
    int found = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".ajk") && !strstr(e->d_name, ".tmp") &&
            !strstr(e->d_name, ".lock")) {
            snprintf(out, cap, "%s/%s", dir, e->d_name);
            found++;
        }
    if (d)
        closedir(d);
    return found;
}

static int same_code(const aj_kernel *a, const aj_kernel *b)
{
    size_t na, nb;
    const void *ca = aj_kernel_code(a, &na), *cb = aj_kernel_code(b, &nb);
    aj_launch_info la, lb;
    aj_kernel_launch_info(a, &la);
    aj_kernel_launch_info(b, &lb);
    int same_params = la.num_params == lb.num_params;
    for (int i = 0; same_params && i < la.num_params; i++)
        same_params = strcmp(la.params[i].name, lb.params[i].name) == 0 &&
                      la.params[i].type == lb.params[i].type;
    return na == nb && memcmp(ca, cb, na) == 0 && same_params &&
           la.dynamic_smem == lb.dynamic_smem && la.block[0] == lb.block[0] &&
           la.grid[0].per_block == lb.grid[0].per_block &&
           strcmp(aj_kernel_entry(a), aj_kernel_entry(b)) == 0;
}

static void test_hit_and_miss(void)
{
    aj_ctx *a = new_ctx(dir, AJ_CACHE_DEFAULT, 0);
    aj_kernel *k1 = compile(a, 64);
    aj_cache_stats s = cache_stats(a);
    CHECK(s.disk_enabled && strcmp(s.disk_dir, dir) == 0);
    CHECK(s.misses == 1 && s.disk_writes == 1 && s.memory_hits == 0);
    aj_kernel *k2 = compile(a, 64);
    s = cache_stats(a);
    CHECK(s.memory_hits == 1 && s.misses == 1);
    CHECK(k1 == k2);   /* the same kernel, by reference */
    char path[600];
    CHECK(entry_file(path, sizeof path) == 1);

    aj_ctx *b = new_ctx(dir, AJ_CACHE_DEFAULT, 0);   /* a new process, in effect */
    aj_kernel *k3 = compile(b, 64);
    s = cache_stats(b);
    CHECK(s.disk_hits == 1 && s.misses == 0);
    CHECK(k3 && same_code(k1, k3));
    aj_launch_info li;
    CHECK(aj_kernel_launch_info(k3, &li) == AJ_OK && li.schedule.block_m == 32);
    /* bypass_cache compiles afresh */
    aj_op *op = op_for(b, 64);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.bypass_cache = true;
    aj_kernel *k4 = NULL;
    CHECK_STATUS(b, aj_compile(b, op, &opt, &k4), AJ_OK);
    CHECK(k4 != k3 && same_code(k3, k4) && cache_stats(b).memory_hits == 0);
    aj_op_destroy(op);
    aj_kernel_destroy(k1);
    aj_kernel_destroy(k2);
    aj_kernel_destroy(k3);
    aj_kernel_destroy(k4);
    aj_ctx_destroy(a);
    aj_ctx_destroy(b);
}

/* Damages the entry with `damage`, then a fresh context must rebuild. */
static void check_damaged(const char *what, void (*damage)(const char *path))
{
    char path[600];
    CHECK(entry_file(path, sizeof path) == 1);
    damage(path);
    aj_ctx *c = new_ctx(dir, AJ_CACHE_DEFAULT, 0);
    int before = warnings;
    aj_kernel *k = compile(c, 64);
    aj_cache_stats s = cache_stats(c);
    CHECK_MSG(s.corrupt_entries == 1 && s.disk_hits == 0 && s.misses == 1,
              "%s: corrupt %llu, disk hits %llu", what, (unsigned long long)s.corrupt_entries,
              (unsigned long long)s.disk_hits);
    CHECK_MSG(warnings == before + 1, "%s: no warning", what);
    CHECK(k && strstr(aj_kernel_code(k, NULL), ".entry"));
    aj_kernel_destroy(k);
    aj_ctx_destroy(c);
    /* the rebuilt entry is whole again */
    aj_ctx *d = new_ctx(dir, AJ_CACHE_DEFAULT, 0);
    aj_kernel *k2 = compile(d, 64);
    CHECK_MSG(cache_stats(d).disk_hits == 1, "%s: entry not rewritten", what);
    aj_kernel_destroy(k2);
    aj_ctx_destroy(d);
}

static void flip_last_byte(const char *path)
{
    FILE *f = fopen(path, "r+b");
    fseek(f, -1, SEEK_END);
    int c = fgetc(f);
    fseek(f, -1, SEEK_END);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

static void truncate_half(const char *path)
{
    struct stat sb;
    stat(path, &sb);
    CHECK(truncate(path, sb.st_size / 2) == 0);
}

static void overwrite_header(const char *path)
{
    FILE *f = fopen(path, "r+b");
    fputs("JUNK", f);
    fclose(f);
}

static void test_damaged_entries(void)
{
    check_damaged("flipped byte", flip_last_byte);
    check_damaged("truncated", truncate_half);
    check_damaged("bad magic", overwrite_header);
}

/* Names in the cache directory containing `part`. */
static int count_files(const char *part)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strstr(e->d_name, part) != NULL;
    if (d)
        closedir(d);
    return n;
}

static void test_two_writers(void)
{
    /* both processes miss at once: one compiles and writes the entry, the
     * other waits on its compile lock and reads it (exit 0: wrote, 2: read) */
    char path[600];
    if (entry_file(path, sizeof path) == 1)
        unlink(path);
    pid_t kids[2];
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            aj_ctx *c = new_ctx(dir, AJ_CACHE_DEFAULT, 0);
            aj_kernel *k = compile(c, 64);
            aj_cache_stats s = cache_stats(c);
            int code = !k ? 1 : s.disk_writes == 1 && s.disk_hits == 0 ? 0
                              : s.disk_writes == 0 && s.disk_hits == 1 ? 2 : 1;
            aj_kernel_destroy(k);
            aj_ctx_destroy(c);
            _exit(code);
        }
    }
    int wrote = 0, read = 0;
    for (int i = 0; i < 2; i++) {
        int status = 0;
        waitpid(kids[i], &status, 0);
        wrote += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        read += WIFEXITED(status) && WEXITSTATUS(status) == 2;
    }
    CHECK_MSG(wrote == 1 && read == 1, "two processes at once: %d wrote, %d read", wrote, read);
    CHECK(entry_file(path, sizeof path) == 1);   /* one entry, no temp files left */
    CHECK(count_files(".lock") == 0 && count_files(".tmp") == 0);
    aj_ctx *c = new_ctx(dir, AJ_CACHE_DEFAULT, 0);
    aj_kernel *k = compile(c, 64);
    aj_cache_stats s = cache_stats(c);
    CHECK(s.disk_hits == 1 && s.corrupt_entries == 0);
    aj_kernel_destroy(k);
    aj_ctx_destroy(c);

    /* two writers of one key at the same time (a compile lock lost in a
     * race or waited for past its bound): each writes the entry 100 times,
     * and one whole entry is left, no temporary file */
    static uint8_t payload[1 << 16];
    for (size_t i = 0; i < sizeof payload; i++)
        payload[i] = (uint8_t)(i * 131u >> 3);
    for (int i = 0; i < 2; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            aj_ctx *w = new_ctx(dir, AJ_CACHE_DEFAULT, 0);
            for (int n = 0; n < 100; n++)
                aj_cache_blob_store(w, aj_cache_of(w), AJ_CACHE_CUBIN, "two writers", payload,
                                    sizeof payload);
            aj_ctx_destroy(w);
            _exit(0);
        }
    }
    for (int i = 0; i < 2; i++) {
        int status = 0;
        waitpid(kids[i], &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    c = new_ctx(dir, AJ_CACHE_DEFAULT, 0);
    size_t len = 0;
    uint8_t *back = aj_cache_blob_lookup(c, aj_cache_of(c), AJ_CACHE_CUBIN, "two writers", &len);
    CHECK(back && len == sizeof payload && memcmp(back, payload, len) == 0);
    CHECK(count_files(".cubin") == 1 && count_files(".tmp") == 0);
    free(back);
    char cubin[640];
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".cubin")) {
            snprintf(cubin, sizeof cubin, "%s/%s", dir, e->d_name);
            unlink(cubin);
        }
    if (d)
        closedir(d);
    aj_ctx_destroy(c);
}

static void test_unusable_directories(void)
{
    /* a cache "directory" that is a file, and one that cannot be created */
    char file[600];
    snprintf(file, sizeof file, "%s/plain-file", dir);
    FILE *f = fopen(file, "w");
    fclose(f);
    const char *bad[] = {file, "/proc/attnjit-cache-cannot-exist"};
    for (int i = 0; i < 2; i++) {
        int before = warnings;
        aj_ctx *c = new_ctx(bad[i], AJ_CACHE_DEFAULT, 0);
        aj_kernel *k1 = compile(c, 64), *k2 = compile(c, 64);
        aj_cache_stats s = cache_stats(c);
        CHECK_MSG(!s.disk_enabled && s.memory_hits == 1, "%s: disk %d", bad[i], s.disk_enabled);
        CHECK_MSG(warnings == before + 1, "%s: %d warnings", bad[i], warnings - before);
        aj_kernel_destroy(k1);
        aj_kernel_destroy(k2);
        aj_ctx_destroy(c);
    }
    unlink(file);
}

static void test_switches(void)
{
    aj_ctx *off = new_ctx(dir, AJ_CACHE_OFF, 0);
    aj_kernel *k1 = compile(off, 64), *k2 = compile(off, 64);
    CHECK(k1 != k2 && cache_stats(off).misses == 0 && !cache_stats(off).disk_enabled);
    aj_kernel_destroy(k1);
    aj_kernel_destroy(k2);
    aj_ctx_destroy(off);

    aj_ctx *mem = new_ctx(dir, AJ_CACHE_MEMORY, 0);
    k1 = compile(mem, 64);
    k2 = compile(mem, 64);
    CHECK(k1 == k2 && !cache_stats(mem).disk_enabled && cache_stats(mem).disk_writes == 0);
    aj_kernel_destroy(k1);
    aj_kernel_destroy(k2);
    aj_ctx_destroy(mem);

    setenv("AJ_CACHE", "off", 1);
    aj_ctx *env = new_ctx(dir, AJ_CACHE_DEFAULT, 0);
    k1 = compile(env, 64);
    CHECK(!cache_stats(env).disk_enabled && cache_stats(env).disk_hits == 0);
    aj_kernel_destroy(k1);
    aj_ctx_destroy(env);
    unsetenv("AJ_CACHE");
}

static void test_eviction(void)
{
    char path[600];
    CHECK(entry_file(path, sizeof path) == 1);
    struct stat sb;
    stat(path, &sb);
    /* room for two entries of this size: the third write evicts the oldest */
    uint64_t cap = (uint64_t)sb.st_size * 5 / 2;
    aj_ctx *c = new_ctx(dir, AJ_CACHE_DEFAULT, cap);
    int dims[3] = {32, 96, 128};
    for (int i = 0; i < 3; i++) {
        aj_kernel *k = compile(c, dims[i]);
        aj_kernel_destroy(k);
    }
    aj_cache_stats s = cache_stats(c);
    CHECK_MSG(s.evictions >= 2, "evictions %llu", (unsigned long long)s.evictions);
    DIR *d = opendir(dir);
    long total = 0;
    int files = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        char p[800];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (strstr(e->d_name, ".ajk") && stat(p, &sb) == 0) {
            total += sb.st_size;
            files++;
        }
    }
    closedir(d);
    CHECK_MSG(files <= 2 && (uint64_t)total <= cap, "%d files, %ld bytes, cap %llu", files,
              total, (unsigned long long)cap);
    aj_ctx_destroy(c);
}

static void test_compile_many(void)
{
    aj_ctx *ctx = new_ctx(dir, AJ_CACHE_MEMORY, 0);
    const char *texts[] = {
        "attention forward efficient { dtype = f16 head_dim = 64 }",
        "attention forward efficient { dtype = f16 head_dim = 100 }",          /* unsupported */
        "attention forward efficient { dtype = bf16 head_dim = 128 mask = causal(top_left) }",
        "attention backward flash { dtype = f32 head_dim = 64 }",              /* unsupported */
        "attention forward efficient { dtype = f32 head_dim = 32 mask = window(4, 4) }",
        "attention forward efficient { dtype = f16 head_dim = 256 }",
    };
    enum { N = 7 };
    aj_compile_job jobs[N];
    aj_op *ops[6] = {0};
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < 6; i++) {
        CHECK_STATUS(ctx, aj_op_parse(ctx, texts[i], strlen(texts[i]), "m", &ops[i]), AJ_OK);
        jobs[i].op = ops[i];
    }
    aj_op_set_dropout(ops[5], 3.0);   /* a sticky builder error */
    jobs[6].op = NULL;
    aj_status st = aj_compile_many(ctx, jobs, N, NULL, 3);
    CHECK(st == AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "4 of 7 compiles failed");
    aj_status want[N] = {AJ_OK, AJ_ERR_UNSUPPORTED, AJ_OK, AJ_ERR_UNSUPPORTED, AJ_OK,
                         AJ_ERR_INVALID_ARG, AJ_ERR_INVALID_ARG};
    const char *needle[N] = {"", "head_dim = 100", "", "dtype = f32: flash backward", "",
                             "dropout", "jobs[6].op is NULL"};
    for (int i = 0; i < N; i++) {
        CHECK_MSG(jobs[i].status == want[i], "job %d: %s", i, aj_status_str(jobs[i].status));
        CHECK_MSG(strstr(jobs[i].message, needle[i]) != NULL, "job %d: '%s'", i,
                  jobs[i].message);
        CHECK((jobs[i].kernel != NULL) == (want[i] == AJ_OK));
    }
    /* results in request order: each equals its own single compile */
    for (int i = 0; i < N; i++) {
        if (!jobs[i].kernel)
            continue;
        aj_kernel *single = NULL;
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.bypass_cache = true;
        CHECK_STATUS(ctx, aj_compile(ctx, ops[i], &opt, &single), AJ_OK);
        CHECK_MSG(single && same_code(single, jobs[i].kernel), "job %d differs", i);
        aj_kernel_destroy(single);
        aj_kernel_destroy(jobs[i].kernel);
    }
    CHECK_STATUS(ctx, aj_compile_many(ctx, jobs, 0, NULL, 0), AJ_OK);
    CHECK_STATUS(ctx, aj_compile_many(ctx, NULL, 3, NULL, 0), AJ_ERR_INVALID_ARG);
    CHECK_STATUS(ctx, aj_compile_many(ctx, jobs, 1, NULL, -1), AJ_ERR_INVALID_ARG);
    for (int i = 0; i < 6; i++)
        aj_op_destroy(ops[i]);
    aj_ctx_destroy(ctx);
}

int main(void)
{
    static void (*const tests[])(void) = {
        test_hit_and_miss, test_damaged_entries, test_two_writers, test_unusable_directories,
        test_switches, test_eviction, test_compile_many, NULL};
    if (!temp_dir_run(dir, tests))
        return 2;
    return check_report();
}
