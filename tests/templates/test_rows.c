/*
 * test_rows.c -- the row kernels the context-parallel methods run on a GPU
 * (templates/rows.c, aj_rows_launch): every stage against the same
 * arithmetic on the host, for f16, bf16 and f32 and widths 8 .. 1024 (every
 * multiple of 8 up to 64, then a spread to the limit), on the views the
 * ring passes -- a run of rows inside a longer accumulator, strided -- with
 * rows whose LSE is -inf.  A width the kernels lack is refused.
 *
 *   test_rows        on sim; and the kernels' PTX for sm_80, sm_90 and
 *                    sm_90a through ptxas (where found) with no spills
 *   test_rows cuda   on the stand-in libcuda with emulated launches
 *                    (AJ_CUDA_EMULATE=1): the same numbers through the cuda
 *                    device's launch path
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ptxas_util.h"
#include "splitmix.h"
#include "runtime/runtime.h"
#include "templates/template.h"

enum { B = 2, H = 3, S_ACC = 7, ROW0 = 2, ROWS = 4 };

static aj_ctx *ctx;
static aj_device *dev;

static size_t elem_size(aj_dtype dt)
{
    return dt == AJ_DTYPE_F32 ? 4 : 2;
}

/* x rounded to dtype and back */
static float rounded(float x, aj_dtype dt)
{
    uint16_t h;
    float back = x;
    if (dt != AJ_DTYPE_F32) {
        CHECK(aj_convert(&x, AJ_DTYPE_F32, &h, dt, 1) == AJ_OK);
        CHECK(aj_convert(&h, dt, &back, AJ_DTYPE_F32, 1) == AJ_OK);
    }
    return back;
}

static void *on_device(const void *host, size_t bytes)
{
    void *d = NULL;
    CHECK_STATUS(ctx, aj_device_alloc(dev, bytes, &d), AJ_OK);
    CHECK_STATUS(ctx, aj_device_copy_to(dev, d, host, bytes), AJ_OK);
    return d;
}

/* One stage at one width: acc [B, H, S_ACC, W] f32 (its rows ROW0 ..
 * ROW0 + ROWS the view), o [B, H, ROWS, W] of dt with a row stride of
 * W + 8, lse [B, H, S_ACC] with every third row -inf. */
static void check_stage(const aj_kernel *k, aj_dtype dt, int w, aj_rows_stage stage,
                        uint64_t *rng)
{
    const int64_t ow = w + 8;   /* o's row stride: a gap after each row */
    const size_t n_acc = (size_t)(B * H * S_ACC * w), n_o = (size_t)(B * H * ROWS * ow);
    float *acc = malloc(n_acc * 4), *want_acc = malloc(n_acc * 4), *lse = malloc(B * H * S_ACC * 4);
    float *o_f = malloc(n_o * 4), *want_o = malloc(n_o * 4), *got_f = malloc(n_acc * 4 + n_o * 4);
    void *o = malloc(n_o * 4);
    for (size_t i = 0; i < n_acc; i++)
        acc[i] = (float)((double)(splitmix_next(rng) >> 11) * 0x1p-53 * 4.0 - 2.0);
    for (size_t i = 0; i < n_o; i++)
        o_f[i] = rounded((float)((double)(splitmix_next(rng) >> 11) * 0x1p-53 * 4.0 - 2.0), dt);
    for (int i = 0; i < B * H * S_ACC; i++)
        lse[i] = i % 3 == 1 ? -INFINITY : (float)i * 0.25f;
    CHECK(aj_convert(o_f, AJ_DTYPE_F32, o, dt, n_o) == AJ_OK);
    memcpy(want_acc, acc, n_acc * 4);
    memcpy(want_o, o_f, n_o * 4);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int r = 0; r < ROWS; r++) {
                const size_t row = (size_t)((b * H + h) * S_ACC + ROW0 + r);
                float *a = want_acc + row * (size_t)w;
                float *t = want_o + (size_t)((b * H + h) * ROWS + r) * (size_t)ow;
                for (int c = 0; c < w; c++) {
                    switch (stage) {
                    case AJ_ROWS_ROUND_MASKED:
                        t[c] = lse[row] == -INFINITY ? 0.0f : rounded(a[c], dt);
                        break;
                    case AJ_ROWS_ROUND:
                        t[c] = rounded(a[c], dt);
                        break;
                    case AJ_ROWS_ADD:
                        a[c] += t[c];
                        break;
                    case AJ_ROWS_STORE:
                        a[c] = t[c];
                        break;
                    default:
                        a[c] = 0;
                        break;
                    }
                }
            }
    void *d_acc = on_device(acc, n_acc * 4), *d_o = on_device(o, n_o * elem_size(dt));
    void *d_lse = on_device(lse, B * H * S_ACC * 4);
    const aj_tensor acc_t = {(float *)d_acc + ROW0 * w, AJ_DTYPE_F32, 4, {B, H, ROWS, w},
                             {(int64_t)H * S_ACC * w, (int64_t)S_ACC * w, w, 1}};
    const aj_tensor o_t = {d_o, dt, 4, {B, H, ROWS, w},
                           {(int64_t)H * ROWS * ow, (int64_t)ROWS * ow, ow, 1}};
    const aj_tensor lse_t = {(float *)d_lse + ROW0, AJ_DTYPE_F32, 3, {B, H, ROWS},
                             {(int64_t)H * S_ACC, S_ACC, 1}};
    CHECK_STATUS(ctx, aj_rows_launch(ctx, dev, k, (int)stage, &o_t, &acc_t,
                                     stage == AJ_ROWS_ROUND_MASKED ? &lse_t : NULL, NULL),
                 AJ_OK);
    CHECK_STATUS(ctx, aj_device_synchronize(dev, NULL), AJ_OK);
    CHECK_STATUS(ctx, aj_device_copy_from(dev, got_f, d_acc, n_acc * 4), AJ_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < n_acc; i++)
        wrong += memcmp(&got_f[i], &want_acc[i], 4) != 0;
    CHECK_STATUS(ctx, aj_device_copy_from(dev, o, d_o, n_o * elem_size(dt)), AJ_OK);
    CHECK(aj_convert(o, dt, got_f, AJ_DTYPE_F32, n_o) == AJ_OK);
    for (size_t i = 0; i < n_o; i++)
        wrong += memcmp(&got_f[i], &want_o[i], 4) != 0;
    CHECK_MSG(wrong == 0, "%s, width %d, stage %d: %zu elements differ", aj_dtype_name(dt), w,
              (int)stage, wrong);
    aj_device_free(dev, d_acc);
    aj_device_free(dev, d_o);
    aj_device_free(dev, d_lse);
    free(acc), free(want_acc), free(lse), free(o_f), free(want_o), free(got_f), free(o);
}

