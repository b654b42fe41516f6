/*
 * test_tune.c -- the autotuner on the sim device: the ranking it returns,
 * what it prunes and why, the budget, the tuning database (written,
 * read back by aj_compile with options.device, damaged entries ignored),
 * that a tuned kernel computes what the default one does, and its errors.
 * Problems are tiny (the emulator times them); about 10 s in all.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attnjit/attnjit.h"
#include "check.h"
#include "temp_dir.h"

static char cache_dir[] = "/tmp/attnjit-test-tune-XXXXXX";

static aj_ctx *new_ctx(aj_cache_mode mode)
{
    aj_ctx_config config = AJ_CTX_CONFIG_INIT;
    config.cache_dir = cache_dir;
    config.cache_mode = mode;
    aj_ctx *ctx = NULL;
    aj_ctx_create(&config, &ctx);
    return ctx;
}

/* A context (cache `mode`) and a device of `kind` on it (*dev NULL, a
 * failed CHECK, when none opens). */
static aj_ctx *open_on(aj_cache_mode mode, aj_device_kind kind, aj_device **dev)
{
    aj_ctx *ctx = new_ctx(mode);
    *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, kind, 0, dev), AJ_OK);
    return ctx;
}

/* Frees what a test opened: op, the device, the context. */
static void close_all(aj_ctx *ctx, aj_device *dev, aj_op *op)
{
    aj_op_destroy(op);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
}

static aj_op *parse(aj_ctx *ctx, const char *text)
{
    aj_op *op = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "t", &op), AJ_OK);
    return op;
}

static const char *const spec_f32 =
    "attention forward efficient { dtype = f32 head_dim = 32 mask = causal(top_left) }";

static aj_tune_options small_problem(void)
{
    aj_tune_options o = AJ_TUNE_OPTIONS_INIT;
    o.seq_q = 40;
    o.heads_q = 2;
    o.heads_kv = 1;
    o.warmup = 1;
    o.repeats = 1;
    return o;
}

static int progress_calls, progress_last_done, progress_last_total;

static void on_progress(void *user, int32_t done, int32_t total, const char *what)
{
    (void)user;
    (void)what;
    progress_calls++;
    progress_last_done = done;
    progress_last_total = total;
}

static int same_schedule(const aj_schedule *a, const aj_schedule *b)
{
    return memcmp(a, b, sizeof *a) == 0;
}

/* Runs a kernel on fixed inputs; o gets the output. */
static void run_forward(aj_ctx *ctx, aj_device *dev, const aj_kernel *k, float *o)
{
    enum { B = 1, H = 2, S = 40, D = 32 };
    static float q[B * H * S * D], kk[B * H * S * D], v[B * H * S * D], lse[B * H * S];
    for (int i = 0; i < B * H * S * D; i++) {
        q[i] = sinf((float)i * 0.37f);
        kk[i] = cosf((float)i * 0.11f);
        v[i] = sinf((float)i * 0.05f + 1.0f);
    }
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = (aj_tensor){q, AJ_DTYPE_F32, 4, {B, H, S, D}, {H * S * D, S * D, D, 1}};
    a.k = (aj_tensor){kk, AJ_DTYPE_F32, 4, {B, H, S, D}, {H * S * D, S * D, D, 1}};
    a.v = (aj_tensor){v, AJ_DTYPE_F32, 4, {B, H, S, D}, {H * S * D, S * D, D, 1}};
    a.o = (aj_tensor){o, AJ_DTYPE_F32, 4, {B, H, S, D}, {H * S * D, S * D, D, 1}};
    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {B, H, S}, {H * S, S, 1}};
    CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
}

