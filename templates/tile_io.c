/*
 * tile_io.c -- global <-> shared tile movement (see tile_io.h).
 */
#include "templates/tile_io.h"

#include <assert.h>

#include "templates/attn_common.h"

static LLVMTypeRef vec_type(LLVMTypeRef elem, unsigned n)
{
    return LLVMVectorType(elem, n);
}

static LLVMValueRef smem_float_ptr(aj_kb *kb, int32_t smem_off, LLVMValueRef idx)
{
    LLVMValueRef bytes = LLVMBuildShl(kb->b, idx, aj_kb_i32(kb, 2), "");
    bytes = LLVMBuildAdd(kb->b, bytes, aj_kb_i32(kb, smem_off), "");
    return aj_kb_smem_ptr(kb, bytes);
}

LLVMValueRef aj_smem_load4(aj_kb *kb, int32_t smem_off, LLVMValueRef idx)
{
    return aj_kb_load(kb, vec_type(kb->t_f32, 4), smem_float_ptr(kb, smem_off, idx), 16);
}

void aj_smem_store1(aj_kb *kb, int32_t smem_off, LLVMValueRef idx, LLVMValueRef v)
{
    aj_kb_store(kb, v, smem_float_ptr(kb, smem_off, idx), 4);
}

/* Widens a vector of n storage elements to n floats. */
static LLVMValueRef widen(aj_kb *kb, LLVMValueRef raw, unsigned n, aj_dtype dtype)
{
    LLVMBuilderRef b = kb->b;
    if (dtype == AJ_DTYPE_F32)
        return raw;
    if (dtype == AJ_DTYPE_BF16) {
        /* bf16 is the top half of an f32: widening moves bits, exactly */
        LLVMValueRef w = LLVMBuildZExt(b, raw, vec_type(kb->t_i32, n), "");
        LLVMValueRef sixteen = LLVMConstVector((LLVMValueRef[]){aj_kb_i32(kb, 16)}, 1);
        sixteen = LLVMBuildShuffleVector(b, sixteen, LLVMGetUndef(LLVMTypeOf(sixteen)),
                                         LLVMConstNull(vec_type(kb->t_i32, n)), "");
        w = LLVMBuildShl(b, w, sixteen, "");
        return LLVMBuildBitCast(b, w, vec_type(kb->t_f32, n), "");
    }
    LLVMValueRef out = LLVMGetUndef(vec_type(kb->t_f32, n));
    for (unsigned e = 0; e < n; e++) {
        LLVMValueRef x = LLVMBuildExtractElement(b, raw, aj_kb_i32(kb, e), "");
        out = LLVMBuildInsertElement(b, out, aj_kb_to_f32(kb, x, dtype), aj_kb_i32(kb, e), "");
    }
    return out;
}

/* Lanes lo..lo+3 of a vector. */
static LLVMValueRef quarter(aj_kb *kb, LLVMValueRef v, unsigned lo)
{
    LLVMValueRef idx[4];
    for (unsigned e = 0; e < 4; e++)
        idx[e] = aj_kb_i32(kb, lo + e);
    return LLVMBuildShuffleVector(kb->b, v, LLVMGetUndef(LLVMTypeOf(v)),
                                  LLVMConstVector(idx, 4), "");
}

/* The element offset of (row, col) of a paged tile, from its row table
 * at rows_smem (tile_io.h); *page gets the row's page (-1: none, the
 * offset then meaningless). */
