/*
 * cpu_attn.h -- the tiles the cpu forward and backward kernels share: f32
 * stack buffers filled from tensors (widened, optionally transposed), two
 * register-tiled matrix products, and the score of a (row, key) pair with
 * its mods and mask -- one definition each, so the backward recomputes
 * exactly the forward's probabilities.  The mask and score_mod are the
 * op's score programs (score.h), read through nothing else.
 *
 * Register tiles, W = floats per vector (cpu_vec.h):
 *
 *   aj_cpu_gemm_nt   C[M][N] = A[M][K] Bt[K][N]: RM rows x CN*W columns
 *                    per tile; per k, CN loads of Bt, RM broadcasts of A
 *                    (RM = aj_cpu_tile_rows: 8 on AVX-512, 4 on AVX2)
 *   aj_cpu_gemm_acc  C[M][:] = r[m] C[M][:] + sum_k P(m, k) B[k][:]: RM rows
 *                    x CV*VW columns per tile, P read with any two strides
 *                    (so P^T costs nothing)
 */
#ifndef AJ_TEMPLATES_CPU_ATTN_H
#define AJ_TEMPLATES_CPU_ATTN_H

#include "codegen/amx.h"
#include "codegen/codegen.h"
#include "templates/attn_common.h"
#include "templates/cpu_vec.h"
#include "templates/score.h"

#define AJ_CPU_RM_MAX 8   /* rows of a register tile, at most */
#define AJ_CPU_CN 2       /* key vectors of a gemm_nt tile */

/* Rows of a register tile: 8 where the host has 32 vector registers
 * (AVX-512: 16 accumulators, 2 loads of B and a broadcast fit), else 4
 * (AVX2's 16).  Measured on the AVX-512 host (bench_cpu --dtypes, d 128):
 * 8 rows make the bf16 forward 1.26x and the f32 forward 1.05-1.08x
 * faster than 4.  Block sizes are multiples of it. */
static inline int aj_cpu_tile_rows(void)
{
    return aj_cpu_vector_width() >= 16 ? AJ_CPU_RM_MAX : 4;
}

/*
 * The sequence a work item of batch index bidx computes.  Padded: the
 * seq_q / seq_k parameters, starts 0, and the programs' totals
 * seq_q_total / seq_k_total (params.def).  layout = varlen:
 * sequence bidx of the packed tensors, whose rows start at cu_seqlens[bidx]
 * (runtime/launch_bind.c binds the tensors as padded views of batch stride 0),
 * with the totals from sq_total / sk_total, each 0 meaning the sequence's
 * own length -- as the flash templates.
 */
typedef struct aj_cpu_seq {
    LLVMValueRef len_q, len_k;       /* i32 */
    LLVMValueRef start_q, start_k;   /* i64: first packed row, 0 when padded */
    LLVMValueRef sq, sk;             /* i64 totals, NULL when the programs read none */
} aj_cpu_seq;

/* Layout, head dims and score programs of an op for the cpu kernel `who`:
 * both layouts, but no bias with varlen (no template defines a bias over
 * packed sequences: the flash ones have no bias, the efficient ones no
 * varlen). */
aj_status aj_cpu_check_op(aj_ctx *ctx, const aj_op *op, const char *who);
/* Whether the cpu backward of op (its programs prog) has a fused plan
 * (cpu_bwd.c): not with bias, whose dbias slices fold (b, h) pairs, nor
 * with grad side tensors, whose parts are the dq stage's row blocks. */
bool aj_cpu_bwd_fuses(const aj_op *op, const aj_score_prog *prog);
/* The tiles of the cpu kernel `who` on w-float vectors: block_m (default_bm
 * when the schedule leaves it unset) and block_n (a multiple of CN vectors,
 * default 64 or one such multiple); warps and stages, which the cpu target
 * does not have, are AJ_ERR_UNSUPPORTED. */
