/*
 * cpu_attn.c -- tiles shared by the cpu kernels (cpu_attn.h).
 */
#include "templates/cpu_attn.h"

#include <math.h>
#include <stdio.h>

#define CN AJ_CPU_CN

LLVMValueRef aj_cpu_vload(aj_kb *kb, LLVMValueRef ptr, int n)
{
    LLVMValueRef v = LLVMBuildLoad2(kb->b, aj_cv_type(kb, n), ptr, "");
    LLVMSetAlignment(v, 4);
    return v;
}

void aj_cpu_vstore(aj_kb *kb, LLVMValueRef v, LLVMValueRef ptr)
{
    LLVMSetAlignment(LLVMBuildStore(kb->b, v, ptr), 4);
}

LLVMValueRef aj_cpu_fload(aj_kb *kb, LLVMValueRef ptr)
{
    return LLVMBuildLoad2(kb->b, kb->t_f32, ptr, "");
}

/* shufflevector of two <8 x float> by an 8-entry mask */
static LLVMValueRef shuffle8(aj_kb *kb, LLVMValueRef x, LLVMValueRef y, const int m[8])
{
    LLVMValueRef mask[8];
    for (int i = 0; i < 8; i++)
        mask[i] = aj_kb_i32(kb, m[i]);
    return LLVMBuildShuffleVector(kb->b, x, y, LLVMConstVector(mask, 8), "");
}

bool aj_cpu_bwd_fuses(const aj_op *op, const aj_score_prog *prog)
{
    return op->bias != AJ_BIAS_ADD && !prog->tensor_grad;
}

aj_status aj_cpu_check_op(aj_ctx *ctx, const aj_op *op, const char *who)
{
    if (op->layout == AJ_LAYOUT_VARLEN && op->bias == AJ_BIAS_ADD)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "bias = add with layout = varlen: %s supports "
                       "a bias on layout = padded only", who);
    aj_status st = aj_attn_check_dims(ctx, op, who, AJ_HEAD_DIM_MAX_CPU);
    return st != AJ_OK ? st : aj_score_prog_check(ctx, op);
}

aj_status aj_cpu_plan_tiles(aj_ctx *ctx, const aj_op *op, const char *who, int w, int default_bm,
                            int *bm, int *bn)
{
    const aj_schedule *s = &op->schedule;
    if (s->warps != 0 || s->stages != 0)
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "schedule %s = %d: the cpu target has no "
                       "warps or pipeline stages (leave them unset)",
                       s->warps ? "warps" : "stages", s->warps ? s->warps : s->stages);
    /* the verifier allows powers of two 16..256: multiples of RM, each */
    *bm = s->block_m ? s->block_m : default_bm;
    *bn = s->block_n ? s->block_n : 64 > CN * w ? 64 : CN * w;
    if (*bn % (CN * w))
        return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "schedule block_n = %d: the %s needs a "
                       "multiple of %d on this host (%d-float vectors)", *bn, who, CN * w, w);
    return AJ_OK;
}

bool aj_cpu_products(const aj_op *op, aj_dtype dtype, bool pairs, bool amx_fits,
                     int default_bm, int default_bn, aj_amx_mode *amx, int *bm, int *bn)
{
    if (amx_fits)
        *amx = aj_cpu_amx_mode(dtype, NULL, 0);   /* off but for bf16 and f16 */
    if (*amx != AJ_AMX_OFF) {
        *bm = op->schedule.block_m ? *bm : default_bm;
        *bn = op->schedule.block_n ? *bn : default_bn;
    }
    return pairs && (*amx != AJ_AMX_OFF || (dtype == AJ_DTYPE_BF16 && aj_cpu_bf16_pairs()));
}

void aj_cpu_seq_of(aj_kb *kb, const aj_op *op, const aj_score_prog *prog, LLVMValueRef bidx,
                   aj_cpu_seq *s)
{
    LLVMBuilderRef b = kb->b;
    s->sq = s->sk = NULL;
    if (op->layout == AJ_LAYOUT_PAGED) {
        /* the queries are the last of the sequence's positions; both
         * totals are its length.  Varlen queries: the sequence's chunk of
         * the packed rows (seq_q: the longest chunk) */
        s->len_q = aj_param(kb, AJ_PID(seq_q));
        s->len_k = aj_attn_paged_len(kb, bidx);
        s->start_q = s->start_k = aj_kb_i64(kb, 0);
        if (op->q_layout == AJ_LAYOUT_VARLEN)
            aj_attn_paged_queries(kb, bidx, s->len_k, s->len_q, &s->start_q, &s->len_q);
        if (prog->reads_totals)
            s->sq = s->sk = aj_kb_sext64(kb, s->len_k);
        return;
    }
    if (op->layout != AJ_LAYOUT_VARLEN) {
        s->len_q = aj_param(kb, AJ_PID(seq_q));
        s->len_k = aj_param(kb, AJ_PID(seq_k));
        s->start_q = s->start_k = aj_kb_i64(kb, 0);
        if (prog->reads_totals) {
            s->sq = aj_param(kb, AJ_PID(seq_q_total));
            s->sk = aj_param(kb, AJ_PID(seq_k_total));
        }
        return;
    }
    aj_attn_varlen_seq seq;
    aj_attn_varlen_seq_of(kb, bidx, &seq);
    s->len_q = seq.len_q;
    s->len_k = seq.len_k;
    s->start_q = seq.start_q;
    s->start_k = seq.start_k;
    if (!prog->reads_totals)
        return;
    LLVMValueRef totals[2] = {aj_param(kb, AJ_PID(sq_total)), aj_param(kb, AJ_PID(sk_total))};
    LLVMValueRef own[2] = {aj_kb_sext64(kb, s->len_q), aj_kb_sext64(kb, s->len_k)};
    for (int x = 0; x < 2; x++) {
        LLVMValueRef zero = LLVMBuildICmp(b, LLVMIntEQ, totals[x], aj_kb_i64(kb, 0), "");
        totals[x] = LLVMBuildSelect(b, zero, own[x], totals[x], "");
    }
    s->sq = totals[0];
    s->sk = totals[1];
}

