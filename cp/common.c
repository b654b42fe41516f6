/*
 * common.c -- what the context-parallel methods (ring.c, ulysses.c)
 * share: contiguous shard tensors, the opening agreement of the ranks'
 * calls, and collective failures named after the call.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"
#include "cp/comm/comm.h"
#include "cp/cp.h"
#include "runtime/runtime.h"
#include "templates/template.h"

aj_tensor aj_cp_dense(void *data, aj_dtype dtype, int rank, const int64_t *shape)
{
    aj_tensor t = {.data = data, .dtype = dtype, .rank = rank};
    int64_t stride = 1;
    for (int i = rank - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.strides[i] = stride;
        stride *= shape[i];
    }
    return t;
}

aj_status aj_cp_check_dense(aj_ctx *ctx, const char *fn, const char *name, const aj_tensor *t,
                            aj_dtype dtype, int rank, const int64_t *shape)
{
    aj_status rd = aj_check_rank_dtype(ctx, fn, name, t, rank, dtype);
    if (rd != AJ_OK)
        return rd;
    aj_tensor want = aj_cp_dense(t->data, dtype, rank, shape);
    for (int i = 0; i < rank; i++)
        if (t->shape[i] != shape[i])
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.shape[%d] = %lld, want %lld", fn,
                           name, i, (long long)t->shape[i], (long long)shape[i]);
    for (int i = 0; i < rank; i++)
        if (t->strides[i] != want.strides[i] && t->shape[i] > 1)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.strides[%d] = %lld; ring "
                           "shards must be contiguous (want %lld)", fn, name, i,
                           (long long)t->strides[i], (long long)want.strides[i]);
    if (!t->data)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s.data is NULL", fn, name);
    return AJ_OK;
}

aj_tensor aj_cp_rows(void *data, aj_dtype dtype, const aj_cp_shapes *sh, int64_t H,
                     int64_t len, int64_t W)
{
    if (sh->varlen)
        return W ? aj_cp_dense(data, dtype, 3, (int64_t[]){len, H, W})
                 : aj_cp_dense(data, dtype, 2, (int64_t[]){H, len});
    return aj_cp_dense(data, dtype, W ? 4 : 3, (int64_t[]){sh->B, H, len, W});
}

aj_status aj_cp_check_rows(aj_ctx *ctx, const char *fn, const char *name, const aj_tensor *t,
                           aj_dtype dtype, const aj_cp_shapes *sh, int64_t H, int64_t len,
                           int64_t W)
{
    const aj_tensor want = aj_cp_rows(NULL, dtype, sh, H, len, W);
    return aj_cp_check_dense(ctx, fn, name, t, dtype, want.rank, want.shape);
}

aj_status aj_cp_check_fwd_outputs(aj_ctx *ctx, const char *fn, aj_dtype dt,
                                  const aj_cp_shapes *sh, const aj_tensor *o,
                                  const aj_tensor *lse)
{
    aj_status st = aj_cp_check_rows(ctx, fn, "o", o, dt, sh, sh->Hq, sh->lq, sh->Dv);
    return st == AJ_OK ? aj_cp_check_rows(ctx, fn, "lse", lse, AJ_DTYPE_F32, sh, sh->Hq, sh->lq, 0)
                       : st;
}

aj_status aj_cp_check_bwd_outputs(aj_ctx *ctx, const char *fn, aj_dtype dt,
                                  const aj_cp_shapes *sh, const aj_tensor *o,
                                  const aj_tensor *do_, const aj_tensor *lse,
                                  const aj_tensor *dq, const aj_tensor *dk,
                                  const aj_tensor *dv)
{
    aj_status st = aj_cp_check_fwd_outputs(ctx, fn, dt, sh, o, lse);
    if (st == AJ_OK)
        st = aj_cp_check_rows(ctx, fn, "do_", do_, dt, sh, sh->Hq, sh->lq, sh->Dv);
    if (st == AJ_OK)
        st = aj_cp_check_rows(ctx, fn, "dq", dq, dt, sh, sh->Hq, sh->lq, sh->D);
    if (st == AJ_OK)
        st = aj_cp_check_rows(ctx, fn, "dk", dk, dt, sh, sh->Hkv, sh->lk, sh->D);
    if (st == AJ_OK)
        st = aj_cp_check_rows(ctx, fn, "dv", dv, dt, sh, sh->Hkv, sh->lk, sh->Dv);
    return st;
}

aj_tensor aj_cp_as_padded(const aj_tensor *t, const aj_cp_shapes *sh)
{
    if (!sh->varlen)
        return *t;
    aj_tensor v = {.data = t->data, .dtype = t->dtype, .rank = t->rank + 1};
    const int64_t l = t->rank == 3 ? t->shape[0] : t->shape[1];
    const int64_t H = t->rank == 3 ? t->shape[1] : t->shape[0];
    const int64_t W = t->rank == 3 ? t->shape[2] : 1;
    const int64_t shape[4] = {1, H, l, W};
    /* [l, H, W]: head h of position i at (i H + h) W; [H, l]: at h l + i */
    const int64_t strides[4] = {l * H * W, t->rank == 3 ? W : l, t->rank == 3 ? H * W : 1, 1};
    for (int i = 0; i < v.rank; i++) {
        v.shape[i] = shape[i];
        v.strides[i] = strides[i];
    }
    return v;
}

