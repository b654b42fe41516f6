/*
 * bench_decode.c -- paged-KV decode on the cpu device against this
 * machine's memory bandwidth, and split-KV against no split, each
 * comparison measured interleaved in one run.
 *
 *   bench_decode [--rounds R] [--workers N]
 *
 * bandwidth  decode (Sq = 1) of batch 32, context 4096, Hq 32, Hkv 8,
 *            d 128, bf16 queries and cache, page size 16, pages shuffled:
 *            the KV bytes the call must read (B ctx Hkv (D + Dv) 2) per
 *            second, beside two baselines over as many bytes on the same
 *            threads (time_stream: memcpy, and a read-only sum), R rounds
 *            of the three; median and range of each, and of the ratios
 *            taken within a round.
 * split      batch 1, context 32768, Hq 32, Hkv 8, 2 and 1: the launch's
 *            own split count (0 in the schedule), 2, 8 and no split
 *            (splits = 1), 3R rounds; speedup = median unsplit / median
 *            split time.
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
#include "timing.h"

/* ------------------------------------------------------- the baselines */

/*
 * Two measures of this machine's memory bandwidth, each over `bytes` (the
 * decode's KV bytes, far beyond the caches) split evenly over the same
 * threads as the decode (and, below the decode, time_gather: its own
 * rows without its arithmetic):
 *
 *   copy   memcpy from one buffer to another: each byte read once and
 *          written once; reported as bytes copied per second (the issue's
 *          "memory copy bandwidth") and as traffic, twice that
 *   read   a sum of the buffer's 64-bit words, 8 independent sums (no
 *          dependency chain, so the loads stream): read-only, as the
 *          decode's KV loads are -- the like-for-like baseline
 */
typedef struct bench_job {
    /* time_stream: dst NULL to read; time_gather: d, c and the items */
    unsigned char *dst;
    const unsigned char *src;
    size_t bytes;
    const struct decode *d;
    const struct paged_case *c;
    int first, step;            /* items first, first + step, ... */
    int ahead;                  /* rows prefetched ahead; 0: none */
    uint64_t sum;               /* what a read summed: kept so its loads are live */
} bench_job;

static volatile uint64_t stream_sink;   /* the sums go here */

/* Seconds for `threads` threads to run part on jobs[0 .. threads). */
static double time_jobs(void *(*part)(void *), bench_job *jobs, int threads)
{
    pthread_t tid[64];
    double t0 = now_s();
    for (int i = 0; i < threads; i++)
        pthread_create(&tid[i], NULL, part, &jobs[i]);
    for (int i = 0; i < threads; i++)
        pthread_join(tid[i], NULL);
    double t = now_s() - t0;
    for (int i = 0; i < threads; i++)
        stream_sink ^= jobs[i].sum;
    return t;
}

static void *stream_part(void *arg)
{
    bench_job *j = arg;
    if (j->dst) {
        memcpy(j->dst, j->src, j->bytes);
        return NULL;
    }
    const uint64_t *w = (const uint64_t *)j->src;
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= j->bytes / 8; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += w[i + k];
    j->sum = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    return NULL;
}

/* Seconds to copy (dst set) or read (dst NULL) `bytes` of src on
 * `threads` threads, each a contiguous share (a multiple of 64 bytes). */
