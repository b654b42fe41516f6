/*
 * test_fp8.c -- FP8 inputs (docs/ir.md "FP8 inputs"): forwards whose Q, K
 * and V (or K and V alone) are f8e4m3 / f8e5m2 with descales, against the
 * float64 reference of the dequantised inputs (sim_harness.h's f8 cases:
 * each input quantised from its drawn values with its amax descale).
 *
 * One generator of cases (test_sweep): every mask family (none, causal
 * top-left and bottom-right, a window, an expression) x head dims 64, 128
 * and 256, each case also cycling the format, per-tensor and per-head
 * descales, f8 queries or 16-bit ones, the output dtype, the variant (on
 * sim flash is the FP8 tensor-core kernel: Q K^T on mma m16n8k32), a
 * score_mod and the GQA ratio; the flash FP8 kernel at every head dim it
 * takes (32 .. 256, D = Dv and D != Dv); then layout = varlen for every mask
 * family, D != Dv, and the faults a caller can make (a missing or
 * mis-shaped descale, one given to a kernel without f8 inputs, the IR's
 * refusals).
 *
 *   test_fp8 [cpu | sim]   cpu by default; sim runs the efficient forward
 *                          (the GPU kernel) on the emulator
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "codegen/codegen.h"
#include "fwd_check.h"
#include "sim_harness.h"
#include "spec_compile.h"
#include "test_main.h"

static aj_ctx *ctx;
static aj_device *dev;
static int cases_run;
static int on_cpu;

static const char *const masks[] = {"none", "causal(top_left)", "causal(bottom_right)",
                                    "window(20, 3)", "expr(k <= q + 4 && q - 30 <= k)"};
#define N_MASKS ((int)(sizeof masks / sizeof masks[0]))
static const int dims[] = {64, 128, 256};

/* Case i of the generator over `mask` and head dim d: the other
 * dimensions cycle with i (periods 2, 3, 4, 5, 7 so that every pair
 * meets); with q8 the queries are always f8. */
static fwd_case sweep_case(int i, const char *mask, int d, int q8, char *label, size_t cap)
{
    static const int gqa[4][2] = {{2, 1}, {4, 2}, {4, 4}, {6, 2}};
    static const char *const mods[5] = {NULL, "softcap(20.0)", "alibi", NULL, NULL};
    fwd_case c = fwd_case_base(label, i % 3 == 2 ? AJ_DTYPE_F16 : AJ_DTYPE_BF16, d, mask);
    c.f8 = i % 2 ? AJ_DTYPE_F8E5M2 : AJ_DTYPE_F8E4M3;
    c.f8_per_head = i / 2 % 2;
    c.f8_q = q8 || i % 7 != 3;   /* now and then 16-bit queries over an f8 K/V */
    c.hq = gqa[i % 4][0];
    c.hkv = gqa[i % 4][1];
    c.score_mod = mods[i % 5];
    c.magnitude = 2.0;
    c.seed = 100 + (uint64_t)i;
    snprintf(label, cap, "%s%s/%s%s d%d %s %s Hq %d/%d", c.f8_q ? "" : "q16 ",
             aj_dtype_name(c.f8), aj_dtype_name(c.dtype), c.f8_per_head ? " per-head" : "", d,
             mask, c.score_mod ? c.score_mod : "", c.hq, c.hkv);
    return c;
}

static void run_case(const fwd_case *c, const fwd_run_options *how)
{
    fwd_result r = fwd_run_case_ext(ctx, dev, c, NULL, how);
    cases_run++;
    if (!fwd_check_result(ctx, c, &r))
        return;
    printf("%-70s O %.3f LSE %.3f %8.2f ms\n", c->label, r.max_err_o, r.max_err_lse,
           r.seconds * 1e3);
}

/* Every other case of f8 queries on the flash variant (on sim the FP8
 * tensor-core kernel, on mma.sync m16n8k32 or on wgmma m64nNk32 with one
 * or two warpgroups in turn), the rest on the efficient one; 16-bit
 * queries over an f8 K/V are the efficient variant's on sim (the flash one
 * wants q_dtype = kv_dtype). */
