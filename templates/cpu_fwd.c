/*
 * cpu_fwd.c -- the forward kernel of the cpu target (both variants).
 *
 * One call computes one work item: block_m query rows of one (batch,
 * head), the x, y, z of a GPU launch's CTA.  The runtime runs the items of
 * the grid on its thread pool (runtime/cpu).
 *
 *   grid = (ceil(Sq / block_m), Hq, B)     one host thread per item
 *
 * Per item, on the stack (f32, 64-byte aligned):
 *
 *   Q  [bm][D]    the rows, widened and pre-scaled once
 *   Kt [D][bn]    the key block transposed: keys run along the vector lanes
 *   V  [bn][Dv]   the value block, widened
 *   S  [bm][bn]   scores, then probabilities in place
 *   O  [bm][Dv]   the output accumulator; m, l, alpha [bm] the row statistics
 *
 * For each key block the band of the mask can see, but skip tiles (score.h:
 * the class of the item's rows x the block), with W = the host's floats
 * per register:
 *
 *   S = Q Kt     register tiles of RM rows x CN*W keys: per d, CN vector
 *                loads of Kt, RM broadcasts of Q, RM*CN FMAs
 *
 *                 Kt[d][j0 .. j0+CN*W)  ──────►
 *          Q[i0][d]   │ acc[0][0] .. acc[0][CN-1]
 *          ...        │ ...
 *          Q[i0+RM-1] │ acc[RM-1][..]
 *
 *   softmax      per row, W keys at a time: score_mod, mask, running max
 *                (log2 units), P = 2^(s - m) by a polynomial, row sum
 *   O += P V     register tiles of RM rows x CV*VW output columns; the
 *                tile is rescaled by alpha = 2^(m_old - m_new) on load
 *
 * then O / l and LSE = (m + log2 l) ln 2 (merged into o_acc and lse with
 * accumulate), as the GPU templates do; rows that see no key get O = 0 and
 * LSE = -inf.
 *
 * Options: bias (a broadcastable [B, Hq, Sq, Sk] added to the scaled score
 * before the score_mod), any mask and score_mod (built-in or expression:
 * the op's score programs), dropout (Philox keep mask of
 * attn_common, after the statistics), accumulate, layout = varlen (the
 * item's sequence from cu_seqlens, aj_cpu_seq_of; grid over max_seqlen_q
 * and the sequences).  Launch contract as the GPU templates: Sq, Sk <
 * 2^30, any i64 offsets.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/cpu_attn.h"
#include "templates/skeleton.h"
#include "templates/template.h"

#define CN AJ_CPU_CN
#define MAX_BLOCK 256

typedef struct cfwd_plan {
    aj_dtype dtype;
    aj_dtype q_dtype;     /* of Q: dtype, or f8 (FP8 inputs) */
    aj_dtype kv_dtype;    /* of K and V: dtype, or a paged cache's, or f8 */
    int d, dv;
    int w;            /* floats per vector register */
    int vw;           /* output-column vector width */
    int bm, bn;
    int pairs;        /* 16-bit products of pairs: Q, Kt, P, V in pairs (cpu_attn.h) */
    aj_amx_mode amx;  /* pairs: the products on AMX tiles (native or stand-in), else off:
                       * vdpbf16ps (bf16 only) */
} cfwd_plan;

static aj_status plan_kernel(aj_ctx *ctx, const aj_op *op, cfwd_plan *p)
{
    memset(p, 0, sizeof *p);
    p->dtype = op->dtype;
    p->q_dtype = aj_op_q_dtype(op);
    p->kv_dtype = aj_op_kv_dtype(op);
    p->d = op->head_dim;
    p->dv = aj_op_dv(op);
    p->w = aj_cpu_vector_width();
    /* head dims are multiples of 8: 8-wide output vectors always divide */
    p->vw = p->dv % p->w == 0 ? p->w : 8;
    aj_status st = aj_cpu_plan_tiles(ctx, op, "cpu forward", p->w, 128, &p->bm, &p->bn);
    /* pairs of 16-bit elements: the transposes of K move 8 words (16
     * elements) at a time; tile products (bf16 on amx-bf16, f16 on
     * amx-fp16) take 32 rows, 32 k and 32 columns a step (cpu_attn.h);
     * without them, bf16 pairs by vdpbf16ps */
    int half = (p->dtype == AJ_DTYPE_BF16 || p->dtype == AJ_DTYPE_F16) &&
               p->q_dtype == p->dtype && p->kv_dtype == p->dtype && p->w == 16 &&
               p->d % 16 == 0;
    bool amx_fits = half && p->d % 32 == 0 && p->dv % 32 == 0 && p->bm % AJ_CPU_AMX_ROWS == 0;
    p->pairs = aj_cpu_products(op, p->dtype, half, amx_fits, AJ_CPU_AMX_FWD_BM, AJ_CPU_AMX_FWD_BN,
                               &p->amx, &p->bm, &p->bn);
    return st;
}

static aj_status cfwd_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    aj_status st = aj_cpu_check_op(ctx, op, "cpu forward");
    cfwd_plan plan;
    return st != AJ_OK ? st : plan_kernel(ctx, op, &plan);
}

/* ---------------------------------------------------------------- build */

typedef struct cfwd {
    AJ_KCTX;                        /* skeleton.h (the scores and lengths are at's) */
    cfwd_plan p;
    aj_cpu_attn at;                 /* scores: score_mod, mask */
    LLVMValueRef m0, rows, rows_pad;  /* i32: first row, rows of the item, rounded to RM */
    LLVMValueRef q, kt, v, s, o;    /* the stack buffers */
    LLVMValueRef pw;                /* pairs: P in bf16 pairs */
    double q_scale;                 /* pairs: the scale S takes (Q stays bf16) */
    LLVMValueRef k_scale, v_scale;  /* f32 factors of S and O (f8 inputs' descales,
                                     * aj_attn_descales), else NULL */
    /* packed heads (paged GQA): rows per head (i32), else NULL; the row
     * block's query rows for the band and tile classes are then all of
     * [0, per_head) */
    LLVMValueRef per_head;
    aj_param_source k_tensor, v_tensor;   /* the K and V tensors: k, v or the caches */
    LLVMValueRef m, l, alpha;
    LLVMValueRef rescale;           /* AMX: i1 var, some row's alpha of the block is not 1 */
    aj_amx amx;                     /* p.amx: the tile operations */
} cfwd;

/* Where a row block's results go: O rows of `o` (dtype, row stride
 * o_stride from o_base) and LSE at lse_base + row of `lse`; accumulate
 * merges them into the prior there. */
