/*
 * bench_side_grad.c -- the cost of the gradients of side tensors
 * (docs/ir.md "Gradients of side tensors"): a backward whose score_mod
 * reads a learnable per-head relative bias (--mod rel) or the built-in
 * alibi's slopes (--mod alibi: alibi against alibi(grad)), run without
 * and with its gradient (aj_bwd_args.dside), launched in turn, the median
 * of each and their ratio.  The baseline is the same op's backward with
 * the tensor a constant (not declared grad), in the same process,
 * interleaved.  --dropout P and --bias 1 (bias = add, [B, H, S, S], and
 * its dbias, f32; the efficient variant) go into both.  --mod bias: the
 * baseline is bias = add with its dbias (written in place by the dq
 * kernel), the case the same bias as the program score + B[b, h, q, k]
 * over a grad side tensor B of the op's dtype, dB summed through the
 * side-gradient stages (docs/ir.md "bias"), both efficient.
 *
 *   bench_side_grad [--device cpu|sim|cuda] [--dtype f16|bf16|f32]
 *                   [--batch B] [--heads H] [--seq S] [--dim D]
 *                   [--causal 0|1] [--repeat N] [--mod rel|alibi|bias]
 *                   [--dropout P] [--bias 0|1]
 *
 * Prints one row: the shape, the two medians in ms and grad / no grad.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

typedef struct config {
    int batch, heads, seq, dim, causal, repeat, bias, alibi, program;
    double dropout;
    aj_dtype dtype;
    aj_device_kind device;
} config;

static aj_kernel *compile_bwd(aj_ctx *ctx, aj_device *dev, const config *c, int grad)
{
    char spec[512], mod[128];
    int bias = c->bias && !(c->program && grad);
    mod[0] = 0;   /* the program's baseline: bias = add alone */
    if (c->program && grad)
        snprintf(mod, sizeof mod, "tensors = (B: %s[4] grad) score_mod = expr(score + B[b, h, "
                 "q, k])", aj_dtype_name(c->dtype));
    else if (c->alibi)
        snprintf(mod, sizeof mod, "score_mod = alibi%s", grad ? "(grad)" : "");
    else if (!c->program)
        snprintf(mod, sizeof mod, "tensors = (rel: f32[2]%s) score_mod = expr(score + rel[h, "
                 "min(abs(q - k), 63)])", grad ? " grad" : "");
    snprintf(spec, sizeof spec,
             "attention backward %s { dtype = %s head_dim = %d mask = %s %s dropout = %g "
             "bias = %s }", c->dtype == AJ_DTYPE_F32 || c->bias ? "efficient" : "flash",
             aj_dtype_name(c->dtype), c->dim, c->causal ? "causal(bottom_right)" : "none", mod,
             c->dropout, bias ? "add" : "none");
    aj_op *op = NULL;
    aj_kernel *k = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    if (aj_op_parse(ctx, spec, strlen(spec), "bench", &op) != AJ_OK ||
        aj_compile(ctx, op, &opt, &k) != AJ_OK)
        fprintf(stderr, "bench_side_grad: %s\n", aj_last_error(ctx));
    aj_op_destroy(op);
    return k;
}

static void *device_zeros(aj_device *dev, size_t bytes)
{
    void *p = NULL, *host = calloc(1, bytes);
    if (aj_device_alloc(dev, bytes, &p) == AJ_OK)
        aj_device_copy_to(dev, p, host, bytes);
    free(host);
    return p;
}

/* A contiguous [B, H, S, W] tensor of dtype at p. */
static aj_tensor bhsd(void *p, aj_dtype dtype, const config *c, int w)
{
    aj_tensor t = {p, dtype, 4, {c->batch, c->heads, c->seq, w}, {0}};
    t.strides[3] = 1;
    t.strides[2] = w;
    t.strides[1] = (int64_t)c->seq * w;
    t.strides[0] = (int64_t)c->heads * c->seq * w;
    return t;
}

