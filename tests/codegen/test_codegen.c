/*
 * test_codegen.c -- aj_compile: argument checks, options no template
 * implements (AJ_ERR_UNSUPPORTED naming the option), the three emission
 * forms, the launch contract, determinism, the stage dump, and the cut
 * of long host blocks (aj_host_split_blocks).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <llvm-c/Analysis.h>

#include "check.h"
#include "codegen/codegen.h"
#include "spec_compile.h"

static aj_op *parse(aj_ctx *ctx, const char *body)
{
    char text[1024];
    snprintf(text, sizeof text, "attention forward efficient {\n%s\n}\n", body);
    aj_op *op = NULL;
    aj_status st = aj_op_parse(ctx, text, strlen(text), "t.aj", &op);
    CHECK_MSG(st == AJ_OK, "parse failed: %s", aj_last_error(ctx));
    return op;
}

static aj_status compile_text(aj_ctx *ctx, const char *text, aj_target target)
{
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    aj_kernel *k = NULL;
    aj_status st = spec_compile(ctx, text, "u.aj", &opt, &k);
    aj_kernel_destroy(k);
    return st;
}

/* Specs the IR accepts but no template implements: status and message. */
static void test_unsupported(aj_ctx *ctx)
{
    static const struct {
        const char *text;
        aj_target target;
        const char *needle;
    } cases[] = {
        {"attention backward flash { dtype = f32 head_dim = 64 }", AJ_TARGET_SM_80,
         "dtype = f32: flash backward runs on tensor cores"},
        {"attention backward flash { dtype = f16 head_dim = 36 }", AJ_TARGET_SM_80,
         "head_dim = 36: flash backward supports multiples of 8 up to 512"},
        {"attention backward flash { dtype = bf16 head_dim = 64 head_dim_v = 520 }",
         AJ_TARGET_SM_80, "head_dim_v = 520: flash backward"},
        {"attention backward flash { dtype = f16 head_dim = 64 schedule = (block_m = 256) }",
         AJ_TARGET_SM_80, "block_m = 256, block_n = 64: flash backward supports 16, 32, 64"},
        {"attention backward flash { dtype = f16 head_dim = 64 schedule = (warps = 16) }",
         AJ_TARGET_SM_80, "warps = 16: flash backward supports 1, 2, 4 or 8"},
        {"attention backward flash { dtype = f16 head_dim = 64 schedule = (stages = 3) }",
         AJ_TARGET_SM_80, "stages = 3: flash backward supports 1 or 2"},
        {"attention backward flash { dtype = f16 head_dim = 64 "
         "schedule = (block_m = 128, block_n = 16, warps = 1) }", AJ_TARGET_SM_80,
         "cannot tile a 128 x 64 product"},
        {"attention backward flash { dtype = f16 head_dim = 256 "
         "schedule = (block_m = 64, block_n = 64, warps = 4) }", AJ_TARGET_SM_90,
         "448 f32 accumulators per thread"},
        {"attention backward flash { dtype = f16 head_dim = 64 deterministic = true "
         "schedule = (block_m = 128, block_n = 128, warps = 8, stages = 2) }", AJ_TARGET_SM_80,
         "needs 181248 bytes of shared memory at head_dim 64/64; sm_80 allows"},
        {"attention backward efficient { dtype = f16 head_dim = 64 layout = varlen }",
         AJ_TARGET_SM_80, "layout = varlen: efficient backward"},
        {"attention backward efficient { dtype = f16 head_dim = 100 }", AJ_TARGET_SM_80,
         "head_dim = 100: efficient backward"},
        /* flash forward: what its tensor-core template does not take */
        {"attention forward flash { dtype = f32 head_dim = 64 }", AJ_TARGET_SM_80,
         "dtype = f32: flash forward runs on f16 / bf16 tensor cores; use `attention "
         "forward efficient` for f32"},
        {"attention forward flash { dtype = f16 head_dim = 100 }", AJ_TARGET_SM_80,
         "head_dim = 100: flash forward supports multiples of 8 up to 512"},
        {"attention forward flash { dtype = bf16 head_dim = 64 head_dim_v = 76 }",
         AJ_TARGET_SM_80, "head_dim_v = 76: flash forward supports multiples of 8 up to 512"},
        {"attention forward flash { dtype = f16 head_dim = 64 schedule = (block_m = 256) }",
         AJ_TARGET_SM_80, "schedule: block_m = 256 is not supported by flash forward "
         "(allowed: 16, 32, 64 or 128)"},
        {"attention forward flash { dtype = f16 head_dim = 64 schedule = (block_n = 256) }",
         AJ_TARGET_SM_80, "block_n = 256 is not supported by flash forward (allowed: 16, 32, "
         "64 or 128)"},
        {"attention forward flash { dtype = f16 head_dim = 64 schedule = (warps = 16) }",
         AJ_TARGET_SM_80, "warps = 16 is not supported by flash forward (allowed: 1, 2, 4 or 8)"},
        {"attention forward flash { dtype = f16 head_dim = 64 schedule = (stages = 4) }",
         AJ_TARGET_SM_90, "stages = 4 is not supported by flash forward (allowed: 1, 2 or 3)"},
        {"attention forward flash { dtype = f16 head_dim = 64 "
         "schedule = (block_m = 128, warps = 2) }", AJ_TARGET_SM_80,
         "block_m = 128 with warps = 2: flash forward gives each warp 16 or 32 rows "
         "(block_m = 32 or 64)"},
        {"attention forward flash { dtype = f16 head_dim = 256 "
         "schedule = (block_m = 128, block_n = 128, warps = 4) }", AJ_TARGET_SM_80,
         "keeps 392 f32 values per thread at head_dim_v 256 (budget 148)"},
        {"attention forward flash { dtype = f16 head_dim = 256 head_dim_v = 32 "
         "schedule = (block_m = 128, block_n = 128, warps = 8, stages = 3) }", AJ_TARGET_SM_80,
         "stages = 3 needs 301056 bytes of shared memory at head_dim 256/32; sm_80 allows "
         "166912"},
        {"attention merge { dtype = f32 head_dim_v = 100 }", AJ_TARGET_SM_80,
         "head_dim_v = 100: merge supports multiples of 8"},
        {"attention forward efficient { dtype = f16 head_dim = 64 layout = varlen "
         "bias = add }", AJ_TARGET_SM_80, "bias = add with layout = varlen: the efficient "
         "forward on sim and GPUs takes a bias over padded tensors only"},
        {"attention forward efficient { dtype = f16 head_dim = 100 }", AJ_TARGET_SM_80,
         "head_dim = 100"},
        {"attention forward efficient { dtype = f16 head_dim = 520 }", AJ_TARGET_SM_90,
         "head_dim = 520: efficient forward supports multiples of 8 up to 512"},
        {"attention backward flash { dtype = f16 head_dim = 520 }", AJ_TARGET_SM_90,
         "head_dim = 520: flash backward supports multiples of 8 up to 512"},
        {"attention forward efficient { dtype = f16 head_dim = 64 head_dim_v = 12 }",
         AJ_TARGET_SM_80, "head_dim_v = 12"},
        {"attention forward efficient { dtype = f16 head_dim = 64 schedule = (stages = 2) }",
         AJ_TARGET_SM_80, "stages = 2"},
        {"attention forward efficient { dtype = f16 head_dim = 64 schedule = (block_m = 256) }",
         AJ_TARGET_SM_80, "block_m"},
        {"attention forward efficient { dtype = f16 head_dim = 64 schedule = (warps = 16) }",
         AJ_TARGET_SM_80, "warps"},
        {"attention forward efficient { dtype = f16 head_dim = 8 "
         "schedule = (block_m = 16, warps = 8) }", AJ_TARGET_SM_80, "row groups"},
        {"attention forward efficient { dtype = f32 head_dim = 256 "
         "schedule = (block_m = 128, block_n = 128) }", AJ_TARGET_SM_90, "registers"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        aj_status st = compile_text(ctx, cases[i].text, cases[i].target);
        CHECK_MSG(st == AJ_ERR_UNSUPPORTED, "case %zu: %s (%s)", i, aj_status_str(st),
                  aj_last_error(ctx));
        CHECK_ERROR(ctx, cases[i].needle);
    }
}

/* AJ_EMIT_AUTO (the default) gives each target its own form; PTX asked
 * for a host target is refused. */
static void test_emit_forms(aj_ctx *ctx)
{
    static const struct {
        aj_target target;
        aj_emit want;
        const char *ptx_error;
    } targets[] = {
        {AJ_TARGET_SM_90, AJ_EMIT_PTX, NULL},
        {AJ_TARGET_SIM, AJ_EMIT_LLVM_IR, "emit ptx needs a GPU target; sim kernels"},
        {AJ_TARGET_CPU, AJ_EMIT_LLVM_IR, "emit ptx needs a GPU target; cpu kernels"},
    };
    aj_op *op = parse(ctx, "dtype = f16\nhead_dim = 64");
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        CHECK(opt.emit == AJ_EMIT_AUTO);
        opt.target = targets[i].target;
        aj_kernel *k = NULL;
        CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
        CHECK_MSG(aj_kernel_emit(k) == targets[i].want, "%s: emit %d",
                  aj_target_name(targets[i].target), (int)aj_kernel_emit(k));
        aj_kernel_destroy(k);
        if (!targets[i].ptx_error)
            continue;
        opt.emit = AJ_EMIT_PTX;
        CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_UNSUPPORTED);
        CHECK_ERROR(ctx, targets[i].ptx_error);
    }
    aj_op_destroy(op);
}

