/*
 * ring.c -- ring attention (context parallelism): aj_ring_forward and
 * aj_ring_backward over an aj_comm.
 *
 * Each rank holds a shard of Q, K and V (shard.c).  K/V blocks travel
 * around the ring; at every step a rank computes its Q against the block
 * it holds, with the block's global positions, so masks, alibi and
 * dropout see the positions of the unsharded problem.  The forward
 * accumulates partial results in f32 with the accumulate-mode kernels
 * (running LSE merge); the backward uses the forward's final LSE, so
 * the per-block dQ, dK, dV are exact parts of the full gradient and sum
 * to it.
 *
 * Forward, p2p, P = 4, rank r (blocks named by the rank that owns them):
 *
 *   step      0           1           2           3
 *   compute   Q.KV[r]     Q.KV[r-1]   Q.KV[r-2]   Q.KV[r-3]
 *   comm      KV[r]   ->r+1
 *             KV[r-1] <-r-1  KV[r-2] <-r-1  KV[r-3] <-r-1
 *             |<-- overlaps the step's compute -->|  wait: "exposed"
 *
 * P-1 exchanges, each posted before the step's kernels and waited after
 * them (double buffer: compute on one, receive into the other).  The
 * backward also rotates the f32 dK/dV accumulators: a block's
 * accumulator follows it around the ring, collecting each rank's part,
 * and one last exchange brings it home: P-1 K/V plus P dK/dV exchanges,
 * 2P-1 in all (3P-2 with the forward's, as PyTorch's ring counts).
 *
 *   step s:  post K/V exchange -> compute Q.KV[r-s] into dQ (local, f32)
 *            and this step's dK/dV part -> wait for the accumulator of
 *            block r-s (sent by rank r-1 last step) -> add the part ->
 *            post it to rank r+1 -> wait K/V
 *
 * The all-gather method (Llama 3 style) gathers every K/V once, computes
 * all blocks, and returns dK/dV with one reduce-scatter.
 *
 * Buffers: what travels (K/V, the dK/dV accumulators) and what adds up
 * (dQ, the per-block gradient parts) lives where the engine moves it.  On
 * sim and cpu device memory is host memory: the kernels read a block where
 * it arrived.  On cuda over NCCL the ring is resident: every buffer is
 * device memory the comm keeps, NCCL moves it in place, the sums are row
 * kernels, and the whole call is queued on its stream, transfers joined
 * by events (asynchronous with the caller's stream: docs/ring.md).  On
 * cuda over MPI the buffers are pinned host memory, staged to the device
 * for the kernels.
 *
 * Per (Q chunk, K/V chunk) pair the mask's visible band decides: skip
 * (no pair visible: nothing launched), full (all visible: the kernel
 * without the mask) or partial (the masked kernel) -- PyTorch's SKIP,
 * NOT_IS_CAUSAL and IS_CAUSAL, for any alignment, window and position.
 *
 * Packed documents (layout = varlen): every document is cut by the layout
 * on its own (zigzag: each document's 2P chunks, head and tail, as
 * PyTorch's per-document load balancer), so every rank holds a share of
 * each document's causal work; a rank's shard packs its pieces in
 * document order.  A step pairs each of this rank's pieces with the
 * visiting block's pieces of the SAME document (pairs across documents
 * see nothing and are never formed), at the pieces' positions in their
 * document and the document's totals, each launched as a padded batch of
 * one (aj_cp_as_padded: the padded kernels take the packed strides):
 *
 *   doc 0 |a0 a1 a2 a3|  doc 1 |b0 b1 b2 b3|       P = 2, zigzag
 *   rank 0: a0 a3 b0 b3    rank 1: a1 a2 b1 b2
 *   rank 0, step 1 (rank 1's block): a0.a1 a0.a2 a3.a1 a3.a2 b0.b1 ...
 *
 * Over messages a block goes only as far as a rank needs its keys, and
 * dK/dV parts go straight home (ring_plan.c: plan_needs); ops whose kernels must see
 * the document's batch index launch their varlen kernel (stage_doc_cu).
 */
#include <math.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "ir/diag.h"
#include "cp/comm/comm.h"
#include "cp/cp.h"
#include "runtime/runtime.h"
#include "templates/score.h"
#include "cp/ring_plan.h"
#include "templates/template.h"

enum { TAG_KV = 1, TAG_DKV = 2 };

/* The masked kernel, and the same op without its mask for full blocks
 * (NULL when the op has no mask), with the ops they compute; `kept`: the
 * comm's memo owns them (compile_kernels), the call only borrows them. */
typedef struct ring_kernels {
    aj_kernel *masked, *unmasked;
    aj_op *masked_op, *unmasked_op;
    bool kept;
} ring_kernels;

/* ---------------------------------------------------------------- tensors */

static size_t dtype_size(aj_dtype d)
{
    return d == AJ_DTYPE_F32 ? 4 : 2;
}

/* The view of a BHS(D) tensor's chunk of positions (dim 2). */
static aj_tensor seq_view(const aj_tensor *t, const aj_shard_chunk *c)
{
    aj_tensor v = *t;
    v.shape[2] = c->len;
    v.data = (char *)t->data + (size_t)(c->local * t->strides[2]) * dtype_size(t->dtype);
    return v;
}

static aj_status compile_variant(const ring_plan *p, const aj_op *op, int masked,
                                 aj_op **v, aj_kernel **out)
{
    aj_status st = AJ_OK;
    AJ_TRY(aj_op_clone(op, v));
    /* sinks: the forward's accumulator starts from them (fwd_clear_acc),
     * the backward's steps need no more than its LSE, and the front door
     * computes their gradient */
    AJ_TRY(aj_op_set_sinks(*v, NULL));
    if (p->op.kind == AJ_KIND_FORWARD)
        AJ_TRY(aj_op_set_accumulate(*v, true));
    if (!masked)
        AJ_TRY(aj_op_set_mask_none(*v));
    if (p->sh.varlen && !p->doc_kernels)   /* each document's pieces launch as padded tensors */
        AJ_TRY(aj_op_set_layout(*v, AJ_LAYOUT_PADDED));
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.device = p->dev;   /* its target, and its tuned schedule if there is one */
    AJ_TRY(aj_compile(p->ctx, *v, &opt, out));
done:
    return st;
}

static void free_kernels(ring_kernels *k)
{
    if (k->kept)
        return;
    aj_kernel_destroy(k->masked);
    aj_kernel_destroy(k->unmasked);
    aj_op_destroy(k->masked_op);
    aj_op_destroy(k->unmasked_op);
}

/*
 * The kernels of the comm's recent ring calls, kept on the comm
 * (comm->ring_memo) until it is destroyed: a call with the op of a kept
 * entry (the same canonical hash: kind, variant, dtype, mask, schedule,
 * every field) takes its kernels as they are, without aj_compile's
 * look-ups per call (hashing each variant, reading the tuning database
 * from disk, the kernel cache's key) -- 0.3-0.7 ms a call on cpu ranks,
 * where a block at 2048 positions takes 5-20 ms.  Only calls on the
 * comm's own context and device keep kernels: those outlive the comm
 * (aj_comm_create), another context may not.  A schedule aj_tune records
 * later reaches the op's kept kernels on a new comm.
 */
enum { MEMO_SLOTS = 4 };   /* a training step's forward and backward, of two ops */
typedef struct ring_memo {
    struct {
        char hash[AJ_HASH_HEX_LEN + 1];   /* the op's; "" for an empty slot */
        ring_kernels k;
        uint64_t used;                    /* the memo's clock at its last use */
    } slot[MEMO_SLOTS];
    uint64_t clock;
} ring_memo;

static void ring_memo_free(void *memo)
{
    ring_memo *m = memo;
    for (int i = 0; i < MEMO_SLOTS; i++) {
        m->slot[i].k.kept = false;
        free_kernels(&m->slot[i].k);
    }
    free(m);
}

/* The comm's memo, made on first use; NULL when the call's context or
 * device is not the comm's, or out of memory (the call then compiles as
 * if there were none). */
static ring_memo *memo_of(const ring_plan *p)
{
    aj_comm *comm = p->comm;
    if (p->ctx != comm->ctx || p->dev != comm->dev)
        return NULL;
    if (!comm->ring_memo && (comm->ring_memo = calloc(1, sizeof(ring_memo))))
        comm->ring_memo_free = ring_memo_free;
    return comm->ring_memo;
}

static aj_status compile_variants(const ring_plan *p, const aj_op *op, ring_kernels *k)
{
    aj_status st = compile_variant(p, op, 1, &k->masked_op, &k->masked);
    if (st == AJ_OK && p->op.mask != AJ_MASK_NONE)
        st = compile_variant(p, op, 0, &k->unmasked_op, &k->unmasked);
    return st;
}

/* The call's kernels: a kept entry's (stats.compile_s stays 0), else
 * compiled, and kept in the least recently used slot. */
static aj_status compile_kernels(const ring_plan *p, const aj_op *op, ring_kernels *k)
{
    const double t0 = aj_now();
    ring_memo *m = memo_of(p);
    char hash[AJ_HASH_HEX_LEN + 1] = "";
    int lru = 0;
    aj_status st = m ? aj_op_hash(op, hash) : AJ_OK;
    for (int i = 0; m && st == AJ_OK && i < MEMO_SLOTS; i++) {
        if (strcmp(m->slot[i].hash, hash) == 0) {
            m->slot[i].used = ++m->clock;
            *k = m->slot[i].k;
            return AJ_OK;
        }
        if (m->slot[i].used < m->slot[lru].used)
            lru = i;
    }
    if (st == AJ_OK)
        st = compile_variants(p, op, k);
    if (st == AJ_OK && m) {   /* the slot's kernels, if any, are the oldest call's */
        m->slot[lru].k.kept = false;
        free_kernels(&m->slot[lru].k);
        k->kept = true;
        m->slot[lru].k = *k;
        memcpy(m->slot[lru].hash, hash, sizeof hash);
        m->slot[lru].used = ++m->clock;
    }
    p->stats->compile_s += aj_now() - t0;
    return st;
}

/* Launch n's tiles (aj_ring_fwd_args.launch_tiles): the classes of the
 * kernel's own tiles for the launch `f`. */
static aj_status count_launch_tiles(const ring_plan *p, const ring_kernels *k,
                                    aj_ring_block kind, const aj_ring_fwd_args *a,
                                    const aj_fwd_args *f)
{
    const int32_t n = p->stats->launches - 1;
    if (!a->launch_tiles || n >= a->launch_tiles_cap)
        return AJ_OK;
    int full = kind == AJ_RING_BLOCK_FULL && k->unmasked;
    aj_block_mask *m = NULL;
    aj_status st = aj_block_mask_create(p->ctx, p->dev, full ? k->unmasked_op : k->masked_op,
                                        full ? k->unmasked : k->masked, f, &m);
    if (st == AJ_OK)
        st = aj_block_mask_counts(m, &a->launch_tiles[n]);
    aj_block_mask_destroy(m);
    return st;
}