aj_status aj_cpu_plan_tiles(aj_ctx *ctx, const aj_op *op, const char *who, int w, int default_bm,
                            int *bm, int *bn);
/* The sequence from the parameters params.def gives the op's layout
 * (varlen kernels take their totals from sq_total / sk_total; the
 * programs' seq_q_total / seq_k_total are declared but unread there). */
void aj_cpu_seq_of(aj_kb *kb, const aj_op *op, const aj_score_prog *prog, LLVMValueRef bidx,
                   aj_cpu_seq *s);
/* Element offset of row 0 of slice (bidx, h) of tensor t in the sequence:
 * the slice base plus `start` rows of stride_<t>_s. */
LLVMValueRef aj_cpu_seq_base(aj_kb *kb, aj_param_source t, LLVMValueRef bidx, LLVMValueRef h,
                             LLVMValueRef start);

/* What a kernel's scores depend on, set up once per work item. */
typedef struct aj_cpu_attn {
    aj_kb *kb;
    const aj_op *op;
    const aj_score_prog *prog;   /* the op's mask and score_mod */
    int w;                       /* floats per vector */
    int log2e_in_q;              /* Q carries scale log2 e: scores need no multiply */
    aj_cpu_seq seq;              /* of batch index bidx */
    aj_score sc;                 /* the programs at (bidx, h), W lanes */
    LLVMValueRef bias_base;      /* i64: element offset of bias slice (b, h) (bias) */
    /* i1 variable (ops with a mask): the tile aj_cpu_skip_begin opened is
     * full, so aj_cpu_scores tests no element against the mask */
    LLVMValueRef tile_full;
} aj_cpu_attn;

/* Whether Q can carry scale log2 e for `prog`: no score_mod and no bias
 * (the program's leaf) need the score in natural units. */
static inline int aj_cpu_log2e_in_q(const aj_score_prog *prog)
{
    return !aj_score_has_mod(prog);
}

/* Sets the fields from the kernel parameters for query head h of batch
 * (varlen: sequence) bidx; positions are q_offset + i and kv_offset + j
 * of the sequence (paged: len_k - len_q + i and j). */
void aj_cpu_attn_init(aj_cpu_attn *a, aj_kb *kb, const aj_op *op, const aj_score_prog *prog,
                      int log2e_in_q, LLVMValueRef bidx, LLVMValueRef h);

/* <n x float> and f32 loads and stores of the stack buffers (4-byte
 * alignment: tiles start anywhere in a row) */
LLVMValueRef aj_cpu_vload(aj_kb *kb, LLVMValueRef ptr, int n);
void aj_cpu_vstore(aj_kb *kb, LLVMValueRef v, LLVMValueRef ptr);
LLVMValueRef aj_cpu_fload(aj_kb *kb, LLVMValueRef ptr);
/* &buf[index] of an f32 buffer (index i32 or i64) */
LLVMValueRef aj_cpu_buf_at(aj_kb *kb, LLVMValueRef buf, LLVMValueRef index);
/* &t[elem] of tensor parameter t of `dtype`, elem i64 */
LLVMValueRef aj_cpu_tensor_at(aj_kb *kb, aj_param_source t, aj_dtype dtype, LLVMValueRef elem);

/* ptr[0..n) = 0 (n a multiple of 8), in a loop */
void aj_cpu_zero(aj_kb *kb, LLVMValueRef ptr, int n);
/*
 * Operands in bf16 pairs (the `pairs` argument below; where the host has
 * AVX512-BF16): a buffer of 32-bit words, each two bf16 of neighbouring
 * elements along the product's sum (the lower index in the low half), so
 * that one vdpbf16ps multiplies two pairs per f32 lane:
 *
 *   Q  [bm][D/2]   row i: (q[i][0], q[i][1]) (q[i][2], q[i][3]) ...  = the
 *                  row's own bytes
 *   Kt [D/2][bn]   word (d, j): (k[j][2d], k[j][2d+1]): the rows' words
 *                  transposed (aj_cpu_load_cols with pairs)
 *   P  [bm][bn/2]  row i: (p[i][0], p[i][1]) ...: P rounded to bf16
 *   V  [bn/2][Dv]  word (j, c): (v[2j][c], v[2j+1][c]): two rows zipped
 *                  (aj_cpu_load_row_pairs)
 */

