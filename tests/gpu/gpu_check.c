/*
 * gpu_check.c -- the checks only a GPU can run, in one go (tests/gpu/run.sh
 * calls it; docs/gpu.md says how).
 *
 *   gpu_check [--out DIR] [--quick] [--dump DIR]
 *
 *   1. correctness: every template x dtype x head dim x mask at moderate
 *      sizes on the GPU against the float64 reference (on this machine's
 *      CPUs), with the tolerances of the sim tests;
 *   2. speed: the forward kernels at B*S = 16k tokens, hidden 2048
 *      (H = 2048 / d), S in 512..16k, d in 64/128/256, causal and not;
 *      TFLOP/s counted as FlashAttention counts them (4 B S^2 D H, halved
 *      for causal), median of timed launches after warm-up;
 *   3. start-up: compiling the example specs for this GPU with an empty
 *      kernel cache (cold, in parallel) and again from the cache (warm).
 *
 * Prints markdown tables; with --out, also writes gpu_check.json and
 * gpu_check.md there.  --dump writes a few cases' tensors as .npy for
 * tests/gpu/torch_compare.py.  Exit status: 0 if every check passed, 1 if
 * one failed, 77 (ctest's "skipped") where there is no usable GPU.
 */
#include <dirent.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "sim_harness.h"
#include "tools/npy.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static FILE *json, *md;

/* Prints to stdout and the markdown file. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (md) {
        va_start(ap, fmt);
        vfprintf(md, fmt, ap);
        va_end(ap);
    }
}

/* ---------------------------------------------------------------- 1 */

static int check_correctness(aj_ctx *ctx, aj_device *dev, int quick)
{
    static const aj_dtype dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};
    static const int dims[] = {32, 64, 96, 128, 256};
    static const char *const masks[] = {"none", "causal(top_left)", "causal(bottom_right)",
                                        "window(64, 0, bottom_right)"};
    int failed = 0, cases = 0;
    say("\n## Correctness on %s against the float64 reference\n\n", aj_device_name(dev));
    say("| case | status | O error / tol | LSE error / tol | empty rows |\n"
        "|---|---|---:|---:|---:|\n");
    if (json)
        fprintf(json, "  \"correctness\": [\n");
    for (int t = 0; t < 3; t++)
        for (int d = 0; d < 5; d++)
            for (int m = 0; m < 4; m++) {
                if (quick && (d % 2 || m % 2))
                    continue;
                char label[128];
                snprintf(label, sizeof label, "efficient fwd %s d%d %s",
                         aj_dtype_name(dtypes[t]), dims[d], masks[m]);
                fwd_case c = {label, dtypes[t], dims[d], 0, masks[m], NULL, NULL,
                              2, 8, 2, 257, 300, 0, 0, 0, 0, 1.0, 0,
                              (uint64_t)(100 * t + 10 * d + m + 1)};
                fwd_result r = fwd_run_case(ctx, dev, &c);
                int ok = r.status == AJ_OK && r.max_err_o <= 1 && r.max_err_lse <= 1 &&
                         r.exact_empty_rows;
                failed += !ok;
                cases++;
                say("| %s | %s | %.3f | %.3f | %lld |\n", label,
                    r.status == AJ_OK ? (ok ? "ok" : "WRONG") : aj_status_str(r.status),
                    r.max_err_o, r.max_err_lse, (long long)r.rows_without_keys);
                if (r.status != AJ_OK)
                    fprintf(stderr, "gpu_check: %s: %s\n", label, aj_last_error(ctx));
                if (json)
                    fprintf(json, "    {\"case\": \"%s\", \"ok\": %s, \"err_o\": %.6g, "
                            "\"err_lse\": %.6g}%s\n", label, ok ? "true" : "false",
                            r.max_err_o, r.max_err_lse, "," );
            }
    /* the flash forward: f16 / bf16 x its head dims x the masks, then
     * accumulate over 3 key blocks and a varlen batch */
    static const int flash_dims[][2] = {{32, 32}, {64, 64}, {96, 96}, {128, 128},
                                        {192, 192}, {256, 256}, {192, 128}};
    static const int32_t lq[] = {1, 300, 0, 129}, lk[] = {257, 64, 5, 0};
    for (int t = 0; t < 2; t++)
        for (int d = 0; d < 7; d++)
            for (int m = 0; m < 6; m++) {
                if (quick && (d % 2 || m % 2))
                    continue;
                fwd_run_options how = {.variant = AJ_VARIANT_FLASH};
                if (m == 4)
                    how.accumulate_parts = 3;
                if (m == 5) {
                    how.seqlens_q = lq;
                    how.seqlens_k = lk;
                }
                char label[128];
                snprintf(label, sizeof label, "flash fwd %s d%d/%d %s%s",
                         aj_dtype_name(dtypes[t]), flash_dims[d][0], flash_dims[d][1],
                         masks[m % 4], m == 4 ? " accumulate" : m == 5 ? " varlen" : "");
                fwd_case c = {label, dtypes[t], flash_dims[d][0], flash_dims[d][1], masks[m % 4],
                              NULL, NULL, m == 5 ? 4 : 2, 8, 2, 257, 300, 0, 0, 0, 0, 1.0, 0,
                              (uint64_t)(1000 + 100 * t + 10 * d + m)};
                fwd_result r = fwd_run_case_ext(ctx, dev, &c, NULL, &how);
                int ok = r.status == AJ_OK && r.max_err_o <= 1 && r.max_err_lse <= 1 &&
                         r.exact_empty_rows;
                failed += !ok;
                cases++;
                say("| %s | %s | %.3f | %.3f | %lld |\n", label,
                    r.status == AJ_OK ? (ok ? "ok" : "WRONG") : aj_status_str(r.status),
                    r.max_err_o, r.max_err_lse, (long long)r.rows_without_keys);
                if (r.status != AJ_OK)
                    fprintf(stderr, "gpu_check: %s: %s\n", label, aj_last_error(ctx));
                if (json)
                    fprintf(json, "    {\"case\": \"%s\", \"ok\": %s, \"err_o\": %.6g, "
                            "\"err_lse\": %.6g},\n", label, ok ? "true" : "false",
                            r.max_err_o, r.max_err_lse);
            }
    if (json)
        fprintf(json, "    {\"cases\": %d, \"failed\": %d}\n  ],\n", cases, failed);
    say("\n%d cases, %d failed\n", cases, failed);
    return failed;
}

