/*
 * tune.c -- the autotuner and its database.
 *
 *   op ──► space (block_m x block_n x warps x stages [x cpu threads]
 *                 [+ the wgmma kernels: warpgroups x producer x tiles])
 *      ──► compile all in parallel ── template rejects ──► pruned
 *      ──► (cuda) driver: spills / too many threads ──► pruned
 *      ──► dedupe (same resolved schedule) ──► time each on the device, random inputs
 *      ──► rank ──► best into <cache dir>/tuning/<op hash>-<device key>.tune
 *
 * aj_compile with options.device set reads the same file back, so a tuned
 * spec gets its schedule with no change to the caller's code.  The
 * database is one small text file per (op, device): a damaged one is
 * ignored (and logged), never used.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "ir/op.h"
#include "runtime/cache.h"
#include "runtime/runtime.h"
#include "runtime/tune.h"

static const int32_t space_block_m[] = {16, 32, 64, 128};
static const int32_t space_block_n[] = {16, 32, 64, 128};
static const int32_t space_warps[] = {1, 2, 4, 8};
static const int32_t space_stages[] = {1, 2, 3};

/* The wgmma kernels' (schedule warpgroups): block_m and warps follow the
 * warpgroups in the forward, block_n in the backward, so each walks one
 * tile field (0: its default); the rest the template refuses. */
static const int32_t space_wg_tile[] = {0, 16, 32, 64, 128};
#define WGMMA_SPACE (2 * 2 * AJ_COUNT_OF(space_wg_tile) * AJ_COUNT_OF(space_stages))

#define SPACE_SIZE (1 + AJ_COUNT_OF(space_block_m) * AJ_COUNT_OF(space_block_n) *         \
                        AJ_COUNT_OF(space_warps) * AJ_COUNT_OF(space_stages) + WGMMA_SPACE)

/* The public result's tail holds warpgroups and producer in the first
 * version's padding: the size must not have moved. */
typedef struct tune_result_v1 {
    aj_schedule requested, schedule;
    int32_t workers;
    aj_status status;
    bool timed;
    char message[256];
    double median_ms, min_ms;
    bool is_default;
} tune_result_v1;
_Static_assert(sizeof(aj_tune_result) == sizeof(tune_result_v1),
               "aj_tune_result's size is its first version's (arrays keep their stride)");
/* cpu: thread counts 1, 2, 4, ... up to the device's, and the device's */
#define MAX_WORKER_CHOICES 12

/* ---------------------------------------------------------------- database */

/* The file of (op, dev): the op's hash with its schedule cleared (the
 * schedule is what is tuned) and a digest of the device's kind, name,
 * target and driver version.  Returns 0 and fills path (and the readable
 * device line) or -1 when there is no database (no disk cache). */
static int db_path(aj_ctx *ctx, const aj_device *dev, const aj_op *op, char *path,
                   size_t cap, char *device_line, size_t line_cap, char op_hash[17])
{
    aj_kernel_cache *cache = aj_cache_of(ctx);
    const char *dir = cache ? aj_cache_disk_dir(cache) : NULL;
    if (!dir)
        return -1;
    aj_op plain = *op;
    memset(&plain.schedule, 0, sizeof plain.schedule);
    if (aj_op_hash(&plain, op_hash) != AJ_OK)
        return -1;
    aj_device_caps caps = AJ_DEVICE_CAPS_INIT;
    if (aj_device_get_caps(dev, &caps) != AJ_OK)
        return -1;
    snprintf(device_line, line_cap, "%d|%s|%s|driver %d", (int)caps.kind, aj_device_name(dev),
             aj_target_name(caps.target), caps.driver_version);
    unsigned long long key = XXH3_64bits(device_line, strlen(device_line));
    snprintf(path, cap, "%s/tuning/%s-%016llx.tune", dir, op_hash, key);
    return 0;
}

