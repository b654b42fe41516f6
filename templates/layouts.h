/*
 * layouts.h -- where a kernel's rows and keys are, per layout: a padded
 * slice's base, a varlen sequence's bounds from cu_seqlens (checked on the
 * device), a paged sequence's pages, packed rows and split-KV parts, and
 * the totals the score programs read.  The IR each template emits for
 * them, written once.
 */
#ifndef AJ_TEMPLATES_LAYOUTS_H
#define AJ_TEMPLATES_LAYOUTS_H

#include "codegen/kbuilder.h"
#include "ir/op.h"
#include "templates/params.h"

/* Element offset (i64) of slice (b, h) of tensor t, by its batch and head
 * strides (the table's stride parameters of t, dims 0 and 1). */
LLVMValueRef aj_attn_slice_base(aj_kb *kb, aj_param_source t, LLVMValueRef b, LLVMValueRef h);
/* The workspace row (i64) of row 0 of (b, h) in a backward's workspace
 * (params.def: b stride_ws_b + h stride_ws_h), plus `start` (i64, the
 * sequence's first packed row, 0 when padded): Delta's index there, and
 * head_dim times it the dQ sums' past ws_dq_offset. */
LLVMValueRef aj_attn_ws_row(aj_kb *kb, LLVMValueRef b, LLVMValueRef h, LLVMValueRef start);

/*
 * layout = varlen: sequence b's rows and keys come from cu_seqlens, read
 * and checked on the device, so a launch needs no copy back to the host.
 * The parameters (params.def's AJ_PSIG_CU_SEQLENS): cu_seqlens_q,
 * cu_seqlens_k (i32 [batch + 1]), tokens_q, tokens_k (Tq, Tk), max_seqlen_q,
 * max_seqlen_k, batch (i32) and varlen_status (a u32 in device memory,
 * AJ_VARLEN_STATUS_CLEAR while no kernel found a fault).  Each CTA of
 * sequence b checks its pair of offsets per array; a fault is recorded as
 * AJ_VARLEN_STATUS(b, which, fault) by an atomic unsigned min, so the
 * lowest sequence's fault wins whatever order the CTAs run in, and the
 * sequence is taken as empty (no row, no key): nothing is read out of
 * bounds.  The runtime reports the word (runtime/device.c).
 */
typedef enum aj_varlen_fault {
    AJ_VARLEN_OK = 0,
    AJ_VARLEN_FIRST_NOT_ZERO = 1,   /* cu_seqlens[0] != 0 */
    AJ_VARLEN_DECREASING = 2,       /* cu_seqlens[b + 1] < cu_seqlens[b] */
    AJ_VARLEN_OUT_OF_RANGE = 3,     /* an offset below 0 or above T */
    AJ_VARLEN_TOO_LONG = 4,         /* a sequence longer than max_seqlen */
    AJ_VARLEN_LAST_NOT_TOTAL = 5,   /* cu_seqlens[batch] != T */
    /* layout = paged (which = k): the same word, the same rule */
    AJ_PAGED_BAD_PAGE = 6,          /* a block_table entry outside 0 .. num_pages - 1 */
    AJ_PAGED_BAD_LENGTH = 7,        /* seqlens_k[b] < 0 or > max_pages page_size */
    AJ_VARLEN_FAULT_COUNT,
    /* layout = paged with varlen queries (which = q, so the code is its
     * own): sequence b has more queries than keys, cu_seqlens_q[b + 1] -
     * cu_seqlens_q[b] > seqlens_k[b] */
    AJ_PAGED_QUERIES_BEYOND_KEYS = AJ_PAGED_BAD_LENGTH
} aj_varlen_fault;

#define AJ_VARLEN_STATUS_CLEAR 0xffffffffu
#define AJ_VARLEN_STATUS(b, which, fault) \
    ((uint32_t)(b) << 4 | (uint32_t)(which) << 3 | (uint32_t)(fault))

typedef struct aj_attn_varlen_seq {
    LLVMValueRef start_q, start_k;   /* i64: the sequence's first row, key */
    LLVMValueRef len_q, len_k;       /* i32: its lengths (0 after a fault) */
} aj_attn_varlen_seq;

void aj_attn_varlen_seq_of(aj_kb *kb, LLVMValueRef bidx, aj_attn_varlen_seq *out);