static void test_bad_arguments(aj_ctx *ctx)
{
    aj_op *op = parse(ctx, "dtype = f16\nhead_dim = 64");
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_compile(ctx, NULL, NULL, &k), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "op is NULL");
    CHECK_STATUS(ctx, aj_compile(ctx, op, NULL, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "out is NULL");
    CHECK(aj_compile(NULL, op, NULL, &k) == AJ_ERR_INVALID_ARG);

    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.struct_size = 3;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "struct_size");
    opt = (aj_compile_options)AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_ANY;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "options->target");
    opt.target = (aj_target)77;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_INVALID_ARG);
    opt = (aj_compile_options)AJ_COMPILE_OPTIONS_INIT;
    opt.emit = (aj_emit)9;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "options->emit");
    opt = (aj_compile_options)AJ_COMPILE_OPTIONS_INIT;
    opt.opt_level = 4;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "opt_level");
    CHECK(k == NULL);

    /* an op pinned to one target cannot be compiled for another */
    CHECK_STATUS(ctx, aj_op_set_target(op, AJ_TARGET_SM_90), AJ_OK);
    opt = (aj_compile_options)AJ_COMPILE_OPTIONS_INIT;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "pinned to target sm_90");

    /* a sticky builder error comes back from aj_compile */
    aj_op_set_target(op, AJ_TARGET_ANY);
    CHECK(aj_op_set_dropout(op, 2.0) != AJ_OK);
    CHECK(aj_compile(ctx, op, NULL, &k) != AJ_OK);
    CHECK_ERROR(ctx, "dropout");
    CHECK(k == NULL);
    aj_op_destroy(op);
}