aj_status aj_cp_read_docs(aj_ctx *ctx, const char *fn, aj_device *dev, const int32_t *cu_q,
                          const int32_t *cu_k, int32_t batch, aj_cp_docs *out)
{
    memset(out, 0, sizeof *out);
    AJ_CHECK_ARG(ctx, cu_q && cu_k && batch >= 1, "%s: layout = varlen needs cu_seqlens_q, "
                 "cu_seqlens_k and batch >= 1 (the whole packed batch's; got %s, %s, batch = "
                 "%d)", fn, cu_q ? "cu_seqlens_q" : "NULL", cu_k ? "cu_seqlens_k" : "NULL",
                 (int)batch);
    out->batch = batch;
    out->cu_q = calloc(2 * ((size_t)batch + 1), sizeof *out->cu_q);
    if (!out->cu_q)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    out->cu_k = out->cu_q + batch + 1;
    const size_t bytes = ((size_t)batch + 1) * sizeof *cu_q;
    aj_status st = aj_device_copy_from(dev, out->cu_q, cu_q, bytes);
    if (st == AJ_OK)
        st = aj_device_copy_from(dev, out->cu_k, cu_k, bytes);
    if (st != AJ_OK)
        return st;
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a */
    for (int a = 0; a < 2; a++) {
        const int32_t *cu = a ? out->cu_k : out->cu_q;
        const char *name = a ? "cu_seqlens_k" : "cu_seqlens_q";
        int32_t *max = a ? &out->max_k : &out->max_q;
        if (cu[0] != 0)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s[0] = %d; the offsets start at 0",
                           fn, name, (int)cu[0]);
        for (int32_t b = 0; b < batch; b++) {
            if (cu[b + 1] < cu[b])
                return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: %s[%d] = %d is below %s[%d] = "
                               "%d; offsets must not decrease", fn, name, (int)b + 1,
                               (int)cu[b + 1], name, (int)b, (int)cu[b]);
            *max = cu[b + 1] - cu[b] > *max ? cu[b + 1] - cu[b] : *max;
        }
        for (int32_t b = 0; b <= batch; b++) {
            h ^= (uint64_t)(uint32_t)cu[b];
            h *= 0x100000001b3ull;
        }
    }
    out->digest = (int64_t)h;
    return AJ_OK;
}

void aj_cp_docs_free(aj_cp_docs *docs)
{
    free(docs->cu_q);
    docs->cu_q = docs->cu_k = NULL;
}

bool aj_cp_reads(const aj_score_prog *prog, int var)
{
    const uint16_t roots[4] = {prog->mod, prog->band_lo, prog->band_hi, prog->rest};
    for (int i = 0; i < 4; i++)
        if (roots[i] != AJ_EXPR_NONE && (prog->reads[roots[i]] & AJ_SCORE_READS(var)))
            return true;
    return false;
}

aj_status aj_cp_check_op(aj_ctx *ctx, const char *fn, const aj_op *op, aj_op_info *info,
                         aj_score_prog *prog)
{
    AJ_CHECK_ARG(ctx, op, "%s: op is NULL", fn);
    aj_status st = aj_op_verify(op);
    if (st != AJ_OK)
        return st;
    aj_op_get_info(op, info);
    if (info->kind != AJ_KIND_FORWARD && info->kind != AJ_KIND_BACKWARD)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: the op is `attention %s`; want a "
                       "forward or backward op", fn, aj_kind_name(info->kind));
    if (info->layout == AJ_LAYOUT_PAGED)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "%s: layout = paged: context parallelism "
                       "shards padded or varlen tensors", fn);
    if (info->bias != AJ_BIAS_NONE)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "%s: bias = add: the ring does not shard a "
                       "bias tensor", fn);
    st = aj_score_prog_init(ctx, op, prog);
    if (st != AJ_OK)
        return st;
    if (info->accumulate)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: accumulate = true: the ring sets it on "
                       "its own kernels; pass the plain forward op", fn);
    return AJ_OK;
}

