/*
 * test_tune.c -- the autotuner on the sim device: the ranking it returns,
 * what it prunes and why, the budget, the tuning database (written,
 * read back by aj_compile with options.device, damaged entries ignored),
 * that a tuned kernel computes what the default one does, and its errors.
 * Problems are tiny (the emulator times them); about 10 s in all.
 */
#include <math.h>
#include <stdint.h>
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

/* A context with the disk cache, the sim device on it and spec's op. */
static aj_ctx *sim_and(const char *spec, aj_device **dev, aj_op **op)
{
    aj_ctx *ctx = open_on(AJ_CACHE_DEFAULT, AJ_DEVICE_SIM, dev);
    *op = parse(ctx, spec);
    return ctx;
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

/* aj_tune of op on dev with o, which must succeed: the results (*n of
 * them; aj_free them). */
static aj_tune_result *tuned(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                             const aj_tune_options *o, int32_t *n)
{
    aj_tune_result *r = NULL;
    *n = 0;
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, o, &r, n), AJ_OK);
    return r;
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

/* A forward's arguments over contiguous [B, H, S, D] tensors of dtype dt
 * (lse f32 [B, H, S]). */
static aj_fwd_args bhsd_args(aj_dtype dt, void *q, void *k, void *v, void *o, float *lse,
                             int64_t b, int64_t h, int64_t s, int64_t d)
{
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = (aj_tensor){q, dt, 4, {b, h, s, d}, {h * s * d, s * d, d, 1}};
    a.k = a.q;
    a.k.data = k;
    a.v = a.q;
    a.v.data = v;
    a.o = a.q;
    a.o.data = o;
    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {b, h, s}, {h * s, s, 1}};
    return a;
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
    aj_fwd_args a = bhsd_args(AJ_DTYPE_F32, q, kk, v, o, lse, B, H, S, D);
    CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
}

static void test_tune_and_reuse(void)
{
    aj_device *dev;
    aj_op *op;
    aj_ctx *ctx = sim_and(spec_f32, &dev, &op);
    aj_tune_options o = small_problem();
    o.progress = on_progress;
    int32_t n;
    aj_tune_result *r = tuned(ctx, dev, op, &o, &n);
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
    aj_op *op;
    aj_ctx *ctx = sim_and("attention forward efficient { dtype = f16 head_dim = 16 }", &dev, &op);
    aj_tune_options o = small_problem();
    o.budget_s = 1e-9;     /* spent by compiling: only the first candidate is timed */
    o.no_persist = true;
    int32_t n;
    aj_tune_result *r = tuned(ctx, dev, op, &o, &n);
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

/* Runs a flash forward kernel of `spec_f16_flash`'s shapes on fixed f16
 * inputs; o gets the output (as f32). */
enum { FB = 1, FH = 2, FS = 72, FD = 32 };
static void run_flash(aj_ctx *ctx, aj_device *dev, const aj_kernel *k, float *out)
{
    static uint16_t q[FB * FH * FS * FD], kk[FB * FH * FS * FD], v[FB * FH * FS * FD],
        o[FB * FH * FS * FD];
    static float lse[FB * FH * FS];
    for (int i = 0; i < FB * FH * FS * FD; i++) {
        /* small f16 values from their bits: sign, exponent 12..13, a mantissa */
        q[i] = (uint16_t)(((i * 7) % 2) << 15 | (12 + i % 2) << 10 | (i * 37) % 1024);
        kk[i] = (uint16_t)(((i * 3) % 2) << 15 | (12 + i % 2) << 10 | (i * 53) % 1024);
        v[i] = (uint16_t)(((i * 5) % 2) << 15 | 13 << 10 | (i * 11) % 1024);
    }
    aj_fwd_args a = bhsd_args(AJ_DTYPE_F16, q, kk, v, o, lse, FB, FH, FS, FD);
    CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
    for (int i = 0; i < FB * FH * FS * FD; i++) {   /* f16 -> f32 (normal values only) */
        uint32_t s = (uint32_t)(o[i] >> 15), e = (o[i] >> 10) & 31, m = o[i] & 1023;
        float f = e ? ldexpf(1.0f + (float)m / 1024.0f, (int)e - 15)
                    : ldexpf((float)m / 1024.0f, -14);
        out[i] = s ? -f : f;
    }
}

static const char *const spec_f16_flash =
    "attention forward flash { dtype = f16 head_dim = 32 mask = causal(top_left) }";

/* Writes the tuning database's one entry for the tests' cache (the file
 * aj_tune wrote) over with `text`'s schedule and kernel lines. */
static void rewrite_entry(const char *schedule_line, const char *kernel_line, int version)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "for f in %s/tuning/*.tune; do sed -i -e 's/^attnjit-tune .*/attnjit-tune %d/' "
             "-e 's/^schedule .*/%s/' -e '/^kernel /d' $f; %s%s%s done",
             cache_dir, version, schedule_line, kernel_line ? "echo '" : "",
             kernel_line ? kernel_line : "", kernel_line ? "' >> $f;" : "");
    CHECK(system(cmd) == 0);
}