typedef struct cfwd_out {
    aj_param_source o, lse;         /* the tensors */
    aj_dtype dtype;
    int accumulate;
    LLVMValueRef o_base, o_stride, lse_base;   /* i64 */
    LLVMValueRef o_head, lse_head;  /* packed heads: i64 strides of a head */
} cfwd_out;

static LLVMValueRef buf_at(cfwd *c, LLVMValueRef buf, LLVMValueRef index)
{
    return aj_cpu_buf_at(c->kb, buf, index);
}

static LLVMValueRef tensor_at(cfwd *c, aj_param_source t, aj_dtype dtype, LLVMValueRef elem)
{
    return aj_cpu_tensor_at(c->kb, t, dtype, elem);
}

static LLVMValueRef vload(cfwd *c, LLVMValueRef ptr, int n)
{
    return aj_cpu_vload(c->kb, ptr, n);
}

static void vstore(cfwd *c, LLVMValueRef v, LLVMValueRef ptr)
{
    aj_cpu_vstore(c->kb, v, ptr);
}

static LLVMValueRef fload(cfwd *c, LLVMValueRef ptr)
{
    return aj_cpu_fload(c->kb, ptr);
}

/* The output tensor: o, or the f32 o_acc of accumulate kernels. */
static aj_param_source out_tensor(const aj_op *op)
{
    return op->accumulate ? AJ_PSRC_o_acc : AJ_PSRC_o;
}

/* The online softmax of each row over this key block: S becomes P,
 * m and l move on, alpha[i] = 2^(m_old - m_new) rescales O. */
static void emit_softmax(cfwd *c, LLVMValueRef n0)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cfwd_plan *p = &c->p;
    int w = p->w, nv = p->bn / w;
    LLVMTypeRef vt = aj_cv_type(kb, w);
    LLVMValueRef ninf = aj_cv_splat(kb, aj_kb_f32(kb, -INFINITY), w);
    if (c->rescale)
        aj_kb_set(kb, c->rescale, LLVMConstInt(kb->t_i1, 0, 0));
    LLVMValueRef i = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), c->rows_pad, aj_kb_i32(kb, 1), "pi");
    LLVMValueRef ig = aj_kb_add(kb, c->m0, i); /* the row's local index in the call */
    if (c->per_head)
        ig = LLVMBuildURem(b, ig, c->per_head, "");   /* its query row */
    LLVMValueRef srow = aj_kb_mul(kb, i, aj_kb_i32(kb, p->bn));
    LLVMValueRef s[MAX_BLOCK / 4];
    LLVMValueRef mx = ninf;
    for (int n = 0; n < nv; n++) {
        LLVMValueRef jv = LLVMBuildAdd(
            b, aj_cv_splat(kb, aj_kb_add(kb, n0, aj_kb_i32(kb, n * w)), w), aj_cv_iota(kb, w), "");
        LLVMValueRef qk = vload(c, buf_at(c, c->s, aj_kb_add(kb, srow, aj_kb_i32(kb, n * w))), w);
        if (p->pairs)
            qk = LLVMBuildFMul(b, qk, aj_cv_splat(kb, aj_kb_f32(kb, c->q_scale), w), "");
        if (c->k_scale)
            qk = LLVMBuildFMul(b, qk, aj_cv_splat(kb, c->k_scale, w), "");
        s[n] = aj_cpu_scores(&c->at, qk, ig, jv, NULL);
        mx = aj_cv_max_nn(kb, s[n], mx);   /* mx starts at -inf: never NaN */
    }
    LLVMValueRef m_old = fload(c, buf_at(c, c->m, i));
    LLVMValueRef m_new = aj_cv_max(kb, m_old, aj_cv_hmax(kb, mx, w));
    /* a row that has seen no key yet subtracts 0, not -inf */
    LLVMValueRef none = LLVMBuildFCmp(b, LLVMRealOEQ, m_new, aj_kb_f32(kb, -INFINITY), "");
    LLVMValueRef m_use = LLVMBuildSelect(b, none, aj_kb_f32(kb, 0), m_new, "");
    LLVMValueRef mv = aj_cv_splat(kb, m_use, w);
    LLVMValueRef sum = LLVMConstNull(vt);
    /* pairs without dropout: P goes straight to bf16 (emit_round_p's work) */
    int round_here = p->pairs && c->op->dropout == 0;
    for (int n = 0; n < nv; n++) {
        LLVMValueRef pv = aj_cv_exp2_softmax(kb, LLVMBuildFSub(b, s[n], mv, ""), w);
        LLVMValueRef at = aj_kb_add(kb, srow, aj_kb_i32(kb, n * w));
        if (round_here)
            aj_cv_store_operand(kb, pv, aj_cv_at(kb, kb->t_i16, c->pw, at), p->dtype, w);
        else
            vstore(c, pv, buf_at(c, c->s, at));
        sum = LLVMBuildFAdd(b, sum, pv, "");
    }
    LLVMValueRef alpha = LLVMBuildExtractElement(
        b, aj_cv_exp2(kb, aj_cv_splat(kb, LLVMBuildFSub(b, m_old, m_use, ""), w), w),
        aj_kb_i32(kb, 0), "alpha");
    LLVMValueRef l = fload(c, buf_at(c, c->l, i));
    LLVMBuildStore(b, aj_cv_fma(kb, l, alpha, aj_cv_hsum(kb, sum, w)), buf_at(c, c->l, i));
    LLVMBuildStore(b, m_new, buf_at(c, c->m, i));
    LLVMBuildStore(b, alpha, buf_at(c, c->alpha, i));
    if (c->rescale)
        aj_kb_set(kb, c->rescale, LLVMBuildOr(b, aj_kb_get(kb, c->rescale),
                                              LLVMBuildFCmp(b, LLVMRealUNE, alpha,
                                                            aj_kb_f32(kb, 1.0), ""), ""));
    aj_kb_for_end(kb);
}

/* P *= keep / (1 - p) for the rows and keys of the block in range. */
static void emit_dropout(cfwd *c, LLVMValueRef n0, LLVMValueRef kcount)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    double p = c->op->dropout;
    LLVMValueRef i = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), c->rows, aj_kb_i32(kb, 1), "di");
    LLVMValueRef j = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), kcount, aj_kb_i32(kb, 1), "dj");
    LLVMValueRef keep =
        aj_attn_dropout_keep(kb, &c->drop, p, aj_kb_add(kb, c->m0, i), aj_kb_add(kb, n0, j));
    LLVMValueRef at = buf_at(c, c->s, aj_kb_add(kb, aj_kb_mul(kb, i, aj_kb_i32(kb, c->p.bn)), j));
    LLVMBuildStore(b, aj_score_dropped(kb, p, keep, fload(c, at)), at);
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

