/*
 * test_host_cache.c -- host kernels (cpu, and sim's, which call the
 * emulator) in the disk cache: object code written by one process is
 * loaded by another (this program run again with --warm DIR TARGET) and
 * computes what the float64 reference says; the key moves with the CPU
 * features code is built for (AJ_CPU_ISA) and, for sim, holds the
 * emulator's digest; a damaged entry, one that fails its checksum and one
 * whose checksum holds but whose object code does not link, is discarded
 * and rebuilt, never run.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cache_ctx.h"
#include "check.h"
#include "codegen/codegen.h"
#include "isa_mask.h"
#include "sim_harness.h"
#include "temp_dir.h"
#include "timing.h"

static const char *const spec =
    "attention forward efficient { dtype = bf16 head_dim = 64 mask = causal(top_left) }";

static const fwd_case problem = {
    .label = "bf16 d64 causal", .dtype = AJ_DTYPE_BF16, .d = 64, .dv = 64,
    .mask = "causal(top_left)", .b = 1, .hq = 2, .hkv = 2, .sq = 157, .sk = 157,
    .magnitude = 2.0, .seed = 19,
};

/* The targets whose kernels are host object code, and their devices */
static const struct {
    aj_target target;
    aj_device_kind device;
    const char *name;
} hosts[] = {{AJ_TARGET_CPU, AJ_DEVICE_CPU, "cpu"}, {AJ_TARGET_SIM, AJ_DEVICE_SIM, "sim"}};

static aj_ctx *new_ctx(const char *dir)
{
    return cache_ctx_ok(&(cache_ctx_opts){.dir = dir});
}

/* Compiles the spec for hosts[h] on ctx (timed into *ms), then runs the
 * problem against the reference; returns the kernel's IR text's vector
 * width check: 1 if the code uses 512-bit vectors. */
static int compile_and_run(aj_ctx *ctx, int h, const char *what, double *ms)
{
    aj_op *op = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), "t", &op), AJ_OK);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = hosts[h].target;
    aj_kernel *k = NULL;
    double t0 = now_ms();
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
    *ms = now_ms() - t0;
    aj_op_destroy(op);
    int wide = k && strstr(aj_kernel_code(k, NULL), "<16 x float>") != NULL;
    /* what the launch checks comes back from the bytes too (bf16 rows: 16;
     * the caches a padded kernel does not read: an element) */
    for (int t = 0; k && t < AJ_ROW_TENSORS; t++)
        CHECK_MSG(k->row_align[t] == (t < AJ_ROW_K_CACHE ? 16 : 2), "%s %s: row_align[%d] = %d",
                  hosts[h].name, what, t, k->row_align[t]);
    aj_kernel_destroy(k);

    aj_device *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, hosts[h].device, 0, &dev), AJ_OK);
    fwd_result r = fwd_run_case(ctx, dev, &problem);
    CHECK_MSG(r.status == AJ_OK && r.max_err_o <= 1 && r.max_err_lse <= 1,
              "%s %s: %s, O error %.2f, LSE error %.2f of tolerance", hosts[h].name, what,
              aj_status_str(r.status), r.max_err_o, r.max_err_lse);
    fwd_cache_clear();
    aj_device_close(dev);
    return wide;
}

/* The entry files of the cache directory; out gets the first. */
static int entries(const char *dir, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strstr(e->d_name, ".ajk") && !strstr(e->d_name, ".tmp")) {
            if (!n++ && out)
                snprintf(out, cap, "%s/%s", dir, e->d_name);
        }
    if (d)
        closedir(d);
    return n;
}