/*
 * layout = paged: sequence b's length seqlens_k[b] (i32), checked against
 * 0 .. max_pages page_size, and whether block-table slots [first, end)
 * of its row (i32) all hold pages in 0 .. num_pages - 1 (i1).  A fault
 * goes to the status word as varlen's (which = k: AJ_PAGED_BAD_LENGTH,
 * AJ_PAGED_BAD_PAGE); a bad length reads as 0.  Parameters: seqlens_k,
 * block_table, max_pages, page_size, num_pages, varlen_status.
 */
LLVMValueRef aj_attn_paged_len(aj_kb *kb, LLVMValueRef bidx);
LLVMValueRef aj_attn_paged_pages_ok(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef first,
                                    LLVMValueRef end);
/*
 * layout = paged, q_layout = varlen: sequence b's queries, rows
 * cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of the packed q, the last of
 * its seqlens_k[b] positions.  The offsets are checked as varlen's (q's,
 * against tokens_q and `longest`, i32), and the chunk against the
 * sequence's length (AJ_PAGED_QUERIES_BEYOND_KEYS, where the length itself
 * is valid: a bad length is its own fault); a fault reads as no query.
 * len_k: the checked length (aj_attn_paged_len's).  Parameters: those of
 * aj_attn_paged_len, cu_seqlens_q, tokens_q, batch.
 */
void aj_attn_paged_queries(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef len_k,
                           LLVMValueRef longest, LLVMValueRef *start_q, LLVMValueRef *len_q);
/* The page in slot `slot` (i32) of sequence bidx's block-table row (i32)
 * and whether it is in 0 .. num_pages - 1 (*ok, i1), unrecorded: the GPU
 * kernels look a tile's pages up row by row and record a bad one with
 * aj_attn_paged_fault (AJ_PAGED_BAD_PAGE where `bad`). */
LLVMValueRef aj_attn_paged_page(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef slot,
                                LLVMValueRef *ok);
void aj_attn_paged_fault(aj_kb *kb, LLVMValueRef bad, LLVMValueRef bidx);
/* The split-KV workspace of a paged launch (runtime/launch.c): part s of
 * row i of (b, h) is partial row r = ((b Hq + h) splits + s) Sq + i, its
 * O at element r Dv, its LSE at B Hq splits Sq Dv + r.  Returns the
 * partial row of (bidx, h, part, i = 0) and *lse_at, the LSE block's
 * offset (i64).  Parameters: heads_q, splits, seq_q, batch. */
LLVMValueRef aj_attn_paged_part_row(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef h,
                                    LLVMValueRef part, int dv, LLVMValueRef *lse_at);
/* The same for queries of either layout: with varlen_q (q_layout =
 * varlen) the packed rows are one sequence, r = (h splits + s) T + row
 * (T: tokens_q; the caller adds the sequence's first packed row) and the
 * LSE block at Hq splits T Dv. */
LLVMValueRef aj_attn_paged_part_row_of(aj_kb *kb, LLVMValueRef bidx, LLVMValueRef h,
                                       LLVMValueRef part, int dv, int varlen_q,
                                       LLVMValueRef *lse_at);

/*
 * GQA packing of a paged forward (decode, chunked prefill): the query
 * heads that share a KV head go through one work item (cpu) or CTA (sim,
 * GPU) together, their rows stacked head after head (group x Tq rows), so
 * the KV head's pages are read once per part and not once per query head.
 * A sequence packs where that is at most max_rows rows (the kernel's
 * block: the cpu's bm, the GPU kernels' AJ_PAGED_PACK_ROWS) and it has a
 * query at all (aj_attn_paged_packs, i1); an op packs where its score
 * programs allow (aj_attn_paged_packable): a kernel that takes one head
 * per item needs programs that read no head (nor a tensor, which may be
 * indexed by it); one that evaluates the score_mod at each row's own head
 * (per_row_head) needs only a mask whose tile classes do not depend on h.
 * On the cpu the items of the other heads of a packed group return at
 * once; on sim and the GPUs the group's CTAs take its row blocks in turn
 * (aj_attn_paged_workers counts those with work).
 */
enum { AJ_PAGED_PACK_ROWS = 128 };
struct aj_score_prog;
bool aj_attn_paged_packable(const struct aj_score_prog *prog, bool per_row_head);
LLVMValueRef aj_attn_paged_packs(aj_kb *kb, LLVMValueRef group, LLVMValueRef len_q,
                                 int max_rows);
