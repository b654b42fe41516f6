/*
 * bench_decode.c -- paged-KV decode on the cpu device against this
 * machine's memory bandwidth, and split-KV against no split, each pair
 * measured interleaved in one run.
 *
 *   bench_decode [--repeat R] [--workers N]
 *
 * bandwidth  decode (Sq = 1) of batch 32, context 4096, Hq 32, Hkv 8,
 *            d 128, bf16 queries and cache, page size 16, pages shuffled:
 *            the KV bytes the call must read (B ctx Hkv (D + Dv) 2) per
 *            second, best of R, beside memcpy of a buffer as large split
 *            over the same threads (bytes copied per second: each byte
 *            read once and written once), best of R, the two alternating.
 * split      batch 1, context 32768, the same heads: the launch's own
 *            split count (0 in the schedule), a fixed 8, and no split
 *            (splits = 1), alternating; speedup = unsplit / split time.
 *
 * Correctness is test_cpu_paged's; here the outputs are only checked to
 * be finite.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "paged_cases.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- memcpy */

typedef struct copy_job {
    unsigned char *dst;
    const unsigned char *src;
    size_t bytes;
} copy_job;

static void *copy_part(void *arg)
{
    copy_job *j = arg;
    memcpy(j->dst, j->src, j->bytes);
    return NULL;
}

