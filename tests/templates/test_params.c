/*
 * test_params.c -- the kernel parameter table (templates/params.def)
 * against the kernels: for every structural case of the sweep generator
 * (kind x variant x mask x score_mod x bias, each with and without
 * dropout, accumulate, deterministic, varlen, head dims and dtypes spread
 * over the cases), every score example (forward and backward) and the
 * merge, on a GPU target and on cpu, the parameters each stage of the
 * compiled kernel declares equal aj_op_kernel_params's list (names, types,
 * order), and the launcher binds every one of them; and the API's errors.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "runtime/runtime.h"
#include "spec_dir.h"
#include "sweep_cases.h"
#include "templates/params.h"

static int compared;   /* kernels whose lists were compared */

/* Whether the launcher of `kind` binds parameter d of `op`. */
static int launch_binds(const aj_param_desc *d, const aj_op_info *op, aj_kind kind)
{
    const aj_param_row *row = aj_param_find(d->name);
    if (row)
        return row->type == d->type && (aj_launch_sources(kind) >> row->source & 1);
    /* a side tensor's parameter: one the op declares, or alibi's slopes */
    if (strcmp(d->tensor, "alibi_slopes") == 0)
        return op->score_mod == AJ_SCORE_MOD_ALIBI;
    for (int t = 0; t < op->num_tensors; t++)
        if (strcmp(d->tensor, op->tensors[t].name) == 0)
            return 1;
    return 0;
}

/* Compiles `op` for target and compares each stage's parameters with the
 * table's; label names the case in failures.  An op the target's template
 * does not implement is not compared. */
static void compare(aj_ctx *ctx, const aj_op *op, aj_target target, const char *label)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    opt.emit = AJ_EMIT_LLVM_IR;
    opt.opt_level = 0;
    opt.bypass_cache = true;
    aj_kernel *kernel = NULL;
    aj_status st = aj_compile(ctx, op, &opt, &kernel);
    if (st == AJ_ERR_UNSUPPORTED)
        return;
    CHECK_MSG(st == AJ_OK, "%s on %s: %s", label, aj_target_name(target), aj_last_error(ctx));
    if (st != AJ_OK)
        return;
    aj_op_info info;
    aj_op_get_info(op, &info);
    int32_t stages = -1;
    aj_param_desc list[AJ_KB_MAX_PARAMS];
    for (int32_t s = 0; s < aj_kernel_num_stages(kernel); s++) {
        int32_t n = -1;
        st = aj_op_kernel_params(ctx, op, target, s, list, AJ_KB_MAX_PARAMS, &n, &stages);
        CHECK_MSG(st == AJ_OK && stages == aj_kernel_num_stages(kernel),
                  "%s on %s: %s, %d stages", label, aj_target_name(target),
                  aj_last_error(ctx), stages);
        aj_launch_info li;
        aj_kernel_stage_info(kernel, s, &li);
        CHECK_MSG(n == li.num_params, "%s on %s stage %d: the table lists %d parameters, the "
                  "kernel declares %d", label, aj_target_name(target), s, n, li.num_params);
        for (int i = 0; i < n && i < li.num_params; i++) {
            CHECK_MSG(strcmp(list[i].name, li.params[i].name) == 0 &&
                          list[i].type == li.params[i].type,
                      "%s on %s stage %d: parameter %d is %s in the table, %s in the kernel",
                      label, aj_target_name(target), s, i, list[i].name, li.params[i].name);
            CHECK_MSG(launch_binds(&list[i], &info, info.kind),
                      "%s on %s: the launcher binds no '%s'", label, aj_target_name(target),
                      list[i].name);
            for (int j = 0; j < i; j++)
                CHECK_MSG(strcmp(list[i].name, list[j].name) != 0, "%s: '%s' twice", label,
                          list[i].name);
        }
    }
    compared++;
    aj_kernel_destroy(kernel);
}

static const aj_target targets[] = {AJ_TARGET_SM_80, AJ_TARGET_CPU};