/* The same rule on the host, for a launch's count of the items that work
 * (max_rows: the kernel's aj_kernel_layout.pack_rows, 0 if it never
 * packs); aj_attn_paged_packs emits it. */
static inline bool aj_attn_paged_group_packs(int64_t group, int64_t len_q, int64_t max_rows)
{
    return len_q > 0 && group * len_q <= max_rows;
}
/*
 * A paged part's CTA as both GPU templates' parts stage takes it (grid
 * (splits, Hq, B); efficient_fwd.c, flash_fwd.c "Paged"), one home for
 * its set-up: block ids; the sequence's queries (seq_q; q_layout =
 * varlen: its checked chunk, from packed row start_q, i64, else 0) and
 * keys (seq_k, checked: aj_attn_paged_len); the query group and KV head;
 * GQA packing where `packable` (pack: i1 per sequence, NULL never): the
 * group's heads h0 .. h0 + heads - 1 stacked, rows = heads seq_q, their
 * row blocks of block_m taken in turn by the group's CTAs (first_mb, then
 * every mb_step rows); the bottom-right origin (q_origin = seq_k - seq_q,
 * i64) and totals (total: the length where the programs read totals,
 * else NULL); the part's key blocks of block_n, [first, last).
 */
typedef struct aj_paged_cta {
    LLVMValueRef part, h, bidx;
    LLVMValueRef seq_q, seq_k, start_q;
    LLVMValueRef group, hkv;
    LLVMValueRef pack, h0, heads, rows, first_mb, mb_step;
    LLVMValueRef q_origin, total;
    LLVMValueRef splits, first, last;
} aj_paged_cta;
void aj_attn_paged_cta(aj_kb *kb, const aj_op *op, bool reads_totals, bool packable,
                       int block_m, int block_n, aj_paged_cta *c);
/* The query positions a row block of stacked heads spans, rows m0 .. r1
 * (i32; per >= 1 rows a head, seq_q the positions): its rows' own where
 * it lies within one head, else all of them, 0 .. seq_q - 1. */
void aj_attn_paged_span(aj_kb *kb, LLVMValueRef m0, LLVMValueRef r1, LLVMValueRef per,
                        LLVMValueRef seq_q, LLVMValueRef *first, LLVMValueRef *last);
/* Where a paged part's rows go, from head h0 and the sequence's first
 * row: dest[0] the op's o and lse (one part), dest[1] the split-KV
 * workspace's f32 partials (aj_attn_paged_part_row_of): O's element
 * offset and a row's and a head's stride, the LSE's offset and a head's
 * stride (its rows 1 apart), all i64. */
typedef struct aj_paged_dest {
    LLVMValueRef o_base, o_stride, o_head, lse_base, lse_head;
} aj_paged_dest;
void aj_attn_paged_dests(aj_kb *kb, const aj_op *op, const aj_paged_cta *c, int dv,
                         aj_paged_dest dest[2]);

/* The CTAs of a packed group of `group` heads x len_q rows with work,
 * where they take its row blocks of block_m rows in turn (sim, GPUs):
 * min(group, ceil(group len_q / block_m)); 1 where block_m is 0 (the cpu:
 * one item takes them all). */
static inline int64_t aj_attn_paged_workers(int64_t group, int64_t len_q, int64_t block_m)
{
    if (block_m <= 0)
        return 1;
    int64_t blocks = (group * len_q + block_m - 1) / block_m;
    return blocks < group ? blocks : group;
}

/*
 * The totals the score programs read (score.h's sq, sk; i64), NULL where
 * they read none: for layout = padded the parameters seq_q_total and
 * seq_k_total; for varlen the parameters sq_total and sk_total, where 0
 * stands for the sequence's own length seq_q or seq_k (i32), so that each
 * sequence aligns bottom_right to its own end (params.def declares them).
 */
void aj_attn_score_totals(aj_kb *kb, const struct aj_score_prog *prog, aj_layout layout,
                          LLVMValueRef seq_q, LLVMValueRef seq_k, LLVMValueRef *sq,
                          LLVMValueRef *sk);

#endif /* AJ_TEMPLATES_LAYOUTS_H */