static double time_stream(unsigned char *dst, const unsigned char *src, size_t bytes,
                          int threads)
{
    bench_job jobs[64];
    size_t part = bytes / (size_t)threads / 64 * 64;
    for (int i = 0; i < threads; i++)
        jobs[i] = (bench_job){.dst = dst ? dst + i * part : NULL, .src = src + i * part,
                              .bytes = i == threads - 1 ? bytes - i * part : part};
    return time_jobs(stream_part, jobs, threads);
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
        a.q = tensor_contiguous(d->mem[0], c->dtype, 4, qs);
        a.k_cache = tensor_contiguous(d->mem[1], c->kv_dtype, 4, ks);
        a.v_cache = tensor_contiguous(d->mem[2], c->kv_dtype, 4, ks);
        a.o = tensor_contiguous(d->mem[3], c->dtype, 4, qs);
        a.lse = tensor_contiguous(d->mem[4], AJ_DTYPE_F32, 3, qs);
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
    double t0 = now_s();
    aj_status st = aj_forward(ctx, dev, d->kernel, &d->args);
    if (st == AJ_OK)
        st = aj_device_synchronize(dev, NULL);
    double t = now_s() - t0;
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

/*
 * The decode's own reads without its arithmetic: the K and V rows of
 * every (sequence, KV head) through the block table, 64-bit sums as in
 * stream_part, items dealt to the threads in turn; plain loads, or each
 * row's lines prefetched `ahead` rows early (as the kernel does, a key
 * block of 64 ahead).  What this access pattern (a KV head's D elements
 * every Hkv D of a page, pages scattered) gives: the ceiling a decode
 * over this cache layout meets before any arithmetic.
 *
 * And the same bytes in another order (page_major): an item per sequence
 * reads each page whole, K then V, a KV head's rows after another, the
 * next page's lines prefetched to L2 meanwhile -- what a kernel that
 * takes every KV head of a sequence in one item could read at.
 */
/* The words of K (kv 0) or V (kv 1) row p of item (b, h). */
static const uint64_t *gather_row(const bench_job *j, int kv, int b, int h, int p)
{
    const paged_case *c = j->c;
    const int32_t *table = j->d->mem[5];
    size_t row_words = (size_t)c->d * 2 / 8, page_rows = (size_t)c->page_size * c->hkv;
    size_t page = (size_t)table[(size_t)b * j->d->args.max_pages + p / c->page_size];
    const uint64_t *cache = j->d->mem[1 + kv];
    return cache + (page * page_rows + (size_t)(p % c->page_size) * c->hkv + h) * row_words;
}

static void *gather_part(void *arg)
{
    bench_job *j = arg;
    const paged_case *c = j->c;
    size_t row_words = (size_t)c->d * 2 / 8;
    uint64_t s[8] = {0};
    for (int item = j->first; item < c->b * c->hkv; item += j->step) {
        int b = item / c->hkv, h = item % c->hkv;
        for (int p = 0; p < c->seqlens[b]; p++)
            for (int kv = 0; kv < 2; kv++) {
                if (j->ahead && p + j->ahead < c->seqlens[b]) {
                    const uint64_t *next = gather_row(j, kv, b, h, p + j->ahead);
                    for (size_t i = 0; i < row_words; i += 8)
                        __builtin_prefetch(next + i);
                }
                const uint64_t *w = gather_row(j, kv, b, h, p);
                for (size_t i = 0; i < row_words; i += 8)
                    for (int k = 0; k < 8; k++)
                        s[k] += w[i + k];
            }
    }
    j->sum = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    return NULL;
}

static void *page_major_part(void *arg)
{
    bench_job *j = arg;
    const paged_case *c = j->c;
    const int32_t *table = j->d->mem[5];
    size_t row_words = (size_t)c->d * 2 / 8;
    size_t page_words = row_words * (size_t)c->hkv * (size_t)c->page_size;
    uint64_t s[8] = {0};
    for (int b = j->first; b < c->b; b += j->step) {
        const int32_t *pages = table + (size_t)b * j->d->args.max_pages;
        int n = (c->seqlens[b] + c->page_size - 1) / c->page_size;
        for (int p = 0; p < n; p++)
            for (int kv = 0; kv < 2; kv++) {
                const uint64_t *cache = j->d->mem[1 + kv];
                if (p + 1 < n) {
                    const uint64_t *next = cache + (size_t)pages[p + 1] * page_words;
                    for (size_t i = 0; i < page_words; i += 8)
                        __builtin_prefetch(next + i, 0, 2);
                }
                const uint64_t *page = cache + (size_t)pages[p] * page_words;
                for (int h = 0; h < c->hkv; h++)
                    for (int t = 0; t < c->page_size; t++) {
                        const uint64_t *w = page + ((size_t)t * c->hkv + h) * row_words;
                        for (size_t i = 0; i < row_words; i += 8)
                            for (int k = 0; k < 8; k++)
                                s[k] += w[i + k];
                    }
            }
    }
    j->sum = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    return NULL;
}

/* ahead < 0: page_major */
static double time_gather(const decode *d, const paged_case *c, int threads, int ahead)
{
    bench_job jobs[64];
    for (int i = 0; i < threads; i++)
        jobs[i] = (bench_job){.d = d, .c = c, .first = i, .step = threads, .ahead = ahead};
    return time_jobs(ahead < 0 ? page_major_part : gather_part, jobs, threads);
}

static void decode_free(aj_device *dev, decode *d)
{
    for (int i = 0; i < 7; i++)
        aj_device_free(dev, d->mem[i]);
    aj_kernel_destroy(d->kernel);
}

/* Hq 32, Hkv hkv, d 128, bf16, page 16, decode */
static paged_case decode_case(int b, const int32_t *lens, int hkv, int splits)
{
    paged_case c = paged_base(AJ_DTYPE_BF16, AJ_DTYPE_BF16, 128, lens, b);
    c.hq = 32;
    c.hkv = hkv;
    c.splits = splits;
    return c;
}

/* Median, least and greatest of n values (sorted in place). */
typedef struct spread {
    double med, lo, hi;
} spread;

static spread spread_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    return (spread){med, v[0], v[n - 1]};
}

