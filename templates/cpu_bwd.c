/*
 * cpu_bwd.c -- the backward pass of the cpu target (both variants), as two
 * kernels of one module run in order, each recomputing the probabilities
 * from Q, K and the forward's LSE with the forward's own scores
 * (cpu_attn.h):
 *
 *   P_ij  = 2^(s_ij - LSE_i log2 e)      (s in log2 units, -inf where hidden)
 *   dP_ij = z_ij dO_i . v_j              z = keep / (1 - p) with dropout, else 1
 *   dS_ij = P_ij (dP_ij - Delta_i) m'_ij,   Delta_i = dO_i . O_i
 *
 * m' = d score_mod / d score (score.h's derivative of the program; 1
 * without a score_mod).  Grad side tensors: the dq item of query block m
 * is part m of its (b, h)'s partial sums (side_grad.c), to which it adds
 * each element's P (dP - Delta) times the score_mod's derivatives by the
 * tensors' loads, where it computes them.
 *
 *   stage 0, dkdv: one item per (key block of bn keys, kv head, batch)
 *                  dV_j = sum_i z_ij P_ij dO_i      dK_j = scale sum_i dS_ij q_i
 *                  over the query heads of the group and the query blocks of
 *                  bm rows that can see the keys (GQA summed in the item;
 *                  skip tiles of the mask not visited)
 *   stage 1, dq:   one item per (query block, head, batch)
 *                  dQ_i = scale sum_j dS_ij k_j over the visible key blocks
 *                  (likewise without skip tiles)
 *
 * or, the fused plan (docs/cpu.md "The backward"), where the launch finds
 * enough (kv head, batch) pairs to fill the workers:
 *
 *   stage 2, fused: one item per (kv head, batch): stage 0's work for
 *                  every key block in order, each tile also adding dS K
 *                  into the dQ rows of its query head, f32 in the
 *                  workspace; then dQ stored
 *
 * five products a tile where the split plan does seven (stage 1 computes
 * S and dP again).  Each dQ element gets the same terms in the same order
 * (key blocks ascending, each one's gemm), so both plans give the same
 * bits, whichever the launch takes.  Not with bias or grad side tensors
 * (aj_cpu_bwd_fuses): their stage keeps its place, unused.
 *
 * Both per block, on the stack (f32):
 *
 *   Q [bm][D] (scaled)   dO [bm][Dv]   Kt [D][bn]   Vt [Dv][bn]
 *   S [bm][bn] = Q Kt -> z P      dP [bm][bn] = dO Vt -> dS
 *   dK [bn][D] += dS^T Q, dV [bn][Dv] += (z P)^T dO   (gemm_acc reads P^T
 *   through its strides);  dQ [bm][D] += dS K
 *
 * Every gradient element is summed by one item in a fixed order: no
 * atomics, the same bits on any thread count.  Rows that see no key get
 * dQ = 0, keys no row sees dK = dV = 0.
 *
 * layout = varlen: each item's sequence from cu_seqlens (aj_cpu_seq_of);
 * the grids cover max_seqlen_q / _k, and items past their sequence's end
 * do nothing.
 *
 * bias = add: dbias (f32, the bias's shape) = dS summed over the bias's
 * broadcast dims.  The dq item of query block m at (b, h) = (0 if the bias
 * broadcasts over batch else b, 0 if over heads else h) owns dbias rows of
 * block m: it walks every (b, h) pair folded onto them in order (each
 * pair's dQ included), writing the first pair's dS and adding the others';
 * the other items of folded pairs do nothing.  With bias the dq items
 * visit every key block (dS = 0 where hidden), so all of dbias is written.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "templates/cpu_attn.h"
#include "templates/grad_tail.h"
#include "templates/skeleton.h"
#include "templates/template.h"

#define CN AJ_CPU_CN

typedef struct cbwd_plan {
    aj_dtype dtype;
    int d, dv;
    int w;
    int bm, bn;
    /* the products' operands in 16-bit pairs: bf16 / f16 on AMX tiles
     * (native or stand-in; docs/cpu.md "AMX tiles"), else bf16 by vdpbf16ps
     * register tiles on AVX512-BF16 hosts, as the forward's; without
     * either, everything widened to f32 */
    int pairs;
    aj_amx_mode amx;
} cbwd_plan;

static aj_status plan_kernel(aj_ctx *ctx, const aj_op *op, cbwd_plan *p)
{
    memset(p, 0, sizeof *p);
    p->dtype = op->dtype;
    p->d = op->head_dim;
    p->dv = aj_op_dv(op);
    p->w = aj_cpu_vector_width();
    aj_status st = aj_cpu_plan_tiles(ctx, op, "cpu backward", p->w, 64, &p->bm, &p->bn);
    /* tile products take 32 rows, 32 k and 32 columns a step (cpu_attn.h),
     * register tiles 32 keys */
    int tiles = p->w == 16 && p->d % 32 == 0 && p->dv % 32 == 0 &&
                p->bm % AJ_CPU_AMX_ROWS == 0 && p->bn % 32 == 0;
    p->pairs = aj_cpu_products(op, p->dtype, tiles, tiles, AJ_CPU_AMX_BWD_BM, AJ_CPU_AMX_BWD_BN,
                               &p->amx, &p->bm, &p->bn);
    return st;
}

static aj_status cbwd_check(aj_ctx *ctx, const aj_op *op, aj_target target)
{
    aj_status st = aj_cpu_check_op(ctx, op, "cpu backward");
    cbwd_plan plan;
    return st != AJ_OK ? st : plan_kernel(ctx, op, &plan);
}

/* ---------------------------------------------------------------- build */

typedef struct cbwd {
    AJ_KCTX;                     /* skeleton.h (the scores and lengths are at's) */
    cbwd_plan p;
    aj_cpu_attn at;              /* of the current (b, h) */
    LLVMValueRef q, dob, kt, vt, kn, s, dp, z, lse2, delta;   /* stack buffers */
    /* p.pairs: Q, dO rows zipped in pairs (B operands), P^T, dS^T (dkdv) and
     * dS (dq) in the dtype (A operands); q, dob, kt, vt, kn then hold rows or
     * pairs (below) */
    LLVMValueRef qz, doz, pt, dst, dsa;
    aj_amx amx;
    /* grad side tensors, the dq stage: the item's part of the sums, each
     * grad tensor's first element in it, whether the call asks for them */
    LLVMValueRef side_part, side_base[AJ_OP_TENSORS_MAX + 1], side_on;
    /* the fused stage: a dQ tile [bm][D] between the workspace's rows and
     * the product (NULL in the others) */
    LLVMValueRef fused_dq;
} cbwd;

