/*
 * cpu_attn.h -- the tiles the cpu forward and backward kernels share: f32
 * stack buffers filled from tensors (widened, optionally transposed), two
 * register-tiled matrix products, and the score of a (row, key) pair with
 * its mods and mask -- one definition each, so the backward recomputes
 * exactly the forward's probabilities.
 *
 * Register tiles, W = floats per vector (cpu_vec.h):
 *
 *   aj_cpu_gemm_nt   C[M][N] = A[M][K] Bt[K][N]: RM rows x CN*W columns
 *                    per tile; per k, CN loads of Bt, RM broadcasts of A
 *   aj_cpu_gemm_acc  C[M][:] = r[m] C[M][:] + sum_k P(m, k) B[k][:]: RM rows
 *                    x CV*VW columns per tile, P read with any two strides
 *                    (so P^T costs nothing)
 */
#ifndef AJ_TEMPLATES_CPU_ATTN_H
#define AJ_TEMPLATES_CPU_ATTN_H

#include "codegen/codegen.h"
#include "templates/attn_common.h"
#include "templates/cpu_vec.h"

#define AJ_CPU_RM 4   /* rows of a register tile */
#define AJ_CPU_CN 2   /* key vectors of a gemm_nt tile */

/*
 * The sequence a work item of batch index bidx computes.  Padded: the
 * seq_q / seq_k / mask_shift parameters and starts 0.  layout = varlen:
 * sequence bidx of the packed tensors, whose rows start at cu_seqlens[bidx]
 * (runtime/launch.c binds the tensors as padded views of batch stride 0),
 * with bottom_right's shift from sq_total / sk_total, each 0 meaning the
 * sequence's own length -- as the flash templates.
 */
typedef struct aj_cpu_seq {
    LLVMValueRef len_q, len_k;       /* i32 */
    LLVMValueRef start_q, start_k;   /* i64: first packed row, 0 when padded */
    LLVMValueRef shift;              /* i64: the mask's shift */
} aj_cpu_seq;

/* Layout and head dims of an op for the cpu kernel `who`: both layouts,
 * but no bias with varlen (no template defines a bias over packed
 * sequences: the flash ones have no bias, the efficient ones no varlen). */
aj_status aj_cpu_check_layout(aj_ctx *ctx, const aj_op *op, const char *who);
/* The tiles of the cpu kernel `who` on w-float vectors: block_m (default_bm
 * when the schedule leaves it unset) and block_n (a multiple of CN vectors,
 * default 64 or one such multiple); warps and stages, which the cpu target
 * does not have, are AJ_ERR_UNSUPPORTED. */
aj_status aj_cpu_plan_tiles(aj_ctx *ctx, const aj_op *op, const char *who, int w, int default_bm,
                            int *bm, int *bn);
/* The parameters aj_cpu_seq_of reads, for the op's layout. */
void aj_cpu_add_seq_params(aj_kb *kb, const aj_op *op);
void aj_cpu_seq_of(aj_kb *kb, const aj_op *op, LLVMValueRef bidx, aj_cpu_seq *s);
/* Element offset of row 0 of slice (bidx, h) of tensor t in the sequence:
 * the slice base plus `start` rows of stride_<t>_s. */
LLVMValueRef aj_cpu_seq_base(aj_kb *kb, const char *t, LLVMValueRef bidx, LLVMValueRef h,
                             LLVMValueRef start);

/* What a kernel's scores depend on, set up once per work item. */
typedef struct aj_cpu_attn {
    aj_kb *kb;
    const aj_op *op;
    int w;                       /* floats per vector */
    int log2e_in_q;              /* Q carries scale log2 e: scores need no multiply */
    aj_cpu_seq seq;              /* of batch index bidx */
    aj_attn_mask mask;
    LLVMValueRef qk_offset;      /* i64: q_offset - kv_offset (alibi) */
    LLVMValueRef slope;          /* f32 (alibi) */
    LLVMValueRef bias_base;      /* i64: element offset of bias slice (b, h) (bias) */
} aj_cpu_attn;