static fwd_run_options variant_of(int i, const fwd_case *c)
{
    fwd_run_options how = {0};
    how.variant = i % 2 && (on_cpu || c->f8_q) ? AJ_VARIANT_FLASH : AJ_VARIANT_EFFICIENT;
    if (how.variant == AJ_VARIANT_FLASH && !on_cpu)
        how.warpgroups = i / 2 % 3;
    return how;
}

/* " wgmma xN" on the label of a case run with N warpgroups ("+ producer"
 * warp specialised) */
static void label_warpgroups(const fwd_run_options *how, char *label, size_t cap)
{
    if (how->warpgroups)
        snprintf(label + strlen(label), cap - strlen(label), " wgmma x%d%s", how->warpgroups,
                 how->producer ? " + producer" : "");
}

static void test_sweep(void)
{
    int i = 0;
    for (int m = 0; m < N_MASKS; m++)
        for (int di = 0; di < 3; di++, i++) {
            char label[160];
            fwd_case c = sweep_case(i, masks[m], dims[di], 0, label, sizeof label);
            c.sq = on_cpu ? 67 : 37;   /* tails on both sides, shorter on the emulator */
            c.sk = on_cpu ? 83 : 45;
            fwd_run_options how = variant_of(i, &c);
            label_warpgroups(&how, label, sizeof label);
            if (!check_sampled())
                continue;
            run_case(&c, &how);
        }
}

/* The flash variant's FP8 tensor-core kernels (on sim) over every head
 * dim they take, 32 .. 256 in steps of 32, D = Dv and D with the next Dv,
 * both formats, mask and granularity cycling, each on mma.sync, on wgmma
 * (one or two warpgroups in turn) and on wgmma warp specialised (producer
 * = 1: the producer's threads transpose V); on cpu the one template
 * again. */
static void test_flash_dims(void)
{
    for (int d = 32, i = 0; d <= 256; d += 32)
        for (int pair = 0; pair < 2; pair++, i++)
            for (int wg = 0; wg < (on_cpu ? 1 : 3); wg++) {
                char label[160];
                fwd_case c = sweep_case(i, masks[i % N_MASKS], d, 1, label, sizeof label);
                c.dv = pair ? d % 256 + 32 : 0;
                c.sq = on_cpu ? 67 : 37;
                c.sk = on_cpu ? 83 : 45;
                if (pair)
                    strncat(label, " dv+32", sizeof label - strlen(label) - 1);
                strncat(label, " flash", sizeof label - strlen(label) - 1);
                fwd_run_options how = {.variant = AJ_VARIANT_FLASH,
                                       .warpgroups = wg ? 1 + (i + wg) % 2 : 0,
                                       .producer = wg == 2};
                label_warpgroups(&how, label, sizeof label);
                run_case(&c, &how);
            }
}

/* layout = varlen: three sequences of different lengths (one empty) per
 * mask family, D 128 / Dv 64 once. */
static void test_varlen(void)
{
    static const int32_t lens_q[3] = {19, 0, 33}, lens_k[3] = {27, 5, 33};
    for (int m = 0; m < N_MASKS; m++) {
        char label[160];
        fwd_case c = sweep_case(m + 1, masks[m], 128, 0, label, sizeof label);
        c.b = 3;
        if (m == 2)
            c.dv = 64;
        strncat(label, " varlen", sizeof label - strlen(label) - 1);
        fwd_run_options how = variant_of(m, &c);
        how.seqlens_q = lens_q;
        how.seqlens_k = lens_k;
        run_case(&c, &how);
    }
}

/* Compiles `body` (the fields of a forward) for this device's target. */
static aj_status compile(const char *variant, const char *body, aj_kernel **out)
{
    char spec[512];
    snprintf(spec, sizeof spec, "attention forward %s {\n%s}\n", variant, body);
    aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
    opt.target = aj_device_target(dev);
    opt.emit = AJ_EMIT_LLVM_IR;
    return spec_compile(ctx, spec, "fp8.aj", &opt, out);
}

/* A bad call gives AJ_ERR_INVALID_ARG naming the argument; the IR refuses
 * f8 where it does not apply. */
