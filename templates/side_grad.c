/*
 * side_grad.c -- the gradients of side tensors declared `grad` (docs/design.md
 * "Gradients of side tensors"), the last two stages of a backward kernel
 * whose op has them.
 *
 * Score s_ij = mod(t_ij) with t = scale q_i . k_j; a grad tensor's
 * elements reach s through the score_mod's loads of them (score_prog.c:
 * one derivative d mod / d load per such load).  With
 *
 *     dS_ij = P_ij (dP_ij - Delta_i),   P = exp(s - LSE),  dP = dO_i . v_j,
 *     Delta_i = dO_i . O_i
 *
 * (the gradient of the loss with respect to s), the element e of a grad
 * tensor gets
 *
 *     d loss / d x[e] = sum over (b, h, i, j) visible, and loads g reading
 *                       e at (i, j), of dS_ij (d mod / d load_g)(i, j).
 *
 * Many elements (i, j) share one e (rb[abs(q - k)], slopes[h]), so the sum
 * is made without atomics in two stages, in an order fixed by the shapes
 * alone, so the result is bitwise the same every run and for any thread
 * count:
 *
 *   "dside"      grid (parts, Hq, B): part m of head (b, h) covers rows
 *                [m N, m N + N) (N = dside_rows) and writes its own partial
 *                sums, dside_part_size elements (every grad tensor's, in
 *                declaration order, each row-major) at part index
 *                ((b Hq + h) parts + m).  The cpu has no such stage: its
 *                dq stage's item of row block m (cpu_bwd.c) is part m,
 *                adding the terms of the dS it has anyway, in (row, key
 *                vector, load, lane) order (aj_side_grad_add_lanes).
 *                GPU, sim: a CTA of T threads
 *                takes R rows by T keys at a time (R G <= 16 where the G
 *                loads allow); each thread computes its key's terms into
 *                shared memory, then thread t adds, in (row, g, key)
 *                order, the terms whose element e has e mod T = t: one
 *                thread per element, in a fixed order.
 *   "dside_sum"  grid (elements of one grad tensor / T): element e is the
 *                sum of the parts' e in part order, written to the
 *                caller's tensor (any strides).  Launched once per grad
 *                tensor asked for.
 *
 * The partial sums take parts x dside_part_size floats of the backward's
 * workspace; the launch chooses parts (runtime/launch.c) and refuses a
 * call whose sums would not fit.  With dropout dP_ij carries the
 * forward's keep mask, with a bias the program's bias leaf is the element
 * (the cpu's dq stage has both already); varlen: a part's rows are its
 * sequence's (b the sequence, rows and keys from cu_seqlens).
 */
#include <math.h>

#include "templates/attn_common.h"
#include "templates/cpu_attn.h"
#include "templates/grad_tail.h"
#include "templates/skeleton.h"

#define SIMT_THREADS 128
#define SUM_PER_ITEM 256  /* cpu: elements a work item of the sum stage adds */


/* The first element of each grad tensor in a part (i64), by the
 * tensors' declaration order, into base[t]; returns the part's size. */
static LLVMValueRef part_layout(aj_kb *kb, const aj_score_prog *p, LLVMValueRef *base)
{
    LLVMValueRef at = aj_kb_i64(kb, 0);
    for (int t = 0; t < p->tensor_count; t++) {
        base[t] = at;
        if (p->tensor_grad >> t & 1u)
            at = LLVMBuildAdd(kb->b, at, aj_score_tensor_numel(kb, &p->tensors[t]), "");
    }
    return at;
}

/* What the terms of one (i, j) need: the programs, the row's values. */
typedef struct side_grad {
    aj_kctx x;   /* builder, op, programs; the scores, dropout stream, bias slice at (b, h) */
    LLVMValueRef bidx, h, hk;        /* i64 */
    LLVMValueRef q_start, k_start;   /* i64: the sequence's first packed row (varlen), else 0 */
    LLVMValueRef base[AJ_OP_TENSORS_MAX + 1];
} side_grad;

