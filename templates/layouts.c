/*
 * layouts.c -- the layouts' rows, keys and pages in IR (layouts.h).
 */
#include "templates/layouts.h"
#include "templates/cpu_attn.h"

#include "templates/score.h"

LLVMValueRef aj_attn_slice_base(aj_kb *kb, aj_param_source t, LLVMValueRef b, LLVMValueRef h)
{
    LLVMValueRef b64 = LLVMBuildSExt(kb->b, b, kb->t_i64, "");
    LLVMValueRef h64 = LLVMBuildSExt(kb->b, h, kb->t_i64, "");
    LLVMValueRef off = LLVMBuildMul(kb->b, b64, aj_param_stride(kb, t, 0), "");
    return LLVMBuildAdd(kb->b, off, LLVMBuildMul(kb->b, h64, aj_param_stride(kb, t, 1), ""), "");
}

LLVMValueRef aj_attn_ws_row(aj_kb *kb, LLVMValueRef b, LLVMValueRef h, LLVMValueRef start)
{
    LLVMValueRef r = aj_kb_mul(kb, aj_kb_sext64(kb, b), aj_param(kb, AJ_PID(stride_ws_b)));
    r = aj_kb_add(kb, r, aj_kb_mul(kb, aj_kb_sext64(kb, h), aj_param(kb, AJ_PID(stride_ws_h))));
    return aj_kb_add(kb, r, start);
}

static LLVMValueRef load_offset(aj_kb *kb, aj_param_id array, LLVMValueRef idx)
{
    LLVMValueRef at = LLVMBuildMul(kb->b, LLVMBuildSExt(kb->b, idx, kb->t_i64, ""),
                                   aj_kb_i64(kb, 4), "");
    return aj_kb_load(kb, kb->t_i32, aj_kb_gptr_offset(kb, aj_param(kb, array), at), 4);
}

/* The fault of sequence b's offsets lo = cu[b], hi = cu[b + 1] (i32 0 if
 * none); the first of aj_varlen_fault's order wins. */
static LLVMValueRef offsets_fault(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef lo,
                                  LLVMValueRef hi, LLVMValueRef total, LLVMValueRef longest)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef zero = aj_kb_i32(kb, 0);
    LLVMValueRef last = LLVMBuildICmp(b, LLVMIntEQ, bidx,
                                      LLVMBuildSub(b, aj_param(kb, AJ_PID(batch)),
                                                   aj_kb_i32(kb, 1), ""), "");
    const struct {
        aj_varlen_fault fault;
        LLVMValueRef when;
    } rules[] = {   /* lowest priority first: each later one overrides */
        {AJ_VARLEN_LAST_NOT_TOTAL,
         LLVMBuildAnd(b, last, LLVMBuildICmp(b, LLVMIntNE, hi, total, ""), "")},
        {AJ_VARLEN_TOO_LONG,
         LLVMBuildICmp(b, LLVMIntSGT, LLVMBuildSub(b, hi, lo, ""), longest, "")},
        {AJ_VARLEN_OUT_OF_RANGE,
         LLVMBuildOr(b, LLVMBuildICmp(b, LLVMIntSLT, lo, zero, ""),
                     LLVMBuildICmp(b, LLVMIntSGT, hi, total, ""), "")},
        {AJ_VARLEN_DECREASING, LLVMBuildICmp(b, LLVMIntSLT, hi, lo, "")},
        {AJ_VARLEN_FIRST_NOT_ZERO,
         LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntEQ, bidx, zero, ""),
                      LLVMBuildICmp(b, LLVMIntNE, lo, zero, ""), "")},
    };
    LLVMValueRef fault = zero;
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        fault = LLVMBuildSelect(b, rules[i].when, aj_kb_i32(kb, rules[i].fault), fault, "");
    return fault;
}