static LLVMValueRef buf_at(cbwd *c, LLVMValueRef buf, LLVMValueRef index)
{
    return aj_cpu_buf_at(c->kb, buf, index);
}

static LLVMValueRef fload(cbwd *c, LLVMValueRef ptr)
{
    return aj_cpu_fload(c->kb, ptr);
}

static LLVMValueRef vload(cbwd *c, LLVMValueRef ptr, int n)
{
    return aj_cpu_vload(c->kb, ptr, n);
}

static void vstore(cbwd *c, LLVMValueRef v, LLVMValueRef ptr)
{
    aj_cpu_vstore(c->kb, v, ptr);
}

/* The stack buffers both stages use. */
static void alloc_buffers(cbwd *c)
{
    const cbwd_plan *p = &c->p;
    c->q = aj_cv_buffer(c->kb, p->bm * p->d, "qbuf");
    c->dob = aj_cv_buffer(c->kb, p->bm * p->dv, "dobuf");
    c->kt = aj_cv_buffer(c->kb, p->d * p->bn, "ktbuf");
    c->vt = aj_cv_buffer(c->kb, p->dv * p->bn, "vtbuf");
    c->s = aj_cv_buffer(c->kb, p->bm * p->bn, "sbuf");
    c->dp = aj_cv_buffer(c->kb, p->bm * p->bn, "dpbuf");
    c->lse2 = aj_cv_buffer(c->kb, p->bm, "lse2");
    c->delta = aj_cv_buffer(c->kb, p->bm, "delta");
    if (c->op->dropout > 0)
        c->z = aj_cv_buffer(c->kb, p->bm * p->bn, "zbuf");
    if (p->amx) {
        aj_amx_init(&c->amx, c->kb, p->amx, p->dtype);
        aj_amx_config(&c->amx);
    }
}

/* Scores and the dropout stream of query head h of batch bidx. */
static void set_head(cbwd *c, LLVMValueRef bidx, LLVMValueRef h)
{
    aj_cpu_attn_init(&c->at, c->kb, c->op, c->prog, 0, bidx, h);
    aj_kctx_dropout(&c->k, bidx, h);
}

static LLVMValueRef item(cbwd *c, int d)
{
    return aj_kb_item_id(c->kb, d);
}

/*
 * The query side of rows m0 .. m0 + bm - 1 of (bidx, h), set_head's: Q
 * (scaled), dO, LSE in log2 units and Delta = dO . O.  Rows past Sq get
 * Q = dO = 0 and LSE = +inf (so P = 0); a row whose LSE is -inf saw no key
 * in the forward and gets 0, so that its P = 2^(-inf - 0) = 0.  With
 * p.pairs, Q (unscaled: the scores take the scale) and dO stay 16-bit rows,
 * and `zipped` also fills qz and doz.
 */
static void load_query_side(cbwd *c, LLVMValueRef bidx, LLVMValueRef h, LLVMValueRef m0,
                            LLVMValueRef rows, int zipped)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cbwd_plan *p = &c->p;
    LLVMValueRef bm = aj_kb_i32(kb, p->bm);
    LLVMValueRef start = c->at.seq.start_q;
    const aj_cpu_rows q_rows = {.base = aj_cpu_seq_base(kb, AJ_PSRC_q, bidx, h, start),
                                .stride_s = aj_param(kb, AJ_PID(stride_q_s))};
    const aj_cpu_rows do_rows = {.base = aj_cpu_seq_base(kb, AJ_PSRC_do, bidx, h, start),
                                 .stride_s = aj_param(kb, AJ_PID(stride_do_s))};
    if (p->pairs) {
        aj_cpu_load_rows(kb, c->q, p->d / 2, AJ_PSRC_q, p->dtype, &q_rows, m0, rows, bm, 1.0, 1);
        aj_cpu_load_rows(kb, c->dob, p->dv / 2, AJ_PSRC_do, p->dtype, &do_rows, m0, rows, bm, 1.0,
                         1);
        if (zipped) {
            aj_cpu_load_row_pairs(kb, c->qz, p->d, p->bm, AJ_PSRC_q, &q_rows, m0, rows);
            aj_cpu_load_row_pairs(kb, c->doz, p->dv, p->bm, AJ_PSRC_do, &do_rows, m0, rows);
        }
    } else {
        aj_cpu_load_rows(kb, c->q, p->d, AJ_PSRC_q, p->dtype, &q_rows, m0, rows, bm,
                         aj_op_scale(c->op), 0);
        aj_cpu_load_rows(kb, c->dob, p->dv, AJ_PSRC_do, p->dtype, &do_rows, m0, rows, bm, 1.0, 0);
    }
    LLVMValueRef o_base = aj_cpu_seq_base(kb, AJ_PSRC_o, bidx, h, start);
    LLVMValueRef lse_base = aj_kb_add(kb, aj_attn_slice_base(kb, AJ_PSRC_lse, bidx, h), start);
    LLVMValueRef i = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), bm, aj_kb_i32(kb, 1), "qs");
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, i, rows, ""));
    {
        LLVMValueRef ig = aj_kb_sext64(kb, aj_kb_add(kb, m0, i));
        LLVMValueRef l = fload(
            c, aj_cv_at(kb, kb->t_f32, aj_param(kb, AJ_PID(lse)), aj_kb_add(kb, lse_base, ig)));
        LLVMValueRef empty = LLVMBuildFCmp(b, LLVMRealOEQ, l, aj_kb_f32(kb, -INFINITY), "");
        LLVMValueRef l2 = LLVMBuildFMul(b, l, aj_kb_f32(kb, AJ_LOG2E), "");
        LLVMBuildStore(b, LLVMBuildSelect(b, empty, aj_kb_f32(kb, 0), l2, ""),
                       buf_at(c, c->lse2, i));
        LLVMValueRef orow =
            aj_kb_add(kb, o_base, aj_kb_mul(kb, ig, aj_param(kb, AJ_PID(stride_o_s))));
        LLVMValueRef dorow = aj_kb_add(kb, do_rows.base, aj_kb_mul(kb, ig, do_rows.stride_s));
        LLVMValueRef acc = aj_kb_var(kb, aj_cv_type(kb, 8), NULL, "delta");
        aj_kb_set(kb, acc, LLVMConstNull(aj_cv_type(kb, 8)));
        LLVMValueRef x =
            aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, p->dv), aj_kb_i32(kb, 8), "dx");
        LLVMValueRef ov = aj_cv_load(
            kb, aj_cpu_tensor_at(kb, AJ_PSRC_o, p->dtype, aj_kb_add(kb, orow, aj_kb_sext64(kb, x))),
            p->dtype, 8);
        LLVMValueRef dv = aj_cv_load(
            kb,
            aj_cpu_tensor_at(kb, AJ_PSRC_do, p->dtype, aj_kb_add(kb, dorow, aj_kb_sext64(kb, x))),
            p->dtype, 8);
        aj_kb_set(kb, acc, aj_cv_fma(kb, ov, dv, aj_kb_get(kb, acc)));
        aj_kb_for_end(kb);
        LLVMBuildStore(b, aj_cv_hsum(kb, aj_kb_get(kb, acc), 8), buf_at(c, c->delta, i));
    }
    aj_kb_else(kb);
    LLVMBuildStore(b, aj_kb_f32(kb, INFINITY), buf_at(c, c->lse2, i));
    LLVMBuildStore(b, aj_kb_f32(kb, 0), buf_at(c, c->delta, i));
    aj_kb_if_end(kb);
    aj_kb_for_end(kb);
}

