/*
 * bench_cpu.c -- how fast the cpu target's kernels run, against this
 * machine's own fp32 FMA peak and a plain C loop, measured in one run.
 *
 *   bench_cpu [--quick | --full] [--workers N] [--dtype f16|bf16|f32]
 *             [--heads H] [--repeat R] [--csv FILE] [--dims D,D,...]
 *   bench_cpu --jit [-O 0..3] [--seq S] [--compiles N] [...]
 *   bench_cpu --dtypes [--heads H] [--repeat R] [--workers N]
 *
 * Per problem (B 1, H heads, Sq = Sk = S, d = Dv, causal or not): the
 * best of R forward launches after one warm-up, then the same for the
 * backward (dO = Q's values), as GFLOP/s by FlashAttention's count
 * (forward 4 B H S^2 d, halved for causal; backward 2.5 times that), the
 * fraction of the measured peak, and the forward's speedup over the plain
 * C loop.
 *
 * peak      every worker thread runs independent chains of vector FMAs
 *           (enough to cover the FMA latency on every port) for about
 *           0.1 s; the sum of their FLOPs over the wall time, the best of
 *           three, measured again beside every row, because a shared
 *           machine's throughput moves from minute to minute (best-of on
 *           both sides compares the kernel with the peak at like load).
 *           Vector width from the host (AVX-512, AVX2 + FMA, else SSE
 *           mul + add).
 * baseline  the obvious C: per query row, scores, max, exp, sum, O; one
 *           thread, f32, on a sample of rows spread over the sequence
 *           (every row's FLOPs counted exactly), so the big sizes stay
 *           short.  It is what a user without attnjit writes first.
 *
 * --quick (the default): S 512, 1024, 2048.  --full: S 512 .. 8192.
 * --dims: the head dims (default 64,128; up to 8 of them, each 8..512).
 *
 * --jit: what a kernel costs to make and what it then runs at, per pass
 * and head dim (64, 128, 256; causal and not) at one S (default 2048):
 * the median of N cold compiles (cache bypassed; default 5), at the opt
 * level -O (default 2), and the best of R launches.  Two builds or two
 * levels are compared by running this twice, interleaved.
 *
 * --dtypes: the forward in f32 against bf16 (d 64, 128; S 1024 .. 4096),
 * see bench_dtypes.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnjit/attnjit.h"
#include "bench_common.h"
#include "launch_args.h"
#include "spec_compile.h"
#include "timing.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HAVE_X86 1
#endif

/* ---------------------------------------------------------------- peak */

/* 12 independent accumulators (2 FMA ports x latency 4..6 cycles), named
 * one by one so that they live in registers, not in an array in memory. */
#define PEAK_ITERS 4096
#define CHAINS 12
#define CHAIN_STEP(OP) \
    a0 = OP(a0); a1 = OP(a1); a2 = OP(a2); a3 = OP(a3); a4 = OP(a4); a5 = OP(a5); \
    a6 = OP(a6); a7 = OP(a7); a8 = OP(a8); a9 = OP(a9); a10 = OP(a10); a11 = OP(a11)
#define CHAIN_SUM(T, SET, ADD)                                                  \
    T a0 = SET(0.f), a1 = SET(1.f), a2 = SET(2.f), a3 = SET(3.f), a4 = SET(4.f), \
      a5 = SET(5.f), a6 = SET(6.f), a7 = SET(7.f), a8 = SET(8.f), a9 = SET(9.f), \
      a10 = SET(10.f), a11 = SET(11.f)
/* A peak loop over vectors T of LANES floats: reps x PEAK_ITERS steps of
 * OP (of a chain, x and y) on every chain, then the chains' sum (which
 * only keeps the compiler from dropping them). */