/* The widest kernels' PTX through ptxas for each GPU target. */
static int check_ptx(void)
{
    char ptxas[1024];
    if (!ptxas_find(ptxas, sizeof ptxas))
        return ptxas_missing("the row kernels");
    static const aj_target targets[] = {AJ_TARGET_SM_80, AJ_TARGET_SM_90, AJ_TARGET_SM_90A};
    static const aj_dtype dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};
    for (size_t t = 0; t < 3; t++)
        for (size_t d = 0; d < 3; d++)
            for (int w = 8; w <= 1024; w *= 2) {
                aj_kernel *k = NULL;
                CHECK_STATUS(ctx, aj_compile_rows(ctx, targets[t], dtypes[d], w, &k), AJ_OK);
                if (!k)
                    continue;
                size_t n = 0;
                const char *ptx = aj_kernel_code(k, &n);
                ptxas_result r;
                ptxas_run(ptxas, aj_target_name(targets[t]), ptx, n, &r);
                CHECK_MSG(r.exit_code == 0 && r.spill_stores <= 0 && r.spill_loads <= 0,
                          "%s %s width %d: ptxas exit %d, spills %d/%d:\n%s",
                          aj_target_name(targets[t]), aj_dtype_name(dtypes[d]), w, r.exit_code,
                          r.spill_stores, r.spill_loads, r.log);
                aj_kernel_destroy(k);
            }
    return 0;
}

int main(int argc, char **argv)
{
    const int cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    CHECK_STATUS(ctx, aj_device_open(ctx, cuda ? AJ_DEVICE_CUDA : AJ_DEVICE_SIM, 0, &dev), AJ_OK);
    if (!dev)
        return check_report();
    static const int widths[] = {8,  16,  24,  32,  40,  48,  56,  64,  72,  96, 128,
                                 136, 192, 256, 264, 384, 512, 520, 576, 768, 1024};
    static const aj_dtype dtypes[] = {AJ_DTYPE_F16, AJ_DTYPE_BF16, AJ_DTYPE_F32};
    uint64_t rng = 0x70775u;
    for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++)
        for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) {
            aj_kernel *k = NULL;
            CHECK_STATUS(ctx, aj_compile_rows(ctx, aj_device_target(dev), dtypes[d], widths[i],
                                              &k), AJ_OK);
            for (int s = 0; k && s < AJ_ROWS_STAGE_COUNT; s++)
                check_stage(k, dtypes[d], widths[i], (aj_rows_stage)s, &rng);
            aj_kernel_destroy(k);
        }
    /* what the kernels lack */
    if (!cuda)
        CHECK(check_ptx() == 0);
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, aj_compile_rows(ctx, aj_device_target(dev), AJ_DTYPE_F16, 12, &k),
                 AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "head_dim_v = 12: the row kernels take multiples of 8 up to 1024");
    aj_device_close(dev);
    aj_ctx_destroy(ctx);
    return check_report();
}