/* ---------------------------------------------------------------- 2 */

static aj_kernel *compile_for(aj_ctx *ctx, aj_device *dev, const char *variant, aj_dtype dtype,
                              int d, int causal)
{
    char text[256];
    snprintf(text, sizeof text, "attention forward %s { dtype = %s head_dim = %d "
             "mask = %s }", variant, aj_dtype_name(dtype), d,
             causal ? "causal(bottom_right)" : "none");
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    if (aj_op_parse(ctx, text, strlen(text), "bench", &op) == AJ_OK)
        aj_compile(ctx, op, &opt, &k);
    aj_op_destroy(op);
    return k;
}

static aj_tensor dev_tensor(void *p, aj_dtype dt, int64_t b, int64_t h, int64_t s, int64_t d)
{
    aj_tensor t = {p, dt, 4, {b, h, s, d}, {h * s * d, s * d, d, 1}};
    return t;
}

static int benchmark(aj_ctx *ctx, aj_device *dev, int quick)
{
    static const int seqs[] = {512, 1024, 2048, 4096, 8192, 16384};
    static const int dims[] = {64, 128, 256};
    const int tokens = 16384, hidden = 2048, reps = quick ? 3 : 10;
    say("\n## Forward speed on %s (bf16, B*S = 16k tokens, hidden 2048)\n\n",
        aj_device_name(dev));
    say("| kernel | d | S | B x H | causal | median (ms) | TFLOP/s |\n"
        "|---|---:|---:|---|---|---:|---:|\n");
    if (json)
        fprintf(json, "  \"forward_speed\": [\n");
    int failed = 0, first = 1;
    static const char *const variants[] = {"efficient", "flash"};
    for (int vi = 0; vi < 2; vi++) {
        for (int di = 0; di < 3; di++)
            for (int si = 0; si < 6; si++)
                for (int causal = 0; causal < 2; causal++) {
                    int d = dims[di], s = seqs[si], h = hidden / d, b = tokens / s;
                    if (quick && si % 2)
                        continue;
                    aj_kernel *k = compile_for(ctx, dev, variants[vi], AJ_DTYPE_BF16, d, causal);
                    size_t n = (size_t)b * h * s * d * 2;
                    void *q = NULL, *kk = NULL, *v = NULL, *o = NULL, *lse = NULL;
                    aj_status st = k ? AJ_OK : AJ_ERR_CODEGEN;
                    if (st == AJ_OK) st = aj_device_alloc(dev, n, &q);
                    if (st == AJ_OK) st = aj_device_alloc(dev, n, &kk);
                    if (st == AJ_OK) st = aj_device_alloc(dev, n, &v);
                    if (st == AJ_OK) st = aj_device_alloc(dev, n, &o);
                    if (st == AJ_OK) st = aj_device_alloc(dev, (size_t)b * h * s * 4, &lse);
                    /* inputs: a fixed small pattern, uploaded once */
                    uint16_t *host = malloc(n);
                    for (size_t i = 0; host && i < n / 2; i++) {
                        float f = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
                        aj_convert(&f, AJ_DTYPE_F32, &host[i], AJ_DTYPE_BF16, 1);
                    }
                    if (st == AJ_OK && host) st = aj_device_copy_to(dev, q, host, n);
                    if (st == AJ_OK && host) st = aj_device_copy_to(dev, kk, host, n);
                    if (st == AJ_OK && host) st = aj_device_copy_to(dev, v, host, n);
                    free(host);
                    aj_fwd_args a = AJ_FWD_ARGS_INIT;
                    a.q = dev_tensor(q, AJ_DTYPE_BF16, b, h, s, d);
                    a.k = dev_tensor(kk, AJ_DTYPE_BF16, b, h, s, d);
                    a.v = dev_tensor(v, AJ_DTYPE_BF16, b, h, s, d);
                    a.o = dev_tensor(o, AJ_DTYPE_BF16, b, h, s, d);
                    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {b, h, s, 0},
                                        {(int64_t)h * s, s, 1, 0}};
                    double times[16];
                    for (int r = 0; r < 3 && st == AJ_OK; r++)   /* warm-up, module load */
                        st = aj_forward(ctx, dev, k, &a);
                    if (st == AJ_OK)
                        st = aj_device_synchronize(dev, NULL);
                    for (int r = 0; r < reps && st == AJ_OK; r++) {
                        double t0 = now_ms();
                        st = aj_forward(ctx, dev, k, &a);
                        if (st == AJ_OK)
                            st = aj_device_synchronize(dev, NULL);
                        times[r] = now_ms() - t0;
                    }
                    double flops = 4.0 * b * (double)s * s * d * h / (causal ? 2 : 1);
                    if (st == AJ_OK) {
                        qsort(times, (size_t)reps, sizeof times[0], cmp_double);
                        double ms = times[reps / 2];
                        say("| %s fwd | %d | %d | %d x %d | %s | %.3f | %.1f |\n", variants[vi], d,
                            s, b, h, causal ? "yes" : "no", ms, flops / ms / 1e9);
                        if (json)
                            fprintf(json, "%s    {\"kernel\": \"%s_fwd\", \"d\": %d, \"S\": %d, "
                                    "\"B\": %d, \"H\": %d, \"causal\": %s, \"ms\": %.4f, "
                                    "\"tflops\": %.3f}", first ? "" : ",\n", variants[vi], d, s,
                                    b, h, causal ? "true" : "false", ms, flops / ms / 1e9);
                        first = 0;
                    } else {
                        say("| %s fwd | %d | %d | %d x %d | %s | %s | - |\n", variants[vi], d, s,
                            b, h, causal ? "yes" : "no", aj_status_str(st));
                        fprintf(stderr, "gpu_check: d%d S%d: %s\n", d, s, aj_last_error(ctx));
                        failed++;
                    }
                    aj_device_free(dev, q);
                    aj_device_free(dev, kk);
                    aj_device_free(dev, v);
                    aj_device_free(dev, o);
                    aj_device_free(dev, lse);
                    aj_kernel_destroy(k);
                }
    }
    if (json)
        fprintf(json, "\n  ],\n");
    say("\nBackward kernels do not exist yet; the backward table follows when they do.\n");
    return failed;
}