/* The row offsets (elements, i64) of row i (i32) of tensor t in the
 * (b, head) slice: a query-side tensor's (q, o, dO; varlen: from the
 * sequence's first query row) or a key-side one's (k, v). */
static LLVMValueRef row_at(side_grad *g, aj_param_source t, LLVMValueRef head, LLVMValueRef i)
{
    LLVMBuilderRef b = g->x.kb->b;
    LLVMValueRef start = t == AJ_PSRC_k || t == AJ_PSRC_v ? g->k_start : g->q_start;
    LLVMValueRef row = LLVMBuildAdd(b, start, aj_kb_sext64(g->x.kb, i), "");
    return LLVMBuildAdd(b, aj_attn_slice_base(g->x.kb, t, g->bidx, head),
                        LLVMBuildMul(b, row, aj_param_stride_s(g->x.kb, t), ""), "");
}

/* Delta_i = dO_i . O_i and LSE_i (natural log) of row i. */
static void row_values(side_grad *g, LLVMValueRef i, LLVMValueRef *delta, LLVMValueRef *lse)
{
    aj_kb *kb = g->x.kb;
    *delta = aj_tail_row_dot(kb, AJ_PSRC_do, row_at(g, AJ_PSRC_do, g->h, i), AJ_PSRC_o,
                             row_at(g, AJ_PSRC_o, g->h, i), aj_op_dv(g->x.op), g->x.op->dtype);
    *lse = aj_tail_load(kb, AJ_PSRC_lse, AJ_DTYPE_F32,
                        LLVMBuildAdd(kb->b, aj_attn_slice_base(kb, AJ_PSRC_lse, g->bidx, g->h),
                                     LLVMBuildAdd(kb->b, g->q_start, aj_kb_sext64(kb, i), ""),
                                     ""));
}

/* The terms of visible (i, j): val[k] the gradient term of grad load k,
 * at[k] its element in the part (i64), -1 where it has none. */
static void terms(side_grad *g, LLVMValueRef i, LLVMValueRef j, LLVMValueRef delta,
                  LLVMValueRef lse, LLVMValueRef *val, LLVMValueRef *at)
{
    aj_kb *kb = g->x.kb;
    LLVMBuilderRef b = kb->b;
    const aj_op *op = g->x.op;
    const aj_score_prog *prog = g->x.prog;
    LLVMValueRef qi = row_at(g, AJ_PSRC_q, g->h, i), do_i = row_at(g, AJ_PSRC_do, g->h, i);
    LLVMValueRef qk = aj_tail_row_dot(kb, AJ_PSRC_q, qi, AJ_PSRC_k, row_at(g, AJ_PSRC_k, g->hk, j),
                                      op->head_dim, op->dtype);
    LLVMValueRef dp = aj_tail_row_dot(kb, AJ_PSRC_do, do_i, AJ_PSRC_v,
                                      row_at(g, AJ_PSRC_v, g->hk, j), aj_op_dv(op), op->dtype);
    if (op->dropout > 0)   /* dP_ij = m_ij dO_i . v_j, the forward's keep mask m */
        dp = aj_score_dropped(kb, op->dropout,
                              aj_attn_dropout_keep(kb, &g->x.drop, op->dropout, i, j), dp);
    LLVMValueRef t = LLVMBuildFMul(b, qk, aj_kb_f32(kb, prog->scale), "t");
    aj_score_bias bias = {aj_kctx_bias_at(&g->x, i, j), NULL, NULL};
    LLVMValueRef d[AJ_SCORE_GRADS_MAX], e[AJ_SCORE_GRADS_MAX];
    LLVMValueRef s = aj_score_mod_side_grads(&g->x.sc, t, bias.value ? &bias : NULL, i, j, d, e);
    LLVMValueRef p = aj_tail_exp(kb, LLVMBuildFSub(b, s, lse, ""));
    LLVMValueRef ds = LLVMBuildFMul(b, p, LLVMBuildFSub(b, dp, delta, ""), "ds");
    for (int k = 0; k < prog->num_grads; k++) {
        int tensor = prog->e.nodes[prog->grads[k].load].u.tensor;
        val[k] = LLVMBuildFMul(b, ds, d[k], "");
        at[k] = LLVMBuildSelect(b, LLVMBuildICmp(b, LLVMIntSLT, e[k], aj_kb_i64(kb, 0), ""),
                                aj_kb_i64(kb, -1), LLVMBuildAdd(b, g->base[tensor], e[k], ""),
                                "");
    }
}