/* Host buffers: what travels between ranks and what the copies on the
 * ring's stream read and write -- the device's host memory, pinned on a
 * GPU so those copies are asynchronous (and reused across calls). */
static aj_status alloc_host(const ring_plan *p, size_t bytes, int zero, void **out)
{
    return aj_device_host_alloc(p->dev, bytes ? bytes : 64, zero, out);
}

/* Device memory: the buffers the kernels read and write.  On sim (and
 * cpu) it is host memory and the copies are memcpy; on a GPU they stage
 * through the host, where MPI moves the bytes -- unless the ring is
 * resident, when they never leave the device.
 *
 * Every copy and launch goes on the ring's own stream, in order; the host
 * waits for that stream only where it reads what the GPU wrote, by
 * polling an event under the comm's timeout (ring_wait) -- never a
 * whole-context synchronisation, which would also wait for the NCCL
 * engine's stream and, with a dead peer, hang inside the driver. */
static aj_status dev_alloc(const ring_plan *p, size_t bytes, void **out)
{
    if (p->resident)   /* blocks the comm keeps: later calls allocate nothing */
        return aj_comm_block_get(p->comm, bytes, out);
    return aj_device_alloc(p->dev, bytes ? bytes : 64, out);
}

/* Frees dev_alloc's memory (NULL: nothing), once the work on it is done. */
static void dev_free(const ring_plan *p, void *ptr)
{
    if (p->resident)
        aj_comm_block_put(p->comm, ptr);
    else if (ptr)
        aj_device_free(p->dev, ptr);
}

/* What travels and what adds up (K/V blocks, the f32 accumulators): host
 * memory as alloc_host gives it, or where the ring is resident (cuda
 * ranks over NCCL) device memory, cleared on the ring's stream when
 * `zero`.  freed by free_sums. */
static aj_status alloc_sums(const ring_plan *p, size_t bytes, int zero, void **out)
{
    return aj_cp_buffer(p->dev, p->comm, p->resident, bytes, zero, p->stream, out);
}

static void free_sums(const ring_plan *p, void *ptr)
{
    aj_cp_buffer_free(p->dev, p->comm, p->resident, ptr);
}

static aj_status to_dev(const ring_plan *p, void *dst, const void *src, size_t bytes)
{
    return aj_device_copy_async(p->dev, dst, src, bytes, 1, p->stream);
}

/* The K/V block of a ring step as the kernels read it: where it arrived
 * (host memory devices, a resident ring), else its copy in `staged`
 * (device memory). */
static aj_status visiting_block(const ring_plan *p, void *staged, const void *arrived,
                                size_t bytes, const void **out)
{
    const bool in_place = p->host_memory || p->resident;
    *out = in_place ? arrived : staged;
    return in_place ? AJ_OK : to_dev(p, staged, arrived, bytes);
}

/* Queued only: the bytes are there after ring_wait. */
static aj_status from_dev(const ring_plan *p, void *dst, const void *src, size_t bytes)
{
    return aj_device_copy_async(p->dev, dst, src, bytes, 0, p->stream);
}

/* Waits for the work queued on the ring's stream, at most the comm's
 * timeout (AJ_ERR_COMM past it). */
static aj_status ring_wait(const ring_plan *p, const char *what)
{
    return aj_cp_wait(p->dev, p->stream, p->comm, p->fn, what);
}

/* This rank's K and V, packed (K, then V) into the block that travels
 * (alloc_sums: a resident ring's on the device). */
static aj_status pack_kv(const ring_plan *p, const aj_tensor *k, const aj_tensor *v,
                         void *kv)
{
    const size_t rows = (size_t)(p->B * p->Hkv * p->lk);
    const int dir = p->resident ? AJ_COPY_ON_DEVICE : 0;
    aj_status st = aj_device_copy_async(p->dev, kv, k->data, rows * (size_t)p->D * p->elem, dir,
                                        p->stream);
    if (st == AJ_OK)
        st = aj_device_copy_async(p->dev, (char *)kv + p->k_elems * p->elem, v->data,
                                  rows * (size_t)p->Dv * p->elem, dir, p->stream);
    /* resident: the send waits for the copies on the device (after_stream) */
    return st == AJ_OK && !p->resident ? ring_wait(p, "packing K and V") : st;
}

/* An f32 host buffer, rounded to the op's dtype, into device memory
 * (waited for: `scratch` is reused). */
static aj_status store_rounded(const ring_plan *p, const float *src, size_t count, void *dst,
                               void *scratch)
{
    if (p->host_memory)   /* device memory is host memory: rounded in place */
        return aj_convert(src, AJ_DTYPE_F32, dst, p->op.dtype, count);
    aj_status st = aj_convert(src, AJ_DTYPE_F32, scratch, p->op.dtype, count);
    if (st == AJ_OK)
        st = to_dev(p, dst, scratch, count * p->elem);
    return st == AJ_OK ? ring_wait(p, "storing the results") : st;
}

/* The f32 accumulator `acc` (rows x Dv, host memory), rounded into `dst`
 * (the op's dtype); rows whose `lse` is -inf saw no key and get O = 0,
 * whatever the accumulator holds there.  (Packed: O's row r, position
 * r / Hq of head r % Hq, has its LSE [Hq, lq] at (r % Hq) lq + r / Hq.) */
static aj_status store_rows(const ring_plan *p, const float *acc, const float *lse,
                            size_t rows, void *dst)
{
    const size_t dv = (size_t)p->Dv, hq = (size_t)p->Hq, lq = (size_t)p->lq;
#define ROW_EMPTY(r) (lse[p->sh.varlen ? ((r) % hq) * lq + (r) / hq : (r)] == -INFINITY)
    /* runs of rows alike: one conversion (or clearing) per run */
    for (size_t r = 0, end; r < rows; r = end) {
        const bool empty = ROW_EMPTY(r);
        for (end = r + 1; end < rows && ROW_EMPTY(end) == empty; end++)
            ;
        char *out = (char *)dst + r * dv * p->elem;
        const size_t n = (end - r) * dv;
        if (empty) {
            memset(out, 0, n * p->elem);
            continue;
        }
        aj_status st = aj_convert(acc + r * dv, AJ_DTYPE_F32, out, p->op.dtype, n);
        if (st != AJ_OK)
            return st;
    }
    return AJ_OK;
}
#undef ROW_EMPTY

/* ---------------------------------------------------------------- sums on the device */

/*
 * A resident ring (cuda ranks over NCCL) keeps what adds up in device
 * memory and sums there, with the row kernels (templates/rows.c,
 * aj_rows_launch) on the ring's stream: a gradient part's rows added into
 * (or stored as) an accumulator's, accumulators added whole, rows
 * cleared, and at the end the accumulators rounded into the outputs.
 * Elsewhere the same sums are host loops (add_rows, add_f32, ...).
 */