static LLVMValueRef paged_elem(aj_kb *kb, const aj_tile_src *src, LLVMValueRef rows_smem,
                               LLVMValueRef stride_page, int rows, LLVMValueRef row,
                               LLVMValueRef col, LLVMValueRef *page)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef at = LLVMBuildAdd(b, rows_smem, LLVMBuildShl(b, row, aj_kb_i32(kb, 2), ""), "");
    *page = aj_kb_load(kb, kb->t_i32, aj_kb_smem_ptr(kb, at), 4);
    LLVMValueRef in_page = aj_kb_load(kb, kb->t_i32, aj_kb_smem_ptr(kb, LLVMBuildAdd(b, at,
                                      aj_kb_i32(kb, 4 * rows), "")), 4);
    LLVMValueRef elem = LLVMBuildAdd(b, LLVMBuildMul(b, LLVMBuildSExt(b, *page, kb->t_i64, ""),
                                                     stride_page, ""),
                                     LLVMBuildMul(b, LLVMBuildSExt(b, in_page, kb->t_i64, ""),
                                                  src->row_stride, ""), "");
    return LLVMBuildAdd(b, LLVMBuildAdd(b, elem, src->elem_base, ""),
                        LLVMBuildZExt(b, col, kb->t_i64, ""), "");
}

/*
 * Thread t handles chunks t, t+T, t+2T, ... of the tile, a chunk being the
 * 16 bytes at (row, col .. col+vec-1):
 *
 *     chunk = row * (width / vec) + col / vec
 *
 * The steps run as a loop (one body to compile, whatever the tile size).  A
 * row past the sequence end reads the last valid row (always in bounds: a
 * tile exists only when its sequence is non-empty) and stores zeros, so the
 * loads need no branch.
 */
static void tile_load(aj_kb *kb, const aj_tile_src *src, LLVMValueRef rows_smem,
                      LLVMValueRef stride_page, LLVMValueRef stage, int rows, int width,
                      int32_t smem_off, int ld, LLVMValueRef tid, int threads)
{
    LLVMBuilderRef b = kb->b;
    int size = aj_dtype_size(src->dtype);
    int vec = size == 1 ? 8 : 16 / size;           /* elements per chunk */
    int chunks_per_row = width / vec;
    int total = rows * chunks_per_row;
    LLVMTypeRef elem_t = aj_kb_storage_type(kb, src->dtype);
    LLVMTypeRef raw_t = vec_type(elem_t, (unsigned)vec);
    LLVMValueRef zero = LLVMConstNull(vec_type(kb->t_f32, (unsigned)vec));

    LLVMValueRef chunk = aj_kb_for_begin(kb, tid, aj_kb_i32(kb, total), aj_kb_i32(kb, threads),
                                         "chunk");
    LLVMValueRef row = LLVMBuildUDiv(b, chunk, aj_kb_i32(kb, chunks_per_row), "");
    LLVMValueRef col = LLVMBuildMul(b, LLVMBuildURem(b, chunk, aj_kb_i32(kb, chunks_per_row), ""),
                                    aj_kb_i32(kb, vec), "");
    LLVMValueRef vals;
    if (stage) {
        /* staged: the raw row landed by aj_tile_issue_paged_async (zeros
         * where the row has no page), pitch width elements */
        LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildMul(b, row, aj_kb_i32(kb, width), ""), col, "");
        at = LLVMBuildAdd(b, stage, LLVMBuildMul(b, at, aj_kb_i32(kb, size), ""), "");
        vals = widen(kb, aj_kb_load(kb, raw_t, aj_kb_smem_ptr(kb, at), (unsigned)(vec * size)),
                     (unsigned)vec, src->dtype);
    } else if (rows_smem) {
        /* paged: the row's place from the table; a row without one reads
         * nothing (its page may not exist) */
        LLVMValueRef page;
        LLVMValueRef elem = paged_elem(kb, src, rows_smem, stride_page, rows, row, col, &page);
        LLVMValueRef var = aj_kb_var(kb, LLVMTypeOf(zero), zero, "paged_vals");
        aj_kb_set(kb, var, zero);
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSGE, page, aj_kb_i32(kb, 0), ""));
        LLVMValueRef byte = LLVMBuildMul(b, elem, aj_kb_i64(kb, size), "");
        LLVMValueRef raw = aj_kb_load(kb, raw_t, aj_kb_gptr_offset(kb, src->ptr, byte),
                                      (unsigned)(vec * size));
        aj_kb_set(kb, var, widen(kb, raw, (unsigned)vec, src->dtype));
        aj_kb_if_end(kb);
        vals = aj_kb_get(kb, var);
    } else {
        /* a row past the sequence end reads the last valid row (in bounds:
         * a tile exists only when its sequence is non-empty), stores zeros */
        LLVMValueRef last_row = LLVMBuildSub(b, src->rows_limit, aj_kb_i32(kb, 1), "");
        LLVMValueRef grow = LLVMBuildAdd(b, src->row0, row, "");
        LLVMValueRef inside = LLVMBuildICmp(b, LLVMIntSLT, grow, src->rows_limit, "");
        LLVMValueRef rrow = LLVMBuildSelect(b, inside, grow, last_row, "");
        LLVMValueRef elem = LLVMBuildMul(b, LLVMBuildSExt(b, rrow, kb->t_i64, ""),
                                         src->row_stride, "");
        elem = LLVMBuildAdd(b, elem, src->elem_base, "");
        elem = LLVMBuildAdd(b, elem, LLVMBuildZExt(b, col, kb->t_i64, ""), "");
        LLVMValueRef byte = LLVMBuildMul(b, elem, aj_kb_i64(kb, size), "");
        LLVMValueRef raw = aj_kb_load(kb, raw_t, aj_kb_gptr_offset(kb, src->ptr, byte),
                                      (unsigned)(vec * size));
        vals = LLVMBuildSelect(b, inside, widen(kb, raw, (unsigned)vec, src->dtype), zero, "");
    }
    LLVMValueRef sidx = LLVMBuildAdd(b, LLVMBuildMul(b, row, aj_kb_i32(kb, ld), ""), col, "");
    for (int q = 0; q < vec / 4; q++) {
        LLVMValueRef at = LLVMBuildAdd(b, sidx, aj_kb_i32(kb, q * 4), "");
        aj_kb_store(kb, vec == 4 ? vals : quarter(kb, vals, (unsigned)q * 4),
                    smem_float_ptr(kb, smem_off, at), 16);
    }
    aj_kb_for_end(kb);
}