/* part[at] += v (f32; at i64 elements) */
static void add_to(aj_kb *kb, LLVMValueRef part, LLVMValueRef at, LLVMValueRef v)
{
    LLVMValueRef ptr = aj_kb_gptr_offset(kb, part, LLVMBuildShl(kb->b, at, aj_kb_i64(kb, 2), ""));
    aj_kb_store(kb, LLVMBuildFAdd(kb->b, aj_kb_load(kb, kb->t_f32, ptr, 4), v, ""), ptr, 4);
}

/* The 4-byte word `index` (i32) of the shared-memory array at `base`. */
static LLVMValueRef word_at(aj_kb *kb, int32_t base, LLVMValueRef index)
{
    return aj_kb_smem_ptr(kb, LLVMBuildAdd(kb->b, aj_kb_i32(kb, base),
                                           LLVMBuildShl(kb->b, index, aj_kb_i32(kb, 2), ""), ""));
}

/* GPU, sim: R rows x T keys per step, terms through shared memory, each
 * element added by its one owner thread in (row, load, key) order. */
static void parts_simt(side_grad *g, LLVMValueRef part, LLVMValueRef tid, LLVMValueRef r0,
                       LLVMValueRef r1, LLVMValueRef seq_k)
{
    aj_kb *kb = g->x.kb;
    LLVMBuilderRef b = kb->b;
    /* rows per step: R G <= 16 where G allows, so a step's terms take
     * 8 max(16, G) T bytes (32 KiB at most) */
    const int T = SIMT_THREADS, G = g->x.prog->num_grads;
    const int R = G >= 16 ? 1 : 16 / G > 8 ? 8 : 16 / G;
    const int slots = R * G * T;
    /* per slot (r, k, t) = (r G + k) T + t: the term and its element;
     * per row of the step: Delta and LSE */
    int32_t vals = aj_kb_smem_reserve(kb, 4 * slots), ats = aj_kb_smem_reserve(kb, 4 * slots);
    int32_t rows = aj_kb_smem_reserve(kb, 8 * R);
    LLVMValueRef i0 = aj_kb_for_begin(kb, r0, r1, aj_kb_i32(kb, R), "i0");
    LLVMValueRef last = aj_kb_smin(kb, LLVMBuildAdd(b, i0, aj_kb_i32(kb, R - 1), ""),
                                   LLVMBuildSub(b, r1, aj_kb_i32(kb, 1), ""));
    /* the step's rows' Delta and LSE, one thread each */
    LLVMValueRef mine_row = LLVMBuildAdd(b, i0, tid, "");
    aj_kb_if_begin(kb, LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntULT, tid, aj_kb_i32(kb, R), ""),
                                    LLVMBuildICmp(b, LLVMIntSLE, mine_row, last, ""), ""));
    LLVMValueRef delta, lse;
    row_values(g, mine_row, &delta, &lse);
    LLVMValueRef pair = LLVMBuildShl(b, tid, aj_kb_i32(kb, 1), "");
    aj_kb_store(kb, delta, word_at(kb, rows, pair), 4);
    aj_kb_store(kb, lse, word_at(kb, rows, LLVMBuildAdd(b, pair, aj_kb_i32(kb, 1), "")), 4);
    aj_kb_if_end(kb);
    aj_kb_barrier(kb);
    LLVMValueRef jlo, jhi;
    aj_score_key_range(&g->x.sc, i0, last, seq_k, &jlo, &jhi);
    LLVMValueRef j0 = aj_kb_for_begin(kb, jlo, LLVMBuildAdd(b, jhi, aj_kb_i32(kb, 1), ""),
                                      aj_kb_i32(kb, T), "j0");
    {
        /* each thread its key's terms, row by row */
        LLVMValueRef j = LLVMBuildAdd(b, j0, tid, "j");
        LLVMValueRef r = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, R),
                                         aj_kb_i32(kb, 1), "r");
        LLVMValueRef i = LLVMBuildAdd(b, i0, r, "i");
        LLVMValueRef slot[AJ_SCORE_GRADS_MAX];
        for (int k = 0; k < G; k++) {   /* none unless computed below */
            slot[k] = LLVMBuildAdd(b, LLVMBuildMul(b, r, aj_kb_i32(kb, G * T), ""),
                                   LLVMBuildAdd(b, tid, aj_kb_i32(kb, k * T), ""), "");
            aj_kb_store(kb, aj_kb_i32(kb, -1), word_at(kb, ats, slot[k]), 4);
        }
        aj_kb_if_begin(kb, LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSLE, i, last, ""),
                                        LLVMBuildICmp(b, LLVMIntSLE, j, jhi, ""), ""));
        LLVMValueRef pr = LLVMBuildShl(b, r, aj_kb_i32(kb, 1), "");
        LLVMValueRef row_delta = aj_kb_load(kb, kb->t_f32, word_at(kb, rows, pr), 4);
        LLVMValueRef row_lse = aj_kb_load(
            kb, kb->t_f32, word_at(kb, rows, LLVMBuildAdd(b, pr, aj_kb_i32(kb, 1), "")), 4);
        aj_kb_if_begin(kb, LLVMBuildAnd(b, aj_score_visible(&g->x.sc, i, j),
                                        LLVMBuildFCmp(b, LLVMRealONE, row_lse,
                                                      aj_kb_f32(kb, -INFINITY), ""), ""));
        LLVMValueRef val[AJ_SCORE_GRADS_MAX], at[AJ_SCORE_GRADS_MAX];
        terms(g, i, j, row_delta, row_lse, val, at);
        for (int k = 0; k < G; k++) {
            aj_kb_store(kb, val[k], word_at(kb, vals, slot[k]), 4);
            aj_kb_store(kb, LLVMBuildTrunc(b, at[k], kb->t_i32, ""), word_at(kb, ats, slot[k]),
                        4);
        }
        aj_kb_if_end(kb);
        aj_kb_if_end(kb);
        aj_kb_for_end(kb);
        aj_kb_barrier(kb);
        /* each element's terms, added by its owner in slot order */
        LLVMValueRef x = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, slots),
                                         aj_kb_i32(kb, 1), "x");
        LLVMValueRef e = aj_kb_load(kb, kb->t_i32, word_at(kb, ats, x), 4);
        LLVMValueRef owner = LLVMBuildAnd(b, e, aj_kb_i32(kb, T - 1), "");
        aj_kb_if_begin(kb, LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntSGE, e, aj_kb_i32(kb, 0), ""),
                                        LLVMBuildICmp(b, LLVMIntEQ, owner, tid, ""), ""));
        add_to(kb, part, aj_kb_sext64(kb, e), aj_kb_load(kb, kb->t_f32, word_at(kb, vals, x), 4));
        aj_kb_if_end(kb);
        aj_kb_for_end(kb);
        aj_kb_barrier(kb);
    }
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