/* The second process: a disk hit, no compile, correct results. */
static int warm_child(const char *dir, int h)
{
    aj_ctx *ctx = new_ctx(dir);
    double ms = 0;
    compile_and_run(ctx, h, "warm process", &ms);
    aj_cache_stats s = cache_stats(ctx);
    CHECK_MSG(s.disk_hits == 1 && s.misses == 0 && s.corrupt_entries == 0,
              "disk hits %llu, misses %llu, corrupt %llu", (unsigned long long)s.disk_hits,
              (unsigned long long)s.misses, (unsigned long long)s.corrupt_entries);
    printf("%s warm process: compile (disk hit) %.2f ms\n", hosts[h].name, ms);
    aj_ctx_destroy(ctx);
    return check_report();
}

static void test_second_process(const char *self, const char *dir, int h)
{
    aj_ctx *ctx = new_ctx(dir);
    double ms = 0;
    compile_and_run(ctx, h, "cold", &ms);
    aj_cache_stats s = cache_stats(ctx);
    CHECK(s.disk_enabled && s.misses == 1 && s.disk_writes == 1);
    printf("%s cold process: compile %.1f ms\n", hosts[h].name, ms);
    aj_ctx_destroy(ctx);
    CHECK(entries(dir, NULL, 0) == 1);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' --warm '%s' %d", self, dir, h);
    CHECK_MSG(system(cmd) == 0, "the warm process failed: %s", cmd);
}

/* The key holds the CPU's features: code built with AVX-512 masked off is
 * another entry, and the native one is still there.  On a host without
 * AVX-512 the mask changes no feature, and the native entry serves. */
static void test_features_in_key(const char *dir)
{
    int avx512 = isa_mask_changes("avx2") > 0;   /* the host has AVX-512 to mask */
    setenv("AJ_CPU_ISA", "avx2", 1);
    aj_ctx *ctx = new_ctx(dir);
    double ms = 0;
    int wide = compile_and_run(ctx, 0, "avx2", &ms);
    aj_cache_stats s = cache_stats(ctx);
    if (avx512)
        CHECK_MSG(s.disk_hits == 0 && s.misses == 1 && s.disk_writes == 1,
                  "AJ_CPU_ISA=avx2: disk hits %llu", (unsigned long long)s.disk_hits);
    else   /* the same features, the same key */
        CHECK_MSG(s.disk_hits == 1 && s.disk_writes == 0,
                  "AJ_CPU_ISA=avx2 on a host without AVX-512: disk hits %llu, writes %llu",
                  (unsigned long long)s.disk_hits, (unsigned long long)s.disk_writes);
    CHECK_MSG(!wide, "AJ_CPU_ISA=avx2 still emits 512-bit vectors");
    CHECK(entries(dir, NULL, 0) == (avx512 ? 2 : 1));
    if (!avx512)
        printf("host without AVX-512: AJ_CPU_ISA=avx2 masks nothing and hits the native "
               "entry\n");
    aj_ctx_destroy(ctx);

    setenv("AJ_CPU_ISA", "pentium", 1);
    ctx = new_ctx(dir);
    aj_op *op = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, spec, strlen(spec), "t", &op), AJ_OK);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "AJ_CPU_ISA = 'pentium': expected native, avx512 or avx2");
    CHECK(k == NULL);
    aj_op_destroy(op);
    aj_ctx_destroy(ctx);
    unsetenv("AJ_CPU_ISA");

    ctx = new_ctx(dir);
    compile_and_run(ctx, 0, "native again", &ms);
    CHECK(cache_stats(ctx).disk_hits == 1 && cache_stats(ctx).misses == 0);
    aj_ctx_destroy(ctx);
}

static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*len);
    if (buf && fread(buf, 1, *len, f) != *len) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

static void write_file(const char *path, const unsigned char *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(buf, 1, len, f) == len);
    if (f)
        fclose(f);
}

/* Damages the object code of the single entry: a flipped byte the
 * checksum catches, or (fix_checksum) a broken ELF header under a
 * recomputed checksum, which only loading the object finds. */