void aj_tile_load_f32(aj_kb *kb, const aj_tile_src *src, int rows, int width,
                      int32_t smem_off, int ld, LLVMValueRef tid, int threads)
{
    tile_load(kb, src, NULL, NULL, NULL, rows, width, smem_off, ld, tid, threads);
}

void aj_tile_load_paged_f32(aj_kb *kb, const aj_tile_src *src, LLVMValueRef rows_smem,
                            LLVMValueRef stride_page, int rows, int width, int32_t smem_off,
                            int ld, LLVMValueRef tid, int threads)
{
    tile_load(kb, src, rows_smem, stride_page, NULL, rows, width, smem_off, ld, tid, threads);
}

void aj_tile_widen_staged_f32(aj_kb *kb, aj_dtype dtype, LLVMValueRef stage, int rows,
                              int width, int32_t smem_off, int ld, LLVMValueRef tid, int threads)
{
    const aj_tile_src src = {.dtype = dtype};
    tile_load(kb, &src, NULL, NULL, stage, rows, width, smem_off, ld, tid, threads);
}

/*
 * Thread t issues chunks t, t+T, ... of the tile, a chunk being 16 bytes
 * of a row (vec = 16 / size elements): from the row's place in the cache
 * (the row table, as tile_load's paged rows) to the staging buffer, raw.
 * A row without a page reads nothing: src-size 0 zero-fills its chunk,
 * its source the cache's base (aligned; never read).
 */