LLVMValueRef aj_side_grad_part(aj_kb *kb, const aj_score_prog *p, LLVMValueRef bidx,
                               LLVMValueRef h, LLVMValueRef m, LLVMValueRef tid, int threads,
                               LLVMValueRef on, LLVMValueRef *base)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef size = part_layout(kb, p, base);
    LLVMValueRef hq = aj_kb_sext64(kb, aj_param(kb, AJ_PID(heads_q)));
    LLVMValueRef parts = aj_kb_sext64(kb, aj_param(kb, AJ_PID(dside_parts)));
    LLVMValueRef index = LLVMBuildAdd(
        b, LLVMBuildMul(b, LLVMBuildAdd(b, LLVMBuildMul(b, aj_kb_sext64(kb, bidx), hq, ""),
                                        aj_kb_sext64(kb, h), ""), parts, ""),
        aj_kb_sext64(kb, m), "part");
    LLVMValueRef part = aj_kb_gptr_offset(
        kb, aj_param(kb, AJ_PID(dside_part)),
        LLVMBuildShl(b, LLVMBuildMul(b, index, aj_param(kb, AJ_PID(dside_part_size)), ""),
                     aj_kb_i64(kb, 2), ""));
    /* the part starts at 0 */
    LLVMValueRef end = on ? LLVMBuildSelect(b, on, size, aj_kb_i64(kb, 0), "") : size;
    LLVMValueRef e = aj_kb_for_begin(kb, aj_kb_sext64(kb, tid), end, aj_kb_i64(kb, threads), "e");
    aj_kb_store(kb, aj_kb_f32(kb, 0),
                aj_kb_gptr_offset(kb, part, LLVMBuildShl(b, e, aj_kb_i64(kb, 2), "")), 4);
    aj_kb_for_end(kb);
    return part;
}

