/*
 * forward_sim.c -- the C API end to end, no GPU needed: build an op with the
 * builder, compile it for the `sim` target, run it on host tensors, and
 * check the result against a direct computation.
 *
 *   forward_sim            (prints the error against a plain double loop)
 *
 * On a GPU machine the same calls run on AJ_DEVICE_CUDA with device
 * pointers and a kernel compiled for sm_80 / sm_90.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attnjit/attnjit.h"

enum { B = 1, HQ = 4, HKV = 2, SQ = 100, SK = 100, D = 64 };

static int fail(aj_ctx *ctx, const char *what)
{
    fprintf(stderr, "forward_sim: %s: %s\n", what, aj_last_error(ctx));
    return 1;
}

/* Causal attention in double precision, one (batch, head) row at a time. */
static void direct_attention(const float *q, const float *k, const float *v, double *o,
                             double *lse)
{
    double scale = 1.0 / sqrt(D);
    for (int h = 0; h < HQ; h++) {
        int hk = h / (HQ / HKV);
        for (int i = 0; i < SQ; i++) {
            double s[SK], m = -INFINITY, sum = 0;
            for (int j = 0; j <= i; j++) {
                s[j] = 0;
                for (int x = 0; x < D; x++)
                    s[j] += (double)q[(h * SQ + i) * D + x] * k[(hk * SK + j) * D + x];
                s[j] *= scale;
                m = fmax(m, s[j]);
            }
            for (int x = 0; x < D; x++)
                o[(h * SQ + i) * D + x] = 0;
            for (int j = 0; j <= i; j++) {
                double p = exp(s[j] - m);
                sum += p;
                for (int x = 0; x < D; x++)
                    o[(h * SQ + i) * D + x] += p * v[(hk * SK + j) * D + x];
            }
            for (int x = 0; x < D; x++)
                o[(h * SQ + i) * D + x] /= sum;
            lse[h * SQ + i] = m + log(sum);
        }
    }
}

/* A contiguous BHSD f32 tensor view. */
static aj_tensor bhsd(float *data, int64_t b, int64_t h, int64_t s, int64_t d)
{
    aj_tensor t = {data, AJ_DTYPE_F32, 4, {b, h, s, d}, {h * s * d, s * d, d, 1}};
    return t;
}

int main(void)
{
    aj_ctx *ctx;
    aj_op *op;
    aj_kernel *kernel;
    aj_device *dev;
    if (aj_ctx_create(NULL, &ctx) != AJ_OK)
        return 1;

    /* 1. describe the op: causal f32 attention, head dim 64 */
    aj_op_create(ctx, AJ_KIND_FORWARD, AJ_VARIANT_EFFICIENT, &op);
    aj_op_set_dtype(op, AJ_DTYPE_F32);
    aj_op_set_head_dims(op, D, 0);
    aj_op_set_mask_causal(op, AJ_ALIGN_TOP_LEFT);

    /* 2. compile it for the emulator (errors of the setters surface here) */
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_SIM;
    opt.emit = AJ_EMIT_LLVM_IR;
    if (aj_compile(ctx, op, &opt, &kernel) != AJ_OK)
        return fail(ctx, "compile");
    if (aj_device_open(ctx, AJ_DEVICE_SIM, 0, &dev) != AJ_OK)
        return fail(ctx, "device");

    /* 3. run it on host tensors we own */
    static float q[B * HQ * SQ * D], k[B * HKV * SK * D], v[B * HKV * SK * D];
    static float o[B * HQ * SQ * D], lse[B * HQ * SQ];
    unsigned seed = 1;
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = (float)((seed = seed * 1103515245u + 12345u) >> 16 & 0x7fff) / 16384.0f - 1.0f;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        k[i] = (float)((seed = seed * 1103515245u + 12345u) >> 16 & 0x7fff) / 16384.0f - 1.0f;
        v[i] = (float)((seed = seed * 1103515245u + 12345u) >> 16 & 0x7fff) / 16384.0f - 1.0f;
    }
    aj_fwd_args args = AJ_FWD_ARGS_INIT;
    args.q = bhsd(q, B, HQ, SQ, D);
    args.k = bhsd(k, B, HKV, SK, D);
    args.v = bhsd(v, B, HKV, SK, D);
    args.o = bhsd(o, B, HQ, SQ, D);
    args.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {B, HQ, SQ}, {HQ * SQ, SQ, 1}};
    if (aj_forward(ctx, dev, kernel, &args) != AJ_OK)
        return fail(ctx, "forward");

    /* 4. compare with the direct computation */
    static double o_ref[B * HQ * SQ * D], lse_ref[B * HQ * SQ];
    direct_attention(q, k, v, o_ref, lse_ref);
    double err_o = 0, err_lse = 0;
    for (size_t i = 0; i < sizeof o / sizeof o[0]; i++)
        err_o = fmax(err_o, fabs(o[i] - o_ref[i]));
    for (size_t i = 0; i < sizeof lse / sizeof lse[0]; i++)
        err_lse = fmax(err_lse, fabs(lse[i] - lse_ref[i]));
    printf("%s on sim: B=%d Hq=%d Hkv=%d S=%d D=%d causal, %llu emulated thread-instructions\n",
           aj_kernel_entry(kernel), B, HQ, HKV, SQ, D,
           (unsigned long long)aj_device_last_instructions(dev));
    printf("max |O - direct| = %.2e, max |LSE - direct| = %.2e\n", err_o, err_lse);
    int ok = err_o < 1e-5 && err_lse < 1e-5;
    printf("%s\n", ok ? "OK: the GPU kernel's logic matches" : "MISMATCH");

    aj_device_close(dev);
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
    aj_ctx_destroy(ctx);
    return ok ? 0 : 1;
}