LLVMValueRef aj_cpu_seq_base(aj_kb *kb, aj_param_source t, LLVMValueRef bidx, LLVMValueRef h,
                             LLVMValueRef start)
{
    return LLVMBuildAdd(kb->b, aj_attn_slice_base(kb, t, bidx, h),
                        LLVMBuildMul(kb->b, start, aj_param_stride(kb, t, 2), ""), "");
}

void aj_cpu_attn_init(aj_cpu_attn *a, aj_kb *kb, const aj_op *op, const aj_score_prog *prog,
                      int log2e_in_q, LLVMValueRef bidx, LLVMValueRef h)
{
    a->kb = kb;
    a->op = op;
    a->prog = prog;
    a->w = aj_cpu_vector_width();
    a->log2e_in_q = log2e_in_q;
    aj_cpu_seq_of(kb, op, prog, bidx, &a->seq);
    LLVMValueRef q_offset, kv_offset;
    if (op->layout == AJ_LAYOUT_PAGED) {
        q_offset = aj_kb_sext64(kb, LLVMBuildSub(kb->b, a->seq.len_k, a->seq.len_q, ""));
        kv_offset = aj_kb_i64(kb, 0);
    } else {
        q_offset = aj_param(kb, AJ_PID(q_offset));
        kv_offset = aj_param(kb, AJ_PID(kv_offset));
    }
    aj_score_begin(&a->sc, kb, prog, a->w, bidx, h, q_offset, kv_offset, a->seq.sq, a->seq.sk);
    a->tile_full = aj_score_has_mask(prog) ? aj_kb_var(kb, kb->t_i1, LLVMConstInt(kb->t_i1, 0, 0),
                                                       "tile_full")
                                           : NULL;
    a->bias_base = NULL;
    if (op->bias == AJ_BIAS_ADD)
        a->bias_base = aj_attn_slice_base(kb, AJ_PSRC_bias, bidx, h);
}

LLVMValueRef aj_cpu_buf_at(aj_kb *kb, LLVMValueRef buf, LLVMValueRef index)
{
    return aj_cv_at(kb, kb->t_f32, buf, index);
}

LLVMValueRef aj_cpu_tensor_at(aj_kb *kb, aj_param_source t, aj_dtype dtype, LLVMValueRef elem)
{
    return aj_cv_at(kb, aj_kb_storage_type(kb, dtype), aj_param_data(kb, t), elem);
}

/* 8 values of row `row` of tensor t from column 8 c: widened to <8 x
 * float>, or with pairs the raw words of bf16 columns 16 c .. 16 c + 15
 * (<8 x i32>) */
static LLVMValueRef load8(aj_kb *kb, aj_param_source t, aj_dtype dtype, int pairs, LLVMValueRef row,
                          LLVMValueRef c)
{
    if (!pairs)
        return aj_cv_load(
            kb, aj_cpu_tensor_at(kb, t, dtype, aj_kb_add(kb, row, aj_kb_sext64(kb, c))), dtype, 8);
    LLVMValueRef at = aj_cpu_tensor_at(kb, t, AJ_DTYPE_BF16,
                                       aj_kb_add(kb, row, aj_kb_sext64(kb, aj_kb_add(kb, c, c))));
    LLVMValueRef v = LLVMBuildLoad2(kb->b, LLVMVectorType(kb->t_i32, 8), at, "");
    LLVMSetAlignment(v, 2);
    return v;
}

/* The element offset of row in_page of the page in table slot `slot`. */
static LLVMValueRef paged_row(aj_kb *kb, const aj_cpu_rows *src, LLVMValueRef slot,
                              LLVMValueRef in_page)
{
    LLVMValueRef page = LLVMBuildLoad2(kb->b, kb->t_i32, aj_cv_at(kb, kb->t_i32, src->pages,
                                                                  slot), "page");
    return aj_kb_add(
        kb, aj_kb_add(kb, src->base, aj_kb_mul(kb, aj_kb_sext64(kb, page), src->stride_page)),
        aj_kb_mul(kb, aj_kb_sext64(kb, in_page), src->stride_s));
}

LLVMValueRef aj_cpu_row_at(aj_kb *kb, const aj_cpu_rows *src, LLVMValueRef p)
{
    LLVMBuilderRef b = kb->b;
    if (src->per_head) {
        aj_cpu_rows one = *src;
        LLVMValueRef head = LLVMBuildUDiv(b, p, src->per_head, "");
        one.per_head = NULL;
        one.base = aj_kb_add(kb, src->base, aj_kb_mul(kb, aj_kb_sext64(kb, head), src->stride_h));
        return aj_cpu_row_at(kb, &one, LLVMBuildURem(b, p, src->per_head, ""));
    }
    if (!src->pages)
        return aj_kb_add(kb, src->base, aj_kb_mul(kb, aj_kb_sext64(kb, p), src->stride_s));
    return paged_row(kb, src, LLVMBuildUDiv(b, p, src->page_size, ""),
                     LLVMBuildURem(b, p, src->page_size, ""));
}

/*
 * Consecutive rows p, p + 1, ... of src without a division per row: the
 * walk divides once, at its start, then steps (slot, in_page) by one row
 * (in_page + 1, wrapping to the next slot at page_size), so a tile of a
 * paged cache costs one division, not one per key.  Rows of a padded
 * tensor or of packed heads take aj_cpu_row_at (no page division).
 */
typedef struct row_walk {
    const aj_cpu_rows *src;
    LLVMValueRef slot, in_page;   /* i32: the current row's (paged only) */
    LLVMValueRef p;               /* i32: the current row (others) */
} row_walk;

static row_walk walk_begin(aj_kb *kb, const aj_cpu_rows *src, LLVMValueRef p)
{
    row_walk w = {src, NULL, NULL, p};
    if (src->pages && !src->per_head) {
        w.slot = LLVMBuildUDiv(kb->b, p, src->page_size, "slot");
        w.in_page = LLVMBuildURem(kb->b, p, src->page_size, "in_page");
    }
    return w;
}