aj_status aj_cp_check_call(aj_ctx *ctx, const char *fn, aj_device *dev, aj_comm *comm,
                           const aj_op *op, aj_kind kind, aj_shard_layout layout,
                           const aj_tensor *q, const aj_tensor *k, const aj_tensor *v,
                           aj_op_info *info, aj_score_prog *prog, aj_cp_shapes *sh)
{
    AJ_CHECK_ARG(ctx, dev, "%s: dev is NULL", fn);
    AJ_CHECK_ARG(ctx, comm, "%s: comm is NULL", fn);
    AJ_CHECK_ARG(ctx, (unsigned)layout < AJ_SHARD_LAYOUT_COUNT,
                 "%s: layout = %d is not a shard layout", fn, (int)layout);
    aj_status st = aj_cp_check_op(ctx, fn, op, info, prog);
    if (st != AJ_OK)
        return st;
    if (info->kind != kind)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: the op is `attention %s %s`; want "
                       "`attention %s flash` or `attention %s efficient`", fn,
                       aj_kind_name(info->kind), aj_variant_name(info->variant),
                       aj_kind_name(kind), aj_kind_name(kind));
    if (comm->dev != dev)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: comm was created for another device",
                       fn);
    const bool varlen = info->layout == AJ_LAYOUT_VARLEN;
    const int want = varlen ? 3 : 4, sd = varlen ? 0 : 2;   /* heads: dim 1 either way */
    if (q->rank != want || k->rank != want || v->rank != want)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: q, k and v have ranks %d, %d, %d; want "
                       "%d (%s)", fn, q->rank, k->rank, v->rank, want,
                       varlen ? "layout = varlen: packed [T, H, D]" : "BHSD");
    *sh = (aj_cp_shapes){.B = varlen ? 1 : q->shape[0], .Hq = q->shape[1],
                         .Hkv = k->shape[1], .D = info->head_dim, .Dv = info->head_dim_v,
                         .lq = q->shape[sd], .lk = k->shape[sd], .varlen = varlen};
    const aj_dtype dt = info->dtype;
    st = aj_cp_check_rows(ctx, fn, "q", q, dt, sh, sh->Hq, sh->lq, sh->D);
    if (st == AJ_OK)
        st = aj_cp_check_rows(ctx, fn, "k", k, dt, sh, sh->Hkv, sh->lk, sh->D);
    if (st == AJ_OK)
        st = aj_cp_check_rows(ctx, fn, "v", v, dt, sh, sh->Hkv, sh->lk, sh->Dv);
    if (st == AJ_OK && (sh->Hkv == 0 || sh->Hq % sh->Hkv != 0))
        st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: q has %lld heads and k %lld; the query "
                     "heads must be a multiple of the key/value heads (GQA)", fn,
                     (long long)sh->Hq, (long long)sh->Hkv);
    return st;
}

aj_status aj_cp_wait(aj_device *dev, void *stream, const struct aj_comm *comm, const char *fn,
                     const char *what)
{
    char label[160];
    snprintf(label, sizeof label, "%s: %s", fn, what);
    return aj_device_wait(dev, stream, comm->timeout_s, label);
}

aj_status aj_cp_collective_status(aj_ctx *ctx, const char *fn, aj_status st)
{
    if (st == AJ_OK)
        return st;
    char engine_message[AJ_ERROR_TEXT_MAX];
    snprintf(engine_message, sizeof engine_message, "%s", aj_last_error(ctx));
    return aj_fail(ctx, st, "%s: %s", fn, engine_message);
}

/* An agreement the comm remembers: this rank's record and every rank's
 * values (comm->agreed). */
typedef struct agreed_call {
    const char *fn;
    aj_cp_call mine;
    int n;
    uint64_t used;             /* comm->agreed_clock when last agreed or reused */
    int64_t all[];             /* [size][n] */
} agreed_call;

/* The remembered agreement of this rank's record `mine`, or NULL. */
static agreed_call *agreed_find(aj_comm *comm, const char *fn, const aj_cp_call *mine, int n)
{
    for (size_t i = 0; i < AJ_COUNT_OF(comm->agreed); i++) {
        agreed_call *a = comm->agreed[i];
        if (a && a->n == n && strcmp(a->fn, fn) == 0 && memcmp(&a->mine, mine, sizeof *mine) == 0)
            return a;
    }
    return NULL;
}

/* Remembers an agreement, in place of the least recently used (every rank
 * makes the same calls, so every rank's memory holds the same ones). */
