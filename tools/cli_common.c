/*
 * cli_common.c -- what every attnjit command shares: usage, exit codes,
 * error reporting, reading a spec.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

const char cli_usage_text[] =
    "usage: attnjit <command> [options]\n"
    "\n"
    "commands:\n"
    "  compile SPEC --target sm_80|sm_89|sm_90|sm_90a [--emit ptx|llvm|bc] [-o FILE]\n"
    "          [-O 0..3] [-v] [--no-cache]\n"
    "                           compile an op (-O2 default); -v prints the launch contract\n"
    "  check SPEC               verify an op, print its canonical form and hash\n"
    "  audit SPEC --target sm_80|sm_90|sm_90a [--arch A]\n"
    "                           ptxas and nvdisasm on the kernel: its main loop's\n"
    "                           instructions per tile and an H100/H200 issue-rate bound\n"
    "  run SPEC --device sim|cpu|cuda --in NAME=FILE... --out NAME=FILE...\n"
    "          [--q-offset N] [--kv-offset N] [--sq-total N] [--sk-total N]\n"
    "          [--seed N] [--offset N] [--workers N] [--no-cache]\n"
    "                           run an op on BHSD .npy tensors (f32 or f16); by kind:\n"
    "                           forward   in q k v [alibi_slopes bias]  out o lse\n"
    "                             (8-bit q / k, v: uint8 codes, in q_scale / k_scale v_scale)\n"
    "                             (accumulate = true: in and out o_acc lse)\n"
    "                           backward  in q k v o lse do [alibi_slopes bias]\n"
    "                                     out dq dk dv [dbias]\n"
    "                           merge     in o1 lse1 o2 lse2  out o lse\n"
    "  tune SPEC --device sim|cpu|cuda [--budget-s N] [--csv FILE] [--batch N] [--heads N]\n"
    "          [--heads-kv N] [--seq N] [--seq-k N] [--warmup N] [--repeats N]\n"
    "          [--workers N] [--no-persist] [--wgmma yes|no]\n"
    "                           time the template's schedules on the device, rank them,\n"
    "                           record the best for later compiles (docs/tune.md)\n"
    "  ring SPEC --device sim|cpu|cuda [--layout contiguous|zigzag] [--rotate p2p|allgather]\n"
    "          [--method ring|ulysses|hybrid] [--ulysses-size U] [--comm mpi|nccl]\n"
    "          --in q=F --in k=F --in v=F [--in alibi_slopes=F] [--in NAME=F] --out o=F\n"
    "          [--out lse=F] [--grad --in do=F --out dq=F --out dk=F --out dv=F] [--seed N]\n"
    "          [--offset N] [--timeout S] [--workers N] [--device-index N] [--check] [-v]\n"
    "                           ring attention over MPI ranks (run under mpirun -np P);\n"
    "                           side tensors (--in NAME=F) go whole to every rank;\n"
    "                           --check compares with a single-rank run; -v prints each\n"
    "                           forward launch's tiles\n"
    "  info                     versions, targets, and what this machine has\n"
    "\n"
    "SPEC is a file in attnjit's IR text form (docs/ir.md), or - for stdin.\n"
    "Kernels are cached in $AJ_CACHE_DIR, else $XDG_CACHE_HOME/attnjit, else\n"
    "~/.cache/attnjit (AJ_CACHE=off: no disk cache); --no-cache compiles afresh.\n"
    "exit codes: 0 ok, 1 usage, 2 bad input, 3 internal error\n";

int cli_usage(const char *fmt, const char *arg)
{
    if (fmt) {
        fprintf(stderr, "attnjit: ");
        fprintf(stderr, fmt, arg);
        fprintf(stderr, "\n\n");
    }
    fputs(cli_usage_text, stderr);
    return CLI_EXIT_USAGE;
}

int cli_spec_or_value(int argc, char **argv, int *i, const char *second, const char **spec,
                      int *verbose, const char **value)
{
    const char *a = argv[*i];
    *value = NULL;
    if (strcmp(a, "-v") == 0) {
        *verbose = 1;
        return CLI_EXIT_OK;
    }
    if (a[0] != '-' || !a[1]) {
        if (*spec)
            return cli_usage(second, a);
        *spec = a;
        return CLI_EXIT_OK;
    }
    if (*i + 1 == argc)
        return cli_usage("%s needs a value", a);
    *value = argv[++*i];
    return CLI_EXIT_OK;
}

int cli_exit_for(aj_status st)
{
    switch (st) {
    case AJ_OK:
        return CLI_EXIT_OK;
    case AJ_ERR_CODEGEN:
    case AJ_ERR_INTERNAL:
    case AJ_ERR_OUT_OF_MEMORY:
        return CLI_EXIT_INTERNAL;
    default:
        return CLI_EXIT_INPUT;
    }
}

int cli_report(aj_ctx *ctx, aj_status st)
{
    fprintf(stderr, "attnjit: %s [%s]\n", aj_last_error(ctx), aj_status_str(st));
    return cli_exit_for(st);
}

/* Reads a whole file (or stdin for "-"); a message on failure. */
int cli_read_file(const char *path, char **data, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "attnjit: cannot open '%s': %s\n", path, strerror(errno));
        return CLI_EXIT_INPUT;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        if (cap >= CLI_MAX_SPEC_BYTES) {
            fprintf(stderr, "attnjit: '%s' is larger than %d bytes\n", path, CLI_MAX_SPEC_BYTES);
            free(buf);
            buf = NULL;
            n = 0;
            break;
        }
        char *bigger = realloc(buf, cap * 2);
        if (!bigger) {
            free(buf);
            buf = NULL;
        }
        buf = bigger;
        cap *= 2;
    }
    int failed = !buf || ferror(f);
    if (failed && buf)
        fprintf(stderr, "attnjit: cannot read '%s': %s\n", path, strerror(errno));
    if (f != stdin)
        fclose(f);
    if (failed) {
        free(buf);
        return CLI_EXIT_INPUT;
    }
    *data = buf;
    *len = n;
    return CLI_EXIT_OK;
}

/* Parses the spec file into an op; prints the error on failure. */
int cli_load_op(aj_ctx *ctx, const char *path, aj_op **op)
{
    char *text;
    size_t len;
    int rc = cli_read_file(path, &text, &len);
    if (rc != CLI_EXIT_OK)
        return rc;
    aj_status st = aj_op_parse(ctx, text, len, strcmp(path, "-") == 0 ? "<stdin>" : path, op);
    free(text);
    return st == AJ_OK ? CLI_EXIT_OK : cli_report(ctx, st);
}

int cli_device_kind(const char *name, aj_device_kind *out)
{
    for (int k = 0; k < AJ_DEVICE_KIND_COUNT; k++)
        if (strcmp(name, aj_device_kind_name((aj_device_kind)k)) == 0) {
            *out = (aj_device_kind)k;
            return CLI_EXIT_OK;
        }
    return cli_usage("--device takes sim, cpu or cuda, not '%s'", name);
}