/* pairs: P rounded to bf16 (nearest even), the first operand of P V, after
 * dropout (without dropout, emit_softmax rounds it as it makes it) */
static void emit_round_p(cfwd *c)
{
    aj_kb *kb = c->kb;
    int w = c->p.w, bn = c->p.bn;
    LLVMValueRef i = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), c->rows_pad, aj_kb_i32(kb, 1), "ri");
    for (int n = 0; n < bn; n += w) {
        LLVMValueRef at = aj_kb_add(kb, aj_kb_mul(kb, i, aj_kb_i32(kb, bn)), aj_kb_i32(kb, n));
        aj_cv_store_operand(kb, vload(c, buf_at(c, c->s, at), w),
                            aj_cv_at(kb, kb->t_i16, c->pw, at), c->p.dtype, w);
    }
    aj_kb_for_end(kb);
}

/* log2 / exp2 of one f32, through LLVM's intrinsics (libm on the host) */
static LLVMValueRef scalar_math(cfwd *c, const char *name, LLVMValueRef x)
{
    return aj_kb_call_overloaded(c->kb, name, &x, 1);
}

/*
 * accumulate: the weights that merge this call's row (L_new, log2 units)
 * into the prior LSE read from lse (docs/design.md "Merge of two partials"):
 * L = log2(2^L_p + 2^L_new), w_p = 2^(L_p - L), w_new = 2^(L_new - L);
 * both -inf gives weights 0 and LSE -inf.
 */
static void emit_merge_weights(cfwd *c, LLVMValueRef lse_prior, LLVMValueRef l2_new,
                               LLVMValueRef *w_prior, LLVMValueRef *w_new, LLVMValueRef *lse_out)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    LLVMValueRef l2_prior = LLVMBuildFMul(b, lse_prior, aj_kb_f32(kb, AJ_LOG2E), "");
    LLVMValueRef l2, none;
    aj_cpu_merge_weights(kb, l2_prior, l2_new, w_prior, w_new, &l2, &none);
    *lse_out = LLVMBuildSelect(b, none, aj_kb_f32(kb, -INFINITY),
                               LLVMBuildFMul(b, l2, aj_kb_f32(kb, AJ_LN2), ""), "");
}

/* O / l (times v_scale) and LSE of each row in range, to `to`, merged
 * into the prior with accumulate. */
static void emit_epilogue(cfwd *c, const cfwd_out *to)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cfwd_plan *p = &c->p;
    int accumulate = to->accumulate;
    aj_param_source out = to->o;
    aj_dtype out_dtype = to->dtype;
    int vw = p->vw;
    LLVMValueRef i = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), c->rows, aj_kb_i32(kb, 1), "ei");
    LLVMValueRef ig = aj_kb_sext64(kb, aj_kb_add(kb, c->m0, i));
    LLVMValueRef orow = aj_kb_add(kb, to->o_base, aj_kb_mul(kb, ig, to->o_stride)), lse_at = ig;
    if (c->per_head) {   /* row ig is query row qi of the block's head-th head */
        LLVMValueRef per = aj_kb_sext64(kb, c->per_head);
        LLVMValueRef head = LLVMBuildUDiv(b, ig, per, ""), qi = LLVMBuildURem(b, ig, per, "");
        orow = aj_kb_add(kb, aj_kb_add(kb, to->o_base, aj_kb_mul(kb, head, to->o_head)),
                         aj_kb_mul(kb, qi, to->o_stride));
        lse_at = aj_kb_add(kb, aj_kb_mul(kb, head, to->lse_head), qi);
    }
    LLVMValueRef lsum = fload(c, buf_at(c, c->l, i));
    /* lsum is 0 only for a row that saw no key; NaN counts as seen */
    LLVMValueRef seen = LLVMBuildFCmp(b, LLVMRealUNE, lsum, aj_kb_f32(kb, 0), "");
    LLVMValueRef inv = LLVMBuildSelect(b, seen, LLVMBuildFDiv(b, aj_kb_f32(kb, 1), lsum, ""),
                                       aj_kb_f32(kb, 0), "");
    if (c->v_scale)
        inv = LLVMBuildFMul(b, inv, c->v_scale, "");
    LLVMValueRef l2 = LLVMBuildFAdd(b, fload(c, buf_at(c, c->m, i)),
                                    scalar_math(c, "llvm.log2", lsum), "");
    l2 = LLVMBuildSelect(b, seen, l2, aj_kb_f32(kb, -INFINITY), "");
    LLVMValueRef lse = LLVMBuildFMul(b, l2, aj_kb_f32(kb, AJ_LN2), "");
    LLVMValueRef lse_ptr =
        aj_cv_at(kb, kb->t_f32, aj_param_data(kb, to->lse), aj_kb_add(kb, to->lse_base, lse_at));

    LLVMValueRef w_prior = NULL, scale_new = inv;
    if (aj_score_has_sinks(c->prog) && out != AJ_PSRC_workspace) {
        LLVMValueRef h = c->at.sc.h;
        if (c->per_head)   /* the row's head in the packed group */
            h = aj_kb_add(kb, h, LLVMBuildUDiv(b, ig, aj_kb_sext64(kb, c->per_head), ""));
        aj_score_fold_sink(kb, c->prog, h, accumulate ? aj_param(kb, AJ_PID(kv_offset)) : NULL,
                           &l2, &scale_new, &lse);
    }
    if (accumulate) {
        LLVMValueRef w_new;
        emit_merge_weights(c, fload(c, lse_ptr), l2, &w_prior, &w_new, &lse);
        scale_new = LLVMBuildFMul(b, w_new, scale_new, "");
    }
    LLVMValueRef sv = aj_cv_splat(kb, scale_new, vw);
    LLVMValueRef d =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, p->dv), aj_kb_i32(kb, vw), "ed");
    LLVMValueRef val = LLVMBuildFMul(
        b, vload(c, buf_at(c, c->o, aj_kb_add(kb, aj_kb_mul(kb, i, aj_kb_i32(kb, p->dv)), d)), vw),
        sv, "");
    LLVMValueRef at = tensor_at(c, out, out_dtype, aj_kb_add(kb, orow, aj_kb_sext64(kb, d)));
    if (accumulate) {
        /* a prior of weight 0 adds nothing, whatever its O holds */
        LLVMValueRef prior = LLVMBuildFMul(b, aj_cv_load(kb, at, AJ_DTYPE_F32, vw),
                                           aj_cv_splat(kb, w_prior, vw), "");
        LLVMValueRef zero_w = LLVMBuildFCmp(b, LLVMRealOEQ, w_prior, aj_kb_f32(kb, 0), "");
        prior = LLVMBuildSelect(b, zero_w, LLVMConstNull(aj_cv_type(kb, vw)), prior, "");
        val = LLVMBuildFAdd(b, val, prior, "");
    }
    aj_cv_store(kb, val, at, out_dtype, vw);
    aj_kb_for_end(kb);
    LLVMBuildStore(b, lse, lse_ptr);
    aj_kb_for_end(kb);
}