static void agreed_keep(aj_comm *comm, const char *fn, const aj_cp_call *mine, int n,
                        const aj_cp_call *all)
{
    size_t slot = 0;
    for (size_t i = 0; i < AJ_COUNT_OF(comm->agreed); i++) {
        const agreed_call *a = comm->agreed[i], *b = comm->agreed[slot];
        if (!a || (b && a->used < b->used))
            slot = i;
        if (!a)
            break;
    }
    const size_t count = (size_t)comm->size * (size_t)n;
    agreed_call *a = realloc(comm->agreed[slot], sizeof *a + count * sizeof a->all[0]);
    if (!a)
        return;   /* not remembered: the next such call agrees again */
    *a = (agreed_call){.fn = fn, .mine = *mine, .n = n, .used = ++comm->agreed_clock};
    for (int r = 0; r < comm->size; r++)
        memcpy(a->all + (size_t)r * (size_t)n, all[r].v, (size_t)n * sizeof a->all[0]);
    comm->agreed[slot] = a;
}

aj_status aj_cp_agree(aj_ctx *ctx, aj_comm *comm, const char *fn, const aj_op *op, int n,
                      const char *const *names, const int64_t *values, bool reuse,
                      int64_t *all_values)
{
    aj_cp_call mine;
    memset(&mine, 0, sizeof mine);
    memcpy(mine.v, values, (size_t)n * sizeof *values);
    aj_status st = aj_op_hash(op, mine.hash);
    if (all_values)
        memcpy(all_values, values, (size_t)n * sizeof *values);
    if (st != AJ_OK || comm->size == 1)
        return st;
    agreed_call *known = reuse ? agreed_find(comm, fn, &mine, n) : NULL;
    if (known) {   /* the ranks agreed on this call before: nothing to send */
        known->used = ++comm->agreed_clock;
        if (all_values)
            memcpy(all_values, known->all, (size_t)comm->size * (size_t)n * sizeof *values);
        return AJ_OK;
    }
    aj_cp_call *all = calloc((size_t)comm->size, sizeof *all);
    if (!all)
        return aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    st = aj_cp_collective_status(ctx, fn, comm->engine->allgather(comm, &mine, all,
                                                                  sizeof mine));
    for (int r = 1; r < comm->size && st == AJ_OK; r++) {
        if (strcmp(all[r].hash, all[0].hash) != 0) {
            st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: the ranks' calls differ: rank %d's "
                         "op has hash %s, rank 0's %s; every rank must pass the same op, "
                         "shapes, layout, rotate method and dropout stream", fn, r,
                         all[r].hash, all[0].hash);
            break;
        }
        for (int f = 0; f < n; f++)
            if (names[f] && all[r].v[f] != all[0].v[f]) {
                st = aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: the ranks' calls differ: rank "
                             "%d has %s = %lld, rank 0 has %lld; every rank must pass the "
                             "same op, shapes, layout, rotate method and dropout stream", fn,
                             r, names[f], (long long)all[r].v[f], (long long)all[0].v[f]);
                break;
            }
    }
    for (int r = 0; r < comm->size && all_values; r++)
        memcpy(all_values + (size_t)r * (size_t)n, all[r].v, (size_t)n * sizeof *values);
    if (st == AJ_OK)
        agreed_keep(comm, fn, &mine, n, all);
    free(all);
    return st;
}

aj_status aj_cp_stream(aj_device *dev, aj_comm *comm, void **out)
{
    aj_status st = AJ_OK;
    if (!comm->ring_stream)
        st = aj_device_stream_create(dev, &comm->ring_stream);
    if (st == AJ_OK && !comm->order_event && comm->ring_stream)
        st = aj_device_event_create(dev, &comm->order_event);
    *out = comm->ring_stream;
    return st;
}

aj_status aj_cp_check_lengths(aj_ctx *ctx, const char *fn, aj_shard_layout layout, int size,
                              const int64_t *all, int stride, int field_q, int field_k,
                              int64_t *sq, int64_t *sk)
{
    *sq = *sk = 0;
    for (int r = 0; r < size; r++) {
        *sq += all[(size_t)r * (size_t)stride + (size_t)field_q];
        *sk += all[(size_t)r * (size_t)stride + (size_t)field_k];
    }
    for (int r = 0; r < size; r++) {
        const int64_t lq = all[(size_t)r * (size_t)stride + (size_t)field_q];
        const int64_t lk = all[(size_t)r * (size_t)stride + (size_t)field_k];
        const int64_t want_q = aj_shard_length(layout, r, size, *sq);
        const int64_t want_k = aj_shard_length(layout, r, size, *sk);
        if (lq != want_q || lk != want_k)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "%s: rank %d holds %lld query and %lld "
                           "key positions; the %s layout of %lld and %lld over %d ranks gives "
                           "it %lld and %lld (aj_shard_length)", fn, r, (long long)lq,
                           (long long)lk, layout == AJ_SHARD_ZIGZAG ? "zigzag" : "contiguous",
                           (long long)*sq, (long long)*sk, size, (long long)want_q,
                           (long long)want_k);
    }
    return AJ_OK;
}