void aj_side_grad_add_lanes(aj_score *s, const LLVMValueRef *base, LLVMValueRef part,
                            LLVMValueRef t, const aj_score_bias *bias, LLVMValueRef ds,
                            LLVMValueRef live, LLVMValueRef i, LLVMValueRef jv)
{
    aj_kb *kb = s->kb;
    LLVMBuilderRef b = kb->b;
    const aj_score_prog *p = s->p;
    const int w = s->lanes;
    LLVMValueRef d[AJ_SCORE_GRADS_MAX], e[AJ_SCORE_GRADS_MAX];
    aj_score_mod_side_grads(s, t, bias, i, jv, d, e);
    LLVMValueRef vals = aj_cv_buffer(kb, w * p->num_grads, "dside_val");
    LLVMValueRef ats = aj_kb_var(kb, LLVMArrayType(kb->t_i64, (unsigned)(w * p->num_grads)), NULL,
                                 "dside_at");
    for (int k = 0; k < p->num_grads; k++) {
        int tensor = p->e.nodes[p->grads[k].load].u.tensor;
        LLVMValueRef none = aj_cv_splat(kb, aj_kb_i64(kb, -1), w);
        /* hidden lanes and elements outside the tensor add nothing */
        LLVMValueRef keep = LLVMBuildAnd(
            b, live, LLVMBuildICmp(b, LLVMIntSGE, e[k], aj_cv_splat(kb, aj_kb_i64(kb, 0), w), ""),
            "");
        LLVMValueRef term = LLVMBuildFMul(b, ds, d[k], "");
        LLVMValueRef slot = aj_kb_i32(kb, k * w);
        if (!(p->reads[p->grads[k].load] & AJ_SCORE_READS_KEY)) {
            /* one element for every lane (slopes[h], rb[q % 7]): the lanes'
             * terms summed in a fixed tree (a hidden lane's is -0, which
             * adds nothing), then one add -- not w adds to one place */
            LLVMValueRef sum = aj_cv_hsum(
                kb, LLVMBuildSelect(b, keep, term, aj_cv_splat(kb, aj_kb_f32(kb, -0.0), w), ""),
                w);
            LLVMValueRef e0 = LLVMBuildExtractElement(b, e[k], aj_kb_i32(kb, 0), "");
            aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSGE, e0, aj_kb_i64(kb, 0), ""));
            add_to(kb, part, LLVMBuildAdd(b, e0, base[tensor], ""), sum);
            aj_kb_if_end(kb);
            LLVMBuildStore(b, none, aj_cv_at(kb, kb->t_i64, ats, slot));
            continue;
        }
        LLVMValueRef at = LLVMBuildSelect(
            b, keep, LLVMBuildAdd(b, e[k], aj_cv_splat(kb, base[tensor], w), ""), none, "");
        aj_cv_store(kb, term, aj_cv_at(kb, kb->t_f32, vals, slot), AJ_DTYPE_F32, w);
        LLVMBuildStore(b, at, aj_cv_at(kb, kb->t_i64, ats, slot));
    }
    /* lane by lane, in (load, key) order */
    LLVMValueRef x = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, w * p->num_grads),
                                     aj_kb_i32(kb, 1), "x");
    LLVMValueRef at = LLVMBuildLoad2(b, kb->t_i64, aj_cv_at(kb, kb->t_i64, ats, x), "");
    aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntSGE, at, aj_kb_i64(kb, 0), ""));
    add_to(kb, part, at, LLVMBuildLoad2(b, kb->t_f32, aj_cv_at(kb, kb->t_f32, vals, x), ""));
    aj_kb_if_end(kb);
    aj_kb_for_end(kb);
}