/* dst[i] += src[i] for n floats. */
static void add_f32(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* The row kernels a resident call runs: the op's dtype D and Dv wide,
 * and f32 `flat` wide for whole accumulators (the widest of 256 .. 8
 * that divides their length: D + Dv is a multiple of 16). */
static aj_status compile_rows(ring_plan *p)
{
    if (!p->resident)
        return AJ_OK;
    const int64_t n = (int64_t)(p->k_elems + p->v_elems);
    for (p->flat = 256; p->flat > 8 && n % p->flat; p->flat /= 2)
        ;
    const aj_target t = aj_device_target(p->dev);
    aj_status st = aj_compile_rows(p->ctx, t, p->op.dtype, (int32_t)p->D, &p->rows_d);
    if (st == AJ_OK)
        st = aj_compile_rows(p->ctx, t, p->op.dtype, (int32_t)p->Dv, &p->rows_dv);
    if (st == AJ_OK)
        st = aj_compile_rows(p->ctx, t, AJ_DTYPE_F32, (int32_t)p->flat, &p->rows_flat);
    return st;
}

/* The row kernel of width W (D or Dv). */
static const aj_kernel *rows_of(const ring_plan *p, int64_t W)
{
    return W == p->D ? p->rows_d : p->rows_dv;
}

/* An f32 accumulator of H heads, `acc_rows` positions and W wide in the
 * call's layout ([B, H, rows, W], varlen [rows, H, W]) as padded rows,
 * its positions row0 .. row0 + rows. */
static aj_tensor acc_rows_view(const ring_plan *p, const float *acc, int64_t H, int64_t acc_rows,
                               int64_t W, int64_t row0, int64_t rows)
{
    const aj_tensor t = aj_cp_rows((void *)acc, AJ_DTYPE_F32, &p->sh, H, acc_rows, W);
    const aj_tensor padded = aj_cp_as_padded(&t, &p->sh);
    const aj_shard_chunk c = {.local = row0, .len = rows};
    return seq_view(&padded, &c);
}

/* A resident ring's f32 accumulator `acc` of H heads, `len` positions and
 * W wide, rounded into the output `out` (the call's layout). */
static aj_status round_rows(const ring_plan *p, const float *acc, const aj_tensor *out,
                            int64_t H, int64_t len, int64_t W)
{
    const aj_tensor a = acc_rows_view(p, acc, H, len, W, 0, len);
    const aj_tensor o = aj_cp_as_padded(out, &p->sh);
    return aj_rows_launch(p->ctx, p->dev, rows_of(p, W), AJ_ROWS_ROUND, &o, &a, NULL,
                          p->stream);
}

/* n f32 as [1, 1, n / flat, flat] rows. */
static aj_tensor flat_view(const ring_plan *p, const float *x, size_t n)
{
    const int64_t w = p->flat;
    return (aj_tensor){(void *)x, AJ_DTYPE_F32, 4, {1, 1, (int64_t)n / w, w},
                       {(int64_t)n, (int64_t)n, w, 1}};
}

/* dst[0 .. n) += src[0 .. n), f32, in the ring's sums. */
static aj_status sums_add(const ring_plan *p, float *dst, const float *src, size_t n)
{
    if (!p->resident) {
        add_f32(dst, src, n);
        return AJ_OK;
    }
    const aj_tensor d = flat_view(p, dst, n), x = flat_view(p, src, n);
    return aj_rows_launch(p->ctx, p->dev, p->rows_flat, AJ_ROWS_ADD, &x, &d, NULL, p->stream);
}

/* dst[0 .. n) = 0, f32, in the ring's sums. */
static aj_status sums_zero(const ring_plan *p, float *dst, size_t n)
{
    if (!p->resident) {
        memset(dst, 0, n * sizeof(float));
        return AJ_OK;
    }
    return aj_device_fill32_async(p->dev, dst, 0, n, p->stream);
}

/* ---------------------------------------------------------------- comm */

/* The engine about to move the ring's buffers: where they are device
 * memory (resident), told so (comm->device_buffers, until engine_end;
 * the opening agreement and the methods' host buffers go as host
 * memory), and told to start the transfer on the device once the ring's
 * stream has done what it queued so far -- what writes the buffer sent
 * and what still reads the one received into (an earlier step's
 * kernels): comm->after_stream, an event the engine's stream waits for,
 * so the host never waits for the kernels. */
static aj_status engine_begin(ring_plan *p, const char *what)
{
    if (!p->resident)
        return AJ_OK;
    /* tests only: $AJ_TEST_RING_SKIP_WAIT names the transfers ("K/V",
     * "dK/dV") whose wait is left out -- a mis-ordered ring, which the
     * stand-in libcuda's stream-order model must catch (docs/design.md
     * "Emulated launches") */
    const char *skip = getenv("AJ_TEST_RING_SKIP_WAIT");
    aj_comm_device_transfers(p->comm, true, skip && strcmp(skip, what) == 0 ? NULL : p->stream);
    return AJ_OK;
}

static void engine_end(ring_plan *p)
{
    aj_comm_device_transfers(p->comm, false, NULL);
}

/* Sends `send` to rank `to` and receives `recv` from rank `from`; a
 * negative rank skips that side, and with both negative nothing is
 * posted (no rotation: req stays inactive). */
static aj_status exchange_with(ring_plan *p, aj_comm_req *req, const char *what,
                               const void *send, void *recv, size_t bytes, int to, int from,
                               int tag)
{
    *req = (aj_comm_req){.what = what, .to = to, .from = from, .bytes = bytes,
                         .posted = aj_now()};
    if (to < 0 && from < 0)
        return AJ_OK;
    aj_status st = engine_begin(p, what);
    if (st == AJ_OK)
        st = p->comm->engine->exchange_start(p->comm, send, recv, bytes, to, from, tag, req);
    engine_end(p);
    if (st == AJ_OK) {
        req->active = true;
        p->stats->rotations++;
    }
    return st;
}

/* With the neighbours: to rank r+1, from rank r-1. */
static aj_status exchange_start(ring_plan *p, aj_comm_req *req, const char *what,
                                const void *send, void *recv, size_t bytes, int tag)
{
    const int to = (p->rank + 1) % p->size, from = (p->rank + p->size - 1) % p->size;
    return exchange_with(p, req, what, send, recv, bytes, to, from, tag);
}

/* Step s's K/V exchange (p2p): block r-s on to rank r+1, and block
 * r-1-s in from rank r-1, each only while its reach goes on (ring_plan.c: plan_needs). */
static aj_status kv_exchange(ring_plan *p, aj_comm_req *req, int s, const void *send,
                             void *recv, size_t bytes)
{
    const int P = p->size, r = p->rank;
    const int to = aj_ring_reach_of(p, (r - s + P) % P) > s ? (r + 1) % P : -1;
    const int from = aj_ring_reach_of(p, (r - 1 - s + 2 * P) % P) > s ? (r + P - 1) % P : -1;
    return exchange_with(p, req, "K/V", send, recv, bytes, to, from, TAG_KV);
}

/* Lets MPI move the bytes while the kernels run (rendezvous transfers
 * progress only inside MPI calls).  A resident ring's transfers progress
 * on the device and are joined there (exchange_finish): nothing to poll,
 * so its host never asks the driver (nor may it in a graph capture). */
static aj_status exchange_progress(ring_plan *p, aj_comm_req *req)
{
    if (!req->active || req->completed || (p->resident && p->comm->engine->exchange_join))
        return AJ_OK;
    bool done = false;
    aj_status st = p->comm->engine->exchange_test(p->comm, req, &done);
    if (st == AJ_OK && done)
        req->completed = aj_now();
    return st;
}

static aj_status exchange_finish(ring_plan *p, aj_comm_req *req)
{
    if (!req->active)
        return AJ_OK;
    if (p->resident && p->comm->engine->exchange_join) {
        /* the ring's stream waits for it on the device; the host goes on
         * (a failure shows at the call's last wait: ring_close aborts) */
        req->active = false;
        p->stats->comm_s += aj_now() - req->posted;
        return p->comm->engine->exchange_join(p->comm, req, p->stream);
    }
    double waited = 0;
    aj_status st = aj_comm_wait(p->comm, req, p->fn, &waited);
    p->stats->exposed_comm_s += waited;
    p->stats->comm_s += (req->completed ? req->completed : aj_now()) - req->posted;
    return st;
}

/* A collective, timed: it overlaps nothing, so all of it is exposed. */
static void count_collective(ring_plan *p, double start)
{
    double t = aj_now() - start;
    p->stats->comm_s += t;
    p->stats->exposed_comm_s += t;
    p->stats->rotations++;
}

/* The all-gather method's exchange of blocks (parts = false: this rank's
 * K/V block, `send`, to every rank that needs it, and into recv[o] the
 * block of every o this rank needs) or of dK/dV parts (parts = true:
 * send[o], this rank's part of block o, home to each o it needs, and
 * into recv[r] the part of every r that needs this rank's block), each
 * `bytes` long: packed documents' all-to-all of what is needed
 * (ring_plan.c: plan_needs); a rank's own is copied too. */
static aj_status alltoall_needed(ring_plan *p, const void *send, size_t send_stride, void *recv,
                                 size_t bytes, bool parts)
{
    const int P = p->size, me = p->rank;
    size_t *n = calloc(4 * (size_t)P, sizeof *n);
    if (!n)
        return aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    size_t *send_bytes = n, *send_off = n + P, *recv_bytes = n + 2 * P, *recv_off = n + 3 * P;
    for (int d = 0; d < P; d++) {
        send_bytes[d] = (parts ? aj_ring_needs(p, me, d) : aj_ring_needs(p, d, me)) ? bytes : 0;
        recv_bytes[d] = (parts ? aj_ring_needs(p, d, me) : aj_ring_needs(p, me, d)) ? bytes : 0;
        send_off[d] = (size_t)d * send_stride;
        recv_off[d] = (size_t)d * bytes;
    }
    const double t0 = aj_now();
    aj_status st = engine_begin(p, "all-to-all");
    if (st == AJ_OK)
        st = aj_ring_collective_status(p, p->comm->engine->alltoallv(
            p->comm, send, send_bytes, send_off, recv, recv_bytes, recv_off));
    engine_end(p);
    count_collective(p, t0);
    free(n);
    return st;
}

/* The all-gather method's K/V: every rank's block into gathered[o], or
 * (packed documents) the blocks this rank needs. */
static aj_status gather_blocks(ring_plan *p, const void *kv, void *gathered, size_t bytes)
{
    if (p->size == 1 && p->resident)
        return aj_device_copy_async(p->dev, gathered, kv, bytes, AJ_COPY_ON_DEVICE, p->stream);
    if (p->size == 1) {
        memcpy(gathered, kv, bytes);
        return AJ_OK;
    }
    if (p->need)
        return alltoall_needed(p, kv, 0, gathered, bytes, false);
    const double t0 = aj_now();
    aj_status st = engine_begin(p, "all-gather");
    if (st == AJ_OK)
        st = aj_ring_collective_status(p, p->comm->engine->allgather(p->comm, kv, gathered,
                                                                     bytes));
    engine_end(p);
    count_collective(p, t0);
    return st;
}

/* ---------------------------------------------------------------- blocks */

/* Rank src's K/V shard length: the rows of its block. */
static int64_t block_len(const ring_plan *p, int src)
{
    return aj_ring_shard_len(p, src, 1);
}

/* K and V of rank src's shard inside a K/V buffer (K's slot, then V's). */
static void kv_tensors(const ring_plan *p, const void *kv, int src, aj_tensor *k, aj_tensor *v)
{
    const int64_t l = block_len(p, src);
    const aj_tensor kt = aj_cp_rows((void *)kv, p->op.dtype, &p->sh, p->Hkv, l, p->D);
    const aj_tensor vt = aj_cp_rows((char *)kv + p->k_elems * p->elem, p->op.dtype, &p->sh,
                                    p->Hkv, l, p->Dv);
    *k = aj_cp_as_padded(&kt, &p->sh);
    *v = aj_cp_as_padded(&vt, &p->sh);
}

static const aj_kernel *kernel_for(const ring_kernels *k, aj_ring_block kind)
{
    return kind == AJ_RING_BLOCK_FULL && k->unmasked ? k->unmasked : k->masked;
}

static void count_block(ring_plan *p, aj_ring_block kind)
{
    if (kind == AJ_RING_BLOCK_SKIP) {
        p->stats->skipped_blocks++;
        return;
    }
    p->stats->launches++;
    if (kind == AJ_RING_BLOCK_FULL)
        p->stats->full_blocks++;
    else
        p->stats->partial_blocks++;
}

/* The launch fields aj_fwd_args and aj_bwd_args share, for pair x of the
 * ring call p with arguments a (aj_ring_fwd_args or aj_ring_bwd_args):
 * the pair's pieces of q, o and lse and of the visiting block's kt and vt,
 * its global positions and its sequence's totals, side inputs, dropout
 * stream and stream. */
#define SET_PAIR_LAUNCH(l, p, a, x, kt, vt)   \
    do {                                      \
        (l).q = seq_view(&(a)->q, &(x)->q);   \
        (l).k = seq_view((kt), &(x)->k);      \
        (l).v = seq_view((vt), &(x)->k);      \
        (l).o = seq_view(&(a)->o, &(x)->q);   \
        (l).lse = seq_view(&(a)->lse, &(x)->q); \
        (l).alibi_slopes = (a)->alibi_slopes; \
        (l).side = (a)->side;                 \
        (l).num_side = (a)->num_side;         \
        (l).q_offset = (x)->q.global;         \
        (l).kv_offset = (x)->k.global;        \
        (l).sq_total = (x)->sq;               \
        (l).sk_total = (x)->sk;               \
        (l).seed = (a)->seed;                 \
        (l).offset = (a)->offset;             \
        (l).head_offset = (p)->head_offset;   \
        (l).heads_q_total = (p)->heads_q_total; \
        (l).stream = (p)->stream;             \
    } while (0)

/*
 * Packed documents with dropout or expressions reading b (doc_kernels):
 * pair x launches the op's varlen kernel over doc + 1 sequences, the
 * first doc of them empty and the last the pair's pieces, so the kernel's
 * batch index b -- the Philox counter's, the expressions' -- is the
 * document's, with the pieces' positions in it and its totals as ever:
 *
 *   cu_seqlens_q  0 0 .. 0 |Q piece|     (doc + 1 zeros, then its length)
 *   cu_seqlens_k  0 0 .. 0 |K piece|
 *
 * The kernel passes over the doc empty sequences.  The arrays of a
 * step's pairs are staged together (stage_doc_cu) before its launches.
 */
static aj_status stage_doc_cu(ring_plan *p, int n)
{
    if (!p->doc_kernels)
        return AJ_OK;
    size_t need = 0;
    for (int i = 0; i < n; i++)
        need += 2 * ((size_t)p->pairs[i].doc + 2);
    if (need > p->doc_cu_cap) {   /* grown between steps: no launch reads it now */
        int32_t *host = realloc(p->doc_cu_host, need * sizeof *host);
        if (!host)
            return aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
        p->doc_cu_host = host;
        if (!p->host_memory) {
            if (p->doc_cu)
                aj_device_free(p->dev, p->doc_cu);
            p->doc_cu = NULL;
            const aj_status st = aj_device_alloc(p->dev, need * sizeof *host,
                                                 (void **)&p->doc_cu);
            if (st != AJ_OK)
                return st;
        }
        p->doc_cu_cap = need;
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const ring_pair *x = &p->pairs[i];
        const size_t len = (size_t)x->doc + 2;
        int32_t *cu = p->doc_cu_host + at;
        memset(cu, 0, 2 * len * sizeof *cu);
        cu[len - 1] = (int32_t)x->q.len;
        cu[2 * len - 1] = (int32_t)x->k.len;
        p->doc_cu_at[i] = at;
        at += 2 * len;
    }
    return p->host_memory || at == 0
               ? AJ_OK
               : aj_device_copy_async(p->dev, p->doc_cu, p->doc_cu_host, at * sizeof(int32_t),
                                      1, p->stream);
}

/* A piece's padded view (seq_view of aj_cp_as_padded's [1, H, len, W], or
 * an LSE's [1, H, len]) as the packed tensor it is: [len, H, W], [H, len]. */
static aj_tensor as_packed(const aj_tensor *t)
{
    aj_tensor v = {.data = t->data, .dtype = t->dtype, .rank = t->rank - 1};
    const int rows = t->rank == 4;
    const int order[3] = {rows ? 2 : 1, rows ? 1 : 2, 3};
    for (int i = 0; i < v.rank; i++) {
        v.shape[i] = t->shape[order[i]];
        v.strides[i] = t->strides[order[i]];
    }
    return v;
}

/* Pair i (x) of the step as document x->doc of a varlen launch `l`
 * (aj_fwd_args or aj_bwd_args) whose tensors are padded piece views. */
#define SET_DOC_LAUNCH(l, p, i, x)                                                 \
    do {                                                                           \
        const int32_t *cu_ = ((p)->doc_cu ? (p)->doc_cu : (p)->doc_cu_host) +      \
                             (p)->doc_cu_at[i];                                    \
        (l).cu_seqlens_q = cu_;                                                    \
        (l).cu_seqlens_k = cu_ + (x)->doc + 2;                                     \
        (l).batch = (x)->doc + 1;                                                  \
        (l).max_seqlen_q = (int32_t)(x)->q.len;                                    \
        (l).max_seqlen_k = (int32_t)(x)->k.len;                                    \
        (l).q = as_packed(&(l).q);                                                 \
        (l).k = as_packed(&(l).k);                                                 \
        (l).v = as_packed(&(l).v);                                                 \
        (l).o = as_packed(&(l).o);                                                 \
        (l).lse = as_packed(&(l).lse);                                             \
    } while (0)

/* Q (all chunks) against the K/V block of ring step `step`, merged into
 * the f32 accumulator o_acc and args->lse. */
static aj_status fwd_block(ring_plan *p, const ring_kernels *kern, const aj_ring_fwd_args *a,
                           const void *kv, int step, const aj_tensor *o_acc, aj_comm_req *req)
{
    int n = 0;
    aj_status st = AJ_OK;
    AJ_TRY(aj_ring_plan_step(p, step, &n));
    AJ_TRY(stage_doc_cu(p, n));
    aj_tensor k, v;
    kv_tensors(p, kv, aj_ring_step_src(p, step), &k, &v);
    for (int i = 0; i < n; i++) {
        const ring_pair *x = &p->pairs[i];
        count_block(p, x->block);
        if (x->block == AJ_RING_BLOCK_SKIP)
            continue;
        aj_fwd_args f = AJ_FWD_ARGS_INIT;
        SET_PAIR_LAUNCH(f, p, a, x, &k, &v);
        f.o_acc = seq_view(o_acc, &x->q);
        if (p->doc_kernels) {
            SET_DOC_LAUNCH(f, p, i, x);
            f.o_acc = as_packed(&f.o_acc);
        }
        double t0 = aj_now();
        AJ_TRY(aj_forward(p->ctx, p->dev, kernel_for(kern, x->block), &f));
        p->stats->compute_s += aj_now() - t0;
        AJ_TRY(count_launch_tiles(p, kern, x->block, a, &f));
        AJ_TRY(exchange_progress(p, req));
    }
    /* a GPU runs the launches asynchronously: their time is compute too,
     * and the K/V buffer copied in is the next exchange's (resident: the
     * next transfer waits for them, engine_begin) */
    const double t0 = aj_now();
    if (!p->resident)
        AJ_TRY(ring_wait(p, "the step's kernels"));
    p->stats->compute_s += aj_now() - t0;
done:
    return st;
}

/* ---------------------------------------------------------------- shared memory */

/*
 * Where every rank is on one node and device memory is host memory, the
 * ring needs no messages: each rank packs its K/V block into its own
 * segment of memory every rank shares (aj_comm_shared_segments), and
 * every step reads the block of the step's rank where it lies.  Fences
 * order the writes and the reads:
 *
 *   forward    pack KV[r] -> fence -> blocks r, r-1, ... in place ->
 *              fence (closing: nobody packs the next call's block while
 *              a peer still reads this one; it overlaps the rounding of O)
 *   backward   pack KV[r] -> fence -> per step s: the block's dK/dV part
 *              into acc[s % n] -> wait for step s-1's fence -> add rank
 *              r-1's acc[(s-1) % n] (the block's sum so far) -> fence;
 *              after P steps rank r-1's last acc is block r's dK/dV -> fence
 *
 * (n = min(P, 3) accumulators per rank: rank r-1 overwrites acc[(s+1) % n]
 * at step s+1, after its step-s fence, which rank r starts only once it
 * has read acc[(s-1) % n].)  Elsewhere (a GPU, ranks on several nodes,
 * the all-gather method) the ring sends messages.
 */

/* The shared segments of `bytes` per rank (an array of P, freed by the
 * caller), or NULL: the ring sends messages.  Every rank decides alike:
 * what it depends on, the ranks agreed on (agree_on_call). */
static aj_status shared_segments(ring_plan *p, size_t bytes, void ***out)
{
    *out = NULL;
    if (!p->host_memory || p->rotate != AJ_ROTATE_P2P || p->size < 2)
        return AJ_OK;
    void **seg = malloc((size_t)p->size * sizeof *seg);
    if (!seg)
        return aj_fail(p->ctx, AJ_ERR_OUT_OF_MEMORY, "%s: out of memory", p->fn);
    const aj_status st = aj_comm_shared_segments(p->comm, bytes, seg);
    if (st == AJ_OK)
        *out = seg;
    else
        free(seg);
    return st == AJ_ERR_UNSUPPORTED ? AJ_OK : st;
}

/* Starts a fence over the shared segments, waited for as an exchange. */
static aj_status fence_start(ring_plan *p, aj_comm_req *req, const char *what)
{
    const int to = (p->rank + 1) % p->size, from = (p->rank + p->size - 1) % p->size;
    *req = (aj_comm_req){.what = what, .to = to, .from = from, .posted = aj_now()};
    aj_status st = p->comm->engine->shared_fence_start(p->comm, req);
    req->active = st == AJ_OK;
    return st;
}

/* The forward's steps over shared segments; the closing fence is left in
 * flight in `req`. */
static aj_status fwd_shared(ring_plan *p, const ring_kernels *kern, const aj_ring_fwd_args *a,
                            void **seg, const aj_tensor *o_acc, aj_comm_req *req)
{
    aj_status st = AJ_OK;
    AJ_TRY(pack_kv(p, &a->k, &a->v, seg[p->rank]));
    AJ_TRY(fence_start(p, req, "shared K/V"));
    for (int s = 0; s < p->size; s++) {
        const int src = aj_ring_step_src(p, s);
        if (src != p->rank) {   /* a block that arrived: a rotation */
            AJ_TRY(exchange_finish(p, req));
            p->stats->rotations++;
        }
        AJ_TRY(fwd_block(p, kern, a, seg[src], s, o_acc, req));
    }
    AJ_TRY(fence_start(p, req, "closing"));
done:
    return st;
}

/* ---------------------------------------------------------------- a call */

/* What a ring call holds besides its buffers, from start to end. */
typedef struct ring_call {
    ring_plan p;
    ring_kernels kern;
    aj_ring_stats stats;
    void **seg;      /* the ranks' shared segments (shared_segments) */
    double start;    /* aj_now() at the call */
} ring_call;

/* The kernels a planned ring call launches, and its stream. */
static aj_status ring_open(ring_call *c, const aj_op *op)
{
    aj_status st = compile_kernels(&c->p, op, &c->kern);
    if (st == AJ_OK)
        st = compile_rows(&c->p);
    if (st == AJ_OK && !c->p.stream)   /* the comm's (a hybrid call's is set) */
        st = aj_cp_stream(c->p.dev, c->p.comm, &c->p.stream);
    return st;
}

/* Tensors *t[0 .. n-1] as padded ones, in place: a packed one's pieces
 * launch so. */
static void as_padded(const aj_cp_shapes *sh, aj_tensor *const *t, int n)
{
    for (int i = 0; i < n; i++)
        *t[i] = aj_cp_as_padded(t[i], sh);
}

/* This rank's K/V block packed into what travels (*kv: host memory, a
 * resident ring's device memory), unless the ranks share segments (its
 * own segment holds it then); and where the kernels cannot read a block
 * where it arrives (a GPU ring staged through the host), the device
 * buffer (*kv_dev) they read each visiting block from. */
static aj_status own_kv(ring_plan *p, const aj_tensor *k, const aj_tensor *v, void **seg,
                        size_t kv_bytes, void **kv, void **kv_dev)
{
    aj_status st = AJ_OK;
    if (!seg) {
        AJ_TRY(alloc_sums(p, kv_bytes, 0, kv));
        AJ_TRY(pack_kv(p, k, v, *kv));
    }
    if (!p->host_memory && !p->resident)
        AJ_TRY(dev_alloc(p, kv_bytes, kv_dev));
done:
    return st;
}

/* Releases what the call holds (st: the call's status so far), its
 * exchanges still in flight cancelled. */
static void ring_close(ring_call *c, aj_comm *comm, aj_comm_req *reqs, int nreqs,
                       aj_status st)
{
    for (int i = 0; i < nreqs; i++)
        if (reqs[i].active)
            comm->engine->exchange_cancel(comm, &reqs[i]);
    /* a resident call's transfers joined to its stream: a wait that timed
     * out may be on one, whose NCCL kernels only an abort ends */
    if (st == AJ_ERR_COMM && c->p.resident && comm->engine->abort)
        comm->engine->abort(comm);
    free(c->seg);
    free_kernels(&c->kern);
    aj_ring_plan_free(&c->p);
}

/* Frees a call's buffers: its sums (alloc_sums), host and device
 * buffers; NULL ones are skipped. */
static void free_buffers(const ring_plan *p, void **sums, size_t nsums, void **host,
                         size_t nhost, void **device, size_t ndevice)
{
    aj_device *dev = p->dev;
    for (size_t i = 0; i < nsums; i++)
        free_sums(p, sums[i]);
    for (size_t i = 0; i < nhost; i++)
        aj_device_host_free(dev, host[i]);
    for (size_t i = 0; i < ndevice; i++)
        dev_free(p, device[i]);
}

/* A call's status, after its statistics (its time added) go to *out, if
 * asked for and the call succeeded. */
static aj_status ring_stats_out(ring_call *c, aj_status st, aj_ring_stats *out)
{
    c->stats.total_s = aj_now() - c->start;
    if (out && st == AJ_OK)
        *out = c->stats;
    return st;
}

/* ---------------------------------------------------------------- forward */

static aj_status fwd_clear_acc(ring_plan *p, const aj_ring_fwd_args *a, void *o_acc_dev,
                               size_t rows, void **host_o, void **typed_o);
static aj_status fwd_p2p(ring_plan *p, const ring_kernels *kern, const aj_ring_fwd_args *a,
                         void *kv[2], void *kv_dev, size_t kv_bytes, const aj_tensor *o_acc,
                         aj_comm_req *req);
static aj_status fwd_gathered(ring_plan *p, const ring_kernels *kern, const aj_ring_fwd_args *a,
                              const void *own, void **gathered, void *kv_dev, size_t kv_bytes,
                              const aj_tensor *o_acc, aj_comm_req *req);
static aj_status fwd_store(ring_plan *p, const aj_ring_fwd_args *a, const aj_tensor *o_acc,
                           size_t rows, void *host_o, void *typed_o);

aj_status aj_ring_forward_group(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                                const aj_ring_fwd_args *args, const aj_ring_group *group,
                                aj_ring_stats *stats)
{
    ring_call c = {.p = {.fn = "aj_ring_forward"}, .start = aj_now()};
    ring_plan *p = &c.p;
    void *kv[2] = {NULL, NULL}, *gathered = NULL, *host_o = NULL, *typed_o = NULL;  /* host */
    void *kv_dev = NULL, *o_acc_dev = NULL;                                          /* device */
    aj_comm_req req = {0};
    aj_status st = AJ_OK;
    AJ_TRY(aj_ring_plan_forward(p, ctx, dev, comm, op, args, group, &c.stats));
    aj_ring_fwd_args shards = *args;
    as_padded(&p->sh, (aj_tensor *[]){&shards.q, &shards.o, &shards.lse}, 3);
    AJ_TRY(ring_open(&c, op));

    const size_t kv_bytes = (p->k_elems + p->v_elems) * p->elem;
    const size_t rows = (size_t)(p->B * p->Hq * p->lq), o_count = rows * (size_t)p->Dv;
    AJ_TRY(dev_alloc(p, o_count * sizeof(float), &o_acc_dev));
    AJ_TRY(fwd_clear_acc(p, args, o_acc_dev, rows, &host_o, &typed_o));
    const aj_tensor o_acc_rows = aj_cp_rows(o_acc_dev, AJ_DTYPE_F32, &p->sh, p->Hq, p->lq, p->Dv);
    const aj_tensor o_acc = aj_cp_as_padded(&o_acc_rows, &p->sh);
    AJ_TRY(shared_segments(p, kv_bytes, &c.seg));
    AJ_TRY(own_kv(p, &args->k, &args->v, c.seg, kv_bytes, &kv[0], &kv_dev));
    if (c.seg)
        AJ_TRY(fwd_shared(p, &c.kern, &shards, c.seg, &o_acc, &req));
    else if (args->rotate == AJ_ROTATE_P2P)
        AJ_TRY(fwd_p2p(p, &c.kern, &shards, kv, kv_dev, kv_bytes, &o_acc, &req));
    else
        AJ_TRY(fwd_gathered(p, &c.kern, &shards, kv[0], &gathered, kv_dev, kv_bytes, &o_acc,
                            &req));
    AJ_TRY(fwd_store(p, args, &o_acc, rows, host_o, typed_o));
    AJ_TRY(exchange_finish(p, &req));   /* fwd_shared's closing fence */
done:
    ring_close(&c, comm, &req, 1, st);
    void *sums[] = {kv[0], kv[1], gathered}, *host[] = {host_o, typed_o};
    void *device[] = {kv_dev, o_acc_dev};
    free_buffers(p, sums, AJ_COUNT_OF(sums), host, AJ_COUNT_OF(host), device,
                 AJ_COUNT_OF(device));
    return ring_stats_out(&c, st, stats);
}

/* Row r's starting LSE: -inf (empty), or with sinks the sink of its head
 * (global: the hybrid group's head_offset + its head in the call), the
 * partial of O = 0 that counts the sink once (docs/ir.md "Sinks"). */
static float row_start(const ring_plan *p, size_t r)
{
    if (!aj_score_has_sinks(&p->prog))
        return -INFINITY;
    const aj_side_tensor *t = &p->host_side[p->prog.sinks];
    const int64_t h = (int64_t)(r / (size_t)p->lq) % p->Hq + p->head_offset;
    return h < t->shape[0] ? ((const float *)t->data)[h * t->strides[0]] : 0.0f;
}

/* The f32 accumulator starts empty: LSE = -inf on every row (with sinks,
 * the sink's partial).  Its O is then never read; in host memory it is
 * left as it is (rows no launch reaches are written as 0 at the end;
 * with sinks, cleared), on a GPU cleared, through the host buffers
 * fwd_store later reads the result into. */
static aj_status fwd_clear_acc(ring_plan *p, const aj_ring_fwd_args *a, void *o_acc_dev,
                               size_t rows, void **host_o, void **typed_o)
{
    const size_t o_count = rows * (size_t)p->Dv;
    aj_status st = AJ_OK;
    if (aj_score_has_sinks(&p->prog))
        AJ_TRY(aj_side_check_sinks(p->ctx, p->fn, p->prog.tensors[p->prog.sinks].name, a->side,
                                   a->num_side, p->heads_q_total ? p->heads_q_total : p->Hq));
    if (p->host_memory) {
        for (size_t i = 0; i < rows; i++)
            ((float *)a->lse.data)[i] = row_start(p, i);
        if (aj_score_has_sinks(&p->prog))
            memset(o_acc_dev, 0, o_count * sizeof(float));
        return AJ_OK;
    }
    if (p->resident) {   /* on the device: each head's run of rows starts alike */
        AJ_TRY(aj_device_fill32_async(p->dev, o_acc_dev, 0, o_count, p->stream));
        for (size_t r = 0; r < rows; r += (size_t)p->lq) {
            const float start = row_start(p, r);
            uint32_t bits;
            memcpy(&bits, &start, sizeof bits);
            AJ_TRY(aj_device_fill32_async(p->dev, (float *)a->lse.data + r, bits,
                                          (size_t)p->lq, p->stream));
        }
        return AJ_OK;
    }
    AJ_TRY(alloc_host(p, o_count * sizeof(float), 1, host_o));
    AJ_TRY(alloc_host(p, o_count * p->elem, 0, typed_o));
    AJ_TRY(to_dev(p, o_acc_dev, *host_o, o_count * sizeof(float)));
    AJ_TRY(ring_wait(p, "clearing the accumulator"));   /* host_o is reused */
    for (size_t i = 0; i < rows; i++)
        ((float *)*host_o)[i] = row_start(p, i);
    AJ_TRY(to_dev(p, a->lse.data, *host_o, rows * sizeof(float)));
    AJ_TRY(ring_wait(p, "clearing the accumulator"));
done:
    return st;
}

/* The forward's steps, rotating by point-to-point exchanges: the next
 * block arrives in the other half of kv (kv[1], allocated here) while the
 * kernels read this one. */
static aj_status fwd_p2p(ring_plan *p, const ring_kernels *kern, const aj_ring_fwd_args *a,
                         void *kv[2], void *kv_dev, size_t kv_bytes, const aj_tensor *o_acc,
                         aj_comm_req *req)
{
    const void *block = NULL;   /* the visiting K/V block the kernels read */
    aj_status st = AJ_OK;
    AJ_TRY(alloc_sums(p, kv_bytes, 0, &kv[1]));
    int cur = 0;
    for (int s = 0; s < p->size; s++) {
        if (s < p->size - 1)
            AJ_TRY(kv_exchange(p, req, s, kv[cur], kv[cur ^ 1], kv_bytes));
        AJ_TRY(visiting_block(p, kv_dev, kv[cur], kv_bytes, &block));
        AJ_TRY(fwd_block(p, kern, a, block, s, o_acc, req));
        AJ_TRY(exchange_finish(p, req));
        cur ^= 1;
    }
done:
    return st;
}

/* The forward's steps over every rank's block, gathered at once into
 * *gathered (allocated here) from each rank's `own`. */
static aj_status fwd_gathered(ring_plan *p, const ring_kernels *kern, const aj_ring_fwd_args *a,
                              const void *own, void **gathered, void *kv_dev, size_t kv_bytes,
                              const aj_tensor *o_acc, aj_comm_req *req)
{
    const void *block = NULL;
    aj_status st = AJ_OK;
    AJ_TRY(alloc_sums(p, kv_bytes * (size_t)p->size, 0, gathered));
    AJ_TRY(gather_blocks(p, own, *gathered, kv_bytes));
    for (int s = 0; s < p->size; s++) {
        const size_t at = (size_t)aj_ring_step_src(p, s) * kv_bytes;
        AJ_TRY(visiting_block(p, kv_dev, (char *)*gathered + at, kv_bytes, &block));
        AJ_TRY(fwd_block(p, kern, a, block, s, o_acc, req));
    }
done:
    return st;
}

/* The accumulator's rows (o_acc: the padded view of them) into the
 * caller's o, rounded to its dtype (rows that saw no key: 0), by the host
 * (a GPU's staged through host_o and typed_o) or a resident ring's row
 * kernel. */
static aj_status fwd_store(ring_plan *p, const aj_ring_fwd_args *a, const aj_tensor *o_acc,
                           size_t rows, void *host_o, void *typed_o)
{
    const size_t o_count = rows * (size_t)p->Dv;
    aj_status st = AJ_OK;
    if (p->host_memory)
        return store_rows(p, o_acc->data, a->lse.data, rows, a->o.data);
    if (p->resident) {
        const aj_tensor o = aj_cp_as_padded(&a->o, &p->sh), lse = aj_cp_as_padded(&a->lse, &p->sh);
        AJ_TRY(aj_rows_launch(p->ctx, p->dev, p->rows_dv, AJ_ROWS_ROUND_MASKED, &o, o_acc, &lse,
                              p->stream));
        return p->async ? AJ_OK : ring_wait(p, "the results");
    }
    AJ_TRY(from_dev(p, host_o, o_acc->data, o_count * sizeof(float)));
    AJ_TRY(ring_wait(p, "the last step's kernels"));
    AJ_TRY(store_rounded(p, host_o, o_count, a->o.data, typed_o));
done:
    return st;
}

/* ---------------------------------------------------------------- backward */


/* acc[o][row0 + i][:] += part[o][i][:] (part in `dtype`, `inner` wide,
 * `rows` rows per outer index; acc has acc_rows rows); with `store`,
 * acc[o][row0 + i][:] = part[o][i][:] (rows no launch of the step has
 * written yet: no clearing, no adding). */
static aj_status add_rows(float *acc, int64_t acc_rows, int64_t row0, const void *part,
                          aj_dtype dtype, int64_t outer, int64_t rows, int64_t inner,
                          float *scratch, bool store)
{
    const size_t n = (size_t)(rows * inner);
    const size_t esz = dtype_size(dtype);
    for (int64_t o = 0; o < outer; o++) {
        float *dst = acc + (size_t)(o * acc_rows + row0) * (size_t)inner;
        aj_status st = aj_convert((const char *)part + (size_t)o * n * esz, dtype,
                                  store ? dst : scratch, AJ_DTYPE_F32, n);
        if (st != AJ_OK)
            return st;
        if (!store)
            add_f32(dst, scratch, n);
    }
    return AJ_OK;
}

/* acc[o][row0 .. row0 + rows)[:] = 0, as add_rows lays acc out. */
static void clear_rows(float *acc, int64_t acc_rows, int64_t row0, int64_t outer, int64_t rows,
                       int64_t inner)
{
    for (int64_t o = 0; o < outer; o++)
        memset(acc + (size_t)(o * acc_rows + row0) * (size_t)inner, 0,
               (size_t)(rows * inner) * sizeof(float));
}

/* A launch's gradient part in the call's layout ([B, H, rows, W], varlen
 * [rows, H, W]), as the kernel writes it, and its rows added into the f32
 * accumulator of `acc_rows` rows from row0. */
static aj_tensor part_view(const ring_plan *p, void *data, int64_t H, int64_t rows, int64_t W)
{
    const aj_tensor t = aj_cp_rows(data, p->op.dtype, &p->sh, H, rows, W);
    return aj_cp_as_padded(&t, &p->sh);
}

/* An accumulator of H heads W wide as add_rows sees it: outer runs of
 * `inner` floats per row (varlen: positions H W apart, one run). */
static void acc_shape(const ring_plan *p, int64_t H, int64_t W, int64_t *outer, int64_t *inner)
{
    *outer = p->sh.varlen ? 1 : p->B * H;
    *inner = p->sh.varlen ? H * W : W;
}

static aj_status add_part(const ring_plan *p, float *acc, int64_t acc_rows, int64_t row0,
                          const void *part, int64_t H, int64_t rows, int64_t W, float *scratch,
                          bool store)
{
    if (p->resident) {   /* the row kernel, on the part where the kernel wrote it */
        const aj_tensor o = part_view(p, (void *)part, H, rows, W);
        const aj_tensor a = acc_rows_view(p, acc, H, acc_rows, W, row0, rows);
        return aj_rows_launch(p->ctx, p->dev, rows_of(p, W), store ? AJ_ROWS_STORE : AJ_ROWS_ADD,
                              &o, &a, NULL, p->stream);
    }
    int64_t outer, inner;
    acc_shape(p, H, W, &outer, &inner);
    return add_rows(acc, acc_rows, row0, part, p->op.dtype, outer, rows, inner, scratch, store);
}

/* A step's dK/dV accumulator (`dkv`, K part then V part, `lk` rows)
 * cleared where written[] says no launch has written, rows row0 ..
 * row0 + rows, in runs. */
static aj_status clear_unwritten(const ring_plan *p, float *dkv, int64_t lk,
                                 const bool *written, int64_t row0, int64_t rows)
{
    int64_t outer_k, inner_k, outer_v, inner_v;
    acc_shape(p, p->Hkv, p->D, &outer_k, &inner_k);
    acc_shape(p, p->Hkv, p->Dv, &outer_v, &inner_v);
    aj_status st = AJ_OK;
    for (int64_t r = row0, end; r < row0 + rows && st == AJ_OK; r = end) {
        for (end = r + 1; end < row0 + rows && written[end] == written[r]; end++)
            ;
        if (written[r])
            continue;
        if (p->resident) {   /* the row kernel's zero stage on both parts */
            const aj_tensor k = acc_rows_view(p, dkv, p->Hkv, lk, p->D, r, end - r);
            const aj_tensor v = acc_rows_view(p, dkv + p->k_elems, p->Hkv, lk, p->Dv, r,
                                              end - r);
            st = aj_rows_launch(p->ctx, p->dev, p->rows_d, AJ_ROWS_ZERO, &k, &k, NULL,
                                p->stream);
            if (st == AJ_OK)
                st = aj_rows_launch(p->ctx, p->dev, p->rows_dv, AJ_ROWS_ZERO, &v, &v, NULL,
                                    p->stream);
            continue;
        }
        clear_rows(dkv, lk, r, outer_k, end - r, inner_k);
        clear_rows(dkv + p->k_elems, lk, r, outer_v, end - r, inner_v);
    }
    return st;
}

/* The bytes of a grad side tensor's part and sum: its f32 elements, or
 * where the ring is resident whole rows of the f32 row kernel that adds
 * them (sums_add), zeros past its end. */
static size_t side_bytes(const ring_plan *p, const aj_side_tensor *t)
{
    const size_t n = (size_t)aj_side_numel(t), w = (size_t)p->flat;
    return (p->resident ? (n + w - 1) / w * w : n) * 4;
}

/* Per-launch outputs of the backward kernel (one Q chunk, one K/V chunk)
 * in device memory, their host copies, and the f32 scratch that adds them
 * up. */
typedef struct bwd_parts {
    void *dq, *dk, *dv;              /* device */
    void *dq_h, *dk_h, *dv_h;        /* host (on host-memory devices: dq, dk, dv) */
    size_t dq_bytes, dk_bytes, dv_bytes;
    float *scratch;
    /* the grad side tensors' gradients (args->dside): each launch's, in
     * device memory and its host copy, and this rank's sums (host) */
    int nside;
    aj_side_tensor side[AJ_OP_TENSORS_MAX + 1];   /* the tensors', then alibi's slopes */
    void *side_h[AJ_OP_TENSORS_MAX + 1];
    float *side_acc[AJ_OP_TENSORS_MAX + 1];
} bwd_parts;

/* A gradient part of `bytes`: in device memory, and its copy where the
 * sums read it -- `in_place`, the same buffer: added where the kernel
 * wrote it (host-memory devices; a resident ring's dQ, dK, dV, which add
 * up on the device), else host memory. */
static aj_status alloc_part(const ring_plan *p, size_t bytes, bool in_place, void **dev,
                           void **host)
{
    aj_status st = dev_alloc(p, bytes, dev);
    if (st == AJ_OK && in_place)
        *host = *dev;
    else if (st == AJ_OK)
        st = alloc_host(p, bytes, 0, host);
    return st;
}

/* Frees alloc_part's host copy (the device buffer is freed with the
 * others). */
static void free_part(const ring_plan *p, void *host, bool in_place)
{
    if (!in_place)
        aj_device_host_free(p->dev, host);
}

/* Q against the K/V block of ring step `step`: dQ parts into dq_acc,
 * the block's dK/dV parts into dkv (f32, K part then V part, as kv).
 * `fresh`: dkv holds nothing yet (not even zeros): a launch's rows that
 * no earlier launch of the step wrote are stored, not added, and the
 * rows none writes are cleared at the end -- no clearing of the whole
 * accumulator first. */
static aj_status bwd_block(ring_plan *p, const ring_kernels *kern, const aj_ring_bwd_args *a,
                           const void *kv, int step, float *dq_acc, float *dkv, bool fresh,
                           const bwd_parts *parts, aj_comm_req *reqs, int nreqs)
{
    int n = 0;
    aj_status st = AJ_OK;
    bool *written = NULL;   /* fresh: per row of the block, whether a launch wrote it */
    AJ_TRY(aj_ring_plan_step(p, step, &n));
    AJ_TRY(stage_doc_cu(p, n));
    aj_tensor k, v;
    const int64_t lk = block_len(p, aj_ring_step_src(p, step));
    kv_tensors(p, kv, aj_ring_step_src(p, step), &k, &v);
    float *dk_acc = dkv, *dv_acc = dkv + p->k_elems;
    if (fresh && !(written = calloc((size_t)lk + 1, sizeof *written)))
        return AJ_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) {
        const ring_pair *x = &p->pairs[i];
        count_block(p, x->block);
        if (x->block == AJ_RING_BLOCK_SKIP)
            continue;
        const int64_t cq = x->q.len, ck = x->k.len;
        aj_bwd_args b = AJ_BWD_ARGS_INIT;
        SET_PAIR_LAUNCH(b, p, a, x, &k, &v);
        b.do_ = seq_view(&a->do_, &x->q);
        b.dq = part_view(p, parts->dq, p->Hq, cq, p->D);
        b.dk = part_view(p, parts->dk, p->Hkv, ck, p->D);
        b.dv = part_view(p, parts->dv, p->Hkv, ck, p->Dv);
        if (p->doc_kernels) {
            SET_DOC_LAUNCH(b, p, i, x);
            b.do_ = as_packed(&b.do_);
            b.dq = as_packed(&b.dq);
            b.dk = as_packed(&b.dk);
            b.dv = as_packed(&b.dv);
        }
        b.dside = parts->side;
        b.num_dside = parts->nside;
        double t0 = aj_now();
        AJ_TRY(aj_backward(p->ctx, p->dev, kernel_for(kern, x->block), &b));
        if (!p->host_memory && !p->resident) {
            AJ_TRY(from_dev(p, parts->dq_h, parts->dq, parts->dq_bytes));
            AJ_TRY(from_dev(p, parts->dk_h, parts->dk, parts->dk_bytes));
            AJ_TRY(from_dev(p, parts->dv_h, parts->dv, parts->dv_bytes));
        }
        /* the side tensors' gradient parts add up in step order (sums_add:
         * on the device where the ring is resident, where side_h is the
         * part itself; else on the host, after the copy) */
        for (int t = 0; t < parts->nside && !p->host_memory && !p->resident; t++)
            AJ_TRY(from_dev(p, parts->side_h[t], parts->side[t].data,
                            (size_t)aj_side_numel(&parts->side[t]) * 4));
        if (!p->resident)   /* resident: the sums follow on the stream */
            AJ_TRY(ring_wait(p, "the block's kernels"));
        for (int t = 0; t < parts->nside; t++)
            AJ_TRY(sums_add(p, parts->side_acc[t], parts->side_h[t],
                            side_bytes(p, &parts->side[t]) / 4));
        AJ_TRY(add_part(p, dq_acc, p->lq, x->q.local, parts->dq_h, p->Hq, cq, p->D,
                        parts->scratch, false));
        bool store = false;   /* none of the launch's rows written yet */
        if (written) {
            int64_t seen = 0;
            for (int64_t r = x->k.local; r < x->k.local + ck; r++)
                seen += written[r];
            store = seen == 0;
            if (seen > 0 && seen < ck)   /* some rows written: the others from 0 */
                AJ_TRY(clear_unwritten(p, dkv, lk, written, x->k.local, ck));
            memset(written + x->k.local, 1, (size_t)ck * sizeof *written);
        }
        AJ_TRY(add_part(p, dk_acc, lk, x->k.local, parts->dk_h, p->Hkv, ck, p->D,
                        parts->scratch, store));
        AJ_TRY(add_part(p, dv_acc, lk, x->k.local, parts->dv_h, p->Hkv, ck, p->Dv,
                        parts->scratch, store));
        p->stats->compute_s += aj_now() - t0;
        for (int r = 0; r < nreqs; r++)
            AJ_TRY(exchange_progress(p, &reqs[r]));
    }
    if (written) {   /* rows no launch wrote, and the slots past a shorter block */
        AJ_TRY(clear_unwritten(p, dkv, lk, written, 0, lk));
        int64_t outer_k, inner_k, outer_v, inner_v;
        acc_shape(p, p->Hkv, p->D, &outer_k, &inner_k);
        acc_shape(p, p->Hkv, p->Dv, &outer_v, &inner_v);
        const size_t used_k = (size_t)(outer_k * lk * inner_k);
        const size_t used_v = (size_t)(outer_v * lk * inner_v);
        AJ_TRY(sums_zero(p, dk_acc + used_k, p->k_elems - used_k));
        AJ_TRY(sums_zero(p, dv_acc + used_v, p->v_elems - used_v));
    }
done:
    free(written);
    return st;
}

