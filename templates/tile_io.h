/*
 * tile_io.h -- moving tiles between global and shared memory.
 *
 * A tile is `rows` rows of `width` elements of one (batch, head) slice of a
 * BHSD tensor.  Loads widen to f32 in shared memory, 16 bytes per thread
 * per step, and zero-fill rows past the sequence end, so the math after
 * them needs no bounds checks and never meets garbage (0 * NaN).
 */
#ifndef AJ_TEMPLATES_TILE_IO_H
#define AJ_TEMPLATES_TILE_IO_H

#include "codegen/kbuilder.h"
#include "templates/params.h"

typedef struct aj_tile_src {
    LLVMValueRef ptr;          /* global base pointer */
    LLVMValueRef elem_base;    /* i64: element offset of the slice */
    LLVMValueRef row_stride;   /* i64: elements between rows */
    LLVMValueRef row0;         /* i32: first row of the tile */
    LLVMValueRef rows_limit;   /* i32: rows at or past this read as zero */
    aj_dtype dtype;
} aj_tile_src;

/* layout = paged: the same copy with tile row r taken from the tile's
 * row table at shared byte offset rows_smem (i32; aj_tile_paged_rows
 * writes it): row in_page[r] of page page[r],
 *
 *   elem_base + page[r] stride_page + in_page[r] row_stride
 *
 * page[r] = -1 reading as zero (src's row0 and rows_limit unused).  With
 * rows_smem NULL it is aj_tile_load_f32. */
void aj_tile_load_paged_f32(aj_kb *kb, const aj_tile_src *src, LLVMValueRef rows_smem,
                            LLVMValueRef stride_page, int rows, int width, int32_t smem_off,
                            int ld, LLVMValueRef tid, int threads);

/*
 * layout = paged, streamed (the GPU kernels' K/V tiles): the same rows
 * copied by cp.async, raw (the cache's dtype, f8 bytes included), to a
 * staging buffer at shared byte offset `stage` (i32, 16-byte aligned) of
 * pitch width elements; a row without a page is zero-filled and reads
 * nothing.  width * size % 16 == 0 (16-byte chunks).  The copies join
 * the thread's open cp.async group; once a wait covers it and a barrier
 * follows, aj_tile_widen_staged_f32 widens the tile as
 * aj_tile_load_paged_f32 would have stored it.
 *
 *   cache pages ──cp.async──► stage [rows][width] raw ──widen──► f32 [rows][ld]
 */
void aj_tile_issue_paged_async(aj_kb *kb, const aj_tile_src *src, LLVMValueRef rows_smem,
                               LLVMValueRef stride_page, int rows, int width, LLVMValueRef stage,
                               LLVMValueRef tid, int threads);
void aj_tile_widen_staged_f32(aj_kb *kb, aj_dtype dtype, LLVMValueRef stage, int rows,
                              int width, int32_t smem_off, int ld, LLVMValueRef tid, int threads);

/* Bytes of the row table of a paged tile of `rows` rows: i32 page[rows]
 * then i32 in_page[rows]. */
static inline int32_t aj_tile_paged_rows_bytes(int rows)
{
    return 8 * rows;
}

/*
 * layout = paged: threads tid, tid + threads, ... < rows write the row
 * table (at shared byte offset smem, i32) of keys key0 .. key0 + rows - 1
 * of sequence bidx (len keys, i32): key p is row p % page_size of the
 * page in block-table slot p / page_size -- one division per row and
 * tile, none per element.  Keys at or past len, and pages outside the
 * cache (recorded in the status word, aj_attn_paged_fault), get page -1.
 * The caller puts a barrier between this and the loads that read it.
 */
void aj_tile_paged_rows(aj_kb *kb, LLVMValueRef smem, int rows, LLVMValueRef key0,
                        LLVMValueRef len, LLVMValueRef bidx, LLVMValueRef tid, int threads);

/*
 * The same table for `count` rows stacked from slices of `per` rows each
 * (GQA-packed query heads: slice = the head, relative to the first):
 * entry r is row (row0 + r) % per of slice (row0 + r) / per, page -1 (a
 * zero row) from row count on.  aj_tile_load_paged_f32 then reads it with
 * stride_page the slices' stride.
 */
void aj_tile_stacked_rows(aj_kb *kb, LLVMValueRef smem, int rows, LLVMValueRef row0,
                          LLVMValueRef count, LLVMValueRef per, LLVMValueRef tid, int threads);

/* All `threads` threads cooperatively copy the tile to shared memory at
 * byte offset smem_off, row pitch `ld` floats.  width % 8 == 0; f8
 * elements load 8 at a time, the others 16 bytes. */
void aj_tile_load_f32(aj_kb *kb, const aj_tile_src *src, int rows, int width,
                      int32_t smem_off, int ld, LLVMValueRef tid, int threads);

/* Loads 4 consecutive floats from shared memory at float index `idx`. */
LLVMValueRef aj_smem_load4(aj_kb *kb, int32_t smem_off, LLVMValueRef idx);
/* Stores one float at float index `idx`. */
void aj_smem_store1(aj_kb *kb, int32_t smem_off, LLVMValueRef idx, LLVMValueRef v);

/* Loads 4 elements of the dtype from global memory at element offset `elem`
 * of `ptr` (aligned to 4 elements) and widens them to a <4 x float>. */
LLVMValueRef aj_global_load4(aj_kb *kb, LLVMValueRef ptr, LLVMValueRef elem,
                             aj_dtype dtype);

/* Converts 4 f32 values to the dtype and stores them to global memory at
 * element offset `elem` of `ptr` (16-byte or 8-byte aligned). */
