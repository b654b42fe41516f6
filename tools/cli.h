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

extern const char cli_usage_text[];

/* Prints an optional message (fmt with one %s) and the usage; returns 1. */
int cli_usage(const char *fmt, const char *arg);
/* Exit code for a status. */
int cli_exit_for(aj_status st);
/* Prints the context's error with the status name; returns the exit code. */
int cli_report(aj_ctx *ctx, aj_status st);
int cli_read_file(const char *path, char **data, size_t *len);
int cli_load_op(aj_ctx *ctx, const char *path, aj_op **op);

/* `attnjit compile` and `attnjit check` */
typedef struct cli_compile_opts {
    const char *spec, *out_path;
    aj_compile_options options;
    int verbose;
} cli_compile_opts;

/* Parses compile's arguments without acting on them (fuzzed on its own). */
int cli_parse_compile_args(aj_ctx *ctx, int argc, char **argv, cli_compile_opts *out);
int cli_compile(aj_ctx *ctx, int argc, char **argv);
int cli_check(aj_ctx *ctx, int argc, char **argv);

/* `attnjit run`'s arguments, parsed without acting on them. */
typedef struct cli_run_opts {
    const char *spec;
    aj_device_kind device;
    /* files by tensor, in the order of cli_run.c's RUN_TENSORS: q, k, v,
     * alibi_slopes, bias, o, lse, o_acc, do, dq, dk, dv, dbias, o1, lse1,
     * o2, lse2 */
    const char *in[17], *out[17];
    int64_t q_offset, kv_offset, sq_total, sk_total;
    uint64_t seed, offset;
    int workers;
    int no_cache;
    int verbose;             /* -v: the launch's tile classes */
    /* --in NAME=FILE for names not in the table: the op's side tensors
     * (checked against its declarations once the op is read) */
    const char *side_name[AJ_OP_TENSORS_MAX], *side_file[AJ_OP_TENSORS_MAX];
    size_t side_len[AJ_OP_TENSORS_MAX];
    int num_side;
} cli_run_opts;

int cli_parse_run_args(int argc, char **argv, cli_run_opts *out);

/* `attnjit ring` (under mpirun; initialises and finalises MPI itself
 * unless the caller did) */
int cli_ring(aj_ctx *ctx, int argc, char **argv);

/* `attnjit info` */
int cli_info(void);
/* `attnjit run` */
int cli_run(aj_ctx *ctx, int argc, char **argv);
/* `attnjit tune` */
int cli_tune(aj_ctx *ctx, int argc, char **argv);

#endif /* AJ_TOOLS_CLI_H */
