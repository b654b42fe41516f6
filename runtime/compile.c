/*
 * compile.c -- aj_compile and aj_compile_many: check the op, look in the
 * kernel cache, else pick its template and run codegen, then cache.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/cache.h"
#include "runtime/runtime.h"
#include "runtime/sim/emulator.h"
#include "runtime/tune.h"
#include "templates/score.h"
#include "templates/template.h"

/* Options from a caller built against an older, shorter struct get the
 * defaults for the fields it does not know. */
static aj_status read_options(aj_ctx *ctx, const aj_compile_options *in,
                              aj_compile_options *out)
{
    const aj_compile_options defaults = AJ_COMPILE_OPTIONS_INIT;
    *out = defaults;
    if (!in) {
        out->emit = AJ_EMIT_PTX;   /* the default target is sm_80 */
        return AJ_OK;
    }
    /* the first version of the struct ended with target */
    aj_status st = AJ_READ_STRUCT(ctx, "aj_compile: options", in, aj_compile_options, target,
                                  AJ_COMPILE_OPTIONS_INIT, out);
    if (st != AJ_OK)
        return st;
    if (out->device)
        out->target = aj_device_target(out->device);
    if ((unsigned)out->target >= AJ_TARGET_COUNT || out->target == AJ_TARGET_ANY)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG,
                       "aj_compile: options->target = %d is not a target", (int)out->target);
    if ((unsigned)out->emit >= AJ_EMIT_COUNT)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG,
                       "aj_compile: options->emit = %d is not an emit kind", (int)out->emit);
    if (out->emit == AJ_EMIT_AUTO)
        out->emit = aj_target_is_nvptx(out->target) ? AJ_EMIT_PTX : AJ_EMIT_LLVM_IR;
    if (out->opt_level < 0 || out->opt_level > 3)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG,
                       "aj_compile: options->opt_level = %d is outside 0..3", out->opt_level);
    return AJ_OK;
}

/* The op's own errors, reported on `ctx` (not the op's context, which
 * other threads of aj_compile_many may share). */
static aj_status check_op(aj_ctx *ctx, const aj_op *op)
{
    if (op->sticky != AJ_OK)
        return aj_fail(ctx, op->sticky, "%s", op->sticky_msg);
    aj_field field;
    char msg[512];
    aj_status st = aj_op_check(op, &field, msg, sizeof msg);
    return st == AJ_OK ? AJ_OK : aj_fail(ctx, st, "%s", msg);
}

/* (AJ_EMIT_AUTO is resolved by read_options before a key is made) */
static const char *const emit_names[AJ_EMIT_COUNT] = {"ptx", "llvm", "bc", "auto"};

static aj_status compile_one(aj_ctx *ctx, aj_kernel_cache *cache, const aj_op *op,
                             const aj_compile_options *opt, const aj_template *forced,
                             aj_kernel **out);

/* An op with the default schedule, compiled for a device: with the schedule
 * (and the wgmma kernel: warpgroups, producer, sm_90a code on a 9.0 GPU)
 * the tuning database holds for it there, else as it is. */
static aj_status compile_tuned(aj_ctx *ctx, aj_kernel_cache *cache, const aj_op *op,
                               const aj_compile_options *opt, aj_kernel **out)
{
    aj_compile_options plain = *opt;
    plain.device = NULL;
    aj_tune_entry best;
    if (aj_tune_db_lookup(ctx, opt->device, op, &best) != AJ_OK)
        return compile_one(ctx, cache, op, &plain, NULL, out);
    aj_op tuned = *op;
    tuned.schedule = best.schedule;
    tuned.warpgroups = best.warpgroups;
    tuned.producer = best.producer;
    plain.target = aj_device_target_for(opt->device, &tuned, plain.target);
    aj_log(ctx, AJ_LOG_INFO, "tuned schedule for %s: block_m %d, block_n %d, warps %d, "
           "stages %d, warpgroups %d, producer %d", aj_device_name(opt->device),
           best.schedule.block_m, best.schedule.block_n, best.schedule.warps,
           best.schedule.stages, best.warpgroups, best.producer);
    return compile_one(ctx, cache, &tuned, &plain, NULL, out);
}

/* Gives the kernel a copy of the op it computes (aj_kernel.source), once:
 * a kernel from the cache may already have one, or get one from another
 * thread first. */
static aj_status keep_source(aj_ctx *ctx, aj_kernel *k, const aj_op *op)
{
    aj_op *copy = NULL;
    if (aj_op_clone(op, &copy) != AJ_OK)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_compile: out of memory");
    aj_op *none = NULL;
    if (!atomic_compare_exchange_strong(&k->source, &none, copy))
        aj_op_destroy(copy);
    return AJ_OK;
}