/* GB/s of `bytes` over each of n times (seconds), then their spread */
static spread rate_spread(const double *t, int n, double bytes)
{
    double r[64];
    for (int i = 0; i < n; i++)
        r[i] = bytes / t[i] / 1e9;
    return spread_of(r, n);
}

#define MAX_ROUNDS 64

/*
 * Bandwidth: rounds of (copy, read, decode), the three back to back, so
 * that each round's ratios compare measures taken within ~0.1 s of each
 * other on this shared machine; the median and range over rounds.
 */
static int bench_bandwidth(aj_ctx *ctx, aj_device *dev, int threads, int rounds)
{
    int32_t lens[32];
    for (int b = 0; b < 32; b++)
        lens[b] = 4096;
    paged_case c = decode_case(32, lens, 8, 0);
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
    time_stream(dst, src, d.kv_bytes, threads);
    time_stream(NULL, src, d.kv_bytes, threads);
    time_gather(&d, &c, threads, 64);
    double tc[MAX_ROUNDS], tr[MAX_ROUNDS], tg[3][MAX_ROUNDS], tk[MAX_ROUNDS],
        vs_copy[MAX_ROUNDS], vs_read[MAX_ROUNDS], vs_gather[3][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
        tc[r] = time_stream(dst, src, d.kv_bytes, threads);
        tr[r] = time_stream(NULL, src, d.kv_bytes, threads);
        tg[0][r] = time_gather(&d, &c, threads, 0);
        tg[1][r] = time_gather(&d, &c, threads, 64);
        tg[2][r] = time_gather(&d, &c, threads, -1);
        tk[r] = time_decode(ctx, dev, &d);
        vs_copy[r] = tc[r] / tk[r];   /* (KV bytes / tk) / (copied bytes / tc) */
        vs_read[r] = tr[r] / tk[r];
        vs_gather[0][r] = tg[0][r] / tk[r];
        vs_gather[1][r] = tg[1][r] / tk[r];
        vs_gather[2][r] = tg[2][r] / tk[r];
    }
    double bytes = (double)d.kv_bytes;
    spread copy = rate_spread(tc, rounds, bytes), read = rate_spread(tr, rounds, bytes);
    spread dec = rate_spread(tk, rounds, bytes);
    spread rc = spread_of(vs_copy, rounds), rr = spread_of(vs_read, rounds);
    printf("decode B 32, ctx 4096, Hq 32, Hkv 8, d 128, bf16, page 16, %d threads, "
           "%d rounds of (copy, read, rows in three orders, decode); %.0f MB each; GB/s median [min, max]\n",
           threads, rounds, bytes / 1e6);
    printf("| measure | GB/s | decode / it, same round |\n|---|---:|---:|\n");
    printf("| decode: KV bytes read | %.2f [%.2f, %.2f] | |\n", dec.med, dec.lo, dec.hi);
    printf("| memcpy: bytes copied (the goal's baseline) | %.2f [%.2f, %.2f] | "
           "%.2f [%.2f, %.2f] |\n", copy.med, copy.lo, copy.hi, rc.med, rc.lo, rc.hi);
    printf("| memcpy: traffic, read + write | %.2f [%.2f, %.2f] | |\n", 2 * copy.med,
           2 * copy.lo, 2 * copy.hi);
    printf("| read-only sum | %.2f [%.2f, %.2f] | %.2f [%.2f, %.2f] |\n", read.med, read.lo,
           read.hi, rr.med, rr.lo, rr.hi);
    static const char *const orders[3] = {
        "plain loads", "prefetched 64 rows ahead",
        "page by page, every KV head (next page to L2)"};
    for (int g = 0; g < 3; g++) {
        spread rate = rate_spread(tg[g], rounds, bytes), ratio = spread_of(vs_gather[g], rounds);
        printf("| the decode's rows, %s | %.2f [%.2f, %.2f] | %.2f [%.2f, %.2f] |\n",
               orders[g], rate.med, rate.lo, rate.hi,
               ratio.med, ratio.lo, ratio.hi);
    }
    decode_free(dev, &d);
    free(src);
    free(dst);
    return 0;
}

