/*
 * front.c -- context parallelism's front door: aj_ring_forward and
 * aj_ring_backward read the caller's versioned arguments, check the
 * method, and hand the call to the method's row below.  The methods are
 * peers behind it; hybrid's ring runs inside ulysses.c's call, so the
 * only call between methods is ulysses.c -> ring.c:
 *
 *   aj_ring_forward ──► method ring ──────────────► ring.c
 *                  └──► method ulysses, hybrid ──► ulysses.c ──(hybrid)──► ring.c
 */
#include <stdio.h>

#include "cp/cp.h"
#include "cp/comm/comm.h"
#include "ir/diag.h"
#include "ir/op.h"
#include "runtime/runtime.h"

static aj_status ring_forward(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                              const aj_ring_fwd_args *args, aj_ring_stats *stats)
{
    return aj_ring_forward_group(ctx, dev, comm, op, args, NULL, stats);
}

static aj_status ring_backward(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                               const aj_ring_bwd_args *args, aj_ring_stats *stats)
{
    return aj_ring_backward_group(ctx, dev, comm, op, args, NULL, stats);
}

/* The methods, one row each. */
static const struct cp_method {
    aj_status (*forward)(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                         const aj_ring_fwd_args *args, aj_ring_stats *stats);
    aj_status (*backward)(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                          const aj_ring_bwd_args *args, aj_ring_stats *stats);
    bool takes_ulysses_size;   /* heads split over groups of ulysses_size ranks */
} methods[AJ_METHOD_COUNT] = {
    [AJ_METHOD_RING] = {ring_forward, ring_backward, false},
    [AJ_METHOD_ULYSSES] = {aj_ulysses_forward, aj_ulysses_backward, true},
    [AJ_METHOD_HYBRID] = {aj_ulysses_forward, aj_ulysses_backward, true},
};

/* The row of `method`, whose ulysses_size must fit it (errors name `fn`). */
static aj_status method_row(aj_ctx *ctx, const char *fn, aj_cp_method method,
                            int32_t ulysses_size, const struct cp_method **out)
{
    AJ_CHECK_ARG(ctx, (unsigned)method < AJ_METHOD_COUNT,
                 "%s: method = %d is not a context-parallel method (ring, ulysses, hybrid)",
                 fn, (int)method);
    AJ_CHECK_ARG(ctx, methods[method].takes_ulysses_size || ulysses_size == 0,
                 "%s: ulysses_size = %d with method = ring; only methods ulysses and hybrid "
                 "take it", fn, (int)ulysses_size);
    *out = &methods[method];
    return AJ_OK;
}

/* Whether a call given a stream can return before its work is done
 * (attnjit.h, "Asynchronous calls"): everything it does is queued on the
 * device -- resident (cuda over NCCL), padded (varlen reads its documents'
 * offsets on the host), reading no side tensor or alibi slopes (the ring
 * reads them on the host to class its blocks), and for a backward no
 * dsinks or side gradients (their sums over the ranks wait for their
 * result: common.c). */
static bool async_ok(aj_device *dev, const aj_comm *comm, const aj_op *op, bool host_outputs)
{
    return dev && comm && op && aj_cp_resident(dev, (aj_comm *)comm) &&
           op->layout == AJ_LAYOUT_PADDED && op->tensor_count == 0 &&
           op->score_mod.kind != AJ_SCORE_MOD_ALIBI && !host_outputs;
}

/* The call's order on the caller's stream (*stream; NULL: none).  An
 * asynchronous call's work waits for it on the device; any other call
 * waits for it on the host now and forgets it (*stream = NULL), and then
 * runs as a call without one. */