/* A backward's shared segment: its K/V block, then n f32 dK/dV
 * accumulators (the header of "shared memory"). */
typedef struct shared_layout {
    size_t kv_slot, dkv_count, bytes;
    int n;
} shared_layout;

static shared_layout shared_layout_of(const ring_plan *p)
{
    shared_layout l = {.dkv_count = p->k_elems + p->v_elems, .n = p->size < 3 ? p->size : 3};
    l.kv_slot = ((p->k_elems + p->v_elems) * p->elem + 63) / 64 * 64;
    l.bytes = l.kv_slot + (size_t)l.n * l.dkv_count * sizeof(float);
    return l;
}

/* Rank r's accumulator of step s. */
static float *shared_acc(void **seg, const shared_layout *l, int r, int s)
{
    return (float *)((char *)seg[r] + l->kv_slot) + (size_t)(s % l->n) * l->dkv_count;
}

/* The backward's steps over shared segments: *own gets this rank's
 * dK/dV sums, in rank r-1's segment (read them before the closing
 * fence). */
static aj_status bwd_shared(ring_plan *p, const ring_kernels *kern, const aj_ring_bwd_args *a,
                            void **seg, const shared_layout *l, float *dq_acc,
                            const bwd_parts *parts, aj_comm_req *req, float **own)
{
    const int prev = (p->rank + p->size - 1) % p->size;
    aj_status st = AJ_OK;
    AJ_TRY(pack_kv(p, &a->k, &a->v, seg[p->rank]));
    AJ_TRY(fence_start(p, req, "shared K/V"));
    for (int s = 0; s < p->size; s++) {
        const int src = aj_ring_step_src(p, s);
        p->stats->rotations += src != p->rank;   /* a block that arrived */
        float *mine = shared_acc(seg, l, p->rank, s);
        AJ_TRY(bwd_block(p, kern, a, seg[src], s, dq_acc, mine, true, parts, req, 1));
        /* step 0: the K/V fence; later: step s-1's, after which rank r-1's
         * accumulator holds the block's sum over ranks r-s .. r-1 */
        AJ_TRY(exchange_finish(p, req));
        if (s > 0) {
            const double t0 = aj_now();
            add_f32(mine, shared_acc(seg, l, prev, s - 1), l->dkv_count);
            p->stats->compute_s += aj_now() - t0;
        }
        AJ_TRY(fence_start(p, req, "shared dK/dV"));
        p->stats->rotations++;
    }
    AJ_TRY(exchange_finish(p, req));
    *own = shared_acc(seg, l, prev, p->size - 1);
done:
    return st;
}

