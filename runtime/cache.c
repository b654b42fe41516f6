/*
 * cache.c -- the kernel cache: in memory per context, and on disk.
 *
 * Every entry has a kind, a row of entry_kinds below: PTX, cpu object
 * code, sim object code (the kernels a compile makes) and cubins (what the
 * driver's linker makes of a kernel's PTX).  A key (aj_cache_key, the one
 * place a key is made) is the kind, its fields (a compile: the op's
 * canonical hash, the target, the opt level, the emitted form; a cubin:
 * the PTX's hash, the compute capability, the driver version), what the
 * kind's code depends on (the host CPU for host code), the LLVM version
 * where LLVM made it, and attnjit's version and a digest of the sources
 * that generate code, so no build of attnjit ever reads entries another
 * build wrote.  Memory entries hold a reference to a kernel; disk entries
 * (the kinds whose row allows it) are files
 *
 *     <dir>/<xxh3-64 of the key>.<suffix of the entry's kind>:
 *         "AJKC"  u32 format  u32 key length  key  u64 payload length
 *         u64 xxh3-64 of the payload   payload
 *
 * with the kind's payload: an aj_kernel (aj_kernel_serialize, .ajk) or a
 * cubin (.cubin), written to a temporary name and renamed into place, so a reader sees a
 * whole entry or none, and two processes writing the same key both leave a
 * valid one.  An entry that fails any check is deleted and rebuilt, never
 * used, and removed only if it is still the file that failed.  Hits refresh
 * the file's time; past the size cap the least recently used entries go,
 * with the temporary files of writers that died mid-way (stale_temp).  A
 * directory that cannot be used degrades the cache to memory only, with
 * one warning; a write that fails (a full disk, a directory made read-only
 * since) is a warning and leaves the kernel in memory.  Processes share a
 * directory without locks for correctness: docs/api.md "The kernel cache"
 * says what holds.  One advisory lock saves work: a compile that misses
 * takes an flock on <entry>.lock, looks again, and keeps the lock until
 * its entry is stored, so processes that want the same kernel at once
 * compile it once (compile_lock).  A lost race there costs a duplicate
 * compile, never a wrong entry.
 */
#include "runtime/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define ENTRY_MAGIC "AJKC"
#define ENTRY_FORMAT 1u
#define MAX_ENTRY_BYTES ((size_t)256 << 20)
#define DEFAULT_MAX_BYTES ((uint64_t)1 << 30)
#define DEFAULT_MAX_KERNELS 256
/* how long a compile waits for another process's compile of the same key */
#define COMPILE_LOCK_SECONDS 120

/* ---------------------------------------------------------------- keys */

/* What sim kernels' object code depends on: the host CPU's, and the
 * emulator it calls (AJ_EMULATOR_ID: a digest of runtime/sim's sources,
 * whose functions it binds by name and whose thread record it writes). */
static void sim_depends(char *out, size_t cap)
{
    char cpu[224];
    aj_host_cpu_id(cpu, sizeof cpu);
    snprintf(out, cap, "%s|emulator %s", cpu, AJ_EMULATOR_ID);
}

/*
 * Entry kinds, one row each (the target table says which kind each
 * target's compiles make; a cubin is made by the driver's linker from a
 * kernel's PTX): what its content depends on beyond the key's fields
 * (optional), whether LLVM made it, and its file suffix.  Every kind goes
 * to disk where the cache has a directory.  A new kind of code is a new
 * row.
 */
static const struct {
    const char *name;
    void (*depends)(char *out, size_t cap);   /* optional */
    bool llvm;
    const char *suffix;
} entry_kinds[AJ_CACHE_KIND_COUNT] = {
    /* PTX text: portable across GPUs of the target, loaded by the driver */
    [AJ_CACHE_PTX] = {"ptx", NULL, true, "ajk"},
    /* host object code for this CPU and its features (AJ_CPU_ISA included) */
    [AJ_CACHE_CPU_OBJECT] = {"cpu-object", aj_host_cpu_id, true, "ajk"},
    /* host code that calls into the emulator: for this CPU, and for the
     * emulator's functions and thread layout as this build has them */
    [AJ_CACHE_SIM_OBJECT] = {"sim-object", sim_depends, true, "ajk"},
    /* a GPU's machine code, keyed by the PTX's hash, the compute capability
     * and the driver version (the fields): disk only */
    [AJ_CACHE_CUBIN] = {"cubin", NULL, false, "cubin"},
};