/* Statistics and accumulator of every row start empty. */
static void emit_init_rows(cfwd *c)
{
    aj_kb *kb = c->kb;
    const cfwd_plan *p = &c->p;
    LLVMValueRef i =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, p->bm), aj_kb_i32(kb, 1), "zi");
    LLVMBuildStore(c->b, aj_kb_f32(kb, -INFINITY), buf_at(c, c->m, i));
    LLVMBuildStore(c->b, aj_kb_f32(kb, 0), buf_at(c, c->l, i));
    LLVMBuildStore(c->b, aj_kb_f32(kb, 0), buf_at(c, c->alpha, i));
    aj_kb_for_end(kb);
    aj_cpu_zero(kb, c->o, p->bm * p->dv);
}

/* The K and V rows of one query head's block, and where its results go. */
typedef struct cfwd_block {
    aj_cpu_rows q, k, v;            /* q's rows; the keys' and values' */
    LLVMValueRef k_first, k_end;    /* i32: key blocks of bn it may visit, [first, end) */
    cfwd_out out;
} cfwd_block;

/* Rows m0 .. m0 + rows of the item (c->m0, c->rows set): Q loaded and
 * scaled, then each key block of [k_first, k_end) the band of the rows can
 * see, but skip tiles (score.h), then the epilogue. */
static void emit_row_block(cfwd *c, const cfwd_block *blk, int log2e_in_q)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cfwd_plan *p = &c->p;
    const aj_cpu_seq *seq = &c->at.seq;
    int per_slot = p->pairs ? 2 : 1;
    const int rm = p->amx ? AJ_CPU_AMX_ROWS : aj_cpu_tile_rows();
    c->rows_pad = LLVMBuildAnd(b, aj_kb_add(kb, c->rows, aj_kb_i32(kb, rm - 1)), aj_kb_i32(kb, -rm),
                               "rows_pad");
    emit_init_rows(c);
    double q_scale = aj_op_scale(c->op) * (log2e_in_q ? AJ_LOG2E : 1.0);
    /* pairs: Q stays bf16 and the scores take the scale */
    c->q_scale = q_scale;
    aj_cpu_load_rows(kb, c->q, p->d / per_slot, AJ_PSRC_q, p->q_dtype, &blk->q, c->m0, c->rows,
                     c->rows_pad, p->pairs ? 1.0 : q_scale, p->pairs);
    /* the query rows the block holds: m0 .., or every row of a packed head */
    LLVMValueRef pos0 = c->per_head ? aj_kb_i32(kb, 0) : c->m0;
    LLVMValueRef pos_rows = c->per_head ? c->per_head : c->rows;
    LLVMValueRef n_begin, n_end;
    aj_cpu_key_blocks(&c->at, p->bn, pos0,
                      aj_kb_add(kb, pos0, LLVMBuildSub(b, pos_rows, aj_kb_i32(kb, 1), "")),
                      &n_begin, &n_end);
    n_begin = aj_kb_smax(kb, n_begin, blk->k_first);
    n_end = aj_kb_smin(kb, n_end, blk->k_end);
    /* the key blocks of the range, or the block mask's list of the row
     * block (score.h) */
    aj_score_walk walk;
    aj_score_walk_keys(&c->at.sc, &walk, pos0,
                       aj_kb_add(kb, pos0, LLVMBuildSub(b, pos_rows, aj_kb_i32(kb, 1), "")), p->bn,
                       n_begin, n_end, seq->len_q, seq->len_k);
    if (p->amx)
        aj_amx_config(&c->amx);
    LLVMValueRef at = aj_kb_for_begin(kb, walk.begin, walk.end, aj_kb_i32(kb, 1), "walk");
    {
        LLVMValueRef cls = NULL;
        LLVMValueRef n = aj_score_walk_tile(&c->at.sc, &walk, at, c->at.tile_full ? &cls : NULL);
        LLVMValueRef n0 = LLVMBuildMul(b, n, aj_kb_i32(kb, p->bn), "n0");
        LLVMValueRef kcount =
            aj_kb_smin(kb, aj_kb_i32(kb, p->bn), LLVMBuildSub(b, seq->len_k, n0, ""));
        aj_cpu_skip_begin(&c->at, cls);
        /* a paged cache: the next key block of the range (the walk's next,
         * but where a block mask skips it) is prefetched while this one is
         * computed, its K before the scores and its V before P V, so that
         * each burst of prefetches overlaps a product */
        LLVMValueRef next0 = NULL, ncount = NULL;
        if (blk->k.pages) {
            next0 = aj_kb_add(kb, n0, aj_kb_i32(kb, p->bn));
            LLVMValueRef next_end =
                aj_kb_smin(kb, seq->len_k, aj_kb_mul(kb, blk->k_end, aj_kb_i32(kb, p->bn)));
            ncount = aj_kb_smin(kb, aj_kb_i32(kb, p->bn), LLVMBuildSub(b, next_end, next0, ""));
        }
        /* keys past Sk are zero: masked anyway, and 0 * V must not meet a
         * stale NaN */
        aj_cpu_load_cols(kb, c->kt, p->d / per_slot, p->bn, c->k_tensor,
                         p->kv_dtype, &blk->k, n0, kcount, p->pairs);
        if (p->pairs)
            aj_cpu_load_row_pairs(kb, c->v, p->dv, p->bn, c->v_tensor, &blk->v, n0, kcount);
        else
            aj_cpu_load_rows(kb, c->v, p->dv, c->v_tensor, p->kv_dtype, &blk->v, n0, kcount,
                             aj_kb_i32(kb, p->bn), 1.0, 0);
        if (next0)
            aj_cpu_prefetch_rows(kb, c->k_tensor, p->kv_dtype, &blk->k, next0, ncount, p->d);
        if (p->amx)
            aj_cpu_amx_gemm(&c->amx, c->s, c->q, p->d, c->kt, p->bn, p->d, c->rows_pad, 0);
        else
            aj_cpu_gemm_nt(kb, p->w, c->s, c->q, p->d / per_slot, c->kt, p->bn, c->rows_pad,
                           p->pairs);
        emit_softmax(c, n0);
        if (c->op->dropout > 0)
            emit_dropout(c, n0, kcount);
        if (p->pairs && c->op->dropout > 0)
            emit_round_p(c);
        if (next0)
            aj_cpu_prefetch_rows(kb, c->v_tensor, p->kv_dtype, &blk->v, next0, ncount, p->dv);
        if (p->amx) {
            aj_kb_if_begin(kb, aj_kb_get(kb, c->rescale));
            aj_cpu_scale_rows(kb, c->o, p->dv, c->alpha, c->rows_pad);
            aj_kb_if_end(kb);
            aj_cpu_amx_gemm(&c->amx, c->o, c->pw, p->bn, c->v, p->dv, p->bn, c->rows_pad, 1);
        } else {
            aj_cpu_gemm_acc(kb, p->dv, c->o, c->alpha, p->pairs ? c->pw : c->s,
                            p->bn / per_slot, 1, c->v, p->bn, c->rows_pad, p->pairs);
        }
        aj_cpu_skip_end(&c->at);
    }
    aj_kb_for_end(kb);
    if (p->amx)
        aj_amx_release(&c->amx);
    emit_epilogue(c, &blk->out);
}