aj_status aj_tune_db_lookup(aj_ctx *ctx, const aj_device *dev, const aj_op *op,
                            aj_tune_entry *out)
{
    char path[1024], device_line[256], hash[17];
    if (db_path(ctx, dev, op, path, sizeof path, device_line, sizeof device_line, hash) != 0)
        return aj_fail(ctx, AJ_ERR_IO, "aj_tune_lookup: the tuning database is off (the "
                       "kernel cache has no disk directory)");
    FILE *f = fopen(path, "r");
    if (!f)
        return aj_fail(ctx, AJ_ERR_IO, "aj_tune_lookup: no tuned schedule for op %s on %s "
                       "(%s)", hash, aj_device_name(dev), path);
    char line[512], got_hash[64] = "", got_device[256] = "";
    aj_tune_entry e = {0};
    int fields = 0, magic = 0, kernel = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (strcmp(line, "attnjit-tune 1") == 0 || strcmp(line, "attnjit-tune 2") == 0)
            magic = line[13] - '0';   /* 2 adds the kernel line */
        else if (sscanf(line, "kernel warpgroups %d producer %d", &e.warpgroups, &e.producer) == 2)
            kernel++;
        else if (sscanf(line, "op %63s", got_hash) == 1)
            fields++;
        else if (strncmp(line, "device ", 7) == 0)
            fields += snprintf(got_device, sizeof got_device, "%s", line + 7) > 0;
        else if (sscanf(line, "schedule %d %d %d %d", &e.schedule.block_m, &e.schedule.block_n,
                        &e.schedule.warps, &e.schedule.stages) == 4)
            fields++;
        else if (sscanf(line, "workers %d", &e.workers) == 1)
            fields++;
        else if (sscanf(line, "median_ms %lf", &e.median_ms) == 1)
            fields++;
    }
    fclose(f);
    aj_op tuned = *op;
    tuned.schedule = e.schedule;
    if (e.warpgroups || e.producer) {   /* the op's own are in the key: the same */
        tuned.warpgroups = e.warpgroups;
        tuned.producer = e.producer;
    }
    char msg[256];
    aj_field field;
    if (!magic || fields != 5 || kernel != (magic == 2) || strcmp(got_hash, hash) != 0 ||
        e.warpgroups < 0 || e.warpgroups > AJ_WARPGROUPS_MAX || e.producer < 0 ||
        e.producer > 1 ||
        strcmp(got_device, device_line) != 0 || e.workers < 0 ||
        aj_op_check(&tuned, &field, msg, sizeof msg) != AJ_OK) {
        aj_log(ctx, AJ_LOG_WARN, "tuning database: %s is damaged; ignored", path);
        return aj_fail(ctx, AJ_ERR_IO, "aj_tune_lookup: %s is damaged; ignored", path);
    }
    *out = e;
    return AJ_OK;
}

/* Writes the entry to a temporary file and renames it into place, so a
 * reader sees the old entry or the new one, never half of one. */
static aj_status db_store(aj_ctx *ctx, const aj_device *dev, const aj_op *op,
                          const aj_tune_entry *e)
{
    char path[1024], device_line[256], hash[17], dir[1024], temp[1100];
    if (db_path(ctx, dev, op, path, sizeof path, device_line, sizeof device_line, hash) != 0)
        return AJ_OK;   /* no database: nothing to keep (documented) */
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return aj_fail(ctx, AJ_ERR_IO, "tuning database: cannot create %s: %s", dir,
                       strerror(errno));
    snprintf(temp, sizeof temp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(temp, "w");
    if (!f)
        return aj_fail(ctx, AJ_ERR_IO, "tuning database: cannot write %s: %s", temp,
                       strerror(errno));
    fprintf(f, "attnjit-tune 2\nop %s\ndevice %s\nschedule %d %d %d %d\n"
            "kernel warpgroups %d producer %d\nworkers %d\nmedian_ms %.6f\n", hash, device_line,
            e->schedule.block_m, e->schedule.block_n, e->schedule.warps, e->schedule.stages,
            e->warpgroups, e->producer, e->workers, e->median_ms);
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    if (bad || rename(temp, path) != 0) {
        unlink(temp);
        return aj_fail(ctx, AJ_ERR_IO, "tuning database: cannot write %s", path);
    }
    return AJ_OK;
}

/* The public lookups' checks (`who` names the call, `out` its output)
 * and the entry. */
static aj_status lookup(aj_ctx *ctx, const aj_device *dev, const aj_op *op, const char *who,
                        const char *out_name, const void *out, aj_tune_entry *e)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, dev, "%s: dev is NULL", who);
    AJ_CHECK_ARG(ctx, op, "%s: op is NULL", who);
    AJ_CHECK_ARG(ctx, out, "%s: %s is NULL", who, out_name);
    return aj_tune_db_lookup(ctx, dev, op, e);
}