void aj_global_store4(aj_kb *kb, LLVMValueRef ptr, LLVMValueRef elem,
                      LLVMValueRef vals[4], aj_dtype dtype);

/*
 * Tiles of 16-bit elements that feed mma.sync m16n8k16 through ldmatrix
 * (the flash templates).  An mma steps 16 elements along its reduction
 * (K) dim, so a tile whose width is a K dim (Q, K over D; dO, V over Dv)
 * is read as ceil(width / 16) steps; for a width that is an odd multiple
 * of 8 the last step reads 8 pad columns, which must hold zeros (a NaN
 * there would turn the dot product into NaN).  Rows are laid out
 *
 *   | width data columns | 0..7 zero pad columns | 8 bank pad columns |
 *   <----- aj_mma_k_width(width) ----->
 *   <----------------- aj_mma_tile_ld(width) ----------------------->
 *
 * so the pitch in 16-byte chunks is odd and the eight 16-byte rows one
 * ldmatrix reads fall in different banks.
 */
enum { AJ_MMA_K = 16 };

/* The width an mma reduction over `width` (a multiple of 8) steps through. */
static inline int aj_mma_k_width(int width)
{
    return (width + AJ_MMA_K - 1) / AJ_MMA_K * AJ_MMA_K;
}

/* Row pitch, in elements, of an mma tile of `width` columns. */
static inline int aj_mma_tile_ld(int width)
{
    return aj_mma_k_width(width) + 8;
}

/* Zeroes the pad columns [width, aj_mma_k_width(width)) of `rows`
 * consecutive rows of pitch aj_mma_tile_ld(width) from shared byte offset
 * `smem_off` (no code when width is a multiple of 16); the `threads`
 * threads of the CTA share the 16-byte stores.  cp.async copies of a tile
 * write its data columns only, so pads written once before the first
 * barrier stay zero however often the tile is refilled. */
void aj_mma_tile_zero_pad(aj_kb *kb, LLVMValueRef smem_off, int rows, int width,
                          LLVMValueRef tid, int threads);

/*
 * Tiles of 16-bit elements that feed wgmma (the flash templates'
 * warpgroup modes; templates/flash_fwd.c, "wgmma"): a tile of `rows` x
 * `width` elements is panels of aj_wgmma_panel_span(width) / 2 columns,
 * panel after panel, each `rows` rows of span bytes under the span-byte
 * swizzle (aj_kb_swizzle); the tile starts 1024-byte aligned, and at a
 * width that is an odd multiple of 8 its last 8 columns (up to
 * aj_wgmma_tile_width) must hold zeros.  Offsets are bytes (i32) from
 * the tile's start, `base`.
 */
/* ptr addrspace(3) to shared byte base + bytes (base i32): one register
 * plus a constant, which ptxas folds into the instruction, so that no
 * per-access address stays live across a loop. */
LLVMValueRef aj_smem_at(aj_kb *kb, LLVMValueRef base, int64_t bytes);
/* Element (row, col): its byte offset; a 16-byte chunk where col is a
 * multiple of 8 stays whole. */
LLVMValueRef aj_wgmma_tile_offset(aj_kb *kb, LLVMValueRef row, LLVMValueRef col, int rows,
                                  int width);
/* The matrix descriptor of the 16 columns from column `col` read K-major
 * (A[m][k] = tile(m, k), or B[k][n] = tile(n, k)): a k-step starts in its
 * panel, 32 bytes a step into the row; SBO = 8 rows. */
LLVMValueRef aj_wgmma_kmajor_desc(aj_kb *kb, LLVMValueRef base, int rows, int width, int col);
/* The same k-step's descriptor from desc0, the tile's at column 0: one
 * add (with aj_kb_opaque on desc0, a loop's steps stay in the loop). */
LLVMValueRef aj_wgmma_kmajor_step(aj_kb *kb, LLVMValueRef desc0, int rows, int width, int col);
/* The descriptor of B[k][n] = tile(k, col + n) read N-major
 * (imm-trans-b) for the k-step of rows k0 .. k0 + 15: N spans the panels
 * from the one `col` starts (LBO = a panel), SBO = 8 rows. */
LLVMValueRef aj_wgmma_nmajor_desc(aj_kb *kb, LLVMValueRef base, int rows, int width, int col,
                                  int k0);
/* The same k-step's descriptor from desc0, the one at k0 = 0 (and the
 * same col): one add of k0 rows (the panels' rows do not enter it), as
 * aj_wgmma_kmajor_step. */
LLVMValueRef aj_wgmma_nmajor_step(aj_kb *kb, LLVMValueRef desc0, int width, int k0);

/* Row kernels over [B, H, S, W] tensors (merge.c, rows.c): 128 threads in
 * row groups of G lanes, lane l taking the 4-wide column chunks 4l,
 * 4l + 4G, ... of its group's row.  G: the widest (up to 32) that splits
 * W into 4-wide chunks evenly. */
int aj_row_group_lanes(int w);
/* The op's head_dim_v, which such a kernel takes as W: a multiple of 8 up
 * to `limit`, else AJ_ERR_UNSUPPORTED ("head_dim_v = 12: <takes> multiples
 * of 8 up to 1024"). */
aj_status aj_row_width_check(aj_ctx *ctx, const aj_op *op, int limit, const char *takes);
/* Element offset of (b, h, row) in tensor t, whose strides are kernel
 * parameters (has_seq_stride 0: an LSE, its rows 1 apart). */
LLVMValueRef aj_row_offset(aj_kb *kb, aj_param_source t, LLVMValueRef b, LLVMValueRef h,
                           LLVMValueRef row, int has_seq_stride);

#endif /* AJ_TEMPLATES_TILE_IO_H */