/* The stack buffers of a forward item. */
static void alloc_buffers(cfwd *c)
{
    aj_kb *kb = c->kb;
    const cfwd_plan *p = &c->p;
    /* pairs: Q, Kt and V hold two bf16 per f32 slot */
    int per_slot = p->pairs ? 2 : 1;
    c->q = aj_cv_buffer(kb, p->bm * p->d / per_slot, "qbuf");
    c->kt = aj_cv_buffer(kb, p->d * p->bn / per_slot, "ktbuf");
    c->v = aj_cv_buffer(kb, p->bn * p->dv / per_slot, "vbuf");
    c->s = aj_cv_buffer(kb, p->bm * p->bn, "sbuf");
    if (p->pairs)
        c->pw = aj_cv_buffer(kb, p->bm * p->bn / 2, "pbuf");
    c->o = aj_cv_buffer(kb, p->bm * p->dv, "obuf");
    c->m = aj_cv_buffer(kb, p->bm, "mrow");
    c->l = aj_cv_buffer(kb, p->bm, "lrow");
    c->alpha = aj_cv_buffer(kb, p->bm, "alpha");
    c->rescale = p->amx ? aj_kb_var(kb, kb->t_i1, NULL, "rescale") : NULL;
    if (p->amx)
        aj_amx_init(&c->amx, kb, p->amx, p->dtype);
}

/* The work item's (x, y, z). */
static void work_item(cfwd *c, LLVMValueRef item[3])
{
    for (int d = 0; d < 3; d++)
        item[d] = aj_kb_item_id(c->kb, d);
}

/* A stage's opening: its parameters (`sig`), begin (`stage` NULL: the
 * module's one kernel), stack buffers and work item. */
static void begin_items(cfwd *c, const aj_score_prog *prog, aj_kernel_sig sig, const char *stage,
                        LLVMValueRef item[3])
{
    aj_params_declare(c->kb, sig, c->op, prog);
    aj_kb_begin_stage(c->kb, stage, 1);
    alloc_buffers(c);
    work_item(c, item);
}

/* layout = padded and varlen: items (ceil(Sq / bm), Hq, B), one row block
 * each over every key block. */
static void build_dense(cfwd *c, const aj_score_prog *prog, int log2e_in_q)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const aj_op *op = c->op;
    const cfwd_plan *p = &c->p;
    LLVMValueRef item[3];
    begin_items(c, prog, AJ_KSIG_CPU_FWD, NULL, item);
    LLVMValueRef h = item[1], bidx = item[2];
    c->m0 = LLVMBuildMul(b, item[0], aj_kb_i32(kb, p->bm), "m0");
    aj_cpu_attn_init(&c->at, kb, op, prog, log2e_in_q, bidx, h);
    const aj_cpu_seq *seq = &c->at.seq;
    /* varlen: the grid covers the longest sequence; items past this one's
     * end have nothing to do */
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, c->m0, seq->len_q, ""));
    c->rows = aj_kb_smin(kb, aj_kb_i32(kb, p->bm), LLVMBuildSub(b, seq->len_q, c->m0, ""));
    LLVMValueRef group =
        LLVMBuildSDiv(b, aj_param(kb, AJ_PID(heads_q)), aj_param(kb, AJ_PID(heads_kv)), "");
    LLVMValueRef hkv = LLVMBuildSDiv(b, h, group, "hkv");
    aj_attn_descales(kb, op, h, hkv, &c->k_scale, &c->v_scale);
    aj_kctx_dropout(&c->k, bidx, h);
    const aj_param_source out = out_tensor(op);
    cfwd_block blk = {
        .q = {.base = aj_cpu_seq_base(kb, AJ_PSRC_q, bidx, h, seq->start_q),
              .stride_s = aj_param(kb, AJ_PID(stride_q_s))},
        .k = {.base = aj_cpu_seq_base(kb, AJ_PSRC_k, bidx, hkv, seq->start_k),
              .stride_s = aj_param(kb, AJ_PID(stride_k_s))},
        .v = {.base = aj_cpu_seq_base(kb, AJ_PSRC_v, bidx, hkv, seq->start_k),
              .stride_s = aj_param(kb, AJ_PID(stride_v_s))},
        .k_first = aj_kb_i32(kb, 0),
        .k_end = aj_kb_i32(kb, INT32_MAX),
        .out = {out, AJ_PSRC_lse, op->accumulate ? AJ_DTYPE_F32 : p->dtype, op->accumulate,
                aj_cpu_seq_base(kb, out, bidx, h, seq->start_q), aj_param_stride(kb, out, 2),
                aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_lse, bidx, h), seq->start_q), NULL,
                NULL},
    };
    emit_row_block(c, &blk, log2e_in_q);
    aj_kb_if_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SEQ_Q, p->bm}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {p->bm, p->bn, 1, 1},
    };
    aj_kb_finish(kb, &layout);
}

/* The rows a query head's partials span in the workspace: Sq, or T of
 * varlen queries (aj_attn_paged_part_row_of). */
static LLVMValueRef paged_ws_len(cfwd *c)
{
    int varlen_q = c->op->q_layout == AJ_LAYOUT_VARLEN;
    return aj_kb_sext64(c->kb, aj_param(c->kb, varlen_q ? AJ_PID(tokens_q) : AJ_PID(seq_q)));
}