static LLVMValueRef walk_row(aj_kb *kb, const row_walk *w)
{
    return w->slot ? paged_row(kb, w->src, w->slot, w->in_page) : aj_cpu_row_at(kb, w->src, w->p);
}

static void walk_next(aj_kb *kb, row_walk *w)
{
    LLVMBuilderRef b = kb->b;
    w->p = aj_kb_add(kb, w->p, aj_kb_i32(kb, 1));
    if (!w->slot)
        return;
    LLVMValueRef next = aj_kb_add(kb, w->in_page, aj_kb_i32(kb, 1));
    LLVMValueRef wrap = LLVMBuildICmp(b, LLVMIntEQ, next, w->src->page_size, "wrap");
    w->slot = aj_kb_add(kb, w->slot, LLVMBuildZExt(b, wrap, kb->t_i32, ""));
    w->in_page = LLVMBuildSelect(b, wrap, aj_kb_i32(kb, 0), next, "");
}

/* A walk whose position lives in variables across a row loop:
 * walk_vars_begin before the loop, then walk_vars_step once an iteration
 * (the iteration's row; the variables move on to the next). */
typedef struct walk_vars {
    row_walk w;                   /* the walk's src; its fields are the variables' */
    LLVMValueRef p, slot, in_page;
} walk_vars;

static walk_vars walk_vars_begin(aj_kb *kb, const aj_cpu_rows *src, LLVMValueRef p)
{
    walk_vars v = {walk_begin(kb, src, p), NULL, NULL, NULL};
    v.p = aj_kb_var(kb, kb->t_i32, v.w.p, "walk_p");
    if (v.w.slot) {
        v.slot = aj_kb_var(kb, kb->t_i32, v.w.slot, "walk_slot");
        v.in_page = aj_kb_var(kb, kb->t_i32, v.w.in_page, "walk_in_page");
    }
    return v;
}

static row_walk walk_vars_step(aj_kb *kb, const walk_vars *v)
{
    row_walk w = v->w;
    w.p = aj_kb_get(kb, v->p);
    if (w.slot) {
        w.slot = aj_kb_get(kb, v->slot);
        w.in_page = aj_kb_get(kb, v->in_page);
    }
    row_walk next = w;
    walk_next(kb, &next);
    aj_kb_set(kb, v->p, next.p);
    if (w.slot) {
        aj_kb_set(kb, v->slot, next.slot);
        aj_kb_set(kb, v->in_page, next.in_page);
    }
    return w;
}

void aj_cpu_prefetch_rows(aj_kb *kb, aj_param_source t, aj_dtype dtype, const aj_cpu_rows *src,
                          LLVMValueRef r0, LLVMValueRef count, int width)
{
    walk_vars wv = walk_vars_begin(kb, src, r0);
    aj_kb_for_begin(kb, aj_kb_i32(kb, 0), count, aj_kb_i32(kb, 1), "pf");
    row_walk w = walk_vars_step(kb, &wv);
    LLVMValueRef row = aj_cpu_tensor_at(kb, t, dtype, walk_row(kb, &w));
    /* each 64-byte line of the row (rows of 32 elements or more start on
     * a line in caches from aj_device_alloc): read, all levels, data */
    for (int off = 0; off < width * aj_dtype_size(dtype); off += 64) {
        LLVMValueRef args[4] = {aj_cv_at(kb, kb->t_i8, row, aj_kb_i32(kb, off)), aj_kb_i32(kb, 0),
                                aj_kb_i32(kb, 3), aj_kb_i32(kb, 1)};
        aj_kb_call_overloaded(kb, "llvm.prefetch", args, 4);
    }
    aj_kb_for_end(kb);
}

void aj_cpu_load_rows(aj_kb *kb, LLVMValueRef buf, int width, aj_param_source t, aj_dtype dtype,
                      const aj_cpu_rows *src, LLVMValueRef r0, LLVMValueRef count,
                      LLVMValueRef rows, double scale, int pairs)
{
    LLVMValueRef vscale = aj_cv_splat(kb, aj_kb_f32(kb, scale), 8);
    walk_vars wv = walk_vars_begin(kb, src, r0);
    LLVMValueRef r = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), rows, aj_kb_i32(kb, 1), "lr");
    LLVMValueRef dst = aj_kb_mul(kb, r, aj_kb_i32(kb, width));
    row_walk w = walk_vars_step(kb, &wv);
    aj_kb_if_begin(kb, LLVMBuildICmp(kb->b, LLVMIntSLT, r, count, ""));
    LLVMValueRef row = walk_row(kb, &w);   /* (the table is read only for rows in range) */
    LLVMValueRef c =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, width), aj_kb_i32(kb, 8), "lrc");
    LLVMValueRef x = load8(kb, t, dtype, pairs, row, c);
    if (scale != 1.0)
        x = LLVMBuildFMul(kb->b, x, vscale, "");
    aj_cpu_vstore(kb, x, aj_cpu_buf_at(kb, buf, aj_kb_add(kb, dst, c)));
    aj_kb_for_end(kb);
    aj_kb_else(kb);
    aj_cpu_zero(kb, aj_cpu_buf_at(kb, buf, dst), width);
    aj_kb_if_end(kb);
    aj_kb_for_end(kb);
}

void aj_cpu_zero(aj_kb *kb, LLVMValueRef ptr, int n)
{
    LLVMValueRef c =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, n), aj_kb_i32(kb, 8), "zero");
    aj_cpu_vstore(kb, LLVMConstNull(aj_cv_type(kb, 8)), aj_cpu_buf_at(kb, ptr, c));
    aj_kb_for_end(kb);
}

/* out[j][i] = a[i][j] for 8 vectors of 8 floats, by three rounds of
 * two-input shuffles (x86: unpck, shufps, vperm2f128):
 *
 *   a0 = k0d0 k0d1 .. k0d7      t: pairs of rows interleaved
 *   a1 = k1d0 ..           ->   u: quads of rows, dims j and j+4
 *   ..                          out[j] = k0dj k1dj .. k7dj
 */