static void test_emission(aj_ctx *ctx)
{
    aj_op *op = parse(ctx, "dtype = bf16\nhead_dim = 128\nmask = causal(bottom_right)");
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    aj_kernel *ptx = NULL, *ptx2 = NULL, *ir = NULL, *bc = NULL;
    opt.target = AJ_TARGET_SM_90;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &ptx), AJ_OK);
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &ptx2), AJ_OK);
    opt.emit = AJ_EMIT_LLVM_IR;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &ir), AJ_OK);
    opt.emit = AJ_EMIT_BITCODE;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &bc), AJ_OK);
    if (!ptx || !ptx2 || !ir || !bc)
        goto done;

    size_t n1, n2, nir, nbc;
    const char *p1 = aj_kernel_code(ptx, &n1);
    const char *p2 = aj_kernel_code(ptx2, &n2);
    CHECK_MSG(n1 == n2 && memcmp(p1, p2, n1) == 0, "PTX differs between two compiles");
    CHECK(strncmp(aj_kernel_entry(ptx), "aj_efficient_fwd_", 17) == 0);
    char entry_line[128];
    snprintf(entry_line, sizeof entry_line, ".entry %s", aj_kernel_entry(ptx));
    CHECK(strstr(p1, entry_line) != NULL);
    CHECK(strstr(p1, ".target sm_90") != NULL);
    CHECK(strstr(p1, ".maxntid 128, 1, 1") != NULL);
    CHECK(strstr(p1, "ex2.approx") != NULL);
    CHECK(strstr(p1, "shfl.sync.bfly") != NULL);
    CHECK(strstr(p1, "cvt.rn.bf16.f32") != NULL);
    CHECK(aj_kernel_emit(ptx) == AJ_EMIT_PTX && aj_kernel_target(ptx) == AJ_TARGET_SM_90);

    const char *text = aj_kernel_code(ir, &nir);
    CHECK(strstr(text, "define ptx_kernel void @aj_efficient_fwd_") != NULL);
    CHECK(strstr(text, "nvvm.annotations") != NULL);
    CHECK(strstr(text, "nvptx64-nvidia-cuda") != NULL);
    const unsigned char *bits = aj_kernel_code(bc, &nbc);
    CHECK(nbc > 4 && bits[0] == 'B' && bits[1] == 'C' && bits[2] == 0xC0 && bits[3] == 0xDE);

    aj_launch_info li;
    CHECK_STATUS(ctx, aj_kernel_launch_info(ptx, &li), AJ_OK);
    CHECK(li.block[0] == 128 && li.block[1] == 1 && li.block[2] == 1);
    CHECK(li.grid[0].extent == AJ_EXTENT_SEQ_Q && li.grid[0].per_block == 32);
    CHECK(li.grid[1].extent == AJ_EXTENT_HEADS_Q && li.grid[1].per_block == 1);
    CHECK(li.grid[2].extent == AJ_EXTENT_BATCH);
    CHECK(li.schedule.block_m == 32 && li.schedule.block_n == 32 && li.schedule.warps == 4 &&
          li.schedule.stages == 1);
    /* Q tile 32x132, K/V tile 32x132, P 32x36, all f32 */
    CHECK(li.dynamic_smem == 4 * (32 * 132 + 32 * 132 + 32 * 36));
    /* bottom_right's program reads the totals (score.h) */
    CHECK(li.num_params == 27);
    CHECK(strcmp(li.params[0].name, "q") == 0 && li.params[0].type == AJ_PARAM_PTR);
    CHECK(strcmp(li.params[4].name, "lse") == 0);
    CHECK(strcmp(li.params[5].name, "stride_q_b") == 0 && li.params[5].type == AJ_PARAM_I64);
    CHECK(strcmp(li.params[24].name, "kv_offset") == 0);
    CHECK(strcmp(li.params[25].name, "seq_q_total") == 0 && li.params[25].type == AJ_PARAM_I64);
    CHECK(strcmp(li.params[26].name, "seq_k_total") == 0);
    CHECK(aj_kernel_launch_info(NULL, &li) == AJ_ERR_INVALID_ARG);