aj_cache_kind aj_cache_kind_of(aj_target target)
{
    return aj_target_desc_of(target)->cache_kind;
}

void aj_cache_key(aj_cache_kind kind, const char *fields, char *out, size_t cap)
{
    const int known = kind != AJ_CACHE_NONE;
    char depends[256] = "", llvm[64] = "";
    if (known && entry_kinds[kind].depends)
        entry_kinds[kind].depends(depends, sizeof depends);
    if (known && entry_kinds[kind].llvm)
        snprintf(llvm, sizeof llvm, "llvm %s|", aj_llvm_version());
    /* AJ_CODEGEN_ID: a digest of the IR, codegen and template sources */
    snprintf(out, cap, "aj-%s|%s|%sattnjit %s+%s|%s", known ? entry_kinds[kind].name : "-",
             fields, llvm, aj_version_string(), AJ_CODEGEN_ID, depends);
}

typedef struct mem_entry {
    char *key;
    uint64_t hash;       /* of key: compared first */
    uint64_t used;       /* the cache's clock at the entry's last store or hit */
    aj_kernel *kernel;
} mem_entry;

/* A key some thread has claimed to compile (aj_cache_lookup_or_claim),
 * and the key's lock file while it holds it (compile_lock; -1: none). */
typedef struct claim {
    struct claim *next;
    char *key;
    int lock_fd;
    char lock_path[608];
} claim;

struct aj_kernel_cache {
    pthread_mutex_t lock;
    pthread_cond_t claim_ended;  /* a claimed key was stored or given up */
    claim *claims;
    mem_entry *entries;  /* at most max_kernels, the least recently used go */
    size_t count, cap, max_kernels;
    uint64_t clock;
    int disk;
    char dir[512];
    uint64_t max_bytes;
    aj_cache_stats stats;
    unsigned temp_counter;
};

static void cache_free(aj_kernel_cache *c)
{
    for (size_t i = 0; i < c->count; i++) {
        free(c->entries[i].key);
        aj_kernel_destroy(c->entries[i].kernel);
    }
    free(c->entries);
    pthread_cond_destroy(&c->claim_ended);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* mkdir -p with 0700 for the parts it creates */
static int make_dirs(const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(buf, 0700) != 0 && errno != EEXIST)
        return -1;
    return 0;
}

static void resolve_dir(const aj_ctx *ctx, char *out, size_t cap)
{
    const char *env;
    if (ctx->config.cache_dir)
        snprintf(out, cap, "%s", ctx->config.cache_dir);
    else if ((env = getenv("AJ_CACHE_DIR")) && *env)
        snprintf(out, cap, "%s", env);
    else if ((env = getenv("XDG_CACHE_HOME")) && *env)
        snprintf(out, cap, "%s/attnjit", env);
    else if ((env = getenv("HOME")) && *env)
        snprintf(out, cap, "%s/.cache/attnjit", env);
    else
        out[0] = '\0';
}

static int disk_wanted(const aj_ctx *ctx)
{
    if (ctx->config.cache_mode != AJ_CACHE_DEFAULT)
        return 0;
    const char *env = getenv("AJ_CACHE");
    return !(env && (strcmp(env, "off") == 0 || strcmp(env, "0") == 0 ||
                     strcmp(env, "memory") == 0));
}

/* Sets up the disk part, or explains (once) why there is none. */
static void open_disk(aj_ctx *ctx, aj_kernel_cache *c)
{
    if (!disk_wanted(ctx))
        return;
    resolve_dir(ctx, c->dir, sizeof c->dir);
    struct stat sb;
    const char *why = NULL;
    if (!c->dir[0])
        why = "no cache directory (set AJ_CACHE_DIR, XDG_CACHE_HOME or HOME)";
    else if (make_dirs(c->dir) != 0 || stat(c->dir, &sb) != 0)
        why = strerror(errno);
    else if (!S_ISDIR(sb.st_mode))
        why = "not a directory";
    else if (access(c->dir, W_OK | X_OK) != 0)
        why = "not writable";
    if (why) {
        aj_log(ctx, AJ_LOG_WARN, "kernel cache: %s: %s; caching in memory only", c->dir, why);
        return;
    }
    c->disk = 1;
    c->stats.disk_enabled = true;
    snprintf(c->stats.disk_dir, sizeof c->stats.disk_dir, "%s", c->dir);
}

