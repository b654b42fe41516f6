/*
 * test_struct_versions.c -- every public struct that carries struct_size
 * follows the one rule of ir/diag.h (aj_read_struct): a caller built
 * against an older header (a struct that ends after its required fields)
 * is accepted and gets the defaults for the rest; a newer, larger struct
 * is accepted when the bytes this attnjit does not know are 0; smaller
 * than the first version, or a newer struct with an unknown field set,
 * fails with AJ_ERR_INVALID_ARG naming the struct and its initializer.
 *
 * Old and new callers are simulated exactly: the struct is copied into a
 * heap block of just `struct_size` bytes, so a read past it is caught by
 * AddressSanitizer in the sanitizer run.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ir/diag.h"   /* AJ_STRUCT_END: the end of the required fields */
#include "spec_compile.h"

/* A copy of the first `size` bytes of `full` (0 past its end) in a block
 * of exactly `size` bytes, with struct_size = size. */
static void *sized_copy(const void *full, size_t full_size, size_t size)
{
    unsigned char *p = calloc(1, size);
    if (!p)
        abort();
    memcpy(p, full, size < full_size ? size : full_size);
    memcpy(p, &size, sizeof size);
    return p;
}

/* ---------------------------------------------------------------- a tiny problem */

enum { B = 1, H = 2, S = 5, D = 16 };
#define ROWS (B * H * S)

typedef struct problem {
    aj_ctx *ctx;
    aj_device *dev;
    aj_kernel *fwd, *bwd, *merge;
    float *q, *k, *v, *o, *lse, *o2, *lse2, *lse3, *do_, *dq, *dk, *dv;
} problem;

static aj_tensor bhsd(float *data)
{
    return (aj_tensor){data, AJ_DTYPE_F32, 4, {B, H, S, D}, {H * S * D, S * D, D, 1}};
}

static aj_tensor bhs(float *data)
{
    return (aj_tensor){data, AJ_DTYPE_F32, 3, {B, H, S}, {H * S, S, 1}};
}

static aj_kernel *compile_text(aj_ctx *ctx, const char *text)
{
    aj_kernel *kernel = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    CHECK_STATUS(ctx, spec_compile(ctx, text, "test", &opt, &kernel), AJ_OK);
    return kernel;
}

static float *device_floats(problem *p, size_t n, unsigned seed)
{
    void *mem = NULL;
    CHECK_STATUS(p->ctx, aj_device_alloc(p->dev, n * sizeof(float), &mem), AJ_OK);
    float *f = mem;
    for (size_t i = 0; i < n; i++)
        f[i] = (float)((i * 2654435761u + seed * 40503u) % 1000) / 500.0f - 1.0f;
    return f;
}