/*
 * Where row p (i32, a position in the sequence) of a tensor's slice is:
 * padded, base + p stride_s; paged (pages set), row p % page_size of page
 * pages[p / page_size] (the sequence's block-table row, i32):
 *
 *   base + pages[p / page_size] stride_page + (p % page_size) stride_s
 *
 * with base the kv head's offset (layout = paged, docs/ir.md).  With
 * per_head set (the query heads of a KV head packed into one row block),
 * row p is row p % per_head of head p / per_head, heads stride_h apart.
 */
typedef struct aj_cpu_rows {
    LLVMValueRef base, stride_s;    /* i64 */
    LLVMValueRef pages;             /* paged: pointer to i32; NULL: padded */
    LLVMValueRef page_size;         /* i32 (paged) */
    LLVMValueRef stride_page;       /* i64 (paged) */
    LLVMValueRef per_head;          /* i32 rows per head, NULL: one head */
    LLVMValueRef stride_h;          /* i64 (per_head) */
} aj_cpu_rows;

/* The element offset of row p (i32) of src. */
LLVMValueRef aj_cpu_row_at(aj_kb *kb, const aj_cpu_rows *src, LLVMValueRef p);

/* A hint that rows r0 .. r0 + count of src (count <= 0: none) are read
 * soon: a prefetch of each 64-byte line of their first `width` elements
 * of t.  Paged rows are 2 KB or more apart and their pages scattered, so
 * the host's stream prefetchers do not see them coming; a key block is
 * fetched while the one before it is computed. */
void aj_cpu_prefetch_rows(aj_kb *kb, aj_param_source t, aj_dtype dtype, const aj_cpu_rows *src,
                          LLVMValueRef r0, LLVMValueRef count, int width);
/* buf[r][0..width) = scale * t[row (r0 + r) of src + 0..width) for
 * r < count, 0 for count <= r < rows (width a multiple of 8); with pairs
 * (bf16 t, scale 1) the row's words: width = columns / 2. */
void aj_cpu_load_rows(aj_kb *kb, LLVMValueRef buf, int width, aj_param_source t, aj_dtype dtype,
                      const aj_cpu_rows *src, LLVMValueRef r0, LLVMValueRef count,
                      LLVMValueRef rows, double scale, int pairs);
/* buf[c][r] = t[row (r0 + r) of src + c] for r < count, 0 for count <= r
 * < n (count >= 1): the rows transposed, so that they run along vectors;
 * with pairs (bf16 t) c counts words, width = columns / 2. */
void aj_cpu_load_cols(aj_kb *kb, LLVMValueRef buf, int width, int n, aj_param_source t,
                      aj_dtype dtype, const aj_cpu_rows *src, LLVMValueRef r0,
                      LLVMValueRef count, int pairs);
/* buf[r / 2][c] = the bf16 pair (t[r0 + r][c], t[r0 + r + 1][c]) for even
 * r < n, c < width (a multiple of 8); rows count <= r are 0 (count >= 1). */
void aj_cpu_load_row_pairs(aj_kb *kb, LLVMValueRef buf, int width, int n, aj_param_source t,
                           const aj_cpu_rows *src, LLVMValueRef r0, LLVMValueRef count);

/* C[m][0..n) = sum_k A[m][k] Bt[k][0..n) for m < m_end (a multiple of RM,
 * i32); n a multiple of CN*W.  With pairs, A and Bt are words and k counts
 * them (vdpbf16ps in place of the FMAs). */