/* z[i][j] = keep_ij / (1 - p) over the whole block (out-of-range elements
 * have P = 0 already). */
static void emit_dropout_scale(cbwd *c, LLVMValueRef m0, LLVMValueRef n0)
{
    aj_kb *kb = c->kb;
    double p = c->op->dropout;
    LLVMValueRef i =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, c->p.bm), aj_kb_i32(kb, 1), "zi");
    LLVMValueRef j =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, c->p.bn), aj_kb_i32(kb, 1), "zj");
    LLVMValueRef keep =
        aj_attn_dropout_keep(kb, &c->drop, p, aj_kb_add(kb, m0, i), aj_kb_add(kb, n0, j));
    LLVMBuildStore(c->b, aj_score_dropped(kb, p, keep, aj_kb_f32(kb, 1.0)),
                   buf_at(c, c->z, aj_kb_add(kb, aj_kb_mul(kb, i, aj_kb_i32(kb, c->p.bn)), j)));
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

/*
 * From S = Q Kt and dP = dO Vt of rows m0.. and keys n0..: S becomes z P
 * (for dV) and dP becomes dS (for dK, dQ, dbias).
 */
static void emit_probabilities(cbwd *c, LLVMValueRef m0, LLVMValueRef n0)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cbwd_plan *p = &c->p;
    const aj_op *op = c->op;
    int w = p->w;
    if (op->dropout > 0)
        emit_dropout_scale(c, m0, n0);
    LLVMValueRef i =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, p->bm), aj_kb_i32(kb, 1), "pi");
    LLVMValueRef ig = aj_kb_add(kb, m0, i);
    LLVMValueRef lse = aj_cv_splat(kb, fload(c, buf_at(c, c->lse2, i)), w);
    LLVMValueRef delta = aj_cv_splat(kb, fload(c, buf_at(c, c->delta, i)), w);
    LLVMValueRef row = aj_kb_mul(kb, i, aj_kb_i32(kb, p->bn));
    /* a row past Sq (a tile's tail) has dS 0; its score (of a zero q row)
     * may sit where the score_mod's derivative is infinite, sqrt(abs(score))
     * at 0, and 0 * inf would spread NaN into dK */
    LLVMValueRef row_in = LLVMBuildICmp(b, LLVMIntSLT, ig, c->at.seq.len_q, "");
    for (int n = 0; n < p->bn / w; n++) {
        LLVMValueRef at = aj_kb_add(kb, row, aj_kb_i32(kb, n * w));
        LLVMValueRef jv = LLVMBuildAdd(
            b, aj_cv_splat(kb, aj_kb_add(kb, n0, aj_kb_i32(kb, n * w)), w), aj_cv_iota(kb, w), "");
        LLVMValueRef dmod, t = vload(c, buf_at(c, c->s, at), w);
        if (p->pairs)   /* the products saw Q unscaled */
            t = LLVMBuildFMul(b, t, aj_cv_splat(kb, aj_kb_f32(kb, aj_op_scale(op)), w), "");
        LLVMValueRef s2 = aj_cpu_scores(&c->at, t, ig, jv, &dmod);
        LLVMValueRef pv = aj_cv_exp2_softmax(kb, LLVMBuildFSub(b, s2, lse, ""), w);
        LLVMValueRef dpv = vload(c, buf_at(c, c->dp, at), w);
        LLVMValueRef pz = pv;
        if (op->dropout > 0) {
            LLVMValueRef z = vload(c, buf_at(c, c->z, at), w);
            pz = LLVMBuildFMul(b, pv, z, "");
            dpv = LLVMBuildFMul(b, dpv, z, "");
        }
        if (c->side_part) {   /* dq: the grad side tensors' terms, dS of the score */
            LLVMValueRef live = LLVMBuildAnd(
                b, aj_cv_splat(kb, row_in, w),
                LLVMBuildFCmp(b, LLVMRealOGT, pv, aj_cv_splat(kb, aj_kb_f32(kb, 0), w), ""), "");
            aj_kb_if_begin(kb, c->side_on);
            /* the program reads scale q.k and the bias leaf */
            aj_score_bias bias = {op->bias == AJ_BIAS_ADD ? aj_cpu_bias(&c->at, ig, jv) : NULL,
                                  NULL, NULL};
            aj_side_grad_add_lanes(&c->at.sc, c->side_base, c->side_part, t,
                                   bias.value ? &bias : NULL,
                                   aj_score_ds(kb, pv, dpv, delta, NULL, row_in), live, ig, jv);
            aj_kb_if_end(kb);
        }
        /* the chain rule through the score_mod: 0 in rows past Sq */
        LLVMValueRef ds = aj_score_ds(kb, pv, dpv, delta, dmod, row_in);
        vstore(c, pz, buf_at(c, c->s, at));
        vstore(c, ds, buf_at(c, c->dp, at));
    }
    aj_kb_for_end(kb);
}

