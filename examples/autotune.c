/*
 * autotune.c -- tune a spec's schedule on a device, then use it: the
 * tuned kernel comes from an ordinary aj_compile that names the device.
 *
 *   autotune [--device sim|cuda] [--seq N] [--budget-s N]
 *
 * The tuning database lives beside the kernel cache ($AJ_CACHE_DIR, ...);
 * this example uses a fresh temporary one so that it starts cold.  It
 * checks that the compile picked the tuned schedule and that the tuned
 * kernel's output equals the default kernel's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"

enum { B = 1, H = 2, D = 64 };

static int fail(aj_ctx *ctx, const char *what)
{
    fprintf(stderr, "autotune: %s: %s\n", what, aj_last_error(ctx));
    return 1;
}

/* Runs kernel k on the device over inputs from the host; out gets O. */
static aj_status run(aj_ctx *ctx, aj_device *dev, const aj_kernel *k, int s, const float *q,
                     float *out)
{
    size_t n = (size_t)B * H * s * D, bytes = n * sizeof(float);
    void *dq = NULL, *dout = NULL, *dlse = NULL;
    aj_status st = aj_device_alloc(dev, bytes, &dq);
    if (st == AJ_OK)
        st = aj_device_alloc(dev, bytes, &dout);
    if (st == AJ_OK)
        st = aj_device_alloc(dev, (size_t)B * H * s * sizeof(float), &dlse);
    if (st == AJ_OK)
        st = aj_device_copy_to(dev, dq, q, bytes);
    aj_tensor t = {dq, AJ_DTYPE_F32, 4, {B, H, s, D}, {(int64_t)H * s * D, (int64_t)s * D, D, 1}};
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = a.k = a.v = t;         /* self-attention of one tensor: enough for a check */
    a.o = t;
    a.o.data = dout;
    a.lse = (aj_tensor){dlse, AJ_DTYPE_F32, 3, {B, H, s}, {(int64_t)H * s, s, 1}};
    if (st == AJ_OK)
        st = aj_forward(ctx, dev, k, &a);
    if (st == AJ_OK)
        st = aj_device_synchronize(dev, NULL);
    if (st == AJ_OK)
        st = aj_device_copy_from(dev, out, dout, bytes);
    aj_device_free(dev, dq);
    aj_device_free(dev, dout);
    aj_device_free(dev, dlse);
    return st;
}

int main(int argc, char **argv)
{
    aj_device_kind kind = AJ_DEVICE_SIM;
    int seq = 64;
    double budget = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--device"))
            kind = !strcmp(argv[i + 1], "cuda") ? AJ_DEVICE_CUDA : AJ_DEVICE_SIM;
        else if (!strcmp(argv[i], "--seq"))
            seq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--budget-s"))
            budget = atof(argv[i + 1]);
    }
    if (seq < 1 || seq > (1 << 20) || !(budget > 0)) {
        fprintf(stderr, "usage: autotune [--device sim|cuda] [--seq N] [--budget-s N]\n");
        return 2;
    }
    char dir[] = "/tmp/attnjit-autotune-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("autotune: mkdtemp");
        return 1;
    }
    aj_ctx_config config = AJ_CTX_CONFIG_INIT;
    config.cache_dir = dir;
    aj_ctx *ctx = NULL;
    aj_device *dev = NULL;
    aj_op *op = NULL;
    aj_kernel *tuned = NULL, *plain = NULL;
    aj_tune_result *results = NULL;
    float *q = NULL, *o_tuned = NULL, *o_plain = NULL;
    int rc = 1;
    if (aj_ctx_create(&config, &ctx) != AJ_OK)
        goto out;
    if (aj_device_open(ctx, kind, 0, &dev) != AJ_OK) {
        rc = fail(ctx, "device");
        goto out;
    }
    const char *spec = "attention forward efficient {\n  dtype = f32\n  head_dim = 64\n"
                       "  mask = causal(bottom_right)\n}\n";
    if (aj_op_parse(ctx, spec, strlen(spec), "autotune", &op) != AJ_OK) {
        rc = fail(ctx, "spec");
        goto out;
    }

    /* 1. tune: the ranking comes back; the best goes to the database */
    aj_tune_options topt = AJ_TUNE_OPTIONS_INIT;
    topt.batch = B;
    topt.heads_q = H;
    topt.seq_q = seq;
    topt.repeats = 3;
    topt.budget_s = budget;
    int32_t n = 0;
    if (aj_tune(ctx, dev, op, &topt, &results, &n) != AJ_OK) {
        rc = fail(ctx, "tune");
        goto out;
    }
    double base = 0;
    int timed = 0, pruned = 0;
    for (int32_t i = 0; i < n; i++) {
        timed += results[i].timed;
        pruned += results[i].status != AJ_OK;
        if (results[i].is_default && results[i].timed)
            base = results[i].median_ms;
    }
    const aj_schedule *best = &results[0].schedule;
    printf("tuned on %s, S = %d: %d candidates timed, %d pruned, %d left by the budget\n",
           aj_device_name(dev), seq, timed, pruned, n - timed - pruned);
    printf("best: block_m %d, block_n %d, warps %d: %.3f ms (default %.3f ms, %.2fx)\n",
           best->block_m, best->block_n, best->warps, results[0].median_ms, base,
           base / results[0].median_ms);

    /* 2. use it: a compile that names the device gets the tuned schedule */
    aj_compile_options copt = AJ_COMPILE_OPTIONS_INIT;
    copt.device = dev;
    if (aj_compile(ctx, op, &copt, &tuned) != AJ_OK) {
        rc = fail(ctx, "compile");
        goto out;
    }
    aj_launch_info li;
    aj_kernel_launch_info(tuned, &li);
    if (memcmp(&li.schedule, best, sizeof *best) != 0) {
        fprintf(stderr, "autotune: the compile did not pick the tuned schedule\n");
        goto out;
    }

    /* 3. check it against the default schedule's kernel */
    copt.device = NULL;
    copt.target = aj_device_target(dev);
    if (aj_compile(ctx, op, &copt, &plain) != AJ_OK) {
        rc = fail(ctx, "compile");
        goto out;
    }
    size_t count = (size_t)B * H * seq * D;
    q = malloc(count * sizeof *q);
    o_tuned = malloc(count * sizeof *o_tuned);
    o_plain = malloc(count * sizeof *o_plain);
    if (!q || !o_tuned || !o_plain)
        goto out;
    for (size_t i = 0; i < count; i++)
        q[i] = (float)sin(0.1 * (double)i);
    if (run(ctx, dev, tuned, seq, q, o_tuned) != AJ_OK ||
        run(ctx, dev, plain, seq, q, o_plain) != AJ_OK) {
        rc = fail(ctx, "run");
        goto out;
    }
    double worst = 0;
    for (size_t i = 0; i < count; i++)
        worst = fmax(worst, fabs((double)o_tuned[i] - o_plain[i]));
    printf("tuned vs default kernel: max |difference| %.2e\n", worst);
    rc = worst < 1e-5 ? 0 : 1;
out:
    free(q);
    free(o_tuned);
    free(o_plain);
    aj_free(results);
    aj_kernel_destroy(tuned);
    aj_kernel_destroy(plain);
    aj_op_destroy(op);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "autotune: could not remove %s\n", dir);
    return rc;
}