static aj_status order_before(aj_device *dev, aj_comm *comm, const char *fn, bool async,
                              void **stream)
{
    if (!*stream || !dev || !comm)   /* (no dev or comm: the method says so) */
        return AJ_OK;
    void *own = NULL;
    aj_status st = AJ_OK;
    if (!async) {
        char what[96];
        snprintf(what, sizeof what, "%s: the caller's stream", fn);
        st = aj_device_wait(dev, *stream, comm->timeout_s, what);
        *stream = NULL;
        return st;
    }
    st = aj_cp_stream(dev, comm, &own);
    return st == AJ_OK ? aj_device_stream_after(dev, own, *stream, comm->order_event) : st;
}

/* The two entry points, alike but for their args struct (read as
 * AJ_<NAME>_INIT describes, pasted so that errors name the macro) and the
 * method's entry they call.  A failure the watchdog found fails the call
 * first; an asynchronous call ends by handing its stream's work to the
 * watchdog and ordering the caller's stream after it. */
#define FRONT_DOOR(name, type, last_required, NAME, entry, host_outputs)                      \
    aj_status name(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,               \
                   const type *given, aj_ring_stats *stats)                                  \
    {                                                                                        \
        if (!ctx)                                                                            \
            return AJ_ERR_INVALID_ARG;                                                       \
        AJ_READ_STRUCT_OR_RETURN(ctx, #name ": args", given, type, last_required,            \
                                 AJ_##NAME##_INIT, args);                                    \
        const struct cp_method *m = NULL;                                                    \
        aj_status st = method_row(ctx, #name, args->method, args->ulysses_size, &m);         \
        if (st == AJ_OK && comm)                                                             \
            st = aj_comm_watch_check(comm, ctx, #name, NULL);                                \
        const bool async = async_ok(dev, comm, op, host_outputs(args));                      \
        if (st == AJ_OK)                                                                     \
            st = order_before(dev, comm, #name, async, &args_read_.stream);                   \
        if (st == AJ_OK)                                                                     \
            st = before_##entry(ctx, op, args);                                              \
        if (st == AJ_OK)                                                                     \
            st = m->entry(ctx, dev, comm, op, args, stats);                                  \
        if (st == AJ_OK)                                                                     \
            st = after_##entry(ctx, dev, comm, op, args);                                    \
        if (st == AJ_OK && args->stream)                                                     \
            st = aj_comm_watch_add(comm, ctx, comm->ring_stream, args->stream, #name);       \
        return st;                                                                           \
    }

static aj_status before_forward(aj_ctx *ctx, const aj_op *op, const aj_ring_fwd_args *args)
{
    (void)ctx, (void)op, (void)args;
    return AJ_OK;
}

/* A backward's checks of its own outputs beyond the method's. */
static aj_status before_backward(aj_ctx *ctx, const aj_op *op, const aj_ring_bwd_args *args)
{
    return aj_cp_side_grad_check(ctx, op, args);
}

static aj_status after_forward(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                               const aj_ring_fwd_args *args)
{
    (void)ctx, (void)dev, (void)comm, (void)op, (void)args;
    return AJ_OK;
}

/* Every method's backward ends alike: the sinks' gradient and the grad
 * side tensors' sums over the ranks, when asked. */
static aj_status after_backward(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                                const aj_ring_bwd_args *args)
{
    aj_status st = args->dsinks.data ? aj_cp_sinks_grad(ctx, dev, comm, op, args) : AJ_OK;
    return st == AJ_OK && args->num_dside ? aj_cp_side_grad_sum(ctx, dev, comm, args) : st;
}

/* What a call returns through the host (no asynchronous call then). */
#define FWD_HOST_OUTPUTS(args) false
#define BWD_HOST_OUTPUTS(args) ((args)->dsinks.data != NULL || (args)->num_dside > 0)

FRONT_DOOR(aj_ring_forward, aj_ring_fwd_args, lse, RING_FWD_ARGS, forward, FWD_HOST_OUTPUTS)
FRONT_DOOR(aj_ring_backward, aj_ring_bwd_args, dv, RING_BWD_ARGS, backward, BWD_HOST_OUTPUTS)