aj_status aj_tune_lookup(aj_ctx *ctx, const aj_device *dev, const aj_op *op,
                         aj_schedule *schedule, int32_t *workers)
{
    aj_tune_entry e;
    aj_status st = lookup(ctx, dev, op, "aj_tune_lookup", "schedule", schedule, &e);
    if (st != AJ_OK)
        return st;
    *schedule = e.schedule;
    if (workers)
        *workers = e.workers;
    return AJ_OK;
}

aj_status aj_tune_lookup_result(aj_ctx *ctx, const aj_device *dev, const aj_op *op,
                                aj_tune_result *out)
{
    aj_tune_entry e;
    aj_status st = lookup(ctx, dev, op, "aj_tune_lookup_result", "out", out, &e);
    if (st != AJ_OK)
        return st;
    *out = (aj_tune_result){.requested = e.schedule, .workers = e.workers, .timed = true,
                            .median_ms = e.median_ms, .warpgroups = (int8_t)e.warpgroups,
                            .producer = (int8_t)e.producer};
    return AJ_OK;
}

/* ---------------------------------------------------------------- problem */

/* Device buffers of one problem, with random contents, and the args that
 * point at them. */
typedef struct problem {
    aj_device *dev;
    aj_op_info op;
    void *bufs[16];
    int nbufs;
    aj_fwd_args fwd;
    aj_bwd_args bwd;
    const aj_kernel *kernel;   /* the candidate being timed */
    void *stream;              /* the tuner's own: the launches and their events */
    aj_ctx *ctx;
} problem;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A [d0, d1, d2, d3] (rank 4) or [d0, d1, d2] (rank 3) contiguous tensor
 * on the device, uniform in [lo, hi]. */
static aj_status new_tensor(problem *p, aj_dtype dtype, int rank, const int64_t *shape,
                            double lo, double hi, aj_tensor *out)
{
    aj_status st = AJ_OK;
    size_t n = 1;
    for (int i = 0; i < rank; i++)
        n *= (size_t)shape[i];
    float *host = malloc(n * sizeof *host);
    void *conv = malloc(n * 4);
    void *buf = NULL;
    if (!host || !conv) {
        st = aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "aj_tune: out of memory");
        goto done;
    }
    uint64_t seed = 0x9e3779b97f4a7c15ull + (uint64_t)p->nbufs;
    for (size_t i = 0; i < n; i++)
        host[i] = (float)(lo + (hi - lo) * (double)(rng_next(&seed) >> 11) * 0x1p-53);
    AJ_TRY(aj_convert(host, AJ_DTYPE_F32, conv, dtype, n));
    size_t bytes = n * (dtype == AJ_DTYPE_F32 ? 4 : 2);
    AJ_TRY(aj_device_alloc(p->dev, bytes, &buf));
    p->bufs[p->nbufs++] = buf;
    AJ_TRY(aj_device_copy_to(p->dev, buf, conv, bytes));
    memset(out, 0, sizeof *out);
    out->data = buf;
    out->dtype = dtype;
    out->rank = rank;
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        out->shape[i] = shape[i];
        out->strides[i] = stride;
        stride *= shape[i];
    }
done:
    free(host);
    free(conv);
    return st;
}