static void problem_open(problem *p)
{
    CHECK_STATUS(NULL, aj_ctx_create(NULL, &p->ctx), AJ_OK);
    CHECK_STATUS(p->ctx, aj_device_open(p->ctx, AJ_DEVICE_CPU, 0, &p->dev), AJ_OK);
    p->fwd = compile_text(p->ctx, "attention forward flash { dtype = f32 head_dim = 16 }");
    p->bwd = compile_text(p->ctx, "attention backward flash { dtype = f32 head_dim = 16 }");
    p->merge = compile_text(p->ctx, "attention merge { dtype = f32 head_dim_v = 16 }");
    float **bufs[] = {&p->q, &p->k, &p->v, &p->o, &p->o2, &p->do_, &p->dq, &p->dk, &p->dv};
    for (unsigned i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        *bufs[i] = device_floats(p, ROWS * D, i + 1);
    p->lse = device_floats(p, ROWS, 20);
    p->lse2 = device_floats(p, ROWS, 21);
    p->lse3 = device_floats(p, ROWS, 22);
}

static void problem_close(problem *p)
{
    float *bufs[] = {p->q, p->k, p->v, p->o, p->o2, p->do_, p->dq, p->dk, p->dv, p->lse, p->lse2,
                    p->lse3};
    for (unsigned i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        aj_device_free(p->dev, bufs[i]);
    aj_kernel_destroy(p->fwd);
    aj_kernel_destroy(p->bwd);
    aj_kernel_destroy(p->merge);
    aj_device_close(p->dev);
    aj_ctx_destroy(p->ctx);
}

/* ---------------------------------------------------------------- one entry per struct */

/* A struct, its first version's size, a full-size instance to start from,
 * and the call that reads it (returning its status, writing what it
 * computed, if anything, to `result`). */
typedef struct versioned {
    const char *name;        /* in the message: "aj_forward: args" */
    const char *init;        /* the initializer macro's name */
    size_t size, min_size;
    const void *full;
    aj_status (*call)(problem *p, const void *s, float *result);
    size_t result_floats;    /* 0: the call computes nothing to compare */
} versioned;

static aj_status call_ctx(problem *p, const void *s, float *result)
{
    aj_ctx *ctx = NULL;
    aj_status st = aj_ctx_create(s, &ctx);
    aj_ctx_destroy(ctx);
    return st;
}

/* The forward op every call below compiles or tunes. */
static aj_status parse_forward(problem *p, aj_op **op)
{
    const char *text = "attention forward flash { dtype = f32 head_dim = 16 }";
    return aj_op_parse(p->ctx, text, strlen(text), "test", op);
}

static aj_status call_compile(problem *p, const void *s, float *result)
{
    aj_op *op = NULL;
    aj_kernel *kernel = NULL;
    aj_status st = parse_forward(p, &op);
    if (st == AJ_OK)
        st = aj_compile(p->ctx, op, s, &kernel);
    if (st == AJ_OK)
        result[0] = (float)aj_kernel_emit(kernel);   /* emit: its default, auto */
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
    return st;
}

/* A launch's status; on success its output copied to result. */
static aj_status keep_output(aj_status st, const float *out, float *result)
{
    if (st == AJ_OK)
        memcpy(result, out, ROWS * D * sizeof(float));
    return st;
}

static aj_status call_forward(problem *p, const void *s, float *result)
{
    return keep_output(aj_forward(p->ctx, p->dev, p->fwd, s), p->o, result);
}

static aj_status call_backward(problem *p, const void *s, float *result)
{
    return keep_output(aj_backward(p->ctx, p->dev, p->bwd, s), p->dq, result);
}

static aj_status call_merge(problem *p, const void *s, float *result)
{
    return keep_output(aj_merge(p->ctx, p->dev, p->merge, s), p->o, result);
}

/* aj_tune, aj_comm_create and the ring need more than this process has
 * (a long timing run, MPI): an accepted struct shows itself by failing
 * at the first check after the read, which names a field or a handle. */
static aj_status call_tune(problem *p, const void *s, float *result)
{
    aj_op *op = NULL;
    aj_tune_result *results = NULL;
    int32_t count = 0;
    aj_status st = parse_forward(p, &op);
    if (st == AJ_OK)
        st = aj_tune(p->ctx, p->dev, op, s, &results, &count);
    aj_free(results);
    aj_op_destroy(op);
    return st;
}

static aj_status call_comm(problem *p, const void *s, float *result)
{
    aj_comm *comm = NULL;
    aj_status st = aj_comm_create(p->ctx, p->dev, s, &comm);
    aj_comm_destroy(comm);
    return st;
}

static aj_status call_ring_forward(problem *p, const void *s, float *result)
{
    return aj_ring_forward(p->ctx, p->dev, NULL, NULL, s, NULL);
}

static aj_status call_ring_backward(problem *p, const void *s, float *result)
{
    return aj_ring_backward(p->ctx, p->dev, NULL, NULL, s, NULL);
}

/* A causal ring's schedule: the pairs' classes, and their count last. */
static aj_status call_ring_plan(problem *p, const void *s, float *result)
{
    const char *text = "attention forward flash { dtype = f32 head_dim = 16 mask = causal(top_left) }";
    aj_op *op = NULL;
    aj_ring_pair pairs[8];
    int32_t count = 0;
    aj_status st = aj_op_parse(p->ctx, text, strlen(text), "test", &op);
    if (st == AJ_OK)
        st = aj_ring_plan(p->ctx, p->dev, op, s, pairs, 8, &count);
    for (int i = 0; st == AJ_OK && i < count && i < 8; i++)
        result[i] = (float)pairs[i].block;
    result[8] = (float)count;
    aj_op_destroy(op);
    return st;
}

/* What an accepted struct's call gives when it cannot run here. */
static const char *accepted_message(const versioned *v)
{
    if (v->call == call_tune)
        return "aj_tune: options->batch = -1 is negative";
    if (v->call == call_comm)
        return "aj_comm_create: MPI is not initialised";
    if (v->call == call_ring_forward)
        return "aj_ring_forward: comm is NULL";
    if (v->call == call_ring_backward)
        return "aj_ring_backward: comm is NULL";
    return NULL;
}

static void check_struct(problem *p, const versioned *v)
{
    printf("%s (%zu bytes, first version %zu)\n", v->name, v->size, v->min_size);
    float *want = calloc(v->result_floats + 1, sizeof(float));
    float *got = calloc(v->result_floats + 1, sizeof(float));
    const char *expect = accepted_message(v);
    aj_status want_st = expect ? (v->call == call_comm ? AJ_ERR_COMM : AJ_ERR_INVALID_ARG) : AJ_OK;

    /* today's size, then the first version's, then a newer one with zeros */
    const size_t sizes[] = {v->size, v->min_size, v->size + 24};
    for (int i = 0; i < 3; i++) {
        void *s = sized_copy(v->full, v->size, sizes[i]);
        float *out = i == 0 ? want : got;
        aj_status st = v->call(p, s, out);
        CHECK_MSG(st == want_st, "%s with struct_size %zu: %s (%s)", v->name, sizes[i],
                  aj_status_str(st), aj_last_error(p->ctx));
        if (expect)
            CHECK_ERROR(p->ctx, expect);
        else if (i > 0)
            CHECK_MSG(memcmp(want, got, (v->result_floats + 1) * sizeof(float)) == 0,
                      "%s with struct_size %zu computes something else", v->name, sizes[i]);
        free(s);
    }

    /* smaller than any version: an old caller's garbage, or a plain bug */
    void *small = sized_copy(v->full, v->size, v->min_size - 1);
    CHECK_STATUS(p->ctx, v->call(p, small, got), AJ_ERR_INVALID_ARG);
    if (v->call != call_ctx) {   /* aj_ctx_create has no context to tell */
        char msg[256];
        snprintf(msg, sizeof msg, "%s->struct_size = %zu is smaller than any version", v->name,
                 v->min_size - 1);
        CHECK_ERROR(p->ctx, msg);
        CHECK_ERROR(p->ctx, v->init);
    }
    free(small);

    /* a newer struct that sets a field this attnjit does not know */
    unsigned char *newer = sized_copy(v->full, v->size, v->size + 24);
    newer[v->size + 5] = 1;
    CHECK_STATUS(p->ctx, v->call(p, newer, got), AJ_ERR_INVALID_ARG);
    if (v->call != call_ctx)
        CHECK_ERROR(p->ctx, "with a field it does not know set");
    free(newer);
    free(want);
    free(got);
}

/* aj_fwd_args as callers built it before layout = paged (struct_size up
 * to num_side): a padded call computes what today's does, and a paged
 * kernel called so sees no cache and says which. */
static void check_fwd_before_paged(problem *p, const aj_fwd_args *fwd)
{
    const size_t size = offsetof(aj_fwd_args, k_cache);
    printf("aj_forward: args before the paged fields (%zu bytes)\n", size);
    float *want = calloc(ROWS * D, sizeof(float)), *got = calloc(ROWS * D, sizeof(float));
    void *s = sized_copy(fwd, sizeof *fwd, size);
    CHECK(call_forward(p, fwd, want) == AJ_OK);
    CHECK(call_forward(p, s, got) == AJ_OK);
    CHECK(memcmp(want, got, ROWS * D * sizeof(float)) == 0);
    free(s);
    aj_kernel *paged = compile_text(p->ctx, "attention forward flash { dtype = f32 "
                                            "head_dim = 16 layout = paged }");
    aj_fwd_args pa = AJ_FWD_ARGS_INIT;
    pa.q = fwd->q, pa.o = fwd->o, pa.lse = fwd->lse;
    s = sized_copy(&pa, sizeof pa, size);
    CHECK(paged != NULL);
    if (paged) {
        CHECK_STATUS(p->ctx, aj_forward(p->ctx, p->dev, paged, s), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(p->ctx, "aj_forward: k_cache.rank = 0, want 4");
    }
    aj_kernel_destroy(paged);
    free(s);
    free(want);
    free(got);
}

/* Version 3 of the ring structs adds method and ulysses_size at the end:
 * a caller built against version 2 (ending at launch_tiles_cap, num_side)
 * gets the ring, whatever lies past its struct; a version 3 caller's
 * method is read (an unknown one is named before any handle is checked). */
static void check_ring_method_versions(problem *p)
{
    aj_ring_fwd_args fa = AJ_RING_FWD_ARGS_INIT;
    aj_ring_bwd_args ba = AJ_RING_BWD_ARGS_INIT;
    fa.method = (aj_cp_method)7;
    ba.method = (aj_cp_method)7;
    CHECK_STATUS(p->ctx, call_ring_forward(p, &fa, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(p->ctx, "aj_ring_forward: method = 7 is not a context-parallel method");
    CHECK_STATUS(p->ctx, call_ring_backward(p, &ba, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(p->ctx, "aj_ring_backward: method = 7 is not a context-parallel method");
    void *v2f = sized_copy(&fa, sizeof fa, AJ_STRUCT_END(aj_ring_fwd_args, launch_tiles_cap));
    void *v2b = sized_copy(&ba, sizeof ba, AJ_STRUCT_END(aj_ring_bwd_args, num_side));
    CHECK_STATUS(p->ctx, call_ring_forward(p, v2f, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(p->ctx, "aj_ring_forward: comm is NULL");
    CHECK_STATUS(p->ctx, call_ring_backward(p, v2b, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(p->ctx, "aj_ring_backward: comm is NULL");
    free(v2f);
    free(v2b);
}

int main(void)
{
    problem p = {0};
    problem_open(&p);

    aj_ctx_config ctx_config = AJ_CTX_CONFIG_INIT;
    aj_compile_options compile = AJ_COMPILE_OPTIONS_INIT;
    compile.target = AJ_TARGET_CPU;
    aj_fwd_args fwd = AJ_FWD_ARGS_INIT;
    fwd.q = bhsd(p.q), fwd.k = bhsd(p.k), fwd.v = bhsd(p.v), fwd.o = bhsd(p.o);
    fwd.lse = bhs(p.lse);
    aj_bwd_args bwd = AJ_BWD_ARGS_INIT;
    bwd.q = bhsd(p.q), bwd.k = bhsd(p.k), bwd.v = bhsd(p.v), bwd.o = bhsd(p.o);
    bwd.lse = bhs(p.lse), bwd.do_ = bhsd(p.do_);
    bwd.dq = bhsd(p.dq), bwd.dk = bhsd(p.dk), bwd.dv = bhsd(p.dv);
    aj_merge_args merge = AJ_MERGE_ARGS_INIT;
    merge.o1 = bhsd(p.o2), merge.lse1 = bhs(p.lse2), merge.o2 = bhsd(p.dq);
    merge.lse2 = bhs(p.lse3), merge.o = bhsd(p.o), merge.lse = bhs(p.lse);
    aj_tune_options tune = AJ_TUNE_OPTIONS_INIT;
    tune.batch = -1;
    aj_comm_config comm = AJ_COMM_CONFIG_INIT;
    aj_ring_fwd_args ring_fwd = AJ_RING_FWD_ARGS_INIT;
    aj_ring_bwd_args ring_bwd = AJ_RING_BWD_ARGS_INIT;
    aj_ring_plan_args ring_plan = AJ_RING_PLAN_ARGS_INIT;
    ring_plan.layout = AJ_SHARD_ZIGZAG;
    ring_plan.size = 2;
    ring_plan.batch = ring_plan.heads_q = 1;
    ring_plan.seq_q = ring_plan.seq_k = 4;

    const versioned structs[] = {
        {"aj_ctx_create: config", "AJ_CTX_CONFIG_INIT", sizeof ctx_config,
         AJ_STRUCT_END(aj_ctx_config, log_level), &ctx_config, call_ctx, 0},
        {"aj_compile: options", "AJ_COMPILE_OPTIONS_INIT", sizeof compile,
         AJ_STRUCT_END(aj_compile_options, target), &compile, call_compile, 0},
        {"aj_forward: args", "AJ_FWD_ARGS_INIT", sizeof fwd, AJ_STRUCT_END(aj_fwd_args, lse), &fwd,
         call_forward, ROWS * D},
        {"aj_backward: args", "AJ_BWD_ARGS_INIT", sizeof bwd, AJ_STRUCT_END(aj_bwd_args, dv), &bwd,
         call_backward, ROWS * D},
        {"aj_merge: args", "AJ_MERGE_ARGS_INIT", sizeof merge, AJ_STRUCT_END(aj_merge_args, lse),
         &merge, call_merge, ROWS * D},
        {"aj_tune: options", "AJ_TUNE_OPTIONS_INIT", sizeof tune,
         AJ_STRUCT_END(aj_tune_options, seq_k), &tune, call_tune, 0},
        {"aj_comm_create: config", "AJ_COMM_CONFIG_INIT", sizeof comm,
         AJ_STRUCT_END(aj_comm_config, kind), &comm, call_comm, 0},
        {"aj_ring_forward: args", "AJ_RING_FWD_ARGS_INIT", sizeof ring_fwd,
         AJ_STRUCT_END(aj_ring_fwd_args, lse), &ring_fwd, call_ring_forward, 0},
        {"aj_ring_backward: args", "AJ_RING_BWD_ARGS_INIT", sizeof ring_bwd,
         AJ_STRUCT_END(aj_ring_bwd_args, dv), &ring_bwd, call_ring_backward, 0},
        {"aj_ring_plan: args", "AJ_RING_PLAN_ARGS_INIT", sizeof ring_plan,
         AJ_STRUCT_END(aj_ring_plan_args, seq_k), &ring_plan, call_ring_plan, 8},
    };
    for (size_t i = 0; i < sizeof structs / sizeof structs[0]; i++)
        check_struct(&p, &structs[i]);
    check_fwd_before_paged(&p, &fwd);
    check_ring_method_versions(&p);

    problem_close(&p);
    return check_report();
}