#define PEAK_LOOP(NAME, TARGET, T, LANES, SET, ADD, STORE, OP)                        \
    TARGET static double NAME(int64_t reps)                                           \
    {                                                                                 \
        T x = SET(0.999999f), y = SET(1e-7f);                                         \
        CHAIN_SUM(T, SET, ADD);                                                       \
        for (int64_t r = 0; r < reps * PEAK_ITERS; r++) {                             \
            CHAIN_STEP(OP);                                                           \
        }                                                                             \
        T t = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7)));       \
        t = ADD(t, ADD(ADD(a8, a9), ADD(a10, a11)));                                  \
        float out[LANES];                                                             \
        STORE(out, t);                                                                \
        return out[0];                                                                \
    }

#ifdef HAVE_X86
#define OP512(a) _mm512_fmadd_ps(a, x, y)
PEAK_LOOP(fma_loop_avx512, __attribute__((target("avx512f"))), __m512, 16, _mm512_set1_ps,
          _mm512_add_ps, _mm512_storeu_ps, OP512)
#define OP256(a) _mm256_fmadd_ps(a, x, y)
PEAK_LOOP(fma_loop_avx2, __attribute__((target("avx2,fma"))), __m256, 8, _mm256_set1_ps,
          _mm256_add_ps, _mm256_storeu_ps, OP256)
#define OP128(a) _mm_add_ps(_mm_mul_ps(a, x), y)
PEAK_LOOP(mul_add_loop_sse, , __m128, 4, _mm_set1_ps, _mm_add_ps, _mm_storeu_ps, OP128)
#endif

typedef struct peak_kernel {
    const char *name;
    int floats;                  /* lanes per instruction */
    double (*loop)(int64_t reps);
} peak_kernel;

static peak_kernel pick_peak_kernel(void)
{
#ifdef HAVE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return (peak_kernel){"AVX-512 FMA", 16, fma_loop_avx512};
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return (peak_kernel){"AVX2 FMA", 8, fma_loop_avx2};
    return (peak_kernel){"SSE mul+add", 4, mul_add_loop_sse};
#else
    return (peak_kernel){NULL, 0, NULL};
#endif
}

typedef struct peak_job {
    peak_kernel k;
    int64_t reps;
    double sink;
} peak_job;

static void *peak_thread(void *arg)
{
    peak_job *j = arg;
    j->sink = j->k.loop(j->reps);
    return NULL;
}

/* FLOP/s of `threads` threads each running the FMA loop at once, the
 * best of three runs of about 0.1 s. */
static double measure_peak(peak_kernel k, int threads)
{
    /* an FMA is 2 FLOPs on each lane; SSE's mul + add is 2 instructions */
    double flops_per_rep = 2.0 * k.floats * CHAINS * PEAK_ITERS;
    int64_t reps = 16;
    double t = 0, best = 0;
    for (int run = 0; run < 3;) {   /* grow until a run takes 0.1 s, then 3 of them */
        peak_job jobs[256];
        pthread_t tid[256];
        double t0 = now_s();
        for (int i = 0; i < threads; i++) {
            jobs[i] = (peak_job){k, reps, 0};
            pthread_create(&tid[i], NULL, peak_thread, &jobs[i]);
        }
        for (int i = 0; i < threads; i++)
            pthread_join(tid[i], NULL);
        t = now_s() - t0;
        if (t < 0.1) {
            reps *= 2;
            continue;
        }
        double rate = flops_per_rep * (double)reps * threads / t;
        best = rate > best ? rate : best;
        run++;
    }
    return best;
}

/* ---------------------------------------------------------------- baseline */

/* Plain C attention for query rows i = 0, stride, 2 stride, ... of one
 * head (f32, [S, d] rows); returns the FLOPs it did by the FlashAttention
 * count (4 d per visible key). */
static double baseline_rows(const float *q, const float *k, const float *v, float *o, int s,
                            int d, int causal, int stride)
{
    float *p = malloc((size_t)s * sizeof *p);
    double flops = 0;
    float scale = 1.0f / sqrtf((float)d);
    for (int i = 0; i < s; i += stride) {
        int keys = causal ? i + 1 : s;
        float mx = -INFINITY;
        for (int j = 0; j < keys; j++) {
            float acc = 0;
            for (int x = 0; x < d; x++)
                acc += q[(size_t)i * d + x] * k[(size_t)j * d + x];
            p[j] = acc * scale;
            mx = p[j] > mx ? p[j] : mx;
        }
        float sum = 0;
        for (int j = 0; j < keys; j++) {
            p[j] = expf(p[j] - mx);
            sum += p[j];
        }
        for (int x = 0; x < d; x++) {
            float acc = 0;
            for (int j = 0; j < keys; j++)
                acc += p[j] * v[(size_t)j * d + x];
            o[(size_t)i * d + x] = acc / sum;
        }
        flops += 4.0 * d * keys;
    }
    free(p);
    return flops;
}