static void test_tune_and_reuse(void)
{
    aj_device *dev;
    aj_ctx *ctx = open_on(AJ_CACHE_DEFAULT, AJ_DEVICE_SIM, &dev);
    aj_op *op = parse(ctx, spec_f32);
    aj_tune_options o = small_problem();
    o.progress = on_progress;
    aj_tune_result *r = NULL;
    int32_t n = 0;
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, &o, &r, &n), AJ_OK);
    CHECK(n > 10);
    CHECK(progress_calls > 1 && progress_last_done == progress_last_total);

    /* timed first, fastest first; then the pruned, each with its reason */
    int timed = 0, defaults = 0, pruned_stages = 0;
    for (int32_t i = 0; i < n; i++) {
        if (r[i].timed) {
            CHECK_MSG(i == timed, "timed result %d after an untimed one", i);
            CHECK(r[i].status == AJ_OK && r[i].message[0] == '\0');
            CHECK(r[i].median_ms > 0 && r[i].min_ms <= r[i].median_ms);
            if (i > 0)
                CHECK(r[i - 1].median_ms <= r[i].median_ms);
            for (int32_t j = 0; j < i; j++)
                CHECK_MSG(!same_schedule(&r[j].schedule, &r[i].schedule),
                          "schedule of result %d timed twice", i);
            timed++;
        } else {
            CHECK(r[i].status == AJ_ERR_UNSUPPORTED && r[i].message[0]);
            pruned_stages += strstr(r[i].message, "stages = ") != NULL;
        }
        defaults += r[i].is_default;
    }
    CHECK(timed >= 10);
    CHECK(defaults == 1);
    CHECK(pruned_stages > 0);   /* the efficient forward loads K/V in one stage */

    /* the database holds the winner; aj_compile with the device uses it */
    aj_schedule s;
    int32_t workers = -1;
    CHECK_STATUS(ctx, aj_tune_lookup(ctx, dev, op, &s, &workers), AJ_OK);
    CHECK(same_schedule(&s, &r[0].requested));
    CHECK(workers == 0);

    aj_ctx *later = new_ctx(AJ_CACHE_DEFAULT);   /* as another process would */
    aj_compile_options copt = AJ_COMPILE_OPTIONS_INIT;
    copt.target = AJ_TARGET_SM_80;               /* replaced by the device's target */
    copt.emit = AJ_EMIT_LLVM_IR;
    copt.device = dev;
    aj_kernel *tuned = NULL, *plain = NULL;
    CHECK_STATUS(later, aj_compile(later, op, &copt, &tuned), AJ_OK);
    aj_launch_info li;
    CHECK_STATUS(later, aj_kernel_launch_info(tuned, &li), AJ_OK);
    CHECK(same_schedule(&li.schedule, &r[0].schedule));
    CHECK(aj_kernel_target(tuned) == AJ_TARGET_SIM);
    copt.device = NULL;
    copt.target = AJ_TARGET_SIM;
    CHECK_STATUS(later, aj_compile(later, op, &copt, &plain), AJ_OK);
    aj_launch_info lp;
    aj_kernel_launch_info(plain, &lp);
    for (int32_t i = 0; i < n; i++)
        if (r[i].is_default)
            CHECK(same_schedule(&lp.schedule, &r[i].schedule));

    /* both compute the same attention */
    static float o_tuned[2 * 40 * 32], o_plain[2 * 40 * 32];
    run_forward(later, dev, tuned, o_tuned);
    run_forward(later, dev, plain, o_plain);
    double worst = 0;
    for (int i = 0; i < 2 * 40 * 32; i++)
        worst = fmax(worst, fabs((double)o_tuned[i] - o_plain[i]));
    CHECK_MSG(worst < 1e-5, "tuned and default kernels differ by %g", worst);
    aj_kernel_destroy(tuned);
    aj_kernel_destroy(plain);

    /* a damaged entry is ignored: lookups fail, compiles use the default */
    char cmd[256];
    snprintf(cmd, sizeof cmd, "for f in %s/tuning/*.tune; do echo 'schedule 7 7 7 7' > $f; "
             "done", cache_dir);
    CHECK(system(cmd) == 0);
    CHECK_STATUS(later, aj_tune_lookup(later, dev, op, &s, NULL), AJ_ERR_IO);
    CHECK_ERROR(later, "is damaged; ignored");
    copt.device = dev;
    CHECK_STATUS(later, aj_compile(later, op, &copt, &tuned), AJ_OK);
    aj_kernel_launch_info(tuned, &li);
    CHECK(same_schedule(&li.schedule, &lp.schedule));
    aj_kernel_destroy(tuned);

    aj_free(r);
    aj_op_destroy(op);
    aj_ctx_destroy(later);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
}

static void test_budget_and_persistence(void)
{
    aj_device *dev;
    aj_ctx *ctx = open_on(AJ_CACHE_DEFAULT, AJ_DEVICE_SIM, &dev);
    aj_op *op = parse(ctx, "attention forward efficient { dtype = f16 head_dim = 16 }");
    aj_tune_options o = small_problem();
    o.budget_s = 1e-9;     /* spent by compiling: only the first candidate is timed */
    o.no_persist = true;
    aj_tune_result *r = NULL;
    int32_t n = 0;
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, &o, &r, &n), AJ_OK);
    int timed = 0, left_out = 0;
    for (int32_t i = 0; i < n; i++) {
        timed += r[i].timed;
        if (!r[i].timed && r[i].status == AJ_OK) {
            left_out++;
            CHECK(strstr(r[i].message, "budget ran out") != NULL);
        }
    }
    CHECK(timed == 1 && r[0].timed && r[0].is_default);
    CHECK(left_out > 5);
    aj_free(r);
    /* no_persist: nothing recorded */
    aj_schedule s;
    CHECK_STATUS(ctx, aj_tune_lookup(ctx, dev, op, &s, NULL), AJ_ERR_IO);
    CHECK_ERROR(ctx, "no tuned schedule for op");

    /* a context without a disk cache has no database */
    aj_ctx *mem = new_ctx(AJ_CACHE_MEMORY);
    CHECK_STATUS(mem, aj_tune_lookup(mem, dev, op, &s, NULL), AJ_ERR_IO);
    CHECK_ERROR(mem, "the tuning database is off");
    aj_ctx_destroy(mem);

    close_all(ctx, dev, op);
}