static void transpose8(aj_kb *kb, LLVMValueRef a[8], LLVMValueRef out[8])
{
    static const int lo[8] = {0, 8, 1, 9, 4, 12, 5, 13}, hi[8] = {2, 10, 3, 11, 6, 14, 7, 15};
    static const int ulo[8] = {0, 1, 8, 9, 4, 5, 12, 13}, uhi[8] = {2, 3, 10, 11, 6, 7, 14, 15};
    static const int vlo[8] = {0, 1, 2, 3, 8, 9, 10, 11}, vhi[8] = {4, 5, 6, 7, 12, 13, 14, 15};
    LLVMValueRef t[8], u[8];
#define SHUF(x, y, m) shuffle8(kb, x, y, m)
    for (int p = 0; p < 4; p++) {
        t[2 * p] = SHUF(a[2 * p], a[2 * p + 1], lo);
        t[2 * p + 1] = SHUF(a[2 * p], a[2 * p + 1], hi);
    }
    for (int g = 0; g < 2; g++) {   /* rows 0-3, then 4-7 */
        LLVMValueRef *tt = &t[4 * g], *uu = &u[4 * g];
        uu[0] = SHUF(tt[0], tt[2], ulo);
        uu[1] = SHUF(tt[0], tt[2], uhi);
        uu[2] = SHUF(tt[1], tt[3], ulo);
        uu[3] = SHUF(tt[1], tt[3], uhi);
    }
    for (int j = 0; j < 4; j++) {
        out[j] = SHUF(u[j], u[j + 4], vlo);
        out[j + 4] = SHUF(u[j], u[j + 4], vhi);
    }
#undef SHUF
}

void aj_cpu_load_cols(aj_kb *kb, LLVMValueRef buf, int width, int n, aj_param_source t,
                      aj_dtype dtype, const aj_cpu_rows *src, LLVMValueRef r0,
                      LLVMValueRef count, int pairs)
{
    LLVMBuilderRef b = kb->b;
    /* groups of 8 rows: whole ones by 8 x 8 transposes (of floats or of
     * words: shuffles move bits), the group holding the tail row by row (n
     * is a multiple of 8); columns 8 at a time, in a loop (one transpose of
     * code, not width / 8) */
    LLVMValueRef r8 =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, n), aj_kb_i32(kb, 8), "lc8");
    aj_kb_if_begin(kb,
                   LLVMBuildICmp(b, LLVMIntSLE, aj_kb_add(kb, r8, aj_kb_i32(kb, 8)), count, ""));
    {
        LLVMValueRef rows[8];
        row_walk w = walk_begin(kb, src, aj_kb_add(kb, r0, r8));
        for (int e = 0; e < 8; e++) {
            rows[e] = walk_row(kb, &w);
            if (e < 7)
                walk_next(kb, &w);
        }
        LLVMValueRef c =
            aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, width), aj_kb_i32(kb, 8), "lcc");
        LLVMValueRef a[8], out[8];
        for (int e = 0; e < 8; e++)
            a[e] = load8(kb, t, dtype, pairs, rows[e], c);
        transpose8(kb, a, out);
        LLVMValueRef at = aj_kb_add(kb, aj_kb_mul(kb, c, aj_kb_i32(kb, n)), r8);
        for (int j = 0; j < 8; j++)
            aj_cpu_vstore(kb, out[j],
                          aj_cpu_buf_at(kb, buf, aj_kb_add(kb, at, aj_kb_i32(kb, j * n))));
        aj_kb_for_end(kb);
    }
    aj_kb_else(kb);
    /* rows past count read the last row (count >= 1 where a block is
     * loaded: in bounds) and store 0 */
    LLVMValueRef r =
        aj_kb_for_begin(kb, r8, aj_kb_add(kb, r8, aj_kb_i32(kb, 8)), aj_kb_i32(kb, 1), "lc");
    LLVMValueRef in = LLVMBuildICmp(b, LLVMIntSLT, r, count, "");
    LLVMValueRef rc = aj_kb_smin(kb, r, LLVMBuildSub(b, count, aj_kb_i32(kb, 1), ""));
    LLVMValueRef row = aj_cpu_row_at(kb, src, aj_kb_add(kb, r0, rc));
    LLVMValueRef c =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, width), aj_kb_i32(kb, 8), "lct");
    LLVMValueRef x = load8(kb, t, dtype, pairs, row, c);
    x = LLVMBuildSelect(b, in, x, LLVMConstNull(LLVMTypeOf(x)), "");
    for (int e = 0; e < 8; e++)
        LLVMBuildStore(
            b, LLVMBuildExtractElement(b, x, aj_kb_i32(kb, e), ""),
            aj_cpu_buf_at(
                kb, buf,
                aj_kb_add(kb, aj_kb_mul(kb, aj_kb_add(kb, c, aj_kb_i32(kb, e)), aj_kb_i32(kb, n)),
                          r)));
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
    aj_kb_if_end(kb);
    aj_kb_for_end(kb);
}

/* buf rows [from / 2, to / 2) of aj_cpu_load_row_pairs: pairs of rows
 * (r0 + r, r0 + r + 1) for even r, the rows' places by a walk from r0 +
 * from; `guard` (the tail pair) zeroes rows count <= r, else every row
 * is in range and the loop has no test in it. */