/* Stage "dside" (GPU targets, sim): the partial sums of part (m, h, b). */
static void build_parts(aj_kb *kb, const aj_op *op, const aj_score_prog *p)
{
    LLVMBuilderRef b = kb->b;
    aj_params_declare(kb, AJ_KSIG_SIDE_GRAD, op, p);
    aj_kb_begin_stage(kb, "dside", SIMT_THREADS);
    side_grad g = {0};
    aj_kctx_init(&g.x, kb, op, p);
    LLVMValueRef tid = aj_kb_thread_id(kb);
    LLVMValueRef m = aj_kb_item_id(kb, 0);
    g.h = aj_kb_sext64(kb, aj_kb_item_id(kb, 1));
    g.bidx = aj_kb_sext64(kb, aj_kb_item_id(kb, 2));
    LLVMValueRef hq = aj_kb_sext64(kb, aj_param(kb, AJ_PID(heads_q)));
    LLVMValueRef hkv = aj_kb_sext64(kb, aj_param(kb, AJ_PID(heads_kv)));
    g.hk = LLVMBuildSDiv(b, g.h, LLVMBuildSDiv(b, hq, hkv, ""), "hk");
    LLVMValueRef part = aj_side_grad_part(kb, p, g.bidx, g.h, m, tid, SIMT_THREADS, NULL,
                                          g.base);
    aj_kb_barrier(kb);
    /* the batch's lengths, or the sequence's (varlen: rows from cu_seqlens) */
    aj_kctx_sequence(&g.x, aj_kb_item_id(kb, 2), &g.q_start, &g.k_start);
    if (p->num_grads > 0) {
        LLVMValueRef sq, sk;
        aj_attn_score_totals(kb, p, op->layout, g.x.seq_q, g.x.seq_k, &sq, &sk);
        aj_kctx_set_head(&g.x, aj_kb_item_id(kb, 2), aj_kb_item_id(kb, 1), sq, sk);
        LLVMValueRef rows = aj_param(kb, AJ_PID(dside_rows));
        LLVMValueRef r0 = LLVMBuildMul(b, m, rows, "r0");
        LLVMValueRef r1 = aj_kb_smin(kb, LLVMBuildAdd(b, r0, rows, ""), g.x.seq_q);
        parts_simt(&g, part, tid, r0, r1, g.x.seq_k);
    }
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_DSIDE_PARTS, 1}, {AJ_EXTENT_HEADS_Q, 1}, {AJ_EXTENT_BATCH, 1}},
        .schedule = {1, SIMT_THREADS, SIMT_THREADS / 32, 1},
    };
    aj_kb_finish(kb, &layout);
}

/* Stage "dside_sum": element e of one grad tensor, the parts' sum in
 * part order, into the caller's tensor. */
