/*
 * cli_compile.c -- `attnjit compile` and `attnjit check`.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"

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

static const char *const param_type_names[AJ_PARAM_COUNT] = {"ptr", "i32", "i64", "f32",
                                                             "byval128"};

/* The launch contract of every kernel of the module, in launch order. */
static void print_launch(const aj_kernel *kernel)
{
    int32_t stages = aj_kernel_num_stages(kernel);
    for (int32_t s = 0; s < stages; s++) {
        aj_launch_info li;
        if (aj_kernel_stage_info(kernel, s, &li) != AJ_OK)
            return;
        if (stages > 1)
            fprintf(stderr, "stage %d of %d\n", s + 1, stages);
        fprintf(stderr, "entry: %s\n", aj_kernel_stage_entry(kernel, s));
        fprintf(stderr, "block: %d x %d x %d threads\n", li.block[0], li.block[1], li.block[2]);
        fprintf(stderr, "grid:");
        for (int i = 0; i < 3; i++)
            fprintf(stderr, " %c = ceil(%s / %d)", "xyz"[i], aj_extent_name(li.grid[i].extent),
                    li.grid[i].per_block);
        fprintf(stderr, "\ndynamic shared memory: %d bytes\n", li.dynamic_smem);
        fprintf(stderr, "schedule: block_m = %d, block_n = %d, warps = %d, stages = %d\n",
                li.schedule.block_m, li.schedule.block_n, li.schedule.warps,
                li.schedule.stages);
        fprintf(stderr, "params (%d):", li.num_params);
        for (int i = 0; i < li.num_params; i++)
            fprintf(stderr, " %s:%s", li.params[i].name, param_type_names[li.params[i].type]);
        fprintf(stderr, "\n");
    }
}

int cli_parse_compile_args(aj_ctx *ctx, int argc, char **argv, cli_compile_opts *o)
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
        } else if (strcmp(a, "--no-cache") == 0) {
            opt.bypass_cache = true;
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
    if (aj_target_from_name(ctx, target_name, &opt.target) != AJ_OK ||
        opt.target == AJ_TARGET_ANY)
        return cli_usage("unknown target '%s' (sm_80, sm_90 or sm_90a)", target_name);
    o->spec = spec;
    o->out_path = out_path;
    o->options = opt;
    o->verbose = verbose;
    return CLI_EXIT_OK;
}

int cli_compile(aj_ctx *ctx, int argc, char **argv)
{
    cli_compile_opts o;
    int rc = cli_parse_compile_args(ctx, argc, argv, &o);
    if (rc != CLI_EXIT_OK)
        return rc;
    aj_op *op = NULL;
    rc = cli_load_op(ctx, o.spec, &op);
    if (rc != CLI_EXIT_OK)
        return rc;
    aj_kernel *kernel = NULL;
    aj_status st = aj_compile(ctx, op, &o.options, &kernel);
    aj_op_destroy(op);
    if (st != AJ_OK)
        return cli_report(ctx, st);
    size_t size;
    const void *code = aj_kernel_code(kernel, &size);
    rc = write_output(o.out_path, code, size);
    if (o.verbose)
        print_launch(kernel);
    aj_kernel_destroy(kernel);
    return rc;
}

int cli_check(aj_ctx *ctx, int argc, char **argv)
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