/* rows [0, count) of an f32 buffer [n][width], times `scale`, into rows
 * r0.. of dst in tensor t (of the plan's dtype, or the f32 workspace) */
static void store_rows(cbwd *c, LLVMValueRef buf, int width, aj_param_source t,
                       const aj_cpu_rows *dst, LLVMValueRef r0, LLVMValueRef count, double scale)
{
    aj_kb *kb = c->kb;
    aj_dtype dtype = t == AJ_PSRC_workspace ? AJ_DTYPE_F32 : c->p.dtype;
    LLVMValueRef r = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), count, aj_kb_i32(kb, 1), "sr");
    LLVMValueRef row = aj_cpu_row_at(kb, dst, aj_kb_add(kb, r0, r));
    LLVMValueRef x =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, width), aj_kb_i32(kb, 8), "srx");
    LLVMValueRef v =
        vload(c, buf_at(c, buf, aj_kb_add(kb, aj_kb_mul(kb, r, aj_kb_i32(kb, width)), x)), 8);
    if (scale != 1.0)
        v = LLVMBuildFMul(c->b, v, aj_cv_splat(kb, aj_kb_f32(kb, scale), 8), "");
    aj_cv_store(kb, v, aj_cpu_tensor_at(kb, t, dtype, aj_kb_add(kb, row, aj_kb_sext64(kb, x))),
                dtype, 8);
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

static LLVMValueRef rows_from(cbwd *c, LLVMValueRef m0)
{
    return aj_kb_smin(c->kb, aj_kb_i32(c->kb, c->p.bm),
                      LLVMBuildSub(c->b, c->at.seq.len_q, m0, ""));
}

/* Kt and Vt of keys n0 .. n0 + kcount (the block's rest 0): floats, or
 * with tiles pairs of 16-bit elements (words) */
static void load_key_side(cbwd *c, const aj_cpu_rows *k_rows, const aj_cpu_rows *v_rows,
                          LLVMValueRef n0, LLVMValueRef kcount)
{
    const cbwd_plan *p = &c->p;
    int pairs = p->pairs, per_slot = pairs ? 2 : 1;
    aj_cpu_load_cols(c->kb, c->kt, p->d / per_slot, p->bn, AJ_PSRC_k, p->dtype, k_rows, n0,
                     kcount, pairs);
    aj_cpu_load_cols(c->kb, c->vt, p->dv / per_slot, p->bn, AJ_PSRC_v, p->dtype, v_rows, n0,
                     kcount, pairs);
}

/* p.pairs: C [m_end][n] (f32) = A B, or += with `acc`, over k: A's rows
 * 16-bit (k elements each), B in pairs of rows (words [k / 2][n]); on AMX
 * tiles, else by vdpbf16ps register tiles (cpu_attn.h) */
static void pairs_gemm(cbwd *c, LLVMValueRef cm, LLVMValueRef a, LLVMValueRef bmat, int n, int k,
                       LLVMValueRef m_end, int acc)
{
    if (c->p.amx)
        aj_cpu_amx_gemm(&c->amx, cm, a, k, bmat, n, k, m_end, acc);
    else if (acc)
        aj_cpu_gemm_acc(c->kb, n, cm, NULL, a, k / 2, 1, bmat, k, m_end, 1);
    else
        aj_cpu_gemm_nt(c->kb, c->p.w, cm, a, k / 2, bmat, n, m_end, 1);
}

/* S = Q Kt and dP = dO Vt of the block (in pairs, or f32 register tiles),
 * then P and dS from them (emit_probabilities) */
static void emit_block_products(cbwd *c, LLVMValueRef m0, LLVMValueRef n0)
{
    aj_kb *kb = c->kb;
    const cbwd_plan *p = &c->p;
    LLVMValueRef bm = aj_kb_i32(kb, p->bm);
    if (p->pairs) {
        pairs_gemm(c, c->s, c->q, c->kt, p->bn, p->d, bm, 0);
        pairs_gemm(c, c->dp, c->dob, c->vt, p->bn, p->dv, bm, 0);
    } else {
        aj_cpu_gemm_nt(kb, p->w, c->s, c->q, p->d, c->kt, p->bn, bm, 0);
        aj_cpu_gemm_nt(kb, p->w, c->dp, c->dob, p->dv, c->vt, p->bn, bm, 0);
    }
    emit_probabilities(c, m0, n0);
}

/* dq (an f32 tile [bm][D]) += dS K, the block's: in pairs with dS
 * rounded to the dtype's rows, else in f32 vectors.  Stage 1 and the fused
 * stage both add through this, so a dQ element gets the same terms in
 * the same order in either plan. */
static void dq_product(cbwd *c, LLVMValueRef dq)
{
    const cbwd_plan *p = &c->p;
    LLVMValueRef bm = aj_kb_i32(c->kb, p->bm);
    if (p->pairs) {
        aj_cpu_round_half(c->kb, c->dsa, c->dp, p->bm * p->bn, p->dtype);
        pairs_gemm(c, dq, c->dsa, c->kn, p->d, p->bn, bm, 1);
    } else {
        aj_cpu_gemm_acc(c->kb, p->d, dq, NULL, c->dp, p->bn, 1, c->kn, p->bn, bm, 0);
    }
}

/* Rows of slice (bidx, h) of tensor t from the sequence's first row. */
static aj_cpu_rows slice_rows(cbwd *c, aj_param_source t, LLVMValueRef bidx, LLVMValueRef h,
                              LLVMValueRef start)
{
    return (aj_cpu_rows){.base = aj_cpu_seq_base(c->kb, t, bidx, h, start),
                         .stride_s = aj_param_stride(c->kb, t, 2)};
}

/* The fused stage's dQ rows of (bidx, h) in the workspace (params.def,
 * CPU_BWD_FUSED), from the sequence's first row. */
static aj_cpu_rows dq_sums(cbwd *c, LLVMValueRef bidx, LLVMValueRef h, LLVMValueRef start)
{
    aj_kb *kb = c->kb;
    LLVMValueRef d = aj_kb_i64(kb, c->p.d);
    return (aj_cpu_rows){.base = aj_kb_add(kb, aj_param(kb, AJ_PID(ws_dq_offset)),
                                           aj_kb_mul(kb, aj_attn_ws_row(kb, bidx, h, start), d)),
                         .stride_s = d};
}