/* The backward's p2p steps for packed documents (ring_plan.c: plan_needs): K/V only
 * as far as their reach (kv_exchange); at step s this rank's dK/dV part
 * of block r-s goes straight home to rank r-s, if this rank needed the
 * block, while rank r+s's part of this rank's block comes in (`in`) and
 * is added to `own`, which starts as step 0's part.  part[2]: the parts
 * computed, one in flight while the next is computed.
 *
 *   step s:  post K/V exchange -> part of block r-s -> wait for step s-1's
 *            parts, add the one that came in -> post part to r-s, from
 *            r+s -> wait K/V
 */
static aj_status bwd_p2p_home(ring_plan *p, const ring_kernels *kern, const aj_ring_bwd_args *a,
                              void *kv[2], void *kv_dev, float *dq_acc, const bwd_parts *parts,
                              float *own, float *part[2], float *in, aj_comm_req reqs[2])
{
    const int P = p->size, r = p->rank;
    const size_t count = p->k_elems + p->v_elems, kv_bytes = count * p->elem;
    const void *block = NULL;
    bool incoming = false;   /* reqs[1] brings a part of this rank's block */
    aj_status st = AJ_OK;
    for (int s = 0, kc = 0; s < P; s++, kc ^= 1) {
        if (s < P - 1)
            AJ_TRY(kv_exchange(p, &reqs[0], s, kv[kc], kv[kc ^ 1], kv_bytes));
        AJ_TRY(visiting_block(p, kv_dev, kv[kc], kv_bytes, &block));
        float *mine = s == 0 ? own : part[s % 2];
        AJ_TRY(bwd_block(p, kern, a, block, s, dq_acc, mine, s > 0, parts, reqs, 2));
        AJ_TRY(exchange_finish(p, &reqs[1]));
        if (incoming)
            AJ_TRY(sums_add(p, own, in, count));
        incoming = false;
        if (s > 0) {
            const int home = (r - s + P) % P, from = (r + s) % P;
            incoming = aj_ring_needs(p, from, r);
            AJ_TRY(exchange_with(p, &reqs[1], "dK/dV", mine, in, count * sizeof(float),
                                 aj_ring_needs(p, r, home) ? home : -1, incoming ? from : -1,
                                 TAG_DKV));
        }
        AJ_TRY(exchange_finish(p, &reqs[0]));
    }
    AJ_TRY(exchange_finish(p, &reqs[1]));
    if (incoming)
        AJ_TRY(sums_add(p, own, in, count));
done:
    return st;
}