static aj_status problem_init(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                              const aj_tune_options *o, problem *p)
{
    aj_status st = AJ_OK;
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    p->dev = dev;
    AJ_TRY(aj_device_stream_create(dev, &p->stream));
    aj_op_get_info(op, &p->op);
    const aj_op_info *oi = &p->op;
    int64_t B = o->batch, Hq = o->heads_q, Hk = o->heads_kv, Sq = o->seq_q, Sk = o->seq_k;
    int64_t D = oi->head_dim, Dv = oi->head_dim_v;
    aj_dtype t = oi->dtype;
    aj_tensor q, k, v, o_, lse, dO, dq, dk, dv, slopes = {0}, bias = {0}, dbias = {0};
    AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hq, Sq, D}, -1, 1, &q));
    AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hk, Sk, D}, -1, 1, &k));
    AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hk, Sk, Dv}, -1, 1, &v));
    if (aj_op_info_alibi_slopes(oi))
        AJ_TRY(new_tensor(p, AJ_DTYPE_F32, 1, (int64_t[]){Hq}, 0.01, 0.5, &slopes));
    if (oi->bias == AJ_BIAS_ADD)
        AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hq, Sq, Sk}, -1, 1, &bias));
    /* a plausible LSE: log of the key count, so P stays finite */
    double log_sk = log((double)(Sk > 0 ? Sk : 1));
    AJ_TRY(new_tensor(p, AJ_DTYPE_F32, 3, (int64_t[]){B, Hq, Sq}, log_sk, log_sk + 1, &lse));
    if (oi->kind == AJ_KIND_FORWARD) {
        aj_fwd_args *a = &p->fwd;
        *a = (aj_fwd_args){.struct_size = sizeof *a, .q = q, .k = k, .v = v, .lse = lse,
                           .alibi_slopes = slopes, .bias = bias, .seed = 1, .stream = p->stream};
        if (oi->accumulate)
            AJ_TRY(new_tensor(p, AJ_DTYPE_F32, 4, (int64_t[]){B, Hq, Sq, Dv}, -1, 1, &a->o_acc));
        else
            AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hq, Sq, Dv}, 0, 0, &a->o));
        return AJ_OK;
    }
    AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hq, Sq, Dv}, -1, 1, &o_));
    AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hq, Sq, Dv}, -1, 1, &dO));
    AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hq, Sq, D}, 0, 0, &dq));
    AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hk, Sk, D}, 0, 0, &dk));
    AJ_TRY(new_tensor(p, t, 4, (int64_t[]){B, Hk, Sk, Dv}, 0, 0, &dv));
    if (oi->bias == AJ_BIAS_ADD)
        AJ_TRY(new_tensor(p, AJ_DTYPE_F32, 4, (int64_t[]){B, Hq, Sq, Sk}, 0, 0, &dbias));
    p->bwd = (aj_bwd_args){.struct_size = sizeof p->bwd, .q = q, .k = k, .v = v, .o = o_,
                           .lse = lse, .do_ = dO, .dq = dq, .dk = dk, .dv = dv,
                           .alibi_slopes = slopes, .bias = bias, .dbias = dbias, .seed = 1,
                           .stream = p->stream};
done:
    return st;
}

static void problem_free(problem *p)
{
    for (int i = 0; i < p->nbufs; i++)
        aj_device_free(p->dev, p->bufs[i]);
    p->nbufs = 0;
    aj_device_stream_destroy(p->dev, p->stream);
    p->stream = NULL;
}

/* One launch of the candidate (queued, for cuda). */
static aj_status problem_run(void *user)
{
    problem *p = user;
    if (p->op.kind == AJ_KIND_FORWARD)
        return aj_forward(p->ctx, p->dev, p->kernel, &p->fwd);
    return aj_backward(p->ctx, p->dev, p->kernel, &p->bwd);
}

/* Milliseconds of one launch on the tuner's stream: CUDA events on a GPU,
 * else the wall clock around the (synchronous) launch. */
static aj_status time_once(problem *p, double *ms)
{
    return aj_device_time(p->dev, p->stream, problem_run, p, ms);
}

/* ---------------------------------------------------------------- tuner */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Timed first (fastest first), then those the budget left out, then the
 * pruned; ties keep the space's order. */
static int rank_of(const aj_tune_result *r)
{
    return r->status != AJ_OK ? 2 : r->timed ? 0 : 1;
}

static int cmp_result(const void *a, const void *b)
{
    const aj_tune_result *x = a, *y = b;
    if (rank_of(x) != rank_of(y))
        return rank_of(x) - rank_of(y);
    if (rank_of(x) == 0 && x->median_ms != y->median_ms)
        return x->median_ms < y->median_ms ? -1 : 1;
    return 0;
}

static void defaults_for(const aj_device *dev, aj_tune_options *o)
{
    const int32_t b = dev->ops->tune_batch, h = dev->ops->tune_heads, s = dev->ops->tune_seq;
    if (!o->batch)
        o->batch = b;
    if (!o->heads_q)
        o->heads_q = h;
    if (!o->heads_kv)
        o->heads_kv = o->heads_q;
    if (!o->seq_q)
        o->seq_q = s;
    if (!o->seq_k)
        o->seq_k = o->seq_q;
    if (!o->warmup)
        o->warmup = 1;
    if (!o->repeats)
        o->repeats = 5;
}