/* The fused stage's dQ rows m0 .. m0 + rows of head h += dS K, through
 * the dQ tile: the same product, on the same values, as stage 1's. */
static void fused_dq_tile(cbwd *c, LLVMValueRef bidx, LLVMValueRef h, LLVMValueRef m0,
                          LLVMValueRef rows)
{
    aj_kb *kb = c->kb;
    const cbwd_plan *p = &c->p;
    LLVMValueRef bm = aj_kb_i32(kb, p->bm);
    const aj_cpu_rows sums = dq_sums(c, bidx, h, c->at.seq.start_q);
    aj_cpu_load_rows(kb, c->fused_dq, p->d, AJ_PSRC_workspace, AJ_DTYPE_F32, &sums, m0, rows, bm,
                     1.0, 0);
    dq_product(c, c->fused_dq);
    store_rows(c, c->fused_dq, p->d, AJ_PSRC_workspace, &sums, m0, rows, 1.0);
}

/* K's rows for dQ += dS K: zipped in pairs, else floats */
static void load_key_rows(cbwd *c, const aj_cpu_rows *k_rows, LLVMValueRef n0,
                          LLVMValueRef kcount)
{
    aj_kb *kb = c->kb;
    const cbwd_plan *p = &c->p;
    if (p->pairs)
        aj_cpu_load_row_pairs(kb, c->kn, p->d, p->bn, AJ_PSRC_k, k_rows, n0, kcount);
    else
        aj_cpu_load_rows(kb, c->kn, p->d, AJ_PSRC_k, p->dtype, k_rows, n0, kcount,
                         aj_kb_i32(kb, p->bn), 1.0, 0);
}

/* dK and dV of key block n0 (< the sequence's length) of kv head hkv of
 * batch bidx, over the query heads of its group and the row blocks that
 * see it; in the fused stage each tile's dS K also goes into dQ. */
static void key_block(cbwd *c, LLVMValueRef bidx, LLVMValueRef hkv, LLVMValueRef n0,
                      const aj_cpu_seq *seq, LLVMValueRef dk, LLVMValueRef dv)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cbwd_plan *p = &c->p;
    LLVMValueRef kcount = aj_kb_smin(kb, aj_kb_i32(kb, p->bn), LLVMBuildSub(b, seq->len_k, n0, ""));
    LLVMValueRef n_last = LLVMBuildSub(b, aj_kb_add(kb, n0, kcount), aj_kb_i32(kb, 1), "");
    const aj_cpu_rows k_rows = slice_rows(c, AJ_PSRC_k, bidx, hkv, seq->start_k);
    const aj_cpu_rows v_rows = slice_rows(c, AJ_PSRC_v, bidx, hkv, seq->start_k);
    load_key_side(c, &k_rows, &v_rows, n0, kcount);
    if (c->fused_dq)
        load_key_rows(c, &k_rows, n0, kcount);
    aj_cpu_zero(kb, dk, p->bn * p->d);
    aj_cpu_zero(kb, dv, p->bn * p->dv);
    LLVMValueRef group =
        LLVMBuildSDiv(b, aj_param(kb, AJ_PID(heads_q)), aj_param(kb, AJ_PID(heads_kv)), "");
    LLVMValueRef g = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), group, aj_kb_i32(kb, 1), "g");
    {
        LLVMValueRef h = aj_kb_add(kb, aj_kb_mul(kb, hkv, group), g);
        set_head(c, bidx, h);
        LLVMValueRef m_begin, m_end;
        aj_cpu_row_blocks(&c->at, p->bm, n0, n_last, &m_begin, &m_end);
        LLVMValueRef bm = aj_kb_i32(kb, p->bm);
        /* the row blocks of the range, or the block mask's list of the key
         * block (score.h) */
        aj_score_walk walk;
        aj_score_walk_rows(&c->at.sc, &walk, n0, n_last, p->bm, m_begin, m_end, seq->len_q,
                           seq->len_k);
        LLVMValueRef at = aj_kb_for_begin(kb, walk.begin, walk.end, aj_kb_i32(kb, 1), "walk");
        {
            LLVMValueRef cls = NULL;
            LLVMValueRef m = aj_score_walk_tile(&c->at.sc, &walk, at,
                                                c->at.tile_full ? &cls : NULL);
            LLVMValueRef m0 = aj_kb_mul(kb, m, bm);
            LLVMValueRef rows = rows_from(c, m0);
            aj_cpu_skip_begin(&c->at, cls);
            load_query_side(c, bidx, h, m0, rows, 1);
            emit_block_products(c, m0, n0);
            if (p->pairs) {
                /* dV += (z P)^T dO and dK += dS^T Q with P^T and dS^T
                 * rounded to the dtype's rows */
                aj_cpu_transpose_half(kb, c->pt, c->s, p->bm, p->bn, p->dtype);
                aj_cpu_transpose_half(kb, c->dst, c->dp, p->bm, p->bn, p->dtype);
                LLVMValueRef bn = aj_kb_i32(kb, p->bn);
                pairs_gemm(c, dv, c->pt, c->doz, p->dv, p->bm, bn, 1);
                pairs_gemm(c, dk, c->dst, c->qz, p->d, p->bm, bn, 1);
            } else {
                /* dV += (z P)^T dO, dK += dS^T Q: P^T read with strides (1, bn) */
                aj_cpu_gemm_acc(kb, p->dv, dv, NULL, c->s, 1, p->bn, c->dob, p->bm,
                                aj_kb_i32(kb, p->bn), 0);
                aj_cpu_gemm_acc(kb, p->d, dk, NULL, c->dp, 1, p->bn, c->q, p->bm,
                                aj_kb_i32(kb, p->bn), 0);
            }
            if (c->fused_dq)
                fused_dq_tile(c, bidx, h, m0, rows);
            aj_cpu_skip_end(&c->at);
        }
        aj_kb_for_end(kb);
    }
    aj_kb_for_end(kb);
    /* in pairs Q was unscaled: dK takes the scale here */
    const aj_cpu_rows dk_rows = slice_rows(c, AJ_PSRC_dk, bidx, hkv, seq->start_k);
    const aj_cpu_rows dv_rows = slice_rows(c, AJ_PSRC_dv, bidx, hkv, seq->start_k);
    store_rows(c, dk, p->d, AJ_PSRC_dk, &dk_rows, n0, kcount, p->pairs ? aj_op_scale(c->op) : 1.0);
    store_rows(c, dv, p->dv, AJ_PSRC_dv, &dv_rows, n0, kcount, 1.0);
}