void aj_attn_varlen_seq_of(aj_kb *kb, LLVMValueRef bidx, aj_attn_varlen_seq *out)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef next = LLVMBuildAdd(b, bidx, aj_kb_i32(kb, 1), "");
    LLVMValueRef lo[2], hi[2], fault[2];
    static const aj_param_id arrays[2] = {AJ_PID(cu_seqlens_q), AJ_PID(cu_seqlens_k)};
    static const aj_param_id totals[2] = {AJ_PID(tokens_q), AJ_PID(tokens_k)};
    static const aj_param_id longest[2] = {AJ_PID(max_seqlen_q), AJ_PID(max_seqlen_k)};
    for (int w = 0; w < 2; w++) {
        lo[w] = load_offset(kb, arrays[w], bidx);
        hi[w] = load_offset(kb, arrays[w], next);
        fault[w] = offsets_fault(kb, bidx, lo[w], hi[w], aj_param(kb, totals[w]),
                                 aj_param(kb, longest[w]));
    }
    LLVMValueRef zero = aj_kb_i32(kb, 0);
    LLVMValueRef bad_q = LLVMBuildICmp(b, LLVMIntNE, fault[0], zero, "");
    LLVMValueRef bad = LLVMBuildOr(b, bad_q, LLVMBuildICmp(b, LLVMIntNE, fault[1], zero, ""),
                                   "varlen_bad");
    aj_kb_if_begin(kb, bad);
    {
        /* AJ_VARLEN_STATUS(b, which, fault), q's fault first */
        LLVMValueRef seq = LLVMBuildShl(b, bidx, aj_kb_i32(kb, 4), "");
        LLVMValueRef code_q = LLVMBuildOr(b, seq, fault[0], "");
        LLVMValueRef code_k = LLVMBuildOr(b, LLVMBuildOr(b, seq, aj_kb_i32(kb, 8), ""),
                                          fault[1], "");
        aj_kb_atomic_umin_i32(kb, aj_param(kb, AJ_PID(varlen_status)),
                              LLVMBuildSelect(b, bad_q, code_q, code_k, ""));
    }
    aj_kb_if_end(kb);
    LLVMValueRef *lens[2] = {&out->len_q, &out->len_k};
    LLVMValueRef *starts[2] = {&out->start_q, &out->start_k};
    for (int w = 0; w < 2; w++) {
        *lens[w] = LLVMBuildSelect(b, bad, zero, LLVMBuildSub(b, hi[w], lo[w], ""),
                                   w ? "seq_k" : "seq_q");
        *starts[w] = LLVMBuildSExt(b, LLVMBuildSelect(b, bad, zero, lo[w], ""), kb->t_i64, "");
    }
}

/* Records AJ_VARLEN_STATUS(bidx, k, fault) where `bad`. */
static void record_k_fault(aj_kb *kb, LLVMValueRef bad, LLVMValueRef bidx, aj_varlen_fault fault)
{
    LLVMBuilderRef b = kb->b;
    aj_kb_if_begin(kb, bad);
    LLVMValueRef code = LLVMBuildOr(b, LLVMBuildShl(b, bidx, aj_kb_i32(kb, 4), ""),
                                    aj_kb_i32(kb, 8 | fault), "");
    aj_kb_atomic_umin_i32(kb, aj_param(kb, AJ_PID(varlen_status)), code);
    aj_kb_if_end(kb);
}

/* seqlens_k[bidx] and whether it is outside 0 .. max_pages page_size */
static LLVMValueRef paged_len_raw(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef *bad)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef len = load_offset(kb, AJ_PID(seqlens_k), bidx);
    LLVMValueRef most = LLVMBuildMul(b, aj_param(kb, AJ_PID(max_pages)),
                                     aj_param(kb, AJ_PID(page_size)), "");
    /* unsigned: a negative length is above any most */
    *bad = LLVMBuildICmp(b, LLVMIntUGT, len, most, "len_bad");
    return len;
}

LLVMValueRef aj_attn_paged_len(aj_kb *kb, LLVMValueRef bidx)
{
    LLVMValueRef bad, len = paged_len_raw(kb, bidx, &bad);
    record_k_fault(kb, bad, bidx, AJ_PAGED_BAD_LENGTH);
    return LLVMBuildSelect(kb->b, bad, aj_kb_i32(kb, 0), len, "seq_len");
}

