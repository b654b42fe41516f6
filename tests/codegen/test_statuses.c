/*
 * test_statuses.c -- the statuses no user input reaches in normal use,
 * provoked on purpose so that each row of docs/errors.md has a test:
 * AJ_ERR_CODEGEN (a template that builds invalid LLVM IR), AJ_ERR_INTERNAL
 * (a template that misuses the kernel builder), AJ_ERR_IO (bytes that are
 * not a cached kernel), AJ_ERR_OUT_OF_MEMORY (an allocation that cannot be
 * had).  The process must survive each, with a message naming the problem.
 */
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "codegen/codegen.h"
#include "kb_kernel.h"
#include "runtime/sim/emulator.h"

/* A block without a terminator: the verifier after `build` rejects it. */
static aj_status build_unterminated(aj_kb *kb, const aj_op *op, void *user)
{
    aj_kb_add_param(kb, "x", AJ_PARAM_I32, AJ_KB_NO_ID);
    aj_kb_begin(kb, 32);
    LLVMAppendBasicBlockInContext(kb->llctx, kb->fn, "dangling");
    kb_kernel_finish_one_cta(kb);
    return AJ_OK;
}

/* Asks for a parameter it never declared. */
static aj_status build_unknown_param(aj_kb *kb, const aj_op *op, void *user)
{
    aj_kb_add_param(kb, "x", AJ_PARAM_I32, AJ_KB_NO_ID);
    aj_kb_begin(kb, 32);
    aj_kb_param(kb, "y");
    kb_kernel_finish_one_cta(kb);
    return AJ_OK;
}

static aj_status run_build(aj_ctx *ctx, aj_target target, aj_build_fn build)
{
    const char *text = "attention forward efficient { dtype = f32 head_dim = 8 }";
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    aj_op_parse(ctx, text, strlen(text), "t", &op);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = target;
    opt.emit = AJ_EMIT_LLVM_IR;
    aj_status st = aj_codegen_run(ctx, op, &opt, "broken", build, NULL, &k);
    CHECK(k == NULL || st == AJ_OK);
    aj_kernel_destroy(k);
    aj_op_destroy(op);
    return st;
}

int main(void)
{
    aj_ctx *ctx = NULL;
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);

    for (int t = 0; t < 2; t++) {
        aj_target target = t ? AJ_TARGET_SIM : AJ_TARGET_SM_90;
        CHECK_STATUS(ctx, run_build(ctx, target, build_unterminated), AJ_ERR_CODEGEN);
        CHECK_ERROR(ctx, "invalid LLVM IR after build");
        CHECK_STATUS(ctx, run_build(ctx, target, build_unknown_param), AJ_ERR_INTERNAL);
        CHECK_ERROR(ctx, "no kernel parameter named 'y'");
    }

    /* bytes that are not a kernel of this build */
    static const uint8_t garbage[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_kernel_deserialize(ctx, garbage, sizeof garbage, &k), AJ_ERR_IO);
    CHECK_ERROR(ctx, "not a kernel of this attnjit build");
    CHECK(k == NULL);

    /* memory that cannot be had */
    aj_device *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, AJ_DEVICE_SIM, 0, &dev), AJ_OK);
    void *p = NULL;
    CHECK_STATUS(ctx, aj_device_alloc(dev, SIZE_MAX / 2, &p), AJ_ERR_OUT_OF_MEMORY);
    CHECK_ERROR(ctx, "aj_device_alloc");
    CHECK(p == NULL);
    aj_device_close(dev);

    aj_ctx_destroy(ctx);
    return check_report();
}
