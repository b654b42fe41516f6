/*
 * fwd_check.h -- what every forward test asserts of one case's
 * fwd_result (sim_harness.h): the launch succeeded, O and LSE are within
 * the dtype's tolerance of the float64 reference, and rows that see no key
 * are exactly O = 0, LSE = -inf.
 *
 * Header-only, so that its CHECKs count in the including test (check.h
 * keeps its counters per file).
 */
#ifndef AJ_TESTS_FWD_CHECK_H
#define AJ_TESTS_FWD_CHECK_H

#include <stdbool.h>

#include "check.h"
#include "sim_harness.h"

/* Checks r for case c; false when the launch failed (nothing else is
 * checked then), so the caller prints its line only for a run case. */
static inline bool fwd_check_result(aj_ctx *ctx, const fwd_case *c, const fwd_result *r)
{
    CHECK_MSG(r->status == AJ_OK, "%s: %s (%s)", c->label, aj_status_str(r->status),
              aj_last_error(ctx));
    if (r->status != AJ_OK)
        return false;
    CHECK_MSG(r->max_err_o <= 1.0, "%s: O error %.3g x tolerance", c->label, r->max_err_o);
    CHECK_MSG(r->max_err_lse <= 1.0, "%s: LSE error %.3g x tolerance", c->label, r->max_err_lse);
    CHECK_MSG(r->exact_empty_rows, "%s: a row without keys is not O = 0, LSE = -inf", c->label);
    return true;
}

#endif /* AJ_TESTS_FWD_CHECK_H */