void aj_attn_paged_queries(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef len_k,
                           LLVMValueRef longest, LLVMValueRef *start_q, LLVMValueRef *len_q)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef zero = aj_kb_i32(kb, 0);
    LLVMValueRef lo = load_offset(kb, AJ_PID(cu_seqlens_q), bidx);
    LLVMValueRef hi = load_offset(kb, AJ_PID(cu_seqlens_q), LLVMBuildAdd(b, bidx, aj_kb_i32(kb, 1),
                                                                   ""));
    LLVMValueRef fault = offsets_fault(kb, bidx, lo, hi, aj_param(kb, AJ_PID(tokens_q)), longest);
    LLVMValueRef len_bad;
    paged_len_raw(kb, bidx, &len_bad);
    /* a chunk longer than the (valid) sequence: only where the offsets
     * themselves are right */
    LLVMValueRef beyond = LLVMBuildAnd(b, LLVMBuildICmp(b, LLVMIntEQ, fault, zero, ""),
                                       LLVMBuildAnd(b, LLVMBuildNot(b, len_bad, ""),
                                                    LLVMBuildICmp(b, LLVMIntSGT,
                                                                  LLVMBuildSub(b, hi, lo, ""),
                                                                  len_k, ""), ""), "");
    fault = LLVMBuildSelect(b, beyond, aj_kb_i32(kb, AJ_PAGED_QUERIES_BEYOND_KEYS), fault, "");
    LLVMValueRef bad = LLVMBuildICmp(b, LLVMIntNE, fault, zero, "q_bad");
    aj_kb_if_begin(kb, bad);
    /* AJ_VARLEN_STATUS(b, q, fault) */
    aj_kb_atomic_umin_i32(kb, aj_param(kb, AJ_PID(varlen_status)),
                          LLVMBuildOr(b, LLVMBuildShl(b, bidx, aj_kb_i32(kb, 4), ""), fault, ""));
    aj_kb_if_end(kb);
    *len_q = LLVMBuildSelect(b, bad, zero, LLVMBuildSub(b, hi, lo, ""), "seq_q");
    *start_q = LLVMBuildSExt(b, LLVMBuildSelect(b, bad, zero, lo, ""), kb->t_i64, "");
}

LLVMValueRef aj_attn_paged_page(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef slot,
                                LLVMValueRef *ok)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef row = LLVMBuildMul(b, bidx, aj_param(kb, AJ_PID(max_pages)), "");
    LLVMValueRef page = load_offset(kb, AJ_PID(block_table), LLVMBuildAdd(b, row, slot, ""));
    /* unsigned: a negative page is above any count */
    *ok = LLVMBuildICmp(b, LLVMIntULT, page, aj_param(kb, AJ_PID(num_pages)), "page_ok");
    return page;
}

LLVMValueRef aj_attn_paged_pages_ok(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef first,
                                    LLVMValueRef end)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef flag = aj_kb_var(kb, kb->t_i32, aj_kb_i32(kb, 0), "pages_bad");
    LLVMValueRef slot = aj_kb_for_begin(kb, first, end, aj_kb_i32(kb, 1), "slot");
    LLVMValueRef ok;
    aj_attn_paged_page(kb, bidx, slot, &ok);
    aj_kb_set(kb, flag, LLVMBuildOr(b, aj_kb_get(kb, flag),
                                    LLVMBuildZExt(b, LLVMBuildNot(b, ok, ""), kb->t_i32, ""), ""));
    aj_kb_for_end(kb);
    LLVMValueRef any = LLVMBuildICmp(b, LLVMIntNE, aj_kb_get(kb, flag), aj_kb_i32(kb, 0), "");
    record_k_fault(kb, any, bidx, AJ_PAGED_BAD_PAGE);
    return LLVMBuildNot(b, any, "pages_ok");
}

void aj_attn_paged_fault(aj_kb *kb, LLVMValueRef bad, LLVMValueRef bidx)
{
    record_k_fault(kb, bad, bidx, AJ_PAGED_BAD_PAGE);
}

LLVMValueRef aj_attn_paged_part_row(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef h,
                                    LLVMValueRef part, int dv, LLVMValueRef *lse_at)
{
    return aj_attn_paged_part_row_of(kb, bidx, h, part, dv, 0, lse_at);
}