/* The cpu device: tiles crossed with thread counts, the default flagged at
 * the device's own count, the winner's count in the database. */
static void test_cpu(void)
{
    aj_device *dev;
    aj_ctx *ctx = open_on(AJ_CACHE_DEFAULT, AJ_DEVICE_CPU, &dev);
    CHECK_STATUS(ctx, aj_device_set_workers(dev, 2), AJ_OK);
    aj_op *op = parse(ctx, spec_f32);
    aj_tune_options o = small_problem();
    o.seq_q = 256;
    aj_tune_result *r = NULL;
    int32_t n = 0;
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, &o, &r, &n), AJ_OK);
    int timed = 0, one = 0, two = 0, defaults = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!r[i].timed)
            continue;
        timed++;
        one += r[i].workers == 1;
        two += r[i].workers == 2;
        CHECK(r[i].requested.warps == 0 && r[i].requested.stages == 0);
        if (r[i].is_default) {
            defaults++;
            CHECK(r[i].workers == 2);
        }
    }
    CHECK(timed > 8 && one == two && one + two == timed);
    CHECK(defaults == 1);
    CHECK(aj_device_workers(dev) == 2);   /* restored after the run */
    aj_schedule s;
    int32_t workers = 0;
    CHECK_STATUS(ctx, aj_tune_lookup(ctx, dev, op, &s, &workers), AJ_OK);
    CHECK(same_schedule(&s, &r[0].requested) && workers == r[0].workers);
    /* and a compile for the device takes the tuned tiles */
    aj_compile_options copt = AJ_COMPILE_OPTIONS_INIT;
    copt.device = dev;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &copt, &k), AJ_OK);
    aj_launch_info li;
    aj_kernel_launch_info(k, &li);
    CHECK(li.schedule.block_m == r[0].schedule.block_m &&
          li.schedule.block_n == r[0].schedule.block_n);
    aj_kernel_destroy(k);
    aj_free(r);
    close_all(ctx, dev, op);
}

static void test_errors(void)
{
    aj_device *dev;
    aj_ctx *ctx = open_on(AJ_CACHE_MEMORY, AJ_DEVICE_SIM, &dev);
    aj_op *op = parse(ctx, spec_f32);
    aj_tune_result *r = NULL;
    int32_t n = 0;
    CHECK_STATUS(ctx, aj_tune(ctx, NULL, op, NULL, &r, &n), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_tune: dev is NULL");
    CHECK_STATUS(ctx, aj_tune(ctx, dev, NULL, NULL, &r, &n), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_tune: op is NULL");
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, NULL, NULL, &n), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "results or count is NULL");
    CHECK(aj_tune(NULL, dev, op, NULL, &r, &n) == AJ_ERR_INVALID_ARG);

    aj_tune_options o = small_problem();
    o.struct_size = 8;
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, &o, &r, &n), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "options->struct_size = 8");
    o = small_problem();
    o.heads_q = 3;
    o.heads_kv = 2;
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, &o, &r, &n), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "heads_q = 3 is not a multiple of heads_kv = 2");
    o = small_problem();
    o.repeats = -1;
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, &o, &r, &n), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "options->repeats = -1 is negative");
    o = small_problem();
    o.budget_s = NAN;
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, &o, &r, &n), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "budget_s");

    aj_op *merge = parse(ctx, "attention merge { dtype = f32 head_dim_v = 32 }");
    CHECK_STATUS(ctx, aj_tune(ctx, dev, merge, NULL, &r, &n), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "merge ops have no schedule to tune");
    aj_op *bad = NULL;
    aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_EFFICIENT, &bad);
    aj_op_set_head_dims(bad, -4, 0);   /* sticky */
    CHECK_STATUS(ctx, aj_tune(ctx, dev, bad, NULL, &r, &n), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_tune: ");
    CHECK(r == NULL && n == 0);   /* untouched on failure */

    aj_schedule s;
    CHECK_STATUS(ctx, aj_tune_lookup(ctx, NULL, op, &s, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_tune_lookup: dev is NULL");
    CHECK_STATUS(ctx, aj_tune_lookup(ctx, dev, op, NULL, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_tune_lookup: schedule is NULL");

    aj_op_destroy(bad);
    aj_op_destroy(merge);
    close_all(ctx, dev, op);
}

int main(void)
{
    static void (*const tests[])(void) = {test_tune_and_reuse, test_budget_and_persistence,
                                          test_cpu, test_errors, NULL};
    if (!temp_dir_run(cache_dir, tests))
        return 1;
    return check_report();
}