/*
 * Split-KV at batch 1, context 32768, per Hkv: the launch's choice and
 * fixed counts against splits = 1, in rounds (every count once a round),
 * each call after a 64 MB read (twice the L3) so that no call finds the
 * KV in cache; speedup = median unsplit / median split time.  A call
 * takes 2-12 ms, where this shared machine's hiccups show: three times
 * the bandwidth's rounds (at most MAX_ROUNDS).
 */
static int bench_split(aj_ctx *ctx, aj_device *dev, int threads, int rounds, int hkv)
{
    enum { NS = 4 };
    const int splits[NS] = {0, 2, 8, 1};
    int32_t lens[1] = {32768};
    decode ds[NS];
    for (int i = 0; i < NS; i++) {
        paged_case s = decode_case(1, lens, hkv, splits[i]);
        if (decode_setup(ctx, dev, &s, &ds[i]) != AJ_OK) {
            fprintf(stderr, "bench_decode: %s\n", aj_last_error(ctx));
            return 1;
        }
        time_decode(ctx, dev, &ds[i]);
    }
    size_t evict_bytes = (size_t)64 << 20;
    unsigned char *evict = malloc(evict_bytes);
    if (!evict)
        return 1;
    memset(evict, 1, evict_bytes);
    double t[NS][MAX_ROUNDS];
    rounds = 3 * rounds < MAX_ROUNDS ? 3 * rounds : MAX_ROUNDS;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < NS; i++) {
            time_stream(NULL, evict, evict_bytes, threads);
            t[i][r] = time_decode(ctx, dev, &ds[i]);
        }
    spread sp[NS];
    for (int i = 0; i < NS; i++)
        sp[i] = spread_of(t[i], rounds);
    printf("\nsplit-KV: B 1, ctx 32768, Hq 32, Hkv %d, d 128, bf16, page 16, %d threads, "
           "%d rounds\n", hkv, threads, rounds);
    printf("| splits | ms median [min, max] | KV GB/s | speedup over splits = 1 |\n"
           "|---|---:|---:|---:|\n");
    for (int i = 0; i < NS; i++) {
        char name[32];
        if (splits[i])
            snprintf(name, sizeof name, "%d", splits[i]);
        else
            snprintf(name, sizeof name, "launch's choice");
        printf("| %s | %.2f [%.2f, %.2f] | %.2f | %.2f |\n", name, sp[i].med * 1e3,
               sp[i].lo * 1e3, sp[i].hi * 1e3, (double)ds[i].kv_bytes / sp[i].med / 1e9,
               sp[NS - 1].med / sp[i].med);
    }
    for (int i = 0; i < NS; i++)
        decode_free(dev, &ds[i]);
    free(evict);
    return 0;
}

int main(int argc, char **argv)
{
    int rounds = 9, workers = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--workers") == 0)
            workers = atoi(argv[i + 1]);
    }
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "bench_decode: --rounds must be 1..%d\n", MAX_ROUNDS);
        return 2;
    }
    aj_ctx *ctx = NULL;
    aj_device *dev = NULL;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK || aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev) != AJ_OK)
        return 1;
    aj_device_set_workers(dev, workers);
    int threads = workers > 0 ? workers : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1 || threads > 64) {
        fprintf(stderr, "bench_decode: %d threads: the baselines run 1..64\n", threads);
        return 2;
    }
    int rc = bench_bandwidth(ctx, dev, threads, rounds);
    const int hkvs[3] = {8, 2, 1};
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = bench_split(ctx, dev, threads, rounds, hkvs[i]);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return rc;
}