/* With options->wgmma = 1 on sim, a flash forward's space holds the wgmma
 * kernels (warpgroups 1 and 2, producer 0 and 1): they are compiled,
 * deduplicated and timed beside mma.sync's; the database records the
 * winner's warpgroups, aj_tune_lookup_result reads them back, and
 * aj_compile for the device compiles that kernel, which computes what the
 * default does.  A hand-written entry names each kernel kind in turn; a
 * first-version entry (no kernel line) still reads, as mma.sync; a
 * warpgroups value the op cannot take is a damaged entry. */
static void test_wgmma(void)
{
    aj_device *dev;
    aj_op *op;
    aj_ctx *ctx = sim_and(spec_f16_flash, &dev, &op);
    aj_tune_options o = small_problem();
    o.seq_q = FS;
    int32_t n;
    aj_tune_result *r = tuned(ctx, dev, op, &o, &n);   /* the sim's default: no wgmma */
    for (int32_t i = 0; i < n; i++)
        CHECK_MSG(r[i].warpgroups == 0, "result %d: warpgroups %d without options->wgmma", i,
                  r[i].warpgroups);
    aj_free(r);
    o.wgmma = 1;
    r = tuned(ctx, dev, op, &o, &n);
    int timed_by[3][2] = {{0}};
    for (int32_t i = 0; i < n; i++) {
        CHECK(r[i].warpgroups >= 0 && r[i].warpgroups <= 2 && r[i].producer >= 0 &&
              r[i].producer <= 1 && (r[i].warpgroups || !r[i].producer));
        if (!r[i].timed)
            continue;
        timed_by[r[i].warpgroups][r[i].producer]++;
        if (r[i].warpgroups)   /* 64 rows a warpgroup on 4 warps each */
            CHECK(r[i].schedule.block_m == 64 * r[i].warpgroups &&
                  r[i].schedule.warps == 4 * r[i].warpgroups);
        for (int32_t j = 0; j < i; j++)
            CHECK_MSG(!r[j].timed || !same_schedule(&r[j].schedule, &r[i].schedule) ||
                          r[j].warpgroups != r[i].warpgroups || r[j].producer != r[i].producer,
                      "the kernel of result %d timed twice", i);
    }
    CHECK_MSG(timed_by[0][0] > 5 && timed_by[1][0] >= 3 && timed_by[2][0] >= 3 &&
                  timed_by[1][1] >= 3 && timed_by[2][1] >= 3,
              "timed: mma.sync %d, wgmma x1 %d / x2 %d, producer x1 %d / x2 %d",
              timed_by[0][0], timed_by[1][0], timed_by[2][0], timed_by[1][1], timed_by[2][1]);
    printf("tune on sim with wgmma: %d candidates, timed: mma.sync %d, wgmma x1 %d / x2 %d, "
           "producer x1 %d / x2 %d; the winner: warpgroups %d producer %d\n", n,
           timed_by[0][0], timed_by[1][0], timed_by[2][0], timed_by[1][1], timed_by[2][1],
           r[0].warpgroups, r[0].producer);
    aj_tune_result best;
    CHECK_STATUS(ctx, aj_tune_lookup_result(ctx, dev, op, &best), AJ_OK);
    CHECK(same_schedule(&best.requested, &r[0].requested) &&
          best.warpgroups == r[0].warpgroups && best.producer == r[0].producer && best.timed &&
          fabs(best.median_ms - r[0].median_ms) < 1e-5);
    aj_free(r);

    /* each kernel kind from the database: the launch has its threads, and
     * its output is the default kernel's */
    aj_compile_options copt = AJ_COMPILE_OPTIONS_INIT;
    copt.target = AJ_TARGET_SIM;
    aj_kernel *plain = NULL;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &copt, &plain), AJ_OK);
    static float o_plain[FB * FH * FS * FD], o_tuned[FB * FH * FS * FD];
    run_flash(ctx, dev, plain, o_plain);
    static const struct {
        const char *schedule, *kernel;
        int version, threads;
    } entries[] = {
        {"schedule 0 64 0 2", "kernel warpgroups 2 producer 1", 2, 384},
        {"schedule 0 32 0 3", "kernel warpgroups 1 producer 0", 2, 128},
        {"schedule 64 32 4 2", "kernel warpgroups 0 producer 0", 2, 128},
        {"schedule 32 64 2 1", NULL, 1, 64},
    };
    copt.device = dev;
    for (size_t e = 0; e < sizeof entries / sizeof entries[0]; e++) {
        rewrite_entry(entries[e].schedule, entries[e].kernel, entries[e].version);
        aj_ctx *later = new_ctx(AJ_CACHE_DEFAULT);
        aj_kernel *k = NULL;
        CHECK_STATUS(later, aj_compile(later, op, &copt, &k), AJ_OK);
        aj_launch_info li;
        CHECK_STATUS(later, aj_kernel_launch_info(k, &li), AJ_OK);
        CHECK_MSG(li.block[0] == entries[e].threads, "entry %zu: %d threads, not %d", e,
                  li.block[0], entries[e].threads);
        run_flash(later, dev, k, o_tuned);
        double worst = 0;
        for (int i = 0; i < FB * FH * FS * FD; i++)
            worst = fmax(worst, fabs((double)o_tuned[i] - o_plain[i]));
        CHECK_MSG(worst < 2e-3, "entry %zu: the tuned kernel differs by %g", e, worst);
        aj_kernel_destroy(k);
        aj_ctx_destroy(later);
    }
    /* damaged, ignored -- the compile for the device takes the default:
     * warpgroups 3, a producer without warpgroups, a value past int8_t, a
     * second version's entry without its kernel line */
    aj_launch_info lp;
    CHECK_STATUS(ctx, aj_kernel_launch_info(plain, &lp), AJ_OK);
    static const char *const damaged[] = {"kernel warpgroups 3 producer 0",
                                          "kernel warpgroups 0 producer 1",
                                          "kernel warpgroups 258 producer 0", NULL};
    for (size_t e = 0; e < sizeof damaged / sizeof damaged[0]; e++) {
        rewrite_entry("schedule 0 0 0 0", damaged[e], 2);
        CHECK_STATUS(ctx, aj_tune_lookup_result(ctx, dev, op, &best), AJ_ERR_IO);
        CHECK_ERROR(ctx, "is damaged; ignored");
        aj_kernel *k = NULL;
        CHECK_STATUS(ctx, aj_compile(ctx, op, &copt, &k), AJ_OK);
        aj_launch_info li;
        aj_kernel_launch_info(k, &li);
        CHECK_MSG(li.block[0] == lp.block[0] && same_schedule(&li.schedule, &lp.schedule),
                  "damaged entry %zu: compiled %d threads, the default %d", e, li.block[0],
                  lp.block[0]);
        aj_kernel_destroy(k);
    }
    aj_kernel_destroy(plain);
    close_all(ctx, dev, op);
}