/* The rows of this rank's shards: B x Hq x l (padded [B, Hq, l, Dv]) or
 * Hq x l (varlen's packed [l, Hq, Dv], LSE [Hq, l]). */
typedef struct sink_rows {
    int64_t B, Hq, l, Dv;
    int packed;
} sink_rows;

static size_t o_at(const sink_rows *r, int64_t b, int64_t h, int64_t i)
{
    return (size_t)(r->packed ? (i * r->Hq + h) * r->Dv : ((b * r->Hq + h) * r->l + i) * r->Dv);
}

/* A device tensor of n elements, densely laid out, as f32 in host memory. */
static aj_status host_f32(aj_ctx *ctx, aj_device *dev, const aj_tensor *t, size_t n, float **out)
{
    size_t bytes = n * (size_t)aj_dtype_size(t->dtype);
    void *raw = malloc(bytes + 16);
    *out = malloc(n * sizeof(float) + 16);
    aj_status st = raw && *out ? AJ_OK : aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == AJ_OK)
        st = aj_device_copy_from(dev, raw, t->data, bytes);
    if (st == AJ_OK)
        st = aj_convert(raw, t->dtype, *out, AJ_DTYPE_F32, n);
    free(raw);
    return st;
}

bool aj_cp_resident(aj_device *dev, const aj_comm *comm)
{
    aj_device_caps caps = AJ_DEVICE_CAPS_INIT;
    return aj_device_get_caps(dev, &caps) == AJ_OK && !caps.host_memory &&
           comm->engine->moves_device_memory;
}

aj_status aj_cp_buffer(aj_device *dev, aj_comm *comm, bool resident, size_t bytes, int zero,
                       void *stream, void **out)
{
    bytes = bytes ? bytes : 64;
    if (!resident)
        return aj_device_host_alloc(dev, bytes, zero, out);
    aj_status st = aj_comm_block_get(comm, bytes, out);
    return st == AJ_OK && zero ? aj_device_fill32_async(dev, *out, 0, (bytes + 3) / 4, stream)
                               : st;
}

void aj_cp_buffer_free(aj_device *dev, aj_comm *comm, bool resident, void *ptr)
{
    if (resident)
        aj_comm_block_put(comm, ptr);
    else
        aj_device_host_free(dev, ptr);
}

aj_status aj_cp_zero(aj_ctx *ctx, aj_device *dev, const void *ptr, size_t bytes)
{
    void *zeros = calloc(1, bytes ? bytes : 1);
    aj_status st = zeros ? aj_device_copy_to(dev, (void *)ptr, zeros, bytes)
                         : aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    free(zeros);
    return st;
}

aj_status aj_cp_side_grad_check(aj_ctx *ctx, const aj_op *op, const aj_ring_bwd_args *a)
{
    static const char fn[] = "aj_ring_backward";
    AJ_CHECK_ARG(ctx, a->num_dside >= 0 && (a->num_dside == 0 || a->dside),
                 "%s: num_dside = %d with dside %s", fn, (int)a->num_dside,
                 a->dside ? "given" : "NULL");
    AJ_CHECK_ARG(ctx, op || a->num_dside == 0, "%s: op is NULL", fn);
    if (a->num_dside == 0)
        return AJ_OK;
    aj_op_info info;
    uint32_t grads = 0;
    aj_op_get_info(op, &info);
    for (int t = 0; t < info.num_tensors; t++) {
        bool g = false;
        aj_op_get_tensor_grad(op, t, &g);
        grads |= (uint32_t)g << t;
    }
    bool slopes = false;   /* alibi(grad): the input after the op's tensors */
    aj_op_get_alibi_grad(op, &slopes);
    grads |= (uint32_t)slopes << info.num_tensors;
    aj_side_tensor inputs[AJ_OP_TENSORS_MAX + 1];
    const int n = aj_grad_inputs(&info, a->side, a->num_side, &a->alibi_slopes, inputs);
    aj_status st = aj_check_dside_outputs(ctx, fn, &info, grads, inputs, n, a->dside,
                                          a->num_dside);
    for (int i = 0; st == AJ_OK && i < a->num_dside; i++) {   /* and contiguous */
        const aj_side_tensor *d = &a->dside[i];
        int64_t stride = 1;
        bool ok = true;
        for (int k = d->rank - 1; ok && k >= 0; k--) {
            ok = d->strides[k] == stride || d->shape[k] == 1;
            stride *= d->shape[k];
        }
        AJ_CHECK_ARG(ctx, ok, "%s: dside '%s' must be contiguous", fn, d->name);
    }
    return st;
}