/*
 * The launch plan a kernel carries (aj_kernel.plan): what a launch would
 * otherwise derive from the op on every call.  Made once per kernel, when
 * it is compiled or first taken from the cache:
 *
 *   source op ──► score programs (with their derivative, intervals, hash)
 *             ├─► block-mask builder, compiled beside the kernel when the
 *             │   programs need one (kept on aj_kernel.mask_builder)
 *   kernel ───┼─► the workspace's layout rule (its regions, their element
 *             │   types and extents per row; launch.c multiplies it by a
 *             │   call's rows)
 *             └─► the by-value arguments: each AJ_PARAM_BYVAL128 parameter
 *                 with its source and encoder, run at every launch
 *
 * so a launch checks shapes, fills arguments and launches; it neither
 * derives programs nor compiles.  A kernel loaded from bytes has no op and
 * no plan: its launches class tiles by interval arithmetic alone.
 */
typedef struct launch_plan {
    aj_kernel_plan base;
    aj_score_prog prog;
    aj_workspace_rule workspace;
    aj_byval_args byval;
} launch_plan;

static void plan_destroy(aj_kernel_plan *plan)
{
    if (plan)
        aj_score_prog_free(&((launch_plan *)plan)->prog);
    free(plan);
}

const aj_score_prog *aj_kernel_programs(const aj_kernel *kernel)
{
    aj_kernel_plan *plan = atomic_load(&((aj_kernel *)kernel)->plan);
    return plan ? &((launch_plan *)plan)->prog : NULL;
}

const aj_workspace_rule *aj_kernel_workspace_rule(const aj_kernel *kernel)
{
    aj_kernel_plan *plan = atomic_load(&((aj_kernel *)kernel)->plan);
    return plan ? &((launch_plan *)plan)->workspace : NULL;
}

const aj_byval_args *aj_kernel_byval_args(const aj_kernel *kernel)
{
    aj_kernel_plan *plan = atomic_load(&((aj_kernel *)kernel)->plan);
    return plan ? &((launch_plan *)plan)->byval : NULL;
}

static aj_status make_plan(aj_ctx *ctx, aj_kernel *k)
{
    const aj_op *op = atomic_load(&k->source);
    if (atomic_load(&k->plan) || !op)
        return AJ_OK;
    launch_plan *plan = calloc(1, sizeof *plan);
    if (!plan)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "aj_compile: out of memory");
    plan->base.destroy = plan_destroy;
    aj_workspace_rule_of(k, &plan->workspace);
    aj_status st = aj_byval_args_of(ctx, k, &plan->byval);
    if (st == AJ_OK)
        st = aj_score_prog_init(ctx, op, &plan->prog);
    if (st == AJ_OK && plan->prog.block_mask) {
        aj_kernel *builder = NULL;
        st = aj_compile_block_mask(ctx, k, op, aj_score_mask_hash(&plan->prog), &builder);
        aj_kernel_destroy(builder);   /* the kernel keeps its own reference */
    }
    aj_kernel_plan *none = NULL;
    if (st != AJ_OK || !atomic_compare_exchange_strong(&k->plan, &none, &plan->base))
        plan_destroy(&plan->base);
    return st;
}

/* Compiles one op, reporting on ctx, consulting `cache` (may be NULL),
 * with the template of its kind and variant, or `forced` (not NULL: the
 * block-mask builder, which the key then names). */