/* ---------------------------------------------------------------- forward */

typedef struct config {
    aj_dtype dtype;
    int heads, repeat, workers, full;
    const char *csv;
    int jit, opt_level, compiles, seq;   /* --jit mode */
    int dtypes;                          /* --dtypes mode */
} config;

static aj_status compile_once(aj_ctx *ctx, const config *cfg, const char *kind, int d,
                              int causal, aj_kernel **out)
{
    aj_dtype dtype = cfg->dtype;
    char spec[256];
    snprintf(spec, sizeof spec, "attention %s flash { dtype = %s head_dim = %d mask = %s }",
             kind, aj_dtype_name(dtype), d, causal ? "causal(top_left)" : "none");
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    opt.emit = AJ_EMIT_LLVM_IR;
    opt.opt_level = cfg->opt_level;
    opt.bypass_cache = cfg->jit;
    return spec_compile(ctx, spec, "bench", &opt, out);
}

/* Compiles the pass; with cfg->jit, cfg->compiles times afresh, *ms the
 * median (the last kernel kept). */
static aj_status compile_op(aj_ctx *ctx, const config *cfg, const char *kind, int d, int causal,
                            aj_kernel **out, double *ms)
{
    int n = cfg->jit ? cfg->compiles : 1;
    double times[64];
    aj_status st = AJ_OK;
    *out = NULL;
    for (int i = 0; i < n && st == AJ_OK; i++) {
        aj_kernel_destroy(*out);
        *out = NULL;
        double t0 = now_s();
        st = compile_once(ctx, cfg, kind, d, causal, out);
        times[i] = (now_s() - t0) * 1e3;
    }
    for (int i = 1; i < n; i++)   /* insertion sort: n is small */
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            double t = times[j];
            times[j] = times[j - 1];
            times[j - 1] = t;
        }
    *ms = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    return st;
}

static aj_tensor tensor(void *data, aj_dtype dtype, int h, int s, int d)
{
    return (aj_tensor){data, dtype, 4, {1, h, s, d}, {(int64_t)h * s * d, (int64_t)s * d, d, 1}};
}

/* One table row: the best of `reps` times against the peak measured
 * now; baseline GFLOP/s if known (else 0). */
static void print_row(const config *cfg, FILE *csv, const char *pass, int s, int d, int causal,
                      double flops, double t, double peak, double bgflops)
{
    double gflops = flops / t / 1e9;
    char base[32] = "—", speedup[32] = "—";
    if (bgflops > 0) {
        snprintf(base, sizeof base, "%.2f", bgflops);
        snprintf(speedup, sizeof speedup, "%.1fx", gflops / bgflops);
    }
    printf("| %-8s | %5d | %3d | %-6s | %9.2f | %8.1f | %8.1f | %5.1f%% | %8s | %7s |\n", pass,
           s, d, causal ? "causal" : "none", t * 1e3, gflops, peak / 1e9,
           100.0 * gflops * 1e9 / peak, base, speedup);
    fflush(stdout);
    if (csv)
        fprintf(csv, "%s,%s,%d,%d,%d,%s,%.4f,%.3f,%.3f,%.4f,%.3f\n", pass,
                aj_dtype_name(cfg->dtype), cfg->heads, s, d, causal ? "causal" : "none",
                t * 1e3, gflops, peak / 1e9, gflops * 1e9 / peak, bgflops);
}