aj_kernel_cache *aj_cache_of(aj_ctx *ctx)
{
    static pthread_mutex_t making = PTHREAD_MUTEX_INITIALIZER;
    if (ctx->config.cache_mode == AJ_CACHE_OFF)
        return NULL;
    aj_kernel_cache *c = atomic_load_explicit(&ctx->cache, memory_order_acquire);
    if (c)
        return c;
    pthread_mutex_lock(&making);   /* threads sharing ctx: one makes it */
    c = atomic_load_explicit(&ctx->cache, memory_order_acquire);
    if (!c && (c = calloc(1, sizeof *c))) {
        pthread_mutex_init(&c->lock, NULL);
        pthread_cond_init(&c->claim_ended, NULL);
        c->max_bytes = ctx->config.cache_max_bytes ? ctx->config.cache_max_bytes
                                                   : DEFAULT_MAX_BYTES;
        c->max_kernels = ctx->config.cache_max_kernels ? (size_t)ctx->config.cache_max_kernels
                                                       : DEFAULT_MAX_KERNELS;
        open_disk(ctx, c);
        ctx->cache_free = cache_free;
        atomic_store_explicit(&ctx->cache, c, memory_order_release);
    }
    pthread_mutex_unlock(&making);
    return c;
}

aj_status aj_cache_get_stats(aj_ctx *ctx, aj_cache_stats *out)
{
    if (!ctx || !out)
        return AJ_ERR_INVALID_ARG;
    aj_kernel_cache *c = aj_cache_of(ctx);
    memset(out, 0, sizeof *out);
    if (!c)
        return AJ_OK;
    pthread_mutex_lock(&c->lock);
    *out = c->stats;
    pthread_mutex_unlock(&c->lock);
    return AJ_OK;
}

/* ---------------------------------------------------------------- disk */

static void entry_path(const aj_kernel_cache *c, aj_cache_kind kind, const char *key,
                       char *out, size_t cap)
{
    snprintf(out, cap, "%s/%016llx.%s", c->dir,
             (unsigned long long)XXH3_64bits(key, strlen(key)), entry_kinds[kind].suffix);
}

/* Whether a file name is a cache entry's, of any kind. */
static int is_entry_name(const char *name)
{
    const char *dot = strrchr(name, '.');
    for (int k = 0; dot && k < AJ_CACHE_KIND_COUNT; k++)
        if (strcmp(dot + 1, entry_kinds[k].suffix) == 0)
            return 1;
    return 0;
}

/* The file at path, whole, with *id what it is (so that a damaged one is
 * removed only if it is still the file at path: another process may have
 * renamed a good entry over it since). */
static uint8_t *read_whole(const char *path, size_t *len, struct stat *id)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat sb;
    uint8_t *buf = NULL;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size <= MAX_ENTRY_BYTES) {
        *id = sb;
        buf = malloc((size_t)sb.st_size + 1);
        size_t got = 0;
        while (buf && got < (size_t)sb.st_size) {
            ssize_t n = read(fd, buf + got, (size_t)sb.st_size - got);
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        *len = got;
    }
    close(fd);
    return buf;
}

/* The payload of a valid entry for `key`, or NULL (*corrupt says whether
 * the file existed but failed a check). */
