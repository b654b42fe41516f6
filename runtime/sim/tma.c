/*
 * tma.c -- cp.async.bulk.tensor (TMA) on the emulator, and the emulator's
 * own tensor maps (hopper.h; docs/sim.md, "TMA").
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "runtime/sim/hopper_internal.h"

/*
 * The emulator's tensor map (hopper.h): what cuTensorMapEncodeTiled would
 * keep, in 128 bytes.  A box lands in shared memory densely, dimension 0
 * fastest, with the swizzle of wgmma's operands (aj_sim_swizzled()) applied to
 * the shared offset -- which is why a swizzled destination must be aligned
 * to the pattern's 8 rows of `span` bytes (1024 for 128-byte swizzle).
 */
#define TENSOR_MAP_MAGIC 0x504d5441u   /* "ATMP" */

typedef struct sim_tensor_map {
    uint32_t magic;
    int32_t rank, elem_bytes, span, oob_nan;
    uint32_t box[5];
    uint64_t base;
    uint64_t dims[5];
    uint64_t strides[5];
} sim_tensor_map;

_Static_assert(sizeof(sim_tensor_map) == 128, "a tensor map is 128 bytes");

static aj_status tensor_map_refuse(aj_ctx *ctx, const aj_sim_tensor_map_args *a)
{
    if (a->elem_bytes != 1 && a->elem_bytes != 2 && a->elem_bytes != 4 && a->elem_bytes != 8)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: elem_bytes = %d, want 1, 2, 4 or 8",
                       a->elem_bytes);
    if (a->rank < 1 || a->rank > 5)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: rank = %d, want 1..5", a->rank);
    if ((uintptr_t)a->base % 16)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: base %p is not 16-byte aligned",
                       a->base);
    for (int i = 0; i < a->rank; i++) {
        if (a->dims[i] < 1 || a->dims[i] > (1ull << 32))
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: dims[%d] = %llu, want 1..2^32",
                           i, (unsigned long long)a->dims[i]);
        if (i > 0 && (a->strides[i] % 16 || a->strides[i] >= (1ull << 40)))
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: strides[%d] = %llu bytes, want "
                           "a multiple of 16 under 2^40", i, (unsigned long long)a->strides[i]);
        if (a->box[i] < 1 || a->box[i] > 256)
            return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: box[%d] = %u, want 1..256", i,
                           a->box[i]);
    }
    uint32_t inner = a->box[0] * (uint32_t)a->elem_bytes;
    if (inner % 16)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: box[0] = %u elements of %d bytes "
                       "is %u bytes, not a multiple of 16", a->box[0], a->elem_bytes, inner);
    if (a->span != 0 && a->span != 32 && a->span != 64 && a->span != 128)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: span = %d, want 0 (no swizzle), "
                       "32, 64 or 128", a->span);
    if (a->span && inner > (uint32_t)a->span)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: the inner box of %u bytes exceeds "
                       "the %d-byte swizzle span", inner, a->span);
    return AJ_OK;
}

aj_status aj_sim_tensor_map_encode(aj_ctx *ctx, void *map, const aj_sim_tensor_map_args *args)
{
    if ((uintptr_t)map % 64)
        return aj_fail(ctx, AJ_ERR_INVALID_ARG, "tensor map: map %p is not 64-byte aligned", map);
    aj_status st = tensor_map_refuse(ctx, args);
    if (st != AJ_OK)
        return st;
    sim_tensor_map m;
    memset(&m, 0, sizeof m);
    m.magic = TENSOR_MAP_MAGIC;
    m.rank = args->rank;
    m.elem_bytes = args->elem_bytes;
    m.span = args->span;
    m.oob_nan = args->oob_nan != 0;
    m.base = (uint64_t)(uintptr_t)args->base;
    for (int i = 0; i < args->rank; i++) {
        m.box[i] = args->box[i];
        m.dims[i] = args->dims[i];
        m.strides[i] = i ? args->strides[i] : (uint64_t)args->elem_bytes;
    }
    memcpy(map, &m, sizeof m);
    return AJ_OK;
}