static void compare_text(aj_ctx *ctx, const char *text, const char *label)
{
    aj_op *op = NULL;
    aj_status st = aj_op_parse(ctx, text, strlen(text), label, &op);
    CHECK_MSG(st == AJ_OK, "%s: %s", label, aj_last_error(ctx));
    for (size_t t = 0; st == AJ_OK && t < sizeof targets / sizeof targets[0]; t++)
        compare(ctx, op, targets[t], label);
    aj_op_destroy(op);
}

/* The sweep's structural cases (every bias x mod x mask x variant x kind),
 * head dim and dtype moving with the case, each plain and with each option. */
static void sweep(aj_ctx *ctx)
{
    const int per_dim = 2 * SWEEP_N_MODS * SWEEP_N_MASKS;
    const int structural = per_dim * 2 * 2;
    for (int c = 0; c < structural; c++) {
        int low = c % per_dim, high = c / per_dim;   /* high: variant, kind */
        int dim = c % SWEEP_GPU_DIMS, dtype = c % SWEEP_N_DTYPES;   /* both targets take it */
        int index = low + per_dim * (dim + SWEEP_DIMS * (dtype + SWEEP_N_DTYPES * high));
        for (int option = 0; option < 4; option++) {
            sweep_case sc = sweep_case_at(index);
            sc.dropout = option == 1 ? 0.1 : 0;
            sc.accumulate = option == 2 && sc.kind == AJ_KIND_FORWARD;
            sc.deterministic = option == 2 && sc.kind == AJ_KIND_BACKWARD;
            sc.varlen = option == 3;
            if (!sweep_case_valid(&sc))
                continue;
            char spec[1024], label[256];
            sweep_spec(&sc, spec, sizeof spec);
            sweep_label(&sc, label, sizeof label);
            aj_op *op = NULL;
            if (aj_op_parse(ctx, spec, strlen(spec), label, &op) != AJ_OK)
                continue;   /* an option the IR refuses for the case (varlen with bias) */
            for (size_t t = 0; t < sizeof targets / sizeof targets[0]; t++)
                compare(ctx, op, targets[t], label);
            aj_op_destroy(op);
        }
    }
}

/* Each score example as written and as a backward. */
static void example(const char *name, const char *path, const char *text, size_t len,
                    void *user)
{
    (void)path;
    (void)len;
    aj_ctx *ctx = user;
    CHECK_MSG(text, "%s: unreadable", name);
    if (!text)
        return;
    compare_text(ctx, text, name);
    const char *fwd = strstr(text, "attention forward");
    CHECK_MSG(fwd, "%s: not a forward", name);
    if (!fwd)
        return;
    char *bwd = malloc(strlen(text) + 2);
    size_t at = (size_t)(fwd - text);
    sprintf(bwd, "%.*sattention backward%s", (int)at, text, fwd + strlen("attention forward"));
    compare_text(ctx, bwd, name);
    free(bwd);
}

