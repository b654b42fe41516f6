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
/* --device NAME: the kind aj_device_kind_name calls NAME, else the usage
 * (exit 1). */
int cli_device_kind(const char *name, aj_device_kind *out);
/* What most commands' argument loops do with argv[*i] after their own
 * flags: -v sets *verbose; a word not starting with '-' is the command's
 * one SPEC (*spec; a second is the usage, with message `second`, one %s);
 * anything else is an option whose value, the next argument, goes to
 * *value (*i moved to it).  *value is NULL after the first two. */
int cli_spec_or_value(int argc, char **argv, int *i, const char *second, const char **spec,
                      int *verbose, const char **value);

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
/* `attnjit audit` (cli_audit.c) */
int cli_audit(aj_ctx *ctx, int argc, char **argv);

/* --in NAME=FILE for a name a command does not know: the op's side
 * tensors, checked against its declarations once the op is read
 * (cli_side.c). */
typedef struct cli_side_opts {
    const char *name[AJ_OP_TENSORS_MAX], *file[AJ_OP_TENSORS_MAX];
    size_t len[AJ_OP_TENSORS_MAX];   /* of name, up to its '=' */
    int n;
} cli_side_opts;

/* arg is NAME=FILE; flag ("--in") and cmd ("run") name them in messages. */
int cli_side_add(cli_side_opts *s, const char *cmd, const char *flag, const char *arg);
/* Each side tensor the op declares given, and no other; known[0 ..
 * nknown - 1] are cmd's own tensor names, for the message. */
int cli_side_check(const aj_op_info *info, const cli_side_opts *s, const char *cmd,
                   const char *const *known, int nknown);

/* The op's side tensors in host memory, in declaration order: t[i] over
 * mem[i] (malloc'ed), contiguous. */
typedef struct cli_side_buffers {
    aj_side_tensor t[AJ_OP_TENSORS_MAX];
    void *mem[AJ_OP_TENSORS_MAX];
    int n;
} cli_side_buffers;

/* Reads them from their files (i32 or float .npy of the declared rank; an
 * f16 / bf16 tensor's values rounded to it via f32). */
int cli_side_load(const aj_op_info *info, const cli_side_opts *s, cli_side_buffers *side);
/* Appends one over `data` (taken over) of `shape`. */
void cli_side_set(cli_side_buffers *side, const aj_side_decl *decl, const int64_t *shape,
                  void *data);
size_t cli_side_bytes(const aj_side_tensor *t);
/* Copies of them in the device's memory (on_device[i]: side->t[i]'s). */
aj_status cli_side_to_device(aj_device *dev, const cli_side_buffers *side,
                             aj_side_tensor *on_device);
/* Frees the host buffers and the device copies (on_device may be NULL). */
void cli_side_free(aj_device *dev, cli_side_buffers *side, aj_side_tensor *on_device);

/* `attnjit run`'s arguments, parsed without acting on them. */
typedef struct cli_run_opts {
    const char *spec;
    aj_device_kind device;
    /* files by tensor, in the order of cli_run.c's RUN_TENSORS: q, k, v,
     * alibi_slopes, bias, o, lse, o_acc, do, dq, dk, dv, dbias, o1, lse1,
     * o2, lse2, k_cache, v_cache, block_table, seqlens_k, q_scale, k_scale, v_scale,
     * cu_seqlens_q, cu_seqlens_k */
    const char *in[26], *out[26];
    int64_t q_offset, kv_offset, sq_total, sk_total;
    uint64_t seed, offset;
    int workers;
    int no_cache;
    int verbose;             /* -v: the launch's tile classes */
    cli_side_opts side;      /* --in NAME=FILE for names not in the table */
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
