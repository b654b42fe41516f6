/*
 * test_device.c -- the device interface (runtime/runtime.h, aj_device_ops):
 * every kind's table fills every slot (stage_resources, the one optional
 * slot, where the kind has a driver to ask), its capabilities match what
 * the kind is, and aj_device_get_caps / aj_device_kind_caps /
 * aj_device_time / aj_device_stream_create behave, errors included.
 *
 *   test_device        sim and cpu (cuda: its table and kind capabilities)
 *   test_device cuda   also a cuda device on the stand-in libcuda
 *                      (tests/fake_cuda, FAKE_CUDA_MODE=gpu: an sm_90 GPU
 *                      with 132 SMs and 227 KiB of opt-in shared memory)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "spec_compile.h"
#include "runtime/runtime.h"

static aj_ctx *ctx;

/* What each kind is: its capabilities as aj_device_get_caps reports them
 * (max_shared_bytes -1: the host's; multiprocessors -1: at least 1). */
static const struct {
    aj_device_kind kind;
    const char *name;
    aj_target target;
    bool host_memory, streams, indexed, simt, worker_threads, counts_instructions;
    int32_t max_shared_bytes, multiprocessors, cc_major, cc_minor;
} expected[] = {
    {AJ_DEVICE_SIM, "sim", AJ_TARGET_SIM, 1, 0, 0, 1, 0, 1, 227 * 1024, -1, 0, 0},
    {AJ_DEVICE_CUDA, "cuda", AJ_TARGET_SM_90, 0, 1, 1, 1, 0, 0, 232448, 132, 9, 0},
    {AJ_DEVICE_CPU, "cpu", AJ_TARGET_CPU, 1, 0, 0, 0, 1, 0, 0, -1, 0, 0},
};
_Static_assert(sizeof expected / sizeof expected[0] == AJ_DEVICE_KIND_COUNT, "every kind");

/* Every slot of a kind's table is set; stage_resources where the kind has
 * a driver (streams). */
static void check_table(aj_device_kind kind)
{
    const aj_device_ops *ops = aj_device_ops_of(kind);
    CHECK_MSG(ops && ops->kind_caps.kind == kind, "kind %d has no table of its own",
              (int)kind);
    if (!ops)
        return;
    const char *name = ops->kind_caps.kind_name;
    CHECK(name && strcmp(name, aj_device_kind_name(kind)) == 0);
    CHECK(ops->kind_caps.struct_size == sizeof(aj_device_caps));
    CHECK_MSG(ops->tune_batch > 0 && ops->tune_heads > 0 && ops->tune_seq > 0,
              "%s: no tuning problem size", name);
#define SLOT(f) CHECK_MSG(ops->f != NULL, "%s: ops->" #f " is NULL", name)
    SLOT(open);
    SLOT(close);
    SLOT(target);
    SLOT(device_name);
    SLOT(caps);
    SLOT(alloc);
    SLOT(free);
    SLOT(host_alloc);
    SLOT(host_free);
    SLOT(copy);
    SLOT(copy_async);
    SLOT(fill32_async);
    SLOT(copy2d_async);
    SLOT(stream_create);
    SLOT(stream_destroy);
    SLOT(synchronize);
    SLOT(wait);
    SLOT(time);
    SLOT(scratch);
    SLOT(scratch_release);
    SLOT(load_kernel);
    SLOT(launch);
#undef SLOT
    CHECK_MSG((ops->stage_resources != NULL) == ops->kind_caps.streams,
              "%s: stage_resources is for the kinds with a driver", name);
}

static void check_kind_caps(int i)
{
    aj_device_caps c = AJ_DEVICE_CAPS_INIT;
    CHECK(aj_device_kind_caps(expected[i].kind, &c) == AJ_OK);
    CHECK(c.struct_size == sizeof c && c.kind == expected[i].kind);
    CHECK(c.kind_name && strcmp(c.kind_name, expected[i].name) == 0);
    CHECK(c.target == (expected[i].kind == AJ_DEVICE_CUDA ? AJ_TARGET_ANY : expected[i].target));
    CHECK_MSG(c.host_memory == expected[i].host_memory && c.streams == expected[i].streams &&
                  c.indexed == expected[i].indexed && c.simt == expected[i].simt &&
                  c.worker_threads == expected[i].worker_threads &&
                  c.counts_instructions == expected[i].counts_instructions,
              "%s: the kind's flags differ", expected[i].name);
    CHECK_MSG(c.max_shared_bytes == 0 && c.multiprocessors == 0 && c.cc_major == 0 &&
                  c.driver_version == 0, "%s: a kind's caps have a device's numbers",
              expected[i].name);
}

static aj_status add_one(void *user)
{
    ++*(int *)user;
    return AJ_OK;
}

static aj_status refuse(void *user)
{
    (void)user;
    return aj_fail(ctx, AJ_ERR_UNSUPPORTED, "refused by the test");
}