/* ---------------------------------------------------------------- 3 */

static int startup(aj_device *dev, const char *specs_dir)
{
    char cache_dir[] = "/tmp/aj_gpu_cache_XXXXXX";
    if (!mkdtemp(cache_dir))
        return 1;
    DIR *d = opendir(specs_dir);
    char *texts[64];
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d)) && n < 64;) {
        if (!strstr(e->d_name, ".aj"))
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", specs_dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        texts[n] = calloc(1, 8192);
        size_t len = fread(texts[n], 1, 8191, f);
        texts[n][len] = '\0';
        fclose(f);
        n++;
    }
    if (d)
        closedir(d);
    double ms[2] = {0, 0};
    int failed = 0;
    for (int pass = 0; pass < 2; pass++) {
        aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
        cfg.cache_dir = cache_dir;
        aj_ctx *ctx = NULL;
        aj_ctx_create(&cfg, &ctx);
        aj_compile_job jobs[64];
        aj_op *ops[64];
        memset(jobs, 0, sizeof jobs);
        for (int i = 0; i < n; i++) {
            ops[i] = NULL;
            aj_op_parse(ctx, texts[i], strlen(texts[i]), "spec", &ops[i]);
            jobs[i].op = ops[i];
        }
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = aj_device_target(dev);
        double t0 = now_ms();
        if (aj_compile_many(ctx, jobs, (size_t)n, &opt, 0) != AJ_OK) {
            fprintf(stderr, "gpu_check: start-up compile: %s\n", aj_last_error(ctx));
            failed = 1;
        }
        ms[pass] = now_ms() - t0;
        for (int i = 0; i < n; i++) {
            aj_kernel_destroy(jobs[i].kernel);
            aj_op_destroy(ops[i]);
        }
        aj_ctx_destroy(ctx);
    }
    say("\n## Start-up: the %d example specs for %s\n\n| cache | total (ms) | per kernel (ms) |\n"
        "|---|---:|---:|\n| cold (empty, parallel) | %.1f | %.2f |\n| warm (disk) | %.1f | %.2f |\n"
        "\nwarm is %.0fx faster\n", n, aj_target_name(aj_device_target(dev)), ms[0],
        ms[0] / (n ? n : 1), ms[1], ms[1] / (n ? n : 1), ms[0] / (ms[1] > 0 ? ms[1] : 1));
    if (json)
        fprintf(json, "  \"startup\": {\"specs\": %d, \"cold_ms\": %.2f, \"warm_ms\": %.2f}\n",
                n, ms[0], ms[1]);
    for (int i = 0; i < n; i++)
        free(texts[i]);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "gpu_check: could not remove %s\n", cache_dir);
    return failed;
}

