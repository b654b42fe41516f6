/*
 * spec_compile.h -- IR text to a kernel in one call, for tests and
 * benchmarks that hold specs as text.  Header-only.
 */
#ifndef AJ_TESTS_SPEC_COMPILE_H
#define AJ_TESTS_SPEC_COMPILE_H

#include <string.h>

#include "attnjit/attnjit.h"

/* Parses text (`name` in messages) and compiles the op with opt (NULL:
 * the defaults); *out gets the kernel, NULL on failure, and the caller
 * destroys it.  The op is not kept. */
static inline aj_status spec_compile(aj_ctx *ctx, const char *text, const char *name,
                                     const aj_compile_options *opt, aj_kernel **out)
{
    aj_op *op = NULL;
    *out = NULL;
    aj_status st = aj_op_parse(ctx, text, strlen(text), name, &op);
    if (st == AJ_OK)
        st = aj_compile(ctx, op, opt, out);
    aj_op_destroy(op);
    return st;
}

#endif /* AJ_TESTS_SPEC_COMPILE_H */