static const uint8_t *check_entry(const uint8_t *buf, size_t len, const char *key,
                                  size_t *payload_len, int *corrupt)
{
    size_t klen = strlen(key);
    uint32_t format, stored_klen;
    uint64_t plen, sum;
    *corrupt = 1;
    if (len < 12 || memcmp(buf, ENTRY_MAGIC, 4) != 0)
        return NULL;
    memcpy(&format, buf + 4, 4);
    memcpy(&stored_klen, buf + 8, 4);
    if (format != ENTRY_FORMAT || stored_klen > len - 12 || len - 12 - stored_klen < 16)
        return NULL;
    if (stored_klen != klen || memcmp(buf + 12, key, klen) != 0) {
        *corrupt = 0;   /* another key with the same file name: a miss */
        return NULL;
    }
    const uint8_t *p = buf + 12 + klen;
    memcpy(&plen, p, 8);
    memcpy(&sum, p + 8, 8);
    p += 16;
    if (plen != (uint64_t)(len - (size_t)(p - buf)) || XXH3_64bits(p, (size_t)plen) != sum)
        return NULL;
    *corrupt = 0;
    *payload_len = (size_t)plen;
    return p;
}

/* Removes the damaged entry `id` read from path, unless another process has
 * replaced it there since (a rename is atomic; the check before the unlink
 * leaves a window of two system calls, in which the worst outcome is that
 * a good entry goes and is rebuilt). */
static void discard(aj_ctx *ctx, aj_kernel_cache *c, const char *path, const struct stat *id)
{
    struct stat now;
    aj_log(ctx, AJ_LOG_WARN, "kernel cache: %s is damaged; removed, the entry is rebuilt",
           path);
    if (stat(path, &now) == 0 && now.st_ino == id->st_ino && now.st_dev == id->st_dev)
        unlink(path);
    pthread_mutex_lock(&c->lock);
    c->stats.corrupt_entries++;
    pthread_mutex_unlock(&c->lock);
}

/* A valid entry's payload, moved to the front of its buffer (the caller
 * frees it), with *path its file. */
static uint8_t *read_entry(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind,
                           const char *key, size_t *plen, char *path, size_t path_cap,
                           struct stat *id)
{
    entry_path(c, kind, key, path, path_cap);
    size_t len = 0;
    uint8_t *buf = read_whole(path, &len, id);
    if (!buf)
        return NULL;
    int corrupt = 0;
    const uint8_t *payload = check_entry(buf, len, key, plen, &corrupt);
    if (!payload) {
        free(buf);
        if (corrupt)
            discard(ctx, c, path, id);
        return NULL;
    }
    memmove(buf, payload, *plen);
    utimensat(AT_FDCWD, path, NULL, 0);   /* recently used */
    return buf;
}

uint8_t *aj_cache_blob_lookup(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind,
                              const char *key, size_t *len)
{
    char path[600];
    struct stat id;
    if (!c || !c->disk)
        return NULL;
    uint8_t *data = read_entry(ctx, c, kind, key, len, path, sizeof path, &id);
    pthread_mutex_lock(&c->lock);
    if (data)
        c->stats.disk_hits++;
    else
        c->stats.misses++;
    pthread_mutex_unlock(&c->lock);
    return data;
}

static aj_kernel *disk_lookup(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind,
                              const char *key)
{
    char path[600];
    struct stat id;
    size_t plen = 0;
    uint8_t *payload = read_entry(ctx, c, kind, key, &plen, path, sizeof path, &id);
    aj_kernel *k = NULL;
    if (payload && aj_kernel_deserialize(ctx, payload, plen, &k) != AJ_OK) {
        k = NULL;
        discard(ctx, c, path, &id);
    }
    free(payload);
    return k;
}

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

typedef struct file_age {
    char name[64];
    off_t size;
    struct timespec mtime;
} file_age;

static int older_first(const void *a, const void *b)
{
    const file_age *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    return (x->mtime.tv_nsec > y->mtime.tv_nsec) - (x->mtime.tv_nsec < y->mtime.tv_nsec);
}

/*
 * Whether `name`, of age `age` seconds, is a writer's temporary file
 * (<entry>.<pid>.<serial>.tmp, aj_cache_blob_store) that will never be
 * renamed into place: its writer was killed or crashed mid-way.  That is a
 * file older than STALE_TEMP_SECONDS, or older than DEAD_TEMP_SECONDS
 * whose writer's pid is not a process here (a writer in another pid
 * namespace or on another host sharing the directory may look dead: the
 * age keeps its file while it writes).
 */