/* The map at `map` (global memory of the launch), checked; faults on t. */
static sim_tensor_map tensor_map_at(sim_thread *t, const char *op, const void *map, int rank)
{
    aj_sim_check_alignment(t, op, (uintptr_t)map, 128, 64, 0);
    aj_sim_check_global_bounds(t, op, (uintptr_t)map, 128);
    sim_tensor_map m;
    memcpy(&m, map, sizeof m);
    if (m.magic != TENSOR_MAP_MAGIC)
        aj_sim_faultf(t, "%s: %p holds no tensor map (aj_sim_tensor_map_encode makes them)", op,
                      map);
    if (m.rank != rank)
        aj_sim_faultf(t, "%s: the tensor map has rank %d", op, m.rank);
    return m;
}

static uint32_t box_bytes(const sim_tensor_map *m)
{
    uint32_t n = (uint32_t)m->elem_bytes;
    for (int i = 0; i < m->rank; i++)
        n *= m->box[i];
    return n;
}

/* The shared tile [smem, + box bytes): aligned for its swizzle, inside. */
static void check_tile(sim_thread *t, const char *op, const sim_tensor_map *m,
                       const uint8_t *smem)
{
    uintptr_t align = m->span ? 8u * (uintptr_t)m->span : 128;
    uint32_t offset = (uint32_t)(smem - t->w->smem);
    if (offset % align)
        aj_sim_faultf(t, "%s: shared offset %u is not %zu-byte aligned, as %s needs", op, offset,
                      (size_t)align, m->span ? "the swizzle pattern" : "a bulk tensor copy");
    aj_sim_check_shared_bounds(t, op, (uintptr_t)smem, (int32_t)box_bytes(m));
}

/* Walks the box: for element e (dimension 0 fastest), its shared offset
 * from the tile, swizzled, and its global address or NULL out of bounds. */
typedef void (*box_visit)(sim_thread *t, const sim_tensor_map *m, uint32_t tile_offset,
                          uint8_t *global, void *user);

static void walk_box(sim_thread *t, const sim_tensor_map *m, uint32_t tile, const int32_t *c,
                     box_visit visit, void *user)
{
    uint32_t total = box_bytes(m) / (uint32_t)m->elem_bytes;
    for (uint32_t e = 0; e < total; e++) {
        uint32_t rest = e;
        int inside = 1;
        uint64_t at = m->base;
        for (int d = 0; d < m->rank; d++) {
            int64_t x = (int64_t)c[d] + rest % m->box[d];
            rest /= m->box[d];
            inside &= x >= 0 && (uint64_t)x < m->dims[d];
            at += (uint64_t)x * m->strides[d];
        }
        uint32_t offset = aj_sim_swizzled(tile + e * (uint32_t)m->elem_bytes, m->span);
        visit(t, m, offset, inside ? (uint8_t *)(uintptr_t)at : NULL, user);
    }
}

static void load_element(sim_thread *t, const sim_tensor_map *m, uint32_t offset,
                         uint8_t *global, void *user)
{
    uint8_t *dst = t->w->smem + offset;
    (void)user;
    if (global) {
        aj_sim_check_global_bounds(t, "TMA load", (uintptr_t)global, m->elem_bytes);
        memcpy(dst, global, (size_t)m->elem_bytes);
    } else if (m->oob_nan && m->elem_bytes >= 2) {
        memset(dst, 0xff, (size_t)m->elem_bytes);   /* NaN in f16, bf16, f32, f64 */
    } else {
        memset(dst, 0, (size_t)m->elem_bytes);
    }
}

static void store_element(sim_thread *t, const sim_tensor_map *m, uint32_t offset,
                          uint8_t *global, void *user)
{
    (void)user;
    if (!global)
        return;
    aj_sim_check_global_bounds(t, "TMA store", (uintptr_t)global, m->elem_bytes);
    memcpy(global, t->w->smem + offset, (size_t)m->elem_bytes);
}

/* The box lands at issue: in strict mode its bytes count as written by
 * the issuing thread, so only the mbarrier's completion (which the
 * transaction bytes hold back) orders a reader after them. */