static aj_status read_tune_options(aj_ctx *ctx, const aj_device *dev,
                                   const aj_tune_options *in, aj_tune_options *o)
{
    *o = (aj_tune_options)AJ_TUNE_OPTIONS_INIT;
    if (in) {
        /* every field is optional: the first version held the sizes */
        aj_status st = AJ_READ_STRUCT(ctx, "aj_tune: options", in, aj_tune_options, seq_k,
                                      AJ_TUNE_OPTIONS_INIT, o);
        if (st != AJ_OK)
            return st;
    }
    const struct {
        const char *name;
        int32_t value;
    } counts[] = {{"batch", o->batch},     {"heads_q", o->heads_q}, {"heads_kv", o->heads_kv},
                  {"seq_q", o->seq_q},     {"seq_k", o->seq_k},     {"warmup", o->warmup},
                  {"repeats", o->repeats}, {"compile_workers", o->compile_workers}};
    for (size_t i = 0; i < AJ_COUNT_OF(counts); i++)
        AJ_CHECK_ARG(ctx, counts[i].value >= 0, "aj_tune: options->%s = %d is negative",
                     counts[i].name, counts[i].value);
    AJ_CHECK_ARG(ctx, o->budget_s >= 0 && isfinite(o->budget_s),
                 "aj_tune: options->budget_s = %g is not a non-negative number", o->budget_s);
    AJ_CHECK_ARG(ctx, o->repeats <= 1000 && o->warmup <= 1000,
                 "aj_tune: options->repeats and warmup must be at most 1000");
    AJ_CHECK_ARG(ctx, o->wgmma == 0 || o->wgmma == 1,
                 "aj_tune: options->wgmma = %d; want 0 (mma.sync only) or 1 (the wgmma kernels "
                 "too, where the device runs them)", o->wgmma);
    defaults_for(dev, o);
    AJ_CHECK_ARG(ctx, o->heads_q % o->heads_kv == 0,
                 "aj_tune: options->heads_q = %d is not a multiple of heads_kv = %d",
                 o->heads_q, o->heads_kv);
    return AJ_OK;
}

static void progress(const aj_tune_options *o, int32_t done, int32_t total, const char *what)
{
    if (o->progress)
        o->progress(o->progress_user, done, total, what);
}

/* Prunes a compiled candidate the GPU cannot run well: spills, or a block
 * larger than the driver allows at its register count. */
static void prune_by_driver(aj_ctx *ctx, aj_device *dev, const aj_kernel *k, aj_tune_result *r)
{
    for (int s = 0; s < aj_kernel_num_stages(k) && r->status == AJ_OK; s++) {
        aj_cuda_resources res;
        aj_status st = aj_device_stage_resources(ctx, dev, k, s, &res);
        int threads = k->stages[s].launch.block[0] * k->stages[s].launch.block[1] *
                      k->stages[s].launch.block[2];
        if (st != AJ_OK) {
            r->status = st;
            snprintf(r->message, sizeof r->message, "%s", aj_last_error(ctx));
        } else if (res.local_bytes > 0) {
            r->status = AJ_ERR_UNSUPPORTED;
            snprintf(r->message, sizeof r->message, "stage %d spills: %d bytes of local "
                     "memory per thread at %d registers", s, res.local_bytes, res.registers);
        } else if (res.max_threads < threads) {
            r->status = AJ_ERR_UNSUPPORTED;
            snprintf(r->message, sizeof r->message, "stage %d needs %d threads; the driver "
                     "allows %d at %d registers", s, threads, res.max_threads, res.registers);
        }
    }
}

/* cpu: each kernel that survived pruning becomes one candidate per thread
 * count (1, 2, 4, ... and the device's own count); the pruned stay one
 * entry each.  Rewrites res / job_of in place from the back; returns the
 * new count and updates *alive. */
static int expand_workers(const aj_device *dev, aj_tune_result *res, int *job_of, int n,
                          int *alive)
{
    int32_t choices[MAX_WORKER_CHOICES], nc = 0, most = aj_device_workers(dev);
    for (int32_t w = 1; w < most && nc < MAX_WORKER_CHOICES - 1; w *= 2)
        choices[nc++] = w;
    choices[nc++] = most;
    int total = 0;
    for (int i = 0; i < n; i++)
        total += res[i].status == AJ_OK ? nc : 1;
    int out = total;
    for (int i = n - 1; i >= 0; i--) {
        aj_tune_result r = res[i];
        int copies = r.status == AJ_OK ? nc : 1;
        for (int c = copies - 1; c >= 0; c--) {
            res[--out] = r;
            res[out].workers = r.status == AJ_OK ? choices[c] : 0;
            /* the default schedule on the device's own thread count is
             * the baseline */
            res[out].is_default = r.is_default && choices[c] == most;
            job_of[out] = i;
        }
    }
    *alive *= nc;
    return total;
}