/*
 * A resident call's sums over the ranks (cuda over NCCL) stay in device
 * memory: each rank's n f32 (padded with zeros to whole rows of RANK_SUM_W)
 * are gathered by the engine on the device, added in rank order by the
 * f32 row kernels (templates/rows.c) on the comm's stream, and the total
 * copied into the output there -- the same order, so the same bits, on
 * every rank.  Elsewhere the parts travel through the host and add up
 * there (aj_cp_side_grad_sum, aj_cp_sinks_grad).
 */
enum { RANK_SUM_W = 8 };

static size_t rank_sum_padded(size_t n)
{
    return (n + RANK_SUM_W - 1) / RANK_SUM_W * RANK_SUM_W;
}

/* n_pad f32 as [1, 1, n_pad / RANK_SUM_W, RANK_SUM_W] rows. */
static aj_tensor rank_sum_view(const float *x, size_t n_pad)
{
    return (aj_tensor){(void *)x, AJ_DTYPE_F32, 4,
                       {1, 1, (int64_t)(n_pad / RANK_SUM_W), RANK_SUM_W},
                       {(int64_t)n_pad, (int64_t)n_pad, RANK_SUM_W, 1}};
}

/* dst[i * stride] = the sum over the ranks of their part[i], i < n: part
 * (device memory, rank_sum_padded(n) f32, zero past n) written by work
 * queued on `stream`; waits for the result.  `what` names the sum in
 * messages. */
static aj_status rank_sum_device(aj_ctx *ctx, aj_device *dev, aj_comm *comm, void *stream,
                                 const float *part, size_t n, float *dst, int64_t stride,
                                 const char *what)
{
    static const char fn[] = "aj_ring_backward";
    const size_t n_pad = rank_sum_padded(n);
    float *all = NULL;
    aj_kernel *rows = NULL;
    aj_status st = aj_compile_rows(ctx, aj_device_target(dev), AJ_DTYPE_F32, RANK_SUM_W, &rows);
    if (st == AJ_OK)
        st = aj_comm_block_get(comm, (size_t)comm->size * n_pad * 4, (void **)&all);
    if (st == AJ_OK) {
        aj_comm_device_transfers(comm, true, stream);
        st = comm->engine->allgather(comm, part, all, n_pad * 4);
        aj_comm_device_transfers(comm, false, NULL);
        if (st != AJ_OK && st != AJ_ERR_OUT_OF_MEMORY && st != AJ_ERR_INVALID_ARG)
            st = aj_fail(ctx, st, "%s: the all-gather of %s failed: %s", fn, what,
                         aj_last_error(ctx));
    }
    const aj_tensor total = rank_sum_view(all, n_pad);
    for (int rk = 1; st == AJ_OK && rk < comm->size; rk++) {   /* in rank order */
        const aj_tensor x = rank_sum_view(all + (size_t)rk * n_pad, n_pad);
        st = aj_rows_launch(ctx, dev, rows, AJ_ROWS_ADD, &x, &total, NULL, stream);
    }
    if (st == AJ_OK)
        st = stride == 1 ? aj_device_copy_async(dev, dst, all, n * 4, AJ_COPY_ON_DEVICE, stream)
                         : aj_device_copy2d_async(dev, dst, (size_t)stride * 4, all, 4, 4, n,
                                                  stream);
    if (st == AJ_OK) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s: the sum of %s", fn, what);
        st = aj_device_wait(dev, stream, comm->timeout_s, msg);
    }
    if (all)
        aj_comm_block_put(comm, all);
    aj_kernel_destroy(rows);
    return st;
}

/* The grad side tensors' sums of a resident call: each output's part
 * (written on the comm's stream) padded into a block, summed over the
 * ranks back into it. */