void aj_cpu_gemm_nt(aj_kb *kb, int w, LLVMValueRef c, LLVMValueRef a, int k, LLVMValueRef bt,
                    int n, LLVMValueRef m_end, int pairs);
/* C[m][0..ncols) = rscale[m] C[m][..] (C[m][..] if rscale is NULL)
 *                 + sum_{k < kn} P[m ldp_m + k ldp_k] B[k][0..ncols)
 * for m < m_end (a multiple of RM, i32).  With pairs, P and B are words
 * (P [m][kn/2], ldp_* in words; B [kn/2][ncols]). */
void aj_cpu_gemm_acc(aj_kb *kb, int ncols, LLVMValueRef c, LLVMValueRef rscale,
                     LLVMValueRef p, int ldp_m, int ldp_k, LLVMValueRef b, int kn,
                     LLVMValueRef m_end, int pairs);

/*
 * Tile products (AMX, codegen/amx.h; docs/cpu.md "AMX tiles") of pairs
 * operands (bf16 or f16, t->dtype), where the plan chose them:
 *
 *   C[m][0..n) (+)= sum_{k < kn} A[m][k] B[k][0..n)   for m < m_end
 *
 * A in 16-bit rows of lda elements (Q, P), B in pairs [kn/2][n] (Kt, V:
 * the VNNI layout tdpbf16ps reads), C f32 rows of n; m_end (i32) a
 * multiple of AJ_CPU_AMX_ROWS, n and kn multiples of 32.  Per step, four
 * f32 tiles hold 32 rows x 32 columns of C (tiles 0..3), two A tiles the
 * rows' next 32 k (4, 5), two B tiles the columns' (6, 7); accumulate
 * loads C first, else it starts at zero.  The tiles must be configured
 * (aj_amx_config) around it.
 */
#define AJ_CPU_AMX_ROWS 32
/* The tiles an AMX kernel takes where the schedule leaves them unset.
 * Larger than the vector kernels' (128 x 64 forward, 64 x 64 backward):
 * each key block pays fixed costs (Kt and V repacked into pairs, O loaded
 * into and stored from tiles, rescaled) that the tile products, several
 * times faster than vector FMAs, no longer hide.  Measured on a
 * Sapphire-Rapids-class Xeon (amx-tile, amx-bf16; bench/README.md "The
 * AMX host"), bf16 d 128, S 2048, against the vector kernels' tiles: forward
 * 256 x 256 1.59x (1.49x causal), backward 128 x 128 1.33x (1.23x). */
#define AJ_CPU_AMX_FWD_BM 256
#define AJ_CPU_AMX_FWD_BN 256
#define AJ_CPU_AMX_BWD_BM 128
#define AJ_CPU_AMX_BWD_BN 128
/* How a kernel's products run.  Where its shapes fit AMX's tiles
 * (`amx_fits`), *amx is the host's mode for dtype (off but for bf16 and
 * f16; native or the stand-in), and with AMX on, *bm, *bn become
 * default_bm, default_bn where the op's schedule leaves them unset (its
 * own sizes win).  True when the products go in pairs: shapes that take
 * them (`pairs`), and AMX or bf16 by vdpbf16ps (aj_cpu_bf16_pairs). */
bool aj_cpu_products(const aj_op *op, aj_dtype dtype, bool pairs, bool amx_fits,
                     int default_bm, int default_bn, aj_amx_mode *amx, int *bm, int *bn);
void aj_cpu_amx_gemm(aj_amx *t, LLVMValueRef c, LLVMValueRef a, int lda, LLVMValueRef b, int n,
                     int kn, LLVMValueRef m_end, int accumulate);
/* C[m][0..ncols) *= rscale[m] for m < m_end (ncols a multiple of 8) */
void aj_cpu_scale_rows(aj_kb *kb, LLVMValueRef c, int ncols, LLVMValueRef rscale,
                       LLVMValueRef m_end);