void aj_tile_issue_paged_async(aj_kb *kb, const aj_tile_src *src, LLVMValueRef rows_smem,
                               LLVMValueRef stride_page, int rows, int width, LLVMValueRef stage,
                               LLVMValueRef tid, int threads)
{
    LLVMBuilderRef b = kb->b;
    int size = aj_dtype_size(src->dtype);
    int vec = 16 / size;
    int chunks_per_row = width / vec;
    LLVMValueRef chunk = aj_kb_for_begin(kb, tid, aj_kb_i32(kb, rows * chunks_per_row),
                                         aj_kb_i32(kb, threads), "chunk");
    LLVMValueRef row = LLVMBuildUDiv(b, chunk, aj_kb_i32(kb, chunks_per_row), "");
    LLVMValueRef col = LLVMBuildMul(b, LLVMBuildURem(b, chunk, aj_kb_i32(kb, chunks_per_row), ""),
                                    aj_kb_i32(kb, vec), "");
    LLVMValueRef page;
    LLVMValueRef elem = paged_elem(kb, src, rows_smem, stride_page, rows, row, col, &page);
    LLVMValueRef has = LLVMBuildICmp(b, LLVMIntSGE, page, aj_kb_i32(kb, 0), "");
    LLVMValueRef byte = LLVMBuildSelect(b, has, LLVMBuildMul(b, elem, aj_kb_i64(kb, size), ""),
                                        aj_kb_i64(kb, 0), "");
    LLVMValueRef sat = LLVMBuildAdd(b, LLVMBuildMul(b, chunk, aj_kb_i32(kb, 16), ""), stage, "");
    aj_kb_cp_async_16(kb, aj_kb_smem_ptr(kb, sat), aj_kb_gptr_offset(kb, src->ptr, byte),
                      LLVMBuildSelect(b, has, aj_kb_i32(kb, 16), aj_kb_i32(kb, 0), ""));
    aj_kb_for_end(kb);
}

/* Entry r of a row table of `rows` rows at shared byte offset smem:
 * page[r] then, rows entries on, in_page[r] (aj_tile_paged_rows_bytes). */
static void store_row_entry(aj_kb *kb, LLVMValueRef smem, int rows, LLVMValueRef r,
                            LLVMValueRef page, LLVMValueRef in_page)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef at = LLVMBuildAdd(b, smem, LLVMBuildShl(b, r, aj_kb_i32(kb, 2), ""), "");
    aj_kb_store(kb, page, aj_kb_smem_ptr(kb, at), 4);
    aj_kb_store(kb, in_page, aj_kb_smem_ptr(kb, LLVMBuildAdd(b, at, aj_kb_i32(kb, 4 * rows), "")),
                4);
}

void aj_tile_paged_rows(aj_kb *kb, LLVMValueRef smem, int rows, LLVMValueRef key0,
                        LLVMValueRef len, LLVMValueRef bidx, LLVMValueRef tid, int threads)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef ps = aj_param(kb, AJ_PID(page_size));
    LLVMValueRef page = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, -1), "row_page");
    LLVMValueRef r = aj_kb_for_begin(kb, tid, aj_kb_i32(kb, rows), aj_kb_i32(kb, threads), "r");
    LLVMValueRef p = LLVMBuildAdd(b, key0, r, "");
    LLVMValueRef valid = LLVMBuildICmp(b, LLVMIntSLT, p, len, "");
    LLVMValueRef slot = LLVMBuildUDiv(b, LLVMBuildSelect(b, valid, p, aj_kb_i32(kb, 0), ""), ps,
                                      "slot");
    LLVMValueRef in_page = LLVMBuildSub(b, p, LLVMBuildMul(b, slot, ps, ""), "in_page");
    aj_kb_set(kb, page, aj_kb_i32(kb, -1));
    aj_kb_if_begin(kb, valid);
    {
        LLVMValueRef ok;
        LLVMValueRef got = aj_attn_paged_page(kb, bidx, slot, &ok);
        aj_attn_paged_fault(kb, LLVMBuildNot(b, ok, ""), bidx);
        aj_kb_set(kb, page, LLVMBuildSelect(b, ok, got, aj_kb_i32(kb, -1), ""));
    }
    aj_kb_if_end(kb);
    store_row_entry(kb, smem, rows, r, aj_kb_get(kb, page), in_page);
    aj_kb_for_end(kb);
}