/* The buffers of stages 0 and 2: the common ones, the tiles' operands,
 * dK and dV of a key block into *dk, *dv. */
static void alloc_key_side(cbwd *c, LLVMValueRef *dk, LLVMValueRef *dv)
{
    aj_kb *kb = c->kb;
    const cbwd_plan *p = &c->p;
    alloc_buffers(c);
    if (p->pairs) {
        c->qz = aj_cv_buffer(kb, p->bm * p->d / 2, "qzbuf");
        c->doz = aj_cv_buffer(kb, p->bm * p->dv / 2, "dozbuf");
        c->pt = aj_cv_buffer(kb, p->bn * p->bm / 2, "ptbuf");
        c->dst = aj_cv_buffer(kb, p->bn * p->bm / 2, "dstbuf");
    }
    *dk = aj_cv_buffer(kb, p->bn * p->d, "dkbuf");
    *dv = aj_cv_buffer(kb, p->bn * p->dv, "dvbuf");
}

static void finish_stage(cbwd *c, aj_extent e0, int per0, aj_extent e1, aj_extent e2,
                         aj_stage_plan plan)
{
    const aj_kernel_layout layout = {
        .grid = {{e0, per0}, {e1, 1}, {e2, 1}},
        .schedule = {c->p.bm, c->p.bn, 1, 1},
        .plan = plan,
    };
    aj_kb_finish(c->kb, &layout);
}

/* stage 0: dK and dV of one key block of one kv head */
static void build_dkdv(cbwd *c)
{
    aj_kb *kb = c->kb;
    const cbwd_plan *p = &c->p;
    aj_params_declare(kb, AJ_KSIG_CPU_BWD_DKDV, c->op, c->prog);
    aj_kb_begin_stage(kb, "dkdv", 1);
    LLVMValueRef dk, dv;
    alloc_key_side(c, &dk, &dv);
    LLVMValueRef hkv = item(c, 1), bidx = item(c, 2);
    LLVMValueRef n0 = aj_kb_mul(kb, item(c, 0), aj_kb_i32(kb, p->bn));
    aj_cpu_seq seq;
    aj_cpu_seq_of(kb, c->op, c->prog, bidx, &seq);
    /* varlen: the grid covers the longest sequence; items past this one's
     * end have nothing to do */
    aj_kb_if_begin(kb, LLVMBuildICmp(c->b, LLVMIntSLT, n0, seq.len_k, ""));
    key_block(c, bidx, hkv, n0, &seq, dk, dv);
    aj_kb_if_end(kb);
    if (p->amx)
        aj_amx_release(&c->amx);
    finish_stage(c, AJ_EXTENT_SEQ_K, p->bn, AJ_EXTENT_HEADS_KV, AJ_EXTENT_BATCH,
                 aj_cpu_bwd_fuses(c->op, c->prog) ? AJ_STAGE_SPLIT : AJ_STAGE_EVERY);
}

/* For each query head of kv head hkv (group of them), its dQ rows in the
 * workspace: zeroed (`zero`), else stored to dq, scaled. */
static void fused_dq_rows(cbwd *c, LLVMValueRef bidx, LLVMValueRef hkv, LLVMValueRef group,
                          const aj_cpu_seq *seq, int zero)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cbwd_plan *p = &c->p;
    LLVMValueRef bm = aj_kb_i32(kb, p->bm);
    LLVMValueRef g = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), group, aj_kb_i32(kb, 1), "gq");
    LLVMValueRef h = aj_kb_add(kb, aj_kb_mul(kb, hkv, group), g);
    const aj_cpu_rows sums = dq_sums(c, bidx, h, seq->start_q);
    const aj_cpu_rows dq_rows = slice_rows(c, AJ_PSRC_dq, bidx, h, seq->start_q);
    LLVMValueRef m0 = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), seq->len_q, bm, "mq");
    LLVMValueRef rows = aj_kb_smin(kb, bm, LLVMBuildSub(b, seq->len_q, m0, ""));
    if (zero) {
        aj_cpu_zero(kb, c->fused_dq, p->bm * p->d);
        store_rows(c, c->fused_dq, p->d, AJ_PSRC_workspace, &sums, m0, rows, 1.0);
    } else {
        aj_cpu_load_rows(kb, c->fused_dq, p->d, AJ_PSRC_workspace, AJ_DTYPE_F32, &sums, m0, rows,
                         bm, 1.0, 0);
        store_rows(c, c->fused_dq, p->d, AJ_PSRC_dq, &dq_rows, m0, rows, aj_op_scale(c->op));
    }
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

/* stage 2, the fused plan: every key block of one kv head, and the dQ of
 * its query heads; an op without one keeps the stage (its parameters, no
 * work) */
static void build_fused(cbwd *c)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cbwd_plan *p = &c->p;
    aj_params_declare(kb, AJ_KSIG_CPU_BWD_FUSED, c->op, c->prog);
    aj_kb_begin_stage(kb, "fused", 1);
    if (!aj_cpu_bwd_fuses(c->op, c->prog)) {
        finish_stage(c, AJ_EXTENT_HEADS_KV, 1, AJ_EXTENT_BATCH, AJ_EXTENT_ONE, AJ_STAGE_UNUSED);
        return;
    }
    LLVMValueRef dk, dv;
    alloc_key_side(c, &dk, &dv);
    c->kn = aj_cv_buffer(kb, p->bn * p->d, "knbuf");
    if (p->pairs)
        c->dsa = aj_cv_buffer(kb, p->bm * p->bn / 2, "dsabuf");
    c->fused_dq = aj_cv_buffer(kb, p->bm * p->d, "dqbuf");
    LLVMValueRef hkv = item(c, 0), bidx = item(c, 1);
    aj_cpu_seq seq;
    aj_cpu_seq_of(kb, c->op, c->prog, bidx, &seq);
    LLVMValueRef group =
        LLVMBuildSDiv(b, aj_param(kb, AJ_PID(heads_q)), aj_param(kb, AJ_PID(heads_kv)), "");
    fused_dq_rows(c, bidx, hkv, group, &seq, 1);
    LLVMValueRef n0 =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), seq.len_k, aj_kb_i32(kb, p->bn), "keys");
    key_block(c, bidx, hkv, n0, &seq, dk, dv);
    aj_kb_for_end(kb);
    fused_dq_rows(c, bidx, hkv, group, &seq, 0);
    if (p->amx)
        aj_amx_release(&c->amx);
    c->fused_dq = NULL;
    finish_stage(c, AJ_EXTENT_HEADS_KV, 1, AJ_EXTENT_BATCH, AJ_EXTENT_ONE, AJ_STAGE_FUSED);
}