/* Whether op's space holds the wgmma kernels on dev (options->wgmma): a
 * flash forward or backward of 16-bit inputs that sets no warpgroups, on
 * a device that runs them (sm_90a code, or a target with wgmma: sim). */
static int wgmma_space(const aj_device *dev, const aj_op *op, int32_t wanted)
{
    if (!wanted || op->variant != AJ_VARIANT_FLASH || op->warpgroups || aj_op_has_f8(op) ||
        op->dtype == AJ_DTYPE_F32)
        return 0;
    return aj_target_desc_of(aj_device_target(dev))->wgmma ||
           aj_device_runs(dev, AJ_TARGET_SM_90A);
}

/* The space into res: the template's default first, then every
 * combination (the cpu target has tiles, but no warps or pipeline
 * stages), then with `wgmma` the wgmma kernels (producer on forwards
 * only); returns how many. */
static int fill_space(aj_tune_result *res, int simt, int wgmma, aj_kind kind)
{
    int n = 0;
    res[n++].is_default = true;
    for (size_t a = 0; a < AJ_COUNT_OF(space_block_m); a++)
        for (size_t b = 0; b < AJ_COUNT_OF(space_block_n); b++)
            for (size_t w = 0; w < (simt ? AJ_COUNT_OF(space_warps) : 1); w++)
                for (size_t s = 0; s < (simt ? AJ_COUNT_OF(space_stages) : 1); s++)
                    res[n++].requested = (aj_schedule){
                        space_block_m[a], space_block_n[b], simt ? space_warps[w] : 0,
                        simt ? space_stages[s] : 0};
    int fwd = kind == AJ_KIND_FORWARD;
    for (int g = 1; wgmma && g <= 2; g++)
        for (int producer = 0; producer <= fwd; producer++)
            for (size_t t = 0; t < AJ_COUNT_OF(space_wg_tile); t++)
                for (size_t s = 0; s < AJ_COUNT_OF(space_stages); s++) {
                    aj_tune_result *r = &res[n++];
                    r->requested = (aj_schedule){.block_m = fwd ? 0 : space_wg_tile[t],
                                                 .block_n = fwd ? space_wg_tile[t] : 0,
                                                 .stages = space_stages[s]};
                    r->warpgroups = (int8_t)g;
                    r->producer = (int8_t)producer;
                }
    return n;
}

/* Whether two candidates are the same kernel: the same resolved schedule
 * on the same kernel kind. */
static int same_kernel(const aj_tune_result *a, const aj_tune_result *b)
{
    return memcmp(&a->schedule, &b->schedule, sizeof a->schedule) == 0 &&
           a->warpgroups == b->warpgroups && a->producer == b->producer;
}

/* The compiled candidates' statuses, pruned: rejected by the template, by
 * the driver, or the same kernel as an earlier candidate (two requests the
 * template resolves alike; the default comes first, so it is the one
 * kept).  Returns how many are left to time. */
static int prune(aj_ctx *ctx, aj_device *dev, const aj_compile_job *jobs, aj_tune_result *res,
                 int n)
{
    int alive = 0;
    for (int i = 0; i < n; i++) {
        aj_tune_result *r = &res[i];
        r->status = jobs[i].status;
        snprintf(r->message, sizeof r->message, "%s", jobs[i].message);
        if (r->status != AJ_OK)
            continue;
        aj_launch_info li;
        aj_kernel_launch_info(jobs[i].kernel, &li);
        r->schedule = li.schedule;
        for (int j = 0; j < i; j++)
            if (res[j].status == AJ_OK && same_kernel(&res[j], r)) {
                r->status = AJ_ERR_UNSUPPORTED;   /* dropped below, never shown */
                r->message[0] = '\0';
                break;
            }
        if (r->status == AJ_OK && dev->ops->stage_resources)
            prune_by_driver(ctx, dev, jobs[i].kernel, r);
        alive += r->status == AJ_OK;
    }
    return alive;
}

/* Times every live candidate on prob (warm-up, then the repeats' median
 * and minimum) within the budget, reporting progress; *timed counts them. */
