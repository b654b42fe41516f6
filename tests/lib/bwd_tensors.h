/*
 * bwd_tensors.h -- the tensors of the backward tests (test_sim_backward.c,
 * test_sim_flash_bwd.c, test_sinks.c, test_side_grad.c): device memory with a host staging copy and a
 * double image that the float64 reference reads, and the norm-wise error
 * both tests check.
 *
 * Header-only with static functions, so that their CHECKs count in the
 * including test (check.h keeps its counters per file).  The includer
 * includes check.h and ref.h first and defines BWD_STORAGE_TOLERANCE or
 *
 *     static void tolerance_for(aj_dtype dtype, double *atol, double *rtol);
 *
 * (BWD_STORAGE_TOLERANCE: the dtype's storage rounding, ref.h's).
 */
#ifndef AJ_TESTS_BWD_TENSORS_H
#define AJ_TESTS_BWD_TENSORS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch_args.h"
#include "splitmix.h"

static void tolerance_for(aj_dtype dtype, double *atol, double *rtol);

#ifdef BWD_STORAGE_TOLERANCE
static void tolerance_for(aj_dtype dtype, double *atol, double *rtol)
{
    ref_storage_tolerance(dtype, atol, rtol);
}
#endif

/* A contiguous tensor in device memory, its host staging copy and its
 * double image. */
typedef struct tensor {
    aj_tensor t;
    void *host;
    double *ref;
    size_t n;
    aj_device *dev;
} tensor;

static size_t tensor_bytes(const tensor *x)
{
    return x->n * (x->t.dtype == AJ_DTYPE_F32 ? 4 : 2);
}

/* A contiguous tensor of `rank` dims (row-major strides). */
static void tensor_make(tensor *x, aj_device *dev, aj_dtype dtype, int rank,
                        const int64_t *shape)
{
    memset(x, 0, sizeof *x);
    x->dev = dev;
    x->n = 1;
    for (int i = 0; i < rank; i++)
        x->n *= (size_t)shape[i];
    int elem = dtype == AJ_DTYPE_F32 ? 4 : 2;
    void *data = NULL;
    CHECK(aj_device_alloc(dev, x->n * (size_t)elem + 16, &data) == AJ_OK);
    x->t = tensor_contiguous(data, dtype, rank, shape);
    x->host = malloc(x->n * (size_t)elem + 16);
    x->ref = calloc(x->n + 1, sizeof(double));
}

static void tensor_release(tensor *x)
{
    aj_device_free(x->dev, x->t.data);
    free(x->host);
    free(x->ref);
}

/* Stores the double image in the tensor's dtype and reads the rounded
 * values back into the image. */
static void store_rounded(tensor *x)
{
    float *f = malloc((x->n + 1) * sizeof *f);
    for (size_t i = 0; i < x->n; i++)
        f[i] = (float)x->ref[i];
    CHECK(aj_convert(f, AJ_DTYPE_F32, x->host, x->t.dtype, x->n) == AJ_OK);
    CHECK(aj_convert(x->host, x->t.dtype, f, AJ_DTYPE_F32, x->n) == AJ_OK);
    CHECK(aj_device_copy_to(x->dev, x->t.data, x->host, tensor_bytes(x)) == AJ_OK);
    for (size_t i = 0; i < x->n; i++)
        x->ref[i] = f[i];
    free(f);
}

/* Uniform values in [-magnitude, magnitude], rounded to the dtype. */
static void fill(tensor *x, double magnitude, uint64_t *rng)
{
    for (size_t i = 0; i < x->n; i++)
        x->ref[i] = magnitude * ((double)(splitmix_next(rng) >> 11) * 0x1p-52 - 1.0);
    store_rounded(x);
}

/* Reads a result back as doubles. */
static void read_back(const tensor *x, double *out)
{
    float *f = malloc((x->n + 1) * sizeof *f);
    CHECK(aj_device_copy_from(x->dev, x->host, x->t.data, tensor_bytes(x)) == AJ_OK);
    CHECK(aj_convert(x->host, x->t.dtype, f, AJ_DTYPE_F32, x->n) == AJ_OK);
    for (size_t i = 0; i < x->n; i++)
        out[i] = f[i];
    free(f);
}

/* NaN bits everywhere: an element the kernel never writes fails. */
static void poison(tensor *x)
{
    memset(x->host, 0xff, tensor_bytes(x));
    CHECK(aj_device_copy_to(x->dev, x->t.data, x->host, tensor_bytes(x)) == AJ_OK);
}

/* max |got - ref| / (atol + rtol max |ref|) with the dtype's pair
 * (tolerance_for): <= 1 passes; NaN fails. */
static double norm_error(const double *got, const double *ref, size_t n, aj_dtype dtype)
{
    double atol, rtol, mx = 0, err = 0;
    tolerance_for(dtype, &atol, &rtol);
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        if (!(e == e))
            return INFINITY;
        err = fmax(err, e);
    }
    return err / (atol + rtol * mx);
}

/* The op of spec text, or NULL (a failed CHECK naming the case by label). */
static inline aj_op *bwd_parse(aj_ctx *ctx, const char *spec, const char *label)
{
    aj_op *op = NULL;
    CHECK_MSG(aj_op_parse(ctx, spec, strlen(spec), label, &op) == AJ_OK, "%s: %s", label,
              aj_last_error(ctx));
    return op;
}

/* op (NULL: none) compiled for dev's target, or NULL (a failed CHECK). */
static inline aj_kernel *bwd_compile(aj_ctx *ctx, aj_device *dev, const aj_op *op,
                                     const char *label)
{
    aj_kernel *k = NULL;
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    if (op)
        CHECK_MSG(aj_compile(ctx, op, &opt, &k) == AJ_OK, "%s: %s", label, aj_last_error(ctx));
    return k;
}

/* The reference's mask fields from the IR mask text of a case. */
static inline void ref_mask(const char *mask, ref_problem *p)
{
    long long l = 0, r = 0;
    p->mask = AJ_MASK_NONE;
    if (strncmp(mask, "causal", 6) == 0)
        p->mask = AJ_MASK_CAUSAL;
    else if (sscanf(mask, "window(%lld, %lld", &l, &r) == 2)
        p->mask = AJ_MASK_WINDOW;
    p->window_left = l;
    p->window_right = r;
    p->align = strstr(mask, "bottom_right") ? AJ_ALIGN_BOTTOM_RIGHT : AJ_ALIGN_TOP_LEFT;
}

#endif /* AJ_TESTS_BWD_TENSORS_H */