static aj_status compile_one(aj_ctx *ctx, aj_kernel_cache *cache, const aj_op *op,
                             const aj_compile_options *opt, const aj_template *forced,
                             aj_kernel **out)
{
    aj_status st = AJ_OK;
    const aj_template *tmpl = NULL;
    int claimed = 0;   /* this thread compiles the key for the cache */
    char hash[AJ_HASH_HEX_LEN + 1];
    char entry[64], key[AJ_CACHE_KEY_MAX];

    AJ_TRY(check_op(ctx, op));
    aj_compile_options wgmma_opt;
    if (opt->device && aj_device_target_for(opt->device, op, opt->target) != opt->target) {
        /* wgmma code is sm_90a's, which a 9.0 device runs */
        wgmma_opt = *opt;
        wgmma_opt.target = AJ_TARGET_SM_90A;
        opt = &wgmma_opt;
    }
    if (opt->device && aj_op_schedule_is_default(op))
        return compile_tuned(ctx, cache, op, opt, out);
    if (op->target != AJ_TARGET_ANY && op->target != opt->target) {
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG,
                     "aj_compile: the op is pinned to target %s but %s was asked for",
                     aj_target_name(op->target), aj_target_name(opt->target));
        goto done;
    }
    AJ_TRY(aj_codegen_target_supported(ctx, opt->target));
    if (forced)
        tmpl = forced;
    else
        AJ_TRY(aj_template_find(ctx, op, opt->target, &tmpl));
    AJ_TRY(tmpl->check(ctx, op, opt->target));
    AJ_TRY(aj_op_hash(op, hash));

    /* the key: what the compile reads (and the versions that produce it) */
    char fields[128];
    snprintf(fields, sizeof fields, "%s|%s|O%d|%s%s%s", hash, aj_target_name(opt->target),
             opt->opt_level, emit_names[opt->emit], forced ? "|" : "",
             forced ? forced->name : "");
    aj_cache_kind kind = aj_cache_kind_of(opt->target);
    aj_cache_key(kind, fields, key, sizeof key);
    int cached = cache && !opt->bypass_cache && !opt->dump_after;
    if (cached && (*out = aj_cache_lookup_or_claim(ctx, cache, kind, key, &claimed)))
        goto done;

    snprintf(entry, sizeof entry, "aj_%s_%s", tmpl->name, hash);
    AJ_TRY(aj_codegen_run(ctx, op, opt, entry, tmpl->build, NULL, out));
    aj_op_get_info(op, &(*out)->op);
    (*out)->sinks = op->sinks - 1;
    (*out)->tensor_grad = aj_op_grad_bits(op);
    (*out)->kv_shared = op->kv_shared;
    (*out)->q_dtype = aj_op_q_dtype(op);
    if (cached)
        aj_cache_store(ctx, cache, kind, key, *out);
done:
    if (claimed)
        aj_cache_end_claim(cache, key);
    if (st != AJ_OK)
        return st;
    if (!atomic_load(&(*out)->source))
        st = keep_source(ctx, *out, op);
    if (st == AJ_OK && !forced)   /* a builder needs no plan: it is one's part */
        st = make_plan(ctx, *out);
    if (st != AJ_OK) {
        aj_kernel_destroy(*out);
        *out = NULL;
    }
    return st;
}

aj_status aj_compile(aj_ctx *ctx, const aj_op *op,
                     const aj_compile_options *options, aj_kernel **out)
{
    aj_compile_options opt;
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, op, "aj_compile: op is NULL");
    AJ_CHECK_ARG(ctx, out, "aj_compile: out is NULL");
    aj_status st = read_options(ctx, options, &opt);
    if (st != AJ_OK)
        return st;
    return compile_one(ctx, aj_cache_of(ctx), op, &opt, NULL, out);
}

/* The block-mask builder of `kernel`'s tile for op (block_mask.c), for
 * the kernel's target; the first one is kept on the kernel with its mask's
 * hash, and serves every later call for a mask of that hash (the implicit
 * build of each launch, aj_block_mask_create for the kernel's op) without
 * a look-up. */
aj_status aj_compile_block_mask(aj_ctx *ctx, const aj_kernel *kernel, const aj_op *op,
                                uint64_t mask_hash, aj_kernel **out)
{
    aj_kernel *k = (aj_kernel *)kernel;
    aj_kernel *kept = atomic_load(&k->mask_builder);
    if (kept && atomic_load(&k->mask_builder_hash) == mask_hash) {
        *out = aj_kernel_retain(kept);
        return AJ_OK;
    }
    aj_launch_info li;
    aj_kernel_stage_info(kernel, 0, &li);
    aj_op tiled = *op;
    tiled.schedule = li.schedule;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = kernel->target;
    opt.emit = kernel->emit;
    aj_status st = compile_one(ctx, aj_cache_of(ctx), &tiled, &opt, &aj_template_block_mask,
                               out);
    if (st != AJ_OK || kept)
        return st;
    /* the hash goes first: a reader that sees the builder sees its hash */
    uint64_t unset = 0;
    if (!atomic_compare_exchange_strong(&k->mask_builder_hash, &unset, mask_hash))
        return AJ_OK;
    aj_kernel *none = NULL;
    aj_kernel *mine = aj_kernel_retain(*out);
    if (!atomic_compare_exchange_strong(&k->mask_builder, &none, mine))
        aj_kernel_destroy(mine);
    return AJ_OK;
}

aj_status aj_compile_rows(aj_ctx *ctx, aj_target target, aj_dtype dtype, int32_t width,
                          aj_kernel **out)
{
    aj_op *op = NULL;
    aj_status st = aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op);
    if (st == AJ_OK)
        st = aj_op_set_dtype(op, dtype);
    if (st == AJ_OK)
        st = aj_op_set_head_dims(op, width, width);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    opt.emit = aj_target_is_nvptx(target) ? AJ_EMIT_PTX : AJ_EMIT_LLVM_IR;
    if (st == AJ_OK)
        st = compile_one(ctx, aj_cache_of(ctx), op, &opt, &aj_template_rows, out);
    aj_op_destroy(op);
    return st;
}