static double time_call(aj_ctx *ctx, aj_device *dev, const aj_kernel *k, const aj_bwd_args *a)
{
    double t0 = now_ms();
    aj_status st = aj_backward(ctx, dev, k, a);
    if (st == AJ_OK)
        st = aj_device_synchronize(dev, NULL);
    if (st != AJ_OK) {
        fprintf(stderr, "bench_side_grad: %s\n", aj_last_error(ctx));
        exit(1);
    }
    return now_ms() - t0;
}

int main(int argc, char **argv)
{
    config c = {.batch = 2, .heads = 8, .seq = 1024, .dim = 64, .causal = 1, .repeat = 7,
                .dtype = AJ_DTYPE_BF16, .device = AJ_DEVICE_CPU};
    const bench_int_option ints[] = {{"--batch", &c.batch}, {"--heads", &c.heads},
                                     {"--seq", &c.seq},     {"--dim", &c.dim},
                                     {"--causal", &c.causal}, {"--repeat", &c.repeat},
                                     {"--bias", &c.bias}};
    for (int i = 1; i < argc; i++) {
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (bench_int_arg(ints, (int)(sizeof ints / sizeof ints[0]), argv[i], value)) {
            i++;
        } else if (strcmp(argv[i], "--device") == 0 && value) {
            c.device = strcmp(value, "sim") == 0    ? AJ_DEVICE_SIM
                       : strcmp(value, "cuda") == 0 ? AJ_DEVICE_CUDA
                                                    : AJ_DEVICE_CPU;
            i++;
        } else if (strcmp(argv[i], "--mod") == 0 && value) {
            c.alibi = strcmp(value, "alibi") == 0;
            c.program = strcmp(value, "bias") == 0;
            c.bias = c.bias || c.program;
            i++;
        } else if (strcmp(argv[i], "--dropout") == 0 && value) {
            c.dropout = atof(value);
            i++;
        } else if (strcmp(argv[i], "--dtype") == 0 && value) {
            c.dtype = strcmp(value, "f16") == 0   ? AJ_DTYPE_F16
                      : strcmp(value, "f32") == 0 ? AJ_DTYPE_F32
                                                  : AJ_DTYPE_BF16;
            i++;
        } else {
            fprintf(stderr, "usage: bench_side_grad [--device cpu|sim|cuda] [--dtype "
                            "f16|bf16|f32] [--batch B] [--heads H] [--seq S] [--dim D] "
                            "[--causal 0|1] [--repeat N] [--mod rel|alibi|bias] [--dropout P] "
                            "[--bias 0|1]\n");
            return 2;
        }
    }
    if (c.repeat < 1)
        c.repeat = 1;
    aj_ctx *ctx;
    aj_device *dev;
    if (!bench_open(c.device, "bench_side_grad", &ctx, &dev))
        return 1;
    aj_kernel *plain = compile_bwd(ctx, dev, &c, 0), *grad = compile_bwd(ctx, dev, &c, 1);
    if (!plain || !grad)
        return 1;
    size_t es = (size_t)aj_dtype_size(c.dtype);
    size_t n = (size_t)c.batch * (size_t)c.heads * (size_t)c.seq * (size_t)c.dim;
    void *buf[9];
    for (int i = 0; i < 9; i++)
        buf[i] = device_zeros(dev, n * es);
    void *lse = device_zeros(dev, (size_t)c.batch * (size_t)c.heads * (size_t)c.seq * 4);
    void *rel = device_zeros(dev, (size_t)c.heads * 64 * 4);
    void *drel = device_zeros(dev, (size_t)c.heads * 64 * 4);
    aj_side_tensor side = {"rel", rel, AJ_SIDE_F32, 2, {c.heads, 64}, {64, 1}};
    aj_side_tensor dside = {"rel", drel, AJ_SIDE_F32, 2, {c.heads, 64}, {64, 1}};
    if (c.alibi)   /* rel's first row are the slopes */
        dside = (aj_side_tensor){"alibi_slopes", drel, AJ_SIDE_F32, 1, {c.heads}, {1}};
    const size_t nbias = (size_t)c.batch * (size_t)c.heads * (size_t)c.seq * (size_t)c.seq;
    void *bias = c.bias ? device_zeros(dev, nbias * es) : NULL;
    void *dbias = c.bias ? device_zeros(dev, nbias * 4) : NULL;
    aj_bwd_args a = AJ_BWD_ARGS_INIT;
    a.q = bhsd(buf[0], c.dtype, &c, c.dim), a.k = bhsd(buf[1], c.dtype, &c, c.dim);
    a.v = bhsd(buf[2], c.dtype, &c, c.dim), a.o = bhsd(buf[3], c.dtype, &c, c.dim);
    a.do_ = bhsd(buf[4], c.dtype, &c, c.dim), a.dq = bhsd(buf[5], c.dtype, &c, c.dim);
    a.dk = bhsd(buf[6], c.dtype, &c, c.dim), a.dv = bhsd(buf[7], c.dtype, &c, c.dim);
    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {c.batch, c.heads, c.seq},
                        {(int64_t)c.heads * c.seq, c.seq, 1}};
    a.side = &side, a.num_side = c.alibi ? 0 : 1;
    if (c.alibi)
        a.alibi_slopes = (aj_tensor){rel, AJ_DTYPE_F32, 1, {c.heads}, {1}};
    if (c.bias) {
        a.bias = (aj_tensor){bias, c.dtype, 4, {c.batch, c.heads, c.seq, c.seq},
                             {(int64_t)c.heads * c.seq * c.seq, (int64_t)c.seq * c.seq, c.seq, 1}};
        a.dbias = a.bias;
        a.dbias.data = dbias, a.dbias.dtype = AJ_DTYPE_F32;
    }
    a.seed = 1;
    aj_bwd_args with = a;
    with.dside = &dside, with.num_dside = 1;
    if (c.program) {   /* the bias as side tensor B, dbias as its gradient */
        side = (aj_side_tensor){"B", bias, c.dtype == AJ_DTYPE_F32 ? AJ_SIDE_F32
                                           : c.dtype == AJ_DTYPE_F16 ? AJ_SIDE_F16 : AJ_SIDE_BF16,
                                4, {0}, {0}};
        memcpy(side.shape, a.bias.shape, sizeof side.shape);
        memcpy(side.strides, a.bias.strides, sizeof side.strides);
        dside = side;
        dside.data = dbias, dside.dtype = AJ_SIDE_F32;
        a.num_side = 0;
        with.bias = with.dbias = (aj_tensor){0};
    }
    time_call(ctx, dev, plain, &a);   /* warm-up: first-touch and scratch */
    time_call(ctx, dev, grad, &with);
    double *t_plain = malloc(sizeof(double) * (size_t)c.repeat);
    double *t_grad = malloc(sizeof(double) * (size_t)c.repeat);
    for (int r = 0; r < c.repeat; r++) {
        t_plain[r] = time_call(ctx, dev, plain, &a);
        t_grad[r] = time_call(ctx, dev, grad, &with);
    }
    double mp = median(t_plain, c.repeat), mg = median(t_grad, c.repeat);
    printf("device %s, %s, B %d H %d S %d D %d %s%s%s, median of %d interleaved: no grad "
           "%.2f ms, with d%s %.2f ms, ratio %.2fx\n",
           aj_target_name(aj_device_target(dev)), aj_dtype_name(c.dtype), c.batch, c.heads,
           c.seq, c.dim, c.causal ? "causal" : "full", c.dropout > 0 ? ", dropout" : "",
           c.bias ? ", bias" : "", c.repeat, mp, c.program ? "B (bias = add: dbias)"
           : c.alibi ? "slopes" : "rel", mg, mg / mp);
    free(t_plain);
    free(t_grad);
    for (int i = 0; i < 9; i++)
        aj_device_free(dev, buf[i]);
    aj_device_free(dev, lse);
    aj_device_free(dev, rel);
    aj_device_free(dev, drel);
    aj_device_free(dev, bias);
    aj_device_free(dev, dbias);
    aj_kernel_destroy(plain);
    aj_kernel_destroy(grad);
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return 0;
}
