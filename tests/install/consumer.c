/*
 * consumer.c -- a program built against an installed attnjit (by
 * tests/install/test_install.sh, through find_package and through pkg-config):
 * it compiles a forward kernel for the cpu target and runs it on a problem
 * whose answer is known exactly: with one key, softmax gives it weight 1,
 * so O = V and LSE = scale * q.k.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <attnjit/attnjit.h>

#define D 16

static int fail(aj_ctx *ctx, const char *what, aj_status st)
{
    fprintf(stderr, "%s: %s: %s\n", what, aj_status_str(st), ctx ? aj_last_error(ctx) : "");
    return 1;
}

int main(void)
{
    aj_ctx *ctx = NULL;
    aj_device *dev = NULL;
    aj_op *op = NULL;
    aj_kernel *kernel = NULL;
    const char *spec = "attention forward flash { dtype = f32 head_dim = 16 }";
    aj_status st = aj_ctx_create(NULL, &ctx);
    if (st != AJ_OK)
        return fail(NULL, "aj_ctx_create", st);
    if ((st = aj_op_parse(ctx, spec, strlen(spec), "consumer", &op)) != AJ_OK)
        return fail(ctx, "aj_op_parse", st);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = AJ_TARGET_CPU;
    if ((st = aj_compile(ctx, op, &opt, &kernel)) != AJ_OK)
        return fail(ctx, "aj_compile", st);
    if ((st = aj_device_open(ctx, AJ_DEVICE_CPU, 0, &dev)) != AJ_OK)
        return fail(ctx, "aj_device_open", st);

    _Alignas(64) float q[D], k[D], v[D], o[D], lse[1];
    float dot = 0;
    for (int i = 0; i < D; i++) {
        q[i] = 0.1f * (float)i;
        k[i] = 0.05f * (float)(D - i);
        v[i] = (float)i - 3.0f;
        dot += q[i] * k[i];
    }
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    const aj_tensor t = {NULL, AJ_DTYPE_F32, 4, {1, 1, 1, D}, {D, D, D, 1}};
    a.q = t, a.q.data = q;
    a.k = t, a.k.data = k;
    a.v = t, a.v.data = v;
    a.o = t, a.o.data = o;
    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {1, 1, 1}, {1, 1, 1}};
    if ((st = aj_forward(ctx, dev, kernel, &a)) != AJ_OK)
        return fail(ctx, "aj_forward", st);
    int bad = fabsf(lse[0] - dot / sqrtf(D)) > 1e-5f;
    for (int i = 0; i < D; i++)
        bad |= o[i] != v[i];
    printf("attnjit %s (LLVM %s) on %s: %s\n", aj_version_string(), aj_llvm_version(),
           aj_device_name(dev), bad ? "WRONG" : "O = V, LSE = scale q.k");
    aj_device_close(dev);
    aj_kernel_destroy(kernel);
    aj_op_destroy(op);
    aj_ctx_destroy(ctx);
    return bad;
}
