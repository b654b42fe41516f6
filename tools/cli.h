/*
 * cli.h -- shared pieces of the attnjit command-line tool.
 */
#ifndef AJ_TOOLS_CLI_H
#define AJ_TOOLS_CLI_H

#include <stddef.h>

#include "attnjit/attnjit.h"

enum {
    CLI_EXIT_OK = 0,
    CLI_EXIT_USAGE = 1,
    CLI_EXIT_INPUT = 2,
    CLI_EXIT_INTERNAL = 3,
};

#define CLI_MAX_SPEC_BYTES (1 << 20)

/* Prints an optional message (fmt with one %s) and the usage; returns 1. */
int cli_usage(const char *fmt, const char *arg);
/* Exit code for a status. */
int cli_exit_for(aj_status st);
/* Prints the context's error with the status name; returns the exit code. */
int cli_report(aj_ctx *ctx, aj_status st);
int cli_read_file(const char *path, char **data, size_t *len);
int cli_load_op(aj_ctx *ctx, const char *path, aj_op **op);

/* `attnjit info` */
int cli_info(void);
/* `attnjit run` */
int cli_run(aj_ctx *ctx, int argc, char **argv);

#endif /* AJ_TOOLS_CLI_H */