static void api_errors(aj_ctx *ctx)
{
    aj_op *op = NULL;
    const char *spec = "attention backward efficient {\n  dtype = f16\n  head_dim = 64\n"
                       "  tensors = (doc: i32[2])\n  mask = expr(doc[b, q] == doc[b, k])\n}\n";
    CHECK(aj_op_parse(ctx, spec, strlen(spec), "bwd", &op) == AJ_OK);
    aj_param_desc list[AJ_KB_MAX_PARAMS];
    int32_t n = 0, stages = 0;
    CHECK_STATUS(ctx, aj_op_kernel_params(ctx, NULL, AJ_TARGET_CPU, 0, list, 4, &n, NULL),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_kernel_params: op is NULL");
    CHECK_STATUS(ctx, aj_op_kernel_params(ctx, op, AJ_TARGET_CPU, 0, list, 4, NULL, NULL),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_kernel_params: count is NULL");
    CHECK_STATUS(ctx, aj_op_kernel_params(ctx, op, AJ_TARGET_CPU, 0, NULL, 4, &n, NULL),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_kernel_params: params is NULL with cap = 4");
    CHECK_STATUS(ctx, aj_op_kernel_params(ctx, op, AJ_TARGET_CPU, 3, list, 4, &n, &stages),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_kernel_params: stage = 3; the cpu_bwd kernel has "
                "stages 0 .. 2");
    /* a count with a small cap, then the dq stage's side tensor and its dims */
    CHECK(aj_op_kernel_params(ctx, op, AJ_TARGET_CPU, 1, NULL, 0, &n, &stages) == AJ_OK);
    CHECK(stages == 3 && n > 5);   /* dkdv, dq and the fused plan's stage */
    int32_t total = n;
    CHECK(aj_op_kernel_params(ctx, op, AJ_TARGET_CPU, 1, list, AJ_KB_MAX_PARAMS, &n, NULL) ==
          AJ_OK && n == total);
    int found = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(list[i].name, "doc") == 0)
            found += list[i].type == AJ_PARAM_PTR && list[i].role == AJ_ROLE_INPUT &&
                     strcmp(list[i].tensor, "doc") == 0 && list[i].dim == -1;
        if (strcmp(list[i].name, "doc_stride1") == 0)
            found += list[i].type == AJ_PARAM_I64 && list[i].role == AJ_ROLE_STRIDE &&
                     list[i].dim == 1;
        if (strcmp(list[i].name, "stride_dq_h") == 0)
            found += list[i].role == AJ_ROLE_STRIDE && strcmp(list[i].tensor, "dq") == 0 &&
                     list[i].dim == 1;
        if (strcmp(list[i].name, "dq") == 0)
            found += list[i].role == AJ_ROLE_OUTPUT;
        if (strcmp(list[i].name, "heads_q") == 0)
            found += list[i].role == AJ_ROLE_SIZE && list[i].tensor[0] == '\0';
    }
    CHECK_MSG(found == 5, "found %d of the 5 rows looked for", found);
    aj_op_destroy(op);
    /* an op that does not verify: its own status */
    CHECK(aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_FLASH, &op) == AJ_OK);
    CHECK(aj_op_set_dropout(op, 2.0) != AJ_OK);
    CHECK_STATUS(ctx, aj_op_kernel_params(ctx, op, AJ_TARGET_CPU, 0, list, 4, &n, NULL),
                 AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_op_set_dropout: dropout 2.0 is out of range");
    aj_op_destroy(op);
}

/* Every name of the table (a launch value or a kernel parameter), tried
 * as a side tensor of a flash backward (the kernel with a workspace):
 * refused at verification, naming the clash -- a side tensor that
 * shadowed a parameter once compiled a kernel reading the wrong one. */
static void side_tensor_names(aj_ctx *ctx)
{
    static const char *const names[] = {
#define AJ_PSOURCE(nm, kind) #nm,
#define AJ_PARAM(nm, type, how, source, dim) #nm,
#include "templates/params.def"
    };
    int refused = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char text[512], want[160];
        snprintf(text, sizeof text, "attention backward flash {\n  dtype = f16\n  head_dim = 64\n"
                 "  tensors = (%s: f32[1])\n  mask = expr(%s[0] > 0.0 || k <= q)\n}\n",
                 names[i], names[i]);
        aj_op *op = NULL;
        aj_status st = aj_op_parse(ctx, text, strlen(text), "t.aj", &op);
        snprintf(want, sizeof want, "t.aj:4:3: tensor name '%s' is reserved (a kernel "
                 "parameter or launch tensor)", names[i]);
        CHECK_MSG(st == AJ_ERR_VERIFY && strstr(aj_last_error(ctx), want),
                  "side tensor '%s': %s (%s)", names[i], aj_status_str(st), aj_last_error(ctx));
        refused += st == AJ_ERR_VERIFY;
        aj_op_destroy(op);
    }
    printf("%d of %zu parameter-table names refused as side tensors\n", refused,
           sizeof names / sizeof names[0]);
}

int main(void)
{
    aj_ctx *ctx = NULL;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK)
        return 1;
    api_errors(ctx);
    side_tensor_names(ctx);
    sweep(ctx);
    int files = spec_dir_each(score_examples_dir(), example, ctx);
    CHECK_MSG(files >= 7, "%d score examples in %s", files, score_examples_dir());
    compare_text(ctx, "attention merge {\n  dtype = bf16\n  head_dim_v = 64\n}\n", "merge");
    printf("%d kernels' parameter lists compared with the table\n", compared);
    CHECK(compared >= 380);
    aj_ctx_destroy(ctx);
    return check_report();
}