/* dbias rows m0.. and keys n0.. of pair (bidx, h) += dS (= on the first
 * pair) */
static void emit_dbias(cbwd *c, LLVMValueRef bidx, LLVMValueRef h, LLVMValueRef first,
                       LLVMValueRef m0, LLVMValueRef rows, LLVMValueRef n0, LLVMValueRef kcount)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    LLVMValueRef base = aj_attn_slice_base(kb, AJ_PSRC_dbias, bidx, h);
    LLVMValueRef i = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), rows, aj_kb_i32(kb, 1), "bi");
    LLVMValueRef row = aj_kb_add(kb, base,
                                 aj_kb_mul(kb, aj_kb_sext64(kb, aj_kb_add(kb, m0, i)),
                                           aj_param(kb, AJ_PID(stride_dbias_s))));
    LLVMValueRef j = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), kcount, aj_kb_i32(kb, 1), "bj");
    LLVMValueRef at = aj_cv_at(kb, kb->t_f32, aj_param(kb, AJ_PID(dbias)),
                               aj_kb_add(kb, row, aj_kb_sext64(kb, aj_kb_add(kb, n0, j))));
    LLVMValueRef ds =
        fload(c, buf_at(c, c->dp, aj_kb_add(kb, aj_kb_mul(kb, i, aj_kb_i32(kb, c->p.bn)), j)));
    /* the first pair writes: what the buffer held before is never read into
     * the sum (a select, not an add of 0 times it) */
    LLVMValueRef prior = LLVMBuildSelect(b, first, aj_kb_f32(kb, 0), fload(c, at), "");
    LLVMBuildStore(b, LLVMBuildFAdd(b, prior, ds, ""), at);
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

/* A dq item's (b, h) pair and row block, what its key-block steps read. */
typedef struct dq_pair {
    LLVMValueRef bidx, h, m0, rows;   /* i32 */
    LLVMValueRef pb, ph;              /* i32: the pair loops' indices (bias: pair 0 writes dbias) */
    aj_cpu_rows k_rows, v_rows;       /* the pair's kv head */
    LLVMValueRef dq;                  /* the dQ buffer */
} dq_pair;

/* The (b, h) pairs a dq item computes: its own, or with bias the pairs
 * folded onto its dbias slice if it owns the slice (else none): *pairs_b
 * x *pairs_h of them, *fold_b / *fold_h whether bias broadcasts over the
 * batch / heads (NULL without bias). */
static void dq_pairs(cbwd *c, LLVMValueRef b_item, LLVMValueRef h_item, LLVMValueRef *pairs_b,
                     LLVMValueRef *pairs_h, LLVMValueRef *fold_b, LLVMValueRef *fold_h)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    LLVMValueRef one = aj_kb_i32(kb, 1);
    *pairs_b = *pairs_h = one;
    *fold_b = *fold_h = NULL;
    if (c->op->bias != AJ_BIAS_ADD)
        return;
    *fold_b = LLVMBuildICmp(b, LLVMIntEQ, aj_param(kb, AJ_PID(bias_batch)), one, "");
    *fold_h = LLVMBuildICmp(b, LLVMIntEQ, aj_param(kb, AJ_PID(bias_heads)), one, "");
    LLVMValueRef owner =
        LLVMBuildAnd(b,
                     LLVMBuildOr(b, LLVMBuildNot(b, *fold_b, ""),
                                 LLVMBuildICmp(b, LLVMIntEQ, b_item, aj_kb_i32(kb, 0), ""), ""),
                     LLVMBuildOr(b, LLVMBuildNot(b, *fold_h, ""),
                                 LLVMBuildICmp(b, LLVMIntEQ, h_item, aj_kb_i32(kb, 0), ""), ""),
                     "owner");
    *pairs_b = LLVMBuildSelect(b, owner,
                               LLVMBuildSelect(b, *fold_b, aj_param(kb, AJ_PID(batch)), one, ""),
                               aj_kb_i32(kb, 0), "");
    *pairs_h = LLVMBuildSelect(b, *fold_h, aj_param(kb, AJ_PID(heads_q)), one, "");
}

/* The key block at walk position `at`: K (both ways) and V, S and dP,
 * P and dS, dQ += dS K and, with bias, dbias. */
static void dq_step(cbwd *c, const dq_pair *pr, const aj_score_walk *walk, LLVMValueRef at)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cbwd_plan *p = &c->p;
    int has_bias = c->op->bias == AJ_BIAS_ADD;
    LLVMValueRef cls = NULL;
    LLVMValueRef n = aj_score_walk_tile(&c->at.sc, walk, at,
                                        c->at.tile_full && !has_bias ? &cls : NULL);
    LLVMValueRef n0 = aj_kb_mul(kb, n, aj_kb_i32(kb, p->bn));
    LLVMValueRef kcount =
        aj_kb_smin(kb, aj_kb_i32(kb, p->bn), LLVMBuildSub(b, c->at.seq.len_k, n0, ""));
    if (!has_bias)
        aj_cpu_skip_begin(&c->at, cls);
    load_key_side(c, &pr->k_rows, &pr->v_rows, n0, kcount);
    load_key_rows(c, &pr->k_rows, n0, kcount);
    emit_block_products(c, pr->m0, n0);
    dq_product(c, pr->dq);
    if (has_bias)
        emit_dbias(c, pr->bidx, pr->h,
                   LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntEQ, pr->pb, aj_kb_i32(kb, 0), ""),
                                LLVMBuildICmp(b, LLVMIntEQ, pr->ph, aj_kb_i32(kb, 0), ""), ""),
                   pr->m0, pr->rows, n0, kcount);
    if (!has_bias)
        aj_cpu_skip_end(&c->at);
}

