/*
 * bench_sim.c -- how fast the SIMT emulator runs generated kernels.
 *
 *   bench_sim [--workers N]
 *
 * Per problem: emulated thread-instructions (LLVM IR instructions executed,
 * summed over GPU threads), wall time of the sim launch, their ratio, and
 * beside it the time of the plain float64 reference on the same problem in
 * the same run (the baseline: what a test pays per check without sim).
 * A second table: the strict emulator (random order, race detector; the
 * default) against AJ_SIM_STRICT=0 on the efficient and the flash forward,
 * interleaved, best of three each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "sim_harness.h"
#include "timing.h"

/* Best of three sim launches of each mode, lenient and strict in turn. */
static int strict_table(aj_ctx *ctx, aj_device *dev, const fwd_case *cases, size_t n)
{
    static const char *const variants[] = {"efficient", "flash"};
    printf("\n| problem | variant | AJ_SIM_STRICT=0 (s) | strict (s) | strict / lenient |\n"
           "|---|---|---:|---:|---:|\n");
    int failed = 0;
    for (size_t i = 0; i < n; i++)
        for (int v = 0; v < 2 - (cases[i].dtype == AJ_DTYPE_F32); v++) {
            double best[2] = {1e30, 1e30};
            for (int rep = 0; rep < 6; rep++) {
                int strict = rep & 1;
                setenv("AJ_SIM_STRICT", strict ? "1" : "0", 1);
                fwd_result r = fwd_run_case_variant(ctx, dev, &cases[i], NULL, variants[v]);
                if (r.status != AJ_OK) {
                    fprintf(stderr, "bench_sim: %s %s: %s\n", cases[i].label, variants[v],
                            aj_last_error(ctx));
                    failed = 1;
                    break;
                }
                if (r.seconds < best[strict])
                    best[strict] = r.seconds;
            }
            printf("| %s | %s | %.3f | %.3f | %.2fx |\n", cases[i].label, variants[v], best[0],
                   best[1], best[1] / best[0]);
        }
    unsetenv("AJ_SIM_STRICT");
    return failed;
}

int main(int argc, char **argv)
{
    int workers = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--workers") == 0 && i + 1 < argc) {
            workers = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_sim [--workers N]\n");
            return 1;
        }
    }
    aj_ctx *ctx;
    aj_device *dev;
    if (!bench_open(AJ_DEVICE_SIM, "bench_sim", &ctx, &dev))
        return 1;
    aj_device_set_workers(dev, workers);
    static const fwd_case cases[] = {
        {"f16 d64 causal, B1 H4 S512", AJ_DTYPE_F16, 64, 0, "causal(top_left)", NULL, NULL,
         1, 4, 4, 512, 512, 0, 0, 0, 0, 1.0, 0, 1, AJ_DTYPE_F16, 0, 0},
        {"bf16 d128 none, B1 H2 S512", AJ_DTYPE_BF16, 128, 0, "none", NULL, NULL,
         1, 2, 2, 512, 512, 0, 0, 0, 0, 1.0, 0, 2, AJ_DTYPE_F16, 0, 0},
        {"f32 d256 causal, B1 H2 S256", AJ_DTYPE_F32, 256, 0, "causal(bottom_right)", NULL, NULL,
         1, 2, 1, 256, 256, 0, 0, 0, 0, 1.0, 0, 3, AJ_DTYPE_F16, 0, 0},
    };
    printf("sim workers: %d (0 = one per core)\n\n", workers);
    printf("| problem | thread-instructions | sim (s) | M inst/s | float64 reference (s) | "
           "sim / reference |\n|---|---:|---:|---:|---:|---:|\n");
    int failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const fwd_case *c = &cases[i];
        fwd_result r = fwd_run_case(ctx, dev, c);   /* compiles, runs, checks */
        if (r.status != AJ_OK || r.max_err_o > 1 || r.max_err_lse > 1) {
            fprintf(stderr, "bench_sim: %s: %s %s (O %.3g, LSE %.3g)\n", c->label,
                    aj_status_str(r.status), aj_last_error(ctx), r.max_err_o, r.max_err_lse);
            failed = 1;
            continue;
        }
        /* the reference alone, on the same sizes */
        ref_problem p;
        memset(&p, 0, sizeof p);
        p.B = c->b, p.Hq = c->hq, p.Hkv = c->hkv, p.Sq = c->sq, p.Sk = c->sk;
        p.D = c->d, p.Dv = c->d;
        p.mask = strcmp(c->mask, "none") ? AJ_MASK_CAUSAL : AJ_MASK_NONE;
        size_t nq = (size_t)c->b * c->hq * c->sq * c->d, nk = (size_t)c->b * c->hkv * c->sk * c->d;
        double *q = calloc(nq, sizeof *q), *k = calloc(nk, sizeof *k), *v = calloc(nk, sizeof *v);
        double *o = calloc(nq, sizeof *o), *lse = calloc(nq / (size_t)c->d, sizeof *lse);
        double t0 = now_s();
        ref_forward(&p, q, k, v, o, lse);
        double ref_s = now_s() - t0;
        free(q), free(k), free(v), free(o), free(lse);
        printf("| %s | %llu | %.3f | %.0f | %.3f | %.1fx |\n", c->label,
               (unsigned long long)r.instructions, r.seconds,
               (double)r.instructions / r.seconds / 1e6, ref_s, r.seconds / ref_s);
    }
    failed |= strict_table(ctx, dev, cases, sizeof cases / sizeof cases[0]);
    fwd_cache_clear();
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return failed;
}
