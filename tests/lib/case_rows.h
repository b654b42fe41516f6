/*
 * case_rows.h -- cases written as table rows over a base case (forward:
 * sim_harness.h's fwd_case_over, backward: bwd_case.h's bwd_case_over):
 * a row names its label, dtype, head dim and mask and sets what it
 * varies; each other field it leaves 0 is the base case's.
 */
#ifndef AJ_TESTS_CASE_ROWS_H
#define AJ_TESTS_CASE_ROWS_H

/* c.field: row's, or base's where row's is 0 (c, row and base in scope) */
#define CASE_FROM_BASE(field) c.field = row->field ? row->field : base->field;

/* The fields fwd_case and bwd_case share beyond label, dtype, d and mask. */
#define CASE_SHARED_FIELDS(X)                                                               \
    X(dv) X(score_mod) X(schedule) X(b) X(hq) X(hkv) X(sq) X(sk) X(q_offset) X(kv_offset) \
    X(sq_total) X(sk_total) X(magnitude) X(seed)

#endif /* AJ_TESTS_CASE_ROWS_H */