static void row_pairs(aj_kb *kb, LLVMValueRef buf, int width, aj_param_source t,
                      const aj_cpu_rows *src, LLVMValueRef r0, LLVMValueRef count,
                      LLVMValueRef from, LLVMValueRef to, int guard)
{
    LLVMBuilderRef b = kb->b;
    /* 16 columns a step where they divide (a 512-bit store), else 8 */
    int cw = width % 16 == 0 ? 16 : 8;
    LLVMTypeRef vi16 = LLVMVectorType(kb->t_i16, (unsigned)cw);
    LLVMValueRef zip[32];
    for (int i = 0; i < cw; i++) {
        zip[2 * i] = aj_kb_i32(kb, i);
        zip[2 * i + 1] = aj_kb_i32(kb, cw + i);
    }
    LLVMValueRef mask = LLVMConstVector(zip, (unsigned)(2 * cw));
    LLVMValueRef last = LLVMBuildSub(b, count, aj_kb_i32(kb, 1), "");
    walk_vars wv;
    if (!guard)
        wv = walk_vars_begin(kb, src, aj_kb_add(kb, r0, from));
    LLVMValueRef r = aj_kb_for_begin(kb, from, to, aj_kb_i32(kb, 2), "rp");
    LLVMValueRef rr[2], in[2];
    for (int h = 0; h < 2; h++) {
        LLVMValueRef ri = aj_kb_add(kb, r, aj_kb_i32(kb, h));
        in[h] = LLVMBuildICmp(b, LLVMIntSLT, ri, count, "");
        if (guard) {   /* rows past count read the last row (count >= 1) and give 0 */
            rr[h] = aj_cpu_row_at(kb, src, aj_kb_add(kb, r0, aj_kb_smin(kb, ri, last)));
        } else {
            row_walk w = walk_vars_step(kb, &wv);
            rr[h] = walk_row(kb, &w);
        }
    }
    LLVMValueRef dst = aj_kb_mul(kb, r, aj_kb_i32(kb, width / 2));
    LLVMValueRef c =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, width), aj_kb_i32(kb, cw), "rpc");
    LLVMValueRef x[2];
    for (int h = 0; h < 2; h++) {
        x[h] = LLVMBuildLoad2(
            b, vi16,
            aj_cpu_tensor_at(kb, t, AJ_DTYPE_BF16, aj_kb_add(kb, rr[h], aj_kb_sext64(kb, c))), "");
        LLVMSetAlignment(x[h], 2);
        if (guard)
            x[h] = LLVMBuildSelect(b, in[h], x[h], LLVMConstNull(vi16), "");
    }
    LLVMValueRef pairs = LLVMBuildShuffleVector(b, x[0], x[1], mask, "");
    LLVMValueRef st = LLVMBuildStore(b, pairs, aj_cpu_buf_at(kb, buf, aj_kb_add(kb, dst, c)));
    LLVMSetAlignment(st, 4);
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

void aj_cpu_load_row_pairs(aj_kb *kb, LLVMValueRef buf, int width, int n, aj_param_source t,
                           const aj_cpu_rows *src, LLVMValueRef r0, LLVMValueRef count)
{
    /* the pairs whose rows are both in range, then the rest */
    LLVMValueRef full =
        aj_kb_smin(kb, LLVMBuildAnd(kb->b, count, aj_kb_i32(kb, -2), ""), aj_kb_i32(kb, n));
    row_pairs(kb, buf, width, t, src, r0, count, aj_kb_i32(kb, 0), full, 0);
    row_pairs(kb, buf, width, t, src, r0, count, full, aj_kb_i32(kb, n), 1);
}

/* One step of a register tile: acc + a (f32, broadcast) * b, or with pairs
 * acc + the dot products of the bf16 pair a (one word, broadcast) with
 * the pairs of b (words). */
static LLVMValueRef tile_step(aj_kb *kb, int pairs, int w, LLVMValueRef a_at, LLVMValueRef b,
                              LLVMValueRef acc)
{
    if (!pairs)
        return aj_cv_fma(kb, aj_cv_splat(kb, aj_cpu_fload(kb, a_at), w), b, acc);
    LLVMValueRef word = LLVMBuildLoad2(kb->b, kb->t_i32, a_at, "");
    return aj_cv_dot_bf16(kb, acc, aj_cv_splat(kb, word, w), b, w);
}

/* w lanes at ptr: floats, or with pairs words */
static LLVMValueRef tile_load(aj_kb *kb, int pairs, LLVMValueRef ptr, int w)
{
    if (!pairs)
        return aj_cpu_vload(kb, ptr, w);
    LLVMValueRef v = LLVMBuildLoad2(kb->b, LLVMVectorType(kb->t_i32, (unsigned)w), ptr, "");
    LLVMSetAlignment(v, 4);
    return v;
}

void aj_cpu_gemm_nt(aj_kb *kb, int w, LLVMValueRef c, LLVMValueRef a, int k, LLVMValueRef bt,
                    int n, LLVMValueRef m_end, int pairs)
{
    LLVMTypeRef vt = aj_cv_type(kb, w);
    const int RM = aj_cpu_tile_rows();
    LLVMValueRef acc[AJ_CPU_RM_MAX][CN];
    for (int r = 0; r < RM; r++)
        for (int x = 0; x < CN; x++)
            acc[r][x] = aj_kb_var(kb, vt, NULL, "nt");
    LLVMValueRef i0 = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), m_end, aj_kb_i32(kb, RM), "nti");
    LLVMValueRef j0 =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, n), aj_kb_i32(kb, CN * w), "ntj");
    for (int r = 0; r < RM; r++)
        for (int x = 0; x < CN; x++)
            aj_kb_set(kb, acc[r][x], LLVMConstNull(vt));
    LLVMValueRef d =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, k), aj_kb_i32(kb, 1), "ntk");
    {
        LLVMValueRef bv[CN];
        LLVMValueRef brow = aj_kb_add(kb, aj_kb_mul(kb, d, aj_kb_i32(kb, n)), j0);
        for (int x = 0; x < CN; x++)
            bv[x] = tile_load(kb, pairs,
                              aj_cpu_buf_at(kb, bt, aj_kb_add(kb, brow, aj_kb_i32(kb, x * w))), w);
        for (int r = 0; r < RM; r++) {
            LLVMValueRef ai = aj_kb_add(
                kb, aj_kb_mul(kb, aj_kb_add(kb, i0, aj_kb_i32(kb, r)), aj_kb_i32(kb, k)), d);
            for (int x = 0; x < CN; x++)
                aj_kb_set(kb, acc[r][x], tile_step(kb, pairs, w, aj_cpu_buf_at(kb, a, ai), bv[x],
                                                   aj_kb_get(kb, acc[r][x])));
        }
    }
    aj_kb_for_end(kb);
    for (int r = 0; r < RM; r++) {
        LLVMValueRef crow =
            aj_kb_add(kb, aj_kb_mul(kb, aj_kb_add(kb, i0, aj_kb_i32(kb, r)), aj_kb_i32(kb, n)), j0);
        for (int x = 0; x < CN; x++)
            aj_cpu_vstore(kb, aj_kb_get(kb, acc[r][x]),
                          aj_cpu_buf_at(kb, c, aj_kb_add(kb, crow, aj_kb_i32(kb, x * w))));
    }
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

