/*
 * check_compile.h -- IR text to a kernel with both steps checked: the
 * parse and the compile each a CHECK_STATUS (the status and the context's
 * message on failure).  Header-only, so that the CHECKs count in the
 * including test (check.h keeps its counters per file).
 */
#ifndef AJ_TESTS_CHECK_COMPILE_H
#define AJ_TESTS_CHECK_COMPILE_H

#include <string.h>

#include "check.h"

/* The kernel of text (`name` in messages) for opt (NULL: the defaults),
 * or NULL when either step fails; the caller destroys it. */
static inline aj_kernel *check_compile(aj_ctx *ctx, const char *text, const char *name,
                                       const aj_compile_options *opt)
{
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), name, &op), AJ_OK);
    if (op)
        CHECK_STATUS(ctx, aj_compile(ctx, op, opt, &k), AJ_OK);
    aj_op_destroy(op);
    return k;
}

/* text parses and its compile for opt fails with `status` and a message
 * containing `needle`. */
static inline void check_compile_refused(aj_ctx *ctx, const char *text, const char *name,
                                         const aj_compile_options *opt, aj_status status,
                                         const char *needle)
{
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), name, &op), AJ_OK);
    if (op) {
        CHECK_STATUS(ctx, aj_compile(ctx, op, opt, &k), status);
        CHECK_ERROR(ctx, needle);
    }
    aj_kernel_destroy(k);
    aj_op_destroy(op);
}

#endif /* AJ_TESTS_CHECK_COMPILE_H */
