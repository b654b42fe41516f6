/*
 * fuzz_ir.c -- libFuzzer target: the IR text parser, verifier, printer and
 * hash.  Any input must parse or fail cleanly; a spec that parses must print
 * to a canonical form that parses back to the same canonical form and hash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static aj_ctx *ctx;
    if (!ctx && aj_ctx_create(NULL, &ctx) != AJ_OK)
        abort();
    aj_op *op = NULL;
    aj_status st = aj_op_parse(ctx, (const char *)data, size, "fuzz", &op);
    if (st != AJ_OK) {
        if (op || aj_last_error(ctx)[0] == '\0')
            abort();   /* a failure must leave no op and say why */
        return 0;
    }
    char *text1 = NULL, *text2 = NULL;
    char h1[AJ_HASH_HEX_LEN + 1], h2[AJ_HASH_HEX_LEN + 1];
    aj_op *again = NULL;
    if (aj_op_verify(op) != AJ_OK || aj_op_print(op, &text1) != AJ_OK ||
        aj_op_hash(op, h1) != AJ_OK)
        abort();
    if (aj_op_parse(ctx, text1, strlen(text1), "canonical", &again) != AJ_OK ||
        aj_op_print(again, &text2) != AJ_OK || aj_op_hash(again, h2) != AJ_OK)
        abort();
    if (strcmp(text1, text2) != 0 || strcmp(h1, h2) != 0)
        abort();
    aj_free(text1);
    aj_free(text2);
    aj_op_destroy(again);
    aj_op_destroy(op);
    return 0;
}