static void test_errors(void)
{
    static const struct {
        const char *body, *message;
    } refused[] = {
        {"  dtype = bf16\n  q_dtype = f8e4m3\n  head_dim = 64\n  layout = paged\n",
         "q_dtype = f8e4m3: a paged op's queries are its dtype"},
        {"  dtype = bf16\n  q_dtype = f16\n  head_dim = 64\n",
         "q_dtype = f16 differs from dtype = bf16"},
        {"  dtype = bf16\n  head_dim = 64\n  kv_dtype = f16\n",
         "kv_dtype = f16 differs from dtype = bf16 on layout = padded"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        aj_kernel *k = NULL;
        CHECK_STATUS(ctx, compile("efficient", refused[i].body, &k), AJ_ERR_VERIFY);
        CHECK_ERROR(ctx, refused[i].message);
    }
    aj_op *op = NULL;
    const char *bwd = "attention backward flash {\n  dtype = bf16\n  head_dim = 64\n}\n";
    CHECK(aj_op_parse(ctx, bwd, strlen(bwd), "bwd.aj", &op) == AJ_OK);
    CHECK_STATUS(ctx, aj_op_set_kv_dtype(op, AJ_DTYPE_F8E4M3), AJ_ERR_VERIFY);
    CHECK_ERROR(ctx, "kv_dtype = f8e4m3 applies only to forward ops, not backward");
    aj_op_destroy(op);
    if (!on_cpu) {
        /* what the FP8 tensor-core kernel does not take: refused by name */
        static const struct {
            const char *body, *message;
        } flash[] = {
            {"  q_dtype = f8e5m2\n  kv_dtype = f8e4m3\n  head_dim = 64\n",
             "needs q_dtype = kv_dtype (Q and K meet on the f8 tensor cores)"},
            {"  kv_dtype = f8e4m3\n  head_dim = 64\n", "needs q_dtype = kv_dtype"},
            {"  q_dtype = f8e4m3\n  kv_dtype = f8e4m3\n  head_dim = 72\n",
             "needs a head_dim that is a multiple of 32"},
            {"  q_dtype = f8e4m3\n  kv_dtype = f8e4m3\n  head_dim = 64\n  dropout = 0.1\n",
             "takes no dropout (its P goes to e4m3 scaled for P <= 1)"},
        };
        for (size_t i = 0; i < sizeof flash / sizeof flash[0]; i++) {
            char body[256];
            snprintf(body, sizeof body, "  dtype = bf16\n%s", flash[i].body);
            aj_kernel *k = NULL;
            CHECK_STATUS(ctx, compile("flash", body, &k), AJ_ERR_UNSUPPORTED);
            CHECK_ERROR(ctx, flash[i].message);
            CHECK_ERROR(ctx, "`attention forward efficient` takes them");
        }
    }
    /* the FP8 tensor-core kernels: Ada's mma.sync (sm_89) and Hopper's
     * wgmma (sm_90a, chosen there without a schedule); sm_80 has no FP8
     * tensor cores, and plain sm_90 no wgmma (its ptxas lowers mma.sync
     * e4m3 to f16 HMMA) */
    static const struct {
        aj_target target;
        const char *message;
        const char *needles[3];   /* Q K^T's and P V's instructions, P's conversion */
    } gpus[] = {
        {AJ_TARGET_SM_80, "needs FP8 tensor cores (compute capability 8.9 or newer)", {NULL}},
        {AJ_TARGET_SM_90, "needs target sm_90a on Hopper: its FP8 tensor cores are wgmma's",
         {NULL}},
        {AJ_TARGET_SM_90A, NULL,
         {"k32.f32.e5m2.e5m2", /* Q K^T: m64n{block_n} */
          "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e5m2",
          "cvt.rn.satfinite.e4m3x2.f32"}},
        {AJ_TARGET_SM_89, NULL,
         {"mma.sync.aligned.m16n8k32.row.col.f32.e5m2.e5m2.f32",
          "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32", ".version 8.4"}},
    };
    for (size_t i = 0; i < sizeof gpus / sizeof gpus[0]; i++) {
        /* Q K^T in one format; e5m2 V meets P's e4m3 in P V */
        const char *text = gpus[i].message
                               ? "attention forward flash {\n  dtype = bf16\n  q_dtype = f8e4m3\n"
                                 "  kv_dtype = f8e4m3\n  head_dim = 128\n}\n"
                               : "attention forward flash {\n  dtype = bf16\n  q_dtype = f8e5m2\n"
                                 "  kv_dtype = f8e5m2\n  head_dim = 128\n}\n";
        aj_compile_options opt = AJ_COMPILE_OPTIONS_INIT;
        opt.target = gpus[i].target;
        opt.emit = AJ_EMIT_PTX;
        aj_kernel *k = NULL;
        CHECK_STATUS(ctx, spec_compile(ctx, text, "gpu.aj", &opt, &k),
                     gpus[i].message ? AJ_ERR_UNSUPPORTED : AJ_OK);
        if (gpus[i].message)
            CHECK_ERROR(ctx, gpus[i].message);
        for (int n = 0; !gpus[i].message && n < 3; n++)
            CHECK_MSG(k && strstr(aj_kernel_code(k, NULL), gpus[i].needles[n]),
                      "flash FP8 on %s: no '%s' in the PTX", aj_target_name(gpus[i].target),
                      gpus[i].needles[n]);
        aj_kernel_destroy(k);
    }

    /* the launch: one f8 kernel, arguments broken one at a time */
    aj_kernel *k = NULL;
    CHECK_STATUS(ctx, compile("efficient", "  dtype = bf16\n  q_dtype = f8e4m3\n  kv_dtype = "
                              "f8e4m3\n  head_dim = 64\n", &k), AJ_OK);
    static uint8_t q8[2 * 8 * 64], kv8[8 * 64];
    static uint16_t o[2 * 8 * 64];
    static float lse[16], one[1] = {0.5f}, three[3] = {1, 1, 1};
    aj_fwd_args a = AJ_FWD_ARGS_INIT;
    a.q = (aj_tensor){q8, AJ_DTYPE_F8E4M3, 4, {1, 2, 8, 64}, {1024, 512, 64, 1}};
    a.k = (aj_tensor){kv8, AJ_DTYPE_F8E4M3, 4, {1, 1, 8, 64}, {512, 512, 64, 1}};
    a.v = a.k;
    a.o = (aj_tensor){o, AJ_DTYPE_BF16, 4, {1, 2, 8, 64}, {1024, 512, 64, 1}};
    a.lse = (aj_tensor){lse, AJ_DTYPE_F32, 3, {1, 2, 8}, {16, 8, 1}};
    const aj_tensor scale1 = {one, AJ_DTYPE_F32, 1, {1}, {1}};
    a.q_scale = a.k_scale = a.v_scale = scale1;
    if (k) {
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &a), AJ_OK);
        aj_fwd_args x = a;
        x.q_scale = (aj_tensor){0};
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &x), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, "aj_forward: q_scale.rank = 0, want 1");
        x = a;
        x.k_scale = (aj_tensor){three, AJ_DTYPE_F32, 1, {3}, {1}};
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &x), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, "aj_forward: k_scale.shape[0] = 3, want 1 (one descale per tensor) "
                    "or 1 (one per KV head)");
        x = a;
        x.q_scale = (aj_tensor){three, AJ_DTYPE_F32, 1, {3}, {1}};
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &x), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, "q_scale.shape[0] = 3, want 1 (one descale per tensor) or 2 (one per "
                    "query head)");
        x = a;
        x.q.dtype = AJ_DTYPE_BF16;
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &x), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, "aj_forward: q.dtype = bf16, want f8e4m3");
        x = a;
        x.v.strides[2] = 68;   /* rows of f8 must start on 8 bytes */
        x.v.strides[0] = x.v.strides[1] = 8 * 68;
        CHECK_STATUS(ctx, aj_forward(ctx, dev, k, &x), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, "v.strides[2] = 68 is not a multiple of 8 elements (8 bytes)");
        aj_kernel_destroy(k);
    }
    /* the GPU flash forward (the tensor-core kernel, whose Q and K loads
     * move 16 bytes) states q's and k's rows on 16 bytes, V's on 8 as the
     * efficient kernel's; the cpu's, which loads bytes, 8 for all */
    aj_kernel *fk = NULL;
    CHECK_STATUS(ctx, compile("flash", "  dtype = bf16\n  q_dtype = f8e4m3\n  kv_dtype = "
                              "f8e4m3\n  head_dim = 64\n", &fk), AJ_OK);
    if (fk) {
        static uint8_t wide[2 * 8 * 72];
        aj_fwd_args x = a;
        CHECK_STATUS(ctx, aj_forward(ctx, dev, fk, &x), AJ_OK);
        x.q = (aj_tensor){wide, AJ_DTYPE_F8E4M3, 4, {1, 2, 8, 64}, {2 * 8 * 72, 8 * 72, 72, 1}};
        const int32_t want = on_cpu ? 8 : 16;
        CHECK(fk->row_align[AJ_ROW_Q] == want && fk->row_align[AJ_ROW_K] == want &&
              fk->row_align[AJ_ROW_V] == 8);
        CHECK_STATUS(ctx, aj_forward(ctx, dev, fk, &x), on_cpu ? AJ_OK : AJ_ERR_INVALID_ARG);
        if (!on_cpu)
            CHECK_ERROR(ctx, "q.strides[2] = 72 is not a multiple of 16 elements (16 bytes)");
        x = a;
        x.v = (aj_tensor){wide, AJ_DTYPE_F8E4M3, 4, {1, 1, 8, 64}, {8 * 72, 8 * 72, 72, 1}};
        CHECK_STATUS(ctx, aj_forward(ctx, dev, fk, &x), AJ_OK);
        aj_kernel_destroy(fk);
    }
    /* descales given to a kernel without f8 inputs are a mistake */
    aj_kernel *plain = NULL;
    CHECK_STATUS(ctx, compile("efficient", "  dtype = bf16\n  head_dim = 64\n", &plain), AJ_OK);
    if (plain) {
        static uint16_t q16[2 * 8 * 64], kv16[8 * 64];
        aj_fwd_args x = a;
        x.q.data = q16;
        x.k.data = x.v.data = kv16;
        x.q.dtype = x.k.dtype = x.v.dtype = AJ_DTYPE_BF16;
        x.k_scale = x.v_scale = (aj_tensor){0};
        CHECK_STATUS(ctx, aj_forward(ctx, dev, plain, &x), AJ_ERR_INVALID_ARG);
        CHECK_ERROR(ctx, "aj_forward: q_scale is for f8 queries; this kernel's are bf16");
        aj_kernel_destroy(plain);
    }
}