#define DEAD_TEMP_SECONDS 10
#define STALE_TEMP_SECONDS 3600

static bool stale_temp(const char *name, double age)
{
    size_t len = strlen(name);
    if (len < 4 || strcmp(name + len - 4, ".tmp") != 0 || age < DEAD_TEMP_SECONDS)
        return false;
    if (age >= STALE_TEMP_SECONDS)
        return true;
    char copy[256];
    snprintf(copy, sizeof copy, "%.*s", (int)(len - 4), name);
    char *serial = strrchr(copy, '.');
    if (!serial)
        return false;
    *serial = '\0';
    char *pid_text = strrchr(copy, '.'), *end = NULL;
    long pid = pid_text ? strtol(pid_text + 1, &end, 10) : 0;
    if (pid <= 0 || !end || *end)
        return false;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Removes writers' temporary files that will never become entries
 * (stale_temp), then least recently used entries until the total fits the
 * cap. */
static void evict(aj_kernel_cache *c)
{
    DIR *d = opendir(c->dir);
    if (!d)
        return;
    file_age *files = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (struct dirent *e; (e = readdir(d));) {
        char path[600];
        struct stat sb;
        if (strlen(e->d_name) >= sizeof files[0].name)
            continue;
        snprintf(path, sizeof path, "%s/%s", c->dir, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (stale_temp(e->d_name, difftime(now.tv_sec, sb.st_mtim.tv_sec))) {
            unlink(path);
            continue;
        }
        if (!is_entry_name(e->d_name))
            continue;
        if (n == cap) {
            file_age *bigger = realloc(files, (cap = cap ? cap * 2 : 64) * sizeof *files);
            if (!bigger)
                break;
            files = bigger;
        }
        snprintf(files[n].name, sizeof files[n].name, "%s", e->d_name);
        files[n].size = sb.st_size;
        files[n].mtime = sb.st_mtim;
        total += (uint64_t)sb.st_size;
        n++;
    }
    closedir(d);
    if (files)
        qsort(files, n, sizeof *files, older_first);
    for (size_t i = 0; i < n && total > c->max_bytes; i++) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", c->dir, files[i].name);
        if (unlink(path) == 0) {
            total -= (uint64_t)files[i].size;
            c->stats.evictions++;
        }
    }
    free(files);
}

void aj_cache_blob_store(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind,
                         const char *key, const void *payload, size_t plen)
{
    if (!c || !c->disk)
        return;
    char path[600], temp[700];
    entry_path(c, kind, key, path, sizeof path);
    pthread_mutex_lock(&c->lock);
    unsigned serial = c->temp_counter++;
    pthread_mutex_unlock(&c->lock);
    snprintf(temp, sizeof temp, "%s.%ld.%u.tmp", path, (long)getpid(), serial);
    uint32_t format = ENTRY_FORMAT, klen = (uint32_t)strlen(key);
    uint64_t len64 = plen, sum = XXH3_64bits(payload, plen);
    int fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int bad = fd < 0 || write_all(fd, ENTRY_MAGIC, 4) || write_all(fd, &format, 4) ||
              write_all(fd, &klen, 4) || write_all(fd, key, klen) ||
              write_all(fd, &len64, 8) || write_all(fd, &sum, 8) ||
              write_all(fd, payload, plen);
    if (fd >= 0 && close(fd) != 0)
        bad = 1;
    if (!bad && rename(temp, path) != 0)
        bad = 1;
    if (bad) {
        aj_log(ctx, AJ_LOG_WARN, "kernel cache: cannot write %s: %s", path, strerror(errno));
        unlink(temp);
        return;
    }
    pthread_mutex_lock(&c->lock);
    c->stats.disk_writes++;
    evict(c);
    pthread_mutex_unlock(&c->lock);
}

static void disk_store(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind, const char *key,
                       const aj_kernel *k)
{
    uint8_t *payload = NULL;
    size_t plen = 0;
    if (aj_kernel_serialize(ctx, k, &payload, &plen) != AJ_OK)
        return;
    aj_cache_blob_store(ctx, c, kind, key, payload, plen);
    free(payload);
}

/* The cross-process lock of key's compile: an flock on <entry>.lock,
 * waited for (polling, COMPILE_LOCK_SECONDS at most: a holder that hangs
 * must not hang this process too; one that dies releases it).  Returns
 * the locked descriptor, or -1 (no lock: the caller compiles anyway). */
static int compile_lock(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind, const char *key,
                        char *path, size_t cap)
{
    char entry[600];
    entry_path(c, kind, key, entry, sizeof entry);
    snprintf(path, cap, "%s.lock", entry);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -1;
    struct timespec start, now, nap = {0, 100000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int why = errno;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((why != EWOULDBLOCK && why != EINTR) ||
            now.tv_sec - start.tv_sec >= COMPILE_LOCK_SECONDS) {
            if (why == EWOULDBLOCK)
                aj_log(ctx, AJ_LOG_WARN, "kernel cache: %s held for %d s by another process; "
                       "compiling without it", path, COMPILE_LOCK_SECONDS);
            close(fd);
            return -1;
        }
        nanosleep(&nap, NULL);
        if (nap.tv_nsec < 20000000)   /* 0.1 ms doubling to 20 ms */
            nap.tv_nsec *= 2;
    }
    return fd;
}

/* ---------------------------------------------------------------- lookup */

static void memory_store(aj_kernel_cache *c, const char *key, aj_kernel *k);

/* Under the lock: the memory entry of key (of hash h), or NULL. */
static mem_entry *memory_entry(aj_kernel_cache *c, const char *key, uint64_t h)
{
    for (size_t i = 0; i < c->count; i++)
        if (c->entries[i].hash == h && strcmp(c->entries[i].key, key) == 0)
            return &c->entries[i];
    return NULL;
}

/* Under the lock: a new reference to the kernel kept in memory under key,
 * now the most recently used. */
static aj_kernel *memory_find(aj_kernel_cache *c, const char *key)
{
    mem_entry *e = memory_entry(c, key, XXH3_64bits(key, strlen(key)));
    if (!e)
        return NULL;
    e->used = ++c->clock;
    return aj_kernel_retain(e->kernel);
}

/* Under the lock: whether some thread has claimed key. */
static int is_claimed(const aj_kernel_cache *c, const char *key)
{
    for (const claim *p = c->claims; p; p = p->next)
        if (strcmp(p->key, key) == 0)
            return 1;
    return 0;
}

aj_kernel *aj_cache_lookup_or_claim(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind,
                                    const char *key, int *claimed)
{
    *claimed = 0;
    pthread_mutex_lock(&c->lock);
    aj_kernel *k;
    while (!(k = memory_find(c, key)) && is_claimed(c, key))
        pthread_cond_wait(&c->claim_ended, &c->lock);
    if (k) {
        c->stats.memory_hits++;
        pthread_mutex_unlock(&c->lock);
        return k;
    }
    claim *mine = malloc(sizeof *mine);
    char *copy = mine ? strdup(key) : NULL;
    if (copy) {          /* out of memory: compile unclaimed, as without a cache */
        *mine = (claim){c->claims, copy, -1, ""};
        c->claims = mine;
        *claimed = 1;
    } else {
        free(mine);
        mine = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    const int disk = kind != AJ_CACHE_NONE && c->disk;
    if (disk)
        k = disk_lookup(ctx, c, kind, key);
    if (disk && !k && mine) {
        /* another process may be compiling it: wait for its entry (only
         * this thread touches its claim's lock fields) */
        mine->lock_fd = compile_lock(ctx, c, kind, key, mine->lock_path,
                                     sizeof mine->lock_path);
        if (mine->lock_fd >= 0)
            k = disk_lookup(ctx, c, kind, key);
    }
    pthread_mutex_lock(&c->lock);
    if (k)
        c->stats.disk_hits++;
    else
        c->stats.misses++;
    pthread_mutex_unlock(&c->lock);
    if (k) {
        memory_store(c, key, k);   /* and keep it in memory */
        if (*claimed)
            aj_cache_end_claim(c, key);
        *claimed = 0;
    }
    return k;
}

void aj_cache_end_claim(aj_kernel_cache *c, const char *key)
{
    claim *ended = NULL;
    pthread_mutex_lock(&c->lock);
    for (claim **link = &c->claims; *link; link = &(*link)->next) {
        claim *p = *link;
        if (strcmp(p->key, key) == 0) {
            *link = p->next;
            ended = p;
            break;
        }
    }
    pthread_cond_broadcast(&c->claim_ended);
    pthread_mutex_unlock(&c->lock);
    if (ended && ended->lock_fd >= 0) {
        /* the entry is stored (or the compile failed): waiters look again;
         * the file goes, so the directory keeps no lock of a finished key */
        unlink(ended->lock_path);
        close(ended->lock_fd);
    }
    if (ended) {
        free(ended->key);
        free(ended);
    }
}

/* Under the lock: the least recently used of c's (one or more) entries. */
static mem_entry *least_recent(aj_kernel_cache *c)
{
    mem_entry *oldest = &c->entries[0];
    for (size_t i = 1; i < c->count; i++)
        if (c->entries[i].used < oldest->used)
            oldest = &c->entries[i];
    return oldest;
}

/* Under the lock: a free slot of the entries, growing them up to
 * max_kernels; at the cap the least recently used entry's, whose key and
 * kernel go to *gone for the caller to release outside the lock (a cpu
 * kernel's release disposes of its JIT and code). */
static mem_entry *memory_slot(aj_kernel_cache *c, mem_entry *gone)
{
    if (c->count == c->cap && c->cap < c->max_kernels) {
        size_t cap = c->cap ? c->cap * 2 : 32;
        cap = cap < c->max_kernels ? cap : c->max_kernels;
        mem_entry *bigger = realloc(c->entries, cap * sizeof *bigger);
        if (bigger) {
            c->entries = bigger;
            c->cap = cap;
        }
    }
    if (c->count < c->cap && c->count < c->max_kernels)
        return &c->entries[c->count++];
    if (!c->count)
        return NULL;
    mem_entry *oldest = least_recent(c);
    *gone = *oldest;
    return oldest;
}

static void memory_store(aj_kernel_cache *c, const char *key, aj_kernel *k)
{
    const uint64_t h = XXH3_64bits(key, strlen(key));
    char *copy = strdup(key);
    mem_entry gone = {0};
    pthread_mutex_lock(&c->lock);
    mem_entry *e = copy && !memory_entry(c, key, h) ? memory_slot(c, &gone) : NULL;
    if (e) {
        *e = (mem_entry){copy, h, ++c->clock, aj_kernel_retain(k)};
        copy = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    free(copy);
    free(gone.key);
    aj_kernel_destroy(gone.kernel);
}

aj_status aj_cache_set_max_kernels(aj_ctx *ctx, uint64_t max_kernels)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    if (max_kernels < 1)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "aj_cache_set_max_kernels: max_kernels = 0; "
                       "keep at least 1 (AJ_CACHE_MEMORY still caches, AJ_CACHE_OFF does not)");
    aj_kernel_cache *c = aj_cache_of(ctx);
    if (!c)
        return AJ_OK;   /* AJ_CACHE_OFF: nothing is kept */
    for (;;) {   /* the least recently used beyond the cap, released outside the lock */
        mem_entry gone = {0};
        pthread_mutex_lock(&c->lock);
        c->max_kernels = max_kernels;
        if (c->count > max_kernels) {
            mem_entry *oldest = least_recent(c);
            gone = *oldest;
            *oldest = c->entries[--c->count];
        }
        pthread_mutex_unlock(&c->lock);
        if (!gone.key)
            return AJ_OK;
        free(gone.key);
        aj_kernel_destroy(gone.kernel);
    }
}

void aj_cache_store(aj_ctx *ctx, aj_kernel_cache *c, aj_cache_kind kind, const char *key,
                    aj_kernel *k)
{
    memory_store(c, key, k);
    if (kind != AJ_CACHE_NONE && c->disk)
        disk_store(ctx, c, kind, key, k);
}

const char *aj_cache_disk_dir(const aj_kernel_cache *c)
{
    return c && c->disk ? c->dir : NULL;
}