done:
    aj_kernel_destroy(ptx);
    aj_kernel_destroy(ptx2);
    aj_kernel_destroy(ir);
    aj_kernel_destroy(bc);
    aj_op_destroy(op);
}

/* A backward op is one module of two kernels, dK/dV then dQ: both are in
 * the PTX with their own launch contracts, and survive the disk cache's
 * byte form. */
static void test_stages(aj_ctx *ctx)
{
    const char *text = "attention backward efficient { dtype = bf16 head_dim = 128 "
                       "head_dim_v = 64 mask = causal(bottom_right) }";
    aj_op *op = NULL;
    aj_kernel *k = NULL, *back = NULL;
    uint8_t *bytes = NULL;
    size_t size = 0;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "b.aj", &op), AJ_OK);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.bypass_cache = true;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
    if (!k)
        goto done;
    CHECK(aj_kernel_num_stages(k) == 2);
    const char *dkdv = aj_kernel_stage_entry(k, 0), *dq = aj_kernel_stage_entry(k, 1);
    CHECK(dkdv && strncmp(dkdv, "aj_efficient_bwd_", 17) == 0 &&
          strcmp(dkdv + strlen(dkdv) - 5, "_dkdv") == 0);
    CHECK(dq && strcmp(dq + strlen(dq) - 3, "_dq") == 0);
    CHECK(strcmp(aj_kernel_entry(k), dkdv) == 0);
    CHECK(aj_kernel_stage_entry(k, 2) == NULL && aj_kernel_stage_entry(k, -1) == NULL);
    const char *ptx = aj_kernel_code(k, NULL);
    char line[160];
    for (int s = 0; s < 2; s++) {
        snprintf(line, sizeof line, ".entry %s", aj_kernel_stage_entry(k, s));
        CHECK_MSG(strstr(ptx, line) != NULL, "PTX lacks '%s'", line);
    }
    aj_launch_info l0, l1, compat;
    CHECK(aj_kernel_stage_info(k, 0, &l0) == AJ_OK && aj_kernel_stage_info(k, 1, &l1) == AJ_OK);
    CHECK(aj_kernel_launch_info(k, &compat) == AJ_OK && compat.params == l0.params);
    CHECK(l0.grid[0].extent == AJ_EXTENT_SEQ_K && l0.grid[1].extent == AJ_EXTENT_HEADS_KV);
    CHECK(l1.grid[0].extent == AJ_EXTENT_SEQ_Q && l1.grid[1].extent == AJ_EXTENT_HEADS_Q);
    CHECK(l0.block[0] == 128 && l1.block[0] == 128);
    int has_dk = 0, has_dq = 0;
    for (int i = 0; i < l0.num_params; i++)
        has_dk |= strcmp(l0.params[i].name, "dk") == 0;
    for (int i = 0; i < l1.num_params; i++)
        has_dq |= strcmp(l1.params[i].name, "dq") == 0;
    CHECK(has_dk && has_dq);
    CHECK(aj_kernel_stage_info(k, 2, &l0) == AJ_ERR_INVALID_ARG);
    CHECK(aj_kernel_stage_info(NULL, 0, &l0) == AJ_ERR_INVALID_ARG);
    CHECK(aj_kernel_num_stages(NULL) == 0);

    CHECK_STATUS(ctx, aj_kernel_serialize(ctx, k, &bytes, &size), AJ_OK);
    CHECK_STATUS(ctx, aj_kernel_deserialize(ctx, bytes, size, &back), AJ_OK);
    if (back) {
        CHECK(aj_kernel_num_stages(back) == 2);
        CHECK(strcmp(aj_kernel_stage_entry(back, 1), dq) == 0);
        aj_launch_info b1;
        aj_kernel_stage_info(back, 1, &b1);
        aj_kernel_stage_info(k, 1, &l1);
        CHECK(b1.num_params == l1.num_params && b1.dynamic_smem == l1.dynamic_smem &&
              b1.grid[0].extent == l1.grid[0].extent);
    }
    /* a truncated entry is not a kernel */
    aj_kernel *bad = NULL;
    CHECK_STATUS(ctx, aj_kernel_deserialize(ctx, bytes, size / 2, &bad), AJ_ERR_IO);