/* dst (`dtype`: bf16 or f16, rows of `rows` elements) [c][r] = src (f32
 * [rows][cols]) [r][c] rounded to nearest even, by 8 x 8 transposes (rows
 * and cols multiples of 8): the A operand of a tile product over r (P^T,
 * dS^T) */
void aj_cpu_transpose_half(aj_kb *kb, LLVMValueRef dst, LLVMValueRef src, int rows, int cols,
                           aj_dtype dtype);
/* dst (`dtype`: bf16 or f16) [i] = src (f32) [i] rounded to nearest even,
 * i < n (a multiple of 16) */
void aj_cpu_round_half(aj_kb *kb, LLVMValueRef dst, LLVMValueRef src, int n, aj_dtype dtype);

/* The W scores (log2 units) of row ig for keys jv (both local indices of
 * the call; jv an <W x i32>) from s = the scaled q.k: bias, the
 * score_mod, the factor log2 e, then -inf where the mask or Sk hides a
 * key.  With dmod (the backward), *dmod = d score_mod / d score per key,
 * 0 where hidden (so that dS = 0 there whatever the derivative is), or
 * NULL when the op has no score_mod (the derivative is 1). */
/* bias[b, h, i, j] over the lanes' keys jv of row ig (f32 lanes): rows past
 * Sq and keys past Sk read the last row / key, in bounds (bias = add). */
LLVMValueRef aj_cpu_bias(aj_cpu_attn *a, LLVMValueRef ig, LLVMValueRef jv);
LLVMValueRef aj_cpu_scores(aj_cpu_attn *a, LLVMValueRef s, LLVMValueRef ig, LLVMValueRef jv,
                           LLVMValueRef *dmod);

/* Blocks of `size` [*begin, *end) holding indices [lo, hi] (i32); empty
 * when hi < lo. */
void aj_cpu_blocks(aj_kb *kb, int size, LLVMValueRef lo, LLVMValueRef hi, LLVMValueRef *begin,
                   LLVMValueRef *end);
/* Key blocks of bn keys [*begin, *end) that the band shows rows [i0, i1]. */
void aj_cpu_key_blocks(aj_cpu_attn *a, int bn, LLVMValueRef i0, LLVMValueRef i1,
                       LLVMValueRef *begin, LLVMValueRef *end);
/* Row blocks of bm rows [*begin, *end) that the band shows keys [j0, j1]. */
void aj_cpu_row_blocks(aj_cpu_attn *a, int bm, LLVMValueRef j0, LLVMValueRef j1,
                       LLVMValueRef *begin, LLVMValueRef *end);

/* Tiles inside the band ranges may still hold no visible key where the
 * mask has more than its band (a document mask, a chunked one):
 * aj_cpu_skip_begin opens a block that runs only when the tile's class
 * `cls` (aj_score_walk_tile's; NULL and no block for an op without a
 * mask) is not skip (a band-only mask has none: no block), and records
 * whether the tile is full (aj_cpu_scores then tests no element against
 * the mask); aj_cpu_skip_end closes it. */
void aj_cpu_skip_begin(aj_cpu_attn *a, LLVMValueRef cls);
void aj_cpu_skip_end(aj_cpu_attn *a);

/* The weights that merge two partial rows whose LSEs, in log2 units, are
 * l1 and l2 (f32; docs/design.md "Merge of two partials"): *w1 and *w2,
 * the merged log2 LSE *l, and *none (i1) where both are -inf -- the
 * caller's LSE is then -inf, and a side of weight 0 adds nothing. */
void aj_cpu_merge_weights(aj_kb *kb, LLVMValueRef l1, LLVMValueRef l2, LLVMValueRef *w1,
                          LLVMValueRef *w2, LLVMValueRef *l, LLVMValueRef *none);

#endif /* AJ_TEMPLATES_CPU_ATTN_H */