/* The best of `reps` runs of a pass (after a warm-up); < 0 on failure. */
static double time_pass(aj_ctx *ctx, aj_device *dev, const aj_kernel *k, const aj_fwd_args *fa,
                        const aj_bwd_args *ba, int reps)
{
    double best = -1;
    for (int r = 0; r <= reps; r++) {
        double t0 = now_s();
        aj_status st = fa ? aj_forward(ctx, dev, k, fa) : aj_backward(ctx, dev, k, ba);
        double t = now_s() - t0;
        if (st != AJ_OK) {
            fprintf(stderr, "bench_cpu: %s: %s\n", fa ? "forward" : "backward",
                    aj_last_error(ctx));
            return -1;
        }
        if (r > 0 && (best < 0 || t < best))
            best = t;
    }
    return best;
}

/* One problem's tensors on the device: Q, K, V random in [-1, 1] (the f32
 * values kept for the baseline), O, LSE, and dQ, dK, dV for the backward. */
typedef struct problem {
    aj_device *dev;
    float *qf, *kf, *vf, *of;
    void *q, *k, *v, *o, *lse, *dq, *dk, *dv;
    aj_fwd_args fwd;
    aj_bwd_args bwd;   /* dO = Q's values; the forward's O and LSE */
} problem;

static void problem_init(problem *pr, aj_device *dev, aj_dtype dtype, int h, int s, int d)
{
    memset(pr, 0, sizeof *pr);
    pr->dev = dev;
    size_t n = (size_t)h * s * d, esize = dtype == AJ_DTYPE_F32 ? 4 : 2;
    pr->qf = malloc(n * 4);
    pr->kf = malloc(n * 4);
    pr->vf = malloc(n * 4);
    pr->of = malloc(n * 4);
    void **bufs[7] = {&pr->q, &pr->k, &pr->v, &pr->o, &pr->dq, &pr->dk, &pr->dv};
    for (int i = 0; i < 7; i++)
        aj_device_alloc(dev, n * esize, bufs[i]);
    aj_device_alloc(dev, (size_t)h * s * 4, &pr->lse);
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    float *srcs[3] = {pr->qf, pr->kf, pr->vf};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            srcs[t][i] = (float)((double)(rng >> 40) / (double)(1 << 24) * 2.0 - 1.0);
        }
    aj_convert(pr->qf, AJ_DTYPE_F32, pr->q, dtype, n);
    aj_convert(pr->kf, AJ_DTYPE_F32, pr->k, dtype, n);
    aj_convert(pr->vf, AJ_DTYPE_F32, pr->v, dtype, n);
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = tensor(pr->q, dtype, h, s, d);
    a.k = tensor(pr->k, dtype, h, s, d);
    a.v = tensor(pr->v, dtype, h, s, d);
    a.o = tensor(pr->o, dtype, h, s, d);
    a.lse = (aj_tensor){pr->lse, AJ_DTYPE_F32, 3, {1, h, s, 0}, {(int64_t)h * s, s, 1, 0}};
    pr->fwd = a;
    pr->bwd = bwd_args_after(&a, a.q, tensor(pr->dq, dtype, h, s, d),
                             tensor(pr->dk, dtype, h, s, d), tensor(pr->dv, dtype, h, s, d));
}

static void problem_free(problem *pr)
{
    void *bufs[8] = {pr->q, pr->k, pr->v, pr->o, pr->lse, pr->dq, pr->dk, pr->dv};
    for (int i = 0; i < 8; i++)
        aj_device_free(pr->dev, bufs[i]);
    free(pr->qf);
    free(pr->kf);
    free(pr->vf);
    free(pr->of);
}

/* Runs one problem, forward then backward; prints their rows; 0 on
 * success. */