done:
    free(bytes);
    aj_kernel_destroy(back);
    aj_kernel_destroy(k);
    aj_op_destroy(op);
}

/* Whether stage `stage` of op on the cpu takes a parameter `name`
 * (aj_op_kernel_params). */
static int stage_takes(aj_ctx *ctx, const aj_op *op, int stage, const char *name)
{
    aj_param_desc params[AJ_KB_MAX_PARAMS];
    int32_t count = 0;
    CHECK_STATUS(ctx, aj_op_kernel_params(ctx, op, AJ_TARGET_CPU, stage, params,
                                          AJ_KB_MAX_PARAMS, &count, NULL), AJ_OK);
    for (int i = 0; i < count && i < AJ_KB_MAX_PARAMS; i++)
        if (strcmp(params[i].name, name) == 0)
            return 1;
    return 0;
}

/* The cpu backward's two plans (docs/cpu.md "The backward"): split
 * stages and a fused one where the op can fuse, else every stage run and
 * the fused one's place unused; the plans survive the byte form; a GPU
 * kernel's stages are all run. */
static void test_stage_plans(aj_ctx *ctx)
{
    static const struct {
        const char *text;
        aj_target target;
        int plans[3];
    } cases[] = {
        {"attention backward flash { dtype = bf16 head_dim = 64 mask = causal(top_left) }",
         AJ_TARGET_CPU, {AJ_STAGE_SPLIT, AJ_STAGE_SPLIT, AJ_STAGE_FUSED}},
        {"attention backward efficient { dtype = f32 head_dim = 32 bias = add }", AJ_TARGET_CPU,
         {AJ_STAGE_EVERY, AJ_STAGE_EVERY, AJ_STAGE_UNUSED}},
        {"attention backward efficient { dtype = f16 head_dim = 64 }", AJ_TARGET_SM_80,
         {AJ_STAGE_EVERY, AJ_STAGE_EVERY, -1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        aj_op *op = NULL;
        aj_kernel *k = NULL, *back = NULL;
        uint8_t *bytes = NULL;
        size_t size = 0;
        CHECK_STATUS(ctx, aj_op_parse(ctx, cases[i].text, strlen(cases[i].text), "p.aj", &op),
                     AJ_OK);
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = cases[i].target;
        opt.bypass_cache = true;
        CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
        if (k && aj_kernel_serialize(ctx, k, &bytes, &size) == AJ_OK)
            CHECK_STATUS(ctx, aj_kernel_deserialize(ctx, bytes, size, &back), AJ_OK);
        for (int s = 0; k && s < 3; s++) {
            CHECK_MSG(aj_kernel_stage_plan(k, s) == cases[i].plans[s], "%s: stage %d plan %d",
                      cases[i].text, s, aj_kernel_stage_plan(k, s));
            CHECK(!back || aj_kernel_stage_plan(back, s) == cases[i].plans[s]);
        }
        if (cases[i].target == AJ_TARGET_CPU) {
            /* the workspace only where the op fuses */
            int fuses = cases[i].plans[2] == AJ_STAGE_FUSED;
            CHECK(stage_takes(ctx, op, 2, "workspace") == fuses);
            CHECK(stage_takes(ctx, op, 2, "dq") && stage_takes(ctx, op, 2, "dk"));
        }
        free(bytes);
        aj_kernel_destroy(back);
        aj_kernel_destroy(k);
        aj_op_destroy(op);
    }
    CHECK(aj_kernel_stage_plan(NULL, 0) == -1);
}

static int dumped;

static void capture_log(void *user, aj_log_level level, const char *message)
{
    if (level == AJ_LOG_DEBUG && strstr(message, "module after optimize") &&
        strstr(message, "define ptx_kernel"))
        dumped++;
}

static void test_dump_after(void)
{
    aj_ctx_config cfg = AJ_CTX_CONFIG_INIT;
    cfg.log_fn = capture_log;
    cfg.log_level = AJ_LOG_DEBUG;
    aj_ctx *ctx = NULL;
    CHECK(aj_ctx_create(&cfg, &ctx) == AJ_OK);
    aj_op *op = parse(ctx, "dtype = f16\nhead_dim = 64");
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.dump_after = "optimize";
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_compile(ctx, op, &opt, &k), AJ_OK);
    CHECK(dumped == 1);
    aj_kernel_destroy(k);
    aj_op_destroy(op);
    aj_ctx_destroy(ctx);
}

static void test_intrinsic_table(aj_ctx *ctx)
{
    CHECK_STATUS(ctx, aj_intrinsics_check(ctx), AJ_OK);
    CHECK(strcmp(aj_intrinsic_name(AJ_INTR_EX2_APPROX), "EX2_APPROX") == 0);
    CHECK(strcmp(aj_llvm_version(), "19") > 0 && strncmp(aj_llvm_version(), "19.", 3) == 0);
    CHECK(aj_ptx_version(AJ_TARGET_SIM) == NULL);
}


/* ------------------------------------------------------ long host blocks */

/* i64 f(i64 n): a long entry block, then a loop whose one block starts
 * with `phis` phis and runs `ops` more instructions before branching back
 * to itself. */
static LLVMValueRef long_blocks(LLVMModuleRef mod, int phis, int ops)
{
    LLVMContextRef c = LLVMGetModuleContext(mod);
    LLVMTypeRef i64 = LLVMInt64TypeInContext(c);
    LLVMValueRef fn = LLVMAddFunction(mod, "f", LLVMFunctionType(i64, &i64, 1, 0));
    LLVMBasicBlockRef entry = LLVMAppendBasicBlockInContext(c, fn, "entry");
    LLVMBasicBlockRef loop = LLVMAppendBasicBlockInContext(c, fn, "loop");
    LLVMBasicBlockRef exit = LLVMAppendBasicBlockInContext(c, fn, "exit");
    LLVMBuilderRef b = LLVMCreateBuilderInContext(c);
    LLVMPositionBuilderAtEnd(b, entry);
    LLVMValueRef n = LLVMGetParam(fn, 0), x = n;
    for (int k = 0; k < ops; k++)
        x = LLVMBuildAdd(b, LLVMBuildMul(b, x, n, ""), LLVMConstInt(i64, (unsigned)k, 0), "");
    LLVMBuildBr(b, loop);
    LLVMPositionBuilderAtEnd(b, loop);
    LLVMValueRef phi[16] = {0}, next[16] = {0};
    for (int p = 0; p < phis; p++)
        phi[p] = LLVMBuildPhi(b, i64, "");
    LLVMValueRef y = phi[0];
    for (int k = 0; k < ops; k++)
        y = LLVMBuildXor(b, LLVMBuildAdd(b, y, phi[k % phis], ""), x, "");
    for (int p = 0; p < phis; p++)
        next[p] = LLVMBuildAdd(b, phi[p], p ? y : LLVMConstInt(i64, 1, 0), "");
    LLVMBuildCondBr(b, LLVMBuildICmp(b, LLVMIntULT, next[0], n, ""), loop, exit);
    for (int p = 0; p < phis; p++) {
        LLVMValueRef values[2] = {p ? x : LLVMConstInt(i64, 0, 0), next[p]};
        LLVMBasicBlockRef from[2] = {entry, loop};
        LLVMAddIncoming(phi[p], values, from, 2);
    }
    LLVMPositionBuilderAtEnd(b, exit);
    LLVMBuildRet(b, y);
    LLVMDisposeBuilder(b);
    return fn;
}

/* fn's instructions in layout order, unconditional branches left out
 * (the cut adds only those), as opcodes and operand counts; and the
 * length of its longest block and of its longest block without phis. */
static int layout(LLVMValueRef fn, int *code, int cap, int *longest, int *longest_plain)
{
    int n = 0;
    *longest = *longest_plain = 0;
    for (LLVMBasicBlockRef bb = LLVMGetFirstBasicBlock(fn); bb; bb = LLVMGetNextBasicBlock(bb)) {
        int here = 0, phis = 0;
        for (LLVMValueRef i = LLVMGetFirstInstruction(bb); i; i = LLVMGetNextInstruction(i)) {
            here++;
            phis += LLVMIsAPHINode(i) != NULL;
            if (LLVMIsABranchInst(i) && !LLVMIsConditional(i))
                continue;
            CHECK(n < cap);
            if (n < cap)
                code[n++] = (int)LLVMGetInstructionOpcode(i) * 8 + LLVMGetNumOperands(i);
        }
        *longest = here > *longest ? here : *longest;
        if (!phis)
            *longest_plain = here > *longest_plain ? here : *longest_plain;
    }
    return n;
}

static void test_split_blocks(void)
{
    enum { CAP = 1024 };
    static const int shapes[][3] = {   /* phis, ops, limit */
        {2, 40, 5}, {2, 40, 1}, {9, 30, 4}, {3, 7, 200}, {1, 100, 16},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int phis = shapes[s][0], ops = shapes[s][1], limit = shapes[s][2];
        LLVMContextRef c = LLVMContextCreate();
        LLVMModuleRef mod = LLVMModuleCreateWithNameInContext("split", c);
        LLVMValueRef fn = long_blocks(mod, phis, ops);
        static int before[CAP], after[CAP];
        int longest = 0, plain = 0;
        const int n = layout(fn, before, CAP, &longest, &plain);
        const unsigned blocks = LLVMCountBasicBlocks(fn);
        aj_host_split_blocks(mod, limit);
        char *msg = NULL;
        CHECK_MSG(!LLVMVerifyModule(mod, LLVMReturnStatusAction, &msg),
                  "phis %d ops %d limit %d: %s", phis, ops, limit, msg);
        LLVMDisposeMessage(msg);
        CHECK(layout(fn, after, CAP, &longest, &plain) == n);
        CHECK_MSG(memcmp(before, after, sizeof *before * (size_t)n) == 0,
                  "limit %d: the instructions moved out of order", limit);
        /* a block holds `limit` instructions and a branch; the first of
         * a cut block keeps all its phis */
        CHECK_MSG(plain <= limit + 1 && longest <= (phis > limit ? phis : limit) + 1,
                  "limit %d: blocks of %d (%d without phis)", limit, longest, plain);
        if (2 * ops + 1 > limit + 1)
            CHECK(LLVMCountBasicBlocks(fn) > blocks);
        else
            CHECK(LLVMCountBasicBlocks(fn) == blocks);
        /* the function's entry is the first run of the old entry: nothing
         * branches to it */
        LLVMBasicBlockRef first = LLVMGetEntryBasicBlock(fn);
        for (LLVMBasicBlockRef bb = first; bb; bb = LLVMGetNextBasicBlock(bb)) {
            LLVMValueRef term = LLVMGetBasicBlockTerminator(bb);
            for (unsigned k = 0; k < LLVMGetNumSuccessors(term); k++)
                CHECK(LLVMGetSuccessor(term, k) != first);
        }
        LLVMDisposeModule(mod);
        LLVMContextDispose(c);
    }
}

int main(void)
{
    aj_ctx *ctx = NULL;
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    test_intrinsic_table(ctx);
    test_emit_forms(ctx);
    test_bad_arguments(ctx);
    test_unsupported(ctx);
    test_emission(ctx);
    test_stages(ctx);
    test_stage_plans(ctx);
    test_dump_after();
    test_split_blocks();
    aj_ctx_destroy(ctx);
    return check_report();
}