/*
 * The backward's P2P rotation with the dK/dV accumulators relayed: each
 * step's block accumulates into the accumulator that came in from rank
 * r-1 and goes on to rank r+1 (acc: two f32 accumulators, the first
 * zeroed; step: the step's part); *own is this rank's block's when done.
 */
static aj_status bwd_p2p_relay(ring_plan *p, const ring_kernels *kern,
                               const aj_ring_bwd_args *a, void *kv[2], void *kv_dev,
                               float *dq_acc, const bwd_parts *parts, float *acc[2], void *step,
                               aj_comm_req reqs[2], float **own)
{
    const size_t dkv_count = p->k_elems + p->v_elems, kv_bytes = dkv_count * p->elem;
    const void *block = NULL;
    aj_status st = AJ_OK;
    int kc = 0, ac = 0;
    for (int s = 0; s < p->size; s++) {
        if (s < p->size - 1)
            AJ_TRY(kv_exchange(p, &reqs[0], s, kv[kc], kv[kc ^ 1], kv_bytes));
        AJ_TRY(visiting_block(p, kv_dev, kv[kc], kv_bytes, &block));
        AJ_TRY(bwd_block(p, kern, a, block, s, dq_acc, step, true, parts, reqs, 2));
        /* acc[ac]: the step's block's accumulator, fresh at step 0, else just
         * received from rank r-1 */
        AJ_TRY(exchange_finish(p, &reqs[1]));
        double t0 = aj_now();
        AJ_TRY(sums_add(p, acc[ac], step, dkv_count));
        p->stats->compute_s += aj_now() - t0;
        if (p->size > 1) {
            AJ_TRY(exchange_start(p, &reqs[1], "dK/dV", acc[ac], acc[ac ^ 1],
                                  dkv_count * sizeof(float), TAG_DKV));
            ac ^= 1;
        }
        AJ_TRY(exchange_finish(p, &reqs[0]));
        kc ^= 1;
    }
    AJ_TRY(exchange_finish(p, &reqs[1]));
    *own = acc[ac];
done:
    return st;
}

