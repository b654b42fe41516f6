/*
 * attnjit.c -- the attnjit command-line tool.
 *
 *   attnjit compile SPEC --target T [--emit ptx|llvm|bc] [-o FILE] [-O N] [-v]
 *   attnjit check SPEC
 *   attnjit audit SPEC --target sm_80|sm_90|sm_90a [--arch A]
 *   attnjit run SPEC --device sim|cpu|cuda --in NAME=F ... --out NAME=F ...
 *   attnjit tune SPEC --device sim|cpu|cuda [--budget-s N] [--csv FILE] ...
 *   mpirun -np P attnjit ring SPEC --device sim|cpu|cuda --in q=F ... --out o=F ...
 *   attnjit info
 *
 * SPEC is a file in the IR text form, or - for standard input.  Exit codes:
 * 0 ok, 1 usage, 2 bad input, 3 internal error; messages go to stderr.
 */
#include <stdio.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "tools/cli.h"

int main(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage(NULL, NULL);
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        fputs(cli_usage_text, stdout);
        return CLI_EXIT_OK;
    }
    aj_ctx *ctx = NULL;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK) {
        fprintf(stderr, "attnjit: cannot create a context\n");
        return CLI_EXIT_INTERNAL;
    }
    int rc;
    if (strcmp(cmd, "compile") == 0)
        rc = cli_compile(ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "check") == 0)
        rc = cli_check(ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "audit") == 0)
        rc = cli_audit(ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "run") == 0)
        rc = cli_run(ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "tune") == 0)
        rc = cli_tune(ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "ring") == 0)
        rc = cli_ring(ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "info") == 0)
        rc = argc == 2 ? cli_info() : cli_usage("info takes no arguments%s", "");
    else
        rc = cli_usage("unknown command '%s'", cmd);
    aj_ctx_destroy(ctx);
    return rc;
}