/* The part's key blocks of bn, [k_first, k_end): part `part` of the
 * splits, cut to none where a page of them lies outside the cache. */
static void part_keys(cfwd *c, LLVMValueRef part, LLVMValueRef bidx, cfwd_block *blk)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const aj_cpu_seq *seq = &c->at.seq;
    LLVMValueRef splits = aj_param(kb, AJ_PID(splits)), bn = aj_kb_i32(kb, c->p.bn);
    LLVMValueRef blocks =
        LLVMBuildSDiv(b, aj_kb_add(kb, seq->len_k, aj_kb_i32(kb, c->p.bn - 1)), bn, "");
    LLVMValueRef per = LLVMBuildSDiv(
        b, aj_kb_add(kb, blocks, LLVMBuildSub(b, splits, aj_kb_i32(kb, 1), "")), splits, "per");
    LLVMValueRef first = aj_kb_mul(kb, part, per);
    LLVMValueRef end = aj_kb_smin(kb, aj_kb_add(kb, first, per), blocks);
    /* the pages of keys [first bn, min(end bn, len_k)) */
    LLVMValueRef ps = aj_param(kb, AJ_PID(page_size));
    LLVMValueRef key_end = aj_kb_smin(kb, aj_kb_mul(kb, end, bn), seq->len_k);
    LLVMValueRef key_first = aj_kb_smin(kb, aj_kb_mul(kb, first, bn), key_end);
    LLVMValueRef ok = aj_attn_paged_pages_ok(
        kb, bidx, LLVMBuildSDiv(b, key_first, ps, ""),
        LLVMBuildSDiv(b, aj_kb_add(kb, key_end, LLVMBuildSub(b, ps, aj_kb_i32(kb, 1), "")), ps,
                      ""));
    blk->k_first = first;
    blk->k_end = LLVMBuildSelect(b, ok, end, first, "part_end");
}

/* The rows the part reads: Q of (b, h), K and V of its KV head through
 * the block table; returns the GQA group size. */
static LLVMValueRef part_sources(cfwd *c, LLVMValueRef bidx, LLVMValueRef h, cfwd_block *blk)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    LLVMValueRef ps = aj_param(kb, AJ_PID(page_size));
    LLVMValueRef group =
        LLVMBuildSDiv(b, aj_param(kb, AJ_PID(heads_q)), aj_param(kb, AJ_PID(heads_kv)), "");
    LLVMValueRef hkv = aj_kb_sext64(kb, LLVMBuildSDiv(b, h, group, "hkv"));
    LLVMValueRef pages = aj_cv_at(
        kb, kb->t_i32, aj_param(kb, AJ_PID(block_table)),
        aj_kb_mul(kb, aj_kb_sext64(kb, bidx), aj_kb_sext64(kb, aj_param(kb, AJ_PID(max_pages)))));
    LLVMValueRef k_first = blk->k_first, k_end = blk->k_end;
    *blk = (cfwd_block){
        .q = {.base = aj_cpu_seq_base(kb, AJ_PSRC_q, bidx, h, c->at.seq.start_q),
              .stride_s = aj_param(kb, AJ_PID(stride_q_s))},
        .k = {aj_kb_mul(kb, hkv, aj_param(kb, AJ_PID(stride_k_cache_h))),
              aj_param(kb, AJ_PID(stride_k_cache_s)), pages, ps,
              aj_param(kb, AJ_PID(stride_k_cache_page))},
        .v = {aj_kb_mul(kb, hkv, aj_param(kb, AJ_PID(stride_v_cache_h))),
              aj_param(kb, AJ_PID(stride_v_cache_s)), pages, ps,
              aj_param(kb, AJ_PID(stride_v_cache_page))},
        .k_first = k_first,
        .k_end = k_end,
    };
    return group;
}

/* Where the part's rows go: outs[0] o and lse (one part), outs[1] the
 * workspace's partials. */
static void part_outs(cfwd *c, LLVMValueRef part, LLVMValueRef bidx, LLVMValueRef h,
                      cfwd_out outs[2])
{
    aj_kb *kb = c->kb;
    const cfwd_plan *p = &c->p;
    const aj_cpu_seq *seq = &c->at.seq;
    cfwd_out direct = {AJ_PSRC_o,
                       AJ_PSRC_lse,
                       p->dtype,
                       0,
                       aj_cpu_seq_base(kb, AJ_PSRC_o, bidx, h, seq->start_q),
                       aj_param(kb, AJ_PID(stride_o_s)),
                       aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_lse, bidx, h), seq->start_q),
                       NULL,
                       NULL};
    LLVMValueRef lse_at;
    LLVMValueRef row0 =
        aj_kb_add(kb,
                  aj_attn_paged_part_row_of(kb, bidx, h, part, p->dv,
                                            c->op->q_layout == AJ_LAYOUT_VARLEN, &lse_at),
                  seq->start_q);
    cfwd_out partial = {AJ_PSRC_workspace,
                        AJ_PSRC_workspace,
                        AJ_DTYPE_F32,
                        0,
                        aj_kb_mul(kb, row0, aj_kb_i64(kb, p->dv)),
                        aj_kb_i64(kb, p->dv),
                        aj_kb_add(kb, lse_at, row0),
                        NULL,
                        NULL};
    outs[0] = direct;
    outs[1] = partial;
}

/* The row block (c->m0, c->rows set) to outs[0] where there is one part
 * (`one`), else to outs[1]. */
static void emit_part_rows(cfwd *c, cfwd_block *blk, LLVMValueRef one, const cfwd_out outs[2],
                           int log2e_in_q)
{
    aj_kb_if_begin(c->kb, one);
    blk->out = outs[0];
    emit_row_block(c, blk, log2e_in_q);
    aj_kb_else(c->kb);
    blk->out = outs[1];
    emit_row_block(c, blk, log2e_in_q);
    aj_kb_if_end(c->kb);
}

/* GQA-packed (`pack`): the item of the group's first head takes the rows
 * of all the group's heads, stacked, as one row block; opens the else of
 * `pack` (the unpacked items), which the caller closes. */