static int bench_one(aj_ctx *ctx, aj_device *dev, const config *cfg, int s, int d, int causal,
                     peak_kernel pk, FILE *csv)
{
    aj_kernel *kernel = NULL, *bwd = NULL;
    double ms_fwd = 0, ms_bwd = 0;
    if (compile_op(ctx, cfg, "forward", d, causal, &kernel, &ms_fwd) != AJ_OK ||
        compile_op(ctx, cfg, "backward", d, causal, &bwd, &ms_bwd) != AJ_OK) {
        fprintf(stderr, "bench_cpu: compile: %s\n", aj_last_error(ctx));
        aj_kernel_destroy(kernel);
        return 1;
    }
    int h = cfg->heads;
    problem pr;
    problem_init(&pr, dev, cfg->dtype, h, s, d);
    double flops = 4.0 * h * (double)s * s * d * (causal ? 0.5 : 1.0);
    double t = time_pass(ctx, dev, kernel, &pr.fwd, NULL, cfg->repeat);
    int failed = t < 0;
    if (!failed && cfg->jit) {
        printf("| forward  | %3d | %-6s | -O%d | %8.1f | %9.2f | %8.1f |\n", d,
               causal ? "causal" : "none", cfg->opt_level, ms_fwd, t * 1e3, flops / t / 1e9);
    } else if (!failed) {
        /* the machine may be shared: its peak now, right beside the kernel */
        double peak = measure_peak(pk, aj_device_workers(dev));
        /* baseline: head 0, about 32 rows spread over the sequence */
        int stride = s / 32 > 0 ? s / 32 : 1;
        double t0 = now_s();
        double bflops = baseline_rows(pr.qf, pr.kf, pr.vf, pr.of, s, d, causal, stride);
        print_row(cfg, csv, "forward", s, d, causal, flops, t, peak, bflops / (now_s() - t0) / 1e9);
    }
    if (!failed) {
        t = time_pass(ctx, dev, bwd, NULL, &pr.bwd, cfg->repeat);
        failed = t < 0;
        if (!failed && cfg->jit)
            printf("| backward | %3d | %-6s | -O%d | %8.1f | %9.2f | %8.1f |\n", d,
                   causal ? "causal" : "none", cfg->opt_level, ms_bwd, t * 1e3,
                   2.5 * flops / t / 1e9);
        else if (!failed)
            print_row(cfg, csv, "backward", s, d, causal, 2.5 * flops, t,
                      measure_peak(pk, aj_device_workers(dev)), 0);
    }
    fflush(stdout);
    problem_free(&pr);
    aj_kernel_destroy(kernel);
    aj_kernel_destroy(bwd);
    return failed;
}

/*
 * --dtypes: the forward in f32, in bf16 as this host runs it (AMX tiles
 * where it has them, docs/cpu.md), in bf16 with AJ_CPU_AMX=off (vdpbf16ps
 * where the host has AVX512-BF16) and in bf16 compiled with
 * AJ_CPU_ISA=avx512 (widened to f32: what a host without AVX512-BF16
 * runs), launched in turn R times each, best of each.
 */
static int bench_dtypes(aj_ctx *ctx, aj_device *dev, const config *cfg, int s, int d,
                        int causal)
{
    enum { F32, BF16, BF16_NO_AMX, BF16_WIDE, KINDS };
    static const aj_dtype dtypes[KINDS] = {AJ_DTYPE_F32, AJ_DTYPE_BF16, AJ_DTYPE_BF16,
                                           AJ_DTYPE_BF16};
    config one = *cfg;
    one.jit = 0;
    aj_kernel *k[KINDS] = {0};
    problem pr[KINDS];
    double best[KINDS], ms;
    int failed = 0;
    for (int i = 0; i < KINDS; i++) {
        one.dtype = dtypes[i];
        if (i == BF16_WIDE)
            setenv("AJ_CPU_ISA", "avx512", 1);
        if (i == BF16_NO_AMX)
            setenv("AJ_CPU_AMX", "off", 1);
        failed |= compile_op(ctx, &one, "forward", d, causal, &k[i], &ms) != AJ_OK;
        unsetenv("AJ_CPU_ISA");
        unsetenv("AJ_CPU_AMX");
        problem_init(&pr[i], dev, dtypes[i], cfg->heads, s, d);
        best[i] = -1;
    }
    if (failed)
        fprintf(stderr, "bench_cpu: compile: %s\n", aj_last_error(ctx));
    for (int r = 0; r < cfg->repeat && !failed; r++)
        for (int i = 0; i < KINDS && !failed; i++) {
            double t = time_pass(ctx, dev, k[i], &pr[i].fwd, NULL, 1);
            failed = t < 0;
            if (best[i] < 0 || t < best[i])
                best[i] = t;
        }
    if (!failed) {
        double flops = 4.0 * cfg->heads * (double)s * s * d * (causal ? 0.5 : 1.0);
        printf("| %5d | %3d | %-6s | %8.2f | %8.2f | %8.2f | %8.2f | %6.1f | %6.1f | %5.2fx | "
               "%5.2fx | %5.2fx |\n",
               s, d, causal ? "causal" : "none", best[F32] * 1e3, best[BF16] * 1e3,
               best[BF16_NO_AMX] * 1e3, best[BF16_WIDE] * 1e3, flops / best[F32] / 1e9,
               flops / best[BF16] / 1e9, best[F32] / best[BF16], best[BF16_NO_AMX] / best[BF16],
               best[BF16_WIDE] / best[BF16]);
        fflush(stdout);
    }
    for (int i = 0; i < KINDS; i++) {
        problem_free(&pr[i]);
        aj_kernel_destroy(k[i]);
    }
    return failed;
}