static void damage_object(const char *path, int fix_checksum)
{
    size_t len = 0;
    unsigned char *buf = read_file(path, &len);
    CHECK(buf != NULL);
    if (!buf)
        return;
    unsigned char *elf = NULL;
    for (size_t i = 0; i + 4 <= len; i++)
        if (memcmp(buf + i, "\x7f" "ELF", 4) == 0)
            elf = buf + i;
    CHECK_MSG(elf != NULL, "no object code in %s", path);
    if (elf) {
        elf[1] ^= 0x20;
        elf[40] ^= 0xff;   /* e_shoff: where the section headers are */
    }
    if (fix_checksum) {
        /* "AJKC" u32 format u32 key length key u64 payload length u64 sum */
        uint32_t klen;
        memcpy(&klen, buf + 8, 4);
        size_t at = 12 + klen + 8;
        uint64_t sum = XXH3_64bits(buf + at + 8, len - at - 8);
        memcpy(buf + at, &sum, 8);
    }
    write_file(path, buf, len);
    free(buf);
}

static void test_damaged(const char *dir, int h, int fix_checksum)
{
    const char *what = fix_checksum ? "bad object, good checksum" : "bad checksum";
    char path[1024];
    CHECK(entries(dir, path, sizeof path) == 1);
    damage_object(path, fix_checksum);
    aj_ctx *ctx = new_ctx(dir);
    double ms = 0;
    compile_and_run(ctx, h, what, &ms);
    aj_cache_stats s = cache_stats(ctx);
    CHECK_MSG(s.corrupt_entries == 1 && s.disk_hits == 0 && s.misses == 1 && s.disk_writes == 1,
              "%s %s: corrupt %llu, hits %llu", hosts[h].name, what,
              (unsigned long long)s.corrupt_entries, (unsigned long long)s.disk_hits);
    aj_ctx_destroy(ctx);
    ctx = new_ctx(dir);   /* rebuilt whole */
    compile_and_run(ctx, h, what, &ms);
    CHECK_MSG(cache_stats(ctx).disk_hits == 1, "%s %s: the entry was not rewritten", hosts[h].name,
              what);
    aj_ctx_destroy(ctx);
}

/* A sim entry's key names the emulator it was built against. */
static void test_emulator_in_key(const char *dir)
{
    char path[1024];
    CHECK(entries(dir, path, sizeof path) == 1);
    size_t len = 0;
    unsigned char *buf = read_file(path, &len);
    CHECK(buf && len > 12);
    if (!buf)
        return;
    /* "AJKC" u32 format u32 key length key ... */
    uint32_t klen = 0;
    memcpy(&klen, buf + 8, 4);
    CHECK(12 + (size_t)klen <= len);
    char key[1024] = "";
    memcpy(key, buf + 12, klen < sizeof key - 1 ? klen : sizeof key - 1);
    CHECK_MSG(strncmp(key, "aj-sim-object|", 14) == 0 && strstr(key, "|emulator ") != NULL,
              "a sim entry's key: %s", key);
    free(buf);
}

/* The second process, the damage tests (from one entry) of hosts[h] */
static void test_host(const char *self, const char *dir, int h)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/*.ajk", dir);
    CHECK(system(cmd) == 0);
    test_second_process(self, dir, h);
    if (hosts[h].target == AJ_TARGET_SIM)
        test_emulator_in_key(dir);
    test_damaged(dir, h, 0);
    test_damaged(dir, h, 1);
}

int main(int argc, char **argv)
{
    unsetenv("AJ_CPU_ISA");
    if (argc == 4 && strcmp(argv[1], "--warm") == 0)
        return warm_child(argv[2], atoi(argv[3]) ? 1 : 0);
    char dir[] = "/tmp/aj_host_cache_XXXXXX";
    if (!temp_dir_make(dir))
        return 2;
    test_host(argv[0], dir, 1);
    test_host(argv[0], dir, 0);   /* leaves the native cpu entry */
    test_features_in_key(dir);
    temp_dir_remove(dir);
    return check_report();
}