void aj_cpu_gemm_acc(aj_kb *kb, int ncols, LLVMValueRef c, LLVMValueRef rscale,
                     LLVMValueRef p, int ldp_m, int ldp_k, LLVMValueRef b, int kn,
                     LLVMValueRef m_end, int pairs)
{
    /* output vectors: the host's width where it divides the row, else 8
     * (head dims are multiples of 8); two per tile where they pair up */
    int w = aj_cpu_vector_width();
    int vw = ncols % w == 0 ? w : 8;
    int cv = (ncols / vw) % 2 == 0 ? 2 : 1;
    LLVMTypeRef vt = aj_cv_type(kb, vw);
    const int RM = aj_cpu_tile_rows();
    LLVMValueRef acc[AJ_CPU_RM_MAX][2];
    for (int r = 0; r < RM; r++)
        for (int x = 0; x < cv; x++)
            acc[r][x] = aj_kb_var(kb, vt, NULL, "acc");
    LLVMValueRef i0 = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), m_end, aj_kb_i32(kb, RM), "aci");
    LLVMValueRef c0 =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, ncols), aj_kb_i32(kb, cv * vw), "acc");
    for (int r = 0; r < RM; r++) {
        LLVMValueRef m = aj_kb_add(kb, i0, aj_kb_i32(kb, r));
        LLVMValueRef row = aj_kb_add(kb, aj_kb_mul(kb, m, aj_kb_i32(kb, ncols)), c0);
        for (int x = 0; x < cv; x++) {
            LLVMValueRef at = aj_cpu_buf_at(kb, c, aj_kb_add(kb, row, aj_kb_i32(kb, x * vw)));
            LLVMValueRef v = aj_cpu_vload(kb, at, vw);
            if (rscale) {
                LLVMValueRef rs = aj_cpu_fload(kb, aj_cpu_buf_at(kb, rscale, m));
                v = LLVMBuildFMul(kb->b, aj_cv_splat(kb, rs, vw), v, "");
            }
            aj_kb_set(kb, acc[r][x], v);
        }
    }
    LLVMValueRef k = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, pairs ? kn / 2 : kn),
                                     aj_kb_i32(kb, 1), "ack");
    {
        LLVMValueRef bv[2];
        LLVMValueRef brow = aj_kb_add(kb, aj_kb_mul(kb, k, aj_kb_i32(kb, ncols)), c0);
        for (int x = 0; x < cv; x++)
            bv[x] = tile_load(kb, pairs,
                              aj_cpu_buf_at(kb, b, aj_kb_add(kb, brow, aj_kb_i32(kb, x * vw))), vw);
        LLVMValueRef pk = aj_kb_mul(kb, k, aj_kb_i32(kb, ldp_k));
        for (int r = 0; r < RM; r++) {
            LLVMValueRef pi = aj_kb_add(
                kb, aj_kb_mul(kb, aj_kb_add(kb, i0, aj_kb_i32(kb, r)), aj_kb_i32(kb, ldp_m)), pk);
            for (int x = 0; x < cv; x++)
                aj_kb_set(kb, acc[r][x], tile_step(kb, pairs, vw, aj_cpu_buf_at(kb, p, pi), bv[x],
                                                   aj_kb_get(kb, acc[r][x])));
        }
    }
    aj_kb_for_end(kb);
    for (int r = 0; r < RM; r++) {
        LLVMValueRef row = aj_kb_add(
            kb, aj_kb_mul(kb, aj_kb_add(kb, i0, aj_kb_i32(kb, r)), aj_kb_i32(kb, ncols)), c0);
        for (int x = 0; x < cv; x++)
            aj_cpu_vstore(kb, aj_kb_get(kb, acc[r][x]),
                          aj_cpu_buf_at(kb, c, aj_kb_add(kb, row, aj_kb_i32(kb, x * vw))));
    }
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

/* byte offset `bytes` (i32) into buffer buf */
static LLVMValueRef byte_at(aj_kb *kb, LLVMValueRef buf, LLVMValueRef bytes)
{
    return aj_cv_at(kb, kb->t_i8, buf, bytes);
}