/* The pair's row block (inside the sequence): Q side, then the key blocks
 * of the range, or the block mask's list of the row block (score.h); with
 * bias every key block, so that dbias is written everywhere; dQ stored. */
static void dq_row_block(cbwd *c, dq_pair *pr)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cbwd_plan *p = &c->p;
    int has_bias = c->op->bias == AJ_BIAS_ADD;
    LLVMValueRef one = aj_kb_i32(kb, 1), m0 = pr->m0;
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSLT, m0, c->at.seq.len_q, ""));
    LLVMValueRef rows = pr->rows = rows_from(c, m0);
    LLVMValueRef hkv = LLVMBuildSDiv(b, pr->h,
                                     LLVMBuildSDiv(b, aj_param(kb, AJ_PID(heads_q)),
                                                   aj_param(kb, AJ_PID(heads_kv)), ""),
                                     "");
    load_query_side(c, pr->bidx, pr->h, m0, rows, 0);
    aj_cpu_zero(kb, pr->dq, p->bm * p->d);
    LLVMValueRef n_begin = aj_kb_i32(kb, 0), n_end;
    if (has_bias)
        n_end = LLVMBuildSDiv(b, aj_kb_add(kb, c->at.seq.len_k, aj_kb_i32(kb, p->bn - 1)),
                              aj_kb_i32(kb, p->bn), "");
    else
        aj_cpu_key_blocks(&c->at, p->bn, m0, aj_kb_add(kb, m0, LLVMBuildSub(b, rows, one, "")),
                          &n_begin, &n_end);
    pr->k_rows = slice_rows(c, AJ_PSRC_k, pr->bidx, hkv, c->at.seq.start_k);
    pr->v_rows = slice_rows(c, AJ_PSRC_v, pr->bidx, hkv, c->at.seq.start_k);
    aj_score_walk walk;
    aj_score_walk_keys(&c->at.sc, &walk, m0, aj_kb_add(kb, m0, LLVMBuildSub(b, rows, one, "")),
                       p->bn, n_begin, n_end, c->at.seq.len_q, c->at.seq.len_k);
    if (has_bias)
        aj_score_walk_every(&walk);
    LLVMValueRef at = aj_kb_for_begin(kb, walk.begin, walk.end, one, "walk");
    dq_step(c, pr, &walk, at);
    aj_kb_for_end(kb);
    const aj_cpu_rows dq_rows = slice_rows(c, AJ_PSRC_dq, pr->bidx, pr->h, c->at.seq.start_q);
    store_rows(c, pr->dq, p->d, AJ_PSRC_dq, &dq_rows, m0, rows, aj_op_scale(c->op));
    aj_kb_if_end(kb);
}

/* stage 1: dQ of one query block of one head (and dbias with bias) */
static void build_dq(cbwd *c)
{
    aj_kb *kb = c->kb;
    LLVMBuilderRef b = c->b;
    const cbwd_plan *p = &c->p;
    int has_bias = c->op->bias == AJ_BIAS_ADD;
    aj_params_declare(kb, AJ_KSIG_CPU_BWD_DQ, c->op, c->prog);
    aj_kb_begin_stage(kb, "dq", 1);
    alloc_buffers(c);
    c->kn = aj_cv_buffer(kb, p->bn * p->d, "knbuf");
    if (p->pairs)
        c->dsa = aj_cv_buffer(kb, p->bm * p->bn / 2, "dsabuf");
    dq_pair pr;
    pr.dq = aj_cv_buffer(kb, p->bm * p->d, "dqbuf");
    LLVMValueRef h_item = item(c, 1), b_item = item(c, 2);
    pr.m0 = aj_kb_mul(kb, item(c, 0), aj_kb_i32(kb, p->bm));
    if (c->prog->tensor_grad) {   /* the item's part: row block m of (b, h) */
        c->side_on = LLVMBuildIsNotNull(b, aj_param(kb, AJ_PID(dside_part)), "");
        c->side_part = aj_side_grad_part(kb, c->prog, b_item, h_item, item(c, 0),
                                         aj_kb_i32(kb, 0), 1, c->side_on, c->side_base);
    }
    LLVMValueRef one = aj_kb_i32(kb, 1);
    LLVMValueRef pairs_b, pairs_h, fold_b, fold_h;
    dq_pairs(c, b_item, h_item, &pairs_b, &pairs_h, &fold_b, &fold_h);
    pr.pb = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), pairs_b, one, "pb");
    pr.ph = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), pairs_h, one, "ph");
    pr.bidx = has_bias ? LLVMBuildSelect(b, fold_b, pr.pb, b_item, "") : b_item;
    pr.h = has_bias ? LLVMBuildSelect(b, fold_h, pr.ph, h_item, "") : h_item;
    set_head(c, pr.bidx, pr.h);
    dq_row_block(c, &pr);
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
    if (p->amx)
        aj_amx_release(&c->amx);
    finish_stage(c, AJ_EXTENT_SEQ_Q, p->bm, AJ_EXTENT_HEADS_Q, AJ_EXTENT_BATCH,
                 aj_cpu_bwd_fuses(c->op, c->prog) ? AJ_STAGE_SPLIT : AJ_STAGE_EVERY);
}

static aj_status cbwd_build(aj_kb *kb, const aj_op *op, void *user)
{
    cbwd c;
    memset(&c, 0, sizeof c);
    const aj_score_prog *prog;
    aj_status st = aj_kctx_plan_programs(kb, op, plan_kernel(kb->ctx, op, &c.p), &prog);
    if (st != AJ_OK)
        return st;
    aj_kctx_init(&c.k, kb, op, prog);
    build_dkdv(&c);
    build_dq(&c);
    build_fused(&c);
    aj_grad_tail_build(kb, op, prog);
    return kb->st;
}

AJ_TEMPLATE_BOTH_VARIANTS(aj_template_cpu_bwd, "cpu_bwd", AJ_KIND_BACKWARD, cbwd_check, cbwd_build,
                          .targets = 1u << AJ_TARGET_CPU,
                          .stage_sigs = {AJ_KSIG_CPU_BWD_DKDV, AJ_KSIG_CPU_BWD_DQ,
                                         AJ_KSIG_CPU_BWD_FUSED});