static int usage(void)
{
    fprintf(stderr, "usage: bench_cpu [--quick | --full] [--workers N] [--dtype f16|bf16|f32] "
                    "[--heads H] [--repeat R] [--csv FILE] [--dims D,D,...]\n"
                    "       bench_cpu --jit [-O 0..3] [--seq S] [--compiles N] [...]\n"
                    "       bench_cpu --dtypes [--heads H] [--repeat R] [--workers N]\n");
    return 1;
}

int main(int argc, char **argv)
{
    config cfg = {AJ_DTYPE_BF16, 8, 5, 0, 0, NULL, 0, 2, 5, 2048, 0};
    int dims[8] = {64, 128}, ndims = 2;
    const bench_int_option ints[] = {{"--workers", &cfg.workers}, {"--heads", &cfg.heads},
                                     {"--repeat", &cfg.repeat},   {"-O", &cfg.opt_level},
                                     {"--compiles", &cfg.compiles}, {"--seq", &cfg.seq}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (bench_int_arg(ints, sizeof ints / sizeof ints[0], a, next)) {
            i++;
        } else if (strcmp(a, "--quick") == 0) {
            cfg.full = 0;
        } else if (strcmp(a, "--full") == 0) {
            cfg.full = 1;
        } else if (strcmp(a, "--dtypes") == 0) {
            cfg.dtypes = 1;
        } else if (strcmp(a, "--jit") == 0) {
            cfg.jit = 1;
        } else if (strcmp(a, "--csv") == 0 && next) {
            cfg.csv = argv[++i];
        } else if (strcmp(a, "--dims") == 0 && next) {
            ndims = 0;
            for (const char *p = argv[++i]; *p && ndims < 8; p += *p == ',') {
                char *end;
                long d = strtol(p, &end, 10);
                if (end == p || d < 8 || d > 512 || d % 8)
                    return usage();
                dims[ndims++] = (int)d;
                p = end;
            }
        } else if (strcmp(a, "--dtype") == 0 && next) {
            const char *t = argv[++i];
            if (strcmp(t, "f16") == 0)
                cfg.dtype = AJ_DTYPE_F16;
            else if (strcmp(t, "bf16") == 0)
                cfg.dtype = AJ_DTYPE_BF16;
            else if (strcmp(t, "f32") == 0)
                cfg.dtype = AJ_DTYPE_F32;
            else
                return usage();
        } else {
            return usage();
        }
    }
    if (cfg.heads < 1 || cfg.repeat < 1 || cfg.workers < 0 || cfg.workers > 256 ||
        cfg.opt_level < 0 || cfg.opt_level > 3 || cfg.compiles < 1 || cfg.compiles > 64 ||
        cfg.seq < 1)
        return usage();

    aj_ctx *ctx;
    aj_device *dev;
    if (!bench_open(AJ_DEVICE_CPU, "bench_cpu", &ctx, &dev))
        return 1;
    aj_device_set_workers(dev, cfg.workers);
    peak_kernel pk = pick_peak_kernel();
    if (!pk.loop) {
        fprintf(stderr, "bench_cpu: no FMA peak kernel for this architecture\n");
        return 1;
    }
    int threads = aj_device_workers(dev);
    FILE *csv = cfg.csv ? fopen(cfg.csv, "w") : NULL;
    if (cfg.csv && !csv) {
        fprintf(stderr, "bench_cpu: cannot write %s\n", cfg.csv);
        return 1;
    }
    /* every table names what the kernels were compiled for (CPUID
     * features, paths; aj_cpu_describe) */
    char paths[1024];
    aj_cpu_describe(paths, sizeof paths);
    if (cfg.dtypes) {
        printf("cpu: %s, %d threads; flash forward, B 1, H %d; f32, bf16 as this host runs it, "
               "bf16 with AJ_CPU_AMX=off and bf16 widened (AJ_CPU_ISA=avx512), launched in "
               "turn, best of %d\n\n```\n%s```\n\n| S | d | mask | f32 ms | bf16 ms | "
               "bf16 no-AMX ms | bf16 widened ms | f32 GFLOP/s | bf16 GFLOP/s | bf16 vs f32 | "
               "vs no AMX | vs widened |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
               "---:|---:|\n", aj_device_name(dev), threads, cfg.heads, cfg.repeat, paths);
        static const int seqs[] = {1024, 2048, 4096};
        int failed = 0;
        for (int di = 0; di < 2; di++)
            for (int causal = 0; causal < 2; causal++)
                for (int si = 0; si < 3; si++)
                    failed |= bench_dtypes(ctx, dev, &cfg, seqs[si], di ? 128 : 64, causal);
        aj_device_close(dev);
        aj_ctx_destroy(ctx);
        return failed;
    }
    if (cfg.jit) {
        printf("cpu: %s, %d threads; %s, B 1, H %d, S %d; compile: median of %d, cache "
               "bypassed; run: best of %d\n\n```\n%s```\n\n| pass | d | mask | opt | "
               "compile ms | run ms | GFLOP/s |\n|---|---:|---|---|---:|---:|---:|\n",
               aj_device_name(dev), threads, aj_dtype_name(cfg.dtype), cfg.heads, cfg.seq,
               cfg.compiles, cfg.repeat, paths);
        int failed = 0;
        static const int jit_dims[] = {64, 128, 256};
        for (int di = 0; di < 3; di++)
            for (int causal = 0; causal < 2; causal++)
                failed |= bench_one(ctx, dev, &cfg, cfg.seq, jit_dims[di], causal, pk, NULL);
        aj_device_close(dev);
        aj_ctx_destroy(ctx);
        return failed;
    }
    if (csv)
        fprintf(csv, "pass,dtype,heads,seq,head_dim,mask,ms,gflops,peak_gflops,"
                     "fraction_of_peak,baseline_gflops\n");
    printf("cpu: %s, %d threads; peak: %s chains on every thread, measured after each row\n",
           aj_device_name(dev), threads, pk.name);
    printf("flash forward and backward, %s, B 1, H %d, Sq = Sk = S, best of %d (peak: best "
           "of 3)\n\n```\n%s```\n\n", aj_dtype_name(cfg.dtype), cfg.heads, cfg.repeat, paths);
    printf("| pass | S | d | mask | ms | GFLOP/s | peak GFLOP/s | of peak | C loop GFLOP/s | "
           "speedup |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|\n");
    static const int quick[] = {512, 1024, 2048}, full[] = {512, 1024, 2048, 4096, 8192};
    const int *sizes = cfg.full ? full : quick;
    int nsizes = cfg.full ? 5 : 3;
    int failed = 0;
    for (int di = 0; di < ndims; di++)
        for (int causal = 0; causal < 2; causal++)
            for (int si = 0; si < nsizes; si++)
                failed |= bench_one(ctx, dev, &cfg, sizes[si], dims[di], causal, pk, csv);
    if (csv)
        fclose(csv);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return failed;
}