void aj_cpu_amx_gemm(aj_amx *t, LLVMValueRef c, LLVMValueRef a, int lda, LLVMValueRef b, int n,
                     int kn, LLVMValueRef m_end, int accumulate)
{
    aj_kb *kb = t->kb;
    const int half = AJ_AMX_ROWS;   /* 16 rows, 16 f32 columns, 32 k per tile */
    LLVMValueRef c_stride = aj_kb_i64(kb, 4 * n), a_stride = aj_kb_i64(kb, 2 * lda);
    LLVMValueRef b_stride = aj_kb_i64(kb, 4 * n);
    LLVMValueRef i0 = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), m_end,
                                      aj_kb_i32(kb, AJ_CPU_AMX_ROWS), "xi");
    LLVMValueRef j0 = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, n),
                                      aj_kb_i32(kb, 2 * half), "xj");
    /* C tile 2 r + x: rows i0 + 16 r, columns j0 + 16 x */
    LLVMValueRef c_at[4];
    for (int r = 0; r < 2; r++)
        for (int x = 0; x < 2; x++) {
            LLVMValueRef row = aj_kb_add(kb, i0, aj_kb_i32(kb, r * half));
            LLVMValueRef col = aj_kb_add(kb, j0, aj_kb_i32(kb, x * half));
            c_at[2 * r + x] = aj_cpu_buf_at(kb, c, aj_kb_add(kb, aj_kb_mul(kb, row,
                                                             aj_kb_i32(kb, n)), col));
            if (accumulate)
                aj_amx_load(t, 2 * r + x, c_at[2 * r + x], c_stride);
            else
                aj_amx_zero(t, 2 * r + x);
        }
    LLVMValueRef k0 = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, kn),
                                      aj_kb_i32(kb, 2 * half), "xk");
    for (int r = 0; r < 2; r++) {
        LLVMValueRef row = aj_kb_add(kb, i0, aj_kb_i32(kb, r * half));
        LLVMValueRef at = aj_kb_mul(kb, aj_kb_add(kb, aj_kb_mul(kb, row, aj_kb_i32(kb, lda)), k0),
                                    aj_kb_i32(kb, 2));
        aj_amx_load(t, 4 + r, byte_at(kb, a, at), a_stride);
    }
    for (int x = 0; x < 2; x++) {
        /* pair row k0 / 2, word column j0 + 16 x */
        LLVMValueRef word = aj_kb_add(kb, aj_kb_mul(kb, LLVMBuildLShr(kb->b, k0, aj_kb_i32(kb, 1),
                                                                      ""), aj_kb_i32(kb, n)),
                                      aj_kb_add(kb, j0, aj_kb_i32(kb, x * half)));
        aj_amx_load(t, 6 + x, aj_cpu_buf_at(kb, b, word), b_stride);
    }
    for (int r = 0; r < 2; r++)
        for (int x = 0; x < 2; x++)
            aj_amx_dot(t, 2 * r + x, 4 + r, 6 + x);
    aj_kb_for_end(kb);
    for (int tile = 0; tile < 4; tile++)
        aj_amx_store(t, tile, c_at[tile], c_stride);
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

void aj_cpu_scale_rows(aj_kb *kb, LLVMValueRef c, int ncols, LLVMValueRef rscale,
                       LLVMValueRef m_end)
{
    int w = aj_cpu_vector_width();
    int vw = ncols % w == 0 ? w : 8;
    LLVMValueRef m = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), m_end, aj_kb_i32(kb, 1), "sr");
    LLVMValueRef rs = aj_cv_splat(kb, aj_cpu_fload(kb, aj_cpu_buf_at(kb, rscale, m)), vw);
    LLVMValueRef row = aj_kb_mul(kb, m, aj_kb_i32(kb, ncols));
    for (int x = 0; x < ncols; x += vw) {
        LLVMValueRef at = aj_cpu_buf_at(kb, c, aj_kb_add(kb, row, aj_kb_i32(kb, x)));
        aj_cpu_vstore(kb, LLVMBuildFMul(kb->b, rs, aj_cpu_vload(kb, at, vw), ""), at);
    }
    aj_kb_for_end(kb);
}

void aj_cpu_transpose_half(aj_kb *kb, LLVMValueRef dst, LLVMValueRef src, int rows, int cols,
                           aj_dtype dtype)
{
    LLVMValueRef r8 =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, rows), aj_kb_i32(kb, 8), "tr");
    LLVMValueRef c8 =
        aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, cols), aj_kb_i32(kb, 8), "tc");
    LLVMValueRef a[8], out[8];
    for (int e = 0; e < 8; e++)
        a[e] = aj_cpu_vload(kb, aj_cpu_buf_at(kb, src, aj_kb_add(kb, aj_kb_mul(kb, aj_kb_add(kb,
                            r8, aj_kb_i32(kb, e)), aj_kb_i32(kb, cols)), c8)), 8);
    transpose8(kb, a, out);
    for (int j = 0; j < 8; j++) {
        LLVMValueRef at = aj_kb_add(kb, aj_kb_mul(kb, aj_kb_add(kb, c8, aj_kb_i32(kb, j)),
                                                  aj_kb_i32(kb, rows)), r8);
        aj_cv_store_operand(kb, out[j], aj_cv_at(kb, kb->t_i16, dst, at), dtype, 8);
    }
    aj_kb_for_end(kb);
    aj_kb_for_end(kb);
}

void aj_cpu_round_half(aj_kb *kb, LLVMValueRef dst, LLVMValueRef src, int n, aj_dtype dtype)
{
    LLVMValueRef i = aj_kb_for_begin(kb, aj_kb_i32(kb, 0), aj_kb_i32(kb, n), aj_kb_i32(kb, 16),
                                     "rb");
    aj_cv_store_operand(kb, aj_cpu_vload(kb, aj_cpu_buf_at(kb, src, i), 16),
                        aj_cv_at(kb, kb->t_i16, dst, i), dtype, 16);
    aj_kb_for_end(kb);
}

LLVMValueRef aj_cpu_bias(aj_cpu_attn *a, LLVMValueRef ig, LLVMValueRef jv)
{
    aj_kb *kb = a->kb;
    LLVMBuilderRef b = kb->b;
    int w = a->w;
    LLVMValueRef ic = aj_kb_smin(kb, ig, LLVMBuildSub(b, a->seq.len_q, aj_kb_i32(kb, 1), ""));
    LLVMValueRef row = aj_kb_add(
        kb, a->bias_base, aj_kb_mul(kb, aj_kb_sext64(kb, ic), aj_param(kb, AJ_PID(stride_bias_s))));
    LLVMValueRef last = LLVMBuildSub(b, a->seq.len_k, aj_kb_i32(kb, 1), "");
    LLVMValueRef bv = LLVMGetPoison(aj_cv_type(kb, w));
    for (int e = 0; e < w; e++) {
        LLVMValueRef j = aj_kb_smin(kb, LLVMBuildExtractElement(b, jv, aj_kb_i32(kb, e), ""), last);
        LLVMValueRef one = aj_cv_load(kb,
                                      aj_cpu_tensor_at(kb, AJ_PSRC_bias, a->op->dtype,
                                                       aj_kb_add(kb, row, aj_kb_sext64(kb, j))),
                                      a->op->dtype, 1);
        bv = LLVMBuildInsertElement(b, bv, LLVMBuildExtractElement(b, one, aj_kb_i32(kb, 0), ""),
                                    aj_kb_i32(kb, e), "");
    }
    return bv;
}

/* aj_score_bias's load: aj_cpu_bias (masked or never stored where it read
 * the last row / key) */