LLVMValueRef aj_attn_paged_part_row_of(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef h,
                                       LLVMValueRef part, int dv, int varlen_q,
                                       LLVMValueRef *lse_at)
{
    LLVMBuilderRef b = kb->b;
    LLVMTypeRef i64 = kb->t_i64;
    LLVMValueRef hq = LLVMBuildSExt(b, aj_param(kb, AJ_PID(heads_q)), i64, "");
    LLVMValueRef splits = LLVMBuildSExt(b, aj_param(kb, AJ_PID(splits)), i64, "");
    /* varlen queries: one sequence of T rows */
    LLVMValueRef sq = LLVMBuildSExt(b, aj_param(kb, varlen_q ? AJ_PID(tokens_q) : AJ_PID(seq_q)),
                                    i64, "");
    LLVMValueRef batch = varlen_q ? aj_kb_i64(kb, 1)
                                  : LLVMBuildSExt(b, aj_param(kb, AJ_PID(batch)), i64, "");
    LLVMValueRef bseq = varlen_q ? aj_kb_i64(kb, 0) : LLVMBuildSExt(b, bidx, i64, "");
    LLVMValueRef bh = LLVMBuildAdd(b, LLVMBuildMul(b, bseq, hq, ""),
                                   LLVMBuildSExt(b, h, i64, ""), "");
    LLVMValueRef bhs = LLVMBuildAdd(b, LLVMBuildMul(b, bh, splits, ""),
                                    LLVMBuildSExt(b, part, i64, ""), "");
    LLVMValueRef rows = LLVMBuildMul(b, LLVMBuildMul(b, batch, hq, ""),
                                     LLVMBuildMul(b, splits, sq, ""), "");
    *lse_at = LLVMBuildMul(b, rows, aj_kb_i64(kb, dv), "lse_at");
    return LLVMBuildMul(b, bhs, sq, "part_row");
}

bool aj_attn_paged_packable(const aj_score_prog *prog, bool per_row_head)
{
    if (per_row_head)
        return !prog->mask_reads_h && !prog->block_mask;
    const uint16_t roots[4] = {prog->mod, prog->band_lo, prog->band_hi, prog->rest};
    for (int i = 0; i < 4; i++)
        if (roots[i] != AJ_EXPR_NONE &&
            (prog->reads[roots[i]] & (AJ_SCORE_READS(AJ_VAR_H) | AJ_SCORE_READS_LOAD)))
            return false;
    return true;
}

LLVMValueRef aj_attn_paged_packs(aj_kb *kb, LLVMValueRef group, LLVMValueRef len_q,
                                 int max_rows)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef fits = LLVMBuildICmp(b, LLVMIntSLE, LLVMBuildMul(b, group, len_q, ""),
                                      aj_kb_i32(kb, max_rows), "");
    return LLVMBuildAnd(b, fits, LLVMBuildICmp(b, LLVMIntSGT, len_q, aj_kb_i32(kb, 0), ""),
                        "pack");
}

void aj_attn_score_totals(aj_kb *kb, const aj_score_prog *prog, aj_layout layout,
                          LLVMValueRef seq_q, LLVMValueRef seq_k, LLVMValueRef *sq,
                          LLVMValueRef *sk)
{
    *sq = *sk = NULL;
    if (!prog->reads_totals)
        return;
    if (layout != AJ_LAYOUT_VARLEN) {
        *sq = aj_param(kb, AJ_PID(seq_q_total));
        *sk = aj_param(kb, AJ_PID(seq_k_total));
        return;
    }
    LLVMValueRef given[2] = {aj_param(kb, AJ_PID(sq_total)), aj_param(kb, AJ_PID(sk_total))};
    LLVMValueRef own[2] = {seq_q, seq_k}, *out[2] = {sq, sk};
    for (int x = 0; x < 2; x++) {
        LLVMValueRef zero = LLVMBuildICmp(kb->b, LLVMIntEQ, given[x], aj_kb_i64(kb, 0), "");
        *out[x] = LLVMBuildSelect(kb->b, zero, LLVMBuildSExt(kb->b, own[x], kb->t_i64, ""),
                                  given[x], "");
    }
}