static void emit_packed_heads(cfwd *c, const cfwd_block *blk, const cfwd_out outs[2],
                              LLVMValueRef group, LLVMValueRef h, LLVMValueRef one,
                              LLVMValueRef pack, int log2e_in_q)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const aj_cpu_seq *seq = &c->at.seq;
    aj_kb_if_begin(kb, pack);
    aj_kb_if_begin(
        kb, LLVMBuildICmp(b, LLVMIntEQ, LLVMBuildSRem(b, h, group, ""), aj_kb_i32(kb, 0), ""));
    cfwd_block packed = *blk;
    packed.q.per_head = seq->len_q;
    packed.q.stride_h = aj_param(kb, AJ_PID(stride_q_h));
    cfwd_out heads[2] = {outs[0], outs[1]};
    heads[0].o_head = aj_param(kb, AJ_PID(stride_o_h));
    heads[0].lse_head = aj_param(kb, AJ_PID(stride_lse_h));
    heads[1].lse_head =
        aj_kb_mul(kb, aj_kb_sext64(kb, aj_param(kb, AJ_PID(splits))), paged_ws_len(c));
    heads[1].o_head = aj_kb_mul(kb, heads[1].lse_head, aj_kb_i64(kb, c->p.dv));
    c->per_head = seq->len_q;
    c->m0 = aj_kb_i32(kb, 0);
    c->rows = aj_kb_mul(kb, group, seq->len_q);
    emit_part_rows(c, &packed, one, heads, log2e_in_q);
    c->per_head = NULL;
    aj_kb_if_end(kb);
    aj_kb_else(kb);
}

/*
 * layout = paged, stage 0: items (splits, Hq, B).  Part s of sequence b
 * takes key blocks [s per, (s + 1) per), per = ceil(blocks / splits), of
 * its seqlens_k[b] keys, gathered through its block-table row (pages
 * checked first), for all Sq rows in blocks of bm; with one part it
 * writes o and lse, else its partial to the workspace.  q_layout =
 * varlen: the rows are sequence b's chunk of the packed queries (its
 * cu_seqlens_q pair, checked), the last of its positions.
 */
static void build_paged_parts(cfwd *c, const aj_score_prog *prog, int log2e_in_q)
{
    aj_kb *kb = c->kb;
    const cfwd_plan *p = &c->p;
    LLVMValueRef item[3];
    begin_items(c, prog, AJ_KSIG_CPU_PAGED_FWD, "parts", item);
    LLVMValueRef part = item[0], h = item[1], bidx = item[2];
    aj_cpu_attn_init(&c->at, kb, c->op, prog, log2e_in_q, bidx, h);
    cfwd_block blk;
    part_keys(c, part, bidx, &blk);
    LLVMValueRef group = part_sources(c, bidx, h, &blk);
    /* f8 caches: K's and V's descales, of the KV head all packed heads share */
    aj_attn_descales(kb, c->op, h, LLVMBuildSDiv(c->b, h, group, ""), &c->k_scale, &c->v_scale);
    cfwd_out outs[2];
    part_outs(c, part, bidx, h, outs);
    LLVMValueRef one = LLVMBuildICmp(c->b, LLVMIntEQ, aj_param(kb, AJ_PID(splits)),
                                     aj_kb_i32(kb, 1), "");
    /* GQA packing (attn_common.h's rule: here the group's rows fit one
     * block and the programs read no h): the item of the group's first
     * head takes all of its heads' rows (the KV read once, the register
     * tiles full), the others return */
    LLVMValueRef pack = NULL;
    const bool packable = aj_attn_paged_packable(prog, false);
    if (packable) {
        pack = aj_attn_paged_packs(kb, group, c->at.seq.len_q, p->bm);
        emit_packed_heads(c, &blk, outs, group, h, one, pack, log2e_in_q);
    }
    const aj_cpu_seq *seq = &c->at.seq;
    LLVMValueRef mb = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), seq->len_q, aj_kb_i32(kb, p->bm), "mb");
    c->m0 = mb;
    c->rows = aj_kb_smin(kb, aj_kb_i32(kb, p->bm), LLVMBuildSub(c->b, seq->len_q, mb, ""));
    emit_part_rows(c, &blk, one, outs, log2e_in_q);
    aj_kb_for_end(kb);
    if (pack)
        aj_kb_if_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_SPLITS, 1}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {p->bm, p->bn, 1, 1},
        .pack_rows = packable ? p->bm : 0,
    };
    aj_kb_finish(kb, &layout);
}

/* exp / log of one f32 */
static LLVMValueRef scalar_exp(cfwd *c, LLVMValueRef x)
{
    return scalar_math(c, "llvm.exp", x);
}

/*
 * layout = paged, stage 1 (splits > 1): items (1, Hq, B) merge the parts
 * of each row by log-sum-exp (docs/design.md "Merge of two partials", over
 * splits parts): LSE = m + log sum_s exp(LSE_s - m), O = sum_s exp(LSE_s -
 * LSE) O_s; no part with a key gives O = 0, LSE = -inf.
 */