static LLVMValueRef load_bias(void *user, LLVMValueRef ig, LLVMValueRef jv)
{
    return aj_cpu_bias(user, ig, jv);
}

LLVMValueRef aj_cpu_scores(aj_cpu_attn *a, LLVMValueRef s, LLVMValueRef ig, LLVMValueRef jv,
                           LLVMValueRef *dmod)
{
    aj_kb *kb = a->kb;
    LLVMBuilderRef b = kb->b;
    int w = a->w;
    aj_score_bias bias = {NULL, load_bias, a};
    LLVMValueRef d = NULL;
    s = aj_score_compose(&a->sc, s, a->log2e_in_q ? AJ_SCORE_LOG2 : AJ_SCORE_SCALED,
                         a->op->bias == AJ_BIAS_ADD ? &bias : NULL, ig, jv, dmod ? &d : NULL);
    LLVMValueRef vis = LLVMBuildICmp(b, LLVMIntSLT, jv, aj_cv_splat(kb, a->seq.len_k, w), "");
    if (a->tile_full) {   /* a full tile: the key length alone */
        LLVMValueRef masked = aj_kb_var(kb, LLVMTypeOf(vis), vis, "vis");
        aj_kb_if_begin(kb, LLVMBuildNot(b, aj_kb_get(kb, a->tile_full), ""));
        aj_kb_set(kb, masked, LLVMBuildAnd(b, vis, aj_score_visible(&a->sc, ig, jv), ""));
        aj_kb_if_end(kb);
        vis = aj_kb_get(kb, masked);
    }
    if (dmod)
        *dmod = d ? LLVMBuildSelect(b, vis, d, LLVMConstNull(aj_cv_type(kb, w)), "") : NULL;
    return aj_score_hide(kb, s, vis);
}

void aj_cpu_blocks(aj_kb *kb, int size, LLVMValueRef lo, LLVMValueRef hi, LLVMValueRef *begin,
                   LLVMValueRef *end)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef n = aj_kb_i32(kb, size);
    LLVMValueRef empty = LLVMBuildICmp(b, LLVMIntSLT, hi, lo, "");
    *begin = LLVMBuildSelect(b, empty, aj_kb_i32(kb, 0), LLVMBuildSDiv(b, lo, n, ""), "blk_begin");
    *end = LLVMBuildSelect(b, empty, aj_kb_i32(kb, 0),
                           LLVMBuildSDiv(b, aj_kb_add(kb, hi, n), n, ""), "blk_end");
}

void aj_cpu_key_blocks(aj_cpu_attn *a, int bn, LLVMValueRef i0, LLVMValueRef i1,
                       LLVMValueRef *begin, LLVMValueRef *end)
{
    LLVMValueRef j_lo, j_hi;
    aj_score_key_range(&a->sc, i0, i1, a->seq.len_k, &j_lo, &j_hi);
    aj_cpu_blocks(a->kb, bn, j_lo, j_hi, begin, end);
}

void aj_cpu_row_blocks(aj_cpu_attn *a, int bm, LLVMValueRef j0, LLVMValueRef j1,
                       LLVMValueRef *begin, LLVMValueRef *end)
{
    LLVMValueRef i_lo, i_hi;
    aj_score_row_range(&a->sc, j0, j1, a->seq.len_q, &i_lo, &i_hi);
    aj_cpu_blocks(a->kb, bm, i_lo, i_hi, begin, end);
}

void aj_cpu_skip_begin(aj_cpu_attn *a, LLVMValueRef cls)
{
    if (!a->tile_full)
        return;   /* no mask: every tile is full */
    aj_kb *kb = a->kb;
    LLVMBuilderRef b = kb->b;
    aj_kb_set(kb, a->tile_full, LLVMBuildICmp(b, LLVMIntEQ, cls, aj_kb_i32(kb, AJ_TILE_FULL), ""));
    if (aj_score_has_rest(a->prog))   /* the band ranges hold no skip tile */
        aj_kb_if_begin(kb, LLVMBuildICmp(b, LLVMIntNE, cls, aj_kb_i32(kb, AJ_TILE_SKIP), ""));
}

void aj_cpu_skip_end(aj_cpu_attn *a)
{
    if (!a->tile_full)
        return;
    if (aj_score_has_rest(a->prog))
        aj_kb_if_end(a->kb);
    aj_kb_set(a->kb, a->tile_full, LLVMConstInt(a->kb->t_i1, 0, 0));
}

/* llvm.exp2 / llvm.log2 of an f32 */
static LLVMValueRef scalar_math(aj_kb *kb, const char *name, LLVMValueRef x)
{
    return aj_kb_call_overloaded(kb, name, &x, 1);
}

void aj_cpu_merge_weights(aj_kb *kb, LLVMValueRef l1, LLVMValueRef l2, LLVMValueRef *w1,
                          LLVMValueRef *w2, LLVMValueRef *l, LLVMValueRef *none)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef mx = aj_cv_max(kb, l1, l2);
    *none = LLVMBuildFCmp(b, LLVMRealOEQ, mx, aj_kb_f32(kb, -INFINITY), "");
    LLVMValueRef mx_use = LLVMBuildSelect(b, *none, aj_kb_f32(kb, 0), mx, "");
    LLVMValueRef sum = LLVMBuildFAdd(b, scalar_math(kb, "llvm.exp2", LLVMBuildFSub(b, l1,
                                                    mx_use, "")),
                                     scalar_math(kb, "llvm.exp2", LLVMBuildFSub(b, l2,
                                                 mx_use, "")), "");
    *l = LLVMBuildFAdd(b, mx_use, scalar_math(kb, "llvm.log2", sum), "");
    LLVMValueRef l_use = LLVMBuildSelect(b, *none, aj_kb_f32(kb, 0), *l, "");
    *w1 = scalar_math(kb, "llvm.exp2", LLVMBuildFSub(b, l1, l_use, ""));
    *w2 = scalar_math(kb, "llvm.exp2", LLVMBuildFSub(b, l2, l_use, ""));
}