void aj_attn_paged_cta(aj_kb *kb, const aj_op *op, bool reads_totals, bool packable,
                       int block_m, int block_n, aj_paged_cta *c)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef zero = aj_kb_i32(kb, 0), one = aj_kb_i32(kb, 1);
    c->part = aj_kb_block_id(kb, 0);
    c->h = aj_kb_block_id(kb, 1);
    c->bidx = aj_kb_block_id(kb, 2);
    c->seq_q = aj_param(kb, AJ_PID(seq_q));
    c->seq_k = aj_attn_paged_len(kb, c->bidx);
    c->start_q = aj_kb_i64(kb, 0);
    if (op->q_layout == AJ_LAYOUT_VARLEN)
        aj_attn_paged_queries(kb, c->bidx, c->seq_k, c->seq_q, &c->start_q, &c->seq_q);
    c->group = LLVMBuildSDiv(b, aj_param(kb, AJ_PID(heads_q)), aj_param(kb, AJ_PID(heads_kv)),
                             "");
    c->hkv = LLVMBuildSDiv(b, c->h, c->group, "hkv");
    LLVMValueRef worker = zero;
    c->pack = NULL;
    c->h0 = c->h;
    c->heads = one;
    if (packable) {
        c->pack = aj_attn_paged_packs(kb, c->group, c->seq_q, AJ_PAGED_PACK_ROWS);
        LLVMValueRef in_group = LLVMBuildSRem(b, c->h, c->group, "");
        c->h0 = LLVMBuildSelect(b, c->pack, LLVMBuildSub(b, c->h, in_group, ""), c->h, "h0");
        c->heads = LLVMBuildSelect(b, c->pack, c->group, one, "heads");
        worker = LLVMBuildSelect(b, c->pack, in_group, zero, "worker");
    }
    c->rows = LLVMBuildMul(b, c->heads, c->seq_q, "rows");
    c->first_mb = LLVMBuildMul(b, worker, aj_kb_i32(kb, block_m), "");
    c->mb_step = LLVMBuildMul(b, c->heads, aj_kb_i32(kb, block_m), "");
    LLVMValueRef len64 = aj_kb_sext64(kb, c->seq_k);
    c->q_origin = LLVMBuildSub(b, len64, aj_kb_sext64(kb, c->seq_q), "");
    c->total = reads_totals ? len64 : NULL;
    c->splits = aj_param(kb, AJ_PID(splits));
    LLVMValueRef bn = aj_kb_i32(kb, block_n);
    LLVMValueRef blocks =
        LLVMBuildSDiv(b, LLVMBuildAdd(b, c->seq_k, aj_kb_i32(kb, block_n - 1), ""), bn, "");
    LLVMValueRef per = LLVMBuildSDiv(
        b, LLVMBuildAdd(b, blocks, LLVMBuildSub(b, c->splits, one, ""), ""), c->splits, "per");
    c->first = LLVMBuildMul(b, c->part, per, "");
    c->last = aj_kb_smin(kb, LLVMBuildAdd(b, c->first, per, ""), blocks);
}

void aj_attn_paged_dests(aj_kb *kb, const aj_op *op, const aj_paged_cta *c, int dv,
                         aj_paged_dest dest[2])
{
    LLVMBuilderRef b = kb->b;
    const int varlen_q = op->q_layout == AJ_LAYOUT_VARLEN;
    LLVMValueRef lse_at, w = aj_kb_i64(kb, dv);
    LLVMValueRef row0 = LLVMBuildAdd(
        b, aj_attn_paged_part_row_of(kb, c->bidx, c->h0, c->part, dv, varlen_q, &lse_at),
        c->start_q, "");
    LLVMValueRef ws_head = LLVMBuildMul(
        b, aj_kb_sext64(kb, c->splits),
        aj_kb_sext64(kb, aj_param(kb, varlen_q ? AJ_PID(tokens_q) : AJ_PID(seq_q))), "");
    dest[0] = (aj_paged_dest){
        aj_cpu_seq_base(kb, AJ_PSRC_o, c->bidx, c->h0, c->start_q),
        aj_param(kb, AJ_PID(stride_o_s)), aj_param(kb, AJ_PID(stride_o_h)),
        LLVMBuildAdd(b, aj_attn_slice_base(kb, AJ_PSRC_lse, c->bidx, c->h0), c->start_q, ""),
        aj_param(kb, AJ_PID(stride_lse_h))};
    dest[1] = (aj_paged_dest){LLVMBuildMul(b, row0, w, ""), w, LLVMBuildMul(b, ws_head, w, ""),
                              LLVMBuildAdd(b, lse_at, row0, ""), ws_head};
}

void aj_attn_paged_span(aj_kb *kb, LLVMValueRef m0, LLVMValueRef r1, LLVMValueRef per,
                        LLVMValueRef seq_q, LLVMValueRef *first, LLVMValueRef *last)
{
    LLVMBuilderRef b = kb->b;
    LLVMValueRef ha = LLVMBuildUDiv(b, m0, per, ""), hb = LLVMBuildUDiv(b, r1, per, "");
    LLVMValueRef same = LLVMBuildICmp(b, LLVMIntEQ, ha, hb, "");
    *first = LLVMBuildSelect(b, same, LLVMBuildSub(b, m0, LLVMBuildMul(b, ha, per, ""), ""),
                             aj_kb_i32(kb, 0), "i_first");
    *last = LLVMBuildSelect(b, same, LLVMBuildSub(b, r1, LLVMBuildMul(b, hb, per, ""), ""),
                            LLVMBuildSub(b, seq_q, aj_kb_i32(kb, 1), ""), "i_last");
}