/* ---------------------------------------------------------------- dump */

/* A few cases' inputs and outputs as .npy, for torch_compare.py. */
static int dump_cases(aj_ctx *ctx, aj_device *dev, const char *dir)
{
    static const struct { aj_dtype dt; int d; int causal; } cases[] = {
        {AJ_DTYPE_F16, 64, 0}, {AJ_DTYPE_BF16, 128, 1}, {AJ_DTYPE_F16, 256, 1}};
    mkdir(dir, 0755);
    int failed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int b = 2, h = 4, s = 384, d = cases[c].d;
        size_t n = (size_t)b * h * s * d;
        float *f = malloc(n * 4 * 3), *out = malloc(n * 4), *lse = malloc((size_t)b * h * s * 4);
        uint16_t *hq = malloc(n * 2 * 3), *ho = malloc(n * 2);
        for (size_t i = 0; i < n * 3; i++) {
            float x = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
            aj_convert(&x, AJ_DTYPE_F32, &hq[i], cases[c].dt, 1);
            aj_convert(&hq[i], cases[c].dt, &f[i], AJ_DTYPE_F32, 1);
        }
        aj_kernel *k = compile_for(ctx, dev, "efficient", cases[c].dt, d, cases[c].causal);
        void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL, *dlse = NULL;
        aj_status st = k ? AJ_OK : AJ_ERR_CODEGEN;
        if (st == AJ_OK) st = aj_device_alloc(dev, n * 2, &dq);
        if (st == AJ_OK) st = aj_device_alloc(dev, n * 2, &dk);
        if (st == AJ_OK) st = aj_device_alloc(dev, n * 2, &dv);
        if (st == AJ_OK) st = aj_device_alloc(dev, n * 2, &dout);
        if (st == AJ_OK) st = aj_device_alloc(dev, (size_t)b * h * s * 4, &dlse);
        if (st == AJ_OK) st = aj_device_copy_to(dev, dq, hq, n * 2);
        if (st == AJ_OK) st = aj_device_copy_to(dev, dk, hq + n, n * 2);
        if (st == AJ_OK) st = aj_device_copy_to(dev, dv, hq + 2 * n, n * 2);
        aj_fwd_args a = AJ_FWD_ARGS_INIT;
        a.q = dev_tensor(dq, cases[c].dt, b, h, s, d);
        a.k = dev_tensor(dk, cases[c].dt, b, h, s, d);
        a.v = dev_tensor(dv, cases[c].dt, b, h, s, d);
        a.o = dev_tensor(dout, cases[c].dt, b, h, s, d);
        a.lse = (aj_tensor){dlse, AJ_DTYPE_F32, 3, {b, h, s, 0}, {(int64_t)h * s, s, 1, 0}};
        if (st == AJ_OK) st = aj_forward(ctx, dev, k, &a);
        if (st == AJ_OK) st = aj_device_copy_from(dev, ho, dout, n * 2);
        if (st == AJ_OK) st = aj_device_copy_from(dev, lse, dlse, (size_t)b * h * s * 4);
        if (st == AJ_OK) {
            aj_convert(ho, cases[c].dt, out, AJ_DTYPE_F32, n);
            char name[64], path[1024], err[256];
            int64_t shape[4] = {b, h, s, d}, lshape[3] = {b, h, s};
            snprintf(name, sizeof name, "%s_d%d_%s", aj_dtype_name(cases[c].dt), d,
                     cases[c].causal ? "causal_bottom_right" : "none");
            const char *names[5] = {"q", "k", "v", "o", "lse"};
            for (int t = 0; t < 5; t++) {
                snprintf(path, sizeof path, "%s/%s.%s.npy", dir, name, names[t]);
                npy_status ns = t < 3 ? npy_write_f32(path, f + (size_t)t * n, 4, shape, err,
                                                      sizeof err)
                              : t == 3 ? npy_write_f32(path, out, 4, shape, err, sizeof err)
                                       : npy_write_f32(path, lse, 3, lshape, err, sizeof err);
                if (ns != NPY_OK) {
                    fprintf(stderr, "gpu_check: %s\n", err);
                    failed++;
                }
            }
        } else {
            fprintf(stderr, "gpu_check: dump: %s\n", aj_last_error(ctx));
            failed++;
        }
        aj_device_free(dev, dq);
        aj_device_free(dev, dk);
        aj_device_free(dev, dv);
        aj_device_free(dev, dout);
        aj_device_free(dev, dlse);
        aj_kernel_destroy(k);
        free(f), free(out), free(lse), free(hq), free(ho);
    }
    return failed;
}