/* The backward's host buffers, freed together at the end. */
typedef struct bwd_buffers {
    void *kv[2];          /* this rank's K/V block; p2p: the arriving one */
    void *acc[2], *step;  /* f32 dK/dV: accumulators, a step's part */
    void *dq_acc;         /* f32 dQ */
    void *gathered, *all_dkv, *typed;
} bwd_buffers;

static aj_status bwd_alloc_parts(ring_plan *p, const aj_ring_bwd_args *a, bwd_parts *parts);
static aj_status bwd_p2p(ring_plan *p, const ring_kernels *kern, const aj_ring_bwd_args *a,
                         bwd_buffers *b, void *kv_dev, const bwd_parts *parts,
                         aj_comm_req reqs[2], float **own);
static aj_status bwd_gathered(ring_plan *p, const ring_kernels *kern, const aj_ring_bwd_args *a,
                              bwd_buffers *b, void *kv_dev, const bwd_parts *parts,
                              aj_comm_req reqs[2], float **own);

aj_status aj_ring_backward_group(aj_ctx *ctx, aj_device *dev, aj_comm *comm, const aj_op *op,
                                 const aj_ring_bwd_args *args, const aj_ring_group *group,
                                 aj_ring_stats *stats)
{
    ring_call c = {.p = {.fn = "aj_ring_backward"}, .start = aj_now()};
    ring_plan *p = &c.p;
    bwd_buffers b = {.typed = NULL};   /* host */
    bwd_parts parts = {0};
    void *kv_dev = NULL;        /* device */
    aj_comm_req reqs[2] = {{0}, {0}};   /* K/V, dK/dV */
    aj_status st = AJ_OK;
    AJ_TRY(aj_ring_plan_backward(p, ctx, dev, comm, op, args, group, &c.stats));
    aj_ring_bwd_args shards = *args;
    as_padded(&p->sh, (aj_tensor *[]){&shards.q, &shards.o, &shards.lse, &shards.do_}, 4);
    AJ_TRY(ring_open(&c, op));

    const size_t kv_bytes = (p->k_elems + p->v_elems) * p->elem;
    const size_t dkv_count = p->k_elems + p->v_elems;
    const size_t dq_count = (size_t)(p->B * p->Hq * p->lq * p->D);
    AJ_TRY(alloc_sums(p, dq_count * sizeof(float), 1, &b.dq_acc));
    if (!p->resident)   /* the host's rounding, staged to the device */
        AJ_TRY(alloc_host(p, (dq_count > dkv_count ? dq_count : dkv_count) * p->elem, 0,
                          &b.typed));
    AJ_TRY(bwd_alloc_parts(p, args, &parts));
    const shared_layout lay = shared_layout_of(p);
    AJ_TRY(shared_segments(p, lay.bytes, &c.seg));
    /* as the forward: in place where device memory is host memory */
    AJ_TRY(own_kv(p, &args->k, &args->v, c.seg, kv_bytes, &b.kv[0], &kv_dev));

    float *own = NULL;    /* this rank's dK/dV, f32, when done */
    if (c.seg)
        AJ_TRY(bwd_shared(p, &c.kern, &shards, c.seg, &lay, b.dq_acc, &parts, &reqs[0], &own));
    else if (args->rotate == AJ_ROTATE_P2P)
        AJ_TRY(bwd_p2p(p, &c.kern, &shards, &b, kv_dev, &parts, reqs, &own));
    else
        AJ_TRY(bwd_gathered(p, &c.kern, &shards, &b, kv_dev, &parts, reqs, &own));
    const size_t rows = (size_t)(p->B * p->Hkv * p->lk);   /* this rank's block, home */
    if (p->resident) {
        AJ_TRY(round_rows(p, own, &args->dk, p->Hkv, p->lk, p->D));
        AJ_TRY(round_rows(p, own + p->k_elems, &args->dv, p->Hkv, p->lk, p->Dv));
        AJ_TRY(round_rows(p, b.dq_acc, &args->dq, p->Hq, p->lq, p->D));
        if (!p->async)
            AJ_TRY(ring_wait(p, "the results"));
    } else {
        AJ_TRY(store_rounded(p, own, rows * (size_t)p->D, args->dk.data, b.typed));
        AJ_TRY(store_rounded(p, own + p->k_elems, rows * (size_t)p->Dv, args->dv.data,
                             b.typed));
        if (c.seg)   /* own was read in place: the closing fence, overlapping dQ's rounding */
            AJ_TRY(fence_start(p, &reqs[0], "closing"));
        AJ_TRY(store_rounded(p, b.dq_acc, dq_count, args->dq.data, b.typed));
    }
    for (int t = 0; t < parts.nside; t++)   /* this rank's parts (the front door sums) */
        AJ_TRY(aj_device_copy_async(p->dev, (void *)args->dside[t].data, parts.side_acc[t],
                                    (size_t)aj_side_numel(&parts.side[t]) * 4,
                                    p->resident ? AJ_COPY_ON_DEVICE : 1, p->stream));
    if (parts.nside && !p->resident)   /* before the front door reads them, side_acc freed
                                        * (resident: the front door's sums follow on the
                                        * stream) */
        AJ_TRY(ring_wait(p, "storing the side tensors' gradients"));
    AJ_TRY(exchange_finish(p, &reqs[0]));
done:
    ring_close(&c, comm, reqs, 2, st);
    const bool in_place = p->host_memory || p->resident;
    free_part(p, parts.dq_h, in_place);
    free_part(p, parts.dk_h, in_place);
    free_part(p, parts.dv_h, in_place);
    for (int t = 0; t < parts.nside; t++) {
        free_part(p, parts.side_h[t], in_place);
        free_sums(p, parts.side_acc[t]);
        dev_free(p, (void *)parts.side[t].data);
    }
    void *sums[] = {b.kv[0], b.kv[1], b.acc[0], b.acc[1], b.step, b.dq_acc, b.gathered,
                    b.all_dkv};
    void *host[] = {b.typed, parts.scratch}, *device[] = {kv_dev, parts.dq, parts.dk, parts.dv};
    free_buffers(p, sums, AJ_COUNT_OF(sums), host, AJ_COUNT_OF(host), device,
                 AJ_COUNT_OF(device));
    return ring_stats_out(&c, st, stats);
}