static void build_sum(aj_kb *kb, const aj_op *op, const aj_score_prog *p)
{
    LLVMBuilderRef b = kb->b;
    const int simt = kb->desc->simt;
    const int threads = simt ? SIMT_THREADS : 1, per_item = simt ? SIMT_THREADS : SUM_PER_ITEM;
    aj_params_declare(kb, AJ_KSIG_SIDE_GRAD_SUM, op, p);
    aj_kb_begin_stage(kb, "dside_sum", threads);
    LLVMValueRef size[4] = {aj_param(kb, AJ_PID(size_dside_0)), aj_param(kb, AJ_PID(size_dside_1)),
                            aj_param(kb, AJ_PID(size_dside_2)), aj_param(kb, AJ_PID(size_dside_3))};
    LLVMValueRef stride[4] = {
        aj_param(kb, AJ_PID(stride_dside_0)), aj_param(kb, AJ_PID(stride_dside_1)),
        aj_param(kb, AJ_PID(stride_dside_2)), aj_param(kb, AJ_PID(stride_dside_3))};
    LLVMValueRef numel = LLVMBuildMul(b, LLVMBuildMul(b, size[0], size[1], ""),
                                      LLVMBuildMul(b, size[2], size[3], ""), "numel");
    LLVMValueRef first = LLVMBuildMul(b, aj_kb_sext64(kb, aj_kb_item_id(kb, 0)),
                                      aj_kb_i64(kb, per_item), "");
    LLVMValueRef begin = simt ? LLVMBuildAdd(b, first, aj_kb_sext64(kb, aj_kb_thread_id(kb)), "")
                              : first;
    LLVMValueRef end = aj_kb_smin(kb, LLVMBuildAdd(b, first, aj_kb_i64(kb, per_item), ""), numel);
    LLVMValueRef psize = aj_param(kb, AJ_PID(dside_part_size));
    LLVMValueRef from = aj_kb_gptr_offset(
        kb, aj_param(kb, AJ_PID(dside_part)),
        LLVMBuildShl(b, aj_param(kb, AJ_PID(dside_base)), aj_kb_i64(kb, 2), ""));
    LLVMValueRef e = aj_kb_for_begin(kb, begin, end, aj_kb_i64(kb, threads), "e");
    {
        LLVMValueRef acc = aj_kb_var(kb, kb->t_f32, aj_kb_f32(kb, 0), "acc");
        LLVMValueRef c = aj_kb_for_begin(kb, aj_kb_i64(kb, 0),
                                         aj_param(kb, AJ_PID(dside_parts_total)),
                                         aj_kb_i64(kb, 1), "c");
        LLVMValueRef at = LLVMBuildAdd(b, LLVMBuildMul(b, c, psize, ""), e, "");
        LLVMValueRef ptr = aj_kb_gptr_offset(kb, from, LLVMBuildShl(b, at, aj_kb_i64(kb, 2), ""));
        aj_kb_set(kb, acc, LLVMBuildFAdd(b, aj_kb_get(kb, acc),
                                         aj_kb_load(kb, kb->t_f32, ptr, 4), ""));
        aj_kb_for_end(kb);
        /* e row-major over the four dims, to the caller's strides */
        LLVMValueRef rest = e, out = aj_kb_i64(kb, 0);
        for (int d = 3; d >= 0; d--) {
            LLVMValueRef x = LLVMBuildSRem(b, rest, size[d], "");
            rest = LLVMBuildSDiv(b, rest, size[d], "");
            out = LLVMBuildAdd(b, out, LLVMBuildMul(b, x, stride[d], ""), "");
        }
        aj_kb_store(kb, aj_kb_get(kb, acc),
                    aj_kb_gptr_offset(kb, aj_param(kb, AJ_PID(dside)),
                                      LLVMBuildShl(b, out, aj_kb_i64(kb, 2), "")), 4);
    }
    aj_kb_for_end(kb);
    const aj_kernel_layout layout = {
        .grid = {{AJ_EXTENT_DSIDE_ELEMENTS, per_item}, {AJ_EXTENT_ONE, 1}, {AJ_EXTENT_ONE, 1}},
        .schedule = {1, per_item, simt ? threads / 32 : 1, 1},
    };
    aj_kb_finish(kb, &layout);
}

void aj_side_grad_build(aj_kb *kb, const aj_op *op, const aj_score_prog *prog)
{
    if (kb->desc->simt)   /* the cpu's parts are its dq stage's */
        build_parts(kb, op, prog);
    if (kb->st == AJ_OK)
        build_sum(kb, op, prog);
}