/* Sets the fields from the kernel parameters for query head h of batch
 * (varlen: sequence) bidx (bias_base and slope follow h). */
void aj_cpu_attn_init(aj_cpu_attn *a, aj_kb *kb, const aj_op *op, int log2e_in_q,
                      LLVMValueRef bidx, LLVMValueRef h);

/* <n x float> and f32 loads and stores of the stack buffers (4-byte
 * alignment: tiles start anywhere in a row) */
LLVMValueRef aj_cpu_vload(aj_kb *kb, LLVMValueRef ptr, int n);
void aj_cpu_vstore(aj_kb *kb, LLVMValueRef v, LLVMValueRef ptr);
LLVMValueRef aj_cpu_fload(aj_kb *kb, LLVMValueRef ptr);
/* &buf[index] of an f32 buffer (index i32 or i64) */
LLVMValueRef aj_cpu_buf_at(aj_kb *kb, LLVMValueRef buf, LLVMValueRef index);
/* &t[elem] of tensor parameter t of `dtype`, elem i64 */
LLVMValueRef aj_cpu_tensor_at(aj_kb *kb, const char *t, aj_dtype dtype, LLVMValueRef elem);

/* buf[r][0..width) = scale * t[base + (r0 + r) stride_s + 0..width) for
 * r < count, 0 for count <= r < rows (width a multiple of 8). */
void aj_cpu_load_rows(aj_kb *kb, LLVMValueRef buf, int width, const char *t, aj_dtype dtype,
                      LLVMValueRef base, LLVMValueRef stride_s, LLVMValueRef r0,
                      LLVMValueRef count, LLVMValueRef rows, double scale);
/* buf[c][r] = t[base + (r0 + r) stride_s + c] for r < count, 0 for
 * count <= r < n: the rows transposed, so that they run along vectors. */
void aj_cpu_load_cols(aj_kb *kb, LLVMValueRef buf, int width, int n, const char *t,
                      aj_dtype dtype, LLVMValueRef base, LLVMValueRef stride_s,
                      LLVMValueRef r0, LLVMValueRef count);

/* C[m][0..n) = sum_k A[m][k] Bt[k][0..n) for m < m_end (a multiple of RM,
 * i32); n a multiple of CN*W. */
void aj_cpu_gemm_nt(aj_kb *kb, int w, LLVMValueRef c, LLVMValueRef a, int k, LLVMValueRef bt,
                    int n, LLVMValueRef m_end);
/* C[m][0..ncols) = rscale[m] C[m][..] (C[m][..] if rscale is NULL)
 *                 + sum_{k < kn} P[m ldp_m + k ldp_k] B[k][0..ncols)
 * for m < m_end (a multiple of RM, i32). */
void aj_cpu_gemm_acc(aj_kb *kb, int ncols, LLVMValueRef c, LLVMValueRef rscale,
                     LLVMValueRef p, int ldp_m, int ldp_k, LLVMValueRef b, int kn,
                     LLVMValueRef m_end);

/* The W scores (log2 units) of row ig for keys jv (both local indices of
 * the call; jv an <W x i32>) from s = the scaled q.k: bias, softcap,
 * alibi, the factor log2 e, then -inf where the mask or Sk hides a key. */
LLVMValueRef aj_cpu_scores(aj_cpu_attn *a, LLVMValueRef s, LLVMValueRef ig, LLVMValueRef jv);

/* Query rows that may see keys [j0, j1) (local): [*i_lo, *i_hi], clamped to
 * [0, Sq - 1]; empty when *i_hi < *i_lo. */
void aj_cpu_rows_for_keys(aj_cpu_attn *a, LLVMValueRef j0, LLVMValueRef j1,
                          LLVMValueRef *i_lo, LLVMValueRef *i_hi);
/* Key blocks of bn keys [*begin, *end) that rows [i0, i1] may see. */
void aj_cpu_key_blocks(aj_cpu_attn *a, int bn, LLVMValueRef i0, LLVMValueRef i1,
                       LLVMValueRef *begin, LLVMValueRef *end);

#endif /* AJ_TEMPLATES_CPU_ATTN_H */