aj_status aj_compile_twin(aj_ctx *ctx, const aj_kernel *kernel, aj_kernel **out)
{
    aj_kernel *k = (aj_kernel *)kernel;
    aj_kernel *kept = atomic_load(&k->twin);
    if (kept) {
        *out = aj_kernel_retain(kept);
        return AJ_OK;
    }
    const aj_op *source = atomic_load(&k->source);
    if (!source)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED,
                       "emulated launches (AJ_CUDA_EMULATE=1) run a kernel's op again on the "
                       "emulator; this kernel was loaded from bytes and keeps no op");
    aj_op on_sim = *source;   /* the same op and schedule, on the emulator */
    on_sim.target = AJ_TARGET_ANY;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_SIM;
    opt.emit = AJ_EMIT_LLVM_IR;
    aj_status st = compile_one(ctx, aj_cache_of(ctx), &on_sim, &opt, NULL, out);
    if (st != AJ_OK)
        return st;
    aj_kernel *none = NULL, *mine = aj_kernel_retain(*out);
    if (!atomic_compare_exchange_strong(&k->twin, &none, mine))
        aj_kernel_destroy(mine);   /* another thread kept its own */
    return AJ_OK;
}

/* ---------------------------------------------------------------- many */

typedef struct batch {
    aj_ctx *parent;
    aj_kernel_cache *cache;
    aj_compile_job *jobs;
    size_t n;
    const aj_compile_options *opt;
    pthread_mutex_t lock;
    size_t next;
} batch;

static void *batch_worker(void *arg)
{
    batch *b = arg;
    aj_ctx *ctx = NULL;   /* this worker's error text */
    aj_ctx_create(&b->parent->config, &ctx);
    for (;;) {
        pthread_mutex_lock(&b->lock);
        size_t i = b->next++;
        pthread_mutex_unlock(&b->lock);
        if (i >= b->n)
            break;
        aj_compile_job *job = &b->jobs[i];
        job->kernel = NULL;
        job->message[0] = '\0';
        if (!ctx) {
            job->status = AJ_ERR_OUT_OF_MEMORY;
            snprintf(job->message, sizeof job->message, "out of memory");
            continue;
        }
        if (!job->op) {
            job->status = aj_fail(ctx, AJ_ERR_INVALID_ARG, "aj_compile_many: jobs[%zu].op is "
                                  "NULL", i);
        } else {
            job->status = compile_one(ctx, b->cache, job->op, b->opt, NULL, &job->kernel);
            /* and the driver's JIT, here in parallel, not at the first launch */
            if (job->status == AJ_OK && b->opt->device)
                job->status = aj_device_load_kernel(ctx, (aj_device *)b->opt->device,
                                                    job->kernel);
        }
        if (job->status != AJ_OK)
            snprintf(job->message, sizeof job->message, "%s", aj_last_error(ctx));
    }
    aj_ctx_destroy(ctx);
    return NULL;
}

#define MAX_COMPILE_WORKERS 64

aj_status aj_compile_many(aj_ctx *ctx, aj_compile_job *jobs, size_t n,
                          const aj_compile_options *options, int workers)
{
    aj_compile_options opt;
    if (!ctx)
        return AJ_ERR_INVALID_ARG;
    AJ_CHECK_ARG(ctx, jobs || n == 0, "aj_compile_many: jobs is NULL");
    AJ_CHECK_ARG(ctx, workers >= 0, "aj_compile_many: workers = %d is negative", workers);
    aj_status st = read_options(ctx, options, &opt);
    if (st != AJ_OK)
        return st;
    if (workers == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        workers = cores > 0 ? (int)cores : 1;
    }
    if ((size_t)workers > n)
        workers = (int)n;
    if (workers > MAX_COMPILE_WORKERS)
        workers = MAX_COMPILE_WORKERS;

    batch b = {ctx, aj_cache_of(ctx), jobs, n, &opt, PTHREAD_MUTEX_INITIALIZER, 0};
    pthread_t tids[MAX_COMPILE_WORKERS];
    int started = 0;
    for (int i = 1; i < workers; i++)
        if (pthread_create(&tids[started], NULL, batch_worker, &b) == 0)
            started++;
    batch_worker(&b);   /* the caller's thread works too */
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);

    size_t failed = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (jobs[i].status != AJ_OK) {
            failed++;
            if (first == n)
                first = i;
        }
    if (!failed)
        return AJ_OK;
    return aj_fail(ctx, jobs[first].status, "aj_compile_many: %zu of %zu compiles failed; "
                   "the first, jobs[%zu]: %s", failed, n, first, jobs[first].message);
}