int main(int argc, char **argv)
{
    const char *out_dir = NULL, *dump_dir = NULL, *specs = "examples/specs";
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out_dir = argv[++i];
        else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc)
            dump_dir = argv[++i];
        else if (strcmp(argv[i], "--specs") == 0 && i + 1 < argc)
            specs = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else {
            fprintf(stderr, "usage: gpu_check [--out DIR] [--dump DIR] [--specs DIR] [--quick]\n");
            return 2;
        }
    }
    aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
    cfg.cache_mode = AJ_CACHE_MEMORY;
    aj_ctx *ctx = NULL;
    aj_ctx_create(&cfg, &ctx);
    aj_device *dev = NULL;
    if (aj_device_open(ctx, AJ_DEVICE_CUDA, 0, &dev) != AJ_OK) {
        printf("SKIP gpu_check: %s\n", aj_last_error(ctx));
        aj_ctx_destroy(ctx);
        return 77;
    }
    if (out_dir) {
        char path[1024];
        mkdir(out_dir, 0755);
        snprintf(path, sizeof path, "%s/gpu_check.json", out_dir);
        json = fopen(path, "w");
        snprintf(path, sizeof path, "%s/gpu_check.md", out_dir);
        md = fopen(path, "w");
    }
    if (json)
        fprintf(json, "{\n  \"device\": \"%s\",\n  \"target\": \"%s\",\n", aj_device_name(dev),
                aj_target_name(aj_device_target(dev)));
    say("# attnjit GPU check: %s (%s), attnjit %s, LLVM %s\n", aj_device_name(dev),
        aj_target_name(aj_device_target(dev)), aj_version_string(), aj_llvm_version());
    int failed = check_correctness(ctx, dev, quick);
    if (dump_dir)
        failed += dump_cases(ctx, dev, dump_dir);
    failed += benchmark(ctx, dev, quick);
    failed += startup(dev, specs);
    if (json) {
        fprintf(json, "  ,\"failed\": %d\n}\n", failed);
        fclose(json);
    }
    if (md)
        fclose(md);
    fwd_cache_clear();
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    printf("\ngpu_check: %s\n", failed ? "FAILED" : "all checks passed");
    return failed ? 1 : 0;
}