static aj_status time_candidates(aj_ctx *ctx, aj_device *dev, const aj_tune_options *o,
                                 problem *prob, const aj_compile_job *jobs, const int *job_of,
                                 aj_tune_result *res, int n, int alive, double t_start,
                                 int *timed)
{
    aj_device_caps caps = AJ_DEVICE_CAPS_INIT;
    aj_device_get_caps(dev, &caps);
    double *samples = calloc((size_t)o->repeats, sizeof *samples);
    if (!samples)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_tune: out of memory");
    char what[160];
    for (int i = 0; i < n; i++) {
        aj_tune_result *r = &res[i];
        if (r->status != AJ_OK)
            continue;
        if (o->budget_s > 0 && aj_now() - t_start > o->budget_s && *timed > 0) {
            snprintf(r->message, sizeof r->message, "not timed: the %.1f s budget ran out",
                     o->budget_s);
            continue;
        }
        prob->kernel = jobs[job_of[i]].kernel;
        if (caps.worker_threads)
            aj_device_set_workers(dev, r->workers);
        aj_status rs = AJ_OK;
        double ms = 0;
        for (int w = 0; w < o->warmup && rs == AJ_OK; w++)
            rs = time_once(prob, &ms);
        for (int k = 0; k < o->repeats && rs == AJ_OK; k++)
            rs = time_once(prob, &samples[k]);
        if (rs != AJ_OK) {
            r->status = rs;
            snprintf(r->message, sizeof r->message, "%s", aj_last_error(ctx));
            continue;
        }
        qsort(samples, (size_t)o->repeats, sizeof *samples, cmp_double);
        r->min_ms = samples[0];
        r->median_ms = o->repeats % 2 ? samples[o->repeats / 2]
                                      : 0.5 * (samples[o->repeats / 2 - 1] +
                                               samples[o->repeats / 2]);
        r->timed = true;
        (*timed)++;
        if (caps.worker_threads)
            snprintf(what, sizeof what, "block_m %d block_n %d threads %d: %.3f ms",
                     r->schedule.block_m, r->schedule.block_n, r->workers, r->median_ms);
        else
            snprintf(what, sizeof what, "block_m %d block_n %d warps %d stages %d%s: %.3f ms",
                     r->schedule.block_m, r->schedule.block_n, r->schedule.warps,
                     r->schedule.stages,
                     !r->warpgroups ? "" : r->producer ? " wgmma, producer" : " wgmma",
                     r->median_ms);
        progress(o, *timed, alive, what);
    }
    free(samples);
    return AJ_OK;
}

/* aj_tune's arguments and whether the op has a schedule to tune. */
static aj_status tune_check(aj_ctx *ctx, const aj_device *dev, const aj_op *op,
                            aj_tune_result **results, const int32_t *count)
{
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, dev, "aj_tune: dev is NULL");
    AJ_CHECK_ARG(ctx, op, "aj_tune: op is NULL");
    AJ_CHECK_ARG(ctx, results && count, "aj_tune: results or count is NULL");
    aj_status st = aj_op_verify(op);
    if (st != AJ_OK)
        return aj_fail(ctx, st, "aj_tune: %s", aj_last_error(op->ctx));
    if (op->kind == AJ_KIND_MERGE)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "aj_tune: merge ops have no schedule to tune");
    if (op->layout == AJ_LAYOUT_VARLEN)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "aj_tune: layout = varlen ops are not tuned; "
                       "tune the padded op of the same kind (its schedule fits both)");
    if (op->layout == AJ_LAYOUT_PAGED)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "aj_tune: layout = paged ops are not tuned (a "
                       "decode's tiles follow its head dims; its split count is the launch's "
                       "or the op's splits)");
    return AJ_OK;
}

/* The ops of candidates res[0 .. n) (clones of op with their schedules)
 * into ops[] and jobs[], compiled: the plain ones for the device's
 * target, those that run wgmma (last in the space) for theirs. */