static aj_status side_grad_sum_device(aj_ctx *ctx, aj_device *dev, aj_comm *comm,
                                      const aj_ring_bwd_args *a)
{
    void *stream = NULL;
    aj_status st = aj_cp_stream(dev, comm, &stream);
    for (int i = 0; st == AJ_OK && i < a->num_dside; i++) {
        const size_t n = (size_t)aj_side_numel(&a->dside[i]), n_pad = rank_sum_padded(n);
        float *part = NULL;
        char what[AJ_OP_TENSOR_NAME_MAX + 8];
        snprintf(what, sizeof what, "d%s", a->dside[i].name);
        st = aj_cp_buffer(dev, comm, true, n_pad * 4, 1, stream, (void **)&part);
        if (st == AJ_OK && n)
            st = aj_device_copy_async(dev, part, a->dside[i].data, n * 4, AJ_COPY_ON_DEVICE,
                                      stream);
        if (st == AJ_OK)
            st = rank_sum_device(ctx, dev, comm, stream, part, n, (float *)a->dside[i].data, 1,
                                 what);
        if (part)
            aj_cp_buffer_free(dev, comm, true, part);
    }
    return st;
}

aj_status aj_cp_side_grad_sum(aj_ctx *ctx, aj_device *dev, aj_comm *comm,
                              const aj_ring_bwd_args *a)
{
    static const char fn[] = "aj_ring_backward";
    aj_status st = AJ_OK;
    if (aj_cp_resident(dev, comm))
        return side_grad_sum_device(ctx, dev, comm, a);
    for (int i = 0; st == AJ_OK && i < a->num_dside; i++) {
        const size_t n = (size_t)aj_side_numel(&a->dside[i]);
        float *mine = calloc(n + 1, 4), *all = calloc((size_t)comm->size * n + 1, 4);
        st = mine && all ? AJ_OK : aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
        if (st == AJ_OK)
            st = aj_device_copy_from(dev, mine, a->dside[i].data, n * 4);
        if (st == AJ_OK)
            st = comm->engine->allgather(comm, mine, all, n * 4);
        if (st != AJ_OK && st != AJ_ERR_OUT_OF_MEMORY && st != AJ_ERR_INVALID_ARG)
            st = aj_fail(ctx, st, "%s: the all-gather of d%s failed: %s", fn, a->dside[i].name,
                         aj_last_error(ctx));
        if (st == AJ_OK) {   /* in rank order */
            memcpy(mine, all, n * 4);
            for (int rk = 1; rk < comm->size; rk++)
                for (size_t e = 0; e < n; e++)
                    mine[e] += all[(size_t)rk * n + e];
            st = aj_device_copy_to(dev, (void *)a->dside[i].data, mine, n * 4);   /* an output */
        }
        free(mine);
        free(all);
    }
    return st;
}

/* A resident call's sinks' gradient: this rank's part by the sinks' stage
 * of the op's own backward (aj_backward_sinks: the rank's rows, as padded
 * tensors, no mask -- the stage reads O, dO, LSE and the sinks only) into
 * a block, then summed over the ranks into a->dsinks. */
static aj_status sinks_grad_device(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                                   const aj_ring_bwd_args *a, int packed, int64_t Hq)
{
    const aj_cp_shapes sh = {.varlen = packed};
    void *stream = NULL;
    float *part = NULL;
    aj_op *v = NULL;
    aj_kernel *kernel = NULL;
    aj_status st = aj_cp_stream(dev, comm, &stream);
    if (st == AJ_OK)
        st = aj_op_clone(op, &v);
    if (st == AJ_OK)
        st = aj_op_set_mask_none(v);
    if (st == AJ_OK && packed)
        st = aj_op_set_layout(v, AJ_LAYOUT_PADDED);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.device = dev;
    if (st == AJ_OK)
        st = aj_compile(ctx, v, &opt, &kernel);
    const size_t n_pad = rank_sum_padded((size_t)Hq);
    if (st == AJ_OK)
        st = aj_cp_buffer(dev, comm, true, n_pad * 4, 1, stream, (void **)&part);
    if (st == AJ_OK) {
        aj_bwd_args b = AJ_BWD_ARGS_INIT;
        const aj_tensor *in[] = {&a->q, &a->k, &a->v, &a->o, &a->do_, &a->lse, &a->dq, &a->dk,
                                 &a->dv};
        aj_tensor *to[] = {&b.q, &b.k, &b.v, &b.o, &b.do_, &b.lse, &b.dq, &b.dk, &b.dv};
        for (size_t i = 0; i < AJ_COUNT_OF(in); i++)
            *to[i] = aj_cp_as_padded(in[i], &sh);
        b.alibi_slopes = a->alibi_slopes;
        b.side = a->side;
        b.num_side = a->num_side;
        b.seed = a->seed;
        b.offset = a->offset;
        b.dsinks = (aj_tensor){part, AJ_DTYPE_F32, 1, {Hq}, {1}};
        b.stream = stream;
        st = aj_backward_sinks(ctx, dev, kernel, &b);
    }
    if (st == AJ_OK)
        st = rank_sum_device(ctx, dev, comm, stream, part, (size_t)Hq, (float *)a->dsinks.data,
                             a->dsinks.strides[0], "the sinks' gradient");
    if (part)
        aj_cp_buffer_free(dev, comm, true, part);
    aj_kernel_destroy(kernel);
    aj_op_destroy(v);
    return st;
}

