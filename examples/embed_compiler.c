/*
 * embed_compiler.c -- what a compiler that embeds attnjit does: describe
 * the attention op it met in its own IR through the builder API, and take
 * back code plus everything needed to emit the launch itself: PTX for the
 * GPU, LLVM bitcode to link into its own module, and the launch contract
 * (threads, grid rule, shared memory, parameter list).  Nothing is
 * launched and no GPU is needed.
 *
 *   embed_compiler [OUT_DIR]     (writes kernel.ptx and kernel.bc there)
 */
#include <stdio.h>
#include <string.h>

#include "attnjit/attnjit.h"

static int fail(aj_ctx *ctx, const char *what)
{
    fprintf(stderr, "embed_compiler: %s: %s\n", what, aj_last_error(ctx));
    return 1;
}

static const char *param_type_name(aj_param_type t)
{
    static const char *const names[] = {"ptr", "i32", "i64", "f32"};
    return (unsigned)t < AJ_PARAM_COUNT ? names[t] : "?";
}

static int write_file(const char *dir, const char *name, const void *data, size_t size)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size) {
        perror(path);
        if (f)
            fclose(f);
        return 1;
    }
    printf("wrote %s (%zu bytes)\n", path, size);
    return fclose(f) != 0;
}

/* Compiles op for sm_90 in one emission form. */
static aj_status compile_as(aj_ctx *ctx, const aj_op *op, aj_emit emit, aj_kernel **out)
{
    aj_compile_options options = AJ_COMPILE_OPTIONS_INIT;
    options.target = AJ_TARGET_SM_90;
    options.emit = emit;
    return aj_compile(ctx, op, &options, out);
}

int main(int argc, char **argv)
{
    aj_ctx *ctx = NULL;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK)
        return 1;
    int rc = 1;
    aj_op *op = NULL;
    aj_kernel *ptx = NULL, *bc = NULL;

    /* The op as the host compiler saw it: bf16, head dim 128, a sliding
     * window of 256 keys behind each query, logits soft-capped at 50. */
    aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_EFFICIENT, &op);
    aj_op_set_dtype(op, AJ_DTYPE_BF16);
    aj_op_set_head_dims(op, 128, 0);
    aj_op_set_mask_window(op, 256, 0, AJ_ALIGN_BOTTOM_RIGHT);
    aj_op_set_softcap(op, 50.0);
    if (aj_op_verify(op) != AJ_OK) {
        rc = fail(ctx, "op");
        goto out;
    }

    /* its canonical text and hash: what the host compiler can key its own
     * caches on */
    char *text = NULL, hash[AJ_HASH_HEX_LEN + 1];
    if (aj_op_print(op, &text) != AJ_OK || aj_op_hash(op, hash) != AJ_OK) {
        rc = fail(ctx, "print");
        goto out;
    }
    printf("op %s:\n%s\n", hash, text);
    aj_free(text);

    if (compile_as(ctx, op, AJ_EMIT_PTX, &ptx) != AJ_OK ||
        compile_as(ctx, op, AJ_EMIT_BITCODE, &bc) != AJ_OK) {
        rc = fail(ctx, "compile");
        goto out;
    }
    size_t ptx_size = 0, bc_size = 0;
    const char *ptx_code = aj_kernel_code(ptx, &ptx_size);
    const unsigned char *bc_code = aj_kernel_code(bc, &bc_size);
    /* PTX text names its entry; bitcode starts with 'B' 'C' 0xC0DE */
    if (!strstr(ptx_code, ".entry") || !strstr(ptx_code, aj_kernel_entry(ptx)) ||
        bc_size < 4 || memcmp(bc_code, "BC\xc0\xde", 4) != 0) {
        fprintf(stderr, "embed_compiler: unexpected code\n");
        goto out;
    }

    /* the launch contract: all a host compiler needs to emit the launch */
    aj_launch_info info;
    aj_kernel_launch_info(ptx, &info);
    printf("entry %s: %zu bytes of PTX, %zu bytes of bitcode\n", aj_kernel_entry(ptx),
           ptx_size, bc_size);
    printf("block (%d, %d, %d) threads, %d bytes of dynamic shared memory\n", info.block[0],
           info.block[1], info.block[2], info.dynamic_smem);
    printf("grid  (");
    for (int i = 0; i < 3; i++)
        printf("%sceil(%s / %d)", i ? ", " : "", aj_extent_name(info.grid[i].extent),
               info.grid[i].per_block);
    printf(")\nschedule block_m = %d, block_n = %d, warps = %d\n", info.schedule.block_m,
           info.schedule.block_n, info.schedule.warps);
    printf("%d parameters:", info.num_params);
    for (int i = 0; i < info.num_params; i++)
        printf("%s %s %s", i % 6 ? "," : "\n ", param_type_name(info.params[i].type),
               info.params[i].name);
    printf("\n");

    rc = 0;
    if (argc > 1)
        rc = write_file(argv[1], "kernel.ptx", ptx_code, ptx_size) ||
             write_file(argv[1], "kernel.bc", bc_code, bc_size);
out:
    aj_kernel_destroy(ptx);
    aj_kernel_destroy(bc);
    aj_op_destroy(op);
    aj_ctx_destroy(ctx);
    return rc;
}