static void check_device(int i)
{
    aj_device *dev = NULL;
    CHECK_STATUS(ctx, aj_device_open(ctx, expected[i].kind, 0, &dev), AJ_OK);
    if (!dev)
        return;
    aj_device_caps c = AJ_DEVICE_CAPS_INIT;
    CHECK_STATUS(ctx, aj_device_get_caps(dev, &c), AJ_OK);
    CHECK(c.kind == expected[i].kind && c.target == expected[i].target);
    CHECK(c.target == aj_device_target(dev));
    CHECK(c.host_memory == expected[i].host_memory && c.streams == expected[i].streams &&
          c.simt == expected[i].simt && c.worker_threads == expected[i].worker_threads);
    CHECK_MSG(c.max_shared_bytes == expected[i].max_shared_bytes, "%s: max_shared_bytes %d",
              expected[i].name, c.max_shared_bytes);
    CHECK_MSG(expected[i].multiprocessors < 0 ? c.multiprocessors >= 1
                                              : c.multiprocessors == expected[i].multiprocessors,
              "%s: multiprocessors %d", expected[i].name, c.multiprocessors);
    CHECK(c.cc_major == expected[i].cc_major && c.cc_minor == expected[i].cc_minor);
    CHECK_MSG((c.driver_version > 0) == (expected[i].kind == AJ_DEVICE_CUDA),
              "%s: driver_version %d", expected[i].name, c.driver_version);

    /* a newer caller's larger struct: ours filled, the rest zeroed, its size kept */
    struct {
        aj_device_caps caps;
        int64_t later_field;
    } newer = {.caps = AJ_DEVICE_CAPS_INIT, .later_field = -1};
    newer.caps.struct_size = sizeof newer;
    CHECK_STATUS(ctx, aj_device_get_caps(dev, &newer.caps), AJ_OK);
    CHECK(newer.caps.struct_size == sizeof newer && newer.later_field == 0);
    CHECK(newer.caps.multiprocessors == c.multiprocessors);

    /* streams: the device's own on cuda, NULL where calls run to completion */
    void *stream = (void *)&c;
    CHECK_STATUS(ctx, aj_device_stream_create(dev, &stream), AJ_OK);
    CHECK_MSG((stream != NULL) == c.streams, "%s: stream %p", expected[i].name, stream);
    int runs = 0;
    double ms = -1;
    CHECK_STATUS(ctx, aj_device_time(dev, stream, add_one, &runs, &ms), AJ_OK);
    CHECK(runs == 1 && ms >= 0);
    CHECK_STATUS(ctx, aj_device_time(dev, stream, refuse, NULL, &ms), AJ_ERR_UNSUPPORTED);
    CHECK_ERROR(ctx, "refused by the test");
    CHECK_STATUS(ctx, aj_device_time(dev, stream, NULL, NULL, &ms), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_device_time: run or ms is NULL");
    CHECK_STATUS(ctx, aj_device_synchronize(dev, stream), AJ_OK);
    aj_device_stream_destroy(dev, stream);
    CHECK_STATUS(ctx, aj_device_stream_create(dev, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_device_stream_create: stream is NULL");

    /* host memory for async copies (pinned on cuda), and a round trip */
    float *host = NULL, back[4] = {0};
    void *mem = NULL;
    CHECK_STATUS(ctx, aj_device_host_alloc(dev, sizeof back, 1, (void **)&host), AJ_OK);
    CHECK_STATUS(ctx, aj_device_alloc(dev, sizeof back, &mem), AJ_OK);
    if (host && mem) {
        CHECK(host[0] == 0 && host[3] == 0);
        host[2] = 2.5f;
        CHECK_STATUS(ctx, aj_device_copy_async(dev, mem, host, sizeof back, 1, NULL), AJ_OK);
        CHECK_STATUS(ctx, aj_device_copy_from(dev, back, mem, sizeof back), AJ_OK);
        CHECK(back[2] == 2.5f);
    }
    /* device to device, and words filled, on a stream */
    void *mem2 = NULL;
    CHECK_STATUS(ctx, aj_device_alloc(dev, sizeof back, &mem2), AJ_OK);
    if (host && mem && mem2) {
        const float ninf = -INFINITY;
        uint32_t bits;
        memcpy(&bits, &ninf, 4);
        CHECK_STATUS(ctx, aj_device_copy_async(dev, mem2, mem, sizeof back, AJ_COPY_ON_DEVICE,
                                               NULL), AJ_OK);
        CHECK_STATUS(ctx, aj_device_fill32_async(dev, mem2, bits, 2, NULL), AJ_OK);
        CHECK_STATUS(ctx, aj_device_copy_from(dev, back, mem2, sizeof back), AJ_OK);
        CHECK(back[0] == -INFINITY && back[1] == -INFINITY && back[2] == 2.5f && back[3] == 0);
        /* two rows of one float, 2 floats apart, to rows 1 apart */
        CHECK_STATUS(ctx, aj_device_copy2d_async(dev, mem, 4, mem2, 8, 4, 2, NULL), AJ_OK);
        CHECK_STATUS(ctx, aj_device_copy_from(dev, back, mem, sizeof back), AJ_OK);
        CHECK(back[0] == -INFINITY && back[1] == 2.5f && back[2] == 2.5f);
    }
    aj_device_free(dev, mem2);
    aj_device_host_free(dev, host);
    aj_device_free(dev, mem);

    /* the kernels it runs: its target's, and sm_90a's on a 9.0 GPU (the
     * stand-in is one), where a wgmma op (schedule warpgroups) and the
     * flash forward on 8-bit inputs (Hopper's FP8 tensor cores are
     * wgmma's) compile for sm_90a */
    int gpu90 = c.kind == AJ_DEVICE_CUDA && c.cc_major == 9 && c.cc_minor == 0;
    for (int t = 0; t < AJ_TARGET_COUNT; t++)
        CHECK_MSG(aj_device_runs(dev, (aj_target)t) ==
                      (t == (int)c.target || (gpu90 && t == AJ_TARGET_SM_90A)),
                  "%s: runs %s", expected[i].name, aj_target_name((aj_target)t));
    if (c.kind != AJ_DEVICE_CPU) {
        static const char wg[] = "attention forward flash {\n  dtype = bf16\n  head_dim = 64\n"
                                 "  schedule = (warpgroups = 1)\n}\n";
        aj_kernel *k = NULL;
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.device = dev;
        CHECK_STATUS(ctx, spec_compile(ctx, wg, "wg.aj", &opt, &k), AJ_OK);
        CHECK_MSG(k && aj_kernel_target(k) == (gpu90 ? AJ_TARGET_SM_90A : c.target),
                  "%s: the wgmma kernel's target is %s", expected[i].name,
                  k ? aj_target_name(aj_kernel_target(k)) : "none");
        aj_kernel_destroy(k);
        static const char f8[] = "attention forward flash {\n  dtype = bf16\n  head_dim = 64\n"
                                 "  q_dtype = f8e4m3\n  kv_dtype = f8e4m3\n}\n";
        k = NULL;
        CHECK_STATUS(ctx, spec_compile(ctx, f8, "f8.aj", &opt, &k),
                     c.target == AJ_TARGET_SM_80 ? AJ_ERR_UNSUPPORTED : AJ_OK);
        CHECK_MSG(c.target == AJ_TARGET_SM_80 ||
                      (k && aj_kernel_target(k) == (gpu90 ? AJ_TARGET_SM_90A : c.target)),
                  "%s: the FP8 flash kernel's target is %s", expected[i].name,
                  k ? aj_target_name(aj_kernel_target(k)) : "none");
        if (gpu90 && k)
            CHECK(strstr(aj_kernel_code(k, NULL), "k32.f32.e4m3.e4m3") != NULL);
        aj_kernel_destroy(k);
    }

    /* errors */
    CHECK_STATUS(ctx, aj_device_get_caps(dev, NULL), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "aj_device_get_caps: caps is NULL");
    aj_device_caps small = {.struct_size = offsetof(aj_device_caps, cc_major)};
    CHECK_STATUS(ctx, aj_device_get_caps(dev, &small), AJ_ERR_INVALID_ARG);
    CHECK_ERROR(ctx, "start from AJ_DEVICE_CAPS_INIT");
    aj_device_close(dev);
}

int main(int argc, char **argv)
{
    const int with_cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    CHECK(aj_ctx_create(NULL, &ctx) == AJ_OK);
    for (int i = 0; i < AJ_DEVICE_KIND_COUNT; i++) {
        check_table(expected[i].kind);
        check_kind_caps(i);
        if (expected[i].kind != AJ_DEVICE_CUDA || with_cuda)
            check_device(i);
    }
    aj_device_caps c = AJ_DEVICE_CAPS_INIT;
    CHECK(aj_device_kind_caps(AJ_DEVICE_KIND_COUNT, &c) == AJ_ERR_INVALID_ARG);
    CHECK(aj_device_kind_caps(AJ_DEVICE_SIM, NULL) == AJ_ERR_INVALID_ARG);
    CHECK(aj_device_kind_name(AJ_DEVICE_KIND_COUNT) == NULL);
    CHECK(aj_device_ops_of((aj_device_kind)-1) == NULL);
    CHECK(aj_device_get_caps(NULL, &c) == AJ_ERR_INVALID_ARG);
    CHECK(aj_device_time(NULL, NULL, add_one, NULL, NULL) == AJ_ERR_INVALID_ARG);
    aj_ctx_destroy(ctx);
    return check_report();
}