aj_status aj_cp_sinks_grad(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                           const aj_ring_bwd_args *a)
{
    static const char fn[] = "aj_ring_backward";
    aj_op_info info;
    int32_t sink = -1;
    aj_op_get_info(op, &info);
    aj_op_get_sinks(op, &sink);
    AJ_CHECK_ARG(ctx, sink >= 0, "%s: dsinks is given, but the op has no sinks", fn);
    const int packed = info.layout == AJ_LAYOUT_VARLEN;
    const sink_rows r = {packed ? 1 : a->o.shape[0], a->o.shape[1],
                         a->o.shape[packed ? 0 : 2], info.head_dim_v, packed};
    aj_status st = aj_check_dsinks(ctx, fn, true, &a->dsinks, r.Hq);
    if (st == AJ_OK)
        st = aj_side_check_sinks(ctx, fn, info.tensors[sink].name, a->side, a->num_side, r.Hq);
    if (st != AJ_OK)
        return st;
    const aj_side_tensor *logits = NULL;
    for (int i = 0; i < a->num_side; i++)
        if (a->side[i].name && strcmp(a->side[i].name, info.tensors[sink].name) == 0)
            logits = &a->side[i];
    AJ_CHECK_ARG(ctx, logits, "%s: the sinks tensor '%s' is not given", fn,
                 info.tensors[sink].name);
    if (aj_cp_resident(dev, comm))
        return sinks_grad_device(ctx, dev, comm, op, a, packed, r.Hq);
    const size_t rows = (size_t)(r.B * r.Hq * r.l), elems = rows * (size_t)r.Dv;
    float *o = NULL, *d = NULL, *lse = NULL, *sinks = calloc((size_t)r.Hq + 1, 4);
    float *all = calloc((size_t)comm->size * (size_t)r.Hq + 1, 4);
    float *mine = calloc((size_t)r.Hq + 1, 4), *total = calloc((size_t)r.Hq + 1, 4);
    st = sinks && all && mine && total ? AJ_OK : aj_fail(ctx, AJ_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == AJ_OK)
        st = host_f32(ctx, dev, &a->o, elems, &o);
    if (st == AJ_OK)
        st = host_f32(ctx, dev, &a->do_, elems, &d);
    if (st == AJ_OK)
        st = host_f32(ctx, dev, &a->lse, rows, &lse);
    for (int64_t h = 0; st == AJ_OK && h < r.Hq; h++)
        st = aj_device_copy_from(dev, &sinks[h],
                                 (const char *)logits->data + (size_t)(h * logits->strides[0]) * 4,
                                 4);
    for (int64_t h = 0; st == AJ_OK && h < r.Hq; h++) {
        double acc = 0;
        for (int64_t b = 0; b < r.B; b++)
            for (int64_t i = 0; i < r.l; i++) {
                const float l = lse[packed ? h * r.l + i : (b * r.Hq + h) * r.l + i];
                if (l == -INFINITY)
                    continue;
                const float *oi = o + o_at(&r, b, h, i), *di = d + o_at(&r, b, h, i);
                double dot = 0;
                for (int64_t c = 0; c < r.Dv; c++)
                    dot += (double)oi[c] * di[c];
                acc -= exp((double)sinks[h] - l) * dot;
            }
        mine[h] = (float)acc;
    }
    if (st == AJ_OK)
        st = comm->engine->allgather(comm, mine, all, (size_t)r.Hq * 4);
    if (st != AJ_OK && st != AJ_ERR_OUT_OF_MEMORY && st != AJ_ERR_INVALID_ARG)
        st = aj_fail(ctx, st, "%s: the all-gather of the sinks' gradient failed: %s", fn,
                     aj_last_error(ctx));
    for (int rk = 0; st == AJ_OK && rk < comm->size; rk++)   /* in rank order */
        for (int64_t h = 0; h < r.Hq; h++)
            total[h] += all[(size_t)rk * (size_t)r.Hq + (size_t)h];
    for (int64_t h = 0; st == AJ_OK && h < r.Hq; h++)
        st = aj_device_copy_to(dev, (char *)a->dsinks.data + (size_t)(h * a->dsinks.strides[0]) * 4,
                               &total[h], 4);
    free(o);
    free(d);
    free(lse);
    free(sinks);
    free(all);
    free(mine);
    free(total);
    return st;
}