static void tma_load(sim_thread *t, int rank, uint8_t *dst, const void *map, const int32_t *c,
                     uint8_t *bar)
{
    static const char op[] = "cp.async.bulk.tensor (TMA load)";
    sim_tensor_map m = tensor_map_at(t, op, map, rank);
    check_tile(t, op, &m, dst);
    mbarrier *mb = aj_sim_mbarrier_at(t, op, bar);
    uint32_t tile = (uint32_t)(dst - t->w->smem);
    if (t->w->shadow)
        aj_sim_shadow_write(t, "TMA load", (uintptr_t)dst, (int)box_bytes(&m), W_TMA,
                            t->w->seq);
    walk_box(t, &m, tile, c, load_element, NULL);
    aj_sim_mbarrier_transact(t, mb, op, (int32_t)box_bytes(&m));
}

static void tma_store(sim_thread *t, int rank, const void *map, const int32_t *c, uint8_t *src)
{
    static const char op[] = "cp.async.bulk.tensor (TMA store)";
    sim_tensor_map m = tensor_map_at(t, op, map, rank);
    check_tile(t, op, &m, src);
    if (t->w->shadow) {
        uint32_t tile = (uint32_t)(src - t->w->smem);
        for (uint32_t b = 0; b < box_bytes(&m); b += GRANULE) {
            int writer = aj_sim_unfenced_writer(t->w, tile + b);
            if (writer >= 0)
                aj_sim_faultf(t, "%s reads shared offset %u, which thread %d wrote through the "
                              "generic proxy with no fence.proxy.async after it", op, tile + b,
                              writer);
        }
        aj_sim_shadow_read(t, "TMA store", (uintptr_t)src, (int)box_bytes(&m));
    }
    walk_box(t, &m, (uint32_t)(src - t->w->smem), c, store_element, NULL);
}

void aj_sim_tma_load_2d(sim_thread *t, uint8_t *dst, const void *map, int32_t c0, int32_t c1,
                        uint8_t *bar)
{
    tma_load(t, 2, dst, map, (const int32_t[]){c0, c1}, bar);
}

void aj_sim_tma_load_3d(sim_thread *t, uint8_t *dst, const void *map, int32_t c0, int32_t c1,
                        int32_t c2, uint8_t *bar)
{
    tma_load(t, 3, dst, map, (const int32_t[]){c0, c1, c2}, bar);
}

void aj_sim_tma_load_4d(sim_thread *t, uint8_t *dst, const void *map, int32_t c0, int32_t c1,
                        int32_t c2, int32_t c3, uint8_t *bar)
{
    tma_load(t, 4, dst, map, (const int32_t[]){c0, c1, c2, c3}, bar);
}

void aj_sim_tma_load_5d(sim_thread *t, uint8_t *dst, const void *map, int32_t c0, int32_t c1,
                        int32_t c2, int32_t c3, int32_t c4, uint8_t *bar)
{
    tma_load(t, 5, dst, map, (const int32_t[]){c0, c1, c2, c3, c4}, bar);
}

void aj_sim_tma_store_2d(sim_thread *t, const void *map, int32_t c0, int32_t c1, uint8_t *src)
{
    tma_store(t, 2, map, (const int32_t[]){c0, c1}, src);
}

void aj_sim_tma_store_3d(sim_thread *t, const void *map, int32_t c0, int32_t c1, int32_t c2,
                         uint8_t *src)
{
    tma_store(t, 3, map, (const int32_t[]){c0, c1, c2}, src);
}

void aj_sim_tma_store_4d(sim_thread *t, const void *map, int32_t c0, int32_t c1, int32_t c2,
                         int32_t c3, uint8_t *src)
{
    tma_store(t, 4, map, (const int32_t[]){c0, c1, c2, c3}, src);
}

void aj_sim_tma_store_5d(sim_thread *t, const void *map, int32_t c0, int32_t c1, int32_t c2,
                         int32_t c3, int32_t c4, uint8_t *src)
{
    tma_store(t, 5, map, (const int32_t[]){c0, c1, c2, c3, c4}, src);
}

/* The stores are done at issue, so the bulk groups only count. */
void aj_sim_bulk_commit_group(sim_thread *t)
{
    (void)t;
}

void aj_sim_bulk_wait_group_read(sim_thread *t, int32_t pending)
{
    if (pending < 0 || pending > 63)
        aj_sim_faultf(t, "cp.async.bulk.wait_group.read %d: N must be 0..63", pending);
}