static void build_paged_merge(cfwd *c, const aj_score_prog *prog)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cfwd_plan *p = &c->p;
    int dv = p->dv;
    aj_params_declare(kb, AJ_KSIG_CPU_PAGED_MERGE, c->op, prog);
    aj_kb_begin_stage(kb, "merge", 1);
    LLVMValueRef acc = aj_cv_buffer(kb, dv, "macc");
    LLVMValueRef mx = aj_kb_var(kb, kb->t_f32, NULL, "mx");
    LLVMValueRef sum = aj_kb_var(kb, kb->t_f32, NULL, "sum");
    LLVMValueRef item[3];
    work_item(c, item);
    LLVMValueRef h = item[1], bidx = item[2];
    /* the rows of sequence bidx: Sq, or its chunk of the packed ones */
    LLVMValueRef splits = aj_param(kb, AJ_PID(splits)), sq = paged_ws_len(c);
    LLVMValueRef len_q = sq, start_q = aj_kb_i64(kb, 0);
    if (c->op->q_layout == AJ_LAYOUT_VARLEN) {
        aj_cpu_seq seq;
        aj_cpu_seq_of(kb, c->op, prog, bidx, &seq);
        len_q = aj_kb_sext64(kb, seq.len_q);
        start_q = seq.start_q;
    }
    LLVMValueRef lse_at;
    LLVMValueRef row0 =
        aj_kb_add(c->kb,
                  aj_attn_paged_part_row_of(kb, bidx, h, aj_kb_i32(kb, 0), dv,
                                            c->op->q_layout == AJ_LAYOUT_VARLEN, &lse_at),
                  start_q);
    lse_at = aj_kb_add(kb, lse_at, row0);
    LLVMValueRef ninf = aj_kb_f32(kb, -INFINITY);
    LLVMValueRef o_base = aj_cpu_seq_base(kb, AJ_PSRC_o, bidx, h, start_q);
    LLVMValueRef lse_base = aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_lse, bidx, h), start_q);
    LLVMValueRef i = aj_kb_for_begin(kb, aj_kb_i64(kb, 0), len_q, aj_kb_i64(kb, 1), "mi");
    aj_kb_set(kb, mx, ninf);
    LLVMValueRef s = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), splits, aj_kb_i32(kb, 1), "ms");
    LLVMValueRef part_lse = aj_cpu_fload(
        kb,
        aj_cv_at(kb, kb->t_f32, aj_param(kb, AJ_PID(workspace)),
                 aj_kb_add(kb, lse_at, aj_kb_add(kb, aj_kb_mul(kb, aj_kb_sext64(kb, s), sq), i))));
    aj_kb_set(kb, mx, aj_cv_max(kb, aj_kb_get(kb, mx), part_lse));
    aj_kb_for_end(kb);
    LLVMValueRef none = LLVMBuildFCmp(b, LLVMRealOEQ, aj_kb_get(kb, mx), ninf, "");
    LLVMValueRef m_use = LLVMBuildSelect(b, none, aj_kb_f32(kb, 0), aj_kb_get(kb, mx), "");
    aj_kb_set(kb, sum, aj_kb_f32(kb, 0));
    aj_cpu_zero(kb, acc, dv);
    s = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), splits, aj_kb_i32(kb, 1), "ms");
    {
        LLVMValueRef r = aj_kb_add(kb, aj_kb_mul(kb, aj_kb_sext64(kb, s), sq), i);
        LLVMValueRef e = scalar_exp(
            c,
            LLVMBuildFSub(b,
                          aj_cpu_fload(kb, aj_cv_at(kb, kb->t_f32, aj_param(kb, AJ_PID(workspace)),
                                                    aj_kb_add(kb, lse_at, r))),
                          m_use, ""));
        aj_kb_set(kb, sum, LLVMBuildFAdd(b, aj_kb_get(kb, sum), e, ""));
        /* O_s weighted by exp(LSE_s - m); / sum below.  A part without a
         * key has weight 0 and O_s = 0. */
        LLVMValueRef ev = aj_cv_splat(kb, e, 8);
        LLVMValueRef orow = aj_kb_mul(kb, aj_kb_add(kb, row0, r), aj_kb_i64(kb, dv));
        LLVMValueRef d =
            aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, dv), aj_kb_i32(kb, 8), "md");
        LLVMValueRef at = aj_cpu_buf_at(kb, acc, d);
        LLVMValueRef part_o = aj_cv_load(kb,
                                         aj_cv_at(kb, kb->t_f32, aj_param(kb, AJ_PID(workspace)),
                                                  aj_kb_add(kb, orow, aj_kb_sext64(kb, d))),
                                         AJ_DTYPE_F32, 8);
        aj_cpu_vstore(kb, aj_cv_fma(kb, part_o, ev, aj_cpu_vload(kb, at, 8)), at);
        aj_kb_for_end(kb);
    }
    aj_kb_for_end(kb);
    LLVMValueRef total = aj_kb_get(kb, sum);
    LLVMValueRef inv = LLVMBuildSelect(b, none, aj_kb_f32(kb, 0),
                                       LLVMBuildFDiv(b, aj_kb_f32(kb, 1), total, ""), "");
    LLVMValueRef lse = LLVMBuildSelect(b, none, ninf, LLVMBuildFAdd(b, m_use,
                                       scalar_math(c, "llvm.log", total), ""), "");
    if (aj_score_has_sinks(prog)) {
        LLVMValueRef l2 = LLVMBuildFMul(b, lse, aj_kb_f32(kb, AJ_LOG2E), "");
        LLVMValueRef hg = LLVMBuildAdd(b, h, aj_param(kb, AJ_PID(head_offset)), "");
        aj_score_fold_sink(kb, prog, hg, NULL, &l2, &inv, &lse);
    }
    LLVMValueRef orow = aj_kb_add(kb, o_base, aj_kb_mul(kb, i, aj_param(kb, AJ_PID(stride_o_s))));
    LLVMValueRef d =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, dv), aj_kb_i32(kb, 8), "mo");
    LLVMValueRef val = LLVMBuildFMul(b, aj_cpu_vload(kb, aj_cpu_buf_at(kb, acc, d), 8),
                                     aj_cv_splat(kb, inv, 8), "");
    aj_cv_store(kb, val,
                tensor_at(c, AJ_PSRC_o, p->dtype, aj_kb_add(kb, orow, aj_kb_sext64(kb, d))),
                p->dtype, 8);
    aj_kb_for_end(kb);
    LLVMBuildStore(b, lse,
                   aj_cv_at(kb, kb->t_f32, aj_param(kb, AJ_PID(lse)), aj_kb_add(kb, lse_base, i)));
    aj_kb_for_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_ONE, 1}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {p->bm, p->bn, 1, 1},
    };
    aj_kb_finish(kb, &layout);
}

static aj_status cfwd_build(aj_kb *kb, const aj_op *op, void *user)
{
    cfwd c;
    memset(&c, 0, sizeof c);
    const aj_score_prog *prog;
    aj_status st = aj_kctx_plan_programs(kb, op, plan_kernel(kb->ctx, op, &c.p), &prog);
    if (st != AJ_OK)
        return st;
    aj_kctx_init(&c.k, kb, op, prog);
    /* for the identity program (no score_mod, no bias), Q takes scale
     * log2 e once, and scores need no multiply; a program sees the scaled
     * score in natural units */
    int log2e_in_q = aj_cpu_log2e_in_q(prog);
    if (op->layout == AJ_LAYOUT_PAGED) {
        c.k_tensor = AJ_PSRC_k_cache;
        c.v_tensor = AJ_PSRC_v_cache;
        build_paged_parts(&c, prog, log2e_in_q);
        build_paged_merge(&c, prog);
    } else {
        c.k_tensor = AJ_PSRC_k;
        c.v_tensor = AJ_PSRC_v;
        build_dense(&c, prog, log2e_in_q);
    }
    return kb->st;
}

AJ_TEMPLATE_BOTH_VARIANTS(aj_template_cpu_fwd, "cpu_fwd", AJ_KIND_FORWARD, cfwd_check, cfwd_build,
                          .targets = 1u << AJ_TARGET_CPU, .stage_sigs = {AJ_KSIG_CPU_FWD});

/* layout = paged: the same build, split-KV parts and their merge */
AJ_TEMPLATE_BOTH_VARIANTS(aj_template_cpu_fwd_paged, "cpu_paged", AJ_KIND_FORWARD, cfwd_check,
                          cfwd_build, .targets = 1u << AJ_TARGET_CPU, .paged = true,
                          .stage_sigs = {AJ_KSIG_CPU_PAGED_FWD, AJ_KSIG_CPU_PAGED_MERGE});