/* The gradient parts of the longest chunks: longest_chunk's, of the
 * longest document for packed ones (no chunk of a shorter one is longer),
 * and the f32 scratch that adds them up. */
static aj_status bwd_alloc_parts(ring_plan *p, const aj_ring_bwd_args *a, bwd_parts *parts)
{
    const int64_t cq = aj_ring_longest_chunk(p, p->sh.varlen ? p->docs.max_q : p->sq);
    const int64_t ck = aj_ring_longest_chunk(p, p->sh.varlen ? p->docs.max_k : p->sk);
    const int64_t width = p->D > p->Dv ? p->D : p->Dv;
    const int64_t chunk = cq > ck ? cq : ck;
    aj_status st = AJ_OK;
    parts->dq_bytes = (size_t)(p->B * p->Hq * cq * p->D) * p->elem;
    parts->dk_bytes = (size_t)(p->B * p->Hkv * ck * p->D) * p->elem;
    parts->dv_bytes = (size_t)(p->B * p->Hkv * ck * p->Dv) * p->elem;
    const bool in_place = p->host_memory || p->resident;
    AJ_TRY(alloc_part(p, parts->dq_bytes, in_place, &parts->dq, &parts->dq_h));
    AJ_TRY(alloc_part(p, parts->dk_bytes, in_place, &parts->dk, &parts->dk_h));
    AJ_TRY(alloc_part(p, parts->dv_bytes, in_place, &parts->dv, &parts->dv_h));
    if (!p->resident)   /* the host's sums of typed parts */
        AJ_TRY(alloc_host(p, (size_t)(chunk * width * (p->sh.varlen ? p->Hq : 1)) *
                                 sizeof(float), 0, (void **)&parts->scratch));
    for (int t = 0; t < a->num_dside; t++) {   /* the outputs' shapes, contiguous */
        const size_t bytes = side_bytes(p, &a->dside[t]);
        void *data = NULL;
        parts->side[t] = a->dside[t];
        parts->side[t].data = NULL;
        AJ_TRY(alloc_part(p, bytes, in_place, &data, &parts->side_h[t]));
        parts->side[t].data = data;
        parts->nside = t + 1;
        if (p->resident)   /* zeros past the part's end, which the kernel never writes */
            AJ_TRY(aj_device_fill32_async(p->dev, data, 0, bytes / 4, p->stream));
        AJ_TRY(alloc_sums(p, bytes, 1, (void **)&parts->side_acc[t]));
    }
done:
    return st;
}

/* The backward's steps, rotating by point-to-point exchanges: each
 * block's dK/dV parts go straight home where the ranks are packed
 * documents (bwd_p2p_home), else travel the ring with the block
 * (bwd_p2p_relay). */
static aj_status bwd_p2p(ring_plan *p, const ring_kernels *kern, const aj_ring_bwd_args *a,
                         bwd_buffers *b, void *kv_dev, const bwd_parts *parts,
                         aj_comm_req reqs[2], float **own)
{
    const size_t dkv_count = p->k_elems + p->v_elems, bytes = dkv_count * sizeof(float);
    const bool home = p->need != NULL;
    aj_status st = AJ_OK;
    AJ_TRY(alloc_sums(p, dkv_count * p->elem, 0, &b->kv[1]));
    AJ_TRY(alloc_sums(p, bytes, 1, &b->acc[0]));
    AJ_TRY(alloc_sums(p, bytes, !home, &b->acc[1]));
    AJ_TRY(alloc_sums(p, bytes, 0, &b->step));
    if (home) {
        AJ_TRY(alloc_sums(p, bytes, 0, &b->gathered));
        float *part[2] = {b->step, b->acc[1]};
        *own = b->acc[0];
        AJ_TRY(bwd_p2p_home(p, kern, a, b->kv, kv_dev, b->dq_acc, parts, *own, part,
                            b->gathered, reqs));
    } else {
        float *accs[2] = {b->acc[0], b->acc[1]};
        AJ_TRY(bwd_p2p_relay(p, kern, a, b->kv, kv_dev, b->dq_acc, parts, accs, b->step, reqs,
                             own));
    }
done:
    return st;
}

/* The backward's steps over every rank's block, gathered at once: each
 * block's dK/dV part into all_dkv, then summed home -- from the ranks
 * that need the block (packed documents), else by reduce-scatter. */
static aj_status bwd_gathered(ring_plan *p, const ring_kernels *kern, const aj_ring_bwd_args *a,
                              bwd_buffers *b, void *kv_dev, const bwd_parts *parts,
                              aj_comm_req reqs[2], float **own)
{
    const size_t dkv_count = p->k_elems + p->v_elems, kv_bytes = dkv_count * p->elem;
    const size_t bytes = dkv_count * sizeof(float);
    const void *block = NULL;   /* the visiting K/V block the kernels read */
    aj_status st = AJ_OK;
    AJ_TRY(alloc_sums(p, kv_bytes * (size_t)p->size, 0, &b->gathered));
    AJ_TRY(alloc_sums(p, bytes * (size_t)p->size, 1, &b->all_dkv));
    AJ_TRY(alloc_sums(p, bytes, 0, &b->step));
    AJ_TRY(gather_blocks(p, b->kv[0], b->gathered, kv_bytes));
    for (int s = 0; s < p->size; s++) {
        const size_t src = (size_t)aj_ring_step_src(p, s);
        AJ_TRY(visiting_block(p, kv_dev, (char *)b->gathered + src * kv_bytes, kv_bytes,
                              &block));
        AJ_TRY(bwd_block(p, kern, a, block, s, b->dq_acc, (float *)b->all_dkv + src * dkv_count,
                         false, parts, reqs, 0));
    }
    *own = b->step;
    if (p->size > 1 && p->need) {   /* the parts home, summed there */
        AJ_TRY(alloc_sums(p, bytes * (size_t)p->size, 0, &b->acc[0]));
        AJ_TRY(alltoall_needed(p, b->all_dkv, bytes, b->acc[0], bytes, true));
        AJ_TRY(sums_zero(p, b->step, dkv_count));
        for (int r = 0; r < p->size; r++)
            if (aj_ring_needs(p, r, p->rank))
                AJ_TRY(sums_add(p, b->step, (const float *)b->acc[0] + (size_t)r * dkv_count,
                                dkv_count));
    } else if (p->size > 1) {
        double t0 = aj_now();
        st = engine_begin(p, "reduce-scatter");
        if (st == AJ_OK)
            st = aj_ring_collective_status(p, p->comm->engine->reduce_scatter_f32(
                                                  p->comm, b->all_dkv, b->step, dkv_count));
        engine_end(p);
        count_collective(p, t0);
        if (st != AJ_OK)
            goto done;
    } else {
        *own = b->all_dkv;
    }
done:
    return st;
}
