/*
 * attnjit.c -- the attnjit command-line tool.
 *
 *   attnjit compile SPEC --target T [--emit ptx|llvm|bc] [-o FILE] [-O N] [-v]
 *   attnjit check SPEC
 *   attnjit run SPEC --device sim|cuda --in q=F --in k=F --in v=F --out o=F ...
 *   attnjit info
 *
 * SPEC is a file in the IR text form, or - for standard input.  Exit codes:
 * 0 ok, 1 usage, 2 bad input, 3 internal error; messages go to stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnjit/attnjit.h"
#include "tools/cli.h"

static const char usage_text[] =
    "usage: attnjit <command> [options]\n"
    "\n"
    "commands:\n"
    "  compile SPEC --target sm_80|sm_90|sm_90a [--emit ptx|llvm|bc] [-o FILE]\n"
    "          [-O 0..3] [-v]   compile an op (-O2 default); -v prints the launch contract\n"
    "  check SPEC               verify an op, print its canonical form and hash\n"
    "  run SPEC --device sim|cuda --in q=q.npy --in k=k.npy --in v=v.npy\n"
    "          [--in alibi_slopes=s.npy] --out o=o.npy [--out lse=lse.npy]\n"
    "          [--q-offset N] [--kv-offset N] [--sq-total N] [--sk-total N]\n"
    "          [--workers N]    run a forward op on BHSD .npy tensors (f32 or f16)\n"
    "  info                     versions, targets, and what this machine has\n"
    "\n"
    "SPEC is a file in attnjit's IR text form (docs/ir.md), or - for stdin.\n"
    "exit codes: 0 ok, 1 usage, 2 bad input, 3 internal error\n";

int cli_usage(const char *fmt, const char *arg)
{
    if (fmt) {
        fprintf(stderr, "attnjit: ");
        fprintf(stderr, fmt, arg);
        fprintf(stderr, "\n\n");
    }
    fputs(usage_text, stderr);
    return CLI_EXIT_USAGE;
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

static int write_output(const char *path, const void *data, size_t size)
{
    FILE *f = path ? fopen(path, "wb") : stdout;
    if (!f) {
        fprintf(stderr, "attnjit: cannot write '%s': %s\n", path, strerror(errno));
        return CLI_EXIT_INPUT;
    }
    size_t wrote = fwrite(data, 1, size, f);
    int bad = wrote != size || fflush(f) != 0;
    if (path && fclose(f) != 0)
        bad = 1;
    if (bad) {
        fprintf(stderr, "attnjit: cannot write '%s': %s\n", path ? path : "<stdout>",
                strerror(errno));
        return CLI_EXIT_INPUT;
    }
    return CLI_EXIT_OK;
}

static const char *const extent_names[AJ_EXTENT_COUNT] = {
    "1", "batch", "heads_q", "heads_kv", "seq_q", "seq_k"};
static const char *const param_type_names[AJ_PARAM_COUNT] = {"ptr", "i32", "i64", "f32"};

static void print_launch(const aj_kernel *kernel)
{
    aj_launch_info li;
    if (aj_kernel_launch_info(kernel, &li) != AJ_OK)
        return;
    fprintf(stderr, "entry: %s\n", aj_kernel_entry(kernel));
    fprintf(stderr, "block: %d x %d x %d threads\n", li.block[0], li.block[1], li.block[2]);
    fprintf(stderr, "grid:");
    for (int i = 0; i < 3; i++)
        fprintf(stderr, " %c = ceil(%s / %d)", "xyz"[i], extent_names[li.grid[i].extent],
                li.grid[i].per_block);
    fprintf(stderr, "\ndynamic shared memory: %d bytes\n", li.dynamic_smem);
    fprintf(stderr, "schedule: block_m = %d, block_n = %d, warps = %d, stages = %d\n",
            li.schedule.block_m, li.schedule.block_n, li.schedule.warps, li.schedule.stages);
    fprintf(stderr, "params (%d):", li.num_params);
    for (int i = 0; i < li.num_params; i++)
        fprintf(stderr, " %s:%s", li.params[i].name, param_type_names[li.params[i].type]);
    fprintf(stderr, "\n");
}

static int cmd_compile(aj_ctx *ctx, int argc, char **argv)
{
    const char *spec = NULL, *out_path = NULL, *target_name = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    int verbose = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--target") == 0 || strcmp(a, "--emit") == 0 ||
            strcmp(a, "-o") == 0 || strcmp(a, "-O") == 0) {
            if (i + 1 == argc)
                return cli_usage("%s needs a value", a);
            const char *v = argv[++i];
            if (strcmp(a, "--target") == 0) {
                target_name = v;
            } else if (strcmp(a, "-o") == 0) {
                out_path = v;
            } else if (strcmp(a, "-O") == 0) {
                if (strlen(v) != 1 || v[0] < '0' || v[0] > '3')
                    return cli_usage("-O takes 0, 1, 2 or 3, not '%s'", v);
                opt.opt_level = v[0] - '0';
            } else if (strcmp(v, "ptx") == 0) {
                opt.emit = AJ_EMIT_PTX;
            } else if (strcmp(v, "llvm") == 0) {
                opt.emit = AJ_EMIT_LLVM_IR;
            } else if (strcmp(v, "bc") == 0) {
                opt.emit = AJ_EMIT_BITCODE;
            } else {
                return cli_usage("--emit takes ptx, llvm or bc, not '%s'", v);
            }
        } else if (strcmp(a, "-v") == 0) {
            verbose = 1;
        } else if (a[0] == '-' && a[1] != '\0') {
            return cli_usage("unknown option '%s' for compile", a);
        } else if (spec) {
            return cli_usage("compile takes one SPEC; '%s' is a second", a);
        } else {
            spec = a;
        }
    }
    if (!spec)
        return cli_usage("compile needs a SPEC file%s", "");
    if (!target_name)
        return cli_usage("compile needs --target (sm_80, sm_90 or sm_90a)%s", "");
    aj_status st = aj_target_from_name(ctx, target_name, &opt.target);
    if (st != AJ_OK)
        return cli_usage("unknown target '%s' (sm_80, sm_90 or sm_90a)", target_name);

    aj_op *op = NULL;
    int rc = cli_load_op(ctx, spec, &op);
    if (rc != CLI_EXIT_OK)
        return rc;
    aj_kernel *kernel = NULL;
    st = aj_compile(ctx, op, &opt, &kernel);
    aj_op_destroy(op);
    if (st != AJ_OK)
        return cli_report(ctx, st);
    size_t size;
    const void *code = aj_kernel_code(kernel, &size);
    rc = write_output(out_path, code, size);
    if (verbose)
        print_launch(kernel);
    aj_kernel_destroy(kernel);
    return rc;
}

static int cmd_check(aj_ctx *ctx, int argc, char **argv)
{
    if (argc != 1)
        return cli_usage("check takes exactly one SPEC%s", "");
    aj_op *op = NULL;
    int rc = cli_load_op(ctx, argv[0], &op);
    if (rc != CLI_EXIT_OK)
        return rc;
    char *text = NULL;
    char hash[AJ_HASH_HEX_LEN + 1];
    aj_status st = aj_op_print(op, &text);
    if (st == AJ_OK)
        st = aj_op_hash(op, hash);
    aj_op_destroy(op);
    if (st != AJ_OK) {
        aj_free(text);
        return cli_report(ctx, st);
    }
    printf("%shash: %s\n", text, hash);
    aj_free(text);
    return CLI_EXIT_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage(NULL, NULL);
    const char *cmd = argv[1];
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        return CLI_EXIT_OK;
    }
    aj_ctx *ctx = NULL;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK) {
        fprintf(stderr, "attnjit: cannot create a context\n");
        return CLI_EXIT_INTERNAL;
    }
    int rc;
    if (strcmp(cmd, "compile") == 0)
        rc = cmd_compile(ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "check") == 0)
        rc = cmd_check(ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "run") == 0)
        rc = cli_run(ctx, argc - 2, argv + 2);
    else if (strcmp(cmd, "info") == 0)
        rc = argc == 2 ? cli_info() : cli_usage("info takes no arguments%s", "");
    else
        rc = cli_usage("unknown command '%s'", cmd);
    aj_ctx_destroy(ctx);
    return rc;
}