/* The text form round-trips, and the getters answer. */
static void test_ir(void)
{
    const char *text = "attention forward efficient {\n  dtype = f16\n  head_dim = 128\n"
                       "  q_dtype = f8e5m2\n  kv_dtype = f8e5m2\n  layout = varlen\n}\n";
    aj_op *op = NULL;
    CHECK_STATUS(ctx, aj_op_parse(ctx, text, strlen(text), "ir.aj", &op), AJ_OK);
    if (!op)
        return;
    char *printed = NULL;
    CHECK(aj_op_print(op, &printed) == AJ_OK && printed &&
          strstr(printed, "  layout = varlen\n  q_dtype = f8e5m2\n  kv_dtype = f8e5m2\n"));
    aj_dtype q = AJ_DTYPE_F16;
    aj_op_info info;
    CHECK(aj_op_get_q_dtype(op, &q) == AJ_OK && q == AJ_DTYPE_F8E5M2);
    CHECK(aj_op_get_info(op, &info) == AJ_OK && info.kv_dtype == AJ_DTYPE_F8E5M2 &&
          info.dtype == AJ_DTYPE_F16);
    aj_free(printed);
    aj_op_destroy(op);
}

int main(int argc, char **argv)
{
    static void (*const tests[])(void) = {test_ir, test_errors, test_sweep, test_flash_dims,
                                          test_varlen, NULL};
    on_cpu = test_main_device(argc, argv, AJ_DEVICE_CPU) == AJ_DEVICE_CPU;
    return test_main(argc, argv,
                     &(test_main_args){.fallback = AJ_DEVICE_CPU, .ctx = &ctx, .dev = &dev,
                                       .tests = tests, .cases = &cases_run,
                                       .cleanup = fwd_cache_clear});
}