void aj_tile_stacked_rows(aj_kb *kb, LLVMValueRef smem, int rows, LLVMValueRef row0,
                          LLVMValueRef count, LLVMValueRef per, LLVMValueRef tid, int threads)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef r = aj_kb_for_begin(kb, tid, aj_kb_i32(kb, rows), aj_kb_i32(kb, threads), "r");
    LLVMValueRef p = LLVMBuildAdd(b, row0, r, "");
    LLVMValueRef valid = LLVMBuildICmp(b, LLVMIntSLT, p, count, "");
    /* (per >= 1 wherever a row is valid; the max keeps the division safe) */
    LLVMValueRef slice = LLVMBuildUDiv(b, LLVMBuildSelect(b, valid, p, aj_kb_i32(kb, 0), ""),
                                       aj_kb_smax(kb, per, aj_kb_i32(kb, 1)), "slice");
    LLVMValueRef in_slice = LLVMBuildSub(b, p, LLVMBuildMul(b, slice, per, ""), "in_slice");
    store_row_entry(kb, smem, rows, r, LLVMBuildSelect(b, valid, slice, aj_kb_i32(kb, -1), ""),
                    in_slice);
    aj_kb_for_end(kb);
}

void aj_global_store4(aj_kb *kb, LLVMValueRef ptr, LLVMValueRef elem,
                      LLVMValueRef vals[4], aj_dtype dtype)
{
    LLVMBuilderRef b = kb->b;
    LLVMTypeRef elem_t = aj_kb_storage_type(kb, dtype);
    LLVMValueRef v = LLVMGetUndef(vec_type(elem_t, 4));
    for (int e = 0; e < 4; e++)
        v = LLVMBuildInsertElement(b, v, aj_kb_from_f32(kb, vals[e], dtype), aj_kb_i32(kb, e), "");
    LLVMValueRef byte = LLVMBuildMul(b, elem, aj_kb_i64(kb, aj_dtype_size(dtype)), "");
    aj_kb_store(kb, v, aj_kb_gptr_offset(kb, ptr, byte), (unsigned)(4 * aj_dtype_size(dtype)));
}

LLVMValueRef aj_global_load4(aj_kb *kb, LLVMValueRef ptr, LLVMValueRef elem,
                             aj_dtype dtype)
{
    LLVMValueRef byte = LLVMBuildMul(kb->b, elem, aj_kb_i64(kb, aj_dtype_size(dtype)), "");
    LLVMValueRef raw = aj_kb_load(kb, vec_type(aj_kb_storage_type(kb, dtype), 4),
                                  aj_kb_gptr_offset(kb, ptr, byte),
                                  (unsigned)(4 * aj_dtype_size(dtype)));
    return widen(kb, raw, 4, dtype);
}

void aj_mma_tile_zero_pad(aj_kb *kb, LLVMValueRef smem_off, int rows, int width,
                          LLVMValueRef tid, int threads)
{
    if (aj_mma_k_width(width) == width)
        return;
    LLVMBuilderRef b = kb->b;
    int ld = aj_mma_tile_ld(width);
    LLVMValueRef zero = LLVMConstNull(vec_type(kb->t_i32, 4));   /* the 8 pad elements */
    for (int x = 0; x * threads < rows; x++) {
        LLVMValueRef r = LLVMBuildAdd(b, tid, aj_kb_i32(kb, (int64_t)x * threads), "");
        int guard = (x + 1) * threads > rows;
        if (guard)
            aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, r, aj_kb_i32(kb, rows), ""));
        LLVMValueRef elem = LLVMBuildAdd(b, LLVMBuildMul(b, r, aj_kb_i32(kb, ld), ""),
                                         aj_kb_i32(kb, width), "");
        LLVMValueRef at = LLVMBuildAdd(b, smem_off, LLVMBuildShl(b, elem, aj_kb_i32(kb, 1), ""),
                                       "");
        aj_kb_store(kb, zero, aj_kb_smem_ptr(kb, at), 16);
        if (guard)
            aj_kb_if_end(kb);
    }
}