/* A flash backward's wgmma candidates on sim: warpgroups 1 and 2 walking
 * block_m (16, 32, 64: block_n is the warpgroups'), never a producer (the
 * backward is not warp specialised), timed beside mma.sync's. */
static void test_wgmma_backward(void)
{
    aj_device *dev;
    aj_op *op;
    aj_ctx *ctx = sim_and("attention backward flash { dtype = bf16 head_dim = 16 }", &dev, &op);
    aj_tune_options o = small_problem();
    o.seq_q = 16;
    o.no_persist = true;
    o.wgmma = 1;
    int32_t n;
    aj_tune_result *r = tuned(ctx, dev, op, &o, &n);
    int plain = 0, by_wg[3] = {0}, rows[3][65] = {{0}};
    for (int32_t i = 0; i < n; i++) {
        CHECK_MSG(!r[i].producer, "result %d: a producer on a backward", i);
        if (!r[i].timed)
            continue;
        int g = r[i].warpgroups;
        plain += !g;
        if (!g)
            continue;
        by_wg[g]++;
        CHECK(r[i].schedule.block_n == 64 * g && r[i].schedule.warps == 4 * g);
        int bm = r[i].schedule.block_m;
        CHECK_MSG(bm == 16 || bm == 32 || bm == 64, "result %d: block_m %d", i, bm);
        if (bm == 16 || bm == 32 || bm == 64)
            rows[g][bm]++;
    }
    printf("tune a backward on sim with wgmma: timed mma.sync %d, wgmma x1 %d / x2 %d\n", plain,
           by_wg[1], by_wg[2]);
    CHECK(plain > 5);
    for (int g = 1; g <= 2; g++)
        CHECK_MSG(rows[g][16] && rows[g][32] && rows[g][64],
                  "wgmma x%d: block_m 16 / 32 / 64 timed %d / %d / %d times", g, rows[g][16],
                  rows[g][32], rows[g][64]);
    aj_free(r);
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
    int32_t n;
    aj_tune_result *r = tuned(ctx, dev, op, &o, &n);
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
    o = small_problem();
    o.wgmma = 2;
    CHECK_STATUS(ctx, aj_tune(ctx, dev, op, &o, &r, &n), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "options->wgmma = 2; want 0 (mma.sync only) or 1");
    CHECK_STATUS(ctx, aj_tune_lookup_result(ctx, dev, op, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_tune_lookup_result: out is NULL");

    aj_op *merge = parse(ctx, "attention merge { dtype = f32 head_dim_v = 32 }");
    CHECK_STATUS(ctx, aj_tune(ctx, dev, merge, NULL, &r, &n), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "merge ops have no schedule to tune");
    aj_op *paged = parse(ctx, "attention forward flash { dtype = bf16 head_dim = 576 "
                              "head_dim_v = 512 scale = 0.07 layout = paged kv_shared = true }");
    CHECK_STATUS(ctx, aj_tune(ctx, dev, paged, NULL, &r, &n), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "aj_tune: layout = paged ops are not tuned");
    aj_op_destroy(paged);
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

/* `test_tune cuda` (the stand-in libcuda as a 9.0 GPU, emulated
 * launches): every candidate that runs wgmma is compiled for sm_90a, as
 * aj_compile for the device makes it -- an op with its own warpgroups
 * tunes (compiled for the device's sm_90 every candidate was refused),
 * and a plain flash op's wgmma winner, written to the database, compiles
 * for sm_90a through the device. */
static void test_cuda_hopper(void)
{
    aj_device *dev;
    aj_ctx *ctx = open_on(AJ_CACHE_DEFAULT, AJ_DEVICE_CUDA, &dev);
    if (!dev || aj_device_target(dev) != AJ_TARGET_SM_90) {
        CHECK_MSG(0, "the stand-in device is not a 9.0 GPU");
        aj_device_close(dev);
        aj_ctx_destroy(ctx);
        return;
    }
    aj_op *own = parse(ctx, "attention forward flash { dtype = f16 head_dim = 16 "
                            "schedule = (warpgroups = 2) }");
    aj_tune_options o = small_problem();
    o.seq_q = 16;
    o.no_persist = true;
    int32_t n;
    aj_tune_result *r = tuned(ctx, dev, own, &o, &n);
    int timed = 0;
    for (int32_t i = 0; i < n; i++)
        timed += r[i].timed;
    CHECK_MSG(timed >= 6, "an op with its own warpgroups: %d candidates timed", timed);
    aj_free(r);
    aj_op_destroy(own);

    aj_op *op = parse(ctx, spec_f16_flash);
    o.no_persist = false;
    o.wgmma = 1;
    r = tuned(ctx, dev, op, &o, &n);
    int wgmma = 0;
    for (int32_t i = 0; i < n; i++)
        wgmma += r[i].timed && r[i].warpgroups;
    CHECK_MSG(wgmma >= 12, "%d wgmma candidates timed on the 9.0 stand-in", wgmma);
    aj_free(r);
    rewrite_entry("schedule 0 64 0 2", "kernel warpgroups 2 producer 0", 2);
    aj_compile_options copt = AJ_COMPILE_OPTIONS_INIT;
    copt.device = dev;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &copt, &k), AJ_OK);
    CHECK(aj_kernel_target(k) == AJ_TARGET_SM_90A);
    aj_launch_info li;
    CHECK_STATUS(ctx, aj_kernel_launch_info(k, &li), AJ_OK);
    CHECK(li.block[0] == 256 && li.schedule.block_n == 64);
    aj_kernel_destroy(k);
    close_all(ctx, dev, op);
}

int main(int argc, char **argv)
{
    static void (*const tests[])(void) = {test_tune_and_reuse, test_budget_and_persistence,
                                          test_wgmma, test_wgmma_backward, test_cpu,
                                          test_errors, NULL};
    static void (*const cuda_tests[])(void) = {test_cuda_hopper, NULL};
    int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (!temp_dir_run(cache_dir, cuda ? cuda_tests : tests))
        return 1;
    return check_report();
}