/* Seconds to copy `bytes` from src to dst on `threads` threads. */
static double time_memcpy(unsigned char *dst, const unsigned char *src, size_t bytes,
                          int threads)
{
    pthread_t tid[64];
    copy_job jobs[64];
    size_t part = bytes / (size_t)threads;
    double t0 = now();
    for (int i = 0; i < threads; i++) {
        jobs[i] = (copy_job){dst + i * part, src + i * part,
                             i == threads - 1 ? bytes - i * part : part};
        pthread_create(&tid[i], NULL, copy_part, &jobs[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(tid[i], NULL);
    return now() - t0;
}

/* ---------------------------------------------------------------- decode */

/* One paged problem in device memory, its kernel and arguments. */
typedef struct decode {
    aj_kernel *kernel;
    aj_fwd_args args;
    void *mem[7];
    size_t kv_bytes;
} decode;

static aj_status decode_setup(aj_ctx *ctx, aj_device *dev, paged_case *c, decode *d)
{
    memset(d, 0, sizeof *d);
    uint64_t seed = 11;
    int max_pages = 0, num_pages = 0;
    int32_t *table = paged_table(c, &seed, &max_pages, &num_pages);
    if (!table)
        return AJ_ERR_OUT_OF_MEMORY;
    size_t rows = (size_t)num_pages * c->page_size * c->hkv;
    size_t nq = (size_t)c->b * c->hq * c->sq * c->d;
    const size_t bytes[7] = {nq * 2, rows * c->d * 2, rows * c->d * 2, nq * 2,
                             (size_t)c->b * c->hq * c->sq * 4, (size_t)c->b * max_pages * 4,
                             (size_t)c->b * 4};
    aj_status st = paged_compile(ctx, dev, c, &d->kernel);
    for (int i = 0; i < 7 && st == AJ_OK; i++)
        st = aj_device_alloc(dev, bytes[i] + 64, &d->mem[i]);
    /* small random values: bf16 bits 0x3c00 +- noise, signs mixed */
    for (int i = 0; i < 3 && st == AJ_OK; i++) {
        uint16_t *h = d->mem[i];
        for (size_t e = 0; e < bytes[i] / 2; e++)
            h[e] = (uint16_t)(0x3c00 + (paged_rand(&seed) & 0x3ff)) | (e & 1 ? 0x8000 : 0);
    }
    if (st == AJ_OK) {
        memcpy(d->mem[5], table, bytes[5]);
        memcpy(d->mem[6], c->seqlens, bytes[6]);
        const int64_t qs[4] = {c->b, c->hq, c->sq, c->d};
        const int64_t ks[4] = {num_pages, c->page_size, c->hkv, c->d};
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.q = paged_tensor(d->mem[0], c->dtype, 4, qs);
        a.k_cache = paged_tensor(d->mem[1], c->kv_dtype, 4, ks);
        a.v_cache = paged_tensor(d->mem[2], c->kv_dtype, 4, ks);
        a.o = paged_tensor(d->mem[3], c->dtype, 4, qs);
        a.lse = paged_tensor(d->mem[4], AJ_DTYPE_F32, 3, qs);
        a.block_table = d->mem[5];
        a.max_pages = max_pages;
        a.seqlens_k = d->mem[6];
        d->args = a;
    }
    for (int b = 0; b < c->b; b++)
        d->kv_bytes += (size_t)c->seqlens[b] * c->hkv * c->d * 2 * 2;
    free(table);
    return st;
}

static double time_decode(aj_ctx *ctx, aj_device *dev, decode *d)
{
    double t0 = now();
    aj_status st = aj_forward(ctx, dev, d->kernel, &d->args);
    if (st == AJ_OK)
        st = aj_device_synchronize(dev, NULL);
    double t = now() - t0;
    if (st != AJ_OK) {
        fprintf(stderr, "bench_decode: %s\n", aj_last_error(ctx));
        exit(1);
    }
    float lse0 = ((float *)d->mem[4])[0];
    if (!isfinite(lse0)) {
        fprintf(stderr, "bench_decode: lse[0] = %g is not finite\n", lse0);
        exit(1);
    }
    return t;
}

static void decode_free(aj_device *dev, decode *d)
{
    for (int i = 0; i < 7; i++)
        aj_device_free(dev, d->mem[i]);
    aj_kernel_destroy(d->kernel);
}

/* Hq 32, Hkv 8, d 128, bf16, page 16, decode */
static paged_case decode_case(int b, const int32_t *lens, int splits)
{
    paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 128, lens, b);
    c.hq = 32;
    c.hkv = 8;
    c.splits = splits;
    return c;
}

int main(int argc, char **argv)
{
    int repeat = 5, workers = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--repeat") == 0)
            repeat = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--workers") == 0)
            workers = atoi(argv[i + 1]);
    }
    aj_ctx *ctx = NULL;
    aj_device *dev = NULL;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK || aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev) != AJ_OK)
        return 1;
    aj_device_set_workers(dev, workers);
    int threads = workers > 0 ? workers : (int)sysconf(_SC_NPROCESSORS_ONLN);

    /* bandwidth: batch 32 x 4096 */
    int32_t lens32[32];
    for (int b = 0; b < 32; b++)
        lens32[b] = 4096;
    paged_case c = decode_case(32, lens32, 0);
    decode d;
    if (decode_setup(ctx, dev, &c, &d) != AJ_OK) {
        fprintf(stderr, "bench_decode: %s\n", aj_last_error(ctx));
        return 1;
    }
    unsigned char *src = malloc(d.kv_bytes), *dst = malloc(d.kv_bytes);
    if (!src || !dst)
        return 1;
    memset(src, 1, d.kv_bytes);
    memset(dst, 2, d.kv_bytes);
    time_decode(ctx, dev, &d);                 /* warm-up: pages, threads */
    time_memcpy(dst, src, d.kv_bytes, threads);
    double best_k = INFINITY, best_m = INFINITY;
    for (int r = 0; r < repeat; r++) {
        best_m = fmin(best_m, time_memcpy(dst, src, d.kv_bytes, threads));
        best_k = fmin(best_k, time_decode(ctx, dev, &d));
    }
    double kv_gbs = (double)d.kv_bytes / best_k / 1e9, mc_gbs = (double)d.kv_bytes / best_m / 1e9;
    printf("decode B 32, ctx 4096, Hq 32, Hkv 8, d 128, bf16, page 16, %d threads, best of %d\n",
           threads, repeat);
    printf("| KV bytes | decode (ms) | KV GB/s | memcpy (ms) | memcpy GB/s | decode / memcpy |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    printf("| %.0f MB | %.1f | %.2f | %.1f | %.2f | %.2f |\n", (double)d.kv_bytes / 1e6,
           best_k * 1e3, kv_gbs, best_m * 1e3, mc_gbs, kv_gbs / mc_gbs);
    decode_free(dev, &d);
    free(src);
    free(dst);

    /* split-KV: batch 1 x 32768 */
    int32_t lens1[1] = {32768};
    const int splits[3] = {0, 8, 1};
    decode ds[3];
    for (int i = 0; i < 3; i++) {
        paged_case s = decode_case(1, lens1, splits[i]);
        if (decode_setup(ctx, dev, &s, &ds[i]) != AJ_OK) {
            fprintf(stderr, "bench_decode: %s\n", aj_last_error(ctx));
            return 1;
        }
        time_decode(ctx, dev, &ds[i]);
    }
    double best[3] = {INFINITY, INFINITY, INFINITY};
    for (int r = 0; r < repeat; r++)
        for (int i = 0; i < 3; i++)
            best[i] = fmin(best[i], time_decode(ctx, dev, &ds[i]));
    printf("\nsplit-KV: B 1, ctx 32768, Hq 32, Hkv 8, d 128, bf16, page 16, %d threads\n",
           threads);
    printf("| splits | time (ms) | KV GB/s | speedup over splits = 1 |\n|---|---:|---:|---:|\n");
    for (int i = 0; i < 3; i++)
        printf("| %s | %.2f | %.2f | %.2f |\n", splits[i] == 0 ? "launch's choice" :
               splits[i] == 8 ? "8" : "1", best[i] * 1e3,
               (double)ds[i].kv_bytes / best[i] / 1e9, best[2] / best[i]);
    for (int i = 0; i < 3; i++)
        decode_free(dev, &ds[i]);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return 0;
}