LLVMValueRef aj_wgmma_tile_offset(aj_kb *kb, LLVMValueRef row, LLVMValueRef col, int rows,
                                  int width)
{
    LLVMBuilderRef b = kb->b;
    int span = aj_wgmma_panel_span(width), per_panel = span / 2;
    LLVMValueRef panel = LLVMBuildUDiv(b, col, aj_kb_i32(kb, per_panel), "");
    LLVMValueRef in_panel = LLVMBuildURem(b, col, aj_kb_i32(kb, per_panel), "");
    LLVMValueRef off = aj_kb_add(
        kb, LLVMBuildMul(b, panel, aj_kb_i32(kb, rows * span), ""),
        aj_kb_add(kb, LLVMBuildMul(b, row, aj_kb_i32(kb, span), ""),
                  LLVMBuildShl(b, in_panel, aj_kb_i32(kb, 1), "")));
    return aj_kb_swizzle(kb, off, span);
}

LLVMValueRef aj_smem_at(aj_kb *kb, LLVMValueRef base, int64_t bytes)
{
    return aj_kb_smem_ptr(kb, aj_kb_add(kb, base, aj_kb_i32(kb, bytes)));
}

/* The byte offset of a K-major k-step at column `col` from the tile's start. */
static int64_t kmajor_at(int rows, int width, int col)
{
    int span = aj_wgmma_panel_span(width), per_panel = span / 2;
    return (int64_t)(col / per_panel) * rows * span + 2 * (col % per_panel);
}

LLVMValueRef aj_wgmma_kmajor_desc(aj_kb *kb, LLVMValueRef base, int rows, int width, int col)
{
    int span = aj_wgmma_panel_span(width);
    return aj_kb_wgmma_desc(kb, aj_smem_at(kb, base, kmajor_at(rows, width, col)), 16, 8 * span,
                            aj_kb_swizzle_mode(span));
}

LLVMValueRef aj_wgmma_kmajor_step(aj_kb *kb, LLVMValueRef desc0, int rows, int width, int col)
{
    return aj_kb_wgmma_desc_plus(kb, desc0, kmajor_at(rows, width, col));
}

LLVMValueRef aj_wgmma_nmajor_step(aj_kb *kb, LLVMValueRef desc0, int width, int k0)
{
    return aj_kb_wgmma_desc_plus(kb, desc0, (int64_t)k0 * aj_wgmma_panel_span(width));
}

LLVMValueRef aj_wgmma_nmajor_desc(aj_kb *kb, LLVMValueRef base, int rows, int width, int col,
                                  int k0)
{
    int span = aj_wgmma_panel_span(width), per_panel = span / 2;
    assert(col % per_panel == 0);
    int64_t at = (int64_t)(col / per_panel) * rows * span + (int64_t)k0 * span;
    return aj_kb_wgmma_desc(kb, aj_smem_at(kb, base, at), rows * span, 8 * span,
                            aj_kb_swizzle_mode(span));
}

int aj_row_group_lanes(int w)
{
    int g = 32;
    while (g > 1 && w % (4 * g) != 0)
        g /= 2;
    return g;
}

aj_status aj_row_width_check(aj_ctx *ctx, const aj_op *op, int limit, const char *takes)
{
    int w = aj_op_dv(op);
    if (w % 8 != 0 || w > limit)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "head_dim_v = %d: %s multiples of 8 up to %d",
                       w, takes, limit);
    return AJ_OK;
}

LLVMValueRef aj_row_offset(aj_kb *kb, aj_param_source t, LLVMValueRef b, LLVMValueRef h,
                           LLVMValueRef row, int has_seq_stride)
{
    LLVMBuilderRef bld = kb->b;
    LLVMValueRef off = LLVMBuildMul(bld, aj_kb_sext64(kb, b), aj_param_stride(kb, t, 0), "");
    off = LLVMBuildAdd(bld, off,
                       LLVMBuildMul(bld, aj_kb_sext64(kb, h), aj_param_stride(kb, t, 1), ""), "");
    LLVMValueRef s = aj_kb_sext64(kb, row);
    if (has_seq_stride)
        s = LLVMBuildMul(bld, s, aj_param_stride(kb, t, 2), "");
    return LLVMBuildAdd(bld, off, s, "");
}