static aj_status compile_candidates(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                                    const aj_tune_options *o, const aj_tune_result *res, int n,
                                    aj_op **ops, aj_compile_job *jobs)
{
    int n_plain = 0;
    for (int i = 0; i < n; i++) {
        aj_status st = aj_op_clone(op, &ops[i]);
        if (st != AJ_OK)
            return st;
        aj_op_set_schedule(ops[i], &res[i].requested);
        if (res[i].warpgroups) {
            aj_op_set_warpgroups(ops[i], res[i].warpgroups);
            aj_op_set_producer(ops[i], res[i].producer);
        }
        jobs[i].op = ops[i];
    }
    /* the candidates that run wgmma come last (the space's, or all of them:
     * an op's own warpgroups, FP8): the target aj_compile for the device
     * gives them */
    while (n_plain < n && !aj_op_runs_wgmma(ops[n_plain]))
        n_plain++;
    aj_compile_options copt = AJ_COMPILE_OPTIONS_INIT;
    copt.target = aj_device_target(dev);
    aj_compile_many(ctx, jobs, (size_t)n_plain, &copt, o->compile_workers);
    if (n_plain < n)
        copt.target = aj_device_target_for(dev, ops[n_plain], copt.target);
    aj_compile_many(ctx, jobs + n_plain, (size_t)(n - n_plain), &copt, o->compile_workers);
    return AJ_OK;
}

aj_status aj_tune(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                  const aj_tune_options *options, aj_tune_result **results, int32_t *count)
{
    aj_status st = tune_check(ctx, dev, op, results, count);
    if (st != AJ_OK)
        return st;
    enum { N = SPACE_SIZE };
    aj_op *ops[N] = {0};
    aj_tune_result *res = NULL;
    aj_compile_job *jobs = NULL;
    int *job_of = NULL;                /* result -> the compile job of its kernel */
    aj_device_caps caps = AJ_DEVICE_CAPS_INIT;
    aj_device_get_caps(dev, &caps);
    const int simt = caps.simt, threads = caps.worker_threads;
    const int workers_before = threads ? aj_device_workers(dev) : 0;
    problem prob = {0};
    int have_problem = 0;
    aj_tune_options o;
    double t_start = aj_now();
    AJ_TRY(read_tune_options(ctx, dev, options, &o));
    res = calloc(N * MAX_WORKER_CHOICES, sizeof *res);
    job_of = calloc(N * MAX_WORKER_CHOICES, sizeof *job_of);
    jobs = calloc(N, sizeof *jobs);
    if (!res || !jobs || !job_of) {
        st = aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_tune: out of memory");
        goto done;
    }

    int n = fill_space(res, simt, wgmma_space(dev, op, o.wgmma), op->kind);
    AJ_TRY(compile_candidates(ctx, dev, op, &o, res, n, ops, jobs));

    int alive = prune(ctx, dev, jobs, res, n);
    for (int i = 0; i < n; i++)
        job_of[i] = i;
    if (threads)
        n = expand_workers(dev, res, job_of, n, &alive);
    char what[160];
    snprintf(what, sizeof what, "compiled %d candidates: %d to time", n, alive);
    progress(&o, 0, alive, what);

    AJ_TRY(problem_init(ctx, dev, op, &o, &prob));
    have_problem = 1;
    int timed = 0;
    AJ_TRY(time_candidates(ctx, dev, &o, &prob, jobs, job_of, res, n, alive, t_start,
                           &timed));
    /* the caller sees every candidate but the duplicates */
    int kept = 0;
    for (int i = 0; i < n; i++)
        if (!(res[i].status == AJ_ERR_UNSUPPORTED && !res[i].message[0]))
            res[kept++] = res[i];
    qsort(res, (size_t)kept, sizeof *res, cmp_result);
    if (!timed) {
        st = aj_fail(ctx, AJ_ERR_UNSUPPORTED, "aj_tune: no candidate could be timed; the "
                     "first: %s", kept ? res[0].message : "(none)");
        goto done;
    }
    if (!o.no_persist) {
        /* the request, not the template's resolution of it: the default
         * stays "default" (all 0), and a target that resolves fields it
         * does not take (cpu: warps, stages) gets back what it accepts */
        aj_tune_entry best = {res[0].requested, res[0].workers, res[0].median_ms,
                              res[0].warpgroups, res[0].producer};
        AJ_TRY(db_store(ctx, dev, op, &best));
    }
    *results = res;
    *count = kept;
    res = NULL;
done:
    if (threads)
        aj_device_set_workers(dev, workers_before);
    if (have_problem)
        problem_free(&prob);
    for (int i = 0; i < N; i++) {
        aj_op_destroy(ops[i]);
        if (jobs)
            aj_kernel_destroy(jobs[i].kernel);
    }
    free(jobs);
    free(job_of);
    free(res);
    return st;
}
